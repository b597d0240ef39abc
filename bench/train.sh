#!/bin/sh
# bench/train.sh [STEPS [ALGO]] — rl-train on the CPU with a ~10M-parameter Qwen2-shaped
# model: tokens/s per step and the share of the step spent outside the model's
# forward/backward/AdamW (checkpoint publishing included).  Scored records are
# synthetic (random tokens, 64 prompt + 192 response, groups of 8).  ALGO is
# rl-train's --algo (default grpo; ppo adds its value pass).  JSON lines.
set -eu
steps=${1:-3}
algo=${2:-grpo}
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":4096,"hidden_size":384,"num_hidden_layers":6,"num_attention_heads":6,
 "num_key_value_heads":2,"intermediate_size":1024,"max_position_embeddings":512,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32"}
JSON
rl-train --init "$d/cfg.json" --tokenizer bytes --out "$d/m0" 2>/dev/null
python3 - "$d/scored.jsonl" "$steps" <<'PY'
import json, random, sys
random.seed(1)
out, steps = sys.argv[1], int(sys.argv[2])
rid = 0
with open(out, "w") as f:
    for g in range(2 * steps):
        p = [random.randrange(4096) for _ in range(64)]
        for i in range(8):
            rid += 1
            r = [random.randrange(4096) for _ in range(192)]
            f.write(json.dumps({"id": rid, "group": g, "index": i, "group_size": 8, "prompt": p,
                "response": r, "logprobs": [-8.3] * 192, "reward": float(i % 2)}) + "\n")
PY
rl-train -q -m "$d/m0" --out "$d/ck" --algo "$algo" --batch 2 --lr 1e-4 --max-tokens-per-micro 4096 \
    --metrics "$d/m.jsonl" "$d/scored.jsonl"
python3 - "$d/m.jsonl" "$algo" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    print(json.dumps({"bench": "train", "algo": sys.argv[2], "device": "cpu", "params": "11.0M", "step": m["step"],
        "tokens": m["perf/total_num_tokens"], "tok_s": round(m["perf/throughput"], 1),
        "step_s": round(m["timing_s/update_actor"] + m["timing_s/publish"], 3),
        "model_s": round(m["timing_s/model"], 3), "publish_s": round(m["timing_s/publish"], 3),
        "overhead_frac": round(m["perf/overhead_frac"], 4)}))
PY

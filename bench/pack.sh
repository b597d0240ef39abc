#!/bin/sh
# bench/pack.sh [STEPS [ALGO]] — rl-train on the CPU, padded micro-batches
# (--max-tokens-per-micro 4096) against packed ones (--micro-tokens 4096), back to
# back, on records with a long-tailed response length after a 32-token prompt: groups
# of 8 whose samples have 24..40 response tokens but one (at a random index) with 10x
# that.  The same ~10M-parameter Qwen2-shaped model and records for both.
# JSON lines: per step the update's tokens/s (prompt + response tokens over the
# update's seconds), then one summary line: tokens over update seconds of the steps
# after the first (warm-up) and their ratio, packed / padded (issue 33's goal: >= 1.5);
# and, as the machine may be shared, each whole run's CPU seconds (user + system,
# the model's creation and every checkpoint included) and their ratio.
set -eu
steps=${1:-5}
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
        p = [random.randrange(4096) for _ in range(32)]
        long = random.randrange(8)
        for i in range(8):
            rid += 1
            n = random.randint(24, 40) * (10 if i == long else 1)
            r = [random.randrange(4096) for _ in range(n)]
            f.write(json.dumps({"id": rid, "group": g, "index": i, "group_size": 8, "prompt": p,
                "response": r, "logprobs": [-8.3] * n, "reward": float(i % 2)}) + "\n")
PY
for mode in padded packed; do
	if [ $mode = packed ]; then opt="--micro-tokens 4096"; else opt="--max-tokens-per-micro 4096"; fi
	/usr/bin/time -f "%U %S" -o "$d/$mode.cpu" rl-train -q -m "$d/m0" --out "$d/ck-$mode" --algo "$algo" \
	    --batch 2 --lr 1e-4 $opt --metrics "$d/$mode.jsonl" "$d/scored.jsonl"
done
python3 - "$d" "$algo" <<'PY'
import json, os, sys
d, algo = sys.argv[1], sys.argv[2]
med, cpu = {}, {}
for mode in ("padded", "packed"):
    tok = sec = alltok = 0
    for l in open(os.path.join(d, mode + ".jsonl")):
        m = json.loads(l)
        tok_s = m["perf/total_num_tokens"] / m["timing_s/update_actor"]
        alltok += m["perf/total_num_tokens"]
        if m["step"] > 1:
            tok += m["perf/total_num_tokens"]
            sec += m["timing_s/update_actor"]
        print(json.dumps({"bench": "pack", "algo": algo, "device": "cpu", "mode": mode, "step": m["step"],
            "tokens": m["perf/total_num_tokens"], "update_s": round(m["timing_s/update_actor"], 3),
            "tok_s": round(tok_s, 1), "grad_norm": round(m["actor/grad_norm"], 6)}))
    med[mode] = tok / sec
    u, sy = open(os.path.join(d, mode + ".cpu")).read().split()[-2:]
    cpu[mode] = (float(u) + float(sy), alltok)
print(json.dumps({"bench": "pack", "algo": algo, "summary": True, "padded_tok_s": round(med["padded"], 1),
    "packed_tok_s": round(med["packed"], 1), "speedup": round(med["packed"] / med["padded"], 2),
    "padded_cpu_s": round(cpu["padded"][0], 2), "packed_cpu_s": round(cpu["packed"][0], 2),
    "speedup_cpu": round(cpu["padded"][0] / cpu["packed"][0], 2)}))
PY

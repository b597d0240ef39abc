#!/bin/sh
# bench/reward_model.sh [PROMPTS [LEN [ROUNDS]]] — rl-reward --model against the
# rollout engine's prefill on the same model and the same tokens, CPU: the
# ~11M-parameter Qwen2-shaped model of bench/train.sh (vocabulary 4096, bytes
# tokenizer), PROMPTS prompts of LEN random letters (LEN tokens each).
#   prefill   rl-rollout --max-tokens 1 -v: the engine's prefill of every prompt
#             (one sampled token each); tokens/s = tokens prefilled over the
#             engine's time ("time: decoding")
#   rm        rl-reward --model on rl-rollout's records (the prompt + its one
#             token): tokens/s = tokens over the time in forwards (-v line
#             "model: ..."), records/s over rl-reward's wall clock
# The two interleave ROUNDS times (the machine is shared); one JSON line per
# run, then one with the medians and rm's ratio to prefill.  Goal (issue
# 31): rl-reward --model tokens/s >= the prefill's.
set -eu
n=${1:-64}
len=${2:-256}
rounds=${3:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":4096,"hidden_size":384,"num_hidden_layers":6,"num_attention_heads":6,
 "num_key_value_heads":2,"intermediate_size":1024,"max_position_embeddings":512,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"eos_token_id":257,"torch_dtype":"float32"}
JSON
rl-train -q --init "$d/cfg.json" --tokenizer bytes --out "$d/m0"
python3 - "$d" "$n" "$len" <<'PY'
import json, random, sys
d, n, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(1)
with open(d + "/prompts.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"prompt": "".join(random.choice("abcdefghij ") for _ in range(L))}) + "\n")
with open(d + "/pairs.jsonl", "w") as f:
    for i in range(2):
        f.write(json.dumps({"prompt": "q", "chosen": " yes", "rejected": " no"}) + "\n")
PY
# the reward model: the same model with a score head (one step of --algo rm)
rl-train -q -m "$d/m0" --out "$d/rm" --algo rm --batch 2 --max-steps 1 --lr 1e-6 --metrics "$d/rm.json" "$d/pairs.jsonl"
for r in $(seq "$rounds"); do
	rl-rollout -v -m "$d/m0" --max-tokens 1 --slots "$n" -o "$d/recs" "$d/prompts.jsonl" 2> "$d/ro.err"
	python3 - "$d/ro.err" "$n" "$len" >> "$d/all.jsonl" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
tok = int(re.search(r"tokens: (\d+) prefilled", t).group(1))
sec = float(re.search(r"time: decoding ([0-9.]+) s", t).group(1))
print(json.dumps({"bench": "reward_model", "what": "prefill", "device": "cpu", "params": "11.0M",
                  "records": int(sys.argv[2]), "tokens": tok, "seconds": sec, "tok_s": round(tok / sec, 1)}))
PY
	python3 -c 'import subprocess, sys, time
t0 = time.time()
rc = subprocess.call(sys.argv[2:], stderr=open(sys.argv[1], "w"))
open(sys.argv[1], "a").write("wall %f\n" % (time.time() - t0))
sys.exit(rc)' "$d/rm.err" rl-reward -v --model "$d/rm/latest" -o "$d/scored" "$d/recs"
	python3 - "$d/rm.err" >> "$d/all.jsonl" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
m = re.search(r"model: (\d+) records, (\d+) tokens in ([0-9.]+) s", t)
rec, tok, sec = int(m.group(1)), int(m.group(2)), float(m.group(3))
wall = float(re.search(r"wall ([0-9.]+)", t).group(1))
print(json.dumps({"bench": "reward_model", "what": "rm", "device": "cpu", "params": "11.0M", "records": rec,
                  "tokens": tok, "seconds": sec, "tok_s": round(tok / sec, 1), "wall_s": round(wall, 3),
                  "records_s": round(rec / wall, 1), "tok_s_wall": round(tok / wall, 1)}))
PY
done
cat "$d/all.jsonl"
python3 - "$d/all.jsonl" <<'PY'
import json, statistics, sys
ls = [json.loads(l) for l in open(sys.argv[1])]
pf = statistics.median(l["tok_s"] for l in ls if l["what"] == "prefill")
rm = statistics.median(l["tok_s"] for l in ls if l["what"] == "rm")
rs = statistics.median(l["records_s"] for l in ls if l["what"] == "rm")
print(json.dumps({"bench": "reward_model", "what": "summary", "prefill_tok_s": pf, "rm_tok_s": rm,
                  "rm_records_s": rs, "rm_over_prefill": round(rm / pf, 3)}))
PY

#!/bin/sh
# bench/dpo.sh [STEPS [ROUNDS]] — rl-train --algo dpo against --algo sft on the
# same tokens, CPU, the ~11M-parameter Qwen2-shaped model of bench/train.sh:
# STEPS steps of 4 pairs (groups of 2 records, 64 prompt + 192 response
# tokens each, random ids) per run, the three runs interleaved ROUNDS times
# (the machine is shared: interleaving spreads its load over all three).
#   sft      cross-entropy on both records of each pair
#   dpo      the reference log-probs from the records (ref_logprobs)
#   dpo-ref  the reference computed by rl-train from a model (--ref)
# One JSON line per run: tok_s, the median tokens/s (wall clock) of its steps
# after the first (which includes start-up), and tok_cpu_s, the tokens of its
# steps over the CPU seconds (user + system) of the whole rl-train process
# (start-up and checkpoints included; steadier than the wall clock on a shared
# machine); then one line per variant with the medians over rounds and their
# ratios to sft's.  Goal (issue 31): dpo >= 0.9 x sft.
set -eu
steps=${1:-4}
rounds=${2:-3}
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
python3 - "$d/pairs.jsonl" "$steps" <<'PY'
import json, random, sys
random.seed(1)
out, steps = sys.argv[1], int(sys.argv[2])
with open(out, "w") as f:
    for g in range(4 * (steps + 1)):
        p = [random.randrange(4096) for _ in range(64)]
        for i in range(2):
            r = [random.randrange(4096) for _ in range(192)]
            f.write(json.dumps({"id": 2 * g + i, "group": g, "index": i, "group_size": 2, "prompt": p,
                "response": r, "ref_logprobs": [-8.3] * 192, "reward": float(1 - i)}) + "\n")
PY
run() { # NAME ARGS...
	name=$1
	shift
	rm -rf "$d/ck"
	# the CPU time of rl-train (a child of this python) into $d/cpu
	python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%f\n" % (r.ru_utime + r.ru_stime))
sys.exit(rc)' "$d/cpu" \
	    rl-train -q -m "$d/m0" --out "$d/ck" --batch 4 --max-steps "$steps" --lr 1e-4 --max-tokens-per-micro 4096 \
	    --metrics "$d/$name.jsonl" "$@" "$d/pairs.jsonl"
	python3 - "$d/$name.jsonl" "$name" "$d/all.jsonl" "$d/cpu" <<'PY'
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
cpu = float(open(sys.argv[4]).read())
tok = [m["perf/total_num_tokens"] / m["timing_s/update_actor"] for m in ms[1:]]
line = {"bench": "dpo", "variant": sys.argv[2], "device": "cpu", "params": "11.0M", "steps": len(ms),
        "tokens_per_step": ms[0]["perf/total_num_tokens"], "tok_s": round(statistics.median(tok), 1),
        "model_s": round(statistics.median(m["timing_s/model"] for m in ms[1:]), 3),
        "cpu_s": round(cpu, 2), "tok_cpu_s": round(sum(m["perf/total_num_tokens"] for m in ms) / cpu, 1)}
print(json.dumps(line))
open(sys.argv[3], "a").write(json.dumps(line) + "\n")
PY
}
i=0
while [ "$i" -lt "$rounds" ]; do
	run sft --algo sft
	run dpo --algo dpo
	run dpo-ref --algo dpo --ref "$d/m0"
	i=$((i + 1))
done
python3 - "$d/all.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
V = ("sft", "dpo", "dpo-ref")
med = {v: statistics.median(r["tok_s"] for r in runs if r["variant"] == v) for v in V}
cpu = {v: statistics.median(r["tok_cpu_s"] for r in runs if r["variant"] == v) for v in V}
for v in V:
    print(json.dumps({"bench": "dpo", "variant": v, "summary": True, "tok_s_median": round(med[v], 1),
                      "vs_sft": round(med[v] / med["sft"], 3), "tok_cpu_s_median": round(cpu[v], 1),
                      "cpu_vs_sft": round(cpu[v] / cpu["sft"], 3)}))
PY

#!/bin/bash
# bench/tail.sh [STEPS] — the whole loop on a long-tailed response length,
# sync against async (issue 33): seven prompts in eight may answer in 16
# tokens and one in 160 (the prompt line's max_tokens; the tiny random model
# rarely stops earlier), GRPO with groups of 4, 2 groups a step, STEPS
# trainer steps (default 12).  Runs, back to back, each from the same
# initial model:
#   sync       rl-rollout | rl-reward | rl-train, --max-staleness 0 (a pipe)
#   k1, k2     the queue wiring, rl-queue serve -k 1 / -k 2
#   auto-es    the queue wiring, -k auto:4 --oversample 1.5 (early stop)
# One JSON line per run: wall seconds from the workers' start to the
# trainer's exit, CPU seconds of every process (user + system), samples
# trained per wall second and per CPU second, the broker's early stops and
# stale drops.  Then a summary line: auto-es against the best fixed K and
# against sync.  The machine may be shared: CPU seconds are the steadier
# figure.  Environment: HIDDEN (64) and LAYERS (2), the model's size.
set -eu
steps=${1:-12}
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"; export PATH
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/cfg.json" <<JSON
{"model_type":"qwen2","vocab_size":261,"hidden_size":${HIDDEN:-64},"num_hidden_layers":${LAYERS:-2},"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":$((2 * ${HIDDEN:-64})),"max_position_embeddings":256,"torch_dtype":"float32"}
JSON
rl-train -q --init "$d/cfg.json" --tokenizer bytes --out "$d/m0" --seed 1 2>/dev/null
n=$((steps * 2 * 2))   # twice the prompts the steps take: room for over-sampling
for i in $(seq 1 $n); do
	mt=16; [ $((i % 8)) -eq 0 ] && mt=160
	echo "{\"prompt\":\"$i+$i=\",\"answer\":\"$((i + i))\",\"max_tokens\":$mt}"
done > "$d/prompts.jsonl"
TR="--algo grpo --batch 2 --lr 1e-4 --no-skip-zero-adv --max-steps $steps"
GEN="-n 4 --max-tokens 160 --train-batch 2 --slots 32"

cpu_of() { awk '{ print $1 + $2 }' "$1"; }

run_sync() {
	local o=$d/sync
	mkdir -p "$o"
	/usr/bin/time -f "%U %S" -o "$o.cpu" bash -c "
		rl-rollout -q -m '$d/m0' $GEN --weights-from '$o' --max-staleness 0 '$d/prompts.jsonl' |
		rl-reward -q -t arith | rl-train -q -m '$d/m0' --out '$o' $TR --metrics '$o.m' - 2>/dev/null || true"
}

# run_queue NAME SERVE_ARGS...
run_queue() {
	local name=$1 o=$d/$1 port
	shift
	mkdir -p "$o"
	port=$(( 20000 + RANDOM % 10000 ))
	/usr/bin/time -f "%U %S" -o "$o.cpu" bash -c "
		rl-queue serve -q -l tcp://127.0.0.1:$port -b 2 $* -t 60 & Q=\$!
		for i in \$(seq 100); do rl-queue stat --timeout 0.2 tcp://127.0.0.1:$port >/dev/null 2>&1 && break; sleep 0.05; done
		rl-queue put -q tcp://127.0.0.1:$port '$d/prompts.jsonl'
		rl-rollout -q -m '$d/m0' $GEN --queue tcp://127.0.0.1:$port --weights-from '$o' & G=\$!
		rl-reward -q --queue tcp://127.0.0.1:$port -t arith & R=\$!
		rl-train -q -m '$d/m0' --out '$o' $TR --queue tcp://127.0.0.1:$port --metrics '$o.m' 2>/dev/null || true
		rl-queue stat --json tcp://127.0.0.1:$port > '$o.stat' 2>/dev/null || true
		kill \$G \$R; wait \$G \$R 2>/dev/null; kill \$Q; wait \$Q 2>/dev/null; true"
}

line() {
	local name=$1 wall=$2 o=$d/$1
	python3 - "$name" "$wall" "$(cpu_of "$o.cpu")" "$o.m" "$o.stat" "$steps" <<'PY'
import json, os, sys
name, wall, cpu, mpath, spath, steps = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
ms = [json.loads(l) for l in open(mpath)] if os.path.exists(mpath) else []
samples = 8 * len(ms)   # 2 groups of 4 a step
st = json.load(open(spath)) if os.path.exists(spath) else {}
t = st.get("total", {})
print(json.dumps({"bench": "tail", "run": name, "steps": len(ms), "samples": samples, "wall_s": round(wall, 2),
    "cpu_s": round(cpu, 2), "samples_per_s": round(samples / wall, 2), "samples_per_cpu_s": round(samples / cpu, 2),
    "early_stops": t.get("early_stops", 0), "aborted": t.get("aborted", 0),
    "stale_dropped": t.get("stale_dropped", 0), "max_staleness": st.get("max_staleness")}))
PY
}

for run in sync k1 k2 auto-es; do
	t0=$(date +%s.%N)
	case $run in
	sync) run_sync ;;
	k1) run_queue k1 -k 1 ;;
	k2) run_queue k2 -k 2 ;;
	auto-es) run_queue auto-es -k auto:4 --oversample 1.5 ;;
	esac
	t1=$(date +%s.%N)
	line "$run" "$(echo "$t1 - $t0" | bc)" | tee -a "$d/lines"
done
python3 - "$d/lines" <<'PY'
import json, sys
r = {j["run"]: j for j in map(json.loads, open(sys.argv[1]))}
best = max(("k1", "k2"), key=lambda k: r[k]["samples_per_s"])
a, s, b = r["auto-es"], r["sync"], r[best]
print(json.dumps({"bench": "tail", "summary": True, "best_fixed": best,
    "auto_vs_best": round(a["samples_per_s"] / b["samples_per_s"], 3),
    "auto_vs_sync": round(a["samples_per_s"] / s["samples_per_s"], 3),
    "auto_vs_best_cpu": round(a["samples_per_cpu_s"] / b["samples_per_cpu_s"], 3),
    "auto_vs_sync_cpu": round(a["samples_per_cpu_s"] / s["samples_per_cpu_s"], 3),
    "load": open("/proc/loadavg").read().split()[:3]}))
PY

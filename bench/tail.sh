#!/bin/bash
# bench/tail.sh [STEPS] — the whole loop on a long-tailed response length,
# sync against async (issue 33): seven prompts in eight may answer in 16
# tokens and one in 160 (the prompt line's max_tokens; the tiny random model
# rarely stops earlier), GRPO with groups of 4, 2 groups a step, STEPS
# trainer steps (default 48).  Runs, back to back, each from the same
# initial model:
#   sync       rl-rollout | rl-reward | rl-train, --max-staleness 0 (a pipe)
#   kN         the queue wiring, rl-queue serve -k N (k1, k2 by default;
#              k3 and k4 on request: auto's range is 0..4)
#   auto       the queue wiring, -k auto:4 (the rule alone)
#   auto-es    the queue wiring, -k auto:4 --oversample $OVERSAMPLE
#              --stragglers $STRAGGLERS (early stop)
# One JSON line per run: wall seconds from the workers' start to the
# trainer's exit, CPU seconds of every process (user + system), samples
# trained per wall second and per CPU second, the mean response length
# trained and response tokens trained per wall and CPU second (early stop
# with requeue trains fewer long answers within the same steps: the
# samples figures flatter it), the broker's early stops and
# stale drops, the auto rule's changes of K (version:K) and its last
# reason, each side's idle share over the run (queue wiring), the mean of
# each step's longest answer, the trainer's own CPU seconds and its busy
# and model seconds per step (on a shared machine its wall time per step
# moves with the load; its CPU time much less), where its wall time goes
# (train_*_s: start-up, waits, updates, publishing, acknowledgements, the
# exit; they add up to train_wall_s), the load average before and after.  Then a summary line: auto
# and auto-es against the best fixed K and against sync (samples/s, per
# CPU second, and response tokens/s).  The machine may
# be shared: CPU seconds are the steadier figure.
# Environment: HIDDEN (64) and LAYERS (2), the model's size; MICRO_TOKENS
# (unset) packed training in every run (rl-train --micro-tokens);
# PUBLISH_INLINE=1 rl-train --publish-inline in every run; OVERSAMPLE
# (1.5) and STRAGGLERS (requeue) of auto-es; RUNS (default "sync k1 k2 auto auto-es", run in the order given); PIN (1 where there are 2 cores or
# more): equal resources as bench/e2e.sh has them, generation, scoring and
# the broker on core GEN_CPU (0), training on TRAIN_CPU (1), in every run,
# so sync leaves each core idle while the other stage works and async may
# overlap them (PIN=0: every process on every core, where each stage of
# sync already takes the whole machine in turn and overlap gains little).
set -eu
steps=${1:-48}
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
# MICRO_TOKENS=N: packed training (rl-train --micro-tokens N, verl's dynamic
# batch size) in every run: the trainer no longer pads the step to its
# longest answer, and generation becomes the larger stage, as in the
# papers async RL follows (bench/RESULTS.md: by CPU seconds the default is
# balanced, training about half; packed, training about 40 %)
[ -n "${MICRO_TOKENS:-}" ] && TR="$TR --micro-tokens $MICRO_TOKENS"
# PUBLISH_INLINE=1: rl-train --publish-inline in every run (each version
# written before the next step, as before background publishing)
[ "${PUBLISH_INLINE:-0}" = 1 ] && TR="$TR --publish-inline"
GEN="-n 4 --max-tokens 160 --train-batch 2 --slots 32"
OVERSAMPLE=${OVERSAMPLE:-1.5} STRAGGLERS=${STRAGGLERS:-requeue}
# the auto rule decides on the workers' stats reports (every 2 s by
# default): with steps of a few tenths of a second, a window of 3 steps
# would wait for reports, and K could move once in 4 s (a window, then the
# settling step), a few times in a whole run; reports every 0.25 s let it
# decide at its own pace (the same setting for every run)
RL_STATS_INTERVAL=${RL_STATS_INTERVAL:-0.25}; export RL_STATS_INTERVAL
PIN=${PIN:-$([ "$(nproc)" -ge 2 ] && echo 1 || echo 0)}
PG="" PT=""
if [ "$PIN" = 1 ]; then
	PG="taskset -c ${GEN_CPU:-0}" PT="taskset -c ${TRAIN_CPU:-1}"
fi

cpu_of() { awk '{ print $1 + $2 }' "$1"; }

run_sync() {
	local o=$d/sync
	mkdir -p "$o"
	/usr/bin/time -f "%U %S" -o "$o.cpu" bash -c "
		$PG rl-rollout -q -m '$d/m0' $GEN --weights-from '$o' --max-staleness 0 '$d/prompts.jsonl' |
		$PG rl-reward -q -t arith | /usr/bin/time -f '%U %S %e' -o '$o.tcpu' $PT rl-train -q -m '$d/m0' --out '$o' $TR --metrics '$o.m' - 2>/dev/null || true"
}

# run_queue NAME SERVE_ARGS...
run_queue() {
	local name=$1 o=$d/$1 port
	shift
	mkdir -p "$o"
	port=$(( 20000 + RANDOM % 10000 ))
	/usr/bin/time -f "%U %S" -o "$o.cpu" bash -c "
		$PG rl-queue serve -q -l tcp://127.0.0.1:$port -b 2 $* -t 60 & Q=\$!
		for i in \$(seq 100); do rl-queue stat --timeout 0.2 tcp://127.0.0.1:$port >/dev/null 2>&1 && break; sleep 0.05; done
		rl-queue put -q tcp://127.0.0.1:$port '$d/prompts.jsonl'
		$PG rl-rollout -q -m '$d/m0' $GEN --queue tcp://127.0.0.1:$port --weights-from '$o' & G=\$!
		$PG rl-reward -q --queue tcp://127.0.0.1:$port -t arith & R=\$!
		/usr/bin/time -f '%U %S %e' -o '$o.tcpu' $PT rl-train -q -m '$d/m0' --out '$o' $TR --queue tcp://127.0.0.1:$port --metrics '$o.m' 2>/dev/null || true
		rl-queue stat --json tcp://127.0.0.1:$port > '$o.stat' 2>/dev/null || true
		kill \$G \$R; wait \$G \$R 2>/dev/null; kill \$Q; wait \$Q 2>/dev/null; true"
}

line() {
	local name=$1 wall=$2 o=$d/$1
	python3 - "$name" "$wall" "$(cpu_of "$o.cpu")" "$o.m" "$o.stat" "$steps" "$3" "$PIN" <<'PY'
import json, os, sys
name, wall, cpu, mpath, spath, steps = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
load0, pin = sys.argv[7], sys.argv[8] == "1"
ms = [json.loads(l) for l in open(mpath)] if os.path.exists(mpath) else []
tp = mpath[:-2] + ".tcpu"
tcpu = [float(x) for x in open(tp).read().split()[-3:]] if os.path.exists(tp) else None
def breakdown(ms, wall):
    if not ms or wall is None or not all(isinstance(m.get("timing_s/elapsed"), (int, float)) for m in ms):
        return {"train_wall_s": wall}
    g = lambda m, k: m.get(k) if isinstance(m.get(k), (int, float)) else 0.0
    step = [g(m, "timing_s/step") for m in ms]
    el = [g(m, "timing_s/elapsed") for m in ms]
    parts = {"wait": sum(g(m, "timing_s/gen") for m in ms[1:]),
             "update": sum(g(m, "timing_s/update_actor") for m in ms),
             "model": sum(g(m, "timing_s/model") for m in ms),
             "publish": sum(g(m, "timing_s/publish") for m in ms),
             "ack": sum(g(m, "timing_s/ack") for m in ms)}
    out = {"train_wall_s": wall, "train_startup_s": el[0] - step[0], "train_first_wait_s": g(ms[0], "timing_s/gen")}
    out.update({"train_%s_s" % k: v for k, v in parts.items()})
    out["train_step_other_s"] = sum(step) - out["train_first_wait_s"] - parts["wait"] - parts["update"] - \
        parts["publish"] - parts["ack"]
    out["train_between_s"] = sum(el[i] - el[i - 1] - step[i] for i in range(1, len(ms)))
    out["train_exit_s"] = wall - el[-1]
    return {k: round(v, 3) for k, v in out.items()}
samples = 8 * len(ms)   # 2 groups of 4 a step
# the trained mix: early stop may train fewer long answers in the run's steps
# (their prompts re-queued past its end), which makes a sample cheaper
tok = [m.get("response_length/mean") for m in ms]
tok = [x for x in tok if isinstance(x, (int, float))]
st = json.load(open(spath)) if os.path.exists(spath) else {}
t = st.get("total", {})
print(json.dumps({"bench": "tail", "run": name, "steps": len(ms), "samples": samples, "wall_s": round(wall, 2),
    "cpu_s": round(cpu, 2), "samples_per_s": round(samples / wall, 2), "samples_per_cpu_s": round(samples / cpu, 2),
    "response_tokens_mean": round(sum(tok) / len(tok), 1) if tok else None,
    # each step's longest answer, averaged: a micro-batch is padded to its
    # longest row, so this is the trained width the trainer pays for
    "response_max_mean": (lambda x: round(sum(x) / len(x), 1) if x else None)(
        [m["response_length/max"] for m in ms if isinstance(m.get("response_length/max"), (int, float))]),
    # response tokens trained (each step's mean x its 8 samples), per second and per CPU second
    "tokens_per_s": round(8 * sum(tok) / wall, 1), "tokens_per_cpu_s": round(8 * sum(tok) / cpu, 1),
    "early_stops": t.get("early_stops", 0), "aborted": t.get("aborted", 0),
    "stale_dropped": t.get("stale_dropped", 0), "max_staleness": st.get("max_staleness"),
    # over the whole run, each side's share of time waiting (the bubble K may remove)
    **{"%s_idle_frac" % r: round(sum(w["idle_s"] for w in ws) / max(1e-9, sum(w["busy_s"] + w["idle_s"] for w in ws)), 3)
       for r in ("train", "rollout") for ws in [[w for w in st.get("workers", []) if w.get("role") == r]] if ws},
    **({"k_changes": ["%d:%d" % (v, k) for v, k in zip(st["autok"]["history"]["version"], st["autok"]["history"]["k"])],
        "autok_last": st["autok"]["last"],
        # each window: version, trainer idle, rollout idle, drift, K after it
        "windows": [[w["version"][i]] + [None if w[f][i] is None else round(w[f][i], 3) for f in
                    ("train_idle_frac", "rollout_idle_frac", "drift")] + [w["k"][i]]
                    for w in [st["autok"]["windows_history"]] for i in range(len(w["version"]))]}
       if "autok" in st else {}),
    # the trainer alone: its CPU seconds (user + system) and, per step, its
    # wall seconds less the wait for records (busy), and the model passes
    "train_cpu_s": round(tcpu[0] + tcpu[1], 2) if tcpu else None,
    # where the trainer's wall time goes (rl-train's timing_s/* keys, summed
    # over the run): start-up until its first wait for records, the wait for
    # the first groups, the later waits (leases), the updates (of which the
    # model's passes), writing and publishing each version, the version told
    # to the broker and the acknowledgements, the rest of the steps, between
    # the steps (metrics line, renewals), and the exit (process start before
    # rl_train_run, the final checkpoint and acknowledgements); they add up
    # to train_wall_s
    **breakdown(ms, tcpu[2] if tcpu else None),
    **{"train_%s_per_step_s" % n: (lambda x: round(sum(x) / len(x), 4) if x else None)(
        [f(m) for m in ms if all(isinstance(m.get(k), (int, float)) for k in ks)])
       for n, ks, f in (("busy", ("timing_s/step", "timing_s/gen"), lambda m: m["timing_s/step"] - m["timing_s/gen"]),
                        ("model", ("timing_s/model",), lambda m: m["timing_s/model"]))},
    "micro_tokens": os.environ.get("MICRO_TOKENS") or None, "publish_inline": os.environ.get("PUBLISH_INLINE") == "1",
    "pinned": pin, "load_before": float(load0), "load_after": float(open("/proc/loadavg").read().split()[0])}))
PY
}

for run in ${RUNS:-sync k1 k2 auto auto-es}; do
	l0=$(cut -d' ' -f1 /proc/loadavg)
	t0=$(date +%s.%N)
	case $run in
	sync) run_sync ;;
	k[0-9]) run_queue "$run" -k "${run#k}" ;;
	auto) run_queue auto -k auto:4 ;;
	auto-es) run_queue auto-es -k auto:4 --oversample "$OVERSAMPLE" --stragglers "$STRAGGLERS" ;;
	*) echo "bench/tail.sh: unknown run '$run' (sync, k0 to k9, auto, auto-es)" >&2; exit 2 ;;
	esac
	t1=$(date +%s.%N)
	line "$run" "$(echo "$t1 - $t0" | bc)" "$l0" | tee -a "$d/lines"
done
python3 - "$d/lines" <<'PY'
import json, sys
r = {j["run"]: j for j in map(json.loads, open(sys.argv[1]))}
fixed = sorted(k for k in r if len(k) == 2 and k[0] == "k" and k[1].isdigit())
best = max(fixed, key=lambda k: r[k]["samples_per_s"]) if fixed else None
out = {"bench": "tail", "summary": True, "best_fixed": best}
for a in ("auto", "auto-es"):
    for ref, b in (("best", r.get(best)), ("sync", r.get("sync"))):
        if a in r and b:
            out["%s_vs_%s" % (a.replace("-", "_"), ref)] = round(r[a]["samples_per_s"] / b["samples_per_s"], 3)
            out["%s_vs_%s_cpu" % (a.replace("-", "_"), ref)] = round(r[a]["samples_per_cpu_s"] / b["samples_per_cpu_s"], 3)
            out["%s_vs_%s_tokens" % (a.replace("-", "_"), ref)] = round(r[a]["tokens_per_s"] / b["tokens_per_s"], 3)
if best and "sync" in r:
    out["best_vs_sync"] = round(r[best]["samples_per_s"] / r["sync"]["samples_per_s"], 3)
out["load"] = open("/proc/loadavg").read().split()[:3]
print(json.dumps(out))
PY

#!/bin/sh
# bench/zero.sh [STEPS] [WORLD] [REPEAT] — rl-train's ZeRO stages on CPU ranks at the
# same batch: plain data parallelism (--zero 0), ZeRO-1, ZeRO-2 and ZeRO-3 (the
# stages in ZEROS, default "0 1 2 3"; "3n": ZeRO-3 with --no-prefetch), each REPEAT
# times in turn (the machine is shared: interleaving spreads its load over all).
# Per run, rank 0's means over the steps after the first (warm-up):
#   {"bench":"zero","zero":Z,"prefetch":P (ZeRO-3),"world":W,"run":i,"steps":S,"micro_per_rank":k (8 sequences
#    of 64 tokens over W ranks, 2 a micro-batch),
#    "step_s":timing_s/update_actor,"comm_wait_s":timing_s/allreduce,
#    "grads_resident_mb":memory/grads_resident_mb (measured, peak of the step),
#    "grads_mb":the full gradient buffer,"optimizer_state_mb","max_rss_mb",
#    "params_resident_mb":memory/params_resident_mb (measured, peak of the step; ZeRO-3's
#    shard plus the unit gathered),"weights_mb":the full parameter table,
#    the update's phases on rank 0: "gather_s":timing_s/param_gather (waits for parameter
#    gathers), "reduce_s":timing_s/grad_reduce (waits for gradient reductions),
#    "optimizer_s":timing_s/optimizer, "compute_s":timing_s/model less the optimizer,
#    "cpu_s": user + system CPU seconds of all ranks over the whole run (load, warm-up and
#    save included), "step_cpu_s": perf/cpu_s (rank 0's CPU seconds a step, every thread),
#    "minor_faults": perf/minor_faults (rank 0's page faults a step),
#    "micro_tokens":MICRO, "keep":--zero3-keep, "huge_pages":0 when RL_NO_THP was set,
#    "units_gathered":dp/units_gathered, "units_pooled":dp/units_pooled, "units_mapped":dp/units_mapped,
#    "comm_shm":false when RL_COMM_SHM=0 kept the ring on TCP (else the ranks' shared memory),
#    "ref":true with REF=1 (a KL term, --kl k3 --kl-coef 0.05, against --ref: another
#    model of the same shape, sharded with ZeRO-3), "ref_params_resident_mb":
#    memory/ref_params_resident_mb (measured, the reference's peak of the step)}
# ZEROS stages: a digit, then n (--no-prefetch), k (--zero3-keep KEEP, default 3.2e6:
# two of the model's units), t (RL_NO_THP=1: 4 KiB pages), p (RL_ZERO3_NO_POOL=1: the
# gathered units in pages faulted in afresh, not the unit pool), f (RL_ZERO3_NO_PREFAULT=1:
# the backward's gradient pages faulted in one by one), d (RL_ZERO3_NO_DIRECT=1: the
# gathers through the ring, not the other ranks' shards read in place), a (RL_ZERO2_NO_ALIGN=1:
# the gradient buffer where malloc put it, its buckets' edges not on 2 MiB pages), m
# (RL_ZERO3_NO_MAP=1: the shards read in place copied into m->params, not their whole
# pages mapped there), e.g. "1 3 3t 3k 3p 3f 3d 3m".
# "unit_pool", "grad_prefault": ZeRO-3 with its unit pool, with its gradient pages
# populated per unit before the backward writes them, "direct": ZeRO-3 reading the
# other ranks' shards in place (docs/parallel.md), "mapped": ZeRO-3 mapping their whole pages
# into the parameter table (units_mapped: the gathered ranges mapped so), "grads_aligned": ZeRO-2/3's gradient buffer
# moved so that its buckets are whole huge pages.
# BATCH (2) groups a step, MICRO (128) --max-tokens-per-micro: BATCH=8 MICRO=512 keeps 2
# micro-batches per rank on 2 ranks with 4x the tokens in each (the gathers stay the same).
# Model: bench/parallel-train.sh's ~11M-parameter Qwen2 (44 MB of f32
# gradients, tied embeddings); a step is 2 groups of 4 sequences of 16 + 48
# tokens (BATCH groups), micro-batches of MICRO tokens, so each of 2 ranks runs 2 micro-batches
# an update (each of 4 ranks 1) (ZeRO-2 reduce-scatters after each); buckets of BUCKET_MB (4) MiB,
# small next to the 44 MB, as 25 MiB ones are next to a real model's gradients.
# One OpenMP thread per rank.
set -eu
steps=${1:-6}
world=${2:-2}
repeat=${3:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"
d=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$d"' EXIT
cat > "$d/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":4096,"hidden_size":384,"num_hidden_layers":6,"num_attention_heads":6,
 "num_key_value_heads":2,"intermediate_size":1024,"max_position_embeddings":512,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32"}
JSON
rl-train --init "$d/cfg.json" --tokenizer bytes --out "$d/m0" 2>/dev/null
refargs=""
if [ "${REF:-0}" = 1 ]; then
	rl-train --init "$d/cfg.json" --tokenizer bytes --out "$d/m1" --seed 2 2>/dev/null
	refargs="--kl k3 --kl-coef 0.05 --ref $d/m1"
fi
batch=${BATCH:-2}
micro=${MICRO:-128}
python3 - "$d/scored.jsonl" "$steps" "$batch" <<'PY'
import json, random, sys
random.seed(1)
out, steps = sys.argv[1], int(sys.argv[2])
rid = 0
with open(out, "w") as f:
    for g in range(int(sys.argv[3]) * steps):
        p = [random.randrange(4096) for _ in range(16)]
        for i in range(4):
            rid += 1
            r = [random.randrange(4096) for _ in range(48)]
            f.write(json.dumps({"id": rid, "group": g, "index": i, "group_size": 4, "prompt": p,
                "response": r, "logprobs": [-8.3] * 48, "reward": float(i % 2)}) + "\n")
PY
port=$((21000 + $$ % 5000))
args="--batch $batch --lr 1e-4 --keep 1 --max-tokens-per-micro $micro --bucket-mb ${BUCKET_MB:-4} $refargs"
run() {   # run ZERO RUN
	port=$((port + 1))
	z=$(echo "$1" | cut -c1)
	extra="" thp=1
	case $1 in *n*) extra="--no-prefetch" ;; esac
	case $1 in *k*) extra="$extra --zero3-keep ${KEEP:-3.2e6}" ;; esac
	case $1 in *t*) thp=0 ;; esac
	case $1 in *p*) pool=0 ;; *) pool=1 ;; esac
	case $1 in *f*) RL_ZERO3_NO_PREFAULT=1; export RL_ZERO3_NO_PREFAULT ;; *) unset RL_ZERO3_NO_PREFAULT ;; esac
	case $1 in *d*) RL_ZERO3_NO_DIRECT=1; export RL_ZERO3_NO_DIRECT ;; *) unset RL_ZERO3_NO_DIRECT ;; esac
	case $1 in *a*) RL_ZERO2_NO_ALIGN=1; export RL_ZERO2_NO_ALIGN ;; *) unset RL_ZERO2_NO_ALIGN ;; esac
	case $1 in *m*) RL_ZERO3_NO_MAP=1; export RL_ZERO3_NO_MAP ;; *) unset RL_ZERO3_NO_MAP ;; esac
	if [ $thp = 0 ]; then RL_NO_THP=1; export RL_NO_THP; else unset RL_NO_THP; fi
	if [ $pool = 0 ]; then RL_ZERO3_NO_POOL=1; export RL_ZERO3_NO_POOL; else unset RL_ZERO3_NO_POOL; fi
	rm -rf "$d/ck"
	for r in $(seq 1 $((world - 1))); do
		OMP_NUM_THREADS=1 /usr/bin/time -f "%U %S" -o "$d/cpu.$r" rl-train -q -m "$d/m0" --out "$d/ck" --rank "$r" --world "$world" \
		    --rendezvous "127.0.0.1:$port" --zero "$z" $extra $args "$d/scored.jsonl" &
		pids="$pids $!"
	done
	OMP_NUM_THREADS=1 /usr/bin/time -f "%U %S" -o "$d/cpu.0" rl-train -q -m "$d/m0" --out "$d/ck" --rank 0 --world "$world" \
	    --rendezvous "127.0.0.1:$port" --zero "$z" $extra $args --metrics "$d/m.jsonl" "$d/scored.jsonl"
	wait
	python3 - "$d/m.jsonl" "$world" "$z" "$2" "$extra" "$batch" "$micro" "$d" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])][1:]
batch, micro, d = int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
cpu = sum(sum(float(x) for x in open(f"{d}/cpu.{r}").read().split()[-2:]) for r in range(int(sys.argv[2])))
def mean(k):
    v = [m[k] for m in ms if m.get(k) is not None]
    return round(sum(v) / len(v), 4) if v else None
print(json.dumps({"bench": "zero", "zero": int(sys.argv[3]), "prefetch": int(sys.argv[3]) == 3 and "--no-prefetch" not in sys.argv[5],
    "keep": float(sys.argv[5].split("--zero3-keep ")[1]) if "--zero3-keep" in sys.argv[5] else 0,
    "huge_pages": "RL_NO_THP" not in __import__("os").environ,
    "unit_pool": int(sys.argv[3]) == 3 and "RL_ZERO3_NO_POOL" not in __import__("os").environ
        and not (mean("dp/units_mapped") or 0),
    "grad_prefault": int(sys.argv[3]) == 3 and "RL_ZERO3_NO_PREFAULT" not in __import__("os").environ,
    "direct": int(sys.argv[3]) == 3 and "RL_ZERO3_NO_DIRECT" not in __import__("os").environ,
    "mapped": int(sys.argv[3]) == 3 and "RL_ZERO3_NO_MAP" not in __import__("os").environ
        and "RL_ZERO3_NO_DIRECT" not in __import__("os").environ,
    "grads_aligned": int(sys.argv[3]) >= 2 and "RL_ZERO2_NO_ALIGN" not in __import__("os").environ,
    "comm_shm": __import__("os").environ.get("RL_COMM_SHM", "1") != "0",
    "world": int(sys.argv[2]), "run": int(sys.argv[4]),
    "steps": len(ms), "micro_tokens": micro,
    "micro_per_rank": max(1, batch * 4 * 64 // int(sys.argv[2]) // micro), "step_s": mean("timing_s/update_actor"),
    "comm_wait_s": mean("timing_s/allreduce"), "grads_resident_mb": round(max(m["memory/grads_resident_mb"] for m in ms), 1),
    "grads_mb": round(ms[-1]["memory/grads_mb"], 1), "optimizer_state_mb": round(ms[-1]["memory/optimizer_state_mb"], 1),
    "max_rss_mb": round(ms[-1]["memory/max_rss_mb"], 1),
    "params_resident_mb": round(max(m.get("memory/params_resident_mb", 0) for m in ms), 1),
    "weights_mb": round(ms[-1]["memory/weights_mb"], 1),
    "gather_s": mean("timing_s/param_gather"), "reduce_s": mean("timing_s/grad_reduce"),
    "optimizer_s": mean("timing_s/optimizer"),
    "compute_s": round(mean("timing_s/model") - mean("timing_s/optimizer"), 4), "cpu_s": round(cpu, 2),
    "step_cpu_s": mean("perf/cpu_s"), "minor_faults": mean("perf/minor_faults"),
    "units_gathered": mean("dp/units_gathered"), "units_pooled": mean("dp/units_pooled"),
    "units_mapped": mean("dp/units_mapped"),
    "ref": "memory/ref_params_resident_mb" in ms[-1],
    "ref_params_resident_mb": round(max(m.get("memory/ref_params_resident_mb", 0) for m in ms), 1)}))
PY
}
for i in $(seq 1 "$repeat"); do
	for z in ${ZEROS:-0 1 2 3}; do
		run "$z" "$i"
	done
done

#!/bin/sh
# bench/parallel-train.sh [STEPS] [WORLD] — data-parallel rl-train on the CPU:
# step time with the gradient all-reduce overlapped with the backward pass
# (default) and without (--no-dp-overlap), for 25 MiB and 4 MiB buckets;
# then ZeRO-1 (--zero 1) against plain data parallelism: step time, AdamW
# state per rank and rank 0's peak resident memory.
# Model: the ~11M-parameter Qwen2 shape of bench/train.sh (44 MB of f32
# gradients); a step is 1 group of 4 sequences of 16 + 48 tokens, so each of
# 2 ranks computes little and the all-reduce is a large share of the step, as
# it is for a GPU.  One OpenMP thread per rank.  The first step (warm-up) is
# left out.  JSON lines:
#   {"bench":"dp_train","world":W,"overlap":0|1,"bucket_mb":M,"steps":S,
#    "step_s":mean timing_s/update_actor,"allreduce_wait_s":mean timing_s/allreduce,
#    "model_s":mean timing_s/model,"overlapped_frac":dp/buckets_overlapped_frac,
#    "zero":0|1,"optimizer_state_mb":this rank's AdamW state,"rss_mb","max_rss_mb": rank 0's resident memory after the last step and at its peak}
set -eu
steps=${1:-6}
world=${2:-2}
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
python3 - "$d/scored.jsonl" "$steps" <<'PY'
import json, random, sys
random.seed(1)
out, steps = sys.argv[1], int(sys.argv[2])
rid = 0
with open(out, "w") as f:
    for g in range(steps):
        p = [random.randrange(4096) for _ in range(16)]
        for i in range(4):
            rid += 1
            r = [random.randrange(4096) for _ in range(48)]
            f.write(json.dumps({"id": rid, "group": g, "index": i, "group_size": 4, "prompt": p,
                "response": r, "logprobs": [-8.3] * 48, "reward": float(i % 2)}) + "\n")
PY
port=$((21000 + $$ % 5000))
run() {   # run OVERLAP BUCKET_MB [ZERO]
	ov=""
	[ "$1" = 1 ] || ov=--no-dp-overlap
	[ "${3:-0}" = 1 ] && ov="$ov --zero 1"
	port=$((port + 1))
	rm -rf "$d/ck"
	for r in $(seq 1 $((world - 1))); do
		OMP_NUM_THREADS=1 rl-train -q -m "$d/m0" --out "$d/ck" --rank "$r" --world "$world" \
		    --rendezvous "127.0.0.1:$port" --batch 1 --lr 1e-4 --keep 1 --bucket-mb "$2" $ov "$d/scored.jsonl" &
		pids="$pids $!"
	done
	OMP_NUM_THREADS=1 rl-train -q -m "$d/m0" --out "$d/ck" --rank 0 --world "$world" \
	    --rendezvous "127.0.0.1:$port" --batch 1 --lr 1e-4 --keep 1 --bucket-mb "$2" $ov \
	    --metrics "$d/m.jsonl" "$d/scored.jsonl"
	wait
	python3 - "$d/m.jsonl" "$world" "$1" "$2" "${3:-0}" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])][1:]
def mean(k):
    v = [m[k] for m in ms if m.get(k) is not None]
    return round(sum(v) / len(v), 4) if v else None
print(json.dumps({"bench": "dp_train", "world": int(sys.argv[2]), "overlap": int(sys.argv[3]),
    "bucket_mb": float(sys.argv[4]), "steps": len(ms), "step_s": mean("timing_s/update_actor"),
    "allreduce_wait_s": mean("timing_s/allreduce"), "model_s": mean("timing_s/model"),
    "overlapped_frac": mean("dp/buckets_overlapped_frac"), "zero": int(sys.argv[5]),
    "optimizer_state_mb": round(ms[-1]["memory/optimizer_state_mb"], 2),
    "rss_mb": round(ms[-1]["memory/rss_mb"], 1), "max_rss_mb": round(ms[-1]["memory/max_rss_mb"], 1)}))
PY
}
for mb in 25 4; do
	run 0 "$mb"
	run 1 "$mb"
done
run 0 25 1

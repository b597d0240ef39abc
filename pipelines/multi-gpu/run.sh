#!/bin/sh
# pipelines/multi-gpu/run.sh — GRPO on one node with several GPUs: the
# trainer data-parallel on some GPUs, generation on the others.
#
#   rl-queue serve                       the broker (127.0.0.1)
#   rl-rollout --queue, one per ROLLOUT_GPUS entry, weights from $RUN/ckpt
#   rl-reward --queue                    scoring (CPU)
#   rl-queue get --ack >> scored.jsonl   the scored groups, in one order
#   train-rank.sh, one per TRAIN_GPUS entry: rl-train ranks (RANK, WORLD_SIZE,
#       LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them), each
#       reading all of scored.jsonl; rank 0 writes $RUN/ckpt, which the
#       generators pick up (--weights-from)
#
# Every rank must see the same records in the same order (docs/parallel.md),
# hence the single file written by one `rl-queue get` loop.  The trainer
# does not report its version to the broker here, so there is no staleness
# gate: the generators run ahead by what the broker holds (--max-bytes) and
# the file has not yet been trained on; staleness/mean in the metrics shows it.
#
# Settings (environment): MODEL (Hugging Face dir, required), PROMPTS (JSONL,
# required), TASK (rl-reward task, default auto), TRAIN_GPUS ("0 1 2 3"),
# ROLLOUT_GPUS ("4 5 6 7"), DEVICE (cuda; cpu runs the same wiring on the
# CPU, the GPU lists then only count processes), BATCH (prompts per step, 64),
# SAMPLES (per prompt, 8), STEPS (100), LR (1e-6), MAX_TOKENS (512),
# MASTER_PORT (29500), RUN (runs/multi-gpu).  Calls only rl-* programs and sh,
# awk, tail.  Every process it starts is stopped by pid on exit.
#
# NOT RUN ON GPUS: written and checked with DEVICE=cpu on a machine without a
# GPU (see docs/parallel.md).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
: "${MODEL:?set MODEL to a Hugging Face model directory}"
: "${PROMPTS:?set PROMPTS to a prompts JSONL file}"
TASK=${TASK:-auto}
TRAIN_GPUS=${TRAIN_GPUS:-0 1 2 3}
ROLLOUT_GPUS=${ROLLOUT_GPUS:-4 5 6 7}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-64}
SAMPLES=${SAMPLES:-8}
STEPS=${STEPS:-100}
LR=${LR:-1e-6}
MAX_TOKENS=${MAX_TOKENS:-512}
MASTER_PORT=${MASTER_PORT:-29500}
RUN=${RUN:-runs/multi-gpu}

for p in rl-train rl-rollout rl-reward rl-queue; do
	command -v $p >/dev/null 2>&1 || { echo "multi-gpu: $p not found on PATH" >&2; exit 1; }
done

PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

rm -rf "$RUN"
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
L=$RUN/logs
CK=$RUN/ckpt
: > "$RUN/scored.jsonl"

# the broker, on a port found free (it exits 3 when it cannot listen)
i=0
while :; do
	port=$(awk -v s="$$$i" 'BEGIN { srand(s); printf "%d", 7400 + int(rand() * 2000) }')
	URL=tcp://127.0.0.1:$port
	rl-queue serve --listen "$URL" 2>"$L/queue.log" &
	Q=$!
	j=0
	while [ $j -lt 50 ] && kill -0 "$Q" 2>/dev/null && ! rl-queue stat "$URL" >/dev/null 2>&1; do
		sleep 0.1; j=$((j + 1))
	done
	if kill -0 "$Q" 2>/dev/null; then PIDS="$PIDS $Q"; break; fi
	i=$((i + 1))
	[ $i -lt 20 ] || { echo "multi-gpu: cannot start rl-queue serve (see $L/queue.log)" >&2; exit 1; }
done
rl-queue put -q "$URL" "$PROMPTS" 2>"$L/put.log"

# generation: one process per rollout GPU, all on the broker
g=0
for gpu in $ROLLOUT_GPUS; do
	d=$DEVICE; [ "$DEVICE" = cuda ] && d=cuda:$gpu
	rl-rollout -m "$MODEL" --device "$d" --queue "$URL" -n "$SAMPLES" --max-tokens "$MAX_TOKENS" \
		--seed "$g" --weights-from "$CK" 2>"$L/rollout.$gpu.log" &
	PIDS="$PIDS $!"
	g=$((g + 1))
done
rl-reward --task "$TASK" --queue "$URL" 2>"$L/reward.log" &
PIDS="$PIDS $!"

# the trainer ranks: torchrun's variables, one GPU each
world=$(echo $TRAIN_GPUS | wc -w)
r=0
RANKS=""
for gpu in $TRAIN_GPUS; do
	d=$DEVICE; [ "$DEVICE" = cuda ] && d=cuda:$gpu
	RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$MASTER_PORT \
		"$here/train-rank.sh" "$RUN/scored.jsonl" -m "$MODEL" --out "$CK" --device "$d" \
		--algo grpo --batch "$BATCH" --lr "$LR" --max-steps "$STEPS" --metrics "$RUN/metrics.jsonl" \
		2>"$L/train.$r.log" &
	RANKS="$RANKS $!"
	r=$((r + 1))
done
PIDS="$PIDS $RANKS"
rank0=${RANKS# }; rank0=${rank0%% *}

# one reader of the scored groups, so every rank sees one order
( while kill -0 "$rank0" 2>/dev/null; do
	rl-queue get -q -s train -n $((BATCH * SAMPLES)) -w 5 --ack "$URL" >> "$RUN/scored.jsonl" || sleep 1
done ) 2>"$L/feeder.log" &
PIDS="$PIDS $!"

rc=0
for p in $RANKS; do wait "$p" || rc=1; done
if [ $rc != 0 ]; then
	echo "multi-gpu: a trainer rank failed; see $L/train.*.log" >&2
	tail -n 3 "$L"/train.*.log >&2
	exit 1
fi
echo "multi-gpu: $STEPS steps on $world trainer ranks; checkpoints in $CK, metrics in $RUN/metrics.jsonl"

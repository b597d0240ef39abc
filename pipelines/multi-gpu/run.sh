#!/bin/sh
# pipelines/multi-gpu/run.sh — GRPO on one node with several GPUs: the
# trainer data-parallel on some GPUs, generation on the others.
#
#   rl-queue serve                       the broker (127.0.0.1), staleness gate
#   rl-rollout --queue, one per ROLLOUT_GPUS entry, weights from $RUN/ckpt
#   rl-reward --queue                    scoring (CPU)
#   rl-train --queue, one rank per TRAIN_GPUS entry (RANK, WORLD_SIZE,
#       LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them): rank 0
#       leases the scored groups and passes them to the other ranks
#       (docs/parallel.md), reports its version to the broker and
#       acknowledges each step; rank 0 writes $RUN/ckpt, which the generators
#       pick up (--weights-from), or with WEIGHTS=group sends each version
#       straight to the generators (rl-train --weights-group: CUDA IPC between
#       the GPUs of this node by default, docs/wgroup.md)
#
# The broker's gate (-k STALENESS, -b BATCH x SAMPLES) keeps the generators
# at most STALENESS versions ahead of the trainer.
#
# Settings (environment): MODEL (Hugging Face dir, required), PROMPTS (JSONL,
# required), TASK (rl-reward task, default auto), TRAIN_GPUS ("0 1 2 3"),
# ROLLOUT_GPUS ("4 5 6 7"), DEVICE (cuda; cpu runs the same wiring on the
# CPU, the GPU lists then only count processes), BATCH (prompts per step, 64),
# SAMPLES (per prompt, 8), STEPS (100), LR (1e-6), MAX_TOKENS (512),
# STALENESS (1), ZERO (0; 1: rl-train --zero 1), MASTER_PORT (29500; the
# weights group uses MASTER_PORT + 1), WEIGHTS (dir or group), WEIGHTS_BACKEND
# (the group's: auto, ipc, nccl or cpu; default auto), RUN (runs/multi-gpu).  Calls only rl-* programs and sh, awk.  Every process it starts is stopped by pid on exit.
# A generator or the scorer that fails before the trainer ranks finish stops
# the run with exit 1, naming its log (the trainers would wait for records
# for ever).
#
# NOT RUN ON GPUS: written and checked with DEVICE=cpu on a machine without a
# GPU (see docs/parallel.md).
set -eu

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
STALENESS=${STALENESS:-1}
ZERO=${ZERO:-0}
RUN=${RUN:-runs/multi-gpu}
WEIGHTS=${WEIGHTS:-dir}
WEIGHTS_BACKEND=${WEIGHTS_BACKEND:-auto}
case $WEIGHTS in dir|group) ;; *) echo "multi-gpu: WEIGHTS is dir or group, not '$WEIGHTS'" >&2; exit 2 ;; esac

for p in rl-train rl-rollout rl-reward rl-queue; do
	command -v $p >/dev/null 2>&1 || { echo "multi-gpu: $p not found on PATH" >&2; exit 1; }
done

PIDS=""
Q=""
# the workers first, then the broker (a worker stopping hands its leases back to it)
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	[ -z "$Q" ] || { kill "$Q" 2>/dev/null || true; wait "$Q" 2>/dev/null || true; }
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

rm -rf "$RUN"
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
L=$RUN/logs
CK=$RUN/ckpt

# the broker, on a port found free (it exits 3 when it cannot listen)
i=0
while :; do
	port=$(awk -v s="$$$i" 'BEGIN { srand(s); printf "%d", 7400 + int(rand() * 2000) }')
	URL=tcp://127.0.0.1:$port
	rl-queue serve --listen "$URL" -k "$STALENESS" -b $((BATCH * SAMPLES)) 2>"$L/queue.log" &
	Q=$!
	j=0
	while [ $j -lt 50 ] && kill -0 "$Q" 2>/dev/null && ! rl-queue stat "$URL" >/dev/null 2>&1; do
		sleep 0.1; j=$((j + 1))
	done
	if kill -0 "$Q" 2>/dev/null; then break; fi
	Q=""
	i=$((i + 1))
	[ $i -lt 20 ] || { echo "multi-gpu: cannot start rl-queue serve (see $L/queue.log)" >&2; exit 1; }
done
rl-queue put -q "$URL" "$PROMPTS" 2>"$L/put.log"

# weights: the trainer's checkpoint directory, or its weights group (rank 0:
# the trainer's rank 0; 1..n: the generators)
GADDR=127.0.0.1:$((MASTER_PORT + 1))
GSIZE=$(($(echo $ROLLOUT_GPUS | wc -w) + 1))
W_TRAIN=""
[ "$WEIGHTS" = dir ] ||
	W_TRAIN="--weights-group $GADDR --weights-group-size $GSIZE --weights-group-backend $WEIGHTS_BACKEND"

# generation: one process per rollout GPU, all on the broker
g=0
for gpu in $ROLLOUT_GPUS; do
	d=$DEVICE; [ "$DEVICE" = cuda ] && d=cuda:$gpu
	W="--weights-from $CK"
	[ "$WEIGHTS" = dir ] || W="--weights-group $GADDR --weights-group-rank $((g + 1)) --weights-group-size $GSIZE \
		--weights-group-backend $WEIGHTS_BACKEND"
	rl-rollout -m "$MODEL" --device "$d" --queue "$URL" -n "$SAMPLES" --max-tokens "$MAX_TOKENS" \
		--seed "$g" $W 2>"$L/rollout.$gpu.log" &
	PIDS="$PIDS $!"
	WORKERS="${WORKERS:-} $!:rollout.$gpu"
	g=$((g + 1))
done
rl-reward --task "$TASK" --queue "$URL" 2>"$L/reward.log" &
PIDS="$PIDS $!"
WORKERS="$WORKERS $!:reward"

# the trainer ranks: torchrun's variables, one GPU each
world=$(echo $TRAIN_GPUS | wc -w)
r=0
RANKS=""
for gpu in $TRAIN_GPUS; do
	d=$DEVICE; [ "$DEVICE" = cuda ] && d=cuda:$gpu
	RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$MASTER_PORT \
		rl-train -m "$MODEL" --out "$CK" --device "$d" --queue "$URL" --zero "$ZERO" \
		--algo grpo --batch "$BATCH" --lr "$LR" --max-steps "$STEPS" --metrics "$RUN/metrics.jsonl" \
		$W_TRAIN 2>"$L/train.$r.log" &
	RANKS="$RANKS $!"
	r=$((r + 1))
done
PIDS="$PIDS $RANKS"

# the trainer ranks end the run.  A generator or the scorer that fails
# before they do (a bad option, a crash) would leave them waiting for records
# for ever: the run stops then, naming it.  (A worker that exits 0, after the
# trainer ended its weights group, is no failure.)
while :; do
	alive=0
	for p in $RANKS; do kill -0 "$p" 2>/dev/null && alive=1; done
	[ $alive = 1 ] || break
	left=""
	for w in $WORKERS; do
		p=${w%%:*}
		if kill -0 "$p" 2>/dev/null; then left="$left $w"; continue; fi
		st=0
		wait "$p" || st=$?
		if [ $st != 0 ]; then
			echo "multi-gpu: rl-${w#*:}: exited with status $st before training ended; see $L/${w#*:}.log" >&2
			tail -n 3 "$L/${w#*:}.log" >&2
			exit 1
		fi
	done
	WORKERS=$left
	sleep 1
done
rc=0
for p in $RANKS; do wait "$p" || rc=1; done
if [ $rc != 0 ]; then
	echo "multi-gpu: a trainer rank failed; see $L/train.*.log" >&2
	tail -n 3 "$L"/train.*.log >&2
	exit 1
fi
echo "multi-gpu: $STEPS steps on $world trainer ranks; checkpoints in $CK, metrics in $RUN/metrics.jsonl"

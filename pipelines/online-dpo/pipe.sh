#!/bin/sh
# pipelines/online-dpo/pipe.sh — online DPO in the pipe wiring, one machine:
#
#   rl-rollout -n SAMPLES --weights-from OUT | rl-reward REWARD | rl-train --algo dpo --online
#
# Each prompt is sampled SAMPLES times, rl-reward scores the samples, rl-train
# trains each group's best and worst as a pair and writes a version per step
# into OUT, which rl-rollout loads as it goes.  No staleness gate: a group
# whose rewards tie gives no pair and does not count toward a step, so a
# gate that counts groups per version would wait for groups the trainer
# has already spent; generation runs ahead only as far as the pipe holds
# (records in flight; staleness/mean in the metrics says how far).  The
# queue wiring (the Makefile here) gates on samples in flight instead.
#
# Environment: MODEL, PROMPTS, OUT (required); REWARD (rl-reward's scoring
# options, shell-quoted; default --task auto), STEPS (50), BATCH (prompts per
# step, 8), SAMPLES (4), LR (5e-7), BETA (0.1), TEMP (1), MAX_TOKENS (256),
# DEVICE (cpu), CHAT (1: the chat template).  Metrics in OUT/metrics.jsonl.
set -eu
: "${MODEL:?set MODEL to a Hugging Face model directory}"
: "${PROMPTS:?set PROMPTS to a JSONL file of prompt lines}"
: "${OUT:?set OUT to the run directory}"
REWARD=${REWARD:---task auto}
STEPS=${STEPS:-50}
BATCH=${BATCH:-8}
SAMPLES=${SAMPLES:-4}
LR=${LR:-5e-7}
BETA=${BETA:-0.1}
TEMP=${TEMP:-1}
MAX_TOKENS=${MAX_TOKENS:-256}
DEVICE=${DEVICE:-cpu}
CHAT=${CHAT:-1}
[ -d "$MODEL" ] || { echo "online-dpo: MODEL '$MODEL' is not a directory" >&2; exit 2; }
[ -f "$PROMPTS" ] || { echo "online-dpo: PROMPTS '$PROMPTS' not found" >&2; exit 2; }
mkdir -p "$OUT"
chat=""
[ "$CHAT" = 1 ] && chat=--chat
eval "set -- $REWARD"
# rl-train ends the pipe after STEPS; rl-rollout then stops on the closed pipe
rl-rollout -m "$MODEL" --weights-from "$OUT/ckpt" --device "$DEVICE" -n "$SAMPLES" --temperature "$TEMP" \
	--max-tokens "$MAX_TOKENS" $chat "$PROMPTS" 2>>"$OUT/rollout.log" |
	rl-reward "$@" 2>>"$OUT/reward.log" |
	rl-train -m "$MODEL" --out "$OUT/ckpt" --algo dpo --online --beta "$BETA" --device "$DEVICE" \
		--batch "$BATCH" --lr "$LR" --max-steps "$STEPS" --metrics "$OUT/metrics.jsonl" - 2>>"$OUT/train.log"
echo "online-dpo: $(wc -l < "$OUT/metrics.jsonl") steps; checkpoints in $OUT/ckpt; metrics in $OUT/metrics.jsonl"

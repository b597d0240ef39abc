#!/bin/sh
# pipelines/lib/eval.sh — greedy accuracy of a recipe's newest checkpoint (or
# of MODEL when there is none yet) on TEST, scored by rl-reward --task TASK.
# Writes OUT/eval-<step>.jsonl (the scored records) and prints one line.
set -eu
: "${OUT:?}" "${TEST:?set TEST to a JSONL file of prompt lines with answers}" "${TASK:?}"
DEVICE=${DEVICE:-cuda}
MAX_TOKENS=${MAX_TOKENS:-512}
CHAT=${CHAT:-1}
m=${MODEL:-}
step=base
if [ -L "$OUT/ckpt/latest" ]; then step=$(readlink "$OUT/ckpt/latest"); m=$OUT/ckpt/$step; fi
[ -n "$m" ] || { echo "eval: no checkpoint in $OUT and no MODEL" >&2; exit 2; }
chat=""
[ "$CHAT" = 1 ] && chat=--chat
mkdir -p "$OUT"
rl-rollout -q -m "$m" --device "$DEVICE" --temperature 0 --max-tokens "$MAX_TOKENS" $chat "$TEST" |
	rl-reward -q --task "$TASK" --jsonl > "$OUT/eval-$step.jsonl"
awk -v s="$step" '/"reward":1[,}]/ { ok++ } { n++ }
	END { if (n == 0) { print "eval: no records" > "/dev/stderr"; exit 1 }
	      printf "eval: %s: accuracy %.4f on %d problems\n", s, ok / n, n }' "$OUT/eval-$step.jsonl"

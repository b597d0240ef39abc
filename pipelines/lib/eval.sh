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
# one stage after the other, each status checked (sh has no pipefail: a failed
# rl-rollout used to give an accuracy over the problems before the bad line)
rl-rollout -q -m "$m" --device "$DEVICE" --temperature 0 --max-tokens "$MAX_TOKENS" $chat "$TEST" \
	> "$OUT/eval-$step.gen" || { echo "eval: rl-rollout failed on $TEST" >&2; exit 1; }
rl-reward -q --task "$TASK" --jsonl "$OUT/eval-$step.gen" > "$OUT/eval-$step.jsonl" ||
	{ echo "eval: rl-reward failed" >&2; exit 1; }
rm -f "$OUT/eval-$step.gen"
want=$(awk 'NF { n++ } END { print n + 0 }' "$TEST")
awk -v s="$step" -v want="$want" '/"reward":1[,}]/ { ok++ } { n++ }
	END { if (n == 0) { print "eval: no records" > "/dev/stderr"; exit 1 }
	      if (n != want) { printf "eval: %d records for %d problems\n", n, want > "/dev/stderr"; exit 1 }
	      printf "eval: %s: accuracy %.4f on %d problems\n", s, ok / n, n }' "$OUT/eval-$step.jsonl"

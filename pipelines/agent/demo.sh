#!/bin/sh
# pipelines/agent/demo.sh — a tiny model learns by RL to call a calculator.
#
# The task: 3-digit sums ("123+456="), which a model of this size cannot do
# in its head.  A byte-level model is trained from scratch: a short SFT warm
# start teaches the two ways to answer, half of its examples each way:
#   directly     ANSWER: 579\n
#   with a tool  <calc>123+456</calc>  (the turn ends; calc_env.py answers
#                "579", fed as an observation)  ANSWER: 579\n
# so it calls the calculator about half the time and guesses otherwise.
# Then GRPO on multi-turn episodes (rl-rollout --env "python3 calc_env.py" |
# rl-train, on-policy: --max-staleness 0): an episode's reward is 1 when its
# final ANSWER is the sum.  Calling the calculator is what pays, and the
# model learns to do it.
#
# Prints the held-out success (greedy episodes on problems never trained on)
# and tool-call rate before and after, writes success.png (gnuplot) and
# exits 1 unless the success went up by GOAL_GAIN (absolute) and reached
# GOAL_MIN, unless GOAL=0.  Calls rl-* programs, python3 (the environment
# and the data), sh, awk, gnuplot.  Every process it starts is stopped by
# pid on exit.  Settings from the environment (defaults below).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
SEED=${SEED:-1}
RUN=${RUN:-runs/agent}
SFT_STEPS=${SFT_STEPS:-400}
SFT_BATCH=${SFT_BATCH:-32}
SFT_LR=${SFT_LR:-2e-3}
RL_STEPS=${RL_STEPS:-60}
PROMPTS=${PROMPTS:-16}
SAMPLES=${SAMPLES:-8}
RL_LR=${RL_LR:-5e-4}
TEMP=${TEMP:-1.0}
TEST_N=${TEST_N:-200}
GOAL=${GOAL:-1}
GOAL_GAIN=${GOAL_GAIN:-0.2}
GOAL_MIN=${GOAL_MIN:-0.6}
PLOT=${PLOT:-1}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

for p in rl-train rl-rollout python3; do
	command -v $p >/dev/null 2>&1 || { echo "agent demo: $p not found on PATH" >&2; exit 1; }
done
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; PIDS=""; }
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

rm -rf "$RUN"
mkdir -p "$RUN/logs" "$RUN/data"
RUN=$(cd "$RUN" && pwd)
L=$RUN/logs
ENV_CMD="python3 $here/calc_env.py"
# a turn ends at the tool call's close or the answer's newline
EP_ARGS="--env-framing plain --env-procs 4 --max-turns 3 --max-tokens 24 --max-episode-tokens 72"

# ---- data: train and held-out problems are disjoint (a+b pairs drawn apart) --------
python3 "$here/make_data.py" "$RUN/data" "$SEED" "$SFT_STEPS" "$SFT_BATCH" "$RL_STEPS" "$PROMPTS" "$TEST_N"

# held-out success and tool-call rate of model directory $1 (greedy episodes)
evaluate() {
	rl-rollout -q -m "$1" --temperature 0 --env "$ENV_CMD" $EP_ARGS --stop "</calc>" --stop "
" --jsonl "$RUN/data/test.jsonl" 2>>"$L/eval.log" | python3 -c '
import json, sys
n = ok = tool = 0
for l in sys.stdin:
    r = json.loads(l)
    n += 1
    ok += r.get("reward", 0) == 1
    tool += len(r.get("turns", [])) >= 4
print("%.3f %.3f" % (ok / max(n, 1), tool / max(n, 1)))'
}

echo "agent demo: seed $SEED; run directory $RUN"
rl-train -q --init "$here/model.json" --tokenizer bytes --out "$RUN/init" --seed "$SEED" 2>"$L/init.log" ||
	{ echo "agent demo: rl-train --init failed; see $L/init.log" >&2; tail -n 5 "$L/init.log" >&2; exit 1; }
echo "agent demo: SFT warm start: $SFT_STEPS steps x $SFT_BATCH examples, half of them calling the calculator"
rl-train -q -m "$RUN/init" --out "$RUN/sft" --algo sft --seed "$SEED" --batch "$SFT_BATCH" --lr "$SFT_LR" --keep 1 \
    --metrics "$RUN/sft-metrics.jsonl" "$RUN/data/sft.jsonl" 2>"$L/sft.log" ||
	{ echo "agent demo: SFT failed; see $L/sft.log" >&2; tail -n 5 "$L/sft.log" >&2; exit 1; }
BASE=$RUN/sft/$(readlink "$RUN/sft/latest")
# shellcheck disable=SC2046  # two numbers, split on purpose
set -- $(evaluate "$BASE")
ok0=$1 tool0=$2
echo "agent demo: after SFT: held-out success $ok0, tool calls $tool0"
printf '0\t%s\t%s\n' "$ok0" "$tool0" > "$RUN/heldout.tsv"

echo "agent demo: GRPO: $RL_STEPS steps x $PROMPTS prompts x $SAMPLES episodes (lr $RL_LR)"
CK=$RUN/ckpt
M=$RUN/metrics.jsonl
t0=$(date +%s)
rl-rollout -m "$BASE" --seed "$SEED" -n "$SAMPLES" --temperature "$TEMP" --env "$ENV_CMD" $EP_ARGS --stop "</calc>" --stop "
" --weights-from "$CK" --max-staleness 0 --train-batch "$PROMPTS" "$RUN/data/prompts.jsonl" 2>"$L/rollout.log" |
	rl-train -m "$BASE" --out "$CK" --algo grpo --seed "$SEED" --batch "$PROMPTS" --lr "$RL_LR" --keep 2 \
	    --metrics "$M" - 2>"$L/train.log" ||
	{ echo "agent demo: GRPO failed; see $L/rollout.log and $L/train.log" >&2; tail -n 5 "$L/train.log" >&2; exit 1; }
t1=$(date +%s)
FINAL=$CK/$(readlink "$CK/latest")
# shellcheck disable=SC2046
set -- $(evaluate "$FINAL")
ok1=$1 tool1=$2
printf '%s\t%s\t%s\n' "$(wc -l < "$M")" "$ok1" "$tool1" >> "$RUN/heldout.tsv"
awk -F'"critic/score/mean":' '{ split($2, a, /[,}]/); print NR "\t" a[1] }' "$M" > "$RUN/reward.tsv"
echo ""
echo "                 held-out ($TEST_N problems, greedy episodes)"
echo "                 success   tool calls"
echo "  after SFT      $ok0     $tool0"
echo "  after GRPO     $ok1     $tool1   ($(wc -l < "$M") steps, $((t1 - t0)) s)"
printf '{"seed":%s,"success_sft":%s,"tools_sft":%s,"success_rl":%s,"tools_rl":%s,"rl_steps":%s,"rl_seconds":%s}\n' \
    "$SEED" "$ok0" "$tool0" "$ok1" "$tool1" "$(wc -l < "$M")" "$((t1 - t0))" > "$RUN/summary.json"

if [ "$PLOT" = 1 ] && command -v gnuplot >/dev/null 2>&1; then
	gnuplot <<EOF 2>"$L/gnuplot.log" || echo "agent demo: gnuplot failed; see $L/gnuplot.log" >&2
set terminal pngcairo size 900,540 noenhanced
set output '$RUN/success.png'
set title 'rlpipe agent demo: GRPO on calculator episodes (seed $SEED)'
set xlabel 'GRPO step'
set ylabel 'success'
set yrange [0:1]
set key left top
set grid
plot '$RUN/reward.tsv' using 1:2 with points pt 7 ps 0.4 lc rgb '#9bbbe0' title 'episode reward per step (sampled)', \
     '$RUN/reward.tsv' using 1:2 smooth bezier lw 2 lc rgb '#1f5fa8' title 'reward (smoothed)', \
     '$RUN/heldout.tsv' using 1:2 with linespoints lw 2 pt 5 lc rgb '#c0392b' title 'held-out success (greedy)', \
     '$RUN/heldout.tsv' using 1:3 with linespoints lw 2 pt 9 lc rgb '#27ae60' title 'held-out tool calls'
EOF
	[ -f "$RUN/success.png" ] && echo "agent demo: wrote $RUN/success.png"
fi

if [ "$GOAL" = 1 ]; then
	if awk -v a="$ok1" -v b="$ok0" -v g="$GOAL_GAIN" -v m="$GOAL_MIN" 'BEGIN { exit !(a >= b + g && a >= m) }'; then
		echo "agent demo: promise met: held-out success $ok0 -> $ok1"
	else
		echo "agent demo: promise NOT met: held-out success $ok0 -> $ok1 (wanted +$GOAL_GAIN and >= $GOAL_MIN)" >&2
		exit 1
	fi
fi
exit 0

#!/bin/sh
# pipelines/demo/compare.sh — the demo in both wirings, one after the other,
# with the same settings: steps/s side by side and both reward curves in one
# plot ($RUNS/compare.png).  Exits 1 when either run fails its promise.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
RUNS=${RUNS:-runs}
rc=0
WIRING=sync RUN=$RUNS/sync sh "$here/demo.sh" || rc=1
WIRING=async RUN=$RUNS/async sh "$here/demo.sh" || rc=1
echo
echo "wiring  held-out before  after   GRPO steps  seconds  steps/s  samples/s"
for w in sync async; do
	f=$RUNS/$w/summary.json
	[ -f "$f" ] || { echo "$w     (no summary: the run failed)"; continue; }
	awk -v w="$w" '{
		n = split($0, kv, /[{},]/)
		for (i = 1; i <= n; i++) { split(kv[i], p, ":"); gsub(/"/, "", p[1]); v[p[1]] = p[2] }
		printf "%-6s  %15s  %5s  %10s  %7s  %7s  %9s\n", w, v["acc_sft"], v["acc_rl"], v["rl_steps"],
			v["rl_seconds"], v["steps_per_s"], v["samples_per_s"] }' "$f"
done
if command -v gnuplot >/dev/null 2>&1 && [ -f "$RUNS/sync/reward.tsv" ] && [ -f "$RUNS/async/reward.tsv" ]; then
	gnuplot <<EOF && echo "compare: wrote $RUNS/compare.png"
set terminal pngcairo size 900,540 noenhanced
set output '$RUNS/compare.png'
set title 'rlpipe demo: reward per GRPO step, sync vs async wiring'
set xlabel 'GRPO step'
set ylabel 'reward (sampled accuracy)'
set yrange [0:1]
set key left top
set grid
plot '$RUNS/sync/reward.tsv' using 1:2 smooth bezier lw 2 title 'sync (pipes, staleness 0)', \
     '$RUNS/async/reward.tsv' using 1:2 smooth bezier lw 2 title 'async (rl-queue, staleness <= 1)', \
     '$RUNS/sync/heldout.tsv' using 1:2 with linespoints pt 5 title 'sync held-out (greedy)', \
     '$RUNS/async/heldout.tsv' using 1:2 with linespoints pt 7 title 'async held-out (greedy)'
EOF
fi
exit $rc

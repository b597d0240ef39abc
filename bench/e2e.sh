#!/bin/sh
# bench/e2e.sh — the whole loop, sync vs async, in the same run: samples/s and
# the share of the GRPO wall time each stage is busy (its CPU seconds over the
# wall seconds), with the same resources in both wirings: generation and
# scoring pinned to one core, training and the broker to another (taskset).
#
# Both runs use the demo (pipelines/demo/demo.sh) with the same seed, model,
# SFT warm start and GRPO settings; only the wiring differs.  Busy shares come
# from /proc/PID/stat (utime + stime) sampled every 0.2 s while the stages run.
# Prints one JSON line per wiring and one with the ratio.
#
# Usage: sh bench/e2e.sh [RL_STEPS] [GEN_CPU] [TRAIN_CPU]   (defaults 200 0 1)
# Environment: any demo.sh setting (PROMPTS, SAMPLES, STALENESS, WEIGHTS=file
# for the checkpoint directory instead of rl-sync, DEVICE, ...).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"; export PATH
steps=${1:-200}
gcpu=${2:-0}
tcpu=${3:-1}
out=$(mktemp -d /tmp/rl-e2e.XXXXXX)
trap 'rm -rf "$out"' EXIT
hz=$(getconf CLK_TCK)

# cpu seconds (utime + stime, fields 14 and 15 of /proc/PID/stat) of the
# stages listed in run directory $1's pids file, sampled every 0.2 s until
# demo.sh (pid $2) exits; prints "pid name ticks" lines
sample() {
	while kill -0 "$2" 2>/dev/null; do
		if [ -s "$1/pids" ]; then
			while read -r name p; do
				t=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null) && echo "$p $name $t"
			done < "$1/pids"
		fi
		sleep 0.2
	done
}

for w in sync async; do
	run=$out/$w
	env WIRING=$w RUN="$run" RL_STEPS="$steps" GEN_CPUS="$gcpu" TRAIN_CPUS="$tcpu" \
		SFT_STEPS="${SFT_STEPS:-500}" EVAL_EVERY=1000000 GOAL=0 PLOT=0 QUIET=1 \
		sh "$root/pipelines/demo/demo.sh" > "$out/$w.out" 2>&1 &
	pid=$!
	sample "$run" "$pid" > "$out/$w.cpu"
	wait "$pid" || { echo "e2e: the $w run failed:" >&2; tail -n 20 "$out/$w.out" >&2; exit 1; }
	# the last sample of each pid is its total (less at most 0.2 s)
	awk -v hz="$hz" -v w="$w" -v f="$run/summary.json" '
		{ last[$1] = $3; name[$1] = $2 }
		END {
			while ((getline line < f) > 0) s = line
			n = split(s, kv, /[{},]/)
			for (i = 1; i <= n; i++) { split(kv[i], p, ":"); gsub(/"/, "", p[1]); v[p[1]] = p[2] }
			for (q in last) if (last[q] / hz > best[name[q]]) best[name[q]] = last[q] / hz
			wall = v["rl_seconds"]
			printf "{\"bench\":\"e2e\",\"wiring\":\"%s\",\"rl_steps\":%s,\"rl_seconds\":%s,\"samples_per_s\":%s,", w, v["rl_steps"], wall, v["samples_per_s"]
			printf "\"acc_sft\":%s,\"acc_rl\":%s,", v["acc_sft"], v["acc_rl"]
			printf "\"busy_gen\":%.3f,\"busy_reward\":%.3f,\"busy_train\":%.3f,\"busy_queue\":%.3f,\"busy_sync\":%.3f}\n",
				best["rl-rollout"] / wall, best["rl-reward"] / wall, best["rl-train"] / wall, best["rl-queue"] / wall, best["rl-sync"] / wall
		}' "$out/$w.cpu" | tee "$out/$w.json"
done
awk -F'"samples_per_s":' 'FNR == 1 { split($2, a, ","); r[NR] = a[1] } END {
	printf "{\"bench\":\"e2e\",\"async_over_sync\":%.3f}\n", r[2] / r[1] }' "$out/sync.json" "$out/async.json"

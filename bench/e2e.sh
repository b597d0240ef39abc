#!/bin/sh
# bench/e2e.sh — the whole loop, sync vs async, in the same invocation:
# samples/s, the share of the GRPO wall time each stage is busy, and where the
# time goes, with the same resources in both wirings: generation and scoring
# pinned to one core, training to another (taskset); the async wiring's
# daemons (rl-queue, rl-sync) on DAEMON_CPUS (default: the generation core).
#
# Workload (same for both wirings; docs/demo.md): the demo's 0.15M-parameter
# byte-level model, warm-started once by SFT and shared by every run, then
# RL_STEPS GRPO steps of PROMPTS x SAMPLES.  TASK=arith-cot (default): 2-digit
# addition answered with a worked column sum (~22 response tokens, gsm8k
# verifier), where generation is a large share of the step as in RL
# post-training; TASK=arith: the demo's 3-token answers.
#
# What it measures, per invocation:
#   1. g and t in isolation: generation + scoring of the run's prompts alone on
#      the generation core (rl-rollout | rl-reward from a file, no weight
#      waits), and rl-train alone on the scored records on the training core
#      (its per-step update_actor median; its checkpoint write separately).
#      Sync ideally takes g + t per step, perfect overlap max(g, t): the bound
#      on async/sync is (g + t) / max(g, t).
#   2. REPS interleaved pairs of runs (sync, async) from the same warm start:
#      one JSON line each with samples/s (over rl_seconds: from the workers'
#      start to the trainer's last step, the same span in both wirings;
#      rl_wall_seconds adds the async daemons' start-up and every process's
#      shutdown), busy shares (utime + stime from /proc every 0.2 s over
#      rl_wall_seconds), the trainer's per-step
#      medians (waiting for data, update, publish), the generator's time split
#      (rl-rollout -v), the broker's counters (stale groups regenerated), the
#      mean sampled reward of the last 20 steps and the held-out greedy
#      accuracy after the run (equal samples: both wirings train the same
#      RL_STEPS x PROMPTS x SAMPLES).
#   3. A summary line: medians over the reps, their ratio, the bound, and the
#      load average before and after (the machine may be shared).
#
# Usage: sh bench/e2e.sh [RL_STEPS] [GEN_CPU] [TRAIN_CPU]   (defaults 100 0 1)
# Environment: TASK, REPS (3), SFT_STEPS (400 for arith-cot, 500 for arith),
# SKIP_ZERO_ADV (1: rl-train --skip-zero-adv in the isolated trainer and in
# both wirings, the same update with less work, docs/train.md; 0: off; empty:
# neither option, for an rl-train that has none, e.g. RL_BUILD of an older tree),
# RL_LR (2e-4 for both tasks, in the isolated trainer and the runs), MICRO
# (the trainer's --max-tokens-per-micro, demo.sh's default 256 on the CPU,
# also in the isolated trainer),
# DAEMON_CPUS, WEIGHTS=file (async weights through the checkpoint directory
# instead of rl-sync), KEEP=1 (keep the run directories, printed), and any
# demo.sh setting (PROMPTS, SAMPLES, STALENESS, ...).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
B=${RL_BUILD:-build}
PATH="$root/$B/bin:$PATH"; export PATH
steps=${1:-100}
gcpu=${2:-0}
tcpu=${3:-1}
TASK=${TASK:-arith-cot}
REPS=${REPS:-3}
PROMPTS=${PROMPTS:-32}
SAMPLES=${SAMPLES:-8}
DAEMON_CPUS=${DAEMON_CPUS:-$gcpu}
if [ "$TASK" = arith-cot ]; then SFT_STEPS=${SFT_STEPS:-400}; else SFT_STEPS=${SFT_STEPS:-500}; fi
SKIP_ZERO_ADV=${SKIP_ZERO_ADV-1}
case $SKIP_ZERO_ADV in 1) SKIPZ=--skip-zero-adv ;; "") SKIPZ="" ;; *) SKIPZ=--no-skip-zero-adv ;; esac
MICRO=${MICRO:-256}
RL_LR=${RL_LR:-2e-4}
export TASK PROMPTS SAMPLES DAEMON_CPUS SFT_STEPS SKIP_ZERO_ADV MICRO RL_LR
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_NUM_THREADS OMP_WAIT_POLICY
out=$(mktemp -d /tmp/rl-e2e.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then echo "e2e: run directories in $out" >&2; else trap 'rm -rf "$out"' EXIT; fi
hz=$(getconf CLK_TCK)
load0=$(cut -d' ' -f1 /proc/loadavg)

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# column KEY < metrics.jsonl: that number of every line
column() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"; }

# ---- the warm start, shared by every run -------------------------------------------
env WIRING=sync RUN="$out/warm" RL_STEPS=1 EVAL_EVERY=1000000 GOAL=0 PLOT=0 QUIET=1 \
	sh "$root/pipelines/demo/demo.sh" > "$out/warm.out" 2>&1 ||
	{ echo "e2e: the warm start failed:" >&2; tail -n 20 "$out/warm.out" >&2; exit 1; }
WARM=$out/warm/sft/$(readlink "$out/warm/sft/latest")
# the demo's settings for the task (pipelines/demo/demo.sh)
if [ "$TASK" = arith-cot ]; then MAXT=24 RTASK=gsm8k; else MAXT=6 RTASK=arith; fi

# ---- 1. g and t in isolation ----------------------------------------------------------
iso=$out/iso
mkdir -p "$iso"
nl=$((steps * PROMPTS))
[ $nl -le 3200 ] || nl=3200
rl-reward gen-arith --n "$nl" --seed 1001 --split train -o "$iso/prompts.jsonl"
isteps=$((nl / PROMPTS))
t0=$(date +%s.%N)
taskset -c "$gcpu" rl-rollout -q -m "$WARM" --seed 1 -n "$SAMPLES" --temperature 0.7 --max-tokens "$MAXT" \
	"$iso/prompts.jsonl" | taskset -c "$gcpu" rl-reward -q --task "$RTASK" -o "$iso/scored.bin"
t1=$(date +%s.%N)
taskset -c "$tcpu" rl-train -q -m "$WARM" --out "$iso/ck" --algo grpo --seed 1 --batch "$PROMPTS" --lr "$RL_LR" \
	--keep 3 $SKIPZ --max-tokens-per-micro "$MICRO" --metrics "$iso/m.jsonl" "$iso/scored.bin"
g=$(awk -v a="$t0" -v b="$t1" -v n="$isteps" 'BEGIN { printf "%.4f", (b - a) / n }')
t=$(column 'timing_s\/update_actor' < "$iso/m.jsonl" | median)
tc=$(column 'timing_s\/publish' < "$iso/m.jsonl" | median)
resp=$(column 'response_length\/mean' < "$iso/m.jsonl" | median)
# the share of the response tokens rl-train skipped (all-zero advantages), mean over the steps
mean() { awk '{ s += $1; n++ } END { if (n) printf "%.4f", s / n; else print "null" }'; }
iskip=$(column 'actor\/skipped_token_frac' < "$iso/m.jsonl" | mean)
bound=$(awk -v g="$g" -v t="$t" 'BEGIN { m = g > t ? g : t; printf "%.3f", (g + t) / m }')
printf '{"bench":"e2e","task":"%s","isolated":true,"steps":%d,"gen_s_per_step":%s,"train_s_per_step":%.4f,"ckpt_s_per_step":%.4f,"g_over_t":%.3f,"response_tokens":%.1f,"skipped_token_frac":%s,"bound_async_over_sync":%s}\n' \
	"$TASK" "$isteps" "$g" "$t" "$tc" "$(awk -v g="$g" -v t="$t" 'BEGIN { print g / t }')" "$resp" "$iskip" "$bound"

# ---- 2. the runs ---------------------------------------------------------------------------
# cpu seconds (utime + stime, fields 14 and 15 of /proc/PID/stat) of the
# stages listed in run directory $1's pids file, sampled every 0.2 s until
# demo.sh (pid $2) exits; prints "pid name ticks" lines
sample() {
	while kill -0 "$2" 2>/dev/null; do
		if [ -s "$1/pids" ]; then
			while read -r name p; do
				x=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null) && echo "$p $name $x"
			done < "$1/pids"
		fi
		sleep 0.2
	done
}

: > "$out/runs.json"
r=1
while [ $r -le "$REPS" ]; do
	for w in sync async; do
		run=$out/$w-$r
		env WIRING=$w RUN="$run" RL_STEPS="$steps" GEN_CPUS="$gcpu" TRAIN_CPUS="$tcpu" WARM="$WARM" \
			EVAL_EVERY=1000000 GOAL=0 PLOT=0 QUIET=1 \
			sh "$root/pipelines/demo/demo.sh" > "$run.out" 2>&1 &
		pid=$!
		sample "$run" "$pid" > "$run.cpu"
		wait "$pid" || { echo "e2e: the $w run failed:" >&2; tail -n 20 "$run.out" >&2; exit 1; }
		M=$run/metrics.jsonl
		wait_ms=$(column 'timing_s\/gen' < "$M" | median)
		upd_ms=$(column 'timing_s\/update_actor' < "$M" | median)
		pub_ms=$(column 'timing_s\/publish' < "$M" | median)
		step_ms=$(column 'timing_s\/step' < "$M" | median)
		rew=$(column 'critic\/score\/mean' < "$M" | tail -n 20 | awk '{ s += $1 } END { printf "%.3f", s / NR }')
		skf=$(column 'actor\/skipped_token_frac' < "$M" | mean)
		# rl-rollout -v: "time: decoding X s, new weights Y s (N loaded), waiting for weights Z s, leases L s, puts P s, ..."
		split=$(sed -n 's/.*time: decoding \([0-9.]*\) s, new weights \([0-9.]*\) s ([0-9]* loaded), waiting for weights \([0-9.]*\) s, leases \([0-9.]*\) s, puts \([0-9.]*\) s, output \([0-9.]*\) s.*/\1 \2 \3 \4 \5 \6/p' "$run/logs/rollout.log")
		regen=0
		[ ! -f "$run/queue-stat.json" ] || regen=$(tr -d ' \n' < "$run/queue-stat.json" | sed -n 's/.*"stale_regenerated":\([0-9]*\).*/\1/p')
		awk -v hz="$hz" -v w="$w" -v r="$r" -v f="$run/summary.json" -v task="$TASK" -v times="$split" \
		    -v wait_s="$wait_ms" -v upd="$upd_ms" -v pub="$pub_ms" -v stp="$step_ms" -v rew="$rew" -v skf="$skf" -v regen="${regen:-0}" '
			{ last[$1] = $3; name[$1] = $2 }
			END {
				while ((getline line < f) > 0) s = line
				n = split(s, kv, /[{},]/)
				for (i = 1; i <= n; i++) { split(kv[i], p, ":"); gsub(/"/, "", p[1]); v[p[1]] = p[2] }
				for (q in last) if (last[q] / hz > best[name[q]]) best[name[q]] = last[q] / hz
				# busy shares over all of the GRPO wall time (start-up included, as in the CPU time)
				wall = v["rl_wall_seconds"] != "" ? v["rl_wall_seconds"] : v["rl_seconds"]
				if (split(times, x, " ") < 6) for (i = 1; i <= 6; i++) x[i] = "null"
				printf "{\"bench\":\"e2e\",\"task\":\"%s\",\"wiring\":\"%s\",\"rep\":%d,\"rl_steps\":%s,\"rl_seconds\":%s,\"rl_wall_seconds\":%s,\"samples_per_s\":%s,", task, w, r, v["rl_steps"], v["rl_seconds"], wall, v["samples_per_s"]
				printf "\"acc_warm\":%s,\"acc_rl\":%s,\"reward_last20\":%s,\"skipped_token_frac\":%s,", v["acc_sft"], v["acc_rl"], rew, skf
				printf "\"busy_gen\":%.3f,\"busy_reward\":%.3f,\"busy_train\":%.3f,\"busy_queue\":%.3f,\"busy_sync\":%.3f,",
					best["rl-rollout"] / wall, best["rl-reward"] / wall, best["rl-train"] / wall, best["rl-queue"] / wall, best["rl-sync"] / wall
				printf "\"train_step_ms\":%.1f,\"train_wait_ms\":%.1f,\"train_update_ms\":%.1f,\"train_publish_ms\":%.1f,",
					1000 * stp, 1000 * wait_s, 1000 * upd, 1000 * pub
				printf "\"gen_decode_s\":%s,\"gen_weights_s\":%s,\"gen_wait_weights_s\":%s,\"gen_lease_s\":%s,\"gen_put_s\":%s,\"gen_output_s\":%s,\"stale_regenerated\":%s}\n",
					x[1], x[2], x[3], x[4], x[5], x[6], regen
			}' "$run.cpu" | tee -a "$out/runs.json"
	done
	r=$((r + 1))
done

# ---- 3. summary ----------------------------------------------------------------------------
# medians over the reps of key KEY for wiring W
med() { grep "\"wiring\":\"$1\"" "$out/runs.json" | sed -n "s/.*\"$2\":\([-0-9.][-0-9.eE+]*\).*/\1/p" | median; }
s=$(med sync samples_per_s)
a=$(med async samples_per_s)
# in-run balance, from the sync runs' trainer: it waits W for generation and
# scoring (and the weight load), updates for U and publishes for P; perfect
# overlap would take max(W, U + P) per step
W=$(med sync train_wait_ms) U=$(med sync train_update_ms) P=$(med sync train_publish_ms)
# each rep's async/sync (the two runs of a rep ran back to back, so they saw
# about the same load): their median
pairs=$(awk -F'"samples_per_s":' '{ split($2, a, ","); if ($0 ~ /"wiring":"sync"/) s = a[1]; else printf "%.3f\n", a[1] / s }' "$out/runs.json")
pm=$(echo "$pairs" | median)
printf '{"bench":"e2e","task":"%s","reps":%d,"async_over_sync_per_rep":[%s],"async_over_sync_per_rep_median":%s,"sync_samples_per_s":%s,"async_samples_per_s":%s,"async_over_sync":%.3f,"sync_step_ms":%s,"async_step_ms":%s,"step_ratio":%.3f,"sync_wait_ms":%s,"sync_update_ms":%s,"sync_publish_ms":%s,"bound_in_run":%.3f,"bound_isolated":%s,"acc_warm":%s,"acc_rl_sync":%s,"acc_rl_async":%s,"reward_last20_sync":%s,"reward_last20_async":%s,"skipped_token_frac_sync":%s,"skipped_token_frac_async":%s,"load_before":%s,"load_after":%s}\n' \
	"$TASK" "$REPS" "$(echo $pairs | tr ' ' ',')" "$pm" "$s" "$a" "$(awk -v a="$a" -v s="$s" 'BEGIN { print a / s }')" \
	"$(med sync train_step_ms)" "$(med async train_step_ms)" \
	"$(awk -v a="$(med async train_step_ms)" -v s="$(med sync train_step_ms)" 'BEGIN { print s / a }')" \
	"$W" "$U" "$P" "$(awk -v w="$W" -v u="$U" -v p="$P" 'BEGIN { m = w > u + p ? w : u + p; print (w + u + p) / m }')" \
	"$bound" "$(med sync acc_warm)" "$(med sync acc_rl)" "$(med async acc_rl)" \
	"$(med sync reward_last20)" "$(med async reward_last20)" "$(med sync skipped_token_frac)" "$(med async skipped_token_frac)" "$load0" "$(cut -d' ' -f1 /proc/loadavg)"

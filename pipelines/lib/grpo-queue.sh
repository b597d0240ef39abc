#!/bin/sh
# pipelines/lib/grpo-queue.sh — one run of a recipe (pipelines/gsm8k,
# pipelines/countdown: GRPO; pipelines/online-dpo: DPO on pairs formed from
# scored groups) in the queue wiring, resumable and safe from cron.
#
#   - one run at a time per OUT: flock on OUT/.lock; a second start while one
#     runs says so and exits 0 (cron);
#   - idempotent: a run whose checkpoint has reached STEPS does nothing;
#   - resumable: the broker journals to OUT/queue (--data-dir), so a restarted
#     run replays what was put, generated and scored; rl-train (its default
#     --resume auto) goes on from the newest full checkpoint (optimizer
#     included; one every 10 minutes by default, or SAVE_EVERY steps), and
#     acknowledges groups to the broker only once a full checkpoint holds
#     them, so every group is trained exactly once (docs/queue.md);
#     prompts are put once (ids are the line numbers, so a second put of the
#     same file is dropped by the broker as duplicates anyway);
#   - logs under OUT/logs/<start time>/, metrics appended to OUT/metrics.jsonl;
#   - every process it starts is stopped by pid on exit, newest first; none
#     inherits the lock, and their pids are kept in OUT/pids, so a driver
#     killed with -9 blocks nothing: the next run stops what it left;
#   - STEPS x BATCH must not exceed the prompts (else an error at once), and
#     rl-train gives up after IDLE_EXIT seconds (1800) without records;
#   - a broker that dies mid-run ends the run within about 300 s: the stages
#     stop by themselves after that long without a reply (--broker-timeout,
#     docs/queue.md; rl-train after a last full checkpoint), and the next run
#     resumes; so do workers that a driver killed with -9 left behind;
#   - a run killed between full checkpoints restarts from the last full one
#     (the newer step directories are removed before anything starts; when
#     the resumed trainer sets the broker's version back to its checkpoint's,
#     so the samples generated meanwhile are not stale).
#
# Environment (the recipe Makefiles set these): MODEL (Hugging Face directory),
# PROMPTS (JSONL prompt lines), OUT, TASK (rl-reward --task spec) or REWARD
# (rl-reward's scoring options, shell-quoted: --exec 'CMD', --judge URL ...),
# ALGO (rl-train --algo, default grpo), STEPS,
# BATCH (prompts per step), SAMPLES, LR, TEMP, MAX_TOKENS, DEVICE,
# GEN_DEVICE, STALENESS, SAVE_EVERY (unset: rl-train's default, a full
# checkpoint every 10 minutes), SAVE_MINUTES, CHAT (1: chat template), EXTRA_TRAIN,
# EXTRA_GEN.  Calls only rl-* programs, sh, awk and flock.
set -eu
: "${MODEL:?set MODEL to a Hugging Face model directory}"
: "${PROMPTS:?set PROMPTS to a JSONL file of prompt lines}"
: "${OUT:?set OUT to the run directory}"
TASK=${TASK:-}
REWARD=${REWARD:-}
[ -n "$TASK$REWARD" ] || { echo "recipe: set TASK to an rl-reward task, or REWARD to rl-reward's scoring options" >&2; exit 2; }
[ -n "$REWARD" ] || REWARD="--task $TASK"
ALGO=${ALGO:-grpo}
STEPS=${STEPS:-200}
BATCH=${BATCH:-32}
SAMPLES=${SAMPLES:-8}
LR=${LR:-1e-6}
TEMP=${TEMP:-1}
MAX_TOKENS=${MAX_TOKENS:-512}
DEVICE=${DEVICE:-cuda}
GEN_DEVICE=${GEN_DEVICE:-$DEVICE}
STALENESS=${STALENESS:-1}
SAVE_EVERY=${SAVE_EVERY:-}
SAVE_MINUTES=${SAVE_MINUTES:-}
CHAT=${CHAT:-1}
EXTRA_TRAIN=${EXTRA_TRAIN:-}
EXTRA_GEN=${EXTRA_GEN:-}

[ -d "$MODEL" ] || { echo "recipe: MODEL '$MODEL' is not a directory" >&2; exit 2; }
[ -f "$PROMPTS" ] || { echo "recipe: PROMPTS '$PROMPTS' not found" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

exec 9>"$OUT/.lock"
if ! flock -n 9; then
	echo "recipe: another run holds $OUT/.lock; nothing to do"
	exit 0
fi

# a run killed with -9 (its traps never ran) may have left its workers: they
# are stopped here, by the pids it wrote, if their command line still names
# this run (OUT, or its broker's URL), so that a recycled pid is left alone
if [ -f "$OUT/pids" ]; then
	old_url=$(cat "$OUT/queue.url" 2>/dev/null || echo none)
	left=""
	# newest first, each given 5 s: the trainer and the workers hand their
	# leases back while the broker still runs (killed first, it would keep them
	# leased, and the staleness gate closed, until the leases expire)
	r=""
	for p in $(cat "$OUT/pids"); do r="$p $r"; done
	for p in $r; do
		c=$(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline") || continue   # gone (quietly: dash names the file)
		case $c in *"$OUT"* | *"$old_url"*) ;; *) continue ;; esac
		kill "$p" 2>/dev/null || continue
		left="$left $p"
		j=0
		while [ $j -lt 50 ] && kill -0 "$p" 2>/dev/null; do sleep 0.1; j=$((j + 1)); done
		kill -9 "$p" 2>/dev/null || true
	done
	[ -z "$left" ] || echo "recipe: stopped processes left by an earlier run:$left"
	rm -f "$OUT/pids"
fi

# every step takes BATCH prompts (as groups of SAMPLES): with fewer prompts the
# run would wait for ever at the step where they ran out
nprompts=$(awk 'NF { n++ } END { print n + 0 }' "$PROMPTS")
if [ "$nprompts" -lt $((STEPS * BATCH)) ]; then
	echo "recipe: STEPS $STEPS x BATCH $BATCH needs $((STEPS * BATCH)) prompts; $PROMPTS has $nprompts" >&2
	echo "recipe: hint: lower STEPS or BATCH, or repeat the data in PROMPTS" >&2
	exit 2
fi
IDLE_EXIT=${IDLE_EXIT:-1800}

CK=$OUT/ckpt
# a run killed between full checkpoints leaves newer step directories
# without optimizer state: rl-train goes on from the
# newest full one and drops those, so they go now, before the generator could
# load one of them as a version outside the trained lineage
stepnum() { echo "$1" | sed 's/^.*step-0*//; s/^$/0/'; }
if [ -d "$CK" ]; then
	full=0
	for d in "$CK"/step-*; do
		[ -f "$d/optimizer.safetensors" ] || continue
		n=$(stepnum "$d"); [ "$n" -gt "$full" ] && full=$n
	done
	for d in "$CK"/step-*; do
		[ -e "$d" ] || continue
		if [ "$(stepnum "$d")" -gt "$full" ]; then
			echo "recipe: removing $d: newer than the last full checkpoint (step $full)"
			rm -rf "$d"
		fi
	done
	if [ "$full" -gt 0 ]; then
		ln -sfn "$(printf 'step-%08d' "$full")" "$CK/latest"
	elif [ -L "$CK/latest" ]; then
		# nothing to resume from: the run starts over, and so does the broker
		# (its journal holds the old run's versions and consumed prompts)
		echo "recipe: no full checkpoint to resume from: starting over"
		rm -f "$CK/latest"
		rm -rf "$OUT/queue" "$OUT/.prompts-put"
	fi
fi
done_steps=0
[ -L "$CK/latest" ] && done_steps=$(readlink "$CK/latest" | sed 's/^step-0*//; s/^$/0/')
if [ "$done_steps" -ge "$STEPS" ]; then
	echo "recipe: $OUT is at step $done_steps of $STEPS; nothing to do"
	exit 0
fi

L=$OUT/logs/$(date -u +%Y%m%dT%H%M%SZ)-$$
mkdir -p "$L"
PIDS=""
cleanup() {
	r=""
	for p in $PIDS; do r="$p $r"; done
	for p in $r; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	PIDS=""
}
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# the broker, on a free loopback port; its journal makes the run resumable
start_broker() {
i=0; URL=""
while [ $i -lt 20 ]; do
	port=$(awk -v s="$$$i" 'BEGIN { srand(s); printf "%d", 20000 + int(rand() * 40000) }')
	rl-queue serve --listen "tcp://127.0.0.1:$port" --data-dir "$OUT/queue" \
		--max-staleness "$STALENESS" --train-batch $((BATCH * SAMPLES)) --stale regen \
		2>>"$L/queue.log" 9>&- &
	Q=$!
	j=0
	while [ $j -lt 100 ] && kill -0 "$Q" 2>/dev/null; do
		if rl-queue stat "tcp://127.0.0.1:$port" >/dev/null 2>&1; then URL=tcp://127.0.0.1:$port; break; fi
		sleep 0.1; j=$((j + 1))
	done
	[ -n "$URL" ] && break
	kill "$Q" 2>/dev/null || true; wait "$Q" 2>/dev/null || true
	i=$((i + 1))
done
[ -n "$URL" ] || { echo "recipe: could not start rl-queue serve (see $L/queue.log)" >&2; exit 1; }
}
start_broker
PIDS="$PIDS $Q"
echo "$URL" > "$OUT/queue.url"
echo "$Q" >> "$OUT/pids"

if [ ! -f "$OUT/.prompts-put" ]; then
	awk '{ sub(/^\{/, "{\"id\":" NR ","); print }' "$PROMPTS" > "$OUT/prompts-ids.jsonl"
	rl-queue put -q "$URL" "$OUT/prompts-ids.jsonl" 2>>"$L/put.log"
	: > "$OUT/.prompts-put"
fi

chat=""
[ "$CHAT" = 1 ] && chat=--chat
# the generator starts from the newest weights there are
gen_model=$MODEL
[ -L "$CK/latest" ] && gen_model=$CK/$(readlink "$CK/latest")

rl-rollout -m "$gen_model" --queue "$URL" --weights-from "$CK" --device "$GEN_DEVICE" \
	-n "$SAMPLES" --temperature "$TEMP" --max-tokens "$MAX_TOKENS" $chat $EXTRA_GEN 2>>"$L/rollout.log" 9>&- &
PIDS="$PIDS $!"; GEN=$!
# REWARD is shell-quoted options (a --exec command keeps its quotes)
eval "set -- $REWARD"
rl-reward --queue "$URL" "$@" 2>>"$L/reward.log" 9>&- &
PIDS="$PIDS $!"; REW=$!
echo "$GEN $REW" >> "$OUT/pids"
echo "recipe: $(date -u +%FT%TZ) run in $OUT from step $done_steps to $STEPS; logs in $L"
rc=0
rl-train -m "$MODEL" --out "$CK" --queue "$URL" --algo "$ALGO" --device "$DEVICE" \
	--batch "$BATCH" --lr "$LR" --max-steps "$STEPS" ${SAVE_EVERY:+--save-every "$SAVE_EVERY"} \
	${SAVE_MINUTES:+--save-minutes "$SAVE_MINUTES"} --idle-exit "$IDLE_EXIT" \
	--metrics "$L/metrics.jsonl" $EXTRA_TRAIN 2>>"$L/train.log" 9>&- &
TRN=$!
PIDS="$PIDS $TRN"
echo "$TRN" >> "$OUT/pids"
wait "$TRN" || rc=$?
cat "$L/metrics.jsonl" >> "$OUT/metrics.jsonl" 2>/dev/null || true
at=0
[ -L "$CK/latest" ] && at=$(readlink "$CK/latest" | sed 's/^step-0*//; s/^$/0/')
if [ $rc = 0 ] && [ "$at" -lt "$STEPS" ]; then
	echo "recipe: rl-train stopped at step $at of $STEPS after $IDLE_EXIT s without records" \
		"(groups dropped, or a stage stuck; see $L)" >&2
	rc=1
fi
for p in $GEN $REW; do kill -0 "$p" 2>/dev/null || { echo "recipe: a worker exited early; see $L" >&2; rc=1; }; done
[ $rc = 0 ] || { echo "recipe: rl-train failed (exit $rc); see $L/train.log" >&2; exit 1; }
cleanup
rm -f "$OUT/pids"
echo "recipe: $(date -u +%FT%TZ) done: $CK/$(readlink "$CK/latest")"

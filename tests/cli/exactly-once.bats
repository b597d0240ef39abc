#!/usr/bin/env bats
# Exactly once in the queue wiring (docs/queue.md): rl-train acknowledges a
# group only when a full checkpoint covers it.  kill -9 of the trainer (and
# of the broker, restarted on its --data-dir) at a seeded random step, then
# the same command lines again: every group trained exactly once.
#
# The count is read off the last checkpoint: grpo drops no group, so the
# groups trained over the surviving steps number global_step x --batch; with
# groups_done holding all N groups put and global_step x batch = N, no group
# was trained twice and none was lost.  The broker agrees: every record done.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	# 30 scored groups of 2 (ids g*10+1, g*10+2), rewards 0 and 1
	for g in $(seq 1 30); do
		for i in 0 1; do
			printf '{"id":%d,"group":%d,"index":%d,"group_size":2,"version":[0,0],"prompt":[1,2],"response":[3,4,5],"reward":%d}\n' \
			    $((g * 10 + i + 1)) "$g" "$i" "$i"
		done
	done > "$TD/scored.jsonl"
}

setup() {
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# broker DIR: rl-queue serve on its journal (leases of 1 s, so a killed
# trainer's come back soon), no staleness gate to hide a count; with
# STALE=1 the default --stale drop under a real bound (K 2, batch 2)
broker() {
	local k=(-k 1000)
	[ "${STALE:-0}" = 1 ] && k=(-k 2 -b 2)
	rl-queue serve ${RLQ_V:--q} -l "$URL" --data-dir "$1" "${k[@]}" -t "${LEASE:-1}" 3>&- 2>>"$1.log" &
	QPID=$!
	PIDS="$PIDS $QPID"
	for i in $(seq 100); do rl-queue stat --timeout 0.2 "$URL" >/dev/null 2>&1 && return 0; sleep 0.05; done
	return 1
}

# feed: the scored groups, one every 0.1 s, each put until the broker (maybe
# restarted) takes it (a put again is dropped as duplicates); then a mark.
# With STALE=1 each group carries the broker's version when it is put, and
# group g (trained in step ceil(g/2)) waits for version ceil(g/2) - 1 - K,
# as rl-rollout under the broker's gate would
feed() {
	local v
	rm -f "$TD/fed"
	for g in $(seq 1 30); do
		sed -n "$((2 * g - 1)),$((2 * g))p" "$TD/scored.jsonl" > "$TD/one.jsonl"
		if [ "${STALE:-0}" = 1 ]; then
			until v=$(rl-queue stat --json "$URL" 2>/dev/null | jq -e .version) &&
			    [ "$v" -ge $(((g + 1) / 2 - 3)) ]; do sleep 0.05; done
			sed -i "s/\"version\":\[0,0\]/\"version\":[$v,$v]/" "$TD/one.jsonl"
		fi
		until rl-queue put -q -s scored "$URL" "$TD/one.jsonl" 2>/dev/null; do sleep 0.1; done
		sleep 0.1
	done
	touch "$TD/fed"
}

wait_fed() {
	for i in $(seq 600); do [ -e "$TD/fed" ] && return 0; sleep 0.1; done
	return 1
}

trainer() {
	exec rl-train -m "$TD/m0" --out "$1" --queue "$URL" --batch 2 --save-every 4 --lr 1e-2 --idle-exit 3 \
	    --metrics "$1.m" ${MAXSTEPS:+--max-steps $MAXSTEPS} 3>&-
}

# kill_at O BROKER_TOO: kill -9 the trainer (and the broker) at a seeded step
kill_at() {
	local seed=${RL_TEST_SEED:-$RANDOM} O=$1 k
	k=$((5 + seed % 7))
	echo "seed $seed: kill -9 at step $k" >&3
	(trainer "$O") 2> "$O.err1" &
	T=$!
	PIDS="$PIDS $T"
	# the metrics file has a line per step trained (step directories are pruned by --keep)
	for i in $(seq 3000); do [ "$(cat "$O.m" 2>/dev/null | wc -l)" -ge "$k" ] && break; sleep 0.02; done
	[ "$(cat "$O.m" 2>/dev/null | wc -l)" -ge "$k" ] || { echo "seed $seed: step $k never came" >&3; cat "$O.err1" >&3
		ls "$O" >&3; rl-queue stat "$URL" >&3; return 1; }
	# mid-run: the records come one group every 0.1 s (feed), so it is still waiting for more
	kill -0 "$T" || { echo "seed $seed: the trainer ended before the kill" >&3; return 1; }
	kill -KILL "$T"
	if [ "$2" = 1 ]; then kill -KILL "$QPID"; wait "$QPID" 2>/dev/null || true; broker "$O.q" || return 1; fi
	wait "$T" 2>/dev/null || true
	echo "seed $seed" > "$O.seed"
}

check_once() {
	PYTHONPATH="$BATS_TEST_DIRNAME" python3 - "$1/latest/trainer_state.json" <<'PY'
import json, sys
from trainstate import groups_done
s, done = groups_done(sys.argv[1])
assert done == set(range(1, 31)), sorted(done)
assert s["global_step"] * 2 == 30, s["global_step"]
PY
	[ $? -eq 0 ] || return 1   # (called after ||: no errexit in here)
	rl-queue stat --json "$URL" > "$1.stat" || return 1
	python3 - "$1.stat" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
t = s["total"]
assert t["done"] == 60 and t["put_scored"] == 60, t
assert t["stale_dropped"] == 0 and s["depth"]["scored"] == 0 and s["depth"]["training"] == 0, s
PY
}

run_case() {
	local O="$TD/$1"
	URL="tcp://127.0.0.1:$(free_port)"
	broker "$O.q" || return 1
	feed &
	PIDS="$PIDS $!"
	kill_at "$O" "$2" || return 1
	# a gated feed (STALE=1) waits for the trainer's versions: it goes on meanwhile
	[ "${STALE:-0}" = 1 ] || wait_fed || return 1
	run --separate-stderr bash -c "$(declare -f trainer); URL=$URL TD=$TD trainer $O"
	wait_fed || return 1
	[ "$status" -eq 0 ] || { echo "status $status: $stderr" >&3; cat "$O.seed" >&3; return 1; }
	[[ "$stderr" == *"'$O' holds a run: resuming it from step"* ]] || { echo "$stderr" >&3; cat "$O.seed" >&3; return 1; }
	check_once "$O" || { cat "$O.seed" >&3; grep -v "leased\|acked\|put " "$O.q.log" >&3; grep -h "version" "$O.err1" >&3; return 1; }
}

@test "kill -9 of rl-train between full checkpoints, restarted with the same options: every group trained exactly once" {
	run_case t 0
}

@test "kill -9 of rl-train and of the broker, both restarted (the broker on its journal): every group trained exactly once" {
	run_case tb 1
}

@test "kill -9 of rl-train with the default --stale drop under a staleness bound: the groups it held are not dropped as stale; every group trained exactly once" {
	STALE=1 run_case td 0
}

@test "kill -9 of rl-train and of the broker with the default --stale drop under a staleness bound: every group trained exactly once" {
	STALE=1 run_case tdb 1
}

# die_case NAME AT: the trainer dies as by kill -9 at a set moment of a step
# whose full checkpoint is written (RL_TRAIN_TEST_DIE=AT, lib/train/train.c),
# then the same command line again
die_case() {
	local O="$TD/$1" rc=0
	URL="tcp://127.0.0.1:$(free_port)"
	broker "$O.q" || return 1
	feed &
	PIDS="$PIDS $!"
	RL_TRAIN_TEST_DIE=$2 bash -c "$(declare -f trainer); URL=$URL TD=$TD MAXSTEPS=${MAXSTEPS:-} trainer $O" \
	    2> "$O.err1" || rc=$?
	[ "$rc" -eq 137 ] || { echo "the trainer did not die at $2: status $rc" >&3; cat "$O.err1" >&3; return 1; }
	[ "${STALE:-0}" = 1 ] || wait_fed || return 1
	run --separate-stderr bash -c "$(declare -f trainer); URL=$URL TD=$TD MAXSTEPS=${MAXSTEPS:-} trainer $O"
	wait_fed || return 1
	[ "$status" -eq 0 ] || { echo "status $status: $stderr" >&3; return 1; }
	[[ "$stderr" == *"'$O' holds a run: resuming it from step"* ]] || { echo "$stderr" >&3; return 1; }
}

@test "rl-train dies after a full checkpoint, before the broker learnt its version (--stale drop, K 2): none of the checkpoint's groups is dropped as stale; every group trained exactly once" {
	STALE=1 die_case ds 8:saved
	check_once "$TD/ds" || { grep -v "leased\|acked\|put " "$TD/ds.q.log" >&3; return 1; }
}

@test "rl-train dies after its last full checkpoint, before acknowledging it, and is restarted at --max-steps: the broker counts the checkpoint's groups done" {
	MAXSTEPS=12 die_case dm 12:versioned
	python3 - "$TD/dm/latest/trainer_state.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
n = 0
for r in s["groups_done"]:
    lo, _, hi = r.partition("-")
    n += int(hi or lo) - int(lo) + 1
assert n == 24 and s["global_step"] == 12, s
PY
	rl-queue stat --json "$URL" > "$TD/dm.stat"
	python3 - "$TD/dm.stat" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
t, d = s["total"], s["depth"]
# 24 groups trained (48 samples), the 6 groups past --max-steps still scored
assert t["done"] == 48, "the broker counts %d samples done, not 48" % t["done"]
assert d["scored"] == 12 and d["training"] == 0 and t["stale_dropped"] == 0, s
PY
}

@test "rl-train killed before its first checkpoint and started again (a new run): the group its lease held is trained, not held until the lease times out (--stale drop, K 2)" {
	local O="$TD/nf"
	URL="tcp://127.0.0.1:$(free_port)"
	# leases of 60 s: only the new run's rewind ends the dead trainer's
	STALE=1 LEASE=60 broker "$O.q"
	sed -n 1,2p "$TD/scored.jsonl" > "$TD/g1.jsonl"
	rl-queue put -q -s scored "$URL" "$TD/g1.jsonl"
	(trainer "$O") 2> "$O.err1" &
	T=$!
	PIDS="$PIDS $T"
	for i in $(seq 200); do
		[ "$(rl-queue stat --json "$URL" 2>/dev/null | jq .depth.training)" = 2 ] && break
		sleep 0.05
	done
	[ "$(rl-queue stat --json "$URL" | jq .depth.training)" = 2 ]
	kill -KILL "$T"
	wait "$T" 2>/dev/null || true
	[ ! -e "$O/latest" ]
	STALE=1 feed &
	PIDS="$PIDS $!"
	run --separate-stderr bash -c "$(declare -f trainer); URL=$URL TD=$TD trainer $O"
	wait_fed
	[ "$status" -eq 0 ] || { echo "status $status: $stderr" >&3; return 1; }
	check_once "$O" || { grep -v "leased\|acked\|put " "$O.q.log" >&3; return 1; }
}

@test "leases held across steps without a full checkpoint, the run longer than a lease: after a step only its own leases are marked, the others renewed when a tenth of the lease time old; none expires, every group trained exactly once" {
	local O="$TD/hold"
	URL="tcp://127.0.0.1:$(free_port)"
	# leases of 2 s; the feed takes 3 s or more, and --save-every 0 makes
	# full checkpoints at steps 1 and 15 only: the leases of steps 2-14 are
	# held (and must be renewed) until the end
	LEASE=2 broker "$O.q"
	feed &
	PIDS="$PIDS $!"
	run --separate-stderr rl-train -m "$TD/m0" --out "$O" --queue "$URL" --batch 2 --save-every 0 --lr 1e-2 \
	    --idle-exit 5 --max-steps 15 --metrics "$O.m"
	wait_fed
	[ "$status" -eq 0 ] || { echo "status $status: $stderr" >&3; return 1; }
	check_once "$O" || { grep -v "leased\|acked\|put " "$O.q.log" >&3; return 1; }
	[ "$(jq .total.expired_leases "$O.stat")" = 0 ] || { cat "$O.stat" >&3; return 1; }
}

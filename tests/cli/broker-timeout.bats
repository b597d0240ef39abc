#!/usr/bin/env bats
# --broker-timeout: a broker that stops answering ends rl-rollout, rl-reward
# and rl-train --queue with an error naming it (rl-train after a checkpoint);
# a broker that comes back within the time, or that answers "nothing to
# lease", does not.  Times asserted are generous bounds, not exact figures.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" "" 64
	for i in 1 2 3 4 5 6; do echo "{\"id\":$i,\"prompt_text\":\"$i+$i=\",\"meta\":{\"answer\":\"$((i + i))\"}}"; done > "$TD/prompts.jsonl"
	# generated records with rewards, for the trainer's tests (2 samples a prompt)
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@
	local url="tcp://127.0.0.1:$DPORT" qpid=$DPID
	rl-queue put -q "$url" "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --queue "$url" --idle-exit 1
	rl-queue get "$url" -s reward -n 1000 > "$TD/gen.jsonl"
	kill "$qpid"; wait "$qpid" 2>/dev/null || true
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    r["reward"] = float(r["response"][0] % 2)
    print(json.dumps(r))' "$TD/gen.jsonl" > "$TD/scored.jsonl"
}

setup() {
	PIDS=""
	QD="$BATS_TEST_TMPDIR/q"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' \
	    rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -d "$QD" -t 30
	URL="tcp://127.0.0.1:$DPORT"
	QPID=$DPID
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

# kill_broker: kill -9, as a crash would
kill_broker() {
	kill -9 "$QPID"
	wait "$QPID" 2>/dev/null || true
}

# restart_broker: the same port and journal, as a supervisor would
restart_broker() {
	rl-queue serve -q -l "$URL" -d "$QD" -t 30 3>&- &
	QPID=$!
	PIDS="$PIDS $QPID"
	for i in $(seq 200); do rl-queue stat --timeout 0.2 "$URL" >/dev/null 2>&1 && return 0; sleep 0.05; done
	echo "the broker did not come back on $URL" >&2
	return 1
}

# ends PID SECONDS: waits up to SECONDS for PID to exit; sets ST to its status
ends() {
	timeout "$2" tail --pid="$1" -f /dev/null || { echo "pid $1 still running after $2 s" >&2; return 1; }
	ST=0
	wait "$1" || ST=$?
}

# gone_msg FILE SECONDS: the client's message, naming the broker and the wait
gone_msg() {
	grep -E "no reply from the broker at '$URL' for [0-9.]+ s \(a [a-z]+ request\): taken for gone" "$1"
	grep -q "hint: .*--broker-timeout" "$1"
}

@test "rl-reward --queue: a killed broker ends it with exit 1 after --broker-timeout" {
	rl-reward --queue "$URL" -t arith --broker-timeout 2 2> "$TD/rw.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	sleep 1
	kill -0 "$P"   # idle (nothing to score) is not a dead broker
	kill_broker
	ends "$P" 40
	[ "$ST" -eq 1 ]
	gone_msg "$TD/rw.err"
}

@test "rl-reward --queue: a broker that comes back within --broker-timeout is carried on with" {
	rl-reward --queue "$URL" -t arith --broker-timeout 60 2> "$TD/rw2.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	sleep 0.5
	kill_broker
	sleep 1
	restart_broker
	python3 -c '
import json
for i in range(4):
    print(json.dumps({"id": 100 + i, "group": 7, "index": i, "group_size": 4,
                      "response_text": "%d" % i, "meta": {"answer": "2", "task": "arith"}}))' > "$TD/g4.jsonl"
	rl-queue put -q --stage generated "$URL" "$TD/g4.jsonl"
	rl-queue get -q --stage train -n 4 -w 30 "$URL" > "$TD/s4.jsonl"
	[ "$(wc -l < "$TD/s4.jsonl")" -eq 4 ]
	kill -0 "$P"
	kill -TERM "$P"
	ends "$P" 30
	[ "$ST" -eq 0 ]
	run ! grep -q "taken for gone" "$TD/rw2.err"
}

@test "waiting for work is --idle-exit's, not --broker-timeout's: an empty broker is not a dead one" {
	SECONDS=0
	run -0 --separate-stderr timeout -k 20 60 rl-reward --queue "$URL" -t arith --broker-timeout 1 --idle-exit 4
	[ "$SECONDS" -ge 3 ]
	run -0 --separate-stderr timeout -k 20 60 rl-rollout -m "$TD/m0" --queue "$URL" --broker-timeout 1 --idle-exit 4
	run -0 --separate-stderr timeout -k 20 60 rl-train -m "$TD/m0" --out "$TD/ck0" --queue "$URL" --broker-timeout 1 \
	    --idle-exit 4 --metrics /dev/null
}

@test "rl-rollout --queue: a killed broker ends it with exit 1 after --broker-timeout" {
	rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --broker-timeout 2 2> "$TD/ro.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	sleep 1
	kill -0 "$P"
	kill_broker
	ends "$P" 40
	[ "$ST" -eq 1 ]
	gone_msg "$TD/ro.err"
}

@test "rl-rollout --queue: a broker that comes back within --broker-timeout is carried on with" {
	rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --broker-timeout 60 2> "$TD/ro2.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	sleep 0.5
	kill_broker
	sleep 1
	restart_broker
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	: > "$TD/g12.jsonl"
	for i in $(seq 60); do
		rl-queue get -q --stage reward -n 12 -w 1 "$URL" >> "$TD/g12.jsonl"
		[ "$(wc -l < "$TD/g12.jsonl")" -ge 12 ] && break
	done
	[ "$(wc -l < "$TD/g12.jsonl")" -eq 12 ]
	kill -0 "$P"
	kill -TERM "$P"
	ends "$P" 30
	[ "$ST" -eq 0 ]
}

@test "rl-train --queue: a killed broker ends it with exit 1 after a full checkpoint of what it trained" {
	rl-queue put -q -s scored "$URL" "$TD/scored.jsonl"
	# batch 3 of 6 groups: one step, then the rest is stale (K = 0) and it waits
	rl-train -m "$TD/m0" --out "$TD/ck" --batch 3 --queue "$URL" --broker-timeout 2 --metrics "$TD/m.jsonl" \
	    2> "$TD/tr.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	for i in $(seq 300); do [ -s "$TD/m.jsonl" ] && break; sleep 0.1; done
	[ -s "$TD/m.jsonl" ]
	# the first step of a run is a full checkpoint; the final one rewrites it with the groups held
	[ -e "$TD/ck/step-00000001/optimizer.safetensors" ]
	kill_broker
	ends "$P" 60
	[ "$ST" -eq 1 ]
	gone_msg "$TD/tr.err"
	grep -q "stopped after step 1: the broker at '$URL' did not answer; --resume continues" "$TD/tr.err"
	[ "$(readlink "$TD/ck/latest")" = step-00000001 ]
	[ -e "$TD/ck/step-00000001/optimizer.safetensors" ]
	run ! grep -q "end of input" "$TD/tr.err"
}

@test "rl-train --queue: a broker that comes back within --broker-timeout is carried on with" {
	rl-train -m "$TD/m0" --out "$TD/ck2" --batch 3 --max-steps 1 --queue "$URL" --broker-timeout 60 \
	    --metrics "$TD/m2.jsonl" 2> "$TD/tr2.err" 3>&- &
	P=$!; PIDS="$PIDS $P"
	sleep 1
	kill_broker
	sleep 1
	restart_broker
	rl-queue put -q -s scored "$URL" "$TD/scored.jsonl"
	ends "$P" 60
	[ "$ST" -eq 0 ]
	[ "$(wc -l < "$TD/m2.jsonl")" -eq 1 ]
	[ "$(readlink "$TD/ck2/latest")" = step-00000001 ]
}

@test "--broker-timeout: a bad value is a usage error" {
	run -2 --separate-stderr rl-reward --queue "$URL" -t arith --broker-timeout -1
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --queue "$URL" --broker-timeout x
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --queue "$URL" --broker-timeout -3
}

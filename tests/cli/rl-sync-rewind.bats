#!/usr/bin/env bats
# rl-sync rewinds: a trainer resumed from a checkpoint older than versions it
# had pushed (push --rewind, rl-train --resume --sync) makes the server drop
# them, in memory and in --data-dir (crash-safe), on a new line that its
# workers (pull --follow, rl-rollout --sync) move to.
bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load 'sync_helper'
load 'model_helper'

setup() {
	T=$BATS_TEST_TMPDIR
	PORT=$(free_port)
	URL=tcp://127.0.0.1:$PORT
	mkdir -p "$T/c1"
	head -c 2000000 /dev/urandom >"$T/c1/model.safetensors"
	echo '{"model_type":"gpt2"}' >"$T/c1/config.json"
	for v in 2 3 4 5; do
		cp -r "$T/c1" "$T/c$v"
		printf 'v%s' "$v" | dd of="$T/c$v/model.safetensors" bs=1 seek=1000 conv=notrunc 2>/dev/null
	done
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

# wait_latest DIR VERSION: until DIR/latest names vVERSION (5 s)
wait_latest() {
	local want
	want=$(printf 'v%06d' "$2")
	for _ in $(seq 50); do [ "$(readlink "$1/latest")" = "$want" ] && return 0; sleep 0.1; done
	echo "$1/latest is $(readlink "$1/latest"), not $want" >&2
	return 1
}

@test "push --rewind: the server drops the newer versions (memory and --data-dir), a follower moves back, the line goes on" {
	serve --data-dir "$T/data" --keep-previous
	rl-sync pull "$URL" --out "$T/f" --follow --transport stream 3>&- 2>"$T/follow.err" &
	PIDS="$PIDS $!"
	for v in 1 2 3 4 5; do rl-sync push -q "$URL" "$T/c$v" --version "$v" --transport stream; wait_latest "$T/f" "$v"; done
	# an ordinary older push is still refused
	run -1 --separate-stderr rl-sync push "$URL" "$T/c3" --version 3
	[[ $stderr == *'version 3 is not newer than the latest, 5'* ]]
	run -0 --separate-stderr rl-sync push "$URL" "$T/c3" --version 3 --rewind --transport stream
	grep -q 'rewound from version 5 to 3' "$T/serve.err"
	run -0 rl-sync status "$URL"
	assert_line 'latest: 3'
	assert_line --partial 'line: 1'
	refute_line --partial 'version 5:'
	refute_line --partial 'version 4:'
	[ ! -e "$T/data/v000005" ] && [ ! -e "$T/data/v000004" ]
	cmp "$T/c3/model.safetensors" "$T/data/v000003/model.safetensors"
	# the follower held 5: it goes back to 3, and its directory too
	wait_latest "$T/f" 3
	[ ! -e "$T/f/v000005" ] && [ ! -e "$T/f/v000004" ]
	cmp "$T/c3/model.safetensors" "$T/f/latest/model.safetensors"
	grep -q "went back to version 3" "$T/follow.err"
	# the new line goes on past the old numbers
	rl-sync push -q "$URL" "$T/c1" --version 4 --transport stream
	wait_latest "$T/f" 4
	cmp "$T/c1/model.safetensors" "$T/f/latest/model.safetensors"
	# a restart from --data-dir keeps the line
	kill "$SPID"; wait "$SPID" || true
	KEEP_URL=1 serve --data-dir "$T/data" --keep-previous
	run -0 rl-sync status "$URL" --json
	[[ $output == *'"latest":4'* ]] && [[ $output == *'"lineage":1'* ]]
}

@test "push --rewind to the latest version changes nothing; to a newer one it is an ordinary push" {
	serve
	rl-sync push -q "$URL" "$T/c1" --version 1
	rl-sync push -q "$URL" "$T/c2" --version 2
	run -0 --separate-stderr rl-sync push "$URL" "$T/c2" --version 2 --rewind
	grep -q 'rewind to version 2: held already' "$T/serve.err"
	run -0 rl-sync status "$URL" --json
	[[ $output == *'"lineage":0'* ]]
	rl-sync push -q "$URL" "$T/c3" --version 3 --rewind
	run -0 rl-sync status "$URL" --json
	[[ $output == *'"latest":3'* ]] && [[ $output == *'"lineage":0'* ]]
	# usage
	run -2 --separate-stderr rl-sync push "$URL" "$T/c3" --rewind --delta "$T/c2"
	[[ $stderr == *'--rewind sends the version whole'* ]]
	run -2 --separate-stderr rl-sync pull "$URL" --out "$T/o" --rewind
	[[ $stderr == *'--rewind is an option of push'* ]]
	run -1 --separate-stderr rl-sync push "$URL" "$T/c3" --rewind
	[[ $stderr == *'records no version number'* ]]
}

@test "a server killed in the middle of a rewind restarts on complete versions of the old line; the rewind then succeeds" {
	serve --data-dir "$T/data" --keep-previous
	for v in 1 2 3 4 5; do rl-sync push -q "$URL" "$T/c$v" --version "$v"; done
	kill "$SPID"; wait "$SPID" || true
	# the server dies after dropping the first version (5) of the rewind
	KEEP_URL=1 RL_WDIR_TEST_REWIND_DIE=1 serve --data-dir "$T/data" --keep-previous
	run rl-sync push "$URL" "$T/c2" --version 2 --rewind --timeout 2000
	[ "$status" -ne 0 ]
	wait "$SPID" || [ $? = 9 ]
	[ ! -e "$T/data/v000005" ]
	KEEP_URL=1 serve --data-dir "$T/data" --keep-previous
	grep -q 'serving version 4' "$T/serve.err"
	rl-sync push -q "$URL" "$T/c2" --version 2 --rewind
	run -0 rl-sync status "$URL" --json
	[[ $output == *'"latest":2'* ]] && [[ $output == *'"lineage":1'* ]]
	[ "$(ls -A "$T/data" | grep -c "^\.tmp-")" = 0 ]
	rl-sync pull -q "$URL" --out "$T/o"
	cmp "$T/c2/model.safetensors" "$T/o/v000002/model.safetensors"
}

@test "rl-train killed between --save-every checkpoints resumes with --sync: rl-sync rewinds, the push goes on, a generator that held the lost version loads the rewound one" {
	train_model "$T"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$T/scored.jsonl"
	serve
	# the trainer reads 3 groups and a record of the 4th, then waits for input: killed after step 3
	mkfifo "$T/tin"
	rl-train -q -m "$T/m0" --out "$T/ck" --sync "$URL" --save-every 2 --batch 1 --lr 1e-3 \
	    --metrics /dev/null < "$T/tin" 3>&- 2>"$T/train1.err" &
	TP=$!
	PIDS="$PIDS $TP"
	{ head -n 13 "$T/scored.jsonl"; sleep 600; } > "$T/tin" 3>&- &
	PIDS="$PIDS $!"
	for _ in $(seq 300); do rl-sync status "$URL" | grep -qx 'latest: 3' && break; sleep 0.1; done
	rl-sync status "$URL" | grep -qx 'latest: 3'
	kill -9 "$TP"; wait "$TP" || true
	[ -f "$T/ck/step-00000002/optimizer.safetensors" ] && [ ! -f "$T/ck/step-00000003/optimizer.safetensors" ]
	# a generator that loaded version 3, which the resumed trainer will not have
	mkfifo "$T/pin"
	rl-rollout -v -m "$T/m0" --sync "$URL" -n 1 --max-tokens 2 < "$T/pin" > /dev/null 3>&- 2>"$T/rollout.log" &
	RP=$!
	PIDS="$PIDS $RP"
	{ while :; do echo '{"prompt":"x"}'; sleep 0.05; done; } > "$T/pin" 3>&- &
	PIDS="$PIDS $!"
	for _ in $(seq 100); do grep -q "weights version 3 loaded" "$T/rollout.log" && break; sleep 0.1; done
	grep -q "weights version 3 loaded" "$T/rollout.log"
	# resumed from step 2, going no further: the rewind alone
	run -0 --separate-stderr rl-train --out "$T/ck" --resume --sync "$URL" --save-every 2 --batch 1 --lr 1e-3 \
	    --max-steps 2 --metrics /dev/null "$T/scored.jsonl"
	grep -q 'rewound from version 3 to 2' "$T/serve.err"
	rl-sync status "$URL" | grep -qx 'latest: 2'
	for _ in $(seq 100); do grep -q "weights version 2 loaded" "$T/rollout.log" && break; sleep 0.1; done
	grep -q "went back to version 2 (a resumed trainer): replacing weights version 3" "$T/rollout.log"
	grep -q "weights version 2 loaded" "$T/rollout.log"
	# the run goes on: version 3 of the new line is pushed (not refused as
	# "not newer than the latest, 3"), up to 8, and the generator follows
	run -0 --separate-stderr rl-train --out "$T/ck" --resume --sync "$URL" --save-every 2 --batch 1 --lr 1e-3 \
	    --metrics /dev/null "$T/scored.jsonl"
	[[ $stderr != *'not newer'* ]]
	rl-sync status "$URL" | grep -qx 'latest: 8'
	for _ in $(seq 100); do grep -q "weights version 8 loaded" "$T/rollout.log" && break; sleep 0.1; done
	grep -q "weights version 8 loaded" "$T/rollout.log"
	kill -0 "$RP"
	rl-sync pull -q "$URL" --out "$T/o"
	cmp "$T/ck/step-00000008/model.safetensors" "$T/o/v000008/model.safetensors"
}

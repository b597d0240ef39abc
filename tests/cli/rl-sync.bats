#!/usr/bin/env bats
# rl-sync: usage and exit codes, serve/push/pull/status on loopback, the bulk
# stream and --compress, ipc://, deltas,
# --follow, restart from --data-dir, corrupted chunks, a puller killed
# mid-transfer, the file transport, the man page.
bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load 'sync_helper'

setup() {
	T=$BATS_TEST_TMPDIR
	PORT=$(free_port)
	URL=tcp://127.0.0.1:$PORT
	mkdir -p "$T/ck"
	head -c 3000000 /dev/urandom >"$T/ck/model.safetensors"
	echo '{"model_type":"gpt2"}' >"$T/ck/config.json"
	echo '{}' >"$T/ck/tokenizer.json"
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	[ -z "${MNT:-}" ] || umount "$MNT"
}

# a copy of ck with a few bytes changed: a small "update"
bump() {
	rm -rf "$T/$1"
	cp -r "$T/ck" "$T/$1"
	printf '%s' "$2" | dd of="$T/$1/model.safetensors" bs=1 seek=1000 conv=notrunc 2>/dev/null
}

@test "rl-sync --help prints usage to stdout and exits 0" {
	run --separate-stderr rl-sync --help
	assert_success
	assert_output --partial 'usage: rl-sync serve'
	assert_output --partial '--keep-previous'
}

@test "rl-sync usage errors exit 2" {
	run --separate-stderr -2 rl-sync
	[[ $stderr == *'missing command'* ]]
	run --separate-stderr -2 rl-sync frobnicate
	[[ $stderr == *"unknown command 'frobnicate'"* ]]
	run --separate-stderr -2 rl-sync pull "$URL"
	[[ $stderr == *'--out DIR is required'* ]]
	run --separate-stderr -2 rl-sync push "$URL"
	run --separate-stderr -2 rl-sync push "$URL" "$T/ck" --chunk 65
	[[ $stderr == *"--chunk: bad value '65'"* ]]
	[[ $stderr == *'hint: rl-sync push --help'* ]]
	run --separate-stderr -2 rl-sync status "$URL" --timeout abc
	[[ $stderr == *"--timeout: bad value 'abc'"* ]]
}

@test "serve: a tcp:// URL without a port is refused, port 0 is named as the port taken, inproc:// is refused" {
	# nng took tcp://127.0.0.1 for port 0 and the server said it listened on
	# 'tcp://127.0.0.1' (and on 'tcp://127.0.0.1:0'): no worker could find it
	run -1 --separate-stderr timeout -k 20 5 rl-sync serve --listen tcp://127.0.0.1
	[[ $stderr == *"'tcp://127.0.0.1': not HOST:PORT with a TCP port from 0 to 65535"* ]]
	run -2 --separate-stderr timeout -k 20 5 rl-sync serve --listen inproc://x
	[[ $stderr == *"inproc:// reaches only the same process"* ]]
	rl-sync serve --listen tcp://127.0.0.1:0 3>&- 2>"$T/serve0.err" &
	PIDS="$PIDS $!"
	for _ in $(seq 50); do grep -q 'listening on' "$T/serve0.err" && break; sleep 0.1; done
	u=$(sed -n 's/^rl-sync: listening on \(tcp:[^ ]*\) .*/\1/p' "$T/serve0.err")
	[[ $u == tcp://127.0.0.1:* && $u != tcp://127.0.0.1:0 ]]
	rl-sync push -q "$u" "$T/ck" --version 3
	run -0 rl-sync status "$u"
	assert_output --partial 'latest: 3'
}

@test "serve: a non-loopback --listen is refused (exit 2, nothing listens) unless --listen-public" {
	for u in tcp://0.0.0.0:$PORT "tcp://*:$PORT" tcp://:$PORT "tcp://[::]:$PORT" tcp://192.0.2.1:$PORT tcp://example.org:$PORT; do
		run -2 --separate-stderr timeout -k 20 5 rl-sync serve --listen "$u"
		[[ $stderr == *"refusing to listen on '$u': not a loopback address"* ]]
		[[ $stderr == *"--listen-public"* ]]
	done
	rl-sync serve --listen "tcp://0.0.0.0:$PORT" --listen-public 3>&- 2>"$T/pub.err" &
	PIDS="$PIDS $!"
	for _ in $(seq 50); do grep -q 'listening on' "$T/pub.err" && break; sleep 0.1; done
	rl-sync push -q "tcp://127.0.0.1:$PORT" "$T/ck" --version 4
	run -0 rl-sync status "tcp://127.0.0.1:$PORT"
	assert_output --partial 'latest: 4'
}

@test "serve on an address in use fails with a hint" {
	serve
	run --separate-stderr -1 rl-sync serve --listen "$URL"
	[[ $stderr == *"cannot listen on '$URL'"* ]]
	[[ $stderr == *'hint:'* ]]
}

@test "push of a missing or empty directory fails with a clear error" {
	run --separate-stderr -1 rl-sync push "$URL" "$T/nope"
	[[ $stderr == *"cannot open '$T/nope': No such file or directory"* ]]
	mkdir "$T/empty"
	run --separate-stderr -1 rl-sync push "$URL" "$T/empty"
	[[ $stderr == *"'$T/empty' has no files to push"* ]]
	run --separate-stderr -1 rl-sync publish "$T/w" "$T/empty" --version 1
	[[ $stderr == *"'$T/empty' has no files to publish"* ]]
}

@test "status of a server that is not there fails within the timeout" {
	run --separate-stderr -1 rl-sync status "$URL" --timeout 300
	[[ $stderr == *"no answer from '$URL'"* ]]
	[[ $stderr == *'hint:'* ]]
}

@test "a tcp:// URL without a port from 1 to 65535 is an error at once, not a timeout" {
	for u in tcp://127.0.0.1:99999 tcp://127.0.0.1 tcp://127.0.0.1:0 'tcp://[::1]:70000'; do
		run --separate-stderr -1 timeout -k 20 5 rl-sync pull "$u" -o "$BATS_TEST_TMPDIR/p"
		[[ $stderr == *"'$u': not HOST:PORT with a TCP port from 1 to 65535"* ]]
	done
}

@test "serve, push, pull, status: the pulled checkpoint is byte-identical" {
	serve
	run --separate-stderr -3 rl-sync pull "$URL" --out "$T/out"
	[[ $stderr == *'has no version yet'* ]]
	run --separate-stderr rl-sync push "$URL" "$T/ck"
	echo "$stderr"
	assert_success
	[[ $stderr == *'pushed version 1'* ]]
	run --separate-stderr rl-sync pull "$URL" --out "$T/out"
	echo "$stderr"
	assert_success
	for f in model.safetensors config.json tokenizer.json; do cmp "$T/ck/$f" "$T/out/latest/$f"; done
	[ "$(readlink "$T/out/latest")" = v000001 ]
	run --separate-stderr rl-sync status "$URL"
	assert_success
	assert_line 'latest: 1'
	assert_line --partial 'version 1: 3000025 bytes in 3 blobs'
	run --separate-stderr rl-sync status "$URL" --json
	assert_success
	[ "$(echo "$output" | jq .latest)" = 1 ]
	[ "$(echo "$output" | jq '.versions[0].blobs')" = 3 ]
}

@test "pull into an unusable output is a local error (exit 1, once), found before fetching" {
	serve
	run --separate-stderr rl-sync push "$URL" "$T/ck"
	assert_success
	echo hi > "$T/afile"
	for o in "$T/afile" /dev/null; do
		run --separate-stderr -1 rl-sync pull "$URL" --out "$o"
		[[ $stderr == "rl-sync: cannot pull into '$o': not a directory" ]]
	done
	run --separate-stderr -1 rl-sync pull "$URL" --out "$T/no/such"
	[[ $stderr == *"cannot pull into '$T/no/such': cannot create it in '$T/no'"* ]]
	[ ! -e "$T/no" ]
}

@test "on this host whole chunks come uncompressed over the bulk stream; --compress and ipc:// work too" {
	serve -v
	grep -q 'bulk stream on tcp://127.0.0.1:' "$T/serve.err"
	run --separate-stderr rl-sync status "$URL"
	assert_line --partial 'bulk stream: tcp://127.0.0.1:'
	run --separate-stderr rl-sync push "$URL" "$T/ck" -v
	assert_success
	run --separate-stderr rl-sync pull "$URL" --transport stream --out "$T/a" -v
	assert_success
	[[ $stderr == *'uncompressed over the bulk stream'* ]]
	cmp "$T/ck/model.safetensors" "$T/a/latest/model.safetensors"
	run --separate-stderr rl-sync pull "$URL" --transport stream --out "$T/b" --compress -v
	assert_success
	[[ $stderr != *'bulk stream'* ]]
	cmp "$T/ck/model.safetensors" "$T/b/latest/model.safetensors"
	kill "$SPID"; wait "$SPID" || true
	URL="ipc://$T/sync.sock"
	serve
	rl-sync push "$URL" "$T/ck" --compress
	run --separate-stderr rl-sync pull "$URL" --transport stream --out "$T/c" -v
	assert_success
	[[ $stderr == *'uncompressed over the bulk stream'* ]]
	cmp "$T/ck/model.safetensors" "$T/c/latest/model.safetensors"
	kill "$SPID"; wait "$SPID" || true
	[ ! -e "$T/sync.sock.bulk" ]
}

@test "a stale version is refused; --delta sends a fraction of the bytes" {
	serve --keep-previous
	rl-sync push "$URL" "$T/ck" --version 5
	run --separate-stderr -1 rl-sync push "$URL" "$T/ck" --version 4
	[[ $stderr == *'version 4 is not newer than the latest, 5'* ]]
	rl-sync pull "$URL" --out "$T/out"
	bump ck2 XYZ
	# chunks, as to a server on another host (auto would hand the version
	# over as shared memory: rl-sync-shm.bats)
	run --separate-stderr rl-sync push "$URL" "$T/ck2" --delta "$T/out/latest" --transport stream
	assert_success
	[[ $stderr == *'pushed version 6'* ]]
	wire=$(echo "$stderr" | sed -n 's/.* as \([0-9]*\) on the wire.*/\1/p')
	[ "$wire" -lt 100000 ]
	rl-sync pull "$URL" --out "$T/out"
	cmp "$T/ck2/model.safetensors" "$T/out/latest/model.safetensors"
	run rl-sync status "$URL"
	assert_line --partial 'version 6: 3000025 bytes in 3 blobs, hash'
	assert_line --partial 'delta from 5'
	assert_line --partial 'version 5:'
}

@test "pull --follow receives every version in order, as deltas" {
	serve
	rl-sync pull "$URL" --transport stream --out "$T/f" --follow --keep 3 -v 3>&- 2>"$T/follow.err" &
	FP=$!
	PIDS="$PIDS $FP"
	rl-sync push "$URL" "$T/ck" --version 1
	for v in 2 3 4; do
		for _ in $(seq 50); do [ -e "$T/f/v00000$((v - 1))" ] && break; sleep 0.1; done
		bump "c$v" "v$v"
		rl-sync push "$URL" "$T/c$v" --version "$v" --delta "$T/f/latest" --transport stream
	done
	for _ in $(seq 50); do [ "$(readlink "$T/f/latest")" = v000004 ] && break; sleep 0.1; done
	[ "$(readlink "$T/f/latest")" = v000004 ]
	cmp "$T/c4/model.safetensors" "$T/f/latest/model.safetensors"
	[ ! -e "$T/f/v000001" ]   # pruned to 3
	grep -q 'pulled version 1' "$T/follow.err"
	grep -q 'pulled version 4' "$T/follow.err"
	grep -q 'as a delta' "$T/follow.err"
	kill "$FP"
	wait "$FP"   # SIGTERM is a clean stop: exit 0
}

@test "pull without --follow: a version replaced between poll and fetch is not a silent exit 1" {
	# the server holds only its latest: a push landing after pull learnt the
	# latest number makes that version "not held"; pull takes the newer one
	serve
	bump ck2 'ABCD'
	rl-sync push -q "$URL" "$T/ck" --version 1
	RL_SYNC_TEST_PULL_PAUSE_MS=600 rl-sync pull "$URL" --out "$T/out" 3>&- 2>"$T/pull.err" &
	P=$!
	PIDS="$PIDS $P"
	sleep 0.2
	rl-sync push -q "$URL" "$T/ck2" --version 2
	wait "$P" || { cat "$T/pull.err"; false; }
	[ "$(readlink "$T/out/latest")" = v000002 ]
	cmp "$T/ck2/model.safetensors" "$T/out/latest/model.safetensors"
}

@test "a server behind the output directory: pull fails naming both versions; --follow says so once and waits" {
	# the directory holds version 5 of an earlier server; this one has 2
	serve
	rl-sync push -q "$URL" "$T/ck" --version 5
	rl-sync pull -q "$URL" --out "$T/out"
	kill "$SPID"; wait "$SPID" || true
	serve
	bump ck2 'EFGH'
	rl-sync push -q "$URL" "$T/ck2" --version 2
	run -1 --separate-stderr rl-sync pull "$URL" --out "$T/out"
	[[ $stderr == *"has version 2, older than version 5 in '$T/out'"* ]]
	[[ $stderr != *"already holds"* ]]
	run -124 --separate-stderr timeout -k 20 1.5 rl-sync pull "$URL" --out "$T/out" --follow
	[ "$(grep -c "has version 2, older than version 5 in '$T/out': waiting for a version newer than 5" <<<"$stderr")" = 1 ]
	[ "$(readlink "$T/out/latest")" = v000005 ]
}

@test "a restarted server keeps serving the last version from --data-dir" {
	serve --data-dir "$T/data"
	rl-sync push "$URL" "$T/ck" --version 7
	kill "$SPID"; wait "$SPID" || true
	serve --data-dir "$T/data"
	grep -q 'serving version 7' "$T/serve.err"
	run --separate-stderr rl-sync pull "$URL" --out "$T/out"
	echo "$stderr"
	assert_success
	cmp "$T/ck/model.safetensors" "$T/out/v000007/model.safetensors"
}

@test "a restarted server with --keep-previous holds the previous version from --data-dir too" {
	serve --data-dir "$T/data" --keep-previous
	rl-sync push "$URL" "$T/ck" --version 1
	bump ck2 "xy"
	rl-sync push "$URL" "$T/ck2" --version 2
	kill -9 "$SPID"; wait "$SPID" || true
	serve --data-dir "$T/data" --keep-previous
	# it held only the latest after a restart: version 1 was on disk, not served
	run --separate-stderr rl-sync pull "$URL" --version 1 --out "$T/out"
	echo "$stderr"
	assert_success
	cmp "$T/ck/model.safetensors" "$T/out/v000001/model.safetensors"
	rl-sync pull "$URL" --out "$T/out"
	cmp "$T/ck2/model.safetensors" "$T/out/v000002/model.safetensors"
}

@test "pull --follow after a restart of serve --keep-previous from --data-dir: the next version still comes as a delta" {
	# reported: the restarted server held only the latest, so a follower
	# holding the one before got the whole version; it holds both (and the delta)
	serve --data-dir "$T/data" --keep-previous
	rl-sync push -q "$URL" "$T/ck" --version 1
	rl-sync pull -q "$URL" --out "$T/out"
	bump ck2 "xy"
	rl-sync push -q "$URL" "$T/ck2" --version 2 --transport stream
	kill "$SPID"; wait "$SPID" || true
	KEEP_URL=1 serve --data-dir "$T/data" --keep-previous
	run -124 --separate-stderr timeout -k 20 2 rl-sync pull -v "$URL" --out "$T/out" --follow --transport stream
	echo "$stderr"
	[[ $stderr == *'fetching version 2: '*' as a delta'* ]]
	cmp "$T/ck2/model.safetensors" "$T/out/v000002/model.safetensors"
}

@test "a version that cannot be saved in --data-dir is refused to the pusher; the server keeps the one before" {
	# a file size limit (4 MiB: sh counts 512-byte blocks) makes the write
	# fail as a full disk does; the server must not die of SIGXFSZ and leave
	# the pusher waiting on it
	real=$(command -v rl-sync)
	mkdir "$T/bin"
	printf '#!/bin/sh\nulimit -f 8192\nexec "%s" "$@"\n' "$real" >"$T/bin/rl-sync"
	chmod +x "$T/bin/rl-sync"
	PATH="$T/bin:$PATH" serve --data-dir "$T/data"
	rl-sync push "$URL" "$T/ck" --version 1
	cp -r "$T/ck" "$T/big"
	head -c 5000000 /dev/urandom >"$T/big/model.safetensors"
	run -1 --separate-stderr timeout -k 20 20 rl-sync push "$URL" "$T/big" --version 2
	[[ $stderr == *"cannot save version 2"* ]]
	kill -0 "$SPID"
	run --separate-stderr rl-sync status "$URL" --json
	[[ $output == *'"latest":1'* ]] || [[ $output == *'"latest": 1'* ]]
	[ -z "$(ls -A "$T/data" | grep '^\.tmp-')" ]
	rl-sync pull "$URL" --out "$T/out"
	cmp "$T/ck/model.safetensors" "$T/out/v000001/model.safetensors"
}

@test "a version left half written by a server that died does not fill the disk for the next one" {
	# a small disk: room for the kept version and one more
	mkdir "$T/disk"
	mount -t tmpfs -o size=8m tmpfs "$T/disk" 2>/dev/null || skip "cannot mount a tmpfs here"
	MNT=$T/disk
	serve --data-dir "$T/disk/data"
	rl-sync push "$URL" "$T/ck" --version 1
	kill -9 "$SPID"; wait "$SPID" || true
	# what a kill -9 while version 2 was being saved leaves behind
	mkdir "$T/disk/data/.tmp-v000002-999999999-1"
	head -c 3000000 /dev/urandom >"$T/disk/data/.tmp-v000002-999999999-1/model.safetensors"
	serve --data-dir "$T/disk/data"
	bump ck2 "xy"
	# the leftover must not wait for the prune after a save that succeeds:
	# every save would fail for want of the room it takes
	run --separate-stderr rl-sync push "$URL" "$T/ck2" --version 2
	echo "$stderr"
	assert_success
	[ ! -e "$T/disk/data/.tmp-v000002-999999999-1" ]
	rl-sync pull "$URL" --out "$T/out"
	cmp "$T/ck2/model.safetensors" "$T/out/v000002/model.safetensors"
}

@test "a corrupted chunk is detected and fetched again" {
	RL_WSYNC_TEST_CORRUPT=1 serve
	rl-sync push "$URL" "$T/ck"
	run --separate-stderr rl-sync pull "$URL" --transport stream --out "$T/out"
	echo "$stderr"
	assert_success
	[[ $stderr == *'failed its checksum; asking again'* ]]
	[[ $stderr == *'with re-sent chunks'* ]]
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
	# a 3-byte blob (tokenizer.json) on its own: the hook's flipped byte can be
	# a reserved header byte, which must be checked too; over REQ/REP
	# (compressed) and over the bulk stream
	kill "$SPID"; wait "$SPID" || true
	mkdir "$T/tiny"
	cp "$T/ck/tokenizer.json" "$T/tiny/"
	for how in --compress --stored; do
		RL_WSYNC_TEST_CORRUPT=1 serve
		rl-sync push "$URL" "$T/tiny"
		run --separate-stderr rl-sync pull "$URL" --transport stream --out "$T/tiny$how" "$how"
		assert_success
		[[ $stderr == *"'tokenizer.json' at byte 0) failed its checksum; asking again"* ]]
		cmp "$T/tiny/tokenizer.json" "$T/tiny$how/latest/tokenizer.json"
		kill "$SPID"; wait "$SPID" || true
	done
}

@test "a server that keeps corrupting chunks gives exit 4 and writes nothing" {
	RL_WSYNC_TEST_CORRUPT=1000 serve
	rl-sync push "$URL" "$T/ck"
	run --separate-stderr -4 rl-sync pull "$URL" --transport stream --out "$T/out"
	[[ $stderr == *'still bad after 4 tries'* ]]
	[ ! -e "$T/out/latest" ]
}

@test "a puller killed mid-transfer leaves no version behind and a new one recovers" {
	head -c 9000000 /dev/urandom >"$T/ck/model.safetensors"
	RL_WSYNC_TEST_SLOW_MS=150 serve
	rl-sync push "$URL" "$T/ck" --chunk 1
	rl-sync pull "$URL" --transport stream --out "$T/out" --parallel 1 3>&- 2>/dev/null &
	P=$!
	PIDS="$PIDS $P"
	sleep 0.5
	kill -9 "$P"
	wait "$P" || true
	[ ! -e "$T/out/latest" ]
	run --separate-stderr rl-sync pull "$URL" --out "$T/out" --parallel 8
	assert_success
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
	run rl-sync status "$URL" --json
	[ "$(echo "$output" | jq .latest)" = 1 ]
	rl-sync pull "$URL" --out "$T/out2" --stored
	cmp "$T/ck/model.safetensors" "$T/out2/latest/model.safetensors"
}

@test "a server killed mid-transfer and restarted: the puller carries on" {
	head -c 9000000 /dev/urandom >"$T/ck/model.safetensors"
	RL_WSYNC_TEST_SLOW_MS=150 serve --data-dir "$T/data"
	rl-sync push "$URL" "$T/ck" --chunk 1
	rl-sync pull "$URL" --transport stream --out "$T/out" --parallel 1 3>&- 2>"$T/pull.err" &
	P=$!
	PIDS="$PIDS $P"
	sleep 0.6
	kill -9 "$SPID"
	wait "$SPID" || true
	[ ! -e "$T/out/latest" ]
	KEEP_URL=1 RL_WSYNC_TEST_SLOW_MS=150 serve --data-dir "$T/data"
	wait "$P" || { echo "puller failed:"; cat "$T/pull.err"; echo "server:"; cat "$T/serve.err"; false; }
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
}

@test "a server killed mid-push and restarted: the pusher sends the version again" {
	head -c 9000000 /dev/urandom >"$T/ck/model.safetensors"
	RL_WSYNC_TEST_SLOW_MS=150 serve
	# 9 chunks of 1 MiB, one at a time, 150 ms each on the server
	rl-sync push "$URL" "$T/ck" --chunk 1 --parallel 1 --transport nng 3>&- 2>"$T/push.err" &
	P=$!
	PIDS="$PIDS $P"
	sleep 0.6
	kill -9 "$SPID"
	wait "$SPID" || true
	KEEP_URL=1 serve
	# it failed "no push of version 1 in progress" before
	wait "$P" || { echo "pusher failed:"; cat "$T/push.err"; false; }
	grep -q 'the server lost version 1 while it was sent' "$T/push.err"
	rl-sync pull "$URL" --out "$T/out"
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
}

@test "publish: the file transport makes versions appear atomically and prunes" {
	for v in 1 2 3; do rl-sync publish "$T/w" "$T/ck" --version "$v" --keep 2; done
	[ "$(readlink "$T/w/latest")" = v000003 ]
	[ -e "$T/w/v000002/rlsync.json" ]
	[ ! -e "$T/w/v000001" ]
	run --separate-stderr -1 rl-sync publish "$T/w" "$T/ck" --version 2
	[[ $stderr == *'version 2 is not newer than the latest, 3'* ]]
	run --separate-stderr -2 rl-sync publish "$T/w" "$T/ck"
	# a damaged version directory is refused when pushed
	echo x >>"$T/w/v000003/config.json"
	serve
	run --separate-stderr -4 rl-sync push "$URL" "$T/w/v000003"
	[[ $stderr == *'size or checksum differs from rlsync.json'* ]]
}

@test "the man page's EXAMPLES run" {
	cd "$T"
	mkdir -p ckpt
	cp -r ck ckpt/step-100
	bump ck2 abc
	cp -r ck2 ckpt/step-200
	# each literal block of EXAMPLES, on a free port, as a script; a port
	# taken between free_port and the server's listen: again on another one
	for try in 1 2 3; do
		awk '/^\.Sh EXAMPLES/{ex=1} /^\.Sh SEE ALSO/{ex=0} ex&&/^\.Ed/{b=0; print "#END"} ex&&b{print} ex&&/^\.Bd -literal/{b=1}' \
			"$BATS_TEST_DIRNAME/../../man/rl-sync.1" | sed "s/\\\\e\$/\\\\/; s/7401/$PORT/g" >examples
		[ "$(grep -c '^#END' examples)" = 2 ]
		printf 'set -e\ntrap '"'"'kill $(jobs -p) 2>/dev/null; wait'"'"' EXIT\n' >run.sh
		sed 's/^#END$/sleep 0.5/' examples >>run.sh
		rm -rf sync weights shared
		run --separate-stderr timeout -k 20 60 bash run.sh 3>&-
		[ "$status" -eq 0 ] && break
		echo "try $try on port $PORT: $stderr" >&2
		[[ "$stderr" == *"cannot listen on"* ]] || break
		PORT=$(free_port)
	done
	assert_success
	[ "$(echo "$output" | sed -n '1p' | jq .latest)" = 2 ]
	cmp ck2/model.safetensors weights/latest/model.safetensors
	cmp ck2/model.safetensors sync/v000002/model.safetensors
	cmp ck2/model.safetensors shared/latest/model.safetensors
	assert_line 'rlsync.json'
}

@test "man page is lint-clean" {
	run mandoc -Tlint -W warning man/rl-sync.1
	assert_success
	assert_output ''
}

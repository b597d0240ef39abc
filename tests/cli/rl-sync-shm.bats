#!/usr/bin/env bats
# rl-sync's same-host shared memory transport: a puller in another process
# maps the server's sealed memfd (bitwise equal files, nothing on the wire),
# --transport overrides and their errors, --no-shm and the fallback, a
# corrupted object, and processes killed with -9 leave no object behind
# (nothing in /dev/shm, no descriptor or mapping of the server's objects in
# any process).  A push from this host hands the version over the same way:
# the pusher's memfd becomes the server's (push --transport stream: chunks).
bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load 'sync_helper'

setup() {
	T=$BATS_TEST_TMPDIR
	PORT=$(free_port)
	URL=tcp://127.0.0.1:$PORT
	mkdir -p "$T/ck"
	head -c 3000000 /dev/urandom >"$T/ck/model.safetensors"
	echo '{"model_type":"gpt2"}' >"$T/ck/config.json"
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

# processes holding a descriptor or a mapping of objects named
# memfd:rlsync-$1-v* ($1: the pid of the process that made them)
holders() {
	grep -l "memfd:rlsync-$1-v" /proc/[0-9]*/maps 2>/dev/null || true
	for f in /proc/[0-9]*/fd/*; do
		case $(readlink "$f" 2>/dev/null) in *"memfd:rlsync-$1-v"*) echo "$f" ;; esac
	done
}

# the memfd the server holds for version $1: "rlsync-PID-vN" (PID: the
# server's, or the pusher's when the version was pushed from this host)
held_memfd() {
	for f in /proc/"$SPID"/fd/*; do
		case $(readlink "$f" 2>/dev/null) in
		*"memfd:rlsync-"*"-v$1 (deleted)") readlink "$f" | sed 's|^/memfd:||; s| (deleted)$||'; return 0 ;;
		esac
	done
	return 1
}

@test "pull over shared memory: bitwise equal, nothing on the wire, the server holds a sealed memfd" {
	serve
	rl-sync push "$URL" "$T/ck" 2>/dev/null
	run --separate-stderr rl-sync pull "$URL" --out "$T/out" --transport shm -v
	assert_success
	[[ $stderr == *'mapped from shared memory'* ]]
	[[ $stderr == *'over shared memory in'* ]]
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
	cmp "$T/ck/config.json" "$T/out/latest/config.json"
	# auto picks it too on this host
	run --separate-stderr rl-sync pull "$URL" --out "$T/out2" -v
	assert_success
	[[ $stderr == *'over shared memory in'* ]]
	cmp "$T/ck/model.safetensors" "$T/out2/latest/model.safetensors"
	run --separate-stderr rl-sync status "$URL"
	assert_line --regexp '^shared memory: @rlsync-.* \(2 versions handed out, 1 pushed\)$'
	# the server holds the object the pusher made
	run held_memfd 1
	assert_success
	assert_output --regexp '^rlsync-[0-9]+-v1$'
	refute_output "rlsync-$SPID-v1"
}

@test "push from this host: the version goes as shared memory, no delta; --transport stream sends chunks" {
	serve
	run --separate-stderr rl-sync push "$URL" "$T/ck" -v
	assert_success
	[[ $stderr == *'handed over as shared memory'* ]]
	wire=$(echo "$stderr" | sed -n 's/.* as \([0-9]*\) on the wire.*/\1/p')
	[ "$wire" -lt 10000 ]
	rl-sync pull "$URL" --out "$T/out" --transport shm
	cmp "$T/ck/model.safetensors" "$T/out/latest/model.safetensors"
	cp -r "$T/ck" "$T/ck2"
	printf 'XYZ' | dd of="$T/ck2/model.safetensors" bs=1 seek=1000 conv=notrunc 2>/dev/null
	# --delta to a server on this host: still shared memory (auto)
	run --separate-stderr rl-sync push "$URL" "$T/ck2" --delta "$T/out/latest" -v
	assert_success
	[[ $stderr == *'pushed version 2'* && $stderr == *'handed over as shared memory'* ]]
	run rl-sync status "$URL"
	assert_line --partial 'version 2: 3000022 bytes'
	refute_line --partial 'delta from'
	assert_line --regexp '\(1 versions handed out, 2 pushed\)$'
	rl-sync pull "$URL" --out "$T/out" --transport stream
	cmp "$T/ck2/model.safetensors" "$T/out/latest/model.safetensors"
	# forced shm to a server without it fails; stream and nng send chunks
	run --separate-stderr rl-sync push "$URL" "$T/ck" --transport stream -v
	assert_success
	[[ $stderr != *'shared memory'* ]]
	run --separate-stderr -2 rl-sync push "$URL" "$T/ck" --transport file
	kill "$SPID"
	wait "$SPID" || true
	serve --no-shm
	run --separate-stderr -1 rl-sync push "$URL" "$T/ck" --transport shm
	[[ $stderr == *'over shared memory'*'not supported'* && $stderr == *'hint: '* ]]
	run --separate-stderr rl-sync push "$URL" "$T/ck"
	assert_success
	rl-sync pull "$URL" --out "$T/o2"
	cmp "$T/ck/model.safetensors" "$T/o2/latest/model.safetensors"
}

@test "--transport stream and nng do not use shared memory; a bad name is a usage error" {
	serve
	rl-sync push "$URL" "$T/ck" 2>/dev/null
	run --separate-stderr rl-sync pull "$URL" --out "$T/a" --transport stream -v
	assert_success
	[[ $stderr == *'over the bulk stream'* && $stderr != *'shared memory'* ]]
	run --separate-stderr rl-sync pull "$URL" --out "$T/b" --transport nng -v
	assert_success
	[[ $stderr != *'bulk stream'* && $stderr != *'shared memory'* ]]
	cmp "$T/ck/model.safetensors" "$T/b/latest/model.safetensors"
	run --separate-stderr -2 rl-sync pull "$URL" --out "$T/c" --transport carrier-pigeon
	[[ $stderr == *"--transport: bad value 'carrier-pigeon' (auto, shm, stream or nng)"* ]]
	run --separate-stderr -2 rl-sync pull "$URL" --out "$T/c" --transport file
	[ ! -e "$T/c" ]
}

@test "a server with --no-shm: forced shm fails with a hint, auto falls back with a verbose note" {
	serve --no-shm
	rl-sync push "$URL" "$T/ck" 2>/dev/null
	run --separate-stderr -1 rl-sync pull "$URL" --out "$T/a" --transport shm
	[[ $stderr == *'over shared memory'*'not supported'* ]]
	[[ $stderr == *'hint: '* ]]
	[ ! -e "$T/a/latest" ]
	run --separate-stderr rl-sync pull "$URL" --out "$T/b"
	assert_success
	[[ $stderr != *'shared memory'* ]]
	run --separate-stderr rl-sync pull "$URL" --out "$T/c" -v
	assert_success
	[[ $stderr == *'not over shared memory (not supported); fetching over the stream'* ]]
	cmp "$T/ck/model.safetensors" "$T/c/latest/model.safetensors"
}

@test "a corrupted shared memory object is detected: exit 4 with shm, the stream with auto" {
	RL_WSYNC_TEST_CORRUPT_SHM=1 serve
	# chunks: the server makes (and the hook corrupts) its own object
	rl-sync push "$URL" "$T/ck" --transport stream 2>/dev/null
	run --separate-stderr -4 rl-sync pull "$URL" --out "$T/a" --transport shm
	[[ $stderr == *'checksum mismatch'* ]]
	[ ! -e "$T/a/latest" ]
	run --separate-stderr rl-sync pull "$URL" --out "$T/b" -v
	assert_success
	[[ $stderr == *'does not match its checksums'* ]]
	[[ $stderr == *'fetching over the stream'* ]]
	cmp "$T/ck/model.safetensors" "$T/b/latest/model.safetensors"
}

@test "killed with -9, server and puller leave no shared memory behind" {
	ls /dev/shm >"$T/shm.before"
	serve
	rl-sync push "$URL" "$T/ck" 2>/dev/null
	# a following puller keeps the version it holds mapped
	rl-sync pull "$URL" --out "$T/f" --follow -v 3>&- 2>"$T/pull.err" &
	PP=$!
	PIDS="$PIDS $PP"
	for _ in $(seq 50); do
		[ -e "$T/f/latest" ] && break
		sleep 0.1
	done
	[ -e "$T/f/latest" ]
	# pushed from this host: the object is the pusher's, named with its pid
	obj=$(held_memfd 1)
	maker=$(echo "$obj" | sed 's/^rlsync-\([0-9]*\)-v1$/\1/')
	[ -n "$maker" ] && [ "$maker" != "$SPID" ]
	grep -q "memfd:$obj" "/proc/$PP/maps"
	kill -9 "$SPID"
	wait "$SPID" 2>/dev/null || true
	# the puller still maps it: the object lives while someone uses it
	grep -q "memfd:$obj" "/proc/$PP/maps"
	kill -9 "$PP"
	wait "$PP" 2>/dev/null || true
	run holders "$maker"
	assert_output ''
	run holders "$SPID"
	assert_output ''
	ls /dev/shm >"$T/shm.after"
	cmp "$T/shm.before" "$T/shm.after"
	# a restarted server on the same URL serves new objects; the old ones are gone
	serve
	rl-sync push "$URL" "$T/ck" 2>/dev/null
	run --separate-stderr rl-sync pull "$URL" --out "$T/g" --transport shm
	assert_success
	cmp "$T/ck/model.safetensors" "$T/g/latest/model.safetensors"
}

@test "rl-rollout --sync-transport: a bad name and a missing --sync are usage errors" {
	run --separate-stderr -2 rl-rollout -m "$T/nomodel" --sync-transport bogus
	[[ $stderr == *"--sync-transport: want auto, shm, stream, nng or file, not 'bogus'"* ]]
	run --separate-stderr -2 rl-rollout -m "$T/nomodel" --sync-transport shm
	[[ $stderr == *'--sync-transport needs --sync URL'* ]]
}

@test "rl-train --sync: shared memory to a server on this host; --sync-transport stream sends deltas" {
	toy_model "$T" 3
	for i in $(seq 8); do echo '{"prompt":"x"}'; done >"$T/p.jsonl"
	rl-rollout -q -m "$T/m0" -n 4 --max-tokens 2 --seed 1 "$T/p.jsonl" | rl-reward -q --task 'format:^[a-z]' >"$T/s.jsonl"
	serve
	run --separate-stderr rl-train -v -m "$T/m0" --out "$T/ck" --sync "$URL" --batch 2 --lr 1e-2 "$T/s.jsonl"
	assert_success
	[[ $stderr == *'handed over as shared memory'* ]]
	run rl-sync status "$URL"
	assert_line 'latest: 4'
	assert_line --regexp ', 4 pushed\)$'
	refute_line --partial 'delta from'
	rl-sync pull "$URL" --out "$T/o" --transport stream
	cmp "$T/ck/step-00000004/model.safetensors" "$T/o/latest/model.safetensors"
	kill "$SPID"
	wait "$SPID" || true
	serve
	run --separate-stderr rl-train -v -m "$T/m0" --out "$T/ck2" --sync "$URL" --sync-transport stream \
	    --batch 2 --lr 1e-2 "$T/s.jsonl"
	assert_success
	[[ $stderr != *'shared memory'* ]]
	run rl-sync status "$URL"
	assert_line 'latest: 4'
	assert_line --partial 'delta from 3'
	assert_line --regexp ', 0 pushed\)$'
	run --separate-stderr -2 rl-train -m "$T/m0" --out "$T/ck3" --sync-transport shm "$T/s.jsonl"
	[[ $stderr == *'--sync-transport needs --sync URL'* ]]
}

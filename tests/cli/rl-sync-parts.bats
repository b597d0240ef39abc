#!/usr/bin/env bats
# rl-sync: a version pushed in parts by several processes at once (push
# --part I/N, docs/sync.md "A version pushed in parts"):
# - 2 parts pushed at once: one version, whose files a worker pulls equal to
#   those of the same directory pushed whole; parts as deltas against the
#   previous version's files;
# - a duplicated part, a part of another version, another part count, a
#   part whose chunks fail their checksum, two parts with the same file, a
#   part missing past --part-timeout: each refused (or the version
#   aborted), nothing published.
bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load 'sync_helper'

setup() {
	T=$BATS_TEST_TMPDIR
	PORT=$(free_port)
	URL=tcp://127.0.0.1:$PORT
	# a sharded Hugging Face directory, and its files split in 2 parts
	mkdir -p "$T/ck" "$T/p0" "$T/p1"
	head -c 3000000 /dev/urandom >"$T/ck/model-00001-of-00002.safetensors"
	head -c 2500000 /dev/urandom >"$T/ck/model-00002-of-00002.safetensors"
	echo '{"model_type":"qwen2"}' >"$T/ck/config.json"
	echo '{"weight_map":{}}' >"$T/ck/model.safetensors.index.json"
	cp "$T/ck/config.json" "$T/ck/model.safetensors.index.json" "$T/ck/model-00001-of-00002.safetensors" "$T/p0/"
	cp "$T/ck/model-00002-of-00002.safetensors" "$T/p1/"
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

latest() { rl-sync status "$URL" --json | jq -r .latest; }
# same_files A B: the same files with the same bytes (rlsync.json aside)
same_files() { diff -r -x rlsync.json "$1" "$2"; }

@test "2 parts pushed at once are one version, equal to the same files pushed whole" {
	serve --keep-previous
	rl-sync push "$URL" "$T/ck" --version 1 -q
	rl-sync push "$URL" "$T/p0" --version 2 --part 0/2 2>"$T/e0" &
	a=$!
	rl-sync push "$URL" "$T/p1" --version 2 --part 1/2 2>"$T/e1" &
	b=$!
	wait $a
	wait $b
	# one of the two pushes completed the version
	[ "$(cat "$T/e0" "$T/e1" | grep -c 'the version is published')" = 1 ]
	[ "$(cat "$T/e0" "$T/e1" | grep -c 'waits for its other parts')" = 1 ]
	[ "$(latest)" = 2 ]
	rl-sync status "$URL" --json | jq -e '.versions_from_parts == 1 and .parts == null'
	# a worker sees one version: the files of the whole push
	rl-sync pull "$URL" --out "$T/w2" -q
	[ "$(readlink "$T/w2/latest")" = v000002 ]
	same_files "$T/w2/latest" "$T/ck"
	rl-sync pull "$URL" --out "$T/w1" --version 1 -q
	same_files "$T/w2/latest" "$T/w1/v000001"
	# the version hash is over names, sizes and piece hashes: the one a
	# whole push of the same files at the same number would have
	rl-sync publish "$T/pub" "$T/ck" --version 2 -q
	[ "$(jq -r .hash "$T/w2/latest/rlsync.json")" = "$(jq -r .hash "$T/pub/v000002/rlsync.json")" ]
}

@test "parts as deltas against the previous version's files" {
	serve
	rl-sync push "$URL" "$T/p0" --version 1 --part 0/2 -q
	rl-sync push "$URL" "$T/p1" --version 1 --part 1/2 -q
	# each pusher's previous part, as a directory that knows its version
	rl-sync publish "$T/b0" "$T/p0" --version 1 -q
	rl-sync publish "$T/b1" "$T/p1" --version 1 -q
	cp -r "$T/p0" "$T/q0"
	cp -r "$T/p1" "$T/q1"
	printf 'xyz' | dd of="$T/q1/model-00002-of-00002.safetensors" bs=1 seek=1000 conv=notrunc 2>/dev/null
	rl-sync push "$URL" "$T/q0" --version 2 --part 0/2 --delta "$T/b0/v000001" --transport stream 2>"$T/e0"
	rl-sync push "$URL" "$T/q1" --version 2 --part 1/2 --delta "$T/b1/v000001" --transport stream 2>"$T/e1"
	# a few hundred bytes on the wire for 5.5 MB of parts
	for f in "$T/e0" "$T/e1"; do
		n=$(sed -n 's/.* bytes as \([0-9]*\) on the wire.*/\1/p' "$f")
		[ -n "$n" ] && [ "$n" -lt 20000 ]
	done
	rl-sync pull "$URL" --out "$T/w" -q
	[ "$(readlink "$T/w/latest")" = v000002 ]
	cp -r "$T/q0/." "$T/q1/."
	same_files "$T/w/latest" "$T/q1"
}

@test "a duplicated part, a part of another version, another part count: refused, nothing published" {
	serve
	rl-sync push "$URL" "$T/p0" --version 1 --part 0/2 -q
	run -1 --separate-stderr rl-sync push "$URL" "$T/p0" --version 1 --part 0/2
	[[ "$stderr" == *"part 0 of version 1 is in already (a duplicate)"* ]]
	run -1 --separate-stderr rl-sync push "$URL" "$T/p1" --version 2 --part 1/2
	[[ "$stderr" == *"part 1 of version 2 refused: version 1 is being assembled from parts (1 of 2 in)"* ]]
	run -1 --separate-stderr rl-sync push "$URL" "$T/p1" --version 1 --part 1/3
	[[ "$stderr" == *"part 1 of 3 refused: version 1 comes in 2 parts"* ]]
	[ "$(latest)" = 0 ]
	rl-sync status "$URL" --json | jq -e '.parts.version == 1 and .parts.in == 1 and .parts_refused == 3'
	# the right part completes it
	rl-sync push "$URL" "$T/p1" --version 1 --part 1/2 -q
	[ "$(latest)" = 1 ]
	# a part of a version published already: not newer
	run -1 --separate-stderr rl-sync push "$URL" "$T/p1" --version 1 --part 1/2
	[[ "$stderr" == *"version 1 is not newer than the latest, 1"* ]]
}

@test "a part whose chunks fail their checksum, or two parts with one file: refused, nothing published" {
	serve
	# every chunk of part 1 goes corrupted, also when re-sent
	rl-sync push "$URL" "$T/p0" --version 1 --part 0/2 -q
	RL_WSYNC_TEST_CORRUPT_PUSH=1000 run -4 --separate-stderr rl-sync push "$URL" "$T/p1" --version 1 --part 1/2 \
	    --transport stream
	[[ "$stderr" == *"chunk 0 of version 1 rejected by the server after 4 tries"* ]]
	[ "$(latest)" = 0 ]
	rl-sync status "$URL" --json | jq -e '.push_chunks_rejected >= 4 and .parts.in == 1'
	# config.json in both parts: the version is refused when the last is in
	cp "$T/p0/config.json" "$T/p1/"
	run -1 --separate-stderr rl-sync push "$URL" "$T/p1" --version 1 --part 1/2
	[[ "$stderr" == *"version 1 not published: blob 'config.json' of part 1 is in an earlier part too"* ]]
	[ "$(latest)" = 0 ]
	rl-sync status "$URL" --json | jq -e '.parts == null and .versions_from_parts == 0'
}

@test "a part missing past --part-timeout: the version is aborted, nothing published" {
	serve --part-timeout 1
	rl-sync push "$URL" "$T/p0" --version 1 --part 0/2 -q
	rl-sync status "$URL" --json | jq -e '.parts.version == 1'
	sleep 1.5
	rl-sync status "$URL" --json | jq -e '.parts == null and .part_versions_aborted == 1 and .latest == 0'
	grep -q "version 1 aborted: part(s) 1 of 2 not in 1 s after its first part began; nothing of it published" \
	    "$T/serve.err"
	# the next version's parts are taken
	rl-sync push "$URL" "$T/p0" --version 2 --part 0/2 -q
	rl-sync push "$URL" "$T/p1" --version 2 --part 1/2 -q
	[ "$(latest)" = 2 ]
}

@test "push --part and serve --part-timeout: usage errors" {
	run -2 rl-sync push tcp://127.0.0.1:1 "$T/p0" --part 0/2
	assert_output --partial "give the version the parts belong to: --version N"
	run -2 rl-sync push tcp://127.0.0.1:1 "$T/p0" --version 1 --part 2/2
	assert_output --partial "--part: bad value '2/2'"
	run -2 rl-sync push tcp://127.0.0.1:1 "$T/p0" --version 1 --part 1
	assert_output --partial "--part: bad value '1'"
	run -2 rl-sync push tcp://127.0.0.1:1 "$T/p0" --version 1 --part 0/2 --rewind
	assert_output --partial "a rewind goes whole, not in parts"
	run -2 rl-sync serve --part-timeout 0
	assert_output --partial "--part-timeout: bad value '0'"
	run -2 rl-sync pull tcp://127.0.0.1:1 --out "$T/x" --part 0/2
	assert_output --partial "--part is an option of push"
}

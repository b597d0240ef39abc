#!/usr/bin/env bats
# rl-queue cat: JSONL <-> binary conversion, exit codes, and errors for bad
# streams naming the file and the byte offset or line.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup() {
	bats_require_minimum_version 1.5.0
	D=$BATS_TEST_TMPDIR
	cat > "$D/a.jsonl" <<'J'
{"id":1,"group":7,"index":0,"group_size":2,"version":[3,3],"prompt":[1,2,3],"response":[4,5],"logprobs":[-0.5,-1.25],"reward":1,"finish":"eos","meta":{"answer":"42","n":[1,2.5]},"prompt_text":"Q: 6*7?\n\"quoted\" café"}
{"id":"18446744073709551615","group":7,"index":1,"t40000":{"dtype":"F64","data":[1e+300,"-inf"]},"t50000":{"dtype":99,"hex":"00ff"},"logprobs":[0.1,-3.40282347e+38],"ts_created":1763800000.25}
J
}

@test "cat --help prints usage to stdout and exits 0" {
	run --separate-stderr rl-queue cat --help
	assert_success
	assert_output --partial "usage: rl-queue cat"
	[ -z "$stderr" ]
}

@test "rl-queue --help lists cat; no command or an unknown one is a usage error" {
	run --separate-stderr rl-queue --help
	assert_success
	assert_output --partial "cat"
	run -2 --separate-stderr rl-queue
	run -2 --separate-stderr rl-queue frobnicate
	[[ "$stderr" == *"unknown command 'frobnicate'"* ]]
}

@test "bad options exit 2" {
	run -2 --separate-stderr rl-queue cat --no-such-option
	[[ "$stderr" == *"unknown option"* ]]
	run -2 --separate-stderr rl-queue cat --batch 0 "$D/a.jsonl"
	[[ "$stderr" == *"--batch"* ]]
	run -2 --separate-stderr rl-queue cat --max-frame lots "$D/a.jsonl"
	run -2 --separate-stderr rl-queue cat -o
}

@test "JSONL -> binary -> JSONL gives the same records" {
	run --separate-stderr rl-queue cat "$D/a.jsonl"
	assert_success
	[ "$output" = "$(cat "$D/a.jsonl")" ]
	rl-queue cat --stream "$D/a.jsonl" > "$D/a.rlt"
	zstd -q -t "$D/a.rlt"
	run --separate-stderr rl-queue cat "$D/a.rlt"
	assert_success
	[ "$output" = "$(cat "$D/a.jsonl")" ]
}

@test "binary -> JSONL -> binary is byte-identical" {
	rl-queue cat --stream "$D/a.jsonl" > "$D/a.rlt"
	rl-queue cat "$D/a.rlt" | rl-queue cat --stream - > "$D/b.rlt"
	cmp "$D/a.rlt" "$D/b.rlt"
}

@test "binary frames pass through --stream unchanged; several files and stdin" {
	rl-queue cat --stream --level 9 "$D/a.jsonl" > "$D/a.rlt"
	rl-queue cat --stream -b 1 "$D/a.jsonl" > "$D/b.rlt"
	rl-queue cat --stream "$D/a.rlt" - < "$D/b.rlt" > "$D/c.rlt"
	cat "$D/a.rlt" "$D/b.rlt" | cmp - "$D/c.rlt"
	run --separate-stderr rl-queue cat "$D/c.rlt"
	assert_success
	[ "${#lines[@]}" -eq 4 ]
}

@test "--stream -b N cuts JSONL input into frames of N records" {
	seq 600 | awk '{printf "{\"id\":%d,\"response\":[1,2]}\n", $1}' > "$D/600.jsonl"
	for b in 1:600 7:86 256:3 1000:1; do
		rl-queue cat --stream -b "${b%%:*}" "$D/600.jsonl" > "$D/600.rlt"
		run zstd -l "$D/600.rlt"
		[ "$(echo "$output" | awk 'NR==2 {print $1}')" = "${b#*:}" ]
		run rl-queue cat "$D/600.rlt"
		[ "${#lines[@]}" = 600 ]
	done
}

@test "--stream (and get --stream) refuse a terminal, as rl-rollout and rl-reward do; JSONL goes to one" {
	command -v script >/dev/null || skip "script(1) is not installed"
	run -2 script -qec "rl-queue cat --stream '$D/a.jsonl'" /dev/null
	assert_output --partial "cat: refusing to write a binary stream to a terminal"
	[[ "$output" != *$'\x28\xb5\x2f\xfd'* ]]   # no zstd frame reached it
	run -2 script -qec "rl-queue get --stream --stage rollout tcp://127.0.0.1:9" /dev/null
	assert_output --partial "get: refusing to write a binary stream to a terminal"
	run -0 script -qec "rl-queue cat '$D/a.jsonl'" /dev/null
	assert_output --partial '"prompt_text":'
	# not a terminal: as before
	rl-queue cat --stream "$D/a.jsonl" | rl-queue cat > "$D/back.jsonl"
	[ "$(wc -l < "$D/back.jsonl")" -eq 2 ]
}

@test "-o writes the file only on success" {
	run --separate-stderr rl-queue cat --stream -o "$D/out.rlt" "$D/a.jsonl"
	assert_success
	[ -z "$output" ]
	[ -s "$D/out.rlt" ]
	printf 'not json\n' > "$D/bad.jsonl"
	cp "$D/out.rlt" "$D/keep.rlt"
	run -1 --separate-stderr rl-queue cat --stream -o "$D/out.rlt" "$D/a.jsonl" "$D/bad.jsonl"
	cmp "$D/out.rlt" "$D/keep.rlt"
	[ "$(ls "$D" | grep -c tmp)" -eq 0 ]
}

@test "missing file: exit 1 naming it" {
	run -1 --separate-stderr rl-queue cat "$D/nope.rlt"
	[[ "$stderr" == *"cannot open '$D/nope.rlt'"* ]]
}

@test "truncated stream: exit 1 naming file and byte offset" {
	rl-queue cat --stream "$D/a.jsonl" > "$D/a.rlt"
	size=$(stat -c %s "$D/a.rlt")
	head -c $((size - 7)) "$D/a.rlt" > "$D/t.rlt"
	run -1 --separate-stderr rl-queue cat "$D/t.rlt"
	[[ "$stderr" == *"'$D/t.rlt': byte 0: truncated frame"* ]]
	[ -z "$output" ]
}

@test "a flipped byte: exit 1 naming the file" {
	rl-queue cat --stream "$D/a.jsonl" > "$D/a.rlt"
	cp "$D/a.rlt" "$D/f.rlt"
	printf '\377' | dd of="$D/f.rlt" bs=1 seek=40 conv=notrunc 2>/dev/null
	run -1 --separate-stderr rl-queue cat "$D/f.rlt"
	[[ "$stderr" == *"'$D/f.rlt': frame at byte 0"* ]]
}

@test "not a stream (wrong magic): exit 1" {
	printf 'hello world\n' > "$D/h.txt"
	run -1 --separate-stderr rl-queue cat "$D/h.txt"
	[[ "$stderr" == *"'$D/h.txt': byte 0: not a trajectory stream"* ]]
	# a JSON array, or text whose first byte could start a skippable zstd frame ('[', 'Z'):
	# said so, not "bad magic"
	printf '[1, 2]\n' > "$D/arr.txt"
	run -1 --separate-stderr rl-queue cat "$D/arr.txt"
	[[ "$stderr" == *"'$D/arr.txt': byte 0: not a trajectory stream (starts with a JSON array"* ]]
	printf 'Zebra\n' > "$D/z.txt"
	run -1 --separate-stderr rl-queue cat "$D/z.txt"
	[[ "$stderr" == *"'$D/z.txt': byte 0: not a trajectory stream (starts with text"* ]]
	# a good frame followed by garbage: the offset of the garbage
	rl-queue cat --stream "$D/a.jsonl" > "$D/g.rlt"
	size=$(stat -c %s "$D/g.rlt")
	printf '\050\265\057\375junk' >> "$D/g.rlt"
	run -1 --separate-stderr rl-queue cat "$D/g.rlt"
	[[ "$stderr" == *"'$D/g.rlt': byte $size:"* ]]
}

@test "wrong batch magic or version inside a valid frame: exit 1 with a hint" {
	rl-queue cat --stream "$D/a.jsonl" | zstd -q -d > "$D/raw"
	cp "$D/raw" "$D/v2"
	printf '\002' | dd of="$D/v2" bs=1 seek=4 conv=notrunc 2>/dev/null
	zstd -q "$D/v2" -o "$D/v2.rlt"
	run -1 --separate-stderr rl-queue cat "$D/v2.rlt"
	[[ "$stderr" == *"'$D/v2.rlt': frame at byte 0: batch format version 2; this build reads version 1"* ]]
	[[ "$stderr" == *"hint:"* ]]
	cp "$D/raw" "$D/m"
	printf 'X' | dd of="$D/m" bs=1 seek=0 conv=notrunc 2>/dev/null
	zstd -q "$D/m" -o "$D/m.rlt"
	run -1 --separate-stderr rl-queue cat "$D/m.rlt"
	[[ "$stderr" == *"not a trajectory batch (bad magic"* ]]
}

@test "a record length larger than the data: exit 1 naming record and offset" {
	rl-queue cat --stream "$D/a.jsonl" | zstd -q -d > "$D/raw"
	printf '\000\000\001' | dd of="$D/raw" bs=1 seek=17 conv=notrunc 2>/dev/null
	zstd -q "$D/raw" -o "$D/l.rlt"
	run -1 --separate-stderr rl-queue cat "$D/l.rlt"
	[[ "$stderr" == *"'$D/l.rlt': frame at byte 0: record 0 at batch byte 16: record length"*"larger than the"* ]]
}

# raw_meta TEXT: a one-record binary batch (id 5, meta TEXT as a JSON field,
# tag 15 dtype 65, NUL-padded) on stdout, uncompressed
raw_meta() {
	python3 - "$1" <<'PY'
import struct, sys
def field(tag, dt, data, nul):
    raw = data + (b"\0" if nul else b"")
    return struct.pack("<HBBI", tag, dt, 0, len(data)) + raw + b"\0" * (-len(raw) % 8)
body = field(1, 10, struct.pack("<Q", 5), False) + field(15, 65, sys.argv[1].encode(), True)
sys.stdout.buffer.write(b"RLTJ" + struct.pack("<HHII", 1, 16, 1, 0) + struct.pack("<II", 8 + len(body), 2) + body)
PY
}

@test "a JSON field holding invalid JSON: exit 1 naming file, frame, record and field" {
	raw_meta '{"a":1}' | zstd -q -c --check > "$D/ok.rlt"
	run --separate-stderr rl-queue cat "$D/ok.rlt"
	assert_success
	assert_output '{"id":5,"meta":{"a":1}}'
	raw_meta '{not json' | zstd -q -c --check > "$D/j.rlt"
	run -1 --separate-stderr rl-queue cat --stream "$D/j.rlt"
	[[ "$stderr" == *"'$D/j.rlt': frame at byte 0: record 0 at batch byte 16: field 1 (tag 15) at record byte 24: not valid JSON"* ]]
	[ -z "$output" ]
}

@test "decompressed size over the limit: exit 1" {
	rl-queue cat --stream "$D/a.jsonl" > "$D/a.rlt"
	run -1 --separate-stderr rl-queue cat --max-frame 100 "$D/a.rlt"
	[[ "$stderr" == *"'$D/a.rlt': byte 0: decompressed size"*"over the limit of 100 bytes"* ]]
	# a frame without a size in its header (zstd fed from a pipe) is bounded too
	rl-queue cat --stream "$D/a.jsonl" | zstd -q -d | zstd -q -c > "$D/nosize.rlt"
	run --separate-stderr rl-queue cat "$D/nosize.rlt"
	assert_success
	run -1 --separate-stderr rl-queue cat --max-frame 100 "$D/nosize.rlt"
	[[ "$stderr" == *"over the limit of 100 bytes"* ]]
}

@test "JSONL line that is not an object: exit 1 naming file and line" {
	printf '{"id":1}\n\n[1,2]\n' > "$D/n.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/n.jsonl"
	[[ "$stderr" == *"'$D/n.jsonl': line 3: expected a JSON object, got an array"* ]]
	printf '{"id":1}\n{"id": \n' > "$D/p.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/p.jsonl"
	[[ "$stderr" == *"'$D/p.jsonl': line 2: invalid JSON"* ]]
}

@test "a bad JSONL line: the records before it are written, then exit 1" {
	# 300 good lines (more than one 256-line reader batch), then a broken one
	for i in $(seq 1 300); do printf '{"id":%d}\n' "$i"; done > "$D/l.jsonl"
	printf '{"id": \n{"id":999}\n' >> "$D/l.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/l.jsonl"
	[[ "$stderr" == *"'$D/l.jsonl': line 301: invalid JSON"* ]]
	[ "${#lines[@]}" -eq 300 ]
	[ "${lines[299]}" = '{"id":300}' ]
	# the same with --stream: the frames hold all 300
	rl-queue cat --stream "$D/l.jsonl" 2>/dev/null | rl-queue cat | wc -l | grep -qx 300
}

@test "JSONL field of the wrong type: exit 1 naming line and field" {
	printf '{"id":1,"reward":"high"}\n' > "$D/w.jsonl"
	run -1 --separate-stderr rl-queue cat --stream "$D/w.jsonl"
	[[ "$stderr" == *"'$D/w.jsonl': line 1: field 'reward': expected a number, got a string"* ]]
	printf '{"prompt":[1,2,"x"]}\n' > "$D/w2.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/w2.jsonl"
	[[ "$stderr" == *"line 1: field 'prompt' element 2: expected an integer, got a string"* ]]
	for v in '[]' '[3]' '[0,1,2]'; do
		printf '{"id":1,"version":%s}\n' "$v" > "$D/v.jsonl"
		run -1 --separate-stderr rl-queue cat "$D/v.jsonl"
		[[ "$stderr" == *"line 1: field 'version': wants [first, last], two integers"* ]]
	done
	printf '{"question":"?"}\n' > "$D/w3.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/w3.jsonl"
	[[ "$stderr" == *"unknown field 'question'"* ]]
}

@test "JSONL from a live pipe comes out as it comes in, not after 256 lines" {
	mkfifo "$D/fifo"
	rl-queue cat "$D/fifo" | cat > "$D/live.out" &
	local cat=$!
	exec 4>"$D/fifo"
	printf '{"id":1}\n{"id":2}\n' >&4
	for _ in $(seq 100); do
		[ "$(wc -l < "$D/live.out")" -ge 2 ] && break
		sleep 0.1
	done
	local n; n=$(wc -l < "$D/live.out")
	printf '{"id":3}\n' >&4
	exec 4>&-
	wait "$cat"
	[ "$n" -eq 2 ] || { echo "$n lines out while the pipe was open" >&2; return 1; }
	[ "$(wc -l < "$D/live.out")" -eq 3 ]
}

@test "\\u0000 in a JSONL value or name: exit 1 naming line and field, not a cut string" {
	printf '{"id":1}\n{"response_text":"x\\u0000yyyy"}\n' > "$D/z.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/z.jsonl"
	[[ "$stderr" == *"'$D/z.jsonl': line 2: field 'response_text': \u0000 in its name or value"* ]]
	printf '{"id":1,"meta":{"a":["b\\u0000c"]}}\n' > "$D/z2.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/z2.jsonl"
	[[ "$stderr" == *"line 1: field 'meta': \u0000 in its name or value"* ]]
	# in a name: cJSON would cut it to another name ("response_text" -> "response")
	printf '{"id":1,"response\\u0000_text":"x"}\n' > "$D/z4.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/z4.jsonl"
	[[ "$stderr" == *"line 1: field 'response': \u0000 in its name or value"* ]]
	# a raw NUL byte too: cJSON would cut the string there
	printf '{"id":1}\n{"id":2,"response_text":"a\0b"}\n' > "$D/z6.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/z6.jsonl"
	[[ "$stderr" == *"'$D/z6.jsonl': line 2: a NUL byte at byte 26, which JSON text cannot hold"* ]]
	assert_output '{"id":1}'
	printf '{"id":1}\0junk\n' > "$D/z5.jsonl"
	run -1 --separate-stderr rl-queue cat "$D/z5.jsonl"
	[[ "$stderr" == *"line 1: a NUL byte at byte 8"* ]]
	# an escaped backslash before u0000 is ordinary text
	printf '{"response_text":"ok\\\\u0000"}\n' > "$D/z3.jsonl"
	run --separate-stderr rl-queue cat "$D/z3.jsonl"
	assert_success
	assert_output '{"response_text":"ok\\u0000"}'
}

@test "write errors are failures" {
	[ -w /dev/full ] || skip "no /dev/full"
	run -1 --separate-stderr rl-queue cat "$D/a.jsonl" '>' /dev/full
	run -1 --separate-stderr sh -c "rl-queue cat '$D/a.jsonl' > /dev/full"
	[[ "$stderr" == *"cannot write"* ]]
}

@test "empty input has no records" {
	run --separate-stderr rl-queue cat /dev/null
	assert_success
	[ -z "$output" ]
}

@test "the EXAMPLES of rl-trajectory(5) run" {
	cp "$D/a.jsonl" "$D/samples.jsonl"
	man="$BATS_TEST_DIRNAME/../../man/rl-trajectory.5"
	sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$man" | sed -n 's/^\$ //p' > "$D/examples.sh"
	[ "$(wc -l < "$D/examples.sh")" -ge 3 ]
	run --separate-stderr sh -ec "cd '$D' && . ./examples.sh"
	assert_success
	assert_output --partial '"id":1,'
}

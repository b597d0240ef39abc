#!/usr/bin/env bats
# rl-queue serve / put / get / stat: usage, a whole pass of records through
# the stages, idempotent puts, bad input, an unreachable or busy broker,
# lease expiry, and a kill -9 of the broker with --data-dir.  Brokers listen
# on ipc:// sockets in a temp dir or on 127.0.0.1 and are killed by pid.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load queue_helper

setup() {
	bats_require_minimum_version 1.5.0
	D=$(mktemp -d /tmp/rlq-bats.XXXXXX)
	URL="ipc://$D/q.sock"   # start_broker picks a tcp:// URL
	PIDS=""
	write_records "$D"
}

teardown() {
	kill_pids
	rm -rf "$D"
}

# start_broker ARGS...: serve on $URL (tcp://127.0.0.1 on a port from
# free_port unless $FIXED is set) in the background, wait until it answers
start_broker() {
	for _ in $(seq 10); do
		[ -n "${FIXED:-}" ] || URL="tcp://127.0.0.1:$(free_port)"
		rl-queue serve --listen "$URL" -q "$@" 3>&- &
		BROKER=$!
		PIDS="$PIDS $BROKER"
		for _ in $(seq 100); do
			kill -0 "$BROKER" 2>/dev/null || break    # port taken: try another
			rl-queue stat --timeout 0.2 "$URL" >/dev/null 2>&1 && return 0
			sleep 0.05
		done
	done
	echo "broker did not start" >&2
	return 1
}

jget() { # jget KEY... < json: prints the number at that path
	python3 -c 'import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1:]: d=d[k]
print(d)' "$@"
}

@test "serve: a non-loopback --listen is refused (exit 2, nothing listens) unless --listen-public" {
	p=$(free_port)
	for u in tcp://0.0.0.0:$p "tcp://*:$p" tcp://:$p "tcp://[::]:$p" tcp://192.0.2.1:$p tcp://example.org:$p; do
		run -2 --separate-stderr timeout -k 20 5 rl-queue serve --listen "$u"
		[[ $stderr == *"refusing to listen on '$u': not a loopback address"* ]]
		[[ $stderr == *"--listen-public"* ]]
		run -3 --separate-stderr rl-queue stat --timeout 0.2 "tcp://127.0.0.1:$p"
	done
	rl-queue serve --listen "tcp://0.0.0.0:$p" --listen-public -q 3>&- &
	PIDS="$PIDS $!"
	for _ in $(seq 100); do rl-queue stat --timeout 0.2 "tcp://127.0.0.1:$p" >/dev/null 2>&1 && break; sleep 0.05; done
	run -0 rl-queue stat --timeout 1 "tcp://127.0.0.1:$p"
}

@test "help goes to stdout with exit 0 for every subcommand" {
	for c in serve put get stat; do
		run --separate-stderr rl-queue $c --help
		assert_success
		assert_output --partial "usage: rl-queue $c"
		[ -z "$stderr" ]
	done
	run --separate-stderr rl-queue --help
	assert_output --partial "serve"
	assert_output --partial "stat"
}

@test "usage errors exit 2" {
	run -2 --separate-stderr rl-queue put
	[[ "$stderr" == *"missing the broker URL"* ]]
	run -2 --separate-stderr rl-queue put --stage nowhere "$URL"
	[[ "$stderr" == *"--stage"* ]]
	run -2 --separate-stderr rl-queue get "$URL"
	[[ "$stderr" == *"--stage is required"* ]]
	run -2 --separate-stderr rl-queue get --stage train -n 0 "$URL"
	run -2 --separate-stderr rl-queue stat
	run -2 --separate-stderr rl-queue serve --max-staleness -1
	run -2 --separate-stderr rl-queue serve --stale sometimes
	run -2 --separate-stderr rl-queue serve --max-bytes 12
	run -2 --separate-stderr rl-queue serve extra-argument
	# sizes that would wrap (17179869185G << 30 was 1 GiB); the message names the option
	run -2 --separate-stderr timeout -k 20 5 rl-queue serve -l "ipc://$D/w.sock" -m 17179869185G 3>&-
	[[ "$stderr" == *"--max-bytes: bad value '17179869185G'"* ]]
	run -2 --separate-stderr rl-queue serve --max-msg 12
	[[ "$stderr" == *"--max-msg: bad value '12' (a size from 1024"* ]]
	[[ "$stderr" == *"hint: rl-queue serve --help"* ]]
	run -2 --separate-stderr rl-queue cat --max-frame 99999999999G /dev/null
	run -2 --separate-stderr rl-queue stat -c 0 "$URL"
	[[ "$stderr" == *"--count: bad value '0' (a whole number from 1 to"* ]]
	run -2 --separate-stderr rl-queue stat -w -c 1.5 "$URL"
}

@test "--train-batch counts groups, as rl-rollout's and rl-train's; the default gate is theirs (8)" {
	python3 -c 'import json
for i in range(20): print(json.dumps({"prompt": "p%d" % i}))' > "$D/p20.jsonl"
	start_broker --train-batch 2
	rl-queue put -q "$URL" "$D/p20.jsonl"
	# K = 0, B = 2 groups of 8 samples: two prompts, not the one that 2 samples would allow
	run -0 --separate-stderr rl-queue get --stage rollout -n 10 --group-size 8 "$URL"
	[ "${#lines[@]}" -eq 2 ]
	[ "$(rl-queue stat --json "$URL" | jget train_batch)" = 2 ]
	[ "$(rl-queue stat --json "$URL" | jget inflight_cap)" = 16 ]
	kill "$BROKER"; wait "$BROKER" 2>/dev/null || true
	# no --train-batch: 8 groups (before, 0: no gate, and K = 0 dropped almost every group)
	start_broker
	rl-queue put -q "$URL" "$D/p20.jsonl"
	run -0 --separate-stderr rl-queue get --stage rollout -n 20 --group-size 4 "$URL"
	[ "${#lines[@]}" -eq 8 ]
	[ "$(rl-queue stat --json "$URL" | jget train_batch)" = 8 ]
	# 0 still turns the gate off, with a warning saying what it costs
	run -2 --separate-stderr rl-queue serve --train-batch -1
	run -124 --separate-stderr timeout -s INT 1 rl-queue serve --listen "ipc://$D/tb0.sock" --train-batch 0 3>&-
	[[ "$stderr" == *"warning: serve: --train-batch 0: no admission gate"*"dropped"* ]]
}

@test "records pass through every stage; puts are idempotent" {
	start_broker --max-staleness 1 --train-batch 4
	run --separate-stderr rl-queue put "$URL" "$D/prompts.jsonl"
	assert_success
	[[ "$stderr" == *"3 accepted, 0 duplicates"* ]]
	run --separate-stderr rl-queue put "$URL" "$D/prompts.jsonl"
	assert_success
	[[ "$stderr" == *"0 accepted, 3 duplicates"* ]]
	[ "$(rl-queue stat --json "$URL" | jget depth prompt)" = 3 ]
	# the gate: (K+1) x B = 8 groups: all 3 prompts fit
	run --separate-stderr rl-queue get --stage rollout -n 5 "$URL"
	assert_success
	[ "${#lines[@]}" = 3 ]
	assert_output --partial '"prompt_text":"what is 1+1"'
	[ "$(rl-queue stat --json "$URL" | jget depth leased)" = 3 ]
	# scored samples (from a rollout + reward elsewhere), then train
	rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	[ "$(rl-queue stat --json "$URL" | jget ready_groups)" = 2 ]
	run --separate-stderr rl-queue get --stage train -n 3 --ack "$URL"
	assert_success
	[ "${#lines[@]}" = 4 ]          # whole groups: 2 + 2
	assert_output --partial '"id":22'
	json=$(rl-queue stat --json "$URL")
	[ "$(echo "$json" | jget total done)" = 4 ]
	[ "$(echo "$json" | jget groups)" = 3 ]   # the 3 prompts' groups
	# redelivered after done: dropped
	run --separate-stderr rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	[[ "$stderr" == *"0 accepted, 4 duplicates"* ]]
	run --separate-stderr rl-queue stat "$URL"
	assert_success
	assert_output --partial "depth: prompt 0 leased 3"
	assert_output --partial "staleness"
}

@test "binary streams go in and come out" {
	start_broker
	rl-queue cat --stream "$D/scored.jsonl" > "$D/scored.rlt"
	run --separate-stderr rl-queue put --stage generated "$URL" "$D/scored.rlt"
	assert_success
	[[ "$stderr" == *"4 accepted"* ]]
	rl-queue get --stage reward -n 4 --stream "$URL" > "$D/out.rlt"
	run --separate-stderr rl-queue cat "$D/out.rlt"
	assert_success
	[ "${#lines[@]}" = 4 ]
	assert_output --partial '"reward":1'
}

@test "put: a record whose prompt holds token ids stays a record, not a prompt line" {
	start_broker
	printf '{"id":1,"group":7,"group_size":2,"prompt":[101,102,103],"prompt_text":"hi","max_tokens":16}\n' > "$D/tok.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/tok.jsonl"
	assert_success
	run --separate-stderr rl-queue get -s rollout "$URL"
	assert_success
	assert_output --partial '"prompt":[101,102,103]'
	assert_output --partial '"prompt_text":"hi"'
	refute_output --partial '"meta"'
	# a list of messages still is a prompt line; a later line with token ids is an error there
	printf '%s\n' '{"prompt":[{"role":"user","content":"hi"}],"answer":"1"}' '{"prompt":[1,2]}' > "$D/mixed.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/mixed.jsonl"
	assert_failure 1
	[[ "$stderr" == *"mixed.jsonl"*"line 2"*"list of message objects"* ]]
	# messages rl-rollout would refuse are refused here, naming the line: a non-text
	# content part, an unknown chat_template_kwargs key; text parts are a prompt
	printf '%s\n' '{"prompt":[{"role":"user","content":[{"type":"text","text":"a"}]}]}' \
	    '{"prompt":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}' > "$D/parts.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/parts.jsonl"
	assert_failure 1
	[[ "$stderr" == *"parts.jsonl': line 2: message 1: content part 1 is of type \"input_audio\"; rlpipe renders text only"* ]]
	[[ "$stderr" == *"1 accepted"* ]]
	printf '%s\n' '{"prompt":"q","chat_template_kwargs":{"thinking":false}}' > "$D/kw.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/kw.jsonl"
	assert_failure 1
	[[ "$stderr" == *"kw.jsonl': line 1: chat_template_kwargs: \"thinking\" is not one rlpipe knows"* ]]
	# a prompt line with an escaped NUL: refused, not cut there
	printf '%s\n' '{"prompt":"a\u0000b"}' > "$D/nul.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/nul.jsonl"
	assert_failure 1
	[[ "$stderr" == *"nul.jsonl': line 1: field 'prompt': \u0000 (NUL) in its name or value"* ]]
}

@test "put -z on: zstd frames without a content size are recompressed, not refused" {
	start_broker
	printf '{"id":1,"response":[1]}\n' | rl-queue cat --stream | zstd -q -d | zstd -q -c > "$D/nosize.rlt"
	run --separate-stderr rl-queue put -s scored -z on -t 3 "$URL" "$D/nosize.rlt"
	assert_success
	[[ "$stderr" == *"1 accepted"* ]]
	run --separate-stderr rl-queue get -s train "$URL"
	assert_success
	assert_output --partial '"response":[1]'
}

@test "put reads records (not prompt lines) from a pipe; errors keep their line numbers" {
	start_broker
	run --separate-stderr bash -c "printf '{\"id\":99,\"prompt_text\":\"x\"}\\n' | rl-queue put '$URL'"
	assert_success
	[[ "$stderr" == *"1 accepted"* ]]
	run --separate-stderr bash -c "printf '\\n{\"id\":100,\"prompt_text\":\"y\"}\\n{\"id\": oops}\\n' | rl-queue put '$URL' -"
	assert_failure 1
	[[ "$stderr" == *"'<stdin>': line 3: invalid JSON"* ]]
	# the lines before the bad one are sent (as the frames before a bad frame are)
	[[ "$stderr" == *"put: 1 records: 1 accepted"* ]]
	run --separate-stderr rl-queue get -s rollout -n 5 "$URL"
	assert_line '{"id":99,"prompt_text":"x","group":99}'
	assert_line '{"id":100,"prompt_text":"y","group":100}'
	[ "${#lines[@]}" -eq 2 ]
}

@test "put: prompt lines before a bad one are sent; long prompt lines go in messages under the limit" {
	start_broker
	printf '{"prompt":"a"}\n{"prompt":"b"}\n{"prompt": oops}\n' > "$D/pl.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/pl.jsonl"
	assert_failure 1
	[[ "$stderr" == *"'$D/pl.jsonl': line 3: not a JSON object"* ]]
	[[ "$stderr" == *"put: 2 records: 2 accepted"* ]]
	# two "prompt" keys: cJSON took the first, Python's json the last; neither is guessed
	printf '{"prompt":"c"}\n{"prompt":"d","prompt":"e"}\n' > "$D/dup.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/dup.jsonl"
	assert_failure 1
	[[ "$stderr" == *"'$D/dup.jsonl': line 2: key \"prompt\" appears twice"* ]]
	# 256 prompts of 280 kB are over a put's 64 MiB: batches end at 8 MiB
	python3 -c "
import sys
x = 'x' * 280000
for i in range(260):
    sys.stdout.write('{\"prompt\":\"p%d %s\"}\n' % (i, x))" > "$D/big.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/big.jsonl"
	assert_success
	[[ "$stderr" == *"put: 260 records: 260 accepted"* ]]
}

@test "put from a live pipe: prompts and records go in as they come, not after 256 lines" {
	start_broker
	# a producer that keeps its pipe open (tail -f, a script): what it wrote is
	# in the broker while it still runs
	for kind in prompt record; do
		rm -f "$D/fifo"; mkfifo "$D/fifo"
		if [ $kind = prompt ]; then rl-queue put "$URL" "$D/fifo" 2>"$D/put.err" &
		else rl-queue put -s scored "$URL" "$D/fifo" 2>"$D/put.err" &
		fi
		local put=$! n=0 want=2
		[ $kind = record ] && want=$(( $(rl-queue stat -j "$URL" | jget total put_scored) + 2 ))
		exec 4>"$D/fifo"
		if [ $kind = prompt ]; then
			printf '{"prompt":"a"}\n{"prompt":"b"}\n' >&4
		else
			sed -n 1,2p "$D/scored.jsonl" >&4
		fi
		for _ in $(seq 100); do
			if [ $kind = prompt ]; then n=$(rl-queue stat -j "$URL" | jget total put_prompt)
			else n=$(rl-queue stat -j "$URL" | jget total put_scored); fi
			[ "$n" -ge "$want" ] && break
			sleep 0.1
		done
		exec 4>&-
		wait "$put"
		[ "$n" -ge "$want" ] || { cat "$D/put.err"; echo "$kind: $n in the broker while the pipe was open" >&2; return 1; }
	done
}

@test "a bad input file names file and line; the broker keeps serving" {
	start_broker
	printf '{"prompt_text":"ok"}\n{"prompt_text": oops}\n' > "$D/bad.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/bad.jsonl"
	assert_failure 1
	[[ "$stderr" == *"bad.jsonl"*"line 2"* ]]
	# a raw NUL byte in a prompt line would cut the prompt there
	printf '{"prompt_text":"ok2"}\n{"prompt_text":"a\0b"}\n' > "$D/nul.jsonl"
	run --separate-stderr rl-queue put "$URL" "$D/nul.jsonl"
	assert_failure 1
	[[ "$stderr" == *"nul.jsonl"*"line 2: a NUL byte at byte 17, which JSON text cannot hold"* ]]
	run --separate-stderr rl-queue put "$URL" "$D/missing.jsonl"
	assert_failure 1
	[[ "$stderr" == *"missing.jsonl"* ]]
	# a sample without id or group: put gives it an id from its bytes
	printf '{"response":[1]}\n' > "$D/noid.jsonl"
	run --separate-stderr rl-queue put -v --stage scored "$URL" "$D/noid.jsonl"
	echo "$stderr"
	assert_success
	run rl-queue stat --json "$URL"
	assert_success
}

@test "an unreachable broker: exit 3 after the timeout" {
	run --separate-stderr rl-queue stat --timeout 0.3 "ipc://$D/nobody.sock"
	assert_failure 3
	[[ "$stderr" == *"no reply from the broker"* ]]
	run --separate-stderr rl-queue put --timeout 0.5 "ipc://$D/nobody.sock" "$D/prompts.jsonl"
	assert_failure 3
	run --separate-stderr rl-queue get --stage train "ipc://$D/nobody.sock"
	assert_failure 3
}

@test "backpressure: a full broker says busy; put gives up after its timeout" {
	start_broker --max-bytes 1500
	run --separate-stderr rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	assert_success
	run --separate-stderr rl-queue put --timeout 0.5 "$URL" "$D/prompts.jsonl"
	assert_failure 3
	[[ "$stderr" == *"busy"* ]]
	[ "$(rl-queue stat --json "$URL" | jget total busy)" -gt 0 ]
	# a batch that can never fit is refused at once
	for i in $(seq 40); do printf '{"prompt_text":"%0200d"}\n' $i; done > "$D/big.jsonl"
	run --separate-stderr rl-queue put --timeout 5 "$URL" "$D/big.jsonl"
	assert_failure 1
	[[ "$stderr" == *"size over limit"* ]]
}

@test "--max-bytes counts the sample slots of each group (4 bytes per group_size)" {
	start_broker --max-bytes 8M
	# 256 one-record groups of group_size 65536: 64 MiB of slots
	python3 -c '
import json
for i in range(256): print(json.dumps({"id": i + 1, "group": i + 1, "index": 0, "group_size": 65536, "response": [1]}))' > "$D/gs.jsonl"
	run --separate-stderr rl-queue put -s scored --timeout 3 "$URL" "$D/gs.jsonl"
	assert_failure 1
	[[ "$stderr" == *"size over limit"* ]]
	[ "$(rl-queue stat --json "$URL" | jget bytes)" = 0 ]
	# one group of 64 samples, all in one batch: its slots counted once, and given back
	python3 -c '
import json
for i in range(64): print(json.dumps({"id": i + 1, "group": 9, "index": i, "group_size": 64, "response": [1]}))' > "$D/g64.jsonl"
	run --separate-stderr rl-queue put -s scored "$URL" "$D/g64.jsonl"
	assert_success
	b=$(rl-queue stat --json "$URL" | jget bytes)
	[ "$b" -gt 256 ]
	rl-queue get -s train -n 64 --ack "$URL" > /dev/null
	[ "$(rl-queue stat --json "$URL" | jget bytes)" = 0 ]
}

@test "an expired lease returns its records; --release hands them back at once" {
	start_broker
	rl-queue put --stage generated "$URL" "$D/scored.jsonl"
	# long enough that a slow (sanitizer) build still asks again before it expires
	run --separate-stderr rl-queue get --stage reward -n 4 --lease-timeout 2 "$URL"
	[ "${#lines[@]}" = 4 ]
	run --separate-stderr rl-queue get --stage reward -n 4 "$URL"
	[ "${#lines[@]}" = 0 ]
	sleep 2.5
	run --separate-stderr rl-queue get --stage reward -n 4 --release "$URL"
	[ "${#lines[@]}" = 4 ]
	[ "$(rl-queue stat --json "$URL" | jget total expired_records)" = 4 ]
	run --separate-stderr rl-queue get --stage reward -n 4 "$URL"
	[ "${#lines[@]}" = 4 ]
}

@test "a long-poll get whose client died takes no records: they go to the next get at once" {
	start_broker --lease-timeout 60
	rl-queue get -s reward -n 4 -w 20 "$URL" > /dev/null &
	G=$!
	sleep 0.5
	kill -9 $G
	wait $G || true
	printf '{"id":1,"response":[1]}\n' | rl-queue put -s generated "$URL" -
	# without the check the record was leased to the dead request for the lease's 60 s
	run --separate-stderr rl-queue get -s reward "$URL"
	assert_success
	[ "${#lines[@]}" = 1 ]
	# the broker killed under a waiting get (connection reset): exit 3, not 1
	rl-queue get -s reward -w 10 -t 1 "$URL" > /dev/null 2> "$D/get.err" &
	G=$!
	sleep 0.5
	kill -9 $BROKER
	st=0; wait $G || st=$?
	[ "$st" -eq 3 ]
}

@test "get -n N --release prints each record once, then hands them all back" {
	start_broker
	rl-queue put --stage generated "$URL" "$D/scored.jsonl"
	run --separate-stderr rl-queue get --stage reward -n 10 --release "$URL"
	assert_success
	[ "${#lines[@]}" = 4 ]
	[ "$(printf '%s\n' "${lines[@]}" | sort -u | wc -l)" = 4 ]
	json=$(rl-queue stat --json "$URL")
	[ "$(echo "$json" | jget depth generated)" = 4 ]
	run --separate-stderr rl-queue get --stage reward -n 10 "$URL"
	[ "${#lines[@]}" = 4 ]
}

@test "kill -9 of the broker with --data-dir loses nothing acknowledged" {
	# a tiny --compact-bytes: the journal is compacted after nearly every change
	start_broker --data-dir "$D/data" --compact-bytes 1k
	rl-queue put "$URL" "$D/prompts.jsonl"
	rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	rl-queue get --stage train -n 2 --ack "$URL" > "$D/trained1.jsonl"
	for i in $(seq 30); do rl-queue get --stage rollout -n 3 --release "$URL" > /dev/null; done
	rl-queue get --stage rollout -n 1 "$URL" > /dev/null
	[ "$(rl-queue stat --json "$URL" | jget journal compactions)" -gt 0 ]
	kill -9 "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	FIXED=1 start_broker --data-dir "$D/data" --compact-bytes 1k
	json=$(rl-queue stat --json "$URL")
	[ "$(echo "$json" | jget depth prompt)" = 2 ]
	[ "$(echo "$json" | jget depth leased)" = 1 ]
	[ "$(echo "$json" | jget depth scored)" = 2 ]
	rl-queue get --stage train -n 8 --ack "$URL" > "$D/trained2.jsonl"
	# each sample trained once across the restart
	cat "$D/trained1.jsonl" "$D/trained2.jsonl" | python3 -c '
import json,sys
ids=[int(json.loads(l)["id"]) for l in sys.stdin]
assert sorted(ids)==[11,12,21,22], ids'
	# the journal is made of zstd frames
	run zstd -t -q "$D/data/journal"
	assert_success
}

@test "a journal write past a file size limit: the put fails, the broker exits 1, nothing acknowledged is lost" {
	# ulimit -f makes a write fail half way, as a full disk does; the broker
	# must not die of SIGXFSZ without a word
	real=$(command -v rl-queue)
	mkdir "$D/bin"
	printf '#!/bin/sh\nulimit -f 64\nexec "%s" "$@"\n' "$real" > "$D/bin/rl-queue"
	chmod +x "$D/bin/rl-queue"
	PATH="$D/bin:$PATH" start_broker --data-dir "$D/data"
	acked=0 failed=0
	for n in $(seq 12); do
		python3 -c 'import json, random, sys
a = int(sys.argv[1]); r = random.Random(a)
for i in range(a, a + 40):
    print(json.dumps({"id": i, "group": i, "index": 0, "group_size": 1, "version": [0, 0],
                      "response": [r.randrange(1000) for _ in range(100)], "reward": 1}))' $((n * 1000)) > "$D/b.jsonl"
		if rl-queue put -q --stage scored --timeout 2 "$URL" "$D/b.jsonl" 2> "$D/put.err"; then
			acked=$((acked + 40))
		else
			failed=1
			break
		fi
	done
	[ "$failed" = 1 ] && [ "$acked" -gt 0 ]
	grep -q 'journal write failed' "$D/put.err"
	# it stops by itself (wait in this shell: `run` would use a subshell,
	# where the broker is no child)
	for _ in $(seq 100); do kill -0 "$BROKER" 2>/dev/null || break; sleep 0.1; done
	rc=0
	wait "$BROKER" || rc=$?
	[ "$rc" -eq 1 ]   # not 153 (SIGXFSZ)
	FIXED=1 start_broker --data-dir "$D/data"
	[ "$(rl-queue stat --json "$URL" | jget depth scored)" = "$acked" ]
}

@test "a compaction that cannot be written is put off: the broker keeps serving and restarts" {
	mkdir -p "$D/data/journal.tmp"   # where the snapshot goes: creating it fails, as on a full disk
	start_broker --data-dir "$D/data" --compact-bytes 1k
	rl-queue put "$URL" "$D/prompts.jsonl"
	rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	rl-queue get --stage train -n 2 --ack "$URL" > /dev/null
	for i in $(seq 30); do rl-queue get --stage rollout -n 3 --release "$URL" > /dev/null; done
	json=$(rl-queue stat --json "$URL")
	[ "$(echo "$json" | jget journal compactions)" = 0 ]
	# a compaction was due (past --compact-bytes and twice the live bytes)
	[ "$(echo "$json" | jget journal bytes)" -gt $((2 * $(echo "$json" | jget bytes) + 1024)) ]
	kill -9 "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	FIXED=1 start_broker --data-dir "$D/data" --compact-bytes 1k
	json=$(rl-queue stat --json "$URL")
	[ "$(echo "$json" | jget depth prompt)" = 3 ]
	[ "$(echo "$json" | jget depth scored)" = 2 ]
	[ "$(echo "$json" | jget total done)" = 2 ]
}

@test "a second broker on the same --data-dir is refused (exit 1 naming it)" {
	start_broker --data-dir "$D/data" --compact-bytes 1k
	first=$URL
	run --separate-stderr timeout -k 20 5 rl-queue serve --listen "ipc://$D/second.sock" --data-dir "$D/data" 3>&-
	assert_failure 1
	[[ "$stderr" == *"'$D/data' is in use by another broker"* ]]
	# the first keeps its journal to itself; once it is gone the directory is free
	rl-queue put "$first" "$D/prompts.jsonl"
	kill -9 "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	FIXED=1 start_broker --data-dir "$D/data"
	[ "$(rl-queue stat --json "$URL" | jget depth prompt)" = 3 ]
}

@test "a journal damaged in the middle is refused naming the byte; --recover-journal keeps what precedes it" {
	start_broker --data-dir "$D/data"
	rl-queue put "$URL" "$D/prompts.jsonl"
	rl-queue put --stage scored "$URL" "$D/scored.jsonl"
	rl-queue get --stage train -n 2 --ack "$URL" > /dev/null
	kill -9 "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	len=$(stat -c %s "$D/data/journal")
	# flip a byte in the middle of the later ops
	python3 -c 'import sys
p, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, "rb").read()); b[at] ^= 0x55; open(p, "wb").write(b)' "$D/data/journal" $((len * 3 / 4))
	run --separate-stderr timeout -k 20 10 rl-queue serve --listen "ipc://$D/r.sock" --data-dir "$D/data" 3>&-
	assert_failure 1
	[[ "$stderr" == *"damaged journal at byte"*"intact data follows"* ]]
	[[ "$stderr" == *"--recover-journal"* ]]
	FIXED=1 start_broker --data-dir "$D/data" --recover-journal
	# the prompts (put first) are there; the copy of the whole file is kept
	[ "$(rl-queue stat --json "$URL" | jget depth prompt)" = 3 ]
	[ "$(stat -c %s "$D"/data/journal.damaged-*)" = "$len" ]
	kill "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	# cut at the damage: the next start needs no option
	FIXED=1 start_broker --data-dir "$D/data"
	[ "$(rl-queue stat --json "$URL" | jget depth prompt)" = 3 ]
}

@test "serve: a port in use exits 3; --http starts the HTTP listener" {
	start_broker
	run --separate-stderr rl-queue serve --listen "$URL" 3>&-
	assert_failure 3
	[[ "$stderr" == *"cannot listen on '$URL'"* ]]
	URL="ipc://$D/h.sock"
	# stopped once it says where it listens (a fixed delay raced a slow
	# start-up on a loaded machine: the signal came before its handler);
	# SIGTERM, since a background job of this shell starts with SIGINT ignored
	rl-queue serve --listen "$URL" --http 127.0.0.1:0 2> "$D/h.err" 3>&- &
	h=$!
	PIDS="$PIDS $h"
	for _ in $(seq 200); do
		grep -q "http on" "$D/h.err" && break
		sleep 0.05
	done
	kill -TERM "$h"
	rc=0
	wait "$h" || rc=$?
	[ "$rc" = 0 ]
	[[ "$(cat "$D/h.err")" =~ "http on http://127.0.0.1:"[1-9][0-9]*" " ]]   # port 0: the bound port is printed
}

@test "an ipc:// broker survives a client that leaves during the handshake" {
	# nng 1.5.2 bug #1518: such a client stops an ipc listener; the broker
	# notices with its own pings and listens again within a few seconds
	URL="ipc://$D/q.sock"
	FIXED=1 start_broker
	for i in 1 2 3; do
		rl-queue put "$URL" "$D/missing.jsonl" 2>/dev/null || true
	done
	run --separate-stderr rl-queue stat --timeout 8 "$URL"
	assert_success
}

@test "the EXAMPLES of rl-queue(1) run" {
	man="$BATS_TEST_DIRNAME/../../man/rl-queue.1"
	# a port may be taken by someone else between free_port and the listen:
	# then the broker exits and the next command fails to connect; try
	# another port (3 times at most)
	for try in 1 2 3; do
		port=$(free_port)
		sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$man" | sed -n '/^\.Bd/,/^\.Ed/p' | grep -v '^\.' |
			sed -e 's/\\e$/\\/' -e "s|ipc:///tmp/q.sock|tcp://127.0.0.1:$port|g" > "$D/examples.sh"
		[ "$(grep -c rl-queue "$D/examples.sh")" -ge 6 ]
		echo 'kill $!' >> "$D/examples.sh"
		rm -rf "$D/q"
		run --separate-stderr bash -ec "cd '$D' && . ./examples.sh 3>&-"
		[ "$status" -eq 0 ] && break
		echo "try $try on port $port: $stderr" >&2
		grep -q "in use" <<< "$stderr" || break
	done
	assert_success
	assert_output --partial "depth: prompt 3"
	assert_output --partial '"prompt_text":"what is 1+1"'
	assert_output --partial '"id":22'
	[ -s "$D/q/journal" ]
}

@test "the man page is lint-clean" {
	command -v mandoc >/dev/null || skip "no mandoc"
	run mandoc -Tlint -W warning man/rl-queue.1
	assert_success
	[ -z "$output" ]
}

@test "hostile requests: a version past i32 and a put's stage past 32 bits are refused, nothing changes" {
	start_broker
	# versions are i32 in records: 2^63 would make every group stale for ever
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" version 9223372036854775808
	assert_success
	[[ "$output" != "0 "* && "$output" == *"version out of range (versions are 0 to 2147483647"* ]]
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" version 18446744073709551615
	[[ "$output" != "0 "* ]]
	[ "$(rl-queue stat --json "$URL" | jget version)" = 0 ]
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" version 2147483647
	[[ "$output" == "0 "* ]]
	rl-queue stat --json "$URL" | grep -q '"version":2147483647[,}]'
	# a stage of 2^32 + 1 read as an int is 1 (generated): refused instead
	printf '{"id":7,"group":7,"index":0,"group_size":1,"response":[1,2]}\n' > "$D/one.jsonl"
	rl-queue cat -s -o "$D/one.zst" "$D/one.jsonl"
	zstd -q -dc "$D/one.zst" > "$D/one.bin"
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" put-stage 4294967297 "$D/one.bin"
	[[ "$output" != "0 "* && "$output" == *"bad stage"* ]]
	[ "$(rl-queue stat --json "$URL" | jget depth generated)" = 0 ]
	# the same batch as stage 1 is taken: the refusal was the stage's
	run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" put-stage 1 "$D/one.bin"
	[[ "$output" == "0 "* ]]
	[ "$(rl-queue stat --json "$URL" | jget depth generated)" = 1 ]
}

# peak resident size of process $1 in MiB
hwm_mib() { awk '/^VmHWM/ { print int($2 / 1024) }' "/proc/$1/status"; }

@test "--max-bytes bounds request bodies being received: large ones are refused at their header, slow ones hold at most --max-conns x --max-msg" {
	start_broker --max-bytes 64M
	rl-queue stat --json "$URL" > "$D/st.json"
	[ "$(jget server max_msg < "$D/st.json")" = 1048576 ]
	[ "$(jget server max_connections < "$D/st.json")" = 64 ]
	[ "$(jget server receive_bound_bytes < "$D/st.json")" = 67108864 ]
	# 40 puts declaring 24 MiB each, 8 MiB of each sent: closed at the header
	run -0 python3 "$BATS_TEST_DIRNAME/rlq_slow.py" "$URL" 40 24576 8192 1
	[ "$output" = "open 0" ]
	# 100 connections, each 960 KiB into a 1 MiB body and then silent: 64 are
	# admitted, the rest closed; the broker's peak stays near 64 MiB of bodies
	python3 "$BATS_TEST_DIRNAME/rlq_slow.py" "$URL" 100 1024 960 2 > "$D/slow.out" &
	SLOW=$!
	PIDS="$PIDS $SLOW"
	wait $SLOW
	[ "$(cat "$D/slow.out")" = "open 64" ]
	hwm=$(hwm_mib "$BROKER")
	echo "broker peak: $hwm MiB" >&2
	[ "$hwm" -lt 160 ]
	# the slots are free again once the hostile client is gone
	run -0 --separate-stderr rl-queue put -q -s scored --timeout 5 "$URL" "$D/scored.jsonl"
	rl-queue stat --json "$URL" > "$D/st.json"
	[ "$(jget server connections_refused < "$D/st.json")" -ge 36 ]
	[ "$(jget depth scored < "$D/st.json")" = 4 ]
}

@test "serve --max-conns: a bad value is a usage error; a product over --max-bytes is warned about" {
	run -2 --separate-stderr rl-queue serve --max-conns 0
	[[ "$stderr" == *"--max-conns: bad value '0'"* ]]
	p=$(free_port)
	run --separate-stderr timeout -k 20 2 rl-queue serve --listen "tcp://127.0.0.1:$p" --max-bytes 64M --max-msg 8M --max-conns 16
	[[ "$stderr" == *"bodies being received may hold up to 16 connections x 8.0 MiB"*"more than --max-bytes 64.0 MiB"* ]]
}

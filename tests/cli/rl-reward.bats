#!/usr/bin/env bats
# rl-reward: options, scoring through the CLI (JSONL and binary), weights,
# --exec with misbehaving workers, bad input, gen-arith, the man page.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load port_helper
load json_helper

setup() {
	PIDS=""
	FIX="$BATS_TEST_DIRNAME/../fixtures/reward"
	TMP="$BATS_TEST_TMPDIR"
	W="sh $FIX/worker.sh"
}


@test "--help prints usage to stdout and exits 0" {
	run --separate-stderr rl-reward --help
	assert_success
	assert_output --partial "usage: rl-reward"
	assert_output --partial "--exec"
}

@test "usage errors exit 2 with a hint" {
	run --separate-stderr rl-reward "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"nothing to score with"* ]]
	run --separate-stderr rl-reward --task bogus "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"unknown task 'bogus'"* ]]
	run --separate-stderr rl-reward --task 'regex:(' "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"bad pattern"* ]]
	run --separate-stderr rl-reward --task length "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"--max-length"* ]]
	run --separate-stderr rl-reward --task gsm8k --gsm8k-mode lenient "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"--gsm8k-mode: bad value 'lenient' (strict or flexible)"*"hint: rl-reward --help"* ]]
	run --separate-stderr rl-reward --exec "$W" --jobs 0 "$FIX/gsm8k.jsonl"
	[ "$status" -eq 2 ]
	[[ "$stderr" == *"--jobs: bad value '0' (a whole number from 1 to 1024)"* ]]
	run -2 --separate-stderr rl-reward gen-arith --seed -1
	[[ "$stderr" == *"--seed: bad value '-1' (a whole number from 0 to 18446744073709551615)"* ]]
	# an --exec that is no command line is a usage error too (a program that
	# cannot run is a runtime one, exit 1: see "--exec without a shell")
	run -2 --separate-stderr rl-reward --exec '  ' "$FIX/gsm8k.jsonl"
	[[ "$stderr" == *"--exec: empty command"* ]]
	run -2 --separate-stderr rl-reward --exec "python3 'x" "$FIX/gsm8k.jsonl"
	[[ "$stderr" == *"--exec: unterminated single quote"* ]]
	run --separate-stderr rl-reward --task gsm8k --no-such-option
	[ "$status" -eq 2 ]
	# gen-arith's option errors carry the program's name too
	run -2 --separate-stderr rl-reward gen-arith --no-such-option
	[[ "$stderr" == "rl-reward: gen-arith: unrecognized option '--no-such-option'"* ]]
	run -2 --separate-stderr rl-reward gen-arith --n
	[[ "$stderr" == "rl-reward: gen-arith: option '--n' requires an argument"* ]]
}

@test "gsm8k strict: scores, verl ground truth, failures labelled, summary" {
	run --separate-stderr rl-reward --task gsm8k --jsonl "$FIX/gsm8k.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(wc -l < "$TMP/out.jsonl")" -eq 5 ]
	[ "$(field "$TMP/out.jsonl" 1 'r["reward"], r["meta"]["scores"]["gsm8k"]')" = "1 1" ]
	[ "$(field "$TMP/out.jsonl" 2 'r["reward"]')" = "0" ]
	[ "$(field "$TMP/out.jsonl" 3 'r["reward"]')" = "1" ]
	[ "$(field "$TMP/out.jsonl" 4 'r["reward"]')" = "0" ]
	[ "$(field "$TMP/out.jsonl" 5 'r["reward"], r["meta"]["scores"]["gsm8k"]')" = "nan None" ]
	[[ "$(field "$TMP/out.jsonl" 5 'r["meta"]["reward_error"]')" == "gsm8k: no ground truth"* ]]
	[ "$(field "$TMP/out.jsonl" 1 '"reward_error" in r["meta"]')" = "False" ]
	# input order kept
	[ "$(python3 -c 'import json,sys; print(*[json.loads(l)["id"] for l in open(sys.argv[1])])' "$TMP/out.jsonl")" = "1 2 3 4 5" ]
	[[ "$stderr" == *"5 records"*"1 failed"* ]]
	[[ "$stderr" == *"reward mean 0.5000 over 4 records"* ]]
	[[ "$stderr" == *"gsm8k 0.5000 (4)"* ]]
}

@test "gsm8k flexible takes the last number" {
	run --separate-stderr rl-reward --task gsm8k --gsm8k-mode flexible --jsonl "$FIX/gsm8k.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(field "$TMP/out.jsonl" 2 'r["reward"]')" = "1" ]
}

@test "--batch without --exec or --queue is said to be ignored, not silently dropped" {
	run --separate-stderr rl-reward --task gsm8k --batch 8 --jsonl "$FIX/gsm8k.jsonl"
	assert_success
	[[ "$stderr" == *"warning: --batch applies to --exec, --judge, --model and --queue only: ignored"* ]]
	run --separate-stderr rl-reward --task gsm8k --jsonl "$FIX/gsm8k.jsonl"
	[[ "$stderr" != *"--batch"* ]]
}

@test "weighted components add up; binary output reads back with rl-queue cat" {
	rl-reward -q -t gsm8k:0.5 -t 'format:0.25:^Natalia' -t 'regex:2:(\d+) clips\.' \
		-o "$TMP/out.rlt" "$FIX/gsm8k.jsonl"
	[ "$(head -c 4 "$TMP/out.rlt" | od -An -tx1 | tr -d ' ')" = "28b52ffd" ]
	rl-queue cat "$TMP/out.rlt" > "$TMP/out.jsonl"
	# record 1: 0.5*1 + 0.25*1 + 2*("72 clips." is the first "N clips.") = 2.75
	[ "$(field "$TMP/out.jsonl" 1 'r["reward"], r["meta"]["scores"]')" = "2.75 {'gsm8k': 1, 'format': 1, 'regex': 1}" ]
	# record 2: the first "N clips" is not followed by a full stop: no match
	[ "$(field "$TMP/out.jsonl" 2 'r["reward"], r["meta"]["scores"]')" = "0 {'gsm8k': 0, 'format': 0, 'regex': 0}" ]
	# record 4: nothing right
	[ "$(field "$TMP/out.jsonl" 4 'r["reward"]')" = "0" ]
	# binary in, JSONL out, and stdin as "-"
	rl-reward -q -t exact --jsonl - < "$TMP/out.rlt" > "$TMP/again.jsonl"
	[ "$(wc -l < "$TMP/again.jsonl")" -eq 5 ]
	[ "$(field "$TMP/again.jsonl" 1 'sorted(r["meta"]["scores"])')" = "['exact', 'format', 'gsm8k', 'regex']" ]
}

@test "auto picks the verifier per record from meta.task or meta.data_source" {
	printf '%s\n' \
		'{"id":1,"response_text":"#### 72","meta":{"answer":"72","data_source":"openai/gsm8k"}}' \
		'{"id":2,"response_text":"so \\boxed{\\frac{1}{2}}","meta":{"answer":"0.5","data_source":"lighteval/MATH"}}' \
		'{"id":3,"response_text":"<answer>2*3</answer>","meta":{"task":"countdown","numbers":[3,2],"target":6}}' \
		'{"id":4,"response_text":"12","meta":{"task":"arith","answer":"12"}}' \
		'{"id":5,"response_text":"12","meta":{"data_source":"somewhere","answer":"12"}}' > "$TMP/mixed.jsonl"
	run --separate-stderr rl-reward -t auto --jsonl "$TMP/mixed.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(python3 -c 'import json,sys; print(*[json.loads(l)["reward"] for l in open(sys.argv[1])])' "$TMP/out.jsonl")" = "1 1 1 1 nan" ]
	[[ "$(field "$TMP/out.jsonl" 5 'r["meta"]["reward_error"]')" == "auto: no gsm8k, math, dapo, countdown or arith"* ]]
}

@test "length penalty counts tokens when a record has them" {
	printf '%s\n' '{"id":1,"response":[1,2,3,4,5,6],"response_text":"ab"}' \
		'{"id":2,"response_text":"abcdef"}' > "$TMP/in.jsonl"
	run --separate-stderr rl-reward -t length --max-length 4 --jsonl "$TMP/in.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(field "$TMP/out.jsonl" 1 'r["reward"]')" = "-0.5" ]
	[ "$(field "$TMP/out.jsonl" 2 'r["reward"]')" = "-0.5" ]
	run --separate-stderr rl-reward -t length --max-length 4 --length-unit chars --jsonl "$TMP/in.jsonl"
	echo "$output" > "$TMP/out.jsonl"
	[ "$(field "$TMP/out.jsonl" 1 'r["reward"]')" = "0" ]
}

@test "--exec: crash, hang, junk, silence and exit are counted and labelled; the run goes on in order" {
	python3 -c '
import json
words = ["", "NUMBER", "CRASH", "", "HANG", "", "JUNK", "", "SILENT", "EXIT3", ""]
for i, w in enumerate(words):
    print(json.dumps({"id": i, "response_text": w, "meta": {"answer": "x"}}))' > "$TMP/in.jsonl"
	run --separate-stderr timeout -k 20 60 rl-reward --exec "$W" --timeout 1.5 --jsonl "$TMP/in.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(python3 -c 'import json,sys; print(*[json.loads(l)["id"] for l in open(sys.argv[1])])' "$TMP/out.jsonl")" = "0 1 2 3 4 5 6 7 8 9 10" ]
	[ "$(field "$TMP/out.jsonl" 0 'r["reward"]')" = "1" ]
	[ "$(field "$TMP/out.jsonl" 1 'r["reward"]')" = "0.5" ]
	[[ "$(field "$TMP/out.jsonl" 2 'r["reward"], r["meta"]["reward_error"]')" == "nan exec: crash: worker killed by signal 11"* ]]
	[[ "$(field "$TMP/out.jsonl" 4 'r["meta"]["reward_error"]')" == "exec: timeout: no reply within 1.5 s"* ]]
	[[ "$(field "$TMP/out.jsonl" 6 'r["meta"]["reward_error"]')" == "exec: junk: reply is not a number"*"Traceback"* ]]
	[[ "$(field "$TMP/out.jsonl" 8 'r["meta"]["reward_error"]')" == "exec: timeout:"* ]]
	[[ "$(field "$TMP/out.jsonl" 9 'r["meta"]["reward_error"]')" == "exec: crash: worker exited with status 3"* ]]
	[ "$(field "$TMP/out.jsonl" 10 'r["reward"], r["meta"]["scores"]["exec"]')" = "1 1" ]
	[[ "$stderr" == *"11 records"*"5 failed"* ]]
	[[ "$stderr" == *"failures: 2 timeout, 2 crash, 1 junk"* ]]
	[[ "$stderr" == *"exec: 2 timeouts, 2 crashes, 1 junk replies, 5 worker restarts"* ]]
}

@test "--exec -j 3 with --task: order kept, components combined" {
	python3 -c '
import json
for i in range(200):
    print(json.dumps({"id": i, "response_text": "#### %d" % (i % 7), "meta": {"answer": "3"}}))' > "$TMP/in.jsonl"
	rl-reward -q -t gsm8k --exec "$W" -j 3 --batch 17 --jsonl "$TMP/in.jsonl" > "$TMP/out.jsonl"
	[ "$(python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
ok = [r["id"] for r in rs] == list(range(200))
ok = ok and all(r["reward"] == (2 if r["id"] % 7 == 3 else 1) for r in rs)
print(ok)' "$TMP/out.jsonl")" = "True" ]
}

@test "--exec: trailing junk, out-of-f32 rewards and replies to records never read are failures, not scores" {
	head -n 4 "$FIX/gsm8k.jsonl" > "$TMP/in.jsonl"
	# "0.5abc", "1 0" and an object followed by text are junk (they were read as 0.5, 1, 1)
	for reply in '0.5abc' '1 0' '{"reward": 1} x'; do
		run --separate-stderr timeout -k 20 30 rl-reward --exec "sh -c 'while read -r l; do echo \"$reply\"; done'" --jsonl "$TMP/in.jsonl"
		assert_success
		[ "$(echo "$output" | python3 -c 'import json,sys; print(*[json.loads(l)["meta"].get("reward_error", "-")[:24] for l in sys.stdin])')" = "exec: junk: reply is not exec: junk: reply is not exec: junk: reply is not exec: junk: reply is not" ]
	done
	# a finite reward beyond f32 (or a weight that takes it there) fails the record instead of reading inf
	run --separate-stderr timeout -k 20 30 rl-reward --exec "sh -c 'while read -r l; do echo 1e300; done'" --jsonl "$TMP/in.jsonl"
	assert_success
	[ "$(echo "$output" | head -n 1 | python3 -c 'import json,sys; r = json.load(sys.stdin); print(r["reward"], r["meta"]["reward_error"])')" = "nan reward: weighted sum 1e+300 is outside the f32 range" ]
	[[ "$stderr" == *"4 records"*"4 failed"*"failures: 4 with a weighted sum outside the f32 range"$'\n'* ]]
	run --separate-stderr timeout -k 20 30 rl-reward --exec "$W" --exec-weight 1e39 --jsonl "$TMP/in.jsonl"
	assert_success
	[ "$(echo "$output" | head -n 1 | python3 -c 'import json,sys; r = json.load(sys.stdin); print(r["reward"], r["meta"]["reward_error"])')" = "nan reward: weighted sum 1e+39 is outside the f32 range" ]
	# a worker that reads one record, closes its stdin and keeps printing: its lines are not
	# replies to the records it never got
	run --separate-stderr timeout -k 20 30 rl-reward --timeout 2 --exec "sh -c 'read -r l; exec 0<&-; while :; do echo 1; sleep 0.1; done'" --jsonl "$TMP/in.jsonl"
	assert_success
	[ "$(echo "$output" | python3 -c 'import json,sys; print(*[json.loads(l)["meta"].get("reward_error", "ok")[:10] for l in sys.stdin])')" = "ok exec: junk ok exec: junk" ]
	# one that never reads, given records larger than a pipe holds
	python3 -c '
import json
for i in range(2):
    print(json.dumps({"id": i, "response_text": "x" * 300000, "meta": {"answer": "1"}}))' > "$TMP/big.jsonl"
	run --separate-stderr timeout -k 20 30 rl-reward --exec "sh -c 'while :; do echo 1; sleep 0.05; done'" --jsonl "$TMP/big.jsonl"
	assert_success
	[[ "$(echo "$output" | head -n 1 | python3 -c 'import json,sys; r = json.load(sys.stdin); print(r["reward"], r["meta"]["reward_error"])')" == "nan exec: junk: replied after reading "*" of the record's 300050 bytes" ]]
	[[ "$stderr" == *"2 records"*"2 failed"* ]]
}

@test "gsm8k and math compare numbers exactly; -o onto an input is refused" {
	printf '%s\n' '{"id":1,"response_text":"#### 1","meta":{"answer":100000000000000000000}}' \
	    '{"id":2,"response_text":"#### 100000000000000000000","meta":{"answer":100000000000000000000}}' \
	    '{"id":3,"response_text":"#### 1000000","meta":{"answer":"1000001"}}' \
	    '{"id":4,"response_text":"#### 1,000,001.0","meta":{"answer":"1000001"}}' > "$TMP/n.jsonl"
	run -0 --separate-stderr rl-reward -t gsm8k --jsonl "$TMP/n.jsonl"
	[ "$(echo "$output" | python3 -c 'import json,sys; print(*[json.loads(l)["reward"] for l in sys.stdin])')" = "0 1 0 1" ]
	cp "$TMP/n.jsonl" "$TMP/y.jsonl"
	run -2 --separate-stderr rl-reward -t gsm8k -o "$TMP/y.jsonl" --jsonl "$TMP/n.jsonl" "$TMP/y.jsonl"
	[[ "$stderr" == *"is the input"* ]]
	cmp "$TMP/n.jsonl" "$TMP/y.jsonl"
}

@test "--exec without a shell: a program that does not exist is an error with a hint" {
	run --separate-stderr rl-reward --exec '/nonexistent/score --x' "$FIX/gsm8k.jsonl"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"cannot run '/nonexistent/score'"* ]]
	[[ "$stderr" == *"hint:"*"sh -c"* ]]
	# a shell only when asked for
	run --separate-stderr rl-reward -q --exec "sh -c 'while read -r l; do echo 0.25; done'" --jsonl "$FIX/gsm8k.jsonl"
	assert_success
	[ "$(echo "$output" | head -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["reward"])')" = "0.25" ]
}

@test "malformed JSONL: error names the line, exit 1, records before it written" {
	{ head -n 2 "$FIX/gsm8k.jsonl"; echo '{"id": 3, "response_text": '; tail -n 1 "$FIX/gsm8k.jsonl"; } > "$TMP/bad.jsonl"
	run --separate-stderr rl-reward -t gsm8k --jsonl "$TMP/bad.jsonl"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"'$TMP/bad.jsonl': line 3"* ]]
	[ "$(echo "$output" | wc -l)" -eq 2 ]
	# the same with --exec batching
	run --separate-stderr rl-reward -t gsm8k --exec "$W" --jsonl "$TMP/bad.jsonl"
	[ "$status" -eq 1 ]
	[ "$(echo "$output" | wc -l)" -eq 2 ]
	# a field of the wrong type
	echo '{"id": "x", "response_text": "#### 1"}' > "$TMP/bad2.jsonl"
	run --separate-stderr rl-reward -t gsm8k --jsonl "$TMP/bad2.jsonl"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"line 1"* ]]
}

@test "truncated binary stream: error names the byte offset, exit 1, whole frames before it written" {
	rl-queue cat --stream "$FIX/gsm8k.jsonl" > "$TMP/a.rlt"
	n=$(stat -c %s "$TMP/a.rlt")
	{ cat "$TMP/a.rlt"; head -c $((n - 7)) "$TMP/a.rlt"; } > "$TMP/t.rlt"
	run --separate-stderr rl-reward -t gsm8k --jsonl "$TMP/t.rlt"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"'$TMP/t.rlt': byte $n"* ]]
	[ "$(echo "$output" | wc -l)" -eq 5 ]
	run --separate-stderr rl-reward -t gsm8k "$TMP/missing.rlt"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"cannot open '$TMP/missing.rlt'"* ]]
}

@test "write failures: exit 1 with one message" {
	run --separate-stderr rl-reward -q -t gsm8k -o "$TMP/no/such/dir/out.rlt" "$FIX/gsm8k.jsonl"
	[ "$status" -eq 1 ]
	[[ "$stderr" == *"cannot open '$TMP/no/such/dir/out.rlt'"* ]]
	[ -w /dev/full ] || skip "no /dev/full"
	run --separate-stderr sh -c "rl-reward -q -t gsm8k --jsonl '$FIX/gsm8k.jsonl' > /dev/full"
	[ "$status" -eq 1 ]
	[ "$(printf '%s\n' "$stderr" | grep -c 'cannot write')" -eq 1 ]
}

@test "gen-arith: reproducible, disjoint splits, answers score 1 with the arith task" {
	rl-reward gen-arith --n 50 --seed 3 > "$TMP/a.jsonl"
	rl-reward gen-arith --n 50 --seed 3 > "$TMP/b.jsonl"
	cmp "$TMP/a.jsonl" "$TMP/b.jsonl"
	head -n 1 "$TMP/a.jsonl" | grep -Eq '^\{"prompt":"[0-9]+\+[0-9]+=","answer":"[0-9]+","task":"arith"\}$'
	rl-reward gen-arith --n 2000 --seed 1 --split train -o "$TMP/train.jsonl"
	rl-reward gen-arith --n 300 --seed 2 --split test -o "$TMP/test.jsonl"
	[ "$(cut -d, -f1 "$TMP/train.jsonl" | sort -u > "$TMP/p1"; cut -d, -f1 "$TMP/test.jsonl" | sort -u > "$TMP/p2"; comm -12 "$TMP/p1" "$TMP/p2" | wc -l)" -eq 0 ]
	# the right answer as response scores 1, a wrong one 0
	python3 -c '
import json, sys
for i, l in enumerate(open(sys.argv[1])):
    p = json.loads(l)
    resp = p["answer"] + "\n" if i % 2 == 0 else str(int(p["answer"]) + 1)
    print(json.dumps({"id": i, "prompt_text": p["prompt"], "response_text": resp, "meta": {"answer": p["answer"]}}))' "$TMP/a.jsonl" > "$TMP/t.jsonl"
	run --separate-stderr rl-reward -t arith --jsonl "$TMP/t.jsonl"
	assert_success
	[[ "$stderr" == *"arith 0.5000 (50)"* ]]
	run --separate-stderr rl-reward gen-arith --digits 12
	[ "$status" -eq 2 ]
	run --separate-stderr rl-reward gen-arith --ops '/'
	[ "$status" -eq 2 ]
}

@test "man page: lints clean and its examples run" {
	command -v mandoc >/dev/null || skip "no mandoc"
	run mandoc -Tlint -W warning "$BATS_TEST_DIRNAME/../../man/rl-reward.1"
	assert_success
	cd "$TMP"
	# the first example, taken from the page as rendered
	mandoc -Tutf8 "$BATS_TEST_DIRNAME/../../man/rl-reward.1" | col -b | grep -A1 "printf '%s" | sed 's/^[[:space:]]*//' > ex1.sh
	[ "$(wc -l < ex1.sh)" -eq 2 ]
	run --separate-stderr sh ex1.sh
	assert_success
	[[ "$output" == *'"reward":1'* ]]
	rl-reward gen-arith --n 20000 --seed 1 --split train > train.jsonl
	rl-reward gen-arith --n 500 --seed 2 --split test > test.jsonl
	[ "$(wc -l < train.jsonl)" -eq 20000 ]
	# the example reward program from REWARD PROGRAMS
	sed -n '/^#!\/usr\/bin\/env python3/,/^\.Ed/p' "$BATS_TEST_DIRNAME/../../man/rl-reward.1" | sed '$d' > score.py
	[ "$(wc -l < score.py)" -eq 8 ]
	run --separate-stderr rl-reward -q --exec 'python3 -u score.py' -j 2 --timeout 20 --jsonl "$FIX/gsm8k.jsonl"
	assert_success
	echo "$output" > out.jsonl
	[ "$(field out.jsonl 1 'r["reward"]')" = "1" ]
	[ "$(field out.jsonl 4 'r["reward"]')" = "0" ]
}

# broker ARGS...: rl-queue serve on a port from free_port (its pid in PIDS); sets url
broker() {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve --listen tcp://127.0.0.1:@PORT@ -q "$@"
	url="tcp://127.0.0.1:$DPORT"
}

@test "--queue: leases generated records, puts them back scored; SIGTERM stops it cleanly" {
	broker
	python3 -c '
import json
for i in range(12):
    print(json.dumps({"id": 100 + i, "group": i // 4, "index": i % 4, "group_size": 4,
                      "response_text": "#### %d" % (i % 3), "meta": {"answer": "1"}}))' > "$TMP/gen.jsonl"
	run --separate-stderr rl-queue put -q --stage generated -t 10 "$url" "$TMP/gen.jsonl"
	assert_success
	run --separate-stderr timeout -k 20 30 rl-reward --queue "$url" -t gsm8k --exec "$W" --idle-exit 1
	assert_success
	[[ "$stderr" == *"12 records"*"0 failed"* ]]
	[[ "$stderr" == *"reward mean 1.3333 over 12 records"* ]]
	rl-queue get -q --stage train -n 12 -w 5 "$url" > "$TMP/scored.jsonl"
	[ "$(wc -l < "$TMP/scored.jsonl")" -eq 12 ]
	[ "$(field "$TMP/scored.jsonl" 101 'r["reward"], r["meta"]["scores"]["gsm8k"]')" = "2 1" ]
	# a worker without --idle-exit runs until SIGTERM, then prints its summary and exits 0
	rl-reward --queue "$url" -t gsm8k 3>&- 2> "$TMP/err" &
	pid=$!
	sleep 2
	kill -TERM $pid
	wait $pid
	grep -q "0 records" "$TMP/err"
	# no FILE in queue mode
	run --separate-stderr rl-reward --queue "$url" -t gsm8k "$TMP/gen.jsonl"
	[ "$status" -eq 2 ]
}

@test "--queue: a batch slower than the lease is extended, not redelivered" {
	broker --lease-timeout 2
	python3 -c '
import json
for i in range(32):
    print(json.dumps({"id": 100 + i, "group": i // 4, "index": i % 4, "group_size": 4,
                      "response_text": "#### 1", "meta": {"answer": "1"}}))' > "$TMP/gen.jsonl"
	rl-queue put -q --stage generated -t 10 "$url" "$TMP/gen.jsonl"
	# 32 records at 0.1 s each: 3.2 s in one lease of 2 s
	run --separate-stderr timeout -k 20 60 rl-reward -v --queue "$url" --idle-exit 1 \
		--exec "sh -c 'while read -r l; do sleep 0.1; echo 1; done'"
	assert_success
	[[ "$stderr" == *"extended"* ]]
	[[ "$stderr" == *"32 records"*"0 failed"* ]]
	run rl-queue stat "$url"
	assert_output --partial "lease expiries 0 (0 records)"
	assert_output --partial "scored 32"
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

@test "dapo: verl's math_dapo rule, against a restatement of it in Python on 2,000 random records" {
	python3 "$FIX/dapo_ref.py" gen 2000 7 > "$TMP/r.jsonl"
	python3 "$FIX/dapo_ref.py" score < "$TMP/r.jsonl" > "$TMP/want"
	rl-reward -q -t dapo --jsonl "$TMP/r.jsonl" |
		python3 -c 'import json, sys; [print(int(json.loads(l)["reward"])) for l in sys.stdin]' > "$TMP/got"
	[ "$(wc -l < "$TMP/got")" -eq 2000 ]
	# both outcomes occur, and every record agrees
	[ "$(grep -c '^1$' "$TMP/want")" -gt 100 ]
	[ "$(grep -c '^-1$' "$TMP/want")" -gt 100 ]
	cmp "$TMP/want" "$TMP/got"
}

@test "dapo: Answer: lines, 1 or -1; auto takes it for verl's DAPO and AIME data sources" {
	cat > "$TMP/d.jsonl" <<'J'
{"id":1,"group":1,"index":0,"group_size":1,"response_text":"Reasoning...\nAnswer: $\\frac{1}{2}$","meta":{"answer":"\\frac12","data_source":"math_dapo"}}
{"id":2,"group":2,"index":0,"group_size":1,"response_text":"answer : 1,000 dollars\nbye","meta":{"answer":"1000","data_source":"aime25"}}
{"id":3,"group":3,"index":0,"group_size":1,"response_text":"Answer: 7\nActually, Answer: 8","meta":{"answer":"7","data_source":"math_dapo"}}
{"id":4,"group":4,"index":0,"group_size":1,"response_text":"The result is \\boxed{7}.","meta":{"answer":"7","data_source":"math_dapo"}}
{"id":5,"group":5,"index":0,"group_size":1,"response_text":"The result is \\boxed{7}.","meta":{"answer":"7","data_source":"DigitalLearningGmbH/MATH-lighteval"}}
J
	rl-reward -q -t auto --jsonl "$TMP/d.jsonl" > "$TMP/o.jsonl"
	[ "$(field "$TMP/o.jsonl" 1 'r["reward"]')" = 1 ]
	[ "$(field "$TMP/o.jsonl" 2 'r["reward"]')" = 1 ]
	# the last Answer: counts: 8 is wrong
	[ "$(field "$TMP/o.jsonl" 3 'r["reward"]')" = -1 ]
	# a \boxed{} answer without "Answer:" is wrong for dapo, right for math
	[ "$(field "$TMP/o.jsonl" 4 'r["reward"]')" = -1 ]
	[ "$(field "$TMP/o.jsonl" 5 'r["reward"]')" = 1 ]
	rl-reward -q -t dapo --jsonl "$TMP/d.jsonl" > "$TMP/o2.jsonl"
	[ "$(field "$TMP/o2.jsonl" 1 'r["meta"]["scores"]["dapo"]')" = 1 ]
}

@test "verl_reward.py runs a verl custom reward function as an --exec worker" {
	V="python3 $BATS_TEST_DIRNAME/../../pipelines/lib/verl_reward.py"
	printf '%s\n' \
		'{"id":1,"response_text":"it is 42","meta":{"data_source":"x","reward_model":{"ground_truth":"42"}}}' \
		'{"id":2,"response_text":"it is 41","meta":{"data_source":"dict","answer":"42"}}' \
		'{"id":3,"response_text":"it is 42","meta":{"data_source":"x","answer":"42","extra_info":{"boom":true}}}' \
		'{"id":4,"response_text":"it is 42","meta":{"data_source":"dict","answer":"42"}}' > "$TMP/in.jsonl"
	run --separate-stderr rl-reward --exec "$V $FIX/verl_custom.py" --jsonl "$TMP/in.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(python3 -c 'import json,sys; print(*[json.loads(l)["reward"] for l in open(sys.argv[1])])' "$TMP/out.jsonl")" = "1 -1 nan 1" ]
	# the raising call fails its record only, and its traceback names the record
	[[ "$(field "$TMP/out.jsonl" 3 'r["meta"]["reward_error"]')" == "exec: junk"* ]]
	[[ "$stderr" == *"verl_reward.py: record 3: Traceback"*"RuntimeError: boom"* ]]
	run --separate-stderr rl-reward --exec "$V $FIX/verl_custom.py quarter" --jsonl "$TMP/in.jsonl"
	echo "$output" > "$TMP/out.jsonl"
	[ "$(python3 -c 'import json,sys; print(*[json.loads(l)["reward"] for l in open(sys.argv[1])])' "$TMP/out.jsonl")" = "0.25 0.25 0.25 0.25" ]
	# a missing file or function is named
	run --separate-stderr rl-reward --exec "$V $TMP/nope.py" --jsonl "$TMP/in.jsonl"
	[[ "$stderr" == *"verl_reward.py: cannot load '$TMP/nope.py'"* ]]
	run --separate-stderr rl-reward --exec "$V $FIX/verl_custom.py nofn" --jsonl "$TMP/in.jsonl"
	[[ "$stderr" == *"has no function 'nofn'"* ]]
}

@test "trl_reward.py runs TRL reward functions as an --exec worker" {
	T="python3 $BATS_TEST_DIRNAME/../../pipelines/lib/trl_reward.py"
	printf '%s\n' \
		'{"id":1,"prompt_text":"q","response":[5,6,7],"response_text":"<answer>42</answer>","meta":{"answer":"42"}}' \
		'{"id":2,"prompt_text":"q","response":[5],"response_text":"41","meta":{"answer":"42"}}' > "$TMP/in.jsonl"
	rew() { rl-reward -q --exec "$T $*" --jsonl "$TMP/in.jsonl" |
		python3 -c 'import json,sys; print(*[json.loads(l)["reward"] for l in sys.stdin])'; }
	[ "$(rew "$FIX/trl_custom.py" accuracy)" = "1 0" ]
	[ "$(rew --chat "$FIX/trl_custom.py" chat_format)" = "1 0" ]
	[ "$(rew "$FIX/trl_custom.py" length)" = "0.3 0.1" ]
	# None ("does not apply") fails the record, with the reason
	run --separate-stderr rl-reward --exec "$T $FIX/trl_custom.py maybe" --jsonl "$TMP/in.jsonl"
	assert_success
	[[ "$output" == *'"reward":"nan"'* ]]
	[[ "$stderr" == *"trl_reward.py: record 1:"*"returned None"* ]]
	run --separate-stderr rl-reward --exec "$T $FIX/trl_custom.py" --jsonl "$TMP/in.jsonl"
	[[ "$stderr" == *"usage: trl_reward.py"* ]]
}

#!/usr/bin/env bats
# rl-rollout --queue and rl-train --queue against rl-queue serve on loopback.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" "" 64
	for i in 1 2 3 4 5 6; do echo "{\"prompt_text\":\"$i+$i=\",\"meta\":{\"answer\":\"$((i + i))\"}}"; done > "$TD/prompts.jsonl"
}

setup() {
	PIDS=""
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -t 30
	URL="tcp://127.0.0.1:$DPORT"
	QPID=$DPID
}

teardown() {
	kill "$QPID" 2>/dev/null || true
	wait "$QPID" 2>/dev/null || true
}

# scores leased generated records (reward = parity of the first response token) and puts them back
score() {
	rl-queue get "$URL" -s reward -n 1000 --ack > "$TD/gen.jsonl"
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    r["reward"] = float(r["response"][0] % 2)
    print(json.dumps(r))' "$TD/gen.jsonl" > "$TD/scored.jsonl"
	rl-queue put -q -s scored "$URL" "$TD/scored.jsonl"
}

@test "rollout leases prompts and puts back whole groups carrying the prompt's group and meta" {
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 3 --max-tokens 4 --queue "$URL" --idle-exit 1
	[[ "$stderr" == *"6 prompts, 18 samples"* ]]
	rl-queue get "$URL" -s reward -n 100 > "$TD/g.jsonl"
	[ "$(wc -l < "$TD/g.jsonl")" -eq 18 ]
	python3 -c '
import json, sys, collections
c = collections.Counter()
for l in open(sys.argv[1]):
    r = json.loads(l)
    assert r["group_size"] == 3 and r["version"] == [0, 0]
    assert r["meta"]["answer"] == str(2 * int(r["prompt_text"].split("+")[0]))
    c[r["group"]] += 1
assert sorted(c.values()) == [3] * 6, c' "$TD/g.jsonl"
}

@test "trainer leases scored groups, acknowledges them after each step and reports its version" {
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1
	score
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck" --batch 3 --queue "$URL" --idle-exit 1 --metrics "$TD/m.jsonl"
	[ "$(wc -l < "$TD/m.jsonl")" -eq 1 ]  # the second step's groups are stale at version 1 (K = 0)
	rl-queue stat --json "$URL" > "$TD/stat.json"
	python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
text = json.dumps(s)
assert s["version"] == 1, s["version"]
' "$TD/stat.json"
	[ "$(readlink "$TD/ck/latest")" = step-00000001 ]
}

@test "a trainer that stops early hands its untrained leased records back" {
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1
	score
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck2" --batch 2 --max-steps 1 --queue "$URL" --metrics /dev/null
	# 2 groups trained; the other 4 are back in "scored" (or dropped as stale), none held
	rl-queue stat "$URL" > "$TD/st"
	grep -q ' training 0 ' "$TD/st"
}

@test "SIGTERM to a trainer whose broker is gone: it stops without retrying each record for a minute, and says what it could not hand back" {
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1
	score
	# batch 8 > 6 groups: it holds them all and waits for more
	rl-train -m "$TD/m0" --out "$TD/ck3" --batch 8 --queue "$URL" --metrics /dev/null 2> "$TD/tr3.log" &
	T=$!
	for i in $(seq 100); do grep -q 'training 6' <(rl-queue stat "$URL" 2>/dev/null) && break; sleep 0.1; done
	kill -9 "$QPID"
	wait "$QPID" 2>/dev/null || true
	kill -TERM $T
	# it took a minute per held record (12 here) before; now one lease request and one
	# release, each bounded: well under the 100 s this waits
	st=0; timeout -k 20 100 tail --pid=$T -f /dev/null || st=$?
	[ "$st" -eq 0 ]
	grep -q "12 of 12 leased records not trained could not be handed back" "$TD/tr3.log"
}

@test "with default options a failed reward (an --exec worker's NaN) drops its group with a warning, and the run goes on" {
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1
	# the first record scored gets NaN (junk: the worker is restarted), every other one 1
	rm -f "$TD/nan-once"
	printf '%s\n' "while read l; do if [ -e '$TD/nan-once' ]; then echo 1; else touch '$TD/nan-once'; echo nan; fi; done" > "$TD/w.sh"
	run -0 --separate-stderr timeout -k 20 60 rl-reward --queue "$URL" --exec "sh $TD/w.sh" --idle-exit 1
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ckbad" --batch 5 --queue "$URL" --idle-exit 1 --metrics "$TD/mbad.jsonl"
	[ "$(wc -l < "$TD/mbad.jsonl")" -eq 1 ]
	[[ "$stderr" == *"warning: "*"its group is dropped (1 bad records so far)"* ]]
	[[ "$stderr" == *"warning: 1 groups dropped as bad (1 bad records)"* ]]
	rl-queue stat "$URL" > "$TD/stbad"
	grep -q ' training 0 ' "$TD/stbad"
}

@test "--queue and an input file together is a usage error" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --queue "$URL" "$TD/prompts.jsonl"
}

@test "rl-queue put takes rl-rollout's prompt lines (text or messages) as prompt records" {
	printf '%s\n' '{"prompt":"3+4=","answer":"7"}' '{"prompt":[{"role":"user","content":"hi"}],"data_source":"x"}' > "$TD/pl.jsonl"
	run -0 --separate-stderr rl-queue put "$URL" "$TD/pl.jsonl"
	[[ "$stderr" == *"2 records: 2 accepted"* ]]
	run -0 --separate-stderr sh -c "cat '$TD/pl.jsonl' | rl-queue put '$URL'"
	[[ "$stderr" == *"2 duplicates"* ]]
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 3 --queue "$URL" --idle-exit 1
	[[ "$stderr" == *"2 prompts, 4 samples"* ]]
	rl-queue get "$URL" -s reward -n 10 > "$TD/pg.jsonl"
	grep -q '"prompt_text":"3+4="' "$TD/pg.jsonl"
	grep -q '"prompt_text":"<|im_start|>user' "$TD/pg.jsonl"
	grep -q '"data_source":"x"' "$TD/pg.jsonl"
	printf '%s\n' '{"prompt":"ok"}' '{"prompt":7}' > "$TD/pbad.jsonl"
	run -1 --separate-stderr rl-queue put "$URL" "$TD/pbad.jsonl"
	[[ "$stderr" == *"line 2"* ]]
}

@test "the same prompt text on two lines is two prompts; putting the file again adds nothing" {
	printf '%s\n' '{"prompt":"1+1="}' '{"prompt":"1+1="}' '{"prompt":"2+2="}' > "$TD/rep.jsonl"
	run -0 --separate-stderr rl-queue put "$URL" "$TD/rep.jsonl"
	[[ "$stderr" == *"3 records: 3 accepted"* ]]
	run -0 --separate-stderr rl-queue put "$URL" "$TD/rep.jsonl"
	[[ "$stderr" == *"0 accepted, 3 duplicates"* ]]
}

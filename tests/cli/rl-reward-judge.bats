#!/usr/bin/env bats
# rl-reward --judge: an LLM as judge over the OpenAI chat completions API.
# Against a fake judge (judge_server.py, Python's http.server) whose verdict
# is computed from the message it received (the length of the RESPONSE line),
# so the template's rendering and the verdict's parsing are both checked
# against something rl-reward did not compute; its failure modes (HTTP 500,
# garbage, not JSON, no answer, a refused connection) handled as --exec
# failures are (reward NaN, meta.reward_error, counted); then against
# rl-rollout serve on a tiny model, the real server.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load json_helper

setup() {
	TMP="$BATS_TEST_TMPDIR"
	PIDS=""
	cat > "$TMP/judge.j2" <<'T'
Rate the answer to the question.
QUESTION: {{ prompt }}
RESPONSE: {{ response }}
TRUTH: {{ ground_truth }}{% if meta.task %} ({{ meta.task }}){% endif %}
T
	python3 -c '
import json
resp = ["forty two", "x", "GARBAGE please", "a FAIL500 b", "BADJSON", "the HANG", "seven words are in this response here"]
for i, r in enumerate(resp):
    m = {"reward_model": {"ground_truth": str(i * 3)}} if i % 2 else {"answer": 7, "task": "demo"}
    print(json.dumps({"id": i, "prompt_text": "what is %d?" % i, "response_text": r, "meta": m}))' > "$TMP/in.jsonl"
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

start_fake() {
	coproc FAKE { exec python3 "$BATS_TEST_DIRNAME/judge_server.py" 0 "$TMP/requests.jsonl"; }
	PIDS="$PIDS $FAKE_PID"
	read -r FPORT <&"${FAKE[0]}"
	JURL="http://127.0.0.1:$FPORT/v1"
}


@test "--judge: the template rendered per record, the verdict parsed, failures labelled and counted, order kept" {
	start_fake
	printf 'sk-test-123\n' > "$TMP/key"
	chmod 600 "$TMP/key"
	run --separate-stderr timeout -k 20 60 rl-reward --judge "$JURL" --judge-template "$TMP/judge.j2" \
	    --judge-timeout 1.5 --judge-weight 0.5 --judge-jobs 3 --judge-key-file "$TMP/key" --jsonl "$TMP/in.jsonl"
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(jq -s -c 'map(.id)' "$TMP/out.jsonl")" = "[0,1,2,3,4,5,6]" ]
	# the fake judge's verdict is len(RESPONSE line): the score, times the weight
	[ "$(field "$TMP/out.jsonl" 0 'r["meta"]["scores"]["judge"], r["reward"]')" = "9 4.5" ]
	[ "$(field "$TMP/out.jsonl" 1 'r["meta"]["scores"]["judge"], r["reward"]')" = "1 0.5" ]
	[ "$(field "$TMP/out.jsonl" 6 'r["meta"]["scores"]["judge"]')" = 37 ]
	[[ "$(field "$TMP/out.jsonl" 2 'r["reward"], r["meta"]["reward_error"]')" == "nan judge: junk: the reply has no number" ]]
	[[ "$(field "$TMP/out.jsonl" 3 'r["meta"]["reward_error"]')" == "judge: http: the judge answered HTTP 500" ]]
	[[ "$(field "$TMP/out.jsonl" 4 'r["meta"]["reward_error"]')" == "judge: junk: the reply is not JSON" ]]
	[[ "$(field "$TMP/out.jsonl" 5 'r["meta"]["reward_error"]')" == "judge: timeout: no reply from the judge within 1.5 s" ]]
	[[ "$stderr" == *"7 records"*"4 failed"* ]]
	[[ "$stderr" == *"judge (fake-judge): 1 timeouts, 1 HTTP or connection errors, 2 replies without a verdict"* ]]
	# what the judge was sent: the model it listed, the key, greedy, the
	# template with prompt, response and the ground truth from either place
	run -0 jq -r 'select(.content | contains("forty two")) | [.model, .auth, .temperature, .max_tokens] | @tsv' \
	    "$TMP/requests.jsonl"
	[ "$output" = "$(printf 'fake-judge\tBearer sk-test-123\t0\t512')" ]
	run -0 jq -r 'select(.content | contains("forty two")) | .content' "$TMP/requests.jsonl"
	[ "$output" = "$(printf 'Rate the answer to the question.\nQUESTION: what is 0?\nRESPONSE: forty two\nTRUTH: 7 (demo)')" ]
	run -0 jq -r 'select(.content | contains("RESPONSE: x\n")) | .content' "$TMP/requests.jsonl"
	[[ "$output" == *"TRUTH: 3" ]]
}

@test "--judge-pattern takes its first group; --judge-model names the model; a task adds to it" {
	start_fake
	run --separate-stderr rl-reward --judge "$JURL" --judge-template "$TMP/judge.j2" --judge-model other \
	    --judge-pattern '([0-9]+) points' --task length:0.25 --max-length 100 --length-unit chars --jsonl \
	    <(head -n 2 "$TMP/in.jsonl")
	assert_success
	echo "$output" > "$TMP/out.jsonl"
	[ "$(field "$TMP/out.jsonl" 0 'r["meta"]["scores"]["judge"]')" = 3 ]
	run -0 jq -r '.model' "$TMP/requests.jsonl"
	[ "$(sort -u <<<"$output")" = other ]
	# reward = the judge's 3 + 0.25 x the length component
	run -0 jq -r '.reward - 3 - 0.25 * .meta.scores.length | fabs < 1e-6' "$TMP/out.jsonl"
	[ "$(sort -u <<<"$output")" = true ]
}

@test "--judge: a refused connection fails each record (with --judge-model) or the start (without)" {
	port=$(free_port)
	run --separate-stderr rl-reward --judge "http://127.0.0.1:$port/v1" --judge-model m \
	    --judge-template "$TMP/judge.j2" --jsonl "$TMP/in.jsonl"
	assert_success
	[ "$(jq -r '.meta.reward_error' <<<"$output" | grep -c '^judge: http: http://127.0.0.1:.*/v1: Connection refused')" = 7 ]
	run -1 --separate-stderr rl-reward --judge "http://127.0.0.1:$port/v1" --judge-template "$TMP/judge.j2" \
	    --jsonl "$TMP/in.jsonl"
	[[ "$stderr" == *"cannot ask it for its model"*"Connection refused"* ]]
	[[ "$stderr" == *"--judge-model"* ]]
}

@test "--judge: usage errors name the option" {
	mkdir -p "$TMP/mdir"
	run -2 --separate-stderr rl-reward --judge http://127.0.0.1:1/v1 "$TMP/in.jsonl"
	[[ "$stderr" == *"--judge needs --judge-template FILE"* ]]
	run -2 --separate-stderr rl-reward --judge "$TMP/mdir" --judge-template "$TMP/judge.j2" "$TMP/in.jsonl"
	[[ "$stderr" == *"is a model directory"*"rl-rollout serve -m"* ]]
	run -2 --separate-stderr rl-reward --judge https://example.com/v1 --judge-template "$TMP/judge.j2" "$TMP/in.jsonl"
	[[ "$stderr" == *"https is not supported"* ]]
	run -2 --separate-stderr rl-reward --judge-model x --task exact "$TMP/in.jsonl"
	[[ "$stderr" == *"--judge-* options need --judge URL"* ]]
	run -2 --separate-stderr rl-reward --judge http://127.0.0.1:1/v1 --judge-model m --judge-template "$TMP/judge.j2" \
	    --judge-pattern '([0-9' "$TMP/in.jsonl"
	[[ "$stderr" == *"--judge-pattern '([0-9': at offset"* ]]
	printf 'x {%% if %%}\n' > "$TMP/bad.j2"
	run -2 --separate-stderr rl-reward --judge http://127.0.0.1:1/v1 --judge-model m --judge-template "$TMP/bad.j2" \
	    "$TMP/in.jsonl"
	[[ "$stderr" == *"bad.j2': line 1"* ]]
	run -2 --separate-stderr rl-reward --judge http://127.0.0.1:1/v1 --judge-template "$TMP/judge.j2" \
	    --judge-timeout 0 "$TMP/in.jsonl"
	[[ "$stderr" == *"--judge-timeout"* ]]
}

@test "--judge against rl-rollout serve: the model it serves is asked, every record answered" {
	toy_model "$TMP" 1 256
	port=$(free_port)
	rl-rollout serve -m "$TMP/m0" --served-model-name toyjudge --listen "127.0.0.1:$port" 2> "$TMP/serve.err" &
	PIDS="$PIDS $!"
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.05; done
	run --separate-stderr rl-reward --judge "http://127.0.0.1:$port/v1" --judge-template "$TMP/judge.j2" \
	    --judge-max-tokens 8 --judge-pattern '(?s)^(.*)$' --jsonl <(head -n 3 "$TMP/in.jsonl")
	assert_success
	# a random model's 8 tokens are no number: each record reached the model
	# and came back as a reply without a verdict, none failed on the way
	[ "$(jq -r '.meta.reward_error' <<<"$output" | sort -u)" = "judge: junk: the verdict the pattern matched is not a number" ]
	[[ "$stderr" == *"judge (toyjudge): 0 timeouts, 0 HTTP or connection errors, 3 replies without a verdict"* ]]
}

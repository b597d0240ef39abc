#!/usr/bin/env bats
# --auth-key-file on rl-queue: a client with the broker's key puts and leases;
# one without a key, with another key, a replayed or a stale request is
# refused with a clear error on both sides and nothing is leased; a key file
# group or others can read is refused; a key allows a public listen.
# Requests are also signed by rlq_auth.py with Python's hmac and Poly1305, so the format
# is checked against an implementation other than lib/base/auth.c.
bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load queue_helper

setup() {
	D=$(mktemp -d /tmp/rlauth-bats.XXXXXX)
	PIDS=""
	write_records "$D"
	printf 'correct horse battery staple 1\n' > "$D/key"
	printf 'some other key of enough length\n' > "$D/other"
	chmod 600 "$D/key" "$D/other"
}

teardown() {
	kill_pids
	rm -rf "$D"
}

with_key() { RL_AUTH_KEY_FILE=$D/key "$@"; }

start_auth_broker() {
	for _ in $(seq 5); do
		URL="tcp://127.0.0.1:$(free_port)"
		rl-queue serve --listen "$URL" --auth-key-file "$D/key" "$@" 2> "$D/broker.err" 3>&- &
		BROKER=$!
		PIDS="$PIDS $BROKER"
		for _ in $(seq 100); do
			kill -0 "$BROKER" 2>/dev/null || break
			with_key rl-queue stat --timeout 0.5 "$URL" >/dev/null 2>&1 && return 0
			sleep 0.05
		done
	done
	echo "broker did not start" >&2
	return 1
}

@test "rl-queue --auth-key-file: the right key puts and leases; no key or a wrong key is refused on both sides and leases nothing" {
	start_auth_broker
	run -0 --separate-stderr with_key rl-queue put -q -s scored "$URL" "$D/scored.jsonl"
	run -1 --separate-stderr rl-queue get "$URL" -s train -n 10
	[[ $stderr == *"requires a shared key"*"--auth-key-file"* ]]
	run -1 --separate-stderr env RL_AUTH_KEY_FILE="$D/other" rl-queue get "$URL" -s train -n 10
	[[ $stderr == *"wrong shared key"* ]]
	run -1 --separate-stderr rl-queue put -q -s scored "$URL" "$D/scored.jsonl"
	[[ $stderr == *"requires a shared key"* ]]
	grep -q 'refused a lease request: this broker requires a shared key' "$D/broker.err"
	grep -q 'refused a lease request: wrong shared key' "$D/broker.err"
	# nothing leased or put twice: the four records are still there
	with_key rl-queue stat "$URL" > "$D/st"
	grep -q 'scored 4 training 0' "$D/st"
	run -0 --separate-stderr with_key rl-queue get "$URL" -s train -n 10
	[ "$(printf '%s\n' "$output" | grep -c '"group"')" -eq 4 ]
}

@test "rl-queue --auth-key-file: a request signed by Python (hmac, cryptography's Poly1305) is accepted; its replay, a stale one, one with another key and one with an altered body are refused" {
	start_auth_broker
	run -0 python3 "$BATS_TEST_DIRNAME/rlq_auth.py" "$URL" "$D/key" replay
	[[ ${lines[0]} == "0 "*" bytes" ]]
	[[ ${lines[1]} == "1 the request was seen before (a replay)" ]]
	run -0 python3 "$BATS_TEST_DIRNAME/rlq_auth.py" "$URL" "$D/key" stale
	[[ $output == "1 the request's time is more than 300 s away"* ]]
	run -0 python3 "$BATS_TEST_DIRNAME/rlq_auth.py" "$URL" "$D/other" stat
	[[ $output == "1 wrong shared key"* ]]
	# a body Python signed passes the MAC (the broker then judges the ack
	# itself); the same body with one byte flipped does not
	run -0 python3 "$BATS_TEST_DIRNAME/rlq_auth.py" "$URL" "$D/key" ack
	[[ ${lines[0]} != *"shared key"* && ${lines[0]} != *"replay"* ]]
	[[ ${lines[1]} == "1 wrong shared key"* ]]
	grep -q 'refused a ack request: wrong shared key' "$D/broker.err"
}

@test "rl-queue --auth-key-file: a key file group or others can read is refused, naming the file and the mode" {
	chmod 644 "$D/key"
	run -2 --separate-stderr timeout -k 20 5 rl-queue serve --listen "tcp://127.0.0.1:$(free_port)" --auth-key-file "$D/key"
	[[ $stderr == *"'$D/key': permissions 0644 are too open"* ]]
	chmod 640 "$D/key"
	for c in rl-reward rl-train rl-rollout; do
		run -2 --separate-stderr timeout -k 20 5 $c --queue "tcp://127.0.0.1:1" --auth-key-file "$D/key"
		[[ $stderr == *"'$D/key': permissions 0640 are too open"* ]]
	done
	chmod 600 "$D/key"
	printf 'short\n' > "$D/short"
	chmod 600 "$D/short"
	run -2 --separate-stderr timeout -k 20 5 rl-queue serve --listen "tcp://127.0.0.1:$(free_port)" --auth-key-file "$D/short"
	[[ $stderr == *"'$D/short': the key has 5 bytes; at least 16"* ]]
	run -2 --separate-stderr timeout -k 20 5 rl-queue serve --listen "tcp://127.0.0.1:$(free_port)" --auth-key-file "$D/none"
	[[ $stderr == *"'$D/none': No such file"* ]]
}

@test "rl-queue serve: a key is enough for a public listen; without one it is refused" {
	p=$(free_port)
	run -2 --separate-stderr timeout -k 20 5 rl-queue serve --listen "tcp://0.0.0.0:$p"
	[[ $stderr == *"not a loopback address"* ]]
	rl-queue serve --listen "tcp://0.0.0.0:$p" -q --auth-key-file "$D/key" 3>&- &
	PIDS="$PIDS $!"
	for _ in $(seq 100); do
		with_key rl-queue stat --timeout 0.5 "tcp://127.0.0.1:$p" >/dev/null 2>&1 && break
		sleep 0.05
	done
	run -0 with_key rl-queue stat --timeout 0.5 "tcp://127.0.0.1:$p"
}

# status code and body of GET http://$1$2, with header $3 when given
http_code() {
	python3 - "http://$1$2" "${3:-}" <<'PY'
import sys, urllib.error, urllib.request
req = urllib.request.Request(sys.argv[1])
if sys.argv[2]:
    k, v = sys.argv[2].split(": ", 1)
    req.add_header(k, v)
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        print(r.status, r.read()[:40].decode("utf-8", "replace").replace("\n", " "))
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode("utf-8", "replace").strip())
PY
}

@test "rl-queue --http with --auth-key-file: /api/stats and /metrics need the key as a bearer token; the page does not" {
	for _ in $(seq 5); do
		URL="tcp://127.0.0.1:$(free_port)"
		HTTP="127.0.0.1:$(free_port)"
		rl-queue serve --listen "$URL" --http "$HTTP" -q --auth-key-file "$D/key" 3>&- &
		PIDS="$PIDS $!"
		for _ in $(seq 100); do
			http_code "$HTTP" / 2>/dev/null | grep -q '^200' && break 2
			sleep 0.05
		done
	done
	key=$(head -n 1 "$D/key")
	run -0 http_code "$HTTP" /api/stats
	[[ $output == "401 this broker has a shared key: send 'Authorization: Bearer KEY'"* ]]
	run -0 http_code "$HTTP" /metrics "Authorization: Bearer wrong key of some length"
	[[ $output == "401 "* ]]
	run -0 http_code "$HTTP" /api/stats "Authorization: Bearer $key"
	[[ $output == "200 {"* ]]
	run -0 http_code "$HTTP" /metrics "Authorization: bearer $key"
	[[ $output == "200 #"* ]]
	run -0 http_code "$HTTP" /
	[[ $output == "200 "* ]]
	# HEAD and a request with a body get no data without the key either
	run -0 python3 - "$HTTP" "$key" <<'EOF'
import http.client, sys
def ask(method, path, headers={}, body=None):
    c = http.client.HTTPConnection(sys.argv[1], timeout=5)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data
print(*ask("HEAD", "/api/stats"))
print(*ask("HEAD", "/metrics", {"Authorization": "Bearer " + sys.argv[2]}))
status, data = ask("POST", "/api/stats", body=b"x" * 100000)
print(status, b"rlqueue" in data or b"{" in data)
EOF
	[ "${lines[0]}" = "401 b''" ]
	[ "${lines[1]}" = "200 b''" ]
	[ "${lines[2]}" = "413 False" ]
}

@test "rl-reward --auth-key-file: scores a keyed broker's records; without the key it exits 1 and nothing is leased" {
	start_auth_broker
	python3 -c '
import json
for i in range(4):
    print(json.dumps({"id": 100 + i, "group": 7, "index": i, "group_size": 4,
                      "response_text": "%d" % i, "meta": {"answer": "2", "task": "arith"}}))' > "$D/g4.jsonl"
	with_key rl-queue put -q --stage generated "$URL" "$D/g4.jsonl"
	run -1 --separate-stderr timeout -k 20 30 rl-reward --queue "$URL" -t arith --idle-exit 2
	[[ $stderr == *"requires a shared key"* ]]
	with_key rl-queue stat "$URL" > "$D/st"
	grep -q 'generated 4 ' "$D/st"
	run -0 --separate-stderr timeout -k 20 30 rl-reward --queue "$URL" -t arith --idle-exit 2 --auth-key-file "$D/key"
	with_key rl-queue stat "$URL" > "$D/st"
	grep -q 'scored 4 ' "$D/st"
}

@test "rl-sync --auth-key-file: push and pull with the key; without it or with another key refused on both sides and nothing published" {
	mkdir -p "$D/ck"
	head -c 300000 /dev/urandom > "$D/ck/model.safetensors"
	echo '{"model_type":"gpt2"}' > "$D/ck/config.json"
	K=(--auth-key-file "$D/key")
	for _ in 1 2 3; do
		U="tcp://127.0.0.1:$(free_port)"
		rl-sync serve --listen "$U" "${K[@]}" --no-shm 3>&- 2>"$D/serve.err" &
		PIDS="$PIDS $!"
		for _ in $(seq 50); do rl-sync status "${K[@]}" --timeout 300 "$U" >/dev/null 2>&1 && break 2; sleep 0.1; done
	done
	run -1 --separate-stderr rl-sync push "$U" "$D/ck" --version 5
	[[ $stderr == *"requires a shared key"*"--auth-key-file"* ]]
	run -1 --separate-stderr rl-sync push --auth-key-file "$D/other" "$U" "$D/ck" --version 6
	[[ $stderr == *"wrong shared key"* ]]
	grep -q "refused a request (op .*): this rl-sync server requires a shared key" "$D/serve.err"
	grep -q "refused a request (op .*): wrong shared key" "$D/serve.err"
	run -0 rl-sync status "${K[@]}" "$U"
	assert_output --partial 'latest: 0'
	run -0 --separate-stderr rl-sync push "${K[@]}" "$U" "$D/ck" --version 8
	run -1 --separate-stderr rl-sync pull --transport stream "$U" --out "$D/out0"
	[[ $stderr == *"requires a shared key"* ]]
	[ ! -e "$D/out0/v000008/model.safetensors" ]
	run -0 --separate-stderr rl-sync pull "${K[@]}" --transport stream "$U" --out "$D/out"
	cmp "$D/out/v000008/model.safetensors" "$D/ck/model.safetensors"
}

@test "the queue wiring with a key: rl-rollout, rl-reward and rl-train train a step; rl-rollout and rl-train without it are refused and lease nothing" {
	start_auth_broker
	write_model "$D"
	head -4 "$D/prompts.jsonl" > "$D/p.jsonl"
	with_key rl-queue put -q "$URL" "$D/p.jsonl"
	run -1 --separate-stderr timeout -k 20 60 rl-rollout -m "$D/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1
	[[ $stderr == *"requires a shared key"* ]]
	with_key rl-queue stat "$URL" > "$D/st"
	grep -q 'prompt 4 ' "$D/st"
	timeout -k 20 60 rl-rollout -q -m "$D/m0" -n 2 --max-tokens 4 --queue "$URL" --idle-exit 1 --auth-key-file "$D/key"
	timeout -k 20 60 rl-reward -q --queue "$URL" -t arith --idle-exit 1 --auth-key-file "$D/key"
	run -1 --separate-stderr timeout -k 20 60 rl-train -m "$D/m0" --out "$D/ck0" --batch 2 --queue "$URL" --idle-exit 1
	[[ $stderr == *"requires a shared key"* ]]
	with_key rl-queue stat "$URL" > "$D/st"
	grep -q 'scored 8 ' "$D/st"
	run -0 --separate-stderr timeout -k 20 120 rl-train -m "$D/m0" --out "$D/ck" --batch 2 --queue "$URL" --idle-exit 1 \
	    --no-skip-zero-adv --metrics "$D/m.jsonl" --auth-key-file "$D/key"
	[ "$(wc -l < "$D/m.jsonl")" -ge 1 ]
}

@test "rl-sync --auth-key-file: the bulk stream and the shared memory service refuse requests without the key; nothing is served or published" {
	mkdir -p "$D/ck"
	head -c 300000 /dev/urandom > "$D/ck/model.safetensors"
	echo '{"model_type":"gpt2"}' > "$D/ck/config.json"
	K=(--auth-key-file "$D/key")
	for _ in 1 2 3; do
		U="tcp://127.0.0.1:$(free_port)"
		rl-sync serve --listen "$U" "${K[@]}" 3>&- 2>"$D/serve.err" &
		PIDS="$PIDS $!"
		for _ in $(seq 50); do rl-sync status "${K[@]}" --timeout 300 "$U" >/dev/null 2>&1 && break 2; sleep 0.1; done
	done
	rl-sync push -q "${K[@]}" --transport stream "$U" "$D/ck" --version 8
	rl-sync status -j "${K[@]}" "$U" > "$D/st.json"
	bulk=$(jq -r .bulk "$D/st.json")
	shm=$(jq -r .shm "$D/st.json")
	[[ $bulk == tcp://* ]]
	[ -n "$shm" ]
	# the bulk stream: no chunk bytes for a request without the key
	run -0 python3 "$BATS_TEST_DIRNAME/rls_raw.py" bulk "$bulk" 8
	[[ $output == "1 "*"requires a shared key"* ]]
	grep -q "refused a bulk request: this rl-sync server requires a shared key" "$D/serve.err"
	# the shared memory service: a push of version 9 without the key is refused
	run -0 python3 "$BATS_TEST_DIRNAME/rls_raw.py" shm-put "$shm" 9
	[ "$output" = 1 ]
	grep -q "shared memory service: refused a push request: this rl-sync server requires a shared key" "$D/serve.err"
	rl-sync status -j "${K[@]}" "$U" > "$D/st.json"
	[ "$(jq .latest "$D/st.json")" = 8 ]
	[ "$(jq '[.bulk_chunks_served, .shm_pushes, .shm_served] | add' "$D/st.json")" = 0 ]
	# keyed clients sign their requests on both sockets
	rl-sync pull -q "${K[@]}" --transport stream "$U" --out "$D/o1"
	cmp "$D/o1/v000008/model.safetensors" "$D/ck/model.safetensors"
	rl-sync pull -q "${K[@]}" --transport shm "$U" --out "$D/o2"
	cmp "$D/o2/v000008/model.safetensors" "$D/ck/model.safetensors"
	rl-sync status -j "${K[@]}" "$U" > "$D/st.json"
	[ "$(jq .bulk_chunks_served "$D/st.json")" -gt 0 ]
	[ "$(jq .shm_served "$D/st.json")" -ge 1 ]
}

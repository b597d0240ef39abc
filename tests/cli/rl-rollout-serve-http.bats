#!/usr/bin/env bats
# rl-rollout serve against hostile clients (issue 36): what a client can
# hold is bounded by --http-max-conns and --http-timeout (base/httpd.c).
# The connection over the bound is answered 503 and closed while the others
# are held; an idle keep-alive connection is closed after --http-timeout; a
# head sent a byte at a time past the deadline gets 408 and is closed; a
# body over --max-body is answered 413 and the connection closed; a
# streaming client that stops reading is dropped (its request cancelled)
# without the server's memory growing with what it would not take.  Raw
# sockets from python3; servers are killed by pid in teardown.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load model_helper
load port_helper
load serve_helper

setup_file() {
	export TD=$(mktemp -d /tmp/rl-serve-http-bats.XXXXXX)
	toy_model "$TD" 1 256
	# long answers with every top log-prob: many bytes a token
	mkdir -p "$TD/slow"
	cat > "$TD/slow/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":128,"max_position_embeddings":8192,"torch_dtype":"float32"}
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

start_serve() {
	serve_at - "$TD/serve.err" "$@"
}

metric() {
	curl -s "$SURL/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}

@test "--http-max-conns N: N idle connections held, the next answered 503 and closed; served again once they go" {
	start_serve -m "$TD/m0" --http-max-conns 3 --http-timeout 30
	run -0 timeout -k 20 20 python3 - "${SURL##*:}" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
time.sleep(0.3)
extra = socket.create_connection(("127.0.0.1", port))
extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
data = b""
while True:
    b = extra.recv(4096)
    if not b:
        break
    data += b
print(data.split(b"\r\n")[0].decode())
print("closed" if b"Connection: close" in data else "open")
# the held ones are still served
held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
print(held[0].recv(4096).split(b"\r\n")[0].decode())
for s in held:
    s.close()
time.sleep(0.3)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
print(s.recv(4096).split(b"\r\n")[0].decode())
PY
	[ "${lines[0]}" = "HTTP/1.1 503 Service Unavailable" ]
	[ "${lines[1]}" = closed ]
	[ "${lines[2]}" = "HTTP/1.1 200 OK" ]
	[ "${lines[3]}" = "HTTP/1.1 200 OK" ]
	grep -q -- "--http-max-conns bound" "$TD/serve.err"
}

@test "--http-timeout: an idle keep-alive connection is closed; a head sent a byte at a time past it gets 408 and is closed" {
	start_serve -m "$TD/m0" --http-timeout 1
	run -0 timeout -k 20 20 python3 - "${SURL##*:}" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
# idle after one answer
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s.recv(4096)
t0 = time.time()
print("idle", s.recv(4096) == b"", round(time.time() - t0, 1))
# never a request at all
s = socket.create_connection(("127.0.0.1", port))
t0 = time.time()
print("silent", s.recv(4096) == b"", round(time.time() - t0, 1))
# a head a byte every 0.2 s: 40 bytes would take 8 s
s = socket.create_connection(("127.0.0.1", port))
head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaa\r\n\r\n"
t0 = time.time()
got = b""
try:
    for ch in head:
        s.sendall(bytes([ch]))
        time.sleep(0.2)
        s.setblocking(False)
        try:
            b = s.recv(4096)
            got += b
            if not b or b"\r\n\r\n" in got:
                break
        except BlockingIOError:
            pass
        s.setblocking(True)
except (BrokenPipeError, ConnectionResetError):
    pass
s.setblocking(True)
s.settimeout(3)
try:
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
except (ConnectionResetError, socket.timeout):
    pass
print("slow", got.split(b"\r\n")[0].decode() or "-", round(time.time() - t0, 1))
PY
	echo "$output"
	read -r _ closed secs <<<"${lines[0]}"
	[ "$closed" = True ]
	python3 -c "assert 0.8 <= $secs < 3, $secs"
	read -r _ closed secs <<<"${lines[1]}"
	[ "$closed" = True ]
	python3 -c "assert 0.8 <= $secs < 3, $secs"
	[[ "${lines[2]}" == "slow HTTP/1.1 408 Request Timeout "* ]]
	secs=${lines[2]##* }
	python3 -c "assert 0.8 <= $secs < 4, $secs"
	# the server goes on
	[ "$(curl -s -o /dev/null -w '%{http_code}' "$SURL/health")" = 200 ]
}

@test "a body over --max-body is answered 413 in OpenAI's JSON before it is read, and the connection closed" {
	start_serve -m "$TD/m0" --max-body 4K
	run -0 timeout -k 20 20 python3 - "${SURL##*:}" <<'PY'
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
# announces 1 GB, sends none of it
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
head, body = data.split(b"\r\n\r\n", 1)
print(head.split(b"\r\n")[0].decode())
print("close" if b"\r\nConnection: close" in head else "keep")
print(json.loads(body)["error"]["code"])
PY
	[ "${lines[0]}" = "HTTP/1.1 413 Content Too Large" ]
	[ "${lines[1]}" = close ]
	[ "${lines[2]}" = request_too_large ]
	# chunked bodies are not taken
	[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary '{}' "$SURL/v1/completions")" = 411 ]
}

@test "a streaming client that stops reading is dropped and its request cancelled; the server's memory does not grow with it" {
	start_serve -m "$TD/slow/m0" --max-tokens 8000 --slots 2 --http-timeout 2
	rss0=$(awk '/^VmRSS/ { print $2 }' "/proc/$SPID/status")
	timeout -k 20 60 python3 - "${SURL##*:}" <<'PY' &
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", int(sys.argv[1])))
body = (b'{"model":"m0","messages":[{"role":"user","content":"x"}],"max_tokens":8000,"temperature":0,'
        b'"logprobs":true,"top_logprobs":20,"stream":true}')
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
# reads nothing; holds the connection until the server gives up on it
time.sleep(40)
PY
	client=$!
	PIDS="$PIDS $client"
	max=0
	for _ in $(seq 300); do
		r=$(awk '/^VmRSS/ { print $2 }' "/proc/$SPID/status")
		[ "$r" -gt "$max" ] && max=$r
		[ "$(metric rlserve_cancelled_total)" = 1 ] && break
		sleep 0.1
	done
	kill "$client" 2>/dev/null || true
	[ "$(metric rlserve_cancelled_total)" = 1 ]
	[ "$(metric rlserve_running_sequences)" = 0 ]
	echo "rss: ${rss0} kB at the start, ${max} kB at most" >&3
	# the events not taken (1 MiB in the server at most, the rest in socket
	# buffers) against the 8000 tokens' ~20 MB it would have sent
	[ "$((max - rss0))" -lt 16000 ]
	[ "$(metric rlserve_generated_tokens_total)" -lt 8000 ]
	# and the server serves the next request
	[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST --data-binary '{"model":"m0","prompt":"a","max_tokens":2}' "$SURL/v1/completions")" = 200 ]
}

@test "--http-max-conns and --http-timeout: bad values are usage errors" {
	run -2 rl-rollout serve -m "$TD/m0" --http-max-conns 0
	[[ "$output" == *"--http-max-conns"* ]]
	run -2 rl-rollout serve -m "$TD/m0" --http-timeout 0
	[[ "$output" == *"--http-timeout"* ]]
}

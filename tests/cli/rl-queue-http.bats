#!/usr/bin/env bats
# rl-queue serve --http: /metrics checked by a strict Prometheus text-format
# parser after records flowed through the broker, its numbers against
# `rl-queue stat --json`; /api/stats; the dashboard page; loopback-only
# binds; malformed requests; request bodies (413) and methods (405);
# long request heads (431), the connection bound (503) and deadlines,
# keep-alive and pipelining, a client that does not read, curl;
# `rl-queue stat --watch`.  Everything on
# 127.0.0.1; brokers are killed by pid in teardown.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load queue_helper

setup() {
	bats_require_minimum_version 1.5.0
	D=$(mktemp -d /tmp/rlq-http-bats.XXXXXX)
	PIDS=""
	write_records "$D"
}

teardown() {
	kill_pids
	rm -rf "$D"
}

# fetch PATH: the Content-Type, then the body of http://$HTTP/PATH (fails on a non-2xx status)
fetch() { TYPED=1 http_get "$HTTP" "$1"; }

start_broker() { start_http_broker "" "$@"; }

# flow: records through every stage, one lease left to expire
flow() {
	rl-queue put -q "$URL" "$D/prompts.jsonl"
	rl-queue get -q --stage rollout -n 2 "$URL" > /dev/null
	rl-queue get -q --stage rollout -n 1 --lease-timeout 0.2 "$URL" > /dev/null
	rl-queue put -q --stage scored "$URL" "$D/scored.jsonl"
	rl-queue get -q --stage train -n 4 --ack "$URL" > /dev/null
	sleep 0.5   # the 0.2 s lease expires
}

@test "/metrics is strict Prometheus text and agrees with rl-queue stat --json" {
	start_broker --max-staleness 2 --train-batch 4
	flow
	fetch /metrics > "$D/metrics.txt"
	rl-queue stat --json "$URL" > "$D/stat.json"
	run python3 - "$D/metrics.txt" "$D/stat.json" "$BATS_TEST_DIRNAME" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[3])
from promparse import parse   # the strict text-format parser the tests share
text = open(sys.argv[1]).read()
st = json.load(open(sys.argv[2]))
ctype, _, body = text.partition("\n")
assert ctype.startswith("text/plain; version=0.0.4"), ctype
typed, samples = parse(body)

def agree(key, want):
    got = samples.get(key)
    assert got is not None, "missing " + key
    assert got == want, "%s: metrics %r, stat %r" % (key, got, want)

agree("rlqueue_trainer_version", st["version"])
agree("rlqueue_inflight_samples", st["inflight"])
agree("rlqueue_inflight_cap_samples", st["inflight_cap"])
agree("rlqueue_memory_bytes", st["bytes"])
agree("rlqueue_groups", st["groups"])
agree("rlqueue_leases", st["leases"])
for s, n in st["depth"].items():
    agree('rlqueue_depth{state="%s"}' % s, n)
for k in ("prompt", "generated", "scored"):
    agree('rlqueue_put_records_total{kind="%s"}' % k, st["total"]["put_" + k])
for k in ("rollout", "reward", "train"):
    agree('rlqueue_leased_records_total{stage="%s"}' % k, st["total"]["leased_" + k])
    assert 'rlqueue_leased_records_per_second{stage="%s"}' % k in samples
agree("rlqueue_done_records_total", st["total"]["done"])
agree("rlqueue_lease_expiries_total", st["total"]["expired_leases"])
agree("rlqueue_stale_dropped_total", st["total"]["stale_dropped"])
cum = 0
for i, n in enumerate(st["staleness"][:-1]):
    cum += n
    agree('rlqueue_staleness_bucket{le="%d"}' % i, cum)
agree('rlqueue_staleness_bucket{le="+Inf"}', sum(st["staleness"]))
agree("rlqueue_staleness_count", sum(st["staleness"]))
agree("rlqueue_staleness_sum", st["staleness_sum"])
assert typed["rlqueue_staleness"] == "histogram"
# the records really flowed
assert st["total"]["done"] == 4 and st["total"]["expired_leases"] >= 1, st["total"]
assert st["staleness"][0] == 4, st["staleness"]
print("ok", len(samples), "samples")
EOF
	assert_success
	assert_output --partial "ok "
}

@test "/api/stats is the JSON of rl-queue stat --json" {
	start_broker
	flow
	fetch /api/stats > "$D/api.txt"
	rl-queue stat --json "$URL" > "$D/stat.json"
	run python3 - "$D/api.txt" "$D/stat.json" <<'EOF'
import json, sys
ctype, body = open(sys.argv[1]).read().split("\n", 1)
assert ctype == "application/json", ctype
a, s = json.loads(body), json.load(open(sys.argv[2]))
assert set(a) == set(s), (sorted(a), sorted(s))
for k in ("depth", "total", "staleness", "version", "groups"):
    assert a[k] == s[k], (k, a[k], s[k])
print("ok")
EOF
	assert_success
	assert_output "ok"
}

@test "the dashboard page is self-contained HTML that polls /api/stats" {
	start_broker
	fetch / > "$D/page.txt"
	run python3 - "$D/page.txt" <<'EOF'
import re, sys
ctype, body = open(sys.argv[1]).read().split("\n", 1)
assert ctype.startswith("text/html"), ctype
assert body.lstrip().lower().startswith("<!doctype html>")
assert "<canvas" in body and "api/stats" in body and "<script>" in body
# Chart.js (Debian's libjs-chart.js) is inline, whole: its header comment
# names its web site, which the page never fetches (rl-queue-dashboard.bats
# checks the browser's requests); the rest of the page names nothing outside
js = open("/usr/share/javascript/chart.js/chart.min.js").read()
assert body.count("<script>\n" + js + "\n</script>\n") == 1, "Chart.js is not inline"
body = body.replace("<script>\n" + js + "\n</script>\n", "")
ext = re.findall(r"(?:https?:)?//[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}|<script[^>]*\ssrc=|<link[^>]*\shref=", body)
assert not ext, "external references: %r" % ext
assert "@import" not in body and "url(" not in body
print("ok")
EOF
	assert_success
	assert_output "ok"
	run python3 -c 'import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen("http://'"$HTTP"'/no-such-page", timeout=5)
except urllib.error.HTTPError as e:
    print(e.code)'
	assert_output "404"
}

@test "--http refuses non-loopback binds unless --http-public, and bad addresses" {
	for a in 0.0.0.0:9 192.0.2.1:9 '[::]:9' example.org:9; do
		run --separate-stderr rl-queue serve --listen tcp://127.0.0.1:1 --http "$a"
		assert_failure 2
		[[ "$stderr" == *"not a loopback address"* ]]
		[[ "$stderr" == *"--http-public"* ]]
	done
	for a in nonsense 127.0.0.1 127.0.0.1:99999 https://127.0.0.1:9 127.0.0.1:9/x ::1:9; do
		run --separate-stderr rl-queue serve --listen tcp://127.0.0.1:1 --http "$a"
		assert_failure 2
		[[ "$stderr" == *"--http: bad value '$a' (HOST:PORT"* ]]
	done
	# an HTTP port already taken: exit 3, naming the address (again on another
	# --listen port if that one was taken between free_port and the listen)
	start_broker
	for try in 1 2 3; do
		run --separate-stderr timeout -k 20 10 rl-queue serve --listen "tcp://127.0.0.1:$(free_port)" --http "$HTTP" 3>&-
		[[ "$stderr" == *"cannot listen on 'tcp://"* ]] || break
	done
	assert_failure 3
	[[ "$stderr" == *"cannot listen on 'http://$HTTP'"* ]]
}

@test "malformed HTTP requests leave the listener and the broker serving" {
	start_broker
	run python3 - "$HTTP" <<'EOF'
import socket, sys, os
host, port = sys.argv[1].rsplit(":", 1)
def send(data, read=True):
    # the server may close on us mid-way: that is an answer too
    s = socket.create_connection((host, int(port)), timeout=3)
    try:
        s.sendall(data)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        return s.recv(4096)
    except OSError:
        return b""
    finally:
        s.close()
replies = [
    send(os.urandom(2048)),
    send(b"\x00\xff\xfe GET / HTTP/1.1\r\n\r\n"),
    send(b"GET /metrics HTTP/9.9\r\n\r\n"),
    send(b"GET " + b"/a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"y" * 100000 + b"\r\n\r\n"),
    send(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nabc"),
    send(b"GET /api/stats HTTP/1.1\r\nHost", read=False),   # half a request, then gone
]
assert all(r == b"" or r.startswith(b"HTTP/1.") for r in replies[:-1]), replies
assert replies[2].startswith(b"HTTP/1.1 505"), replies[2][:40]
assert replies[5].startswith(b"HTTP/1.1 413"), replies[5][:40]
print("sent")
EOF
	assert_success
	run fetch /metrics
	assert_success
	assert_output --partial "rlqueue_trainer_version"
	run rl-queue stat --json "$URL"
	assert_success
}

@test "request bodies are answered 413 before they are read (40 concurrent 24 MiB and 40 of 1 MB leave the broker's memory flat); other methods 405; the broker keeps serving" {
	start_broker --http-max-conns 100   # 80 at once: over the default bound of 64
	run python3 - "$HTTP" "$BROKER" <<'EOF'
import socket, sys, threading
host, port = sys.argv[1].rsplit(":", 1)
pid = sys.argv[2]

def hwm_mib():
    for line in open("/proc/%s/status" % pid):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0

def one(out, method, path, n):
    # the head first: the answer must come before any of the body is sent
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (method, path, n)).encode())
    rep = s.recv(4096)
    sent, chunk = 0, bytes(65536)
    try:
        while sent < n:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    s.close()
    out.append(rep)

h0 = hwm_mib()
out = []
jobs = [("POST", "/api/stats", 24 << 20)] * 40 + [("PUT", "/metrics", 1000000)] * 20 + [("GET", "/", 1000000)] * 20
th = [threading.Thread(target=one, args=(out, m, p, n)) for m, p, n in jobs]
for t in th:
    t.start()
for t in th:
    t.join()
grew = hwm_mib() - h0
assert len(out) == len(jobs), len(out)
for r in out:
    assert r.startswith(b"HTTP/1.1 413"), r[:60]
    assert b"connection: close" in r.lower(), r
    assert b"take no request body" in r, r
print("413 x%d, peak RSS grew %.1f MiB" % (len(out), grew))
assert grew < 16, grew

def ask(req):
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(req)
    r = s.recv(65536)
    s.close()
    return r
r = ask(b"DELETE /api/stats HTTP/1.1\r\nHost: x\r\n\r\n")
assert r.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in r, r[:200]
r = ask(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
assert r.startswith(b"HTTP/1.1 200") and r.endswith(b"\r\n\r\n"), r[-60:]
r = ask(b"GET /api/stats HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
assert r.startswith(b"HTTP/1.1 200"), r[:60]
EOF
	assert_success
	assert_output --partial "413 x80"
	run fetch /api/stats
	assert_success
	run rl-queue stat --json "$URL"
	assert_success
}

@test "long request heads: every one over 8 KiB is answered 431 and closed (20 at once of 64 KiB, 20 of 4 MB; the broker's memory flat), one of 6 KB is served; 500 idle connections cost a few KiB each" {
	start_broker --http-max-conns 600
	run python3 - "$HTTP" "$BROKER" <<'EOF'
import collections, socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
pid = sys.argv[2]

def status(key):
    for line in open("/proc/%s/status" % pid):
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0

def head(nbytes, end):
    # the whole head is sent before anything is read, as a careless client would
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\n")
    sent, i = 0, 0
    try:
        while sent < nbytes:
            line = b"X-Pad-%d: %s\r\n" % (i, b"a" * 200)
            s.sendall(line)
            sent += len(line)
            i += 1
        if end:
            s.sendall(b"Connection: close\r\n\r\n")
    except OSError:
        pass   # the server stopped reading: what it answered is still there
    try:
        r = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            r += d
        r = r.split(b"\r\n")[0] + (b" +closed" if r else b"closed")
    except socket.timeout:
        r = b"not closed in 5 s"
    except OSError:
        r = b"reset"
    s.close()
    return r

h0 = status("VmHWM:")
for size in (64 << 10, 4 << 20):
    out = []
    th = [threading.Thread(target=lambda: out.append(head(size, False))) for _ in range(20)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    print("20 heads of %d bytes: %s" % (size, dict(collections.Counter(out))))
    assert out == [b"HTTP/1.1 431 Request Header Fields Too Large +closed"] * 20, out
grew = status("VmHWM:") - h0
print("peak RSS grew %.1f MiB" % grew)
assert grew < 8, grew
r = head(6000, True)
assert r == b"HTTP/1.1 200 OK +closed", r

r0 = status("VmRSS:")
conns = [socket.create_connection((host, int(port)), timeout=5) for _ in range(500)]
time.sleep(0.5)
per = (status("VmRSS:") - r0) * 1024 / len(conns)
print("500 idle connections: %.1f KiB each" % per)
assert per < 32, per
for c in conns:
    c.close()
EOF
	echo "$output"
	assert_success
	assert_output --partial "20 heads of 4194304 bytes"
	run fetch /api/stats
	assert_success
}

@test "--http-max-conns 8: the 9th connection is answered 503 and closed, one is served again once a slot frees, and 2,000 refused attempts leave the broker's memory flat" {
	start_broker --http-max-conns 8
	run python3 - "$HTTP" "$BROKER" <<'EOF'
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
pid = sys.argv[2]
def rss():
    for line in open("/proc/%s/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
def read_all(s):
    r = b""
    while True:
        d = s.recv(65536)
        if not d:
            return r
        r += d
idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(8)]
time.sleep(0.2)
s = socket.create_connection((host, int(port)), timeout=5)
r = read_all(s)   # nothing sent: the answer comes, then the close
s.close()
assert r.startswith(b"HTTP/1.1 503 "), r[:80]
assert b"\r\nConnection: close\r\n" in r and b"\r\nRetry-After: 1\r\n" in r, r
assert r.endswith(b"too many connections to this listener; try again\n"), r
idle.pop().close()
time.sleep(0.2)
s = socket.create_connection((host, int(port)), timeout=5)
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
r = read_all(s)
s.close()
assert r.startswith(b"HTTP/1.1 200 ") and b"rlqueue_trainer_version" in r, r[:80]
# the slot it used is free again; fill it, then 2,000 attempts over the bound
idle.append(socket.create_connection((host, int(port)), timeout=5))
time.sleep(0.2)
r0, n503 = rss(), 0
for i in range(2000):
    s = socket.create_connection((host, int(port)), timeout=5)
    try:
        n503 += read_all(s).startswith(b"HTTP/1.1 503 ")
    except OSError:
        pass
    s.close()
grew = rss() - r0
print("2000 attempts: %d answered 503, RSS grew %.2f MiB" % (n503, grew))
assert n503 == 2000, n503
assert grew < 2, grew
for c in idle:
    c.close()
EOF
	echo "$output"
	assert_success
	run fetch /metrics
	assert_success
	# the bound's values
	run -2 --separate-stderr rl-queue serve --listen tcp://127.0.0.1:1 --http 127.0.0.1:1 --http-max-conns 0
	[[ "$stderr" == *"--http-max-conns: bad value '0'"* ]]
	run -2 --separate-stderr rl-queue serve --listen tcp://127.0.0.1:1 --http 127.0.0.1:1 --http-timeout never
	[[ "$stderr" == *"--http-timeout: bad value 'never'"* ]]
}

@test "--http-timeout 1: an idle connection closes after ~1 s, a slow head (a byte every 0.25 s) at its deadline with 408, one that took a response and went quiet 1 s later" {
	start_broker --http-timeout 1
	run python3 - "$HTTP" <<'EOF'
import socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
def conn():
    return socket.create_connection((host, int(port)), timeout=5)
def until_closed(s):
    r = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return r
            r += d
    except ConnectionResetError:
        return r + b"<reset>"

def idle(res):
    s, t0 = conn(), time.time()
    r = until_closed(s)
    res["idle"] = (time.time() - t0, r)

def loris(res):
    s, t0 = conn(), time.time()
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    def drip():
        for b in req:
            try:
                s.send(bytes([b]))
            except OSError:
                return
            time.sleep(0.25)
    threading.Thread(target=drip, daemon=True).start()
    r = until_closed(s)
    res["loris"] = (time.time() - t0, r)

def keepalive(res):
    s = conn()
    s.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\n\r\n")
    t0 = time.time()
    r = until_closed(s)
    res["kept"] = (time.time() - t0, r)

res = {}
th = [threading.Thread(target=f, args=(res,)) for f in (idle, loris, keepalive)]
for t in th:
    t.start()
for t in th:
    t.join()
for k, (t, r) in sorted(res.items()):
    print("%s: closed after %.2f s: %r" % (k, t, r[:40]))
t, r = res["idle"]
assert 0.9 <= t < 2.5 and r == b"", res["idle"]
t, r = res["loris"]   # 35 bytes at 4 a second would take ~9 s
assert 0.9 <= t < 2.5 and r.startswith(b"HTTP/1.1 408 "), res["loris"]
t, r = res["kept"]    # its response, then closed a second after it
assert 0.9 <= t < 2.5 and r.startswith(b"HTTP/1.1 200 ") and r.count(b"HTTP/1.1") == 1, res["kept"]
print("ok")
EOF
	echo "$output"
	assert_success
	assert_output --partial "ok"
	run fetch /metrics
	assert_success
}

@test "keep-alive: requests on one connection, HEAD without a body, pipelined requests answered in order, HTTP/1.0 closes, strict parsing answers 400 and closes" {
	start_broker
	run python3 - "$HTTP" <<'EOF'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)

def read_response(f, head_only=False):
    status = f.readline()
    hdr = {}
    while True:
        l = f.readline()
        if l in (b"\r\n", b""):
            break
        k, v = l.decode().split(":", 1)
        hdr[k.strip().lower()] = v.strip()
    n = 0 if head_only else int(hdr["content-length"])
    return status, hdr, f.read(n)

s = socket.create_connection((host, int(port)), timeout=5)
f = s.makefile("rb")
for path in ("/api/stats", "/metrics"):
    s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    st, h, body = read_response(f)
    assert st.startswith(b"HTTP/1.1 200") and "connection" not in h, (st, h)
    assert len(body) == int(h["content-length"]) > 0
s.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
st, h, body = read_response(f, head_only=True)
page_len = int(h["content-length"])
assert st.startswith(b"HTTP/1.1 200") and page_len > 100000, (st, h)
# pipelined: three requests in one write, answered in order; the HEAD's
# response has no body, so the next status line follows its headers
s.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
          b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
st1, h1, b1 = read_response(f)
st2, h2, b2 = read_response(f, head_only=True)
st3, h3, b3 = read_response(f)
assert st1.startswith(b"HTTP/1.1 200") and h1["content-type"] == "application/json" and b1.startswith(b"{"), st1
assert st2.startswith(b"HTTP/1.1 200") and h2["content-type"].startswith("text/plain; version=0.0.4"), st2
assert st3.startswith(b"HTTP/1.1 404"), st3
# Connection: close ends it after the response
s.sendall(b"GET /api/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
st, h, body = read_response(f)
assert h["connection"] == "close" and f.read() == b"", h
s.close()

def once(req):
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(req)
    r = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        r += d
    s.close()
    return r
# HTTP/1.0: closed after the response unless it asks to keep it
r = once(b"GET /api/stats HTTP/1.0\r\n\r\n")
assert r.startswith(b"HTTP/1.1 200") and b"\r\nConnection: close\r\n" in r, r[:200]
bad = [b"GET /metrics HTTP/1.1\r\n\r\n",                         # no Host
       b"GET /metrics HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",    # two
       b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",              # space before the colon
       b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
       b"GET /metrics HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",       # a bare LF
       b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
       b"GET  /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
       b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n",
       b"GET /metrics HTTP/1.1 \r\nHost: x\r\n\r\n",
       b"GET /metrics HTTP/11\r\nHost: x\r\n\r\n",
       b"G(T /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
       b"\r\nGET /metrics\r\n\r\n"]
for req in bad:
    r = once(req)
    assert r.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close\r\n" in r, (req, r[:80])
assert once(b"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 505 ")
r = once(b"GET /api/stats HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
assert r.startswith(b"HTTP/1.1 413 ") and r.endswith(b"take no request body\n"), r
# empty lines before a request, an absolute-form target and a query are taken
r = once(b"\r\nGET http://x/api/stats?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
assert r.startswith(b"HTTP/1.1 200 "), r[:80]
print("ok")
EOF
	echo "$output"
	assert_success
	assert_output --partial "ok"
}

@test "a client that asks for the page many times and never reads does not stop others being served; its deadline closes it" {
	start_broker --http-timeout 4
	run python3 - "$HTTP" <<'EOF'
import socket, sys, time, urllib.request
host, port = sys.argv[1].rsplit(":", 1)
base = "http://%s" % sys.argv[1]
page = len(urllib.request.urlopen(base + "/", timeout=5).read())
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(5)
s.connect((host, int(port)))
# 40 pipelined requests for the page: 40 x its size, far beyond what the
# kernel's buffers hold, never read
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 40)
t0 = time.time()
for i in range(20):
    r = urllib.request.urlopen(base + "/metrics", timeout=5)
    assert r.status == 200 and b"rlqueue_trainer_version" in r.read()
served = time.time() - t0
print("page %d bytes; 20 scrapes while stuck: %.2f s" % (page, served))
assert served < 3, served   # and within its deadline: it was stuck all along
time.sleep(t0 + 4.5 - time.time())   # past its deadline: closed with most of its responses unsent
got = 0
try:
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        got += len(d)
except ConnectionResetError:
    pass
print("it got %d of %d bytes, then the close" % (got, 40 * page))
assert got < 40 * page
EOF
	echo "$output"
	assert_success
}

@test "independent clients: curl and python's http.client read /metrics (strict Prometheus text) and /api/stats (JSON) on one connection" {
	start_broker --max-staleness 2 --train-batch 4
	flow
	if command -v curl > /dev/null; then
		# two URLs on one curl command: it reuses the connection (keep-alive)
		run curl -sS --fail -v -o "$D/m.txt" "http://$HTTP/metrics" -o "$D/a.json" "http://$HTTP/api/stats"
		assert_success
		[[ "$output" == *"Re-using existing connection"* ]]
		python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$D/a.json"
		run python3 -c 'import sys; sys.path.insert(0, sys.argv[2]); from promparse import parse
t, s = parse(open(sys.argv[1]).read()); print(len(s) > 40)' "$D/m.txt" "$BATS_TEST_DIRNAME"
		assert_output "True"
		run curl -sS -o /dev/null -w '%{http_code}' -X DELETE "http://$HTTP/metrics"
		assert_output "405"
	fi
	run python3 - "$HTTP" "$BATS_TEST_DIRNAME" <<'EOF'
import http.client, json, sys
sys.path.insert(0, sys.argv[2])
from promparse import parse
c = http.client.HTTPConnection(sys.argv[1], timeout=5)
c.request("GET", "/metrics")
r = c.getresponse()
typed, samples = parse(r.read().decode())
sock = c.sock
c.request("GET", "/api/stats")
r = c.getresponse()
st = json.loads(r.read())
assert c.sock is sock, "the connection was not kept"
assert samples["rlqueue_done_records_total"] == st["total"]["done"] == 4, (samples["rlqueue_done_records_total"], st["total"])
print("ok", len(samples))
EOF
	assert_success
	assert_output --partial "ok "
}

@test "rl-queue stat --watch refreshes the numbers until --count or a signal" {
	start_broker
	rl-queue put -q "$URL" "$D/prompts.jsonl"
	run --separate-stderr timeout -k 20 20 rl-queue stat "$URL" --watch 0.1 --count 3
	assert_success
	[ "$(grep -c '^depth: prompt 3' <<< "$output")" = 3 ]
	# JSON: one object per refresh; a change shows in the next one
	( sleep 0.5; rl-queue get -q --stage rollout -n 1 "$URL" > /dev/null ) &
	run --separate-stderr timeout -k 20 20 rl-queue stat --json --watch=0.2 --count 8 "$URL"
	assert_success
	[ "${#lines[@]}" = 8 ]
	run python3 -c 'import json, sys
d = [json.loads(l)["depth"]["leased"] for l in sys.stdin]
assert d[0] == 0 and d[-1] == 1, d
print("ok")' <<< "$output"
	assert_output "ok"
	# interrupted: exit 0
	rl-queue stat --watch 0.1 "$URL" > "$D/watch.txt" 3>&- &
	W=$!
	PIDS="$PIDS $W"
	sleep 0.4
	kill -INT "$W"
	wait "$W"
	grep -q '^depth: prompt 2' "$D/watch.txt"
	# usage
	run -2 --separate-stderr rl-queue stat --count 2 "$URL"
	run -2 --separate-stderr rl-queue stat --watch=never "$URL"
	run -2 --separate-stderr rl-queue stat "$URL" --watch soon
}

@test "rl-queue stat --watch reports a dead broker and keeps trying" {
	start_broker
	kill -9 "$BROKER"
	wait "$BROKER" 2>/dev/null || true
	run --separate-stderr timeout -k 20 20 rl-queue stat --timeout 0.2 --watch 0.1 --count 2 "$URL"
	assert_failure 1
	[ "$(grep -c 'no stats from the broker' <<< "$stderr")" = 2 ]
	# interrupted while the broker is away: exit 0 all the same, as
	# docs/observability.md says (--count is what makes a failed refresh exit 1)
	rl-queue stat --timeout 0.2 --watch 0.1 "$URL" > /dev/null 2> "$D/dead.err" 3>&- &
	W=$!
	PIDS="$PIDS $W"
	sleep 0.6
	kill -INT "$W"
	st=0; wait "$W" || st=$?
	[ "$st" -eq 0 ]
	grep -q 'no stats from the broker' "$D/dead.err"
}

@test "the page's script draws the broker's data (node with a stub DOM; no browser here)" {
	command -v node >/dev/null || skip "node is not installed"
	start_broker
	flow
	fetch / | tail -n +2 > "$D/page.html"
	cat > "$D/run.js" <<'JS'
"use strict";
// The page's own script (its last inline one; Chart.js is the first) with a
// stub Chart that keeps what the page gives it, and a stub DOM.
const fs = require("fs"), vm = require("vm");
const html = fs.readFileSync(process.argv[2], "utf8"), base = process.argv[3];
const scripts = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
if (scripts.length !== 2) throw new Error(scripts.length + " inline scripts, expected Chart.js and the page's");
const charts = {}, els = {}, urls = [];
class Chart {
	constructor(canvas, cfg) {
		this.data = cfg.data;
		this.options = cfg.options;
		this.scales = { x: { options: cfg.options.scales.x, ticks: [0, 1] }, y: { options: cfg.options.scales.y, ticks: [0, 1] } };
		this.chartArea = { left: 0, top: 0, right: 10, bottom: 10 };
		this.updates = 0;
		charts[canvas.id] = this;
	}
	update() { this.updates++; }
}
Chart.defaults = { font: {} };
function el(id) {
	if (els[id]) return els[id];
	const e = { id, value: "0.8", width: 420, height: 180, childNodes: [], children: [], style: {}, textContent: "",
		className: "", clientWidth: 1000,
		getContext: () => ({ getImageData: () => ({ data: [] }) }),
		setAttribute(k, v) { this["attr_" + k] = v; },
		addEventListener() {},
		appendChild(c) { this.childNodes.push(c); return c; },
		removeChild(c) { this.childNodes.splice(this.childNodes.indexOf(c), 1); },
		get firstChild() { return this.childNodes[0]; } };
	return (els[id] = e);
}
const document = {
	getElementById: el,
	createElement: (t) => el(t + Math.random()),
	createTextNode: (t) => ({ textContent: t }),
	querySelectorAll: () => [],
	body: el("body"),
};
let polls = 0;
const sandbox = {
	document, Math, Date, Error, String, Object, Array, parseInt, parseFloat, isFinite, Chart, window: {},
	fetch: (u, o) => { urls.push(u); return fetch(new URL(u, base), o); },
	setTimeout: (f) => { if (++polls < 3) setTimeout(f, 50); else setTimeout(done, 10); },
};
function text(e) { return e.textContent + e.childNodes.map(text).join(" "); }
const npts = (id) => charts[id].data.datasets.reduce((n, d) => n + d.data.length, 0);
function done() {
	const out = {
		urls,
		status: el("status").textContent,
		charts: Object.keys(charts).length,
		rate: npts("c_rate"),
		depth: npts("c_depth"),
		stale: charts.c_stale.data.datasets[0].data,
		staleLabels: charts.c_stale.data.labels,
		staleT: charts.c_stale_t.data.datasets.map((d) => [d.label, d.data.length]),
		totals: text(el("totals")),
		autokCard: el("card_autok").style.display,
		autok: npts("c_autok"),
	};
	console.log(JSON.stringify(out));
}
vm.runInNewContext(scripts[1], sandbox);
JS
	run node "$D/run.js" "$D/page.html" "http://$HTTP/"
	assert_success
	run python3 -c 'import json, sys
o = json.loads(sys.stdin.read())
assert o["urls"] and all(u == "api/stats" for u in o["urls"]), o["urls"]
assert o["status"].startswith("updated"), o["status"]
assert o["charts"] == 14, o["charts"]
assert o["autokCard"] == "none" and o["autok"] == 0, o   # a fixed K: the auto card is hidden
assert o["rate"] > 0 and o["depth"] > 0, o
b = o["stale"]   # buckets 0..7, 8+
assert len(b) == 9 and b[0] > 0 and sum(b[1:]) == 0 and o["staleLabels"][-1] == "8+", o
assert "done" in o["totals"] and "4" in o["totals"], o["totals"]
assert [l for l, n in o["staleT"]] == ["mean", "max", "K"], o["staleT"]   # the fixed bound drawn too
print("ok")' <<< "$output"
	assert_output "ok"
}

@test "every metric name /metrics emits is in rl-queue(1) (METRICS)" {
	start_broker --max-staleness 2 --train-batch 4 --data-dir "$D/j"
	flow
	# one report per stage, the rollout one with a GPU and the trainer one with a step,
	# so the worker, stage, GPU and train families appear too
	for r in '{"role":"rollout","worker":"g-1","uptime_s":2,"busy_s":1,"idle_s":1,"records":4,"tokens":40,"gpu":{"index":0,"name":"T","util":0.5,"mem_util":0.25,"mem_used":1024,"mem_total":4096}}' \
	    '{"role":"reward","worker":"s-1","uptime_s":2,"busy_s":1,"idle_s":1,"records":4,"tokens":0}' \
	    '{"role":"train","worker":"t-1","uptime_s":2,"busy_s":1,"idle_s":1,"records":4,"tokens":80,"steps":[{"version":1,"reward_mean":0.5,"response_length":10,"ppo_kl":0.01,"kl_ref":0.02,"entropy":1.5,"step_s":0.5}]}'; do
		printf '%s' "$r" > "$D/rep.json"
		run python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$URL" report "$D/rep.json"
		assert_output "0 "
	done
	fetch /metrics > "$D/metrics.txt"
	names=$(sed -n 's/^# TYPE \([a-z_]*\) .*/\1/p' "$D/metrics.txt" | sort -u)
	man=$(mandoc -Tascii "$BATS_TEST_DIRNAME/../../man/rl-queue.1" | col -b | sed -n '/^METRICS/,/^[A-Z]/p')
	n=0; missing=
	for m in $names; do
		n=$((n + 1))
		grep -q "\\b$m\\b" <<< "$man" || missing="$missing $m"
	done
	echo "checked $n names; not under METRICS in rl-queue(1):$missing"
	[ "$n" -ge 50 ]
	[ -z "$missing" ]
}

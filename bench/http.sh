#!/bin/sh
# bench/http.sh — the cost of rl-queue's HTTP listener: latency of /metrics
# and /api/stats scrapes (N sequential requests over one keep-alive
# connection), and put/lease throughput through the broker with and without
# a scraper hammering /metrics at the same time.  Prints JSON lines.
#
# usage: RL_BUILD=build sh bench/http.sh [N]
set -eu
B=${RL_BUILD:-build}/bin
N=${1:-500}
D=$(mktemp -d /tmp/rl-bench-http.XXXXXX)
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"' EXIT INT TERM

PORT=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 40000))
URL="tcp://127.0.0.1:$PORT"
HTTP="127.0.0.1:$((PORT + 1))"
"$B/rl-queue" serve --listen "$URL" --http "$HTTP" -q 3>&- &
PIDS="$PIDS $!"
for _ in $(seq 100); do
	"$B/rl-queue" stat --timeout 0.2 "$URL" >/dev/null 2>&1 && break
	sleep 0.05
done
python3 -c '
import json
for i in range(20000):
    print(json.dumps({"prompt_text": "p%d" % i, "group_size": 1}))' > "$D/p.jsonl"

# scrape latency
python3 - "$HTTP" "$N" <<'PY'
import http.client, json, sys, time
host, port = sys.argv[1].rsplit(":", 1)
n = int(sys.argv[2])
c = http.client.HTTPConnection(host, int(port), timeout=5)
for path in ("/metrics", "/api/stats"):
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        t.append(time.perf_counter() - t0)
        assert r.status == 200
    t.sort()
    print(json.dumps({"bench": "http_scrape", "path": path, "n": n, "bytes": len(body),
        "p50_ms": round(t[n // 2] * 1e3, 3), "p99_ms": round(t[int(n * 0.99)] * 1e3, 3),
        "per_s": round(n / sum(t), 1)}))
PY

# broker throughput: put 20000 prompts, lease them all; without, then with a scraper
run() { # run LABEL
	t0=$(date +%s.%N)
	"$B/rl-queue" put -q "$URL" "$D/p.jsonl"
	"$B/rl-queue" get -q --stage rollout -n 20000 --ack "$URL" > /dev/null
	t1=$(date +%s.%N)
	python3 -c "import json,sys; print(json.dumps({'bench': 'http_broker', 'scraper': '$1', 'records': 20000, 'seconds': round($t1 - $t0, 3), 'records_per_s': round(20000 / ($t1 - $t0))}))"
}
run off
python3 - "$HTTP" <<'PY' &
import http.client, sys
host, port = sys.argv[1].rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=5)
while True:
    c.request("GET", "/metrics"); c.getresponse().read()
PY
PIDS="$PIDS $!"
sed -i 's/"p\([0-9]*\)"/"q\1"/' "$D/p.jsonl"   # new ids
run on

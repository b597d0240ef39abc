#!/usr/bin/env bats
# The dashboard in a real browser: headless Chromium loads / from a broker
# fed by a short pipeline (rl-rollout, rl-reward, rl-train all reporting)
# and from an empty broker; Chart.js (Debian's libjs-chart.js, put inline by
# the broker) draws, and the canvases record what they drew (data-points,
# data-axes: each axis with its title and tick count, and data-ink: pixels
# that are not blank), read back with --dump-dom; a screenshot of the fed
# page is taken and read (its size, and that it holds many colours).  No
# request may leave the machine: Chromium runs with a proxy on a dead port
# and a resolver that finds no name, and its net log is checked for any
# request made for the page to somewhere other than the broker.  A control
# page that does reach out shows that the check catches it.  Skipped where
# Chromium is not installed (`make deps` installs it).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load queue_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	write_model "$TD"
}

setup() {
	CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
	[ -n "$CHROMIUM" ] || skip "chromium is not installed (make deps installs it)"
	D=$(mktemp -d /tmp/rlq-dash-bats.XXXXXX)
	PIDS=""
}

teardown() {
	kill_pids
	[ -z "${D:-}" ] || rm -rf "$D"
}

fetch() { http_get "$@"; }

start_broker() { start_http_broker "$@"; }

# browse URL NAME [FLAGS...]: headless Chromium (a 1400 px wide window) loads
# URL for 3 s of virtual time; the DOM goes to $D/NAME.html, the net log to
# $D/NAME.net.json
browse() {
	timeout -k 20 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \
		--window-size=1400,2200 "${@:3}" \
		--user-data-dir="$D/profile-$2" --disable-background-networking --disable-component-update \
		--disable-sync --disable-default-apps --disable-extensions --disable-domain-reliability \
		--disable-client-side-phishing-detection --disable-features=Translate,OptimizationHints,MediaRouter \
		--proxy-server=http://127.0.0.1:9 --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
		--log-net-log="$D/$2.net.json" --virtual-time-budget=3000 --dump-dom "$1" > "$D/$2.html" 2> "$D/$2.err"
}

# page_requests NAME ORIGIN: every URL the browser requested on behalf of the
# page at ORIGIN (its isolation key or initiator), one per line.  The browser's
# own traffic (update checks and the like, with no page as initiator) is left
# out; it goes to the dead proxy too.
page_requests() {
	python3 - "$D/$1.net.json" "$2" <<'EOF'
import json, sys
log, origin = json.load(open(sys.argv[1])), sys.argv[2]
site = origin.rsplit(":", 1)[0]           # http://127.0.0.1
types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
seen = set()
for e in log["events"]:
    p = e.get("params") or {}
    if types.get(e["type"]) != "URL_REQUEST_START_JOB" or "url" not in p:
        continue
    nik = p.get("network_isolation_key", "")
    if p.get("initiator") == origin or site in nik.split(" "):
        seen.add(p["url"])
print("\n".join(sorted(seen)))
EOF
}

@test "headless Chromium draws the fed broker's charts, and no request leaves the machine" {
	start_broker F --max-staleness 4
	start_broker E
	# the empty broker's page meanwhile
	browse "http://$EHTTP/" empty 3>&- &
	B=$!
	export RL_STATS_INTERVAL=0.2
	rl-queue put -q "$FURL" "$TD/prompts.jsonl"
	RL_WORKER_ID=gen-1 rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 6 --queue "$FURL" --idle-exit 1 3>&- &
	R=$!
	RL_WORKER_ID=score-1 rl-reward -q --queue "$FURL" --task length --max-length 8 --idle-exit 1.2 3>&- &
	W=$!
	PIDS="$PIDS $R $W $B"
	# every sequence trained (equal rewards would skip them all: no token means to draw)
	RL_WORKER_ID=learn-1 timeout -k 20 60 rl-train -q -m "$TD/m0" --out "$D/ck" --batch 2 --no-skip-zero-adv --queue "$FURL" \
		--idle-exit 1.5 --metrics "$D/m.jsonl"
	wait "$R"
	wait "$W"
	wait "$B"
	[ "$(wc -l < "$D/m.jsonl")" -ge 2 ]
	browse "http://$FHTTP/" fed
	browse "http://$FHTTP/" shot --screenshot="$D/fed.png" --hide-scrollbars
	run python3 "$BATS_TEST_DIRNAME/dashcheck.py" "$D/fed.html" "$D/empty.html" "$D/fed.png"
	assert_success
	assert_output --partial "ok "
	# the page's requests: only the broker, and /api/stats among them
	for name in fed empty; do
		h=$FHTTP
		[ "$name" = fed ] || h=$EHTTP
		page_requests "$name" "http://$h" > "$D/$name.urls"
		grep -qx "http://$h/api/stats" "$D/$name.urls"
		run grep -v "^http://$h/" "$D/$name.urls"
		assert_failure 1     # nothing else
		assert_output ""
	done
	# the page served is lib/queue/dashboard.html with Chart.js inline at its
	# marker, and that file names no outside address (Chart.js's own header
	# comment names its web site: the net log above shows nothing is fetched)
	fetch "$FHTTP" / > "$D/page.html"
	python3 - "$D/page.html" "$BATS_TEST_DIRNAME/../../lib/queue/dashboard.html" \
	    /usr/share/javascript/chart.js/chart.min.js <<'PY'
import sys
page, src, js = (open(p, encoding="utf-8").read() for p in sys.argv[1:])
head, tail = src.split("<!--CHARTJS-->")
assert page == head + "<script>\n" + js + "\n</script>\n" + tail, "the served page is not the file with Chart.js inline"
PY
	run grep -Eo '(https?:)?//[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}|<script[^>]*src=|<link[^>]*href=|url\(|@import' \
	    "$BATS_TEST_DIRNAME/../../lib/queue/dashboard.html"
	assert_failure 1
}

# autok_reports UPTIME TRAIN_BUSY TRAIN_IDLE GEN_BUSY GEN_IDLE VERSION PPO_KL: a
# rollout and a trainer stats report with these totals (as rl-queue-autok.bats)
autok_reports() {
	python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$AURL" version "$6" > /dev/null
	printf '{"role":"rollout","worker":"gen:1","uptime_s":%s,"busy_s":%s,"idle_s":%s,"records":1,"tokens":1}' \
	    "$1" "$4" "$5" > "$D/r.json"
	python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$AURL" report "$D/r.json" > /dev/null
	printf '{"role":"train","worker":"learn:1","uptime_s":%s,"busy_s":%s,"idle_s":%s,"records":1,"tokens":1,"steps":[{"version":%s,"ppo_kl":%s}]}' \
	    "$1" "$2" "$3" "$6" "$7" > "$D/t.json"
	python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$AURL" report "$D/t.json" > /dev/null
}

@test "--max-staleness auto: the rule's card draws each window's inputs and marks each change of K with its reason" {
	start_broker A --max-staleness auto:2 --auto-hold 1 --auto-bubble 0.1 --auto-drift 0.01:0.03
	# a window closes on the rollout's report, with the trainer's totals of
	# the version before: a bubble with low drift (K 0 -> 1 at version 2), the
	# settling step, two windows with no bubble (K stays), then the drift of
	# 0.05 the trainer reported at version 5 (K 1 -> 0 at version 6)
	autok_reports 10 5 5 5 5 1 0.001
	autok_reports 20 10 10 10 10 2 0.001
	autok_reports 30 15 15 15 15 3 0.001
	autok_reports 40 25 15 25 15 4 0.001
	autok_reports 50 35 15 35 15 5 0.05
	autok_reports 60 45 15 45 15 6 0.05
	http_get "$AHTTP" /api/stats > "$D/a.json"
	python3 - "$D/a.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["autok"]
w, h = a["windows_history"], a["history"]
assert h["k"] == [0, 1, 0] and h["version"] == [0, 2, 6], (h, w, a["last"])
assert h["why"][0] == "K starts at 0 (0 to 2)" and "K 0 -> 1" in h["why"][1] and "drift 0.05 above 0.03: K 1 -> 0" in h["why"][2], h
# a window at versions 2, 4, 5 and 6 (3 settled after the change), K after each
assert w["version"] == [2, 4, 5, 6] and w["k"] == [1, 1, 1, 0], w
assert w["train_idle_frac"] == [0.5, 0.5, 0, 0] and w["rollout_idle_frac"] == [0.5, 0, 0, 0], w
assert w["bubble"] == [0.5, 0, 0, 0] and w["drift"] == [0.001, 0.001, 0.001, 0.05], w
PY
	browse "http://$AHTTP/" auto
	python3 - "$D/auto.html" <<'PY'
import re, sys
html = open(sys.argv[1]).read()
tag = re.search(r'<canvas id="c_autok"[^>]*>', html).group(0)
a = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
# 4 windows x 4 curves (bubble's, the idle fractions', drift's) + 2 change markers
assert int(a["data-points"]) == 4 * 4 + 2 and a["data-changes"] == "2", a
assert int(a["data-ink"]) > 50, a
assert a["data-axes"].startswith("x:trainer version (window end):") and "y2:drift (mean |ppo_kl|):" in a["data-axes"], a
card = re.search(r'<div class="card" id="card_autok"[^>]*>', html).group(0)
assert "display: none" not in card, card
# the changes in words, newest first
rows = re.findall(r"<tr>(.*?)</tr>", re.search(r'<table id="autok_changes">(.*?)</table>', html).group(1))
cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in rows]
assert cells[0] == ["version", "K", "why"] and [c[:2] for c in cells[1:]] == [["6", "0"], ["2", "1"], ["0", "0"]], cells
assert "drift 0.05 above 0.03: K 1 -&gt; 0" in cells[1][2] and "K 0 -&gt; 1" in cells[2][2], cells
print("ok", a)
PY
}

@test "without Chart.js the page says why and keeps its tables; the broker warns once" {
	RL_CHARTJS=$D/none.js start_http_broker F
	fetch "$FHTTP" / > "$D/page.html"
	fetch "$FHTTP" / > /dev/null
	run grep -c "window.CHARTJS_MISSING = \"cannot read Chart.js from '$D/none.js' (No such file or directory): install libjs-chart.js" "$D/page.html"
	assert_output 1
	grep -q 'id="workers"' "$D/page.html"
	# in a browser: the note shows and the tables fill
	browse "http://$FHTTP/" nochart
	grep -q 'id="nochart" style="display: block;">Charts are off: cannot read Chart.js' "$D/nochart.html"
	grep -q '>trainer version<' "$D/nochart.html"
	# the broker says it once, on stderr, and goes on
	RL_CHARTJS=$D/none.js timeout -k 20 2 rl-queue serve --listen tcp://127.0.0.1:0 --http 127.0.0.1:0 2> "$D/err" || true
	run grep -c "warning: --http: the dashboard has no charts: cannot read Chart.js from '$D/none.js'" "$D/err"
	assert_output 1
	run grep -c "cannot open" "$D/err"
	assert_output 0
}

@test "the request check catches a page that reaches out (control)" {
	mkdir "$D/www"
	cat > "$D/www/index.html" <<'HTML'
<!DOCTYPE html><html><body><img src="http://example.org/pixel.png">
<script>fetch("https://203.0.113.9/track").catch(function () {});</script></body></html>
HTML
	on_free_port 'fetch 127.0.0.1:@PORT@ /' \
	    sh -c 'exec python3 -m http.server --bind 127.0.0.1 --directory "$1" @PORT@ > /dev/null 2>&1' sh "$D/www"
	browse "http://127.0.0.1:$DPORT/" control
	page_requests control "http://127.0.0.1:$DPORT" > "$D/control.urls"
	grep -qx "http://example.org/pixel.png" "$D/control.urls"
	grep -qx "https://203.0.113.9/track" "$D/control.urls"
}

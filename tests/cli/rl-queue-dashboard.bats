#!/usr/bin/env bats
# The dashboard in a real browser: headless Chromium loads / from a broker
# fed by a short pipeline (rl-rollout, rl-reward, rl-train all reporting)
# and from an empty broker; the canvases record what they drew (data-points,
# and data-ink: pixels that are not blank), read back with --dump-dom.  No
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

# browse URL NAME: headless Chromium loads URL for 3 s of virtual time; the DOM
# goes to $D/NAME.html, the net log to $D/NAME.net.json
browse() {
	timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \
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
	RL_WORKER_ID=learn-1 timeout 60 rl-train -q -m "$TD/m0" --out "$D/ck" --batch 2 --queue "$FURL" \
		--idle-exit 1.5 --metrics "$D/m.jsonl"
	wait "$R"
	wait "$W"
	wait "$B"
	[ "$(wc -l < "$D/m.jsonl")" -ge 2 ]
	browse "http://$FHTTP/" fed
	run python3 - "$D/fed.html" "$D/empty.html" <<'EOF'
import re, sys
def canvases(path):
    html = open(path).read()
    st = re.search(r'id="status"[^>]*>([^<]*)<', html).group(1)
    assert st.startswith("updated"), (path, st)
    out = {}
    for tag in re.findall(r"<canvas[^>]*>", html):
        a = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        out[a["id"]] = (int(a.get("data-points", "-1")), int(a.get("data-ink", "-1")))
    return html, out
fed_html, fed = canvases(sys.argv[1])
_, empty = canvases(sys.argv[2])
for c in ("c_reward", "c_len", "c_kl", "c_stage", "c_busy"):
    assert fed[c][0] > 0, (c, "no data drawn", fed[c])
    assert empty[c][0] == 0, (c, "the empty broker has no data", empty[c])
for c in ("c_reward", "c_len", "c_stage", "c_busy"):
    # more pixels inked than the axes alone (the empty page draws those)
    assert fed[c][1] > empty[c][1] + 50, (c, fed[c], empty[c])
assert fed["c_busy"][0] >= 3 * 2, fed["c_busy"]      # three workers, two reports or more each
for w in ("gen-1", "score-1", "learn-1"):
    assert ">%s<" % w in fed_html, w
print("ok", fed)
EOF
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
	# the page itself names no outside address
	fetch "$FHTTP" / > "$D/page.html"
	run grep -Eo '(https?:)?//[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}|<script[^>]*src=|<link[^>]*href=|url\(|@import' "$D/page.html"
	assert_failure 1
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

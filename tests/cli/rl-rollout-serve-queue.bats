#!/usr/bin/env bats
# rl-rollout serve --queue URL: episodes of the broker's prompt lines for any
# client (POST /rl/episodes, curl here), each line's group put once as scored;
# a client's own episodes as groups of one; clients that vanish, a server
# stopped mid-group (the line handed back); leases renewed while a slow agent
# or client works (rl-queue serve -t 1).  Everything on 127.0.0.1, on a tiny
# random model; the records are read back from the broker with rl-queue get.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load serve_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 1 256
	export AGENT="/usr/bin/python3 $BATS_TEST_DIRNAME/agent_scripted.py"
}

setup() {
	export AGENT_LOG="$BATS_TEST_TMPDIR/log"
	mkdir -p "$AGENT_LOG"
	PIDS=""
	KEY=""
}

teardown() {
	# servers first (started last): a server stopping hands its groups back to the broker
	local p rev=""
	for p in $PIDS; do rev="$p $rev"; done
	for p in $rev; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# broker [ARGS]: rl-queue serve on a free port; sets QURL
broker() {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ "$@"
	QURL="tcp://127.0.0.1:$DPORT"
}

# start_serve TAG ARGS...: serve_at with stdout and stderr in
# $BATS_TEST_TMPDIR/TAG.out and TAG.err
start_serve() {
	local tag=$1
	shift
	serve_at "$BATS_TEST_TMPDIR/$tag.out" "$BATS_TEST_TMPDIR/$tag.err" "$@"
}

stop_serve() {
	kill -TERM "$SPID"
	wait "$SPID" || true
}

# post PATH JSON [EPISODE]: the status code; the body in $BATS_TEST_TMPDIR/body
post() {
	curl -s -o "$BATS_TEST_TMPDIR/body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
	    ${KEY:+-H "Authorization: Bearer $KEY"} ${3:+-H "X-Episode-Id: $3"} --data-binary "$2" "$SURL$1"
}

body() { cat "$BATS_TEST_TMPDIR/body"; }

# lease: POST /rl/episodes; EP, IDX and PR (the line's prompt) of the episode
lease() {
	[ "$(post /rl/episodes '{}')" = 200 ] || { body >&2; return 1; }
	EP=$(jq -r .episode_id "$BATS_TEST_TMPDIR/body")
	IDX=$(jq -r .index "$BATS_TEST_TMPDIR/body")
	PR=$(jq -r .prompt.prompt "$BATS_TEST_TMPDIR/body")
	body >> "$BATS_TEST_TMPDIR/leases.jsonl"
	echo >> "$BATS_TEST_TMPDIR/leases.jsonl"
}

# call EP PROMPT: one completion of episode EP, its answer appended to calls.jsonl
call() {
	[ "$(post /v1/completions "{\"model\": \"toy\", \"prompt\": \"$2\", \"max_tokens\": 4, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}" "$1")" = 200 ] || { body >&2; return 1; }
	jq -c --arg ep "$1" '{ep: $ep, ids: [.choices[0].logprobs.tokens[] | ltrimstr("token_id:") | tonumber], lp: .choices[0].logprobs.token_logprobs}' \
	    "$BATS_TEST_TMPDIR/body" >> "$BATS_TEST_TMPDIR/calls.jsonl"
}

@test "serve --queue: POST /rl/episodes hands out the leased lines' episodes; each group put once as scored; a client's own episode as a group of one" {
	broker -t 60
	printf '%s\n' '{"prompt":"ab","answer":"x"}' '{"prompt":"cd"}' > "$BATS_TEST_TMPDIR/p.jsonl"
	rl-queue put -q "$QURL" "$BATS_TEST_TMPDIR/p.jsonl"
	KEY=sekrit
	start_serve s --queue "$QURL" -n 2 --api-key sekrit -m "$TD/m0" --served-model-name toy --jsonl
	# the key guards the route
	KEY=wrong
	[ "$(post /rl/episodes '{}')" = 401 ]
	KEY=sekrit
	for i in 1 2 3 4; do
		lease
		call "$EP" "$PR"
		[ "$(post "/rl/episodes/$EP/reward" "{\"reward\": $i}")" = 200 ]
	done
	# the broker has no line left: 503 and why
	[ "$(post /rl/episodes '')" = 503 ]
	[[ "$(jq -r .error.message "$BATS_TEST_TMPDIR/body")" == *"no prompt line to lease"* ]]
	# a call under an id whose record went out: 409
	[ "$(post /v1/completions '{"model": "toy", "prompt": "zz", "max_tokens": 2}' "$EP")" = 409 ]
	# an episode the client opened itself: a group of one
	call own-1 "hello"
	[ "$(post /rl/episodes/own-1/reward '{"reward": 7}')" = 200 ]
	# a body that is not an object
	[ "$(post /rl/episodes '[1]')" = 400 ]
	curl -s -H "Authorization: Bearer sekrit" "$SURL/metrics" > "$BATS_TEST_TMPDIR/metrics"
	grep -qx "rlserve_episodes_handed_out_total 4" "$BATS_TEST_TMPDIR/metrics"
	grep -qx "rlserve_queue_records_put_total 5" "$BATS_TEST_TMPDIR/metrics"
	grep -qx 'rlserve_http_requests_total{route="/rl/episodes",code="503"} 1' "$BATS_TEST_TMPDIR/metrics"
	stop_serve
	[[ "$(cat "$BATS_TEST_TMPDIR/s.err")" == *"--queue: 4 runs, 4 with a reward, 0 failed"* ]]
	[ ! -s "$BATS_TEST_TMPDIR/s.out" ]
	rl-queue get "$QURL" -s reward -n 100 --release > "$BATS_TEST_TMPDIR/gen.jsonl"
	[ ! -s "$BATS_TEST_TMPDIR/gen.jsonl" ]
	rl-queue get "$QURL" -s train -n 100 --release > "$BATS_TEST_TMPDIR/train.jsonl"
	python3 - "$BATS_TEST_TMPDIR" <<'PY'
import collections, json, sys
d = sys.argv[1]
recs = [json.loads(l) for l in open(d + "/train.jsonl")]
leases = [json.loads(l) for l in open(d + "/leases.jsonl") if l.strip()]
calls = {c["ep"]: c for c in map(json.loads, open(d + "/calls.jsonl"))}
assert len(recs) == 5 and len({r["id"] for r in recs}) == 5, [r["meta"] for r in recs]
# the hand-outs: two lines, two episodes each, in one group per line
assert [(l["prompt"]["prompt"], l["index"], l["group_size"]) for l in leases] == \
    [("ab", 0, 2), ("ab", 1, 2), ("cd", 0, 2), ("cd", 1, 2)], leases
assert leases[0]["group"] == leases[1]["group"] != leases[2]["group"] == leases[3]["group"]
groups = collections.defaultdict(list)
for r in recs:
    groups[r["group"]].append(r)
assert sorted(len(g) for g in groups.values()) == [1, 2, 2], groups
for i, l in enumerate(leases):
    r = next(r for r in recs if r["meta"]["episode_id"] == l["episode_id"])
    assert "%016x" % int(r["group"]) == l["group"] and r["index"] == l["index"] and r["group_size"] == 2, r
    assert r["reward"] == i + 1 and "env_error" not in r, r
    # the record is what the call generated: its ids and log-probs
    c = calls[l["episode_id"]]
    assert r["response"] == c["ids"] and r["prompt_text"] == l["prompt"]["prompt"], (r, c)
    assert all(abs(a - b) < 1e-6 for a, b in zip(r["logprobs"], c["lp"])), (r["logprobs"], c["lp"])
    if l["prompt"]["prompt"] == "ab":
        assert r["meta"]["answer"] == "x", r["meta"]
own = next(r for r in recs if r["meta"]["episode_id"] == "own-1")
assert own["group_size"] == 1 and own["reward"] == 7 and own["response"] == calls["own-1"]["ids"], own
print("ok")
PY
}

@test "serve --queue: clients that never call or go idle fail in their groups after --episode-timeout; a server stopped mid-group hands the line back" {
	broker -t 600
	printf '%s\n' '{"prompt":"ab"}' '{"prompt":"cd"}' > "$BATS_TEST_TMPDIR/p.jsonl"
	rl-queue put -q "$QURL" "$BATS_TEST_TMPDIR/p.jsonl"
	start_serve s1 --queue "$QURL" -n 2 --episode-timeout 2 -m "$TD/m0" --served-model-name toy --jsonl
	lease; e1=$EP
	call "$e1" ab
	[ "$(post "/rl/episodes/$e1/reward" '{"reward": 1}')" = 200 ]
	# e2 calls once and goes quiet; e3 never calls
	lease; e2=$EP
	call "$e2" ab
	lease; e3=$EP
	[ "$PR" = cd ]
	sleep 4
	[ "$(post "/rl/episodes/$e2/reward" '{"reward": 1}')" = 404 ]
	[ "$(post /v1/completions '{"model": "toy", "prompt": "cd", "max_tokens": 2}' "$e3")" = 409 ]
	# "cd" has one episode not handed out: its group is incomplete when the server stops
	stop_serve
	grep -q "its client made no call within --episode-timeout 2 s" "$BATS_TEST_TMPDIR/s1.err"
	# "cd" is leased again at once (its lease would last 600 s) and completed this time
	start_serve s2 --queue "$QURL" -n 2 -m "$TD/m0" --served-model-name toy --jsonl
	for i in 1 2; do
		lease
		[ "$PR" = cd ]
		call "$EP" cd
		[ "$(post "/rl/episodes/$EP/reward" '{"reward": 2}')" = 200 ]
	done
	[ "$(post /rl/episodes '{}')" = 503 ]
	stop_serve
	rl-queue get "$QURL" -s train -n 100 --release > "$BATS_TEST_TMPDIR/train.jsonl"
	python3 - "$BATS_TEST_TMPDIR/train.jsonl" "$e1" "$e2" "$e3" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in recs:
    by[r["prompt_text"]].append(r)
assert sorted(by) == ["ab", "cd"] and all(len(v) == 2 for v in by.values()), [(r["prompt_text"], r["meta"]) for r in recs]
ab = {r["meta"]["episode_id"]: r for r in by["ab"]}
assert ab[sys.argv[2]]["reward"] == 1 and "env_error" not in ab[sys.argv[2]]
idle = ab[sys.argv[3]]
assert "reward" not in idle and "idle past --episode-timeout" in idle["env_error"], idle
assert idle["finish"] == "abort" and idle["meta"]["end"] == "timeout" and len(idle["response"]) > 0, idle
# server 1's "cd" episodes went nowhere (e3's failure among them): the group was handed back,
# then delivered whole once, by server 2 (whose episode ids are the same: the line's group)
assert all(r["reward"] == 2 and "env_error" not in r for r in by["cd"]), by["cd"]
assert sorted(r["index"] for r in by["cd"]) == [0, 1], by["cd"]
print("ok")
PY
}

@test "serve --queue, --agent: agents and clients that take longer than the lease keep their lines (renewed)" {
	broker -t 1
	printf '%s\n' '{"prompt":"ab","mode":"slow","sleep":3,"reward":1}' > "$BATS_TEST_TMPDIR/p.jsonl"
	rl-queue put -q "$QURL" "$BATS_TEST_TMPDIR/p.jsonl"
	# agents that take 3 s on a line leased for 1 s: renewed, the group put once
	run -0 --separate-stderr timeout -k 20 60 rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" -n 2 \
	    --queue "$QURL" --idle-exit 1.5 --jsonl
	[[ "$stderr" == *"2 runs, 2 with a reward, 0 failed"* ]]
	[[ "$stderr" != *"expired"* ]]
	[ "$(ls "$AGENT_LOG"/*.json | wc -l)" = 2 ]
	# a client that takes 2.5 s: the line is not leased a second time meanwhile
	printf '%s\n' '{"prompt":"cd"}' > "$BATS_TEST_TMPDIR/q.jsonl"
	rl-queue put -q "$QURL" "$BATS_TEST_TMPDIR/q.jsonl"
	start_serve s --queue "$QURL" -n 1 -m "$TD/m0" --served-model-name toy --jsonl
	lease; e1=$EP
	call "$e1" cd
	sleep 2.5
	[ "$(post /rl/episodes '{}')" = 503 ]
	[ "$(post "/rl/episodes/$e1/reward" '{"reward": 5}')" = 200 ]
	stop_serve
	[[ "$(cat "$BATS_TEST_TMPDIR/s.err")" != *"expired"* ]]
	rl-queue get "$QURL" -s train -n 100 --release > "$BATS_TEST_TMPDIR/train.jsonl"
	python3 - "$BATS_TEST_TMPDIR/train.jsonl" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
by = collections.Counter(r["prompt_text"] for r in recs)
assert by == {"ab": 2, "cd": 1}, by
for r in recs:
    want = 1 + r["index"] / 10 if r["prompt_text"] == "ab" else 5
    assert abs(r["reward"] - want) < 1e-6, r
print("ok")
PY
}

@test "serve: GET /metrics behind the key: answers by route and status, tokens, episodes idle-ended, KV reuse hits, the Prometheus text format" {
	start_serve m -m "$TD/m0" --served-model-name toy --api-key k-1 --episode-timeout 1 --jsonl
	python3 - "$SURL" <<'PY'
import collections, json, re, sys, time, urllib.error, urllib.request
url = sys.argv[1]
seen = collections.Counter()   # (route, code) as this client saw them
usage = collections.Counter()
def req(path, body=None, key="k-1", ep=None, route=None, raw=None):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    if ep:
        h["X-Episode-Id"] = ep
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    r = urllib.request.Request(url + path, data=data, headers=h, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(r, timeout=60) as f:
            code, out = f.status, f.read()
    except urllib.error.HTTPError as e:
        code, out = e.code, e.read()
    seen[(route or path, str(code))] += 1
    return code, out
def metrics(key="k-1"):
    code, out = req("/metrics", key=key)
    return code, out.decode()
assert metrics(key=None)[0] == 401 and metrics(key="wrong")[0] == 401
c, out = req("/v1/completions", {"model": "toy", "prompt": "ab", "max_tokens": 4}, ep="e1")
a = json.loads(out)
usage.update(a["usage"])
# the episode's next call repeats its history: the kept KV cache is taken over
c, out = req("/v1/completions", {"model": "toy", "prompt": "ab" + a["choices"][0]["text"] + "cd", "max_tokens": 3}, ep="e1")
assert c == 200, out
usage.update(json.loads(out)["usage"])
assert req("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]})[0] == 404
assert req("/v1/completions", raw=b"{not json")[0] == 400
assert req("/v1/completions", {"model": "toy", "prompt": "ab"}, key="bad")[0] == 401
assert req("/v1/models")[0] == 200
assert req("/rl/episodes", {})[0] == 404
assert req("/nowhere", route="other")[0] == 404
time.sleep(2.5)   # e1 idles past --episode-timeout 1
code, text = metrics()
assert code == 200
# the text format: HELP and TYPE before each family's samples, one sample a line
fam, typed, vals = None, set(), {}
for line in text.splitlines():
    m = re.fullmatch(r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)", line)
    if m:
        if m[1] == "TYPE":
            assert m[3] in ("counter", "gauge"), line
            typed.add(m[2])
        continue
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*\})? (\S+)', line)
    assert m and m[1] in typed, line
    vals[m[1] + (m[2] or "")] = float(m[3])
# every answer this client saw, by route and code (the last /metrics counts itself)
for (route, code), n in seen.items():
    assert vals.get('rlserve_http_requests_total{route="%s",code="%s"}' % (route, code)) == n, (route, code, n, text)
# (and start_serve's polls of /health)
http = {k: v for k, v in vals.items() if k.startswith("rlserve_http_requests_total") and "/health" not in k}
assert sum(http.values()) == sum(seen.values()), (http, seen)
assert vals["rlserve_prompt_tokens_total"] == usage["prompt_tokens"], (vals, usage)
assert vals["rlserve_generated_tokens_total"] == usage["completion_tokens"], (vals, usage)
assert vals["rlserve_prompt_tokens_total"] == vals["rlserve_prompt_tokens_forwarded_total"] + vals["rlserve_prompt_tokens_reused_total"]
assert vals["rlserve_kv_reuse_hits_total"] == 1 and vals["rlserve_prompt_tokens_reused_total"] > 0, vals
assert vals["rlserve_episodes_idle_ended_total"] == 1 and vals["rlserve_episodes_written_total"] == 1, vals
assert vals["rlserve_episodes_open"] == 0 and vals["rlserve_episode_mismatch_total"] == 0, vals
print("ok")
PY
}

@test "serve --queue: bad options are usage errors; POST /rl/episodes without --queue is 404" {
	run -2 rl-rollout serve -m "$TD/m0" -n 2
	assert_output --partial "-n is for --agent CMD or --queue URL"
	run -2 rl-rollout serve -m "$TD/m0" --queue tcp://127.0.0.1:1 --idle-exit 1
	assert_output --partial "--idle-exit is for --agent CMD"
	run -2 rl-rollout serve -m "$TD/m0" --queue tcp://127.0.0.1:1 "$TD/p.jsonl"
	assert_output --partial "prompt lines are for --agent CMD"
	start_serve s -m "$TD/m0" --served-model-name toy --jsonl
	[ "$(post /rl/episodes '{}')" = 404 ]
	[[ "$(jq -r .error.message "$BATS_TEST_TMPDIR/body")" == *"not started with --queue URL"* ]]
	stop_serve
	# no broker: the hand-out is a 503 naming it, and the server exits 1 after --broker-timeout
	start_serve nb -m "$TD/m0" --served-model-name toy --queue tcp://127.0.0.1:1 --broker-timeout 1 --jsonl
	[ "$(post /rl/episodes '{}')" = 503 ]
	[[ "$(jq -r .error.message "$BATS_TEST_TMPDIR/body")" == *"cannot lease a prompt line from rl-queue at tcp://127.0.0.1:1"* ]]
	rc=0
	timeout -k 20 30 tail --pid="$SPID" -f /dev/null || rc=$?
	[ "$rc" = 0 ]
	wait "$SPID" || rc=$?
	[ "$rc" = 1 ]
	grep -q "no reply from the broker" "$BATS_TEST_TMPDIR/nb.err"
}

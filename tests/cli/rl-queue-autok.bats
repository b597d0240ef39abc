#!/usr/bin/env bats
# rl-queue serve --max-staleness auto[:MAX]: the options and their errors; a
# live broker fed stats reports and trainer versions by hand (rlq_raw.py)
# raises K on a bubble with low drift and lowers it on high drift, logs each
# change on stderr, shows it on /metrics (parsed strictly) and /api/stats, and
# keeps K in its journal across a restart.  Loopback only; the broker killed
# by pid in teardown.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

load queue_helper

setup() {
	D=$(mktemp -d /tmp/rlq-autok-bats.XXXXXX)
	PIDS=""
}

teardown() {
	kill_pids
	rm -rf "$D"
}

# broker ARGS...: rl-queue serve on free ports, stderr in $D/broker.err; sets URL, HTTP
broker() {
	local url http
	for _ in $(seq 10); do
		url="tcp://127.0.0.1:$(free_port)"
		http="127.0.0.1:$(free_port)"
		rl-queue serve --listen "$url" --http "$http" "$@" 2>>"$D/broker.err" 3>&- &
		BROKER=$!
		PIDS="$PIDS $BROKER"
		for _ in $(seq 100); do
			kill -0 "$BROKER" 2>/dev/null || break
			if rl-queue stat --timeout 0.2 "$url" >/dev/null 2>&1 && http_get "$http" /api/stats >/dev/null 2>&1; then
				URL=$url HTTP=$http
				return 0
			fi
			sleep 0.05
		done
	done
	return 1
}

raw() { python3 "$BATS_TEST_DIRNAME/rlq_raw.py" "$@"; }

# reports UPTIME TRAIN_BUSY TRAIN_IDLE GEN_BUSY GEN_IDLE VERSION PPO_KL: a rollout
# and a trainer report with these totals, the trainer's step VERSION, after the
# broker's version is set to VERSION
reports() {
	raw "$URL" version "$6" >/dev/null
	printf '{"role":"rollout","worker":"gen:1","uptime_s":%s,"busy_s":%s,"idle_s":%s,"records":1,"tokens":1}' \
	    "$1" "$4" "$5" > "$D/r.json"
	raw "$URL" report "$D/r.json"
	printf '{"role":"train","worker":"learn:1","uptime_s":%s,"busy_s":%s,"idle_s":%s,"records":1,"tokens":1,"steps":[{"version":%s,"ppo_kl":%s}]}' \
	    "$1" "$2" "$3" "$6" "$7" > "$D/t.json"
	raw "$URL" report "$D/t.json"
}

metric() {
	http_get "$HTTP" /metrics > "$D/m.txt"
	python3 - "$D/m.txt" "$1" <<'PY'
import sys
sys.path.insert(0, "tests/cli")
from promparse import parse
types, m = parse(open(sys.argv[1]).read())
print("%g" % m[sys.argv[2]])
PY
}

@test "--max-staleness auto: bad values and auto-only options are usage errors" {
	run -2 --separate-stderr rl-queue serve --max-staleness auto:x
	[[ "$stderr" == *"max-staleness"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-queue serve --max-staleness automatic
	run -2 --separate-stderr rl-queue serve --max-staleness auto --auto-drift 0.05:0.01
	[[ "$stderr" == *"--auto-drift: bad value '0.05:0.01'"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-queue serve --max-staleness auto --auto-bubble 1.5
	run -2 --separate-stderr rl-queue serve --max-staleness 2 --auto-hold 3
	[[ "$stderr" == *"need --max-staleness auto"* ]] || { echo "$stderr"; return 1; }
}

@test "auto K: raised on a bubble with low drift, lowered on drift, logged, on /metrics, journaled across a restart" {
	broker -d "$D/q" --max-staleness auto:2 --auto-hold 1 --auto-bubble 0.1 --auto-drift 0.01:0.03
	[ "$(metric rlqueue_max_staleness)" = 0 ]
	[ "$(metric rlqueue_autok_max_staleness_max)" = 2 ]
	# both sides idle half the time, drift 0.001: K 0 -> 1
	run reports 10 5 5 5 5 1 0.001
	run reports 20 10 10 10 10 2 0.001
	[ "$(metric rlqueue_max_staleness)" = 1 ] || { cat "$D/broker.err" "$D/m.txt"; return 1; }
	[ "$(metric rlqueue_autok_changes_total)" = 1 ]
	[ "$(metric 'rlqueue_autok_idle_fraction{stage="train"}')" = 0.5 ]
	[ "$(metric rlqueue_autok_bubble_fraction)" = 0.5 ]
	grep -q "max-staleness auto: bubble 0.500 (trainer idle 0.500, rollout idle 0.500) above 0.100, drift 0.001 below 0.01: K 0 -> 1" "$D/broker.err" \
	    || { cat "$D/broker.err"; return 1; }
	http_get "$HTTP" /api/stats | python3 -c 'import json,sys; a=json.load(sys.stdin)["autok"]; assert a["k"] == 1 and a["max"] == 2 and "K 0 -> 1" in a["last"], a'
	# the trainer busy all the time: no bubble, K stays (after the settling step)
	run reports 30 20 10 15 15 3 0.001
	run reports 40 30 10 20 20 4 0.001
	[ "$(metric rlqueue_max_staleness)" = 1 ]
	# every rlqueue_autok_ family is in rl-queue(1) METRICS
	man=$(mandoc -Tascii "$BATS_TEST_DIRNAME/../../man/rl-queue.1" | col -b | sed -n '/^METRICS/,/^[A-Z]/p')
	for m in $(http_get "$HTTP" /metrics | sed -n 's/^# TYPE \(rlqueue_autok_[a-z_]*\) .*/\1/p'); do
		grep -q "\b$m\b" <<< "$man" || { echo "$m not in rl-queue(1) METRICS"; return 1; }
	done
	# the dashboard's K line: the page's boundAt on this broker's stats, K in force
	# at each trainer step (0 until the change at version 2, then 1)
	if command -v node >/dev/null; then
		http_get "$HTTP" /api/stats > "$D/stats.json"
		run node -e '
const fs = require("fs");
const page = fs.readFileSync(process.argv[1], "utf8");
const src = page.match(/function boundAt\(last, steps\) \{[\s\S]*?\n\}/)[0];
const num = (v) => (typeof v === "number" ? v : NaN);
const boundAt = new Function("num", src + "; return boundAt;")(num);
const last = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
console.log(JSON.stringify(boundAt(last, [1, 2, 3, 4])));' "$BATS_TEST_DIRNAME/../../lib/queue/dashboard.html" "$D/stats.json"
		assert_output "[0,1,1,1]"
	fi
	# restart: K continues from the journal
	kill "$BROKER"; wait "$BROKER" 2>/dev/null || true
	broker -d "$D/q" --max-staleness auto:2 --auto-hold 1
	[ "$(metric rlqueue_max_staleness)" = 1 ] || { cat "$D/broker.err"; return 1; }
	grep -q "max-staleness auto: K starts at 1 (0 to 2)" "$D/broker.err"
	# drift 0.05 above 0.03: K 1 -> 0 (new worker table: the first reports set the base)
	run reports 50 35 15 25 25 5 0.05
	run reports 60 40 20 30 30 6 0.05
	[ "$(metric rlqueue_max_staleness)" = 0 ] || { cat "$D/broker.err"; return 1; }
	grep -q "drift 0.05 above 0.03: K 1 -> 0" "$D/broker.err"
	# a fixed K on restart: the journal's K is not used
	kill "$BROKER"; wait "$BROKER" 2>/dev/null || true
	broker -d "$D/q" --max-staleness 3
	[ "$(metric rlqueue_max_staleness)" = 3 ]
	http_get "$HTTP" /metrics | grep -c rlqueue_autok_ | grep -qx 0
}

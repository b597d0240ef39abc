#!/usr/bin/env bats
# rl-queue serve --oversample F --stragglers requeue|drop (docs/queue.md,
# "Over-sampling and early stop"): the options and their errors; then the
# whole queue wiring (rl-rollout, rl-reward, rl-train, K = 0) on a long-tail
# workload, one prompt in four with a limit of 120 tokens and the others 2:
# the broker closes steps early and aborts the long ones, rl-rollout cancels
# them, and every prompt is trained exactly once (the trainer's groups_done
# holds all of them, global_step x --batch = their number, the broker counts
# every sample done) or, with --stragglers drop, trained, counted dropped, or
# (a group that does not fill a last step) left scored on the broker.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" "" 160
	for i in $(seq 1 24); do
		mt=2
		[ $((i % 4)) -eq 0 ] && mt=120
		echo "{\"prompt\":\"$i+$i=\",\"answer\":\"$((i + i))\",\"max_tokens\":$mt}"
	done > "$TD/prompts.jsonl"
}

setup() {
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

@test "--oversample and --stragglers: bad values and missing companions are usage errors" {
	run -2 --separate-stderr rl-queue serve --oversample 0.5
	[[ "$stderr" == *"--oversample"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-queue serve --oversample 17
	run -2 --separate-stderr rl-queue serve --oversample 2 --stragglers keep
	[[ "$stderr" == *"--stragglers: bad value 'keep' (requeue, drop or continue)"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-queue serve --stragglers drop
	[[ "$stderr" == *"--stragglers needs --oversample"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-queue serve --oversample 2 --train-batch 0
	[[ "$stderr" == *"--oversample needs the gate"* ]] || { echo "$stderr"; return 1; }
}

# pipeline NAME STRAGGLERS [K [STALE]]: the wiring on a fresh broker (K 0,
# --stale regen by default); outputs under $TD/NAME
pipeline() {
	local O="$TD/$1"
	mkdir -p "$O/ck"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ \
	    -k "${3:-0}" -b 2 --oversample 2 --stragglers "$2" --stale "${4:-regen}" -t 60 --http 127.0.0.1:0
	URL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	timeout -k 20 120 rl-train -q -m "$TD/m0" --out "$O/ck" --batch 2 --queue "$URL" --idle-exit 4 --no-skip-zero-adv \
	    --metrics "$O/m.jsonl" 2> "$O/train.err" 3>&- &
	local T=$!
	PIDS="$PIDS $T"
	timeout -k 20 120 rl-reward -q --queue "$URL" -t arith --idle-exit 4 2> "$O/reward.err" 3>&- &
	local R=$!
	PIDS="$PIDS $R"
	timeout -k 20 120 rl-rollout -m "$TD/m0" -n 2 --max-tokens 120 --slots 16 --queue "$URL" --weights-from "$O/ck" \
	    --idle-exit 3 2> "$O/rollout.err" 3>&- || { cat "$O/rollout.err"; return 1; }
	wait "$T" || { cat "$O/train.err"; return 1; }
	wait "$R" || { cat "$O/reward.err"; return 1; }
	rl-queue stat --json "$URL" > "$O/stat.json"
	rl-queue stat "$URL" > "$O/stat.txt"
}

@test "early stop, stragglers re-queued: every prompt trained exactly once, the aborted ones after their requeue" {
	pipeline rq requeue
	O="$TD/rq"
	cat "$O/stat.txt" >&3
	grep -q '^early stop: oversample 2.00 ' "$O/stat.txt"
	grep 'prompts aborted by the broker' "$O/rollout.err" >&3 || true
	PYTHONPATH="$BATS_TEST_DIRNAME" python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" <<'PY'
import json, sys
from trainstate import groups_done
s, done = groups_done(sys.argv[1])
st = json.load(open(sys.argv[2]))
t = st["total"]
print("groups done %d, steps %d; broker: %s" % (len(done), s["global_step"], t), file=sys.stderr)
assert s["global_step"] * 2 == 24, s["global_step"]
assert len(done) == 24, sorted(done)
assert t["done"] == 48, t
assert t["early_stops"] > 0 and t["aborted"] > 0, t
assert t["aborted"] == t["abort_requeued"] and t["abort_dropped"] == 0, t
assert st["depth"]["prompt"] == 0 and st["depth"]["leased"] == 0 and st["groups"] == 0, st
PY
}

@test "early stop at K = 2, stragglers re-queued: nothing dropped as stale, every prompt trained once, the aborted ones counted" {
	# K > 0: the broker may buffer (K+1) x B complete groups; a straggler
	# that would complete behind them could only be trained more than K
	# versions after its lease.  It is aborted and re-queued before that,
	# so with --stale drop no group is lost as stale.
	pipeline k2 requeue 2 drop
	O="$TD/k2"
	cat "$O/stat.txt" >&3
	PYTHONPATH="$BATS_TEST_DIRNAME" python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" <<'PY'
import json, sys
from trainstate import groups_done
s, done = groups_done(sys.argv[1])
st = json.load(open(sys.argv[2]))
t = st["total"]
print("groups done %d, steps %d; broker: %s" % (len(done), s["global_step"], t), file=sys.stderr)
assert t["stale_dropped"] == 0 and t["stale_regenerated"] == 0, t
assert len(done) == 24 and s["global_step"] * 2 == 24, (sorted(done), s["global_step"])
assert t["done"] == 48, t
assert t["early_stops"] > 0 and t["aborted"] > 0, t
assert t["aborted"] == t["abort_requeued"] and t["abort_dropped"] == 0, t
assert st["depth"]["prompt"] == 0 and st["depth"]["leased"] == 0 and st["groups"] == 0, st
PY
}

@test "early stop, stragglers dropped: every prompt trained once or counted dropped, none trained twice" {
	pipeline dr drop
	O="$TD/dr"
	PYTHONPATH="$BATS_TEST_DIRNAME" python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" "$O/m.jsonl" <<'PY'
import json, sys
from trainstate import groups_done
s, done = groups_done(sys.argv[1])
st = json.load(open(sys.argv[2]))
t = st["total"]
steps = [json.loads(l) for l in open(sys.argv[3])]
print("groups done %d, steps %d; broker: %s" % (len(done), s["global_step"], t), file=sys.stderr)
assert t["abort_dropped"] > 0 and t["abort_requeued"] == 0 and t["aborted"] == t["abort_dropped"], t
# trained + dropped + left = every prompt; nothing trained twice.  Left: the
# groups that do not fill a last step of 2 (the trainer hands them back)
left = st["depth"]["scored"] // 2
assert left < 2 and st["groups"] == left, st
assert len(done) + t["abort_dropped"] + left == 24, (sorted(done), t, left)
assert t["done"] == 2 * len(done), t
assert t["put_scored"] == t["done"] + 2 * left, t
assert st["depth"]["prompt"] == 0 and st["depth"]["leased"] == 0, st
PY
}

# --env episodes are cancelled like plain samples: one prompt in four sleeps
# 1 s in each of its two steps (a slow tool call), the others answer at once
# after one step.  The step closes on the fast groups; the slow episodes are
# cancelled in their environment call (the process is killed) and re-queued.
# Without the cancel, every aborted slow group would be put late.
@test "early stop with --env: aborted episodes are cancelled mid tool call, nothing still running is put late, every prompt trained once" {
	O="$TD/env"
	mkdir -p "$O/ck"
	for i in $(seq 1 12); do
		if [ $((i % 4)) -eq 0 ]; then
			echo "{\"prompt\":\"$i+\",\"turns\":2,\"sleep\":1}"
		else
			echo "{\"prompt\":\"$i=\",\"turns\":1}"
		fi
	done > "$O/p.jsonl"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ \
	    -k 0 -b 2 --oversample 2 --stragglers requeue --stale regen -t 60
	URL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q "$URL" "$O/p.jsonl"
	timeout -k 20 120 rl-train -q -m "$TD/m0" --out "$O/ck" --batch 2 --queue "$URL" --idle-exit 4 --no-skip-zero-adv \
	    2> "$O/train.err" 3>&- &
	local T=$!
	PIDS="$PIDS $T"
	RL_ENV_PIDS="$O/pids" timeout -k 20 120 rl-rollout -m "$TD/m0" -n 2 --max-tokens 3 --slots 16 --queue "$URL" \
	    --env "/usr/bin/python3 $BATS_TEST_DIRNAME/env_scripted.py" --env-procs 8 --weights-from "$O/ck" \
	    --idle-exit 3 2> "$O/rollout.err" 3>&- || { cat "$O/rollout.err"; return 1; }
	wait "$T" || { cat "$O/train.err"; return 1; }
	rl-queue stat --json "$URL" > "$O/stat.json"
	grep 'aborted by the broker' "$O/rollout.err" >&3
	# "N prompts aborted by the broker's early stop (not put): E episodes cancelled, K environment processes ..."
	line=$(grep -o '[0-9]* prompts aborted by.*' "$O/rollout.err")
	PYTHONPATH="$BATS_TEST_DIRNAME" python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" "$line" "$(wc -l < "$O/pids")" <<'PY'
import json, re, sys
from trainstate import groups_done
s, done = groups_done(sys.argv[1])
st = json.load(open(sys.argv[2]))
t = st["total"]
m = re.match(r"(\d+) prompts aborted .*: (\d+) episodes cancelled, (\d+) environment processes stopped", sys.argv[3])
na, ne, nk = map(int, m.groups())
started = int(sys.argv[4])
print("groups done %d, steps %d; rollout %d aborted, %d episodes cancelled, %d processes killed, %d started; "
      "broker: %s" % (len(done), s["global_step"], na, ne, nk, started, t), file=sys.stderr)
assert s["global_step"] * 2 == 12 and len(done) == 12, (s["global_step"], sorted(done))
assert t["done"] == 24, t
assert t["early_stops"] > 0 and t["aborted"] > 0 and t["aborted"] == t["abort_requeued"], t
# every prompt the broker aborted was cancelled here, except a group that was
# complete and put before this generator heard (the broker refused it late):
# nothing that was still running when it heard was put
assert na + t["abort_late"] // 2 == t["aborted"] and t["abort_late"] % 2 == 0, (na, t)
assert t["rejected"] == t["abort_late"], t
# a slow episode is cancelled in its sleep: its process was killed
assert 0 < ne <= 2 * na and 0 < nk <= ne, (ne, nk, na)
assert st["depth"]["prompt"] == 0 and st["depth"]["leased"] == 0 and st["groups"] == 0, st
PY
}

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

# pipeline NAME STRAGGLERS: the wiring on a fresh broker; outputs under $TD/NAME
pipeline() {
	local O="$TD/$1"
	mkdir -p "$O/ck"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ \
	    -k 0 -b 2 --oversample 2 --stragglers "$2" --stale regen -t 60 --http 127.0.0.1:0
	URL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q "$URL" "$TD/prompts.jsonl"
	timeout 120 rl-train -q -m "$TD/m0" --out "$O/ck" --batch 2 --queue "$URL" --idle-exit 4 --no-skip-zero-adv \
	    --metrics "$O/m.jsonl" 2> "$O/train.err" 3>&- &
	local T=$!
	PIDS="$PIDS $T"
	timeout 120 rl-reward -q --queue "$URL" -t arith --idle-exit 4 2> "$O/reward.err" 3>&- &
	local R=$!
	PIDS="$PIDS $R"
	timeout 120 rl-rollout -m "$TD/m0" -n 2 --max-tokens 120 --slots 16 --queue "$URL" --weights-from "$O/ck" \
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
	python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
done = set()
for r in s["groups_done"]:
    lo, _, hi = str(r).partition("-")
    done.update(range(int(lo), int(hi or lo) + 1))
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

@test "early stop, stragglers dropped: every prompt trained once or counted dropped, none trained twice" {
	pipeline dr drop
	O="$TD/dr"
	python3 - "$O/ck/latest/trainer_state.json" "$O/stat.json" "$O/m.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
done = set()
for r in s["groups_done"]:
    lo, _, hi = str(r).partition("-")
    done.update(range(int(lo), int(hi or lo) + 1))
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

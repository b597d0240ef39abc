#!/usr/bin/env bats
# rl-rollout --max-staleness auto[:MAX] in the pipe wiring (docs/rollout.md,
# "Auto K in the pipe wiring"): the options' errors, then rl-rollout piped
# into a stand-in trainer (fake_trainer.py) that sleeps a planned time per
# step, publishes each version as rl-train would and appends rl-train's
# metrics lines (its measured wait for records, the planned ppo_kl).  A slow
# trainer with low drift raises K to MAX; a growing drift lowers it again; a
# slow generator whose slots stay full leaves it at 0.  The bound holds for every group: its
# records' version >= its trainer batch - the largest K in force.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" "" 160
	for i in $(seq 1 80); do echo "{\"prompt\":\"$i+$i=\"}"; done > "$TD/prompts.jsonl"
}

@test "--max-staleness auto: needs --trainer-metrics, the pipe wiring and a good MAX" {
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-from "$TD/x" --max-staleness auto "$TD/prompts.jsonl"
	[[ "$stderr" == *"--max-staleness auto needs --trainer-metrics FILE"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-from "$TD/x" --max-staleness auto:x \
	    --trainer-metrics "$TD/m" "$TD/prompts.jsonl"
	[[ "$stderr" == *"max-staleness"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-from "$TD/x" --max-staleness auto \
	    --trainer-metrics "$TD/m" --queue tcp://127.0.0.1:1
	[[ "$stderr" == *"with --queue the broker chooses K"* ]] || { echo "$stderr"; return 1; }
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-from "$TD/x" --max-staleness 1 \
	    --trainer-metrics "$TD/m" "$TD/prompts.jsonl"
	[[ "$stderr" == *"--trainer-metrics is read for --max-staleness auto"* ]] || { echo "$stderr"; return 1; }
}

# wire NAME PLAN MAX PROMPTS [N [OPTION...]]: rl-rollout (-v, the OPTIONs) |
# fake trainer, batches of 2 groups of N (8) samples of up to 150 tokens, the
# first PROMPTS prompts; stderr in $TD/NAME.err
wire() {
	local O="$TD/$1"
	printf '%s\n' "$2" > "$O.plan"
	rm -rf "$O" "$O.m"
	head -"$4" "$TD/prompts.jsonl" > "$O.prompts"
	timeout -k 20 150 rl-rollout -v -m "$TD/m0" -n "${5:-8}" "${@:6}" --max-tokens 150 --train-batch 2 --weights-from "$O" \
	    --max-staleness "auto:$3" --trainer-metrics "$O.m" --jsonl "$O.prompts" 2> "$O.err" |
	    python3 "$BATS_TEST_DIRNAME/fake_trainer.py" "$TD/m0" "$O" "$O.m" 2 "$O.plan"
}

# bound NAME MAX: every group's version >= its batch - MAX; prints the largest staleness
bound() {
	python3 - "$TD/$1/seen.jsonl" "$2" <<'PY'
import json, sys
order, worst = [], 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    if not order or order[-1][0] != r["group"]:
        order.append((r["group"], r["version"][0]))
for k, (g, v) in enumerate(order):
    worst = max(worst, k // 2 - v)
assert worst <= int(sys.argv[2]), worst
print(worst)
PY
}

@test "a slow trainer with low drift: K rises to MAX; a growing drift: K comes down; the bound holds throughout" {
	# steps 1-8: 3 times the step's wait for its records (the trainer is the
	# slower side at any machine speed), ppo_kl 0.002; from step 9: ppo_kl 0.05
	wire slowtrain $'1 x3 0.002\n9 x3 0.05' 1 48
	cat "$TD/slowtrain.err" | grep 'max-staleness auto' >&3 || true
	grep -q 'max-staleness auto: bubble .* drift 0.002 below 0.01: K 0 -> 1' "$TD/slowtrain.err"
	grep -q 'max-staleness auto: drift 0.0[0-9]* above 0.03: K 1 -> 0' "$TD/slowtrain.err"
	grep -q 'max-staleness auto: K 0 at the end, 2 changes' "$TD/slowtrain.err"
	run -0 bound slowtrain 1
	[ "$output" = 1 ]   # K = 1 was used
}

@test "a slow generator (the trainer never waits on weights): K stays 0" {
	# 32 samples a group: a batch takes long next to taking a new version
	# (a poll and a load), so the generator waits on weights only briefly.
	# Greedy: the toy model's answers all run to --max-tokens, so a batch's
	# 64 sequences fill the 64 slots to its end (sampled ones end at random
	# lengths, and the slots they leave empty while the gate holds the next
	# batch are idle capacity K would fill: that raises K, rightly)
	wire slowgen '1 0 0.002' 3 16 32 --temperature 0
	grep 'max-staleness auto' "$TD/slowgen.err" >&3 || true
	! grep -q 'K 0 -> 1' "$TD/slowgen.err"
	grep -q 'max-staleness auto: K 0 at the end, 0 changes over [1-9][0-9]* windows' "$TD/slowgen.err"
	run -0 bound slowgen 0
}

@test "a metrics line that is not rl-train's is warned about with its file and line, and skipped" {
	O="$TD/badm"
	rm -rf "$O"
	printf '%s\n' 'not json' '{"step":1,"actor/ppo_kl":0.001,"timing_s/gen":0.1,"timing_s/step":0.5}' > "$O.m"
	head -8 "$TD/prompts.jsonl" > "$TD/p8.jsonl"
	mkdir -p "$O"
	ln -s "$TD/m0" "$O/step-00000005"
	ln -s step-00000005 "$O/latest"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --train-batch 2 --weights-from "$O" \
	    --max-staleness auto --trainer-metrics "$O.m" --jsonl "$TD/p8.jsonl"
	[[ "$stderr" == *"warning: '$O.m': line 1: not a metrics line of rl-train"* ]] || { echo "$stderr"; return 1; }
	[ "$(echo "$output" | wc -l)" -eq 16 ]
}

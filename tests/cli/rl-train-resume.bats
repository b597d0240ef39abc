#!/usr/bin/env bats
# rl-train: interrupted and resumed runs, skipped steps, what --out may hold,
# and records the learner cannot train on (named, --on-bad applies).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/scored.jsonl"
}

# edit IN OUT PYTHON: OUT is IN with each record r changed by the statement(s)
edit() {
	python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
$(sed 's/^/    /' <<< "$3")
    print(json.dumps(r))" "$1" > "$2"
}

@test "resume: a group straddling the checkpoint is read again, bitwise the uninterrupted run" {
	# group 1 is split around group 2: after 2 steps (groups 0 and 2) half of it is pending
	python3 - "$TD/scored.jsonl" "$TD/inter.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in recs: by.setdefault(r['group'], []).append(r)
order = by[0] + by[1][:2] + by[2] + by[1][2:] + [r for g in range(3, 8) for r in by[g]]
open(sys.argv[2], 'w').writelines(json.dumps(r) + '\n' for r in order)
PY
	rl-train -q -m "$TD/m0" --out "$TD/ia" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/inter.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/ib" --batch 1 --lr 1e-3 --max-steps 2 --metrics /dev/null "$TD/inter.jsonl"
	grep -q '"records_pending":\[5,6\]' "$TD/ib/latest/trainer_state.json"
	# and once more, resuming a resumed run before it has read the pending records' successors
	rl-train -q --out "$TD/ib" --batch 1 --lr 1e-3 --max-steps 3 --resume --metrics /dev/null "$TD/inter.jsonl"
	run -0 --separate-stderr rl-train --out "$TD/ib" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/inter.jsonl"
	[[ "$stderr" != *incomplete*dropped* ]]
	[[ "$stderr" == *"5 steps; "* ]]
	cmp "$TD/ia/step-00000008/model.safetensors" "$TD/ib/step-00000008/model.safetensors"
	cmp "$TD/ia/step-00000008/optimizer.safetensors" "$TD/ib/step-00000008/optimizer.safetensors"
}

@test "a step with a non-finite gradient norm is skipped: nothing published for it, counted, training goes on" {
	# rewards of +-3e38 overflow rloo's advantages to inf: group 1's gradient is NaN
	edit "$TD/scored.jsonl" "$TD/huge.jsonl" "if r['group'] == 1: r['reward'] = 3e38 if r['index'] % 2 else -3e38"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/sk" --algo rloo --batch 1 --lr 1e-3 --keep 0 \
	    --metrics "$TD/sk.jsonl" "$TD/huge.jsonl"
	[[ "$stderr" == *"step skipped"* ]]
	[[ "$stderr" == *"1 steps skipped"* ]]
	[ "$(ls "$TD/sk" | grep -c '^step-')" -eq 7 ]
	[ "$(readlink "$TD/sk/latest")" = step-00000007 ]
	[ "$(wc -l < "$TD/sk.jsonl")" -eq 7 ]
	tail -1 "$TD/sk.jsonl" | grep -q '"train/steps_skipped":1'
	head -1 "$TD/sk.jsonl" | grep -q '"train/steps_skipped":0'
}

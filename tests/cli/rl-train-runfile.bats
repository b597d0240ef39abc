#!/usr/bin/env bats
# rl-train: OUT/run.yaml holds a run's effective options; --resume refuses a
# change to an option of the algorithm, naming it, unless --allow-change;
# the options of a --config file and their precedence reach the run.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 4 4 0 > "$TD/scored.jsonl"
}

# yget FILE KEY: the value of KEY in a YAML file, read by PyYAML
yget() {
	python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

@test "run.yaml: the effective options, readable YAML, and a --config that starts the same run" {
	rl-train -q -m "$TD/m0" --out "$TD/a" --batch 1 --lr 1e-3 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ -f "$TD/a/run.yaml" ]
	[ "$(yget "$TD/a/run.yaml" lr)" = "0.001" ]
	[ "$(yget "$TD/a/run.yaml" algo)" = "grpo" ]
	[ "$(yget "$TD/a/run.yaml" batch)" = "1" ]
	[ "$(yget "$TD/a/run.yaml" out)" = "$TD/a" ]
	# every key is an option rl-train takes: the file given back as --config is accepted
	sed "s|^out: .*|out: '$TD/a2'|" "$TD/a/run.yaml" > "$TD/again.yaml"
	run -0 --separate-stderr rl-train -q --config "$TD/again.yaml" --metrics /dev/null "$TD/scored.jsonl"
	cmp "$TD/a/step-00000001/model.safetensors" "$TD/a2/step-00000001/model.safetensors"
}

@test "config precedence reaches the run: the file's lr, the command line's batch over the file's" {
	printf 'lr: 0.002\nbatch: 4\nalgo: rloo\n' > "$TD/c.yaml"
	rl-train -q --config "$TD/c.yaml" -m "$TD/m0" --out "$TD/c" --batch 2 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ "$(yget "$TD/c/run.yaml" lr)" = "0.002" ]
	[ "$(yget "$TD/c/run.yaml" batch)" = "2" ]
	[ "$(yget "$TD/c/run.yaml" algo)" = "rloo" ]
}

@test "--resume refuses a changed --lr naming it; --allow-change resumes with it" {
	rl-train -q -m "$TD/m0" --out "$TD/r" --batch 1 --lr 1e-3 --save-every 1 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	before=$(cat "$TD/r/run.yaml")
	run -1 --separate-stderr rl-train --out "$TD/r" --batch 1 --lr 1e-2 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"--lr: 0.001 in the run ('$TD/r/run.yaml'), 0.01 now"* ]]
	[[ "$stderr" == *"--allow-change"* ]]
	# each difference is named; nothing of the run was touched
	run -1 --separate-stderr rl-train --out "$TD/r" --batch 2 --lr 1e-2 --algo rloo --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"--algo: grpo in the run"*"rloo now"* ]]
	[[ "$stderr" == *"--batch: 1 in the run"*"2 now"* ]]
	[[ "$stderr" == *"--lr: 0.001 in the run"* ]]
	[ "$(cat "$TD/r/run.yaml")" = "$before" ]
	[ ! -e "$TD/r/step-00000002" ]
	# the same options resume silently; a changed --max-steps is not the algorithm's
	run -0 --separate-stderr rl-train --out "$TD/r" --batch 1 --lr 1e-3 --max-steps 2 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" != *"in the run"* ]]
	run -0 --separate-stderr rl-train --out "$TD/r" --batch 1 --lr 1e-2 --resume --allow-change --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"warning: --lr changed: 0.001 in the run, 0.01 now (--allow-change)"* ]]
	[ "$(yget "$TD/r/run.yaml" lr)" = "0.01" ]
}

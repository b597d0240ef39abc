#!/usr/bin/env bats
# --device auto is the default of rl-train and rl-rollout: CUDA when a GPU is
# usable, else the CPU with one line on stderr; --device cpu stays silent.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 2 2 0 > "$TD/scored.jsonl"
}

# gpu: 0 when this machine has a GPU the build can use (then auto takes it)
gpu() {
	rm -rf "$TD/probe"
	rl-train -q --device cuda -m "$TD/m0" --out "$TD/probe" --batch 1 --max-steps 1 --metrics /dev/null \
	    "$TD/scored.jsonl" >/dev/null 2>&1
}

# the records without their ids and timestamps (which differ run to run)
tokens() {
	jq -c '{response, logprobs, finish}' <<< "$1"
}

@test "rl-train: no --device is auto; without a GPU one line says the run is on the cpu" {
	gpu && skip "a GPU is usable here: auto takes it (the fallback is for machines without one)"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/a" --batch 1 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ "$(grep -c -- '--device auto: .*using the cpu' <<< "$stderr")" -eq 1 ]
	[[ "$stderr" == *"rl-train: --device auto: "*"using the cpu"* ]]
	run -0 --separate-stderr rl-train --device cpu -m "$TD/m0" --out "$TD/b" --batch 1 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" != *"--device"* ]]
	[[ "$stderr" != *"cpu"* ]]
	# the same weights either way
	cmp "$TD/a/step-00000001/model.safetensors" "$TD/b/step-00000001/model.safetensors"
	# -q: errors only
	run -0 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/c" --batch 1 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ -z "$stderr" ]
}

@test "rl-rollout: no --device is auto, with the fallback line; --device cpu is silent" {
	gpu && skip "a GPU is usable here"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 1 --max-tokens 2 --seed 1 --jsonl <<< '{"prompt":"ab"}'
	[ "$(grep -c -- '--device auto: .*using the cpu' <<< "$stderr")" -eq 1 ]
	auto_out=$(tokens "$output")
	run -0 --separate-stderr rl-rollout --device cpu -m "$TD/m0" -n 1 --max-tokens 2 --seed 1 --jsonl <<< '{"prompt":"ab"}'
	[[ "$stderr" != *"--device"* ]]
	[ "$(tokens "$output")" = "$auto_out" ]
}

#!/usr/bin/env bats
# Every "$ " line of the EXAMPLES of rl-train(1) runs (rl-rollout(1)'s run in
# rl-rollout-tokenize.bats).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

examples() { sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$1" | sed -n 's/^\$ //p'; }

@test "the EXAMPLES of rl-train(1) run" {
	d="$BATS_TEST_TMPDIR/ex"; mkdir -p "$d"
	examples "$BATS_TEST_DIRNAME/../../man/rl-train.1" > "$d/ex.sh"
	[ "$(wc -l < "$d/ex.sh")" -ge 5 ]
	run -0 --separate-stderr sh -ec "cd '$d' && . ./ex.sh"
	assert_output --partial '"actor/sft_loss":'
	assert_output --partial 'model.safetensors'
}

@test "the generation EXAMPLES of rl-rollout(1) run" {
	d="$BATS_TEST_TMPDIR/ex2"; mkdir -p "$d"
	examples "$BATS_TEST_DIRNAME/../../man/rl-rollout.1" | grep -v 'rl-rollout tokenize' > "$d/ex.sh"
	run -0 --separate-stderr sh -ec "cd '$d' && . ./ex.sh"
	[ "${#lines[@]}" -eq 4 ]
	assert_line --index 0 --partial '"group_size":2'
}

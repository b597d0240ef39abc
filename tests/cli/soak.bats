#!/usr/bin/env bats
# The soak test (docs/queue.md, "Exactly once"): the async queue wiring with
# the broker's journal, kill -9 of a random stage (broker, generator, reward,
# trainer) at random moments, each restarted with the same options; at the
# end every group is counted: trained once, none lost, none twice, and no
# sample trained staler than --max-staleness.  bench/soak.sh does the work
# (its longer runs are the benchmark); the seed is printed, and on a failure
# "rerun with --seed S" reproduces the choice of stages and moments.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

@test "soak: kill -9 of random stages of the async wiring, restarted: every group trained exactly once" {
	local seed=${RL_TEST_SEED:-$RANDOM}
	echo "soak seed $seed" >&3
	run --separate-stderr timeout -k 20 120 bench/soak.sh --seed "$seed" --kills 8 --prompts 200 --timeout 60
	[ "$status" -eq 0 ] || { echo "$stderr" >&3; echo "soak FAILED with seed $seed (RL_TEST_SEED=$seed reruns it)" >&3; return 1; }
	echo "$output" >&3
	[ "$(jq -r .groups_checked <<< "$output")" -eq 200 ]
	[ "$(jq -r .kills <<< "$output")" -ge 1 ]
}

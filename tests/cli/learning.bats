#!/usr/bin/env bats
# Learning, end to end through pipes: on a toy task with a known optimum
# (reward 1 when the first response token is a lowercase letter; about 10% of a
# random byte model's draws), each algorithm drives the mean reward from ~0.1 to
# the optimum within 20 on-policy steps of 4 groups x 8 samples (ppo also with
# 16 prompts x 1 sample).
#   rl-rollout --weights-from CK --max-staleness 0 | rl-reward | rl-train --out CK

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	for i in $(seq 80); do echo '{"prompt":"x"}'; done > "$TD/p.jsonl"
}

setup() {
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# loop ALGO [rollout options...]: 20 steps; prints the per-step mean rewards
loop() {
	algo=$1; shift
	rm -rf "$TD/ck-$algo"
	rl-rollout -q -m "$TD/m0" --weights-from "$TD/ck-$algo" --max-staleness 0 --train-batch 4 -n 8 \
	    --max-tokens 1 --seed 1 --weights-timeout 60 "$@" "$TD/p.jsonl" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-$algo" --algo "$algo" --batch 4 --lr 3e-2 --metrics "$TD/m-$algo.jsonl"
	python3 -c '
import json, sys
r = [json.loads(l)["critic/score/mean"] for l in open(sys.argv[1])]
print(" ".join("%.2f" % x for x in r))
assert len(r) == 20, len(r)
assert r[0] < 0.35, "starts too high: %s" % r[0]
assert min(r[-3:]) >= 0.9, "did not reach the optimum: %s" % r[-3:]
for l in open(sys.argv[1]):
    assert json.loads(l)["staleness/max"] == 0   # strictly on-policy
' "$TD/m-$algo.jsonl"
}

@test "grpo reaches the optimum" { loop grpo; }
@test "dr-grpo reaches the optimum" { loop dr-grpo; }
@test "rloo reaches the optimum" { loop rloo; }
@test "reinforce++ reaches the optimum" { loop reinforce++; }
@test "remax (with a greedy baseline per group) reaches the optimum" { loop remax --greedy-baseline; }
@test "ppo (value head, GAE) reaches the optimum" { loop ppo; }

@test "ppo with one sample per prompt (no groups) reaches the optimum" {
	# groups of one carry no signal for grpo; ppo's value head is the baseline
	for i in $(seq 320); do echo '{"prompt":"x"}'; done > "$TD/p1.jsonl"
	rm -rf "$TD/ck-ppo1"
	rl-rollout -q -m "$TD/m0" --weights-from "$TD/ck-ppo1" --max-staleness 0 --train-batch 16 -n 1 \
	    --max-tokens 1 --seed 1 --weights-timeout 60 "$TD/p1.jsonl" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-ppo1" --algo ppo --batch 16 --lr 3e-2 --metrics "$TD/m-ppo1.jsonl"
	python3 -c '
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
r = [j["critic/score/mean"] for j in m]
print(" ".join("%.2f" % x for x in r))
assert len(r) == 20, len(r)
assert r[0] < 0.35 and min(r[-3:]) >= 0.9, r
# the critic follows the reward: over the last 5 steps its values average near the score
v = sum(j["critic/values/mean"] for j in m[-5:]) / 5
assert abs(v - sum(r[-5:]) / 5) < 0.5, v
' "$TD/m-ppo1.jsonl"
}

@test "a rollout waiting for a version that never comes gives up with a clear error" {
	run -1 --separate-stderr sh -c "rl-rollout -m '$TD/m0' --weights-from '$TD/none' --max-staleness 0 --train-batch 1 \
	    --max-tokens 1 --weights-timeout 1 '$TD/p.jsonl' > /dev/null"
	[[ "$stderr" == *"no weights version 1"* ]]
}

@test "the same loop with weights through rl-sync instead of a directory" {
	on_free_port 'rl-sync status tcp://127.0.0.1:@PORT@ --timeout 200' rl-sync serve -q --listen tcp://127.0.0.1:@PORT@
	url=tcp://127.0.0.1:$DPORT
	rm -rf "$TD/ck-sync"
	rl-rollout -q -m "$TD/m0" --sync "$url" --max-staleness 0 --train-batch 4 -n 8 \
	    --max-tokens 1 --seed 1 --weights-timeout 60 "$TD/p.jsonl" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-sync" --sync "$url" --batch 4 --lr 3e-2 --metrics "$TD/m-sync.jsonl"
	run -0 rl-sync status "$url"
	kill "$DPID"; wait "$DPID" || true
	assert_output --partial "latest: 20"
	python3 -c '
import json, sys
r = [json.loads(l)["critic/score/mean"] for l in open(sys.argv[1])]
assert len(r) == 20 and min(r[-3:]) >= 0.9, r' "$TD/m-sync.jsonl"
}

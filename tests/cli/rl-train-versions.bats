#!/usr/bin/env bats
# A weight version is one trainer step, whatever its AdamW updates
# (--ppo-epochs E x --mini-batches M): --max-steps, the step-N names, the
# metrics' step and staleness, the version reported to rl-queue and the
# staleness gates of both wirings count trainer steps.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3 64
	for i in $(seq 24); do echo "{\"prompt\":\"$i+$i=\",\"answer\":\"$((i + i))\"}"; done > "$TD/prompts.jsonl"
}

setup() {
	QPID=""
}

teardown() {
	[ -z "$QPID" ] || { kill "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; }
}

# the AdamW update count in a checkpoint's optimizer.safetensors metadata
adam_steps() {
	python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"]["step"])' "$1/optimizer.safetensors"
}

@test "--max-steps 4 with 2 epochs x 2 mini-batches: 4 steps, step-00000004, 16 AdamW updates; --resume continues the count" {
	rl-rollout -q -m "$TD/m0" -n 4 --max-tokens 3 --seed 1 "$TD/prompts.jsonl" \
	  | rl-reward -q --task 'format:^[0-9]' > "$TD/s.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck" --batch 2 --ppo-epochs 2 --mini-batches 2 \
	    --lr 1e-3 --max-steps 4 --save-every 2 --keep 0 --metrics "$TD/m.jsonl" "$TD/s.jsonl"
	[[ "$stderr" == *"4 steps"* ]]
	[ "$(jq -s -c 'map(.step)' "$TD/m.jsonl")" = "[1,2,3,4]" ]
	[ "$(jq -s -c 'map(."training/global_step")' "$TD/m.jsonl")" = "[1,2,3,4]" ]
	[ "$(ls "$TD/ck" | grep -v "^run.yaml$" | tr '\n' ' ')" = "latest step-00000001 step-00000002 step-00000003 step-00000004 " ]
	[ "$(jq .global_step "$TD/ck/step-00000004/trainer_state.json")" = 4 ]
	[ "$(adam_steps "$TD/ck/step-00000002")" = 8 ]
	[ "$(adam_steps "$TD/ck/step-00000004")" = 16 ]
	# resumed from step 4: two more steps are versions 5 and 6, AdamW's count goes on from 16
	run -0 --separate-stderr rl-train --resume --out "$TD/ck" --batch 2 --ppo-epochs 2 --mini-batches 2 \
	    --lr 1e-3 --max-steps 6 --keep 0 --metrics "$TD/m2.jsonl" "$TD/s.jsonl"
	[ "$(jq -s -c 'map(.step)' "$TD/m2.jsonl")" = "[5,6]" ]
	[ "$(readlink "$TD/ck/latest")" = step-00000006 ]
	[ "$(adam_steps "$TD/ck/step-00000006")" = 24 ]
}

@test "pipe wiring, --max-staleness 0 with 2 x 2 updates a step: the generator waits for each version, staleness stays 0" {
	head -n 16 "$TD/prompts.jsonl" > "$TD/p16.jsonl"
	rl-rollout -v -m "$TD/m0" --sync "$TD/wd" --max-staleness 0 --train-batch 2 -n 4 --max-tokens 2 --seed 1 \
	    --weights-timeout 60 "$TD/p16.jsonl" 2> "$TD/pipe-rollout.log" \
	  | rl-reward -q --task 'format:^[0-9]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-pipe" --sync "$TD/wd" --batch 2 --ppo-epochs 2 --mini-batches 2 \
	    --lr 1e-3 --metrics "$TD/pipe.jsonl"
	[ "$(jq -s -c 'map(.step)' "$TD/pipe.jsonl")" = "[1,2,3,4,5,6,7,8]" ]
	[ "$(jq -s -c 'map(."staleness/max") | max' "$TD/pipe.jsonl")" = 0 ]
	[ "$(readlink "$TD/wd/latest")" = v000008 ]
	for v in 1 2 3 4 5 6 7; do grep -q "weights version $v loaded" "$TD/pipe-rollout.log"; done
}

@test "queue wiring with 2 x 2 updates a step: the broker's version is the trainer's step; staleness of trained samples counted once" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' \
	    rl-queue serve -q -l tcp://127.0.0.1:@PORT@ --max-staleness 8 -t 30
	URL="tcp://127.0.0.1:$DPORT"
	QPID=$DPID
	head -n 6 "$TD/prompts.jsonl" | rl-queue put -q "$URL"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 3 --queue "$URL" --idle-exit 1
	rl-reward -q --task 'format:^[0-9]' --queue "$URL" --idle-exit 1
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck-q" --batch 2 --ppo-epochs 2 --mini-batches 2 \
	    --lr 1e-3 --queue "$URL" --idle-exit 1 --metrics "$TD/q.jsonl"
	[ "$(jq -s -c 'map(.step)' "$TD/q.jsonl")" = "[1,2,3]" ]
	[ "$(readlink "$TD/ck-q/latest")" = step-00000003 ]
	rl-queue stat --json "$URL" > "$TD/qstat.json"
	# 12 samples, all generated at version 0; the groups of step s were leased at
	# version s - 1: 4 samples each at staleness 0, 1 and 2, counted once
	jq -e '.version == 3' "$TD/qstat.json"
	jq -e '.staleness[0:3] == [4,4,4] and (.staleness | add) == 12 and .staleness_sum == 12' "$TD/qstat.json"
	jq -e '.total.stale_dropped == 0' "$TD/qstat.json"
}

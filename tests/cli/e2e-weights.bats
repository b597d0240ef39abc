#!/usr/bin/env bats
# Weights between the trainer and the generator, the fast paths of the
# asynchronous wiring (bench/e2e.sh): rl-train --ckpt-every N pushes the
# versions between step directories to rl-sync from memory, and rl-rollout
# loads a fetched version from memory; a version of another architecture is
# refused with the tensor named.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	sed 's/"intermediate_size":64/"intermediate_size":96/' "$TD/cfg.json" > "$TD/cfg-other.json"
	rl-train --init "$TD/cfg-other.json" --tokenizer bytes --out "$TD/other" --seed 3
	for i in $(seq 80); do echo '{"prompt":"x"}'; done > "$TD/p.jsonl"
}

setup() {
	SPID=""
}

teardown() {
	[ -z "$SPID" ] || { kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; }
}

# serve: rl-sync on a port from free_port; sets URL and SPID
serve() {
	local rc=0
	on_free_port 'rl-sync status tcp://127.0.0.1:@PORT@ --timeout 200' \
	    rl-sync serve -q --listen tcp://127.0.0.1:@PORT@ || rc=1
	URL=tcp://127.0.0.1:$DPORT
	SPID=$DPID
	return $rc
}

@test "rl-train --ckpt-every without --sync is a usage error" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck-x" --ckpt-every 5 "$TD/p.jsonl"
	[[ "$stderr" == *"--ckpt-every needs --sync"* ]]
	[ ! -e "$TD/ck-x" ]
}

@test "on-policy loop through rl-sync with --ckpt-every 5: every version reaches the generator, directories every 5 steps" {
	serve
	rl-rollout -v -m "$TD/m0" --sync "$URL" --max-staleness 0 --train-batch 4 -n 8 \
	    --max-tokens 1 --seed 1 --weights-timeout 60 "$TD/p.jsonl" 2>"$TD/rollout.log" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck" --sync "$URL" --ckpt-every 5 --keep 0 --batch 4 --lr 3e-2 \
	    --metrics "$TD/m.jsonl"
	run -0 rl-sync status "$URL"
	assert_output --partial "latest: 20"
	# on-policy needs every version: 1..19 came from rl-sync (loaded from memory)
	for v in 1 2 3 4 6 7 19; do grep -q "weights version $v loaded from '$URL/v$v'" "$TD/rollout.log"; done
	grep -q 'time: decoding' "$TD/rollout.log"
	# step directories only every 5 steps, and the first (a new run's first full
	# checkpoint); the last one is a full checkpoint
	[ "$(ls "$TD/ck" | grep -v "^run.yaml$" | tr '\n' ' ')" = "latest step-00000001 step-00000005 step-00000010 step-00000015 step-00000020 " ]
	[ -f "$TD/ck/step-00000001/optimizer.safetensors" ]
	[ -f "$TD/ck/step-00000020/optimizer.safetensors" ]
	python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 20, len(r)
assert all(x["staleness/max"] == 0 for x in r)
assert min(x["critic/score/mean"] for x in r[-3:]) >= 0.9, [x["critic/score/mean"] for x in r]' "$TD/m.jsonl"
}

@test "on-policy through a directory given to --sync: the generator sees every version (it waited for ever)" {
	head -n 24 "$TD/p.jsonl" > "$TD/p24.jsonl"
	rl-rollout -v -m "$TD/m0" --sync "$TD/wd" --max-staleness 0 --train-batch 4 -n 4 --max-tokens 1 --seed 1 \
	    --weights-timeout 10 "$TD/p24.jsonl" 2>"$TD/wd-rollout.log" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-wd" --sync "$TD/wd" --batch 4 --lr 3e-2 --metrics /dev/null
	[ "$(readlink "$TD/wd/latest")" = v000006 ]
	for v in 1 2 3 4 5; do grep -q "weights version $v loaded" "$TD/wd-rollout.log"; done
}

@test "rl-rollout --sync leaves nothing in TMPDIR: not when it fails at the start, not when it is stopped" {
	mkdir -p "$TD/tmp"
	# each of these made TMPDIR/rl-rollout-sync.PID and left it
	run -1 env TMPDIR="$TD/tmp" rl-rollout -q -m "$TD/m0" --max-tokens 1 --sync http://x "$TD/p.jsonl"
	run -1 env TMPDIR="$TD/tmp" rl-rollout -q -m "$TD/m0" --max-tokens 1 --sync "$TD/wd2" --sync-transport shm \
	    "$TD/p.jsonl"
	serve
	rl-sync push -q "$URL" "$TD/m0" --version 1
	TMPDIR="$TD/tmp" rl-rollout -q -m "$TD/m0" --sync "$URL" --max-staleness 0 --train-batch 4 -n 2 --max-tokens 1 \
	    --weights-timeout 30 "$TD/p.jsonl" > /dev/null 3>&- &
	r=$!
	sleep 1
	kill -TERM "$r"
	wait "$r" || true
	[ -z "$(ls -A "$TD/tmp")" ]
	# a sharded version (no model.safetensors) goes through a directory
	# there, made for it and removed once loaded
	mkdir -p "$TD/sh"
	cp "$TD/m0/config.json" "$TD/m0/tokenizer.json" "$TD/sh/"
	cp "$TD/m0/model.safetensors" "$TD/sh/model-00001-of-00001.safetensors"
	python3 -c '
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
m = {k: "model-00001-of-00001.safetensors" for k in h if k != "__metadata__"}
json.dump({"metadata": {}, "weight_map": m}, open(sys.argv[2], "w"))' "$TD/m0/model.safetensors" \
	    "$TD/sh/model.safetensors.index.json"
	rl-sync push -q "$URL" "$TD/sh" --version 2
	run -0 --separate-stderr env TMPDIR="$TD/tmp" rl-rollout -v -m "$TD/m0" --sync "$URL" -n 1 --max-tokens 1 \
	    "$TD/p.jsonl"
	[[ "$stderr" == *"weights version 2 loaded from '$TD/tmp/rl-rollout-sync."*"/v2'"* ]]
	[ -z "$(ls -A "$TD/tmp")" ]
}

@test "rl-sync killed under a generator without a staleness bound: it goes on at its pace with the weights it has" {
	# each look at a server that does not answer cost 2 s, every 20 ms of
	# generation: a run of a second took minutes
	for i in $(seq 3000); do echo '{"prompt":"x"}'; done > "$TD/p3k.jsonl"
	serve
	rl-sync push -q "$URL" "$TD/m0" --version 1
	timeout -k 20 60 rl-rollout -v -m "$TD/m0" --sync "$URL" -n 8 --max-tokens 20 "$TD/p3k.jsonl" \
	    > /dev/null 2> "$TD/dead.log" 3>&- &
	r=$!
	for _ in $(seq 100); do grep -q "weights version 1 loaded" "$TD/dead.log" && break; sleep 0.05; done
	kill -9 "$SPID"; wait "$SPID" || true; SPID=""
	SECONDS=0
	wait "$r"
	[ "$SECONDS" -lt 20 ]
	[ "$(grep -c "does not answer: generating with weights version 1" "$TD/dead.log")" = 1 ]
	grep -q "3000 prompts, 24000 samples" "$TD/dead.log"
}

@test "a version of another architecture from rl-sync is refused, naming the tensor" {
	serve
	run -0 rl-sync push -q "$URL" "$TD/other" --version 1
	run -1 --separate-stderr sh -c "rl-rollout -m '$TD/m0' --sync '$URL' --max-tokens 1 '$TD/p.jsonl' > /dev/null"
	[[ "$stderr" == *"$URL/v1"*"mlp"*"the running model"* ]]
}

@test "ppo with --ckpt-every: the generator loads the versions from memory; the value head stays in the step directories" {
	serve
	# the prompts of 6 steps exactly: with more, the generator could finish
	# step 7's batch before the trainer stops and then wait --weights-timeout
	# (60 s) for version 7
	head -n 24 "$TD/p.jsonl" > "$TD/p24.jsonl"
	rl-rollout -v -m "$TD/m0" --sync "$URL" --max-staleness 0 --train-batch 4 -n 8 \
	    --max-tokens 1 --seed 1 --weights-timeout 60 "$TD/p24.jsonl" 2>"$TD/rollout-ppo.log" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-ppo" --algo ppo --sync "$URL" --ckpt-every 5 --max-steps 6 \
	    --batch 4 --lr 3e-2 --metrics "$TD/m-ppo.jsonl" || true
	[ "$(wc -l < "$TD/m-ppo.jsonl")" -eq 6 ]
	grep -q "weights version 3 loaded from '$URL/v3'" "$TD/rollout-ppo.log"
	! grep -qi "value_head" "$TD/rollout-ppo.log" || false
	[ -f "$TD/ck-ppo/step-00000005/value_head.safetensors" ]
}

#!/usr/bin/env bats
# pipelines/multi-gpu/run.sh with DEVICE=cpu (the wiring of a GPU node on the
# CPU): a run of 2 trainer ranks and 1 generator finishes; a generator or the
# scorer that fails at its start stops the run at once, naming its log (not
# leaving the trainer ranks waiting for records for ever).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	for i in $(seq 16); do echo "{\"id\":$i,\"prompt\":\"x\"}"; done > "$TD/p.jsonl"
}

# mg RUN [VAR=VALUE...]: run.sh on the toy model, 2 ranks, 1 generator, 2 steps
mg() {
	local run=$1
	shift
	env MODEL="$TD/m0" PROMPTS="$TD/p.jsonl" TASK='format:^[a-z]' DEVICE=cpu TRAIN_GPUS="0 1" ROLLOUT_GPUS=0 \
	    BATCH=4 SAMPLES=2 STEPS=2 MAX_TOKENS=2 MASTER_PORT="$(free_port)" RUN="$TD/$run" "$@" \
	    timeout -k 20 60 sh pipelines/multi-gpu/run.sh 3>&-
}

@test "DEVICE=cpu: 2 trainer ranks and a generator run the steps" {
	run -0 --separate-stderr mg ok
	[ "$(readlink "$TD/ok/ckpt/latest")" = step-00000002 ]
}

@test "a generator or the scorer failing at its start stops the run, naming its log" {
	SECONDS=0
	run -1 --separate-stderr mg badgen MAX_TOKENS=0
	[[ "$stderr" == *"rl-rollout.0: exited with status 2 before training ended; see $TD/badgen/logs/rollout.0.log"* ]]
	[[ "$stderr" == *"--max-tokens"* ]]
	run -1 --separate-stderr mg badrew TASK=no-such-task
	[[ "$stderr" == *"rl-reward: exited with status 2 before training ended"* ]]
	[ "$SECONDS" -lt 30 ]
	# nothing left running
	! pgrep -f "$TD/bad" >/dev/null || false
}

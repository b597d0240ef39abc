#!/usr/bin/env bats
# The recipes (pipelines/gsm8k, pipelines/countdown via pipelines/lib/grpo-queue.sh)
# with a tiny random model and arith prompts standing in for a real model and
# data: records flow through the broker, checkpoints appear, a second start
# resumes, a finished run does nothing, the lock keeps a second run out, and
# every process is gone afterwards.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":264,"hidden_size":32,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":32}
JSON
	rl-train --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	rl-reward gen-arith --n 40 --seed 1 --split train > "$TD/train.jsonl"
	rl-reward gen-arith --n 10 --seed 2 --split test > "$TD/test.jsonl"
}

recipe() {
	timeout 60 make --no-print-directory -C pipelines/gsm8k "$@" MODEL="$TD/m0" DATA="$TD/train.jsonl" \
		TEST="$TD/test.jsonl" OUT="$TD/out" TASK=arith DEVICE=cpu BATCH=2 SAMPLES=2 MAX_TOKENS=4 \
		CHAT=0 SAVE_EVERY=1 LR=1e-3
}

no_leftovers() {
	local left
	left=$(ps -eo args= | grep -F -- "$TD/out" | grep -v grep || true)
	[ -z "$left" ] || { echo "left running: $left"; return 1; }
	# the workers name the broker's URL, not the run directory
	left=$(ps -eo args= | grep -F -- "$(cat "$TD/out/queue.url")" | grep -v grep || true)
	[ -z "$left" ] || { echo "left running: $left"; return 1; }
}

@test "recipe: trains, resumes, then has nothing to do" {
	run -0 recipe STEPS=2
	assert_output --partial "from step 0 to 2"
	[ "$(readlink "$TD/out/ckpt/latest")" = step-00000002 ]
	[ "$(wc -l < "$TD/out/metrics.jsonl")" -eq 2 ]
	no_leftovers
	run -0 recipe STEPS=4
	assert_output --partial "from step 2 to 4"
	[ "$(readlink "$TD/out/ckpt/latest")" = step-00000004 ]
	[ "$(wc -l < "$TD/out/metrics.jsonl")" -eq 4 ]
	grep -q 'resuming from' "$TD"/out/logs/*/train.log
	[ "$(ls "$TD/out/logs" | wc -l)" -eq 2 ]
	no_leftovers
	run -0 recipe STEPS=4
	assert_output --partial "nothing to do"
	run -0 recipe eval
	assert_output --regexp 'eval: step-00000004: accuracy [0-9.]+ on 10 problems'
}

@test "recipe: a second run while one holds the lock exits 0 and does nothing" {
	mkdir -p "$TD/out"
	flock "$TD/out/.lock" sleep 5 3>&- &
	holder=$!
	sleep 0.5
	run -0 recipe STEPS=6
	kill "$holder" 2>/dev/null || true
	wait "$holder" 2>/dev/null || true
	assert_output --partial "another run holds"
}

@test "recipe: a missing model or prompt file is a usage error" {
	run -2 --separate-stderr timeout 20 env MODEL="$TD/none" PROMPTS="$TD/train.jsonl" OUT="$TD/x" TASK=arith \
		sh pipelines/lib/grpo-queue.sh
	[[ "$stderr" == *"is not a directory"* ]]
	run -2 --separate-stderr timeout 20 env MODEL="$TD/m0" PROMPTS="$TD/none.jsonl" OUT="$TD/x" TASK=arith \
		sh pipelines/lib/grpo-queue.sh
	[[ "$stderr" == *"not found"* ]]
}

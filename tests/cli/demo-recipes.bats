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
	timeout -k 20 60 make --no-print-directory -C pipelines/gsm8k "$@" MODEL="$TD/m0" DATA="$TD/train.jsonl" \
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
	run -2 --separate-stderr timeout -k 20 20 env MODEL="$TD/none" PROMPTS="$TD/train.jsonl" OUT="$TD/x" TASK=arith \
		sh pipelines/lib/grpo-queue.sh
	[[ "$stderr" == *"is not a directory"* ]]
	run -2 --separate-stderr timeout -k 20 20 env MODEL="$TD/m0" PROMPTS="$TD/none.jsonl" OUT="$TD/x" TASK=arith \
		sh pipelines/lib/grpo-queue.sh
	[[ "$stderr" == *"not found"* ]]
}

recipe_in() { # recipe_in OUT ARGS...: the recipe in another run directory
	local out=$1; shift
	timeout -k 20 120 make --no-print-directory -C pipelines/gsm8k "$@" MODEL="$TD/m0" DATA="$TD/train.jsonl" \
		TEST="$TD/test.jsonl" OUT="$out" TASK=arith DEVICE=cpu BATCH=2 SAMPLES=2 MAX_TOKENS=4 \
		CHAT=0 LR=1e-3
}

@test "recipe: more steps than the prompts can feed is an error at once, not a run that waits for ever" {
	run --separate-stderr recipe_in "$TD/few" STEPS=30 SAVE_EVERY=1
	[ "$status" -ne 0 ]
	[[ "$stderr" == *"STEPS 30 x BATCH 2 needs 60 prompts;"*"has 40"* ]]
	[ ! -e "$TD/few/ckpt" ]
}

@test "recipe: eval fails when rl-rollout fails on a test line, instead of scoring the lines before it" {
	{ head -n 3 "$TD/test.jsonl"; echo '{"prompt": 12}'; tail -n 6 "$TD/test.jsonl"; } > "$TD/badtest.jsonl"
	run --separate-stderr timeout -k 20 60 make --no-print-directory -C pipelines/gsm8k eval MODEL="$TD/m0" \
		OUT="$TD/ev" TASK=arith DEVICE=cpu MAX_TOKENS=4 CHAT=0 TEST="$TD/badtest.jsonl"
	[ "$status" -ne 0 ]
	[[ "$stderr" == *"eval: rl-rollout failed"* ]]
	[[ "$output" != *"accuracy"* ]]
}

@test "recipe: a driver killed with -9 leaves no lock behind; the next run stops the workers it left" {
	# 400 prompts and 150 steps: several seconds, so the kill lands mid-run
	rl-reward gen-arith --n 400 --seed 3 --split train > "$TD/train400.jsonl"
	timeout -k 20 120 make --no-print-directory -C pipelines/gsm8k MODEL="$TD/m0" DATA="$TD/train400.jsonl" \
		OUT="$TD/k9" TASK=arith DEVICE=cpu BATCH=2 SAMPLES=2 MAX_TOKENS=4 CHAT=0 LR=1e-3 STEPS=150 \
		> "$TD/k9.out" 2>&1 &
	M=$!
	for i in $(seq 600); do [ -L "$TD/k9/ckpt/latest" ] && break; sleep 0.05; done
	[ -L "$TD/k9/ckpt/latest" ]
	# the driver only (by pid: a descendant of this make whose command is the script)
	drv=""
	for p in $(ps -eo pid=,ppid=,args= | awk -v m="$M" '
		{ par[$1] = $2; cmd[$1] = $0 }
		END { for (p in par) { q = p; while (q in par && q != m && q > 1) q = par[q]
			if (q == m && cmd[p] ~ /grpo-queue\.sh/) print p } }'); do drv="$drv $p"; done
	[ -n "$drv" ]
	kill -9 $drv
	wait $M || true
	[ "$(readlink "$TD/k9/ckpt/latest")" != step-00000150 ]
	# its broker, generator and scorer live on (they never stop by themselves) but hold
	# no lock: the next run starts, stops them first, and finishes
	run -0 --separate-stderr timeout -k 20 120 make --no-print-directory -C pipelines/gsm8k MODEL="$TD/m0" \
		DATA="$TD/train400.jsonl" OUT="$TD/k9" TASK=arith DEVICE=cpu BATCH=2 SAMPLES=2 MAX_TOKENS=4 \
		CHAT=0 LR=1e-3 STEPS=150
	assert_output --partial "stopped processes left by an earlier run"
	[ "$(readlink "$TD/k9/ckpt/latest")" = step-00000150 ]
	left=$(ps -eo args= | grep -F -- "$TD/k9" | grep -v grep || true)
	[ -z "$left" ]
}

@test "recipe: after a crash between full checkpoints the run goes on from the last full one" {
	run -0 recipe_in "$TD/cr" STEPS=7 SAVE_EVERY=5 EXTRA_TRAIN="--keep 10"
	# a crash after step 7 was published, before its full checkpoint: 6 and 7 without
	# optimizer state, 5 the last full one
	rm "$TD/cr/ckpt/step-00000007/optimizer.safetensors"
	[ ! -e "$TD/cr/ckpt/step-00000006/optimizer.safetensors" ]
	run -0 --separate-stderr recipe_in "$TD/cr" STEPS=12 SAVE_EVERY=5
	assert_output --partial "step-00000006: newer than the last full checkpoint (step 5)"
	assert_output --partial "step-00000007: newer than the last full checkpoint (step 5)"
	assert_output --partial "from step 5 to 12"
	[ "$(readlink "$TD/cr/ckpt/latest")" = step-00000012 ]
}

@test "recipe: a crash more than STALENESS steps after the last full checkpoint resumes (the trainer sets the broker's version back)" {
	run -0 recipe_in "$TD/cs" STEPS=9 SAVE_EVERY=5 EXTRA_TRAIN="--keep 10"
	# a kill after step 9 was published: the broker's journal holds trainer
	# version 9; resumed from step 5, rl-train sets it back to 5, so the
	# samples generated from version 5 on are not stale (9 - 1)
	rm "$TD/cs/ckpt/step-00000009/optimizer.safetensors"
	run -0 --separate-stderr recipe_in "$TD/cs" STEPS=12 SAVE_EVERY=5 IDLE_EXIT=20
	refute_output --partial "starting it over"
	assert_output --partial "from step 5 to 12"
	[ "$(readlink "$TD/cs/ckpt/latest")" = step-00000012 ]
	left=$(ps -eo args= | grep -F -- "$TD/cs" | grep -v grep || true)
	[ -z "$left" ]
}

@test "recipe: a crash before the first full checkpoint starts over, broker journal included" {
	run -0 recipe_in "$TD/c0" STEPS=4 SAVE_EVERY=5 EXTRA_TRAIN="--keep 10"
	# (the first step of a run is a full checkpoint: a crash in it, before its
	# optimizer state, leaves none)
	rm "$TD"/c0/ckpt/step-*/optimizer.safetensors
	# the broker's journal remembered version 4 and the prompts taken: kept, the new
	# trainer at version 0 stalled
	run -0 --separate-stderr recipe_in "$TD/c0" STEPS=3 SAVE_EVERY=5 IDLE_EXIT=60
	assert_output --partial "no full checkpoint to resume from: starting over"
	assert_output --partial "from step 0 to 3"
	[ "$(readlink "$TD/c0/ckpt/latest")" = step-00000003 ]
}

@test "recipe: a Ctrl-C stops the workers before the broker: leases go back, nothing is left" {
	# a terminal's Ctrl-C is a SIGINT to the whole foreground process group:
	# make, the driver and its background jobs.  The jobs start with SIGINT
	# ignored (a script's '&') and keep it so; the driver's trap stops the
	# trainer, scorer and generator while the broker still answers, then the
	# broker.  (Were they to take the SIGINT too, the broker would die with them
	# and the workers spend ~20 s failing to hand their leases back.)
	rl-reward gen-arith --n 400 --seed 3 --split train > "$TD/int1.jsonl"
	for i in 1 2 3 4 5 6 7 8 9 10; do cat "$TD/int1.jsonl"; done > "$TD/int.jsonl"
	setsid env --default-signal=INT make --no-print-directory -C pipelines/gsm8k MODEL="$TD/m0" \
		DATA="$TD/int.jsonl" OUT="$TD/int" TASK=arith DEVICE=cpu BATCH=2 SAMPLES=2 MAX_TOKENS=4 CHAT=0 \
		LR=1e-3 STEPS=1500 > "$TD/int.out" 2>&1 &
	M=$!
	for i in $(seq 600); do [ -L "$TD/int/ckpt/latest" ] && break; sleep 0.05; done
	[ -L "$TD/int/ckpt/latest" ]
	sleep 0.3
	kill -INT -- -"$M"
	st=0; wait "$M" || st=$?
	[ "$st" -ne 0 ]
	[ "$(readlink "$TD/int/ckpt/latest")" != step-00001500 ]
	cat "$TD"/int/logs/*/*.log
	run ! grep -E 'no reply from the broker|request failed|could not hand|cannot hand' "$TD"/int/logs/*/*.log
	grep -q 'rl-train: .* steps; ' "$TD"/int/logs/*/train.log
	left=$(ps -eo args= | grep -F -- "$TD/int" | grep -v grep || true)
	[ -z "$left" ]
	left=$(ps -eo args= | grep -F -- "$(cat "$TD/int/queue.url")" | grep -v grep || true)
	[ -z "$left" ]
}

#!/usr/bin/env bats
# pipelines/agent-openai, shortened: the calculator task trained by GRPO
# through agents that speak the OpenAI API under `rl-rollout serve --agent`,
# the Python one (standard library) and the JavaScript one (the official
# `openai` npm client; skipped when the package cannot be installed).  Too
# few steps to learn: the flow is checked (whole groups reach the trainer,
# checkpoints appear, the held-out harness runs, the promise is checked), and
# nothing is left running.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	export SFT_STEPS=20 TEST_N=8 SEED=3
}

no_leftovers() {
	local left
	left=$(ps -eo pid=,args= | grep -F -e "$1" -e "agent-openai/calc_agent" | grep -v grep || true)
	[ -z "$left" ] || { echo "left running: $left"; return 1; }
}

@test "agent-openai demo (Python agent), shortened: episodes flow from serve --agent to rl-train; the promise is checked" {
	run -1 --separate-stderr timeout 120 env RL_STEPS=2 PROMPTS=4 SAMPLES=2 GOAL=1 GOAL_MIN=1.01 \
	    RUN="$TD/py" sh pipelines/agent-openai/demo.sh
	[[ "$stderr" == *"agent-openai demo: promise NOT met: held-out success"* ]]
	assert_output --partial "after GRPO"
	assert_output --partial "--agent: 16 runs, 16 with a reward, 0 failed"
	[ "$(wc -l < "$TD/py/metrics.jsonl")" -eq 2 ]
	[ "$(readlink "$TD/py/ckpt/latest")" = step-00000002 ]
	grep -q '"agent":"py"' "$TD/py/summary.json"
	# the trainer got whole groups of agent episodes with their masks
	grep -q 'rl-train: 2 steps; 16 records' "$TD/py/logs/train.log"
	grep -q ', 0 bad records' "$TD/py/logs/train.log"
	no_leftovers "$TD/py"
}

@test "agent-openai demo (JavaScript agent, the openai npm client), shortened: the reward printed on stdout" {
	nm=$(sh tests/cli/serve_fetch.sh) || skip "the openai npm package cannot be installed (offline?)"
	command -v node >/dev/null || skip "node is not installed"
	run -0 --separate-stderr timeout 120 env NODE_PATH="$nm" AGENT=js RL_STEPS=1 PROMPTS=2 SAMPLES=2 GOAL=0 \
	    RUN="$TD/js" sh pipelines/agent-openai/demo.sh
	assert_output --partial "--agent: 4 runs, 4 with a reward, 0 failed"
	[ "$(readlink "$TD/js/ckpt/latest")" = step-00000001 ]
	grep -q 'rl-train: 1 steps; 4 records' "$TD/js/logs/train.log"
	no_leftovers "$TD/js"
}

@test "agent-openai demo: a bad AGENT is a usage error" {
	run -2 env AGENT=rust RUN="$TD/bad" sh pipelines/agent-openai/demo.sh
	assert_output --partial "AGENT is py or js, not 'rust'"
}

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
	run -1 --separate-stderr timeout -k 20 120 env RL_STEPS=2 PROMPTS=4 SAMPLES=2 GOAL=1 GOAL_MIN=1.01 \
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
	# greedy, the agent's records are the --env harness's token for token (calculator turns included)
	base="$TD/py/sft/$(readlink "$TD/py/sft/latest")"
	rl-rollout -q -m "$base" --temperature 0 --env "python3 pipelines/agent/calc_env.py" --env-framing plain \
	    --max-turns 3 --max-tokens 24 --max-episode-tokens 72 --stop "</calc>" --stop "
" --jsonl "$TD/py/data/test.jsonl" > "$TD/env.jsonl"
	AGENT_TEMPERATURE=0 rl-rollout serve -q -m "$base" --listen 127.0.0.1:0 \
	    --agent "python3 pipelines/agent-openai/calc_agent.py" --max-tokens 24 --jsonl "$TD/py/data/test.jsonl" > "$TD/agent.jsonl"
	python3 - "$TD/env.jsonl" "$TD/agent.jsonl" <<'PY'
import json, sys
e, a = ({json.loads(l)["prompt_text"]: json.loads(l) for l in open(f)} for f in sys.argv[1:3])
assert e.keys() == a.keys() and len(e) == 8, (len(e), len(a))
for k in e:
    for f in ("prompt", "response", "loss_mask", "turns", "reward"):
        assert e[k][f] == a[k][f], (k, f, e[k]["response_text"], a[k]["response_text"])
    assert max(abs(p - q) for p, q in zip(e[k]["logprobs"], a[k]["logprobs"])) < 1e-4
print("tool episodes:", sum(len(r["turns"]) > 2 for r in e.values()))
PY
}

@test "agent-openai demo (JavaScript agent, the openai npm client), shortened: the reward printed on stdout" {
	nm=$(sh tests/cli/serve_fetch.sh) || skip "the openai npm package cannot be installed (offline?)"
	command -v node >/dev/null || skip "node is not installed"
	run -0 --separate-stderr timeout -k 20 120 env NODE_PATH="$nm" AGENT=js RL_STEPS=1 PROMPTS=2 SAMPLES=2 GOAL=0 \
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

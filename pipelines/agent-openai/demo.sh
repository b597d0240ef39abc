#!/bin/sh
# pipelines/agent-openai/demo.sh — the calculator task of pipelines/agent,
# learned by RL through an agent that speaks the OpenAI API.
#
# The model and the warm start are pipelines/agent's (a byte-level model from
# scratch, SFT on half direct answers, half calculator calls).  Then GRPO
# where the environment is agent code: `rl-rollout serve --agent CMD` serves
# the policy on a loopback port and runs CMD once per episode (-n SAMPLES per
# prompt line: a group); the agent (calc_agent.py, standard library only, or
# calc_agent.js, the official `openai` npm client: AGENT=js) calls
# /v1/completions, runs the calculator on <calc>EXPR</calc> itself, and
# gives the reward (1 when its final ANSWER is the sum); the server's records
# (loss_mask 0 on the calculator's text) go to rl-train, on-policy
# (--max-staleness 0).
#
# The held-out success is measured by another harness, `rl-rollout --env`
# with pipelines/agent/calc_env.py (greedy episodes on problems never trained
# on), before and after.  Exits 1 unless it rose by GOAL_GAIN and reached
# GOAL_MIN (GOAL=1).  Settings from the environment (defaults below).  Every
# process it starts is stopped by pid on exit.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
SEED=${SEED:-1}
RUN=${RUN:-runs/agent-openai}
AGENT=${AGENT:-py}
SFT_STEPS=${SFT_STEPS:-400}
SFT_BATCH=${SFT_BATCH:-32}
SFT_LR=${SFT_LR:-2e-3}
RL_STEPS=${RL_STEPS:-20}
PROMPTS=${PROMPTS:-16}
SAMPLES=${SAMPLES:-8}
AGENTS=${AGENTS:-32}
RL_LR=${RL_LR:-5e-4}
TEST_N=${TEST_N:-200}
GOAL=${GOAL:-1}
GOAL_GAIN=${GOAL_GAIN:-0.2}
GOAL_MIN=${GOAL_MIN:-0.6}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

case $AGENT in
py) AGENT_CMD="python3 $here/calc_agent.py" ;;
js)
	command -v node >/dev/null 2>&1 || { echo "agent-openai demo: AGENT=js needs node" >&2; exit 2; }
	# the openai package: NODE_PATH as given, else the cache tests/cli/serve_fetch.sh fills
	NODE_PATH=${NODE_PATH:-${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}-openai/node_modules}
	export NODE_PATH
	node -e 'require("openai")' 2>/dev/null ||
		{ echo "agent-openai demo: the openai npm package is not on NODE_PATH ($NODE_PATH); see README.md" >&2; exit 2; }
	AGENT_CMD="node $here/calc_agent.js" ;;
*) echo "agent-openai demo: AGENT is py or js, not '$AGENT'" >&2; exit 2 ;;
esac
for p in rl-train rl-rollout python3; do
	command -v $p >/dev/null 2>&1 || { echo "agent-openai demo: $p not found on PATH" >&2; exit 1; }
done
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; PIDS=""; }
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

rm -rf "$RUN"
mkdir -p "$RUN/logs" "$RUN/data"
RUN=$(cd "$RUN" && pwd)
L=$RUN/logs
python3 "$here/../agent/make_data.py" "$RUN/data" "$SEED" "$SFT_STEPS" "$SFT_BATCH" "$RL_STEPS" "$PROMPTS" "$TEST_N"

# held-out success and tool-call rate of model directory $1: greedy episodes
# through rl-rollout --env and calc_env.py, pipelines/agent's harness
evaluate() {
	rl-rollout -q -m "$1" --temperature 0 --env "python3 $here/../agent/calc_env.py" --env-framing plain \
	    --env-procs 4 --max-turns 3 --max-tokens 24 --max-episode-tokens 72 --stop "</calc>" --stop "
" --jsonl "$RUN/data/test.jsonl" 2>>"$L/eval.log" | python3 -c '
import json, sys
n = ok = tool = 0
for l in sys.stdin:
    r = json.loads(l)
    n += 1
    ok += r.get("reward", 0) == 1
    tool += len(r.get("turns", [])) >= 4
print("%.3f %.3f" % (ok / max(n, 1), tool / max(n, 1)))'
}

echo "agent-openai demo: seed $SEED, agent $AGENT_CMD; run directory $RUN"
rl-train -q --init "$here/../agent/model.json" --tokenizer bytes --out "$RUN/init" --seed "$SEED" 2>"$L/init.log" ||
	{ echo "agent-openai demo: rl-train --init failed; see $L/init.log" >&2; exit 1; }
echo "agent-openai demo: SFT warm start: $SFT_STEPS steps x $SFT_BATCH examples, half of them calling the calculator"
rl-train -q -m "$RUN/init" --out "$RUN/sft" --algo sft --seed "$SEED" --batch "$SFT_BATCH" --lr "$SFT_LR" --keep 1 \
    "$RUN/data/sft.jsonl" 2>"$L/sft.log" ||
	{ echo "agent-openai demo: SFT failed; see $L/sft.log" >&2; tail -n 5 "$L/sft.log" >&2; exit 1; }
BASE=$RUN/sft/$(readlink "$RUN/sft/latest")
# shellcheck disable=SC2046  # two numbers, split on purpose
set -- $(evaluate "$BASE")
ok0=$1 tool0=$2
echo "agent-openai demo: after SFT: held-out success $ok0, tool calls $tool0"

echo "agent-openai demo: GRPO: $RL_STEPS steps x $PROMPTS prompts x $SAMPLES agent episodes (lr $RL_LR)"
CK=$RUN/ckpt
M=$RUN/metrics.jsonl
t0=$(date +%s)
# a record without a reward (a failed agent run) drops its group instead of stopping the trainer
rl-rollout serve -m "$BASE" --listen 127.0.0.1:0 -n "$SAMPLES" --agents "$AGENTS" --agent "$AGENT_CMD" \
    --max-tokens 24 --weights-from "$CK" --max-staleness 0 --train-batch "$PROMPTS" "$RUN/data/prompts.jsonl" \
    2>"$L/serve.log" |
	rl-train -m "$BASE" --out "$CK" --algo grpo --seed "$SEED" --batch "$PROMPTS" --lr "$RL_LR" --keep 2 \
	    --on-bad skip --metrics "$M" - 2>"$L/train.log" ||
	{ echo "agent-openai demo: GRPO failed; see $L/serve.log and $L/train.log" >&2; tail -n 5 "$L/serve.log" "$L/train.log" >&2; exit 1; }
t1=$(date +%s)
FINAL=$CK/$(readlink "$CK/latest")
# shellcheck disable=SC2046
set -- $(evaluate "$FINAL")
ok1=$1 tool1=$2
steps=$(wc -l < "$M")
echo ""
echo "                 held-out ($TEST_N problems, greedy episodes)"
echo "                 success   tool calls"
echo "  after SFT      $ok0     $tool0"
echo "  after GRPO     $ok1     $tool1   ($steps steps, $((t1 - t0)) s)"
grep -h -- '--agent:' "$L/serve.log" | sed 's/^rl-rollout: /agent-openai demo: /' || true
printf '{"seed":%s,"agent":"%s","success_sft":%s,"tools_sft":%s,"success_rl":%s,"tools_rl":%s,"rl_steps":%s,"rl_seconds":%s}\n' \
    "$SEED" "$AGENT" "$ok0" "$tool0" "$ok1" "$tool1" "$steps" "$((t1 - t0))" > "$RUN/summary.json"

if [ "$GOAL" = 1 ]; then
	if awk -v a="$ok1" -v b="$ok0" -v g="$GOAL_GAIN" -v m="$GOAL_MIN" 'BEGIN { exit !(a >= b + g && a >= m) }'; then
		echo "agent-openai demo: promise met: held-out success $ok0 -> $ok1"
	else
		echo "agent-openai demo: promise NOT met: held-out success $ok0 -> $ok1 (wanted +$GOAL_GAIN and >= $GOAL_MIN)" >&2
		exit 1
	fi
fi
exit 0

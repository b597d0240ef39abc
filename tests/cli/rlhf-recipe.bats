#!/usr/bin/env bats
# pipelines/rlhf/rlhf.sh (make demo-prefs) with small settings: SFT, a reward
# model on ranked pairs (a Qwen2ForSequenceClassification directory), its
# held-out pair accuracy through rl-reward --model, PPO in the pipe
# rl-rollout | rl-reward --model RM | rl-train --algo ppo, and DPO on the same
# pairs; each stage runs, the
# trained model's records carry the reward model's score, and nothing is left
# running.  Whether it learns is the recipe's own GOAL check at full size.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

@test "rlhf recipe: SFT -> reward model -> PPO against it in the pipe" {
	R="$BATS_TEST_TMPDIR/run"
	run -0 env SFT_STEPS=8 PAIRS=32 RL_STEPS=2 PROMPTS=4 SAMPLES=2 TEST_N=8 DPO_BATCH=16 GOAL=0 RUN="$R" \
	    timeout -k 20 120 sh pipelines/rlhf/rlhf.sh
	assert_output --partial "held-out pair accuracy: "
	assert_output --partial "hidden rule after PPO: "
	assert_output --partial "hidden rule after DPO: "
	run -0 jq -r '.architectures[0]' "$R/rm/latest/config.json"
	[ "$output" = Qwen2ForSequenceClassification ]
	[ "$(readlink "$R/ppo/latest")" = step-00000002 ]
	run -0 jq -s 'length == 2 and all(.[]; has("critic/score/mean") and has("critic/vf_loss"))' "$R/ppo-metrics.jsonl"
	[ "$output" = true ]
	run -0 jq -e '.ppo_steps == 2 and .dpo_steps == 2 and .rm_heldout_accuracy >= 0 and .rule_dpo >= 0' "$R/summary.json"
	run -0 jq -s 'all(.[]; has("rewards/margins"))' "$R/dpo-metrics.jsonl"
	[ "$output" = true ]
	# the scores the policy trained on were the reward model's
	grep -q 'mean per component: model ' "$R/logs/reward.log"
	left=$(ps -eo args= | grep -F -- "$R" | grep -v grep || true)
	[ -z "$left" ]
}

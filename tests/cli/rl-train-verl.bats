#!/usr/bin/env bats
# rl-train's first step against an independent computation of it the way verl
# defines it (tests/fixtures/train/verl_ref.py, float64 PyTorch): every
# algorithm, clipping, dual clip, TIS, KL estimators in the loss and in the
# reward, entropy bonus, loss aggregations, PPO's GAE and value loss, several
# epochs and mini-batches.  The golden numbers are in verl_expected.jsonl (one
# line per case of verl_cases.txt; regenerate them with the commands at the
# top of verl_ref.py); this file needs no PyTorch.
#
# Tolerance |got - want| <= 1e-5 + 1e-4 |want|: rl-train is fp32 against a
# float64 reference on a two-layer model; the largest difference seen is
# 4e-7 (three updates at lr 0.05), so the bound leaves room for summation
# order, and a wrong term (a factor, a missing token) is orders above it.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

FX=tests/fixtures/train

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# the ppo cases: the same model with verl_ref.py's value head
	cp -r "$TD/m0" "$TD/m0-ppo"
	cp "$FX/verl_value_head.safetensors" "$TD/m0-ppo/value_head.safetensors"
}

# run_cases FILTER: the cases of verl_expected.jsonl whose options match FILTER
# (verl_cases, model_helper.bash); at least one
run_cases() {
	verl_cases "$FX/verl_expected.jsonl" "$FX/verl_records.jsonl" "$1"
	[ "$VERL_CASES" -gt 0 ]
}

@test "grpo, dr-grpo, rloo, dapo and the loss aggregations match verl's first step" {
	run_cases '^--(algo (grpo|dr-grpo|rloo|dapo)|loss-agg)'
}

@test "gspo (the sequence's importance ratio at every token, its clip of 3e-4/4e-4, seq-mean-token-mean) matches verl's gspo loss mode" {
	run_cases '^--algo gspo'
}

@test "gspo refuses the token-ratio bounds --dual-clip and --tis-cap" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/g" --algo gspo --dual-clip 2 "$FX/verl_records.jsonl"
	[[ "$stderr" == *"--dual-clip with --algo gspo"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/g" --algo gspo --tis-cap 2 "$FX/verl_records.jsonl"
	[[ "$stderr" == *"--tis-cap with --algo gspo"* ]]
}

@test "ratio clipping, clip-higher, dual clip and truncated IS match verl (pg_clipfrac and pg_clipfrac_lower as verl's)" {
	run_cases '^--(old-from-behaviour|tis-cap)'
}

@test "KL estimators in the loss and in the reward, and the entropy bonus, match verl (actor/pg_loss is the pg term alone; actor/reward_kl_penalty)" {
	run_cases '--kl |--ent-coef'
}

@test "reinforce++, remax (reward-to-go minus the greedy baseline) and ppo (GAE, whitening, value loss) match verl" {
	run_cases '^--algo (reinforce\+\+|remax|ppo)'
}

@test "several epochs and mini-batches (pi_old and V_old fixed at the step's start, Adam between, value clipping) match verl" {
	run_cases '--(ppo-epochs|mini-batches)'
}

@test "--dual-clip at or below 1 is a usage error (it would take the gradient of negative advantages; verl asserts clip_ratio_c > 1)" {
	for c in 0.5 1 1.00000001; do
		run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/dc" --dual-clip "$c" "$FX/verl_records.jsonl"
		[[ "$stderr" == *"--dual-clip $c: the dual clip constant must be above 1 (0 is off)"* ]]
	done
	[ ! -e "$TD/dc" ]
	run -0 rl-train -q -m "$TD/m0" --out "$TD/dc0" --batch 4 --dual-clip 0 "$FX/verl_records.jsonl"
	run -0 rl-train -q -m "$TD/m0" --out "$TD/dc3" --batch 4 --dual-clip 3 "$FX/verl_records.jsonl"
}

@test "--kl-in-reward, --kl-coef and --ref without --kl are usage errors (they trained with no KL at all); --ref with --kl-in-reward too" {
	for a in "--kl-in-reward" "--kl-in-reward --kl-coef 0.5" "--kl-coef 0.5" "--ref $TD/m0"; do
		run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/kl" $a "$FX/verl_records.jsonl"
		[[ "$stderr" == *"${a%% *} needs --kl k1|k2|k3"* ]] || { echo "$a: $stderr"; return 1; }
	done
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/kl" --kl k1 --kl-in-reward --ref "$TD/m0" "$FX/verl_records.jsonl"
	[[ "$stderr" == *"--ref with --kl-in-reward: the reward's KL comes from the records' ref_logprobs"* ]]
	[ ! -e "$TD/kl" ]
	run -0 rl-train -q -m "$TD/m0" --out "$TD/klr" --batch 4 --kl k1 --ref "$TD/m0" "$FX/verl_records.jsonl"
}

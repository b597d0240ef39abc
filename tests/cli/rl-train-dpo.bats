#!/usr/bin/env bats
# rl-train --algo dpo and --algo rm end to end on a tiny model: the first step's TRL
# metrics and gradient against a float64 PyTorch restatement
# (tests/fixtures/train/dpo_step_ref.py) for every loss type, label smoothing,
# RPO, the reference from the records, from --ref and from the initial
# policy; pair lines through the chat tokenizer; --resume; 2 ranks; bad pairs
# named by line.  --algo rm: the Bradley-Terry loss on the score head at the
# last token, its metrics and gradient (score head included) against the same
# script; --resume.
#
# Tolerances: metrics |got - want| <= 1e-6 + 1e-5 |want| (fp32 log-probs of
# 10-token completions against float64; seen: 4e-8); gradients as
# verl_ref.py's grad_check (5e-5 + 2e-2 |g|; seen: 5e-7).  A wrong factor
# (a mean for a sum, 1/P missing, the RPO term on the rejected side) is
# orders above both.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

REF=tests/fixtures/train/dpo_step_ref.py

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m1" --seed 2
	# --algo rm: m0 with a known score head (verl_ref.py's value head)
	cp -r "$TD/m0" "$TD/m0rm"
	cp tests/fixtures/train/verl_value_head.safetensors "$TD/m0rm/value_head.safetensors"
	# 16 pair lines of text (TRL's standard form)
	word_pairs 16 > "$TD/pairs.jsonl"
}

setup() {
	if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
		skip "no PyTorch for /usr/bin/python3 (Debian python3-torch)"
	fi
	[ -s "$TD/recs.jsonl" ] || "$REF" gen "$TD/m0" > "$TD/recs.jsonl"
	jq -c 'del(.ref_logprobs)' "$TD/recs.jsonl" > "$TD/noref.jsonl"
	PORT=$(free_port)
}

# run_case DATA ARGS: (the model $TD/$M, default m0; ARGS after --algo dpo) the first step twice (metrics at --lr 1e-3; the
# gradient read back from AdamW's first update at --lr 1), a line for check
run_case() {
	local data=$1 args=$2 n=$BATS_TEST_NUMBER.$RANDOM
	# shellcheck disable=SC2086
	rl-train -q -m "$TD/${M:-m0}" --out "$TD/c$n" --algo dpo --batch 4 --max-steps 1 --lr 1e-3 --grad-clip 1e9 \
	    --metrics "$TD/c$n.json" $args "$data"
	# shellcheck disable=SC2086
	rl-train -q -m "$TD/${M:-m0}" --out "$TD/g$n" --algo dpo --batch 4 --max-steps 1 --lr 1 --adam-eps 1 \
	    --weight-decay 0 --grad-clip 1e9 $args "$data"
	printf '%s\t%s\t%s\t%s\n' "$data" "$TD/c$n.json" "$TD/g$n/step-00000001" "$args" >> "$TD/cases.$BATS_TEST_NUMBER"
}

# check: every case of the test against dpo_step_ref.py (one PyTorch process)
check() {
	"$REF" check "$TD/${M:-m0}" < "$TD/cases.$BATS_TEST_NUMBER"
}

@test "dpo: sigmoid, ipo, hinge, label smoothing and RPO (records' ref_logprobs) match TRL's loss, metrics and gradient" {
	run_case "$TD/recs.jsonl" ""
	run_case "$TD/recs.jsonl" "--dpo-loss ipo --beta 0.5"
	run_case "$TD/recs.jsonl" "--dpo-loss hinge --beta 2"
	run_case "$TD/recs.jsonl" "--label-smoothing 0.2 --rpo-alpha 0.7"
	check
}

@test "dpo: the reference from --ref, and by default the initial policy (-m) when records have no ref_logprobs" {
	run_case "$TD/recs.jsonl" "--ref $TD/m1"
	run_case "$TD/noref.jsonl" ""
	check
	# the initial policy stays the reference on later steps: step 2 is not log 2
	rl-train -q -m "$TD/m0" --out "$TD/i" --algo dpo --batch 2 --lr 1e-2 --metrics "$TD/i.json" "$TD/noref.jsonl"
	run -0 jq -s '.[1]["actor/dpo_loss"] != (2 | log)' "$TD/i.json"
	[ "$output" = true ]
}

@test "dpo: pair lines train; --resume continues identically; micro-batches and 2 ranks give the same weights" {
	args=(--algo dpo --batch 4 --lr 1e-2)
	rl-train -q -m "$TD/m0" --out "$TD/p" --metrics "$TD/p.json" "${args[@]}" "$TD/pairs.jsonl"
	[ "$(readlink "$TD/p/latest")" = step-00000004 ]
	run -0 jq -s '[.[] | .["actor/dpo_loss"]] | (.[0] - (2 | log) | fabs) < 1e-9 and .[3] < .[0]' "$TD/p.json"
	[ "$output" = true ]
	grep -qx 'dpo-loss: sigmoid' "$TD/p/run.yaml"
	grep -qx 'beta: 0.1' "$TD/p/run.yaml"
	# stopped after 2 steps, resumed: bitwise the same weights
	rl-train -q -m "$TD/m0" --out "$TD/r" --max-steps 2 "${args[@]}" "$TD/pairs.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/r" --resume "${args[@]}" "$TD/pairs.jsonl"
	cmp "$TD/r/step-00000004/model.safetensors" "$TD/p/step-00000004/model.safetensors"
	# a resume that changes beta is refused, naming it
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/r" --resume "${args[@]}" --beta 0.5 "$TD/pairs.jsonl"
	[[ "$stderr" == *beta* ]]
	# one pair per micro-batch (gradient accumulation): the same weights
	rl-train -q -m "$TD/m0" --out "$TD/a" --max-tokens-per-micro 64 "${args[@]}" "$TD/pairs.jsonl"
	run -0 /usr/bin/python3 tests/fixtures/parallel/st_close.py "$TD/a/step-00000004/model.safetensors" \
	    "$TD/p/step-00000004/model.safetensors" 2e-5 1e-4
	# 2 ranks, 2 pairs each: fp32 reduction order only (seen 5e-6 after 4 AdamW
	# steps of lr 1e-2; the same bound as rl-train-dp.bats)
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/two" "${args[@]}"
	run -0 /usr/bin/python3 tests/fixtures/parallel/st_close.py "$TD/two/step-00000004/model.safetensors" \
	    "$TD/p/step-00000004/model.safetensors" 2e-5 1e-4
	run -1 /usr/bin/python3 tests/fixtures/parallel/st_close.py "$TD/two/step-00000003/model.safetensors" \
	    "$TD/p/step-00000004/model.safetensors" 2e-5 1e-4
}

@test "dpo: bad pairs are named by line; groups that are not pairs are refused" {
	printf '%s\n' '{"prompt":"a","chosen":" b","rejected":" c"}' '{"prompt":"a","chosen":" b"}' > "$TD/b1"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/o1" --algo dpo --batch 1 "$TD/b1"
	[[ "$stderr" == *"b1': line 2: no 'rejected'"* ]]
	printf '%s\n' '{"prompt":"a","chosen":" b","rejected":" c"}' '' '{"prompt":"a","chosen":" b","rejected":" b"}' > "$TD/b2"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/o2" --algo dpo --batch 1 "$TD/b2"
	[[ "$stderr" == *"b2': line 3: 'chosen' and 'rejected' are identical"* ]]
	printf '%s\n' '{"prompt":"a","chosen":"","rejected":" c"}' > "$TD/b3"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/o3" --algo dpo --batch 1 "$TD/b3"
	[[ "$stderr" == *"b3': line 1: 'chosen' is empty"* ]]
	jq -c '.reward = 1' "$TD/recs.jsonl" > "$TD/b4"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/o4" --algo dpo --batch 1 "$TD/b4"
	[[ "$stderr" == *"group 0: both samples have reward 1"* ]]
	jq -c '.group_size = 1 | .group = .id | .index = 0' "$TD/recs.jsonl" > "$TD/b5"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/o5" --algo dpo --batch 1 "$TD/b5"
	[[ "$stderr" == *"has 1 samples: --algo dpo trains pairs"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/o6" --algo dpo --kl k1 "$TD/b1"
	[[ "$stderr" == *"--kl with --algo dpo"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/o7" --beta 0.2 "$TD/b1"
	[[ "$stderr" == *"--beta is an option of --algo dpo"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/o8" --algo dpo --dpo-loss ipo --label-smoothing 0.1 "$TD/b1"
	[[ "$stderr" == *"--label-smoothing with --dpo-loss ipo"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/o9" --algo dpo --dpo-loss kto "$TD/b1"
	[[ "$stderr" == *"unknown loss 'kto'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/o10" --algo rm --micro-tokens 64 "$TD/b1"
	[[ "$stderr" == *"--micro-tokens (packed rows) is not available with --algo rm"* ]]
}

@test "dpo --online: each scored group gives its best and worst as the pair; equal rewards give none" {
	# groups of 4 from the pairs of recs.jsonl: the pair's chosen side with the
	# highest reward, its rejected side with the lowest, and in between copies
	# of each with the sides' roles reversed, so that any other choice than
	# OpenRLHF's best and worst of n trains other pairs; first a group whose
	# rewards are all equal
	jq -sc 'group_by(.group)[] | max_by(.reward) as $c | min_by(.reward) as $r |
	    [$c + {index: 2, reward: 5}, $r + {id: ($r.id + 100000), index: 0, reward: 4},
	     $r + {index: 1, reward: -2}, $c + {id: ($c.id + 100000), index: 3, reward: -1}]
	    | map(.group_size = 4)[]' "$TD/recs.jsonl" > "$TD/on4.jsonl"
	head -n 3 "$TD/recs.jsonl" | jq -sc 'to_entries[] | .value + {group: 7777, group_size: 3,
	    id: (.value.id + 200000), index: .key, reward: 1}' > "$TD/tie.jsonl"
	cat "$TD/tie.jsonl" "$TD/on4.jsonl" > "$TD/on.jsonl"
	args=(--algo dpo --batch 2 --max-steps 2 --lr 1e-2)
	rl-train -q -m "$TD/m0" --out "$TD/off" "${args[@]}" "$TD/recs.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/on" --metrics "$TD/on.json" --online "${args[@]}" "$TD/on.jsonl"
	# the same pairs in the same order: bitwise the same weights
	cmp "$TD/on/step-00000002/model.safetensors" "$TD/off/step-00000002/model.safetensors"
	run -0 jq -s '.[0]["train/groups_dropped_no_signal"]' "$TD/on.json"
	[ "$output" = 1 ]
	grep -qx 'online: true' "$TD/on/run.yaml"
	# without --online a group of 4 is refused, pointing at --online
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/on2" "${args[@]}" "$TD/on4.jsonl"
	[[ "$stderr" == *"has 4 samples: --algo dpo trains pairs"* && "$stderr" == *--online* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/on3" --online "$TD/on4.jsonl"
	[[ "$stderr" == *"--online is an option of --algo dpo and rm"* ]]
}

@test "rm: the Bradley-Terry loss on the last token's score, metrics and gradient match PyTorch; --resume; a causal LM starts one" {
	M=m0rm run_case "$TD/recs.jsonl" "--algo rm"
	M=m0rm check
	args=(--algo rm --batch 4 --lr 1e-2)
	rl-train -q -m "$TD/m0rm" --out "$TD/rm" --metrics "$TD/rm.json" "${args[@]}" "$TD/pairs.jsonl"
	# transformers' LlamaForSequenceClassification: score.weight in model.safetensors
	[ ! -e "$TD/rm/step-00000004/value_head.safetensors" ]
	run -0 jq -c '[.architectures, .id2label, .label2id]' "$TD/rm/step-00000004/config.json"
	[ "$output" = '[["Qwen2ForSequenceClassification"],{"0":"LABEL_0"},{"LABEL_0":0}]' ]
	run -0 jq -s '.[3]["actor/rm_loss"] < .[0]["actor/rm_loss"]' "$TD/rm.json"
	[ "$output" = true ]
	rl-train -q -m "$TD/m0rm" --out "$TD/rr" --max-steps 2 "${args[@]}" "$TD/pairs.jsonl"
	rl-train -q -m "$TD/m0rm" --out "$TD/rr" --resume "${args[@]}" "$TD/pairs.jsonl"
	cmp "$TD/rr/step-00000004/model.safetensors" "$TD/rm/step-00000004/model.safetensors"
	# from a causal LM (no score head): a new head, trained
	rl-train -q -m "$TD/m0" --out "$TD/rn" --max-steps 1 "${args[@]}" "$TD/pairs.jsonl"
	jq -e '.weight_map["score.weight"]' "$TD/rn/step-00000001/model.safetensors.index.json"
	# a reward model is no policy
	run -1 --separate-stderr rl-train -q -m "$TD/rn/step-00000001" --out "$TD/rp" --algo grpo "$TD/recs.jsonl"
	[[ "$stderr" == *"is a reward model"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/rk" --algo rm --ref "$TD/m1" "$TD/pairs.jsonl"
	[[ "$stderr" == *"--algo rm: a reward model has no reference policy"* ]]
}

#!/usr/bin/env bats
# pipelines/online-dpo: online DPO in the pipe wiring (pipe.sh) and the queue
# wiring (the Makefile, through pipelines/lib/grpo-queue.sh), with a tiny
# random model, arith prompts and a reward program whose scores vary, so
# that groups give pairs: each run trains its steps, writes DPO's metrics and
# checkpoints, and leaves nothing running.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":264,"hidden_size":32,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":32}
JSON
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	rl-reward gen-arith --n 60 --seed 1 --split train > "$TD/train.jsonl"
	# a score from the response's bytes: varied, so few groups tie
	cat > "$TD/r.py" <<'PY'
import json, sys
for line in sys.stdin:
    t = json.loads(line).get("response_text", "")
    print(sum(t.encode()) % 97 / 97.0, flush=True)
PY
}

check_run() {
	local m=$1 steps=$2
	[ "$(wc -l < "$m")" -eq "$steps" ]
	run -0 jq -s -r '[.[] | has("actor/dpo_loss") and has("rewards/accuracies") and has("train/groups_dropped_no_signal")] | all' "$m"
	[ "$output" = true ]
	# the first step's loss is log 2 (policy = reference), as DPO starts
	run -0 jq -s '(.[0]["actor/dpo_loss"] - (2 | log)) | fabs < 1e-6' "$m"
	[ "$output" = true ]
}

@test "online-dpo pipe.sh: rl-rollout -n 3 | rl-reward --exec | rl-train --algo dpo --online" {
	run -0 env MODEL="$TD/m0" PROMPTS="$TD/train.jsonl" OUT="$TD/pipe" REWARD="--exec 'python3 -u $TD/r.py'" \
	    STEPS=3 BATCH=2 SAMPLES=3 MAX_TOKENS=8 CHAT=0 LR=1e-3 timeout -k 20 120 sh pipelines/online-dpo/pipe.sh
	[[ "$output" == *"3 steps"* ]]
	check_run "$TD/pipe/metrics.jsonl" 3
	[ -d "$TD/pipe/ckpt/step-00000003" ]
	[ -z "$(ps -eo args= | grep -F -- "$TD/pipe" | grep -v grep || true)" ]
}

@test "online-dpo Makefile: the queue wiring trains, resumes and leaves nothing running" {
	timeout -k 20 120 make --no-print-directory -C pipelines/online-dpo MODEL="$TD/m0" DATA="$TD/train.jsonl" \
	    OUT="$TD/q" REWARD="--exec 'python3 -u $TD/r.py'" DEVICE=cpu STEPS=3 BATCH=2 SAMPLES=3 MAX_TOKENS=8 \
	    CHAT=0 SAVE_EVERY=1 LR=1e-3
	check_run "$TD/q/metrics.jsonl" 3
	grep -qx 'online: true' "$TD/q/ckpt/run.yaml"
	grep -qx 'algo: dpo' "$TD/q/ckpt/run.yaml"
	# finished: a second start does nothing
	run -0 timeout -k 20 60 make --no-print-directory -C pipelines/online-dpo MODEL="$TD/m0" DATA="$TD/train.jsonl" \
	    OUT="$TD/q" REWARD="--exec 'python3 -u $TD/r.py'" DEVICE=cpu STEPS=3 BATCH=2 SAMPLES=3 MAX_TOKENS=8 CHAT=0
	[ "$(wc -l < "$TD/q/metrics.jsonl")" -eq 3 ]
	[ -z "$(ps -eo args= | grep -F -- "$(cat "$TD/q/queue.url")" | grep -v grep || true)" ]
}

@test "rlhf Makefile: PPO against a reward model in the queue wiring (rl-reward --model)" {
	jq '.architectures = ["Qwen2ForSequenceClassification"] | .num_labels = 1' "$TD/cfg.json" > "$TD/rm.json"
	rl-train -q --init "$TD/rm.json" --tokenizer bytes --out "$TD/rm" --seed 2
	run -2 --separate-stderr make --no-print-directory -C pipelines/rlhf MODEL="$TD/m0" DATA="$TD/train.jsonl" OUT="$TD/h0"
	[[ "$stderr" == *"set RM to a reward model directory"* ]]
	timeout -k 20 120 make --no-print-directory -C pipelines/rlhf MODEL="$TD/m0" RM="$TD/rm" DATA="$TD/train.jsonl" \
	    OUT="$TD/h" DEVICE=cpu STEPS=2 BATCH=2 SAMPLES=2 MAX_TOKENS=6 CHAT=0 SAVE_EVERY=1 LR=1e-3
	[ "$(wc -l < "$TD/h/metrics.jsonl")" -eq 2 ]
	run -0 jq -s -r 'all(.[]; has("critic/vf_loss") and has("critic/score/mean"))' "$TD/h/metrics.jsonl"
	[ "$output" = true ]
	grep -qx 'algo: ppo' "$TD/h/ckpt/run.yaml"
	grep -q 'mean per component: model ' "$TD"/h/logs/*/reward.log
	[ -z "$(ps -eo args= | grep -F -- "$(cat "$TD/h/queue.url")" | grep -v grep || true)" ]
}

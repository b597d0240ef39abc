#!/usr/bin/env bats
# rl-train --eval-prompts: greedy validation on a step's checkpoint, logged as
# verl's val-core/{data_source}/reward/mean@1 (docs/train.md, "Validation").

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/scored.jsonl"
	# two data sources; some answers are what the tiny model answers greedily
	# ("========"), others are not, so the means are neither 0 nor 1
	{
		for a in 2 ======== 6 ======== 10 12; do
			printf '{"prompt":"%s+1=","answer":"%s","data_source":"toy"}\n' "$a" "$a"
		done
		printf '{"prompt":"x=","answer":"========"}\n'
		printf '{"prompt":"y=","answer":"7"}\n'
	} > "$TD/ev.jsonl"
}

# independent path: rl-rollout --temperature 0 on the checkpoint, rl-reward,
# and the mean reward and response length per data source in jq
reference() {
	rl-rollout -q -m "$1" -n 1 --temperature 0 --max-tokens 8 --device cpu --jsonl "$TD/ev.jsonl" |
	    rl-reward -q --task exact --jsonl |
	    jq -s -c 'group_by(.meta.data_source // "unknown") | map({key: (.[0].meta.data_source // "unknown"),
	        value: {r: (map(.reward) | add / length), l: (map(.response | length) | add / length)}}) | from_entries'
}

@test "val-core metrics at steps N, 2N and --max-steps equal rl-rollout --temperature 0 scored by rl-reward" {
	run -0 rl-train -q -m "$TD/m0" --out "$TD/ck" --batch 2 --max-steps 3 --device cpu --metrics "$TD/met.jsonl" \
	    --prom-file "$TD/prom.txt" --tfevents "$TD/tb" \
	    --eval-prompts "$TD/ev.jsonl" --eval-task exact --eval-every 2 --eval-max-tokens 8 "$TD/scored.jsonl"
	[ "$(jq -s length "$TD/met.jsonl")" = 3 ]
	# step 1: no validation
	[ "$(jq -c 'select(.step == 1) | [keys[] | select(startswith("val-"))]' "$TD/met.jsonl")" = "[]" ]
	for s in 2 3; do
		ref=$(reference "$TD/ck/step-0000000$s")
		got=$(jq -c --argjson s "$s" 'select(.step == $s) | {toy: {r: .["val-core/toy/reward/mean@1"],
		    l: .["val-aux/toy/response_length/mean@1"]}, unknown: {r: .["val-core/unknown/reward/mean@1"],
		    l: .["val-aux/unknown/response_length/mean@1"]}}' "$TD/met.jsonl")
		echo "step $s: got $got, reference $ref"
		[ "$(jq -n --argjson a "$got" --argjson b "$ref" '[$a.toy.r, $a.toy.l, $a.unknown.r, $a.unknown.l] ==
		    [$b.toy.r, $b.toy.l, $b.unknown.r, $b.unknown.l]')" = true ]
		# a real score: neither all right nor all wrong
		[ "$(jq -n --argjson b "$ref" '$b.toy.r > 0 and $b.toy.r < 1')" = true ]
	done
	# the last step's values in the Prometheus file too
	grep -q '^rltrain_val_core_toy_reward_mean_1 ' "$TD/prom.txt"
	ls "$TD/tb"/events.out.tfevents.* >/dev/null
}

@test "a bad eval line is named by file and line; a missing or unknown task is refused" {
	printf '{"prompt":"a","answer":"1"}\n\n{"answer":"2"}\n' > "$TD/bad1.jsonl"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/b1" --device cpu --eval-prompts "$TD/bad1.jsonl" \
	    --eval-task exact "$TD/scored.jsonl"
	[[ "$stderr" == *"--eval-prompts $TD/bad1.jsonl:3: no \"prompt\""* ]]
	printf '{"prompt":"a","answer":"1"}\n{"prompt": oops\n' > "$TD/bad2.jsonl"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/b2" --device cpu --eval-prompts "$TD/bad2.jsonl" \
	    --eval-task exact "$TD/scored.jsonl"
	[[ "$stderr" == *"--eval-prompts $TD/bad2.jsonl:2: not a JSON object"* ]]
	run -2 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/b3" --device cpu --eval-prompts "$TD/ev.jsonl" \
	    "$TD/scored.jsonl"
	[[ "$stderr" == *"--eval-prompts needs --eval-task"* ]]
	run -2 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/b4" --device cpu --eval-prompts "$TD/ev.jsonl" \
	    --eval-task nosuch "$TD/scored.jsonl"
	[ -n "$stderr" ]
	run -2 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/b5" --device cpu --eval-task exact "$TD/scored.jsonl"
	[[ "$stderr" == *"--eval-task needs --eval-prompts"* ]]
	# nothing was trained
	[ ! -e "$TD/b1/latest" ] && [ ! -e "$TD/b3" ]
}

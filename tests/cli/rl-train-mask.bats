#!/usr/bin/env bats
# rl-train on multi-turn records: a loss_mask with 0 on the tokens an
# environment inserted into the response, and per-turn token_rewards.
# - The first step's metrics against verl_ref.py (float64 PyTorch, verl's
#   definitions with the mask as verl's response_mask: GAE over the sampled
#   tokens only, masked whitening, masked aggregation, masked metrics) for
#   every algorithm: golden numbers in verl_masked_expected.jsonl.
# - The whole gradient of the first step, element by element, against the
#   PyTorch restatement (needs python3-torch; skipped without it), for GRPO
#   and PPO (value head included).
# - Masked tokens contribute exactly zero: changing the behaviour and
#   reference log-probs at masked tokens leaves the checkpoint byte-identical.
# - A bad token_rewards field is named.
# Tolerances as tests/cli/rl-train-verl.bats.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

FX=tests/fixtures/train
REC=$FX/verl_masked_records.jsonl

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	cp -r "$TD/m0" "$TD/m0-ppo"
	cp "$FX/verl_value_head.safetensors" "$TD/m0-ppo/value_head.safetensors"
}

model_for() {
	if [[ "$1" == *"--algo ppo"* ]]; then echo "$TD/m0-ppo"; else echo "$TD/m0"; fi
}

@test "every algorithm's first step on multi-turn records matches verl's with the mask as its response_mask" {
	verl_cases "$FX/verl_masked_expected.jsonl" "$REC" ''
	[ "$VERL_CASES" -ge 16 ]
}

@test "the gradient of a GRPO and a PPO step on multi-turn records equals PyTorch's, element by element" {
	/usr/bin/python3 -c 'import torch' 2>/dev/null || skip "no PyTorch at /usr/bin/python3 (python3-torch)"
	local args
	for args in "--algo grpo --kl k3 --kl-coef 0.1 --ent-coef 0.01" "--algo ppo --lambda 0.95 --gamma 0.99 --vf-coef 0.5"; do
		# shellcheck disable=SC2086
		rl-train -q -m "$(model_for "$args")" --out "$TD/g" --batch 4 --max-steps 1 --lr 1 --adam-eps 1 \
		    --weight-decay 0 --grad-clip 1e9 $args "$REC"
		run /usr/bin/python3 "$FX/verl_ref.py" grad "$(model_for "$args")" "$REC" "$TD/g/step-00000001" "$args"
		echo "$output"
		[ "$status" -eq 0 ]
		rm -rf "$TD/g"
	done
}

@test "masked tokens contribute exactly zero: other log-probs there leave the checkpoint byte-identical" {
	python3 - "$REC" "$TD/alt.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        for k, a, b in (("logprobs", -3.0, 0.1), ("ref_logprobs", -1.0, 0.3)):
            r[k] = [v if m else a - b * t for t, (v, m) in enumerate(zip(r[k], r["loss_mask"]))]
        f.write(json.dumps(r) + "\n")
PY
	local args
	for args in "--algo grpo --kl k3 --kl-coef 0.1 --ent-coef 0.01 --old-from-behaviour --tis-cap 2" \
	    "--algo ppo --kl k1 --kl-coef 0.3 --kl-in-reward" "--algo reinforce++ --kl k2 --kl-in-reward --old-from-behaviour"; do
		# shellcheck disable=SC2086
		rl-train -q -m "$(model_for "$args")" --out "$TD/z1" --batch 4 --max-steps 1 --metrics "$TD/z1.json" $args "$REC"
		# shellcheck disable=SC2086
		rl-train -q -m "$(model_for "$args")" --out "$TD/z2" --batch 4 --max-steps 1 --metrics "$TD/z2.json" $args "$TD/alt.jsonl"
		cmp "$TD/z1/step-00000001/model.safetensors" "$TD/z2/step-00000001/model.safetensors"
		# the metrics too, but for the timings and memory
		python3 - "$TD/z1.json" "$TD/z2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
d = [k for k in a if not k.startswith(("timing_s/", "timing_per_token_ms/", "perf/", "memory/")) and a[k] != b.get(k)]
assert not d, d
PY
		rm -rf "$TD/z1" "$TD/z2"
	done
}

@test "a token_rewards field of the wrong length is a bad record, named" {
	head -n 1 "$REC" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["token_rewards"]=[0.5]; print(json.dumps(r))' > "$TD/bad.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/b" --batch 1 "$TD/bad.jsonl"
	[[ "$stderr" == *"'token_rewards' length differs from 'response' length"* ]] || { echo "$stderr"; return 1; }
}

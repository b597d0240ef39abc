#!/usr/bin/env bats
# rl-train --algo ppo: the value head (value_head.safetensors beside an HF-clean
# model.safetensors), GAE options, metrics, groups of one, resume, bad input.
# Learning to the toy optimum is in learning.bats; the arithmetic in
# test_algo (GAE, value loss) and test_value_head (gradients, checkpoints).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/scored.jsonl"
	python3 tests/fixtures/train/mkscored.py 16 1 2 > "$TD/single.jsonl"
}

# tensor names in a safetensors file's header
st_names() {
	python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k, v in sorted(h.items()):
    if k != "__metadata__":
        print(k, v["dtype"], v["shape"])' "$1"
}

@test "ppo trains: per-step critic metrics, value_head.safetensors beside an HF-clean model.safetensors" {
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck" --algo ppo --batch 2 --lr 1e-3 --metrics - "$TD/scored.jsonl"
	[ "${#lines[@]}" -eq 4 ]
	for k in actor/pg_loss actor/pg_clipfrac critic/vf_loss critic/vf_clipfrac critic/vpred_mean \
	    critic/vf_explained_var critic/values/mean critic/values/max critic/values/min \
	    critic/returns/mean critic/returns/max critic/returns/min critic/advantages/mean critic/score/mean; do
		grep -q "\"$k\":" <<< "$output" || { echo "missing $k"; return 1; }
	done
	d="$TD/ck/step-00000004"
	run -0 st_names "$d/value_head.safetensors"
	assert_output "value_head.bias F32 [1]
value_head.weight F32 [1, 32]"
	run -0 st_names "$d/model.safetensors"
	refute_output --partial value_head
	run -0 st_names "$d/optimizer.safetensors"
	assert_output --partial "value_head.weight.exp_avg F32 [1, 32]"
	# the checkpoint loads as a plain policy: no warning about unknown tensors
	run -0 --separate-stderr rl-rollout -q -m "$d" -n 1 --max-tokens 2 --seed 1 <<< '{"prompt":"ab"}'
	[ -z "$stderr" ]
	# the head was trained (it changed between steps)
	! cmp -s "$TD/ck/step-00000002/value_head.safetensors" "$d/value_head.safetensors" || false
}

@test "ppo with groups of one sample (n=1, as verl's PPO samples)" {
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/single" --algo ppo --batch 8 --lr 1e-3 --metrics - "$TD/single.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	# advantages are not all zero (GRPO's group baseline would make them so)
	[[ "${lines[0]}" != *'"critic/advantages/max":0,'* ]]
	[[ "${lines[0]}" == *'"train/sequences":8,'* ]]
}

@test "ppo: GAE, value-loss and KL-in-reward options run; bad values are usage errors" {
	# reference log-probs in the records, for the KL penalty in the token rewards
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); r["ref_logprobs"] = [-5.0] * len(r["response"]); print(json.dumps(r))' \
	    "$TD/scored.jsonl" > "$TD/ref.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/opts" --algo ppo --batch 4 --lr 1e-3 --gamma 0.9 \
	    --lambda 0.95 --vf-coef 0.5 --value-clip 0.01 --critic-lr 1e-1 --no-whiten-adv --ppo-epochs 2 \
	    --mini-batches 2 --kl k1 --kl-in-reward --kl-coef 0.05 --metrics - "$TD/ref.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	# later mini-batches and the second epoch see moved values: with a tight clip some are clipped
	[[ "${lines[0]}" != *'"critic/vf_clipfrac":0,'* ]]
	# without whitening and with the KL penalty (behaviour -5.5 vs reference -5: k1 = -0.5 per
	# token, +0.025 reward each) returns exceed the 0/1 scores
	python3 -c '
import json, sys
j = json.loads(sys.argv[1])
assert j["critic/returns/max"] > 1.0, j["critic/returns/max"]' "${lines[0]}"
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --algo ppo --lambda 2 "$TD/scored.jsonl"
	[[ "$stderr" == *"bad value '2'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --algo ppo --vf-coef -1 "$TD/scored.jsonl"
}

@test "ppo resume: 2 steps + --resume + 2 steps is bitwise identical to 4 steps (value head included)" {
	rl-train -q -m "$TD/m0" --out "$TD/a" --algo ppo --batch 2 --lr 1e-3 --max-steps 4 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/b" --algo ppo --batch 2 --lr 1e-3 --max-steps 2 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q --out "$TD/b" --algo ppo --batch 2 --lr 1e-3 --max-steps 4 --resume --metrics /dev/null "$TD/scored.jsonl"
	for f in model optimizer value_head; do
		cmp "$TD/a/step-00000004/$f.safetensors" "$TD/b/step-00000004/$f.safetensors"
	done
	! cmp -s "$TD/a/step-00000002/value_head.safetensors" "$TD/a/step-00000004/value_head.safetensors" || false
	# a grpo run cannot be resumed as ppo (no value head state): said with a hint
	rl-train -q -m "$TD/m0" --out "$TD/g" --batch 2 --lr 1e-3 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	run -1 --separate-stderr rl-train --out "$TD/g" --algo ppo --batch 2 --lr 1e-3 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"--algo: grpo in the run"*"ppo now"*"hint:"*"--allow-change"* ]]
	# and with --allow-change, the checkpoint itself has no value head state
	run -1 --separate-stderr rl-train --out "$TD/g" --algo ppo --batch 2 --lr 1e-3 --resume --allow-change \
	    --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"trained with --algo grpo"*"hint:"* ]]
}

@test "ppo from a model directory with a value head of the wrong shape is an error naming it" {
	cp -r "$TD/m0" "$TD/badvh"
	python3 -c '
import json, struct, sys
h = {"value_head.weight": {"dtype": "F32", "shape": [1, 16], "data_offsets": [0, 64]},
     "value_head.bias": {"dtype": "F32", "shape": [1], "data_offsets": [64, 68]}}
j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(j)) + j + bytes(68))' "$TD/badvh/value_head.safetensors"
	run -1 --separate-stderr rl-train -m "$TD/badvh" --out "$TD/badvh-ck" --algo ppo --batch 2 "$TD/scored.jsonl"
	[[ "$stderr" == *"value_head.safetensors"*"'value_head.weight' has shape [1, 16]"*"[1, 32]"* ]]
	[ ! -e "$TD/badvh-ck/latest" ]
	# other algorithms do not read it
	run -0 --separate-stderr rl-train -m "$TD/badvh" --out "$TD/badvh-grpo" --batch 4 --metrics /dev/null "$TD/scored.jsonl"
	# a truncated file is an error too
	head -c 40 "$TD/m0/model.safetensors" > "$TD/badvh/value_head.safetensors"
	run -1 --separate-stderr rl-train -m "$TD/badvh" --out "$TD/badvh-ck2" --algo ppo --batch 2 "$TD/scored.jsonl"
	[[ "$stderr" == *"value_head.safetensors"* ]]
}

@test "ppo initialised from a ppo checkpoint continues with its trained value head" {
	rl-train -q -m "$TD/m0" --out "$TD/c1" --algo ppo --batch 2 --lr 1e-3 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	run -0 --separate-stderr rl-train -v -m "$TD/c1/latest" --out "$TD/c2" --algo ppo --batch 2 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"value head loaded from"* ]]
	run -0 --separate-stderr rl-train -v -m "$TD/m0" --out "$TD/c3" --algo ppo --batch 2 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"value head initialised"* ]]
}

@test "ppo data parallel: 2 ranks train the weights and value head of 1 rank" {
	export RL_COMM_TIMEOUT=60
	port=$(free_port)
	args=(--algo ppo --batch 4 --lr 1e-2 --mini-batches 2 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/dp1" --metrics "$TD/dp1.m" "${args[@]}" "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/dp2" --rank 1 --world 2 --rendezvous "127.0.0.1:$port" \
	    --metrics /dev/null "${args[@]}" "$TD/scored.jsonl" 3>&- &
	pid=$!
	rl-train -q -m "$TD/m0" --out "$TD/dp2" --rank 0 --world 2 --rendezvous "127.0.0.1:$port" \
	    --metrics "$TD/dp2.m" "${args[@]}" "$TD/scored.jsonl" || { kill $pid; return 1; }
	wait $pid
	# fp32 reduction order only (as rl-train-dp.bats)
	for f in model value_head; do
		python3 tests/fixtures/parallel/st_close.py "$TD/dp2/latest/$f.safetensors" "$TD/dp1/latest/$f.safetensors" 2e-5 1e-4
	done
	python3 - "$TD/dp1.m" "$TD/dp2.m" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2
for x, y in zip(a, b):
    for k in ("critic/vf_loss", "critic/vpred_mean", "critic/values/mean", "critic/returns/mean", "actor/pg_loss"):
        assert abs(x[k] - y[k]) <= 1e-5 + 1e-4 * abs(x[k]), (k, x[k], y[k])
PY
}

#!/usr/bin/env bats
# rl-train --micro-tokens: packed micro-batches against the padded layout
# (--max-tokens-per-micro) on records with a long tail of lengths: the same
# metrics (loss, gradient norm, value loss) and the same weights after the run
# for GRPO, PPO (value head), SFT and GSPO, and 2 data-parallel ranks packing
# their shares against 1 rank padded; perf/pad_frac; a record longer than the
# budget refused or dropped (--on-bad); the option in the run file and the plan.
# The per-parameter gradients are compared in tests/unit/test_pack.c.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# 6 groups of 4: prompts of 3..6 tokens, responses of 2..8, one in eight of 40
	python3 - "$TD/tail.jsonl" <<'PY'
import json, random, sys
random.seed(3)
rid = 0
with open(sys.argv[1], "w") as f:
    for g in range(6):
        prompt = [random.randrange(256) for _ in range(random.randint(3, 6))]
        for i in range(4):
            n = 40 if rid % 8 == 5 else random.randint(2, 8)
            resp = [random.randrange(256) for _ in range(n)]
            rid += 1
            f.write(json.dumps({"id": rid, "group": g, "index": i, "group_size": 4, "prompt": prompt,
                                "response": resp, "logprobs": [-5.5] * n, "reward": float(resp[0] % 2),
                                "version": [0, 0], "finish": "eos", "temperature": 1.0}) + "\n")
PY
}

# The runs below take --adam-eps 1e-4: with AdamW's default 1e-8 a gradient
# element that is rounding noise (~1e-9, exactly 0 in exact arithmetic) moves its
# weight by a sizeable part of lr, differently in each layout (measured 4e-5 at
# lr 1e-2 for seq-mean-token-mean); 1e-4 keeps the noise out of the weights and
# the real gradients (1e-4 and up) in.

# same_run A B: metrics lines of A and B agree on the loss terms and gradient norm
# (relative 1e-4), and their last checkpoints' tensors within 1e-5 + 1e-3 relative
same_run() {
	python3 - "$1" "$2" <<'PY'
import array, json, os, struct, sys
a, b = sys.argv[1], sys.argv[2]
keys = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss", "actor/sft_loss", "actor/kl_loss",
        "actor/ppo_kl", "actor/pg_clipfrac"]
la = [json.loads(l) for l in open(a + ".metrics")]
lb = [json.loads(l) for l in open(b + ".metrics")]
assert len(la) == len(lb) and la, (len(la), len(lb))
for x, y in zip(la, lb):
    for k in keys:
        if k in x:
            assert abs(x[k] - y[k]) <= 1e-6 + 1e-4 * abs(x[k]), (k, x[k], y[k])
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        assert v["dtype"] == "F32", (path, k, v["dtype"])
        out[k] = array.array("f", raw[8 + n + s:8 + n + e])
    return out
for f in ["model.safetensors", "value_head.safetensors"]:
    pa, pb = os.path.join(a, "latest", f), os.path.join(b, "latest", f)
    if not os.path.exists(pa):
        continue
    ta, tb = load(pa), load(pb)
    assert ta.keys() == tb.keys()
    t0 = load(os.path.join(os.environ["TD"], "m0", f)) if f == "model.safetensors" else None
    moved = 0
    for k in ta:
        for i, (x, y) in enumerate(zip(ta[k], tb[k])):
            assert abs(x - y) <= 1e-5 + 1e-3 * abs(x), (f, k, i, x, y)
        if t0 is not None:
            moved += sum(x != y for x, y in zip(ta[k], t0[k]))
    assert t0 is None or moved > 1000, moved
print("same")
PY
}

@test "packed equals padded: grpo, token-mean over the mini-batch, 2 mini-batches x 2 epochs" {
	for m in pad pack; do
		opt="--max-tokens-per-micro 200"; [ $m = pack ] && opt="--micro-tokens 60"
		run -0 rl-train -q -m "$TD/m0" --out "$TD/grpo-$m" --algo grpo --batch 3 --lr 1e-2 --adam-eps 1e-4 --mini-batches 2 \
		    --ppo-epochs 2 $opt --metrics "$TD/grpo-$m.metrics" "$TD/tail.jsonl"
	done
	run -0 same_run "$TD/grpo-pad" "$TD/grpo-pack"
	assert_output same
	grep -q '^micro-tokens: 60$' "$TD/grpo-pack/run.yaml"
	# perf/pad_frac: the padded layout's share of padding positions; none packed
	python3 - "$TD/grpo-pad.metrics" "$TD/grpo-pack.metrics" <<'PY'
import json, sys
pad = [json.loads(l)["perf/pad_frac"] for l in open(sys.argv[1])]
pack = [json.loads(l)["perf/pad_frac"] for l in open(sys.argv[2])]
assert all(0 < x < 1 for x in pad) and max(pad) > 0.3 and all(x == 0 for x in pack), (pad, pack)
PY
}

@test "packed equals padded: ppo with its value head, and sft" {
	for a in ppo sft; do
		for m in pad pack; do
			opt="--max-tokens-per-micro 200"; [ $m = pack ] && opt="--micro-tokens 50"
			run -0 rl-train -q -m "$TD/m0" --out "$TD/$a-$m" --algo $a --batch 3 --lr 1e-2 --adam-eps 1e-4 $opt \
			    --metrics "$TD/$a-$m.metrics" "$TD/tail.jsonl"
		done
		run -0 same_run "$TD/$a-pad" "$TD/$a-pack"
		assert_output same
	done
}

@test "packed equals padded: gspo over 2 epochs, a reference model's KL loss, --recompute, entropy bonus" {
	for m in pad pack; do
		opt="--max-tokens-per-micro 200"; [ $m = pack ] && opt="--micro-tokens 64"
		run -0 rl-train -q -m "$TD/m0" --out "$TD/gspo-$m" --algo gspo --batch 3 --lr 1e-2 --adam-eps 1e-4 --ppo-epochs 2 \
		    --ref "$TD/m0" --kl k3 --kl-coef 0.1 --ent-coef 0.01 --recompute $opt \
		    --metrics "$TD/gspo-$m.metrics" "$TD/tail.jsonl"
	done
	run -0 same_run "$TD/gspo-pad" "$TD/gspo-pack"
	assert_output same
	python3 -c 'import json, sys; assert json.loads(open(sys.argv[1]).readline())["actor/kl_loss"] != 0' \
	    "$TD/gspo-pack.metrics"
}

@test "--micro-tokens: a record longer than the budget is refused, or dropped with --on-bad skip" {
	# the long responses (40 tokens after a prompt of 3..6) need 43..46 positions
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/long" --algo grpo --batch 3 --micro-tokens 20 \
	    "$TD/tail.jsonl"
	[[ "$stderr" == *"record 6"*"exceed"*"--micro-tokens"* ]]
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/skip" --algo grpo --batch 1 --micro-tokens 20 \
	    --on-bad skip --metrics - "$TD/tail.jsonl"
	[[ "$stderr" == *"record 6"* ]]
	[ "${#lines[@]}" -ge 1 ]
	run -2 rl-train -m "$TD/m0" --out "$TD/zero" --micro-tokens 0 "$TD/tail.jsonl"
	run -2 rl-train -m "$TD/m0" --out "$TD/word" --micro-tokens many "$TD/tail.jsonl"
}

@test "--plan sizes the activations for --micro-tokens" {
	run -0 rl-train -m "$TD/m0" --plan=json --micro-tokens 4096 --out "$TD/plan"
	[[ "$output" == *'"max_tokens":4096,'* ]]
}

@test "2 ranks packing their shares give the weights of 1 rank padded" {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	PORT=$(free_port)
	args=(--algo grpo --batch 2 --lr 1e-2 --adam-eps 1e-4 --loss-agg token-mean --mini-batches 2)
	rl-train -q -m "$TD/m0" --out "$TD/dp-one" --max-tokens-per-micro 200 "${args[@]}" "$TD/tail.jsonl"
	TRAIN_WORLD_DATA="$TD/tail.jsonl" train_world 2 "$TD/dp-two" --micro-tokens 50 "${args[@]}"
	[ "$(readlink "$TD/dp-two/latest")" = step-00000003 ]
	run -0 python3 tests/fixtures/parallel/st_close.py "$TD/dp-two/latest/model.safetensors" \
	    "$TD/dp-one/latest/model.safetensors" 2e-5 1e-4
	# not blind: a step fewer is far off
	run -1 python3 tests/fixtures/parallel/st_close.py "$TD/dp-two/step-00000002/model.safetensors" \
	    "$TD/dp-one/latest/model.safetensors" 2e-5 1e-4
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

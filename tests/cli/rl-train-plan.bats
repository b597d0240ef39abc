#!/usr/bin/env bats
# rl-train --plan: the memory a run takes per rank, before it runs.  For what
# runs today (ZeRO 0 and 1, no LoRA) the plan must equal what rl-train then
# allocates on the CPU, read from its memory/... metrics (weights, gradients,
# AdamW state, activations); the parameter counts of Qwen2.5's published
# configs must equal Hugging Face's (the repositories' totals: 1,543,714,304
# for 1.5B, 7,615,616,512 for 7B, 14,770,033,664 for 14B, 32,763,876,352 for
# 32B; the model cards round them).  A reference model (--ref, DPO's initial
# policy) is planned from its own config and checked against the run's
# measured memory/ref_params_resident_mb and memory/ref_activations_mb.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# a reference of another shape with the policy's vocabulary: 8 layers, 2 MB
	deep_model "$TD/big"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/s.jsonl"
}

setup() {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	PORT=$(free_port)
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

# agree PLAN.json METRICS.jsonl [OPTIM_TOLERANCE]: the plan's bytes against the
# run's memory/..._mb of its first step
agree() {
	python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
m = json.loads(open(sys.argv[2]).readline())
tol = float(sys.argv[3])
MB = 1 << 20
for plan_key, metric, t in (("weights_bytes", "memory/weights_mb", 0), ("grads_bytes", "memory/grads_mb", 0),
                            ("acts_bytes", "memory/activations_mb", 0),
                            ("optim_bytes", "memory/optimizer_state_mb", tol)):
    got = m[metric] * MB
    assert abs(p[plan_key] - got) <= 1e-6 + t * got, (plan_key, p[plan_key], metric, got)
print("ok")
PY
}

# ref_agree PLAN.json METRICS.jsonl TOLERANCE: the plan's reference against
# each step's measured resident pages of its parameters (TOLERANCE relative;
# 0: the whole table, which takes its pages, one partial at each end: two
# pages over at most) and its activations (exact)
ref_agree() {
	python3 - "$1" "$2" "$3" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
tol = float(sys.argv[3])
MB, PAGE = 1 << 20, 4096
ms = [json.loads(l) for l in open(sys.argv[2])]
assert ms and p["ref_bytes"] == p["ref_weights_bytes"] + p["ref_acts_bytes"] > 0, p
for m in ms:
    got = m["memory/ref_params_resident_mb"] * MB
    if tol == 0:
        assert p["ref_weights_bytes"] <= got <= p["ref_weights_bytes"] + 2 * PAGE, (p["ref_weights_bytes"], got)
    else:
        assert abs(got - p["ref_weights_bytes"]) <= tol * p["ref_weights_bytes"], (p["ref_weights_bytes"], got)
    assert m["memory/ref_activations_mb"] * MB == p["ref_acts_bytes"], (p["ref_acts_bytes"], m)
    print("ref", m["step"], got / p["ref_weights_bytes"])
PY
}

@test "the plan is what rl-train allocates: GRPO, PPO with its value head and --recompute, micro-batch sizes" {
	for args in "--max-tokens-per-micro 256" "--max-tokens-per-micro 64 --recompute" \
	    "--algo ppo --max-tokens-per-micro 128" "--algo ppo --recompute --max-tokens-per-micro 8192"; do
		# shellcheck disable=SC2086
		rl-train --plan=json -m "$TD/m0" $args > "$TD/p.json"
		# shellcheck disable=SC2086
		rl-train -q -m "$TD/m0" --out "$TD/r" --batch 4 --max-steps 1 --metrics "$TD/r.m" $args "$TD/s.jsonl"
		run -0 agree "$TD/p.json" "$TD/r.m"
		rm -rf "$TD/r"
	done
	# the text form says the same in MiB for a model this small
	run -0 rl-train --plan -m "$TD/m0" --max-tokens-per-micro 256
	assert_output --partial "27168 parameters (27168 trained), 1 rank, ZeRO-0, cpu (f32), 256 tokens a micro-batch"
	assert_output --partial "  activations        1.61 MiB"
}

@test "ZeRO-1 on 2 ranks: the plan's AdamW share per rank is rank 0's; the reference whole on it" {
	rl-train --plan=json -m "$TD/m0" --world 2 --zero 1 --kl k3 --ref "$TD/big/m0" > "$TD/p.json"
	TRAIN_WORLD_DATA="$TD/s.jsonl" train_world 2 "$TD/z1" --batch 4 --max-steps 1 --zero 1 --kl k3 \
	    --ref "$TD/big/m0"
	# the shards are cut at whole tensors, so a rank's share is near half, not
	# exactly: within 10% on this 27k-parameter model
	run -0 agree "$TD/p.json" "$TD/z1.metrics.0" 0.1
	python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p["optim_bytes"] == 8 * 27168 / 2, p' "$TD/p.json"
	run -0 ref_agree "$TD/p.json" "$TD/z1.metrics.0" 0
}

@test "the reference model: --ref's own config and DPO's initial policy, as rl-train allocates them" {
	# GRPO with a KL term against the 8-layer model: the policy's parts as
	# without one, the reference's its own
	a=(--kl k3 --max-tokens-per-micro 256)
	rl-train --plan=json -m "$TD/m0" "${a[@]}" --ref "$TD/big/m0" > "$TD/pr.json"
	rl-train -q -m "$TD/m0" --out "$TD/rr" --batch 4 --max-steps 2 --metrics "$TD/rr.m" "${a[@]}" \
	    --ref "$TD/big/m0" "$TD/s.jsonl"
	run -0 agree "$TD/pr.json" "$TD/rr.m"
	run -0 ref_agree "$TD/pr.json" "$TD/rr.m" 0
	! grep -q ref_units_gathered "$TD/rr.m"
	[ "$(jq -r .ref "$TD/pr.json")" = "$TD/big/m0" ]
	# without --ref (the records' ref_logprobs) the plan is the same less
	# the reference: every other figure equal, the total less exactly it
	rl-train --plan=json -m "$TD/m0" "${a[@]}" > "$TD/p0.json"
	python3 - "$TD/pr.json" "$TD/p0.json" <<'PY'
import json, sys
r, p = (json.load(open(f)) for f in sys.argv[1:])
assert p["ref"] is None and p["ref_bytes"] == p["ref_weights_bytes"] == p["ref_acts_bytes"] == 0, p
for k in p:
    if not k.startswith("ref") and k != "total_bytes":
        assert p[k] == r[k], k
assert r["total_bytes"] - p["total_bytes"] == r["ref_bytes"], (r, p)
PY
	rl-train --plan -m "$TD/m0" "${a[@]}" --ref "$TD/big/m0" > "$TD/pr.txt"
	rl-train --plan -m "$TD/m0" "${a[@]}" > "$TD/p0.txt"
	run diff "$TD/p0.txt" "$TD/pr.txt"
	[ "$(grep -c '^[<>]' <<< "$output")" = 3 ]
	assert_line "> $(printf '  %-12s %10s MiB' reference 5.23) ($TD/big/m0: weights 1.95, activations 3.28)"
	assert_line "< $(printf '  %-12s %10s MiB per rank' total 2.02)"
	assert_line "> $(printf '  %-12s %10s MiB per rank' total 7.25)"
	# DPO: the initial policy (-m) unless --ref, opened for records without
	# ref_logprobs; planned as --ref with the policy's directory
	rl-train --plan=json -m "$TD/m0" --algo dpo > "$TD/pd.json"
	rl-train --plan=json -m "$TD/m0" --algo dpo --ref "$TD/m0" > "$TD/pdr.json"
	[ "$(jq -r .ref "$TD/pd.json")" = "the initial policy" ]
	[ "$(jq .ref_bytes "$TD/pd.json")" = "$(jq .ref_bytes "$TD/pdr.json")" ]
	[ "$(jq .ref_weights_bytes "$TD/pd.json")" = "$(jq .weights_bytes "$TD/pd.json")" ]
	# and what a DPO run on pair lines without ref_logprobs opens
	python3 - > "$TD/pairs.jsonl" <<'PY'
import json
w = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
for i in range(4):
    print(json.dumps({"prompt": w[i] + " " + w[i + 1] + ":", "chosen": " " + w[i + 2], "rejected": " " + w[i + 3]}))
PY
	rl-train --plan=json -m "$TD/m0" --algo dpo --max-tokens-per-micro 64 > "$TD/pd.json"
	rl-train -q -m "$TD/m0" --out "$TD/rd" --algo dpo --batch 2 --max-steps 2 --max-tokens-per-micro 64 \
	    --metrics "$TD/rd.m" "$TD/pairs.jsonl"
	run -0 ref_agree "$TD/pd.json" "$TD/rd.m" 0
	# on CUDA the reference's f32 table and its bf16 compute copy, as rl_model_open allocates
	mkdir -p "$TD/q7"
	cp tests/fixtures/plan/qwen2.5-7b.json "$TD/q7/config.json"
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --kl k1 --ref "$TD/q7"
	python3 -c 'import json,sys; p=json.loads(sys.argv[1]); assert p["ref_weights_bytes"] == p["weights_bytes"] == 6 * 7615616512, p' "$output"
}

@test "ZeRO-3 on 2 ranks: the reference's shard plus the two units of its forward, as measured" {
	a=(--kl k3 --max-tokens-per-micro 64 --batch 4 --max-steps 2)
	rl-train --plan=json -m "$TD/m0" --world 2 --zero 3 "${a[@]}" --ref "$TD/big/m0" > "$TD/p3.json"
	TRAIN_WORLD_DATA="$TD/s.jsonl" train_world 2 "$TD/z3" --zero 3 "${a[@]}" --ref "$TD/big/m0"
	# the plan counts the shard and two average layers; what is resident at
	# the peak is the shard, the unit computed and the one prefetched plus
	# the partial pages at the units' ends (2.5% over on this model): within
	# the 10% rl-train-zero3.bats allows the policy's ZeRO-3 weights
	run -0 ref_agree "$TD/p3.json" "$TD/z3.metrics.0" 0.1
	# a forward gathers each unit of the reference once (embedding, 8
	# layers, the tied head): a whole number of forwards each step
	python3 - "$TD/z3.metrics.0" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    n = json.loads(l)["dp/ref_units_gathered"]
    assert n > 0 and n % 10 == 0, n
PY
}

@test "Qwen2.5 1.5B to 32B: Hugging Face's parameter counts; what fits 80 GB" {
	for m in 1.5b:1543714304 7b:7615616512 14b:14770033664 32b:32763876352; do
		run -0 rl-train --plan=json --init "tests/fixtures/plan/qwen2.5-${m%%:*}.json" --device cuda
		[ "$(jq .params <<< "$output")" = "${m##*:}" ]
	done
	# 7B: full fine-tuning on one GPU does not fit 80 GB, ZeRO-3 on 8 does
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --recompute --gpu-mem 80G
	[ "$(jq .fits <<< "$output")" = false ]
	[ "$(jq .runs <<< "$output")" = true ]
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --recompute --gpu-mem 80G \
	    --world 8 --zero 3
	[ "$(jq .fits <<< "$output")" = true ]
	[ "$(jq .runs <<< "$output")" = false ]
	# on the CPU (f32 only) 16 bytes a parameter before activations, as the issue counts
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cpu
	python3 -c 'import json,sys; p=json.loads(sys.argv[1]); s=p["weights_bytes"]+p["grads_bytes"]+p["optim_bytes"]
assert abs(s / p["params"] - 16) < 0.01, s / p["params"]' "$output"
	# LoRA rank 16 on every projection: 40,370,176 adapter parameters for 7B (r (in + out) per matrix)
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --lora-rank 16
	[ "$(jq .trainable <<< "$output")" = 40370176 ]
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --lora-rank 16 \
	    --lora-targets q_proj,v_proj
	[ "$(jq .trainable <<< "$output")" = $((28 * 16 * (3584 + 3584 + 3584 + 512))) ]
	# LoRA with ZeRO-3 shards the base only: the adapters' gradients and AdamW
	# state whole on every rank (16 bytes each of the 40,370,176); runs on the CPU
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cuda --lora-rank 16 \
	    --world 8 --zero 3
	[ "$(jq .grads_bytes <<< "$output")" = $((4 * 40370176)) ]
	[ "$(jq .optim_bytes <<< "$output")" = $((8 * 40370176)) ]
	[ "$(jq .runs <<< "$output")" = false ]
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cpu --lora-rank 16 \
	    --world 8 --zero 3
	[ "$(jq .runs <<< "$output")" = true ]
	run -0 rl-train --plan=json --init tests/fixtures/plan/qwen2.5-7b.json --device cpu --lora-rank 16 \
	    --world 8 --zero 2
	[ "$(jq .runs <<< "$output")" = false ]
}

@test "plan-only options are refused for training; bad plan options are usage errors" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --gpu-mem 80G "$TD/s.jsonl"
	[[ "$stderr" == *"are for --plan"* ]]
	run -2 --separate-stderr rl-train --plan
	[[ "$stderr" == *"--plan needs a model"* ]]
	run -2 --separate-stderr rl-train --plan=yaml -m "$TD/m0"
	run -2 --separate-stderr rl-train --plan -m "$TD/m0" --lora-targets q,nope
	[[ "$stderr" == *"--lora-targets: bad value 'q,nope'"* ]]
	run -1 --separate-stderr rl-train --plan -m "$TD/none"
	[[ "$stderr" == *"$TD/none/config.json"* ]]
	# the reference as rl-train takes it: with --kl, not with --algo rm,
	# its config.json read, its vocabulary the policy's
	run -2 --separate-stderr rl-train --plan -m "$TD/m0" --ref "$TD/big/m0"
	[[ "$stderr" == *"--ref needs --kl"* ]]
	run -2 --separate-stderr rl-train --plan -m "$TD/m0" --algo rm --ref "$TD/big/m0"
	[[ "$stderr" == *"a reward model has no reference policy"* ]]
	run -1 --separate-stderr rl-train --plan -m "$TD/m0" --kl k3 --ref "$TD/none"
	[[ "$stderr" == *"$TD/none/config.json"* ]]
	mkdir -p "$TD/v"
	toy_model "$TD/v"
	for p in "--plan" "--out $TD/v/out $TD/s.jsonl"; do
		# shellcheck disable=SC2086
		run -1 --separate-stderr rl-train -q -m "$TD/m0" --kl k3 --ref "$TD/v/m0" $p
		[[ "$stderr" == *"--ref '$TD/v/m0': vocab_size 261 in its config.json, the policy's is 264 ('$TD/m0')"* ]]
	done
	[ ! -e "$TD/v/out/step-1" ]
}

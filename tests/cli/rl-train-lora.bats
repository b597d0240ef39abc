#!/usr/bin/env bats
# rl-train --lora-rank: adapters trained on the frozen policy (docs/lora.md),
# checkpoints in PEFT's layout, --resume, --merge-adapter, --zero 3 (the base sharded; with --sync
# and PPO too), and bad options.
# PEFT's layout as its get_peft_model_state_dict and LoraConfig write it:
# "base_model.model.<module path>.lora_A.weight" (r, in) and lora_B (out, r),
# adapter_config.json with peft_type LORA, r, lora_alpha, target_modules ...

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/s.jsonl"
}

# st_names FILE: "name dtype shape" lines of a safetensors file, sorted
st_names() {
	python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
for k in sorted(h):
    print(k, h[k]["dtype"], "x".join(map(str, h[k]["shape"])))
PY
}

@test "LoRA: GRPO steps write PEFT's adapter directory; only the adapters train" {
	rl-train -q -m "$TD/m0" --out "$TD/a" --batch 2 --lr 1e-2 --lora-rank 4 --lora-alpha 8 \
	    --lora-targets q_proj,v_proj,down_proj --max-steps 3 --metrics "$TD/a.m" "$TD/s.jsonl"
	d="$TD/a/step-00000003"
	[ -f "$d/adapter_config.json" ] && [ -f "$d/adapter_model.safetensors" ]
	[ -f "$d/optimizer.safetensors" ] && [ -f "$d/trainer_state.json" ]
	[ ! -e "$d/model.safetensors" ]   # the base is frozen: adapter_config.json names it
	c="$d/adapter_config.json"
	[ "$(jq -r .peft_type "$c")" = LORA ]
	[ "$(jq -r .task_type "$c")" = CAUSAL_LM ]
	[ "$(jq -r .bias "$c")" = none ]
	[ "$(jq .r "$c")" = 4 ] && [ "$(jq .lora_alpha "$c")" = 8 ] && [ "$(jq .lora_dropout "$c")" = 0 ]
	[ "$(jq .fan_in_fan_out "$c")" = false ] && [ "$(jq .use_rslora "$c")" = false ]
	[ "$(jq -c .target_modules "$c")" = '["q_proj","v_proj","down_proj"]' ]
	[ "$(jq -r .base_model_name_or_path "$c")" = "$TD/m0" ]
	# hidden 32, 4 heads x 8, 2 kv heads x 8, intermediate 64, 2 layers; f32
	run -0 st_names "$d/adapter_model.safetensors"
	want=""
	for l in 0 1; do
		want+="base_model.model.model.layers.$l.mlp.down_proj.lora_A.weight F32 4x64"$'\n'
		want+="base_model.model.model.layers.$l.mlp.down_proj.lora_B.weight F32 32x4"$'\n'
		want+="base_model.model.model.layers.$l.self_attn.q_proj.lora_A.weight F32 4x32"$'\n'
		want+="base_model.model.model.layers.$l.self_attn.q_proj.lora_B.weight F32 32x4"$'\n'
		want+="base_model.model.model.layers.$l.self_attn.v_proj.lora_A.weight F32 4x32"$'\n'
		want+="base_model.model.model.layers.$l.self_attn.v_proj.lora_B.weight F32 16x4"$'\n'
	done
	[ "$output" = "${want%$'\n'}" ]
	# the optimizer holds the adapters' moments only
	run -0 st_names "$d/optimizer.safetensors"
	[ "${#lines[@]}" = 24 ]
	[[ "$output" != *"model.layers.0.self_attn.q_proj.weight"* ]]
	# trained: B left zero, A left its init; the metrics name the trained parameters
	python3 - "$d/adapter_model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
for k, v in h.items():
    s, e = v["data_offsets"]
    x = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    assert max(abs(t) for t in x) > 0, k
PY
}

@test "LoRA: SFT and PPO train adapters (PPO's value head beside them); SFT's loss goes down" {
	python3 -c '
import json
for k in range(4):
    for i in range(8): print(json.dumps({"prompt": "%d+%d=" % (i, i), "completion": str(2 * i)}))' > "$TD/rows.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/sft" --algo sft --batch 8 --lr 5e-2 --lora-rank 8 \
	    --metrics - "$TD/rows.jsonl"
	first=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[0]}")
	last=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[3]}")
	echo "sft loss $first -> $last"
	awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'
	[ -f "$TD/sft/step-00000004/adapter_model.safetensors" ]
	rl-train -q -m "$TD/m0" --out "$TD/ppo" --algo ppo --batch 2 --lr 1e-2 --lora-rank 4 --max-steps 2 \
	    --metrics /dev/null "$TD/s.jsonl"
	run -0 st_names "$TD/ppo/step-00000002/value_head.safetensors"
	[ "$output" = $'value_head.bias F32 1\nvalue_head.weight F32 1x32' ]
	run -0 st_names "$TD/ppo/step-00000002/optimizer.safetensors"
	[[ "$output" == *"value_head.weight.exp_avg F32"* ]]
	[[ "$output" == *"lora_A.weight.exp_avg F32"* ]]
}

@test "LoRA: --merge-adapter writes base + scale B A; other tensors bit for bit" {
	[ -d "$TD/a/step-00000003" ] || skip "needs the first test's run"
	rl-train -q --merge-adapter "$TD/a/step-00000003" --out "$TD/merged"
	[ -f "$TD/merged/model.safetensors" ] && [ -f "$TD/merged/config.json" ]
	[ ! -e "$TD/merged/adapter_config.json" ]
	/usr/bin/python3 -c 'import torch' 2>/dev/null || skip "no PyTorch at /usr/bin/python3"
	/usr/bin/python3 - "$TD/m0" "$TD/a/step-00000003" "$TD/merged" <<'PY'
import json, os, sys
sys.path.insert(0, "tests/fixtures")
from check_saved import read_st
base, ad, merged = sys.argv[1:]
_, b = read_st(os.path.join(base, "model.safetensors"))
_, a = read_st(os.path.join(ad, "adapter_model.safetensors"))
_, m = read_st(os.path.join(merged, "model.safetensors"))
cfg = json.load(open(os.path.join(ad, "adapter_config.json")))
scale = cfg["lora_alpha"] / cfg["r"]
assert set(b) == set(m), set(b) ^ set(m)
adapted = 0
for k, (w, _) in b.items():
    mod = "base_model.model." + k[:-len(".weight")]
    if mod + ".lora_A.weight" in a:
        A, B = a[mod + ".lora_A.weight"][0].double(), a[mod + ".lora_B.weight"][0].double()
        want = w.double() + scale * (B @ A)
        err = (m[k][0].double() - want).abs().max().item()
        assert err < 1e-6, (k, err)
        assert (m[k][0] != w).any(), k
        adapted += 1
    else:
        assert (m[k][0] == w).all(), k
assert adapted == 6, adapted
PY
}

# field values of a JSONL stream, one line per record: fields KEY...
fields() { python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(" ".join(json.dumps(r.get(k)) for k in sys.argv[1:]))' "$@"; }

@test "LoRA: rl-rollout --adapter generates as the merged model, a zero adapter as the base" {
	[ -d "$TD/merged" ] || skip "needs the merge test's model"
	printf '%s\n' '{"prompt":"12+34=","answer":"46"}' '{"prompt":"7*6=","answer":"42"}' > "$TD/p.jsonl"
	gen() { rl-rollout -q --device cpu -n 3 --max-tokens 8 --jsonl --seed 5 "$@" "$TD/p.jsonl" |
	    fields prompt_text index response logprobs | sort; }
	gen -m "$TD/m0" > "$TD/g.base"
	gen -m "$TD/m0" --adapter "$TD/a/step-00000003" > "$TD/g.ad"
	gen -m "$TD/merged" > "$TD/g.merged"
	cmp "$TD/g.ad" "$TD/g.merged"
	! cmp -s "$TD/g.ad" "$TD/g.base"
	# B = 0 (as PEFT initialises it): exactly the base model
	mkdir -p "$TD/zero"
	cp "$TD/a/step-00000003/adapter_config.json" "$TD/zero/"
	python3 - "$TD/a/step-00000003/adapter_model.safetensors" "$TD/zero/adapter_model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k.endswith("lora_B.weight"):
        s, e = v["data_offsets"]
        b[8 + n + s:8 + n + e] = bytes(e - s)
open(sys.argv[2], "wb").write(b)
PY
	gen -m "$TD/m0" --adapter "$TD/zero" > "$TD/g.zero"
	cmp "$TD/g.zero" "$TD/g.base"
	# a LoRA run's checkpoints as weight versions: each the adapter on -m
	rl-rollout -q --device cpu -n 3 --max-tokens 8 --jsonl --seed 5 -m "$TD/m0" --weights-from "$TD/a" \
	    "$TD/p.jsonl" > "$TD/g.wf"
	[ "$(fields version < "$TD/g.wf" | sort -u)" = "[3, 3]" ]
	fields prompt_text index response logprobs < "$TD/g.wf" | sort | cmp - "$TD/g.ad"
	# an adapter as -m, a bad adapter: named
	run -1 --separate-stderr rl-rollout --device cpu -m "$TD/m0" --adapter "$TD/dora" "$TD/p.jsonl"
	[[ "$stderr" == *"$TD/dora/adapter_config.json"* ]]
}

@test "LoRA: on-policy through --sync: the generator gets adapter versions, a fraction of the model's bytes" {
	[ -d "$TD/merged" ] || skip "needs the merge test's model"
	python3 -c '
import json
for i in range(16): print(json.dumps({"prompt": "%d+%d=" % (i, i + 1), "answer": str(2 * i + 1)}))' > "$TD/p16.jsonl"
	rl-rollout -v --device cpu -m "$TD/m0" --sync "$TD/wd" --max-staleness 0 --train-batch 4 -n 4 --max-tokens 2 \
	    --seed 1 --weights-timeout 20 "$TD/p16.jsonl" 2>"$TD/wd.log" \
	  | rl-reward -q --task 'format:^[0-9]' \
	  | rl-train -q -m "$TD/m0" --out "$TD/ck-wd" --sync "$TD/wd" --ckpt-every 2 --batch 4 --lr 3e-2 \
	    --lora-rank 4 --metrics /dev/null
	for v in 1 2 3; do grep -q "weights version $v loaded" "$TD/wd.log"; done
	# the directory keeps the last two versions: 3 from memory (--ckpt-every 2), 4 from step-4
	for v in 000003 000004; do
		[ -f "$TD/wd/v$v/adapter_model.safetensors" ]
		[ -f "$TD/wd/v$v/adapter_config.json" ]
		[ ! -e "$TD/wd/v$v/model.safetensors" ]
	done
	[ ! -e "$TD/ck-wd/step-00000003" ]
	cmp "$TD/wd/v000004/adapter_model.safetensors" "$TD/ck-wd/step-00000004/adapter_model.safetensors"
	ad=$(stat -c %s "$TD/wd/v000004/adapter_model.safetensors")
	full=$(stat -c %s "$TD/m0/model.safetensors")
	echo "# adapter version: $ad bytes, the model: $full bytes" >&3
	[ $((ad * 4)) -lt "$full" ]
}

@test "LoRA: --resume continues bit for bit from the adapter checkpoint" {
	rl-train -q -m "$TD/m0" --out "$TD/ra" --batch 1 --lr 1e-2 --lora-rank 4 --lora-dropout 0.1 \
	    --max-steps 4 --metrics /dev/null "$TD/s.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/rb" --batch 1 --lr 1e-2 --lora-rank 4 --lora-dropout 0.1 \
	    --max-steps 2 --metrics /dev/null "$TD/s.jsonl"
	rl-train -q --out "$TD/rb" --batch 1 --lr 1e-2 --lora-rank 4 --lora-dropout 0.1 --max-steps 4 --resume \
	    --metrics /dev/null "$TD/s.jsonl"
	cmp "$TD/ra/step-00000004/adapter_model.safetensors" "$TD/rb/step-00000004/adapter_model.safetensors"
	cmp "$TD/ra/step-00000004/optimizer.safetensors" "$TD/rb/step-00000004/optimizer.safetensors"
	# another rank is another run: refused, named
	run -1 --separate-stderr rl-train --out "$TD/rb" --batch 1 --lr 1e-2 --lora-rank 8 --lora-dropout 0.1 \
	    --max-steps 5 --resume "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank: 4 in the run"* ]]
}

@test "LoRA: 2 ranks give the adapters of 1 rank; the memory is what --plan says" {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	PORT=$(free_port)
	args=(--batch 4 --lr 1e-2 --loss-agg token-mean --lora-rank 4 --lora-targets all-linear)
	rl-train -q -m "$TD/m0" --out "$TD/d1" --metrics "$TD/d1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/d2" "${args[@]}"
	# reduction order: fp32 sums ~1e-7 relative, through AdamW at lr 1e-2 (rl-train-dp.bats)
	run -0 python3 tests/fixtures/parallel/st_close.py "$TD/d2/latest/adapter_model.safetensors" \
	    "$TD/d1/latest/adapter_model.safetensors" 2e-5 1e-4
	run -1 python3 tests/fixtures/parallel/st_close.py "$TD/d2/step-00000001/adapter_model.safetensors" \
	    "$TD/d1/latest/adapter_model.safetensors" 2e-5 1e-4
	# gradients and AdamW moments of the adapters only: the plan's figures (weights: the
	# base and the adapters in f32, each tensor on 16-element boundaries)
	run -0 rl-train --plan=json -m "$TD/m0" --lora-rank 4 --max-tokens-per-micro 8192
	plan=$output
	python3 - "$plan" "$TD/d1.m" <<'PY'
import json, sys
p = json.loads(sys.argv[1]); m = json.loads(open(sys.argv[2]).readline())
MB = 1 << 20
assert p["runs"] is True, p
assert abs(m["memory/grads_mb"] * MB - p["grads_bytes"]) < 1, (m["memory/grads_mb"] * MB, p["grads_bytes"])
assert abs(m["memory/optimizer_state_mb"] * MB - p["optim_bytes"]) < 1, (m["memory/optimizer_state_mb"], p)
assert abs(m["memory/weights_mb"] * MB - p["weights_bytes"]) < 64 * 4 * 28, (m["memory/weights_mb"] * MB, p)
assert p["grads_bytes"] == 4 * p["trainable"], p
PY
}

@test "LoRA with --zero 3: the frozen base sharded; = 2 ranks without ZeRO bitwise, = 1 rank; memory about the shard; resumed on 1 rank" {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	# the 8-layer model, where a layer is small next to a rank's shard; 4 steps
	# of data, micro-batches of at most 30 tokens so that the ranks' counts
	# differ (a rank short of one only gathers in that round)
	deep_model "$TD/deep"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$TD/s16.jsonl"
	word_pairs 12 > "$TD/zpairs.jsonl"
	export TRAIN_WORLD_DATA="$TD/s16.jsonl"
	args=(--batch 4 --lr 1e-2 --lora-rank 4 --max-tokens-per-micro 30 --mini-batches 2)
	PORT=$(free_port)
	TD="$TD/deep" train_world 2 "$TD/zd" "${args[@]}" --max-steps 3
	PORT=$(free_port)
	TD="$TD/deep" train_world 2 "$TD/z3" "${args[@]}" --max-steps 3 --zero 3
	rl-train -q -m "$TD/deep/m0" --out "$TD/z1" --metrics "$TD/z1.m" "${args[@]}" --max-steps 3 "$TD/s16.jsonl"
	# the adapters' arithmetic is that of plain data parallelism (the same
	# GEMMs on the same gathered base, the same all-reduce of their
	# gradients): adapters, AdamW state and losses bitwise
	for s in 1 2 3; do
		cmp "$TD/zd/step-0000000$s/adapter_model.safetensors" "$TD/z3/step-0000000$s/adapter_model.safetensors"
	done
	cmp "$TD/zd/step-00000003/optimizer.safetensors" "$TD/z3/step-00000003/optimizer.safetensors"
	[ ! -e "$TD/z3/step-00000003/model.safetensors" ]
	[ "$(jq -c '[.step, .["actor/pg_loss"]]' "$TD/zd.metrics.0")" = "$(jq -c '[.step, .["actor/pg_loss"]]' "$TD/z3.metrics.0")" ]
	# 1 rank: the fp32 reduction order only (the tolerance of the 2-rank test above)
	run -0 python3 tests/fixtures/parallel/st_close.py "$TD/z3/step-00000003/adapter_model.safetensors" \
	    "$TD/z1/step-00000003/adapter_model.safetensors" 2e-5 1e-4
	# measured parameter memory of rank 0: its half of the base plus the unit
	# computed and the one prefetched plus the adapters; the base whole (as
	# without ZeRO, >= 0.98 of the table) fails this; the load read the shard only
	rl-train --plan=json -m "$TD/deep/m0" --world 2 --zero 3 --lora-rank 4 > "$TD/z3.plan"
	python3 - "$TD/zd.metrics.0" "$TD/z3.metrics.0" "$TD/z3.plan" <<'PY'
import json, sys
zd = [json.loads(l) for l in open(sys.argv[1])]
z3 = [json.loads(l) for l in open(sys.argv[2])]
plan = json.load(open(sys.argv[3]))
full = zd[0]["memory/weights_mb"]
assert all(m["memory/params_resident_mb"] >= 0.98 * full for m in zd), zd[0]
assert len(z3) == 3
for m in z3:
    r = m["memory/params_resident_mb"] / full
    print("resident", m["step"], round(r, 3))
    assert 0.5 < r < 0.8, r
    assert m["dp/zero_stage"] == 3, m["dp/zero_stage"]
    # the plan's weights (the shard, two layers, the adapters) are what ran
    got = m["memory/params_resident_mb"] * (1 << 20)
    assert abs(got - plan["weights_bytes"]) <= 0.1 * plan["weights_bytes"], (got, plan["weights_bytes"])
    # the adapters' gradients and AdamW state whole, as the plan says
    assert abs(m["memory/grads_mb"] * (1 << 20) - plan["grads_bytes"]) < 1, (m["memory/grads_mb"], plan)
    assert abs(m["memory/optimizer_state_mb"] * (1 << 20) - plan["optim_bytes"]) < 1, (m, plan)
r = z3[0]["memory/load_params_resident_mb"] / full
print("load", round(r, 3))
assert 0.5 <= r < 0.7, r
assert plan["runs"] is True, plan
PY
	# both runs resumed on 1 rank without ZeRO: step 4 from the same files is the same
	for d in zd z3; do
		rl-train -q --out "$TD/$d" --metrics "$TD/$d.r" "${args[@]}" --max-steps 4 --resume "$TD/s16.jsonl"
	done
	cmp "$TD/zd/step-00000004/adapter_model.safetensors" "$TD/z3/step-00000004/adapter_model.safetensors"
	[ "$(jq -r .step "$TD/z3.r")" = 4 ]
	# the base with the adapters off as the reference (GRPO's KL term, DPO's
	# initial policy): its forwards gather the base's units on every rank (a
	# rank without a pass runs its gathers); = 2 ranks without ZeRO bitwise
	for z in 0 3; do
		PORT=$(free_port)
		TD="$TD/deep" train_world 2 "$TD/zk$z" "${args[@]}" --max-steps 2 --zero $z --kl k3 --kl-coef 0.1 \
		    --ref "$TD/deep/m0"
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/zpairs.jsonl" TD="$TD/deep" train_world 2 "$TD/zp$z" --algo dpo --batch 6 \
		    --lr 1e-2 --lora-rank 4 --max-steps 2 --max-tokens-per-micro 64 --zero $z
	done
	cmp "$TD/zk0/step-00000002/adapter_model.safetensors" "$TD/zk3/step-00000002/adapter_model.safetensors"
	cmp "$TD/zp0/step-00000002/adapter_model.safetensors" "$TD/zp3/step-00000002/adapter_model.safetensors"
	run -0 jq -s '.[1]["actor/kl_loss"] > 0' "$TD/zk3.metrics.0"
	[ "$output" = true ]
	[ "$(jq -c '[.["actor/kl_loss"], .["actor/dpo_loss"]]' "$TD/zk0.metrics.0" "$TD/zp0.metrics.0")" = \
	  "$(jq -c '[.["actor/kl_loss"], .["actor/dpo_loss"]]' "$TD/zk3.metrics.0" "$TD/zp3.metrics.0")" ]
	run -1 grep -q 'memory/ref_' "$TD/zk3.metrics.0" "$TD/zp3.metrics.0"
	# --device cuda with it: refused before anything runs (no CUDA path for the adapters)
	run -2 --separate-stderr rl-train -m "$TD/deep/m0" --out "$TD/zc" --lora-rank 4 --zero 3 --world 2 --rank 0 \
	    --rendezvous 127.0.0.1:1 --device cuda "$TD/s16.jsonl"
	[[ "$stderr" == *"--lora-rank trains on --device cpu only"* ]]
}

# z3_setup: the 8-layer model and 16 rows of the ZeRO-3 test above (made here
# when that test did not run first); sets args as that test does
z3_setup() {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	[ -f "$TD/deep/m0/config.json" ] || deep_model "$TD/deep"
	[ -f "$TD/s16.jsonl" ] || python3 tests/fixtures/train/mkscored.py 16 4 0 > "$TD/s16.jsonl"
	export TRAIN_WORLD_DATA="$TD/s16.jsonl"
	args=(--batch 4 --lr 1e-2 --lora-rank 4 --max-tokens-per-micro 30 --mini-batches 2 --max-steps 3)
}

teardown() {
	local p
	for p in ${SPIDS:-}; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

@test "LoRA with --zero 3 and --sync: rl-sync holds adapter versions, byte for byte those of 2 ranks without ZeRO" {
	z3_setup
	SPIDS=""
	for z in 0 3; do
		on_free_port 'rl-sync status tcp://127.0.0.1:@PORT@ --timeout 200' \
		    rl-sync serve -q --listen tcp://127.0.0.1:@PORT@ --keep-previous --no-shm
		SPIDS="$SPIDS $DPID"
		eval "URL$z=tcp://127.0.0.1:$DPORT"
	done
	PORT=$(free_port)
	TD="$TD/deep" train_world 2 "$TD/ys0" "${args[@]}" --sync "$URL0"
	PORT=$(free_port)
	TD="$TD/deep" train_world 2 "$TD/ys3" "${args[@]}" --sync "$URL3" --zero 3
	# each server holds versions 3 and 2 (--keep-previous): the same hashes
	rl-sync status --json "$URL0" > "$TD/ys0.st"
	rl-sync status --json "$URL3" > "$TD/ys3.st"
	[ "$(jq -c '[.latest, .previous]' "$TD/ys3.st")" = "[3,2]" ]
	[ "$(jq -c '[.versions[] | [.version, .hash, .bytes]]' "$TD/ys0.st")" = \
	  "$(jq -c '[.versions[] | [.version, .hash, .bytes]]' "$TD/ys3.st")" ]
	full=$(stat -c %s "$TD/deep/m0/model.safetensors")
	for v in 2 3; do
		for z in 0 3; do
			eval "u=\$URL$z"
			rl-sync pull -q --transport stream "$u" --version "$v" --out "$TD/ysp$z.$v"
		done
		d0="$TD/ysp0.$v/v00000$v" d3="$TD/ysp3.$v/v00000$v"
		# an adapter version: PEFT's two files, no base
		[ -f "$d3/adapter_config.json" ] && [ ! -e "$d3/model.safetensors" ]
		cmp "$d3/adapter_model.safetensors" "$d0/adapter_model.safetensors"
		cmp "$d3/adapter_model.safetensors" "$TD/ys3/step-0000000$v/adapter_model.safetensors"
		ad=$(stat -c %s "$d3/adapter_model.safetensors")
		bytes=$(jq ".versions[] | select(.version == $v) | .bytes" "$TD/ys3.st")
		echo "# version $v: adapter $ad bytes, the version $bytes, the model $full" >&3
		# the version is the adapter plus its config and the tokenizer (~1 kB)
		[ "$bytes" -ge "$ad" ] && [ "$bytes" -lt $((ad + 4096)) ] && [ $((bytes * 4)) -lt "$full" ]
	done
	# rank 0's parameters: its half of the base, as in the ZeRO-3 test above
	python3 - "$TD/ys0.metrics.0" "$TD/ys3.metrics.0" <<'PY'
import json, sys
z0 = [json.loads(l) for l in open(sys.argv[1])]
z3 = [json.loads(l) for l in open(sys.argv[2])]
full = z0[0]["memory/weights_mb"]
assert [m.get("dp/zero_stage") for m in z3] == [3, 3, 3], [m.get("dp/zero_stage") for m in z3]
for m in z3:
    r = m["memory/params_resident_mb"] / full
    print("resident", m["step"], round(r, 3))
    assert 0.5 < r < 0.8, r
PY
}

@test "LoRA with --zero 3: PPO's adapters, value head and losses = 2 ranks without ZeRO bitwise" {
	z3_setup
	for z in 0 3; do
		PORT=$(free_port)
		TD="$TD/deep" train_world 2 "$TD/yp$z" "${args[@]}" --algo ppo --zero $z
	done
	for f in adapter_model value_head optimizer; do
		cmp "$TD/yp0/step-00000003/$f.safetensors" "$TD/yp3/step-00000003/$f.safetensors"
	done
	# the value head trained (it moved between steps 1 and 3)
	run -1 cmp -s "$TD/yp3/step-00000001/value_head.safetensors" "$TD/yp3/step-00000003/value_head.safetensors"
	# every number of rank 0's metrics but timings, memory and dp/ (ZeRO's own
	# counts): the policy and value losses among them
	local f='[.[] | with_entries(select(.key | test("^(timing_s|timing_per_token_ms|perf|memory|dp)/") | not))]'
	[ "$(jq -cs "$f" "$TD/yp0.metrics.0")" = "$(jq -cs "$f" "$TD/yp3.metrics.0")" ]
	run -0 jq -s '[.[] | .["dp/zero_stage"] == 3 and .["dp/units_gathered"] > 0 and .["critic/vf_loss"] > 0] | all' \
	    "$TD/yp3.metrics.0"
	[ "$output" = true ]
}

# same_run A B: metrics lines A and B equal but for timings and memory (the
# losses, KL, entropy, gradient norm, rewards: every number bit for bit)
same_run() {
	local f='[.[] | with_entries(select(.key | test("^(timing_s|timing_per_token_ms|perf|memory)/") | not))]'
	[ "$(jq -cs "$f" "$1")" = "$(jq -cs "$f" "$2")" ]
}

@test "LoRA: the base with the adapters off is the reference, as the base opened as a second model, bit for bit" {
	# a copy of the base is another directory: still opened as a second model
	cp -r "$TD/m0" "$TD/m0copy"
	args=(--batch 2 --lr 1e-2 --lora-rank 4 --lora-dropout 0.1 --kl k3 --kl-coef 0.1)
	rl-train -q -m "$TD/m0" --out "$TD/kb" "${args[@]}" --max-steps 3 --ref "$TD/m0" --metrics "$TD/kb.m" "$TD/s.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/kc" "${args[@]}" --max-steps 3 --ref "$TD/m0copy" --metrics "$TD/kc.m" \
	    "$TD/s.jsonl"
	same_run "$TD/kb.m" "$TD/kc.m"
	cmp "$TD/kb/step-00000003/adapter_model.safetensors" "$TD/kc/step-00000003/adapter_model.safetensors"
	# the KL moved off 0 once the adapters trained (the reference is not the policy)
	run -0 jq -s '.[0]["actor/kl_loss"] == 0 and .[1]["actor/kl_loss"] > 0 and .[2]["actor/kl_loss"] > 0' "$TD/kb.m"
	[ "$output" = true ]
	# no second model: no reference memory at all (the copy's is the model's weights)
	run -1 grep -q 'memory/ref_' "$TD/kb.m"
	run -0 jq -s '.[0]["memory/ref_params_resident_mb"] >= .[0]["memory/weights_mb"] * 0.9' "$TD/kc.m"
	[ "$output" = true ]
	# --resume (no -m: the base from adapter_config.json) keeps the base as the reference
	rl-train -q -m "$TD/m0" --out "$TD/kr" "${args[@]}" --max-steps 2 --ref "$TD/m0" --metrics /dev/null "$TD/s.jsonl"
	run -0 --separate-stderr rl-train -v --out "$TD/kr" "${args[@]}" --max-steps 3 --ref "$TD/m0" --resume \
	    --metrics /dev/null "$TD/s.jsonl"
	[[ "$stderr" == *"reference: the base '$TD/m0' with the adapters off"* ]]
	cmp "$TD/kb/step-00000003/adapter_model.safetensors" "$TD/kr/step-00000003/adapter_model.safetensors"
	# DPO without ref_logprobs: the initial policy, which is the base, by default
	python3 -c '
import json
w = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
for i in range(8):
    print(json.dumps({"prompt": "%s %s:" % (w[i], w[7 - i]), "chosen": " " + w[(i + 1) % 8],
                      "rejected": " " + w[(i + 3) % 8] + " " + w[i]}))' > "$TD/pairs.jsonl"
	args=(--algo dpo --batch 4 --lr 1e-2 --lora-rank 4 --max-steps 2)
	rl-train -q -m "$TD/m0" --out "$TD/db" "${args[@]}" --metrics "$TD/db.m" "$TD/pairs.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/dc" "${args[@]}" --ref "$TD/m0copy" --metrics "$TD/dc.m" "$TD/pairs.jsonl"
	same_run "$TD/db.m" "$TD/dc.m"
	cmp "$TD/db/step-00000002/adapter_model.safetensors" "$TD/dc/step-00000002/adapter_model.safetensors"
	run -0 jq -s '(.[0]["actor/dpo_loss"] - (2 | log) | fabs) < 1e-9 and .[1]["actor/dpo_loss"] != (2 | log)' "$TD/db.m"
	[ "$output" = true ]
	run -1 grep -q 'memory/ref_' "$TD/db.m"
	grep -q 'memory/ref_params_resident_mb' "$TD/dc.m"
}

@test "LoRA: with the base as the reference the process holds no second model; --plan counts none" {
	# a 9.3 MB model: its weights stand out of the process's peak RSS
	mkdir -p "$TD/big"
	jq -c '.hidden_size = 256 | .num_hidden_layers = 4 | .intermediate_size = 512' "$TD/cfg.json" > "$TD/big/cfg.json"
	rl-train -q --init "$TD/big/cfg.json" --tokenizer bytes --out "$TD/big/m0" --seed 1
	cp -r "$TD/big/m0" "$TD/big/copy"
	ln -s m0 "$TD/big/link"
	args=(-m "$TD/big/m0" --batch 2 --lr 1e-2 --lora-rank 4 --kl k3 --kl-coef 0.1 --max-steps 1)
	rl-train -q "${args[@]}" --out "$TD/big/b" --ref "$TD/big/link" --metrics "$TD/big/b.m" "$TD/s.jsonl"
	rl-train -q "${args[@]}" --out "$TD/big/c" --ref "$TD/big/copy" --metrics "$TD/big/c.m" "$TD/s.jsonl"
	same_run "$TD/big/b.m" "$TD/big/c.m"
	python3 - "$TD/big/b.m" "$TD/big/c.m" <<'PY'
import json, sys
b, c = (json.loads(open(f).readline()) for f in sys.argv[1:])
model = c["memory/ref_params_resident_mb"]
assert abs(model - b["memory/weights_mb"]) < 0.5, (model, b["memory/weights_mb"])
assert not any(k.startswith("memory/ref_") for k in b), b
saved = c["memory/max_rss_mb"] - b["memory/max_rss_mb"]
# the second model's weights (and the pages its forward touched): about the model's size
assert 0.8 * model <= saved <= 3 * model, (saved, model)
print("peak RSS %.1f MB lower; the model's weights %.1f MB" % (saved, model))
PY
	# the plan: the base (by another spelling of its path) counts nothing, a copy a whole model
	plan=(--plan=json -m "$TD/big/m0" --lora-rank 4 --kl k3)
	run -0 rl-train "${plan[@]}" --ref "$TD/big/link/"
	pb=$output
	run -0 rl-train "${plan[@]}" --ref "$TD/big/copy"
	pc=$output
	run -0 rl-train --plan=json -m "$TD/big/m0" --lora-rank 4 --algo dpo
	pd=$output
	python3 - "$pb" "$pc" "$pd" <<'PY'
import json, sys
b, c, d = map(json.loads, sys.argv[1:])
for p in (b, d):
    assert p["ref"] == "the LoRA base, adapters off", p
    assert p["ref_bytes"] == p["ref_weights_bytes"] == p["ref_acts_bytes"] == 0, p
assert c["ref_weights_bytes"] >= 4 * c["params"], c
assert c["total_bytes"] - b["total_bytes"] == c["ref_bytes"], (b, c)
PY
	run -0 rl-train --plan -m "$TD/big/m0" --lora-rank 4 --algo dpo
	assert_line --partial "reference          0.00 MiB (the LoRA base, adapters off"
}

@test "LoRA: bad options and adapters are refused, named" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-targets q_proj "$TD/s.jsonl"
	[[ "$stderr" == *"need --lora-rank"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --lora-targets q_proj,nope "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-targets: bad value 'q_proj,nope'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --lora-dropout 1 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-dropout"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 0 "$TD/s.jsonl"
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --device cuda "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank trains on --device cpu only"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --weights-group 127.0.0.1:1 \
	    --weights-group-size 2 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank with --weights-group"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --zero 1 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank with --zero 1"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lora-rank 4 --zero 2 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank with --zero 2"* ]]
	# GPT-2 has no LoRA here
	cat > "$TD/g.json" <<'JSON'
{"model_type":"gpt2","vocab_size":261,"n_embd":32,"n_layer":1,"n_head":2,"n_positions":64}
JSON
	rl-train -q --init "$TD/g.json" --tokenizer bytes --out "$TD/g0"
	run -1 --separate-stderr rl-train -m "$TD/g0" --out "$TD/x" --lora-rank 4 "$TD/s.jsonl"
	[[ "$stderr" == *"GPT-2"* ]]
	# adapters: no config, a DoRA one, a tensor missing
	run -1 --separate-stderr rl-train --merge-adapter "$TD" --out "$TD/x2"
	[[ "$stderr" == *"$TD/adapter_config.json"* ]]
	[ -d "$TD/a/step-00000003" ] || skip "needs the first test's run"
	mkdir -p "$TD/dora"
	cp "$TD/a/step-00000003/adapter_model.safetensors" "$TD/dora/"
	jq '.use_dora = true' "$TD/a/step-00000003/adapter_config.json" > "$TD/dora/adapter_config.json"
	run -1 --separate-stderr rl-train --merge-adapter "$TD/dora" --out "$TD/x3"
	[[ "$stderr" == *"dora/adapter_config.json': \"use_dora\" is set"* ]]
	jq '.target_modules = ["q_proj","v_proj","down_proj","o_proj"]' "$TD/a/step-00000003/adapter_config.json" \
	    > "$TD/dora/adapter_config.json"
	run -1 --separate-stderr rl-train --merge-adapter "$TD/dora" --out "$TD/x4"
	[[ "$stderr" == *"no tensor 'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight'"* ]]
	[ ! -e "$TD/x4" ]
}

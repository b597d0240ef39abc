#!/usr/bin/env bats
# rl-train --zero 3 on the CPU backend (several processes on 127.0.0.1):
# - 2 and 4 ranks give the losses and weights of 1 rank without ZeRO, for
#   GRPO (micro-batches, mini-batches, epochs: π_old recomputed per share),
#   PPO (value head, --recompute) and DPO with a rank a micro-batch short (its
#   rounds only gather; 2 ranks);
# - with and without the prefetch of the next unit, bitwise ZeRO-2's weights;
# - the unit pool (gathered units' pages mapped from a memfd): every gather of
#   the 8-layer model served from it, the weights and measured memory those
#   of fresh pages (RL_ZERO3_NO_POOL=1), with --zero3-keep past its slots too;
#   with the gradient pages populated before each layer's backward, fewer
#   page faults than with neither (RL_ZERO3_NO_PREFAULT=1), the same
#   gradient memory;
# - the shards read in place (each rank's shard a memfd the others map; a
#   gather copies from it, no collective): on 2 and 3 ranks, with one rank's
#   AdamW late, the weights and losses of gathers through the ring
#   (RL_ZERO3_NO_DIRECT=1) bitwise, the same measured memory; one rank
#   refusing sends every rank through the ring;
# - each rank's parameter memory, measured from its resident pages, is about
#   its shard plus the unit being computed and the one prefetched, against
#   the whole table for --zero 2;
# - the load reads each rank's shard only (its measured parameter memory
#   about the shard); a NaN in one rank's shard stops every rank; a bf16
#   checkpoint's f32 master weights are read per shard (resumed = ZeRO-2);
#   a reward model's score head, new and resumed, = ZeRO-2;
# - the reference model (--ref: GRPO's KL term, DPO) sharded too: the
#   losses, KL and weights of ZeRO-2 bitwise (and of 1 rank within the
#   tolerance), its measured memory about its shard plus a unit; a reference
#   of another vocabulary, one whose tensors do not fit its config and a NaN
#   in rank 1's shard of it are refused on every rank;
# - the checkpoint is one model directory, written unit by unit (rank 0's
#   memory about its shard plus a unit; the files ZeRO-2's, byte for byte),
#   plus the optimizer shards: resumed on 1 rank without ZeRO, the same as
#   3 steps of 1 rank;
# - queue mode (rank 0 leasing) trains the steps of the file;
# - a rank killed mid-run stops the other at once (exit 1);
# - --zero 2 with LoRA is refused (--zero 3 with LoRA: rl-train-lora.bats).  (--device cuda is refused by the check
#   --zero 2 shares, in rli_dp_reducer_open; not run here: it needs a GPU.)

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load zero_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	# the 2-layer model of the other rl-train files (the tolerance below was
	# measured on it), and an 8-layer one for the memory, where a layer is
	# small next to the shard
	train_model "$TD"
	deep_model "$TD/big"
	# 12 groups of 4, responses of 1 to 10 tokens: 3 steps of 4 groups
	python3 tests/fixtures/train/mkscored.py 12 4 0 > "$TD/s.jsonl"
	# 12 preference pairs (DPO)
	word_pairs 12 > "$TD/pairs.jsonl"
	# reference models other than the policy (seed 2): the 2-layer one and the 8-layer one
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m1" --seed 2
	rl-train -q --init "$TD/big/cfg.json" --tokenizer bytes --out "$TD/big/m1" --seed 2
}


@test "ZeRO-3, GRPO: 2 and 4 ranks = 1 rank (losses, weights, optimizer state), = ZeRO-2 bitwise" {
	args=(--batch 4 --lr 1e-2 --loss-agg seq-mean-token-mean --mini-batches 2 --ppo-epochs 2
	    --max-tokens-per-micro 40 --bucket-mb 0.01 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/g1" --metrics "$TD/g1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/g2" --zero 3 "${args[@]}"
	PORT=$(free_port)
	train_world 4 "$TD/g4" --zero 3 "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/z2" --zero 2 "${args[@]}"
	for w in 2 4; do
		[ "$(readlink "$TD/g$w/latest")" = step-00000003 ]
		run -0 close "$TD/g$w/latest/model.safetensors" "$TD/g1/latest/model.safetensors"
		python3 tests/fixtures/parallel/opt_gather.py "$TD/g$w/latest" "$TD/g$w.opt"
		run -0 close "$TD/g$w.opt" "$TD/g1/latest/optimizer.safetensors" 1e-7 1e-2
		run -0 same_losses "$TD/g1.m" "$TD/g$w.metrics.0" 3
	done
	# the same arithmetic as ZeRO-2 (only the parameters' home differs): bitwise,
	# with or without the prefetch
	cmp "$TD/g2/latest/model.safetensors" "$TD/z2/latest/model.safetensors"
	# the update's phases: gathers waited for (ZeRO-3 gathers every unit of
	# every pass), reductions, AdamW; each inside the update, AdamW inside
	# the model's time
	python3 - "$TD/g2.metrics.0" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    g, r, o = m["timing_s/param_gather"], m["timing_s/grad_reduce"], m["timing_s/optimizer"]
    assert g > 0 and r > 0 and o > 0, (g, r, o)
    assert g + r + o <= m["timing_s/update_actor"], m
    assert 0 <= o <= m["timing_s/model"], m
PY
	PORT=$(free_port)
	train_world 2 "$TD/n2" --zero 3 --no-prefetch "${args[@]}"
	cmp "$TD/n2/latest/model.safetensors" "$TD/z2/latest/model.safetensors"
	# units kept gathered between passes (all of them; about two of the four on
	# 4 ranks): the same weights from fewer gathers
	PORT=$(free_port)
	train_world 2 "$TD/k2" --zero 3 --zero3-keep 1e9 "${args[@]}"
	cmp "$TD/k2/latest/model.safetensors" "$TD/z2/latest/model.safetensors"
	PORT=$(free_port)
	train_world 4 "$TD/k4" --zero 3 --zero3-keep 20000 "${args[@]}"
	cmp "$TD/k4/latest/model.safetensors" "$TD/g4/latest/model.safetensors"
	python3 - "$TD/g2.metrics.0" "$TD/k2.metrics.0" "$TD/g4.metrics.0" "$TD/k4.metrics.0" <<'PY'
import json, sys
n = [[json.loads(l)["dp/units_gathered"] for l in open(f)] for f in sys.argv[1:]]
print(n)
for a, b in ((n[0], n[1]), (n[2], n[3])):
    assert all(y < x for x, y in zip(a, b)), (a, b)
PY
	# not blind: one step fewer is far off
	run -1 close "$TD/g4/step-00000002/model.safetensors" "$TD/g1/latest/model.safetensors"
}

@test "ZeRO-3, PPO (value head) with --recompute: 2 and 4 ranks = 1 rank, = ZeRO-2 bitwise" {
	args=(--algo ppo --batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01 --dp-check-every 1 --recompute)
	rl-train -q -m "$TD/m0" --out "$TD/p1" --metrics "$TD/p1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/p2" --zero 3 "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/p3" --zero 2 "${args[@]}"
	PORT=$(free_port)
	train_world 4 "$TD/p4" --zero 3 "${args[@]}"
	cmp "$TD/p2/latest/model.safetensors" "$TD/p3/latest/model.safetensors"
	for w in 2 4; do
		run -0 close "$TD/p$w/latest/model.safetensors" "$TD/p1/latest/model.safetensors"
		run -0 same_losses "$TD/p1.m" "$TD/p$w.metrics.0" 3
	done
	grep -q '"critic/vf_loss"' "$TD/p2.metrics.0"
}

@test "ZeRO-3, DPO: 2 ranks with uneven micro-batch counts (1 and 2 pairs) = 1 rank" {
	# 3 pairs a step, one pair per micro-batch: one rank has a round without a
	# micro-batch, in which it only gathers and hands over zeros
	args=(--algo dpo --batch 3 --lr 1e-2 --max-tokens-per-micro 64 --bucket-mb 0.01)
	rl-train -q -m "$TD/m0" --out "$TD/d1" --metrics /dev/null "${args[@]}" "$TD/pairs.jsonl"
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/d2" --zero 3 "${args[@]}"
	[ "$(readlink "$TD/d2/latest")" = step-00000004 ]
	run -0 close "$TD/d2/latest/model.safetensors" "$TD/d1/latest/model.safetensors"
	# the pairs have no ref_logprobs: the reference is the initial policy, opened
	# by both ranks at the first step and read per shard (its load measured
	# there, once), its memory measured every step (this 100 KB model is a few
	# pages: the memory is checked on the 8-layer one below)
	python3 - "$TD/d2.metrics.0" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
assert "memory/ref_load_params_resident_mb" in ms[0], ms[0]
assert all("memory/ref_load_params_resident_mb" not in m for m in ms[1:])
assert all(m["memory/ref_params_resident_mb"] > 0 for m in ms), ms
PY
	# the gather-only passes keep units as the computing ones do
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/dk" --zero 3 --zero3-keep 1e9 "${args[@]}"
	cmp "$TD/dk/latest/model.safetensors" "$TD/d2/latest/model.safetensors"
}

@test "ZeRO-3: each rank's resident parameter memory is about its shard, measured" {
	# step 1 a full checkpoint (the first), step 2 a directory without the
	# optimizer state, step 3 full again (--max-steps)
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.05 --max-steps 3 --save-every 3)
	S="$TD/s.jsonl"
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/q22" --zero 2 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/q23" --zero 3 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 4 "$TD/q43" --zero 3 "${args[@]}"
	# ZeRO-3 writes its directories unit by unit, ZeRO-2 from the whole model
	# (the same weights, bitwise): the same files, byte for byte, but for the
	# optimizer state's shards and index (the save's id; compared gathered)
	[ -e "$TD/q23/step-00000002/model.safetensors" ] && [ ! -e "$TD/q23/step-00000002/optimizer.safetensors" ]
	for d in step-00000001 step-00000002 step-00000003; do
		[ "$(ls "$TD/q22/$d")" = "$(ls "$TD/q23/$d")" ]
		for f in "$TD/q22/$d"/*; do
			case $f in */optimizer*) continue ;; esac
			cmp "$f" "$TD/q23/$d/${f##*/}"
		done
	done
	for w in 22 23; do python3 tests/fixtures/parallel/opt_gather.py "$TD/q$w/step-00000003" "$TD/q$w.opt"; done
	cmp "$TD/q22.opt" "$TD/q23.opt"
	# measured parameter memory (rank 0 writes the metrics): the shard (1/N of
	# the table) plus the unit being computed and the one prefetched (a layer:
	# 1/8 of the trunk, 0.126 of the table; the head with the tied embedding)
	# plus partial pages; ZeRO-2 keeps the whole table resident
	python3 - "$TD/q22.metrics.0" "$TD/q23.metrics.0" "$TD/q43.metrics.0" <<'PY'
import json, sys
z2 = [json.loads(l) for l in open(sys.argv[1])]
full = z2[0]["memory/weights_mb"]
for m in z2:
    assert m["memory/params_resident_mb"] >= 0.98 * full, (m["memory/params_resident_mb"], full)
for f, n in zip(sys.argv[2:], (2, 4)):
    for l in open(f):
        r = json.loads(l)["memory/params_resident_mb"] / full
        print(f, n, round(r, 3))
        assert 1.0 / n < r < 1.0 / n + 0.3, (f, n, r)
# the load: each rank read its shard only, then moved it into its master
# shard 256 KiB at a time (0.13 of this table); reading the whole model
# and keeping the shard held 1 + 1/N of it (1.50 and 1.25 measured)
assert "memory/load_params_resident_mb" not in z2[0], z2[0]
for f, n in zip(sys.argv[2:], (2, 4)):
    ms = [json.loads(l) for l in open(f)]
    r = ms[0]["memory/load_params_resident_mb"] / full
    print(f, n, "load", round(r, 3))
    assert 1.0 / n <= r < 1.0 / n + 0.2, (f, n, r)
    assert all("memory/load_params_resident_mb" not in m for m in ms[1:]), ms[1]
# the saves (every step writes a directory): written unit by unit, the
# shard and one unit at a time, where the whole model gathered beside the
# shard held 1 + 1/N (1.50 measured on 2 ranks)
assert all("memory/save_params_resident_mb" not in m for m in z2), z2[0]
for f, n in zip(sys.argv[2:], (2, 4)):
    ms = [json.loads(l) for l in open(f)]
    assert len(ms) == 3, len(ms)
    for m in ms:
        r = m["memory/save_params_resident_mb"] / full
        print(f, n, "save", m["step"], round(r, 3))
        assert 1.0 / n < r < 1.0 / n + 0.3, (f, n, r)
PY
	# rl-train --plan's ZeRO-3 weights (the shard plus two layers) are what
	# was measured, within the partial pages at the units' ends (2.5% here)
	for w in 2 4; do
		p=$(rl-train --plan=json -m "$TD/big/m0" --world $w --zero 3 | jq .weights_bytes)
		python3 - "$TD/q${w}3.metrics.0" "$p" <<'PY'
import json, sys
plan = float(sys.argv[2])
for l in open(sys.argv[1]):
    got = json.loads(l)["memory/params_resident_mb"] * (1 << 20)
    assert abs(got - plan) <= 0.1 * plan, (got, plan)
PY
	done
	# --zero3-keep holds the units used: with room for all, the whole table
	# beside the shard at the peak
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/q2k" --zero 3 --zero3-keep 1e9 "${args[@]}"
	python3 - "$TD/q2k.metrics.0" "$TD/q22.metrics.0" <<'PY'
import json, sys
full = json.loads(open(sys.argv[2]).readline())["memory/weights_mb"]
for l in open(sys.argv[1]):
    r = json.loads(l)["memory/params_resident_mb"] / full
    assert 1.4 < r < 1.6, r
PY
}

@test "ZeRO-3's unit pool and gradient prefault: gathers mapped from the pool, fewer page faults, the weights and memory of fresh pages, kept units past its slots" {
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.05 --max-steps 3 --save-every 3)
	S="$TD/s.jsonl"
	# the pool serves gathers that write pages of their own: the shards read
	# in place and copied (as here), or the ring; the mapped gathers of the
	# next test write none
	export RL_ZERO3_NO_MAP=1
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/up" --zero 3 "${args[@]}"
	PORT=$(free_port)
	RL_ZERO3_NO_POOL=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/un" --zero 3 "${args[@]}"
	# --zero3-keep with room for every unit: more units resident than the
	# pool has slots, the rest gathered into anonymous pages beside them
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/uk" --zero 3 --zero3-keep 1e9 "${args[@]}"
	# neither the pool nor the gradient pages populated before the backward
	PORT=$(free_port)
	RL_ZERO3_NO_POOL=1 RL_ZERO3_NO_PREFAULT=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/u0" --zero 3 "${args[@]}"
	for r in un uk u0; do cmp "$TD/up/step-00000003/model.safetensors" "$TD/$r/step-00000003/model.safetensors"; done
	python3 - "$TD/up.metrics.0" "$TD/un.metrics.0" "$TD/uk.metrics.0" "$TD/u0.metrics.0" <<'PY'
import json, sys
p, n, k, z = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert len(p) == len(n) == len(k) == len(z) == 3
for a, d in zip(p[1:], z[1:]):
    # after the first step (the load's faults): the gathers' pages mapped
    # from the pool and the gradient pages populated per unit take a third
    # of the faults of pages faulted in one by one (measured 2,100-2,500
    # against 6,200-7,700 a step)
    assert a["perf/minor_faults"] < 0.7 * d["perf/minor_faults"], (a["perf/minor_faults"], d["perf/minor_faults"])
    # the same gradient pages, only earlier
    assert a["memory/grads_resident_mb"] <= 1.02 * d["memory/grads_resident_mb"], (a, d)
for a, b, c in zip(p, n, k):
    # every unit of this model has whole pages and finds a free slot (at
    # most the computed and the prefetched unit are mapped at once)
    assert a["dp/units_pooled"] == a["dp/units_gathered"] > 0, a
    assert b["dp/units_pooled"] == 0 and b["dp/units_gathered"] == a["dp/units_gathered"], b
    assert 0 < c["dp/units_pooled"] < c["dp/units_gathered"], c
    # the pool's idle slots are counted: its peak is the fresh pages' one
    # (the same units resident), less the partial huge pages at their ends
    assert a["memory/params_resident_mb"] <= 1.01 * b["memory/params_resident_mb"], (a, b)
    assert a["memory/params_resident_mb"] < 0.8 * a["memory/weights_mb"], a
PY
}

@test "ZeRO-3's shards read in place: 2 and 3 ranks map each other's shards, their pages mapped or copied, the weights, losses and memory of gathers through the ring bitwise; one rank refusing sends every rank through the ring" {
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.05 --max-steps 3 --save-every 3)
	S="$TD/s.jsonl"
	# rank 1 writes its shard 0.3 s after rank 0 (RL_TRAIN_TEST_SLOW_ADAMW):
	# a gather of the next step that read it before the barrier after AdamW
	# would take step 1's weights and differ from the ring's
	RL_TRAIN_TEST_SLOW_ADAMW=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/ipd2" --zero 3 "${args[@]}"
	PORT=$(free_port)
	RL_ZERO3_NO_DIRECT=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/ipr2" --zero 3 "${args[@]}"
	# the shards read in place but copied, not mapped
	PORT=$(free_port)
	RL_ZERO3_NO_MAP=1 RL_TRAIN_TEST_SLOW_ADAMW=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/ipc2" --zero 3 "${args[@]}"
	# 3 ranks: shards of unequal ends (the second and third not starting on
	# a page: their memfds' pads), each read from two others
	PORT=$(free_port)
	RL_TRAIN_TEST_SLOW_ADAMW=2 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 3 "$TD/ipd3" --zero 3 "${args[@]}"
	PORT=$(free_port)
	RL_ZERO3_NO_DIRECT=1 TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 3 "$TD/ipr3" --zero 3 "${args[@]}"
	# rank 1 alone refuses (RL_ZERO3_NO_DIRECT=1): rank 0, which could map
	# it, must gather through the ring too, or the ranks' collectives differ
	PORT=$(free_port)
	RL_ZERO3_NO_DIRECT=1 rl-train -q -m "$TD/big/m0" --out "$TD/ipx2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --zero 3 "${args[@]}" "$S" 3>&- 2>"$TD/ipx2.err.1" &
	rank1=$!
	PIDS="$PIDS $rank1"
	rl-train -q -m "$TD/big/m0" --out "$TD/ipx2" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --metrics "$TD/ipx2.metrics.0" --zero 3 "${args[@]}" "$S"
	# rank 1 by its pid: a bare wait would also wait for bats' own
	# BATS_TEST_TIMEOUT watchdog, a background job of this shell
	wait "$rank1"
	for w in 2 3; do cmp "$TD/ipr$w/step-00000003/model.safetensors" "$TD/ipd$w/step-00000003/model.safetensors"; done
	cmp "$TD/ipr2/step-00000003/model.safetensors" "$TD/ipc2/step-00000003/model.safetensors"
	cmp "$TD/ipr2/step-00000003/model.safetensors" "$TD/ipx2/step-00000003/model.safetensors"
	# and the ring's weights are the 1-rank ones (within the tolerance)
	rl-train -q -m "$TD/big/m0" --out "$TD/ip1" --metrics "$TD/ip1.m" "${args[@]}" "$S"
	run -0 close "$TD/ip1/step-00000003/model.safetensors" "$TD/ipd2/step-00000003/model.safetensors"
	python3 - "$TD/ipd2.metrics.0" "$TD/ipr2.metrics.0" "$TD/ipd3.metrics.0" "$TD/ipr3.metrics.0" "$TD/ipx2.metrics.0" \
	    "$TD/ipc2.metrics.0" <<'PY'
import json, sys
d2, r2, d3, r3, x0, c2 = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert len(d2) == len(r2) == len(d3) == len(r3) == len(x0) == len(c2) == 3
for d, r in ((d2, r2), (d3, r3), (c2, r2)):
    for a, b in zip(d, r):
        assert a["dp/shards_in_place"] == 1 and b["dp/shards_in_place"] == 0, (a["dp/shards_in_place"], b["dp/shards_in_place"])
        for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert a[k] == b[k], (k, a[k], b[k])
        assert a["dp/units_gathered"] == b["dp/units_gathered"] > 0, (a, b)
        # the other shards are mapped, not copied: the measured parameter
        # memory is the ring's (the shard plus the units in use)
        assert a["memory/params_resident_mb"] <= 1.01 * b["memory/params_resident_mb"], (a, b)
        assert a["memory/params_resident_mb"] < 0.8 * a["memory/weights_mb"], a
for d in (d2, d3):
    for a in d:
        # every unit of this model has whole pages in each owner's part: at
        # least one mapped range per unit gathered (a unit split between two
        # shards is two), none from the pool
        assert a["dp/units_mapped"] >= a["dp/units_gathered"] and a["dp/units_pooled"] == 0, a
for a, b in zip(c2, r2):
    assert a["dp/units_mapped"] == 0 and b["dp/units_mapped"] == 0, (a, b)
# rank 0 (the metrics' writer) did not refuse, rank 1 did
assert all(m["dp/shards_in_place"] == 0 for m in x0), [m["dp/shards_in_place"] for m in x0]
PY
}

@test "ZeRO-3 with a reference model: GRPO's KL term and DPO on 2 ranks = ZeRO-2 bitwise, = 1 rank; the reference's memory about its shard" {
	# GRPO with a KL term against another model (--ref), 2 mini-batches and
	# micro-batches of 40 tokens: the reference's forward in every micro-batch,
	# gather-only on a rank without one
	args=(--batch 4 --lr 1e-2 --mini-batches 2 --max-tokens-per-micro 40 --bucket-mb 0.01
	    --kl k3 --kl-coef 0.1 --ref "$TD/m1")
	rl-train -q -m "$TD/m0" --out "$TD/kr1" --metrics "$TD/kr1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/kr3" --zero 3 "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/kr2" --zero 2 "${args[@]}"
	cmp "$TD/kr3/latest/model.safetensors" "$TD/kr2/latest/model.safetensors"
	run -0 close "$TD/kr3/latest/model.safetensors" "$TD/kr1/latest/model.safetensors"
	run -0 same_losses "$TD/kr1.m" "$TD/kr3.metrics.0" 3
	python3 - "$TD/kr1.m" "$TD/kr2.metrics.0" "$TD/kr3.metrics.0" <<'PY'
import json, sys
a, b, c = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert len(a) == len(b) == len(c) == 3
for x, y, z in zip(a, b, c):
    assert y["actor/kl_loss"] == z["actor/kl_loss"], (y["actor/kl_loss"], z["actor/kl_loss"])
    assert abs(x["actor/kl_loss"] - z["actor/kl_loss"]) <= 1e-6 + 1e-4 * abs(x["actor/kl_loss"])
assert all(m["actor/kl_loss"] > 1e-4 for m in a), [m["actor/kl_loss"] for m in a]
PY
	# PPO (value head) with --recompute and units kept between passes
	# (--zero3-keep): the policy's kept units beside the reference's gathers
	pargs=(--algo ppo --batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01 --recompute
	    --kl k1 --kl-coef 0.05 --ref "$TD/m1" --max-steps 2)
	for z in 2 3; do
		PORT=$(free_port)
		train_world 2 "$TD/kp$z" --zero $z --zero3-keep 20000 "${pargs[@]}"
	done
	cmp "$TD/kp3/latest/model.safetensors" "$TD/kp2/latest/model.safetensors"
	cmp "$TD/kp3/latest/value_head.safetensors" "$TD/kp2/latest/value_head.safetensors"
	# DPO against --ref, 3 pairs a step on 2 ranks (one micro-batch short: its
	# reference round only gathers)
	dargs=(--algo dpo --batch 3 --lr 1e-2 --max-tokens-per-micro 64 --bucket-mb 0.01 --ref "$TD/m1")
	rl-train -q -m "$TD/m0" --out "$TD/ke1" --metrics "$TD/ke1.m" "${dargs[@]}" "$TD/pairs.jsonl"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/ke3" --zero 3 "${dargs[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/ke2" --zero 2 "${dargs[@]}"
	cmp "$TD/ke3/latest/model.safetensors" "$TD/ke2/latest/model.safetensors"
	run -0 close "$TD/ke3/latest/model.safetensors" "$TD/ke1/latest/model.safetensors"
	python3 - "$TD/ke1.m" "$TD/ke2.metrics.0" "$TD/ke3.metrics.0" <<'PY'
import json, sys
a, b, c = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
assert len(a) == len(b) == len(c) == 4
for x, y, z in zip(a, b, c):
    for k in ("actor/dpo_loss", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert y[k] == z[k], (k, y[k], z[k])
        assert abs(x[k] - z[k]) <= 1e-5 + 1e-4 * abs(x[k]), (k, x[k], z[k])
PY
	# memory: on the 8-layer model, the reference's resident parameters on rank
	# 0 at their peak over each step: the shard (1/2) plus the unit computed and
	# the one prefetched (a layer: 0.126 of the table) plus partial pages (0.76
	# measured), where ZeRO-2 holds the whole reference (1.0, as ZeRO-3 would
	# with the reference loaded whole); at the load the shard plus a 256 KiB
	# piece
	margs=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.05 --max-steps 2 --kl k3 --kl-coef 0.1
	    --ref "$TD/big/m1")
	for z in 2 3; do
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/big" train_world 2 "$TD/krm$z" --zero $z "${margs[@]}"
	done
	python3 - "$TD/krm2.metrics.0" "$TD/krm3.metrics.0" <<'PY'
import json, sys
z2, z3 = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
full = z2[0]["memory/weights_mb"]
for m in z2:
    assert m["memory/ref_params_resident_mb"] >= 0.98 * full, (m["memory/ref_params_resident_mb"], full)
    assert "memory/ref_load_params_resident_mb" not in m
for m in z3:
    r = m["memory/ref_params_resident_mb"] / full
    print("ref", m["step"], round(r, 3))
    assert 0.5 < r < 0.8, r
r = z3[0]["memory/ref_load_params_resident_mb"] / full
print("ref load", round(r, 3))
assert 0.5 <= r < 0.7, r
assert "memory/ref_load_params_resident_mb" not in z3[1]
PY
}

@test "ZeRO-3: a reference model that does not fit is refused on every rank, each saying why" {
	# another vocabulary than the policy's
	mkdir -p "$TD/rv"
	sed 's/"vocab_size":264/"vocab_size":300/' "$TD/cfg.json" > "$TD/rv/cfg.json"
	rl-train -q --init "$TD/rv/cfg.json" --tokenizer bytes --out "$TD/rv/m0" --seed 1
	SECONDS=0
	run -1 train_world 2 "$TD/bv" --zero 3 --batch 4 --max-steps 1 --kl k3 --ref "$TD/rv/m0"
	for r in 0 1; do
		grep -q "ref '$TD/rv/m0': vocab_size 300 in its config.json, the policy's is 264" "$TD/bv.err.$r"
	done
	# the same check for a whole reference (one rank)
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/bv1" --batch 4 --max-steps 1 --kl k3 --ref "$TD/rv/m0" "$TD/s.jsonl"
	[[ "$stderr" == *"vocab_size 300 in its config.json, the policy's is 264"* ]]
	# tensors whose shapes are not its config's (intermediate_size changed)
	cp -r "$TD/m1" "$TD/rs"
	sed -i 's/"intermediate_size":[[:space:]]*64/"intermediate_size": 96/' "$TD/rs/config.json"
	grep -q '"intermediate_size": 96' "$TD/rs/config.json"
	PORT=$(free_port)
	run -1 train_world 2 "$TD/bs" --zero 3 --batch 4 --max-steps 1 --kl k3 --ref "$TD/rs"
	for r in 0 1; do
		grep -q "rs/model.safetensors': tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[64, 32\], config.json implies \[96, 32\]" "$TD/bs.err.$r"
	done
	# a NaN in rank 1's shard of the reference (layer 1, the upper half): rank
	# 1 names it, rank 0 says a rank could not read its shard
	cp -r "$TD/m1" "$TD/rn"
	python3 - "$TD/rn/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
t = json.loads(b[8:8 + n])["model.layers.1.mlp.down_proj.weight"]
at = 8 + n + t["data_offsets"][0] + 5 * 4
b[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(b)
PY
	PORT=$(free_port)
	run -1 train_world 2 "$TD/bn" --zero 3 --batch 4 --max-steps 1 --kl k3 --ref "$TD/rn"
	grep -q "model.layers.1.mlp.down_proj.weight' has 1 non-finite values" "$TD/bn.err.1"
	grep -q "rank 0: 1 other rank could not read its shard of the reference model" "$TD/bn.err.0"
	[ "$SECONDS" -lt 60 ]
	[ ! -e "$TD/bv/latest" ] && [ ! -e "$TD/bs/latest" ] && [ ! -e "$TD/bn/latest" ]
}

@test "ZeRO-3 load: a non-finite weight in rank 1's shard stops both ranks, each saying why" {
	mkdir -p "$TD/nan"
	cp -r "$TD/big/m0" "$TD/nan/m0"
	# element 5 of the last layer's down_proj (rank 1's half of the table) NaN
	python3 - "$TD/nan/m0/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
t = json.loads(b[8:8 + n])["model.layers.7.mlp.down_proj.weight"]
assert t["dtype"] == "F32", t
at = 8 + n + t["data_offsets"][0] + 5 * 4
b[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(b)
PY
	SECONDS=0
	TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/nan" run -1 train_world 2 "$TD/nz" --zero 3 --batch 4 --max-steps 1
	[ "$SECONDS" -lt 30 ]
	grep -q "model.layers.7.mlp.down_proj.weight' has 1 non-finite values among its elements .* (the first, element 5, is nan)" "$TD/nz.err.1"
	grep -q "rank 0: 1 other rank could not read its shard of the model" "$TD/nz.err.0"
	[ ! -e "$TD/nz/latest" ]
}

@test "ZeRO-3 load from a bf16 checkpoint: the f32 master weights, read per shard; resumed = ZeRO-2 resumed, bitwise" {
	mkdir -p "$TD/bf"
	sed 's/"float32"/"bfloat16"/' "$TD/cfg.json" > "$TD/bf/cfg.json"
	rl-train -q --init "$TD/bf/cfg.json" --tokenizer bytes --out "$TD/bf/m0" --seed 1
	args=(--batch 4 --lr 1e-2)
	for z in 2 3; do
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/bf" train_world 2 "$TD/bz$z" --zero $z --max-steps 2 "${args[@]}"
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/bf" train_world 2 "$TD/bz$z" --zero $z --max-steps 3 --resume "${args[@]}"
		[ "$(readlink "$TD/bz$z/latest")" = step-00000003 ]
	done
	python3 - "$TD/bz3/step-00000002/optimizer.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert [k for k in h if k.endswith(".master")], sorted(h)
PY
	cmp "$TD/bz3/step-00000003/model.safetensors" "$TD/bz2/step-00000003/model.safetensors"
	python3 tests/fixtures/parallel/opt_gather.py "$TD/bz3/step-00000003" "$TD/bz3.opt"
	python3 tests/fixtures/parallel/opt_gather.py "$TD/bz2/step-00000003" "$TD/bz2.opt"
	cmp "$TD/bz3.opt" "$TD/bz2.opt"
}

@test "ZeRO-3, reward model (--algo rm): the new score head, then score.weight read at a resume; = ZeRO-2 bitwise" {
	python3 - > "$TD/rmpairs.jsonl" <<'PY'
import json, random
random.seed(5)
w = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
for i in range(12):
    print(json.dumps({"prompt": " ".join(random.choice(w) for _ in range(3)) + ":",
                      "chosen": " " + " ".join(random.choice(w) for _ in range(2)),
                      "rejected": " " + " ".join(random.choice(w) for _ in range(3))}))
PY
	args=(--algo rm --batch 4 --lr 1e-2)
	for z in 2 3; do
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/rmpairs.jsonl" train_world 2 "$TD/rm$z" --zero $z --max-steps 2 "${args[@]}"
		PORT=$(free_port)
		TRAIN_WORLD_DATA="$TD/rmpairs.jsonl" train_world 2 "$TD/rm$z" --zero $z --max-steps 3 --resume "${args[@]}"
		[ "$(readlink "$TD/rm$z/latest")" = step-00000003 ]
	done
	for d in step-00000002 step-00000003; do
		cmp "$TD/rm3/$d/model.safetensors" "$TD/rm2/$d/model.safetensors"
	done
	grep -q '"score.weight"' "$TD/rm3/step-00000003/model.safetensors"
}

@test "ZeRO-3 resharded: PPO on 4 ranks -> 2 ranks, each reading its shard and the value head; = ZeRO-2 bitwise" {
	args=(--algo ppo --batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01)
	for z in 2 3; do
		PORT=$(free_port)
		train_world 4 "$TD/v$z" --zero $z --max-steps 2 "${args[@]}"
		PORT=$(free_port)
		train_world 2 "$TD/v$z" --zero $z --max-steps 3 --resume "${args[@]}"
		[ "$(readlink "$TD/v$z/latest")" = step-00000003 ]
	done
	for f in model.safetensors value_head.safetensors; do
		cmp "$TD/v3/step-00000003/$f" "$TD/v2/step-00000003/$f"
	done
	python3 tests/fixtures/parallel/opt_gather.py "$TD/v3/step-00000003" "$TD/v3.opt"
	python3 tests/fixtures/parallel/opt_gather.py "$TD/v2/step-00000003" "$TD/v2.opt"
	cmp "$TD/v3.opt" "$TD/v2.opt"
}

@test "ZeRO-3 checkpoint: 2 ranks -> 1 rank without ZeRO = 3 steps of 1 rank" {
	args=(--batch 4 --lr 1e-2 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/r1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/r2" --zero 3 --max-steps 2 "${args[@]}"
	[ -s "$TD/r2/step-00000002/optimizer-00001-of-00002.safetensors" ]
	rl-train -q --out "$TD/r2" --resume --max-steps 3 --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	[ "$(readlink "$TD/r2/latest")" = step-00000003 ]
	run -0 close "$TD/r2/latest/model.safetensors" "$TD/r1/latest/model.safetensors"
	run -0 close "$TD/r2/latest/optimizer.safetensors" "$TD/r1/latest/optimizer.safetensors" 1e-7 1e-2
}

@test "ZeRO-3 in queue mode: 2 ranks, rank 0 leasing, train the steps of 1 rank on the file" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -k 100
	QURL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q -s scored "$QURL" "$TD/s.jsonl"
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01)
	rl-train -q -m "$TD/m0" --out "$TD/u1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/u2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --zero 3 \
	    --queue "$QURL" "${args[@]}" 3>&- 2>"$TD/u2.err.1" &
	r1=$!
	PIDS="$PIDS $r1"
	run -0 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/u2" --rank 0 --world 2 --rendezvous \
	    "127.0.0.1:$PORT" --zero 3 --queue "$QURL" --idle-exit 1 --metrics "$TD/u2.metrics" "${args[@]}"
	wait "$r1"
	[ "$(readlink "$TD/u2/latest")" = step-00000003 ]
	run -0 close "$TD/u2/latest/model.safetensors" "$TD/u1/latest/model.safetensors"
	rl-queue stat "$QURL" | grep -q '^done 48 '
}

@test "ZeRO-3: a rank killed while training stops the other at once, exit 1, no crash" {
	# 100 steps on the 8-layer model: the kill lands inside the passes, where
	# gathers (and prefetches on their thread) are in flight
	python3 tests/fixtures/train/mkscored.py 400 4 0 > "$TD/long.jsonl"
	for r in 1 0; do
		rl-train -q -m "$TD/big/m0" --out "$TD/kz" --rank $r --world 2 --rendezvous "127.0.0.1:$PORT" --zero 3 \
		    --batch 4 --max-tokens-per-micro 40 --metrics /dev/null "$TD/long.jsonl" 3>&- 2>"$TD/kz.err.$r" &
		eval "r$r=\$!"
		PIDS="$PIDS $!"
	done
	sleep 3
	kill -0 "$r0"   # still training
	kill -9 "$r1"
	start=$SECONDS
	rc0=0; wait "$r0" || rc0=$?
	cat "$TD/kz.err.0"
	[ $rc0 = 1 ]
	[ $((SECONDS - start)) -lt 15 ]   # RL_COMM_TIMEOUT is 60 s: this is the dropped connection
	grep -q "rank 1" "$TD/kz.err.0"
}

@test "--zero 2 with LoRA is refused clearly; bad --zero values" {
	# (--zero 3 with LoRA shards the frozen base: rl-train-lora.bats)
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/xl" --zero 2 --lora-rank 2 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank with --zero 2"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x4" --zero 4 "$TD/s.jsonl"
	[[ "$stderr" == *"--zero takes 0, 1, 2 or 3"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/xk" --zero 3 --zero3-keep -5 "$TD/s.jsonl"
	[[ "$stderr" == *"--zero3-keep: bad value '-5'"* ]]
}

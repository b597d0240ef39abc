#!/usr/bin/env bats
# rl-train --zero 2 on the CPU backend (several processes on 127.0.0.1):
# - 2 and 4 ranks give the losses and weights of 1 rank without ZeRO, for
#   GRPO, PPO (value head, --recompute) and DPO, with micro-batches, mini-batches and
#   epochs, and ranks with fewer micro-batches than others;
#   with one micro-batch per rank, bitwise ZeRO-1's weights;
# - each rank's gradient memory, measured from its resident pages, is about
#   its shard plus the layers in flight, against the whole buffer for ZeRO-1;
# - ZeRO-2 saves the AdamW state per shard (ZeRO-1's format): resumed on 1
#   rank without ZeRO and from 4 ranks on 2 with --zero 1; queue mode (rank 0
#   leasing for both) trains the steps of the file;
# - --zero 4 and --zero 2 with LoRA are refused with a clear message
#   (--zero 3: rl-train-zero3.bats).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load zero_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# 12 groups of 4, responses of 1 to 10 tokens: 3 steps of 4 groups
	python3 tests/fixtures/train/mkscored.py 12 4 0 > "$TD/s.jsonl"
}


@test "ZeRO-2, GRPO: 2 and 4 ranks = 1 rank (losses, weights, optimizer state); 1 micro-batch: bitwise ZeRO-1" {
	args=(--batch 4 --lr 1e-2 --loss-agg seq-mean-token-mean --mini-batches 2 --ppo-epochs 2
	    --max-tokens-per-micro 40 --bucket-mb 0.01 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/g1" --metrics "$TD/g1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/g2" --zero 2 "${args[@]}"
	PORT=$(free_port)
	train_world 4 "$TD/g4" --zero 2 "${args[@]}"
	for w in 2 4; do
		[ "$(readlink "$TD/g$w/latest")" = step-00000003 ]
		run -0 close "$TD/g$w/latest/model.safetensors" "$TD/g1/latest/model.safetensors"
		# the shards' moments put together (opt_gather.py reads the documented format)
		python3 tests/fixtures/parallel/opt_gather.py "$TD/g$w/latest" "$TD/g$w.opt"
		run -0 close "$TD/g$w.opt" "$TD/g1/latest/optimizer.safetensors" 1e-7 1e-2
		run -0 same_losses "$TD/g1.m" "$TD/g$w.metrics.0" 2
	done
	# not blind: one step fewer is far off
	run -1 close "$TD/g4/step-00000002/model.safetensors" "$TD/g1/latest/model.safetensors"
	# one micro-batch per rank and update: the shard holds a + b, as ZeRO-1's
	args=(--batch 4 --lr 1e-2 --bucket-mb 0.01 --dp-check-every 1)
	PORT=$(free_port)
	train_world 2 "$TD/b1" --zero 1 "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/b2" --zero 2 "${args[@]}"
	cmp "$TD/b1/latest/model.safetensors" "$TD/b2/latest/model.safetensors"
	# the moments, bitwise (the shard files differ in their checkpoint ids)
	python3 tests/fixtures/parallel/opt_gather.py "$TD/b1/latest" "$TD/b1.opt"
	python3 tests/fixtures/parallel/opt_gather.py "$TD/b2/latest" "$TD/b2.opt"
	run -0 python3 tests/fixtures/parallel/st_close.py "$TD/b2.opt" "$TD/b1.opt" 0 0
	[[ "$output" == *"max |diff| 0 over"* ]]
	# without the overlap (every bucket reduced after the backward pass): the same sums
	PORT=$(free_port)
	train_world 2 "$TD/b3" --zero 2 --no-dp-overlap "${args[@]}"
	cmp "$TD/b2/latest/model.safetensors" "$TD/b3/latest/model.safetensors"
}

@test "ZeRO-2, PPO (value head) with --recompute: 2 and 4 ranks = 1 rank" {
	args=(--algo ppo --batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01 --dp-check-every 1 --recompute)
	rl-train -q -m "$TD/m0" --out "$TD/p1" --metrics "$TD/p1.m" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/p2" --zero 2 "${args[@]}"
	PORT=$(free_port)
	train_world 4 "$TD/p4" --zero 2 "${args[@]}"
	for w in 2 4; do
		run -0 close "$TD/p$w/latest/model.safetensors" "$TD/p1/latest/model.safetensors"
		run -0 same_losses "$TD/p1.m" "$TD/p$w.metrics.0" 2
	done
	grep -q '"critic/vf_loss"' "$TD/p4.metrics.0"
}

@test "ZeRO-2, DPO: 2 ranks with uneven micro-batch counts (1 and 2 pairs) and 4 ranks = 1 rank" {
	word_pairs 12 > "$TD/pairs.jsonl"
	# 3 pairs a step, one pair per micro-batch: on 2 ranks one rank has a round
	# without a micro-batch, and hands over zeros
	args=(--algo dpo --batch 3 --lr 1e-2 --max-tokens-per-micro 64 --bucket-mb 0.01)
	rl-train -q -m "$TD/m0" --out "$TD/d1" --metrics /dev/null "${args[@]}" "$TD/pairs.jsonl"
	[ "$(readlink "$TD/d1/latest")" = step-00000004 ]
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 2 "$TD/d2" --zero 2 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$TD/pairs.jsonl" train_world 4 "$TD/d4" --zero 2 "${args[@]}"
	run -0 close "$TD/d2/latest/model.safetensors" "$TD/d1/latest/model.safetensors"
	run -0 close "$TD/d4/latest/model.safetensors" "$TD/d1/latest/model.safetensors"
	run -1 close "$TD/d4/step-00000003/model.safetensors" "$TD/d1/latest/model.safetensors"
}

@test "ZeRO-2: each rank's resident gradient memory is about its shard, measured" {
	# 8 layers, so that the shard dominates the layer being differentiated
	deep_model "$TD/big"
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.05 --max-steps 2)
	# train_world runs $TD/m0 on $TRAIN_WORLD_DATA
	S="$TD/s.jsonl"
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/q21" --zero 1 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 2 "$TD/q22" --zero 2 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$S" TD="$TD/big" train_world 4 "$TD/q42" --zero 2 "${args[@]}"
	python3 - "$TD/q21.metrics.0" "$TD/q22.metrics.0" "$TD/q42.metrics.0" <<'PY'
import json, sys
one, two, four = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
full = one[0]["memory/grads_mb"]
for m in one:
    # ZeRO-1 keeps the whole buffer resident
    assert m["memory/grads_resident_mb"] >= 0.98 * full, (m["memory/grads_resident_mb"], full)
# ZeRO-2: the shard (1/N) + the layer being differentiated (1/8 of the
# layers) + the embedding + 2 buckets in flight; measured 0.75-0.79 (N=2)
# and 0.33-0.54 (N=4) of the buffer
for ms, n, most in ((two, 2, 0.85), (four, 4, 0.62)):
    for m in ms:
        r = m["memory/grads_resident_mb"] / full
        assert 1.0 / n < r < most, (n, r)
PY
}

@test "ZeRO-2 checkpoints per shard: 2 ranks -> 1 rank without ZeRO, 4 ranks -> 2 ranks --zero 1, = 1 rank" {
	args=(--batch 4 --lr 1e-2 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/r1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/r2" --zero 2 --max-steps 2 "${args[@]}"
	[ "$(readlink "$TD/r2/latest")" = step-00000002 ]
	# the AdamW state as ZeRO-1 saves it: one file per rank, optimizer.safetensors their index
	[ -s "$TD/r2/step-00000002/optimizer-00000-of-00002.safetensors" ]
	[ -s "$TD/r2/step-00000002/optimizer-00001-of-00002.safetensors" ]
	rl-train -q --out "$TD/r2" --resume --max-steps 3 --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	[ "$(readlink "$TD/r2/latest")" = step-00000003 ]
	run -0 close "$TD/r2/latest/model.safetensors" "$TD/r1/latest/model.safetensors"
	run -0 close "$TD/r2/latest/optimizer.safetensors" "$TD/r1/latest/optimizer.safetensors" 1e-7 1e-2
	# 4 ranks of ZeRO-2 for 2 steps, step 3 on 2 ranks of ZeRO-1 (each reads its new range)
	PORT=$(free_port)
	train_world 4 "$TD/r4" --zero 2 --max-steps 2 "${args[@]}"
	[ -s "$TD/r4/step-00000002/optimizer-00003-of-00004.safetensors" ]
	PORT=$(free_port)
	train_world 2 "$TD/r4" --zero 1 --max-steps 3 --resume "${args[@]}"
	[ "$(readlink "$TD/r4/latest")" = step-00000003 ]
	run -0 close "$TD/r4/latest/model.safetensors" "$TD/r1/latest/model.safetensors"
	# and a shard missing is refused, naming it
	rm "$TD/r4/step-00000003/optimizer-00001-of-00002.safetensors"
	run -1 --separate-stderr rl-train -q --out "$TD/r4" --resume --max-steps 4 --metrics /dev/null "${args[@]}" \
	    "$TD/s.jsonl"
	[[ "$stderr" == *"optimizer-00001-of-00002.safetensors' is missing"* ]]
}

@test "ZeRO-2 in queue mode: 2 ranks, rank 0 leasing, train the steps of 1 rank on the file" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -k 100
	QURL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q -s scored "$QURL" "$TD/s.jsonl"
	args=(--batch 4 --lr 1e-2 --max-tokens-per-micro 40 --bucket-mb 0.01 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/u1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/u2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --zero 2 \
	    --queue "$QURL" "${args[@]}" 3>&- 2>"$TD/u2.err.1" &
	r1=$!
	PIDS="$PIDS $r1"
	run -0 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/u2" --rank 0 --world 2 --rendezvous \
	    "127.0.0.1:$PORT" --zero 2 --queue "$QURL" --idle-exit 1 --metrics "$TD/u2.metrics" "${args[@]}"
	wait "$r1"
	[ "$(readlink "$TD/u2/latest")" = step-00000003 ]
	run -0 close "$TD/u2/latest/model.safetensors" "$TD/u1/latest/model.safetensors"
	rl-queue stat "$QURL" | grep -q '^done 48 '
}

@test "--zero 4 and --zero 2 with LoRA are refused clearly" {
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x4" --zero 4 "$TD/s.jsonl"
	[[ "$stderr" == *"--zero takes 0, 1, 2 or 3"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/xl" --zero 2 --lora-rank 2 "$TD/s.jsonl"
	[[ "$stderr" == *"--lora-rank with --zero 2"* ]]
}

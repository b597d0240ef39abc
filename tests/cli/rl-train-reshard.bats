#!/usr/bin/env bats
# rl-train --zero 1 saves the AdamW state per rank (optimizer-RRRRR-of-
# WWWWW.safetensors, docs/parallel.md) and --resume reads it back on another
# world size or with --zero changed:
# - 4 ranks -> 2 ranks (--zero 1) -> 1 rank, and 1 rank -> 2 ranks (--zero
#   1): each resumed step is bitwise the step of the same resume without
#   ZeRO, or from the state put together into one file (the reference path:
#   the whole state read by rank 0 and broadcast), and the chain ends within
#   fp32 tolerance of an uninterrupted single-rank run;
# - a bf16 model: the f32 master weights in the index, the same resume;
# - a shard missing, a shard of another run, a shard of another step: each
#   refused, naming the file.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load zero_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# 16 groups of 4: 4 steps of 4 groups
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$TD/s.jsonl"
}

# Tolerance of the single-rank comparison: see rl-train-dp.bats (reduction
# order over 4, 2 and 1 ranks; measured ~5e-6 at lr 1e-2).
close() { python3 tests/fixtures/parallel/st_close.py "$1" "$2" "${3:-2e-5}" "${4:-1e-4}" "${@:5}"; }
same() { cmp "$1" "$2"; }
# the policy loss of step N in a metrics file (fails unless a number)
loss() { jq -e -r "select(.step == $2) | .[\"actor/pg_loss\"] | numbers" "$1"; }
# same_loss A B N: step N's losses exist and are equal
same_loss() { local a b; a=$(loss "$1" "$3") && b=$(loss "$2" "$3") && [ "$a" = "$b" ]; }

args=(--batch 4 --lr 1e-2 --dp-check-every 1)

@test "resharding: 4 ranks -> 2 (--zero 1) -> 1, bitwise the resumes without shards; = 1 rank throughout" {
	rl-train -q -m "$TD/m0" --out "$TD/one" --metrics /dev/null --max-steps 4 "${args[@]}" "$TD/s.jsonl"
	train_world 4 "$TD/a" --zero 1 --max-steps 2 "${args[@]}"
	for r in 0 1 2 3; do [ -f "$TD/a/step-00000002/optimizer-0000$r-of-00004.safetensors" ]; done
	# the index holds no moments
	python3 - "$TD/a/step-00000002/optimizer.safetensors" <<'EOS'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert h["__metadata__"]["zero_shards"] == "4", h["__metadata__"]
assert not [k for k in h if "exp_avg" in k], sorted(h)
EOS
	cp -a "$TD/a" "$TD/aref"
	# 4 -> 2 ranks with --zero 1: each rank reads its half from 4 shards
	PORT=$(free_port)
	train_world 2 "$TD/a" --zero 1 --max-steps 3 --resume "${args[@]}"
	# the reference: 2 ranks without ZeRO, rank 0 reading all 4 shards;
	# 2 ranks of ZeRO-1 are bitwise plain data parallelism
	PORT=$(free_port)
	train_world 2 "$TD/aref" --max-steps 3 --resume "${args[@]}"
	same "$TD/a/step-00000003/model.safetensors" "$TD/aref/step-00000003/model.safetensors"
	same_loss "$TD/a.metrics.0" "$TD/aref.metrics.0" 3
	python3 tests/fixtures/parallel/opt_gather.py "$TD/a/step-00000003" "$TD/a3.opt"
	run -0 close "$TD/a3.opt" "$TD/aref/step-00000003/optimizer.safetensors" 0 0
	[ ! -e "$TD/a/step-00000003/optimizer-00002-of-00004.safetensors" ]
	# 2 -> 1 rank: from the 2 shards = from the one-file state of the reference
	rl-train -q --out "$TD/a" --resume --max-steps 4 --metrics "$TD/a1.metrics" "${args[@]}" "$TD/s.jsonl"
	rl-train -q --out "$TD/aref" --resume --max-steps 4 --metrics "$TD/aref1.metrics" "${args[@]}" "$TD/s.jsonl"
	same "$TD/a/step-00000004/model.safetensors" "$TD/aref/step-00000004/model.safetensors"
	same "$TD/a/step-00000004/optimizer.safetensors" "$TD/aref/step-00000004/optimizer.safetensors"
	same_loss "$TD/a1.metrics" "$TD/aref1.metrics" 4
	# and the whole chain is the single-rank run, up to the order of sums
	run -0 close "$TD/a/step-00000004/model.safetensors" "$TD/one/step-00000004/model.safetensors"
	run -0 close "$TD/a/step-00000004/optimizer.safetensors" "$TD/one/step-00000004/optimizer.safetensors" 1e-7 1e-2
}

@test "resharding: 1 rank -> 2 ranks with --zero 1 = 2 ranks without" {
	rl-train -q -m "$TD/m0" --out "$TD/b" --metrics /dev/null --max-steps 2 "${args[@]}" "$TD/s.jsonl"
	cp -a "$TD/b" "$TD/bref"
	train_world 2 "$TD/b" --zero 1 --max-steps 3 --resume "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/bref" --max-steps 3 --resume "${args[@]}"
	same "$TD/b/step-00000003/model.safetensors" "$TD/bref/step-00000003/model.safetensors"
	same_loss "$TD/b.metrics.0" "$TD/bref.metrics.0" 3
	python3 tests/fixtures/parallel/opt_gather.py "$TD/b/step-00000003" "$TD/b3.opt"
	run -0 close "$TD/b3.opt" "$TD/bref/step-00000003/optimizer.safetensors" 0 0
}

@test "resharding: a shard missing, of another run or of another step is refused, naming it" {
	train_world 2 "$TD/c" --zero 1 --max-steps 2 --save-every 1 "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/d" --zero 1 --max-steps 2 --save-every 1 "${args[@]}"
	s2=step-00000002
	# missing: on 1 rank, and on 2 ranks with --zero 1
	cp -a "$TD/c" "$TD/c1"
	rm "$TD/c1/$s2/optimizer-00001-of-00002.safetensors"
	run ! rl-train -q --out "$TD/c1" --resume --max-steps 3 --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	assert_output --partial "'$TD/c1/$s2/optimizer-00001-of-00002.safetensors' is missing: the checkpoint in '$TD/c1/$s2' was saved by 2 ranks"
	PORT=$(free_port)
	run ! train_world 2 "$TD/c1" --zero 1 --max-steps 3 --resume "${args[@]}"
	assert_output --partial "optimizer-00001-of-00002.safetensors' is missing"
	[ ! -e "$TD/c1/step-00000003" ]
	# the same step of another run (same shapes, another checkpoint id)
	cp -a "$TD/c" "$TD/c2"
	cp "$TD/d/$s2/optimizer-00001-of-00002.safetensors" "$TD/c2/$s2/"
	run ! rl-train -q --out "$TD/c2" --resume --max-steps 3 --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	assert_output --partial "'$TD/c2/$s2/optimizer-00001-of-00002.safetensors' is from another checkpoint"
	[ ! -e "$TD/c2/step-00000003" ]
	# another step of the same run
	cp -a "$TD/c" "$TD/c3"
	cp "$TD/c/step-00000001/optimizer-00000-of-00002.safetensors" "$TD/c3/$s2/"
	PORT=$(free_port)
	run ! train_world 2 "$TD/c3" --zero 1 --max-steps 3 --resume "${args[@]}"
	assert_output --regexp "optimizer-00000-of-00002.safetensors' is from another checkpoint: id [0-9a-f]+, step 1, AdamW step 1; its optimizer.safetensors says id [0-9a-f]+, step 2, AdamW step 2"
	[ ! -e "$TD/c3/step-00000003" ]
	# the untouched copy resumes
	PORT=$(free_port)
	train_world 2 "$TD/c" --zero 1 --max-steps 3 --resume "${args[@]}"
	[ "$(readlink "$TD/c/latest")" = step-00000003 ]
}

@test "resharding a bf16 model: the f32 master weights in the index; 2 ranks --zero 1 -> 1 rank = without ZeRO" {
	mkdir -p "$TD/bf"
	sed 's/"float32"/"bfloat16"/' "$TD/cfg.json" > "$TD/bf/cfg.json"
	rl-train -q --init "$TD/bf/cfg.json" --tokenizer bytes --out "$TD/bf/m0" --seed 1
	TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/bf" train_world 2 "$TD/e" --zero 1 --max-steps 2 "${args[@]}"
	PORT=$(free_port)
	TRAIN_WORLD_DATA="$TD/s.jsonl" TD="$TD/bf" train_world 2 "$TD/eref" --max-steps 2 "${args[@]}"
	python3 - "$TD/e/step-00000002/optimizer.safetensors" <<'EOS'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert h["__metadata__"]["zero_shards"] == "2", h["__metadata__"]
m = [k for k in h if k.endswith(".master")]
assert m and all(h[k]["dtype"] == "F32" for k in m), sorted(h)
assert not [k for k in h if "exp_avg" in k], sorted(h)
EOS
	rl-train -q --out "$TD/e" --resume --max-steps 3 --metrics "$TD/e1.metrics" "${args[@]}" "$TD/s.jsonl"
	rl-train -q --out "$TD/eref" --resume --max-steps 3 --metrics "$TD/eref1.metrics" "${args[@]}" "$TD/s.jsonl"
	same "$TD/e/step-00000003/model.safetensors" "$TD/eref/step-00000003/model.safetensors"
	same "$TD/e/step-00000003/optimizer.safetensors" "$TD/eref/step-00000003/optimizer.safetensors"
	same_loss "$TD/e1.metrics" "$TD/eref1.metrics" 3
}

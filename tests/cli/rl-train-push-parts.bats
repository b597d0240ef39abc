#!/usr/bin/env bats
# rl-train --push-parts: every rank pushes its part of each version to
# rl-sync (model-0000R-of-0000N.safetensors with its 1/N of the tensors;
# rank 0 also config.json, the index and the tokenizer), the server publishes
# the version when all are in (docs/sync.md, "A version pushed in parts"):
# the version a worker pulls holds the tensors of the checkpoint's
# model.safetensors byte for byte, and rl-rollout generates from it what it
# generates from the checkpoint; with --zero 3 (parameters sharded) the
# parts are the checkpoint's tensors too, and every version is built unit
# by unit (in the walk that writes the step's directory, or alone for a
# version only published): byte for byte --zero 2's versions and
# directories, with the shard and one unit resident (rank 0's
# memory/save_params_resident_mb and memory/publish_params_resident_mb),
# not the whole model; rank 0 failing to write a directory stops both ranks
# with the cause named and no part pushed.  Without --push-parts, a version
# only published goes to rl-sync whole, built unit by unit by rank 0:
# --zero 2's bytes, hashes and deltas, the shard and one unit resident; its
# push failing stops both ranks, each saying why.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load sync_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/s.jsonl"
	for i in $(seq 4); do echo "{\"prompt\":\"$i+$i=\"}"; done > "$TD/prompts.jsonl"
}

setup() {
	export RL_COMM_TIMEOUT=60
	T=$BATS_TEST_TMPDIR
	PIDS=""
	PORT=$(free_port)
	URL=tcp://127.0.0.1:$PORT
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

# same_tensors DIR FILE: every tensor of the sharded directory DIR (through
# its index) has the name, dtype, shape and bytes it has in FILE, and no
# tensor is missing
same_tensors() {
	python3 - "$1" "$2" <<'EOS'
import json, struct, sys
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
d, ref = sys.argv[1], read(sys.argv[2])
wm = json.load(open(d + "/model.safetensors.index.json"))["weight_map"]
got = {}
for f in sorted(set(wm.values())):
    t = read(d + "/" + f)
    assert all(wm[k] == f for k in t), f
    got.update(t)
assert sorted(got) == sorted(ref) == sorted(wm), (sorted(got), sorted(ref))
for k in ref:
    assert got[k] == ref[k], k
print(len(got), "tensors in", len(set(wm.values())), "files")
EOS
}

@test "--push-parts on 2 ranks: each version in 2 parts, pulled equal to the checkpoint's weights; rl-rollout generates the same" {
	serve
	PORT=$(free_port)
	train_world 2 "$TD/pp" --zero 1 --push-parts --sync "$URL" --batch 4 --lr 1e-2 --max-steps 2 --save-every 1
	rl-sync status "$URL" --json | jq -e '.latest == 2 and .versions_from_parts == 2 and .parts_refused == 0'
	rl-sync pull "$URL" --out "$T/w" -q
	w="$T/w/latest"
	[ "$(readlink "$w")" = v000002 ]
	[ -f "$w/model-00001-of-00002.safetensors" ] && [ -f "$w/model-00002-of-00002.safetensors" ]
	[ ! -e "$w/model.safetensors" ]
	run -0 same_tensors "$w" "$TD/pp/step-00000002/model.safetensors"
	cmp "$w/config.json" "$TD/pp/step-00000002/config.json"
	cmp "$w/tokenizer.json" "$TD/pp/step-00000002/tokenizer.json"
	# the parts split the bytes: neither holds nearly everything
	a=$(stat -c %s "$w/model-00001-of-00002.safetensors")
	b=$(stat -c %s "$w/model-00002-of-00002.safetensors")
	[ "$a" -lt $(( 3 * b )) ] && [ "$b" -lt $(( 3 * a )) ]
	# a worker loads it: greedy tokens as from the checkpoint directory
	rl-rollout -q -m "$w" -n 1 --max-tokens 4 --temperature 0 --seed 1 "$TD/prompts.jsonl" > "$T/a.out"
	rl-rollout -q -m "$TD/pp/step-00000002" -n 1 --max-tokens 4 --temperature 0 --seed 1 "$TD/prompts.jsonl" > "$T/b.out"
	[ -s "$T/a.out" ]
	cmp <(jq -c '[.response, .logprobs]' "$T/a.out") <(jq -c '[.response, .logprobs]' "$T/b.out")
}

@test "--push-parts on 2 ranks with --zero 3: the parts are the checkpoint's weights" {
	# ZeRO-3 gathers the model for a save; each rank then pushes its part
	serve
	PORT=$(free_port)
	train_world 2 "$TD/p3" --zero 3 --push-parts --sync "$URL" --batch 4 --lr 1e-2 --max-steps 2 --save-every 1
	rl-sync status "$URL" --json | jq -e '.latest == 2 and .versions_from_parts == 2 and .parts_refused == 0'
	rl-sync pull "$URL" --out "$T/w" -q
	run -0 same_tensors "$T/w/latest" "$TD/p3/step-00000002/model.safetensors"
	# and the checkpoint is --zero 1's on the same run (ZeRO-3 changes where
	# the parameters live, not the sums)
	PORT=$(free_port)
	train_world 2 "$TD/p1" --zero 1 --batch 4 --lr 1e-2 --max-steps 2 --save-every 1
	run -0 python3 tests/fixtures/parallel/st_close.py "$TD/p3/step-00000002/model.safetensors" \
	    "$TD/p1/step-00000002/model.safetensors" 2e-5 1e-4
}

# same_dir A B: the step directories A and B hold the same files, byte for
# byte, but for what names the save itself (the optimizer shards carry their
# save's id; trainer_state.json the wall-clock times)
same_dir() {
	diff -r -x 'optimizer*' -x trainer_state.json "$1" "$2"
}

# z3_units OUT ARGS...: 2 ranks on the 8-layer model with --push-parts to a
# fresh rl-sync server (--keep-previous: versions 3 and 4 pulled after) into
# $T/OUT.v/
z3_units() {
	local out=$1; shift
	URL=tcp://127.0.0.1:$(free_port)
	serve --keep-previous
	PORT=$(free_port)
	TD="$T/big" train_world 2 "$T/$out" --push-parts --batch 4 --lr 1e-2 --max-steps 4 --save-every 100 \
	    --keep 10 --sync "$URL" "$@"
	rl-sync status "$URL" --json | jq -e '.latest == 4 and .versions_from_parts == 4 and .parts_refused == 0'
	rl-sync pull "$URL" --out "$T/$out.v" --version 3 -q
	rl-sync pull "$URL" --out "$T/$out.v" --version 4 -q
	kill "$SPID"; wait "$SPID" 2>/dev/null || true
}

# params_mb METRICS NAME: {step: NAME / the whole model} of rank 0's metrics
params_mb() {
	python3 - "$1" "$2" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
full = ms[0]["memory/weights_mb"]
print(json.dumps({m["step"]: round(m[sys.argv[2]] / full, 3) for m in ms if sys.argv[2] in m}))
PY
}

@test "--push-parts with --zero 3: every version built unit by unit, with or without a directory; = ZeRO-2's bytes, below the whole model" {
	# the reference: --zero 2 (every rank holds the whole model; the parts
	# cut from it, the directories written from it).  --zero 3 with
	# --ckpt-every 1: every step writes a directory and pushes its part in
	# one walk over the units; --ckpt-every 2: step 3 writes no directory
	# (publish_units), steps 1, 2 and 4 do (the walk).  The model: 8 layers,
	# each small next to a rank's shard (as in rl-train-zero3.bats's memory
	# test)
	T=$BATS_TEST_TMPDIR
	deep_model "$T/big"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	export TRAIN_WORLD_DATA="$T/s16.jsonl"
	z3_units z2 --zero 2 --ckpt-every 1
	z3_units every --zero 3 --ckpt-every 1 -v -v
	z3_units half --zero 3 --ckpt-every 2 -v -v
	# the versions pulled: the reference's, file for file, byte for byte,
	# and the weights of ZeRO-2's checkpoint (read by Python)
	[ -f "$T/every.v/v000004/model-00002-of-00002.safetensors" ]
	for r in every half; do diff -r "$T/$r.v" "$T/z2.v"; done
	run -0 same_tensors "$T/half.v/v000003" "$T/z2/step-00000003/model.safetensors"
	run -0 same_tensors "$T/every.v/v000004" "$T/z2/step-00000004/model.safetensors"
	grep -q "pushed part 0 of 2 of version 4 (.*built unit by unit" "$T/every.err.0"
	grep -q "pushed part 1 of 2 of version 2 (.*built unit by unit" "$T/every.err.1"
	# the directories: ZeRO-2's, byte for byte
	for s in 1 2 3 4; do same_dir "$T/every/step-0000000$s" "$T/z2/step-0000000$s"; done
	for s in 1 2 4; do same_dir "$T/half/step-0000000$s" "$T/z2/step-0000000$s"; done
	[ ! -e "$T/half/step-00000003" ]
	[ -s "$T/every/step-00000004/optimizer-00001-of-00002.safetensors" ]
	# rank 0's parameter memory (mincore) while each directory was written
	# and each version built: its shard (1/2) and one unit (a layer is 0.12
	# of the table), never the whole model, which a gathered save or publish
	# holds beside the shard (1.5)
	check() {
		python3 - "$@" <<'PY'
import json, sys
got, steps = json.loads(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
print(got)
assert sorted(int(s) for s in got) == steps, got
assert all(0.5 < x < 0.75 for x in got.values()), got
PY
	}
	run -0 check "$(params_mb "$T/every.metrics.0" memory/save_params_resident_mb)" 1,2,3,4
	run -0 check "$(params_mb "$T/every.metrics.0" memory/publish_params_resident_mb)" 1,2,3,4
	run -0 check "$(params_mb "$T/half.metrics.0" memory/save_params_resident_mb)" 1,2,4
	run -0 check "$(params_mb "$T/half.metrics.0" memory/publish_params_resident_mb)" 1,2,3,4
}

# z3_whole OUT ARGS...: z3_units without --push-parts: every version goes
# to rl-sync whole (from the step's directory, or built unit by unit by
# rank 0 on a step --ckpt-every writes none for), over the stream transport
# (deltas; shared memory sends none); versions 3 and 4 pulled, the
# server's status in $T/OUT.status
z3_whole() {
	local out=$1; shift
	URL=tcp://127.0.0.1:$(free_port)
	serve --keep-previous
	PORT=$(free_port)
	TD="$T/big" train_world 2 "$T/$out" --batch 4 --lr 1e-2 --max-steps 4 --save-every 100 --keep 10 \
	    --sync "$URL" --sync-transport stream "$@"
	rl-sync status "$URL" --json > "$T/$out.status"
	jq -e '.latest == 4 and .versions_from_parts == 0' "$T/$out.status"
	rl-sync pull "$URL" --out "$T/$out.v" --version 3 -q
	rl-sync pull "$URL" --out "$T/$out.v" --version 4 -q
	kill "$SPID"; wait "$SPID" 2>/dev/null || true
}

@test "--sync without --push-parts, --zero 3: a version only published goes whole, built unit by unit; = ZeRO-2's bytes, below the whole model" {
	# --ckpt-every 2 on 4 steps: step 3 writes no directory, rank 0 builds
	# the whole version from the units as they pass (publish_units) and
	# pushes it as a delta against version 2; version 4 is read from its
	# directory and goes as a delta against that one.  The reference:
	# --zero 2, where the version is cut from the whole model in memory
	T=$BATS_TEST_TMPDIR
	deep_model "$T/big"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	export TRAIN_WORLD_DATA="$T/s16.jsonl"
	z3_whole z2 --zero 2 --ckpt-every 2
	z3_whole z3 --zero 3 --ckpt-every 2 -v -v
	# both versions the server holds: ZeRO-2's, file for file, byte for byte
	[ -f "$T/z3.v/v000003/model.safetensors" ] && [ -f "$T/z3.v/v000004/model.safetensors" ]
	diff -r "$T/z3.v" "$T/z2.v"
	cmp "$T/z3.v/v000004/model.safetensors" "$T/z3/step-00000004/model.safetensors"
	# each pushed as a delta against the one before, with the same hashes
	jq -e '[.versions[] | [.version, .delta_base]] == [[4, 3], [3, 2]] or
	    [.versions[] | [.version, .delta_base]] == [[3, 2], [4, 3]]' "$T/z3.status"
	[ "$(jq -c '[.versions[] | .hash] | sort' "$T/z3.status")" = "$(jq -c '[.versions[] | .hash] | sort' "$T/z2.status")" ]
	[ ! -e "$T/z3/step-00000003" ]
	# rank 0's parameter memory while version 3 was built: its shard (1/2)
	# and one unit (a layer is 0.12 of the table), where gathering the
	# model for it held the whole table beside the shard (1.5); no measure
	# of the parameters' pages on step 3 reaches the whole model (the
	# step's own peak, two units beside the shard, is 0.76)
	python3 - "$T/z3.metrics.0" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
full = ms[0]["memory/weights_mb"]
m3 = {k: round(v / full, 3) for m in ms if m["step"] == 3 for k, v in m.items() if "params_resident" in k}
print(m3)
assert 0.5 < m3.get("memory/publish_params_resident_mb", 0) < 0.75, m3
assert all(x < 0.8 for x in m3.values()), m3
PY
	grep -q "published version 3 to .*built unit by unit" "$T/z3.err.0"
}

@test "--sync without --push-parts, --zero 3: rank 0 cannot publish a version built unit by unit: both ranks exit 1 saying why" {
	# --sync to a directory where a file already takes version 3's name:
	# versions 1 and 2 go in, version 3 (no step directory) cannot
	T=$BATS_TEST_TMPDIR
	deep_model "$T/big"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	mkdir "$T/sync"
	echo taken > "$T/sync/v000003"
	PORT=$(free_port)
	local args=(-q -m "$T/big/m0" --out "$T/o" --world 2 --rendezvous "127.0.0.1:$PORT" --zero 3 --sync "$T/sync"
	    --ckpt-every 2 --batch 4 --lr 1e-2 --max-steps 4 --save-every 100 "$T/s16.jsonl")
	rl-train --rank 1 "${args[@]}" 3>&- 2> "$T/err.1" &
	local p=$! rc=0
	PIDS="$PIDS $p"
	run -1 --separate-stderr rl-train --rank 0 "${args[@]}"
	echo "$stderr"
	[[ "$stderr" == *"cannot publish version 3 to '$T/sync'"* ]]
	wait "$p" || rc=$?
	cat "$T/err.1"
	[ "$rc" = 1 ]
	grep -q "rank 0 could not publish version 3 to '$T/sync'" "$T/err.1"
	[ -d "$T/sync/v000002" ] && [ "$(cat "$T/sync/v000003")" = taken ]
	[ ! -e "$T/o/step-00000003" ] && [ ! -e "$T/o/step-00000004" ]
}

@test "--push-parts with --zero 3, a bf16 model with PPO's value head: the walk and the full saves' second pass; = ZeRO-2's bytes" {
	# bf16: a full save (--save-every 2) writes the f32 master weights into
	# optimizer.safetensors after the model, a second pass over the units
	# after the walk; PPO: the value head's file after the model's
	T=$BATS_TEST_TMPDIR
	mkdir -p "$T/big"
	deep_model "$T/f32"
	sed 's/"torch_dtype":"float32"/"torch_dtype":"bfloat16"/' "$T/f32/cfg.json" > "$T/big/cfg.json"
	rl-train -q --init "$T/big/cfg.json" --tokenizer bytes --out "$T/big/m0" --seed 1
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	export TRAIN_WORLD_DATA="$T/s16.jsonl"
	args=(--ckpt-every 1 --algo ppo --save-every 2)
	z3_units z2 --zero 2 "${args[@]}"
	z3_units z3 --zero 3 "${args[@]}" -v -v
	diff -r "$T/z3.v" "$T/z2.v"
	head -c 400 "$T/z3.v/v000004/model-00001-of-00002.safetensors" | grep -q '"dtype":"BF16"'
	for s in 1 2 3 4; do same_dir "$T/z3/step-0000000$s" "$T/z2/step-0000000$s"; done
	# the full saves: the master weights' index (second pass) and the value head
	for s in 2 4; do [ -s "$T/z3/step-0000000$s/optimizer.safetensors" ]; done
	# the master weights in the index: ZeRO-2's tensors byte for byte (the
	# files differ in their save id only)
	python3 - "$T/z3/step-00000004/optimizer.safetensors" "$T/z2/step-00000004/optimizer.safetensors" <<'PY'
import json, struct, sys
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert len(a) > 50 and a == b, (len(a), sorted(set(a) ^ set(b))[:4])
print(len(a), "master weight tensors")
PY
	[ ! -e "$T/z3/step-00000003/optimizer.safetensors" ]
	[ -s "$T/z3/step-00000004/value_head.safetensors" ]
	grep -q "pushed part 1 of 2 of version 4 (.*built unit by unit" "$T/z3.err.1"
}

@test "--push-parts with --zero 3: rank 0 cannot write a step's directory: both ranks exit 1 saying why, no part pushed" {
	# rank 0 may write files of 512 KiB at most (SIGXFSZ ignored: write(2)
	# fails with EFBIG), the model's safetensors file is 2 MB: the step's
	# directory fails in the middle of the walk over the units, which rank
	# 0 still finishes (the other rank gathers with it), then tells rank 1
	T=$BATS_TEST_TMPDIR
	deep_model "$T/big"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	serve
	# fail2 STEPS ARGS...: rank 1 as is, rank 0 limited; both must exit 1
	fail2() {
		local steps=$1; shift
		PORT=$(free_port)
		local args=(-q -m "$T/big/m0" --out "$T/o" --world 2 --rendezvous "127.0.0.1:$PORT" --zero 3 --push-parts
		    --sync "$URL" --batch 4 --lr 1e-2 --max-steps "$steps" --save-every 100 "$@" "$T/s16.jsonl")
		rl-train --rank 1 "${args[@]}" 3>&- 2> "$T/err.1" &
		local p=$! rc=0
		PIDS="$PIDS $p"
		run -1 --separate-stderr bash -c 'trap "" XFSZ; ulimit -f 512; exec "$@"' sh rl-train --rank 0 "${args[@]}"
		echo "$stderr"
		[[ "$stderr" == *"File too large"* ]]
		wait "$p" || rc=$?
		cat "$T/err.1"
		[ "$rc" = 1 ]
	}
	# step 1, a full checkpoint: the optimizer shards' agreement says it
	fail2 1
	grep -q "rank 0 could not write step 1's checkpoint; no optimizer shard written" "$T/err.1"
	[ ! -e "$T/o/step-00000001" ]
	rl-sync status "$URL" --json | jq -e '.parts == null and .versions_from_parts == 0 and .latest == 0'
	# step 2 of a resumed run, a directory without optimizer state: rank 1
	# learns it from rank 0's end of the walk and pushes nothing
	rm -rf "$T/o"
	PORT=$(free_port)
	TD="$T/big" TRAIN_WORLD_DATA="$T/s16.jsonl" train_world 2 "$T/o" --zero 3 --push-parts --sync "$URL" --batch 4 \
	    --lr 1e-2 --max-steps 1 --save-every 100
	rl-sync status "$URL" --json | jq -e '.latest == 1 and .versions_from_parts == 1'
	fail2 3 --resume
	grep -q "rank 0 could not write step 2's checkpoint; this rank's part of the version not pushed" "$T/err.1"
	[ ! -e "$T/o/step-00000002" ]
	rl-sync status "$URL" --json | jq -e '.parts == null and .versions_from_parts == 1 and .latest == 1'
}

@test "--push-parts: usage errors" {
	run -2 rl-train -m "$TD/m0" --out "$T/x" --push-parts "$TD/s.jsonl"
	assert_output --partial "--push-parts needs --sync URL of an rl-sync server"
	run -2 rl-train -m "$TD/m0" --out "$T/x" --push-parts --sync "$T/dir" "$TD/s.jsonl"
	assert_output --partial "--push-parts needs --sync URL of an rl-sync server"
}

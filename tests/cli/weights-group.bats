#!/usr/bin/env bats
# The weights broadcast group (lib/sync/wgroup.c; rl-train --weights-group,
# rl-rollout --weights-group): on-policy through pipes, each version
# broadcast from the trainer's parameters over the CPU ring, gives bit for bit
# the weights of the same run through a checkpoint directory; with --zero 3
# on 2 ranks every version goes out unit by unit (in the walk that writes
# its directory, or alone), the worker holding the bytes --zero 2 sends,
# rank 0 below the whole model; a
# third rank; a killed trainer, a model of another shape and a rank that
# never joins fail fast with the cause named; usage errors.  Loopback only.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper
load sync_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	sed 's/"hidden_size":32/"hidden_size":16/' "$TD/cfg.json" > "$TD/cfg16.json"
	rl-train -q --init "$TD/cfg16.json" --tokenizer bytes --out "$TD/m16" --seed 3
	for i in $(seq 24); do echo '{"prompt":"x"}'; done > "$TD/p.jsonl"
	# the reference: the same run with its versions through a checkpoint directory
	rl-rollout -q -m "$TD/m0" --max-staleness 0 --train-batch 4 -n 4 --max-tokens 2 --seed 1 --weights-timeout 60 \
	    --weights-from "$TD/ck-dir" "$TD/p.jsonl" | rl-reward -q --task 'format:^[a-z]' |
		rl-train -q -m "$TD/m0" --out "$TD/ck-dir" --batch 4 --lr 3e-2 --metrics /dev/null
}

setup() {
	PIDS=""
	ADDR="127.0.0.1:$(free_port)"
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

# gen ARGS...: the on-policy generator of these tests.  exec: a worker of the
# group waits at its end for the trainer's, with its output closed; a shell
# left between it and the pipe would hold the pipe open, and the trainer
# would never see the end of its input
gen() {
	exec rl-rollout -m "$TD/m0" --max-staleness 0 --train-batch 4 -n 4 --max-tokens 2 --seed 1 --weights-timeout 60 "$@"
}

@test "on-policy through the group: the same weights, bit for bit, as through a checkpoint directory" {
	gen -v --weights-group "$ADDR" --weights-group-rank 1 --weights-group-size 2 "$TD/p.jsonl" 2> "$TD/gen.err" |
		rl-reward -q --task 'format:^[a-z]' |
		rl-train -v -m "$TD/m0" --out "$TD/ck-grp" --batch 4 --lr 3e-2 --metrics "$TD/m.jsonl" \
		    --weights-group "$ADDR" --weights-group-size 2 2> "$TD/train.err"
	[ "$(readlink "$TD/ck-grp/latest")" = step-00000006 ]
	cmp "$TD/ck-dir/step-00000006/model.safetensors" "$TD/ck-grp/step-00000006/model.safetensors"
	! cmp -s "$TD/m0/model.safetensors" "$TD/ck-grp/step-00000006/model.safetensors" || false
	grep -q "weights group: rank 1 of 2 on $ADDR, cpu backend" "$TD/gen.err"
	grep -q "weights version 5 taken" "$TD/gen.err"
	python3 -c '
import json, sys
assert [json.loads(l)["staleness/max"] for l in open(sys.argv[1])] == [0] * 6' "$TD/m.jsonl"
}

# z3_run NAME ARGS...: rl-train --zero 3 on 2 ranks (the 8-layer model in
# $T/big; -v -v: verbose after train_world's -q) with the group, a worker
# of the group taking its versions beside it; the worker's log in
# $T/NAME.gen, the trainer's in $T/NAME.err.R, its metrics in
# $T/NAME.metrics.R
z3_run() {
	local name=$1; shift
	ADDR="127.0.0.1:$(free_port)"
	rl-rollout -v -m "$T/big/m0" -n 1 --max-tokens 2 --weights-group "$ADDR" --weights-group-rank 1 \
	    --weights-group-size 2 --weights-timeout 60 -o /dev/null "$TD/p2.jsonl" 2> "$T/$name.gen" 3>&- &
	local g=$!; PIDS="$PIDS $g"
	TD="$T/big" train_world 2 "$T/$name" --zero 3 --batch 4 --lr 1e-2 --max-steps 4 --save-every 100 \
	    --keep 10 -v -v --weights-group "$ADDR" --weights-group-size 2 "$@"
	wait "$g"
}

# received NAME: "version xxh64 ranges" of each version the worker received
received() {
	sed -n 's/.*weights group: version \([0-9]*\) received, [0-9]* elements in \([0-9]*\) ranges\{0,1\}, xxh64 \([0-9a-f]*\)$/\1 \3 \2/p' \
	    "$T/$1.gen"
}

@test "--zero 3 on 2 ranks: every version goes to the group unit by unit, with or without a directory (and --push-parts or a whole --sync); = ZeRO-2's bytes, below the whole model" {
	# the reference: --zero 2, where every rank holds the whole model and
	# each version goes in one broadcast of the table.  --zero 3 with
	# --ckpt-every 1: every step writes its directory and sends the version
	# in the same walk over the units, one range per unit (embedding, 8
	# layers, head); --ckpt-every 2: step 3 writes no directory
	# (publish_units), steps 1, 2 and 4 do (the walk)
	T=$BATS_TEST_TMPDIR
	export RL_COMM_TIMEOUT=60
	deep_model "$T/big"
	python3 tests/fixtures/train/mkscored.py 16 4 0 > "$T/s16.jsonl"
	export TRAIN_WORLD_DATA="$T/s16.jsonl"
	head -n 2 "$TD/p.jsonl" > "$TD/p2.jsonl"
	PORT=$(free_port)
	z3_run z2 --ckpt-every 1 --zero 2
	PORT=$(free_port)
	z3_run every --ckpt-every 1
	PORT=$(free_port)
	z3_run units --ckpt-every 2
	for r in z2 every units; do received $r > "$T/$r.v"; done
	cat "$T/units.v"
	# versions 0 to 4: whole from ZeRO-2; in 10 ranges from ZeRO-3, version 0
	# sent from the shards when the group opens
	[ "$(cut -d' ' -f1,3 "$T/z2.v" | tr '\n' ,)" = "0 1,1 1,2 1,3 1,4 1," ]
	for r in every units; do [ "$(cut -d' ' -f1,3 "$T/$r.v" | tr '\n' ,)" = "0 10,1 10,2 10,3 10,4 10," ]; done
	# what the worker holds of each version: byte for byte (XXH64 of the
	# staging buffer) what ZeRO-2 sent
	for r in every units; do cmp <(cut -d' ' -f1,2 "$T/z2.v") <(cut -d' ' -f1,2 "$T/$r.v"); done
	grep -q "sent version 3 to the weights group unit by unit (10 ranges) in " "$T/units.err.0"
	grep -q "sent version 4 to the weights group unit by unit (10 ranges) with its directory" "$T/units.err.0"
	grep -q "sent version 3 to the weights group unit by unit (10 ranges) with its directory" "$T/every.err.0"
	# the checkpoints: ZeRO-2's, byte for byte (but for what names the save:
	# the optimizer shards' id, trainer_state.json's times)
	for s in 1 2 3 4; do diff -r -x 'optimizer*' -x trainer_state.json "$T/every/step-0000000$s" "$T/z2/step-0000000$s"; done
	for s in 1 2 4; do diff -r -x 'optimizer*' -x trainer_state.json "$T/units/step-0000000$s" "$T/z2/step-0000000$s"; done
	[ ! -e "$T/units/step-00000003" ]
	# rank 0's parameter memory (mincore) while each version went out and each
	# directory was written: its shard (1/2 of the model) and one unit (a
	# layer is 0.12), never the whole model a gathered send or save holds
	# beside the shard (1.5)
	below_whole() {
		python3 - "$@" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1])]
full = ms[0]["memory/weights_mb"]
got = {m["step"]: round(m[sys.argv[2]] / full, 3) for m in ms if sys.argv[2] in m}
print(sys.argv[2], got)
assert sorted(got) == [int(s) for s in sys.argv[3].split(",")], got
assert all(0.5 < x < 0.75 for x in got.values()), got
PY
	}
	run -0 below_whole "$T/every.metrics.0" memory/publish_params_resident_mb 1,2,3,4
	run -0 below_whole "$T/every.metrics.0" memory/save_params_resident_mb 1,2,3,4
	run -0 below_whole "$T/units.metrics.0" memory/publish_params_resident_mb 1,2,3,4
	run -0 below_whole "$T/units.metrics.0" memory/save_params_resident_mb 1,2,4
	# with --push-parts as well: the one walk builds each rank's part for
	# rl-sync and sends the group its ranges, with and without a directory
	URL=tcp://127.0.0.1:$(free_port)
	serve
	PORT=$(free_port)
	z3_run both --ckpt-every 2 --push-parts --sync "$URL"
	rl-sync status "$URL" --json | jq -e '.latest == 4 and .versions_from_parts == 4 and .parts_refused == 0'
	received both > "$T/both.v"
	cmp "$T/units.v" "$T/both.v"
	run -0 below_whole "$T/both.metrics.0" memory/publish_params_resident_mb 1,2,3,4
	run -0 below_whole "$T/both.metrics.0" memory/save_params_resident_mb 1,2,4
	kill "$SPID"; wait "$SPID" 2>/dev/null || true
	# with --sync without --push-parts: the walk of step 3 (no directory)
	# also builds rank 0's whole version for rl-sync, the same bytes as
	# ZeRO-2's directory of that step
	URL=tcp://127.0.0.1:$(free_port)
	serve --keep-previous
	PORT=$(free_port)
	z3_run whole --ckpt-every 2 --sync "$URL"
	received whole > "$T/whole.v"
	cmp "$T/units.v" "$T/whole.v"
	rl-sync pull "$URL" --out "$T/whole.w" --version 3 -q
	cmp "$T/whole.w/v000003/model.safetensors" "$T/z2/step-00000003/model.safetensors"
	grep -q "published version 3 to .*built unit by unit" "$T/whole.err.0"
	run -0 below_whole "$T/whole.metrics.0" memory/publish_params_resident_mb 1,2,3,4
	run -0 below_whole "$T/whole.metrics.0" memory/save_params_resident_mb 1,2,4
	kill "$SPID"; wait "$SPID" 2>/dev/null || true
}

@test "a third rank: a second worker gets the versions too and leaves when the trainer ends the group" {
	head -n 4 "$TD/p.jsonl" > "$TD/p4.jsonl"
	rl-rollout -v -m "$TD/m0" -n 2 --max-tokens 2 --weights-group "$ADDR" --weights-group-rank 2 \
	    --weights-group-size 3 -o /dev/null "$TD/p4.jsonl" 2> "$TD/gen2.err" 3>&- &
	W2=$!; PIDS="$PIDS $W2"
	gen -q --weights-group "$ADDR" --weights-group-rank 1 --weights-group-size 3 "$TD/p.jsonl" |
		rl-reward -q --task 'format:^[a-z]' |
		rl-train -q -m "$TD/m0" --out "$TD/ck3" --batch 4 --lr 3e-2 --metrics /dev/null \
		    --weights-group "$ADDR" --weights-group-size 3
	wait "$W2"
	grep -q "rank 2 of 3" "$TD/gen2.err"
	grep -q "weights version 0 taken" "$TD/gen2.err"
	cmp "$TD/ck-dir/step-00000006/model.safetensors" "$TD/ck3/step-00000006/model.safetensors"
}

@test "the async wiring: broker, worker and trainer in queue mode, versions through the group" {
	awk '{ sub(/^\{/, "{\"id\":" NR ","); print }' "$TD/p.jsonl" > "$TD/pq.jsonl"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' \
	    rl-queue serve --listen tcp://127.0.0.1:@PORT@ --max-staleness 1 --train-batch 16 --stale regen -q
	Q="tcp://127.0.0.1:$DPORT"
	rl-queue put -q "$Q" "$TD/pq.jsonl"
	rl-rollout -v -m "$TD/m0" --queue "$Q" -n 4 --max-tokens 2 --seed 1 --idle-exit 3 --weights-group "$ADDR" \
	    --weights-group-rank 1 --weights-group-size 2 2> "$TD/qgen.err" 3>&- &
	R=$!; PIDS="$PIDS $R"
	rl-reward -q --task 'format:^[a-z]' --queue "$Q" --idle-exit 3 3>&- &
	W=$!; PIDS="$PIDS $W"
	rl-train -q -m "$TD/m0" --out "$TD/ck-q" --batch 4 --lr 3e-2 --queue "$Q" --max-steps 6 --idle-exit 5 \
	    --old-from-behaviour --metrics "$TD/mq.jsonl" --weights-group "$ADDR" --weights-group-size 2
	wait "$R"
	wait "$W"
	[ "$(readlink "$TD/ck-q/latest")" = step-00000006 ]
	# versions taken as the staleness gate asks (at least up to version 3 of 6)
	[ "$(grep -c "weights version [3-9] taken" "$TD/qgen.err")" -ge 1 ]
	python3 -c '
import json, sys
s = [json.loads(l)["staleness/max"] for l in open(sys.argv[1])]
assert len(s) == 6 and max(s) <= 1, s' "$TD/mq.jsonl"
}

@test "a killed trainer: the worker waiting for its next version fails at once, naming rank 0" {
	# the trainer's input held open and empty: it waits for records
	mkfifo "$TD/hold"
	rl-train -v -m "$TD/m0" --out "$TD/ck-k2" --batch 4 --metrics /dev/null --weights-group "$ADDR" \
	    --weights-group-size 2 "$TD/hold" 2> "$TD/k-train.err" 3>&- &
	T=$!; PIDS="$PIDS $T"
	exec 4> "$TD/hold"
	# killed once the group has formed and the worker waits for version 1
	( for _ in $(seq 300); do grep -q "weights group: rank 0" "$TD/k-train.err" && break; sleep 0.1; done
	  sleep 0.5; kill -9 "$T" ) 3>&- &
	PIDS="$PIDS $!"
	SECONDS=0
	run -1 --separate-stderr gen --weights-group "$ADDR" --weights-group-rank 1 --weights-group-size 2 "$TD/p.jsonl"
	exec 4>&-
	[ "$SECONDS" -lt 30 ]
	[[ "$stderr" == *"rank 0"* ]]
}

@test "a worker generating for longer than --weights-timeout while the trainer publishes nothing is not stopped" {
	# the trainer gets its one step (--batch: all the prompts) only at the end,
	# so it sends no version until then; the worker, needing none, is busy for
	# more than its --weights-timeout of 1 s (its prompts arrive 2.5 s apart).
	# Its receiving thread took the trainer's silence for a hang and the run
	# failed in the middle.  The trainer's one step is small, so the worker's
	# wait at its end (also --weights-timeout) holds on a loaded machine
	mkfifo "$TD/slow.fifo"
	{ for i in 1 2 3 4; do echo '{"prompt":"x"}'; done; sleep 2.5
	  for i in 1 2 3 4; do echo '{"prompt":"y"}'; done; } > "$TD/slow.fifo" 3>&- &
	PIDS="$PIDS $!"
	SECONDS=0
	gen -v --weights-group "$ADDR" --weights-group-rank 1 --weights-group-size 2 -n 2 --max-tokens 20 \
	    --max-staleness 1000000 --weights-timeout 1 "$TD/slow.fifo" 2> "$TD/long.err" |
		rl-reward -q --task 'format:^[a-z]' |
		rl-train -q -m "$TD/m0" --out "$TD/ck-long" --batch 8 --metrics /dev/null \
		    --weights-group "$ADDR" --weights-group-size 2 2> "$TD/long-train.err" ||
		{ cat "$TD/long.err" "$TD/long-train.err"; false; }
	grep -q "8 prompts, 16 samples" "$TD/long.err"
	echo "took $SECONDS s"
	[ "$SECONDS" -ge 2 ]
	[ "$(readlink "$TD/ck-long/latest")" = step-00000001 ]
}

@test "a worker with a model of another shape: both sides fail, naming the mismatch" {
	rl-train -q -m "$TD/m0" --out "$TD/ck-s" --batch 4 --metrics /dev/null --weights-group "$ADDR" \
	    --weights-group-size 2 < "$TD/p.jsonl" > /dev/null 2> "$TD/s-train.err" 3>&- &
	T=$!; PIDS="$PIDS $T"
	run -1 --separate-stderr rl-rollout -m "$TD/m16" --max-tokens 2 --weights-group "$ADDR" \
	    --weights-group-rank 1 --weights-group-size 2 --weights-timeout 20 "$TD/p.jsonl"
	[[ "$stderr" == *"not the same architecture"* ]]
	run wait "$T"
	[ "$status" -ne 0 ]
}

@test "a worker that never joins: the trainer gives up after the timeout, naming the rank" {
	RL_COMM_TIMEOUT=2 run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/ck-n" --batch 4 \
	    --metrics /dev/null --weights-group "$ADDR" --weights-group-size 2 "$TD/p.jsonl"
	[[ "$stderr" == *"did not join"* ]]
	# the hints name the group's options, not data parallel's MASTER_ADDR
	[[ "$stderr" == *"hint: start every rank with the same --weights-group HOST:PORT and --weights-group-size"* ]]
}

@test "a worker whose trainer is not there: gives up after --weights-timeout, the hint naming the group's options" {
	run -1 --separate-stderr rl-rollout -q -m "$TD/m0" --max-tokens 1 --weights-group "$ADDR" --weights-group-rank 1 \
	    --weights-group-size 2 --weights-timeout 1 "$TD/p.jsonl"
	[[ "$stderr" == *"cannot reach rank 0 at tcp://$ADDR within 1 s"* ]]
	[[ "$stderr" == *"--weights-group HOST:PORT the same everywhere? (--weights-timeout sets the wait)"* ]]
	[[ "$stderr" != *MASTER_ADDR* ]]
}

@test "usage errors" {
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-group "$ADDR" "$TD/p.jsonl"
	[[ "$stderr" == *"--weights-group-rank"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-group "$ADDR" --weights-group-rank 2 \
	    --weights-group-size 2 "$TD/p.jsonl"
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-group-rank 1 "$TD/p.jsonl"
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-group "$ADDR" --weights-group-rank 1 \
	    --weights-group-size 2 --weights-from "$TD/ck" "$TD/p.jsonl"
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --weights-group "$ADDR" --weights-group-rank 1 \
	    --weights-group-size 2 --weights-group-backend tcp "$TD/p.jsonl"
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --weights-group "$ADDR"
	[[ "$stderr" == *"go together"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --weights-group "$ADDR" --weights-group-size 1
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --weights-group "$ADDR" --weights-group-size 2 \
	    --weights-group-backend tcp
	[[ "$stderr" == *"auto, cpu, nccl or ipc"* ]]
	# ipc is a weights-group backend, not a data-parallel one
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --comm-backend ipc
}

@test "the ipc backend needs the model on a GPU" {
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --weights-group "$ADDR" --weights-group-rank 1 \
	    --weights-group-size 2 --weights-group-backend ipc "$TD/p.jsonl"
	[[ "$stderr" == *"ipc backend needs the model on a GPU"* ]]
}

@test "rl-rollout serve --agent in the group: its episodes train on-policy, each version taken from the broadcast" {
	for i in 1 2 3 4 5 6 7 8; do echo "{\"prompt\":\"p$i\",\"reward\":$i}"; done > "$TD/agent.jsonl"
	export AGENT_LOG="$BATS_TEST_TMPDIR"
	rl-rollout serve -v -m "$TD/m0" --listen 127.0.0.1:0 --agent "/usr/bin/python3 $BATS_TEST_DIRNAME/agent_scripted.py" \
	    -n 2 --max-tokens 2 --max-staleness 0 --train-batch 2 --weights-group "$ADDR" \
	    --weights-group-rank 1 --weights-group-size 2 "$TD/agent.jsonl" 2> "$TD/serve.err" |
		rl-train -v -m "$TD/m0" --out "$TD/ck-serve" --batch 2 --lr 3e-2 --metrics "$TD/ms.jsonl" \
		    --weights-group "$ADDR" --weights-group-size 2 - 2> "$TD/train-serve.err"
	[ "$(readlink "$TD/ck-serve/latest")" = step-00000004 ]
	grep -q "weights group: rank 1 of 2 on $ADDR" "$TD/serve.err"
	grep -q "weights version 3 taken" "$TD/serve.err"
	# on-policy: every step's samples were generated by the version it trains
	python3 -c '
import json, sys
assert [json.loads(l)["staleness/max"] for l in open(sys.argv[1])] == [0] * 4' "$TD/ms.jsonl"
	run -2 --separate-stderr rl-rollout serve -m "$TD/m0" --weights-group "$ADDR" --weights-group-rank 1
	[[ "$stderr" == *"--weights-group needs --weights-group-rank R and --weights-group-size N"* ]]
	run -2 --separate-stderr rl-rollout serve -m "$TD/m0" --max-staleness 0
	[[ "$stderr" == *"--max-staleness needs --weights-from DIR, --sync URL or --weights-group"* ]]
}

#!/usr/bin/env bats
# rl-train data parallel on the CPU backend: several processes on 127.0.0.1.
# - 2 and 3 ranks train the same weights as 1 rank with the same global batch
#   (fp32 reduction-order tolerance), for token-mean and seq-mean-token-mean
#   with mini-batches, epochs and gradient accumulation;
# - a killed rank, a hung rank, ranks on different inputs or options: the
#   others exit non-zero fast with a message naming the rank; after a rank
#   killed mid-run, --resume continues from the last checkpoint;
# - bad launch configuration (WORLD_SIZE=0, RANK >= WORLD_SIZE, no or an
#   unreachable MASTER_ADDR) is a clear error.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# 12 groups of 4, responses of 1 to 10 tokens: 3 steps of 4 groups
	python3 tests/fixtures/train/mkscored.py 12 4 0 > "$TD/s.jsonl"
	python3 tests/fixtures/train/mkscored.py 12 4 7 > "$TD/other.jsonl"
}

setup() {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	# rank 0's rendezvous port, below the ephemeral range (the ring listeners
	# take ephemeral ones); a world after the first of a test takes another
	PORT=$(free_port)
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

# Tolerance: reduction order changes fp32 sums by ~1e-7 relative, and AdamW
# turns the gradients that are rounding noise (e.g. k_proj.bias, exactly 0 in
# exact arithmetic) into lr-sized steps: measured max |diff| ~5e-6 at lr 1e-2
# over 3-6 updates.  Per-rank loss normalisation (the bug this guards
# against) is off by 2e-4 (token-mean) to 2e-3 (seq-mean-token-mean).
close() { python3 tests/fixtures/parallel/st_close.py "$1" "$2" "${3:-2e-5}" "${4:-1e-4}" "${@:5}"; }

# slow_input FIFO: 8 records (2 groups) into FIFO, then it stays open (60 s)
slow_input() {
	rm -f "$1"
	mkfifo "$1"
	( head -n 8 "$TD/s.jsonl"; exec sleep 60 ) > "$1" 3>&- &
	PIDS="$PIDS $!"
}

# train_world: tests/cli/model_helper.bash (on s.jsonl, TRAIN_WORLD_DATA)

@test "2 and 3 ranks give the weights of 1 rank (token-mean)" {
	args=(--batch 4 --lr 1e-2 --loss-agg token-mean --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/one" --metrics "$TD/one.metrics" "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/two" "${args[@]}"
	PORT=$(free_port)
	train_world 3 "$TD/three" "${args[@]}"
	[ "$(readlink "$TD/two/latest")" = step-00000003 ]
	run -0 close "$TD/two/latest/model.safetensors" "$TD/one/latest/model.safetensors"
	run -0 close "$TD/three/latest/model.safetensors" "$TD/one/latest/model.safetensors"
	# the optimizer state too
	run -0 close "$TD/three/latest/optimizer.safetensors" "$TD/one/latest/optimizer.safetensors" 1e-7 1e-2
	# the comparison is not blind: one step fewer is far off
	run -1 close "$TD/two/step-00000002/model.safetensors" "$TD/one/latest/model.safetensors"
	# rank 0 writes the metrics of the whole step; the others none
	[ "$(wc -l < "$TD/three.metrics.0")" -eq 3 ]
	[ ! -s "$TD/three.metrics.1" ] && [ ! -s "$TD/three.metrics.2" ]
	python3 - "$TD/one.metrics" "$TD/three.metrics.0" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
for x, y in zip(a, b):
    for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "train/sequences"):
        assert abs(x[k] - y[k]) <= 1e-5 + 1e-4 * abs(x[k]), (k, x[k], y[k])
    assert y["dp/world_size"] == 3
PY
}

@test "3 ranks = 1 rank with seq-mean-token-mean, mini-batches, epochs and accumulation (torchrun variables)" {
	args=(--batch 4 --lr 1e-2 --loss-agg seq-mean-token-mean --mini-batches 2 --ppo-epochs 2
	    --max-tokens-per-micro 40 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/one2" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	for r in 1 2; do
		RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
		    rl-train -q -m "$TD/m0" --out "$TD/tr3" --metrics /dev/null "${args[@]}" "$TD/s.jsonl" 3>&- &
		PIDS="$PIDS $!"
	done
	RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
	    rl-train -q -m "$TD/m0" --out "$TD/tr3" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	for p in $PIDS; do wait "$p"; done
	# the k bias's gradient is 0 in exact arithmetic (a constant added to every
	# score of a row), so it moves by AdamW steps on fp32 noise whose value
	# depends on the summation order: 12 updates here moved it 1.4e-5 to 3.3e-5
	# apart (plain and sanitizer builds), against 1.4e-5 for everything else
	run -0 close "$TD/tr3/latest/model.safetensors" "$TD/one2/latest/model.safetensors" 2e-5 1e-4 \
	    k_proj.bias:1e-4
}

@test "gradient buckets overlapped with the backward pass: bitwise the weights of --no-dp-overlap, = 1 rank" {
	# 10 KiB buckets: a dozen for this model, most handed over before the backward pass ends
	args=(--batch 4 --lr 1e-2 --loss-agg seq-mean-token-mean --max-tokens-per-micro 40 --dp-check-every 1
	    --bucket-mb 0.01)
	rl-train -q -m "$TD/m0" --out "$TD/ov1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	train_world 3 "$TD/ov3" "${args[@]}" -v -v
	grep -q "buckets of 0.01 MiB, overlapped with the backward pass" "$TD/ov3.err.0"
	PORT=$(free_port)
	train_world 3 "$TD/sq3" "${args[@]}" --no-dp-overlap -v -v
	grep -q "after the backward pass" "$TD/sq3.err.0"
	cmp "$TD/ov3/latest/model.safetensors" "$TD/sq3/latest/model.safetensors"
	cmp "$TD/ov3/latest/optimizer.safetensors" "$TD/sq3/latest/optimizer.safetensors"
	run -0 close "$TD/ov3/latest/model.safetensors" "$TD/ov1/latest/model.safetensors"
	# most buckets went out during the backward pass (all but the embeddings'), none without overlap
	python3 - "$TD/ov3.metrics.0" "$TD/sq3.metrics.0" <<'PY'
import json, sys
ov = [json.loads(l)["dp/buckets_overlapped_frac"] for l in open(sys.argv[1])]
sq = [json.loads(l)["dp/buckets_overlapped_frac"] for l in open(sys.argv[2])]
assert all(0.5 < f < 1 for f in ov), ov
assert all(f == 0 for f in sq), sq
PY
}

@test "ZeRO-1: 2 ranks --zero 1 = 2 ranks without; resume across the switch and another world size" {
	args=(--batch 4 --lr 1e-2 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/z1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/zp" "${args[@]}"
	PORT=$(free_port)
	train_world 2 "$TD/zz" --zero 1 "${args[@]}"
	run -0 close "$TD/zz/latest/model.safetensors" "$TD/zp/latest/model.safetensors"
	# each rank saved its shard; put together (from the documented format)
	# they are the optimizer state of plain data parallelism
	[ -f "$TD/zz/latest/optimizer-00000-of-00002.safetensors" ]
	[ -f "$TD/zz/latest/optimizer-00001-of-00002.safetensors" ]
	python3 tests/fixtures/parallel/opt_gather.py "$TD/zz/latest" "$TD/zz.opt"
	run -0 close "$TD/zz.opt" "$TD/zp/latest/optimizer.safetensors" 1e-7 1e-2
	# each rank holds half the AdamW state
	python3 - "$TD/zp.metrics.0" "$TD/zz.metrics.0" <<'PY'
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])]
z = [json.loads(l) for l in open(sys.argv[2])]
assert len(p) == len(z) == 3
for a, b in zip(p, z):
    assert b["dp/zero_stage"] == 1 and a["dp/zero_stage"] == 0
    r = b["memory/optimizer_state_mb"] / a["memory/optimizer_state_mb"]
    assert 0.49 < r < 0.51, r
    assert b["memory/max_rss_mb"] > 0
PY
	# 2 steps with --zero 1 on 2 ranks, then step 3 on 1 rank without it
	PORT=$(free_port)
	train_world 2 "$TD/za" --zero 1 --max-steps 2 "${args[@]}"
	rl-train -q --out "$TD/za" --resume --max-steps 3 --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	[ "$(readlink "$TD/za/latest")" = step-00000003 ]
	run -0 close "$TD/za/latest/model.safetensors" "$TD/z1/latest/model.safetensors"
	# 2 steps on 2 ranks without it, then step 3 on 3 ranks with it
	PORT=$(free_port)
	train_world 2 "$TD/zb" --max-steps 2 "${args[@]}"
	PORT=$(free_port)
	train_world 3 "$TD/zb" --zero 1 --max-steps 3 --resume "${args[@]}"
	[ "$(readlink "$TD/zb/latest")" = step-00000003 ]
	run -0 close "$TD/zb/latest/model.safetensors" "$TD/z1/latest/model.safetensors"
	python3 tests/fixtures/parallel/opt_gather.py "$TD/zb/latest" "$TD/zb.opt"
	run -0 close "$TD/zb.opt" "$TD/z1/latest/optimizer.safetensors" 1e-7 1e-2
}

@test "resume with 2 ranks: 2 steps, then --resume to step 3, = 3 steps of 1 rank" {
	args=(--batch 4 --lr 1e-2 --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/r1" --metrics /dev/null --max-steps 3 "${args[@]}" "$TD/s.jsonl"
	train_world 2 "$TD/r2" --max-steps 2 "${args[@]}"
	[ "$(readlink "$TD/r2/latest")" = step-00000002 ]
	PORT=$(free_port)
	train_world 2 "$TD/r2" --max-steps 3 --resume "${args[@]}"
	[ "$(readlink "$TD/r2/latest")" = step-00000003 ]
	run -0 close "$TD/r2/latest/model.safetensors" "$TD/r1/latest/model.safetensors"
}

@test "a killed rank: the survivors exit non-zero at once, naming it" {
	# ranks 0 and 2 read everything and wait at the first step for rank 1,
	# which gets 8 records (2 groups) and then a stream that stays open
	slow_input "$TD/k.fifo"
	rl-train -q -m "$TD/m0" --out "$TD/k" --rank 1 --world 3 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    < "$TD/k.fifo" 3>&- 2>/dev/null &
	victim=$!
	PIDS="$PIDS $victim"
	for r in 0 2; do
		rl-train -q -m "$TD/m0" --out "$TD/k" --rank $r --world 3 --rendezvous "127.0.0.1:$PORT" --batch 4 \
		    "$TD/s.jsonl" 3>&- 2>"$TD/k.err.$r" &
		eval "r$r=\$!"
		PIDS="$PIDS $!"
	done
	sleep 2   # the ring is up, ranks 0 and 2 wait for rank 1 at step 1
	kill -9 "$victim"
	start=$SECONDS
	rc0=0; wait "$r0" || rc0=$?
	rc2=0; wait "$r2" || rc2=$?
	[ $rc0 = 1 ] && [ $rc2 = 1 ]
	[ $((SECONDS - start)) -lt 15 ]   # RL_COMM_TIMEOUT is 60 s: this is the dropped connection
	cat "$TD/k.err.0" "$TD/k.err.2"
	grep -q "^rl-train: rank 0: .*rank 1" "$TD/k.err.0"
	grep -q "^rl-train: rank 2: lost the connection to rank 1" "$TD/k.err.2"
}

@test "a rank killed after 2 steps: the survivor exits 1 at once; --resume from step 2 = 3 steps of 1 rank" {
	args=(--batch 4 --lr 1e-2 --dp-check-every 1 --save-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/c1" --metrics /dev/null --max-steps 3 "${args[@]}" "$TD/s.jsonl"
	# rank 1 gets the records of 2 steps, then a stream that stays open: both
	# ranks finish steps 1 and 2 (checkpoints written), then wait at step 3
	rm -f "$TD/c.fifo"
	mkfifo "$TD/c.fifo"
	( head -n 32 "$TD/s.jsonl"; exec sleep 60 ) > "$TD/c.fifo" 3>&- &
	PIDS="$PIDS $!"
	rl-train -q -m "$TD/m0" --out "$TD/c2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --metrics /dev/null "${args[@]}" < "$TD/c.fifo" 3>&- 2>/dev/null &
	victim=$!
	PIDS="$PIDS $victim"
	rl-train -q -m "$TD/m0" --out "$TD/c2" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --metrics /dev/null "${args[@]}" "$TD/s.jsonl" 3>&- 2>"$TD/c.err.0" &
	r0=$!
	PIDS="$PIDS $r0"
	for _ in $(seq 300); do
		[ "$(readlink "$TD/c2/latest" 2>/dev/null)" = step-00000002 ] && break
		sleep 0.1
	done
	[ "$(readlink "$TD/c2/latest")" = step-00000002 ]
	sleep 0.5   # rank 0 is at step 3, waiting for rank 1
	kill -9 "$victim"
	start=$SECONDS
	rc0=0; wait "$r0" || rc0=$?
	[ $rc0 = 1 ]
	[ $((SECONDS - start)) -lt 15 ]   # RL_COMM_TIMEOUT is 60 s: this is the dropped connection
	grep -q "^rl-train: rank 0: .*rank 1" "$TD/c.err.0"
	[ "$(readlink "$TD/c2/latest")" = step-00000002 ]
	[ ! -e "$TD/c2/step-00000003" ]
	# all ranks again with --resume: from step 2's checkpoint (weights and
	# AdamW state), the records of steps 1-2 skipped
	PORT=$(free_port)
	train_world 2 "$TD/c2" --max-steps 3 --resume "${args[@]}"
	# one step trained, step 3 (metrics of rank 0, a new file)
	[ "$(wc -l < "$TD/c2.metrics.0")" = 1 ]
	grep -q '^{"step":3,' "$TD/c2.metrics.0"
	[ "$(readlink "$TD/c2/latest")" = step-00000003 ]
	run -0 close "$TD/c2/latest/model.safetensors" "$TD/c1/latest/model.safetensors"
}

@test "a hung rank: the others give up after --comm-timeout with a message" {
	slow_input "$TD/h.fifo"
	rl-train -q -m "$TD/m0" --out "$TD/h" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    < "$TD/h.fifo" 3>&- 2>/dev/null &
	PIDS="$PIDS $!"
	start=$SECONDS
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/h" --rank 0 --world 2 \
	    --rendezvous "127.0.0.1:$PORT" --batch 4 --comm-timeout 2 "$TD/s.jsonl"
	[[ "$stderr" == *"no data from rank 1 for 2 s"*"timeout"* ]]
	[ $((SECONDS - start)) -lt 20 ]
}

@test "ranks on different inputs, or with different options, are refused" {
	rl-train -q -m "$TD/m0" --out "$TD/d" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    "$TD/other.jsonl" 3>&- 2>/dev/null &
	PIDS="$PIDS $!"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/d" --rank 0 --world 2 \
	    --rendezvous "127.0.0.1:$PORT" --batch 4 "$TD/s.jsonl"
	[[ "$stderr" == *"step 1: rank 1 has other groups than rank 0"* ]]
	PORT=$(free_port)
	rl-train -q -m "$TD/m0" --out "$TD/d2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --lr 1e-3 --dp-check-every 1 "$TD/s.jsonl" 3>&- 2>/dev/null &
	PIDS="$PIDS $!"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/d2" --rank 0 --world 2 \
	    --rendezvous "127.0.0.1:$PORT" --batch 4 --lr 1e-2 --dp-check-every 1 "$TD/s.jsonl"
	[[ "$stderr" == *"after step 1 the weights of rank 1 differ from rank 0's"* ]]
}

@test "bad launch configuration: clear errors" {
	run -2 --separate-stderr env WORLD_SIZE=0 RANK=0 rl-train -m "$TD/m0" --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"WORLD_SIZE=0: the world size must be at least 1"* ]]
	run -2 --separate-stderr env WORLD_SIZE=2 RANK=2 MASTER_ADDR=127.0.0.1 rl-train -m "$TD/m0" --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"RANK=2 is not below WORLD_SIZE=2"* ]]
	run -2 --separate-stderr env WORLD_SIZE=2 RANK=one rl-train -m "$TD/m0" --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"RANK='one' is not a whole number"* ]]
	run -2 --separate-stderr env -u MASTER_ADDR WORLD_SIZE=2 RANK=1 rl-train -m "$TD/m0" --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"no rendezvous address"* ]]
	[[ "$stderr" == *"hint: set MASTER_ADDR"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/e" --world 0 "$TD/s.jsonl"
	[[ "$stderr" == *"--world: bad value '0'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/e" --rank 3 --world 2 --rendezvous 127.0.0.1:1 "$TD/s.jsonl"
	[[ "$stderr" == *"--rank=3 is not below --world=2"* ]]
	# nobody at MASTER_ADDR:MASTER_PORT: gives up after the timeout
	run -1 --separate-stderr env WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT RL_COMM_TIMEOUT=1 \
	    rl-train -m "$TD/m0" --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"rl-train: rank 1: cannot reach rank 0 at tcp://127.0.0.1:$PORT within 1 s"* ]]
	run -1 --separate-stderr env WORLD_SIZE=2 RANK=1 MASTER_ADDR=no-such-host.invalid rl-train -m "$TD/m0" \
	    --out "$TD/e" "$TD/s.jsonl"
	[[ "$stderr" == *"cannot resolve the rendezvous host 'no-such-host.invalid'"* ]]
	# rank 0 alone: the others never come
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/e" --rank 0 --world 3 --rendezvous "127.0.0.1:$PORT" \
	    --comm-timeout 1 "$TD/s.jsonl"
	[[ "$stderr" == *"rank(s) 1, 2 did not join within 1 s"* ]]
}

@test "a rank refused at the rendezvous says why, not just that the connection was reset" {
	# rank 0 of 2 refuses a rank that believes in 3: both logs name the sizes
	rl-train -q -m "$TD/m0" --out "$TD/w" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" --comm-timeout 20 \
	    "$TD/s.jsonl" 3>&- 2>"$TD/w.err.0" &
	r0=$!
	PIDS="$PIDS $r0"
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/w" --rank 1 --world 3 \
	    --rendezvous "127.0.0.1:$PORT" --comm-timeout 20 "$TD/s.jsonl"
	[[ "$stderr" == *"rank 1: rendezvous: rank 0 at tcp://127.0.0.1:$PORT gave up: rank 1 (host "*") says the world size is 3, rank 0 says 2"* ]]
	rc=0; wait "$r0" || rc=$?
	[ $rc = 1 ]
	grep -q "rank 0: rendezvous: rank 1 (host .*) says the world size is 3, rank 0 says 2" "$TD/w.err.0"
}

# queue mode: a broker on loopback; QURL, QPID
start_broker() {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -k 100 "$@"
	QURL="tcp://127.0.0.1:$DPORT"
	QPID=$DPID
}

# depth NAME: the broker's count of records in state NAME
depth() { rl-queue stat "$QURL" | sed -n "s/.* $1 \([0-9]*\) .*/\1/p"; }

@test "--queue with 2 ranks: rank 0 leases, both train the steps of 1 rank, acknowledged after each step" {
	start_broker
	rl-queue put -q -s scored "$QURL" "$TD/s.jsonl"
	args=(--batch 4 --lr 1e-2 --loss-agg token-mean --dp-check-every 1)
	rl-train -q -m "$TD/m0" --out "$TD/q1" --metrics /dev/null "${args[@]}" "$TD/s.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/q2" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --queue "$QURL" "${args[@]}" 3>&- 2>"$TD/q2.err.1" &
	r1=$!
	PIDS="$PIDS $r1"
	run -0 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/q2" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" \
	    --queue "$QURL" --idle-exit 1 --metrics "$TD/q2.metrics" "${args[@]}"
	wait "$r1"
	[ "$(wc -l < "$TD/q2.metrics")" -eq 3 ]
	[ "$(readlink "$TD/q2/latest")" = step-00000003 ]
	# the broker handed the groups out in the order they were put: the same steps as the file
	run -0 close "$TD/q2/latest/model.safetensors" "$TD/q1/latest/model.safetensors"
	rl-queue stat "$QURL" > "$TD/q2.stat"
	grep -q '^version 3 ' "$TD/q2.stat"
	grep -q '^done 48 ' "$TD/q2.stat"
	[ "$(depth training)" = 0 ] && [ "$(depth scored)" = 0 ]
}

@test "--queue with 2 ranks: a killed rank 1 stops rank 0 at once, which hands its leases back" {
	start_broker
	head -n 8 "$TD/s.jsonl" | rl-queue put -q -s scored "$QURL"
	rl-train -q -m "$TD/m0" --out "$TD/qk" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" 3>&- 2>/dev/null &
	victim=$!
	PIDS="$PIDS $victim"
	rl-train -q -m "$TD/m0" --out "$TD/qk" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" 3>&- 2>"$TD/qk.err" &
	r0=$!
	PIDS="$PIDS $r0"
	# rank 0 holds the 2 groups there are and waits for 2 more
	for i in $(seq 100); do [ "$(depth training)" = 8 ] && break; sleep 0.1; done
	[ "$(depth training)" = 8 ]
	kill -9 "$victim"
	start=$SECONDS
	rc=0; wait "$r0" || rc=$?
	[ $rc = 1 ]
	[ $((SECONDS - start)) -lt 15 ]
	grep -q "rank 1" "$TD/qk.err"
	[ "$(depth training)" = 0 ] && [ "$(depth scored)" = 8 ]
}

@test "--queue with 2 ranks: a killed broker ends both after --broker-timeout, after a full checkpoint" {
	start_broker
	head -n 16 "$TD/s.jsonl" | rl-queue put -q -s scored "$QURL"
	rl-train -q -m "$TD/m0" --out "$TD/qb" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" --broker-timeout 2 3>&- 2>"$TD/qb.err.1" &
	r1=$!
	PIDS="$PIDS $r1"
	rl-train -m "$TD/m0" --out "$TD/qb" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" --broker-timeout 2 --metrics "$TD/qb.metrics" 3>&- 2>"$TD/qb.err.0" &
	r0=$!
	PIDS="$PIDS $r0"
	# one step of the 4 groups there are, then it waits for more
	for i in $(seq 300); do [ -s "$TD/qb.metrics" ] && break; sleep 0.1; done
	[ -s "$TD/qb.metrics" ]
	kill -9 "$QPID"
	timeout -k 20 60 tail --pid="$r0" -f /dev/null
	timeout -k 20 60 tail --pid="$r1" -f /dev/null
	rc=0; wait "$r0" || rc=$?
	[ $rc = 1 ]
	rc=0; wait "$r1" || rc=$?
	[ $rc = 1 ]
	grep -q "no reply from the broker at '$QURL'" "$TD/qb.err.0"
	grep -q "stopped after step 1: the broker at '$QURL' did not answer" "$TD/qb.err.0"
	[ -e "$TD/qb/step-00000001/optimizer.safetensors" ]
}

@test "--queue with 2 ranks: a killed rank 0 stops rank 1; its leases expire at the broker" {
	start_broker -t 2
	head -n 8 "$TD/s.jsonl" | rl-queue put -q -s scored "$QURL"
	rl-train -q -m "$TD/m0" --out "$TD/qz" --rank 1 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" 3>&- 2>"$TD/qz.err" &
	r1=$!
	PIDS="$PIDS $r1"
	rl-train -q -m "$TD/m0" --out "$TD/qz" --rank 0 --world 2 --rendezvous "127.0.0.1:$PORT" --batch 4 \
	    --queue "$QURL" 3>&- 2>/dev/null &
	victim=$!
	PIDS="$PIDS $victim"
	for i in $(seq 100); do [ "$(depth training)" = 8 ] && break; sleep 0.1; done
	[ "$(depth training)" = 8 ]
	kill -9 "$victim"
	start=$SECONDS
	rc=0; wait "$r1" || rc=$?
	[ $rc = 1 ]
	[ $((SECONDS - start)) -lt 15 ]
	grep -q "rank 0" "$TD/qz.err"
	for i in $(seq 60); do [ "$(depth scored)" = 8 ] && break; sleep 0.1; done
	[ "$(depth training)" = 0 ] && [ "$(depth scored)" = 8 ]
}

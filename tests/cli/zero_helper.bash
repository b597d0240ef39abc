# The ZeRO files' set-up (rl-train-zero, rl-train-zero3, rl-train-reshard):
# a communicator timeout, a free rendezvous port, ranks killed at the end.
setup() {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	PORT=$(free_port)
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

# close A B [ATOL RTOL]: the tensors of two safetensors files within the
# data-parallel tolerance: the ranks' sums are added in another order than
# one rank's (ZeRO-2 and -3 also sum each micro-batch over the ranks before
# summing the micro-batches), ~1e-7 relative per sum; AdamW turns gradients
# that are rounding noise (k_proj.bias: 0 in exact arithmetic) into lr-sized
# steps, so that tensor gets 1e-4 over a dozen updates.  The bug classes
# this catches are far larger: a shard summed twice or missed (factor 2 on
# part of the gradient), a micro-batch's round dropped, a unit gathered from
# the wrong shard, one step fewer.
close() { python3 tests/fixtures/parallel/st_close.py "$1" "$2" "${3:-2e-5}" "${4:-1e-4}" k_proj.bias:1e-4; }

# same_losses A.metrics B.metrics STAGE: per step (3), the same loss terms and
# norm, and B ran ZeRO stage STAGE
same_losses() {
	python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss"):
        if k in x:
            assert abs(x[k] - y[k]) <= 1e-5 + 1e-4 * abs(x[k]), (k, x[k], y[k])
    assert y["dp/zero_stage"] == int(sys.argv[3]), y["dp/zero_stage"]
PY
}

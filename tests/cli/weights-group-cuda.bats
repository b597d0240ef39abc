#!/usr/bin/env bats
# The weights broadcast group on a GPU (make gpucheck runs this file; skipped
# where rl-train cannot open a CUDA device): trainer and worker on the same
# GPU, on-policy through pipes, with the ipc backend (chosen by auto on a
# loopback address: CUDA IPC, device to device) and with the TCP ring staged
# through the host; versions advance and the run stays on-policy.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":128,"max_position_embeddings":32,"torch_dtype":"float32"}
JSON
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 3
	for i in $(seq 24); do echo '{"prompt":"x"}'; done > "$TD/p.jsonl"
}

setup() {
	rl-train -q -m "$TD/m0" --out "$TD/probe" --device cuda --metrics /dev/null < /dev/null 2>/dev/null ||
		skip "no CUDA device"
	ADDR="127.0.0.1:$(free_port)"
}

# run_group BACKEND: the on-policy pipe wiring, both on cuda, through the group
run_group() {
	rm -rf "$TD/ck-$1"
	timeout -k 20 300 sh -c "exec rl-rollout -v -m '$TD/m0' --device cuda --max-staleness 0 --train-batch 4 -n 4 \
	    --max-tokens 2 --seed 1 --weights-timeout 60 --weights-group '$ADDR' --weights-group-rank 1 \
	    --weights-group-size 2 --weights-group-backend $1 '$TD/p.jsonl' 2> '$TD/gen-$1.err'" |
		rl-reward -q --task 'format:^[a-z]' |
		timeout -k 20 300 rl-train -v -m "$TD/m0" --out "$TD/ck-$1" --device cuda --batch 4 --lr 3e-2 \
		    --metrics "$TD/m-$1.jsonl" --weights-group "$ADDR" --weights-group-size 2 \
		    --weights-group-backend $1 2> "$TD/train-$1.err"
	[ "$(readlink "$TD/ck-$1/latest")" = step-00000006 ]
	grep -q "weights version 5 taken" "$TD/gen-$1.err"
	python3 -c '
import json, sys
assert [json.loads(l)["staleness/max"] for l in open(sys.argv[1])] == [0] * 6' "$TD/m-$1.jsonl"
}

@test "cuda ipc (auto on a loopback address): versions device to device, on-policy" {
	run_group auto
	grep -q "ipc backend" "$TD/gen-auto.err"
	grep -q "ipc backend" "$TD/train-auto.err"
}

@test "cuda through the TCP ring (staged through the host): the same wiring" {
	run_group cpu
	grep -q "cpu backend" "$TD/gen-cpu.err"
}

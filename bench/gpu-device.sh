#!/bin/bash
# bench/gpu-device.sh — the device-side driver for the GPU runs recorded in
# bench/RESULTS.md: run from the checkout's root on the GPU machine, with the
# folder made by bench/gpu-pack.sh carried (default .gpu; G=DIR for another):
#   bash bench/gpu-device.sh [all|test|bench]
# test: every CUDA test binary (make gpucheck's C tests); bench: the per-op
# profiles of a training and a decode step, then bench/run-gpu.sh (make
# bench-gpu: kernels, training, generation, engine, the whole GRPO step, the
# PyTorch references).  Each step has a timeout; the logs come back as one
# $OUT/logs.tgz (the device tool returns at most 8 files).
cd "$(dirname "$0")/.."
. bench/gpu-env.sh
B=$G/build W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
what=${1:-all}
if [ "$what" = all ] || [ "$what" = test ]; then
	for t in test_cuda_ops test_cuda_decode test_cuda_step test_cuda_model test_cuda_value_head test_comm_cuda test_wsync_cuda; do
		timeout 240 "./$B/tests/$t" > "$W/$t.log" 2>&1
		echo "$t rc=$?"
		grep -v '^ok' "$W/$t.log" | tail -12
	done
	grep -E 'max_abs_diff=' "$W/test_cuda_model.log"  # decode vs training log-probs
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
	RL_CUDA_PROFILE=1 timeout 60 "./$B/bench/gpu_train" gpt2 3 > "$W/prof_train.log" 2>&1
	sort -k6,6 -g -r "$W/prof_train.log" | head -20
	# per-op breakdown of a decode step (the profile synchronises around every op: no graphs)
	for b in 1 256; do
		RL_CUDA_PROFILE=1 timeout 60 "./$B/bench/gpu_gen" gpt2 64 nograph $b > "$W/prof_gen_$b.log" 2>&1
		sort -k6,6 -g -r "$W/prof_gen_$b.log" | head -12
	done
	RL_BUILD=$B RL_BENCH_NO_TORCH=${NO_TORCH:-0} TORCH_BASELINE=$G/ref/torch_baseline.py timeout 540 \
	    sh bench/run-gpu.sh 2>&1 | tee "$W/bench.jsonl"
fi
[ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$W" .

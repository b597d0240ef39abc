#!/bin/bash
# bench/gpu-step.sh — the one-kernel decode step's checks and diagnostics on the GPU machine:
# its tests (test_cuda_step, test_cuda_decode), then one-slot generation
# (bench/gpu_gen, graphs, 256 new tokens, GPT-2 and Qwen shapes) with the default fused path
# and with RL_CUDA_DECODE_STEP=1 under each setting in STEPS, each without and with the stage
# profile (RL_CUDA_STEP_PROFILE=1: per stage kind, the time from the first block starting it
# to the last arriving at the next barrier, that barrier's latency; said on stderr at exit).
# GEN2: another gpu_gen build to run the same way (a compile-time variant).  Run from the
# checkout's root with bench/gpu-pack.sh's folder carried:  bash bench/gpu-step.sh
cd "$(dirname "$0")/.."
. bench/gpu-env.sh
for t in ${TESTS-test_cuda_step test_cuda_decode}; do
	timeout 120 "$G/build/tests/$t" > /tmp/$t.log 2>&1
	echo "$t rc=$?"
	grep -v '^ok' /tmp/$t.log | tail -6
done
STEPS=${STEPS:-"RL_CUDA_STEP_BAR=acq RL_CUDA_STEP_BAR=sleep RL_CUDA_STEP_BAR=acq,RL_CUDA_STEP_SPLIT_KEYS=128 RL_CUDA_STEP_BAR=acq,RL_CUDA_STEP_SPLIT_KEYS=0"}
run() { local gen=$1; shift; env "$@" timeout 60 "$gen" "${MODEL:-all}" 256 graph 1 2>&1 | grep -v '^cuda profile'; }
for gen in "$G/build/bench/gpu_gen" ${GEN2:-}; do
	echo "== $gen"
	run "$gen" RL_CUDA_DECODE_STEP=0
	for st in $STEPS; do
		run "$gen" RL_CUDA_DECODE_STEP=1 ${st//,/ }
		run "$gen" RL_CUDA_DECODE_STEP=1 ${st//,/ } RL_CUDA_STEP_PROFILE=1
	done
done

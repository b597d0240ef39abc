#!/bin/bash
# bench/gpu-ab.sh — an A/B comparison on the GPU machine: runs a GPU bench alternately
# without and with one setting, N times each (A B A B ...), so that clock and thermal drift
# fall on both sides alike; its JSON lines on stdout (their "switches" say which side).
#   bash bench/gpu-ab.sh N VAR=VALUE BENCH [ARGS...]
# e.g.  bash bench/gpu-ab.sh 3 RL_CUDA_NORM_BWD_ADD=1 gpu_train all 10
# from the checkout's root, bench/gpu-pack.sh's folder carried (G=DIR for another).
cd "$(dirname "$0")/.."
. bench/gpu-env.sh
n=$1 set=$2 bench=$3
shift 3
for i in $(seq "$n"); do
	timeout 120 "$G/build/bench/$bench" "$@" | grep '^{'
	env "$set" timeout 120 "$G/build/bench/$bench" "$@" | grep '^{'
done

#!/bin/bash
# bench/gpu-cand.sh — the GPU paths that have never run on a GPU (docs/cuda.md), checked and timed on
# the GPU machine in one call: first the two CUDA tests that run them (test_cuda_ops: the
# wide decode attention and the fused products with split rows and prefetch on every shape;
# test_cuda_decode: the wide kernel inside the model and its graphs), op-by-op profiles of the
# two open figures' workloads (a Qwen training step; a Qwen decode step at 256 slots), then generation
# (gpu_gen with graphs) at 1, 64 and 256 slots for GPT-2 and Qwen2.5-0.5B shapes, the
# defaults and each switch in turn, N rounds (default 1; more alternate the sides again, so
# that clock drift falls on all of them alike).  Each line's "switches" names its side.
#   bash bench/gpu-cand.sh [N]
# from the checkout's root, bench/gpu-pack.sh's folder carried (G=DIR for another); the tests'
# logs under $OUT when set.
cd "$(dirname "$0")/.."
. bench/gpu-env.sh
n=${1:-1}
B=$G/build
for t in test_cuda_ops test_cuda_decode; do
	timeout 240 "./$B/tests/$t" > "${OUT:-/tmp}/$t.log" 2>&1
	echo "$t rc=$?"
	grep -v '^ok' "${OUT:-/tmp}/$t.log" | tail -8
done
# issue 9's open figure (Qwen training): where the step's time goes, op by op (the profile
# synchronises around every op, so the sum reads above the step's time)
RL_CUDA_PROFILE=1 timeout 90 "./$B/bench/gpu_train" qwen 3 > "${OUT:-/tmp}/prof_train_qwen.log" 2>&1
echo "gpu_train qwen (profiled) rc=$?"
sort -k6,6 -g -r "${OUT:-/tmp}/prof_train_qwen.log" | head -24
# issue 10's Qwen figure at 256 slots: a decode step op by op (no graphs under the profile)
RL_CUDA_PROFILE=1 timeout 90 "./$B/bench/gpu_gen" qwen 64 nograph 256 > "${OUT:-/tmp}/prof_gen_qwen256.log" 2>&1
echo "gpu_gen qwen 256 slots (profiled) rc=$?"
sort -k6,6 -g -r "${OUT:-/tmp}/prof_gen_qwen256.log" | head -14
# the wide kernel also with splits of 128 keys (Qwen at one slot: 2 blocks of 7 heads' work
# without; 6 with, and the merge)
sides=("" RL_CUDA_DECODE_ATTN=wide "RL_CUDA_DECODE_ATTN=wide RL_CUDA_DECODE_SPLIT_KEYS=128"
	"RL_CUDA_DECODE_ATTN=wide RL_CUDA_DECODE_WIDE_WARPS=8"
	RL_CUDA_GEMV_SPLIT=auto RL_CUDA_GEMV_PF=1 RL_CUDA_GEMV_PF=2
	"RL_CUDA_DECODE_ATTN=wide RL_CUDA_GEMV_SPLIT=auto RL_CUDA_GEMV_PF=1")
J=${OUT:-/tmp}/cand.jsonl
: > "$J"
for i in $(seq "$n"); do
	for model in gpt2 qwen; do
		for slots in 1 64 256; do
			for s in "${sides[@]}"; do
				# shellcheck disable=SC2086  # the side's assignments, word by word
				env $s timeout 120 "./$B/bench/gpu_gen" "$model" 256 graph "$slots" | grep '^{' >> "$J"
			done
		done
	done
done
# the lines are long (the device tool returns the last 12,000 characters): a table of
# tok/s, one line per model, slots and side, the lines themselves in cand.jsonl under $OUT
sed -n 's/.*"model":"\([a-z0-9]*\)","batch":\([0-9]*\).*"tokens_per_s":\([0-9]*\).*"switches":"\([^"]*\)".*/\1 \2 \3 \4/p' "$J"

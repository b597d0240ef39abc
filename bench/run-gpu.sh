#!/bin/sh
# bench/run-gpu.sh — the GPU benchmarks (make bench-gpu), JSON lines on stdout:
# single-op timings (gpu_kernels), the training step of GPT-2 124M and
# Qwen2.5-0.5B shapes (gpu_train; again with RL_CUDA_NORM_BWD_ADD=1, then
# with RL_CUDA_BGRAD=1), generation at 1/64/256 slots (gpu_gen, with and
# without CUDA graphs, then with graphs 8 steps a call (multi-step decoding);
# one slot again with RL_CUDA_DECODE_STEP=1), the
# engine with continuous batching (gpu_engine),
# the whole GRPO step (bench/grpo-step-gpu.sh, WEIGHTS=group), then the
# PyTorch references in the same call for the side-by-side ratios:
# torch_baseline.py train and torch_graph_decode.py (and torch_baseline.py gen,
# Hugging Face generate, host-bound and slow, only with RL_BENCH_HF_GEN=1).
# Env: RL_BUILD (build dir, default build), TORCH_BASELINE (path of
# torch_baseline.py, torch_graph_decode.py beside it; default ../shared/bench/
# or .gpu/ref/), PYTHON (python3),
# RL_BENCH_NO_TORCH=1 skips the reference.
set -u
B=${RL_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
rc=0
"$B/bench/gpu_kernels" || rc=1
"$B/bench/gpu_train" all "${RL_BENCH_STEPS:-10}" || rc=1
# the training paths off by default (measured no faster): each alone ("switches" in the lines)
RL_CUDA_NORM_BWD_ADD=1 "$B/bench/gpu_train" all "${RL_BENCH_STEPS:-10}" || rc=1
RL_CUDA_BGRAD=1 "$B/bench/gpu_train" all "${RL_BENCH_STEPS:-10}" || rc=1
"$B/bench/gpu_gen" all 256 || rc=1
# multi-step decoding: 8 steps queued a call, the tokens fed back on the device (rl-rollout --decode-steps)
"$B/bench/gpu_gen" all 256 graph 0 8 || rc=1
# one slot with the decode step in one kernel (RL_CUDA_DECODE_STEP=1: off by default, measured slower)
RL_CUDA_DECODE_STEP=1 "$B/bench/gpu_gen" all 256 graph 1 || rc=1
"$B/bench/gpu_engine" all || rc=1
# the whole GRPO step of the GPT-2 shape through the programs (weights by the broadcast group)
PATH="$root/$B/bin:$PATH" WEIGHTS=group STEPS=6 sh bench/grpo-step-gpu.sh || rc=1
if [ "${RL_BENCH_NO_TORCH:-0}" != 1 ]; then
	ref=${TORCH_BASELINE:-}
	for c in ../shared/bench/torch_baseline.py .gpu/ref/torch_baseline.py ref/torch_baseline.py; do
		[ -z "$ref" ] && [ -f "$c" ] && ref=$c
	done
	if [ -n "$ref" ]; then
		PYTHONUNBUFFERED=1 "${PYTHON:-python3}" "$ref" train || rc=1
		PYTHONUNBUFFERED=1 "${PYTHON:-python3}" "$(dirname "$ref")/torch_graph_decode.py" || rc=1
		if [ "${RL_BENCH_HF_GEN:-0}" = 1 ]; then
			PYTHONUNBUFFERED=1 "${PYTHON:-python3}" "$ref" gen || rc=1
		fi
	else
		echo "run-gpu.sh: torch_baseline.py not found (set TORCH_BASELINE)" >&2
		rc=1
	fi
fi
exit $rc

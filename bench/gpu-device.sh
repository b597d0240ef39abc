#!/bin/bash
# bench/gpu-device.sh — the device-side driver used for the GPU runs recorded in
# bench/RESULTS.md, run from a carried folder that holds build/tests/test_cuda_*,
# build/bench/gpu_*, tests/fixtures, bench/run-gpu.sh, ref/*.py (copies of
# ../shared/bench) and libs/ (shared libraries the device image lacks, from
# ../shared/gpu/carry-libs, minus libcublas*, which the image has).  Packaging,
# on the build machine:
#   make CUDA_ARCH=90 -j2 tests-build
#   G=/work/main/.gpu; mkdir -p $G/build/tests $G/build/bench $G/tests $G/bench $G/ref
#   cp build/tests/test_cuda_* $G/build/tests/; cp build/bench/gpu_{gen,engine,kernels,train} $G/build/bench/
#   cp -a tests/fixtures $G/tests/; cp bench/run-gpu.sh bench/gpu-device.sh $G/bench/
#   cp ../shared/bench/*.py $G/ref/; ../shared/gpu/carry-libs $G/libs build/tests/test_cuda_*; rm $G/libs/libcublas*
# then on the device: bash .gpu/bench/gpu-device.sh [all|test|bench]; logs under $OUT.
# device-side driver: tests then benches; logs to $OUT
cd "$(dirname "$0")/.."
L=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | tr '\n' ':')
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
	f=$(find / -name 'libcublasLt.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
	[ -n "$f" ] && L="$L$(dirname $f):"
fi
export LD_LIBRARY_PATH=$PWD/libs:$L${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
what=${1:-all}
if [ "$what" = all ] || [ "$what" = test ]; then
	timeout 240 ./build/tests/test_cuda_ops > $OUT/ops.log 2>&1; echo "test_cuda_ops rc=$?"
	grep -v '^ok' $OUT/ops.log | head -60
	timeout 120 ./build/tests/test_cuda_model > $OUT/model.log 2>&1; echo "test_cuda_model rc=$?"
	grep -v '^ok' $OUT/model.log | head -60
	grep -E 'decode|forward lp' $OUT/model.log
	timeout 120 ./build/tests/test_cuda_decode > $OUT/decode.log 2>&1; echo "test_cuda_decode rc=$?"
	grep -v '^ok' $OUT/decode.log | head -40
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
	RL_CUDA_PROFILE=1 timeout 60 ./build/bench/gpu_train gpt2 3 > $OUT/prof.log 2>&1
	RL_CUDA_PROFILE=1 timeout 60 ./build/bench/gpu_train qwen 3 >> $OUT/prof.log 2>&1
	sort -k6 -g -r -t' ' $OUT/prof.log | head -40
	# per-op breakdown of a decode step (the profile synchronises around every op: no graphs)
	for b in 1 256; do
		RL_CUDA_PROFILE=1 timeout 60 ./build/bench/gpu_gen gpt2 64 nograph $b > $OUT/prof_gen_$b.log 2>&1
		sort -k6 -g -r -t' ' $OUT/prof_gen_$b.log | head -16
	done
	RL_BUILD=build RL_BENCH_NO_TORCH=${NO_TORCH:-0} TORCH_BASELINE=ref/torch_baseline.py timeout 480 sh bench/run-gpu.sh 2>&1 | tee $OUT/bench.jsonl
fi

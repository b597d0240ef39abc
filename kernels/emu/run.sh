#!/bin/sh
# kernels/emu/run.sh — runs kernel sources on the CPU through kernels/emu/cuda_emu.h
# and compares them with the CPU reference (lib/compute/ops_cpu.c).  No GPU needed; a C++
# build (g++), run by `make check` through tests/cli/cuda-emu.bats (skipped
# without a C++ compiler) and by hand after changing the kernels it covers
# (decode.cu's three decode attention kernels and merge, norm.cu's forward norms,
# gemv.cu, fuse.cu, logprob.cu's two samplers: emu_sample.cpp, its log-prob forward and backward over
# strided logits: emu_logprob.cpp, flash2.cu's flash attention forward and backward:
# emu_flash2.cpp, elementwise.cu's vec kernels and multi-tensor AdamW: emu_ew.cpp, step.cu's
# persistent decode step with fuse.cuh's and decode.cuh's device code: emu_step.cpp).
#   sh kernels/emu/run.sh            (needs build/librlpipe.a: `make` first)
#   sh kernels/emu/run.sh quick      (flash2: the self-test and the first five cases, then
#                                     the two skew cases)
#   build/emu/emu_step quick         (4 of its 10 step cases and the barrier: what a sanitized
#                                     library runs, and the skew run)
#   RL_EMU_SKEW=1 build/emu/emu_flash2 skew   (those two alone)
#   RL_EMU_FLASH2=x.cu sh kernels/emu/run.sh    (flash2 kernels from x.cu: kernels/emu/mutate.sh)
# The kernels are cut out of the .cu files as they are (awk, below), so what runs
# is the committed source, not a copy.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${RL_BUILD:-build}
out=$root/$B/emu
mkdir -p "$out"
# the lines of a file from the first line matching $2 to the first line after it that is "}"
cut_fn() { awk -v re="$2" 'f == 0 && $0 ~ re { f = 1 } f { print } f && /^}$/ { exit }' "$1"; }
# the lines of a file from the first line that starts with $2 to the line before the next one that
# starts with $3 (plain strings)
cut_sec() { awk -v a="$2" -v b="$3" 'f && index($0, b) == 1 { exit } !f && index($0, a) == 1 { f = 1 } f' "$1"; }
# the device code of decode.cuh and fuse.cuh (FUSE_SMEM, fuse.cu's dynamic shared memory, is the
# emu_*.cpp's own), between their markers
dev_cuh() {
	cut_sec "$root/kernels/decode.cuh" '/* ==== decode device code' '/* ==== end of decode device code'
	cut_sec "$root/kernels/fuse.cuh" '/* ==== fuse device code' '/* ==== end of fuse device code'
}
{
	# common.cuh's device helpers (bf16 conversion, warp and block reductions)
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	dev_cuh
	# decode.cu: its kernels, up to the first launcher
	cut_sec "$root/kernels/decode.cu" '/* ==== decode kernels' 'extern "C"'
	grep '^#define NORM_WARPS' "$root/kernels/norm.cu"
	cut_fn "$root/kernels/norm.cu" '^__global__ void k_rmsnorm_fwd\('
	cut_fn "$root/kernels/norm.cu" '^__global__ void k_layernorm_fwd\('
	cut_fn "$root/kernels/norm.cu" '^__global__ void k_add_norm_fwd\('
	cut_fn "$root/kernels/norm.cu" '^template <int NCH>'
	awk '/^#define GV_/ { print } /^template <int NR>/ { f = 1 } /^extern "C"/ { f = 0 } f' "$root/kernels/gemv.cu"
	# fuse.cu: from its kernels marker to its launchers marker; elementwise.cu's RoPE and
	# kv_write, the separate ops it fuses
	cut_sec "$root/kernels/fuse.cu" '/* ==== fuse kernels' '/* ==== fuse launchers'
	grep -A2 '^#define GRID_STRIDE' "$root/kernels/elementwise.cu"
	# its RoPE helpers (from the RoPE section's heading to k_rope) and k_rope
	awk '/^\/\* ---- RoPE/ { f = 1 } /^__global__ void k_rope\(/ { f = 0 } f' "$root/kernels/elementwise.cu"
	cut_fn "$root/kernels/elementwise.cu" '^__global__ void k_rope\('
	cut_fn "$root/kernels/elementwise.cu" '^__global__ void k_kv_write\('
} > "$out/kernels.inc"
{
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	# flash2.cu: from its kernels marker to its launchers marker (the inline-PTX
	# primitives before it are replaced by emu_flash2.cpp's emulated ones)
	awk '/^\/\* ==== flash2 kernels/ { f = 1 } /^\/\* ==== flash2 launchers/ { f = 0 } f' \
	    "${RL_EMU_FLASH2:-$root/kernels/flash2.cu}"
} > "$out/flash2.inc"
{
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	grep '^#define SMP_THREADS' "$root/kernels/logprob.cu"
	# logprob.cu: the sampler, from its row struct to k_sample's end (the launcher after)
	awk '/^struct smp_row/ { f = 1 } f && /^extern "C"/ { exit } f' "$root/kernels/logprob.cu"
} > "$out/sample.inc"
{
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	grep '^#define LP_THREADS' "$root/kernels/logprob.cu"
	# logprob.cu: the log-prob kernels, from the online merge to the first launcher
	awk '/^struct msz / { f = 1 } f && /^extern "C"/ { exit } f' "$root/kernels/logprob.cu"
} > "$out/logprob.inc"
{
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	# elementwise.cu without its includes and its launchers (extern "C": one-line ones, or
	# to the function's closing brace)
	awk '/^#include/ { next } /^extern "C"/ { if ($0 ~ /}$/) next; skip = 1 } !skip { print }
	    skip && /^}$/ { skip = 0 }' "$root/kernels/elementwise.cu"
} > "$out/ew.inc"
{
	grep '^#define NORM_WARPS' "$root/kernels/norm.cu"
	cut_fn "$root/kernels/norm.cu" '^template <int NCH, int LN, int ACC>'
	cut_fn "$root/kernels/norm.cu" '^template <int ACC> __global__ void k_rmsnorm_bwd\('
	cut_fn "$root/kernels/norm.cu" '^template <int ACC> __global__ void k_layernorm_bwd\('
} > "$out/normbwd.inc"
{
	awk '/^static __device__ __forceinline__ float ld\(/ { f = 1 } /^#endif/ { f = 0 } f' \
	    "$root/kernels/common.cuh"
	dev_cuh
	# step.cu: from its device code marker to its launchers marker
	cut_sec "$root/kernels/step.cu" '/* ==== step device code' '/* ==== step launchers'
} > "$out/step.inc"
CXXF="-O1 -g -std=c++17 -ffp-contract=off -fno-strict-aliasing -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas"
# a sanitized library (make SANITIZE=address,undefined: build-san/) needs the sanitizer runtimes
# (4x slower: flash2 then runs its quick set unless told otherwise)
san=
if nm "$root/$B/librlpipe.a" 2>/dev/null | grep -q ' U __asan_'; then
	# uint4/float4 are 16-byte aligned types in cuda_emu.h, as in CUDA: a vector access at a
	# misaligned address (a launcher taking a 16-byte kernel it should not) stops the run
	CXXF="$CXXF -fsanitize=address,undefined -fno-sanitize-recover=alignment"
	san=1
fi
p1= p2= p3= p4= p5=
if [ -z "${RL_EMU_FLASH2:-}" ]; then
	${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_step" "$root/kernels/emu/emu_step.cpp" \
	    "$root/$B/librlpipe.a" -fopenmp -lm &
	p5=$!
	${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_ew" "$root/kernels/emu/emu_ew.cpp" \
	    "$root/$B/librlpipe.a" -fopenmp -lm &
	p4=$!
	${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_kernels" "$root/kernels/emu/emu_kernels.cpp" \
	    "$root/$B/librlpipe.a" -fopenmp -lm &
	p1=$!
	${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_sample" "$root/kernels/emu/emu_sample.cpp" \
	    "$root/$B/librlpipe.a" -fopenmp -lm &
	p2=$!
	${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_logprob" "$root/kernels/emu/emu_logprob.cpp" \
	    "$root/$B/librlpipe.a" -fopenmp -lm &
	p3=$!
fi
${CXX:-g++} $CXXF -I"$root/lib" -I"$root" -I"$out" -o "$out/emu_flash2" "$root/kernels/emu/emu_flash2.cpp" \
    "$root/$B/librlpipe.a" -fopenmp -lm
[ -z "$p1" ] || wait $p1
[ -z "$p2" ] || wait $p2
[ -z "$p3" ] || wait $p3
[ -z "$p4" ] || wait $p4
[ -z "$p5" ] || wait $p5
rc=0
if [ -z "${RL_EMU_FLASH2:-}" ]; then
	"$out/emu_kernels" || rc=1
	"$out/emu_sample" || rc=1
	"$out/emu_logprob" || rc=1
	"$out/emu_ew" || rc=1
	"$out/emu_step" ${san:+quick} || rc=1
fi
if [ -n "$san" ] && [ $# = 0 ]; then
	set -- quick
fi
"$out/emu_flash2" "$@" || rc=1
# warps drifting apart (kernels/emu/cuda_emu.h, RL_EMU_SKEW): shows a missing barrier
# before a shared buffer is refilled
if [ $# = 0 ] || [ "$1" = quick ]; then
	RL_EMU_SKEW=1 "$out/emu_flash2" skew || rc=1
fi
# the same for the decode step's stages and grid barrier (its quick set)
if [ -z "${RL_EMU_FLASH2:-}" ] && [ -z "$san" ]; then
	RL_EMU_SKEW=1 "$out/emu_step" quick || rc=1
fi
exit $rc

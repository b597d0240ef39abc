/*
 * common.cuh — helpers shared by the CUDA kernels: bf16 conversion, warp and
 * block reductions, launch-size helpers.  Device code only; included by
 * the .cu files of kernels/, never by lib/.
 */
#ifndef RL_KERNELS_COMMON_CUH
#define RL_KERNELS_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "compute/ops.h"

typedef __nv_bfloat16 bf16;

#define RLK_STREAM(s) ((cudaStream_t)(s))
/* Launchers return 0 or the cudaError_t of the launch. */
#define RLK_RET() return (int)cudaGetLastError()

/* Programmatic dependent launch (sm_90; kernels/pdl.cu).  A kernel launched by
 * rlk_launch while rlk_pdl_on may start before the kernel ahead of it in the stream
 * has finished: it must call pdl_wait() (griddepcontrol.wait: the grids it depends on
 * have completed and their writes are visible) before it reads anything an earlier
 * kernel wrote or writes anything an earlier kernel reads, and every such kernel calls
 * it in at least one thread (so its completion implies its predecessors').  Work that
 * needs neither (weights, which no kernel of the step writes; indices) goes before.
 * pdl_trigger() (griddepcontrol.launch_dependents) lets the next kernel's blocks be
 * scheduled once every block of this one has issued it.  Both are no-ops below sm_90
 * and in kernels/emu (RLK_GDC). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RLK_GDC(x) asm volatile(x ::: "memory")
#else
#define RLK_GDC(x) ((void)0)
#endif
extern "C" int rlk_pdl_on;

template <typename... P, typename... A>
static inline cudaError_t
rlk_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... a)
{
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at[1];
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = st;
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = rlk_pdl_on ? 1 : 0;
	cfg.attrs = at;
	cfg.numAttrs = 1;
	return cudaLaunchKernelEx(&cfg, k, ((P)a)...);
}

static __device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 tobf(float x) { return __float2bfloat16(x); }
static __device__ __forceinline__ void pdl_wait(void) { RLK_GDC("griddepcontrol.wait;"); }
static __device__ __forceinline__ void pdl_trigger(void) { RLK_GDC("griddepcontrol.launch_dependents;"); }

/* inv_freq of frequency f (< HD/2) under r (lib/compute/ops.h rl_rope): the kernels' theta^(-2f/HD),
 * then with r.factor > 0 Llama 3's rescaling in the fp32 steps of the CPU reference
 * (rl_cpu_rope_inv); the _rn intrinsics keep nvcc from contracting them into FMAs.  Every
 * kernel that rotates (k_rope, k_rope8, k_rope_kv, fuse.cuh's QKV epilogue, step.cu) takes
 * its frequencies from here. */
static __device__ __forceinline__ float
rope_inv(const rl_rope &r, int f, int HD)
{
	float inv = powf(r.theta, -2.0f * (float)f / (float)HD);
	if (r.factor > 0.0f) {
		float wl = __fmul_rn(__fdiv_rn(1.0f, inv), (float)(2.0 * 3.14159265358979323846));
		if (wl > (float)((double)r.orig / r.lo)) {
			inv = __fdiv_rn(inv, r.factor);
		} else if (!(wl < (float)((double)r.orig / r.hi))) {
			float s = __fdiv_rn(__fsub_rn(__fmul_rn(__fdiv_rn(1.0f, wl), r.orig), r.lo),
			    (float)((double)r.hi - r.lo));
			inv = __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, s), inv), r.factor), __fmul_rn(s, inv));
		}
	}
	return inv;
}

static __device__ __forceinline__ float
warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float
warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Sum over the block; every thread gets the result.  sh: >= 32 floats of
 * shared memory.  blockDim.x a multiple of 32, at most 1024. */
static __device__ __forceinline__ float
block_sum(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0f;
	return warp_sum(v);
}

static __device__ __forceinline__ float
block_max(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : -INFINITY;
	return warp_max(v);
}

/* p 16-byte aligned (the uint4 loads of the vec and fused kernels) */
static inline int
rlk_a16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

static inline unsigned
rlk_blocks(size_t n, unsigned threads)
{
	size_t b = (n + threads - 1) / threads;
	if (b > 65535u * 32u)
		b = 65535u * 32u;  /* grid-stride loops cover the rest */
	return b ? (unsigned)b : 1u;
}

#endif

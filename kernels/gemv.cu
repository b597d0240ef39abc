/*
 * gemv.cu — matmul_fwd for a few rows (N <= 4: decode with a few sequences):
 * out (N, OC) = inp (N, C) @ w (OC, C)^T + bias, bf16 in and out, f32 sums.
 *
 * cuBLASLt runs such a product as a tiled GEMM with a dozen blocks (or split-K
 * plus a reduction kernel), far from the memory bound that a product reading
 * each weight once is: at one GPT-2 slot its c_attn took 5.6 us (ncu) for 3.5 MB.
 * Here one warp per output feature: each lane loads its 16-byte chunks of the
 * weight row (all in flight at once) and of the N input rows (read by every warp,
 * so from L1/L2), keeps N f32 sums, and the warp reduces them; OC / 8 blocks of
 * 8 warps cover the GPU.  Sums are taken in another order than cuBLAS's: the
 * same values within f32 rounding, then one bf16 rounding (bias added in f32,
 * as the GEMM epilogue does).
 *
 * Taken (rlk_gemv_ok) for N <= 4, C a multiple of 8 up to 8192, inp and w
 * 16-byte aligned; out and bias any alignment.
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define GV_WARPS 8
#define GV_INFL 8     /* 16-byte weight chunks in flight per lane */

template <int NR>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv(bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int C, int OC)
{
	const int lane = threadIdx.x & 31;
	const long o = (long)blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
	if (o >= OC)
		return;
	const int nch = C / 8;
	const bf16 *wr = w + (size_t)o * C;
	float acc[NR];
#pragma unroll
	for (int m = 0; m < NR; m++)
		acc[m] = 0.0f;
	/* the weight row's chunks first, all loads in flight, then the products */
	uint4 wc[GV_INFL];
	for (int c0 = lane; c0 < nch; c0 += 32 * GV_INFL) {
#pragma unroll
		for (int k = 0; k < GV_INFL; k++) {
			int c = c0 + k * 32;
			wc[k] = c < nch ? *(const uint4 *)(wr + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
		}
#pragma unroll
		for (int k = 0; k < GV_INFL; k++) {
			int c = c0 + k * 32;
			if (c >= nch)
				break;
			const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&wc[k];
#pragma unroll
			for (int m = 0; m < NR; m++) {
				uint4 xu = *(const uint4 *)(inp + (size_t)m * C + (size_t)c * 8);
				const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xu;
#pragma unroll
				for (int j = 0; j < 4; j++) {
					float2 wf = __bfloat1622float2(w2[j]), xf = __bfloat1622float2(x2[j]);
					acc[m] += wf.x * xf.x + wf.y * xf.y;
				}
			}
		}
	}
#pragma unroll
	for (int m = 0; m < NR; m++) {
		float v = warp_sum(acc[m]);
		if (lane == 0)
			out[(size_t)m * OC + o] = tobf(v + (bias ? bf(bias[o]) : 0.0f));
	}
}

extern "C" int
rlk_gemv_ok(int N, int C, const void *inp, const void *w)
{
	return N >= 1 && N <= 4 && C > 0 && C % 8 == 0 && C <= 8192 && ((uintptr_t)inp & 15) == 0 &&
	    ((uintptr_t)w & 15) == 0;
}

extern "C" int
rlk_gemv(void *s, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC)
{
	if (OC <= 0)
		return 0;
	if (!rlk_gemv_ok(N, C, inp, w))
		return (int)cudaErrorInvalidValue;
	unsigned g = (unsigned)((OC + GV_WARPS - 1) / GV_WARPS);
	bf16 *o = (bf16 *)out;
	const bf16 *x = (const bf16 *)inp, *wt = (const bf16 *)w, *b = (const bf16 *)bias;
	cudaStream_t st = RLK_STREAM(s);
	switch (N) {
	case 1: k_gemv<1><<<g, GV_WARPS * 32, 0, st>>>(o, x, wt, b, C, OC); break;
	case 2: k_gemv<2><<<g, GV_WARPS * 32, 0, st>>>(o, x, wt, b, C, OC); break;
	case 3: k_gemv<3><<<g, GV_WARPS * 32, 0, st>>>(o, x, wt, b, C, OC); break;
	default: k_gemv<4><<<g, GV_WARPS * 32, 0, st>>>(o, x, wt, b, C, OC); break;
	}
	RLK_RET();
}

/*
 * decode.cu — decode attention over the paged KV cache, split over the context
 * (flash-decoding style): the default attn_decode for HD 64 or 128 and up to 8
 * query heads per KV head.  Same function as k_attn_decode in attn.cu (which
 * stays for other shapes and as RL_CUDA_DECODE_ATTN=v1).
 *
 * Work: one block of 4 warps per (sequence, KV head, split); the block handles
 * every query head of its KV head, so each cached K/V row is read once per
 * group (GQA) instead of once per query head.  The nsplit x 4 warps of a
 * (sequence, KV head) take keys s = worker, worker + nsplit*4, ..., each lane
 * HD/32 elements of a row (a warp reads one 128- or 256-byte row at a time,
 * coalesced), dot products reduced across the warp, an online softmax per
 * warp in fp32.  The block merges its 4 warps; with nsplit > 1 it writes
 * (acc, m, l) partials to a workspace and a second kernel merges the splits.
 * nsplit is chosen by the caller from B and NKV only (never from context
 * lengths, which stay in device memory), so a CUDA graph can hold the launch.
 *
 * Leaves out: HD other than 64/128 and more than 8 query heads per KV head
 * (attn.cu's kernel).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define DC_WARPS 4
#define DC_GMAX 8
#define DC_UNROLL 4

template <int HD>
__global__ void __launch_bounds__(DC_WARPS * 32)
k_decode_split(bf16 *out, float *ws, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit)
{
	constexpr int PL = HD / 32;  /* elements per lane: 2 or 4 */
	__shared__ float sm_m[DC_WARPS][DC_GMAX], sm_l[DC_WARPS][DC_GMAX];
	__shared__ float sm_acc[DC_WARPS][DC_GMAX][HD];
	const int G = NH / NKV;
	const int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, split = blockIdx.y;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	float q[DC_GMAX][PL], acc[DC_GMAX][PL], m[DC_GMAX], l[DC_GMAX];

#pragma unroll
	for (int g = 0; g < DC_GMAX; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int e = 0; e < PL; e++) {
			acc[g][e] = 0.0f;
			q[g][e] = 0.0f;
		}
		if (g < G) {
			const bf16 *qp = qkv + (size_t)b * LD + (size_t)(kvh * G + g) * HD + lane * PL;
#pragma unroll
			for (int e = 0; e < PL; e++)
				q[g][e] = bf(qp[e]) * scale;
		}
	}
	const int L = ctx_len[b], W = nsplit * DC_WARPS;
	const int32_t *tab = bt + (size_t)b * MAXBLK;
	/* DC_UNROLL keys per round, their rows loaded before any is used (loads in flight);
	 * a warp still takes its keys in the order s, s + W, s + 2W, ... */
	for (int s0 = split * DC_WARPS + warp; s0 < L; s0 += DC_UNROLL * W) {
		float kf[DC_UNROLL][PL], vf[DC_UNROLL][PL];
#pragma unroll
		for (int u = 0; u < DC_UNROLL; u++) {
			int s = s0 + u * W;
#pragma unroll
			for (int e = 0; e < PL; e++)
				kf[u][e] = vf[u][e] = 0.0f;
			if (s < L) {
				size_t row = ((size_t)tab[s / BS] * BS + s % BS) * kvrow + (size_t)kvh * HD + lane * PL;
#pragma unroll
				for (int e = 0; e < PL; e += 2) {
					float2 k2 = __bfloat1622float2(*(const __nv_bfloat162 *)(kc + row + e));
					float2 v2 = __bfloat1622float2(*(const __nv_bfloat162 *)(vc + row + e));
					kf[u][e] = k2.x;
					kf[u][e + 1] = k2.y;
					vf[u][e] = v2.x;
					vf[u][e + 1] = v2.y;
				}
			}
		}
#pragma unroll
		for (int u = 0; u < DC_UNROLL; u++) {
			if (s0 + u * W >= L)
				continue;  /* the same in every lane of the warp */
#pragma unroll
			for (int g = 0; g < DC_GMAX; g++) {
				if (g >= G)
					continue;  /* not break: constant indices keep q, acc in registers */
				float d = 0.0f;
#pragma unroll
				for (int e = 0; e < PL; e++)
					d += q[g][e] * kf[u][e];
				d = warp_sum(d);  /* the same value in every lane (xor butterfly) */
				float mn = fmaxf(m[g], d), corr = __expf(m[g] - mn), p = __expf(d - mn);
				l[g] = l[g] * corr + p;
#pragma unroll
				for (int e = 0; e < PL; e++)
					acc[g][e] = acc[g][e] * corr + p * vf[u][e];
				m[g] = mn;
			}
		}
	}
	/* merge the block's warps */
#pragma unroll
	for (int g = 0; g < DC_GMAX; g++) {
		if (g >= G)
			continue;
#pragma unroll
		for (int e = 0; e < PL; e++)
			sm_acc[warp][g][lane * PL + e] = acc[g][e];
		if (lane == 0) {
			sm_m[warp][g] = m[g];
			sm_l[warp][g] = l[g];
		}
	}
	__syncthreads();
	for (int t = threadIdx.x; t < G * HD; t += blockDim.x) {
		int g = t / HD, d = t % HD, h = kvh * G + g;
		float M = -INFINITY, ls = 0.0f, a = 0.0f;
		for (int w = 0; w < DC_WARPS; w++)
			M = fmaxf(M, sm_m[w][g]);
		if (M != -INFINITY)
			for (int w = 0; w < DC_WARPS; w++) {
				if (sm_m[w][g] == -INFINITY)
					continue;
				float c = __expf(sm_m[w][g] - M);
				ls += sm_l[w][g] * c;
				a += sm_acc[w][g][d] * c;
			}
		if (nsplit == 1) {
			out[(size_t)b * NH * HD + (size_t)h * HD + d] = tobf(a / ls);
		} else {
			float *p = ws + (((size_t)b * NH + h) * nsplit + split) * (HD + 2);
			p[d] = a;
			if (d == 0) {
				p[HD] = M;
				p[HD + 1] = ls;
			}
		}
	}
}

/* out (B, NH*HD) from the nsplit partials of each (sequence, head). */
__global__ void
k_decode_merge(bf16 *out, const float *ws, int HD, int nsplit)
{
	const int bh = blockIdx.x, d = threadIdx.x;
	const float *p = ws + (size_t)bh * nsplit * (HD + 2);
	float M = -INFINITY, ls = 0.0f, a = 0.0f;
	for (int k = 0; k < nsplit; k++)
		M = fmaxf(M, p[(size_t)k * (HD + 2) + HD]);
	for (int k = 0; k < nsplit; k++) {
		const float *pk = p + (size_t)k * (HD + 2);
		if (pk[HD] == -INFINITY)
			continue;
		float c = __expf(pk[HD] - M);
		ls += pk[HD + 1] * c;
		a += pk[d] * c;
	}
	if (d < HD)
		out[(size_t)bh * HD + d] = tobf(a / ls);
}

extern "C" int
rlk_attn_decode_split_ok(int NH, int NKV, int HD)
{
	return (HD == 64 || HD == 128) && NKV > 0 && NH % NKV == 0 && NH / NKV <= DC_GMAX;
}

extern "C" size_t
rlk_attn_decode_ws_bytes(int B, int NH, int HD, int nsplit)
{
	return nsplit > 1 ? (size_t)B * NH * nsplit * (HD + 2) * sizeof(float) : 0;
}

extern "C" int
rlk_attn_decode_split(void *s, float *ws, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD, int BS, int MAXBLK,
    int nsplit)
{
	if (B <= 0)
		return 0;
	if (!rlk_attn_decode_split_ok(NH, NKV, HD) || nsplit < 1 || nsplit > 65535 || (nsplit > 1 && !ws))
		return (int)cudaErrorInvalidValue;
	dim3 grid((unsigned)(B * NKV), (unsigned)nsplit);
	if (HD == 64)
		k_decode_split<64><<<grid, DC_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)out, ws, (const bf16 *)qkv,
		    (const bf16 *)kc, (const bf16 *)vc, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit);
	else
		k_decode_split<128><<<grid, DC_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)out, ws, (const bf16 *)qkv,
		    (const bf16 *)kc, (const bf16 *)vc, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit);
	int e = (int)cudaGetLastError();
	if (e || nsplit == 1)
		return e;
	k_decode_merge<<<B * NH, HD, 0, RLK_STREAM(s)>>>((bf16 *)out, ws, HD, nsplit);
	RLK_RET();
}

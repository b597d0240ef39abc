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
 * (acc, m, l) partials to a workspace, counts itself on a per-(sequence, KV head)
 * counter, and the block that finishes last merges the splits in a fixed order
 * and resets the counter (dc_merge_last); without counters (RL_CUDA_DECODE_MERGE=0)
 * a second kernel merges them.  nsplit is chosen by the caller from B and NKV only
 * (never from context lengths, which stay in device memory), so a CUDA graph can
 * hold the launch.
 *
 * The device code of the merges and of the key-per-lane kernel is in decode.cuh (step.cu
 * runs it too); k_decode_split, the kernels' wrappers and the launcher here.
 *
 * Leaves out: HD other than 64/128 and more than 8 query heads per KV head
 * (attn.cu's kernel).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"
#include "kernels/decode.cuh"

/* ==== decode kernels (kernels/emu/run.sh cuts from here to the first launcher) */
template <int HD, int G>
__global__ void __launch_bounds__(DC_WARPS * 32)
k_decode_split(bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit, int min_keys)
{
	constexpr int PL = HD / 32;  /* elements per lane: 2 or 4 */
	__shared__ dc_fin_sm<HD, G, DC_WARPS> sh;
	const int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, split = blockIdx.y;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	pdl_trigger();
	pdl_wait();  /* q and the cache rows are the kernels' ahead (common.cuh) */
	const int L = ctx_len[b], ns = cnt ? dc_splits(L, nsplit, min_keys) : nsplit;
	if (split >= ns)
		return;  /* a split this context does not take */
	float q[G][PL], acc[G][PL], m[G], l[G];

#pragma unroll
	for (int g = 0; g < G; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
		const bf16 *qp = qkv + (size_t)b * LD + (size_t)(kvh * G + g) * HD + lane * PL;
#pragma unroll
		for (int e = 0; e < PL; e++) {
			acc[g][e] = 0.0f;
			q[g][e] = bf(qp[e]) * scale;
		}
	}
	const int W = ns * DC_WARPS;
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
			for (int g = 0; g < G; g++) {
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
	dc_finish<HD, G, DC_WARPS>(sh, acc, m, l, out, ws, wml, cnt, (int)blockIdx.x, b, kvh, split, NH, nsplit, ns);
}

/* dc_lane (decode.cuh) as a kernel of its own: a block of DC_WARPS warps per (sequence, KV head,
 * split), launched programmatically */
template <int HD, int G>
__global__ void __launch_bounds__(DC_WARPS * 32)
k_decode_lane(bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit, int min_keys)
{
	__shared__ dc_lane_sm<HD, G, DC_WARPS> sh;
	pdl_trigger();
	pdl_wait();  /* q and the cache rows are the kernels' ahead (common.cuh) */
	const int ns = cnt ? dc_splits(ctx_len[blockIdx.x / NKV], nsplit, min_keys) : nsplit;
	if ((int)blockIdx.y >= ns)
		return;  /* a split this context does not take */
	dc_lane<HD, G, DC_WARPS>(sh, out, ws, wml, cnt, qkv, kc, vc, bt, ctx_len, NH, NKV, BS, MAXBLK, nsplit, ns,
	    (int)blockIdx.x, (int)blockIdx.y);
}

/* out (B, NH*HD) from the nsplit partials of each (sequence, head): the merge as a
 * separate kernel (RL_CUDA_DECODE_MERGE=0, or more than DC_MAXSPLIT splits).  No branch
 * on the loaded values inside the loops, so the loads of the splits are in flight
 * together (an empty split has m = -inf and l = acc = 0: its weight is 0). */
__global__ void
k_decode_merge(bf16 *out, const float *ws, const float2 *wml, int HD, int nsplit)
{
	const int bh = blockIdx.x, d = threadIdx.x;
	const float *p = ws + (size_t)bh * nsplit * HD;
	const float2 *ml = wml + (size_t)bh * nsplit;
	float M = -INFINITY, ls = 0.0f, a = 0.0f;
#pragma unroll 8
	for (int k = 0; k < nsplit; k++)
		M = fmaxf(M, ml[k].x);
	if (M != -INFINITY) {
#pragma unroll 8
		for (int k = 0; k < nsplit; k++) {
			float c = __expf(ml[k].x - M);
			ls += ml[k].y * c;
			a += p[(size_t)k * HD + d] * c;
		}
	}
	if (d < HD)
		out[(size_t)bh * HD + d] = tobf(a / ls);
}

extern "C" int
rlk_attn_decode_split_ok(int NH, int NKV, int HD)
{
	return (HD == 64 || HD == 128) && NKV > 0 && NH % NKV == 0 && NH / NKV <= DC_GMAX;
}

static_assert(DC_MAXSPLIT == RLK_DECODE_MAXSPLIT, "launch.h's RLK_DECODE_MAXSPLIT");

/* acc (B NH nsplit HD floats), then (m, l) (B NH nsplit float2) */
extern "C" size_t
rlk_attn_decode_ws_bytes(int B, int NH, int HD, int nsplit)
{
	return nsplit > 1 ? (size_t)B * NH * nsplit * (HD + 2) * sizeof(float) : 0;
}

extern "C" int
rlk_attn_decode_split(void *s, float *ws, unsigned *cnt, void *out, const void *qkv, const void *kc,
    const void *vc, const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD, int BS,
    int MAXBLK, int nsplit, int lane, int min_keys)
{
	if (B <= 0)
		return 0;
	if (!rlk_attn_decode_split_ok(NH, NKV, HD) || nsplit < 1 || nsplit > 65535 || (nsplit > 1 && !ws))
		return (int)cudaErrorInvalidValue;
	if (nsplit == 1 || nsplit > DC_MAXSPLIT)
		cnt = NULL;
	dim3 grid((unsigned)(B * NKV), (unsigned)nsplit);
	const bf16 *q = (const bf16 *)qkv, *k = (const bf16 *)kc, *v = (const bf16 *)vc;
	float2 *wml = nsplit > 1 ? (float2 *)(ws + (size_t)B * NH * nsplit * HD) : NULL;
	cudaStream_t st = RLK_STREAM(s);
	cudaError_t le = cudaSuccess;
#define DS(H, G) do { if (lane) \
		le = rlk_launch(k_decode_lane<H, G>, grid, dim3(DC_WARPS * 32), 0, st, (bf16 *)out, ws, wml, cnt, q, k, \
		    v, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit, min_keys); \
	else \
		le = rlk_launch(k_decode_split<H, G>, grid, dim3(DC_WARPS * 32), 0, st, (bf16 *)out, ws, wml, cnt, q, k, \
		    v, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit, min_keys); } while (0)
#define DSG(H) switch (NH / NKV) { case 1: DS(H, 1); break; case 2: DS(H, 2); break; case 3: DS(H, 3); break; \
	case 4: DS(H, 4); break; case 5: DS(H, 5); break; case 6: DS(H, 6); break; case 7: DS(H, 7); break; \
	default: DS(H, 8); break; }
	if (HD == 64)
		DSG(64)
	else
		DSG(128)
#undef DSG
#undef DS
	int e = le != cudaSuccess ? (int)le : (int)cudaGetLastError();
	if (e || nsplit == 1 || cnt)
		return e;
	k_decode_merge<<<B * NH, HD, 0, RLK_STREAM(s)>>>((bf16 *)out, ws, wml, HD, nsplit);
	RLK_RET();
}

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

/* The same function for a few sequences, all keys of a round in flight at once
 * (RL_CUDA_DECODE_ATTN=wide; never run on a GPU yet: docs/cuda.md).  At one slot the split
 * kernels spend their time in a chain of dependent memory round trips (ncu, H100: 10 us a
 * GPT-2 layer at a context of 64-76 keys): the context length, then the block table, then
 * the K rows, then the V rows 8 or 16 at a time, then the partials, the fence, the counter
 * and the merge's loads.  Here a block of NW warps takes a (sequence, KV head, split): for a few
 * sequences (the caller's nsplit > 1) dw_nw's 16 at HD 64 (512 keys a round) or 8 at
 * HD 128, else 4 (many sequences: smaller blocks, more of them resident):
 *   - the context length, the group's queries and each lane's first key's block-table
 *     entry are loaded together (the entry before the length is known: the index is
 *     clamped to the table, the entry used only for a key < L);
 *   - a warp takes 32 consecutive keys; each lane loads its key's K row (16-byte loads)
 *     and, in the same round, its HD/32 elements of all 32 V rows (the rows' cache
 *     indices passed through shared memory), so K and V are one round trip together;
 *   - the dots against the group's queries in shared memory, the online softmax per warp
 *     (one warp max and sum per 32 keys), then the V rows summed with the probabilities
 *     read back from shared memory, as dc_lane;
 *   - the block's warps merged by dc_finish; a context of more than min_keys keys takes
 *     further splits merged in the kernel by the last block (dc_merge_last), so a short
 *     context never pays the merge.
 * The in-loop shared memory (probabilities, row indices) and dc_finish's share storage: a
 * block barrier between them. */
template <int HD>
struct dw_nw {
	static constexpr int NW = HD == 64 ? 16 : 8;  /* registers: 128 a thread at 512 threads */
};
#define DW_SMALL 4  /* k_decode_wide's warps a block with many sequences (nsplit 1) */
template <int HD, int G, int NW>
struct dw_sm {
	float sq[G][HD];
	union {
		struct {
			float sp[NW][G][32];
			int srow[NW][32];
		} lp;
		dc_fin_sm<HD, G, NW> fin;
	} u;
};

template <int HD, int G, int NW>
__global__ void __launch_bounds__(NW * 32)
k_decode_wide(bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv, const bf16 *kc, const bf16 *vc,
    const int32_t *bt, const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit, int min_keys)
{
	constexpr int PL = HD / 32, NV = HD / 8;
	__shared__ dw_sm<HD, G, NW> sh;
	float (&sq)[G][HD] = sh.sq;
	float (&sp)[NW][G][32] = sh.u.lp.sp;
	int (&srow)[NW][32] = sh.u.lp.srow;
	const int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, split = blockIdx.y;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	const int32_t *tab = bt + (size_t)b * MAXBLK;
	pdl_trigger();
	pdl_wait();  /* q, the cache rows, the lengths and the table are the kernels' ahead */
	const int cfirst = (split * NW + warp) * 32;
	int tb = (cfirst + lane) / BS;
	int te = tab[tb < MAXBLK ? tb : MAXBLK - 1];
	const int L = ctx_len[b];
	for (int t = threadIdx.x; t < G * HD / 8; t += NW * 32) {
		uint4 u = *(const uint4 *)(qkv + (size_t)b * LD + (size_t)kvh * G * HD + (size_t)t * 8);
		const bf16 *a = (const bf16 *)&u;
#pragma unroll
		for (int e = 0; e < 8; e++)
			sq[t * 8 / HD][t * 8 % HD + e] = bf(a[e]) * scale;
	}
	__syncthreads();
	const int ns = cnt ? dc_splits(L, nsplit, min_keys) : nsplit;
	if (split >= ns)
		return;  /* the whole block: a split this context does not take */
	float acc[G][PL] = {}, m[G], l[G] = {};
#pragma unroll
	for (int g = 0; g < G; g++)
		m[g] = -INFINITY;
	const int W = ns * NW;
	for (int c0 = cfirst; c0 < L; c0 += W * 32) {
		const int s = c0 + lane, n = L - c0 < 32 ? L - c0 : 32;
		if (c0 != cfirst)
			te = s < L ? tab[s / BS] : 0;
		/* the key's cache row (an int: a cache of fewer than 2^31 token rows) */
		const int r = s < L ? te * BS + s % BS : 0;
		srow[warp][lane] = r;
		__syncwarp();
		uint4 kr[NV];
#pragma unroll
		for (int i = 0; i < NV; i++)
			kr[i] = s < L ? *(const uint4 *)(kc + (size_t)r * kvrow + (size_t)kvh * HD + i * 8)
			              : make_uint4(0, 0, 0, 0);
		/* this lane's PL elements of the 32 V rows, in flight with the K rows */
		__nv_bfloat162 vr[32][PL / 2];
#pragma unroll
		for (int j = 0; j < 32; j++) {
			const int rj = srow[warp][j];
#pragma unroll
			for (int e = 0; e < PL / 2; e++)
				vr[j][e] = j < n ? *(const __nv_bfloat162 *)(vc + (size_t)rj * kvrow + (size_t)kvh * HD + lane * PL + 2 * e)
				                 : __floats2bfloat162_rn(0.0f, 0.0f);
		}
		float d[G];
		dc_dots<HD, G>(d, kr, sq);
#pragma unroll
		for (int g = 0; g < G; g++)
			d[g] = s < L ? d[g] : -INFINITY;
		dc_online<G, PL>(m, l, acc, d, s < L, sp[warp], lane);
		__syncwarp();
#pragma unroll
		for (int j = 0; j < 32; j += 4) {
			if (j >= n)
				break;  /* the same in every lane; the rows past n hold 0 and p 0 */
#pragma unroll
			for (int g = 0; g < G; g++) {
				const float4 p4 = *(const float4 *)&sp[warp][g][j];
				const float pj[4] = { p4.x, p4.y, p4.z, p4.w };
#pragma unroll
				for (int u = 0; u < 4; u++)
#pragma unroll
					for (int e = 0; e < PL / 2; e++) {
						float2 v2 = __bfloat1622float2(vr[j + u][e]);
						acc[g][2 * e] += pj[u] * v2.x;
						acc[g][2 * e + 1] += pj[u] * v2.y;
					}
			}
		}
		__syncwarp();  /* sp and srow are rewritten by the next round */
	}
	__syncthreads();  /* every warp done with sp and srow: dc_finish writes over them */
	dc_finish<HD, G, NW>(sh.u.fin, acc, m, l, out, ws, wml, cnt, (int)blockIdx.x, b, kvh, split, NH, nsplit, ns);
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

/* k_decode_wide's warps a block (launch.h, rlk_set_decode_wide): 0 by the rule (16 at HD 64 or
 * 8 at 128 with few sequences, DW_SMALL with many), else 4, 8 or 16 (8 at HD 128) */
static int rlk_wide_warps;

extern "C" void
rlk_set_decode_wide(int nw)
{
	rlk_wide_warps = nw == 4 || nw == 8 || nw == 16 ? nw : 0;
}

/* k_decode_wide<H, G, nw> (16 only at HD 64); min_keys 0: a round of the block */
template <int H, int G>
static cudaError_t
dw_launch(int nw, dim3 grid, cudaStream_t st, bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *q,
    const bf16 *k, const bf16 *v, const int32_t *bt, const int32_t *cl, int NH, int NKV, int BS, int MAXBLK,
    int nsplit, int min_keys)
{
	if constexpr (H == 64) {
		if (nw == 16)
			return rlk_launch(k_decode_wide<H, G, 16>, grid, dim3(16 * 32), 0, st, out, ws, wml, cnt, q, k, v, bt,
			    cl, NH, NKV, BS, MAXBLK, nsplit, min_keys > 0 ? min_keys : 16 * 32);
	}
	if (nw >= 8)
		return rlk_launch(k_decode_wide<H, G, 8>, grid, dim3(8 * 32), 0, st, out, ws, wml, cnt, q, k, v, bt, cl,
		    NH, NKV, BS, MAXBLK, nsplit, min_keys > 0 ? min_keys : 8 * 32);
	return rlk_launch(k_decode_wide<H, G, 4>, grid, dim3(4 * 32), 0, st, out, ws, wml, cnt, q, k, v, bt, cl, NH,
	    NKV, BS, MAXBLK, nsplit, min_keys > 0 ? min_keys : 4 * 32);
}

/* acc (B NH nsplit HD floats), then (m, l) (B NH nsplit float2) */
extern "C" size_t
rlk_attn_decode_ws_bytes(int B, int NH, int HD, int nsplit)
{
	return nsplit > 1 ? (size_t)B * NH * nsplit * (HD + 2) * sizeof(float) : 0;
}

extern "C" int
rlk_attn_decode_split(void *s, float *ws, unsigned *cnt, void *out, const void *qkv, const void *kc,
    const void *vc, const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD, int BS,
    int MAXBLK, int nsplit, int kind, int min_keys)
{
	if (B <= 0)
		return 0;
	if (!rlk_attn_decode_split_ok(NH, NKV, HD) || nsplit < 1 || nsplit > 65535 || (nsplit > 1 && !ws) ||
	    kind < RLK_DEC_SPLIT || kind > RLK_DEC_WIDE)
		return (int)cudaErrorInvalidValue;
	if (kind == RLK_DEC_WIDE && !rlk_a16(qkv))
		kind = RLK_DEC_LANE;  /* its query loads are 16-byte ones (the cache rows' are in both) */
	if (nsplit == 1 || nsplit > DC_MAXSPLIT)
		cnt = NULL;
	dim3 grid((unsigned)(B * NKV), (unsigned)nsplit);
	const bf16 *q = (const bf16 *)qkv, *k = (const bf16 *)kc, *v = (const bf16 *)vc;
	float2 *wml = nsplit > 1 ? (float2 *)(ws + (size_t)B * NH * nsplit * HD) : NULL;
	cudaStream_t st = RLK_STREAM(s);
	cudaError_t le = cudaSuccess;
	const int nw = rlk_wide_warps ? rlk_wide_warps : nsplit > 1 ? (HD == 64 ? dw_nw<64>::NW : dw_nw<128>::NW) : DW_SMALL;
#define DS(H, G) do { if (kind == RLK_DEC_WIDE) \
		le = dw_launch<H, G>(nw, grid, st, (bf16 *)out, ws, wml, cnt, q, k, v, block_table, ctx_len, NH, NKV, BS, \
		    MAXBLK, nsplit, min_keys); \
	else if (kind == RLK_DEC_LANE) \
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

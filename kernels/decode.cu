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
 * Leaves out: HD other than 64/128 and more than 8 query heads per KV head
 * (attn.cu's kernel).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define DC_WARPS 4
#define DC_GMAX 8
#define DC_UNROLL 8
/* k_decode_lane's V rows in flight with GQA (G > 1; DC_UNROLL without).  H100, session 6:
 * Qwen (G 7) at 256 slots 116-123K tok/s with 8 (6 runs), 121-126K with 16 (3), 113K
 * with 32; GPT-2 (G 1) 160-166K with 16 against 165-169K with 8.  (kernels/emu/run.sh
 * takes the DC_ defines line by line: comments on lines of their own.) */
#define DC_VUNROLL 16
#define DC_MAXSPLIT 64  /* splits the in-kernel merge takes (two per lane of a warp): RLK_DECODE_MAXSPLIT */
#define DC_MUNROLL 16   /* partial rows in flight per thread in that merge */

/* The in-kernel merge of the splits (counter pattern), called by every block of a
 * (sequence, KV head) after it wrote its partials.  Each block fences its partials and
 * counts itself on cnt[blockIdx.x]; the block that arrives last (whichever it is) merges
 * the nsplit partials of the G query heads: one warp per head loads the splits' (m, l)
 * (two per lane), takes the warp max M and the weights exp(m_k - M) into shared memory,
 * L = sum of weight x l over the splits (warp sum, a fixed order); then each thread takes
 * 4 consecutive outputs of a head and sums weight x acc over the splits k = 0, 1, ...
 * with 16-byte loads whose addresses do not depend on loaded values (DC_MUNROLL in
 * flight).  The order of every sum is fixed by the split index, never by the arrival
 * order: the output is the same whichever block merges.  The merging block sets the
 * counter back to 0 (the next launch, a CUDA graph replay included, finds it so).
 * Partials are read through L2 (__ldcg): other blocks wrote them during this kernel. */
template <int HD, int G>
static __device__ void
dc_merge_last(bf16 *out, const float *ws, const float2 *wml, unsigned *cnt, int b, int kvh, int NH, int nsplit)
{
	constexpr int NQ = HD / 4;
	__shared__ float sw[G][DC_MAXSPLIT], sl[G];
	__shared__ int last;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	__threadfence();  /* this thread's partials visible to the whole device ... */
	__syncthreads();  /* ... for every thread of the block, before it is counted */
	if (threadIdx.x == 0)
		last = atomicAdd(&cnt[blockIdx.x], 1u) == (unsigned)nsplit - 1u;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	const size_t p0 = ((size_t)b * NH + (size_t)kvh * G) * nsplit;  /* the group's first partial */
	for (int g = warp; g < G; g += DC_WARPS) {
		const float2 *ml = wml + p0 + (size_t)g * nsplit;
		float2 x0 = make_float2(-INFINITY, 0.0f), x1 = make_float2(-INFINITY, 0.0f);
		if (lane < nsplit)
			x0 = __ldcg(ml + lane);
		if (lane + 32 < nsplit)
			x1 = __ldcg(ml + lane + 32);
		float M = warp_max(fmaxf(x0.x, x1.x)), w0 = 0.0f, w1 = 0.0f;
		if (M != -INFINITY) {  /* an empty split: m = -inf, l = acc = 0, weight 0 */
			w0 = __expf(x0.x - M);
			w1 = __expf(x1.x - M);
		}
		float L = warp_sum(w0 * x0.y + w1 * x1.y);
		if (lane < nsplit)
			sw[g][lane] = w0;
		if (lane + 32 < nsplit)
			sw[g][lane + 32] = w1;
		if (lane == 0)
			sl[g] = L;
	}
	__syncthreads();
	for (int t = threadIdx.x; t < G * NQ; t += blockDim.x) {
		const int g = t / NQ, q = t % NQ;
		const float4 *p = (const float4 *)(ws + (p0 + (size_t)g * nsplit) * HD) + q;
		float ax = 0.0f, ay = 0.0f, az = 0.0f, aw = 0.0f;
#pragma unroll 16  /* DC_MUNROLL */
		for (int k = 0; k < nsplit; k++) {
			float4 v = __ldcg(p + (size_t)k * NQ);
			float w = sw[g][k];
			ax += w * v.x;
			ay += w * v.y;
			az += w * v.z;
			aw += w * v.w;
		}
		const float L = sl[g];
		bf16 *o = out + ((size_t)b * NH + (size_t)kvh * G + g) * HD + q * 4;
		o[0] = tobf(ax / L);
		o[1] = tobf(ay / L);
		o[2] = tobf(az / L);
		o[3] = tobf(aw / L);
	}
	if (threadIdx.x == 0)
		cnt[blockIdx.x] = 0u;
}

/* The end of both kernels: merge the block's warps (online-softmax states of each query
 * head of the group) and write out (nsplit 1), or the split's partials: acc (HD floats)
 * in ws, (m, l) in wml, at index ((b NH + h) nsplit + split); then, with cnt, the last
 * block of the (sequence, KV head) merges the splits (dc_merge_last), else
 * k_decode_merge does after the kernel. */
template <int HD, int G>
static __device__ __forceinline__ void
dc_finish(const float (&acc)[G][HD / 32], const float (&m)[G], const float (&l)[G], bf16 *out, float *ws,
    float2 *wml, unsigned *cnt, int b, int kvh, int split, int NH, int nsplit)
{
	constexpr int PL = HD / 32;
	__shared__ float sm_m[DC_WARPS][G], sm_l[DC_WARPS][G];
	__shared__ float sm_acc[DC_WARPS][G][HD];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
	for (int g = 0; g < G; g++) {
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
			size_t pi = ((size_t)b * NH + h) * nsplit + split;
			ws[pi * HD + d] = a;
			if (d == 0)
				wml[pi] = make_float2(M, ls);
		}
	}
	if (nsplit > 1 && cnt)
		dc_merge_last<HD, G>(out, ws, wml, cnt, b, kvh, NH, nsplit);
}

template <int HD, int G>
__global__ void __launch_bounds__(DC_WARPS * 32)
k_decode_split(bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit)
{
	constexpr int PL = HD / 32;  /* elements per lane: 2 or 4 */
	const int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, split = blockIdx.y;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	pdl_trigger();
	pdl_wait();  /* q and the cache rows are the kernels' ahead (common.cuh) */
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
	dc_finish<HD, G>(acc, m, l, out, ws, wml, cnt, b, kvh, split, NH, nsplit);
}

/* The same function, a key per lane (the default; k_decode_split above stays as
 * RL_CUDA_DECODE_ATTN=split).  A warp takes 32 consecutive keys at a time: each lane
 * loads its key's whole K row (16-byte loads: HD/8 in flight per lane) and makes the
 * G dot products alone against the group's queries in shared memory, so a key costs
 * no shuffles; the softmax update is one warp max and one warp sum per 32 keys.  Then
 * the warp walks the 32 V rows in order, each lane owning HD/32 output elements
 * (coalesced rows, DC_VUNROLL rows in flight, DC_UNROLL when G = 1), with the probabilities read back from
 * shared memory.  Chunks of 32 keys go to the nsplit x DC_WARPS workers in turn; the
 * block merge and the partials for k_decode_merge are those of k_decode_split. */
template <int HD, int G>
__global__ void __launch_bounds__(DC_WARPS * 32)
k_decode_lane(bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK, int nsplit)
{
	constexpr int PL = HD / 32, NV = HD / 8;
	__shared__ float sq[G][HD];
	__shared__ float sp[DC_WARPS][G][32];
	__shared__ long long srow[DC_WARPS][32];
	const int b = blockIdx.x / NKV, kvh = blockIdx.x % NKV, split = blockIdx.y;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	pdl_trigger();
	pdl_wait();  /* q and the cache rows are the kernels' ahead (common.cuh) */
	for (int t = threadIdx.x; t < G * HD; t += blockDim.x)
		sq[t / HD][t % HD] = bf(qkv[(size_t)b * LD + (size_t)kvh * G * HD + t]) * scale;
	__syncthreads();
	float acc[G][PL], m[G], l[G];
#pragma unroll
	for (int g = 0; g < G; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int e = 0; e < PL; e++)
			acc[g][e] = 0.0f;
	}
	const int L = ctx_len[b], W = nsplit * DC_WARPS;
	const int32_t *tab = bt + (size_t)b * MAXBLK;
	for (int c0 = (split * DC_WARPS + warp) * 32; c0 < L; c0 += W * 32) {
		const int s = c0 + lane, n = L - c0 < 32 ? L - c0 : 32;
		float d[G];
		if (s < L) {
			size_t row = ((size_t)tab[s / BS] * BS + s % BS) * kvrow + (size_t)kvh * HD;
			srow[warp][lane] = (long long)row;
			uint4 kr[NV];
#pragma unroll
			for (int i = 0; i < NV; i++)
				kr[i] = *(const uint4 *)(kc + row + i * 8);
#pragma unroll
			for (int g = 0; g < G; g++)
				d[g] = 0.0f;
#pragma unroll
			for (int i = 0; i < NV; i++) {
				const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&kr[i];
#pragma unroll
				for (int j = 0; j < 4; j++) {
					float2 kf = __bfloat1622float2(k2[j]);
#pragma unroll
					for (int g = 0; g < G; g++)
						d[g] += sq[g][i * 8 + 2 * j] * kf.x + sq[g][i * 8 + 2 * j + 1] * kf.y;
				}
			}
		} else {
#pragma unroll
			for (int g = 0; g < G; g++)
				d[g] = -INFINITY;
		}
#pragma unroll
		for (int g = 0; g < G; g++) {
			float mn = fmaxf(m[g], warp_max(d[g]));  /* finite: lane 0's key is < L */
			float p = s < L ? __expf(d[g] - mn) : 0.0f, corr = __expf(m[g] - mn);
			l[g] = l[g] * corr + warp_sum(p);
#pragma unroll
			for (int e = 0; e < PL; e++)
				acc[g][e] *= corr;
			m[g] = mn;
			sp[warp][g][lane] = p;
		}
		__syncwarp();
		constexpr int VU = G > 1 ? DC_VUNROLL : DC_UNROLL;
		for (int j0 = 0; j0 < n; j0 += VU) {
			float vf[VU][PL];
#pragma unroll
			for (int u = 0; u < VU; u++) {
#pragma unroll
				for (int e = 0; e < PL; e++)
					vf[u][e] = 0.0f;
				if (j0 + u < n) {
					const bf16 *vr = vc + (size_t)srow[warp][j0 + u] + lane * PL;
#pragma unroll
					for (int e = 0; e < PL; e += 2) {
						float2 v2 = __bfloat1622float2(*(const __nv_bfloat162 *)(vr + e));
						vf[u][e] = v2.x;
						vf[u][e + 1] = v2.y;
					}
				}
			}
#pragma unroll
			for (int u = 0; u < VU; u++) {
				if (j0 + u >= n)
					continue;  /* the same in every lane */
#pragma unroll
				for (int g = 0; g < G; g++) {
					float p = sp[warp][g][j0 + u];
#pragma unroll
					for (int e = 0; e < PL; e++)
						acc[g][e] += p * vf[u][e];
				}
			}
		}
		__syncwarp();  /* sp and srow are rewritten by the next chunk */
	}
	dc_finish<HD, G>(acc, m, l, out, ws, wml, cnt, b, kvh, split, NH, nsplit);
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
    int MAXBLK, int nsplit, int lane)
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
		    v, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit); \
	else \
		le = rlk_launch(k_decode_split<H, G>, grid, dim3(DC_WARPS * 32), 0, st, (bf16 *)out, ws, wml, cnt, q, k, \
		    v, block_table, ctx_len, NH, NKV, BS, MAXBLK, nsplit); } while (0)
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

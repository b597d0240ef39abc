/*
 * decode.cuh — the device code of decode.cu's split decode attention shared with step.cu's
 * persistent decode step: the key-per-lane body dc_lane, the block merge and partials
 * (dc_finish) and the in-kernel merge of the splits (dc_merge_last), for blocks of NW warps
 * (DC_WARPS in decode.cu, 8 in step.cu) and a unit (sequence, KV head) and split given as
 * arguments.  Device code only; every function is a template, so no symbol is defined twice.
 * What the code computes is described at the top of decode.cu.
 */
#ifndef RL_KERNELS_DECODE_CUH
#define RL_KERNELS_DECODE_CUH

#include "kernels/common.cuh"

/* ==== decode device code (kernels/emu/run.sh cuts from here to the end marker) */
#define DC_WARPS 4
#define DC_GMAX 8
#define DC_UNROLL 8
/* k_decode_lane's V rows in flight with GQA (G > 1; DC_UNROLL without).  H100, 2026-11-23:
 * Qwen (G 7) at 256 slots 116-123K tok/s with 8 (6 runs), 121-126K with 16 (3), 113K
 * with 32; GPT-2 (G 1) 160-166K with 16 against 165-169K with 8. */
#define DC_VUNROLL 16
#define DC_MAXSPLIT 64  /* splits the in-kernel merge takes (two per lane of a warp): RLK_DECODE_MAXSPLIT */
#define DC_MUNROLL 16   /* partial rows in flight per thread in that merge */

/* The splits a context of L keys takes of nsplit: one per min_keys keys, at least 1 (min_keys
 * 0: all nsplit).  Only with the in-kernel merge (the separate merge kernel reads every split's
 * partials); the splits past it do nothing. */
static __device__ __forceinline__ int
dc_splits(int L, int nsplit, int min_keys)
{
	if (min_keys <= 0)
		return nsplit;
	int n = (L + min_keys - 1) / min_keys;
	return n < 1 ? 1 : n > nsplit ? nsplit : n;
}

/* The shared memory of dc_finish (with dc_merge_last) and of dc_lane, blocks of NW warps: the
 * caller's (a __shared__ variable, or step.cu's dynamic shared memory) */
template <int HD, int G, int NW>
struct dc_fin_sm {
	float m[NW][G], l[NW][G];
	float acc[NW][G][HD];
	float sw[G][DC_MAXSPLIT], sl[G];  /* dc_merge_last */
	int last;
};
template <int HD, int G, int NW>
struct dc_lane_sm {
	float sq[G][HD];
	float sp[NW][G][32];
	long long srow[NW][32];
	dc_fin_sm<HD, G, NW> fin;
};

/* The in-kernel merge of the splits (counter pattern), called by every block of a
 * (sequence, KV head) after it wrote its partials.  Each block fences its partials and
 * counts itself on cnt[unit]; the block that arrives last (whichever it is) merges
 * the nsplit partials of the G query heads: one warp per head loads the splits' (m, l)
 * (two per lane), takes the warp max M and the weights exp(m_k - M) into shared memory,
 * L = sum of weight x l over the splits (warp sum, a fixed order); then each thread takes
 * 4 consecutive outputs of a head and sums weight x acc over the splits k = 0, 1, ...
 * with 16-byte loads whose addresses do not depend on loaded values (DC_MUNROLL in
 * flight).  The order of every sum is fixed by the split index, never by the arrival
 * order: the output is the same whichever block merges.  The merging block sets the
 * counter back to 0 (the next launch, a CUDA graph replay included, finds it so).
 * Partials are read through L2 (__ldcg): other blocks wrote them during this kernel.
 * unit: the (sequence, KV head) index b NKV + kvh, the counter's; NW warps a block; nsplit
 * the partials' stride per head, ns <= nsplit the splits taken (dc_splits). */
template <int HD, int G, int NW>
static __device__ void
dc_merge_last(dc_fin_sm<HD, G, NW> &sh, bf16 *out, const float *ws, const float2 *wml, unsigned *cnt, int unit,
    int b, int kvh, int NH, int nsplit, int ns)
{
	constexpr int NQ = HD / 4;
	float (&sw)[G][DC_MAXSPLIT] = sh.sw, (&sl)[G] = sh.sl;
	int &last = sh.last;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	__threadfence();  /* this thread's partials visible to the whole device ... */
	__syncthreads();  /* ... for every thread of the block, before it is counted */
	if (threadIdx.x == 0)
		last = atomicAdd(&cnt[unit], 1u) == (unsigned)ns - 1u;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	const size_t p0 = ((size_t)b * NH + (size_t)kvh * G) * nsplit;  /* the group's first partial */
	for (int g = warp; g < G; g += NW) {
		const float2 *ml = wml + p0 + (size_t)g * nsplit;
		float2 x0 = make_float2(-INFINITY, 0.0f), x1 = make_float2(-INFINITY, 0.0f);
		if (lane < ns)
			x0 = __ldcg(ml + lane);
		if (lane + 32 < ns)
			x1 = __ldcg(ml + lane + 32);
		float M = warp_max(fmaxf(x0.x, x1.x)), w0 = 0.0f, w1 = 0.0f;
		if (M != -INFINITY) {  /* an empty split: m = -inf, l = acc = 0, weight 0 */
			w0 = __expf(x0.x - M);
			w1 = __expf(x1.x - M);
		}
		float L = warp_sum(w0 * x0.y + w1 * x1.y);
		if (lane < ns)
			sw[g][lane] = w0;
		if (lane + 32 < ns)
			sw[g][lane + 32] = w1;
		if (lane == 0)
			sl[g] = L;
	}
	__syncthreads();
	for (int t = threadIdx.x; t < G * NQ; t += NW * 32) {
		const int g = t / NQ, q = t % NQ;
		const float4 *p = (const float4 *)(ws + (p0 + (size_t)g * nsplit) * HD) + q;
		float ax = 0.0f, ay = 0.0f, az = 0.0f, aw = 0.0f;
#pragma unroll 16  /* DC_MUNROLL */
		for (int k = 0; k < ns; k++) {
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
		cnt[unit] = 0u;
}

/* The end of both kernels: merge the block's warps (online-softmax states of each query
 * head of the group) and write out (nsplit 1), or the split's partials: acc (HD floats)
 * in ws, (m, l) in wml, at index ((b NH + h) nsplit + split); then, with cnt, the last
 * block of the (sequence, KV head) merges the splits (dc_merge_last), else
 * k_decode_merge does after the kernel.  unit: b NKV + kvh (the merge counter's index); NW
 * warps a block; the partials at stride nsplit, ns of them taken (ns < nsplit only with cnt:
 * dc_splits). */
template <int HD, int G, int NW>
static __device__ __forceinline__ void
dc_finish(dc_fin_sm<HD, G, NW> &sh, const float (&acc)[G][HD / 32], const float (&m)[G], const float (&l)[G],
    bf16 *out, float *ws, float2 *wml, unsigned *cnt, int unit, int b, int kvh, int split, int NH, int nsplit, int ns)
{
	constexpr int PL = HD / 32;
	float (&sm_m)[NW][G] = sh.m, (&sm_l)[NW][G] = sh.l;
	float (&sm_acc)[NW][G][HD] = sh.acc;
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
	for (int t = threadIdx.x; t < G * HD; t += NW * 32) {
		int g = t / HD, d = t % HD, h = kvh * G + g;
		float M = -INFINITY, ls = 0.0f, a = 0.0f;
		for (int w = 0; w < NW; w++)
			M = fmaxf(M, sm_m[w][g]);
		if (M != -INFINITY)
			for (int w = 0; w < NW; w++) {
				if (sm_m[w][g] == -INFINITY)
					continue;
				float c = __expf(sm_m[w][g] - M);
				ls += sm_l[w][g] * c;
				a += sm_acc[w][g][d] * c;
			}
		if (ns == 1) {
			out[(size_t)b * NH * HD + (size_t)h * HD + d] = tobf(a / ls);
		} else {
			size_t pi = ((size_t)b * NH + h) * nsplit + split;
			ws[pi * HD + d] = a;
			if (d == 0)
				wml[pi] = make_float2(M, ls);
		}
	}
	if (ns > 1 && cnt)
		dc_merge_last<HD, G, NW>(sh, out, ws, wml, cnt, unit, b, kvh, NH, nsplit, ns);
}

/* The G scores of a key: its K row kr (HD/8 16-byte chunks) against the group's queries in
 * shared memory sq (scaled), in the order of the row's elements (dc_lane, k_decode_wide) */
template <int HD, int G>
static __device__ __forceinline__ void
dc_dots(float (&d)[G], const uint4 (&kr)[HD / 8], const float (&sq)[G][HD])
{
#pragma unroll
	for (int g = 0; g < G; g++)
		d[g] = 0.0f;
#pragma unroll
	for (int i = 0; i < HD / 8; i++) {
		const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&kr[i];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			float2 kf = __bfloat1622float2(k2[j]);
#pragma unroll
			for (int g = 0; g < G; g++)
				d[g] += sq[g][i * 8 + 2 * j] * kf.x + sq[g][i * 8 + 2 * j + 1] * kf.y;
		}
	}
}

/* A warp's online softmax over its 32 keys (a key per lane; valid: the lane's key is in the
 * context, lane 0's always is; d -inf where it is not): m, l and acc rescaled to the new
 * maximum, the lane's probabilities into its warp's spw[g][lane] (the caller syncs the warp
 * before reading). */
template <int G, int PL>
static __device__ __forceinline__ void
dc_online(float (&m)[G], float (&l)[G], float (&acc)[G][PL], const float (&d)[G], int valid, float (&spw)[G][32],
    int lane)
{
#pragma unroll
	for (int g = 0; g < G; g++) {
		float mn = fmaxf(m[g], warp_max(d[g]));  /* finite: lane 0's key is < L */
		float p = valid ? __expf(d[g] - mn) : 0.0f, corr = __expf(m[g] - mn);
		l[g] = l[g] * corr + warp_sum(p);
#pragma unroll
		for (int e = 0; e < PL; e++)
			acc[g][e] *= corr;
		m[g] = mn;
		spw[g][lane] = p;
	}
}

/* The same function, a key per lane (the default; k_decode_split above stays as
 * RL_CUDA_DECODE_ATTN=split).  A warp takes 32 consecutive keys at a time: each lane
 * loads its key's whole K row (16-byte loads: HD/8 in flight per lane) and makes the
 * G dot products alone against the group's queries in shared memory, so a key costs
 * no shuffles; the softmax update is one warp max and one warp sum per 32 keys.  Then
 * the warp walks the 32 V rows in order, each lane owning HD/32 output elements
 * (coalesced rows, DC_VUNROLL rows in flight, DC_UNROLL when G = 1), with the probabilities read back from
 * shared memory.  Chunks of 32 keys go to the nsplit x NW workers in turn; the
 * block merge and the partials for k_decode_merge are those of k_decode_split.
 * dc_lane: one block of NW warps, the unit b NKV + kvh and the split (< ns) given
 * (k_decode_lane: blockIdx.x, blockIdx.y; step.cu: units strided over its grid); its shared
 * memory in sh; the keys over the ns splits taken, the partials at stride nsplit. */
template <int HD, int G, int NW>
static __device__ __forceinline__ void
dc_lane(dc_lane_sm<HD, G, NW> &sh, bf16 *out, float *ws, float2 *wml, unsigned *cnt, const bf16 *qkv,
    const bf16 *kc, const bf16 *vc, const int32_t *bt, const int32_t *ctx_len, int NH, int NKV, int BS, int MAXBLK,
    int nsplit, int ns, int unit, int split)
{
	constexpr int PL = HD / 32, NV = HD / 8;
	float (&sq)[G][HD] = sh.sq;
	float (&sp)[NW][G][32] = sh.sp;
	long long (&srow)[NW][32] = sh.srow;
	const int b = unit / NKV, kvh = unit % NKV;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	const float scale = 1.0f / sqrtf((float)HD);
	for (int t = threadIdx.x; t < G * HD; t += NW * 32)
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
	const int L = ctx_len[b], W = ns * NW;
	const int32_t *tab = bt + (size_t)b * MAXBLK;
	for (int c0 = (split * NW + warp) * 32; c0 < L; c0 += W * 32) {
		const int s = c0 + lane, n = L - c0 < 32 ? L - c0 : 32;
		float d[G];
		if (s < L) {
			size_t row = ((size_t)tab[s / BS] * BS + s % BS) * kvrow + (size_t)kvh * HD;
			srow[warp][lane] = (long long)row;
			uint4 kr[NV];
#pragma unroll
			for (int i = 0; i < NV; i++)
				kr[i] = *(const uint4 *)(kc + row + i * 8);
			dc_dots<HD, G>(d, kr, sq);
		} else {
#pragma unroll
			for (int g = 0; g < G; g++)
				d[g] = -INFINITY;
		}
		dc_online<G, PL>(m, l, acc, d, s < L, sp[warp], lane);
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
	dc_finish<HD, G, NW>(sh.fin, acc, m, l, out, ws, wml, cnt, unit, b, kvh, split, NH, nsplit, ns);
}

/* ==== end of decode device code */

#endif

/*
 * fuse.cu — the decode fusions of lib/ops.h (matmul_fused_fwd, rope_kv_write): fewer kernels
 * in a decode step at a few sequences, where each launch costs more than its work (2.5 to
 * 5 us a kernel in a CUDA graph on the H100 against 4 to 10 us for a layer's GEMVs).
 *
 * k_fused_gemv is gemv.cu's kernel (one warp per output feature, the weight row's 16-byte
 * chunks all in flight, N <= 4 rows of f32 sums) with
 *   - a norm prologue: the warps 0..N-1 of every block normalise one input row each into
 *     shared memory (RMSNorm or LayerNorm, the sums in k_norm_vec's order, so the same
 *     values as norm.cu's kernel), while the block's first weight chunks are in flight;
 *   - an epilogue on the rounded product y: residual add in place (out += y: lane m of
 *     the warp that owns feature o reads and writes out[m, o], nothing else touches it),
 *     GPT-2's tanh GELU, or SwiGLU (the warp computes gate row o and up row o + H of the
 *     same weight, rounds each to bf16, then silu(g) * u), each with the arithmetic of the
 *     separate kernel (elementwise.cu's k_add, k_gelu_fwd, k_swiglu_fwd).
 * The QKV epilogue (matmul_rope_kv_fwd): the warp computes the pair of rows (f, f + HD/2) of
 * a head, rotates q and k heads (RoPE as k_rope, on the rounded values) and writes k and v
 * heads to the paged cache too (as k_kv_write): the layer's QKV product, RoPE and cache
 * write in one kernel.
 * k_rope_kv: RoPE in place on the q and k heads (as k_rope) and the rotated k and the v
 * heads written to the paged cache (as k_kv_write), one thread per rotated pair.
 *
 * With a norm and many outputs (the LM head) the grid is what fits on the GPU at once and the
 * warps take outputs in strides (fu_grid).
 *
 * Leaves out: more than 4 rows (the caller runs the separate ops), backward.
 */
#include <atomic>

#include "kernels/common.cuh"
#include "kernels/launch.h"

/* the normalised input rows in dynamic shared memory (kernels/emu defines its own) */
#define FUSE_SMEM(name) extern __shared__ __align__(16) bf16 name[]

/* ==== fuse kernels (kernels/emu/run.sh cuts from here to the launchers marker) */
#define FU_WARPS 8
#define FU_INFL 8     /* 16-byte weight chunks in flight per lane (over the warp's weight rows) */
#define FU_GELU_K 0.7978845608028654f  /* sqrt(2/pi), as elementwise.cu */
#define FU_EP_QKV 4   /* the QKV epilogue: after lib/ops.h's RL_EP_* */

/* the QKV epilogue's arguments (rope_kv_write's) */
struct fu_qkv {
	bf16 *kc, *vc;
	const int32_t *pos, *slot;
	int NH, NKV, HD;
	float theta;
};

/* IF chunks of each of the NW weight rows w0 (and w1), from chunk c0 in steps of 32 */
template <int NW, int IF>
static __device__ __forceinline__ void
fu_load(uint4 (&wc)[NW][IF], const bf16 *w0, const bf16 *w1, int c0, int nch)
{
#pragma unroll
	for (int k = 0; k < IF; k++) {
		int c = c0 + k * 32;
#pragma unroll
		for (int r = 0; r < NW; r++)
			wc[r][k] = c < nch ? *(const uint4 *)((r ? w1 : w0) + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
	}
}

/* One warp: row xr (C) normalised into xs, as k_norm_vec computes it (the same sums in the
 * same order: per lane over its chunks lane*8 + 256k, then the warp). */
static __device__ __forceinline__ void
fu_norm_row(bf16 *xs, const bf16 *xr, const bf16 *nw, const bf16 *nb, int C, float eps, int ln, int lane)
{
	float s1 = 0.0f;
	for (int c = lane * 8; c < C; c += 256) {
		uint4 u = *(const uint4 *)(xr + c);
		const bf16 *a = (const bf16 *)&u;
#pragma unroll
		for (int e = 0; e < 8; e++)
			s1 += ln ? bf(a[e]) : bf(a[e]) * bf(a[e]);
	}
	s1 = warp_sum(s1);
	float mu = 0.0f, rs;
	if (ln) {
		mu = s1 / C;
		float var = 0.0f;
		for (int c = lane * 8; c < C; c += 256) {
			uint4 u = *(const uint4 *)(xr + c);
			const bf16 *a = (const bf16 *)&u;
#pragma unroll
			for (int e = 0; e < 8; e++) {
				float d = bf(a[e]) - mu;
				var += d * d;
			}
		}
		rs = rsqrtf(warp_sum(var) / C + eps);
	} else {
		rs = rsqrtf(s1 / C + eps);
	}
	for (int c = lane * 8; c < C; c += 256) {
		uint4 u = *(const uint4 *)(xr + c), wu = *(const uint4 *)(nw + c), bu = make_uint4(0, 0, 0, 0), o;
		if (ln && nb)
			bu = *(const uint4 *)(nb + c);
		const bf16 *a = (const bf16 *)&u, *wv = (const bf16 *)&wu, *bv = (const bf16 *)&bu;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float y = (bf(a[e]) - mu) * rs * bf(wv[e]);
			if (ln && nb)
				y += bf(bv[e]);
			ov[e] = tobf(y);
		}
		*(uint4 *)(xs + c) = o;
	}
}

/* Output o of row m from the f32 sums s0 (row o1) and s1 (row o2), by EP (see k_fused_gemv) */
template <int EP>
static __device__ __forceinline__ void
fu_epilogue(bf16 *out, int m, long o, long o1, long o2, int NO, int OC, float s0, float s1, const bf16 *bias,
    const fu_qkv &q)
{
	float y = bf(tobf(s0 + (bias ? bf(bias[o1]) : 0.0f)));
	bf16 *dst = out + (size_t)m * NO + o;
	if (EP == FU_EP_QKV) {
		/* k_rope then k_kv_write on the pair (f, f + HD/2) of head h */
		int half = q.HD / 2, h = (int)(o / half), f = (int)(o % half);
		bf16 a = tobf(y), b = tobf(s1 + (bias ? bf(bias[o2]) : 0.0f));
		if (h < q.NH + q.NKV && q.theta > 0.0f) {
			float inv = powf(q.theta, -2.0f * (float)f / (float)q.HD);
			float ang = (float)q.pos[m] * inv, sn, cs;
			sincosf(ang, &sn, &cs);
			float fa = bf(a), fb = bf(b);
			a = tobf(fa * cs - fb * sn);
			b = tobf(fb * cs + fa * sn);
		}
		out[(size_t)m * OC + o1] = a;
		out[(size_t)m * OC + o2] = b;
		int sl = q.slot[m];
		if (h >= q.NH && sl >= 0) {
			int kh = h - q.NH;
			bf16 *c = q.kc;
			if (kh >= q.NKV) {
				kh -= q.NKV;
				c = q.vc;
			}
			c += ((size_t)sl * q.NKV + kh) * q.HD;
			c[f] = a;
			c[f + half] = b;
		}
	} else if (EP == RL_EP_NONE) {
		*dst = tobf(y);
	} else if (EP == RL_EP_ADD) {
		*dst = tobf(bf(*dst) + y);
	} else if (EP == RL_EP_GELU) {
		float t = tanhf(FU_GELU_K * (y + 0.044715f * y * y * y));
		*dst = tobf(0.5f * y * (1.0f + t));
	} else {
		float u = bf(tobf(s1 + (bias ? bf(bias[o2]) : 0.0f)));
		*dst = tobf(y / (1.0f + expf(-y)) * u);
	}
}

/* out by EP (lib/ops.h's RL_EP_*, or FU_EP_QKV) of round(norm(x) (NR, C) @ w^T + bias); NORM: x
 * normalised first (ln: LayerNorm, else RMSNorm).  Warps own NO = OC outputs of a row (OC / 2:
 * SwiGLU's gate and up rows o, o + OC/2; the QKV epilogue's rows o1 = h HD + f and o1 + HD/2 of
 * pair o = h HD/2 + f); blocks of FU_WARPS.  Dynamic shared memory: NR * C bf16 with NORM. */
template <int NR, int NORM, int EP>
__global__ void __launch_bounds__(FU_WARPS * 32)
k_fused_gemv(bf16 *out, const bf16 *x, const bf16 *nw, const bf16 *nb, float eps, int ln, const bf16 *w,
    const bf16 *bias, int C, int OC, fu_qkv q)
{
	constexpr int NW = EP == RL_EP_SWIGLU || EP == FU_EP_QKV ? 2 : 1, IF = FU_INFL / NW;
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int NO = NW == 2 ? OC / 2 : OC, nch = C / 8;
	const long ostep = (long)gridDim.x * FU_WARPS;
	long o = (long)blockIdx.x * FU_WARPS + wid, o1 = 0, o2 = 0;
	const bf16 *w0 = w, *w1 = w;
	uint4 wc[NW][IF];
	/* rows o1 (and o2: o + NO for SwiGLU, o1 + HD/2 for QKV) of output o */
	auto rows = [&](long oo) {
		o1 = oo;
		o2 = oo + NO;
		if (EP == FU_EP_QKV) {
			int half = q.HD / 2;
			o1 = oo / half * q.HD + oo % half;
			o2 = o1 + half;
		}
		w0 = w + (size_t)o1 * C;
		w1 = w + (size_t)o2 * C;
	};
	pdl_trigger();
	/* the first output's first round of weight chunks in flight during the norm (and,
	 * launched programmatically, while the kernel ahead finishes: no kernel of a step
	 * writes weights) */
	if (o < NO) {
		rows(o);
		fu_load<NW, IF>(wc, w0, w1, lane, nch);
	}
	pdl_wait();
	const bf16 *xs = x;
	if (NORM) {
		FUSE_SMEM(fu_xs);
		if (wid < NR)
			fu_norm_row(fu_xs + (size_t)wid * C, x + (size_t)wid * C, nw, nb, C, eps, ln, lane);
		__syncthreads();
		xs = fu_xs;
	}
	/* a grid smaller than NO / FU_WARPS blocks (the launcher's cap: the norm once a block)
	 * takes the outputs in strides */
	for (bool first = true; o < NO; o += ostep, first = false) {
		if (!first)
			rows(o);
		float acc[NW][NR];
#pragma unroll
		for (int r = 0; r < NW; r++)
#pragma unroll
			for (int m = 0; m < NR; m++)
				acc[r][m] = 0.0f;
		for (int c0 = lane; c0 < nch; c0 += 32 * IF) {
			if (c0 != lane || !first)
				fu_load<NW, IF>(wc, w0, w1, c0, nch);
#pragma unroll
			for (int k = 0; k < IF; k++) {
				int c = c0 + k * 32;
				if (c >= nch)
					break;
#pragma unroll
				for (int m = 0; m < NR; m++) {
					uint4 xu = *(const uint4 *)(xs + (size_t)m * C + (size_t)c * 8);
					const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xu;
#pragma unroll
					for (int r = 0; r < NW; r++) {
						const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&wc[r][k];
#pragma unroll
						for (int j = 0; j < 4; j++) {
							float2 wf = __bfloat1622float2(w2[j]), xf = __bfloat1622float2(x2[j]);
							acc[r][m] += wf.x * xf.x + wf.y * xf.y;
						}
					}
				}
			}
		}
		/* row m's output by lane m (every lane has the sums) */
#pragma unroll
		for (int m = 0; m < NR; m++) {
			float s0 = warp_sum(acc[0][m]), s1 = NW == 2 ? warp_sum(acc[NW - 1][m]) : 0.0f;
			if (lane == m)
				fu_epilogue<EP>(out, m, o, o1, o2, NO, OC, s0, s1, bias, q);
		}
	}
}

/* RoPE (theta > 0) in place on the q and k heads of qkv (N, (NH+2NKV)*HD), as k_rope, and the
 * k (rotated) and v heads to kc, vc (NBLK, BS, NKV, HD) at slot[n] (< 0: not written), as
 * k_kv_write.  One thread per pair (f, f + HD/2) of a head of a row. */
__global__ void
k_rope_kv(bf16 *kc, bf16 *vc, bf16 *qkv, const int32_t *pos, const int32_t *slot, int N, int NH, int NKV, int HD,
    float theta)
{
	const int half = HD / 2, heads = NH + 2 * NKV;
	const size_t n = (size_t)N * heads * half, ld = (size_t)heads * HD, per = (size_t)NKV * HD;
	pdl_trigger();
	pdl_wait();
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		int f = (int)(i % half);
		size_t rest = i / half;
		int h = (int)(rest % heads);
		size_t r = rest / heads;
		bf16 *p = qkv + r * ld + (size_t)h * HD;
		bf16 a = p[f], b = p[f + half];
		if (h < NH + NKV && theta > 0.0f) {
			float inv = powf(theta, -2.0f * (float)f / (float)HD);
			float ang = (float)pos[r] * inv, sn, cs;
			sincosf(ang, &sn, &cs);
			float fa = bf(a), fb = bf(b);
			a = tobf(fa * cs - fb * sn);
			b = tobf(fb * cs + fa * sn);
			p[f] = a;
			p[f + half] = b;
		}
		int sl = slot[r];
		if (h < NH || sl < 0)
			continue;
		int kh = h - NH;
		bf16 *dst = kc;
		if (kh >= NKV) {
			kh -= NKV;
			dst = vc;
		}
		dst += (size_t)sl * per + (size_t)kh * HD;
		dst[f] = a;
		dst[f + half] = b;
	}
}
/* ==== fuse launchers */

static int
a16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

extern "C" int
rlk_fused_gemv_ok(int N, int C, int OC, int norm, int ep, const void *x, const void *nw, const void *nb,
    const void *w)
{
	if (N < 1 || N > 4 || C <= 0 || C % 8 || C > 8192 || OC <= 0 || !a16(x) || !a16(w))
		return 0;
	if (ep < RL_EP_NONE || ep > RL_EP_SWIGLU || (ep == RL_EP_SWIGLU && OC % 2))
		return 0;
	if (norm == RL_NORM_NONE)
		return 1;
	return (norm == RL_NORM_RMS || norm == RL_NORM_LN) && nw && a16(nw) && a16(nb) && (long)N * C <= 24576;
}

typedef void (*fu_kernel)(bf16 *, const bf16 *, const bf16 *, const bf16 *, float, int, const bf16 *,
    const bf16 *, int, int, fu_qkv);

/* Blocks for g blocks' worth of outputs.  With a norm prologue and more than FU_LOOP_MIN blocks
 * (the LM head: 6,283 for GPT-2, 18,992 for Qwen2.5), as many as are resident at once, each
 * warp taking outputs in strides: the prologue once a resident block rather than once per 8
 * outputs.  The resident count is queried once per kernel (and shared memory size) into *cap,
 * the instantiation's cache: the first call of a decode shape runs outside graph capture (the
 * model's warm-up step), so a capture finds it there.  Any failure of the query: g. */
#define FU_LOOP_MIN 1024
static unsigned
fu_grid(unsigned g, const void *fn, size_t sm, int hasn, std::atomic<unsigned long> *cap)
{
	int dev, nsm = 0, nb = 0;
	if (!hasn || g <= FU_LOOP_MIN)
		return g;
	unsigned long c = cap->load(std::memory_order_relaxed);
	if (c == 0 || (c >> 32) != sm) {
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
		    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, FU_WARPS * 32, sm) != cudaSuccess || nsm < 1 ||
		    nb < 1) {
			cudaGetLastError();
			return g;
		}
		c = (unsigned long)sm << 32 | (unsigned)nsm * (unsigned)nb;
		cap->store(c, std::memory_order_relaxed);
	}
	unsigned n = (unsigned)(c & 0xffffffffu);
	return g < n ? g : n;
}

/* k_fused_gemv<N, norm?, ep> (ep: RL_EP_* or FU_EP_QKV with q), the shape checked */
static int
fused_launch(void *s, void *out, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int OC, int ep, fu_qkv q)
{
	int NO = ep == RL_EP_SWIGLU || ep == FU_EP_QKV ? OC / 2 : OC, hasn = norm != RL_NORM_NONE;
	int ln = norm == RL_NORM_LN;
	unsigned g = (unsigned)((NO + FU_WARPS - 1) / FU_WARPS);
	size_t sm = hasn ? (size_t)N * C * 2 : 0;
	cudaStream_t st = RLK_STREAM(s);
	bf16 *o_ = (bf16 *)out;
	const bf16 *x_ = (const bf16 *)x, *nw_ = (const bf16 *)nw, *nb_ = (const bf16 *)nb;
	const bf16 *w_ = (const bf16 *)w, *b_ = (const bf16 *)bias;
	cudaError_t e = cudaSuccess;
#define FU_L(NR, NM, EP) \
	do { \
		static std::atomic<unsigned long> cap_(0); \
		fu_kernel k_ = k_fused_gemv<NR, NM, EP>; \
		e = rlk_launch(k_, dim3(fu_grid(g, (const void *)k_, sm, hasn, &cap_)), dim3(FU_WARPS * 32), sm, st, \
		    o_, x_, nw_, nb_, eps, ln, w_, b_, C, OC, q); \
	} while (0)
#define FU_EP(NR, NM) \
	switch (ep) { \
	case RL_EP_NONE: FU_L(NR, NM, RL_EP_NONE); break; \
	case RL_EP_ADD: FU_L(NR, NM, RL_EP_ADD); break; \
	case RL_EP_GELU: FU_L(NR, NM, RL_EP_GELU); break; \
	case RL_EP_SWIGLU: FU_L(NR, NM, RL_EP_SWIGLU); break; \
	default: FU_L(NR, NM, FU_EP_QKV); break; \
	}
#define FU_NM(NR) \
	if (hasn) { \
		FU_EP(NR, 1) \
	} else { \
		FU_EP(NR, 0) \
	}
	switch (N) {
	case 1: FU_NM(1) break;
	case 2: FU_NM(2) break;
	case 3: FU_NM(3) break;
	default: FU_NM(4) break;
	}
#undef FU_NM
#undef FU_EP
#undef FU_L
	if (e != cudaSuccess)
		return (int)e;
	RLK_RET();
}

extern "C" int
rlk_fused_gemv(void *s, void *out, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int OC, int ep)
{
	if (!rlk_fused_gemv_ok(N, C, OC, norm, ep, x, nw, nb, w))
		return (int)cudaErrorInvalidValue;
	fu_qkv q = { NULL, NULL, NULL, NULL, 0, 0, 0, 0.0f };
	return fused_launch(s, out, x, nw, nb, eps, norm, w, bias, N, C, OC, ep, q);
}

extern "C" int
rlk_fused_qkv_ok(int N, int C, int NH, int NKV, int HD, int norm, const void *x, const void *nw, const void *nb,
    const void *w)
{
	return NH > 0 && NKV > 0 && HD > 0 && HD % 2 == 0 &&
	    rlk_fused_gemv_ok(N, C, (NH + 2 * NKV) * HD, norm, RL_EP_NONE, x, nw, nb, w);
}

extern "C" int
rlk_fused_qkv(void *s, void *qkv, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int NH, int NKV, int HD, float theta, const int32_t *pos,
    void *kc, void *vc, const int32_t *slot)
{
	if (!rlk_fused_qkv_ok(N, C, NH, NKV, HD, norm, x, nw, nb, w))
		return (int)cudaErrorInvalidValue;
	fu_qkv q = { (bf16 *)kc, (bf16 *)vc, pos, slot, NH, NKV, HD, theta };
	return fused_launch(s, qkv, x, nw, nb, eps, norm, w, bias, N, C, (NH + 2 * NKV) * HD, FU_EP_QKV, q);
}

extern "C" int
rlk_rope_kv_write(void *s, void *kc, void *vc, void *qkv, const int32_t *pos, const int32_t *slot, int N, int NH,
    int NKV, int HD, float theta)
{
	size_t n = (size_t)N * (NH + 2 * NKV) * (HD / 2);
	if (n == 0)
		return 0;
	cudaError_t e = rlk_launch(k_rope_kv, dim3(rlk_blocks(n, 256)), dim3(256), 0, RLK_STREAM(s), (bf16 *)kc,
	    (bf16 *)vc, (bf16 *)qkv, pos, slot, N, NH, NKV, HD, theta);
	if (e != cudaSuccess)
		return (int)e;
	RLK_RET();
}

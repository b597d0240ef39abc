/*
 * fuse.cuh — the device code of fuse.cu's fused products (matmul_fused_fwd, matmul_rope_kv_fwd),
 * shared with step.cu's persistent decode step: the weight loads, the norm prologue, the
 * epilogues and the product's body fu_gemv, which takes its block index, its block count and
 * how it waits for its input (a sync policy: fu_pdl in fuse.cu, a grid barrier in step.cu) as
 * arguments.  Device code only; every function is static or a template, so each .cu that
 * includes it has its own copy and no symbol is defined twice.  What the code computes is
 * described at the top of fuse.cu.
 */
#ifndef RL_KERNELS_FUSE_CUH
#define RL_KERNELS_FUSE_CUH

#include "kernels/common.cuh"
#include "kernels/launch.h"

/* the normalised input rows in dynamic shared memory (kernels/emu defines its own) */
#define FUSE_SMEM(name) extern __shared__ __align__(16) bf16 name[]

/* ==== fuse device code (kernels/emu/run.sh cuts from here to the end marker) */
#define FU_WARPS 8
#define FU_INFL 8     /* 16-byte weight chunks in flight per lane (over the warp's weight rows) */
#define FU_GELU_K 0.7978845608028654f  /* sqrt(2/pi), as elementwise.cu */
#define FU_EP_QKV 4   /* the QKV epilogue: after lib/compute/ops.h's RL_EP_* */

/* the QKV epilogue's arguments (rope_kv_write's) */
struct fu_qkv {
	bf16 *kc, *vc;
	const int32_t *pos, *slot;
	int NH, NKV, HD;
	rl_rope rope;   /* rope.theta <= 0: no rotation */
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
		if (h < q.NH + q.NKV && q.rope.theta > 0.0f) {
			float inv = rope_inv(q.rope, f, q.HD);
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

/* The product's input rows: x, or with NORM x's NR rows normalised by warps 0..NR-1 into
 * the dynamic shared memory (a block barrier: every thread of the block calls it) */
template <int NR, int NORM>
static __device__ __forceinline__ const bf16 *
fu_input(const bf16 *x, const bf16 *nw, const bf16 *nb, int C, float eps, int ln, int wid, int lane)
{
	if (!NORM)
		return x;
	FUSE_SMEM(fu_xs);
	if (wid < NR)
		fu_norm_row(fu_xs + (size_t)wid * C, x + (size_t)wid * C, nw, nb, C, eps, ln, lane);
	__syncthreads();
	return fu_xs;
}

/* acc[r][m] += weight chunks wc[r][k] (chunk c = cb + lane + 32 k, those below cend) times
 * the same chunks of the NR input rows xs (C elements apart), in chunk order */
template <int NR, int NW, int IF>
static __device__ __forceinline__ void
fu_tile(float (&acc)[NW][NR], const uint4 (&wc)[NW][IF], const bf16 *xs, int C, int cb, int cend, int lane)
{
#pragma unroll
	for (int k = 0; k < IF; k++) {
		int c = cb + lane + k * 32;
		if (c >= cend)
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

/* k_fused_gemv's sync: a programmatic launch (common.cuh) */
struct fu_pdl {
	__device__ __forceinline__ void trigger() const { pdl_trigger(); }
	__device__ __forceinline__ void wait() const { pdl_wait(); }
};

/* out by EP (lib/compute/ops.h's RL_EP_*, or FU_EP_QKV) of round(norm(x) (NR, C) @ w^T + bias); NORM: x
 * normalised first (ln: LayerNorm, else RMSNorm).  Warps own NO = OC outputs of a row (OC / 2:
 * SwiGLU's gate and up rows o, o + OC/2; the QKV epilogue's rows o1 = h HD + f and o1 + HD/2 of
 * pair o = h HD/2 + f); blocks of FU_WARPS, this one block bid of nblk.  Dynamic shared memory:
 * NR * C bf16 with NORM.  sync: its trigger() first, then the first output's first weight
 * chunks are loaded, then its wait() in every thread (a block without outputs too) before
 * anything else is read or written (fu_pdl: k_fused_gemv's programmatic launch; step.cu: its
 * grid barrier). */
template <int NR, int NORM, int EP, int PF = 0, class S>
static __device__ __forceinline__ void
fu_gemv(bf16 *out, const bf16 *x, const bf16 *nw, const bf16 *nb, float eps, int ln, const bf16 *w,
    const bf16 *bias, int C, int OC, const fu_qkv &q, int bid, int nblk, const S &sync)
{
	constexpr int NW = EP == RL_EP_SWIGLU || EP == FU_EP_QKV ? 2 : 1, IF = FU_INFL / NW, RSTEP = 32 * IF;
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int NO = NW == 2 ? OC / 2 : OC, nch = C / 8;
	const long ostep = (long)nblk * FU_WARPS;
	long o = (long)bid * FU_WARPS + wid, o1 = 0, o2 = 0;
	const bf16 *w0 = w, *w1 = w;
	uint4 wc[NW][IF], wn[NW][IF];  /* wn: PF only (else unused, no registers) */
	/* rows r1 (and r2: o + NO for SwiGLU, r1 + HD/2 for QKV) of output oo */
	auto rowsof = [&](long oo, long &r1, long &r2) {
		r1 = oo;
		r2 = oo + NO;
		if (EP == FU_EP_QKV) {
			int half = q.HD / 2;
			r1 = oo / half * q.HD + oo % half;
			r2 = r1 + half;
		}
	};
	auto rows = [&](long oo) {
		rowsof(oo, o1, o2);
		w0 = w + (size_t)o1 * C;
		w1 = w + (size_t)o2 * C;
	};
	sync.trigger();
	/* the first output's first round of weight chunks in flight during the norm (and,
	 * launched programmatically, while the kernel ahead finishes; in step.cu, while the block
	 * waits at the grid barrier: nothing in a step writes weights) */
	if (o < NO) {
		rows(o);
		fu_load<NW, IF>(wc, w0, w1, lane, nch);
	}
	sync.wait();
	const bf16 *xs = fu_input<NR, NORM>(x, nw, nb, C, eps, ln, wid, lane);
	/* Tiles: output o's rounds of RSTEP chunks from base cb (the same in every lane), then the
	 * warp's next output o + ostep (a grid smaller than NO / FU_WARPS blocks, the launcher's
	 * cap or step.cu's grid, takes the outputs in strides).  PF: the next tile's chunks are
	 * loaded (into wn) before the current one is summed, so a warp with several outputs or
	 * rounds has two in flight; without, each tile's loads wait for the one before. */
	float acc[NW][NR];
#pragma unroll
	for (int r = 0; r < NW; r++)
#pragma unroll
		for (int m = 0; m < NR; m++)
			acc[r][m] = 0.0f;
	for (int cb = 0; o < NO;) {
		long on = o;
		int cn = cb + RSTEP;
		if (cn >= nch) {
			on = o + ostep;
			cn = 0;
		}
		if (PF && on < NO) {
			long r1, r2;
			rowsof(on, r1, r2);
			fu_load<NW, IF>(wn, w + (size_t)r1 * C, w + (size_t)r2 * C, cn + lane, nch);
		}
		fu_tile<NR, NW, IF>(acc, wc, xs, C, cb, nch, lane);
		if (cn == 0) {
			/* output o done: row m's output by lane m (every lane has the sums) */
#pragma unroll
			for (int m = 0; m < NR; m++) {
				float s0 = warp_sum(acc[0][m]), s1 = NW == 2 ? warp_sum(acc[NW - 1][m]) : 0.0f;
				if (lane == m)
					fu_epilogue<EP>(out, m, o, o1, o2, NO, OC, s0, s1, bias, q);
#pragma unroll
				for (int r = 0; r < NW; r++)
					acc[r][m] = 0.0f;
			}
			if (on >= NO)
				break;
			rows(on);
		}
		o = on;
		cb = cn;
		if (PF) {
#pragma unroll
			for (int r = 0; r < NW; r++)
#pragma unroll
				for (int k = 0; k < IF; k++)
					wc[r][k] = wn[r][k];
		} else {
			fu_load<NW, IF>(wc, w0, w1, cb + lane, nch);
		}
	}
}

/* fu_gemv with each output's weight row split over ks warps of the block (ks 2, 4 or 8;
 * RL_CUDA_GEMV_SPLIT, never run on a GPU yet): a block takes FU_WARPS / ks
 * outputs, the grid covers every output (nblk FU_WARPS / ks >= NO: no strides), warp
 * part = wid % ks of group wid / ks sums the chunks [part per, (part + 1) per) of the
 * row (per = ceil(nch / ks)), its first round of loads in flight before the wait as in
 * fu_gemv.  The parts' warp sums meet in shared memory (red: FU_WARPS x 2 x NR floats)
 * and the group's first warp adds them in part order (fixed: the same bits every launch)
 * and writes the epilogue.  For products with few outputs or long rows (a layer's o and
 * down products, Qwen's QKV at one sequence: 72 to 112 blocks of whole rows on 132
 * multiprocessors, down's rows in 2 or 3 rounds one after the other), more blocks, each
 * warp's part one round. */
template <int NR, int NORM, int EP, class S>
static __device__ __forceinline__ void
fu_gemv_split(bf16 *out, const bf16 *x, const bf16 *nw, const bf16 *nb, float eps, int ln, const bf16 *w,
    const bf16 *bias, int C, int OC, const fu_qkv &q, int bid, const S &sync, int ks, float *red)
{
	constexpr int NW = EP == RL_EP_SWIGLU || EP == FU_EP_QKV ? 2 : 1, IF = FU_INFL / NW, RSTEP = 32 * IF;
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks, grp = wid / ks;
	const int NO = NW == 2 ? OC / 2 : OC, nch = C / 8, per = (nch + ks - 1) / ks;
	const int clo = part * per < nch ? part * per : nch, chi = clo + per < nch ? clo + per : nch;
	const long o = (long)bid * (FU_WARPS / ks) + grp;
	long o1 = o, o2 = o + NO;
	if (EP == FU_EP_QKV) {
		int half = q.HD / 2;
		o1 = o / half * q.HD + o % half;
		o2 = o1 + half;
	}
	const bf16 *w0 = w + (size_t)o1 * C, *w1 = w + (size_t)o2 * C;
	uint4 wc[NW][IF];
	sync.trigger();
	if (o < NO)
		fu_load<NW, IF>(wc, w0, w1, clo + lane, chi);
	sync.wait();
	const bf16 *xs = fu_input<NR, NORM>(x, nw, nb, C, eps, ln, wid, lane);
	float acc[NW][NR] = {};
	for (int cb = clo; o < NO && cb < chi; cb += RSTEP) {
		if (cb != clo)
			fu_load<NW, IF>(wc, w0, w1, cb + lane, chi);
		fu_tile<NR, NW, IF>(acc, wc, xs, C, cb, chi, lane);
	}
#pragma unroll
	for (int r = 0; r < NW; r++)
#pragma unroll
		for (int m = 0; m < NR; m++) {
			float v = warp_sum(acc[r][m]);
			if (lane == 0)
				red[(wid * 2 + r) * NR + m] = v;
		}
	__syncthreads();
	if (part != 0 || o >= NO)
		return;
#pragma unroll
	for (int m = 0; m < NR; m++) {
		float s0 = 0.0f, s1 = 0.0f;
		for (int p = 0; p < ks; p++) {
			s0 += red[((wid + p) * 2) * NR + m];
			if (NW == 2)
				s1 += red[((wid + p) * 2 + 1) * NR + m];
		}
		if (lane == m)
			fu_epilogue<EP>(out, m, o, o1, o2, NO, OC, s0, s1, bias, q);
	}
}

/* ==== end of fuse device code */

#endif

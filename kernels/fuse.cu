/*
 * fuse.cu — the decode fusions of lib/compute/ops.h (matmul_fused_fwd, rope_kv_write): fewer kernels
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
 * The device code is in fuse.cuh (step.cu runs it too); the kernels and launchers here.
 *
 * Leaves out: more than 4 rows (the caller runs the separate ops), backward.
 */
#include <atomic>

#include "kernels/common.cuh"
#include "kernels/launch.h"
#include "kernels/fuse.cuh"

/* ==== fuse kernels (kernels/emu/run.sh cuts from here to the launchers marker) */
/* fu_gemv (fuse.cuh) as a kernel of its own, launched programmatically; PF: its prefetch of
 * the next tile */
template <int NR, int NORM, int EP, int PF = 0>
__global__ void __launch_bounds__(FU_WARPS * 32)
k_fused_gemv(bf16 *out, const bf16 *x, const bf16 *nw, const bf16 *nb, float eps, int ln, const bf16 *w,
    const bf16 *bias, int C, int OC, fu_qkv q)
{
	fu_gemv<NR, NORM, EP, PF>(out, x, nw, nb, eps, ln, w, bias, C, OC, q, (int)blockIdx.x, (int)gridDim.x, fu_pdl());
}

/* the same product, each output's row over ks warps (fu_gemv_split, fuse.cuh): a kernel of
 * its own, so that k_fused_gemv's registers stay as they were */
template <int NR, int NORM, int EP>
__global__ void __launch_bounds__(FU_WARPS * 32)
k_fused_gemv_split(bf16 *out, const bf16 *x, const bf16 *nw, const bf16 *nb, float eps, int ln, const bf16 *w,
    const bf16 *bias, int C, int OC, fu_qkv q, int ks)
{
	__shared__ float red[FU_WARPS * 2 * NR];
	fu_gemv_split<NR, NORM, EP>(out, x, nw, nb, eps, ln, w, bias, C, OC, q, (int)blockIdx.x, fu_pdl(), ks, red);
}

/* RoPE (rope.theta > 0) in place on the q and k heads of qkv (N, (NH+2NKV)*HD), as k_rope, and the
 * k (rotated) and v heads to kc, vc (NBLK, BS, NKV, HD) at slot[n] (< 0: not written), as
 * k_kv_write.  One thread per pair (f, f + HD/2) of a head of a row. */
__global__ void
k_rope_kv(bf16 *kc, bf16 *vc, bf16 *qkv, const int32_t *pos, const int32_t *slot, int N, int NH, int NKV, int HD,
    rl_rope rope)
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
		if (h < NH + NKV && rope.theta > 0.0f) {
			float inv = rope_inv(rope, f, HD);
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


extern "C" int
rlk_fused_gemv_ok(int N, int C, int OC, int norm, int ep, const void *x, const void *nw, const void *nb,
    const void *w)
{
	if (N < 1 || N > 4 || C <= 0 || C % 8 || C > 8192 || OC <= 0 || !rlk_a16(x) || !rlk_a16(w))
		return 0;
	if (ep < RL_EP_NONE || ep > RL_EP_SWIGLU || (ep == RL_EP_SWIGLU && OC % 2))
		return 0;
	if (norm == RL_NORM_NONE)
		return 1;
	return (norm == RL_NORM_RMS || norm == RL_NORM_LN) && nw && rlk_a16(nw) && rlk_a16(nb) && (long)N * C <= 24576;
}

typedef void (*fu_kernel)(bf16 *, const bf16 *, const bf16 *, const bf16 *, float, int, const bf16 *,
    const bf16 *, int, int, fu_qkv);

#define FU_LOOP_MIN 1024  /* fu_grid */

/* The products' options (launch.h; process-wide, set when the backend opens): split rows
 * (0 off, -1 by fu_ks's rule, 2/4/8 fixed) and the prefetch (0 off, 1 the head and residual
 * products, 2 every product with its grid capped at one resident wave: fu_grid). */
extern "C" {
int rlk_gemv_ks = 0, rlk_gemv_pf = 0;
}

extern "C" void
rlk_set_gemv(int ks, int pf)
{
	rlk_gemv_ks = ks == -1 || ks == 2 || ks == 4 || ks == 8 ? ks : 0;
	rlk_gemv_pf = pf == 1 || pf == 2 ? pf : 0;
}

/* The multiprocessors of the current device, queried once (0 when the query fails) */
static int
fu_nsm(void)
{
	static std::atomic<int> n(-1);
	int v = n.load(std::memory_order_relaxed), dev;
	if (v < 0) {
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
			cudaGetLastError();
			v = 0;
		}
		n.store(v, std::memory_order_relaxed);
	}
	return v;
}

/* Warps an output (fu_gemv_split) for NO outputs of nch chunks: 1 (whole rows) unless
 * rlk_gemv_ks says otherwise; by the rule (-1): the fewest of 1, 2, 4, 8 that gives at
 * least two blocks a multiprocessor and a part of one round of loads (RSTEP chunks) a
 * warp.  Never when the grid would stride (a norm and more than FU_LOOP_MIN blocks). */
static int
fu_ks(int NO, int nch, int rstep, int hasn)
{
	int ks = rlk_gemv_ks;
	if (ks == -1) {
		long want = 2L * (fu_nsm() > 0 ? fu_nsm() : 132);
		ks = 1;
		while (ks < FU_WARPS && (((long)NO * ks + FU_WARPS - 1) / FU_WARPS < want || (nch + ks - 1) / ks > rstep))
			ks *= 2;
	}
	if (ks < 2 || (hasn && ((long)NO * ks + FU_WARPS - 1) / FU_WARPS > FU_LOOP_MIN))
		return 1;
	return ks;
}

/* Blocks for g blocks' worth of outputs.  rlk_gemv_pf 2: at most what is resident at once,
 * whatever the product (one wave; the warps take outputs in strides, each with the next in
 * flight).  Else: with a norm prologue and more than FU_LOOP_MIN blocks
 * (the LM head: 6,283 for GPT-2, 18,992 for Qwen2.5), as many as are resident at once, each
 * warp taking outputs in strides: the prologue once a resident block rather than once per 8
 * outputs.  The resident count is queried once per kernel (and shared memory size) into *cap,
 * the instantiation's cache: the first call of a decode shape runs outside graph capture (the
 * model's warm-up step), so a capture finds it there.  Any failure of the query: g. */
static unsigned
fu_grid(unsigned g, const void *fn, size_t sm, int hasn, std::atomic<unsigned long> *cap)
{
	int dev, nsm = 0, nb = 0;
	if (rlk_gemv_pf != 2 && (!hasn || g <= FU_LOOP_MIN))
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
	int ln = norm == RL_NORM_LN, two = ep == RL_EP_SWIGLU || ep == FU_EP_QKV;
	int ks = fu_ks(NO, C / 8, 32 * (two ? FU_INFL / 2 : FU_INFL), hasn);
	unsigned g = (unsigned)(((long)NO * ks + FU_WARPS - 1) / FU_WARPS);
	size_t sm = hasn ? (size_t)N * C * 2 : 0;
	cudaStream_t st = RLK_STREAM(s);
	bf16 *o_ = (bf16 *)out;
	const bf16 *x_ = (const bf16 *)x, *nw_ = (const bf16 *)nw, *nb_ = (const bf16 *)nb;
	const bf16 *w_ = (const bf16 *)w, *b_ = (const bf16 *)bias;
	cudaError_t e = cudaSuccess;
#define FU_LP(NR, NM, EP, PF) \
	do { \
		static std::atomic<unsigned long> cap_(0); \
		fu_kernel k_ = k_fused_gemv<NR, NM, EP, PF>; \
		if (ks > 1) \
			e = rlk_launch(k_fused_gemv_split<NR, NM, EP>, dim3(g), dim3(FU_WARPS * 32), sm, st, o_, x_, nw_, \
			    nb_, eps, ln, w_, b_, C, OC, q, ks); \
		else \
			e = rlk_launch(k_, dim3(fu_grid(g, (const void *)k_, sm, hasn, &cap_)), dim3(FU_WARPS * 32), sm, \
			    st, o_, x_, nw_, nb_, eps, ln, w_, b_, C, OC, q); \
	} while (0)
#define FU_L(NR, NM, EP) FU_LP(NR, NM, EP, 0)
	/* the prefetch: rlk_gemv_pf 1, the head (norm, no epilogue: strided over a resident grid)
	 * and the residual products (rows of 2 or 3 rounds); 2, every product */
#define FU_PF(NR, NM, EP, C1) do { if (rlk_gemv_pf == 2 || (rlk_gemv_pf && (C1))) FU_LP(NR, NM, EP, 1); \
	else FU_L(NR, NM, EP); } while (0)
#define FU_EP(NR, NM) \
	switch (ep) { \
	case RL_EP_NONE: FU_PF(NR, NM, RL_EP_NONE, NM); break; \
	case RL_EP_ADD: FU_PF(NR, NM, RL_EP_ADD, !NM); break; \
	case RL_EP_GELU: FU_PF(NR, NM, RL_EP_GELU, 0); break; \
	case RL_EP_SWIGLU: FU_PF(NR, NM, RL_EP_SWIGLU, 0); break; \
	default: FU_PF(NR, NM, FU_EP_QKV, 0); break; \
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
#undef FU_PF
#undef FU_L
#undef FU_LP
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
	fu_qkv q = { NULL, NULL, NULL, NULL, 0, 0, 0, rl_rope() };
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
    const void *w, const void *bias, int N, int C, int NH, int NKV, int HD, rl_rope rope, const int32_t *pos,
    void *kc, void *vc, const int32_t *slot)
{
	if (!rlk_fused_qkv_ok(N, C, NH, NKV, HD, norm, x, nw, nb, w))
		return (int)cudaErrorInvalidValue;
	fu_qkv q = { (bf16 *)kc, (bf16 *)vc, pos, slot, NH, NKV, HD, rope };
	return fused_launch(s, qkv, x, nw, nb, eps, norm, w, bias, N, C, (NH + 2 * NKV) * HD, FU_EP_QKV, q);
}

extern "C" int
rlk_rope_kv_write(void *s, void *kc, void *vc, void *qkv, const int32_t *pos, const int32_t *slot, int N, int NH,
    int NKV, int HD, rl_rope rope)
{
	size_t n = (size_t)N * (NH + 2 * NKV) * (HD / 2);
	if (n == 0)
		return 0;
	cudaError_t e = rlk_launch(k_rope_kv, dim3(rlk_blocks(n, 256)), dim3(256), 0, RLK_STREAM(s), (bf16 *)kc,
	    (bf16 *)vc, (bf16 *)qkv, pos, slot, N, NH, NKV, HD, rope);
	if (e != cudaSuccess)
		return (int)e;
	RLK_RET();
}

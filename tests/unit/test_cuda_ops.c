/*
 * test_cuda_ops.c — every op of the CUDA backend against the CPU reference
 * (lib/compute/ops_cpu.c) on random inputs and awkward shapes (N = 1, T = 1, sizes
 * that are not multiples of a block or a warp, GQA, packed and padded rows).
 * Inputs are drawn in fp32, rounded to bf16 and given to both backends, so the
 * two compute the same function of the same numbers; outputs are compared by
 * tc_cmp (every element within atol + rtol*|ref|, plus a normalised MSE bound).
 *
 * Tolerances (bf16 has an 8-bit significand: one rounding of an exact value
 * errs by at most 2^-8 ~ 0.0039 relative, and on average adds ~5e-6 to the
 * normalised MSE):
 *   - single-rounding ops (cast, add, GELU, SwiGLU, embedding, norms fwd, RoPE):
 *     rtol 8e-3 (two half-ulps: one for the output, one for fp32 order effects
 *     near a rounding tie), atol 1e-5 * scale, nmse 1e-4;
 *   - reductions whose bf16 output can cancel (norm backward, GEMM): atol scaled
 *     by the size of the summed terms (2^-8 * sqrt(K) * |a||b|), nmse 1e-4;
 *   - multi-stage bf16 pipelines (attention: P and dS are rounded to bf16
 *     before the second GEMM): atol 2e-2 * max|ref|, nmse 1e-3;
 *   - f32 outputs from bf16 inputs (log-probs, lse, entropy, pg_loss, adamw,
 *     weight gradients): rtol 1e-4..1e-3, since the inputs are identical and only
 *     fp32 summation order and expf differ (f32 gradients are reductions of
 *     bf16 dout * x products: rtol 1e-3 + atol from their magnitude).
 * The seed is printed; RL_SEED=N repeats a run.  Exit 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "test_cuda.h"

static rl_ops *g;
#define BF RL_BF16
#define F32 RL_F32

static float
maxabs(const float *x, size_t n)
{
	float m = 0;
	for (size_t i = 0; i < n; i++)
		m = fmaxf(m, fabsf(x[i]));
	return m;
}

static void
test_cast_add_act(size_t n)
{
	char nm[64];
	float *a = tc_rand(n, -3, 3, 1), *b = tc_rand(n, -3, 3, 1), *ref = rl_xmalloc(n * 4 + 4);
	void *da = tc_up(g, a, n, BF), *db = tc_up(g, b, n, BF), *dout = tc_poison(g, n, BF);

	rl_cpu_add(NULL, ref, a, b, n);
	g->add(g, dout, da, db, n);
	snprintf(nm, sizeof nm, "add n=%zu", n);
	tc_cmpd(g, nm, dout, BF, ref, n, 1e-6, 8e-3, 1e-4);

	rl_cpu_gelu_fwd(NULL, ref, a, n);
	g->gelu_fwd(g, dout, da, n);
	snprintf(nm, sizeof nm, "gelu_fwd n=%zu", n);
	tc_cmpd(g, nm, dout, BF, ref, n, 1e-5, 8e-3, 1e-4);

	rl_cpu_gelu_bwd(NULL, ref, b, a, n);
	g->gelu_bwd(g, dout, db, da, n);
	snprintf(nm, sizeof nm, "gelu_bwd n=%zu", n);
	tc_cmpd(g, nm, dout, BF, ref, n, 1e-5, 8e-3, 1e-4);

	/* cast: f32 -> bf16 -> f32 must equal host rounding */
	float *x = tc_rand(n, -100, 100, 0), *xr = rl_xmalloc(n * 4 + 4);
	for (size_t i = 0; i < n; i++)
		xr[i] = rl_bf16_to_f32(rl_f32_to_bf16(x[i]));
	void *dx = tc_up(g, x, n, F32), *dxf = tc_poison(g, n, F32);
	g->cast(g, dout, BF, dx, F32, n);
	g->cast(g, dxf, F32, dout, BF, n);
	snprintf(nm, sizeof nm, "cast f32->bf16->f32 n=%zu", n);
	tc_cmpd(g, nm, dxf, F32, xr, n, 0, 0, 0);
	tc_check_status(g, "elementwise");
	g->free(g, da); g->free(g, db); g->free(g, dout); g->free(g, dx); g->free(g, dxf);
	free(a); free(b); free(ref); free(x); free(xr);
}

/* add, GELU and the casts on views sh elements into their buffers (sh odd: 2-byte aligned,
 * the element-wise kernels; sh 8: 16-byte aligned again, the vec ones) */
static void
test_ew_shift(size_t n, int sh)
{
	char nm[80];
	float *a = tc_rand(n + sh, -3, 3, 1), *b = tc_rand(n + sh, -3, 3, 1), *ref = rl_xmalloc(n * 4 + 4);
	void *da = tc_up(g, a, n + sh, BF), *db = tc_up(g, b, n + sh, BF), *dout = tc_poison(g, n + sh, BF);
	void *df = tc_poison(g, n + sh, F32);
	char *A = (char *)da + 2 * sh, *B = (char *)db + 2 * sh, *O = (char *)dout + 2 * sh, *Fo = (char *)df + 4 * sh;

	rl_cpu_add(NULL, ref, a + sh, b + sh, n);
	g->add(g, O, A, B, n);
	snprintf(nm, sizeof nm, "add n=%zu sh=%d", n, sh);
	tc_cmpd(g, nm, O, BF, ref, n, 1e-6, 8e-3, 1e-4);
	g->add(g, A, A, B, n);  /* in place */
	snprintf(nm, sizeof nm, "add in place n=%zu sh=%d", n, sh);
	tc_cmpd(g, nm, A, BF, ref, n, 1e-6, 8e-3, 1e-4);
	rl_cpu_gelu_fwd(NULL, ref, b + sh, n);
	g->gelu_fwd(g, O, B, n);
	snprintf(nm, sizeof nm, "gelu_fwd n=%zu sh=%d", n, sh);
	tc_cmpd(g, nm, O, BF, ref, n, 1e-5, 8e-3, 1e-4);
	rl_cpu_gelu_bwd(NULL, ref, a + sh, b + sh, n);
	{
		void *da2 = tc_up(g, a, n + sh, BF);
		g->gelu_bwd(g, O, (char *)da2 + 2 * sh, B, n);
		snprintf(nm, sizeof nm, "gelu_bwd n=%zu sh=%d", n, sh);
		tc_cmpd(g, nm, O, BF, ref, n, 1e-5, 8e-3, 1e-4);
		g->free(g, da2);
	}
	for (size_t i = 0; i < n; i++)
		ref[i] = b[sh + i];
	g->cast(g, Fo, F32, B, BF, n);
	snprintf(nm, sizeof nm, "cast bf16->f32 n=%zu sh=%d", n, sh);
	tc_cmpd(g, nm, Fo, F32, ref, n, 0, 0, 0);
	g->cast(g, O, BF, Fo, F32, n);
	snprintf(nm, sizeof nm, "cast f32->bf16 n=%zu sh=%d", n, sh);
	tc_cmpd(g, nm, O, BF, ref, n, 0, 0, 0);
	tc_check_status(g, "elementwise views");
	g->free(g, da); g->free(g, db); g->free(g, dout); g->free(g, df);
	free(a); free(b); free(ref);
}

/* The vec forms against the element forms, bit for bit on the GPU (nvcc's contraction
 * included): ew_bits_run on a backend with the defaults keeps its outputs (phase 0), on
 * one opened with RL_CUDA_EW_VEC=0 compares (phase 1).  Sizes with a tail of 3; SwiGLU H
 * 1000; RoPE at Qwen's heads. */
enum { EWB_N = 100003, EWB_SN = 37, EWB_SH = 1000, EWB_RN = 53, EWB_NH = 14, EWB_NKV = 2, EWB_HD = 64 };
static uint16_t *ewb_out[8];
static size_t ewb_len[8];

static void
ew_bits_run(int phase)
{
	static const char *what[] = { "cast f32->bf16", "add", "gelu_fwd", "gelu_bwd", "swiglu_fwd", "swiglu_bwd",
	    "rope_fwd", "rope_bwd" };
	size_t n = EWB_N, sn = (size_t)EWB_SN * EWB_SH, rn = (size_t)EWB_RN * (EWB_NH + 2 * EWB_NKV) * EWB_HD;
	size_t len[8] = { n, n, n, n, sn, 2 * sn, rn, rn };
	uint64_t keep = tc_rng.counter;
	tc_rng.counter = 77;  /* the same inputs in both phases */
	float *a = tc_rand(n, -4, 4, 1), *b = tc_rand(n, -2, 2, 1), *x = tc_rand(n, -100, 100, 0);
	float *gu = tc_rand(2 * sn, -4, 4, 1), *d = tc_rand(sn, -1, 1, 1), *q = tc_rand(rn, -2, 2, 1);
	int32_t pos[EWB_RN];
	for (int i = 0; i < EWB_RN; i++)
		pos[i] = (int32_t)(i * 77 % 4096);
	tc_rng.counter = keep;
	void *da = tc_up(g, a, n, BF), *db = tc_up(g, b, n, BF), *dx = tc_up(g, x, n, F32), *dgu = tc_up(g, gu, 2 * sn, BF);
	void *dd = tc_up(g, d, sn, BF), *dq = tc_up(g, q, rn, BF), *dq2 = tc_up(g, q, rn, BF), *dpos = tc_upi(g, pos, sizeof pos);
	void *out[6];
	for (int k = 0; k < 6; k++)
		out[k] = tc_poison(g, len[k], BF);
	g->cast(g, out[0], BF, dx, F32, n);
	g->add(g, out[1], da, db, n);
	g->gelu_fwd(g, out[2], da, n);
	g->gelu_bwd(g, out[3], db, da, n);
	g->swiglu_fwd(g, out[4], dgu, EWB_SN, EWB_SH);
	g->swiglu_bwd(g, out[5], dd, dgu, EWB_SN, EWB_SH);
	g->rope_fwd(g, dq, dpos, EWB_RN, EWB_NH, EWB_NKV, EWB_HD, (rl_rope){ .theta = 1e6f });
	g->rope_bwd(g, dq2, dpos, EWB_RN, EWB_NH, EWB_NKV, EWB_HD, (rl_rope){ .theta = 1e6f });
	tc_check_status(g, "elementwise bits");
	for (int k = 0; k < 8; k++) {
		uint16_t *h = rl_xmalloc(len[k] * 2);
		g->download(g, h, k < 6 ? out[k] : k == 6 ? dq : dq2, len[k] * 2);
		if (phase == 0) {
			ewb_out[k] = h;
			ewb_len[k] = len[k];
			continue;
		}
		int same = ewb_out[k] && ewb_len[k] == len[k] && memcmp(h, ewb_out[k], len[k] * 2) == 0;
		printf("%s %s n=%zu: the vec kernel gives the element kernel's bits\n", same ? "ok  " : "FAIL", what[k], len[k]);
		T_OK(same, "%s: vec and element kernels differ", what[k]);
		free(h);
		free(ewb_out[k]);
		ewb_out[k] = NULL;
	}
	for (int k = 0; k < 6; k++)
		g->free(g, out[k]);
	g->free(g, da); g->free(g, db); g->free(g, dx); g->free(g, dgu); g->free(g, dd); g->free(g, dq); g->free(g, dq2);
	g->free(g, dpos);
	free(a); free(b); free(x); free(gu); free(d); free(q);
}

static void
test_swiglu(int N, int H)
{
	char nm[64];
	size_t n = (size_t)N * H;
	float *gu = tc_rand(2 * n, -4, 4, 1), *d = tc_rand(n, -1, 1, 1);
	float *ref = rl_xmalloc(2 * n * 4), *dref = rl_xmalloc(2 * n * 4);
	void *dgu = tc_up(g, gu, 2 * n, BF), *dd = tc_up(g, d, n, BF);
	void *out = tc_poison(g, n, BF), *dg = tc_poison(g, 2 * n, BF);
	rl_cpu_swiglu_fwd(NULL, ref, gu, N, H);
	rl_cpu_swiglu_bwd(NULL, dref, d, gu, N, H);
	g->swiglu_fwd(g, out, dgu, N, H);
	g->swiglu_bwd(g, dg, dd, dgu, N, H);
	snprintf(nm, sizeof nm, "swiglu_fwd N=%d H=%d", N, H);
	tc_cmpd(g, nm, out, BF, ref, n, 1e-5, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "swiglu_bwd N=%d H=%d", N, H);
	tc_cmpd(g, nm, dg, BF, dref, 2 * n, 1e-5, 8e-3, 1e-4);
	tc_check_status(g, "swiglu");
	g->free(g, dgu); g->free(g, dd); g->free(g, out); g->free(g, dg);
	free(gu); free(d); free(ref); free(dref);
}

static void
test_embed(int N, int C, int V, int P, int with_pos)
{
	char nm[80];
	float *wte = tc_rand((size_t)V * C, -1, 1, 1), *wpe = tc_rand((size_t)P * C, -1, 1, 1);
	float *dout = tc_rand((size_t)N * C, -1, 1, 1);
	int32_t *tok = rl_xmalloc(N * 4), *pos = rl_xmalloc(N * 4);
	for (int i = 0; i < N; i++) {
		tok[i] = tc_irand(V);
		pos[i] = tc_irand(P);
	}
	float *ref = rl_xmalloc((size_t)N * C * 4);
	float *gte = tc_rand((size_t)V * C, -1, 1, 0), *gpe = tc_rand((size_t)P * C, -1, 1, 0);
	void *dwte = tc_up(g, wte, (size_t)V * C, BF), *dwpe = tc_up(g, wpe, (size_t)P * C, BF);
	void *dtok = tc_upi(g, tok, N * 4), *dpos = tc_upi(g, pos, N * 4);
	void *ddo = tc_up(g, dout, (size_t)N * C, BF), *out = tc_poison(g, (size_t)N * C, BF);
	void *dgte = tc_up(g, gte, (size_t)V * C, F32), *dgpe = tc_up(g, gpe, (size_t)P * C, F32);
	rl_cpu_embed_fwd(NULL, ref, tok, pos, wte, with_pos ? wpe : NULL, N, C);
	g->embed_fwd(g, out, dtok, dpos, dwte, with_pos ? dwpe : NULL, N, C);
	snprintf(nm, sizeof nm, "embed_fwd N=%d C=%d pos=%d", N, C, with_pos);
	tc_cmpd(g, nm, out, BF, ref, (size_t)N * C, 1e-6, 8e-3, 1e-4);
	rl_cpu_embed_bwd(NULL, gte, with_pos ? gpe : NULL, dout, tok, pos, N, C);
	g->embed_bwd(g, dgte, with_pos ? dgpe : NULL, ddo, dtok, dpos, N, C);
	snprintf(nm, sizeof nm, "embed_bwd dwte N=%d C=%d", N, C);
	tc_cmpd(g, nm, dgte, F32, gte, (size_t)V * C, 1e-5, 1e-5, 1e-10);
	if (with_pos) {
		snprintf(nm, sizeof nm, "embed_bwd dwpe N=%d C=%d", N, C);
		tc_cmpd(g, nm, dgpe, F32, gpe, (size_t)P * C, 1e-5, 1e-5, 1e-10);
	}
	tc_check_status(g, "embed");
	g->free(g, dwte); g->free(g, dwpe); g->free(g, dtok); g->free(g, dpos); g->free(g, ddo);
	g->free(g, out); g->free(g, dgte); g->free(g, dgpe);
	free(wte); free(wpe); free(dout); free(tok); free(pos); free(ref); free(gte); free(gpe);
}

static void
test_norms(int N, int C)
{
	char nm[80];
	size_t n = (size_t)N * C;
	float *x = tc_rand(n, -2, 2, 1), *w = tc_rand(C, 0.5, 1.5, 1), *b = tc_rand(C, -0.5, 0.5, 1);
	float *dout = tc_rand(n, -1, 1, 1), *ref = rl_xmalloc(n * 4), *dref = rl_xmalloc(n * 4);
	float *rstd = rl_xmalloc(N * 4), *mean = rl_xmalloc(N * 4);
	float *dw = tc_rand(C, -1, 1, 0), *dbb = tc_rand(C, -1, 1, 0);
	void *dx = tc_up(g, x, n, BF), *dwt = tc_up(g, w, C, BF), *db = tc_up(g, b, C, BF);
	void *ddo = tc_up(g, dout, n, BF), *out = tc_poison(g, n, BF), *dxo = tc_poison(g, n, BF);
	void *drs = tc_poison(g, N, F32), *dmean = tc_poison(g, N, F32);
	void *ddw = tc_up(g, dw, C, F32), *ddb = tc_up(g, dbb, C, F32);

	/* RMSNorm */
	rl_cpu_rmsnorm_fwd(NULL, ref, rstd, x, w, N, C, 1e-6f);
	g->rmsnorm_fwd(g, out, drs, dx, dwt, N, C, 1e-6f);
	snprintf(nm, sizeof nm, "rmsnorm_fwd N=%d C=%d", N, C);
	tc_cmpd(g, nm, out, BF, ref, n, 1e-5, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "rmsnorm_fwd rstd N=%d C=%d", N, C);
	tc_cmpd(g, nm, drs, F32, rstd, N, 0, 1e-4, 1e-8);
	rl_cpu_rmsnorm_bwd(NULL, dref, dw, dout, x, w, rstd, N, C);
	g->rmsnorm_bwd(g, dxo, ddw, ddo, dx, dwt, drs, N, C);
	/* dx = rstd*(w*g - x*mean(w g x)*rstd^2): terms of size ~rstd*|w||g| ~ 1 cancel */
	snprintf(nm, sizeof nm, "rmsnorm_bwd dx N=%d C=%d", N, C);
	tc_cmpd(g, nm, dxo, BF, dref, n, 2e-3 * maxabs(dref, n), 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "rmsnorm_bwd dw N=%d C=%d", N, C);
	tc_cmpd(g, nm, ddw, F32, dw, C, 1e-5 * sqrt(N), 1e-4, 1e-8);

	/* LayerNorm */
	rl_cpu_layernorm_fwd(NULL, ref, mean, rstd, x, w, b, N, C, 1e-5f);
	g->layernorm_fwd(g, out, dmean, drs, dx, dwt, db, N, C, 1e-5f);
	snprintf(nm, sizeof nm, "layernorm_fwd N=%d C=%d", N, C);
	tc_cmpd(g, nm, out, BF, ref, n, 1e-5, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "layernorm_fwd mean,rstd N=%d C=%d", N, C);
	tc_cmpd(g, nm, dmean, F32, mean, N, 1e-6, 1e-4, 1e-8);
	tc_cmpd(g, nm, drs, F32, rstd, N, 0, 1e-4, 1e-8);
	rl_cpu_layernorm_bwd(NULL, dref, dw, dbb, dout, x, w, mean, rstd, N, C);
	g->layernorm_bwd(g, dxo, ddw, ddb, ddo, dx, dwt, dmean, drs, N, C);
	snprintf(nm, sizeof nm, "layernorm_bwd dx N=%d C=%d", N, C);
	tc_cmpd(g, nm, dxo, BF, dref, n, 2e-3 * maxabs(dref, n), 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "layernorm_bwd dw N=%d C=%d", N, C);
	tc_cmpd(g, nm, ddw, F32, dw, C, 1e-5 * sqrt(N), 1e-4, 1e-8);
	snprintf(nm, sizeof nm, "layernorm_bwd db N=%d C=%d", N, C);
	tc_cmpd(g, nm, ddb, F32, dbb, C, 1e-5 * sqrt(N), 1e-4, 1e-8);
	tc_check_status(g, "norms");
	g->free(g, dx); g->free(g, dwt); g->free(g, db); g->free(g, ddo); g->free(g, out);
	g->free(g, dxo); g->free(g, drs); g->free(g, dmean); g->free(g, ddw); g->free(g, ddb);
	free(x); free(w); free(b); free(dout); free(ref); free(dref); free(rstd); free(mean);
	free(dw); free(dbb);
}

/* layernorm_bwd_add / rmsnorm_bwd_add (RL_CUDA_NORM_BWD_ADD=1): dx holds d0 (bf16) and gets
 * d0 + the CPU op's dx, the sum rounded once: the norm backward's atol (from the plain dx's
 * magnitude, not the sum's) and its rtol and nmse on the sum; dw, db as the plain op's.  sh
 * shifts the act operands by sh elements (under 16 bytes: the element-strided kernel). */
static void
test_norm_bwd_add(int N, int C, int ln, int with_db, int sh)
{
	char nm[96];
	size_t n = (size_t)N * C;
	float *x = tc_rand(n + sh, -2, 2, 1), *w = tc_rand(C, 0.5, 1.5, 1), *b = tc_rand(C, -0.5, 0.5, 1);
	float *dout = tc_rand(n + sh, -1, 1, 1), *d0 = tc_rand(n + sh, -3, 3, 1), *ref = rl_xmalloc(n * 4);
	float *dref = rl_xmalloc(n * 4), *rstd = rl_xmalloc(N * 4), *mean = rl_xmalloc(N * 4);
	float *dw = tc_rand(C, -1, 1, 0), *dbb = tc_rand(C, -1, 1, 0);
	void *dx = tc_up(g, x, n + sh, BF), *dwt = tc_up(g, w, C, BF), *ddo = tc_up(g, dout, n + sh, BF);
	void *dd = tc_up(g, d0, n + sh, BF), *ddw = tc_up(g, dw, C, F32), *ddb = tc_up(g, dbb, C, F32);
	void *drs = NULL, *dmean = NULL;
	const void *xs = (char *)dx + 2 * sh, *gs = (char *)ddo + 2 * sh;
	void *ds = (char *)dd + 2 * sh;

	if (ln) {
		rl_cpu_layernorm_fwd(NULL, ref, mean, rstd, x + sh, w, b, N, C, 1e-5f);
		rl_cpu_layernorm_bwd(NULL, dref, dw, with_db ? dbb : NULL, dout + sh, x + sh, w, mean, rstd, N, C);
	} else {
		rl_cpu_rmsnorm_fwd(NULL, ref, rstd, x + sh, w, N, C, 1e-6f);
		rl_cpu_rmsnorm_bwd(NULL, dref, dw, dout + sh, x + sh, w, rstd, N, C);
	}
	/* the CPU statistics, so both sides differentiate the same normalisation */
	drs = tc_up(g, rstd, N, F32);
	dmean = tc_up(g, mean, N, F32);
	double atol = 2e-3 * maxabs(dref, n);
	for (size_t i = 0; i < n; i++)
		dref[i] += d0[sh + i];
	if (ln)
		g->layernorm_bwd_add(g, ds, ddw, with_db ? ddb : NULL, gs, xs, dwt, dmean, drs, N, C);
	else
		g->rmsnorm_bwd_add(g, ds, ddw, gs, xs, dwt, drs, N, C);
	snprintf(nm, sizeof nm, "%s_bwd_add dx N=%d C=%d db=%d sh=%d", ln ? "layernorm" : "rmsnorm", N, C, with_db, sh);
	tc_cmpd(g, nm, ds, BF, dref, n, atol, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "%s_bwd_add dw N=%d C=%d sh=%d", ln ? "layernorm" : "rmsnorm", N, C, sh);
	tc_cmpd(g, nm, ddw, F32, dw, C, 1e-5 * sqrt(N), 1e-4, 1e-8);
	snprintf(nm, sizeof nm, "%s_bwd_add db N=%d C=%d db=%d sh=%d", ln ? "layernorm" : "rmsnorm", N, C, with_db, sh);
	tc_cmpd(g, nm, ddb, F32, dbb, C, 1e-5 * sqrt(N), 1e-4, 1e-8);  /* untouched without db */
	tc_check_status(g, "norm_bwd_add");
	g->free(g, dx); g->free(g, dwt); g->free(g, ddo); g->free(g, dd); g->free(g, ddw); g->free(g, ddb);
	g->free(g, drs); g->free(g, dmean);
	free(x); free(w); free(b); free(dout); free(d0); free(ref); free(dref); free(rstd); free(mean); free(dw);
	free(dbb);
}

/* add_norm_fwd (residual add + norm in one kernel): x against the bf16-rounded sum, out
 * and the statistics against the CPU norm of that rounded sum (the norm tolerances). */
static void
test_add_norm(int N, int C, int ln)
{
	char nm[80];
	size_t n = (size_t)N * C;
	float *x = tc_rand(n, -2, 2, 1), *t = tc_rand(n, -2, 2, 1), *w = tc_rand(C, 0.5, 1.5, 1);
	float *b = tc_rand(C, -0.5, 0.5, 1), *xs = rl_xmalloc(n * 4), *ref = rl_xmalloc(n * 4);
	float *mean = rl_xmalloc(N * 4), *rstd = rl_xmalloc(N * 4);
	void *dx = tc_up(g, x, n, BF), *dt = tc_up(g, t, n, BF), *dw = tc_up(g, w, C, BF), *db = tc_up(g, b, C, BF);
	void *out = tc_poison(g, n, BF), *dmean = tc_poison(g, N, F32), *drs = tc_poison(g, N, F32);

	for (size_t i = 0; i < n; i++)
		xs[i] = rl_bf16_to_f32(rl_f32_to_bf16(x[i] + t[i]));
	if (ln)
		rl_cpu_layernorm_fwd(NULL, ref, mean, rstd, xs, w, b, N, C, 1e-5f);
	else
		rl_cpu_rmsnorm_fwd(NULL, ref, rstd, xs, w, N, C, 1e-6f);
	g->add_norm_fwd(g, dx, out, ln ? dmean : NULL, drs, dt, dw, ln ? db : NULL, N, C, ln ? 1e-5f : 1e-6f, ln);
	snprintf(nm, sizeof nm, "add_norm_fwd x N=%d C=%d ln=%d", N, C, ln);
	tc_cmpd(g, nm, dx, BF, xs, n, 0, 4e-3, 1e-5);
	snprintf(nm, sizeof nm, "add_norm_fwd out N=%d C=%d ln=%d", N, C, ln);
	tc_cmpd(g, nm, out, BF, ref, n, 1e-5, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "add_norm_fwd rstd N=%d C=%d ln=%d", N, C, ln);
	tc_cmpd(g, nm, drs, F32, rstd, N, 0, 1e-4, 1e-8);
	if (ln) {
		snprintf(nm, sizeof nm, "add_norm_fwd mean N=%d C=%d", N, C);
		tc_cmpd(g, nm, dmean, F32, mean, N, 1e-6, 1e-4, 1e-8);
	}
	tc_check_status(g, "add_norm");
	g->free(g, dx); g->free(g, dt); g->free(g, dw); g->free(g, db); g->free(g, out); g->free(g, dmean);
	g->free(g, drs);
	free(x); free(t); free(w); free(b); free(xs); free(ref); free(mean); free(rstd);
}

/* RoPE: a plain base, and Llama 3.1's scaling (at HD 64 and 128 each of its three regions,
 * kept, divided and smoothed, holds some frequencies; positions up to 4096 and beyond) */
static rl_rope rp(float theta) { return (rl_rope){ .theta = theta }; }
static const rl_rope rp_l3 = { 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f };

static void
test_qknorm_rope(int N, int NH, int NKV, int HD)
{
	char nm[96];
	int W = (NH + 2 * NKV) * HD;
	size_t n = (size_t)N * W;
	float *x = tc_rand(n, -2, 2, 1), *wq = tc_rand(HD, 0.5, 1.5, 1), *wk = tc_rand(HD, 0.5, 1.5, 1);
	float *dout = tc_rand(n, -1, 1, 1), *ref = rl_xmalloc(n * 4), *dref = rl_xmalloc(n * 4);
	float *rstd = rl_xmalloc((size_t)N * (NH + NKV) * 4);
	float *dwq = tc_rand(HD, -1, 1, 0), *dwk = tc_rand(HD, -1, 1, 0);
	int32_t *pos = rl_xmalloc(N * 4);
	for (int i = 0; i < N; i++)
		pos[i] = tc_irand(4096);
	void *dx = tc_up(g, x, n, BF), *dwqd = tc_up(g, wq, HD, BF), *dwkd = tc_up(g, wk, HD, BF);
	void *ddo = tc_up(g, dout, n, BF), *out = tc_poison(g, n, BF), *dxo = tc_poison(g, n, BF);
	void *drs = tc_poison(g, (size_t)N * (NH + NKV), F32);
	void *gq = tc_up(g, dwq, HD, F32), *gk = tc_up(g, dwk, HD, F32), *dpos = tc_upi(g, pos, N * 4);

	rl_cpu_qknorm_fwd(NULL, ref, rstd, x, wq, wk, N, NH, NKV, HD, 1e-6f);
	g->qknorm_fwd(g, out, drs, dx, dwqd, dwkd, N, NH, NKV, HD, 1e-6f);
	snprintf(nm, sizeof nm, "qknorm_fwd N=%d NH=%d NKV=%d HD=%d", N, NH, NKV, HD);
	tc_cmpd(g, nm, out, BF, ref, n, 1e-5, 8e-3, 1e-4);
	rl_cpu_qknorm_bwd(NULL, dref, dwq, dwk, dout, x, wq, wk, rstd, N, NH, NKV, HD);
	g->qknorm_bwd(g, dxo, gq, gk, ddo, dx, dwqd, dwkd, drs, N, NH, NKV, HD);
	snprintf(nm, sizeof nm, "qknorm_bwd dx N=%d HD=%d", N, HD);
	tc_cmpd(g, nm, dxo, BF, dref, n, 2e-3 * maxabs(dref, n), 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "qknorm_bwd dwq,dwk N=%d HD=%d", N, HD);
	tc_cmpd(g, nm, gq, F32, dwq, HD, 1e-5 * sqrt(N * NH), 1e-4, 1e-8);
	tc_cmpd(g, nm, gk, F32, dwk, HD, 1e-5 * sqrt(N * NKV), 1e-4, 1e-8);

	/* RoPE: in place; positions up to 4096 with theta 1e4 and 1e6, and Llama 3.1's scaling
	 * (rp_l3: at HD 64 and 128 each of its three regions holds some frequencies) */
	double u = tc_unif();
	rl_rope rope = u < 0.33 ? rp(10000.0f) : u < 0.67 ? rp(1e6f) : rp_l3;
	float theta = rope.theta;
	memcpy(ref, x, n * 4);
	rl_cpu_rope_fwd(NULL, ref, pos, N, NH, NKV, HD, rope);
	g->rope_fwd(g, dx, dpos, N, NH, NKV, HD, rope);
	/* angle = pos * inv_freq in fp32 on both sides; sin/cos of angles up to 4096 differ
	 * by a few fp32 ulps of the angle (~5e-4 rad): atol 4e-3 * |x| on top of bf16 */
	snprintf(nm, sizeof nm, "rope_fwd N=%d HD=%d theta=%g factor=%g", N, HD, theta, rope.factor);
	tc_cmpd(g, nm, dx, BF, ref, n, 8e-3, 8e-3, 1e-4);
	memcpy(dref, dout, n * 4);
	rl_cpu_rope_bwd(NULL, dref, pos, N, NH, NKV, HD, rope);
	g->rope_bwd(g, ddo, dpos, N, NH, NKV, HD, rope);
	snprintf(nm, sizeof nm, "rope_bwd N=%d HD=%d", N, HD);
	tc_cmpd(g, nm, ddo, BF, dref, n, 8e-3, 8e-3, 1e-4);
	tc_check_status(g, "qknorm/rope");
	g->free(g, dx); g->free(g, dwqd); g->free(g, dwkd); g->free(g, ddo); g->free(g, out);
	g->free(g, dxo); g->free(g, drs); g->free(g, gq); g->free(g, gk); g->free(g, dpos);
	free(x); free(wq); free(wk); free(dout); free(ref); free(dref); free(rstd); free(dwq);
	free(dwk); free(pos);
}

/* sh: the act tensors (inp, out, dout, dinp) start sh elements into their allocation,
 * so that pointers are only 2-byte aligned when sh is odd (views into a larger buffer). */
static void
test_matmul(int N, int C, int OC, int bias, int sh)
{
	char nm[112];
	float *x = tc_rand((size_t)N * C + sh, -1, 1, 1), *w = tc_rand((size_t)OC * C, -1, 1, 1);
	float *bs = tc_rand(OC, -1, 1, 1), *dout = tc_rand((size_t)N * OC + sh, -1, 1, 1);
	float *ref = rl_xmalloc((size_t)N * OC * 4), *dx = rl_xmalloc((size_t)N * C * 4);
	float *dw = tc_rand((size_t)OC * C, -1, 1, 0), *db = tc_rand(OC, -1, 1, 0);
	void *dxd0 = tc_up(g, x, (size_t)N * C + sh, BF), *dwd = tc_up(g, w, (size_t)OC * C, BF);
	void *dbd = tc_up(g, bs, OC, BF), *ddo0 = tc_up(g, dout, (size_t)N * OC + sh, BF);
	void *out0 = tc_poison(g, (size_t)N * OC + sh, BF), *dxo0 = tc_poison(g, (size_t)N * C + sh, BF);
	void *gw = tc_up(g, dw, (size_t)OC * C, F32), *gb = tc_up(g, db, OC, F32);
	void *dxd = (char *)dxd0 + 2 * sh, *ddo = (char *)ddo0 + 2 * sh;
	void *out = (char *)out0 + 2 * sh, *dxo = (char *)dxo0 + 2 * sh;
	rl_cpu_matmul_fwd(NULL, ref, x + sh, w, bias ? bs : NULL, N, C, OC);
	g->matmul_fwd(g, out, dxd, dwd, bias ? dbd : NULL, N, C, OC);
	/* products of values in [-1,1]: a sum of K terms has magnitude ~sqrt(K/9); fp32
	 * accumulation on both sides, then one bf16 rounding: atol 2^-8 * sqrt(K) / 3 */
	snprintf(nm, sizeof nm, "matmul_fwd N=%d C=%d OC=%d bias=%d sh=%d", N, C, OC, bias, sh);
	tc_cmpd(g, nm, out, BF, ref, (size_t)N * OC, 4e-3 * sqrt(C) / 3, 8e-3, 1e-4);
	rl_cpu_matmul_bwd(NULL, dx, dw, bias ? db : NULL, dout + sh, x + sh, w, N, C, OC);
	g->matmul_bwd(g, dxo, gw, bias ? gb : NULL, ddo, dxd, dwd, N, C, OC);
	snprintf(nm, sizeof nm, "matmul_bwd dinp N=%d C=%d OC=%d sh=%d", N, C, OC, sh);
	tc_cmpd(g, nm, dxo, BF, dx, (size_t)N * C, 4e-3 * sqrt(OC) / 3, 8e-3, 1e-4);
	/* dw f32: no output rounding; fp32 sums of N products in different orders */
	snprintf(nm, sizeof nm, "matmul_bwd dw (+=) N=%d C=%d OC=%d", N, C, OC);
	tc_cmpd(g, nm, gw, F32, dw, (size_t)OC * C, 1e-5 * sqrt(N), 1e-4, 1e-8);
	if (bias) {
		snprintf(nm, sizeof nm, "matmul_bwd dbias (+=) N=%d OC=%d", N, OC);
		tc_cmpd(g, nm, gb, F32, db, OC, 1e-5 * sqrt(N), 1e-4, 1e-8);
	}
	tc_check_status(g, "matmul");
	g->free(g, dxd0); g->free(g, dwd); g->free(g, dbd); g->free(g, ddo0); g->free(g, out0);
	g->free(g, dxo0); g->free(g, gw); g->free(g, gb);
	free(x); free(w); free(bs); free(dout); free(ref); free(dx); free(dw); free(db);
}

/* The bias gradient from the dw GEMM's cuBLASLt epilogue (RL_CUDA_BGRAD; g opened with it)
 * against the CPU reference and against the column-sum path (g0, opened without it), over
 * two calls (two micro-batches with different dout) into dw and dbias from random starting
 * values: the epilogue writes its sums, so a path that stored instead of adding fails here.
 * gelu: through matmul_dgelu_bwd (its dw GEMM is matmul_bwd's); nodw: dw NULL (the
 * column-sum kernel, as the epilogue needs the dw GEMM).  Tolerances: test_matmul's, the
 * dbias atol for 2N terms (f32 sums of bf16 values in [-1,1], in different orders); the two
 * GPU paths both sum in f32, so the same bounds hold between them. */
static void
test_bgrad(rl_ops *g0, int N, int C, int OC, int sh, int gelu, int nodw)
{
	char nm[128];
	const char *op = gelu ? "matmul_dgelu_bwd" : "matmul_bwd";
	float *x = tc_rand((size_t)N * C + sh, -1, 1, 1), *w = tc_rand((size_t)OC * C, -1, 1, 1);
	float *d1 = tc_rand((size_t)N * OC + sh, -1, 1, 1), *d2 = tc_rand((size_t)N * OC + sh, -1, 1, 1);
	float *pre = tc_rand((size_t)N * C + sh, -3, 3, 1);
	float *dw = tc_rand((size_t)OC * C, -1, 1, 0), *db = tc_rand(OC, -1, 1, 0);
	float *dx = rl_xmalloc((size_t)N * C * 4), *dxg = rl_xmalloc((size_t)N * C * 4);
	void *dxd0 = tc_up(g, x, (size_t)N * C + sh, BF), *dwd = tc_up(g, w, (size_t)OC * C, BF);
	void *dd1 = tc_up(g, d1, (size_t)N * OC + sh, BF), *dd2 = tc_up(g, d2, (size_t)N * OC + sh, BF);
	void *dpre0 = tc_up(g, pre, (size_t)N * C + sh, BF);
	void *dxo0 = tc_poison(g, (size_t)N * C + sh, BF), *dxr0 = tc_poison(g, (size_t)N * C + sh, BF);
	void *gw = tc_up(g, dw, (size_t)OC * C, F32), *gb = tc_up(g, db, OC, F32);
	void *rw = tc_up(g, dw, (size_t)OC * C, F32), *rb = tc_up(g, db, OC, F32);
	char *dxd = (char *)dxd0 + 2 * sh, *dpre = (char *)dpre0 + 2 * sh;
	char *dxo = (char *)dxo0 + 2 * sh, *dxr = (char *)dxr0 + 2 * sh;
	void *dds[2] = { (char *)dd1 + 2 * sh, (char *)dd2 + 2 * sh };
	const float *hds[2] = { d1 + sh, d2 + sh };
	float *gwp = nodw ? NULL : gw, *rwp = nodw ? NULL : rw;

	for (int i = 0; i < 2; i++) {
		rl_cpu_matmul_bwd(NULL, dx, nodw ? NULL : dw, db, hds[i], x + sh, w, N, C, OC);
		if (gelu) {
			rl_cpu_gelu_bwd(NULL, dxg, dx, pre + sh, (size_t)N * C);
			g->matmul_dgelu_bwd(g, dxo, gwp, gb, dds[i], dxd, dwd, dpre, N, C, OC);
			g0->matmul_dgelu_bwd(g0, dxr, rwp, rb, dds[i], dxd, dwd, dpre, N, C, OC);
		} else {
			g->matmul_bwd(g, dxo, gwp, gb, dds[i], dxd, dwd, N, C, OC);
			g0->matmul_bwd(g0, dxr, rwp, rb, dds[i], dxd, dwd, N, C, OC);
		}
	}
	tc_check_status(g0, "bgrad: the column-sum path");
	snprintf(nm, sizeof nm, "bgrad %s dinp N=%d C=%d OC=%d sh=%d", op, N, C, OC, sh);
	tc_cmpd(g, nm, dxo, BF, gelu ? dxg : dx, (size_t)N * C, (gelu ? 1.5 : 1.0) * 4e-3 * sqrt(OC) / 3,
	    gelu ? 1.6e-2 : 8e-3, 1e-4);
	if (!nodw) {
		snprintf(nm, sizeof nm, "bgrad %s dw (+= x2) N=%d C=%d OC=%d", op, N, C, OC);
		tc_cmpd(g, nm, gw, F32, dw, (size_t)OC * C, 1e-5 * sqrt(2.0 * N), 1e-4, 1e-8);
	}
	snprintf(nm, sizeof nm, "bgrad %s dbias (+= x2) N=%d OC=%d dw=%d", op, N, OC, !nodw);
	tc_cmpd(g, nm, gb, F32, db, OC, 1e-5 * sqrt(2.0 * N), 1e-4, 1e-8);
	float *cs = tc_down(g0, rb, OC, F32);
	snprintf(nm, sizeof nm, "bgrad %s dbias = colsum's N=%d OC=%d", op, N, OC);
	tc_cmpd(g, nm, gb, F32, cs, OC, 1e-5 * sqrt(2.0 * N), 1e-4, 1e-8);
	free(cs);
	tc_check_status(g, "bgrad");
	g->free(g, dxd0); g->free(g, dwd); g->free(g, dd1); g->free(g, dd2); g->free(g, dpre0);
	g->free(g, dxo0); g->free(g, dxr0); g->free(g, gw); g->free(g, gb); g->free(g, rw); g->free(g, rb);
	free(x); free(w); free(d1); free(d2); free(pre); free(dw); free(db); free(dx); free(dxg);
}

/* test_bgrad's cases, g opened with RL_CUDA_BGRAD set and g0 without it. */
static void
bgrad_cases(rl_ops *g0, int strict)
{
	/* GPT-2's four biased GEMMs at N = 512: qkv (2304), attention projection (768), fc
	 * (3072), the MLP projection (768, and through matmul_dgelu_bwd) */
	test_bgrad(g0, 512, 768, 2304, 0, 0, 0);
	test_bgrad(g0, 512, 768, 768, 0, 0, 0);
	test_bgrad(g0, 512, 768, 3072, 0, 0, 0);
	test_bgrad(g0, 512, 3072, 768, 0, 0, 0);
	if (g->matmul_dgelu_bwd && g0->matmul_dgelu_bwd)
		test_bgrad(g0, 512, 3072, 768, 0, 1, 0);
	/* falling back by construction: split output (1100 -> 1088 + 12), padded rows (5001),
	 * dw NULL */
	test_bgrad(g0, 50, 96, 1100, 0, 0, 0);
	test_bgrad(g0, 300, 64, 5001, 0, 0, 0);
	test_bgrad(g0, 64, 768, 768, 0, 0, 1);
	if (strict)
		return;
	/* shapes cuBLASLt may refuse (then the column-sum kernel): N and OC not multiples of
	 * 8, 2-byte aligned views, one row; and dgelu's fallback (OC % 8 != 0) */
	test_bgrad(g0, 77, 130, 33, 1, 0, 0);
	test_bgrad(g0, 77, 768, 2304, 0, 0, 0);
	test_bgrad(g0, 64, 768, 2304, 1, 0, 0);
	test_bgrad(g0, 1, 8, 3, 0, 0, 0);
	test_bgrad(g0, 33, 96, 100, 3, 0, 0);
	if (g->matmul_dgelu_bwd && g0->matmul_dgelu_bwd)
		test_bgrad(g0, 77, 130, 33, 1, 1, 0);
}

/* matmul_add_fwd (the residual in the GEMM) against the CPU matmul then add: the GEMM's
 * atol plus one bf16 step of the residual's magnitude (2 here), and rtol 2^-6: two
 * roundings (the product's, then the sum's) on either side, where the product's may
 * land one step apart; sh shifts every operand by sh elements (under 16 bytes: the
 * fallback path, matmul_fwd then add). */
static void
test_matmul_add(int N, int C, int OC, int bias, int sh)
{
	char nm[112];
	float *x = tc_rand((size_t)N * C + sh, -1, 1, 1), *w = tc_rand((size_t)OC * C, -1, 1, 1);
	float *bs = tc_rand(OC, -1, 1, 1), *res = tc_rand((size_t)N * OC + sh, -2, 2, 1);
	float *y = rl_xmalloc((size_t)N * OC * 4), *ref = rl_xmalloc((size_t)N * OC * 4);
	void *dx0 = tc_up(g, x, (size_t)N * C + sh, BF), *dw = tc_up(g, w, (size_t)OC * C, BF);
	void *db = tc_up(g, bs, OC, BF), *dr0 = tc_up(g, res, (size_t)N * OC + sh, BF);
	void *out0 = tc_poison(g, (size_t)N * OC + sh, BF);
	rl_cpu_matmul_fwd(NULL, y, x + sh, w, bias ? bs : NULL, N, C, OC);
	for (size_t i = 0; i < (size_t)N * OC; i++)
		y[i] = rl_bf16_to_f32(rl_f32_to_bf16(y[i]));
	rl_cpu_add(NULL, ref, res + sh, y, (size_t)N * OC);
	g->matmul_add_fwd(g, (char *)out0 + 2 * sh, (char *)dx0 + 2 * sh, dw, bias ? db : NULL, (char *)dr0 + 2 * sh,
	    N, C, OC);
	snprintf(nm, sizeof nm, "matmul_add_fwd N=%d C=%d OC=%d bias=%d sh=%d", N, C, OC, bias, sh);
	tc_cmpd(g, nm, (char *)out0 + 2 * sh, BF, ref, (size_t)N * OC, 4e-3 * sqrt(C) / 3 + 2.0 / 128, 1.6e-2, 1e-4);
	tc_check_status(g, "matmul_add_fwd");
	g->free(g, dx0); g->free(g, dw); g->free(g, db); g->free(g, dr0); g->free(g, out0);
	free(x); free(w); free(bs); free(res); free(y); free(ref);
}

/* The GPT-2 MLP fusions (the default; RL_CUDA_GELU_FUSE=0 off): matmul_gelu_fwd against the CPU matmul
 * then GELU, matmul_dgelu_bwd against the CPU matmul_bwd then gelu_bwd.  The fused
 * GEMM takes GELU (or its derivative) of the f32 sum, the reference of the f32 sum too,
 * the unfused fallback of the bf16-rounded one: GELU's slope is at most ~1.13, so the
 * GEMM's tolerance grows by 1.5x and rtol doubles.  cuBLASLt's GELU may be the erf form
 * rather than tanh: they differ by under 1e-3 absolute, inside atol for K >= 64. */
static void
test_matmul_gelu(int N, int C, int OC, int bias, int sh)
{
	char nm[112];
	float *x = tc_rand((size_t)N * C + sh, -1, 1, 1), *w = tc_rand((size_t)OC * C, -1, 1, 1);
	float *bs = tc_rand(OC, -1, 1, 1), *dout = tc_rand((size_t)N * OC + sh, -1, 1, 1);
	float *pre = tc_rand((size_t)N * C + sh, -3, 3, 1);
	float *ref = rl_xmalloc((size_t)N * OC * 4), *href = rl_xmalloc((size_t)N * OC * 4);
	float *dx = rl_xmalloc((size_t)N * C * 4), *dxg = rl_xmalloc((size_t)N * C * 4);
	float *dw = tc_rand((size_t)OC * C, -1, 1, 0), *db = tc_rand(OC, -1, 1, 0);
	void *dxd0 = tc_up(g, x, (size_t)N * C + sh, BF), *dwd = tc_up(g, w, (size_t)OC * C, BF);
	void *dbd = tc_up(g, bs, OC, BF), *ddo0 = tc_up(g, dout, (size_t)N * OC + sh, BF);
	void *dpre0 = tc_up(g, pre, (size_t)N * C + sh, BF);
	void *out0 = tc_poison(g, (size_t)N * OC + sh, BF), *h0 = tc_poison(g, (size_t)N * OC + sh, BF);
	void *dxo0 = tc_poison(g, (size_t)N * C + sh, BF);
	void *gw = tc_up(g, dw, (size_t)OC * C, F32), *gb = tc_up(g, db, OC, F32);
	void *dxd = (char *)dxd0 + 2 * sh, *ddo = (char *)ddo0 + 2 * sh, *dpre = (char *)dpre0 + 2 * sh;
	void *out = (char *)out0 + 2 * sh, *hd = (char *)h0 + 2 * sh, *dxo = (char *)dxo0 + 2 * sh;
	double fa = 4e-3 * sqrt(C) / 3, ba = 4e-3 * sqrt(OC) / 3;

	rl_cpu_matmul_fwd(NULL, ref, x + sh, w, bias ? bs : NULL, N, C, OC);
	rl_cpu_gelu_fwd(NULL, href, ref, (size_t)N * OC);
	g->matmul_gelu_fwd(g, hd, out, dxd, dwd, bias ? dbd : NULL, N, C, OC);
	snprintf(nm, sizeof nm, "matmul_gelu_fwd pre N=%d C=%d OC=%d b=%d sh=%d", N, C, OC, bias, sh);
	tc_cmpd(g, nm, out, BF, ref, (size_t)N * OC, fa, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "matmul_gelu_fwd h N=%d C=%d OC=%d b=%d sh=%d", N, C, OC, bias, sh);
	tc_cmpd(g, nm, hd, BF, href, (size_t)N * OC, 1.5 * fa, 1.6e-2, 1e-4);

	rl_cpu_matmul_bwd(NULL, dx, dw, bias ? db : NULL, dout + sh, x + sh, w, N, C, OC);
	rl_cpu_gelu_bwd(NULL, dxg, dx, pre + sh, (size_t)N * C);
	g->matmul_dgelu_bwd(g, dxo, gw, bias ? gb : NULL, ddo, dxd, dwd, dpre, N, C, OC);
	snprintf(nm, sizeof nm, "matmul_dgelu_bwd dinp N=%d C=%d OC=%d sh=%d", N, C, OC, sh);
	tc_cmpd(g, nm, dxo, BF, dxg, (size_t)N * C, 1.5 * ba, 1.6e-2, 1e-4);
	snprintf(nm, sizeof nm, "matmul_dgelu_bwd dw (+=) N=%d C=%d OC=%d", N, C, OC);
	tc_cmpd(g, nm, gw, F32, dw, (size_t)OC * C, 1e-5 * sqrt(N), 1e-4, 1e-8);
	if (bias) {
		snprintf(nm, sizeof nm, "matmul_dgelu_bwd dbias (+=) N=%d OC=%d", N, OC);
		tc_cmpd(g, nm, gb, F32, db, OC, 1e-5 * sqrt(N), 1e-4, 1e-8);
	}
	tc_check_status(g, "matmul_gelu");
	g->free(g, dxd0); g->free(g, dwd); g->free(g, dbd); g->free(g, ddo0); g->free(g, dpre0);
	g->free(g, out0); g->free(g, h0); g->free(g, dxo0); g->free(g, gw); g->free(g, gb);
	free(x); free(w); free(bs); free(dout); free(pre); free(ref); free(href); free(dx); free(dxg);
	free(dw); free(db);
}

/* seg_mode 0: none; 1: packed (2-3 segments per row); 2: packed + trailing padding */
static void
test_attn(int B, int T, int NH, int NKV, int HD, int seg_mode)
{
	char nm[112];
	int W = (NH + 2 * NKV) * HD;
	size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
	float *qkv = tc_rand(nq, -2, 2, 1), *dout = tc_rand(no, -1, 1, 1);
	float *out = rl_xmalloc(no * 4), *lse = rl_xmalloc(nl * 4), *dqkv = rl_xmalloc(nq * 4);
	int32_t *seg = NULL;
	if (seg_mode) {
		seg = rl_xmalloc((size_t)B * T * 4);
		for (int b = 0; b < B; b++) {
			int cut1 = tc_irand(T), cut2 = cut1 + tc_irand(T - cut1 + 1);
			int pad = seg_mode == 2 ? T - tc_irand(T / 3 + 1) : T;
			for (int t = 0; t < T; t++)
				seg[b * T + t] = t >= pad ? -1 : t < cut1 ? 0 : t < cut2 ? 1 : 2;
		}
	}
	void *dq = tc_up(g, qkv, nq, BF), *ddo = tc_up(g, dout, no, BF);
	void *dout_o = tc_poison(g, no, BF), *dlse = tc_poison(g, nl, F32), *ddq = tc_poison(g, nq, BF);
	void *dseg = seg ? tc_upi(g, seg, (size_t)B * T * 4) : NULL;
	rl_cpu_attn_fwd(NULL, out, lse, qkv, seg, B, T, NH, NKV, HD);
	g->attn_fwd(g, dout_o, dlse, dq, dseg, B, T, NH, NKV, HD);
	snprintf(nm, sizeof nm, "attn_fwd B=%d T=%d NH=%d NKV=%d HD=%d seg=%d", B, T, NH, NKV, HD, seg_mode);
	/* P rounded to bf16 before P V: relative 2^-8 per weight, averaged over keys */
	tc_cmpd(g, nm, dout_o, BF, out, no, 1e-2 * maxabs(out, no), 1.6e-2, 1e-3);
	/* lse of padding queries is not specified by the contract: compare the others */
	if (seg)
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++)
				if (seg[b * T + t] < 0)
					for (int h = 0; h < NH; h++)
						lse[((size_t)b * NH + h) * T + t] = NAN;
	{
		float *gl = tc_down(g, dlse, nl, F32);
		size_t m = 0;
		for (size_t i = 0; i < nl; i++)
			if (!isnan(lse[i])) {
				gl[m] = gl[i];
				lse[m++] = lse[i];
			}
		snprintf(nm, sizeof nm, "attn_fwd lse T=%d seg=%d", T, seg_mode);
		tc_cmp(nm, gl, lse, m, 1e-4, 1e-4, 1e-8);
		free(gl);
	}
	/* backward: each side from its own forward */
	rl_cpu_attn_fwd(NULL, out, lse, qkv, seg, B, T, NH, NKV, HD);
	rl_cpu_attn_bwd(NULL, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV, HD);
	g->attn_bwd(g, ddq, ddo, dout_o, dlse, dq, dseg, B, T, NH, NKV, HD);
	snprintf(nm, sizeof nm, "attn_bwd B=%d T=%d NH=%d NKV=%d HD=%d seg=%d", B, T, NH, NKV, HD, seg_mode);
	tc_cmpd(g, nm, ddq, BF, dqkv, nq, 2e-2 * maxabs(dqkv, nq), 3e-2, 1e-3);
	tc_check_status(g, "attention");
	g->free(g, dq); g->free(g, ddo); g->free(g, dout_o); g->free(g, dlse); g->free(g, ddq);
	g->free(g, dseg);
	free(qkv); free(dout); free(out); free(lse); free(dqkv); free(seg);
}

/* The attention backward run twice on the same inputs gives the same bits (flash2's
 * backward writes every element once, without atomics). */
static void
test_attn_det(int B, int T, int NH, int NKV, int HD)
{
	char nm[96];
	int W = (NH + 2 * NKV) * HD;
	size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
	float *qkv = tc_rand(nq, -2, 2, 1), *dout = tc_rand(no, -1, 1, 1);
	void *dq = tc_up(g, qkv, nq, BF), *ddo = tc_up(g, dout, no, BF);
	void *dout_o = tc_poison(g, no, BF), *dlse = tc_poison(g, nl, F32);
	void *d1 = tc_poison(g, nq, BF), *d2 = tc_poison(g, nq, BF);
	g->attn_fwd(g, dout_o, dlse, dq, NULL, B, T, NH, NKV, HD);
	g->attn_bwd(g, d1, ddo, dout_o, dlse, dq, NULL, B, T, NH, NKV, HD);
	g->attn_bwd(g, d2, ddo, dout_o, dlse, dq, NULL, B, T, NH, NKV, HD);
	uint16_t *h1 = rl_xmalloc(nq * 2), *h2 = rl_xmalloc(nq * 2);
	g->download(g, h1, d1, nq * 2);
	g->download(g, h2, d2, nq * 2);
	snprintf(nm, sizeof nm, "attn_bwd deterministic B=%d T=%d NH=%d NKV=%d HD=%d", B, T, NH, NKV, HD);
	T_OK(memcmp(h1, h2, nq * 2) == 0, "%s", nm);
	printf("%s %s\n", memcmp(h1, h2, nq * 2) == 0 ? "ok  " : "FAIL", nm);
	tc_check_status(g, "attention determinism");
	g->free(g, dq); g->free(g, ddo); g->free(g, dout_o); g->free(g, dlse); g->free(g, d1); g->free(g, d2);
	free(qkv); free(dout); free(h1); free(h2);
}

static void
test_logprob(int N, int V, float inv_temp, int with_ent)
{
	char nm[96];
	size_t n = (size_t)N * V;
	float *lg = tc_rand(n, -8, 8, 1), *dlp = tc_rand(N, -1, 1, 0), *dent = tc_rand(N, -0.1f, 0.1f, 0);
	int32_t *tgt = rl_xmalloc(N * 4);
	for (int i = 0; i < N; i++)
		tgt[i] = (i % 7 == 3) ? -1 : tc_irand(V);
	float *lp = rl_xmalloc(N * 4), *ent = rl_xmalloc(N * 4), *lse = rl_xmalloc(N * 4);
	float *dl = rl_xmalloc(n * 4);
	void *dlg = tc_up(g, lg, n, BF), *dtgt = tc_upi(g, tgt, N * 4), *ddlp = tc_up(g, dlp, N, F32);
	void *dde = tc_up(g, dent, N, F32), *glp = tc_poison(g, N, F32), *gent = tc_poison(g, N, F32);
	void *glse = tc_poison(g, N, F32), *gdl = tc_poison(g, n, BF);
	rl_cpu_logprob_fwd(NULL, lp, with_ent ? ent : NULL, lse, lg, tgt, N, V, inv_temp);
	g->logprob_fwd(g, glp, with_ent ? gent : NULL, glse, dlg, dtgt, N, V, inv_temp);
	/* f32 throughout from identical inputs: only summation order and expf differ */
	snprintf(nm, sizeof nm, "logprob_fwd lp N=%d V=%d it=%g", N, V, inv_temp);
	tc_cmpd(g, nm, glp, F32, lp, N, 2e-4, 1e-4, 1e-8);
	snprintf(nm, sizeof nm, "logprob_fwd lse N=%d V=%d", N, V);
	tc_cmpd(g, nm, glse, F32, lse, N, 2e-4, 1e-5, 1e-8);
	if (with_ent) {
		snprintf(nm, sizeof nm, "logprob_fwd entropy N=%d V=%d", N, V);
		tc_cmpd(g, nm, gent, F32, ent, N, 2e-4, 1e-4, 1e-8);
	}
	rl_cpu_logprob_bwd(NULL, dl, lg, tgt, lse, dlp, with_ent ? dent : NULL, N, V, inv_temp);
	g->logprob_bwd(g, gdl, dlg, dtgt, glse, ddlp, with_ent ? dde : NULL, N, V, inv_temp);
	snprintf(nm, sizeof nm, "logprob_bwd N=%d V=%d ent=%d", N, V, with_ent);
	tc_cmpd(g, nm, gdl, BF, dl, n, 1e-3 * maxabs(dl, n), 8e-3, 1e-4);
	/* in place: dlogits aliasing logits */
	g->logprob_bwd(g, dlg, dlg, dtgt, glse, ddlp, with_ent ? dde : NULL, N, V, inv_temp);
	snprintf(nm, sizeof nm, "logprob_bwd in place N=%d V=%d", N, V);
	tc_cmpd(g, nm, dlg, BF, dl, n, 1e-3 * maxabs(dl, n), 8e-3, 1e-4);
	tc_check_status(g, "logprob");
	g->free(g, dlg); g->free(g, dtgt); g->free(g, ddlp); g->free(g, dde); g->free(g, glp);
	g->free(g, gent); g->free(g, glse); g->free(g, gdl);
	free(lg); free(dlp); free(dent); free(tgt); free(lp); free(ent); free(lse); free(dl);
}

/* (N, V) host floats laid out (N, ld), the columns V..ld set to pad */
static float *
strided(const float *x, int N, int V, int ld, float pad)
{
	float *y = rl_xmalloc((size_t)N * ld * 4);
	for (int n = 0; n < N; n++)
		for (int j = 0; j < ld; j++)
			y[(size_t)n * ld + j] = j < V ? x[(size_t)n * V + j] : pad;
	return y;
}

/* Device (N, ld) bf16 back to host (N, V); *pad_ok = 0 when a column V..ld differs
 * from pad (bit for bit: the ops must neither read nor write those) */
static float *
unstride(const void *d, int N, int V, int ld, float pad, int *pad_ok)
{
	float *y = tc_down(g, d, (size_t)N * ld, BF), *x = rl_xmalloc((size_t)N * V * 4 + 4);
	uint16_t pb = rl_f32_to_bf16(pad);
	*pad_ok = 1;
	for (int n = 0; n < N; n++)
		for (int j = 0; j < ld; j++) {
			float v = y[(size_t)n * ld + j];
			if (j < V)
				x[(size_t)n * V + j] = v;
			else if (rl_f32_to_bf16(v) != pb)
				*pad_ok = 0;
		}
	free(y);
	return x;
}

/* The strided LM head (ops.h matmul_fwd_ld and the rest) against the CPU reference's
 * plain ops: logits (N, ld), ld = V rounded up to head_ld_align (or ld_extra more);
 * the pad columns hold 1e30, which any op reading them would turn into a failure,
 * and must come back unchanged */
static void
test_head_ld(int N, int C, int V, int ld_extra, float inv_temp, int with_ent)
{
	char nm[112];
	int al = g->head_ld_align, ld = (V + al - 1) / al * al + ld_extra, pok;
	const float PAD = 1e30f;
	size_t nv = (size_t)N * V, nl = (size_t)N * ld;
	float *x = tc_rand((size_t)N * C, -1, 1, 1), *w = tc_rand((size_t)V * C, -1, 1, 1);
	float *ref = rl_xmalloc(nv * 4), *dx = rl_xmalloc((size_t)N * C * 4);
	float *dw = tc_rand((size_t)V * C, -1, 1, 0);
	void *dxd = tc_up(g, x, (size_t)N * C, BF), *dwd = tc_up(g, w, (size_t)V * C, BF);
	void *gw = tc_up(g, dw, (size_t)V * C, F32), *dxo = tc_poison(g, (size_t)N * C, BF);

	/* matmul_fwd_ld: into (N, ld) whose pad columns hold PAD */
	float *z0 = rl_xcalloc(nv + 1, 4), *zp = strided(z0, N, V, ld, PAD);
	void *out = tc_up(g, zp, nl, BF);
	rl_cpu_matmul_fwd(NULL, ref, x, w, NULL, N, C, V);
	g->matmul_fwd_ld(g, out, ld, dxd, dwd, N, C, V);
	float *got = unstride(out, N, V, ld, PAD, &pok);
	snprintf(nm, sizeof nm, "matmul_fwd_ld N=%d C=%d V=%d ld=%d", N, C, V, ld);
	tc_cmp(nm, got, ref, nv, 4e-3 * sqrt(C) / 3, 8e-3, 1e-4);
	T_OK(pok, "%s: pad columns untouched", nm);
	free(got);

	/* matmul_bwd_ld: dout (N, ld) with PAD in the pad columns */
	float *dout = tc_rand(nv, -1, 1, 1), *doutp = strided(dout, N, V, ld, PAD);
	void *ddo = tc_up(g, doutp, nl, BF);
	rl_cpu_matmul_bwd(NULL, dx, dw, NULL, dout, x, w, N, C, V);
	g->matmul_bwd_ld(g, dxo, gw, ddo, ld, dxd, dwd, N, C, V);
	snprintf(nm, sizeof nm, "matmul_bwd_ld dinp N=%d C=%d V=%d ld=%d", N, C, V, ld);
	tc_cmpd(g, nm, dxo, BF, dx, (size_t)N * C, 4e-3 * sqrt(V) / 3, 8e-3, 1e-4);
	snprintf(nm, sizeof nm, "matmul_bwd_ld dw (+=) N=%d C=%d V=%d", N, C, V);
	tc_cmpd(g, nm, gw, F32, dw, (size_t)V * C, 1e-5 * sqrt(N), 1e-4, 1e-8);

	/* logprob_fwd_ld / logprob_bwd_ld (in place) over (N, ld) logits */
	float *lg = tc_rand(nv, -8, 8, 1), *lgp = strided(lg, N, V, ld, PAD);
	float *dlp = tc_rand(N, -1, 1, 0), *dent = tc_rand(N, -0.1f, 0.1f, 0);
	int32_t *tgt = rl_xmalloc((size_t)N * 4);
	for (int i = 0; i < N; i++)
		tgt[i] = (i % 7 == 3) ? -1 : (i % 5 == 1) ? V - 1 : tc_irand(V);
	float *lp = rl_xmalloc((size_t)N * 4), *ent = rl_xmalloc((size_t)N * 4), *lse = rl_xmalloc((size_t)N * 4);
	float *dl = rl_xmalloc(nv * 4);
	void *dlg = tc_up(g, lgp, nl, BF), *dtgt = tc_upi(g, tgt, (size_t)N * 4);
	void *ddlp = tc_up(g, dlp, N, F32), *dde = tc_up(g, dent, N, F32);
	void *glp = tc_poison(g, N, F32), *gent = tc_poison(g, N, F32), *glse = tc_poison(g, N, F32);
	rl_cpu_logprob_fwd(NULL, lp, with_ent ? ent : NULL, lse, lg, tgt, N, V, inv_temp);
	g->logprob_fwd_ld(g, glp, with_ent ? gent : NULL, glse, dlg, ld, dtgt, N, V, inv_temp);
	snprintf(nm, sizeof nm, "logprob_fwd_ld lp N=%d V=%d ld=%d", N, V, ld);
	tc_cmpd(g, nm, glp, F32, lp, N, 2e-4, 1e-4, 1e-8);
	snprintf(nm, sizeof nm, "logprob_fwd_ld lse N=%d V=%d ld=%d", N, V, ld);
	tc_cmpd(g, nm, glse, F32, lse, N, 2e-4, 1e-5, 1e-8);
	if (with_ent) {
		snprintf(nm, sizeof nm, "logprob_fwd_ld entropy N=%d V=%d ld=%d", N, V, ld);
		tc_cmpd(g, nm, gent, F32, ent, N, 2e-4, 1e-4, 1e-8);
	}
	rl_cpu_logprob_bwd(NULL, dl, lg, tgt, lse, dlp, with_ent ? dent : NULL, N, V, inv_temp);
	g->logprob_bwd_ld(g, dlg, dlg, ld, dtgt, glse, ddlp, with_ent ? dde : NULL, N, V, inv_temp);
	got = unstride(dlg, N, V, ld, PAD, &pok);
	snprintf(nm, sizeof nm, "logprob_bwd_ld in place N=%d V=%d ld=%d", N, V, ld);
	tc_cmp(nm, got, dl, nv, 1e-3 * maxabs(dl, nv), 8e-3, 1e-4);
	T_OK(pok, "%s: pad columns untouched", nm);
	free(got);

	/* a stride below the row length is refused (recorded, reported by status) */
	g->logprob_fwd_ld(g, glp, NULL, glse, dlg, V - 1, dtgt, N, V, inv_temp);
	T_EQ_INT(g->status(g), RL_EDEVICE);
	g->matmul_fwd_ld(g, out, V - 1, dxd, dwd, N, C, V);
	T_EQ_INT(g->status(g), RL_EDEVICE);
	tc_check_status(g, "head_ld");
	g->free(g, dxd); g->free(g, dwd); g->free(g, gw); g->free(g, dxo); g->free(g, out); g->free(g, ddo);
	g->free(g, dlg); g->free(g, dtgt); g->free(g, ddlp); g->free(g, dde); g->free(g, glp);
	g->free(g, gent); g->free(g, glse);
	free(x); free(w); free(ref); free(dx); free(dw); free(z0); free(zp); free(dout); free(doutp);
	free(lg); free(lgp); free(dlp); free(dent); free(tgt); free(lp); free(ent); free(lse); free(dl);
}

/* the strided head's cases (its GEMMs split or not by RL_CUDA_HEAD_LD) */
static void
head_ld_cases(void)
{
	if (!g->matmul_fwd_ld)
		return;
	test_head_ld(1, 8, 5, 0, 1.0f, 1);
	test_head_ld(19, 64, 1001, 0, 1.0f, 1);
	test_head_ld(33, 96, 1100, 8, 1.0f / 0.7f, 1);   /* split at 1088; a wider stride */
	test_head_ld(300, 64, 5001, 0, 1.0f, 0);        /* split at 4992 */
	test_head_ld(64, 768, 50257, 0, 1.0f / 0.7f, 1); /* GPT-2's head, stride 50304 */
}

static void
test_pg_loss(int N, int variant)
{
	char nm[80];
	rl_pg_params p = { 0.2f, 0.28f, 0, 0, 0, 1, 0 };
	if (variant >= 1) { p.dual_clip = 3.0f; p.kl_coef = 0.05f; p.kl_type = 3; }
	if (variant >= 2) { p.tis_cap = 2.0f; p.ent_coef = 0.01f; p.kl_type = 2; }
	float *lp = tc_rand(N, -5, -0.01f, 0), *old = rl_xmalloc(N * 4), *beh = rl_xmalloc(N * 4);
	float *ref = tc_rand(N, -5, -0.01f, 0), *ent = tc_rand(N, 0, 3, 0), *adv = tc_rand(N, -2, 2, 0);
	float *w = tc_rand(N, 0, 1, 0);
	for (int i = 0; i < N; i++) {
		old[i] = lp[i] + (float)(tc_unif() - 0.5) * 0.8f;  /* ratios on both sides of the clip */
		beh[i] = old[i] + (float)(tc_unif() - 0.5) * 0.4f;
		if (i % 5 == 0)
			w[i] = 0;
	}
	float *dlp = rl_xmalloc(N * 4), *dent = rl_xmalloc(N * 4), *st = rl_xmalloc((size_t)N * RL_PG_NSTAT * 4);
	void *a[7];
	const float *h[7] = { lp, old, beh, ref, ent, adv, w };
	for (int i = 0; i < 7; i++)
		a[i] = tc_up(g, h[i], N, F32);
	void *gdlp = tc_poison(g, N, F32), *gdent = tc_poison(g, N, F32);
	void *gst = tc_poison(g, (size_t)N * RL_PG_NSTAT, F32);
	int on = variant >= 1;
	rl_cpu_pg_loss(NULL, dlp, variant >= 2 ? dent : NULL, st, lp, old, variant >= 2 ? beh : NULL,
	    on ? ref : NULL, variant >= 2 ? ent : NULL, adv, w, N, &p);
	g->pg_loss(g, gdlp, variant >= 2 ? gdent : NULL, gst, a[0], a[1], variant >= 2 ? a[2] : NULL,
	    on ? a[3] : NULL, variant >= 2 ? a[4] : NULL, a[5], a[6], N, &p);
	snprintf(nm, sizeof nm, "pg_loss dlp N=%d variant=%d", N, variant);
	tc_cmpd(g, nm, gdlp, F32, dlp, N, 1e-6, 1e-5, 1e-10);
	snprintf(nm, sizeof nm, "pg_loss stats N=%d variant=%d", N, variant);
	tc_cmpd(g, nm, gst, F32, st, (size_t)N * RL_PG_NSTAT, 1e-6, 1e-5, 1e-10);
	if (variant >= 2) {
		snprintf(nm, sizeof nm, "pg_loss dent N=%d", N);
		tc_cmpd(g, nm, gdent, F32, dent, N, 1e-7, 1e-6, 1e-12);
	}
	tc_check_status(g, "pg_loss");
	for (int i = 0; i < 7; i++)
		g->free(g, a[i]);
	g->free(g, gdlp); g->free(g, gdent); g->free(g, gst);
	free(lp); free(old); free(beh); free(ref); free(ent); free(adv); free(w); free(dlp); free(dent); free(st);
}

static void
test_optim(size_t n)
{
	char nm[80];
	float *p = tc_rand(n, -1, 1, 0), *gr = tc_rand(n, -1, 1, 0), *m = tc_rand(n, -0.1f, 0.1f, 0);
	float *v = tc_rand(n, 0, 0.01f, 0), *wc = rl_xmalloc(n * 4 + 4);
	void *dp = tc_up(g, p, n, F32), *dg = tc_up(g, gr, n, F32), *dm = tc_up(g, m, n, F32);
	void *dv = tc_up(g, v, n, F32), *dwc = tc_poison(g, n, BF);
	double ss = rl_cpu_sumsq(NULL, gr, n), gs = g->sumsq(g, dg, n);
	snprintf(nm, sizeof nm, "sumsq n=%zu", n);
	float a = (float)gs, b = (float)ss;
	tc_cmp(nm, &a, &b, 1, 1e-9, 1e-6, 1e-12);
	for (int t = 1; t <= 3; t++) {
		rl_cpu_adamw(NULL, p, wc, gr, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
		g->adamw(g, dp, dwc, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
	}
	snprintf(nm, sizeof nm, "adamw x3 param n=%zu", n);
	tc_cmpd(g, nm, dp, F32, p, n, 1e-6, 1e-5, 1e-10);
	snprintf(nm, sizeof nm, "adamw x3 m,v n=%zu", n);
	tc_cmpd(g, nm, dm, F32, m, n, 1e-7, 1e-5, 1e-10);
	tc_cmpd(g, nm, dv, F32, v, n, 1e-9, 1e-5, 1e-10);
	snprintf(nm, sizeof nm, "adamw x3 bf16 copy n=%zu", n);
	tc_cmpd(g, nm, dwc, BF, p, n, 1e-6, 8e-3, 1e-4);
	tc_check_status(g, "optimizer");
	g->free(g, dp); g->free(g, dg); g->free(g, dm); g->free(g, dv); g->free(g, dwc);
	free(p); free(gr); free(m); free(v); free(wc);
}

/* bytes of a device buffer equal to those of another (bit for bit) */
static int
same_bytes(const void *a, const void *b, size_t bytes)
{
	unsigned char *ha = rl_xmalloc(bytes + 1), *hb = rl_xmalloc(bytes + 1);
	g->download(g, ha, a, bytes);
	g->download(g, hb, b, bytes);
	int r = memcmp(ha, hb, bytes) == 0;
	free(ha);
	free(hb);
	return r;
}

/* adamw_multi against adamw per segment (bit for bit: the same arithmetic) and the CPU
 * reference: segments of 1 element, crossing a chunk (8192), starting unaligned right after
 * the previous one (RL_T_FOLLOWS), with gaps between them that must stay untouched; four
 * classes of lr and wd; three steps, then a second table (another plan) and the first
 * again (the kept one).  sh: every buffer starts sh elements into its allocation (sh 1:
 * pointers 4-byte aligned only, the element-by-element path). */
static void
test_adamw_multi(int sh)
{
	char nm[96];
	rl_adamw_seg s1[] = { { 0, 1, 0 }, { 16, 8193, 1 }, { 8209, 5, 1 }, { 8224, 20000, 2 },
	    { 28225, 7, 3 }, { 28240, 3, 0 }, { 28256, 16389, 1 } };
	rl_adamw_seg s2[] = { { 3, 40000, 3 }, { 40003, 4000, 0 } };
	size_t L = 44672 + 16;
	float lr[RL_ADAMW_NCLS] = { 1e-3f, 2e-3f, 5e-4f, 3e-3f }, wd[RL_ADAMW_NCLS] = { 0, 0.1f, 0, 0.05f };
	float *p = tc_rand(L + sh, -1, 1, 0), *gr = tc_rand(L + sh, -1, 1, 0), *m = tc_rand(L + sh, -0.1f, 0.1f, 0);
	float *v = tc_rand(L + sh, 0, 0.01f, 0), *wc = rl_xmalloc((L + sh) * 4);
	void *pa = tc_up(g, p, L + sh, F32), *pb = tc_up(g, p, L + sh, F32), *dg = tc_up(g, gr, L + sh, F32);
	void *ma = tc_up(g, m, L + sh, F32), *mb = tc_up(g, m, L + sh, F32);
	void *va = tc_up(g, v, L + sh, F32), *vb = tc_up(g, v, L + sh, F32);
	void *wa = tc_poison(g, L + sh, BF), *wb = tc_poison(g, L + sh, BF);
	float *P0 = (float *)pa + sh, *P1 = (float *)pb + sh, *G = (float *)dg + sh, *M0 = (float *)ma + sh;
	float *M1 = (float *)mb + sh, *V0 = (float *)va + sh, *V1 = (float *)vb + sh;
	uint16_t *W0 = (uint16_t *)wa + sh, *W1 = (uint16_t *)wb + sh;
	float *hp = p + sh, *hg = gr + sh, *hm = m + sh, *hv = v + sh, *hw = wc + sh;
	float *p0 = rl_xmalloc(L * 4);
	memcpy(p0, hp, L * 4);

	for (int t = 1; t <= 5; t++) {
		const rl_adamw_seg *sg = t == 4 ? s2 : s1;
		int ns = t == 4 ? (int)RL_ARRAY_LEN(s2) : (int)RL_ARRAY_LEN(s1);
		for (int i = 0; i < ns; i++) {
			size_t o = sg[i].off;
			int k = sg[i].cls;
			g->adamw(g, P0 + o, W0 + o, G + o, M0 + o, V0 + o, sg[i].n, lr[k], 0.9f, 0.95f, 1e-8f, wd[k], t, 0.7f);
			rl_cpu_adamw(NULL, hp + o, hw + o, hg + o, hm + o, hv + o, sg[i].n, lr[k], 0.9f, 0.95f, 1e-8f, wd[k],
			    t, 0.7f);
		}
		g->adamw_multi(g, P1, W1, G, M1, V1, sg, ns, lr, wd, 0.9f, 0.95f, 1e-8f, t, 0.7f);
	}
	tc_check_status(g, "adamw_multi");
	snprintf(nm, sizeof nm, "adamw_multi sh=%d: same bits as adamw per segment", sh);
	int same = same_bytes(pa, pb, (L + sh) * 4) && same_bytes(ma, mb, (L + sh) * 4) &&
	    same_bytes(va, vb, (L + sh) * 4) && same_bytes(wa, wb, (L + sh) * 2);
	printf("%s %s\n", same ? "ok  " : "FAIL", nm);
	T_OK(same, "%s", nm);
	/* untouched where neither table reaches (1, 2, from 44645); between the segments of
	 * one table, the per-segment path above leaves them untouched too */
	float *got = tc_down(g, P1, L, F32);
	int gap = got[1] == p0[1] && got[2] == p0[2] && got[44645] == p0[44645] && got[L - 1] == p0[L - 1];
	printf("%s adamw_multi sh=%d: gaps untouched\n", gap ? "ok  " : "FAIL", sh);
	T_OK(gap, "adamw_multi gaps");
	free(got);
	snprintf(nm, sizeof nm, "adamw_multi sh=%d param vs CPU", sh);
	tc_cmpd(g, nm, P1, F32, hp, L, 1e-6, 1e-5, 1e-10);
	snprintf(nm, sizeof nm, "adamw_multi sh=%d m,v vs CPU", sh);
	tc_cmpd(g, nm, M1, F32, hm, L, 1e-7, 1e-5, 1e-10);
	tc_cmpd(g, nm, V1, F32, hv, L, 1e-9, 1e-5, 1e-10);
	/* the bf16 copy where a segment wrote it (the rest is poison on both sides) */
	snprintf(nm, sizeof nm, "adamw_multi sh=%d bf16 copy vs CPU", sh);
	tc_cmpd(g, nm, W1 + 16, BF, hp + 16, 8198, 1e-6, 8e-3, 1e-4);

	/* a class out of range: RL_EINVAL, nothing queued, the backend usable */
	rl_adamw_seg bad[] = { { 0, 4, 0 }, { 4, 4, RL_ADAMW_NCLS } };
	g->adamw_multi(g, P1, NULL, G, M1, V1, bad, 2, lr, wd, 0.9f, 0.95f, 1e-8f, 1, 1.0f);
	int st = g->status(g);
	printf("%s adamw_multi class %d: %s\n", st == RL_EINVAL ? "ok  " : "FAIL", RL_ADAMW_NCLS, rl_strerror(st));
	T_OK(st == RL_EINVAL, "adamw_multi bad class");
	tc_check_status(g, "adamw_multi after an error");
	g->free(g, pa); g->free(g, pb); g->free(g, dg); g->free(g, ma); g->free(g, mb); g->free(g, va);
	g->free(g, vb); g->free(g, wa); g->free(g, wb);
	free(p); free(gr); free(m); free(v); free(wc); free(p0);
}

static void
test_decode(int B, int NH, int NKV, int HD, int BS, int MAXBLK)
{
	char nm[112];
	int W = (NH + 2 * NKV) * HD, NBLK = B * MAXBLK + 3;
	size_t ncache = (size_t)NBLK * BS * NKV * HD;
	/* kv_write of B*3 tokens into random slots, then decode against random contexts */
	int NW = B * 3;
	float *qkvw = tc_rand((size_t)NW * W, -2, 2, 1), *kc = tc_rand(ncache, -2, 2, 1);
	float *vc = tc_rand(ncache, -2, 2, 1);
	int32_t *slot = rl_xmalloc(NW * 4);
	for (int i = 0; i < NW; i++)
		slot[i] = i % 4 == 1 ? -1 : (int)((size_t)i * 7919 % ((size_t)NBLK * BS));
	/* slots must be distinct for a well-defined result */
	for (int i = 0; i < NW; i++)
		for (int j = 0; j < i; j++)
			if (slot[j] == slot[i])
				slot[i] = -1;
	void *dkc = tc_up(g, kc, ncache, BF), *dvc = tc_up(g, vc, ncache, BF);
	void *dqw = tc_up(g, qkvw, (size_t)NW * W, BF), *dsl = tc_upi(g, slot, NW * 4);
	rl_cpu_kv_write(NULL, kc, vc, qkvw, slot, NW, NH, NKV, HD);
	g->kv_write(g, dkc, dvc, dqw, dsl, NW, NH, NKV, HD);
	snprintf(nm, sizeof nm, "kv_write N=%d NKV=%d HD=%d", NW, NKV, HD);
	tc_cmpd(g, nm, dkc, BF, kc, ncache, 0, 0, 0);
	tc_cmpd(g, nm, dvc, BF, vc, ncache, 0, 0, 0);

	float *q = tc_rand((size_t)B * W, -2, 2, 1), *out = rl_xmalloc((size_t)B * NH * HD * 4);
	int32_t *bt = rl_xmalloc((size_t)B * MAXBLK * 4), *cl = rl_xmalloc(B * 4);
	for (int b = 0; b < B; b++) {
		cl[b] = 1 + tc_irand(MAXBLK * BS);
		/* the edges: one key (every split but the first empty) and the whole cache */
		if (b == 0 && B > 1)
			cl[b] = 1;
		if (b == B - 1 && B > 2)
			cl[b] = MAXBLK * BS;
		for (int i = 0; i < MAXBLK; i++)
			bt[b * MAXBLK + i] = tc_irand(NBLK);  /* shared blocks allowed */
	}
	void *dq = tc_up(g, q, (size_t)B * W, BF), *dbt = tc_upi(g, bt, (size_t)B * MAXBLK * 4);
	void *dcl = tc_upi(g, cl, B * 4), *dout = tc_poison(g, (size_t)B * NH * HD, BF);
	rl_cpu_attn_decode(NULL, out, q, kc, vc, bt, cl, B, NH, NKV, HD, BS, MAXBLK);
	g->attn_decode(g, dout, dq, dkc, dvc, dbt, dcl, B, NH, NKV, HD, BS, MAXBLK);
	snprintf(nm, sizeof nm, "attn_decode B=%d NH=%d NKV=%d HD=%d BS=%d ctx<=%d", B, NH, NKV, HD, BS,
	    MAXBLK * BS);
	/* fp32 throughout, one bf16 rounding of the output */
	tc_cmpd(g, nm, dout, BF, out, (size_t)B * NH * HD, 1e-3 * maxabs(out, (size_t)B * NH * HD), 8e-3, 1e-4);
	/* again into another buffer: the same bits (the merge's counters were left at 0, and
	 * its sums do not depend on which block merges) */
	size_t no = (size_t)B * NH * HD;
	void *dout2 = tc_poison(g, no, BF);
	g->attn_decode(g, dout2, dq, dkc, dvc, dbt, dcl, B, NH, NKV, HD, BS, MAXBLK);
	uint16_t *o1 = rl_xmalloc(no * 2), *o2 = rl_xmalloc(no * 2);
	g->download(g, o1, dout, no * 2);
	g->download(g, o2, dout2, no * 2);
	T_OK(memcmp(o1, o2, no * 2) == 0, "%s: a second launch differs", nm);
	tc_check_status(g, "decode");
	g->free(g, dkc); g->free(g, dvc); g->free(g, dqw); g->free(g, dsl); g->free(g, dq);
	g->free(g, dbt); g->free(g, dcl); g->free(g, dout); g->free(g, dout2);
	free(qkvw); free(kc); free(vc); free(slot); free(q); free(out); free(bt); free(cl); free(o1); free(o2);
}

static void
test_sample(int B, int V, float temp, int top_k, float top_p)
{
	char nm[112];
	rl_sample_params p = { temp, top_k, top_p };
	float *lg = tc_rand((size_t)B * V, -6, 6, 1);
	/* a few exact ties, so that the tie rules are exercised */
	for (int b = 0; b < B; b++)
		for (int i = 0; i < 8; i++)
			lg[(size_t)b * V + tc_irand(V)] = 5.5f;
	uint64_t *seed = rl_xmalloc(B * 8), *ctr = rl_xmalloc(B * 8);
	for (int b = 0; b < B; b++) {
		seed[b] = rl_rng_next(&tc_rng);
		ctr[b] = (uint64_t)b * 3;
	}
	int32_t *tok = rl_xmalloc(B * 4);
	float *lp = rl_xmalloc(B * 4);
	void *dl = tc_up(g, lg, (size_t)B * V, BF), *ds = tc_upi(g, seed, B * 8), *dc = tc_upi(g, ctr, B * 8);
	void *dt = tc_poison(g, B, F32), *dlp = tc_poison(g, B, F32);
	rl_cpu_sample(NULL, tok, lp, lg, seed, ctr, B, V, &p);
	g->sample(g, dt, dlp, dl, ds, dc, B, V, &p);
	int32_t *gt = rl_xmalloc(B * 4);
	g->download(g, gt, dt, B * 4);
	float *glp = tc_down(g, dlp, B, F32);
	int same = 0;
	for (int b = 0; b < B; b++)
		same += gt[b] == tok[b];
	/* The draw is the same function on both sides; only expf's last-ulp differences
	 * between libm and CUDA (and the order of the sums) can move a token whose cumulative
	 * mass sits within ~1e-7 of u: allow one such row in a run of 16 rows or more (about
	 * 1e-5 a row). */
	int ok = same >= B - (B >= 16);
	printf("%s sample B=%d V=%d T=%g k=%d p=%g: %d/%d tokens identical\n", ok ? "ok  " : "FAIL", B, V,
	    temp, top_k, top_p, same, B);
	T_OK(ok, "sample tokens");
	/* again: the same bits (the split sampler's counters were left at 0) */
	void *dt2 = tc_poison(g, B, F32), *dlp2 = tc_poison(g, B, F32);
	g->sample(g, dt2, dlp2, dl, ds, dc, B, V, &p);
	int32_t *gt2 = rl_xmalloc(B * 4);
	float *glp1 = rl_xmalloc(B * 4), *glp2 = rl_xmalloc(B * 4);
	g->download(g, gt2, dt2, B * 4);
	g->download(g, glp1, dlp, B * 4);
	g->download(g, glp2, dlp2, B * 4);
	T_OK(memcmp(gt, gt2, B * 4) == 0 && memcmp(glp1, glp2, B * 4) == 0, "sample B=%d V=%d: a second launch differs",
	    B, V);
	g->free(g, dt2); g->free(g, dlp2);
	free(gt2); free(glp1); free(glp2);
	for (int b = 0; b < B; b++)
		if (gt[b] != tok[b])
			glp[b] = lp[b];  /* a moved token's log-prob is checked through the others */
	snprintf(nm, sizeof nm, "sample logp B=%d V=%d T=%g", B, V, temp);
	tc_cmp(nm, glp, lp, B, 1e-4, 1e-4, 1e-8);
	tc_check_status(g, "sample");
	g->free(g, dl); g->free(g, ds); g->free(g, dc); g->free(g, dt); g->free(g, dlp);
	free(lg); free(seed); free(ctr); free(tok); free(lp); free(gt); free(glp);
}

/* Bad arguments are reported through status(), once, and the backend stays usable. */
static void
test_errors(void)
{
	void *p = NULL, *q = NULL;
	float one = 1.0f;
	T_EQ_INT(g->alloc(g, &p, (size_t)1 << 60), RL_ENOMEM);
	T_OK(p == NULL, "failed alloc left a pointer");
	T_EQ_INT(g->status(g), RL_OK);
	p = tc_up(g, &one, 1, F32);
	q = tc_poison(g, 4, F32);
	g->cast(g, q, RL_I32, p, RL_F32, 1);
	T_EQ_INT(g->status(g), RL_ENOTSUP);
	T_EQ_INT(g->status(g), RL_OK);  /* cleared */
	g->adamw(g, p, NULL, p, p, p, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 0, 1);
	T_EQ_INT(g->sync(g), RL_EINVAL);
	rl_pg_params pp = { 0.2f, 0.2f, 0, 0, 0.1f, 7, 0 };
	g->pg_loss(g, q, NULL, q, p, p, NULL, p, NULL, p, p, 1, &pp);
	T_EQ_INT(g->sync(g), RL_EINVAL);
	/* still usable */
	g->cast(g, q, F32, p, F32, 1);
	float back = 0;
	g->download(g, &back, q, 4);
	T_OK(back == 1.0f && g->sync(g) == RL_OK, "backend unusable after errors");
	printf("ok   error paths (alloc 2^60, cast to i32, adamw t=0, kl_type 7)\n");
	g->free(g, p);
	g->free(g, q);
}

/* matmul_fused_fwd (decode fusions, kernels/fuse.cu) against the CPU ops composed: norm, matmul,
 * then add / gelu / swiglu, with the act roundings the separate CUDA ops make in between (the
 * normalised rows and y rounded to bf16).  Weights ~ 1/sqrt(C), so y is of order 1: sums in
 * another order may move a normalised value or y by one bf16 ulp (up to 2^-7 relative), and
 * SwiGLU multiplies two such values: rtol 1.6e-2, atol 2e-3.  sh: x starts sh elements into
 * its allocation (odd: only 2-byte aligned, the unfused path); N > 4 and odd C are unfused too. */
static void
test_fused(int N, int C, int OC, int norm, int ep, int bias, int sh)
{
	char nm[128];
	const int NO = ep == RL_EP_SWIGLU ? OC / 2 : OC, ln = norm == RL_NORM_LN;
	size_t nx = (size_t)N * C, ny = (size_t)N * OC, no = (size_t)N * NO;
	float ws = 1.0f / sqrtf((float)C), eps = ln ? 1e-5f : 1e-6f;
	float *x = tc_rand(nx + sh, -2, 2, 1), *nw = tc_rand(C, 0.5, 1.5, 1), *nb = tc_rand(C, -0.5, 0.5, 1);
	float *w = tc_rand((size_t)OC * C, -ws, ws, 1), *b = tc_rand(OC, -0.5, 0.5, 1), *res = tc_rand(no, -2, 2, 1);
	float *xn = rl_xmalloc(nx * 4 + 4), *y = rl_xmalloc(ny * 4), *ref = rl_xmalloc(no * 4);
	float *st = rl_xmalloc((size_t)N * 8);
	void *dx0 = tc_up(g, x, nx + sh, BF), *dnw = tc_up(g, nw, C, BF), *dnb = tc_up(g, nb, C, BF);
	void *dw = tc_up(g, w, (size_t)OC * C, BF), *db = tc_up(g, b, OC, BF);
	void *dout = ep == RL_EP_ADD ? tc_up(g, res, no, BF) : tc_poison(g, no, BF);
	void *dtmp = tc_poison(g, ny, BF), *dxn = tc_poison(g, nx, BF);
	const float *in = x + sh;

	if (norm) {
		if (ln)
			rl_cpu_layernorm_fwd(NULL, xn, st, st + N, x + sh, nw, nb, N, C, eps);
		else
			rl_cpu_rmsnorm_fwd(NULL, xn, st, x + sh, nw, N, C, eps);
		for (size_t i = 0; i < nx; i++)
			xn[i] = rl_bf16_to_f32(rl_f32_to_bf16(xn[i]));
		in = xn;
	}
	rl_cpu_matmul_fwd(NULL, y, in, w, bias ? b : NULL, N, C, OC);
	for (size_t i = 0; i < ny; i++)
		y[i] = rl_bf16_to_f32(rl_f32_to_bf16(y[i]));
	if (ep == RL_EP_NONE)
		memcpy(ref, y, no * 4);
	else if (ep == RL_EP_ADD)
		rl_cpu_add(NULL, ref, res, y, no);
	else if (ep == RL_EP_GELU)
		rl_cpu_gelu_fwd(NULL, ref, y, no);
	else
		rl_cpu_swiglu_fwd(NULL, ref, y, N, NO);
	g->matmul_fused_fwd(g, dout, dtmp, dxn, (char *)dx0 + 2 * sh, dnw, ln ? dnb : NULL, eps, norm, dw,
	    bias ? db : NULL, N, C, OC, ep);
	snprintf(nm, sizeof nm, "matmul_fused_fwd N=%d C=%d OC=%d norm=%d ep=%d bias=%d sh=%d", N, C, OC, norm, ep,
	    bias, sh);
	/* with the residual, y moved by one ulp (at most 2^-7 |y|) is absolute on a sum that may
	 * cancel */
	tc_cmpd(g, nm, dout, BF, ref, no, 2e-3 + (ep == RL_EP_ADD ? maxabs(y, ny) / 128 : 0), 1.6e-2, 1e-4);
	tc_check_status(g, "matmul_fused_fwd");
	g->free(g, dx0); g->free(g, dnw); g->free(g, dnb); g->free(g, dw); g->free(g, db); g->free(g, dout);
	g->free(g, dtmp); g->free(g, dxn);
	free(x); free(nw); free(nb); free(w); free(b); free(res); free(xn); free(y); free(ref); free(st);
}

/* rope_kv_write against the CPU rope_fwd then kv_write (theta 0: kv_write alone): qkv in RoPE's
 * tolerance (test_qknorm_rope), the cache's written rows likewise (v exact), the slots no row
 * names (and the row with slot -1) left as they were. */
static void
test_rope_kv(int N, int NH, int NKV, int HD, rl_rope rope)
{
	char nm[112];
	const int W = (NH + 2 * NKV) * HD, KV = NKV * HD, nslot = N + 3;
	size_t n = (size_t)N * W, nc = (size_t)nslot * KV;
	float *x = tc_rand(n, -2, 2, 1), *kr = rl_xmalloc(nc * 4), *vr = rl_xmalloc(nc * 4);
	int32_t *pos = rl_xmalloc(N * 4), *slot = rl_xmalloc(N * 4);
	/* distinct slots: 0..N-1 shuffled (3 slots no row names); the last row skipped when N > 1 */
	for (int i = 0; i < N; i++) {
		pos[i] = tc_irand(4096);
		slot[i] = i;
	}
	for (int i = N - 1; i > 0; i--) {
		int j = tc_irand(i + 1), t = slot[i];
		slot[i] = slot[j];
		slot[j] = t;
	}
	if (N > 1)
		slot[N - 1] = -1;
	for (size_t i = 0; i < nc; i++)
		kr[i] = vr[i] = NAN;
	void *dq = tc_up(g, x, n, BF), *dpos = tc_upi(g, pos, N * 4), *dslot = tc_upi(g, slot, N * 4);
	void *dk = tc_poison(g, nc, BF), *dv = tc_poison(g, nc, BF);
	if (rope.theta > 0)
		rl_cpu_rope_fwd(NULL, x, pos, N, NH, NKV, HD, rope);
	rl_cpu_kv_write(NULL, kr, vr, x, slot, N, NH, NKV, HD);
	g->rope_kv_write(g, dk, dv, dq, dpos, dslot, N, NH, NKV, HD, rope);
	snprintf(nm, sizeof nm, "rope_kv_write qkv N=%d NH=%d NKV=%d HD=%d theta=%g factor=%g", N, NH, NKV, HD,
	    rope.theta, rope.factor);
	tc_cmpd(g, nm, dq, BF, x, n, 8e-3, 8e-3, 1e-4);
	float *gk = tc_down(g, dk, nc, BF), *gv = tc_down(g, dv, nc, BF);
	size_t bad = 0, m = 0;
	float *a = rl_xmalloc(nc * 4 + 4), *ar = rl_xmalloc(nc * 4 + 4);
	for (size_t i = 0; i < nc; i++) {
		if (isnan(kr[i])) {
			bad += !isnan(gk[i]) || !isnan(gv[i]);
			continue;
		}
		bad += gv[i] != vr[i];
		a[m] = gk[i];
		ar[m++] = kr[i];
	}
	T_OK(bad == 0, "rope_kv_write cache N=%d HD=%d: v written exactly, unwritten slots untouched (%zu bad)", N,
	    HD, bad);
	snprintf(nm, sizeof nm, "rope_kv_write k cache N=%d NH=%d NKV=%d HD=%d", N, NH, NKV, HD);
	T_OK(m == (size_t)(N > 1 ? N - 1 : 1) * KV, "%s: %zu values written", nm, m);
	tc_cmp(nm, a, ar, m, 8e-3, 8e-3, 1e-4);
	tc_check_status(g, "rope_kv_write");
	g->free(g, dq); g->free(g, dpos); g->free(g, dslot); g->free(g, dk); g->free(g, dv);
	free(x); free(kr); free(vr); free(pos); free(slot); free(gk); free(gv); free(a); free(ar);
}

/* matmul_rope_kv_fwd against the CPU: norm, matmul (act roundings as test_fused), rope_fwd; the
 * rotation mixes two values that may each sit one ulp off (2^-7 |y|): atol from max |y|.  The
 * cache against the op's own qkv: the k and v heads of each row with a slot, bit for bit; the
 * other slots untouched.  sh odd: 2-byte aligned x (the unfused path). */
static void
test_fused_qkv(int N, int C, int NH, int NKV, int HD, int norm, rl_rope rope, int bias, int sh)
{
	char nm[128];
	const int OC = (NH + 2 * NKV) * HD, KV = NKV * HD, nslot = N + 2, ln = norm == RL_NORM_LN;
	size_t nx = (size_t)N * C, ny = (size_t)N * OC, nc = (size_t)nslot * KV;
	float ws = 1.0f / sqrtf((float)C), eps = ln ? 1e-5f : 1e-6f;
	float *x = tc_rand(nx + sh, -2, 2, 1), *nw = tc_rand(C, 0.5, 1.5, 1), *nb = tc_rand(C, -0.5, 0.5, 1);
	float *w = tc_rand((size_t)OC * C, -ws, ws, 1), *b = tc_rand(OC, -0.5, 0.5, 1);
	float *xn = rl_xmalloc(nx * 4 + 4), *y = rl_xmalloc(ny * 4), *st = rl_xmalloc((size_t)N * 8);
	int32_t *pos = rl_xmalloc(N * 4), *slot = rl_xmalloc(N * 4);
	for (int i = 0; i < N; i++) {
		pos[i] = tc_irand(4096);
		slot[i] = i == 1 ? -1 : nslot - 1 - i;  /* distinct, row 1 skipped */
	}
	void *dx0 = tc_up(g, x, nx + sh, BF), *dnw = tc_up(g, nw, C, BF), *dnb = tc_up(g, nb, C, BF);
	void *dw = tc_up(g, w, (size_t)OC * C, BF), *db = tc_up(g, b, OC, BF);
	void *dq = tc_poison(g, ny, BF), *dxn = tc_poison(g, nx, BF), *dk = tc_poison(g, nc, BF);
	void *dv = tc_poison(g, nc, BF), *dpos = tc_upi(g, pos, N * 4), *dslot = tc_upi(g, slot, N * 4);
	const float *in = x + sh;
	if (norm) {
		if (ln)
			rl_cpu_layernorm_fwd(NULL, xn, st, st + N, x + sh, nw, nb, N, C, eps);
		else
			rl_cpu_rmsnorm_fwd(NULL, xn, st, x + sh, nw, N, C, eps);
		for (size_t i = 0; i < nx; i++)
			xn[i] = rl_bf16_to_f32(rl_f32_to_bf16(xn[i]));
		in = xn;
	}
	rl_cpu_matmul_fwd(NULL, y, in, w, bias ? b : NULL, N, C, OC);
	for (size_t i = 0; i < ny; i++)
		y[i] = rl_bf16_to_f32(rl_f32_to_bf16(y[i]));
	float ymax = maxabs(y, ny);
	if (rope.theta > 0)
		rl_cpu_rope_fwd(NULL, y, pos, N, NH, NKV, HD, rope);
	g->matmul_rope_kv_fwd(g, dq, dxn, (char *)dx0 + 2 * sh, dnw, ln ? dnb : NULL, eps, norm, dw, bias ? db : NULL,
	    N, C, NH, NKV, HD, rope, dpos, dk, dv, dslot);
	snprintf(nm, sizeof nm, "matmul_rope_kv_fwd N=%d C=%d NH=%d NKV=%d HD=%d norm=%d theta=%g factor=%g sh=%d", N,
	    C, NH, NKV, HD, norm, rope.theta, rope.factor, sh);
	tc_cmpd(g, nm, dq, BF, y, ny, 8e-3 + ymax / 128, 1.6e-2, 1e-4);
	uint16_t *hq = rl_xmalloc(ny * 2), *hk = rl_xmalloc(nc * 2), *hv = rl_xmalloc(nc * 2);
	g->download(g, hq, dq, ny * 2);
	g->download(g, hk, dk, nc * 2);
	g->download(g, hv, dv, nc * 2);
	size_t bad = 0, written = 0;
	for (int s = 0; s < nslot; s++) {
		int r = -1;
		for (int i = 0; i < N; i++)
			if (slot[i] == s)
				r = i;
		for (int j = 0; j < KV; j++) {
			size_t c = (size_t)s * KV + j;
			if (r < 0) {
				bad += hk[c] != 0xffff || hv[c] != 0xffff;
				continue;
			}
			written++;
			bad += hk[c] != hq[(size_t)r * OC + (size_t)NH * HD + j] ||
			    hv[c] != hq[(size_t)r * OC + (size_t)(NH + NKV) * HD + j];
		}
	}
	T_OK(bad == 0 && written == (size_t)(N - (N > 1)) * KV,
	    "%s: cache = the rows' k and v heads, other slots untouched (%zu bad, %zu written)", nm, bad, written);
	tc_check_status(g, "matmul_rope_kv_fwd");
	g->free(g, dx0); g->free(g, dnw); g->free(g, dnb); g->free(g, dw); g->free(g, db); g->free(g, dq);
	g->free(g, dxn); g->free(g, dk); g->free(g, dv); g->free(g, dpos); g->free(g, dslot);
	free(x); free(nw); free(nb); free(w); free(b); free(xn); free(y); free(st); free(pos); free(slot);
	free(hq); free(hk); free(hv);
}

/* the fused shapes: GPT-2's and Qwen2.5-0.5B's layer and head at 1-4 rows, then shapes the op
 * runs unfused (more rows, a 2-byte aligned x, odd C, N * C past the shared memory) */
static void
fused_cases(void)
{
	test_fused(1, 768, 2304, RL_NORM_LN, RL_EP_NONE, 1, 0);
	test_fused(1, 768, 768, RL_NORM_NONE, RL_EP_ADD, 1, 0);
	test_fused(2, 768, 3072, RL_NORM_LN, RL_EP_GELU, 1, 0);
	test_fused(4, 3072, 768, RL_NORM_NONE, RL_EP_ADD, 1, 0);
	test_fused(4, 768, 50257, RL_NORM_LN, RL_EP_NONE, 0, 0);
	test_fused(1, 896, 1152, RL_NORM_RMS, RL_EP_NONE, 1, 0);
	test_fused(3, 896, 9728, RL_NORM_RMS, RL_EP_SWIGLU, 0, 0);
	test_fused(2, 4864, 896, RL_NORM_NONE, RL_EP_ADD, 0, 0);
	test_fused(1, 896, 151936, RL_NORM_RMS, RL_EP_NONE, 0, 0);
	test_fused(3, 64, 6, RL_NORM_LN, RL_EP_SWIGLU, 1, 0);
	test_fused(2, 64, 77, RL_NORM_NONE, RL_EP_GELU, 0, 0);
	test_fused(1, 8192, 64, RL_NORM_RMS, RL_EP_GELU, 1, 0);
	test_fused(4, 6144, 7, RL_NORM_LN, RL_EP_ADD, 1, 0);
	test_fused(5, 768, 3072, RL_NORM_LN, RL_EP_GELU, 1, 0);
	test_fused(9, 896, 1200, RL_NORM_RMS, RL_EP_SWIGLU, 0, 0);
	test_fused(7, 768, 768, RL_NORM_NONE, RL_EP_ADD, 1, 0);
	test_fused(2, 768, 2304, RL_NORM_LN, RL_EP_NONE, 1, 1);
	test_fused(4, 8192, 33, RL_NORM_RMS, RL_EP_ADD, 1, 0);
	test_fused(1, 100, 20, RL_NORM_LN, RL_EP_GELU, 1, 0);
	/* the QKV epilogue: Qwen2.5-0.5B (14 + 2 + 2 heads of 64), GPT-2 (no RoPE), HD 128, HD 8;
	 * unfused: 6 rows, a 2-byte aligned x */
	test_fused_qkv(1, 896, 14, 2, 64, RL_NORM_RMS, rp(1e6f), 1, 0);
	test_fused_qkv(4, 896, 14, 2, 64, RL_NORM_RMS, rp(1e4f), 1, 0);
	test_fused_qkv(2, 768, 12, 12, 64, RL_NORM_LN, rp(0.0f), 1, 0);
	test_fused_qkv(3, 256, 4, 2, 128, RL_NORM_NONE, rp(1e4f), 0, 0);
	test_fused_qkv(1, 64, 2, 1, 8, RL_NORM_LN, rp(1e4f), 0, 0);
	test_fused_qkv(6, 896, 14, 2, 64, RL_NORM_RMS, rp(1e6f), 1, 0);
	test_fused_qkv(2, 768, 12, 12, 64, RL_NORM_LN, rp(1e4f), 1, 1);
	test_fused_qkv(3, 512, 4, 2, 128, RL_NORM_RMS, rp_l3, 0, 0);
}

/* The backend opened again with one switch set (read when it opens): 1 with g open and
 * the block's heading printed, 0 (a failed check) when it cannot be opened. */
static int
with_env(const char *var, const char *val)
{
	setenv(var, val, 1);
	if (rl_ops_cuda_open(&g, 0) != RL_OK) {
		T_OK(0, "cannot reopen the CUDA backend");
		unsetenv(var);
		return 0;
	}
	printf("-- %s=%s\n", var, val);
	return 1;
}

static void
end_env(const char *var)
{
	rl_ops_close(g);
	unsetenv(var);
}

/* the sampler's cases: greedy and temperature only go to the split sampler
 * (k_sample_split) at every B, top-k and top-p to k_sample */
static void
sample_cases(void)
{
	test_sample(16, 1000, 0.0f, 0, 1.0f);
	test_sample(16, 50257, 1.0f, 0, 1.0f);
	test_sample(16, 50257, 0.7f, 50, 1.0f);
	test_sample(16, 50257, 1.0f, 0, 0.9f);
	test_sample(16, 151936, 1.0f, 20, 0.8f);
	test_sample(7, 13, 1.5f, 3, 0.5f);
	test_sample(1, 50257, 1.0f, 0, 1.0f);
	test_sample(1, 151936, 1.0f, 0, 1.0f);
	test_sample(1, 151936, 0.0f, 0, 1.0f);
	test_sample(2, 50257, 0.7f, 0, 1.0f);
	test_sample(3, 151936, 0.9f, 0, 1.0f);
	test_sample(3, 1001, 1.0f, 0, 1.0f);
	test_sample(5, 13, 0.0f, 0, 1.0f);
	test_sample(5, 13, 1.0f, 0, 1.0f);
	test_sample(256, 151936, 1.0f, 0, 1.0f);
	test_sample(256, 50257, 0.0f, 0, 1.0f);
}

/* the attention cases every attention path runs */
static void
attn_cases(void)
{
	test_attn(3, 130, 6, 2, 64, 2);
	test_attn(2, 257, 12, 12, 64, 0);
	test_attn(1, 100, 14, 2, 64, 2);
	test_attn(2, 600, 8, 2, 64, 2);  /* three query blocks */
	test_attn(2, 77, 4, 1, 128, 1);
}

int
main(void)
{
	T_BEGIN("test_cuda_ops");
	/* the norm backwards added into dx are off by default (measured no faster): on here
	 * unless RL_CUDA_NORM_BWD_ADD is set (=0 leaves them out) */
	const char *nba = getenv("RL_CUDA_NORM_BWD_ADD");
	int want_nba = nba == NULL || strcmp(nba, "1") == 0;
	if (nba == NULL)
		setenv("RL_CUDA_NORM_BWD_ADD", "1", 1);
	int rv = rl_ops_cuda_open(&g, 0);
	if (rv == RL_ENODEV || rv == RL_ENOTSUP)
		T_SKIP("no CUDA device (%s)", rl_strerror(rv));
	if (rv != RL_OK) {
		printf("test_cuda_ops: cannot open the CUDA backend: %s\n", rl_strerror(rv));
		return 1;
	}
	tc_seed();
	T_OK(g->act_dtype == RL_BF16, "act dtype %d", g->act_dtype);

	size_t ns[] = { 1, 7, 1023, 100003 };
	for (size_t i = 0; i < RL_ARRAY_LEN(ns); i++)
		test_cast_add_act(ns[i]);
	test_ew_shift(1027, 1);
	test_ew_shift(1027, 8);
	test_ew_shift(16, 3);
	test_swiglu(1, 5);
	test_swiglu(37, 1000);
	test_swiglu(3, 4864);
	test_swiglu(5, 12);
	test_embed(1, 3, 11, 5, 1);
	test_embed(300, 97, 50, 64, 1);
	test_embed(129, 768, 1000, 0, 0);
	test_norms(1, 7);
	test_norms(33, 768);
	test_norms(257, 4099);
	/* the backward with the row in registers (C % 8 == 0, C <= 1024): Qwen2.5-0.5B's 896 (a
	 * lane's last chunk past the row), GPT-2's 768 with more rows than the grid's warps, 24 */
	test_norms(77, 896);
	test_norms(5000, 768);
	test_norms(5, 24);
	if (!(getenv("RL_CUDA_ADD_NORM") && strcmp(getenv("RL_CUDA_ADD_NORM"), "0") == 0))
		T_OK(g->add_norm_fwd != NULL, "add_norm_fwd installed");
	if (g->add_norm_fwd) {
		test_add_norm(1, 7, 1);
		test_add_norm(33, 768, 1);
		test_add_norm(257, 4099, 1);
		test_add_norm(1, 896, 0);
		test_add_norm(77, 896, 0);
	}
	if (want_nba)
		T_OK(g->layernorm_bwd_add != NULL && g->rmsnorm_bwd_add != NULL, "layernorm_bwd_add, rmsnorm_bwd_add installed");
	if (g->layernorm_bwd_add && g->rmsnorm_bwd_add) {
		/* the row in registers: GPT-2's 768 over more rows than the grid's warps, Qwen2.5's
		 * 896, one chunk; the element-strided kernel: C % 8 != 0, C > 1024, 2-byte aligned */
		test_norm_bwd_add(5000, 768, 1, 1, 0);
		test_norm_bwd_add(33, 768, 1, 0, 0);
		test_norm_bwd_add(2000, 896, 0, 0, 0);
		test_norm_bwd_add(5, 24, 0, 0, 0);
		test_norm_bwd_add(3, 1024, 1, 1, 0);
		test_norm_bwd_add(1, 7, 1, 1, 0);
		test_norm_bwd_add(77, 33, 0, 0, 0);
		test_norm_bwd_add(257, 4099, 1, 1, 0);
		test_norm_bwd_add(130, 1536, 0, 0, 0);
		test_norm_bwd_add(64, 768, 1, 1, 1);
		test_norm_bwd_add(64, 896, 0, 0, 3);
	}
	test_qknorm_rope(1, 2, 1, 8);
	test_qknorm_rope(53, 14, 2, 64);
	test_qknorm_rope(17, 4, 4, 128);
	test_matmul(1, 8, 3, 1, 0);
	test_matmul(77, 130, 33, 1, 1);
	test_matmul(512, 768, 2304, 1, 0);
	test_matmul(300, 896, 4864, 0, 0);
	test_matmul(300, 64, 5001, 1, 0);  /* odd OC: padded rows and a split at 4992 */
	test_matmul(50, 96, 1100, 1, 0);   /* split at 1088, unpadded */
	test_matmul(64, 768, 2304, 1, 1);  /* act pointers only 2-byte aligned */
	test_matmul(33, 96, 1100, 0, 3);
	/* the residual in the GEMM: GPT-2's c_proj and attention projection, Qwen's down
	 * projection, then the fallbacks (2-byte aligned views, OC not a multiple of 8, 3 rows) */
	T_OK(g->matmul_add_fwd != NULL, "matmul_add_fwd installed");
	if (g->matmul_add_fwd) {
		test_matmul_add(512, 3072, 768, 1, 0);
		test_matmul_add(512, 768, 768, 1, 0);
		test_matmul_add(300, 4864, 896, 0, 0);
		test_matmul_add(64, 768, 768, 1, 1);
		test_matmul_add(77, 130, 33, 1, 0);
		test_matmul_add(3, 768, 768, 1, 0);
	}
	/* N <= 4 goes to gemv.cu (16-byte aligned inp): 1-4 rows, odd OC, the LM head's
	 * width, C past one round of chunks; sh 1 (2-byte aligned inp) stays on cuBLASLt */
	test_matmul(1, 768, 2304, 1, 0);
	test_matmul(2, 3072, 768, 1, 0);
	test_matmul(3, 896, 1155, 0, 0);
	test_matmul(4, 4864, 896, 1, 0);
	test_matmul(1, 768, 50257, 0, 0);
	test_matmul(2, 768, 300, 1, 1);
	test_attn(1, 1, 2, 1, 8, 0);
	test_attn(2, 37, 4, 2, 16, 1);
	attn_cases();
	test_logprob(1, 5, 1.0f, 1);
	test_logprob(19, 1001, 1.0f, 1);
	test_logprob(8, 50257, 1.0f / 0.7f, 1);
	test_logprob(5, 151936, 1.0f, 0);
	if (!(getenv("RL_CUDA_HEAD_LD") && strcmp(getenv("RL_CUDA_HEAD_LD"), "0") == 0))
		T_OK(g->matmul_fwd_ld != NULL && g->head_ld_align > 0, "strided LM head installed");
	head_ld_cases();
	test_pg_loss(1, 0);
	test_pg_loss(1000, 0);
	test_pg_loss(1000, 1);
	test_pg_loss(4099, 2);
	test_optim(1);
	test_optim(12345);
	test_optim(1000003);
	T_OK(g->adamw_multi != NULL, "adamw_multi installed");
	if (g->adamw_multi) {
		test_adamw_multi(0);
		test_adamw_multi(1);
	}
	test_decode(1, 2, 1, 8, 4, 1);
	test_decode(5, 12, 12, 64, 16, 9);
	test_decode(3, 14, 2, 64, 16, 40);
	test_decode(2, 4, 2, 128, 32, 12);
	/* the split kernel (decode.cu): one split (many sequences), 64 splits at B = 1 over a
	 * long context, 8 query heads per KV head, 9 (falls back to attn.cu's kernel) */
	test_decode(300, 4, 4, 64, 16, 8);
	test_decode(1, 14, 2, 64, 16, 64);
	test_decode(2, 16, 2, 64, 16, 10);
	test_decode(3, 18, 2, 64, 8, 7);
	test_decode(40, 8, 4, 128, 16, 20);
	test_decode(1, 8, 1, 128, 1, 1);  /* context 1 at B = 1: 63 of 64 splits empty */
	/* 32 splits (the most by default) at B = 1: GPT-2 (22 splits, G 1), G 2 and 8 at HD 128,
	 * contexts up to 1,024 */
	test_decode(1, 12, 12, 64, 16, 64);
	test_decode(3, 4, 2, 128, 16, 64);
	test_decode(1, 8, 1, 128, 16, 64);
	sample_cases();
	/* decode fusions (kernels/fuse.cu), on unless RL_CUDA_DECODE_FUSE=0 */
	if (!(getenv("RL_CUDA_DECODE_FUSE") && strcmp(getenv("RL_CUDA_DECODE_FUSE"), "0") == 0))
		T_OK(g->matmul_fused_fwd != NULL && g->rope_kv_write != NULL && g->matmul_rope_kv_fwd != NULL,
		    "decode fusion ops installed");
	if (g->matmul_fused_fwd && g->rope_kv_write && g->matmul_rope_kv_fwd) {
		fused_cases();
		test_rope_kv(1, 14, 2, 64, rp(1e6f));
		test_rope_kv(4, 14, 2, 64, rp(1e4f));
		test_rope_kv(300, 12, 12, 64, rp(0.0f));
		test_rope_kv(53, 8, 4, 128, rp(1e4f));
		test_rope_kv(37, 8, 2, 64, rp_l3);
	}
	test_errors();
	rl_ops_close(g);

	/* the cuBLAS attention path (RL_CUDA_ATTN=cublas) on the cases above, which run
	 * flash2 by default where it applies (HD 64 and 128) */
	if (with_env("RL_CUDA_ATTN", "cublas")) {
		attn_cases();
		end_env("RL_CUDA_ATTN");
	}
	/* a value outside the list: reported on stderr, the default (flash2) taken */
	if (with_env("RL_CUDA_ATTN", "flash3")) {
		attn_cases();
		end_env("RL_CUDA_ATTN");
	}
	/* the flash-style forward (opt-in) on the same cases */
	if (with_env("RL_CUDA_ATTN", "flash")) {
		test_attn(1, 1, 2, 1, 64, 0);
		attn_cases();
		end_env("RL_CUDA_ATTN");
	}
	/* flash2 (the default, named here: mma.sync forward and backward, kernels/flash2.cu):
	 * T = 1, T not a multiple of 64 or of the 32-row inner tiles of HD 128, GQA 1, 2, 4, 7,
	 * packed and padded rows, HD 64 and 128, GPT-2's and Qwen's head shapes at T = 1024;
	 * HD 16 falls back to the cuBLAS path */
	if (with_env("RL_CUDA_ATTN", "flash2")) {
		test_attn(1, 1, 2, 1, 64, 0);
		test_attn(2, 37, 4, 2, 16, 1);
		test_attn(2, 37, 4, 2, 64, 1);
		attn_cases();
		test_attn(1, 129, 2, 1, 128, 2);
		test_attn(2, 1030, 4, 1, 128, 2);
		test_attn(1, 1024, 12, 12, 64, 0);
		test_attn(1, 1024, 14, 2, 64, 1);
		/* the dK/dV pass by how many query heads a block takes (f2_hper): 528 blocks, so
		 * both of a group in registers; 264 blocks with G = 4, so chunks of 2 summed by
		 * k_f2_dkv_sum (the cases above split down to one head per block) */
		test_attn(132, 65, 4, 2, 64, 2);
		test_attn(66, 65, 8, 2, 64, 1);
		end_env("RL_CUDA_ATTN");
	}
	/* flash2's backward variants (RL_CUDA_FLASH_BWD, the attention default flash2): det (two
	 * passes, named: the bit-for-bit check holds for it only), fused, fused3 and fused32 (one
	 * pass, dQ by f32 atomics into a zeroed accumulator, cast to bf16) on the flash2 cases */
	if (with_env("RL_CUDA_FLASH_BWD", "det")) {
		test_attn(2, 37, 4, 2, 64, 1);
		test_attn_det(2, 1024, 12, 12, 64);
		test_attn_det(1, 777, 14, 2, 128);
		end_env("RL_CUDA_FLASH_BWD");
	}
	const char *fb[] = { "fused", "fused3", "fused32" };
	for (int i = 0; i < 3; i++)
		if (with_env("RL_CUDA_FLASH_BWD", fb[i])) {
			test_attn(1, 1, 2, 1, 64, 0);
			test_attn(2, 37, 4, 2, 64, 1);
			test_attn(1, 1024, 12, 12, 64, 0);
			test_attn(1, 1024, 14, 2, 64, 1);
			/* fused3 is fused's code for other register limits: the shapes above are enough */
			if (i != 1) {
				attn_cases();
				test_attn(1, 129, 2, 1, 128, 2);
				test_attn(2, 1030, 4, 1, 128, 2);
				test_attn(132, 65, 4, 2, 64, 2);
				test_attn(66, 65, 8, 2, 64, 1);
			}
			end_env("RL_CUDA_FLASH_BWD");
		}
	/* a value outside the list: reported on stderr, det taken */
	if (with_env("RL_CUDA_FLASH_BWD", "fast")) {
		test_attn(2, 37, 4, 2, 64, 1);
		test_attn_det(1, 300, 4, 2, 64);
		end_env("RL_CUDA_FLASH_BWD");
	}
	/* decode attention by each of decode.cu's kernels on every shape (the default takes
	 * the key-per-lane kernel with at most 4 splits, the key-per-warp one above; wide only
	 * when asked), then by attn.cu's kernel only (v1) */
	const char *dk[] = { "lane", "split", "wide", "v1" };
	for (int i = 0; i < 4; i++)
		if (with_env("RL_CUDA_DECODE_ATTN", dk[i])) {
			test_decode(5, 12, 12, 64, 16, 9);
			test_decode(3, 14, 2, 64, 16, 40);
			test_decode(2, 4, 2, 128, 32, 12);
			if (i < 3) {
				test_decode(300, 4, 4, 64, 16, 8);
				test_decode(1, 14, 2, 64, 16, 64);
				test_decode(40, 8, 4, 128, 16, 20);
			}
			end_env("RL_CUDA_DECODE_ATTN");
		}
	/* the strided LM head off */
	if (with_env("RL_CUDA_HEAD_LD", "0")) {
		T_OK(g->matmul_fwd_ld == NULL && g->logprob_fwd_ld == NULL && g->head_ld_align == 0,
		    "strided LM head off");
		end_env("RL_CUDA_HEAD_LD");
	}
	/* the element-wise kernels without the vec forms: the same bits, then the CPU */
	if (rl_ops_cuda_open(&g, 0) == RL_OK) {
		ew_bits_run(0);
		rl_ops_close(g);
	}
	if (with_env("RL_CUDA_EW_VEC", "0")) {
		ew_bits_run(1);
		test_cast_add_act(100003);
		test_ew_shift(1027, 8);
		test_swiglu(37, 1000);
		test_qknorm_rope(53, 14, 2, 64);
		test_optim(12345);  /* sumsq element by element */
		end_env("RL_CUDA_EW_VEC");
	}
	/* the element form of the bias gradient (matmul_bwd's dbias) */
	if (with_env("RL_CUDA_COLSUM_VEC", "0")) {
		test_matmul(512, 768, 2304, 1, 0);
		test_matmul(77, 130, 33, 1, 1);
		end_env("RL_CUDA_COLSUM_VEC");
	}
	/* the element-strided norm backward */
	if (with_env("RL_CUDA_NORM_BWD_VEC", "0")) {
		test_norms(33, 768);
		test_norms(77, 896);
		end_env("RL_CUDA_NORM_BWD_VEC");
	}
	/* the residual add after the GEMM (matmul_add_fwd not installed) */
	if (with_env("RL_CUDA_GEMM_ADD", "0")) {
		T_OK(g->matmul_add_fwd == NULL, "RL_CUDA_GEMM_ADD=0 leaves matmul_add_fwd NULL");
		end_env("RL_CUDA_GEMM_ADD");
	}
	/* AdamW tensor by tensor (adamw_multi not installed) */
	if (with_env("RL_CUDA_ADAMW_MULTI", "0")) {
		T_OK(g->adamw_multi == NULL, "RL_CUDA_ADAMW_MULTI=0 leaves adamw_multi NULL");
		end_env("RL_CUDA_ADAMW_MULTI");
	}
	/* the splits merged by the separate kernel (RL_CUDA_DECODE_MERGE=0) */
	if (with_env("RL_CUDA_DECODE_MERGE", "0")) {
		test_decode(1, 14, 2, 64, 16, 64);
		test_decode(2, 16, 2, 64, 16, 10);
		test_decode(40, 8, 4, 128, 16, 20);
		end_env("RL_CUDA_DECODE_MERGE");
	}
	/* 64 splits (the in-kernel merge's most) at B = 1 and 2, merged in the kernel and, with
	 * 100, by the separate kernel (more than the in-kernel merge takes) */
	if (with_env("RL_CUDA_DECODE_SPLITS", "64")) {
		test_decode(1, 14, 2, 64, 16, 64);
		test_decode(2, 16, 2, 64, 16, 10);
		test_decode(1, 8, 1, 128, 1, 1);
		test_decode(3, 4, 2, 128, 16, 64);
		end_env("RL_CUDA_DECODE_SPLITS");
	}
	if (with_env("RL_CUDA_DECODE_SPLITS", "100")) {
		test_decode(1, 14, 2, 64, 16, 64);
		test_decode(1, 8, 1, 128, 16, 64);
		end_env("RL_CUDA_DECODE_SPLITS");
	}
	/* the sampler with one block per row only (k_sample, RL_CUDA_SAMPLE_SPLIT=0) */
	if (with_env("RL_CUDA_SAMPLE_SPLIT", "0")) {
		sample_cases();
		end_env("RL_CUDA_SAMPLE_SPLIT");
	}
	/* matmul_fwd of a few rows through cuBLASLt instead of gemv.cu */
	if (with_env("RL_CUDA_GEMV", "0")) {
		test_matmul(1, 768, 2304, 1, 0);
		test_matmul(4, 4864, 896, 1, 0);
		test_matmul(1, 768, 50257, 0, 0);
		end_env("RL_CUDA_GEMV");
	}
	/* the decode fusions switched off; and, with RL_CUDA_GEMV=0, all of them unfused (the norm,
	 * cuBLASLt, the epilogue's kernel) */
	if (with_env("RL_CUDA_DECODE_FUSE", "0")) {
		T_OK(g->matmul_fused_fwd == NULL && g->rope_kv_write == NULL && g->matmul_rope_kv_fwd == NULL,
		    "RL_CUDA_DECODE_FUSE=0: no fusion ops");
		end_env("RL_CUDA_DECODE_FUSE");
	}
	if (with_env("RL_CUDA_GEMV", "0")) {
		if (g->matmul_fused_fwd && g->matmul_rope_kv_fwd)
			fused_cases();
		end_env("RL_CUDA_GEMV");
	}
	/* fuse.cu's products with rows split over warps (by the rule, and 8 warps a row wherever
	 * the grid covers the outputs) and with the prefetch (head and residual products; every
	 * product on a resident grid): never run on a GPU yet, not the default */
	{
		const char *gv[][2] = { { "RL_CUDA_GEMV_SPLIT", "auto" }, { "RL_CUDA_GEMV_SPLIT", "8" },
			{ "RL_CUDA_GEMV_PF", "1" }, { "RL_CUDA_GEMV_PF", "2" } };
		for (int i = 0; i < 4; i++)
			if (with_env(gv[i][0], gv[i][1])) {
				if (g->matmul_fused_fwd && g->matmul_rope_kv_fwd)
					fused_cases();
				end_env(gv[i][0]);
			}
	}
	/* GELU in the GEMM epilogues (the default; RL_CUDA_GELU_FUSE=0 leaves them out): shapes
	 * the epilogue takes (GPT-2's c_fc and c_proj, N = 1) and shapes that fall back (odd
	 * sizes, padded and split output, 2-byte aligned views) */
	if (rl_ops_cuda_open(&g, 0) == RL_OK) {  /* the default backend again (g was closed above) */
		T_OK(g->matmul_gelu_fwd != NULL && g->matmul_dgelu_bwd != NULL, "fused GELU ops installed");
		if (g->matmul_gelu_fwd && g->matmul_dgelu_bwd) {
			/* N = 1 after the other fused shapes: a cuBLASLt without a GELU
			 * algorithm for it turns the epilogues off for the rest of the run */
			test_matmul_gelu(512, 768, 3072, 1, 0);
			test_matmul_gelu(256, 3072, 768, 1, 0);
			test_matmul_gelu(64, 128, 256, 0, 0);
			test_matmul_gelu(1, 768, 3072, 1, 0);
			test_matmul_gelu(77, 130, 33, 1, 1);
			test_matmul_gelu(300, 64, 5001, 1, 0);
			test_matmul_gelu(64, 768, 3072, 1, 1);
		}
		rl_ops_close(g);
	} else {
		T_OK(0, "cannot reopen the CUDA backend");
	}
	/* bias gradients from the dw GEMM's epilogue (off by default: measured ~1% slower),
	 * checked against the CPU and the column-sum path (g0: the default); =strict
	 * makes a shape cuBLASLt refuses an error: GPT-2's shapes and the fallbacks only */
	{
		const char *bgv[] = { "1", "strict" };
		rl_ops *g0 = NULL;
		if (rl_ops_cuda_open(&g0, 0) != RL_OK)
			T_OK(0, "cannot reopen the CUDA backend");
		for (int i = 0; g0 && i < 2; i++)
			if (with_env("RL_CUDA_BGRAD", bgv[i])) {
				bgrad_cases(g0, i == 1);
				end_env("RL_CUDA_BGRAD");
			}
		rl_ops_close(g0);
	}
	if (with_env("RL_CUDA_GELU_FUSE", "0")) {
		T_OK(g->matmul_gelu_fwd == NULL && g->matmul_dgelu_bwd == NULL,
		    "RL_CUDA_GELU_FUSE=0 leaves the fused GELU ops out");
		end_env("RL_CUDA_GELU_FUSE");
	}
	T_END();
}

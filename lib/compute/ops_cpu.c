/*
 * ops_cpu.c — the CPU backend of lib/compute/ops.h: plain C11 + OpenMP, act dtype
 * float, host memory.  It is the numerical oracle every other backend and the
 * models are checked against, so clarity wins over speed except in the GEMM
 * (cache-blocked, register-tiled, dispatched at run time to AVX-512 / AVX2 /
 * baseline SSE2 code) and the attention loops.
 *
 * Every reduction is split into the same pieces whatever the thread count
 * (fixed chunks combined in order), so results are bitwise reproducible.
 * Decisions the contract leaves open are in docs/ops.md.
 *
 * Leaves out: the CUDA backend (ops_cuda.c), backend selection (ops.c).
 */
/* Let the compiler fuse a*b+c into FMA where the target has it (the AVX2 and
 * AVX-512 GEMM clones); ISO C mode turns contraction off by default.  -O2's
 * "very cheap" vectoriser cost model refuses the softmax loops (selects, simd
 * reductions); the dynamic model vectorises them, and without trapping math the
 * selects of rl_cpu_expf if-convert.
 * Nothing here reads FP exception flags. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast", "vect-cost-model=dynamic", "no-trapping-math")
#endif

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/ops_cpu.h"
#include "base/rng.h"

typedef struct cpu_ctx {
	int status;         /* first error since the last status() */
} cpu_ctx;

static void
fail(rl_ops *o, int rv)
{
	if (o != NULL && o->ctx != NULL) {
		cpu_ctx *c = o->ctx;
		if (c->status == 0)
			c->status = rv;
	}
}

/* scratch allocation inside an op: logged by rl_try_malloc, recorded as RL_ENOMEM */
static void *
scratch(rl_ops *o, size_t n, const char *what)
{
	void *p = rl_try_malloc(n ? n : 1, what);
	if (p == NULL)
		fail(o, RL_ENOMEM);
	return p;
}

static float
dotf(const float *a, const float *b, int n)
{
	float s = 0;
#pragma omp simd reduction(+:s)
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* Row kernels that vectorise are cloned per instruction set; an ifunc picks one
 * at load time. */
#define RL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* Below this many elements an op runs on the calling thread: a parallel region
 * costs microseconds (much more on a loaded machine, where idle OpenMP threads
 * spin), which decode-sized calls cannot repay.  Results do not depend on it. */
#define RL_PAR_MIN 32768

/* Fixed chunking of reductions over rows: the same split for any thread count. */
#define RCHUNK 64

/* ==== memory and control ================================================== */

int
rl_cpu_alloc(rl_ops *o, void **p, size_t bytes)
{
	void *q = NULL;
	*p = NULL;
	/* 64-byte alignment so vector loads never straddle lines needlessly */
	if (posix_memalign(&q, 64, bytes ? bytes : 64) != 0) {
		rl_error("out of memory allocating %zu bytes on the cpu", bytes);
		fail(o, RL_ENOMEM);
		return RL_ENOMEM;
	}
	*p = q;
	return 0;
}

void
rl_cpu_free(rl_ops *o, void *p)
{
	free(p);
}

void
rl_cpu_upload(rl_ops *o, void *dst, const void *host_src, size_t bytes)
{
	if (bytes)
		memmove(dst, host_src, bytes);
}

void
rl_cpu_download(rl_ops *o, void *host_dst, const void *src, size_t bytes)
{
	if (bytes)
		memmove(host_dst, src, bytes);
}

void
rl_cpu_copy(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memmove(dst, src, bytes);
}

void
rl_cpu_zero(rl_ops *o, void *p, size_t bytes)
{
	if (bytes)
		memset(p, 0, bytes);
}

void
rl_cpu_cast(rl_ops *o, void *out, int out_dt, const void *in, int in_dt, size_t n)
{
	if (out_dt == in_dt && (out_dt == RL_F32 || out_dt == RL_BF16)) {
		if (out != in)
			memmove(out, in, n * rl_dtype_size(out_dt));
	} else if (out_dt == RL_BF16 && in_dt == RL_F32) {
		const float *x = in;
		uint16_t *y = out;
#pragma omp parallel for schedule(static) if (n > 65536)
		for (size_t i = 0; i < n; i++)
			y[i] = rl_f32_to_bf16(x[i]);
	} else if (out_dt == RL_F32 && in_dt == RL_BF16) {
		const uint16_t *x = in;
		float *y = out;
#pragma omp parallel for schedule(static) if (n > 65536)
		for (size_t i = 0; i < n; i++)
			y[i] = rl_bf16_to_f32(x[i]);
	} else {
		rl_error("cast: unsupported dtypes %s -> %s", rl_dtype_name(in_dt) ? rl_dtype_name(in_dt) : "?",
		    rl_dtype_name(out_dt) ? rl_dtype_name(out_dt) : "?");
		fail(o, RL_EINVAL);
	}
}

int
rl_cpu_status(rl_ops *o)
{
	if (o == NULL || o->ctx == NULL)
		return 0;
	cpu_ctx *c = o->ctx;
	int rv = c->status;
	c->status = 0;
	return rv;
}

int
rl_cpu_sync(rl_ops *o)
{
	return rl_cpu_status(o);
}

/* ==== embedding ============================================================= */

void
rl_cpu_embed_fwd(rl_ops *o, void *out_, const int32_t *tok, const int32_t *pos,
    const void *wte_, const void *wpe_, int N, int C)
{
	float *out = out_;
	const float *wte = wte_, *wpe = wpe_;
#pragma omp parallel for schedule(static) if ((size_t)N * C > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		float *y = out + (size_t)n * C;
		const float *e = wte + (size_t)tok[n] * C;
		if (wpe != NULL) {
			const float *p = wpe + (size_t)pos[n] * C;
			for (int c = 0; c < C; c++)
				y[c] = e[c] + p[c];
		} else {
			memcpy(y, e, (size_t)C * sizeof(float));
		}
	}
}

void
rl_cpu_embed_bwd(rl_ops *o, float *dwte, float *dwpe, const void *dout_,
    const int32_t *tok, const int32_t *pos, int N, int C)
{
	const float *dout = dout_;
	/* Threads own column ranges, rows are added in order: no races, deterministic. */
	int nb = (C + 63) / 64;
#pragma omp parallel for schedule(static) if ((size_t)C * N > RL_PAR_MIN)
	for (int cb = 0; cb < nb; cb++) {
		int c0 = cb * 64, c1 = RL_MIN(C, c0 + 64);
		for (int n = 0; n < N; n++) {
			const float *g = dout + (size_t)n * C;
			float *a = dwte + (size_t)tok[n] * C;
			for (int c = c0; c < c1; c++)
				a[c] += g[c];
			if (dwpe != NULL) {
				float *b = dwpe + (size_t)pos[n] * C;
				for (int c = c0; c < c1; c++)
					b[c] += g[c];
			}
		}
	}
}

/* ==== normalisation ========================================================= */

/* One row of RMSNorm, y = x * rstd * w; returns rstd.  The row kernels are
 * cloned per instruction set (RL_CLONES); the sums of squares and products
 * run in double, in vector lanes. */
RL_CLONES static float
rmsnorm_row(float *y, const float *x, const float *w, int C, float eps)
{
	double ss = 0;
#pragma omp simd reduction(+:ss)
	for (int c = 0; c < C; c++)
		ss += (double)x[c] * x[c];
	float r = (float)(1.0 / sqrt(ss / C + eps));
	for (int c = 0; c < C; c++)
		y[c] = x[c] * r * w[c];
	return r;
}

/* Its backward for one row: d (C) = dx, pw (C, or NULL) += this row's dw;
 * d may alias g (each element is read before written) */
RL_CLONES static void
drmsnorm_row(float *d, float *pw, const float *g, const float *x, const float *w, float r, int C)
{
	double dot = 0;
#pragma omp simd reduction(+:dot)
	for (int c = 0; c < C; c++)
		dot += (double)g[c] * w[c] * x[c];
	float coef = (float)(dot / C) * r * r * r;
	if (pw)
		for (int c = 0; c < C; c++)
			pw[c] += g[c] * x[c] * r;
	for (int c = 0; c < C; c++)
		d[c] = g[c] * w[c] * r - x[c] * coef;
}

void
rl_cpu_rmsnorm_fwd(rl_ops *o, void *out_, float *rstd, const void *x_, const void *w_,
    int N, int C, float eps)
{
	float *out = out_;
	const float *x = x_, *w = w_;
#pragma omp parallel for schedule(static) if ((size_t)N * C > RL_PAR_MIN)
	for (int n = 0; n < N; n++)
		rstd[n] = rmsnorm_row(out + (size_t)n * C, x + (size_t)n * C, w, C, eps);
}

/* Column reduction helper: part has nchunk rows of len floats; dst += sum of rows, in order. */
static void
reduce_parts(float *dst, const float *part, int nchunk, size_t len)
{
#pragma omp parallel for schedule(static) if (len > 4096)
	for (size_t i = 0; i < len; i++) {
		float s = 0;
		for (int k = 0; k < nchunk; k++)
			s += part[(size_t)k * len + i];
		dst[i] += s;
	}
}

/* rmsnorm_bwd, and with acc rmsnorm_bwd_add: each row's dx computed into a row of scratch
 * (tmp), then added, so the sum is the two-step one (the plain op, then add) bit for bit
 * whatever the compiler contracts */
static void
rmsnorm_bwd(rl_ops *o, float *dx, float *dw, const float *dout, const float *x, const float *w,
    const float *rstd, int N, int C, int acc)
{
	int nchunk = (N + RCHUNK - 1) / RCHUNK;
	float *part = dw ? scratch(o, (size_t)nchunk * C * sizeof(float), "rmsnorm_bwd scratch") : NULL;
	float *tmp = acc ? scratch(o, (size_t)nchunk * C * sizeof(float), "rmsnorm_bwd_add scratch") : NULL;
	if ((dw != NULL && part == NULL) || (acc && tmp == NULL))
		goto out;
#pragma omp parallel for schedule(static) if ((size_t)N * C > RL_PAR_MIN)
	for (int k = 0; k < nchunk; k++) {
		float *pw = part ? part + (size_t)k * C : NULL, *t = tmp ? tmp + (size_t)k * C : NULL;
		if (pw)
			memset(pw, 0, (size_t)C * sizeof(float));
		for (int n = k * RCHUNK; n < RL_MIN(N, (k + 1) * RCHUNK); n++) {
			float *d = dx + (size_t)n * C;
			drmsnorm_row(t ? t : d, pw, dout + (size_t)n * C, x + (size_t)n * C, w, rstd[n], C);
			if (t)
				for (int c = 0; c < C; c++)
					d[c] += t[c];
		}
	}
	if (dw)
		reduce_parts(dw, part, nchunk, (size_t)C);
out:
	free(part);
	free(tmp);
}

void
rl_cpu_rmsnorm_bwd(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C)
{
	rmsnorm_bwd(o, dx, dw, dout, x, w, rstd, N, C, 0);
}

void
rl_cpu_rmsnorm_bwd_add(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C)
{
	rmsnorm_bwd(o, dx, dw, dout, x, w, rstd, N, C, 1);
}

void
rl_cpu_layernorm_fwd(rl_ops *o, void *out_, float *mean, float *rstd, const void *x_,
    const void *w_, const void *b_, int N, int C, float eps)
{
	float *out = out_;
	const float *x = x_, *w = w_, *b = b_;
#pragma omp parallel for schedule(static) if ((size_t)N * C > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *xr = x + (size_t)n * C;
		float *yr = out + (size_t)n * C;
		double s = 0;
		for (int c = 0; c < C; c++)
			s += xr[c];
		double mu = s / C, v = 0;
		for (int c = 0; c < C; c++)
			v += ((double)xr[c] - mu) * ((double)xr[c] - mu);
		float m = (float)mu, r = (float)(1.0 / sqrt(v / C + eps));
		mean[n] = m;
		rstd[n] = r;
		for (int c = 0; c < C; c++)
			yr[c] = (xr[c] - m) * r * w[c] + (b ? b[c] : 0.0f);
	}
}

/* layernorm_bwd, and with acc layernorm_bwd_add (through a row of scratch, as rmsnorm_bwd) */
static void
layernorm_bwd(rl_ops *o, float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
    const float *mean, const float *rstd, int N, int C, int acc)
{
	int nchunk = (N + RCHUNK - 1) / RCHUNK;
	/* part: per chunk, dw partial sums then db partial sums (then a row of dx with acc) */
	size_t per = (size_t)(acc ? 3 : 2) * C;
	float *part = scratch(o, (size_t)nchunk * per * sizeof(float), "layernorm_bwd scratch");
	if (part == NULL)
		return;
#pragma omp parallel for schedule(static) if ((size_t)N * C > RL_PAR_MIN)
	for (int k = 0; k < nchunk; k++) {
		float *pw = part + (size_t)k * per, *pb = pw + C, *t = acc ? pb + C : NULL;
		memset(pw, 0, 2 * (size_t)C * sizeof(float));
		for (int n = k * RCHUNK; n < RL_MIN(N, (k + 1) * RCHUNK); n++) {
			const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
			float *d = dx + (size_t)n * C, *dd = t ? t : d;
			float m = mean[n], r = rstd[n];
			double sg = 0, sgx = 0;
			for (int c = 0; c < C; c++) {
				double gw = (double)g[c] * w[c], xh = (double)(xr[c] - m) * r;
				sg += gw;
				sgx += gw * xh;
			}
			float mg = (float)(sg / C), mgx = (float)(sgx / C);
			for (int c = 0; c < C; c++) {
				float xh = (xr[c] - m) * r;
				pw[c] += g[c] * xh;
				pb[c] += g[c];
				dd[c] = r * (g[c] * w[c] - mg - xh * mgx);
			}
			if (t)
				for (int c = 0; c < C; c++)
					d[c] += t[c];
		}
	}
	/* gather the two halves: dw from the even blocks, db from the odd ones */
	for (int half = 0; half < 2; half++) {
		float *dst = half ? db : dw;
		if (dst == NULL)
			continue;
#pragma omp parallel for schedule(static) if (C > 4096)
		for (int c = 0; c < C; c++) {
			float s = 0;
			for (int k = 0; k < nchunk; k++)
				s += part[(size_t)k * per + (size_t)half * C + c];
			dst[c] += s;
		}
	}
	free(part);
}

void
rl_cpu_layernorm_bwd(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C)
{
	layernorm_bwd(o, dx, dw, db, dout, x, w, mean, rstd, N, C, 0);
}

void
rl_cpu_layernorm_bwd_add(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C)
{
	layernorm_bwd(o, dx, dw, db, dout, x, w, mean, rstd, N, C, 1);
}

void
rl_cpu_qknorm_fwd(rl_ops *o, void *qkv_out_, float *rstd, const void *qkv_in_,
    const void *wq_, const void *wk_, int N, int NH, int NKV, int HD, float eps)
{
	float *y = qkv_out_;
	const float *x = qkv_in_, *wq = wq_, *wk = wk_;
	int W = (NH + 2 * NKV) * HD, NQK = NH + NKV;
#pragma omp parallel for schedule(static) if ((size_t)N * W > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *xr = x + (size_t)n * W;
		float *yr = y + (size_t)n * W;
		for (int h = 0; h < NQK; h++) {
			const float *xh = xr + (size_t)h * HD, *w = h < NH ? wq : wk;
			float *yh = yr + (size_t)h * HD;
			double ss = 0;
			for (int i = 0; i < HD; i++)
				ss += (double)xh[i] * xh[i];
			float r = (float)(1.0 / sqrt(ss / HD + eps));
			rstd[(size_t)n * NQK + h] = r;
			for (int i = 0; i < HD; i++)
				yh[i] = xh[i] * r * w[i];
		}
		if (yr != xr)
			memcpy(yr + (size_t)NQK * HD, xr + (size_t)NQK * HD, (size_t)NKV * HD * sizeof(float));
	}
}

void
rl_cpu_qknorm_bwd(rl_ops *o, void *dqkv_in_, float *dwq, float *dwk, const void *dqkv_out_,
    const void *qkv_in_, const void *wq_, const void *wk_, const float *rstd,
    int N, int NH, int NKV, int HD)
{
	float *dx = dqkv_in_;
	const float *dy = dqkv_out_, *x = qkv_in_, *wq = wq_, *wk = wk_;
	int W = (NH + 2 * NKV) * HD, NQK = NH + NKV;
	int nchunk = (N + RCHUNK - 1) / RCHUNK;
	float *part = scratch(o, (size_t)nchunk * 2 * HD * sizeof(float), "qknorm_bwd scratch");
	if (part == NULL)
		return;
#pragma omp parallel for schedule(static) if ((size_t)N * W > RL_PAR_MIN)
	for (int k = 0; k < nchunk; k++) {
		float *pq = part + (size_t)k * 2 * HD, *pk = pq + HD;
		memset(pq, 0, 2 * (size_t)HD * sizeof(float));
		for (int n = k * RCHUNK; n < RL_MIN(N, (k + 1) * RCHUNK); n++) {
			for (int h = 0; h < NQK; h++) {
				size_t off = (size_t)n * W + (size_t)h * HD;
				const float *xh = x + off, *g = dy + off, *w = h < NH ? wq : wk;
				float *d = dx + off, *pw = h < NH ? pq : pk;
				float r = rstd[(size_t)n * NQK + h];
				double dot = 0;
				for (int i = 0; i < HD; i++)
					dot += (double)g[i] * w[i] * xh[i];
				float coef = (float)(dot / HD) * r * r * r;
				/* reads g[i] before writing d[i]: dqkv_in may alias dqkv_out */
				for (int i = 0; i < HD; i++) {
					float gi = g[i];
					pw[i] += gi * xh[i] * r;
					d[i] = gi * w[i] * r - xh[i] * coef;
				}
			}
			size_t voff = (size_t)n * W + (size_t)NQK * HD;
			if (dx != dy)
				memcpy(dx + voff, dy + voff, (size_t)NKV * HD * sizeof(float));
		}
	}
	if (dwq)
		for (int i = 0; i < HD; i++) {
			float s = 0;
			for (int k = 0; k < nchunk; k++)
				s += part[(size_t)k * 2 * HD + i];
			dwq[i] += s;
		}
	if (dwk)
		for (int i = 0; i < HD; i++) {
			float s = 0;
			for (int k = 0; k < nchunk; k++)
				s += part[(size_t)k * 2 * HD + HD + i];
			dwk[i] += s;
		}
	free(part);
}

/* ==== GEMM ==================================================================== */

#define GEMM_SFX avx512
#define GEMM_VL 16
#define GEMM_MR 8
#define GEMM_TARGET __attribute__((target("avx512f,avx2,fma")))
#include "compute/ops_cpu_gemm.h"

#include "compute/ops_cpu_gemm512.h"

#define GEMM_SFX avx2
#define GEMM_VL 8
#define GEMM_MR 6
#define GEMM_TARGET __attribute__((target("avx2,fma")))
#include "compute/ops_cpu_gemm.h"

#define GEMM_SFX base
#define GEMM_VL 4
#define GEMM_MR 6
#define GEMM_TARGET
#include "compute/ops_cpu_gemm.h"

typedef void gemm_tile_fn(float *c, long ldc, const float *a, long lda, long ak,
    const float *b, long ldb, int btrans, int m, int n, int k, int accum, float *bbuf);
typedef struct gemm_impl { gemm_tile_fn *tile; int mr, nr; } gemm_impl;

static const gemm_impl *
gemm_pick(void)
{
	static const gemm_impl i512 = { gemm_tile_avx512i, G5_MR, 32 }, i512t = { gemm_tile_avx512, 8, 32 },
	    i2 = { gemm_tile_avx2, 6, 16 }, i0 = { gemm_tile_base, 6, 8 };
	static const gemm_impl *chosen;
	const gemm_impl *c = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
	if (c != NULL)
		return c;
	__builtin_cpu_init();
	const char *env = getenv("RL_CPU_GEMM");  /* "avx512", "avx2", "base": for tests and benches */
	int has512 = __builtin_cpu_supports("avx512f"), has2 = __builtin_cpu_supports("avx2") &&
	    __builtin_cpu_supports("fma");
	if (env != NULL && strcmp(env, "base") == 0)
		c = &i0;
	else if (env != NULL && strcmp(env, "avx512t") == 0 && has512)
		c = &i512t;
	else if (env != NULL && strcmp(env, "avx2") == 0 && has2)
		c = &i2;
	else
		c = has512 ? &i512 : has2 ? &i2 : &i0;
	__atomic_store_n(&chosen, c, __ATOMIC_RELEASE);
	return c;
}

enum { GEMM_KC = 256, GEMM_NB = 256 };

/*
 * c (M, N) (+)= A (M, K) @ B (K, N) with A[i][k] = a[i*lda + k*ak] and
 * B[k][j] = b[k*ldb + j] (btrans 0) or b[j*ldb + k] (btrans 1); the tile packs
 * each B panel (see ops_cpu_gemm.h).
 * Threads own (column block, row group) tiles and K is never split, so the sum
 * order for each output is fixed.  Returns 0 or RL_ENOMEM.
 */
static int
gemm(float *c, long ldc, const float *a, long lda, long ak, const float *b, long ldb, int btrans,
    int M, int N, int K, int accum)
{
	const gemm_impl *g = gemm_pick();
	int bad = 0;
	if (M <= 0 || N <= 0)
		return 0;
	if (K <= 0) {
		if (!accum)
			for (int i = 0; i < M; i++)
				memset(c + (long)i * ldc, 0, (size_t)N * sizeof(float));
		return 0;
	}
	int MG = g->mr * 32;
	int ntn = (N + GEMM_NB - 1) / GEMM_NB, ntg = (M + MG - 1) / MG;
#pragma omp parallel reduction(|:bad) if ((double)M * N * K > 2e6)
	{
		float *bbuf = malloc((size_t)GEMM_KC * 32 * sizeof(float));
		if (bbuf == NULL)
			bad = 1;
#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int tn = 0; tn < ntn; tn++) {
			for (int tg = 0; tg < ntg; tg++) {
				if (bad)
					continue;
				int n0 = tn * GEMM_NB, nb = RL_MIN(GEMM_NB, N - n0);
				int m0 = tg * MG, mg = RL_MIN(MG, M - m0);
				for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
					int kc = RL_MIN(GEMM_KC, K - k0);
					const float *bp = btrans ? b + (long)n0 * ldb + k0 : b + (long)k0 * ldb + n0;
					g->tile(c + (long)m0 * ldc + n0, ldc, a + (long)m0 * lda + (long)k0 * ak, lda,
					    ak, bp, ldb, btrans, mg, nb, kc, accum || k0 > 0, bbuf);
				}
			}
		}
		free(bbuf);
	}
	if (bad) {
		rl_error("gemm: out of memory for per-thread buffers");
		return RL_ENOMEM;
	}
	return 0;
}

/* ==== linear layers ============================================================ */

void
rl_cpu_matmul_fwd(rl_ops *o, void *out_, const void *inp_, const void *w_, const void *bias_,
    int N, int C, int OC)
{
	float *out = out_;
	const float *inp = inp_, *w = w_, *bias = bias_;
	if (N <= 4) {
		/* decode-sized: a GEMV bound by reading w once; packing w^T would cost
		 * as much as the product */
#pragma omp parallel for schedule(static) if ((size_t)OC * C > 32768)
		for (int oc = 0; oc < OC; oc++) {
			const float *wr = w + (size_t)oc * C;
			for (int n = 0; n < N; n++) {
				float s = dotf(inp + (size_t)n * C, wr, C);
				out[(size_t)n * OC + oc] = s + (bias ? bias[oc] : 0.0f);
			}
		}
		return;
	}
	if (bias != NULL) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC > RL_PAR_MIN)
		for (int n = 0; n < N; n++)
			memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
	}
	int rv = gemm(out, OC, inp, C, 1, w, C, 1, N, OC, C, bias != NULL);
	if (rv != 0)
		fail(o, RL_ENOMEM);
}

void
rl_cpu_matmul_bwd(rl_ops *o, void *dinp_, float *dw, float *dbias, const void *dout_,
    const void *inp_, const void *w_, int N, int C, int OC)
{
	float *dinp = dinp_;
	const float *dout = dout_, *inp = inp_, *w = w_;
	int rv = 0;
	if (dinp != NULL)
		rv |= gemm(dinp, C, dout, OC, 1, w, C, 0, N, C, OC, 0);
	if (dw != NULL)
		rv |= gemm(dw, C, dout, 1, OC, inp, C, 0, OC, C, N, 1);
	if (dbias != NULL) {
		int nb = (OC + 63) / 64;
#pragma omp parallel for schedule(static) if ((size_t)N * OC > RL_PAR_MIN)
		for (int ob = 0; ob < nb; ob++) {
			int o0 = ob * 64, o1 = RL_MIN(OC, o0 + 64);
			float acc[64] = { 0 };
			for (int n = 0; n < N; n++) {
				const float *g = dout + (size_t)n * OC;
				for (int j = o0; j < o1; j++)
					acc[j - o0] += g[j];
			}
			for (int j = o0; j < o1; j++)
				dbias[j] += acc[j - o0];
		}
	}
	if (rv)
		fail(o, RL_ENOMEM);
}

/* ==== position, attention ======================================================= */

/* One frequency of lib/compute/ops.h's rl_rope: HF's inv_freq in fp32, then Llama 3's rescaling
 * as transformers' fp32 tensor ops compute it (a python number over a tensor is the
 * tensor's reciprocal times the number, rounded to fp32; the thresholds and hi - lo are
 * python doubles rounded to fp32).  No FMA: ISO C mode leaves a * b + c uncontracted. */
float
rl_cpu_rope_inv(rl_rope r, int i, int HD)
{
	float inv = 1.0f / powf(r.theta, (float)(2 * i) / (float)HD);

	if (r.factor > 0.0f) {
		float wl = (1.0f / inv) * (float)(2.0 * M_PI);
		if (wl > (float)((double)r.orig / r.lo)) {
			inv = inv / r.factor;
		} else if (!(wl < (float)((double)r.orig / r.hi))) {
			float s = ((1.0f / wl) * r.orig - r.lo) / (float)((double)r.hi - r.lo);
			inv = (1.0f - s) * inv / r.factor + s * inv;
		}
	}
	return inv;
}

/* HF's rotate-half RoPE: inv_freq and the angle in fp32 as HF computes them,
 * cos/sin of that fp32 angle evaluated accurately.  sign = -1 rotates back. */
static void
rope_angles(float *cs, float *sn, int32_t p, int half, int HD, rl_rope r, float sign)
{
	for (int i = 0; i < half; i++) {
		float inv_freq = rl_cpu_rope_inv(r, i, HD);
		float ang = (float)p * inv_freq;
		cs[i] = (float)cos((double)ang);
		sn[i] = sign * (float)sin((double)ang);
	}
}

static void
rope_apply(float *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope r, float sign)
{
	int W = (NH + 2 * NKV) * HD, half = HD / 2, NQK = NH + NKV;
	/* a training batch repeats positions 0..T-1 in every row: when the tokens
	 * outnumber the positions, the angles come from a table made once (the
	 * same values, computed the same way) */
	int32_t pmax = -1;
	for (int n = 0; n < N; n++)
		pmax = pos[n] > pmax ? pos[n] : pmax;
	float *tab = NULL;
	if (pmax >= 0 && pmax < N / 2 && pmax < 65536)
		tab = malloc((size_t)(pmax + 1) * 2 * half * sizeof(float));  /* NULL: per token */
	if (tab != NULL) {
#pragma omp parallel for schedule(static) if ((size_t)(pmax + 1) * half > 4096)
		for (int p = 0; p <= pmax; p++)
			rope_angles(tab + (size_t)p * 2 * half, tab + (size_t)p * 2 * half + half, p, half, HD,
			    r, sign);
	}
#pragma omp parallel for schedule(static) if ((size_t)N * W > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		float buf[1024];  /* half <= 512: HD <= 1024 */
		const float *cs, *sn;
		if (tab != NULL && pos[n] >= 0) {
			cs = tab + (size_t)pos[n] * 2 * half;
			sn = cs + half;
		} else {
			rope_angles(buf, buf + half, pos[n], half, HD, r, sign);
			cs = buf;
			sn = buf + half;
		}
		float *row = qkv + (size_t)n * W;
		for (int h = 0; h < NQK; h++) {
			float *x = row + (size_t)h * HD;
			for (int i = 0; i < half; i++) {
				float a = x[i], b = x[i + half];
				x[i] = a * cs[i] - b * sn[i];
				x[i + half] = b * cs[i] + a * sn[i];
			}
		}
	}
	free(tab);
}

void
rl_cpu_rope_fwd(rl_ops *o, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD,
    rl_rope r)
{
	if (HD % 2 != 0 || HD > 1024) {
		rl_error("rope: head dim %d must be even and at most 1024", HD);
		fail(o, RL_EINVAL);
		return;
	}
	rope_apply(qkv, pos, N, NH, NKV, HD, r, 1.0f);
}

void
rl_cpu_rope_bwd(rl_ops *o, void *dqkv, const int32_t *pos, int N, int NH, int NKV, int HD,
    rl_rope r)
{
	if (HD % 2 != 0 || HD > 1024) {
		rl_error("rope: head dim %d must be even and at most 1024", HD);
		fail(o, RL_EINVAL);
		return;
	}
	rope_apply(dqkv, pos, N, NH, NKV, HD, r, -1.0f);
}

/*
 * Attention runs per (row, head) task over blocks of ATT_QB queries, with the
 * GEMM tiles doing the products (serially: the tasks are the parallel loop):
 *   S = Q K^T (qb, kmax - kmin), softmax over the visible keys, O = P V.
 * kmax = the block's last query + 1 (causality); invisible keys get p = 0.
 * kmin = 0, or in a packed row (segment ids that never decrease along it) the
 * start of the block's first sequence: keys of earlier sequences are never
 * visible, so a row of packed sequences costs about the sum of their squared
 * lengths (plus a block's width per sequence), not the row's squared length.
 */
enum { ATT_QB = 64 };

/* Whether the row's segment ids (padding, < 0, aside) never decrease: each
 * sequence is then one run of the row. */
static int
att_monotone(const int32_t *sg, int T)
{
	int32_t last = -1;
	for (int t = 0; sg != NULL && t < T; t++) {
		if (sg[t] < 0)
			continue;
		if (sg[t] < last)
			return 0;
		last = sg[t];
	}
	return 1;
}

/* The first key a query of [t0, t0 + qb) can see: see above; mono from att_monotone. */
static int
att_kmin(const int32_t *sg, int mono, int t0, int qb)
{
	int q = t0, s;

	if (sg == NULL || !mono)
		return 0;
	while (q < t0 + qb && sg[q] < 0)
		q++;
	if (q == t0 + qb)
		return t0; /* all padding: no key is read */
	for (s = q; s > 0 && (sg[s - 1] == sg[q] || sg[s - 1] < 0); s--)
		;
	return s;
}

/* c (M,N) (+)= A B in one thread, K cut into GEMM_KC slices (see gemm()) */
static void
gemm_serial(const gemm_impl *g, float *c, long ldc, const float *a, long lda, long ak,
    const float *b, long ldb, int btrans, int M, int N, int K, int accum, float *bbuf)
{
	if (K <= 0) {
		if (!accum)
			for (int i = 0; i < M; i++)
				memset(c + (long)i * ldc, 0, (size_t)N * sizeof(float));
		return;
	}
	for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
		int kc = RL_MIN(GEMM_KC, K - k0);
		const float *bp = btrans ? b + k0 : b + (long)k0 * ldb;
		g->tile(c, ldc, a + (long)k0 * ak, lda, ak, bp, ldb, btrans, M, N, kc, accum || k0 > 0, bbuf);
	}
}

/* p[0..n) <- softmax of scale * p over the keys with sg[s] == st (all when sg
 * is NULL), 0 for the others, and p[n..npad) <- 0 (npad >= n: the exp, sum
 * and scale loops then run whole vectors, without a scalar tail of exps;
 * whatever p holds there is ignored); returns the log-sum-exp. */
RL_CLONES static float
softmax_row(float *p, int n, int npad, const int32_t *sg, int32_t st, float scale)
{
	float mx = -INFINITY;
	if (sg == NULL) {
#pragma omp simd reduction(max:mx)
		for (int s = 0; s < n; s++) {
			float v = p[s] * scale;
			p[s] = v;
			mx = v > mx ? v : mx;
		}
	} else {
#pragma omp simd reduction(max:mx)
		for (int s = 0; s < n; s++) {
			float v = sg[s] == st ? p[s] * scale : -INFINITY;
			p[s] = v;
			mx = v > mx ? v : mx;
		}
	}
	/* the exps, then their sum: two loops, so that each vectorises */
#pragma omp simd
	for (int s = 0; s < npad; s++)
		p[s] = s < n ? rl_cpu_expf(p[s] - mx) : 0.0f;
	double sum = 0;
#pragma omp simd reduction(+:sum)
	for (int s = 0; s < npad; s++)
		sum += p[s];
	float inv = (float)(1.0 / sum);
#pragma omp simd
	for (int s = 0; s < npad; s++)
		p[s] *= inv;
	return mx + (float)log(sum);
}

/* Rows of the score blocks are att_ld(T) floats apart, a whole number of
 * 16-float vectors, so that a row's softmax can run to att_pad(n, ...) keys:
 * n rounded up to a vector (without segments; with them, n: their ids exist
 * only up to T). */
static int
att_ld(int T)
{
	return (T + 15) & ~15;
}

static int
att_pad(int n, long ld, const int32_t *sg)
{
	int np = (n + 15) & ~15;
	return sg != NULL || np > ld ? n : np;
}

/* The first key of query t that a window of win keys leaves visible, relative to kmin:
 * query t sees keys s with t - win < s <= t (win 0: all of them). */
static inline int
att_lo(int t, int kmin, int win)
{
	return win > 0 && t - win + 1 > kmin ? t - win + 1 - kmin : 0;
}

/* The first key any query of [t0, t0 + qb) sees: kmin (att_kmin), or the window's
 * start for the block's first query when that is later. */
static inline int
att_kwin(int kmin, int t0, int win)
{
	return win > 0 && t0 - win + 1 > kmin ? t0 - win + 1 : kmin;
}

/* P (qb, kmax - kmin) <- softmax rows of scale * S for queries t0.., keys from
 * kmin, in place; returns per row the lse (0 for padding).  sg: the row's segment
 * ids or NULL (then kmin is 0). */
static void
softmax_block(float *P, long ldp, float *lse_out, const int32_t *sg, int t0, int qb, int kmin, float scale,
    int win)
{
	for (int i = 0; i < qb; i++) {
		int t = t0 + i, n = t + 1 - kmin, lo = att_lo(t, kmin, win);
		float *p = P + (long)i * ldp;
		if (sg != NULL && sg[t] < 0) {
			memset(p, 0, (size_t)n * sizeof(float));
			lse_out[i] = 0;
			continue;
		}
		/* keys left of the window are 0, the rest a softmax of its own */
		memset(p, 0, (size_t)lo * sizeof(float));
		lse_out[i] = softmax_row(p + lo, n - lo, att_pad(n - lo, ldp - lo, sg), sg ? sg + kmin + lo : NULL,
		    sg ? sg[t] : 0, scale);
	}
}

/* One query row of the backward, keys 0..t (n = t + 1): p <- exp(scale p - L)
 * on visible keys (0 elsewhere); dp <- p (dp - D) scale; without segments
 * p[n..npad) and dp[n..npad) <- 0 (as in softmax_row). */
RL_CLONES static void
dsoftmax_row(float *p, float *dp, int n, int npad, const int32_t *sg, int32_t st, float scale, float L,
    float D)
{
	if (sg == NULL) {
#pragma omp simd
		for (int s = 0; s < npad; s++) {
			float pv = s < n ? rl_cpu_expf(p[s] * scale - L) : 0.0f;
			p[s] = pv;
			dp[s] = s < n ? pv * (dp[s] - D) * scale : 0.0f;
		}
	} else {
#pragma omp simd
		for (int s = 0; s < n; s++) {
			float pv = sg[s] == st ? rl_cpu_expf(p[s] * scale - L) : 0.0f;
			p[s] = pv;
			dp[s] = pv * (dp[s] - D) * scale;
		}
	}
}

void
rl_cpu_attn_fwd(rl_ops *o, void *out, float *lse, const void *qkv, const int32_t *seg,
    int B, int T, int NH, int NKV, int HD)
{
	rl_cpu_attn_fwd_ex(o, out, lse, qkv, seg, B, T, NH, NKV, HD, 1.0f / sqrtf((float)HD), 0);
}

void
rl_cpu_attn_fwd_ex(rl_ops *o, void *out_, float *lse, const void *qkv_, const int32_t *seg,
    int B, int T, int NH, int NKV, int HD, float scale, int win)
{
	float *out = out_;
	const float *qkv = qkv_;
	int W = (NH + 2 * NKV) * HD;
	int bad = 0;
	if (NKV <= 0 || NH % NKV != 0) {
		rl_error("attention: %d query heads are not a multiple of %d kv heads", NH, NKV);
		fail(o, RL_EINVAL);
		return;
	}
	int G = NH / NKV, TP = att_ld(T);
	const gemm_impl *g = gemm_pick();
#pragma omp parallel reduction(|:bad) if ((double)B * NH * T * T * HD > 1e6)
	{
		/* P block (QB, TP), the block's lse, GEMM panel buffer */
		float *P = malloc(((size_t)ATT_QB * TP + ATT_QB + (size_t)GEMM_KC * 32) * sizeof(float));
		if (P == NULL)
			bad = 1;
#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int b = 0; b < B; b++) {
			for (int h = 0; h < NH; h++) {
				if (P == NULL)
					continue;
				float *lb = P + (size_t)ATT_QB * TP, *bbuf = lb + ATT_QB;
				const float *base = qkv + (size_t)b * T * W;
				const float *K = base + (size_t)(NH + h / G) * HD, *Vv = base + (size_t)(NH + NKV + h / G) * HD;
				const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
				int mono = att_monotone(sg, T);
				for (int t0 = 0; t0 < T; t0 += ATT_QB) {
					int qb = RL_MIN(ATT_QB, T - t0), kmax = t0 + qb;
					int k0 = att_kwin(att_kmin(sg, mono, t0, qb), t0, win);
					const float *Q = base + (size_t)t0 * W + (size_t)h * HD;
					/* S = Q K^T over keys k0..kmax-1 (the part right of the diagonal is ignored) */
					gemm_serial(g, P, TP, Q, W, 1, K + (size_t)k0 * W, W, 1, qb, kmax - k0, HD, 0, bbuf);
					softmax_block(P, TP, lb, sg, t0, qb, k0, scale, win);
					/* zero the masked upper triangle so O = P V can run over kmax - k0 keys */
					for (int i = 0; i < qb; i++)
						memset(P + (size_t)i * TP + t0 + i + 1 - k0, 0, (size_t)(qb - i - 1) * sizeof(float));
					float *O = out + ((size_t)b * T + t0) * NH * HD + (size_t)h * HD;
					gemm_serial(g, O, (long)NH * HD, P, TP, 1, Vv + (size_t)k0 * W, W, 0, qb, HD, kmax - k0, 0,
					    bbuf);
					for (int i = 0; i < qb; i++)
						lse[((size_t)b * NH + h) * T + t0 + i] = lb[i];
				}
			}
		}
		free(P);
	}
	if (bad) {
		rl_error("attention: out of memory for scratch of %d tokens", T);
		fail(o, RL_ENOMEM);
	}
}

void
rl_cpu_attn_bwd(rl_ops *o, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD)
{
	rl_cpu_attn_bwd_ex(o, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV, HD, 1.0f / sqrtf((float)HD), 0);
}

void
rl_cpu_attn_bwd_ex(rl_ops *o, void *dqkv_, const void *dout_, const void *out_, const float *lse,
    const void *qkv_, const int32_t *seg, int B, int T, int NH, int NKV, int HD, float scale, int win)
{
	float *dqkv = dqkv_;
	const float *dout = dout_, *out = out_, *qkv = qkv_;
	int W = (NH + 2 * NKV) * HD, OW = NH * HD;
	int bad = 0;
	if (NKV <= 0 || NH % NKV != 0) {
		rl_error("attention: %d query heads are not a multiple of %d kv heads", NH, NKV);
		fail(o, RL_EINVAL);
		return;
	}
	int G = NH / NKV, TP = att_ld(T);
	const gemm_impl *g = gemm_pick();
	/* One task per (row, kv head): it owns dk, dv of that head and dq of its G query heads. */
#pragma omp parallel reduction(|:bad) if ((double)B * NH * T * T * HD > 1e6)
	{
		size_t fl = (size_t)2 * ATT_QB * TP + (size_t)2 * T * HD + ATT_QB + (size_t)GEMM_KC * 32;
		float *P = malloc(fl * sizeof(float));
		if (P == NULL)
			bad = 1;
#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int b = 0; b < B; b++) {
			for (int kvh = 0; kvh < NKV; kvh++) {
				if (P == NULL)
					continue;
				float *dP = P + (size_t)ATT_QB * TP, *dK = dP + (size_t)ATT_QB * TP, *dV = dK + (size_t)T * HD;
				float *Dr = dV + (size_t)T * HD, *bbuf = Dr + ATT_QB;
				const float *base = qkv + (size_t)b * T * W;
				const float *K = base + (size_t)(NH + kvh) * HD, *Vv = base + (size_t)(NH + NKV + kvh) * HD;
				float *dbase = dqkv + (size_t)b * T * W;
				const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
				int mono = att_monotone(sg, T);
				memset(dK, 0, (size_t)2 * T * HD * sizeof(float));
				for (int h = kvh * G; h < (kvh + 1) * G; h++) {
					for (int t0 = 0; t0 < T; t0 += ATT_QB) {
						int qb = RL_MIN(ATT_QB, T - t0), kmax = t0 + qb;
						int k0 = att_kwin(att_kmin(sg, mono, t0, qb), t0, win);
						int nk = kmax - k0;
						const float *Kk = K + (size_t)k0 * W, *Vk = Vv + (size_t)k0 * W;
						const float *Q = base + (size_t)t0 * W + (size_t)h * HD;
						const float *dO = dout + ((size_t)b * T + t0) * OW + (size_t)h * HD;
						const float *Ob = out + ((size_t)b * T + t0) * OW + (size_t)h * HD;
						const float *L = lse + ((size_t)b * NH + h) * T + t0;
						gemm_serial(g, P, TP, Q, W, 1, Kk, W, 1, qb, nk, HD, 0, bbuf);
						gemm_serial(g, dP, TP, dO, OW, 1, Vk, W, 1, qb, nk, HD, 0, bbuf);
						/* P = exp(scale S - lse) on visible keys, 0 elsewhere;
						 * dS = P (dP - D) scale with D = dO . O, written over dP */
						for (int i = 0; i < qb; i++) {
							int t = t0 + i, n = t + 1 - k0, lo = att_lo(t, k0, win);
							float *p = P + (size_t)i * TP, *dp = dP + (size_t)i * TP;
							if (sg != NULL && sg[t] < 0) {
								n = 0;  /* padding query: no gradient */
							} else {
								float D = dotf(dO + (size_t)i * OW, Ob + (size_t)i * OW, HD);
								/* keys left of the window */
								memset(p, 0, (size_t)lo * sizeof(float));
								memset(dp, 0, (size_t)lo * sizeof(float));
								dsoftmax_row(p + lo, dp + lo, n - lo, att_pad(n - lo, TP - lo, sg),
								    sg ? sg + k0 + lo : NULL, sg ? sg[t] : 0, scale, L[i], D);
							}
							/* keys after the query (and all of a padding row) */
							memset(p + n, 0, (size_t)(nk - n) * sizeof(float));
							memset(dp + n, 0, (size_t)(nk - n) * sizeof(float));
						}
						/* dQ = dS K; dK += dS^T Q; dV += P^T dO (keys k0..kmax-1) */
						gemm_serial(g, dbase + (size_t)t0 * W + (size_t)h * HD, W, dP, TP, 1, Kk, W, 0,
						    qb, HD, nk, 0, bbuf);
						gemm_serial(g, dK + (size_t)k0 * HD, HD, dP, 1, TP, Q, W, 0, nk, HD, qb, 1, bbuf);
						gemm_serial(g, dV + (size_t)k0 * HD, HD, P, 1, TP, dO, OW, 0, nk, HD, qb, 1, bbuf);
					}
				}
				for (int s = 0; s < T; s++) {
					memcpy(dbase + (size_t)s * W + (size_t)(NH + kvh) * HD, dK + (size_t)s * HD,
					    (size_t)HD * sizeof(float));
					memcpy(dbase + (size_t)s * W + (size_t)(NH + NKV + kvh) * HD, dV + (size_t)s * HD,
					    (size_t)HD * sizeof(float));
				}
			}
		}
		free(P);
	}
	if (bad) {
		rl_error("attention: out of memory for scratch of %d tokens", T);
		fail(o, RL_ENOMEM);
	}
}

/* ==== activations, residual ======================================================= */

/* One row of SwiGLU, y = silu(g) * u with gu = [g | u]: cloned per instruction
 * set (RL_CLONES) so the exp vectorises. */
RL_CLONES static void
swiglu_row(float *y, const float *gu, int H)
{
	const float *g = gu, *u = gu + H;
	for (int i = 0; i < H; i++)
		y[i] = g[i] / (1.0f + rl_cpu_expf(-g[i])) * u[i];
}

/* Its backward for one row; dgu may alias gu (each element is read before written) */
RL_CLONES static void
dswiglu_row(float *dgu, const float *dy, const float *gu, int H)
{
	const float *g = gu, *u = gu + H;
	float *dg = dgu, *du = dgu + H;
	for (int i = 0; i < H; i++) {
		float gi = g[i], ui = u[i], d = dy[i];
		float sig = 1.0f / (1.0f + rl_cpu_expf(-gi));
		dg[i] = d * ui * sig * (1.0f + gi * (1.0f - sig));
		du[i] = d * gi * sig;
	}
}

void
rl_cpu_swiglu_fwd(rl_ops *o, void *out_, const void *gu_, int N, int H)
{
	float *out = out_;
	const float *gu = gu_;
#pragma omp parallel for schedule(static) if ((size_t)N * H > RL_PAR_MIN)
	for (int n = 0; n < N; n++)
		swiglu_row(out + (size_t)n * H, gu + (size_t)n * 2 * H, H);
}

void
rl_cpu_swiglu_bwd(rl_ops *o, void *dgu_, const void *dout_, const void *gu_, int N, int H)
{
	float *dgu = dgu_;
	const float *dout = dout_, *gu = gu_;
#pragma omp parallel for schedule(static) if ((size_t)N * H > RL_PAR_MIN)
	for (int n = 0; n < N; n++)
		dswiglu_row(dgu + (size_t)n * 2 * H, dout + (size_t)n * H, gu + (size_t)n * 2 * H, H);
}

#define GELU_K 0.7978845608028654f  /* sqrt(2/pi) */

void
rl_cpu_gelu_fwd(rl_ops *o, void *out_, const void *x_, size_t n)
{
	float *out = out_;
	const float *x = x_;
#pragma omp parallel for schedule(static) if (n > 16384)
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		out[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v)));
	}
}

void
rl_cpu_gelu_bwd(rl_ops *o, void *dx_, const void *dout_, const void *x_, size_t n)
{
	float *dx = dx_;
	const float *dout = dout_, *x = x_;
#pragma omp parallel for schedule(static) if (n > 16384)
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		float u = GELU_K * (v + 0.044715f * v * v * v);
		float th = tanhf(u);
		float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
		dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
	}
}

/* Gemma's GELU gate, gelu_tanh(g) = 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3),
 * computed as g sigmoid(2u) (the same function: 1 + tanh u = 2 sigmoid(2u)) with
 * rl_cpu_expf, so that the rows vectorise (libm's tanhf does not) and neither tail cancels.
 * Cloned per instruction set (RL_CLONES). */
RL_CLONES static void
geglu_row(float *y, const float *gu, int H)
{
	const float *g = gu, *u = gu + H;
	for (int i = 0; i < H; i++) {
		float v = g[i];
		y[i] = v / (1.0f + rl_cpu_expf(-2.0f * GELU_K * (v + 0.044715f * v * v * v))) * u[i];
	}
}

/* Its backward for one row: d gelu_tanh / dg = s + 2 g s (1 - s) du/dg with s = sigmoid(2u);
 * dgu may alias gu (each element is read before written). */
RL_CLONES static void
dgeglu_row(float *dgu, const float *dy, const float *gu, int H)
{
	const float *g = gu, *u = gu + H;
	float *dg = dgu, *du = dgu + H;
	for (int i = 0; i < H; i++) {
		float v = g[i], ui = u[i], d = dy[i];
		float sg = 1.0f / (1.0f + rl_cpu_expf(-2.0f * GELU_K * (v + 0.044715f * v * v * v)));
		float dudv = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
		dg[i] = d * ui * (sg + 2.0f * v * sg * (1.0f - sg) * dudv);
		du[i] = d * v * sg;
	}
}

void
rl_cpu_geglu_fwd(rl_ops *o, void *out_, const void *gu_, int N, int H)
{
	float *out = out_;
	const float *gu = gu_;
	(void)o;
#pragma omp parallel for schedule(static) if ((size_t)N * H > RL_PAR_MIN)
	for (int n = 0; n < N; n++)
		geglu_row(out + (size_t)n * H, gu + (size_t)n * 2 * H, H);
}

void
rl_cpu_geglu_bwd(rl_ops *o, void *dgu_, const void *dout_, const void *gu_, int N, int H)
{
	float *dgu = dgu_;
	const float *dout = dout_, *gu = gu_;
	(void)o;
#pragma omp parallel for schedule(static) if ((size_t)N * H > RL_PAR_MIN)
	for (int n = 0; n < N; n++)
		dgeglu_row(dgu + (size_t)n * 2 * H, dout + (size_t)n * H, gu + (size_t)n * 2 * H, H);
}

void
rl_cpu_add(rl_ops *o, void *out_, const void *a_, const void *b_, size_t n)
{
	float *out = out_;
	const float *a = a_, *b = b_;
#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* ==== output layer ================================================================== */

/* Row kernels of the vocabulary loops, cloned per instruction set (RL_CLONES):
 * they are memory- and exp-bound and vectorise. */

/* max of z = x * it over a row, then S = sum e^(z-m), E = sum e^(z-m) (z-m) */
RL_CLONES static float
lse_row(const float *x, int V, float it, double *S_, double *E_)
{
	float m = -INFINITY;
#pragma omp simd reduction(max:m)
	for (int j = 0; j < V; j++) {
		float z = x[j] * it;
		m = z > m ? z : m;  /* NaNs skip the max and poison S below */
	}
	double S = 0, E = 0;
#pragma omp simd reduction(+:S, E)
	for (int j = 0; j < V; j++) {
		float d = x[j] * it - m;
		float e = rl_cpu_expf(d);
		S += e;
		E += (double)e * d;
	}
	*S_ = S;
	*E_ = E;
	return m;
}

/* entropy -sum p log p of a row with log p = x * it - L */
RL_CLONES static double
ent_row(const float *x, int V, float it, float L)
{
	double h = 0;
#pragma omp simd reduction(+:h)
	for (int j = 0; j < V; j++) {
		float lpj = x[j] * it - L;
		h -= (double)rl_cpu_expf(lpj) * lpj;
	}
	return h;
}

/* d[j] = (-gl p_j - ge p_j (log p_j + H)) * it.  d may be x itself: each j reads
 * x[j] before writing d[j], so simd is safe. */
RL_CLONES static void
dlogit_row(float *d, const float *x, int V, float it, float L, float gl, float ge, float H)
{
#pragma omp simd
	for (int j = 0; j < V; j++) {
		float lpj = x[j] * it - L, p = rl_cpu_expf(lpj);
		d[j] = (-gl * p - ge * p * (lpj + H)) * it;
	}
}

void
rl_cpu_logprob_fwd(rl_ops *o, float *lp, float *ent, float *lse, const void *logits_,
    const int32_t *tgt, int N, int V, float inv_temp)
{
	const float *logits = logits_;
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * V > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * V;
		if (tgt[n] < 0) {
			lp[n] = 0;
			if (ent)
				ent[n] = 0;
			lse[n] = 0;
			continue;
		}
		/* S = sum e^(z-m); E = sum e^(z-m) (z-m): entropy = log S - E/S without cancellation */
		double S, E;
		float m = lse_row(x, V, inv_temp, &S, &E);
		double logS = log(S);
		lse[n] = (float)(m + logS);
		lp[n] = (float)((double)(x[tgt[n]] * inv_temp - m) - logS);
		if (ent)
			ent[n] = (float)(logS - E / S);
	}
}

void
rl_cpu_logprob_bwd(rl_ops *o, void *dlogits_, const void *logits_, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp)
{
	float *dl = dlogits_;
	const float *logits = logits_;
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * V > RL_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * V;
		float *d = dl + (size_t)n * V;
		if (tgt[n] < 0) {
			memset(d, 0, (size_t)V * sizeof(float));
			continue;
		}
		float L = lse[n], gl = dlp[n], ge = dent ? dent[n] : 0.0f, H = 0;
		if (ge != 0)    /* the entropy is not saved by the forward: recompute it */
			H = (float)ent_row(x, V, inv_temp, L);
		/* d lp / dz_j = [j==t] - p_j;  d ent / dz_j = -p_j (log p_j + ent) */
		dlogit_row(d, x, V, inv_temp, L, gl, ge, H);
		d[tgt[n]] += gl * inv_temp;
	}
}

/* ==== losses ========================================================================== */

void
rl_cpu_pg_loss(rl_ops *o, float *dlp, float *dent, float *stats, const float *lp,
    const float *old, const float *beh, const float *ref, const float *ent, const float *adv,
    const float *w, int N, const rl_pg_params *p)
{
	if (ref != NULL && (p->kl_type < 1 || p->kl_type > 3)) {
		rl_error("pg_loss: unknown kl_type %d (1, 2 or 3)", p->kl_type);
		fail(o, RL_EINVAL);
		return;
	}
	float lo = 1.0f - p->clip_low, hi = 1.0f + p->clip_high;
#pragma omp parallel for schedule(static) if (N > 16384)
	for (int n = 0; n < N; n++) {
		float *st = stats + (size_t)n * RL_PG_NSTAT;
		if (w[n] == 0) {
			/* ignored tokens may hold garbage (padding): keep NaN/inf out of sums */
			dlp[n] = 0;
			if (dent)
				dent[n] = 0;
			for (int k = 0; k < RL_PG_NSTAT; k++)
				st[k] = 0;
			continue;
		}
		float A = adv[n];
		float r = expf(lp[n] - old[n]);
		float rc = fminf(fmaxf(r, lo), hi);
		float un = -A * r, cl = -A * rc;
		float pg, dpg;          /* value, and d pg / d lp */
		int clipped = 0;
		if (un >= cl) {
			pg = un;
			dpg = -A * r;
		} else {
			pg = cl;        /* the clip is active: r is outside [lo, hi] */
			dpg = 0;
			clipped = 1;
		}
		if (A < 0 && p->dual_clip > 0 && pg > -A * p->dual_clip) {
			pg = -A * p->dual_clip;
			dpg = 0;
			clipped = 1;
		}
		if (beh != NULL && p->tis_cap > 0) {
			float tis = fminf(expf(old[n] - beh[n]), p->tis_cap);
			pg *= tis;
			dpg *= tis;
		}
		float loss = pg, dl = dpg, kl = 0;
		if (ref != NULL) {
			float dlt = lp[n] - ref[n], dkl;
			switch (p->kl_type) {
			case 1:
				kl = dlt;
				dkl = 1;
				break;
			case 2:
				kl = 0.5f * dlt * dlt;
				dkl = dlt;
				break;
			default:
				kl = expf(-dlt) + dlt - 1.0f;
				dkl = 1.0f - expf(-dlt);
				break;
			}
			loss += p->kl_coef * kl;
			dl += p->kl_coef * dkl;
		}
		if (ent != NULL)
			loss -= p->ent_coef * ent[n];
		dlp[n] = w[n] * dl;
		if (dent)
			dent[n] = ent != NULL ? -w[n] * p->ent_coef : 0.0f;
		st[RL_PG_LOSS] = loss;
		st[RL_PG_CLIPPED] = (float)clipped;
		st[RL_PG_RATIO] = r;
		st[RL_PG_KL] = kl;
	}
}

/* ==== optimizer ========================================================================== */

#define SUMSQ_CHUNK 65536

double
rl_cpu_sumsq(rl_ops *o, const float *x, size_t n)
{
	size_t nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
	double part_small[64], *part = nchunk <= 64 ? part_small : scratch(o, nchunk * sizeof(double),
	    "sumsq scratch");
	if (part == NULL)
		return NAN;
#pragma omp parallel for schedule(static) if (nchunk > 1)
	for (size_t k = 0; k < nchunk; k++) {
		size_t i0 = k * SUMSQ_CHUNK, i1 = RL_MIN(n, i0 + SUMSQ_CHUNK);
		double s = 0;
#pragma omp simd reduction(+:s)
		for (size_t i = i0; i < i1; i++)
			s += (double)x[i] * x[i];
		part[k] = s;
	}
	double s = 0;
	for (size_t k = 0; k < nchunk; k++)
		s += part[k];
	if (part != part_small)
		free(part);
	return s;
}

#define ADAM_CHUNK 16384

/* The update on a contiguous piece; the arrays are distinct (omp simd says so). */
RL_CLONES static void
adamw_chunk(float *param, float *wc, const float *grad, float *m, float *v, size_t n, float lr,
    float b1, float b2, float eps, float wd, float bc1, float bc2, float gs)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		float g = grad[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * g;
		float vi = b2 * v[i] + (1.0f - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		float pi = param[i];
		param[i] = pi - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * pi);
	}
	if (wc != NULL)
		memcpy(wc, param, n * sizeof(float));
}

void
rl_cpu_adamw(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v,
    size_t n, float lr, float b1, float b2, float eps, float wd, int t, float grad_scale)
{
	if (t < 1) {
		rl_error("adamw: step %d must be >= 1", t);
		fail(o, RL_EINVAL);
		return;
	}
	/* bias corrections in double: b2^t for t in the thousands loses bits in float */
	float bc1 = (float)(1.0 - pow((double)b1, t)), bc2 = (float)(1.0 - pow((double)b2, t));
	float *wc = wcopy;
	size_t nchunk = (n + ADAM_CHUNK - 1) / ADAM_CHUNK;
#pragma omp parallel for schedule(static) if (nchunk > 1)
	for (size_t k = 0; k < nchunk; k++) {
		size_t i0 = k * ADAM_CHUNK, len = RL_MIN(n - i0, (size_t)ADAM_CHUNK);
		adamw_chunk(param + i0, wc ? wc + i0 : NULL, grad + i0, m + i0, v + i0, len, lr, b1, b2,
		    eps, wd, bc1, bc2, grad_scale);
	}
}

/* ==== generation ============================================================================ */

void
rl_cpu_kv_write(rl_ops *o, void *kc_, void *vc_, const void *qkv_, const int32_t *slot,
    int N, int NH, int NKV, int HD)
{
	float *kc = kc_, *vc = vc_;
	const float *qkv = qkv_;
	size_t W = (size_t)(NH + 2 * NKV) * HD, KW = (size_t)NKV * HD;
#pragma omp parallel for schedule(static) if (N > 64)
	for (int n = 0; n < N; n++) {
		if (slot[n] < 0)
			continue;
		const float *row = qkv + (size_t)n * W;
		memcpy(kc + (size_t)slot[n] * KW, row + (size_t)NH * HD, KW * sizeof(float));
		memcpy(vc + (size_t)slot[n] * KW, row + (size_t)(NH + NKV) * HD, KW * sizeof(float));
	}
}

/* One (sequence, head) of decode attention over its L cached tokens: k and v
 * point at the head's columns of slot 0, a slot is KW floats; sc (L) and acc
 * (HD) are scratch.  Cloned per instruction set (RL_CLONES). */
RL_CLONES static void
decode_head(float *y, const float *q, const float *k, const float *v, size_t KW, const int32_t *bt,
    int L, int HD, int BS, float scale, float *sc, float *acc, int first)
{
	float mx = -INFINITY;
	/* the keys block by block from the first the window leaves: token s is row s % BS of
	 * block bt[s / BS] */
	for (int s0 = first - first % BS; s0 < L; s0 += BS) {
		const float *kb = k + (size_t)bt[s0 / BS] * BS * KW;
		for (int s = RL_MAX(s0, first); s < L && s < s0 + BS; s++) {
			const float *kr = kb + (size_t)(s - s0) * KW;
			float d = 0;
#pragma omp simd reduction(+:d)
			for (int i = 0; i < HD; i++)
				d += q[i] * kr[i];
			sc[s] = d * scale;
			mx = sc[s] > mx ? sc[s] : mx;
		}
	}
	memset(acc, 0, (size_t)HD * sizeof(float));
	double sum = 0;
	for (int s0 = first - first % BS; s0 < L; s0 += BS) {
		const float *vb = v + (size_t)bt[s0 / BS] * BS * KW;
		for (int s = RL_MAX(s0, first); s < L && s < s0 + BS; s++) {
			const float *vr = vb + (size_t)(s - s0) * KW;
			float p = rl_cpu_expf(sc[s] - mx);
			sum += p;
#pragma omp simd
			for (int i = 0; i < HD; i++)
				acc[i] += p * vr[i];
		}
	}
	float inv = (float)(1.0 / sum);
	for (int i = 0; i < HD; i++)
		y[i] = acc[i] * inv;
}

void
rl_cpu_attn_decode(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
    int BS, int MAXBLK)
{
	rl_cpu_attn_decode_ex(o, out, qkv, kc, vc, block_table, ctx_len, B, NH, NKV, HD, BS, MAXBLK,
	    1.0f / sqrtf((float)HD), 0);
}

void
rl_cpu_attn_decode_ex(rl_ops *o, void *out_, const void *qkv_, const void *kc_, const void *vc_,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
    int BS, int MAXBLK, float scale, int win)
{
	float *out = out_;
	const float *qkv = qkv_, *kc = kc_, *vc = vc_;
	size_t W = (size_t)(NH + 2 * NKV) * HD, KW = (size_t)NKV * HD;
	int G = NKV > 0 ? NH / NKV : 0, cap = BS * MAXBLK, bad = 0;
	if (NKV <= 0 || NH % NKV != 0) {
		rl_error("attn_decode: %d query heads are not a multiple of %d kv heads", NH, NKV);
		fail(o, RL_EINVAL);
		return;
	}
	size_t work = 0;
	for (int b = 0; b < B; b++) {
		work += (size_t)ctx_len[b] * NH * HD;
		if (ctx_len[b] < 1 || ctx_len[b] > cap) {
			rl_error("attn_decode: sequence %d has %d cached tokens, outside 1..%d", b, ctx_len[b], cap);
			fail(o, RL_EINVAL);
			return;
		}
	}
#pragma omp parallel reduction(|:bad) if (work > RL_PAR_MIN)
	{
		float *sc = malloc(((size_t)cap + HD) * sizeof(float));
		if (sc == NULL)
			bad = 1;
#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int b = 0; b < B; b++) {
			for (int h = 0; h < NH; h++) {
				if (sc == NULL)
					continue;
				decode_head(out + (size_t)b * NH * HD + (size_t)h * HD, qkv + (size_t)b * W + (size_t)h * HD,
				    kc + (size_t)(h / G) * HD, vc + (size_t)(h / G) * HD, KW,
				    block_table + (size_t)b * MAXBLK, ctx_len[b], HD, BS, scale, sc, sc + cap,
				    win > 0 && ctx_len[b] > win ? ctx_len[b] - win : 0);
			}
		}
		free(sc);
	}
	if (bad) {
		rl_error("attn_decode: out of memory for scratch of %d tokens", cap);
		fail(o, RL_ENOMEM);
	}
}

/* candidate order: larger weight first, ties by lower token id */
typedef struct cand { float e; int32_t id; } cand;

static int
cand_cmp(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	if (x->e != y->e)
		return x->e > y->e ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static int
id_cmp(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	return (x->id > y->id) - (x->id < y->id);
}

/* min-heap on cand_cmp order (root = the worst of the kept top-k) */
static void
heap_sift(cand *h, int k, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, w = i;
		if (l < k && cand_cmp(&h[l], &h[w]) > 0)
			w = l;
		if (r < k && cand_cmp(&h[r], &h[w]) > 0)
			w = r;
		if (w == i)
			return;
		cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

/* e[j] = exp(x[j] / T - m) with m = max(x) / T, the max of x / T (division by
 * T > 0 is monotonic); *mp = m; returns the sum of e, added in token order in
 * double.  Cloned per instruction set (RL_CLONES).  The logits are finite (a
 * NaN would make every weight NaN whichever max is taken). */
RL_CLONES static double
sample_weights(float *e, float *mp, const float *x, int V, float T)
{
	float mx = -INFINITY;
#pragma omp simd reduction(max:mx)
	for (int j = 0; j < V; j++)
		mx = x[j] > mx ? x[j] : mx;
	float m = mx / T;
	for (int j = 0; j < V; j++)
		e[j] = rl_cpu_expf(x[j] / T - m);
	double S = 0;
	for (int j = 0; j < V; j++)
		S += e[j];
	*mp = m;
	return S;
}

/* One row; e (V) scratch for exp(z - max), c (V) scratch for candidates. */
static void
sample_row(int32_t *tok, float *logp, const float *x, int V, const rl_sample_params *p,
    double u, float *e, cand *c)
{
	float T = p->temperature;
	if (!(T > 0)) {
		/* greedy: first maximum; logp at temperature 1 */
		int best = 0;
		for (int j = 1; j < V; j++)
			if (x[j] > x[best])
				best = j;
		double S = 0;
		for (int j = 0; j < V; j++)
			S += rl_cpu_expf(x[j] - x[best]);
		*tok = best;
		*logp = (float)(-log(S));
		return;
	}
	float m;
	double S = sample_weights(e, &m, x, V, T);
	int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
	int topp = p->top_p < 1.0f;
	int nc = 0;
	double total = S;
	if (k < V || topp) {
		if (k < V) {
			for (int j = 0; j < V; j++) {
				cand cj = { e[j], j };
				if (nc < k) {
					c[nc++] = cj;
					if (nc == k)
						for (int i = k / 2 - 1; i >= 0; i--)
							heap_sift(c, k, i);
				} else if (cand_cmp(&cj, &c[0]) < 0) {
					c[0] = cj;
					heap_sift(c, k, 0);
				}
			}
			total = 0;
			for (int i = 0; i < nc; i++)
				total += c[i].e;
		} else {
			/* only the nucleus needs sorting: take every token at or above a
			 * threshold whose mass already reaches top_p, lowering it 16x a step */
			float th = 1.0f / 16;
			for (;;) {
				double mass = 0;
				for (int j = 0; j < V; j++)
					if (e[j] >= th)
						mass += e[j];
				if (mass >= (double)p->top_p * S || th < FLT_MIN * 16)
					break;
				th /= 16;
			}
			if (th < FLT_MIN * 16)
				th = 0;
			for (int j = 0; j < V; j++)
				if (e[j] >= th)
					c[nc++] = (cand){ e[j], j };
		}
		qsort(c, (size_t)nc, sizeof(cand), cand_cmp);
		if (topp) {
			/* keep the most likely tokens while the mass before them is < top_p */
			double cum = c[0].e, lim = (double)p->top_p * total;
			int keep = 1;
			while (keep < nc && cum < lim)
				cum += c[keep++].e;
			nc = keep;
		}
		/* draw in token-id order over the kept set */
		qsort(c, (size_t)nc, sizeof(cand), id_cmp);
	}
	int t;
	if (nc == 0) {
		double target = u * S, cum = 0;
		t = V - 1;
		for (int j = 0; j < V; j++) {
			cum += e[j];
			if (cum > target) {
				t = j;
				break;
			}
		}
	} else {
		double kt = 0;
		for (int i = 0; i < nc; i++)
			kt += c[i].e;
		double target = u * kt, cum = 0;
		t = c[nc - 1].id;
		for (int i = 0; i < nc; i++) {
			cum += c[i].e;
			if (cum > target) {
				t = c[i].id;
				break;
			}
		}
	}
	*tok = t;
	*logp = (float)((double)(x[t] / T - m) - log(S));
}

void
rl_cpu_decode_advance(rl_ops *o, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS)
{
	(void)o;
	for (int b = 0; b < B; b++) {
		int p = pos[b] + 1;
		tok[b] = otok[b];
		pos[b] = p;
		ctx[b]++;
		ctr[b]++;
		slot[b] = bt[(size_t)b * cols + p / BS] * BS + p % BS;
	}
}

void
rl_cpu_sample(rl_ops *o, int32_t *tok, float *logp, const void *logits_,
    const uint64_t *seed, const uint64_t *counter, int B, int V, const rl_sample_params *p)
{
	const float *logits = logits_;
	int bad = 0;
#pragma omp parallel reduction(|:bad) if (B > 1 && (size_t)B * V > RL_PAR_MIN)
	{
		float *e = malloc((size_t)V * sizeof(float));
		cand *c = malloc((size_t)V * sizeof(cand));
		if (e == NULL || c == NULL)
			bad = 1;
#pragma omp for schedule(dynamic, 1)
		for (int b = 0; b < B; b++) {
			if (e == NULL || c == NULL)
				continue;
			double u = rl_rng_uniform(seed[b], counter[b]);
			sample_row(&tok[b], &logp[b], logits + (size_t)b * V, V, p, u, e, c);
		}
		free(e);
		free(c);
	}
	if (bad) {
		rl_error("sample: out of memory for a vocabulary of %d", V);
		fail(o, RL_ENOMEM);
	}
}

/* ==== the table ================================================================================ */

static void
cpu_close(rl_ops *o)
{
	if (o == NULL)
		return;
	free(o->ctx);
	free(o);
}

int
rl_ops_cpu_open(rl_ops **out)
{
	*out = NULL;
	rl_ops *o = rl_try_calloc(1, sizeof(*o), "cpu backend");
	cpu_ctx *c = rl_try_calloc(1, sizeof(*c), "cpu backend");
	if (o == NULL || c == NULL) {
		free(o);
		free(c);
		return RL_ENOMEM;
	}
	o->name = "cpu";
	o->act_dtype = RL_F32;
	o->device = -1;
	o->ctx = c;
	o->alloc = rl_cpu_alloc;
	o->free = rl_cpu_free;
	o->upload = rl_cpu_upload;
	o->download = rl_cpu_download;
	o->copy = rl_cpu_copy;
	o->zero = rl_cpu_zero;
	o->cast = rl_cpu_cast;
	o->sync = rl_cpu_sync;
	o->status = rl_cpu_status;
	o->embed_fwd = rl_cpu_embed_fwd;
	o->embed_bwd = rl_cpu_embed_bwd;
	o->rmsnorm_fwd = rl_cpu_rmsnorm_fwd;
	o->rmsnorm_bwd = rl_cpu_rmsnorm_bwd;
	o->layernorm_fwd = rl_cpu_layernorm_fwd;
	o->layernorm_bwd = rl_cpu_layernorm_bwd;
	o->layernorm_bwd_add = rl_cpu_layernorm_bwd_add;
	o->rmsnorm_bwd_add = rl_cpu_rmsnorm_bwd_add;
	o->qknorm_fwd = rl_cpu_qknorm_fwd;
	o->qknorm_bwd = rl_cpu_qknorm_bwd;
	o->matmul_fwd = rl_cpu_matmul_fwd;
	o->matmul_bwd = rl_cpu_matmul_bwd;
	o->rope_fwd = rl_cpu_rope_fwd;
	o->rope_bwd = rl_cpu_rope_bwd;
	o->attn_fwd = rl_cpu_attn_fwd;
	o->attn_bwd = rl_cpu_attn_bwd;
	o->swiglu_fwd = rl_cpu_swiglu_fwd;
	o->swiglu_bwd = rl_cpu_swiglu_bwd;
	o->gelu_fwd = rl_cpu_gelu_fwd;
	o->gelu_bwd = rl_cpu_gelu_bwd;
	o->add = rl_cpu_add;
	o->logprob_fwd = rl_cpu_logprob_fwd;
	o->logprob_bwd = rl_cpu_logprob_bwd;
	o->pg_loss = rl_cpu_pg_loss;
	o->sumsq = rl_cpu_sumsq;
	o->adamw = rl_cpu_adamw;
	o->kv_write = rl_cpu_kv_write;
	o->attn_decode = rl_cpu_attn_decode;
	o->sample = rl_cpu_sample;
	o->decode_advance = rl_cpu_decode_advance;
	o->close = cpu_close;
	*out = o;
	return 0;
}

/*
 * test_ops_cpu.c — the CPU reference backend (lib/compute/ops_cpu.c) against
 * (a) hand-computed values and naive double-precision implementations written
 * out here from the formulas in lib/compute/ops.h, and (b) backward passes against
 * double-precision central differences of those naive forwards.  Shapes are
 * small and awkward on purpose: T = 1, odd C, NH != NKV, packed and padded
 * segments, V and GEMM sizes that are not multiples of any block.
 *
 * Tolerances are atol + rtol*|ref| per element (plus a normalised MSE bound),
 * justified beside each check: the op runs in fp32 with fp32/double
 * accumulation against an exact double reference, so the bound is a small
 * multiple of 2^-24 times the size of the sum.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "base/rng.h"
#include "t.h"

static rl_rng R = { 12345, 0 };

static double
urand(void)  /* uniform in [-1, 1) */
{
	return 2.0 * rl_rng_next_uniform(&R) - 1.0;
}

static float *
frand(size_t n, double scale)
{
	float *x = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(urand() * scale);
	return x;
}

static double *
todbl(const float *x, size_t n)
{
	double *d = malloc((n ? n : 1) * sizeof(double));
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

/*
 * Compare got (fp32) with ref (double): every element within atol + rtol*|ref|,
 * and NMSE = sum (got-ref)^2 / sum ref^2 below nmse (skipped when |ref| is at the
 * atol noise floor).
 * One check per array; the worst element is named on failure.
 */
static void
cmp_(const char *file, int line, const char *what, const float *got, const double *ref, size_t n,
    double atol, double rtol, double nmse)
{
	size_t worst = 0;
	double wex = -1, se = 0, sr = 0;
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - ref[i]), lim = atol + rtol * fabs(ref[i]);
		se += e * e;
		sr += ref[i] * ref[i];
		if (!(e <= lim))
			bad = 1;
		if (!(e - lim <= wex) || isnan(e)) {
			wex = e - lim;
			worst = i;
		}
	}
	/* NMSE only means something when the reference is not itself at the noise floor */
	double nm = sr > (double)n * atol * atol ? se / sr : 0;
	if (bad || nm > nmse) {
		t_fail++;
		fprintf(stderr, "FAIL %s:%d: %s: element %zu got %.9g ref %.9g (atol %g rtol %g); nmse %.3g (max %g)\n",
		    file, line, what, worst, n ? got[worst] : 0.0, n ? ref[worst] : 0.0, atol, rtol, nm, nmse);
	} else {
		t_pass++;
	}
}
#define CMP(what, got, ref, n, atol, rtol, nmse) cmp_(__FILE__, __LINE__, what, got, ref, n, atol, rtol, nmse)

/* Central differences of a scalar function of a double array, element by element. */
typedef double (*lossfn)(void *ctx);
static double *
fd_grad(lossfn L, void *ctx, double *x, size_t n, double h)
{
	double *g = malloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++) {
		double x0 = x[i];
		x[i] = x0 + h;
		double lp = L(ctx);
		x[i] = x0 - h;
		double lm = L(ctx);
		x[i] = x0;
		g[i] = (lp - lm) / (2 * h);
	}
	return g;
}

/* The same on every stride-th element only (long vectors), gathering the
 * matching analytic values into got_sub; returns the count. */
static size_t
fd_grad_sub(lossfn L, void *ctx, double *x, size_t n, double h, size_t stride, const float *got,
    double *ref_sub, float *got_sub)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i += stride, k++) {
		double x0 = x[i];
		x[i] = x0 + h;
		double lp = L(ctx);
		x[i] = x0 - h;
		double lm = L(ctx);
		x[i] = x0;
		ref_sub[k] = (lp - lm) / (2 * h);
		got_sub[k] = got[i];
	}
	return k;
}

static double
ddot(const double *a, const double *b, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* ==== memory, control, backend selection ==================================== */

static void
test_memory(void)
{
	rl_ops *o;
	T_EQ_INT(rl_ops_open(&o, "cpu"), 0);
	T_EQ_STR(o->name, "cpu");
	T_EQ_INT(o->act_dtype, RL_F32);
	T_EQ_INT(o->device, -1);
	void *p = NULL, *q = NULL;
	T_EQ_INT(o->alloc(o, &p, 40), 0);
	T_EQ_INT(o->alloc(o, &q, 40), 0);
	T_OK(((uintptr_t)p & 63) == 0, "alloc is 64-byte aligned");
	float h[10], back[10];
	for (int i = 0; i < 10; i++)
		h[i] = (float)i + 0.5f;
	o->upload(o, p, h, sizeof h);
	o->copy(o, q, p, sizeof h);
	o->download(o, back, q, sizeof h);
	T_OK(memcmp(h, back, sizeof h) == 0, "upload/copy/download round trip");
	o->zero(o, q, 4 * sizeof(float));
	o->download(o, back, q, sizeof h);
	T_OK(back[0] == 0 && back[3] == 0 && back[4] == 4.5f, "zero clears exactly the bytes asked");
	/* cast: bf16 round to nearest even, and back exactly */
	float fx[4] = { 1.0f, 1.00390625f /* 1 + 2^-8: a tie, to even */, 1.01171875f /* 1 + 3*2^-8: tie up */, -3.0e38f };
	uint16_t b16[4];
	float fy[4];
	o->cast(o, b16, RL_BF16, fx, RL_F32, 4);
	o->cast(o, fy, RL_F32, b16, RL_BF16, 4);
	T_EQ_INT(b16[0], 0x3f80);
	T_EQ_INT(b16[1], 0x3f80);
	T_EQ_INT(b16[2], 0x3f82);
	T_OK(fy[0] == 1.0f && fy[1] == 1.0f && fy[2] == 1.015625f, "bf16 -> f32 exact");
	T_CLOSE(fy[3], -3.0e38, 0, 0.004);
	T_EQ_INT(o->status(o), 0);
	o->cast(o, fy, RL_F32, b16, RL_I8, 4);
	T_EQ_INT(o->status(o), RL_EINVAL);
	T_EQ_INT(o->status(o), 0);  /* status clears */
	o->free(o, p);
	o->free(o, q);
	o->free(o, NULL);
	T_EQ_INT(o->sync(o), 0);
	rl_ops_close(o);
	rl_ops_close(NULL);

	T_EQ_INT(rl_ops_open(&o, "bogus"), RL_EINVAL);
	T_OK(o == NULL, "no table on failure");
	T_EQ_INT(rl_ops_open(&o, "cuda:x"), RL_EINVAL);
	T_EQ_INT(rl_ops_open(&o, "cuda:"), RL_EINVAL);
	T_EQ_INT(rl_ops_open(&o, "cuda:-1"), RL_EINVAL);
	T_EQ_INT(rl_ops_open(&o, "cudax"), RL_EINVAL);
	T_EQ_INT(rl_ops_open(&o, "cuda:1025"), RL_EINVAL);
	T_EQ_INT(rl_ops_open(&o, "cuda:1 "), RL_EINVAL);
	/* the option parsers' check is the same: what it takes, rl_ops_open parses */
	T_EQ_INT(rl_ops_device_ok("cpu") + rl_ops_device_ok("auto") + rl_ops_device_ok("cuda") +
	    rl_ops_device_ok("cuda:0") + rl_ops_device_ok("cuda:1024"), 5);
	T_EQ_INT(rl_ops_device_ok("cuda:1025") + rl_ops_device_ok("cuda:") + rl_ops_device_ok("cuda:x") +
	    rl_ops_device_ok("cuda:-1") + rl_ops_device_ok("CPU") + rl_ops_device_ok("cuda:00001"), 0);
	/* auto always gives a backend: CUDA where there is one, the CPU otherwise */
	T_EQ_INT(rl_ops_open(&o, "auto"), 0);
	T_OK(o != NULL && (strcmp(o->name, "cpu") == 0 || strcmp(o->name, "cuda") == 0), "auto opens cpu or cuda");
	rl_ops_close(o);
	int rv = rl_ops_open(&o, "cuda");
	if (rv == 0) {
		T_EQ_STR(o->name, "cuda");
		rl_ops_close(o);
	} else {
		T_OK(rv == RL_ENOTSUP || rv == RL_ENODEV, "cuda open: %s", rl_strerror(rv));
		T_OK(o == NULL, "no table on failure");
	}
#if !HAVE_CUDA
	T_EQ_INT(rl_ops_cuda_open(&o, 0), RL_ENOTSUP);
#endif
}

/* rl_cpu_expf (the vectorisable exp of the softmax loops): within 2 ulp of exp */
static void
test_expf(void)
{
	double worst = 0, wx = 0;
	for (double x = -103.8; x < 88.72; x += 0.000731) {
		float xf = (float)x, y = rl_cpu_expf(xf);
		double r = exp((double)xf);
		double ulp = r < 1.1754944e-38 ? 1.401298464e-45 : ldexp(1.0, ilogb(r) - 23);
		double e = fabs(y - r) / ulp;
		if (!(e <= worst)) {
			worst = e;
			wx = xf;
		}
	}
	T_OK(worst <= 2.0, "rl_cpu_expf: %.2f ulp at %g", worst, wx);
	T_OK(rl_cpu_expf(-INFINITY) == 0 && rl_cpu_expf(-200) == 0 && rl_cpu_expf(0) == 1, "expf edges");
	T_OK(isinf(rl_cpu_expf(89)) && isinf(rl_cpu_expf(INFINITY)) && isnan(rl_cpu_expf(NAN)), "expf edges");
}

/* ==== embedding ================================================================ */

static void
test_embed(void)
{
	int V = 5, P = 4, C = 3, N = 6;
	int32_t tok[6] = { 4, 0, 4, 2, 1, 4 }, pos[6] = { 0, 1, 2, 3, 0, 1 };
	float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)P * C, 1), out[18], out2[18];
	rl_cpu_embed_fwd(NULL, out, tok, pos, wte, wpe, N, C);
	rl_cpu_embed_fwd(NULL, out2, tok, NULL, wte, NULL, N, C);
	int ok = 1;
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			ok &= out[n * C + c] == wte[tok[n] * C + c] + wpe[pos[n] * C + c];
			ok &= out2[n * C + c] == wte[tok[n] * C + c];
		}
	T_OK(ok, "embed_fwd gathers rows exactly");
	/* bwd accumulates onto what is there; token 4 appears three times */
	float *dout = frand((size_t)N * C, 1), dwte[15], dwpe[12];
	double rte[15], rpe[12];
	for (int i = 0; i < 15; i++)
		dwte[i] = 1.0f, rte[i] = 1.0;
	for (int i = 0; i < 12; i++)
		dwpe[i] = 0.5f, rpe[i] = 0.5;
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			rte[tok[n] * C + c] += dout[n * C + c];
			rpe[pos[n] * C + c] += dout[n * C + c];
		}
	rl_cpu_embed_bwd(NULL, dwte, dwpe, dout, tok, pos, N, C);
	/* three fp32 additions: within 3 ulps of ~2 */
	CMP("embed_bwd dwte", dwte, rte, 15, 1e-6, 1e-6, 1e-12);
	CMP("embed_bwd dwpe", dwpe, rpe, 12, 1e-6, 1e-6, 1e-12);
	free(wte);
	free(wpe);
	free(dout);
}

/* ==== normalisation ============================================================ */

typedef struct norm_ctx {
	double *x, *w, *b, *R;
	int N, C, layer;
	double eps;
} norm_ctx;

static void
naive_norm(double *y, const norm_ctx *c)
{
	for (int n = 0; n < c->N; n++) {
		const double *x = c->x + (size_t)n * c->C;
		double mu = 0, ss = 0;
		if (c->layer) {
			for (int i = 0; i < c->C; i++)
				mu += x[i];
			mu /= c->C;
		}
		for (int i = 0; i < c->C; i++)
			ss += (x[i] - mu) * (x[i] - mu);
		double r = 1 / sqrt(ss / c->C + c->eps);
		for (int i = 0; i < c->C; i++)
			y[(size_t)n * c->C + i] = (x[i] - mu) * r * c->w[i] + (c->layer && c->b ? c->b[i] : 0);
	}
}

static double
L_norm(void *ctx)
{
	norm_ctx *c = ctx;
	size_t n = (size_t)c->N * c->C;
	double *y = malloc(n * sizeof(double));
	naive_norm(y, c);
	double s = ddot(y, c->R, n);
	free(y);
	return s;
}

static void
test_norms(void)
{
	static const int shapes[][2] = { { 1, 1 }, { 3, 7 }, { 5, 33 }, { 130, 17 } };
	for (int layer = 0; layer < 2; layer++)
		for (size_t si = 0; si < RL_ARRAY_LEN(shapes); si++) {
			int N = shapes[si][0], C = shapes[si][1];
			size_t n = (size_t)N * C;
			float eps = 1e-5f;
			float *x = frand(n, 2), *w = frand((size_t)C, 1.5), *b = frand((size_t)C, 1), *R = frand(n, 1);
			float *y = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float)), rstd[130], mean[130];
			float *dw = frand((size_t)C, 1), *db = frand((size_t)C, 1);
			norm_ctx c = { todbl(x, n), todbl(w, C), todbl(b, C), todbl(R, n), N, C, layer, eps };
			double *yr = malloc(n * sizeof(double));
			naive_norm(yr, &c);
			char what[64];
			if (layer)
				rl_cpu_layernorm_fwd(NULL, y, mean, rstd, x, w, b, N, C, eps);
			else
				rl_cpu_rmsnorm_fwd(NULL, y, rstd, x, w, N, C, eps);
			/* fp32 normalise + scale: a few ulps of |x|*rstd*|w| ~ 3 -> 1e-6 abs */
			snprintf(what, sizeof what, "%s fwd N=%d C=%d", layer ? "layernorm" : "rmsnorm", N, C);
			CMP(what, y, yr, n, 2e-6, 2e-6, 1e-12);
			double *dwr = todbl(dw, C), *dbr = todbl(db, C);
			if (layer)
				rl_cpu_layernorm_bwd(NULL, dx, dw, db, R, x, w, mean, rstd, N, C);
			else
				rl_cpu_rmsnorm_bwd(NULL, dx, dw, R, x, w, rstd, N, C);
			/* backward vs central differences of the double forward (h = 1e-6:
			 * truncation ~1e-12, rounding ~1e-10); the fp32 op is good to ~1e-6
			 * of the row's gradient scale */
			double *gx = fd_grad(L_norm, &c, c.x, n, 1e-6);
			double *gw = fd_grad(L_norm, &c, c.w, (size_t)C, 1e-6);
			for (int i = 0; i < C; i++)
				gw[i] += dwr[i];  /* accumulated onto the old value */
			snprintf(what, sizeof what, "%s bwd dx N=%d C=%d", layer ? "layernorm" : "rmsnorm", N, C);
			CMP(what, dx, gx, n, 1e-5, 1e-4, 1e-10);
			snprintf(what, sizeof what, "%s bwd dw N=%d C=%d", layer ? "layernorm" : "rmsnorm", N, C);
			CMP(what, dw, gw, (size_t)C, 1e-5, 1e-4, 1e-10);
			if (layer) {
				double *gb = fd_grad(L_norm, &c, c.b, (size_t)C, 1e-6);
				for (int i = 0; i < C; i++)
					gb[i] += dbr[i];
				CMP("layernorm bwd db", db, gb, (size_t)C, 1e-5, 1e-4, 1e-10);
				free(gb);
			}
			free(gx);
			free(gw);
			free(dwr);
			free(dbr);
			free(yr);
			free(c.x);
			free(c.w);
			free(c.b);
			free(c.R);
			free(x);
			free(w);
			free(b);
			free(R);
			free(y);
			free(dx);
			free(dw);
			free(db);
		}
	/* hand-computed: x = (3, 4), w = (1, 2), eps 0: rms = sqrt(12.5) */
	float x2[2] = { 3, 4 }, w2[2] = { 1, 2 }, y2[2], r2;
	rl_cpu_rmsnorm_fwd(NULL, y2, &r2, x2, w2, 1, 2, 0);
	T_CLOSE(y2[0], 0.848528137, 1e-6, 0);
	T_CLOSE(y2[1], 2.262741700, 1e-6, 0);
	T_CLOSE(r2, 0.282842712, 1e-7, 0);
}

/* qknorm: RMSNorm per head over the q and k heads, v copied */
typedef struct qk_ctx {
	double *x, *wq, *wk, *R;
	int N, NH, NKV, HD;
	double eps;
} qk_ctx;

static void
naive_qknorm(double *y, const qk_ctx *c)
{
	int W = (c->NH + 2 * c->NKV) * c->HD;
	for (int n = 0; n < c->N; n++)
		for (int h = 0; h < c->NH + 2 * c->NKV; h++) {
			const double *x = c->x + (size_t)n * W + (size_t)h * c->HD;
			double *o = y + (size_t)n * W + (size_t)h * c->HD;
			if (h >= c->NH + c->NKV) {
				memcpy(o, x, (size_t)c->HD * sizeof(double));
				continue;
			}
			const double *w = h < c->NH ? c->wq : c->wk;
			double ss = 0;
			for (int i = 0; i < c->HD; i++)
				ss += x[i] * x[i];
			double r = 1 / sqrt(ss / c->HD + c->eps);
			for (int i = 0; i < c->HD; i++)
				o[i] = x[i] * r * w[i];
		}
}

static double
L_qk(void *ctx)
{
	qk_ctx *c = ctx;
	size_t n = (size_t)c->N * (c->NH + 2 * c->NKV) * c->HD;
	double *y = malloc(n * sizeof(double));
	naive_qknorm(y, c);
	double s = ddot(y, c->R, n);
	free(y);
	return s;
}

static void
test_qknorm(void)
{
	int N = 3, NH = 4, NKV = 2, HD = 6, W = (NH + 2 * NKV) * HD;
	size_t n = (size_t)N * W;
	float eps = 1e-6f;
	float *x = frand(n, 2), *wq = frand(HD, 1.5), *wk = frand(HD, 1.5), *R = frand(n, 1);
	float *y = malloc(n * sizeof(float)), *yi = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float));
	float rstd[3 * 6], dwq[6] = { 0 }, dwk[6] = { 0 };
	qk_ctx c = { todbl(x, n), todbl(wq, HD), todbl(wk, HD), todbl(R, n), N, NH, NKV, HD, eps };
	double *yr = malloc(n * sizeof(double));
	naive_qknorm(yr, &c);
	rl_cpu_qknorm_fwd(NULL, y, rstd, x, wq, wk, N, NH, NKV, HD, eps);
	CMP("qknorm fwd", y, yr, n, 2e-6, 2e-6, 1e-12);
	memcpy(yi, x, n * sizeof(float));
	rl_cpu_qknorm_fwd(NULL, yi, rstd, yi, wq, wk, N, NH, NKV, HD, eps);
	T_OK(memcmp(y, yi, n * sizeof(float)) == 0, "qknorm in place gives the same bits");
	rl_cpu_qknorm_bwd(NULL, dx, dwq, dwk, R, x, wq, wk, rstd, N, NH, NKV, HD);
	double *gx = fd_grad(L_qk, &c, c.x, n, 1e-6), *gq = fd_grad(L_qk, &c, c.wq, HD, 1e-6);
	double *gk = fd_grad(L_qk, &c, c.wk, HD, 1e-6);
	/* same bound as rmsnorm: per-head rows of 6 */
	CMP("qknorm bwd dx", dx, gx, n, 1e-5, 1e-4, 1e-10);
	CMP("qknorm bwd dwq", dwq, gq, HD, 1e-5, 1e-4, 1e-10);
	CMP("qknorm bwd dwk", dwk, gk, HD, 1e-5, 1e-4, 1e-10);
	/* in place bwd (dqkv_in == dqkv_out) */
	float *dxi = malloc(n * sizeof(float)), dwq2[6] = { 0 }, dwk2[6] = { 0 };
	memcpy(dxi, R, n * sizeof(float));
	rl_cpu_qknorm_bwd(NULL, dxi, dwq2, dwk2, dxi, x, wq, wk, rstd, N, NH, NKV, HD);
	T_OK(memcmp(dx, dxi, n * sizeof(float)) == 0, "qknorm bwd in place gives the same bits");
	free(dxi);
	free(gx);
	free(gq);
	free(gk);
	free(yr);
	free(c.x);
	free(c.wq);
	free(c.wk);
	free(c.R);
	free(x);
	free(wq);
	free(wk);
	free(R);
	free(y);
	free(yi);
	free(dx);
}

/* ==== linear layers ============================================================= */

typedef struct mm_ctx {
	double *x, *w, *b, *R;
	int N, C, OC;
} mm_ctx;

static void
naive_mm(double *y, const mm_ctx *c)
{
	for (int n = 0; n < c->N; n++)
		for (int o = 0; o < c->OC; o++) {
			double s = c->b ? c->b[o] : 0;
			for (int i = 0; i < c->C; i++)
				s += c->x[(size_t)n * c->C + i] * c->w[(size_t)o * c->C + i];
			y[(size_t)n * c->OC + o] = s;
		}
}

static double
L_mm(void *ctx)
{
	mm_ctx *c = ctx;
	size_t n = (size_t)c->N * c->OC;
	double *y = malloc(n * sizeof(double));
	naive_mm(y, c);
	double s = ddot(y, c->R, n);
	free(y);
	return s;
}

/* Run by the main test once per GEMM code path (RL_CPU_GEMM, in a child process). */
static void
matmul_cases(void)
{
	/* (N, C, OC): T=1, odd everything, K past one 256 block, OC past one 256 column block */
	static const int shapes[][3] = { { 1, 1, 1 }, { 7, 13, 5 }, { 1, 33, 17 }, { 33, 65, 129 },
		{ 5, 300, 40 }, { 3, 520, 300 }, { 70, 96, 64 }, { 200, 8, 3 } };
	for (size_t si = 0; si < RL_ARRAY_LEN(shapes); si++) {
		int N = shapes[si][0], C = shapes[si][1], OC = shapes[si][2];
		for (int hasb = 0; hasb < 2; hasb++) {
			float *x = frand((size_t)N * C, 1), *w = frand((size_t)OC * C, 1), *b = frand(OC, 1);
			float *y = malloc((size_t)N * OC * sizeof(float)), *R = frand((size_t)N * OC, 1);
			float *dx = malloc((size_t)N * C * sizeof(float)), *dw = frand((size_t)OC * C, 1);
			float *db = frand(OC, 1);
			mm_ctx c = { todbl(x, (size_t)N * C), todbl(w, (size_t)OC * C), hasb ? todbl(b, OC) : NULL,
				todbl(R, (size_t)N * OC), N, C, OC };
			double *yr = malloc((size_t)N * OC * sizeof(double));
			naive_mm(yr, &c);
			rl_cpu_matmul_fwd(NULL, y, x, w, hasb ? b : NULL, N, C, OC);
			/* a C-term fp32 dot of |x|,|w| <= 1: rounding grows at most ~C ulps of
			 * sum |x w| <= C; 1e-6*C absolute is ~10x the worst case seen, a wrong
			 * index or a dropped block is O(1) */
			char what[96];
			snprintf(what, sizeof what, "matmul fwd N=%d C=%d OC=%d bias=%d", N, C, OC, hasb);
			CMP(what, y, yr, (size_t)N * OC, 1e-6 * C, 1e-6, 1e-11);
			/* bwd: matmul is linear, so the naive formulas are the exact derivative;
			 * the same rounding argument with K = OC (dinp) or N (dw) */
			double *gx = malloc((size_t)N * C * sizeof(double)), *gw = malloc((size_t)OC * C * sizeof(double));
			double *gb = malloc((size_t)OC * sizeof(double));
			for (int n = 0; n < N; n++)
				for (int i = 0; i < C; i++) {
					double s = 0;
					for (int o = 0; o < OC; o++)
						s += c.R[(size_t)n * OC + o] * c.w[(size_t)o * C + i];
					gx[(size_t)n * C + i] = s;
				}
			for (int o = 0; o < OC; o++) {
				double sb = db[o];
				for (int i = 0; i < C; i++) {
					double s = dw[(size_t)o * C + i];
					for (int n = 0; n < N; n++)
						s += c.R[(size_t)n * OC + o] * c.x[(size_t)n * C + i];
					gw[(size_t)o * C + i] = s;
				}
				for (int n = 0; n < N; n++)
					sb += c.R[(size_t)n * OC + o];
				gb[o] = sb;
			}
			rl_cpu_matmul_bwd(NULL, dx, dw, hasb ? db : NULL, R, x, w, N, C, OC);
			snprintf(what, sizeof what, "matmul bwd dinp N=%d C=%d OC=%d", N, C, OC);
			CMP(what, dx, gx, (size_t)N * C, 1e-6 * OC, 1e-6, 1e-11);
			snprintf(what, sizeof what, "matmul bwd dw N=%d C=%d OC=%d", N, C, OC);
			CMP(what, dw, gw, (size_t)OC * C, 1e-6 * (N + 1), 1e-6, 1e-11);
			if (hasb) {
				snprintf(what, sizeof what, "matmul bwd dbias N=%d C=%d OC=%d", N, C, OC);
				CMP(what, db, gb, (size_t)OC, 1e-6 * (N + 1), 1e-6, 1e-11);
			}
			/* and once by central differences, on the small shape */
			if (N == 7 && hasb) {
				double *fx = fd_grad(L_mm, &c, c.x, (size_t)N * C, 1e-6);
				CMP("matmul bwd dinp vs central differences", dx, fx, (size_t)N * C, 1e-5, 1e-5, 1e-10);
				free(fx);
			}
			/* dinp NULL, dbias NULL: only dw moves */
			float *dw2 = malloc((size_t)OC * C * sizeof(float));
			memcpy(dw2, dw, (size_t)OC * C * sizeof(float));
			rl_cpu_matmul_bwd(NULL, NULL, NULL, NULL, R, x, w, N, C, OC);
			T_OK(memcmp(dw2, dw, (size_t)OC * C * sizeof(float)) == 0, "matmul_bwd with NULL outputs writes nothing");
			free(dw2);
			free(gx);
			free(gw);
			free(gb);
			free(yr);
			free(c.x);
			free(c.w);
			free(c.b);
			free(c.R);
			free(x);
			free(w);
			free(b);
			free(y);
			free(R);
			free(dx);
			free(dw);
			free(db);
		}
	}
}

/* Each GEMM code path in its own process (the path is chosen once per process). */
static void
test_matmul(const char *self)
{
	/* avx512t: the template's AVX-512 instance, kept for bench/ops_cpu's comparison */
	static const char *paths[] = { "avx512", "avx2", "base", "avx512t" };
	__builtin_cpu_init();
	for (size_t i = 0; i < RL_ARRAY_LEN(paths); i++) {
		if (((i == 0 || i == 3) && !__builtin_cpu_supports("avx512f")) ||
		    (i == 1 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))) {
			printf("test_ops_cpu: no %s on this cpu, its gemm path not tested\n", paths[i]);
			continue;
		}
		fflush(NULL);
		pid_t pid = fork();
		if (pid == 0) {
			setenv("RL_CPU_GEMM", paths[i], 1);
			setenv("RL_TEST_MATMUL_ONLY", "1", 1);
			execl(self, self, (char *)NULL);
			_exit(127);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "matmul with the %s gemm path", paths[i]);
	}
}

/* ==== RoPE ==================================================================== */

static void
test_rope(void)
{
	int N = 4, NH = 3, NKV = 1, HD = 8, W = (NH + 2 * NKV) * HD;
	size_t n = (size_t)N * W;
	float theta = 10000.0f;
	rl_rope rp = { .theta = theta };
	int32_t pos[4] = { 0, 1, 7, 3000 };
	float *x = frand(n, 1), *y = malloc(n * sizeof(float));
	memcpy(y, x, n * sizeof(float));
	rl_cpu_rope_fwd(NULL, y, pos, N, NH, NKV, HD, rp);
	/* Hugging Face, written out: inv_freq = 1 / theta^(arange(0, HD, 2)/HD) in fp32,
	 * freqs = pos * inv_freq in fp32, emb = cat(freqs, freqs),
	 * q_embed = q * cos(emb) + rotate_half(q) * sin(emb), rotate_half(q) = cat(-q2, q1) */
	double *ref = malloc(n * sizeof(double));
	for (int t = 0; t < N; t++)
		for (int h = 0; h < NH + 2 * NKV; h++) {
			const float *q = x + (size_t)t * W + (size_t)h * HD;
			double *o = ref + (size_t)t * W + (size_t)h * HD;
			for (int j = 0; j < HD; j++) {
				if (h >= NH + NKV) {
					o[j] = q[j];  /* v heads untouched */
					continue;
				}
				int i = j % (HD / 2);
				float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HD);
				float f = (float)pos[t] * inv_freq;
				double rh = j < HD / 2 ? -(double)q[j + HD / 2] : (double)q[j - HD / 2];
				o[j] = q[j] * cos((double)f) + rh * sin((double)f);
			}
		}
	/* two fp32 products and a sum of |.| <= 1 values */
	CMP("rope fwd vs the HF formula", y, ref, n, 1e-6, 1e-6, 1e-12);
	/* bwd is the transpose: <rope(x), g> = <x, rope_bwd(g)>, and it undoes fwd */
	float *g = frand(n, 1), *gb = malloc(n * sizeof(float));
	memcpy(gb, g, n * sizeof(float));
	rl_cpu_rope_bwd(NULL, gb, pos, N, NH, NKV, HD, rp);
	double l = 0, r = 0;
	for (size_t i = 0; i < n; i++) {
		l += (double)y[i] * g[i];
		r += (double)x[i] * gb[i];
	}
	T_CLOSE(l, r, 1e-5, 1e-5);
	rl_cpu_rope_bwd(NULL, y, pos, N, NH, NKV, HD, rp);
	double *xd = todbl(x, n);
	CMP("rope bwd undoes fwd", y, xd, n, 2e-6, 2e-6, 1e-12);
	rl_ops *o;
	rl_ops_cpu_open(&o);
	o->rope_fwd(o, y, pos, N, NH, NKV, 7, rp);
	T_EQ_INT(o->status(o), RL_EINVAL);  /* odd head dim */
	rl_ops_close(o);
	free(xd);
	free(x);
	free(y);
	free(ref);
	free(g);
	free(gb);
}

/* inv_freq under Llama 3's scaling, as fp32 bits: Llama 3.1 8B's (theta 500000, HD 128,
 * factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192) and Llama 3.2 1B's
 * RoPE at HD 64 (factor 32): computed by tests/fixtures/make_fixtures.py's rope_inv (the
 * fp32 tensor ops of transformers' _compute_llama3_parameters) with torch 1.13. */
static const uint32_t l31_inv[64] = {
	0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3, 0x3e73c461,
	0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c, 0x3daee4ad, 0x3d8e7898, 0x3d681e67, 0x3d3d1684,
	0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939, 0x3c87a9c3, 0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f,
	0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35, 0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e,
	0x3a0995d2, 0x39a3f108, 0x393b2dd2, 0x38c86886, 0x38a3418d, 0x3884fdbf, 0x3858ac81, 0x38308199,
	0x380fc8f8, 0x37ea426f, 0x37bed4f4, 0x379b7475, 0x377d45c3, 0x374e51f5, 0x3728126b, 0x3708ea0f,
	0x36df10c4, 0x36b5b687, 0x369406cb, 0x36712b80, 0x36447610, 0x36200a69, 0x36025f34, 0x35d46808,
	0x35ad07a7, 0x358cf400, 0x3565a54d, 0x353b12c7, 0x351864a7, 0x34f848c2, 0x34ca41b0, 0x34a4c2ff,
};
static const uint32_t l32_inv64[32] = {
	0x3f800000, 0x3f29e1c6, 0x3ee177bc, 0x3e959ee3, 0x3e4693b0, 0x3e03c6a0, 0x3daee4ad, 0x3d681e67,
	0x3d1a08c8, 0x3ccc6f49, 0x3c87a9c3, 0x3c340d6d, 0x3beef74f, 0x3b9e9402, 0x3b527720, 0x3aa9279b,
	0x39e13620, 0x38cb98f7, 0x37a3418d, 0x3758ac81, 0x370fc8f8, 0x36bed4f4, 0x367d45c3, 0x3628126b,
	0x35df10c4, 0x359406cb, 0x35447610, 0x35025f34, 0x34ad07a7, 0x3465a54d, 0x341864a7, 0x33ca41b0,
};

static void
test_rope_llama3(void)
{
	const rl_rope l31 = { 500000.0f, 8.0f, 1.0f, 4.0f, 8192.0f }, l32 = { 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f };
	int diff = 0, reg[3] = { 0, 0, 0 };
	for (int i = 0; i < 64; i++) {
		float v = rl_cpu_rope_inv(l31, i, 128), p = rl_cpu_rope_inv((rl_rope){ .theta = 500000.0f }, i, 128);
		uint32_t u;
		memcpy(&u, &v, 4);
		diff += u != l31_inv[i];
		reg[v == p ? 0 : v * 8.0f == p ? 1 : 2]++;
		if (i < 32) {
			v = rl_cpu_rope_inv(l32, i, 64);
			memcpy(&u, &v, 4);
			diff += u != l32_inv64[i];
		}
	}
	T_OK(diff == 0, "rope_inv: %d of 96 llama3 frequencies differ from transformers' fp32 bits", diff);
	/* each region of the rule holds some of Llama 3.1's frequencies */
	T_OK(reg[0] > 0 && reg[1] > 0 && reg[2] > 0, "rope_inv regions kept/divided/blended %d/%d/%d", reg[0],
	    reg[1], reg[2]);
	/* factor 0: the plain frequencies theta^(-2i/HD), bit for bit */
	diff = 0;
	for (int i = 0; i < 64; i++) {
		float v = rl_cpu_rope_inv((rl_rope){ .theta = 10000.0f }, i, 128);
		float w = 1.0f / powf(10000.0f, (float)(2 * i) / 128.0f);
		diff += memcmp(&v, &w, 4) != 0;
	}
	T_OK(diff == 0, "rope_inv without scaling: %d frequencies changed", diff);

	/* rope_fwd rotates by those frequencies: HF's formula with the pinned table, positions
	 * past the original context; rope_bwd is its transpose */
	int N = 3, NH = 2, NKV = 1, HD = 128, W = (NH + 2 * NKV) * HD;
	size_t n = (size_t)N * W;
	int32_t pos[3] = { 5, 9000, 131071 };
	float *x = frand(n, 1), *y = malloc(n * sizeof(float)), *g = frand(n, 1), *gb = malloc(n * sizeof(float));
	double *ref = malloc(n * sizeof(double)), l = 0, r = 0;
	memcpy(y, x, n * sizeof(float));
	rl_cpu_rope_fwd(NULL, y, pos, N, NH, NKV, HD, l31);
	for (int t = 0; t < N; t++)
		for (int h = 0; h < NH + 2 * NKV; h++)
			for (int j = 0; j < HD; j++) {
				const float *q = x + (size_t)t * W + (size_t)h * HD;
				double *o = ref + (size_t)t * W + (size_t)h * HD;
				float inv;
				memcpy(&inv, &l31_inv[j % (HD / 2)], 4);
				float f = (float)pos[t] * inv;
				double rh = j < HD / 2 ? -(double)q[j + HD / 2] : (double)q[j - HD / 2];
				o[j] = h >= NH + NKV ? q[j] : q[j] * cos((double)f) + rh * sin((double)f);
			}
	CMP("rope fwd llama3 vs the HF formula", y, ref, n, 1e-6, 1e-6, 1e-12);
	memcpy(gb, g, n * sizeof(float));
	rl_cpu_rope_bwd(NULL, gb, pos, N, NH, NKV, HD, l31);
	for (size_t i = 0; i < n; i++) {
		l += (double)y[i] * g[i];
		r += (double)x[i] * gb[i];
	}
	T_CLOSE(l, r, 1e-5, 1e-5);
	free(x);
	free(y);
	free(g);
	free(gb);
	free(ref);
}

/* ==== attention ================================================================= */

typedef struct at_ctx {
	double *qkv, *R;
	const int32_t *seg;
	int B, T, NH, NKV, HD;
	double scale;   /* 0: 1/sqrt(HD) */
	int win;        /* > 0: query t sees keys s > t - win only */
} at_ctx;

/* softmax(scale q k^T) v over the visible keys (same sequence, s <= t, within the
 * window), written out per query */
static void
naive_attn(double *out, double *lse, const at_ctx *c)
{
	int W = (c->NH + 2 * c->NKV) * c->HD, G = c->NH / c->NKV;
	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < c->NH; h++)
			for (int t = 0; t < c->T; t++) {
				double *y = out + ((size_t)b * c->T + t) * c->NH * c->HD + (size_t)h * c->HD;
				const int32_t *sg = c->seg ? c->seg + (size_t)b * c->T : NULL;
				memset(y, 0, (size_t)c->HD * sizeof(double));
				if (lse)
					lse[((size_t)b * c->NH + h) * c->T + t] = 0;
				if (sg && sg[t] < 0)
					continue;
				const double *q = c->qkv + ((size_t)b * c->T + t) * W + (size_t)h * c->HD;
				double sc[320], mx = -INFINITY, sum = 0;
				for (int s = 0; s <= t; s++) {
					sc[s] = -INFINITY;
					if ((sg && sg[s] != sg[t]) || (c->win > 0 && s <= t - c->win))
						continue;
					const double *k = c->qkv + ((size_t)b * c->T + s) * W + (size_t)(c->NH + h / G) * c->HD;
					sc[s] = c->scale > 0 ? ddot(q, k, c->HD) * c->scale : ddot(q, k, c->HD) / sqrt((double)c->HD);
					mx = fmax(mx, sc[s]);
				}
				for (int s = 0; s <= t; s++)
					if (sc[s] > -INFINITY)
						sum += exp(sc[s] - mx);
				for (int s = 0; s <= t; s++) {
					if (sc[s] == -INFINITY)
						continue;
					const double *v = c->qkv + ((size_t)b * c->T + s) * W +
					    (size_t)(c->NH + c->NKV + h / G) * c->HD;
					for (int i = 0; i < c->HD; i++)
						y[i] += exp(sc[s] - mx) / sum * v[i];
				}
				if (lse)
					lse[((size_t)b * c->NH + h) * c->T + t] = mx + log(sum);
			}
}

static double
L_attn(void *ctx)
{
	at_ctx *c = ctx;
	size_t n = (size_t)c->B * c->T * c->NH * c->HD;
	double *y = malloc(n * sizeof(double));
	naive_attn(y, NULL, c);
	double s = ddot(y, c->R, n);
	free(y);
	return s;
}

/* attn_case with a scale (0: the table's 1/sqrt(HD)) and a window (0: none): through
 * rl_cpu_attn_{fwd,bwd}_ex when either is set */
static void
attn_case_ex(int B, int T, int NH, int NKV, int HD, const int32_t *seg, float scale, int win)
{
	int W = (NH + 2 * NKV) * HD;
	size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
	float *qkv = frand(nq, 1.5), *R = frand(no, 1), *out = malloc(no * sizeof(float));
	float *lse = malloc(nl * sizeof(float)), *dqkv = malloc(nq * sizeof(float));
	at_ctx c = { todbl(qkv, nq), todbl(R, no), seg, B, T, NH, NKV, HD, scale, win };
	double *yr = malloc(no * sizeof(double)), *lr = malloc(nl * sizeof(double));
	int ex = scale > 0 || win > 0;
	naive_attn(yr, lr, &c);
	if (ex)
		rl_cpu_attn_fwd_ex(NULL, out, lse, qkv, seg, B, T, NH, NKV, HD, scale > 0 ? scale : 1.0f / sqrtf((float)HD),
		    win);
	else
		rl_cpu_attn_fwd(NULL, out, lse, qkv, seg, B, T, NH, NKV, HD);
	char what[128];
	/* softmax-weighted averages of |v| <= 1.5: fp32 exp and sums, ~1e-6 */
	snprintf(what, sizeof what, "attn fwd B=%d T=%d NH=%d NKV=%d HD=%d seg=%d scale=%g win=%d", B, T, NH, NKV,
	    HD, seg != NULL, scale, win);
	CMP(what, out, yr, no, 2e-6, 2e-6, 1e-11);
	snprintf(what, sizeof what, "attn fwd lse T=%d", T);
	CMP(what, lse, lr, nl, 2e-6, 2e-6, 1e-12);
	for (size_t i = 0; i < nq; i++)
		dqkv[i] = NAN;  /* every element must be overwritten */
	if (ex)
		rl_cpu_attn_bwd_ex(NULL, dqkv, R, out, lse, qkv, seg, B, T, NH, NKV, HD,
		    scale > 0 ? scale : 1.0f / sqrtf((float)HD), win);
	else
		rl_cpu_attn_bwd(NULL, dqkv, R, out, lse, qkv, seg, B, T, NH, NKV, HD);
	/* vs central differences of the double forward; fp32 scores, exps and
	 * products of |.| <= 1.5 over <= T keys.  Long rows: a strided subset of
	 * the elements (every one would take too long), q, k and v all hit. */
	size_t stride = nq > 2000 ? 37 : 1, nsub = (nq + stride - 1) / stride;
	double *g = malloc(nsub * sizeof(double));
	float *sub = malloc(nsub * sizeof(float));
	for (size_t j = 0; j < nsub; j++) {
		size_t i = j * stride;
		double x0 = c.qkv[i];
		c.qkv[i] = x0 + 1e-6;
		double lp = L_attn(&c);
		c.qkv[i] = x0 - 1e-6;
		double lm = L_attn(&c);
		c.qkv[i] = x0;
		g[j] = (lp - lm) / 2e-6;
		sub[j] = dqkv[i];
	}
	snprintf(what, sizeof what, "attn bwd B=%d T=%d NH=%d NKV=%d HD=%d seg=%d scale=%g win=%d", B, T, NH, NKV,
	    HD, seg != NULL, scale, win);
	CMP(what, sub, g, nsub, 1e-5, 1e-4, 1e-10);
	int allset = 1;
	for (size_t i = 0; i < nq; i++)
		allset &= !isnan(dqkv[i]);
	T_OK(allset, "attn bwd writes every element of dqkv");
	free(sub);
	free(g);
	free(yr);
	free(lr);
	free(c.qkv);
	free(c.R);
	free(qkv);
	free(R);
	free(out);
	free(lse);
	free(dqkv);
}

static void
attn_case(int B, int T, int NH, int NKV, int HD, const int32_t *seg)
{
	attn_case_ex(B, T, NH, NKV, HD, seg, 0, 0);
}

static void
test_attn(void)
{
	attn_case(1, 1, 1, 1, 4, NULL);     /* T = 1 */
	attn_case(2, 5, 4, 2, 6, NULL);     /* GQA 2:1 */
	attn_case(1, 7, 3, 1, 5, NULL);     /* odd HD, MQA */
	attn_case(2, 6, 2, 2, 4, NULL);     /* MHA */
	/* packing and padding: row 0 holds two sequences then padding; row 1 starts
	 * with padding, then one sequence, then a third id reused non-contiguously */
	static const int32_t seg[2 * 7] = { 0, 0, 0, 1, 1, -1, -1, -1, 5, 5, 5, 6, 5, 6 };
	attn_case(2, 7, 4, 2, 6, seg);
	/* several 64-query blocks, and more than 256 keys (the GEMM's K slices) */
	static int32_t seg2[2 * 150];
	for (int t = 0; t < 150; t++) {
		seg2[t] = t < 61 ? 1 : t < 140 ? 2 : -1;       /* a boundary inside a block, padded tail */
		seg2[150 + t] = t < 3 ? -1 : (t / 50) % 2;      /* padded head, ids alternating per 50 */
	}
	attn_case(2, 150, 2, 1, 4, seg2);
	attn_case(1, 300, 2, 2, 3, NULL);
	/* sliding windows and another scale (Mistral, Gemma 3): a window of one key, windows
	 * inside a 64-query block and across blocks, packed and padded rows, a window longer
	 * than the rows (no key left out).  Their draws do not move the later tests' inputs. */
	rl_rng keep = R;
	attn_case_ex(2, 7, 4, 2, 6, seg, 0, 1);
	attn_case_ex(2, 7, 4, 2, 6, seg, 0.3f, 3);
	attn_case_ex(2, 150, 2, 1, 4, seg2, 0, 5);
	attn_case_ex(2, 150, 2, 1, 4, seg2, 0.2f, 70);
	attn_case_ex(1, 300, 2, 2, 3, NULL, 0, 90);
	attn_case_ex(1, 150, 2, 1, 4, NULL, 0.4f, 400);
	R = keep;
	/* a padded query's output is exactly 0, and its gradient too */
	int W = (4 + 4) * 6;
	float *qkv = frand((size_t)2 * 7 * W, 1), out[2 * 7 * 24], lse[2 * 4 * 7];
	rl_cpu_attn_fwd(NULL, out, lse, qkv, seg, 2, 7, 4, 2, 6);
	int zero = 1;
	for (int i = 0; i < 24; i++)
		zero &= out[5 * 24 + i] == 0 && out[(7 + 0) * 24 + i] == 0;
	T_OK(zero && lse[5] == 0, "padding queries give 0");
	free(qkv);
	rl_ops *o;
	rl_ops_cpu_open(&o);
	o->attn_fwd(o, out, lse, out, NULL, 1, 1, 3, 2, 4);
	T_EQ_INT(o->status(o), RL_EINVAL);  /* NH not a multiple of NKV */
	rl_ops_close(o);
}

/* ==== activations, residual ===================================================== */

typedef struct act_ctx {
	double *x, *R;
	int N, H, kind;  /* 0 swiglu (x is (N, 2H)), 1 gelu (x is (N*H)), 2 geglu (as swiglu) */
} act_ctx;

static void
naive_act(double *y, const act_ctx *c)
{
	for (int n = 0; n < c->N; n++)
		for (int i = 0; i < c->H; i++) {
			if (c->kind == 0) {
				double g = c->x[(size_t)n * 2 * c->H + i], u = c->x[(size_t)n * 2 * c->H + c->H + i];
				y[(size_t)n * c->H + i] = g / (1 + exp(-g)) * u;
			} else if (c->kind == 2) {
				/* transformers' gelu_pytorch_tanh of the gate times the up projection */
				double g = c->x[(size_t)n * 2 * c->H + i], u = c->x[(size_t)n * 2 * c->H + c->H + i];
				y[(size_t)n * c->H + i] = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * u;
			} else {
				double v = c->x[(size_t)n * c->H + i];
				y[(size_t)n * c->H + i] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
			}
		}
}

static double
L_act(void *ctx)
{
	act_ctx *c = ctx;
	size_t n = (size_t)c->N * c->H;
	double *y = malloc(n * sizeof(double));
	naive_act(y, c);
	double s = ddot(y, c->R, n);
	free(y);
	return s;
}

static void
test_act(void)
{
	int N = 3, H = 11;
	size_t n = (size_t)N * H;
	rl_rng keep = R;
	for (int kind = 0; kind < 3; kind++) {
		size_t nx = kind != 1 ? 2 * n : n;
		if (kind == 2)
			keep = R;  /* the GeGLU case's draws do not move the later tests' inputs */
		float *x = frand(nx, 4), *R = frand(n, 1), *y = malloc(n * sizeof(float)), *dx = malloc(nx * sizeof(float));
		act_ctx c = { todbl(x, nx), todbl(R, n), N, H, kind };
		double *yr = malloc(n * sizeof(double));
		naive_act(yr, &c);
		if (kind == 0) {
			rl_cpu_swiglu_fwd(NULL, y, x, N, H);
			rl_cpu_swiglu_bwd(NULL, dx, R, x, N, H);
		} else if (kind == 2) {
			rl_cpu_geglu_fwd(NULL, y, x, N, H);
			rl_cpu_geglu_bwd(NULL, dx, R, x, N, H);
		} else {
			rl_cpu_gelu_fwd(NULL, y, x, n);
			rl_cpu_gelu_bwd(NULL, dx, R, x, n);
		}
		double *g = fd_grad(L_act, &c, c.x, nx, 1e-6);
		/* elementwise fp32 with expf/tanhf (~2 ulps) on |x| <= 4 */
		static const char *const nm[3][2] = { { "swiglu fwd", "swiglu bwd" }, { "gelu fwd", "gelu bwd" },
			{ "geglu fwd", "geglu bwd" } };
		CMP(nm[kind][0], y, yr, n, 2e-6, 2e-6, 1e-12);
		CMP(nm[kind][1], dx, g, nx, 1e-5, 1e-5, 1e-10);
		free(g);
		free(yr);
		free(c.x);
		free(c.R);
		free(x);
		free(R);
		free(y);
		free(dx);
	}
	R = keep;
	/* hand-computed: silu(1) * 2 = 2 / (1 + e^-1); gelu(1) = 0.5 (1 + tanh(0.79788456 * 1.044715)) */
	float gu[2] = { 1, 2 }, y1, x1 = 1, g1;
	rl_cpu_swiglu_fwd(NULL, &y1, gu, 1, 1);
	T_CLOSE(y1, 1.4621171573, 1e-6, 0);
	rl_cpu_gelu_fwd(NULL, &g1, &x1, 1);
	T_CLOSE(g1, 0.8411919906, 1e-6, 0);
	/* add, aliased */
	float a[5] = { 1, 2, 3, 4, 5 }, b[5] = { 0.5f, 0.5f, 0.5f, 0.5f, -5 };
	rl_cpu_add(NULL, a, a, b, 5);
	T_OK(a[0] == 1.5f && a[3] == 4.5f && a[4] == 0, "add in place");
}

/* ==== output layer ================================================================ */

typedef struct lp_ctx {
	double *z, *dlp, *dent;
	const int32_t *tgt;
	int N, V;
	double it;
} lp_ctx;

static void
naive_lp(double *lp, double *ent, double *lse, const lp_ctx *c)
{
	for (int n = 0; n < c->N; n++) {
		const double *x = c->z + (size_t)n * c->V;
		lp[n] = ent[n] = lse[n] = 0;
		if (c->tgt[n] < 0)
			continue;
		double m = -INFINITY, s = 0, h = 0;
		for (int j = 0; j < c->V; j++)
			m = fmax(m, x[j] * c->it);
		for (int j = 0; j < c->V; j++)
			s += exp(x[j] * c->it - m);
		double L = m + log(s);
		for (int j = 0; j < c->V; j++) {
			double lpj = x[j] * c->it - L;
			h -= exp(lpj) * lpj;
		}
		lse[n] = L;
		lp[n] = x[c->tgt[n]] * c->it - L;
		ent[n] = h;
	}
}

static double
L_lp(void *ctx)
{
	lp_ctx *c = ctx;
	double lp[8], ent[8], lse[8];
	naive_lp(lp, ent, lse, c);
	return ddot(lp, c->dlp, c->N) + (c->dent ? ddot(ent, c->dent, c->N) : 0);
}

static void
test_logprob(void)
{
	static const int Vs[] = { 1, 2, 37, 1001 };
	for (size_t vi = 0; vi < RL_ARRAY_LEN(Vs); vi++) {
		int N = 4, V = Vs[vi];
		int32_t tgt[4] = { 0, V - 1, -1, V / 2 };
		for (int ti = 0; ti < 2; ti++) {
			float it = ti ? 1.0f / 0.7f : 1.0f;
			float *z = frand((size_t)N * V, 6), lp[4], ent[4], lse[4], dlp[4], dent[4];
			for (int n = 0; n < N; n++)
				dlp[n] = (float)urand(), dent[n] = (float)urand();
			lp_ctx c = { todbl(z, (size_t)N * V), todbl(dlp, N), todbl(dent, N), tgt, N, V, it };
			double rl[4], re[4], rs[4];
			naive_lp(rl, re, rs, &c);
			rl_cpu_logprob_fwd(NULL, lp, ent, lse, z, tgt, N, V, it);
			char what[64];
			/* logsumexp of V fp32 terms accumulated in double: lse, lp to a few
			 * ulps of |z| <= 9; entropy in nats <= log V */
			snprintf(what, sizeof what, "logprob lp V=%d it=%g", V, it);
			CMP(what, lp, rl, N, 4e-6, 1e-6, 1e-11);
			snprintf(what, sizeof what, "logprob ent V=%d", V);
			CMP(what, ent, re, N, 4e-6, 1e-6, 1e-11);
			snprintf(what, sizeof what, "logprob lse V=%d", V);
			CMP(what, lse, rs, N, 4e-6, 1e-6, 1e-11);
			/* bwd, written over the logits (aliasing allowed) */
			float *d = malloc((size_t)N * V * sizeof(float));
			memcpy(d, z, (size_t)N * V * sizeof(float));
			rl_cpu_logprob_bwd(NULL, d, d, tgt, lse, dlp, dent, N, V, it);
			/* every element for small V; every 13th for V = 1001 (~77 per row), where
			 * all would cost seconds; V = 37 checks the target columns in full */
			size_t nz = (size_t)N * V, stride = nz > 1000 ? 13 : 1;
			double *g = malloc(nz * sizeof(double));
			float *gs = malloc(nz * sizeof(float));
			size_t ns = fd_grad_sub(L_lp, &c, c.z, nz, 1e-6, stride, d, g, gs);
			/* probabilities in fp32 times |dlp|, |dent| <= 1 and |log p| <= ~20 */
			snprintf(what, sizeof what, "logprob bwd V=%d it=%g", V, it);
			CMP(what, gs, g, ns, 2e-6, 1e-4, 1e-10);
			/* without the entropy term */
			double *dent_d = c.dent;
			c.dent = NULL;
			rl_cpu_logprob_bwd(NULL, d, z, tgt, lse, dlp, NULL, N, V, it);
			ns = fd_grad_sub(L_lp, &c, c.z, nz, 1e-6, stride, d, g, gs);
			CMP("logprob bwd without dent", gs, g, ns, 2e-6, 1e-4, 1e-10);
			free(gs);
			float ent2[4];
			rl_cpu_logprob_fwd(NULL, lp, NULL, lse, z, tgt, N, V, it);
			rl_cpu_logprob_fwd(NULL, lp, ent2, lse, z, tgt, N, V, it);
			T_OK(lp[2] == 0 && ent2[2] == 0 && lse[2] == 0, "ignored target gives zeros");
			free(g);
			free(d);
			free(c.z);
			free(c.dlp);
			free(dent_d);
			free(z);
		}
	}
	/* hand-computed: logits (0, ln 3), target 1: p = (1/4, 3/4) */
	float z2[2] = { 0, (float)log(3.0) }, lp, ent, lse;
	int32_t t1 = 1;
	rl_cpu_logprob_fwd(NULL, &lp, &ent, &lse, z2, &t1, 1, 2, 1.0f);
	T_CLOSE(lp, log(0.75), 1e-7, 0);
	T_CLOSE(ent, -(0.25 * log(0.25) + 0.75 * log(0.75)), 1e-7, 0);
	T_CLOSE(lse, log(4.0), 1e-7, 0);
	/* no overflow at large logits */
	float big[3] = { 1000, 999, -1000 };
	int32_t t0 = 0;
	rl_cpu_logprob_fwd(NULL, &lp, &ent, &lse, big, &t0, 1, 3, 1.0f);
	T_CLOSE(lp, -log1p(exp(-1.0)), 1e-6, 0);
}

/* ==== losses ====================================================================== */

static void
check_pg(const char *what, const rl_pg_params *p, int N, const float *lp, const float *old,
    const float *beh, const float *ref, const float *ent, const float *adv, const float *w,
    const double *loss, const double *dlp, const double *clipped, const double *kl)
{
	float d[8], de[8], st[8 * RL_PG_NSTAT], sl[8], sc[8], sk[8], sr[8];
	double rr[8];
	rl_cpu_pg_loss(NULL, d, de, st, lp, old, beh, ref, ent, adv, w, N, p);
	for (int n = 0; n < N; n++) {
		sl[n] = st[n * RL_PG_NSTAT + RL_PG_LOSS];
		sc[n] = st[n * RL_PG_NSTAT + RL_PG_CLIPPED];
		sk[n] = st[n * RL_PG_NSTAT + RL_PG_KL];
		sr[n] = st[n * RL_PG_NSTAT + RL_PG_RATIO];
		rr[n] = w[n] != 0 ? exp((double)lp[n] - old[n]) : 0;
	}
	char buf[96];
	/* a handful of fp32 operations on O(1) values: 1e-6 */
	snprintf(buf, sizeof buf, "%s: loss", what);
	CMP(buf, sl, loss, N, 1e-6, 1e-6, 1e-12);
	snprintf(buf, sizeof buf, "%s: dlp", what);
	CMP(buf, d, dlp, N, 1e-6, 1e-6, 1e-12);
	snprintf(buf, sizeof buf, "%s: clipped", what);
	CMP(buf, sc, clipped, N, 0, 0, 0);
	snprintf(buf, sizeof buf, "%s: kl", what);
	CMP(buf, sk, kl, N, 1e-7, 1e-6, 1e-12);
	snprintf(buf, sizeof buf, "%s: ratio", what);
	CMP(buf, sr, rr, N, 1e-6, 1e-6, 1e-12);
}

static void
test_pg_loss(void)
{
	const double z[8] = { 0 };
	/* PPO clip (0.2, 0.28) with dual clip 3; lp - old per token below */
	{
		rl_pg_params p = { 0.2f, 0.28f, 3.0f, 0, 0, 1, 0 };
		float old[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
		float lp[8] = { 0.5f, -0.5f, -0.5f, 0.5f, 1.5f, (float)log(1.1), NAN, 1.0f };
		float adv[8] = { 1, 1, -1, -1, -1, 2, 1, -1 }, w[8] = { 1, 1, 1, 1, 1, 0.5f, 0, 1 };
		/* 1: r = e^.5 = 1.6487 > 1.28, A > 0: clipped at -1.28, no gradient
		 * 2: r = e^-.5 = 0.6065 < 0.8, A > 0: max(-0.6065, -0.8) = unclipped
		 * 3: r = 0.6065, A < 0: max(0.6065, 0.8) = 0.8 clipped
		 * 4: r = 1.6487, A < 0: max(1.6487, 1.28) unclipped; below dual 3
		 * 5: r = e^1.5 = 4.4817, A < 0: dual clip caps at 3, no gradient
		 * 6: r = 1.1 in range, A = 2, w = .5: loss -2.2, dlp = .5 * -2.2
		 * 7: w = 0 with a NaN log-prob: all zero
		 * 8: r = e = 2.718, A < 0: just below the dual clip 3, unclipped */
		const double loss[8] = { -1.28, -0.6065306597, 0.8, 1.6487212707, 3.0, -2.2, 0, 2.7182818285 };
		const double dlp[8] = { 0, -0.6065306597, 0, 1.6487212707, 0, -1.1, 0, 2.7182818285 };
		const double cl[8] = { 1, 0, 1, 0, 1, 0, 0, 0 };
		check_pg("pg clip + dual clip", &p, 8, lp, old, NULL, NULL, NULL, adv, w, loss, dlp, cl, z);
		p.dual_clip = 0;
		const double loss2[8] = { -1.28, -0.6065306597, 0.8, 1.6487212707, 4.4816890703, -2.2, 0, 2.7182818285 };
		const double dlp2[8] = { 0, -0.6065306597, 0, 1.6487212707, 4.4816890703, -1.1, 0, 2.7182818285 };
		const double cl2[8] = { 1, 0, 1, 0, 0, 0, 0, 0 };
		check_pg("pg clip, no dual clip", &p, 8, lp, old, NULL, NULL, NULL, adv, w, loss2, dlp2, cl2, z);
	}
	/* truncated importance sampling: tis = min(exp(old - beh), 2) scales the pg term */
	{
		rl_pg_params p = { 0.2f, 0.28f, 0, 2.0f, 0, 1, 0 };
		float lp[2] = { 0.1f, 0.1f }, old[2] = { 0, 0 }, beh[2] = { -1, 1 }, adv[2] = { 1, 1 }, w[2] = { 1, 1 };
		const double loss[2] = { -2.2103418362, -0.4065696597 }, cl[2] = { 0, 0 };
		check_pg("pg tis", &p, 2, lp, old, beh, NULL, NULL, adv, w, loss, loss, cl, z);
		p.tis_cap = 0;  /* off: beh ignored */
		const double l2[2] = { -1.1051709181, -1.1051709181 };
		check_pg("pg tis off", &p, 2, lp, old, beh, NULL, NULL, adv, w, l2, l2, cl, z);
	}
	/* the three KL estimators at lp - ref = 0.3, coefficient 0.1, A = 0 */
	{
		float lp[1] = { 0.3f }, old[1] = { 0.3f }, ref[1] = { 0 }, adv[1] = { 0 }, w[1] = { 1 };
		const double cl[1] = { 0 };
		const double kls[3] = { 0.3, 0.045, 0.0408182207 }, dk[3] = { 1, 0.3, 0.2591817793 };
		for (int k = 1; k <= 3; k++) {
			rl_pg_params p = { 0.2f, 0.2f, 0, 0, 0.1f, k, 0 };
			double loss[1] = { 0.1 * kls[k - 1] }, dlp[1] = { 0.1 * dk[k - 1] }, kl[1] = { kls[k - 1] };
			char what[32];
			snprintf(what, sizeof what, "pg kl k%d", k);
			check_pg(what, &p, 1, lp, old, NULL, ref, NULL, adv, w, loss, dlp, cl, kl);
		}
		rl_ops *o;
		rl_ops_cpu_open(&o);
		rl_pg_params p = { 0.2f, 0.2f, 0, 0, 0.1f, 4, 0 };
		float d, st[RL_PG_NSTAT];
		o->pg_loss(o, &d, NULL, st, lp, old, NULL, ref, NULL, adv, w, 1, &p);
		T_EQ_INT(o->status(o), RL_EINVAL);
		rl_ops_close(o);
	}
	/* entropy bonus: loss -= 0.01 * ent, dent = -w * 0.01; no ent: dent = 0 */
	{
		rl_pg_params p = { 0.2f, 0.2f, 0, 0, 0, 1, 0.01f };
		float lp[2] = { 0, 0 }, old[2] = { 0, 0 }, ent[2] = { 2, 0.5f }, adv[2] = { 0, 0 }, w[2] = { 2, 1 };
		float d[2], de[2], st[2 * RL_PG_NSTAT];
		rl_cpu_pg_loss(NULL, d, de, st, lp, old, NULL, NULL, ent, adv, w, 2, &p);
		T_CLOSE(st[RL_PG_LOSS], -0.02, 1e-8, 0);
		T_CLOSE(st[RL_PG_NSTAT + RL_PG_LOSS], -0.005, 1e-8, 0);
		T_CLOSE(de[0], -0.02, 1e-8, 0);
		T_CLOSE(de[1], -0.01, 1e-8, 0);
		T_OK(d[0] == 0 && d[1] == 0, "A = 0: no pg gradient");
		rl_cpu_pg_loss(NULL, d, de, st, lp, old, NULL, NULL, NULL, adv, w, 2, &p);
		T_OK(de[0] == 0 && de[1] == 0 && st[RL_PG_LOSS] == 0, "no entropy input: no entropy term");
	}
	/* dlp against central differences of the op's own summed loss, everything on,
	 * tokens kept away from the clip kinks (ln 0.8, ln 1.28, ln 3) */
	{
		enum { N = 40 };
		rl_pg_params p = { 0.2f, 0.28f, 3.0f, 1.5f, 0.05f, 3, 0 };
		float lp[N], old[N], beh[N], ref[N], adv[N], w[N], d[N], st[N * RL_PG_NSTAT];
		for (int n = 0; n < N; n++) {
			float dl;
			do
				dl = (float)(1.4 * urand());
			while (fabsf(dl - logf(0.8f)) < 0.02f || fabsf(dl - logf(1.28f)) < 0.02f ||
			    fabsf(dl - logf(3.0f)) < 0.02f);
			old[n] = (float)urand();
			lp[n] = old[n] + dl;
			beh[n] = old[n] + (float)(0.5 * urand());
			ref[n] = lp[n] + (float)(0.5 * urand());
			adv[n] = (float)(2 * urand());
			w[n] = n % 7 == 3 ? 0 : (float)(0.5 + 0.5 * urand());
		}
		rl_cpu_pg_loss(NULL, d, NULL, st, lp, old, beh, ref, NULL, adv, w, N, &p);
		double g[N];
		for (int n = 0; n < N; n++) {
			/* the loss is smooth away from kinks: step 1e-3 in fp32, error ~1e-6 / 1e-3 */
			float l0 = lp[n], stp[RL_PG_NSTAT * N], dd[N];
			lp[n] = l0 + 1e-3f;
			rl_cpu_pg_loss(NULL, dd, NULL, stp, lp, old, beh, ref, NULL, adv, w, N, &p);
			double up = w[n] * (double)stp[n * RL_PG_NSTAT + RL_PG_LOSS];
			lp[n] = l0 - 1e-3f;
			rl_cpu_pg_loss(NULL, dd, NULL, stp, lp, old, beh, ref, NULL, adv, w, N, &p);
			double dn = w[n] * (double)stp[n * RL_PG_NSTAT + RL_PG_LOSS];
			double hh = ((double)(l0 + 1e-3f) - (double)(l0 - 1e-3f));
			lp[n] = l0;
			g[n] = (up - dn) / hh;
		}
		CMP("pg dlp vs central differences", d, g, N, 2e-3, 2e-3, 1e-5);
	}
}

/* ==== optimizer ===================================================================== */

static void
test_optim(void)
{
	size_t n = 200003;
	float *x = frand(n, 3);
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	double got = rl_cpu_sumsq(NULL, x, n);
	/* double accumulation of exact fp32 squares: only summation order differs */
	T_CLOSE(got, s, 0, 1e-12);
	T_EQ_INT(rl_cpu_sumsq(NULL, x, 0), 0);
	float one[1] = { -3 };
	T_CLOSE(rl_cpu_sumsq(NULL, one, 1), 9.0, 0, 0);
	free(x);

	/* AdamW, three steps against a hand-written reference */
	enum { M = 37 };
	float p[M], m[M], v[M], g[M], wc[M];
	double pr[M], mr[M], vr[M];
	for (int i = 0; i < M; i++) {
		p[i] = (float)urand();
		pr[i] = p[i];
		m[i] = v[i] = 0;
		mr[i] = vr[i] = 0;
	}
	float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
	for (int t = 1; t <= 3; t++) {
		for (int i = 0; i < M; i++)
			g[i] = (float)(urand() * (i % 5 == 0 ? 1e-4 : 1));
		rl_cpu_adamw(NULL, p, t == 2 ? NULL : wc, g, m, v, M, lr, b1, b2, eps, wd, t, gs);
		for (int i = 0; i < M; i++) {
			double gg = (double)g[i] * gs;
			mr[i] = b1 * mr[i] + (1 - (double)b1) * gg;
			vr[i] = b2 * vr[i] + (1 - (double)b2) * gg * gg;
			double mh = mr[i] / (1 - pow(b1, t)), vh = vr[i] / (1 - pow(b2, t));
			pr[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pr[i]);
		}
		/* each step moves p by <= lr ~ 1e-2 through an O(1) ratio in fp32: 1e-7 */
		CMP("adamw param", p, pr, M, 2e-7, 1e-6, 1e-12);
		CMP("adamw m", m, mr, M, 1e-8, 1e-6, 1e-12);
		CMP("adamw v", v, vr, M, 1e-10, 1e-6, 1e-12);
		if (t != 2)
			T_OK(memcmp(wc, p, sizeof p) == 0, "adamw wcopy equals the parameters");
	}
	rl_ops *o;
	rl_ops_cpu_open(&o);
	o->adamw(o, p, NULL, g, m, v, M, lr, b1, b2, eps, wd, 0, gs);
	T_EQ_INT(o->status(o), RL_EINVAL);
	rl_ops_close(o);
}

/* ==== generation ====================================================================== */

static void
test_decode(void)
{
	enum { NS = 4, NH = 4, NKV = 2, HD = 6, BS = 4, MAXBLK = 4, NBLK = 12 };
	int W = (NH + 2 * NKV) * HD, KW = NKV * HD;
	/* lengths: T = 1, a partial block, several blocks, and a 4th sequence that
	 * shares the 3rd one's first (full) block, as a group shares its prompt */
	int L[NS] = { 1, 5, 13, 9 };
	int32_t bt[NS][MAXBLK] = { { 0 } };
	int perm[NBLK];
	for (int i = 0; i < NBLK; i++)
		perm[i] = i;
	for (int i = NBLK - 1; i > 0; i--) {
		int j = (int)(rl_rng_next(&R) % (uint64_t)(i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	int used = 0;
	for (int b = 0; b < NS; b++)
		for (int k = 0; k < (L[b] + BS - 1) / BS; k++)
			bt[b][k] = (b == 3 && k == 0) ? bt[2][0] : perm[used++];
	size_t csz = (size_t)NBLK * BS * KW;
	float *kc = malloc(csz * sizeof(float)), *vc = malloc(csz * sizeof(float));
	for (size_t i = 0; i < csz; i++)
		kc[i] = vc[i] = NAN;
	float *seq[NS], q[NS * 64], ref[NS * 24], out[NS * 24];
	int32_t ctx[NS];
	int written = 0;
	for (int b = 0; b < NS; b++) {
		seq[b] = frand((size_t)L[b] * W, 1.5);
		if (b == 3)
			memcpy(seq[3], seq[2], (size_t)BS * W * sizeof(float));
		/* the reference: full causal attention over the sequence, last row */
		float *o = malloc((size_t)L[b] * NH * HD * sizeof(float)), *lse = malloc((size_t)NH * L[b] * sizeof(float));
		rl_cpu_attn_fwd(NULL, o, lse, seq[b], NULL, 1, L[b], NH, NKV, HD);
		memcpy(ref + b * NH * HD, o + (size_t)(L[b] - 1) * NH * HD, (size_t)NH * HD * sizeof(float));
		free(o);
		free(lse);
		/* write the tokens this sequence owns (the shared block was written by seq 2);
		 * an extra row with slot -1 must not be written anywhere */
		int32_t slot[16];
		float *rows = malloc((size_t)(L[b] + 1) * W * sizeof(float));
		memcpy(rows, seq[b], (size_t)L[b] * W * sizeof(float));
		for (int i = 0; i < W; i++)
			rows[(size_t)L[b] * W + i] = 1e30f;
		for (int s = 0; s < L[b]; s++)
			slot[s] = (b == 3 && s < BS) ? -1 : bt[b][s / BS] * BS + s % BS;
		slot[L[b]] = -1;
		rl_cpu_kv_write(NULL, kc, vc, rows, slot, L[b] + 1, NH, NKV, HD);
		for (int s = 0; s <= L[b]; s++)
			written += slot[s] >= 0;
		free(rows);
		memcpy(q + b * W, seq[b] + (size_t)(L[b] - 1) * W, (size_t)W * sizeof(float));
		ctx[b] = L[b];
	}
	size_t nan = 0;
	for (size_t i = 0; i < csz; i++)
		nan += isnan(kc[i]) + isnan(vc[i]);
	T_EQ_INT(nan, 2 * (csz - (size_t)written * KW));
	rl_cpu_attn_decode(NULL, out, q, kc, vc, &bt[0][0], ctx, NS, NH, NKV, HD, BS, MAXBLK);
	double rd[NS * 24];
	for (int i = 0; i < NS * NH * HD; i++)
		rd[i] = ref[i];
	/* the same fp32 arithmetic in the same key order: a few ulps at most */
	CMP("attn_decode == attn_fwd last row (paged, shuffled, shared block)", out, rd, NS * NH * HD, 1e-6, 1e-6, 1e-12);
	/* with a window of 6 and another scale: the last row of the windowed forward (the
	 * window starts inside a block, past the shared one, or covers a short sequence) */
	for (int b = 0; b < NS; b++) {
		float *o2 = malloc((size_t)L[b] * NH * HD * sizeof(float)), *l2 = malloc((size_t)NH * L[b] * sizeof(float));
		rl_cpu_attn_fwd_ex(NULL, o2, l2, seq[b], NULL, 1, L[b], NH, NKV, HD, 0.3f, 6);
		for (int i = 0; i < NH * HD; i++)
			rd[b * NH * HD + i] = o2[(size_t)(L[b] - 1) * NH * HD + i];
		free(o2);
		free(l2);
	}
	rl_cpu_attn_decode_ex(NULL, out, q, kc, vc, &bt[0][0], ctx, NS, NH, NKV, HD, BS, MAXBLK, 0.3f, 6);
	CMP("attn_decode_ex == attn_fwd_ex last row (window 6, scale 0.3)", out, rd, NS * NH * HD, 1e-6, 1e-6, 1e-12);
	rl_ops *o;
	rl_ops_cpu_open(&o);
	ctx[1] = MAXBLK * BS + 1;
	o->attn_decode(o, out, q, kc, vc, &bt[0][0], ctx, NS, NH, NKV, HD, BS, MAXBLK);
	T_EQ_INT(o->status(o), RL_EINVAL);  /* more tokens than the block table holds */
	rl_ops_close(o);
	for (int b = 0; b < NS; b++)
		free(seq[b]);
	free(kc);
	free(vc);
}

/* The sampling rule of ops.h written the plain way: full sort, prefix, id-order walk. */
typedef struct sc { float e; int id; } sc;
static int
sc_cmp(const void *a, const void *b)
{
	const sc *x = a, *y = b;
	if (x->e != y->e)
		return x->e > y->e ? -1 : 1;
	return x->id - y->id;
}
static int
sc_id(const void *a, const void *b)
{
	return ((const sc *)a)->id - ((const sc *)b)->id;
}

static int
naive_sample(const float *x, int V, const rl_sample_params *p, double u)
{
	float T = p->temperature, m = -INFINITY;
	if (!(T > 0)) {
		int best = 0;
		for (int j = 1; j < V; j++)
			if (x[j] > x[best])
				best = j;
		return best;
	}
	for (int j = 0; j < V; j++)
		m = fmaxf(m, x[j] / T);
	sc *c = malloc((size_t)V * sizeof(sc));
	for (int j = 0; j < V; j++)
		c[j] = (sc){ expf(x[j] / T - m), j };
	qsort(c, (size_t)V, sizeof(sc), sc_cmp);
	int k = p->top_k > 0 && p->top_k < V ? p->top_k : V, keep = k;
	if (p->top_p < 1.0f) {
		double tot = 0, cum;
		for (int i = 0; i < k; i++)
			tot += c[i].e;
		cum = c[0].e;
		keep = 1;
		while (keep < k && cum < (double)p->top_p * tot)
			cum += c[keep++].e;
	}
	qsort(c, (size_t)keep, sizeof(sc), sc_id);
	double kt = 0, cum = 0;
	for (int i = 0; i < keep; i++)
		kt += c[i].e;
	int t = c[keep - 1].id;
	for (int i = 0; i < keep; i++) {
		cum += c[i].e;
		if (cum > u * kt) {
			t = c[i].id;
			break;
		}
	}
	free(c);
	return t;
}

static double
log_softmax_at(const float *x, int V, double T, int t)
{
	double m = -INFINITY, s = 0;
	for (int j = 0; j < V; j++)
		m = fmax(m, x[j] / T);
	for (int j = 0; j < V; j++)
		s += exp(x[j] / T - m);
	return x[t] / T - m - log(s);
}

static void
test_sample(void)
{
	static const int Vs[] = { 1, 2, 50, 5003 };
	static const rl_sample_params ps[] = {
		{ 1, 0, 1 }, { 0.7f, 0, 1 }, { 1, 5, 1 }, { 1, 0, 0.9f }, { 0.8f, 20, 0.5f }, { 1.3f, 1, 1 },
		{ 1, 0, 0.05f }, { 0, 0, 1 }, { 2, 3, 0.99f },
	};
	enum { B = 16 };
	int mism = 0, lpbad = 0, total = 0;
	for (size_t vi = 0; vi < RL_ARRAY_LEN(Vs); vi++) {
		int V = Vs[vi];
		for (int peaky = 0; peaky < 2; peaky++) {
			float *x = frand((size_t)B * V, peaky ? 8 : 1.5);
			for (size_t pi = 0; pi < RL_ARRAY_LEN(ps); pi++) {
				for (int rep = 0; rep < 4; rep++) {
					uint64_t seed[B], ctr[B];
					int32_t tok[B];
					float lp[B];
					for (int b = 0; b < B; b++) {
						seed[b] = 1000 + b;
						ctr[b] = (uint64_t)rep * 7919 + pi;
					}
					rl_cpu_sample(NULL, tok, lp, x, seed, ctr, B, V, &ps[pi]);
					for (int b = 0; b < B; b++) {
						double u = rl_rng_uniform(seed[b], ctr[b]);
						int t = naive_sample(x + (size_t)b * V, V, &ps[pi], u);
						double T = ps[pi].temperature > 0 ? ps[pi].temperature : 1.0;
						double rl = log_softmax_at(x + (size_t)b * V, V, T, tok[b]);
						mism += t != tok[b];
						/* logp: fp32 logits, double sums: 1e-5 absolute */
						lpbad += !(fabs(lp[b] - rl) <= 1e-5 + 1e-6 * fabs(rl));
						total++;
					}
				}
			}
			free(x);
		}
	}
	T_OK(mism == 0, "%d of %d samples differ from the written-out rule", mism, total);
	T_OK(lpbad == 0, "%d of %d sample log-probs off", lpbad, total);

	/* greedy: the first maximum, logp at temperature 1 */
	float x[6] = { 0.5f, 2, -1, 2, 0, 1 };
	uint64_t s0 = 7, c0 = 0;
	int32_t t;
	float lp;
	rl_sample_params g = { 0, 0, 1 };
	rl_cpu_sample(NULL, &t, &lp, x, &s0, &c0, 1, 6, &g);
	T_EQ_INT(t, 1);
	T_CLOSE(lp, log_softmax_at(x, 6, 1, 1), 1e-6, 0);
	/* top_k = 1 is greedy whatever u */
	rl_sample_params k1 = { 1.5f, 1, 1 };
	int all = 1;
	for (uint64_t c = 0; c < 50; c++) {
		rl_cpu_sample(NULL, &t, &lp, x, &s0, &c, 1, 6, &k1);
		all &= t == 1;
	}
	T_OK(all, "top_k = 1 always takes the argmax");

	/* frequencies: p = (.5, .3, .15, .05); top_p .7 keeps {0, 1} (mass before 2
	 * is .8 >= .7); top_k 3 keeps {0, 1, 2}; temperature 2 flattens to sqrt(p) */
	float lg[4] = { (float)log(0.5), (float)log(0.3), (float)log(0.15), (float)log(0.05) };
	struct { rl_sample_params p; double want[4]; } fc[] = {
		{ { 1, 0, 0.7f }, { 0.625, 0.375, 0, 0 } },
		{ { 1, 3, 1 }, { 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0 } },
		{ { 2, 0, 1 }, { 0.7071067812 / 1.8657344711, 0.5477225575 / 1.8657344711,
			0.3872983346 / 1.8657344711, 0.2236067977 / 1.8657344711 } },
	};
	enum { ND = 4000 };
	for (size_t f = 0; f < RL_ARRAY_LEN(fc); f++) {
		int cnt[4] = { 0 };
		uint64_t seed = 99;
		for (uint64_t c = 0; c < ND; c++) {
			rl_cpu_sample(NULL, &t, &lp, lg, &seed, &c, 1, 4, &fc[f].p);
			cnt[t]++;
			/* the same (seed, counter) gives the same token */
			int32_t t2;
			float lp2;
			rl_cpu_sample(NULL, &t2, &lp2, lg, &seed, &c, 1, 4, &fc[f].p);
			if (t2 != t || lp2 != lp)
				cnt[0] = -100000;
		}
		for (int i = 0; i < 4; i++) {
			double sd = sqrt(fc[f].want[i] * (1 - fc[f].want[i]) / ND);
			/* 5 standard deviations: fails by chance ~1e-6; a wrong kept set is off by >> that */
			T_OK(fabs(cnt[i] / (double)ND - fc[f].want[i]) <= 5 * sd + 1e-12,
			    "case %zu token %d: freq %.4f want %.4f", f, i, cnt[i] / (double)ND, fc[f].want[i]);
		}
	}
}

/* ==== determinism ======================================================================= */

static void
test_determinism(void)
{
	/* 1 thread against 3 (an uneven split on any machine): every reduction must
	 * be cut the same way, so the bits agree */
	int N = 150, C = 70, OC = 90, B = 2, T = 70, NH = 4, NKV = 2, HD = 8, W = (NH + 2 * NKV) * HD;
	size_t nbig = 300007, nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD;
	float *x = frand((size_t)N * C, 1), *w = frand((size_t)OC * C, 1), *dy = frand((size_t)N * OC, 1);
	float *big = frand(nbig, 1), *qkv = frand(nq, 1), *go = frand(no, 1);
	float *dx[2], *dw[2], *dxn[2], *dwn[2], *dq[2], rstd[150];
	double ss[2];
	for (int k = 0; k < 2; k++) {
		omp_set_num_threads(k ? 3 : 1);
		dx[k] = malloc((size_t)N * C * sizeof(float));
		dw[k] = calloc((size_t)OC * C, sizeof(float));
		dxn[k] = malloc((size_t)N * C * sizeof(float));
		dwn[k] = calloc((size_t)C, sizeof(float));
		dq[k] = malloc(nq * sizeof(float));
		rl_cpu_matmul_bwd(NULL, dx[k], dw[k], NULL, dy, x, w, N, C, OC);
		rl_cpu_rmsnorm_fwd(NULL, dxn[k], rstd, x, w, N, C, 1e-5f);
		rl_cpu_rmsnorm_bwd(NULL, dxn[k], dwn[k], x, x, w, rstd, N, C);
		ss[k] = rl_cpu_sumsq(NULL, big, nbig);
		float *out = malloc(no * sizeof(float)), *lse = malloc((size_t)B * NH * T * sizeof(float));
		rl_cpu_attn_fwd(NULL, out, lse, qkv, NULL, B, T, NH, NKV, HD);
		rl_cpu_attn_bwd(NULL, dq[k], go, out, lse, qkv, NULL, B, T, NH, NKV, HD);
		free(out);
		free(lse);
	}
	omp_set_num_threads(omp_get_num_procs());
	T_OK(memcmp(dx[0], dx[1], (size_t)N * C * sizeof(float)) == 0, "matmul dinp: 1 thread == 3 threads");
	T_OK(memcmp(dw[0], dw[1], (size_t)OC * C * sizeof(float)) == 0, "matmul dw: 1 thread == 3 threads");
	T_OK(memcmp(dwn[0], dwn[1], (size_t)C * sizeof(float)) == 0, "rmsnorm dw: 1 thread == 3 threads");
	T_OK(memcmp(dq[0], dq[1], nq * sizeof(float)) == 0, "attn bwd: 1 thread == 3 threads");
	T_OK(ss[0] == ss[1], "sumsq: 1 thread == 3 threads");
	for (int k = 0; k < 2; k++) {
		free(dx[k]);
		free(dw[k]);
		free(dxn[k]);
		free(dwn[k]);
		free(dq[k]);
	}
	free(x);
	free(w);
	free(dy);
	free(big);
	free(qkv);
	free(go);
}

int
main(int argc, char **argv)
{
	if (getenv("RL_TEST_MATMUL_ONLY") != NULL) {
		T_BEGIN(getenv("RL_CPU_GEMM") ? getenv("RL_CPU_GEMM") : "test_ops_cpu matmul");
		matmul_cases();
		T_END();
	}
	T_BEGIN("test_ops_cpu");
	test_matmul("/proc/self/exe");
	test_memory();
	test_expf();
	test_embed();
	test_norms();
	test_qknorm();
	test_rope();
	test_rope_llama3();
	test_attn();
	test_act();
	test_logprob();
	test_pg_loss();
	test_optim();
	test_decode();
	test_sample();
	test_determinism();
	T_END();
}

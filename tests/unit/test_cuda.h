/*
 * test_cuda.h — helpers of the CUDA-vs-CPU tests (test_cuda_*.c): random
 * inputs, host <-> device copies in the backend's act dtype, and the
 * comparison rule of STYLE.md: every element within atol + rtol*|ref| and the
 * normalised MSE sum((out-ref)^2) / sum(ref^2) under a bound; NaN never passes.
 */
#ifndef RL_TEST_CUDA_H
#define RL_TEST_CUDA_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "compute/ops.h"
#include "base/rng.h"
#include "t.h"

static rl_rng tc_rng;

static inline void
tc_seed(void)
{
	const char *s = getenv("RL_SEED");
	tc_rng.seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
	tc_rng.counter = 0;
	printf("seed %llu (RL_SEED=N to repeat)\n", (unsigned long long)tc_rng.seed);
}

static inline double tc_unif(void) { return rl_rng_next_uniform(&tc_rng); }

/* n floats uniform in [lo, hi), rounded to bf16 when round is set (act inputs, so
 * that both backends see the same numbers). */
static inline float *
tc_rand(size_t n, float lo, float hi, int round)
{
	float *x = rl_xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		x[i] = lo + (hi - lo) * (float)tc_unif();
		if (round)
			x[i] = rl_bf16_to_f32(rl_f32_to_bf16(x[i]));
	}
	return x;
}

static inline int tc_irand(int n) { return (int)(tc_unif() * n) % (n > 0 ? n : 1); }

/* Device copy of host floats in dtype dt (RL_F32 or RL_BF16). */
static inline void *
tc_up(rl_ops *g, const float *x, size_t n, int dt)
{
	void *d = NULL;
	size_t es = dt == RL_BF16 ? 2 : 4;
	if (g->alloc(g, &d, (n ? n : 1) * es) != RL_OK) {
		fprintf(stderr, "device allocation of %zu bytes failed\n", n * es);
		exit(1);
	}
	if (dt == RL_BF16) {
		uint16_t *h = rl_xmalloc((n ? n : 1) * 2);
		for (size_t i = 0; i < n; i++)
			h[i] = rl_f32_to_bf16(x[i]);
		g->upload(g, d, h, n * 2);
		free(h);
	} else {
		g->upload(g, d, x, n * 4);
	}
	return d;
}

static inline void *
tc_upi(rl_ops *g, const void *x, size_t bytes)
{
	void *d = NULL;
	if (g->alloc(g, &d, bytes ? bytes : 1) != RL_OK)
		exit(1);
	g->upload(g, d, x, bytes);
	return d;
}

/* Device buffer of n elements of dt filled with a poison pattern (NaN in both dtypes),
 * so that an element the kernel forgets to write fails the comparison. */
static inline void *
tc_poison(rl_ops *g, size_t n, int dt)
{
	size_t es = dt == RL_BF16 ? 2 : 4;
	void *d = NULL;
	if (g->alloc(g, &d, (n ? n : 1) * es) != RL_OK)
		exit(1);
	unsigned char *h = rl_xmalloc((n ? n : 1) * es);
	memset(h, 0xff, n * es);
	g->upload(g, d, h, n * es);
	free(h);
	return d;
}

/* Host floats of a device tensor of dtype dt. */
static inline float *
tc_down(rl_ops *g, const void *d, size_t n, int dt)
{
	float *x = rl_xmalloc((n ? n : 1) * sizeof(float));
	if (dt == RL_BF16) {
		uint16_t *h = rl_xmalloc((n ? n : 1) * 2);
		g->download(g, h, d, n * 2);
		for (size_t i = 0; i < n; i++)
			x[i] = rl_bf16_to_f32(h[i]);
		free(h);
	} else {
		g->download(g, x, d, n * 4);
	}
	return x;
}

/* Compare got against ref; prints one line; returns 0 when within bounds. */
static inline int
tc_cmp(const char *what, const float *got, const float *ref, size_t n, double atol, double rtol,
    double nmse_max)
{
	double se = 0, sr = 0, maxe = 0;
	size_t bad = 0, first = (size_t)-1;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)ref[i]);
		if (isnan(got[i]) || isnan(ref[i]) || isinf(got[i]) != isinf(ref[i]) ||
		    d > atol + rtol * fabs((double)ref[i])) {
			if (!bad)
				first = i;
			bad++;
		}
		if (!isnan(d) && !isinf(got[i])) {
			se += d * d;
			sr += (double)ref[i] * ref[i];
			if (d > maxe)
				maxe = d;
		}
	}
	double nmse = sr > 0 ? se / sr : se;
	int ok = bad == 0 && nmse <= nmse_max;
	printf("%s %-34s n=%-9zu max_abs_err=%.3g nmse=%.3g", ok ? "ok  " : "FAIL", what, n, maxe, nmse);
	if (bad)
		printf(" (%zu outside atol %.2g + rtol %.2g; first [%zu] got %.7g ref %.7g)", bad, atol, rtol,
		    first, got[first], ref[first]);
	if (nmse > nmse_max)
		printf(" (nmse above %.2g)", nmse_max);
	printf("\n");
	T_OK(ok, "%s", what);
	return ok ? 0 : 1;
}

/* Compare a device tensor (dtype dt) with a host reference; frees nothing of the caller's. */
static inline int
tc_cmpd(rl_ops *g, const char *what, const void *d, int dt, const float *ref, size_t n, double atol,
    double rtol, double nmse_max)
{
	float *got = tc_down(g, d, n, dt);
	int rc = tc_cmp(what, got, ref, n, atol, rtol, nmse_max);
	free(got);
	return rc;
}

static inline void
tc_check_status(rl_ops *g, const char *what)
{
	int rv = g->sync(g);
	T_OK(rv == RL_OK, "%s: backend status %s", what, rl_strerror(rv));
	if (rv != RL_OK)
		printf("FAIL %s: backend status %s\n", what, rl_strerror(rv));
}

#endif

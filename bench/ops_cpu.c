/*
 * ops_cpu.c — timings of the CPU backend's heavy ops on the shapes of a
 * ~10M-parameter model (C = 384, MLP 4x, HD = 64, B*T = 2048 tokens), one JSON
 * line per op: {"bench":"ops_cpu","op":...,"shape":...,"ms":...,"gflops":...,
 * "cpu_ms":...,"gflops_per_cpu_s":...}: wall time, and process CPU time, which
 * says more than wall time on a shared machine (run with OMP_NUM_THREADS=1 for
 * the per-core efficiency).  bench/ops_cpu_torch.py times the same ops with
 * PyTorch for comparison.
 *
 * Usage: ops_cpu [REPEATS]   (default 5; the best run is reported)
 * RL_CPU_GEMM=avx512|avx512t|avx2|base picks the GEMM micro-kernel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "compute/ops_cpu.h"
#include "base/rng.h"

static float *
rnd(size_t n, rl_rng *r)
{
	float *x = rl_xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(rl_rng_next_uniform(r) * 2 - 1);
	return x;
}

static double best_cpu;  /* CPU seconds of the run with the best CPU time */

static double
cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void
report(const char *op, const char *shape, double sec, double flops)
{
	printf("{\"bench\":\"ops_cpu\",\"op\":\"%s\",\"shape\":\"%s\",\"ms\":%.3f,\"gflops\":%.1f,"
	    "\"cpu_ms\":%.3f,\"gflops_per_cpu_s\":%.1f}\n",
	    op, shape, sec * 1e3, flops / sec / 1e9, best_cpu * 1e3, flops / best_cpu / 1e9);
	fflush(stdout);
}

#define TIME(reps, best, stmt) do { \
	best = 1e30; \
	best_cpu = 1e30; \
	for (int r_ = 0; r_ < (reps); r_++) { \
		double t0_ = rl_now(), c0_ = cpu_now(); \
		stmt; \
		double t_ = rl_now() - t0_, c_ = cpu_now() - c0_; \
		if (t_ < best) \
			best = t_; \
		if (c_ < best_cpu) \
			best_cpu = c_; \
	} \
} while (0)

int
main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 5;
	rl_rng r = { 1, 0 };
	int N = 2048;
	static const int mm[][2] = { { 384, 1152 }, { 384, 384 }, { 384, 1536 }, { 1536, 384 }, { 384, 8192 } };
	char shape[64];
	double best;
	for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
		int C = mm[i][0], OC = mm[i][1];
		float *x = rnd((size_t)N * C, &r), *w = rnd((size_t)OC * C, &r), *y = rnd((size_t)N * OC, &r);
		float *dx = rnd((size_t)N * C, &r), *dw = rnd((size_t)OC * C, &r);
		snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", N, C, OC);
		TIME(reps, best, rl_cpu_matmul_fwd(NULL, y, x, w, NULL, N, C, OC));
		report("matmul_fwd", shape, best, 2.0 * N * C * OC);
		TIME(reps, best, rl_cpu_matmul_bwd(NULL, dx, dw, NULL, y, x, w, N, C, OC));
		report("matmul_bwd", shape, best, 4.0 * N * C * OC);
		free(x);
		free(w);
		free(y);
		free(dx);
		free(dw);
	}
	{
		/* the demo model's products (C = 64, MLP 256, vocabulary 264) on a
		 * 256-token micro-batch: small enough that the micro-kernel's
		 * edges and packing matter */
		static const int sm[][2] = { { 64, 192 }, { 64, 64 }, { 64, 512 }, { 256, 64 }, { 64, 264 } };
		int Ns = 256;
		for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++) {
			int C = sm[i][0], OC = sm[i][1];
			float *x = rnd((size_t)Ns * C, &r), *w = rnd((size_t)OC * C, &r), *y = rnd((size_t)Ns * OC, &r);
			float *dx = rnd((size_t)Ns * C, &r), *dw = rnd((size_t)OC * C, &r);
			snprintf(shape, sizeof shape, "N=%d C=%d OC=%d", Ns, C, OC);
			TIME(reps * 20, best, rl_cpu_matmul_fwd(NULL, y, x, w, NULL, Ns, C, OC));
			report("matmul_fwd", shape, best, 2.0 * Ns * C * OC);
			TIME(reps * 20, best, rl_cpu_matmul_bwd(NULL, dx, dw, NULL, y, x, w, Ns, C, OC));
			report("matmul_bwd", shape, best, 4.0 * Ns * C * OC);
			free(x);
			free(w);
			free(y);
			free(dx);
			free(dw);
		}
	}
	{
		/* decode-sized: one token against the LM head */
		int C = 384, OC = 8192;
		float *x = rnd(C, &r), *w = rnd((size_t)OC * C, &r), *y = rnd(OC, &r);
		snprintf(shape, sizeof shape, "N=1 C=%d OC=%d", C, OC);
		TIME(reps * 4, best, rl_cpu_matmul_fwd(NULL, y, x, w, NULL, 1, C, OC));
		report("matmul_fwd", shape, best, 2.0 * C * OC);
		free(x);
		free(w);
		free(y);
	}
	static const int Ts[] = { 256, 1024 };
	for (int ti = 0; ti < 2; ti++) {
		int B = 8, T = Ts[ti], NH = 6, NKV = 6, HD = 64, W = (NH + 2 * NKV) * HD;
		float *qkv = rnd((size_t)B * T * W, &r), *out = rnd((size_t)B * T * NH * HD, &r);
		float *lse = rnd((size_t)B * NH * T, &r), *dout = rnd((size_t)B * T * NH * HD, &r);
		float *dqkv = rnd((size_t)B * T * W, &r);
		double fl = 4.0 * B * NH * (T * (T + 1) / 2.0) * HD;  /* QK^T and PV, causal half */
		snprintf(shape, sizeof shape, "B=%d T=%d NH=%d HD=%d", B, T, NH, HD);
		TIME(reps, best, rl_cpu_attn_fwd(NULL, out, lse, qkv, NULL, B, T, NH, NKV, HD));
		report("attn_fwd", shape, best, fl);
		TIME(reps, best, rl_cpu_attn_bwd(NULL, dqkv, dout, out, lse, qkv, NULL, B, T, NH, NKV, HD));
		report("attn_bwd", shape, best, 2.5 * fl);
		free(qkv);
		free(out);
		free(lse);
		free(dout);
		free(dqkv);
	}
	{
		int V = 8192;
		float *lg = rnd((size_t)N * V, &r), *lp = rnd(N, &r), *ent = rnd(N, &r), *lse = rnd(N, &r);
		int32_t *tgt = rl_xmalloc((size_t)N * sizeof(int32_t));
		for (int n = 0; n < N; n++)
			tgt[n] = (int32_t)(rl_rng_next(&r) % (uint64_t)V);
		snprintf(shape, sizeof shape, "N=%d V=%d", N, V);
		TIME(reps, best, rl_cpu_logprob_fwd(NULL, lp, ent, lse, lg, tgt, N, V, 1.0f));
		report("logprob_fwd", shape, best, 0);
		TIME(reps, best, rl_cpu_logprob_bwd(NULL, lg, lg, tgt, lse, lp, ent, N, V, 1.0f));
		report("logprob_bwd", shape, best, 0);
		free(lg);
		free(lp);
		free(ent);
		free(lse);
		free(tgt);
	}
	return 0;
}

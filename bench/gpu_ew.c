/*
 * gpu_ew.c — single-op timings of the training step's memory-bound ops on the CUDA
 * backend at the shapes of one step (GPT-2 124M at 16 x 1024 tokens, Qwen2.5-0.5B at
 * 8 x 1024): GELU and SwiGLU forward/backward, RoPE forward/backward, add, cast,
 * LayerNorm and RMSNorm backward (alone, followed by the residual add, and added into
 * the residual gradient by layernorm_bwd_add / rmsnorm_bwd_add: "new" mode only), the
 * bias gradient (matmul_bwd with dbias only), and AdamW over GPT-2's tensor table
 * (rl_model_step: sumsq, the update, zeroing the gradients).  Each op twice: with the
 * defaults and RL_CUDA_NORM_BWD_ADD=1 ("new": the 16-byte kernels, the norm backward
 * with the row in registers, k_colsum8, adamw_multi) and on a backend opened with
 * RL_CUDA_EW_VEC=0 RL_CUDA_NORM_BWD_VEC=0 RL_CUDA_COLSUM_VEC=0 RL_CUDA_ADAMW_MULTI=0
 * ("old").  One JSON line per op and mode: microseconds per call (the mean of `iters`
 * calls after a warm-up, timed around ops->sync) and the GB/s of the bytes the op must
 * move.
 *
 * Usage: gpu_ew [iters]      (default 20)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "base/core.h"
#include "model/model.h"
#include "compute/ops.h"

#include "shapes.h"

static rl_ops *o;
static const char *mode;
static int iters = 20;

static void *
dev(size_t bytes)
{
	void *p = NULL;
	if (o->alloc(o, &p, bytes)) {
		fprintf(stderr, "gpu_ew: out of device memory\n");
		exit(1);
	}
	/* small random bf16 values (the f32 buffers get pairs of them: finite, small) */
	uint16_t *h = rl_xmalloc(bytes);
	uint64_t s = 88172645463325252ULL;
	for (size_t i = 0; i < bytes / 2; i++) {
		s ^= s << 13; s ^= s >> 7; s ^= s << 17;
		h[i] = rl_f32_to_bf16(((float)(s % 2000) - 1000.0f) / 1000.0f);
	}
	o->upload(o, p, h, bytes);
	free(h);
	return p;
}

#define TIME(label, bytes, body) do { \
	body; if (o->sync(o)) { fprintf(stderr, "gpu_ew: %s failed\n", label); exit(1); } \
	double t0_ = rl_now(); \
	for (int it_ = 0; it_ < iters; it_++) { body; } \
	if (o->sync(o)) { fprintf(stderr, "gpu_ew: %s failed\n", label); exit(1); } \
	double us_ = (rl_now() - t0_) / iters * 1e6; \
	printf("{\"what\":\"ew\",\"op\":\"%s\",\"mode\":\"%s\",\"us\":%.1f,\"gbs\":%.0f}\n", label, mode, us_, \
	    (double)(bytes) / us_ / 1e3); \
	fflush(stdout); } while (0)

static void
ops_bench(void)
{
	const size_t G = 16384, GC = 768, GH = 3072;  /* GPT-2: tokens, width, MLP */
	const size_t Q = 8192, QC = 896, QH = 4864;   /* Qwen2.5-0.5B */
	const int NH = 14, NKV = 2, HD = 64;
	size_t big = RL_MAX(2 * Q * QH, G * GH) * 2;  /* bytes of the largest act tensor */
	void *a = dev(big), *b = dev(big), *c = dev(big);
	float *f = dev(G * GC * 4), *dw = dev(QH * 4 * 4), *db = dev(QH * 4 * 4);
	float *mean = dev(G * 4), *rstd = dev(G * 4);
	int32_t *pos = dev(Q * 4);
	{
		/* statistics and positions that are valid numbers */
		float *h = rl_xmalloc(G * 4);
		int32_t *hp = rl_xmalloc(Q * 4);
		for (size_t i = 0; i < G; i++)
			h[i] = 1.0f;
		for (size_t i = 0; i < Q; i++)
			hp[i] = (int32_t)(i % 1024);
		o->upload(o, rstd, h, G * 4);
		o->zero(o, mean, G * 4);
		o->upload(o, pos, hp, Q * 4);
		free(h);
		free(hp);
	}
	size_t n = G * GH;
	TIME("gelu_fwd 16384x3072", 2 * n * 2, o->gelu_fwd(o, b, a, n));
	TIME("gelu_bwd 16384x3072", 3 * n * 2, o->gelu_bwd(o, c, b, a, n));
	TIME("swiglu_fwd 8192x4864", 3 * Q * QH * 2, o->swiglu_fwd(o, b, a, (int)Q, (int)QH));
	TIME("swiglu_bwd 8192x4864", 5 * Q * QH * 2, o->swiglu_bwd(o, c, b, a, (int)Q, (int)QH));
	size_t rb = Q * (NH + NKV) * HD * 2 * 2;
	TIME("rope_fwd 8192 14/2x64", rb, o->rope_fwd(o, a, pos, (int)Q, NH, NKV, HD, (rl_rope){ .theta = 1e6f }));
	TIME("rope_bwd 8192 14/2x64", rb, o->rope_bwd(o, a, pos, (int)Q, NH, NKV, HD, (rl_rope){ .theta = 1e6f }));
	TIME("add 16384x768", 3 * G * GC * 2, o->add(o, c, a, b, G * GC));
	TIME("cast f32->bf16 16384x768", G * GC * 6, o->cast(o, c, RL_BF16, f, RL_F32, G * GC));
	TIME("layernorm_bwd 16384x768", 3 * G * GC * 2, o->layernorm_bwd(o, c, dw, db, a, b, a, mean, rstd, (int)G,
	    (int)GC));
	TIME("rmsnorm_bwd 8192x896", 3 * Q * QC * 2, o->rmsnorm_bwd(o, c, dw, a, b, a, rstd, (int)Q, (int)QC));
	/* the model's residual sites: the norm backward then add (6 tensors of traffic), or
	 * the norm backward added into dx (4; RL_CUDA_NORM_BWD_ADD=1, "new" mode here) */
	void *dres = f;
	TIME("layernorm_bwd+add 16384x768", 6 * G * GC * 2, { o->layernorm_bwd(o, c, dw, db, a, b, a, mean, rstd, (int)G,
	    (int)GC); o->add(o, dres, dres, c, G * GC); });
	TIME("rmsnorm_bwd+add 8192x896", 6 * Q * QC * 2, { o->rmsnorm_bwd(o, c, dw, a, b, a, rstd, (int)Q, (int)QC);
	    o->add(o, dres, dres, c, Q * QC); });
	if (o->layernorm_bwd_add && o->rmsnorm_bwd_add) {
		TIME("layernorm_bwd_add 16384x768", 4 * G * GC * 2, o->layernorm_bwd_add(o, dres, dw, db, a, b, a, mean,
		    rstd, (int)G, (int)GC));
		TIME("rmsnorm_bwd_add 8192x896", 4 * Q * QC * 2, o->rmsnorm_bwd_add(o, dres, dw, a, b, a, rstd, (int)Q,
		    (int)QC));
	}
	TIME("bias_grad 16384x768", G * GC * 2, o->matmul_bwd(o, NULL, NULL, db, a, b, c, (int)G, (int)GC, (int)GC));
	TIME("bias_grad 16384x3072", G * GH * 2, o->matmul_bwd(o, NULL, NULL, db, a, b, c, (int)G, (int)GC, (int)GH));
	o->free(o, a); o->free(o, b); o->free(o, c); o->free(o, f); o->free(o, dw); o->free(o, db);
	o->free(o, mean); o->free(o, rstd); o->free(o, pos);
}

/* rl_model_step on GPT-2 124M with zero gradients (the work does not depend on them) */
static void
step_bench(void)
{
	rl_config cfg;
	rl_model *m = NULL;
	memset(&cfg, 0, sizeof cfg);
	if (rl_config_parse(&cfg, gpt2_json, strlen(gpt2_json), "gpt2") || rl_model_init_random(&m, &cfg, o, 1) ||
	    rl_model_train_reserve(m, 1024)) {
		fprintf(stderr, "gpu_ew: cannot make the GPT-2 model\n");
		exit(1);
	}
	rl_adamw hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		.max_grad_norm = 1.0f };
	double P = (double)m->tt.total;
	char lab[64];
	snprintf(lab, sizeof lab, "model_step gpt2 %d tensors", m->tt.n);
	/* sumsq reads grads (4), the update 4 x 4 in, 3 x 4 + 2 out, the zeroing 4 */
	TIME(lab, P * (4 + 16 + 14 + 4), rl_model_step(m, &hp, NULL));
	rl_model_close(m);
	rl_config_fini(&cfg);
}

int
main(int argc, char **argv)
{
	const char *sw[] = { "RL_CUDA_EW_VEC", "RL_CUDA_NORM_BWD_VEC", "RL_CUDA_COLSUM_VEC", "RL_CUDA_ADAMW_MULTI" };
	if (argc > 1 && atoi(argv[1]) > 0)
		iters = atoi(argv[1]);
	rl_log_init("gpu_ew", 1);
	(void)qwen_json;  /* the Qwen shapes are written out in ops_bench */
	for (int k = 0; k < 2; k++) {
		for (int i = 0; i < 4; i++) {
			if (k)
				setenv(sw[i], "0", 1);
			else
				unsetenv(sw[i]);
		}
		mode = k ? "old" : "new";
		if (k)
			unsetenv("RL_CUDA_NORM_BWD_ADD");
		else
			setenv("RL_CUDA_NORM_BWD_ADD", "1", 1);
		int rv = rl_ops_open(&o, "cuda");
		if (rv != RL_OK) {
			fprintf(stderr, "gpu_ew: no CUDA backend: %s\n", rl_strerror(rv));
			return 1;
		}
		ops_bench();
		step_bench();
		rl_ops_close(o);
	}
	return 0;
}

/*
 * test_norm_bwd_add.c — the optional norm backwards that add into the residual gradient
 * (layernorm_bwd_add, rmsnorm_bwd_add of lib/compute/ops.h), without a GPU:
 *   - the CPU ops against their contract, the plain op into scratch then add, bit for bit
 *     (f32 act: the one rounding of the sum is the two-step one), dw and db accumulated
 *     (+=), db or dw NULL, rows across several of the reduction's chunks, C = 1 and odd;
 *   - the model's backward through them (the CPU backend's default) against the same
 *     backend with the two ops NULL (lib/model/model_train.c's norm_bwd then add): every gradient
 *     bit for bit, for GPT-2 (LayerNorm with bias), Qwen2 (RMSNorm) and Qwen3 (RMSNorm
 *     beside q/k-norm), with and without activation recomputation, two passes (the second
 *     adds to the first's gradients), and the op called twice a layer per backward;
 *   - a control that shows the comparison can fail: an "add" op that overwrites instead
 *     gives other gradients.
 * The CUDA ops are checked against the CPU reference in test_cuda_ops (GPU) and their
 * kernels in kernels/emu (emu_ew.cpp).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "base/rng.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":97,"
    "\"n_embd\":32,\"n_layer\":2,\"n_head\":4,\"n_positions\":64,\"n_ctx\":64,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen2_json =
    "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":101,"
    "\"hidden_size\":32,\"intermediate_size\":40,\"num_hidden_layers\":3,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":64,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";
static const char *qwen3_json =
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":90,"
    "\"hidden_size\":32,\"intermediate_size\":24,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"max_position_embeddings\":64,\"rope_theta\":1000000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";

static uint64_t draws;

static float *
rnd(size_t n, float lo, float hi)
{
	float *x = rl_xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = lo + (hi - lo) * (float)rl_rng_uniform(91, draws++);
	return x;
}

static float *
dup(const float *x, size_t n)
{
	float *y = rl_xmalloc((n ? n : 1) * sizeof(float));
	memcpy(y, x, n * sizeof(float));
	return y;
}

static int
same(const float *a, const float *b, size_t n)
{
	return memcmp(a, b, n * sizeof(float)) == 0;
}

/* the CPU ops against the plain op into scratch, then add */
static void
test_ops(int N, int C, int with_dw_db)
{
	size_t n = (size_t)N * C;
	float *x = rnd(n, -2, 2), *g = rnd(n, -1, 1), *w = rnd(C, 0.5f, 1.5f), *b = rnd(C, -0.5f, 0.5f);
	float *d0 = rnd(n, -3, 3), *tmp = rl_xmalloc(n * sizeof(float)), *y = rl_xmalloc(n * sizeof(float));
	float *mean = rl_xmalloc(N * sizeof(float)), *rstd = rl_xmalloc(N * sizeof(float));
	float *dw0 = rnd(C, -1, 1), *db0 = rnd(C, -1, 1);
	float *da = dup(d0, n), *db_ = dup(d0, n), *dwa = dup(dw0, C), *dwb = dup(dw0, C), *dba = dup(db0, C);
	float *dbb = dup(db0, C);

	/* LayerNorm */
	rl_cpu_layernorm_fwd(NULL, y, mean, rstd, x, w, b, N, C, 1e-5f);
	rl_cpu_layernorm_bwd(NULL, tmp, with_dw_db ? dwa : NULL, with_dw_db ? dba : NULL, g, x, w, mean, rstd, N, C);
	rl_cpu_add(NULL, da, da, tmp, n);
	rl_cpu_layernorm_bwd_add(NULL, db_, with_dw_db ? dwb : NULL, with_dw_db ? dbb : NULL, g, x, w, mean, rstd, N,
	    C);
	T_OK(same(da, db_, n), "layernorm_bwd_add N=%d C=%d: dx the plain op's plus the old dx, bit for bit", N, C);
	T_OK(!same(da, d0, n), "layernorm_bwd_add N=%d C=%d: dx changed", N, C);
	T_OK(same(dwa, dwb, C) && same(dba, dbb, C), "layernorm_bwd_add N=%d C=%d dw,db=%d: dw and db as the plain op's",
	    N, C, with_dw_db);
	if (!with_dw_db)
		T_OK(same(dwb, dw0, C) && same(dbb, db0, C), "layernorm_bwd_add: dw and db NULL leave them alone");

	/* RMSNorm */
	memcpy(da, d0, n * sizeof(float));
	memcpy(db_, d0, n * sizeof(float));
	rl_cpu_rmsnorm_fwd(NULL, y, rstd, x, w, N, C, 1e-6f);
	rl_cpu_rmsnorm_bwd(NULL, tmp, with_dw_db ? dwa : NULL, g, x, w, rstd, N, C);
	rl_cpu_add(NULL, da, da, tmp, n);
	rl_cpu_rmsnorm_bwd_add(NULL, db_, with_dw_db ? dwb : NULL, g, x, w, rstd, N, C);
	T_OK(same(da, db_, n), "rmsnorm_bwd_add N=%d C=%d: dx the plain op's plus the old dx, bit for bit", N, C);
	T_OK(!same(da, d0, n), "rmsnorm_bwd_add N=%d C=%d: dx changed", N, C);
	T_OK(same(dwa, dwb, C), "rmsnorm_bwd_add N=%d C=%d dw=%d: dw as the plain op's", N, C, with_dw_db);
	free(x); free(g); free(w); free(b); free(d0); free(tmp); free(y); free(mean); free(rstd); free(dw0);
	free(db0); free(da); free(db_); free(dwa); free(dwb); free(dba); free(dbb);
}

static long nln, nrms;

static void
ln_count(rl_ops *o, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
    const float *mean, const float *rstd, int N, int C)
{
	nln++;
	rl_cpu_layernorm_bwd_add(o, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

static void
rms_count(rl_ops *o, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd,
    int N, int C)
{
	nrms++;
	rl_cpu_rmsnorm_bwd_add(o, dx, dw, dout, x, w, rstd, N, C);
}

/* the control: the "add" overwrites dx */
static void
ln_wrong(rl_ops *o, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
    const float *mean, const float *rstd, int N, int C)
{
	rl_cpu_layernorm_bwd(o, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

static void
rms_wrong(rl_ops *o, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd,
    int N, int C)
{
	rl_cpu_rmsnorm_bwd(o, dx, dw, dout, x, w, rstd, N, C);
}

enum { B = 2, T = 7, NTOK = B * T };

/* Two passes of forward + backward of one model on ops o; its gradients in *grads (one
 * allocation, the tensors one after another).  0 on success. */
static int
grads_of(rl_ops *o, const rl_config *cfg, int recompute, float **grads, size_t *len)
{
	rl_model *m = NULL;
	float *buf = NULL, *out = NULL;
	int32_t tok[NTOK], tgt[NTOK];
	float dlp[NTOK];
	size_t total = 0;
	int rv;

	*grads = NULL;
	if ((rv = rl_model_init_random(&m, cfg, o, 5)) != RL_OK)
		goto out;
	m->recompute = recompute;
	if ((rv = rl_model_train_reserve(m, NTOK)) != RL_OK)
		goto out;
	/* every tensor redrawn, norm weights and biases too (init's ones and zeros would hide a
	 * swapped ln_1 / ln_2) */
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		free(buf);
		buf = rl_xmalloc(t->n * sizeof(float));
		for (size_t j = 0; j < t->n; j++)
			buf[j] = (float)((t->ndim == 2 ? 0.3 : 0.5) * (2.0 * rl_rng_uniform(7, t->off + j) - 1.0) +
			    (t->ndim == 2 ? 0.0 : 1.0));
		if ((rv = rl_model_set(m, i, buf)) != RL_OK)
			goto out;
		total += t->n;
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < NTOK; i++) {
			tok[i] = (int32_t)((i * 37 + pass * 11 + 5) % cfg->vocab_size);
			tgt[i] = i % T == T - 1 ? -1 : (int32_t)((i * 53 + pass * 7 + 2) % cfg->vocab_size);
			dlp[i] = tgt[i] < 0 ? 0.0f : (float)(2 * rl_rng_uniform(8, (uint64_t)(pass * NTOK + i)) - 1);
		}
		if ((rv = rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f)) != RL_OK ||
		    (rv = rl_model_backward(m, dlp, NULL)) != RL_OK)
			goto out;
	}
	out = rl_xmalloc(total * sizeof(float));
	total = 0;
	for (int i = 0; i < m->tt.n; i++) {
		if ((rv = rl_model_get(m, i, RL_MODEL_GRAD, out + total)) != RL_OK)
			goto out;
		total += m->tt.t[i].n;
	}
	*grads = out;
	*len = total;
	out = NULL;
out:
	free(out);
	free(buf);
	rl_model_close(m);
	return rv;
}

static void
test_model(const char *name, const char *json)
{
	rl_config cfg;
	rl_ops *plain = NULL, *add = NULL, *wrong = NULL;
	float *g0 = NULL, *g1 = NULL, *g2 = NULL;
	size_t n0 = 0, n1 = 0, n2 = 0;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	T_EQ_INT(rl_ops_cpu_open(&plain), RL_OK);
	T_EQ_INT(rl_ops_cpu_open(&add), RL_OK);
	T_EQ_INT(rl_ops_cpu_open(&wrong), RL_OK);
	if (!plain || !add || !wrong)
		goto out;
	plain->layernorm_bwd_add = NULL;
	plain->rmsnorm_bwd_add = NULL;
	add->layernorm_bwd_add = ln_count;
	add->rmsnorm_bwd_add = rms_count;
	wrong->layernorm_bwd_add = ln_wrong;
	wrong->rmsnorm_bwd_add = rms_wrong;
	for (int rc = 0; rc < 2; rc++) {
		long l0 = nln, r0 = nrms;
		T_EQ_INT(grads_of(plain, &cfg, rc, &g0, &n0), RL_OK);
		T_EQ_INT(grads_of(add, &cfg, rc, &g1, &n1), RL_OK);
		T_EQ_INT(grads_of(wrong, &cfg, rc, &g2, &n2), RL_OK);
		long calls = cfg.arch == RL_ARCH_GPT2 ? nln - l0 : nrms - r0;
		T_OK(calls == 2L * 2 * cfg.n_layer && (cfg.arch == RL_ARCH_GPT2 ? nrms == r0 : nln == l0),
		    "%s recompute=%d: the op called %ld times in 2 backwards of %d layers", name, rc, calls, cfg.n_layer);
		T_OK(g0 && g1 && n0 == n1 && same(g0, g1, n0),
		    "%s recompute=%d: gradients with the norm_bwd_add op the same as norm_bwd then add, bit for bit", name,
		    rc);
		T_OK(g0 && g2 && n0 == n2 && !same(g0, g2, n0), "%s recompute=%d: the control (an overwriting op) differs",
		    name, rc);
		free(g0); free(g1); free(g2);
		g0 = g1 = g2 = NULL;
	}
out:
	rl_ops_close(plain);
	rl_ops_close(add);
	rl_ops_close(wrong);
	rl_config_fini(&cfg);
}

int
main(void)
{
	rl_ops *o = NULL;

	T_BEGIN("test_norm_bwd_add");
	T_EQ_INT(rl_ops_cpu_open(&o), RL_OK);
	T_OK(o && o->layernorm_bwd_add == rl_cpu_layernorm_bwd_add && o->rmsnorm_bwd_add == rl_cpu_rmsnorm_bwd_add,
	    "the CPU backend has both ops");
	rl_ops_close(o);
	test_ops(1, 3, 1);
	test_ops(1, 7, 0);
	test_ops(5, 33, 1);
	test_ops(130, 24, 1);   /* rows over three of the reduction's chunks of 64 */
	test_ops(70, 96, 0);
	test_model("gpt2", gpt2_json);
	test_model("qwen2", qwen2_json);
	test_model("qwen3", qwen3_json);
	T_END();
}

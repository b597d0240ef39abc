/*
 * test_model_fuse.c — the model's decode fusions wired right, without a GPU: the CPU backend
 * given matmul_fused_fwd, rope_kv_write and matmul_rope_kv_fwd (the optional ops of lib/compute/ops.h
 * that the CUDA backend implements in kernels/fuse.cu) as compositions of its own ops, by
 * their contract (norm into xn, matmul, then add / gelu / swiglu; rope_fwd then kv_write;
 * the first then the second), against the
 * plain CPU backend.  With the same ops in the same order on the same numbers, the model
 * must give the same logits bit for bit at every prefill and decode step: a fused call with
 * the wrong norm weight, epilogue, scratch or residual shows as a difference.  GPT-2
 * (LayerNorm, GELU, no RoPE), Qwen2 (RMSNorm, qkv bias, SwiGLU, RoPE) and Qwen3 (q/k-norm);
 * batches of 1 to 4 sequences (fused) and 5 (the separate ops) in one run.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":97,"
    "\"n_embd\":32,\"n_layer\":2,\"n_head\":4,\"n_positions\":64,\"n_ctx\":64,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen2_json =
    "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":101,"
    "\"hidden_size\":32,\"intermediate_size\":40,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":64,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";
static const char *qwen3_json =
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":90,"
    "\"hidden_size\":32,\"intermediate_size\":24,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"max_position_embeddings\":64,\"rope_theta\":1000000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";

static long nfused, nropekv, nqkv;

/* matmul_fused_fwd by its contract in lib/compute/ops.h, from the backend's own ops */
static void
fused_ref(rl_ops *o, void *out, void *tmp, void *xn, const void *x, const void *nw, const void *nb, float eps,
    int norm, const void *w, const void *bias, int N, int C, int OC, int ep)
{
	static float mean[RL_FUSE_ROWS], rstd[RL_FUSE_ROWS];  /* the CPU norms write them */
	const void *in = x;
	nfused++;
	T_OK(N >= 1 && N <= RL_FUSE_ROWS, "matmul_fused_fwd of %d rows", N);
	if (N < 1 || N > RL_FUSE_ROWS)
		return;
	if (norm == RL_NORM_LN)
		o->layernorm_fwd(o, xn, mean, rstd, x, nw, nb, N, C, eps);
	else if (norm == RL_NORM_RMS)
		o->rmsnorm_fwd(o, xn, rstd, x, nw, N, C, eps);
	if (norm != RL_NORM_NONE)
		in = xn;
	o->matmul_fwd(o, ep == RL_EP_NONE ? out : tmp, in, w, bias, N, C, OC);
	if (ep == RL_EP_ADD)
		o->add(o, out, out, tmp, (size_t)N * OC);
	else if (ep == RL_EP_GELU)
		o->gelu_fwd(o, out, tmp, (size_t)N * OC);
	else if (ep == RL_EP_SWIGLU)
		o->swiglu_fwd(o, out, tmp, N, OC / 2);
}

static void
rope_kv_ref(rl_ops *o, void *kc, void *vc, void *qkv, const int32_t *pos, const int32_t *slot, int N, int NH,
    int NKV, int HD, rl_rope rope)
{
	nropekv++;
	if (rope.theta > 0)
		o->rope_fwd(o, qkv, pos, N, NH, NKV, HD, rope);
	o->kv_write(o, kc, vc, qkv, slot, N, NH, NKV, HD);
}

/* matmul_rope_kv_fwd: matmul_fused_fwd (RL_EP_NONE) then rope_kv_write, by its contract */
static void
qkv_ref(rl_ops *o, void *qkv, void *xn, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int NH, int NKV, int HD, rl_rope rope, const int32_t *pos,
    void *kc, void *vc, const int32_t *slot)
{
	long f = nfused, r = nropekv;
	fused_ref(o, qkv, NULL, xn, x, nw, nb, eps, norm, w, bias, N, C, (NH + 2 * NKV) * HD, RL_EP_NONE);
	rope_kv_ref(o, kc, vc, qkv, pos, slot, N, NH, NKV, HD, rope);
	nfused = f;
	nropekv = r;
	nqkv++;
}

/* The two backends' logits over a prefill of NSEQ prompts and NSTEP decode steps whose batch
 * cycles through 1..NSEQ sequences. */
static void
run(rl_ops *plain, rl_ops *fused, const char *name, const char *json)
{
	enum { NSEQ = 5, NSTEP = 24 };
	static const int np[NSEQ] = { 1, 4, 9, 2, 6 };
	rl_config cfg;
	rl_model *m[2] = { NULL, NULL };
	rl_ops *ops[2] = { plain, fused };
	rl_kvcache *kv[2] = { NULL, NULL };
	rl_kvseq s[2][NSEQ];
	float *lg[2] = { NULL, NULL }, *buf = NULL;
	int V, rv = RL_OK, same = 1, steps = 0;
	long f0 = nfused, r0 = nropekv, q0 = nqkv;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	V = cfg.vocab_size;
	for (int k = 0; k < 2; k++) {
		if ((rv = rl_model_init_random(&m[k], &cfg, ops[k], 5)) != RL_OK ||
		    (rv = rl_model_infer_reserve(m[k], 64, NSEQ)) != RL_OK ||
		    (rv = rl_kvcache_open(&kv[k], ops[k], &cfg, (size_t)1 << 20, 8)) != RL_OK)
			goto out;
		for (int i = 0; i < NSEQ; i++)
			rl_kvseq_init(&s[k][i], kv[k]);
		lg[k] = rl_xmalloc((size_t)NSEQ * V * sizeof(float));
	}
	/* every tensor redrawn (norm weights and biases too: a swapped ln_1 / ln_2 must show) */
	for (int i = 0; i < m[0]->tt.n; i++) {
		const rl_tensor *t = &m[0]->tt.t[i];
		free(buf);
		buf = rl_xmalloc(t->n * sizeof(float));
		for (size_t j = 0; j < t->n; j++)
			buf[j] = (float)((t->ndim == 2 ? 0.3 : 0.5) * (2.0 * rl_rng_uniform(7, t->off + j) - 1.0) +
			    (t->ndim == 2 ? 0.0 : 1.0));
		for (int k = 0; k < 2; k++)
			if ((rv = rl_model_set(m[k], i, buf)) != RL_OK)
				goto out;
	}
	for (int step = -1; step < NSTEP; step++) {
		rl_kvseq *sq[2][NSEQ];
		int32_t tk[NSEQ], p[NSEQ][9];
		const int32_t *pp[NSEQ];
		int B = step < 0 ? NSEQ : 1 + step % NSEQ;
		for (int i = 0; i < B; i++) {
			int q = (i + step + NSEQ) % NSEQ;  /* which sequences, in a changing order */
			if (step < 0)
				q = i;
			for (int k = 0; k < 2; k++)
				sq[k][i] = &s[k][q];
			tk[i] = (int32_t)((step * 31 + q * 17 + 3) % V);
			for (int j = 0; j < np[q]; j++)
				p[i][j] = (int32_t)((j * 13 + q * 7 + 1) % V);
			pp[i] = p[i];
		}
		for (int k = 0; k < 2; k++) {
			rv = step < 0 ? rl_model_prefill(m[k], kv[k], sq[k], pp, np, B, lg[k]) :
			    rl_model_decode(m[k], kv[k], sq[k], tk, B, lg[k]);
			if (rv != RL_OK)
				goto out;
		}
		if (memcmp(lg[0], lg[1], (size_t)B * V * sizeof(float)) != 0) {
			if (same)
				printf("%s: logits differ at step %d (batch %d)\n", name, step, B);
			same = 0;
		}
		steps++;
	}
out:
	T_EQ_INT(rv, RL_OK);
	T_OK(same && steps == NSTEP + 1, "%s: the same logits with the fused ops at %d of %d steps", name,
	    same ? steps : 0, NSTEP + 1);
	/* per decode step of <= 4 sequences: the QKV call (with q/k-norm: matmul_fused_fwd,
	 * then rope_kv_write), 3 more fused calls a layer and the head's one; RoPE models call
	 * rope_kv_write in every other block pass (prefill, 5 sequences) */
	long nq = nqkv - q0, nr = nropekv - r0, L = cfg.n_layer;
	T_OK(nfused - f0 > L * 3 * 10, "%s: matmul_fused_fwd called (%ld)", name, nfused - f0);
	T_OK(cfg.qk_norm ? nq == 0 : nq > L * 10, "%s: matmul_rope_kv_fwd called %ld times", name, nq);
	T_OK(cfg.arch == RL_ARCH_GPT2 ? nr == 0 : nr + nq == L * (NSTEP + 1), "%s: rope_kv_write called %ld times",
	    name, nr);
	for (int k = 0; k < 2; k++) {
		if (kv[k])
			for (int i = 0; i < NSEQ; i++)
				rl_kvcache_release(kv[k], &s[k][i]);
		rl_kvcache_close(kv[k]);
		rl_model_close(m[k]);
		free(lg[k]);
	}
	free(buf);
	rl_config_fini(&cfg);
}

int
main(void)
{
	rl_ops *plain = NULL, *fused = NULL;

	T_BEGIN("test_model_fuse");
	T_EQ_INT(rl_ops_cpu_open(&plain), RL_OK);
	T_EQ_INT(rl_ops_cpu_open(&fused), RL_OK);
	if (plain == NULL || fused == NULL)
		return 1;
	T_OK(plain->matmul_fused_fwd == NULL && plain->rope_kv_write == NULL && plain->matmul_rope_kv_fwd == NULL,
	    "the CPU backend leaves them NULL");
	fused->matmul_fused_fwd = fused_ref;
	fused->rope_kv_write = rope_kv_ref;
	fused->matmul_rope_kv_fwd = qkv_ref;
	run(plain, fused, "gpt2", gpt2_json);
	run(plain, fused, "qwen2", qwen2_json);
	run(plain, fused, "qwen3", qwen3_json);
	rl_ops_close(plain);
	rl_ops_close(fused);
	T_END();
}

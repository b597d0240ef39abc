/*
 * test_cuda_value_head.c — PPO's value head (model.h) on the CUDA backend
 * against the CPU reference: the same tiny random Qwen2 with the same head on
 * both, the values of a training forward, then the gradients of
 * L = sum_n c[n] value[n] (rl_model_backward_value with a zero log-prob
 * gradient) for the head's weight and bias and for trunk tensors the value
 * gradient reaches (final norm, an MLP projection, the embedding).
 *
 * Tolerances as test_cuda_model.c's (bf16 activations and compute weights on
 * the GPU, fp32 on the CPU): values O(1): atol 5e-2 + rtol 5e-2, NMSE 1e-3;
 * gradients per tensor atol 5e-2 * max|ref| + rtol 5e-2, NMSE 3e-3 (a missing
 * path or wrong index gives NMSE ~1).  Exit 77 without a GPU.
 *
 * Written in a session without a GPU: it compiles, it has not run.
 */
#include <math.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "compute/ops.h"
#include "test_cuda.h"

#define B 3
#define T 37
#define N (B * T)

static const char cfg_json[] =
    "{\"model_type\":\"qwen2\",\"vocab_size\":300,\"hidden_size\":64,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":96,"
    "\"max_position_embeddings\":64,\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";

static float
maxabs(const float *x, size_t n)
{
	float m = 0;
	for (size_t i = 0; i < n; i++)
		m = fmaxf(m, fabsf(x[i]));
	return m;
}

/* model on ops o with the head set to w, b; forward; backward of sum c*value */
static rl_model *
build(rl_ops *o, const rl_config *cfg, const float *w, float b, const int32_t *tok, const int32_t *tgt,
    const float *c, float *val)
{
	rl_model *m = NULL;
	float *d_c = NULL, *d_z = NULL, zero[N] = { 0 };

	if (rl_model_init_random(&m, cfg, o, 3) != 0 || rl_model_add_value_head(m, NULL, 4) != 0 ||
	    rl_model_train_reserve(m, N) != 0) {
		rl_model_close(m);
		return NULL;
	}
	rl_model_set(m, m->vh_w, w);
	rl_model_set(m, m->vh_b, &b);
	T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
	o->download(o, val, m->val, sizeof(float) * N);
	o->alloc(o, (void **)&d_c, sizeof(float) * N);
	o->alloc(o, (void **)&d_z, sizeof(float) * N);
	o->upload(o, d_c, c, sizeof(float) * N);
	o->upload(o, d_z, zero, sizeof(float) * N);
	T_EQ_INT(rl_model_backward_value(m, d_z, NULL, d_c), 0);
	T_EQ_INT(o->sync(o), 0);
	o->free(o, d_c);
	o->free(o, d_z);
	return m;
}

int
main(void)
{
	rl_ops *cpu = NULL, *gpu = NULL;
	rl_config cfg = { 0 };
	int32_t tok[N], tgt[N];
	float c[N], vc[N], vg[N], w[256];

	T_BEGIN("test_cuda_value_head");
	int rv = rl_ops_cuda_open(&gpu, 0);
	if (rv == RL_ENODEV || rv == RL_ENOTSUP)
		T_SKIP("no CUDA device (%s)", rl_strerror(rv));
	T_EQ_INT(rv, RL_OK);
	T_EQ_INT(rl_ops_cpu_open(&cpu), RL_OK);
	T_EQ_INT(rl_config_parse(&cfg, cfg_json, strlen(cfg_json), "config"), 0);
	if (!cpu || !gpu)
		T_END();
	tc_seed();
	for (int n = 0; n < N; n++) {
		tok[n] = tc_irand(cfg.vocab_size);
		tgt[n] = n % T == T - 1 ? -1 : tc_irand(cfg.vocab_size);
		c[n] = tgt[n] < 0 ? 0 : (float)(2 * tc_unif() - 1);
	}
	for (int j = 0; j < cfg.hidden_size; j++)
		w[j] = rl_bf16_to_f32(rl_f32_to_bf16((float)(0.5 * (2 * tc_unif() - 1))));
	rl_model *mc = build(cpu, &cfg, w, 0.25f, tok, tgt, c, vc);
	rl_model *mg = build(gpu, &cfg, w, 0.25f, tok, tgt, c, vg);
	T_OK(mc && mg, "models built");
	if (mc && mg) {
		tc_cmp("values", vg, vc, N, 5e-2, 5e-2, 1e-3);
		int idx[] = { mc->vh_w, mc->vh_b, mc->lnf_w, mc->layer[1].proj_w, mc->layer[0].qkv_w, mc->wte };
		for (size_t k = 0; k < RL_ARRAY_LEN(idx); k++) {
			const rl_tensor *t = &mc->tt.t[idx[k]];
			float *gc = rl_xmalloc(t->n * sizeof(float)), *gg = rl_xmalloc(t->n * sizeof(float));
			rl_model_get(mc, idx[k], RL_MODEL_GRAD, gc);
			rl_model_get(mg, idx[k], RL_MODEL_GRAD, gg);
			T_OK(maxabs(gc, t->n) > 0, "%s: CPU gradient is zero", t->name);
			tc_cmp(t->name, gg, gc, t->n, 5e-2 * maxabs(gc, t->n), 5e-2, 3e-3);
			free(gc);
			free(gg);
		}
	}
	rl_model_close(mc);
	rl_model_close(mg);
	rl_config_fini(&cfg);
	rl_ops_close(gpu);
	rl_ops_close(cpu);
	T_END();
}

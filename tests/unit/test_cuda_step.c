/*
 * test_cuda_step.c — the decode step in one kernel (ops->decode_step, kernels/step.cu,
 * RL_CUDA_DECODE_STEP=1) against the same model on the CPU and against the CUDA
 * backend's separate fused kernels (the default), through rl_model_decode_sample with
 * CUDA graphs (one step op by op, one recording, replays: the cooperative launch inside a
 * graph), one sequence decoding 70 tokens across cache blocks of 16 from a prompt of 5.
 * The input tokens are fixed (not the samples), so the three models see the same
 * sequence; after every step the logits (m->logits) are compared: NMSE against the CPU
 * under 5e-3 (test_cuda_decode's bound for the fused path: the bf16 rounding of every
 * activation and weight), and against the fused kernels under 1e-3 (the same device code
 * but for the order of attention's sums, so only bf16 rounding flips).  The greedy
 * tokens of the step kernel and the fused kernels agree on at least 90% of the steps (a
 * near tie may flip).  Then two steps of two new sequences, which the step kernel does not
 * take (RLK_STEP_ROWS 1): the separate kernels run and the logits equal the default
 * backend's bit for bit.  Models: GPT-2 shape (LayerNorm, GELU, biases, head_dim 64,
 * MHA), Qwen2 shapes (RMSNorm, SwiGLU, RoPE, qkv bias) with 7 query heads per KV head
 * at head_dim 64 and 2 at head_dim 128.  Exit 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":5003,"
    "\"n_embd\":128,\"n_layer\":2,\"n_head\":2,\"n_positions\":128,\"n_ctx\":128,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen_g7_json =
    "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":3001,"
    "\"hidden_size\":448,\"intermediate_size\":640,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":7,\"num_key_value_heads\":1,"
    "\"max_position_embeddings\":128,\"rope_theta\":1000000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}";
static const char *qwen_hd128_json =
    "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":2000,"
    "\"hidden_size\":512,\"intermediate_size\":512,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":128,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

enum { NPROMPT = 5, NSTEP = 70, NM = 3 };  /* models: 0 step kernel, 1 fused kernels, 2 CPU */

static void
nmse_of(const float *a, const float *ref, size_t n, double *nmse, double *mx)
{
	double se = 0, sr = 0;
	*mx = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - ref[i];
		se += d * d;
		sr += (double)ref[i] * ref[i];
		if (!(fabs(d) <= *mx))
			*mx = fabs(d);  /* NaN too */
	}
	*nmse = sr > 0 ? se / sr : 1.0;
	if (isnan(se))
		*nmse = INFINITY;
}

static int
argmax(const float *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* m->logits (B, V) on the host as floats */
static void
logits_of(rl_model *m, int B, float *out)
{
	size_t n = (size_t)B * m->cfg.vocab_size;
	if (m->ops->act_dtype == RL_F32) {
		m->ops->download(m->ops, out, m->logits, n * 4);
		return;
	}
	uint16_t *h = rl_xmalloc(n * 2);
	m->ops->download(m->ops, h, m->logits, n * 2);
	for (size_t i = 0; i < n; i++)
		out[i] = rl_bf16_to_f32(h[i]);
	free(h);
}

static void
one(rl_ops *ops[NM], const char *name, const char *json)
{
	rl_config cfg;
	rl_model *m[NM] = { NULL, NULL, NULL };
	rl_kvcache *kv[NM] = { NULL, NULL, NULL };
	rl_kvseq s[NM][3];
	float *lg[NM] = { NULL, NULL, NULL }, *buf = NULL;
	double worst_cpu = 0, worst_fused = 0, mx_cpu = 0, mx_fused = 0;
	int V, same_tok = 0, rv = RL_OK, bitwise = 1;
	rl_decode_stats d0;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	V = cfg.vocab_size;
	for (int k = 0; k < NM; k++) {
		if ((rv = rl_model_init_random(&m[k], &cfg, ops[k], 7)) != RL_OK ||
		    (rv = rl_model_infer_reserve(m[k], 64, 3)) != RL_OK ||
		    (rv = rl_kvcache_open(&kv[k], ops[k], &cfg, (size_t)8 << 20, 16)) != RL_OK)
			goto out;
		for (int i = 0; i < 3; i++)
			rl_kvseq_init(&s[k][i], kv[k]);
		lg[k] = rl_xmalloc((size_t)2 * V * sizeof(float));
	}
	/* larger weights than the init's 0.02 so that every layer moves the logits */
	for (int i = 0; i < m[0]->tt.n; i++) {
		const rl_tensor *t = &m[0]->tt.t[i];
		if (t->ndim != 2)
			continue;
		free(buf);
		buf = rl_xmalloc(t->n * sizeof(float));
		for (size_t j = 0; j < t->n; j++)
			buf[j] = (float)(0.12 * (2.0 * rl_rng_uniform(5, t->off + j) - 1.0));
		for (int k = 0; k < NM; k++)
			if ((rv = rl_model_set(m[k], i, buf)) != RL_OK)
				goto out;
	}
	{
		int32_t p[NPROMPT];
		const int32_t *pp[1] = { p };
		int np[1] = { NPROMPT };
		for (int j = 0; j < NPROMPT; j++)
			p[j] = (int32_t)((j * 389 + 11) % V);
		for (int k = 0; k < NM; k++) {
			rl_kvseq *sq[1] = { &s[k][0] };
			if ((rv = rl_model_prefill(m[k], kv[k], sq, pp, np, 1, NULL)) != RL_OK)
				goto out;
		}
	}
	d0 = m[0]->dstats;
	for (int step = 0; step < NSTEP; step++) {
		int32_t tk[1] = { (int32_t)((step * 131 + 7) % V) }, ot[1];
		float ol[1];
		uint64_t seed[1] = { 3 }, ctr[1] = { (uint64_t)step };
		const rl_sample_params greedy = { 0.0f, 0, 1.0f };
		double nm, mx;
		for (int k = 0; k < NM; k++) {
			rl_kvseq *sq[1] = { &s[k][0] };
			if ((rv = rl_model_decode_sample(m[k], kv[k], sq, tk, seed, ctr, 1, 0, &greedy, ot, ol)) != RL_OK)
				goto out;
			logits_of(m[k], 1, lg[k]);
		}
		nmse_of(lg[0], lg[2], (size_t)V, &nm, &mx);
		worst_cpu = fmax(worst_cpu, nm);
		mx_cpu = fmax(mx_cpu, mx);
		nmse_of(lg[0], lg[1], (size_t)V, &nm, &mx);
		worst_fused = fmax(worst_fused, nm);
		mx_fused = fmax(mx_fused, mx);
		same_tok += argmax(lg[0], V) == argmax(lg[1], V);
	}
	{
		rl_decode_stats d = m[0]->dstats;
		printf("%s: %d steps: step kernel vs CPU worst NMSE %.3g (max abs %.3g), vs fused kernels worst "
		    "NMSE %.3g (max abs %.3g), same greedy token %d of %d; onestep %llu captures %llu launches %llu "
		    "direct %llu\n", name, NSTEP, worst_cpu, mx_cpu, worst_fused, mx_fused, same_tok, NSTEP,
		    (unsigned long long)(d.onestep - d0.onestep), (unsigned long long)(d.captures - d0.captures),
		    (unsigned long long)(d.launches - d0.launches), (unsigned long long)(d.direct - d0.direct));
		T_OK(d.onestep - d0.onestep >= 1, "%s: the step kernel was not taken", name);
		if (ops[0]->graph_begin)
			T_OK(d.captures - d0.captures >= 1 && d.launches - d0.launches >= NSTEP - 2,
			    "%s: the step kernel's graph was not replayed", name);
	}
	T_OK(worst_cpu <= 5e-3, "%s: step kernel vs CPU: worst NMSE %.3g", name, worst_cpu);
	T_OK(worst_fused <= 1e-3, "%s: step kernel vs fused kernels: worst NMSE %.3g", name, worst_fused);
	T_OK(same_tok * 10 >= NSTEP * 9, "%s: greedy tokens agree on %d of %d steps", name, same_tok, NSTEP);

	/* two sequences: the separate kernels on both CUDA backends, bit for bit (two new
	 * sequences: sequence 0's cache rows past layer 0 differ in rounding between the two) */
	{
		int32_t p[2][3] = { { 1, 2, 3 }, { 4, 5, 6 } };
		const int32_t *pp[2] = { p[0], p[1] };
		int np[2] = { 3, 2 };
		for (int k = 0; k < 2; k++) {
			rl_kvseq *sq[2] = { &s[k][1], &s[k][2] };
			if ((rv = rl_model_prefill(m[k], kv[k], sq, pp, np, 2, NULL)) != RL_OK)
				goto out;
		}
		d0 = m[0]->dstats;
		for (int step = 0; step < 2; step++) {
			int32_t tk[2] = { 5, (int32_t)(9 + step) }, ot[2];
			float ol[2];
			uint64_t seed[2] = { 1, 2 }, ctr[2] = { 0, 0 };
			const rl_sample_params greedy = { 0.0f, 0, 1.0f };
			for (int k = 0; k < 2; k++) {
				rl_kvseq *sq[2] = { &s[k][1], &s[k][2] };
				if ((rv = rl_model_decode_sample(m[k], kv[k], sq, tk, seed, ctr, 2, 0, &greedy, ot, ol)) !=
				    RL_OK)
					goto out;
				logits_of(m[k], 2, lg[k]);
			}
			bitwise &= memcmp(lg[0], lg[1], (size_t)2 * V * sizeof(float)) == 0;
		}
		T_OK(m[0]->dstats.onestep == d0.onestep, "%s: two sequences went to the step kernel", name);
		T_OK(bitwise, "%s: two sequences: logits differ from the default backend's", name);
	}
out:
	T_EQ_INT(rv, RL_OK);
	for (int k = 0; k < NM; k++) {
		if (kv[k])
			for (int i = 0; i < 3; i++)
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
	rl_ops *ops[NM] = { NULL, NULL, NULL };
	int rv;

	T_BEGIN("test_cuda_step");
	rl_log_init("test_cuda_step", RL_LOG_QUIET);
	unsetenv("RL_CUDA_DECODE_STEP");
	if ((rv = rl_ops_cuda_open(&ops[1], 0)) != RL_OK)
		T_SKIP("no CUDA device (%s)", rl_strerror(rv));
	T_OK(ops[1]->decode_step == NULL, "decode_step is off by default");
	setenv("RL_CUDA_DECODE_STEP", "1", 1);
	T_EQ_INT(rl_ops_cuda_open(&ops[0], 0), RL_OK);
	unsetenv("RL_CUDA_DECODE_STEP");
	T_EQ_INT(rl_ops_cpu_open(&ops[2]), RL_OK);
	if (ops[0] && ops[2]) {
		T_OK(ops[0]->decode_step != NULL && ops[0]->decode_step_ok != NULL, "RL_CUDA_DECODE_STEP=1 sets decode_step");
		one(ops, "gpt2", gpt2_json);
		one(ops, "qwen2 G7 HD64", qwen_g7_json);
		one(ops, "qwen2 G2 HD128", qwen_hd128_json);
		T_OK(ops[0]->sync(ops[0]) == RL_OK, "step backend status");
	}
	for (int k = 0; k < NM; k++)
		rl_ops_close(ops[k]);
	T_END();
}

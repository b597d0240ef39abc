/*
 * test_decode_multi.c — multi-step decoding (rl_model_decode_multi) on the CPU backend:
 * n steps queued at once with the sampled tokens fed back by ops->decode_advance must give
 * the tokens and log-probabilities of n calls of rl_model_decode_sample bit for bit, and
 * leave the cache in the same state (lengths, and a step after them that agrees).  Four
 * sequences, two of them forked from one prompt (copy-on-write of a shared partial block),
 * block size 4 so that the n steps cross block boundaries (the slot of each step comes
 * from the block table on the backend), rows 0-2 sampled and row 3 greedy; GPT-2 (learned
 * positions) and Qwen3 (RoPE, q/k norm) shapes.  Also: the same without decode_advance (the
 * fallback through the host), and the errors: n < 1, a GPT-2 run past its positions, a
 * pool out of blocks.  The CUDA backend's kernel is checked the same way in
 * test_cuda_decode.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":300,"
    "\"n_embd\":64,\"n_layer\":2,\"n_head\":2,\"n_positions\":40,\"n_ctx\":40,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen3_json =
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":257,"
    "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
    "\"max_position_embeddings\":128,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

enum { B = 4, G = 3, NSTEP = 9 };

typedef struct run {
	rl_kvcache *kv;
	rl_kvseq s[B];
	rl_kvseq *sp[B];
} run;

/* four sequences: prompts of 3, 6 and 2 tokens, the fourth a fork of the second */
static int
start(rl_model *m, run *r)
{
	static const int np[3] = { 3, 6, 2 };
	int32_t p[3][6], *pp[3];
	rl_kvseq *ps[3];
	int rv;
	if ((rv = rl_kvcache_open(&r->kv, m->ops, &m->cfg, (size_t)1 << 20, 4)) != 0)
		return rv;
	for (int b = 0; b < B; b++) {
		rl_kvseq_init(&r->s[b], r->kv);
		r->sp[b] = &r->s[b];
	}
	for (int i = 0; i < 3; i++) {
		for (int j = 0; j < np[i]; j++)
			p[i][j] = (int32_t)((i * 53 + j * 17 + 5) % m->cfg.vocab_size);
		pp[i] = p[i];
		ps[i] = &r->s[i];
	}
	if ((rv = rl_model_prefill(m, r->kv, ps, (const int32_t *const *)pp, np, 3, NULL)) != 0)
		return rv;
	rl_kvcache_fork(r->kv, &r->s[3], &r->s[1]);
	return RL_OK;
}

static void
finish(run *r)
{
	for (int b = 0; b < B; b++)
		rl_kvcache_release(r->kv, &r->s[b]);
	rl_kvcache_close(r->kv);
}

/* NSTEP steps from tokens `first`: chunk 0 one call of rl_model_decode_sample a step, else
 * rl_model_decode_multi chunk steps at a time (the last call takes what is left) */
static int
steps(rl_model *m, run *r, int chunk, int32_t tok[NSTEP][B], float lp[NSTEP][B])
{
	static const int32_t first[B] = { 7, 11, 13, 17 };
	const uint64_t seed[B] = { 21, 22, 23, 24 };
	uint64_t ctr[B];
	rl_sample_params sp = { 0.8f, 0, 1.0f };
	const int32_t *cur = first;
	int rv;
	for (int st = 0; st < NSTEP;) {
		int n = chunk ? (NSTEP - st < chunk ? NSTEP - st : chunk) : 1;
		for (int b = 0; b < B; b++)
			ctr[b] = (uint64_t)st;
		rv = chunk ? rl_model_decode_multi(m, r->kv, r->sp, cur, seed, ctr, B, G, &sp, n, tok[st], lp[st])
		    : rl_model_decode_sample(m, r->kv, r->sp, cur, seed, ctr, B, G, &sp, tok[st], lp[st]);
		if (rv != RL_OK)
			return rv;
		cur = tok[st + n - 1];
		st += n;
	}
	return RL_OK;
}

static void
model(rl_ops *o, const char *name, const char *json)
{
	rl_config cfg;
	rl_model *m = NULL;
	int32_t ta[NSTEP][B], tb[NSTEP][B];
	float la[NSTEP][B], lb[NSTEP][B];
	run ra, rb;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	T_EQ_INT(rl_model_init_random(&m, &cfg, o, 5), RL_OK);
	if (!m) {
		rl_config_fini(&cfg);
		return;
	}
	T_EQ_INT(rl_model_infer_reserve(m, 16, B), RL_OK);
	T_EQ_INT(start(m, &ra), RL_OK);
	T_EQ_INT(steps(m, &ra, 0, ta, la), RL_OK);
	/* 4 then 4 then 1 steps: block boundaries inside a call, a call of one step */
	for (int chunk = 4; chunk <= 9; chunk += 5) {
		rl_decode_stats s0 = m->dstats;
		T_EQ_INT(start(m, &rb), RL_OK);
		T_EQ_INT(steps(m, &rb, chunk, tb, lb), RL_OK);
		T_OK(memcmp(ta, tb, sizeof ta) == 0 && memcmp(la, lb, sizeof la) == 0,
		    "%s: %d steps %d at a time differ from one at a time", name, NSTEP, chunk);
		T_OK(m->dstats.steps - s0.steps == NSTEP, "%s: %llu steps counted, %d made", name,
		    (unsigned long long)(m->dstats.steps - s0.steps), NSTEP);
		for (int b = 0; b < B; b++)
			T_OK(rb.s[b].len == ra.s[b].len, "%s: sequence %d: length %d after, %d one step at a time", name,
			    b, rb.s[b].len, ra.s[b].len);
		/* one more step on both: the caches hold the same */
		{
			int32_t t1[B], t2[B];
			float l1[B], l2[B];
			const uint64_t seed[B] = { 1, 2, 3, 4 }, ctr[B] = { 9, 9, 9, 9 };
			rl_sample_params sp = { 1.0f, 0, 1.0f };
			T_EQ_INT(rl_model_decode_sample(m, ra.kv, ra.sp, ta[NSTEP - 1], seed, ctr, B, B, &sp, t1, l1), RL_OK);
			T_EQ_INT(rl_model_decode_sample(m, rb.kv, rb.sp, tb[NSTEP - 1], seed, ctr, B, B, &sp, t2, l2), RL_OK);
			T_OK(memcmp(t1, t2, sizeof t1) == 0 && memcmp(l1, l2, sizeof l1) == 0,
			    "%s: the step after (chunks of %d): the caches differ", name, chunk);
			for (int b = 0; b < B; b++)
				rl_kvcache_truncate(ra.kv, &ra.s[b], ra.s[b].len - 1);
		}
		finish(&rb);
	}
	/* without decode_advance: step by step through the host, the same */
	{
		void (*adv)(rl_ops *, int32_t *, int32_t *, int32_t *, int32_t *, uint64_t *, const int32_t *,
		    const int32_t *, int, int, int) = o->decode_advance;
		o->decode_advance = NULL;
		T_EQ_INT(start(m, &rb), RL_OK);
		T_EQ_INT(steps(m, &rb, 5, tb, lb), RL_OK);
		T_OK(memcmp(ta, tb, sizeof ta) == 0 && memcmp(la, lb, sizeof la) == 0,
		    "%s: multi-step without decode_advance differs", name);
		finish(&rb);
		o->decode_advance = adv;
	}
	/* errors */
	{
		int32_t t[4 * B];
		float l[4 * B];
		const uint64_t seed[B] = { 0 }, ctr[B] = { 0 };
		rl_sample_params sp = { 1.0f, 0, 1.0f };
		int len1 = ra.s[1].len;
		T_EQ_INT(rl_model_decode_multi(m, ra.kv, ra.sp, ta[0], seed, ctr, B, G, &sp, 0, t, l), RL_EINVAL);
		T_EQ_INT(rl_model_decode_multi(m, ra.kv, ra.sp, ta[0], seed, ctr, B, B + 1, &sp, 2, t, l), RL_EINVAL);
		if (cfg.arch == RL_ARCH_GPT2) {
			/* sequence 1 is at 15 of 40 positions: 26 more steps pass them */
			int32_t *tt = malloc(26 * B * sizeof *tt);
			float *ll = malloc(26 * B * sizeof *ll);
			T_EQ_INT(rl_model_decode_multi(m, ra.kv, ra.sp, ta[0], seed, ctr, B, G, &sp, 26, tt, ll), RL_EINVAL);
			T_OK(ra.s[1].len == len1, "%s: a refused run changed a length", name);
			free(tt);
			free(ll);
		}
	}
	finish(&ra);
	rl_model_close(m);
	rl_config_fini(&cfg);
}

int
main(void)
{
	rl_ops *o = NULL;
	T_BEGIN("test_decode_multi");
	rl_log_init("test_decode_multi", RL_LOG_QUIET);
	T_EQ_INT(rl_ops_cpu_open(&o), RL_OK);
	if (o == NULL)
		T_END();
	T_OK(o->decode_advance != NULL, "the CPU backend has decode_advance");
	model(o, "gpt2", gpt2_json);
	model(o, "qwen3", qwen3_json);
	rl_ops_close(o);
	T_END();
}

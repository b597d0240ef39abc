/* test_engine_keep.c — KV reuse between the calls of a conversation
 * (rl_gen_req.keep_key, rl_gen_opts.keep_mem), against an engine that keeps
 * nothing and prefills every prompt whole:
 * - a follow-up whose prompt extends call 1's prompt and answer reuses the kept
 *   cache (reused_tokens = what it held) and samples the same tokens with the
 *   same log-probs (2e-5: the cache came from prefill and decode, not one prefill);
 * - a prompt that shares only a part is cut to it (truncation) and still equal;
 * - a kept cache gives way to a request that needs its blocks (evicted, the
 *   request runs); the keep budget is kept; set_version and forget drop caches. */
#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "t.h"

typedef struct out {
	int32_t tok[64];
	float lp[64];
	int n, count;
} out;

static int
collect(void *ctx, const rl_gen_sample *s)
{
	out *o = ctx;
	o->n = s->n;
	o->count++;
	memcpy(o->tok, s->tok, sizeof(int32_t) * (size_t)s->n);
	memcpy(o->lp, s->logp, sizeof(float) * (size_t)s->n);
	return 0;
}

/* One request of one sample to the end; its answer in *o. */
static int
call(rl_engine *e, const int32_t *p, int plen, uint64_t seed, uint64_t key, out *o)
{
	rl_sample_params sp = { 1.0f, 0, 1.0f };
	rl_gen_req q = { p, plen, 1, 0, 8, seed, NULL, &sp, NULL, 0, 0, key };
	int rv, guard = 0;

	memset(o, 0, sizeof *o);
	if ((rv = rl_engine_submit_req(e, &q)) != 0)
		return rv;
	while ((rl_engine_active(e) || rl_engine_waiting(e)) && guard++ < 1000)
		if ((rv = rl_engine_step(e, collect, o)) != 0)
			return rv;
	return o->count == 1 ? RL_OK : RL_EINVAL;
}

static void
same(const out *a, const out *b, const char *what)
{
	T_EQ_INT(a->n, b->n);
	T_OK(a->n == b->n && memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n) == 0, "%s: the same tokens", what);
	for (int i = 0; i < a->n && i < b->n; i++)
		T_CLOSE(a->lp[i], b->lp[i], 2e-5, 0);
}

int
main(void)
{
	rl_config cfg;
	rl_ops *ops;
	rl_model *m;
	rl_engine *k, *f;
	rl_gen_opts go;
	out a1, a2, b1, b2, a3, b3;
	int32_t p1[6] = { 5, 17, 99, 3, 42, 8 }, p2[64], p3[64];
	int n2 = 0, n3, caches, blocks;

	T_BEGIN("test_engine_keep");
	rl_log_init("test_engine_keep", RL_LOG_QUIET);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 48, .n_layer = 2, .n_head = 4,
		.n_kv_head = 2, .head_dim = 12, .intermediate_size = 96, .max_pos = 128, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	T_EQ_INT(rl_ops_cpu_open(&ops), RL_OK);
	T_EQ_INT(rl_model_init_random(&m, &cfg, ops, 7), RL_OK);
	rl_gen_opts_default(&go);
	go.slots = 4;
	go.block_size = 4;
	go.max_new = 8;
	/* a block: 2 layers x {k, v} x 4 tokens x 2 heads x 12 x 4 bytes = 1536 bytes; 20 blocks */
	go.kv_mem = 1536 * 20;
	T_EQ_INT(rl_engine_create(&f, m, NULL, &go), RL_OK);
	go.keep_mem = go.kv_mem;
	T_EQ_INT(rl_engine_create(&k, m, NULL, &go), RL_OK);

	/* ---- call 1, then a follow-up extending its prompt and answer ---- */
	T_EQ_INT(call(k, p1, 6, 11, 42, &a1), RL_OK);
	T_EQ_INT(call(f, p1, 6, 11, 0, &b1), RL_OK);
	same(&a1, &b1, "call 1");
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 1);
	T_EQ_INT(blocks, (6 + a1.n - 1 + 3) / 4);  /* prompt and answer but its last token */
	memcpy(p2, p1, sizeof p1);
	n2 = 6;
	memcpy(p2 + n2, a1.tok, sizeof(int32_t) * (size_t)a1.n);
	n2 += a1.n;
	p2[n2++] = 77;
	p2[n2++] = 78;
	p2[n2++] = 79;
	T_EQ_INT(call(k, p2, n2, 12, 42, &a2), RL_OK);
	T_EQ_INT(call(f, p2, n2, 12, 0, &b2), RL_OK);
	same(&a2, &b2, "follow-up");
	T_EQ_INT((int)rl_engine_stats_get(k)->reused_tokens, 6 + a1.n - 1);
	T_EQ_INT((int)rl_engine_stats_get(k)->reused_seqs, 1);
	T_EQ_INT((int)rl_engine_stats_get(k)->prefill_tokens, 6);
	T_EQ_INT((int)rl_engine_stats_get(f)->prefill_tokens, 6 + n2);

	/* ---- a prompt that leaves the history after 10 tokens: the cache is cut there ---- */
	memcpy(p3, p2, sizeof(int32_t) * 10);
	p3[10] = 200;
	p3[11] = 201;
	n3 = 12;
	T_EQ_INT(call(k, p3, n3, 13, 42, &a3), RL_OK);
	T_EQ_INT(call(f, p3, n3, 13, 0, &b3), RL_OK);
	same(&a3, &b3, "partial history");
	T_EQ_INT((int)rl_engine_stats_get(k)->reused_tokens, 6 + a1.n - 1 + 10);

	/* ---- a request that needs the kept blocks evicts them ---- */
	{
		int32_t big[60];
		out o;
		for (int i = 0; i < 60; i++)
			big[i] = (i * 37 + 11) % 300;
		/* blocks_for(60 + 8 - 1) = 17 > 20 - the 4 kept */
		rl_engine_kept(k, &caches, &blocks);
		T_EQ_INT(caches, 1);
		T_OK(blocks >= 4, "kept blocks %d", blocks);
		T_EQ_INT(call(k, big, 60, 14, 0, &o), RL_OK);
		T_EQ_INT(o.n, 8);
		T_EQ_INT((int)rl_engine_stats_get(k)->kept_evicted, 1);
		rl_engine_kept(k, &caches, &blocks);
		T_EQ_INT(caches, 0);
		T_EQ_INT(blocks, 0);
	}

	/* ---- a new version drops kept caches; so does forget ---- */
	T_EQ_INT(call(k, p1, 6, 11, 42, &a1), RL_OK);
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 1);
	rl_engine_set_version(k, 1);
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 0);
	T_EQ_INT(call(k, p1, 6, 11, 43, &a1), RL_OK);
	rl_engine_forget(k, 44);
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 1);
	rl_engine_forget(k, 43);
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 0);
	rl_engine_destroy(k);

	/* ---- the budget: 2 blocks hold no 4-block cache: nothing kept ---- */
	go.keep_mem = 1536 * 2;
	T_EQ_INT(rl_engine_create(&k, m, NULL, &go), RL_OK);
	T_EQ_INT(call(k, p1, 6, 11, 42, &a1), RL_OK);
	rl_engine_kept(k, &caches, &blocks);
	T_EQ_INT(caches, 0);
	T_EQ_INT(call(k, p2, n2, 12, 42, &a2), RL_OK);
	same(&a2, &b2, "follow-up without a kept cache");
	T_EQ_INT((int)rl_engine_stats_get(k)->reused_tokens, 0);
	rl_engine_destroy(k);

	rl_engine_destroy(f);
	rl_model_close(m);
	ops->close(ops);
	T_END();
}

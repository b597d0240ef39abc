/* test_engine_turns.c — the engine's multi-turn requests (rl_engine_submit_episode,
 * the turn callback, rl_engine_feed, rl_engine_end) against the model's own
 * training forward over the whole episode:
 * - the response holds the prefix, each turn's sampled tokens and the fed
 *   tokens in order; the mask is 1 exactly at the sampled ones, log-probs 0
 *   where it is 0;
 * - every sampled token's log-prob equals the training forward's over the
 *   whole sequence (prompt + response) at the sampling temperature (2e-5):
 *   feeding an observation in one forward (rl_model_extend, here in two
 *   chunks: 6 rows on 4 slots) puts the tokens in the cache where one forward
 *   would have them;
 * - only prompt + prefix are prefilled; the fed tokens are counted as such;
 * - an empty feed resumes at once; a feed past the episode limit is
 *   RL_ETOOBIG, one to a slot not waiting RL_EINVAL;
 * - a single-turn request in the same engine is finished as before (no mask). */
#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "t.h"
/* mix_sharpen only: the rest of the shared workload is test_engine's */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "engine_mix.h"

typedef struct ctx {
	int waiting[8], nwait;      /* slots whose turn ended, to feed or end */
	int turns[3];               /* turns ended, per user (1, 2) */
	int32_t tok[3][64];
	float lp[3][64];
	uint8_t mask[3][64];
	int n[3], done[3], has_mask[3];
} ctx;

static int
on_turn(void *c, const rl_gen_sample *s)
{
	ctx *x = c;
	int u = (int)(intptr_t)s->user;
	x->turns[u]++;
	x->waiting[x->nwait++] = s->slot * 4 + u;
	return 0;
}

static int
on_done(void *c, const rl_gen_sample *s)
{
	ctx *x = c;
	int u = (int)(intptr_t)s->user;
	x->done[u] = 1;
	x->n[u] = s->n;
	x->has_mask[u] = s->mask != NULL;
	memcpy(x->tok[u], s->tok, sizeof(int32_t) * (size_t)s->n);
	memcpy(x->lp[u], s->logp, sizeof(float) * (size_t)s->n);
	if (s->mask)
		memcpy(x->mask[u], s->mask, (size_t)s->n);
	return 0;
}

int
main(void)
{
	rl_config cfg;
	rl_ops *ops;
	rl_model *m;
	rl_engine *e;
	rl_gen_opts go;
	static ctx x;
	int32_t pa[] = { 5, 17, 99, 3, 42, 11, 12 }, pb[] = { 7, 8, 9 }, obs[] = { 20, 21, 22, 23, 24, 25 };

	T_BEGIN("test_engine_turns");
	rl_log_init("test_engine_turns", RL_LOG_QUIET);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 48, .n_layer = 2, .n_head = 4,
		.n_kv_head = 2, .head_dim = 12, .intermediate_size = 96, .max_pos = 64, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	T_EQ_INT(rl_ops_cpu_open(&ops), RL_OK);
	T_EQ_INT(rl_model_init_random(&m, &cfg, ops, 7), RL_OK);
	mix_sharpen(m, 3.0f);

	rl_gen_opts_default(&go);
	go.slots = 4;
	go.kv_mem = 1 << 20;
	go.block_size = 4;
	go.max_new = 5;          /* a turn */
	go.max_episode = 40;
	go.sp.temperature = 0.7f;
	T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
	rl_engine_set_turn(e, on_turn, &x);
	/* user 1: prompt pa[0..5) and a 2-token first observation; user 2: single-turn */
	T_EQ_INT(rl_engine_submit_episode(e, pa, 7, 5, 1, 3, NULL, 0, (void *)1), RL_OK);
	T_EQ_INT(rl_engine_submit(e, pb, 3, 1, 0, 4, 5, (void *)2), RL_OK);
	T_EQ_INT(rl_engine_feed(e, 0, obs, 3), RL_EINVAL);  /* nothing waits yet */
	for (int guard = 0; (rl_engine_active(e) || rl_engine_waiting(e)) && guard < 1000; guard++) {
		T_EQ_INT(rl_engine_step(e, on_done, &x), RL_OK);
		for (int i = 0; i < x.nwait; i++) {
			int slot = x.waiting[i] / 4, u = x.waiting[i] % 4;
			if (x.turns[u] == 1) {
				T_EQ_INT(rl_engine_feed(e, slot, obs, 6), RL_OK);
			} else if (x.turns[u] == 2) {
				T_EQ_INT(rl_engine_feed(e, slot, obs, 0), RL_OK);  /* straight on */
			} else if (x.turns[u] == 3) {
				int32_t big[40] = { 0 };
				T_EQ_INT(rl_engine_feed(e, slot, big, 40), RL_ETOOBIG);
				T_EQ_INT(rl_engine_feed(e, slot, obs + 2, 1), RL_OK);
			} else {
				T_EQ_INT(rl_engine_end(e, slot, RL_FINISH_EOS, on_done, &x), RL_OK);
			}
		}
		x.nwait = 0;
	}
	T_OK(x.done[1] && x.done[2]);
	T_EQ_INT(x.turns[1], 4);
	T_EQ_INT(x.turns[2], 0);
	T_OK(!x.has_mask[2] && x.n[2] == 4, "single-turn: n %d", x.n[2]);
	/* prefix 2, turn 5, obs 6, turn 5, (nothing), turn 5, obs 1, turn 5 */
	T_EQ_INT(x.n[1], 2 + 5 + 6 + 5 + 5 + 1 + 5);
	{
		static const int runs[][2] = { { 0, 2 }, { 1, 5 }, { 0, 6 }, { 1, 10 }, { 0, 1 }, { 1, 5 } };
		int pos = 0, bad = 0;
		for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
			for (int k = 0; k < runs[r][1]; k++, pos++)
				bad += x.mask[1][pos] != runs[r][0] || (!runs[r][0] && x.lp[1][pos] != 0.0f);
		T_EQ_INT(bad, 0);
		T_OK(x.tok[1][0] == 11 && x.tok[1][1] == 12 && x.tok[1][7] == 20 && x.tok[1][12] == 25 &&
		    x.tok[1][23] == 22, "inserted tokens in place");
	}
	const rl_engine_stats *st = rl_engine_stats_get(e);
	T_EQ_INT((int)st->prefill_tokens, 7 + 3);
	T_EQ_INT((int)st->fed_tokens, 6 + 1);
	rl_engine_destroy(e);

	/* the sampled tokens' log-probs: one training forward over the whole episode */
	T_EQ_INT(rl_model_train_reserve(m, 64), RL_OK);
	{
		int32_t tok[64], tgt[64];
		float lp[64];
		int L = 5 + x.n[1] - 1, nm = 0;
		double maxd = 0;
		for (int t = 0; t < L; t++) {
			tok[t] = t < 5 ? pa[t] : x.tok[1][t - 5];
			tgt[t] = t >= 4 ? x.tok[1][t - 4] : -1;
		}
		T_EQ_INT(rl_model_forward(m, lp, NULL, tok, tgt, NULL, NULL, 1, L, 0.7f), RL_OK);
		for (int j = 0; j < x.n[1]; j++)
			if (x.mask[1][j]) {
				maxd = fmax(maxd, fabs(lp[4 + j] - x.lp[1][j]));
				nm++;
			}
		T_EQ_INT(nm, 20);
		T_OK(maxd < 2e-5, "max |lp_engine - lp_train| over sampled tokens = %g", maxd);
	}
	rl_model_close(m);
	rl_ops_close(ops);
	T_END();
}

/* test_engine_req.c — requests with their own settings (rl_engine_submit_req),
 * as the OpenAI server submits them:
 * - three requests with different temperature / top-p (one greedy) decoded in
 *   one engine give, token for token, what each gives alone in an engine whose
 *   own settings are that request's (log-probs to 2e-5);
 * - the token callback sees every sampled token, in order, before the done
 *   callback of the sample;
 * - rl_engine_cancel removes a queued request without a callback (returns 1),
 *   and finishes a running one's sequences as RL_FINISH_ABORT, freeing their
 *   slots. */
#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "t.h"
/* mix_sharpen only: the rest of the shared workload is test_engine's */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "engine_mix.h"

#define MAXS 32
typedef struct out {
	int n[MAXS], finish[MAXS], index[MAXS];
	int32_t tok[MAXS][64];
	float lp[MAXS][64];
	void *user[MAXS];
	int count;
	/* token callback */
	int32_t seen[8][64];
	int nseen[8];
	int late;          /* tokens seen for a sample already reported done */
} out;

static int
collect(void *ctx, const rl_gen_sample *s)
{
	out *o = ctx;
	int k = o->count++;
	o->n[k] = s->n;
	o->finish[k] = s->finish;
	o->index[k] = s->index;
	o->user[k] = s->user;
	memcpy(o->tok[k], s->tok, sizeof(int32_t) * (size_t)s->n);
	memcpy(o->lp[k], s->logp, sizeof(float) * (size_t)s->n);
	return 0;
}

static void
on_token(void *ctx, void *user, int index, int32_t t, float lp)
{
	out *o = ctx;
	int u = (int)(intptr_t)user * 2 + index;
	(void)lp;
	for (int k = 0; k < o->count; k++)
		if (o->user[k] == user && o->index[k] == index)
			o->late++;
	if (u >= 0 && u < 8 && o->nseen[u] < 64)
		o->seen[u][o->nseen[u]++] = t;
}

static void
run(rl_engine *e, out *o)
{
	int guard = 0;
	while ((rl_engine_active(e) || rl_engine_waiting(e)) && guard++ < 10000)
		if (rl_engine_step(e, collect, o) != 0)
			break;
}

static int
find(const out *o, void *user, int index)
{
	for (int k = 0; k < o->count; k++)
		if (o->user[k] == user && o->index[k] == index)
			return k;
	return -1;
}

int
main(void)
{
	rl_config cfg;
	rl_ops *ops;
	rl_model *m;
	rl_engine *e;
	rl_gen_opts go;
	static out alone[3], mixed, c;
	int32_t p[3][4] = { { 5, 17, 99, 3 }, { 7, 7, 7, 8 }, { 1, 2, 3, 4 } };
	rl_sample_params sp[3] = { { 0.7f, 0, 0.9f }, { 1.3f, 0, 1.0f }, { 0.0f, 0, 1.0f } };

	T_BEGIN("test_engine_req");
	rl_log_init("test_engine_req", RL_LOG_QUIET);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 48, .n_layer = 2, .n_head = 4,
		.n_kv_head = 2, .head_dim = 12, .intermediate_size = 96, .max_pos = 40, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	T_EQ_INT(rl_ops_cpu_open(&ops), RL_OK);
	T_EQ_INT(rl_model_init_random(&m, &cfg, ops, 7), RL_OK);
	mix_sharpen(m, 3.0f);
	rl_gen_opts_default(&go);
	go.slots = 8;
	go.kv_mem = 1 << 20;
	go.block_size = 4;
	go.max_new = 16;

	/* ---- each setting alone, as the engine's own ---- */
	for (int i = 0; i < 3; i++) {
		rl_gen_opts g1 = go;
		g1.sp = sp[i];
		T_EQ_INT(rl_engine_create(&e, m, NULL, &g1), RL_OK);
		T_EQ_INT(rl_engine_submit(e, p[i], 4, 2, 0, 0, 100 + i, (void *)(intptr_t)i), RL_OK);
		run(e, &alone[i]);
		T_EQ_INT(alone[i].count, 2);
		rl_engine_destroy(e);
	}
	/* ---- all three at once, each with its own settings ---- */
	T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
	rl_engine_set_token(e, on_token, &mixed);
	for (int i = 0; i < 3; i++) {
		rl_gen_req q = { p[i], 4, 2, 0, 0, 100 + (uint64_t)i, (void *)(intptr_t)i, &sp[i], NULL, 0, 0, 0 };
		T_EQ_INT(rl_engine_submit_req(e, &q), RL_OK);
	}
	run(e, &mixed);
	T_EQ_INT(mixed.count, 6);
	T_EQ_INT(mixed.late, 0);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 2; j++) {
			int a = find(&alone[i], (void *)(intptr_t)i, j), b = find(&mixed, (void *)(intptr_t)i, j);
			T_OK(a >= 0 && b >= 0, "request %d sample %d", i, j);
			if (a < 0 || b < 0)
				continue;
			T_EQ_INT(mixed.n[b], alone[i].n[a]);
			T_OK(memcmp(mixed.tok[b], alone[i].tok[a], sizeof(int32_t) * (size_t)alone[i].n[a]) == 0,
			    "request %d sample %d: other tokens among other settings", i, j);
			for (int t = 0; t < alone[i].n[a]; t++)
				T_CLOSE(mixed.lp[b][t], alone[i].lp[a][t], 2e-5, 0);
			/* the token callback saw the same tokens */
			T_EQ_INT(mixed.nseen[i * 2 + j], mixed.n[b]);
			T_OK(memcmp(mixed.seen[i * 2 + j], mixed.tok[b], sizeof(int32_t) * (size_t)mixed.n[b]) == 0,
			    "token callback of request %d sample %d", i, j);
		}
	/* the two samples at temperature 1.3 differ, the greedy ones do not */
	{
		int a = find(&mixed, (void *)1, 0), b = find(&mixed, (void *)1, 1);
		T_OK(memcmp(mixed.tok[a], mixed.tok[b], sizeof(int32_t) * 16) != 0, "samples of a group differ");
		a = find(&mixed, (void *)2, 0), b = find(&mixed, (void *)2, 1);
		T_OK(memcmp(mixed.tok[a], mixed.tok[b], sizeof(int32_t) * (size_t)mixed.n[a]) == 0, "greedy ones agree");
	}
	rl_engine_destroy(e);

	/* ---- cancel: running (aborted through done), queued (removed, no callback) ---- */
	go.slots = 2;
	T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
	{
		rl_gen_req q0 = { p[0], 4, 2, 0, 0, 1, (void *)0, &sp[1], NULL, 0, 0, 0 };
		rl_gen_req q1 = { p[1], 4, 1, 0, 0, 2, (void *)1, NULL, NULL, 0, 0, 0 };
		T_EQ_INT(rl_engine_submit_req(e, &q0), RL_OK);
		T_EQ_INT(rl_engine_submit_req(e, &q1), RL_OK);
		for (int s = 0; s < 3; s++)
			T_EQ_INT(rl_engine_step(e, collect, &c), RL_OK);
		T_EQ_INT(rl_engine_active(e), 2);
		T_EQ_INT(rl_engine_waiting(e), 1);
		T_EQ_INT(rl_engine_cancel(e, (void *)1, collect, &c), 1);
		T_EQ_INT(rl_engine_waiting(e), 0);
		T_EQ_INT(c.count, 0);
		T_EQ_INT(rl_engine_cancel(e, (void *)0, collect, &c), 0);
		T_EQ_INT(c.count, 2);
		T_EQ_INT(c.finish[0], RL_FINISH_ABORT);
		T_EQ_INT(c.finish[1], RL_FINISH_ABORT);
		T_OK(c.n[0] >= 3 && c.n[0] < 16, "aborted after %d tokens", c.n[0]);
		T_EQ_INT(rl_engine_active(e), 0);
		/* unknown user: nothing */
		T_EQ_INT(rl_engine_cancel(e, (void *)7, collect, &c), 0);
		/* the slots serve the next request */
		T_EQ_INT(rl_engine_submit_req(e, &q1), RL_OK);
		run(e, &c);
		T_EQ_INT(c.count, 3);
		T_EQ_INT(c.n[2], 16);
	}
	rl_engine_destroy(e);
	rl_model_close(m);
	rl_ops_close(ops);
	T_END();
}

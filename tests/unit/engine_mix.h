/*
 * engine_mix.h — a generation workload for comparing decode paths bit for bit
 * (test_engine on the CPU, test_cuda_decode on the GPU): requests of several
 * prompt lengths, group sizes, response limits and greedy extras through an
 * engine with fewer slots than sequences, stop ids (one token in 23), so that sequences
 * finish at different steps and waiting requests are admitted while others
 * run (the batch size changes from step to step).  Between steps it changes a
 * weight tensor in place (and back at the end) and calls an optional hook (the
 * GPU test grows the backend's scratch there, which must make recorded graphs
 * stale).  Every sample is recorded in completion order.
 *
 * Paths: mix_run(..., legacy, no_graph): legacy 1 sets RL_DECODE_LEGACY for the
 * engine (rl_model_decode + ops->sample); no_graph sets m->no_graph.
 */
#ifndef RL_TEST_ENGINE_MIX_H
#define RL_TEST_ENGINE_MIX_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "t.h"

#define MIX_MAXS 96
#define MIX_MAXN 40

typedef struct mix_out {
	int count, steps;
	int n[MIX_MAXS], finish[MIX_MAXS], index[MIX_MAXS];
	void *user[MIX_MAXS];
	int32_t tok[MIX_MAXS][MIX_MAXN];
	float lp[MIX_MAXS][MIX_MAXN];
	rl_decode_stats ds;     /* the model's counters over the run */
} mix_out;

/* Every parameter of m times f (3 in the tests): a distribution that is not
 * flat, so greedy ties are unlikely and sampling differences show. */
static inline void
mix_sharpen(rl_model *m, float f)
{
	for (int i = 0; i < m->tt.n; i++) {
		float *buf = rl_xmalloc(sizeof(float) * m->tt.t[i].n);
		rl_model_get(m, i, RL_MODEL_PARAM, buf);
		for (size_t j = 0; j < m->tt.t[i].n; j++)
			buf[j] *= f;
		rl_model_set(m, i, buf);
		free(buf);
	}
}

static int
mix_collect(void *ctx, const rl_gen_sample *s)
{
	mix_out *o = ctx;
	if (o->count >= MIX_MAXS || s->n > MIX_MAXN)
		return RL_ETOOBIG;
	int k = o->count++;
	o->n[k] = s->n;
	o->finish[k] = s->finish;
	o->index[k] = s->index;
	o->user[k] = s->user;
	memcpy(o->tok[k], s->tok, sizeof(int32_t) * (size_t)s->n);
	memcpy(o->lp[k], s->logp, sizeof(float) * (size_t)s->n);
	return 0;
}

/* Runs the workload on m (weights restored after).  slots: engine slots;
 * hook(ctx) is called after step 7 when non-NULL.  Returns 0 or an error. */
static int
mix_run(rl_model *m, int slots, int legacy, int no_graph, void (*hook)(void *), void *hctx, mix_out *o)
{
	const int V = m->cfg.vocab_size;
	rl_gen_opts go;
	rl_engine *e = NULL;
	int32_t *stop = rl_xmalloc(sizeof(int32_t) * (size_t)(V / 23 + 1)), prompt[12];
	int nstop = 0;
	rl_decode_stats s0;
	int rv = 0, wt = m->lnf_w;
	size_t wn = m->tt.t[wt].n;
	float *w0 = rl_xmalloc(wn * sizeof(float)), *w1 = rl_xmalloc(wn * sizeof(float));
	memset(o, 0, sizeof *o);
	if ((rv = rl_model_get(m, wt, RL_MODEL_PARAM, w0)) != 0)
		goto out;
	for (size_t i = 0; i < wn; i++)
		w1[i] = w0[i] * 1.5f + 0.01f;
	if (legacy)
		setenv("RL_DECODE_LEGACY", "1", 1);
	else
		unsetenv("RL_DECODE_LEGACY");
	m->no_graph = no_graph;
	rl_gen_opts_default(&go);
	go.slots = slots;
	go.kv_mem = (size_t)4 << 20;
	go.block_size = 4;
	go.max_prefill_tokens = 64;
	go.max_new = 24;
	go.sp.temperature = 1.0f;
	go.sp.top_k = V > 64 ? 40 : 0;
	go.sp.top_p = 0.95f;
	/* one token in 23 ends a sequence: some stop early, some run to their limit */
	for (int v = 0; v < V; v += 23)
		stop[nstop++] = v;
	go.stop_ids = stop;
	go.nstop_ids = nstop;
	if ((rv = rl_engine_create(&e, m, NULL, &go)) != 0)
		goto out;
	for (int r = 0; r < 16; r++) {
		int plen = 1 + (r * 5) % 11, n = 1 + r % 4, greedy = r % 5 == 2, max_new = 3 + (r * 7) % 22;
		for (int i = 0; i < plen; i++)
			prompt[i] = (int32_t)((r * 131 + i * 17 + 5) % V);
		if ((rv = rl_engine_submit(e, prompt, plen, n, greedy, max_new, 1000 + (uint64_t)r,
		    (void *)(intptr_t)(r + 1))) != 0)
			goto out;
	}
	s0 = m->dstats;
	while (rl_engine_active(e) || rl_engine_waiting(e)) {
		if (o->steps > 400) {
			rv = RL_ETIMEDOUT;
			goto out;
		}
		if ((rv = rl_engine_step(e, mix_collect, o)) != 0)
			goto out;
		o->steps++;
		if (o->steps == 5 && (rv = rl_model_set(m, wt, w1)) != 0)
			goto out;
		if (o->steps == 7 && hook)
			hook(hctx);
	}
	o->ds.steps = m->dstats.steps - s0.steps;
	o->ds.captures = m->dstats.captures - s0.captures;
	o->ds.launches = m->dstats.launches - s0.launches;
	o->ds.direct = m->dstats.direct - s0.direct;
	o->ds.stale = m->dstats.stale - s0.stale;
out:
	rl_engine_destroy(e);
	if (rl_model_set(m, wt, w0) != 0 && rv == 0)
		rv = RL_EDEVICE;
	unsetenv("RL_DECODE_LEGACY");
	m->no_graph = 0;
	free(w0);
	free(w1);
	free(stop);
	return rv;
}

/* 1 when a and b hold the same samples, in the same order, bit for bit. */
static int
mix_same(const mix_out *a, const mix_out *b)
{
	if (a->count != b->count || a->count == 0)
		return 0;
	for (int k = 0; k < a->count; k++)
		if (a->n[k] != b->n[k] || a->finish[k] != b->finish[k] || a->index[k] != b->index[k] ||
		    a->user[k] != b->user[k] || memcmp(a->tok[k], b->tok[k], sizeof(int32_t) * (size_t)a->n[k]) ||
		    memcmp(a->lp[k], b->lp[k], sizeof(float) * (size_t)a->n[k]))
			return 0;
	return 1;
}

/* Samples that ended early (a stop id) and samples that ran to their limit: both kinds
 * must occur for the workload to mean anything. */
static void
mix_kinds(const mix_out *a, int *stopped, int *length)
{
	*stopped = *length = 0;
	for (int k = 0; k < a->count; k++) {
		*stopped += a->finish[k] == RL_FINISH_STOP;
		*length += a->finish[k] == RL_FINISH_LENGTH;
	}
}

#endif

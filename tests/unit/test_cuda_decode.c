/*
 * test_cuda_decode.c — the decode step on the CUDA backend through its three
 * paths, which must give the same samples bit for bit (same kernels, same
 * arguments, same order; only the way they are issued differs):
 *   L  rl_model_decode + ops->sample (RL_DECODE_LEGACY=1),
 *   P  rl_model_decode_sample op by op (m->no_graph = 1),
 *   G  rl_model_decode_sample with CUDA graphs (recorded per batch size, replayed),
 *   G2 the same again (graphs from G replayed where the cache is at the same address).
 * Workload (engine_mix.h): 16 requests, 43 sequences through 24 slots, stop ids
 * and per-request limits, so the batch size changes from step to step and
 * requests are admitted while others decode; a weight tensor changed in place
 * at step 5 (the graphs must read the new values); at step 7 the backend's GEMM
 * scratch is made to grow, which makes every graph recorded before stale (recorded
 * again when its key comes again).  Then six steps of 4 sequences straight through
 * rl_model_decode_sample, the scratch grown after step 3: exactly 1 step op by op,
 * 2 recordings, 5 replays, 1 stale graph, and the same samples as op by op.
 * Models: random GPT-2 shape with V = 50257 (the LM head goes through the split
 * and padded GEMM path at 21+ rows) and a Qwen3 shape (GQA, q/k-norm, RoPE),
 * both with head_dim 64 so that decode attention is the split kernel
 * (kernels/decode.cu) inside the graphs.  Exit 77 without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "engine_mix.h"
#include "kvcache.h"
#include "model.h"
#include "ops.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":50257,"
    "\"n_embd\":128,\"n_layer\":2,\"n_head\":2,\"n_positions\":128,\"n_ctx\":128,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen3_json =
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":1000,"
    "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,"
    "\"max_position_embeddings\":128,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

/* Grows the backend's padded-GEMM scratch (a GEMM whose output rows are not a
 * multiple of 8 elements), larger at each call. */
typedef struct grow { rl_ops *o; void *in, *w, *out; int calls; } grow;
#define GROW_C 64
#define GROW_OC 4099
#define GROW_N 600
#define GROW_MAX 16

static void
grow_scratch(void *ctx)
{
	grow *g = ctx;
	if (g->calls >= GROW_MAX)
		return;
	g->calls++;
	g->o->matmul_fwd(g->o, g->out, g->in, g->w, NULL, GROW_N * g->calls, GROW_C, GROW_OC);
}

/* Six decode steps of 4 sequences straight through rl_model_decode_sample (block size 8:
 * a cache shape the engine runs did not use, so the graph key is new), the scratch grown
 * after step 3.  Records the tokens and log-probs of each step. */
static int
six_steps(rl_model *m, grow *gr, int no_graph, int32_t tok[6][4], float lp[6][4], rl_decode_stats *ds)
{
	rl_kvcache *kv = NULL;
	rl_kvseq s[4], *sp[4];
	int32_t p[4][3], *pp[4], cur[4];
	int np[4] = { 3, 2, 3, 1 }, rv;
	uint64_t seed[4] = { 5, 6, 7, 8 }, ctr[4];
	rl_sample_params spar = { 0.9f, 0, 1.0f };
	rl_decode_stats s0 = m->dstats;

	if ((rv = rl_kvcache_open(&kv, m->ops, &m->cfg, (size_t)2 << 20, 8)) != 0)
		return rv;
	for (int b = 0; b < 4; b++) {
		rl_kvseq_init(&s[b], kv);
		sp[b] = &s[b];
		for (int i = 0; i < 3; i++)
			p[b][i] = (int32_t)((b * 37 + i * 11 + 1) % m->cfg.vocab_size);
		pp[b] = p[b];
		cur[b] = p[b][0];
	}
	m->no_graph = no_graph;
	if ((rv = rl_model_prefill(m, kv, sp, (const int32_t *const *)pp, np, 4, NULL)) != 0)
		goto out;
	for (int st = 0; st < 6; st++) {
		for (int b = 0; b < 4; b++)
			ctr[b] = (uint64_t)st;
		/* rows 0-2 sampled, row 3 greedy */
		if ((rv = rl_model_decode_sample(m, kv, sp, cur, seed, ctr, 4, 3, &spar, tok[st], lp[st])) != 0)
			goto out;
		memcpy(cur, tok[st], sizeof cur);
		if (st == 2)
			grow_scratch(gr);
	}
out:
	m->no_graph = 0;
	ds->steps = m->dstats.steps - s0.steps;
	ds->captures = m->dstats.captures - s0.captures;
	ds->launches = m->dstats.launches - s0.launches;
	ds->direct = m->dstats.direct - s0.direct;
	ds->stale = m->dstats.stale - s0.stale;
	for (int b = 0; b < 4; b++)
		rl_kvcache_release(kv, &s[b]);
	rl_kvcache_close(kv);
	return rv;
}

static void
one(rl_ops *o, grow *gr, const char *name, const char *json)
{
	rl_config cfg;
	rl_model *m = NULL;
	static mix_out L, P, G, G2;
	int st, len;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	T_EQ_INT(rl_model_init_random(&m, &cfg, o, 11), RL_OK);
	if (!m) {
		rl_config_fini(&cfg);
		return;
	}
	T_EQ_INT(mix_run(m, 24, 1, 0, grow_scratch, gr, &L), RL_OK);
	T_EQ_INT(mix_run(m, 24, 0, 1, grow_scratch, gr, &P), RL_OK);
	T_EQ_INT(mix_run(m, 24, 0, 0, grow_scratch, gr, &G), RL_OK);
	T_EQ_INT(mix_run(m, 24, 0, 0, grow_scratch, gr, &G2), RL_OK);
	mix_kinds(&L, &st, &len);
	printf("%s: %d samples (%d stopped early, %d at their limit) in %d steps\n", name, L.count, st, len,
	    L.steps);
	printf("%s: P steps %llu direct %llu | G steps %llu captures %llu launches %llu direct %llu stale %llu"
	    " | G2 captures %llu launches %llu\n", name, (unsigned long long)P.ds.steps,
	    (unsigned long long)P.ds.direct, (unsigned long long)G.ds.steps,
	    (unsigned long long)G.ds.captures, (unsigned long long)G.ds.launches,
	    (unsigned long long)G.ds.direct, (unsigned long long)G.ds.stale,
	    (unsigned long long)G2.ds.captures, (unsigned long long)G2.ds.launches);
	T_OK(st > 0 && len > 0, "%s: workload has early stops (%d) and full-length samples (%d)", name, st, len);
	T_OK(L.count == 43, "%s: %d samples, expected 43", name, L.count);
	T_OK(mix_same(&L, &P), "%s: packed decode step (no graph) differs from decode + sample", name);
	T_OK(mix_same(&L, &G), "%s: decode step with graphs differs from decode + sample", name);
	T_OK(mix_same(&L, &G2), "%s: replayed graphs differ from decode + sample", name);
	T_OK(L.ds.steps == 0, "%s: the legacy path went through decode_sample", name);
	T_OK(P.ds.steps > 20 && P.ds.launches == 0 && P.ds.direct == P.ds.steps, "%s: no-graph run", name);
	if (o->graph_begin) {
		/* each (batch size, greedy split) runs op by op once, then is recorded */
		T_OK(G.ds.captures > 0 && G.ds.launches > 0 && G.ds.direct + G.ds.launches == G.ds.steps,
		    "%s: graph run: %llu of %llu steps from graphs", name, (unsigned long long)G.ds.launches,
		    (unsigned long long)G.ds.steps);
		T_OK(G2.ds.launches > 0, "%s: second graph run replayed nothing", name);
	} else {
		T_OK(G.ds.launches == 0 && G.ds.direct == G.ds.steps, "%s: graphs off but launched", name);
	}
	/* a graph made stale by scratch growth is recorded again, with the same results */
	{
		int32_t ta[6][4], tb[6][4];
		float la[6][4], lb[6][4];
		rl_decode_stats da, db;
		T_EQ_INT(six_steps(m, gr, 1, ta, la, &da), RL_OK);
		T_EQ_INT(six_steps(m, gr, 0, tb, lb, &db), RL_OK);
		T_OK(memcmp(ta, tb, sizeof ta) == 0 && memcmp(la, lb, sizeof la) == 0,
		    "%s: six steps with graphs differ from op by op", name);
		printf("%s: six steps: captures %llu launches %llu direct %llu stale %llu\n", name,
		    (unsigned long long)db.captures, (unsigned long long)db.launches,
		    (unsigned long long)db.direct, (unsigned long long)db.stale);
		if (o->graph_begin)
			T_OK(db.direct == 1 && db.captures == 2 && db.launches == 5 && db.stale == 1,
			    "%s: six steps: expected 1 direct, 2 captures, 5 launches, 1 stale", name);
	}
	T_OK(o->sync(o) == RL_OK, "%s: backend status", name);
	rl_model_close(m);
	rl_config_fini(&cfg);
}

int
main(void)
{
	rl_ops *o = NULL;
	grow gr;
	int rv;

	T_BEGIN("test_cuda_decode");
	rl_log_init("test_cuda_decode", RL_LOG_QUIET);
	if ((rv = rl_ops_cuda_open(&o, 0)) != RL_OK)
		T_SKIP("no CUDA device (%s)", rl_strerror(rv));
	if (!o->graph_begin)
		printf("note: RL_CUDA_GRAPH=0 or profiling: graphs off, the G runs go op by op\n");
	memset(&gr, 0, sizeof gr);
	gr.o = o;
	size_t es = rl_dtype_size(o->act_dtype);
	T_EQ_INT(o->alloc(o, &gr.in, (size_t)GROW_N * GROW_MAX * GROW_C * es), RL_OK);
	T_EQ_INT(o->alloc(o, &gr.w, (size_t)GROW_OC * GROW_C * es), RL_OK);
	T_EQ_INT(o->alloc(o, &gr.out, (size_t)GROW_N * GROW_MAX * GROW_OC * es), RL_OK);
	o->zero(o, gr.in, (size_t)GROW_N * GROW_MAX * GROW_C * es);
	o->zero(o, gr.w, (size_t)GROW_OC * GROW_C * es);
	one(o, &gr, "gpt2", gpt2_json);
	one(o, &gr, "qwen3", qwen3_json);
	o->free(o, gr.in);
	o->free(o, gr.w);
	o->free(o, gr.out);
	rl_ops_close(o);
	T_END();
}

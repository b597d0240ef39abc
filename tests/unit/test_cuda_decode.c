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
 * scratch is made to grow, which makes every graph recorded before stale (counted
 * when its key comes again, then recorded again).  Models: random GPT-2 shape with V = 50257 (the LM head goes
 * through the split and padded GEMM path at 21+ rows) and a Qwen3 shape (GQA,
 * q/k-norm, RoPE).  Exit 77 without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "engine_mix.h"
#include "model.h"
#include "ops.h"
#include "t.h"

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":50257,"
    "\"n_embd\":64,\"n_layer\":2,\"n_head\":4,\"n_positions\":128,\"n_ctx\":128,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen3_json =
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":1000,"
    "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
    "\"max_position_embeddings\":128,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-06,"
    "\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

/* Grows the backend's padded-GEMM scratch (a GEMM whose output rows are not a
 * multiple of 8 elements), larger at each call. */
typedef struct grow { rl_ops *o; void *in, *w, *out; int calls; } grow;
#define GROW_C 64
#define GROW_OC 4099
#define GROW_N 600
#define GROW_MAX 5

static void
grow_scratch(void *ctx)
{
	grow *g = ctx;
	if (g->calls >= GROW_MAX)
		return;
	g->calls++;
	g->o->matmul_fwd(g->o, g->out, g->in, g->w, NULL, GROW_N * g->calls, GROW_C, GROW_OC);
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
		T_OK(G.ds.stale + G2.ds.stale > 0, "%s: scratch growth made no graph stale", name);
		T_OK(G2.ds.launches > 0, "%s: second graph run replayed nothing", name);
	} else {
		T_OK(G.ds.launches == 0 && G.ds.direct == G.ds.steps, "%s: graphs off but launched", name);
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

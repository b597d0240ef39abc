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
 * (kernels/decode.cu) inside the graphs.
 * Before that, vs_cpu: the decode logits against the CPU reference model (the
 * paths above all use the same kernels, so only this checks the split kernel and
 * add_norm_fwd inside the model).  Everything runs twice, on two backends: first
 * with the kernels that ran on a GPU before (RL_CUDA_DECODE_ATTN=v1,
 * RL_CUDA_ADD_NORM=0: the graph machinery on its own, Qwen3 only), then with the
 * defaults, then with RL_CUDA_DECODE_ATTN=wide; lines of the first pass are tagged
 * "[v1, no add_norm]", of the last "[wide]".
 * Exit 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "engine_mix.h"
#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"
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
 * after step 3.  Records the tokens and log-probs of each step.  multi: the steps three at a
 * time through rl_model_decode_multi instead (the scratch grown between the two calls). */
static int
six_steps(rl_model *m, grow *gr, int no_graph, int32_t tok[6][4], float lp[6][4], rl_decode_stats *ds, int multi)
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
	for (int st = 0; st < 6; st += multi ? 3 : 1) {
		for (int b = 0; b < 4; b++)
			ctr[b] = (uint64_t)st;
		/* rows 0-2 sampled, row 3 greedy */
		if (multi)
			rv = rl_model_decode_multi(m, kv, sp, cur, seed, ctr, 4, 3, &spar, 3, tok[st], lp[st]);
		else
			rv = rl_model_decode_sample(m, kv, sp, cur, seed, ctr, 4, 3, &spar, tok[st], lp[st]);
		if (rv != 0)
			goto out;
		memcpy(cur, tok[multi ? st + 2 : st], sizeof cur);
		if (st == 2 || (multi && st == 0))
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

/* Teacher-forced decode on the backend against the same model on the CPU reference:
 * three sequences (prompts of 1, 5 and 17 tokens) prefilled, then 80 decode steps of
 * fixed tokens with the batch varying between 1, 2 and 3 sequences (the split kernel's
 * nsplit changes with it: 64, 64, 44 on an H100), contexts from 2 to 97.  The 2-D
 * weights are redrawn uniform in [-0.17, 0.17) (std 0.1, five times the default init)
 * so that attention is sharp: at the init's scale the scores are near zero and
 * attention is nearly a plain mean of V, which would hide a wrong query/key pairing.
 * Logits (up to ~6) compared by NMSE <= 5e-3, measured on the CPU: a CPU backend
 * rounding every activation and the matmul weights to bf16 gives NMSE 9e-5 (max abs
 * 0.07); an attn_decode that skips the newest key gives 4e-2 and 6e-2, one that pairs
 * each query head with the next head's query 0.9 and 0.7.  Max abs diff printed.  Checks the split decode attention and add_norm_fwd inside
 * the model (test_cuda_ops checks them as ops; the paths compared bit for bit in
 * one() all use the same kernels). */
static void
vs_cpu(rl_ops *o, rl_ops *cpu, const char *name, const char *json, const char *tag)
{
	enum { NSEQ = 3, NSTEP = 80 };
	static const int np[NSEQ] = { 1, 5, 17 };
	rl_config cfg;
	rl_model *m[2] = { NULL, NULL };
	rl_ops *ops[2] = { o, cpu };
	rl_kvcache *kv[2] = { NULL, NULL };
	rl_kvseq s[2][NSEQ];
	float *lg[2] = { NULL, NULL }, *buf = NULL;
	double se = 0, sr = 0, mx = 0;
	int V, rv = RL_OK;

	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, json, strlen(json), name), RL_OK);
	V = cfg.vocab_size;
	for (int k = 0; k < 2; k++) {
		if ((rv = rl_model_init_random(&m[k], &cfg, ops[k], 11)) != RL_OK ||
		    (rv = rl_model_infer_reserve(m[k], 64, NSEQ)) != RL_OK ||
		    (rv = rl_kvcache_open(&kv[k], ops[k], &cfg, (size_t)4 << 20, 16)) != RL_OK)
			goto out;
		for (int i = 0; i < NSEQ; i++)
			rl_kvseq_init(&s[k][i], kv[k]);
		lg[k] = rl_xmalloc((size_t)NSEQ * V * sizeof(float));
	}
	for (int i = 0; i < m[0]->tt.n; i++) {
		const rl_tensor *t = &m[0]->tt.t[i];
		if (t->ndim != 2)
			continue;
		free(buf);
		buf = rl_xmalloc(t->n * sizeof(float));
		for (size_t j = 0; j < t->n; j++)
			buf[j] = (float)(0.17 * (2.0 * rl_rng_uniform(99, t->off + j) - 1.0));
		for (int k = 0; k < 2; k++)
			if ((rv = rl_model_set(m[k], i, buf)) != RL_OK)
				goto out;
	}
	for (int step = -1; step < NSTEP; step++) {
		rl_kvseq *sq[2][NSEQ];
		int32_t tk[NSEQ], p[NSEQ][17];
		const int32_t *pp[NSEQ];
		int B = 0;
		for (int i = 0; i < NSEQ; i++) {
			/* all three mostly; only the first, or the last two, every few steps */
			if (step >= 0 && ((step % 7 == 3 && i > 0) || (step % 7 != 3 && step % 11 == 5 && i == 0)))
				continue;
			for (int k = 0; k < 2; k++)
				sq[k][B] = &s[k][i];
			tk[B] = (int32_t)((step * 131 + i * 977 + 7) % V);
			for (int j = 0; j < np[i]; j++)
				p[B][j] = (int32_t)((j * 389 + i * 53 + 1) % V);
			pp[B] = p[B];
			B++;
		}
		for (int k = 0; k < 2; k++) {
			rv = step < 0 ? rl_model_prefill(m[k], kv[k], sq[k], pp, np, B, lg[k]) :
			    rl_model_decode(m[k], kv[k], sq[k], tk, B, lg[k]);
			if (rv != RL_OK)
				goto out;
		}
		for (size_t j = 0; j < (size_t)B * V; j++) {
			double d = (double)lg[0][j] - lg[1][j];
			se += d * d;
			sr += (double)lg[1][j] * lg[1][j];
			mx = fmax(mx, fabs(d));
		}
	}
out:
	T_EQ_INT(rv, RL_OK);
	{
		double nmse = sr > 0 ? se / sr : 1.0;
		T_OK(rv == RL_OK && nmse <= 5e-3, "%s%s: decode logits vs the CPU: NMSE %.3g (max abs diff %.3g)",
		    name, tag, nmse, mx);
		printf("%s%s: decode logits vs the CPU over %d steps: NMSE %.3g, max abs diff %.3g\n", name, tag,
		    NSTEP, nmse, mx);
	}
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
		T_EQ_INT(six_steps(m, gr, 1, ta, la, &da, 0), RL_OK);
		T_EQ_INT(six_steps(m, gr, 0, tb, lb, &db, 0), RL_OK);
		T_OK(memcmp(ta, tb, sizeof ta) == 0 && memcmp(la, lb, sizeof la) == 0,
		    "%s: six steps with graphs differ from op by op", name);
		/* multi-step decoding: the tokens fed back on the device, the same bits */
		{
			int32_t tm[6][4];
			float lm[6][4];
			rl_decode_stats dm;
			T_EQ_INT(six_steps(m, gr, 0, tm, lm, &dm, 1), RL_OK);
			T_OK(memcmp(ta, tm, sizeof ta) == 0 && memcmp(la, lm, sizeof la) == 0,
			    "%s: six steps, three at a time (rl_model_decode_multi), differ from one at a time", name);
			T_OK(dm.steps == 6, "%s: multi-step: %llu steps counted, 6 expected", name,
			    (unsigned long long)dm.steps);
			printf("%s: six steps three at a time: captures %llu launches %llu direct %llu stale %llu\n", name,
			    (unsigned long long)dm.captures, (unsigned long long)dm.launches,
			    (unsigned long long)dm.direct, (unsigned long long)dm.stale);
		}
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

/* Both checks on one backend: vs_cpu for both models, then one() for the models in
 * `which` (1 gpt2, 2 qwen3, 3 both), with the scratch-growing GEMM's buffers. */
static void
run_all(rl_ops *o, rl_ops *cpu, const char *tag, int which)
{
	grow gr;
	size_t es = rl_dtype_size(o->act_dtype);

	if (!o->graph_begin)
		printf("note: RL_CUDA_GRAPH=0 or profiling: graphs off, the G runs go op by op\n");
	vs_cpu(o, cpu, "gpt2", gpt2_json, tag);
	vs_cpu(o, cpu, "qwen3", qwen3_json, tag);
	memset(&gr, 0, sizeof gr);
	gr.o = o;
	T_EQ_INT(o->alloc(o, &gr.in, (size_t)GROW_N * GROW_MAX * GROW_C * es), RL_OK);
	T_EQ_INT(o->alloc(o, &gr.w, (size_t)GROW_OC * GROW_C * es), RL_OK);
	T_EQ_INT(o->alloc(o, &gr.out, (size_t)GROW_N * GROW_MAX * GROW_OC * es), RL_OK);
	o->zero(o, gr.in, (size_t)GROW_N * GROW_MAX * GROW_C * es);
	o->zero(o, gr.w, (size_t)GROW_OC * GROW_C * es);
	if (which & 1)
		one(o, &gr, "gpt2", gpt2_json);
	if (which & 2)
		one(o, &gr, "qwen3", qwen3_json);
	o->free(o, gr.in);
	o->free(o, gr.w);
	o->free(o, gr.out);
}

int
main(void)
{
	rl_ops *o = NULL, *cpu = NULL;
	int rv;

	T_BEGIN("test_cuda_decode");
	rl_log_init("test_cuda_decode", RL_LOG_QUIET);
	if ((rv = rl_ops_cuda_open(&o, 0)) != RL_OK)
		T_SKIP("no CUDA device (%s)", rl_strerror(rv));
	rl_ops_close(o);
	o = NULL;
	T_EQ_INT(rl_ops_cpu_open(&cpu), RL_OK);
	/* First the kernels that ran on a GPU before (v1 decode attention, add then norm),
	 * so that the graph machinery is checked on its own even if a new kernel faults
	 * and takes the context down; then the defaults (split decode attention, add_norm). */
	setenv("RL_CUDA_DECODE_ATTN", "v1", 1);
	setenv("RL_CUDA_ADD_NORM", "0", 1);
	if (cpu && rl_ops_cuda_open(&o, 0) == RL_OK) {
		printf("-- RL_CUDA_DECODE_ATTN=v1 RL_CUDA_ADD_NORM=0\n");
		T_OK(o->add_norm_fwd == NULL, "RL_CUDA_ADD_NORM=0 leaves add_norm_fwd out");
		run_all(o, cpu, " [v1, no add_norm]", 2);
		T_OK(o->sync(o) == RL_OK, "backend status after the v1 run");
		rl_ops_close(o);
	} else {
		T_OK(0, "cannot open the CUDA and CPU backends");
	}
	unsetenv("RL_CUDA_DECODE_ATTN");
	unsetenv("RL_CUDA_ADD_NORM");
	o = NULL;
	if (cpu && rl_ops_cuda_open(&o, 0) == RL_OK) {
		printf("-- defaults\n");
		run_all(o, cpu, "", 3);
		rl_ops_close(o);
	} else {
		T_OK(0, "cannot reopen the CUDA backend");
	}
	/* then decode.cu's wide kernel (RL_CUDA_DECODE_ATTN=wide: never run on a GPU yet)
	 * inside the model and the graphs */
	setenv("RL_CUDA_DECODE_ATTN", "wide", 1);
	o = NULL;
	if (cpu && rl_ops_cuda_open(&o, 0) == RL_OK) {
		printf("-- RL_CUDA_DECODE_ATTN=wide\n");
		run_all(o, cpu, " [wide]", 3);
		T_OK(o->sync(o) == RL_OK, "backend status after the wide run");
		rl_ops_close(o);
	} else {
		T_OK(0, "cannot reopen the CUDA backend (wide)");
	}
	unsetenv("RL_CUDA_DECODE_ATTN");
	rl_ops_close(cpu);
	T_END();
}

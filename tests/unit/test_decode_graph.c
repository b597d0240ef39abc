/*
 * test_decode_graph.c — the model's use of backend graphs in the decode step
 * (rl_model_decode_sample), tested on the CPU with a recording backend: the
 * CPU backend wrapped so that graph_begin starts recording the ops the decode
 * step issues (with their arguments, not run), graph_launch runs the recorded
 * list again and graph_ok turns 0 after a simulated scratch move.  A replay
 * sees exactly the pointers and sizes of the recording, as a CUDA graph does,
 * so anything the model passed by value that changes from step to step (a
 * context length, an offset, a batch-dependent pointer) would give other
 * samples than the op-by-op path; the test compares, bit for bit:
 *   - the engine workload of engine_mix.h through the legacy path
 *     (rl_model_decode + sample) and through recorded graphs, with a scratch
 *     move after step 7 (graphs stale, recorded again) and one batch size
 *     whose recording fails (that key must run op by op for good);
 *   - the counters: recordings, replays, stale graphs, op-by-op steps;
 *   - a batch size recorded only after several runs op by op (m->graph_after).
 * Also checks that nothing uploads, downloads, synchronises or allocates
 * while recording.  The same checks on the real CUDA graphs are in
 * test_cuda_decode.c.
 */
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "base/core.h"
#include "engine_mix.h"
#include "model/model.h"
#include "compute/ops.h"
#include "t.h"

enum { C_EMBED, C_LN, C_RMS, C_MM, C_QKN, C_ROPE, C_KVW, C_ATT, C_ADD, C_GELU, C_SWIGLU, C_COPY, C_SAMPLE };

typedef struct call {
	int op;
	void *p[8];
	int i[8];
	float f;
	rl_rope rope;
	size_t z;
	rl_sample_params sp;
} call;

typedef struct fgraph {
	call *c;
	int n, cap;
	unsigned epoch;
	int fail;          /* recorded a batch size that is made to fail */
} fgraph;

static rl_ops *base;       /* the CPU backend */
static rl_ops fake;        /* base with recording ops */
static fgraph *rec;        /* recording into, or NULL */
static unsigned epoch;     /* bumped to make graphs stale */
static int fail_B = -1;    /* graph_end fails for this batch size */
static int bad_calls;      /* upload/download/sync/alloc/free while recording */
static int nrec_ops;       /* ops recorded in all */

static call *
add_call(int op)
{
	if (rec->n == rec->cap) {
		rec->cap = rec->cap ? 2 * rec->cap : 64;
		call *nc = realloc(rec->c, (size_t)rec->cap * sizeof *rec->c);
		if (!nc)
			abort();
		rec->c = nc;
	}
	call *c = &rec->c[rec->n++];
	memset(c, 0, sizeof *c);
	c->op = op;
	nrec_ops++;
	return c;
}

#define P(k) (c->p[k])
#define I(k) (c->i[k])

static void
f_embed(rl_ops *o, void *out, const int32_t *tok, const int32_t *pos, const void *wte, const void *wpe, int N, int C)
{
	if (!rec) {
		base->embed_fwd(base, out, tok, pos, wte, wpe, N, C);
		return;
	}
	call *c = add_call(C_EMBED);
	P(0) = out; P(1) = (void *)tok; P(2) = (void *)pos; P(3) = (void *)wte; P(4) = (void *)wpe;
	I(0) = N; I(1) = C;
	if (N == fail_B)
		rec->fail = 1;
}

static void
f_ln(rl_ops *o, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b, int N, int C,
    float eps)
{
	if (!rec) {
		base->layernorm_fwd(base, out, mean, rstd, x, w, b, N, C, eps);
		return;
	}
	call *c = add_call(C_LN);
	P(0) = out; P(1) = mean; P(2) = rstd; P(3) = (void *)x; P(4) = (void *)w; P(5) = (void *)b;
	I(0) = N; I(1) = C; c->f = eps;
}

static void
f_rms(rl_ops *o, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps)
{
	if (!rec) {
		base->rmsnorm_fwd(base, out, rstd, x, w, N, C, eps);
		return;
	}
	call *c = add_call(C_RMS);
	P(0) = out; P(1) = rstd; P(2) = (void *)x; P(3) = (void *)w;
	I(0) = N; I(1) = C; c->f = eps;
}

static void
f_mm(rl_ops *o, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC)
{
	if (!rec) {
		base->matmul_fwd(base, out, inp, w, bias, N, C, OC);
		return;
	}
	call *c = add_call(C_MM);
	P(0) = out; P(1) = (void *)inp; P(2) = (void *)w; P(3) = (void *)bias;
	I(0) = N; I(1) = C; I(2) = OC;
}

static void
f_qkn(rl_ops *o, void *qo, float *rstd, const void *qi, const void *wq, const void *wk, int N, int NH, int NKV,
    int HD, float eps)
{
	if (!rec) {
		base->qknorm_fwd(base, qo, rstd, qi, wq, wk, N, NH, NKV, HD, eps);
		return;
	}
	call *c = add_call(C_QKN);
	P(0) = qo; P(1) = rstd; P(2) = (void *)qi; P(3) = (void *)wq; P(4) = (void *)wk;
	I(0) = N; I(1) = NH; I(2) = NKV; I(3) = HD; c->f = eps;
}

static void
f_rope(rl_ops *o, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope)
{
	if (!rec) {
		base->rope_fwd(base, qkv, pos, N, NH, NKV, HD, rope);
		return;
	}
	call *c = add_call(C_ROPE);
	P(0) = qkv; P(1) = (void *)pos;
	I(0) = N; I(1) = NH; I(2) = NKV; I(3) = HD; c->rope = rope;
}

static void
f_kvw(rl_ops *o, void *kc, void *vc, const void *qkv, const int32_t *slot, int N, int NH, int NKV, int HD)
{
	if (!rec) {
		base->kv_write(base, kc, vc, qkv, slot, N, NH, NKV, HD);
		return;
	}
	call *c = add_call(C_KVW);
	P(0) = kc; P(1) = vc; P(2) = (void *)qkv; P(3) = (void *)slot;
	I(0) = N; I(1) = NH; I(2) = NKV; I(3) = HD;
}

static void
f_att(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc, const int32_t *bt, const int32_t *ctx,
    int B, int NH, int NKV, int HD, int BS, int MAXBLK)
{
	if (!rec) {
		base->attn_decode(base, out, qkv, kc, vc, bt, ctx, B, NH, NKV, HD, BS, MAXBLK);
		return;
	}
	call *c = add_call(C_ATT);
	P(0) = out; P(1) = (void *)qkv; P(2) = (void *)kc; P(3) = (void *)vc; P(4) = (void *)bt; P(5) = (void *)ctx;
	I(0) = B; I(1) = NH; I(2) = NKV; I(3) = HD; I(4) = BS; I(5) = MAXBLK;
}

static void
f_add(rl_ops *o, void *out, const void *a, const void *b, size_t n)
{
	if (!rec) {
		base->add(base, out, a, b, n);
		return;
	}
	call *c = add_call(C_ADD);
	P(0) = out; P(1) = (void *)a; P(2) = (void *)b; c->z = n;
}

static void
f_gelu(rl_ops *o, void *out, const void *x, size_t n)
{
	if (!rec) {
		base->gelu_fwd(base, out, x, n);
		return;
	}
	call *c = add_call(C_GELU);
	P(0) = out; P(1) = (void *)x; c->z = n;
}

static void
f_swiglu(rl_ops *o, void *out, const void *gu, int N, int H)
{
	if (!rec) {
		base->swiglu_fwd(base, out, gu, N, H);
		return;
	}
	call *c = add_call(C_SWIGLU);
	P(0) = out; P(1) = (void *)gu; I(0) = N; I(1) = H;
}

static void
f_copy(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (!rec) {
		base->copy(base, dst, src, bytes);
		return;
	}
	call *c = add_call(C_COPY);
	P(0) = dst; P(1) = (void *)src; c->z = bytes;
}

static void
f_sample(rl_ops *o, int32_t *tok, float *logp, const void *logits, const uint64_t *seed, const uint64_t *ctr,
    int B, int V, const rl_sample_params *sp)
{
	if (!rec) {
		base->sample(base, tok, logp, logits, seed, ctr, B, V, sp);
		return;
	}
	call *c = add_call(C_SAMPLE);
	P(0) = tok; P(1) = logp; P(2) = (void *)logits; P(3) = (void *)seed; P(4) = (void *)ctr;
	I(0) = B; I(1) = V; c->sp = *sp;
}

static void
replay(const fgraph *g)
{
	rl_ops *o = base;
	for (int k = 0; k < g->n; k++) {
		const call *c = &g->c[k];
		switch (c->op) {
		case C_EMBED: o->embed_fwd(o, P(0), P(1), P(2), P(3), P(4), I(0), I(1)); break;
		case C_LN: o->layernorm_fwd(o, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), c->f); break;
		case C_RMS: o->rmsnorm_fwd(o, P(0), P(1), P(2), P(3), I(0), I(1), c->f); break;
		case C_MM: o->matmul_fwd(o, P(0), P(1), P(2), P(3), I(0), I(1), I(2)); break;
		case C_QKN: o->qknorm_fwd(o, P(0), P(1), P(2), P(3), P(4), I(0), I(1), I(2), I(3), c->f); break;
		case C_ROPE: o->rope_fwd(o, P(0), P(1), I(0), I(1), I(2), I(3), c->rope); break;
		case C_KVW: o->kv_write(o, P(0), P(1), P(2), P(3), I(0), I(1), I(2), I(3)); break;
		case C_ATT: o->attn_decode(o, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2), I(3), I(4), I(5));
			break;
		case C_ADD: o->add(o, P(0), P(1), P(2), c->z); break;
		case C_GELU: o->gelu_fwd(o, P(0), P(1), c->z); break;
		case C_SWIGLU: o->swiglu_fwd(o, P(0), P(1), I(0), I(1)); break;
		case C_COPY: o->copy(o, P(0), P(1), c->z); break;
		case C_SAMPLE: o->sample(o, P(0), P(1), P(2), P(3), P(4), I(0), I(1), &c->sp); break;
		}
	}
}

#undef P
#undef I

static int
g_begin(rl_ops *o)
{
	if (rec)
		return RL_EINVAL;
	rec = rl_xcalloc(1, sizeof *rec);
	rec->epoch = epoch;
	return RL_OK;
}

static int
g_end(rl_ops *o, void **out)
{
	fgraph *g = rec;
	*out = NULL;
	rec = NULL;
	if (!g)
		return RL_EINVAL;
	if (g->fail || g->n == 0) {
		free(g->c);
		free(g);
		return RL_EDEVICE;
	}
	*out = g;
	return RL_OK;
}

static int
g_launch(rl_ops *o, void *g)
{
	fgraph *fg = g;
	if (!fg || fg->epoch != epoch)
		return RL_EINVAL;
	replay(fg);
	return RL_OK;
}

static int g_ok(rl_ops *o, const void *g) { return g && ((const fgraph *)g)->epoch == epoch; }

static void
g_destroy(rl_ops *o, void *g)
{
	fgraph *fg = g;
	if (fg) {
		free(fg->c);
		free(fg);
	}
}

/* host copies and memory management must not happen while recording */
static void
f_upload(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	bad_calls += rec != NULL;
	base->upload(base, dst, src, bytes);
}

static void
f_download(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	bad_calls += rec != NULL;
	base->download(base, dst, src, bytes);
}

static int
f_sync(rl_ops *o)
{
	bad_calls += rec != NULL;
	return base->sync(base);
}

static int
f_alloc(rl_ops *o, void **p, size_t bytes)
{
	bad_calls += rec != NULL;
	return base->alloc(base, p, bytes);
}

static void
f_free(rl_ops *o, void *p)
{
	bad_calls += rec != NULL;
	base->free(base, p);
}

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":257,"
    "\"n_embd\":32,\"n_layer\":2,\"n_head\":4,\"n_positions\":48,\"n_ctx\":48,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";

static void
move_scratch(void *ctx)
{
	(void)ctx;
	epoch++;
}

static void
workload(const char *name, rl_config *cfg)
{
	rl_model *m = NULL;
	static mix_out L, G, G3;
	int st, len;

	T_EQ_INT(rl_model_init_random(&m, cfg, &fake, 3), RL_OK);
	if (!m)
		return;
	/* a larger init, so that the distributions are not flat */
	mix_sharpen(m, 3.0f);
	T_EQ_INT(mix_run(m, 8, 1, 0, move_scratch, NULL, &L), RL_OK);
	fail_B = 5;
	T_EQ_INT(mix_run(m, 8, 0, 0, move_scratch, NULL, &G), RL_OK);
	fail_B = -1;
	mix_kinds(&L, &st, &len);
	printf("%s: %d samples (%d stopped early, %d at their limit), %d steps; graphs: %llu recorded, "
	    "%llu replays, %llu op by op, %llu stale\n", name, L.count, st, len, L.steps,
	    (unsigned long long)G.ds.captures, (unsigned long long)G.ds.launches,
	    (unsigned long long)G.ds.direct, (unsigned long long)G.ds.stale);
	T_OK(st > 0 && len > 0, "%s: workload kinds %d %d", name, st, len);
	T_OK(mix_same(&L, &G), "%s: recorded graphs give other samples than decode + sample", name);
	T_OK(G.ds.captures > 0 && G.ds.launches > 0 && G.ds.launches + G.ds.direct == G.ds.steps,
	    "%s: graph counters", name);
	/* this workload replays, after the move at step 7, graphs recorded before it */
	T_OK(G.ds.stale > 0, "%s: no graph went stale after the scratch moved", name);
	/* a batch size recorded only after 3 runs op by op (m->graph_after): the same samples,
	 * fewer recordings (the sizes seen fewer than 4 times never are), more steps op by op */
	{
		rl_model *m3 = NULL;
		T_EQ_INT(rl_model_init_random(&m3, cfg, &fake, 3), RL_OK);  /* the same weights, no graphs yet */
		if (!m3)
			return;
		mix_sharpen(m3, 3.0f);
		m3->graph_after = 3;
		T_EQ_INT(mix_run(m3, 8, 0, 0, move_scratch, NULL, &G3), RL_OK);
		rl_model_close(m3);
	}
	printf("%s: recorded after 3 runs: %llu recorded, %llu replays, %llu op by op\n", name,
	    (unsigned long long)G3.ds.captures, (unsigned long long)G3.ds.launches, (unsigned long long)G3.ds.direct);
	T_OK(mix_same(&L, &G3), "%s: graph_after 3 gives other samples", name);
	T_OK(G3.ds.captures > 0 && G3.ds.captures < G.ds.captures && G3.ds.direct > G.ds.direct &&
	    G3.ds.launches + G3.ds.direct == G3.ds.steps, "%s: graph_after 3: counters", name);
	T_EQ_INT(bad_calls, 0);
	rl_model_close(m);
}

int
main(void)
{
	rl_config cfg;

	T_BEGIN("test_decode_graph");
	rl_log_init("test_decode_graph", RL_LOG_QUIET);
	T_EQ_INT(rl_ops_cpu_open(&base), RL_OK);
	fake = *base;
	fake.name = "cpu+recording";
	fake.embed_fwd = f_embed;
	fake.layernorm_fwd = f_ln;
	fake.rmsnorm_fwd = f_rms;
	fake.matmul_fwd = f_mm;
	fake.qknorm_fwd = f_qkn;
	fake.rope_fwd = f_rope;
	fake.kv_write = f_kvw;
	fake.attn_decode = f_att;
	fake.add = f_add;
	fake.gelu_fwd = f_gelu;
	fake.swiglu_fwd = f_swiglu;
	fake.copy = f_copy;
	fake.sample = f_sample;
	fake.upload = f_upload;
	fake.download = f_download;
	fake.sync = f_sync;
	fake.alloc = f_alloc;
	fake.free = f_free;
	fake.graph_begin = g_begin;
	fake.graph_end = g_end;
	fake.graph_launch = g_launch;
	fake.graph_ok = g_ok;
	fake.graph_destroy = g_destroy;
	/* the fused ops have no recording wrapper: the model must do without them here */
	fake.add_norm_fwd = NULL;
	fake.matmul_gelu_fwd = NULL;
	fake.matmul_dgelu_bwd = NULL;

	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 48, .n_layer = 2, .n_head = 4,
		.n_kv_head = 2, .head_dim = 12, .intermediate_size = 96, .max_pos = 40, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	workload("qwen2", &cfg);
	rl_config_fini(&cfg);
	memset(&cfg, 0, sizeof cfg);
	T_EQ_INT(rl_config_parse(&cfg, gpt2_json, strlen(gpt2_json), "gpt2"), RL_OK);
	workload("gpt2", &cfg);
	rl_config_fini(&cfg);
	T_OK(nrec_ops > 0, "nothing was recorded");
	rl_ops_close(base);
	T_END();
}

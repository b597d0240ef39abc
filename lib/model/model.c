/*
 * model.c — Llama-family and GPT-2 decoders over ops.h: tensor table,
 * loading, random init, training forward/backward (activations kept per layer,
 * llm.c style; lm_head + log-prob chunked over rows and recomputed in
 * backward), AdamW with global-norm clipping, and prefill/decode over the
 * paged KV cache.
 *
 * Leaves out: saving (ckpt.c), the block allocator (kvcache.c).
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "model/safetensors.h"

/* Rows of logits materialised at once: bounded by bytes, so (N, V) never is.
 * On the CPU 32 MiB.  On a GPU (bf16 activations) when training, 3 GiB: the logits
 * of a whole batch (GPT-2 16 x 1024 rows x 50304 = 1.5 GiB, Qwen 8 x 1024 x 151936 =
 * 2.3 GiB) stay from the forward to the backward, which then does not recompute
 * them; a larger batch is chunked and recomputed.  On a GPU without gradients
 * (forward only) 256 MiB, so that the LM-head GEMMs of a chunk are not skinny
 * (2,670 rows at V = 50257, 883 at 151936).  Without the strided head
 * (RL_CUDA_HEAD_LD=0) the backward pads a chunk's gradient into a scratch of the
 * same size, so the head needs twice this.  Overridden by m->logit_chunk_bytes, then
 * by RL_LOGIT_CHUNK_MB. */
#define LOGIT_CHUNK_BYTES ((size_t)32 << 20)
#define LOGIT_CHUNK_BYTES_GPU ((size_t)256 << 20)
#define LOGIT_KEEP_BYTES_GPU ((size_t)3 << 30)

static size_t
logit_chunk_bytes(const rl_model *m)
{
	const char *e = getenv("RL_LOGIT_CHUNK_MB");
	if (m->logit_chunk_bytes)
		return m->logit_chunk_bytes;
	if (e && atol(e) > 0)
		return (size_t)atol(e) << 20;
	if (m->ops->act_dtype == RL_F32)
		return LOGIT_CHUNK_BYTES;
	return m->grads != NULL ? LOGIT_KEEP_BYTES_GPU : LOGIT_CHUNK_BYTES_GPU;
}

/* The logits' row stride: V, or V rounded up to the backend's alignment when it has the
 * strided LM head (ops.h, matmul_fwd_ld and the rest). */
static int
logits_ld(const rl_model *m)
{
	const rl_ops *o = m->ops;
	int V = m->cfg.vocab_size, al = o->head_ld_align;
	if (!o->matmul_fwd_ld || !o->matmul_bwd_ld || !o->logprob_fwd_ld || !o->logprob_bwd_ld || al <= 0)
		return V;
	return (int)(((size_t)V + al - 1) / al * al);
}

struct rl_model_act {
	int maxN, chunk;
	int ld;                 /* row stride of logits (logits_ld): V, or V padded for the strided head */
	void *amem;             /* one act-dtype allocation for everything below */
	float *fmem;            /* one f32 allocation */
	int32_t *imem;          /* one i32 allocation */
	void *res;              /* (L+1, N, C) residual stream: res[0] embeddings, res[l+1] block l out */
	void *ln1, *res_mid, *ln2;      /* (L, N, C) */
	void *qkv_raw;          /* (L, N, QKV) before q/k-norm (Qwen3 only) */
	void *qkv;              /* (L, N, QKV) after q/k-norm and RoPE: what attention saw */
	void *att;              /* (L, N, NH*HD) */
	void *fc;               /* (L, N, FC) gate|up (2H) or GPT-2 pre-GELU (H) */
	void *h;                /* (L, N, H) SwiGLU / GELU output */
	void *lnf;              /* (N, C) */
	void *vout, *dvout;     /* (N) value head output and its gradient (value head only) */
	void *logits;           /* (chunk, ld) */
	void *dres, *dx, *dx2;  /* (N, C) */
	void *dqkv, *dqkv2;     /* (N, QKV) */
	void *datt;             /* (N, NH*HD) */
	void *dfc;              /* (N, FC) */
	void *dh;               /* (N, H) */
	float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;      /* (L, N) */
	float *qk_rstd;         /* (L, N, NH+NKV) */
	float *lse;             /* (L, N*NH) attention lse, (B,NH,T) per layer */
	float *lnf_mean, *lnf_rstd, *lp, *ent, *lse_out;       /* (N) */
	float *val;             /* (N) f32 values (value head only) */
	int32_t *tok, *tgt, *seg, *pos;                         /* (N) */
	int32_t *hpos;          /* host (N) scratch */
	int B, T, has_seg, ready;
	int recompute;          /* per-layer arrays hold one layer (m->recompute at reserve) */
	size_t bytes;           /* backend bytes of amem + fmem + imem */
	int logits_kept;        /* logits holds all N rows of the last forward (one chunk) */
	float inv_temp;
};

struct rl_model_inf {
	int maxI, maxB;
	void *amem;
	float *fmem;
	int32_t *imem;
	void *x, *xn, *t;       /* (I, C) */
	void *qkv, *qkv2;       /* (I, QKV) */
	void *att;              /* (I, NH*HD) */
	void *fc, *h;           /* (I, FC), (I, H) */
	void *last, *lastn;     /* (maxB, C) */
	void *logits;           /* (maxB, V) */
	float *mean, *rstd;     /* (I) */
	float *lse;             /* (I*NH) */
	float *qk_rstd;         /* (I*(NH+NKV)) */
	int32_t *tok, *pos, *seg, *slot, *ctx;  /* (I) */
	int32_t *bt;            /* (maxB, btcols) backend block tables */
	int btcols;
	int32_t *htok, *hpos, *hseg, *hslot, *hbt;  /* host staging (I) */
	int *hstart, *horder, *hfill;               /* host prefill layout (maxB) */
	void *hlogits;          /* host (maxB, V) act */
	/* rl_model_decode_sample: a step's inputs packed (step_layout) in one buffer and
	 * copied in one queued upload; its outputs (tok, logp) at out_off, one download */
	void *dstep;            /* backend (step_bytes) */
	void *hstep;            /* host staging (step_bytes), ops->host_alloc when present */
	size_t step_bytes, out_off;
	int step_cols;          /* block-table columns the step buffers are laid out for */
	struct dgraph *graphs;  /* (ngraph) recorded decode steps, one per (B, g, sampling) */
	int ngraph, capgraph;
	rl_step_layer *steplay; /* (n_layer) the layer table of ops->decode_step, when it has one */
	void *hmulti;           /* rl_model_decode_multi's outputs, host staging (hmulti_bytes) */
	size_t hmulti_bytes;
};

/* A decode step recorded as a backend graph, with what it was recorded for. */
enum { DG_NEW, DG_WARM, DG_GRAPH, DG_FAILED };
typedef struct dgraph {
	void *g;                /* backend graph (state DG_GRAPH) */
	int state;              /* DG_NEW: fewer runs op by op than m->graph_after; DG_WARM: that many,
	                         * recorded at the next run; DG_FAILED: no graph */
	int runs;               /* runs op by op so far */
	int B, ng;              /* batch rows, rows sampled with sp (the rest greedy) */
	rl_sample_params sp;
	const void *kvmem, *w;  /* cache and weights it reads */
	int kvBS, kvnblk;
} dgraph;

/* ---- small helpers -------------------------------------------------------- */

static size_t asz(const rl_model *m) { return rl_dtype_size(m->ops->act_dtype); }

/* The config's RoPE as the ops take it (lib/compute/ops.h); GPT-2, which has none: theta 0 */
static rl_rope
cfg_rope(const rl_config *c)
{
	rl_rope r = { 0 };

	if (c->arch != RL_ARCH_LLAMA)
		return r;
	r.theta = c->rope_theta;
	r.factor = c->rope_factor;
	r.lo = c->rope_low_freq;
	r.hi = c->rope_high_freq;
	r.orig = (float)c->rope_orig_max_pos;
	return r;
}
static int qkv_dim(const rl_config *c) { return (c->n_head + 2 * c->n_kv_head) * c->head_dim; }
static int fc_dim(const rl_config *c)
{
	return c->arch == RL_ARCH_GPT2 ? c->intermediate_size : 2 * c->intermediate_size;
}

static void *
W(const rl_model *m, int i)
{
	return i < 0 ? NULL : (char *)m->w + m->tt.t[i].off * asz(m);
}
static float *G(const rl_model *m, int i) { return i < 0 ? NULL : m->grads + m->tt.t[i].off; }
static void *at(void *base, size_t idx, size_t sz) { return (char *)base + idx * sz; }

/* Bump allocation over one buffer: measure with base NULL, then assign. */
typedef struct carve { char *base; size_t off; } carve;
static void *
take(carve *c, size_t n, size_t esz)
{
	void *p = c->base ? c->base + c->off : NULL;
	c->off += (n * esz + 63) & ~(size_t)63;
	return p;
}

static int
check_ops(rl_model *m, const char *what)
{
	int rv = m->ops->status(m->ops);
	if (rv != 0)
		rl_error("%s: backend '%s' failed: %s", what, m->ops->name, rl_strerror(rv));
	return rv;
}

/* ---- the tensor table ------------------------------------------------------- */

static void
build_table(rl_model *m)
{
	const rl_config *c = &m->cfg;
	rl_ttable *tt = &m->tt;
	int C = c->hidden_size, V = c->vocab_size, H = c->intermediate_size;
	int QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, HD = c->head_dim;
	char n[RL_TT_NAME];
	const unsigned D = RL_T_DECAY, DT = RL_T_DECAY | RL_T_TRANSPOSE;

	m->layer = rl_xcalloc((size_t)c->n_layer, sizeof *m->layer);
	m->wpe = m->lnf_b = -1;
	m->vh_w = m->vh_b = -1;
#define ADD(flags, d0, d1, ...) (snprintf(n, sizeof n, __VA_ARGS__), rl_ttable_add(tt, n, flags, d0, d1))
	if (c->arch == RL_ARCH_GPT2) {
		m->wte = ADD(0, V, C, "transformer.wte.weight");
		m->wpe = ADD(0, c->max_pos, C, "transformer.wpe.weight");
		for (int l = 0; l < c->n_layer; l++) {
			rl_layer_idx *y = &m->layer[l];
			const char *p = "transformer.h";
			y->ln1_w = ADD(0, C, 0, "%s.%d.ln_1.weight", p, l);
			y->ln1_b = ADD(0, C, 0, "%s.%d.ln_1.bias", p, l);
			y->qkv_w = ADD(DT, 3 * C, C, "%s.%d.attn.c_attn.weight", p, l);
			y->qkv_b = ADD(0, 3 * C, 0, "%s.%d.attn.c_attn.bias", p, l);
			y->qn_w = y->kn_w = -1;
			y->o_w = ADD(DT, C, C, "%s.%d.attn.c_proj.weight", p, l);
			y->o_b = ADD(0, C, 0, "%s.%d.attn.c_proj.bias", p, l);
			y->ln2_w = ADD(0, C, 0, "%s.%d.ln_2.weight", p, l);
			y->ln2_b = ADD(0, C, 0, "%s.%d.ln_2.bias", p, l);
			y->fc_w = ADD(DT, H, C, "%s.%d.mlp.c_fc.weight", p, l);
			y->fc_b = ADD(0, H, 0, "%s.%d.mlp.c_fc.bias", p, l);
			y->proj_w = ADD(DT, C, H, "%s.%d.mlp.c_proj.weight", p, l);
			y->proj_b = ADD(0, C, 0, "%s.%d.mlp.c_proj.bias", p, l);
		}
		m->lnf_w = ADD(0, C, 0, "transformer.ln_f.weight");
		m->lnf_b = ADD(0, C, 0, "transformer.ln_f.bias");
	} else {
		m->wte = ADD(0, V, C, "model.embed_tokens.weight");
		for (int l = 0; l < c->n_layer; l++) {
			rl_layer_idx *y = &m->layer[l];
			const char *p = "model.layers";
			y->ln1_w = ADD(0, C, 0, "%s.%d.input_layernorm.weight", p, l);
			y->ln1_b = -1;
			y->qkv_w = ADD(D, QD, C, "%s.%d.self_attn.q_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, KD, C, "%s.%d.self_attn.k_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, KD, C, "%s.%d.self_attn.v_proj.weight", p, l);
			y->qkv_b = -1;
			if (c->qkv_bias) {
				y->qkv_b = ADD(0, QD, 0, "%s.%d.self_attn.q_proj.bias", p, l);
				ADD(RL_T_FOLLOWS, KD, 0, "%s.%d.self_attn.k_proj.bias", p, l);
				ADD(RL_T_FOLLOWS, KD, 0, "%s.%d.self_attn.v_proj.bias", p, l);
			}
			y->qn_w = y->kn_w = -1;
			if (c->qk_norm) {
				y->qn_w = ADD(0, HD, 0, "%s.%d.self_attn.q_norm.weight", p, l);
				y->kn_w = ADD(0, HD, 0, "%s.%d.self_attn.k_norm.weight", p, l);
			}
			y->o_w = ADD(D, C, QD, "%s.%d.self_attn.o_proj.weight", p, l);
			y->o_b = c->o_bias ? ADD(0, C, 0, "%s.%d.self_attn.o_proj.bias", p, l) : -1;
			y->ln2_w = ADD(0, C, 0, "%s.%d.post_attention_layernorm.weight", p, l);
			y->ln2_b = -1;
			y->fc_w = ADD(D, H, C, "%s.%d.mlp.gate_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, H, C, "%s.%d.mlp.up_proj.weight", p, l);
			y->fc_b = -1;
			y->proj_w = ADD(D, C, H, "%s.%d.mlp.down_proj.weight", p, l);
			y->proj_b = -1;
		}
		m->lnf_w = ADD(0, C, 0, "model.norm.weight");
	}
	m->lm_w = c->tie_embeddings ? m->wte : ADD(D, V, C, "lm_head.weight");
#undef ADD
}

size_t
rl_model_nparams(const rl_model *m)
{
	size_t n = 0;
	for (int i = 0; i < m->tt.n; i++)
		n += m->tt.t[i].n;
	return n;
}

static int
model_new(rl_model **out, const rl_config *cfg, rl_ops *ops)
{
	rl_model *m = rl_xcalloc(1, sizeof *m);
	size_t bytes;
	int rv;

	*out = NULL;
	rl_config_copy(&m->cfg, cfg);
	m->ops = ops;
	build_table(m);
	if ((rv = rl_mul_size(&bytes, m->tt.total, sizeof(float))) != 0 ||
	    (rv = ops->alloc(ops, (void **)&m->params, bytes)) != 0)
		goto fail;
	ops->zero(ops, m->params, bytes);
	if (ops->act_dtype == RL_F32) {
		m->w = m->params;
	} else {
		if ((rv = ops->alloc(ops, &m->w, m->tt.total * asz(m))) != 0)
			goto fail;
		ops->zero(ops, m->w, m->tt.total * asz(m));
	}
	*out = m;
	return RL_OK;
fail:
	rl_model_close(m);
	return rv;
}

static void
free_act(rl_model *m)
{
	rl_model_act *a = m->act;
	if (a == NULL)
		return;
	m->ops->free(m->ops, a->amem);
	m->ops->free(m->ops, a->fmem);
	m->ops->free(m->ops, a->imem);
	free(a->hpos);
	free(a);
	m->act = NULL;
	m->lp = m->ent = m->val = NULL;
}

static void
free_inf(rl_model *m)
{
	rl_model_inf *f = m->inf;
	if (f == NULL)
		return;
	m->ops->free(m->ops, f->amem);
	m->ops->free(m->ops, f->fmem);
	m->ops->free(m->ops, f->imem);
	m->ops->free(m->ops, f->bt);
	for (int i = 0; i < f->ngraph; i++)
		if (f->graphs[i].g)
			m->ops->graph_destroy(m->ops, f->graphs[i].g);
	free(f->graphs);
	m->ops->free(m->ops, f->dstep);
	if (m->ops->host_free) {
		m->ops->host_free(m->ops, f->hstep);
		m->ops->host_free(m->ops, f->hmulti);
	} else {
		free(f->hstep);
		free(f->hmulti);
	}
	free(f->htok);
	free(f->hbt);
	free(f->hlogits);
	free(f->steplay);
	free(f);
	m->inf = NULL;
	m->logits = NULL;
}

void
rl_model_close(rl_model *m)
{
	if (m == NULL)
		return;
	free_act(m);
	free_inf(m);
	if (m->w != m->params)
		m->ops->free(m->ops, m->w);
	m->ops->free(m->ops, m->params);
	m->ops->free(m->ops, m->grads);
	m->ops->free(m->ops, m->m);
	m->ops->free(m->ops, m->v);
	rl_ttable_fini(&m->tt);
	free(m->layer);
	free(m->src_dir);
	rl_config_fini(&m->cfg);
	free(m);
}

/* ---- host access ---------------------------------------------------------------- */

/* dst[c][r] = src[r][c] for src [R, C] (row-major), in 32 x 32 tiles so
 * both sides stay in cache (a plain double loop writes with stride R: ~5x
 * slower on GPT-2's [768, 2304] weights). */
static void
transpose(float *dst, const float *src, size_t R, size_t C)
{
	enum { TB = 32 };
#pragma omp parallel for schedule(static) if (R * C > ((size_t)1 << 18))
	for (size_t r0 = 0; r0 < R; r0 += TB)
		for (size_t c0 = 0; c0 < C; c0 += TB) {
			size_t r1 = RL_MIN(r0 + TB, R), c1 = RL_MIN(c0 + TB, C);
			for (size_t r = r0; r < r1; r++)
				for (size_t c = c0; c < c1; c++)
					dst[c * R + r] = src[r * C + c];
		}
}

int
rl_model_get(rl_model *m, int i, int kind, float *out)
{
	const rl_tensor *t = &m->tt.t[i];
	const float *src = kind == RL_MODEL_PARAM ? m->params : kind == RL_MODEL_GRAD ? m->grads :
	    kind == RL_MODEL_ADAM_M ? m->m : m->v;
	float *tmp;

	if (src == NULL)
		return RL_EINVAL;
	if (!(t->flags & RL_T_TRANSPOSE)) {
		m->ops->download(m->ops, out, src + t->off, t->n * sizeof(float));
		return check_ops(m, "download");
	}
	if ((tmp = rl_try_malloc(t->n * sizeof(float), t->name)) == NULL)
		return RL_ENOMEM;
	m->ops->download(m->ops, tmp, src + t->off, t->n * sizeof(float));
	transpose(out, tmp, (size_t)t->shape[0], (size_t)t->shape[1]);
	free(tmp);
	return check_ops(m, "download");
}

int
rl_model_set(rl_model *m, int i, const float *in)
{
	const rl_tensor *t = &m->tt.t[i];
	float *tmp = NULL;
	const float *src = in;

	if (t->flags & RL_T_TRANSPOSE) {
		if ((tmp = rl_try_malloc(t->n * sizeof(float), t->name)) == NULL)
			return RL_ENOMEM;
		transpose(tmp, in, (size_t)t->shape[1], (size_t)t->shape[0]);
		src = tmp;
	}
	m->ops->upload(m->ops, m->params + t->off, src, t->n * sizeof(float));
	if (m->w != m->params)
		m->ops->cast(m->ops, W(m, i), m->ops->act_dtype, m->params + t->off, RL_F32, t->n);
	free(tmp);
	return check_ops(m, "upload");
}

int
rl_model_params_changed(rl_model *m)
{
	if (m->w != m->params)
		m->ops->cast(m->ops, m->w, m->ops->act_dtype, m->params, RL_F32, m->tt.total);
	return check_ops(m, "weights refresh");
}

/* ---- random init ------------------------------------------------------------------- */

int
rl_model_init_random(rl_model **out, const rl_config *cfg, rl_ops *ops, uint64_t seed)
{
	rl_model *m = NULL;
	float *buf = NULL;
	size_t maxn = 0;
	int rv;

	*out = NULL;
	if ((rv = rl_config_check(cfg, "config")) != 0 || (rv = model_new(&m, cfg, ops)) != 0)
		return rv;
	for (int i = 0; i < m->tt.n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((buf = rl_try_malloc(maxn * sizeof(float), "init buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		size_t len = strlen(t->name);
		int is_bias = len > 5 && strcmp(t->name + len - 5, ".bias") == 0;
		double std = 0.02;
		if (cfg->arch == RL_ARCH_GPT2 && strstr(t->name, "c_proj.weight") != NULL)
			std = 0.02 / sqrt(2.0 * cfg->n_layer);
		/* counter-based: the same values whatever the thread count */
#pragma omp parallel for schedule(static) if (t->n > ((size_t)1 << 16))
		for (size_t j = 0; j < t->n; j++) {
			if (t->ndim == 1) {
				buf[j] = is_bias ? 0.0f : 1.0f;
			} else {
				/* Box-Muller on counters keyed by the element's offset: the same
				 * values for a given seed whatever the backend. */
				uint64_t k = 2 * (uint64_t)(t->off + j);
				double u1 = rl_rng_uniform(seed, k), u2 = rl_rng_uniform(seed, k + 1);
				buf[j] = (float)(std * sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2));
			}
		}
		if ((rv = rl_model_set(m, i, buf)) != 0)
			goto out;
	}
	*out = m;
	m = NULL;
out:
	free(buf);
	rl_model_close(m);
	return rv;
}

/* ---- value head ---------------------------------------------------------------------- */

/* Moves buffer *p of old_n elements of esz bytes into a new zeroed one of new_n. */
static int
grow_buf(rl_model *m, void **p, size_t old_n, size_t new_n, size_t esz)
{
	rl_ops *o = m->ops;
	void *np = NULL;
	int rv;

	if ((rv = o->alloc(o, &np, new_n * esz)) != 0)
		return rv;
	o->zero(o, np, new_n * esz);
	o->copy(o, np, *p, old_n * esz);
	o->free(o, *p);
	*p = np;
	return check_ops(m, "value head");
}

/* Reads the head from path into buf (C + 1): weight then bias. */
static int
load_value_head(rl_model *m, const char *path, float *buf)
{
	const int64_t C = m->cfg.hidden_size;
	rl_st_file *f = NULL;
	int rv;

	if ((rv = rl_st_open(&f, path)) != 0)
		return rv;
	for (int k = 0; k < 2; k++) {
		const char *name = k == 0 ? "value_head.weight" : "value_head.bias";
		const rl_st_tensor *t = rl_st_find(f, name);
		int ok;
		if (t == NULL) {
			rl_error("'%s': no tensor '%s'", path, name);
			rv = RL_ENOENT;
			goto out;
		}
		ok = k == 0 ? t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == C :
		    t->ndim == 1 && t->shape[0] == 1;
		if (!ok) {
			char got[64] = "";
			for (int d = 0; d < t->ndim && strlen(got) < 40; d++)
				snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
				    (long long)t->shape[d]);
			rl_error("'%s': tensor '%s' has shape [%s], the model's hidden_size implies [%s%lld]",
			    path, name, got, k == 0 ? "1, " : "", k == 0 ? (long long)C : 1LL);
			rl_hint("the value head belongs to another model; remove '%s' to start a new one", path);
			rv = RL_ESHAPE;
			goto out;
		}
		if ((rv = rl_st_to_f32(buf + (k ? C : 0), t, 0, t->nelem)) != 0) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", path, name,
			    rl_dtype_name(t->dtype));
			goto out;
		}
	}
out:
	rl_st_close(f);
	return rv;
}

int
rl_model_add_value_head(rl_model *m, const char *dir, uint64_t seed)
{
	const int C = m->cfg.hidden_size;
	size_t old = m->tt.total;
	char *path = NULL;
	float *buf = NULL;
	int rv;

	if (m->vh_w >= 0)
		return RL_OK;
	if (m->grads != NULL || m->act != NULL) {
		rl_error("value head: add it before reserving training buffers");
		return RL_EINVAL;
	}
	m->vh_w = rl_ttable_add(&m->tt, "value_head.weight", RL_T_AUX, 1, C);
	m->vh_b = rl_ttable_add(&m->tt, "value_head.bias", RL_T_AUX, 1, 0);
	if (m->w != m->params && (rv = grow_buf(m, &m->w, old, m->tt.total, asz(m))) != 0)
		return rv;
	if ((rv = grow_buf(m, (void **)&m->params, old, m->tt.total, sizeof(float))) != 0)
		return rv;
	if (m->ops->act_dtype == RL_F32)
		m->w = m->params;
	buf = rl_xcalloc((size_t)C + 1, sizeof *buf);
	if (dir != NULL) {
		size_t n = strlen(dir) + sizeof RL_VALUE_HEAD_FILE + 2;
		path = rl_xmalloc(n);
		snprintf(path, n, "%s/%s", dir, RL_VALUE_HEAD_FILE);
	}
	if (path != NULL && access(path, F_OK) == 0) {
		if ((rv = load_value_head(m, path, buf)) != 0)
			goto out;
		rl_verbose("value head loaded from '%s'", path);
	} else {
		/* small, so the first values are near 0 whatever the hidden state's scale;
		 * Box-Muller on counters keyed by the element (as rl_model_init_random) */
		double std = 1.0 / (C + 1);
		for (int j = 0; j < C; j++) {
			uint64_t k = 2 * (uint64_t)(m->tt.t[m->vh_w].off + (size_t)j);
			double u1 = rl_rng_uniform(seed, k), u2 = rl_rng_uniform(seed, k + 1);
			buf[j] = (float)(std * sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2));
		}
		rl_verbose("value head initialised (seed %llu)", (unsigned long long)seed);
	}
	if ((rv = rl_model_set(m, m->vh_w, buf)) != 0 || (rv = rl_model_set(m, m->vh_b, buf + C)) != 0)
		goto out;
out:
	free(path);
	free(buf);
	return rv;
}

/* ---- loading ------------------------------------------------------------------------- */

static int
known_extra(const char *name)
{
	/* buffers some exporters include: GPT-2's causal mask, old Llama rotary tables */
	size_t n = strlen(name);
	return (n >= 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
	    (n >= 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0) ||
	    strstr(name, "rotary_emb.inv_freq") != NULL;
}

/* lm_head.weight present in a tied model: it must be the embedding.  buf
 * holds at least the embedding's elements; the embedding is read back only
 * here, so a file without the head (the usual tied one) costs no second
 * (V, C) buffer. */
static int
check_tied_head(rl_model *m, const rl_st_set *set, float *buf)
{
	const char *file;
	const rl_st_tensor *st = rl_st_set_find(set, "lm_head.weight", &file);
	const rl_tensor *t = &m->tt.t[m->wte];
	float *wte = NULL;
	int rv = RL_OK;

	if (st == NULL)
		return RL_OK;
	if (st->nelem == t->n && rl_st_to_f32(buf, st, 0, t->n) == 0) {
		if ((wte = rl_try_malloc(t->n * sizeof(float), "tied head check")) == NULL)
			return RL_ENOMEM;
		if ((rv = rl_model_get(m, m->wte, RL_MODEL_PARAM, wte)) != 0)
			goto out;
		if (memcmp(buf, wte, t->n * sizeof(float)) == 0)
			goto out;
	}
	rl_error("'%s': tensor 'lm_head.weight' differs from the embedding but "
	    "tie_word_embeddings is true", file);
	rl_hint("set \"tie_word_embeddings\": false in config.json to load a separate head");
	rv = RL_EFORMAT;
out:
	free(wte);
	return rv;
}

int
rl_check_finite(const float *x, size_t n, const char *file, const char *name)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(x[i]) && bad++ == 0)
			first = i;
	}
	if (bad == 0)
		return RL_OK;
	rl_error("'%s': tensor '%s' has %zu non-finite values of %zu (the first, element %zu, is %g)", file, name, bad,
	    n, first, (double)x[first]);
	rl_hint("a diverged or damaged checkpoint; generate from an earlier step");
	return RL_EFORMAT;
}

int
rl_model_open(rl_model **out, const char *dir, rl_ops *ops)
{
	rl_config cfg = { 0 };
	rl_model *m = NULL;
	rl_st_set *set = NULL;
	float *buf = NULL;
	char *path = NULL;
	size_t maxn = 0, plen = strlen(dir) + 32;
	int rv, used = 0, total = 0;
	const char *unknown = NULL;

	*out = NULL;
	path = rl_xmalloc(plen);
	snprintf(path, plen, "%s/config.json", dir);
	if ((rv = rl_config_load(&cfg, path)) != 0)
		goto out;
	if ((rv = rl_st_set_open(&set, dir)) != 0)
		goto out;
	if ((rv = model_new(&m, &cfg, ops)) != 0)
		goto out;
	m->src_dir = rl_xstrdup(dir);
	for (int i = 0; i < m->tt.n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((buf = rl_try_malloc(maxn * sizeof(float), "load buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		const char *file = NULL, *name = t->name;
		const rl_st_tensor *st = rl_st_set_find(set, name, &file);
		int64_t shp[2];
		int nd = rl_tensor_file_shape(t, shp);

		if (st == NULL && strncmp(name, "transformer.", 12) == 0)
			st = rl_st_set_find(set, name + 12, &file);
		if (st == NULL) {
			rl_error("'%s': no tensor '%s' in %s", dir, name,
			    set->nfiles > 1 ? "its shards" : "model.safetensors");
			rv = RL_ENOENT;
			goto out;
		}
		if (st->ndim != nd || st->shape[0] != shp[0] || (nd == 2 && st->shape[1] != shp[1])) {
			char got[64] = "", want[64];
			for (int d = 0; d < st->ndim && strlen(got) < 40; d++)
				snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
				    (long long)st->shape[d]);
			if (nd == 2)
				snprintf(want, sizeof want, "%lld, %lld", (long long)shp[0], (long long)shp[1]);
			else
				snprintf(want, sizeof want, "%lld", (long long)shp[0]);
			rl_error("'%s': tensor '%s' has shape [%s], config.json implies [%s]", file, st->name,
			    got, want);
			rv = RL_ESHAPE;
			goto out;
		}
		if ((rv = rl_st_to_f32(buf, st, 0, st->nelem)) != 0) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", file, st->name,
			    rl_dtype_name(st->dtype));
			goto out;
		}
		if ((rv = rl_check_finite(buf, st->nelem, file, st->name)) != 0)
			goto out;
		if ((rv = rl_model_set(m, i, buf)) != 0)
			goto out;
		used++;
	}
	if (m->cfg.tie_embeddings && (rv = check_tied_head(m, set, buf)) != 0)
		goto out;
	for (int f = 0; f < set->nfiles; f++)
		for (int j = 0; j < set->files[f]->n; j++) {
			const char *nm = set->files[f]->t[j].name;
			char full[RL_TT_NAME + 16];
			total++;
			snprintf(full, sizeof full, "transformer.%s", nm);
			if (rl_ttable_find(&m->tt, nm) < 0 && rl_ttable_find(&m->tt, full) < 0 &&
			    !known_extra(nm) && strcmp(nm, "lm_head.weight") != 0 && unknown == NULL)
				unknown = nm;
		}
	if (unknown != NULL)
		rl_warn("'%s': tensor '%s' (and maybe others) is not part of a %s model; ignored", dir,
		    unknown, m->cfg.model_type);
	rl_verbose("loaded '%s': %s, %zu parameters from %d tensors", dir, m->cfg.model_type,
	    rl_model_nparams(m), used);
	*out = m;
	m = NULL;
out:
	free(buf);
	free(path);
	rl_st_set_close(set);
	rl_config_fini(&cfg);
	rl_model_close(m);
	return rv;
}

/* ---- training ------------------------------------------------------------------------ */

static void
carve_act(rl_model *m, rl_model_act *a, carve *ca, carve *cf, carve *ci)
{
	const rl_config *c = &m->cfg;
	size_t N = (size_t)a->maxN, L = (size_t)c->n_layer, C = (size_t)c->hidden_size;
	size_t QKV = (size_t)qkv_dim(c), AD = (size_t)c->n_head * c->head_dim, FC = (size_t)fc_dim(c);
	size_t H = (size_t)c->intermediate_size, s = asz(m);
	size_t R = (size_t)c->n_layer;

	/* recompute: the per-layer arrays hold one layer (slot 0), rebuilt in backward */
	L = a->recompute ? 1 : R;
	a->res = take(ca, (R + 1) * N * C, s);
	a->ln1 = take(ca, L * N * C, s);
	a->res_mid = take(ca, L * N * C, s);
	a->ln2 = take(ca, L * N * C, s);
	a->qkv_raw = c->qk_norm ? take(ca, L * N * QKV, s) : NULL;
	a->qkv = take(ca, L * N * QKV, s);
	a->att = take(ca, L * N * AD, s);
	a->fc = take(ca, L * N * FC, s);
	a->h = take(ca, L * N * H, s);
	a->lnf = take(ca, N * C, s);
	a->vout = m->vh_w >= 0 ? take(ca, N, s) : NULL;
	a->dvout = m->vh_w >= 0 ? take(ca, N, s) : NULL;
	a->logits = take(ca, (size_t)a->chunk * a->ld, s);
	a->dres = take(ca, N * C, s);
	a->dx = take(ca, N * C, s);
	a->dx2 = take(ca, N * C, s);
	a->dqkv = take(ca, N * QKV, s);
	a->dqkv2 = take(ca, N * QKV, s);
	a->datt = take(ca, N * AD, s);
	a->dfc = take(ca, N * FC, s);
	a->dh = take(ca, N * H, s);
	a->ln1_mean = take(cf, L * N, 4);
	a->ln1_rstd = take(cf, L * N, 4);
	a->ln2_mean = take(cf, L * N, 4);
	a->ln2_rstd = take(cf, L * N, 4);
	a->qk_rstd = take(cf, L * N * (size_t)(c->n_head + c->n_kv_head), 4);
	a->lse = take(cf, L * N * (size_t)c->n_head, 4);
	a->lnf_mean = take(cf, N, 4);
	a->lnf_rstd = take(cf, N, 4);
	a->lp = take(cf, N, 4);
	a->ent = take(cf, N, 4);
	a->lse_out = take(cf, N, 4);
	a->val = m->vh_w >= 0 ? take(cf, N, 4) : NULL;
	a->tok = take(ci, N, 4);
	a->tgt = take(ci, N, 4);
	a->seg = take(ci, N, 4);
	a->pos = take(ci, N, 4);
}

int
rl_model_train_reserve(rl_model *m, int max_tokens)
{
	rl_ops *o = m->ops;
	size_t bytes = m->tt.total * sizeof(float);
	int rv;

	if (max_tokens <= 0)
		return RL_EINVAL;
	if (m->grads == NULL) {
		if ((rv = o->alloc(o, (void **)&m->grads, bytes)) != 0)
			return rv;
		if (!m->no_adam_state && ((rv = o->alloc(o, (void **)&m->m, bytes)) != 0 ||
		    (rv = o->alloc(o, (void **)&m->v, bytes)) != 0)) {
			o->free(o, m->grads);
			o->free(o, m->m);
			m->grads = m->m = NULL;
			return rv;
		}
		o->zero(o, m->grads, bytes);
		if (m->m != NULL) {
			o->zero(o, m->m, bytes);
			o->zero(o, m->v, bytes);
		}
	}
	return rl_model_eval_reserve(m, max_tokens);
}

int
rl_model_eval_reserve(rl_model *m, int max_tokens)
{
	rl_ops *o = m->ops;
	rl_model_act *a;
	carve ca = { 0 }, cf = { 0 }, ci = { 0 };
	int rv;

	if (max_tokens <= 0)
		return RL_EINVAL;
	/* one layer's activations when they are recomputed, or never differentiated */
	int one = m->recompute != 0 || m->grads == NULL;

	if (m->act != NULL && m->act->maxN >= max_tokens && m->act->recompute == one)
		return RL_OK;
	free_act(m);
	a = rl_xcalloc(1, sizeof *a);
	a->maxN = max_tokens;
	a->recompute = one;
	a->ld = logits_ld(m);
	a->chunk = (int)RL_MAX((size_t)1, RL_MIN((size_t)max_tokens,
	    logit_chunk_bytes(m) / ((size_t)a->ld * asz(m))));
	/* whole GEMM tiles when the chunk does not cover the batch */
	if (a->chunk < max_tokens && a->chunk > 256)
		a->chunk &= ~127;
	carve_act(m, a, &ca, &cf, &ci);
	if ((rv = o->alloc(o, &a->amem, ca.off)) != 0 || (rv = o->alloc(o, (void **)&a->fmem, cf.off)) != 0 ||
	    (rv = o->alloc(o, (void **)&a->imem, ci.off)) != 0) {
		o->free(o, a->amem);
		o->free(o, a->fmem);
		free(a);
		return rv;
	}
	a->bytes = ca.off + cf.off + ci.off;
	ca.base = a->amem;
	cf.base = (char *)a->fmem;
	ci.base = (char *)a->imem;
	ca.off = cf.off = ci.off = 0;
	carve_act(m, a, &ca, &cf, &ci);
	a->hpos = rl_xcalloc((size_t)max_tokens, sizeof *a->hpos);
	m->act = a;
	m->lp = a->lp;
	m->ent = a->ent;
	m->val = a->val;
	return check_ops(m, "train reserve");
}

size_t
rl_model_act_bytes(const rl_model *m)
{
	return m->act ? m->act->bytes : 0;
}

void
rl_model_zero_grad(rl_model *m)
{
	if (m->grads != NULL)
		m->ops->zero(m->ops, m->grads, m->tt.total * sizeof(float));
}

/* norm forward for either architecture: RMSNorm (Llama) or LayerNorm (GPT-2). */
static void
norm_fwd(rl_model *m, void *out, float *mean, float *rstd, const void *x, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	if (m->cfg.arch == RL_ARCH_GPT2)
		o->layernorm_fwd(o, out, mean, rstd, x, W(m, wi), W(m, bi), N, m->cfg.hidden_size,
		    m->cfg.norm_eps);
	else
		o->rmsnorm_fwd(o, out, rstd, x, W(m, wi), N, m->cfg.hidden_size, m->cfg.norm_eps);
}

/* x += t, then out = the norm of x (weights wi, bi): one kernel where the backend has it. */
static void
add_norm_fwd(rl_model *m, void *x, void *out, float *mean, float *rstd, const void *t, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	if (o->add_norm_fwd) {
		o->add_norm_fwd(o, x, out, mean, rstd, t, W(m, wi), W(m, bi), N, m->cfg.hidden_size,
		    m->cfg.norm_eps, m->cfg.arch == RL_ARCH_GPT2);
		return;
	}
	o->add(o, x, x, t, (size_t)N * m->cfg.hidden_size);
	norm_fwd(m, out, mean, rstd, x, wi, bi, N);
}

static void
norm_bwd(rl_model *m, void *dx, const void *dout, const void *x, const float *mean,
    const float *rstd, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	if (m->cfg.arch == RL_ARCH_GPT2)
		o->layernorm_bwd(o, dx, G(m, wi), G(m, bi), dout, x, W(m, wi), mean, rstd, N,
		    m->cfg.hidden_size);
	else
		o->rmsnorm_bwd(o, dx, G(m, wi), dout, x, W(m, wi), rstd, N, m->cfg.hidden_size);
}

/* dres += the norm's input gradient: one op where the backend has it (layernorm_bwd_add,
 * rmsnorm_bwd_add), else norm_bwd into tmp (N, C) then add. */
static void
norm_bwd_add(rl_model *m, void *dres, void *tmp, const void *dout, const void *x, const float *mean,
    const float *rstd, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	const int C = m->cfg.hidden_size;
	if (m->cfg.arch == RL_ARCH_GPT2 && o->layernorm_bwd_add) {
		o->layernorm_bwd_add(o, dres, G(m, wi), G(m, bi), dout, x, W(m, wi), mean, rstd, N, C);
		return;
	}
	if (m->cfg.arch != RL_ARCH_GPT2 && o->rmsnorm_bwd_add) {
		o->rmsnorm_bwd_add(o, dres, G(m, wi), dout, x, W(m, wi), rstd, N, C);
		return;
	}
	norm_bwd(m, tmp, dout, x, mean, rstd, wi, bi, N);
	o->add(o, dres, dres, tmp, (size_t)N * C);
}

/* The MLP's activation: SwiGLU over gate|up, or GPT-2's GELU. */
static void
mlp_act_fwd(rl_model *m, void *h, const void *fc, int N)
{
	if (m->cfg.arch == RL_ARCH_GPT2)
		m->ops->gelu_fwd(m->ops, h, fc, (size_t)N * m->cfg.intermediate_size);
	else
		m->ops->swiglu_fwd(m->ops, h, fc, N, m->cfg.intermediate_size);
}

/* fc = up projection of xn, h = activation of fc; GPT-2's bias + GELU in the GEMM's
 * epilogue when the backend offers it (RL_CUDA_GELU_FUSE=1). */
static void
mlp_up_fwd(rl_model *m, void *h, void *fc, const void *xn, const rl_layer_idx *y, int N)
{
	rl_ops *o = m->ops;
	const rl_config *c = &m->cfg;
	if (c->arch == RL_ARCH_GPT2 && o->matmul_gelu_fwd) {
		o->matmul_gelu_fwd(o, h, fc, xn, W(m, y->fc_w), W(m, y->fc_b), N, c->hidden_size, fc_dim(c));
		return;
	}
	o->matmul_fwd(o, fc, xn, W(m, y->fc_w), W(m, y->fc_b), N, c->hidden_size, fc_dim(c));
	mlp_act_fwd(m, h, fc, N);
}

static int
check_inputs(const rl_model *m, const int32_t *tok, const int32_t *tgt, const int32_t *pos, int N,
    const char *what)
{
	const rl_config *c = &m->cfg;
	for (int n = 0; n < N; n++) {
		if (tok[n] < 0 || tok[n] >= c->vocab_size) {
			rl_error("%s: token %d at index %d is outside the vocabulary [0, %d)", what, tok[n], n,
			    c->vocab_size);
			return RL_EINVAL;
		}
		if (tgt != NULL && tgt[n] >= c->vocab_size) {
			rl_error("%s: target %d at index %d is outside the vocabulary [0, %d)", what, tgt[n],
			    n, c->vocab_size);
			return RL_EINVAL;
		}
		if (pos[n] < 0 || (c->arch == RL_ARCH_GPT2 && pos[n] >= c->max_pos)) {
			rl_error("%s: position %d at index %d is outside [0, %d)", what, pos[n], n, c->max_pos);
			return RL_EINVAL;
		}
	}
	return RL_OK;
}

/* Block l of the training forward: res[l] -> res[l+1], its activations in
 * slot l of the per-layer arrays (slot 0 with recompute). */
static void
layer_fwd(rl_model *m, int l)
{
	rl_ops *o = m->ops;
	rl_model_act *a = m->act;
	const rl_config *c = &m->cfg;
	const int B = a->B, T = a->T, N = B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
	const int HD = c->head_dim, QKV = qkv_dim(c), AD = NH * HD, FC = fc_dim(c), H = c->intermediate_size;
	const size_t s = asz(m), NC = (size_t)N * C, sN = (size_t)a->maxN;
	const size_t k = a->recompute ? 0 : (size_t)l;
	const int32_t *dseg = a->has_seg ? a->seg : NULL;
	const rl_layer_idx *y = &m->layer[l];
	void *res = at(a->res, l * sN * C, s), *res_out = at(a->res, (l + 1) * sN * C, s);
	void *ln1 = at(a->ln1, k * sN * C, s), *ln2 = at(a->ln2, k * sN * C, s);
	void *mid = at(a->res_mid, k * sN * C, s), *qkv = at(a->qkv, k * sN * QKV, s);
	void *att = at(a->att, k * sN * AD, s), *fc = at(a->fc, k * sN * FC, s);
	void *h = at(a->h, k * sN * H, s);
	float *lse = a->lse + k * sN * NH;

	norm_fwd(m, ln1, a->ln1_mean + k * sN, a->ln1_rstd + k * sN, res, y->ln1_w, y->ln1_b, N);
	if (c->qk_norm) {
		void *raw = at(a->qkv_raw, k * sN * QKV, s);
		o->matmul_fwd(o, raw, ln1, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV);
		o->qknorm_fwd(o, qkv, a->qk_rstd + k * sN * (NH + NKV), raw, W(m, y->qn_w),
		    W(m, y->kn_w), N, NH, NKV, HD, c->norm_eps);
	} else {
		o->matmul_fwd(o, qkv, ln1, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV);
	}
	if (c->arch == RL_ARCH_LLAMA)
		o->rope_fwd(o, qkv, a->pos, N, NH, NKV, HD, cfg_rope(c));
	o->attn_fwd(o, att, lse, qkv, dseg, B, T, NH, NKV, HD);
	if (o->matmul_add_fwd) {
		o->matmul_add_fwd(o, mid, att, W(m, y->o_w), W(m, y->o_b), res, N, AD, C);
	} else {
		o->matmul_fwd(o, mid, att, W(m, y->o_w), W(m, y->o_b), N, AD, C);
		o->add(o, mid, mid, res, NC);
	}
	norm_fwd(m, ln2, a->ln2_mean + k * sN, a->ln2_rstd + k * sN, mid, y->ln2_w, y->ln2_b, N);
	mlp_up_fwd(m, h, fc, ln2, y, N);
	if (o->matmul_add_fwd) {
		o->matmul_add_fwd(o, res_out, h, W(m, y->proj_w), W(m, y->proj_b), mid, N, H, C);
	} else {
		o->matmul_fwd(o, res_out, h, W(m, y->proj_w), W(m, y->proj_b), N, H, C);
		o->add(o, res_out, res_out, mid, NC);
	}
}

int
rl_model_forward(rl_model *m, float *lp, float *ent, const int32_t *tok, const int32_t *tgt,
    const int32_t *seg, const int32_t *pos, int B, int T, float temperature)
{
	rl_ops *o = m->ops;
	rl_model_act *a = m->act;
	const rl_config *c = &m->cfg;
	const int N = B * T, C = c->hidden_size, V = c->vocab_size;
	const size_t s = asz(m);
	int rv;

	if (a == NULL || tok == NULL || tgt == NULL || B <= 0 || T <= 0 || (size_t)B * T > (size_t)a->maxN ||
	    !(temperature > 0)) {
		rl_error("model forward: %d x %d tokens, temperature %g (reserved for %d tokens)", B, T,
		    temperature, a ? a->maxN : 0);
		return RL_EINVAL;
	}
	a->ready = 0;
	a->logits_kept = 0;
	for (int n = 0; n < N; n++)
		a->hpos[n] = pos != NULL ? pos[n] : n % T;
	if ((rv = check_inputs(m, tok, tgt, a->hpos, N, "model forward")) != 0)
		return rv;
	o->upload(o, a->tok, tok, (size_t)N * 4);
	o->upload(o, a->tgt, tgt, (size_t)N * 4);
	o->upload(o, a->pos, a->hpos, (size_t)N * 4);
	if (seg != NULL)
		o->upload(o, a->seg, seg, (size_t)N * 4);
	a->B = B;
	a->T = T;
	a->has_seg = seg != NULL;
	a->inv_temp = 1.0f / temperature;
	const size_t sN = (size_t)a->maxN;

	o->embed_fwd(o, a->res, a->tok, a->pos, W(m, m->wte), W(m, m->wpe), N, C);
	for (int l = 0; l < c->n_layer; l++)
		layer_fwd(m, l);
	norm_fwd(m, a->lnf, a->lnf_mean, a->lnf_rstd, at(a->res, (size_t)c->n_layer * sN * C, s),
	    m->lnf_w, m->lnf_b, N);
	for (int r0 = 0; r0 < N; r0 += a->chunk) {
		int n = RL_MIN(a->chunk, N - r0);
		const void *x = at(a->lnf, (size_t)r0 * C, s);
		if (a->ld != V) {
			/* strided head: rows a->ld apart, no copies */
			o->matmul_fwd_ld(o, a->logits, a->ld, x, W(m, m->lm_w), n, C, V);
			o->logprob_fwd_ld(o, a->lp + r0, a->ent + r0, a->lse_out + r0, a->logits, a->ld,
			    a->tgt + r0, n, V, a->inv_temp);
			continue;
		}
		o->matmul_fwd(o, a->logits, x, W(m, m->lm_w), NULL, n, C, V);
		o->logprob_fwd(o, a->lp + r0, a->ent + r0, a->lse_out + r0, a->logits, a->tgt + r0, n, V,
		    a->inv_temp);
	}
	a->logits_kept = N <= a->chunk;
	if (m->vh_w >= 0) {
		o->matmul_fwd(o, a->vout, a->lnf, W(m, m->vh_w), W(m, m->vh_b), N, C, 1);
		o->cast(o, a->val, RL_F32, a->vout, o->act_dtype, (size_t)N);
	}
	if (lp != NULL)
		o->download(o, lp, a->lp, (size_t)N * 4);
	if (ent != NULL)
		o->download(o, ent, a->ent, (size_t)N * 4);
	if ((rv = check_ops(m, "model forward")) != 0)
		return rv;
	a->ready = 1;
	return RL_OK;
}

/* m->grad_ready: the gradients from tensor i (-1: all) to the end are final. */
static int
grads_final(rl_model *m, int i)
{
	return m->grad_ready ? m->grad_ready(m->grad_ready_ctx, i < 0 ? 0 : m->tt.t[i].off) : RL_OK;
}

int
rl_model_backward(rl_model *m, const float *dlp, const float *dent)
{
	return rl_model_backward_value(m, dlp, dent, NULL);
}

int
rl_model_backward_value(rl_model *m, const float *dlp, const float *dent, const float *dval)
{
	rl_ops *o = m->ops;
	rl_model_act *a = m->act;
	const rl_config *c = &m->cfg;
	int rv;

	if (a == NULL || !a->ready || dlp == NULL || m->grads == NULL || (dval != NULL && m->vh_w < 0)) {
		rl_error("model backward: %s", m->grads == NULL ? "no gradients (rl_model_train_reserve)" :
		    dval != NULL && m->vh_w < 0 ? "value gradient without a value head" :
		    "no forward to differentiate");
		return RL_EINVAL;
	}
	const int B = a->B, T = a->T, N = B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
	const int HD = c->head_dim, QKV = qkv_dim(c), AD = NH * HD, FC = fc_dim(c), H = c->intermediate_size;
	const int V = c->vocab_size;
	const size_t s = asz(m), NC = (size_t)N * C, sN = (size_t)a->maxN;
	const int32_t *dseg = a->has_seg ? a->seg : NULL;

	/* lm_head + log-prob, recomputed chunk by chunk: dlnf (in dx) and dW_lm */
	for (int r0 = 0; r0 < N; r0 += a->chunk) {
		int n = RL_MIN(a->chunk, N - r0);
		void *x = at(a->lnf, (size_t)r0 * C, s);
		/* one chunk held every row in forward: its logits are still there */
		int kept = a->logits_kept;
		a->logits_kept = 0; /* logprob_bwd overwrites them with their gradient */
		if (a->ld != V) {
			/* strided head: dlogits in place, rows a->ld apart, no copies */
			if (!kept)
				o->matmul_fwd_ld(o, a->logits, a->ld, x, W(m, m->lm_w), n, C, V);
			o->logprob_bwd_ld(o, a->logits, a->logits, a->ld, a->tgt + r0, a->lse_out + r0, dlp + r0,
			    dent ? dent + r0 : NULL, n, V, a->inv_temp);
			o->matmul_bwd_ld(o, at(a->dx, (size_t)r0 * C, s), G(m, m->lm_w), a->logits, a->ld, x,
			    W(m, m->lm_w), n, C, V);
			continue;
		}
		if (!kept)
			o->matmul_fwd(o, a->logits, x, W(m, m->lm_w), NULL, n, C, V);
		o->logprob_bwd(o, a->logits, a->logits, a->tgt + r0, a->lse_out + r0, dlp + r0,
		    dent ? dent + r0 : NULL, n, V, a->inv_temp);
		o->matmul_bwd(o, at(a->dx, (size_t)r0 * C, s), G(m, m->lm_w), NULL, a->logits, x,
		    W(m, m->lm_w), n, C, V);
	}
	if (dval != NULL) {
		/* value = lnf . w_v + b_v: its gradient joins the lm_head's in dlnf */
		o->cast(o, a->dvout, o->act_dtype, dval, RL_F32, (size_t)N);
		o->matmul_bwd(o, a->dx2, G(m, m->vh_w), G(m, m->vh_b), a->dvout, a->lnf, W(m, m->vh_w), N, C, 1);
		o->add(o, a->dx, a->dx, a->dx2, NC);
	}
	norm_bwd(m, a->dres, a->dx, at(a->res, (size_t)c->n_layer * sN * C, s), a->lnf_mean,
	    a->lnf_rstd, m->lnf_w, m->lnf_b, N);
	if ((rv = grads_final(m, m->lnf_w)) != 0)
		return rv;
	for (int l = c->n_layer - 1; l >= 0; l--) {
		const rl_layer_idx *y = &m->layer[l];
		const size_t k = a->recompute ? 0 : (size_t)l;
		void *res = at(a->res, l * sN * C, s);
		void *ln1 = at(a->ln1, k * sN * C, s), *ln2 = at(a->ln2, k * sN * C, s);
		void *mid = at(a->res_mid, k * sN * C, s), *qkv = at(a->qkv, k * sN * QKV, s);
		void *att = at(a->att, k * sN * AD, s), *fc = at(a->fc, k * sN * FC, s);
		void *h = at(a->h, k * sN * H, s);
		const float *lse = a->lse + k * sN * NH;
		void *dq;

		/* recompute: this layer's activations again, from its saved input res[l]
		 * (slot 0 holds the last layer's from the forward) */
		if (a->recompute && l != c->n_layer - 1)
			layer_fwd(m, l);

		/* res_out = mid + proj(act(fc(norm2(mid)))) */
		if (c->arch == RL_ARCH_GPT2 && o->matmul_dgelu_bwd) {
			o->matmul_dgelu_bwd(o, a->dfc, G(m, y->proj_w), G(m, y->proj_b), a->dres, h, W(m, y->proj_w),
			    fc, N, H, C);
		} else {
			o->matmul_bwd(o, a->dh, G(m, y->proj_w), G(m, y->proj_b), a->dres, h, W(m, y->proj_w), N, H,
			    C);
			if (c->arch == RL_ARCH_GPT2)
				o->gelu_bwd(o, a->dfc, a->dh, fc, (size_t)N * H);
			else
				o->swiglu_bwd(o, a->dfc, a->dh, fc, N, H);
		}
		o->matmul_bwd(o, a->dx, G(m, y->fc_w), G(m, y->fc_b), a->dfc, ln2, W(m, y->fc_w), N, C, FC);
		norm_bwd_add(m, a->dres, a->dx2, a->dx, mid, a->ln2_mean + k * sN, a->ln2_rstd + k * sN, y->ln2_w,
		    y->ln2_b, N);
		/* mid = res + o(attn(rope(qknorm(qkv(norm1(res)))))) */
		o->matmul_bwd(o, a->datt, G(m, y->o_w), G(m, y->o_b), a->dres, att, W(m, y->o_w), N, AD, C);
		o->attn_bwd(o, a->dqkv, a->datt, att, lse, qkv, dseg, B, T, NH, NKV, HD);
		if (c->arch == RL_ARCH_LLAMA)
			o->rope_bwd(o, a->dqkv, a->pos, N, NH, NKV, HD, cfg_rope(c));
		dq = a->dqkv;
		if (c->qk_norm) {
			o->qknorm_bwd(o, a->dqkv2, G(m, y->qn_w), G(m, y->kn_w), a->dqkv,
			    at(a->qkv_raw, k * sN * QKV, s), W(m, y->qn_w), W(m, y->kn_w),
			    a->qk_rstd + k * sN * (NH + NKV), N, NH, NKV, HD);
			dq = a->dqkv2;
		}
		o->matmul_bwd(o, a->dx, G(m, y->qkv_w), G(m, y->qkv_b), dq, ln1, W(m, y->qkv_w), N, C, QKV);
		norm_bwd_add(m, a->dres, a->dx2, a->dx, res, a->ln1_mean + k * sN, a->ln1_rstd + k * sN, y->ln1_w,
		    y->ln1_b, N);
		if ((rv = grads_final(m, y->ln1_w)) != 0)
			return rv;
	}
	o->embed_bwd(o, G(m, m->wte), G(m, m->wpe), a->dres, a->tok, a->pos, N, C);
	if ((rv = check_ops(m, "model backward")) != 0 || (rv = grads_final(m, -1)) != 0)
		return rv;
	return RL_OK;
}

/* rl_model_step's update as one adamw_multi call: a segment per tensor, its class
 * (RL_T_DECAY: bit 0, RL_T_AUX: bit 1) naming the learning rate and weight decay the
 * per-tensor loop gives it.  RL_ENOMEM (nothing queued): the caller loops. */
static int
step_multi(rl_model *m, const rl_adamw *p, float scale)
{
	rl_ops *o = m->ops;
	float lr[RL_ADAMW_NCLS], wd[RL_ADAMW_NCLS];
	rl_adamw_seg *seg = rl_try_calloc((size_t)RL_MAX(m->tt.n, 1), sizeof *seg, "adamw segments");

	if (seg == NULL)
		return RL_ENOMEM;
	for (int k = 0; k < RL_ADAMW_NCLS; k++) {
		lr[k] = p->lr;
		wd[k] = 0.0f;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		int k = ((t->flags & RL_T_DECAY) ? 1 : 0) | ((t->flags & RL_T_AUX) ? 2 : 0);
		seg[i].off = t->off;
		seg[i].n = t->n;
		seg[i].cls = k;
		lr[k] = rl_adamw_lr(p, t);
		wd[k] = (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f;
	}
	o->adamw_multi(o, m->params, m->w != m->params ? m->w : NULL, m->grads, m->m, m->v, seg, m->tt.n, lr,
	    wd, p->beta1, p->beta2, p->eps, m->step, scale);
	free(seg);
	return RL_OK;
}

int
rl_model_step(rl_model *m, const rl_adamw *p, float *grad_norm)
{
	rl_ops *o = m->ops;
	double norm;
	float scale = 1.0f;

	if (m->grads == NULL || m->m == NULL || p == NULL) {
		rl_error("optimizer step: call rl_model_train_reserve first");
		return RL_EINVAL;
	}
	/* padding between tensors is zero in grads, so one sum covers them all */
	norm = sqrt(o->sumsq(o, m->grads, m->tt.total));
	if (grad_norm != NULL)
		*grad_norm = (float)norm;
	if (!isfinite(norm)) {
		rl_warn("gradient norm is %g; step skipped", norm);
		rl_model_zero_grad(m);
		return check_ops(m, "optimizer step");
	}
	if (p->max_grad_norm > 0)
		scale = (float)RL_MIN(1.0, p->max_grad_norm / (norm + 1e-6));
	m->step++;
	if (o->adamw_multi != NULL && step_multi(m, p, scale) == RL_OK) {
		rl_model_zero_grad(m);
		return check_ops(m, "optimizer step");
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		o->adamw(o, m->params + t->off, m->w != m->params ? W(m, i) : NULL, m->grads + t->off,
		    m->m + t->off, m->v + t->off, t->n, rl_adamw_lr(p, t), p->beta1, p->beta2, p->eps,
		    (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f, m->step, scale);
	}
	rl_model_zero_grad(m);
	return check_ops(m, "optimizer step");
}

/* ---- inference ----------------------------------------------------------------------- */

static void
carve_inf(rl_model *m, rl_model_inf *f, carve *ca, carve *cf, carve *ci)
{
	const rl_config *c = &m->cfg;
	size_t I = (size_t)f->maxI, Bm = (size_t)f->maxB, C = (size_t)c->hidden_size, s = asz(m);
	size_t QKV = (size_t)qkv_dim(c);

	f->x = take(ca, I * C, s);
	f->xn = take(ca, I * C, s);
	f->t = take(ca, I * C, s);
	f->qkv = take(ca, I * QKV, s);
	f->qkv2 = take(ca, I * QKV, s);
	f->att = take(ca, I * c->n_head * c->head_dim, s);
	f->fc = take(ca, I * fc_dim(c), s);
	f->h = take(ca, I * c->intermediate_size, s);
	f->last = take(ca, Bm * C, s);
	f->lastn = take(ca, Bm * C, s);
	f->logits = take(ca, Bm * c->vocab_size, s);
	f->mean = take(cf, I, 4);
	f->rstd = take(cf, I, 4);
	f->lse = take(cf, I * c->n_head, 4);
	f->qk_rstd = take(cf, I * (c->n_head + c->n_kv_head), 4);
	f->tok = take(ci, I, 4);
	f->pos = take(ci, I, 4);
	f->seg = take(ci, I, 4);
	f->slot = take(ci, I, 4);
	f->ctx = take(ci, I, 4);
}

int
rl_model_infer_reserve(rl_model *m, int max_tokens, int max_batch)
{
	rl_ops *o = m->ops;
	rl_model_inf *f;
	carve ca = { 0 }, cf = { 0 }, ci = { 0 };
	int rv;

	if (max_tokens <= 0 || max_batch <= 0)
		return RL_EINVAL;
	if (m->graph_after <= 0) {
		const char *ga = getenv("RL_DECODE_GRAPH_AFTER");
		char *end = NULL;
		long v = ga && *ga ? strtol(ga, &end, 10) : 0;
		m->graph_after = 1;
		if (ga && *ga && (*end != '\0' || v < 1 || v > 1000000))
			rl_warn("RL_DECODE_GRAPH_AFTER=%s is not a count of runs (1 or more): 1 is used", ga);
		else if (v > 0)
			m->graph_after = (int)v;
	}
	max_tokens = RL_MAX(max_tokens, max_batch);
	if (m->inf != NULL && m->inf->maxI >= max_tokens && m->inf->maxB >= max_batch)
		return RL_OK;
	free_inf(m);
	f = rl_xcalloc(1, sizeof *f);
	f->maxI = max_tokens;
	f->maxB = max_batch;
	carve_inf(m, f, &ca, &cf, &ci);
	if ((rv = o->alloc(o, &f->amem, ca.off)) != 0 || (rv = o->alloc(o, (void **)&f->fmem, cf.off)) != 0 ||
	    (rv = o->alloc(o, (void **)&f->imem, ci.off)) != 0) {
		o->free(o, f->amem);
		o->free(o, f->fmem);
		free(f);
		return rv;
	}
	ca.base = f->amem;
	cf.base = (char *)f->fmem;
	ci.base = (char *)f->imem;
	ca.off = cf.off = ci.off = 0;
	carve_inf(m, f, &ca, &cf, &ci);
	f->htok = rl_xcalloc((size_t)4 * max_tokens + 3 * (size_t)max_batch, sizeof *f->htok);
	f->hpos = f->htok + max_tokens;
	f->hseg = f->hpos + max_tokens;
	f->hslot = f->hseg + max_tokens;
	f->hstart = f->hslot + max_tokens;
	f->horder = f->hstart + max_batch;
	f->hfill = f->horder + max_batch;
	if ((f->hlogits = rl_try_malloc((size_t)max_batch * m->cfg.vocab_size * asz(m), "logits")) == NULL) {
		m->inf = f;
		free_inf(m);
		return RL_ENOMEM;
	}
	m->inf = f;
	m->logits = f->logits;
	return check_ops(m, "infer reserve");
}

/* The transformer blocks over N inference tokens in f->x; attention either
 * causal over B rows of N/B tokens with segments (prefill) or, for B
 * sequences of one token each, against the cache (decode).  With the backend's
 * decode fusions and N <= RL_FUSE_ROWS (decode with a few sequences): five kernels
 * a layer and attention's (norm + qkv + rope + kv_write, attention, o + residual,
 * norm + up + act, down + residual; with q/k-norm the qkv product, qknorm and
 * rope + kv_write apart); otherwise the separate ops, each residual add fused with
 * the next norm. */
static void
infer_blocks_in(rl_model *m, rl_kvcache *kv, int N, int decode, int B, const int32_t *pos,
    const int32_t *slot, const int32_t *bt, const int32_t *ctx, int btcols)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const rl_config *c = &m->cfg;
	const int C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, HD = c->head_dim;
	const int QKV = qkv_dim(c), AD = NH * HD, H = c->intermediate_size;
	const size_t NC = (size_t)N * C;
	const int gpt2 = c->arch == RL_ARCH_GPT2, nk = gpt2 ? RL_NORM_LN : RL_NORM_RMS;
	const int fuse = o->matmul_fused_fwd != NULL && N <= RL_FUSE_ROWS;

	for (int l = 0; l < c->n_layer; l++) {
		const rl_layer_idx *y = &m->layer[l];
		void *qkv = f->qkv;

		if (fuse && !c->qk_norm && o->matmul_rope_kv_fwd) {
			/* norm, QKV product, RoPE and the cache write: one kernel */
			o->matmul_rope_kv_fwd(o, qkv, f->xn, f->x, W(m, y->ln1_w), W(m, y->ln1_b), c->norm_eps, nk,
			    W(m, y->qkv_w), W(m, y->qkv_b), N, C, NH, NKV, HD, cfg_rope(c), pos,
			    kv->kc[l], kv->vc[l], slot);
		} else {
			if (fuse) {
				o->matmul_fused_fwd(o, qkv, NULL, f->xn, f->x, W(m, y->ln1_w), W(m, y->ln1_b),
				    c->norm_eps, nk, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV, RL_EP_NONE);
			} else {
				/* later layers got their first norm fused with the previous residual add */
				if (l == 0)
					norm_fwd(m, f->xn, f->mean, f->rstd, f->x, y->ln1_w, y->ln1_b, N);
				o->matmul_fwd(o, qkv, f->xn, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV);
			}
			if (c->qk_norm) {
				o->qknorm_fwd(o, f->qkv2, f->qk_rstd, qkv, W(m, y->qn_w), W(m, y->kn_w), N, NH, NKV,
				    HD, c->norm_eps);
				qkv = f->qkv2;
			}
			if (!gpt2 && o->rope_kv_write) {
				o->rope_kv_write(o, kv->kc[l], kv->vc[l], qkv, pos, slot, N, NH, NKV, HD, cfg_rope(c));
			} else {
				if (!gpt2)
					o->rope_fwd(o, qkv, pos, N, NH, NKV, HD, cfg_rope(c));
				o->kv_write(o, kv->kc[l], kv->vc[l], qkv, slot, N, NH, NKV, HD);
			}
		}
		if (decode)
			o->attn_decode(o, f->att, qkv, kv->kc[l], kv->vc[l], bt, ctx, B, NH, NKV, HD,
			    kv->BS, btcols);
		else
			o->attn_fwd(o, f->att, f->lse, qkv, f->seg, B, N / B, NH, NKV, HD);
		if (fuse) {
			o->matmul_fused_fwd(o, f->x, f->t, NULL, f->att, NULL, NULL, 0.0f, RL_NORM_NONE, W(m, y->o_w),
			    W(m, y->o_b), N, AD, C, RL_EP_ADD);
			o->matmul_fused_fwd(o, f->h, f->fc, f->xn, f->x, W(m, y->ln2_w), W(m, y->ln2_b), c->norm_eps,
			    nk, W(m, y->fc_w), W(m, y->fc_b), N, C, fc_dim(c), gpt2 ? RL_EP_GELU : RL_EP_SWIGLU);
			o->matmul_fused_fwd(o, f->x, f->t, NULL, f->h, NULL, NULL, 0.0f, RL_NORM_NONE, W(m, y->proj_w),
			    W(m, y->proj_b), N, H, C, RL_EP_ADD);
			continue;
		}
		o->matmul_fwd(o, f->t, f->att, W(m, y->o_w), W(m, y->o_b), N, AD, C);
		add_norm_fwd(m, f->x, f->xn, f->mean, f->rstd, f->t, y->ln2_w, y->ln2_b, N);
		mlp_up_fwd(m, f->h, f->fc, f->xn, y, N);
		o->matmul_fwd(o, f->t, f->h, W(m, y->proj_w), W(m, y->proj_b), N, H, C);
		if (l + 1 < c->n_layer)
			add_norm_fwd(m, f->x, f->xn, f->mean, f->rstd, f->t, m->layer[l + 1].ln1_w,
			    m->layer[l + 1].ln1_b, N);
		else
			o->add(o, f->x, f->x, f->t, NC);
	}
}

static void
infer_blocks(rl_model *m, rl_kvcache *kv, int N, int decode, int B)
{
	rl_model_inf *f = m->inf;
	infer_blocks_in(m, kv, N, decode, B, f->pos, f->slot, f->bt, f->ctx, f->btcols);
}

/* Final norm and lm_head over the B rows of x into f->logits: one kernel with the
 * backend's decode fusions and B <= RL_FUSE_ROWS. */
static void
head_fwd(rl_model *m, const void *x, int B)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const rl_config *c = &m->cfg;

	if (o->matmul_fused_fwd != NULL && B <= RL_FUSE_ROWS) {
		o->matmul_fused_fwd(o, f->logits, NULL, f->lastn, x, W(m, m->lnf_w), W(m, m->lnf_b),
		    c->norm_eps, c->arch == RL_ARCH_GPT2 ? RL_NORM_LN : RL_NORM_RMS, W(m, m->lm_w), NULL, B,
		    c->hidden_size, c->vocab_size, RL_EP_NONE);
		return;
	}
	norm_fwd(m, f->lastn, f->mean, f->rstd, x, m->lnf_w, m->lnf_b, B);
	o->matmul_fwd(o, f->logits, f->lastn, W(m, m->lm_w), NULL, B, c->hidden_size, c->vocab_size);
}

/* Final norm and lm_head over B rows in f->last; logits to m->logits and host. */
static int
infer_head(rl_model *m, int B, float *logits, const char *what)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const int V = m->cfg.vocab_size;
	size_t n = (size_t)B * V;

	head_fwd(m, f->last, B);
	if (logits != NULL) {
		if (o->act_dtype == RL_F32) {
			o->download(o, logits, f->logits, n * 4);
		} else {
			o->download(o, f->hlogits, f->logits, n * asz(m));
			for (size_t i = 0; i < n; i++)
				logits[i] = rl_bf16_to_f32(((uint16_t *)f->hlogits)[i]);
		}
	}
	return check_ops(m, what);
}

/* Lays nseq prompts out in rows of T = the longest prompt, first-fit by
 * decreasing length, so attention costs rows x T^2 rather than (sum of
 * lengths)^2 for one packed row; the rest of a row is padding (seg -1,
 * slot -1).  Falls back to one packed row when the padded layout would not
 * fit the reserve.  start[i]: index of prompt i's first token.  Returns rows,
 * *T the row length. */
static int
prefill_layout(rl_model_inf *f, const int *ntok, int nseq, int N, int *T, int *start)
{
	int *order = f->horder, *fill = f->hfill, rows = 0, t = 0;

	for (int i = 0; i < nseq; i++) {
		int j = i;
		t = RL_MAX(t, ntok[i]);
		while (j > 0 && ntok[order[j - 1]] < ntok[i]) {
			order[j] = order[j - 1];
			j--;
		}
		order[j] = i;
	}
	for (int k = 0; k < nseq; k++) {
		int i = order[k], r = 0;
		while (r < rows && fill[r] + ntok[i] > t)
			r++;
		if (r == rows)
			fill[rows++] = 0;
		start[i] = r * t + fill[r];
		fill[r] += ntok[i];
	}
	if ((size_t)rows * t > (size_t)f->maxI) {
		for (int i = 0, k = 0; i < nseq; k += ntok[i], i++)
			start[i] = k;
		rows = 1;
		t = N;
	}
	*T = t;
	return rows;
}

int
rl_model_prefill(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *const *tokens,
    const int *ntok, int nseq, float *logits)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const int C = m->cfg.hidden_size;
	const size_t s = asz(m);
	int N = 0, rv, done = 0, rows, T, n, *start;

	if (f == NULL || nseq <= 0 || nseq > f->maxB) {
		rl_error("model prefill: %d sequences (reserved for %d)", nseq, f ? f->maxB : 0);
		return RL_EINVAL;
	}
	for (int i = 0; i < nseq; i++) {
		if (ntok[i] <= 0 || seqs[i]->len != 0 || ntok[i] > f->maxI - N) {
			rl_error("model prefill: sequence %d: %d tokens after %d (cache length %d, reserved "
			    "for %d tokens)", i, ntok[i], N, seqs[i]->len, f->maxI);
			return RL_EINVAL;
		}
		N += ntok[i];
	}
	start = f->hstart;
	rows = prefill_layout(f, ntok, nseq, N, &T, start);
	n = rows * T;
	for (int k = 0; k < n; k++) {
		f->htok[k] = 0;
		f->hpos[k] = 0;
		f->hseg[k] = -1;
		f->hslot[k] = -1;
	}
	for (int i = 0; i < nseq; i++)
		for (int j = 0; j < ntok[i]; j++) {
			f->htok[start[i] + j] = tokens[i][j];
			f->hpos[start[i] + j] = j;
			f->hseg[start[i] + j] = i;
		}
	if ((rv = check_inputs(m, f->htok, NULL, f->hpos, n, "model prefill")) != 0)
		return rv;
	for (done = 0; done < nseq; done++)
		if ((rv = rl_kvcache_reserve(kv, seqs[done], ntok[done])) != 0)
			goto undo;
	for (int i = 0; i < nseq; i++)
		for (int j = 0; j < ntok[i]; j++)
			f->hslot[start[i] + j] = rl_kvcache_slot(kv, seqs[i], j);
	o->upload(o, f->tok, f->htok, (size_t)n * 4);
	o->upload(o, f->pos, f->hpos, (size_t)n * 4);
	o->upload(o, f->seg, f->hseg, (size_t)n * 4);
	o->upload(o, f->slot, f->hslot, (size_t)n * 4);
	o->embed_fwd(o, f->x, f->tok, f->pos, W(m, m->wte), W(m, m->wpe), n, C);
	infer_blocks(m, kv, n, 0, rows);
	for (int i = 0; i < nseq; i++) {
		o->copy(o, at(f->last, (size_t)i * C, s), at(f->x, (size_t)(start[i] + ntok[i] - 1) * C, s),
		    C * s);
		seqs[i]->len = ntok[i];
	}
	return infer_head(m, nseq, logits, "model prefill");
undo:
	/* give back what was reserved: the sequences were empty */
	for (int i = 0; i < done; i++)
		rl_kvcache_truncate(kv, seqs[i], 0);
	return rv;
}

int
rl_model_decode(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok, int B,
    float *logits)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const int C = m->cfg.hidden_size;
	int rv;

	if (f == NULL || B <= 0 || B > f->maxB) {
		rl_error("model decode: batch of %d (reserved for %d)", B, f ? f->maxB : 0);
		return RL_EINVAL;
	}
	if (f->btcols != kv->maxblk) {
		/* block tables as wide as this cache's: allocated when a new cache shape is seen */
		o->free(o, f->bt);
		free(f->hbt);
		f->bt = NULL;
		f->hbt = NULL;
		f->btcols = 0;
		if ((rv = o->alloc(o, (void **)&f->bt, (size_t)f->maxB * kv->maxblk * 4)) != 0)
			return rv;
		f->hbt = rl_xcalloc((size_t)f->maxB * kv->maxblk, sizeof *f->hbt);
		f->btcols = kv->maxblk;
	}
	for (int b = 0; b < B; b++) {
		f->htok[b] = tok[b];
		f->hpos[b] = seqs[b]->len;
	}
	if ((rv = check_inputs(m, f->htok, NULL, f->hpos, B, "model decode")) != 0)
		return rv;
	for (int b = 0; b < B; b++)
		if ((rv = rl_kvcache_reserve(kv, seqs[b], 1)) != 0)
			return rv;
	for (int b = 0; b < B; b++) {
		f->hslot[b] = rl_kvcache_slot(kv, seqs[b], seqs[b]->len);
		f->hseg[b] = seqs[b]->len + 1; /* context length including the new token */
		memcpy(f->hbt + (size_t)b * f->btcols, seqs[b]->blocks, (size_t)seqs[b]->nblk * 4);
	}
	o->upload(o, f->tok, f->htok, (size_t)B * 4);
	o->upload(o, f->pos, f->hpos, (size_t)B * 4);
	o->upload(o, f->ctx, f->hseg, (size_t)B * 4);
	o->upload(o, f->slot, f->hslot, (size_t)B * 4);
	o->upload(o, f->bt, f->hbt, (size_t)B * f->btcols * 4);
	o->embed_fwd(o, f->x, f->tok, f->pos, W(m, m->wte), W(m, m->wpe), B, C);
	infer_blocks(m, kv, B, 1, B);
	o->copy(o, f->last, f->x, (size_t)B * C * asz(m));
	for (int b = 0; b < B; b++)
		seqs[b]->len++;
	return infer_head(m, B, logits, "model decode");
}

/* ---- decode step with sampling: one upload, one graph, one download ------------------ */

/* Byte offsets of a step's inputs for B rows in the packed buffers: tok, pos, ctx
 * (context length including the new token), slot (i32 (B) each), seed, ctr (u64
 * (B) each), the block tables (i32 (B, cols)). */
typedef struct step_lay { size_t tok, pos, ctx, slot, seed, ctr, bt, in_bytes; } step_lay;

static step_lay
step_layout(int B, int cols)
{
	step_lay l;
	size_t b = (size_t)B;
	l.tok = 0;
	l.pos = 4 * b;
	l.ctx = 8 * b;
	l.slot = 12 * b;
	l.seed = (16 * b + 7) & ~(size_t)7;
	l.ctr = l.seed + 8 * b;
	l.bt = l.ctr + 8 * b;
	l.in_bytes = l.bt + 4 * b * (size_t)cols;
	return l;
}

static void
drop_graphs(rl_model *m)
{
	rl_model_inf *f = m->inf;
	for (int i = 0; i < f->ngraph; i++)
		if (f->graphs[i].g)
			m->ops->graph_destroy(m->ops, f->graphs[i].g);
	f->ngraph = 0;
}

/* (Re)lays out the step buffers for block tables of `cols` columns (a new cache shape). */
static int
step_buffers(rl_model *m, int cols)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	int rv;

	if (f->dstep != NULL && f->step_cols == cols)
		return RL_OK;
	drop_graphs(m);
	o->free(o, f->dstep);
	if (o->host_free)
		o->host_free(o, f->hstep);
	else
		free(f->hstep);
	f->dstep = f->hstep = NULL;
	f->step_cols = 0;
	f->out_off = (step_layout(f->maxB, cols).in_bytes + 255) & ~(size_t)255;
	f->step_bytes = f->out_off + (size_t)8 * f->maxB;
	if ((rv = o->alloc(o, &f->dstep, f->step_bytes)) != 0)
		return rv;
	if (o->host_alloc)
		rv = o->host_alloc(o, &f->hstep, f->step_bytes);
	else if ((f->hstep = rl_try_calloc(1, f->step_bytes, "decode staging")) == NULL)
		rv = RL_ENOMEM;
	if (rv != 0) {
		o->free(o, f->dstep);
		f->dstep = NULL;
		return rv;
	}
	memset(f->hstep, 0, f->step_bytes);
	f->step_cols = cols;
	if (o->decode_step && !f->steplay &&
	    (f->steplay = rl_try_calloc((size_t)m->cfg.n_layer, sizeof *f->steplay, "decode step table")) == NULL)
		return RL_ENOMEM;
	return RL_OK;
}

/* The decode step of B rows as ops->decode_step takes it, into *d: 0 when the backend has
 * no decode_step or it does not take this model, cache and B (the separate ops run). */
static int
step_desc(rl_model *m, const rl_kvcache *kv, rl_step_desc *d, int B)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const rl_config *c = &m->cfg;
	const int gpt2 = c->arch == RL_ARCH_GPT2;

	if (!o->decode_step || !o->decode_step_ok || !f->steplay || c->qk_norm || B > RL_FUSE_ROWS)
		return 0;
	for (int l = 0; l < c->n_layer; l++) {
		const rl_layer_idx *y = &m->layer[l];
		rl_step_layer *t = &f->steplay[l];
		t->ln1_w = W(m, y->ln1_w);
		t->ln1_b = W(m, y->ln1_b);
		t->qkv_w = W(m, y->qkv_w);
		t->qkv_b = W(m, y->qkv_b);
		t->o_w = W(m, y->o_w);
		t->o_b = W(m, y->o_b);
		t->ln2_w = W(m, y->ln2_w);
		t->ln2_b = W(m, y->ln2_b);
		t->fc_w = W(m, y->fc_w);
		t->fc_b = W(m, y->fc_b);
		t->proj_w = W(m, y->proj_w);
		t->proj_b = W(m, y->proj_b);
		t->kc = kv->kc[l];
		t->vc = kv->vc[l];
	}
	memset(d, 0, sizeof *d);
	d->n_layer = c->n_layer;
	d->C = c->hidden_size;
	d->NH = c->n_head;
	d->NKV = c->n_kv_head;
	d->HD = c->head_dim;
	d->H = c->intermediate_size;
	d->V = c->vocab_size;
	d->gpt2 = gpt2;
	d->eps = c->norm_eps;
	d->rope = cfg_rope(c);
	d->BS = kv->BS;
	d->MAXBLK = f->step_cols;
	d->layer = f->steplay;
	d->lnf_w = W(m, m->lnf_w);
	d->lnf_b = W(m, m->lnf_b);
	d->lm_w = W(m, m->lm_w);
	d->x = f->x;
	d->qkv = f->qkv;
	d->att = f->att;
	d->h = f->h;
	d->logits = f->logits;
	return o->decode_step_ok(o, d, B);
}

/* The device work of one decode step, reading every per-step value from f->dstep:
 * embedding, blocks, final norm, lm_head (ops->decode_step when it takes them: one
 * launch), sampling (rows [0, g) with sp, the rest greedy) into the outputs at
 * f->out_off.  The same ops, in the same order, as rl_model_decode followed by the
 * engine's two ops->sample calls (less its copy of x to f->last: the head reads x, the
 * same values), except that decode_step sums attention in another order. */
static void
decode_enqueue(rl_model *m, rl_kvcache *kv, int B, int g, const rl_sample_params *sp)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
	const rl_sample_params greedy = { 0.0f, 0, 1.0f };
	step_lay l = step_layout(B, f->step_cols);
	char *d = f->dstep;
	int32_t *otok = (int32_t *)(d + f->out_off);
	float *olp = (float *)(d + f->out_off + (size_t)4 * B);
	const uint64_t *seed = (const uint64_t *)(d + l.seed), *ctr = (const uint64_t *)(d + l.ctr);

	const int32_t *pos = (const int32_t *)(d + l.pos), *slot = (const int32_t *)(d + l.slot);
	const int32_t *bt = (const int32_t *)(d + l.bt), *ctx = (const int32_t *)(d + l.ctx);
	rl_step_desc sd;

	o->embed_fwd(o, f->x, (const int32_t *)(d + l.tok), pos, W(m, m->wte), W(m, m->wpe), B, C);
	if (step_desc(m, kv, &sd, B)) {
		o->decode_step(o, &sd, pos, slot, bt, ctx, B);
		m->dstats.onestep++;
	} else {
		infer_blocks_in(m, kv, B, 1, B, pos, slot, bt, ctx, f->step_cols);
		head_fwd(m, f->x, B);  /* the B rows of x are the last rows: no copy to f->last */
	}
	if (g > 0)
		o->sample(o, otok, olp, f->logits, seed, ctr, g, V, sp);
	if (B > g)
		o->sample(o, otok + g, olp + g, (const char *)f->logits + (size_t)g * V * asz(m), seed + g,
		    ctr + g, B - g, V, &greedy);
}

/* The recorded step for this key, a new entry (DG_NEW) when there is none, NULL when
 * graphs are off. */
static dgraph *
find_graph(rl_model *m, const rl_kvcache *kv, int B, int g, const rl_sample_params *sp)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	dgraph *d;

	if (m->no_graph || !o->graph_begin || !o->graph_end || !o->graph_launch || !o->graph_ok ||
	    !o->graph_destroy)
		return NULL;
	for (int i = 0; i < f->ngraph; i++) {
		d = &f->graphs[i];
		if (d->B == B && d->ng == g && d->sp.temperature == sp->temperature && d->sp.top_k == sp->top_k &&
		    d->sp.top_p == sp->top_p && d->kvmem == kv->mem && d->kvBS == kv->BS &&
		    d->kvnblk == kv->nblk && d->w == m->w)
			return d;
	}
	if (f->ngraph == f->capgraph) {
		/* one per batch size and greedy split in practice; past a bound, start over */
		if (f->capgraph >= 4 * f->maxB + 64)
			drop_graphs(m);
		else {
			int nc = f->capgraph ? 2 * f->capgraph : 16;
			dgraph *ng = realloc(f->graphs, (size_t)nc * sizeof *ng);
			if (!ng)
				return NULL;
			f->graphs = ng;
			f->capgraph = nc;
		}
	}
	d = &f->graphs[f->ngraph++];
	memset(d, 0, sizeof *d);
	d->state = DG_NEW;
	d->B = B;
	d->ng = g;
	d->sp = *sp;
	d->kvmem = kv->mem;
	d->kvBS = kv->BS;
	d->kvnblk = kv->nblk;
	d->w = m->w;
	return d;
}

/* Queues the step's device work: replays its graph, records one, or runs the ops. */
static int
decode_run(rl_model *m, rl_kvcache *kv, int B, int g, const rl_sample_params *sp)
{
	rl_ops *o = m->ops;
	dgraph *d = find_graph(m, kv, B, g, sp);
	int rv;

	if (d && d->state == DG_GRAPH && !o->graph_ok(o, d->g)) {
		/* a scratch buffer moved since recording (it only grows: record again now) */
		o->graph_destroy(o, d->g);
		d->g = NULL;
		d->state = DG_WARM;
		m->dstats.stale++;
	}
	if (d && d->state == DG_WARM) {
		if ((rv = o->graph_begin(o)) == RL_OK) {
			decode_enqueue(m, kv, B, g, sp);
			rv = o->graph_end(o, &d->g);
			if (rv == RL_OK)
				m->dstats.captures++;
		}
		d->state = rv == RL_OK ? DG_GRAPH : DG_FAILED;
		if (rv != RL_OK)
			rl_verbose("decode: batch of %d runs op by op (no graph: %s)", B, rl_strerror(rv));
	}
	if (d && d->state == DG_GRAPH) {
		if ((rv = o->graph_launch(o, d->g)) != RL_OK)
			return rv;
		m->dstats.launches++;
		return RL_OK;
	}
	/* the first runs of a key go op by op: scratch buffers and GEMM heuristics are set up
	 * outside the recording (one run), and a batch size seen only a few times is not worth
	 * a recording (m->graph_after runs, at least 1) */
	if (d && d->state == DG_NEW && ++d->runs >= RL_MAX(m->graph_after, 1))
		d->state = DG_WARM;
	decode_enqueue(m, kv, B, g, sp);
	m->dstats.direct++;
	return RL_OK;
}

/* The inputs of the first of n decode steps (n - 1 more fed on the backend) packed into the
 * staging and queued up: the tokens checked, the cache room of the n tokens reserved (the
 * block tables then cover every step) */
static int
step_inputs(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok, const uint64_t *seed,
    const uint64_t *ctr, int B, int n, const step_lay *l)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	char *h = f->hstep;
	int32_t *htok = (int32_t *)(h + l->tok), *hpos = (int32_t *)(h + l->pos);
	int32_t *hctx = (int32_t *)(h + l->ctx), *hslot = (int32_t *)(h + l->slot), *hbt = (int32_t *)(h + l->bt);
	uint64_t *hseed = (uint64_t *)(h + l->seed), *hctr = (uint64_t *)(h + l->ctr);
	int rv;

	for (int b = 0; b < B; b++) {
		htok[b] = tok[b];
		hpos[b] = seqs[b]->len;
	}
	if ((rv = check_inputs(m, htok, NULL, hpos, B, "model decode")) != 0)
		return rv;
	for (int b = 0; b < B; b++)
		if (m->cfg.arch == RL_ARCH_GPT2 && hpos[b] + n > m->cfg.max_pos) {
			rl_error("model decode: %d steps from position %d at index %d pass the model's %d positions", n,
			    hpos[b], b, m->cfg.max_pos);
			return RL_EINVAL;
		}
	for (int b = 0; b < B; b++)
		if ((rv = rl_kvcache_reserve(kv, seqs[b], n)) != 0)
			return rv;
	for (int b = 0; b < B; b++) {
		hslot[b] = rl_kvcache_slot(kv, seqs[b], seqs[b]->len);
		hctx[b] = seqs[b]->len + 1;
		memcpy(hbt + (size_t)b * f->step_cols, seqs[b]->blocks, (size_t)seqs[b]->nblk * 4);
		hseed[b] = seed[b];
		hctr[b] = ctr[b];
	}
	if (o->upload_async)
		o->upload_async(o, f->dstep, h, l->in_bytes);
	else
		o->upload(o, f->dstep, h, l->in_bytes);
	return RL_OK;
}

int
rl_model_decode_sample(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok,
    const uint64_t *seed, const uint64_t *ctr, int B, int g, const rl_sample_params *sp,
    int32_t *out_tok, float *out_logp)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	double t0 = rl_now(), t1;
	int rv;

	if (f == NULL || B <= 0 || B > f->maxB || g < 0 || g > B) {
		rl_error("model decode: batch of %d, %d sampled (reserved for %d)", B, g, f ? f->maxB : 0);
		return RL_EINVAL;
	}
	if ((rv = step_buffers(m, kv->maxblk)) != 0)
		return rv;
	step_lay l = step_layout(B, f->step_cols);
	char *h = f->hstep;

	if ((rv = step_inputs(m, kv, seqs, tok, seed, ctr, B, 1, &l)) != 0)
		return rv;
	if ((rv = decode_run(m, kv, B, g, sp)) != 0) {
		check_ops(m, "model decode");
		return rv;
	}
	for (int b = 0; b < B; b++)
		seqs[b]->len++;
	if (o->download_async)
		o->download_async(o, h + f->out_off, (char *)f->dstep + f->out_off, (size_t)8 * B);
	else
		o->download(o, h + f->out_off, (char *)f->dstep + f->out_off, (size_t)8 * B);
	t1 = rl_now();
	if ((rv = o->sync(o)) != 0) {
		rl_error("model decode: backend '%s' failed: %s", o->name, rl_strerror(rv));
		return rv;
	}
	memcpy(out_tok, h + f->out_off, (size_t)4 * B);
	memcpy(out_logp, h + f->out_off + (size_t)4 * B, (size_t)4 * B);
	m->dstats.steps++;
	m->dstats.t_host += t1 - t0;
	m->dstats.t_wait += rl_now() - t1;
	return RL_OK;
}

/* ---- multi-step decoding: n steps queued at once, the tokens fed back on the backend ------ */

/* rl_model_decode_multi's output staging for `bytes` (grown, never shrunk) */
static int
multi_staging(rl_model *m, size_t bytes)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	if (f->hmulti_bytes >= bytes)
		return RL_OK;
	if (o->host_free)
		o->host_free(o, f->hmulti);
	else
		free(f->hmulti);
	f->hmulti = NULL;
	f->hmulti_bytes = 0;
	if (o->host_alloc) {
		int rv = o->host_alloc(o, &f->hmulti, bytes);
		if (rv != RL_OK) {
			f->hmulti = NULL;
			return rv;
		}
	} else if ((f->hmulti = rl_try_malloc(bytes, "multi-step decode staging")) == NULL) {
		return RL_ENOMEM;
	}
	f->hmulti_bytes = bytes;
	return RL_OK;
}

int
rl_model_decode_multi(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok,
    const uint64_t *seed, const uint64_t *ctr, int B, int g, const rl_sample_params *sp, int n,
    int32_t *out_tok, float *out_logp)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	double t0 = rl_now(), t1;
	int rv;

	if (f == NULL || B <= 0 || B > f->maxB || g < 0 || g > B || n < 1) {
		rl_error("model decode: %d steps of a batch of %d, %d sampled (reserved for %d)", n, B, g,
		    f ? f->maxB : 0);
		return RL_EINVAL;
	}
	if (n == 1 || !o->decode_advance) {
		/* step by step through the host: each step's tokens are the next one's input */
		uint64_t *c = rl_try_malloc((size_t)B * sizeof *c, "decode counters");
		if (c == NULL)
			return RL_ENOMEM;
		rv = RL_OK;
		for (int k = 0; k < n && rv == RL_OK; k++) {
			for (int b = 0; b < B; b++)
				c[b] = ctr[b] + (uint64_t)k;
			rv = rl_model_decode_sample(m, kv, seqs, k ? out_tok + (size_t)(k - 1) * B : tok, seed, c, B, g, sp,
			    out_tok + (size_t)k * B, out_logp + (size_t)k * B);
		}
		free(c);
		return rv;
	}
	if ((rv = step_buffers(m, kv->maxblk)) != 0)
		return rv;
	if ((rv = multi_staging(m, (size_t)n * B * 8)) != 0)
		return rv;
	step_lay l = step_layout(B, f->step_cols);
	char *d = f->dstep;

	if ((rv = step_inputs(m, kv, seqs, tok, seed, ctr, B, n, &l)) != 0)
		return rv;
	char *hm = f->hmulti;
	for (int k = 0; k < n; k++) {
		if (k > 0)
			o->decode_advance(o, (int32_t *)(d + l.tok), (int32_t *)(d + l.pos), (int32_t *)(d + l.ctx),
			    (int32_t *)(d + l.slot), (uint64_t *)(d + l.ctr), (const int32_t *)(d + l.bt),
			    (const int32_t *)(d + f->out_off), B, f->step_cols, kv->BS);
		if ((rv = decode_run(m, kv, B, g, sp)) != 0) {
			check_ops(m, "model decode");
			o->sync(o);
			return rv;
		}
		if (o->download_async)
			o->download_async(o, hm + (size_t)k * B * 8, d + f->out_off, (size_t)8 * B);
		else
			o->download(o, hm + (size_t)k * B * 8, d + f->out_off, (size_t)8 * B);
	}
	t1 = rl_now();
	if ((rv = o->sync(o)) != 0) {
		rl_error("model decode: backend '%s' failed: %s", o->name, rl_strerror(rv));
		return rv;
	}
	for (int k = 0; k < n; k++) {
		memcpy(out_tok + (size_t)k * B, hm + (size_t)k * B * 8, (size_t)4 * B);
		memcpy(out_logp + (size_t)k * B, hm + (size_t)k * B * 8 + (size_t)4 * B, (size_t)4 * B);
	}
	for (int b = 0; b < B; b++)
		seqs[b]->len += n;
	m->dstats.steps += (uint64_t)n;
	m->dstats.t_host += t1 - t0;
	m->dstats.t_wait += rl_now() - t1;
	return RL_OK;
}

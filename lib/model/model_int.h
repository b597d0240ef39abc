/*
 * model_int.h — what model.c, model_train.c and model_infer.c share and no caller
 * sees: the training activations and inference buffers (rl_model_act,
 * rl_model_inf), the recorded decode steps, the small accessors over the tensor
 * table, and the layer pieces both passes run.
 *
 * Leaves out: the public contract (model.h).
 */
#ifndef RL_MODEL_INT_H
#define RL_MODEL_INT_H

#include <math.h>

#include "model/model.h"
#include "model/lora.h"

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
	void *ao, *mo;          /* Gemma: (L, N, C) the attention's and the MLP's outputs before
	                         * their post norms */
	float *pa_rstd, *pf_rstd; /* Gemma: (L, N) those norms' rstd */
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

/* LoRA adapters (lora.h): the options, each layer's tensors, and host scratch for
 * the adapter's passes (CPU backend only: plain f32 memory). */
struct rl_lora {
	rl_lora_opts o;
	float scale;            /* alpha / r */
	int (*ix)[RL_LORA_NMOD][2];     /* (L): tt index of A, B; -1 when not targeted */
	int maxN;
	float *u, *du;          /* (maxN, r) */
	float *d, *xa, *xd;     /* (maxN, widest out), (maxN, widest in) x 2 */
	uint64_t pass;          /* training forwards since AdamW update pass_step: with it, the
	                         * dropout masks' key (so that --resume draws the same ones) */
	int pass_step;
	int drop;               /* the last forward applied dropout */
	int off;                /* rl_model_lora_off: the forwards compute the base alone */
	int fwd_off;            /* the last forward ran with the adapters off: no backward of it */
};

/* Where in a layer an adapter adds to a base GEMM's output. */
enum { RLI_LORA_QKV, RLI_LORA_O, RLI_LORA_FC, RLI_LORA_DOWN };

/* ---- small helpers -------------------------------------------------------- */

static inline size_t asz(const rl_model *m) { return rl_dtype_size(m->ops->act_dtype); }

/* The config's RoPE as the ops take it (lib/compute/ops.h); GPT-2, which has none: theta 0 */
static inline rl_rope
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
/* Layer l's RoPE: cfg_rope, except in Gemma 3, whose sliding layers rotate by
 * rope_local_base_freq unscaled and whose full layers may divide every frequency by a
 * linear factor.  rl_rope has no linear type: Llama 3's rule with orig / lo = 1, below
 * every wavelength (>= 2 pi), divides all of them by factor, as linear scaling does
 * (rl_cpu_rope_inv: inv / factor, the same fp32 division as transformers'). */
static inline rl_rope
layer_rope(const rl_config *c, int l)
{
	rl_rope r = cfg_rope(c);

	if (!c->gemma)
		return r;
	if (c->local[l]) {
		r.theta = c->rope_local_theta;
	} else if (c->rope_linear > 0) {
		r.factor = c->rope_linear;
		r.lo = 1.0f;
		r.hi = 2.0f;
		r.orig = 1.0f;
	}
	return r;
}
/* Layer l's attention window (0: none): Mistral's every layer, Gemma 3's sliding ones. */
static inline int
layer_window(const rl_config *c, int l)
{
	return c->gemma && !c->local[l] ? 0 : c->sliding_window;
}
/* The scores' scale, and whether layer l's attention is the ops table's (1/sqrt(HD), no
 * window) or needs the CPU's rl_cpu_attn_*_ex. */
static inline float
attn_scale(const rl_config *c)
{
	return c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim);
}
static inline int
attn_plain(const rl_config *c, int l)
{
	return layer_window(c, l) == 0 && c->attn_scale == 0;
}
static inline int qkv_dim(const rl_config *c) { return (c->n_head + 2 * c->n_kv_head) * c->head_dim; }
static inline int fc_dim(const rl_config *c)
{
	return c->arch == RL_ARCH_GPT2 ? c->intermediate_size : 2 * c->intermediate_size;
}

static inline void *
W(const rl_model *m, int i)
{
	return i < 0 ? NULL : (char *)m->w + m->tt.t[i].off * asz(m);
}
/* Tensor i frozen: with adapters every base tensor is (the value head is not). */
static inline int
frozen(const rl_model *m, int i)
{
	return m->lora != NULL && !(m->tt.t[i].flags & (RL_T_LORA | RL_T_AUX));
}
/* Tensor i's gradient; a frozen norm's goes to the sink (its ops always write one). */
static inline float *
G(const rl_model *m, int i)
{
	return i < 0 ? NULL : frozen(m, i) ? m->gsink : m->grads + (m->tt.t[i].off - m->goff);
}
/* G for a GEMM's weight or bias: NULL (no gradient computed) when frozen. */
static inline float *GT(const rl_model *m, int i) { return i < 0 || frozen(m, i) ? NULL : G(m, i); }
static inline void *at(void *base, size_t idx, size_t sz) { return (char *)base + idx * sz; }

/* Bump allocation over one buffer: measure with base NULL, then assign. */
typedef struct carve { char *base; size_t off; } carve;
static inline void *
take(carve *c, size_t n, size_t esz)
{
	void *p = c->base ? c->base + c->off : NULL;
	c->off += (n * esz + 63) & ~(size_t)63;
	return p;
}

static inline int
check_ops(rl_model *m, const char *what)
{
	int rv = m->ops->status(m->ops);
	if (rv != 0)
		rl_error("%s: backend '%s' failed: %s", what, m->ops->name, rl_strerror(rv));
	return rv;
}

/* ---- in model.c ------------------------------------------------------------------- */

/* Free m->act (m->inf) and clear the pointers into it; nothing when absent. */
void rli_model_free_act(rl_model *m);
void rli_model_free_inf(rl_model *m);

/* norm forward for either architecture: RMSNorm (Llama) or LayerNorm (GPT-2). */
void rli_model_norm_fwd(rl_model *m, void *out, float *mean, float *rstd, const void *x, int wi, int bi,
    int N);
/* x += t, then out = the norm of x (weights wi, bi): one kernel where the backend has it. */
void rli_model_add_norm_fwd(rl_model *m, void *x, void *out, float *mean, float *rstd, const void *t,
    int wi, int bi, int N);
/* fc = up projection of xn, h = activation of fc. */
void rli_model_mlp_up_fwd(rl_model *m, void *h, void *fc, const void *xn, const rl_layer_idx *y, int N);

/* Layer l's attention (ops.h attn_fwd, attn_bwd, attn_decode over the config's heads):
 * the ops table's, or on the CPU rl_cpu_attn_*_ex with the layer's window and the
 * config's scale (lib/compute/ops_cpu.h).  On another backend a window never binds
 * (check_backend caps the context) and the scale is the table's. */
void rli_model_attn_fwd(rl_model *m, int l, void *out, float *lse, const void *qkv, const int32_t *seg, int B,
    int T);
void rli_model_attn_bwd(rl_model *m, int l, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T);
void rli_model_attn_decode(rl_model *m, int l, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *bt, const int32_t *ctx, int B, int BS, int btcols);

/* Buffers of m's buffers grown from old_n to new_n elements of esz bytes, zeroed past
 * old_n (m->params and the compute copy after tensors were appended to the table). */
int rli_model_grow_params(rl_model *m, size_t old_n);

/* ---- in lora.c ----------------------------------------------------------------------- */

/* Scratch for passes of up to N rows. */
int rli_lora_reserve(rl_model *m, int N);
void rli_lora_free(rl_model *m);
/* out (N, ld) += the adapters of layer l at site (x (N, in): the GEMM's input). */
void rli_lora_fwd(rl_model *m, int l, int site, const void *x, void *out, int N);
/* Backward of rli_lora_fwd: dout (N, ld) the gradient of out; dA, dB accumulated,
 * dx (N, in) += the adapters' input gradient. */
void rli_lora_bwd(rl_model *m, int l, int site, const void *x, const void *dout, void *dx, int N);

/* ---- in model_gemma.c --------------------------------------------------------------- */

/* The embeddings' scale, x (N, C) *= sqrt(hidden_size) rounded to the act dtype (CPU: f32). */
void rli_gemma_embed_scale(rl_model *m, void *x, int N);
/* Gemma's RMSNorm, x * rstd * (1 + w): forward, and backward with dx overwritten (acc 0)
 * or added to (acc 1); dw accumulated. */
void rli_gemma_norm_fwd(rl_model *m, void *out, float *rstd, const void *x, int wi, int N);
void rli_gemma_norm_bwd(rl_model *m, void *dx, const void *dout, const void *x, const float *rstd, int wi,
    int N, int acc);
/* Block l of the training forward (res[l] -> res[l+1]) and its backward (a->dres: the
 * gradient of res[l+1] in, of res[l] out), as model_train.c's layer_fwd / backward loop. */
void rli_gemma_layer_fwd(rl_model *m, int l);
void rli_gemma_layer_bwd(rl_model *m, int l);
/* model_infer.c's blocks for Gemma 3 (same arguments as its infer_blocks_in). */
void rli_gemma_infer_blocks(rl_model *m, rl_kvcache *kv, int N, int decode, int B, const int32_t *pos,
    const int32_t *slot, const int32_t *bt, const int32_t *ctx, int btcols);

/* ---- in model_train.c --------------------------------------------------------------- */

/* RL_EINVAL, with a message naming `what`, when a token, target (tgt may be NULL)
 * or position of the N is outside the model's range. */
int rli_model_check_inputs(const rl_model *m, const int32_t *tok, const int32_t *tgt, const int32_t *pos,
    int N, const char *what);

#endif

/*
 * ops.h — the backend contract: every operation the models, the trainer and
 * the generation engine need, as one table of function pointers.  lib/compute/ops_cpu.c
 * is the plain C11 + OpenMP reference (the oracle for everything); the CUDA
 * backend (lib/compute/ops_cuda.c over kernels/launch.h) implements the same table.
 *
 * Leaves out: model structure (model.h), algorithms (loss aggregation is the
 * caller's, through per-token weights), communication (comm.h).
 *
 * Conventions
 * - Pointers are backend memory (host for "cpu", device for "cuda") obtained
 *   from ops->alloc, except where a parameter says "host".
 * - "act" tensors hold the backend's activation dtype, ops->act_dtype: RL_F32 on
 *   the CPU, RL_BF16 on CUDA.  Compute weights ("w") are act dtype too (on the
 *   CPU they are the fp32 master weights themselves; on CUDA a bf16 copy that
 *   adamw refreshes).  Everything marked f32 is float on every backend:
 *   master weights, weight gradients, optimizer state, statistics (rstd, lse),
 *   log-probs, losses.  i32 is int32_t.
 * - Shapes are in comments, row-major, last index fastest.  N = B*T token rows.
 * - Outputs come first, then inputs, then sizes, then parameters (llm.c).
 * - Backward ops: activation gradients ("dx") are OVERWRITTEN; weight gradients
 *   ("dw", "db", f32) are ACCUMULATED (+=) so micro-batches add up.
 * - Ops do not return errors: a backend records the first failure and
 *   ops->status() returns it (and clears it); sync() returns it too.
 * - Thread-safety: one rl_ops is used by one thread at a time.
 *
 * Attention layout: the fused QKV projection's output is one act buffer
 * qkv (N, (NH + 2*NKV) * HD): per token, NH query heads, then NKV key heads, then
 * NKV value heads, each HD wide.  Causality and packing: with seg (B, T) i32,
 * query t of row b attends key s <= t iff seg[b,s] == seg[b,t]; seg < 0 marks
 * padding (output 0, no gradient).  seg == NULL means one sequence per row.
 * RoPE follows Hugging Face's rotate-half convention:
 *   inv_freq[i] = theta^(-2i/HD) (fp32), rescaled by Llama 3's rule when the rl_rope
 *   says so (below), angle = pos * inv_freq[i],
 *   out[i]      = x[i] * cos - x[i + HD/2] * sin,
 *   out[i+HD/2] = x[i + HD/2] * cos + x[i] * sin,   i < HD/2.
 *
 * KV cache (generation) is paged: per layer two act tensors
 * kc, vc (NBLK, BS, NKV, HD); a sequence owns a block table of block ids, so a
 * group's samples share their prompt's blocks.  slot = block * BS + offset.
 */
#ifndef RL_OPS_H
#define RL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"

typedef struct rl_ops rl_ops;

/* RoPE's frequencies, passed by value to every op that rotates: the base theta and,
 * when factor > 0, Llama 3's rescaling (config.json rope_type "llama3", transformers'
 * _compute_llama3_parameters), in fp32 as transformers computes it from the fp32 inv:
 *   wavelen = 2 pi / inv;  wavelen > orig / lo: inv / factor;  wavelen < orig / hi: inv;
 *   else with s = (orig / wavelen - lo) / (hi - lo): (1 - s) inv / factor + s inv.
 * factor 0 is the plain rotation (the other fields unused).  The CPU reference of one
 * frequency is rl_cpu_rope_inv (lib/compute/ops_cpu.h); kernels/common.cuh has the device's. */
typedef struct rl_rope {
	float theta;   /* base (> 0; rope_kv_write and the decode step take <= 0 as no rotation) */
	float factor;  /* 0: no scaling; else > 0 */
	float lo, hi;  /* low_freq_factor, high_freq_factor: 0 < lo < hi */
	float orig;    /* original_max_position_embeddings (> 0) */
} rl_rope;

/* A segment of the multi-tensor AdamW (adamw_multi, the end of rl_ops): elements
 * [off, off + n) of the optimizer's buffers, with the learning rate and weight decay of
 * class cls (< RL_ADAMW_NCLS). */
typedef struct rl_adamw_seg {
	size_t off, n;
	int cls;
} rl_adamw_seg;
#define RL_ADAMW_NCLS 4
/* matmul_fused_fwd's input norm and epilogue (below); RL_FUSE_ROWS: the rows it fuses. */
enum { RL_NORM_NONE = 0, RL_NORM_RMS, RL_NORM_LN };
enum { RL_EP_NONE = 0, RL_EP_ADD, RL_EP_GELU, RL_EP_SWIGLU };
#define RL_FUSE_ROWS 4

/* A decode step's weights and buffers for decode_step (the end of rl_ops).  Per layer the
 * tensors of lib/model/model_infer.c's block (NULL biases and ln*_b for none; fc (H, C), or (2H, C)
 * gate rows then up rows with SwiGLU) and its KV cache (NBLK, BS, NKV, HD). */
typedef struct rl_step_layer {
	const void *ln1_w, *ln1_b, *qkv_w, *qkv_b, *o_w, *o_b;
	const void *ln2_w, *ln2_b, *fc_w, *fc_b, *proj_w, *proj_b;
	void *kc, *vc;
} rl_step_layer;
typedef struct rl_step_desc {
	int n_layer, C, NH, NKV, HD, H, V;
	int gpt2;                    /* 1: LayerNorm, GELU, no RoPE; 0: RMSNorm, SwiGLU, RoPE */
	float eps;
	rl_rope rope;
	int BS, MAXBLK;              /* cache block size; columns of the block table */
	const rl_step_layer *layer;  /* host array (n_layer); the backend copies what it needs */
	const void *lnf_w, *lnf_b, *lm_w;
	void *x;                     /* (B, C) act: the embedded tokens in, the last block's out */
	void *qkv, *att, *h;         /* act scratch: (B, (NH+2NKV) HD), (B, NH HD), (B, H) */
	void *logits;                /* (B, V) act */
} rl_step_desc;

/* Parameters of the fused policy-gradient loss (per token). */
typedef struct rl_pg_params {
	float clip_low;     /* ratio lower clip: 1 - clip_low (PPO eps, e.g. 0.2) */
	float clip_high;    /* ratio upper clip: 1 + clip_high (DAPO clip-higher, e.g. 0.28) */
	float dual_clip;    /* dual-clip constant c > 1 for negative advantages; 0 = off */
	float tis_cap;      /* truncated importance sampling cap on exp(old - behave); 0 = off */
	float kl_coef;      /* coefficient of the KL penalty in the loss; 0 = off */
	int kl_type;        /* 1: k1 = lp - ref, 2: k2 = (lp - ref)^2 / 2, 3: k3 = exp(ref-lp) - (ref-lp) - 1 */
	float ent_coef;     /* entropy bonus coefficient (loss -= ent_coef * entropy); 0 = off */
} rl_pg_params;

/* Per-token statistics written by pg_loss (f32 (N, RL_PG_NSTAT)). */
enum { RL_PG_LOSS = 0, RL_PG_CLIPPED, RL_PG_RATIO, RL_PG_KL, RL_PG_NSTAT };

/* Sampling parameters (generation). temperature 0 means greedy. */
typedef struct rl_sample_params {
	float temperature;
	int top_k;          /* 0 = off */
	float top_p;        /* 1 = off */
} rl_sample_params;

struct rl_ops {
	const char *name;   /* "cpu", "cuda" */
	int act_dtype;      /* RL_F32 or RL_BF16 */
	int device;         /* device ordinal, -1 for the CPU */
	void *ctx;          /* backend state; opaque */

	/* ---- memory and control ---------------------------------------------- */
	int (*alloc)(rl_ops *o, void **p, size_t bytes);          /* RL_ENOMEM with the size logged */
	void (*free)(rl_ops *o, void *p);                          /* NULL ok */
	void (*upload)(rl_ops *o, void *dst, const void *host_src, size_t bytes);
	void (*download)(rl_ops *o, void *host_dst, const void *src, size_t bytes); /* synchronous */
	void (*copy)(rl_ops *o, void *dst, const void *src, size_t bytes);
	void (*zero)(rl_ops *o, void *p, size_t bytes);
	/* out[i] = (out_dt) in[i], dtypes among RL_F32, RL_BF16 */
	void (*cast)(rl_ops *o, void *out, int out_dt, const void *in, int in_dt, size_t n);
	int (*sync)(rl_ops *o);                                    /* waits; returns status() */
	int (*status)(rl_ops *o);                                  /* first error since last call */

	/* ---- embedding --------------------------------------------------------- */
	/* out (N,C) act = wte[tok[n]] (+ wpe[pos[n]] when wpe != NULL).  tok, pos i32 (N). */
	void (*embed_fwd)(rl_ops *o, void *out, const int32_t *tok, const int32_t *pos,
	    const void *wte, const void *wpe, int N, int C);
	/* dwte (V,C) f32 += scatter of dout (N,C) act; dwpe likewise when non-NULL. */
	void (*embed_bwd)(rl_ops *o, float *dwte, float *dwpe, const void *dout,
	    const int32_t *tok, const int32_t *pos, int N, int C);

	/* ---- normalisation ----------------------------------------------------- */
	/* out (N,C) = x / sqrt(mean(x^2) + eps) * w;  rstd (N) f32 saved for bwd. */
	void (*rmsnorm_fwd)(rl_ops *o, void *out, float *rstd, const void *x, const void *w,
	    int N, int C, float eps);
	void (*rmsnorm_bwd)(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
	    const void *w, const float *rstd, int N, int C);
	/* out = (x - mean) * rstd * w + b;  mean, rstd (N) f32.  b may be NULL (no bias); so may
	 * db in bwd. */
	void (*layernorm_fwd)(rl_ops *o, void *out, float *mean, float *rstd, const void *x,
	    const void *w, const void *b, int N, int C, float eps);
	void (*layernorm_bwd)(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
	    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
	/* Qwen3 q/k-norm: RMSNorm over HD of each q head (weight wq (HD)) and k head
	 * (weight wk (HD)) of qkv_in (N, (NH+2NKV)*HD) into qkv_out (same shape, v copied);
	 * rstd (N, NH+NKV) f32.  In place (qkv_out == qkv_in) is allowed, and so is
	 * dqkv_in == dqkv_out in bwd. */
	void (*qknorm_fwd)(rl_ops *o, void *qkv_out, float *rstd, const void *qkv_in,
	    const void *wq, const void *wk, int N, int NH, int NKV, int HD, float eps);
	void (*qknorm_bwd)(rl_ops *o, void *dqkv_in, float *dwq, float *dwk, const void *dqkv_out,
	    const void *qkv_in, const void *wq, const void *wk, const float *rstd,
	    int N, int NH, int NKV, int HD);

	/* ---- linear layers ----------------------------------------------------- */
	/* out (N,OC) = inp (N,C) @ w(OC,C)^T + bias (OC, NULL for none). */
	void (*matmul_fwd)(rl_ops *o, void *out, const void *inp, const void *w, const void *bias,
	    int N, int C, int OC);
	/* dinp (N,C) = dout @ w (skipped when NULL); dw (OC,C) f32 += dout^T @ inp;
	 * dbias (OC) f32 += column sums of dout (skipped when NULL).  dw NULL skips dw too. */
	void (*matmul_bwd)(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout,
	    const void *inp, const void *w, int N, int C, int OC);

	/* ---- position, attention --------------------------------------------- */
	/* RoPE in place on the q and k heads of qkv (N, (NH+2NKV)*HD); pos (N) i32.  HD even;
	 * the angle is the fp32 product pos * inv_freq, as HF computes it; rope.theta > 0. */
	void (*rope_fwd)(rl_ops *o, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD,
	    rl_rope rope);
	/* The transpose: rotates dqkv in place by -angle. */
	void (*rope_bwd)(rl_ops *o, void *dqkv, const int32_t *pos, int N, int NH, int NKV, int HD,
	    rl_rope rope);
	/* Causal attention with GQA (query head h uses kv head h / (NH/NKV)), scale 1/sqrt(HD).
	 * out (B,T,NH*HD) act; lse (B,NH,T) f32 log-sum-exp of the scaled scores, for bwd.
	 * Padding queries (seg < 0) get out = 0 and lse = 0. */
	void (*attn_fwd)(rl_ops *o, void *out, float *lse, const void *qkv, const int32_t *seg,
	    int B, int T, int NH, int NKV, int HD);
	/* dqkv (B,T,(NH+2NKV)*HD) overwritten. */
	void (*attn_bwd)(rl_ops *o, void *dqkv, const void *dout, const void *out, const float *lse,
	    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD);

	/* ---- activations, residual --------------------------------------------- */
	/* out (N,H) = silu(gu[:, :H]) * gu[:, H:], gu (N,2H) (gate rows then up rows of one GEMM). */
	void (*swiglu_fwd)(rl_ops *o, void *out, const void *gu, int N, int H);
	void (*swiglu_bwd)(rl_ops *o, void *dgu, const void *dout, const void *gu, int N, int H);
	/* GPT-2's tanh-approximated GELU, elementwise over n. */
	void (*gelu_fwd)(rl_ops *o, void *out, const void *x, size_t n);
	void (*gelu_bwd)(rl_ops *o, void *dx, const void *dout, const void *x, size_t n);
	/* out = a + b, elementwise act; out may alias a or b. */
	void (*add)(rl_ops *o, void *out, const void *a, const void *b, size_t n);

	/* ---- output layer -------------------------------------------------------- */
	/* Fused log-softmax + gather + entropy over logits (N,V) act at temperature 1/inv_temp:
	 * z = logits * inv_temp; lse[n] = logsumexp(z[n]); lp[n] = z[n,tgt[n]] - lse[n];
	 * ent[n] = -sum p log p (skipped when ent == NULL).  tgt[n] < 0: lp = ent = lse = 0.
	 * All of it accumulated in f32; callers chunk N so that (N,V) stays small. */
	void (*logprob_fwd)(rl_ops *o, float *lp, float *ent, float *lse, const void *logits,
	    const int32_t *tgt, int N, int V, float inv_temp);
	/* dlogits (N,V) act (may alias logits) = d/dlogits of sum(dlp*lp + dent*ent);
	 * dent may be NULL.  Rows with tgt < 0 get 0. */
	void (*logprob_bwd)(rl_ops *o, void *dlogits, const void *logits, const int32_t *tgt,
	    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp);

	/* ---- losses ------------------------------------------------------------------ */
	/* Fused PPO/GRPO token loss.  For token n with weight w[n] (mask x aggregation
	 * factor; 0 = ignored):  r = exp(lp - old),  pg = max(-A r, -A clip(r, 1-cl, 1+ch))
	 * (and min(pg, -A c) when A < 0 and dual_clip c > 0), times tis = min(exp(old - beh), cap)
	 * when beh != NULL and tis_cap > 0; plus kl_coef * KL(lp, ref) when ref != NULL; minus
	 * ent_coef * ent when ent != NULL.  loss = sum_n w[n] * that.
	 * dlp (N) f32 = w * d/dlp;  dent (N) f32 (when non-NULL) = -w * ent_coef;
	 * stats (N, RL_PG_NSTAT) f32 per token; the summed loss is stats[., RL_PG_LOSS] . w.
	 * Decisions: tis multiplies the pg term only (not KL, not entropy); on a tie
	 * (-A r == -A clip(r)) the unclipped branch is taken; dent = 0 when ent == NULL;
	 * stats: LOSS = the token's loss before w, CLIPPED = 1 when a clip (ratio or dual)
	 * zeroed the pg gradient else 0, RATIO = r, KL = the KL value (0 without ref).
	 * Tokens with w[n] == 0 get dlp = dent = 0 and all stats 0 (their inputs may be
	 * garbage).  kl_type outside 1..3 with ref != NULL is RL_EINVAL. */
	void (*pg_loss)(rl_ops *o, float *dlp, float *dent, float *stats, const float *lp,
	    const float *old, const float *beh, const float *ref, const float *ent, const float *adv,
	    const float *w, int N, const rl_pg_params *p);

	/* ---- optimizer ---------------------------------------------------------------- */
	/* sum of squares of x (n) f32, returned to the host (synchronous). */
	double (*sumsq)(rl_ops *o, const float *x, size_t n);
	/* AdamW step on one tensor: g = grad * grad_scale;  m = b1 m + (1-b1) g;
	 * v = b2 v + (1-b2) g^2;  p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p);
	 * wcopy (act, n) = p when non-NULL.  step t >= 1. */
	void (*adamw)(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v,
	    size_t n, float lr, float b1, float b2, float eps, float wd, int t, float grad_scale);

	/* ---- generation ------------------------------------------------------------------ */
	/* Write the k and v heads of qkv (N, (NH+2NKV)*HD) into kc, vc (NBLK,BS,NKV,HD) at slot[n]
	 * (i32 (N); < 0 skips the token). */
	void (*kv_write)(rl_ops *o, void *kc, void *vc, const void *qkv, const int32_t *slot,
	    int N, int NH, int NKV, int HD);
	/* One query token per sequence against its cached context (including itself):
	 * out (B, NH*HD) act; q from qkv (B, (NH+2NKV)*HD); block_table (B, MAXBLK) i32;
	 * ctx_len (B) i32 tokens in the cache for that sequence (>= 1). */
	void (*attn_decode)(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc,
	    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
	    int BS, int MAXBLK);
	/* Sample one token per row of logits (B,V) act.  Randomness: u = rl_rng_uniform(seed[b],
	 * counter[b]) (rng.h), the same function on every backend.  tok (B) i32; logp (B) f32
	 * is log_softmax(logits/temperature)[tok] over the full vocabulary (greedy: temperature 1),
	 * which is what the trainer recomputes.
	 * Kept set: the top_k largest (ties: lower token id first), then of those, in that
	 * order, each token whose preceding cumulative probability (renormalised over the
	 * top-k set) is < top_p; the first is always kept.  The draw walks the kept set in
	 * token-id order: the first token whose cumulative unnormalised weight exp(z - max)
	 * exceeds u * (kept total); temperature 0 picks the first argmax. */
	void (*sample)(rl_ops *o, int32_t *tok, float *logp, const void *logits,
	    const uint64_t *seed, const uint64_t *counter, int B, int V, const rl_sample_params *p);

	/* ---- optional: staging, queued copies, graphs ---------------------------------------
	 * Each may be NULL (the CPU backend leaves them NULL): callers then use alloc/free with
	 * malloc'd host memory, upload/download, and run the ops directly. */
	/* Host memory for the queued copies below (page-locked on CUDA); host_free NULL ok. */
	int (*host_alloc)(rl_ops *o, void **p, size_t bytes);
	void (*host_free)(rl_ops *o, void *p);
	/* Queued copies: host_src must not change and host_dst is not valid until sync(). */
	void (*upload_async)(rl_ops *o, void *dst, const void *host_src, size_t bytes);
	void (*download_async)(rl_ops *o, void *host_dst, const void *src, size_t bytes);
	/* Graphs: the ops issued between graph_begin and graph_end are recorded, not run, and
	 * graph_launch queues them again with the same arguments (pointers and sizes fixed at
	 * recording; what varies must be read from backend memory).  Between begin and end: no
	 * alloc, free, upload, download, sync, sumsq.  graph_end returns the graph in *g (the
	 * caller's, graph_destroy; NULL ok) or an error, with nothing recorded and the backend
	 * usable.  graph_ok is 0 once the backend has moved a scratch buffer the graph uses (it
	 * must be recorded again).  Scratch the ops need must exist before recording: run the
	 * same ops once without a graph first. */
	int (*graph_begin)(rl_ops *o);
	int (*graph_end)(rl_ops *o, void **g);
	int (*graph_launch)(rl_ops *o, void *g);
	int (*graph_ok)(rl_ops *o, const void *g);
	void (*graph_destroy)(rl_ops *o, void *g);

	/* Optional GPT-2 MLP fusions (GELU in the GEMM epilogue); NULL when absent or off.
	 * matmul_gelu_fwd: pre (N,OC) = inp @ w^T + bias and h (N,OC) = gelu(pre), as matmul_fwd
	 * then gelu_fwd, except that gelu may be taken of pre before its rounding to act.
	 * matmul_dgelu_bwd: matmul_bwd (dw, dbias as there) whose dinp (N,C) is then multiplied
	 * by gelu'(pre (N,C)), as matmul_bwd then gelu_bwd(dinp, dinp, pre), except that the
	 * product may be taken before dinp's rounding. */
	void (*matmul_gelu_fwd)(rl_ops *o, void *h, void *pre, const void *inp, const void *w,
	    const void *bias, int N, int C, int OC);
	void (*matmul_dgelu_bwd)(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout,
	    const void *inp, const void *w, const void *pre, int N, int C, int OC);

	/* Optional residual add + norm (NULL when absent): x (N,C) = x + t as add, then out =
	 * the norm of the new x, as layernorm_fwd (ln != 0; mean, b as there) or rmsnorm_fwd
	 * (ln == 0; mean and b unused). */
	void (*add_norm_fwd)(rl_ops *o, void *x, void *out, float *mean, float *rstd, const void *t,
	    const void *w, const void *b, int N, int C, float eps, int ln);
	/* Optional norm backwards into a residual gradient (each NULL when absent): the
	 * arguments of layernorm_bwd / rmsnorm_bwd, but dx (N,C) act is ADDED to, dx = dx + (the
	 * dx the plain op writes), as the plain op into a scratch tensor then add, except that
	 * the sum may be rounded to act once instead of twice.  dw (and db) accumulate as there.
	 * dx does not alias dout or x. */
	void (*layernorm_bwd_add)(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
	    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
	void (*rmsnorm_bwd_add)(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
	    const void *w, const float *rstd, int N, int C);

	/* Optional LM head with a padded row stride (all NULL and head_ld_align 0 when absent or
	 * off): the logits (N, ld) act hold row n's V values at [n*ld, n*ld + V); columns V..ld
	 * are neither read nor written by these ops (garbage is fine).  The caller picks
	 * ld >= V, a multiple of head_ld_align (elements), so that every row starts aligned for
	 * the GEMMs and no copy to or from a padded scratch is needed.  Each op is the one of
	 * the same name above with that stride on its logits operand:
	 * matmul_fwd_ld: out (N, ld) = inp (N,C) @ w (OC,C)^T (no bias);
	 * matmul_bwd_ld: dinp (N,C) = dout (N, ld) @ w (skipped when NULL); dw (OC,C) f32 +=
	 *   dout^T @ inp (skipped when NULL);
	 * logprob_fwd_ld / logprob_bwd_ld: as logprob_fwd / logprob_bwd over logits (N, ld) and
	 *   dlogits (N, ld) (in place allowed). */
	int head_ld_align;
	void (*matmul_fwd_ld)(rl_ops *o, void *out, int ld, const void *inp, const void *w, int N, int C,
	    int OC);
	void (*matmul_bwd_ld)(rl_ops *o, void *dinp, float *dw, const void *dout, int ld, const void *inp,
	    const void *w, int N, int C, int OC);
	void (*logprob_fwd_ld)(rl_ops *o, float *lp, float *ent, float *lse, const void *logits, int ld,
	    const int32_t *tgt, int N, int V, float inv_temp);
	void (*logprob_bwd_ld)(rl_ops *o, void *dlogits, const void *logits, int ld, const int32_t *tgt,
	    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp);
	/* Optional decode fusions (NULL when absent or off), kernels fewer per decode step at a
	 * few sequences.  matmul_fused_fwd: y (N,OC) = round(xin (N,C) @ w (OC,C)^T + bias) as
	 * matmul_fwd (bias NULL for none), where xin = x for norm RL_NORM_NONE, else the rows of
	 * x normalised as rmsnorm_fwd (RL_NORM_RMS: weight nw) or layernorm_fwd (RL_NORM_LN: nw,
	 * bias nb, NULL ok) computes them with eps (rounded to act; the statistics may be summed
	 * in another order, not returned); then by ep:
	 *   RL_EP_NONE    out (N,OC)   = y
	 *   RL_EP_ADD     out (N,OC)   = out + y, as add (the residual, updated in place)
	 *   RL_EP_GELU    out (N,OC)   = gelu_fwd(y)
	 *   RL_EP_SWIGLU  out (N,OC/2) = swiglu_fwd(y, H = OC/2) (OC even; gate rows, then up)
	 * tmp (N,OC) act and xn (N,C) act are scratch the op may overwrite (tmp unused with
	 * RL_EP_NONE, xn with RL_NORM_NONE: NULL ok there).  out aliases none of x, w, tmp, xn.
	 * Fused for N <= RL_FUSE_ROWS; more rows run the separate ops (callers keep their own
	 * sequence there: the add then a norm costs a pass more than add_norm_fwd).
	 * rope_kv_write: rope_fwd on qkv (in place; rope.theta <= 0: no rotation), then kv_write of the
	 * (rotated) k and v heads, any N. */
	void (*matmul_fused_fwd)(rl_ops *o, void *out, void *tmp, void *xn, const void *x, const void *nw,
	    const void *nb, float eps, int norm, const void *w, const void *bias, int N, int C, int OC, int ep);
	void (*rope_kv_write)(rl_ops *o, void *kc, void *vc, void *qkv, const int32_t *pos,
	    const int32_t *slot, int N, int NH, int NKV, int HD, rl_rope rope);
	/* matmul_rope_kv_fwd: qkv (N, (NH+2NKV)*HD) = matmul_fused_fwd of x with RL_EP_NONE (the
	 * same norm, xn, w, bias), then rope_kv_write of qkv (pos, slot, rope as there): the QKV
	 * product, RoPE and the cache write; fused for N <= RL_FUSE_ROWS, HD even. */
	void (*matmul_rope_kv_fwd)(rl_ops *o, void *qkv, void *xn, const void *x, const void *nw,
	    const void *nb, float eps, int norm, const void *w, const void *bias, int N, int C, int NH,
	    int NKV, int HD, rl_rope rope, const int32_t *pos, void *kc, void *vc, const int32_t *slot);

	/* Optional residual in the product (NULL when absent): out (N,OC) = resid (N,OC) +
	 * inp (N,C) @ w (OC,C)^T + bias, as matmul_fwd then add except that the sum may be
	 * rounded to act once instead of twice.  out does not alias inp, w or resid. */
	void (*matmul_add_fwd)(rl_ops *o, void *out, const void *inp, const void *w, const void *bias,
	    const void *resid, int N, int C, int OC);

	/* Optional decode step in one go (NULL when absent or off): for B sequences of one new
	 * token each (x holding their embedded tokens), the transformer blocks against the cache
	 * and the final norm and LM head into d->logits, as lib/model/model_infer.c's fused decode path
	 * computes them (matmul_rope_kv_fwd, attn_decode, matmul_fused_fwd with RL_EP_ADD, the
	 * norm + up + GELU/SwiGLU product, the down product with RL_EP_ADD, per layer; the final
	 * norm + LM head), equal to it within act rounding (attention's sums may be taken in
	 * another order).  pos, slot, ctx (B) and bt (B, MAXBLK) as matmul_rope_kv_fwd and
	 * attn_decode take them.  decode_step_ok: 1 when decode_step takes this shape and B, 0
	 * when the caller must run the separate ops. */
	int (*decode_step_ok)(rl_ops *o, const rl_step_desc *d, int B);
	void (*decode_step)(rl_ops *o, const rl_step_desc *d, const int32_t *pos, const int32_t *slot,
	    const int32_t *bt, const int32_t *ctx, int B);

	/* Optional (NULL: the caller goes back to the host between steps): the next decode
	 * step's inputs from this one's outputs, in backend memory, for multi-step decoding
	 * (rl_model_decode_multi).  Per row b: tok[b] = otok[b], then pos, ctx and ctr one
	 * more, and slot[b] the cache slot of the new pos: bt[b cols + pos / BS] BS + pos % BS
	 * (the block table must already hold that block). */
	void (*decode_advance)(rl_ops *o, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
	    const int32_t *bt, const int32_t *otok, int B, int cols, int BS);

	/* ---- teardown ---------------------------------------------------------------------- */
	void (*close)(rl_ops *o);

	/* Optional multi-tensor AdamW (NULL when absent: callers loop over adamw).  The adamw
	 * step on nseg segments of the same buffers at once: segment s (seg, host memory) is
	 * elements [seg[s].off, seg[s].off + seg[s].n) of param, grad, m, v (and wcopy when
	 * non-NULL), updated with lr[seg[s].cls] and wd[seg[s].cls] (host arrays of
	 * RL_ADAMW_NCLS); elements outside the segments are not touched; segments do not
	 * overlap.  Per element the arithmetic of adamw (the same results, bit for bit).  A
	 * backend may keep what it derives from seg for later calls with the same table (so a
	 * table that does not change is uploaded once).  cls out of range or t < 1: RL_EINVAL. */
	void (*adamw_multi)(rl_ops *o, float *param, void *wcopy, const float *grad, float *m,
	    float *v, const rl_adamw_seg *seg, int nseg, const float *lr, const float *wd,
	    float b1, float b2, float eps, int t, float grad_scale);
};

/* rl_ops_open opens a backend by name: "cpu", "cuda", "cuda:N" or "auto"
 * (CUDA when a GPU is present, else the CPU).  "cuda" in a build without CUDA
 * returns RL_ENOTSUP; on a machine without a GPU RL_ENODEV.  With "auto" and no
 * GPU, a CUDA build says so in one line on stderr.  *out is owned by the caller,
 * closed with rl_ops_close (NULL ok). */
int rl_ops_open(rl_ops **out, const char *device);
/* 1 when device is a name rl_ops_open takes ("cpu", "auto", "cuda", "cuda:N"
 * with N of at most 4 digits and 1024), else 0; whether such a device exists
 * is rl_ops_open's to find.  For option parsers: a typo is a usage error
 * before anything loads. */
int rl_ops_device_ok(const char *device);
void rl_ops_close(rl_ops *o);

/* The CPU backend (always present). */
int rl_ops_cpu_open(rl_ops **out);
/* The CUDA backend (HAVE_CUDA builds only; RL_ENOTSUP otherwise). */
int rl_ops_cuda_open(rl_ops **out, int device);

#endif

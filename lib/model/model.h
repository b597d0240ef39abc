/*
 * model.h — decoder-only transformers (Llama/Qwen2/Qwen3 and GPT-2) over the
 * backend contract ops.h: loading a Hugging Face directory, random init,
 * training forward (per-token log-probs and entropy), full backward, AdamW
 * with global-norm clipping, saving, and incremental decoding over a paged
 * KV cache (kvcache.h).
 *
 * Leaves out: losses (the trainer's: it turns lp/ent into dlp/dent, e.g. with
 * ops->pg_loss), sampling and scheduling (the generation engine's), data
 * parallelism (comm.h).
 *
 * Memory (STYLE.md): parameters, gradients and the AdamW moments each live in
 * one backend allocation laid out by m->tt (tensor.h).  Training activations
 * are allocated once by rl_model_train_reserve for at most max_tokens = B*T
 * rows; rl_model_forward/backward/step allocate nothing.  Inference buffers
 * likewise come from rl_model_infer_reserve.
 *
 * Numerics: fp32 master weights; on backends whose act dtype is not f32 a
 * compute copy m->w in act dtype, refreshed by ops->adamw.  The lm_head and
 * log-prob are done in chunks of rows so (N, V) logits never exist at once.
 *
 * Thread-safety: a model is used by one thread at a time (its rl_ops is too).
 */
#ifndef RL_MODEL_H
#define RL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/kvcache.h"
#include "compute/ops.h"
#include "model/tensor.h"

/* Indices into m->tt of one layer's tensors; -1 when absent. */
typedef struct rl_layer_idx {
	int ln1_w, ln1_b;       /* input_layernorm / ln_1 */
	int qkv_w, qkv_b;       /* q_proj (then k, v adjacent) / c_attn: ((NH+2NKV)*HD, C) */
	int qn_w, kn_w;         /* Qwen3 q_norm, k_norm (HD) */
	int o_w, o_b;           /* o_proj / attn.c_proj (C, NH*HD) */
	int ln2_w, ln2_b;       /* post_attention_layernorm / ln_2 */
	int fc_w, fc_b;         /* gate_proj (then up_proj adjacent): (2H, C) / c_fc (H, C) */
	int proj_w, proj_b;     /* down_proj / mlp.c_proj (C, H) */
	int pa_w, pf_w;         /* Gemma 3: post_attention_layernorm, post_feedforward_layernorm
	                         * (then ln2_w is pre_feedforward_layernorm) */
} rl_layer_idx;

typedef struct rl_model rl_model;

/* Counters of rl_model_decode_sample. */
typedef struct rl_decode_stats {
	uint64_t steps;         /* calls that succeeded */
	uint64_t captures;      /* graphs recorded */
	uint64_t launches;      /* steps replayed from a graph */
	uint64_t direct;        /* steps run op by op */
	uint64_t stale;         /* graphs recorded again because the backend's scratch moved */
	uint64_t onestep;       /* direct steps and recordings that took ops->decode_step (one launch) */
	double t_host;          /* seconds on the host before waiting for the device */
	double t_wait;          /* seconds waiting for the device (the step's only sync) */
} rl_decode_stats;

typedef struct rl_model_act rl_model_act;   /* training activations (model_int.h) */
typedef struct rl_model_inf rl_model_inf;   /* inference buffers (model_int.h) */
typedef struct rl_lora rl_lora;             /* LoRA adapters (lora.h, model_int.h) */

struct rl_model {
	rl_config cfg;
	rl_ops *ops;            /* borrowed; outlives the model */
	rl_ttable tt;           /* the tensor table */
	rl_layer_idx *layer;    /* (L) */
	int wte, wpe, lnf_w, lnf_b, lm_w;   /* lm_w == wte when tied */
	int vh_w, vh_b;         /* value head (1, C), (1): RL_T_AUX, -1 when absent */
	float *params;          /* (tt.total) f32 master weights, backend memory */
	void *w;                /* compute weights in act dtype: == params on an f32 backend */
	float *grads;           /* (tt.total - goff) f32, accumulated by backward; NULL until train_reserve */
	float *m, *v;           /* (tt.total - goff) f32 AdamW moments; NULL until train_reserve */
	size_t goff;            /* grads, m, v hold table elements [goff, tt.total), element e at
	                         * e - goff: 0, or with LoRA the first trained tensor's offset (the
	                         * frozen base has no gradient or AdamW state); set by train_reserve */
	float *gsink;           /* with LoRA: where the frozen norms' weight gradients go (unused) */
	int step;               /* AdamW updates taken (bias correction, optimizer.safetensors) */
	int version;            /* trainer steps taken: the weight version and the checkpoint's
	                         * step-N (rl_ckpt_save); rl-train advances it once per step,
	                         * whatever the updates in it (--ppo-epochs x --mini-batches) */
	/* Results of the last rl_model_forward, backend memory, (N) f32 each. */
	float *lp, *ent;
	/* Values of the last rl_model_forward when the model has a value head, backend
	 * memory, (N) f32; NULL otherwise. */
	float *val;
	/* Logits of the last prefill/decode, backend memory, (B, V) act. */
	void *logits;
	char *src_dir;          /* directory it was loaded from (NULL for random init) */
	size_t logit_chunk_bytes; /* bound on the (rows, V) logits chunk; 0 = RL_LOGIT_CHUNK_MB
	                           * MiB when set, else 32 MiB on the CPU, on a GPU 3 GiB when
	                           * training (a whole batch's logits kept for the backward),
	                           * 256 MiB forward only; set before rl_model_train_reserve */
	rl_model_act *act;
	rl_model_inf *inf;
	float *gw1;             /* Gemma (CPU only): (C + 2 HD) scratch for the (1 + w) of a norm */
	int cpu;                /* ops is the CPU backend: lib/compute/ops_cpu.h's extra ops may be called */
	rl_lora *lora;          /* adapters (rl_model_add_lora), NULL when none */
	/* Optional (data parallel: overlap of the gradient all-reduce): called by
	 * rl_model_backward each time the gradients at element offsets
	 * [from, tt.total) are final for this pass (after the lm_head and final
	 * norm, after each layer, with 0 at the end), from decreasing.  The work is
	 * queued on the backend, not necessarily done.  Non-zero fails the pass. */
	int (*grad_ready)(void *ctx, size_t from);
	void *grad_ready_ctx;
	/* Optional (ZeRO-3: parameters sharded): called before the weights of a
	 * unit are read, unit 0 the embedding, 1 + l layer l, n_layer + 1 the head
	 * (final norm, lm_head, value head): in rl_model_forward before each, in
	 * the backward before the head and at the start of each layer (before
	 * --recompute's forward of it).  The embedding's backward reads no
	 * weights.  next: the unit this pass reads after this one (-1: none, or
	 * not known: the forward's head may be followed by a backward or not).
	 * The caller makes the unit's m->params valid (f32 backend: m->w ==
	 * m->params).  Non-zero fails the pass. */
	int (*param_need)(void *ctx, int unit, int next);
	void *param_need_ctx;
	/* rl_model_decode_sample: 1 runs every step op by op (no backend graphs) */
	int no_graph;
	/* rl_model_decode_sample: a step's key (batch rows, greedy split, sampling, cache,
	 * weights) runs op by op this many times before it is recorded (default 1, or
	 * RL_DECODE_GRAPH_AFTER when set at rl_model_infer_reserve) */
	int graph_after;
	rl_decode_stats dstats;  /* rl_model_decode_sample's counters, since open */
	/* Set before rl_model_train_reserve: m->m, m->v are not allocated (a
	 * ZeRO trainer keeps its shard of them; rl_model_step then fails). */
	int no_adam_state;
	/* Set before the first rl_model_train_reserve/eval_reserve: activation
	 * recomputation (gradient checkpointing).  The forward keeps only each
	 * layer's input (the residual stream) and one layer's activations; the
	 * backward runs each layer's forward again before differentiating it.
	 * Same results (the recomputed forward is the same ops on the same
	 * inputs), about a third more compute, and the per-layer activations
	 * shrink from L x ~(6C + QKV + FC + H) to ~C + one layer's worth per token. */
	int recompute;
	/* rl_model_open_part: the files whose tensors rl_model_load_range has
	 * still to read (NULL once read, and for every other open), and the
	 * f32 master weights a checkpoint's optimizer.safetensors holds in their
	 * place (rl_ckpt_load_optimizer sets it; NULL: the model files). */
	struct rl_st_set *part_set;
	char *part_master;
};

/* ---- life cycle ------------------------------------------------------------ */

/* rl_model_open loads DIR (config.json + model.safetensors or an index with
 * shards, any of F32/BF16/F16/F64) into fp32 master weights on ops.  Errors
 * name the file and the tensor: RL_ENOENT (missing file or tensor),
 * RL_ESHAPE (wrong shape), RL_EFORMAT (bad file), RL_ENOTSUP (config).
 * *out is the caller's (rl_model_close). */
/* Non-finite values in a tensor read from a file: an error naming the file,
 * the tensor, how many and the first (RL_EFORMAT), else RL_OK.  Weights that
 * hold NaN or inf generate garbage with log-probs "nan"; better to stop. */
int rl_check_finite(const float *x, size_t n, const char *file, const char *name);
int rl_model_open(rl_model **out, const char *dir, rl_ops *ops);
/* rl_model_open for a reward model (cfg.seq_cls, docs/reward.md).  Any
 * directory rl_model_open reads with a ...ForSequenceClassification config
 * is one already: the trunk, and score.weight [1, C] (RL_ESHAPE otherwise)
 * as the value head (bias 0), no lm_head.  rl_model_open_rm also takes a
 * causal LM: its lm_head is dropped and the score head is new, normal(0,
 * initializer_range) from seed as transformers initialises it, or PPO's
 * DIR/value_head.safetensors where there is one.  Either way m->val of a
 * forward is the score of each position. */
int rl_model_open_rm(rl_model **out, const char *dir, rl_ops *ops, uint64_t seed);
/* rl_model_open (as_rm: rl_model_open_rm with seed) with every check of the
 * files' headers against config.json made, the parameters allocated but no
 * tensor read and no page of m->params written (the value or score head
 * excepted): a ZeRO-3 rank then reads only its shard with
 * rl_model_load_range.  Until then m->params holds nothing defined. */
int rl_model_open_part(rl_model **out, const char *dir, rl_ops *ops, int as_rm, uint64_t seed);
/* The elements [lo, hi) of the flat table (m->tt) from the files
 * rl_model_open_part checked (or the master weights rl_ckpt_load_optimizer
 * found), converted to f32 as rl_model_open converts them, the padding
 * between tensors zeroed; only m->params[lo, hi) is written.  Each element
 * read is checked finite, and a tied lm_head.weight in the files against
 * the embedding's elements in the range.  The files are closed after, on
 * success or not.  Errors as rl_model_open's, naming file and tensor
 * (RL_EFORMAT for non-finite values).  CPU backend (host m->params). */
int rl_model_load_range(rl_model *m, size_t lo, size_t hi);
/* The position a reward model reads the score of a sequence tok[0..n) at, as
 * transformers' ...ForSequenceClassification does: the last token that is
 * not c->pad_id (pad_token_id; rl_model_open_rm sets it to the EOS id for a
 * causal LM without one, which is then saved), so trailing pads (and an EOS
 * when it pads) do not count; 0 when every token is one; n - 1 when there is
 * no pad id (transformers: a batch of one row). */
int rl_model_score_index(const rl_config *c, const int32_t *tok, int n);
/* rl_model_init_random builds a model from cfg with Hugging Face's init:
 * normal(0, 0.02) for embeddings and projections, GPT-2's residual
 * projections (attn.c_proj, mlp.c_proj) normal(0, 0.02/sqrt(2L)), norm
 * weights 1, biases 0.  Deterministic in seed (counter-based, rng.h).  A
 * reward model's config (cfg->seq_cls) gets its score head, normal(0,
 * initializer_range). */
int rl_model_init_random(rl_model **out, const rl_config *cfg, rl_ops *ops, uint64_t seed);
void rl_model_close(rl_model *m);
/* Number of parameters (without padding). */
size_t rl_model_nparams(const rl_model *m);

/* ---- training ------------------------------------------------------------------ */

/* Allocates gradients (zeroed), AdamW state (unless m->no_adam_state) and
 * activations for up to max_tokens = B*T rows.  Call once; again to grow. */
int rl_model_train_reserve(rl_model *m, int max_tokens);
/* Activations only, for forward-only use (reference / old-policy log-probs):
 * no gradients or optimizer state; rl_model_backward then fails.  Only one
 * layer's activations are kept (as with m->recompute). */
int rl_model_eval_reserve(rl_model *m, int max_tokens);
/* Backend bytes of the activations reserved (0 before a reserve). */
size_t rl_model_act_bytes(const rl_model *m);
/* What rl_model_train_reserve (one_layer 0, or 1 with recompute) or
 * rl_model_eval_reserve (one_layer 1) would reserve for a model of config c
 * on a backend whose activations are act_size bytes, logits rows ld apart,
 * chunk_bytes of logits at once, max_tokens rows; with value_head a value
 * head's arrays.  Allocates nothing: for memory plans. */
size_t rl_model_act_bytes_for(const rl_config *c, size_t act_size, int ld, size_t chunk_bytes, int max_tokens,
                              int one_layer, int value_head);
/* The default bytes of logits at once: act dtype f32 (the CPU), or not
 * (the GPU: more when training, where they are kept for the backward). */
size_t rl_model_logit_chunk_bytes(int act_f32, int training);
/* The parameters of a model of config c without building it (with
 * value_head, PPO's value head too): *n of them, in *slots floats (the
 * tensor table's total, with its alignment), which is what each copy
 * (weights, gradients, each AdamW moment) takes. */
void rl_model_param_count(const rl_config *c, int value_head, size_t *n, size_t *slots);
/* Training forward over B rows of T tokens.  Host inputs, i32:
 *   tok (B,T) token ids in [0, V) (padding too: use any valid id, e.g. 0);
 *   tgt (B,T) target id per position (the next token), < 0 = no log-prob (padding, last);
 *   seg (B,T) segment ids for packing: token t attends s <= t of the same seg in its row,
 *       < 0 = padding; NULL = one sequence per row;
 *   pos (B,T) position ids (restart at 0 for each packed sequence); NULL = 0..T-1.
 * temperature > 0: log-probs of logits / temperature.  Results in m->lp, m->ent
 * (backend) and, when non-NULL, copied to host lp, ent (B*T) f32.  RL_EINVAL
 * on ids or positions out of range or B*T above the reserve (nothing computed). */
int rl_model_forward(rl_model *m, float *lp, float *ent, const int32_t *tok, const int32_t *tgt,
    const int32_t *seg, const int32_t *pos, int B, int T, float temperature);
/* Backward of the last forward: dlp, dent (B*T) f32 in BACKEND memory (on the
 * CPU plain host arrays; on CUDA e.g. ops->pg_loss's outputs); dent may be
 * NULL.  Gradients are ACCUMULATED into m->grads (micro-batches add up). */
int rl_model_backward(rl_model *m, const float *dlp, const float *dent);
/* rl_model_backward with the gradient of the loss with respect to the value
 * head's outputs too: dval (B*T) f32 in backend memory, NULL = none (then it
 * is rl_model_backward).  The value gradient reaches the head and, through
 * the final norm, the whole trunk (shared trunk). */
int rl_model_backward_value(rl_model *m, const float *dlp, const float *dent, const float *dval);
/* Zero m->grads. */
void rl_model_zero_grad(rl_model *m);

typedef struct rl_adamw {
	float lr;
	float beta1, beta2, eps;
	float weight_decay;     /* decoupled; applied to RL_T_DECAY tensors only (see docs/model.md) */
	float max_grad_norm;    /* global-norm clipping threshold; <= 0 = off */
	float aux_lr;           /* lr of RL_T_AUX tensors (the value head); 0 = lr */
} rl_adamw;
/* The learning rate AdamW uses for tensor t (aux_lr for the value head). */
static inline float
rl_adamw_lr(const rl_adamw *p, const rl_tensor *t)
{
	return (t->flags & RL_T_AUX) && p->aux_lr > 0 ? p->aux_lr : p->lr;
}
/* One AdamW step over every parameter with the accumulated gradients, after
 * global-norm clipping as torch.nn.utils.clip_grad_norm_ does (scale =
 * min(1, max / (norm + 1e-6))), then zeroes the gradients.  *grad_norm
 * (optional) gets the norm before clipping.  A non-finite norm skips the update
 * (warning, gradients zeroed, step not counted) and returns RL_OK. */
int rl_model_step(rl_model *m, const rl_adamw *p, float *grad_norm);

/* ---- value head (PPO's critic on the shared trunk, docs/train.md) ------------
 * A linear head on the final hidden state (after the final norm):
 *   value[n] = value_head.weight (1, C) . h[n] + value_head.bias (1).
 * rl_model_add_value_head appends its two tensors to the tensor table (flag
 * RL_T_AUX: AdamW, gradients, weight sync buffers and the optimizer file cover
 * them; model.safetensors does not, they go to DIR/RL_VALUE_HEAD_FILE so the
 * policy stays loadable by Hugging Face loaders).  With dir != NULL and
 * DIR/value_head.safetensors present the head is loaded from it (f32, bf16 or
 * f16; shapes checked: RL_ESHAPE / RL_ENOENT / RL_EFORMAT with the file named);
 * otherwise it is initialised, weight normal(0, 1/(C+1)) deterministic in seed,
 * bias 0.  Call before rl_model_train_reserve / rl_model_eval_reserve
 * (RL_EINVAL after).  A no-op when the model has one already.  On failure the
 * model must be closed.  From then on rl_model_forward also writes m->val. */
#define RL_VALUE_HEAD_FILE "value_head.safetensors"
int rl_model_add_value_head(rl_model *m, const char *dir, uint64_t seed);

/* ---- inference ----------------------------------------------------------------- */

/* Allocates inference buffers for prefills of up to max_tokens packed prompt
 * tokens and decode batches of up to max_batch sequences. */
int rl_model_infer_reserve(rl_model *m, int max_tokens, int max_batch);
/* Prefill nseq empty sequences (len 0) with their prompts: tokens[i] (ntok[i]
 * >= 1, host).  Packs them into one row, writes their K/V into kv (reserving
 * blocks), sets seqs[i]->len = ntok[i].  The logits of each prompt's last
 * token go to m->logits (nseq, V) and, when non-NULL, to host logits (nseq, V)
 * f32.  RL_EBUSY if the cache is out of blocks (no sequence changed).  */
int rl_model_prefill(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs,
    const int32_t *const *tokens, const int *ntok, int nseq, float *logits);
/* Appends tokens[i][0 .. ntok[i]) (ntok[i] >= 0, host) to sequences of any
 * lengths in forwards of up to max_batch rows, one row a token, with the decode
 * kernels (no new kernel: the same values as feeding them one a decode step) and
 * no logits: the caller decodes the next token after them.  Observations of a
 * multi-turn episode come in this way.  RL_EBUSY when the cache is out of blocks
 * (no length changed; blocks may stay reserved), RL_ETOOBIG past the model's
 * positions. */
int rl_model_extend(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *const *tokens,
    const int *ntok, int nseq);
/* One decode step: appends tok[b] (host) to seqs[b] at position seqs[b]->len
 * for b < B, and returns the next-token logits in m->logits (B, V) and, when
 * non-NULL, host logits (B, V) f32.  Sequences of any lengths.  RL_EBUSY when
 * the cache is out of blocks: no token is appended (some sequences may hold a
 * block reserved for their next token), RL_ETOOBIG past the model's positions. */
int rl_model_decode(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok, int B,
    float *logits);
/* One decode step and the sampling of the next tokens, on the backend: appends tok[b]
 * (host) to seqs[b] as rl_model_decode does, then samples row b from its logits as
 * ops->sample does: rows [0, g) with *sp, rows [g, B) greedily, with the RNG stream
 * seed[b] and counter ctr[b] (host).  Writes host out_tok (B) and out_logp (B).
 * The step's inputs travel in one queued copy from staging and its outputs in one;
 * the download of the outputs is the step's only synchronisation.  On a backend with
 * graphs (CUDA) the device work is recorded once per (B, g, *sp, cache, weights
 * pointer) after one run op by op, and replayed after that; weights changed in place
 * (rl_model_set, rl_model_params_changed) are read by the replays.  m->no_graph = 1
 * (or RL_CUDA_GRAPH=0 for the CUDA backend) runs every step op by op.  The results
 * equal rl_model_decode + ops->sample bit for bit.  m->logits holds the logits after.
 * Errors as rl_model_decode. */
int rl_model_decode_sample(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok,
    const uint64_t *seed, const uint64_t *ctr, int B, int g, const rl_sample_params *sp,
    int32_t *out_tok, float *out_logp);
/* n decode steps at once (multi-step decoding): the same as n calls of
 * rl_model_decode_sample where step k (0 .. n-1) feeds step k-1's tokens (tok for k = 0) with
 * counters ctr[b] + k, writing out_tok and out_logp (n, B) step by step, seqs[b] n tokens longer
 * after; the same tokens and log-probabilities bit for bit.  With ops->decode_advance the
 * tokens go back into the next step's inputs on the backend: the n steps (graph replays) are
 * queued at once and the host waits once, not n times; without it, n calls.  The cache room
 * of the n tokens is taken first (a sequence that stops early keeps it until released).
 * Errors as rl_model_decode_sample, and RL_EINVAL for n < 1 or GPT-2 positions past max_pos. */
int rl_model_decode_multi(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *tok,
    const uint64_t *seed, const uint64_t *ctr, int B, int g, const rl_sample_params *sp, int n,
    int32_t *out_tok, float *out_logp);

/* ---- host access to tensors (checkpoints, tests, weight sync) ----------------- */
enum { RL_MODEL_PARAM = 0, RL_MODEL_GRAD, RL_MODEL_ADAM_M, RL_MODEL_ADAM_V };
/* Copy tensor i of the given kind to host f32 out (t->n) in the FILE layout
 * (GPT-2 Conv1D transposed back to (in, out)).  The gradient or AdamW state of
 * a frozen tensor (LoRA's base) is zero. */
int rl_model_get(rl_model *m, int i, int kind, float *out);
/* Set tensor i's parameters from host f32 in (file layout). */
int rl_model_set(rl_model *m, int i, const float *in);

/* After m->params was overwritten in place as one buffer (weight sync, NCCL
 * broadcast of the tensor table's layout): refreshes the compute copy m->w
 * (a no-op on an f32 backend).  Returns the backend's status. */
int rl_model_params_changed(rl_model *m);

/* Save DIR as a Hugging Face checkpoint (config.json, model.safetensors in
 * cfg.dtype, plus tokenizer files copied from the source directory), atomic:
 * written to DIR.tmp.PID, fsync'd, renamed.  RL_EEXIST when DIR exists. */
int rl_model_save(rl_model *m, const char *dir);

#endif

/*
 * launch.h — the extern "C" launchers of the CUDA kernels (the .cu files of kernels/), the
 * only kernel header lib/ includes (lib/compute/ops_cuda.c).  Each launcher queues
 * work on `stream` (a cudaStream_t passed as void *) and returns 0 or the
 * cudaError_t of the launch; it never synchronises unless it says so.
 * Shapes, dtypes and semantics are those of the matching op in lib/compute/ops.h;
 * "act" here is always bf16.
 *
 * Leaves out: cuBLASLt GEMMs (lib/compute/ops_cuda.c calls cuBLASLt itself), memory
 * management.
 */
#ifndef RL_KERNELS_LAUNCH_H
#define RL_KERNELS_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "compute/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- options (kernels/elementwise.cu) --------------------------------------
 * Which of the faster kernel forms the launchers may take (all by default); the
 * backend sets them once when it opens from its switches (docs/cuda.md).  Process-wide. */
enum {
	RLK_OPT_EW_VEC = 1 << 0,       /* 16-byte vec forms of cast, add, GELU, SwiGLU, RoPE */
	RLK_OPT_NORM_BWD_VEC = 1 << 1, /* layernorm/rmsnorm backward with the row in registers */
	RLK_OPT_COLSUM_VEC = 1 << 2,   /* bias gradient with 16-byte loads */
	RLK_OPT_ALL = 7
};
void rlk_set_opts(unsigned opts);
/* programmatic dependent launch of the decode step's kernels (kernels/pdl.cu) */
void rlk_set_pdl(int on);
/* fuse.cu's products of 1-4 rows (process-wide, as rlk_set_pdl): ks 0 a warp a whole weight
 * row (the default), 2, 4 or 8 warps a row wherever the grid covers every output, -1 by a
 * rule (enough blocks for the GPU, a round of loads a warp); pf 1: the head (norm, no
 * epilogue) and residual products load the next tile while summing one, 2: every product
 * does, its grid capped at the blocks resident at once.  Never run on a GPU yet (docs/cuda.md). */
void rlk_set_gemv(int ks, int pf);
unsigned rlk_get_opts(void);

/* ---- elementwise (kernels/elementwise.cu) -------------------------------- */
/* out (n) out_dt = in (n) in_dt; dtypes RL_F32 or RL_BF16 (same dtype: a copy). */
int rlk_cast(void *stream, void *out, int out_dt, const void *in, int in_dt, size_t n);
int rlk_add(void *stream, void *out, const void *a, const void *b, size_t n);
int rlk_gelu_fwd(void *stream, void *out, const void *x, size_t n);
int rlk_gelu_bwd(void *stream, void *dx, const void *dout, const void *x, size_t n);
int rlk_swiglu_fwd(void *stream, void *out, const void *gu, int N, int H);
int rlk_swiglu_bwd(void *stream, void *dgu, const void *dout, const void *gu, int N, int H);
int rlk_embed_fwd(void *stream, void *out, const int32_t *tok, const int32_t *pos,
    const void *wte, const void *wpe, int N, int C);
int rlk_embed_bwd(void *stream, float *dwte, float *dwpe, const void *dout,
    const int32_t *tok, const int32_t *pos, int N, int C);
/* sign +1: rope_fwd; -1: rope_bwd (rotation by -angle). */
int rlk_rope(void *stream, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD,
    rl_rope rope, int sign);
/* dbias (OC) f32 += column sums of dout (N, OC) bf16. */
int rlk_colsum(void *stream, float *dbias, const void *dout, int N, int OC);
/* *acc (device double) += sum of x^2; acc is not cleared. */
int rlk_sumsq(void *stream, double *acc, const float *x, size_t n);
/* bc1 = 1 - b1^t, bc2 = 1 - b2^t computed by the caller. */
int rlk_adamw(void *stream, float *param, void *wcopy, const float *grad, float *m, float *v,
    size_t n, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
    float grad_scale);
int rlk_kv_write(void *stream, void *kc, void *vc, const void *qkv, const int32_t *slot,
    int N, int NH, int NKV, int HD);
/* Multi-step decoding (ops.h decode_advance): per row b, tok[b] = otok[b], pos, ctx and ctr
 * one more, slot[b] = bt[b cols + pos / BS] BS + pos % BS of the new pos (device memory). */
int rlk_decode_advance(void *stream, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS);
/* Multi-tensor AdamW (ops.h adamw_multi) over a table of chunks in device memory: chunk b
 * is elements [off, off + n) of the buffers (n <= RLK_ADAMW_CHUNK, within one segment) with
 * class cls; lr, wd: host arrays of RL_ADAMW_NCLS.  Per element the arithmetic of rlk_adamw. */
#define RLK_ADAMW_CHUNK 8192
typedef struct rlk_adamw_chunk {
	uint64_t off;
	uint32_t n, cls;
} rlk_adamw_chunk;
int rlk_adamw_multi(void *stream, const rlk_adamw_chunk *chunks, int nchunk, float *param, void *wcopy,
    const float *grad, float *m, float *v, const float *lr, const float *wd, float b1, float b2,
    float eps, float bc1, float bc2, float grad_scale);

/* ---- normalisation (kernels/norm.cu) -------------------------------------- */
int rlk_rmsnorm_fwd(void *stream, void *out, float *rstd, const void *x, const void *w,
    int N, int C, float eps);
int rlk_rmsnorm_bwd(void *stream, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C);
int rlk_layernorm_fwd(void *stream, void *out, float *mean, float *rstd, const void *x,
    const void *w, const void *b, int N, int C, float eps);
int rlk_layernorm_bwd(void *stream, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
/* dx (N,C) += what rlk_rmsnorm_bwd / rlk_layernorm_bwd would write, added in f32 before the
 * one rounding (ops.h rmsnorm_bwd_add, layernorm_bwd_add); dx aliases neither dout nor x. */
int rlk_rmsnorm_bwd_add(void *stream, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C);
int rlk_layernorm_bwd_add(void *stream, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
/* x (N,C) = x + t (as rlk_add), then out = layernorm (ln 1) or rmsnorm (ln 0) of the new x. */
int rlk_add_norm_fwd(void *stream, void *x, void *out, float *mean, float *rstd, const void *t,
    const void *w, const void *b, int N, int C, float eps, int ln);
int rlk_qknorm_fwd(void *stream, void *qkv_out, float *rstd, const void *qkv_in,
    const void *wq, const void *wk, int N, int NH, int NKV, int HD, float eps);
int rlk_qknorm_bwd(void *stream, void *dqkv_in, float *dwq, float *dwk, const void *dqkv_out,
    const void *qkv_in, const void *wq, const void *wk, const float *rstd,
    int N, int NH, int NKV, int HD);

/* ---- output layer, losses, sampling (kernels/logprob.cu) ------------------ */
/* logits and dlogits (N, ld), ld >= V: row n's V values start at n * ld */
int rlk_logprob_fwd(void *stream, float *lp, float *ent, float *lse, const void *logits, int ld,
    const int32_t *tgt, int N, int V, float inv_temp);
int rlk_logprob_bwd(void *stream, void *dlogits, const void *logits, int ld, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp);
int rlk_pg_loss(void *stream, float *dlp, float *dent, float *stats, const float *lp,
    const float *old, const float *beh, const float *ref, const float *ent, const float *adv,
    const float *w, int N, rl_pg_params p);
int rlk_sample(void *stream, int32_t *tok, float *logp, const void *logits,
    const uint64_t *seed, const uint64_t *counter, int B, int V, rl_sample_params p);
/* The same function, each row split over several blocks (k_sample_split), for the
 * parameters rlk_sample_split_ok accepts (greedy, or no top-k and no top-p; V up to
 * 262144; B up to 65535).  ws: device scratch of rlk_sample_ws_bytes(B, V); cnt: B
 * unsigned counters, all 0 (the kernel leaves them 0). */
int rlk_sample_split_ok(int B, int V, rl_sample_params p);
size_t rlk_sample_ws_bytes(int B, int V);
int rlk_sample_split(void *stream, void *ws, unsigned *cnt, int32_t *tok, float *logp, const void *logits,
    const uint64_t *seed, const uint64_t *counter, int B, int V, rl_sample_params p);

/* ---- attention (kernels/attn.cu) ----------------------------------------------
 * Prefill/training attention through cuBLAS batched GEMMs over a scratch
 * workspace (scores materialised per chunk of batch rows, recomputed in bwd).
 * rlk_attn_ws_bytes: workspace bytes needed to process `rows` batch rows at once. */
size_t rlk_attn_ws_bytes(int rows, int T, int NH, int NKV, int HD, int bwd);
/* cublas: a cublasHandle_t already bound to stream.  ws, ws_bytes: device scratch,
 * at least rlk_attn_ws_bytes(1, ...).  Returns 0, a cudaError_t, or -(cublasStatus). */
int rlk_attn_fwd(void *stream, void *cublas, void *ws, size_t ws_bytes, void *out, float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD);
int rlk_attn_bwd(void *stream, void *cublas, void *ws, size_t ws_bytes, void *dqkv,
    const void *dout, const void *out, const float *lse, const void *qkv, const int32_t *seg,
    int B, int T, int NH, int NKV, int HD);
/* Flash-style forward (kernels/flash.cu): same results as rlk_attn_fwd, no workspace.
 * rlk_flash_fwd_ok: whether it handles HD and the qkv pointer (HD 64 or 128, 16-byte aligned). */
int rlk_flash_fwd_ok(int HD, const void *qkv);
int rlk_flash_fwd(void *stream, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T,
    int NH, int NKV, int HD);
/* Flash attention forward and backward on mma.sync (kernels/flash2.cu): the contract of
 * rlk_attn_fwd / rlk_attn_bwd without scores.  rlk_flash2_ok: HD 64 or 128, NH a multiple of
 * NKV, the pointers given (NULL allowed) 16-byte aligned.  The backward needs ws: device scratch
 * of rlk_flash2_ws_bytes (D = rowsum(dO * O) per query and head, and with few KV blocks f32
 * partial dK/dV sums per group of query heads; the fused modes add a (B, T, NH, HD) f32 dQ
 * accumulator).  mode: how the backward runs (RL_CUDA_FLASH_BWD, docs/cuda.md):
 * RLK_F2_BWD_DET two passes (dQ, then dK/dV), every output written once: bit-for-bit
 * deterministic; RLK_F2_BWD_FUSED one pass, dQ by f32 atomics (5 products instead of 8,
 * not bit-for-bit reproducible); RLK_F2_BWD_FUSED3 the same compiled for 3 blocks per
 * multiprocessor at HD 64; RLK_F2_BWD_FUSED32 with query tiles of 32 at HD 64 (fewer
 * registers, more blocks per multiprocessor).  At HD 128 the fused modes are one kernel. */
enum { RLK_F2_BWD_DET, RLK_F2_BWD_FUSED, RLK_F2_BWD_FUSED3, RLK_F2_BWD_FUSED32 };
int rlk_flash2_ok(int NH, int NKV, int HD, const void *p0, const void *p1, const void *p2, const void *p3);
size_t rlk_flash2_ws_bytes(int B, int T, int NH, int NKV, int HD, int mode);
int rlk_flash2_fwd(void *stream, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T,
    int NH, int NKV, int HD);
int rlk_flash2_bwd(void *stream, float *ws, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD, int mode);
int rlk_attn_decode(void *stream, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
    int BS, int MAXBLK);
/* Decode attention split over the context (kernels/decode.cu), the same function as
 * rlk_attn_decode for the shapes rlk_attn_decode_split_ok accepts (HD 64 or 128, at most 8
 * query heads per KV head).  nsplit >= 1 splits per (sequence, KV head), chosen by the
 * caller from B and NKV; ws: device scratch of rlk_attn_decode_ws_bytes (NULL when 0).
 * cnt: B * NKV unsigned counters, all 0 (the kernel leaves them 0), for the merge of the
 * splits inside the kernel (by the last block of each sequence and KV head; at most
 * RLK_DECODE_MAXSPLIT splits), or NULL for the separate merge kernel.
 * kind: RLK_DEC_LANE a key per lane (k_decode_lane), RLK_DEC_SPLIT a key per warp
 * (k_decode_split), RLK_DEC_WIDE each round's K and V rows loaded together (k_decode_wide:
 * blocks of 512 threads at HD 64, 256 at 128 when nsplit > 1, else 128).
 * min_keys > 0 (with cnt only): a sequence of L keys takes min(nsplit, ceil(L / min_keys))
 * of the splits (the others do nothing), so a short context skips most of the merge; for
 * RLK_DEC_WIDE, 0 means a round of its block (512 or 256 keys). */
#define RLK_DECODE_MAXSPLIT 64
enum { RLK_DEC_SPLIT, RLK_DEC_LANE, RLK_DEC_WIDE };
/* RLK_DEC_WIDE's warps a block, process-wide (as rlk_set_pdl): 0 the rule above, 4, 8 or 16
 * (16 taken as 8 at HD 128) */
void rlk_set_decode_wide(int nw);
int rlk_attn_decode_split_ok(int NH, int NKV, int HD);
size_t rlk_attn_decode_ws_bytes(int B, int NH, int HD, int nsplit);
int rlk_attn_decode_split(void *stream, float *ws, unsigned *cnt, void *out, const void *qkv,
    const void *kc, const void *vc, const int32_t *block_table, const int32_t *ctx_len, int B, int NH,
    int NKV, int HD, int BS, int MAXBLK, int nsplit, int kind, int min_keys);

/* matmul_fwd for N <= 4 rows (kernels/gemv.cu): out (N, OC) = inp (N, C) @ w (OC, C)^T + bias
 * (NULL for none).  rlk_gemv_ok: N 1..4, C a multiple of 8 up to 8192, inp and w 16-byte
 * aligned. */
int rlk_gemv_ok(int N, int C, const void *inp, const void *w);
int rlk_gemv(void *stream, void *out, const void *inp, const void *w, const void *bias, int N, int C,
    int OC);

/* Decode fusions (kernels/fuse.cu).  rlk_fused_gemv: matmul_fused_fwd of lib/compute/ops.h in one
 * kernel (no scratch) for the shapes rlk_fused_gemv_ok takes: N 1..4, C a multiple of 8 up to
 * 8192, x and w 16-byte aligned, OC even for RL_EP_SWIGLU; with a norm also nw (and nb when
 * given) 16-byte aligned and N * C <= 24576 (the normalised rows in 48 KB of shared memory).
 * rlk_rope_kv_write: rope_kv_write of lib/compute/ops.h (rope.theta <= 0: kv_write alone), any N. */
int rlk_fused_gemv_ok(int N, int C, int OC, int norm, int ep, const void *x, const void *nw, const void *nb,
    const void *w);
int rlk_fused_gemv(void *stream, void *out, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int OC, int ep);
int rlk_rope_kv_write(void *stream, void *kc, void *vc, void *qkv, const int32_t *pos, const int32_t *slot,
    int N, int NH, int NKV, int HD, rl_rope rope);
/* matmul_rope_kv_fwd of lib/compute/ops.h in one kernel: rlk_fused_qkv_ok as rlk_fused_gemv_ok with
 * OC = (NH + 2 NKV) HD, and HD even. */
int rlk_fused_qkv_ok(int N, int C, int NH, int NKV, int HD, int norm, const void *x, const void *nw,
    const void *nb, const void *w);
int rlk_fused_qkv(void *stream, void *qkv, const void *x, const void *nw, const void *nb, float eps, int norm,
    const void *w, const void *bias, int N, int C, int NH, int NKV, int HD, rl_rope rope, const int32_t *pos,
    void *kc, void *vc, const int32_t *slot);

/* The decode step's blocks in one kernel (kernels/step.cu).  One persistent launch runs every
 * transformer block of a decode step of B <= RLK_STEP_ROWS sequences (one new token each) and
 * the final norm and LM head: per layer the five stages of the fused path of lib/model/model_infer.c
 * (norm + QKV + RoPE + cache write; attention over the paged cache with its splits merged in
 * the kernel; o + residual; norm + up + GELU/SwiGLU; down + residual), a grid-wide barrier
 * between stages, and each stage's first weight chunks loaded before its barrier.  The grid is
 * what is resident at once (a cooperative launch), so the barrier cannot deadlock.  Values are
 * those of the separate fused kernels (the same device code per stage) but for the order of
 * attention's sums (its splits and warps), i.e. equal within bf16 rounding.
 * rlk_decode_step_ok: the shapes taken (gpt2: LayerNorm, GELU, no RoPE; else RMSNorm, SwiGLU,
 * RoPE (rope, lib/compute/ops.h); HD 64 or 128, NH / NKV at most 8, C and H multiples of 8, C <= 8192,
 * 16-byte aligned activations and head weights); it reads neither the layer table nor the
 * scratch (ws, cnt, bar, nsplit), which rlk_decode_step checks (1 <= nsplit <=
 * RLK_DECODE_MAXSPLIT, ws 16-byte aligned).
 * rlk_decode_step_blocks: the grid it launches for s (every block resident at once on the
 * current device), 0 when the query fails; the caller picks nsplit from it (and sizes ws).
 * The layer table and the counters are device memory: cnt (B * NKV) and bar (2) zero before
 * the first launch, and every launch leaves them zero (CUDA graph replays included). */
#define RLK_STEP_ROWS 1
typedef rl_step_layer rlk_step_layer;  /* lib/compute/ops.h */
typedef struct rlk_step {
	int n_layer, C, NH, NKV, HD, H, V;
	int gpt2;                      /* 1: LayerNorm, GELU, no RoPE; 0: RMSNorm, SwiGLU, RoPE */
	float eps;
	rl_rope rope;                  /* RoPE's frequencies (lib/compute/ops.h) */
	int BS, MAXBLK;                /* cache block size; columns of the block table */
	const rlk_step_layer *layer;   /* device array (n_layer) */
	const void *lnf_w, *lnf_b, *lm_w;
	void *x;                       /* (B, C) act: the embedded tokens in, the last block's out */
	void *qkv, *att, *h;           /* scratch act: (B, (NH+2NKV) HD), (B, NH HD), (B, H) */
	void *logits;                  /* (B, V) act */
	float *ws;                     /* attention partials, rlk_attn_decode_ws_bytes(B, NH, HD, nsplit) */
	unsigned *cnt, *bar;           /* merge counters (B * NKV), barrier counters (2) */
	int nsplit;
	int split_keys;                /* keys a split takes at least: a context of L keys uses
	                                * min(nsplit, ceil(L / split_keys)) splits (0: nsplit) */
	int grid;                      /* blocks to launch: 0 every resident one, else at most that */
	int bar_kind;                  /* the barrier's poll: RLK_STEP_BAR_* */
	int plain;                     /* 1: an ordinary launch, not a cooperative one (diagnostics:
	                                * every block is resident only while nothing else runs) */
	unsigned long long *prof;      /* NULL, or the stage timings: RLK_STEP_PROF_U64(n_layer) */
} rlk_step;
/* The barrier's poll (diagnostics): with a 32 ns sleep between polls (the
 * default), without, or acquire loads after a release add (no fences, no sleep). */
enum { RLK_STEP_BAR_SLEEP = 0, RLK_STEP_BAR_SPIN, RLK_STEP_BAR_ACQ };
/* The stage profile (RL_CUDA_STEP_PROFILE): per barrier k of 0 .. 5 n_layer + 1 (0: the
 * kernel's start, the last: its end) four globaltimer stamps (the last and first block to
 * arrive, the first and last to leave), then RLK_STEP_PROF_ACC sums the last block of each
 * launch adds: per stage kind (QKV, attention, o, fc, proj, head) the ns from the first block
 * leaving the barrier before it to the last (then the first) arriving at the one after, the
 * barrier after it (last arrival to first departure) and its departures' spread; then the
 * whole launch's ns, the launches, the ns from the end of a launch to the start of the next
 * (the caller's kernels between steps and the launch's own latency) and the last end.  The
 * caller zeroes it but the minima (0xff...), and every launch leaves the stamps so again. */
#define RLK_STEP_PROF_ACC (6 * 4 + 4)
#define RLK_STEP_PROF_U64(n_layer) (4 * (5 * (size_t)(n_layer) + 2) + RLK_STEP_PROF_ACC)
int rlk_decode_step_ok(const rlk_step *s, int B);
/* The checks of rlk_decode_step_ok for one entry of the layer table, which the launcher cannot
 * read (device memory): l, the caller's host copy of the entry (the required pointers given,
 * weights, norm weights and caches 16-byte aligned). */
int rlk_step_layer_ok(const rlk_step *s, const rlk_step_layer *l);
int rlk_decode_step_blocks(const rlk_step *s, int B);
/* pos, slot, ctx (B), bt (B, MAXBLK) as rlk_attn_decode_split and rlk_fused_qkv take them */
int rlk_decode_step(void *stream, const rlk_step *s, const int32_t *pos, const int32_t *slot, const int32_t *bt,
    const int32_t *ctx, int B);

#ifdef __cplusplus
}
#endif

#endif

/*
 * ops_cpu.h — the CPU reference backend's ops as plain public functions, so
 * that CUDA tests, kernel experiments and the model can call the oracle
 * directly without going through an rl_ops table.
 *
 * Each rl_cpu_X has exactly the signature of the rl_ops member X (lib/compute/ops.h,
 * where the semantics and shapes are); the CPU table points at these very
 * functions.  Pointers are host memory; "act" tensors are float.  o may be
 * NULL: a failure (an allocation for scratch space, an invalid argument) is
 * then only logged, otherwise it is also recorded for o->status().
 * The functions parallelise internally with OpenMP; results do not depend on
 * the number of threads (every reduction is split the same way).
 *
 * Leaves out: the table itself (rl_ops_cpu_open in ops.h).
 */
#ifndef RL_OPS_CPU_H
#define RL_OPS_CPU_H

#include <math.h>
#include <stdint.h>

#include "compute/ops.h"

/*
 * rl_cpu_expf: exp for float that compilers can vectorise (no libm call), used
 * by the softmax-heavy ops.  Cody-Waite reduction to r in [-ln2/2, ln2/2], a
 * degree-6 polynomial for e^r (Cephes' minimax coefficients), then 2^n applied
 * as two exact power-of-two factors so the whole range works.  Within 2 ulp of
 * exp over [-103.9, 88.7] (test_ops_cpu checks it); exp(-inf) = 0, large x
 * gives +inf, NaN stays NaN, results below ~1e-45 flush to 0.
 */
static inline float
rl_cpu_expf(float x)
{
	/* ternaries, not fminf/fmaxf: they if-convert, so loops calling this vectorise;
	 * a NaN x becomes -103.9 here and is put back at the end */
	float xc = x > -103.9f ? x : -103.9f;
	xc = xc < 88.7228f ? xc : 88.7228f;
	float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
	float r = xc - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	int32_t ni = (int32_t)n, h = ni >> 1;
	union { int32_t i; float f; } s1 = { (h + 127) << 23 }, s2 = { (ni - h + 127) << 23 };
	float y = p * s1.f * s2.f;
	y = x < -103.9f ? 0.0f : y;
	y = x > 88.7228f ? INFINITY : y;
	return x != x ? x : y;
}

/* memory and control */
int rl_cpu_alloc(rl_ops *o, void **p, size_t bytes);
void rl_cpu_free(rl_ops *o, void *p);
void rl_cpu_upload(rl_ops *o, void *dst, const void *host_src, size_t bytes);
void rl_cpu_download(rl_ops *o, void *host_dst, const void *src, size_t bytes);
void rl_cpu_copy(rl_ops *o, void *dst, const void *src, size_t bytes);
void rl_cpu_zero(rl_ops *o, void *p, size_t bytes);
void rl_cpu_cast(rl_ops *o, void *out, int out_dt, const void *in, int in_dt, size_t n);
int rl_cpu_sync(rl_ops *o);
int rl_cpu_status(rl_ops *o);

/* embedding, normalisation */
void rl_cpu_embed_fwd(rl_ops *o, void *out, const int32_t *tok, const int32_t *pos,
    const void *wte, const void *wpe, int N, int C);
void rl_cpu_embed_bwd(rl_ops *o, float *dwte, float *dwpe, const void *dout,
    const int32_t *tok, const int32_t *pos, int N, int C);
void rl_cpu_rmsnorm_fwd(rl_ops *o, void *out, float *rstd, const void *x, const void *w,
    int N, int C, float eps);
void rl_cpu_rmsnorm_bwd(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C);
void rl_cpu_layernorm_fwd(rl_ops *o, void *out, float *mean, float *rstd, const void *x,
    const void *w, const void *b, int N, int C, float eps);
void rl_cpu_layernorm_bwd(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
void rl_cpu_rmsnorm_bwd_add(rl_ops *o, void *dx, float *dw, const void *dout, const void *x,
    const void *w, const float *rstd, int N, int C);
void rl_cpu_layernorm_bwd_add(rl_ops *o, void *dx, float *dw, float *db, const void *dout,
    const void *x, const void *w, const float *mean, const float *rstd, int N, int C);
void rl_cpu_qknorm_fwd(rl_ops *o, void *qkv_out, float *rstd, const void *qkv_in,
    const void *wq, const void *wk, int N, int NH, int NKV, int HD, float eps);
void rl_cpu_qknorm_bwd(rl_ops *o, void *dqkv_in, float *dwq, float *dwk, const void *dqkv_out,
    const void *qkv_in, const void *wq, const void *wk, const float *rstd,
    int N, int NH, int NKV, int HD);

/* linear layers */
void rl_cpu_matmul_fwd(rl_ops *o, void *out, const void *inp, const void *w, const void *bias,
    int N, int C, int OC);
void rl_cpu_matmul_bwd(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout,
    const void *inp, const void *w, int N, int C, int OC);

/* position, attention */
/* inv_freq[i] of a head dim HD under r (lib/compute/ops.h rl_rope), fp32; what rope_fwd/bwd use */
float rl_cpu_rope_inv(rl_rope r, int i, int HD);
void rl_cpu_rope_fwd(rl_ops *o, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD,
    rl_rope rope);
void rl_cpu_rope_bwd(rl_ops *o, void *dqkv, const int32_t *pos, int N, int NH, int NKV, int HD,
    rl_rope rope);
void rl_cpu_attn_fwd(rl_ops *o, void *out, float *lse, const void *qkv, const int32_t *seg,
    int B, int T, int NH, int NKV, int HD);
void rl_cpu_attn_bwd(rl_ops *o, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD);
/* attn_fwd / attn_bwd with the scores' scale (attn_fwd's is 1/sqrt(HD)) and a sliding
 * window: with win > 0 query t sees keys s with t - win < s <= t only (Mistral's and
 * Gemma 3's local layers); win 0 is plain causal attention.  Not in the rl_ops table:
 * the CUDA kernels have neither, so a model that needs them runs on the CPU only
 * (lib/model/model.c refuses it elsewhere). */
void rl_cpu_attn_fwd_ex(rl_ops *o, void *out, float *lse, const void *qkv, const int32_t *seg,
    int B, int T, int NH, int NKV, int HD, float scale, int win);
void rl_cpu_attn_bwd_ex(rl_ops *o, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD, float scale, int win);

/* activations, residual */
void rl_cpu_swiglu_fwd(rl_ops *o, void *out, const void *gu, int N, int H);
void rl_cpu_swiglu_bwd(rl_ops *o, void *dgu, const void *dout, const void *gu, int N, int H);
void rl_cpu_gelu_fwd(rl_ops *o, void *out, const void *x, size_t n);
void rl_cpu_gelu_bwd(rl_ops *o, void *dx, const void *dout, const void *x, size_t n);
/* Gemma's gated MLP: out (N,H) = gelu_tanh(gu[:, :H]) * gu[:, H:] (gelu_fwd's GELU,
 * transformers' gelu_pytorch_tanh), and its backward as swiglu_bwd's (dgu may alias gu).
 * Not in the rl_ops table (no CUDA kernel). */
void rl_cpu_geglu_fwd(rl_ops *o, void *out, const void *gu, int N, int H);
void rl_cpu_geglu_bwd(rl_ops *o, void *dgu, const void *dout, const void *gu, int N, int H);
void rl_cpu_add(rl_ops *o, void *out, const void *a, const void *b, size_t n);

/* output layer, losses */
void rl_cpu_logprob_fwd(rl_ops *o, float *lp, float *ent, float *lse, const void *logits,
    const int32_t *tgt, int N, int V, float inv_temp);
void rl_cpu_logprob_bwd(rl_ops *o, void *dlogits, const void *logits, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp);
void rl_cpu_pg_loss(rl_ops *o, float *dlp, float *dent, float *stats, const float *lp,
    const float *old, const float *beh, const float *ref, const float *ent, const float *adv,
    const float *w, int N, const rl_pg_params *p);

/* optimizer */
double rl_cpu_sumsq(rl_ops *o, const float *x, size_t n);
void rl_cpu_adamw(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v,
    size_t n, float lr, float b1, float b2, float eps, float wd, int t, float grad_scale);

/* generation */
void rl_cpu_kv_write(rl_ops *o, void *kc, void *vc, const void *qkv, const int32_t *slot,
    int N, int NH, int NKV, int HD);
void rl_cpu_attn_decode(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
    int BS, int MAXBLK);
/* attn_decode with scale and window as rl_cpu_attn_fwd_ex: the query (the sequence's
 * last cached token, position ctx_len - 1) sees the last win cached tokens. */
void rl_cpu_attn_decode_ex(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD,
    int BS, int MAXBLK, float scale, int win);
void rl_cpu_sample(rl_ops *o, int32_t *tok, float *logp, const void *logits,
    const uint64_t *seed, const uint64_t *counter, int B, int V, const rl_sample_params *p);
void rl_cpu_decode_advance(rl_ops *o, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS);

#endif

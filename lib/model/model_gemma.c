/*
 * model_gemma.c — Gemma 3's decoder layer (transformers' Gemma3DecoderLayer) for the
 * training forward and backward and for inference over the KV cache: RMSNorm that
 * scales by (1 + w), four norms per layer (input, post_attention, pre_feedforward,
 * post_feedforward), q/k norms of the same kind, the query_pre_attn_scalar scale,
 * sliding-window attention on the local layers with their own RoPE base, the
 * GELU(tanh)-gated MLP, and embeddings times sqrt(hidden_size).
 *
 * CPU only (lib/model/model.c check_backend refuses other backends): the ops without a
 * CUDA kernel are called from lib/compute/ops_cpu.h, and (1 + w) is formed in host
 * scratch (m->gw1) before the plain RMSNorm ops, whose weight gradient is the same.
 *
 * Leaves out: LoRA adapters (refused for Gemma in lora.c), tanh soft-capping of the
 * scores or the logits (Gemma 2's; config.c refuses it), the value head's specifics
 * (the generic one after the final norm applies).
 */
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "compute/ops_cpu.h"
#include "model/model_int.h"

/* dst (n) = 1 + w, the scale Gemma's RMSNorm multiplies by (in f32, as transformers'
 * Gemma3RMSNorm computes it). */
static const float *
plus1(float *dst, const float *w, int n)
{
	for (int i = 0; i < n; i++)
		dst[i] = 1.0f + w[i];
	return dst;
}

void
rli_gemma_embed_scale(rl_model *m, void *x_, int N)
{
	float *x = x_;
	/* transformers: torch.tensor(hidden_size ** 0.5) cast to the embedding's dtype */
	const float sc = (float)sqrt((double)m->cfg.hidden_size);
	const size_t n = (size_t)N * m->cfg.hidden_size;

#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t i = 0; i < n; i++)
		x[i] *= sc;
}

void
rli_gemma_norm_fwd(rl_model *m, void *out, float *rstd, const void *x, int wi, int N)
{
	const int C = m->cfg.hidden_size;
	rl_cpu_rmsnorm_fwd(m->ops, out, rstd, x, plus1(m->gw1, W(m, wi), C), N, C, m->cfg.norm_eps);
}

void
rli_gemma_norm_bwd(rl_model *m, void *dx, const void *dout, const void *x, const float *rstd, int wi, int N,
    int acc)
{
	const int C = m->cfg.hidden_size;
	const float *w1 = plus1(m->gw1, W(m, wi), C);
	if (acc)
		rl_cpu_rmsnorm_bwd_add(m->ops, dx, G(m, wi), dout, x, w1, rstd, N, C);
	else
		rl_cpu_rmsnorm_bwd(m->ops, dx, G(m, wi), dout, x, w1, rstd, N, C);
}

/* q/k norms of qkv_in into qkv_out: the (1 + w) of both in the scratch after C floats */
static void
qknorm_fwd(rl_model *m, void *out, float *rstd, const void *in, const rl_layer_idx *y, int N)
{
	const rl_config *c = &m->cfg;
	const int HD = c->head_dim;
	float *wq = m->gw1 + c->hidden_size, *wk = wq + HD;

	plus1(wq, W(m, y->qn_w), HD);
	plus1(wk, W(m, y->kn_w), HD);
	rl_cpu_qknorm_fwd(m->ops, out, rstd, in, wq, wk, N, c->n_head, c->n_kv_head, HD, c->norm_eps);
}

void
rli_gemma_layer_fwd(rl_model *m, int l)
{
	rl_ops *o = m->ops;
	rl_model_act *a = m->act;
	const rl_config *c = &m->cfg;
	const int B = a->B, T = a->T, N = B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
	const int HD = c->head_dim, QKV = qkv_dim(c), AD = NH * HD, FC = fc_dim(c), H = c->intermediate_size;
	const size_t s = asz(m), NC = (size_t)N * C, sN = (size_t)a->maxN;
	const size_t k = a->recompute ? 0 : (size_t)l;
	const rl_layer_idx *y = &m->layer[l];
	void *res = at(a->res, l * sN * C, s), *res_out = at(a->res, (l + 1) * sN * C, s);
	void *ln1 = at(a->ln1, k * sN * C, s), *ln2 = at(a->ln2, k * sN * C, s);
	void *mid = at(a->res_mid, k * sN * C, s), *qkv = at(a->qkv, k * sN * QKV, s);
	void *raw = at(a->qkv_raw, k * sN * QKV, s), *att = at(a->att, k * sN * AD, s);
	void *fc = at(a->fc, k * sN * FC, s), *h = at(a->h, k * sN * H, s);
	void *ao = at(a->ao, k * sN * C, s), *mo = at(a->mo, k * sN * C, s);

	/* mid = res + post_attention_norm(o(attn(rope(qknorm(qkv(input_norm(res))))))) */
	rli_gemma_norm_fwd(m, ln1, a->ln1_rstd + k * sN, res, y->ln1_w, N);
	o->matmul_fwd(o, raw, ln1, W(m, y->qkv_w), NULL, N, C, QKV);
	qknorm_fwd(m, qkv, a->qk_rstd + k * sN * (NH + NKV), raw, y, N);
	o->rope_fwd(o, qkv, a->pos, N, NH, NKV, HD, layer_rope(c, l));
	rli_model_attn_fwd(m, l, att, a->lse + k * sN * NH, qkv, a->has_seg ? a->seg : NULL, B, T);
	o->matmul_fwd(o, ao, att, W(m, y->o_w), NULL, N, AD, C);
	rli_gemma_norm_fwd(m, mid, a->pa_rstd + k * sN, ao, y->pa_w, N);
	o->add(o, mid, mid, res, NC);
	/* res_out = mid + post_feedforward_norm(down(geglu(gate_up(pre_feedforward_norm(mid))))) */
	rli_gemma_norm_fwd(m, ln2, a->ln2_rstd + k * sN, mid, y->ln2_w, N);
	o->matmul_fwd(o, fc, ln2, W(m, y->fc_w), NULL, N, C, FC);
	rl_cpu_geglu_fwd(o, h, fc, N, H);
	o->matmul_fwd(o, mo, h, W(m, y->proj_w), NULL, N, H, C);
	rli_gemma_norm_fwd(m, res_out, a->pf_rstd + k * sN, mo, y->pf_w, N);
	o->add(o, res_out, res_out, mid, NC);
}

void
rli_gemma_layer_bwd(rl_model *m, int l)
{
	rl_ops *o = m->ops;
	rl_model_act *a = m->act;
	const rl_config *c = &m->cfg;
	const int B = a->B, T = a->T, N = B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
	const int HD = c->head_dim, QKV = qkv_dim(c), AD = NH * HD, FC = fc_dim(c), H = c->intermediate_size;
	const size_t s = asz(m), sN = (size_t)a->maxN;
	const size_t k = a->recompute ? 0 : (size_t)l;
	const rl_layer_idx *y = &m->layer[l];
	void *res = at(a->res, l * sN * C, s);
	void *ln1 = at(a->ln1, k * sN * C, s), *ln2 = at(a->ln2, k * sN * C, s);
	void *mid = at(a->res_mid, k * sN * C, s), *qkv = at(a->qkv, k * sN * QKV, s);
	void *raw = at(a->qkv_raw, k * sN * QKV, s), *att = at(a->att, k * sN * AD, s);
	void *fc = at(a->fc, k * sN * FC, s), *h = at(a->h, k * sN * H, s);
	void *ao = at(a->ao, k * sN * C, s), *mo = at(a->mo, k * sN * C, s);
	const int HDq = c->hidden_size;
	float *wq = m->gw1 + HDq, *wk = wq + HD;

	/* a->dres: d res_out; it becomes d mid, then d res */
	rli_gemma_norm_bwd(m, a->dx, a->dres, mo, a->pf_rstd + k * sN, y->pf_w, N, 0);
	o->matmul_bwd(o, a->dh, G(m, y->proj_w), NULL, a->dx, h, W(m, y->proj_w), N, H, C);
	rl_cpu_geglu_bwd(o, a->dfc, a->dh, fc, N, H);
	o->matmul_bwd(o, a->dx, G(m, y->fc_w), NULL, a->dfc, ln2, W(m, y->fc_w), N, C, FC);
	rli_gemma_norm_bwd(m, a->dres, a->dx, mid, a->ln2_rstd + k * sN, y->ln2_w, N, 1);
	rli_gemma_norm_bwd(m, a->dx, a->dres, ao, a->pa_rstd + k * sN, y->pa_w, N, 0);
	o->matmul_bwd(o, a->datt, G(m, y->o_w), NULL, a->dx, att, W(m, y->o_w), N, AD, C);
	rli_model_attn_bwd(m, l, a->dqkv, a->datt, att, a->lse + k * sN * NH, qkv, a->has_seg ? a->seg : NULL,
	    B, T);
	o->rope_bwd(o, a->dqkv, a->pos, N, NH, NKV, HD, layer_rope(c, l));
	plus1(wq, W(m, y->qn_w), HD);
	plus1(wk, W(m, y->kn_w), HD);
	rl_cpu_qknorm_bwd(o, a->dqkv2, G(m, y->qn_w), G(m, y->kn_w), a->dqkv, raw, wq, wk,
	    a->qk_rstd + k * sN * (NH + NKV), N, NH, NKV, HD);
	o->matmul_bwd(o, a->dx, G(m, y->qkv_w), NULL, a->dqkv2, ln1, W(m, y->qkv_w), N, C, QKV);
	rli_gemma_norm_bwd(m, a->dres, a->dx, res, a->ln1_rstd + k * sN, y->ln1_w, N, 1);
}

void
rli_gemma_infer_blocks(rl_model *m, rl_kvcache *kv, int N, int decode, int B, const int32_t *pos,
    const int32_t *slot, const int32_t *bt, const int32_t *ctx, int btcols)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	const rl_config *c = &m->cfg;
	const int C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, HD = c->head_dim;
	const int QKV = qkv_dim(c), AD = NH * HD, H = c->intermediate_size;
	const size_t NC = (size_t)N * C;

	rli_gemma_embed_scale(m, f->x, N);
	for (int l = 0; l < c->n_layer; l++) {
		const rl_layer_idx *y = &m->layer[l];

		rli_gemma_norm_fwd(m, f->xn, f->rstd, f->x, y->ln1_w, N);
		o->matmul_fwd(o, f->qkv, f->xn, W(m, y->qkv_w), NULL, N, C, QKV);
		qknorm_fwd(m, f->qkv2, f->qk_rstd, f->qkv, y, N);
		o->rope_fwd(o, f->qkv2, pos, N, NH, NKV, HD, layer_rope(c, l));
		/* the cache keeps every position; the window is applied when reading it */
		o->kv_write(o, kv->kc[l], kv->vc[l], f->qkv2, slot, N, NH, NKV, HD);
		if (decode)
			rli_model_attn_decode(m, l, f->att, f->qkv2, kv->kc[l], kv->vc[l], bt, ctx, B, kv->BS, btcols);
		else
			rli_model_attn_fwd(m, l, f->att, f->lse, f->qkv2, f->seg, B, N / B);
		o->matmul_fwd(o, f->t, f->att, W(m, y->o_w), NULL, N, AD, C);
		rli_gemma_norm_fwd(m, f->xn, f->rstd, f->t, y->pa_w, N);
		o->add(o, f->x, f->x, f->xn, NC);
		rli_gemma_norm_fwd(m, f->xn, f->rstd, f->x, y->ln2_w, N);
		o->matmul_fwd(o, f->fc, f->xn, W(m, y->fc_w), NULL, N, C, 2 * H);
		rl_cpu_geglu_fwd(o, f->h, f->fc, N, H);
		o->matmul_fwd(o, f->t, f->h, W(m, y->proj_w), NULL, N, H, C);
		rli_gemma_norm_fwd(m, f->xn, f->rstd, f->t, y->pf_w, N);
		o->add(o, f->x, f->x, f->xn, NC);
	}
}

/*
 * model_train.c — the training passes: activation buffers (rl_model_train_reserve,
 * rl_model_eval_reserve), the forward to per-token log-probs and entropy
 * (activations kept per layer, llm.c style, or one layer recomputed in backward;
 * lm_head + log-prob chunked over rows and recomputed in backward unless one
 * chunk held them all), the full backward with the optional value head, and AdamW
 * with global-norm clipping.
 *
 * Leaves out: losses (the trainer's), loading and the tensor table (model.c),
 * inference (model_infer.c).
 */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"

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

/* Rows of logits in one chunk: chunk_bytes of them, at least one, at most
 * the batch; whole GEMM tiles when the chunk does not cover the batch. */
static int
logit_chunk_rows(int max_tokens, int ld, size_t act_size, size_t chunk_bytes)
{
	int rows = (int)RL_MAX((size_t)1, RL_MIN((size_t)max_tokens, chunk_bytes / ((size_t)ld * act_size)));
	if (rows < max_tokens && rows > 256)
		rows &= ~127;
	return rows;
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

/* The activation arrays of a, in three carves: act dtype (elements of s
 * bytes), f32 and i32.  With carves of NULL base, a dry run that only sizes
 * them (rl_model_act_bytes_for). */
static void
carve_act(const rl_config *c, int value_head, size_t s, rl_model_act *a, carve *ca, carve *cf, carve *ci)
{
	size_t N = (size_t)a->maxN, L = (size_t)c->n_layer, C = (size_t)c->hidden_size;
	size_t QKV = (size_t)qkv_dim(c), AD = (size_t)c->n_head * c->head_dim, FC = (size_t)fc_dim(c);
	size_t H = (size_t)c->intermediate_size;
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
	a->vout = value_head ? take(ca, N, s) : NULL;
	a->dvout = value_head ? take(ca, N, s) : NULL;
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
	a->ao = c->gemma ? take(ca, L * N * C, s) : NULL;
	a->mo = c->gemma ? take(ca, L * N * C, s) : NULL;
	a->pa_rstd = c->gemma ? take(cf, L * N, 4) : NULL;
	a->pf_rstd = c->gemma ? take(cf, L * N, 4) : NULL;
	a->lse = take(cf, L * N * (size_t)c->n_head, 4);
	a->lnf_mean = take(cf, N, 4);
	a->lnf_rstd = take(cf, N, 4);
	a->lp = take(cf, N, 4);
	a->ent = take(cf, N, 4);
	a->lse_out = take(cf, N, 4);
	a->val = value_head ? take(cf, N, 4) : NULL;
	a->tok = take(ci, N, 4);
	a->tgt = take(ci, N, 4);
	a->seg = take(ci, N, 4);
	a->pos = take(ci, N, 4);
}

/* With LoRA only the trained tensors, at the end of the table, have gradients and
 * AdamW state: goff is where they start; the sink takes the frozen norms'. */
static int
lora_grad_layout(rl_model *m)
{
	size_t sink = 1;

	m->goff = m->tt.total;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if (!frozen(m, i))
			m->goff = RL_MIN(m->goff, t->off);
		else if (t->ndim == 1)
			sink = RL_MAX(sink, t->n);
	}
	for (int i = 0; i < m->tt.n; i++)
		if (frozen(m, i) && m->tt.t[i].off >= m->goff) {
			rl_error("LoRA: frozen tensor '%s' after the trained ones", m->tt.t[i].name);
			return RL_EINVAL;
		}
	return m->ops->alloc(m->ops, (void **)&m->gsink, sink * sizeof(float));
}

int
rl_model_train_reserve(rl_model *m, int max_tokens)
{
	rl_ops *o = m->ops;
	size_t bytes;
	int rv;

	if (max_tokens <= 0)
		return RL_EINVAL;
	if (m->grads == NULL && m->lora != NULL && (rv = lora_grad_layout(m)) != 0)
		return rv;
	bytes = (m->tt.total - m->goff) * sizeof(float);
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
	rli_model_free_act(m);
	a = rl_xcalloc(1, sizeof *a);
	a->maxN = max_tokens;
	a->recompute = one;
	a->ld = logits_ld(m);
	a->chunk = logit_chunk_rows(max_tokens, a->ld, asz(m), logit_chunk_bytes(m));
	carve_act(&m->cfg, m->vh_w >= 0, asz(m), a, &ca, &cf, &ci);
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
	carve_act(&m->cfg, m->vh_w >= 0, asz(m), a, &ca, &cf, &ci);
	a->hpos = rl_xcalloc((size_t)max_tokens, sizeof *a->hpos);
	m->act = a;
	if ((rv = rli_lora_reserve(m, max_tokens)) != 0)
		return rv;
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

size_t
rl_model_act_bytes_for(const rl_config *c, size_t act_size, int ld, size_t chunk_bytes, int max_tokens, int one_layer,
    int value_head)
{
	rl_model_act a = { 0 };
	carve ca = { 0 }, cf = { 0 }, ci = { 0 };

	if (max_tokens <= 0)
		return 0;
	a.maxN = max_tokens;
	a.recompute = one_layer;
	a.ld = ld;
	a.chunk = logit_chunk_rows(max_tokens, ld, act_size, chunk_bytes);
	carve_act(c, value_head, act_size, &a, &ca, &cf, &ci);
	return ca.off + cf.off + ci.off;
}

size_t
rl_model_logit_chunk_bytes(int act_f32, int training)
{
	return act_f32 ? LOGIT_CHUNK_BYTES : training ? LOGIT_KEEP_BYTES_GPU : LOGIT_CHUNK_BYTES_GPU;
}

void
rl_model_zero_grad(rl_model *m)
{
	if (m->grads != NULL)
		m->ops->zero(m->ops, m->grads, (m->tt.total - m->goff) * sizeof(float));
}

static void
norm_bwd(rl_model *m, void *dx, const void *dout, const void *x, const float *mean,
    const float *rstd, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	if (m->cfg.gemma)
		rli_gemma_norm_bwd(m, dx, dout, x, rstd, wi, N, 0);
	else if (m->cfg.arch == RL_ARCH_GPT2)
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
	if (m->cfg.gemma) {
		rli_gemma_norm_bwd(m, dres, dout, x, rstd, wi, N, 1);
		return;
	}
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

int
rli_model_check_inputs(const rl_model *m, const int32_t *tok, const int32_t *tgt, const int32_t *pos, int N,
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

	if (c->gemma) {
		rli_gemma_layer_fwd(m, l);
		return;
	}
	rli_model_norm_fwd(m, ln1, a->ln1_mean + k * sN, a->ln1_rstd + k * sN, res, y->ln1_w, y->ln1_b, N);
	if (c->qk_norm) {
		void *raw = at(a->qkv_raw, k * sN * QKV, s);
		o->matmul_fwd(o, raw, ln1, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV);
		if (m->lora)
			rli_lora_fwd(m, l, RLI_LORA_QKV, ln1, raw, N);
		o->qknorm_fwd(o, qkv, a->qk_rstd + k * sN * (NH + NKV), raw, W(m, y->qn_w),
		    W(m, y->kn_w), N, NH, NKV, HD, c->norm_eps);
	} else {
		o->matmul_fwd(o, qkv, ln1, W(m, y->qkv_w), W(m, y->qkv_b), N, C, QKV);
		if (m->lora)
			rli_lora_fwd(m, l, RLI_LORA_QKV, ln1, qkv, N);
	}
	if (c->arch == RL_ARCH_LLAMA)
		o->rope_fwd(o, qkv, a->pos, N, NH, NKV, HD, cfg_rope(c));
	rli_model_attn_fwd(m, l, att, lse, qkv, dseg, B, T);
	if (o->matmul_add_fwd) {
		o->matmul_add_fwd(o, mid, att, W(m, y->o_w), W(m, y->o_b), res, N, AD, C);
	} else {
		o->matmul_fwd(o, mid, att, W(m, y->o_w), W(m, y->o_b), N, AD, C);
		o->add(o, mid, mid, res, NC);
	}
	if (m->lora)
		rli_lora_fwd(m, l, RLI_LORA_O, att, mid, N);
	rli_model_norm_fwd(m, ln2, a->ln2_mean + k * sN, a->ln2_rstd + k * sN, mid, y->ln2_w, y->ln2_b, N);
	if (m->lora) {
		/* as rli_model_mlp_up_fwd does for Llama (LoRA's only family), with the
		 * adapters between the GEMM and the activation */
		o->matmul_fwd(o, fc, ln2, W(m, y->fc_w), W(m, y->fc_b), N, C, FC);
		rli_lora_fwd(m, l, RLI_LORA_FC, ln2, fc, N);
		o->swiglu_fwd(o, h, fc, N, H);
	} else {
		rli_model_mlp_up_fwd(m, h, fc, ln2, y, N);
	}
	if (o->matmul_add_fwd) {
		o->matmul_add_fwd(o, res_out, h, W(m, y->proj_w), W(m, y->proj_b), mid, N, H, C);
	} else {
		o->matmul_fwd(o, res_out, h, W(m, y->proj_w), W(m, y->proj_b), N, H, C);
		o->add(o, res_out, res_out, mid, NC);
	}
	if (m->lora)
		rli_lora_fwd(m, l, RLI_LORA_DOWN, h, res_out, N);
}

/* m->param_need: the weights of unit u are about to be read. */
static int
need(rl_model *m, int u, int next)
{
	return m->param_need ? m->param_need(m->param_need_ctx, u, next) : RL_OK;
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
	if ((rv = rli_model_check_inputs(m, tok, tgt, a->hpos, N, "model forward")) != 0)
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
	if (m->lora)
		m->lora->fwd_off = m->lora->off;
	if (m->lora && !m->lora->off) {
		/* dropout in the passes of the model being trained (train mode), each its own masks */
		m->lora->drop = m->lora->o.dropout > 0 && m->grads != NULL;
		if (m->lora->pass_step != m->step) {
			m->lora->pass_step = m->step;
			m->lora->pass = 0;
		}
		m->lora->pass += m->lora->drop;
	}

	if ((rv = need(m, 0, 1)) != 0)
		return rv;
	o->embed_fwd(o, a->res, a->tok, a->pos, W(m, m->wte), W(m, m->wpe), N, C);
	if (c->gemma)
		rli_gemma_embed_scale(m, a->res, N);
	for (int l = 0; l < c->n_layer; l++) {
		if ((rv = need(m, 1 + l, 2 + l)) != 0)
			return rv;
		layer_fwd(m, l);
	}
	if ((rv = need(m, c->n_layer + 1, -1)) != 0)
		return rv;
	rli_model_norm_fwd(m, a->lnf, a->lnf_mean, a->lnf_rstd, at(a->res, (size_t)c->n_layer * sN * C, s),
	    m->lnf_w, m->lnf_b, N);
	/* a reward model scoring (no gradients): the scores are all it needs, the
	 * (N, V) head is skipped and the log-probs are 0 */
	const int score_only = c->seq_cls && m->grads == NULL && m->vh_w >= 0;
	if (score_only) {
		o->zero(o, a->lp, (size_t)N * 4);
		o->zero(o, a->ent, (size_t)N * 4);
	}
	for (int r0 = 0; r0 < N && !score_only; r0 += a->chunk) {
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
	a->logits_kept = N <= a->chunk && !score_only;
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
	/* with LoRA the trained tensors are not in layer order at the end of the
	 * table: all of them are final at the end only */
	if (m->lora != NULL && i >= 0)
		return RL_OK;
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
	if (m->lora != NULL && m->lora->fwd_off) {
		rl_error("model backward: the last forward ran with the adapters off (a reference's forward)");
		return RL_EINVAL;
	}
	const int B = a->B, T = a->T, N = B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head;
	const int HD = c->head_dim, QKV = qkv_dim(c), AD = NH * HD, FC = fc_dim(c), H = c->intermediate_size;
	const int V = c->vocab_size;
	const size_t s = asz(m), NC = (size_t)N * C, sN = (size_t)a->maxN;
	const int32_t *dseg = a->has_seg ? a->seg : NULL;

	if ((rv = need(m, c->n_layer + 1, c->n_layer)) != 0)
		return rv;
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
			o->matmul_bwd_ld(o, at(a->dx, (size_t)r0 * C, s), GT(m, m->lm_w), a->logits, a->ld, x,
			    W(m, m->lm_w), n, C, V);
			continue;
		}
		if (!kept)
			o->matmul_fwd(o, a->logits, x, W(m, m->lm_w), NULL, n, C, V);
		o->logprob_bwd(o, a->logits, a->logits, a->tgt + r0, a->lse_out + r0, dlp + r0,
		    dent ? dent + r0 : NULL, n, V, a->inv_temp);
		o->matmul_bwd(o, at(a->dx, (size_t)r0 * C, s), GT(m, m->lm_w), NULL, a->logits, x,
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

		if ((rv = need(m, 1 + l, l > 0 ? l : -1)) != 0)
			return rv;
		/* recompute: this layer's activations again, from its saved input res[l]
		 * (slot 0 holds the last layer's from the forward) */
		if (a->recompute && l != c->n_layer - 1)
			layer_fwd(m, l);
		if (c->gemma) {
			rli_gemma_layer_bwd(m, l);
			if ((rv = grads_final(m, y->ln1_w)) != 0)
				return rv;
			continue;
		}

		/* res_out = mid + proj(act(fc(norm2(mid)))) */
		if (c->arch == RL_ARCH_GPT2 && o->matmul_dgelu_bwd) {
			o->matmul_dgelu_bwd(o, a->dfc, G(m, y->proj_w), G(m, y->proj_b), a->dres, h, W(m, y->proj_w),
			    fc, N, H, C);
		} else {
			o->matmul_bwd(o, a->dh, GT(m, y->proj_w), GT(m, y->proj_b), a->dres, h, W(m, y->proj_w), N,
			    H, C);
			if (m->lora)
				rli_lora_bwd(m, l, RLI_LORA_DOWN, h, a->dres, a->dh, N);
			if (c->arch == RL_ARCH_GPT2)
				o->gelu_bwd(o, a->dfc, a->dh, fc, (size_t)N * H);
			else
				o->swiglu_bwd(o, a->dfc, a->dh, fc, N, H);
		}
		o->matmul_bwd(o, a->dx, GT(m, y->fc_w), GT(m, y->fc_b), a->dfc, ln2, W(m, y->fc_w), N, C, FC);
		if (m->lora)
			rli_lora_bwd(m, l, RLI_LORA_FC, ln2, a->dfc, a->dx, N);
		norm_bwd_add(m, a->dres, a->dx2, a->dx, mid, a->ln2_mean + k * sN, a->ln2_rstd + k * sN, y->ln2_w,
		    y->ln2_b, N);
		/* mid = res + o(attn(rope(qknorm(qkv(norm1(res)))))) */
		o->matmul_bwd(o, a->datt, GT(m, y->o_w), GT(m, y->o_b), a->dres, att, W(m, y->o_w), N, AD, C);
		if (m->lora)
			rli_lora_bwd(m, l, RLI_LORA_O, att, a->dres, a->datt, N);
		rli_model_attn_bwd(m, l, a->dqkv, a->datt, att, lse, qkv, dseg, B, T);
		if (c->arch == RL_ARCH_LLAMA)
			o->rope_bwd(o, a->dqkv, a->pos, N, NH, NKV, HD, cfg_rope(c));
		dq = a->dqkv;
		if (c->qk_norm) {
			o->qknorm_bwd(o, a->dqkv2, G(m, y->qn_w), G(m, y->kn_w), a->dqkv,
			    at(a->qkv_raw, k * sN * QKV, s), W(m, y->qn_w), W(m, y->kn_w),
			    a->qk_rstd + k * sN * (NH + NKV), N, NH, NKV, HD);
			dq = a->dqkv2;
		}
		o->matmul_bwd(o, a->dx, GT(m, y->qkv_w), GT(m, y->qkv_b), dq, ln1, W(m, y->qkv_w), N, C, QKV);
		if (m->lora)
			rli_lora_bwd(m, l, RLI_LORA_QKV, ln1, dq, a->dx, N);
		norm_bwd_add(m, a->dres, a->dx2, a->dx, res, a->ln1_mean + k * sN, a->ln1_rstd + k * sN, y->ln1_w,
		    y->ln1_b, N);
		if ((rv = grads_final(m, y->ln1_w)) != 0)
			return rv;
	}
	if (c->gemma)
		rli_gemma_embed_scale(m, a->dres, N);
	if (!frozen(m, m->wte))
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
	int ns = 0;

	if (seg == NULL)
		return RL_ENOMEM;
	for (int k = 0; k < RL_ADAMW_NCLS; k++) {
		lr[k] = p->lr;
		wd[k] = 0.0f;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		int k = ((t->flags & RL_T_DECAY) ? 1 : 0) | ((t->flags & RL_T_AUX) ? 2 : 0);
		if (frozen(m, i))
			continue;
		seg[ns].off = t->off - m->goff;
		seg[ns].n = t->n;
		seg[ns++].cls = k;
		lr[k] = rl_adamw_lr(p, t);
		wd[k] = (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f;
	}
	o->adamw_multi(o, m->params + m->goff, m->w != m->params ? (char *)m->w + m->goff * asz(m) : NULL, m->grads,
	    m->m, m->v, seg, ns, lr,
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
	/* padding between tensors is zero in grads, so one sum covers them all; with
	 * adapters, the trained tensors' (a frozen norm's gradient is computed, unused) */
	if (m->lora == NULL) {
		norm = sqrt(o->sumsq(o, m->grads, m->tt.total));
	} else {
		norm = 0;
		for (int i = 0; i < m->tt.n; i++)
			if (!frozen(m, i))
				norm += o->sumsq(o, G(m, i), m->tt.t[i].n);
		norm = sqrt(norm);
	}
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
		if (frozen(m, i))
			continue;
		o->adamw(o, m->params + t->off, m->w != m->params ? W(m, i) : NULL, G(m, i),
		    m->m + (t->off - m->goff), m->v + (t->off - m->goff), t->n, rl_adamw_lr(p, t), p->beta1, p->beta2, p->eps,
		    (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f, m->step, scale);
	}
	rl_model_zero_grad(m);
	return check_ops(m, "optimizer step");
}

/*
 * model_infer.c — the inference passes over the paged KV cache: inference buffers
 * (rl_model_infer_reserve), prefill, decode to logits, the decode step with
 * sampling on the backend (one upload, one recorded graph or one fused step,
 * one download) and several decode steps queued at once (rl_model_decode_multi).
 *
 * Leaves out: scheduling and the sampling policy (the generation engine's), the
 * block allocator (kvcache.c), training (model_train.c).
 */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"

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
	rli_model_free_inf(m);
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
		rli_model_free_inf(m);
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

	if (c->gemma) {
		rli_gemma_infer_blocks(m, kv, N, decode, B, pos, slot, bt, ctx, btcols);
		return;
	}
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
					rli_model_norm_fwd(m, f->xn, f->mean, f->rstd, f->x, y->ln1_w, y->ln1_b, N);
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
			rli_model_attn_decode(m, l, f->att, qkv, kv->kc[l], kv->vc[l], bt, ctx, B, kv->BS, btcols);
		else
			rli_model_attn_fwd(m, l, f->att, f->lse, qkv, f->seg, B, N / B);
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
		rli_model_add_norm_fwd(m, f->x, f->xn, f->mean, f->rstd, f->t, y->ln2_w, y->ln2_b, N);
		rli_model_mlp_up_fwd(m, f->h, f->fc, f->xn, y, N);
		o->matmul_fwd(o, f->t, f->h, W(m, y->proj_w), W(m, y->proj_b), N, H, C);
		if (l + 1 < c->n_layer)
			rli_model_add_norm_fwd(m, f->x, f->xn, f->mean, f->rstd, f->t, m->layer[l + 1].ln1_w,
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
	rli_model_norm_fwd(m, f->lastn, f->mean, f->rstd, x, m->lnf_w, m->lnf_b, B);
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
	if ((rv = rli_model_check_inputs(m, f->htok, NULL, f->hpos, n, "model prefill")) != 0)
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

/* Block tables as wide as this cache's, one row per decode row (maxB): allocated
 * when a new cache shape is seen. */
static int
bt_tables(rl_model *m, const rl_kvcache *kv)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	int rv;

	if (f->btcols == kv->maxblk)
		return RL_OK;
	o->free(o, f->bt);
	free(f->hbt);
	f->bt = NULL;
	f->hbt = NULL;
	f->btcols = 0;
	if ((rv = o->alloc(o, (void **)&f->bt, (size_t)f->maxB * kv->maxblk * 4)) != 0)
		return rv;
	f->hbt = rl_xcalloc((size_t)f->maxB * kv->maxblk, sizeof *f->hbt);
	f->btcols = kv->maxblk;
	return RL_OK;
}

/* One forward of the R rows staged in f's host buffers (tok, pos, ctx, slot,
 * block tables): the decode kernels with one row per token.  Every layer writes
 * all rows' K/V before its attention reads the cache, so a row sees the rows of
 * its sequence before it. */
static int
extend_run(rl_model *m, rl_kvcache *kv, int R)
{
	rl_ops *o = m->ops;
	rl_model_inf *f = m->inf;
	int rv;

	if ((rv = rli_model_check_inputs(m, f->htok, NULL, f->hpos, R, "model extend")) != 0)
		return rv;
	o->upload(o, f->tok, f->htok, (size_t)R * 4);
	o->upload(o, f->pos, f->hpos, (size_t)R * 4);
	o->upload(o, f->ctx, f->hseg, (size_t)R * 4);
	o->upload(o, f->slot, f->hslot, (size_t)R * 4);
	o->upload(o, f->bt, f->hbt, (size_t)R * f->btcols * 4);
	o->embed_fwd(o, f->x, f->tok, f->pos, W(m, m->wte), W(m, m->wpe), R, m->cfg.hidden_size);
	infer_blocks(m, kv, R, 1, R);
	return check_ops(m, "model extend");
}

int
rl_model_extend(rl_model *m, rl_kvcache *kv, rl_kvseq *const *seqs, const int32_t *const *tokens,
    const int *ntok, int nseq)
{
	rl_model_inf *f = m->inf;
	int rv, R = 0, total = 0;

	if (f == NULL || nseq < 0) {
		rl_error("model extend: no inference buffers");
		return RL_EINVAL;
	}
	for (int i = 0; i < nseq; i++) {
		if (ntok[i] < 0 || seqs[i]->len + ntok[i] > m->cfg.max_pos) {
			rl_error("model extend: sequence %d: %d tokens after %d pass the model's %d positions", i,
			    ntok[i], seqs[i]->len, m->cfg.max_pos);
			return RL_ETOOBIG;
		}
		total += ntok[i];
	}
	if (total == 0)
		return RL_OK;
	if ((rv = bt_tables(m, kv)) != 0)
		return rv;
	for (int i = 0; i < nseq; i++)
		if ((rv = rl_kvcache_reserve(kv, seqs[i], ntok[i])) != 0)
			return rv;
	/* rows in chunks of maxB (the block tables' rows); a sequence may span two chunks: its
	 * earlier tokens are in the cache by then */
	for (int i = 0; i < nseq; i++) {
		for (int j = 0; j < ntok[i]; j++) {
			int p = seqs[i]->len + j;
			f->htok[R] = tokens[i][j];
			f->hpos[R] = p;
			f->hseg[R] = p + 1;
			f->hslot[R] = rl_kvcache_slot(kv, seqs[i], p);
			memcpy(f->hbt + (size_t)R * f->btcols, seqs[i]->blocks, (size_t)seqs[i]->nblk * 4);
			if (++R == f->maxB && (rv = extend_run(m, kv, R)) != 0)
				return rv;
			R %= f->maxB;
		}
	}
	if (R > 0 && (rv = extend_run(m, kv, R)) != 0)
		return rv;
	for (int i = 0; i < nseq; i++)
		seqs[i]->len += ntok[i];
	return RL_OK;
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
	if ((rv = bt_tables(m, kv)) != 0)
		return rv;
	for (int b = 0; b < B; b++) {
		f->htok[b] = tok[b];
		f->hpos[b] = seqs[b]->len;
	}
	if ((rv = rli_model_check_inputs(m, f->htok, NULL, f->hpos, B, "model decode")) != 0)
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
	if ((rv = rli_model_check_inputs(m, htok, NULL, hpos, B, "model decode")) != 0)
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

/*
 * test_model.c — the C model against the golden fixtures of
 * tests/fixtures/make_fixtures.py (float64 PyTorch re-implementations of HF
 * Qwen2, Qwen2 tied + bf16 checkpoint, Qwen3 with q/k-norm, GPT-2 with Conv1D
 * names without the "transformer." prefix, Llama with q/k/v/o biases, one
 * key/value head, an f16 checkpoint in two shards and the RoPE base in
 * rope_parameters, Llama 3.1's scaled RoPE (rope_scaling "llama3": head_dim 16
 * with frequencies kept, blended and divided, positions past its original
 * context of 4), tied and bf16):
 *   - training forward on a packed + padded batch: per-token log-probs and
 *     entropy at temperature 0.8, and the loss built from them;
 *   - backward: every parameter's gradient;
 *   - three AdamW steps with global-norm clipping: grad norms and parameters;
 *   - prefill + decode over the paged KV cache (block size 4, prompts that end
 *     mid-block, a forked sequence that triggers copy-on-write): logits equal
 *     the reference and log-probs equal the training forward's.
 *
 * Tolerances (atol + rtol*|ref|, plus a normalised MSE bound): the reference
 * is float64, so the difference is the C model's fp32 rounding only.  Its
 * size: each value passes through ~30 dependent fp32 ops (2 layers of norm,
 * GEMMs of length <= 48, softmax) with relative error ~1e-7 each, values
 * O(1..10): about 1e-6 absolute; measured max 4e-6 (logits), so 1e-4 is a
 * margin of ~25x that still catches any real mistake (a wrong sign, a missing
 * bias, a swapped head moves values by 1e-2 or more).  Gradients are smaller
 * (O(1e-3..1)) and sums of more terms: measured max 1e-6; atol 2e-5, rtol
 * 2e-3, NMSE 1e-8.
 * AdamW normalises each gradient element (update ~ lr * m/sqrt(v), about
 * +-lr whatever |g|): elements whose step-1 gradient is at noise level are
 * left out (see below); for the rest the parameters after three steps
 * (movement up to 3 lr = 3e-2) measured max error 1.5e-5 and NMSE 1.2e-9
 * (Qwen2's k_proj.bias, whose gradient is a near-cancelling sum); atol 1e-4,
 * NMSE 1e-8.  A wrong update is larger: decay on a tensor that has none moves
 * it by lr * wd * |p| ~ 2e-4 per step; a missed clip scales every update.
 * Decoder vs training log-probs: same fp32 math in a different order,
 * measured 1.2e-6, bound 2e-5.
 * Each fixture runs with the logits in chunks of 5 rows (forward and backward
 * cross chunk boundaries); Qwen2 and GPT-2 also with one chunk (backward reuses
 * the forward's logits).
 */
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "model/lora.h"
#include "compute/ops.h"
#include "model/safetensors.h"
#include "t.h"

#define TEMP 0.8f
#define ENT_COEF 0.05f

static rl_st_file *ex;

/* stmt with stderr sent to /dev/null (an expected error message) */
#define CAPTURE_QUIET(stmt)                                                      \
	do {                                                                     \
		fflush(stderr);                                                  \
		int s_ = dup(2), n_ = open("/dev/null", O_WRONLY);               \
		dup2(n_, 2);                                                     \
		stmt;                                                            \
		fflush(stderr);                                                  \
		dup2(s_, 2);                                                     \
		close(s_);                                                       \
		close(n_);                                                       \
	} while (0)

static float *
get_f32(const char *name, size_t *n)
{
	const rl_st_tensor *t = rl_st_find(ex, name);
	float *p;

	if (t == NULL) {
		fprintf(stderr, "expected.safetensors has no '%s'\n", name);
		exit(1);
	}
	p = rl_xmalloc(t->nelem * sizeof(float) + 1);
	if (t->dtype == RL_I32)
		memcpy(p, t->data, t->nbytes);
	else if (rl_st_to_f32(p, t, 0, t->nelem) != 0)
		exit(1);
	if (n)
		*n = t->nelem;
	return p;
}

/* atol + rtol|ref| per element and NMSE = sum (a-r)^2 / sum r^2 <= nmse. */
static void
cmp(const char *what, const float *got, const float *ref, size_t n, double atol, double rtol,
    double nmse)
{
	double maxe = 0, se = 0, sr = 0;
	size_t bad = 0, worst = 0;

	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - ref[i]);
		if (!(e <= atol + rtol * fabs(ref[i])))
			bad++;
		if (e > maxe || isnan(e)) {
			maxe = e;
			worst = i;
		}
		se += e * e;
		sr += (double)ref[i] * ref[i];
	}
	T_OK(bad == 0, "%s: %zu of %zu elements off; worst [%zu] %.9g vs %.9g", what, bad, n, worst,
	    got[worst], ref[worst]);
	T_OK(sr == 0 ? se == 0 : se / sr <= nmse, "%s: nmse %.3g > %.3g", what, sr ? se / sr : se, nmse);
	if (getenv("RL_TEST_VERBOSE"))
		printf("  %-50s max err %.3g nmse %.3g\n", what, maxe, sr ? se / sr : se);
}

/* chunk_rows: rows of logits per lm_head chunk; 0 = the default (one chunk
 * here, whose logits backward reuses instead of recomputing). */
static void
test_fixture(rl_ops *o, const char *name, int chunk_rows, int recompute)
{
	char dir[256], path[300];
	rl_model *m = NULL;
	rl_kvcache *kv = NULL;
	size_t n;
	int rv;

	snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
	snprintf(path, sizeof path, "%s/expected.safetensors", dir);
	T_EQ_INT(rl_st_open(&ex, path), 0);
	if (ex == NULL)
		return;
	T_EQ_INT(rv = rl_model_open(&m, dir, o), 0);
	if (rv != 0)
		goto out;
	const int32_t *tok = (int32_t *)get_f32("tok", &n), *tgt = (int32_t *)get_f32("tgt", NULL);
	const int32_t *seg = (int32_t *)get_f32("seg", NULL), *pos = (int32_t *)get_f32("pos", NULL);
	const int B = 2, T = (int)n / 2, N = B * T, V = m->cfg.vocab_size;
	float *rlp = get_f32("lp", NULL), *rent = get_f32("ent", NULL), *rloss = get_f32("loss", NULL);
	float *rlogits = get_f32("logits", NULL), *rnorm = get_f32("grad_norm", NULL);
	float lp[64], ent[64], dlp[64], dent[64], loss = 0, norm;
	int nvalid = 0;
	char what[200];

	/* ---- forward ---- */
	/* e.g. chunks of 5 rows (18 = 5 + 5 + 5 + 3): forward and backward cross
	 * chunk boundaries and recompute the logits */
	m->logit_chunk_bytes = (size_t)chunk_rows * V * sizeof(float);
	m->recompute = recompute;
	T_EQ_INT(rl_model_train_reserve(m, N), 0);
	T_EQ_INT(rl_model_forward(m, lp, ent, tok, tgt, seg, pos, B, T, TEMP), 0);
	snprintf(what, sizeof what, "%s lp", name);
	cmp(what, lp, rlp, (size_t)N, 1e-4, 1e-4, 1e-10);
	snprintf(what, sizeof what, "%s entropy", name);
	cmp(what, ent, rent, (size_t)N, 1e-4, 1e-4, 1e-10);
	for (int i = 0; i < N; i++)
		nvalid += tgt[i] >= 0;
	for (int i = 0; i < N; i++) {
		loss += -lp[i] / nvalid - ENT_COEF * ent[i] / nvalid;
		dlp[i] = tgt[i] >= 0 ? -1.0f / nvalid : 0;
		dent[i] = tgt[i] >= 0 ? -ENT_COEF / nvalid : 0;
	}
	T_CLOSE(loss, rloss[0], 1e-5, 1e-5);
	{
		/* a forward-only model (reference policy): the same log-probs, bit for bit */
		rl_model *r = NULL;
		float lp2[64], ent2[64];
		T_EQ_INT(rl_model_open(&r, dir, o), 0);
		T_EQ_INT(rl_model_eval_reserve(r, N), 0);
		T_EQ_INT(rl_model_forward(r, lp2, ent2, tok, tgt, seg, pos, B, T, TEMP), 0);
		/* the same math, logits in one chunk instead of four: rounding-level */
		for (int i = 0; i < N; i++)
			T_OK(fabsf(lp[i] - lp2[i]) <= 1e-6f && fabsf(ent[i] - ent2[i]) <= 1e-6f,
			    "eval model differs at %d: %g vs %g", i, lp2[i], lp[i]);
		T_OK(r->grads == NULL, "eval reserve allocated gradients");
		CAPTURE_QUIET(T_EQ_INT(rl_model_backward(r, dlp, dent), RL_EINVAL));
		rl_model_close(r);
	}

	/* ---- decode vs training forward (before the weights move) ---- */
	{
		/* the three sequences of the batch: (row, first column, length, prompt length) */
		/* prompts of 2, 2, 3 tokens: prefill lays them out in rows of 3 with padding */
		const int sq[3][4] = { { 0, 0, 4, 2 }, { 0, 4, 5, 2 }, { 1, 0, 7, 3 } };
		rl_kvseq s[4], *sp[4] = { &s[0], &s[1], &s[2], &s[3] };
		const int32_t *pr[3];
		int np[3];
		float lg[4 * 96], maxd = 0, maxl = 0;

		T_EQ_INT(rl_model_infer_reserve(m, 16, 4), 0);
		T_EQ_INT(rl_kvcache_open(&kv, o, &m->cfg, 64 * 1024, 4), 0);
		for (int i = 0; i < 4; i++)
			rl_kvseq_init(&s[i], kv);
		for (int i = 0; i < 3; i++) {
			pr[i] = tok + sq[i][0] * T + sq[i][1];
			np[i] = sq[i][3];
		}
		T_EQ_INT(rl_model_prefill(m, kv, sp, pr, np, 3, lg), 0);
		for (int i = 0; i < 3; i++) {
			int col = sq[i][0] * T + sq[i][1] + np[i] - 1;
			for (int v = 0; v < V; v++)
				maxd = fmaxf(maxd, fabsf(lg[i * V + v] - rlogits[(size_t)col * V + v]));
		}
		/* a fourth sequence shares the third's prompt; its last block (3 of 4 slots) is shared */
		rl_kvcache_fork(kv, &s[3], &s[2]);
		T_EQ_INT(kv->ref[s[2].blocks[0]], 2);
		for (int step = 0;; step++) {
			rl_kvseq *act[4];
			int32_t tk[4];
			int idx[4], nb = 0;
			for (int i = 0; i < 4; i++) {
				int q = i < 3 ? i : 2;
				if (s[i].len < sq[q][2]) {
					act[nb] = &s[i];
					tk[nb] = tok[sq[q][0] * T + sq[q][1] + s[i].len];
					idx[nb++] = i;
				}
			}
			if (nb == 0)
				break;
			T_EQ_INT(rl_model_decode(m, kv, act, tk, nb, lg), 0);
			for (int j = 0; j < nb; j++) {
				int q = idx[j] < 3 ? idx[j] : 2;
				int col = sq[q][0] * T + sq[q][1] + s[idx[j]].len - 1;
				const float *z = lg + j * V;
				double mx = -1e30, se = 0;
				for (int v = 0; v < V; v++) {
					maxd = fmaxf(maxd, fabsf(z[v] - rlogits[(size_t)col * V + v]));
					mx = fmax(mx, z[v] * (1.0 / TEMP));
				}
				for (int v = 0; v < V; v++)
					se += exp(z[v] / TEMP - mx);
				if (tgt[col] >= 0) {
					double l = z[tgt[col]] / TEMP - mx - log(se);
					maxl = fmaxf(maxl, (float)fabs(l - lp[col]));
				}
			}
		}
		/* copy-on-write gave the fork its own last block; the shared full... none here */
		T_OK(s[2].blocks[0] != s[3].blocks[0], "fork still shares its partly filled block");
		T_OK(maxd <= 1e-4, "%s: decode logits differ from the reference by %g", name, maxd);
		T_OK(maxl <= 2e-5, "%s: decode log-probs differ from the training forward by %g", name, maxl);
		if (getenv("RL_TEST_VERBOSE"))
			printf("  %s decode: logits max err %.3g, lp vs train %.3g\n", name, maxd, maxl);
		for (int i = 0; i < 4; i++)
			rl_kvcache_release(kv, &s[i]);
		T_EQ_INT(kv->nfree, kv->nblk);
	}

	{
		/* prompts of 2, 3, 2 tokens with room for exactly 7: the padded layout
		 * (3 rows of 3) does not fit, prefill falls back to one packed row */
		rl_model *r = NULL;
		rl_kvcache *kv2 = NULL;
		rl_kvseq s[3], *sp[3] = { &s[0], &s[1], &s[2] };
		const int32_t *pr[3] = { tok, tok + 4, tok + T };
		const int np[3] = { 2, 3, 2 }, col[3] = { 1, 6, T + 1 };
		float lg[3 * 96], maxd = 0;
		T_EQ_INT(rl_model_open(&r, dir, o), 0);
		T_EQ_INT(rl_model_infer_reserve(r, 7, 3), 0);
		T_EQ_INT(rl_kvcache_open(&kv2, o, &r->cfg, 64 * 1024, 4), 0);
		for (int i = 0; i < 3; i++)
			rl_kvseq_init(&s[i], kv2);
		T_EQ_INT(rl_model_prefill(r, kv2, sp, pr, np, 3, lg), 0);
		for (int i = 0; i < 3; i++)
			for (int v = 0; v < V; v++)
				maxd = fmaxf(maxd, fabsf(lg[i * V + v] - rlogits[(size_t)col[i] * V + v]));
		T_OK(maxd <= 1e-4, "%s: packed prefill logits differ by %g", name, maxd);
		for (int i = 0; i < 3; i++)
			rl_kvcache_release(kv2, &s[i]);
		rl_kvcache_close(kv2);
		rl_model_close(r);
	}

	/* ---- backward: every gradient ---- */
	T_EQ_INT(rl_model_backward(m, dlp, dent), 0);
	float **g1c = rl_xcalloc((size_t)m->tt.n, sizeof *g1c);   /* ours, kept for the AdamW check */
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		char key[RL_TT_NAME + 8];
		float *got = g1c[i] = rl_xmalloc(t->n * sizeof(float)), *ref;
		snprintf(key, sizeof key, "grad.%s", t->name);
		ref = get_f32(key, &n);
		T_EQ_INT(n, t->n);
		T_EQ_INT(rl_model_get(m, i, RL_MODEL_GRAD, got), 0);
		snprintf(what, sizeof what, "%s grad %s", name, t->name);
		cmp(what, got, ref, t->n, 2e-5, 2e-3, 1e-8);
		free(ref);
	}

	/* ---- three AdamW steps (the fixture's hyper-parameters) ---- */
	rl_adamw hp = { .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		.max_grad_norm = 1.0f };
	for (int k = 0; k < 3; k++) {
		if (k > 0) {
			T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, seg, pos, B, T, TEMP), 0);
			T_EQ_INT(rl_model_backward(m, dlp, dent), 0);
		}
		T_EQ_INT(rl_model_step(m, &hp, &norm), 0);
		T_CLOSE(norm, rnorm[k], 1e-5, 1e-4);
	}
	T_EQ_INT(m->step, 3);
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		char key[RL_TT_NAME + 8];
		float *got = rl_xmalloc(t->n * sizeof(float)), *ref;
		snprintf(key, sizeof key, "step3.%s", t->name);
		ref = get_f32(key, &n);
		T_EQ_INT(rl_model_get(m, i, RL_MODEL_PARAM, got), 0);
		/* Adam's first step moves every element by about lr * sign(g): where the
		 * step-1 gradient is at rounding-noise level (|g| < 1e-6, e.g. GPT-2's key
		 * bias, exactly 0 in exact arithmetic because softmax cancels it, or a rare
		 * token's embedding row) the sign is noise in both programs and the
		 * element may move +-lr either way.  Those are left out (their gradients
		 * were checked above); the verbose run prints how many.  Gradients that
		 * are exactly 0 in both stay in: those elements must not move (rows of
		 * unseen tokens, unused positions: no decay on embeddings). */
		snprintf(key, sizeof key, "grad.%s", t->name);
		float *g1 = get_f32(key, NULL);
		size_t noisy = 0;
		for (size_t j = 0; j < t->n; j++)
			if (fabsf(g1[j]) < 1e-6f && !(g1[j] == 0 && g1c[i][j] == 0)) {
				got[j] = ref[j];
				noisy++;
			}
		free(g1);
		free(g1c[i]);
		if (noisy && getenv("RL_TEST_VERBOSE"))
			printf("  %s step3 %s: %zu noise-level elements left out\n", name, t->name, noisy);
		snprintf(what, sizeof what, "%s step3 %s", name, t->name);
		cmp(what, got, ref, t->n, 1e-4, 1e-4, 1e-8);
		free(got);
		free(ref);
	}
	free(g1c);
	free((void *)tok);
	free((void *)tgt);
	free((void *)seg);
	free((void *)pos);
	free(rlp);
	free(rent);
	free(rloss);
	free(rlogits);
	free(rnorm);
out:
	rl_kvcache_close(kv);
	rl_model_close(m);
	rl_st_close(ex);
	ex = NULL;
}

/* Activation recomputation against keeping every layer: the same ops on the
 * same inputs, so the same log-probs and gradients bit for bit (the CPU
 * backend is deterministic), over two passes (the second pass starts with the
 * last layer's activations of the first in slot 0), with fewer bytes. */
static void
test_recompute(rl_ops *o, const char *name)
{
	char dir[256], path[300];
	rl_model *m[2] = { NULL, NULL };
	size_t n;

	snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
	snprintf(path, sizeof path, "%s/expected.safetensors", dir);
	T_EQ_INT(rl_st_open(&ex, path), 0);
	if (ex == NULL)
		return;
	const int32_t *tok = (int32_t *)get_f32("tok", &n), *tgt = (int32_t *)get_f32("tgt", NULL);
	const int32_t *seg = (int32_t *)get_f32("seg", NULL), *pos = (int32_t *)get_f32("pos", NULL);
	const int B = 2, T = (int)n / 2, N = B * T;
	float lp[2][64], dlp[64];

	for (int i = 0; i < N; i++)
		dlp[i] = tgt[i] >= 0 ? -1.0f / (1 + i % 5) : 0;
	for (int r = 0; r < 2; r++) {
		T_EQ_INT(rl_model_open(&m[r], dir, o), 0);
		if (m[r] == NULL)
			goto out;
		m[r]->recompute = r;
		T_EQ_INT(rl_model_train_reserve(m[r], N), 0);
		for (int pass = 0; pass < 2; pass++) {
			/* the second pass over other rows of the batch (row 1 only) */
			int b = pass ? 1 : B;
			T_EQ_INT(rl_model_forward(m[r], lp[r], NULL, tok + (B - b) * T, tgt + (B - b) * T,
			    seg ? seg + (B - b) * T : NULL, pos ? pos + (B - b) * T : NULL, b, T, TEMP), 0);
			T_EQ_INT(rl_model_backward(m[r], dlp, NULL), 0);
		}
	}
	T_OK(memcmp(lp[0], lp[1], sizeof(float) * (size_t)T) == 0, "%s: recompute changed the log-probs", name);
	for (int i = 0; i < m[0]->tt.n; i++) {
		const rl_tensor *t = &m[0]->tt.t[i];
		float *g0 = rl_xmalloc(t->n * sizeof(float)), *g1 = rl_xmalloc(t->n * sizeof(float));
		T_EQ_INT(rl_model_get(m[0], i, RL_MODEL_GRAD, g0), 0);
		T_EQ_INT(rl_model_get(m[1], i, RL_MODEL_GRAD, g1), 0);
		T_OK(memcmp(g0, g1, t->n * sizeof(float)) == 0, "%s: recompute changed grad %s", name, t->name);
		free(g0);
		free(g1);
	}
	/* two layers: the per-layer arrays hold one instead of two */
	T_OK(rl_model_act_bytes(m[1]) < rl_model_act_bytes(m[0]) && rl_model_act_bytes(m[1]) > 0,
	    "%s: activations %zu bytes with recompute, %zu without", name, rl_model_act_bytes(m[1]),
	    rl_model_act_bytes(m[0]));
out:
	free((void *)tok);
	free((void *)tgt);
	free((void *)seg);
	free((void *)pos);
	rl_model_close(m[0]);
	rl_model_close(m[1]);
	rl_st_close(ex);
	ex = NULL;
}

/* ---- no backend allocation inside a training step (issue 9) ---------------------- */

static rl_ops *inner;   /* the backend the counting one wraps */
static int nalloc;

static int
count_alloc(rl_ops *o, void **p, size_t bytes)
{
	(void)o;
	nalloc++;
	return inner->alloc(inner, p, bytes);
}

/* After the reserve, forward + backward + AdamW step allocate nothing on the
 * backend (a GPU allocation would synchronise the device and fragment its
 * memory), with and without recomputation. */
static void
test_no_alloc(rl_ops *o, const char *name, int recompute)
{
	char dir[256], path[300];
	rl_ops counting = *o;   /* the same table and state; alloc counted */
	rl_model *m = NULL;
	size_t n;
	float norm;

	inner = o;
	counting.alloc = count_alloc;
	snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
	snprintf(path, sizeof path, "%s/expected.safetensors", dir);
	T_EQ_INT(rl_st_open(&ex, path), 0);
	if (ex == NULL)
		return;
	int32_t *tok = (int32_t *)get_f32("tok", &n), *tgt = (int32_t *)get_f32("tgt", NULL);
	const int B = 2, T = (int)n / 2, N = B * T;
	float dlp[64];
	rl_adamw hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		.max_grad_norm = 1.0f };

	for (int i = 0; i < N; i++)
		dlp[i] = tgt[i] >= 0 ? -1.0f / N : 0;
	T_EQ_INT(rl_model_open(&m, dir, &counting), 0);
	if (m == NULL)
		goto out;
	m->recompute = recompute;
	T_EQ_INT(rl_model_train_reserve(m, N), 0);
	T_OK(nalloc > 0, "%s: the counting backend saw no allocation at all", name);
	nalloc = 0;
	for (int k = 0; k < 3; k++) {
		/* full batch, then one row: a smaller step reuses the reserve too */
		int b = k == 1 ? 1 : B;
		T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, b, T, TEMP), 0);
		T_EQ_INT(rl_model_backward(m, dlp, NULL), 0);
		T_EQ_INT(rl_model_step(m, &hp, &norm), 0);
	}
	T_OK(nalloc == 0, "%s%s: %d backend allocations in 3 training steps after the reserve", name,
	    recompute ? " (recompute)" : "", nalloc);
out:
	free(tok);
	free(tgt);
	rl_model_close(m);
	rl_st_close(ex);
	ex = NULL;
}

static int
fail_alloc(rl_ops *o, void **p, size_t bytes)
{
	(void)o;
	(void)bytes;
	*p = NULL;
	return RL_ENOMEM;
}

/* A backend that cannot allocate the parameters: RL_ENOMEM, the message naming the
 * weights file and the largest tensor. */
static void
test_open_nomem(rl_ops *o)
{
	rl_ops failing = *o;
	rl_model *m = NULL;
	char msg[1024];
	int rv;

	failing.alloc = fail_alloc;
	rl_log_init("test_model", RL_LOG_NORMAL);
	T_CAPTURE(rl_model_open(&m, "tests/fixtures/mistral", &failing), &rv, msg);
	T_EQ_INT(rv, RL_ENOMEM);
	T_OK(m == NULL, "no model");
	T_OK(strstr(msg, "'tests/fixtures/mistral/model.safetensors': cannot allocate 86656 bytes for the "
	    "21664 parameters of its 21 tensors (the largest 'model.embed_tokens.weight', 3072 elements)") != NULL,
	    "message: %s", msg);
}

/* A backend other than the CPU (the CPU table under another name: no rl_cpu_*_ex ops may
 * be called): Gemma 3 refused, naming what its kernels lack; Mistral's context capped at
 * its window, within which the table's plain causal attention is the windowed one. */
static void
test_other_backend(rl_ops *o)
{
	rl_ops other = *o;
	rl_model *m = NULL;
	char msg[1024];
	int rv;

	other.name = "other";
	rl_log_init("test_model", RL_LOG_NORMAL);
	T_CAPTURE(rl_model_open(&m, "tests/fixtures/gemma3", &other), &rv, msg);
	T_EQ_INT(rv, RL_ENOTSUP);
	T_OK(m == NULL, "no model");
	T_OK(strstr(msg, "Gemma 3 is not supported on the 'other' backend: its kernels lack the (1 + w) RMSNorm, "
	    "the GELU-gated MLP, the query_pre_attn_scalar scale and sliding-window attention") != NULL &&
	    strstr(msg, "--device cpu") != NULL, "message: %s", msg);
	/* LoRA has no adapters for Gemma's layer */
	T_EQ_INT(rl_model_open(&m, "tests/fixtures/gemma3", o), 0);
	if (m != NULL) {
		rl_lora_opts lo = { .r = 2, .alpha = 4 };
		T_CAPTURE(rl_model_add_lora(m, &lo), &rv, msg);
		T_EQ_INT(rv, RL_ENOTSUP);
		T_OK(strstr(msg, "LoRA: Gemma 3's layer") != NULL, "message: %s", msg);
		rl_model_close(m);
		m = NULL;
	}
	T_CAPTURE(rl_model_open(&m, "tests/fixtures/mistral_win", &other), &rv, msg);
	T_EQ_INT(rv, 0);
	T_OK(strstr(msg, "no sliding-window attention: the context is capped at sliding_window (3 positions, "
	    "not 64)") != NULL, "message: %s", msg);
	if (m != NULL)
		T_EQ_INT(m->cfg.max_pos, 3);
	rl_model_close(m);
	rl_log_init("test_model", RL_LOG_QUIET);
}

int
main(void)
{
	rl_ops *o = NULL;

	T_BEGIN("test_model");
	if (access("tests/fixtures/qwen2/config.json", R_OK) != 0)
		T_SKIP("run from the repository root (tests/fixtures missing)");
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	test_fixture(o, "qwen2", 5, 0);
	test_fixture(o, "qwen2", 0, 0);
	test_fixture(o, "qwen2_tied", 5, 0);
	test_fixture(o, "qwen3", 5, 0);
	test_fixture(o, "gpt2", 5, 0);
	test_fixture(o, "gpt2", 0, 0);
	test_fixture(o, "llama", 5, 0);
	test_fixture(o, "llama3", 5, 0);
	test_fixture(o, "mistral", 5, 0);
	test_fixture(o, "mistral_win", 5, 0);
	test_fixture(o, "gemma3", 5, 0);
	/* activation recomputation: the same checks against the fixtures */
	test_fixture(o, "qwen2", 5, 1);
	test_fixture(o, "llama3", 0, 1);
	test_fixture(o, "qwen3", 0, 1);
	test_fixture(o, "gpt2", 5, 1);
	test_fixture(o, "gemma3", 0, 1);
	test_recompute(o, "qwen3");
	test_recompute(o, "gpt2");
	test_no_alloc(o, "qwen3", 0);
	test_no_alloc(o, "gpt2", 1);
	test_open_nomem(o);
	test_other_backend(o);
	rl_ops_close(o);
	T_END();
}

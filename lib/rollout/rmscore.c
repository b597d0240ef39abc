/*
 * rmscore.c — rl-reward --model: records scored by a reward model's forward
 * (rmscore.h).  Records are sorted by length and cut into batches of rows of
 * at most max_tokens padded tokens, so padding stays small; right padding
 * does not change a causal model's earlier positions.  Normalisation
 * (--rm-norm) standardises the raw scores: over the call's records, or over
 * a running mean and variance of every score so far (Welford).
 *
 * Leaves out: packing rows, re-tokenizing text with the model's tokenizer.
 */
#include "rollout/rmscore.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "compute/ops.h"
#include "model/model.h"

struct rl_rmscore {
	rl_ops *ops;
	rl_model *m;
	int norm, max_tokens;
	int32_t *tok, *tgt;     /* (max_tokens) host rows */
	float *val;             /* (max_tokens) host scores of every position */
	double run_n, run_mean, run_m2;   /* RL_RM_NORM_RUNNING: Welford's sums */
	size_t records, tokens;
	double seconds;
	char (*why)[96];        /* per record of the last call: why it has no score */
	size_t nwhy;
};

int
rl_rmscore_open(rl_rmscore **out, const rl_rmscore_opts *o)
{
	rl_rmscore *r = rl_xcalloc(1, sizeof *r);
	int rv;

	*out = NULL;
	r->norm = o->norm;
	r->max_tokens = o->max_tokens > 0 ? o->max_tokens : 8192;
	if ((rv = rl_ops_open(&r->ops, o->device ? o->device : "cpu")) != 0 ||
	    (rv = rl_model_open(&r->m, o->model_dir, r->ops)) != 0)
		goto fail;
	if (!r->m->cfg.seq_cls) {
		rl_error("'%s' is a causal language model, not a reward model: its config.json names no "
		    "...ForSequenceClassification", o->model_dir);
		rl_hint("train one on preference pairs: rl-train --algo rm -m '%s' --out RM PAIRS.jsonl", o->model_dir);
		rv = RL_EINVAL;
		goto fail;
	}
	r->max_tokens = RL_MAX(r->max_tokens, r->m->cfg.max_pos);
	r->tok = rl_try_malloc((size_t)r->max_tokens * sizeof *r->tok, "reward model rows");
	r->tgt = rl_try_malloc((size_t)r->max_tokens * sizeof *r->tgt, "reward model rows");
	r->val = rl_try_malloc((size_t)r->max_tokens * sizeof *r->val, "reward model scores");
	if (r->tok == NULL || r->tgt == NULL || r->val == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < r->max_tokens; i++)
		r->tgt[i] = -1;
	if ((rv = rl_model_eval_reserve(r->m, r->max_tokens)) != 0)
		goto fail;
	rl_verbose("reward model '%s': %s, %zu parameters, rows of up to %d tokens", o->model_dir,
	    r->m->cfg.model_type, rl_model_nparams(r->m), r->max_tokens);
	*out = r;
	return RL_OK;
fail:
	rl_rmscore_close(r);
	return rv;
}

void
rl_rmscore_close(rl_rmscore *r)
{
	if (r == NULL)
		return;
	rl_model_close(r->m);
	rl_ops_close(r->ops);
	free(r->tok);
	free(r->tgt);
	free(r->val);
	free(r->why);
	free(r);
}

void
rl_rmscore_stats(const rl_rmscore *r, size_t *records, size_t *tokens, double *seconds)
{
	*records = r->records;
	*tokens = r->tokens;
	*seconds = r->seconds;
}

typedef struct item {
	size_t i;               /* the record's index in the call */
	const int32_t *p, *s;   /* prompt and response ids */
	int np, ns;
} item;

static int
by_len(const void *a, const void *b)
{
	const item *x = a, *y = b;
	int lx = x->np + x->ns, ly = y->np + y->ns;
	return lx != ly ? (lx < ly ? -1 : 1) : (x->i < y->i ? -1 : x->i > y->i);
}

/* The record's ids, or why it cannot be scored (into r->why[k]). */
static const char *
take(rl_rmscore *r, item *it, rl_traj *t, size_t k)
{
	const rl_config *c = &r->m->cfg;
	size_t np = 0, ns = 0;

	if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &it->p, &np) != 0)
		np = 0;
	if (rl_traj_get_i32s(t, RL_TAG_RESPONSE, &it->s, &ns) != 0)
		ns = 0;
	if (np + ns == 0)
		return "record has no prompt or response token ids";
	if (np + ns > (size_t)c->max_pos) {
		snprintf(r->why[k], sizeof r->why[k], "%zu tokens, longer than the reward model's context (%d)",
		    np + ns, c->max_pos);
		return r->why[k];
	}
	for (size_t j = 0; j < np + ns; j++) {
		int32_t id = j < np ? it->p[j] : it->s[j - np];
		if (id < 0 || id >= c->vocab_size) {
			snprintf(r->why[k], sizeof r->why[k], "token id %d is outside the reward model's vocabulary [0, %d)",
			    (int)id, c->vocab_size);
			return r->why[k];
		}
	}
	it->np = (int)np;
	it->ns = (int)ns;
	return NULL;
}

/* One forward over items[0..B), each a row of T tokens (right padded). */
static int
forward_rows(rl_rmscore *r, double *score, const item *items, int B, int T)
{
	const rl_config *c = &r->m->cfg;
	double t0 = rl_now();
	int rv;

	for (int b = 0; b < B; b++) {
		int32_t *row = r->tok + (size_t)b * T;
		memcpy(row, items[b].p, (size_t)items[b].np * sizeof *row);
		memcpy(row + items[b].np, items[b].s, (size_t)items[b].ns * sizeof *row);
		for (int t = items[b].np + items[b].ns; t < T; t++)
			row[t] = c->pad_id >= 0 && c->pad_id < c->vocab_size ? c->pad_id : 0;
	}
	if ((rv = rl_model_forward(r->m, NULL, NULL, r->tok, r->tgt, NULL, NULL, B, T, 1.0f)) != 0)
		return rv;
	r->ops->download(r->ops, r->val, r->m->val, (size_t)B * T * sizeof(float));
	if ((rv = r->ops->status(r->ops)) != 0)
		return rv;
	for (int b = 0; b < B; b++) {
		int n = items[b].np + items[b].ns;
		int k = rl_model_score_index(c, r->tok + (size_t)b * T, n);
		score[items[b].i] = r->val[(size_t)b * T + k];
		r->tokens += (size_t)n;
	}
	r->records += (size_t)B;
	r->seconds += rl_now() - t0;
	return RL_OK;
}

static void
normalise(rl_rmscore *r, double *score, const char **why, size_t n)
{
	double mean = 0, m2 = 0, cnt = 0, sd;

	if (r->norm == RL_RM_NORM_NONE)
		return;
	for (size_t i = 0; i < n; i++) {
		if (why[i] != NULL)
			continue;
		/* Welford, over the call (batch) or continuing the running sums */
		double *pn = r->norm == RL_RM_NORM_RUNNING ? &r->run_n : &cnt;
		double *pm = r->norm == RL_RM_NORM_RUNNING ? &r->run_mean : &mean;
		double *p2 = r->norm == RL_RM_NORM_RUNNING ? &r->run_m2 : &m2;
		double d = score[i] - *pm;
		*pn += 1;
		*pm += d / *pn;
		*p2 += d * (score[i] - *pm);
	}
	if (r->norm == RL_RM_NORM_RUNNING) {
		cnt = r->run_n;
		mean = r->run_mean;
		m2 = r->run_m2;
	}
	if (cnt == 0)
		return;
	/* the population standard deviation, as torch's std(unbiased=False); one
	 * score alone (or all equal) is only centred */
	sd = sqrt(m2 / cnt);
	for (size_t i = 0; i < n; i++)
		if (why[i] == NULL)
			score[i] = sd > 1e-8 ? (score[i] - mean) / sd : score[i] - mean;
}

int
rl_rmscore_fn(void *ctx, double *score, const char **why, rl_traj *const *recs, size_t n)
{
	rl_rmscore *r = ctx;
	item *items = NULL;
	size_t ni = 0;
	int rv = RL_OK;

	if (n > r->nwhy) {
		free(r->why);
		r->nwhy = 0;
		if ((r->why = rl_try_calloc(n, sizeof *r->why, "reward model reasons")) == NULL)
			return RL_ENOMEM;
		r->nwhy = n;
	}
	if ((items = rl_try_calloc(n ? n : 1, sizeof *items, "reward model batch")) == NULL)
		return RL_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		score[i] = 0;
		items[ni].i = i;
		if ((why[i] = take(r, &items[ni], recs[i], i)) == NULL)
			ni++;
	}
	qsort(items, ni, sizeof *items, by_len);
	for (size_t a = 0; a < ni;) {
		/* rows while (rows + 1) x the longest (the last, sorted) fit */
		size_t b = a + 1;
		while (b < ni && (b + 1 - a) * (size_t)(items[b].np + items[b].ns) <= (size_t)r->max_tokens)
			b++;
		if ((rv = forward_rows(r, score, items + a, (int)(b - a), items[b - 1].np + items[b - 1].ns)) != 0)
			goto out;
		a = b;
	}
	normalise(r, score, why, n);
out:
	free(items);
	return rv;
}

/*
 * algo.c — advantage estimators and loss-aggregation weights (see algo.h for
 * the formulas).  Sums are accumulated in double: batches are small, and the
 * advantages feed every gradient of the step.
 */
#include "train/algo.h"

#include <math.h>
#include <string.h>

#include "base/core.h"

static const char *const algo_names[RL_ALGO_COUNT] = {
	[RL_ALGO_GRPO] = "grpo", [RL_ALGO_DRGRPO] = "dr-grpo", [RL_ALGO_DAPO] = "dapo",
	[RL_ALGO_RLOO] = "rloo", [RL_ALGO_REINFORCEPP] = "reinforce++", [RL_ALGO_REMAX] = "remax",
	[RL_ALGO_PPO] = "ppo", [RL_ALGO_SFT] = "sft", [RL_ALGO_GSPO] = "gspo", [RL_ALGO_DPO] = "dpo",
	[RL_ALGO_RM] = "rm",
};

static const char *const agg_names[RL_AGG_COUNT] = {
	[RL_AGG_TOKEN_MEAN] = "token-mean",
	[RL_AGG_SEQ_MEAN_TOKEN_SUM] = "seq-mean-token-sum",
	[RL_AGG_SEQ_MEAN_TOKEN_MEAN] = "seq-mean-token-mean",
	[RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM] = "seq-mean-token-sum-norm",
};

const char *rl_algo_name(int a) { return a >= 0 && a < RL_ALGO_COUNT ? algo_names[a] : "?"; }
const char *rl_agg_name(int a) { return a >= 0 && a < RL_AGG_COUNT ? agg_names[a] : "?"; }

int
rl_algo_parse(const char *s)
{
	for (int i = 0; i < RL_ALGO_COUNT; i++)
		if (strcmp(s, algo_names[i]) == 0)
			return i;
	if (strcmp(s, "drgrpo") == 0)
		return RL_ALGO_DRGRPO;
	if (strcmp(s, "reinforce_plus_plus") == 0 || strcmp(s, "reinforcepp") == 0)
		return RL_ALGO_REINFORCEPP;
	return -1;
}

int
rl_agg_parse(const char *s)
{
	for (int i = 0; i < RL_AGG_COUNT; i++)
		if (strcmp(s, agg_names[i]) == 0)
			return i;
	return -1;
}

int
rl_algo_default_agg(int algo)
{
	switch (algo) {
	case RL_ALGO_DRGRPO:
		return RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
	case RL_ALGO_GSPO:
		/* the paper's and verl's gspo recipe: a mean over each sequence's tokens */
		return RL_AGG_SEQ_MEAN_TOKEN_MEAN;
	case RL_ALGO_GRPO:
		/* verl's GRPO default is token-mean as well; the original GRPO paper's
		 * seq-mean-token-mean is one option away. */
	default:
		return RL_AGG_TOKEN_MEAN;
	}
}

void
rl_adv_cfg_default(rl_adv_cfg *c, int algo)
{
	memset(c, 0, sizeof *c);
	c->algo = algo;
	c->norm_std = algo != RL_ALGO_DRGRPO;
	c->eps = 1e-6f;
	c->gamma = 1.0f;
	c->lambda = 1.0f;
}

int
rl_adv_outcome(float *adv, const float *reward, const int *goff, int G, const rl_adv_cfg *c)
{
	int norm = c->norm_std;

	switch (c->algo) {
	case RL_ALGO_GRPO:
	case RL_ALGO_DAPO:
	case RL_ALGO_GSPO:
		break;
	case RL_ALGO_DRGRPO:
		norm = 0;
		break;
	case RL_ALGO_RLOO:
		norm = 0;
		break;
	default:
		return RL_EINVAL;
	}
	if (G < 0 || goff[0] != 0)
		return RL_EINVAL;
	for (int g = 0; g < G; g++) {
		int a = goff[g], b = goff[g + 1], n = b - a;
		double sum = 0, sq = 0, mean, sd;

		if (n < 0)
			return RL_EINVAL;
		if (n == 1) {
			adv[a] = 0;
			continue;
		}
		for (int i = a; i < b; i++)
			sum += reward[i];
		mean = sum / n;
		for (int i = a; i < b; i++)
			sq += (reward[i] - mean) * (reward[i] - mean);
		sd = sqrt(sq / (n - 1));
		for (int i = a; i < b; i++) {
			double d = reward[i] - mean;
			if (c->algo == RL_ALGO_RLOO)
				/* r_i - mean of the others = n/(n-1) (r_i - mean) */
				adv[i] = (float)(d * n / (n - 1));
			else if (norm)
				adv[i] = (float)(d / (sd + c->eps));
			else
				adv[i] = (float)d;
		}
	}
	return RL_OK;
}

int
rl_adv_remax(float *adv, const float *reward, const float *baseline, int S)
{
	for (int s = 0; s < S; s++)
		adv[s] = reward[s] - baseline[s];
	return RL_OK;
}

void
rl_adv_broadcast(float *adv_tok, const float *adv_seq, const int *toff, int S)
{
	for (int s = 0; s < S; s++)
		for (int t = toff[s]; t < toff[s + 1]; t++)
			adv_tok[t] = adv_seq[s];
}

void
rl_whiten_masked(float *x, int n, const uint8_t *mask)
{
	double sum = 0, sq = 0, mean, sd;
	long k = 0;

	for (int i = 0; i < n; i++)
		if (!mask || mask[i]) {
			sum += x[i];
			k++;
		}
	if (k == 0) {
		for (int i = 0; i < n; i++)
			x[i] = 0;
		return;
	}
	mean = sum / k;
	for (int i = 0; i < n; i++)
		if (!mask || mask[i])
			sq += (x[i] - mean) * (x[i] - mean);
	sd = k > 1 ? sqrt(sq / (k - 1)) : 0;
	for (int i = 0; i < n; i++)
		x[i] = !mask || mask[i] ? (float)((x[i] - mean) / (sd + 1e-8)) : 0.0f;
}

#define SAMPLED(mask, t) ((mask) == NULL || (mask)[t] != 0)

static int
check_offsets(const int *toff, int S)
{
	if (S < 0 || toff[0] != 0)
		return RL_EINVAL;
	for (int s = 0; s < S; s++)
		if (toff[s + 1] < toff[s])
			return RL_EINVAL;
	return RL_OK;
}

int
rl_tok_rewards(float *trew, const float *reward, const float *tokrew, const float *kl,
    float kl_coef, const int *toff, int S, const uint8_t *mask)
{
	if (check_offsets(toff, S) != RL_OK)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		int a = toff[s], b = toff[s + 1], last = -1;
		double carry = 0;    /* token rewards of inserted tokens before the first sampled one */
		/* forward: each sampled token takes its own reward and those of the
		 * inserted tokens after it, up to the next sampled one */
		for (int t = a; t < b; t++) {
			double r = tokrew ? tokrew[t] : 0.0;
			if (SAMPLED(mask, t)) {
				double v = r + (kl ? -(double)kl_coef * kl[t] : 0.0);
				if (last < 0) {
					v += carry;
					carry = 0;
				}
				trew[t] = (float)v;
				last = t;
			} else {
				trew[t] = 0.0f;
				if (last >= 0)
					trew[last] = (float)((double)trew[last] + r);
				else
					carry += r;
			}
		}
		if (last >= 0)
			trew[last] = (float)((double)trew[last] + reward[s]);
	}
	return RL_OK;
}

int
rl_adv_rtg_masked(float *adv, const float *trew, const float *base, const int *toff, int S,
    float gamma, const uint8_t *mask)
{
	if (check_offsets(toff, S) != RL_OK)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		double ret = 0;
		for (int t = toff[s + 1] - 1; t >= toff[s]; t--) {
			if (!SAMPLED(mask, t)) {
				adv[t] = 0.0f;
				continue;
			}
			ret = trew[t] + gamma * ret;
			adv[t] = (float)(base ? ret - base[s] : ret);
		}
	}
	return RL_OK;
}

int
rl_adv_gae_masked(float *adv, float *ret, const float *trew, const float *values, const int *toff,
    int S, float gamma, float lambda, const uint8_t *mask)
{
	if (check_offsets(toff, S) != RL_OK)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		double a = 0, vnext = 0;
		for (int t = toff[s + 1] - 1; t >= toff[s]; t--) {
			if (!SAMPLED(mask, t)) {
				adv[t] = 0.0f;
				ret[t] = values[t];
				continue;
			}
			double delta = trew[t] + gamma * vnext - values[t];
			a = delta + gamma * lambda * a;
			adv[t] = (float)a;
			ret[t] = (float)(a + values[t]);
			vnext = values[t];
		}
	}
	return RL_OK;
}

int
rl_adv_remax_tok(float *adv_tok, const float *reward, const float *baseline, const float *kl,
    float kl_coef, const int *toff, int S)
{
	int rv = rl_tok_rewards(adv_tok, reward, NULL, kl, kl_coef, toff, S, NULL);
	return rv ? rv : rl_adv_rtg_masked(adv_tok, adv_tok, baseline, toff, S, 1.0f, NULL);
}

int
rl_adv_reinforcepp(float *adv_tok, const float *reward, const float *kl, float kl_coef,
    const int *toff, int S, float gamma)
{
	int rv = rl_tok_rewards(adv_tok, reward, NULL, kl, kl_coef, toff, S, NULL);
	if (rv == RL_OK && (rv = rl_adv_rtg_masked(adv_tok, adv_tok, NULL, toff, S, gamma, NULL)) == RL_OK)
		rl_whiten_masked(adv_tok, toff[S], NULL);
	return rv;
}

int
rl_adv_gae(float *adv_tok, float *ret_tok, const float *reward, const float *kl,
    float kl_coef, const float *values, const int *toff, int S, float gamma, float lambda,
    int whiten)
{
	int rv = rl_tok_rewards(adv_tok, reward, NULL, kl, kl_coef, toff, S, NULL);
	if (rv == RL_OK && (rv = rl_adv_gae_masked(adv_tok, ret_tok, adv_tok, values, toff, S, gamma, lambda,
	    NULL)) == RL_OK && whiten)
		rl_whiten_masked(adv_tok, toff[S], NULL);
	return rv;
}

double
rl_value_loss(float *dv, const float *v, const float *old, const float *ret, const float *w,
    int N, float clip, int *nclipped)
{
	double loss = 0;
	int nc = 0;

	for (int n = 0; n < N; n++) {
		double e1, e2, vc = v[n];
		dv[n] = 0;
		if (w[n] == 0)
			continue;
		if (clip > 0) {
			double lo = (double)old[n] - clip, hi = (double)old[n] + clip;
			vc = vc < lo ? lo : vc > hi ? hi : vc;
		}
		e1 = (double)v[n] - ret[n];
		e2 = vc - ret[n];
		if (e1 * e1 >= e2 * e2) {
			loss += w[n] * 0.5 * e1 * e1;
			dv[n] = (float)(w[n] * e1);
		} else {
			loss += w[n] * 0.5 * e2 * e2;
			nc++;
		}
	}
	if (nclipped != NULL)
		*nclipped = nc;
	return loss;
}

double
rl_explained_var(const float *v, const float *ret, int n)
{
	double sr = 0, sd = 0, qr = 0, qd = 0;

	if (n <= 0)
		return NAN;
	for (int i = 0; i < n; i++) {
		sr += ret[i];
		sd += (double)ret[i] - v[i];
	}
	sr /= n;
	sd /= n;
	for (int i = 0; i < n; i++) {
		double d = (double)ret[i] - v[i] - sd;
		qr += (ret[i] - sr) * (ret[i] - sr);
		qd += d * d;
	}
	return qr > 0 ? 1.0 - qd / qr : NAN;
}

int
rl_loss_weights(float *w, const int *toff, int S, int agg, int norm_len)
{
	return rl_loss_weights_masked(w, toff, S, agg, norm_len, NULL);
}

/* tokens of sequence s that count: all, or those with mask 1 */
static int
counted(const int *toff, int s, const uint8_t *mask)
{
	int n = 0;

	if (mask == NULL)
		return toff[s + 1] - toff[s];
	for (int t = toff[s]; t < toff[s + 1]; t++)
		n += mask[t] != 0;
	return n;
}

int
rl_loss_weights_masked(float *w, const int *toff, int S, int agg, int norm_len, const uint8_t *mask)
{
	int nseq = 0;
	long ntok = 0;

	if (S < 0 || toff[0] != 0)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		int n;
		if (toff[s + 1] - toff[s] < 0)
			return RL_EINVAL;
		n = counted(toff, s, mask);
		nseq += n > 0;
		ntok += n;
	}
	if (agg == RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM && norm_len <= 0)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		int n = counted(toff, s, mask);
		double v;

		switch (agg) {
		case RL_AGG_TOKEN_MEAN:
			v = 1.0 / (double)ntok;
			break;
		case RL_AGG_SEQ_MEAN_TOKEN_SUM:
			v = 1.0 / nseq;
			break;
		case RL_AGG_SEQ_MEAN_TOKEN_MEAN:
			v = n ? 1.0 / ((double)n * nseq) : 0;
			break;
		case RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
			v = 1.0 / ((double)nseq * norm_len);
			break;
		default:
			return RL_EINVAL;
		}
		for (int t = toff[s]; t < toff[s + 1]; t++)
			w[t] = mask == NULL || mask[t] ? (float)v : 0.0f;
	}
	return RL_OK;
}

static const char *const dpo_names[RL_DPO_COUNT] = {
	[RL_DPO_SIGMOID] = "sigmoid", [RL_DPO_IPO] = "ipo", [RL_DPO_HINGE] = "hinge",
};

const char *rl_dpo_loss_name(int t) { return t >= 0 && t < RL_DPO_COUNT ? dpo_names[t] : "?"; }

int
rl_dpo_loss_parse(const char *s)
{
	for (int i = 0; i < RL_DPO_COUNT; i++)
		if (strcmp(s, dpo_names[i]) == 0)
			return i;
	return -1;
}

/* log sigmoid(x) without overflow either way */
static double
log_sigmoid(double x)
{
	return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

static double
sigmoid(double x)
{
	return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

int
rl_dpo_loss(double *dc, double *dr, rl_dpo_stats *st, const double *pc, const double *pr,
    const double *rc, const double *rr, int P, int type, double beta, double ls)
{
	rl_dpo_stats acc = { 0 };

	if (P < 1 || !(beta > 0) || !(ls >= 0 && ls < 0.5) || type < 0 || type >= RL_DPO_COUNT)
		return RL_EINVAL;
	for (int i = 0; i < P; i++) {
		double z = (pc[i] - pr[i]) - (rc[i] - rr[i]), bz = beta * z, l, g;
		switch (type) {
		case RL_DPO_SIGMOID:
			l = -(1 - ls) * log_sigmoid(bz) - ls * log_sigmoid(-bz);
			g = beta * (-(1 - ls) * sigmoid(-bz) + ls * sigmoid(bz));
			break;
		case RL_DPO_HINGE:
			l = 1 - bz > 0 ? 1 - bz : 0;
			g = 1 - bz > 0 ? -beta : 0;
			break;
		default: /* ipo */
			l = (z - 1 / (2 * beta)) * (z - 1 / (2 * beta));
			g = 2 * (z - 1 / (2 * beta));
			break;
		}
		if (dc)
			dc[i] = g / P;
		if (dr)
			dr[i] = -g / P;
		double cr = beta * (pc[i] - rc[i]), rj = beta * (pr[i] - rr[i]);
		acc.loss += l;
		acc.reward_chosen += cr;
		acc.reward_rejected += rj;
		acc.accuracy += cr > rj;
		acc.margin += cr - rj;
		acc.logp_chosen += pc[i];
		acc.logp_rejected += pr[i];
	}
	if (st) {
		st->loss = acc.loss / P;
		st->reward_chosen = acc.reward_chosen / P;
		st->reward_rejected = acc.reward_rejected / P;
		st->accuracy = acc.accuracy / P;
		st->margin = acc.margin / P;
		st->logp_chosen = acc.logp_chosen / P;
		st->logp_rejected = acc.logp_rejected / P;
	}
	return RL_OK;
}

int
rl_groups_with_signal(int *keep, const float *reward, const int *goff, int G)
{
	int kept = 0;

	for (int g = 0; g < G; g++) {
		int k = 0;
		for (int i = goff[g] + 1; i < goff[g + 1]; i++)
			if (reward[i] != reward[goff[g]])
				k = 1;
		keep[g] = k;
		kept += k;
	}
	return kept;
}

rl_stat3
rl_stat_f32(const float *x, size_t n)
{
	rl_stat3 st = { 0, INFINITY, -INFINITY, 0 };
	double sum = 0;

	for (size_t i = 0; i < n; i++) {
		if (isnan(x[i]))
			continue;
		sum += x[i];
		st.min = x[i] < st.min ? x[i] : st.min;
		st.max = x[i] > st.max ? x[i] : st.max;
		st.n++;
	}
	st.mean = st.n ? sum / st.n : NAN;
	if (!st.n)
		st.min = st.max = NAN;
	return st;
}

double
rl_lr_at(int t, double lr, int warmup, int total, int kind, double min_ratio)
{
	if (warmup > 0 && t <= warmup)
		return lr * t / warmup;
	if (kind == RL_SCHED_COSINE && total > warmup) {
		double p = (double)(t - warmup) / (total - warmup);
		if (p > 1)
			p = 1;
		return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(M_PI * p)));
	}
	return lr;
}

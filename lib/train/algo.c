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
	[RL_ALGO_PPO] = "ppo", [RL_ALGO_SFT] = "sft", [RL_ALGO_GSPO] = "gspo",
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

/* Whitens x (n) in place: mean 0, unbiased std 1. */
static void
whiten_f32(float *x, int n)
{
	double sum = 0, sq = 0, mean, sd;

	if (n == 0)
		return;
	for (int i = 0; i < n; i++)
		sum += x[i];
	mean = sum / n;
	for (int i = 0; i < n; i++)
		sq += (x[i] - mean) * (x[i] - mean);
	sd = n > 1 ? sqrt(sq / (n - 1)) : 0;
	for (int i = 0; i < n; i++)
		x[i] = (float)((x[i] - mean) / (sd + 1e-8));
}

/* Token rewards: -kl_coef*kl, plus the outcome at the last token. */
static float
tok_reward(const float *reward, const float *kl, float kl_coef, const int *toff, int s, int t)
{
	float r = kl ? -kl_coef * kl[t] : 0.0f;
	if (t == toff[s + 1] - 1)
		r += reward[s];
	return r;
}

/* Per token: the reward-to-go of the token rewards discounted by gamma, less
 * base[s] when base is given. */
static int
reward_to_go(float *adv_tok, const float *reward, const float *base, const float *kl, float kl_coef,
    const int *toff, int S, float gamma)
{
	if (S < 0 || toff[0] != 0)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		double ret = 0;
		if (toff[s + 1] < toff[s])
			return RL_EINVAL;
		for (int t = toff[s + 1] - 1; t >= toff[s]; t--) {
			ret = tok_reward(reward, kl, kl_coef, toff, s, t) + gamma * ret;
			adv_tok[t] = (float)(base ? ret - base[s] : ret);
		}
	}
	return RL_OK;
}

int
rl_adv_remax_tok(float *adv_tok, const float *reward, const float *baseline, const float *kl,
    float kl_coef, const int *toff, int S)
{
	return reward_to_go(adv_tok, reward, baseline, kl, kl_coef, toff, S, 1.0f);
}

int
rl_adv_reinforcepp(float *adv_tok, const float *reward, const float *kl, float kl_coef,
    const int *toff, int S, float gamma)
{
	int rv = reward_to_go(adv_tok, reward, NULL, kl, kl_coef, toff, S, gamma);
	if (rv == RL_OK)
		whiten_f32(adv_tok, toff[S]);
	return rv;
}

int
rl_adv_gae(float *adv_tok, float *ret_tok, const float *reward, const float *kl,
    float kl_coef, const float *values, const int *toff, int S, float gamma, float lambda,
    int whiten)
{
	if (S < 0 || toff[0] != 0)
		return RL_EINVAL;
	for (int s = 0; s < S; s++) {
		double a = 0, vnext = 0;
		if (toff[s + 1] < toff[s])
			return RL_EINVAL;
		for (int t = toff[s + 1] - 1; t >= toff[s]; t--) {
			double delta = tok_reward(reward, kl, kl_coef, toff, s, t) + gamma * vnext - values[t];
			a = delta + gamma * lambda * a;
			adv_tok[t] = (float)a;
			ret_tok[t] = (float)(a + values[t]);
			vnext = values[t];
		}
	}
	if (whiten)
		whiten_f32(adv_tok, toff[S]);
	return RL_OK;
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

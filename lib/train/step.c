/*
 * step.c — one optimizer step's computation (trainer.h): the step's
 * sequences laid out, advantages and loss weights on the host (algo.h), then
 * per micro-batch: rows padded, or sequences packed into one row with segment
 * and position ids (--micro-tokens, pack_plan), forward (model.h), per-token loss
 * and its gradient (ops->pg_loss, PPO's value loss), backward; AdamW per
 * mini-batch.
 *
 * Host arrays hold per-token values in the micro-batch's (B, T) layout; the
 * backend copies live in one allocation reserved once (rli_step_reserve), so
 * a step allocates nothing on the backend.
 * Leaves out: where the groups come from (feed.c), the gradient all-reduce
 * and ZeRO-1 (dp.c), what is published (save.c) and reported (metrics.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "model/lora.h"
#include "train/trainer.h"

/* KL estimator per token on the host (k1, k2, k3 as in ops.h). */
static float
kl_est(int type, float lp, float ref)
{
	float d = lp - ref;
	switch (type) {
	case 1: return d;
	case 2: return 0.5f * d * d;
	case 3: return expf(-d) + d - 1.0f;
	default: return 0;
	}
}

static int recompute_old(trainer *tr, const seqref *sq, int a0, int b0);
static int zero2_rounds(trainer *tr, int nb, int *rounds);

/* DPO: a group is a pair, the higher reward the chosen side, which the
 * step lays out first (*swap: the group's sample 1 is it); both sides must
 * fit one micro-batch together, since the loss of a pair needs both. */
static int
dpo_pair_order(trainer *tr, const rl_group *g, int *swap)
{
	int T;

	if (g->size != 2) {
		rl_error("group %llu has %d samples: --algo %s trains pairs (groups of 2)",
		    (unsigned long long)g->group, g->size, rl_algo_name(tr->o->algo));
		rl_hint("pair lines {\"prompt\", \"chosen\", \"rejected\"}, records generated with rl-rollout -n 2, "
		    "or --online to take the best and worst of each scored group");
		return RL_EFORMAT;
	}
	if (g->s[0].reward == g->s[1].reward) {
		rl_error("group %llu: both samples have reward %g, so neither is the chosen one (--algo %s)",
		    (unsigned long long)g->group, (double)g->s[0].reward, rl_algo_name(tr->o->algo));
		rl_hint("--online skips such groups (counted in train/groups_dropped_no_signal)");
		return RL_EFORMAT;
	}
	*swap = g->s[1].reward > g->s[0].reward;
	/* dpo's rows end before the last token (its log-prob is the last
	 * predicted); rm's hold it (the score is read there) */
	T = RL_MAX(g->s[0].plen + g->s[0].rlen, g->s[1].plen + g->s[1].rlen) - (tr->o->algo == RL_ALGO_DPO);
	if (2 * T > tr->maxtok) {
		rl_error("group %llu: the pair's rows (2 x %d tokens) exceed --max-tokens-per-micro %d",
		    (unsigned long long)g->group, T, tr->maxtok);
		return RL_ETOOBIG;
	}
	return RL_OK;
}

/* The step's training sequences (ReMax baselines taken out), their token
 * offsets, and room for their per-token values; *ntok tokens, *G groups. */
static int
layout(trainer *tr, int *ntok_out, int *G_out)
{
	const rl_train_opts *o = tr->o;
	int ntok = 0, rv, G = 0;

	tr->nseq = 0;
	for (int gi = 0; gi < tr->ngroups; gi++) {
		rl_group *g = &tr->groups[gi];
		float baseline = NAN;
		if (o->algo == RL_ALGO_REMAX) {
			for (int i = 0; i < g->size; i++)
				if (g->s[i].is_baseline)
					baseline = g->s[i].reward;
			if (isnan(baseline)) {
				rl_error("group %llu has no greedy baseline sample (remax)",
				    (unsigned long long)g->group);
				rl_hint("generate with rl-rollout --greedy-baseline");
				return RL_EFORMAT;
			}
		}
		int swap = 0;
		if ((o->algo == RL_ALGO_DPO || o->algo == RL_ALGO_RM) && (rv = dpo_pair_order(tr, g, &swap)) != 0)
			return rv;
		for (int i = 0; i < g->size; i++) {
			rl_sample *s = &g->s[swap ? 1 - i : i];
			if (s->is_baseline)
				continue;
			if ((rv = rli_feed_grow((void **)&tr->seq, &tr->cap_seq, tr->nseq + 1, sizeof(seqref))) != 0)
				return rv;
			if (s->plen < 1) {
				rl_error("record %llu has an empty prompt (the first token is never predicted)",
				    (unsigned long long)s->id);
				return RL_EFORMAT;
			}
			if (s->plen + s->rlen - 1 > tr->maxtok || s->plen + s->rlen > tr->m->cfg.max_pos) {
				rl_error("record %llu: %d prompt + %d response tokens exceed the model's %d "
				    "positions or %s %d", (unsigned long long)s->id, s->plen, s->rlen,
				    tr->m->cfg.max_pos, tr->pack ? "--micro-tokens" : "--max-tokens-per-micro", tr->maxtok);
				return RL_ETOOBIG;
			}
			tr->seq[tr->nseq] = (seqref){ s, ntok, s->reward, 0, 0, 0 };
			tr->nseq++;
			ntok += s->rlen;
		}
		G++;
	}
	if (ntok + 1 > tr->cap_tok) {
		int ncap = RL_MAX(ntok + 1, 2 * tr->cap_tok);
		float **arrs[] = { &tr->adv_tok, &tr->w_tok, &tr->old_tok, &tr->kl_tok, &tr->val_tok, &tr->ret_tok };
		for (size_t i = 0; i < RL_ARRAY_LEN(arrs); i++) {
			float *np = realloc(*arrs[i], (size_t)ncap * sizeof(float));
			if (!np)
				return RL_ENOMEM;
			*arrs[i] = np;
		}
		uint8_t *nm = realloc(tr->mask_tok, (size_t)ncap);
		if (!nm)
			return RL_ENOMEM;
		tr->mask_tok = nm;
		tr->cap_tok = ncap;
	}
	tr->has_mask = 0;
	tr->noverlong = 0;
	for (int i = 0; i < tr->nseq; i++) {
		const rl_sample *s = tr->seq[i].s;
		/* --overlong-filter: a truncated response's reward says little about it
		 * (DAPO): it still counts in its group's baseline, but none of its tokens
		 * in the loss */
		int cut = tr->o->overlong_filter && strcmp(s->finish, "length") == 0;
		for (int t = 0; t < s->rlen; t++)
			tr->mask_tok[tr->seq[i].toff + t] = cut ? 0 : s->loss_mask ? s->loss_mask[t] : 1;
		tr->has_mask |= s->loss_mask != NULL || cut;
		tr->noverlong += cut;
	}
	*ntok_out = ntok;
	*G_out = G;
	return RL_OK;
}

/* --kl-in-reward: the KL penalty per token (tr->kl_tok) from the records'
 * behaviour and reference log-probs, taken off each sequence's reward. */
static int
kl_penalty(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	int nk = 0;

	tr->reward_kl = 0;
	if (!o->kl_type || !o->kl_in_reward)
		return RL_OK;
	for (int i = 0; i < tr->nseq; i++) {
		rl_sample *s = tr->seq[i].s;
		const uint8_t *mk = tr->mask_tok + tr->seq[i].toff;
		double sum = 0;
		int n = 0;
		if (!s->logprobs || !s->ref_logprobs) {
			rl_error("record %llu: --kl-in-reward needs 'logprobs' and 'ref_logprobs' in the records",
			    (unsigned long long)s->id);
			return RL_EFORMAT;
		}
		/* inserted tokens (loss_mask 0) were not sampled by the policy: no KL */
		for (int t = 0; t < s->rlen; t++) {
			float k = mk[t] ? kl_est(o->kl_type, s->logprobs[t], s->ref_logprobs[t]) : 0.0f;
			tr->kl_tok[tr->seq[i].toff + t] = k;
			sum += k;
			n += mk[t];
		}
		tr->seq[i].reward = (float)(s->reward - o->kl_coef * sum);
		if (n > 0) {
			tr->reward_kl += sum / n;
			nk++;
		}
	}
	/* verl's actor/reward_kl_penalty: the sequences' token means, averaged */
	tr->reward_kl = nk ? tr->reward_kl / nk : 0;
	return RL_OK;
}

/* The advantages of the algorithm into tr->adv_tok.  toff (S + 1) are the
 * sequences' token offsets, goff (G + 1) the groups' sequence offsets, base
 * (S) ReMax's baseline rewards; rew (S) is scratch. */
static int
advantages(trainer *tr, const int *toff, const int *goff, const float *base, float *rew, int G, int ntok)
{
	const rl_train_opts *o = tr->o;
	const float *kl = o->kl_in_reward && o->kl_type ? tr->kl_tok : NULL;
	int S = tr->nseq, rv;

	const uint8_t *mask = tr->has_mask ? tr->mask_tok : NULL;

	for (int i = 0; i < S; i++)
		rew[i] = tr->seq[i].reward;
	if (o->algo == RL_ALGO_REMAX || o->algo == RL_ALGO_REINFORCEPP || o->algo == RL_ALGO_PPO) {
		/* token-level estimators: the token rewards (the outcome at the last
		 * sampled token, per-turn token_rewards, the KL penalty) into adv_tok */
		for (int i = 0; i < S; i++) {
			const rl_sample *s = tr->seq[i].s;
			rew[i] = s->reward;
			for (int t = 0; t < s->rlen; t++)
				tr->adv_tok[toff[i] + t] = s->token_rewards ? s->token_rewards[t] : 0.0f;
		}
		if ((rv = rl_tok_rewards(tr->adv_tok, rew, tr->adv_tok, kl, o->kl_coef, toff, S, mask)) != 0)
			return rv;
	}
	switch (o->algo) {
	case RL_ALGO_GRPO:
	case RL_ALGO_DRGRPO:
	case RL_ALGO_DAPO:
	case RL_ALGO_GSPO:
	case RL_ALGO_RLOO: {
		rl_adv_cfg c;
		float *adv = rl_try_malloc(sizeof(float) * (size_t)(S + 1), "advantages");
		if (!adv)
			return RL_ENOMEM;
		rl_adv_cfg_default(&c, o->algo);
		c.norm_std = o->algo == RL_ALGO_DRGRPO ? 0 : o->norm_std;
		if ((rv = rl_adv_outcome(adv, rew, goff, G, &c)) == 0)
			rl_adv_broadcast(tr->adv_tok, adv, toff, S);
		free(adv);
		for (int t = 0; mask && t < ntok; t++)
			tr->adv_tok[t] = mask[t] ? tr->adv_tok[t] : 0.0f;
		return rv;
	}
	case RL_ALGO_REMAX:
		/* verl's: the reward-to-go of the token rewards minus the greedy sample's reward */
		return rl_adv_rtg_masked(tr->adv_tok, tr->adv_tok, base, toff, S, 1.0f, mask);
	case RL_ALGO_REINFORCEPP:
		/* discounted returns over the sampled tokens, whitened over them */
		if ((rv = rl_adv_rtg_masked(tr->adv_tok, tr->adv_tok, NULL, toff, S, o->gamma, mask)) == 0)
			rl_whiten_masked(tr->adv_tok, ntok, mask);
		return rv;
	case RL_ALGO_PPO:
		/* V_old and π_old of every sequence of the step (every rank: GAE and the
		 * whitening need the whole step), then GAE over the sampled tokens;
		 * recompute_old's fill_rows reads adv_tok and w_tok, so the token
		 * rewards wait in ret_tok meanwhile */
		memcpy(tr->ret_tok, tr->adv_tok, sizeof(float) * (size_t)ntok);
		memset(tr->w_tok, 0, sizeof(float) * (size_t)ntok);
		if ((rv = recompute_old(tr, tr->seq, 0, S)) != 0)
			return rv;
		if ((rv = rl_adv_gae_masked(tr->adv_tok, tr->ret_tok, tr->ret_tok, tr->val_tok, toff, S, o->gamma,
		    o->lambda, mask)) == 0 && o->whiten_adv)
			rl_whiten_masked(tr->adv_tok, ntok, mask);
		return rv;
	case RL_ALGO_SFT:
		for (int t = 0; t < ntok; t++)
			tr->adv_tok[t] = 1.0f;
		return RL_OK;
	case RL_ALGO_DPO:
	case RL_ALGO_RM:
		/* no advantages: the loss is the pair's (dpo_update); the trained
		 * tokens of each side, which ipo's means and RPO's NLL count */
		memset(tr->adv_tok, 0, sizeof(float) * (size_t)ntok);
		for (int i = 0; i < S; i++) {
			tr->seq[i].ntrain = 0;
			for (int t = 0; t < tr->seq[i].s->rlen; t++)
				tr->seq[i].ntrain += mask ? mask[toff[i] + t] : 1;
		}
		return RL_OK;
	default:
		return RL_ENOTSUP;
	}
}

/* --skip-zero-adv: a sequence whose every advantage is exactly 0 (a group
 * whose samples all got the same reward) adds -0 * ratio to the loss and an
 * exactly zero gradient; its tokens still count in the loss weights, which
 * mini_weights computes over all of the mini-batch. */
static void
mark_skips(trainer *tr, int ntok)
{
	tr->nskip = 0;
	tr->tok_skip = 0;
	tr->tok_all = ntok;
	for (int i = 0; tr->skip_zero && i < tr->nseq; i++) {
		seqref *q = &tr->seq[i];
		int z = 1;
		for (int t = 0; t < q->s->rlen && z; t++)
			z = tr->adv_tok[q->toff + t] == 0.0f;
		q->skip = z;
		tr->nskip += z;
		tr->tok_skip += z ? q->s->rlen : 0;
	}
}

int
rli_step_prepare(trainer *tr)
{
	int ntok, G, S, rv;
	int *toff = NULL, *goff = NULL;
	float *rew = NULL, *base = NULL;

	if ((rv = layout(tr, &ntok, &G)) != 0 || (rv = kl_penalty(tr)) != 0)
		return rv;
	S = tr->nseq;
	toff = rl_try_malloc(sizeof(int) * (size_t)(S + 1), "sequence offsets");
	goff = rl_try_malloc(sizeof(int) * (size_t)(G + 1), "group offsets");
	rew = rl_try_malloc(sizeof(float) * (size_t)(S + 1), "rewards");
	base = rl_try_malloc(sizeof(float) * (size_t)(S + 1), "baselines");
	if (!toff || !goff || !rew || !base) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < S; i++)
		toff[i] = tr->seq[i].toff;
	toff[S] = ntok;
	/* group offsets over the training sequences (baselines removed) */
	{
		int si = 0, gi = 0;
		goff[0] = 0;
		for (int k = 0; k < tr->ngroups; k++) {
			rl_group *g = &tr->groups[k];
			for (int i = 0; i < g->size; i++)
				if (!g->s[i].is_baseline) {
					if (tr->o->algo == RL_ALGO_REMAX)
						for (int j = 0; j < g->size; j++)
							if (g->s[j].is_baseline)
								base[si] = g->s[j].reward;
					si++;
				}
			goff[++gi] = si;
		}
	}
	if ((rv = advantages(tr, toff, goff, base, rew, G, ntok)) != 0)
		goto out;
	mark_skips(tr, ntok);
out:
	free(toff);
	free(goff);
	free(rew);
	free(base);
	return rv;
}

/* Sequences [a, b) of the step form one mini-batch: per-token loss weights.
 * Tokens with loss_mask 0 get none and count nowhere, in seq-mean-token-sum-norm's
 * default length either (the longest count of sampled tokens). */
static int
mini_weights(trainer *tr, int a, int b)
{
	int S = b - a, maxlen = 0, rv;
	int *toff = rl_try_malloc(sizeof(int) * (size_t)(S + 1), "sequence offsets");
	int t0 = tr->seq[a].toff;

	if (!toff)
		return RL_ENOMEM;
	for (int i = 0; i < S; i++) {
		const seqref *q = &tr->seq[a + i];
		int n = 0;
		toff[i] = q->toff - t0;
		for (int t = 0; t < q->s->rlen; t++)
			n += tr->mask_tok[q->toff + t];
		maxlen = RL_MAX(maxlen, n);
	}
	toff[S] = (b < tr->nseq ? tr->seq[b].toff : tr->seq[tr->nseq - 1].toff + tr->seq[tr->nseq - 1].s->rlen) - t0;
	rv = rl_loss_weights_masked(tr->w_tok + t0, toff, S, tr->agg,
	    tr->o->norm_len > 0 ? tr->o->norm_len : RL_MAX(maxlen, 1), tr->has_mask ? tr->mask_tok + t0 : NULL);
	free(toff);
	return rv;
}

/* Positions a sequence takes in a micro-batch: its tokens but the last (never an input),
 * at least one. */
static int
seq_positions(const rl_sample *s)
{
	return RL_MAX(1, s->plen + s->rlen - 1);
}

/* Fills the host buffers for the B sequences sq and returns the row length T: padded, B rows
 * of T, sequence r from r * T; packed (tr->pack), one row of T = their positions, sequence r
 * from h_off[r] as segment r with positions from 0.  h_off[r] is where it starts either way. */
static int
fill_rows(trainer *tr, const seqref *sq, int B)
{
	int T = 0;

	for (int i = 0; i < B; i++) {
		tr->h_off[i] = tr->pack ? T : 0;
		T = tr->pack ? T + seq_positions(sq[i].s) : RL_MAX(T, sq[i].s->plen + sq[i].s->rlen - 1);
	}
	tr->maxrow = RL_MAX(tr->maxrow, T);
	for (int r = 0; r < B; r++) {
		const seqref *q = &sq[r];
		rl_sample *s = q->s;
		int L = s->plen + s->rlen, n0 = tr->pack ? tr->h_off[r] : r * T;
		int span = tr->pack ? seq_positions(s) : T;
		tr->h_off[r] = n0;
		for (int t = 0; t < span; t++) {
			int n = n0 + t, j = t - (s->plen - 1); /* response token index predicted at t */
			if (tr->pack) {
				tr->h_seg[n] = r;
				tr->h_pos[n] = t;
			}
			tr->h_tok[n] = t < s->plen ? s->prompt[t] : (t < L ? s->response[t - s->plen] : 0);
			if (j >= 0 && j < s->rlen) {
				tr->h_tgt[n] = s->response[j];
				tr->h_adv[n] = tr->adv_tok[q->toff + j];
				tr->h_w[n] = tr->w_tok[q->toff + j];
				tr->h_old[n] = tr->old_tok[q->toff + j];
				tr->h_beh[n] = s->logprobs ? s->logprobs[j] : 0.0f;
				tr->h_ref[n] = s->ref_logprobs ? s->ref_logprobs[j] : 0.0f;
			} else {
				tr->h_tgt[n] = -1;
				tr->h_adv[n] = tr->h_w[n] = tr->h_old[n] = tr->h_beh[n] = tr->h_ref[n] = 0;
			}
		}
	}
	return T;
}

/* The sequences of [a, b) of the step that are trained: *sq is tr->seq + a
 * and *n = b - a, or without those --skip-zero-adv skips, compacted into
 * tr->kseq (valid until the next call). */
static int
trained_seqs(trainer *tr, int a, int b, seqref **sq, int *n)
{
	int k = 0, rv;

	if (!tr->skip_zero || tr->nskip == 0) {
		*sq = tr->seq + a;
		*n = b - a;
		return RL_OK;
	}
	if ((rv = rli_feed_grow((void **)&tr->kseq, &tr->cap_kseq, RL_MAX(b - a, 1), sizeof(seqref))) != 0)
		return rv;
	for (int i = a; i < b; i++)
		if (!tr->seq[i].skip)
			tr->kseq[k++] = tr->seq[i];
	*sq = tr->kseq;
	*n = k;
	return RL_OK;
}

/* Micro-batch boundaries within sq[a, b): returns the first sequence not taken. */
static int
micro_end(trainer *tr, const seqref *sq, int a, int b)
{
	int T = 0, e = a;
	float temp = sq[a].s->temperature;

	while (e < b) {
		rl_sample *s = sq[e].s;
		int nT = RL_MAX(T, s->plen + s->rlen - 1);
		if (e > a && ((e - a + 1) * nT > tr->maxtok || s->temperature != temp))
			break;
		T = nT;
		e++;
	}
	return e;
}

/* qsort order of (positions, index) pairs: longest first, equal lengths in the records'
 * order (the same plan on every run). */
static int
by_length(const void *a, const void *b)
{
	const int *x = a, *y = b;
	return x[0] != y[0] ? (x[0] < y[0]) - (x[0] > y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Packed micro-batches (--micro-tokens N) of sq[0, n) by first-fit decreasing into tr->pseq
 * and tr->pbin (micro_plan): the sequences longest first, each into the first micro-batch
 * of the same temperature with room for its positions, else a new one.  Every micro-batch
 * holds at most N positions; a sequence longer than N never gets here (the grouper and
 * layout() refuse it).  FFD uses at most 11/9 OPT + 1 micro-batches; verl's Karmarkar-Karp
 * split balances their sums instead, which matters for ranks that wait on each other at
 * every micro-batch, not for the results. */
static int
pack_plan(trainer *tr, const seqref *sq, int n, int *nbin)
{
	int N = tr->maxtok, nb = 0, *room, *bin, *ord, *cnt, *first;

	room = rl_try_malloc(sizeof(int) * (size_t)(n + 1) * 6, "micro-batch plan");
	if (room == NULL)
		return RL_ENOMEM;
	bin = room + n + 1;   /* bin of each sequence */
	cnt = bin + n + 1;    /* sequences per bin, then their start */
	first = cnt + n + 1;  /* each bin's first sequence (its temperature) */
	ord = first + n + 1;  /* (positions, sequence) pairs, longest first */
	for (int i = 0; i < n; i++) {
		ord[2 * i] = seq_positions(sq[i].s);
		ord[2 * i + 1] = i;
	}
	qsort(ord, (size_t)n, 2 * sizeof(int), by_length);
	for (int i = 0; i < n; i++) {
		const rl_sample *s = sq[ord[2 * i + 1]].s;
		int L = ord[2 * i], b = 0;
		while (b < nb && (room[b] < L || sq[first[b]].s->temperature != s->temperature))
			b++;
		if (b == nb) {
			room[nb] = N;
			first[nb++] = ord[2 * i + 1];
		}
		room[b] -= L;
		bin[ord[2 * i + 1]] = b;
	}
	memset(cnt, 0, sizeof(int) * (size_t)(nb + 1));
	for (int i = 0; i < n; i++)
		cnt[bin[i] + 1]++;
	for (int b = 0; b < nb; b++)
		cnt[b + 1] += cnt[b];
	memcpy(tr->pbin, cnt, sizeof(int) * (size_t)(nb + 1));
	/* within a bin, the records' order */
	for (int i = 0; i < n; i++)
		tr->pseq[cnt[bin[i]]++] = sq[i];
	*nbin = nb;
	free(room);
	return RL_OK;
}

/* The micro-batches of sq[0, n): *out (tr->pseq, valid until the next call) holds the
 * sequences in micro-batch order, micro-batch k being (*out)[tr->pbin[k], tr->pbin[k + 1]);
 * padded rows by micro_end in the records' order, or packed by pack_plan. */
static int
micro_plan(trainer *tr, const seqref *sq, int n, seqref **out, int *nbin)
{
	int rv, nb = 0;

	if ((rv = rli_feed_grow((void **)&tr->pseq, &tr->cap_pseq, RL_MAX(n, 1), sizeof(seqref))) != 0)
		return rv;
	free(tr->pbin);
	if ((tr->pbin = rl_try_malloc(sizeof(int) * (size_t)(n + 1), "micro-batch plan")) == NULL)
		return RL_ENOMEM;
	*out = tr->pseq;
	if (tr->pack) {
		rv = pack_plan(tr, sq, n, nbin);
		tr->nbin = *nbin;
		return rv;
	}
	memcpy(tr->pseq, sq, sizeof(seqref) * (size_t)n);
	tr->pbin[0] = 0;
	for (int a = 0; a < n; a = tr->pbin[nb])
		tr->pbin[++nb] = micro_end(tr, sq, a, n);
	*nbin = tr->nbin = nb;
	return RL_OK;
}

/* Recompute the old log-probs of sequences sq[a0, b0) with the current
 * weights (and with a value head, their values V_old). */
static int
recompute_old(trainer *tr, const seqref *sq, int a0, int b0)
{
	int rv, nb, rounds;
	seqref *ps;

	if ((rv = micro_plan(tr, sq + a0, b0 - a0, &ps, &nb)) != 0)
		return rv;
	/* ZeRO-3: as many forward passes as the rank with the most (their gathers
	 * are collectives) */
	if (tr->z3p.zp && (rv = zero2_rounds(tr, nb, &rounds)) != 0)
		return rv;
	for (int k = nb; tr->z3p.zp && k < rounds; k++)
		if ((rv = rli_zero3_idle_pass(tr, 0, 0)) != 0)
			return rv;
	for (int k = 0; k < nb; k++) {
		const seqref *mq = ps + tr->pbin[k];
		int B = tr->pbin[k + 1] - tr->pbin[k], T = fill_rows(tr, mq, B), R = tr->pack ? 1 : B;
		double t0 = rl_now();
		rv = rl_model_forward(tr->m, tr->h_lp, NULL, tr->h_tok, tr->h_tgt, tr->pack ? tr->h_seg : NULL,
		    tr->pack ? tr->h_pos : NULL, R, T, mq[0].s->temperature);
		tr->t_model += rl_now() - t0;
		if (rv != 0)
			return rv;
		if (tr->m->val) {
			tr->ops->download(tr->ops, tr->h_v, tr->m->val, sizeof(float) * (size_t)R * T);
			if ((rv = tr->ops->status(tr->ops)) != 0)
				return rv;
		}
		for (int r = 0; r < B; r++) {
			rl_sample *s = mq[r].s;
			for (int j = 0; j < s->rlen; j++) {
				int n = tr->h_off[r] + s->plen - 1 + j;
				tr->old_tok[mq[r].toff + j] = tr->h_lp[n];
				if (tr->m->val)
					tr->val_tok[mq[r].toff + j] = tr->h_v[n];
			}
		}
	}
	return RL_OK;
}

/* PPO: the clipped value loss of the micro-batch sq[0, B) laid out by fill_rows in N
 * positions, after its forward; its gradient (times vf_coef) to d_dval. */
static int
value_loss(trainer *tr, const seqref *sq, int B, int N, mstat *ms)
{
	const rl_train_opts *o = tr->o;
	int nclip = 0;

	tr->ops->download(tr->ops, tr->h_v, tr->m->val, sizeof(float) * (size_t)N);
	memset(tr->h_vold, 0, sizeof(float) * (size_t)N);
	memset(tr->h_ret, 0, sizeof(float) * (size_t)N);
	for (int r = 0; r < B; r++) {
		const seqref *q = &sq[r];
		for (int j = 0; j < q->s->rlen; j++) {
			int n = tr->h_off[r] + q->s->plen - 1 + j;
			tr->h_vold[n] = tr->val_tok[q->toff + j];
			tr->h_ret[n] = tr->ret_tok[q->toff + j];
			if (tr->mask_tok[q->toff + j])
				ms->vpred += tr->h_v[n];
		}
	}
	/* h_w is 0 on padding: those tokens get no loss and no gradient */
	ms->vf_loss += rl_value_loss(tr->h_dv, tr->h_v, tr->h_vold, tr->h_ret, tr->h_w, N, o->value_clip, &nclip);
	ms->vf_clip += nclip;
	for (int n = 0; n < N; n++)
		tr->h_dv[n] *= o->vf_coef;
	tr->ops->upload(tr->ops, tr->d_dval, tr->h_dv, sizeof(float) * (size_t)N);
	return tr->ops->status(tr->ops);
}

/* GSPO (verl's loss mode "gspo"): every token of a sequence takes the
 * sequence's importance ratio, exp of the mean over its tokens of lp - old.
 * pg_loss computes a token ratio exp(lp - old'); with old' = lp - mean that
 * ratio is the sequence's, and its gradient through lp is the token's own
 * (the mean is a constant there, as verl detaches it): GSPO-token, which
 * verl computes.  The mean is over the tokens trained on (loss_mask), capped
 * at 10 as verl caps the log-ratio.  old_h is the host pi_old (N); the result
 * goes to d_old. */
static int
gspo_old(trainer *tr, const seqref *sq, int B, int N, const float *old_h)
{
	rl_ops *ops = tr->ops;
	size_t nb = (size_t)N * sizeof(float);

	ops->download(ops, tr->h_lp, tr->m->lp, nb);
	if (ops->status(ops) != 0)
		return ops->status(ops);
	memcpy(tr->h_gspo, old_h, nb);
	for (int r = 0; r < B; r++) {
		const rl_sample *smp = sq[r].s;
		double sum = 0;
		int cnt = 0;
		for (int j = 0; j < smp->rlen; j++) {
			int n = tr->h_off[r] + smp->plen - 1 + j;
			if (tr->has_mask && tr->h_w[n] == 0.0f)
				continue;
			sum += (double)tr->h_lp[n] - old_h[n];
			cnt++;
		}
		double mean = cnt ? sum / cnt : 0;
		if (mean > 10)
			mean = 10;
		for (int j = 0; j < smp->rlen; j++) {
			int n = tr->h_off[r] + smp->plen - 1 + j;
			tr->h_gspo[n] = (float)((double)tr->h_lp[n] - mean);
		}
	}
	ops->upload(ops, tr->d_old, tr->h_gspo, nb);
	return ops->status(ops);
}

/* A micro-batch of the policy gradient runs the reference's forward
 * (between the policy's forward and backward; LoRA's base before the
 * policy's forward): the same on every rank. */
static int
ref_in_micro(const trainer *tr)
{
	return (tr->ref || tr->ref_base) && tr->o->kl_type && !tr->o->kl_in_reward;
}

/* The reference's forward when it is LoRA's base (tr->ref_base): the
 * policy's own forward with the adapters off (no dropout masks drawn), its
 * log-probs into lp (host).  It overwrites the policy's activations, so it
 * runs before the policy's forward that a backward follows, never between. */
static int
base_ref_forward(trainer *tr, float *lp, const int32_t *seg, const int32_t *pos, int B, int T, float temp)
{
	double t0 = rl_now();
	int rv, r2;

	if ((rv = rl_model_lora_off(tr->m, 1)) != 0)
		return rv;
	rv = rl_model_forward(tr->m, lp, NULL, tr->h_tok, tr->h_tgt, seg, pos, B, T, temp);
	r2 = rl_model_lora_off(tr->m, 0);
	tr->t_model += rl_now() - t0;
	return rv != 0 ? rv : r2;
}

/* One micro-batch, the B sequences sq: forward, loss, backward (gradients
 * accumulated), statistics into ms. */
static int
micro(trainer *tr, const seqref *sq, int B, int recomputed, mstat *ms)
{
	const rl_train_opts *o = tr->o;
	rl_ops *ops = tr->ops;
	int T = fill_rows(tr, sq, B), R = tr->pack ? 1 : B, N = R * T, rv;
	const int32_t *seg = tr->pack ? tr->h_seg : NULL, *pos = tr->pack ? tr->h_pos : NULL;

	ms->npos += N;
	for (int i = 0; i < B; i++)
		ms->npad -= seq_positions(sq[i].s);
	ms->npad += N;
	float temp = sq[0].s->temperature;
	rl_pg_params p = { 0 };
	const float *ref = NULL, *beh = NULL, *old;
	int want_ent = o->ent_coef != 0;

	if (ref_in_micro(tr) && tr->ref_base && (rv = base_ref_forward(tr, tr->h_ref, seg, pos, R, T, temp)) != 0)
		return rv;
	double t0 = rl_now();
	rv = rl_model_forward(tr->m, NULL, NULL, tr->h_tok, tr->h_tgt, seg, pos, R, T, temp);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		return rv;
	size_t nb = (size_t)N * sizeof(float);
	ops->upload(ops, tr->d_adv, tr->h_adv, nb);
	ops->upload(ops, tr->d_w, tr->h_w, nb);
	if (o->old_from_behaviour) {
		ops->upload(ops, tr->d_old, tr->h_beh, nb);
		old = tr->d_old;
	} else if (recomputed) {
		ops->upload(ops, tr->d_old, tr->h_old, nb);
		old = tr->d_old;
	} else {
		old = tr->m->lp; /* one pass: pi_old is the current policy (gspo's ratio is 1 too) */
	}
	if (o->algo == RL_ALGO_GSPO && old == tr->d_old &&
	    (rv = gspo_old(tr, sq, B, N, o->old_from_behaviour ? tr->h_beh : tr->h_old)) != 0)
		return rv;
	if (o->tis_cap > 0 && !o->old_from_behaviour) {
		for (int i = 0; i < B; i++)
			if (!sq[i].s->logprobs) {
				rl_error("record %llu: --tis-cap needs behaviour 'logprobs' in the records",
				    (unsigned long long)sq[i].s->id);
				return RL_EFORMAT;
			}
		ops->upload(ops, tr->d_beh, tr->h_beh, nb);
		beh = tr->d_beh;
	}
	if (o->kl_type && !o->kl_in_reward) {
		if (ref_in_micro(tr) && tr->ref_base) {
			ops->upload(ops, tr->d_ref, tr->h_ref, nb); /* base_ref_forward's, above */
			ref = tr->d_ref;
		} else if (ref_in_micro(tr)) {
			t0 = rl_now();
			rv = rl_model_forward(tr->ref, NULL, NULL, tr->h_tok, tr->h_tgt, seg, pos, R, T, temp);
			if (rv == 0)
				rv = rli_zero3_ref_done(tr); /* ZeRO-3: its units given back */
			tr->t_model += rl_now() - t0;
			if (rv != 0)
				return rv;
			ref = tr->ref->lp;
		} else {
			for (int i = 0; i < B; i++)
				if (!sq[i].s->ref_logprobs) {
					rl_error("record %llu: the KL term needs 'ref_logprobs' in the records or --ref MODEL_DIR",
					    (unsigned long long)sq[i].s->id);
					return RL_EFORMAT;
				}
			ops->upload(ops, tr->d_ref, tr->h_ref, nb);
			ref = tr->d_ref;
		}
	}
	p.clip_low = o->clip_low;
	p.clip_high = o->clip_high;
	p.dual_clip = o->dual_clip;
	p.tis_cap = o->tis_cap;
	p.kl_coef = ref ? o->kl_coef : 0;
	p.kl_type = o->kl_type ? o->kl_type : 1;
	p.ent_coef = o->ent_coef;
	ops->pg_loss(ops, tr->d_dlp, want_ent ? tr->d_dent : NULL, tr->d_stats, tr->m->lp, old, beh, ref,
	    want_ent ? tr->m->ent : NULL, tr->d_adv, tr->d_w, N, &p);
	if (o->algo == RL_ALGO_PPO && (rv = value_loss(tr, sq, B, N, ms)) != 0)
		return rv;
	t0 = rl_now();
	rv = rl_model_backward_value(tr->m, tr->d_dlp, want_ent ? tr->d_dent : NULL,
	    o->algo == RL_ALGO_PPO ? tr->d_dval : NULL);
	if (rv == 0)
		rv = ops->sync(ops);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		return rv;
	/* statistics for the metrics line */
	ops->download(ops, tr->h_stats, tr->d_stats, nb * RL_PG_NSTAT);
	ops->download(ops, tr->h_lp, tr->m->lp, nb);
	ops->download(ops, tr->h_ent, tr->m->ent, nb);
	if ((rv = ops->status(ops)) != 0)
		return rv;
	for (int n = 0; n < N; n++) {
		if (tr->h_tgt[n] < 0 || (tr->has_mask && tr->h_w[n] == 0.0f))
			continue;
		float *st = tr->h_stats + (size_t)n * RL_PG_NSTAT;
		/* actor/pg_loss is the policy-gradient term alone, as verl's: the op's
		 * token loss also holds the KL and entropy terms, reported apart
		 * (actor/kl_loss, actor/entropy); taken out again here, in double */
		double pg = st[RL_PG_LOSS];
		if (ref != NULL)
			pg -= (double)p.kl_coef * st[RL_PG_KL];
		if (want_ent)
			pg += (double)p.ent_coef * tr->h_ent[n];
		ms->loss += (double)tr->h_w[n] * pg;
		/* verl's pg_clipfrac counts the ratio clip (-A clip(r) > -A r) and
		 * pg_clipfrac_lower the dual clip apart (max of those > -A c, A < 0);
		 * the op's CLIPPED flag is either (its stats are 0 where w is 0) */
		float A = tr->h_adv[n], r = st[RL_PG_RATIO], rc = fminf(fmaxf(r, 1.0f - p.clip_low), 1.0f + p.clip_high);
		if (tr->h_w[n] != 0) {
			ms->clip += -A * rc > -A * r;
			ms->clip_lower += p.dual_clip > 0 && A < 0 && fmaxf(-A * r, -A * rc) > -A * p.dual_clip;
		}
		ms->ratio_logsum += -logf(st[RL_PG_RATIO] > 0 ? st[RL_PG_RATIO] : 1e-30f);
		ms->kl += st[RL_PG_KL];
		ms->ent += tr->h_ent[n];
		ms->ce += -tr->h_lp[n];
		ms->ntok += 1;
	}
	return RL_OK;
}

int
rli_step_reserve(trainer *tr)
{
	rl_ops *ops = tr->ops;
	size_t n = (size_t)tr->maxtok;
	int rv;

	if ((rv = rl_model_train_reserve(tr->m, tr->maxtok)) != 0)
		return rv;
	if (tr->ref && (rv = rl_model_eval_reserve(tr->ref, tr->maxtok)) != 0)
		return rv;
	tr->h_tok = rl_try_calloc(n, sizeof(int32_t), "token rows");
	tr->h_tgt = rl_try_calloc(n, sizeof(int32_t), "target rows");
	tr->h_old = rl_try_calloc(n * (8 + RL_PG_NSTAT), sizeof(float), "per-token buffers");
	tr->h_seg = rl_try_calloc(2 * n, sizeof(int32_t), "segment rows");
	tr->h_off = rl_try_calloc(n, sizeof(int), "sequence offsets");
	if (!tr->h_tok || !tr->h_tgt || !tr->h_old || !tr->h_seg || !tr->h_off)
		return RL_ENOMEM;
	tr->h_pos = tr->h_seg + n;
	tr->h_beh = tr->h_old + n;
	tr->h_ref = tr->h_beh + n;
	tr->h_adv = tr->h_ref + n;
	tr->h_w = tr->h_adv + n;
	tr->h_lp = tr->h_w + n;
	tr->h_ent = tr->h_lp + n;
	tr->h_stats = tr->h_ent + n;
	tr->h_gspo = tr->h_stats + n * RL_PG_NSTAT;
	if ((rv = ops->alloc(ops, &tr->d_mem, n * (7 + RL_PG_NSTAT) * sizeof(float))) != 0)
		return rv;
	tr->d_old = tr->d_mem;
	tr->d_beh = tr->d_old + n;
	tr->d_ref = tr->d_beh + n;
	tr->d_adv = tr->d_ref + n;
	tr->d_w = tr->d_adv + n;
	tr->d_dlp = tr->d_w + n;
	tr->d_dent = tr->d_dlp + n;
	tr->d_stats = tr->d_dent + n;
	if (tr->m->vh_w >= 0) {
		if (!(tr->h_vold = rl_try_calloc(4 * n, sizeof(float), "value buffers")))
			return RL_ENOMEM;
		tr->h_ret = tr->h_vold + n;
		tr->h_v = tr->h_ret + n;
		tr->h_dv = tr->h_v + n;
		if ((rv = ops->alloc(ops, (void **)&tr->d_dval, n * sizeof(float))) != 0)
			return rv;
	}
	return RL_OK;
}

/* This rank's contiguous share [*ra, *rb) of the mini-batch [a, b). */
static void
rank_share(const trainer *tr, int a, int b, int *ra, int *rb)
{
	*ra = a + (int)((long)(b - a) * tr->rank / tr->world);
	*rb = a + (int)((long)(b - a) * (tr->rank + 1) / tr->world);
}

int
rli_step_old(trainer *tr, int *recomputed)
{
	const rl_train_opts *o = tr->o;
	int E = RL_MAX(o->ppo_epochs, 1), M = RL_MIN(RL_MAX(o->mini_batches, 1), tr->nseq), rv, n, ra, rb;
	seqref *sq;

	*recomputed = 0;
	if (o->algo == RL_ALGO_DPO || o->algo == RL_ALGO_RM)
		return RL_OK; /* no ratio: dpo's reference is the fixed point */
	if (o->algo == RL_ALGO_PPO && !o->old_from_behaviour)
		*recomputed = 1; /* the pass over the step for V_old gave π_old too */
	if ((E == 1 && M == 1) || o->old_from_behaviour || *recomputed)
		return RL_OK;
	/* each rank needs pi_old of the sequences it trains only */
	for (int mb = 0; mb < M; mb++) {
		int a = (int)((long)tr->nseq * mb / M), b = (int)((long)tr->nseq * (mb + 1) / M);
		rank_share(tr, a, b, &ra, &rb);
		if ((rv = trained_seqs(tr, ra, rb, &sq, &n)) != 0 || (rv = recompute_old(tr, sq, 0, n)) != 0)
			return rv;
	}
	*recomputed = 1;
	return RL_OK;
}

/* ---- ZeRO-2: every micro-batch's gradients reduce-scattered (dp.c) ----
 * The gradient buffer is the backward's scratch: each backward hands its
 * buckets to the reduce-scatter as layers finish, and the shards sum the
 * rounds.  Every rank must run the same rounds, so a mini-batch has as many
 * as the rank with the most micro-batches; a rank out of them reduces zeros. */

/* The rounds of a mini-batch: the most micro-batches any rank has (nb here). */
static int
zero2_rounds(trainer *tr, int nb, int *rounds)
{
	int *all, rv;

	*rounds = nb;
	if (tr->zero < 2 && !tr->z3p.zp) /* ZeRO-3 with LoRA: tr->zero 0, the base's gathers collectives */
		return RL_OK;
	if (!(all = rl_try_malloc(sizeof *all * (size_t)tr->world, "micro-batch counts")))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(tr->comm, all, &nb, sizeof nb)) == 0)
		for (int r = 0; r < tr->world; r++)
			*rounds = RL_MAX(*rounds, all[r]);
	free(all);
	return rv;
}

/* Sets the backward's hook for micro-batch k of nb: with the bucketed
 * all-reduce, on the last one only (the gradients are final then); with
 * ZeRO-2, on every one. */
static void
hook_on(trainer *tr, int k, int nb)
{
	if (tr->zero >= 2) {
		tr->m->grad_ready = rli_zero2_grad_ready;
		tr->m->grad_ready_ctx = tr;
	} else if (tr->red && k == nb - 1) {
		tr->m->grad_ready = rli_dp_grad_ready;
		tr->m->grad_ready_ctx = tr->red;
	}
}

/* After micro-batch round k: ZeRO-2 ends the round's reduce-scatter; a rank
 * without a micro-batch in it (k >= nb) hands its zero buffer over whole. */
static int
round_end(trainer *tr)
{
	if (tr->zero < 2)
		return RL_OK;
	rli_dp_grads_resident(tr);
	return rli_dp_allreduce_grads(tr);
}

/* The update of one mini-batch from its gradients: AdamW at the step's
 * learning rate (ZeRO-1's sharded one with several ranks). */
static int
adamw(trainer *tr, float *gnorm, double *lr)
{
	const rl_train_opts *o = tr->o;
	rl_adamw ad = { 0 };
	int rv;

	*lr = rl_lr_at(tr->m->version + 1, o->lr, o->warmup, o->total_steps, o->sched, o->min_lr_ratio);
	ad.lr = (float)*lr;
	ad.beta1 = o->beta1;
	ad.beta2 = o->beta2;
	ad.eps = o->adam_eps;
	ad.weight_decay = o->weight_decay;
	ad.max_grad_norm = o->grad_clip;
	if (o->critic_lr > 0)
		ad.aux_lr = (float)rl_lr_at(tr->m->version + 1, o->critic_lr, o->warmup, o->total_steps, o->sched,
		    o->min_lr_ratio);
	double t1 = rl_now(), c1 = tr->t_gather + tr->t_rs;
	rv = tr->zero ? rli_zero_step(tr, &ad, gnorm) : rl_model_step(tr->m, &ad, gnorm);
	t1 = rl_now() - t1;
	tr->t_model += t1;
	tr->t_opt += t1 - (tr->t_gather + tr->t_rs - c1);
	return rv;
}

/* ---- DPO (docs/train.md, "DPO") ----
 * A micro-batch holds whole pairs, chosen then rejected: its one forward
 * gives both sides' log-probs, rl_dpo_loss the gradient with respect to
 * each side's summed log-prob, which every trained token of that side
 * takes as its d loss / d lp; one backward.  A pass costs what SFT's costs
 * on the same tokens. */

/* Micro-batch boundaries within the pairs sq[a, b) (a, b even). */
static int
dpo_micro_end(trainer *tr, const seqref *sq, int a, int b)
{
	int T = 0, e = a;

	while (e < b) {
		int nT = RL_MAX(T, RL_MAX(sq[e].s->plen + sq[e].s->rlen, sq[e + 1].s->plen + sq[e + 1].s->rlen) -
		    (tr->o->algo == RL_ALGO_DPO));
		if (e > a && (e - a + 2) * nT > tr->maxtok)
			break;
		T = nT;
		e += 2;
	}
	return e;
}

/* Sum of the trained tokens' values lp (rows of T, from fill_rows) of row r. */
static double
row_sum(const trainer *tr, const seqref *q, const float *lp, int r, int T)
{
	double sum = 0;

	for (int j = 0; j < q->s->rlen; j++)
		if (tr->mask_tok[q->toff + j])
			sum += lp[r * T + q->s->plen - 1 + j];
	return sum;
}

/* The reference model where DPO needs it and no --ref gave one: the initial
 * policy (-m), opened now (with ZeRO-3 sharded, by every rank at once). */
static int
dpo_ref_open(trainer *tr, const rl_sample *s)
{
	const rl_train_opts *o = tr->o;
	int rv;

	if (!o->model_dir) {
		if (s)
			rl_error("record %llu has no 'ref_logprobs' and there is no reference model",
			    (unsigned long long)s->id);
		else
			rl_error("a record of another rank has no 'ref_logprobs' and there is no reference model");
		rl_hint("give --ref DIR, or -m with the initial policy (the reference by default)");
		return RL_EINVAL;
	}
	if (tr->z3p.zp)
		rv = rl_model_open_part(&tr->ref, o->model_dir, tr->ops, 0, o->seed);
	else
		rv = rl_model_open(&tr->ref, o->model_dir, tr->ops);
	if (rv != 0 || (rv = rl_model_eval_reserve(tr->ref, tr->maxtok)) != 0)
		return rv;
	return tr->z3p.zp ? rli_zero3_ref_load(tr) : RL_OK;
}

/* Whether the pairs' micro-batch sq[a, e) needs the reference model. */
static int
dpo_ref_need(const trainer *tr, const seqref *sq, int a, int e)
{
	for (int i = a; i < e; i++)
		if (tr->o->ref_dir || !sq[i].s->ref_logprobs)
			return 1;
	return 0;
}

/* The reference's log-prob of each sequence of sq[0, n): the records'
 * ref_logprobs, or (with --ref, or where a record has none) the reference
 * model's, computed once per step: the initial policy (-m) unless --ref.
 * ZeRO-3: the reference's forwards gather, so every rank runs as many as
 * the rank with the most (the others only gather). */
static int
dpo_ref(trainer *tr, seqref *sq, int n)
{
	int rv, npass = 0, rounds = 0;

	if (tr->z3p.zp) {
		for (int a = 0, e; a < n; a = e) {
			e = dpo_micro_end(tr, sq, a, n);
			npass += dpo_ref_need(tr, sq, a, e);
		}
		if ((rv = zero2_rounds(tr, npass, &rounds)) != 0)
			return rv;
		const rl_sample *lack = NULL; /* a record of this rank's that needs it, for the error */
		for (int i = 0; i < n && !lack; i++)
			lack = sq[i].s->ref_logprobs ? NULL : sq[i].s;
		if (rounds > 0 && !tr->ref && !tr->ref_base && (rv = dpo_ref_open(tr, lack)) != 0)
			return rv;
	}
	for (int a = 0; a < n;) {
		int e = dpo_micro_end(tr, sq, a, n), need = dpo_ref_need(tr, sq, a, e);
		for (int i = a; i < e; i++) {
			const rl_sample *s = sq[i].s;
			sq[i].ref_lp = 0;
			for (int j = 0; s->ref_logprobs && j < s->rlen; j++)
				sq[i].ref_lp += tr->mask_tok[sq[i].toff + j] ? s->ref_logprobs[j] : 0.0;
		}
		if (need && !tr->ref && !tr->ref_base && (rv = dpo_ref_open(tr, sq[a].s)) != 0)
			return rv;
		if (need && tr->ref_base) {
			/* LoRA's base: before this mini-batch's policy forwards */
			int B = e - a, T = fill_rows(tr, sq + a, B);
			if ((rv = base_ref_forward(tr, tr->h_lp, NULL, NULL, B, T, 1.0f)) != 0)
				return rv;
			for (int r = 0; r < B; r++)
				if (tr->o->ref_dir || !sq[a + r].s->ref_logprobs)
					sq[a + r].ref_lp = row_sum(tr, &sq[a + r], tr->h_lp, r, T);
		} else if (need) {
			int B = e - a, T = fill_rows(tr, sq + a, B);
			double t0 = rl_now();
			rv = rl_model_forward(tr->ref, tr->h_lp, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T, 1.0f);
			if (rv == 0)
				rv = rli_zero3_ref_done(tr);
			tr->t_model += rl_now() - t0;
			if (rv != 0)
				return rv;
			for (int r = 0; r < B; r++)
				if (tr->o->ref_dir || !sq[a + r].s->ref_logprobs)
					sq[a + r].ref_lp = row_sum(tr, &sq[a + r], tr->h_lp, r, T);
		}
		a = e;
	}
	for (int k = npass; k < rounds; k++) {
		double t0 = rl_now();
		rv = rli_zero3_ref_idle(tr);
		tr->t_model += rl_now() - t0;
		if (rv != 0)
			return rv;
	}
	return RL_OK;
}

/* One micro-batch of B / 2 pairs of a mini-batch of P pairs (nchosen trained
 * chosen tokens): forward, the pairs' loss, backward; statistics into ms. */
static int
dpo_micro(trainer *tr, const seqref *sq, int B, int P, long nchosen, mstat *ms)
{
	const rl_train_opts *o = tr->o;
	int T = fill_rows(tr, sq, B), np = B / 2, ipo = o->dpo_loss == RL_DPO_IPO, rv;
	double *v = rl_try_malloc(sizeof(double) * 6 * (size_t)np, "pair log-probs");
	double *pc = v, *pr = v + np, *rc = v + 2 * np, *rr = v + 3 * np, *dc = v + 4 * np, *dr = v + 5 * np;
	rl_dpo_stats st;

	if (!v)
		return RL_ENOMEM;
	double t0 = rl_now();
	rv = rl_model_forward(tr->m, tr->h_lp, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T, 1.0f);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		goto out;
	for (int r = 0; r < B; r++) {
		double n = ipo ? sq[r].ntrain : 1;
		if (n == 0) {
			rl_error("record %llu: no trained tokens (its loss_mask is all 0), no mean log-prob for ipo",
			    (unsigned long long)sq[r].s->id);
			rv = RL_EFORMAT;
			goto out;
		}
		(r % 2 ? pr : pc)[r / 2] = row_sum(tr, &sq[r], tr->h_lp, r, T) / n;
		(r % 2 ? rr : rc)[r / 2] = sq[r].ref_lp / n;
	}
	if ((rv = rl_dpo_loss(dc, dr, &st, pc, pr, rc, rr, np, o->dpo_loss, o->dpo_beta, o->label_smoothing)) != 0)
		goto out;
	/* rl_dpo_loss is the mean over these pairs; the update's over all P */
	memset(tr->h_adv, 0, sizeof(float) * (size_t)B * T);
	for (int r = 0; r < B; r++) {
		double d = (r % 2 ? dr : dc)[r / 2] * np / P / (ipo ? sq[r].ntrain : 1);
		for (int j = 0; j < sq[r].s->rlen; j++) {
			int k = r * T + sq[r].s->plen - 1 + j;
			if (!tr->mask_tok[sq[r].toff + j])
				continue;
			/* RPO: the NLL of the chosen tokens, a mean over the update's */
			tr->h_adv[k] = (float)(d - (r % 2 == 0 && o->rpo_alpha > 0 ? o->rpo_alpha / (double)nchosen : 0));
			if (r % 2 == 0) {
				ms->nll -= tr->h_lp[k];
				ms->nll_tok += 1;
			}
			ms->ce -= tr->h_lp[k];
			ms->ntok += 1;
		}
	}
	double s7[7] = { st.loss, st.reward_chosen, st.reward_rejected, st.accuracy, st.margin, st.logp_chosen,
		st.logp_rejected };
	for (int i = 0; i < 7; i++)
		ms->dpo[i] += s7[i] * np;
	ms->npairs += np;
	tr->ops->upload(tr->ops, tr->d_dlp, tr->h_adv, sizeof(float) * (size_t)B * T);
	t0 = rl_now();
	if ((rv = tr->ops->status(tr->ops)) == 0 && (rv = rl_model_backward(tr->m, tr->d_dlp, NULL)) == 0)
		rv = tr->ops->sync(tr->ops);
	tr->t_model += rl_now() - t0;
out:
	free(v);
	return rv;
}

/* ---- rm: a Bradley-Terry reward model (docs/train.md, "Reward models") ----
 * The score of a sequence is the score head (the value head's linear layer,
 * rl_model_add_value_head) on the final hidden state of its last token, as
 * transformers' ...ForSequenceClassification reads the last non-pad token
 * (rl_model_score_index: a trailing EOS that pads is not read);
 * a pair's loss is -log sigmoid(s_chosen - s_rejected), the mean over the
 * update's P pairs.  Rows hold every token (no next-token targets). */
static int
rm_micro(trainer *tr, const seqref *sq, int B, int P, mstat *ms)
{
	rl_ops *ops = tr->ops;
	int T = 0, N, rv;

	for (int r = 0; r < B; r++)
		T = RL_MAX(T, sq[r].s->plen + sq[r].s->rlen);
	N = B * T;
	for (int r = 0; r < B; r++) {
		const rl_sample *s = sq[r].s;
		for (int t = 0; t < T; t++) {
			int n = r * T + t;
			tr->h_tok[n] = t < s->plen ? s->prompt[t] : t < s->plen + s->rlen ? s->response[t - s->plen] : 0;
			tr->h_tgt[n] = -1;
		}
	}
	double t0 = rl_now();
	rv = rl_model_forward(tr->m, NULL, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T, 1.0f);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		return rv;
	ops->download(ops, tr->h_v, tr->m->val, sizeof(float) * (size_t)N);
	if ((rv = ops->status(ops)) != 0)
		return rv;
	memset(tr->h_dv, 0, sizeof(float) * (size_t)N);
	memset(tr->h_adv, 0, sizeof(float) * (size_t)N);
	for (int r = 0; r < B; r += 2) {
		const rl_config *c = &tr->m->cfg;
		int kc = r * T + rl_model_score_index(c, tr->h_tok + r * T, sq[r].s->plen + sq[r].s->rlen);
		int kr = (r + 1) * T + rl_model_score_index(c, tr->h_tok + (r + 1) * T,
		    sq[r + 1].s->plen + sq[r + 1].s->rlen);
		double sc = tr->h_v[kc], sr = tr->h_v[kr], m = sc - sr;
		/* -log sigmoid(m) = log1p(exp(-m)), stable on both sides */
		double loss = m > 0 ? log1p(exp(-m)) : -m + log1p(exp(m));
		double d = -1.0 / (1.0 + exp(m)) / P;   /* d loss / d sc; -d for sr */
		tr->h_dv[kc] = (float)d;
		tr->h_dv[kr] = (float)-d;
		ms->dpo[0] += loss;
		ms->dpo[1] += sc;
		ms->dpo[2] += sr;
		ms->dpo[3] += sc > sr;
		ms->dpo[4] += m;
		ms->npairs += 1;
		ms->ntok += sq[r].s->rlen + sq[r + 1].s->rlen;
	}
	/* the language-model head gets no gradient: dlp 0 */
	ops->upload(ops, tr->d_dlp, tr->h_adv, sizeof(float) * (size_t)N);
	ops->upload(ops, tr->d_dval, tr->h_dv, sizeof(float) * (size_t)N);
	t0 = rl_now();
	if ((rv = ops->status(ops)) == 0 && (rv = rl_model_backward_value(tr->m, tr->d_dlp, NULL, tr->d_dval)) == 0)
		rv = ops->sync(ops);
	tr->t_model += rl_now() - t0;
	return rv;
}

/* The step's E x M updates over pairs (dpo, rm): mini-batches and ranks'
 * shares are whole pairs. */
static int
dpo_update(trainer *tr, mstat *ms, float *gnorm, double *lr, int *nupd)
{
	const rl_train_opts *o = tr->o;
	int NP = tr->nseq / 2, E = RL_MAX(o->ppo_epochs, 1), M = RL_MIN(RL_MAX(o->mini_batches, 1), NP), rv;

	for (int ep = 0; ep < E; ep++) {
		for (int mb = 0; mb < M; mb++) {
			int pa = (int)((long)NP * mb / M), pb = (int)((long)NP * (mb + 1) / M), P = pb - pa;
			int ra = 2 * (pa + (int)((long)P * tr->rank / tr->world));
			int rb = 2 * (pa + (int)((long)P * (tr->rank + 1) / tr->world));
			long nchosen = 0;
			seqref *sq = tr->seq + ra;
			for (int i = 2 * pa; i < 2 * pb; i += 2)
				nchosen += tr->seq[i].ntrain;
			if (ep == 0 && o->algo == RL_ALGO_DPO && (rv = dpo_ref(tr, sq, rb - ra)) != 0)
				return rv;
			int nbd = 0, rounds;
			for (int s = 0; s < rb - ra; nbd++)
				s = dpo_micro_end(tr, sq, s, rb - ra);
			if ((rv = zero2_rounds(tr, nbd, &rounds)) != 0)
				return rv;
			for (int s = 0, k = 0; k < rounds; k++) {
				int e = k < nbd ? dpo_micro_end(tr, sq, s, rb - ra) : s;
				hook_on(tr, k, nbd);
				rv = e == s ? (tr->z3p.zp ? rli_zero3_idle_pass(tr, 1, 0) : RL_OK) : o->algo == RL_ALGO_RM ? rm_micro(tr, sq + s, e - s, P, ms) :
				    dpo_micro(tr, sq + s, e - s, P, RL_MAX(nchosen, 1), ms);
				tr->m->grad_ready = NULL;
				if (rv != 0 || (rv = round_end(tr)) != 0)
					return rv;
				s = e;
			}
			if (tr->world > 1 && !tr->zero && (rv = rli_dp_allreduce_grads(tr)) != 0)
				return rv;
			if ((rv = adamw(tr, gnorm, lr)) != 0)
				return rv;
			(*nupd)++;
		}
	}
	return RL_OK;
}

int
rli_step_update(trainer *tr, int recomputed, mstat *ms, float *gnorm, double *lr, int *nupd)
{
	const rl_train_opts *o = tr->o;
	int E = RL_MAX(o->ppo_epochs, 1), M = RL_MIN(RL_MAX(o->mini_batches, 1), tr->nseq), rv, n, ra, rb, nb, rounds;
	seqref *sq;

	*nupd = 0;
	if (o->algo == RL_ALGO_DPO || o->algo == RL_ALGO_RM)
		return dpo_update(tr, ms, gnorm, lr, nupd);
	for (int ep = 0; ep < E; ep++) {
		for (int mb = 0; mb < M; mb++) {
			int a = (int)((long)tr->nseq * mb / M), b = (int)((long)tr->nseq * (mb + 1) / M);
			/* the weights of the whole mini-batch (global counts), on every rank */
			if ((rv = mini_weights(tr, a, b)) != 0)
				return rv;
			/* this rank's contiguous share of the mini-batch, less what is skipped;
			 * a rank left with nothing still takes part in the all-reduce */
			rank_share(tr, a, b, &ra, &rb);
			if ((rv = trained_seqs(tr, ra, rb, &sq, &n)) != 0)
				return rv;
			if ((rv = micro_plan(tr, sq, n, &sq, &nb)) != 0 || (rv = zero2_rounds(tr, nb, &rounds)) != 0)
				return rv;
			for (int k = 0; k < rounds; k++) {
				/* buckets go out as layers finish (hook_on says after which backward) */
				hook_on(tr, k, nb);
				rv = k < nb ? micro(tr, sq + tr->pbin[k], tr->pbin[k + 1] - tr->pbin[k], recomputed, ms) :
				    tr->z3p.zp ? rli_zero3_idle_pass(tr, 1, ref_in_micro(tr)) : RL_OK;
				tr->m->grad_ready = NULL;
				if (rv != 0 || (rv = round_end(tr)) != 0)
					return rv;
			}
			if (tr->world > 1 && !tr->zero && (rv = rli_dp_allreduce_grads(tr)) != 0)
				return rv;
			if ((rv = adamw(tr, gnorm, lr)) != 0)
				return rv;
			(*nupd)++;
		}
	}
	return RL_OK;
}

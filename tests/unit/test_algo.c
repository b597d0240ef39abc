/* test_algo.c — advantages and loss weights against values computed by hand
 * (the arithmetic is in the comments).  Tolerance 1e-5: float32 results of
 * double sums on O(1) values. */
#include "train/algo.h"
#include "base/core.h"
#include "t.h"

#define TOL 1e-5

int
main(void)
{
	rl_adv_cfg c;
	float adv[8], ret[8], w[8];

	T_BEGIN("test_algo");

	/* GRPO, one group [1,0,0,1]: mean .5, unbiased std sqrt(1/3); adv = +-.5/.57735 */
	{
		float r[] = { 1, 0, 0, 1 };
		int goff[] = { 0, 4 };
		rl_adv_cfg_default(&c, RL_ALGO_GRPO);
		T_EQ_INT(rl_adv_outcome(adv, r, goff, 1, &c), RL_OK);
		T_CLOSE(adv[0], 0.8660254, TOL, 0);
		T_CLOSE(adv[1], -0.8660254, TOL, 0);
		T_CLOSE(adv[3], 0.8660254, TOL, 0);
		/* without std: r - mean */
		c.norm_std = 0;
		rl_adv_outcome(adv, r, goff, 1, &c);
		T_CLOSE(adv[0], 0.5, TOL, 0);
		T_CLOSE(adv[1], -0.5, TOL, 0);
	}
	/* Two groups, one with identical rewards (adv 0, not NaN), one singleton (adv 0). */
	{
		float r[] = { 2, 2, 2, 7 };
		int goff[] = { 0, 3, 4 };
		rl_adv_cfg_default(&c, RL_ALGO_GRPO);
		T_EQ_INT(rl_adv_outcome(adv, r, goff, 2, &c), RL_OK);
		T_CLOSE(adv[0], 0, TOL, 0);
		T_CLOSE(adv[2], 0, TOL, 0);
		T_CLOSE(adv[3], 0, TOL, 0);
		int keep[2];
		T_EQ_INT(rl_groups_with_signal(keep, r, goff, 2), 0);
		float r2[] = { 2, 3, 2, 7 };
		T_EQ_INT(rl_groups_with_signal(keep, r2, goff, 2), 1);
		T_EQ_INT(keep[0], 1);
		T_EQ_INT(keep[1], 0);
	}
	/* Dr. GRPO [1,0,0]: r - 1/3.  RLOO [1,0,0]: 1 - 0 = 1; 0 - (1+0)/2 = -.5 */
	{
		float r[] = { 1, 0, 0 };
		int goff[] = { 0, 3 };
		rl_adv_cfg_default(&c, RL_ALGO_DRGRPO);
		rl_adv_outcome(adv, r, goff, 1, &c);
		T_CLOSE(adv[0], 2.0 / 3, TOL, 0);
		T_CLOSE(adv[2], -1.0 / 3, TOL, 0);
		rl_adv_cfg_default(&c, RL_ALGO_RLOO);
		rl_adv_outcome(adv, r, goff, 1, &c);
		T_CLOSE(adv[0], 1.0, TOL, 0);
		T_CLOSE(adv[1], -0.5, TOL, 0);
		rl_adv_cfg_default(&c, RL_ALGO_PPO);
		T_EQ_INT(rl_adv_outcome(adv, r, goff, 1, &c), RL_EINVAL);
	}
	/* ReMax: r - greedy baseline */
	{
		float r[] = { 1, 0 }, b[] = { 0.25f, 0.25f };
		rl_adv_remax(adv, r, b, 2);
		T_CLOSE(adv[0], 0.75, TOL, 0);
		T_CLOSE(adv[1], -0.25, TOL, 0);
	}
	/* ReMax on token rewards (verl's reward-to-go), toff [0,2,3], rewards [1, 0],
	 * baselines [.25, .5], KL .5*[.2, .4 | 1]: token rewards [-.1, -.2+1 | -.5+0];
	 * to go [.7, .8 | -.5]; minus the baselines [.45, .55 | -1].  (The sequence's
	 * reward less its whole KL would give .45 on both tokens of sequence 0.)
	 * Without KL every token gets r - b: [.75, .75 | -.5]. */
	{
		float r[] = { 1, 0 }, b[] = { 0.25f, 0.5f }, kl[] = { 0.2f, 0.4f, 1.0f };
		int toff[] = { 0, 2, 3 }, bad[] = { 0, 2, 1 };
		T_EQ_INT(rl_adv_remax_tok(adv, r, b, kl, 0.5f, toff, 2), RL_OK);
		T_CLOSE(adv[0], 0.45, TOL, 0);
		T_CLOSE(adv[1], 0.55, TOL, 0);
		T_CLOSE(adv[2], -1.0, TOL, 0);
		T_EQ_INT(rl_adv_remax_tok(adv, r, b, NULL, 0.5f, toff, 2), RL_OK);
		T_OK(adv[0] == 0.75f && adv[1] == 0.75f && adv[2] == -0.5f, "no KL: r - b exactly");
		T_EQ_INT(rl_adv_remax_tok(adv, r, b, NULL, 0, bad, 2), RL_EINVAL);
	}
	/* broadcast */
	{
		float a[] = { 3, -1 };
		int toff[] = { 0, 2, 3 };
		rl_adv_broadcast(adv, a, toff, 2);
		T_CLOSE(adv[0], 3, 0, 0);
		T_CLOSE(adv[1], 3, 0, 0);
		T_CLOSE(adv[2], -1, 0, 0);
	}
	/* REINFORCE++, no KL, gamma 1: returns [1,1 | 0]; whitened: mean 2/3,
	 * unbiased var 1/3 -> [.57735, .57735, -1.1547] */
	{
		float r[] = { 1, 0 };
		int toff[] = { 0, 2, 3 };
		T_EQ_INT(rl_adv_reinforcepp(adv, r, NULL, 0, toff, 2, 1.0f), RL_OK);
		T_CLOSE(adv[0], 0.5773503, TOL, 0);
		T_CLOSE(adv[1], 0.5773503, TOL, 0);
		T_CLOSE(adv[2], -1.1547005, TOL, 0);
		/* with KL .1*[.5,.5,1] and gamma .5: token rewards [-.05, .95 | -.1];
		 * returns [-.05+.5*.95 = .425, .95 | -.1]; whitening is affine, so
		 * (a0-a2)/(a1-a2) = (.425+.1)/(.95+.1) = .5 */
		float kl[] = { 0.5f, 0.5f, 1.0f };
		rl_adv_reinforcepp(adv, r, kl, 0.1f, toff, 2, 0.5f);
		T_CLOSE((adv[0] - adv[2]) / (adv[1] - adv[2]), 0.5, TOL, 0);
		T_CLOSE(adv[0] + adv[1] + adv[2], 0, TOL, 0);
	}
	/* GAE: reward 1, values [.5,.25], gamma .9, lambda .5:
	 * t1: delta = 1 - .25 = .75 = A1, ret1 = 1;  t0: delta = .9*.25 - .5 = -.275,
	 * A0 = -.275 + .45*.75 = .0625, ret0 = .5625; adv whitened: [-.7071, .7071] */
	{
		float r[] = { 1 }, v[] = { 0.5f, 0.25f };
		int toff[] = { 0, 2 };
		T_EQ_INT(rl_adv_gae(adv, ret, r, NULL, 0, v, toff, 1, 0.9f, 0.5f, 1), RL_OK);
		T_CLOSE(ret[0], 0.5625, TOL, 0);
		T_CLOSE(ret[1], 1.0, TOL, 0);
		T_CLOSE(adv[0], -0.7071068, TOL, 0);
		T_CLOSE(adv[1], 0.7071068, TOL, 0);
		/* the same without whitening: the raw GAE values */
		T_EQ_INT(rl_adv_gae(adv, ret, r, NULL, 0, v, toff, 1, 0.9f, 0.5f, 0), RL_OK);
		T_CLOSE(adv[0], 0.0625, TOL, 0);
		T_CLOSE(adv[1], 0.75, TOL, 0);
		T_CLOSE(ret[0], 0.5625, TOL, 0);
	}
	/* GAE over two sequences (toff [0,1,3]) with the KL in the reward, gamma =
	 * lambda = 1: rewards [1, 0], values [.5 | .2, .4], kl [.1 | .2, .3], coef .5.
	 * seq 0 (one token): r = 1 - .05 = .95, A = .95 - .5 = .45, ret = .95.
	 * seq 1: t2 (last): r = -.15, A2 = -.15 - .4 = -.55, ret2 = -.15;
	 *        t1: r = -.1, delta = -.1 + .4 - .2 = .1, A1 = .1 - .55 = -.45,
	 *        ret1 = -.25 (= r1 + r2: lambda 1 makes returns Monte Carlo). */
	{
		float r[] = { 1, 0 }, v[] = { 0.5f, 0.2f, 0.4f }, kl[] = { 0.1f, 0.2f, 0.3f };
		int toff[] = { 0, 1, 3 };
		T_EQ_INT(rl_adv_gae(adv, ret, r, kl, 0.5f, v, toff, 2, 1.0f, 1.0f, 0), RL_OK);
		T_CLOSE(adv[0], 0.45, TOL, 0);
		T_CLOSE(adv[1], -0.45, TOL, 0);
		T_CLOSE(adv[2], -0.55, TOL, 0);
		T_CLOSE(ret[0], 0.95, TOL, 0);
		T_CLOSE(ret[1], -0.25, TOL, 0);
		T_CLOSE(ret[2], -0.15, TOL, 0);
		/* lambda 0: one-step TD, A1 = delta1 = .1 */
		T_EQ_INT(rl_adv_gae(adv, ret, r, kl, 0.5f, v, toff, 2, 1.0f, 0.0f, 0), RL_OK);
		T_CLOSE(adv[1], 0.1, TOL, 0);
		T_CLOSE(ret[1], 0.3, TOL, 0);
		int bad[] = { 0, 2, 1 };
		T_EQ_INT(rl_adv_gae(adv, ret, r, kl, 0.5f, v, bad, 2, 1.0f, 1.0f, 0), RL_EINVAL);
	}
	/* Clipped value loss, clip .5, weights [.5, .5, 1, 1, 0]:
	 *  n0 v 1, old .8, ret 0: vc = 1 (in range), tie -> unclipped: l = .5, dv = .5*1 = .5
	 *  n1 v 0, old .6, ret 1: vc = .1; (v-ret)^2 = 1 > .81: l = .5, dv = .5*(-1) = -.5
	 *  n2 v 2, old 1, ret 0: vc = 1.5; 4 > 2.25: l = 2, dv = 2
	 *  n3 v 2, old 1, ret 2.5: vc = 1.5; .25 < 1: clipped, l = .5, dv = 0 (counted)
	 *  n4 w 0: ignored (garbage inputs)
	 * loss = .25 + .25 + 2 + .5 = 3; without clipping n3 is .5*.25 = .125, dv -.5 */
	{
		float v[] = { 1, 0, 2, 2, 9 }, old[] = { 0.8f, 0.6f, 1, 1, NAN }, rt[] = { 0, 1, 0, 2.5f, 0 };
		float ww[] = { 0.5f, 0.5f, 1, 1, 0 }, dv[5];
		int nc = -1;
		T_CLOSE(rl_value_loss(dv, v, old, rt, ww, 5, 0.5f, &nc), 3.0, TOL, 0);
		T_EQ_INT(nc, 1);
		T_CLOSE(dv[0], 0.5, TOL, 0);
		T_CLOSE(dv[1], -0.5, TOL, 0);
		T_CLOSE(dv[2], 2.0, TOL, 0);
		T_CLOSE(dv[3], 0.0, 0, 0);
		T_CLOSE(dv[4], 0.0, 0, 0);
		T_CLOSE(rl_value_loss(dv, v, old, rt, ww, 5, 0, &nc), 2.625, TOL, 0);
		T_EQ_INT(nc, 0);
		T_CLOSE(dv[3], -0.5, TOL, 0);
		/* explained variance: ret [0, 2], v [0, 1]: 1 - var([0,1]) / var([0,2]) = .75 */
		float ev_v[] = { 0, 1 }, ev_r[] = { 0, 2 }, flat[] = { 1, 1 };
		T_CLOSE(rl_explained_var(ev_v, ev_r, 2), 0.75, TOL, 0);
		T_OK(isnan(rl_explained_var(ev_v, flat, 2)), "constant returns: NaN");
	}
	/* Loss weights, toff [0,2,5,5]: 2 non-empty sequences of 2 and 3 tokens. */
	{
		int toff[] = { 0, 2, 5, 5 };
		rl_loss_weights(w, toff, 3, RL_AGG_TOKEN_MEAN, 0);
		T_CLOSE(w[0], 0.2, TOL, 0);
		T_CLOSE(w[4], 0.2, TOL, 0);
		rl_loss_weights(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_SUM, 0);
		T_CLOSE(w[0], 0.5, TOL, 0);
		T_CLOSE(w[4], 0.5, TOL, 0);
		rl_loss_weights(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_MEAN, 0);
		T_CLOSE(w[0], 0.25, TOL, 0);
		T_CLOSE(w[4], 1.0 / 6, TOL, 0);
		rl_loss_weights(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 4);
		T_CLOSE(w[1], 0.125, TOL, 0);
		T_EQ_INT(rl_loss_weights(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 0), RL_EINVAL);
	}
	/* Masked (loss_mask): toff [0,2,5,7]; sequence 0 keeps token 1, sequence 1 keeps
	 * tokens 2 and 4, sequence 2 keeps none: 3 counted tokens in 2 sequences */
	{
		int toff[] = { 0, 2, 5, 7 };
		const uint8_t mk[] = { 0, 1, 1, 0, 1, 0, 0 };
		const uint8_t ones[] = { 1, 1, 1, 1, 1, 1, 1 };
		float w2[7];
		rl_loss_weights_masked(w, toff, 3, RL_AGG_TOKEN_MEAN, 0, mk);
		T_CLOSE(w[1], 1.0 / 3, TOL, 0);
		T_CLOSE(w[4], 1.0 / 3, TOL, 0);
		T_OK(w[0] == 0 && w[3] == 0 && w[5] == 0 && w[6] == 0, "masked tokens weigh 0");
		rl_loss_weights_masked(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_SUM, 0, mk);
		T_CLOSE(w[1], 0.5, TOL, 0);
		T_CLOSE(w[2], 0.5, TOL, 0);
		rl_loss_weights_masked(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_MEAN, 0, mk);
		T_CLOSE(w[1], 0.5, TOL, 0);
		T_CLOSE(w[2], 0.25, TOL, 0);
		T_OK(w[3] == 0, "masked");
		rl_loss_weights_masked(w, toff, 3, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 4, mk);
		T_CLOSE(w[2], 0.125, TOL, 0);
		/* all ones: the unmasked weights, bit for bit */
		for (int a = RL_AGG_TOKEN_MEAN; a <= RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM; a++) {
			rl_loss_weights_masked(w, toff, 3, a, 4, ones);
			rl_loss_weights(w2, toff, 3, a, 4);
			T_OK(memcmp(w, w2, sizeof w2) == 0, "agg %d: all-ones mask = no mask", a);
		}
	}
	/* names */
	T_EQ_INT(rl_algo_parse("dr-grpo"), RL_ALGO_DRGRPO);
	T_EQ_INT(rl_algo_parse("reinforce++"), RL_ALGO_REINFORCEPP);
	T_EQ_INT(rl_algo_parse("nope"), -1);
	T_EQ_INT(rl_agg_parse("seq-mean-token-sum-norm"), RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
	T_EQ_STR(rl_algo_name(RL_ALGO_RLOO), "rloo");
	{
		float x[] = { 1, NAN, 3 };
		rl_stat3 st = rl_stat_f32(x, 3);
		T_CLOSE(st.mean, 2, 0, 0);
		T_EQ_INT(st.n, 2);
	}
	/* schedule: warmup 10 steps to 1e-3, cosine to 0.1x at step 110 */
	T_CLOSE(rl_lr_at(5, 1e-3, 10, 110, RL_SCHED_COSINE, 0.1), 5e-4, 1e-12, 1e-9);
	T_CLOSE(rl_lr_at(10, 1e-3, 10, 110, RL_SCHED_COSINE, 0.1), 1e-3, 1e-12, 1e-9);
	T_CLOSE(rl_lr_at(60, 1e-3, 10, 110, RL_SCHED_COSINE, 0.1), 0.55e-3, 1e-12, 1e-9);
	T_CLOSE(rl_lr_at(110, 1e-3, 10, 110, RL_SCHED_COSINE, 0.1), 1e-4, 1e-12, 1e-9);
	T_CLOSE(rl_lr_at(500, 1e-3, 10, 110, RL_SCHED_COSINE, 0.1), 1e-4, 1e-12, 1e-9);
	T_CLOSE(rl_lr_at(500, 1e-3, 0, 0, RL_SCHED_CONSTANT, 0), 1e-3, 0, 0);
	/* multi-turn: sequence 0 = [s s o o s o] (s sampled, o inserted), token
	 * rewards .5 at t=2 (inserted, goes to t=1), 1 at t=5 (inserted, goes to
	 * t=4), .25 at t=4; outcome 2 at t=4 (the last sampled token).  Sequence
	 * 1 = [o s]: a token reward of 3 at t=0 goes to the first sampled (t=1),
	 * outcome 1 there.  Sequence 2 = [o o]: nothing sampled, all 0. */
	{
		uint8_t mk[] = { 1, 1, 0, 0, 1, 0, 0, 1, 0, 0 };
		float tokrew[] = { 0, 0, .5f, 0, .25f, 1, 3, 0, 7, 7 }, reward[] = { 2, 1, 5 };
		float kl[] = { .1f, .2f, 9, 9, .3f, 9, 9, .4f, 9, 9 }, tr[10], a[10], rt[10];
		float vals[] = { 1, 2, 50, 60, 3, 70, 80, 4, 90, 90 };
		int toff[] = { 0, 6, 8, 10 };
		T_EQ_INT(rl_tok_rewards(tr, reward, tokrew, NULL, 0, toff, 3, mk), RL_OK);
		float want[] = { 0, .5f, 0, 0, 3.25f, 0, 0, 4, 0, 0 };
		for (int t = 0; t < 10; t++)
			T_CLOSE(tr[t], want[t], TOL, 0);
		/* KL at sampled tokens only: -coef * kl */
		T_EQ_INT(rl_tok_rewards(tr, reward, tokrew, kl, 0.5f, toff, 3, mk), RL_OK);
		T_CLOSE(tr[0], -0.05, TOL, 0);
		T_CLOSE(tr[1], 0.4, TOL, 0);
		T_CLOSE(tr[4], 3.1, TOL, 0);
		T_CLOSE(tr[7], 3.8, TOL, 0);
		T_CLOSE(tr[5], 0, TOL, 0);
		/* reward-to-go, gamma .5, over the sampled tokens of sequence 0:
		 * R4 = 3.25, R1 = .5 + .5*3.25 = 2.125, R0 = 0 + .5*2.125 = 1.0625 */
		rl_tok_rewards(tr, reward, tokrew, NULL, 0, toff, 3, mk);
		T_EQ_INT(rl_adv_rtg_masked(a, tr, NULL, toff, 3, 0.5f, mk), RL_OK);
		T_CLOSE(a[4], 3.25, TOL, 0);
		T_CLOSE(a[1], 2.125, TOL, 0);
		T_CLOSE(a[0], 1.0625, TOL, 0);
		T_CLOSE(a[2], 0, TOL, 0);
		T_CLOSE(a[7], 4, TOL, 0);
		/* GAE, gamma .5, lambda .5, V = 1, 2, (50, 60), 3, (70):
		 * t4: delta = 3.25 - 3 = .25, A = .25, ret 3.25
		 * t1: delta = .5 + .5*3 - 2 = 0, A = 0 + .25*.25 = .0625, ret 2.0625
		 * t0: delta = 0 + .5*2 - 1 = 0, A = .25*.0625 = .015625 */
		T_EQ_INT(rl_adv_gae_masked(a, rt, tr, vals, toff, 3, 0.5f, 0.5f, mk), RL_OK);
		T_CLOSE(a[4], .25, TOL, 0);
		T_CLOSE(rt[4], 3.25, TOL, 0);
		T_CLOSE(a[1], .0625, TOL, 0);
		T_CLOSE(rt[1], 2.0625, TOL, 0);
		T_CLOSE(a[0], .015625, TOL, 0);
		T_CLOSE(a[2], 0, TOL, 0);
		T_CLOSE(rt[2], 50, TOL, 0);
		/* sequence 1: t7: delta = 4 - 4 = 0 */
		T_CLOSE(a[7], 0, TOL, 0);
		/* the old entry points agree with the masked ones without a mask */
		float b1[10], b2[10];
		T_EQ_INT(rl_adv_reinforcepp(b1, reward, kl, 0.5f, toff, 3, 0.9f), RL_OK);
		rl_tok_rewards(b2, reward, NULL, kl, 0.5f, toff, 3, NULL);
		rl_adv_rtg_masked(b2, b2, NULL, toff, 3, 0.9f, NULL);
		rl_whiten_masked(b2, 10, NULL);
		for (int t = 0; t < 10; t++)
			T_CLOSE(b1[t], b2[t], 1e-6, 0);
		/* masked whitening: x = 1, 3 on the sampled tokens: mean 2, std
		 * sqrt(2) -> -+.70711; inserted tokens 0 */
		float x[] = { 1, 100, 3, -100 };
		uint8_t m2[] = { 1, 0, 1, 0 };
		rl_whiten_masked(x, 4, m2);
		T_CLOSE(x[0], -0.7071068, TOL, 0);
		T_CLOSE(x[2], 0.7071068, TOL, 0);
		T_CLOSE(x[1], 0, 0, 0);
		T_CLOSE(x[3], 0, 0, 0);
		int bad[] = { 0, 3, 2 };
		T_EQ_INT(rl_tok_rewards(tr, reward, NULL, NULL, 0, bad, 2, NULL), RL_EINVAL);
	}

	T_END();
}

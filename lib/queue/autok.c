/*
 * autok.c — the --max-staleness auto rule (see autok.h for the rule and its
 * reasons).
 *
 * Leaves out: the measurements' sources and the gate (autok.h).
 */
#include "queue/autok.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void
rl_autok_config_default(rl_autok_config *c, uint32_t kmax)
{
	memset(c, 0, sizeof *c);
	c->kmax = kmax;
	c->hold = 3;
	c->bubble = 0.05;
	c->drift_low = 0.01;
	c->drift_high = 0.03;
}

void
rl_autok_init(rl_autok *a, const rl_autok_config *c, uint32_t k0)
{
	memset(a, 0, sizeof *a);
	a->cfg = *c;
	if (a->cfg.hold == 0)
		a->cfg.hold = 1;
	a->k = k0 < c->kmax ? k0 : c->kmax;
	a->train_idle = a->gen_idle = a->bubble = a->drift = a->need = a->from_bubble = NAN;
}

/* idle / (busy + idle) over the window, NaN without time */
static double
idle_frac(double busy, double idle)
{
	return busy + idle > 0 ? idle / (busy + idle) : NAN;
}

/* The K steps of a raise.  After an earlier raise from K0 (whose window
 * measured bubble b0) to K now (bubble b), each step of K bought
 * (b0 - b) / (K - K0) of the bubble: the raise that brings it to the
 * threshold, extrapolated on that line, is ceil((b - threshold) / slope).
 * With no earlier raise to measure, or one that bought nothing measurable,
 * one step.  At least 1, at most room. */
static uint32_t
raise_by(rl_autok *a, uint32_t room)
{
	double up = 1, slope;

	a->need = NAN;
	if (!isnan(a->from_bubble) && a->from_k < a->k) {
		slope = (a->from_bubble - a->bubble) / (double)(a->k - a->from_k);
		if (slope > 0.01) {   /* under 1 % a step is noise: too flat to extrapolate */
			a->need = (a->bubble - a->cfg.bubble) / slope;
			up = fmax(1, ceil(a->need - 1e-9));
		}
	}
	return up < (double)room ? (uint32_t)up : room;
}

/* The window's measurements from the totals' differences d (t - base). */
static void
measure(rl_autok *a, const rl_autok_totals *d)
{
	/* generation the bound then dropped was time lost all the same */
	a->waste = d->dropped + d->trained > 0 ? d->dropped / (d->dropped + d->trained) : 0;
	a->train_idle = idle_frac(d->train_busy, d->train_idle);
	a->gen_idle = idle_frac(d->gen_busy * (1 - a->waste), d->gen_idle + d->gen_busy * a->waste);
	a->bubble = fmin(a->train_idle, a->gen_idle);
	if (isnan(a->train_idle) || isnan(a->gen_idle))
		a->bubble = NAN;
	a->drift = d->drift_n > 0 ? d->drift_sum / d->drift_n : NAN;
}

/* A window shorter than the hold closes when it leaves no doubt: a bubble
 * over twice the threshold and a drift under half LO, with K free to rise
 * and no lowering to confirm.  Each such step at a K that leaves the
 * bottleneck waiting is throughput lost; the full hold is for the
 * windows near a threshold, where one step says little. */
static int
clear_raise(const rl_autok *a, const rl_autok_totals *d)
{
	rl_autok w = *a;

	measure(&w, d);
	return !a->lowered && a->k < a->cfg.kmax && w.bubble > 2 * a->cfg.bubble &&
	    w.drift < a->cfg.drift_low / 2;
}

int
rl_autok_update(rl_autok *a, const rl_autok_totals *t)
{
	const rl_autok_totals *b = &a->base;
	rl_autok_totals d;
	uint32_t k = a->k, up;

	if (!a->have_base) {
		a->base = *t;
		a->have_base = 1;
		return 0;
	}
	/* the step after a change is the pipeline filling (or draining) to the
	 * new K: it measures neither K, so the next window starts after it */
	if (a->settle) {
		if (t->version >= b->version + 1) {
			a->base = *t;
			a->settle = 0;
		}
		return 0;
	}
	if (t->version < b->version + 1)
		return 0;
	d.version = t->version - b->version;
	d.train_busy = t->train_busy - b->train_busy, d.train_idle = t->train_idle - b->train_idle;
	d.gen_busy = t->gen_busy - b->gen_busy, d.gen_idle = t->gen_idle - b->gen_idle;
	d.drift_n = t->drift_n - b->drift_n, d.drift_sum = t->drift_sum - b->drift_sum;
	d.trained = t->trained - b->trained, d.dropped = t->dropped - b->dropped;
	if (d.train_busy < 0 || d.train_idle < 0 || d.gen_busy < 0 || d.gen_idle < 0 || d.drift_n < 0 ||
	    d.trained < 0 || d.dropped < 0) {
		a->base = *t;
		snprintf(a->why, sizeof a->why, "worker totals went back (a worker left): new window");
		return 0;
	}
	if (d.version < a->cfg.hold && !clear_raise(a, &d))
		return 0;
	a->base = *t;
	a->windows++;
	measure(a, &d);
	a->need = NAN;
	if (isnan(a->drift) || isnan(a->bubble)) {
		snprintf(a->why, sizeof a->why, "no %s reported: K stays %u",
		    isnan(a->drift) ? "drift (actor/ppo_kl)" : "busy/idle time of the trainer and the rollout workers", k);
		a->calm = 0;
		return 0;
	}
	if (a->drift > a->cfg.drift_high && k > 0) {
		a->k = k - 1;
		a->lowered = 1;
		a->calm = 0;
		a->from_bubble = NAN;   /* what a raise bought before no longer holds */
		snprintf(a->why, sizeof a->why, "drift %.4g above %.4g: K %u -> %u", a->drift, a->cfg.drift_high, k, a->k);
	} else if (a->drift < a->cfg.drift_low && a->bubble > a->cfg.bubble && k < a->cfg.kmax) {
		/* after a lowering, the drift must stay low for two windows in a
		 * row: one calm window right after the lowering is the lower K's doing */
		if (++a->calm < (a->lowered ? 2 : 1)) {
			snprintf(a->why, sizeof a->why, "bubble %.3f, drift %.4g: K stays %u until a second calm window",
			    a->bubble, a->drift, k);
			return 0;
		}
		up = raise_by(a, a->cfg.kmax - k);
		a->from_k = k;
		a->from_bubble = a->bubble;
		a->k = k + up;
		a->calm = 0;
		a->lowered = 0;
		snprintf(a->why, sizeof a->why, "bubble %.3f (trainer idle %.3f, rollout idle %.3f) above %.3f, "
		    "drift %.4g below %.4g: K %u -> %u", a->bubble, a->train_idle, a->gen_idle, a->cfg.bubble,
		    a->drift, a->cfg.drift_low, k, a->k);
		if (!isnan(a->need))
			snprintf(a->why + strlen(a->why), sizeof a->why - strlen(a->why), " (%.3g steps to the threshold)",
			    a->need);
	} else {
		a->calm = 0;
		snprintf(a->why, sizeof a->why, "bubble %.3f, drift %.4g: K stays %u", a->bubble, a->drift, k);
		return 0;
	}
	a->changes++;
	a->settle = 1;
	return 1;
}

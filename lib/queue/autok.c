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
	c->bubble = 0.1;
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
	a->train_idle = a->gen_idle = a->bubble = a->drift = NAN;
}

/* idle / (busy + idle) over the window, NaN without time */
static double
idle_frac(double busy, double idle)
{
	return busy + idle > 0 ? idle / (busy + idle) : NAN;
}

int
rl_autok_update(rl_autok *a, const rl_autok_totals *t)
{
	const rl_autok_totals *b = &a->base;
	double tb, ti, gb, gi, dn, ds, dt, dd, waste;
	uint32_t k = a->k;

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
	if (t->version < b->version + a->cfg.hold)
		return 0;
	tb = t->train_busy - b->train_busy, ti = t->train_idle - b->train_idle;
	gb = t->gen_busy - b->gen_busy, gi = t->gen_idle - b->gen_idle;
	dn = t->drift_n - b->drift_n;
	ds = t->drift_sum - b->drift_sum;
	dt = t->trained - b->trained;
	dd = t->dropped - b->dropped;
	a->base = *t;   /* b is &a->base: every difference is taken above */
	if (tb < 0 || ti < 0 || gb < 0 || gi < 0 || dn < 0 || dt < 0 || dd < 0) {
		snprintf(a->why, sizeof a->why, "worker totals went back (a worker left): new window");
		return 0;
	}
	a->windows++;
	a->train_idle = idle_frac(tb, ti);
	/* generation the bound then dropped was time lost all the same */
	waste = dd + dt > 0 ? dd / (dd + dt) : 0;
	a->waste = waste;
	a->gen_idle = idle_frac(gb * (1 - waste), gi + gb * waste);
	a->bubble = fmin(a->train_idle, a->gen_idle);
	if (isnan(a->train_idle) || isnan(a->gen_idle))
		a->bubble = NAN;
	a->drift = dn > 0 ? ds / dn : NAN;
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
		snprintf(a->why, sizeof a->why, "drift %.4g above %.4g: K %u -> %u", a->drift, a->cfg.drift_high, k, a->k);
	} else if (a->drift < a->cfg.drift_low && a->bubble > a->cfg.bubble && k < a->cfg.kmax) {
		/* after a lowering, the drift must stay low for two windows in a
		 * row: one calm window right after the lowering is the lower K's doing */
		if (++a->calm < (a->lowered ? 2 : 1)) {
			snprintf(a->why, sizeof a->why, "bubble %.3f, drift %.4g: K stays %u until a second calm window",
			    a->bubble, a->drift, k);
			return 0;
		}
		a->k = k + 1;
		a->calm = 0;
		a->lowered = 0;
		snprintf(a->why, sizeof a->why, "bubble %.3f (trainer idle %.3f, rollout idle %.3f) above %.3f, "
		    "drift %.4g below %.4g: K %u -> %u", a->bubble, a->train_idle, a->gen_idle, a->cfg.bubble,
		    a->drift, a->cfg.drift_low, k, a->k);
	} else {
		a->calm = 0;
		snprintf(a->why, sizeof a->why, "bubble %.3f, drift %.4g: K stays %u", a->bubble, a->drift, k);
		return 0;
	}
	a->changes++;
	a->settle = 1;
	return 1;
}

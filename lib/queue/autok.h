/*
 * autok.h — the rule of `rl-queue serve --max-staleness auto[:MAX]`: the
 * staleness bound K chosen between 0 and MAX from what the broker measures.
 *
 * Inputs, as running totals (the rule takes their differences over a window):
 * the trainer version (steps), the busy and idle seconds of the trainers and
 * of the rollout workers (their stats reports, wstat.h), and the sum and count
 * of the |actor/ppo_kl| of the trainer's steps (the policy drift).
 *
 * The rule, once per window of at least `hold` trainer steps (or of one
 * step when it is clear, below):
 *   bubble = min(trainer idle fraction, rollout idle fraction), where the
 *            rollout workers' time spent on samples the bound then dropped
 *            (dropped / (dropped + trained) of their busy time) counts as
 *            idle: generation the bound threw away
 *   drift  = mean |ppo_kl| of the window's steps
 *   drift > drift_high and K > 0                 -> K - 1
 *   drift < drift_low, bubble > bubble, K < MAX  -> K + n (after a lowering
 *                                                   n = 1, and only on a second
 *                                                   such window in a row)
 *   otherwise                                    -> K stays
 *   n: 1 on the first raise; later, the line through the last raise's two
 *      windows (K0, b0) -> (K, b) extrapolated to the threshold:
 *      ceil((b - bubble) / ((b0 - b) / (K - K0))), at least 1, at most
 *      MAX - K (1 when the raise bought under 0.01 a step of K)
 *   clear: a window closes after one step when its bubble is over twice the
 *      threshold and its drift under half drift_low (not after a lowering)
 * Why n: the first raise measures what a step of K buys on this workload;
 * going on one step a window took MAX windows of `hold` steps (plus the
 * settling step each) on a workload that needs MAX, each step at a K that
 * leaves the bottleneck waiting.  Why the clear window: a bubble of twice the
 * threshold over a whole step is no measurement noise; the full hold is for
 * the windows near a threshold.  Neither touches the lowering, which stays
 * one step per full window.
 * Why the smaller of the two idle fractions: K lets the generators run ahead
 * of the trainer, which removes the time each side waits for the other; the
 * slower side (the bottleneck, busy nearly all the time) sets the throughput,
 * and its idle time is what K can give back.  When one side is busy all the
 * time, a larger K buys nothing but older samples.  The dead bands (drift
 * between the two thresholds, a bubble under its threshold) and the window of
 * `hold` steps after every decision are the hysteresis: a change is measured
 * over whole steps at the new K before the next one, and the step right
 * after a change (the pipeline filling or draining to the new K) is left
 * out of every window.  A window without the
 * measurements (no trainer or rollout reports, no ppo_kl) changes nothing.
 * The bubble threshold (0.05 by default) is what the rule leaves on the
 * table: a bubble under it costs at most that share of the bottleneck's
 * time, and 5 % is the margin auto K is held to against the best fixed K.
 *
 * Leaves out: the broker's gate itself (queue.c enforces whatever K is in
 * force), where the totals come from (qserve_workers.c), logging (qserve.c).
 * No I/O, no clock: a plain state machine, so a simulated run tests it.
 */
#ifndef RL_AUTOK_H
#define RL_AUTOK_H

#include <stdint.h>

typedef struct rl_autok_config {
	uint32_t kmax;        /* MAX */
	uint32_t hold;        /* trainer steps per window (default 3) */
	double bubble;        /* raise above this bottleneck idle fraction (default 0.05) */
	double drift_low;     /* raise only below this mean |ppo_kl| (default 0.01) */
	double drift_high;    /* lower above this (default 0.03) */
} rl_autok_config;
void rl_autok_config_default(rl_autok_config *c, uint32_t kmax);

typedef struct rl_autok_totals {
	double version;                  /* trainer version */
	double train_busy, train_idle;   /* seconds, summed over the trainers */
	double gen_busy, gen_idle;       /* seconds, summed over the rollout workers */
	double drift_sum, drift_n;       /* sum of |ppo_kl| over the trainer's steps, and their count */
	double trained, dropped;         /* samples trained, and dropped or regenerated as stale */
} rl_autok_totals;

typedef struct rl_autok {
	rl_autok_config cfg;
	uint32_t k;
	int have_base, lowered, calm, settle;
	rl_autok_totals base;
	uint64_t changes, windows;
	/* the last window's measurements (NaN when it had none) */
	double train_idle, gen_idle, bubble, drift, waste;
	double need;     /* the last raise's extrapolated steps of K to the threshold (NaN: none) */
	uint32_t from_k;      /* the last raise: from this K ... */
	double from_bubble;   /* ... on this bubble (NaN: none since the start or a lowering) */
	char why[192];   /* the last decision, for the log and the stats */
} rl_autok;

/* Starts at K = k0 (clamped to kmax). */
void rl_autok_init(rl_autok *a, const rl_autok_config *c, uint32_t k0);

/* Takes the totals now.  Returns 1 when a window closed with a new K (a->k;
 * a->why says why), 0 otherwise (a->why says why when a window closed).
 * Totals that went backwards (a worker dropped from the table) start a new
 * window. */
int rl_autok_update(rl_autok *a, const rl_autok_totals *t);

#endif

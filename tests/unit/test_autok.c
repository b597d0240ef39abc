/* test_autok.c — the --max-staleness auto rule (queue/autok.h): the rule on
 * hand-made windows (thresholds, dead bands, hysteresis, MAX, missing
 * measurements, totals that go back), then on a simulated run through the
 * broker's state machine (queue.h, fake clock): a slow trainer, then a slow
 * generator, then a growing drift.  K moves as autok.h documents, and at every
 * lease the trainer gets no sample older than v - K for the K in force then.
 * Then an engine of 8 slots on a long tail: with the rollout side's busy time
 * counted by slot occupancy K rises past 1, counted whole it stays at 1.
 * Last, a K change is journaled: replayed under auto, ignored under a fixed K. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/io.h"
#include "queue/autok.h"
#include "queue/queue.h"
#include "stream/traj.h"
#include "qbatch.h"
#include "t.h"

/* ---- the rule on hand-made windows ---------------------------------------------- */

/* totals after `steps` more steps with these busy/idle seconds and drift */
static void
window(rl_autok_totals *t, int steps, double tb, double ti, double gb, double gi, double drift)
{
	t->version += steps;
	t->train_busy += tb;
	t->train_idle += ti;
	t->gen_busy += gb;
	t->gen_idle += gi;
	t->drift_sum += steps * drift;
	t->drift_n += steps;
}

/* the step after a change is left out: one step, no decision */
static void
settle(rl_autok *a, rl_autok_totals *t)
{
	window(t, 1, 100, 100, 100, 100, 1.0);   /* what it measures does not count */
	T_EQ_INT(rl_autok_update(a, t), 0);
	T_EQ_INT(a->settle, 0);
}

static void
test_rule(void)
{
	rl_autok_config c;
	rl_autok a;
	rl_autok_totals t = { 0 };

	rl_autok_config_default(&c, 2);
	rl_autok_init(&a, &c, 0);
	T_EQ_INT(a.k, 0);
	T_EQ_INT(rl_autok_update(&a, &t), 0);           /* the first call only sets the base */
	/* two steps: no window yet (hold 3; a drift of 0.007 is below LO but
	 * not under half of it, so the window is not clear enough to close early) */
	window(&t, 2, 1, 3, 1, 3, 0.007);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.windows, 0);
	/* the third step closes it: bubble min(6/8, 6/8), drift low: K 0 -> 1
	 * (the first raise is by one: nothing measured yet says what K buys) */
	window(&t, 1, 1, 3, 1, 3, 0.007);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 1);
	T_CLOSE(a.bubble, 0.75, 1e-12, 0);
	T_OK(isnan(a.need));
	T_OK(strstr(a.why, "K 0 -> 1") != NULL);
	settle(&a, &t);
	/* one side busy all the time: no bubble K could remove, K stays */
	window(&t, 3, 10, 0, 2, 8, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 1);
	T_CLOSE(a.bubble, 0.0, 1e-12, 0);
	/* drift in the dead band: K stays whatever the bubble */
	window(&t, 3, 5, 5, 5, 5, 0.02);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 1);
	T_CLOSE(a.drift, 0.02, 1e-12, 0);
	/* generators busy all the time, but a third of what they made was dropped
	 * as stale: that third of their time counts as idle, a bubble of 1/3 */
	t.trained += 20;
	t.dropped += 10;
	window(&t, 3, 5, 5, 9, 0, 0.02);
	T_EQ_INT(rl_autok_update(&a, &t), 0);   /* drift in the dead band */
	T_CLOSE(a.waste, 1.0 / 3, 1e-12, 0);
	T_CLOSE(a.gen_idle, 1.0 / 3, 1e-12, 0);
	T_CLOSE(a.bubble, 1.0 / 3, 1e-12, 0);
	/* a bubble at the threshold (0.05), not above it: K stays */
	window(&t, 3, 19, 1, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 1);
	/* a large bubble and low drift again: the raise 0 -> 1 took the bubble
	 * from 0.75 to 0.5, 0.25 a step; 0.45 to go is 1.8 steps: K + 2, which
	 * MAX cuts to K + 1 */
	window(&t, 3, 5, 5, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 2);
	T_CLOSE(a.need, 1.8, 1e-9, 0);
	settle(&a, &t);
	window(&t, 3, 5, 5, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 2);
	/* drift above HI: down by one per window, to 0 and no further */
	window(&t, 3, 5, 5, 5, 5, 0.05);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 1);
	T_OK(strstr(a.why, "drift") != NULL);
	settle(&a, &t);
	window(&t, 3, 5, 5, 5, 5, 0.05);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 0);
	settle(&a, &t);
	window(&t, 3, 5, 5, 5, 5, 0.05);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 0);
	/* hysteresis after a lowering: the first calm window does not raise K,
	 * the second in a row does */
	window(&t, 3, 5, 5, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 0);
	window(&t, 3, 5, 5, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 1);
	settle(&a, &t);
	/* no drift reported (no ppo_kl): nothing changes */
	t.version += 3;
	t.train_idle += 5;
	t.gen_idle += 5;
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 1);
	T_OK(isnan(a.drift));
	/* a worker left the table: its totals went, the window starts over */
	t.version += 3;
	t.gen_busy -= 1;
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_OK(strstr(a.why, "new window") != NULL);
	T_EQ_INT(a.changes, 5);

	/* k0 above MAX is clamped */
	rl_autok_config_default(&c, 1);
	rl_autok_init(&a, &c, 7);
	T_EQ_INT(a.k, 1);
}

/* The moves that reach the K a workload needs sooner: a bubble above the
 * threshold but under the old 0.1, a window closed after one clear step,
 * a raise sized from what the last one bought; and what they leave alone:
 * the lowering, the hold after it, the bound MAX. */
static void
test_fast(void)
{
	rl_autok_config c;
	rl_autok a;
	rl_autok_totals t = { 0 };

	rl_autok_config_default(&c, 4);
	T_CLOSE(c.bubble, 0.05, 0, 0);
	rl_autok_init(&a, &c, 0);
	rl_autok_update(&a, &t);
	/* a bubble of 0.08: one step is not clear (not over twice the threshold),
	 * the full window raises */
	window(&t, 1, 11.5, 1, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.windows, 0);
	window(&t, 2, 23, 2, 10, 10, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_CLOSE(a.bubble, 0.08, 1e-12, 0);
	T_EQ_INT(a.k, 1);
	settle(&a, &t);
	/* a clear bubble (0.5 over one step, drift under LO/2): the window closes
	 * after that step; the raise 0 -> 1 bought nothing (0.08 then, 0.5 now):
	 * by one */
	window(&t, 1, 1, 1, 1, 1, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.windows, 2);
	T_EQ_INT(a.k, 2);
	T_OK(isnan(a.need));
	settle(&a, &t);
	/* the raise 1 -> 2 took it from 0.5 to 0.4: 0.1 a step; to the
	 * threshold is 3.5 steps: K + 4, cut to MAX */
	window(&t, 1, 3, 2, 3, 2, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_CLOSE(a.bubble, 0.4, 1e-12, 0);
	T_CLOSE(a.need, 3.5, 1e-9, 0);
	T_EQ_INT(a.k, 4);
	T_OK(strstr(a.why, "K 2 -> 4 (3.5 steps to the threshold)") != NULL, "%s", a.why);
	settle(&a, &t);
	/* the lowering: one step a full window, a clear-looking step does not
	 * end a window early */
	window(&t, 1, 1, 1, 1, 1, 0.05);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	window(&t, 2, 1, 1, 1, 1, 0.05);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 3);
	settle(&a, &t);
	/* after it, no early window, two calm windows, and up by one whatever
	 * the bubble (the line through the raise before the lowering is gone) */
	window(&t, 1, 1, 1, 1, 1, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	window(&t, 2, 1, 1, 1, 1, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 0);
	T_EQ_INT(a.k, 3);
	window(&t, 3, 1, 1, 1, 1, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 4);
	T_OK(isnan(a.need));
	T_EQ_INT(a.changes, 5);
	/* a slope under 0.01 a step is noise: by one (from K 1 at 0.3 to K 2 at 0.295) */
	rl_autok_init(&a, &c, 0);
	memset(&t, 0, sizeof t);
	rl_autok_update(&a, &t);
	window(&t, 3, 7, 3, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	settle(&a, &t);
	window(&t, 3, 14.1, 5.9, 5, 5, 0.001);
	T_EQ_INT(rl_autok_update(&a, &t), 1);
	T_EQ_INT(a.k, 2);
	T_OK(isnan(a.need));
}

/* ---- a simulated run through the broker ---------------------------------------- */

static uint64_t now_ms = 1700000000000ULL;

static int
put(rl_queue *q, int stage, rl_buf b)
{
	rl_qput_result r;
	int rv = rl_queue_put(q, stage, b.p, b.len, NULL, 0, now_ms, &r);
	rl_buf_fini(&b);
	return rv;
}

/* leases up to max records of stage; their ids in ids (up to cap) */
static uint32_t
lease(rl_queue *q, int stage, uint32_t max, uint64_t *lid, uint64_t *ids, size_t cap)
{
	rl_qlease_req r = { .stage = (uint32_t)stage, .max_records = max, .lease_ms = 3600000 };
	rl_qlease_info info;
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf out, fr;

	rl_buf_init(&out);
	rl_buf_init(&fr);
	T_EQ_INT(rl_queue_lease(q, &r, now_ms, &info, &out), 0);
	*lid = info.lease_id;
	if (info.n > 0) {
		rl_traj_batch_create(&b);
		rl_traj_create(&t);
		rl_qzstd_compress(&fr, out.p, out.len, 1);
		T_EQ_INT(rl_traj_batch_decode(b, NULL, fr.p, fr.len, NULL, "lease"), 0);
		for (size_t i = 0; i < rl_traj_batch_count(b) && i < cap; i++) {
			rl_traj_batch_get(b, i, t);
			rl_traj_get_u64(t, RL_TAG_ID, &ids[i]);
		}
		rl_traj_destroy(t);
		rl_traj_batch_destroy(b);
	}
	rl_buf_fini(&out);
	rl_buf_fini(&fr);
	return info.n;
}

static int
ack_done(rl_queue *q, uint64_t lid)
{
	rl_qack_req a = { .lease_id = lid, .kind = RL_QACK_DONE };
	rl_qack_result r;
	return rl_queue_ack(q, &a, NULL, now_ms, &r);
}

#define GS 2          /* samples per group */
#define B 2           /* groups per trainer step */
#define NGROUPS 4000
#define DT 0.05       /* seconds per tick */

typedef struct sim {
	rl_queue *q;
	rl_autok ak;
	rl_autok_totals tot;
	int *ver;                 /* version that generated group g (-1: not yet) */
	/* generator */
	uint64_t plid, pg;        /* prompt lease and its group; 0: idle */
	double gleft;
	int gver;
	/* an engine of `lanes` slots (0: the one-group generator above), a group
	 * in 4 `tail` times as long; `whole`: busy while any slot decodes (the
	 * accounting that hides empty slots), else by the share of slots decoding */
	int lanes, whole;
	double tail;
	uint64_t lpg[16];
	double lleft[16];
	int lver[16];
	/* trainer */
	int batch;                /* groups per step */
	uint64_t tlid[64];
	int ntl, ngot, training;
	double tleft;
	uint64_t version;
	/* what the run saw */
	int violations, leases, maxk_seen, stale_seen;
} sim;

/* samples of group g have ids g * 16 + i */
static int
gen_tick(sim *s, double gen_s)
{
	uint64_t ids[4];

	if (s->pg != 0 && s->gleft <= 0) {
		/* the group's samples finish the prompt's lease (the prompt is expanded) */
		if (put(s->q, RL_QSTAGE_SCORED, mk(s->pg * 16, GS, s->pg, GS, s->gver)) != 0)
			return -1;
		s->ver[s->pg] = s->gver;
		s->pg = 0;
	}
	if (s->pg == 0 && lease(s->q, RL_QSTAGE_PROMPT, 1, &s->plid, ids, 4) == 1) {
		s->pg = ids[0] - 1000000;
		s->gver = (int)s->version;   /* the newest weights when it starts */
		s->gleft = gen_s;
	}
	if (s->pg != 0) {
		s->gleft -= DT;
		s->tot.gen_busy += DT;
	} else {
		s->tot.gen_idle += DT;
	}
	return 0;
}

/* the engine of s->lanes slots: each free slot leases a prompt when the gate
 * lets it; busy time by the share of slots decoding (or whole, s->whole) */
static int
lanes_tick(sim *s, double gen_s)
{
	uint64_t ids[4], lid;
	int n = 0;

	for (int l = 0; l < s->lanes; l++) {
		if (s->lpg[l] != 0 && s->lleft[l] <= 0) {
			if (put(s->q, RL_QSTAGE_SCORED, mk(s->lpg[l] * 16, GS, s->lpg[l], GS, s->lver[l])) != 0)
				return -1;
			s->ver[s->lpg[l]] = s->lver[l];
			s->lpg[l] = 0;
		}
		if (s->lpg[l] == 0 && lease(s->q, RL_QSTAGE_PROMPT, 1, &lid, ids, 4) == 1) {
			s->lpg[l] = ids[0] - 1000000;
			s->lver[l] = (int)s->version;
			s->lleft[l] = s->lpg[l] % 4 == 0 ? gen_s * s->tail : gen_s;
		}
		if (s->lpg[l] != 0) {
			s->lleft[l] -= DT;
			n++;
		}
	}
	if (s->whole) {
		s->tot.gen_busy += n > 0 ? DT : 0;
		s->tot.gen_idle += n > 0 ? 0 : DT;
	} else {
		s->tot.gen_busy += DT * n / s->lanes;
		s->tot.gen_idle += DT * (s->lanes - n) / s->lanes;
	}
	return 0;
}

static int
train_tick(sim *s, double train_s, double drift)
{
	uint64_t ids[64], lid, v;
	uint32_t n, K;

	if (s->training) {
		s->tot.train_busy += DT;
		if ((s->tleft -= DT) > 0)
			return 0;
		for (int i = 0; i < s->ntl; i++)
			if (ack_done(s->q, s->tlid[i]) != 0)
				return -1;
		s->training = s->ntl = s->ngot = 0;
		if (rl_queue_set_version(s->q, s->version + 1, &v) != 0)
			return -1;
		s->version = v;
		s->tot.version = (double)v;
		s->tot.drift_sum += drift;
		s->tot.drift_n += 1;
		int ch = rl_autok_update(&s->ak, &s->tot);
		/* AUTOK_TRACE=1: each step's decision on stderr, to see the run */
		if (getenv("AUTOK_TRACE"))
			fprintf(stderr, "v %llu K %u: %s\n", (unsigned long long)v, s->ak.k, s->ak.why);
		if (ch && rl_queue_set_max_staleness(s->q, s->ak.k) != 0)
			return -1;
		return 0;
	}
	s->tot.train_idle += DT;
	if (rl_queue_available(s->q, RL_QSTAGE_SCORED, 0, 0) == 0)
		return 0;
	n = lease(s->q, RL_QSTAGE_SCORED, (uint32_t)((s->batch - s->ngot) * GS), &lid, ids, 64);
	if (n == 0)
		return 0;
	/* the bound, at this lease, for the K in force now */
	K = rl_queue_max_staleness(s->q);
	s->leases++;
	for (uint32_t i = 0; i < n; i++) {
		int gv = s->ver[ids[i] / 16];
		if (gv < 0 || s->version - (uint64_t)gv > K)
			s->violations++;
		if ((int)s->version - gv > s->stale_seen)
			s->stale_seen = (int)s->version - gv;
	}
	s->tlid[s->ntl++] = lid;
	s->ngot += (int)n / GS;
	if (s->ngot >= s->batch) {
		s->training = 1;
		s->tleft = train_s;
	}
	return 0;
}

/* runs `steps` trainer steps; drift(step) from d0 growing by dd per step */
static void
phase(sim *s, int steps, double gen_s, double train_s, double d0, double dd)
{
	uint64_t until = s->version + (uint64_t)steps;
	long guard = 0;

	while (s->version < until && guard++ < 2000000) {
		double drift = d0 + dd * (double)(s->version + steps - until);
		if ((s->lanes ? lanes_tick(s, gen_s) : gen_tick(s, gen_s)) != 0 || train_tick(s, train_s, drift) != 0) {
			T_OK(0, "simulation step failed at version %llu", (unsigned long long)s->version);
			return;
		}
		now_ms += (uint64_t)(DT * 1000);
		if ((int)s->ak.k > s->maxk_seen)
			s->maxk_seen = (int)s->ak.k;
	}
	T_OK(s->version >= until);
}

static void
test_simulated(void)
{
	rl_queue_config cfg;
	rl_autok_config ac;
	rl_queue_stats st;
	sim s;

	memset(&s, 0, sizeof s);
	s.batch = B;
	rl_queue_config_default(&cfg);
	cfg.train_batch = B;
	cfg.auto_k = 1;
	cfg.auto_kmax = 3;
	cfg.max_staleness = 0;
	T_EQ_INT(rl_queue_open(&s.q, &cfg, now_ms), 0);
	rl_autok_config_default(&ac, 3);
	rl_autok_init(&s.ak, &ac, 0);
	s.ver = malloc(sizeof(int) * (NGROUPS + 1));
	for (int g = 0; g <= NGROUPS; g++)
		s.ver[g] = -1;
	for (uint64_t g = 1; g <= NGROUPS; g++)
		T_EQ_INT(put(s.q, RL_QSTAGE_PROMPT, mk(1000000 + g, 1, g, GS, -1)), 0);
	rl_autok_update(&s.ak, &s.tot);

	/* 1. a slow trainer (6 s a step, 1 s a group): on-policy, the two sides
	 * take turns, the trainer waits 2 s of every 8 (25 %, clear): K rises to
	 * 1 on the first step, then the trainer is busy all the time, no bubble
	 * is left, K stays at 1 */
	phase(&s, 1, 1.0, 6.0, 0.002, 0);
	T_EQ_INT(s.ak.k, 1);
	T_EQ_INT(s.ak.windows, 1);
	phase(&s, 3, 1.0, 6.0, 0.002, 0);
	T_EQ_INT(s.ak.k, 1);
	phase(&s, 24, 1.0, 6.0, 0.002, 0);
	T_EQ_INT(s.ak.k, 1);
	T_EQ_INT(s.maxk_seen, 1);
	T_OK(s.ak.bubble < 0.1);
	T_EQ_INT(s.stale_seen, 1);     /* K = 1 was used: samples one version old */

	/* 2. a slow generator (3 s a group, 1 s a step): at K = 1 it never waits
	 * for the gate, the bottleneck is busy, K stays */
	phase(&s, 15, 3.0, 1.0, 0.002, 0);
	T_EQ_INT(s.ak.k, 1);
	T_OK(s.ak.gen_idle < 0.1);

	/* 3. the same, with a drift that grows by 0.004 a step from 0.002: past
	 * 0.03 K goes down to 0 and stays there; the samples generated under
	 * K = 1 that are now too old are dropped, never handed to the trainer */
	phase(&s, 30, 3.0, 1.0, 0.002, 0.004);
	T_EQ_INT(s.ak.k, 0);
	T_EQ_INT(rl_queue_max_staleness(s.q), 0);
	T_OK(s.ak.drift > 0.03);

	T_EQ_INT(s.violations, 0);
	T_OK(s.leases > 100);
	rl_queue_get_stats(s.q, &st);
	for (int i = 2; i < 9; i++)
		T_EQ_INT(st.staleness[i], 0);
	T_OK(st.staleness[1] > 0);
	/* lowering K found groups generated under K = 1 that K = 0 no longer
	 * admits: dropped at the trainer's lease, none of them handed out */
	T_OK(st.stale_dropped > 0, "stale_dropped %llu", (unsigned long long)st.stale_dropped);
	T_EQ_INT(s.ak.changes, 2);
	rl_queue_close(s.q);
	free(s.ver);
}

/* An engine of 8 slots on a long tail: a group in 4 takes 12 times as long
 * as the others, a trainer step 4 times a short group, 8 groups a step.
 * On-policy, the step's long groups decode alone in mostly empty slots while
 * the trainer waits.  Counted by slot occupancy, the rollout side is idle
 * most of the time too and K rises past 1; counted busy whenever any slot
 * decodes (whole != 0), the rollout side looks busy, the bubble is near 0
 * and K stays at 1.  Returns the largest K seen; *tidle: the trainer's idle
 * share over the last 20 steps. */
static int
lanes_run(int whole, double *tidle)
{
	rl_queue_config cfg;
	rl_autok_config ac;
	sim s;
	double i0, b0;

	memset(&s, 0, sizeof s);
	s.lanes = 8;
	s.whole = whole;
	s.tail = 12;
	s.batch = 8;
	rl_queue_config_default(&cfg);
	cfg.train_batch = (uint32_t)s.batch;
	cfg.auto_k = 1;
	cfg.auto_kmax = 4;
	cfg.max_staleness = 0;
	T_EQ_INT(rl_queue_open(&s.q, &cfg, now_ms), 0);
	rl_autok_config_default(&ac, 4);
	rl_autok_init(&s.ak, &ac, 0);
	s.ver = malloc(sizeof(int) * (NGROUPS + 1));
	for (int g = 0; g <= NGROUPS; g++)
		s.ver[g] = -1;
	for (uint64_t g = 1; g <= NGROUPS; g++)
		T_EQ_INT(put(s.q, RL_QSTAGE_PROMPT, mk(1000000 + g, 1, g, GS, -1)), 0);
	rl_autok_update(&s.ak, &s.tot);
	phase(&s, 40, 1.0, 4.0, 0.002, 0);
	i0 = s.tot.train_idle;
	b0 = s.tot.train_busy;
	phase(&s, 20, 1.0, 4.0, 0.002, 0);
	*tidle = (s.tot.train_idle - i0) / (s.tot.train_idle - i0 + s.tot.train_busy - b0);
	T_EQ_INT(s.violations, 0);
	rl_queue_close(s.q);
	free(s.ver);
	return s.maxk_seen;
}

static void
test_lanes(void)
{
	double idle_occ, idle_whole;
	int k_occ = lanes_run(0, &idle_occ), k_whole = lanes_run(1, &idle_whole);

	if (getenv("AUTOK_TRACE"))
		fprintf(stderr, "lanes: by occupancy K %d, trainer idle %.3f; whole K %d, idle %.3f\n", k_occ,
		    idle_occ, k_whole, idle_whole);
	T_OK(k_occ > 1, "K by slot occupancy: %d", k_occ);
	T_OK(idle_occ < idle_whole, "trainer idle %.3f by occupancy, %.3f whole", idle_occ, idle_whole);
	/* the accounting this replaced: the bubble hidden, K kept at 1 */
	T_EQ_INT(k_whole, 1);
}

/* ---- journal ------------------------------------------------------------------------ */

static void
test_journal(void)
{
	char dir[] = "/tmp/rl_autok_XXXXXX";
	rl_queue_config cfg;
	rl_queue *q;

	T_OK(mkdtemp(dir) != NULL);
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.auto_k = 1;
	cfg.auto_kmax = 4;
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	T_EQ_INT(rl_queue_set_max_staleness(q, 3), 0);
	T_EQ_INT(rl_queue_set_max_staleness(q, 5), RL_EINVAL);   /* above MAX */
	T_EQ_INT(rl_queue_max_staleness(q), 3);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	rl_queue_close(q);
	/* replayed under auto: K continues from 3 */
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	T_EQ_INT(rl_queue_max_staleness(q), 3);
	/* and after a compaction (the snapshot carries K) */
	T_EQ_INT(rl_queue_journal_compact(q), 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	T_EQ_INT(rl_queue_max_staleness(q), 3);
	rl_queue_close(q);
	/* a smaller MAX on restart clamps it */
	cfg.auto_kmax = 2;
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	T_EQ_INT(rl_queue_max_staleness(q), 2);
	rl_queue_close(q);
	/* a fixed K on the command line: the journal's K changes are ignored,
	 * and the broker refuses to change K */
	cfg.auto_k = 0;
	cfg.max_staleness = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	T_EQ_INT(rl_queue_max_staleness(q), 1);
	T_EQ_INT(rl_queue_set_max_staleness(q, 0), RL_EINVAL);
	rl_queue_close(q);
	rl_io_remove_tree(dir);
}

int
main(void)
{
	T_BEGIN("test_autok");
	rl_log_init("test_autok", RL_LOG_QUIET);
	test_rule();
	test_fast();
	test_simulated();
	test_lanes();
	test_journal();
	T_END();
}

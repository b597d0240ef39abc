/* bench/autok.c — --max-staleness auto against fixed K and against K = 0
 * (on-policy: generation waits for each step, as the sync wiring does) on a
 * long-tailed length workload, in simulated time: the broker's real state
 * machine (queue.h: gate, staleness test, drop) and the real rule (autok.h)
 * with a modelled trainer and generators, so the scheduling is what is
 * measured, not the compute (no model runs).
 *
 * Model: W generator workers each take one prompt (a group of G samples) at
 * a time with the weights of the trainer's version when they take it; a
 * sample is 1 s long, or 10 s with probability P_LONG (the long tail); a
 * group takes its longest sample.  The trainer takes B groups per step and
 * trains ALPHA s per sample-second generated.  The drift it reports is
 * D0 + D1 x (the mean staleness of the step's samples): older samples, larger
 * KL (an assumption of the model: real drift depends on the task and the
 * learning rate).  Busy and idle seconds of both sides feed the rule as the
 * stats reports do.  Same seed, same workload for every configuration.
 *
 * Prints one JSON line per configuration and a summary line.
 * usage: autok [STEPS] [SEED]   (default 300 steps, seed 1)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/io.h"
#include "base/rng.h"
#include "queue/autok.h"
#include "queue/queue.h"
#include "stream/traj.h"

#define W 4            /* generator workers */
#define G 4            /* samples per group */
#define B 8            /* groups per step */
#define P_LONG 0.06
#define ALPHA 0.1
#define D0 0.003
#define D1 0.005
#define DT 0.01
#define MAXG 200000

static uint64_t now_ms = 1700000000000ULL;

static int
put(rl_queue *q, int stage, uint64_t id0, size_t n, uint64_t g, int v)
{
	rl_traj_batch *b;
	rl_traj *t;
	const void *p;
	size_t len;
	rl_qput_result r;
	int32_t tok[4] = { 1, 2, 3, 4 };
	int rv;

	if (rl_traj_batch_create(&b) != 0 || rl_traj_create(&t) != 0)
		return RL_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		rl_traj_clear(t);
		rl_traj_set_u64(t, RL_TAG_ID, id0 + i);
		rl_traj_set_u64(t, RL_TAG_GROUP, g);
		rl_traj_set_i32(t, RL_TAG_INDEX, (int)i);
		rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, (int)(v >= 0 ? n : G));
		if (v >= 0) {
			rl_traj_set_version(t, v, v);
			rl_traj_set_i32s(t, RL_TAG_RESPONSE, tok, 4);
		}
		rl_traj_batch_add(b, t);
	}
	rl_traj_batch_payload(b, &p, &len);
	rv = rl_queue_put(q, stage, p, len, NULL, 0, now_ms, &r);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	return rv;
}

/* leases up to max records; the ids of the first cap in ids; returns the count */
static uint32_t
lease(rl_queue *q, int stage, uint32_t max, uint64_t *lid, uint64_t *ids, size_t cap)
{
	rl_qlease_req r = { .stage = (uint32_t)stage, .max_records = max, .lease_ms = 100000000 };
	rl_qlease_info info;
	rl_buf out;
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf fr;

	rl_buf_init(&out);
	rl_buf_init(&fr);
	if (rl_queue_lease(q, &r, now_ms, &info, &out) != 0)
		info.n = 0;
	*lid = info.lease_id;
	if (info.n > 0 && rl_traj_batch_create(&b) == 0) {
		rl_traj_create(&t);
		rl_qzstd_compress(&fr, out.p, out.len, 1);
		if (rl_traj_batch_decode(b, NULL, fr.p, fr.len, NULL, "lease") == 0)
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

typedef struct run {
	rl_queue *q;
	rl_autok ak;
	int is_auto;
	rl_autok_totals tot;
	int gver[MAXG + 1];
	double glen[MAXG + 1];    /* sample-seconds of group g */
	struct { uint64_t g; double left; } wk[W];
	uint64_t tlid[16];
	int ntl, ngot, training;
	double tleft, tsum_len, stale_sum, t;
	int stale_n, stale_max;
	uint64_t version;
} run;

/* the workload: group g's samples' lengths, the same for every configuration */
static double
group_time(uint64_t seed, uint64_t g, double *total)
{
	double mx = 0, sum = 0;
	for (int i = 0; i < G; i++) {
		double u = rl_rng_uniform(seed, g * G + (uint64_t)i);
		double L = u < P_LONG ? 10.0 : 1.0;
		mx = L > mx ? L : mx;
		sum += L;
	}
	*total = sum;
	return mx;
}

static int
tick(run *r, uint64_t seed)
{
	uint64_t ids[64], lid, v;
	int busy = 0;

	for (int w = 0; w < W; w++) {
		if (r->wk[w].g && r->wk[w].left <= 0) {
			if (put(r->q, RL_QSTAGE_SCORED, r->wk[w].g * 16, G, r->wk[w].g, r->gver[r->wk[w].g]) != 0)
				return -1;
			r->wk[w].g = 0;
		}
		if (!r->wk[w].g && lease(r->q, RL_QSTAGE_PROMPT, 1, &lid, ids, 1) == 1) {
			uint64_t g = ids[0] - 1000000;
			r->wk[w].g = g;
			r->gver[g] = (int)r->version;
			r->wk[w].left = group_time(seed, g, &r->glen[g]);
		}
		if (r->wk[w].g) {
			r->wk[w].left -= DT;
			r->tot.gen_busy += DT;
		} else {
			r->tot.gen_idle += DT;
		}
	}
	if (r->training) {
		r->tot.train_busy += DT;
		if ((r->tleft -= DT) > 0)
			return 0;
		for (int i = 0; i < r->ntl; i++) {
			rl_qack_req a = { .lease_id = r->tlid[i], .kind = RL_QACK_DONE };
			rl_qack_result ar;
			if (rl_queue_ack(r->q, &a, NULL, now_ms, &ar) != 0)
				return -1;
		}
		r->training = r->ntl = r->ngot = 0;
		if (rl_queue_set_version(r->q, r->version + 1, &v) != 0)
			return -1;
		r->version = v;
		r->tot.version = (double)v;
		r->tot.drift_sum += D0 + D1 * r->stale_sum / (r->stale_n ? r->stale_n : 1);
		r->tot.drift_n += 1;
		r->stale_sum = 0;
		r->stale_n = 0;
		{
			rl_queue_stats qs;
			rl_queue_get_stats(r->q, &qs);
			r->tot.trained = 0;
			for (int i = 0; i < 9; i++)
				r->tot.trained += (double)qs.staleness[i];
			r->tot.dropped = (double)(qs.stale_dropped + qs.stale_regen);
		}
		if (r->is_auto && rl_autok_update(&r->ak, &r->tot) && rl_queue_set_max_staleness(r->q, r->ak.k) != 0)
			return -1;
		return 0;
	}
	r->tot.train_idle += DT;
	if (rl_queue_available(r->q, RL_QSTAGE_SCORED, 0, 0) == 0)
		return busy;
	uint32_t n = lease(r->q, RL_QSTAGE_SCORED, (uint32_t)((B - r->ngot) * G), &lid, ids, 64);
	if (n == 0)
		return 0;
	r->tlid[r->ntl++] = lid;
	r->ngot += (int)n / G;
	for (uint32_t i = 0; i < n; i += G) {
		uint64_t g = ids[i] / 16;
		int s = (int)r->version - r->gver[g];
		r->stale_sum += s;
		r->stale_n++;
		r->tsum_len += r->glen[g];
		r->stale_max = s > r->stale_max ? s : r->stale_max;
	}
	if (r->ngot >= B) {
		r->training = 1;
		r->tleft = ALPHA * r->tsum_len;
		r->tsum_len = 0;
	}
	return 0;
}

/* one configuration: k >= 0 fixed, k < 0 auto up to -k; returns samples/s */
static double
one(int k, int steps, uint64_t seed, char *name)
{
	static run r;
	rl_queue_config cfg;
	rl_autok_config ac;
	rl_queue_stats st;
	double t = 0, tsum = 0;
	int nstale = 0;

	memset(&r, 0, sizeof r);
	rl_queue_config_default(&cfg);
	cfg.train_batch = B;
	cfg.max_staleness = k >= 0 ? (uint32_t)k : 0;
	cfg.auto_k = k < 0;
	cfg.auto_kmax = k < 0 ? (uint32_t)-k : 0;
	if (rl_queue_open(&r.q, &cfg, now_ms) != 0)
		return -1;
	r.is_auto = k < 0;
	rl_autok_config_default(&ac, k < 0 ? (uint32_t)-k : 0);
	rl_autok_init(&r.ak, &ac, 0);
	rl_autok_update(&r.ak, &r.tot);
	for (uint64_t g = 1; g <= (uint64_t)(steps + 40) * B * 2 && g < MAXG; g++)
		if (put(r.q, RL_QSTAGE_PROMPT, 1000000 + g, 1, g, -1) != 0)
			return -1;
	while (r.version < (uint64_t)steps) {
		int pv = (int)r.version;
		if (tick(&r, seed) != 0)
			return -1;
		t += DT;
		now_ms += (uint64_t)(DT * 1000);
		if ((int)r.version != pv) {
			tsum += (double)rl_queue_max_staleness(r.q);
			nstale++;
		}
	}
	rl_queue_get_stats(r.q, &st);
	double sps = (double)steps * B * G / t;
	double smean = st.staleness_sum;
	uint64_t trained = 0;
	for (int i = 0; i < 9; i++)
		trained += st.staleness[i];
	printf("{\"bench\":\"autok\",\"config\":\"%s\",\"steps\":%d,\"sim_seconds\":%.1f,\"samples_per_s\":%.4f,"
	       "\"staleness_mean\":%.3f,\"staleness_max\":%d,\"k_mean\":%.2f,\"k_final\":%u,\"k_changes\":%llu,"
	       "\"stale_dropped\":%llu,\"train_busy_frac\":%.3f,\"gen_busy_frac\":%.3f}\n",
	    name, steps, t, sps, trained ? smean / (double)trained : 0.0, r.stale_max, nstale ? tsum / nstale : 0.0,
	    rl_queue_max_staleness(r.q), (unsigned long long)r.ak.changes, (unsigned long long)st.stale_dropped,
	    r.tot.train_busy / (r.tot.train_busy + r.tot.train_idle), r.tot.gen_busy / (r.tot.gen_busy + r.tot.gen_idle));
	fflush(stdout);
	rl_queue_close(r.q);
	return sps;
}

int
main(int argc, char **argv)
{
	int steps = argc > 1 ? atoi(argv[1]) : 300;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
	double sync, best = 0, autov;
	int bestk = 0;
	char name[32];

	rl_log_init("autok", RL_LOG_QUIET);
	if (steps < 10 || (uint64_t)(steps + 40) * B * 2 >= MAXG) {
		fprintf(stderr, "autok: STEPS between 10 and %d\n", MAXG / (2 * B) - 41);
		return 2;
	}
	sync = one(0, steps, seed, "K=0 (on-policy, sync)");
	best = sync;
	for (int k = 1; k <= 4; k++) {
		snprintf(name, sizeof name, "K=%d", k);
		double v = one(k, steps, seed, name);
		if (v > best) {
			best = v;
			bestk = k;
		}
	}
	autov = one(-4, steps, seed, "auto:4");
	if (sync <= 0 || autov <= 0)
		return 1;
	printf("{\"bench\":\"autok\",\"summary\":true,\"best_fixed_k\":%d,\"auto_vs_best_fixed\":%.3f,"
	       "\"auto_vs_sync\":%.3f,\"best_fixed_vs_sync\":%.3f}\n", bestk, autov / best, autov / sync, best / sync);
	return 0;
}

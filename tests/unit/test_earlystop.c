/* test_earlystop.c — over-sampling with early stop in the broker (queue.h,
 * --oversample / --stragglers requeue|drop|continue) on a simulated long-tail run through the
 * state machine with a fake clock: one rollout process with 8 slots that
 * watches the lease's abort count and cancels what the broker took back (as
 * rl-rollout does), one that never looks and puts its stragglers late, and a
 * trainer.  Most groups take one tick to generate, one in eight ten.
 * Checked against the run's own ledger, not the broker's counters: no
 * sample is trained twice, every prompt is trained or counted as dropped,
 * none is lost; no trainer lease breaks the staleness bound; the broker's
 * counters agree with the ledger; the journal replays to the same state. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/io.h"
#include "queue/queue.h"
#include "stream/traj.h"
#include "qbatch.h"
#include "t.h"

static uint64_t now_ms = 1700000000000ULL;

#define GS 2          /* samples per group */
#define B 4           /* groups per trainer step */
#define NG 240        /* prompts */
#define SLOTS 8       /* the watching rollout process */
#define PID0 1000000u /* prompt record ids: PID0 + group */

static int
put(rl_queue *q, int stage, rl_buf b, rl_qput_result *r)
{
	int rv = rl_queue_put(q, stage, b.p, b.len, NULL, 0, now_ms, r);
	rl_buf_fini(&b);
	return rv;
}

/* leases up to max records; their ids into ids (up to cap) */
static uint32_t
lease(rl_queue *q, int stage, uint32_t max, uint64_t *lid, uint64_t *ids, size_t cap, uint32_t *aborts)
{
	rl_qlease_req r = { .stage = (uint32_t)stage, .max_records = max, .lease_ms = 3600000, .group_hint = GS };
	rl_qlease_info info;
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf out, fr;

	rl_buf_init(&out);
	rl_buf_init(&fr);
	T_EQ_INT(rl_queue_lease(q, &r, now_ms, &info, &out), 0);
	*lid = info.lease_id;
	if (aborts)
		*aborts = info.aborts;
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

typedef struct slot {
	uint64_t lid, g;     /* g 0: free */
	int left, ver, attempt;
} slot;

typedef struct run {
	rl_queue *q;
	int K;
	slot s[SLOTS], deaf;
	uint32_t aborts_seen;
	int attempts[NG + 1];
	int ver[NG + 1];               /* version that generated the group put last */
	uint8_t trained[NG + 1][GS];   /* the ledger: samples trained, by group and index */
	int trained_groups, twice, violations, cancelled, late_puts;
	/* trainer */
	uint64_t tlid[NG];
	int ntl, got, training, tleft;
	uint64_t version;
} run;

/* long tail: one group in eight takes ten ticks, by a hash of the group */
static int
gen_ticks(uint64_t g)
{
	return rl_hash64(&g, sizeof g, 7) % 8 == 0 ? 10 : 1;
}

/* sample ids are fresh per attempt, as rl-rollout's are */
static uint64_t
sample_id(uint64_t g, int attempt)
{
	return g * 1024 + (uint64_t)(attempt % 500) * GS;
}

static void
slot_tick(run *r, slot *s)
{
	rl_qput_result pr;

	if (s->g != 0 && --s->left <= 0) {
		T_EQ_INT(put(r->q, RL_QSTAGE_SCORED, mk(sample_id(s->g, s->attempt), GS, s->g, GS, s->ver), &pr), 0);
		if (pr.accepted == GS)
			r->ver[s->g] = s->ver;
		else
			r->late_puts++;   /* a straggler of the deaf process: refused */
		s->g = 0;
	}
}

static void
slot_lease(run *r, slot *s, int watch)
{
	uint64_t ids[1];
	uint32_t ab;

	if (s->g != 0 || lease(r->q, RL_QSTAGE_PROMPT, 1, &s->lid, ids, 1, &ab) != 1) {
		if (s->g == 0 && watch)
			lease(r->q, RL_QSTAGE_PROMPT, 0, &s->lid, ids, 0, &ab);
		if (!watch || ab == r->aborts_seen)
			return;
	}
	if (s->g == 0 && s->lid != 0) {
		s->g = ids[0] - PID0;
		s->attempt = ++r->attempts[s->g];
		s->left = gen_ticks(s->g);
		s->ver = (int)r->version;
	}
	if (watch && ab != r->aborts_seen) {
		/* as rl-rollout: ask which prompts the broker still holds */
		r->aborts_seen = ab;
		for (int i = 0; i < SLOTS; i++) {
			slot *o = &r->s[i];
			rl_qack_req a = { .lease_id = o->lid, .kind = RL_QACK_EXTEND, .n = 1 };
			rl_qack_result res;
			uint64_t pid = PID0 + o->g;
			if (o->g == 0)
				continue;
			int rv = rl_queue_ack(r->q, &a, &pid, now_ms, &res);
			if (rv == RL_ENOENT || res.late == 1) {
				o->g = 0;
				r->cancelled++;
			}
		}
	}
}

static void
train_tick(run *r, int ttrain)
{
	uint64_t ids[64], lid, v;
	uint32_t n;
	rl_queue_stats st;

	if (r->training) {
		if (--r->tleft > 0)
			return;
		/* version first, then the ack (docs/queue.md: K = 0 stays on-policy) */
		T_EQ_INT(rl_queue_set_version(r->q, r->version + 1, &v), 0);
		r->version = v;
		for (int i = 0; i < r->ntl; i++) {
			rl_qack_req a = { .lease_id = r->tlid[i], .kind = RL_QACK_DONE };
			rl_qack_result res;
			T_EQ_INT(rl_queue_ack(r->q, &a, NULL, now_ms, &res), 0);
		}
		r->training = r->ntl = r->got = 0;
		return;
	}
	n = lease(r->q, RL_QSTAGE_SCORED, (uint32_t)((B - r->got) * GS), &lid, ids, 64, NULL);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t g = ids[i] / 1024, idx = (ids[i] % 1024) % GS;
		if (g == 0 || g > NG) {
			T_OK(0, "unknown id %llu", (unsigned long long)ids[i]);
			continue;
		}
		if (r->trained[g][idx]++)
			r->twice++;
		if (r->ver[g] < 0 || r->version - (uint64_t)r->ver[g] > (uint64_t)r->K)
			r->violations++;
		if (idx == 0)
			r->trained_groups++;
	}
	if (n > 0) {
		r->tlid[r->ntl++] = lid;
		r->got += (int)n / GS;
	}
	rl_queue_get_stats(r->q, &st);
	/* the last step may be short: nothing left to generate */
	if (r->got >= B || (r->got > 0 && st.depth[RL_QS_PROMPT] + st.depth[RL_QS_LEASED] == 0 &&
	    st.ready_groups == 0)) {
		r->training = 1;
		r->tleft = ttrain;
	}
}

/* ticks until every prompt is trained or dropped (or `ticks` ran out) */
static void
simulate(run *r, int ticks)
{
	for (int t = 0; t < ticks; t++) {
		rl_queue_stats st;
		for (int i = 0; i < SLOTS; i++)
			slot_tick(r, &r->s[i]);
		slot_tick(r, &r->deaf);
		for (int i = 0; i < SLOTS; i++)
			slot_lease(r, &r->s[i], 1);
		slot_lease(r, &r->deaf, 0);
		train_tick(r, 2);
		now_ms += 100;
		rl_queue_get_stats(r->q, &st);
		if (st.groups == 0 && !r->training && r->s[0].g == 0 && r->deaf.g == 0)
			break;
	}
}

static void
setup(run *r, rl_queue_config *cfg)
{
	rl_qput_result pr;

	memset(r, 0, sizeof *r);
	r->K = (int)cfg->max_staleness;
	for (int g = 0; g <= NG; g++)
		r->ver[g] = -1;
	T_EQ_INT(rl_queue_open(&r->q, cfg, now_ms), 0);
	for (uint64_t g = 1; g <= NG; g++)
		T_EQ_INT(put(r->q, RL_QSTAGE_PROMPT, mk(PID0 + g, 1, g, GS, -1), &pr), 0);
}

/* K, what early stop does with stragglers, F (1: no over-sampling, the
 * broker as it was); the broker's stats into *out */
static void
test_run(int K, int mode, double F, rl_queue_stats *out)
{
	rl_queue_config cfg;
	rl_queue_stats st;
	run *r = calloc(1, sizeof *r);
	uint64_t lost;

	rl_queue_config_default(&cfg);
	cfg.train_batch = B;
	cfg.max_staleness = (uint32_t)K;
	cfg.oversample = F;
	cfg.stragglers = mode;
	/* K > 0: a group can still age past K in the buffer; it is regenerated */
	cfg.stale = K > 0 ? RL_QSTALE_REGEN : RL_QSTALE_DROP;
	setup(r, &cfg);
	simulate(r, 20000);
	rl_queue_get_stats(r->q, &st);
	*out = st;

	T_EQ_INT(r->twice, 0);
	T_EQ_INT(r->violations, 0);
	T_EQ_INT(st.aborted, st.abort_requeued + st.abort_dropped);
	T_EQ_INT(st.done, (uint64_t)r->trained_groups * GS);
	T_EQ_INT(st.groups, 0);   /* nothing left behind */
	for (uint64_t g = 1; g <= NG; g++)
		T_OK(r->trained[g][0] == r->trained[g][1], "group %llu half trained", (unsigned long long)g);
	/* none lost: trained, or dropped and counted */
	lost = st.stale_dropped / GS + st.abort_dropped;
	T_EQ_INT((uint64_t)r->trained_groups + lost, NG);
	if (F <= 1) {
		T_EQ_INT(st.early_stops + st.aborted, 0);
		rl_queue_close(r->q);
		free(r);
		return;
	}
	T_OK(st.abort_late <= (uint64_t)r->late_puts * GS);
	if (mode == RL_QSTRAG_CONTINUE) {
		/* only leases older than K are aborted (re-queued), at new versions;
		 * at K = 0 what finishes after the step closed is stale (dropped,
		 * counted above) */
		T_EQ_INT(st.abort_dropped, 0);
		T_OK(st.aborted > 0);
		if (K > 0)
			T_EQ_INT(r->trained_groups, NG);
		*out = st;
		rl_queue_close(r->q);
		free(r);
		return;
	}
	T_OK(st.early_stops > 0);
	T_OK(r->cancelled > 0, "the watching process cancelled nothing");
	/* the late path is exercised at K <= 1; above, spares are admitted
	 * only while the next step is short and the deaf process may hold none */
	if (K <= 1)
		T_OK(r->late_puts > 0, "K %d: the deaf process put no straggler late", K);
	/* a straggler that could no longer be trained within K is aborted
	 * before it completes: nothing is thrown away as stale, whatever K */
	T_EQ_INT(st.stale_dropped + st.stale_regen, 0);
	if (mode == RL_QSTRAG_REQUEUE) {
		/* every prompt trained once, the aborted ones after their requeue */
		T_EQ_INT(r->trained_groups, NG);
		T_EQ_INT(st.abort_dropped, 0);
		T_OK(st.abort_requeued > 0);
	} else {
		T_EQ_INT(st.abort_requeued, 0);
		T_OK(st.abort_dropped > 0);
	}
	rl_queue_close(r->q);
	free(r);
}

/* the journal: a run stopped half-way replays to the same state */
static void
test_journal(void)
{
	char dir[] = "/tmp/rl_estop_XXXXXX";
	rl_queue_config cfg;
	rl_queue_stats a, b;
	run *r = calloc(1, sizeof *r);

	T_OK(mkdtemp(dir) != NULL);
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.train_batch = B;
	cfg.oversample = 2;
	cfg.stragglers = RL_QSTRAG_DROP;
	setup(r, &cfg);
	simulate(r, 150);
	T_EQ_INT(rl_queue_journal_sync(r->q), 0);
	rl_queue_get_stats(r->q, &a);
	T_OK(a.aborted > 0);
	uint64_t cg = rl_queue_complete_groups(r->q);
	rl_queue_close(r->q);
	T_EQ_INT(rl_queue_open(&r->q, &cfg, now_ms), 0);
	rl_queue_get_stats(r->q, &b);
	for (int s = 0; s < RL_QS_COUNT; s++)
		T_EQ_INT(b.depth[s], a.depth[s]);
	T_EQ_INT(b.inflight, a.inflight);
	T_EQ_INT(b.groups, a.groups);
	T_EQ_INT(b.aborted, a.aborted);
	T_EQ_INT(b.abort_dropped, a.abort_dropped);
	T_EQ_INT(b.early_stops, a.early_stops);
	T_EQ_INT(rl_queue_complete_groups(r->q), cg);
	rl_queue_close(r->q);
	rl_io_remove_tree(dir);
	free(r);
}

/* EXTEND with ids: those the lease no longer holds come back late */
static void
test_extend_late(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result pr;
	uint64_t ids[4], lid, two[2];
	rl_qack_req a = { .kind = RL_QACK_EXTEND, .n = 2 };
	rl_qack_result res;
	rl_queue_stats st;

	rl_queue_config_default(&cfg);
	cfg.train_batch = 2;
	cfg.oversample = 2;
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	for (uint64_t g = 1; g <= 3; g++)
		T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(PID0 + g, 1, g, GS, -1), &pr), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 3, &lid, ids, 4, NULL), 3);
	a.lease_id = lid;
	two[0] = ids[0];
	two[1] = ids[1];
	T_EQ_INT(rl_queue_ack(q, &a, two, now_ms, &res), 0);
	T_EQ_INT(res.late, 0);
	T_EQ_INT(res.done, 2);
	/* group 1 arrives: its prompt leaves the lease (late), the other stays */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1 * 1024, GS, 1, GS, 0), &pr), 0);
	T_EQ_INT(rl_queue_ack(q, &a, two, now_ms, &res), 0);
	T_EQ_INT(res.late, 1);
	T_EQ_INT(res.done, 1);
	/* group 2 too: two complete groups close the step (K 0, B 2): prompt 3
	 * is aborted, the lease holds nothing more */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(2 * 1024, GS, 2, GS, 0), &pr), 0);
	a.n = 1;
	T_EQ_INT(rl_queue_ack(q, &a, &ids[2], now_ms, &res), RL_ENOENT);
	T_EQ_INT(res.late, 1);
	rl_queue_get_stats(q, &st);
	T_EQ_INT(st.early_stops, 1);
	T_EQ_INT(st.aborted, 1);
	T_EQ_INT(st.abort_requeued, 1);
	T_EQ_INT(st.depth[RL_QS_PROMPT], 1);
	/* the aborted attempt's samples, put late, are refused: the prompt stays */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(3 * 1024, GS, 3, GS, 0), &pr), 0);
	T_EQ_INT(pr.accepted, 0);
	T_EQ_INT(pr.rejected, GS);
	rl_queue_get_stats(q, &st);
	T_EQ_INT(st.abort_late, GS);
	T_EQ_INT(st.depth[RL_QS_PROMPT], 1);
	/* the step is closed: no prompt is admitted until the trainer takes it */
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(PID0 + 4, 1, 4, GS, -1), &pr), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 3, &lid, ids, 4, NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 4, &lid, ids, 4, NULL), 4);
	a.lease_id = lid;
	a.kind = RL_QACK_TRAINED;
	a.n = 4;
	T_EQ_INT(rl_queue_ack(q, &a, ids, now_ms, &res), 0);
	T_EQ_INT(res.done, 4);
	/* trained: the step opens; the re-queued prompt comes first */
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 3, &lid, ids, 4, NULL), 2);
	T_EQ_INT(ids[0], PID0 + 3);
	rl_queue_close(q);
}

/* prompts leasable at once: with auto K the spare groups are admitted only
 * while the broker's K is 0 or 1; a K the user fixed keeps them */
static uint32_t
leasable(int auto_k, uint32_t k)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result pr;
	uint64_t ids[64], lid;
	uint32_t n;

	rl_queue_config_default(&cfg);
	cfg.train_batch = 2;
	cfg.oversample = 2;
	cfg.max_staleness = auto_k ? 0 : k;
	cfg.auto_k = auto_k;
	cfg.auto_kmax = 4;
	T_EQ_INT(rl_queue_open(&q, &cfg, now_ms), 0);
	if (auto_k)
		T_EQ_INT(rl_queue_set_max_staleness(q, k), 0);
	for (uint64_t g = 1; g <= 40; g++)
		T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(PID0 + g, 1, g, GS, -1), &pr), 0);
	n = lease(q, RL_QSTAGE_PROMPT, 40, &lid, ids, 64, NULL);
	rl_queue_close(q);
	return n;
}

/* auto K at K: over-sampling and early stop act while K <= 1, and above
 * only while groups go stale (this tail, one group in eight ten times
 * longer, outlasts the window at every K here); every group is still
 * trained exactly once */
static void
test_auto_run(int K, rl_queue_stats *out)
{
	rl_queue_config cfg;
	run *r = calloc(1, sizeof *r);

	rl_queue_config_default(&cfg);
	cfg.train_batch = B;
	cfg.auto_k = 1;
	cfg.auto_kmax = 4;
	cfg.oversample = 1.5;
	cfg.stragglers = RL_QSTRAG_REQUEUE;
	cfg.stale = RL_QSTALE_REGEN;
	setup(r, &cfg);
	T_EQ_INT(rl_queue_set_max_staleness(r->q, (uint32_t)K), 0);
	r->K = K;
	simulate(r, 20000);
	rl_queue_get_stats(r->q, out);
	T_EQ_INT(r->twice, 0);
	T_EQ_INT(r->violations, 0);
	T_EQ_INT(r->trained_groups, NG);
	T_EQ_INT(out->done, (uint64_t)NG * GS);
	T_OK(out->early_stops > 0 && out->aborted > 0, "auto K %d: early stop did not act", K);
	if (K <= 1)
		T_EQ_INT(out->stale_dropped + out->stale_regen, 0);
	rl_queue_close(r->q);
	free(r);
}

static void
test_auto_spares(void)
{
	/* (K+1) x B groups, plus (F - 1) x B = 2 spares where they are admitted */
	T_EQ_INT(leasable(0, 0), 4);
	T_EQ_INT(leasable(0, 1), 6);
	T_EQ_INT(leasable(0, 2), 8);
	T_EQ_INT(leasable(0, 4), 12);
	T_EQ_INT(leasable(1, 0), 4);
	T_EQ_INT(leasable(1, 1), 6);
	T_EQ_INT(leasable(1, 2), 6);
	T_EQ_INT(leasable(1, 4), 10);
	/* above K = 1 early stop comes back with the first stale group: fewer
	 * samples are generated again as stale than without it */
	for (int k = 0; k <= 4; k++) {
		rl_queue_stats st, off;
		test_auto_run(k, &st);
		test_run(k, RL_QSTRAG_REQUEUE, 1, &off);
		if (getenv("ESTOP_VERBOSE"))
			fprintf(stderr, "auto K %d: %llu aborted, %llu stale regenerated; %llu without early stop\n", k,
			    (unsigned long long)st.aborted, (unsigned long long)st.stale_regen,
			    (unsigned long long)off.stale_regen);
		if (k >= 2)
			T_OK(st.stale_regen < off.stale_regen, "auto K %d: %llu stale regenerated, %llu without early stop",
			     k, (unsigned long long)st.stale_regen, (unsigned long long)off.stale_regen);
	}
}

int
main(void)
{
	T_BEGIN("test_earlystop");
	rl_log_init("test_earlystop", RL_LOG_QUIET);
	rl_queue_stats a, b;

	test_extend_late();
	test_auto_spares();
	test_run(0, RL_QSTRAG_REQUEUE, 1.5, &a);
	test_run(0, RL_QSTRAG_DROP, 1.5, &a);
	test_run(1, RL_QSTRAG_DROP, 1.5, &a);
	test_run(0, RL_QSTRAG_CONTINUE, 1.5, &a);
	test_run(1, RL_QSTRAG_CONTINUE, 1.5, &a);
	if (getenv("ESTOP_VERBOSE"))
		fprintf(stderr, "K 1 continue: %llu aborted, %llu stale samples regenerated\n", (unsigned long long)a.aborted,
		    (unsigned long long)a.stale_regen);
	/* K = 1: the tail ages past K; without early stop more generation is
	 * thrown away as stale and generated again */
	test_run(4, RL_QSTRAG_REQUEUE, 1.5, &a);
	test_run(2, RL_QSTRAG_DROP, 2, &a);
	test_run(1, RL_QSTRAG_REQUEUE, 1.5, &a);
	test_run(1, RL_QSTRAG_REQUEUE, 1, &b);
	if (getenv("ESTOP_VERBOSE"))
		fprintf(stderr, "K 1: stale regenerated %llu with early stop (%llu aborted), %llu without\n",
		    (unsigned long long)a.stale_regen, (unsigned long long)a.aborted, (unsigned long long)b.stale_regen);
	T_OK(a.stale_regen == 0 && b.stale_regen > 0, "stale samples regenerated: %llu with early stop, %llu without",
	    (unsigned long long)a.stale_regen, (unsigned long long)b.stale_regen);
	test_journal();
	T_END();
}

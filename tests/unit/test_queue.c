/* test_queue.c — the broker's state machine without sockets: the sample life
 * cycle, groups, idempotent puts, leases and expiry, the staleness gate and
 * bound (drop and regen), backpressure, bad batches, and the journal
 * (replay, compaction, torn tail, damage, a failed write, a compaction that
 * cannot be written).  Uses a fake clock. */
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/io.h"
#include "queue/queue.h"
#include "t.h"
#include "stream/traj.h"

static uint64_t now = 1700000000000ULL;

/* A batch payload of n records: ids id0.., in group g (0: none), indices
 * from idx0, group size gs, version v (<0: none), R response tokens. */
static rl_buf
mk(uint64_t id0, size_t n, uint64_t g, int idx0, int gs, int v, int R)
{
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf out;
	const void *p;
	size_t len;

	rl_buf_init(&out);
	rl_traj_batch_create(&b);
	rl_traj_create(&t);
	for (size_t i = 0; i < n; i++) {
		rl_traj_clear(t);
		rl_traj_set_u64(t, RL_TAG_ID, id0 + i);
		if (g)
			rl_traj_set_u64(t, RL_TAG_GROUP, g);
		rl_traj_set_i32(t, RL_TAG_INDEX, g ? idx0 + (int)i : 0);   /* no group: singletons */
		rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gs);
		if (v >= 0)
			rl_traj_set_version(t, v, v);
		if (R > 0) {
			int32_t *tok = calloc((size_t)R, 4);
			for (int k = 0; k < R; k++)
				tok[k] = (int32_t)(id0 + i + (uint64_t)k);
			rl_traj_set_i32s(t, RL_TAG_RESPONSE, tok, (size_t)R);
			free(tok);
		}
		rl_traj_batch_add(b, t);
	}
	rl_traj_batch_payload(b, &p, &len);
	rl_buf_append(&out, p, len);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	return out;
}

static int
put(rl_queue *q, int stage, rl_buf b, rl_qput_result *r)
{
	rl_qput_result tmp;
	int rv = rl_queue_put(q, stage, b.p, b.len, NULL, 0, now, r ? r : &tmp);
	rl_buf_fini(&b);
	return rv;
}

/* Leases and returns the ids (in *ids, up to 256) */
static size_t
lease(rl_queue *q, int stage, uint32_t max, uint32_t lease_ms, uint64_t *lid, uint64_t *ids)
{
	rl_qlease_req r = { .stage = (uint32_t)stage, .max_records = max, .lease_ms = lease_ms };
	rl_qlease_info info;
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf out, fr;
	size_t n;

	rl_buf_init(&out);
	rl_buf_init(&fr);
	T_EQ_INT(rl_queue_lease(q, &r, now, &info, &out), 0);
	*lid = info.lease_id;
	if (info.n == 0) {
		T_EQ_INT(out.len, 0);
		return 0;
	}
	/* the batch must be a valid stream batch: compress and decode it */
	rl_traj_batch_create(&b);
	rl_traj_create(&t);
	rl_qzstd_compress(&fr, out.p, out.len, 1);
	T_EQ_INT(rl_traj_batch_decode(b, NULL, fr.p, fr.len, NULL, "lease"), 0);
	n = rl_traj_batch_count(b);
	T_EQ_INT(n, info.n);
	for (size_t i = 0; i < n && i < 256; i++) {
		rl_traj_batch_get(b, i, t);
		rl_traj_get_u64(t, RL_TAG_ID, &ids[i]);
	}
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	rl_buf_fini(&out);
	rl_buf_fini(&fr);
	return n;
}

static int
ack(rl_queue *q, uint64_t lid, int kind, rl_qack_result *res)
{
	rl_qack_req a = { .lease_id = lid, .kind = (uint32_t)kind };
	rl_qack_result tmp;
	return rl_queue_ack(q, &a, NULL, now, res ? res : &tmp);
}

static rl_queue_stats
st(rl_queue *q)
{
	rl_queue_stats s;
	rl_queue_get_stats(q, &s);
	return s;
}

static void
test_lifecycle(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result r;
	rl_qack_result ar;
	uint64_t lid, ids[256];

	rl_queue_config_default(&cfg);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	/* two prompts, groups 100 and 200, 4 samples each */
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(100, 1, 100, 0, 4, -1, 0), &r), 0);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(200, 1, 200, 0, 4, -1, 0), &r), 0);
	T_EQ_INT(r.accepted, 1);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(100, 1, 100, 0, 4, -1, 0), &r), 0);
	T_EQ_INT(r.duplicates, 1);
	T_EQ_INT(st(q).depth[RL_QS_PROMPT], 2);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &lid, ids), 2);
	T_EQ_INT(ids[0], 100);
	T_EQ_INT(st(q).depth[RL_QS_LEASED], 2);
	T_EQ_INT(st(q).inflight, 8);
	/* group 100's samples, in two puts; the second completes the prompt */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1000, 2, 100, 0, 4, 0, 8), &r), 0);
	T_EQ_INT(r.accepted, 2);
	T_EQ_INT(st(q).inflight, 8);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1002, 2, 100, 2, 4, 0, 8), &r), 0);
	T_EQ_INT(st(q).depth[RL_QS_LEASED], 1);
	T_EQ_INT(st(q).depth[RL_QS_EXPANDED], 1);
	T_EQ_INT(st(q).depth[RL_QS_GENERATED], 4);
	/* a second sample for an index already filled (another id) is refused */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1500, 1, 100, 1, 4, 0, 8), &r), 0);
	T_EQ_INT(r.rejected, 1);
	/* reward leases 3, scores them; the 4th is scored without a lease */
	T_EQ_INT(lease(q, RL_QSTAGE_GENERATED, 3, 0, &lid, ids), 3);
	T_EQ_INT(st(q).depth[RL_QS_SCORING], 3);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1000, 3, 100, 0, 4, 0, 8), &r), 0);
	T_EQ_INT(r.replaced, 3);
	T_EQ_INT(st(q).leases, 1);   /* the prompt lease of group 200 only */
	T_EQ_INT(st(q).ready_groups, 0);
	{
		uint64_t l2;
		T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &l2, ids), 0);   /* group incomplete */
	}
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1003, 1, 100, 3, 4, 0, 8), &r), 0);
	T_EQ_INT(st(q).ready_groups, 1);
	T_EQ_INT(st(q).ready_samples, 4);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &lid, ids), 4);   /* whole group even if > max */
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 4);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, &ar), 0);
	T_EQ_INT(ar.done, 4);
	T_EQ_INT(st(q).done, 4);
	T_EQ_INT(st(q).depth[RL_QS_EXPANDED], 0);
	T_EQ_INT(st(q).groups, 1);
	T_EQ_INT(st(q).inflight, 4);   /* group 200 still expected */
	/* redelivered after done: dropped, for samples and prompt alike */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1001, 1, 100, 1, 4, 0, 8), &r), 0);
	T_EQ_INT(r.duplicates, 1);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(7777, 1, 100, 1, 4, 0, 8), &r), 0);
	T_EQ_INT(r.duplicates, 1);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(100, 1, 100, 0, 4, -1, 0), &r), 0);
	T_EQ_INT(r.duplicates, 1);
	/* acking a finished lease again: unknown lease */
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, &ar), RL_ENOENT);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &lid, ids), 0);
	/* a prompt asking 8 samples whose samples say their group holds 2:
	 * complete after 2 */
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(300, 1, 300, 0, 8, -1, 0), &r), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &lid, ids), 1);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(3000, 2, 300, 0, 2, 0, 8), &r), 0);
	T_EQ_INT(st(q).depth[RL_QS_EXPANDED], 1);
	T_EQ_INT(st(q).leases, 1);   /* group 200's prompt lease only */
	rl_queue_close(q);
}

static void
test_expiry_release(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qack_result ar;
	uint32_t exp;
	uint64_t lid, lid2, ids[256];

	rl_queue_config_default(&cfg);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1, 6, 0, 0, 1, 0, 4), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_GENERATED, 4, 100, &lid, ids), 4);
	T_EQ_INT(rl_queue_next_deadline(q), now + 100);
	T_EQ_INT(rl_queue_tick(q, now + 50, &exp), 0);
	T_EQ_INT(exp, 0);
	T_EQ_INT(rl_queue_tick(q, now + 100, &exp), 0);
	T_EQ_INT(exp, 1);
	T_EQ_INT(st(q).depth[RL_QS_GENERATED], 6);
	T_EQ_INT(st(q).expired_records, 4);
	/* expired work comes back first */
	T_EQ_INT(lease(q, RL_QSTAGE_GENERATED, 2, 0, &lid2, ids), 2);
	T_EQ_INT(ids[0], 1);
	/* the expired lease is gone; its holder's ack is late */
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, &ar), RL_ENOENT);
	/* release returns at once; extend moves the deadline */
	T_EQ_INT(ack(q, lid2, RL_QACK_EXTEND, &ar), 0);
	T_EQ_INT(ar.deadline_ms, now + cfg.lease_ms);
	T_EQ_INT(ack(q, lid2, RL_QACK_RELEASE, &ar), 0);
	T_EQ_INT(ar.done, 2);
	T_EQ_INT(st(q).depth[RL_QS_GENERATED], 6);
	T_EQ_INT(st(q).leases, 0);
	/* training lease expiry: the group is whole again */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(50, 2, 9, 0, 2, 0, 4), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 10, &lid, ids), 2);
	T_EQ_INT(rl_queue_tick(q, now + 20, &exp), 0);
	T_EQ_INT(st(q).ready_groups, 1);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 10, &lid, ids), 2);
	rl_queue_close(q);
}

static void
test_gate(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	uint64_t lid, plid, ids[256], v;

	/* B counts groups, as rl-rollout's --train-batch and rl-train's --batch:
	 * K = 0, B = 2 admits two prompts whether their groups hold 4 or 8
	 * samples (counted in samples, B = 2 would not even admit one group) */
	for (uint32_t gs = 4; gs <= 8; gs += 4) {
		rl_queue_config_default(&cfg);
		cfg.max_staleness = 0;
		cfg.train_batch = 2;
		T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
		T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(1, 5, 0, 0, gs, -1, 0), NULL), 0);
		T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &plid, ids), 2);
		T_EQ_INT(st(q).cap, 2 * gs);
		T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &lid, ids), 0);
		rl_queue_close(q);
	}

	/* K = 0, B = 1 group of 4: one prompt at a time (strictly on-policy) */
	rl_queue_config_default(&cfg);
	cfg.max_staleness = 0;
	cfg.train_batch = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(1, 3, 0, 0, 4, -1, 0), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &plid, ids), 1);
	T_EQ_INT(rl_queue_available(q, RL_QSTAGE_PROMPT, 0, 10), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &lid, ids), 0);
	T_OK(st(q).gate_blocked >= 1);
	/* the group goes through; while it trains nothing new is admitted */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(100, 4, 1, 0, 4, 0, 4), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 4, 0, &lid, ids), 4);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &plid, ids), 0);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(rl_queue_set_version(q, 1, &v), 0);
	T_EQ_INT(v, 1);
	T_EQ_INT(rl_queue_set_version(q, 0, &v), 0);   /* never goes back */
	T_EQ_INT(v, 1);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 10, 0, &plid, ids), 1);
	/* the rollout says it makes 8 per prompt: more than the cap, still one
	 * prompt at a time when nothing is in flight */
	rl_queue_close(q);

	/* the version bound: K = 1, trainer at 5; version 3 is stale */
	rl_queue_config_default(&cfg);
	cfg.max_staleness = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	rl_queue_set_version(q, 5, NULL);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10, 2, 1, 0, 2, 3, 4), NULL), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(20, 2, 2, 0, 2, 4, 4), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 2);
	T_EQ_INT(ids[0], 20);
	T_EQ_INT(st(q).stale_dropped, 2);
	T_EQ_INT(st(q).staleness[1], 0);   /* leased, not yet trained */
	T_EQ_INT(st(q).groups, 1);
	/* released, expired and leased again: each sample counts once, when
	 * acknowledged, at the version of the lease that trained it */
	T_EQ_INT(ack(q, lid, RL_QACK_RELEASE, NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 10, &lid, ids), 2);
	now += 20;
	T_EQ_INT(rl_queue_tick(q, now, NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 2);
	T_EQ_INT(st(q).staleness[1], 0);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(st(q).staleness[1], 2);
	T_EQ_INT(st(q).staleness_sum, 2);
	{
		uint64_t tot = 0;
		for (int i = 0; i < 9; i++)
			tot += st(q).staleness[i];
		T_EQ_INT(tot, 2);
	}
	T_EQ_INT(st(q).groups, 0);
	rl_queue_close(q);

	/* regen: the prompt goes back to the pool, the stale samples go */
	cfg.stale = RL_QSTALE_REGEN;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(1, 1, 0, 0, 2, -1, 0), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 1, 0, &plid, ids), 1);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10, 2, 1, 0, 2, 0, 4), NULL), 0);
	T_EQ_INT(st(q).depth[RL_QS_EXPANDED], 1);
	rl_queue_set_version(q, 3, NULL);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 0);
	T_EQ_INT(st(q).stale_regen, 2);
	T_EQ_INT(st(q).depth[RL_QS_PROMPT], 1);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 1, 0, &plid, ids), 1);
	/* regenerated samples (same ids) are accepted, at the new version */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10, 2, 1, 0, 2, 3, 4), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 2);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(st(q).staleness[0], 2);
	rl_queue_close(q);
}

static void
test_bad_and_busy(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result r;
	rl_buf b;
	uint64_t lid, ids[256];

	rl_queue_config_default(&cfg);
	cfg.max_bytes = 8000;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1, 4, 0, 0, 1, 0, 200), &r), 0);   /* ~4 x 900 */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(10, 4, 0, 0, 1, 0, 200), &r), RL_EBUSY);
	T_EQ_INT(st(q).busy, 1);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(20, 12, 0, 0, 1, 0, 200), &r), RL_ETOOBIG);
	/* a duplicate costs nothing and is not busy */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1, 4, 0, 0, 1, 0, 200), &r), 0);
	T_EQ_INT(r.duplicates, 4);
	/* scoring frees nothing, training does */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1, 4, 0, 0, 1, 0, 200), &r), 0);
	T_EQ_INT(r.replaced, 4);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 4);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(st(q).bytes, 0);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(10, 4, 0, 0, 1, 0, 200), &r), 0);

	/* malformed batches change nothing */
	b = mk(30, 2, 0, 0, 1, 0, 4);
	b.p[0] = 'X';
	T_EQ_INT(rl_queue_put(q, RL_QSTAGE_PROMPT, b.p, b.len, NULL, 0, now, &r), RL_EFORMAT);
	b.p[0] = 'R';
	T_EQ_INT(rl_queue_put(q, RL_QSTAGE_PROMPT, b.p, b.len - 8, NULL, 0, now, &r), RL_EFORMAT);
	rl_le32_put(b.p + 8, 1000000);   /* record count beyond the data */
	T_EQ_INT(rl_queue_put(q, RL_QSTAGE_PROMPT, b.p, b.len, NULL, 0, now, &r), RL_EFORMAT);
	rl_le32_put(b.p + 8, 2);
	rl_le32_put(b.p + 16, 1u << 30);  /* first record's length */
	T_OK(rl_queue_put(q, RL_QSTAGE_PROMPT, b.p, b.len, NULL, 0, now, &r) != 0);
	T_EQ_INT(rl_queue_put(q, 7, b.p, b.len, NULL, 0, now, &r), RL_EINVAL);
	rl_buf_fini(&b);
	/* a record without an id */
	{
		rl_traj_batch *tb;
		rl_traj *t;
		const void *p;
		size_t n;
		rl_traj_batch_create(&tb);
		rl_traj_create(&t);
		rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, "no id");
		rl_traj_batch_add(tb, t);
		rl_traj_batch_payload(tb, &p, &n);
		T_EQ_INT(rl_queue_put(q, RL_QSTAGE_PROMPT, p, n, NULL, 0, now, &r), RL_EFORMAT);
		rl_traj_destroy(t);
		rl_traj_batch_destroy(tb);
	}
	T_EQ_INT(st(q).depth[RL_QS_PROMPT], 0);
	T_EQ_INT(st(q).depth[RL_QS_GENERATED], 4);
	rl_queue_close(q);
}

static char dir[64];

static long long
file_size(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static void
journal_state(rl_queue *q, uint64_t *out)
{
	rl_queue_stats s = st(q);
	for (int i = 0; i < RL_QS_COUNT; i++)
		out[i] = s.depth[i];
	out[RL_QS_COUNT] = s.version;
	out[RL_QS_COUNT + 1] = s.leases;
	out[RL_QS_COUNT + 2] = s.inflight;
	out[RL_QS_COUNT + 3] = s.ready_groups;
	out[RL_QS_COUNT + 4] = s.bytes;
}

/* RL_QACK_TRAINED: records a trainer trained and holds until a full
 * checkpoint leave the in-flight count (the staleness gate) once, stay
 * leased (renewed), and count again when they come back (an expiry). */
static void
test_trained(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	uint64_t lid, lid2, ids[16];
	rl_qack_result res;

	rl_queue_config_default(&cfg);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10, 2, 1, 0, 2, 0, 4), NULL), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(20, 2, 2, 0, 2, 0, 4), NULL), 0);
	T_EQ_INT(st(q).inflight, 4);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 1000, &lid, ids), 2);
	rl_qack_req a = { .lease_id = lid, .kind = RL_QACK_TRAINED, .n = 2 };
	T_EQ_INT(rl_queue_ack(q, &a, ids, now, &res), 0);
	T_EQ_INT(res.done, 2);
	T_OK(res.deadline_ms >= now + cfg.lease_ms, "renewed");
	T_EQ_INT(st(q).inflight, 2);
	T_EQ_INT(rl_queue_ack(q, &a, ids, now, &res), 0);   /* a renewal marks again: no change */
	T_EQ_INT(st(q).inflight, 2);
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 2);
	T_EQ_INT(ack(q, lid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(st(q).inflight, 2);
	T_EQ_INT(st(q).done, 2);
	/* the other group: trained, then its trainer dies and the lease expires */
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 1000, &lid2, ids), 2);
	a.lease_id = lid2;
	T_EQ_INT(rl_queue_ack(q, &a, ids, now, &res), 0);
	T_EQ_INT(st(q).inflight, 0);
	T_EQ_INT(rl_queue_tick(q, now + 10 * (uint64_t)cfg.lease_ms, NULL), 0);
	T_EQ_INT(st(q).depth[RL_QS_SCORED], 2);
	T_EQ_INT(st(q).inflight, 2);
	rl_queue_close(q);
}

/* A resumed trainer sets the version back to its checkpoint's: a group
 * generated for a version the killed trainer reached is not stale then, and
 * the rewind survives a restart from the journal. */
static void
test_rewind(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	uint64_t v, lid, ids[16];

	snprintf(dir, sizeof dir, "/tmp/rlq-rewind.%d", (int)getpid());
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.max_staleness = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10, 2, 1, 0, 2, 3, 16), NULL), 0);
	T_EQ_INT(rl_queue_set_version(q, 6, &v), 0);
	T_EQ_INT(v, 6);
	T_EQ_INT(rl_queue_set_version(q, 4, &v), 0);
	T_EQ_INT(v, 6);   /* a plain version never goes back */
	T_EQ_INT(rl_queue_rewind_version(q, 4, &v), 0);
	T_EQ_INT(v, 4);
	T_EQ_INT(rl_queue_rewind_version(q, (uint64_t)RL_QUEUE_MAX_VERSION + 1, &v), RL_EINVAL);
	T_EQ_INT(v, 4);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(rl_queue_set_version(q, 0, &v), 0);
	T_EQ_INT(v, 4);
	/* version 3 at version 4, K = 1: leased, not dropped as stale (at 6 it was) */
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &lid, ids), 2);
	T_EQ_INT(st(q).stale_dropped, 0);
	rl_queue_close(q);
	rl_io_remove_tree(dir);
}

/* A trainer killed after writing its checkpoint of version 3, before the
 * broker heard of version 3 (the broker is at 2, K = 1), and before it
 * acknowledged the groups: the rewind to 3 holds the groups it had leased up
 * to version 3, judged at their lease (2), so they are not dropped as stale;
 * RL_QACK_GROUPS finishes the groups the checkpoint holds, only those, and
 * the journal replays both. */
static void
test_resume_groups(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qack_result res;
	rl_queue_stats s;
	uint64_t v, lid, ids[16];
	uint64_t r[4] = { 1, 1, 3, 3 }, bad[4] = { 3, 3, 1, 1 };
	rl_qack_req a = { .lease_id = 0, .kind = RL_QACK_GROUPS, .n = 4 };

	snprintf(dir, sizeof dir, "/tmp/rlq-resume.%d", (int)getpid());
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.max_staleness = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	for (int g = 1; g <= 3; g++)
		T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(10 * (uint64_t)g, 2, (uint64_t)g, 0, 2, 1, 16), NULL), 0);
	T_EQ_INT(rl_queue_set_version(q, 2, &v), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 6, 1000, &lid, ids), 6);
	T_EQ_INT(rl_queue_rewind_version(q, 3, &v), 0);
	T_EQ_INT(v, 3);
	T_EQ_INT(st(q).depth[RL_QS_SCORED], 6);
	T_EQ_INT(rl_queue_ack(q, &a, r, now, &res), 0);
	T_EQ_INT(res.done, 4);
	s = st(q);
	T_EQ_INT(s.done, 4);
	T_EQ_INT(s.depth[RL_QS_SCORED], 2);
	T_EQ_INT(s.staleness[1], 4);   /* leased at 2, generated by 1 */
	/* the same groups again: nothing left to finish */
	T_EQ_INT(rl_queue_ack(q, &a, r, now, &res), 0);
	T_EQ_INT(res.done, 0);
	T_EQ_INT(rl_queue_ack(q, &(rl_qack_req){ .kind = RL_QACK_GROUPS, .n = 4 }, bad, now, &res), RL_EINVAL);
	T_EQ_INT(rl_queue_ack(q, &(rl_qack_req){ .kind = RL_QACK_GROUPS, .n = 3 }, r, now, &res), RL_EINVAL);
	/* group 2 (version 1 at version 3, K = 1) was held by the dead trainer: leased, not stale */
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 1000, &lid, ids), 2);
	T_EQ_INT(ids[0], 20);
	s = st(q);
	T_EQ_INT(s.stale_dropped, 0);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	s = st(q);
	T_EQ_INT(s.done, 4);
	T_EQ_INT(s.depth[RL_QS_SCORED], 0);
	T_EQ_INT(s.depth[RL_QS_TRAINING], 2);
	T_EQ_INT(s.stale_dropped, 0);
	rl_queue_close(q);
	rl_io_remove_tree(dir);
}

static void
test_journal(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result r;
	uint64_t lid, tlid, ids[256], a[16], b[16];
	char path[128];
	int fd;

	snprintf(dir, sizeof dir, "/tmp/rlq-test.%d", (int)getpid());
	snprintf(path, sizeof path, "%s/journal", dir);
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.max_staleness = 2;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(1, 5, 0, 0, 2, -1, 0), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_PROMPT, 2, 0, &lid, ids), 2);
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(100, 2, 1, 0, 2, 0, 16), NULL), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(200, 2, 2, 0, 2, 0, 16), NULL), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(300, 2, 3, 0, 2, 0, 16), NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &tlid, ids), 2);
	T_EQ_INT(ack(q, tlid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &tlid, ids), 2);
	T_EQ_INT(lease(q, RL_QSTAGE_GENERATED, 1, 0, &lid, ids), 1);
	rl_queue_set_version(q, 1, NULL);
	T_OK(rl_queue_journal_seq(q) > 0);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	journal_state(q, a);
	rl_queue_close(q);

	/* replay: the same state, the same leases (ackable), finished ids remembered */
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	journal_state(q, b);
	for (int i = 0; i < RL_QS_COUNT + 5; i++)
		T_OK(a[i] == b[i], "state %d: %llu before, %llu after replay", i, (unsigned long long)a[i],
		    (unsigned long long)b[i]);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(200, 2, 2, 0, 2, 0, 16), &r), 0);
	T_EQ_INT(r.duplicates, 2);
	T_EQ_INT(ack(q, tlid, RL_QACK_DONE, NULL), 0);
	T_EQ_INT(st(q).done, 4);   /* replayed acks count too */
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	journal_state(q, a);
	/* compaction keeps the state and shrinks nothing that is live */
	T_EQ_INT(rl_queue_journal_compact(q), 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	journal_state(q, b);
	for (int i = 0; i < RL_QS_COUNT + 5; i++)
		T_OK(a[i] == b[i], "state %d: %llu before, %llu after compaction", i, (unsigned long long)a[i],
		    (unsigned long long)b[i]);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(200, 2, 2, 0, 2, 0, 16), &r), 0);
	T_EQ_INT(r.duplicates, 2);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(1, 1, 0, 0, 2, -1, 0), &r), 0);
	T_EQ_INT(r.duplicates, 1);
	/* the prompt lease survived: the rollout's samples complete it */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(400, 2, 2, 0, 2, 0, 16), &r), 0);
	T_EQ_INT(r.duplicates, 2);   /* group 2 finished before */
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	journal_state(q, a);
	rl_queue_close(q);

	/* a torn tail is cut: append half an op */
	fd = open(path, O_WRONLY | O_APPEND);
	T_OK(fd >= 0);
	{
		uint8_t junk[20] = { 0x5e, 0x2a, 0x4d, 0x18, 200, 0, 0, 0, 1, 2, 3 };
		T_EQ_INT(write(fd, junk, sizeof junk), sizeof junk);
	}
	close(fd);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	journal_state(q, b);
	T_EQ_INT(memcmp(a, b, sizeof(uint64_t) * (RL_QS_COUNT + 5)), 0);
	T_EQ_INT(put(q, RL_QSTAGE_PROMPT, mk(50, 1, 0, 0, 2, -1, 0), NULL), 0);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(st(q).depth[RL_QS_PROMPT], a[RL_QS_PROMPT] + 1);
	rl_queue_close(q);

	/* damage in the middle (intact ops after it) is refused, not skipped */
	{
		char *data;
		size_t len;
		T_EQ_INT(rl_io_read_file(path, 0, &data, &len), 0);
		data[len / 2] ^= 0x55;
		T_EQ_INT(rl_io_write_atomic(path, data, len, 0), 0);
		free(data);
		T_OK(rl_queue_open(&q, &cfg, now) != 0);
		/* --recover-journal: the changes before the damage, the file copied
		 * first and cut, so the next start needs no option */
		char pat[4200];
		glob_t gl;
		cfg.recover = 1;
		T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
		rl_queue_close(q);
		cfg.recover = 0;
		T_OK(file_size(path) < (long long)len, "cut at the damage");
		T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
		rl_queue_close(q);
		snprintf(pat, sizeof pat, "%s.damaged-*", path);
		T_EQ_INT(glob(pat, 0, NULL, &gl), 0);
		T_EQ_INT(gl.gl_pathc, 1);
		if (gl.gl_pathc == 1) {
			T_EQ_INT(file_size(gl.gl_pathv[0]), (long long)len);
			unlink(gl.gl_pathv[0]);
		}
		globfree(&gl);
	}

	/* a file with no whole op at its start is not cut to nothing (not all
	 * dropped as a "torn tail"): a torn first write is shorter than the head
	 * op, which is written alone */
	{
		char junk[5000];
		for (size_t i = 0; i < sizeof junk; i++)
			junk[i] = (char)(i * 131 + 7);
		T_EQ_INT(rl_io_write_atomic(path, junk, sizeof junk, 0), 0);
		T_EQ_INT(rl_queue_open(&q, &cfg, now), RL_EFORMAT);
		T_EQ_INT(file_size(path), sizeof junk);
		T_EQ_INT(rl_io_write_atomic(path, junk, 20, 0), 0);   /* a torn head: cut */
		T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
		T_EQ_INT(st(q).depth[RL_QS_PROMPT], 0);
		rl_queue_close(q);
	}

	/* automatic compaction bounds the file */
	unlink(path);
	cfg.compact_bytes = 1;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	for (int i = 0; i < 50; i++) {
		T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1000 + 2 * i, 2, 5000 + i, 0, 2, 0, 64), NULL), 0);
		T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &tlid, ids), 2);
		T_EQ_INT(ack(q, tlid, RL_QACK_DONE, NULL), 0);
		T_EQ_INT(rl_queue_journal_sync(q), 0);
	}
	T_OK(st(q).compactions >= 40);
	{
		struct stat sb;
		T_EQ_INT(stat(path, &sb), 0);
		T_OK(sb.st_size < 4096 * 64, "journal is %lld bytes", (long long)sb.st_size);
	}
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1000, 2, 5000, 0, 2, 0, 64), &r), 0);
	T_EQ_INT(r.duplicates, 2);

	/* a second queue on the same directory is refused while the first is open */
	{
		rl_queue *q2 = NULL;
		T_EQ_INT(rl_queue_open(&q2, &cfg, now), RL_EBUSY);
		T_OK(q2 == NULL);
		rl_queue_close(q);
		T_EQ_INT(rl_queue_open(&q2, &cfg, now), 0);
		q = q2;
	}
	rl_queue_close(q);
	unlink(path);
	{
		char lock[300];
		snprintf(lock, sizeof lock, "%s/lock", dir);
		unlink(lock);
	}
	T_EQ_INT(rmdir(dir), 0);
}


/* A journal write that fails half way (here EFBIG past RLIMIT_FSIZE, as a
 * full disk would) leaves nothing behind it: the torn bytes are cut and no
 * later write goes in, even once there is room again: a write that got
 * through after them would turn the torn bytes into damage in the middle,
 * and the broker would refuse to start. */
static void
test_journal_write_fails(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	struct rlimit old, lim;
	char path[128];
	long long good;

	snprintf(dir, sizeof dir, "/tmp/rlq-test-wf.%d", (int)getpid());
	snprintf(path, sizeof path, "%s/journal", dir);
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1, 4, 0, 0, 1, 0, 16), NULL), 0);
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	good = file_size(path);
	T_OK(good > 0);

	signal(SIGXFSZ, SIG_IGN);
	T_EQ_INT(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = (rlim_t)good + 64;
	T_EQ_INT(setrlimit(RLIMIT_FSIZE, &lim), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(100, 64, 0, 0, 1, 0, 512), NULL), 0);
	T_OK(rl_queue_journal_sync(q) != 0, "a write past the file size limit failed");
	T_EQ_INT(setrlimit(RLIMIT_FSIZE, &old), 0);
	T_EQ_INT(file_size(path), good);   /* the torn bytes are gone */

	/* the server's group commit: a request whose op went out in the
	 * failed batch takes what is pending then (often nothing) and writes
	 * it; success would tell it that its op is durable */
	{
		rl_buf none;
		rl_buf_init(&none);
		T_EQ_INT(rl_queue_journal_write(q, &none), RL_EIO);
	}
	/* room again: still nothing is written after the failure */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1000, 1, 0, 0, 1, 0, 4), NULL), 0);
	T_EQ_INT(rl_queue_journal_sync(q), RL_EIO);
	T_EQ_INT(file_size(path), good);
	rl_queue_close(q);

	/* the restart finds the journal whole, with what was written before */
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(st(q).depth[RL_QS_SCORED], 4);
	rl_queue_close(q);
	unlink(path);
	snprintf(path, sizeof path, "%s/lock", dir);
	unlink(path);
	T_EQ_INT(rmdir(dir), 0);
}

/* A compaction that cannot be written (a full disk; here DIR/journal.tmp is
 * a directory) is postponed, not fatal: the journal stays whole and goes on
 * taking ops, and a restart replays it (rather than compact first and fail
 * to start at all). */
static void
test_journal_compact_fails(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result r;
	uint64_t tlid, ids[256];
	char path[128], tmp[140];

	snprintf(dir, sizeof dir, "/tmp/rlq-test-cf.%d", (int)getpid());
	snprintf(path, sizeof path, "%s/journal", dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.compact_bytes = 1;
	T_EQ_INT(rl_io_mkdir_p(dir, 0755), 0);
	T_EQ_INT(mkdir(tmp, 0755), 0);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	for (int i = 0; i < 20; i++) {
		T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(100 + 2 * i, 2, 500 + i, 0, 2, 0, 64), NULL), 0);
		T_EQ_INT(rl_queue_journal_sync(q), 0);
		T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &tlid, ids), 2);
		T_EQ_INT(rl_queue_journal_sync(q), 0);
		if (i < 18) {   /* little live data: a compaction is due at every sync */
			T_EQ_INT(ack(q, tlid, RL_QACK_DONE, NULL), 0);
			T_EQ_INT(rl_queue_journal_sync(q), 0);
		}
	}
	T_EQ_INT(st(q).compactions, 0);
	T_OK(file_size(path) > 2 * (long long)st(q).bytes,   /* due, but it could not be written */
	    "journal %lld bytes, live %llu", file_size(path), (unsigned long long)st(q).bytes);
	rl_queue_close(q);

	/* the restart does not need the compaction either */
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 4);
	T_EQ_INT(st(q).done, 36);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(100, 2, 500, 0, 2, 0, 64), &r), 0);
	T_EQ_INT(r.duplicates, 2);
	/* room again: the next compaction goes through */
	T_EQ_INT(rmdir(tmp), 0);
	for (int i = 20; i < 200 && st(q).compactions == 0; i++) {
		T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(100 + 2 * i, 2, 500 + i, 0, 2, 0, 64), NULL), 0);
		T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &tlid, ids), 2);
		T_EQ_INT(ack(q, tlid, RL_QACK_DONE, NULL), 0);
		T_EQ_INT(rl_queue_journal_sync(q), 0);
	}
	T_OK(st(q).compactions > 0);
	rl_queue_close(q);
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 4);
	rl_queue_close(q);
	unlink(path);
	snprintf(path, sizeof path, "%s/lock", dir);
	unlink(path);
	T_EQ_INT(rmdir(dir), 0);
}

/* Options are not journaled: a restart with other ones replays the same
 * state and applies the new ones from then on (docs/queue.md). */
static void
test_journal_new_options(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	uint64_t lid, ids[256], live;
	char path[128];

	snprintf(dir, sizeof dir, "/tmp/rlq-test-no.%d", (int)getpid());
	rl_queue_config_default(&cfg);
	cfg.data_dir = dir;
	cfg.fsync = 0;
	cfg.max_staleness = 4;
	cfg.lease_ms = 60000;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1, 2, 1, 0, 2, 0, 8), NULL), 0);   /* version 0 */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(3, 2, 2, 0, 2, 3, 8), NULL), 0);   /* version 3 */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(5, 2, 3, 0, 2, 3, 8), NULL), 0);
	T_EQ_INT(rl_queue_set_version(q, 3, NULL), 0);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 2, 0, &lid, ids), 2);   /* group 1: 3 - 0 <= 4 */
	T_EQ_INT(rl_queue_journal_sync(q), 0);
	live = st(q).bytes;
	rl_queue_close(q);

	/* K 0, a bound below the live bytes, a short lease timeout */
	cfg.max_staleness = 0;
	cfg.max_bytes = live - 1;
	cfg.lease_ms = 10;
	T_EQ_INT(rl_queue_open(&q, &cfg, now + 1000), 0);
	T_EQ_INT(st(q).depth[RL_QS_SCORED], 4);       /* nothing dropped by the bound */
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 2);     /* the old lease keeps its 60 s */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(7, 2, 4, 0, 2, 3, 8), NULL), RL_EBUSY);
	T_EQ_INT(rl_queue_tick(q, now + 2000, NULL), 0);
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 2);
	T_EQ_INT(rl_queue_tick(q, now + 61000, NULL), 0);
	T_EQ_INT(st(q).depth[RL_QS_TRAINING], 0);     /* expired: group 1 is back */
	/* K = 0 now: group 1 (version 0, trainer at 3) is stale at the next lease */
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 4);
	T_EQ_INT(st(q).stale_dropped, 2);
	rl_queue_close(q);
	snprintf(path, sizeof path, "%s/journal", dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/lock", dir);
	unlink(path);
	T_EQ_INT(rmdir(dir), 0);
}

/* What a hostile client could do to the broker's state: a version past
 * what records hold (every group stale for ever after), a lease asking for
 * 2^32 - 1 records (an allocation sized by it), scored puts that grow their
 * records past --max-bytes. */
static void
test_hostile(void)
{
	rl_queue_config cfg;
	rl_queue *q;
	rl_qput_result r;
	rl_qlease_req lr = { .stage = RL_QSTAGE_GENERATED, .max_records = UINT32_MAX };
	rl_qlease_info info;
	rl_buf out;
	uint64_t v = 0, lid, ids[256];

	rl_queue_config_default(&cfg);
	cfg.max_bytes = 8000;
	T_EQ_INT(rl_queue_open(&q, &cfg, now), 0);
	T_EQ_INT(rl_queue_set_version(q, 1ULL << 63, &v), RL_EINVAL);
	T_EQ_INT(rl_queue_set_version(q, UINT64_MAX, &v), RL_EINVAL);
	T_EQ_INT(rl_queue_set_version(q, (uint64_t)RL_QUEUE_MAX_VERSION + 1, &v), RL_EINVAL);
	T_OK(v == 0, "the version is unchanged: %llu", (unsigned long long)v);
	/* three small generated records, then a lease for 2^32 - 1 of them */
	T_EQ_INT(put(q, RL_QSTAGE_GENERATED, mk(1, 3, 0, 0, 1, 0, 4), &r), 0);
	rl_buf_init(&out);
	T_EQ_INT(rl_queue_lease(q, &lr, now, &info, &out), 0);
	T_EQ_INT(info.n, 3);
	rl_buf_fini(&out);
	T_EQ_INT(ack(q, info.lease_id, RL_QACK_RELEASE, NULL), 0);
	/* scored records 2,000 tokens long in place of 4-token ones: 24 KB more
	 * than the 8 KB bound, refused; the stored bytes stay within it */
	T_OK(put(q, RL_QSTAGE_SCORED, mk(1, 3, 0, 0, 1, 0, 2000), &r) != 0);
	T_OK(st(q).bytes <= 8000, "%llu bytes stored", (unsigned long long)st(q).bytes);
	T_EQ_INT(r.replaced, 0);
	/* a growth that fits is taken */
	T_EQ_INT(put(q, RL_QSTAGE_SCORED, mk(1, 1, 0, 0, 1, 0, 40), &r), 0);
	T_EQ_INT(r.replaced, 1);
	T_EQ_INT(lease(q, RL_QSTAGE_SCORED, 8, 0, &lid, ids), 1);
	T_EQ_INT(rl_queue_set_version(q, RL_QUEUE_MAX_VERSION, &v), 0);
	T_OK(v == RL_QUEUE_MAX_VERSION);
	rl_queue_close(q);
}

int
main(void)
{
	T_BEGIN("test_queue");
	rl_log_init("test_queue", RL_LOG_QUIET);
	test_hostile();
	test_lifecycle();
	test_expiry_release();
	test_gate();
	test_bad_and_busy();
	test_journal();
	test_rewind();
	test_resume_groups();
	test_trained();
	test_journal_write_fails();
	test_journal_compact_fails();
	test_journal_new_options();
	T_END();
}

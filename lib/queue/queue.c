/*
 * queue.c — the broker's state machine and journal (see queue.h).
 *
 * Layout: entries (prompts and samples), groups and leases live in slabs
 * indexed by uint32 (0 = none), found by id through open-addressing hash maps.
 * Prompts waiting for rollout and samples waiting for reward sit on intrusive
 * FIFOs; groups complete and ready for a trainer on a third.  Every mutation
 * goes through an apply_* function that also appends the op to the journal,
 * and replay calls the same functions, so live and replayed state agree.
 *
 * Leaves out: sockets, threads and waiting (qserve.c).
 */
#include "queue/queue.h"
#include "base/hash.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "stream/traj.h"

#define NIL 0u
#define ENT_OVERHEAD 160u          /* bytes charged per record besides its data */
#define MAX_GROUP_SIZE 65536u
#define RATE_SLOTS 11

/* ---- u64 -> u32 hash map (linear probing, backward-shift deletion) ------------ */
typedef struct qmap {
	uint64_t *keys;
	uint32_t *vals;   /* 0 = empty slot */
	size_t cap, n;    /* cap: power of two */
} qmap;

static uint32_t
map_get(const qmap *m, uint64_t k)
{
	if (m->cap == 0)
		return NIL;
	for (size_t i = rl_hash_mix(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (m->vals[i] == NIL)
			return NIL;
		if (m->keys[i] == k)
			return m->vals[i];
	}
}

static int map_put(qmap *m, uint64_t k, uint32_t v);

static int
map_grow(qmap *m)
{
	qmap n = { 0 };
	size_t cap = m->cap ? m->cap * 2 : 1024;

	n.keys = rl_try_calloc(cap, sizeof *n.keys, "queue index");
	n.vals = rl_try_calloc(cap, sizeof *n.vals, "queue index");
	if (n.keys == NULL || n.vals == NULL) {
		free(n.keys);
		free(n.vals);
		return RL_ENOMEM;
	}
	n.cap = cap;
	for (size_t i = 0; i < m->cap; i++)
		if (m->vals[i] != NIL)
			map_put(&n, m->keys[i], m->vals[i]);
	free(m->keys);
	free(m->vals);
	*m = n;
	return RL_OK;
}

/* Insert or overwrite. */
static int
map_put(qmap *m, uint64_t k, uint32_t v)
{
	int rv;

	if ((m->n + 1) * 4 >= m->cap * 3 && (rv = map_grow(m)) != 0)
		return rv;
	for (size_t i = rl_hash_mix(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (m->vals[i] == NIL) {
			m->keys[i] = k;
			m->vals[i] = v;
			m->n++;
			return RL_OK;
		}
		if (m->keys[i] == k) {
			m->vals[i] = v;
			return RL_OK;
		}
	}
}

static void
map_del(qmap *m, uint64_t k)
{
	size_t mask = m->cap - 1, i, j;

	if (m->cap == 0)
		return;
	for (i = rl_hash_mix(k) & mask;; i = (i + 1) & mask) {
		if (m->vals[i] == NIL)
			return;
		if (m->keys[i] == k)
			break;
	}
	m->vals[i] = NIL;
	m->n--;
	/* shift back the entries of the cluster that follows */
	for (j = (i + 1) & mask; m->vals[j] != NIL; j = (j + 1) & mask) {
		size_t home = rl_hash_mix(m->keys[j]) & mask;
		int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
		if (movable) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			m->vals[j] = NIL;
			i = j;
		}
	}
}

static void
map_free(qmap *m)
{
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof *m);
}

/* ---- window of finished ids: a ring plus a set ------------------------------------ */
typedef struct qwin {
	uint64_t *ring;
	size_t cap, head, n;
	qmap set;
} qwin;

static int
win_has(const qwin *w, uint64_t id)
{
	return map_get(&w->set, id) != NIL;
}

static int
win_add(qwin *w, uint64_t id)
{
	if (w->cap == 0 || win_has(w, id))
		return RL_OK;
	if (w->n == w->cap) {
		map_del(&w->set, w->ring[w->head]);
		w->n--;
		w->head = (w->head + 1) % w->cap;
	}
	w->ring[(w->head + w->n) % w->cap] = id;
	w->n++;
	return map_put(&w->set, id, 1);
}

/* ---- entries, groups, leases -------------------------------------------------------- */
typedef struct qent {
	uint64_t id, group, lease;
	int64_t version;        /* first policy version that generated it; -1 unknown */
	uint8_t *data;          /* owned serialised record */
	uint32_t len, index, gsize;
	uint32_t hint;          /* prompt: samples expected for its group; a sample leased
	                         * to a trainer: the broker's version then (versions fit:
	                         * RL_QUEUE_MAX_VERSION), kept by snapshots */
	uint32_t prev, next;    /* FIFO links (prompt or generated FIFO) */
	uint32_t grp;
	uint8_t state, is_prompt, used;
	uint8_t trained;        /* RL_QACK_TRAINED: leased to a trainer that trained it; not in flight */
	uint8_t aborted;        /* prompt: aborted by early stop and re-queued (1), then leased
	                         * again (2, version = the broker's version at that lease) */
	uint8_t held;           /* a training lease of it ended untrained (expired, or a resumed
	                         * trainer's rewind): while the version is at most held_at it is
	                         * judged stale or not at hint, the version it was leased at */
	uint32_t held_at;       /* the version when it came back */
} qent;

typedef struct qgrp {
	uint64_t gid;
	uint32_t gsize, prompt;
	uint32_t *slot;         /* (gsize) sample entry per index, NIL if absent */
	uint32_t nsamples, nscored, ndone, expect, ready_n;
	uint32_t prev, next;
	uint8_t ready, used;
} qgrp;

typedef struct qlease {
	uint64_t lid, deadline;
	uint64_t *ids;
	uint32_t n, cap, nlive, next;
	uint8_t stage, used;
} qlease;

typedef struct qlist { uint32_t head, tail; } qlist;

struct rl_queue {
	rl_queue_config cfg;
	char *dir, *jpath;

	qent *ent; size_t nent, capent; uint32_t freeent;
	qgrp *grp; size_t ngrp, capgrp; uint32_t freegrp;
	qlease *lease; size_t nlease_slots, caplease; uint32_t freelease;
	qmap byid, bygroup, bylease;
	qwin done_ids, done_groups;
	qlist prompts, generated, ready;

	uint64_t version, next_lid, inflight;
	uint32_t gate_gsize;   /* the group size of the last prompt leased, for the stats' cap */
	rl_queue_stats st;

	rl_traj *tmp;
	struct recmeta { uint64_t id, group; int64_t version; uint32_t index, gsize, off, len; uint8_t has_group; } *meta;
	size_t capmeta;

	/* the broker's version when a group last went stale (stale_seen: one
	 * has), which keeps early stop on under auto K (estop_active) */
	uint64_t stale_at;
	int stale_seen;

	/* journal */
	int jfd, replaying;
	int lockfd;             /* DIR/lock, flock'ed for the queue's life */
	rl_buf jpend;
	uint64_t jseq, jsynced;
	uint64_t jbytes;        /* file size; written by rl_queue_journal_write */
	int jbroken;            /* a write failed: the file ends at jbytes, nothing more goes in */
	uint64_t jcompact_at;   /* after a compaction failed: not tried again below this size */

	/* throughput samples */
	struct { uint64_t t, put[RL_QSTAGE_COUNT], leased[RL_QSTAGE_COUNT], done; } rate[RATE_SLOTS];
	size_t nrate;
};

const char *
rl_qstate_name(int s)
{
	static const char *const names[RL_QS_COUNT] = {
		"prompt", "leased", "generated", "scoring", "scored", "training", "expanded"
	};
	return s >= 0 && s < RL_QS_COUNT ? names[s] : "?";
}

void
rl_queue_config_default(rl_queue_config *c)
{
	memset(c, 0, sizeof *c);
	c->lease_ms = 60000;
	c->max_bytes = (uint64_t)1 << 30;
	c->compact_bytes = (uint64_t)256 << 20;
	c->dedup_window = 1u << 20;
	c->journal_level = 1;
	c->fsync = 1;
}

/* Slab allocation: index 0 is never used. */
#define SLAB_ALLOC(q, arr, cnt, cap, freel, out, what)                                   \
	do {                                                                             \
		if ((q)->freel != NIL) {                                                 \
			(out) = (q)->freel;                                              \
			(q)->freel = (q)->arr[(out)].next;                               \
		} else {                                                                 \
			if ((q)->cnt + 1 >= (q)->cap) {                                  \
				size_t nc_ = (q)->cap ? (q)->cap * 2 : 1024;             \
				void *np_ = realloc((q)->arr, nc_ * sizeof *(q)->arr);   \
				if (np_ == NULL) {                                       \
					rl_error("cannot allocate %s table", what);      \
					return RL_ENOMEM;                                \
				}                                                        \
				(q)->arr = np_;                                          \
				(q)->cap = nc_;                                          \
				if ((q)->cnt == 0)                                       \
					(q)->cnt = 1;                                    \
			}                                                                \
			(out) = (uint32_t)(q)->cnt++;                                    \
		}                                                                        \
		memset(&(q)->arr[(out)], 0, sizeof *(q)->arr);                           \
		(q)->arr[(out)].used = 1;                                                \
	} while (0)

/* FIFO helpers over entries or groups (both have prev/next). */
#define LIST_INSERT(arr, l, i, at_head)                                                  \
	do {                                                                             \
		if (at_head) {                                                           \
			(arr)[i].prev = NIL;                                             \
			(arr)[i].next = (l).head;                                        \
			if ((l).head) (arr)[(l).head].prev = (i); else (l).tail = (i);   \
			(l).head = (i);                                                  \
		} else {                                                                 \
			(arr)[i].next = NIL;                                             \
			(arr)[i].prev = (l).tail;                                        \
			if ((l).tail) (arr)[(l).tail].next = (i); else (l).head = (i);   \
			(l).tail = (i);                                                  \
		}                                                                        \
	} while (0)
#define LIST_REMOVE(arr, l, i)                                                           \
	do {                                                                             \
		if ((arr)[i].prev) (arr)[(arr)[i].prev].next = (arr)[i].next; else (l).head = (arr)[i].next; \
		if ((arr)[i].next) (arr)[(arr)[i].next].prev = (arr)[i].prev; else (l).tail = (arr)[i].prev; \
		(arr)[i].prev = (arr)[i].next = NIL;                                     \
	} while (0)

static int
is_sample_state(int s)
{
	return s == RL_QS_GENERATED || s == RL_QS_SCORING || s == RL_QS_SCORED || s == RL_QS_TRAINING;
}

static void
group_update_ready(rl_queue *q, uint32_t gi, int at_head)
{
	qgrp *g = &q->grp[gi];
	int want = g->gsize > 0 && g->nscored > 0 && g->nscored + g->ndone == g->gsize;

	if (want && !g->ready) {
		LIST_INSERT(q->grp, q->ready, gi, at_head);
		g->ready = 1;
		g->ready_n = g->nscored;
		q->st.ready_samples += g->ready_n;
		q->st.ready_groups++;
	} else if (!want && g->ready) {
		LIST_REMOVE(q->grp, q->ready, gi);
		g->ready = 0;
		q->st.ready_samples -= g->ready_n;
		q->st.ready_groups--;
	}
}

/* Moves entry i from its state to s, keeping lists, depths, group counts and
 * the in-flight count right.  s == RL_QS_COUNT means "leaving" (freed). */
static void
ent_set_state(rl_queue *q, uint32_t i, int s, int at_head)
{
	qent *e = &q->ent[i];
	qgrp *g = &q->grp[e->grp];
	int old = e->state;

	if (old < RL_QS_COUNT) {
		q->st.depth[old]--;
		if (old == RL_QS_PROMPT)
			LIST_REMOVE(q->ent, q->prompts, i);
		else if (old == RL_QS_GENERATED)
			LIST_REMOVE(q->ent, q->generated, i);
		else if (old == RL_QS_SCORED)
			g->nscored--;
		if (is_sample_state(old) && !e->trained)
			q->inflight--;
	}
	e->trained = 0;
	e->state = (uint8_t)s;
	if (s < RL_QS_COUNT) {
		q->st.depth[s]++;
		if (s == RL_QS_PROMPT)
			LIST_INSERT(q->ent, q->prompts, i, at_head);
		else if (s == RL_QS_GENERATED)
			LIST_INSERT(q->ent, q->generated, i, at_head);
		else if (s == RL_QS_SCORED)
			g->nscored++;
		if (is_sample_state(s))
			q->inflight++;
	}
	if (old == RL_QS_SCORED || s == RL_QS_SCORED)
		group_update_ready(q, e->grp, at_head);
}

static int
group_get(rl_queue *q, uint64_t gid, uint32_t *out)
{
	uint32_t gi = map_get(&q->bygroup, gid);
	int rv;

	if (gi == NIL) {
		SLAB_ALLOC(q, grp, ngrp, capgrp, freegrp, gi, "group");
		q->grp[gi].gid = gid;
		if ((rv = map_put(&q->bygroup, gid, gi)) != 0) {
			q->grp[gi].used = 0;
			q->grp[gi].next = q->freegrp;
			q->freegrp = gi;
			return rv;
		}
		q->st.groups++;
	}
	*out = gi;
	return RL_OK;
}

static void
group_free(rl_queue *q, uint32_t gi, int finished)
{
	qgrp *g = &q->grp[gi];

	if (g->ready) {
		g->nscored = 0;
		group_update_ready(q, gi, 0);
	}
	if (finished)
		win_add(&q->done_groups, g->gid);
	map_del(&q->bygroup, g->gid);
	free(g->slot);
	q->st.bytes -= (uint64_t)g->gsize * sizeof *g->slot; /* charged by group_set_size */
	memset(g, 0, sizeof *g);
	g->next = q->freegrp;
	q->freegrp = gi;
	q->st.groups--;
}

static int
group_set_size(rl_queue *q, qgrp *g, uint32_t gsize)
{
	if (g->gsize == gsize)
		return RL_OK;
	if (g->gsize != 0)
		return RL_EINVAL;
	if ((g->slot = rl_try_calloc(gsize, sizeof *g->slot, "group")) == NULL)
		return RL_ENOMEM;
	g->gsize = gsize;
	/* a group's slots count against --max-bytes: 20000 groups of group_size
	 * 65536 would otherwise take 5 GB under a bound of a few MB */
	q->st.bytes += (uint64_t)gsize * sizeof *g->slot;
	return RL_OK;
}

/* ---- leases ------------------------------------------------------------------------------ */
static qlease *
lease_find(rl_queue *q, uint64_t lid)
{
	uint32_t li = map_get(&q->bylease, lid);
	return li == NIL ? NULL : &q->lease[li];
}

static int
lease_new(rl_queue *q, uint64_t lid, int stage, uint64_t deadline, qlease **out)
{
	uint32_t li;
	int rv;

	SLAB_ALLOC(q, lease, nlease_slots, caplease, freelease, li, "lease");
	q->lease[li].lid = lid;
	q->lease[li].stage = (uint8_t)stage;
	q->lease[li].deadline = deadline;
	if ((rv = map_put(&q->bylease, lid, li)) != 0)
		return rv;
	q->st.leases++;
	if (lid >= q->next_lid)
		q->next_lid = lid + 1;
	*out = &q->lease[li];
	return RL_OK;
}

static void
lease_free(rl_queue *q, uint64_t lid)
{
	uint32_t li = map_get(&q->bylease, lid);
	qlease *l;

	if (li == NIL)
		return;
	l = &q->lease[li];
	map_del(&q->bylease, lid);
	free(l->ids);
	memset(l, 0, sizeof *l);
	l->next = q->freelease;
	q->freelease = li;
	q->st.leases--;
}

static int
lease_attach(rl_queue *q, qlease *l, uint32_t ei)
{
	if (l->n == l->cap) {
		uint32_t nc = l->cap ? l->cap * 2 : 64;
		uint64_t *p = realloc(l->ids, nc * sizeof *p);
		if (p == NULL)
			return RL_ENOMEM;
		l->ids = p;
		l->cap = nc;
	}
	l->ids[l->n++] = q->ent[ei].id;
	l->nlive++;
	q->ent[ei].lease = l->lid;
	return RL_OK;
}

static void
lease_detach(rl_queue *q, uint32_t ei)
{
	qent *e = &q->ent[ei];
	qlease *l;

	if (e->lease == 0)
		return;
	if ((l = lease_find(q, e->lease)) != NULL && --l->nlive == 0)
		lease_free(q, l->lid);
	e->lease = 0;
}

/* ---- journal ops -------------------------------------------------------------------------- */
enum { J_HEAD = 1, J_PUT, J_LEASE, J_ACK, J_EXPIRE, J_VERSION, J_STALE, J_DEDUP, J_SNAPENT, J_SNAPLEASE,
       J_SNAPGROUP, J_MAXSTALE, J_ABORT };
#define J_SKIP_MAGIC 0x184D2A5Eu
#define J_FIXED 32u   /* type, stage, pad, n, a, b, c */

static uint32_t crc_table[256];

static void
crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		crc_table[i] = c;
	}
}

static uint32_t
crc32(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;

	if (crc_table[1] == 0)
		crc_init();
	while (n--)
		c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
	return c ^ 0xFFFFFFFFu;
}

/* Appends one op as a skippable frame to buf. */
static int
jop_to(rl_buf *buf, int type, int stage, uint64_t a, uint64_t b, uint64_t c, const uint64_t *ids, uint32_t n)
{
	size_t clen = J_FIXED + (size_t)n * 8 + 4;
	uint8_t *p;
	int rv;

	if ((rv = rl_buf_reserve(buf, 8 + clen)) != 0)
		return rv;
	p = buf->p + buf->len;
	rl_le32_put(p, J_SKIP_MAGIC);
	rl_le32_put(p + 4, (uint32_t)clen);
	p += 8;
	p[0] = (uint8_t)type;
	p[1] = (uint8_t)stage;
	p[2] = p[3] = 0;
	rl_le32_put(p + 4, n);
	rl_le64_put(p + 8, a);
	rl_le64_put(p + 16, b);
	rl_le64_put(p + 24, c);
	for (uint32_t i = 0; i < n; i++)
		rl_le64_put(p + J_FIXED + 8 * i, ids[i]);
	rl_le32_put(p + clen - 4, crc32(p, clen - 4));
	buf->len += 8 + clen;
	return RL_OK;
}

static int
jop(rl_queue *q, int type, int stage, uint64_t a, uint64_t b, uint64_t c, const uint64_t *ids, uint32_t n)
{
	int rv;

	if (q->jfd < 0 || q->replaying)
		return RL_OK;
	if ((rv = jop_to(&q->jpend, type, stage, a, b, c, ids, n)) != 0)
		return rv;
	q->jseq++;
	return RL_OK;
}

/* ---- records -------------------------------------------------------------------------------- */
/* Parses a batch into q->meta (offsets into batch).  Everything is checked
 * before anything changes. */
static int
parse_batch(rl_queue *q, const uint8_t *p, size_t n, size_t *count)
{
	size_t nrec, off, hlen;
	rl_traj_limits lim;
	char what[64];
	int rv;

	rl_traj_limits_default(&lim);
	if (n < RL_TRAJ_HEADER_LEN || memcmp(p, RL_TRAJ_MAGIC, 4) != 0) {
		rl_error("put: body is not a record batch (bad magic)");
		return RL_EFORMAT;
	}
	if (rl_le16_get(p + 4) != RL_TRAJ_VERSION) {
		rl_error("put: record batch version %u is not supported", rl_le16_get(p + 4));
		return RL_EVERSION;
	}
	hlen = rl_le16_get(p + 6);
	nrec = rl_le32_get(p + 8);
	if (hlen < RL_TRAJ_HEADER_LEN || hlen > n || hlen % 8 != 0 || nrec > lim.max_records ||
	    nrec > (n - hlen) / 8) {
		rl_error("put: bad record batch header (header length %zu, %zu records, %zu bytes)", hlen, nrec, n);
		return RL_EFORMAT;
	}
	if (nrec > q->capmeta) {
		void *m = realloc(q->meta, nrec * sizeof *q->meta);
		if (m == NULL)
			return RL_ENOMEM;
		q->meta = m;
		q->capmeta = nrec;
	}
	off = hlen;
	for (size_t i = 0; i < nrec; i++) {
		struct recmeta *m = &q->meta[i];
		size_t used = 0;
		int32_t v0, v1, idx = 0, gs = 0;

		snprintf(what, sizeof what, "put: batch byte %zu", off);
		if ((rv = rl_traj_decode(q->tmp, &used, p + off, n - off, &lim, what)) != 0)
			return rv;
		if (rl_traj_get_u64(q->tmp, RL_TAG_ID, &m->id) != 0) {
			rl_error("%s: record %zu has no id", what, i);
			return RL_EFORMAT;
		}
		m->has_group = rl_traj_get_u64(q->tmp, RL_TAG_GROUP, &m->group) == 0;
		if (!m->has_group)
			m->group = m->id;
		if (rl_traj_get_i32(q->tmp, RL_TAG_INDEX, &idx) == RL_ESHAPE ||
		    rl_traj_get_i32(q->tmp, RL_TAG_GROUP_SIZE, &gs) == RL_ESHAPE || idx < 0 || gs < 0 ||
		    (uint32_t)gs > MAX_GROUP_SIZE) {
			rl_error("%s: record %zu (id %llu) has a bad index or group_size", what, i,
			    (unsigned long long)m->id);
			return RL_EFORMAT;
		}
		m->index = (uint32_t)idx;
		m->gsize = (uint32_t)gs;
		m->version = rl_traj_get_version(q->tmp, &v0, &v1) == 0 ? v0 : -1;
		if (used > UINT32_MAX)
			return RL_ETOOBIG;
		m->off = (uint32_t)off;
		m->len = (uint32_t)used;
		off += used;
	}
	if (off != n) {
		rl_error("put: %zu bytes after the last record of the batch", n - off);
		return RL_EFORMAT;
	}
	*count = nrec;
	return RL_OK;
}

static int
batch_header(rl_buf *out, uint32_t n)
{
	uint8_t h[RL_TRAJ_HEADER_LEN] = { 0 };

	memcpy(h, RL_TRAJ_MAGIC, 4);
	rl_le16_put(h + 4, RL_TRAJ_VERSION);
	rl_le16_put(h + 6, RL_TRAJ_HEADER_LEN);
	rl_le32_put(h + 8, n);
	return rl_buf_append(out, h, sizeof h);
}

/* Creates an entry for a parsed record in state s (data copied). */
static int
ent_create(rl_queue *q, const struct recmeta *m, const uint8_t *data, int s, int is_prompt, uint32_t *out)
{
	uint32_t ei, gi;
	qent *e;
	qgrp *g;
	int rv;

	if ((rv = group_get(q, m->group, &gi)) != 0)
		return rv;
	g = &q->grp[gi];
	if (!is_prompt) {
		uint32_t gs = m->gsize ? m->gsize : 1;
		if (m->index >= gs || (rv = group_set_size(q, g, gs)) != 0 || g->slot[m->index] != NIL) {
			if (g->nsamples == 0 && g->prompt == NIL && rv != RL_ENOMEM)
				group_free(q, gi, 0);
			return rv == RL_ENOMEM ? rv : RL_EEXIST;
		}
	} else if (g->prompt != NIL) {
		return RL_EEXIST;
	}
	SLAB_ALLOC(q, ent, nent, capent, freeent, ei, "record");
	e = &q->ent[ei];
	g = &q->grp[gi];
	if ((e->data = rl_try_malloc(m->len, "record")) == NULL) {
		e->used = 0;
		e->next = q->freeent;
		q->freeent = ei;
		return RL_ENOMEM;
	}
	memcpy(e->data, data, m->len);
	e->len = m->len;
	e->id = m->id;
	e->group = m->group;
	e->index = m->index;
	e->gsize = m->gsize;
	e->version = m->version;
	e->is_prompt = (uint8_t)is_prompt;
	e->hint = RL_MAX(m->gsize, 1u);
	e->grp = gi;
	e->state = RL_QS_COUNT;
	if ((rv = map_put(&q->byid, m->id, ei)) != 0) {
		free(e->data);
		e->used = 0;
		e->next = q->freeent;
		q->freeent = ei;
		return rv;
	}
	q->st.bytes += m->len + ENT_OVERHEAD;
	if (is_prompt) {
		g->prompt = ei;
	} else {
		g->slot[m->index] = ei;
		g->nsamples++;
	}
	ent_set_state(q, ei, s, 0);
	*out = ei;
	return RL_OK;
}

/* Frees an entry; finished: remember its id. */
static void
ent_free(rl_queue *q, uint32_t ei, int finished)
{
	qent *e = &q->ent[ei];
	qgrp *g = &q->grp[e->grp];

	lease_detach(q, ei);
	ent_set_state(q, ei, RL_QS_COUNT, 0);
	if (e->is_prompt) {
		g->prompt = NIL;
	} else if (g->slot && e->index < g->gsize && g->slot[e->index] == ei) {
		g->slot[e->index] = NIL;
		g->nsamples--;
	}
	if (finished)
		win_add(&q->done_ids, e->id);
	map_del(&q->byid, e->id);
	q->st.bytes -= e->len + ENT_OVERHEAD;
	free(e->data);
	memset(e, 0, sizeof *e);
	e->next = q->freeent;
	q->freeent = ei;
}

/* The prompt of group gi is no longer waited for: its samples are here. */
static void
prompt_expand(rl_queue *q, uint32_t gi)
{
	qgrp *g = &q->grp[gi];
	uint32_t pi = g->prompt;

	if (pi == NIL || (q->ent[pi].state != RL_QS_LEASED && q->ent[pi].state != RL_QS_PROMPT))
		return;
	lease_detach(q, pi);
	q->inflight -= g->expect;
	g->expect = 0;
	ent_set_state(q, pi, RL_QS_EXPANDED, 0);
}

/* A new sample joined group gi. */
static void
sample_arrived(rl_queue *q, uint32_t gi)
{
	qgrp *g = &q->grp[gi];

	if (g->expect > 0) {
		g->expect--;
		q->inflight--;
	}
	/* complete: as many samples as the prompt asked for, or as the
	 * samples themselves say their group holds */
	if (g->prompt != NIL && (g->nsamples >= q->ent[g->prompt].hint || (g->gsize && g->nsamples >= g->gsize)))
		prompt_expand(q, gi);
}

/* All samples of a group done (or dropped): free what is left. */
static void
group_finish(rl_queue *q, uint32_t gi)
{
	qgrp *g = &q->grp[gi];

	for (uint32_t i = 0; i < g->gsize; i++)
		if (g->slot[i] != NIL)
			ent_free(q, g->slot[i], 1);
	if (g->prompt != NIL) {
		if (q->ent[g->prompt].state == RL_QS_LEASED || q->ent[g->prompt].state == RL_QS_PROMPT)
			prompt_expand(q, gi);
		ent_free(q, g->prompt, 1);
	}
	group_free(q, gi, 1);
}

static void
sample_done(rl_queue *q, uint32_t ei)
{
	uint32_t gi = q->ent[ei].grp;
	qgrp *g = &q->grp[gi];

	ent_free(q, ei, 1);
	g->ndone++;
	q->st.done++;
	if (g->ndone >= g->gsize)
		group_finish(q, gi);
	else
		group_update_ready(q, gi, 0);
}

/* Leased record back to the pool (expiry or release). */
static void
return_to_pool(rl_queue *q, uint32_t ei)
{
	qent *e = &q->ent[ei];
	qgrp *g = &q->grp[e->grp];

	lease_detach(q, ei);
	switch (e->state) {
	case RL_QS_LEASED:
		q->inflight -= g->expect;
		g->expect = 0;
		ent_set_state(q, ei, RL_QS_PROMPT, 1);
		break;
	case RL_QS_SCORING:
		ent_set_state(q, ei, RL_QS_GENERATED, 1);
		break;
	case RL_QS_TRAINING:
		/* back at the head of the ready groups, as prompts and generated
		 * records go back to the head of theirs: behind the groups that
		 * came since, a trainer would step past it and it would turn stale */
		ent_set_state(q, ei, RL_QS_SCORED, 1);
		break;
	default:
		break;
	}
}

/* The slot bytes the batch's records would add by opening groups not in the
 * queue yet: each new group once (a batch often holds a whole group). */
static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t
new_group_bytes(rl_queue *q, size_t nrec, int stage)
{
	uint64_t *g = NULL, sum = 0;
	size_t k = 0;

	if (stage == RL_QSTAGE_PROMPT)
		return 0; /* prompts open no slots */
	for (size_t i = 0; i < nrec; i++)
		k += map_get(&q->bygroup, q->meta[i].group) == NIL;
	if (k == 0)
		return 0;
	if ((g = malloc(k * 2 * sizeof *g)) == NULL) {
		/* no memory for the sort: count every record's group (an upper bound) */
		for (size_t i = 0; i < nrec; i++)
			if (map_get(&q->bygroup, q->meta[i].group) == NIL)
				sum += (uint64_t)RL_MAX(q->meta[i].gsize, 1u) * sizeof(uint32_t);
		return sum;
	}
	k = 0;
	for (size_t i = 0; i < nrec; i++) {
		if (map_get(&q->bygroup, q->meta[i].group) == NIL) {
			g[2 * k] = q->meta[i].group;
			g[2 * k + 1] = RL_MAX(q->meta[i].gsize, 1u);
			k++;
		}
	}
	qsort(g, k, 2 * sizeof *g, cmp_u64);
	for (size_t i = 0; i < k; i++)
		if (i == 0 || g[2 * i] != g[2 * (i - 1)])
			sum += g[2 * i + 1] * sizeof(uint32_t);
	free(g);
	return sum;
}

/* A sample of an attempt early stop aborted, put by a generator that had
 * not heard: its prompt waits re-queued (1), or was leased again at a newer
 * version than the sample's (2).  Such a group would complete behind the
 * (K+1) x B groups that closed the step, so older than K when trained, and
 * dropped as stale with its prompt; refused, the prompt is generated anew. */
static int
aborted_attempt(const rl_queue *q, const struct recmeta *m)
{
	uint32_t gi = map_get(&q->bygroup, m->group);
	const qent *p;

	if (gi == NIL || q->grp[gi].prompt == NIL)
		return 0;
	p = &q->ent[q->grp[gi].prompt];
	if (p->aborted == 1 && p->state == RL_QS_PROMPT)
		return 1;
	return p->aborted == 2 && p->state == RL_QS_LEASED && m->version >= 0 && m->version < p->version;
}

/* ---- apply functions (live and replay) --------------------------------------------------------- */
static int
apply_put(rl_queue *q, int stage, const uint8_t *batch, size_t n, const void *frame, size_t fn,
          rl_qput_result *res)
{
	size_t nrec, newbytes = 0;
	int rv, changed = 0;

	memset(res, 0, sizeof *res);
	if (stage < 0 || stage >= RL_QSTAGE_COUNT)
		return RL_EINVAL;
	if ((rv = parse_batch(q, batch, n, &nrec)) != 0)
		return rv;
	if (!q->replaying) {
		/* new records, and the growth of generated records a scored put
		 * replaces (below), are new bytes.  New records must leave an
		 * eighth of --max-bytes free, which only replacements may take:
		 * the reward -> train path drains when the queue is full of
		 * generated records, and a scored put cannot store past the bound. */
		uint64_t growth = 0, room = q->cfg.max_bytes - q->cfg.max_bytes / 8;
		for (size_t i = 0; i < nrec; i++) {
			const struct recmeta *m = &q->meta[i];
			uint32_t ei = map_get(&q->byid, m->id);
			if (ei == NIL && !win_has(&q->done_ids, m->id)) {
				newbytes += m->len + ENT_OVERHEAD;
			} else if (ei != NIL && stage == RL_QSTAGE_SCORED && m->len > q->ent[ei].len) {
				const qent *e = &q->ent[ei];
				if (!e->is_prompt && (e->state == RL_QS_GENERATED || e->state == RL_QS_SCORING))
					growth += m->len - e->len;
			}
		}
		uint64_t slots = newbytes > 0 ? new_group_bytes(q, nrec, stage) : 0;
		newbytes += slots;
		if (newbytes + growth > q->cfg.max_bytes || (newbytes > 0 && newbytes > room)) {
			if (slots > 0)
				rl_error("put: a batch of %zu bytes (%llu of them the sample slots of its new groups, "
				    "4 bytes per group_size) can never fit in --max-bytes %llu", newbytes,
				    (unsigned long long)slots, (unsigned long long)q->cfg.max_bytes);
			else
				rl_error("put: a batch of %llu new bytes can never fit in --max-bytes %llu",
				    (unsigned long long)(newbytes + growth), (unsigned long long)q->cfg.max_bytes);
			return RL_ETOOBIG;
		}
		if ((newbytes > 0 && q->st.bytes + newbytes + growth > room) ||
		    (growth > 0 && q->st.bytes + growth > q->cfg.max_bytes)) {
			q->st.busy++;
			return RL_EBUSY;
		}
	}
	for (size_t i = 0; i < nrec; i++) {
		const struct recmeta *m = &q->meta[i];
		uint32_t ei = map_get(&q->byid, m->id), gi;
		qent *e;

		if (ei == NIL) {
			if (win_has(&q->done_ids, m->id) ||
			    (stage != RL_QSTAGE_PROMPT && win_has(&q->done_groups, m->group))) {
				res->duplicates++;
				continue;
			}
			if (stage != RL_QSTAGE_PROMPT && aborted_attempt(q, m)) {
				res->rejected++;
				q->st.abort_late++;
				continue;
			}
			rv = ent_create(q, m, batch + m->off,
			    stage == RL_QSTAGE_PROMPT ? RL_QS_PROMPT :
			    stage == RL_QSTAGE_GENERATED ? RL_QS_GENERATED : RL_QS_SCORED,
			    stage == RL_QSTAGE_PROMPT, &ei);
			if (rv == RL_EEXIST) {
				res->rejected++;
				continue;
			}
			if (rv != 0)
				return rv;
			res->accepted++;
			changed = 1;
			if (stage != RL_QSTAGE_PROMPT)
				sample_arrived(q, q->ent[ei].grp);
			continue;
		}
		e = &q->ent[ei];
		if (stage == RL_QSTAGE_SCORED && !e->is_prompt &&
		    (e->state == RL_QS_GENERATED || e->state == RL_QS_SCORING)) {
			uint8_t *d = rl_try_malloc(m->len, "record");
			if (d == NULL)
				return RL_ENOMEM;
			memcpy(d, batch + m->off, m->len);
			q->st.bytes += (uint64_t)m->len - e->len;
			free(e->data);
			e->data = d;
			e->len = m->len;
			if (m->version >= 0)
				e->version = m->version;
			lease_detach(q, ei);
			gi = e->grp;
			(void)gi;
			ent_set_state(q, ei, RL_QS_SCORED, 0);
			res->replaced++;
			changed = 1;
			continue;
		}
		res->duplicates++;
	}
	q->st.put[stage] += res->accepted + res->replaced;
	q->st.duplicates += res->duplicates;
	q->st.rejected += res->rejected;
	q->st.replaced += res->replaced;
	if (changed && q->jfd >= 0 && !q->replaying) {
		if ((rv = jop(q, J_PUT, stage, 0, 0, 0, NULL, 0)) != 0)
			return rv;
		if (frame != NULL)
			rv = rl_buf_append(&q->jpend, frame, fn);
		else
			rv = rl_qzstd_compress(&q->jpend, batch, n, q->cfg.journal_level);
		if (rv != 0)
			return rv;
	}
	return RL_OK;
}

/* The staleness of a trained sample: the broker's version when a trainer
 * leased it (e->hint) less the version that generated it.  Counted when the
 * trainer acknowledges it done, so a sample leased, released or expired and
 * leased again counts once. */
static void
hist_add(rl_queue *q, const qent *e)
{
	uint64_t at = e->hint;

	if (e->version < 0) {
		q->st.unversioned++;
		return;
	}
	uint64_t d = at > (uint64_t)e->version ? at - (uint64_t)e->version : 0;
	q->st.staleness[d > 8 ? 8 : d]++;
	q->st.staleness_sum += d;
}

static int
apply_lease(rl_queue *q, uint64_t lid, int stage, uint64_t deadline, uint32_t hint, const uint64_t *ids,
            uint32_t n)
{
	qlease *l;
	int rv;

	if ((rv = jop(q, J_LEASE, stage, lid, deadline, hint, ids, n)) != 0)
		return rv;
	if ((rv = lease_new(q, lid, stage, deadline, &l)) != 0)
		return rv;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t ei = map_get(&q->byid, ids[i]);
		qent *e;
		qgrp *g;

		if (ei == NIL)
			continue;
		e = &q->ent[ei];
		g = &q->grp[e->grp];
		if (stage == RL_QSTAGE_PROMPT && e->state == RL_QS_PROMPT) {
			/* a prompt's version: the broker's at its lease (early stop
			 * aborts a lease older than K versions) */
			if (e->aborted)
				e->aborted = 2;
			e->version = (int64_t)q->version;
			e->hint = RL_MAX(RL_MAX(e->gsize, hint), 1u);
			q->gate_gsize = e->hint;
			ent_set_state(q, ei, RL_QS_LEASED, 0);
			g->expect = e->hint > g->nsamples ? e->hint - g->nsamples : 0;
			q->inflight += g->expect;
		} else if (stage == RL_QSTAGE_GENERATED && e->state == RL_QS_GENERATED) {
			ent_set_state(q, ei, RL_QS_SCORING, 0);
		} else if (stage == RL_QSTAGE_SCORED && e->state == RL_QS_SCORED) {
			ent_set_state(q, ei, RL_QS_TRAINING, 0);
			/* hint 1: a group a resumed trainer's checkpoint holds
			 * (finish_groups), trained at the version of its last lease */
			if (!hint)
				e->hint = e->held && q->version <= e->held_at && e->hint < q->version ? e->hint
													   : (uint32_t)q->version;
			e->held = 0;
		} else {
			continue;
		}
		if ((rv = lease_attach(q, l, ei)) != 0)
			return rv;
		q->st.leased[stage]++;
	}
	if (l->nlive == 0)
		lease_free(q, lid);
	return RL_OK;
}

static int
apply_ack(rl_queue *q, uint64_t lid, int kind, uint64_t deadline, const uint64_t *ids, uint32_t n,
          rl_qack_result *res)
{
	qlease *l = lease_find(q, lid);
	uint64_t *all = NULL;
	int rv;

	memset(res, 0, sizeof *res);
	if ((rv = jop(q, J_ACK, kind, lid, deadline, 0, ids, n)) != 0)
		return rv;
	if (l == NULL) {
		res->late = n;
		q->st.late_acks += n;
		return RL_ENOENT;
	}
	if (kind == RL_QACK_EXTEND) {
		l->deadline = deadline;
		res->deadline_ms = deadline;
		res->done = n ? 0 : l->nlive;
		/* ids the lease lost (early stop aborted them) are late: a rollout
		 * worker learns so which prompts to stop generating */
		for (uint32_t i = 0; i < n; i++) {
			uint32_t ei = map_get(&q->byid, ids[i]);
			if (ei == NIL || q->ent[ei].lease != lid)
				res->late++;
			else
				res->done++;
		}
		return RL_OK;
	}
	if (kind == RL_QACK_TRAINED) {
		/* renews the lease too; marking twice (a renewal) changes nothing */
		l->deadline = deadline;
		res->deadline_ms = deadline;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t ei = map_get(&q->byid, ids[i]);
			if (ei == NIL || q->ent[ei].lease != lid || q->ent[ei].state != RL_QS_TRAINING) {
				res->late++;
				continue;
			}
			if (!q->ent[ei].trained) {
				q->ent[ei].trained = 1;
				q->inflight--;
			}
			res->done++;
		}
		return RL_OK;
	}
	if (n == 0) {
		/* every record of the lease: copy, the lease may go away underneath */
		if ((all = rl_try_malloc((size_t)l->n * 8 + 8, "ack")) == NULL)
			return RL_ENOMEM;
		memcpy(all, l->ids, (size_t)l->n * 8);
		n = l->n;
		ids = all;
	}
	for (uint32_t i = n; i-- > 0;) {   /* reverse: released records go back to the head in order */
		uint32_t ei = map_get(&q->byid, ids[i]);
		qent *e;

		if (ei == NIL || q->ent[ei].lease != lid) {
			if (all == NULL)
				res->late++;
			continue;
		}
		e = &q->ent[ei];
		if (kind == RL_QACK_RELEASE) {
			return_to_pool(q, ei);
			q->st.released++;
		} else if (e->state == RL_QS_TRAINING) {
			hist_add(q, e);
			sample_done(q, ei);
		} else if (e->state == RL_QS_LEASED) {
			prompt_expand(q, e->grp);
		} else {
			continue;   /* SCORING: finished by its scored put */
		}
		res->done++;
	}
	q->st.late_acks += res->late;
	free(all);
	return RL_OK;
}

/* A lease ends untrained: by time, or because a resumed trainer rewound
 * (rl_queue_rewind_version, mode 1 in the journal: the same change).  Its
 * training records are held up to max(held_at, the version now): a trainer
 * killed between its checkpoint and the VERSION that announces it resumes
 * from a version past the broker's, and replays the versions up to it. */
static int
apply_expire(rl_queue *q, uint64_t lid, int mode, uint64_t held_at)
{
	qlease *l = lease_find(q, lid);
	uint64_t *ids;
	uint32_t n;
	int rv;

	if (l == NULL)
		return RL_OK;
	if ((rv = jop(q, J_EXPIRE, mode, lid, held_at, 0, NULL, 0)) != 0)
		return rv;
	if (held_at < q->version || held_at > RL_QUEUE_MAX_VERSION)
		held_at = q->version;
	q->st.expired_leases++;
	ids = l->ids;
	n = l->n;
	l->ids = NULL;   /* keep the array while the lease is freed under us */
	l->nlive++;      /* hold the lease until the loop ends */
	for (uint32_t i = n; i-- > 0;) {   /* reverse: they go back to the head in order */
		uint32_t ei = map_get(&q->byid, ids[i]);
		if (ei != NIL && q->ent[ei].lease == lid) {
			if (q->ent[ei].state == RL_QS_TRAINING) {
				q->ent[ei].held = 1;
				q->ent[ei].held_at = (uint32_t)held_at;
			}
			return_to_pool(q, ei);
			q->st.expired_records++;
		}
	}
	if ((l = lease_find(q, lid)) != NULL)
		lease_free(q, lid);
	free(ids);
	return RL_OK;
}

static int
apply_version(rl_queue *q, uint64_t v)
{
	int rv;

	if (v <= q->version)
		return RL_OK;
	if ((rv = jop(q, J_VERSION, 0, v, 0, 0, NULL, 0)) != 0)
		return rv;
	q->version = v;
	return RL_OK;
}

static int
apply_max_staleness(rl_queue *q, uint64_t k)
{
	int rv;

	/* a journal of an auto run replayed by a broker given a fixed K: the
	 * command line decides */
	if (!q->cfg.auto_k)
		return RL_OK;
	if (k > q->cfg.auto_kmax)
		k = q->cfg.auto_kmax;
	if ((rv = jop(q, J_MAXSTALE, 0, k, 0, 0, NULL, 0)) != 0)
		return rv;
	q->cfg.max_staleness = (uint32_t)k;
	return RL_OK;
}

/* A stale group: drop it, or send its prompt back for regeneration. */
static int
apply_stale(rl_queue *q, uint64_t gid, int mode)
{
	uint32_t gi = map_get(&q->bygroup, gid);
	qgrp *g;
	int rv;

	if (gi == NIL)
		return RL_OK;
	if ((rv = jop(q, J_STALE, mode, gid, 0, 0, NULL, 0)) != 0)
		return rv;
	g = &q->grp[gi];
	q->stale_seen = 1;
	q->stale_at = q->version;
	if (mode == RL_QSTALE_REGEN && g->prompt != NIL && g->ndone == 0) {
		q->st.stale_regen += g->nsamples;
		for (uint32_t i = 0; i < g->gsize; i++)
			if (g->slot[i] != NIL)
				ent_free(q, g->slot[i], 0);
		ent_set_state(q, g->prompt, RL_QS_PROMPT, 1);
		return RL_OK;
	}
	q->st.stale_dropped += g->nsamples;
	rl_verbose("group %llu (%u samples) dropped as stale at version %llu (--max-staleness %u)",
	    (unsigned long long)gid, g->nsamples, (unsigned long long)q->version, q->cfg.max_staleness);
	group_finish(q, gi);
	return RL_OK;
}

/* Early stop: the leased prompts ids (stragglers) are aborted: back to the
 * head of the prompts, or finished with their group (what had arrived of it
 * is dropped, and a late put of the rest is a duplicate). */
static int
apply_abort(rl_queue *q, int mode, const uint64_t *ids, uint32_t n)
{
	int rv;

	if ((rv = jop(q, J_ABORT, mode, 0, 0, 0, ids, n)) != 0)
		return rv;
	q->st.early_stops++;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t ei = map_get(&q->byid, ids[i]);
		if (ei == NIL || !q->ent[ei].is_prompt || q->ent[ei].state != RL_QS_LEASED)
			continue;
		q->st.aborted++;
		if (mode == RL_QSTRAG_DROP) {
			uint32_t gi = q->ent[ei].grp;
			q->st.abort_dropped++;
			q->st.abort_dropped_samples += q->grp[gi].nsamples;
			group_finish(q, gi);
		} else {
			q->st.abort_requeued++;
			q->ent[ei].aborted = 1;
			return_to_pool(q, ei);
		}
	}
	return RL_OK;
}

static int early_stop(rl_queue *q);

/* ---- public: put, lease, ack, version, tick ------------------------------------------------------ */
int
rl_queue_put(rl_queue *q, int stage, const void *batch, size_t n, const void *frame, size_t fn,
             uint64_t now_ms, rl_qput_result *res)
{
	int rv;

	(void)now_ms;
	if ((rv = apply_put(q, stage, batch, n, frame, fn, res)) != 0)
		return rv;
	return stage != RL_QSTAGE_PROMPT && res->accepted > 0 ? early_stop(q) : RL_OK;
}

static int
oversampling(const rl_queue *q)
{
	return q->cfg.oversample > 1.0 && q->cfg.train_batch > 0;
}

/* Whether over-sampling and early stop act now: always at a K the user
 * fixed.  With auto K, while the broker's K is 0 or 1, or while groups go
 * stale: within 4 x (K+1) versions of the last group dropped or
 * regenerated as stale.  From K = 2 the staleness window often hides the
 * tail by itself (the trainer takes later steps' short groups while a long
 * one finishes); spares then only overtake the long groups, and aborts
 * throw away generation that would have been trained in time
 * (bench/tail.sh at K = 4: early stop at every K aborted 33-45 prompts a
 * run, at 0.80x-0.90x the best fixed K, while auto without it dropped
 * nothing as stale).  A tail longer than the window shows as stale groups,
 * and early stop comes back to abort them before they complete. */
static int
estop_active(const rl_queue *q)
{
	uint64_t K = q->cfg.max_staleness;

	return oversampling(q) && (!q->cfg.auto_k || K <= 1 ||
				   (q->stale_seen && q->version <= q->stale_at + 4 * (K + 1)));
}

/* A group every sample of which is here (the prompt's samples arrived, or
 * a group put without a prompt is full) and not all trained yet: what a
 * trainer can take without waiting for generation, or is training for the
 * next version.  A sample a trainer leased at an older version than the
 * broker's counts as trained: the trainer tells the broker its new version
 * before it marks the step's records TRAINED, and between the two the
 * groups it has just trained must not count as waiting (early stop would
 * take the step for closed and abort every straggler at each version). */
static int
group_complete(const rl_queue *q, const qgrp *g)
{
	if (g->gsize == 0 || g->nsamples + g->ndone < g->gsize)
		return 0;
	if (g->prompt != NIL && q->ent[g->prompt].state != RL_QS_EXPANDED)
		return 0;
	for (uint32_t i = 0; i < g->gsize; i++) {
		uint32_t ei = g->slot[i];
		const qent *e = ei != NIL ? &q->ent[ei] : NULL;
		if (e && !e->trained && !(e->state == RL_QS_TRAINING && e->hint < q->version))
			return 1;
	}
	return 0;
}

uint64_t
rl_queue_complete_groups(const rl_queue *q)
{
	uint64_t n = 0;

	for (size_t gi = 1; gi < q->ngrp; gi++)
		if (q->grp[gi].used && group_complete(q, &q->grp[gi]))
			n++;
	return n;
}

/* The step is closed: (K+1) x B complete groups are buffered, as many as
 * the trainer may take before the version moves past them. */
static int
step_closed(const rl_queue *q)
{
	return estop_active(q) &&
	    rl_queue_complete_groups(q) >= ((uint64_t)q->cfg.max_staleness + 1) * q->cfg.train_batch;
}

/* A leased prompt whose group, were it complete now, would be trained more
 * than K versions after its lease: the C complete groups before it go to the
 * trainer B a step, so it would be taken at version v + C / B at the earliest
 * (its samples are of the lease's version or newer, and only the lease's is
 * known here).  With C = 0 that is a lease older than K versions; at the
 * step's close (C >= (K+1) x B) every leased prompt.  Its group could only
 * complete to be dropped as stale: early stop aborts it first. */
static int
hopeless(const rl_queue *q, const qent *e, uint64_t complete)
{
	uint64_t K = q->cfg.max_staleness, at = q->version + complete / q->cfg.train_batch;

	return e->version >= 0 && (uint64_t)e->version + K < at;
}

/* After a put or a new version: the stragglers are aborted (journaled):
 * every leased prompt that can no longer be trained within K versions
 * (hopeless; with --stragglers continue, only one leased more than K
 * versions ago: a straggler continued with new weights keeps its first
 * version, and the versions are all that is known of it).  With requeue it
 * is leased again at a newer version; nothing is left to complete behind
 * the groups that closed a step and be dropped as stale. */
static int
early_stop(rl_queue *q)
{
	uint64_t *ids, C;
	uint32_t n = 0;
	int rv;

	if (!estop_active(q) || q->st.depth[RL_QS_LEASED] == 0)
		return RL_OK;
	C = q->cfg.stragglers == RL_QSTRAG_CONTINUE ? 0 : rl_queue_complete_groups(q);
	if (q->version + C / q->cfg.train_batch <= q->cfg.max_staleness)
		return RL_OK;
	if ((ids = rl_try_malloc(q->st.depth[RL_QS_LEASED] * 8, "early stop")) == NULL)
		return RL_ENOMEM;
	for (size_t ei = 1; ei < q->nent && n < q->st.depth[RL_QS_LEASED]; ei++) {
		const qent *e = &q->ent[ei];
		if (e->used && e->is_prompt && e->state == RL_QS_LEASED && hopeless(q, e, C))
			ids[n++] = e->id;
	}
	rv = n ? apply_abort(q, q->cfg.stragglers == RL_QSTRAG_DROP ? RL_QSTRAG_DROP : RL_QSTRAG_REQUEUE, ids, n) : RL_OK;
	free(ids);
	return rv;
}

/* The gate's bound in samples for prompts of gsize samples each: (K+1)
 * trainer steps of B groups.  B counts groups, as rl-rollout's --train-batch
 * and rl-train's --batch do; the samples in flight are what the broker can
 * count, so the bound is converted with the prompt's group size. */
static uint64_t
gate_cap(const rl_queue *q, uint32_t gsize)
{
	uint64_t groups = ((uint64_t)q->cfg.max_staleness + 1) * q->cfg.train_batch;

	/* over-sampling adds (F - 1) x B spare groups for the step the trainer
	 * waits on: only while fewer than B groups are complete (its next step
	 * is not covered), whatever K.  Spares admitted while the next steps
	 * are covered only overtake the long groups in flight, which then
	 * cannot be trained within K and are aborted; (F - 1) x (K+1) x B
	 * spares would let more groups complete than the trainer can take
	 * within K versions (at K = 4, B = 2, F = 1.5 five more than the ten
	 * it may take, each aborted at the close or trained stale). */
	if (estop_active(q) && rl_queue_complete_groups(q) < q->cfg.train_batch)
		groups += (uint64_t)ceil((q->cfg.oversample - 1.0) * q->cfg.train_batch);
	return groups * RL_MAX(gsize, 1u);
}

static int
group_is_stale(const rl_queue *q, const qgrp *g)
{
	uint64_t K = q->cfg.max_staleness;

	for (uint32_t i = 0; i < g->gsize; i++) {
		uint32_t ei = g->slot[i];
		const qent *e;
		uint64_t v = q->version;
		if (ei == NIL)
			continue;
		e = &q->ent[ei];
		/* a sample a dead trainer held passed the test when it was leased:
		 * a resumed trainer replaying the versions the dead one reached takes
		 * it in the dead one's place (it came back at the head of the ready
		 * groups); past them, or a live trainer's next step, ends that */
		if (e->held && v <= e->held_at && e->hint < v)
			v = e->hint;
		if (v > K && e->version >= 0 && (uint64_t)e->version < v - K)
			return 1;
	}
	return 0;
}

/* Chooses what a lease would take; ids into *ids (malloc'd).  Stale groups
 * met on the way are handled first (journaled). */
static int
choose(rl_queue *q, int stage, uint32_t hint, uint32_t max, uint64_t **ids_out, uint32_t *n_out, int apply)
{
	uint64_t *ids = NULL, inflight = q->inflight, cap;
	uint32_t n = 0;
	int rv = RL_OK, blocked = 0;

	*ids_out = NULL;
	*n_out = 0;
	/* a lease takes at most every entry there is (one of a group larger
	 * than that grows the list below): a request for 2^32 - 1 records must
	 * not size the allocation */
	if (max > q->nent)
		max = (uint32_t)q->nent;
	if (max == 0)
		return RL_OK;
	if (apply && (ids = rl_try_malloc((size_t)max * 8 + 8, "lease")) == NULL)
		return RL_ENOMEM;
	if (stage == RL_QSTAGE_PROMPT && q->prompts.head != NIL && step_closed(q)) {
		/* early stop: nothing more for this step; the trainer's take opens it */
		if (apply)
			q->st.gate_blocked++;
	} else if (stage == RL_QSTAGE_PROMPT) {
		uint32_t last = 0;
		cap = 0;
		for (uint32_t ei = q->prompts.head; ei != NIL && n < max; ei = q->ent[ei].next) {
			qent *e = &q->ent[ei];
			uint32_t want = RL_MAX(RL_MAX(e->gsize, hint), 1u), have = q->grp[e->grp].nsamples;
			uint64_t need = want > have ? want - have : 0;
			if (want != last)   /* gate_cap counts the complete groups: once per size */
				cap = gate_cap(q, want), last = want;
			if (cap && inflight + need > cap && !(inflight == 0 && n == 0)) {
				blocked = 1;
				break;
			}
			inflight += need;
			if (ids)
				ids[n] = e->id;
			n++;
		}
		if (blocked && apply)
			q->st.gate_blocked++;
	} else if (stage == RL_QSTAGE_GENERATED) {
		for (uint32_t ei = q->generated.head; ei != NIL && n < max; ei = q->ent[ei].next) {
			if (ids)
				ids[n] = q->ent[ei].id;
			n++;
		}
	} else {
		uint32_t gi = q->ready.head;
		while (gi != NIL) {
			qgrp *g = &q->grp[gi];
			uint32_t next = g->next;
			if (group_is_stale(q, g)) {
				if (apply && (rv = apply_stale(q, g->gid, q->cfg.stale)) != 0)
					goto out;
				gi = next;
				continue;
			}
			if (n > 0 && n + g->nscored > max)
				break;
			for (uint32_t i = 0; i < g->gsize; i++) {
				uint32_t ei = g->slot[i];
				if (ei != NIL && q->ent[ei].state == RL_QS_SCORED) {
					if (ids) {
						if (n >= max) {   /* one group larger than max: grow */
							uint64_t *p = realloc(ids, ((size_t)n + g->gsize) * 8);
							if (p == NULL) { rv = RL_ENOMEM; goto out; }
							ids = p;
							max = n + g->gsize;
						}
						ids[n] = q->ent[ei].id;
					}
					n++;
				}
			}
			gi = next;
		}
	}
out:
	if (rv != 0) {
		free(ids);
		return rv;
	}
	*ids_out = ids;
	*n_out = n;
	return RL_OK;
}

uint64_t
rl_queue_available(rl_queue *q, int stage, uint32_t group_hint, uint32_t max)
{
	uint64_t *ids;
	uint32_t n;

	if (stage == RL_QSTAGE_SCORED)
		return q->st.ready_samples;
	if (stage == RL_QSTAGE_GENERATED)
		return q->st.depth[RL_QS_GENERATED];
	if (choose(q, stage, group_hint, max, &ids, &n, 0) != 0)
		return 0;
	return n;
}

int
rl_queue_lease(rl_queue *q, const rl_qlease_req *req, uint64_t now_ms, rl_qlease_info *info, rl_buf *out)
{
	uint64_t *ids = NULL, lid, deadline;
	uint32_t n = 0, lease_ms;
	qlease *l;
	int rv;

	memset(info, 0, sizeof *info);
	info->version = q->version;
	info->aborts = (uint32_t)q->st.early_stops;
	if (req->stage >= RL_QSTAGE_COUNT)
		return RL_EINVAL;
	if ((rv = choose(q, (int)req->stage, req->group_hint, req->max_records, &ids, &n, 1)) != 0)
		return rv;
	if (n == 0)
		goto out;
	lease_ms = req->lease_ms ? req->lease_ms : q->cfg.lease_ms;
	lid = q->next_lid;
	deadline = now_ms + lease_ms;
	/* a trainer's group hint means nothing here; 1 is finish_groups' mark */
	if ((rv = apply_lease(q, lid, (int)req->stage, deadline, req->stage == RL_QSTAGE_SCORED ? 0 : req->group_hint,
	    ids, n)) != 0)
		goto out;
	if ((l = lease_find(q, lid)) == NULL)
		goto out;
	info->lease_id = lid;
	info->deadline_ms = deadline;
	info->n = l->n;
	if ((rv = batch_header(out, l->n)) != 0)
		goto out;
	for (uint32_t i = 0; i < l->n; i++) {
		const qent *e = &q->ent[map_get(&q->byid, l->ids[i])];
		if ((rv = rl_buf_append(out, e->data, e->len)) != 0)
			goto out;
	}
out:
	free(ids);
	return rv;
}

static int
ranges_have(const uint64_t *r, uint32_t nr, uint64_t id)
{
	uint32_t lo = 0, hi = nr;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (id < r[2 * mid])
			hi = mid;
		else if (id > r[2 * mid + 1])
			lo = mid + 1;
		else
			return 1;
	}
	return 0;
}

/* RL_QACK_GROUPS: a resumed trainer's full checkpoint holds these groups (r:
 * n / 2 ranges [lo, hi], ascending, disjoint).  The samples of theirs that
 * the broker still has scored were trained by a trainer killed before it
 * acknowledged them: leased and acknowledged done here at once (a lease and
 * an ack in the journal, replayed as such), counted in the staleness
 * histogram at the version of their last training lease.  Samples in other
 * states are left alone. */
static int
finish_groups(rl_queue *q, const uint64_t *r, uint32_t n, uint64_t now_ms, rl_qack_result *res)
{
	uint64_t *ids = NULL, lid;
	uint32_t nr = n / 2, k = 0;
	int rv = RL_OK;

	memset(res, 0, sizeof *res);
	if (n % 2)
		return RL_EINVAL;
	for (uint32_t i = 0; i < nr; i++)
		if (r[2 * i] > r[2 * i + 1] || (i > 0 && r[2 * i] <= r[2 * i - 1]))
			return RL_EINVAL;
	if (nr == 0 || q->nent == 0)
		return RL_OK;
	if ((ids = rl_try_malloc(q->nent * sizeof *ids, "finished samples")) == NULL)
		return RL_ENOMEM;
	for (size_t gi = 0; gi < q->ngrp; gi++) {
		const qgrp *g = &q->grp[gi];
		if (!g->used || !ranges_have(r, nr, g->gid))
			continue;
		for (uint32_t i = 0; i < g->gsize; i++) {
			uint32_t ei = g->slot[i];
			if (ei != NIL && q->ent[ei].state == RL_QS_SCORED && k < q->nent)
				ids[k++] = q->ent[ei].id;
		}
	}
	if (k == 0)
		goto out;
	lid = q->next_lid;
	if ((rv = apply_lease(q, lid, RL_QSTAGE_SCORED, now_ms, 1, ids, k)) != 0)
		goto out;
	if ((rv = apply_ack(q, lid, RL_QACK_DONE, 0, ids, k, res)) == RL_ENOENT)
		rv = RL_OK;
	rl_verbose("a resumed trainer's checkpoint holds %u scored sample%s not acknowledged: done", k,
	    k == 1 ? "" : "s");
out:
	free(ids);
	return rv;
}

int
rl_queue_ack(rl_queue *q, const rl_qack_req *req, const uint64_t *ids, uint64_t now_ms, rl_qack_result *res)
{
	uint64_t deadline = 0;

	if (req->kind == RL_QACK_GROUPS)
		return finish_groups(q, ids, req->n, now_ms, res);
	if (req->kind > RL_QACK_TRAINED)
		return RL_EINVAL;
	if (req->kind == RL_QACK_EXTEND || req->kind == RL_QACK_TRAINED) {
		qlease *l = lease_find(q, req->lease_id);
		deadline = now_ms + (l && l->stage < RL_QSTAGE_COUNT ? q->cfg.lease_ms : 0);
	}
	return apply_ack(q, req->lease_id, (int)req->kind, deadline, ids, req->n, res);
}

int
rl_queue_set_version(rl_queue *q, uint64_t v, uint64_t *now)
{
	int rv = v > RL_QUEUE_MAX_VERSION ? RL_EINVAL : apply_version(q, v);
	if (rv == RL_OK)
		rv = early_stop(q);
	if (now)
		*now = q->version;
	return rv;
}

int
rl_queue_set_max_staleness(rl_queue *q, uint32_t k)
{
	if (!q->cfg.auto_k || k > q->cfg.auto_kmax)
		return RL_EINVAL;
	if (k == q->cfg.max_staleness)
		return RL_OK;
	return apply_max_staleness(q, k);
}

uint32_t
rl_queue_max_staleness(const rl_queue *q)
{
	return q->cfg.max_staleness;
}

int
rl_queue_rewind_version(rl_queue *q, uint64_t v, uint64_t *now)
{
	int rv = RL_OK, ended = 0;

	if (v > RL_QUEUE_MAX_VERSION) {
		rv = RL_EINVAL;
		goto out;
	}
	/* A rewind is a trainer resumed from its checkpoint: the trainer that
	 * held the training leases is gone.  Their records go back to the head
	 * now, not when the leases time out, held at the version the dead
	 * trainer reached, so the resumed one takes them as it would have;
	 * waiting would let it step past them and drop them as stale (--stale
	 * drop), although they were fresh for the checkpoint. */
	for (size_t i = 1; rv == RL_OK && i < q->nlease_slots; i++)
		if (q->lease[i].used && q->lease[i].stage == RL_QSTAGE_SCORED) {
			rv = apply_expire(q, q->lease[i].lid, 1, v);
			ended++;
		}
	if (rv == RL_OK && v != q->version && (rv = jop(q, J_VERSION, 1, v, 0, 0, NULL, 0)) == 0)
		q->version = v;
	if (rv == RL_OK)
		rl_verbose("a resumed trainer: version %llu, %d training lease%s ended", (unsigned long long)q->version,
		    ended, ended == 1 ? "" : "s");
out:
	if (now)
		*now = q->version;
	return rv;
}

uint64_t
rl_queue_next_deadline(const rl_queue *q)
{
	uint64_t d = UINT64_MAX;

	for (size_t i = 1; i < q->nlease_slots; i++)
		if (q->lease[i].used && q->lease[i].deadline < d)
			d = q->lease[i].deadline;
	return d;
}

int
rl_queue_tick(rl_queue *q, uint64_t now_ms, uint32_t *expired)
{
	uint32_t cnt = 0;
	int rv;

	for (size_t i = 1; i < q->nlease_slots; i++) {
		if (q->lease[i].used && q->lease[i].deadline <= now_ms) {
			if ((rv = apply_expire(q, q->lease[i].lid, 0, 0)) != 0)
				return rv;
			cnt++;
		}
	}
	if (expired)
		*expired = cnt;
	if (q->nrate == 0 || now_ms >= q->rate[(q->nrate - 1) % RATE_SLOTS].t + 1000) {
		size_t k = q->nrate % RATE_SLOTS;
		q->rate[k].t = now_ms;
		memcpy(q->rate[k].put, q->st.put, sizeof q->st.put);
		memcpy(q->rate[k].leased, q->st.leased, sizeof q->st.leased);
		q->rate[k].done = q->st.done;
		q->nrate++;
	}
	return RL_OK;
}

void
rl_queue_get_stats(const rl_queue *q, rl_queue_stats *s)
{
	*s = q->st;
	s->inflight = q->inflight;
	s->cap = q->gate_gsize ? gate_cap(q, q->gate_gsize) : 0;
	s->max_bytes = q->cfg.max_bytes;
	s->version = q->version;
	s->journal_bytes = __atomic_load_n(&q->jbytes, __ATOMIC_RELAXED);
}

int
rl_queue_stats_json(rl_queue *q, uint64_t now_ms, rl_buf *out)
{
	static const char *const stage_put[] = { "put_prompt", "put_generated", "put_scored" };
	static const char *const stage_lease[] = { "leased_rollout", "leased_reward", "leased_train" };
	rl_queue_stats s;
	cJSON *o = cJSON_CreateObject(), *d, *t, *r, *h;
	char *txt;
	int rv = RL_ENOMEM;

	if (o == NULL)
		return RL_ENOMEM;
	rl_queue_get_stats(q, &s);
	cJSON_AddNumberToObject(o, "version", (double)s.version);
	cJSON_AddNumberToObject(o, "max_staleness", q->cfg.max_staleness);
	cJSON_AddNumberToObject(o, "train_batch", q->cfg.train_batch);
	cJSON_AddNumberToObject(o, "inflight", (double)s.inflight);
	cJSON_AddNumberToObject(o, "inflight_cap", (double)s.cap);
	cJSON_AddNumberToObject(o, "bytes", (double)s.bytes);
	cJSON_AddNumberToObject(o, "max_bytes", (double)s.max_bytes);
	cJSON_AddNumberToObject(o, "groups", (double)s.groups);
	cJSON_AddNumberToObject(o, "ready_groups", (double)s.ready_groups);
	cJSON_AddNumberToObject(o, "leases", (double)s.leases);
	d = cJSON_AddObjectToObject(o, "depth");
	for (int i = 0; i < RL_QS_COUNT && d; i++)
		cJSON_AddNumberToObject(d, rl_qstate_name(i), (double)s.depth[i]);
	t = cJSON_AddObjectToObject(o, "total");
	if (t) {
		for (int i = 0; i < RL_QSTAGE_COUNT; i++) {
			cJSON_AddNumberToObject(t, stage_put[i], (double)s.put[i]);
			cJSON_AddNumberToObject(t, stage_lease[i], (double)s.leased[i]);
		}
		cJSON_AddNumberToObject(t, "done", (double)s.done);
		cJSON_AddNumberToObject(t, "duplicates", (double)s.duplicates);
		cJSON_AddNumberToObject(t, "rejected", (double)s.rejected);
		cJSON_AddNumberToObject(t, "expired_leases", (double)s.expired_leases);
		cJSON_AddNumberToObject(t, "expired_records", (double)s.expired_records);
		cJSON_AddNumberToObject(t, "released", (double)s.released);
		cJSON_AddNumberToObject(t, "late_acks", (double)s.late_acks);
		cJSON_AddNumberToObject(t, "busy", (double)s.busy);
		cJSON_AddNumberToObject(t, "gate_blocked", (double)s.gate_blocked);
		cJSON_AddNumberToObject(t, "stale_dropped", (double)s.stale_dropped);
		cJSON_AddNumberToObject(t, "stale_regenerated", (double)s.stale_regen);
		cJSON_AddNumberToObject(t, "unversioned", (double)s.unversioned);
		cJSON_AddNumberToObject(t, "early_stops", (double)s.early_stops);
		cJSON_AddNumberToObject(t, "aborted", (double)s.aborted);
		cJSON_AddNumberToObject(t, "abort_requeued", (double)s.abort_requeued);
		cJSON_AddNumberToObject(t, "abort_dropped", (double)s.abort_dropped);
		cJSON_AddNumberToObject(t, "abort_dropped_samples", (double)s.abort_dropped_samples);
		cJSON_AddNumberToObject(t, "abort_late", (double)s.abort_late);
	}
	if (oversampling(q)) {
		cJSON_AddNumberToObject(o, "oversample", q->cfg.oversample);
		cJSON_AddNumberToObject(o, "complete_groups", (double)rl_queue_complete_groups(q));
	}
	r = cJSON_AddObjectToObject(o, "rate");
	if (r && q->nrate > 0) {
		size_t newest = (q->nrate - 1) % RATE_SLOTS;
		size_t oldest = q->nrate > RATE_SLOTS ? q->nrate % RATE_SLOTS : 0;
		double dt = (double)(now_ms - q->rate[oldest].t) / 1000.0;
		(void)newest;
		if (dt <= 0)
			dt = 1;
		for (int i = 0; i < RL_QSTAGE_COUNT; i++) {
			cJSON_AddNumberToObject(r, stage_put[i], (double)(s.put[i] - q->rate[oldest].put[i]) / dt);
			cJSON_AddNumberToObject(r, stage_lease[i],
			    (double)(s.leased[i] - q->rate[oldest].leased[i]) / dt);
		}
		cJSON_AddNumberToObject(r, "done", (double)(s.done - q->rate[oldest].done) / dt);
		cJSON_AddNumberToObject(r, "window_s", dt);
	}
	h = cJSON_AddArrayToObject(o, "staleness");
	for (int i = 0; i < 9 && h; i++)
		cJSON_AddItemToArray(h, cJSON_CreateNumber((double)s.staleness[i]));
	cJSON_AddNumberToObject(o, "staleness_sum", (double)s.staleness_sum);
	if (q->jfd >= 0) {
		cJSON *j = cJSON_AddObjectToObject(o, "journal");
		if (j) {
			cJSON_AddNumberToObject(j, "bytes", (double)s.journal_bytes);
			cJSON_AddNumberToObject(j, "syncs", (double)s.journal_syncs);
			cJSON_AddNumberToObject(j, "compactions", (double)s.compactions);
		}
	}
	if ((txt = cJSON_PrintUnformatted(o)) != NULL) {
		rv = rl_buf_append(out, txt, strlen(txt));
		free(txt);
	}
	cJSON_Delete(o);
	return rv;
}

/* ---- journal: write, snapshot, replay -------------------------------------------------------------- */
uint64_t
rl_queue_journal_seq(const rl_queue *q)
{
	return q->jseq;
}

uint64_t
rl_queue_journal_take(rl_queue *q, rl_buf *b)
{
	*b = q->jpend;
	rl_buf_init(&q->jpend);
	return q->jseq;
}

int
rl_queue_journal_write(rl_queue *q, const rl_buf *b)
{
	int rv;

	if (q->jfd < 0)
		return RL_OK;
	if (q->jbroken) {
		/* also with nothing to write: the caller (group commit) takes
		 * success as "durable up to here", and the ops of the batch that
		 * failed are below here */
		if (b->len)
			rl_error("'%s': not written after a failed write", q->jpath);
		return RL_EIO;
	}
	if (b->len == 0)
		return RL_OK;
	rv = rl_io_write_full(q->jfd, b->p, b->len, q->jpath);
	if (rv == 0 && q->cfg.fsync && fdatasync(q->jfd) != 0) {
		rl_error("cannot sync '%s': %s", q->jpath, strerror(errno));
		rv = RL_EIO;
	}
	if (rv != 0) {
		/* A later write that got through (space freed meanwhile) would
		 * follow these torn bytes, and replay refuses damage followed by
		 * intact ops: cut them, and write nothing more (these ops and the
		 * ones after them are answered with an error, the broker stops). */
		q->jbroken = 1;
		if (ftruncate(q->jfd, (off_t)q->jbytes) != 0)
			rl_warn("cannot cut '%s' back to %llu bytes: %s (the restart cuts the torn tail)", q->jpath,
			    (unsigned long long)q->jbytes, strerror(errno));
		return rv;
	}
	__atomic_add_fetch(&q->jbytes, b->len, __ATOMIC_RELAXED);
	__atomic_add_fetch(&q->st.journal_syncs, 1, __ATOMIC_RELAXED);
	return RL_OK;
}

int
rl_queue_journal_compact_due(const rl_queue *q)
{
	uint64_t jb = __atomic_load_n(&q->jbytes, __ATOMIC_RELAXED);
	return q->jfd >= 0 && !q->jbroken && jb > RL_MAX(q->cfg.compact_bytes, 2 * q->st.bytes) &&
	    jb >= q->jcompact_at;
}

static int
snap_flush_ents(rl_queue *q, rl_buf *out, rl_buf *ents, uint32_t *n)
{
	int rv;

	if (*n == 0)
		return RL_OK;
	if ((rv = jop_to(out, J_SNAPENT, 0, *n, ents->len, 0, NULL, 0)) != 0)
		return rv;
	if ((rv = rl_qzstd_compress(out, ents->p, ents->len, q->cfg.journal_level)) != 0)
		return rv;
	ents->len = 0;
	*n = 0;
	return RL_OK;
}

static int
snap_ent(rl_queue *q, rl_buf *out, rl_buf *ents, uint32_t *n, uint32_t ei)
{
	const qent *e = &q->ent[ei];
	uint8_t h[24];
	int rv;

	rl_le64_put(h, e->lease);
	rl_le32_put(h + 8, e->state);
	rl_le32_put(h + 12, e->hint);
	rl_le32_put(h + 16, e->is_prompt);
	rl_le32_put(h + 20, e->len);
	if ((rv = rl_buf_append(ents, h, sizeof h)) != 0 || (rv = rl_buf_append(ents, e->data, e->len)) != 0)
		return rv;
	(*n)++;
	if (ents->len >= ((size_t)4 << 20))
		return snap_flush_ents(q, out, ents, n);
	return RL_OK;
}

/* The whole live state as journal ops. */
static int
snapshot(rl_queue *q, rl_buf *out)
{
	rl_buf ents;
	uint8_t *mark = NULL;
	uint32_t n = 0;
	int rv;

	rl_buf_init(&ents);
	if ((rv = jop_to(out, J_HEAD, 0, 1, q->next_lid, q->version, NULL, 0)) != 0)
		goto out;
	if ((rv = jop_to(out, J_VERSION, 0, q->version, 0, 0, NULL, 0)) != 0)
		goto out;
	if (q->cfg.auto_k && (rv = jop_to(out, J_MAXSTALE, 0, q->cfg.max_staleness, 0, 0, NULL, 0)) != 0)
		goto out;
	for (int w = 0; w < 2; w++) {
		qwin *win = w ? &q->done_groups : &q->done_ids;
		for (size_t i = 0; i < win->n; i += 8192) {
			uint32_t k = (uint32_t)RL_MIN((size_t)8192, win->n - i);
			uint64_t buf[8192];
			for (uint32_t j = 0; j < k; j++)
				buf[j] = win->ring[(win->head + i + j) % win->cap];
			if ((rv = jop_to(out, J_DEDUP, w, 0, 0, 0, buf, k)) != 0)
				goto out;
		}
	}
	for (size_t i = 1; i < q->nlease_slots; i++) {
		const qlease *l = &q->lease[i];
		if (l->used && (rv = jop_to(out, J_SNAPLEASE, l->stage, l->lid, l->deadline, 0, NULL, 0)) != 0)
			goto out;
	}
	for (size_t i = 1; i < q->ngrp; i++) {
		const qgrp *g = &q->grp[i];
		if (g->used && g->ndone && (rv = jop_to(out, J_SNAPGROUP, 0, g->gid, g->ndone, 0, NULL, 0)) != 0)
			goto out;
	}
	/* FIFO order first, then everything else */
	if ((mark = rl_try_calloc(q->nent ? q->nent : 1, 1, "snapshot")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (uint32_t ei = q->prompts.head; ei != NIL; ei = q->ent[ei].next) {
		mark[ei] = 1;
		if ((rv = snap_ent(q, out, &ents, &n, ei)) != 0)
			goto out;
	}
	for (uint32_t ei = q->generated.head; ei != NIL; ei = q->ent[ei].next) {
		mark[ei] = 1;
		if ((rv = snap_ent(q, out, &ents, &n, ei)) != 0)
			goto out;
	}
	for (uint32_t gi = q->ready.head; gi != NIL; gi = q->grp[gi].next) {
		const qgrp *g = &q->grp[gi];
		for (uint32_t i = 0; i < g->gsize; i++)
			if (g->slot[i] != NIL && !mark[g->slot[i]]) {
				mark[g->slot[i]] = 1;
				if ((rv = snap_ent(q, out, &ents, &n, g->slot[i])) != 0)
					goto out;
			}
	}
	for (uint32_t ei = 1; ei < q->nent; ei++)
		if (q->ent[ei].used && !mark[ei] && (rv = snap_ent(q, out, &ents, &n, ei)) != 0)
			goto out;
	rv = snap_flush_ents(q, out, &ents, &n);
out:
	free(mark);
	rl_buf_fini(&ents);
	return rv;
}

int
rl_queue_journal_compact(rl_queue *q)
{
	char *tmp = NULL;
	rl_buf b;
	int fd = -1, rv, dfd;

	if (q->jfd < 0)
		return RL_OK;
	if (q->jbroken)
		return RL_EIO;   /* nothing after a failed write, not even a snapshot */
	rl_buf_init(&b);
	if ((rv = snapshot(q, &b)) != 0)
		goto out;
	if ((tmp = rl_try_malloc(strlen(q->jpath) + 8, "path")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	sprintf(tmp, "%s.tmp", q->jpath);
	/* O_APPEND: after the rename this descriptor is the journal's, so there
	 * is nothing to open again (and nothing that can fail) once the old
	 * file is gone */
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644)) < 0) {
		rl_error("cannot create '%s': %s", tmp, strerror(errno));
		rv = RL_EIO;
		goto out;
	}
	if ((rv = rl_io_write_full(fd, b.p, b.len, tmp)) != 0)
		goto out;
	if (fsync(fd) != 0 || rename(tmp, q->jpath) != 0) {
		rl_error("cannot replace '%s': %s", q->jpath, strerror(errno));
		rv = RL_EIO;
		goto out;
	}
	if ((dfd = open(q->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		fsync(dfd);
		close(dfd);
	}
	close(q->jfd);
	q->jfd = fd;
	fd = -1;
	/* the snapshot holds everything pending too */
	q->jpend.len = 0;
	__atomic_store_n(&q->jbytes, b.len, __ATOMIC_RELAXED);
	q->jcompact_at = 0;
	q->st.compactions++;
	rl_verbose("compacted '%s' to %zu bytes", q->jpath, b.len);
out:
	if (fd >= 0)
		close(fd);
	if (rv != 0) {
		/* the journal itself is whole and still appended to: a full disk
		 * (or no memory for the snapshot) only postpones the compaction,
		 * until the journal has grown by a quarter */
		uint64_t jb = __atomic_load_n(&q->jbytes, __ATOMIC_RELAXED);
		if (tmp)
			unlink(tmp);
		q->jcompact_at = jb + RL_MAX(jb / 4, (uint64_t)4096);
		rl_warn("'%s': compaction failed; the journal goes on growing (%llu bytes), next try at %llu bytes",
		    q->jpath, (unsigned long long)jb, (unsigned long long)q->jcompact_at);
		rv = RL_EBUSY;
	}
	free(tmp);
	rl_buf_fini(&b);
	return rv;
}

int
rl_queue_journal_sync(rl_queue *q)
{
	rl_buf b;
	int rv;

	if (q->jfd < 0)
		return RL_OK;
	rl_queue_journal_take(q, &b);
	rv = rl_queue_journal_write(q, &b);
	rl_buf_fini(&b);
	if (rv == 0)
		q->jsynced = q->jseq;
	if (rv == 0 && rl_queue_journal_compact_due(q))
		rl_queue_journal_compact(q);   /* RL_EBUSY: postponed, what was pending is written */
	return rv;
}

static int
restore_ents(rl_queue *q, const uint8_t *p, size_t n, uint32_t count)
{
	size_t off = 0;
	int rv;

	for (uint32_t k = 0; k < count; k++) {
		uint64_t lid;
		uint32_t state, hint, is_prompt, len, ei;
		size_t nrec;

		if (n - off < 24)
			return RL_EFORMAT;
		lid = rl_le64_get(p + off);
		state = rl_le32_get(p + off + 8);
		hint = rl_le32_get(p + off + 12);
		is_prompt = rl_le32_get(p + off + 16);
		len = rl_le32_get(p + off + 20);
		off += 24;
		if (len > n - off || state >= RL_QS_COUNT)
			return RL_EFORMAT;
		{
			/* parse the one record through a one-record batch view */
			rl_buf one;
			rl_buf_init(&one);
			if ((rv = batch_header(&one, 1)) != 0 || (rv = rl_buf_append(&one, p + off, len)) != 0) {
				rl_buf_fini(&one);
				return rv;
			}
			rv = parse_batch(q, one.p, one.len, &nrec);
			if (rv == 0) {
				q->meta[0].off = 0;
				rv = ent_create(q, &q->meta[0], p + off, (int)state, (int)is_prompt, &ei);
			}
			rl_buf_fini(&one);
			if (rv != 0)
				return rv == RL_EEXIST ? RL_EFORMAT : rv;
		}
		off += len;
		q->ent[ei].hint = hint;
		if (state == RL_QS_LEASED) {
			qgrp *g = &q->grp[q->ent[ei].grp];
			g->expect = hint > g->nsamples ? hint - g->nsamples : 0;
			q->inflight += g->expect;
		}
		if (!is_prompt)
			sample_arrived(q, q->ent[ei].grp);
		if (lid != 0) {
			qlease *l = lease_find(q, lid);
			if (l && (rv = lease_attach(q, l, ei)) != 0)
				return rv;
		}
	}
	return RL_OK;
}

/* --recover-journal: the journal is damaged at byte off with intact ops from
 * byte k on.  The state replayed so far (every change before the damage)
 * is kept and the file is cut there by journal_open; the whole file is
 * copied to journal.damaged-TIME first, for a person to look at.  The
 * changes after the damage are lost: records put then are gone, records
 * leased or acknowledged then are handed out again (at least once). */
static int
recover_at(rl_queue *q, const uint8_t *p, size_t n, size_t off, size_t k)
{
	char *copy = rl_xmalloc(strlen(q->jpath) + 48);
	int fd, rv = RL_OK;

	sprintf(copy, "%s.damaged-%lld", q->jpath, (long long)time(NULL));
	if ((fd = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0) {
		rl_error("cannot keep a copy of the damaged journal in '%s': %s", copy, strerror(errno));
		rv = RL_EIO;
	} else {
		rv = rl_io_write_full(fd, p, n, copy);
		if (rv == 0 && fsync(fd) != 0) {
			rl_error("cannot sync '%s': %s", copy, strerror(errno));
			rv = RL_EIO;
		}
		close(fd);
		if (rv != 0)
			unlink(copy);
	}
	if (rv == 0)
		rl_warn("'%s': damaged at byte %zu (intact data follows at byte %zu): recovered the changes before "
		    "byte %zu; the %zu bytes after it are dropped (a copy of the whole file is in '%s')", q->jpath,
		    off, k, off, n - off, copy);
	free(copy);
	return rv;
}

/* replay's outcome for a damaged op, beside 0 and the rl_err of an op that
 * could not be applied. */
#define REPLAY_DAMAGED (-1)

/* An op followed by a zstd frame (J_PUT, J_SNAPENT) at p[*next..n): the
 * frame is inflated into body and applied; *next moves past it. */
static int
replay_frame_op(rl_queue *q, uint32_t type, uint32_t stage, uint64_t a, const uint8_t *p, size_t n, size_t *next,
    rl_buf *body)
{
	size_t fsz = ZSTD_findFrameCompressedSize(p + *next, n - *next);
	unsigned long long csz;
	rl_qhdr h = { .flags = RL_QF_ZSTD };
	rl_qput_result r;

	if (ZSTD_isError(fsz))
		return REPLAY_DAMAGED;
	csz = ZSTD_getFrameContentSize(p + *next, fsz);
	if (csz == ZSTD_CONTENTSIZE_ERROR || csz == ZSTD_CONTENTSIZE_UNKNOWN || csz > UINT32_MAX)
		return REPLAY_DAMAGED;
	h.raw_len = (uint32_t)csz;
	body->len = 0;
	if (rl_qbody_get(body, &h, p + *next, fsz, (size_t)csz) != 0)
		return REPLAY_DAMAGED;
	*next += fsz;
	if (type == J_PUT)
		return apply_put(q, (int)stage, body->p, body->len, NULL, 0, &r);
	return restore_ents(q, body->p, body->len, (uint32_t)a);
}

/* An op without a frame: its fixed fields a, b, c and cnt record ids at idp. */
static int
replay_plain_op(rl_queue *q, uint32_t type, uint32_t stage, uint64_t a, uint64_t b, uint64_t c, const uint8_t *idp,
    uint32_t cnt)
{
	uint64_t *ids = NULL;
	rl_qack_result ar;
	int rv = RL_OK;

	if (cnt && (ids = rl_try_malloc((size_t)cnt * 8, "journal")) == NULL)
		return RL_ENOMEM;
	for (uint32_t i = 0; i < cnt; i++)
		ids[i] = rl_le64_get(idp + 8 * i);
	switch (type) {
	case J_HEAD:
		if (a != 1) {
			rl_error("'%s': journal format %llu is not supported", q->jpath, (unsigned long long)a);
			rl_hint("this journal was written by a newer rl-queue");
			rv = RL_EVERSION;
		} else if (b > q->next_lid) {
			q->next_lid = b;
		}
		break;
	case J_LEASE: rv = apply_lease(q, a, (int)stage, b, (uint32_t)c, ids, cnt); break;
	case J_ACK: rv = apply_ack(q, a, (int)stage, b, ids, cnt, &ar); if (rv == RL_ENOENT) rv = 0; break;
	case J_EXPIRE: rv = apply_expire(q, a, (int)stage, b); break;
	case J_VERSION:
		/* a journal written before versions were bounded may hold one past
		 * the bound: it would make every group stale for ever */
		if (a > RL_QUEUE_MAX_VERSION)
			rl_warn("'%s': ignoring trainer version %llu (versions are 0 to %d)", q->jpath,
			    (unsigned long long)a, RL_QUEUE_MAX_VERSION);
		else if (stage == 1)
			q->version = a; /* a rewind (rl_queue_rewind_version) */
		else
			rv = apply_version(q, a);
		break;
	case J_STALE: rv = apply_stale(q, a, (int)stage); break;
	case J_MAXSTALE: rv = apply_max_staleness(q, a); break;
	case J_ABORT: rv = apply_abort(q, (int)stage, ids, cnt); break;
	case J_DEDUP:
		for (uint32_t i = 0; i < cnt && rv == 0; i++)
			rv = win_add(stage ? &q->done_groups : &q->done_ids, ids[i]);
		break;
	case J_SNAPLEASE: {
		qlease *l;
		rv = lease_new(q, a, (int)stage, b, &l);
		break;
	}
	case J_SNAPGROUP: {
		uint32_t gi;
		if ((rv = group_get(q, a, &gi)) == 0)
			q->grp[gi].ndone = (uint32_t)b;
		break;
	}
	default:
		rv = REPLAY_DAMAGED;
		break;
	}
	free(ids);
	return rv;
}

/* The journal is damaged at byte off: a torn tail (a crash during a write)
 * ends the file and is dropped; damage before an intact op is an error, or
 * recovered with --recover-journal. */
static int
replay_damaged(rl_queue *q, const uint8_t *p, size_t n, size_t off)
{
	for (size_t k = off + 1; k + 8 <= n; k++) {
		if (rl_le32_get(p + k) == J_SKIP_MAGIC) {
			uint32_t cl = rl_le32_get(p + k + 4);
			if (cl >= J_FIXED + 4 && cl <= n - k - 8 &&
			    crc32(p + k + 8, cl - 4) == rl_le32_get(p + k + 8 + cl - 4)) {
				if (q->cfg.recover)
					return recover_at(q, p, n, off, k);
				rl_error("'%s': damaged journal at byte %zu (intact data follows at byte %zu)",
				    q->jpath, off, k);
				rl_hint("rl-queue serve --recover-journal keeps the changes before the damage "
				    "(a copy of the file is kept); or restore it from a backup");
				return RL_ECHECKSUM;
			}
		}
	}
	/* The first write to a journal is its head op alone (journal_open,
	 * synced before anything else; a compaction renames a whole file), so
	 * a file that long without a whole op at byte 0 was never a torn write
	 * of this broker: another program's file, a newer format, or damage.
	 * Cut, it was all gone with a warning. */
	if (off == 0 && n >= 8 + J_FIXED + 4) {
		rl_error("'%s': not an rl-queue journal, or damaged at byte 0 (%zu bytes, no whole operation)", q->jpath,
		    n);
		rl_hint("point --data-dir at the broker's directory, or move the file away to start empty");
		return RL_EFORMAT;
	}
	/* usually a write cut by a crash, so never acknowledged; but the same
	 * shape comes from damage to the last op, which may have been */
	rl_warn("'%s': dropping a damaged or torn tail of %zu bytes at byte %zu (a write cut by a crash, "
	    "or damage to the last change, which may have been acknowledged)", q->jpath, n - off, off);
	return RL_OK;
}

/* Replays one journal file held in memory.  *good gets the offset after the
 * last complete op. */
static int
replay(rl_queue *q, const uint8_t *p, size_t n, size_t *good)
{
	size_t off = 0;
	rl_buf body;
	int rv = RL_OK;

	rl_buf_init(&body);
	*good = 0;
	while (off < n) {
		uint32_t clen, type, stage, cnt;
		const uint8_t *ct;
		size_t next;

		if (n - off < 8 || rl_le32_get(p + off) != J_SKIP_MAGIC)
			break;
		clen = rl_le32_get(p + off + 4);
		if (clen < J_FIXED + 4 || clen > n - off - 8)
			break;
		ct = p + off + 8;
		if (crc32(ct, clen - 4) != rl_le32_get(ct + clen - 4))
			break;
		type = ct[0];
		stage = ct[1];
		cnt = rl_le32_get(ct + 4);
		if ((size_t)cnt * 8 != clen - 4 - J_FIXED)
			break;
		next = off + 8 + clen;
		if (type == J_PUT || type == J_SNAPENT)
			rv = replay_frame_op(q, type, stage, rl_le64_get(ct + 8), p, n, &next, &body);
		else
			rv = replay_plain_op(q, type, stage, rl_le64_get(ct + 8), rl_le64_get(ct + 16),
			    rl_le64_get(ct + 24), ct + J_FIXED, cnt);
		if (rv == REPLAY_DAMAGED) {
			rv = RL_OK;
			break;
		}
		if (rv != 0) {
			rl_buf_fini(&body);
			rl_error("'%s': cannot replay the journal at byte %zu: %s", q->jpath, off, rl_strerror(rv));
			return rv;
		}
		off = next;
		*good = off;
	}
	rl_buf_fini(&body);
	if (off < n)
		return replay_damaged(q, p, n, off);
	/* snapshot leases that kept no records */
	for (size_t i = 1; i < q->nlease_slots; i++)
		if (q->lease[i].used && q->lease[i].nlive == 0)
			lease_free(q, q->lease[i].lid);
	return RL_OK;
}

/* Two brokers appending to one journal lose data (one compacts, renaming a
 * new file over the one the other still appends to), so the directory is
 * locked: an flock on DIR/lock, a file that compaction never replaces, held
 * until rl_queue_close (or the process's death: no stale lock to clean). */
static int
lock_dir(rl_queue *q)
{
	char *path = rl_xmalloc(strlen(q->dir) + 8);
	int rv = RL_OK;

	sprintf(path, "%s/lock", q->dir);
	if ((q->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
		rl_error("cannot open '%s': %s", path, strerror(errno));
		rv = RL_EIO;
	} else if (flock(q->lockfd, LOCK_EX | LOCK_NB) != 0) {
		if (errno == EWOULDBLOCK) {
			rl_error("data directory '%s' is in use by another broker (locked '%s')", q->dir, path);
			rl_hint("stop the other broker, or give this one its own --data-dir");
			rv = RL_EBUSY;
		} else {
			rl_error("cannot lock '%s': %s", path, strerror(errno));
			rv = RL_EIO;
		}
	}
	free(path);
	return rv;
}

static int
journal_open(rl_queue *q)
{
	char *data = NULL;
	size_t len = 0, good = 0;
	int rv;

	if ((rv = rl_io_mkdir_p(q->dir, 0755)) != 0)
		return rv;
	if ((rv = lock_dir(q)) != 0)
		return rv;
	if (access(q->jpath, F_OK) != 0) {
		len = 0;
	} else if ((rv = rl_io_read_file(q->jpath, 0, &data, &len)) != 0) {
		return rv;
	} else {
		q->replaying = 1;
		rv = replay(q, (const uint8_t *)data, len, &good);
		q->replaying = 0;
		free(data);
		if (rv != 0)
			return rv;
	}
	if ((q->jfd = open(q->jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
		rl_error("cannot open '%s': %s", q->jpath, strerror(errno));
		return RL_EIO;
	}
	if (good < len && ftruncate(q->jfd, (off_t)good) != 0) {
		rl_error("cannot truncate '%s': %s", q->jpath, strerror(errno));
		return RL_EIO;
	}
	q->jbytes = good;
	if (good == 0) {
		if ((rv = jop(q, J_HEAD, 0, 1, q->next_lid, q->version, NULL, 0)) != 0)
			return rv;
		return rl_queue_journal_sync(q);
	}
	/* start from a snapshot: replay was the slow part, next restart is quick */
	if (len > 0 && rl_queue_journal_compact_due(q))
		rl_queue_journal_compact(q);   /* RL_EBUSY: postponed, the journal is whole */
	return RL_OK;
}

int
rl_queue_open(rl_queue **out, const rl_queue_config *cfg, uint64_t now_ms)
{
	rl_queue *q;
	int rv;

	*out = NULL;
	if ((q = rl_try_calloc(1, sizeof *q, "queue")) == NULL)
		return RL_ENOMEM;
	q->cfg = *cfg;
	q->cfg.data_dir = NULL;
	q->jfd = -1;
	q->lockfd = -1;
	q->next_lid = now_ms << 16;
	q->done_ids.cap = cfg->dedup_window;
	q->done_groups.cap = cfg->dedup_window;
	rl_buf_init(&q->jpend);
	if ((rv = rl_traj_create(&q->tmp)) != 0)
		goto fail;
	if ((cfg->dedup_window && ((q->done_ids.ring = rl_try_calloc(cfg->dedup_window, 8, "dedup window")) == NULL ||
	    (q->done_groups.ring = rl_try_calloc(cfg->dedup_window, 8, "dedup window")) == NULL))) {
		rv = RL_ENOMEM;
		goto fail;
	}
	if (cfg->data_dir) {
		q->dir = rl_xstrdup(cfg->data_dir);
		q->jpath = rl_xmalloc(strlen(q->dir) + 16);
		sprintf(q->jpath, "%s/journal", q->dir);
		if ((rv = journal_open(q)) != 0)
			goto fail;
	}
	rl_queue_tick(q, now_ms, NULL);
	*out = q;
	return RL_OK;
fail:
	rl_queue_close(q);
	return rv;
}

void
rl_queue_close(rl_queue *q)
{
	if (q == NULL)
		return;
	for (size_t i = 1; i < q->nent; i++)
		if (q->ent[i].used)
			free(q->ent[i].data);
	for (size_t i = 1; i < q->ngrp; i++)
		if (q->grp[i].used)
			free(q->grp[i].slot);
	for (size_t i = 1; i < q->nlease_slots; i++)
		if (q->lease[i].used)
			free(q->lease[i].ids);
	free(q->ent);
	free(q->grp);
	free(q->lease);
	map_free(&q->byid);
	map_free(&q->bygroup);
	map_free(&q->bylease);
	map_free(&q->done_ids.set);
	map_free(&q->done_groups.set);
	free(q->done_ids.ring);
	free(q->done_groups.ring);
	free(q->meta);
	rl_traj_destroy(q->tmp);
	rl_buf_fini(&q->jpend);
	if (q->jfd >= 0)
		close(q->jfd);
	if (q->lockfd >= 0)
		close(q->lockfd);   /* releases the flock */
	free(q->dir);
	free(q->jpath);
	free(q);
}

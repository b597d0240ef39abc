/*
 * qserve.c — rl-queue's nng server (see qserve.h).
 *
 * Threads: nng's callback threads run the contexts; the thread in
 * rl_qserve_run ticks (lease expiry, long-poll deadlines, idle journal
 * flush).  One mutex (mtx) guards the queue; another (jmtx) orders journal
 * writes.  Lock order: jmtx before mtx.  (De)compression happens outside both.
 */
#include "queue/qserve.h"
#include "queue/qserve_workers.h"
#include "base/auth.h"
#include "base/nngx.h"

#include <cjson/cJSON.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { C_RECV, C_SEND, C_WAIT };

typedef struct qctx {
	struct rl_qserve *s;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
	rl_qhdr h;             /* request header */
	rl_qlease_req lr;      /* waiting lease */
	uint64_t wait_until;   /* monotonic ms */
	struct qctx *wnext;    /* waiter list / send list */
	int queued;            /* on a waiter list */
	nng_pipe pipe;         /* a waiter's connection: gone, it is answered with nothing leased */
	/* reply being built */
	uint16_t status;
	uint64_t arg;
	rl_buf fixed, body, in, z;
	uint64_t seq;
} qctx;

/* --max-staleness auto's history for /api/stats and the dashboard: K from
 * each trainer version on (the start, then each change, with the rule's
 * reason; past AK_CHANGES the oldest changes after the start are dropped)
 * and the measurements of the last AK_WINDOWS windows. */
#define AK_CHANGES 256
#define AK_WINDOWS 512
enum { AKW_VERSION, AKW_TRAIN_IDLE, AKW_GEN_IDLE, AKW_BUBBLE, AKW_DRIFT, AKW_K, AKW_N };
typedef struct akhist {
	double k[AK_CHANGES][2];      /* version, K */
	char why[AK_CHANGES][192];    /* the rule's reason (rl_autok.why) */
	int nk;
	double w[AK_WINDOWS][AKW_N];  /* NaN: the window had no such measurement */
	int nw;
} akhist;

struct rl_qserve {
	rl_qserve_config cfg;
	nng_socket sock;
	nng_listener lst;
	rl_queue *q;
	pthread_mutex_t mtx, jmtx;
	qctx *ctx;
	int nctx, nwait, failed, has_journal, closing;
	int busy;              /* requests taken and not yet answered (atomic; waiters included) */
	/* connections admitted (pipe_cb), the bound, those refused */
	pthread_mutex_t cmtx;
	uint32_t *conn_ids;    /* the admitted pipes' ids (nconns of them) */
	int nconns, nrefused;
	double refused_logged;
	qctx *whead, *wtail;
	uint64_t durable;      /* journal seq known durable (atomic) */
	nng_socket probe;      /* ipc:// only: pings the broker itself (see probe_listener) */
	int probing, probe_fail;
	double probe_next;
	/* where the time goes (ns, atomic) */
	uint64_t t_decomp, t_comp, t_state, t_journal, t_lockwait, nreq, nbad, nreports;
	rli_workers *wk;       /* stage workers' reports (own lock) */
	rl_autok ak;           /* --max-staleness auto (under mtx) */
	akhist *ak_hist;       /* the rule's history for the dashboard (under mtx) */
};

static uint64_t
mono_ms(void)
{
	return (uint64_t)(rl_now() * 1000.0);
}

static uint64_t
wall_ms(void)
{
	return (uint64_t)(rl_wall() * 1000.0);
}

static uint64_t
ns_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define ADD_NS(field, t0) __atomic_add_fetch(&s->field, ns_now() - (t0), __ATOMIC_RELAXED)

static void
lock(rl_qserve *s)
{
	uint64_t t0 = ns_now();
	pthread_mutex_lock(&s->mtx);
	ADD_NS(t_lockwait, t0);
}

static void unlock(rl_qserve *s) { pthread_mutex_unlock(&s->mtx); }

/* Makes the journal durable up to seq (group commit).  Call without mtx. */
static int
commit(rl_qserve *s, uint64_t seq)
{
	rl_buf b;
	uint64_t target, t0;
	int rv = RL_OK;

	if (!s->has_journal || __atomic_load_n(&s->durable, __ATOMIC_ACQUIRE) >= seq)
		return RL_OK;
	pthread_mutex_lock(&s->jmtx);
	if (__atomic_load_n(&s->durable, __ATOMIC_ACQUIRE) < seq) {
		t0 = ns_now();
		lock(s);
		target = rl_queue_journal_take(s->q, &b);
		unlock(s);
		rv = rl_queue_journal_write(s->q, &b);
		rl_buf_fini(&b);
		if (rv == 0) {
			__atomic_store_n(&s->durable, target, __ATOMIC_RELEASE);
			lock(s);
			if (rl_queue_journal_compact_due(s->q)) {
				/* RL_EBUSY: postponed; ops queued since the take stay
				 * pending, the next commit writes them */
				rv = rl_queue_journal_compact(s->q);
				if (rv == 0)
					__atomic_store_n(&s->durable, rl_queue_journal_seq(s->q), __ATOMIC_RELEASE);
				else if (rv == RL_EBUSY)
					rv = RL_OK;
			}
			unlock(s);
		}
		if (rv != 0)
			s->failed = 1;
		ADD_NS(t_journal, t0);
	}
	pthread_mutex_unlock(&s->jmtx);
	return rv;
}

static void
reply_reset(qctx *c)
{
	c->status = 0;
	c->arg = 0;
	c->fixed.len = c->body.len = 0;
	c->seq = 0;
}

static void
reply_error(qctx *c, int rv, const char *msg)
{
	reply_reset(c);
	c->status = (uint16_t)rv;
	rl_buf_append(&c->body, msg, strlen(msg));
}

/* Builds and sends the reply held in c (after its journal ops are durable). */
static void
send_reply(qctx *c)
{
	rl_qserve *s = c->s;
	rl_qhdr h = { 0 };
	uint8_t hb[RL_QP_HDR_LEN];
	nng_msg *m = NULL;
	rl_buf z;
	int zip;

	rl_buf_init(&z);
	if (commit(s, c->seq) != 0 && c->status == 0) {
		reply_error(c, RL_EIO, "journal write failed: the broker is stopping");
	}
	zip = c->status == 0 && (c->h.flags & RL_QF_ACCEPT_ZSTD) && c->body.len >= 1024;
	if (zip) {
		uint64_t t0 = ns_now();
		if (rl_qzstd_compress(&z, c->body.p, c->body.len, s->cfg.level) != 0)
			zip = 0;
		ADD_NS(t_comp, t0);
	}
	h.op = (uint8_t)(c->h.op | RL_QOP_REPLY);
	h.flags = zip ? RL_QF_ZSTD : 0;
	h.status = c->status;
	h.raw_len = (uint32_t)c->body.len;
	h.req_id = c->h.req_id;
	h.arg = c->arg;
	rl_qhdr_encode(hb, &h);
	if (nng_msg_alloc(&m, 0) != 0 || nng_msg_reserve(m, sizeof hb + c->fixed.len + (zip ? z.len : c->body.len)) != 0 ||
	    nng_msg_append(m, hb, sizeof hb) != 0 || nng_msg_append(m, c->fixed.p, c->fixed.len) != 0 ||
	    nng_msg_append(m, zip ? z.p : c->body.p, zip ? z.len : c->body.len) != 0) {
		/* no memory for the reply: drop it, the client times out and retries */
		if (m)
			nng_msg_free(m);
		rl_buf_fini(&z);
		__atomic_sub_fetch(&s->busy, 1, __ATOMIC_ACQ_REL);
		c->state = C_RECV;
		nng_ctx_recv(c->ctx, c->aio);
		return;
	}
	rl_buf_fini(&z);
	/* do not keep big buffers per context: 64 of them add up */
	if (c->body.cap > ((size_t)2 << 20))
		rl_buf_fini(&c->body);
	if (c->in.cap > ((size_t)2 << 20))
		rl_buf_fini(&c->in);
	if (c->z.cap > ((size_t)2 << 20))
		rl_buf_fini(&c->z);
	c->state = C_SEND;
	nng_aio_set_msg(c->aio, m);
	nng_ctx_send(c->ctx, c->aio);
}

/* Under mtx: lease for c into its reply buffers.  Returns 1 if the lease
 * can be answered now (records, or wait over), 0 to keep waiting. */
static int
try_lease(rl_qserve *s, qctx *c, int final)
{
	rl_qlease_info info;
	uint8_t fb[RL_QLEASE_INFO_LEN];
	uint32_t min = c->lr.min_records ? RL_MIN(c->lr.min_records, c->lr.max_records) : 1;
	int rv;

	if (c->queued) {
		/* a parked long poll whose client died (kill -9, a crashed worker) must
		 * not take records: they would stay leased to nobody until the lease
		 * expires.  nng says ENOENT for a pipe that has closed. */
		nng_sockaddr sa;
		if (nng_pipe_id(c->pipe) > 0 && nng_pipe_get_addr(c->pipe, NNG_OPT_REMADDR, &sa) == NNG_ENOENT) {
			reply_reset(c);
			reply_error(c, RL_EIO, "client gone");
			return 1;
		}
	}
	if (!final && rl_queue_available(s->q, (int)c->lr.stage, c->lr.group_hint, c->lr.max_records) < min)
		return 0;
	reply_reset(c);
	rv = rl_queue_lease(s->q, &c->lr, wall_ms(), &info, &c->body);
	if (rv != 0) {
		reply_error(c, rv, "lease failed");
		return 1;
	}
	if (info.n == 0 && !final)
		return 0;
	rl_qlease_info_encode(fb, &info);
	rl_buf_append(&c->fixed, fb, sizeof fb);
	c->arg = info.n;
	c->seq = rl_queue_journal_seq(s->q);
	return 1;
}

static void
waiter_add(rl_qserve *s, qctx *c)
{
	c->wnext = NULL;
	c->queued = 1;
	if (s->wtail)
		s->wtail->wnext = c;
	else
		s->whead = c;
	s->wtail = c;
	s->nwait++;
}

/* Under mtx: answers waiters that can be answered (all of them if force_all,
 * those past their deadline if now != 0); they are moved to *out. */
static void
waiters_scan(rl_qserve *s, uint64_t now, int force_all, qctx **out)
{
	qctx *prev = NULL, *c = s->whead, *next;

	while (c) {
		int final = force_all || (now && now >= c->wait_until);
		next = c->wnext;
		if (try_lease(s, c, final)) {
			if (prev)
				prev->wnext = next;
			else
				s->whead = next;
			if (s->wtail == c)
				s->wtail = prev;
			s->nwait--;
			c->queued = 0;
			c->wnext = *out;
			*out = c;
		} else {
			prev = c;
		}
		c = next;
	}
}

static void
send_list(qctx *c)
{
	while (c) {
		qctx *next = c->wnext;
		c->wnext = NULL;
		send_reply(c);
		c = next;
	}
}

/* A number, or null for NaN (JSON has none). */
static cJSON *
num_or_null(double v)
{
	return isnan(v) ? cJSON_CreateNull() : cJSON_CreateNumber(v);
}

/* /api/stats "autok": the rule's state, its changes of K with their
 * reasons (history) and its windows' measurements (windows_history). */
static int
autok_json(rl_qserve *s, cJSON *o)
{
	static const char *const wname[AKW_N] = { "version", "train_idle_frac", "rollout_idle_frac", "bubble",
		"drift", "k" };
	akhist *h = rl_try_malloc(sizeof *h, "auto K history");
	cJSON *sv, *ch, *wh, *a[AKW_N], *hv, *hk, *hw;
	rl_autok ak;
	int rv = RL_ENOMEM;

	if (!h)
		return RL_ENOMEM;
	lock(s);
	ak = s->ak;
	memcpy(h, s->ak_hist, sizeof *h);
	unlock(s);
	if (!(sv = cJSON_AddObjectToObject(o, "autok")))
		goto out;
	cJSON_AddNumberToObject(sv, "k", ak.k);
	cJSON_AddNumberToObject(sv, "max", ak.cfg.kmax);
	cJSON_AddNumberToObject(sv, "changes", (double)ak.changes);
	cJSON_AddNumberToObject(sv, "windows", (double)ak.windows);
	cJSON_AddNumberToObject(sv, "hold_steps", ak.cfg.hold);
	cJSON_AddNumberToObject(sv, "bubble_threshold", ak.cfg.bubble);
	cJSON_AddNumberToObject(sv, "drift_low", ak.cfg.drift_low);
	cJSON_AddNumberToObject(sv, "drift_high", ak.cfg.drift_high);
	/* NaN until a window had the measurement: left out */
	if (!isnan(ak.train_idle))
		cJSON_AddNumberToObject(sv, "train_idle_frac", ak.train_idle);
	if (!isnan(ak.gen_idle))
		cJSON_AddNumberToObject(sv, "rollout_idle_frac", ak.gen_idle);
	if (!isnan(ak.bubble))
		cJSON_AddNumberToObject(sv, "bubble", ak.bubble);
	if (!isnan(ak.drift))
		cJSON_AddNumberToObject(sv, "drift", ak.drift);
	cJSON_AddNumberToObject(sv, "stale_waste_frac", ak.waste);
	cJSON_AddStringToObject(sv, "last", ak.why);
	if (!(ch = cJSON_AddObjectToObject(sv, "history")) || !(hv = cJSON_AddArrayToObject(ch, "version")) ||
	    !(hk = cJSON_AddArrayToObject(ch, "k")) || !(hw = cJSON_AddArrayToObject(ch, "why")))
		goto out;
	for (int i = 0; i < h->nk; i++) {
		cJSON_AddItemToArray(hv, cJSON_CreateNumber(h->k[i][0]));
		cJSON_AddItemToArray(hk, cJSON_CreateNumber(h->k[i][1]));
		cJSON_AddItemToArray(hw, cJSON_CreateString(h->why[i]));
	}
	if (!(wh = cJSON_AddObjectToObject(sv, "windows_history")))
		goto out;
	for (int j = 0; j < AKW_N; j++)
		if (!(a[j] = cJSON_AddArrayToObject(wh, wname[j])))
			goto out;
	for (int i = 0; i < h->nw; i++)
		for (int j = 0; j < AKW_N; j++)
			cJSON_AddItemToArray(a[j], num_or_null(h->w[i][j]));
	rv = RL_OK;
out:
	free(h);
	return rv;
}

int
rl_qserve_stats_json(rl_qserve *s, char **out)
{
	rl_buf t;
	cJSON *o, *sv;
	int rv, nwait;

	*out = NULL;
	rl_buf_init(&t);
	lock(s);
	rv = rl_queue_stats_json(s->q, wall_ms(), &t);
	nwait = s->nwait;
	unlock(s);
	if (rv != 0 || rl_buf_putc(&t, 0) != 0 || (o = cJSON_Parse((const char *)t.p)) == NULL) {
		rl_buf_fini(&t);
		return RL_ENOMEM;
	}
	rl_buf_fini(&t);
	if ((sv = cJSON_AddObjectToObject(o, "server")) != NULL) {
		cJSON_AddNumberToObject(sv, "requests", (double)__atomic_load_n(&s->nreq, __ATOMIC_RELAXED));
		cJSON_AddNumberToObject(sv, "bad_requests", (double)__atomic_load_n(&s->nbad, __ATOMIC_RELAXED));
		cJSON_AddNumberToObject(sv, "waiting", nwait);
		cJSON_AddNumberToObject(sv, "contexts", s->nctx);
		pthread_mutex_lock(&s->cmtx);
		cJSON_AddNumberToObject(sv, "connections", s->nconns);
		cJSON_AddNumberToObject(sv, "max_connections", s->cfg.max_conns);
		cJSON_AddNumberToObject(sv, "connections_refused", s->nrefused);
		pthread_mutex_unlock(&s->cmtx);
		cJSON_AddNumberToObject(sv, "max_msg", (double)s->cfg.max_msg);
		/* what bodies being received can hold at most: counted against --max-bytes */
		cJSON_AddNumberToObject(sv, "receive_bound_bytes", (double)s->cfg.max_conns * (double)s->cfg.max_msg);
		cJSON_AddNumberToObject(sv, "decompress_s", __atomic_load_n(&s->t_decomp, __ATOMIC_RELAXED) / 1e9);
		cJSON_AddNumberToObject(sv, "compress_s", __atomic_load_n(&s->t_comp, __ATOMIC_RELAXED) / 1e9);
		cJSON_AddNumberToObject(sv, "state_s", __atomic_load_n(&s->t_state, __ATOMIC_RELAXED) / 1e9);
		cJSON_AddNumberToObject(sv, "journal_s", __atomic_load_n(&s->t_journal, __ATOMIC_RELAXED) / 1e9);
		cJSON_AddNumberToObject(sv, "lock_wait_s", __atomic_load_n(&s->t_lockwait, __ATOMIC_RELAXED) / 1e9);
		cJSON_AddNumberToObject(sv, "reports", (double)__atomic_load_n(&s->nreports, __ATOMIC_RELAXED));
	}
	if (s->cfg.queue.auto_k && autok_json(s, o) != 0) {
		cJSON_Delete(o);
		return RL_ENOMEM;
	}
	if (rli_workers_json(s->wk, o, rl_now()) != 0) {
		cJSON_Delete(o);
		return RL_ENOMEM;
	}
	*out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return *out ? RL_OK : RL_ENOMEM;
}

static void
stat_reply(rl_qserve *s, qctx *c)
{
	char *txt;

	if (rl_qserve_stats_json(s, &txt) != 0) {
		reply_error(c, RL_ENOMEM, "cannot build stats");
		return;
	}
	reply_reset(c);
	rl_buf_append(&c->body, txt, strlen(txt));
	free(txt);
}

/* The request handlers below fill c's reply (or its error) from the request
 * body (blen bytes) and add the waiters a change can serve to *ready. */

/* PUT: a batch of records, plain (used in place) or zstd (inflated). */
static void
op_put(rl_qserve *s, qctx *c, const uint8_t *body, size_t blen, qctx **ready)
{
	const uint8_t *batch;
	size_t batch_len;
	const void *frame = (c->h.flags & RL_QF_ZSTD) ? body : NULL;
	size_t flen = blen;
	rl_qput_result r;
	uint8_t fb[32];
	char why[160];
	uint64_t t0;
	int rv;

	if (c->h.arg >= RL_QSTAGE_COUNT) {   /* not cut to an int first */
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, RL_EINVAL, "bad stage");
		return;
	}
	if (c->h.flags & RL_QF_ZSTD) {
		t0 = ns_now();
		rv = rl_qbody_get(&c->in, &c->h, body, blen, s->cfg.max_msg);
		ADD_NS(t_decomp, t0);
		batch = c->in.p;
		batch_len = c->in.len;
	} else {
		rv = blen > s->cfg.max_msg ? RL_ETOOBIG : RL_OK;
		batch = body;
		batch_len = blen;
	}
	if (rv != 0) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, rv, rv == RL_ETOOBIG ? "request body over the size limit" : "bad request body");
		return;
	}
	if (frame == NULL && s->has_journal) {
		/* the journal wants a zstd frame: make it before taking the lock */
		t0 = ns_now();
		c->z.len = 0;
		if (rl_qzstd_compress(&c->z, batch, batch_len, s->cfg.queue.journal_level) == 0) {
			frame = c->z.p;
			flen = c->z.len;
		}
		ADD_NS(t_comp, t0);
	}
	lock(s);
	t0 = ns_now();
	rv = rl_queue_put(s->q, (int)c->h.arg, batch, batch_len, frame, flen, wall_ms(), &r);
	if (rv == 0 && s->nwait)
		waiters_scan(s, 0, 0, ready);
	c->seq = rl_queue_journal_seq(s->q);
	ADD_NS(t_state, t0);
	unlock(s);
	if (rv != 0) {
		snprintf(why, sizeof why, "put refused: %s", rl_strerror(rv));
		if (rv != RL_EBUSY)
			__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, rv, why);
		return;
	}
	rl_qput_result_encode(fb, &r);
	rl_buf_append(&c->fixed, fb, RL_QPUT_RESULT_LEN);
}

/* LEASE: records of a stage now, or c waits for them (long poll) on the
 * pipe of m.  Returns 1 when c now waits, 0 when its reply is ready. */
static int
op_lease(rl_qserve *s, qctx *c, nng_msg *m, const uint8_t *body, size_t blen, qctx **ready)
{
	uint64_t t0;

	if (blen < RL_QLEASE_REQ_LEN) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, RL_EFORMAT, "short lease request");
		return 0;
	}
	rl_qlease_req_decode(&c->lr, body);
	if (c->lr.stage >= RL_QSTAGE_COUNT || c->lr.max_records == 0) {
		reply_error(c, RL_EINVAL, "bad lease request (stage or count)");
		return 0;
	}
	if (c->lr.wait_ms > 600000)
		c->lr.wait_ms = 600000;
	lock(s);
	t0 = ns_now();
	if (c->lr.ack_lease) {
		/* piggybacked ack of the previous lease: one round trip per batch */
		rl_qack_req ar = { .lease_id = c->lr.ack_lease, .kind = RL_QACK_DONE };
		rl_qack_result res;
		rl_queue_ack(s->q, &ar, NULL, wall_ms(), &res);
		c->lr.ack_lease = 0;
		if (s->nwait)
			waiters_scan(s, 0, 0, ready);
	}
	c->wait_until = mono_ms() + c->lr.wait_ms;
	if (try_lease(s, c, c->lr.wait_ms == 0)) {
		ADD_NS(t_state, t0);
		unlock(s);
		return 0;
	}
	/* keep a few contexts free for puts and acks */
	if (s->nwait + 4 >= s->nctx && s->whead) {
		qctx *old = s->whead;
		s->whead = old->wnext;
		if (s->wtail == old)
			s->wtail = NULL;
		s->nwait--;
		old->queued = 0;
		try_lease(s, old, 1);
		old->wnext = *ready;
		*ready = old;
	}
	c->state = C_WAIT;
	c->pipe = nng_msg_get_pipe(m);
	waiter_add(s, c);
	ADD_NS(t_state, t0);
	unlock(s);
	return 1;
}

/* ACK: done, release or drop of a lease, whole or by record ids. */
static void
op_ack(rl_qserve *s, qctx *c, const uint8_t *body, size_t blen, qctx **ready)
{
	rl_qack_req ar;
	rl_qack_result res;
	uint64_t *ids = NULL, t0;
	uint8_t fb[32];
	int rv;

	if (blen < RL_QACK_REQ_LEN) {
		reply_error(c, RL_EFORMAT, "short ack request");
		return;
	}
	rl_qack_req_decode(&ar, body);
	if ((blen - RL_QACK_REQ_LEN) / 8 < ar.n) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, RL_EFORMAT, "ack request shorter than its id count");
		return;
	}
	if (ar.n) {
		if ((ids = malloc((size_t)ar.n * 8)) == NULL) {
			reply_error(c, RL_ENOMEM, "out of memory");
			return;
		}
		for (uint32_t i = 0; i < ar.n; i++)
			ids[i] = rl_le64_get(body + RL_QACK_REQ_LEN + 8 * i);
	}
	lock(s);
	t0 = ns_now();
	rv = rl_queue_ack(s->q, &ar, ids, wall_ms(), &res);
	if (s->nwait)
		waiters_scan(s, 0, 0, ready);
	c->seq = rl_queue_journal_seq(s->q);
	ADD_NS(t_state, t0);
	unlock(s);
	free(ids);
	if (rv != 0 && rv != RL_ENOENT) {
		reply_error(c, rv, "ack failed");
		return;
	}
	c->status = (uint16_t)rv;   /* RL_ENOENT: unknown lease, with counts */
	rl_qack_result_encode(fb, &res);
	rl_buf_append(&c->fixed, fb, RL_QACK_RESULT_LEN);
}

/* VERSION: the trainer's weight version; waiters the staleness gate held
 * may now be served. */
static void
op_version(rl_qserve *s, qctx *c, qctx **ready)
{
	uint64_t now;
	int rv;

	lock(s);
	rv = (c->h.flags & RL_QF_REWIND) ? rl_queue_rewind_version(s->q, c->h.arg, &now) :
	    rl_queue_set_version(s->q, c->h.arg, &now);
	if (rv == 0 && s->nwait)
		waiters_scan(s, 0, 0, ready);
	c->seq = rl_queue_journal_seq(s->q);
	unlock(s);
	if (rv != 0) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, rv, rv == RL_EINVAL ? "version out of range (versions are 0 to 2147483647, i32 in records)" :
		    "cannot set version");
		return;
	}
	c->arg = now;
}

/* the K of --max-staleness auto from a trainer version on, and why */
static void
khist_add(rl_qserve *s, double version, uint32_t k, const char *why)
{
	akhist *h = s->ak_hist;

	if (h->nk == AK_CHANGES) {
		memmove(h->k[1], h->k[2], sizeof h->k[0] * (AK_CHANGES - 2));
		memmove(h->why[1], h->why[2], sizeof h->why[0] * (AK_CHANGES - 2));
		h->nk--;
	}
	h->k[h->nk][0] = version;
	h->k[h->nk][1] = k;
	snprintf(h->why[h->nk++], sizeof h->why[0], "%s", why);
}

/* a window the rule closed: its measurements, and the K after it */
static void
kwin_add(rl_qserve *s, double version)
{
	akhist *h = s->ak_hist;
	const rl_autok *a = &s->ak;

	if (h->nw == AK_WINDOWS) {
		memmove(h->w[0], h->w[1], sizeof h->w[0] * (AK_WINDOWS - 1));
		h->nw--;
	}
	h->w[h->nw][AKW_VERSION] = version;
	h->w[h->nw][AKW_TRAIN_IDLE] = a->train_idle;
	h->w[h->nw][AKW_GEN_IDLE] = a->gen_idle;
	h->w[h->nw][AKW_BUBBLE] = a->bubble;
	h->w[h->nw][AKW_DRIFT] = a->drift;
	h->w[h->nw++][AKW_K] = a->k;
}

/* --max-staleness auto: the rule on the totals after a report; a new K is
 * journaled (durable before the report's reply, as every op) and logged. */
static void
autok_step(rl_qserve *s, qctx *c)
{
	rl_autok_totals t;
	rl_queue_stats qs;
	uint32_t k0;
	uint64_t w0;
	int changed, rv = RL_OK;
	char why[sizeof s->ak.why];

	rli_workers_totals(s->wk, rl_now(), &t.train_busy, &t.train_idle, &t.gen_busy, &t.gen_idle, &t.drift_sum,
	    &t.drift_n);
	lock(s);
	rl_queue_get_stats(s->q, &qs);
	t.version = (double)qs.version;
	t.trained = 0;
	for (int i = 0; i < 9; i++)
		t.trained += (double)qs.staleness[i];
	t.dropped = (double)(qs.stale_dropped + qs.stale_regen);
	k0 = s->ak.k;
	w0 = s->ak.windows;
	changed = rl_autok_update(&s->ak, &t);
	if (changed && (rv = rl_queue_set_max_staleness(s->q, s->ak.k)) != 0)
		s->ak.k = k0;   /* not journaled: K stays as in force */
	else if (changed)
		khist_add(s, t.version, s->ak.k, s->ak.why);
	if (s->ak.windows != w0)
		kwin_add(s, t.version);
	c->seq = rl_queue_journal_seq(s->q);
	memcpy(why, s->ak.why, sizeof why);
	unlock(s);
	if (changed && rv == 0)
		rl_info("max-staleness auto: %s", why);
	else if (changed)
		rl_warn("max-staleness auto: K stays %u: the change could not be journaled", k0);
}

/* REPORT: a stage's stats, small JSON, checked whole before it is stored. */
static void
op_report(rl_qserve *s, qctx *c, const uint8_t *body, size_t blen)
{
	char why[160];
	int rv;

	if ((c->h.flags & RL_QF_ZSTD) == 0 && blen > RL_QP_MAX_REPORT)
		rv = RL_ETOOBIG;
	else
		rv = rl_qbody_get(&c->in, &c->h, body, blen, RL_QP_MAX_REPORT);
	if (rv == 0)
		rv = rli_workers_report(s->wk, (const char *)c->in.p, c->in.len, rl_now(), why, sizeof why);
	else
		snprintf(why, sizeof why, rv == RL_ETOOBIG ? "stats report over %zu bytes" : "bad stats report body",
		    (size_t)RL_QP_MAX_REPORT);
	if (rv != 0) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, rv, why);
		return;
	}
	__atomic_add_fetch(&s->nreports, 1, __ATOMIC_RELAXED);
	if (s->cfg.queue.auto_k)
		autok_step(s, c);
}

/* Handles one request message (consumed).  Returns 1 when a reply is ready
 * in c, 0 when c now waits (long poll). */
static int
handle(rl_qserve *s, qctx *c, nng_msg *m)
{
	const uint8_t *p = nng_msg_body(m), *body;
	size_t len = nng_msg_len(m), blen;
	qctx *ready = NULL;
	char why[160];
	int rv, waits = 0;

	__atomic_add_fetch(&s->nreq, 1, __ATOMIC_RELAXED);
	reply_reset(c);
	c->in.len = 0;
	if ((rv = rl_qhdr_decode(&c->h, p, len)) != 0) {
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		reply_error(c, rv, rv == RL_EVERSION ? "unsupported protocol version" : "malformed request header");
		goto done;
	}
	{
		const char *no;
		if (rl_qauth_check(p, len, &c->h, strncmp(s->cfg.listen, "tls+", 4) == 0, &no) != 0) {
			/* refused before the op: nothing is put, leased or acked */
			__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
			rl_warn("refused a %s request: %s", rl_qop_name(c->h.op), no);
			reply_error(c, RL_EINVAL, no);
			goto done;
		}
	}
	body = p + c->h.hdr_len;
	blen = len - c->h.hdr_len;
	switch (c->h.op) {
	case RL_QOP_PING: break;
	case RL_QOP_PUT: op_put(s, c, body, blen, &ready); break;
	case RL_QOP_LEASE: waits = op_lease(s, c, m, body, blen, &ready); break;
	case RL_QOP_ACK: op_ack(s, c, body, blen, &ready); break;
	case RL_QOP_VERSION: op_version(s, c, &ready); break;
	case RL_QOP_STAT: stat_reply(s, c); break;
	case RL_QOP_REPORT: op_report(s, c, body, blen); break;
	default:
		__atomic_add_fetch(&s->nbad, 1, __ATOMIC_RELAXED);
		snprintf(why, sizeof why, "unknown op %u", c->h.op);
		reply_error(c, RL_EINVAL, why);
		break;
	}
done:
	nng_msg_free(m);
	send_list(ready);
	return !waits;
}

static void
ctx_cb(void *arg)
{
	qctx *c = arg;
	rl_qserve *s = c->s;
	int rv = nng_aio_result(c->aio);

	switch (c->state) {
	case C_RECV:
		if (rv != 0) {
			/* only our own shutdown ends a context: a peer that went
			 * away must not take a context with it */
			if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
				return;
			nng_ctx_recv(c->ctx, c->aio);
			return;
		}
		__atomic_add_fetch(&s->busy, 1, __ATOMIC_ACQ_REL);
		if (handle(s, c, nng_aio_get_msg(c->aio)))
			send_reply(c);
		return;
	case C_SEND:
		__atomic_sub_fetch(&s->busy, 1, __ATOMIC_ACQ_REL);
		if (rv != 0) {
			/* the reply was not sent (its client left): drop it */
			nng_msg *m = nng_aio_get_msg(c->aio);
			if (m)
				nng_msg_free(m);
			if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
				return;
		}
		c->state = C_RECV;
		nng_ctx_recv(c->ctx, c->aio);
		return;
	default:
		return;
	}
}

size_t
rl_qserve_auto_msg(uint64_t max_bytes)
{
	uint64_t m = max_bytes / 64;

	return (size_t)RL_MIN((uint64_t)RL_QP_MAX_MSG, RL_MAX(m, (uint64_t)1 << 20));
}

int
rl_qserve_auto_conns(uint64_t max_bytes, size_t max_msg)
{
	uint64_t n = max_msg ? max_bytes / max_msg : 0;

	return (int)RL_MIN(RL_MAX(n, 64), 4096);
}

/* Admits a connection while fewer than max_conns are open; one over that is
 * closed before the socket sees it (a client gets no answer and retries,
 * as when the broker is away).  Runs on nng's threads. */
static void
pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	rl_qserve *s = arg;
	int refuse = 0, log_it = 0, n;

	pthread_mutex_lock(&s->cmtx);
	if (ev == NNG_PIPE_EV_ADD_PRE) {
		if (s->nconns >= s->cfg.max_conns) {
			refuse = 1;
			s->nrefused++;
			if (rl_now() >= s->refused_logged + 10.0) {
				s->refused_logged = rl_now();
				log_it = 1;
			}
		} else {
			s->conn_ids[s->nconns++] = (uint32_t)nng_pipe_id(p);
		}
	} else if (ev == NNG_PIPE_EV_REM_POST) {
		/* nng 1.5 reports the removal of a pipe closed at ADD_PRE too:
		 * only an admitted one is uncounted */
		for (int i = 0; i < s->nconns; i++)
			if (s->conn_ids[i] == (uint32_t)nng_pipe_id(p)) {
				s->conn_ids[i] = s->conn_ids[--s->nconns];
				break;
			}
	}
	n = s->nrefused;
	pthread_mutex_unlock(&s->cmtx);
	if (refuse) {
		if (log_it)
			rl_warn("refused a connection: %d are open, the most --max-conns allows (bodies being received "
			    "are bounded by connections x --max-msg = %.0f MiB); %d refused so far", s->cfg.max_conns,
			    (double)s->cfg.max_conns * (double)s->cfg.max_msg / 1048576.0, n);
		nng_pipe_close(p);
	}
}

int
rl_qserve_open(rl_qserve **out, const rl_qserve_config *cfg)
{
	rl_qserve *s;
	int rv, nrv;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "server")) == NULL)
		return RL_ENOMEM;
	s->cfg = *cfg;
	if (s->cfg.max_msg == 0)
		s->cfg.max_msg = rl_qserve_auto_msg(s->cfg.queue.max_bytes);
	if (s->cfg.max_conns <= 0)
		s->cfg.max_conns = rl_qserve_auto_conns(s->cfg.queue.max_bytes, s->cfg.max_msg);
	if ((double)s->cfg.max_conns * (double)s->cfg.max_msg > (double)s->cfg.queue.max_bytes)
		rl_warn("bodies being received may hold up to %d connections x %.1f MiB (--max-conns x --max-msg), "
		    "more than --max-bytes %.1f MiB", s->cfg.max_conns, (double)s->cfg.max_msg / 1048576.0,
		    (double)s->cfg.queue.max_bytes / 1048576.0);
	if (s->cfg.level == 0)
		s->cfg.level = 1;
	s->nctx = cfg->nctx > 0 ? cfg->nctx : 64;
	pthread_mutex_init(&s->mtx, NULL);
	pthread_mutex_init(&s->jmtx, NULL);
	pthread_mutex_init(&s->cmtx, NULL);
	if ((s->conn_ids = rl_try_calloc((size_t)s->cfg.max_conns, sizeof *s->conn_ids, "connection table")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	if ((rv = rli_workers_create(&s->wk)) != 0)
		goto fail;
	if ((rv = rl_queue_open(&s->q, &cfg->queue, wall_ms())) != 0)
		goto fail;
	s->has_journal = cfg->queue.data_dir != NULL;
	s->durable = rl_queue_journal_seq(s->q);
	if (cfg->queue.auto_k) {
		/* a journal replayed: the K it reached, not the starting one */
		rl_queue_stats qs;
		char why[64];
		if (!(s->ak_hist = rl_try_calloc(1, sizeof *s->ak_hist, "auto K history"))) {
			rv = RL_ENOMEM;
			goto fail;
		}
		rl_autok_init(&s->ak, &cfg->autok, rl_queue_max_staleness(s->q));
		rl_queue_get_stats(s->q, &qs);
		snprintf(why, sizeof why, "K starts at %u (0 to %u)", s->ak.k, cfg->autok.kmax);
		khist_add(s, (double)qs.version, s->ak.k, why);
		rl_info("max-staleness auto: %s", why);
	}
	if ((nrv = nng_rep0_open(&s->sock)) != 0 ||
	    (nrv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, s->cfg.max_msg + 4096)) != 0 ||
	    (nrv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, s)) != 0 ||
	    (nrv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s)) != 0) {
		rl_error("cannot open the broker socket: %s", nng_strerror(nrv));
		rv = RL_ENET;
		goto fail;
	}
	if ((s->ctx = rl_try_calloc((size_t)s->nctx, sizeof *s->ctx, "contexts")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < s->nctx; i++) {
		qctx *c = &s->ctx[i];
		c->s = s;
		if ((nrv = nng_ctx_open(&c->ctx, s->sock)) != 0 || (nrv = nng_aio_alloc(&c->aio, ctx_cb, c)) != 0) {
			rl_error("cannot open a broker context: %s", nng_strerror(nrv));
			rv = RL_ENET;
			goto fail;
		}
	}
	if ((nrv = rli_nng_listen(s->sock, cfg->listen, &s->lst)) != 0) {
		rl_error("cannot listen on '%s': %s", cfg->listen, nng_strerror(nrv));
		if (nrv == NNG_EADDRINUSE)
			rl_hint("another process listens there; pick another port");
		rv = RL_ENET;
		goto fail;
	}
	for (int i = 0; i < s->nctx; i++) {
		s->ctx[i].state = C_RECV;
		nng_ctx_recv(s->ctx[i].ctx, s->ctx[i].aio);
	}
	*out = s;
	return RL_OK;
fail:
	rl_qserve_close(s);
	return rv;
}

/* nng 1.5.2 (Debian's) has a bug (nng issue #1518): an ipc:// listener stops
 * accepting connections after a peer disconnects during the handshake.
 * Every 2 s the broker pings itself over its own URL; after two failed
 * pings it closes the listener and listens again. */
static void
probe_listener(rl_qserve *s)
{
	uint8_t hb[RL_QP_HDR_LEN], ahb[RL_QP_AUTH_HDR_LEN] = { 0 };
	rl_qhdr h = { .op = RL_QOP_PING };
	nng_msg *m = NULL;
	nng_dialer d;
	int rv;

	if (rl_now() < s->probe_next)
		return;
	s->probe_next = rl_now() + 2.0;
	if (!s->probing) {
		if (nng_req0_open(&s->probe) != 0)
			return;
		nng_socket_set_ms(s->probe, NNG_OPT_RECVTIMEO, 1000);
		nng_socket_set_ms(s->probe, NNG_OPT_SENDTIMEO, 1000);
		nng_socket_set_ms(s->probe, NNG_OPT_RECONNMINT, 50);
		nng_socket_set_ms(s->probe, NNG_OPT_RECONNMAXT, 200);
		nng_socket_set_ms(s->probe, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
		s->probing = 1;
	}
	/* a new connection each time: an old one keeps working when the
	 * listener is stuck */
	if ((rv = rli_nng_dial(s->probe, s->cfg.listen, &d, NNG_FLAG_NONBLOCK)) != 0)
		return;
	if (rli_auth_key(NULL)) {   /* a keyed broker would refuse its own unsigned ping */
		h.flags = RL_QF_AUTH;
		h.hdr_len = RL_QP_AUTH_HDR_LEN;
	}
	rl_qhdr_encode(hb, &h);
	memcpy(ahb, hb, sizeof hb);
	if (h.hdr_len)
		rl_qauth_sign(ahb, sizeof ahb, 0);   /* the full proof: taken on either listener */
	rv = nng_send(s->probe, ahb, h.hdr_len ? sizeof ahb : sizeof hb, 0);
	if (rv == 0)
		rv = nng_recvmsg(s->probe, &m, 0);
	if (m)
		nng_msg_free(m);
	nng_dialer_close(d);
	if (rv == 0) {
		s->probe_fail = 0;
		return;
	}
	if (++s->probe_fail < 2)
		return;
	rl_warn("'%s' stopped accepting connections (nng bug #1518); listening again", s->cfg.listen);
	nng_listener_close(s->lst);
	if ((rv = rli_nng_listen(s->sock, s->cfg.listen, &s->lst)) != 0) {
		rl_error("cannot listen again on '%s': %s", s->cfg.listen, nng_strerror(rv));
		s->failed = 1;
	}
	s->probe_fail = 0;
}

int
rl_qserve_run(rl_qserve *s, volatile sig_atomic_t *stop)
{
	while (!*stop && !s->failed) {
		qctx *ready = NULL;
		uint32_t expired = 0;
		uint64_t seq;

		nng_msleep(10);
		lock(s);
		rl_queue_tick(s->q, wall_ms(), &expired);
		if (s->nwait)
			waiters_scan(s, mono_ms(), 0, &ready);
		seq = rl_queue_journal_seq(s->q);
		unlock(s);
		if (expired)
			rl_verbose("%u leases expired", expired);
		commit(s, seq);
		send_list(ready);
		if (strncmp(s->cfg.listen, "ipc://", 6) == 0)
			probe_listener(s);
	}
	if (s->probing)
		nng_close(s->probe);
	/* a failed journal write: the requests it failed are answered with
	 * the reason (send_reply) before the socket closes, so that their
	 * clients read it rather than a broker gone silent; 2 s at most, and
	 * waiting leases are not waited for */
	for (int i = 0; s->failed && i < 200; i++) {
		int waiting;
		lock(s);
		waiting = s->nwait;
		unlock(s);
		if (__atomic_load_n(&s->busy, __ATOMIC_ACQUIRE) <= waiting)
			break;
		nng_msleep(10);
	}
	return s->failed ? RL_EIO : RL_OK;
}

void
rl_qserve_close(rl_qserve *s)
{
	if (s == NULL)
		return;
	__atomic_store_n(&s->closing, 1, __ATOMIC_RELEASE);
	if (s->ctx) {
		nng_close(s->sock);
		for (int i = 0; i < s->nctx; i++) {
			if (s->ctx[i].aio) {
				nng_aio_stop(s->ctx[i].aio);
				nng_aio_free(s->ctx[i].aio);
			}
			rl_buf_fini(&s->ctx[i].fixed);
			rl_buf_fini(&s->ctx[i].body);
			rl_buf_fini(&s->ctx[i].in);
			rl_buf_fini(&s->ctx[i].z);
		}
		free(s->ctx);
	} else if (nng_socket_id(s->sock) > 0) {
		nng_close(s->sock);
	}
	if (s->q) {
		rl_queue_journal_sync(s->q);
		rl_queue_close(s->q);
	}
	rli_workers_destroy(s->wk);
	pthread_mutex_destroy(&s->mtx);
	pthread_mutex_destroy(&s->jmtx);
	pthread_mutex_destroy(&s->cmtx);
	free(s->conn_ids);
	free(s->ak_hist);
	free(s);
}

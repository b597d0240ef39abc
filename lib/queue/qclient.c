/*
 * qclient.c — rl-queue client (see qclient.h): request/reply over an nng REQ
 * socket, retries with backoff, lease decoding, consumer-side dedup.
 */
#include "queue/qclient.h"
#include "base/hash.h"
#include "base/auth.h"
#include "base/nngx.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

/* ids acknowledged by this client: a ring plus an open-addressing set */
typedef struct seen {
	uint64_t *ring, *keys;
	uint8_t *used;
	size_t cap, n, head, tcap;
} seen;

struct rl_qclient {
	nng_socket sock;
	rl_qclient_opts o;
	int compress;
	uint64_t next_req;
	rl_traj *tmp;
	rl_buf buf;
	seen seen;
	int quiet;             /* rl_qclient_report: failures logged at verbose level only */
	int gone;              /* a request went unanswered for broker_timeout_ms */
	const volatile sig_atomic_t *stop; /* set: no retries */
	char *url;
	rli_redial *rd;        /* the dialer, dialled again when a TLS reconnection stalls */
};

void
rl_qclient_set_stop(rl_qclient *c, const volatile sig_atomic_t *stop)
{
	if (c != NULL)
		c->stop = stop;
}

static int
stopping(const rl_qclient *c)
{
	return c->stop != NULL && *c->stop != 0;
}

int
rl_qclient_gone(const rl_qclient *c)
{
	return c != NULL && c->gone;
}

void
rl_qclient_opts_default(rl_qclient_opts *o)
{
	memset(o, 0, sizeof *o);
	o->timeout_ms = 10000;
	o->retry_ms = 60000;
	o->compress = -1;
	o->level = 1;
	o->max_msg = RL_QP_MAX_MSG;
	o->dedup = 1;
}

void
rl_qclient_opts_stage(rl_qclient_opts *o, double broker_timeout_s)
{
	rl_qclient_opts_default(o);
	o->retry_ms = -1;
	o->broker_timeout_ms = broker_timeout_s > 0 ? (int)RL_MIN(broker_timeout_s * 1000.0 + 0.5, 2e9) : 0;
}

/* ---- seen set ------------------------------------------------------------------ */
static int
seen_has(const seen *s, uint64_t id)
{
	if (s->tcap == 0)
		return 0;
	for (size_t i = rl_hash_mix(id) & (s->tcap - 1);; i = (i + 1) & (s->tcap - 1)) {
		if (!s->used[i])
			return 0;
		if (s->keys[i] == id)
			return 1;
	}
}

static void
seen_del(seen *s, uint64_t id)
{
	size_t mask = s->tcap - 1, i, j;

	for (i = rl_hash_mix(id) & mask;; i = (i + 1) & mask) {
		if (!s->used[i])
			return;
		if (s->keys[i] == id)
			break;
	}
	s->used[i] = 0;
	for (j = (i + 1) & mask; s->used[j]; j = (j + 1) & mask) {
		size_t home = rl_hash_mix(s->keys[j]) & mask;
		int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
		if (movable) {
			s->keys[i] = s->keys[j];
			s->used[i] = 1;
			s->used[j] = 0;
			i = j;
		}
	}
}

static void
seen_add(seen *s, uint64_t id)
{
	size_t i;

	if (s->cap == 0 || seen_has(s, id))
		return;
	if (s->ring == NULL) {
		s->tcap = 1;
		while (s->tcap < s->cap * 2)
			s->tcap <<= 1;
		s->ring = calloc(s->cap, 8);
		s->keys = calloc(s->tcap, 8);
		s->used = calloc(s->tcap, 1);
		if (!s->ring || !s->keys || !s->used) {
			free(s->ring); free(s->keys); free(s->used);
			s->ring = s->keys = NULL;
			s->used = NULL;
			s->cap = s->tcap = 0;   /* no memory: no dedup */
			return;
		}
	}
	if (s->n == s->cap) {
		seen_del(s, s->ring[s->head]);
		s->head = (s->head + 1) % s->cap;
		s->n--;
	}
	s->ring[(s->head + s->n) % s->cap] = id;
	s->n++;
	for (i = rl_hash_mix(id) & (s->tcap - 1); s->used[i]; i = (i + 1) & (s->tcap - 1))
		;
	s->keys[i] = id;
	s->used[i] = 1;
}

/* ---- open / close ---------------------------------------------------------------- */
/* loopback tcp:// or tls+tcp://, ipc://, inproc:// */
static int
is_local(const char *url)
{
	return rli_url_is_local(url);
}

int
rl_qclient_open(rl_qclient **out, const char *url, const rl_qclient_opts *o)
{
	rl_qclient *c;
	int nrv, rv;

	*out = NULL;
	if ((c = rl_try_calloc(1, sizeof *c, "client")) == NULL)
		return RL_ENOMEM;
	if (o)
		c->o = *o;
	else
		rl_qclient_opts_default(&c->o);
	if (c->o.max_msg == 0)
		c->o.max_msg = RL_QP_MAX_MSG;
	if (c->o.timeout_ms <= 0)
		c->o.timeout_ms = 10000;
	if (c->o.level == 0)
		c->o.level = 1;
	c->compress = c->o.compress < 0 ? !is_local(url) : c->o.compress;
	c->seen.cap = c->o.dedup ? (size_t)1 << 18 : 0;   /* ids acked here: ~6 MB once used */
	c->next_req = ((uint64_t)rl_wall() << 20) ^ (uint64_t)(uintptr_t)c;
	rl_buf_init(&c->buf);
	if ((c->url = strdup(url)) == NULL) {
		rl_error("out of memory for a client of '%s'", url);
		free(c);
		return RL_ENOMEM;
	}
	if ((rv = rl_traj_create(&c->tmp)) != 0) {
		free(c->url);
		free(c);
		return rv;
	}
	if ((nrv = nng_req0_open(&c->sock)) != 0) {
		rl_error("cannot open a client socket: %s", nng_strerror(nrv));
		rl_traj_destroy(c->tmp);
		free(c->url);
		free(c);
		return RL_ENET;
	}
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 10);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, c->o.timeout_ms);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, c->o.max_msg + 4096);
	if ((nrv = rli_redial_open(&c->rd, c->sock, url, NNG_FLAG_NONBLOCK)) != 0) {
		rl_error("cannot connect to '%s': %s", url, nng_strerror(nrv));
		if (nrv == NNG_EADDRINVAL || nrv == NNG_ENOTSUP)
			rl_hint("a broker URL looks like tcp://127.0.0.1:7400 or ipc:///tmp/q.sock");
		rl_qclient_close(c);
		return RL_ENET;
	}
	*out = c;
	return RL_OK;
}

void
rl_qclient_close(rl_qclient *c)
{
	if (c == NULL)
		return;
	if (rli_nng_close_timed(c->sock, "broker connection"))
		rli_redial_free(c->rd);   /* else its callbacks may still run: left */
	rl_traj_destroy(c->tmp);
	rl_buf_fini(&c->buf);
	free(c->seen.ring);
	free(c->seen.keys);
	free(c->seen.used);
	free(c->url);
	free(c);
}

/* ---- one request ------------------------------------------------------------------- */
static uint32_t
rnd(uint64_t *st)
{
	*st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(*st >> 33);
}

/* Sends a request and returns its reply in *rep (caller frees) with header
 * *rh.  A non-zero status in the reply is returned (its message logged,
 * except "busy" and "no such lease"); busy and timeouts are retried while
 * retry is set and opts.retry_ms lasts (-1: no bound), timeouts only while
 * the broker has answered within opts.broker_timeout_ms (qclient.h). */
static int
call(rl_qclient *c, int op, uint16_t flags, uint64_t arg, const void *fixed, size_t flen, const void *body,
     size_t blen, uint32_t raw_len, int wait_ms, int retry, rl_qhdr *rh, nng_msg **rep)
{
	uint8_t hb[RL_QP_HDR_LEN], zero[RL_QP_AUTH_HDR_LEN - RL_QP_HDR_LEN] = { 0 };
	int authed = rli_auth_key(NULL) != NULL;
	rl_qhdr h = { 0 };
	nng_msg *m = NULL, *r = NULL;
	double t_heard = rl_now();   /* the request sent, or the last reply to it (busy) */
	double t_end = !retry ? t_heard : c->o.retry_ms < 0 ? INFINITY : t_heard + c->o.retry_ms / 1000.0;
	/* silence is counted from when a reply was due: a lease waits for work first */
	double due = wait_ms > 0 ? wait_ms / 1000.0 : 0.0;
	double dead_s = c->o.broker_timeout_ms > 0 ? c->o.broker_timeout_ms / 1000.0 : INFINITY;
	int backoff = 1, nrv, rv = RL_OK, dead = 0;
	uint64_t st = c->next_req;

	*rep = NULL;
	if (c->gone) {
		/* taken for gone (logged then): a stage stopping on it waits no longer */
		rl_verbose("%s request not sent: the broker at '%s' did not answer before", rl_qop_name(op), c->url);
		return RL_ETIMEDOUT;
	}
	h.op = (uint8_t)op;
	h.flags = flags | (c->compress ? RL_QF_ACCEPT_ZSTD : 0);
	h.arg = arg;
	h.raw_len = raw_len;
	h.req_id = ++c->next_req;
	if (authed) {
		h.flags |= RL_QF_AUTH;
		h.hdr_len = RL_QP_AUTH_HDR_LEN;
	}
	rl_qhdr_encode(hb, &h);
	if (nng_msg_alloc(&m, 0) != 0 || nng_msg_reserve(m, sizeof hb + sizeof zero + flen + blen) != 0 ||
	    nng_msg_append(m, hb, sizeof hb) != 0 || (authed && nng_msg_append(m, zero, sizeof zero) != 0) ||
	    (flen && nng_msg_append(m, fixed, flen) != 0) ||
	    (blen && nng_msg_append(m, body, blen) != 0)) {
		if (m)
			nng_msg_free(m);
		rl_error("out of memory for a request of %zu bytes", flen + blen);
		return RL_ENOMEM;
	}
	for (;;) {
		nng_msg *send;
		double left = t_heard + due + dead_s - rl_now();
		/* stopping: a last ack or release waits 3 s at most for a broker that may be gone */
		double tmo = stopping(c) ? RL_MIN(c->o.timeout_ms, 3000) : c->o.timeout_ms + due * 1000.0;
		/* one attempt ends when the broker would be taken for gone: a broker
		 * that comes back within the time gets the request again from nng.
		 * The send too: with no connection, it waits for one */
		nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, (nng_duration)RL_MAX(1.0, RL_MIN(tmo, left * 1000.0)));
		/* with no connection the send waits for one: a retried request
		 * looks again every 5 s whether a TLS dialer stalled */
		nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO,
		    (nng_duration)RL_MAX(1.0, RL_MIN(retry ? RL_MIN(c->o.timeout_ms, 5000) : c->o.timeout_ms,
						     left * 1000.0)));
		if (authed)
			rl_qauth_sign(nng_msg_body(m), nng_msg_len(m), strncmp(c->url, "tls+", 4) == 0);
		if ((nrv = nng_msg_dup(&send, m)) != 0) {
			rv = RL_ENOMEM;
			break;
		}
		if ((nrv = nng_sendmsg(c->sock, send, 0)) != 0) {
			nng_msg_free(send);
		} else {
			nrv = nng_recvmsg(c->sock, &r, 0);
		}
		if (nrv == 0) {
			rl_qhdr rh0;
			if (rl_qhdr_decode(&rh0, nng_msg_body(r), nng_msg_len(r)) != 0 ||
			    rh0.op != (op | RL_QOP_REPLY) || rh0.req_id != h.req_id) {
				rl_error("malformed reply from the broker to a %s request", rl_qop_name(op));
				rv = RL_EFORMAT;
				break;
			}
			*rh = rh0;
			t_heard = rl_now();   /* busy is an answer: the broker is there */
			if (rh0.status == RL_EBUSY && retry && t_heard < t_end && !stopping(c)) {
				nng_msg_free(r);
				r = NULL;
				nng_msleep((nng_duration)(backoff + rnd(&st) % (backoff + 1)));
				backoff = backoff < 128 ? backoff * 2 : 250;
				continue;
			}
			if (rh0.status != 0) {
				size_t n = nng_msg_len(r) - rh0.hdr_len;
				rv = rh0.status < RL_ERR_COUNT ? rh0.status : RL_EIO;
				if (rv != RL_EBUSY && rv != RL_ENOENT)
					(c->quiet ? rl_verbose : rl_error)("broker: %.*s", (int)RL_MIN(n, (size_t)300),
					    (const char *)nng_msg_body(r) + rh0.hdr_len);
				if (rv == RL_ENOENT)
					break;   /* keep the reply: an ack's counts */
				nng_msg_free(r);
				r = NULL;
				break;
			}
			break;
		}
		/* 1 ms of slack: a receive timer that fired a hair early */
		dead = rl_now() >= t_heard + due + dead_s - 0.001;
		if (retry && !dead && nrv != NNG_ECLOSED && nrv != NNG_ENOMEM && rl_now() < t_end && !stopping(c)) {
			/* timed out, connection reset or refused: the broker may be
			 * restarting; requests are idempotent, so send it again */
			rl_verbose("%s request: %s; retrying", rl_qop_name(op), nng_strerror(nrv));
			rli_redial_check(c->rd);
			if (nrv != NNG_ETIMEDOUT) {
				nng_msleep((nng_duration)(backoff + rnd(&st) % (backoff + 1)));
				backoff = backoff < 128 ? backoff * 2 : 250;
			}
			continue;
		}
		if (dead && !stopping(c) && nrv != NNG_ECLOSED && nrv != NNG_ENOMEM) {
			c->gone = 1;
			(c->quiet ? rl_verbose : rl_error)("no reply from the broker at '%s' for %.1f s (a %s request): "
			    "taken for gone", c->url, rl_now() - t_heard, rl_qop_name(op));
			if (!c->quiet)
				rl_hint("start it again (rl-queue serve with the same --data-dir recovers its journal) or "
				    "allow it longer with --broker-timeout S (0: wait for ever)");
			rv = RL_ETIMEDOUT;
		} else if (nrv == NNG_ETIMEDOUT) {
			(c->quiet ? rl_verbose : rl_error)("no reply from the broker at '%s' to a %s request", c->url,
			    rl_qop_name(op));
			if (!c->quiet)
				rl_hint("is 'rl-queue serve' running at that address?");
			rv = RL_ETIMEDOUT;
		} else {
			(c->quiet ? rl_verbose : rl_error)("%s request to '%s' failed: %s", rl_qop_name(op), c->url,
			    nng_strerror(nrv));
			rv = nrv == NNG_ECLOSED ? RL_ECLOSED : RL_ENET;
		}
		break;
	}
	nng_msg_free(m);
	*rep = r;
	return rv;
}

/* ---- puts ------------------------------------------------------------------------------ */
int
rl_qclient_put_raw(rl_qclient *c, int stage, const void *p, size_t n, int frame, rl_qput_result *res)
{
	rl_qhdr rh;
	nng_msg *r = NULL;
	uint32_t raw = (uint32_t)n;
	const void *body = p;
	size_t blen = n;
	uint16_t flags = 0;
	int rv;

	memset(res, 0, sizeof *res);
	if (stage < 0 || stage >= RL_QSTAGE_COUNT)
		return RL_EINVAL;
	if (frame) {
		unsigned long long csz = ZSTD_getFrameContentSize(p, n);
		if (csz == ZSTD_CONTENTSIZE_ERROR || csz == ZSTD_CONTENTSIZE_UNKNOWN || csz > c->o.max_msg) {
			rl_error("put: not a zstd frame with a known size within the limit");
			return RL_EFORMAT;
		}
		raw = (uint32_t)csz;
		flags = RL_QF_ZSTD;
	} else if (n > c->o.max_msg) {
		rl_error("put: a batch of %zu bytes is over the message limit of %zu", n, c->o.max_msg);
		return RL_ETOOBIG;
	} else if (c->compress) {
		c->buf.len = 0;
		if ((rv = rl_qzstd_compress(&c->buf, p, n, c->o.level)) != 0)
			return rv;
		body = c->buf.p;
		blen = c->buf.len;
		flags = RL_QF_ZSTD;
	}
	rv = call(c, RL_QOP_PUT, flags, (uint64_t)stage, NULL, 0, body, blen, raw, 0, 1, &rh, &r);
	if (rv == 0) {
		if (nng_msg_len(r) - rh.hdr_len < RL_QPUT_RESULT_LEN)
			rv = RL_EFORMAT;
		else
			rl_qput_result_decode(res, (const uint8_t *)nng_msg_body(r) + rh.hdr_len);
	}
	if (r)
		nng_msg_free(r);
	return rv;
}

int
rl_qclient_put(rl_qclient *c, int stage, rl_traj_batch *b, rl_qput_result *res)
{
	const void *p;
	size_t n;
	int rv;

	/* the frame as it came (no recompression) when its header says its size;
	 * zstd streams written without one (zstd -c from a pipe) are compressed
	 * again from the decoded payload */
	if (c->compress && rl_traj_batch_frame(b, &p, &n) == 0) {
		unsigned long long csz = ZSTD_getFrameContentSize(p, n);
		if (csz != ZSTD_CONTENTSIZE_ERROR && csz != ZSTD_CONTENTSIZE_UNKNOWN)
			return rl_qclient_put_raw(c, stage, p, n, 1, res);
	}
	if ((rv = rl_traj_batch_payload(b, &p, &n)) != 0)
		return rv;
	return rl_qclient_put_raw(c, stage, p, n, 0, res);
}

int rl_qclient_put_prompts(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res) { return rl_qclient_put(c, RL_QSTAGE_PROMPT, b, res); }
int rl_qclient_put_generated(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res) { return rl_qclient_put(c, RL_QSTAGE_GENERATED, b, res); }
int rl_qclient_put_scored(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res) { return rl_qclient_put(c, RL_QSTAGE_SCORED, b, res); }

/* ---- leases ---------------------------------------------------------------------------- */
void
rl_qlease_init(rl_qlease *l)
{
	memset(l, 0, sizeof *l);
}

void
rl_qlease_fini(rl_qlease *l)
{
	if (l == NULL)
		return;
	rl_traj_batch_destroy(l->batch);
	memset(l, 0, sizeof *l);
}

/* Loads a raw batch payload into b (records copied). */
static int
load_raw(rl_traj_batch *b, const uint8_t *p, size_t n)
{
	size_t off, hlen, cnt;
	int rv;

	rl_traj_batch_clear(b);
	if (n < RL_TRAJ_HEADER_LEN || memcmp(p, RL_TRAJ_MAGIC, 4) != 0)
		goto bad;
	hlen = rl_le16_get(p + 6);
	cnt = rl_le32_get(p + 8);
	if (hlen < RL_TRAJ_HEADER_LEN || hlen > n)
		goto bad;
	off = hlen;
	for (size_t i = 0; i < cnt; i++) {
		uint32_t len;
		if (n - off < 8 || (len = rl_le32_get(p + off)) > n - off || len < 8)
			goto bad;
		if ((rv = rl_traj_batch_add_raw(b, p + off, len, NULL)) != 0)
			return rv;
		off += len;
	}
	if (off != n)
		goto bad;
	return RL_OK;
bad:
	rl_error("malformed record batch in a lease reply");
	return RL_EFORMAT;
}

static int
record_id(rl_qclient *c, rl_traj_batch *b, size_t i, uint64_t *id)
{
	int rv;

	if ((rv = rl_traj_batch_get(b, i, c->tmp)) != 0)
		return rv;
	return rl_traj_get_u64(c->tmp, RL_TAG_ID, id);
}

/* Drops records this client already acknowledged; acks them again. */
static int
dedup(rl_qclient *c, rl_qlease *l)
{
	size_t n = rl_traj_batch_count(l->batch), ndup = 0;
	uint64_t *dups = NULL, id;
	rl_traj_batch *keep = NULL;
	rl_qack_result ar;
	int rv = RL_OK;

	if (c->seen.n == 0)
		return RL_OK;
	for (size_t i = 0; i < n; i++)
		if (record_id(c, l->batch, i, &id) == 0 && seen_has(&c->seen, id))
			ndup++;
	if (ndup == 0)
		return RL_OK;
	if ((dups = rl_try_malloc(ndup * 8, "dedup")) == NULL || (rv = rl_traj_batch_create(&keep)) != 0) {
		rv = rv ? rv : RL_ENOMEM;
		goto out;
	}
	ndup = 0;
	for (size_t i = 0; i < n; i++) {
		const void *rec;
		size_t len;
		if (record_id(c, l->batch, i, &id) == 0 && seen_has(&c->seen, id)) {
			dups[ndup++] = id;
			continue;
		}
		if ((rv = rl_traj_batch_raw(l->batch, i, &rec, &len)) != 0 ||
		    (rv = rl_traj_batch_add_raw(keep, rec, len, NULL)) != 0)
			goto out;
	}
	rl_verbose("dropping %zu redelivered records", ndup);
	rv = rl_qclient_ack_ids(c, l->id, RL_QACK_DONE, dups, (uint32_t)ndup, &ar);
	if (rv == RL_ENOENT)
		rv = RL_OK;
	rl_traj_batch_destroy(l->batch);
	l->batch = keep;
	keep = NULL;
	l->dropped = (uint32_t)ndup;
out:
	rl_traj_batch_destroy(keep);
	free(dups);
	return rv;
}

int
rl_qclient_lease(rl_qclient *c, const rl_qlease_req *req, rl_qlease *l)
{
	uint8_t fb[RL_QLEASE_REQ_LEN];
	rl_qlease_info info;
	rl_qhdr rh;
	nng_msg *r = NULL;
	const uint8_t *p;
	size_t n;
	int rv;

	if (req->ack_lease && req->ack_lease == l->id && c->o.dedup && l->batch) {
		uint64_t id;
		for (size_t i = 0; i < rl_traj_batch_count(l->batch); i++)
			if (record_id(c, l->batch, i, &id) == 0)
				seen_add(&c->seen, id);
	}
	l->id = 0;
	l->dropped = 0;
	l->stage = (int)req->stage;
	if (l->batch == NULL && (rv = rl_traj_batch_create(&l->batch)) != 0)
		return rv;
	rl_traj_batch_clear(l->batch);
	rl_qlease_req_encode(fb, req);
	if ((rv = call(c, RL_QOP_LEASE, 0, 0, fb, sizeof fb, NULL, 0, 0, (int)req->wait_ms, 1, &rh, &r)) != 0)
		goto out;
	p = (const uint8_t *)nng_msg_body(r) + rh.hdr_len;
	n = nng_msg_len(r) - rh.hdr_len;
	if (n < RL_QLEASE_INFO_LEN) {
		rl_error("short lease reply from the broker");
		rv = RL_EFORMAT;
		goto out;
	}
	rl_qlease_info_decode(&info, p);
	p += RL_QLEASE_INFO_LEN;
	n -= RL_QLEASE_INFO_LEN;
	l->id = info.lease_id;
	l->deadline_ms = info.deadline_ms;
	l->version = info.version;
	l->aborts = info.aborts;
	if (info.n == 0)
		goto out;
	if (rh.flags & RL_QF_ZSTD) {
		rl_traj_limits lim;
		rl_traj_limits_default(&lim);
		lim.max_frame = c->o.max_msg;
		if (ZSTD_getFrameContentSize(p, n) != rh.raw_len) {
			rl_error("lease reply: frame size does not match its header");
			rv = RL_EFORMAT;
			goto out;
		}
		rv = rl_traj_batch_decode(l->batch, NULL, p, n, &lim, "lease reply");
	} else {
		rv = load_raw(l->batch, p, n);
	}
	if (rv == 0 && rl_traj_batch_count(l->batch) != info.n) {
		rl_error("lease reply holds %zu records, its header says %u", rl_traj_batch_count(l->batch), info.n);
		rv = RL_EFORMAT;
	}
	if (rv == 0 && c->o.dedup)
		rv = dedup(c, l);
out:
	if (r)
		nng_msg_free(r);
	return rv;
}

int
rl_qclient_ack_lease(rl_qclient *c, rl_qlease *l, const rl_qlease_req *req)
{
	rl_qlease_req r = *req;

	r.ack_lease = l->id;
	return rl_qclient_lease(c, &r, l);
}

int
rl_qclient_lease_prompts(rl_qclient *c, uint32_t max, uint32_t group_size, uint32_t wait_ms, rl_qlease *l)
{
	rl_qlease_req q = { .stage = RL_QSTAGE_PROMPT, .max_records = max, .wait_ms = wait_ms, .group_hint = group_size };
	return rl_qclient_lease(c, &q, l);
}

int
rl_qclient_lease_generated(rl_qclient *c, uint32_t max, uint32_t wait_ms, rl_qlease *l)
{
	rl_qlease_req q = { .stage = RL_QSTAGE_GENERATED, .max_records = max, .wait_ms = wait_ms };
	return rl_qclient_lease(c, &q, l);
}

int
rl_qclient_lease_scored(rl_qclient *c, uint32_t max, uint32_t min, uint32_t wait_ms, rl_qlease *l)
{
	rl_qlease_req q = { .stage = RL_QSTAGE_SCORED, .max_records = max, .wait_ms = wait_ms, .min_records = min };
	return rl_qclient_lease(c, &q, l);
}

/* ---- acks, version, stats ---------------------------------------------------------------- */
int
rl_qclient_ack_ids(rl_qclient *c, uint64_t lease_id, int kind, const uint64_t *ids, uint32_t n,
                   rl_qack_result *res)
{
	rl_qack_req a = { .lease_id = lease_id, .kind = (uint32_t)kind, .n = n };
	uint8_t fb[RL_QACK_REQ_LEN];
	rl_qhdr rh;
	nng_msg *r = NULL;
	uint8_t *body = NULL;
	int rv;

	memset(res, 0, sizeof *res);
	rl_qack_req_encode(fb, &a);
	if (n && (body = rl_try_malloc((size_t)n * 8, "ack")) == NULL)
		return RL_ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		rl_le64_put(body + 8 * i, ids[i]);
	rv = call(c, RL_QOP_ACK, 0, 0, fb, sizeof fb, body, (size_t)n * 8, (uint32_t)n * 8, 0, 1, &rh, &r);
	/* acknowledged done here: a redelivery of these ids is dropped */
	if (kind == RL_QACK_DONE && c->o.dedup && (rv == 0 || rv == RL_ENOENT))
		for (uint32_t i = 0; i < n; i++)
			seen_add(&c->seen, ids[i]);
	if (r && nng_msg_len(r) - rh.hdr_len >= RL_QACK_RESULT_LEN)
		rl_qack_result_decode(res, (const uint8_t *)nng_msg_body(r) + rh.hdr_len);
	if (r)
		nng_msg_free(r);
	free(body);
	return rv;
}

static int
ack_lease(rl_qclient *c, const rl_qlease *l, int kind, rl_qack_result *res)
{
	int rv;

	if (l->id == 0) {
		memset(res, 0, sizeof *res);
		return RL_OK;
	}
	rv = rl_qclient_ack_ids(c, l->id, kind, NULL, 0, res);
	if (kind == RL_QACK_DONE && c->o.dedup && l->batch && (rv == 0 || rv == RL_ENOENT)) {
		uint64_t id;
		for (size_t i = 0; i < rl_traj_batch_count(l->batch); i++)
			if (record_id(c, l->batch, i, &id) == 0)
				seen_add(&c->seen, id);
	}
	return rv;
}

int rl_qclient_ack(rl_qclient *c, const rl_qlease *l, rl_qack_result *res) { return ack_lease(c, l, RL_QACK_DONE, res); }
int rl_qclient_release(rl_qclient *c, const rl_qlease *l, rl_qack_result *res) { return ack_lease(c, l, RL_QACK_RELEASE, res); }
int rl_qclient_extend(rl_qclient *c, const rl_qlease *l, rl_qack_result *res) { return ack_lease(c, l, RL_QACK_EXTEND, res); }

static int
version_call(rl_qclient *c, uint16_t flags, uint64_t v, uint64_t *now)
{
	rl_qhdr rh;
	nng_msg *r = NULL;
	int rv = call(c, RL_QOP_VERSION, flags, v, NULL, 0, NULL, 0, 0, 0, 1, &rh, &r);

	if (rv == 0 && now)
		*now = rh.arg;
	if (r)
		nng_msg_free(r);
	return rv;
}

int
rl_qclient_set_version(rl_qclient *c, uint64_t v, uint64_t *now)
{
	return version_call(c, 0, v, now);
}

int
rl_qclient_rewind_version(rl_qclient *c, uint64_t v, uint64_t *now)
{
	return version_call(c, RL_QF_REWIND, v, now);
}

int
rl_qclient_stats(rl_qclient *c, char **json)
{
	rl_qhdr rh;
	nng_msg *r = NULL;
	rl_buf b;
	int rv = call(c, RL_QOP_STAT, 0, 0, NULL, 0, NULL, 0, 0, 0, 1, &rh, &r);

	*json = NULL;
	if (rv != 0)
		goto out;
	rl_buf_init(&b);
	rv = rl_qbody_get(&b, &rh, (const uint8_t *)nng_msg_body(r) + rh.hdr_len, nng_msg_len(r) - rh.hdr_len,
	    c->o.max_msg);
	if (rv == 0)
		rv = rl_buf_putc(&b, 0);
	if (rv == 0)
		*json = (char *)rl_buf_steal(&b, NULL);
	rl_buf_fini(&b);
out:
	if (r)
		nng_msg_free(r);
	return rv;
}

int
rl_qclient_ping(rl_qclient *c)
{
	rl_qhdr rh;
	nng_msg *r = NULL;
	int rv = call(c, RL_QOP_PING, 0, 0, NULL, 0, NULL, 0, 0, 0, 1, &rh, &r);

	if (r)
		nng_msg_free(r);
	return rv;
}

int
rl_qclient_report(rl_qclient *c, const char *json, size_t n)
{
	rl_qhdr rh;
	nng_msg *r = NULL;
	int rv, q = c->quiet;

	if (n > RL_QP_MAX_REPORT)
		return RL_ETOOBIG;
	c->quiet = 1;
	rv = call(c, RL_QOP_REPORT, 0, 0, NULL, 0, json, n, (uint32_t)n, 0, 0, &rh, &r);
	c->quiet = q;
	if (r)
		nng_msg_free(r);
	return rv;
}

/*
 * server.c — the rl-sync service: versions held in memory (and persisted
 * to a version directory), answered over nng REQ/REP with contexts and
 * long-polls, a bulk stream of raw chunks on a second socket (plain, or
 * TLS on OpenSSL next to a tls+tcp:// URL), and memfds
 * for clients on the same host (wshm.c).
 *
 * Leaves out: the client (client.c), the chunk codec (codec.c), the wire
 * helpers both sides use (wire.c).
 */
#include "base/nngx.h"
#include "sync/wsync.h"
#include "sync/wsync_int.h"
#include "sync/wdir.h"
#include "sync/wshm.h"
#include "base/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/mman.h>

/* test hooks, set from the environment at open */
static atomic_int test_slow_ms, test_corrupt_shm, test_slow_commit_ms;

/* ---- server ---------------------------------------------------------------------- */
typedef struct enc {
	uint8_t *p;
	size_t n;
	uint32_t flags;
} enc;

/* a version as the server holds it; refcounted under the server mutex */
typedef struct sver {
	rl_wver *v;
	uint32_t chunk;
	size_t nchunks;
	cref *ch;
	enc *full, *delta;        /* per chunk, p NULL until made */
	uint64_t delta_base;      /* what `delta` is against; 0 none */
	struct sver *base;        /* push staging / lazy delta: the base version (ref held) */
	uint8_t *got;             /* staging: chunk received */
	size_t ngot;
	int refs;
	int shm_fd;               /* sealed memfd holding the version (wshm.h), -1 none */
	int writers;              /* staging: PUSH_CHUNKs decoding into v now */
	int taken;                /* staging: v's bytes came as the client's memfd (shm_take):
	                           * v is a read-only mapping, no chunk may be written */
	int rewind;               /* staging: a resumed trainer's push (PUSH_REWIND) */
} sver;

/* a version pushed in parts (docs/sync.md): each part staged on its own,
 * the version assembled and published when the last one is committed */
typedef struct pstage {
	uint64_t version;
	int count, ndone, rewind;
	sver **part;              /* (count) a part's staging; NULL until its PUSH_BEGIN */
	uint8_t *done;            /* (count) committed: every chunk in and verified */
	double deadline;          /* aborted if a part is still missing then */
} pstage;

enum { SC_RECV, SC_WORK, SC_SEND, SC_PARKED };
typedef struct sctx {
	struct rl_wsync_server *s;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
	nng_msg *req;
	uint64_t wait_have;
	uint64_t wait_lin;        /* WAIT_LINEAGE | the client's lineage, or 0 (an older client) */
	double deadline;
	struct sctx *next;        /* work queue / parked list */
} sctx;

struct rl_wsync_server {
	nng_socket sock;
	rl_wsync_server_opts o;
	char *data_dir;
	char url[320];            /* listened on; a tcp:// port 0 replaced by the one chosen */
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* work queue */
	pthread_cond_t tcv;       /* timer: new version or close */
	sver *latest, *prev, *stage;
	pstage *parts;            /* a version coming in parts, or NULL */
	uint64_t n_parts_aborted, n_parts_refused, n_parted;
	uint64_t lineage;         /* the line the versions held belong to (rewinds so far) */
	uint64_t warned_lin;      /* 1 + the lineage an older client was warned about */
	uint64_t committing;      /* a PUSH_COMMIT of this version is saving/installing it */
	sctx *ctxs;
	int nctx;
	sctx *qhead, *qtail, *parked;
	pthread_t *workers, timer;
	int nworkers, timer_started;
	int closing;
	uint64_t n_req, n_chunks, bytes_out, n_bad_push, n_bad_req, n_bulk_chunks;
	/* bulk stream (bfd < 0: none): whole raw chunks written from the held version */
	int bfd;
	pthread_t bth;
	char bulk_url[320];
	rli_tls_ctx *btls;        /* tls+tcp://: each bulk connection is TLS with this, else NULL */
	struct bconn *bconns;     /* connections, finished ones until reaped */
	int nbconn;
	rl_wshm_srv *shm;         /* hands out the versions' memfds on this host; NULL none */
	char hostid[24];
};

static void
sver_unref_locked(sver *x)
{
	if (x == NULL || --x->refs > 0)
		return;
	for (size_t i = 0; x->full && i < x->nchunks; i++)
		free(x->full[i].p);
	for (size_t i = 0; x->delta && i < x->nchunks; i++)
		free(x->delta[i].p);
	free(x->full);
	free(x->delta);
	free(x->ch);
	free(x->got);
	if (x->shm_fd >= 0)
		close(x->shm_fd);
	sver_unref_locked(x->base);
	rl_wver_destroy(x->v);
	free(x);
}

static void
sver_unref(rl_wsync_server *s, sver *x)
{
	pthread_mutex_lock(&s->mu);
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
}

static void
pstage_free_locked(pstage *p)
{
	if (p == NULL)
		return;
	for (int i = 0; i < p->count; i++)
		sver_unref_locked(p->part[i]);
	free(p->part);
	free(p->done);
	free(p);
}

/* sver_make takes v (hashed) on success */
static int
sver_make(sver **out, rl_wver *v, uint32_t chunk)
{
	sver *x;
	int rv;

	if ((x = rl_try_calloc(1, sizeof *x, "version")) == NULL)
		return RL_ENOMEM;
	x->chunk = chunk;
	if ((rv = rli_ws_chunk_table(&x->ch, &x->nchunks, v, chunk)) != 0)
		goto fail;
	rv = RL_ENOMEM;
	if ((x->full = rl_try_calloc(x->nchunks + 1, sizeof(enc), "chunk table")) == NULL ||
	    (x->delta = rl_try_calloc(x->nchunks + 1, sizeof(enc), "chunk table")) == NULL)
		goto fail;
	x->v = v;
	v->chunk = chunk; /* persisted with the version: a restart keeps the chunk indices */
	x->refs = 1;
	x->shm_fd = -1;
	*out = x;
	return RL_OK;
fail:
	free(x->ch);
	free(x->full);
	free(x);
	return rv;
}

static nng_msg *
reply_new(uint16_t op, int status, uint64_t version, uint64_t a, uint64_t b, const void *body, size_t n)
{
	nng_msg *m;
	uint8_t h[WS_HDR];

	if (nng_msg_alloc(&m, 0) != 0)
		return NULL;
	rli_ws_hdr_fill(h, op | OP_REPLY, status, version, a, b);
	if (nng_msg_append(m, h, WS_HDR) != 0 || (n && nng_msg_append(m, body, n) != 0)) {
		nng_msg_free(m);
		return NULL;
	}
	return m;
}

static nng_msg *
reply_err(uint16_t op, int status, uint64_t version, const char *fmt, ...) RL_PRINTF(4, 5);
static nng_msg *
reply_err(uint16_t op, int status, uint64_t version, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	rl_verbose("request refused: %s", buf);
	return reply_new(op, status, version, 0, 0, buf, strlen(buf));
}

static uint64_t ver_of(const sver *x) { return x ? x->v->version : 0; }

static nng_msg *
do_status(rl_wsync_server *s)
{
	cJSON *j = cJSON_CreateObject(), *arr;
	sver *vs[2];
	char *txt;
	nng_msg *m;

	pthread_mutex_lock(&s->mu);
	vs[0] = s->latest;
	vs[1] = s->prev;
	cJSON_AddNumberToObject(j, "latest", (double)ver_of(s->latest));
	cJSON_AddNumberToObject(j, "previous", (double)ver_of(s->prev));
	cJSON_AddNumberToObject(j, "lineage", (double)s->lineage);
	arr = cJSON_AddArrayToObject(j, "versions");
	for (int i = 0; i < 2; i++) {
		cJSON *o;
		char hx[20];
		if (vs[i] == NULL)
			continue;
		o = cJSON_CreateObject();
		snprintf(hx, sizeof hx, "%016llx", (unsigned long long)vs[i]->v->hash);
		cJSON_AddNumberToObject(o, "version", (double)vs[i]->v->version);
		cJSON_AddStringToObject(o, "hash", hx);
		cJSON_AddNumberToObject(o, "bytes", (double)rl_wver_total(vs[i]->v));
		cJSON_AddNumberToObject(o, "blobs", vs[i]->v->nblobs);
		cJSON_AddNumberToObject(o, "chunks", (double)vs[i]->nchunks);
		cJSON_AddNumberToObject(o, "delta_base", (double)vs[i]->delta_base);
		cJSON_AddItemToArray(arr, o);
	}
	if (s->stage)
		cJSON_AddNumberToObject(j, "pushing", (double)s->stage->v->version);
	else
		cJSON_AddNullToObject(j, "pushing");
	if (s->parts) {
		cJSON *o = cJSON_AddObjectToObject(j, "parts");
		cJSON_AddNumberToObject(o, "version", (double)s->parts->version);
		cJSON_AddNumberToObject(o, "count", s->parts->count);
		cJSON_AddNumberToObject(o, "in", s->parts->ndone);
		cJSON_AddNumberToObject(o, "abort_in_s", s->parts->deadline - rl_now());
	} else {
		cJSON_AddNullToObject(j, "parts");
	}
	cJSON_AddNumberToObject(j, "versions_from_parts", (double)s->n_parted);
	cJSON_AddNumberToObject(j, "parts_refused", (double)s->n_parts_refused);
	cJSON_AddNumberToObject(j, "part_versions_aborted", (double)s->n_parts_aborted);
	cJSON_AddStringToObject(j, "data_dir", s->data_dir ? s->data_dir : "");
	cJSON_AddNumberToObject(j, "requests", (double)s->n_req);
	cJSON_AddNumberToObject(j, "chunks_served", (double)s->n_chunks);
	cJSON_AddNumberToObject(j, "bulk_chunks_served", (double)s->n_bulk_chunks);
	cJSON_AddStringToObject(j, "bulk", s->bfd >= 0 ? s->bulk_url : "");
	cJSON_AddStringToObject(j, "shm", s->shm ? rl_wshm_srv_name(s->shm) : "");
	cJSON_AddNumberToObject(j, "shm_served", s->shm ? (double)rl_wshm_srv_served(s->shm) : 0);
	cJSON_AddNumberToObject(j, "shm_pushes", s->shm ? (double)rl_wshm_srv_taken(s->shm) : 0);
	cJSON_AddNumberToObject(j, "bytes_served", (double)s->bytes_out);
	cJSON_AddNumberToObject(j, "push_chunks_rejected", (double)s->n_bad_push);
	cJSON_AddNumberToObject(j, "bad_requests", (double)s->n_bad_req);
	pthread_mutex_unlock(&s->mu);
	txt = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	m = txt ? reply_new(OP_STATUS, RL_OK, 0, 0, 0, txt, strlen(txt)) : NULL;
	free(txt);
	return m;
}

/* find a held version (ref taken) */
static sver *
sver_get(rl_wsync_server *s, uint64_t version)
{
	sver *x = NULL;

	pthread_mutex_lock(&s->mu);
	if (version == 0 || (s->latest && s->latest->v->version == version))
		x = s->latest;
	else if (s->prev && s->prev->v->version == version)
		x = s->prev;
	if (x)
		x->refs++;
	pthread_mutex_unlock(&s->mu);
	return x;
}

static nng_msg *
do_manifest(rl_wsync_server *s, const whdr *h)
{
	sver *x = sver_get(s, h->version);
	uint8_t *p = NULL;
	size_t n;
	nng_msg *m;
	uint64_t db, lin;

	if (x == NULL)
		return reply_err(OP_MANIFEST, RL_ENOENT, h->version, h->version ? "version %llu is not held (latest is %llu)" :
				 "no version published yet%.0llu", (unsigned long long)h->version,
				 (unsigned long long)rl_wsync_server_latest(s));
	/* a delta is offered when it was pushed as one or can be made from a held base */
	pthread_mutex_lock(&s->mu);
	db = x->delta_base;
	if (db == 0 && x->base)
		db = x->base->v->version;
	lin = x->v->lineage;
	pthread_mutex_unlock(&s->mu);
	if (rli_ws_manifest_encode(&p, &n, x->v, x->chunk, db) != 0)
		m = reply_err(OP_MANIFEST, RL_ENOMEM, h->version, "out of memory");
	else
		m = reply_new(OP_MANIFEST, RL_OK, x->v->version, lin, 0, p, n);
	free(p);
	sver_unref(s, x);
	return m;
}

/* the encoding of chunk i, made on first use */
static int
chunk_enc(rl_wsync_server *s, sver *x, size_t i, int delta, enc *out)
{
	enc *slot = delta ? &x->delta[i] : &x->full[i];
	const cref *c = &x->ch[i];
	const rl_wblob *b = &x->v->blobs[c->blob];
	sver *bx = NULL;
	enc e;
	int rv;

	pthread_mutex_lock(&s->mu);
	*out = *slot;
	if (out->p == NULL && delta && (bx = x->base) != NULL)
		bx->refs++;
	pthread_mutex_unlock(&s->mu);
	if (out->p)
		return RL_OK;
	if (delta && bx == NULL)
		return RL_ENOENT;
	rv = rl_wsync_encode(&e.p, &e.n, &e.flags, b->data + c->off, bx ? bx->v->blobs[c->blob].data + c->off : NULL,
			     c->len, b->elem, s->o.level);
	pthread_mutex_lock(&s->mu);
	sver_unref_locked(bx);
	if (rv == 0) {
		if (slot->p == NULL)
			*slot = e;
		else
			free(e.p);
		*out = *slot;
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

static nng_msg *
do_chunk(rl_wsync_server *s, const whdr *h)
{
	sver *x = sver_get(s, h->version);
	nng_msg *m = NULL;
	uint8_t cb[CB_HDR];
	int delta = 0, rv, stored = (int)(h->b >> 63);
	uint64_t want_base = h->b & ~CHUNK_STORED;
	enc e;

	if (x == NULL || h->version == 0)
		m = reply_err(OP_CHUNK, RL_ENOENT, h->version, "version %llu is not held (latest is %llu)",
			      (unsigned long long)h->version, (unsigned long long)rl_wsync_server_latest(s));
	else if (h->a >= x->nchunks)
		m = reply_err(OP_CHUNK, RL_EINVAL, h->version, "chunk %llu out of range (version has %zu)",
			      (unsigned long long)h->a, x->nchunks);
	if (m)
		goto out;
	pthread_mutex_lock(&s->mu);
	if (want_base != 0 && (want_base == x->delta_base || (x->base && want_base == x->base->v->version)))
		delta = 1;
	pthread_mutex_unlock(&s->mu);
	if (stored && !delta) {
		/* the raw bytes as one stored segment: no codec work either side */
		const cref *c = &x->ch[h->a];
		uint8_t sh[SEG_HDR] = { 0 };
		put32(cb, 0);
		put32(cb + 4, 1);
		put64(cb + 8, c->len);
		put32(sh, (uint32_t)c->len);
		if ((m = reply_new(OP_CHUNK, RL_OK, h->version, h->a, 0, cb, CB_HDR)) == NULL ||
		    nng_msg_append(m, sh, SEG_HDR) != 0 ||
		    nng_msg_append(m, x->v->blobs[c->blob].data + c->off, c->len) != 0) {
			if (m)
				nng_msg_free(m);
			m = NULL;
			goto out;
		}
		e.n = c->len + SEG_HDR;
		goto sent;
	}
	rv = chunk_enc(s, x, (size_t)h->a, delta, &e);
	if (rv == RL_ENOENT && delta) {
		delta = 0;
		rv = chunk_enc(s, x, (size_t)h->a, 0, &e);
	}
	if (rv != 0) {
		m = reply_err(OP_CHUNK, rv, h->version, "cannot encode chunk %llu: %s", (unsigned long long)h->a,
			      rl_strerror(rv));
		goto out;
	}
	put32(cb, e.flags);
	put32(cb + 4, (uint32_t)x->v->blobs[x->ch[h->a].blob].elem);
	put64(cb + 8, x->ch[h->a].len);
	if ((m = reply_new(OP_CHUNK, RL_OK, h->version, h->a, delta ? want_base : 0, cb, CB_HDR)) == NULL ||
	    nng_msg_append(m, e.p, e.n) != 0) {
		if (m)
			nng_msg_free(m);
		m = NULL;
		goto out;
	}
sent:
	if (atomic_load(&rli_ws_test_corrupt) > 0 && atomic_fetch_sub(&rli_ws_test_corrupt, 1) > 0 && e.n > SEG_HDR) {
		/* a byte of the first segment's payload (the data, when stored) */
		uint8_t *body = (uint8_t *)nng_msg_body(m) + WS_HDR + CB_HDR;
		size_t zn = get32(body);
		body[SEG_HDR + (zn ? zn / 2 : 0)] ^= 0x5a;
		rl_warn("test hook: corrupted chunk %llu of version %llu", (unsigned long long)h->a,
			(unsigned long long)h->version);
	}
	if (atomic_load(&test_slow_ms) > 0)
		usleep((useconds_t)atomic_load(&test_slow_ms) * 1000);
	pthread_mutex_lock(&s->mu);
	s->n_chunks++;
	s->bytes_out += e.n + CB_HDR;
	pthread_mutex_unlock(&s->mu);
out:
	if (x)
		sver_unref(s, x);
	return m;
}

/* The delta base of a part: the latest version's blobs of the part's names
 * (borrowed: the ref held on the latest keeps them), numbered like the
 * latest; the pusher's base (its previous part) must hash the same. */
static int
part_base_locked(rl_wsync_server *s, const rl_wver *v, uint64_t base, uint64_t hash, sver **out)
{
	rl_wver *bv = NULL;
	sver *bx = NULL;
	int rv;

	if (s->latest == NULL || s->latest->v->version != base)
		return RL_ENOENT;
	if ((rv = rl_wver_create(&bv, base)) != 0)
		return rv;
	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *lb = rl_wver_find(s->latest->v, v->blobs[i].name);
		size_t np;
		rl_wblob *nb;
		if (lb == NULL || lb->size != v->blobs[i].size) {
			rv = RL_ENOENT;
			goto fail;
		}
		if ((rv = rl_wver_add_blob(bv, lb->name, lb->data, lb->size, lb->elem, 0)) != 0)
			goto fail;
		nb = &bv->blobs[bv->nblobs - 1];
		np = rli_wver_npieces(lb->size);
		if ((nb->pieces = rl_try_malloc((np ? np : 1) * sizeof(uint64_t), "piece hashes")) == NULL) {
			rv = RL_ENOMEM;
			goto fail;
		}
		memcpy(nb->pieces, lb->pieces, np * sizeof(uint64_t));
		nb->hash = lb->hash;
	}
	bv->hash = rli_wver_version_hash(bv);
	if (bv->hash != hash) {
		rv = RL_ENOENT;
		goto fail;
	}
	if ((rv = sver_make(&bx, bv, s->latest->chunk)) != 0)
		goto fail;
	bx->base = s->latest;
	s->latest->refs++;
	*out = bx;
	return RL_OK;
fail:
	rl_wver_destroy(bv);
	return rv;
}

/* PUSH_BEGIN of a part: x (staged, its delta base already looked up) joins
 * the version in parts, which it starts when none is coming in.  NULL: taken;
 * else the refusal (x not taken). */
static nng_msg *
part_begin_locked(rl_wsync_server *s, const whdr *h, sver *x, int idx, int cnt)
{
	pstage *p = s->parts;
	sver *old;

	if (p && p->version != h->version) {
		s->n_parts_refused++;
		return reply_err(OP_PUSH_BEGIN, RL_EBUSY, h->version, "part %d of version %llu refused: version %llu is "
				 "being assembled from parts (%d of %d in) until it is published or aborted (in %.0f s)",
				 idx, (unsigned long long)h->version, (unsigned long long)p->version, p->ndone, p->count,
				 p->deadline - rl_now());
	}
	if (p && p->count != cnt) {
		s->n_parts_refused++;
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "part %d of %d refused: version %llu comes in %d "
				 "parts", idx, cnt, (unsigned long long)h->version, p->count);
	}
	if (p && p->done[idx]) {
		s->n_parts_refused++;
		return reply_err(OP_PUSH_BEGIN, RL_EEXIST, h->version, "part %d of version %llu is in already (a "
				 "duplicate)", idx, (unsigned long long)h->version);
	}
	if (p == NULL) {
		if ((p = rl_try_calloc(1, sizeof *p, "parts")) == NULL ||
		    (p->part = rl_try_calloc((size_t)cnt, sizeof *p->part, "parts")) == NULL ||
		    (p->done = rl_try_calloc((size_t)cnt, 1, "parts")) == NULL) {
			if (p)
				free(p->part);
			free(p);
			return reply_err(OP_PUSH_BEGIN, RL_ENOMEM, h->version, "out of memory");
		}
		p->version = h->version;
		p->count = cnt;
		p->rewind = x->rewind;
		p->deadline = rl_now() + (s->o.part_timeout_s > 0 ? s->o.part_timeout_s : 60.0);
		s->parts = p;
	}
	old = p->part[idx]; /* a part begun again (a client's retry) starts over */
	p->part[idx] = x;
	sver_unref_locked(old);
	return NULL;
}

static nng_msg *
do_push_begin(rl_wsync_server *s, const whdr *h)
{
	rl_wver *v = NULL;
	uint32_t chunk;
	uint64_t base;
	const char *why;
	sver *x = NULL, *old = NULL;
	int rv;

	if ((rv = rli_ws_manifest_decode(&v, &chunk, &base, h->body, h->bodyn, &why, 1, s->o.max_bytes)) != 0)
		return reply_err(OP_PUSH_BEGIN, rv, h->version, "%s", why);
	if (v->version == 0 || v->version != h->version) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "bad version number in push");
	}
	if ((h->a & PUSH_REWIND) && base) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "a rewind to version %llu must be pushed whole",
				 (unsigned long long)h->version);
	}
	if ((size_t)chunk + 65536 > s->o.max_msg) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_ETOOBIG, h->version,
				 "chunks of %u bytes do not fit this server's message limit of %zu bytes (use smaller chunks)",
				 chunk, s->o.max_msg);
	}
	if ((rv = sver_make(&x, v, chunk)) != 0) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, rv, h->version, "cannot stage version: %s", rl_strerror(rv));
	}
	if ((x->got = rl_try_calloc(x->nchunks + 1, 1, "chunk bitmap")) == NULL) {
		sver_unref(s, x);
		return reply_err(OP_PUSH_BEGIN, RL_ENOMEM, h->version, "out of memory");
	}
	x->rewind = (h->a & PUSH_REWIND) != 0;
	int idx = (int)((h->a >> 16) & 0xffff), cnt = (int)((h->a >> 32) & 0xffff);
	if ((h->a & PUSH_PART) && (cnt < 1 || cnt > PUSH_PART_MAX || idx >= cnt)) {
		sver_unref(s, x);
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "bad part %d of %d", idx, cnt);
	}
	pthread_mutex_lock(&s->mu);
	/* only a resumed trainer goes back (PUSH_REWIND): a second trainer's
	 * older version is refused */
	if (!x->rewind && s->latest && v->version <= s->latest->v->version) {
		uint64_t l = s->latest->v->version;
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_BEGIN, RL_ESTALE, h->version, "version %llu is not newer than the latest, %llu",
				 (unsigned long long)h->version, (unsigned long long)l);
	}
	if (base && (h->a & PUSH_PART)) {
		/* a part's base: the same names in the latest version */
		if (part_base_locked(s, v, base, h->b, &x->base) != 0) {
			sver_unref_locked(x);
			pthread_mutex_unlock(&s->mu);
			return reply_err(OP_PUSH_BEGIN, RL_ENOENT, h->version,
					 "delta base %llu does not hold this part's blobs with the same content",
					 (unsigned long long)base);
		}
		x->delta_base = base;
	} else if (base) {
		if (s->latest == NULL || s->latest->v->version != base || s->latest->v->hash != h->b ||
		    !rli_ws_same_layout(s->latest->v, v)) {
			sver_unref_locked(x);
			pthread_mutex_unlock(&s->mu);
			return reply_err(OP_PUSH_BEGIN, RL_ENOENT, h->version,
					 "delta base %llu is not the latest version with the same content and layout",
					 (unsigned long long)base);
		}
		x->base = s->latest;
		x->base->refs++;
		x->delta_base = base;
	}
	if (h->a & PUSH_PART) {
		nng_msg *m = part_begin_locked(s, h, x, idx, cnt);
		if (m != NULL) {
			sver_unref_locked(x);
			pthread_mutex_unlock(&s->mu);
			return m;
		}
		pthread_mutex_unlock(&s->mu);
		rl_verbose("receiving part %d of %d of version %llu (%zu chunks%s)", idx, cnt,
			   (unsigned long long)h->version, x->nchunks, base ? ", delta" : "");
		return reply_new(OP_PUSH_BEGIN, RL_OK, h->version, 0, 0, NULL, 0);
	}
	old = s->stage;
	s->stage = x;
	sver_unref_locked(old);
	pthread_mutex_unlock(&s->mu);
	rl_verbose("receiving version %llu (%zu chunks%s)", (unsigned long long)h->version, x->nchunks,
		   base ? ", delta" : x->rewind ? ", a rewind" : "");
	return reply_new(OP_PUSH_BEGIN, RL_OK, h->version, 0, 0, NULL, 0);
}

static nng_msg *
do_push_chunk(rl_wsync_server *s, const whdr *h)
{
	sver *x;
	const cref *c;
	const rl_wblob *b;
	const uint8_t *base = NULL;
	uint32_t flags;
	nng_msg *m = NULL;
	enc e = { 0 };
	uint8_t *tmp = NULL;
	int rv;

	sver *bx = NULL;

	pthread_mutex_lock(&s->mu);
	if (h->b != 0) /* a part's chunk: that part's staging, until committed */
		x = s->parts && s->parts->version == h->version && h->b <= (uint64_t)s->parts->count &&
		    !s->parts->done[h->b - 1] ? s->parts->part[h->b - 1] : NULL;
	else
		x = s->stage;
	if (x != NULL && x->v->version == h->version && !x->taken) {
		x->refs++;
		x->writers++;
		if ((bx = x->base) != NULL)
			bx->refs++;
	} else {
		x = NULL;
	}
	pthread_mutex_unlock(&s->mu);
	if (atomic_load(&test_slow_ms) > 0) /* test hook: a push slow enough to kill the server under it */
		usleep((useconds_t)atomic_load(&test_slow_ms) * 1000);
	if (x == NULL)
		return reply_err(OP_PUSH_CHUNK, RL_ENOENT, h->version, "no push of version %llu in progress "
				 "(or it came over shared memory)", (unsigned long long)h->version);
	if (h->a >= x->nchunks || h->bodyn < CB_HDR) {
		m = reply_err(OP_PUSH_CHUNK, RL_EFORMAT, h->version, "bad chunk %llu", (unsigned long long)h->a);
		goto out;
	}
	c = &x->ch[h->a];
	b = &x->v->blobs[c->blob];
	flags = get32(h->body);
	if (get64(h->body + 8) != c->len || get32(h->body + 4) != (uint32_t)b->elem ||
	    ((flags & RL_WENC_DELTA) && bx == NULL)) {
		m = reply_err(OP_PUSH_CHUNK, RL_EFORMAT, h->version, "chunk %llu: length, element size or delta flag "
			      "does not match the manifest", (unsigned long long)h->a);
		goto out;
	}
	if (flags & RL_WENC_DELTA)
		base = bx->v->blobs[c->blob].data + c->off;
	/* decoded aside and copied in only once every piece matched: a chunk
	 * sent again with a bad byte after a good one must not reach the
	 * staged blob, whose chunk is already counted as received */
	if ((tmp = rl_try_malloc(c->len ? c->len : 1, "pushed chunk")) == NULL) {
		m = reply_err(OP_PUSH_CHUNK, RL_ENOMEM, h->version, "out of memory for chunk %llu",
			      (unsigned long long)h->a);
		goto out;
	}
	rv = rli_ws_decode_chunk(tmp, c->len, h->body + CB_HDR, h->bodyn - CB_HDR, flags, base, b->elem,
				 b->pieces + c->off / RL_WSYNC_PIECE);
	if (rv == 0)
		memcpy(b->data + c->off, tmp, c->len);
	if (rv != 0) {
		pthread_mutex_lock(&s->mu);
		s->n_bad_push++;
		pthread_mutex_unlock(&s->mu);
		m = reply_err(OP_PUSH_CHUNK, RL_ECHECKSUM, h->version, "chunk %llu of version %llu failed its checksum",
			      (unsigned long long)h->a, (unsigned long long)h->version);
		goto out;
	}
	/* keep what came as the served encoding of this chunk; whole chunks
	 * pushed uncompressed are served from the data (compressed on demand) */
	e.n = h->bodyn - CB_HDR;
	e.flags = flags;
	if (flags != 0 && (e.p = malloc(e.n ? e.n : 1)) != NULL)
		memcpy(e.p, h->body + CB_HDR, e.n);
	pthread_mutex_lock(&s->mu);
	if (e.p) {
		enc *slot = (flags & RL_WENC_DELTA) ? &x->delta[h->a] : &x->full[h->a];
		if (slot->p == NULL) {
			*slot = e;
			e.p = NULL;
		}
	}
	if (!x->got[h->a]) {
		x->got[h->a] = 1;
		x->ngot++;
	}
	pthread_mutex_unlock(&s->mu);
	free(e.p);
	m = reply_new(OP_PUSH_CHUNK, RL_OK, h->version, h->a, 0, NULL, 0);
out:
	free(tmp);
	pthread_mutex_lock(&s->mu);
	x->writers--;
	sver_unref_locked(bx);
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	return m;
}

/* install x as latest (x's ref moves to the server); called without mu.
 * rewind: x replaces the held versions from its number up (a resumed
 * trainer's), and its lineage (x->v->lineage) becomes the server's. */
static void
install(rl_wsync_server *s, sver *x, int rewind)
{
	sver *drop = NULL, *drop2 = NULL;

	/* x is not visible yet: move its bytes into a sealed memfd that workers
	 * on this host map (the heap copy is freed, the bytes exist once) */
	if (s->o.shm >= 0 && x->shm_fd < 0) {
		int bad = atomic_load(&test_corrupt_shm) > 0;
		if (rl_wshm_make(&x->shm_fd, x->v, 1, bad) != 0)
			rl_warn("version %llu: no shared memory copy; workers on this host use the stream",
				(unsigned long long)x->v->version);
		else if (bad)
			atomic_fetch_sub(&test_corrupt_shm, 1);
	}
	pthread_mutex_lock(&s->mu);
	if (rewind) {
		/* the previous version stays only if it is below x: the line up to
		 * x is the trainer's still */
		drop = s->latest;
		if (s->prev && (!s->o.keep_previous || s->prev->v->version >= x->v->version)) {
			drop2 = s->prev;
			s->prev = NULL;
		}
		if (s->prev && s->prev->base) {
			sver_unref_locked(s->prev->base);
			s->prev->base = NULL;
		}
		if (x->base == NULL && s->prev && rli_ws_same_layout(s->prev->v, x->v)) {
			x->base = s->prev;
			x->base->refs++;
		}
		s->lineage = x->v->lineage;
	} else if (s->o.keep_previous) {
		drop = s->prev;
		s->prev = s->latest;
		if (s->prev && s->prev->base) {
			sver_unref_locked(s->prev->base);
			s->prev->base = NULL;
		}
		/* a kept previous version lets the server make deltas against it */
		if (x->base == NULL && s->prev && rli_ws_same_layout(s->prev->v, x->v)) {
			x->base = s->prev;
			x->base->refs++;
		}
	} else {
		drop = s->latest;
		/* the pushed delta encodings stay; the base data is no longer needed */
		if (x->base) {
			sver_unref_locked(x->base);
			x->base = NULL;
		}
	}
	s->latest = x;
	sver_unref_locked(drop);
	sver_unref_locked(drop2);
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
}

static int
persist(rl_wsync_server *s, const rl_wver *v, int rewind)
{
	uint64_t lin;
	int rv, keep = s->o.keep_previous ? 2 : 1;

	if (s->data_dir == NULL)
		return RL_OK;
	rv = rewind ? rl_wdir_rewind_ver(s->data_dir, v, keep, &lin) : rl_wdir_publish_ver(s->data_dir, v, keep);
	if (rv != 0)
		rl_error("cannot save version %llu in '%s': %s", (unsigned long long)v->version, s->data_dir,
			 rl_strerror(rv));
	return rv;
}

/* Installs the staged x (the caller's reference, taken out of staging; mu
 * held, released here) as the new latest version; b: the reply's b. */
static nng_msg *
publish_locked(rl_wsync_server *s, sver *x, const whdr *h, uint64_t b)
{
	uint64_t from, lin;
	int rv, rewind;

	/* a rewind drops what is held from its number up; the same version
	 * again (the trainer resumed from the latest) changes nothing, and one
	 * above the latest is an ordinary push */
	if (x->rewind && s->latest && s->latest->v->version == x->v->version && s->latest->v->hash == x->v->hash) {
		uint64_t lin = s->lineage;
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		rl_info("rewind to version %llu: held already", (unsigned long long)h->version);
		return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, b, NULL, 0);
	}
	rewind = x->rewind && s->latest && s->latest->v->version >= x->v->version;
	from = ver_of(s->latest);
	x->v->lineage = s->lineage + (rewind ? 1 : 0);
	s->committing = h->version;
	pthread_mutex_unlock(&s->mu);
	free(x->got);
	x->got = NULL;
	if (atomic_load(&test_slow_commit_ms) > 0) /* test hook: a commit slow to save */
		usleep((useconds_t)atomic_load(&test_slow_commit_ms) * 1000);
	/* every piece was verified as it arrived; the blob and version hashes
	 * were checked against the pieces when the manifest was decoded */
	if ((rv = persist(s, x->v, rewind)) != 0) {
		pthread_mutex_lock(&s->mu);
		s->committing = 0;
		pthread_cond_broadcast(&s->tcv);
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_COMMIT, rv, h->version, "cannot save version %llu: %s",
				 (unsigned long long)h->version, rl_strerror(rv));
	}
	lin = x->v->lineage;
	install(s, x, rewind);
	pthread_mutex_lock(&s->mu);
	s->committing = 0;
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
	if (rewind)
		rl_info("rewound from version %llu to %llu (a resumed trainer's; line %llu): %llu bytes, %d blobs",
			(unsigned long long)from, (unsigned long long)h->version, (unsigned long long)lin,
			(unsigned long long)rl_wver_total(x->v), x->v->nblobs);
	else
		rl_info("published version %llu (%llu bytes, %d blobs)", (unsigned long long)h->version,
			(unsigned long long)rl_wver_total(x->v), x->v->nblobs);
	return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, b, NULL, 0);
}

/* The version of every part of p (which is the caller's, out of the
 * server): the parts' blobs moved into one version, in part order, every
 * piece hashed again and each blob's hash compared with its part's
 * manifest.  Blob names in two parts are refused. */
static int
assemble(pstage *p, sver **out, char *why, size_t whyn)
{
	rl_wver *mv = NULL;
	int rv;

	if ((rv = rl_wver_create(&mv, p->version)) != 0)
		return rv;
	for (int i = 0; i < p->count; i++) {
		rl_wver *pv = p->part[i]->v;
		for (int j = 0; j < pv->nblobs; j++) {
			rl_wblob *b = &pv->blobs[j];
			uint8_t *d = b->data;
			if (rl_wver_find(mv, b->name) != NULL) {
				snprintf(why, whyn, "blob '%s' of part %d is in an earlier part too", b->name, i);
				rv = RL_EEXIST;
				goto out;
			}
			b->data = NULL; /* moved: freed with mv */
			if ((rv = rl_wver_add_blob_owned(mv, b->name, d, b->size, b->elem)) != 0) {
				snprintf(why, whyn, "cannot assemble blob '%s': %s", b->name, rl_strerror(rv));
				goto out;
			}
		}
	}
	if ((rv = rl_wver_hash(mv)) != 0)
		goto out;
	for (int i = 0, k = 0; i < p->count; i++)
		for (int j = 0; j < p->part[i]->v->nblobs; j++, k++)
			if (mv->blobs[k].hash != p->part[i]->v->blobs[j].hash) {
				snprintf(why, whyn, "blob '%s' of part %d does not match its checksum", mv->blobs[k].name, i);
				rv = RL_ECHECKSUM;
				goto out;
			}
	if ((rv = sver_make(out, mv, p->part[0]->chunk)) != 0)
		goto out;
	(*out)->rewind = p->rewind;
	return RL_OK;
out:
	rl_wver_destroy(mv);
	return rv;
}

/* PUSH_COMMIT of part h->b - 1 (mu held, released here): staged, or the
 * last one in, the version assembled and published. */
static nng_msg *
part_commit_locked(rl_wsync_server *s, const whdr *h)
{
	pstage *p = s->parts;
	int i = (int)(h->b - 1), rv;
	char why[400];
	sver *x;

	if (p == NULL || p->version != h->version || h->b > (uint64_t)p->count || p->part[i] == NULL) {
		uint64_t l = ver_of(s->latest), lin = s->lineage;
		pthread_mutex_unlock(&s->mu);
		if (l == h->version) /* a re-sent commit of the last part */
			return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, PART_PUBLISHED, NULL, 0);
		return reply_err(OP_PUSH_COMMIT, RL_ENOENT, h->version, "no part %llu of version %llu in progress "
				 "(never begun, or the version was aborted)", (unsigned long long)h->b - 1,
				 (unsigned long long)h->version);
	}
	x = p->part[i];
	if (!p->done[i] && x->ngot != x->nchunks) {
		size_t got = x->ngot;
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_COMMIT, RL_EINVAL, h->version, "part %d of version %llu incomplete: %zu of %zu "
				 "chunks", i, (unsigned long long)h->version, got, x->nchunks);
	}
	if (!p->done[i]) {
		p->done[i] = 1;
		p->ndone++;
	}
	if (p->ndone < p->count) {
		uint64_t lin = s->lineage;
		int n = p->ndone;
		pthread_mutex_unlock(&s->mu);
		rl_verbose("version %llu: part %d in (%d of %d)", (unsigned long long)h->version, i, n, p->count);
		return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, PART_STAGED, NULL, 0);
	}
	s->parts = NULL; /* ours now */
	pthread_mutex_unlock(&s->mu);
	int cnt = p->count;
	why[0] = 0;
	rv = assemble(p, &x, why, sizeof why);
	pthread_mutex_lock(&s->mu);
	pstage_free_locked(p);
	if (rv != 0) {
		s->n_parts_refused++;
		pthread_mutex_unlock(&s->mu);
		rl_warn("version %llu in %d parts not published: %s", (unsigned long long)h->version, cnt,
			why[0] ? why : rl_strerror(rv));
		return reply_err(OP_PUSH_COMMIT, rv, h->version, "version %llu not published: %s",
				 (unsigned long long)h->version, why[0] ? why : rl_strerror(rv));
	}
	s->n_parted++;
	return publish_locked(s, x, h, PART_PUBLISHED);
}

static nng_msg *
do_push_commit(rl_wsync_server *s, const whdr *h)
{
	sver *x;

	pthread_mutex_lock(&s->mu);
	/* the same commit again while the first one saves the version (nng's
	 * REQ re-sends a request after a reconnect) waits for the first's
	 * outcome: answered now, it would find no push in progress (RL_ENOENT),
	 * and the client's second push would be refused as not newer than itself */
	while (s->committing == h->version && !s->closing)
		pthread_cond_wait(&s->tcv, &s->mu);
	if (h->b != 0)
		return part_commit_locked(s, h);
	x = s->stage;
	if (x == NULL || x->v->version != h->version) {
		uint64_t l = ver_of(s->latest), lin = s->lineage;
		pthread_mutex_unlock(&s->mu);
		if (l == h->version) /* a re-sent commit */
			return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, 0, NULL, 0);
		return reply_err(OP_PUSH_COMMIT, RL_ENOENT, h->version, "no push of version %llu in progress",
				 (unsigned long long)h->version);
	}
	if (x->ngot != x->nchunks) {
		size_t got = x->ngot;
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_COMMIT, RL_EINVAL, h->version, "version %llu incomplete: %zu of %zu chunks",
				 (unsigned long long)h->version, got, x->nchunks);
	}
	s->stage = NULL; /* our reference now */
	return publish_locked(s, x, h, 0);
}

/* ---- server: bulk stream ------------------------------------------------------------
 * A plain socket listener (TCP or a Unix socket) and one thread per
 * connection, capped: read a request, write each chunk of its range as a
 * header plus the chunk's bytes straight from the held version with one
 * blocking sendmsg (no copy in user space, and the kernel does the waiting:
 * nng's message layer copies every reply, and its non-blocking streams cost
 * a poller wake-up and a task hand-off per socket buffer), then read the
 * next request.  The version is referenced while its range is sent.  A
 * malformed request gets an error header and the connection is closed.
 * Next to tls+tcp:// the connection's thread first runs a TLS handshake
 * with the REP listener's certificate, CA and CRLs (a client certificate
 * required when a CA is given), then writes each chunk with one blocking
 * SSL_write: records go straight to the kernel, not one async hop each as
 * through nng's TLS transport. */
#define WB_IO_MS 60000 /* a stalled peer loses its connection after this long */
#define WB_HANDSHAKE_MS 10000 /* a TLS peer whose handshake takes this long in all is dropped */

typedef struct bconn {
	rl_wsync_server *s;
	int fd;
	pthread_t th;
	atomic_int done;
	struct bconn *link;
} bconn;

static void
bulk_hdr(uint8_t *p, int32_t status, uint64_t version, uint64_t index, uint64_t len)
{
	put32(p, WB_MAGIC);
	put16(p + 4, WB_PROTO);
	put16(p + 6, WB_GET | OP_REPLY);
	put32(p + 8, WB_HDR);
	put32(p + 12, (uint32_t)status);
	put64(p + 16, version);
	put64(p + 24, index);
	put64(p + 32, len);
	put64(p + 40, 0);
}

/* an error reply: header and text; the caller then closes */
static void
bulk_refuse(const wbio *io, int status, uint64_t version, const char *fmt, ...) RL_PRINTF(4, 5);
static void
bulk_refuse(const wbio *io, int status, uint64_t version, const char *fmt, ...)
{
	char msg[256];
	uint8_t h[WB_HDR];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	rl_verbose("bulk request refused: %s", msg);
	bulk_hdr(h, status, version, 0, strlen(msg));
	(void)rli_wb_send2(io, h, WB_HDR, msg, strlen(msg));
}

/* one request (it is hostile): 0 to read the next, -1 to close */
static int
bulk_serve_one(rl_wsync_server *s, const wbio *io, const uint8_t *r, size_t rn)
{
	uint64_t version = get64(r + 16), first = get64(r + 24), count = get64(r + 32);
	const char *no;
	sver *x;
	int rv = 0;

	if (get32(r) != WB_MAGIC) {
		bulk_refuse(io, RL_EFORMAT, 0, "bad magic (not an rl-sync bulk request)");
		return -1;
	}
	if (get16(r + 4) != WB_PROTO) {
		bulk_refuse(io, RL_EVERSION, 0, "unsupported rl-sync bulk protocol version");
		return -1;
	}
	if (get16(r + 6) != WB_GET || get32(r + 8) != rn) {
		bulk_refuse(io, RL_EFORMAT, 0, "bad bulk request (operation or header length)");
		return -1;
	}
	if (rli_ws_auth_check_at(r, WB_HDR, rn, &no) != 0) {
		/* a keyed server's chunks go to keyed clients only, as its REQ/REP ones do */
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		rl_warn("refused a bulk request: %s", no);
		bulk_refuse(io, RL_EINVAL, 0, "%s", no);
		return -1;
	}
	if (version == 0 || (x = sver_get(s, version)) == NULL) {
		bulk_refuse(io, RL_ENOENT, version, "version %llu is not held (latest is %llu)",
			    (unsigned long long)version, (unsigned long long)rl_wsync_server_latest(s));
		return -1;
	}
	if (count == 0 || first >= x->nchunks || count > x->nchunks - first) {
		bulk_refuse(io, RL_EINVAL, version, "chunks %llu+%llu out of range (version has %zu)",
			    (unsigned long long)first, (unsigned long long)count, x->nchunks);
		sver_unref(s, x);
		return -1;
	}
	for (uint64_t i = first; i < first + count && rv == 0; i++) {
		const cref *c = &x->ch[i];
		const uint8_t *p = x->v->blobs[c->blob].data + c->off;
		uint8_t h[WB_HDR], *bad = NULL;
		int ms;
		bulk_hdr(h, RL_OK, version, i, c->len);
		if (c->len > 0 && atomic_load(&rli_ws_test_corrupt) > 0 && atomic_fetch_sub(&rli_ws_test_corrupt, 1) > 0 &&
		    (bad = malloc(c->len)) != NULL) {
			memcpy(bad, p, c->len);
			bad[c->len / 2] ^= 0x5a;
			p = bad;
			rl_warn("test hook: corrupted chunk %llu of version %llu", (unsigned long long)i,
				(unsigned long long)version);
		}
		if ((ms = atomic_load(&test_slow_ms)) > 0)
			usleep((useconds_t)ms * 1000);
		rv = rli_wb_send2(io, h, WB_HDR, p, c->len);
		free(bad);
		pthread_mutex_lock(&s->mu);
		s->n_chunks++;
		s->n_bulk_chunks++;
		s->bytes_out += c->len + WB_HDR;
		pthread_mutex_unlock(&s->mu);
	}
	sver_unref(s, x);
	return rv;
}

/* the TLS handshake of a bulk connection, bounded by WB_HANDSHAKE_MS in
 * all (SO_RCVTIMEO, which rli_tls_sock_open applies to the whole
 * handshake); a refused one is logged with the peer's address and the
 * certificate that failed */
static int
bconn_tls(bconn *b, wbio *io)
{
	struct timeval hs = { .tv_sec = WB_HANDSHAKE_MS / 1000 }, none = { 0 };
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	char why[320], peer[INET6_ADDRSTRLEN + 8] = "?";
	int rv;

	setsockopt(b->fd, SOL_SOCKET, SO_RCVTIMEO, &hs, sizeof hs);
	if ((rv = rli_tls_sock_open(&io->tls, b->s->btls, b->fd, why, sizeof why)) != RL_OK) {
		if (getpeername(b->fd, (struct sockaddr *)&ss, &sl) == 0 && (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
			inet_ntop(ss.ss_family, ss.ss_family == AF_INET ? (void *)&((struct sockaddr_in *)&ss)->sin_addr
								 : (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr, peer, sizeof peer);
		pthread_mutex_lock(&b->s->mu);
		b->s->n_bad_req++;
		pthread_mutex_unlock(&b->s->mu);
		rl_warn("bulk stream: refused a TLS connection from %s: %s", peer, why);
		return rv;
	}
	setsockopt(b->fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
	return RL_OK;
}

static void *
bconn_main(void *arg)
{
	bconn *b = arg;
	uint8_t req[WB_HDR + WS_AUTH_EXTRA];
	size_t rn;
	wbio io = { .fd = b->fd, .tls = NULL };

	/* requests may be far apart (an idle worker keeps its connection);
	 * a reply that cannot be written for WB_IO_MS ends the connection */
	{
		struct timeval tv = { .tv_sec = WB_IO_MS / 1000 };
		int one = 1;
		setsockopt(b->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		setsockopt(b->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	/* a keyed request's header is longer by its proof (wsync_int.h) */
	if (b->s->btls == NULL || bconn_tls(b, &io) == RL_OK)
		while (rli_wb_recv(&io, req, WB_HDR) == 0 &&
		       ((rn = get32(req + 8)) != WB_HDR + WS_AUTH_EXTRA || rli_wb_recv(&io, req + WB_HDR, WS_AUTH_EXTRA) == 0) &&
		       bulk_serve_one(b->s, &io, req, rn == WB_HDR + WS_AUTH_EXTRA ? rn : WB_HDR) == 0)
			;
	rli_tls_sock_close(io.tls);
	shutdown(b->fd, SHUT_RDWR);
	atomic_store(&b->done, 1);
	return NULL;
}

/* join and free finished connections (all of them when closing, after
 * shutting their sockets down) */
static void
bulk_reap(rl_wsync_server *s, int all)
{
	bconn *dead = NULL, **pp;

	pthread_mutex_lock(&s->mu);
	for (pp = &s->bconns; *pp;) {
		bconn *b = *pp;
		if (all || atomic_load(&b->done)) {
			*pp = b->link;
			b->link = dead;
			dead = b;
			s->nbconn--;
		} else {
			pp = &b->link;
		}
	}
	pthread_mutex_unlock(&s->mu);
	while (dead) {
		bconn *b = dead;
		dead = b->link;
		shutdown(b->fd, SHUT_RDWR);
		pthread_join(b->th, NULL);
		close(b->fd);
		free(b);
	}
}

static void *
bulk_accept_main(void *arg)
{
	rl_wsync_server *s = arg;

	for (;;) {
		int fd = accept4(s->bfd, NULL, NULL, SOCK_CLOEXEC), closing;
		bconn *b = NULL;
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			pthread_mutex_lock(&s->mu);
			closing = s->closing;
			pthread_mutex_unlock(&s->mu);
			if (closing)
				break;
			usleep(10000); /* EMFILE and the like: do not spin */
			continue;
		}
		bulk_reap(s, 0);
		pthread_mutex_lock(&s->mu);
		closing = s->closing;
		if (!closing && s->nbconn < WB_MAX_CONNS && (b = calloc(1, sizeof *b)) != NULL) {
			b->s = s;
			b->fd = fd;
			if (pthread_create(&b->th, NULL, bconn_main, b) != 0) {
				free(b);
				b = NULL;
			} else {
				b->link = s->bconns;
				s->bconns = b;
				s->nbconn++;
			}
		}
		pthread_mutex_unlock(&s->mu);
		if (b == NULL)
			close(fd); /* the client falls back to REQ/REP */
		if (closing)
			break;
	}
	return NULL;
}

/* a listening socket for the bulk stream next to a REQ/REP URL: tcp -> the
 * same host, an ephemeral port (clients are told it); ipc -> the path plus
 * ".bulk"; anything else -> none.  *url gets what clients are told. */
static int
bulk_listen(char *url, size_t n, const char *rep_url)
{
	nng_url *u = NULL;
	int fd = -1;

	if (strncmp(rep_url, "ipc://", 6) == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s.bulk", rep_url + 6) >= (int)sizeof sa.sun_path ||
		    snprintf(url, n, "ipc://%s", sa.sun_path) >= (int)n)
			return -1;
		struct stat st;
		/* a stale socket of ours (the REP listener on the path itself
		 * succeeded, so no live server uses it); never anything else */
		if (lstat(sa.sun_path, &st) == 0 && S_ISSOCK(st.st_mode))
			unlink(sa.sun_path);
		if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || bind(fd, (void *)&sa, sizeof sa) != 0 ||
		    listen(fd, 64) != 0)
			goto fail;
		return fd;
	}
	if (nng_url_parse(&u, rep_url) != 0)
		return -1;
	if (strcmp(u->u_scheme, "tcp") == 0 || strcmp(u->u_scheme, "tcp4") == 0 || strcmp(u->u_scheme, "tcp6") == 0 ||
	    strcmp(u->u_scheme, "tls+tcp") == 0 || strcmp(u->u_scheme, "tls+tcp4") == 0 ||
	    strcmp(u->u_scheme, "tls+tcp6") == 0) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int one = 1, port;
		const char *sch = strncmp(u->u_scheme, "tls+", 4) == 0 ? u->u_scheme + 4 : u->u_scheme;
		hints.ai_family = strcmp(sch, "tcp4") == 0 ? AF_INET : strcmp(sch, "tcp6") == 0 ? AF_INET6 : AF_UNSPEC;
		const char *host = u->u_hostname[0] && strcmp(u->u_hostname, "*") != 0 ? u->u_hostname : NULL;
		if (getaddrinfo(host, "0", &hints, &ai) != 0)
			goto fail;
		if ((fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
		    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0 ||
		    getsockname(fd, (void *)&ss, &sl) != 0) {
			freeaddrinfo(ai);
			goto fail;
		}
		freeaddrinfo(ai);
		port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						      : ((struct sockaddr_in *)&ss)->sin_port);
		snprintf(url, n, strchr(u->u_hostname, ':') ? "%s://[%s]:%d" : "%s://%s:%d", u->u_scheme,
			 u->u_hostname, port);
		nng_url_free(u);
		return fd;
	}
fail:
	if (fd >= 0)
		close(fd);
	nng_url_free(u);
	return -1;
}

/* start the bulk stream; failing to is not fatal (clients use REQ/REP) */
static void
bulk_open(rl_wsync_server *s, const char *url)
{
	s->bfd = -1;
	if (s->o.bulk < 0)
		return;
	/* the same certificate, key, CA and CRLs as the REP listener's */
	if (strncmp(url, "tls+", 4) == 0 && rli_nng_tls_ctx(&s->btls, 1, url) != RL_OK) {
		rl_warn("no bulk stream next to '%s' (whole chunks go over REQ/REP)", url);
		return;
	}
	if ((s->bfd = bulk_listen(s->bulk_url, sizeof s->bulk_url, url)) < 0) {
		if (strncmp(url, "tcp", 3) == 0 || strncmp(url, "tls+tcp", 7) == 0 || strncmp(url, "ipc://", 6) == 0)
			rl_warn("no bulk stream next to '%s': %s (whole chunks go over REQ/REP)", url, strerror(errno));
		rli_tls_ctx_free(s->btls);
		s->btls = NULL;
		return;
	}
	if (pthread_create(&s->bth, NULL, bulk_accept_main, s) != 0) {
		close(s->bfd);
		s->bfd = -1;
		rli_tls_ctx_free(s->btls);
		s->btls = NULL;
		return;
	}
	rl_verbose("bulk stream on %s", s->bulk_url);
}

static void
bulk_close(rl_wsync_server *s)
{
	if (s->bfd < 0)
		return;
	shutdown(s->bfd, SHUT_RDWR); /* wakes the accept */
	pthread_join(s->bth, NULL);
	close(s->bfd);
	s->bfd = -1;
	bulk_reap(s, 1);
	rli_tls_ctx_free(s->btls);
	s->btls = NULL;
	if (strncmp(s->bulk_url, "ipc://", 6) == 0)
		unlink(s->bulk_url + 6);
}

/* the shm service's lookup: a dup of the held version's memfd */
static int
shm_lookup(void *arg, uint64_t version, int *fd, uint64_t *got, uint64_t *size)
{
	rl_wsync_server *s = arg;
	sver *x = NULL;
	int rv = RL_ENOENT;

	pthread_mutex_lock(&s->mu);
	if (version == 0 || (s->latest && s->latest->v->version == version))
		x = s->latest;
	else if (s->prev && s->prev->v->version == version)
		x = s->prev;
	if (x && x->shm_fd < 0)
		rv = RL_ENOTSUP;
	else if (x && (*fd = fcntl(x->shm_fd, F_DUPFD_CLOEXEC, 0)) < 0)
		rv = RL_EIO;
	else if (x) {
		*got = x->v->version;
		*size = rl_wshm_size(x->v);
		rv = RL_OK;
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

/* the shm service's taker: a trainer on this host hands over its sealed
 * memfd of the version it is pushing (after PUSH_BEGIN; PUSH_COMMIT
 * follows).  The staged version's blobs are pointed into a read-only
 * mapping of it and every piece is checked against the manifest, as pushed
 * chunks are; the memfd then is the one the server serves (no copy). */
static int
shm_take(void *arg, uint64_t version, int fd, uint64_t *size)
{
	rl_wsync_server *s = arg;
	sver *x;
	uint8_t **old = NULL;
	int rv, oldb;

	pthread_mutex_lock(&s->mu);
	if ((x = s->stage) == NULL || x->v->version != version) {
		pthread_mutex_unlock(&s->mu);
		rl_verbose("shared memory push of version %llu: no such push in progress", (unsigned long long)version);
		return RL_ENOENT;
	}
	if (x->taken || x->writers > 0 || x->ngot > 0) {
		/* chunks are coming the other way: the two must not mix */
		pthread_mutex_unlock(&s->mu);
		return RL_EINVAL;
	}
	x->taken = 1; /* no PUSH_CHUNK writes into v from now on */
	x->refs++;
	pthread_mutex_unlock(&s->mu);
	*size = rl_wshm_size(x->v);
	oldb = x->v->borrowed;
	if ((old = rl_try_calloc((size_t)x->v->nblobs + 1, sizeof *old, "blob table")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < x->v->nblobs; i++)
		old[i] = x->v->blobs[i].data;
	if ((rv = rl_wshm_map(x->v, fd)) != 0)
		goto fail;
	if ((rv = rl_wver_verify(x->v)) != 0) {
		rl_warn("version %llu: the pushed shared memory object does not match its checksums",
			(unsigned long long)version);
		goto fail;
	}
	if ((x->shm_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		rv = RL_EIO;
		goto fail;
	}
	for (int i = 0; i < x->v->nblobs; i++)
		if (oldb != 1)
			free(old[i]);
	free(old);
	pthread_mutex_lock(&s->mu);
	memset(x->got, 1, x->nchunks);
	x->ngot = x->nchunks;
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	rl_verbose("version %llu: taken from the pusher's shared memory", (unsigned long long)version);
	return RL_OK;
fail:
	if (x->v->map) {
		munmap(x->v->map, x->v->mapn);
		x->v->map = NULL;
		x->v->mapn = 0;
		for (int i = 0; old && i < x->v->nblobs; i++)
			x->v->blobs[i].data = old[i];
		x->v->borrowed = oldb;
	}
	free(old);
	pthread_mutex_lock(&s->mu);
	if (rv == RL_ECHECKSUM)
		s->n_bad_push++;
	x->taken = 0; /* the client may still send the chunks */
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	return rv;
}

/* OP_SHM: this host's id and the abstract socket that hands out memfds,
 * as "HOSTID NAME" */
static nng_msg *
do_shm(rl_wsync_server *s)
{
	char b[160];
	int n;

	if (s->shm == NULL)
		return reply_err(OP_SHM, RL_ENOTSUP, 0, "this server has no shared memory service");
	n = snprintf(b, sizeof b, "%s %s", s->hostid, rl_wshm_srv_name(s->shm));
	return reply_new(OP_SHM, RL_OK, 0, 0, 0, b, (size_t)n);
}

/* OP_DATA: where the bulk stream is; a = its tcp port (0 for ipc),
 * body = its URL as the server sees it */
static nng_msg *
do_data(rl_wsync_server *s)
{
	const char *p;
	int port = 0;

	if (s->bfd < 0)
		return reply_err(OP_DATA, RL_ENOTSUP, 0, "this server has no bulk stream");
	if (strncmp(s->bulk_url, "ipc://", 6) != 0 && (p = strrchr(s->bulk_url, ':')) != NULL)
		port = atoi(p + 1);
	return reply_new(OP_DATA, RL_OK, 0, (uint64_t)port, 0, s->bulk_url, strlen(s->bulk_url));
}

static void
ctx_send(sctx *c, nng_msg *m)
{
	c->state = SC_SEND;
	nng_aio_set_msg(c->aio, m);
	nng_ctx_send(c->ctx, c->aio);
}

static void
ctx_recv(sctx *c)
{
	c->state = SC_RECV;
	nng_ctx_recv(c->ctx, c->aio);
}

/* a lineage-aware WAIT (version = WAIT_LINEAGE | lineage) whose client is
 * on another line than the server's latest version: answered at once */
static int
wait_moved(const rl_wsync_server *s, uint64_t v)
{
	return (v & WAIT_LINEAGE) && s->latest && (v & ~WAIT_LINEAGE) != s->lineage;
}

/* handle one request; NULL reply with c parked for a long-poll */
static nng_msg *
handle(rl_wsync_server *s, sctx *c, nng_msg *req, int *parked)
{
	whdr h;
	const char *why;
	int rv;

	pthread_mutex_lock(&s->mu);
	s->n_req++;
	pthread_mutex_unlock(&s->mu);
	if ((rv = rli_ws_hdr_parse(&h, nng_msg_body(req), nng_msg_len(req), &why)) != 0) {
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		return reply_err(0, rv, 0, "%s", why);
	}
	if ((rv = rli_ws_auth_check(nng_msg_body(req), nng_msg_len(req), strncmp(s->url, "tls+", 4) == 0, &why)) != 0) {
		/* refused before the op: nothing is pushed or served */
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		rl_warn("refused a request (op %u): %s", h.op, why);
		return reply_err(h.op, rv, 0, "%s", why);
	}
	switch (h.op) {
	case OP_STATUS:
		return do_status(s);
	case OP_WAIT:
		pthread_mutex_lock(&s->mu);
		if (ver_of(s->latest) > h.a || s->closing || wait_moved(s, h.version)) {
			uint64_t l = ver_of(s->latest), lin = s->lineage;
			pthread_mutex_unlock(&s->mu);
			return reply_new(OP_WAIT, RL_OK, l, lin, 0, NULL, 0);
		}
		if (!(h.version & WAIT_LINEAGE) && s->lineage > 0 && h.a > ver_of(s->latest) &&
		    s->warned_lin != s->lineage + 1) {
			/* an rl-sync client from before rewinds: it cannot be told */
			s->warned_lin = s->lineage + 1;
			rl_warn("a worker waits for a version above %llu, which a rewind discarded (latest is %llu); "
				"it is too old to be told and keeps its weights until the trainer passes %llu",
				(unsigned long long)h.a, (unsigned long long)ver_of(s->latest), (unsigned long long)h.a);
			rl_hint("upgrade or restart that worker");
		}
		c->wait_have = h.a;
		c->wait_lin = h.version;
		c->deadline = rl_now() + (double)RL_MIN(h.b, (uint64_t)WS_WAIT_MAX_MS) / 1e3;
		c->state = SC_PARKED;
		c->next = s->parked;
		s->parked = c;
		*parked = 1; /* from here on the timer thread owns c */
		pthread_cond_broadcast(&s->tcv);
		pthread_mutex_unlock(&s->mu);
		return NULL;
	case OP_MANIFEST:
		return do_manifest(s, &h);
	case OP_CHUNK:
		return do_chunk(s, &h);
	case OP_PUSH_BEGIN:
		return do_push_begin(s, &h);
	case OP_PUSH_CHUNK:
		return do_push_chunk(s, &h);
	case OP_PUSH_COMMIT:
		return do_push_commit(s, &h);
	case OP_DATA:
		return do_data(s);
	case OP_SHM:
		return do_shm(s);
	default:
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		return reply_err(h.op, RL_EINVAL, 0, "unknown operation %u", h.op);
	}
}

static void
ctx_cb(void *arg)
{
	sctx *c = arg;
	rl_wsync_server *s = c->s;
	int r = nng_aio_result(c->aio);

	if (c->state == SC_SEND) {
		if (r != 0)
			nng_msg_free(nng_aio_get_msg(c->aio));
		if (r == NNG_ECLOSED)
			return;
		ctx_recv(c);
		return;
	}
	if (r != 0) {
		if (r == NNG_ECLOSED || r == NNG_ECANCELED)
			return;
		ctx_recv(c);
		return;
	}
	c->req = nng_aio_get_msg(c->aio);
	pthread_mutex_lock(&s->mu);
	c->state = SC_WORK;
	c->next = NULL;
	if (s->qtail)
		s->qtail->next = c;
	else
		s->qhead = c;
	s->qtail = c;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void *
worker_main(void *arg)
{
	rl_wsync_server *s = arg;

	for (;;) {
		sctx *c;
		nng_msg *rep, *req;
		int parked;

		pthread_mutex_lock(&s->mu);
		while (s->qhead == NULL && !s->closing)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->closing) {
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		c = s->qhead;
		if ((s->qhead = c->next) == NULL)
			s->qtail = NULL;
		pthread_mutex_unlock(&s->mu);
		req = c->req;
		c->req = NULL;
		parked = 0;
		rep = handle(s, c, req, &parked);
		nng_msg_free(req);
		if (rep)
			ctx_send(c, rep);
		else if (!parked)
			ctx_recv(c); /* no memory for a reply: the client times out and retries */
	}
}

/* answers parked long-polls when a version arrives or their time is up */
static void *
timer_main(void *arg)
{
	rl_wsync_server *s = arg;

	pthread_mutex_lock(&s->mu);
	while (!s->closing) {
		struct timespec ts;
		sctx **pp = &s->parked, *ready = NULL;
		double now = rl_now();
		uint64_t l = ver_of(s->latest), lin = s->lineage;

		if (s->parts && now >= s->parts->deadline) {
			/* a part never came (its pusher died or hangs): nothing of the
			 * version is published, and the next version's parts may begin */
			pstage *p = s->parts;
			char miss[256] = "";
			size_t o = 0;
			for (int i = 0; i < p->count && o + 16 < sizeof miss; i++)
				if (!p->done[i])
					o += (size_t)snprintf(miss + o, sizeof miss - o, "%s%d", o ? ", " : "", i);
			rl_warn("version %llu aborted: part(s) %s of %d not in %.0f s after its first part began; "
				"nothing of it published", (unsigned long long)p->version, miss, p->count,
				s->o.part_timeout_s > 0 ? s->o.part_timeout_s : 60.0);
			s->parts = NULL;
			s->n_parts_aborted++;
			pstage_free_locked(p);
		}
		while (*pp) {
			sctx *c = *pp;
			if (l > c->wait_have || wait_moved(s, c->wait_lin) || now >= c->deadline) {
				*pp = c->next;
				c->next = ready;
				ready = c;
			} else {
				pp = &c->next;
			}
		}
		pthread_mutex_unlock(&s->mu);
		while (ready) {
			sctx *c = ready;
			nng_msg *m;
			ready = c->next;
			m = reply_new(OP_WAIT, l > c->wait_have || wait_moved(s, c->wait_lin) ? RL_OK : RL_ETIMEDOUT, l,
				      lin, 0, NULL, 0);
			if (m)
				ctx_send(c, m);
			else
				ctx_recv(c);
		}
		pthread_mutex_lock(&s->mu);
		if (s->closing)
			break;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (ver_of(s->latest) == l && s->lineage == lin)
			pthread_cond_timedwait(&s->tcv, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

uint64_t
rl_wsync_server_latest(rl_wsync_server *s)
{
	uint64_t l;

	pthread_mutex_lock(&s->mu);
	l = ver_of(s->latest);
	pthread_mutex_unlock(&s->mu);
	return l;
}

int
rl_wsync_server_publish(rl_wsync_server *s, rl_wver *v)
{
	sver *x;
	uint64_t l = rl_wsync_server_latest(s);
	int rv;

	if (v->version <= l) {
		rl_error("version %llu is not newer than the latest, %llu", (unsigned long long)v->version,
			 (unsigned long long)l);
		return RL_ESTALE;
	}
	if ((rv = rl_wver_hash(v)) != 0 || (rv = sver_make(&x, v, RL_WSYNC_CHUNK_DEFAULT)) != 0)
		return rv;
	v->lineage = s->lineage;
	if ((rv = persist(s, v, 0)) != 0) {
		x->v = NULL;
		sver_unref(s, x);
		return rv;
	}
	install(s, x, 0);
	return RL_OK;
}

/* Installs one version read from the data directory. */
static int
install_loaded(rl_wsync_server *s, rl_wver *v, uint64_t ver, const char *path)
{
	sver *x;
	uint32_t ck = v->chunk;
	int rv;

	if (ck < RL_WSYNC_PIECE || ck > RL_WSYNC_CHUNK_MAX || ck % RL_WSYNC_PIECE)
		ck = RL_WSYNC_CHUNK_DEFAULT;
	if ((rv = sver_make(&x, v, ck)) != 0) {
		rl_wver_destroy(v);
		return rv;
	}
	s->lineage = v->lineage; /* the latest is loaded last: its line is the server's */
	install(s, x, 0);
	rl_info("serving version %llu from '%s'", (unsigned long long)ver, path);
	return RL_OK;
}

/* A stored version that does not read back whole (a damaged disk, a
 * version saved by an older server that published bad bytes) is moved
 * aside as bad-vNNNNNN, kept for inspection and no longer listed, so the
 * next older one is served and a new push may reuse the number. */
static void
set_aside(const char *dir, uint64_t ver, const char *path, int why)
{
	char bad[4200];

	snprintf(bad, sizeof bad, "%s/bad-v%06llu.%ld", dir, (unsigned long long)ver, (long)time(NULL));
	if (rename(path, bad) == 0)
		rl_error("refusing stored version %llu ('%s': %s): moved to '%s'; serving the one before it",
			 (unsigned long long)ver, path, rl_strerror(why), bad);
	else
		rl_error("refusing stored version %llu ('%s': %s), and cannot move it aside: %s",
			 (unsigned long long)ver, path, rl_strerror(why), strerror(errno));
}

/* The newest stored version that reads back whole and matches its
 * checksums (rl_wver_read_dir verifies); damaged ones are set aside.
 * RL_ENOENT when none is left. */
static int
load_good(rl_wsync_server *s, rl_wver **out, uint64_t *ver, char *path, size_t pathsz)
{
	uint64_t below = UINT64_MAX;
	int rv;

	*out = NULL;
	for (;;) {
		rv = below == UINT64_MAX ? rl_wdir_latest(s->data_dir, ver, path, pathsz)
					 : rl_wdir_before(s->data_dir, below, ver, path, pathsz);
		if (rv != 0)
			return rv;
		if ((rv = rl_wver_read_dir(out, path, 0)) == RL_OK)
			return RL_OK;
		if (rv == RL_ENOMEM)
			return rv;
		set_aside(s->data_dir, *ver, path, rv);
		below = *ver;
	}
}

static int
server_load(rl_wsync_server *s)
{
	uint64_t ver, prev;
	char path[4096], ppath[4096];
	rl_wver *v = NULL, *pv = NULL;
	int rv;

	if ((rv = load_good(s, &v, &ver, path, sizeof path)) == RL_ENOENT)
		return RL_OK;
	if (rv != 0)
		return rv;
	/* --keep-previous: the version before is on disk too (persist keeps
	 * two); installed first, it becomes the held previous and the base
	 * for deltas, as before the restart.  It is optional: one that cannot
	 * be read is left out with a warning. */
	if (s->o.keep_previous && rl_wdir_before(s->data_dir, ver, &prev, ppath, sizeof ppath) == RL_OK) {
		if ((rv = rl_wver_read_dir(&pv, ppath, 0)) != RL_OK || install_loaded(s, pv, prev, ppath) != RL_OK)
			rl_warn("not holding version %llu as the previous one%s%s", (unsigned long long)prev,
				rv ? ": " : "", rv ? rl_strerror(rv) : "");
	}
	return install_loaded(s, v, ver, path);
}

void
rl_wsync_server_close(rl_wsync_server *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	s->closing = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < s->nworkers; i++)
		pthread_join(s->workers[i], NULL);
	if (s->timer_started)
		pthread_join(s->timer, NULL);
	rl_wshm_srv_close(s->shm);
	s->shm = NULL;
	bulk_close(s);
	if (!rli_nng_close_timed(s->sock, "rl-sync server socket")) {
		/* nng #1543: its contexts' callbacks may still run and use s; the
		 * listener is closed, so a new server can take the address */
		rl_warn("the server socket did not close (nng bug #1543); its memory is left");
		return;
	}
	for (int i = 0; i < s->nctx; i++) {
		if (s->ctxs[i].aio) {
			nng_aio_stop(s->ctxs[i].aio);
			nng_aio_free(s->ctxs[i].aio);
		}
		if (s->ctxs[i].req)
			nng_msg_free(s->ctxs[i].req);
	}
	sver_unref_locked(s->stage);
	pstage_free_locked(s->parts);
	sver_unref_locked(s->prev);
	sver_unref_locked(s->latest);
	free(s->ctxs);
	free(s->workers);
	free(s->data_dir);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->tcv);
	free(s);
}

int
rl_wsync_server_open(rl_wsync_server **out, const rl_wsync_server_opts *o)
{
	rl_wsync_server *s;
	const char *url = o->listen ? o->listen : "tcp://127.0.0.1:7401";
	int rv, r;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "server")) == NULL)
		return RL_ENOMEM;
	s->o = *o;
	s->o.contexts = o->contexts > 0 ? o->contexts : 64;
	s->o.threads = o->threads > 0 ? o->threads : 4;
	s->o.max_msg = o->max_msg ? o->max_msg : RL_WSYNC_CHUNK_MAX + 65536;
	s->o.level = o->level ? o->level : 1;
	s->o.max_bytes = o->max_bytes ? o->max_bytes : rli_ws_default_max_bytes();
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->tcv, NULL);
	s->sock = (nng_socket)NNG_SOCKET_INITIALIZER;
	s->bfd = -1;
	if (getenv("RL_WSYNC_TEST_CORRUPT"))
		rl_wsync_test_corrupt(atoi(getenv("RL_WSYNC_TEST_CORRUPT")));
	if (getenv("RL_WSYNC_TEST_CORRUPT_SHM"))
		atomic_store(&test_corrupt_shm, atoi(getenv("RL_WSYNC_TEST_CORRUPT_SHM")));
	if (getenv("RL_WSYNC_TEST_SLOW_MS"))
		atomic_store(&test_slow_ms, atoi(getenv("RL_WSYNC_TEST_SLOW_MS")));
	if (getenv("RL_WSYNC_TEST_SLOW_COMMIT_MS"))
		atomic_store(&test_slow_commit_ms, atoi(getenv("RL_WSYNC_TEST_SLOW_COMMIT_MS")));
	if (o->data_dir) {
		s->data_dir = rl_xstrdup(o->data_dir);
		if ((rv = server_load(s)) != 0)
			goto fail;
	}
	if ((r = nng_rep0_open(&s->sock)) != 0) {
		rv = rli_ws_nng_err(r, "cannot open socket for", url);
		goto fail;
	}
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, s->o.max_msg);
	if ((rv = rli_url_port_check_listen(url)) != 0)
		goto fail;
	{
		nng_listener l;
		nng_sockaddr sa;
		size_t n = strlen(url);
		if ((r = rli_nng_listen(s->sock, url, &l)) != 0) {
			rv = rli_ws_nng_err(r, "cannot listen on", url);
			goto fail;
		}
		snprintf(s->url, sizeof s->url, "%s", url);
		/* port 0: workers must be told the real one */
		if (strncmp(url, "tcp", 3) == 0 && n >= 2 && strcmp(url + n - 2, ":0") == 0 && n < sizeof s->url &&
		    nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) == 0 &&
		    (sa.s_family == NNG_AF_INET || sa.s_family == NNG_AF_INET6))
			snprintf(s->url + n - 1, sizeof s->url - (n - 1), "%u",
				 ntohs(sa.s_family == NNG_AF_INET ? sa.s_in.sa_port : sa.s_in6.sa_port));
		url = s->url;
	}
	rv = RL_ENOMEM;
	if ((s->ctxs = rl_try_calloc((size_t)s->o.contexts, sizeof(sctx), "contexts")) == NULL ||
	    (s->workers = rl_try_calloc((size_t)s->o.threads, sizeof(pthread_t), "threads")) == NULL)
		goto fail;
	for (int i = 0; i < s->o.contexts; i++) {
		sctx *c = &s->ctxs[i];
		c->s = s;
		if ((r = nng_aio_alloc(&c->aio, ctx_cb, c)) != 0 || (r = nng_ctx_open(&c->ctx, s->sock)) != 0) {
			rv = rli_ws_nng_err(r, "cannot open a context on", url);
			goto fail;
		}
		s->nctx++;
	}
	for (int i = 0; i < s->o.threads; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) {
			rv = RL_EIO;
			goto fail;
		}
		s->nworkers++;
	}
	if (pthread_create(&s->timer, NULL, timer_main, s) != 0) {
		rv = RL_EIO;
		goto fail;
	}
	s->timer_started = 1;
	bulk_open(s, url);
	if (s->o.shm >= 0 && strncmp(url, "inproc://", 9) != 0) {
		if (rl_wshm_hostid(s->hostid, sizeof s->hostid) != 0 || rl_wshm_srv_open2(&s->shm, shm_lookup, shm_take, s) != 0)
			rl_warn("no shared memory service: workers on this host use the stream");
	}
	for (int i = 0; i < s->nctx; i++)
		ctx_recv(&s->ctxs[i]);
	*out = s;
	return RL_OK;
fail:
	rl_wsync_server_close(s);
	return rv;
}

const char *
rl_wsync_server_url(const rl_wsync_server *s)
{
	return s->url;
}

/*
 * client.c — the rl-sync client: status and long-poll, fetching a version
 * (chunks in parallel over REQ/REP or the bulk stream, or a memfd from a
 * server on this host) and pushing one, with delta against a base.
 *
 * Leaves out: the service (server.c), the chunk codec (codec.c), the wire
 * helpers both sides use (wire.c).
 */
#include "base/auth.h"
#include "base/nngx.h"
#include "sync/wsync.h"
#include "sync/wsync_int.h"
#include "sync/wshm.h"
#include "base/core.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
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

/* ---- client ------------------------------------------------------------------------ */
struct rl_wsync_client {
	nng_socket sock;
	rl_wsync_client_opts o;
	char *url;
	nng_ctx ctx;
	nng_aio *aio;
	int local;                /* the server is on this host (loopback, ipc, inproc) */
	_Atomic uint64_t bulk_off_until_ms; /* the bulk stream was unreachable: REQ/REP until then */
	_Atomic uint64_t bytes_sent, bytes_recv, chunks, retries, raw_bytes, bulk_chunks, shm_versions;
	char hostid[24];          /* ours, "" if unknown */
	int last_push_shm;        /* the last push went over shared memory (no delta base needed) */
	rli_tls_ctx *btls;        /* tls+tcp://: the bulk stream's TLS context, made at its first use */
	rli_redial *rd;           /* the dialer, dialled again when a TLS reconnection stalls */
};

int rli_wsync_client_last_push_shm(const rl_wsync_client *c) { return c->last_push_shm; }

/* is url a server on this host?  Compression only costs CPU there. */
static int
url_is_local(const char *url)
{
	nng_url *u;
	int local = 0;

	if (strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0 || strncmp(url, "abstract://", 11) == 0)
		return 1;
	if (nng_url_parse(&u, url) != 0)
		return 0;
	local = strncmp(u->u_hostname, "127.", 4) == 0 || strcmp(u->u_hostname, "localhost") == 0 ||
		strcmp(u->u_hostname, "::1") == 0;
	nng_url_free(u);
	return local;
}

int
rl_wsync_client_open(rl_wsync_client **out, const char *url, const rl_wsync_client_opts *o)
{
	rl_wsync_client *c;
	int r, rv;

	*out = NULL;
	if ((c = rl_try_calloc(1, sizeof *c, "client")) == NULL)
		return RL_ENOMEM;
	if (o)
		c->o = *o;
	if (c->o.timeout_ms <= 0)
		c->o.timeout_ms = 10000;
	if (c->o.parallel <= 0)
		c->o.parallel = 4;
	if (c->o.level == 0)
		c->o.level = 1;
	if (c->o.chunk == 0)
		c->o.chunk = RL_WSYNC_CHUNK_DEFAULT;
	if (c->o.retries <= 0)
		c->o.retries = 3;
	if (getenv("RL_WSYNC_TEST_CORRUPT_PUSH")) /* test hook: this pusher's next n chunks go corrupted */
		rl_wsync_test_corrupt(atoi(getenv("RL_WSYNC_TEST_CORRUPT_PUSH")));
	if (c->o.max_msg == 0)
		c->o.max_msg = RL_WSYNC_CHUNK_MAX + 65536;
	if (c->o.max_bytes == 0)
		c->o.max_bytes = rli_ws_default_max_bytes();
	c->url = rl_xstrdup(url);
	c->local = url_is_local(url);
	if ((rv = rli_url_port_check(url)) != RL_OK)
		goto fail;
	if (c->o.transport < RL_WSYNC_T_AUTO || c->o.transport > RL_WSYNC_T_NNG) {
		rl_error("'%s': this client fetches with auto, shm, stream or nng", url);
		rv = RL_EINVAL;
		goto fail;
	}
	if (c->o.transport == RL_WSYNC_T_NNG)
		c->o.bulk = -1;
	if (rl_wshm_hostid(c->hostid, sizeof c->hostid) != 0)
		c->hostid[0] = 0;
	c->sock = (nng_socket)NNG_SOCKET_INITIALIZER;
	if (c->o.chunk < RL_WSYNC_PIECE || c->o.chunk > RL_WSYNC_CHUNK_MAX || c->o.chunk % RL_WSYNC_PIECE) {
		rl_error("chunk size %zu: must be a multiple of 1 MiB, at most %zu MiB", c->o.chunk,
			 RL_WSYNC_CHUNK_MAX >> 20);
		rv = RL_EINVAL;
		goto fail;
	}
	if ((r = nng_req0_open(&c->sock)) != 0) {
		rv = rli_ws_nng_err(r, "cannot open socket for", url);
		goto fail;
	}
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, c->o.max_msg);
	/* we retry ourselves; nng re-sends only after a reconnect or this long */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, 600000);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500);
	if ((r = rli_redial_open(&c->rd, c->sock, url, NNG_FLAG_NONBLOCK)) != 0) {
		rv = rli_ws_nng_err(r, "cannot dial", url);
		goto fail;
	}
	if ((r = nng_aio_alloc(&c->aio, NULL, NULL)) != 0 || (r = nng_ctx_open(&c->ctx, c->sock)) != 0) {
		rv = rli_ws_nng_err(r, "cannot open a context for", url);
		goto fail;
	}
	*out = c;
	return RL_OK;
fail:
	rl_wsync_client_close(c);
	return rv;
}

void
rl_wsync_client_close(rl_wsync_client *c)
{
	if (c == NULL)
		return;
	if (rli_nng_close_timed(c->sock, "rl-sync client"))
		rli_redial_free(c->rd);   /* else its callbacks may still run: left */
	if (c->aio)
		nng_aio_free(c->aio);
	rli_tls_ctx_free(c->btls);
	free(c->url);
	free(c);
}

void
rl_wsync_client_stats(rl_wsync_client *c, rl_wsync_stats *st, int reset)
{
	st->bytes_sent = c->bytes_sent;
	st->bytes_recv = c->bytes_recv;
	st->chunks = c->chunks;
	st->retries = c->retries;
	st->raw_bytes = c->raw_bytes;
	st->bulk_chunks = c->bulk_chunks;
	st->shm_versions = c->shm_versions;
	if (reset)
		c->bytes_sent = c->bytes_recv = c->chunks = c->retries = c->raw_bytes = c->bulk_chunks = c->shm_versions = 0;
}

/* one request and its reply on (ctx, aio).  *rep holds the reply message
 * (caller frees) when the return is RL_OK or the server's status; h points
 * into it.  Network failures return RL_ETIMEDOUT / RL_ENET, logged by caller. */
/* 1 for a server's refusal of the shared key (wire.c's messages) */
static int
n_auth_refusal(const whdr *h)
{
	static const char *const pre[] = { "this rl-sync server requires a shared key", "wrong shared key",
		"the request was seen before", "the request's time is" };

	for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
		if (h->bodyn >= strlen(pre[i]) && memcmp(h->body, pre[i], strlen(pre[i])) == 0)
			return 1;
	return 0;
}

static int
rpc(rl_wsync_client *c, nng_ctx ctx, nng_aio *aio, uint16_t op, uint64_t version, uint64_t a, uint64_t b,
    const void *b1, size_t n1, const void *b2, size_t n2, int timeout_ms, nng_msg **rep, whdr *h)
{
	nng_msg *m;
	uint8_t hd[WS_HDR], zero[WS_AUTH_HDR - WS_HDR] = { 0 };
	const char *why;
	int r, rv, authed = rli_auth_key(NULL) != NULL;

	*rep = NULL;
	if (nng_msg_alloc(&m, 0) != 0)
		return RL_ENOMEM;
	rli_ws_hdr_fill(hd, op, 0, version, a, b);
	if (nng_msg_reserve(m, WS_AUTH_HDR + n1 + n2) != 0 || nng_msg_append(m, hd, WS_HDR) != 0 ||
	    (authed && nng_msg_append(m, zero, sizeof zero) != 0) ||
	    (n1 && nng_msg_append(m, b1, n1) != 0) || (n2 && nng_msg_append(m, b2, n2) != 0)) {
		nng_msg_free(m);
		return RL_ENOMEM;
	}
	if (authed)
		rli_ws_auth_sign(nng_msg_body(m), nng_msg_len(m), strncmp(c->url, "tls+", 4) == 0);
	nng_aio_set_timeout(aio, timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
	nng_aio_set_msg(aio, m);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	if ((r = nng_aio_result(aio)) != 0) {
		nng_msg_free(m);
		if (r == NNG_ETIMEDOUT)
			rli_redial_check(c->rd);   /* no connection: a stalled TLS dialer? */
		return r == NNG_ETIMEDOUT ? RL_ETIMEDOUT : r == NNG_ECLOSED ? RL_ECLOSED : RL_ENET;
	}
	c->bytes_sent += WS_HDR + n1 + n2;
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((r = nng_aio_result(aio)) != 0)
		return r == NNG_ETIMEDOUT ? RL_ETIMEDOUT : r == NNG_ECLOSED ? RL_ECLOSED : RL_ENET;
	m = nng_aio_get_msg(aio);
	c->bytes_recv += nng_msg_len(m);
	if ((rv = rli_ws_hdr_parse(h, nng_msg_body(m), nng_msg_len(m), &why)) != 0) {
		rl_error("'%s': %s in reply", c->url, why);
		nng_msg_free(m);
		return rv;
	}
	if (h->op != (op | OP_REPLY) && h->op != OP_REPLY) {
		rl_error("'%s': reply to the wrong request (op %u)", c->url, h->op);
		nng_msg_free(m);
		return RL_EFORMAT;
	}
	*rep = m;
	if (h->status < 0 || h->status >= RL_ERR_COUNT)
		return RL_EFORMAT;
	if (h->status == RL_EINVAL && n_auth_refusal(h)) {
		/* callers name only the op; the server's reason is what to fix */
		rl_error("'%s': %.*s", c->url, (int)RL_MIN(h->bodyn, (size_t)300), (const char *)h->body);
	}
	return h->status;
}

/* the server's message text from an error reply, for the log */
static const char *
rep_text(const whdr *h, char *buf, size_t n)
{
	size_t k = RL_MIN(h->bodyn, n - 1);

	memcpy(buf, h->body, k);
	buf[k] = 0;
	for (size_t i = 0; i < k; i++)
		if (buf[i] < 32 || buf[i] > 126)
			buf[i] = '?';
	return buf;
}

static int
net_fail(rl_wsync_client *c, int rv, const char *what)
{
	if (rv == RL_ETIMEDOUT) {
		rl_error("%s: no answer from '%s' within %d ms", what, c->url, c->o.timeout_ms);
		rl_hint("is 'rl-sync serve --listen %s' running?", c->url);
	} else {
		rl_error("%s: '%s': %s", what, c->url, rl_strerror(rv));
	}
	return rv;
}

int
rl_wsync_status(rl_wsync_client *c, char **json)
{
	nng_msg *m;
	whdr h;
	int rv;

	*json = NULL;
	if ((rv = rpc(c, c->ctx, c->aio, OP_STATUS, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		return net_fail(c, rv, "status");
	}
	if ((*json = malloc(h.bodyn + 1)) == NULL) {
		nng_msg_free(m);
		return RL_ENOMEM;
	}
	memcpy(*json, h.body, h.bodyn);
	(*json)[h.bodyn] = 0;
	nng_msg_free(m);
	return RL_OK;
}

static int poll_line(rl_wsync_client *c, uint64_t have, uint64_t wlin, int timeout_ms, uint64_t *latest,
		     uint64_t *lineage);

int
rl_wsync_poll(rl_wsync_client *c, uint64_t have, int timeout_ms, uint64_t *latest)
{
	uint64_t lin;

	return poll_line(c, have, 0, timeout_ms, latest, &lin);
}

int
rl_wsync_poll_line(rl_wsync_client *c, uint64_t have, uint64_t lineage, int timeout_ms, uint64_t *latest,
		   uint64_t *latest_lineage)
{
	return poll_line(c, have, WAIT_LINEAGE | lineage, timeout_ms, latest, latest_lineage);
}

/* wlin: 0 (versions above have only) or WAIT_LINEAGE | the caller's lineage */
static int
poll_line(rl_wsync_client *c, uint64_t have, uint64_t wlin, int timeout_ms, uint64_t *latest, uint64_t *lineage)
{
	double end = timeout_ms < 0 ? 1e300 : rl_now() + timeout_ms / 1e3;

	*lineage = wlin & ~WAIT_LINEAGE;
	for (;;) {
		double left = end - rl_now();
		int ask = left > WS_WAIT_MAX_MS / 1e3 ? WS_WAIT_MAX_MS : left > 0 ? (int)(left * 1e3) : 0;
		nng_msg *m;
		whdr h;
		int rv = rpc(c, c->ctx, c->aio, OP_WAIT, wlin, have, (uint64_t)ask, NULL, 0, NULL, 0,
			     ask + RL_MIN(c->o.timeout_ms, 2000),
			     &m, &h);

		if (m)
			nng_msg_free(m);
		if (m && (rv == RL_OK || rv == RL_ETIMEDOUT))
			*lineage = h.a; /* a server from before rewinds says 0 */
		if (rv == RL_OK) {
			*latest = h.version;
			return RL_OK;
		}
		if (rv != RL_ETIMEDOUT)
			return net_fail(c, rv, "wait");
		/* the server answered "nothing yet", or did not answer (restarting): ask again */
		if (rl_now() >= end) {
			if (m == NULL) {
				/* the wait given plus up to 2 s, not the request timeout */
				rl_error("wait: no answer from '%s' within %.0f ms", c->url,
					 (rl_now() - end) * 1e3 + RL_MAX(timeout_ms, 0));
				rl_hint("is 'rl-sync serve --listen %s' running?", c->url);
				return RL_ENET;
			}
			*latest = h.version;
			return RL_ETIMEDOUT;
		}
		if (m == NULL)
			rl_verbose("wait: no answer from '%s', asking again", c->url);
	}
}

/* ---- client: bulk stream ------------------------------------------------------------ */
#define BULK_CONNECT_MS 2000   /* connecting to the bulk stream; REQ/REP works without it */
#define BULK_BACKOFF_MS 60000  /* after a failed connect, REQ/REP only for this long */
typedef struct bstream {
	int fd;
	wbio io;
} bstream;

static void
bstream_close(bstream *b)
{
	rli_tls_sock_close(b->io.tls);
	b->io.tls = NULL;
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
}

/* connect to a bulk URL (tcp://host:port or ipc://path) within ms; each
 * send or receive then times out after io_ms */
static int
bstream_open(bstream *b, const char *url, int ms, int io_ms)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL, *a;
	nng_url *u = NULL;
	int rv = RL_ENET;

	b->fd = -1;
	b->io = (wbio){ .fd = -1, .tls = NULL };
	if (strncmp(url, "ipc://", 6) == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + 6) >= (int)sizeof sa.sun_path ||
		    (b->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || connect(b->fd, (void *)&sa, sizeof sa) != 0)
			goto out;
		rli_ws_sock_timeouts(b->fd, io_ms);
		rv = RL_OK;
		goto out;
	}
	if (nng_url_parse(&u, url) != 0 || getaddrinfo(u->u_hostname, u->u_port, &hints, &ai) != 0)
		goto out;
	for (a = ai; a && rv != RL_OK; a = a->ai_next) {
		struct pollfd pf;
		int err = 0;
		socklen_t el = sizeof err;
		/* a non-blocking connect, so an unreachable host costs ms, not minutes */
		if ((b->fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
			continue;
		if (connect(b->fd, a->ai_addr, a->ai_addrlen) != 0) {
			pf = (struct pollfd){ .fd = b->fd, .events = POLLOUT };
			if (errno != EINPROGRESS || poll(&pf, 1, ms) != 1 ||
			    getsockopt(b->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
				bstream_close(b);
				continue;
			}
		}
		fcntl(b->fd, F_SETFL, fcntl(b->fd, F_GETFL) & ~O_NONBLOCK);
		rli_ws_sock_timeouts(b->fd, io_ms);
		rv = RL_OK;
	}
out:
	if (rv != RL_OK)
		bstream_close(b);
	b->io.fd = b->fd;
	if (ai)
		freeaddrinfo(ai);
	nng_url_free(u);
	return rv;
}

/* n bytes into d, XXH64-hashed (seed 0) as they arrive: each part is hashed
 * right after the kernel copied it, while it is still in cache */
#define BSTREAM_PART ((size_t)256 << 10)
static int
bstream_recv_hash(bstream *b, uint8_t *d, size_t n, uint64_t *hash)
{
	size_t got = 0, done = 0;
	rl_hash64_state s;

	rl_hash64_init(&s, 0);
	while (got < n) {
		size_t r;
		int rv = rli_wb_recv_some(&b->io, d + got, RL_MIN(n - got, BSTREAM_PART), &r);
		if (rv != RL_OK)
			return rv == RL_ETIMEDOUT ? rv : RL_ENET;
		got += r;
		if ((got & ~(size_t)31) > done) {
			rl_hash64_stripes(&s, d + done, (got & ~(size_t)31) - done);
			done = got & ~(size_t)31;
		}
	}
	*hash = rl_hash64_final(&s, d + done, n - done);
	return RL_OK;
}

/* all n bytes at p, sent or received */
static int
bstream_io(bstream *b, int send, void *p, size_t n)
{
	int rv = send ? rli_wb_send2(&b->io, p, n, NULL, 0) : rli_wb_recv(&b->io, p, n);

	return rv == RL_OK || rv == RL_ETIMEDOUT ? rv : RL_ENET;
}

/* over tls+tcp:// the bulk connection is TLS with this client's
 * certificate, the server's checked against the host dialled as on the
 * REQ/REP socket (c->btls, made before the transfer's threads start) */
static int
bstream_tls(rl_wsync_client *c, bstream *b, const char *url)
{
	char why[320];
	int rv;

	if (c->btls == NULL)
		return RL_OK;
	if ((rv = rli_tls_sock_open(&b->io.tls, c->btls, b->fd, why, sizeof why)) != RL_OK)
		rl_verbose("bulk stream at '%s': TLS handshake failed: %s", url, why);
	return rv;
}

/* where the server's bulk stream is, as this client reaches it */
static int
bulk_where(rl_wsync_client *c, char *out, size_t n)
{
	nng_msg *m;
	whdr h;
	nng_url *u;
	int rv, ok = 0;

	if ((rv = rpc(c, c->ctx, c->aio, OP_DATA, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		return rv == RL_OK ? RL_ENOTSUP : rv;
	}
	if (strncmp(c->url, "ipc://", 6) == 0) {
		/* next to the path this client dialled, nowhere else */
		ok = snprintf(out, n, "%s.bulk", c->url) < (int)n && h.bodyn == strlen(out) &&
		     memcmp(h.body, out, h.bodyn) == 0;
	} else if (h.a > 0 && h.a < 65536 && nng_url_parse(&u, c->url) == 0) {
		/* the host this client dialled, the port the server was given */
		const char *hn = u->u_hostname;
		ok = snprintf(out, n, strchr(hn, ':') ? "%s://[%s]:%u" : "%s://%s:%u", u->u_scheme, hn,
			      (unsigned)h.a) < (int)n;
		nng_url_free(u);
	}
	nng_msg_free(m);
	return ok ? RL_OK : RL_ENOTSUP;
}

/* ---- parallel chunk transfer (fetch and push) ----------------------------------- */
typedef struct xfer {
	rl_wsync_client *c;
	rl_wver *v;               /* destination (fetch) or source (push) */
	const rl_wver *base;      /* delta base or NULL */
	cref *ch;
	size_t nchunks;
	atomic_size_t next;
	atomic_int err;
	int push;
	uint64_t part_tag;        /* push: 0, or a part's index + 1 (PUSH_PART) */
	int stored;               /* fetch: whole chunks uncompressed */
	const char *bulk;         /* fetch: the bulk stream's URL, or NULL */
	size_t batch;             /* chunks per bulk request */
} xfer;

/* chunk i over REQ/REP; `tried` tries were spent on it already (bulk) */
static int
fetch_one(xfer *x, nng_ctx ctx, nng_aio *aio, size_t i, int tried)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	rl_wblob *b = &x->v->blobs[cr->blob];
	int rv = RL_OK;

	for (int attempt = tried; attempt <= c->o.retries; attempt++) {
		nng_msg *m;
		whdr h;
		uint32_t flags;
		const uint8_t *base = NULL;
		char buf[256];

		if (attempt > 0)
			c->retries++;
		rv = rpc(c, ctx, aio, OP_CHUNK, x->v->version, i,
			 (x->base ? x->base->version : 0) | (x->stored ? CHUNK_STORED : 0), NULL, 0, NULL, 0,
			 c->o.timeout_ms, &m, &h);
		if (rv == RL_ETIMEDOUT) {
			if (m)
				nng_msg_free(m);
			continue;
		}
		if (rv != RL_OK) {
			if (m && rv == RL_EINVAL) {
				/* chunk out of range: the server's chunking changed (a restart) */
				rl_verbose("chunk %zu of version %llu: server says: %s", i,
					   (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				nng_msg_free(m);
				return RL_ESTALE;
			}
			if (m) {
				/* ENOENT: the server moved on to a newer version; the caller fetches that */
				if (rv == RL_ENOENT)
					rl_verbose("chunk %zu of version %llu: server says: %s", i,
						   (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				else
					rl_error("chunk %zu of version %llu: server says: %s", i,
						 (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				nng_msg_free(m);
			} else {
				net_fail(c, rv, "fetch");
			}
			return rv;
		}
		rv = RL_EFORMAT;
		if (h.bodyn >= CB_HDR && h.a == i && get64(h.body + 8) != cr->len) {
			rl_verbose("chunk %zu of version %llu: the server's chunking changed", i,
				   (unsigned long long)x->v->version);
			nng_msg_free(m);
			return RL_ESTALE;
		}
		if (h.bodyn >= CB_HDR && h.a == i) {
			flags = get32(h.body);
			if (flags & RL_WENC_DELTA) {
				if (x->base && h.b == x->base->version)
					base = x->base->blobs[cr->blob].data + cr->off;
				else
					flags = ~0u; /* a delta we did not ask for: refused below */
			}
			if (flags != ~0u)
				rv = rli_ws_decode_chunk(b->data + cr->off, cr->len, h.body + CB_HDR, h.bodyn - CB_HDR, flags, base,
						  (int)get32(h.body + 4), b->pieces + cr->off / RL_WSYNC_PIECE);
		}
		c->bytes_recv += 0;
		nng_msg_free(m);
		if (rv == RL_OK) {
			c->chunks++;
			c->raw_bytes += cr->len;
			return RL_OK;
		}
		if (rv == RL_ECHECKSUM)
			rl_warn("chunk %zu of version %llu ('%s' at byte %llu) failed its checksum; asking again", i,
				(unsigned long long)x->v->version, b->name, (unsigned long long)cr->off);
		else
			rl_warn("chunk %zu of version %llu ('%s' at byte %llu) is malformed (%s); asking again", i,
				(unsigned long long)x->v->version, b->name, (unsigned long long)cr->off, rl_strerror(rv));
		rv = RL_ECHECKSUM;
	}
	if (rv == RL_ETIMEDOUT)
		return net_fail(c, rv, "fetch");
	rl_error("chunk %zu of version %llu still bad after %d tries", i, (unsigned long long)x->v->version,
		 c->o.retries + 1);
	return rv;
}

static void
xfer_fail(xfer *x, int rv)
{
	int zero = 0;

	atomic_compare_exchange_strong(&x->err, &zero, rv);
}

/* the next up to `want` chunks for this thread: their count, first at *first */
static size_t
xfer_claim(xfer *x, size_t want, size_t *first)
{
	size_t i = atomic_fetch_add(&x->next, want);

	if (i >= x->nchunks || atomic_load(&x->err) != 0)
		return 0;
	*first = i;
	return RL_MIN(want, x->nchunks - i);
}

static int
bulk_ask(xfer *x, bstream *b, size_t first, size_t count)
{
	uint8_t r[WB_HDR + WS_AUTH_EXTRA] = { 0 };
	size_t n = rli_auth_key(NULL) ? WB_HDR + WS_AUTH_EXTRA : WB_HDR;

	put32(r, WB_MAGIC);
	put16(r + 4, WB_PROTO);
	put16(r + 6, WB_GET);
	put32(r + 8, WB_HDR);
	put64(r + 16, x->v->version);
	put64(r + 24, first);
	put64(r + 32, count);
	if (n > WB_HDR)
		rli_ws_auth_sign_at(r, WB_HDR, n);
	x->c->bytes_sent += n;
	return bstream_io(b, 1, r, n);
}

/* chunk i, the next one the stream sends, straight into its place: RL_OK;
 * RL_ECHECKSUM (the bytes came but are bad; the stream is still in step); or
 * another error (the stream is out of step, gone, or refused the range) */
static int
bulk_recv_one(xfer *x, bstream *b, size_t i)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	rl_wblob *bl = &x->v->blobs[cr->blob];
	uint8_t h[WB_HDR];
	uint64_t len;
	int rv, bad = 0;

	if ((rv = bstream_io(b, 0, h, WB_HDR)) != 0)
		return rv;
	len = get64(h + 32);
	if (get32(h) != WB_MAGIC || get16(h + 4) != WB_PROTO || get16(h + 6) != (WB_GET | OP_REPLY) ||
	    get32(h + 8) != WB_HDR)
		return RL_EFORMAT;
	if (get32(h + 12) != RL_OK) {
		char msg[256];
		size_t k = (size_t)RL_MIN(len, (uint64_t)sizeof msg - 1);
		if (bstream_io(b, 0, msg, k) == RL_OK) {
			msg[k] = 0;
			rl_verbose("bulk: server says: %s", msg);
		}
		return RL_ENOENT;
	}
	if (get64(h + 16) != x->v->version || get64(h + 24) != i || len != cr->len)
		return RL_EFORMAT;
	c->bytes_recv += WB_HDR + len;
	/* piece by piece, each hashed while it is still in cache */
	for (size_t o = 0; o < cr->len; o += RL_WSYNC_PIECE) {
		size_t n = RL_MIN(RL_WSYNC_PIECE, cr->len - o);
		uint8_t *d = bl->data + cr->off + o;
		uint64_t hv;
		if ((rv = bstream_recv_hash(b, d, n, &hv)) != 0)
			return rv;
		bad |= hv != bl->pieces[(cr->off + o) / RL_WSYNC_PIECE];
	}
	if (bad) {
		rl_warn("chunk %zu of version %llu ('%s' at byte %llu) failed its checksum; asking again", i,
			(unsigned long long)x->v->version, bl->name, (unsigned long long)cr->off);
		return RL_ECHECKSUM;
	}
	c->chunks++;
	c->bulk_chunks++;
	c->raw_bytes += cr->len;
	return RL_OK;
}

/* whole raw chunks over the bulk stream: ranges of x->batch chunks, the
 * next range asked for before the current one is read (no round trip
 * between ranges).  A bad chunk is asked for again over REQ/REP (its first
 * try spent); if the stream fails, the rest goes over REQ/REP.  Returns an
 * error only for a chunk REQ/REP could not fetch either. */
static int
xfer_bulk(xfer *x, nng_ctx ctx, nng_aio *aio)
{
	bstream b;
	size_t a0 = 0, an, b0 = 0, bn;
	int rv = RL_OK, up;

	if (bstream_open(&b, x->bulk, RL_MIN(x->c->o.timeout_ms, BULK_CONNECT_MS), x->c->o.timeout_ms) != RL_OK ||
	    bstream_tls(x->c, &b, x->bulk) != RL_OK) {
		/* a firewall, or a TLS handshake refused: do not try again for a while */
		bstream_close(&b);
		rl_verbose("cannot reach the bulk stream at '%s'; using REQ/REP", x->bulk);
		atomic_store(&x->c->bulk_off_until_ms, (uint64_t)(rl_now() * 1e3) + BULK_BACKOFF_MS);
		return RL_OK;
	}
	up = 1;
	an = xfer_claim(x, x->batch, &a0);
	if (an > 0 && bulk_ask(x, &b, a0, an) != RL_OK)
		up = 0;
	while (an > 0) {
		bn = xfer_claim(x, x->batch, &b0);
		if (bn > 0 && up && bulk_ask(x, &b, b0, bn) != RL_OK)
			up = 0;
		for (size_t i = a0; i < a0 + an && rv == RL_OK; i++) {
			int r = up ? bulk_recv_one(x, &b, i) : RL_ENET;
			if (r == RL_OK)
				continue;
			if (r != RL_ECHECKSUM && up) {
				rl_verbose("bulk stream: %s; going on over REQ/REP", rl_strerror(r));
				up = 0;
			}
			rv = fetch_one(x, ctx, aio, i, r == RL_ECHECKSUM);
		}
		if (rv != RL_OK)
			break;
		a0 = b0;
		an = bn;
	}
	bstream_close(&b);
	return rv;
}

static int
push_one(xfer *x, nng_ctx ctx, nng_aio *aio, size_t i)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	const rl_wblob *b = &x->v->blobs[cr->blob];
	uint8_t cb[CB_HDR + SEG_HDR], *e = NULL;
	const uint8_t *pay;
	size_t en, hn = CB_HDR;
	uint32_t flags = 0;
	int rv;

	if (x->stored && x->base == NULL) {
		/* one stored segment: the raw bytes go into the message as they are */
		memset(cb + CB_HDR, 0, SEG_HDR);
		put32(cb + CB_HDR, (uint32_t)cr->len);
		hn += SEG_HDR;
		pay = b->data + cr->off;
		en = cr->len;
	} else {
		if ((rv = rl_wsync_encode(&e, &en, &flags, b->data + cr->off,
					  x->base ? x->base->blobs[cr->blob].data + cr->off : NULL, cr->len, b->elem,
					  c->o.level)) != 0)
			return rv;
		pay = e;
	}
	put32(cb, flags);
	put32(cb + 4, (uint32_t)b->elem);
	put64(cb + 8, cr->len);
	for (int attempt = 0; attempt <= c->o.retries; attempt++) {
		nng_msg *m;
		whdr h;
		char buf[256];

		if (attempt > 0)
			c->retries++;
		if (en > 0 && atomic_load(&rli_ws_test_corrupt) > 0 && atomic_fetch_sub(&rli_ws_test_corrupt, 1) > 0) {
			/* test hook: this attempt carries one flipped byte */
			uint8_t *bad = malloc(en);
			if (bad) {
				memcpy(bad, pay, en);
				bad[en / 2] ^= 0x5a;
				rv = rpc(c, ctx, aio, OP_PUSH_CHUNK, x->v->version, i, x->part_tag, cb, hn, bad, en, c->o.timeout_ms,
					 &m, &h);
				free(bad);
				goto sent;
			}
		}
		rv = rpc(c, ctx, aio, OP_PUSH_CHUNK, x->v->version, i, x->part_tag, cb, hn, pay, en, c->o.timeout_ms, &m,
			 &h);
sent:
		if (rv == RL_OK) {
			c->chunks++;
			c->raw_bytes += cr->len;
		} else if (m && rv != RL_ECHECKSUM) {
			rl_error("pushing chunk %zu of version %llu: server says: %s", i, (unsigned long long)x->v->version,
				 rep_text(&h, buf, sizeof buf));
		}
		if (m)
			nng_msg_free(m);
		if (rv == RL_OK || (rv != RL_ECHECKSUM && rv != RL_ETIMEDOUT))
			break;
	}
	free(e);
	if (rv == RL_ETIMEDOUT)
		net_fail(c, rv, "push");
	else if (rv == RL_ECHECKSUM)
		rl_error("chunk %zu of version %llu rejected by the server after %d tries", i,
			 (unsigned long long)x->v->version, c->o.retries + 1);
	return rv;
}

static void *
xfer_main(void *arg)
{
	xfer *x = arg;
	nng_ctx ctx;
	nng_aio *aio = NULL;
	int r;

	if ((r = nng_aio_alloc(&aio, NULL, NULL)) != 0 || (r = nng_ctx_open(&ctx, x->c->sock)) != 0) {
		if (aio)
			nng_aio_free(aio);
		atomic_store(&x->err, RL_ENET);
		return NULL;
	}
	if (x->bulk && (r = xfer_bulk(x, ctx, aio)) != RL_OK)
		xfer_fail(x, r);
	for (;;) {
		size_t i = atomic_fetch_add(&x->next, 1);
		int rv;
		if (i >= x->nchunks || atomic_load(&x->err) != 0)
			break;
		rv = x->push ? push_one(x, ctx, aio, i) : fetch_one(x, ctx, aio, i, 0);
		if (rv != 0) {
			xfer_fail(x, rv);
			break;
		}
	}
	nng_ctx_close(ctx);
	nng_aio_free(aio);
	return NULL;
}

static int
xfer_run(xfer *x)
{
	int np = (int)RL_MIN((size_t)x->c->o.parallel, x->nchunks ? x->nchunks : 1);
	pthread_t th[64];
	int started = 0;

	if (np > 64)
		np = 64;
	for (; started < np; started++)
		if (pthread_create(&th[started], NULL, xfer_main, x) != 0)
			break;
	if (started == 0)
		return RL_EIO;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	return atomic_load(&x->err);
}

/* the server's shared memory service if it runs on this host (its host id
 * is ours): its socket name.  RL_ENOTSUP when not. */
static int
shm_where(rl_wsync_client *c, char *name, size_t n)
{
	nng_msg *m;
	whdr h;
	const char *sp;
	size_t hl, nl;
	int rv;

	if (c->hostid[0] == 0)
		return RL_ENOTSUP;
	if ((rv = rpc(c, c->ctx, c->aio, OP_SHM, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		/* an older server answers "unknown operation" */
		return rv == RL_EINVAL ? RL_ENOTSUP : rv;
	}
	sp = memchr(h.body, ' ', h.bodyn);
	hl = sp ? (size_t)(sp - (const char *)h.body) : 0;
	nl = sp ? h.bodyn - hl - 1 : 0;
	rv = RL_ENOTSUP;
	if (sp == NULL || hl != strlen(c->hostid) || memcmp(h.body, c->hostid, hl) != 0) {
		rl_verbose("'%s' runs on another host (or boot): no shared memory", c->url);
	} else if (nl == 0 || nl >= n) {
		rv = RL_EFORMAT;
	} else {
		memcpy(name, sp + 1, nl);
		name[nl] = 0;
		rv = RL_OK;
	}
	nng_msg_free(m);
	return rv;
}

/* v (a decoded manifest) from the server's memfd: mapped read-only and
 * verified once; with dst the bytes are then copied into dst's buffers
 * (which v points to) and the mapping dropped.  On failure v is as it was. */
static int
fetch_shm(rl_wsync_client *c, rl_wver *v, rl_wver *dst)
{
	char name[128];
	uint64_t got = 0, size = 0;
	uint8_t **old = NULL;
	int fd = -1, oldb = v->borrowed, rv;

	if ((rv = shm_where(c, name, sizeof name)) != 0)
		return rv;
	if ((rv = rl_wshm_recv(&fd, &got, &size, name, v->version, c->o.timeout_ms)) != 0)
		return rv;
	if (got != v->version || size != rl_wshm_size(v)) {
		close(fd);
		return RL_EFORMAT;
	}
	if ((old = rl_try_calloc((size_t)v->nblobs + 1, sizeof *old, "blob table")) == NULL) {
		close(fd);
		return RL_ENOMEM;
	}
	for (int i = 0; i < v->nblobs; i++)
		old[i] = v->blobs[i].data;
	rv = rl_wshm_map(v, fd);
	close(fd); /* the mapping keeps the object alive */
	if (rv == RL_OK && (rv = rl_wver_verify(v)) != 0)
		rl_warn("version %llu: the shared memory object does not match its checksums",
			(unsigned long long)v->version);
	if (rv != RL_OK) {
		if (v->map)
			munmap(v->map, v->mapn);
		v->map = NULL;
		v->mapn = 0;
		for (int i = 0; i < v->nblobs; i++)
			v->blobs[i].data = old[i];
		v->borrowed = oldb;
		free(old);
		return rv;
	}
	for (int i = 0; i < v->nblobs; i++) {
		if (dst) {
			if (v->blobs[i].size)
				memcpy(old[i], v->blobs[i].data, (size_t)v->blobs[i].size);
			v->blobs[i].data = old[i];
		} else if (oldb != 1) {
			free(old[i]);
		}
	}
	if (dst) {
		munmap(v->map, v->mapn);
		v->map = NULL;
		v->mapn = 0;
		v->borrowed = oldb;
	}
	free(old);
	c->shm_versions++;
	c->raw_bytes += rl_wver_total(v);
	rl_verbose("version %llu: mapped from shared memory '@%s'%s", (unsigned long long)v->version, name,
		   dst ? ", copied into the buffer" : "");
	return RL_OK;
}

/* fetch into dst (NULL: allocate) */
static int
fetch(rl_wsync_client *c, rl_wver **out, rl_wver *dst, uint64_t version, const rl_wver *base)
{
	nng_msg *m = NULL;
	whdr h;
	rl_wver *v = NULL;
	uint32_t chunk;
	uint64_t db, lin;
	const char *why;
	char buf[256], burl[320];
	xfer x;
	int rv;

	memset(&x, 0, sizeof x);
	for (int attempt = 0;; attempt++) {
		rv = rpc(c, c->ctx, c->aio, OP_MANIFEST, version, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h);
		if (rv != RL_ETIMEDOUT || attempt >= c->o.retries)
			break;
		if (m)
			nng_msg_free(m);
	}
	if (rv != 0) {
		if (m) {
			/* ENOENT: the version was replaced by a newer one (rl_wsync_fetch_newest) */
			if (rv == RL_ENOENT)
				rl_verbose("fetch: server says: %s", rep_text(&h, buf, sizeof buf));
			else
				rl_error("fetch: server says: %s", rep_text(&h, buf, sizeof buf));
			nng_msg_free(m);
			return rv;
		}
		return net_fail(c, rv, "fetch");
	}
	rv = rli_ws_manifest_decode(&v, &chunk, &db, h.body, h.bodyn, &why, dst == NULL, c->o.max_bytes);
	lin = h.a;
	nng_msg_free(m);
	if (rv != 0) {
		rl_error("fetch: '%s': %s", c->url, why);
		return rv;
	}
	v->lineage = lin;
	if (dst) {
		if (!rli_ws_same_layout(dst, v)) {
			rl_error("fetch: version %llu has another layout (blob names or sizes) than the buffer given",
				 (unsigned long long)v->version);
			rv = RL_ESHAPE;
			goto out;
		}
		for (int i = 0; i < v->nblobs; i++)
			v->blobs[i].data = dst->blobs[i].data;
		dst->version = 0; /* not a valid version until this succeeds */
	}
	if (c->o.transport == RL_WSYNC_T_AUTO || c->o.transport == RL_WSYNC_T_SHM) {
		if ((rv = fetch_shm(c, v, dst)) == RL_OK)
			goto done;
		if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("fetch: version %llu over shared memory from '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			if (rv == RL_ENOTSUP)
				rl_hint("the server must run on this host (and its shared memory service be on); "
					"use --transport auto or stream");
			goto out;
		}
		rl_verbose("version %llu: not over shared memory (%s); fetching over the %s", (unsigned long long)v->version,
			   rl_strerror(rv), c->o.bulk >= 0 ? "stream" : "REQ/REP socket");
	}
	x.c = c;
	x.v = v;
	/* a base of another line (a worker that held a version a rewind
	 * dropped) has the number but not the bytes: whole chunks then */
	if (base && db != 0 && base->version == db && base->lineage == v->lineage && rli_ws_same_layout(base, v))
		x.base = base;
	if ((rv = rli_ws_chunk_table(&x.ch, &x.nchunks, v, chunk)) != 0)
		goto out;
	x.stored = c->o.stored > 0 || (c->o.stored == 0 && c->local);
	x.batch = RL_MAX((size_t)1, ((size_t)16 << 20) / chunk);
	if (x.stored && x.base == NULL && c->o.bulk >= 0 && (uint64_t)(rl_now() * 1e3) >= c->bulk_off_until_ms &&
	    bulk_where(c, burl, sizeof burl) == RL_OK)
		x.bulk = burl;
	if (x.bulk && strncmp(c->url, "tls+", 4) == 0 && c->btls == NULL) {
		/* test hook: the bulk stream checks the server against another
		 * name, so its handshake fails where REQ/REP's passed */
		const char *name = getenv("RL_SYNC_TEST_BULK_TLS_NAME");
		char u[300];
		snprintf(u, sizeof u, "tls+tcp://%s:1", name ? name : "");
		if (rli_nng_tls_ctx(&c->btls, 0, name && *name ? u : c->url) != RL_OK) {
			rl_verbose("no TLS context for the bulk stream; using REQ/REP");
			x.bulk = NULL;
		}
	}
	rl_verbose("fetching version %llu: %zu chunks%s%s", (unsigned long long)v->version, x.nchunks,
		   x.base ? " as a delta" : x.stored ? ", uncompressed" : "", x.bulk ? " over the bulk stream" : "");
	if ((rv = xfer_run(&x)) != 0)
		goto out;
done:
	if (dst) {
		dst->version = v->version;
		dst->hash = v->hash;
		dst->lineage = v->lineage;
		for (int i = 0; i < v->nblobs; i++) {
			free(dst->blobs[i].pieces);
			dst->blobs[i].pieces = v->blobs[i].pieces;
			v->blobs[i].pieces = NULL;
			dst->blobs[i].hash = v->blobs[i].hash;
			dst->blobs[i].elem = v->blobs[i].elem;
		}
	} else {
		*out = v;
		v = NULL;
	}
out:
	free(x.ch);
	rl_wver_destroy(v);
	return rv;
}

int
rl_wsync_fetch(rl_wsync_client *c, rl_wver **out, uint64_t version, const rl_wver *base)
{
	int rv;

	*out = NULL;
	/* RL_ESTALE: the server restarted with other chunk indices; start over once */
	if ((rv = fetch(c, out, NULL, version, base)) == RL_ESTALE)
		rv = fetch(c, out, NULL, version, base);
	return rv;
}

int
rl_wsync_fetch_into(rl_wsync_client *c, rl_wver *dst, uint64_t version, const rl_wver *base)
{
	int rv;

	if (dst == base) {
		rl_error("fetch: the buffer and the delta base must differ");
		return RL_EINVAL;
	}
	if ((rv = fetch(c, NULL, dst, version, base)) == RL_ESTALE)
		rv = fetch(c, NULL, dst, version, base);
	return rv;
}

/* push v's bytes as one sealed memfd handed to the server's shared memory
 * service (after PUSH_BEGIN of a whole version) */
static int
push_shm(rl_wsync_client *c, rl_wver *v, const char *name)
{
	double t = rl_now();
	int fd, rv, bad = atomic_load(&rli_ws_test_corrupt) > 0 && atomic_fetch_sub(&rli_ws_test_corrupt, 1) > 0;

	if ((rv = rl_wshm_make(&fd, v, 0, bad)) != 0)
		return rv;
	rv = rl_wshm_send(name, v->version, fd, c->o.timeout_ms * 6);
	close(fd);
	if (rv == RL_OK) {
		c->shm_versions++;
		c->raw_bytes += rl_wver_total(v);
		rl_verbose("version %llu: handed over as shared memory '@%s' in %.3f s", (unsigned long long)v->version,
			   name, rl_now() - t);
	}
	return rv;
}

static int push_once(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int last, uint64_t flags, int *published);
static int push_retry(rl_wsync_client *c, rl_wver *v, const rl_wver *base, uint64_t flags, int *published);

/* A server restarted during a push has forgotten it (its chunks and commit are
 * answered "no push of version N in progress", RL_ENOENT): the whole push is
 * made again, whole (the new server may not hold the delta's base), at most
 * twice; the trainer still holds every byte of the version. */
int
rl_wsync_push(rl_wsync_client *c, rl_wver *v, const rl_wver *base)
{
	return push_retry(c, v, base, 0, NULL);
}

int
rl_wsync_push_part(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int index, int count, int *published)
{
	int pub = 0, rv;

	if (count < 1 || count > PUSH_PART_MAX || index < 0 || index >= count) {
		rl_error("push: part %d of %d: the count must be 1..%d and the index below it", index, count,
			 PUSH_PART_MAX);
		return RL_EINVAL;
	}
	rv = push_retry(c, v, base, PUSH_PART_A(index, count), &pub);
	if (published)
		*published = pub;
	return rv;
}

int
rl_wsync_push_rewind(rl_wsync_client *c, rl_wver *v)
{
	int rv = push_retry(c, v, NULL, PUSH_REWIND, NULL);

	if (rv == RL_OK)
		rl_verbose("push: the server's line is version %llu's now (line %llu)", (unsigned long long)v->version,
			   (unsigned long long)v->lineage);
	return rv;
}

static int
push_retry(rl_wsync_client *c, rl_wver *v, const rl_wver *base, uint64_t flags, int *published)
{
	int rv;

	for (int attempt = 0;; attempt++) {
		rv = push_once(c, v, attempt ? NULL : base, attempt == 2, flags, published);
		if (rv != RL_ENOENT || attempt == 2)
			return rv;
		rl_warn("push: the server lost version %llu while it was sent (restarted?): sending it again",
			(unsigned long long)v->version);
	}
}

static int
push_once(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int last, uint64_t flags, int *published)
{
	/* a part's chunks and commit name it; parts go as chunks (no memfd:
	 * the server assembles them) */
	uint64_t tag = (flags & PUSH_PART) ? ((flags >> 16) & 0xffff) + 1 : 0;
	uint8_t *man = NULL;
	size_t mn;
	nng_msg *m = NULL;
	whdr h;
	char buf[512], shm[128];
	xfer x;
	int rv, use_shm = 0;

	memset(&x, 0, sizeof x);
	if (v->version == 0) {
		rl_error("push: version number must be >= 1");
		return RL_EINVAL;
	}
	if ((rv = rl_wver_hash(v)) != 0)
		return rv;
	/* a server on this host takes the version as shared memory: one copy
	 * into a memfd, no codec, no delta (which would only cost CPU here) */
	if (!tag && (c->o.transport == RL_WSYNC_T_AUTO || c->o.transport == RL_WSYNC_T_SHM)) {
		if ((rv = shm_where(c, shm, sizeof shm)) == RL_OK) {
			use_shm = 1;
			base = NULL;
		} else if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("push: version %llu over shared memory to '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			if (rv == RL_ENOTSUP)
				rl_hint("the server must run on this host (and its shared memory service be on); "
					"use the transport auto or stream");
			return rv;
		}
	}
	if (base && (base->version >= v->version || !rli_ws_same_layout(base, v))) {
		rl_verbose("push: base %llu does not fit version %llu; sending it whole",
			   (unsigned long long)base->version, (unsigned long long)v->version);
		base = NULL;
	}
	for (;;) {
		if ((rv = rli_ws_manifest_encode(&man, &mn, v, (uint32_t)c->o.chunk, base ? base->version : 0)) != 0)
			return rv;
		if (mn > c->o.max_msg) {
			rl_error("push: manifest of %zu bytes is over the message limit", mn);
			free(man);
			return RL_ETOOBIG;
		}
		rv = rpc(c, c->ctx, c->aio, OP_PUSH_BEGIN, v->version, flags, base ? base->hash : 0, man, mn, NULL, 0,
			 c->o.timeout_ms, &m, &h);
		free(man);
		man = NULL;
		if (rv == RL_ENOENT && base) {
			rl_verbose("push: server has not got version %llu; sending version %llu whole",
				   (unsigned long long)base->version, (unsigned long long)v->version);
			base = NULL;
			nng_msg_free(m);
			continue;
		}
		break;
	}
	if (rv != 0) {
		if (m) {
			rl_error("push: server refused version %llu: %s", (unsigned long long)v->version,
				 rep_text(&h, buf, sizeof buf));
			if (rv == RL_ESTALE && (flags & PUSH_REWIND))
				rl_hint("an rl-sync server older than this program cannot rewind to a resumed "
					"trainer's version: upgrade it, or restart it without --data-dir");
			nng_msg_free(m);
			return rv;
		}
		return net_fail(c, rv, "push");
	}
	nng_msg_free(m);
	c->last_push_shm = 0;
	if (use_shm && (rv = push_shm(c, v, shm)) != RL_OK) {
		if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("push: version %llu over shared memory to '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			goto out;
		}
		/* the staged push is still open: its chunks go the usual way */
		rl_verbose("push: version %llu not over shared memory (%s); sending its chunks",
			   (unsigned long long)v->version, rl_strerror(rv));
		use_shm = 0;
	}
	if (!use_shm) {
		x.c = c;
		x.v = v;
		x.base = base;
		x.push = 1;
		x.part_tag = tag;
		x.stored = c->o.stored > 0 || (c->o.stored == 0 && c->local);
		if ((rv = rli_ws_chunk_table(&x.ch, &x.nchunks, v, c->o.chunk)) != 0)
			goto out;
		if ((rv = xfer_run(&x)) != 0)
			goto out;
	}
	rv = rpc(c, c->ctx, c->aio, OP_PUSH_COMMIT, v->version, 0, tag, NULL, 0, NULL, 0, c->o.timeout_ms * 6, &m, &h);
	if (rv != 0) {
		if (m) {
			(rv == RL_ENOENT && !last ? rl_verbose : rl_error)("push: server refused to publish version %llu: %s",
				 (unsigned long long)v->version, rep_text(&h, buf, sizeof buf));
			nng_msg_free(m);
		} else {
			net_fail(c, rv, "push");
		}
		goto out;
	}
	v->lineage = h.a;
	if (published)
		*published = !tag || h.b == PART_PUBLISHED;
	nng_msg_free(m);
	c->last_push_shm = use_shm;
out:
	free(x.ch);
	return rv;
}

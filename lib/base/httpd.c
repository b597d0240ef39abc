/*
 * httpd.c — the small HTTP/1.1 server of rl-queue's listener and
 * `rl-rollout serve` (see httpd.h): accepting within a bound, deadlines,
 * strict parsing of request heads, Content-Length bodies, non-blocking
 * responses, answers and streams completed from other threads, and a
 * self-pipe that wakes the thread.
 *
 * Each connection owns a fixed RLI_HTTPD_HEAD_MAX buffer for the head it is
 * reading, a buffer for its request's body, one for its response's head
 * (and a body the handler made), and a queue of bytes other threads handed
 * over; a body that lives as long as the server (the page) is sent from
 * where it is, not copied.  The thread holds the server's mutex except
 * while it waits in poll and while a handler runs, so other threads find a
 * connection by its id (slot and a sequence number) and queue on it safely.
 * Leaves out: TLS, chunked bodies in either direction, the Expect header
 * (curl sends 100-continue only above 1 MiB; its wait times out and it
 * sends the body anyway), and absolute-form targets beyond cutting
 * "http://host" off.
 */
#include "base/httpd.h"
#include "base/io.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* C_CALL: its handler runs; C_WAIT: an answer from another thread is due */
enum { C_READ, C_BODY, C_CALL, C_WAIT, C_WRITE, C_STREAM, C_LINGER, C_DEAD };

/* a closed connection's unread input is drained for this long at most,
 * and this much of it, so the last response reaches the client */
#define LINGER_S 2.0
#define LINGER_BYTES (16u << 20)
#define NEVER 1e300
#define SLOT_BITS 24

typedef struct conn {
	int fd;
	int state;
	int close_after;              /* the response being written is the last */
	int keep10, is_head;          /* the request's: HTTP/1.0 keep-alive, a HEAD */
	int answered;                 /* C_CALL: the later answer is already in more */
	int ended;                    /* C_STREAM: no more bytes will come */
	int doomed;                   /* over a bound on another thread: drop it */
	uint64_t id;
	double deadline;
	size_t inlen, used;           /* bytes in `in`; of them, the current request's */
	size_t drained;
	rl_buf out;                   /* response head, then an owned body */
	size_t outoff;
	const char *body;             /* a borrowed body after out */
	size_t blen, boff;
	rl_buf more;                  /* queued by other threads; follows out */
	char *rbody;                  /* the request's body being read */
	size_t rgot;
	rli_httpd_req rq;             /* parsed in place in `in`, kept while the body comes */
	char in[RLI_HTTPD_HEAD_MAX];
} conn;

struct rli_httpd {
	rli_httpd_config cfg;
	int lfd, wake[2], port;
	pthread_t th;
	int running, stop, woken;
	pthread_mutex_t mu;
	int mu_ok;
	conn **conns;                 /* max_conns slots; NULL where free */
	int nconns;
	uint64_t seq;
	struct pollfd *pfd;
	int *pslot;                   /* the slot of each pfd past the first two */
	double accept_paused_until;
	int warned_full;
};

static const char *
reason(int st)
{
	switch (st) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 411: return "Length Required";
	case 413: return "Content Too Large";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return st >= 500 ? "Server Error" : "Error";
	}
}

/* The response head for rep into out; body_len is what Content-Length says
 * (also for HEAD); a stream has none and ends with the connection. */
static int
put_head(rl_buf *out, const rli_httpd_reply *rep, size_t body_len, int close, int keep10)
{
	char date[64], cl[48] = "";
	time_t t = time(NULL);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
	if (!rep->stream)
		snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", body_len);
	return rl_buf_printf(out,
	    "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\n%sCache-Control: %s\r\n%s%s\r\n",
	    rep->status, reason(rep->status), date, rep->type ? rep->type : "text/plain; charset=utf-8",
	    cl, rep->stream ? "no-cache" : "no-store", rep->extra ? rep->extra : "",
	    close || rep->stream ? "Connection: close\r\n" : keep10 ? "Connection: keep-alive\r\n" : "");
}

/* One short answer, written once without waiting, for a connection about
 * to be closed (over the limit, or past its deadline mid-head). */
static void
answer_once(int fd, int status, const char *msg, const char *extra)
{
	rli_httpd_reply rep = { .status = status, .extra = extra };
	rl_buf b;

	rl_buf_init(&b);
	if (put_head(&b, &rep, strlen(msg), 1, 0) == 0 && rl_buf_append(&b, msg, strlen(msg)) == 0)
		(void)send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
	rl_buf_fini(&b);
}

/* ---- parsing ------------------------------------------------------------------------------------- */

static int
is_tchar(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	    (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* 1 when the comma-separated list v holds token t (any case) */
static int
has_token(const char *v, const char *t)
{
	size_t n = strlen(t);

	while (*v) {
		while (*v == ' ' || *v == '\t' || *v == ',')
			v++;
		if (strncasecmp(v, t, n) == 0 && (v[n] == 0 || v[n] == ',' || v[n] == ' ' || v[n] == '\t'))
			return 1;
		while (*v && *v != ',')
			v++;
	}
	return 0;
}

/* The request line, NUL-terminated in place: 0, or 400/505. */
static int
parse_line(char *l, rli_httpd_req *rq, int *minor)
{
	char *sp1, *sp2, *t;

	rq->method = l;
	for (sp1 = l; is_tchar((unsigned char)*sp1); sp1++)
		;
	if (sp1 == l || *sp1 != ' ' || sp1 - l > 32)
		return 400;
	*sp1 = 0;
	t = sp1 + 1;
	for (sp2 = t; *sp2 > ' ' && *sp2 < 0x7f; sp2++)
		;
	if (sp2 == t || *sp2 != ' ')
		return 400;
	*sp2 = 0;
	/* HTTP-version = "HTTP/" DIGIT "." DIGIT; a well-formed other major is 505 */
	if (strncmp(sp2 + 1, "HTTP/", 5) != 0 || sp2[6] < '0' || sp2[6] > '9' || sp2[7] != '.' ||
	    sp2[8] < '0' || sp2[8] > '9' || sp2[9] != 0)
		return 400;
	if (sp2[6] != '1')
		return 505;
	*minor = sp2[8] - '0';
	if (strncasecmp(t, "http://", 7) == 0) {   /* absolute-form: the path only */
		t = strchr(t + 7, '/');
		if (t == NULL)
			t = (char *)"/";
	}
	if (*t != '/')
		return 400;
	rq->path = t;
	if ((t = strchr(t, '?')) != NULL)
		*t = 0;
	return 0;
}

typedef struct head_info {
	int hosts, lengths, te, keep;
	const char *length;
} head_info;

/* One header line, in place: 0, 400, or 431 past RLI_HTTPD_FIELDS. */
static int
parse_field(char *l, rli_httpd_req *rq, head_info *hi, int minor)
{
	char *v, *e;

	for (v = l; is_tchar((unsigned char)*v); v++)
		;
	if (v == l || *v != ':')        /* also obs-fold and a space before the colon */
		return 400;
	*v++ = 0;
	while (*v == ' ' || *v == '\t')
		v++;
	for (e = v; *e; e++)
		if ((unsigned char)*e < ' ' && *e != '\t')
			return 400;
		else if (*e == 0x7f)
			return 400;
	while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = 0;
	if (rq->nfields == RLI_HTTPD_FIELDS)
		return 431;
	rq->field_name[rq->nfields] = l;
	rq->field_value[rq->nfields++] = v;
	if (strcasecmp(l, "Host") == 0)
		hi->hosts++;
	else if (strcasecmp(l, "Content-Length") == 0)
		hi->lengths++, hi->length = v;
	else if (strcasecmp(l, "Transfer-Encoding") == 0)
		hi->te = 1;
	else if (strcasecmp(l, "Connection") == 0) {
		if (has_token(v, "close"))
			hi->keep = 0;
		else if (minor == 0 && has_token(v, "keep-alive"))
			hi->keep = 1;
	} else if (strcasecmp(l, "Authorization") == 0) {
		if (rq->authorization)
			return 400;
		rq->authorization = v;
	}
	return 0;
}

/* What the head says of a body: 0, or the status to refuse it with.
 * Without bodies (max_body 0) any announced one is 413, as no route takes
 * one; with them, only a single plain Content-Length is taken. */
static int
body_info(const head_info *hi, rli_httpd_req *rq, size_t max_body)
{
	const char *v = hi->length;

	if (max_body == 0) {
		if (hi->te || hi->lengths > 1 || (hi->lengths && (!*v || strspn(v, "0") != strlen(v))))
			return 413;
		return 0;
	}
	if (hi->te)
		return 411;
	if (hi->lengths > 1 || (hi->lengths && (!*v || strspn(v, "0123456789") != strlen(v))))
		return 400;
	if (hi->lengths == 0)
		return 0;
	rq->has_length = 1;
	/* 20 digits may not fit: anything that long is over any limit */
	rq->length = strlen(v) > 19 ? ~0ULL : strtoull(v, NULL, 10);
	rq->too_large = rq->length > max_body;
	return 0;
}

/* The head p[0..n) (ending with the empty line), parsed in place: 0 for a
 * request to hand to the handler, or the status to refuse it with (the
 * connection then closes).  *keep: whether the connection stays open. */
static int
parse_head(char *p, size_t n, rli_httpd_req *rq, int *keep, int *keep10, size_t max_body)
{
	head_info hi = { 0 };
	char *l = p, *end = p + n - 2, *nl;
	int st, minor = 1, first = 1;

	*keep = 0;
	for (; l < end; l = nl + 2) {
		nl = memchr(l, '\r', (size_t)(end - l));
		if (nl == NULL || nl[1] != '\n')
			return 400;
		*nl = 0;
		if (memchr(l, '\n', (size_t)(nl - l)) != NULL || strlen(l) != (size_t)(nl - l))
			return 400;   /* a bare LF or a NUL inside a line */
		if (first) {
			if ((st = parse_line(l, rq, &minor)) != 0)
				return st;
			hi.keep = minor >= 1;
			first = 0;
		} else if ((st = parse_field(l, rq, &hi, minor)) != 0) {
			return st;
		}
	}
	if (first || hi.hosts > 1 || (minor >= 1 && hi.hosts == 0))
		return 400;
	*keep = hi.keep;
	*keep10 = hi.keep && minor == 0;
	return body_info(&hi, rq, max_body);
}

/* ---- connections --------------------------------------------------------------------------------- */

static void
conn_drop(conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->state = C_DEAD;
}

/* (under mu) */
static void
wake(rli_httpd *s)
{
	ssize_t w;

	/* one byte until the thread has looked: many streams' tokens of one
	 * engine step cost one wake-up; a full pipe (EAGAIN) wakes it as well */
	if (s->woken)
		return;
	s->woken = 1;
	do
		w = write(s->wake[1], "x", 1);
	while (w < 0 && errno == EINTR);
}

/* Bytes of the response not yet taken by the client. */
static size_t
pending(const conn *c)
{
	return c->out.len - c->outoff + c->blen - c->boff + c->more.len;
}

/* rep into c->out (and c->body for a borrowed body); frees rep->owned.
 * -1 on no memory. */
static int
queue_reply(conn *c, rli_httpd_reply *rep)
{
	size_t blen = c->is_head ? 0 : rep->len;
	int rv = 0;

	if (rep->close || rep->stream)
		c->close_after = 1;
	rl_buf_reset(&c->out);
	c->outoff = c->boff = c->blen = 0;
	c->body = NULL;
	if (put_head(&c->out, rep, rep->len, c->close_after, c->keep10) != 0 ||
	    (rep->owned && blen && rl_buf_append(&c->out, rep->owned, blen) != 0)) {
		rv = -1;
	} else if (!rep->owned && blen) {
		c->body = rep->body;
		c->blen = blen;
	}
	free(rep->owned);
	rep->owned = NULL;
	return rv;
}

/* Calls the handler for the request in c->rq (its body read) and queues
 * what it answers (under mu, which the handler runs without).  -1 on no
 * memory. */
static int
dispatch(rli_httpd *s, conn *c)
{
	rli_httpd_reply rep = { 0 };

	c->rq.id = c->id;
	c->state = C_CALL;
	c->answered = c->ended = 0;
	pthread_mutex_unlock(&s->mu);
	s->cfg.fn(s->cfg.arg, &c->rq, &rep);
	pthread_mutex_lock(&s->mu);
	free(c->rbody);
	c->rbody = NULL;
	memmove(c->in, c->in + c->used, c->inlen - c->used);
	c->inlen -= c->used;
	c->used = 0;
	memset(&c->rq, 0, sizeof c->rq);   /* it pointed into the bytes just moved */
	if (c->doomed)
		return -1;
	if (rep.later && !rep.stream) {
		free(rep.owned);
		rl_buf_reset(&c->out);
		c->outoff = c->boff = c->blen = 0;
		c->body = NULL;
		/* a handler may take as long as it needs: no deadline until the answer */
		c->state = c->answered ? C_WRITE : C_WAIT;
		c->deadline = c->answered ? rl_now() + s->cfg.timeout_s : NEVER;
		return 0;
	}
	c->state = rep.stream ? C_STREAM : C_WRITE;
	c->deadline = rl_now() + s->cfg.timeout_s;
	return queue_reply(c, &rep);
}

/* The refusal of a request that did not pass the checks: closes after. */
static int
refuse_request(conn *c, int st)
{
	static const char big[] = "this listener's routes take no request body\n";
	static const char bad[] = "malformed request\n";
	static const char ver[] = "only HTTP/1.0 and HTTP/1.1 are served here\n";
	static const char longhead[] = "request head over 8 KiB or over 64 header lines\n";
	static const char chunked[] = "a request body needs Content-Length (chunked bodies are not taken)\n";
	rli_httpd_reply rep = { .status = st };

	rep.body = st == 413 ? big : st == 505 ? ver : st == 431 ? longhead : st == 411 ? chunked : bad;
	rep.len = strlen(rep.body);
	c->close_after = 1;
	c->is_head = 0;
	memmove(c->in, c->in + c->used, c->inlen - c->used);
	c->inlen -= c->used;
	c->used = 0;
	c->state = C_WRITE;
	return queue_reply(c, &rep);
}

/* The request's body is all in: to the handler. */
static int
body_done(rli_httpd *s, conn *c)
{
	c->rbody[c->rgot] = 0;
	c->rq.body = c->rbody;
	c->rq.body_len = c->rgot;
	return dispatch(s, c);
}

/* Takes one complete head from c->in and, with its body when that is all
 * here, passes it on: 1; 0 while the head or the body is incomplete; -1
 * on no memory. */
static int
take_request(rli_httpd *s, conn *c)
{
	size_t skip = 0, hl, have;
	char *e;
	int st, keep = 0;

	/* empty lines before a request line are ignored (RFC 9112 2.2) */
	while (skip + 1 < c->inlen && c->in[skip] == '\r' && c->in[skip + 1] == '\n')
		skip += 2;
	e = memmem(c->in + skip, c->inlen - skip, "\r\n\r\n", 4);
	if (e == NULL && c->inlen < sizeof c->in)
		return 0;
	memset(&c->rq, 0, sizeof c->rq);
	if (e == NULL) {
		c->used = c->inlen;
		return refuse_request(c, 431) < 0 ? -1 : 1;
	}
	hl = (size_t)(e + 4 - c->in);
	c->used = hl;
	if ((st = parse_head(c->in + skip, hl - skip, &c->rq, &keep, &c->keep10, s->cfg.max_body)) != 0)
		return refuse_request(c, st) < 0 ? -1 : 1;
	c->is_head = strcmp(c->rq.method, "HEAD") == 0;
	/* a body left unread cannot be told from the next request */
	c->close_after = !keep || c->rq.too_large;
	if (c->rq.length > 0 && !c->rq.too_large) {
		if ((c->rbody = rl_try_malloc((size_t)c->rq.length + 1, "http request body")) == NULL)
			return -1;
		have = c->inlen - hl < c->rq.length ? c->inlen - hl : (size_t)c->rq.length;
		memcpy(c->rbody, c->in + hl, have);
		c->rgot = have;
		c->used += have;
		if (c->rgot < c->rq.length) {
			c->state = C_BODY;
			c->deadline = rl_now() + s->cfg.body_timeout_s;
			return 0;
		}
		return body_done(s, c) < 0 ? -1 : 1;
	}
	return dispatch(s, c) < 0 ? -1 : 1;
}

/* Writes what it can: 1 when all queued is out, 0 when the socket is
 * full, -1 when the connection failed.  Progress moves a stream's
 * deadline. */
static int
flush(rli_httpd *s, conn *c)
{
	for (;;) {
		struct iovec iov[2];
		struct msghdr mh = { .msg_iov = iov };
		ssize_t n;

		if (c->outoff < c->out.len) {
			iov[mh.msg_iovlen].iov_base = c->out.p + c->outoff;
			iov[mh.msg_iovlen++].iov_len = c->out.len - c->outoff;
		}
		if (c->boff < c->blen) {
			iov[mh.msg_iovlen].iov_base = (void *)(c->body + c->boff);
			iov[mh.msg_iovlen++].iov_len = c->blen - c->boff;
		}
		if (mh.msg_iovlen == 0) {
			rl_buf t = c->out;
			if (c->more.len == 0)
				return 1;
			/* what other threads queued goes next; its buffer is reused */
			c->out = c->more;
			c->more = t;
			rl_buf_reset(&c->more);
			c->outoff = c->boff = c->blen = 0;
			c->body = NULL;
			continue;
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		}
		if (c->state == C_STREAM)
			c->deadline = rl_now() + s->cfg.timeout_s;
		if ((size_t)n <= c->out.len - c->outoff) {
			c->outoff += (size_t)n;
		} else {
			n -= (ssize_t)(c->out.len - c->outoff);
			c->outoff = c->out.len;
			c->boff += (size_t)n;
		}
	}
}

static void
to_linger(rli_httpd *s, conn *c)
{
	shutdown(c->fd, SHUT_WR);
	c->state = C_LINGER;
	c->deadline = rl_now() + (s->cfg.timeout_s < LINGER_S ? s->cfg.timeout_s : LINGER_S);
}

/* A stream: its bytes out as far as they go; ended and all out, it closes;
 * nothing queued, it waits for more without a deadline. */
static void
advance_stream(rli_httpd *s, conn *c)
{
	int r = flush(s, c);

	if (r < 0)
		conn_drop(c);
	else if (r == 1 && c->ended)
		to_linger(s, c);
	else if (r == 1)
		c->deadline = NEVER;
}

/* Moves c on as far as it goes without waiting: requests already read are
 * answered one after another (pipelining), in order. */
static void
advance(rli_httpd *s, conn *c)
{
	for (;;) {
		if (c->state == C_READ) {
			int r = take_request(s, c);
			if (r <= 0) {
				if (r < 0)
					conn_drop(c);
				return;
			}
		}
		if (c->state == C_STREAM) {
			advance_stream(s, c);
			return;
		}
		if (c->state != C_WRITE)
			return;
		switch (flush(s, c)) {
		case 0:
			return;
		case -1:
			conn_drop(c);
			return;
		}
		rl_buf_reset(&c->out);
		c->outoff = c->boff = c->blen = 0;
		c->body = NULL;
		if (c->close_after) {
			to_linger(s, c);
			return;
		}
		c->state = C_READ;
		c->deadline = rl_now() + s->cfg.timeout_s;
	}
}

static void
on_readable(rli_httpd *s, conn *c)
{
	char scratch[16384];
	ssize_t n;

	if (c->state == C_LINGER) {
		n = recv(c->fd, scratch, sizeof scratch, 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) ||
		    (n > 0 && (c->drained += (size_t)n) > LINGER_BYTES))
			conn_drop(c);
		return;
	}
	if (c->state == C_BODY) {
		n = recv(c->fd, c->rbody + c->rgot, (size_t)c->rq.length - c->rgot, 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			conn_drop(c);
			return;
		}
		if (n > 0 && (c->rgot += (size_t)n) == c->rq.length) {
			if (body_done(s, c) < 0) {
				conn_drop(c);
				return;
			}
			advance(s, c);
		}
		return;
	}
	if (c->state != C_READ)
		return;
	n = recv(c->fd, c->in + c->inlen, sizeof c->in - c->inlen, 0);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		conn_drop(c);   /* gone, or half-closed before a whole request */
		return;
	}
	if (n > 0)
		c->inlen += (size_t)n;
	advance(s, c);
}

static void
on_deadline(conn *c)
{
	/* a head begun and not finished in time hears why; a body that did not
	 * come, an idle keep-alive connection, or one that would not take its
	 * response, just closes */
	if (c->state == C_READ && c->inlen > 0)
		answer_once(c->fd, 408, "request head not received in time\n", NULL);
	conn_drop(c);
}

/* ---- accepting and the loop ---------------------------------------------------------------------- */

/* Over the limit: a 503 that says so, then closed.  What the client sent
 * already is read first so that closing does not reset the connection
 * under the answer. */
static void
refuse(int fd)
{
	char scratch[4096];

	(void)recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
	answer_once(fd, 503, "too many connections to this listener; try again\n", "Retry-After: 1\r\n");
	shutdown(fd, SHUT_WR);
	close(fd);
}

static int
free_slot(const rli_httpd *s)
{
	for (int i = 0; i < s->cfg.max_conns; i++)
		if (s->conns[i] == NULL)
			return i;
	return -1;
}

static void
accept_some(rli_httpd *s)
{
	for (int k = 0; k < 64; k++) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), slot, one = 1;
		conn *c;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* the waiting connection stays queued; poll would wake at once */
				rl_warn("%s: cannot accept a connection: %s", s->cfg.opt, strerror(errno));
				s->accept_paused_until = rl_now() + 0.1;
			}
			return;
		}
		if (s->nconns >= s->cfg.max_conns || (slot = free_slot(s)) < 0 ||
		    (c = rl_try_calloc(1, sizeof *c, "http connection")) == NULL) {
			if (!s->warned_full++)
				rl_warn("%s: %d connections open, the --http-max-conns bound: refusing more with 503",
				    s->cfg.opt, s->nconns);
			refuse(fd);
			continue;
		}
		/* a stream's events are small writes: Nagle's wait for the previous
		 * one's ACK (delayed by the client) would hold each back */
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		c->fd = fd;
		c->state = C_READ;
		c->deadline = rl_now() + s->cfg.timeout_s;
		c->id = (++s->seq << SLOT_BITS) | (uint64_t)slot;
		rl_buf_init(&c->out);
		rl_buf_init(&c->more);
		s->conns[slot] = c;
		s->nconns++;
	}
}

static void
conn_free(conn *c)
{
	conn_drop(c);
	rl_buf_fini(&c->out);
	rl_buf_fini(&c->more);
	free(c->rbody);
	free(c);
}

/* Deadlines, bounds crossed on other threads, streams ended; then frees
 * the closed connections. */
static void
sweep(rli_httpd *s)
{
	double now = rl_now();

	for (int i = 0; i < s->cfg.max_conns; i++) {
		conn *c = s->conns[i];
		if (c == NULL)
			continue;
		if (c->state != C_DEAD && c->doomed)
			conn_drop(c);
		else if (c->state != C_DEAD && now >= c->deadline)
			on_deadline(c);
		else if (c->state == C_STREAM && c->ended && pending(c) == 0)
			to_linger(s, c);
		if (c->state == C_DEAD) {
			conn_free(c);
			s->conns[i] = NULL;
			s->nconns--;
		}
	}
}

static short
events_of(const conn *c)
{
	switch (c->state) {
	case C_WRITE:
		return POLLOUT;
	case C_STREAM:
		return pending(c) > 0 ? POLLOUT : 0;
	case C_WAIT:
		return 0;      /* only a reset (POLLERR, POLLHUP) is seen */
	default:
		return POLLIN;
	}
}

/* One wait in poll and what it found (under mu, released while waiting);
 * 1 when the server is told to stop. */
static int
serve_once(rli_httpd *s)
{
	double now = rl_now(), next = now + 3600;
	int np = 2, wait_ms;
	char drain[256];

	s->pfd[0] = (struct pollfd){ .fd = s->wake[0], .events = POLLIN };
	s->pfd[1] = (struct pollfd){ .fd = s->lfd, .events = now >= s->accept_paused_until ? POLLIN : 0 };
	if (now < s->accept_paused_until)
		next = s->accept_paused_until;
	for (int i = 0; i < s->cfg.max_conns; i++) {
		conn *c = s->conns[i];
		if (c == NULL)
			continue;
		s->pslot[np] = i;
		s->pfd[np++] = (struct pollfd){ .fd = c->fd, .events = events_of(c) };
		if (c->deadline < next)
			next = c->deadline;
	}
	wait_ms = next <= now ? 0 : (int)((next - now) * 1000.0) + 1;
	pthread_mutex_unlock(&s->mu);
	if (poll(s->pfd, (nfds_t)np, wait_ms) < 0 && errno != EINTR) {
		rl_error("%s: poll: %s", s->cfg.opt, strerror(errno));
		pthread_mutex_lock(&s->mu);
		return 1;
	}
	pthread_mutex_lock(&s->mu);
	if (s->pfd[0].revents)
		while (read(s->wake[0], drain, sizeof drain) > 0)
			;
	s->woken = 0;
	if (s->stop)
		return 1;
	for (int i = 2; i < np; i++) {
		conn *c = s->conns[s->pslot[i]];
		short re = s->pfd[i].revents;
		/* a peer gone while its response is pending cannot take it */
		if ((re & (POLLERR | POLLNVAL)) ||
		    ((re & POLLHUP) && (c->state == C_WRITE || c->state == C_WAIT || c->state == C_STREAM)))
			conn_drop(c);
		else if (re & POLLOUT)
			advance(s, c);
		else if (re & (POLLIN | POLLHUP))
			on_readable(s, c);
	}
	sweep(s);
	if (s->pfd[1].revents & POLLIN)
		accept_some(s);
	return 0;
}

static void *
serve(void *arg)
{
	rli_httpd *s = arg;

	pthread_mutex_lock(&s->mu);
	while (!serve_once(s))
		;
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int
listen_on(rli_httpd *s, const char *url)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
	    .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res = NULL, *a;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	int g, err = 0, one = 1;

	if ((g = getaddrinfo(s->cfg.host, s->cfg.port, &hints, &res)) != 0) {
		rl_error("%s: cannot listen on '%s': %s", s->cfg.opt, url, gai_strerror(g));
		return RL_ENET;
	}
	for (a = res; a; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
			s->lfd = fd;
			break;
		}
		err = errno;
		close(fd);
	}
	freeaddrinfo(res);
	if (s->lfd < 0) {
		rl_error("%s: cannot listen on '%s': %s", s->cfg.opt, url, strerror(err));
		if (err == EADDRINUSE)
			rl_hint("another process listens there; pick another port");
		return RL_ENET;
	}
	if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) == 0)
		s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
		    : ((struct sockaddr_in *)&ss)->sin_port);
	return RL_OK;
}

int
rli_httpd_open(rli_httpd **out, const rli_httpd_config *cfg, const char *url)
{
	rli_httpd *s;
	size_t n;
	int rv;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "http server")) == NULL)
		return RL_ENOMEM;
	s->cfg = *cfg;
	s->lfd = s->wake[0] = s->wake[1] = -1;
	if (!s->cfg.opt)
		s->cfg.opt = "--http";
	if (s->cfg.max_conns <= 0)
		s->cfg.max_conns = RLI_HTTPD_MAX_CONNS;
	if (s->cfg.max_conns > (1 << SLOT_BITS) - 1)
		s->cfg.max_conns = (1 << SLOT_BITS) - 1;
	if (s->cfg.timeout_s <= 0)
		s->cfg.timeout_s = RLI_HTTPD_TIMEOUT_S;
	if (s->cfg.body_timeout_s <= 0)
		s->cfg.body_timeout_s = s->cfg.timeout_s;
	if (s->cfg.out_max == 0)
		s->cfg.out_max = RLI_HTTPD_OUT_MAX;
	n = (size_t)s->cfg.max_conns;
	if ((s->conns = rl_try_calloc(n, sizeof *s->conns, "http connections")) == NULL ||
	    (s->pfd = rl_try_calloc(n + 2, sizeof *s->pfd, "http connections")) == NULL ||
	    (s->pslot = rl_try_calloc(n + 2, sizeof *s->pslot, "http connections")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	if ((errno = pthread_mutex_init(&s->mu, NULL)) != 0) {
		rv = RL_ENOMEM;
		goto fail;
	}
	s->mu_ok = 1;
	if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
		rl_error("%s: pipe: %s", s->cfg.opt, strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	if ((rv = listen_on(s, url)) != 0)
		goto fail;
	if ((errno = pthread_create(&s->th, NULL, serve, s)) != 0) {
		rl_error("%s: cannot start its thread: %s", s->cfg.opt, strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	s->running = 1;
	*out = s;
	return RL_OK;
fail:
	rli_httpd_close(s);
	return rv;
}

int
rli_httpd_port(const rli_httpd *s)
{
	return s->port;
}

const char *
rli_httpd_field(const rli_httpd_req *req, const char *name)
{
	for (int i = 0; i < req->nfields; i++)
		if (strcasecmp(req->field_name[i], name) == 0)
			return req->field_value[i];
	return NULL;
}

/* The live connection id names (under mu), or NULL. */
static conn *
find(rli_httpd *s, uint64_t id)
{
	uint64_t slot = id & ((1u << SLOT_BITS) - 1);
	conn *c;

	if (slot >= (uint64_t)s->cfg.max_conns || (c = s->conns[slot]) == NULL || c->id != id ||
	    c->state == C_DEAD || c->doomed)
		return NULL;
	return c;
}

int
rli_httpd_answer(rli_httpd *s, uint64_t id, const rli_httpd_reply *rep)
{
	const void *body = rep->owned ? rep->owned : rep->body;
	size_t blen;
	conn *c;
	int rv = RL_OK;

	pthread_mutex_lock(&s->mu);
	if ((c = find(s, id)) == NULL || (c->state != C_CALL && c->state != C_WAIT) || c->answered) {
		rv = RL_ENET;
		goto out;
	}
	blen = c->is_head ? 0 : rep->len;
	if (rep->close)
		c->close_after = 1;
	rl_buf_reset(&c->more);
	if (put_head(&c->more, rep, rep->len, c->close_after, c->keep10) != 0 ||
	    (blen && rl_buf_append(&c->more, body, blen) != 0)) {
		rl_buf_reset(&c->more);
		rv = RL_ENOMEM;
		goto out;
	}
	c->answered = 1;
	if (c->state == C_WAIT) {
		c->state = C_WRITE;
		c->deadline = rl_now() + s->cfg.timeout_s;
		wake(s);
	}
out:
	pthread_mutex_unlock(&s->mu);
	return rv;
}

int
rli_httpd_stream_write(rli_httpd *s, uint64_t id, const void *p, size_t n)
{
	conn *c;
	int rv = RL_OK;

	pthread_mutex_lock(&s->mu);
	if ((c = find(s, id)) == NULL || (c->state != C_STREAM && c->state != C_CALL) || c->ended) {
		rv = RL_ENET;
	} else if (pending(c) + n > s->cfg.out_max) {
		/* a client that does not read is not buffered for: it goes */
		rl_verbose("%s: a stream's client took none of its last %zu bytes: connection dropped",
		    s->cfg.opt, pending(c));
		c->doomed = 1;
		wake(s);
		rv = RL_ENET;
	} else {
		size_t was = pending(c);
		if (rl_buf_append(&c->more, p, n) != 0) {
			rv = RL_ENOMEM;
		} else if (was == 0) {
			if (c->state == C_STREAM)
				c->deadline = rl_now() + s->cfg.timeout_s;
			wake(s);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

void
rli_httpd_stream_end(rli_httpd *s, uint64_t id)
{
	conn *c;

	pthread_mutex_lock(&s->mu);
	if ((c = find(s, id)) != NULL && (c->state == C_STREAM || c->state == C_CALL)) {
		c->ended = 1;
		wake(s);
	}
	pthread_mutex_unlock(&s->mu);
}

void
rli_httpd_drain(rli_httpd *s, double wait_s)
{
	double end = rl_now() + wait_s;

	for (;;) {
		int busy = 0;
		pthread_mutex_lock(&s->mu);
		for (int i = 0; i < s->cfg.max_conns && !busy; i++) {
			conn *c = s->conns[i];
			busy = c && (c->state == C_WRITE || c->state == C_STREAM) && pending(c) > 0;
		}
		pthread_mutex_unlock(&s->mu);
		if (!busy || rl_now() >= end)
			return;
		usleep(10000);
	}
}

void
rli_httpd_close(rli_httpd *s)
{
	if (s == NULL)
		return;
	if (s->running) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		wake(s);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->th, NULL);
	}
	for (int i = 0; s->conns && i < s->cfg.max_conns; i++)
		if (s->conns[i])
			conn_free(s->conns[i]);
	if (s->lfd >= 0)
		close(s->lfd);
	for (int i = 0; i < 2; i++)
		if (s->wake[i] >= 0)
			close(s->wake[i]);
	if (s->mu_ok)
		pthread_mutex_destroy(&s->mu);
	free(s->conns);
	free(s->pfd);
	free(s->pslot);
	free(s);
}

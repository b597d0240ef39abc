/*
 * qhttpd.c — the HTTP/1.1 server under rl-queue's listener (see qhttpd.h):
 * accepting within a bound, deadlines, strict parsing of request heads,
 * non-blocking responses, and a self-pipe to stop the thread.
 *
 * Each connection owns a fixed RLI_HTTPD_HEAD_MAX buffer for the head it is
 * reading and a buffer for its response's head (and a body the handler
 * made); a body that lives as long as the server (the page) is sent from
 * where it is, not copied.  Leaves out: request bodies, TLS, chunked
 * responses, the Expect header (a 100-continue is never needed without a
 * body), and absolute-form targets beyond cutting "http://host" off.
 */
#include "queue/qhttpd.h"
#include "base/io.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
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

enum { C_READ, C_WRITE, C_LINGER, C_DEAD };

/* a closed connection's unread input is drained for this long at most,
 * and this much of it, so the last response reaches the client */
#define LINGER_S 2.0
#define LINGER_BYTES (16u << 20)

typedef struct conn {
	int fd;
	int state;
	int close_after;              /* the response being written is the last */
	double deadline;
	size_t inlen;
	size_t drained;
	rl_buf out;                   /* response head, then an owned body */
	size_t outoff;
	const char *body;             /* a borrowed body after out */
	size_t blen, boff;
	char in[RLI_HTTPD_HEAD_MAX];
} conn;

struct rli_httpd {
	rli_httpd_config cfg;
	int lfd, wake[2], port;
	pthread_t th;
	int running;
	conn **conns;
	int nconns;
	struct pollfd *pfd;
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
	case 413: return "Content Too Large";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return "Unknown";
	}
}

/* The response head for rep into out; body_len is what Content-Length says
 * (also for HEAD). */
static int
put_head(rl_buf *out, const rli_httpd_reply *rep, size_t body_len, int close, int keep10)
{
	char date[64];
	time_t t = time(NULL);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
	return rl_buf_printf(out,
	    "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	    "Cache-Control: no-store\r\n%s%s\r\n",
	    rep->status, reason(rep->status), date, rep->type ? rep->type : "text/plain; charset=utf-8",
	    body_len, rep->extra ? rep->extra : "",
	    close ? "Connection: close\r\n" : keep10 ? "Connection: keep-alive\r\n" : "");
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

/* One header line, in place: 0 or 400. */
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

/* The head p[0..n) (ending with the empty line), parsed in place: 0 for a
 * request to hand to the handler, or the status to refuse it with (the
 * connection then closes).  *keep: whether the connection stays open. */
static int
parse_head(char *p, size_t n, rli_httpd_req *rq, int *keep, int *keep10)
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
	if (hi.te || hi.lengths > 1 || (hi.lengths && (!*hi.length || strspn(hi.length, "0") != strlen(hi.length))))
		return 413;
	*keep = hi.keep;
	*keep10 = hi.keep && minor == 0;
	return 0;
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

/* Takes one complete head from c->in, asks the handler and queues the
 * response: 1; 0 while the head is incomplete; -1 on no memory. */
static int
take_request(rli_httpd *s, conn *c)
{
	static const char big[] = "this listener's routes take no request body\n";
	static const char bad[] = "malformed request\n";
	static const char ver[] = "only HTTP/1.0 and HTTP/1.1 are served here\n";
	static const char longhead[] = "request head over 8 KiB\n";
	rli_httpd_req rq = { 0 };
	rli_httpd_reply rep = { 0 };
	size_t skip = 0, hl, blen;
	char *e;
	int st = 0, keep = 0, keep10 = 0, head;

	/* empty lines before a request line are ignored (RFC 9112 2.2) */
	while (skip + 1 < c->inlen && c->in[skip] == '\r' && c->in[skip + 1] == '\n')
		skip += 2;
	e = memmem(c->in + skip, c->inlen - skip, "\r\n\r\n", 4);
	if (e == NULL && c->inlen < sizeof c->in)
		return 0;
	if (e == NULL) {
		st = 431;
		hl = c->inlen;
	} else {
		hl = (size_t)(e + 4 - c->in);
		st = parse_head(c->in + skip, hl - skip, &rq, &keep, &keep10);
	}
	head = st == 0 && strcmp(rq.method, "HEAD") == 0;
	if (st == 0) {
		s->cfg.fn(s->cfg.arg, &rq, &rep);
	} else {
		rep.status = st;
		rep.body = st == 413 ? big : st == 505 ? ver : st == 431 ? longhead : bad;
		rep.len = strlen(rep.body);
	}
	if (rep.owned)
		rep.body = rep.owned;
	blen = head ? 0 : rep.len;
	c->close_after = !keep;
	rl_buf_reset(&c->out);
	c->outoff = c->boff = 0;
	c->body = NULL;
	c->blen = 0;
	if (put_head(&c->out, &rep, rep.len, c->close_after, keep10) != 0 ||
	    (rep.owned && blen && rl_buf_append(&c->out, rep.owned, blen) != 0)) {
		free(rep.owned);
		return -1;
	}
	if (!rep.owned && blen) {
		c->body = rep.body;
		c->blen = blen;
	}
	free(rep.owned);
	memmove(c->in, c->in + hl, c->inlen - hl);
	c->inlen -= hl;
	return 1;
}

/* Writes what it can: 1 when the response is out, 0 when the socket is
 * full, -1 when the connection failed. */
static int
flush(conn *c)
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
		if (mh.msg_iovlen == 0)
			return 1;
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno == EINTR ? flush(c) : -1;
		if ((size_t)n <= c->out.len - c->outoff) {
			c->outoff += (size_t)n;
		} else {
			n -= (ssize_t)(c->out.len - c->outoff);
			c->outoff = c->out.len;
			c->boff += (size_t)n;
		}
	}
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
			c->state = C_WRITE;
			c->deadline = rl_now() + s->cfg.timeout_s;   /* the response must be taken by then */
		}
		if (c->state != C_WRITE)
			return;
		switch (flush(c)) {
		case 0:
			return;
		case -1:
			conn_drop(c);
			return;
		}
		rl_buf_reset(&c->out);
		if (c->close_after) {
			shutdown(c->fd, SHUT_WR);
			c->state = C_LINGER;
			c->deadline = rl_now() + (s->cfg.timeout_s < LINGER_S ? s->cfg.timeout_s : LINGER_S);
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
	/* a head begun and not finished in time hears why; an idle keep-alive
	 * connection, or one that would not take its response, just closes */
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

static void
accept_some(rli_httpd *s)
{
	for (int k = 0; k < 64; k++) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		conn *c;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* the waiting connection stays queued; poll would wake at once */
				rl_warn("--http: cannot accept a connection: %s", strerror(errno));
				s->accept_paused_until = rl_now() + 0.1;
			}
			return;
		}
		if (s->nconns >= s->cfg.max_conns ||
		    (c = rl_try_calloc(1, sizeof *c, "http connection")) == NULL) {
			if (!s->warned_full++)
				rl_warn("--http: %d connections open, the --http-max-conns bound: refusing more with 503",
				    s->nconns);
			refuse(fd);
			continue;
		}
		c->fd = fd;
		c->state = C_READ;
		c->deadline = rl_now() + s->cfg.timeout_s;
		rl_buf_init(&c->out);
		s->conns[s->nconns++] = c;
	}
}

/* Frees the closed connections, keeping the others in order. */
static void
sweep(rli_httpd *s)
{
	int j = 0;

	for (int i = 0; i < s->nconns; i++) {
		conn *c = s->conns[i];
		if (c->state == C_DEAD) {
			rl_buf_fini(&c->out);
			free(c);
		} else {
			s->conns[j++] = c;
		}
	}
	s->nconns = j;
}

static void *
serve(void *arg)
{
	rli_httpd *s = arg;

	for (;;) {
		double now = rl_now(), next = now + 3600;
		int np = 2, wait_ms;

		s->pfd[0] = (struct pollfd){ .fd = s->wake[0], .events = POLLIN };
		s->pfd[1] = (struct pollfd){ .fd = s->lfd, .events = now >= s->accept_paused_until ? POLLIN : 0 };
		if (now < s->accept_paused_until)
			next = s->accept_paused_until;
		for (int i = 0; i < s->nconns; i++) {
			conn *c = s->conns[i];
			s->pfd[np++] = (struct pollfd){ .fd = c->fd, .events = c->state == C_WRITE ? POLLOUT : POLLIN };
			if (c->deadline < next)
				next = c->deadline;
		}
		wait_ms = next <= now ? 0 : (int)((next - now) * 1000.0) + 1;
		if (poll(s->pfd, (nfds_t)np, wait_ms) < 0 && errno != EINTR) {
			rl_error("--http: poll: %s", strerror(errno));
			break;
		}
		if (s->pfd[0].revents)
			break;
		for (int i = 2; i < np; i++) {
			conn *c = s->conns[i - 2];
			short re = s->pfd[i].revents;
			/* a peer gone while its response is pending cannot take it */
			if ((re & (POLLERR | POLLNVAL)) || ((re & POLLHUP) && c->state == C_WRITE))
				conn_drop(c);
			else if (re & POLLOUT)
				advance(s, c);
			else if (re & (POLLIN | POLLHUP))
				on_readable(s, c);
		}
		now = rl_now();
		for (int i = 0; i < s->nconns; i++)
			if (s->conns[i]->state != C_DEAD && now >= s->conns[i]->deadline)
				on_deadline(s->conns[i]);
		sweep(s);
		if (s->pfd[1].revents & POLLIN)
			accept_some(s);
	}
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
		rl_error("--http: cannot listen on '%s': %s", url, gai_strerror(g));
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
		rl_error("--http: cannot listen on '%s': %s", url, strerror(err));
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
	int rv;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "http server")) == NULL)
		return RL_ENOMEM;
	s->cfg = *cfg;
	s->lfd = s->wake[0] = s->wake[1] = -1;
	if (s->cfg.max_conns <= 0)
		s->cfg.max_conns = RLI_HTTPD_MAX_CONNS;
	if (s->cfg.timeout_s <= 0)
		s->cfg.timeout_s = RLI_HTTPD_TIMEOUT_S;
	if ((s->conns = rl_try_calloc((size_t)s->cfg.max_conns, sizeof *s->conns, "http connections")) == NULL ||
	    (s->pfd = rl_try_calloc((size_t)s->cfg.max_conns + 2, sizeof *s->pfd, "http connections")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
		rl_error("--http: pipe: %s", strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	if ((rv = listen_on(s, url)) != 0)
		goto fail;
	if ((errno = pthread_create(&s->th, NULL, serve, s)) != 0) {
		rl_error("--http: cannot start its thread: %s", strerror(errno));
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

void
rli_httpd_close(rli_httpd *s)
{
	if (s == NULL)
		return;
	if (s->running) {
		ssize_t w;
		do
			w = write(s->wake[1], "x", 1);
		while (w < 0 && errno == EINTR);
		pthread_join(s->th, NULL);
	}
	for (int i = 0; i < s->nconns; i++) {
		conn_drop(s->conns[i]);
		rl_buf_fini(&s->conns[i]->out);
		free(s->conns[i]);
	}
	if (s->lfd >= 0)
		close(s->lfd);
	for (int i = 0; i < 2; i++)
		if (s->wake[i] >= 0)
			close(s->wake[i]);
	free(s->conns);
	free(s->pfd);
	free(s);
}

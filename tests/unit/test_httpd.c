/*
 * test_httpd.c — the HTTP server of rl-queue and rl-rollout serve (httpd.c)
 * through real sockets: a request reaches the handler parsed (path without
 * query, Authorization), owned and borrowed bodies, HEAD, the connection
 * bound (503), a deadline, 3,000 heads made of random pieces of HTTP each
 * answered with a status and a whole response (run under ASan for the
 * parser's memory safety), and a close that joins the thread while
 * connections are open, one of them stuck on a response it does not read.
 * With bodies: a body sent in pieces reaches the handler whole, a request
 * pipelined after it is answered, one over max_body reaches the handler
 * unread (too_large) and its connection closes, chunked is 411, a body that
 * stops coming is closed without an answer after body_timeout_s; answers
 * from another thread (later), a stream written after the handler returned
 * and ended, and a stream whose client does not read refused past out_max.
 */
#include "base/httpd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/rng.h"
#include "t.h"

static char big[300000];
static int calls;

static void
handler(void *arg, const rli_httpd_req *rq, rli_httpd_reply *rep)
{
	char tmp[256];
	int n;

	(void)arg;
	calls++;
	if (strcmp(rq->path, "/big") == 0) {
		rep->status = 200;
		rep->body = big;
		rep->len = sizeof big;
		return;
	}
	n = snprintf(tmp, sizeof tmp, "%s %s %s", rq->method, rq->path, rq->authorization ? rq->authorization : "-");
	rep->status = strcmp(rq->path, "/missing") == 0 ? 404 : 200;
	rep->owned = strdup(tmp);
	rep->len = (size_t)n;
}

static int
dial(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("connect");
		exit(1);
	}
	return fd;
}

/* Reads one whole response (head and Content-Length bytes) or until the
 * close, waiting at most 3 s; returns its length in out (NUL-terminated). */
static size_t
read_response(int fd, char *out, size_t cap, int head_only)
{
	size_t n = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char *e = memmem(out, n, "\r\n\r\n", 4), *cl;
		ssize_t r;

		out[n] = 0;
		if (e && (cl = strcasestr(out, "\r\nContent-Length: ")) != NULL && cl < e) {
			size_t want = (size_t)(e + 4 - out) + (head_only ? 0 : strtoul(cl + 18, NULL, 10));
			if (n >= want)
				return n;
		}
		if (n + 1 >= cap || poll(&p, 1, 3000) != 1)
			return n;
		if ((r = recv(fd, out + n, cap - 1 - n, 0)) <= 0)
			return n;
		n += (size_t)r;
	}
}

static size_t
ask(int port, const char *req, size_t len, char *out, size_t cap)
{
	int fd = dial(port);
	size_t n;

	T_OK(send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len);
	n = read_response(fd, out, cap, strncmp(req, "HEAD ", 5) == 0);
	close(fd);
	return n;
}

static void
test_requests(int port)
{
	static char out[400000];
	const char *r1 = "GET /x?q=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k k \r\n\r\n";
	const char *r2 = "HEAD /big HTTP/1.1\r\nHost: a\r\n\r\n";
	const char *r3 = "GET /big HTTP/1.0\r\n\r\n";
	size_t n;

	n = ask(port, r1, strlen(r1), out, sizeof out);
	T_OK(n > 0 && strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0, "%.40s", out);
	T_OK(strstr(out, "\r\n\r\nGET /x Bearer k k") != NULL, "%s", out);
	T_OK(strstr(out, "\r\nCache-Control: no-store\r\n") != NULL && strstr(out, "\r\nDate: ") != NULL);
	n = ask(port, r2, strlen(r2), out, sizeof out);
	T_OK(strstr(out, "\r\nContent-Length: 300000\r\n") != NULL && n == (size_t)(strstr(out, "\r\n\r\n") + 4 - out),
	    "HEAD: %zu bytes", n);
	n = ask(port, r3, strlen(r3), out, sizeof out);
	T_OK(n > sizeof big && memcmp(out + n - sizeof big, big, sizeof big) == 0, "%zu bytes", n);
	T_OK(strstr(out, "\r\nConnection: close\r\n") != NULL);
}

/* heads of random pieces, each ending with the empty line: every one gets
 * one well-formed answer; the handler sees only those that parse */
static void
test_random_heads(int port)
{
	static const char *pieces[] = {
		"GET", "HEAD", " ", "  ", "/", "/a?b", "http://h/p", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.",
		"\r\n", "\r\n", "\r\n", "\n", "\r", ":", "Host", "Host: h", "Connection: close",
		"Content-Length: 0", "Content-Length: 5", "Transfer-Encoding: x", "Authorization: Bearer z",
		"\t", "\x01", "\x7f", "\xff", "a", "x-y", "(", ",", "Connection: keep-alive",
	};
	static const int known[] = { 200, 400, 404, 413, 505 };
	char req[512], out[4096];
	rl_rng rng = { 42, 0 };
	int ok = 0;

	for (int i = 0; i < 3000; i++) {
		size_t n = 0;
		int k = 1 + (int)((uint32_t)rl_rng_next(&rng) % 14), st = 0;
		/* a third start as a good request line, so headers get parsed too */
		if (i % 3 == 0)
			n = (size_t)snprintf(req, sizeof req, "GET /r HTTP/1.1\r\n");
		for (int j = 0; j < k; j++) {
			const char *p = pieces[(uint32_t)rl_rng_next(&rng) % RL_ARRAY_LEN(pieces)];
			memcpy(req + n, p, strlen(p));
			n += strlen(p);
		}
		/* empty lines alone are skipped as before a request line: the
		 * server would wait for one until the deadline */
		req[n] = 0;
		if (strspn(req, "\r\n") >= n)
			req[0] = 'X';
		memcpy(req + n, "\r\n\r\n", 4);
		n += 4;
		ask(port, req, n, out, sizeof out);
		if (sscanf(out, "HTTP/1.1 %d ", &st) == 1) {
			int was = ok;
			for (size_t q = 0; q < RL_ARRAY_LEN(known); q++)
				ok += st == known[q];
			T_OK(ok > was, "status %d for %d: %.*s", st, i, (int)n, req);
		} else
			T_OK(0, "no answer to %d: %.*s", i, (int)n, req);
	}
	T_EQ_INT(ok, 3000);
}

static void
test_bounds_and_close(rli_httpd *s, int port)
{
	char out[4096];
	int fds[3], stuck;
	double t0;
	size_t n;

	for (int i = 0; i < 3; i++)
		fds[i] = dial(port);
	usleep(100000);
	stuck = dial(port);   /* the 4th of max_conns 3 */
	n = read_response(stuck, out, sizeof out, 0);
	T_OK(n > 0 && strncmp(out, "HTTP/1.1 503 ", 13) == 0, "%.40s", out);
	close(stuck);
	/* the deadline (0.5 s) frees the three idle ones */
	t0 = rl_now();
	n = read_response(fds[0], out, sizeof out, 0);
	T_OK(n == 0 && rl_now() - t0 > 0.3 && rl_now() - t0 < 2, "closed after %.2f s", rl_now() - t0);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	usleep(100000);
	/* one connection stuck on responses it does not read, one idle: close
	 * still joins at once */
	stuck = dial(port);
	for (int i = 0; i < 20; i++)
		T_OK(send(stuck, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n", 30, MSG_NOSIGNAL) == 30);
	fds[0] = dial(port);
	usleep(100000);
	t0 = rl_now();
	rli_httpd_close(s);
	T_OK(rl_now() - t0 < 0.3, "close took %.2f s", rl_now() - t0);
	T_OK(recv(fds[0], out, sizeof out, 0) == 0);   /* closed by the server */
	close(stuck);
	close(fds[0]);
}


/* ---- bodies, later answers and streams ---- */

static uint64_t later_id, stream_id;
static int too_large_seen;

static void
handler2(void *arg, const rli_httpd_req *rq, rli_httpd_reply *rep)
{
	const char *x = rli_httpd_field(rq, "x-test");

	(void)arg;
	rep->status = 200;
	if (rq->too_large) {
		__atomic_add_fetch(&too_large_seen, 1, __ATOMIC_SEQ_CST);
		rep->status = 413;
		rep->owned = strdup("{\"error\":\"big\"}");
		rep->len = strlen(rep->owned);
		return;
	}
	if (strcmp(rq->path, "/later") == 0) {
		__atomic_store_n(&later_id, rq->id, __ATOMIC_SEQ_CST);
		rep->later = 1;
		return;
	}
	if (strcmp(rq->path, "/stream") == 0) {
		__atomic_store_n(&stream_id, rq->id, __ATOMIC_SEQ_CST);
		rep->stream = 1;
		rep->type = "text/event-stream";
		return;
	}
	/* the body as sent, and the X-Test field */
	rep->owned = malloc(rq->body_len + 64);
	rep->len = (size_t)sprintf(rep->owned, "%s|%zu|", x ? x : "-", rq->body_len);
	if (rq->body)
		memcpy(rep->owned + rep->len, rq->body, rq->body_len), rep->len += rq->body_len;
}

static int
sends(int fd, const char *p)
{
	return send(fd, p, strlen(p), MSG_NOSIGNAL) == (ssize_t)strlen(p);
}

static void
wait_id(uint64_t *id)
{
	/* set on the server's thread */
	for (int i = 0; i < 300 && __atomic_load_n(id, __ATOMIC_SEQ_CST) == 0; i++)
		usleep(10000);
}

static void
test_bodies(int port)
{
	char out[8192];
	int fd;
	size_t n;
	double t0;

	/* in three pieces, then a pipelined GET behind it */
	fd = dial(port);
	T_OK(sends(fd, "POST /e HTTP/1.1\r\nHost: a\r\nX-Test: yes\r\nContent-Length: 10\r\n\r\n0123"));
	usleep(50000);
	T_OK(sends(fd, "456"));
	usleep(50000);
	T_OK(sends(fd, "789GET /g HTTP/1.1\r\nHost: a\r\n\r\n"));
	/* both answers, in one read or two */
	n = read_response(fd, out, sizeof out, 0);
	if (strstr(out, "-|0|") == NULL)
		n += read_response(fd, out + n, sizeof out - n, 0);
	T_OK(n > 0 && strstr(out, "\r\n\r\nyes|10|0123456789HTTP/1.1 200 OK\r\n") != NULL, "%s", out);
	T_OK(strstr(out, "\r\n\r\n-|0|") != NULL, "%s", out);
	close(fd);
	/* over max_body (100): the handler answers unread, the connection closes */
	fd = dial(port);
	T_OK(sends(fd, "POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\nab"));
	n = read_response(fd, out, sizeof out, 0);
	T_OK(strncmp(out, "HTTP/1.1 413 ", 13) == 0 && strstr(out, "Connection: close") &&
	    __atomic_load_n(&too_large_seen, __ATOMIC_SEQ_CST) == 1, "%s", out);
	T_OK(recv(fd, out, sizeof out, 0) == 0);
	close(fd);
	n = ask(port, "POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", strlen("POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n"), out, sizeof out);
	T_OK(strncmp(out, "HTTP/1.1 413 ", 13) == 0 && __atomic_load_n(&too_large_seen, __ATOMIC_SEQ_CST) == 2,
	    "%s", out);
	n = ask(port, "POST /e HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", strlen("POST /e HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), out, sizeof out);
	T_OK(strncmp(out, "HTTP/1.1 411 ", 13) == 0, "%s", out);
	n = ask(port, "POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", strlen("POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n"), out, sizeof out);
	T_OK(strncmp(out, "HTTP/1.1 400 ", 13) == 0, "%s", out);
	/* a body that stops: closed without an answer after body_timeout_s (0.5) */
	fd = dial(port);
	T_OK(sends(fd, "POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\nab"));
	t0 = rl_now();
	n = read_response(fd, out, sizeof out, 0);
	T_OK(n == 0 && rl_now() - t0 > 0.3 && rl_now() - t0 < 2, "%zu bytes, %.2f s", n, rl_now() - t0);
	close(fd);
}

static void
test_later_and_stream(rli_httpd *s, int port)
{
	char out[8192], chunk[1000];
	rli_httpd_reply rep = { .status = 201, .body = "done", .len = 4 };
	size_t n = 0;
	ssize_t r;
	int fd, rv = 0, k;

	fd = dial(port);
	T_OK(sends(fd, "GET /later HTTP/1.1\r\nHost: a\r\n\r\n"));
	wait_id(&later_id);
	usleep(50000);
	T_EQ_INT(rli_httpd_answer(s, later_id, &rep), 0);
	T_EQ_INT(rli_httpd_answer(s, later_id, &rep), RL_ENET);   /* once */
	n = read_response(fd, out, sizeof out, 0);
	T_OK(strncmp(out, "HTTP/1.1 201 ", 13) == 0 && strstr(out, "\r\n\r\ndone"), "%s", out);
	/* the connection stays open for the next request */
	T_OK(sends(fd, "GET /g HTTP/1.1\r\nHost: a\r\n\r\n"));
	n = read_response(fd, out, sizeof out, 0);
	T_OK(strncmp(out, "HTTP/1.1 200 ", 13) == 0, "%s", out);

	/* a stream on the same connection, after the keep-alive answers */
	T_OK(sends(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"));
	wait_id(&stream_id);
	for (int i = 0; i < 5; i++) {
		k = snprintf(chunk, sizeof chunk, "data: %d\n\n", i);
		T_EQ_INT(rli_httpd_stream_write(s, stream_id, chunk, (size_t)k), 0);
	}
	rli_httpd_stream_end(s, stream_id);
	n = 0;
	while (n + 1 < sizeof out && (r = recv(fd, out + n, sizeof out - 1 - n, 0)) > 0)
		n += (size_t)r;
	out[n] = 0;
	T_OK(strstr(out, "Content-Length") == NULL && strstr(out, "Content-Type: text/event-stream\r\n") &&
	    strstr(out, "\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n") && r == 0, "%s", out);
	T_EQ_INT(rli_httpd_stream_write(s, stream_id, "x", 1), RL_ENET);
	close(fd);

	/* a client that reads nothing: refused once the queue passes out_max
	 * (the socket's own buffers take some first), never buffered without end */
	__atomic_store_n(&stream_id, 0, __ATOMIC_SEQ_CST);
	fd = dial(port);
	T_OK(sends(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"));
	wait_id(&stream_id);
	memset(chunk, 'z', sizeof chunk);
	for (k = 0; k < 100000; k++) {
		if ((rv = rli_httpd_stream_write(s, stream_id, chunk, sizeof chunk)) != 0)
			break;
		if (k % 50 == 0)
			usleep(2000);   /* the server's thread fills the socket meanwhile */
	}
	T_EQ_INT(rv, RL_ENET);
	T_OK(k < 20000, "%d KB taken before the bound", k);
	close(fd);
}

int
main(void)
{
	rli_httpd_config cfg = { .host = "127.0.0.1", .port = "0", .max_conns = 3, .timeout_s = 0.5, .fn = handler };
	rli_httpd *s = NULL;
	int rv, port;
	char err[512];

	T_BEGIN("httpd");
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (char)('a' + i % 26);
	T_EQ_INT(rli_httpd_open(&s, &cfg, "http://127.0.0.1:0"), 0);
	if (s == NULL)
		T_END();
	port = rli_httpd_port(s);
	T_OK(port > 0);
	test_requests(port);
	test_random_heads(port);
	/* a port taken: RL_ENET, the address and the reason named */
	{
		char url[64], p[16];
		rli_httpd *s2 = NULL;
		rli_httpd_config c2 = cfg;
		snprintf(p, sizeof p, "%d", port);
		snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
		c2.port = p;
		T_CAPTURE(rli_httpd_open(&s2, &c2, url), &rv, err);
		T_EQ_INT(rv, RL_ENET);
		T_OK(strstr(err, "cannot listen on 'http://127.0.0.1:") != NULL && strstr(err, "in use") != NULL, "%s", err);
		T_OK(s2 == NULL);
	}
	test_bounds_and_close(s, port);
	{
		rli_httpd_config c3 = { .host = "127.0.0.1", .port = "0", .timeout_s = 5, .body_timeout_s = 0.5,
			.max_body = 100, .out_max = 4096, .fn = handler2 };
		T_EQ_INT(rli_httpd_open(&s, &c3, "http://127.0.0.1:0"), 0);
		if (s == NULL)
			T_END();
		port = rli_httpd_port(s);
		test_bodies(port);
		test_later_and_stream(s, port);
		rli_httpd_close(s);
	}
	T_END();
}

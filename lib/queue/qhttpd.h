/*
 * qhttpd.h — the small HTTP/1.1 server under rl-queue's listener
 * (qhttp.c): one thread, poll(2), non-blocking plain sockets, no TLS.
 *
 * It bounds what a client can hold: at most max_conns connections (one
 * more is answered 503 with Connection: close and closed at once), a
 * deadline per connection (a whole request head within timeout_s of the
 * connection's start or of the previous response; a response taken within
 * timeout_s; an idle keep-alive connection closed at the same deadline),
 * and a request head of at most RLI_HTTPD_HEAD_MAX bytes (431, closed).
 * Requests are parsed strictly (RFC 9112): a bad request line or header
 * is answered 400, a version other than HTTP/1.x 505, and the connection
 * closed.  No route takes a body: a request announcing one
 * (Content-Length other than 0, or any Transfer-Encoding) is answered 413
 * and closed before any of it is read.  Keep-alive for HTTP/1.1 unless
 * "Connection: close" (HTTP/1.0: only with "Connection: keep-alive");
 * pipelined requests are answered in order, one at a time (the next head
 * is not read until the response before it is written).  HEAD gets the
 * GET's headers and no body.  After a closing response the server stops
 * writing and reads and drops what the client still sends for a short
 * while, so the response is not lost to a reset.
 * Leaves out: TLS, request bodies, chunked responses, HTTP/2.
 */
#ifndef RL_QHTTPD_H
#define RL_QHTTPD_H

#include <stddef.h>

#include "base/core.h"

#define RLI_HTTPD_HEAD_MAX 8192          /* request line and headers, with the empty line */
#define RLI_HTTPD_MAX_CONNS 64
#define RLI_HTTPD_TIMEOUT_S 10.0

/* A parsed request, valid for the handler's call only. */
typedef struct rli_httpd_req {
	const char *method;           /* "GET", "HEAD", ... (case-sensitive, as sent) */
	const char *path;             /* the target's path, query cut off: "/metrics" */
	const char *authorization;    /* the Authorization header's value, or NULL */
} rli_httpd_req;

/* What the handler answers.  The server adds Date, Content-Length,
 * Cache-Control: no-store and Connection; for HEAD it sends no body. */
typedef struct rli_httpd_reply {
	int status;                   /* 200, 401, 404, 405, 500, ... */
	const char *type;             /* Content-Type; static */
	const char *extra;            /* more header lines, each ending "\r\n", or NULL; static */
	const void *body;             /* borrowed: must live as long as the server */
	size_t len;
	char *owned;                  /* or a malloc'd body of len bytes the server frees */
} rli_httpd_reply;

/* Called on the server's thread for each request that passed the checks
 * above; fills rep (all zero on entry). */
typedef void (*rli_httpd_fn)(void *arg, const rli_httpd_req *req, rli_httpd_reply *rep);

typedef struct rli_httpd_config {
	const char *host;             /* numeric address or "localhost"; borrowed */
	const char *port;             /* "0": any free port */
	int max_conns;                /* 0: RLI_HTTPD_MAX_CONNS */
	double timeout_s;             /* 0: RLI_HTTPD_TIMEOUT_S */
	rli_httpd_fn fn;
	void *arg;                    /* passed to fn; borrowed, outlives the server */
} rli_httpd_config;

typedef struct rli_httpd rli_httpd;

/* Binds and listens (errors come back here, before any thread starts),
 * then serves on a thread of its own.  RL_ENET: cannot listen (logged as
 * "cannot listen on 'url'" with the reason; url names the address in
 * messages), RL_ENOMEM, RL_EIO (no thread). */
int rli_httpd_open(rli_httpd **out, const rli_httpd_config *cfg, const char *url);
/* The port bound (useful with port "0"). */
int rli_httpd_port(const rli_httpd *s);
/* Wakes the thread, joins it, closes every connection and frees.  Accepts NULL. */
void rli_httpd_close(rli_httpd *s);

#endif

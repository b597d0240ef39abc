/*
 * httpd.h — the small HTTP/1.1 server under rl-queue's listener (qhttp.c)
 * and `rl-rollout serve` (serve.c): one thread, poll(2), non-blocking
 * plain sockets, no TLS.
 *
 * It bounds what a client can hold: at most max_conns connections (one
 * more is answered 503 with Connection: close and closed at once), a
 * deadline per connection (a whole request head within timeout_s of the
 * connection's start or of the previous response; a body within
 * body_timeout_s of its head, else the connection is closed without an
 * answer; a response taken within timeout_s, a stream's queued bytes
 * taken with progress at least every timeout_s; an idle keep-alive
 * connection closed at the head deadline), a request head of at most
 * RLI_HTTPD_HEAD_MAX bytes (431, closed) and of at most RLI_HTTPD_FIELDS
 * header lines (431), and a stream's queue of at most out_max bytes not
 * yet taken by the client (over it the connection is dropped).
 * Requests are parsed strictly (RFC 9112): a bad request line or header
 * is answered 400, a version other than HTTP/1.x 505, and the connection
 * closed.  Bodies: with max_body 0 no route takes one, and a request
 * announcing one (Content-Length other than 0, or any Transfer-Encoding)
 * is answered 413 and closed before any of it is read; with max_body > 0 a
 * Content-Length body up to max_body is read before the handler is called,
 * a larger one is not read: the handler is called with too_large set and
 * the connection closes after its answer; Transfer-Encoding (chunked) is
 * answered 411.  Keep-alive for HTTP/1.1 unless "Connection: close"
 * (HTTP/1.0: only with "Connection: keep-alive"); pipelined requests are
 * answered in order, one at a time (the next head is not read until the
 * response before it is written).  HEAD gets the GET's headers and no
 * body.  After a closing response the server stops writing and reads and
 * drops what the client still sends for a short while, so the response is
 * not lost to a reset.
 *
 * A handler may answer later, from any thread: it sets rep->later and
 * keeps req->id, then calls rli_httpd_answer once (the connection waits
 * without a deadline meanwhile: a long generation is not cut).  Or it streams
 * (server-sent events): rep->stream sends the head at once (no
 * Content-Length, Connection: close) and rli_httpd_stream_write adds
 * bytes until rli_httpd_stream_end; both copy what they are given into
 * the connection's bounded queue and wake the server's thread.  An id
 * whose connection is gone (the client left, a deadline, a bound) answers
 * RL_ENET, so the caller can stop the work behind it.
 * Leaves out: TLS, chunked request bodies, chunked responses (a stream
 * ends with the connection), HTTP/2.
 */
#ifndef RL_HTTPD_H
#define RL_HTTPD_H

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"

#define RLI_HTTPD_HEAD_MAX 8192          /* request line and headers, with the empty line */
#define RLI_HTTPD_FIELDS 64              /* header lines of one request */
#define RLI_HTTPD_MAX_CONNS 64
#define RLI_HTTPD_TIMEOUT_S 10.0
#define RLI_HTTPD_OUT_MAX (1u << 20)     /* a stream's bytes queued, not yet taken */

/* A parsed request, valid for the handler's call only. */
typedef struct rli_httpd_req {
	const char *method;           /* "GET", "HEAD", ... (case-sensitive, as sent) */
	const char *path;             /* the target's path, query cut off: "/metrics" */
	const char *authorization;    /* the Authorization header's value, or NULL */
	uint64_t id;                  /* names the connection in rli_httpd_answer / _stream_* */
	int has_length;               /* a Content-Length header was sent */
	int too_large;                /* its length is over max_body: the body was not read */
	unsigned long long length;    /* Content-Length's value (0 without one) */
	const char *body;             /* the body (max_body > 0), NUL-terminated; NULL when none */
	size_t body_len;
	int nfields;
	const char *field_name[RLI_HTTPD_FIELDS], *field_value[RLI_HTTPD_FIELDS];
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
	int close;                    /* close the connection after this answer */
	int later;                    /* no answer now: rli_httpd_answer(req->id) comes */
	int stream;                   /* the head now (Cache-Control: no-cache), the body by
	                               * rli_httpd_stream_write until rli_httpd_stream_end */
} rli_httpd_reply;

/* Called on the server's thread for each request that passed the checks
 * above; fills rep (all zero on entry).  It must not call rli_httpd_close. */
typedef void (*rli_httpd_fn)(void *arg, const rli_httpd_req *req, rli_httpd_reply *rep);

typedef struct rli_httpd_config {
	const char *host;             /* numeric address or "localhost"; borrowed */
	const char *port;             /* "0": any free port */
	const char *opt;              /* the option named in messages ("--http"); NULL: "--http" */
	int max_conns;                /* 0: RLI_HTTPD_MAX_CONNS */
	double timeout_s;             /* 0: RLI_HTTPD_TIMEOUT_S */
	size_t max_body;              /* 0: no request bodies */
	double body_timeout_s;        /* 0: timeout_s */
	size_t out_max;               /* 0: RLI_HTTPD_OUT_MAX */
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
/* The first header field called name (any case), or NULL. */
const char *rli_httpd_field(const rli_httpd_req *req, const char *name);
/* The answer of a request whose handler set rep->later (any thread, once;
 * rep's body is copied, rep->owned stays the caller's).  RL_ENET: its
 * connection is gone; RL_ENOMEM. */
int rli_httpd_answer(rli_httpd *s, uint64_t id, const rli_httpd_reply *rep);
/* Queues n bytes on a stream (any thread).  RL_ENET: the connection is
 * gone, or would hold more than out_max bytes its client has not taken (it
 * is then dropped); RL_ENOMEM. */
int rli_httpd_stream_write(rli_httpd *s, uint64_t id, const void *p, size_t n);
/* The stream is whole: the connection closes once its bytes are out. */
void rli_httpd_stream_end(rli_httpd *s, uint64_t id);
/* Waits until the answers and streams already queued are out, wait_s at
 * most (the thread serves on meanwhile): a shutdown's last answers reach
 * their clients before rli_httpd_close drops every connection. */
void rli_httpd_drain(rli_httpd *s, double wait_s);
/* Wakes the thread, joins it, closes every connection and frees.  Accepts NULL. */
void rli_httpd_close(rli_httpd *s);

#endif

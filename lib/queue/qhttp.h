/*
 * qhttp.h — rl-queue's HTTP listener (on base/httpd.h's server): /metrics
 * (Prometheus text exposition format 0.0.4), /api/stats (the JSON of
 * `rl-queue stat --json`) and / (a self-contained dashboard page that polls
 * /api/stats, drawn with Chart.js from Debian's libjs-chart.js, put inline
 * in the page).  Every figure comes from one stats callback, so the three
 * views and `rl-queue stat` agree.
 *
 * Binds to loopback addresses only unless allow_public is set (the
 * listener has no TLS).  With the process's shared key (base/auth.h) the
 * data routes need it as a bearer token.  Every route takes GET and HEAD
 * and no request body (413, the connection closed, nothing read).
 * Connections are bounded in number and time (max_conns, timeout_s; see
 * base/httpd.h for what a client over a bound gets).
 */
#ifndef RL_QHTTP_H
#define RL_QHTTP_H

#include <stddef.h>

#include "base/core.h"
#include "base/io.h"

/* Stats source: puts a malloc'd NUL-terminated JSON object in *json (the
 * caller frees it); returns 0 or an rl_err.  Called from the listener's thread. */
typedef int (*rl_qhttp_stats_fn)(void *arg, char **json);

typedef struct rl_qhttp_config {
	const char *addr;        /* HOST:PORT, [V6]:PORT, :PORT or http://HOST:PORT; borrowed */
	int allow_public;        /* bind to non-loopback addresses too */
	rl_qhttp_stats_fn stats;
	void *arg;               /* passed to stats; borrowed, must outlive the listener */
	int max_conns;           /* connections at once (0: 64) */
	double timeout_s;        /* a request head within this of the connection's start
	                          * or of the last response; an idle one closed then (0: 10) */
} rl_qhttp_config;

typedef struct rl_qhttp rl_qhttp;

/* rl_qhttp_parse_addr: turns addr into a URL ("http://HOST:PORT") in
 * url (n bytes) and sets *loopback when HOST is localhost, 127.0.0.0/8 or
 * ::1 (literals only: other names count as public).  ":PORT" means
 * 127.0.0.1.  Errors: RL_EINVAL (bad form or port), RL_ETOOBIG (url too
 * small). */
int rl_qhttp_parse_addr(char *url, size_t n, int *loopback, const char *addr);
/* HOST and PORT of a URL rl_qhttp_parse_addr made ("http://H:P",
 * "http://[V6]:P"), for rli_httpd_config. */
void rl_qhttp_split_url(char *host, size_t hn, char *port, size_t pn, const char *url);

/* rl_qhttp_open: parses cfg->addr, refuses a public address unless
 * cfg->allow_public (RL_EINVAL, logged with a hint), then listens and
 * serves.  Errors: RL_EINVAL, RL_ENET (cannot listen: logged), RL_ENOMEM. */
int rl_qhttp_open(rl_qhttp **out, const rl_qhttp_config *cfg);
/* The URL served (with the bound port when addr asked for port 0). */
const char *rl_qhttp_url(const rl_qhttp *h);
/* Stops the listener and frees.  Accepts NULL. */
void rl_qhttp_close(rl_qhttp *h);

/* rl_qhttp_prometheus: appends the Prometheus text exposition of the stats
 * JSON (as rl_qserve_stats_json makes it) to out.  Figures absent from the
 * JSON are left out, not invented.  Errors: RL_EFORMAT (not a JSON
 * object), RL_ENOMEM. */
int rl_qhttp_prometheus(rl_buf *out, const char *json);

/* The dashboard page (lib/queue/dashboard.html: HTML with inline CSS and
 * JS, no external URL), with the marker <!--CHARTJS--> where the listener
 * puts Chart.js. */
extern const char rl_qhttp_page[];

/* Where the listener reads Chart.js (Debian's libjs-chart.js); RL_CHARTJS
 * names another file. */
#define RL_QHTTP_CHARTJS "/usr/share/javascript/chart.js/chart.min.js"

/* rl_qhttp_page_build: the page as served: rl_qhttp_page with Chart.js read
 * from chartjs (NULL: $RL_CHARTJS, else RL_QHTTP_CHARTJS) in an inline
 * script at the marker.  A file that cannot be read, or holds "</script",
 * gives the page without charts and a line saying why (on the page and,
 * once, as a warning): the tables still work.  RL_ENOMEM. */
int rl_qhttp_page_build(rl_buf *out, const char *chartjs);

#endif

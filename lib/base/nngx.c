/*
 * nngx.c — nng helpers (see nngx.h).
 */
#include "base/nngx.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"

struct closer {
	nng_socket sock;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	int done, refs;
};

static void
closer_unref(struct closer *k)
{
	int last;

	pthread_mutex_lock(&k->mtx);
	last = --k->refs == 0;
	pthread_mutex_unlock(&k->mtx);
	if (last) {
		pthread_mutex_destroy(&k->mtx);
		pthread_cond_destroy(&k->cv);
		free(k);
	}
}

static void *
closer_main(void *arg)
{
	struct closer *k = arg;

	nng_close(k->sock);
	pthread_mutex_lock(&k->mtx);
	k->done = 1;
	pthread_cond_signal(&k->cv);
	pthread_mutex_unlock(&k->mtx);
	closer_unref(k);
	return NULL;
}

int
rli_nng_close_timed(nng_socket sock, const char *what)
{
	struct closer *k = calloc(1, sizeof *k);
	struct timespec ts;
	pthread_t th;
	int done;

	if (k == NULL) {
		nng_close(sock);
		return 1;
	}
	k->sock = sock;
	k->refs = 2;
	pthread_mutex_init(&k->mtx, NULL);
	pthread_cond_init(&k->cv, NULL);
	if (pthread_create(&th, NULL, closer_main, k) != 0) {
		nng_close(sock);
		k->refs = 1;
		closer_unref(k);
		return 1;
	}
	pthread_detach(th);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 1;
	pthread_mutex_lock(&k->mtx);
	while (!k->done && pthread_cond_timedwait(&k->cv, &k->mtx, &ts) == 0)
		;
	if (!(done = k->done))
		rl_verbose("closing the %s hangs (nng bug #1543); leaving it", what);
	pthread_mutex_unlock(&k->mtx);
	closer_unref(k);
	return done;
}

static int
port_check(const char *url, long lo)
{
	const char *p, *hp;
	long port = 0;
	size_t nd = 0;

	if (strncmp(url, "tcp://", 6) == 0)
		hp = url + 6;
	else if (strncmp(url, "tls+tcp://", 10) == 0)
		hp = url + 10;
	else
		return RL_OK;
	if (*hp == '[') { /* [v6]:port */
		const char *e = strchr(hp, ']');
		p = e && e[1] == ':' ? e + 2 : NULL;
	} else {
		p = strrchr(hp, ':');
		p = p ? p + 1 : NULL;
	}
	if (p != NULL) {
		for (; p[nd] >= '0' && p[nd] <= '9' && nd < 6; nd++)
			port = port * 10 + (p[nd] - '0');
	}
	if (p == NULL || nd == 0 || p[nd] != 0 || port < lo || port > 65535) {
		rl_error("'%s': not HOST:PORT with a TCP port from %ld to 65535%s", url, lo,
			 lo == 0 ? " (0: any free one)" : "");
		return RL_EINVAL;
	}
	return RL_OK;
}

int rli_url_port_check(const char *url) { return port_check(url, 1); }
int rli_url_port_check_listen(const char *url) { return port_check(url, 0); }

/* the host of scheme://HOST:PORT[/...]: "" for none or a wildcard */
static void
url_host(const char *url, char *host, size_t n)
{
	const char *hp = strstr(url, "://"), *e;
	size_t k;

	host[0] = 0;
	if (hp == NULL)
		return;
	hp += 3;
	if (*hp == '[') {
		hp++;
		e = strchr(hp, ']');
	} else {
		const char *slash = strchr(hp, '/');
		e = strrchr(hp, ':');
		if (e == NULL || (slash && e > slash))
			e = slash ? slash : hp + strlen(hp);
	}
	if (e == NULL)
		return;
	k = (size_t)(e - hp);
	if (k >= n)
		k = n - 1;
	memcpy(host, hp, k);
	host[k] = 0;
	if (strcmp(host, "*") == 0)
		host[0] = 0;
}

int
rli_url_is_local(const char *url)
{
	char host[256];
	struct in_addr a4;
	struct in6_addr a6;

	if (strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0 ||
	    strncmp(url, "abstract://", 11) == 0)
		return 1;
	url_host(url, host, sizeof host);
	if (strcmp(host, "localhost") == 0)
		return 1;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return 0; /* a wildcard, another address or a name that may resolve to any */
}

int
rli_listen_policy(const char *prog, const char *url, int secured, int allow_public)
{
	if (rli_url_is_local(url) || secured || allow_public)
		return RL_OK;
	rl_error("%s: refusing to listen on '%s': not a loopback address", prog, url);
	rl_hint("nothing on this listener is authenticated: anyone who reaches it could lease, acknowledge, drop or "
		"push; add --listen-public to serve it anyway (on a network you trust)");
	return RL_EINVAL;
}

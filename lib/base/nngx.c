/*
 * nngx.c — nng helpers (see nngx.h).
 */
#include "base/nngx.h"

#include <arpa/inet.h>
#include <nng/supplemental/tls/tls.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "base/io.h"
#include "base/tls_ossl.h"

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
		"push; listen on tls+tcp:// with --tls-cert, --tls-key and --tls-ca (clients must then present a "
		"certificate that CA signed), or add --listen-public to serve it anyway (on a network you trust)");
	return RL_EINVAL;
}

/* ---- TLS ---------------------------------------------------------------------------------- */

/* The process's TLS files: set once by a command (--tls-*), else read from
 * RL_TLS_CERT, RL_TLS_KEY and RL_TLS_CA at the first tls+ URL. */
static pthread_mutex_t tls_mu = PTHREAD_MUTEX_INITIALIZER;
static char *tls_cert, *tls_key, *tls_ca;
static int tls_set;

int
rli_nng_tls_files(const char *cert, const char *key, const char *ca)
{
	int rv = RL_OK;

	if ((cert == NULL) != (key == NULL)) {
		rl_error("--tls-cert and --tls-key go together (the certificate and its private key)");
		return RL_EINVAL;
	}
	pthread_mutex_lock(&tls_mu);
	free(tls_cert);
	free(tls_key);
	free(tls_ca);
	tls_cert = cert ? strdup(cert) : NULL;
	tls_key = key ? strdup(key) : NULL;
	tls_ca = ca ? strdup(ca) : NULL;
	if ((cert && !tls_cert) || (key && !tls_key) || (ca && !tls_ca))
		rv = RL_ENOMEM;
	tls_set = 1;
	pthread_mutex_unlock(&tls_mu);
	return rv;
}

int
rli_nng_tls_opt(int which, const char *path)
{
	char **slot = which == 'c' ? &tls_cert : which == 'k' ? &tls_key : &tls_ca;
	char *p = strdup(path);

	if (p == NULL)
		return RL_ENOMEM;
	pthread_mutex_lock(&tls_mu);
	free(*slot);
	*slot = p;
	tls_set = 1;
	pthread_mutex_unlock(&tls_mu);
	return RL_OK;
}

int
rli_nng_tls_authenticates(void)
{
	int r;

	pthread_mutex_lock(&tls_mu);
	r = tls_ca != NULL && tls_cert != NULL;
	pthread_mutex_unlock(&tls_mu);
	return r;
}

static int
is_tls(const char *url)
{
	return strncmp(url, "tls+", 4) == 0;
}

static int
tls_err(const char *what, const char *file, int e)
{
	rl_error("TLS: cannot use %s '%s': %s", what, file, nng_strerror(e));
	return RL_EINVAL;
}

/* a configuration for a server or a client of url, from the files; the
 * caller frees it */
static int
tls_config(nng_tls_config **out, int server, const char *url)
{
	char *cert = NULL, *key = NULL, host[256];
	size_t n;
	nng_tls_config *c = NULL;
	int e, rv = RL_OK;

	*out = NULL;
	pthread_mutex_lock(&tls_mu);
	if (!tls_set) {
		const char *ec = getenv("RL_TLS_CERT"), *ek = getenv("RL_TLS_KEY"), *ea = getenv("RL_TLS_CA");
		tls_cert = ec && *ec ? strdup(ec) : NULL;
		tls_key = ek && *ek ? strdup(ek) : NULL;
		tls_ca = ea && *ea ? strdup(ea) : NULL;
		tls_set = 1;
	}
	if ((tls_cert == NULL) != (tls_key == NULL)) {
		rl_error("'%s': --tls-cert and --tls-key go together (the certificate and its private key)", url);
		rv = RL_EINVAL;
	} else if (server && (tls_cert == NULL || tls_key == NULL)) {
		rl_error("'%s': a TLS listener needs --tls-cert and --tls-key", url);
		rv = RL_EINVAL;
	} else if (!server && tls_ca == NULL) {
		rl_error("'%s': a TLS connection needs --tls-ca, the CA that signed the server's certificate", url);
		rv = RL_EINVAL;
	} else if ((tls_cert && (rv = rl_io_read_file(tls_cert, 1 << 20, &cert, &n)) != 0) ||
		   (tls_key && (rv = rl_io_read_file(tls_key, 1 << 20, &key, &n)) != 0)) {
		rl_error("TLS: cannot read '%s': %s", cert ? tls_key : tls_cert, rl_strerror(rv));
	} else if ((rv = rl_tls_use_openssl()) != 0) {
		/* the message is out */
	} else if ((e = nng_tls_config_alloc(&c, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT)) != 0) {
		rl_error("TLS: %s", nng_strerror(e));
		rv = RL_ENET;
	} else if (cert && (e = nng_tls_config_own_cert(c, cert, key, NULL)) != 0) {
		rv = tls_err("the certificate and key", tls_cert, e);
	} else if (tls_ca && (e = nng_tls_config_ca_file(c, tls_ca)) != 0) {
		rv = tls_err("the CA file", tls_ca, e);
	} else if ((e = nng_tls_config_auth_mode(c, tls_ca ? NNG_TLS_AUTH_MODE_REQUIRED : NNG_TLS_AUTH_MODE_NONE)) != 0) {
		rl_error("TLS: %s", nng_strerror(e));
		rv = RL_ENET;
	} else if (!server) {
		struct in6_addr a6;
		url_host(url, host, sizeof host);
		/* mbedTLS 2.28 matches DNS names only: for an address the chain
		 * to the CA is checked, not the name */
		if (host[0] && inet_pton(AF_INET, host, &a6) != 1 && inet_pton(AF_INET6, host, &a6) != 1 &&
		    (e = nng_tls_config_server_name(c, host)) != 0) {
			rl_error("TLS: server name '%s': %s", host, nng_strerror(e));
			rv = RL_EINVAL;
		}
	}
	pthread_mutex_unlock(&tls_mu);
	free(cert);
	free(key);
	if (rv != 0) {
		if (c)
			nng_tls_config_free(c);
		return rv;
	}
	*out = c;
	return RL_OK;
}

int
rli_nng_listen(nng_socket s, const char *url, nng_listener *lp)
{
	nng_listener l;
	nng_tls_config *c = NULL;
	int e, rv;

	if (!is_tls(url)) {
		e = nng_listen(s, url, &l, 0);
		if (e == 0 && lp)
			*lp = l;
		return e;
	}
	if ((rv = tls_config(&c, 1, url)) != 0)
		return NNG_EINVAL;
	if ((e = nng_listener_create(&l, s, url)) == 0 &&
	    (e = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, c)) == 0 && (e = nng_listener_start(l, 0)) == 0) {
		if (lp)
			*lp = l;
	}
	nng_tls_config_free(c); /* the listener holds its own reference */
	return e;
}

int
rli_nng_dial(nng_socket s, const char *url, nng_dialer *dp, int flags)
{
	nng_dialer d;
	nng_tls_config *c = NULL;
	int e, rv;

	if (!is_tls(url))
		return nng_dial(s, url, dp, flags);
	if ((rv = tls_config(&c, 0, url)) != 0)
		return NNG_EINVAL;
	if ((e = nng_dialer_create(&d, s, url)) == 0 && (e = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, c)) == 0) {
		/* one connection first, so a refused handshake is an error that
		 * names itself; a server not up yet is dialled again in the
		 * background as for tcp:// */
		char why[256];
		rli_tls_last_error(why, sizeof why); /* an older failure's reason is not this one's */
		e = nng_dialer_start(d, 0);
		if (e == NNG_ECRYPTO || e == NNG_EPEERAUTH || e == NNG_ECLOSED || e == NNG_ECONNRESET ||
		    e == NNG_ECONNSHUT) {
			if (rli_tls_last_error(why, sizeof why))
				rl_error("'%s': TLS handshake failed: %s (%s)", url, nng_strerror(e), why);
			else
				rl_error("'%s': TLS handshake failed: %s", url, nng_strerror(e));
			rl_hint("both ends need certificates signed by the CA the other end was given (--tls-ca), "
				"and the server's must name the host dialled");
			nng_dialer_close(d);
		} else if (e != 0 && (flags & NNG_FLAG_NONBLOCK)) {
			e = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
		}
		if (e == 0 && dp)
			*dp = d;
	}
	nng_tls_config_free(c);
	return e;
}

/*
 * nngx.c — nng helpers (see nngx.h).
 */
#include "base/nngx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <nng/supplemental/tls/tls.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "base/tls_ossl.h"

/* An nng call that may hang (nng 1.5: a close, a TLS dialer's first
 * connection), made on a helper thread that the caller waits for until a
 * deadline.  The call's state is shared and freed by whichever of the two
 * lets go last, so a caller that gave up leaves nothing the thread uses. */
struct bgcall {
	int dial;          /* 0: nng_close(sock); 1: nng_dialer_start(d, 0) */
	nng_socket sock;
	nng_dialer d;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	int done, rv, refs;
};

static void
bgcall_unref(struct bgcall *k)
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
bgcall_main(void *arg)
{
	struct bgcall *k = arg;
	int rv = 0;

	if (k->dial)
		rv = nng_dialer_start(k->d, 0);
	else
		nng_close(k->sock);
	pthread_mutex_lock(&k->mtx);
	k->rv = rv;
	k->done = 1;
	pthread_cond_signal(&k->cv);
	pthread_mutex_unlock(&k->mtx);
	bgcall_unref(k);
	return NULL;
}

/* the call k describes (allocated by the caller, taken here), waited for at
 * most wait_ms: 1 and its result in *rv when it finished, else 0 (it goes
 * on alone).  When no thread can be made the call is made here. */
static int
bgcall_run(struct bgcall *k, long wait_ms, int *rv)
{
	struct timespec ts;
	pthread_t th;
	int done;

	k->refs = 2;
	pthread_mutex_init(&k->mtx, NULL);
	pthread_cond_init(&k->cv, NULL);
	if (pthread_create(&th, NULL, bgcall_main, k) != 0) {
		bgcall_main(k);   /* the call, made here */
		*rv = k->rv;
		bgcall_unref(k);
		return 1;
	}
	pthread_detach(th);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += wait_ms / 1000;
	ts.tv_nsec += (wait_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&k->mtx);
	while (!k->done && pthread_cond_timedwait(&k->cv, &k->mtx, &ts) == 0)
		;
	done = k->done;
	*rv = k->rv;
	pthread_mutex_unlock(&k->mtx);
	bgcall_unref(k);
	return done;
}

int
rli_nng_close_timed(nng_socket sock, const char *what)
{
	struct bgcall *k = calloc(1, sizeof *k);
	const char *env;
	long wait_ms = 1000;
	int done, rv;

	if (k == NULL) {
		nng_close(sock);
		return 1;
	}
	k->sock = sock;
	/* the tests make every close "hang" (0) to check that callers keep
	 * what the socket's callbacks use (tests/unit/test_comm_close.c) */
	if ((env = getenv("RL_NNG_TEST_CLOSE_WAIT_MS")) && *env)
		wait_ms = atol(env) < 0 ? 0 : atol(env);
	if (!(done = bgcall_run(k, wait_ms, &rv)))
		rl_verbose("closing the %s hangs (nng bug #1543); leaving it", what);
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
 * RL_TLS_CERT, RL_TLS_KEY, RL_TLS_CA, RL_TLS_KEY_PASS_FILE and RL_TLS_CRL at
 * the first tls+ URL. */
static pthread_mutex_t tls_mu = PTHREAD_MUTEX_INITIALIZER;
static char *tls_cert, *tls_key, *tls_ca, *tls_pass, *tls_crl;
static int tls_set;

#define PASS_MAX 1024

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
	free(tls_pass);
	free(tls_crl);
	tls_cert = cert ? strdup(cert) : NULL;
	tls_key = key ? strdup(key) : NULL;
	tls_ca = ca ? strdup(ca) : NULL;
	tls_pass = tls_crl = NULL;
	if ((cert && !tls_cert) || (key && !tls_key) || (ca && !tls_ca))
		rv = RL_ENOMEM;
	tls_set = 1;
	pthread_mutex_unlock(&tls_mu);
	return rv;
}

int
rli_nng_tls_opt(int which, const char *path)
{
	char **slot = which == 'c' ? &tls_cert : which == 'k' ? &tls_key : which == 'p' ? &tls_pass
		    : which == 'r' ? &tls_crl : &tls_ca;
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
is_ip(const char *host)
{
	struct in6_addr a;

	return inet_pton(AF_INET, host, &a) == 1 || inet_pton(AF_INET6, host, &a) == 1;
}

static int
tls_err(const char *what, const char *file, int e)
{
	rl_error("TLS: cannot use %s '%s': %s", what, file, nng_strerror(e));
	return RL_EINVAL;
}

/* the first line of the password file into pass (PASS_MAX bytes); the file
 * is a secret, so it is refused when group or others may read or write it,
 * as --auth-key-file is */
static int
read_pass(const char *path, char *pass)
{
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd, rv = RL_OK;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		rl_error("--tls-key-pass-file '%s': %s", path, strerror(errno));
		return errno == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rl_error("--tls-key-pass-file '%s': not a regular file", path);
		rv = RL_EINVAL;
	} else if (st.st_mode & 077) {
		rl_error("--tls-key-pass-file '%s': permissions %04o are too open: the password must not be readable "
			 "or writable by group or others (chmod 600 '%s')", path, (unsigned)(st.st_mode & 07777), path);
		rv = RL_EINVAL;
	}
	while (rv == RL_OK && len < PASS_MAX && (n = read(fd, pass + len, PASS_MAX - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rl_error("--tls-key-pass-file '%s': %s", path, strerror(errno));
			rv = RL_EIO;
		} else {
			len += (size_t)n;
		}
	}
	close(fd);
	if (rv != RL_OK)
		return rv;
	/* the first line, as openssl's -passin file: takes it */
	pass[len < PASS_MAX ? len : PASS_MAX - 1] = 0;
	pass[strcspn(pass, "\r\n")] = 0;
	if (len >= PASS_MAX && strcspn(pass, "\r\n") >= PASS_MAX - 1) {
		rl_error("--tls-key-pass-file '%s': the password is longer than %d bytes", path, PASS_MAX - 2);
		return RL_ETOOBIG;
	}
	if (pass[0] == 0) {
		rl_error("--tls-key-pass-file '%s': the first line is empty (the key's password goes there)", path);
		return RL_EFORMAT;
	}
	return RL_OK;
}

static int
pass_cb(char *buf, int size, int rwflag, void *u)
{
	size_t n = strlen(u);

	(void)rwflag;
	if (n > (size_t)size)
		return -1;
	memcpy(buf, u, n);
	return (int)n;
}

/* An encrypted key needs its password, and a wrong one is named here rather
 * than as "cannot use the certificate and key": the key is decrypted once
 * with libcrypto to tell.  Never a prompt on the terminal. */
static int
key_check(const char *keyfile, const char *key, const char *passfile, const char *pass)
{
	BIO *b;
	EVP_PKEY *k;

	if (strstr(key, "-----BEGIN ENCRYPTED PRIVATE KEY-----") == NULL && strstr(key, "Proc-Type: 4,ENCRYPTED") == NULL)
		return RL_OK;
	if (passfile == NULL) {
		rl_error("TLS: the private key '%s' is encrypted and no password was given", keyfile);
		rl_hint("give its password in a file (mode 600, the first line) with --tls-key-pass-file FILE "
			"(RL_TLS_KEY_PASS_FILE for rl-queue's clients)");
		return RL_EINVAL;
	}
	if ((b = BIO_new_mem_buf(key, -1)) == NULL)
		return RL_ENOMEM;
	k = PEM_read_bio_PrivateKey(b, NULL, pass_cb, (void *)pass);
	BIO_free(b);
	ERR_clear_error();
	if (k == NULL) {
		rl_error("TLS: cannot decrypt the private key '%s' with the password in '%s' (--tls-key-pass-file): "
			 "wrong password, or not a key", keyfile, passfile);
		return RL_EINVAL;
	}
	EVP_PKEY_free(k);
	return RL_OK;
}

/* the CA, and the CRLs of --tls-crl, into c */
static int
ca_load(nng_tls_config *c)
{
	char *ca = NULL, *crl = NULL;
	size_t n;
	int e, rv = RL_OK;

	if (tls_crl == NULL) {
		if ((e = nng_tls_config_ca_file(c, tls_ca)) != 0)
			rv = tls_err("the CA file", tls_ca, e);
		return rv;
	}
	if ((rv = rl_io_read_file(tls_ca, 16 << 20, &ca, &n)) != 0) {
		rl_error("TLS: cannot read the CA file '%s': %s", tls_ca, rl_strerror(rv));
	} else if ((rv = rl_io_read_file(tls_crl, 256 << 20, &crl, &n)) != 0) {
		rl_error("TLS: cannot read --tls-crl '%s': %s", tls_crl, rl_strerror(rv));
	} else if (strstr(crl, "-----BEGIN X509 CRL-----") == NULL) {
		rl_error("TLS: --tls-crl '%s' holds no PEM CRL (-----BEGIN X509 CRL-----)", tls_crl);
		rl_hint("a DER CRL converts with: openssl crl -inform DER -in FILE -out FILE.pem");
		rv = RL_EFORMAT;
	} else if ((e = nng_tls_config_ca_chain(c, ca, crl)) != 0) {
		rl_error("TLS: cannot use the CA file '%s' with --tls-crl '%s': %s", tls_ca, tls_crl, nng_strerror(e));
		rv = RL_EINVAL;
	}
	free(ca);
	free(crl);
	return rv;
}

static char *
env_dup(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? strdup(v) : NULL;
}

/* the server name a client checks: the URL's host, a DNS name or an address
 * (the OpenSSL engine matches an address against the certificate's IP
 * subjectAltNames; nng's mbedTLS engine cannot, so it is refused there) */
static int
tls_server_name(nng_tls_config *c, const char *url)
{
	char host[256];
	int e;

	url_host(url, host, sizeof host);
	if (host[0] == 0)
		return RL_OK;
	if (is_ip(host) && strcmp(rl_tls_engine_name(), "openssl") != 0) {
		rl_error("'%s': RL_TLS_ENGINE=mbedtls cannot check the address %s against the server's certificate "
			 "(nng's mbedTLS engine matches DNS names only)", url, host);
		rl_hint("dial a DNS name the certificate names (e.g. tls+tcp://localhost:PORT), or use the OpenSSL "
			"engine (RL_TLS_ENGINE unset), which checks IP subjectAltNames");
		return RL_EINVAL;
	}
	if ((e = nng_tls_config_server_name(c, host)) != 0) {
		rl_error("TLS: server name '%s': %s", host, nng_strerror(e));
		return RL_EINVAL;
	}
	return RL_OK;
}

/* the process's files for a server or a client of url, checked, with the
 * certificate, the key and its password read (tls_mu held; the caller
 * frees them with mat_free, also on failure) */
typedef struct tls_mat {
	char *cert, *key, *pass;
} tls_mat;

static void
mat_free(tls_mat *m)
{
	free(m->cert);
	if (m->key)
		OPENSSL_cleanse(m->key, strlen(m->key));
	free(m->key);
	if (m->pass)
		OPENSSL_cleanse(m->pass, PASS_MAX);
	free(m->pass);
	*m = (tls_mat){ 0 };
}

static int
mat_load(tls_mat *m, int server, const char *url)
{
	size_t n;
	int rv = RL_OK;

	*m = (tls_mat){ 0 };
	if (!tls_set) {
		tls_cert = env_dup("RL_TLS_CERT");
		tls_key = env_dup("RL_TLS_KEY");
		tls_ca = env_dup("RL_TLS_CA");
		tls_pass = env_dup("RL_TLS_KEY_PASS_FILE");
		tls_crl = env_dup("RL_TLS_CRL");
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
	} else if (tls_crl && tls_ca == NULL) {
		rl_error("'%s': --tls-crl '%s' needs --tls-ca (the CRL is checked with the peer's chain to the CA)", url,
			 tls_crl);
		rv = RL_EINVAL;
	} else if (tls_pass && tls_key == NULL) {
		rl_error("'%s': --tls-key-pass-file '%s' without --tls-key", url, tls_pass);
		rv = RL_EINVAL;
	} else if ((tls_cert && (rv = rl_io_read_file(tls_cert, 1 << 20, &m->cert, &n)) != 0) ||
		   (tls_key && (rv = rl_io_read_file(tls_key, 1 << 20, &m->key, &n)) != 0)) {
		rl_error("TLS: cannot read '%s': %s", m->cert ? tls_key : tls_cert, rl_strerror(rv));
	} else if (tls_pass && (m->pass = rl_try_calloc(1, PASS_MAX, "the TLS key password")) == NULL) {
		rv = RL_ENOMEM;
	} else if ((tls_pass && (rv = read_pass(tls_pass, m->pass)) != 0) ||
		   (m->key && (rv = key_check(tls_key, m->key, tls_pass, m->pass)) != 0)) {
		/* the message is out */
	}
	return rv;
}

/* a configuration for a server or a client of url, from the files; the
 * caller frees it */
static int
tls_config(nng_tls_config **out, int server, const char *url)
{
	tls_mat m;
	nng_tls_config *c = NULL;
	int e, rv;

	*out = NULL;
	pthread_mutex_lock(&tls_mu);
	if ((rv = mat_load(&m, server, url)) != 0) {
		/* the message is out */
	} else if ((rv = rl_tls_use_openssl()) != 0) {
		/* the message is out */
	} else if ((e = nng_tls_config_alloc(&c, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT)) != 0) {
		rl_error("TLS: %s", nng_strerror(e));
		rv = RL_ENET;
	} else if (m.cert && (e = nng_tls_config_own_cert(c, m.cert, m.key, m.pass)) != 0) {
		rv = tls_err("the certificate and key", tls_cert, e);
	} else if (tls_ca && (rv = ca_load(c)) != 0) {
		/* the message is out */
	} else if ((e = nng_tls_config_auth_mode(c, tls_ca ? NNG_TLS_AUTH_MODE_REQUIRED : NNG_TLS_AUTH_MODE_NONE)) != 0) {
		rl_error("TLS: %s", nng_strerror(e));
		rv = RL_ENET;
	} else if (!server) {
		rv = tls_server_name(c, url);
	}
	pthread_mutex_unlock(&tls_mu);
	mat_free(&m);
	if (rv != 0) {
		if (c)
			nng_tls_config_free(c);
		return rv;
	}
	*out = c;
	return RL_OK;
}

int
rli_nng_tls_ctx(rli_tls_ctx **out, int server, const char *url)
{
	tls_mat m;
	char *ca = NULL, *crl = NULL, host[256];
	const char *what;
	size_t n;
	int rv;

	*out = NULL;
	url_host(url, host, sizeof host);
	pthread_mutex_lock(&tls_mu);
	if ((rv = mat_load(&m, server, url)) != 0) {
		/* the message is out */
	} else if (tls_ca && (rv = rl_io_read_file(tls_ca, 16 << 20, &ca, &n)) != 0) {
		rl_error("TLS: cannot read the CA file '%s': %s", tls_ca, rl_strerror(rv));
	} else if (tls_crl && (rv = rl_io_read_file(tls_crl, 256 << 20, &crl, &n)) != 0) {
		rl_error("TLS: cannot read --tls-crl '%s': %s", tls_crl, rl_strerror(rv));
	} else if ((rv = rli_tls_ctx_new(out, server, m.cert, m.key, m.pass, ca, crl, host, &what)) != 0) {
		rl_error("TLS: cannot use %s (%s%s%s): %s", what, strstr(what, "certificate") ? tls_cert : tls_ca,
			 crl && strstr(what, "CRL") ? ", " : "", crl && strstr(what, "CRL") ? tls_crl : "", rl_strerror(rv));
	}
	pthread_mutex_unlock(&tls_mu);
	mat_free(&m);
	free(ca);
	free(crl);
	return rv;
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

/* The first connection of a TLS dialer, bounded in time.  nng 1.5's TLS
 * layer can leave a connection's negotiation waiting for ever: when its
 * 10 s timeout fires while the handshake waits for the peer, the cancel
 * aborts a TCP send or receive that is not in flight, and nothing finishes
 * it (about 1 in 200 refused clients here).  A blocking nng_dialer_start
 * then never returns, whatever the caller's own timeouts.  So the start
 * runs on a helper thread; after wait_ms the dialer is closed, which closes
 * the stalled negotiation and ends the start with NNG_ECLOSED.
 * nng_dialer_start(d, 0)'s result, or NNG_ETIMEDOUT with the dialer closed */
static int
dial_start_timed(nng_dialer d, long wait_ms)
{
	struct bgcall *k = calloc(1, sizeof *k);
	int rv;

	if (k == NULL)
		return nng_dialer_start(d, 0);
	k->dial = 1;
	k->d = d;
	if (!bgcall_run(k, wait_ms, &rv)) {
		nng_dialer_close(d);
		return NNG_ETIMEDOUT;
	}
	return rv;
}

int
rli_nng_dial(nng_socket s, const char *url, nng_dialer *dp, int flags)
{
	nng_dialer d;
	nng_tls_config *c = NULL;
	const char *env;
	long wait_ms = 5000;
	int e, rv, tries = 0;

	if (!is_tls(url))
		return nng_dial(s, url, dp, flags);
	if ((rv = tls_config(&c, 0, url)) != 0)
		return NNG_EINVAL;
	/* RL_TLS_DIAL_WAIT_MS (tests): the bound on each first connection */
	if ((env = getenv("RL_TLS_DIAL_WAIT_MS")) && atol(env) > 0)
		wait_ms = atol(env);
again:
	if ((e = nng_dialer_create(&d, s, url)) == 0 && (e = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, c)) == 0) {
		/* one connection first, so a refused handshake is an error that
		 * names itself; a server not up yet is dialled again in the
		 * background as for tcp://.  A first connection that stalls is
		 * tried once more, then left to the background dials */
		char why[256];
		rli_tls_last_error(why, sizeof why); /* an older failure's reason is not this one's */
		e = dial_start_timed(d, wait_ms);
		if (e == NNG_ETIMEDOUT) {
			if (++tries < 2) {
				rl_verbose("'%s': no TLS connection within %.1f s; dialling again", url, wait_ms / 1000.0);
				goto again;
			}
			rl_warn("'%s': no TLS handshake within %.1f s, twice: is a TLS server (tls+tcp://) listening "
				"there, and answering?", url, wait_ms / 1000.0);
			if (!(flags & NNG_FLAG_NONBLOCK))
				goto out;
			if ((e = nng_dialer_create(&d, s, url)) == 0 &&
			    (e = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, c)) == 0 &&
			    (e = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) == 0 && dp)
				*dp = d;
			goto out;
		}
		if (e == NNG_ECRYPTO || e == NNG_EPEERAUTH || e == NNG_ECLOSED || e == NNG_ECONNRESET ||
		    e == NNG_ECONNSHUT) {
			char host[256];
			int named = rli_tls_last_error(why, sizeof why);
			if (named)
				rl_error("'%s': TLS handshake failed: %s (%s)", url, nng_strerror(e), why);
			else
				rl_error("'%s': TLS handshake failed: %s", url, nng_strerror(e));
			url_host(url, host, sizeof host);
			if (named && strstr(why, "mismatch") != NULL && is_ip(host))
				rl_hint("the server's certificate must name the address dialled as an IP subjectAltName: "
					"make it with -addext subjectAltName=IP:%s (openssl req), or subjectAltName=IP:%s "
					"in the -extfile of openssl x509 -req; or dial a DNS name it names", host, host);
			else if (named && strstr(why, "mismatch") != NULL)
				rl_hint("the server's certificate must name the host dialled: make it with "
					"-addext subjectAltName=DNS:%s (openssl req), or dial a name or address it names",
					host);
			else if (named && strstr(why, "revoked") != NULL)
				rl_hint("a CRL (--tls-crl) of one end revokes the other end's certificate: it needs a new one");
			else if (named)
				rl_hint("both ends need certificates signed by the CA the other end was given (--tls-ca), "
					"and the server's must name the host or address dialled");
			else
				/* TLS 1.3: the server checks the client's certificate after
				 * the client is done, and its alert can be lost in the close */
				rl_hint("the server closed the connection without a reason this end could read: it may "
					"refuse this end's certificate (signed by a CA it was not given with --tls-ca, or "
					"revoked by its --tls-crl), which its log (-v) names; both ends need certificates "
					"signed by the CA the other end was given, and the server's must name the host "
					"or address dialled");
			nng_dialer_close(d);
		} else if (e != 0 && (flags & NNG_FLAG_NONBLOCK)) {
			e = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
		}
		if (e == 0 && dp)
			*dp = d;
	}
out:
	nng_tls_config_free(c);
	return e;
}

/* ---- re-dialling a stalled TLS reconnection (nngx.h) ---- */
struct rli_redial {
	nng_socket sock;
	char *url;
	int tls;
	pthread_mutex_t mu;
	nng_dialer d;
	int have_d, pipes;
	double since;   /* when the socket last had no connection: opened, lost its last, dialled again */
	double wait_s;  /* RL_TLS_REDIAL_S */
};

static void
redial_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	rli_redial *r = arg;

	pthread_mutex_lock(&r->mu);
	if (ev == NNG_PIPE_EV_ADD_POST)
		r->pipes++;
	else if (r->pipes > 0 && --r->pipes == 0)
		r->since = rl_now();
	pthread_mutex_unlock(&r->mu);
}

int
rli_redial_open(rli_redial **out, nng_socket s, const char *url, int flags)
{
	rli_redial *r = calloc(1, sizeof *r);
	const char *env;
	int e;

	*out = NULL;
	if (r == NULL || (r->url = strdup(url)) == NULL) {
		free(r);
		return NNG_ENOMEM;
	}
	r->sock = s;
	r->tls = is_tls(url);
	r->since = rl_now();
	r->wait_s = 12;
	if ((env = getenv("RL_TLS_REDIAL_S")) && atof(env) > 0)
		r->wait_s = atof(env);
	pthread_mutex_init(&r->mu, NULL);
	if (r->tls && ((e = nng_pipe_notify(s, NNG_PIPE_EV_ADD_POST, redial_pipe_cb, r)) != 0 ||
		       (e = nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, redial_pipe_cb, r)) != 0)) {
		rli_redial_free(r);
		return e;
	}
	if ((e = rli_nng_dial(s, url, &r->d, flags)) != 0) {
		/* the socket may still hold the callbacks: the caller closes it,
		 * and the struct is left (a few bytes, once, on a failed start) */
		return e;
	}
	r->have_d = 1;
	*out = r;
	return 0;
}

int
rli_redial_check(rli_redial *r)
{
	nng_dialer old, d;
	int e, had;

	if (r == NULL || !r->tls)
		return 0;
	pthread_mutex_lock(&r->mu);
	if (r->pipes > 0 || rl_now() - r->since < r->wait_s) {
		pthread_mutex_unlock(&r->mu);
		return 0;
	}
	rl_verbose("'%s': no connection for %.0f s; dialling again", r->url, rl_now() - r->since);
	/* taken: another thread's check now waits its own wait_s */
	r->since = rl_now();
	old = r->d;
	had = r->have_d;
	r->have_d = 0;
	pthread_mutex_unlock(&r->mu);
	if (had)
		nng_dialer_close(old);
	e = rli_nng_dial(r->sock, r->url, &d, NNG_FLAG_NONBLOCK);
	pthread_mutex_lock(&r->mu);
	if (e == 0) {
		r->d = d;
		r->have_d = 1;
	}
	r->since = rl_now();
	pthread_mutex_unlock(&r->mu);
	return 1;
}

void
rli_redial_free(rli_redial *r)
{
	if (r == NULL)
		return;
	pthread_mutex_destroy(&r->mu);
	free(r->url);
	free(r);
}

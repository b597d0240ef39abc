/*
 * tls_ossl.c — an nng TLS engine on OpenSSL 3 (see tls_ossl.h).
 *
 * nng 1.5 keeps the TLS record layer out of the engine: the engine reads and
 * writes ciphertext through nng_tls_engine_recv/send, which copy to and from
 * nng's own 16 KiB buffers in front of the TCP stream and answer NNG_EAGAIN
 * when those are empty or full.  Here a BIO of our own maps that onto
 * OpenSSL's retry flags, so SSL_do_handshake/SSL_read/SSL_write return
 * SSL_ERROR_WANT_* exactly where nng's mbedTLS engine returns WANT_READ/WRITE,
 * and nng calls the operation again when the stream has moved.
 *
 * The behaviour follows nng's mbedTLS engine: a client verifies the server
 * by default, a server asks for no certificate unless told to; the server
 * name, when set, is sent as SNI and checked against the certificate's DNS
 * names.  Unlike that engine a server name that is an IP address (IPv4 or
 * IPv6 text) is checked against the certificate's IP subjectAltNames
 * (RFC 6125: never its DNS names or common name) and is not sent as SNI
 * (RFC 6066 allows host names only); and this one offers TLS 1.3 (1.2 to
 * 1.3 by default).  A name that does not match is reported with what the
 * certificate names.  CRLs given after the CA are checked for every
 * certificate of the chain (a CRL of each CA is then needed, as nginx's
 * ssl_crl does).
 * The same configuration and connection code also runs TLS on a blocking
 * socket of the caller's, outside nng (rli_tls_sock_*: rl-sync's bulk
 * stream).
 * Left out: keys in hardware, session resumption (servers issue no tickets),
 * FIPS mode.
 */
#include "base/tls_ossl.h"

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

struct nng_tls_engine_config {
	SSL_CTX *ctx;
	int server;
	char *server_name;
};

struct nng_tls_engine_conn {
	void *tls; /* nng's side of the connection, for nng_tls_engine_send/recv */
	SSL *ssl;
	int io_err; /* the lower stream's nng error, when it failed */
	int server;
	const char *want;  /* the name or address dialled (the config's, which outlives us) */
	char names[160];   /* what a certificate that did not match names, for the message */
	char peer[200];    /* the subject and issuer of a peer certificate that failed */
	char why[256];     /* the last failure's reason (rli_tls_sock_open reports it) */
};

static BIO_METHOD *bio_meth;

/* the last failed handshake's reason, for the message of a refused dial */
static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_err[256];

static int
bio_write(BIO *b, const char *data, size_t len, size_t *done)
{
	struct nng_tls_engine_conn *c = BIO_get_data(b);
	size_t n = len;
	int e;

	BIO_clear_retry_flags(b);
	*done = 0;
	if ((e = nng_tls_engine_send(c->tls, (const uint8_t *)data, &n)) == 0) {
		*done = n;
		return 1;
	}
	if (e == NNG_EAGAIN)
		BIO_set_retry_write(b);
	else
		c->io_err = e;
	return 0;
}

static int
bio_read(BIO *b, char *data, size_t len, size_t *done)
{
	struct nng_tls_engine_conn *c = BIO_get_data(b);
	size_t n = len;
	int e;

	BIO_clear_retry_flags(b);
	*done = 0;
	if ((e = nng_tls_engine_recv(c->tls, (uint8_t *)data, &n)) == 0) {
		*done = n;
		return 1;
	}
	if (e == NNG_EAGAIN)
		BIO_set_retry_read(b);
	else
		c->io_err = e;
	return 0;
}

static long
bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	/* nng sends what it is given as soon as it can: nothing to flush */
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int
bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

/* an nng error for a failed SSL call, which leaves OpenSSL's error queue of
 * this thread empty (the SSL calls on nng's threads do not clear it first:
 * it costs a lookup of the thread's state per call); the OpenSSL reason is kept for
 * rli_tls_last_error and logged at verbose level.
 *
 * The codes matter to nng's listener: an accept that fails with NNG_ECLOSED
 * stops it for good, one with an unknown code pauses it 100 ms, one with
 * NNG_EPEERAUTH or NNG_ECONNRESET lets it accept the next at once.  So what
 * a peer causes (its close-notify, a dropped connection, a handshake it
 * fails) is never NNG_ECLOSED, and a server's failed handshake is
 * NNG_EPEERAUTH. */
static int
ssl_fail(struct nng_tls_engine_conn *c, int r, const char *op)
{
	int err = SSL_get_error(c->ssl, r), rv;
	unsigned long e;
	char why[200] = "";
	long vr;

	if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
		return NNG_EAGAIN; /* nothing was queued */
	if ((e = ERR_peek_last_error()) != 0)
		ERR_error_string_n(e, why, sizeof why);
	ERR_clear_error();
	vr = SSL_get_verify_result(c->ssl);
	if (c->io_err != 0)
		/* a server's connection closed under its handshake (the peer
		 * gone, nng's negotiation timed out) must not read as the
		 * listener's own close: that would stop its accepts for good
		 * while the port still takes TCP connections, and every later
		 * client would wait for a handshake nobody answers */
		rv = c->server && (c->io_err == NNG_ECLOSED || c->io_err == NNG_ECANCELED) ? NNG_ECONNRESET : c->io_err;
	else if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL)
		rv = NNG_ECONNRESET;
	else if (vr != X509_V_OK || (c->server && !SSL_is_init_finished(c->ssl)))
		rv = NNG_EPEERAUTH;
	else
		rv = NNG_ECRYPTO;
	if ((vr == X509_V_ERR_IP_ADDRESS_MISMATCH || vr == X509_V_ERR_HOSTNAME_MISMATCH) && c->names[0])
		snprintf(why, sizeof why, "%s: the certificate names %s, not %s", X509_verify_cert_error_string(vr),
			 c->names, c->want ? c->want : "?");
	else if (vr != X509_V_OK)
		snprintf(why, sizeof why, "%s", X509_verify_cert_error_string(vr));
	/* a server's log names whose certificate it refused; a client's
	 * message stays the reason alone (it knows whom it dialled) */
	if (c->server && vr != X509_V_OK && c->peer[0] && strlen(why) + strlen(c->peer) + 3 < sizeof why)
		snprintf(why + strlen(why), sizeof why - strlen(why), " (%s)", c->peer);
	snprintf(c->why, sizeof c->why, "%s", why[0] ? why : err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN
									 ? "the peer closed the connection" : "failed");
	if (why[0])
		rl_verbose("TLS %s: %s", op, why);
	/* a dial's message is this client's reason: a server in the same
	 * process (the broker's self-check, the tests) must not replace it
	 * with what it saw of the same handshake ("alert bad certificate") */
	if (why[0] && !c->server) {
		pthread_mutex_lock(&last_mu);
		snprintf(last_err, sizeof last_err, "%s", why);
		pthread_mutex_unlock(&last_mu);
	}
	return rv;
}

static int
is_ip(const char *name)
{
	unsigned char a[16];

	return inet_pton(AF_INET, name, a) == 1 || inet_pton(AF_INET6, name, a) == 1;
}

/* the certificate's DNS and IP subjectAltNames ("DNS:a, IP:b"), or its
 * common name when it has none */
static void
cert_names(X509 *x, char *buf, size_t n)
{
	GENERAL_NAMES *g = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	size_t k = 0;
	char cn[64];

	buf[0] = 0;
	for (int i = 0; g && i < sk_GENERAL_NAME_num(g) && k < n; i++) {
		const GENERAL_NAME *e = sk_GENERAL_NAME_value(g, i);
		char one[INET6_ADDRSTRLEN + 8] = "";
		if (e->type == GEN_DNS) {
			snprintf(one, sizeof one, "DNS:%.*s", ASN1_STRING_length(e->d.dNSName),
				 (const char *)ASN1_STRING_get0_data(e->d.dNSName));
		} else if (e->type == GEN_IPADD) {
			int len = ASN1_STRING_length(e->d.iPAddress);
			char a[INET6_ADDRSTRLEN];
			if ((len == 4 || len == 16) &&
			    inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(e->d.iPAddress), a, sizeof a))
				snprintf(one, sizeof one, "IP:%s", a);
		}
		if (one[0])
			k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", one);
	}
	GENERAL_NAMES_free(g);
	if (buf[0] == 0) {
		if (X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn) < 0)
			snprintf(cn, sizeof cn, "none");
		snprintf(buf, n, "no DNS or IP subjectAltName (CN=%s)", cn);
	}
	ERR_clear_error();
}

/* every verification passes here: a peer name that does not match keeps
 * what the certificate names for ssl_fail's message, a certificate that
 * fails otherwise its subject and issuer (a server's log then says whose
 * certificate of which CA it refused) */
static int
verify_note(int ok, X509_STORE_CTX *x)
{
	int e = X509_STORE_CTX_get_error(x);
	SSL *s;
	nng_tls_engine_conn *c;
	X509 *bad;

	if (ok || (s = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx())) == NULL ||
	    (c = SSL_get_app_data(s)) == NULL)
		return ok;
	if ((e == X509_V_ERR_IP_ADDRESS_MISMATCH || e == X509_V_ERR_HOSTNAME_MISMATCH) && X509_STORE_CTX_get0_cert(x))
		cert_names(X509_STORE_CTX_get0_cert(x), c->names, sizeof c->names);
	else if ((bad = X509_STORE_CTX_get_current_cert(x)) != NULL && c->peer[0] == 0) {
		char sub[80], iss[80];
		X509_NAME_oneline(X509_get_subject_name(bad), sub, sizeof sub);
		X509_NAME_oneline(X509_get_issuer_name(bad), iss, sizeof iss);
		snprintf(c->peer, sizeof c->peer, "certificate %s issued by %s", sub, iss);
	}
	return ok;
}

/* c's SSL over the BIO b (taken, also on failure) */
static int
conn_setup(nng_tls_engine_conn *c, nng_tls_engine_config *cfg, BIO *b)
{
	c->server = cfg->server;
	if (b == NULL || (c->ssl = SSL_new(cfg->ctx)) == NULL) {
		BIO_free(b);
		ERR_clear_error();
		return NNG_ENOMEM;
	}
	SSL_set_bio(c->ssl, b, b);
	SSL_set_app_data(c->ssl, c);
	/* nng may take part of a record and call again with the same buffer */
	SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (cfg->server) {
		SSL_set_accept_state(c->ssl);
	} else {
		SSL_set_connect_state(c->ssl);
		c->want = cfg->server_name;
		if (cfg->server_name && is_ip(cfg->server_name) &&
		    !X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), cfg->server_name)) {
			ERR_clear_error();
			SSL_free(c->ssl);
			c->ssl = NULL;
			return NNG_EINVAL;
		}
		if (cfg->server_name && !is_ip(cfg->server_name) &&
		    (!SSL_set_tlsext_host_name(c->ssl, cfg->server_name) || !SSL_set1_host(c->ssl, cfg->server_name))) {
			ERR_clear_error();
			SSL_free(c->ssl);
			c->ssl = NULL;
			return NNG_EINVAL;
		}
	}
	return 0;
}

static int
conn_init(nng_tls_engine_conn *c, void *tls, nng_tls_engine_config *cfg)
{
	BIO *b = BIO_new(bio_meth);

	c->tls = tls;
	if (b)
		BIO_set_data(b, c);
	return conn_setup(c, cfg, b);
}

static void
conn_fini(nng_tls_engine_conn *c)
{
	SSL_free(c->ssl);
	c->ssl = NULL;
}

static void
conn_close(nng_tls_engine_conn *c)
{
	if (c->ssl && SSL_is_init_finished(c->ssl))
		(void)SSL_shutdown(c->ssl); /* a close-notify, best effort */
	ERR_clear_error();
}

static int
conn_handshake(nng_tls_engine_conn *c)
{
	int r;

	if ((r = SSL_do_handshake(c->ssl)) == 1)
		return 0;
	return ssl_fail(c, r, "handshake");
}

static int
conn_recv(nng_tls_engine_conn *c, uint8_t *buf, size_t *szp)
{
	size_t n = 0;
	int r;

	if ((r = SSL_read_ex(c->ssl, buf, *szp, &n)) == 1) {
		*szp = n;
		return 0;
	}
	return ssl_fail(c, r, "read");
}

static int
conn_send(nng_tls_engine_conn *c, const uint8_t *buf, size_t *szp)
{
	size_t n = 0;
	int r;

	if ((r = SSL_write_ex(c->ssl, buf, *szp, &n)) == 1) {
		*szp = n;
		return 0;
	}
	return ssl_fail(c, r, "write");
}

static bool
conn_verified(nng_tls_engine_conn *c)
{
	return SSL_get0_peer_certificate(c->ssl) != NULL && SSL_get_verify_result(c->ssl) == X509_V_OK;
}

static int
cfg_init(nng_tls_engine_config *cfg, nng_tls_mode mode)
{
	cfg->server = mode == NNG_TLS_MODE_SERVER;
	if ((cfg->ctx = SSL_CTX_new(cfg->server ? TLS_server_method() : TLS_client_method())) == NULL) {
		ERR_clear_error();
		return NNG_ENOMEM;
	}
	SSL_CTX_set_min_proto_version(cfg->ctx, TLS1_2_VERSION);
	SSL_CTX_set_max_proto_version(cfg->ctx, TLS1_3_VERSION);
	SSL_CTX_set_verify(cfg->ctx, cfg->server ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, verify_note);
	if (cfg->server) {
		/* every connection is a fresh handshake: no tickets to send */
		SSL_CTX_set_num_tickets(cfg->ctx, 0);
		SSL_CTX_set_session_cache_mode(cfg->ctx, SSL_SESS_CACHE_OFF);
	}
	return 0;
}

static void
cfg_fini(nng_tls_engine_config *cfg)
{
	SSL_CTX_free(cfg->ctx);
	free(cfg->server_name);
}

static int
cfg_server(nng_tls_engine_config *cfg, const char *name)
{
	char *d = strdup(name);

	if (d == NULL)
		return NNG_ENOMEM;
	free(cfg->server_name);
	cfg->server_name = d;
	return 0;
}

/* NNG_TLS_AUTH_MODE_OPTIONAL: a certificate that fails is still let in, and
 * the connection reports itself not verified */
static int
verify_optional(int ok, X509_STORE_CTX *x)
{
	(void)verify_note(ok, x);
	return 1;
}

static int
cfg_auth(nng_tls_engine_config *cfg, nng_tls_auth_mode mode)
{
	switch (mode) {
	case NNG_TLS_AUTH_MODE_NONE:
		SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_NONE, NULL);
		return 0;
	case NNG_TLS_AUTH_MODE_OPTIONAL:
		SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_PEER, verify_optional);
		return 0;
	case NNG_TLS_AUTH_MODE_REQUIRED:
		SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_PEER | (cfg->server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
				   verify_note);
		return 0;
	}
	return NNG_EINVAL;
}

/* reading PEM objects from a string: the end is "no start line" */
static int
pem_end(void)
{
	unsigned long e = ERR_peek_last_error();
	int end = ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;

	ERR_clear_error();
	return end;
}

static int
cfg_ca_chain(nng_tls_engine_config *cfg, const char *certs, const char *crl)
{
	X509_STORE *st = SSL_CTX_get_cert_store(cfg->ctx);
	BIO *b;
	X509 *x;
	X509_CRL *r;
	int n = 0, rv = 0;

	ERR_clear_error();
	if ((b = BIO_new_mem_buf(certs, -1)) == NULL)
		return NNG_ENOMEM;
	while (rv == 0 && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
		if (!X509_STORE_add_cert(st, x))
			rv = NNG_ECRYPTO;
		X509_free(x);
		n++;
	}
	BIO_free(b);
	if (rv == 0 && (!pem_end() || n == 0))
		rv = NNG_ECRYPTO;
	if (rv == 0 && crl != NULL) {
		if ((b = BIO_new_mem_buf(crl, -1)) == NULL)
			return NNG_ENOMEM;
		n = 0;
		while (rv == 0 && (r = PEM_read_bio_X509_CRL(b, NULL, NULL, NULL)) != NULL) {
			if (!X509_STORE_add_crl(st, r))
				rv = NNG_ECRYPTO;
			X509_CRL_free(r);
			n++;
		}
		BIO_free(b);
		if (rv == 0 && !pem_end())
			rv = NNG_ECRYPTO;
		if (rv == 0 && n > 0)
			X509_STORE_set_flags(st, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
	}
	ERR_clear_error();
	return rv;
}

/* the key's password, never a prompt on the terminal */
static int
pass_cb(char *buf, int size, int rwflag, void *u)
{
	const char *p = u;
	size_t n = p ? strlen(p) : 0;

	if (n > (size_t)size)
		return -1;
	memcpy(buf, p ? p : "", n);
	return (int)n;
}

static int
cfg_own_cert(nng_tls_engine_config *cfg, const char *cert, const char *key, const char *pass)
{
	BIO *b = NULL;
	X509 *x = NULL;
	EVP_PKEY *k = NULL;
	int rv = NNG_ECRYPTO, n = 0;

	ERR_clear_error();
	if ((b = BIO_new_mem_buf(cert, -1)) == NULL) {
		rv = NNG_ENOMEM;
		goto out;
	}
	/* the first certificate is ours, the rest its chain */
	while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
		int ok = n++ == 0 ? SSL_CTX_use_certificate(cfg->ctx, x) : SSL_CTX_add1_chain_cert(cfg->ctx, x);
		X509_free(x);
		if (!ok)
			goto out;
	}
	if (!pem_end() || n == 0)
		goto out;
	BIO_free(b);
	if ((b = BIO_new_mem_buf(key, -1)) == NULL) {
		rv = NNG_ENOMEM;
		goto out;
	}
	if ((k = PEM_read_bio_PrivateKey(b, NULL, pass_cb, (void *)pass)) == NULL)
		goto out;
	/* a key that does not match the certificate fails here, not in a
	 * handshake later */
	if (!SSL_CTX_use_PrivateKey(cfg->ctx, k) || !SSL_CTX_check_private_key(cfg->ctx))
		goto out;
	rv = 0;
out:
	ERR_clear_error();
	EVP_PKEY_free(k);
	BIO_free(b);
	return rv;
}

static int
tls_ver(nng_tls_version v)
{
	switch (v) {
	case NNG_TLS_1_0: return TLS1_VERSION;
	case NNG_TLS_1_1: return TLS1_1_VERSION;
	case NNG_TLS_1_2: return TLS1_2_VERSION;
	case NNG_TLS_1_3: return TLS1_3_VERSION;
	}
	return -1;
}

static int
cfg_version(nng_tls_engine_config *cfg, nng_tls_version lo, nng_tls_version hi)
{
	int a = tls_ver(lo), b = tls_ver(hi);

	if (a < 0 || b < 0 || a > b)
		return NNG_ENOTSUP;
	if (!SSL_CTX_set_min_proto_version(cfg->ctx, a) || !SSL_CTX_set_max_proto_version(cfg->ctx, b)) {
		ERR_clear_error();
		return NNG_ENOTSUP;
	}
	return 0;
}

static nng_tls_engine_conn_ops conn_ops = {
	.size = sizeof(nng_tls_engine_conn),
	.init = conn_init,
	.fini = conn_fini,
	.close = conn_close,
	.handshake = conn_handshake,
	.recv = conn_recv,
	.send = conn_send,
	.verified = conn_verified,
};

static nng_tls_engine_config_ops config_ops = {
	.size = sizeof(nng_tls_engine_config),
	.init = cfg_init,
	.fini = cfg_fini,
	.server = cfg_server,
	.auth = cfg_auth,
	.ca_chain = cfg_ca_chain,
	.own_cert = cfg_own_cert,
	.version = cfg_version,
};

static nng_tls_engine engine = {
	.version = NNG_TLS_ENGINE_VERSION,
	.config_ops = &config_ops,
	.conn_ops = &conn_ops,
	.name = "openssl",
	.description = "OpenSSL 3",
	.fips_mode = false,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int once_rv;

static void
register_once(void)
{
	const char *want = getenv("RL_TLS_ENGINE");
	int e;

	if (want && *want && strcmp(want, "openssl") != 0) {
		if (strcmp(want, "mbedtls") != 0) {
			rl_error("RL_TLS_ENGINE='%s': expected openssl or mbedtls", want);
			once_rv = RL_EINVAL;
		}
		return;
	}
	if ((bio_meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "nng stream")) == NULL ||
	    !BIO_meth_set_write_ex(bio_meth, bio_write) || !BIO_meth_set_read_ex(bio_meth, bio_read) ||
	    !BIO_meth_set_ctrl(bio_meth, bio_ctrl) || !BIO_meth_set_create(bio_meth, bio_create)) {
		ERR_clear_error();
		once_rv = RL_ENOMEM;
		return;
	}
	/* nng's first initialisation registers its built-in engine and would
	 * replace one registered before it: initialise nng first */
	(void)nng_tls_engine_name();
	if ((e = nng_tls_engine_register(&engine)) != 0) {
		rl_error("TLS: nng refused the OpenSSL engine: %s", nng_strerror(e));
		once_rv = RL_ENET;
	}
}

int
rl_tls_use_openssl(void)
{
	pthread_once(&once, register_once);
	return once_rv;
}

const char *
rl_tls_engine_name(void)
{
	return nng_tls_engine_name();
}

int
rli_tls_last_error(char *buf, size_t n)
{
	int have;

	pthread_mutex_lock(&last_mu);
	have = last_err[0] != 0;
	snprintf(buf, n, "%s", last_err);
	last_err[0] = 0;
	pthread_mutex_unlock(&last_mu);
	return have;
}

/* ---- TLS on a socket of our own ----------------------------------------------------
 * The same configuration and checks as the nng engine above (cfg_* and
 * conn_setup), with OpenSSL's socket BIO on a blocking descriptor in place
 * of nng's buffers: one SSL_write moves a whole buffer as records straight
 * to the kernel, with no per-record hand-off. */
struct rli_tls_ctx {
	nng_tls_engine_config cfg;
};

#define SOCK_READ_BUF ((size_t)256 << 10)

struct rli_tls_sock {
	nng_tls_engine_conn c; /* first: verify_note finds it as the SSL's app data */
	int fd;
	double deadline;       /* rl_now() past which the handshake's reads fail; 0: none */
	struct timeval rcvto;  /* the socket's SO_RCVTIMEO before the handshake */
};

/* OpenSSL's own socket BIO writes with write(2): a peer gone would raise
 * SIGPIPE in a program that does not ignore it (rl-train's --sync), so this
 * one sends with MSG_NOSIGNAL.  A timeout (SO_RCVTIMEO/SO_SNDTIMEO) is a
 * retry, which ssl_fail reports as NNG_EAGAIN. */
static BIO_METHOD *sock_meth;
static pthread_once_t sock_once = PTHREAD_ONCE_INIT;

static int
sock_bio_io(BIO *b, char *data, size_t len, size_t *done, int wr)
{
	rli_tls_sock *t = BIO_get_data(b);
	ssize_t r;

	BIO_clear_retry_flags(b);
	*done = 0;
	if (!wr && t->deadline > 0) {
		/* the handshake's reads share one deadline: a peer sending a byte
		 * now and then cannot keep it going past the whole limit */
		double left = t->deadline - rl_now();
		struct timeval tv = { .tv_sec = (time_t)left, .tv_usec = (suseconds_t)((left - (time_t)left) * 1e6) };
		if (left <= 0 || (tv.tv_sec == 0 && tv.tv_usec == 0)) {
			BIO_set_retry_read(b);
			return 0;
		}
		setsockopt(t->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	}
	do
		r = wr ? send(t->fd, data, len, MSG_NOSIGNAL) : recv(t->fd, data, len, 0);
	while (r < 0 && errno == EINTR);
	if (r > 0) {
		*done = (size_t)r;
		return 1;
	}
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		if (wr)
			BIO_set_retry_write(b);
		else
			BIO_set_retry_read(b);
	}
	return 0;
}

static int sock_bio_write(BIO *b, const char *d, size_t n, size_t *done) { return sock_bio_io(b, (char *)d, n, done, 1); }
static int sock_bio_read(BIO *b, char *d, size_t n, size_t *done) { return sock_bio_io(b, d, n, done, 0); }

static void
sock_meth_once(void)
{
	if ((sock_meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "rl socket")) == NULL ||
	    !BIO_meth_set_write_ex(sock_meth, sock_bio_write) || !BIO_meth_set_read_ex(sock_meth, sock_bio_read) ||
	    !BIO_meth_set_ctrl(sock_meth, bio_ctrl) || !BIO_meth_set_create(sock_meth, bio_create)) {
		BIO_meth_free(sock_meth);
		sock_meth = NULL;
	}
	ERR_clear_error();
}

int
rli_tls_ctx_new(rli_tls_ctx **out, int server, const char *cert, const char *key, const char *pass, const char *ca,
		const char *crl, const char *peer_name, const char **what)
{
	rli_tls_ctx *x;
	int e = 0;

	*out = NULL;
	*what = "the TLS context";
	if ((x = rl_try_calloc(1, sizeof *x, "a TLS context")) == NULL)
		return RL_ENOMEM;
	if ((e = cfg_init(&x->cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT)) != 0) {
		free(x);
		return RL_ENOMEM;
	}
	/* bulk data: AES-128-GCM first (TLS 1.3's default order puts
	 * AES-256-GCM first, 12% slower here with AES-NI); both ends are ours */
	if (!SSL_CTX_set_ciphersuites(x->cfg.ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"))
		e = NNG_EINVAL;
	if (e != 0)
		*what = "the TLS 1.3 cipher suites";
	else if (cert && (e = cfg_own_cert(&x->cfg, cert, key, pass)) != 0)
		*what = "the certificate and key";
	else if (ca && (e = cfg_ca_chain(&x->cfg, ca, crl)) != 0)
		*what = crl ? "the CA and CRLs" : "the CA";
	else if ((e = cfg_auth(&x->cfg, ca ? NNG_TLS_AUTH_MODE_REQUIRED : NNG_TLS_AUTH_MODE_NONE)) != 0)
		*what = "the verification mode";
	else if (!server && peer_name && peer_name[0] && (e = cfg_server(&x->cfg, peer_name)) != 0)
		*what = "the server name";
	if (e != 0) {
		rli_tls_ctx_free(x);
		return e == NNG_ENOMEM ? RL_ENOMEM : RL_EINVAL;
	}
	*out = x;
	return RL_OK;
}

void
rli_tls_ctx_free(rli_tls_ctx *x)
{
	if (x == NULL)
		return;
	cfg_fini(&x->cfg);
	free(x);
}

int
rli_tls_sock_open(rli_tls_sock **out, rli_tls_ctx *x, int fd, char *why, size_t whyn)
{
	rli_tls_sock *t;
	BIO *b;
	int e, r;

	*out = NULL;
	snprintf(why, whyn, "out of memory");
	pthread_once(&sock_once, sock_meth_once);
	if (sock_meth == NULL || (t = rl_try_calloc(1, sizeof *t, "a TLS connection")) == NULL)
		return RL_ENOMEM;
	t->fd = fd;
	if ((b = BIO_new(sock_meth)) != NULL)
		BIO_set_data(b, t);
	if ((e = conn_setup(&t->c, &x->cfg, b)) != 0) {
		snprintf(why, whyn, "%s", e == NNG_EINVAL ? "cannot check the server name" : "out of memory");
		free(t);
		return e == NNG_EINVAL ? RL_EINVAL : RL_ENOMEM;
	}
	/* a blocking socket: every SSL_write finishes whole or fails; reads
	 * take what the kernel has (many records) in one recv, not a record's
	 * header and then its body */
	SSL_clear_mode(t->c.ssl, SSL_MODE_ENABLE_PARTIAL_WRITE);
	SSL_set_read_ahead(t->c.ssl, 1);
	SSL_set_default_read_buffer_len(t->c.ssl, SOCK_READ_BUF);
	ERR_clear_error();
	{
		socklen_t tl = sizeof t->rcvto;
		if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t->rcvto, &tl) == 0 &&
		    (t->rcvto.tv_sec > 0 || t->rcvto.tv_usec > 0))
			t->deadline = rl_now() + (double)t->rcvto.tv_sec + (double)t->rcvto.tv_usec / 1e6;
	}
	r = SSL_do_handshake(t->c.ssl);
	if (t->deadline > 0) {
		t->deadline = 0;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t->rcvto, sizeof t->rcvto);
	}
	if (r == 1) {
		*out = t;
		return RL_OK;
	}
	e = ssl_fail(&t->c, r, "handshake");
	snprintf(why, whyn, "%s", e == NNG_EAGAIN ? "timed out" : t->c.why);
	rli_tls_sock_close(t);
	return e == NNG_EAGAIN ? RL_ETIMEDOUT : e == NNG_EPEERAUTH || e == NNG_ECRYPTO ? RL_EINVAL : RL_ENET;
}

/* an SSL call's failure as an rl_err: a socket timeout surfaces as WANT_* */
static int
sock_fail(rli_tls_sock *t, int r, const char *op)
{
	int e;

	if ((e = ssl_fail(&t->c, r, op)) == NNG_EAGAIN)
		return RL_ETIMEDOUT;
	return e == NNG_ECONNRESET ? RL_ECLOSED : RL_ENET;
}

int
rli_tls_sock_write(rli_tls_sock *t, const void *p, size_t n)
{
	size_t done = 0, k;
	int r;

	while (done < n) {
		if ((r = SSL_write_ex(t->c.ssl, (const char *)p + done, n - done, &k)) != 1)
			return sock_fail(t, r, "write");
		done += k;
	}
	return RL_OK;
}

int
rli_tls_sock_read(rli_tls_sock *t, void *p, size_t n, size_t *got)
{
	int r;

	*got = 0;
	if ((r = SSL_read_ex(t->c.ssl, p, n, got)) != 1)
		return sock_fail(t, r, "read");
	return RL_OK;
}

void
rli_tls_sock_close(rli_tls_sock *t)
{
	if (t == NULL)
		return;
	conn_close(&t->c);
	conn_fini(&t->c);
	free(t);
}

/*
 * tls_ossl.h — a TLS engine for nng on OpenSSL (libssl 3), registered in
 * place of the mbedTLS engine nng is built with; and TLS with the same
 * configuration on a socket of the caller's (rli_tls_sock_*).
 */
#ifndef RL_TLS_OSSL_H
#define RL_TLS_OSSL_H

#include <stddef.h>

/* rl_tls_use_openssl registers the OpenSSL engine with nng, once per process
 * (later calls return the first call's result).  Call it before any
 * nng_tls_config is allocated: a configuration keeps the engine it was made
 * with.  RL_TLS_ENGINE=mbedtls in the environment keeps nng's built-in engine
 * (the call then does nothing and returns RL_OK).  Returns RL_OK, or RL_ENET
 * when nng refuses the engine (then its built-in one stays in use).
 * Thread-safe. */
int rl_tls_use_openssl(void);

/* The name of the engine new TLS configurations use ("openssl" or nng's
 * "mbed"), for logs and tests. */
const char *rl_tls_engine_name(void);

/* rli_tls_last_error copies the OpenSSL reason of the last failed handshake
 * or read in this process into buf (and forgets it): 1 when there was one,
 * else 0 and an empty string. */
int rli_tls_last_error(char *buf, size_t n);

/* TLS on a connected blocking socket of the caller's, outside nng (rl-sync's
 * bulk stream), on OpenSSL whatever engine nng uses, with the checks of the
 * engine above.
 * rli_tls_ctx_new: a server or client context from PEM text: cert (with
 * its chain) and key (pass: an encrypted key's password, or NULL) are this
 * end's; with ca the peer must present a certificate it signed (a server
 * then requires one), crl (or NULL) revokes; a client checks peer_name (the
 * host dialled: a DNS name against the DNS subjectAltNames, an address
 * against the IP ones).  RL_OK, or RL_EINVAL / RL_ENOMEM with *what naming
 * the part that was refused (nothing logged). */
typedef struct rli_tls_ctx rli_tls_ctx;
int rli_tls_ctx_new(rli_tls_ctx **out, int server, const char *cert, const char *key, const char *pass, const char *ca,
		    const char *crl, const char *peer_name, const char **what);
void rli_tls_ctx_free(rli_tls_ctx *x);
/* rli_tls_sock_open: the handshake on fd (blocking; its SO_RCVTIMEO, when
 * set, bounds the whole handshake, however the peer spreads its bytes, and
 * is the socket's again after it; SO_SNDTIMEO bounds each write).  RL_OK; RL_EINVAL when the peer's certificate or ours was
 * refused, RL_ETIMEDOUT, RL_ENET; why gets the reason (the certificate
 * that failed, by subject and issuer).  fd stays the caller's (closed by
 * the caller after rli_tls_sock_close).  A context serves any number of
 * connections on any threads; one connection is for one thread at a time. */
typedef struct rli_tls_sock rli_tls_sock;
int rli_tls_sock_open(rli_tls_sock **out, rli_tls_ctx *x, int fd, char *why, size_t whyn);
/* all n bytes (as records of up to 16 KiB, no partial writes): RL_OK,
 * RL_ETIMEDOUT, RL_ECLOSED or RL_ENET */
int rli_tls_sock_write(rli_tls_sock *t, const void *p, size_t n);
/* up to n bytes (at least one): RL_OK with *got, RL_ETIMEDOUT, RL_ECLOSED
 * (the peer closed) or RL_ENET */
int rli_tls_sock_read(rli_tls_sock *t, void *p, size_t n, size_t *got);
/* a close-notify when the handshake finished, then frees t; NULL is fine */
void rli_tls_sock_close(rli_tls_sock *t);

#endif

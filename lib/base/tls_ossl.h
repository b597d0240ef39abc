/*
 * tls_ossl.h — a TLS engine for nng on OpenSSL (libssl 3), registered in
 * place of the mbedTLS engine nng is built with.
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

#endif

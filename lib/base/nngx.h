/*
 * nngx.h — small helpers around nng shared by the clients in lib/.
 */
#ifndef RL_NNGX_H
#define RL_NNGX_H

#include <nng/nng.h>

#include "base/tls_ossl.h"

/* rli_nng_close_timed closes sock on a helper thread and waits for it at most
 * a second: nng 1.5's nng_close can hang (nng bug #1543, e.g. on a REQ socket
 * with a request that just timed out).  When it does, the thread and the
 * socket are leaked (logged at verbose level, naming `what`), which beats a
 * program that never exits.  Returns 1 when the close finished, 0 when it was
 * left hanging (then nothing the socket's callbacks may touch can be freed).
 * RL_NNG_TEST_CLOSE_WAIT_MS (tests only) sets the wait; 0 leaves every close
 * that has not finished at once.  Thread-safe. */
int rli_nng_close_timed(nng_socket sock, const char *what);

/* A tcp:// (or tls+tcp://) URL to dial must end in a port 1..65535: nng takes
 * tcp://host:99999 and the dial then fails and retries until the timeout.
 * RL_OK for such a URL and for other schemes; else an error naming the URL
 * (RL_EINVAL). */
int rli_url_port_check(const char *url);
/* The same for a URL to listen on, where port 0 (any free one) is allowed
 * too; a missing port is not (nng would take it for 0). */
int rli_url_port_check_listen(const char *url);

/* rli_url_is_local: 1 for ipc://, inproc:// and a URL whose host is a
 * loopback address (127.0.0.0/8, ::1, localhost); 0 for a wildcard
 * (tcp://0.0.0.0:P, tcp://[*]:P, tcp://:P), another address or a host name. */
int rli_url_is_local(const char *url);
/* rli_listen_policy: a server listens beyond this machine only when its
 * requests are protected (secured: TLS or a shared key) or the user said so
 * (allow_public: --listen-public).  RL_OK, or RL_EINVAL logged with a hint
 * (prog names the command). */
int rli_listen_policy(const char *prog, const char *url, int secured, int allow_public);

/* TLS for tls+tcp:// URLs (nng's TLS transport on the OpenSSL engine of
 * base/tls_ossl.h, registered at the first tls+ URL; RL_TLS_ENGINE=mbedtls
 * keeps nng's built-in mbedTLS engine).
 * rli_nng_tls_files sets the process's files: cert and key (PEM; together)
 * are this end's certificate, ca (PEM) the CA the other end's must be signed
 * by; it clears the key's password file and the CRL file (set them after it
 * with rli_nng_tls_opt).  A listener needs cert and key; with ca it also
 * requires and checks a client certificate (the clients are authenticated).
 * A dialer needs ca and checks the server's certificate against the URL's
 * host: a name against its DNS names, an IP address against its IP
 * subjectAltNames (refused outright on nng's mbedTLS engine, which cannot
 * check addresses); it presents cert and key when given.  An encrypted key
 * needs the password file (first line; mode 600 or stricter): without it or
 * with a wrong password the configuration is refused, naming the key file.
 * CRLs (PEM) make a revoked peer certificate fail the handshake.
 * Not called: RL_TLS_CERT, RL_TLS_KEY, RL_TLS_CA, RL_TLS_KEY_PASS_FILE and
 * RL_TLS_CRL from the environment are used at the first tls+ URL.  RL_EINVAL
 * (logged) for a cert without a key or the other way round. */
int rli_nng_tls_files(const char *cert, const char *key, const char *ca);
/* one of them (which: 'c' cert, 'k' key, 'a' CA, 'p' the key's password
 * file, 'r' the CRL file), for a command's option parser; the pairing of
 * cert and key is checked at the first tls+ URL */
int rli_nng_tls_opt(int which, const char *path);
/* 1 when a TLS listener of this process would require client certificates */
int rli_nng_tls_authenticates(void);
/* nng_listen / nng_dial that configure TLS for tls+ URLs (others unchanged).
 * The dial of a tls+ URL connects once first: a failed handshake is logged
 * and returned (NNG_ECRYPTO, NNG_EPEERAUTH, ...) rather than retried in the
 * background; with NNG_FLAG_NONBLOCK a server not up yet is dialled again in
 * the background.  That first connection is bounded: one whose handshake has
 * not ended within 5 s (RL_TLS_DIAL_WAIT_MS) is closed and made again once,
 * then (logged) NNG_ETIMEDOUT, or with NNG_FLAG_NONBLOCK left to the
 * background dials; nng 1.5 alone can wait for it for ever.  Missing or
 * unreadable files: logged, NNG_EINVAL. */
int rli_nng_listen(nng_socket s, const char *url, nng_listener *l);
/* the same files as an OpenSSL context of base/tls_ossl.h, for a socket of
 * the caller's next to a tls+ URL (rl-sync's bulk stream): a server's
 * requires client certificates when a CA is given, a client's checks the
 * URL's host.  RL_OK, or an error logged naming the file; the caller frees
 * *out with rli_tls_ctx_free.  Thread-safe. */
int rli_nng_tls_ctx(rli_tls_ctx **out, int server, const char *url);
int rli_nng_dial(nng_socket s, const char *url, nng_dialer *d, int flags);

/* A client's dial that recovers from a stalled reconnection.  nng 1.5 can
 * leave a TLS reconnection's negotiation waiting for ever (see
 * rli_nng_dial), and its dialer then never dials again: a client whose
 * server restarted at the wrong moment would never reach it.
 * rli_redial_open dials url on sock as rli_nng_dial does (flags the same)
 * and counts the socket's connections (it takes the socket's pipe
 * notifications, ADD_POST and REM_POST).  rli_redial_check, called by a
 * client whose request failed or timed out, closes the dialer and dials
 * again when url is tls+ and the socket has had no connection for
 * RL_TLS_REDIAL_S seconds (default 12, past nng's 10 s negotiation
 * timeout) since it opened, lost its last or dialled again; it returns 1
 * then (logged at verbose level), else 0.  Thread-safe.
 * rli_redial_free after the socket is closed; when its close was left
 * hanging (rli_nng_close_timed returned 0) the callbacks may still run:
 * leave it.  *out is NULL on failure (the dial's nng error returned). */
typedef struct rli_redial rli_redial;
int rli_redial_open(rli_redial **out, nng_socket s, const char *url, int flags);
int rli_redial_check(rli_redial *r);
void rli_redial_free(rli_redial *r);

#endif

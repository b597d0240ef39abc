/*
 * auth.h — the shared key (--auth-key-file) that every request to rl-queue
 * and rl-sync carries proof of: loading the key file (refused when group or
 * others may read it, as ssh refuses a private key), HMAC-SHA256 (OpenSSL)
 * and a constant-time compare, and a replay guard for servers.
 *
 * The key is process-wide, like the TLS files (nngx.h): a command sets it
 * once from its options; lib/queue and lib/sync ask rli_auth_key().
 * Leaves out: where the proof sits in a message (qproto.h, wsync_int.h).
 */
#ifndef RL_AUTH_H
#define RL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define RLI_AUTH_MAC_LEN 32
/* a request's time may differ from the server's clock by this much */
#define RLI_AUTH_WINDOW_NS (300ull * 1000000000ull)

/* Reads the key from path (trailing newlines dropped; 16 bytes at least) and
 * makes it the process's key.  RL_EINVAL (logged, naming the file and its
 * mode) for a file group or others can read or write, RL_ENOENT/RL_EIO for
 * one that cannot be read, RL_EFORMAT for a key too short. */
int rli_auth_set_file(const char *path);
/* The process's key and its length, or NULL when none was set.  A key given
 * in the environment as RL_AUTH_KEY_FILE is loaded at the first call (an
 * error there is logged and the process then has no key). */
const uint8_t *rli_auth_key(size_t *len);
/* Drops the key (tests). */
void rli_auth_clear(void);

/* HMAC-SHA256 with the process's key over a then b (either may be empty). */
void rli_auth_mac(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen, const void *b, size_t blen);
/* The proof a request carries (qproto.h, wsync_int.h): with a the request's
 * header (which holds its time and nonce) and b its body,
 *   HMAC-SHA256(K, a || Poly1305(Km, b)),  Km = HMAC-SHA256(K, label || a)
 * where label is RLI_AUTH_BODY_LABEL with its terminating zero (18 bytes).
 * The body is hashed once, by Poly1305 (~6x HMAC-SHA256's speed) under a key
 * that belongs to this request only and never crosses the wire: changing a
 * changes Km, changing b needs a Poly1305 collision under an unknown key
 * (chance about len(b)/2^100 per try). */
#define RLI_AUTH_BODY_LABEL "rlpipe body key 1"
void rli_auth_seal(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen, const void *b, size_t blen);
/* The proof of a request sent over TLS (tls+tcp://), whose channel already
 * keeps its body from being read or changed: HMAC-SHA256(K, label || a) with
 * label RLI_AUTH_HEAD_LABEL and its terminating zero (21 bytes) and a the
 * request's header (time and nonce included).  The label keeps it apart from
 * rli_auth_seal's Km, so neither can stand for the other; a server on plain
 * tcp:// refuses it (qproto.h, wsync_int.h). */
#define RLI_AUTH_HEAD_LABEL "rlpipe header only 1"
void rli_auth_seal_head(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen);
/* 1 when x and y (n bytes) are equal; time does not depend on where they differ */
int rli_auth_equal(const void *x, const void *y, size_t n);
/* A fresh (time, nonce) pair for a request: the Unix time in ns and 64
 * random bits. */
void rli_auth_stamp(uint64_t *t_ns, uint64_t *nonce);
/* The server's check of a verified request's (time, nonce): RL_OK, or
 * RL_EINVAL with why set when the time is outside the window or the pair was
 * seen before (a replay).  Thread-safe. */
int rli_auth_fresh(uint64_t t_ns, uint64_t nonce, const char **why);

#endif

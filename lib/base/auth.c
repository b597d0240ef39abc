/*
 * auth.c — the shared key (see auth.h).
 *
 * The replay guard remembers the last 2^16 (time, nonce) pairs in a hashed
 * table: a request older than the window is refused by its time, a newer one
 * by the table.  A pair evicted by a collision before its window ends could
 * be replayed once; with 64 random bits per nonce that takes more than 2^16
 * requests inside the window, and TLS (tls+tcp://) closes that gap.
 * A request's proof (rli_auth_seal) runs its body through Poly1305, not
 * HMAC-SHA256: the body passes through it on both ends, and OpenSSL's
 * Poly1305 is ~6x its HMAC-SHA256 here (5.5 GB/s against 0.85 on 290 KB).
 * Both are OpenSSL's (libcrypto); mbedTLS 2.28's SHA-256 was ten times
 * slower still.
 * Over TLS a request's proof covers its header only (rli_auth_seal_head):
 * the channel protects the body, and hashing it again cost ~10% of the
 * broker's CPU at 4.5 KB records.
 * Leaves out: key rotation and per-client keys.
 */
#include "base/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"
#include "base/hash.h"

#define KEY_MAX 4096
#define SEEN_BITS 16

static uint8_t g_key[KEY_MAX];
static size_t g_key_len;
static unsigned g_key_gen = 1; /* bumped when the key changes: threads rekey their HMAC */
static int g_env_tried;
static pthread_mutex_t g_mtx = PTHREAD_MUTEX_INITIALIZER;
static struct seen {
	uint64_t t, nonce;
} g_seen[1u << SEEN_BITS];

int
rli_auth_set_file(const char *path)
{
	uint8_t buf[KEY_MAX + 1];
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd, rv = RL_OK;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		rl_error("--auth-key-file '%s': %s", path, strerror(errno));
		return errno == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rl_error("--auth-key-file '%s': not a regular file", path);
		rv = RL_EINVAL;
		goto out;
	}
	if (st.st_mode & 077) {
		/* as ssh does for a private key: a secret others can read is no secret */
		rl_error("--auth-key-file '%s': permissions %04o are too open: the key must not be readable "
		    "or writable by group or others (chmod 600 '%s')", path, (unsigned)(st.st_mode & 07777), path);
		rv = RL_EINVAL;
		goto out;
	}
	while (len < sizeof buf && (n = read(fd, buf + len, sizeof buf - len)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rl_error("--auth-key-file '%s': %s", path, strerror(errno));
			rv = RL_EIO;
			goto out;
		}
		len += (size_t)n;
	}
	if (len > KEY_MAX) {
		rl_error("--auth-key-file '%s': longer than %d bytes", path, KEY_MAX);
		rv = RL_ETOOBIG;
		goto out;
	}
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		len--;
	if (len < 16) {
		rl_error("--auth-key-file '%s': the key has %zu bytes; at least 16 are needed "
		    "(e.g. head -c 32 /dev/urandom | base64 > FILE)", path, len);
		rv = RL_EFORMAT;
		goto out;
	}
	pthread_mutex_lock(&g_mtx);
	memcpy(g_key, buf, len);
	g_key_len = len;
	g_key_gen++;
	g_env_tried = 1;
	pthread_mutex_unlock(&g_mtx);
out:
	memset(buf, 0, sizeof buf);
	close(fd);
	return rv;
}

const uint8_t *
rli_auth_key(size_t *len)
{
	const char *env;
	int try_env;

	pthread_mutex_lock(&g_mtx);
	try_env = !g_env_tried;
	g_env_tried = 1;
	pthread_mutex_unlock(&g_mtx);
	if (try_env && (env = getenv("RL_AUTH_KEY_FILE")) != NULL && *env)
		(void)rli_auth_set_file(env);
	if (len)
		*len = g_key_len;
	return g_key_len ? g_key : NULL;
}

void
rli_auth_clear(void)
{
	pthread_mutex_lock(&g_mtx);
	memset(g_key, 0, sizeof g_key);
	g_key_len = 0;
	g_key_gen++;
	g_env_tried = 1;
	memset(g_seen, 0, sizeof g_seen);
	pthread_mutex_unlock(&g_mtx);
}

/* this thread's MAC contexts: the HMAC one keyed once per key (a fresh
 * context costs more than hashing a small request), the Poly1305 one rekeyed
 * per request */
typedef struct macs {
	EVP_MAC_CTX *hmac, *poly;
	unsigned gen;
} macs;

static pthread_key_t g_macs_key;
static pthread_once_t g_macs_once = PTHREAD_ONCE_INIT;

static void
macs_free(void *p)
{
	macs *m = p;

	EVP_MAC_CTX_free(m->hmac);
	EVP_MAC_CTX_free(m->poly);
	free(m);
}

static void
macs_once(void)
{
	(void)pthread_key_create(&g_macs_key, macs_free);
}

/* this thread's contexts with the HMAC one keyed with the current key, or NULL */
static macs *
macs_get(void)
{
	OSSL_PARAM par[2];
	macs *m;
	unsigned gen;

	pthread_once(&g_macs_once, macs_once);
	if ((m = pthread_getspecific(g_macs_key)) == NULL) {
		EVP_MAC *h = EVP_MAC_fetch(NULL, "HMAC", NULL), *p = EVP_MAC_fetch(NULL, "POLY1305", NULL);
		if ((m = calloc(1, sizeof *m)) != NULL && h && p) {
			m->hmac = EVP_MAC_CTX_new(h);
			m->poly = EVP_MAC_CTX_new(p);
		}
		EVP_MAC_free(h);
		EVP_MAC_free(p);
		if (!m || !m->hmac || !m->poly || pthread_setspecific(g_macs_key, m) != 0) {
			if (m)
				macs_free(m);
			return NULL;
		}
	}
	pthread_mutex_lock(&g_mtx);
	gen = g_key_gen;
	if (m->gen != gen) {
		par[0] = OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0);
		par[1] = OSSL_PARAM_construct_end();
		m->gen = EVP_MAC_init(m->hmac, g_key, g_key_len, par) == 1 ? gen : 0;
	}
	pthread_mutex_unlock(&g_mtx);
	return m->gen ? m : NULL;
}

/* HMAC-SHA256 with the process's key over up to three parts; 0 on success */
static int
hmac3(macs *m, uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen, const void *b, size_t blen,
      const void *c, size_t clen)
{
	size_t outl = 0;

	/* a NULL key restarts the context with the key it holds */
	return EVP_MAC_init(m->hmac, NULL, 0, NULL) == 1 && (!alen || EVP_MAC_update(m->hmac, a, alen) == 1) &&
			(!blen || EVP_MAC_update(m->hmac, b, blen) == 1) &&
			(!clen || EVP_MAC_update(m->hmac, c, clen) == 1) &&
			EVP_MAC_final(m->hmac, mac, &outl, RLI_AUTH_MAC_LEN) == 1 && outl == RLI_AUTH_MAC_LEN
		? 0
		: -1;
}

/* a MAC nobody can match: the request is refused, never let through */
static void
mac_fail(uint8_t mac[RLI_AUTH_MAC_LEN])
{
	if (getrandom(mac, RLI_AUTH_MAC_LEN, 0) != RLI_AUTH_MAC_LEN)
		memset(mac, 0xa5, RLI_AUTH_MAC_LEN);
}

void
rli_auth_mac(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen, const void *b, size_t blen)
{
	macs *m = macs_get();

	if (!m || hmac3(m, mac, a, alen, b, blen, NULL, 0) != 0)
		mac_fail(mac);
}

void
rli_auth_seal(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen, const void *b, size_t blen)
{
	static const char label[] = RLI_AUTH_BODY_LABEL;
	uint8_t km[RLI_AUTH_MAC_LEN], tag[16];
	macs *m = macs_get();
	size_t outl = 0;
	int ok;

	/* Poly1305 takes a key used for one message only: the request's own
	 * (time, nonce) in a make it so, as ChaCha20-Poly1305 derives its key
	 * from the nonce.  The outer HMAC keeps the tag itself off the wire. */
	ok = m && hmac3(m, km, label, sizeof label, a, alen, NULL, 0) == 0 &&
	     EVP_MAC_init(m->poly, km, sizeof km, NULL) == 1 && (!blen || EVP_MAC_update(m->poly, b, blen) == 1) &&
	     EVP_MAC_final(m->poly, tag, &outl, sizeof tag) == 1 && outl == sizeof tag &&
	     hmac3(m, mac, a, alen, tag, sizeof tag, NULL, 0) == 0;
	memset(km, 0, sizeof km);
	if (!ok)
		mac_fail(mac);
}

void
rli_auth_seal_head(uint8_t mac[RLI_AUTH_MAC_LEN], const void *a, size_t alen)
{
	static const char label[] = RLI_AUTH_HEAD_LABEL;
	macs *m = macs_get();

	if (!m || hmac3(m, mac, label, sizeof label, a, alen, NULL, 0) != 0)
		mac_fail(mac);
}

int
rli_auth_equal(const void *x, const void *y, size_t n)
{
	const volatile uint8_t *a = x, *b = y;
	uint8_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

void
rli_auth_stamp(uint64_t *t_ns, uint64_t *nonce)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	*t_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if (getrandom(nonce, sizeof *nonce, 0) != (ssize_t)sizeof *nonce)
		*nonce = rl_hash64(&ts, sizeof ts, *t_ns ^ (uint64_t)getpid());
}

int
rli_auth_fresh(uint64_t t_ns, uint64_t nonce, const char **why)
{
	struct timespec ts;
	uint64_t now;
	struct seen *e;
	int rv = RL_OK;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if (t_ns + RLI_AUTH_WINDOW_NS < now || t_ns > now + RLI_AUTH_WINDOW_NS) {
		*why = "the request's time is more than 300 s away from the server's clock (a replay, or clocks out of step)";
		return RL_EINVAL;
	}
	e = &g_seen[rl_hash64(&nonce, sizeof nonce, t_ns) & ((1u << SEEN_BITS) - 1)];
	pthread_mutex_lock(&g_mtx);
	if (e->t == t_ns && e->nonce == nonce) {
		*why = "the request was seen before (a replay)";
		rv = RL_EINVAL;
	} else {
		e->t = t_ns;
		e->nonce = nonce;
	}
	pthread_mutex_unlock(&g_mtx);
	return rv;
}

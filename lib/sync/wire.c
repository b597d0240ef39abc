/*
 * wire.c — the parts of rl-sync's wire format the server and the client
 * share: message headers, chunk tables, manifests, blocking socket I/O for
 * the bulk stream, nng error mapping and the corruption test hook.  The
 * format itself is described in wsync_int.h and docs/sync.md.
 *
 * Leaves out: the requests' meaning (server.c, client.c).
 */
#include "sync/wsync.h"
#include "sync/wsync_int.h"
#include "base/auth.h"
#include "base/tls_ossl.h"
#include "base/core.h"

#include <errno.h>
#include <nng/nng.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

atomic_int rli_ws_test_corrupt;
void rl_wsync_test_corrupt(int n) { atomic_store(&rli_ws_test_corrupt, n); }

void
rli_ws_hdr_fill(uint8_t *p, uint16_t op, int32_t status, uint64_t version, uint64_t a, uint64_t b)
{
	put32(p, WS_MAGIC);
	put16(p + 4, WS_PROTO);
	put16(p + 6, op);
	put32(p + 8, WS_HDR);
	put32(p + 12, (uint32_t)status);
	put64(p + 16, version);
	put64(p + 24, a);
	put64(p + 32, b);
}

/* rli_ws_hdr_parse: validates magic, protocol version and lengths; msg is hostile */
int
rli_ws_hdr_parse(whdr *h, const uint8_t *p, size_t n, const char **why)
{
	uint32_t hl;

	if (n < 12 || get32(p) != WS_MAGIC) {
		*why = "bad magic (not an rl-sync message)";
		return RL_EFORMAT;
	}
	if (get16(p + 4) != WS_PROTO) {
		*why = "unsupported rl-sync protocol version";
		return RL_EVERSION;
	}
	hl = get32(p + 8);
	if (hl < WS_HDR || hl > n) {
		*why = "bad header length";
		return RL_EFORMAT;
	}
	h->op = get16(p + 6);
	h->status = (int32_t)get32(p + 12);
	h->version = get64(p + 16);
	h->a = get64(p + 24);
	h->b = get64(p + 32);
	h->body = p + hl;
	h->bodyn = n - hl;
	return RL_OK;
}

int
rli_ws_chunk_table(cref **out, size_t *nout, const rl_wver *v, size_t chunk)
{
	size_t n = 0, k = 0;
	cref *t;

	for (int i = 0; i < v->nblobs; i++)
		n += (size_t)((v->blobs[i].size + chunk - 1) / chunk);
	if ((t = rl_try_calloc(n ? n : 1, sizeof *t, "chunk table")) == NULL)
		return RL_ENOMEM;
	for (int i = 0; i < v->nblobs; i++)
		for (uint64_t off = 0; off < v->blobs[i].size; off += chunk) {
			t[k].blob = i;
			t[k].off = off;
			t[k].len = (size_t)RL_MIN((uint64_t)chunk, v->blobs[i].size - off);
			k++;
		}
	*out = t;
	*nout = n;
	return RL_OK;
}

int
rli_ws_same_layout(const rl_wver *a, const rl_wver *b)
{
	if (a->nblobs != b->nblobs)
		return 0;
	for (int i = 0; i < a->nblobs; i++)
		if (a->blobs[i].size != b->blobs[i].size || strcmp(a->blobs[i].name, b->blobs[i].name) != 0)
			return 0;
	return 1;
}

int
rli_ws_manifest_encode(uint8_t **out, size_t *outn, const rl_wver *v, uint32_t chunk, uint64_t delta_base)
{
	size_t n = 40, off;
	uint8_t *p;

	for (int i = 0; i < v->nblobs; i++)
		n += 2 + strlen(v->blobs[i].name) + 2 + 16 + 8 * rli_wver_npieces(v->blobs[i].size);
	if ((p = rl_try_malloc(n, "manifest")) == NULL)
		return RL_ENOMEM;
	put32(p, WM_MAGIC);
	put16(p + 4, 1);
	put16(p + 6, 0);
	put64(p + 8, v->version);
	put64(p + 16, v->hash);
	put64(p + 24, delta_base);
	put32(p + 32, chunk);
	put32(p + 36, (uint32_t)v->nblobs);
	off = 40;
	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *b = &v->blobs[i];
		size_t nl = strlen(b->name), np = rli_wver_npieces(b->size);
		put16(p + off, (uint16_t)nl);
		memcpy(p + off + 2, b->name, nl);
		off += 2 + nl;
		p[off] = (uint8_t)b->elem;
		p[off + 1] = 0;
		put64(p + off + 2, b->size);
		put64(p + off + 10, b->hash);
		off += 18;
		for (size_t k = 0; k < np; k++, off += 8)
			put64(p + off, b->pieces[k]);
	}
	*out = p;
	*outn = n;
	return RL_OK;
}

/* rli_ws_manifest_decode: a hostile manifest into a version with allocated (zeroed
 * if zero=1), unverified blobs and the expected hashes. */
int
rli_ws_manifest_decode(rl_wver **out, uint32_t *chunk, uint64_t *delta_base, const uint8_t *p, size_t n, const char **why,
		int alloc, uint64_t limit)
{
	rl_wver *v = NULL;
	uint64_t total = 0;
	size_t off = 40;
	uint32_t nb;
	int rv;

	*out = NULL;
	*why = "truncated manifest";
	if (n < 40)
		return RL_EFORMAT;
	if (get32(p) != WM_MAGIC) {
		*why = "bad manifest magic";
		return RL_EFORMAT;
	}
	if (get16(p + 4) != 1) {
		*why = "unsupported manifest version";
		return RL_EVERSION;
	}
	*chunk = get32(p + 32);
	*delta_base = get64(p + 24);
	nb = get32(p + 36);
	if (*chunk < RL_WSYNC_PIECE || *chunk > RL_WSYNC_CHUNK_MAX || *chunk % RL_WSYNC_PIECE) {
		*why = "bad chunk size in manifest";
		return RL_EFORMAT;
	}
	if (nb > RL_WSYNC_MAX_BLOBS) {
		*why = "too many blobs in manifest";
		return RL_ETOOBIG;
	}
	if ((rv = rl_wver_create(&v, get64(p + 8))) != 0)
		return rv;
	v->hash = get64(p + 16);
	for (uint32_t i = 0; i < nb; i++) {
		char name[RL_WSYNC_NAME_MAX + 1];
		size_t nl, np;
		uint64_t size;
		rl_wblob *b;
		uint8_t *data;

		rv = RL_EFORMAT;
		*why = "truncated manifest";
		if (off + 2 > n)
			goto fail;
		nl = get16(p + off);
		if (nl == 0 || nl > RL_WSYNC_NAME_MAX || off + 2 + nl + 18 > n) {
			*why = nl == 0 || nl > RL_WSYNC_NAME_MAX ? "bad blob name length in manifest" : "truncated manifest";
			goto fail;
		}
		memcpy(name, p + off + 2, nl);
		name[nl] = 0;
		if (strlen(name) != nl) {
			*why = "blob name with a NUL byte in manifest";
			goto fail;
		}
		off += 2 + nl;
		size = get64(p + off + 2);
		if (size > limit || (total += size) > limit) {
			*why = "version larger than this side's limit (max_bytes)";
			rv = RL_ETOOBIG;
			goto fail;
		}
		np = rli_wver_npieces(size);
		if (np > (n - off - 18) / 8) {
			*why = "truncated manifest";
			goto fail;
		}
		data = NULL;
		if (alloc && (data = rl_try_malloc(size ? (size_t)size : 1, name)) == NULL) {
			*why = "out of memory for a blob";
			rv = RL_ENOMEM;
			goto fail;
		}
		v->borrowed = -1;
		if ((rv = rl_wver_add_blob(v, name, data, size, p[off] ? p[off] : 1, 0)) != 0) {
			free(data);
			*why = "bad blob in manifest";
			goto fail;
		}
		v->borrowed = !alloc; /* the version owns what it allocated */
		b = &v->blobs[v->nblobs - 1];
		b->hash = get64(p + off + 10);
		off += 18;
		if ((b->pieces = rl_try_calloc(np ? np : 1, 8, "piece hashes")) == NULL) {
			rv = RL_ENOMEM;
			goto fail;
		}
		for (size_t k = 0; k < np; k++, off += 8)
			b->pieces[k] = get64(p + off);
		if (rli_wver_blob_hash(b) != b->hash) {
			*why = "manifest blob hash does not match its piece hashes";
			rv = RL_ECHECKSUM;
			goto fail;
		}
	}
	if (rli_wver_version_hash(v) != v->hash) {
		*why = "manifest version hash mismatch";
		rv = RL_ECHECKSUM;
		goto fail;
	}
	*out = v;
	return RL_OK;
fail:
	rl_wver_destroy(v);
	return rv;
}

/* all of (a, an) then (b, bn) on a blocking socket; 0 or -1 */
int
rli_ws_sock_send2(int fd, const void *a, size_t an, const void *b, size_t bn)
{
	struct iovec iov[2] = { { (void *)a, an }, { (void *)b, bn } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = bn ? 2 : 1 };

	while (iov[0].iov_len + iov[1].iov_len > 0) {
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		for (int k = 0; k < 2; k++) {
			size_t t = RL_MIN((size_t)w, iov[k].iov_len);
			iov[k].iov_base = (uint8_t *)iov[k].iov_base + t;
			iov[k].iov_len -= t;
			w -= (ssize_t)t;
		}
		if (iov[0].iov_len == 0) {
			mh.msg_iov = &iov[1];
			mh.msg_iovlen = 1;
		}
	}
	return 0;
}

/* exactly n bytes; 0, or -1 (error, timeout or the peer closed) */
int
rli_ws_sock_recv(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = recv(fd, (uint8_t *)p + got, n - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static int
sock_err(void)
{
	return errno == EAGAIN || errno == EWOULDBLOCK ? RL_ETIMEDOUT : errno == 0 ? RL_ECLOSED : RL_ENET;
}

int
rli_wb_send2(const wbio *io, const void *a, size_t an, const void *b, size_t bn)
{
	int rv;

	if (io->tls == NULL) {
		errno = 0;
		return rli_ws_sock_send2(io->fd, a, an, b, bn) == 0 ? RL_OK : sock_err();
	}
	if ((rv = rli_tls_sock_write(io->tls, a, an)) == RL_OK && bn > 0)
		rv = rli_tls_sock_write(io->tls, b, bn);
	return rv;
}

int
rli_wb_recv_some(const wbio *io, void *p, size_t n, size_t *got)
{
	ssize_t r;

	if (io->tls != NULL)
		return rli_tls_sock_read(io->tls, p, n, got);
	*got = 0;
	do {
		errno = 0;
		r = recv(io->fd, p, n, 0);
	} while (r < 0 && errno == EINTR);
	if (r <= 0)
		return sock_err();
	*got = (size_t)r;
	return RL_OK;
}

int
rli_wb_recv(const wbio *io, void *p, size_t n)
{
	size_t got = 0, k;
	int rv;

	while (got < n) {
		if ((rv = rli_wb_recv_some(io, (uint8_t *)p + got, n - got, &k)) != RL_OK)
			return rv;
		got += k;
	}
	return RL_OK;
}

void
rli_ws_sock_timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
	int one = 1;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on Unix sockets */
}

/* half the machine's memory: what one version may claim in a manifest */
uint64_t
rli_ws_default_max_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : (uint64_t)1 << 34;
}

int
rli_ws_nng_err(int r, const char *what, const char *url)
{
	rl_error("%s '%s': %s", what, url, nng_strerror(r));
	if (r == NNG_EADDRINUSE)
		rl_hint("another process listens there; pick another port with --listen");
	return r == NNG_ENOMEM ? RL_ENOMEM : r == NNG_EADDRINVAL || r == NNG_ENOTSUP ? RL_EINVAL : RL_ENET;
}

void
rli_ws_auth_sign_at(uint8_t *msg, size_t base, size_t len)
{
	uint64_t t, nonce;

	put32(msg + 8, (uint32_t)(base + WS_AUTH_EXTRA));
	rli_auth_stamp(&t, &nonce);
	put64(msg + base, t);
	put64(msg + base + 8, nonce);
	rli_auth_seal(msg + base + 16, msg, base + 16, msg + base + WS_AUTH_EXTRA, len - base - WS_AUTH_EXTRA);
}

int
rli_ws_auth_check_at(const uint8_t *msg, size_t base, size_t len, const char **why)
{
	uint8_t mac[RLI_AUTH_MAC_LEN];

	if (!rli_auth_key(NULL))
		return RL_OK;
	if (len < base + WS_AUTH_EXTRA || get32(msg + 8) < base + WS_AUTH_EXTRA) {
		*why = "this rl-sync server requires a shared key: start the client with --auth-key-file (the same key "
		    "as the server's; clients older than the key do not have the option)";
		return RL_EINVAL;
	}
	rli_auth_seal(mac, msg, base + 16, msg + base + WS_AUTH_EXTRA, len - base - WS_AUTH_EXTRA);
	if (!rli_auth_equal(mac, msg + base + 16, sizeof mac)) {
		*why = "wrong shared key: the request's MAC does not match this rl-sync server's --auth-key-file";
		return RL_EINVAL;
	}
	return rli_auth_fresh(get64(msg + base), get64(msg + base + 8), why);
}

void
rli_ws_auth_sign(uint8_t *msg, size_t len, int tls)
{
	uint64_t t, nonce;

	if (!tls) {
		rli_ws_auth_sign_at(msg, WS_HDR, len);
		return;
	}
	put32(msg + 8, (uint32_t)WS_AUTH_HDR);
	rli_auth_stamp(&t, &nonce);
	put64(msg + WS_HDR, t);
	put64(msg + WS_HDR + 8, nonce);
	rli_auth_seal_head(msg + WS_HDR + 16, msg, WS_HDR + 16);
}

int
rli_ws_auth_check(const uint8_t *msg, size_t len, int tls, const char **why)
{
	uint8_t mac[RLI_AUTH_MAC_LEN];
	int rv;

	if (!rli_auth_key(NULL))
		return RL_OK;
	/* over TLS the header-only proof is the one expected; the full one
	 * (rli_ws_auth_check_at) is taken too */
	if (tls && len >= WS_AUTH_HDR && get32(msg + 8) >= WS_AUTH_HDR) {
		rli_auth_seal_head(mac, msg, WS_HDR + 16);
		if (rli_auth_equal(mac, msg + WS_HDR + 16, sizeof mac))
			return rli_auth_fresh(get64(msg + WS_HDR), get64(msg + WS_HDR + 8), why);
	}
	if ((rv = rli_ws_auth_check_at(msg, WS_HDR, len, why)) != 0 && !tls && len >= WS_AUTH_HDR &&
	    get32(msg + 8) >= WS_AUTH_HDR) {
		rli_auth_seal_head(mac, msg, WS_HDR + 16);
		if (rli_auth_equal(mac, msg + WS_HDR + 16, sizeof mac))
			*why = "the request's MAC covers its header only, as over tls+tcp:// where TLS protects the body, "
			    "but this rl-sync server listens on plain tcp:// and requires the body covered (a TLS proxy "
			    "in between? dial the server's own URL)";
	}
	return rv;
}

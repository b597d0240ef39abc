/*
 * wsync.c — rl-sync's library: checksum, in-memory versions, the chunk codec,
 * the nng service and client, and the transport-neutral rl_wsync handle.
 *
 * Leaves out: reading/writing version directories (wdir.c), GPU transports
 * (the vtable in wsync.h is their seam).
 *
 * Wire format (all integers little-endian; see docs/sync.md):
 *   every message: header (40 bytes) then body
 *     u32 magic "RLSY", u16 proto (1), u16 op, u32 header length (40),
 *     i32 status (rl_err, replies), u64 version, u64 a, u64 b
 *   a reply has op | 0x8000.  Chunk bodies start with u32 flags, u32 elem,
 *   u64 raw length, then the encoded bytes.
 *   bulk stream (a second, plain socket): 48-byte request "RLSB" for a range
 *   of chunks, each answered by a 48-byte header and the raw chunk bytes.
 */
#include "base/nngx.h"
#include "sync/wsync.h"
#include "sync/wdir.h"
#include "sync/wshm.h"
#include "base/core.h"
#include "base/hash.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/mman.h>

/* ---- versions ----------------------------------------------------------------- */
int
rl_wver_create(rl_wver **out, uint64_t version)
{
	rl_wver *v;

	*out = NULL;
	if ((v = rl_try_calloc(1, sizeof *v, "version")) == NULL)
		return RL_ENOMEM;
	v->version = version;
	v->borrowed = -1;
	*out = v;
	return RL_OK;
}

static int
default_elem(const char *name)
{
	size_t n = strlen(name);

	if ((n > 12 && strcmp(name + n - 12, ".safetensors") == 0) || (n > 4 && strcmp(name + n - 4, ".bin") == 0))
		return 2;
	return 1;
}

int
rl_wver_add_blob_owned(rl_wver *v, const char *name, void *data, uint64_t size, int elem)
{
	int rv = rl_wver_add_blob(v, name, data, size, elem, RLI_WVER_TAKE);
	if (rv != 0)
		free(data);
	return rv;
}

int
rl_wver_add_blob(rl_wver *v, const char *name, const void *data, uint64_t size, int elem, int copy)
{
	rl_wblob *nb, *b;
	size_t nl = name ? strlen(name) : 0;

	if (nl == 0 || nl > RL_WSYNC_NAME_MAX) {
		rl_error("blob name must be 1..%d bytes", RL_WSYNC_NAME_MAX);
		return RL_EINVAL;
	}
	if (v->borrowed >= 0 && v->borrowed != !copy) {
		rl_error("blob '%s': cannot mix copied and borrowed blobs in one version", name);
		return RL_EINVAL;
	}
	if (v->nblobs >= RL_WSYNC_MAX_BLOBS) {
		rl_error("too many blobs (max %d)", RL_WSYNC_MAX_BLOBS);
		return RL_ETOOBIG;
	}
	if (rl_wver_find(v, name) != NULL) {
		rl_error("duplicate blob name '%s'", name);
		return RL_EEXIST;
	}
	if (elem != 0 && elem != 1 && elem != 2 && elem != 4) {
		rl_error("blob '%s': element size %d (want 1, 2 or 4)", name, elem);
		return RL_EINVAL;
	}
	if ((uint64_t)(size_t)size != size)
		return RL_ETOOBIG;
	if ((nb = realloc(v->blobs, (size_t)(v->nblobs + 1) * sizeof *nb)) == NULL)
		return RL_ENOMEM;
	v->blobs = nb;
	b = &v->blobs[v->nblobs];
	memset(b, 0, sizeof *b);
	b->device = -1;
	b->size = size;
	b->elem = elem ? elem : default_elem(name);
	if ((b->name = strdup(name)) == NULL)
		return RL_ENOMEM;
	if (copy == RLI_WVER_TAKE) {
		b->data = (uint8_t *)data;   /* the caller's malloc'd buffer, now ours */
	} else if (copy) {
		if ((b->data = rl_try_malloc(size ? (size_t)size : 1, name)) == NULL) {
			free(b->name);
			return RL_ENOMEM;
		}
		if (size)
			memcpy(b->data, data, (size_t)size);
	} else {
		b->data = (uint8_t *)data;
	}
	v->borrowed = !copy;
	v->nblobs++;
	return RL_OK;
}

void
rl_wver_destroy(rl_wver *v)
{
	if (v == NULL)
		return;
	for (int i = 0; i < v->nblobs; i++) {
		free(v->blobs[i].name);
		free(v->blobs[i].pieces);
		if (v->borrowed != 1)
			free(v->blobs[i].data);
	}
	if (v->map)
		munmap(v->map, v->mapn);
	free(v->blobs);
	free(v);
}

uint64_t
rl_wver_total(const rl_wver *v)
{
	uint64_t t = 0;

	for (int i = 0; i < v->nblobs; i++)
		t += v->blobs[i].size;
	return t;
}

const rl_wblob *
rl_wver_find(const rl_wver *v, const char *name)
{
	for (int i = 0; i < v->nblobs; i++)
		if (strcmp(v->blobs[i].name, name) == 0)
			return &v->blobs[i];
	return NULL;
}

static size_t npieces(uint64_t size) { return (size_t)((size + RL_WSYNC_PIECE - 1) / RL_WSYNC_PIECE); }

static uint64_t
blob_hash_from_pieces(const rl_wblob *b)
{
	size_t np = npieces(b->size);
	uint64_t h = rl_hash64(b->pieces, np * sizeof(uint64_t), b->size);

	return h;
}

/* version hash: over the number and each blob's name, size and hash; blob
 * order does not matter (a directory read back lists files sorted) */
static uint64_t
version_hash(const rl_wver *v)
{
	uint64_t acc = 0, fin[3];

	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *b = &v->blobs[i];
		uint64_t rec[2] = { b->size, b->hash };
		acc += rl_hash64(rec, sizeof rec, rl_hash64(b->name, strlen(b->name), 0x524c5359));
	}
	fin[0] = v->version;
	fin[1] = acc;
	fin[2] = (uint64_t)v->nblobs;
	return rl_hash64(fin, sizeof fin, 0x524c5359);
}

static void
hash_pieces(uint64_t *dst, const uint8_t *data, uint64_t size)
{
	size_t np = npieces(size);

	for (size_t i = 0; i < np; i++) {
		size_t off = i * RL_WSYNC_PIECE, n = RL_MIN(RL_WSYNC_PIECE, (size_t)size - off);
		dst[i] = rl_hash64(data + off, n, 0);
	}
}

int
rl_wver_hash(rl_wver *v)
{
	for (int i = 0; i < v->nblobs; i++) {
		rl_wblob *b = &v->blobs[i];
		size_t np = npieces(b->size);
		if (b->pieces == NULL && (b->pieces = rl_try_calloc(np ? np : 1, sizeof(uint64_t), "piece hashes")) == NULL)
			return RL_ENOMEM;
		hash_pieces(b->pieces, b->data, b->size);
		b->hash = blob_hash_from_pieces(b);
	}
	v->hash = version_hash(v);
	return RL_OK;
}

int
rl_wver_verify(const rl_wver *v)
{
	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *b = &v->blobs[i];
		size_t np = npieces(b->size);
		if (b->pieces == NULL)
			return RL_EINVAL;
		for (size_t k = 0; k < np; k++) {
			size_t off = k * RL_WSYNC_PIECE, n = RL_MIN(RL_WSYNC_PIECE, (size_t)b->size - off);
			if (rl_hash64(b->data + off, n, 0) != b->pieces[k]) {
				rl_error("version %llu: blob '%s': checksum mismatch at byte %zu",
					 (unsigned long long)v->version, b->name, off);
				return RL_ECHECKSUM;
			}
		}
		if (blob_hash_from_pieces(b) != b->hash) {
			rl_error("version %llu: blob '%s': checksum mismatch", (unsigned long long)v->version, b->name);
			return RL_ECHECKSUM;
		}
	}
	if (version_hash(v) != v->hash) {
		rl_error("version %llu: version checksum mismatch", (unsigned long long)v->version);
		return RL_ECHECKSUM;
	}
	return RL_OK;
}

/* ---- codec ------------------------------------------------------------------------ */
/* An encoded chunk is a list of segments: the `elem` byte planes of the
 * (XOR'd) chunk, then the n % elem tail bytes (elem 1: one segment, the
 * chunk).  Each segment is u32 encoded length, u8 kind (0 stored, 1 zstd,
 * 2 sparse: below), 3 zero bytes, then its bytes.  Planes are compressed one
 * by one so the near-random low mantissa plane of bf16 weights is stored and
 * only the exponent plane pays for zstd, both ways. */
#define SEG_HDR 8

/* per-thread zstd contexts and scratch, freed at thread exit */
typedef struct tls_codec {
	ZSTD_CCtx *cc;
	ZSTD_DCtx *dc;
	uint8_t *buf, *buf2;      /* planes; the gaps of a sparse segment */
	size_t cap, cap2;
} tls_codec;
static pthread_key_t codec_key;
static pthread_once_t codec_once = PTHREAD_ONCE_INIT;

static void
codec_free(void *p)
{
	tls_codec *t = p;

	if (t == NULL)
		return;
	ZSTD_freeCCtx(t->cc);
	ZSTD_freeDCtx(t->dc);
	free(t->buf);
	free(t->buf2);
	free(t);
}

static void codec_key_make(void) { pthread_key_create(&codec_key, codec_free); }

static tls_codec *
codec_tls(size_t need)
{
	tls_codec *t;

	pthread_once(&codec_once, codec_key_make);
	if ((t = pthread_getspecific(codec_key)) == NULL) {
		if ((t = calloc(1, sizeof *t)) == NULL)
			return NULL;
		t->cc = ZSTD_createCCtx();
		t->dc = ZSTD_createDCtx();
		if (t->cc == NULL || t->dc == NULL || pthread_setspecific(codec_key, t) != 0) {
			codec_free(t);
			return NULL;
		}
	}
	if (need > t->cap) {
		uint8_t *nb = realloc(t->buf, need);
		if (nb == NULL)
			return NULL;
		t->buf = nb;
		t->cap = need;
	}
	return t;
}

static uint8_t *
tls_scratch2(tls_codec *t, size_t need)
{
	if (need > t->cap2) {
		uint8_t *nb = realloc(t->buf2, need);
		if (nb == NULL)
			return NULL;
		t->buf2 = nb;
		t->cap2 = need;
	}
	return t->buf2;
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* planes of (src [^ base]): byte k of every element together at dst + k*ne;
 * the n % elem tail bytes after the planes */
static void
shuffle_xor(uint8_t *restrict dst, const uint8_t *restrict src, const uint8_t *restrict base, size_t n, int elem)
{
	size_t ne = n / (size_t)elem, i = 0;

	if (elem == 2) {
		uint8_t *d0 = dst, *d1 = dst + ne;
#if defined(__SSE2__)
		const __m128i m = _mm_set1_epi16(0x00ff);
		for (; i + 16 <= ne; i += 16) {
			__m128i a = _mm_loadu_si128((const __m128i *)(src + 2 * i));
			__m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
			if (base) {
				a = _mm_xor_si128(a, _mm_loadu_si128((const __m128i *)(base + 2 * i)));
				b = _mm_xor_si128(b, _mm_loadu_si128((const __m128i *)(base + 2 * i + 16)));
			}
			_mm_storeu_si128((__m128i *)(d0 + i), _mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m)));
			_mm_storeu_si128((__m128i *)(d1 + i), _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
		}
#endif
		for (; i < ne; i++) {
			d0[i] = src[2 * i] ^ (base ? base[2 * i] : 0);
			d1[i] = src[2 * i + 1] ^ (base ? base[2 * i + 1] : 0);
		}
	} else if (elem > 1) {
		for (int k = 0; k < elem; k++) {
			uint8_t *d = dst + (size_t)k * ne;
			if (base)
				for (i = 0; i < ne; i++)
					d[i] = src[i * elem + k] ^ base[i * elem + k];
			else
				for (i = 0; i < ne; i++)
					d[i] = src[i * elem + k];
		}
	} else {
		for (i = 0; i < n; i++)
			dst[i] = src[i] ^ base[i];
		return;
	}
	for (i = ne * elem; i < n; i++)
		dst[i] = base ? src[i] ^ base[i] : src[i];
}

/* the inverse: plane k at pl[k] (ne bytes each), tail at pl[elem] */
static void
unshuffle_xor(uint8_t *restrict dst, const uint8_t *const *pl, const uint8_t *restrict base, size_t n, int elem)
{
	size_t ne = n / (size_t)elem, i = 0;

	if (elem == 2) {
		const uint8_t *s0 = pl[0], *s1 = pl[1];
#if defined(__SSE2__)
		for (; i + 16 <= ne; i += 16) {
			__m128i lo = _mm_loadu_si128((const __m128i *)(s0 + i));
			__m128i hi = _mm_loadu_si128((const __m128i *)(s1 + i));
			__m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);
			if (base) {
				a = _mm_xor_si128(a, _mm_loadu_si128((const __m128i *)(base + 2 * i)));
				b = _mm_xor_si128(b, _mm_loadu_si128((const __m128i *)(base + 2 * i + 16)));
			}
			_mm_storeu_si128((__m128i *)(dst + 2 * i), a);
			_mm_storeu_si128((__m128i *)(dst + 2 * i + 16), b);
		}
#endif
		for (; i < ne; i++) {
			dst[2 * i] = s0[i] ^ (base ? base[2 * i] : 0);
			dst[2 * i + 1] = s1[i] ^ (base ? base[2 * i + 1] : 0);
		}
	} else {
		for (int k = 0; k < elem; k++) {
			const uint8_t *s = pl[k];
			if (base)
				for (i = 0; i < ne; i++)
					dst[i * elem + k] = s[i] ^ base[i * elem + k];
			else
				for (i = 0; i < ne; i++)
					dst[i * elem + k] = s[i];
		}
	}
	for (i = ne * elem; i < n; i++)
		dst[i] = pl[elem][i - ne * elem] ^ (base ? base[i] : 0);
}

/* a sampled byte histogram with entropy near 8 bits: zstd would store it
 * anyway (the low mantissa plane of weights), so do not spend time trying */
static int
looks_random(const uint8_t *p, size_t n)
{
	uint32_t h[256] = { 0 };
	size_t step = n >= 65536 ? 16 : 1, cnt = 0;
	double e = 0;

	if (n < 16384)
		return 0;
	for (size_t i = 0; i < n; i += step, cnt++)
		h[p[i]]++;
	for (int k = 0; k < 256; k++)
		if (h[k]) {
			double q = (double)h[k] / (double)cnt;
			e -= q * log2(q);
		}
	return e > 7.8;
}

/* ---- sparse segments (kind 2) ----------------------------------------------------------
 * The XOR planes of a delta are mostly zero bytes, and zstd decodes those at
 * about 1.6 GB/s whatever the level (0.15 s per 250 MB here: more than the
 * rest of a delta fetch).  A plane with at most 1/16 non-zero bytes is coded
 * as: u32 count K of non-zero bytes, u32 length G of the next field, G bytes
 * of zstd-compressed gaps (K LEB128 numbers: the zero bytes before each
 * non-zero one), then the K non-zero bytes.  Decoding is a memset and a
 * scatter. */
#define SPARSE_MIN 4096   /* smaller planes are not worth it */
#define SPARSE_DIV 16     /* at most 1/16 non-zero bytes */

static void put32(uint8_t *p, uint32_t v);
static uint32_t get32(const uint8_t *p);

static size_t
count_nonzero(const uint8_t *p, size_t n)
{
	size_t i = 0, nz = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, 8);
		if (w == 0)
			continue;
		for (int k = 0; k < 8; k++)
			nz += p[i + k] != 0;
	}
	for (; i < n; i++)
		nz += p[i] != 0;
	return nz;
}

/* the sparse coding of p (n bytes, nz of them non-zero) into out (cap
 * bytes): its length, or 0 if it does not fit or zstd fails */
static size_t
sparse_encode(uint8_t *out, size_t cap, const uint8_t *p, size_t n, size_t nz, tls_codec *t, int level)
{
	size_t glen = 0, last = 0, gz, off;
	uint8_t *g;

	if (nz > UINT32_MAX || (g = tls_scratch2(t, 5 * nz + 16)) == NULL)
		return 0;
	for (size_t i = 0; i < n; i++) {
		size_t gap;
		uint64_t w;
		if (i + 8 <= n && (memcpy(&w, p + i, 8), w == 0)) {
			i += 7;
			continue;
		}
		if (p[i] == 0)
			continue;
		for (gap = i - last; gap >= 0x80; gap >>= 7)
			g[glen++] = (uint8_t)(gap | 0x80);
		g[glen++] = (uint8_t)gap;
		last = i + 1;
	}
	if (cap < 8 + ZSTD_compressBound(glen) + nz)
		return 0;
	gz = ZSTD_compressCCtx(t->cc, out + 8, cap - 8, g, glen, level);
	if (ZSTD_isError(gz) || gz > UINT32_MAX)
		return 0;
	put32(out, (uint32_t)nz);
	put32(out + 4, (uint32_t)gz);
	off = 8 + gz;
	for (size_t i = 0; i < n; i++) {
		uint64_t w;
		if (i + 8 <= n && (memcpy(&w, p + i, 8), w == 0))
			i += 7;
		else if (p[i] != 0)
			out[off++] = p[i];
	}
	return off;
}

/* decode a sparse segment of zn bytes at e into d (n bytes); it is hostile */
static int
sparse_decode(uint8_t *d, size_t n, const uint8_t *e, size_t zn, tls_codec *t)
{
	size_t nz, gz, cur = 0, gp = 0, glen;
	unsigned long long want;
	const uint8_t *v;
	uint8_t *g;

	if (zn < 8)
		return RL_EFORMAT;
	nz = get32(e);
	gz = get32(e + 4);
	if (nz > n || gz > zn - 8 || zn - 8 - gz != nz)
		return RL_EFORMAT;
	want = ZSTD_getFrameContentSize(e + 8, gz);
	if (want == ZSTD_CONTENTSIZE_UNKNOWN || want == ZSTD_CONTENTSIZE_ERROR || want < nz || want > 5 * (unsigned long long)nz)
		return RL_EFORMAT;
	if ((g = tls_scratch2(t, (size_t)want ? (size_t)want : 1)) == NULL)
		return RL_ENOMEM;
	glen = ZSTD_decompressDCtx(t->dc, g, (size_t)want, e + 8, gz);
	if (ZSTD_isError(glen) || glen != want)
		return RL_EFORMAT;
	v = e + 8 + gz;
	for (size_t j = 0; j < nz; j++) {
		size_t gap = 0;
		int sh = 0;
		for (;;) {
			uint8_t b;
			if (gp >= glen || sh > 35)
				return RL_EFORMAT;
			b = g[gp++];
			gap |= (size_t)(b & 0x7f) << sh;
			if (!(b & 0x80))
				break;
			sh += 7;
		}
		if (gap >= n - cur)
			return RL_EFORMAT;
		memset(d + cur, 0, gap);
		cur += gap;
		d[cur++] = v[j];
	}
	if (gp != glen)
		return RL_EFORMAT;
	memset(d + cur, 0, n - cur);
	return RL_OK;
}

int
rl_wsync_encode(uint8_t **out, size_t *outn, uint32_t *flags, const uint8_t *raw, const uint8_t *base, size_t n,
		int elem, int level)
{
	tls_codec *t;
	const uint8_t *src = raw;
	uint8_t *o;
	size_t ne, cap, off = 0, seg[5];
	int nseg;
	uint32_t f = 0;

	*out = NULL;
	*outn = 0;
	if (elem != 1 && elem != 2 && elem != 4)
		elem = 1;
	if ((t = codec_tls(n ? n : 1)) == NULL)
		return RL_ENOMEM;
	if (base || elem > 1) {
		shuffle_xor(t->buf, raw, base, n, elem);
		src = t->buf;
		f |= (elem > 1 ? RL_WENC_SHUF : 0) | (base ? RL_WENC_DELTA : 0);
	}
	ne = n / (size_t)elem;
	nseg = elem > 1 ? elem + 1 : 1;
	for (int k = 0; k < nseg; k++)
		seg[k] = elem > 1 ? (k < elem ? ne : n - ne * (size_t)elem) : n;
	cap = ZSTD_compressBound(n) + (size_t)nseg * (SEG_HDR + 64);
	if ((o = rl_try_malloc(cap, "encoded chunk")) == NULL)
		return RL_ENOMEM;
	for (int k = 0; k < nseg; k++) {
		size_t zn = 0;
		uint8_t *h = o + off;
		memset(h, 0, SEG_HDR);
		off += SEG_HDR;
		size_t nz = base && seg[k] >= SPARSE_MIN ? count_nonzero(src, seg[k]) : SIZE_MAX;
		if (nz <= seg[k] / SPARSE_DIV &&
		    (zn = sparse_encode(o + off, cap - off, src, seg[k], nz, t, level ? level : 1)) > 0 &&
		    zn + zn / 32 < seg[k]) {
			h[4] = 2;
			f |= RL_WENC_ZSTD;
			goto seg_done;
		}
		zn = 0;
		if (seg[k] >= 64 && !looks_random(src, seg[k])) {
			zn = ZSTD_compressCCtx(t->cc, o + off, cap - off, src, seg[k], level ? level : 1);
			if (ZSTD_isError(zn)) {
				rl_error("zstd: %s", ZSTD_getErrorName(zn));
				free(o);
				return RL_EIO;
			}
		}
		if (zn > 0 && zn + zn / 32 < seg[k]) {
			h[4] = 1;
			f |= RL_WENC_ZSTD;
		} else {
			memcpy(o + off, src, seg[k]);
			zn = seg[k];
		}
seg_done:
		h[0] = (uint8_t)zn;
		h[1] = (uint8_t)(zn >> 8);
		h[2] = (uint8_t)(zn >> 16);
		h[3] = (uint8_t)(zn >> 24);
		off += zn;
		src += seg[k];
	}
	*out = o;
	*outn = off;
	*flags = f;
	return RL_OK;
}

/* decode_chunk: rl_wsync_decode, and with pieces non-NULL also checks each
 * RL_WSYNC_PIECE of the output against pieces[] (the chunk starts on a piece
 * boundary): RL_ECHECKSUM on a mismatch */
static int
decode_chunk(uint8_t *dst, size_t n, const uint8_t *enc, size_t encn, uint32_t flags, const uint8_t *base, int elem,
	     const uint64_t *pieces)
{
	const uint8_t *pl[5];
	tls_codec *t = NULL;
	size_t ne, off = 0, seg[5], scratch = 0;
	int nseg, plain;

	if (flags & ~(uint32_t)(RL_WENC_ZSTD | RL_WENC_DELTA | RL_WENC_SHUF))
		return RL_EFORMAT;
	if ((flags & RL_WENC_DELTA) && base == NULL)
		return RL_EINVAL;
	if (elem != 1 && elem != 2 && elem != 4)
		return RL_EFORMAT;
	if (!(flags & RL_WENC_SHUF))
		elem = 1;
	ne = n / (size_t)elem;
	nseg = elem > 1 ? elem + 1 : 1;
	plain = !(flags & (RL_WENC_SHUF | RL_WENC_DELTA));
	for (int k = 0; k < nseg; k++)
		seg[k] = elem > 1 ? (k < elem ? ne : n - ne * (size_t)elem) : n;
	for (int k = 0; k < nseg; k++) {
		size_t zn;
		int kind;
		if (encn - off < SEG_HDR)
			return RL_EFORMAT;
		zn = (size_t)enc[off] | (size_t)enc[off + 1] << 8 | (size_t)enc[off + 2] << 16 | (size_t)enc[off + 3] << 24;
		kind = enc[off + 4];
		/* every byte of a chunk is checked: the reserved ones must be zero */
		if (enc[off + 5] | enc[off + 6] | enc[off + 7])
			return RL_EFORMAT;
		off += SEG_HDR;
		if (zn > encn - off || kind > 2 || (kind == 0 && zn != seg[k]))
			return RL_EFORMAT;
		if (kind == 2) {
			uint8_t *d;
			int rv;
			if (t == NULL && (t = codec_tls(n ? n : 1)) == NULL)
				return RL_ENOMEM;
			if (plain) {
				d = dst;
			} else {
				d = t->buf + scratch;
				scratch += seg[k];
			}
			if ((rv = sparse_decode(d, seg[k], enc + off, zn, t)) != 0)
				return rv;
			pl[k] = d;
		} else if (kind == 1) {
			uint8_t *d;
			size_t r;
			if (plain) {
				d = dst;
			} else {
				if (t == NULL && (t = codec_tls(n ? n : 1)) == NULL)
					return RL_ENOMEM;
				d = t->buf + scratch;
				scratch += seg[k];
			}
			if (t == NULL && (t = codec_tls(1)) == NULL)
				return RL_ENOMEM;
			r = ZSTD_decompressDCtx(t->dc, d, seg[k], enc + off, zn);
			if (ZSTD_isError(r) || r != seg[k])
				return RL_EFORMAT;
			pl[k] = d;
		} else {
			pl[k] = enc + off;
		}
		off += zn;
	}
	if (off != encn)
		return RL_EFORMAT;
	/* piece by piece, so each piece is hashed while it is still in cache */
	for (size_t o = 0; o < n; o += RL_WSYNC_PIECE) {
		size_t len = RL_MIN(RL_WSYNC_PIECE, n - o);
		const uint8_t *bp = (flags & RL_WENC_DELTA) ? base + o : NULL;
		if (elem > 1) {
			const uint8_t *sp[5];
			for (int k = 0; k < elem; k++)
				sp[k] = pl[k] + o / (size_t)elem;
			sp[elem] = pl[elem]; /* the tail: only the last piece has one */
			unshuffle_xor(dst + o, sp, bp, len, elem);
		} else if (bp) {
			size_t i = 0;
			for (; i + 8 <= len; i += 8) {
				uint64_t a, b;
				memcpy(&a, pl[0] + o + i, 8);
				memcpy(&b, bp + i, 8);
				a ^= b;
				memcpy(dst + o + i, &a, 8);
			}
			for (; i < len; i++)
				dst[o + i] = pl[0][o + i] ^ bp[i];
		} else if (pl[0] != dst) {
			memcpy(dst + o, pl[0] + o, len);
		}
		if (pieces && rl_hash64(dst + o, len, 0) != pieces[o / RL_WSYNC_PIECE])
			return RL_ECHECKSUM;
	}
	return RL_OK;
}

int
rl_wsync_decode(uint8_t *dst, size_t n, const uint8_t *enc, size_t encn, uint32_t flags, const uint8_t *base,
		int elem)
{
	return decode_chunk(dst, n, enc, encn, flags, base, elem, NULL);
}

/* ---- wire helpers -------------------------------------------------------------- */
#define WS_MAGIC 0x59534c52u /* "RLSY" little-endian */
#define WS_PROTO 1
#define WS_HDR 40
#define WM_MAGIC 0x4d574c52u /* "RLWM": manifest */
#define WS_WAIT_MAX_MS 30000 /* a parked long-poll is answered at least this often */
enum { OP_STATUS = 1, OP_WAIT, OP_MANIFEST, OP_CHUNK, OP_PUSH_BEGIN, OP_PUSH_CHUNK, OP_PUSH_COMMIT, OP_DATA,
       OP_SHM, OP_REPLY = 0x8000 };

/* bulk stream (a second listener; docs/sync.md): the client asks for a range
 * of whole chunks with one 48-byte request, the server answers each chunk with
 * a 48-byte header and the raw bytes, written straight from the version */
#define WB_MAGIC 0x42534c52u /* "RLSB" */
#define WB_PROTO 1
#define WB_HDR 48
#define WB_GET 1
#define WB_MAX_CONNS 256

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

typedef struct whdr {
	uint16_t op;
	int32_t status;
	uint64_t version, a, b;
	const uint8_t *body;
	size_t bodyn;
} whdr;

static void
hdr_fill(uint8_t *p, uint16_t op, int32_t status, uint64_t version, uint64_t a, uint64_t b)
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

/* hdr_parse: validates magic, protocol version and lengths; msg is hostile */
static int
hdr_parse(whdr *h, const uint8_t *p, size_t n, const char **why)
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

/* chunk table of a version at a chunk size */
typedef struct cref {
	int blob;
	uint64_t off;
	size_t len;
} cref;

static int
chunk_table(cref **out, size_t *nout, const rl_wver *v, size_t chunk)
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

static int
same_layout(const rl_wver *a, const rl_wver *b)
{
	if (a->nblobs != b->nblobs)
		return 0;
	for (int i = 0; i < a->nblobs; i++)
		if (a->blobs[i].size != b->blobs[i].size || strcmp(a->blobs[i].name, b->blobs[i].name) != 0)
			return 0;
	return 1;
}

static int
manifest_encode(uint8_t **out, size_t *outn, const rl_wver *v, uint32_t chunk, uint64_t delta_base)
{
	size_t n = 40, off;
	uint8_t *p;

	for (int i = 0; i < v->nblobs; i++)
		n += 2 + strlen(v->blobs[i].name) + 2 + 16 + 8 * npieces(v->blobs[i].size);
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
		size_t nl = strlen(b->name), np = npieces(b->size);
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

/* manifest_decode: a hostile manifest into a version with allocated (zeroed
 * if zero=1), unverified blobs and the expected hashes. */
static int
manifest_decode(rl_wver **out, uint32_t *chunk, uint64_t *delta_base, const uint8_t *p, size_t n, const char **why,
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
		np = npieces(size);
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
		if (blob_hash_from_pieces(b) != b->hash) {
			*why = "manifest blob hash does not match its piece hashes";
			rv = RL_ECHECKSUM;
			goto fail;
		}
	}
	if (version_hash(v) != v->hash) {
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

/* chunk body: u32 flags, u32 elem, u64 raw length, then the payload.  A
 * CHUNK request's b is the delta base the client holds (0 none); bit 63
 * asks for whole chunks stored, not compressed (fast links). */
#define CHUNK_STORED ((uint64_t)1 << 63)
#define CB_HDR 16
#define WAIT_LINEAGE ((uint64_t)1 << 63) /* WAIT: version = this | the client's lineage */
#define PUSH_REWIND 1                     /* PUSH_BEGIN a: drop the versions from this one up */

static atomic_int test_corrupt, test_slow_ms, test_corrupt_shm, test_slow_commit_ms;
void rl_wsync_test_corrupt(int n) { atomic_store(&test_corrupt, n); }

/* ---- server ---------------------------------------------------------------------- */
typedef struct enc {
	uint8_t *p;
	size_t n;
	uint32_t flags;
} enc;

/* a version as the server holds it; refcounted under the server mutex */
typedef struct sver {
	rl_wver *v;
	uint32_t chunk;
	size_t nchunks;
	cref *ch;
	enc *full, *delta;        /* per chunk, p NULL until made */
	uint64_t delta_base;      /* what `delta` is against; 0 none */
	struct sver *base;        /* push staging / lazy delta: the base version (ref held) */
	uint8_t *got;             /* staging: chunk received */
	size_t ngot;
	int refs;
	int shm_fd;               /* sealed memfd holding the version (wshm.h), -1 none */
	int writers;              /* staging: PUSH_CHUNKs decoding into v now */
	int taken;                /* staging: v's bytes came as the client's memfd (shm_take):
	                           * v is a read-only mapping, no chunk may be written */
	int rewind;               /* staging: a resumed trainer's push (PUSH_REWIND) */
} sver;

enum { SC_RECV, SC_WORK, SC_SEND, SC_PARKED };
typedef struct sctx {
	struct rl_wsync_server *s;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
	nng_msg *req;
	uint64_t wait_have;
	uint64_t wait_lin;        /* WAIT_LINEAGE | the client's lineage, or 0 (an older client) */
	double deadline;
	struct sctx *next;        /* work queue / parked list */
} sctx;

struct rl_wsync_server {
	nng_socket sock;
	rl_wsync_server_opts o;
	char *data_dir;
	char url[320];            /* listened on; a tcp:// port 0 replaced by the one chosen */
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* work queue */
	pthread_cond_t tcv;       /* timer: new version or close */
	sver *latest, *prev, *stage;
	uint64_t lineage;         /* the line the versions held belong to (rewinds so far) */
	uint64_t warned_lin;      /* 1 + the lineage an older client was warned about */
	uint64_t committing;      /* a PUSH_COMMIT of this version is saving/installing it */
	sctx *ctxs;
	int nctx;
	sctx *qhead, *qtail, *parked;
	pthread_t *workers, timer;
	int nworkers, timer_started;
	int closing;
	uint64_t n_req, n_chunks, bytes_out, n_bad_push, n_bad_req, n_bulk_chunks;
	/* bulk stream (bfd < 0: none): whole raw chunks written from the held version */
	int bfd;
	pthread_t bth;
	char bulk_url[320];
	struct bconn *bconns;     /* connections, finished ones until reaped */
	int nbconn;
	rl_wshm_srv *shm;         /* hands out the versions' memfds on this host; NULL none */
	char hostid[24];
};

static void
sver_unref_locked(sver *x)
{
	if (x == NULL || --x->refs > 0)
		return;
	for (size_t i = 0; x->full && i < x->nchunks; i++)
		free(x->full[i].p);
	for (size_t i = 0; x->delta && i < x->nchunks; i++)
		free(x->delta[i].p);
	free(x->full);
	free(x->delta);
	free(x->ch);
	free(x->got);
	if (x->shm_fd >= 0)
		close(x->shm_fd);
	sver_unref_locked(x->base);
	rl_wver_destroy(x->v);
	free(x);
}

static void
sver_unref(rl_wsync_server *s, sver *x)
{
	pthread_mutex_lock(&s->mu);
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
}

/* sver_make takes v (hashed) on success */
static int
sver_make(sver **out, rl_wver *v, uint32_t chunk)
{
	sver *x;
	int rv;

	if ((x = rl_try_calloc(1, sizeof *x, "version")) == NULL)
		return RL_ENOMEM;
	x->chunk = chunk;
	if ((rv = chunk_table(&x->ch, &x->nchunks, v, chunk)) != 0)
		goto fail;
	rv = RL_ENOMEM;
	if ((x->full = rl_try_calloc(x->nchunks + 1, sizeof(enc), "chunk table")) == NULL ||
	    (x->delta = rl_try_calloc(x->nchunks + 1, sizeof(enc), "chunk table")) == NULL)
		goto fail;
	x->v = v;
	v->chunk = chunk; /* persisted with the version: a restart keeps the chunk indices */
	x->refs = 1;
	x->shm_fd = -1;
	*out = x;
	return RL_OK;
fail:
	free(x->ch);
	free(x->full);
	free(x);
	return rv;
}

static nng_msg *
reply_new(uint16_t op, int status, uint64_t version, uint64_t a, uint64_t b, const void *body, size_t n)
{
	nng_msg *m;
	uint8_t h[WS_HDR];

	if (nng_msg_alloc(&m, 0) != 0)
		return NULL;
	hdr_fill(h, op | OP_REPLY, status, version, a, b);
	if (nng_msg_append(m, h, WS_HDR) != 0 || (n && nng_msg_append(m, body, n) != 0)) {
		nng_msg_free(m);
		return NULL;
	}
	return m;
}

static nng_msg *
reply_err(uint16_t op, int status, uint64_t version, const char *fmt, ...) RL_PRINTF(4, 5);
static nng_msg *
reply_err(uint16_t op, int status, uint64_t version, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	rl_verbose("request refused: %s", buf);
	return reply_new(op, status, version, 0, 0, buf, strlen(buf));
}

static uint64_t ver_of(const sver *x) { return x ? x->v->version : 0; }

static nng_msg *
do_status(rl_wsync_server *s)
{
	cJSON *j = cJSON_CreateObject(), *arr;
	sver *vs[2];
	char *txt;
	nng_msg *m;

	pthread_mutex_lock(&s->mu);
	vs[0] = s->latest;
	vs[1] = s->prev;
	cJSON_AddNumberToObject(j, "latest", (double)ver_of(s->latest));
	cJSON_AddNumberToObject(j, "previous", (double)ver_of(s->prev));
	cJSON_AddNumberToObject(j, "lineage", (double)s->lineage);
	arr = cJSON_AddArrayToObject(j, "versions");
	for (int i = 0; i < 2; i++) {
		cJSON *o;
		char hx[20];
		if (vs[i] == NULL)
			continue;
		o = cJSON_CreateObject();
		snprintf(hx, sizeof hx, "%016llx", (unsigned long long)vs[i]->v->hash);
		cJSON_AddNumberToObject(o, "version", (double)vs[i]->v->version);
		cJSON_AddStringToObject(o, "hash", hx);
		cJSON_AddNumberToObject(o, "bytes", (double)rl_wver_total(vs[i]->v));
		cJSON_AddNumberToObject(o, "blobs", vs[i]->v->nblobs);
		cJSON_AddNumberToObject(o, "chunks", (double)vs[i]->nchunks);
		cJSON_AddNumberToObject(o, "delta_base", (double)vs[i]->delta_base);
		cJSON_AddItemToArray(arr, o);
	}
	if (s->stage)
		cJSON_AddNumberToObject(j, "pushing", (double)s->stage->v->version);
	else
		cJSON_AddNullToObject(j, "pushing");
	cJSON_AddStringToObject(j, "data_dir", s->data_dir ? s->data_dir : "");
	cJSON_AddNumberToObject(j, "requests", (double)s->n_req);
	cJSON_AddNumberToObject(j, "chunks_served", (double)s->n_chunks);
	cJSON_AddNumberToObject(j, "bulk_chunks_served", (double)s->n_bulk_chunks);
	cJSON_AddStringToObject(j, "bulk", s->bfd >= 0 ? s->bulk_url : "");
	cJSON_AddStringToObject(j, "shm", s->shm ? rl_wshm_srv_name(s->shm) : "");
	cJSON_AddNumberToObject(j, "shm_served", s->shm ? (double)rl_wshm_srv_served(s->shm) : 0);
	cJSON_AddNumberToObject(j, "shm_pushes", s->shm ? (double)rl_wshm_srv_taken(s->shm) : 0);
	cJSON_AddNumberToObject(j, "bytes_served", (double)s->bytes_out);
	cJSON_AddNumberToObject(j, "push_chunks_rejected", (double)s->n_bad_push);
	cJSON_AddNumberToObject(j, "bad_requests", (double)s->n_bad_req);
	pthread_mutex_unlock(&s->mu);
	txt = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	m = txt ? reply_new(OP_STATUS, RL_OK, 0, 0, 0, txt, strlen(txt)) : NULL;
	free(txt);
	return m;
}

/* find a held version (ref taken) */
static sver *
sver_get(rl_wsync_server *s, uint64_t version)
{
	sver *x = NULL;

	pthread_mutex_lock(&s->mu);
	if (version == 0 || (s->latest && s->latest->v->version == version))
		x = s->latest;
	else if (s->prev && s->prev->v->version == version)
		x = s->prev;
	if (x)
		x->refs++;
	pthread_mutex_unlock(&s->mu);
	return x;
}

static nng_msg *
do_manifest(rl_wsync_server *s, const whdr *h)
{
	sver *x = sver_get(s, h->version);
	uint8_t *p = NULL;
	size_t n;
	nng_msg *m;
	uint64_t db, lin;

	if (x == NULL)
		return reply_err(OP_MANIFEST, RL_ENOENT, h->version, h->version ? "version %llu is not held (latest is %llu)" :
				 "no version published yet%.0llu", (unsigned long long)h->version,
				 (unsigned long long)rl_wsync_server_latest(s));
	/* a delta is offered when it was pushed as one or can be made from a held base */
	pthread_mutex_lock(&s->mu);
	db = x->delta_base;
	if (db == 0 && x->base)
		db = x->base->v->version;
	lin = x->v->lineage;
	pthread_mutex_unlock(&s->mu);
	if (manifest_encode(&p, &n, x->v, x->chunk, db) != 0)
		m = reply_err(OP_MANIFEST, RL_ENOMEM, h->version, "out of memory");
	else
		m = reply_new(OP_MANIFEST, RL_OK, x->v->version, lin, 0, p, n);
	free(p);
	sver_unref(s, x);
	return m;
}

/* the encoding of chunk i, made on first use */
static int
chunk_enc(rl_wsync_server *s, sver *x, size_t i, int delta, enc *out)
{
	enc *slot = delta ? &x->delta[i] : &x->full[i];
	const cref *c = &x->ch[i];
	const rl_wblob *b = &x->v->blobs[c->blob];
	sver *bx = NULL;
	enc e;
	int rv;

	pthread_mutex_lock(&s->mu);
	*out = *slot;
	if (out->p == NULL && delta && (bx = x->base) != NULL)
		bx->refs++;
	pthread_mutex_unlock(&s->mu);
	if (out->p)
		return RL_OK;
	if (delta && bx == NULL)
		return RL_ENOENT;
	rv = rl_wsync_encode(&e.p, &e.n, &e.flags, b->data + c->off, bx ? bx->v->blobs[c->blob].data + c->off : NULL,
			     c->len, b->elem, s->o.level);
	pthread_mutex_lock(&s->mu);
	sver_unref_locked(bx);
	if (rv == 0) {
		if (slot->p == NULL)
			*slot = e;
		else
			free(e.p);
		*out = *slot;
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

static nng_msg *
do_chunk(rl_wsync_server *s, const whdr *h)
{
	sver *x = sver_get(s, h->version);
	nng_msg *m = NULL;
	uint8_t cb[CB_HDR];
	int delta = 0, rv, stored = (int)(h->b >> 63);
	uint64_t want_base = h->b & ~CHUNK_STORED;
	enc e;

	if (x == NULL || h->version == 0)
		m = reply_err(OP_CHUNK, RL_ENOENT, h->version, "version %llu is not held (latest is %llu)",
			      (unsigned long long)h->version, (unsigned long long)rl_wsync_server_latest(s));
	else if (h->a >= x->nchunks)
		m = reply_err(OP_CHUNK, RL_EINVAL, h->version, "chunk %llu out of range (version has %zu)",
			      (unsigned long long)h->a, x->nchunks);
	if (m)
		goto out;
	pthread_mutex_lock(&s->mu);
	if (want_base != 0 && (want_base == x->delta_base || (x->base && want_base == x->base->v->version)))
		delta = 1;
	pthread_mutex_unlock(&s->mu);
	if (stored && !delta) {
		/* the raw bytes as one stored segment: no codec work either side */
		const cref *c = &x->ch[h->a];
		uint8_t sh[SEG_HDR] = { 0 };
		put32(cb, 0);
		put32(cb + 4, 1);
		put64(cb + 8, c->len);
		put32(sh, (uint32_t)c->len);
		if ((m = reply_new(OP_CHUNK, RL_OK, h->version, h->a, 0, cb, CB_HDR)) == NULL ||
		    nng_msg_append(m, sh, SEG_HDR) != 0 ||
		    nng_msg_append(m, x->v->blobs[c->blob].data + c->off, c->len) != 0) {
			if (m)
				nng_msg_free(m);
			m = NULL;
			goto out;
		}
		e.n = c->len + SEG_HDR;
		goto sent;
	}
	rv = chunk_enc(s, x, (size_t)h->a, delta, &e);
	if (rv == RL_ENOENT && delta) {
		delta = 0;
		rv = chunk_enc(s, x, (size_t)h->a, 0, &e);
	}
	if (rv != 0) {
		m = reply_err(OP_CHUNK, rv, h->version, "cannot encode chunk %llu: %s", (unsigned long long)h->a,
			      rl_strerror(rv));
		goto out;
	}
	put32(cb, e.flags);
	put32(cb + 4, (uint32_t)x->v->blobs[x->ch[h->a].blob].elem);
	put64(cb + 8, x->ch[h->a].len);
	if ((m = reply_new(OP_CHUNK, RL_OK, h->version, h->a, delta ? want_base : 0, cb, CB_HDR)) == NULL ||
	    nng_msg_append(m, e.p, e.n) != 0) {
		if (m)
			nng_msg_free(m);
		m = NULL;
		goto out;
	}
sent:
	if (atomic_load(&test_corrupt) > 0 && atomic_fetch_sub(&test_corrupt, 1) > 0 && e.n > SEG_HDR) {
		/* a byte of the first segment's payload (the data, when stored) */
		uint8_t *body = (uint8_t *)nng_msg_body(m) + WS_HDR + CB_HDR;
		size_t zn = get32(body);
		body[SEG_HDR + (zn ? zn / 2 : 0)] ^= 0x5a;
		rl_warn("test hook: corrupted chunk %llu of version %llu", (unsigned long long)h->a,
			(unsigned long long)h->version);
	}
	if (atomic_load(&test_slow_ms) > 0)
		usleep((useconds_t)atomic_load(&test_slow_ms) * 1000);
	pthread_mutex_lock(&s->mu);
	s->n_chunks++;
	s->bytes_out += e.n + CB_HDR;
	pthread_mutex_unlock(&s->mu);
out:
	if (x)
		sver_unref(s, x);
	return m;
}

static nng_msg *
do_push_begin(rl_wsync_server *s, const whdr *h)
{
	rl_wver *v = NULL;
	uint32_t chunk;
	uint64_t base;
	const char *why;
	sver *x = NULL, *old = NULL;
	int rv;

	if ((rv = manifest_decode(&v, &chunk, &base, h->body, h->bodyn, &why, 1, s->o.max_bytes)) != 0)
		return reply_err(OP_PUSH_BEGIN, rv, h->version, "%s", why);
	if (v->version == 0 || v->version != h->version) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "bad version number in push");
	}
	if ((h->a & PUSH_REWIND) && base) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_EINVAL, h->version, "a rewind to version %llu must be pushed whole",
				 (unsigned long long)h->version);
	}
	if ((size_t)chunk + 65536 > s->o.max_msg) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, RL_ETOOBIG, h->version,
				 "chunks of %u bytes do not fit this server's message limit of %zu bytes (use smaller chunks)",
				 chunk, s->o.max_msg);
	}
	if ((rv = sver_make(&x, v, chunk)) != 0) {
		rl_wver_destroy(v);
		return reply_err(OP_PUSH_BEGIN, rv, h->version, "cannot stage version: %s", rl_strerror(rv));
	}
	if ((x->got = rl_try_calloc(x->nchunks + 1, 1, "chunk bitmap")) == NULL) {
		sver_unref(s, x);
		return reply_err(OP_PUSH_BEGIN, RL_ENOMEM, h->version, "out of memory");
	}
	x->rewind = (h->a & PUSH_REWIND) != 0;
	pthread_mutex_lock(&s->mu);
	/* only a resumed trainer goes back (PUSH_REWIND): a second trainer's
	 * older version is refused */
	if (!x->rewind && s->latest && v->version <= s->latest->v->version) {
		uint64_t l = s->latest->v->version;
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_BEGIN, RL_ESTALE, h->version, "version %llu is not newer than the latest, %llu",
				 (unsigned long long)h->version, (unsigned long long)l);
	}
	if (base) {
		if (s->latest == NULL || s->latest->v->version != base || s->latest->v->hash != h->b ||
		    !same_layout(s->latest->v, v)) {
			sver_unref_locked(x);
			pthread_mutex_unlock(&s->mu);
			return reply_err(OP_PUSH_BEGIN, RL_ENOENT, h->version,
					 "delta base %llu is not the latest version with the same content and layout",
					 (unsigned long long)base);
		}
		x->base = s->latest;
		x->base->refs++;
		x->delta_base = base;
	}
	old = s->stage;
	s->stage = x;
	sver_unref_locked(old);
	pthread_mutex_unlock(&s->mu);
	rl_verbose("receiving version %llu (%zu chunks%s)", (unsigned long long)h->version, x->nchunks,
		   base ? ", delta" : x->rewind ? ", a rewind" : "");
	return reply_new(OP_PUSH_BEGIN, RL_OK, h->version, 0, 0, NULL, 0);
}

static nng_msg *
do_push_chunk(rl_wsync_server *s, const whdr *h)
{
	sver *x;
	const cref *c;
	const rl_wblob *b;
	const uint8_t *base = NULL;
	uint32_t flags;
	nng_msg *m = NULL;
	enc e = { 0 };
	int rv;

	sver *bx = NULL;

	pthread_mutex_lock(&s->mu);
	if ((x = s->stage) != NULL && x->v->version == h->version && !x->taken) {
		x->refs++;
		x->writers++;
		if ((bx = x->base) != NULL)
			bx->refs++;
	} else {
		x = NULL;
	}
	pthread_mutex_unlock(&s->mu);
	if (atomic_load(&test_slow_ms) > 0) /* test hook: a push slow enough to kill the server under it */
		usleep((useconds_t)atomic_load(&test_slow_ms) * 1000);
	if (x == NULL)
		return reply_err(OP_PUSH_CHUNK, RL_ENOENT, h->version, "no push of version %llu in progress "
				 "(or it came over shared memory)", (unsigned long long)h->version);
	if (h->a >= x->nchunks || h->bodyn < CB_HDR) {
		m = reply_err(OP_PUSH_CHUNK, RL_EFORMAT, h->version, "bad chunk %llu", (unsigned long long)h->a);
		goto out;
	}
	c = &x->ch[h->a];
	b = &x->v->blobs[c->blob];
	flags = get32(h->body);
	if (get64(h->body + 8) != c->len || get32(h->body + 4) != (uint32_t)b->elem ||
	    ((flags & RL_WENC_DELTA) && bx == NULL)) {
		m = reply_err(OP_PUSH_CHUNK, RL_EFORMAT, h->version, "chunk %llu: length, element size or delta flag "
			      "does not match the manifest", (unsigned long long)h->a);
		goto out;
	}
	if (flags & RL_WENC_DELTA)
		base = bx->v->blobs[c->blob].data + c->off;
	rv = decode_chunk(b->data + c->off, c->len, h->body + CB_HDR, h->bodyn - CB_HDR, flags, base, b->elem,
			  b->pieces + c->off / RL_WSYNC_PIECE);
	if (rv != 0) {
		pthread_mutex_lock(&s->mu);
		s->n_bad_push++;
		pthread_mutex_unlock(&s->mu);
		m = reply_err(OP_PUSH_CHUNK, RL_ECHECKSUM, h->version, "chunk %llu of version %llu failed its checksum",
			      (unsigned long long)h->a, (unsigned long long)h->version);
		goto out;
	}
	/* keep what came as the served encoding of this chunk; whole chunks
	 * pushed uncompressed are served from the data (compressed on demand) */
	e.n = h->bodyn - CB_HDR;
	e.flags = flags;
	if (flags != 0 && (e.p = malloc(e.n ? e.n : 1)) != NULL)
		memcpy(e.p, h->body + CB_HDR, e.n);
	pthread_mutex_lock(&s->mu);
	if (e.p) {
		enc *slot = (flags & RL_WENC_DELTA) ? &x->delta[h->a] : &x->full[h->a];
		if (slot->p == NULL) {
			*slot = e;
			e.p = NULL;
		}
	}
	if (!x->got[h->a]) {
		x->got[h->a] = 1;
		x->ngot++;
	}
	pthread_mutex_unlock(&s->mu);
	free(e.p);
	m = reply_new(OP_PUSH_CHUNK, RL_OK, h->version, h->a, 0, NULL, 0);
out:
	pthread_mutex_lock(&s->mu);
	x->writers--;
	sver_unref_locked(bx);
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	return m;
}

/* install x as latest (x's ref moves to the server); called without mu.
 * rewind: x replaces the held versions from its number up (a resumed
 * trainer's), and its lineage (x->v->lineage) becomes the server's. */
static void
install(rl_wsync_server *s, sver *x, int rewind)
{
	sver *drop = NULL, *drop2 = NULL;

	/* x is not visible yet: move its bytes into a sealed memfd that workers
	 * on this host map (the heap copy is freed, the bytes exist once) */
	if (s->o.shm >= 0 && x->shm_fd < 0) {
		int bad = atomic_load(&test_corrupt_shm) > 0;
		if (rl_wshm_make(&x->shm_fd, x->v, 1, bad) != 0)
			rl_warn("version %llu: no shared memory copy; workers on this host use the stream",
				(unsigned long long)x->v->version);
		else if (bad)
			atomic_fetch_sub(&test_corrupt_shm, 1);
	}
	pthread_mutex_lock(&s->mu);
	if (rewind) {
		/* the previous version stays only if it is below x: the line up to
		 * x is the trainer's still */
		drop = s->latest;
		if (s->prev && (!s->o.keep_previous || s->prev->v->version >= x->v->version)) {
			drop2 = s->prev;
			s->prev = NULL;
		}
		if (s->prev && s->prev->base) {
			sver_unref_locked(s->prev->base);
			s->prev->base = NULL;
		}
		if (x->base == NULL && s->prev && same_layout(s->prev->v, x->v)) {
			x->base = s->prev;
			x->base->refs++;
		}
		s->lineage = x->v->lineage;
	} else if (s->o.keep_previous) {
		drop = s->prev;
		s->prev = s->latest;
		if (s->prev && s->prev->base) {
			sver_unref_locked(s->prev->base);
			s->prev->base = NULL;
		}
		/* a kept previous version lets the server make deltas against it */
		if (x->base == NULL && s->prev && same_layout(s->prev->v, x->v)) {
			x->base = s->prev;
			x->base->refs++;
		}
	} else {
		drop = s->latest;
		/* the pushed delta encodings stay; the base data is no longer needed */
		if (x->base) {
			sver_unref_locked(x->base);
			x->base = NULL;
		}
	}
	s->latest = x;
	sver_unref_locked(drop);
	sver_unref_locked(drop2);
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
}

static int
persist(rl_wsync_server *s, const rl_wver *v, int rewind)
{
	uint64_t lin;
	int rv, keep = s->o.keep_previous ? 2 : 1;

	if (s->data_dir == NULL)
		return RL_OK;
	rv = rewind ? rl_wdir_rewind_ver(s->data_dir, v, keep, &lin) : rl_wdir_publish_ver(s->data_dir, v, keep);
	if (rv != 0)
		rl_error("cannot save version %llu in '%s': %s", (unsigned long long)v->version, s->data_dir,
			 rl_strerror(rv));
	return rv;
}

static nng_msg *
do_push_commit(rl_wsync_server *s, const whdr *h)
{
	sver *x;
	uint64_t from, lin;
	int rv, rewind;

	pthread_mutex_lock(&s->mu);
	/* the same commit again while the first one saves the version: nng's
	 * REQ re-sends a request after a reconnect, and the copy found no push
	 * in progress (RL_ENOENT); the client then pushed the version again and
	 * was refused as not newer than itself.  It waits for the first's outcome */
	while (s->committing == h->version && !s->closing)
		pthread_cond_wait(&s->tcv, &s->mu);
	x = s->stage;
	if (x == NULL || x->v->version != h->version) {
		uint64_t l = ver_of(s->latest), lin = s->lineage;
		pthread_mutex_unlock(&s->mu);
		if (l == h->version) /* a re-sent commit */
			return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, 0, NULL, 0);
		return reply_err(OP_PUSH_COMMIT, RL_ENOENT, h->version, "no push of version %llu in progress",
				 (unsigned long long)h->version);
	}
	if (x->ngot != x->nchunks) {
		size_t got = x->ngot;
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_COMMIT, RL_EINVAL, h->version, "version %llu incomplete: %zu of %zu chunks",
				 (unsigned long long)h->version, got, x->nchunks);
	}
	s->stage = NULL; /* our reference now */
	/* a rewind drops what is held from its number up; the same version
	 * again (the trainer resumed from the latest) changes nothing, and one
	 * above the latest is an ordinary push */
	if (x->rewind && s->latest && s->latest->v->version == x->v->version && s->latest->v->hash == x->v->hash) {
		uint64_t lin = s->lineage;
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		rl_info("rewind to version %llu: held already", (unsigned long long)h->version);
		return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, 0, NULL, 0);
	}
	rewind = x->rewind && s->latest && s->latest->v->version >= x->v->version;
	from = ver_of(s->latest);
	x->v->lineage = s->lineage + (rewind ? 1 : 0);
	s->committing = h->version;
	pthread_mutex_unlock(&s->mu);
	free(x->got);
	x->got = NULL;
	if (atomic_load(&test_slow_commit_ms) > 0) /* test hook: a commit slow to save */
		usleep((useconds_t)atomic_load(&test_slow_commit_ms) * 1000);
	/* every piece was verified as it arrived; the blob and version hashes
	 * were checked against the pieces when the manifest was decoded */
	if ((rv = persist(s, x->v, rewind)) != 0) {
		pthread_mutex_lock(&s->mu);
		s->committing = 0;
		pthread_cond_broadcast(&s->tcv);
		sver_unref_locked(x);
		pthread_mutex_unlock(&s->mu);
		return reply_err(OP_PUSH_COMMIT, rv, h->version, "cannot save version %llu: %s",
				 (unsigned long long)h->version, rl_strerror(rv));
	}
	lin = x->v->lineage;
	install(s, x, rewind);
	pthread_mutex_lock(&s->mu);
	s->committing = 0;
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
	if (rewind)
		rl_info("rewound from version %llu to %llu (a resumed trainer's; line %llu): %llu bytes, %d blobs",
			(unsigned long long)from, (unsigned long long)h->version, (unsigned long long)lin,
			(unsigned long long)rl_wver_total(x->v), x->v->nblobs);
	else
		rl_info("published version %llu (%llu bytes, %d blobs)", (unsigned long long)h->version,
			(unsigned long long)rl_wver_total(x->v), x->v->nblobs);
	return reply_new(OP_PUSH_COMMIT, RL_OK, h->version, lin, 0, NULL, 0);
}

/* ---- server: bulk stream ------------------------------------------------------------
 * A plain socket listener (TCP or a Unix socket) and one thread per
 * connection, capped: read a request, write each chunk of its range as a
 * header plus the chunk's bytes straight from the held version with one
 * blocking sendmsg (no copy in user space, and the kernel does the waiting:
 * nng's message layer copies every reply, and its non-blocking streams cost
 * a poller wake-up and a task hand-off per socket buffer), then read the
 * next request.  The version is referenced while its range is sent.  A
 * malformed request gets an error header and the connection is closed. */
#define WB_IO_MS 60000 /* a stalled peer loses its connection after this long */

typedef struct bconn {
	rl_wsync_server *s;
	int fd;
	pthread_t th;
	atomic_int done;
	struct bconn *link;
} bconn;

static void
bulk_hdr(uint8_t *p, int32_t status, uint64_t version, uint64_t index, uint64_t len)
{
	put32(p, WB_MAGIC);
	put16(p + 4, WB_PROTO);
	put16(p + 6, WB_GET | OP_REPLY);
	put32(p + 8, WB_HDR);
	put32(p + 12, (uint32_t)status);
	put64(p + 16, version);
	put64(p + 24, index);
	put64(p + 32, len);
	put64(p + 40, 0);
}

/* all of (a, an) then (b, bn) on a blocking socket; 0 or -1 */
static int
sock_send2(int fd, const void *a, size_t an, const void *b, size_t bn)
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
static int
sock_recv(int fd, void *p, size_t n)
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

static void
sock_timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
	int one = 1;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on Unix sockets */
}

/* an error reply: header and text; the caller then closes */
static void
bulk_refuse(int fd, int status, uint64_t version, const char *fmt, ...) RL_PRINTF(4, 5);
static void
bulk_refuse(int fd, int status, uint64_t version, const char *fmt, ...)
{
	char msg[256];
	uint8_t h[WB_HDR];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	rl_verbose("bulk request refused: %s", msg);
	bulk_hdr(h, status, version, 0, strlen(msg));
	sock_send2(fd, h, WB_HDR, msg, strlen(msg));
}

/* one request (it is hostile): 0 to read the next, -1 to close */
static int
bulk_serve_one(rl_wsync_server *s, int fd, const uint8_t *r)
{
	uint64_t version = get64(r + 16), first = get64(r + 24), count = get64(r + 32);
	sver *x;
	int rv = 0;

	if (get32(r) != WB_MAGIC) {
		bulk_refuse(fd, RL_EFORMAT, 0, "bad magic (not an rl-sync bulk request)");
		return -1;
	}
	if (get16(r + 4) != WB_PROTO) {
		bulk_refuse(fd, RL_EVERSION, 0, "unsupported rl-sync bulk protocol version");
		return -1;
	}
	if (get16(r + 6) != WB_GET || get32(r + 8) != WB_HDR) {
		bulk_refuse(fd, RL_EFORMAT, 0, "bad bulk request (operation or header length)");
		return -1;
	}
	if (version == 0 || (x = sver_get(s, version)) == NULL) {
		bulk_refuse(fd, RL_ENOENT, version, "version %llu is not held (latest is %llu)",
			    (unsigned long long)version, (unsigned long long)rl_wsync_server_latest(s));
		return -1;
	}
	if (count == 0 || first >= x->nchunks || count > x->nchunks - first) {
		bulk_refuse(fd, RL_EINVAL, version, "chunks %llu+%llu out of range (version has %zu)",
			    (unsigned long long)first, (unsigned long long)count, x->nchunks);
		sver_unref(s, x);
		return -1;
	}
	for (uint64_t i = first; i < first + count && rv == 0; i++) {
		const cref *c = &x->ch[i];
		const uint8_t *p = x->v->blobs[c->blob].data + c->off;
		uint8_t h[WB_HDR], *bad = NULL;
		int ms;
		bulk_hdr(h, RL_OK, version, i, c->len);
		if (c->len > 0 && atomic_load(&test_corrupt) > 0 && atomic_fetch_sub(&test_corrupt, 1) > 0 &&
		    (bad = malloc(c->len)) != NULL) {
			memcpy(bad, p, c->len);
			bad[c->len / 2] ^= 0x5a;
			p = bad;
			rl_warn("test hook: corrupted chunk %llu of version %llu", (unsigned long long)i,
				(unsigned long long)version);
		}
		if ((ms = atomic_load(&test_slow_ms)) > 0)
			usleep((useconds_t)ms * 1000);
		rv = sock_send2(fd, h, WB_HDR, p, c->len);
		free(bad);
		pthread_mutex_lock(&s->mu);
		s->n_chunks++;
		s->n_bulk_chunks++;
		s->bytes_out += c->len + WB_HDR;
		pthread_mutex_unlock(&s->mu);
	}
	sver_unref(s, x);
	return rv;
}

static void *
bconn_main(void *arg)
{
	bconn *b = arg;
	uint8_t req[WB_HDR];

	/* requests may be far apart (an idle worker keeps its connection);
	 * a reply that cannot be written for WB_IO_MS ends the connection */
	{
		struct timeval tv = { .tv_sec = WB_IO_MS / 1000 };
		int one = 1;
		setsockopt(b->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		setsockopt(b->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	while (sock_recv(b->fd, req, WB_HDR) == 0 && bulk_serve_one(b->s, b->fd, req) == 0)
		;
	shutdown(b->fd, SHUT_RDWR);
	atomic_store(&b->done, 1);
	return NULL;
}

/* join and free finished connections (all of them when closing, after
 * shutting their sockets down) */
static void
bulk_reap(rl_wsync_server *s, int all)
{
	bconn *dead = NULL, **pp;

	pthread_mutex_lock(&s->mu);
	for (pp = &s->bconns; *pp;) {
		bconn *b = *pp;
		if (all || atomic_load(&b->done)) {
			*pp = b->link;
			b->link = dead;
			dead = b;
			s->nbconn--;
		} else {
			pp = &b->link;
		}
	}
	pthread_mutex_unlock(&s->mu);
	while (dead) {
		bconn *b = dead;
		dead = b->link;
		shutdown(b->fd, SHUT_RDWR);
		pthread_join(b->th, NULL);
		close(b->fd);
		free(b);
	}
}

static void *
bulk_accept_main(void *arg)
{
	rl_wsync_server *s = arg;

	for (;;) {
		int fd = accept4(s->bfd, NULL, NULL, SOCK_CLOEXEC), closing;
		bconn *b = NULL;
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			pthread_mutex_lock(&s->mu);
			closing = s->closing;
			pthread_mutex_unlock(&s->mu);
			if (closing)
				break;
			usleep(10000); /* EMFILE and the like: do not spin */
			continue;
		}
		bulk_reap(s, 0);
		pthread_mutex_lock(&s->mu);
		closing = s->closing;
		if (!closing && s->nbconn < WB_MAX_CONNS && (b = calloc(1, sizeof *b)) != NULL) {
			b->s = s;
			b->fd = fd;
			if (pthread_create(&b->th, NULL, bconn_main, b) != 0) {
				free(b);
				b = NULL;
			} else {
				b->link = s->bconns;
				s->bconns = b;
				s->nbconn++;
			}
		}
		pthread_mutex_unlock(&s->mu);
		if (b == NULL)
			close(fd); /* the client falls back to REQ/REP */
		if (closing)
			break;
	}
	return NULL;
}

/* a listening socket for the bulk stream next to a REQ/REP URL: tcp -> the
 * same host, an ephemeral port (clients are told it); ipc -> the path plus
 * ".bulk"; anything else -> none.  *url gets what clients are told. */
static int
bulk_listen(char *url, size_t n, const char *rep_url)
{
	nng_url *u = NULL;
	int fd = -1;

	if (strncmp(rep_url, "ipc://", 6) == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s.bulk", rep_url + 6) >= (int)sizeof sa.sun_path ||
		    snprintf(url, n, "ipc://%s", sa.sun_path) >= (int)n)
			return -1;
		struct stat st;
		/* a stale socket of ours (the REP listener on the path itself
		 * succeeded, so no live server uses it); never anything else */
		if (lstat(sa.sun_path, &st) == 0 && S_ISSOCK(st.st_mode))
			unlink(sa.sun_path);
		if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || bind(fd, (void *)&sa, sizeof sa) != 0 ||
		    listen(fd, 64) != 0)
			goto fail;
		return fd;
	}
	if (nng_url_parse(&u, rep_url) != 0)
		return -1;
	if (strcmp(u->u_scheme, "tcp") == 0 || strcmp(u->u_scheme, "tcp4") == 0 || strcmp(u->u_scheme, "tcp6") == 0) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int one = 1, port;
		hints.ai_family = strcmp(u->u_scheme, "tcp4") == 0 ? AF_INET : strcmp(u->u_scheme, "tcp6") == 0 ? AF_INET6
														: AF_UNSPEC;
		const char *host = u->u_hostname[0] && strcmp(u->u_hostname, "*") != 0 ? u->u_hostname : NULL;
		if (getaddrinfo(host, "0", &hints, &ai) != 0)
			goto fail;
		if ((fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
		    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0 ||
		    getsockname(fd, (void *)&ss, &sl) != 0) {
			freeaddrinfo(ai);
			goto fail;
		}
		freeaddrinfo(ai);
		port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						      : ((struct sockaddr_in *)&ss)->sin_port);
		snprintf(url, n, strchr(u->u_hostname, ':') ? "%s://[%s]:%d" : "%s://%s:%d", u->u_scheme,
			 u->u_hostname, port);
		nng_url_free(u);
		return fd;
	}
fail:
	if (fd >= 0)
		close(fd);
	nng_url_free(u);
	return -1;
}

/* start the bulk stream; failing to is not fatal (clients use REQ/REP) */
static void
bulk_open(rl_wsync_server *s, const char *url)
{
	s->bfd = -1;
	if (s->o.bulk < 0)
		return;
	if ((s->bfd = bulk_listen(s->bulk_url, sizeof s->bulk_url, url)) < 0) {
		if (strncmp(url, "tcp", 3) == 0 || strncmp(url, "ipc://", 6) == 0)
			rl_warn("no bulk stream next to '%s': %s (whole chunks go over REQ/REP)", url, strerror(errno));
		return;
	}
	if (pthread_create(&s->bth, NULL, bulk_accept_main, s) != 0) {
		close(s->bfd);
		s->bfd = -1;
		return;
	}
	rl_verbose("bulk stream on %s", s->bulk_url);
}

static void
bulk_close(rl_wsync_server *s)
{
	if (s->bfd < 0)
		return;
	shutdown(s->bfd, SHUT_RDWR); /* wakes the accept */
	pthread_join(s->bth, NULL);
	close(s->bfd);
	s->bfd = -1;
	bulk_reap(s, 1);
	if (strncmp(s->bulk_url, "ipc://", 6) == 0)
		unlink(s->bulk_url + 6);
}

/* the shm service's lookup: a dup of the held version's memfd */
static int
shm_lookup(void *arg, uint64_t version, int *fd, uint64_t *got, uint64_t *size)
{
	rl_wsync_server *s = arg;
	sver *x = NULL;
	int rv = RL_ENOENT;

	pthread_mutex_lock(&s->mu);
	if (version == 0 || (s->latest && s->latest->v->version == version))
		x = s->latest;
	else if (s->prev && s->prev->v->version == version)
		x = s->prev;
	if (x && x->shm_fd < 0)
		rv = RL_ENOTSUP;
	else if (x && (*fd = fcntl(x->shm_fd, F_DUPFD_CLOEXEC, 0)) < 0)
		rv = RL_EIO;
	else if (x) {
		*got = x->v->version;
		*size = rl_wshm_size(x->v);
		rv = RL_OK;
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

/* the shm service's taker: a trainer on this host hands over its sealed
 * memfd of the version it is pushing (after PUSH_BEGIN; PUSH_COMMIT
 * follows).  The staged version's blobs are pointed into a read-only
 * mapping of it and every piece is checked against the manifest, as pushed
 * chunks are; the memfd then is the one the server serves (no copy). */
static int
shm_take(void *arg, uint64_t version, int fd, uint64_t *size)
{
	rl_wsync_server *s = arg;
	sver *x;
	uint8_t **old = NULL;
	int rv, oldb;

	pthread_mutex_lock(&s->mu);
	if ((x = s->stage) == NULL || x->v->version != version) {
		pthread_mutex_unlock(&s->mu);
		rl_verbose("shared memory push of version %llu: no such push in progress", (unsigned long long)version);
		return RL_ENOENT;
	}
	if (x->taken || x->writers > 0 || x->ngot > 0) {
		/* chunks are coming the other way: the two must not mix */
		pthread_mutex_unlock(&s->mu);
		return RL_EINVAL;
	}
	x->taken = 1; /* no PUSH_CHUNK writes into v from now on */
	x->refs++;
	pthread_mutex_unlock(&s->mu);
	*size = rl_wshm_size(x->v);
	oldb = x->v->borrowed;
	if ((old = rl_try_calloc((size_t)x->v->nblobs + 1, sizeof *old, "blob table")) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < x->v->nblobs; i++)
		old[i] = x->v->blobs[i].data;
	if ((rv = rl_wshm_map(x->v, fd)) != 0)
		goto fail;
	if ((rv = rl_wver_verify(x->v)) != 0) {
		rl_warn("version %llu: the pushed shared memory object does not match its checksums",
			(unsigned long long)version);
		goto fail;
	}
	if ((x->shm_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		rv = RL_EIO;
		goto fail;
	}
	for (int i = 0; i < x->v->nblobs; i++)
		if (oldb != 1)
			free(old[i]);
	free(old);
	pthread_mutex_lock(&s->mu);
	memset(x->got, 1, x->nchunks);
	x->ngot = x->nchunks;
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	rl_verbose("version %llu: taken from the pusher's shared memory", (unsigned long long)version);
	return RL_OK;
fail:
	if (x->v->map) {
		munmap(x->v->map, x->v->mapn);
		x->v->map = NULL;
		x->v->mapn = 0;
		for (int i = 0; old && i < x->v->nblobs; i++)
			x->v->blobs[i].data = old[i];
		x->v->borrowed = oldb;
	}
	free(old);
	pthread_mutex_lock(&s->mu);
	if (rv == RL_ECHECKSUM)
		s->n_bad_push++;
	x->taken = 0; /* the client may still send the chunks */
	sver_unref_locked(x);
	pthread_mutex_unlock(&s->mu);
	return rv;
}

/* OP_SHM: this host's id and the abstract socket that hands out memfds,
 * as "HOSTID NAME" */
static nng_msg *
do_shm(rl_wsync_server *s)
{
	char b[160];
	int n;

	if (s->shm == NULL)
		return reply_err(OP_SHM, RL_ENOTSUP, 0, "this server has no shared memory service");
	n = snprintf(b, sizeof b, "%s %s", s->hostid, rl_wshm_srv_name(s->shm));
	return reply_new(OP_SHM, RL_OK, 0, 0, 0, b, (size_t)n);
}

/* OP_DATA: where the bulk stream is; a = its tcp port (0 for ipc),
 * body = its URL as the server sees it */
static nng_msg *
do_data(rl_wsync_server *s)
{
	const char *p;
	int port = 0;

	if (s->bfd < 0)
		return reply_err(OP_DATA, RL_ENOTSUP, 0, "this server has no bulk stream");
	if (strncmp(s->bulk_url, "ipc://", 6) != 0 && (p = strrchr(s->bulk_url, ':')) != NULL)
		port = atoi(p + 1);
	return reply_new(OP_DATA, RL_OK, 0, (uint64_t)port, 0, s->bulk_url, strlen(s->bulk_url));
}

static void
ctx_send(sctx *c, nng_msg *m)
{
	c->state = SC_SEND;
	nng_aio_set_msg(c->aio, m);
	nng_ctx_send(c->ctx, c->aio);
}

static void
ctx_recv(sctx *c)
{
	c->state = SC_RECV;
	nng_ctx_recv(c->ctx, c->aio);
}

/* a lineage-aware WAIT (version = WAIT_LINEAGE | lineage) whose client is
 * on another line than the server's latest version: answered at once */
static int
wait_moved(const rl_wsync_server *s, uint64_t v)
{
	return (v & WAIT_LINEAGE) && s->latest && (v & ~WAIT_LINEAGE) != s->lineage;
}

/* handle one request; NULL reply with c parked for a long-poll */
static nng_msg *
handle(rl_wsync_server *s, sctx *c, nng_msg *req, int *parked)
{
	whdr h;
	const char *why;
	int rv;

	pthread_mutex_lock(&s->mu);
	s->n_req++;
	pthread_mutex_unlock(&s->mu);
	if ((rv = hdr_parse(&h, nng_msg_body(req), nng_msg_len(req), &why)) != 0) {
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		return reply_err(0, rv, 0, "%s", why);
	}
	switch (h.op) {
	case OP_STATUS:
		return do_status(s);
	case OP_WAIT:
		pthread_mutex_lock(&s->mu);
		if (ver_of(s->latest) > h.a || s->closing || wait_moved(s, h.version)) {
			uint64_t l = ver_of(s->latest), lin = s->lineage;
			pthread_mutex_unlock(&s->mu);
			return reply_new(OP_WAIT, RL_OK, l, lin, 0, NULL, 0);
		}
		if (!(h.version & WAIT_LINEAGE) && s->lineage > 0 && h.a > ver_of(s->latest) &&
		    s->warned_lin != s->lineage + 1) {
			/* an rl-sync client from before rewinds: it cannot be told */
			s->warned_lin = s->lineage + 1;
			rl_warn("a worker waits for a version above %llu, which a rewind discarded (latest is %llu); "
				"it is too old to be told and keeps its weights until the trainer passes %llu",
				(unsigned long long)h.a, (unsigned long long)ver_of(s->latest), (unsigned long long)h.a);
			rl_hint("upgrade or restart that worker");
		}
		c->wait_have = h.a;
		c->wait_lin = h.version;
		c->deadline = rl_now() + (double)RL_MIN(h.b, (uint64_t)WS_WAIT_MAX_MS) / 1e3;
		c->state = SC_PARKED;
		c->next = s->parked;
		s->parked = c;
		*parked = 1; /* from here on the timer thread owns c */
		pthread_cond_broadcast(&s->tcv);
		pthread_mutex_unlock(&s->mu);
		return NULL;
	case OP_MANIFEST:
		return do_manifest(s, &h);
	case OP_CHUNK:
		return do_chunk(s, &h);
	case OP_PUSH_BEGIN:
		return do_push_begin(s, &h);
	case OP_PUSH_CHUNK:
		return do_push_chunk(s, &h);
	case OP_PUSH_COMMIT:
		return do_push_commit(s, &h);
	case OP_DATA:
		return do_data(s);
	case OP_SHM:
		return do_shm(s);
	default:
		pthread_mutex_lock(&s->mu);
		s->n_bad_req++;
		pthread_mutex_unlock(&s->mu);
		return reply_err(h.op, RL_EINVAL, 0, "unknown operation %u", h.op);
	}
}

static void
ctx_cb(void *arg)
{
	sctx *c = arg;
	rl_wsync_server *s = c->s;
	int r = nng_aio_result(c->aio);

	if (c->state == SC_SEND) {
		if (r != 0)
			nng_msg_free(nng_aio_get_msg(c->aio));
		if (r == NNG_ECLOSED)
			return;
		ctx_recv(c);
		return;
	}
	if (r != 0) {
		if (r == NNG_ECLOSED || r == NNG_ECANCELED)
			return;
		ctx_recv(c);
		return;
	}
	c->req = nng_aio_get_msg(c->aio);
	pthread_mutex_lock(&s->mu);
	c->state = SC_WORK;
	c->next = NULL;
	if (s->qtail)
		s->qtail->next = c;
	else
		s->qhead = c;
	s->qtail = c;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void *
worker_main(void *arg)
{
	rl_wsync_server *s = arg;

	for (;;) {
		sctx *c;
		nng_msg *rep, *req;
		int parked;

		pthread_mutex_lock(&s->mu);
		while (s->qhead == NULL && !s->closing)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->closing) {
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		c = s->qhead;
		if ((s->qhead = c->next) == NULL)
			s->qtail = NULL;
		pthread_mutex_unlock(&s->mu);
		req = c->req;
		c->req = NULL;
		parked = 0;
		rep = handle(s, c, req, &parked);
		nng_msg_free(req);
		if (rep)
			ctx_send(c, rep);
		else if (!parked)
			ctx_recv(c); /* no memory for a reply: the client times out and retries */
	}
}

/* answers parked long-polls when a version arrives or their time is up */
static void *
timer_main(void *arg)
{
	rl_wsync_server *s = arg;

	pthread_mutex_lock(&s->mu);
	while (!s->closing) {
		struct timespec ts;
		sctx **pp = &s->parked, *ready = NULL;
		double now = rl_now();
		uint64_t l = ver_of(s->latest), lin = s->lineage;

		while (*pp) {
			sctx *c = *pp;
			if (l > c->wait_have || wait_moved(s, c->wait_lin) || now >= c->deadline) {
				*pp = c->next;
				c->next = ready;
				ready = c;
			} else {
				pp = &c->next;
			}
		}
		pthread_mutex_unlock(&s->mu);
		while (ready) {
			sctx *c = ready;
			nng_msg *m;
			ready = c->next;
			m = reply_new(OP_WAIT, l > c->wait_have || wait_moved(s, c->wait_lin) ? RL_OK : RL_ETIMEDOUT, l,
				      lin, 0, NULL, 0);
			if (m)
				ctx_send(c, m);
			else
				ctx_recv(c);
		}
		pthread_mutex_lock(&s->mu);
		if (s->closing)
			break;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (ver_of(s->latest) == l && s->lineage == lin)
			pthread_cond_timedwait(&s->tcv, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

uint64_t
rl_wsync_server_latest(rl_wsync_server *s)
{
	uint64_t l;

	pthread_mutex_lock(&s->mu);
	l = ver_of(s->latest);
	pthread_mutex_unlock(&s->mu);
	return l;
}

int
rl_wsync_server_publish(rl_wsync_server *s, rl_wver *v)
{
	sver *x;
	uint64_t l = rl_wsync_server_latest(s);
	int rv;

	if (v->version <= l) {
		rl_error("version %llu is not newer than the latest, %llu", (unsigned long long)v->version,
			 (unsigned long long)l);
		return RL_ESTALE;
	}
	if ((rv = rl_wver_hash(v)) != 0 || (rv = sver_make(&x, v, RL_WSYNC_CHUNK_DEFAULT)) != 0)
		return rv;
	v->lineage = s->lineage;
	if ((rv = persist(s, v, 0)) != 0) {
		x->v = NULL;
		sver_unref(s, x);
		return rv;
	}
	install(s, x, 0);
	return RL_OK;
}

/* Loads one stored version and installs it (verified against rlsync.json). */
static int
load_one(rl_wsync_server *s, uint64_t ver, const char *path)
{
	rl_wver *v = NULL;
	sver *x;
	uint32_t ck;
	int rv;

	if ((rv = rl_wver_read_dir(&v, path, 0)) != 0) {
		rl_error("cannot load version %llu from '%s': %s", (unsigned long long)ver, path, rl_strerror(rv));
		return rv;
	}
	ck = v->chunk;
	if (ck < RL_WSYNC_PIECE || ck > RL_WSYNC_CHUNK_MAX || ck % RL_WSYNC_PIECE)
		ck = RL_WSYNC_CHUNK_DEFAULT;
	if ((rv = sver_make(&x, v, ck)) != 0) {
		rl_wver_destroy(v);
		return rv;
	}
	s->lineage = v->lineage; /* the latest is loaded last: its line is the server's */
	install(s, x, 0);
	rl_info("serving version %llu from '%s'", (unsigned long long)ver, path);
	return RL_OK;
}

static int
server_load(rl_wsync_server *s)
{
	uint64_t ver, prev;
	char path[4096], ppath[4096];
	int rv;

	if ((rv = rl_wdir_latest(s->data_dir, &ver, path, sizeof path)) == RL_ENOENT)
		return RL_OK;
	if (rv != 0)
		return rv;
	/* --keep-previous: the version before is on disk too (persist keeps
	 * two); installed first, it becomes the held previous and the base
	 * for deltas, as before the restart.  It is optional: one that cannot
	 * be read is left out with a warning. */
	if (s->o.keep_previous && rl_wdir_before(s->data_dir, ver, &prev, ppath, sizeof ppath) == RL_OK &&
	    load_one(s, prev, ppath) != RL_OK)
		rl_warn("not holding version %llu as the previous one", (unsigned long long)prev);
	return load_one(s, ver, path);
}

void
rl_wsync_server_close(rl_wsync_server *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	s->closing = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_cond_broadcast(&s->tcv);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < s->nworkers; i++)
		pthread_join(s->workers[i], NULL);
	if (s->timer_started)
		pthread_join(s->timer, NULL);
	rl_wshm_srv_close(s->shm);
	s->shm = NULL;
	bulk_close(s);
	if (!rli_nng_close_timed(s->sock, "rl-sync server socket")) {
		/* nng #1543: its contexts' callbacks may still run and use s; the
		 * listener is closed, so a new server can take the address */
		rl_warn("the server socket did not close (nng bug #1543); its memory is left");
		return;
	}
	for (int i = 0; i < s->nctx; i++) {
		if (s->ctxs[i].aio) {
			nng_aio_stop(s->ctxs[i].aio);
			nng_aio_free(s->ctxs[i].aio);
		}
		if (s->ctxs[i].req)
			nng_msg_free(s->ctxs[i].req);
	}
	sver_unref_locked(s->stage);
	sver_unref_locked(s->prev);
	sver_unref_locked(s->latest);
	free(s->ctxs);
	free(s->workers);
	free(s->data_dir);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->tcv);
	free(s);
}

/* half the machine's memory: what one version may claim in a manifest */
static uint64_t
default_max_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : (uint64_t)1 << 34;
}

static int
nng_err(int r, const char *what, const char *url)
{
	rl_error("%s '%s': %s", what, url, nng_strerror(r));
	if (r == NNG_EADDRINUSE)
		rl_hint("another process listens there; pick another port with --listen");
	return r == NNG_ENOMEM ? RL_ENOMEM : r == NNG_EADDRINVAL || r == NNG_ENOTSUP ? RL_EINVAL : RL_ENET;
}

int
rl_wsync_server_open(rl_wsync_server **out, const rl_wsync_server_opts *o)
{
	rl_wsync_server *s;
	const char *url = o->listen ? o->listen : "tcp://127.0.0.1:7401";
	int rv, r;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "server")) == NULL)
		return RL_ENOMEM;
	s->o = *o;
	s->o.contexts = o->contexts > 0 ? o->contexts : 64;
	s->o.threads = o->threads > 0 ? o->threads : 4;
	s->o.max_msg = o->max_msg ? o->max_msg : RL_WSYNC_CHUNK_MAX + 65536;
	s->o.level = o->level ? o->level : 1;
	s->o.max_bytes = o->max_bytes ? o->max_bytes : default_max_bytes();
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->tcv, NULL);
	s->sock = (nng_socket)NNG_SOCKET_INITIALIZER;
	s->bfd = -1;
	if (getenv("RL_WSYNC_TEST_CORRUPT"))
		rl_wsync_test_corrupt(atoi(getenv("RL_WSYNC_TEST_CORRUPT")));
	if (getenv("RL_WSYNC_TEST_CORRUPT_SHM"))
		atomic_store(&test_corrupt_shm, atoi(getenv("RL_WSYNC_TEST_CORRUPT_SHM")));
	if (getenv("RL_WSYNC_TEST_SLOW_MS"))
		atomic_store(&test_slow_ms, atoi(getenv("RL_WSYNC_TEST_SLOW_MS")));
	if (getenv("RL_WSYNC_TEST_SLOW_COMMIT_MS"))
		atomic_store(&test_slow_commit_ms, atoi(getenv("RL_WSYNC_TEST_SLOW_COMMIT_MS")));
	if (o->data_dir) {
		s->data_dir = rl_xstrdup(o->data_dir);
		if ((rv = server_load(s)) != 0)
			goto fail;
	}
	if ((r = nng_rep0_open(&s->sock)) != 0) {
		rv = nng_err(r, "cannot open socket for", url);
		goto fail;
	}
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, s->o.max_msg);
	if ((rv = rli_url_port_check_listen(url)) != 0)
		goto fail;
	{
		nng_listener l;
		nng_sockaddr sa;
		size_t n = strlen(url);
		if ((r = nng_listen(s->sock, url, &l, 0)) != 0) {
			rv = nng_err(r, "cannot listen on", url);
			goto fail;
		}
		snprintf(s->url, sizeof s->url, "%s", url);
		/* port 0: workers must be told the real one */
		if (strncmp(url, "tcp", 3) == 0 && n >= 2 && strcmp(url + n - 2, ":0") == 0 && n < sizeof s->url &&
		    nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) == 0 &&
		    (sa.s_family == NNG_AF_INET || sa.s_family == NNG_AF_INET6))
			snprintf(s->url + n - 1, sizeof s->url - (n - 1), "%u",
				 ntohs(sa.s_family == NNG_AF_INET ? sa.s_in.sa_port : sa.s_in6.sa_port));
		url = s->url;
	}
	rv = RL_ENOMEM;
	if ((s->ctxs = rl_try_calloc((size_t)s->o.contexts, sizeof(sctx), "contexts")) == NULL ||
	    (s->workers = rl_try_calloc((size_t)s->o.threads, sizeof(pthread_t), "threads")) == NULL)
		goto fail;
	for (int i = 0; i < s->o.contexts; i++) {
		sctx *c = &s->ctxs[i];
		c->s = s;
		if ((r = nng_aio_alloc(&c->aio, ctx_cb, c)) != 0 || (r = nng_ctx_open(&c->ctx, s->sock)) != 0) {
			rv = nng_err(r, "cannot open a context on", url);
			goto fail;
		}
		s->nctx++;
	}
	for (int i = 0; i < s->o.threads; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) {
			rv = RL_EIO;
			goto fail;
		}
		s->nworkers++;
	}
	if (pthread_create(&s->timer, NULL, timer_main, s) != 0) {
		rv = RL_EIO;
		goto fail;
	}
	s->timer_started = 1;
	bulk_open(s, url);
	if (s->o.shm >= 0 && strncmp(url, "inproc://", 9) != 0) {
		if (rl_wshm_hostid(s->hostid, sizeof s->hostid) != 0 || rl_wshm_srv_open2(&s->shm, shm_lookup, shm_take, s) != 0)
			rl_warn("no shared memory service: workers on this host use the stream");
	}
	for (int i = 0; i < s->nctx; i++)
		ctx_recv(&s->ctxs[i]);
	*out = s;
	return RL_OK;
fail:
	rl_wsync_server_close(s);
	return rv;
}

const char *
rl_wsync_server_url(const rl_wsync_server *s)
{
	return s->url;
}

/* ---- client ------------------------------------------------------------------------ */
struct rl_wsync_client {
	nng_socket sock;
	rl_wsync_client_opts o;
	char *url;
	nng_ctx ctx;
	nng_aio *aio;
	int local;                /* the server is on this host (loopback, ipc, inproc) */
	_Atomic uint64_t bulk_off_until_ms; /* the bulk stream was unreachable: REQ/REP until then */
	_Atomic uint64_t bytes_sent, bytes_recv, chunks, retries, raw_bytes, bulk_chunks, shm_versions;
	char hostid[24];          /* ours, "" if unknown */
	int last_push_shm;        /* the last push went over shared memory (no delta base needed) */
};

/* is url a server on this host?  Compression only costs CPU there. */
static int
url_is_local(const char *url)
{
	nng_url *u;
	int local = 0;

	if (strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0 || strncmp(url, "abstract://", 11) == 0)
		return 1;
	if (nng_url_parse(&u, url) != 0)
		return 0;
	local = strncmp(u->u_hostname, "127.", 4) == 0 || strcmp(u->u_hostname, "localhost") == 0 ||
		strcmp(u->u_hostname, "::1") == 0;
	nng_url_free(u);
	return local;
}

int
rl_wsync_client_open(rl_wsync_client **out, const char *url, const rl_wsync_client_opts *o)
{
	rl_wsync_client *c;
	int r, rv;

	*out = NULL;
	if ((c = rl_try_calloc(1, sizeof *c, "client")) == NULL)
		return RL_ENOMEM;
	if (o)
		c->o = *o;
	if (c->o.timeout_ms <= 0)
		c->o.timeout_ms = 10000;
	if (c->o.parallel <= 0)
		c->o.parallel = 4;
	if (c->o.level == 0)
		c->o.level = 1;
	if (c->o.chunk == 0)
		c->o.chunk = RL_WSYNC_CHUNK_DEFAULT;
	if (c->o.retries <= 0)
		c->o.retries = 3;
	if (c->o.max_msg == 0)
		c->o.max_msg = RL_WSYNC_CHUNK_MAX + 65536;
	if (c->o.max_bytes == 0)
		c->o.max_bytes = default_max_bytes();
	c->url = rl_xstrdup(url);
	c->local = url_is_local(url);
	if ((rv = rli_url_port_check(url)) != RL_OK)
		goto fail;
	if (c->o.transport < RL_WSYNC_T_AUTO || c->o.transport > RL_WSYNC_T_NNG) {
		rl_error("'%s': this client fetches with auto, shm, stream or nng", url);
		rv = RL_EINVAL;
		goto fail;
	}
	if (c->o.transport == RL_WSYNC_T_NNG)
		c->o.bulk = -1;
	if (rl_wshm_hostid(c->hostid, sizeof c->hostid) != 0)
		c->hostid[0] = 0;
	c->sock = (nng_socket)NNG_SOCKET_INITIALIZER;
	if (c->o.chunk < RL_WSYNC_PIECE || c->o.chunk > RL_WSYNC_CHUNK_MAX || c->o.chunk % RL_WSYNC_PIECE) {
		rl_error("chunk size %zu: must be a multiple of 1 MiB, at most %zu MiB", c->o.chunk,
			 RL_WSYNC_CHUNK_MAX >> 20);
		rv = RL_EINVAL;
		goto fail;
	}
	if ((r = nng_req0_open(&c->sock)) != 0) {
		rv = nng_err(r, "cannot open socket for", url);
		goto fail;
	}
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, c->o.max_msg);
	/* we retry ourselves; nng re-sends only after a reconnect or this long */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, 600000);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500);
	if ((r = nng_dial(c->sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
		rv = nng_err(r, "cannot dial", url);
		goto fail;
	}
	if ((r = nng_aio_alloc(&c->aio, NULL, NULL)) != 0 || (r = nng_ctx_open(&c->ctx, c->sock)) != 0) {
		rv = nng_err(r, "cannot open a context for", url);
		goto fail;
	}
	*out = c;
	return RL_OK;
fail:
	rl_wsync_client_close(c);
	return rv;
}

void
rl_wsync_client_close(rl_wsync_client *c)
{
	if (c == NULL)
		return;
	rli_nng_close_timed(c->sock, "rl-sync client");
	if (c->aio)
		nng_aio_free(c->aio);
	free(c->url);
	free(c);
}

void
rl_wsync_client_stats(rl_wsync_client *c, rl_wsync_stats *st, int reset)
{
	st->bytes_sent = c->bytes_sent;
	st->bytes_recv = c->bytes_recv;
	st->chunks = c->chunks;
	st->retries = c->retries;
	st->raw_bytes = c->raw_bytes;
	st->bulk_chunks = c->bulk_chunks;
	st->shm_versions = c->shm_versions;
	if (reset)
		c->bytes_sent = c->bytes_recv = c->chunks = c->retries = c->raw_bytes = c->bulk_chunks = c->shm_versions = 0;
}

/* one request and its reply on (ctx, aio).  *rep holds the reply message
 * (caller frees) when the return is RL_OK or the server's status; h points
 * into it.  Network failures return RL_ETIMEDOUT / RL_ENET, logged by caller. */
static int
rpc(rl_wsync_client *c, nng_ctx ctx, nng_aio *aio, uint16_t op, uint64_t version, uint64_t a, uint64_t b,
    const void *b1, size_t n1, const void *b2, size_t n2, int timeout_ms, nng_msg **rep, whdr *h)
{
	nng_msg *m;
	uint8_t hd[WS_HDR];
	const char *why;
	int r, rv;

	*rep = NULL;
	if (nng_msg_alloc(&m, 0) != 0)
		return RL_ENOMEM;
	hdr_fill(hd, op, 0, version, a, b);
	if (nng_msg_reserve(m, WS_HDR + n1 + n2) != 0 || nng_msg_append(m, hd, WS_HDR) != 0 ||
	    (n1 && nng_msg_append(m, b1, n1) != 0) || (n2 && nng_msg_append(m, b2, n2) != 0)) {
		nng_msg_free(m);
		return RL_ENOMEM;
	}
	nng_aio_set_timeout(aio, timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
	nng_aio_set_msg(aio, m);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	if ((r = nng_aio_result(aio)) != 0) {
		nng_msg_free(m);
		return r == NNG_ETIMEDOUT ? RL_ETIMEDOUT : r == NNG_ECLOSED ? RL_ECLOSED : RL_ENET;
	}
	c->bytes_sent += WS_HDR + n1 + n2;
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((r = nng_aio_result(aio)) != 0)
		return r == NNG_ETIMEDOUT ? RL_ETIMEDOUT : r == NNG_ECLOSED ? RL_ECLOSED : RL_ENET;
	m = nng_aio_get_msg(aio);
	c->bytes_recv += nng_msg_len(m);
	if ((rv = hdr_parse(h, nng_msg_body(m), nng_msg_len(m), &why)) != 0) {
		rl_error("'%s': %s in reply", c->url, why);
		nng_msg_free(m);
		return rv;
	}
	if (h->op != (op | OP_REPLY) && h->op != OP_REPLY) {
		rl_error("'%s': reply to the wrong request (op %u)", c->url, h->op);
		nng_msg_free(m);
		return RL_EFORMAT;
	}
	*rep = m;
	if (h->status < 0 || h->status >= RL_ERR_COUNT)
		return RL_EFORMAT;
	return h->status;
}

/* the server's message text from an error reply, for the log */
static const char *
rep_text(const whdr *h, char *buf, size_t n)
{
	size_t k = RL_MIN(h->bodyn, n - 1);

	memcpy(buf, h->body, k);
	buf[k] = 0;
	for (size_t i = 0; i < k; i++)
		if (buf[i] < 32 || buf[i] > 126)
			buf[i] = '?';
	return buf;
}

static int
net_fail(rl_wsync_client *c, int rv, const char *what)
{
	if (rv == RL_ETIMEDOUT) {
		rl_error("%s: no answer from '%s' within %d ms", what, c->url, c->o.timeout_ms);
		rl_hint("is 'rl-sync serve --listen %s' running?", c->url);
	} else {
		rl_error("%s: '%s': %s", what, c->url, rl_strerror(rv));
	}
	return rv;
}

int
rl_wsync_status(rl_wsync_client *c, char **json)
{
	nng_msg *m;
	whdr h;
	int rv;

	*json = NULL;
	if ((rv = rpc(c, c->ctx, c->aio, OP_STATUS, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		return net_fail(c, rv, "status");
	}
	if ((*json = malloc(h.bodyn + 1)) == NULL) {
		nng_msg_free(m);
		return RL_ENOMEM;
	}
	memcpy(*json, h.body, h.bodyn);
	(*json)[h.bodyn] = 0;
	nng_msg_free(m);
	return RL_OK;
}

static int poll_line(rl_wsync_client *c, uint64_t have, uint64_t wlin, int timeout_ms, uint64_t *latest,
		     uint64_t *lineage);

int
rl_wsync_poll(rl_wsync_client *c, uint64_t have, int timeout_ms, uint64_t *latest)
{
	uint64_t lin;

	return poll_line(c, have, 0, timeout_ms, latest, &lin);
}

int
rl_wsync_poll_line(rl_wsync_client *c, uint64_t have, uint64_t lineage, int timeout_ms, uint64_t *latest,
		   uint64_t *latest_lineage)
{
	return poll_line(c, have, WAIT_LINEAGE | lineage, timeout_ms, latest, latest_lineage);
}

/* wlin: 0 (versions above have only) or WAIT_LINEAGE | the caller's lineage */
static int
poll_line(rl_wsync_client *c, uint64_t have, uint64_t wlin, int timeout_ms, uint64_t *latest, uint64_t *lineage)
{
	double end = timeout_ms < 0 ? 1e300 : rl_now() + timeout_ms / 1e3;

	*lineage = wlin & ~WAIT_LINEAGE;
	for (;;) {
		double left = end - rl_now();
		int ask = left > WS_WAIT_MAX_MS / 1e3 ? WS_WAIT_MAX_MS : left > 0 ? (int)(left * 1e3) : 0;
		nng_msg *m;
		whdr h;
		int rv = rpc(c, c->ctx, c->aio, OP_WAIT, wlin, have, (uint64_t)ask, NULL, 0, NULL, 0,
			     ask + RL_MIN(c->o.timeout_ms, 2000),
			     &m, &h);

		if (m)
			nng_msg_free(m);
		if (m && (rv == RL_OK || rv == RL_ETIMEDOUT))
			*lineage = h.a; /* a server from before rewinds says 0 */
		if (rv == RL_OK) {
			*latest = h.version;
			return RL_OK;
		}
		if (rv != RL_ETIMEDOUT)
			return net_fail(c, rv, "wait");
		/* the server answered "nothing yet", or did not answer (restarting): ask again */
		if (rl_now() >= end) {
			if (m == NULL) {
				/* the wait given plus up to 2 s, not the request timeout */
				rl_error("wait: no answer from '%s' within %.0f ms", c->url,
					 (rl_now() - end) * 1e3 + RL_MAX(timeout_ms, 0));
				rl_hint("is 'rl-sync serve --listen %s' running?", c->url);
				return RL_ENET;
			}
			*latest = h.version;
			return RL_ETIMEDOUT;
		}
		if (m == NULL)
			rl_verbose("wait: no answer from '%s', asking again", c->url);
	}
}

/* ---- client: bulk stream ------------------------------------------------------------ */
#define BULK_CONNECT_MS 2000   /* connecting to the bulk stream; REQ/REP works without it */
#define BULK_BACKOFF_MS 60000  /* after a failed connect, REQ/REP only for this long */
typedef struct bstream {
	int fd;
} bstream;

static void
bstream_close(bstream *b)
{
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
}

/* connect to a bulk URL (tcp://host:port or ipc://path) within ms; each
 * send or receive then times out after io_ms */
static int
bstream_open(bstream *b, const char *url, int ms, int io_ms)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL, *a;
	nng_url *u = NULL;
	int rv = RL_ENET;

	b->fd = -1;
	if (strncmp(url, "ipc://", 6) == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + 6) >= (int)sizeof sa.sun_path ||
		    (b->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || connect(b->fd, (void *)&sa, sizeof sa) != 0)
			goto out;
		sock_timeouts(b->fd, io_ms);
		rv = RL_OK;
		goto out;
	}
	if (nng_url_parse(&u, url) != 0 || getaddrinfo(u->u_hostname, u->u_port, &hints, &ai) != 0)
		goto out;
	for (a = ai; a && rv != RL_OK; a = a->ai_next) {
		struct pollfd pf;
		int err = 0;
		socklen_t el = sizeof err;
		/* a non-blocking connect, so an unreachable host costs ms, not minutes */
		if ((b->fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
			continue;
		if (connect(b->fd, a->ai_addr, a->ai_addrlen) != 0) {
			pf = (struct pollfd){ .fd = b->fd, .events = POLLOUT };
			if (errno != EINPROGRESS || poll(&pf, 1, ms) != 1 ||
			    getsockopt(b->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
				bstream_close(b);
				continue;
			}
		}
		fcntl(b->fd, F_SETFL, fcntl(b->fd, F_GETFL) & ~O_NONBLOCK);
		sock_timeouts(b->fd, io_ms);
		rv = RL_OK;
	}
out:
	if (rv != RL_OK)
		bstream_close(b);
	if (ai)
		freeaddrinfo(ai);
	nng_url_free(u);
	return rv;
}

/* n bytes into d, XXH64-hashed (seed 0) as they arrive: each part is hashed
 * right after the kernel copied it, while it is still in cache */
#define BSTREAM_PART ((size_t)256 << 10)
static int
bstream_recv_hash(bstream *b, uint8_t *d, size_t n, uint64_t *hash)
{
	size_t got = 0, done = 0;
	rl_hash64_state s;

	rl_hash64_init(&s, 0);
	while (got < n) {
		ssize_t r = recv(b->fd, d + got, RL_MIN(n - got, BSTREAM_PART), 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? RL_ETIMEDOUT : RL_ENET;
		got += (size_t)r;
		if ((got & ~(size_t)31) > done) {
			rl_hash64_stripes(&s, d + done, (got & ~(size_t)31) - done);
			done = got & ~(size_t)31;
		}
	}
	*hash = rl_hash64_final(&s, d + done, n - done);
	return RL_OK;
}

/* all n bytes at p, sent or received */
static int
bstream_io(bstream *b, int send, void *p, size_t n)
{
	errno = 0;
	if ((send ? sock_send2(b->fd, p, n, NULL, 0) : sock_recv(b->fd, p, n)) == 0)
		return RL_OK;
	return errno == EAGAIN || errno == EWOULDBLOCK ? RL_ETIMEDOUT : RL_ENET;
}

/* where the server's bulk stream is, as this client reaches it */
static int
bulk_where(rl_wsync_client *c, char *out, size_t n)
{
	nng_msg *m;
	whdr h;
	nng_url *u;
	int rv, ok = 0;

	if ((rv = rpc(c, c->ctx, c->aio, OP_DATA, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		return rv == RL_OK ? RL_ENOTSUP : rv;
	}
	if (strncmp(c->url, "ipc://", 6) == 0) {
		/* next to the path this client dialled, nowhere else */
		ok = snprintf(out, n, "%s.bulk", c->url) < (int)n && h.bodyn == strlen(out) &&
		     memcmp(h.body, out, h.bodyn) == 0;
	} else if (h.a > 0 && h.a < 65536 && nng_url_parse(&u, c->url) == 0) {
		/* the host this client dialled, the port the server was given */
		const char *hn = u->u_hostname;
		ok = snprintf(out, n, strchr(hn, ':') ? "%s://[%s]:%u" : "%s://%s:%u", u->u_scheme, hn,
			      (unsigned)h.a) < (int)n;
		nng_url_free(u);
	}
	nng_msg_free(m);
	return ok ? RL_OK : RL_ENOTSUP;
}

/* ---- parallel chunk transfer (fetch and push) ----------------------------------- */
typedef struct xfer {
	rl_wsync_client *c;
	rl_wver *v;               /* destination (fetch) or source (push) */
	const rl_wver *base;      /* delta base or NULL */
	cref *ch;
	size_t nchunks;
	atomic_size_t next;
	atomic_int err;
	int push;
	int stored;               /* fetch: whole chunks uncompressed */
	const char *bulk;         /* fetch: the bulk stream's URL, or NULL */
	size_t batch;             /* chunks per bulk request */
} xfer;

/* chunk i over REQ/REP; `tried` tries were spent on it already (bulk) */
static int
fetch_one(xfer *x, nng_ctx ctx, nng_aio *aio, size_t i, int tried)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	rl_wblob *b = &x->v->blobs[cr->blob];
	int rv = RL_OK;

	for (int attempt = tried; attempt <= c->o.retries; attempt++) {
		nng_msg *m;
		whdr h;
		uint32_t flags;
		const uint8_t *base = NULL;
		char buf[256];

		if (attempt > 0)
			c->retries++;
		rv = rpc(c, ctx, aio, OP_CHUNK, x->v->version, i,
			 (x->base ? x->base->version : 0) | (x->stored ? CHUNK_STORED : 0), NULL, 0, NULL, 0,
			 c->o.timeout_ms, &m, &h);
		if (rv == RL_ETIMEDOUT) {
			if (m)
				nng_msg_free(m);
			continue;
		}
		if (rv != RL_OK) {
			if (m && rv == RL_EINVAL) {
				/* chunk out of range: the server's chunking changed (a restart) */
				rl_verbose("chunk %zu of version %llu: server says: %s", i,
					   (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				nng_msg_free(m);
				return RL_ESTALE;
			}
			if (m) {
				/* ENOENT: the server moved on to a newer version; the caller fetches that */
				if (rv == RL_ENOENT)
					rl_verbose("chunk %zu of version %llu: server says: %s", i,
						   (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				else
					rl_error("chunk %zu of version %llu: server says: %s", i,
						 (unsigned long long)x->v->version, rep_text(&h, buf, sizeof buf));
				nng_msg_free(m);
			} else {
				net_fail(c, rv, "fetch");
			}
			return rv;
		}
		rv = RL_EFORMAT;
		if (h.bodyn >= CB_HDR && h.a == i && get64(h.body + 8) != cr->len) {
			rl_verbose("chunk %zu of version %llu: the server's chunking changed", i,
				   (unsigned long long)x->v->version);
			nng_msg_free(m);
			return RL_ESTALE;
		}
		if (h.bodyn >= CB_HDR && h.a == i) {
			flags = get32(h.body);
			if (flags & RL_WENC_DELTA) {
				if (x->base && h.b == x->base->version)
					base = x->base->blobs[cr->blob].data + cr->off;
				else
					flags = ~0u; /* a delta we did not ask for: refused below */
			}
			if (flags != ~0u)
				rv = decode_chunk(b->data + cr->off, cr->len, h.body + CB_HDR, h.bodyn - CB_HDR, flags, base,
						  (int)get32(h.body + 4), b->pieces + cr->off / RL_WSYNC_PIECE);
		}
		c->bytes_recv += 0;
		nng_msg_free(m);
		if (rv == RL_OK) {
			c->chunks++;
			c->raw_bytes += cr->len;
			return RL_OK;
		}
		if (rv == RL_ECHECKSUM)
			rl_warn("chunk %zu of version %llu ('%s' at byte %llu) failed its checksum; asking again", i,
				(unsigned long long)x->v->version, b->name, (unsigned long long)cr->off);
		else
			rl_warn("chunk %zu of version %llu ('%s' at byte %llu) is malformed (%s); asking again", i,
				(unsigned long long)x->v->version, b->name, (unsigned long long)cr->off, rl_strerror(rv));
		rv = RL_ECHECKSUM;
	}
	if (rv == RL_ETIMEDOUT)
		return net_fail(c, rv, "fetch");
	rl_error("chunk %zu of version %llu still bad after %d tries", i, (unsigned long long)x->v->version,
		 c->o.retries + 1);
	return rv;
}

static void
xfer_fail(xfer *x, int rv)
{
	int zero = 0;

	atomic_compare_exchange_strong(&x->err, &zero, rv);
}

/* the next up to `want` chunks for this thread: their count, first at *first */
static size_t
xfer_claim(xfer *x, size_t want, size_t *first)
{
	size_t i = atomic_fetch_add(&x->next, want);

	if (i >= x->nchunks || atomic_load(&x->err) != 0)
		return 0;
	*first = i;
	return RL_MIN(want, x->nchunks - i);
}

static int
bulk_ask(xfer *x, bstream *b, size_t first, size_t count)
{
	uint8_t r[WB_HDR] = { 0 };

	put32(r, WB_MAGIC);
	put16(r + 4, WB_PROTO);
	put16(r + 6, WB_GET);
	put32(r + 8, WB_HDR);
	put64(r + 16, x->v->version);
	put64(r + 24, first);
	put64(r + 32, count);
	x->c->bytes_sent += WB_HDR;
	return bstream_io(b, 1, r, WB_HDR);
}

/* chunk i, the next one the stream sends, straight into its place: RL_OK;
 * RL_ECHECKSUM (the bytes came but are bad; the stream is still in step); or
 * another error (the stream is out of step, gone, or refused the range) */
static int
bulk_recv_one(xfer *x, bstream *b, size_t i)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	rl_wblob *bl = &x->v->blobs[cr->blob];
	uint8_t h[WB_HDR];
	uint64_t len;
	int rv, bad = 0;

	if ((rv = bstream_io(b, 0, h, WB_HDR)) != 0)
		return rv;
	len = get64(h + 32);
	if (get32(h) != WB_MAGIC || get16(h + 4) != WB_PROTO || get16(h + 6) != (WB_GET | OP_REPLY) ||
	    get32(h + 8) != WB_HDR)
		return RL_EFORMAT;
	if (get32(h + 12) != RL_OK) {
		char msg[256];
		size_t k = (size_t)RL_MIN(len, (uint64_t)sizeof msg - 1);
		if (bstream_io(b, 0, msg, k) == RL_OK) {
			msg[k] = 0;
			rl_verbose("bulk: server says: %s", msg);
		}
		return RL_ENOENT;
	}
	if (get64(h + 16) != x->v->version || get64(h + 24) != i || len != cr->len)
		return RL_EFORMAT;
	c->bytes_recv += WB_HDR + len;
	/* piece by piece, each hashed while it is still in cache */
	for (size_t o = 0; o < cr->len; o += RL_WSYNC_PIECE) {
		size_t n = RL_MIN(RL_WSYNC_PIECE, cr->len - o);
		uint8_t *d = bl->data + cr->off + o;
		uint64_t hv;
		if ((rv = bstream_recv_hash(b, d, n, &hv)) != 0)
			return rv;
		bad |= hv != bl->pieces[(cr->off + o) / RL_WSYNC_PIECE];
	}
	if (bad) {
		rl_warn("chunk %zu of version %llu ('%s' at byte %llu) failed its checksum; asking again", i,
			(unsigned long long)x->v->version, bl->name, (unsigned long long)cr->off);
		return RL_ECHECKSUM;
	}
	c->chunks++;
	c->bulk_chunks++;
	c->raw_bytes += cr->len;
	return RL_OK;
}

/* whole raw chunks over the bulk stream: ranges of x->batch chunks, the
 * next range asked for before the current one is read (no round trip
 * between ranges).  A bad chunk is asked for again over REQ/REP (its first
 * try spent); if the stream fails, the rest goes over REQ/REP.  Returns an
 * error only for a chunk REQ/REP could not fetch either. */
static int
xfer_bulk(xfer *x, nng_ctx ctx, nng_aio *aio)
{
	bstream b;
	size_t a0 = 0, an, b0 = 0, bn;
	int rv = RL_OK, up;

	if (bstream_open(&b, x->bulk, RL_MIN(x->c->o.timeout_ms, BULK_CONNECT_MS), x->c->o.timeout_ms) != RL_OK) {
		/* a firewall, say: do not try again for a while */
		rl_verbose("cannot reach the bulk stream at '%s'; using REQ/REP", x->bulk);
		atomic_store(&x->c->bulk_off_until_ms, (uint64_t)(rl_now() * 1e3) + BULK_BACKOFF_MS);
		return RL_OK;
	}
	up = 1;
	an = xfer_claim(x, x->batch, &a0);
	if (an > 0 && bulk_ask(x, &b, a0, an) != RL_OK)
		up = 0;
	while (an > 0) {
		bn = xfer_claim(x, x->batch, &b0);
		if (bn > 0 && up && bulk_ask(x, &b, b0, bn) != RL_OK)
			up = 0;
		for (size_t i = a0; i < a0 + an && rv == RL_OK; i++) {
			int r = up ? bulk_recv_one(x, &b, i) : RL_ENET;
			if (r == RL_OK)
				continue;
			if (r != RL_ECHECKSUM && up) {
				rl_verbose("bulk stream: %s; going on over REQ/REP", rl_strerror(r));
				up = 0;
			}
			rv = fetch_one(x, ctx, aio, i, r == RL_ECHECKSUM);
		}
		if (rv != RL_OK)
			break;
		a0 = b0;
		an = bn;
	}
	bstream_close(&b);
	return rv;
}

static int
push_one(xfer *x, nng_ctx ctx, nng_aio *aio, size_t i)
{
	rl_wsync_client *c = x->c;
	const cref *cr = &x->ch[i];
	const rl_wblob *b = &x->v->blobs[cr->blob];
	uint8_t cb[CB_HDR + SEG_HDR], *e = NULL;
	const uint8_t *pay;
	size_t en, hn = CB_HDR;
	uint32_t flags = 0;
	int rv;

	if (x->stored && x->base == NULL) {
		/* one stored segment: the raw bytes go into the message as they are */
		memset(cb + CB_HDR, 0, SEG_HDR);
		put32(cb + CB_HDR, (uint32_t)cr->len);
		hn += SEG_HDR;
		pay = b->data + cr->off;
		en = cr->len;
	} else {
		if ((rv = rl_wsync_encode(&e, &en, &flags, b->data + cr->off,
					  x->base ? x->base->blobs[cr->blob].data + cr->off : NULL, cr->len, b->elem,
					  c->o.level)) != 0)
			return rv;
		pay = e;
	}
	put32(cb, flags);
	put32(cb + 4, (uint32_t)b->elem);
	put64(cb + 8, cr->len);
	for (int attempt = 0; attempt <= c->o.retries; attempt++) {
		nng_msg *m;
		whdr h;
		char buf[256];

		if (attempt > 0)
			c->retries++;
		if (en > 0 && atomic_load(&test_corrupt) > 0 && atomic_fetch_sub(&test_corrupt, 1) > 0) {
			/* test hook: this attempt carries one flipped byte */
			uint8_t *bad = malloc(en);
			if (bad) {
				memcpy(bad, pay, en);
				bad[en / 2] ^= 0x5a;
				rv = rpc(c, ctx, aio, OP_PUSH_CHUNK, x->v->version, i, 0, cb, hn, bad, en, c->o.timeout_ms,
					 &m, &h);
				free(bad);
				goto sent;
			}
		}
		rv = rpc(c, ctx, aio, OP_PUSH_CHUNK, x->v->version, i, 0, cb, hn, pay, en, c->o.timeout_ms, &m, &h);
sent:
		if (rv == RL_OK) {
			c->chunks++;
			c->raw_bytes += cr->len;
		} else if (m && rv != RL_ECHECKSUM) {
			rl_error("pushing chunk %zu of version %llu: server says: %s", i, (unsigned long long)x->v->version,
				 rep_text(&h, buf, sizeof buf));
		}
		if (m)
			nng_msg_free(m);
		if (rv == RL_OK || (rv != RL_ECHECKSUM && rv != RL_ETIMEDOUT))
			break;
	}
	free(e);
	if (rv == RL_ETIMEDOUT)
		net_fail(c, rv, "push");
	else if (rv == RL_ECHECKSUM)
		rl_error("chunk %zu of version %llu rejected by the server after %d tries", i,
			 (unsigned long long)x->v->version, c->o.retries + 1);
	return rv;
}

static void *
xfer_main(void *arg)
{
	xfer *x = arg;
	nng_ctx ctx;
	nng_aio *aio = NULL;
	int r;

	if ((r = nng_aio_alloc(&aio, NULL, NULL)) != 0 || (r = nng_ctx_open(&ctx, x->c->sock)) != 0) {
		if (aio)
			nng_aio_free(aio);
		atomic_store(&x->err, RL_ENET);
		return NULL;
	}
	if (x->bulk && (r = xfer_bulk(x, ctx, aio)) != RL_OK)
		xfer_fail(x, r);
	for (;;) {
		size_t i = atomic_fetch_add(&x->next, 1);
		int rv;
		if (i >= x->nchunks || atomic_load(&x->err) != 0)
			break;
		rv = x->push ? push_one(x, ctx, aio, i) : fetch_one(x, ctx, aio, i, 0);
		if (rv != 0) {
			xfer_fail(x, rv);
			break;
		}
	}
	nng_ctx_close(ctx);
	nng_aio_free(aio);
	return NULL;
}

static int
xfer_run(xfer *x)
{
	int np = (int)RL_MIN((size_t)x->c->o.parallel, x->nchunks ? x->nchunks : 1);
	pthread_t th[64];
	int started = 0;

	if (np > 64)
		np = 64;
	for (; started < np; started++)
		if (pthread_create(&th[started], NULL, xfer_main, x) != 0)
			break;
	if (started == 0)
		return RL_EIO;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	return atomic_load(&x->err);
}

/* the server's shared memory service if it runs on this host (its host id
 * is ours): its socket name.  RL_ENOTSUP when not. */
static int
shm_where(rl_wsync_client *c, char *name, size_t n)
{
	nng_msg *m;
	whdr h;
	const char *sp;
	size_t hl, nl;
	int rv;

	if (c->hostid[0] == 0)
		return RL_ENOTSUP;
	if ((rv = rpc(c, c->ctx, c->aio, OP_SHM, 0, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h)) != 0) {
		if (m)
			nng_msg_free(m);
		/* an older server answers "unknown operation" */
		return rv == RL_EINVAL ? RL_ENOTSUP : rv;
	}
	sp = memchr(h.body, ' ', h.bodyn);
	hl = sp ? (size_t)(sp - (const char *)h.body) : 0;
	nl = sp ? h.bodyn - hl - 1 : 0;
	rv = RL_ENOTSUP;
	if (sp == NULL || hl != strlen(c->hostid) || memcmp(h.body, c->hostid, hl) != 0) {
		rl_verbose("'%s' runs on another host (or boot): no shared memory", c->url);
	} else if (nl == 0 || nl >= n) {
		rv = RL_EFORMAT;
	} else {
		memcpy(name, sp + 1, nl);
		name[nl] = 0;
		rv = RL_OK;
	}
	nng_msg_free(m);
	return rv;
}

/* v (a decoded manifest) from the server's memfd: mapped read-only and
 * verified once; with dst the bytes are then copied into dst's buffers
 * (which v points to) and the mapping dropped.  On failure v is as it was. */
static int
fetch_shm(rl_wsync_client *c, rl_wver *v, rl_wver *dst)
{
	char name[128];
	uint64_t got = 0, size = 0;
	uint8_t **old = NULL;
	int fd = -1, oldb = v->borrowed, rv;

	if ((rv = shm_where(c, name, sizeof name)) != 0)
		return rv;
	if ((rv = rl_wshm_recv(&fd, &got, &size, name, v->version, c->o.timeout_ms)) != 0)
		return rv;
	if (got != v->version || size != rl_wshm_size(v)) {
		close(fd);
		return RL_EFORMAT;
	}
	if ((old = rl_try_calloc((size_t)v->nblobs + 1, sizeof *old, "blob table")) == NULL) {
		close(fd);
		return RL_ENOMEM;
	}
	for (int i = 0; i < v->nblobs; i++)
		old[i] = v->blobs[i].data;
	rv = rl_wshm_map(v, fd);
	close(fd); /* the mapping keeps the object alive */
	if (rv == RL_OK && (rv = rl_wver_verify(v)) != 0)
		rl_warn("version %llu: the shared memory object does not match its checksums",
			(unsigned long long)v->version);
	if (rv != RL_OK) {
		if (v->map)
			munmap(v->map, v->mapn);
		v->map = NULL;
		v->mapn = 0;
		for (int i = 0; i < v->nblobs; i++)
			v->blobs[i].data = old[i];
		v->borrowed = oldb;
		free(old);
		return rv;
	}
	for (int i = 0; i < v->nblobs; i++) {
		if (dst) {
			if (v->blobs[i].size)
				memcpy(old[i], v->blobs[i].data, (size_t)v->blobs[i].size);
			v->blobs[i].data = old[i];
		} else if (oldb != 1) {
			free(old[i]);
		}
	}
	if (dst) {
		munmap(v->map, v->mapn);
		v->map = NULL;
		v->mapn = 0;
		v->borrowed = oldb;
	}
	free(old);
	c->shm_versions++;
	c->raw_bytes += rl_wver_total(v);
	rl_verbose("version %llu: mapped from shared memory '@%s'%s", (unsigned long long)v->version, name,
		   dst ? ", copied into the buffer" : "");
	return RL_OK;
}

/* fetch into dst (NULL: allocate) */
static int
fetch(rl_wsync_client *c, rl_wver **out, rl_wver *dst, uint64_t version, const rl_wver *base)
{
	nng_msg *m = NULL;
	whdr h;
	rl_wver *v = NULL;
	uint32_t chunk;
	uint64_t db, lin;
	const char *why;
	char buf[256], burl[320];
	xfer x;
	int rv;

	memset(&x, 0, sizeof x);
	for (int attempt = 0;; attempt++) {
		rv = rpc(c, c->ctx, c->aio, OP_MANIFEST, version, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms, &m, &h);
		if (rv != RL_ETIMEDOUT || attempt >= c->o.retries)
			break;
		if (m)
			nng_msg_free(m);
	}
	if (rv != 0) {
		if (m) {
			/* ENOENT: the version was replaced by a newer one (rl_wsync_fetch_newest) */
			if (rv == RL_ENOENT)
				rl_verbose("fetch: server says: %s", rep_text(&h, buf, sizeof buf));
			else
				rl_error("fetch: server says: %s", rep_text(&h, buf, sizeof buf));
			nng_msg_free(m);
			return rv;
		}
		return net_fail(c, rv, "fetch");
	}
	rv = manifest_decode(&v, &chunk, &db, h.body, h.bodyn, &why, dst == NULL, c->o.max_bytes);
	lin = h.a;
	nng_msg_free(m);
	if (rv != 0) {
		rl_error("fetch: '%s': %s", c->url, why);
		return rv;
	}
	v->lineage = lin;
	if (dst) {
		if (!same_layout(dst, v)) {
			rl_error("fetch: version %llu has another layout (blob names or sizes) than the buffer given",
				 (unsigned long long)v->version);
			rv = RL_ESHAPE;
			goto out;
		}
		for (int i = 0; i < v->nblobs; i++)
			v->blobs[i].data = dst->blobs[i].data;
		dst->version = 0; /* not a valid version until this succeeds */
	}
	if (c->o.transport == RL_WSYNC_T_AUTO || c->o.transport == RL_WSYNC_T_SHM) {
		if ((rv = fetch_shm(c, v, dst)) == RL_OK)
			goto done;
		if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("fetch: version %llu over shared memory from '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			if (rv == RL_ENOTSUP)
				rl_hint("the server must run on this host (and its shared memory service be on); "
					"use --transport auto or stream");
			goto out;
		}
		rl_verbose("version %llu: not over shared memory (%s); fetching over the %s", (unsigned long long)v->version,
			   rl_strerror(rv), c->o.bulk >= 0 ? "stream" : "REQ/REP socket");
	}
	x.c = c;
	x.v = v;
	/* a base of another line (a worker that held a version a rewind
	 * dropped) has the number but not the bytes: whole chunks then */
	if (base && db != 0 && base->version == db && base->lineage == v->lineage && same_layout(base, v))
		x.base = base;
	if ((rv = chunk_table(&x.ch, &x.nchunks, v, chunk)) != 0)
		goto out;
	x.stored = c->o.stored > 0 || (c->o.stored == 0 && c->local);
	x.batch = RL_MAX((size_t)1, ((size_t)16 << 20) / chunk);
	if (x.stored && x.base == NULL && c->o.bulk >= 0 && (uint64_t)(rl_now() * 1e3) >= c->bulk_off_until_ms &&
	    bulk_where(c, burl, sizeof burl) == RL_OK)
		x.bulk = burl;
	rl_verbose("fetching version %llu: %zu chunks%s%s", (unsigned long long)v->version, x.nchunks,
		   x.base ? " as a delta" : x.stored ? ", uncompressed" : "", x.bulk ? " over the bulk stream" : "");
	if ((rv = xfer_run(&x)) != 0)
		goto out;
done:
	if (dst) {
		dst->version = v->version;
		dst->hash = v->hash;
		dst->lineage = v->lineage;
		for (int i = 0; i < v->nblobs; i++) {
			free(dst->blobs[i].pieces);
			dst->blobs[i].pieces = v->blobs[i].pieces;
			v->blobs[i].pieces = NULL;
			dst->blobs[i].hash = v->blobs[i].hash;
			dst->blobs[i].elem = v->blobs[i].elem;
		}
	} else {
		*out = v;
		v = NULL;
	}
out:
	free(x.ch);
	rl_wver_destroy(v);
	return rv;
}

int
rl_wsync_fetch(rl_wsync_client *c, rl_wver **out, uint64_t version, const rl_wver *base)
{
	int rv;

	*out = NULL;
	/* RL_ESTALE: the server restarted with other chunk indices; start over once */
	if ((rv = fetch(c, out, NULL, version, base)) == RL_ESTALE)
		rv = fetch(c, out, NULL, version, base);
	return rv;
}

int
rl_wsync_fetch_into(rl_wsync_client *c, rl_wver *dst, uint64_t version, const rl_wver *base)
{
	int rv;

	if (dst == base) {
		rl_error("fetch: the buffer and the delta base must differ");
		return RL_EINVAL;
	}
	if ((rv = fetch(c, NULL, dst, version, base)) == RL_ESTALE)
		rv = fetch(c, NULL, dst, version, base);
	return rv;
}

/* push v's bytes as one sealed memfd handed to the server's shared memory
 * service (after PUSH_BEGIN of a whole version) */
static int
push_shm(rl_wsync_client *c, rl_wver *v, const char *name)
{
	double t = rl_now();
	int fd, rv, bad = atomic_load(&test_corrupt) > 0 && atomic_fetch_sub(&test_corrupt, 1) > 0;

	if ((rv = rl_wshm_make(&fd, v, 0, bad)) != 0)
		return rv;
	rv = rl_wshm_send(name, v->version, fd, c->o.timeout_ms * 6);
	close(fd);
	if (rv == RL_OK) {
		c->shm_versions++;
		c->raw_bytes += rl_wver_total(v);
		rl_verbose("version %llu: handed over as shared memory '@%s' in %.3f s", (unsigned long long)v->version,
			   name, rl_now() - t);
	}
	return rv;
}

static int push_once(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int last, uint64_t flags);
static int push_retry(rl_wsync_client *c, rl_wver *v, const rl_wver *base, uint64_t flags);

/* A server restarted during a push has forgotten it (its chunks and commit are
 * answered "no push of version N in progress", RL_ENOENT): the whole push is
 * made again, whole (the new server may not hold the delta's base), at most
 * twice; the trainer still holds every byte of the version. */
int
rl_wsync_push(rl_wsync_client *c, rl_wver *v, const rl_wver *base)
{
	return push_retry(c, v, base, 0);
}

int
rl_wsync_push_rewind(rl_wsync_client *c, rl_wver *v)
{
	int rv = push_retry(c, v, NULL, PUSH_REWIND);

	if (rv == RL_OK)
		rl_verbose("push: the server's line is version %llu's now (line %llu)", (unsigned long long)v->version,
			   (unsigned long long)v->lineage);
	return rv;
}

static int
push_retry(rl_wsync_client *c, rl_wver *v, const rl_wver *base, uint64_t flags)
{
	int rv;

	for (int attempt = 0;; attempt++) {
		rv = push_once(c, v, attempt ? NULL : base, attempt == 2, flags);
		if (rv != RL_ENOENT || attempt == 2)
			return rv;
		rl_warn("push: the server lost version %llu while it was sent (restarted?): sending it again",
			(unsigned long long)v->version);
	}
}

static int
push_once(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int last, uint64_t flags)
{
	uint8_t *man = NULL;
	size_t mn;
	nng_msg *m = NULL;
	whdr h;
	char buf[512], shm[128];
	xfer x;
	int rv, use_shm = 0;

	memset(&x, 0, sizeof x);
	if (v->version == 0) {
		rl_error("push: version number must be >= 1");
		return RL_EINVAL;
	}
	if ((rv = rl_wver_hash(v)) != 0)
		return rv;
	/* a server on this host takes the version as shared memory: one copy
	 * into a memfd, no codec, no delta (which would only cost CPU here) */
	if (c->o.transport == RL_WSYNC_T_AUTO || c->o.transport == RL_WSYNC_T_SHM) {
		if ((rv = shm_where(c, shm, sizeof shm)) == RL_OK) {
			use_shm = 1;
			base = NULL;
		} else if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("push: version %llu over shared memory to '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			if (rv == RL_ENOTSUP)
				rl_hint("the server must run on this host (and its shared memory service be on); "
					"use the transport auto or stream");
			return rv;
		}
	}
	if (base && (base->version >= v->version || !same_layout(base, v))) {
		rl_verbose("push: base %llu does not fit version %llu; sending it whole",
			   (unsigned long long)base->version, (unsigned long long)v->version);
		base = NULL;
	}
	for (;;) {
		if ((rv = manifest_encode(&man, &mn, v, (uint32_t)c->o.chunk, base ? base->version : 0)) != 0)
			return rv;
		if (mn > c->o.max_msg) {
			rl_error("push: manifest of %zu bytes is over the message limit", mn);
			free(man);
			return RL_ETOOBIG;
		}
		rv = rpc(c, c->ctx, c->aio, OP_PUSH_BEGIN, v->version, flags, base ? base->hash : 0, man, mn, NULL, 0,
			 c->o.timeout_ms, &m, &h);
		free(man);
		man = NULL;
		if (rv == RL_ENOENT && base) {
			rl_verbose("push: server has not got version %llu; sending version %llu whole",
				   (unsigned long long)base->version, (unsigned long long)v->version);
			base = NULL;
			nng_msg_free(m);
			continue;
		}
		break;
	}
	if (rv != 0) {
		if (m) {
			rl_error("push: server refused version %llu: %s", (unsigned long long)v->version,
				 rep_text(&h, buf, sizeof buf));
			if (rv == RL_ESTALE && (flags & PUSH_REWIND))
				rl_hint("an rl-sync server older than this program cannot rewind to a resumed "
					"trainer's version: upgrade it, or restart it without --data-dir");
			nng_msg_free(m);
			return rv;
		}
		return net_fail(c, rv, "push");
	}
	nng_msg_free(m);
	c->last_push_shm = 0;
	if (use_shm && (rv = push_shm(c, v, shm)) != RL_OK) {
		if (c->o.transport == RL_WSYNC_T_SHM) {
			rl_error("push: version %llu over shared memory to '%s': %s", (unsigned long long)v->version,
				 c->url, rl_strerror(rv));
			goto out;
		}
		/* the staged push is still open: its chunks go the usual way */
		rl_verbose("push: version %llu not over shared memory (%s); sending its chunks",
			   (unsigned long long)v->version, rl_strerror(rv));
		use_shm = 0;
	}
	if (!use_shm) {
		x.c = c;
		x.v = v;
		x.base = base;
		x.push = 1;
		x.stored = c->o.stored > 0 || (c->o.stored == 0 && c->local);
		if ((rv = chunk_table(&x.ch, &x.nchunks, v, c->o.chunk)) != 0)
			goto out;
		if ((rv = xfer_run(&x)) != 0)
			goto out;
	}
	rv = rpc(c, c->ctx, c->aio, OP_PUSH_COMMIT, v->version, 0, 0, NULL, 0, NULL, 0, c->o.timeout_ms * 6, &m, &h);
	if (rv != 0) {
		if (m) {
			(rv == RL_ENOENT && !last ? rl_verbose : rl_error)("push: server refused to publish version %llu: %s",
				 (unsigned long long)v->version, rep_text(&h, buf, sizeof buf));
			nng_msg_free(m);
		} else {
			net_fail(c, rv, "push");
		}
		goto out;
	}
	v->lineage = h.a;
	nng_msg_free(m);
	c->last_push_shm = use_shm;
out:
	free(x.ch);
	return rv;
}

/* ---- transports behind one handle ------------------------------------------------------ */
struct rl_wsync {
	rl_wsync_transport t;
	void *self;
};

/* nng: an rl-sync server's client; keeps a copy of the last published
 * version as the next delta base (the caller's buffers change under it) */
typedef struct tnng {
	rl_wsync_client *c;
	rl_wver *last;
} tnng;

static int
copy_ver(rl_wver **out, const rl_wver *v)
{
	rl_wver *n;
	int rv;

	if ((rv = rl_wver_create(&n, v->version)) != 0)
		return rv;
	for (int i = 0; i < v->nblobs; i++)
		if ((rv = rl_wver_add_blob(n, v->blobs[i].name, v->blobs[i].data, v->blobs[i].size, v->blobs[i].elem, 1)) != 0) {
			rl_wver_destroy(n);
			return rv;
		}
	if ((rv = rl_wver_hash(n)) != 0) {
		rl_wver_destroy(n);
		return rv;
	}
	*out = n;
	return RL_OK;
}

/* the delta base is managed by rl_wsync_publish */
static int tnng_publish(void *self, rl_wver *v) { tnng *t = self; return rl_wsync_push(t->c, v, t->last); }
static int tnng_poll(void *self, uint64_t have, int ms, uint64_t *l) { return rl_wsync_poll(((tnng *)self)->c, have, ms, l); }
static int tnng_fetch(void *self, rl_wver **o, uint64_t ver, const rl_wver *b) { return rl_wsync_fetch(((tnng *)self)->c, o, ver, b); }
static void
tnng_close(void *self)
{
	tnng *t = self;

	if (t == NULL)
		return;
	rl_wsync_client_close(t->c);
	rl_wver_destroy(t->last);
	free(t);
}
static int tnng_rewind(void *self, rl_wver *v) { return rl_wsync_push_rewind(((tnng *)self)->c, v); }
static int
tnng_poll_line(void *self, uint64_t have, uint64_t lin, int ms, uint64_t *l, uint64_t *ll)
{
	return rl_wsync_poll_line(((tnng *)self)->c, have, lin, ms, l, ll);
}
static const rl_wsync_transport tnng_vt = { "nng", tnng_publish, tnng_poll, tnng_fetch, tnng_close, tnng_rewind,
					    tnng_poll_line };

/* file: the wdir layout */
typedef struct tfile {
	char *dir;
	int keep;
} tfile;

static int tfile_publish(void *self, rl_wver *v) { tfile *t = self; int rv = rl_wver_hash(v); return rv ? rv : rl_wdir_publish_ver(t->dir, v, t->keep); }
/* Like the server's WAIT: a version newer than the caller's `have`, however
 * often it was seen before.  A watcher kept across calls answered each new
 * version once only, so a poll that merely waited (rl-rollout's wait for a
 * version, whose answer it does not use) swallowed it and the next poll
 * never saw it. */
static int
tfile_poll(void *self, uint64_t have, int ms, uint64_t *l)
{
	tfile *t = self;
	rl_wdir_watch *w;
	char path[4096];
	int rv;

	if ((rv = rl_wdir_watch_open(&w, t->dir, have, 0)) != 0)
		return rv;
	rv = rl_wdir_watch_next(w, l, path, sizeof path, ms);
	rl_wdir_watch_close(w);
	return rv;
}
static int
tfile_fetch(void *self, rl_wver **o, uint64_t ver, const rl_wver *b)
{
	tfile *t = self;
	char path[4096];
	uint64_t l;
	int rv;

	if (ver == 0) {
		if ((rv = rl_wdir_latest(t->dir, &l, path, sizeof path)) != 0)
			return rv;
	} else if ((rv = rl_wdir_path(path, sizeof path, t->dir, ver)) != 0) {
		return rv;
	}
	return rl_wver_read_dir(o, path, 0);
}
static void
tfile_close(void *self)
{
	tfile *t = self;

	if (t == NULL)
		return;
	free(t->dir);
	free(t);
}
static int
tfile_rewind(void *self, rl_wver *v)
{
	tfile *t = self;
	uint64_t lin;
	int rv;

	if ((rv = rl_wver_hash(v)) != 0 || (rv = rl_wdir_rewind_ver(t->dir, v, t->keep, &lin)) != 0)
		return rv;
	v->lineage = lin;
	return RL_OK;
}
/* tfile_poll, and RL_OK at once when the latest directory is on another
 * line than the caller's (rl_wdir_rewind_ver made it) */
static int
tfile_poll_line(void *self, uint64_t have, uint64_t lin, int ms, uint64_t *l, uint64_t *ll)
{
	tfile *t = self;
	char path[4096];
	int rv;

	*ll = lin;
	if (rl_wdir_latest(t->dir, l, path, sizeof path) == RL_OK && rl_wdir_lineage(path, ll) == RL_OK && *ll != lin)
		return RL_OK;
	if ((rv = tfile_poll(self, have, ms, l)) == RL_OK && rl_wdir_path(path, sizeof path, t->dir, *l) == RL_OK)
		rl_wdir_lineage(path, ll);
	return rv;
}
static const rl_wsync_transport tfile_vt = { "file", tfile_publish, tfile_poll, tfile_fetch, tfile_close,
					     tfile_rewind, tfile_poll_line };

int
rl_wsync_open_transport(rl_wsync **out, const rl_wsync_transport *t, void *self)
{
	rl_wsync *s;

	if ((s = rl_try_calloc(1, sizeof *s, "sync handle")) == NULL)
		return RL_ENOMEM;
	s->t = *t;
	s->self = self;
	*out = s;
	return RL_OK;
}

int
rl_wsync_transport_parse(const char *name, int *out)
{
	static const char *const names[] = { "auto", "shm", "stream", "nng", "file" };

	for (int i = 0; i < 5; i++)
		if (strcmp(name, names[i]) == 0) {
			*out = i;
			return RL_OK;
		}
	return RL_EINVAL;
}

int
rl_wsync_open(rl_wsync **out, const char *url, int keep)
{
	return rl_wsync_open_with(out, url, keep, RL_WSYNC_T_AUTO);
}

int
rl_wsync_open_with(rl_wsync **out, const char *url, int keep, int transport)
{
	int rv;

	*out = NULL;
	if (strncmp(url, "tcp://", 6) == 0 || strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0 ||
	    strncmp(url, "tls+tcp://", 10) == 0) {
		rl_wsync_client_opts o = { .transport = transport };
		tnng *t;
		if (transport == RL_WSYNC_T_FILE) {
			rl_error("'%s': the file transport needs a directory, not a server URL", url);
			return RL_EINVAL;
		}
		if ((t = rl_try_calloc(1, sizeof *t, "sync handle")) == NULL)
			return RL_ENOMEM;
		if ((rv = rl_wsync_client_open(&t->c, url, &o)) != 0 ||
		    (rv = rl_wsync_open_transport(out, &tnng_vt, t)) != 0) {
			tnng_close(t);
			return rv;
		}
		return RL_OK;
	}
	if (strncmp(url, "nccl://", 7) == 0 || strncmp(url, "cuda-ipc://", 11) == 0) {
		rl_error("'%s': the NCCL and CUDA IPC weight transports are not in this build", url);
		rl_hint("use tcp://HOST:PORT (rl-sync serve) or a shared directory");
		return RL_ENOTSUP;
	}
	if (strstr(url, "://") != NULL && strncmp(url, "file://", 7) != 0) {
		rl_error("'%s': unknown weight transport", url);
		rl_hint("use tcp://HOST:PORT, ipc://PATH, file://DIR or a directory");
		return RL_EINVAL;
	}
	if (transport != RL_WSYNC_T_AUTO && transport != RL_WSYNC_T_FILE) {
		rl_error("'%s': a directory is read with the file transport", url);
		rl_hint("shm, stream and nng need an rl-sync server URL (tcp://, ipc://)");
		return RL_EINVAL;
	}
	{
		tfile *t = rl_try_calloc(1, sizeof *t, "sync handle");
		if (t == NULL)
			return RL_ENOMEM;
		t->dir = rl_xstrdup(strncmp(url, "file://", 7) == 0 ? url + 7 : url);
		t->keep = keep > 0 ? keep : 2;
		if ((rv = rl_wsync_open_transport(out, &tfile_vt, t)) != 0) {
			tfile_close(t);
			return rv;
		}
	}
	return RL_OK;
}

void
rl_wsync_close(rl_wsync *s)
{
	if (s == NULL)
		return;
	if (s->t.close)
		s->t.close(s->self);
	free(s);
}

const char *rl_wsync_transport_name(const rl_wsync *s) { return s->t.name; }

int
rl_wsync_publish(rl_wsync *s, rl_wver *v, int delta)
{
	int rv;

	if ((rv = s->t.publish(s->self, v)) != 0)
		return rv;
	/* nng: remember this version as the next delta base only when asked */
	if (s->t.publish == tnng_publish) {
		tnng *t = s->self;
		/* a push over shared memory sends no delta: keep no copy for one */
		if (!delta || t->c->last_push_shm) {
			rl_wver_destroy(t->last);
			t->last = NULL;
		} else if (t->last == NULL || t->last->version != v->version) {
			rl_wver_destroy(t->last);
			t->last = NULL;
			copy_ver(&t->last, v);
		}
	}
	return RL_OK;
}

int
rl_wsync_publish_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version, int delta)
{
	rl_wver *v;
	int rv;

	if ((rv = rl_wver_read_dir(&v, ckpt_dir, 0)) != 0)
		return rv;
	if (version != 0 && v->version != version) {
		v->version = version;
		rl_wver_hash(v);
	}
	if (v->version == 0) {
		rl_error("'%s': no version number given and none recorded in the directory", ckpt_dir);
		rl_wver_destroy(v);
		return RL_EINVAL;
	}
	rv = rl_wsync_publish(s, v, delta);
	rl_wver_destroy(v);
	return rv;
}

int rl_wsync_poll_version(rl_wsync *s, uint64_t have, int ms, uint64_t *l) { return s->t.poll(s->self, have, ms, l); }

int
rl_wsync_poll_version_line(rl_wsync *s, uint64_t have, uint64_t lineage, int ms, uint64_t *latest,
			   uint64_t *latest_lineage)
{
	*latest_lineage = lineage;
	if (s->t.poll_line == NULL) /* a transport without rewinds */
		return s->t.poll(s->self, have, ms, latest);
	return s->t.poll_line(s->self, have, lineage, ms, latest, latest_lineage);
}

int
rl_wsync_rewind(rl_wsync *s, rl_wver *v)
{
	int rv;

	if (s->t.rewind == NULL) {
		rl_error("the %s weight transport cannot rewind to version %llu", s->t.name, (unsigned long long)v->version);
		return RL_ENOTSUP;
	}
	if ((rv = s->t.rewind(s->self, v)) != 0)
		return rv;
	if (s->t.publish == tnng_publish) {
		/* the next version goes as a delta against this one, as after a publish */
		tnng *t = s->self;
		rl_wver_destroy(t->last);
		t->last = NULL;
		if (!t->c->last_push_shm)
			copy_ver(&t->last, v);
	}
	return RL_OK;
}

int
rl_wsync_rewind_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version)
{
	rl_wver *v;
	int rv;

	if ((rv = rl_wver_read_dir(&v, ckpt_dir, 0)) != 0)
		return rv;
	if (v->version != version) {
		v->version = version;
		rl_wver_hash(v);
	}
	rv = rl_wsync_rewind(s, v);
	rl_wver_destroy(v);
	return rv;
}
int rl_wsync_fetch_version(rl_wsync *s, rl_wver **o, uint64_t ver, const rl_wver *b) { return s->t.fetch(s->self, o, ver, b); }

int
rl_wsync_fetch_newest(rl_wsync *s, rl_wver **out, uint64_t version, const rl_wver *base)
{
	int rv = rl_wsync_fetch_version(s, out, version, base);
	for (int i = 0; rv == RL_ENOENT && version != 0 && i < 4; i++) {
		rl_verbose("version %llu was replaced while fetching it; fetching the latest",
		    (unsigned long long)version);
		rv = rl_wsync_fetch_version(s, out, 0, base);
	}
	if (rv == RL_ENOENT)
		rl_error("weights: version %llu is no longer held and no newer one could be fetched",
		    (unsigned long long)version);
	return rv;
}

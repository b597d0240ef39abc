/*
 * codec.c — the chunk codec rl-sync's server and client share: XOR delta
 * against a base version, byte-plane shuffle, zstd, sparse planes, and the
 * decoder that checks piece hashes as it goes.
 *
 * Leaves out: the wire format around chunks (wire.c) and who asks for them.
 */
#include "sync/wsync.h"
#include "sync/wsync_int.h"
#include "base/core.h"
#include "base/hash.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

/* An encoded chunk is a list of segments: the `elem` byte planes of the
 * (XOR'd) chunk, then the n % elem tail bytes (elem 1: one segment, the
 * chunk).  Each segment is u32 encoded length, u8 kind (0 stored, 1 zstd,
 * 2 sparse: below), 3 zero bytes, then its bytes.  Planes are compressed one
 * by one so the near-random low mantissa plane of bf16 weights is stored and
 * only the exponent plane pays for zstd, both ways. */

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

/* rli_ws_decode_chunk: rl_wsync_decode, and with pieces non-NULL also checks each
 * RL_WSYNC_PIECE of the output against pieces[] (the chunk starts on a piece
 * boundary): RL_ECHECKSUM on a mismatch */
int
rli_ws_decode_chunk(uint8_t *dst, size_t n, const uint8_t *enc, size_t encn, uint32_t flags, const uint8_t *base, int elem,
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
	return rli_ws_decode_chunk(dst, n, enc, encn, flags, base, elem, NULL);
}

/*
 * hash.c — XXH64 (see hash.h); FNV-1a and the integer mix are inline there.
 * The constants and steps are those of the published xxHash specification;
 * tests/unit/test_hash.c checks the empty-input value and agreement with
 * zstd's XXH64 (its low 32 bits, as libzstd exports them).
 */
#include "base/hash.h"

#include <string.h>

/* ---- checksum: XXH64 -------------------------------------------------------- */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t xround(uint64_t acc, uint64_t in) { return rotl64(acc + in * P2, 31) * P1; }
static inline uint64_t xmerge(uint64_t h, uint64_t v) { return (h ^ xround(0, v)) * P1 + P4; }

void
rl_hash64_init(rl_hash64_state *s, uint64_t seed)
{
	s->v[0] = seed + P1 + P2;
	s->v[1] = seed + P2;
	s->v[2] = seed;
	s->v[3] = seed - P1;
	s->seed = seed;
	s->len = 0;
}

/* n a multiple of 32: whole stripes, so that a receiver hashes each part
 * of a transfer while it is still in cache */
void
rl_hash64_stripes(rl_hash64_state *s, const void *vp, size_t n)
{
	const uint8_t *p = vp;
	uint64_t v1 = s->v[0], v2 = s->v[1], v3 = s->v[2], v4 = s->v[3];

	for (const uint8_t *end = p + n; p < end; p += 32) {
		v1 = xround(v1, rd64(p));
		v2 = xround(v2, rd64(p + 8));
		v3 = xround(v3, rd64(p + 16));
		v4 = xround(v4, rd64(p + 24));
	}
	s->v[0] = v1;
	s->v[1] = v2;
	s->v[2] = v3;
	s->v[3] = v4;
	s->len += n;
}

uint64_t
rl_hash64_final(const rl_hash64_state *s, const void *vp, size_t n)
{
	const uint8_t *p = vp, *end = p + n;
	uint64_t h;

	if (s->len >= 32) {
		h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
		for (int k = 0; k < 4; k++)
			h = xmerge(h, s->v[k]);
	} else {
		h = s->seed + P5;
	}
	h += s->len + (uint64_t)n;
	for (; p + 8 <= end; p += 8)
		h = rotl64(h ^ xround(0, rd64(p)), 27) * P1 + P4;
	if (p + 4 <= end) {
		h = rotl64(h ^ ((uint64_t)rd32(p) * P1), 23) * P2 + P3;
		p += 4;
	}
	for (; p < end; p++)
		h = rotl64(h ^ (*p * P5), 11) * P1;
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	h ^= h >> 32;
	return h;
}

uint64_t
rl_hash64(const void *vp, size_t n, uint64_t seed)
{
	const uint8_t *p = vp;
	size_t whole = n & ~(size_t)31;
	rl_hash64_state s;

	rl_hash64_init(&s, seed);
	rl_hash64_stripes(&s, p, whole);
	return rl_hash64_final(&s, p + whole, n - whole);
}

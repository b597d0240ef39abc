/* test_hash.c — base/hash.h: XXH64 against libzstd's frame checksum (an
 * independent implementation: the low 32 bits of XXH64 with seed 0), the
 * known value of the empty input, the streaming form against the one-shot
 * one at every split, FNV-1a's published test vectors. */
#include "base/hash.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

static uint64_t rs = 88172645463325252ULL;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static void fill(uint8_t *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd(); }

/* libzstd's frame checksum is the low 32 bits of XXH64(content, seed 0) */
static uint32_t
zstd_xxh32(const uint8_t *p, size_t n)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t bound = ZSTD_compressBound(n), z;
	uint8_t *buf = malloc(bound);
	uint32_t v;

	ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
	z = ZSTD_compress2(c, buf, bound, p, n);
	memcpy(&v, buf + z - 4, 4);
	free(buf);
	ZSTD_freeCCtx(c);
	return v;
}

static void
test_hash(void)
{
	static uint8_t b[3000];
	int bad = 0;

	T_OK(rl_hash64("", 0, 0) == 0xEF46DB3751D8E999ULL);
	fill(b, sizeof b);
	for (size_t n = 0; n <= 200; n++)
		bad += (uint32_t)rl_hash64(b, n, 0) != zstd_xxh32(b, n);
	bad += (uint32_t)rl_hash64(b, sizeof b, 0) != zstd_xxh32(b, sizeof b);
	T_EQ_INT(bad, 0);
	T_OK(rl_hash64(b, 100, 1) != rl_hash64(b, 100, 0));
}

static void
test_stream(void)
{
	static uint8_t b[1000];
	int bad = 0;

	fill(b, sizeof b);
	for (size_t n = 0; n <= sizeof b; n += 7) {
		rl_hash64_state s;
		size_t whole = n & ~(size_t)31;
		rl_hash64_init(&s, 42);
		/* stripes given in two parts, both multiples of 32 */
		size_t cut = (whole / 2) & ~(size_t)31;
		rl_hash64_stripes(&s, b, cut);
		rl_hash64_stripes(&s, b + cut, whole - cut);
		bad += rl_hash64_final(&s, b + whole, n - whole) != rl_hash64(b, n, 42);
	}
	T_EQ_INT(bad, 0);
}

static void
test_fnv(void)
{
	/* FNV-1a 64 test vectors from the FNV reference (Noll): "", "a", "foobar" */
	T_OK(rl_fnv1a(RL_FNV1A_INIT, "", 0) == 0xcbf29ce484222325ULL);
	T_OK(rl_fnv1a(RL_FNV1A_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
	T_OK(rl_fnv1a(RL_FNV1A_INIT, "foobar", 6) == 0x85944171f73967e8ULL);
	/* continuing equals hashing the concatenation */
	T_OK(rl_fnv1a(rl_fnv1a(RL_FNV1A_INIT, "foo", 3), "bar", 3) == 0x85944171f73967e8ULL);
}

int
main(void)
{
	T_BEGIN("test_hash");
	test_hash();
	test_stream();
	test_fnv();
	T_END();
}

/*
 * hash.h — the project's non-cryptographic hashes, one of each kind:
 *   rl_hash64   XXH64 (the xxHash 64-bit algorithm, written here): checksums
 *               of weight pieces and versions (docs/sync.md), names of shared
 *               memory segments; bit-exact with the reference, so a checksum
 *               computed by another implementation agrees.  Streaming form
 *               for data that arrives in parts.
 *   rl_fnv1a    FNV-1a 64: short keys and fingerprints where speed is no
 *               concern and the exact value is stored (weights fingerprints
 *               across data-parallel ranks, id filling in rl-queue put).
 *   rl_hash_mix a bijective 64-bit finaliser for hash tables keyed by
 *               integers (splitmix64's, the same as rl_rng_mix in rng.h).
 * None of them resists an adversary: never use one where a collision chosen
 * by a client could do harm.
 */
#ifndef RL_HASH_H
#define RL_HASH_H

#include "base/rng.h"

#include <stddef.h>
#include <stdint.h>

/* XXH64 of n bytes at p with the given seed.  Thread-safe, no allocation. */
uint64_t rl_hash64(const void *p, size_t n, uint64_t seed);

/* XXH64 as a stream: whole 32-byte stripes as they come, then the tail.
 * rl_hash64_stripes takes a multiple of 32 bytes; rl_hash64_final hashes
 * the last n < 32 bytes at p and returns the hash of everything given. */
typedef struct rl_hash64_state {
	uint64_t v[4], seed, len;
} rl_hash64_state;
void rl_hash64_init(rl_hash64_state *s, uint64_t seed);
void rl_hash64_stripes(rl_hash64_state *s, const void *p, size_t n);
uint64_t rl_hash64_final(const rl_hash64_state *s, const void *p, size_t n);

/* FNV-1a 64 over n bytes, continuing from h (RL_FNV1A_INIT to start). */
#define RL_FNV1A_INIT 0xcbf29ce484222325ULL
static inline uint64_t
rl_fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* For hash tables keyed by integers: a bijective mix of all 64 bits. */
static inline uint64_t
rl_hash_mix(uint64_t x)
{
	return rl_rng_mix(x);
}

#endif

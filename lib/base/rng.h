/*
 * rng.h — the counter-based random numbers every backend shares, so that a
 * seed gives the same draws on the CPU and the GPU: u = f(seed, counter) with
 * no state.  Usable from C and CUDA (RL_HD marks host+device functions).
 */
#ifndef RL_RNG_H
#define RL_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define RL_HD __host__ __device__ __forceinline__
#else
#define RL_HD static inline
#endif

/* splitmix64's finaliser: a bijective 64-bit mix. */
RL_HD uint64_t
rl_rng_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* 64 random bits for (seed, counter). */
RL_HD uint64_t
rl_rng_u64(uint64_t seed, uint64_t counter)
{
	return rl_rng_mix(rl_rng_mix(seed + 0x9e3779b97f4a7c15ULL) ^ (counter * 0xd1b54a32d192ed03ULL));
}

/* uniform double in [0, 1) with 53 random bits. */
RL_HD double
rl_rng_uniform(uint64_t seed, uint64_t counter)
{
	return (double)(rl_rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

/* A small sequential generator for host code (init, shuffles): state advances by one counter. */
typedef struct rl_rng { uint64_t seed, counter; } rl_rng;
RL_HD uint64_t rl_rng_next(rl_rng *r) { return rl_rng_u64(r->seed, r->counter++); }
RL_HD double rl_rng_next_uniform(rl_rng *r) { return rl_rng_uniform(r->seed, r->counter++); }

#endif

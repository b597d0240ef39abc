/*
 * kvcache.h — the paged KV cache for generation: per layer two act tensors
 * kc, vc (NBLK, BS, NKV, HD) carved from one allocation sized by a memory
 * budget, and the host-side block allocator: reference-counted blocks, so a
 * group's samples share their prompt's blocks (rl_kvcache_fork), with
 * copy-on-write of a shared, partly filled last block when a sequence
 * appends to it (rl_kvcache_reserve).
 *
 * Leaves out: the attention itself (ops->kv_write, ops->attn_decode), which
 * sequences run (the engine's scheduler), eviction/preemption policy.
 *
 * Thread-safety: one thread at a time (the engine's).
 */
#ifndef RL_KVCACHE_H
#define RL_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "compute/ops.h"

typedef struct rl_kvcache {
	rl_ops *ops;            /* borrowed */
	int L, NKV, HD, BS;     /* layers, kv heads, head dim, tokens per block */
	int nblk;               /* blocks in the pool */
	int maxblk;             /* blocks per sequence at most: ceil(max_pos / BS) */
	void *mem;              /* one backend allocation: L x {kc, vc} x (NBLK, BS, NKV, HD) act */
	void **kc, **vc;        /* (L) views into mem */
	int32_t *ref;           /* (NBLK) host reference counts; 0 = free */
	int32_t *freelist;      /* (NBLK) host stack of free block ids */
	int nfree;
} rl_kvcache;

/* One sequence's view of the cache.  Caller-owned; rl_kvseq_init before use,
 * rl_kvcache_release to give its blocks back. */
typedef struct rl_kvseq {
	int32_t *blocks;        /* (maxblk) host block table */
	int nblk;               /* blocks in use */
	int len;                /* tokens cached */
} rl_kvseq;

/* rl_kvcache_open sizes the pool as budget_bytes / bytes per block (at least
 * one block per sequence of max_pos tokens is NOT required: it is a pool).
 * block_size: tokens per block (16 is usual).  RL_EINVAL when the budget holds
 * no block, RL_ENOMEM from the backend.  *out is the caller's. */
int rl_kvcache_open(rl_kvcache **out, rl_ops *ops, const rl_config *cfg, size_t budget_bytes,
    int block_size);
void rl_kvcache_close(rl_kvcache *kv);

void rl_kvseq_init(rl_kvseq *s, const rl_kvcache *kv);
/* Drops s's references (freeing blocks that reach 0) and frees its table; s
 * can be re-initialised. NULL-safe. */
void rl_kvcache_release(rl_kvcache *kv, rl_kvseq *s);
/* dst (initialised, empty) shares src's blocks and length. */
void rl_kvcache_fork(rl_kvcache *kv, rl_kvseq *dst, const rl_kvseq *src);
/* Makes room for n more tokens in s (positions len .. len+n-1): allocates
 * blocks and copies a shared, partly filled last block first (copy-on-write).
 * Does not change len.  RL_EBUSY when the pool is out of blocks (nothing
 * changed), RL_ETOOBIG past maxblk. */
int rl_kvcache_reserve(rl_kvcache *kv, rl_kvseq *s, int n);
/* Shortens s to len tokens (len <= s->len), dropping blocks past them. */
void rl_kvcache_truncate(rl_kvcache *kv, rl_kvseq *s, int len);
/* Cache slot of token i of s (i < nblk * BS): block * BS + offset. */
static inline int32_t
rl_kvcache_slot(const rl_kvcache *kv, const rl_kvseq *s, int i)
{
	return s->blocks[i / kv->BS] * kv->BS + i % kv->BS;
}

#endif

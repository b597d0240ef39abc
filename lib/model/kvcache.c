/*
 * kvcache.c — paged KV cache pool and reference-counted block allocator.
 */
#include "model/kvcache.h"

#include <stdlib.h>
#include <string.h>

int
rl_kvcache_open(rl_kvcache **out, rl_ops *ops, const rl_config *cfg, size_t budget_bytes,
    int block_size)
{
	rl_kvcache *kv;
	size_t asz = rl_dtype_size(ops->act_dtype), per_layer_blk, per_blk;
	int rv;

	*out = NULL;
	if (block_size <= 0) {
		rl_error("kv cache: block size %d must be positive", block_size);
		return RL_EINVAL;
	}
	per_layer_blk = (size_t)block_size * cfg->n_kv_head * cfg->head_dim * asz;
	per_blk = per_layer_blk * 2 * cfg->n_layer;
	if (budget_bytes / per_blk < 1 || budget_bytes / per_blk > INT32_MAX / (size_t)block_size) {
		rl_error("kv cache: a budget of %zu bytes holds %zu blocks of %zu bytes", budget_bytes,
		    budget_bytes / per_blk, per_blk);
		rl_hint("raise the KV cache memory budget");
		return RL_EINVAL;
	}
	kv = rl_xcalloc(1, sizeof *kv);
	kv->ops = ops;
	kv->L = cfg->n_layer;
	kv->NKV = cfg->n_kv_head;
	kv->HD = cfg->head_dim;
	kv->BS = block_size;
	kv->nblk = (int)(budget_bytes / per_blk);
	kv->maxblk = (cfg->max_pos + block_size - 1) / block_size;
	if ((rv = ops->alloc(ops, &kv->mem, per_blk * (size_t)kv->nblk)) != 0) {
		free(kv);
		return rv;
	}
	kv->kc = rl_xcalloc((size_t)kv->L, sizeof *kv->kc);
	kv->vc = rl_xcalloc((size_t)kv->L, sizeof *kv->vc);
	for (int l = 0; l < kv->L; l++) {
		kv->kc[l] = (char *)kv->mem + (size_t)(2 * l) * per_layer_blk * kv->nblk;
		kv->vc[l] = (char *)kv->mem + (size_t)(2 * l + 1) * per_layer_blk * kv->nblk;
	}
	kv->ref = rl_xcalloc((size_t)kv->nblk, sizeof *kv->ref);
	kv->freelist = rl_xcalloc((size_t)kv->nblk, sizeof *kv->freelist);
	for (int i = 0; i < kv->nblk; i++)
		kv->freelist[i] = kv->nblk - 1 - i;
	kv->nfree = kv->nblk;
	*out = kv;
	return RL_OK;
}

void
rl_kvcache_close(rl_kvcache *kv)
{
	if (kv == NULL)
		return;
	kv->ops->free(kv->ops, kv->mem);
	free(kv->kc);
	free(kv->vc);
	free(kv->ref);
	free(kv->freelist);
	free(kv);
}

void
rl_kvseq_init(rl_kvseq *s, const rl_kvcache *kv)
{
	s->blocks = rl_xcalloc((size_t)kv->maxblk, sizeof *s->blocks);
	s->nblk = 0;
	s->len = 0;
}

static void
unref(rl_kvcache *kv, int32_t b)
{
	if (--kv->ref[b] == 0)
		kv->freelist[kv->nfree++] = b;
}

void
rl_kvcache_release(rl_kvcache *kv, rl_kvseq *s)
{
	if (s == NULL)
		return;
	for (int i = 0; i < s->nblk; i++)
		unref(kv, s->blocks[i]);
	free(s->blocks);
	s->blocks = NULL;
	s->nblk = s->len = 0;
}

void
rl_kvcache_fork(rl_kvcache *kv, rl_kvseq *dst, const rl_kvseq *src)
{
	for (int i = 0; i < dst->nblk; i++)
		unref(kv, dst->blocks[i]);
	/* only the blocks holding tokens: blocks src reserved past its length stay its own */
	int nb = (src->len + kv->BS - 1) / kv->BS;
	for (int i = 0; i < nb; i++) {
		dst->blocks[i] = src->blocks[i];
		kv->ref[src->blocks[i]]++;
	}
	dst->nblk = nb;
	dst->len = src->len;
}

int
rl_kvcache_reserve(rl_kvcache *kv, rl_kvseq *s, int n)
{
	int need = (s->len + n + kv->BS - 1) / kv->BS, cow, extra;
	size_t bsz = (size_t)kv->BS * kv->NKV * kv->HD * rl_dtype_size(kv->ops->act_dtype);

	if (need > kv->maxblk) {
		rl_error("kv cache: %d tokens exceed the %d positions of the model", s->len + n,
		    kv->maxblk * kv->BS);
		return RL_ETOOBIG;
	}
	/* The last block is written into when it is partly filled; if other
	 * sequences share it, this one gets its own copy first. */
	cow = n > 0 && s->len % kv->BS != 0 && kv->ref[s->blocks[s->len / kv->BS]] > 1;
	extra = RL_MAX(need - s->nblk, 0);
	if (extra + cow > kv->nfree)
		return RL_EBUSY;
	if (cow) {
		int i = s->len / kv->BS;
		int32_t nb = kv->freelist[--kv->nfree], ob = s->blocks[i];
		kv->ref[nb] = 1;
		for (int l = 0; l < kv->L; l++) {
			kv->ops->copy(kv->ops, (char *)kv->kc[l] + nb * bsz, (char *)kv->kc[l] + ob * bsz, bsz);
			kv->ops->copy(kv->ops, (char *)kv->vc[l] + nb * bsz, (char *)kv->vc[l] + ob * bsz, bsz);
		}
		unref(kv, ob);
		s->blocks[i] = nb;
	}
	while (s->nblk < need) {
		int32_t nb = kv->freelist[--kv->nfree];
		kv->ref[nb] = 1;
		s->blocks[s->nblk++] = nb;
	}
	return RL_OK;
}

void
rl_kvcache_truncate(rl_kvcache *kv, rl_kvseq *s, int len)
{
	int keep;

	if (len < 0 || len > s->len)
		len = s->len;
	keep = (len + kv->BS - 1) / kv->BS;
	while (s->nblk > keep)
		unref(kv, s->blocks[--s->nblk]);
	s->len = len;
}

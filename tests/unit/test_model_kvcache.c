/*
 * test_model_kvcache.c — the paged KV cache's block allocator: pool sizing
 * from the budget, reserve / RL_EBUSY when the pool runs out (nothing
 * changed), RL_ETOOBIG past the model's positions, fork sharing with
 * reference counts, copy-on-write of a shared partly filled block (contents
 * copied), truncate and release returning every block; and the model's decode
 * refusing a step (no token appended) when the cache is full.
 */
#include <string.h>

#include "model/kvcache.h"
#include "model/model.h"
#include "t.h"

int
main(void)
{
	rl_config c = { .arch = RL_ARCH_LLAMA, .vocab_size = 32, .hidden_size = 16, .n_layer = 2,
		.n_head = 2, .n_kv_head = 1, .head_dim = 8, .intermediate_size = 24, .max_pos = 20,
		.rope_theta = 10000, .norm_eps = 1e-6f, .bos_id = -1, .eos_id = -1, .dtype = RL_F32 };
	rl_ops *o = NULL;
	rl_kvcache *kv = NULL;
	rl_model *m = NULL;
	rl_kvseq a, b, d;
	/* bytes per block: BS 4 x NKV 1 x HD 8 x 4 bytes x (k, v) x 2 layers = 512 */
	const size_t blk = 512;

	T_BEGIN("test_model_kvcache");
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	T_EQ_INT(rl_kvcache_open(&kv, o, &c, blk - 1, 4), RL_EINVAL);
	T_EQ_INT(rl_kvcache_open(&kv, o, &c, 6 * blk + 100, 4), 0);
	if (kv == NULL)
		return 1;
	T_EQ_INT(kv->nblk, 6);
	T_EQ_INT(kv->maxblk, 5);
	rl_kvseq_init(&a, kv);
	rl_kvseq_init(&b, kv);
	rl_kvseq_init(&d, kv);

	T_EQ_INT(rl_kvcache_reserve(kv, &a, 6), 0);       /* 2 blocks */
	T_EQ_INT(a.nblk, 2);
	a.len = 6;
	T_EQ_INT(rl_kvcache_reserve(kv, &a, 15), RL_ETOOBIG); /* 21 tokens > 20 positions */
	/* mark a's second block so the copy can be checked */
	float *kc0 = kv->kc[0];
	size_t per = (size_t)4 * 8;
	for (size_t j = 0; j < per; j++)
		kc0[a.blocks[1] * per + j] = 1000.0f + j;

	rl_kvcache_fork(kv, &b, &a);
	T_EQ_INT(b.len, 6);
	T_EQ_INT(b.nblk, 2);
	T_EQ_INT(kv->ref[a.blocks[0]], 2);
	T_EQ_INT(kv->ref[a.blocks[1]], 2);
	T_EQ_INT(kv->nfree, 4);
	/* b appends into the shared half-full block: it gets a copy */
	T_EQ_INT(rl_kvcache_reserve(kv, &b, 1), 0);
	T_OK(b.blocks[1] != a.blocks[1], "no copy-on-write");
	T_EQ_INT(b.blocks[0], a.blocks[0]);
	T_EQ_INT(kv->ref[a.blocks[1]], 1);
	T_EQ_INT(kv->ref[b.blocks[1]], 1);
	T_OK(memcmp(kc0 + b.blocks[1] * per, kc0 + a.blocks[1] * per, per * 4) == 0, "block not copied");
	T_EQ_INT(kv->nfree, 3);
	/* a then appends: its block is its own again, no copy */
	T_EQ_INT(rl_kvcache_reserve(kv, &a, 2), 0);
	T_EQ_INT(kv->nfree, 3);
	/* exhaust the pool: d wants 4 blocks, 3 are free: nothing changes */
	T_EQ_INT(rl_kvcache_reserve(kv, &d, 16), RL_EBUSY);
	T_EQ_INT(d.nblk, 0);
	T_EQ_INT(kv->nfree, 3);
	T_EQ_INT(rl_kvcache_reserve(kv, &d, 12), 0);
	T_EQ_INT(kv->nfree, 0);
	d.len = 12;
	rl_kvcache_truncate(kv, &d, 5);
	T_EQ_INT(d.nblk, 2);
	T_EQ_INT(d.len, 5);
	T_EQ_INT(kv->nfree, 1);
	rl_kvcache_release(kv, &a);
	rl_kvcache_release(kv, &b);
	rl_kvcache_release(kv, &d);
	T_EQ_INT(kv->nfree, 6);
	for (int i = 0; i < kv->nblk; i++)
		T_EQ_INT(kv->ref[i], 0);

	/* the model's decode when the cache is full: RL_EBUSY, no token appended */
	T_EQ_INT(rl_model_init_random(&m, &c, o, 5), 0);
	if (m != NULL) {
		rl_kvseq s[2], *sp[2] = { &s[0], &s[1] };
		const int32_t p0[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, p1[12] = { 9, 8, 7, 6, 5, 4, 3, 2, 1, 2, 3, 4 };
		const int32_t *pr[2] = { p0, p1 }, tk[2] = { 3, 4 };
		const int np[2] = { 8, 12 };
		float lg[2 * 32];
		rl_kvseq_init(&s[0], kv);
		rl_kvseq_init(&s[1], kv);
		T_EQ_INT(rl_model_infer_reserve(m, 24, 2), 0);
		T_EQ_INT(rl_model_prefill(m, kv, sp, pr, np, 2, lg), 0); /* 2 + 3 blocks of 6 */
		/* both need a new block and one is free: refused, no token appended */
		T_EQ_INT(rl_model_decode(m, kv, sp, tk, 2, lg), RL_EBUSY);
		T_EQ_INT(s[0].len, 8);
		T_EQ_INT(s[1].len, 12);
		T_EQ_INT(kv->nfree, 0);
		rl_kvcache_release(kv, &s[1]);
		T_EQ_INT(rl_model_decode(m, kv, sp, tk, 1, lg), 0);
		T_EQ_INT(s[0].len, 9);
		rl_kvcache_release(kv, &s[0]);
		T_EQ_INT(kv->nfree, 6);
	}
	rl_model_close(m);
	rl_kvcache_close(kv);
	rl_ops_close(o);
	T_END();
}

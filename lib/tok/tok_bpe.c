/*
 * tok_bpe.c — byte-level BPE over token ids: the merge table (pair of ids ->
 * rank and merged id, open addressing), the merge loop (a doubly linked list of
 * symbols plus a binary heap of candidate pairs ordered by rank then position:
 * O(n log n) in the piece length, the order Hugging Face tokenizers use), and a
 * cache of recently seen pieces.
 *
 * rli_bpe_merge_ids runs the same loop from given symbols (SentencePiece-style
 * BPE, whose symbols are characters or byte-fallback tokens).
 *
 * Leaves out: dropout, unk tokens, continuing-subword prefixes.
 */
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "tok/tok_impl.h"
#include "base/hash.h"

#define EMPTY UINT64_MAX
#define CACHE_MAX_PIECE 256            /* longer pieces are not cached */
#define CACHE_SLOTS ((size_t)1 << 17)  /* cleared when 3/4 full */
#define CACHE_MAX_BYTES ((size_t)32 << 20)

typedef struct centry {
	uint64_t hash;  /* 0 = empty */
	uint32_t key;   /* offset in kbuf */
	uint32_t klen;
	uint32_t ids;   /* offset in ibuf */
	uint32_t nids;
} centry;

struct rli_bpe {
	int32_t byte_id[256];
	uint64_t *mkey; /* (mcap) left << 32 | right */
	uint64_t *mval; /* (mcap) rank << 32 | merged */
	size_t mcap, mcount;
	/* scratch for one piece */
	int32_t *id, *nxt, *prv;
	uint64_t *heap;
	size_t scap;
	/* word cache */
	centry *slots;
	size_t used;
	uint8_t *kbuf;
	size_t klen, kcap;
	int32_t *ibuf;
	size_t ilen, icap;
};

static inline uint64_t
hash_bytes(const uint8_t *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull ^ n;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, s + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 32;
	}
	uint64_t w = 0;
	memcpy(&w, s + i, n - i);
	h = rl_hash_mix(h ^ w ^ ((uint64_t)(n - i) << 56));
	return h ? h : 1;
}

static int
mgrow(rli_bpe *b, size_t cap)
{
	uint64_t *k = malloc(cap * sizeof(*k)), *v = malloc(cap * sizeof(*v));
	if (!k || !v) {
		free(k);
		free(v);
		rl_error("cannot allocate the BPE merge table (%zu slots)", cap);
		return RL_ENOMEM;
	}
	for (size_t i = 0; i < cap; i++)
		k[i] = EMPTY;
	for (size_t i = 0; i < b->mcap; i++) {
		if (b->mkey[i] == EMPTY)
			continue;
		size_t h = rl_hash_mix(b->mkey[i]) & (cap - 1);
		while (k[h] != EMPTY)
			h = (h + 1) & (cap - 1);
		k[h] = b->mkey[i];
		v[h] = b->mval[i];
	}
	free(b->mkey);
	free(b->mval);
	b->mkey = k;
	b->mval = v;
	b->mcap = cap;
	return 0;
}

int
rli_bpe_create(rli_bpe **out, const int32_t id_of_byte[256], size_t hint)
{
	rli_bpe *b = calloc(1, sizeof(*b));
	size_t cap = 1024;
	int rv;
	if (!b)
		return RL_ENOMEM;
	memcpy(b->byte_id, id_of_byte, sizeof(b->byte_id));
	while (cap < hint * 2)
		cap *= 2;
	if ((rv = mgrow(b, cap)) != 0 || !(b->slots = calloc(CACHE_SLOTS, sizeof(centry)))) {
		rli_bpe_destroy(b);
		return rv ? rv : RL_ENOMEM;
	}
	*out = b;
	return 0;
}

void
rli_bpe_destroy(rli_bpe *b)
{
	if (!b)
		return;
	free(b->mkey);
	free(b->mval);
	free(b->id);
	free(b->nxt);
	free(b->prv);
	free(b->heap);
	free(b->slots);
	free(b->kbuf);
	free(b->ibuf);
	free(b);
}

int
rli_bpe_add_merge(rli_bpe *b, int32_t left, int32_t right, int32_t merged)
{
	uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
	int rv;
	if ((b->mcount + 1) * 2 > b->mcap && (rv = mgrow(b, b->mcap * 2)) != 0)
		return rv;
	size_t h = rl_hash_mix(key) & (b->mcap - 1);
	while (b->mkey[h] != EMPTY) {
		if (b->mkey[h] == key)
			return RL_EEXIST;
		h = (h + 1) & (b->mcap - 1);
	}
	b->mkey[h] = key;
	b->mval[h] = (uint64_t)b->mcount << 32 | (uint32_t)merged;
	b->mcount++;
	return 0;
}

/* rank << 32 | merged for the pair, or EMPTY. */
static inline uint64_t
mfind(const rli_bpe *b, int32_t left, int32_t right)
{
	uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
	size_t h = rl_hash_mix(key) & (b->mcap - 1);
	for (;;) {
		uint64_t k = b->mkey[h];
		if (k == key)
			return b->mval[h];
		if (k == EMPTY)
			return EMPTY;
		h = (h + 1) & (b->mcap - 1);
	}
}

int
rli_tokens_push(rl_tokens *t, int32_t id)
{
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 64;
		int32_t *p = realloc(t->ids, nc * sizeof(*p));
		if (!p)
			return RL_ENOMEM;
		t->ids = p;
		t->cap = nc;
	}
	t->ids[t->n++] = id;
	return 0;
}

static int
tokens_reserve(rl_tokens *t, size_t more)
{
	if (t->n + more <= t->cap)
		return 0;
	size_t nc = t->cap ? t->cap : 64;
	while (nc < t->n + more)
		nc *= 2;
	int32_t *p = realloc(t->ids, nc * sizeof(*p));
	if (!p)
		return RL_ENOMEM;
	t->ids = p;
	t->cap = nc;
	return 0;
}

/* ---- heap of (rank << 32 | position), smallest first ------------------------- */
static inline void
heap_push(uint64_t *h, size_t *n, uint64_t v)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (h[p] <= v)
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = v;
}

static inline uint64_t
heap_pop(uint64_t *h, size_t *n)
{
	uint64_t top = h[0], v = h[--*n];
	size_t i = 0, m = *n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= m)
			break;
		if (c + 1 < m && h[c + 1] < h[c])
			c++;
		if (v <= h[c])
			break;
		h[i] = h[c];
		i = c;
	}
	if (m)
		h[i] = v;
	return top;
}

static int
scratch(rli_bpe *b, size_t n)
{
	if (n <= b->scap)
		return 0;
	size_t c = b->scap ? b->scap : 256;
	while (c < n)
		c *= 2;
	int32_t *id = realloc(b->id, c * sizeof(int32_t));
	if (id)
		b->id = id;
	int32_t *nx = realloc(b->nxt, c * sizeof(int32_t));
	if (nx)
		b->nxt = nx;
	int32_t *pv = realloc(b->prv, c * sizeof(int32_t));
	if (pv)
		b->prv = pv;
	uint64_t *hp = realloc(b->heap, c * 2 * sizeof(uint64_t));
	if (hp)
		b->heap = hp;
	if (!id || !nx || !pv || !hp) {
		rl_error("cannot allocate BPE scratch for a piece of %zu bytes", n);
		return RL_ENOMEM;
	}
	b->scap = c;
	return 0;
}

static inline void
push_pair(rli_bpe *b, size_t *hn, int32_t pos)
{
	int32_t q = b->nxt[pos];
	if (q < 0)
		return;
	uint64_t m = mfind(b, b->id[pos], b->id[q]);
	if (m != EMPTY)
		heap_push(b->heap, hn, (m & 0xffffffff00000000ull) | (uint32_t)pos);
}

/* The merge loop over the N symbols already in b->id. */
static int
merge_loop(rli_bpe *b, rl_tokens *out, size_t n)
{
	size_t hn = 0;
	int rv;
	int32_t *id = b->id, *nxt = b->nxt, *prv = b->prv;
	for (size_t i = 0; i < n; i++) {
		nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
		prv[i] = (int32_t)i - 1;
	}
	for (size_t i = 0; i + 1 < n; i++)
		push_pair(b, &hn, (int32_t)i);
	while (hn) {
		uint64_t top = heap_pop(b->heap, &hn);
		int32_t pos = (int32_t)(uint32_t)top, q;
		if (id[pos] < 0 || (q = nxt[pos]) < 0)
			continue;
		/* Stale entries: the pair at POS changed since it was pushed. */
		uint64_t m = mfind(b, id[pos], id[q]);
		if (m == EMPTY || (m >> 32) != (top >> 32))
			continue;
		id[pos] = (int32_t)(uint32_t)m;
		id[q] = -1;
		nxt[pos] = nxt[q];
		if (nxt[q] >= 0)
			prv[nxt[q]] = pos;
		if (prv[pos] >= 0)
			push_pair(b, &hn, prv[pos]);
		push_pair(b, &hn, pos);
	}
	size_t k = 0;
	for (int32_t p = 0; p >= 0; p = nxt[p])
		k++;
	if ((rv = tokens_reserve(out, k)) != 0)
		return rv;
	for (int32_t p = 0; p >= 0; p = nxt[p])
		out->ids[out->n++] = id[p];
	return 0;
}

static int
merge(rli_bpe *b, rl_tokens *out, const uint8_t *s, size_t n)
{
	int rv;
	if ((rv = scratch(b, n)) != 0)
		return rv;
	for (size_t i = 0; i < n; i++)
		b->id[i] = b->byte_id[s[i]];
	return merge_loop(b, out, n);
}

int
rli_bpe_merge_ids(rli_bpe *b, rl_tokens *out, const int32_t *ids, size_t n)
{
	int rv;
	if (n == 0)
		return 0;
	if ((rv = scratch(b, n)) != 0)
		return rv;
	memcpy(b->id, ids, n * sizeof(int32_t));
	return merge_loop(b, out, n);
}

static void
cache_clear(rli_bpe *b)
{
	memset(b->slots, 0, CACHE_SLOTS * sizeof(centry));
	b->used = b->klen = b->ilen = 0;
}

static int
cache_put(rli_bpe *b, size_t slot, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t k)
{
	if (b->klen + n > b->kcap) {
		size_t c = b->kcap ? b->kcap * 2 : 1 << 16;
		while (c < b->klen + n)
			c *= 2;
		uint8_t *p = realloc(b->kbuf, c);
		if (!p)
			return RL_ENOMEM;
		b->kbuf = p;
		b->kcap = c;
	}
	if (b->ilen + k > b->icap) {
		size_t c = b->icap ? b->icap * 2 : 1 << 14;
		while (c < b->ilen + k)
			c *= 2;
		int32_t *p = realloc(b->ibuf, c * sizeof(int32_t));
		if (!p)
			return RL_ENOMEM;
		b->ibuf = p;
		b->icap = c;
	}
	centry *e = &b->slots[slot];
	e->hash = h;
	e->key = (uint32_t)b->klen;
	e->klen = (uint32_t)n;
	e->ids = (uint32_t)b->ilen;
	e->nids = (uint32_t)k;
	memcpy(b->kbuf + b->klen, s, n);
	b->klen += n;
	memcpy(b->ibuf + b->ilen, ids, k * sizeof(int32_t));
	b->ilen += k;
	b->used++;
	return 0;
}

int
rli_bpe_encode(rli_bpe *b, rl_tokens *out, const uint8_t *s, size_t n)
{
	int rv;
	if (n == 0)
		return 0;
	if (n == 1)
		return rli_tokens_push(out, b->byte_id[s[0]]);
	if (n > CACHE_MAX_PIECE)
		return merge(b, out, s, n);
	uint64_t h = hash_bytes(s, n);
	size_t slot = h & (CACHE_SLOTS - 1);
	for (;;) {
		centry *e = &b->slots[slot];
		if (!e->hash)
			break;
		if (e->hash == h && e->klen == n && memcmp(b->kbuf + e->key, s, n) == 0) {
			if ((rv = tokens_reserve(out, e->nids)) != 0)
				return rv;
			memcpy(out->ids + out->n, b->ibuf + e->ids, e->nids * sizeof(int32_t));
			out->n += e->nids;
			return 0;
		}
		slot = (slot + 1) & (CACHE_SLOTS - 1);
	}
	size_t before = out->n;
	if ((rv = merge(b, out, s, n)) != 0)
		return rv;
	if (b->used + 1 > CACHE_SLOTS / 4 * 3 || b->klen + n > CACHE_MAX_BYTES) {
		cache_clear(b);
		slot = h & (CACHE_SLOTS - 1);
	}
	/* A failed cache insert only costs speed. */
	(void)cache_put(b, slot, h, s, n, out->ids + before, out->n - before);
	return 0;
}

/*
 * groups.c — validated group assembly (see groups.h).
 *
 * Two open-addressing hash tables keyed by u64: the ids already accepted
 * (for idempotent redelivery) and the incomplete groups.  Complete groups go
 * to a FIFO in completion order.
 */
#include "train/groups.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

typedef struct u64set {
	uint64_t *k;
	uint8_t *used;
	size_t cap, n;
} u64set;

typedef struct gslot {
	uint64_t key;
	int used;         /* 0 empty, 1 live, 2 tombstone */
	rl_group g;
	int bad;          /* a member was bad: drop the group when complete */
} gslot;

#define RL_WHY_LEN 192

struct rl_grouper {
	rl_grouper_opts o;
	char why[RL_WHY_LEN];  /* extract's description of a bad record */
	rl_grouper_stats st;
	u64set ids;
	gslot *gt;
	size_t gcap, glive, gtomb;
	rl_group *done;   /* FIFO of complete groups */
	size_t dhead, dn, dcap;
};

/* Not base/hash.h's rl_hash_mix: rl_grouper_finish walks the group table in
 * slot order, so the hash decides the order of its "incomplete at the end of
 * the input" warnings; this one keeps that order as it is. */
static uint64_t
hash64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

static int
set_grow(u64set *s)
{
	size_t ncap = s->cap ? s->cap * 2 : 1024;
	uint64_t *k = calloc(ncap, sizeof *k);
	uint8_t *u = calloc(ncap, 1);

	if (!k || !u) {
		free(k);
		free(u);
		return RL_ENOMEM;
	}
	for (size_t i = 0; i < s->cap; i++) {
		if (!s->used[i])
			continue;
		size_t j = hash64(s->k[i]) & (ncap - 1);
		while (u[j])
			j = (j + 1) & (ncap - 1);
		u[j] = 1;
		k[j] = s->k[i];
	}
	free(s->k);
	free(s->used);
	s->k = k;
	s->used = u;
	s->cap = ncap;
	return RL_OK;
}

/* 1 if present, 0 if inserted now, <0 on error */
static int
set_insert(u64set *s, uint64_t key)
{
	if ((s->n + 1) * 2 > s->cap && set_grow(s) != RL_OK)
		return -1;
	size_t j = hash64(key) & (s->cap - 1);
	while (s->used[j]) {
		if (s->k[j] == key)
			return 1;
		j = (j + 1) & (s->cap - 1);
	}
	s->used[j] = 1;
	s->k[j] = key;
	s->n++;
	return 0;
}

void
rl_sample_fini(rl_sample *s)
{
	if (!s)
		return;
	free(s->prompt);
	free(s->response);
	free(s->logprobs);
	free(s->ref_logprobs);
	free(s->values);
	free(s->loss_mask);
	free(s->token_rewards);
	memset(s, 0, sizeof *s);
}

void
rl_group_fini(rl_group *g)
{
	if (!g || !g->s)
		return;
	for (int i = 0; i < g->size; i++)
		rl_sample_fini(&g->s[i]);
	free(g->s);
	g->s = NULL;
}

int
rl_grouper_create(rl_grouper **out, const rl_grouper_opts *o)
{
	rl_grouper *g = rl_xcalloc(1, sizeof *g);

	if (o)
		g->o = *o;
	if (g->o.max_open_groups <= 0)
		g->o.max_open_groups = 65536;
	g->gcap = 256;
	g->gt = rl_xcalloc(g->gcap, sizeof *g->gt);
	*out = g;
	return RL_OK;
}

void
rl_grouper_destroy(rl_grouper *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->gcap; i++)
		if (g->gt[i].used == 1)
			rl_group_fini(&g->gt[i].g);
	for (size_t i = 0; i < g->dn; i++)
		rl_group_fini(&g->done[(g->dhead + i) % g->dcap]);
	free(g->done);
	free(g->gt);
	free(g->ids.k);
	free(g->ids.used);
	free(g);
}

static gslot *
gfind(rl_grouper *g, uint64_t key, int create)
{
	size_t j = hash64(key) & (g->gcap - 1);
	gslot *tomb = NULL;

	for (;;) {
		gslot *s = &g->gt[j];
		if (s->used == 0)
			break;
		if (s->used == 1 && s->key == key)
			return s;
		if (s->used == 2 && !tomb)
			tomb = s;
		j = (j + 1) & (g->gcap - 1);
	}
	if (!create)
		return NULL;
	gslot *s = tomb ? tomb : &g->gt[j];
	if (tomb)
		g->gtomb--;
	memset(s, 0, sizeof *s);
	s->used = 1;
	s->key = key;
	g->glive++;
	return s;
}

static int
grehash(rl_grouper *g)
{
	size_t ocap = g->gcap;
	gslot *old = g->gt;

	g->gcap = (g->glive + 1) * 4 > ocap ? ocap * 2 : ocap;
	g->gt = calloc(g->gcap, sizeof *g->gt);
	if (!g->gt) {
		g->gt = old;
		g->gcap = ocap;
		return RL_ENOMEM;
	}
	g->glive = g->gtomb = 0;
	for (size_t i = 0; i < ocap; i++)
		if (old[i].used == 1)
			*gfind(g, old[i].key, 1) = old[i];
	free(old);
	return RL_OK;
}

static void
gremove(rl_grouper *g, gslot *s)
{
	s->used = 2;
	g->glive--;
	g->gtomb++;
}

static int
push_done(rl_grouper *g, rl_group *grp)
{
	if (g->dn == g->dcap) {
		size_t ncap = g->dcap ? g->dcap * 2 : 16;
		rl_group *d = malloc(ncap * sizeof *d);
		if (!d)
			return RL_ENOMEM;
		for (size_t i = 0; i < g->dn; i++)
			d[i] = g->done[(g->dhead + i) % g->dcap];
		free(g->done);
		g->done = d;
		g->dcap = ncap;
		g->dhead = 0;
	}
	g->done[(g->dhead + g->dn) % g->dcap] = *grp;
	g->dn++;
	return RL_OK;
}

static int
bad(rl_grouper *g, const char *where, uint64_t id, const char *why)
{
	g->st.bad_records++;
	if (g->o.on_bad == RL_BAD_ERROR) {
		rl_error("%s (id %llu): %s", where, (unsigned long long)id, why);
		rl_hint("--on-bad skip drops such groups and counts them");
		return RL_EFORMAT;
	}
	/* said, not only counted: the first ten, then one in a thousand */
	if (g->st.bad_records <= 10 || g->st.bad_records % 1000 == 0)
		rl_warn("%s (id %llu): %s; its group is dropped (%llu bad records so far%s)", where,
			(unsigned long long)id, why, (unsigned long long)g->st.bad_records,
			g->st.bad_records == 10 ? "; from now on one in 1000 is shown" : "");
	else
		rl_verbose("%s (id %llu): %s; group dropped", where, (unsigned long long)id, why);
	return RL_OK;
}

static int
dup_arr(void **dst, const void *src, size_t n, size_t elt)
{
	*dst = rl_try_malloc(n * elt, "record array");
	if (!*dst)
		return RL_ENOMEM;
	if (n)
		memcpy(*dst, src, n * elt);
	return RL_OK;
}

static int
all_finite(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

/* Fills s from t; returns NULL on success or a description of what is wrong
 * (static, or in why, RL_WHY_LEN bytes). */
static const char *
extract(rl_sample *s, const rl_traj *t, const rl_grouper_opts *o, char *why, int *rvp)
{
	const int32_t *p, *r;
	const float *lp;
	size_t np, nr, nl;
	int32_t i32;
	int rv;
	const char *str;

	*rvp = RL_OK;
	memset(s, 0, sizeof *s);
	if (o->sft && !rl_traj_has(t, RL_TAG_GROUP)) {
		rl_traj_get_u64(t, RL_TAG_ID, &s->group);
		s->index = 0;
		s->group_size = 1;
	} else {
		if (rl_traj_get_u64(t, RL_TAG_GROUP, &s->group) != RL_OK)
			return "no 'group' field";
		if (rl_traj_get_i32(t, RL_TAG_INDEX, &i32) != RL_OK)
			return "no 'index' field";
		s->index = i32;
		if (rl_traj_get_i32(t, RL_TAG_GROUP_SIZE, &i32) != RL_OK)
			return "no 'group_size' field";
		s->group_size = i32;
	}
	if (s->group_size < 1 || s->group_size > 65536) {
		s->group_size = 0;   /* no group to hold it: the record alone is bad */
		return "'group_size' out of range 1..65536";
	}
	if (s->index < 0 || s->index >= s->group_size)
		return "'index' outside 0..group_size-1";
	if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &p, &np) != RL_OK)
		return "no 'prompt' token ids (i32 array)";
	if (rl_traj_get_i32s(t, RL_TAG_RESPONSE, &r, &nr) != RL_OK)
		return "no 'response' token ids (i32 array)";
	if (np < 1)
		return "empty 'prompt' (its first token is never predicted)";
	if (o->max_tokens > 0 && np + nr > (size_t)o->max_tokens) {
		snprintf(why, RL_WHY_LEN, "%zu prompt + %zu response tokens exceed %d (the model's positions, "
		    "or --max-tokens-per-micro or --micro-tokens, + 1)", np, nr, o->max_tokens);
		return why;
	}
	if (o->vocab > 0) {
		for (size_t k = 0; k < np + nr; k++) {
			int32_t id = k < np ? p[k] : r[k - np];
			if (id < 0 || id >= o->vocab) {
				snprintf(why, RL_WHY_LEN, "token id %d at '%s' index %zu is outside the vocabulary "
				    "(0..%d)", (int)id, k < np ? "prompt" : "response", k < np ? k : k - np, o->vocab - 1);
				return why;
			}
		}
	}
	rv = rl_traj_get_f32(t, RL_TAG_REWARD, &s->reward);
	if (rv == RL_ENOENT && o->sft)
		rv = RL_OK, s->reward = 0;
	if (rv != RL_OK)
		return rv == RL_ENOENT ? "no 'reward' (was it scored by rl-reward?)" : "'reward' is not a number";
	if (!isfinite(s->reward))
		return "'reward' is NaN or infinite (a failed reward program?)";
	if (rl_traj_get_f32s(t, RL_TAG_LOGPROBS, &lp, &nl) == RL_OK) {
		if (nl != nr)
			return "'logprobs' length differs from 'response' length";
		if (!all_finite(lp, nl))
			return "'logprobs' holds NaN or infinite values";
		if ((*rvp = dup_arr((void **)&s->logprobs, lp, nl, sizeof *lp)) != RL_OK)
			return "out of memory";
	} else if (o->need_logprobs) {
		return "no behaviour 'logprobs'";
	}
	if (rl_traj_get_f32s(t, RL_TAG_REF_LOGPROBS, &lp, &nl) == RL_OK) {
		if (nl != nr)
			return "'ref_logprobs' length differs from 'response' length";
		if (!all_finite(lp, nl))
			return "'ref_logprobs' holds NaN or infinite values";
		if ((*rvp = dup_arr((void **)&s->ref_logprobs, lp, nl, sizeof *lp)) != RL_OK)
			return "out of memory";
	} else if (o->need_ref) {
		return "no 'ref_logprobs' (run rl-rollout --score ref_logprobs, or give rl-train --ref)";
	}
	if (rl_traj_get_f32s(t, RL_TAG_VALUES, &lp, &nl) == RL_OK) {
		if (nl != nr)
			return "'values' length differs from 'response' length";
		if (!all_finite(lp, nl))
			return "'values' holds NaN or infinite values";
		if ((*rvp = dup_arr((void **)&s->values, lp, nl, sizeof *lp)) != RL_OK)
			return "out of memory";
	}
	if (rl_traj_get_f32s(t, RL_TAG_TOKEN_REWARDS, &lp, &nl) == RL_OK) {
		if (nl != nr)
			return "'token_rewards' length differs from 'response' length";
		if (!all_finite(lp, nl))
			return "'token_rewards' holds NaN or infinite values";
		if ((*rvp = dup_arr((void **)&s->token_rewards, lp, nl, sizeof *lp)) != RL_OK)
			return "out of memory";
	}
	{
		const uint8_t *mk;
		size_t nm;
		if (rl_traj_get_u8s(t, RL_TAG_LOSS_MASK, &mk, &nm) == RL_OK) {
			if (nm != nr)
				return "'loss_mask' length differs from 'response' length";
			for (size_t k = 0; k < nm; k++)
				if (mk[k] > 1)
					return "'loss_mask' holds a value other than 0 and 1";
			if ((*rvp = dup_arr((void **)&s->loss_mask, mk, nm, sizeof *mk)) != RL_OK)
				return "out of memory";
		}
	}
	if ((*rvp = dup_arr((void **)&s->prompt, p, np, sizeof *p)) != RL_OK ||
	    (*rvp = dup_arr((void **)&s->response, r, nr, sizeof *r)) != RL_OK)
		return "out of memory";
	s->plen = (int)np;
	s->rlen = (int)nr;
	s->temperature = 1.0f;
	if (rl_traj_get_f32(t, RL_TAG_TEMPERATURE, &s->temperature) == RL_OK) {
		if (!isfinite(s->temperature) || s->temperature < 0)
			return "'temperature' is NaN, infinite or negative";
		if (s->temperature == 0)
			s->temperature = 1.0f; /* greedy samples: log-probs at temperature 1 */
	}
	s->ver_first = s->ver_last = -1;
	rl_traj_get_version(t, &s->ver_first, &s->ver_last);
	if (rl_traj_get_str(t, RL_TAG_FINISH, &str, NULL) == RL_OK)
		snprintf(s->finish, sizeof s->finish, "%s", str);
	if (rl_traj_get_str(t, RL_TAG_META, &str, NULL) == RL_OK && strstr(str, "\"baseline\":true"))
		s->is_baseline = 1;
	return NULL;
}

int
rl_grouper_add(rl_grouper *g, const rl_traj *t, const char *where)
{
	return rl_grouper_add_at(g, t, where, 0);
}

int
rl_grouper_add_at(rl_grouper *g, const rl_traj *t, const char *where, uint64_t pos)
{
	rl_sample s;
	uint64_t id = 0;
	const char *why;
	gslot *slot;
	int rv, seen;

	g->st.records++;
	if (rl_traj_get_u64(t, RL_TAG_ID, &id) != RL_OK)
		return bad(g, where, 0, "no 'id' field");
	why = extract(&s, t, &g->o, g->why, &rv);
	if (rv != RL_OK) {
		rl_sample_fini(&s);
		return rv;
	}
	seen = set_insert(&g->ids, id);
	if (seen < 0) {
		rl_sample_fini(&s);
		return RL_ENOMEM;
	}
	if (seen) {
		g->st.duplicates++;
		rl_sample_fini(&s);
		return RL_OK;
	}
	s.id = id;
	s.pos = pos;
	if (why && s.group_size == 0) {
		/* cannot even tell which group: nothing to drop but the record */
		rl_sample_fini(&s);
		return bad(g, where, id, why);
	}
	if ((g->glive + g->gtomb + 1) * 2 > g->gcap && grehash(g) != RL_OK) {
		rl_sample_fini(&s);
		return RL_ENOMEM;
	}
	slot = gfind(g, s.group, 0);
	if (!slot) {
		if ((int)g->glive >= g->o.max_open_groups) {
			rl_sample_fini(&s);
			rl_error("%s: more than %d incomplete groups held at once", where, g->o.max_open_groups);
			rl_hint("are group ids and group_size consistent? records of a group must all arrive");
			return RL_ETOOBIG;
		}
		slot = gfind(g, s.group, 1);
		slot->g.group = s.group;
		slot->g.size = s.group_size;
		slot->g.s = rl_try_calloc((size_t)s.group_size, sizeof(rl_sample), "group");
		if (!slot->g.s) {
			gremove(g, slot);
			rl_sample_fini(&s);
			return RL_ENOMEM;
		}
	}
	if (!why && s.group_size != slot->g.size)
		why = "'group_size' differs from other samples of its group";
	if (!why && slot->g.s[s.index].response)
		why = "two samples with the same group and index but different ids";
	if (why) {
		int idx = s.index;
		rl_sample_fini(&s);
		if ((rv = bad(g, where, id, why)) != RL_OK)
			return rv;
		slot->bad = 1;
		/* the group still completes (counted) so its other samples are dropped too */
		if (idx >= 0 && idx < slot->g.size && !slot->g.s[idx].response) {
			slot->g.s[idx].response = rl_xmalloc(1);
			slot->g.s[idx].pos = pos;
			slot->g.n++;
		}
	} else {
		slot->g.s[s.index] = s;
		slot->g.n++;
	}
	if (slot->g.n == slot->g.size) {
		rl_group grp = slot->g;
		int isbad = slot->bad;
		gremove(g, slot);
		if (isbad) {
			uint64_t id = grp.group;
			g->st.bad_groups++;
			rl_group_fini(&grp);
			return g->o.on_bad_group ? g->o.on_bad_group(g->o.ctx, id) : RL_OK;
		}
		g->st.groups_out++;
		return push_done(g, &grp);
	}
	return RL_OK;
}

int
rl_grouper_group_of(const rl_grouper *g, const rl_traj *t, uint64_t *group)
{
	if (g->o.sft && !rl_traj_has(t, RL_TAG_GROUP))
		return rl_traj_get_u64(t, RL_TAG_ID, group) == RL_OK ? RL_OK : RL_ENOENT;
	return rl_traj_get_u64(t, RL_TAG_GROUP, group) == RL_OK ? RL_OK : RL_ENOENT;
}

int
rl_grouper_pending_groups(const rl_grouper *g, rl_gset *out)
{
	for (size_t i = 0; i < g->gcap; i++)
		if (g->gt[i].used == 1 && rl_gset_add(out, g->gt[i].key) != RL_OK)
			return RL_ENOMEM;
	for (size_t i = 0; i < g->dn; i++)
		if (rl_gset_add(out, g->done[(g->dhead + i) % g->dcap].group) != RL_OK)
			return RL_ENOMEM;
	return RL_OK;
}

int
rl_grouper_pop(rl_grouper *g, rl_group *out)
{
	if (g->dn == 0)
		return RL_ENOENT;
	*out = g->done[g->dhead];
	g->dhead = (g->dhead + 1) % g->dcap;
	g->dn--;
	return RL_OK;
}

int
rl_grouper_finish(rl_grouper *g)
{
	int n = 0;

	for (size_t i = 0; i < g->gcap; i++) {
		gslot *s = &g->gt[i];
		if (s->used != 1)
			continue;
		rl_warn("group %llu is incomplete at the end of the input: %d of %d samples; dropped",
		    (unsigned long long)s->key, s->g.n, s->g.size);
		rl_group_fini(&s->g);
		gremove(g, s);
		n++;
	}
	g->st.incomplete += n;
	return n;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int
pending_add(const rl_group *grp, uint64_t **pos, size_t *n, size_t *cap)
{
	for (int i = 0; i < grp->size; i++) {
		if (!grp->s[i].response || !grp->s[i].pos)
			continue;
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 64;
			uint64_t *np = realloc(*pos, nc * sizeof *np);
			if (!np)
				return RL_ENOMEM;
			*pos = np;
			*cap = nc;
		}
		(*pos)[(*n)++] = grp->s[i].pos;
	}
	return RL_OK;
}

int
rl_grouper_pending(const rl_grouper *g, uint64_t **pos, size_t *n)
{
	size_t cap = 0;
	int rv = RL_OK;

	*pos = NULL;
	*n = 0;
	for (size_t i = 0; rv == RL_OK && i < g->gcap; i++)
		if (g->gt[i].used == 1)
			rv = pending_add(&g->gt[i].g, pos, n, &cap);
	for (size_t i = 0; rv == RL_OK && i < g->dn; i++)
		rv = pending_add(&g->done[(g->dhead + i) % g->dcap], pos, n, &cap);
	if (rv != RL_OK) {
		free(*pos);
		*pos = NULL;
		*n = 0;
		return rv;
	}
	if (*n)
		qsort(*pos, *n, sizeof **pos, cmp_u64);
	return RL_OK;
}

const rl_grouper_stats *rl_grouper_stats_get(const rl_grouper *g) { return &g->st; }

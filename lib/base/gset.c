/*
 * gset.c — sets of u64 ids as ranges (see gset.h).  Lookup is a binary
 * search; adding an id merges it into its neighbours, so a counter's ids stay
 * one range whatever the order they come in.
 */
#include "base/gset.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

void
rl_gset_init(rl_gset *s)
{
	memset(s, 0, sizeof *s);
}

void
rl_gset_fini(rl_gset *s)
{
	if (!s)
		return;
	free(s->r);
	memset(s, 0, sizeof *s);
}

static int
reserve(rl_gset *s, size_t need)
{
	if (need <= s->cap)
		return RL_OK;
	size_t nc = s->cap ? s->cap : 16;
	while (nc < need)
		nc *= 2;
	void *np = realloc(s->r, nc * sizeof *s->r);
	if (!np)
		return RL_ENOMEM;
	s->r = np;
	s->cap = nc;
	return RL_OK;
}

/* The index of the first range whose lo is > id (n when none). */
static size_t
upper(const rl_gset *s, uint64_t id)
{
	size_t a = 0, b = s->n;
	while (a < b) {
		size_t m = a + (b - a) / 2;
		if (s->r[m][0] <= id)
			a = m + 1;
		else
			b = m;
	}
	return a;
}

int
rl_gset_has(const rl_gset *s, uint64_t id)
{
	size_t i = upper(s, id);
	return i > 0 && id <= s->r[i - 1][1];
}

int
rl_gset_add(rl_gset *s, uint64_t id)
{
	size_t i = upper(s, id);
	int join_prev = i > 0 && s->r[i - 1][1] >= id - 1 && id > 0;
	int join_next = i < s->n && s->r[i][0] == id + 1;

	if (i > 0 && id <= s->r[i - 1][1])
		return RL_OK;
	if (join_prev && join_next) {
		s->r[i - 1][1] = s->r[i][1];
		memmove(&s->r[i], &s->r[i + 1], (s->n - i - 1) * sizeof *s->r);
		s->n--;
	} else if (join_prev) {
		s->r[i - 1][1] = id;
	} else if (join_next) {
		s->r[i][0] = id;
	} else {
		if (reserve(s, s->n + 1) != RL_OK)
			return RL_ENOMEM;
		memmove(&s->r[i + 1], &s->r[i], (s->n - i) * sizeof *s->r);
		s->r[i][0] = s->r[i][1] = id;
		s->n++;
	}
	return RL_OK;
}

static int
cmp_range(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts the ranges and merges those that overlap or touch. */
static void
normalize(rl_gset *s)
{
	size_t k = 0;

	if (s->n < 2)
		return;
	qsort(s->r, s->n, sizeof *s->r, cmp_range);
	for (size_t i = 1; i < s->n; i++) {
		if (s->r[k][1] == UINT64_MAX || s->r[i][0] <= s->r[k][1] + 1) {
			if (s->r[i][1] > s->r[k][1])
				s->r[k][1] = s->r[i][1];
		} else {
			k++;
			s->r[k][0] = s->r[i][0];
			s->r[k][1] = s->r[i][1];
		}
	}
	s->n = k + 1;
}

int
rl_gset_add_all(rl_gset *s, const rl_gset *src)
{
	if (src->n == 0)
		return RL_OK;
	if (reserve(s, s->n + src->n) != RL_OK)
		return RL_ENOMEM;
	memcpy(&s->r[s->n], src->r, src->n * sizeof *s->r);
	s->n += src->n;
	normalize(s);
	return RL_OK;
}

uint64_t
rl_gset_count(const rl_gset *s)
{
	uint64_t c = 0;
	for (size_t i = 0; i < s->n; i++) {
		uint64_t w = s->r[i][1] - s->r[i][0];
		if (w == UINT64_MAX || c > UINT64_MAX - w - 1)
			return UINT64_MAX;
		c += w + 1;
	}
	return c;
}

cJSON *
rl_gset_to_json(const rl_gset *s)
{
	cJSON *a = cJSON_CreateArray();
	char buf[48];

	for (size_t i = 0; a && i < s->n; i++) {
		cJSON *e;
		if (s->r[i][0] == s->r[i][1])
			snprintf(buf, sizeof buf, "%" PRIu64, s->r[i][0]);
		else
			snprintf(buf, sizeof buf, "%" PRIu64 "-%" PRIu64, s->r[i][0], s->r[i][1]);
		if (!(e = cJSON_CreateString(buf)) || !cJSON_AddItemToArray(a, e)) {
			cJSON_Delete(e);
			cJSON_Delete(a);
			return NULL;
		}
	}
	return a;
}

/* A decimal u64 at *p (digits only, no sign, no overflow); advances *p. */
static int
parse_u64(const char **p, uint64_t *out)
{
	const char *s = *p;
	uint64_t v = 0;

	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*p = s;
	*out = v;
	return 0;
}

int
rl_gset_from_json(rl_gset *s, const cJSON *a, const char *where)
{
	const cJSON *e;
	size_t k = 0;

	if (!cJSON_IsArray(a)) {
		rl_error("%s: not an array of id ranges", where);
		return RL_EFORMAT;
	}
	if (reserve(s, s->n + (size_t)cJSON_GetArraySize(a)) != RL_OK)
		return RL_ENOMEM;
	cJSON_ArrayForEach(e, a) {
		const char *p = cJSON_GetStringValue(e);
		uint64_t lo, hi;
		if (!p || parse_u64(&p, &lo) != 0) {
			rl_error("%s: element %zu: not \"N\" or \"LO-HI\" (decimal ids from 0 to 2^64-1)", where, k);
			return RL_EFORMAT;
		}
		hi = lo;
		if (*p == '-') {
			p++;
			if (parse_u64(&p, &hi) != 0 || hi < lo) {
				rl_error("%s: element %zu: not \"N\" or \"LO-HI\" with LO <= HI", where, k);
				return RL_EFORMAT;
			}
		}
		if (*p) {
			rl_error("%s: element %zu: trailing characters after the range", where, k);
			return RL_EFORMAT;
		}
		s->r[s->n][0] = lo;
		s->r[s->n][1] = hi;
		s->n++;
		k++;
	}
	normalize(s);
	return RL_OK;
}

/*
 * tensor.c — the tensor table (see tensor.h).
 */
#include "model/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

int
rl_ttable_add(rl_ttable *tt, const char *name, unsigned flags, int64_t d0, int64_t d1)
{
	rl_tensor *t;
	size_t off = tt->total;

	if (tt->n == tt->cap) {
		tt->cap = tt->cap ? 2 * tt->cap : 64;
		tt->t = realloc(tt->t, (size_t)tt->cap * sizeof *tt->t);
		if (tt->t == NULL) {
			fprintf(stderr, "%s: out of memory (tensor table)\n", rl_log_prog());
			abort();
		}
	}
	t = &tt->t[tt->n];
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->ndim = d1 > 0 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1 > 0 ? d1 : 1;
	t->n = (size_t)d0 * (size_t)t->shape[1];
	t->flags = flags;
	if ((flags & RL_T_FOLLOWS) && tt->n > 0)
		off = tt->t[tt->n - 1].off + tt->t[tt->n - 1].n;
	t->off = off;
	tt->total = (off + t->n + RL_TT_ALIGN - 1) / RL_TT_ALIGN * RL_TT_ALIGN;
	return tt->n++;
}

int
rl_ttable_find(const rl_ttable *tt, const char *name)
{
	for (int i = 0; i < tt->n; i++)
		if (strcmp(tt->t[i].name, name) == 0)
			return i;
	return -1;
}

void
rl_ttable_fini(rl_ttable *tt)
{
	free(tt->t);
	memset(tt, 0, sizeof *tt);
}

int
rl_tensor_file_shape(const rl_tensor *t, int64_t shape[2])
{
	if (t->ndim == 2 && (t->flags & RL_T_TRANSPOSE)) {
		shape[0] = t->shape[1];
		shape[1] = t->shape[0];
	} else {
		shape[0] = t->shape[0];
		shape[1] = t->shape[1];
	}
	return t->ndim;
}

/*
 * ckpt_shard.c — AdamW state saved per shard (ckpt.h): each data-parallel
 * rank writes the moments of its flat range of the parameter space as
 * optimizer-RRRRR-of-WWWWW.safetensors, beside the index that rank 0's
 * optimizer.safetensors becomes; a resumed run reads any flat range back
 * from the pieces, whatever world size wrote them, after checking that they
 * belong together (one checkpoint id, one step, ranges tiling the space, the
 * same tensor layout).
 * Leaves out: which range a rank owns (the trainer's rl_comm_shard), the
 * atomic step directory itself (ckpt.c).
 */
#include "model/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model_int.h"
#include "model/safetensors.h"

char *
rli_ckpt_layout_json(const rl_model *m)
{
	cJSON *a = cJSON_CreateArray();
	char *s;

	for (int i = 0; a && i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		cJSON *e = cJSON_CreateArray();
		cJSON_AddItemToArray(e, cJSON_CreateString(t->name));
		cJSON_AddItemToArray(e, cJSON_CreateNumber((double)t->off));
		cJSON_AddItemToArray(e, cJSON_CreateNumber((double)t->n));
		cJSON *sh = cJSON_CreateArray();
		for (int d = 0; d < t->ndim; d++)
			cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
		cJSON_AddItemToArray(e, sh);
		cJSON_AddItemToArray(e, cJSON_CreateBool(!!(t->flags & RL_T_TRANSPOSE)));
		cJSON_AddItemToArray(a, e);
	}
	s = a ? cJSON_PrintUnformatted(a) : NULL;
	cJSON_Delete(a);
	return s;
}

char *
rli_ckpt_meta(const rl_st_file *f, const char *key)
{
	const uint8_t *hp = f->map;
	uint64_t hl = 0;
	char *out = NULL;
	cJSON *root, *s;

	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | hp[i];
	root = cJSON_ParseWithLength((const char *)hp + 8, (size_t)hl);
	s = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), key);
	if (cJSON_IsString(s))
		out = rl_xstrdup(s->valuestring);
	cJSON_Delete(root);
	return out;
}

typedef struct shard_ctx {
	rl_model *m;
	const float *d[2];      /* backend memory: exp_avg, exp_avg_sq of the range */
} shard_ctx;

static int
shard_fill(void *vctx, int e, void *out, size_t nbytes)
{
	shard_ctx *c = vctx;

	c->m->ops->download(c->m->ops, out, c->d[e], nbytes);
	return c->m->ops->status(c->m->ops);
}

int
rl_ckpt_write_opt_shard(rl_model *m, const char *dir, const rl_ckpt_shards *sh, int rank, size_t lo, size_t hi,
    const float *dm, const float *dv)
{
	char name[64], *path, *tmp, step[32], ver[32], id[32], world[16], rk[16], off[32], end[32], tot[32];
	const char *meta[] = { "format", "pt", "step", step, "version", ver, "checkpoint_id", id, "world", world,
		"rank", rk, "offset", off, "end", end, "flat_numel", tot };
	rl_st_entry e[2] = { { "exp_avg", RL_F32, 1, { (int64_t)(hi - lo) } },
		{ "exp_avg_sq", RL_F32, 1, { (int64_t)(hi - lo) } } };
	shard_ctx c = { m, { dm, dv } };
	size_t n;
	int rv;

	snprintf(name, sizeof name, RL_CKPT_OPT_SHARD_FMT, rank, sh->world);
	snprintf(step, sizeof step, "%d", m->step);
	snprintf(ver, sizeof ver, "%d", m->version);
	snprintf(id, sizeof id, "%016" PRIx64, sh->id);
	snprintf(world, sizeof world, "%d", sh->world);
	snprintf(rk, sizeof rk, "%d", rank);
	snprintf(off, sizeof off, "%zu", lo);
	snprintf(end, sizeof end, "%zu", hi);
	snprintf(tot, sizeof tot, "%zu", m->tt.total);
	n = strlen(dir) + sizeof name + 40;
	path = rl_xmalloc(n);
	tmp = rl_xmalloc(n);
	snprintf(path, n, "%s/%s", dir, name);
	/* a reader never sees a part-written shard under its name */
	snprintf(tmp, n, "%s/.%s.tmp.%ld", dir, name, (long)getpid());
	if ((rv = rl_st_write(tmp, e, 2, meta, 9, shard_fill, &c)) == 0 && rename(tmp, path) != 0) {
		rl_error("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
		rv = RL_EIO;
	}
	if (rv != 0)
		unlink(tmp);
	else
		rli_ckpt_fsync_path(dir);
	free(path);
	free(tmp);
	return rv;
}

int
rl_ckpt_opt_sharded(const char *dir, int *world)
{
	char *p = rl_xmalloc(strlen(dir) + 32), *w = NULL;
	rl_st_file *f = NULL;
	int rv;

	*world = 0;
	sprintf(p, "%s/optimizer.safetensors", dir);
	if ((rv = rl_st_open(&f, p)) == 0 && (w = rli_ckpt_meta(f, "zero_shards")) != NULL)
		*world = atoi(w);
	free(w);
	free(p);
	rl_st_close(f);
	return rv;
}

/* A metadata value of f as a size; -1 when missing or not a number. */
static long long
meta_num(const rl_st_file *f, const char *key)
{
	char *s = rli_ckpt_meta(f, key), *end;
	long long v = -1;

	if (s != NULL) {
		errno = 0;
		v = strtoll(s, &end, 10);
		if (errno || end == s || *end || v < 0)
			v = -1;
	}
	free(s);
	return v;
}

/* What every shard must agree on, from the index. */
typedef struct shard_want {
	const char *dir;
	char *id;
	long long step, version, world, total;
} shard_want;

/* Checks shard k's header against the index and the range before it
 * (*expect: where it must start); copies its overlap with [lo, hi). */
static int
read_one(rl_model *m, const shard_want *w, int k, size_t lo, size_t hi, float *dm, float *dv, size_t *expect,
    float *buf, size_t piece)
{
	char name[64], *path, *id = NULL;
	rl_st_file *f = NULL;
	long long a, b;
	int rv = RL_OK;

	snprintf(name, sizeof name, RL_CKPT_OPT_SHARD_FMT, k, (int)w->world);
	path = rl_xmalloc(strlen(w->dir) + sizeof name + 2);
	sprintf(path, "%s/%s", w->dir, name);
	if (access(path, R_OK) != 0) {
		rl_error("'%s' is missing: the checkpoint in '%s' was saved by %lld ranks, one optimizer shard each",
		    path, w->dir, w->world);
		rl_hint("copy every optimizer-*-of-%05lld.safetensors of that step, or resume from another checkpoint",
		    w->world);
		rv = RL_ENOENT;
		goto out;
	}
	if ((rv = rl_st_open(&f, path)) != 0)
		goto out;
	id = rli_ckpt_meta(f, "checkpoint_id");
	if (!id || strcmp(id, w->id) != 0 || meta_num(f, "step") != w->step || meta_num(f, "version") != w->version) {
		rl_error("'%s' is from another checkpoint: id %s, step %lld, AdamW step %lld; its "
		    "optimizer.safetensors says id %s, step %lld, AdamW step %lld", path, id ? id : "(none)",
		    meta_num(f, "version"), meta_num(f, "step"), w->id, w->version, w->step);
		rl_hint("a step directory must hold the shards written with it, not copies from another run or step");
		rv = RL_EINVAL;
		goto out;
	}
	a = meta_num(f, "offset");
	b = meta_num(f, "end");
	if (meta_num(f, "world") != w->world || meta_num(f, "rank") != k || meta_num(f, "flat_numel") != w->total ||
	    a != (long long)*expect || b < a || b > w->total) {
		rl_error("'%s': world %lld, rank %lld, range [%lld, %lld) of %lld; expected world %lld, rank %d, a range "
		    "starting at %zu of %lld", path, meta_num(f, "world"), meta_num(f, "rank"), a, b,
		    meta_num(f, "flat_numel"), w->world, k, *expect, w->total);
		rv = RL_EFORMAT;
		goto out;
	}
	for (int j = 0; j < 2; j++) {
		const rl_st_tensor *t = rl_st_find(f, j ? "exp_avg_sq" : "exp_avg");
		if (!t || t->dtype != RL_F32 || t->nelem != (size_t)(b - a)) {
			rl_error("'%s': tensor '%s' %s", path, j ? "exp_avg_sq" : "exp_avg", t ? "has the wrong shape or "
			    "dtype" : "is missing");
			rv = t ? RL_ESHAPE : RL_ENOENT;
			goto out;
		}
		/* the overlap of [a, b) with [lo, hi), in host pieces */
		for (size_t x = RL_MAX((size_t)a, lo); x < RL_MIN((size_t)b, hi); x += piece) {
			size_t len = RL_MIN(piece, RL_MIN((size_t)b, hi) - x);
			if ((rv = rl_st_to_f32(buf, t, x - (size_t)a, len)) != 0)
				goto out;
			m->ops->upload(m->ops, (j ? dv : dm) + (x - lo), buf, len * sizeof(float));
		}
	}
	*expect = (size_t)b;
	rv = m->ops->status(m->ops);
out:
	free(id);
	free(path);
	rl_st_close(f);
	return rv;
}

int
rl_ckpt_read_opt_range(rl_model *m, const char *dir, size_t lo, size_t hi, float *dm, float *dv)
{
	char *p = rl_xmalloc(strlen(dir) + 32), *lay = NULL, *mine = NULL;
	const size_t piece = (size_t)1 << 20;
	shard_want w = { dir, NULL, 0, 0, 0, 0 };
	rl_st_file *f = NULL;
	float *buf = NULL;
	size_t expect = 0;
	int rv;

	sprintf(p, "%s/optimizer.safetensors", dir);
	if ((rv = rl_st_open(&f, p)) != 0)
		goto out;
	w.id = rli_ckpt_meta(f, "checkpoint_id");
	w.step = meta_num(f, "step");
	w.version = meta_num(f, "version");
	w.world = meta_num(f, "zero_shards");
	w.total = meta_num(f, "flat_numel");
	lay = rli_ckpt_meta(f, "flat_layout");
	if (!w.id || w.step < 0 || w.version < 0 || w.world < 1 || w.total < 0 || !lay) {
		rl_error("'%s': not the index of a sharded optimizer state (needs checkpoint_id, step, version, "
		    "zero_shards, flat_numel and flat_layout in __metadata__)", p);
		rv = RL_EFORMAT;
		goto out;
	}
	mine = rli_ckpt_layout_json(m);
	if (!mine || (size_t)w.total != m->tt.total || strcmp(lay, mine) != 0 || hi > m->tt.total || lo > hi) {
		rl_error("'%s': the optimizer shards were saved for another parameter layout (%lld elements; this "
		    "model has %zu): another model or value head", p, w.total, m->tt.total);
		rv = RL_ESHAPE;
		goto out;
	}
	if (!(buf = rl_try_malloc(piece * sizeof(float), "optimizer shard piece"))) {
		rv = RL_ENOMEM;
		goto out;
	}
	/* every shard is checked, not only those overlapping [lo, hi): a
	 * checkpoint with a piece missing or foreign is refused on every rank */
	for (int k = 0; k < (int)w.world && rv == 0; k++)
		rv = read_one(m, &w, k, lo, hi, dm, dv, &expect, buf, piece);
	if (rv == 0 && expect != m->tt.total) {
		rl_error("'%s': the %lld optimizer shards cover [0, %zu) of %zu elements", dir, w.world, expect,
		    m->tt.total);
		rv = RL_EFORMAT;
	}
out:
	free(buf);
	free(lay);
	cJSON_free(mine);
	free(w.id);
	free(p);
	rl_st_close(f);
	return rv;
}

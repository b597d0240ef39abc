/*
 * ckpt.c — atomic Hugging Face checkpoint directories, optimizer state and
 * the `latest` link (see ckpt.h for the layout).
 */
#include "model/ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/io.h"
#include "base/json.h"
#include "model/lora.h"
#include "model/model_int.h"
#include "model/safetensors.h"

typedef struct fill_ctx {
	rl_model *m;
	float *buf;             /* host f32 (largest tensor) */
	int dtype;              /* file dtype */
	int opt;                /* optimizer file: opt entries per tensor: m, v (, f32 master) */
	int kind0;              /* the first of those kinds (2: the master weights alone) */
	int base;               /* tensor index of entry 0 (the value head file) */
	const int *idx;         /* when non-NULL: the tensor index of each entry (after base) */
	rl_ckpt_need_fn need;   /* when non-NULL: called before tensor i is read */
	void *need_ctx;
} fill_ctx;

static int
fill(void *vctx, int e, void *out, size_t nbytes)
{
	fill_ctx *c = vctx;
	static const int kinds[3] = { RL_MODEL_ADAM_M, RL_MODEL_ADAM_V, RL_MODEL_PARAM };
	int j = c->opt ? e / c->opt : e, i = c->idx ? c->idx[j] : c->base + j, rv;
	int kind = c->opt ? kinds[e % c->opt + c->kind0] : RL_MODEL_PARAM;
	size_t n = c->m->tt.t[i].n;

	if (c->need && (rv = c->need(c->need_ctx, i)) != 0)
		return rv;
	if ((rv = rl_model_get(c->m, i, kind, c->buf)) != 0)
		return rv;
	if (nbytes != n * rl_dtype_size(c->dtype))
		return RL_ESHAPE;
	if (c->dtype == RL_F32) {
		memcpy(out, c->buf, nbytes);
	} else {
		uint16_t *h = out;
		const float *x = c->buf;
		if (c->dtype == RL_BF16) {
#pragma omp parallel for schedule(static) if (n > ((size_t)1 << 18))
			for (size_t j = 0; j < n; j++)
				h[j] = rl_f32_to_bf16(x[j]);
		} else {
#pragma omp parallel for schedule(static) if (n > ((size_t)1 << 18))
			for (size_t j = 0; j < n; j++)
				h[j] = rl_f32_to_f16(x[j]);
		}
	}
	return RL_OK;
}

static char *
join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = rl_xmalloc(n);
	snprintf(p, n, "%s/%s", a, b);
	return p;
}

int
rli_ckpt_fsync_path(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rv = 0;
	if (fd < 0)
		return -1;
	rv = fsync(fd);
	close(fd);
	return rv;
}

static int
write_text(const char *path, const char *text)
{
	FILE *fp = fopen(path, "w");
	size_t n = strlen(text);
	int ok;

	if (fp == NULL) {
		rl_error("cannot create '%s': %s", path, strerror(errno));
		return RL_EIO;
	}
	ok = fwrite(text, 1, n, fp) == n && fputc('\n', fp) != EOF && fflush(fp) == 0 &&
	    fsync(fileno(fp)) == 0;
	if (fclose(fp) != 0)
		ok = 0;
	if (!ok) {
		rl_error("cannot write '%s': %s", path, strerror(errno));
		return RL_EIO;
	}
	return RL_OK;
}

static int
copy_file(const char *src, const char *dst)
{
	char *buf = NULL;
	size_t len;
	FILE *fp;
	int rv, ok;

	if ((rv = rli_read_file(src, &buf, &len, (size_t)256 << 20)) != 0)
		return rv;
	if ((fp = fopen(dst, "wb")) == NULL) {
		rl_error("cannot create '%s': %s", dst, strerror(errno));
		free(buf);
		return RL_EIO;
	}
	ok = fwrite(buf, 1, len, fp) == len && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
	if (fclose(fp) != 0)
		ok = 0;
	free(buf);
	if (!ok) {
		rl_error("cannot write '%s': %s", dst, strerror(errno));
		return RL_EIO;
	}
	return RL_OK;
}

/* The source directory's files a Hugging Face loader reads besides the weights.
 * transformers >= 4.5x saves the chat template as chat_template.jinja, no longer
 * inside tokenizer_config.json (processors: chat_template.json); sentencepiece
 * tokenizers (Llama 2, Mistral) keep their model in tokenizer.model, slow ones
 * their extra tokens in added_tokens.json.  Without them a saved policy has no
 * chat template or no tokenizer in transformers. */
static const char *const tok_files[] = { "tokenizer.json", "tokenizer_config.json",
	"special_tokens_map.json", "generation_config.json", "vocab.json", "merges.txt",
	"chat_template.jinja", "chat_template.json", "tokenizer.model", "added_tokens.json" };

/* model.safetensors.index.json (cJSON_free) mapping the first nhf tensors of
 * m's table to model.safetensors, total_size their bytes in dtype. */
/* A tensor's name in model.safetensors: a reward model's value head is
 * transformers' score.weight. */
static const char *
hf_name(const rl_model *m, int i)
{
	return m->cfg.seq_cls && i == m->vh_w ? "score.weight" : m->tt.t[i].name;
}

/* The tensors model.safetensors holds: the table's first ones up to the
 * RL_T_AUX and LoRA ones, and a reward model's score.weight (the value
 * head's weight, which follows them; its bias stays 0, transformers' score
 * has none). */
static int
hf_count(const rl_model *m)
{
	int n = 0;
	while (n < m->tt.n && !(m->tt.t[n].flags & (RL_T_AUX | RL_T_LORA)))
		n++;
	return m->cfg.seq_cls && m->vh_w == n ? n + 1 : n;
}

static char *
index_json(const rl_model *m, int nhf, int dtype)
{
	cJSON *root = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(root, "metadata");
	cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
	size_t total = 0;
	char *js;

	for (int i = 0; i < nhf; i++) {
		total += m->tt.t[i].n * rl_dtype_size(dtype);
		cJSON_AddStringToObject(wm, hf_name(m, i), "model.safetensors");
	}
	cJSON_AddNumberToObject(md, "total_size", (double)total);
	js = cJSON_Print(root);
	cJSON_Delete(root);
	return js;
}

/* Writes the tensors idx[0..n) (file names e[], dtypes set here to f32) as path;
 * with opt, their AdamW moments ("<name>.exp_avg", ".exp_avg_sq") instead; from
 * (optional): the need hook to call. */
static int
write_sel(rl_model *m, const char *path, const int *idx, int n, int opt, rl_st_entry *e,
    char (*names)[RL_TT_NAME + 16], float *buf, const char *step, const fill_ctx *from)
{
	static const char *const sfx[2] = { "exp_avg", "exp_avg_sq" };
	const char *meta[] = { "format", "pt", "step", step };
	fill_ctx fc = { .m = m, .buf = buf, .dtype = RL_F32, .opt = opt ? 2 : 0, .idx = idx };

	if (from != NULL) {
		fc.need = from->need;
		fc.need_ctx = from->need_ctx;
	}
	int ne = opt ? 2 * n : n;

	for (int k = 0; k < ne; k++) {
		const rl_tensor *t = &m->tt.t[idx[opt ? k / 2 : k]];
		if (opt) {
			snprintf(names[k], sizeof names[k], "%s.%s", t->name, sfx[k % 2]);
			e[k].name = names[k];
		} else {
			e[k].name = t->name;
		}
		e[k].dtype = RL_F32;
		e[k].ndim = rl_tensor_file_shape(t, e[k].shape);
	}
	return rl_st_write(path, e, ne, meta, opt ? 2 : 1, fill, &fc);
}

/* The last of writing a model directory: the tokenizer files of the model's
 * source directory copied beside the weights, then the directory synced. */
static int
finish_dir(const rl_model *m, const char *tmp)
{
	int rv = RL_OK;

	for (size_t k = 0; m->src_dir != NULL && k < RL_ARRAY_LEN(tok_files) && rv == RL_OK; k++) {
		char *src = join(m->src_dir, tok_files[k]);
		if (access(src, R_OK) == 0) {
			char *dst = join(tmp, tok_files[k]);
			rv = copy_file(src, dst);
			free(dst);
		}
		free(src);
	}
	if (rv == RL_OK && rli_ckpt_fsync_path(tmp) != 0) {
		rl_error("cannot sync '%s': %s", tmp, strerror(errno));
		rv = RL_EIO;
	}
	return rv;
}

/* A run with LoRA adapters: PEFT's adapter directory (adapter_config.json,
 * adapter_model.safetensors in f32), the value head, and with_optimizer the
 * AdamW state of the trained tensors only; the frozen base is not written
 * (adapter_config.json names where it is). */
static int
write_lora_dir(rl_model *m, const char *tmp, int with_optimizer, float *buf)
{
	int n = m->tt.n, na = 0, nv = 0, rv;
	int *ia = rl_xcalloc((size_t)n, sizeof *ia), *iv = rl_xcalloc((size_t)n, sizeof *iv);
	int *it = rl_xcalloc((size_t)n, sizeof *it);
	rl_st_entry *e = rl_xcalloc(2 * (size_t)n, sizeof *e);
	char (*names)[RL_TT_NAME + 16] = rl_xcalloc(2 * (size_t)n, sizeof *names);
	char *js = rl_lora_config_json(m), *p = join(tmp, RL_LORA_CONFIG_FILE), stepbuf[32];

	for (int i = 0; i < n; i++) {
		if (m->tt.t[i].flags & RL_T_LORA)
			ia[na++] = i;
		if (m->tt.t[i].flags & RL_T_AUX)
			iv[nv++] = i;
	}
	for (int i = 0; i < na; i++)
		it[i] = ia[i];
	for (int i = 0; i < nv; i++)
		it[na + i] = iv[i];
	snprintf(stepbuf, sizeof stepbuf, "%d", m->step);
	if ((rv = write_text(p, js)) != 0)
		goto out;
	free(p);
	p = join(tmp, RL_LORA_WEIGHTS_FILE);
	if ((rv = write_sel(m, p, ia, na, 0, e, names, buf, NULL, NULL)) != 0)
		goto out;
	free(p);
	p = join(tmp, RL_VALUE_HEAD_FILE);
	if (nv > 0 && (rv = write_sel(m, p, iv, nv, 0, e, names, buf, NULL, NULL)) != 0)
		goto out;
	if (with_optimizer && m->m != NULL) {
		char st[64];
		free(p);
		p = join(tmp, "optimizer.safetensors");
		if ((rv = write_sel(m, p, it, na + nv, 1, e, names, buf, stepbuf, NULL)) != 0)
			goto out;
		free(p);
		p = join(tmp, "trainer_state.json");
		snprintf(st, sizeof st, "{\"global_step\": %d}", m->version);
		if ((rv = write_text(p, st)) != 0)
			goto out;
	}
	rv = finish_dir(m, tmp);
out:
	cJSON_free(js);
	free(p);
	free(e);
	free(names);
	free(ia);
	free(iv);
	free(it);
	return rv;
}

/* How a directory is written: with sh, optimizer.safetensors as the index of
 * per-shard files; need (optional) called before each tensor is read from
 * the parameters (rl_ckpt_save_need). */
typedef struct save_how {
	const rl_ckpt_shards *sh;
	rl_ckpt_need_fn need;
	void *need_ctx;
} save_how;

static int write_dir(rl_model *m, const char *tmp, int with_optimizer, const save_how *how);

int
rli_ckpt_write_dir(rl_model *m, const char *tmp, int with_optimizer)
{
	save_how how = { 0 };
	return write_dir(m, tmp, with_optimizer, &how);
}

/* The index of a sharded optimizer state: the f32 master weights when
 * model.safetensors rounds them, the shards' identity in the metadata. */
static int
write_opt_index(rl_model *m, const char *path, const rl_ckpt_shards *sh, rl_st_entry *e, fill_ctx *fc)
{
	char step[32], ver[32], id[32], world[16], tot[32], *lay = rli_ckpt_layout_json(m);
	const char *meta[] = { "format", "pt", "step", step, "version", ver, "checkpoint_id", id, "zero_shards", world,
		"flat_numel", tot, "flat_layout", lay };
	int per = fc->dtype == RL_F32 ? 0 : 1, rv;
	char (*names)[RL_TT_NAME + 16] = rl_xcalloc((size_t)m->tt.n + 1, sizeof *names);

	if (!lay) {
		free(names);
		return RL_ENOMEM;
	}
	snprintf(step, sizeof step, "%d", m->step);
	snprintf(ver, sizeof ver, "%d", m->version);
	snprintf(id, sizeof id, "%016llx", (unsigned long long)sh->id);
	snprintf(world, sizeof world, "%d", sh->world);
	snprintf(tot, sizeof tot, "%zu", m->tt.total);
	for (int i = 0; i < per * m->tt.n; i++) {
		snprintf(names[i], sizeof names[i], "%s.master", m->tt.t[i].name);
		e[i].name = names[i];
		e[i].dtype = RL_F32;
		e[i].ndim = rl_tensor_file_shape(&m->tt.t[i], e[i].shape);
	}
	fc->opt = 1;
	fc->kind0 = 2;
	fc->dtype = RL_F32;
	rv = rl_st_write(path, e, per * m->tt.n, meta, 7, fill, fc);
	free(names);
	cJSON_free(lay);
	return rv;
}

static int
write_dir(rl_model *m, const char *tmp, int with_optimizer, const save_how *how)
{
	const rl_ckpt_shards *sh = how->sh;
	rl_st_entry *e = NULL;
	fill_ctx fc = { .m = m, .dtype = m->cfg.dtype, .need = how->need, .need_ctx = how->need_ctx };
	char *p = NULL, *js = NULL, stepbuf[32];
	size_t maxn = 0;
	int rv, n = m->tt.n, nhf = 0, wdtype;

	if (fc.dtype != RL_F32 && fc.dtype != RL_BF16 && fc.dtype != RL_F16)
		fc.dtype = RL_F32;
	wdtype = fc.dtype;
	for (int i = 0; i < n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((fc.buf = rl_try_malloc(maxn * sizeof(float), "checkpoint buffer")) == NULL)
		return RL_ENOMEM;
	if (m->lora != NULL) {
		rv = write_lora_dir(m, tmp, with_optimizer, fc.buf);
		free(fc.buf);
		return rv;
	}
	e = rl_xcalloc(3 * (size_t)n, sizeof *e);
	js = rl_config_to_json(&m->cfg);
	p = join(tmp, "config.json");
	if ((rv = write_text(p, js)) != 0)
		goto out;
	/* the Hugging Face tensors; RL_T_AUX ones (the value head) follow them */
	nhf = hf_count(m);
	for (int i = 0; i < n; i++) {
		e[i].name = hf_name(m, i);
		e[i].dtype = fc.dtype;
		e[i].ndim = rl_tensor_file_shape(&m->tt.t[i], e[i].shape);
	}
	free(p);
	p = join(tmp, "model.safetensors");
	{
		const char *meta[] = { "format", "pt" };
		if ((rv = rl_st_write(p, e, nhf, meta, 1, fill, &fc)) != 0)
			goto out;
	}
	if (m->vh_w >= 0 && !m->cfg.seq_cls) {
		/* in f32 whatever cfg.dtype: tiny, and exact for --resume (the value
		 * head's tensors only: a merged model's spent adapters may follow) */
		int iv[2] = { m->vh_w, m->vh_b };
		char (*nm)[RL_TT_NAME + 16] = NULL;
		free(p);
		p = join(tmp, RL_VALUE_HEAD_FILE);
		if ((rv = write_sel(m, p, iv, 2, 0, e, nm, fc.buf, NULL, &fc)) != 0)
			goto out;
	}
	if (sh != NULL) {
		free(p);
		p = join(tmp, "optimizer.safetensors");
		if ((rv = write_opt_index(m, p, sh, e, &fc)) != 0)
			goto out;
		free(p);
		p = join(tmp, "trainer_state.json");
		snprintf(stepbuf, sizeof stepbuf, "{\"global_step\": %d}", m->version);
		if ((rv = write_text(p, stepbuf)) != 0)
			goto out;
	} else if (with_optimizer && m->m != NULL) {
		/* the f32 master weights too when model.safetensors rounds them (bf16/f16),
		 * so a resumed run continues from the same weights */
		static const char *const sfx[3] = { "exp_avg", "exp_avg_sq", "master" };
		int per = fc.dtype == RL_F32 ? 2 : 3;
		char (*names)[RL_TT_NAME + 16] = rl_xcalloc(3 * (size_t)n, sizeof *names);
		const char *meta[] = { "format", "pt", "step", stepbuf };
		for (int i = 0; i < per * n; i++) {
			const rl_tensor *t = &m->tt.t[i / per];
			snprintf(names[i], sizeof names[i], "%s.%s", t->name, sfx[i % per]);
			e[i].name = names[i];
			e[i].dtype = RL_F32;
			e[i].ndim = rl_tensor_file_shape(t, e[i].shape);
		}
		snprintf(stepbuf, sizeof stepbuf, "%d", m->step);
		fc.opt = per;
		fc.dtype = RL_F32;
		free(p);
		p = join(tmp, "optimizer.safetensors");
		rv = rl_st_write(p, e, per * n, meta, 2, fill, &fc);
		free(names);
		if (rv != 0)
			goto out;
		free(p);
		p = join(tmp, "trainer_state.json");
		char st[64];
		snprintf(st, sizeof st, "{\"global_step\": %d}", m->version);
		if ((rv = write_text(p, st)) != 0)
			goto out;
	}
	/* vLLM and SGLang load every *.safetensors of a directory without an
	 * index, optimizer and value head state included, and fail on their
	 * names; an index naming model.safetensors limits them to it
	 * (transformers reads model.safetensors first, the index is unused).
	 * Written in every directory so all versions hold the same files. */
	free(p);
	p = join(tmp, "model.safetensors.index.json");
	{
		char *ix = index_json(m, nhf, wdtype);
		rv = write_text(p, ix);
		cJSON_free(ix);
		if (rv != 0)
			goto out;
	}
	rv = finish_dir(m, tmp);
out:
	cJSON_free(js);
	free(p);
	free(e);
	free(fc.buf);
	return rv;
}

/* Writes dir atomically through tmp (a sibling), then syncs the parent. */
static int
save_atomic(rl_model *m, const char *dir, const char *tmp, int with_optimizer, const save_how *how)
{
	struct stat st;
	char *parent;
	int rv;

	if (stat(dir, &st) == 0) {
		rl_error("cannot save to '%s': it exists", dir);
		return RL_EEXIST;
	}
	rl_io_remove_tree(tmp); /* a leftover of a crashed run with the same pid */
	if (mkdir(tmp, 0755) != 0) {
		rl_error("cannot create '%s': %s", tmp, strerror(errno));
		return RL_EIO;
	}
	if ((rv = write_dir(m, tmp, with_optimizer, how)) != 0)
		goto fail;
	if (rename(tmp, dir) != 0) {
		rl_error("cannot rename '%s' to '%s': %s", tmp, dir, strerror(errno));
		rv = errno == EEXIST || errno == ENOTEMPTY ? RL_EEXIST : RL_EIO;
		goto fail;
	}
	parent = rl_xstrdup(dir);
	rli_ckpt_fsync_path(dirname(parent));
	free(parent);
	return RL_OK;
fail:
	rl_io_remove_tree(tmp);
	return rv;
}

int
rl_model_save(rl_model *m, const char *dir)
{
	size_t n = strlen(dir) + 32;
	char *tmp = rl_xmalloc(n), *d = rl_xstrdup(dir);
	int rv;

	/* no trailing slash: DIR/ would make DIR/.tmp a child */
	while (strlen(d) > 1 && d[strlen(d) - 1] == '/')
		d[strlen(d) - 1] = 0;
	snprintf(tmp, n, "%s.tmp.%ld", d, (long)getpid());
	save_how how = { 0 };
	rv = save_atomic(m, d, tmp, 0, &how);
	free(tmp);
	free(d);
	return rv;
}

static int ckpt_save(rl_model *m, const char *root, int with_optimizer, const save_how *how, char *path,
    size_t len);

int
rl_ckpt_save(rl_model *m, const char *root, int with_optimizer, char *path, size_t len)
{
	save_how how = { 0 };
	return ckpt_save(m, root, with_optimizer, &how, path, len);
}

int
rl_ckpt_save_sharded(rl_model *m, const char *root, const rl_ckpt_shards *sh, char *path, size_t len)
{
	return rl_ckpt_save_need(m, root, 1, sh, NULL, NULL, path, len);
}

int
rl_ckpt_save_need(rl_model *m, const char *root, int with_optimizer, const rl_ckpt_shards *sh, rl_ckpt_need_fn need,
    void *ctx, char *path, size_t len)
{
	save_how how = { sh, need, ctx };

	if (sh != NULL && m->lora != NULL) {
		rl_error("sharded optimizer state with LoRA adapters: not supported");
		return RL_ENOTSUP;
	}
	return ckpt_save(m, root, sh != NULL || with_optimizer, &how, path, len);
}

static int
ckpt_save(rl_model *m, const char *root, int with_optimizer, const save_how *how, char *path, size_t len)
{
	char name[32], *dir, *tmp, *lnk, *ltmp;
	size_t n = strlen(root) + 64;
	int rv;

	if (mkdir(root, 0755) != 0 && errno != EEXIST) {
		rl_error("cannot create '%s': %s", root, strerror(errno));
		return RL_EIO;
	}
	snprintf(name, sizeof name, "step-%08d", m->version);
	dir = join(root, name);
	tmp = rl_xmalloc(n);
	snprintf(tmp, n, "%s/.%s.tmp.%ld", root, name, (long)getpid());
	lnk = join(root, "latest");
	ltmp = rl_xmalloc(n);
	snprintf(ltmp, n, "%s/.latest.tmp.%ld", root, (long)getpid());
	if ((rv = save_atomic(m, dir, tmp, with_optimizer, how)) != 0)
		goto out;
	unlink(ltmp);
	if (symlink(name, ltmp) != 0 || rename(ltmp, lnk) != 0) {
		rl_error("cannot point '%s' at '%s': %s", lnk, name, strerror(errno));
		unlink(ltmp);
		rv = RL_EIO;
		goto out;
	}
	rli_ckpt_fsync_path(root);
	if (path != NULL)
		snprintf(path, len, "%s", dir);
out:
	free(dir);
	free(tmp);
	free(lnk);
	free(ltmp);
	return rv;
}

int
rl_ckpt_latest(const char *root, char *path, size_t len)
{
	char *lnk = join(root, "latest"), target[512], *cfg;
	ssize_t n = readlink(lnk, target, sizeof target - 1);
	int rv = RL_OK;

	free(lnk);
	if (n < 0)
		return RL_ENOENT;
	target[n] = 0;
	if (target[0] == '/')
		snprintf(path, len, "%s", target);
	else
		snprintf(path, len, "%s/%s", root, target);
	cfg = join(path, "config.json");
	if (access(cfg, R_OK) != 0) {
		rl_error("'%s/latest' points at '%s', which has no config.json", root, target);
		rv = RL_ENOENT;
	}
	free(cfg);
	return rv;
}

int
rl_ckpt_step_num(const char *name)
{
	int n;
	char c;
	if (strncmp(name, "step-", 5) != 0 || sscanf(name, "step-%d%c", &n, &c) != 1 || n < 0)
		return -1;
	return n;
}

/* trainer_state.json at most (its groups_done grows with the groups of a
 * run whose ids are not a counter: SFT records' ids) */
#define RL_STATE_MAX ((size_t)256 << 20)

int
rl_ckpt_find_full(const char *root, char *out, size_t len, int *step, cJSON **state, int quiet)
{
	DIR *d = opendir(root);
	struct dirent *e;
	int best = -1;
	char p[4096];

	*state = NULL;
	if (!d) {
		if (!quiet)
			rl_error("cannot resume: cannot open '%s': %s", root, strerror(errno));
		return RL_ENOENT;
	}
	while ((e = readdir(d)) != NULL) {
		int s = rl_ckpt_step_num(e->d_name);
		if (s <= best)
			continue;
		snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", root, e->d_name);
		if (access(p, R_OK) != 0)
			continue;
		snprintf(p, sizeof p, "%s/%s/trainer_state.json", root, e->d_name);
		cJSON *j = NULL;
		if (rl_json_load(&j, p, RL_STATE_MAX) != RL_OK)
			continue;
		if (!cJSON_GetObjectItem(j, "records_consumed")) {
			cJSON_Delete(j);
			continue;
		}
		best = s;
		cJSON_Delete(*state);
		*state = j;
		snprintf(out, len, "%s/%s", root, e->d_name);
	}
	closedir(d);
	if (best < 0) {
		if (!quiet) {
			rl_error("cannot resume: no complete training checkpoint in '%s'", root);
			rl_hint("a full checkpoint has optimizer.safetensors and trainer_state.json (see rl-train --save-every)");
		}
		return RL_ENOENT;
	}
	*step = best;
	return RL_OK;
}

/* The identity of step directory dir, its file being config.json when cfg,
 * else model.safetensors (cfg < 0: that one, or config.json when there is
 * none).  RL_OK, or RL_ENOENT when it cannot be looked at. */
static int
dirid(struct rl_ckpt_dirid *id, const char *dir, int cfg)
{
	struct stat st, fst;
	char p[4200];

	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return RL_ENOENT;
	snprintf(p, sizeof p, "%s/model.safetensors", dir);
	if (cfg > 0 || stat(p, &fst) != 0) {
		if (cfg == 0)
			return RL_ENOENT;
		cfg = 1;
		snprintf(p, sizeof p, "%s/config.json", dir);
		if (stat(p, &fst) != 0)
			return RL_ENOENT;
	}
	id->dev = (uint64_t)st.st_dev;
	id->ino = (uint64_t)st.st_ino;
	id->fino = (uint64_t)fst.st_ino;
	id->mtime_s = (int64_t)fst.st_mtim.tv_sec;
	id->mtime_ns = (int64_t)fst.st_mtim.tv_nsec;
	id->cfg = cfg > 0;
	return RL_OK;
}

int
rl_ckpt_leftovers_scan(rl_ckpt_leftovers *l, const char *root, int after_step)
{
	DIR *d;
	struct dirent *e;
	size_t cap = 0;
	char p[4096];

	memset(l, 0, sizeof *l);
	if (!(d = opendir(root)))
		return RL_OK;
	while ((e = readdir(d)) != NULL) {
		struct rl_ckpt_dirid id;
		int s = rl_ckpt_step_num(e->d_name);
		if (s < 0 || s <= after_step)
			continue;
		snprintf(p, sizeof p, "%s/%s", root, e->d_name);
		if (dirid(&id, p, -1) != RL_OK)
			continue;
		if (l->n == cap) {
			size_t nc = cap ? 2 * cap : 16;
			void *np = realloc(l->id, nc * sizeof *l->id);
			if (!np) {
				closedir(d);
				rl_ckpt_leftovers_fini(l);
				return RL_ENOMEM;
			}
			l->id = np;
			cap = nc;
		}
		l->id[l->n++] = id;
	}
	closedir(d);
	return RL_OK;
}

int
rl_ckpt_leftovers_has(const rl_ckpt_leftovers *l, const char *dir)
{
	struct stat st;

	if (l->n == 0)
		return 0;
	if (stat(dir, &st) != 0)
		return 1;
	for (size_t i = 0; i < l->n; i++) {
		struct rl_ckpt_dirid id;
		if (l->id[i].dev != (uint64_t)st.st_dev || l->id[i].ino != (uint64_t)st.st_ino)
			continue;
		/* the same directory inode: a leftover unless its file is another (the
		 * inode reused by a directory written since); half removed, it is one */
		if (dirid(&id, dir, l->id[i].cfg) != RL_OK)
			return 1;
		if (id.fino == l->id[i].fino && id.mtime_s == l->id[i].mtime_s && id.mtime_ns == l->id[i].mtime_ns)
			return 1;
	}
	return 0;
}

void
rl_ckpt_leftovers_fini(rl_ckpt_leftovers *l)
{
	if (!l)
		return;
	free(l->id);
	memset(l, 0, sizeof *l);
}

int
rl_ckpt_load_optimizer(rl_model *m, const char *dir)
{
	char *p = join(dir, "optimizer.safetensors"), key[RL_TT_NAME + 16];
	rl_st_file *f = NULL;
	float *buf = NULL;
	size_t maxn = 0;
	int rv, step = -1, sharded;

	if ((rv = rl_st_open(&f, p)) != 0)
		goto out;
	{
		/* a sharded state's index: the moments are the shards' (rl_ckpt_read_opt_range) */
		char *w = rli_ckpt_meta(f, "zero_shards");
		sharded = 0;
		if (w != NULL) {
			sharded = 1;
			free(w);
		}
	}
	if (m->m == NULL && !sharded) {
		rl_error("load optimizer: call rl_model_train_reserve first");
		rv = RL_EINVAL;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((buf = rl_try_malloc(maxn * sizeof(float), "optimizer buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	{
		char *sv = rli_ckpt_meta(f, "step");
		if (sv != NULL)
			step = atoi(sv);
		free(sv);
	}
	if (step < 0) {
		rl_error("'%s': no \"step\" in __metadata__", p);
		rv = RL_EFORMAT;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if (frozen(m, i))
			continue; /* with adapters only the trained tensors have state */
		for (int k = 0; k < 3; k++) {
			static const char *const sfx[3] = { "exp_avg", "exp_avg_sq", "master" };
			snprintf(key, sizeof key, "%s.%s", t->name, sfx[k]);
			if (sharded && k < 2)
				continue;
			const rl_st_tensor *st = rl_st_find(f, key);
			if (k == 2 && st == NULL)
				break; /* f32 checkpoints carry no separate master copy */
			if (st == NULL || st->nelem != t->n || st->dtype != RL_F32) {
				rl_error("'%s': tensor '%s' %s", p, key, st == NULL ? "is missing" :
				    "has the wrong shape or dtype");
				rv = st == NULL ? RL_ENOENT : RL_ESHAPE;
				goto out;
			}
			if (k == 2 && m->part_set != NULL && !(t->flags & (RL_T_LORA | RL_T_AUX))) {
				/* rl_model_open_part: the master weights are read a range at a
				 * time by rl_model_load_range, from here (not the adapters and
				 * heads, which are whole on every rank and not in its range) */
				if (m->part_master == NULL)
					m->part_master = rl_xstrdup(p);
				continue;
			}
			rl_st_to_f32(buf, st, 0, t->n);
			if (t->flags & RL_T_TRANSPOSE) { /* file layout (in, out) -> ours */
				float *tr = rl_try_malloc(t->n * sizeof(float), "optimizer transpose");
				if (tr == NULL) {
					rv = RL_ENOMEM;
					goto out;
				}
				size_t R = (size_t)t->shape[0], C = (size_t)t->shape[1];
				for (size_t r = 0; r < R; r++)
					for (size_t c = 0; c < C; c++)
						tr[r * C + c] = buf[c * R + r];
				memcpy(buf, tr, t->n * sizeof(float));
				free(tr);
			}
			m->ops->upload(m->ops, k == 2 ? m->params + t->off : (k == 0 ? m->m : m->v) + (t->off - m->goff), buf,
			    t->n * sizeof(float));
			if (k == 2 && m->w != m->params)
				m->ops->cast(m->ops, (char *)m->w + t->off * rl_dtype_size(m->ops->act_dtype),
				    m->ops->act_dtype, m->params + t->off, RL_F32, t->n);
		}
	}
	m->step = step;
	rv = m->ops->status(m->ops);
out:
	free(buf);
	free(p);
	rl_st_close(f);
	return rv;
}

void
rl_ckpt_files_free(rl_ckpt_file *f, int n)
{
	for (int i = 0; f != NULL && i < n; i++)
		free(f[i].data);
	free(f);
}

/* weights 0: config.json and the tokenizer files only (what a part 0 adds
 * to its tensors), no image of the whole model built for nothing */
static int
weight_files(rl_ckpt_file **out, int *nout, rl_model *m, int weights)
{
	rl_st_entry *e = NULL;
	fill_ctx fc = { .m = m, .dtype = m->cfg.dtype };
	char *js = NULL, *tok = NULL;
	uint8_t *img = NULL;
	size_t maxn = 0, nimg = 0, ntok = 0;
	rl_ckpt_file *f = NULL;
	int rv, n = m->tt.n, nf = 0;
	const char *meta[] = { "format", "pt" };

	*out = NULL;
	*nout = 0;
	if (fc.dtype != RL_F32 && fc.dtype != RL_BF16 && fc.dtype != RL_F16)
		fc.dtype = RL_F32;
	for (int i = 0; i < n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((fc.buf = rl_try_malloc(maxn * sizeof(float), "checkpoint buffer")) == NULL)
		return RL_ENOMEM;
	f = rl_xcalloc(3 + RL_ARRAY_LEN(tok_files), sizeof *f);
	e = rl_xcalloc((size_t)n + 1, sizeof *e);
	for (int i = 0; i < n; i++) {
		e[i].name = hf_name(m, i);
		e[i].dtype = fc.dtype;
		e[i].ndim = rl_tensor_file_shape(&m->tt.t[i], e[i].shape);
	}
	if (m->lora != NULL) {
		/* the adapter's files as write_lora_dir writes them: the frozen base is
		 * the receiver's already (adapter_config.json names it) */
		int *ia = rl_xcalloc((size_t)n, sizeof *ia), na = 0;
		js = rl_lora_config_json(m);
		size_t njs = strlen(js);
		char *cfg = rl_xmalloc(njs + 2);
		memcpy(cfg, js, njs);
		cfg[njs] = '\n';
		f[nf++] = (rl_ckpt_file){ RL_LORA_CONFIG_FILE, (uint8_t *)cfg, njs + 1 };
		for (int i = 0; i < n; i++)
			if (m->tt.t[i].flags & RL_T_LORA) {
				ia[na] = i;
				e[na].name = m->tt.t[i].name;
				e[na].dtype = RL_F32;
				e[na].ndim = rl_tensor_file_shape(&m->tt.t[i], e[na].shape);
				na++;
			}
		fill_ctx ac = { .m = m, .buf = fc.buf, .dtype = RL_F32, .idx = ia };
		rv = rl_st_write_mem(&img, &nimg, e, na, meta, 1, fill, &ac);
		free(ia);
		if (rv != 0)
			goto out;
		f[nf++] = (rl_ckpt_file){ RL_LORA_WEIGHTS_FILE, img, nimg };
		img = NULL;
		goto tokenizer;
	}
	/* the files of a weights-only checkpoint directory, in the same bytes
	 * (config.json ends with a newline there) */
	js = rl_config_to_json(&m->cfg);
	size_t njs = strlen(js);
	char *cfg = rl_xmalloc(njs + 2);
	memcpy(cfg, js, njs);
	cfg[njs] = '\n';
	f[nf++] = (rl_ckpt_file){ "config.json", (uint8_t *)cfg, njs + 1 };
	if (!weights)
		goto tokenizer;
	/* the Hugging Face tensors only, as in model.safetensors of a directory:
	 * RL_T_AUX ones (the value head) stay with the trainer */
	int nhf = hf_count(m);
	if ((rv = rl_st_write_mem(&img, &nimg, e, nhf, meta, 1, fill, &fc)) != 0)
		goto out;
	/* the image (250 MB for GPT-2) is handed on, not copied again */
	f[nf++] = (rl_ckpt_file){ "model.safetensors", img, nimg };
	img = NULL;
	{
		/* with the newline write_text adds in a directory */
		char *ix = index_json(m, nhf, fc.dtype);
		size_t nix = strlen(ix);
		char *ixn = rl_xmalloc(nix + 2);
		memcpy(ixn, ix, nix);
		ixn[nix] = '\n';
		cJSON_free(ix);
		f[nf++] = (rl_ckpt_file){ "model.safetensors.index.json", (uint8_t *)ixn, nix + 1 };
	}
tokenizer:
	for (size_t k = 0; m->src_dir != NULL && k < RL_ARRAY_LEN(tok_files); k++) {
		char *src = join(m->src_dir, tok_files[k]);
		if (access(src, R_OK) == 0) {
			rv = rli_read_file(src, &tok, &ntok, (size_t)256 << 20);
			if (rv == RL_OK)
				f[nf++] = (rl_ckpt_file){ tok_files[k], (uint8_t *)tok, ntok };
			else
				free(tok);
			tok = NULL;
		}
		free(src);
		if (rv != 0)
			goto out;
	}
	*out = f;
	*nout = nf;
	f = NULL;
	rv = RL_OK;
out:
	rl_ckpt_files_free(f, nf);
	cJSON_free(js);
	free(img);
	free(e);
	free(fc.buf);
	return rv;
}

int
rl_ckpt_weight_files(rl_ckpt_file **out, int *nout, rl_model *m)
{
	return weight_files(out, nout, m, 1);
}

int
rl_ckpt_lock_run(const char *root, int *fd)
{
	char p[4200];

	*fd = -1;
	snprintf(p, sizeof p, "%s/.rl-train.lock", root);
	if ((*fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return RL_OK;
	if (flock(*fd, LOCK_EX | LOCK_NB) == 0)
		return RL_OK;
	close(*fd);
	*fd = -1;
	if (errno != EWOULDBLOCK)
		return RL_OK;
	rl_error("'%s' is in use by a running rl-train (it holds '%s')", root, p);
	rl_hint("one trainer per --out: wait for it to end, stop it, or give a new --out");
	return RL_EEXIST;
}

int
rl_ckpt_run_live(const char *root)
{
	char p[4200];
	int fd, live;

	snprintf(p, sizeof p, "%s/.rl-train.lock", root);
	if ((fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	live = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
	close(fd); /* releases a shared lock taken here */
	return live;
}

/* The part a tensor goes to: by where its first byte falls in the Hugging
 * Face tensors' bytes, so each part carries about 1/nparts of them, whole
 * tensors only, in table order. */
static int
part_of(size_t before, size_t total, int nparts)
{
	return total ? (int)((unsigned __int128)before * (unsigned)nparts / total) : 0;
}

/* A part built a tensor at a time: the image is laid out (header, every
 * tensor's place) at the open, each tensor encoded into its place when put. */
struct rl_ckpt_part {
	rl_model *m;
	int part, nparts;       /* nparts 0: the whole weights-only version */
	int ne, nput;           /* the part's tensors; those encoded */
	int *idx;               /* (ne) table index of each entry */
	int *entry;             /* (table n) entry of each tensor, -1 outside the part */
	uint8_t **slot;         /* (ne) each entry's place in img */
	size_t *slot_n;         /* (ne) its bytes */
	char *put;              /* (ne) encoded yet */
	uint8_t *img;           /* the part's safetensors image */
	size_t nimg;
	char *index;            /* model.safetensors.index.json (part 0) */
	fill_ctx fc;            /* the encoder, its f32 buffer the largest tensor */
};

/* rl_st_write_mem's fill at the open: nothing encoded, each entry's place
 * noted (the bytes there are written by rl_ckpt_part_put). */
static int
locate(void *vctx, int e, void *out, size_t nbytes)
{
	rl_ckpt_part *p = vctx;

	p->slot[e] = out;
	p->slot_n[e] = nbytes;
	return RL_OK;
}

void
rl_ckpt_part_close(rl_ckpt_part *p)
{
	if (!p)
		return;
	free(p->idx);
	free(p->entry);
	free(p->slot);
	free(p->slot_n);
	free(p->put);
	free(p->img);
	free(p->index);
	free(p->fc.buf);
	free(p);
}

int
rl_ckpt_part_open(rl_ckpt_part **out, rl_model *m, int part, int nparts)
{
	rl_ckpt_part *p = NULL;
	rl_st_entry *e = NULL;
	size_t total = 0, before = 0, maxn = 0;
	int rv, n = m->tt.n, nhf = 0, dtype = m->cfg.dtype;
	char fname[64];
	const char *meta[] = { "format", "pt" };
	cJSON *root = NULL, *wm;

	*out = NULL;
	if (m->lora != NULL || part < 0 || (nparts > 0 ? part >= nparts : part != 0)) {
		rl_error("%s", m->lora ? "a version of LoRA adapters built a tensor at a time: not supported (they are small)" :
		    "bad part");
		return RL_EINVAL;
	}
	if (dtype != RL_F32 && dtype != RL_BF16 && dtype != RL_F16)
		dtype = RL_F32;
	if (nparts == 0)
		nhf = hf_count(m); /* with a reward model's score.weight, as weight_files */
	else
		while (nhf < n && !(m->tt.t[nhf].flags & (RL_T_AUX | RL_T_LORA)))
			nhf++;
	for (int i = 0; i < nhf; i++) {
		total += m->tt.t[i].n * rl_dtype_size(dtype);
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	}
	p = rl_xcalloc(1, sizeof *p);
	p->m = m;
	p->part = part;
	p->nparts = nparts;
	e = rl_xcalloc((size_t)nhf + 1, sizeof *e);
	p->idx = rl_xcalloc((size_t)nhf + 1, sizeof *p->idx);
	p->entry = rl_xcalloc((size_t)n + 1, sizeof *p->entry);
	p->slot = rl_xcalloc((size_t)nhf + 1, sizeof *p->slot);
	p->slot_n = rl_xcalloc((size_t)nhf + 1, sizeof *p->slot_n);
	p->put = rl_xcalloc((size_t)nhf + 1, 1);
	for (int i = 0; i < n; i++)
		p->entry[i] = -1;
	root = cJSON_CreateObject();
	cJSON_AddNumberToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", (double)total);
	wm = cJSON_AddObjectToObject(root, "weight_map");
	for (int i = 0; i < nhf; i++) {
		int q = nparts ? part_of(before, total, nparts) : 0;
		before += m->tt.t[i].n * rl_dtype_size(dtype);
		snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", q + 1, nparts);
		cJSON_AddStringToObject(wm, m->tt.t[i].name, fname);
		if (q != part)
			continue;
		p->entry[i] = p->ne;
		p->idx[p->ne] = i;
		e[p->ne].name = nparts ? m->tt.t[i].name : hf_name(m, i);
		e[p->ne].dtype = dtype;
		e[p->ne].ndim = rl_tensor_file_shape(&m->tt.t[i], e[p->ne].shape);
		p->ne++;
	}
	p->fc = (fill_ctx){ .m = m, .dtype = dtype, .idx = p->idx };
	if ((p->fc.buf = rl_try_malloc((maxn ? maxn : 1) * sizeof(float), "checkpoint buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	if ((rv = rl_st_write_mem(&p->img, &p->nimg, e, p->ne, meta, 1, locate, p)) != 0)
		goto out;
	if (part == 0) {
		/* the whole version's index names model.safetensors, as a directory's */
		char *ix = nparts ? cJSON_Print(root) : index_json(m, nhf, dtype);
		size_t nix = strlen(ix);
		p->index = rl_xmalloc(nix + 2);
		memcpy(p->index, ix, nix);
		p->index[nix] = '\n';
		p->index[nix + 1] = '\0';
		cJSON_free(ix);
	}
	*out = p;
	p = NULL;
	rv = RL_OK;
out:
	rl_ckpt_part_close(p);
	free(e);
	cJSON_Delete(root);
	return rv;
}

int
rl_ckpt_part_put(rl_ckpt_part *p, int tensor)
{
	int k = tensor >= 0 && tensor < p->m->tt.n ? p->entry[tensor] : -1, rv;

	if (k < 0 || p->put[k])
		return RL_OK;
	if ((rv = fill(&p->fc, k, p->slot[k], p->slot_n[k])) != 0)
		return rv;
	p->put[k] = 1;
	p->nput++;
	return RL_OK;
}

int
rl_ckpt_part_finish(rl_ckpt_part *p, rl_ckpt_file **out, int *nout)
{
	rl_ckpt_file *all = NULL, *f = NULL;
	int rv, nall = 0, nf = 0;

	*out = NULL;
	*nout = 0;
	if (p->nput != p->ne) {
		for (int k = 0; k < p->ne; k++)
			if (!p->put[k]) {
				if (p->nparts)
					rl_error("part %d of %d: tensor '%s' was never encoded", p->part, p->nparts,
					    p->m->tt.t[p->idx[k]].name);
				else
					rl_error("the whole version: tensor '%s' was never encoded",
					    p->m->tt.t[p->idx[k]].name);
				break;
			}
		return RL_EINVAL;
	}
	/* the part's file name lives behind the entries: freed with them */
	f = rl_xcalloc(1, 16 * sizeof *f + 64);
	snprintf((char *)(f + 16), 64, "model-%05d-of-%05d.safetensors", p->part + 1, p->nparts);
	if (p->part == 0 && (rv = weight_files(&all, &nall, p->m, 0)) != 0)
		goto out;
	if (p->nparts == 0 && nall > 0) {
		/* the whole version: weight_files' order, config.json first */
		f[nf++] = all[0];
		all[0].data = NULL;
	}
	f[nf].name = p->nparts ? (const char *)(f + 16) : "model.safetensors";
	f[nf].data = p->img;
	f[nf++].size = p->nimg;
	p->img = NULL;
	if (p->part == 0) {
		/* the rest of the directory: config, the index naming every
		 * tensor's file, the tokenizer (those of the whole version's files) */
		f[nf].name = "model.safetensors.index.json";
		f[nf].size = strlen(p->index);
		f[nf++].data = (uint8_t *)p->index;
		p->index = NULL;
		for (int k = 0; k < nall && nf < 16; k++) {
			if (!all[k].data)
				continue;
			if (strcmp(all[k].name, "model.safetensors") == 0 ||
			    strcmp(all[k].name, "model.safetensors.index.json") == 0)
				continue;
			f[nf].name = all[k].name;
			f[nf].data = all[k].data;
			f[nf++].size = all[k].size;
			all[k].data = NULL;
		}
	}
	*out = f;
	*nout = nf;
	f = NULL;
	rv = RL_OK;
out:
	rl_ckpt_files_free(all, nall);
	rl_ckpt_files_free(f, nf);
	return rv;
}

int
rl_ckpt_part_files(rl_ckpt_file **out, int *nout, rl_model *m, int part, int nparts)
{
	return rl_ckpt_part_files_need(out, nout, m, part, nparts, NULL, NULL);
}

int
rl_ckpt_part_files_need(rl_ckpt_file **out, int *nout, rl_model *m, int part, int nparts, rl_ckpt_need_fn need,
    void *ctx)
{
	rl_ckpt_part *p = NULL;
	int rv;

	*out = NULL;
	*nout = 0;
	if ((rv = rl_ckpt_part_open(&p, m, part, nparts)) != 0)
		return rv;
	for (int k = 0; rv == 0 && k < p->ne; k++)
		if ((!need || (rv = need(ctx, p->idx[k])) == 0))
			rv = rl_ckpt_part_put(p, p->idx[k]);
	if (rv == 0)
		rv = rl_ckpt_part_finish(p, out, nout);
	rl_ckpt_part_close(p);
	return rv;
}

/*
 * safetensors.c — checked safetensors reader (mmap) and streaming writer.
 * See safetensors.h for the checks.  JSON through cJSON, parsed by length.
 */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/io.h"

static int
cmp_name(const void *a, const void *b)
{
	return strcmp(((const rl_st_tensor *)a)->name, ((const rl_st_tensor *)b)->name);
}

static int
cmp_begin(const void *a, const void *b)
{
	const rl_st_tensor *x = *(const rl_st_tensor *const *)a, *y = *(const rl_st_tensor *const *)b;
	uintptr_t p = (uintptr_t)x->data, q = (uintptr_t)y->data;
	return p < q ? -1 : p > q;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static int
json_u53(const cJSON *j, uint64_t *out)
{
	double d;

	if (!cJSON_IsNumber(j))
		return -1;
	d = j->valuedouble;
	if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d)
		return -1;
	*out = (uint64_t)d;
	return 0;
}

static int
parse_tensor(rl_st_tensor *t, const cJSON *j, const char *path, const uint8_t *data, size_t dsize)
{
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
	const cJSON *e;
	uint64_t b, en, v;
	size_t n = 1, bytes;

	if (!cJSON_IsObject(j) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off)) {
		rl_error("'%s': tensor '%s': entry needs dtype, shape and data_offsets", path, t->name);
		return RL_EFORMAT;
	}
	if ((t->dtype = rl_dtype_parse(dt->valuestring)) < 0) {
		rl_error("'%s': tensor '%s': unknown dtype '%s'", path, t->name, dt->valuestring);
		return RL_EFORMAT;
	}
	t->ndim = cJSON_GetArraySize(sh);
	if (t->ndim > RL_ST_MAX_DIMS) {
		rl_error("'%s': tensor '%s': %d dimensions (at most %d)", path, t->name, t->ndim, RL_ST_MAX_DIMS);
		return RL_EFORMAT;
	}
	int k = 0;
	cJSON_ArrayForEach(e, sh) {
		if (json_u53(e, &v) != 0 || rl_mul_size(&n, n, (size_t)v) != 0) {
			rl_error("'%s': tensor '%s': bad shape entry %d", path, t->name, k);
			return RL_EFORMAT;
		}
		t->shape[k++] = (int64_t)v;
	}
	if (cJSON_GetArraySize(off) != 2 || json_u53(cJSON_GetArrayItem(off, 0), &b) != 0 ||
	    json_u53(cJSON_GetArrayItem(off, 1), &en) != 0 || b > en) {
		rl_error("'%s': tensor '%s': bad data_offsets", path, t->name);
		return RL_EFORMAT;
	}
	if (en > dsize) {
		rl_error("'%s': tensor '%s': data_offsets [%llu, %llu] past the end of the data (%zu bytes; "
		    "file truncated?)", path, t->name, (unsigned long long)b, (unsigned long long)en, dsize);
		return RL_EFORMAT;
	}
	if (rl_mul_size(&bytes, n, rl_dtype_size(t->dtype)) != 0 || bytes != en - b) {
		rl_error("'%s': tensor '%s': shape x dtype is %zu bytes but data_offsets span %llu", path,
		    t->name, bytes, (unsigned long long)(en - b));
		return RL_EFORMAT;
	}
	t->nelem = n;
	t->nbytes = bytes;
	t->data = data + b;
	return RL_OK;
}

void
rl_st_close(rl_st_file *f)
{
	if (f == NULL)
		return;
	for (int i = 0; i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	if (f->map != NULL && f->map != MAP_FAILED && !f->borrowed)
		munmap(f->map, f->size);
	free(f->path);
	free(f);
}

/* Validates the header and the tensors of f->map (f->size bytes); f->path
 * names it in messages.  Fills f->t, f->n. */
static int
st_parse(rl_st_file *f)
{
	rl_st_tensor **byoff = NULL;
	cJSON *root = NULL, *j;
	const char *path = f->path;
	const uint8_t *p = f->map;
	uint64_t hlen = 0;
	int rv = RL_EFORMAT, k;

	if (f->size < 8) {
		rl_error("'%s': %zu bytes, too short for a safetensors file", path, f->size);
		goto out;
	}
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | p[i];
	if (hlen > RL_ST_MAX_HEADER || hlen > f->size - 8 || hlen < 2) {
		rl_error("'%s': header length %llu does not fit (file %zu bytes, limit %zu)", path,
		    (unsigned long long)hlen, f->size, RL_ST_MAX_HEADER);
		goto out;
	}
	root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
	if (!cJSON_IsObject(root)) {
		rl_error("'%s': header is not a JSON object", path);
		goto out;
	}
	k = 0;
	cJSON_ArrayForEach(j, root)
		k++;
	f->t = rl_xcalloc((size_t)k, sizeof *f->t);
	cJSON_ArrayForEach(j, root) {
		if (strcmp(j->string, "__metadata__") == 0) {
			if (!cJSON_IsObject(j)) {
				rl_error("'%s': __metadata__ is not an object", path);
				rv = RL_EFORMAT;
				goto out;
			}
			continue;
		}
		rl_st_tensor *t = &f->t[f->n++];
		t->name = rl_xstrdup(j->string);
		if ((rv = parse_tensor(t, j, path, p + 8 + hlen, f->size - 8 - hlen)) != 0)
			goto out;
	}
	rv = RL_EFORMAT;
	qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
	for (int i = 1; i < f->n; i++)
		if (strcmp(f->t[i - 1].name, f->t[i].name) == 0) {
			rl_error("'%s': tensor '%s' appears twice in the header", path, f->t[i].name);
			goto out;
		}
	byoff = rl_xcalloc((size_t)f->n + 1, sizeof *byoff);
	for (int i = 0; i < f->n; i++)
		byoff[i] = &f->t[i];
	qsort(byoff, (size_t)f->n, sizeof *byoff, cmp_begin);
	for (int i = 1; i < f->n; i++) {
		const uint8_t *pe = (const uint8_t *)byoff[i - 1]->data + byoff[i - 1]->nbytes;
		if ((const uint8_t *)byoff[i]->data < pe) {
			rl_error("'%s': tensors '%s' and '%s' overlap", path, byoff[i - 1]->name, byoff[i]->name);
			goto out;
		}
	}
	rv = RL_OK;
out:
	free(byoff);
	cJSON_Delete(root);
	return rv;
}

int
rl_st_open(rl_st_file **out, const char *path)
{
	rl_st_file *f = rl_xcalloc(1, sizeof *f);
	struct stat st;
	int fd = -1, rv = RL_EFORMAT;

	*out = NULL;
	f->path = rl_xstrdup(path);
	/* O_NONBLOCK: opening a FIFO for reading would wait for a writer for ever;
	 * anything but a regular file is refused from its fstat */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0 || fstat(fd, &st) != 0) {
		rv = errno == ENOENT ? RL_ENOENT : RL_EIO;
		rl_error("cannot open '%s': %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rv = RL_EIO;
		rl_error("cannot read '%s': not a regular file", path);
		goto out;
	}
	f->size = (size_t)st.st_size;
	if (f->size < 8) {
		rl_error("'%s': %zu bytes, too short for a safetensors file", path, f->size);
		goto out;
	}
	f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (f->map == MAP_FAILED) {
		rv = RL_EIO;
		rl_error("cannot map '%s': %s", path, strerror(errno));
		goto out;
	}
	if ((rv = st_parse(f)) != 0)
		goto out;
	*out = f;
	f = NULL;
out:
	if (fd >= 0)
		close(fd);
	rl_st_close(f);
	return rv;
}

int
rl_st_open_mem(rl_st_file **out, const char *name, const void *data, size_t size)
{
	rl_st_file *f = rl_xcalloc(1, sizeof *f);
	int rv;

	*out = NULL;
	f->path = rl_xstrdup(name);
	f->map = (void *)data;
	f->size = size;
	f->borrowed = 1;
	if ((rv = st_parse(f)) != 0) {
		rl_st_close(f);
		return rv;
	}
	*out = f;
	return RL_OK;
}

const rl_st_tensor *
rl_st_find(const rl_st_file *f, const char *name)
{
	rl_st_tensor key = { .name = (char *)name };
	return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_name);
}

/* ---- sets ------------------------------------------------------------------ */

static char *
path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = rl_xmalloc(n);
	snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* path's bytes, NUL-terminated (rl_io_read_file); what is not a regular file (a FIFO would
 * block the open for ever) or is over limit is refused from its stat before anything is
 * read.  A path "-" is a file of that name here, not stdin. */
int
rli_read_file(const char *path, char **buf, size_t *len, size_t limit)
{
	struct stat st;

	*buf = NULL;
	if (stat(path, &st) != 0) {
		int e = errno;
		rl_error("cannot open '%s': %s", path, strerror(e));
		return e == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		rl_error("cannot read '%s': not a regular file", path);
		return RL_EIO;
	}
	if ((uint64_t)st.st_size > limit) {
		rl_error("'%s': %lld bytes, over the limit of %zu", path, (long long)st.st_size, limit);
		return RL_ETOOBIG;
	}
	return rl_io_read_file(strcmp(path, "-") == 0 ? "./-" : path, limit, buf, len);
}

void
rl_st_set_close(rl_st_set *s)
{
	if (s == NULL)
		return;
	for (int i = 0; i < s->nfiles; i++)
		rl_st_close(s->files[i]);
	free(s->files);
	free(s);
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int
rl_st_set_open(rl_st_set **out, const char *dir)
{
	rl_st_set *s = rl_xcalloc(1, sizeof *s);
	char *ipath = path_join(dir, "model.safetensors.index.json"), *buf = NULL, *p = NULL;
	char **names = NULL;
	cJSON *root = NULL, *wm, *j;
	size_t len;
	int rv, n = 0;

	*out = NULL;
	p = path_join(dir, "model.safetensors");
	/* transformers' order: model.safetensors when present, else the index
	 * (a directory may hold both, or an index whose shards were not fetched) */
	if (access(p, F_OK) == 0 || access(ipath, F_OK) != 0) {
		s->files = rl_xcalloc(1, sizeof *s->files);
		if ((rv = rl_st_open(&s->files[0], p)) != 0) {
			char *bin = path_join(dir, "pytorch_model.bin"), *bidx = path_join(dir, "pytorch_model.bin.index.json");
			if (rv == RL_ENOENT && (access(bin, F_OK) == 0 || access(bidx, F_OK) == 0))
				rl_hint("'%s' has PyTorch pickle weights (pytorch_model.bin) only: save the model "
				    "with safe_serialization=True (save_pretrained's default) to get model.safetensors", dir);
			free(bin);
			free(bidx);
			goto out;
		}
		s->nfiles = 1;
		goto done;
	}
	if ((rv = rli_read_file(ipath, &buf, &len, (size_t)64 << 20)) != 0)
		goto out;
	rv = RL_EFORMAT;
	root = cJSON_ParseWithLength(buf, len);
	wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	if (!cJSON_IsObject(wm)) {
		rl_error("'%s': no \"weight_map\" object", ipath);
		goto out;
	}
	cJSON_ArrayForEach(j, wm)
		n++;
	names = rl_xcalloc((size_t)n + 1, sizeof *names);
	n = 0;
	cJSON_ArrayForEach(j, wm) {
		if (!cJSON_IsString(j) || strchr(j->valuestring, '/') != NULL || j->valuestring[0] == '.') {
			rl_error("'%s': weight_map['%s'] is not a file name in the directory", ipath, j->string);
			goto out;
		}
		names[n++] = j->valuestring;
	}
	qsort(names, (size_t)n, sizeof *names, cmp_str);
	s->files = rl_xcalloc((size_t)n + 1, sizeof *s->files);
	for (int i = 0; i < n; i++) {
		if (i > 0 && strcmp(names[i], names[i - 1]) == 0)
			continue;
		free(p);
		p = path_join(dir, names[i]);
		if ((rv = rl_st_open(&s->files[s->nfiles], p)) != 0)
			goto out;
		s->nfiles++;
	}
	rv = RL_EFORMAT;
	cJSON_ArrayForEach(j, wm) {
		const char *file = NULL;
		int count = 0;
		for (int i = 0; i < s->nfiles; i++)
			if (rl_st_find(s->files[i], j->string) != NULL) {
				count++;
				if (strcmp(strrchr(s->files[i]->path, '/') + 1, j->valuestring) == 0)
					file = s->files[i]->path;
			}
		if (file == NULL || count != 1) {
			rl_error("'%s': tensor '%s' %s", ipath, j->string,
			    count > 1 ? "is in more than one shard" : "is not in the shard the index names");
			goto out;
		}
	}
done:
	rv = RL_OK;
	*out = s;
	s = NULL;
out:
	free(names);
	cJSON_Delete(root);
	free(buf);
	free(p);
	free(ipath);
	rl_st_set_close(s);
	return rv;
}

const rl_st_tensor *
rl_st_set_find(const rl_st_set *s, const char *name, const char **file)
{
	for (int i = 0; i < s->nfiles; i++) {
		const rl_st_tensor *t = rl_st_find(s->files[i], name);
		if (t != NULL) {
			if (file != NULL)
				*file = s->files[i]->path;
			return t;
		}
	}
	return NULL;
}

int
rl_st_to_f32(float *out, const rl_st_tensor *t, size_t first, size_t n)
{
	const uint8_t *p = t->data;

	if (first > t->nelem || n > t->nelem - first)
		return RL_EINVAL;
	switch (t->dtype) {
	case RL_F32:
		memcpy(out, p + first * 4, n * 4);
		break;
	case RL_F64:
		for (size_t i = 0; i < n; i++) {
			double d;
			memcpy(&d, p + (first + i) * 8, 8);
			out[i] = (float)d;
		}
		break;
	case RL_BF16:
	case RL_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + (first + i) * 2, 2);
			out[i] = t->dtype == RL_BF16 ? rl_bf16_to_f32(h) : rl_f16_to_f32(h);
		}
		break;
	default:
		return RL_ESHAPE;
	}
	return RL_OK;
}

/* ---- writer --------------------------------------------------------------- */

/* The header of a file holding the n entries: *hdr (cJSON_free), its
 * length *hlen and padded length *padded, each entry's bytes in nb[i] and
 * the largest in *maxb, the data bytes in *total.  where names the file in
 * messages.  RL_EINVAL for duplicate names. */
static int
st_header(char **hdr, size_t *hlen, size_t *padded, size_t *nb, size_t *maxb, size_t *total, const char *where,
    const rl_st_entry *e, int n, const char *const *meta, int nmeta)
{
	cJSON *root = cJSON_CreateObject(), *md;
	const char **sorted = rl_xcalloc((size_t)n + 1, sizeof *sorted);
	size_t off = 0;
	int rv = RL_EINVAL;

	*hdr = NULL;
	*maxb = 0;
	for (int i = 0; i < n; i++)
		sorted[i] = e[i].name;
	qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
	for (int i = 1; i < n; i++)
		if (strcmp(sorted[i], sorted[i - 1]) == 0) {
			rl_error("'%s': tensor '%s' written twice", where, sorted[i]);
			goto out;
		}
	if (nmeta > 0) {
		md = cJSON_AddObjectToObject(root, "__metadata__");
		for (int i = 0; i < nmeta; i++)
			cJSON_AddStringToObject(md, meta[2 * i], meta[2 * i + 1]);
	}
	for (int i = 0; i < n; i++) {
		cJSON *t = cJSON_AddObjectToObject(root, e[i].name), *sh, *o;
		size_t ne = 1;
		cJSON_AddStringToObject(t, "dtype", rl_dtype_name(e[i].dtype));
		sh = cJSON_AddArrayToObject(t, "shape");
		for (int d = 0; d < e[i].ndim; d++) {
			cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d]));
			ne *= (size_t)e[i].shape[d];
		}
		nb[i] = ne * rl_dtype_size(e[i].dtype);
		o = cJSON_AddArrayToObject(t, "data_offsets");
		cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
		cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + nb[i])));
		off += nb[i];
		*maxb = RL_MAX(*maxb, nb[i]);
	}
	*hdr = cJSON_PrintUnformatted(root);
	*hlen = strlen(*hdr);
	*padded = (*hlen + 7) & ~(size_t)7;
	*total = off;
	rv = RL_OK;
out:
	free(sorted);
	cJSON_Delete(root);
	return rv;
}

int
rl_st_write(const char *path, const rl_st_entry *e, int n, const char *const *meta, int nmeta,
    rl_st_fill_fn fill, void *ctx)
{
	char *hdr = NULL, *buf = NULL;
	size_t hlen, padded, maxb, total, *nb = rl_xcalloc((size_t)n + 1, sizeof *nb);
	uint8_t len8[8];
	FILE *fp = NULL;
	int rv;

	if ((rv = st_header(&hdr, &hlen, &padded, nb, &maxb, &total, path, e, n, meta, nmeta)) != 0)
		goto out;
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	if ((buf = rl_try_malloc(RL_MAX(maxb, 8), "safetensors write buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	rv = RL_EIO;
	if ((fp = fopen(path, "wb")) == NULL) {
		rl_error("cannot create '%s': %s", path, strerror(errno));
		goto out;
	}
	if (fwrite(len8, 1, 8, fp) != 8 || fwrite(hdr, 1, hlen, fp) != hlen ||
	    fwrite("        ", 1, padded - hlen, fp) != padded - hlen)
		goto werr;
	for (int i = 0; i < n; i++) {
		if ((rv = fill(ctx, i, buf, nb[i])) != 0)
			goto out;
		rv = RL_EIO;
		if (nb[i] && fwrite(buf, 1, nb[i], fp) != nb[i])
			goto werr;
	}
	if (fflush(fp) != 0 || fsync(fileno(fp)) != 0)
		goto werr;
	rv = fclose(fp) == 0 ? RL_OK : RL_EIO;
	fp = NULL;
	if (rv != 0)
		goto werr;
	goto out;
werr:
	rl_error("cannot write '%s': %s", path, strerror(errno));
	rv = RL_EIO;
out:
	if (fp != NULL)
		fclose(fp);
	free(buf);
	free(nb);
	cJSON_free(hdr);
	return rv;
}

int
rl_st_write_mem(uint8_t **out, size_t *outn, const rl_st_entry *e, int n, const char *const *meta, int nmeta,
    rl_st_fill_fn fill, void *ctx)
{
	char *hdr = NULL;
	uint8_t *b = NULL;
	size_t hlen, padded, maxb, total, off, *nb = rl_xcalloc((size_t)n + 1, sizeof *nb);
	int rv;

	*out = NULL;
	*outn = 0;
	if ((rv = st_header(&hdr, &hlen, &padded, nb, &maxb, &total, "(memory)", e, n, meta, nmeta)) != 0)
		goto out;
	if ((b = rl_try_malloc(8 + padded + total, "safetensors image")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	memcpy(b + 8, hdr, hlen);
	memset(b + 8 + hlen, ' ', padded - hlen);
	off = 8 + padded;
	for (int i = 0; i < n; i++) {
		if ((rv = fill(ctx, i, b + off, nb[i])) != 0)
			goto out;
		off += nb[i];
	}
	*out = b;
	*outn = off;
	b = NULL;
out:
	free(b);
	free(nb);
	cJSON_free(hdr);
	return rv;
}

/*
 * wver.c — rl_wver, a version in memory: its blobs, piece hashes, blob and
 * version hashes, and checking them.
 *
 * Leaves out: reading and writing version directories (wdir.c), moving
 * versions (server.c, client.c, wshm.c).
 */
#include "sync/wver.h"
#include "sync/wsync_int.h"
#include "base/core.h"
#include "base/hash.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- versions ----------------------------------------------------------------- */
int
rl_wver_create(rl_wver **out, uint64_t version)
{
	rl_wver *v;

	*out = NULL;
	if ((v = rl_try_calloc(1, sizeof *v, "version")) == NULL)
		return RL_ENOMEM;
	v->version = version;
	v->borrowed = -1;
	*out = v;
	return RL_OK;
}

static int
default_elem(const char *name)
{
	size_t n = strlen(name);

	if ((n > 12 && strcmp(name + n - 12, ".safetensors") == 0) || (n > 4 && strcmp(name + n - 4, ".bin") == 0))
		return 2;
	return 1;
}

int
rl_wver_add_blob_owned(rl_wver *v, const char *name, void *data, uint64_t size, int elem)
{
	int rv = rl_wver_add_blob(v, name, data, size, elem, RLI_WVER_TAKE);
	if (rv != 0)
		free(data);
	return rv;
}

int
rl_wver_add_blob(rl_wver *v, const char *name, const void *data, uint64_t size, int elem, int copy)
{
	rl_wblob *nb, *b;
	size_t nl = name ? strlen(name) : 0;

	if (nl == 0 || nl > RL_WSYNC_NAME_MAX) {
		rl_error("blob name must be 1..%d bytes", RL_WSYNC_NAME_MAX);
		return RL_EINVAL;
	}
	if (v->borrowed >= 0 && v->borrowed != !copy) {
		rl_error("blob '%s': cannot mix copied and borrowed blobs in one version", name);
		return RL_EINVAL;
	}
	if (v->nblobs >= RL_WSYNC_MAX_BLOBS) {
		rl_error("too many blobs (max %d)", RL_WSYNC_MAX_BLOBS);
		return RL_ETOOBIG;
	}
	if (rl_wver_find(v, name) != NULL) {
		rl_error("duplicate blob name '%s'", name);
		return RL_EEXIST;
	}
	if (elem != 0 && elem != 1 && elem != 2 && elem != 4) {
		rl_error("blob '%s': element size %d (want 1, 2 or 4)", name, elem);
		return RL_EINVAL;
	}
	if ((uint64_t)(size_t)size != size)
		return RL_ETOOBIG;
	if ((nb = realloc(v->blobs, (size_t)(v->nblobs + 1) * sizeof *nb)) == NULL)
		return RL_ENOMEM;
	v->blobs = nb;
	b = &v->blobs[v->nblobs];
	memset(b, 0, sizeof *b);
	b->device = -1;
	b->size = size;
	b->elem = elem ? elem : default_elem(name);
	if ((b->name = strdup(name)) == NULL)
		return RL_ENOMEM;
	if (copy == RLI_WVER_TAKE) {
		b->data = (uint8_t *)data;   /* the caller's malloc'd buffer, now ours */
	} else if (copy) {
		if ((b->data = rl_try_malloc(size ? (size_t)size : 1, name)) == NULL) {
			free(b->name);
			return RL_ENOMEM;
		}
		if (size)
			memcpy(b->data, data, (size_t)size);
	} else {
		b->data = (uint8_t *)data;
	}
	v->borrowed = !copy;
	v->nblobs++;
	return RL_OK;
}

void
rl_wver_destroy(rl_wver *v)
{
	if (v == NULL)
		return;
	for (int i = 0; i < v->nblobs; i++) {
		free(v->blobs[i].name);
		free(v->blobs[i].pieces);
		if (v->borrowed != 1)
			free(v->blobs[i].data);
	}
	if (v->map)
		munmap(v->map, v->mapn);
	free(v->blobs);
	free(v);
}

uint64_t
rl_wver_total(const rl_wver *v)
{
	uint64_t t = 0;

	for (int i = 0; i < v->nblobs; i++)
		t += v->blobs[i].size;
	return t;
}

const rl_wblob *
rl_wver_find(const rl_wver *v, const char *name)
{
	for (int i = 0; i < v->nblobs; i++)
		if (strcmp(v->blobs[i].name, name) == 0)
			return &v->blobs[i];
	return NULL;
}

uint64_t
rli_wver_blob_hash(const rl_wblob *b)
{
	size_t np = rli_wver_npieces(b->size);
	uint64_t h = rl_hash64(b->pieces, np * sizeof(uint64_t), b->size);

	return h;
}

/* version hash: over the number and each blob's name, size and hash; blob
 * order does not matter (a directory read back lists files sorted) */
uint64_t
rli_wver_version_hash(const rl_wver *v)
{
	uint64_t acc = 0, fin[3];

	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *b = &v->blobs[i];
		uint64_t rec[2] = { b->size, b->hash };
		acc += rl_hash64(rec, sizeof rec, rl_hash64(b->name, strlen(b->name), 0x524c5359));
	}
	fin[0] = v->version;
	fin[1] = acc;
	fin[2] = (uint64_t)v->nblobs;
	return rl_hash64(fin, sizeof fin, 0x524c5359);
}

static void
hash_pieces(uint64_t *dst, const uint8_t *data, uint64_t size)
{
	size_t np = rli_wver_npieces(size);

	for (size_t i = 0; i < np; i++) {
		size_t off = i * RL_WSYNC_PIECE, n = RL_MIN(RL_WSYNC_PIECE, (size_t)size - off);
		dst[i] = rl_hash64(data + off, n, 0);
	}
}

int
rl_wver_hash(rl_wver *v)
{
	for (int i = 0; i < v->nblobs; i++) {
		rl_wblob *b = &v->blobs[i];
		size_t np = rli_wver_npieces(b->size);
		if (b->pieces == NULL && (b->pieces = rl_try_calloc(np ? np : 1, sizeof(uint64_t), "piece hashes")) == NULL)
			return RL_ENOMEM;
		hash_pieces(b->pieces, b->data, b->size);
		b->hash = rli_wver_blob_hash(b);
	}
	v->hash = rli_wver_version_hash(v);
	return RL_OK;
}

int
rl_wver_verify(const rl_wver *v)
{
	for (int i = 0; i < v->nblobs; i++) {
		const rl_wblob *b = &v->blobs[i];
		size_t np = rli_wver_npieces(b->size);
		if (b->pieces == NULL)
			return RL_EINVAL;
		for (size_t k = 0; k < np; k++) {
			size_t off = k * RL_WSYNC_PIECE, n = RL_MIN(RL_WSYNC_PIECE, (size_t)b->size - off);
			if (rl_hash64(b->data + off, n, 0) != b->pieces[k]) {
				rl_error("version %llu: blob '%s': checksum mismatch at byte %zu",
					 (unsigned long long)v->version, b->name, off);
				return RL_ECHECKSUM;
			}
		}
		if (rli_wver_blob_hash(b) != b->hash) {
			rl_error("version %llu: blob '%s': checksum mismatch", (unsigned long long)v->version, b->name);
			return RL_ECHECKSUM;
		}
	}
	if (rli_wver_version_hash(v) != v->hash) {
		rl_error("version %llu: version checksum mismatch", (unsigned long long)v->version);
		return RL_ECHECKSUM;
	}
	return RL_OK;
}

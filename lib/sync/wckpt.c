/*
 * wckpt.c — rl_wver_from_ckpt: a model's weights-only checkpoint files
 * (rl_ckpt_weight_files) as a hashed in-memory version; a part of one for
 * pushes in parts (rl_ckpt_part_files).
 *
 * Leaves out: how the files are made (model/ckpt.c).
 */
#include "sync/wckpt.h"
#include "model/ckpt.h"
#include "base/core.h"

#include <stdlib.h>

int
rl_wver_from_files(rl_wver **out, uint64_t version, rl_ckpt_file *f, int n)
{
	rl_wver *v = NULL;
	int rv;

	*out = NULL;
	if ((rv = rl_wver_create(&v, version)) != 0)
		goto out;
	/* the blobs take the files' buffers (the image is 250 MB for GPT-2);
	 * elem 0 is the default by name: 2 for model.safetensors, else 1 */
	for (int i = 0; i < n; i++) {
		rv = rl_wver_add_blob_owned(v, f[i].name, f[i].data, f[i].size, 0);
		f[i].data = NULL; /* the version's now, or freed on failure */
		if (rv != 0)
			goto out;
	}
	if ((rv = rl_wver_hash(v)) != 0)
		goto out;
	*out = v;
	v = NULL;
out:
	rl_wver_destroy(v);
	for (int i = 0; i < n; i++) {
		free(f[i].data);
		f[i].data = NULL;
	}
	return rv;
}

static int
from_files(rl_wver **out, rl_model *m, uint64_t version, int part, int nparts, rl_ckpt_need_fn need, void *ctx)
{
	rl_ckpt_file *f = NULL;
	int rv, n = 0;

	*out = NULL;
	if ((rv = nparts ? rl_ckpt_part_files_need(&f, &n, m, part, nparts, need, ctx) : rl_ckpt_weight_files(&f, &n, m)) == 0)
		rv = rl_wver_from_files(out, version, f, n);
	rl_ckpt_files_free(f, n);
	return rv;
}

int
rl_wver_from_ckpt(rl_wver **out, rl_model *m, uint64_t version)
{
	return from_files(out, m, version, 0, 0, NULL, NULL);
}

int
rl_wver_from_ckpt_part(rl_wver **out, rl_model *m, uint64_t version, int part, int nparts)
{
	return from_files(out, m, version, part, nparts, NULL, NULL);
}

int
rl_wver_from_ckpt_part_need(rl_wver **out, rl_model *m, uint64_t version, int part, int nparts,
    rl_ckpt_need_fn need, void *ctx)
{
	return from_files(out, m, version, part, nparts, need, ctx);
}

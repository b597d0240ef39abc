/*
 * test_model_part.c — rl_model_open_part + rl_model_load_range (a ZeRO-3
 * rank reading its shard of the flat table) against rl_model_open, which
 * test_model checks against PyTorch's logits on the same fixtures.
 *
 * Cases: GPT-2 (transposed Conv1D weights, a range cut inside them), a
 * sharded Llama (two files), Qwen2 with tied embeddings; the table cut into
 * 1, 2, 3 and 5 shards as rl_comm_shard cuts it, and ranges of one element
 * and none; a NaN in one tensor refused only by the range that reads it,
 * naming file, tensor and element; a second read refused.  Leaves out the
 * master weights of a checkpoint's optimizer state (rl-train-zero3.bats
 * resumes a bf16 run from them) and the pages left untouched (measured by
 * the trainer's memory/load_params_resident_mb there).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/io.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "t.h"

/* rl_comm_shard's cut of n elements among N */
static size_t
cut(size_t n, int r, int N)
{
	return (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)N);
}

/* The elements [lo, hi) of a part model against the whole one. */
static void
check_range(rl_ops *cpu, const rl_model *full, const char *dir, size_t lo, size_t hi)
{
	rl_model *m = NULL;
	int rv = rl_model_open_part(&m, dir, cpu, 0, 0);

	T_EQ_INT(rv, RL_OK);
	if (rv != 0)
		return;
	T_OK(m->tt.total == full->tt.total, "%zu vs %zu", m->tt.total, full->tt.total);
	T_EQ_INT(rl_model_load_range(m, lo, hi), RL_OK);
	T_OK(m->part_set == NULL, "the files closed after the read");
	T_OK(hi <= lo || memcmp(m->params + lo, full->params + lo, (hi - lo) * sizeof(float)) == 0,
	    "%s: elements [%zu, %zu) differ from rl_model_open's", dir, lo, hi);
	rl_model_close(m);
}

static void
fixture(rl_ops *cpu, const char *name)
{
	char dir[256];
	rl_model *full = NULL;
	static const int worlds[] = { 1, 2, 3, 5 };

	snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
	T_EQ_INT(rl_model_open(&full, dir, cpu), RL_OK);
	if (full == NULL)
		return;
	for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
		for (int r = 0; r < worlds[w]; r++)
			check_range(cpu, full, dir, cut(full->tt.total, r, worlds[w]), cut(full->tt.total, r + 1, worlds[w]));
	check_range(cpu, full, dir, full->tt.total / 2, full->tt.total / 2 + 1);
	check_range(cpu, full, dir, 7, 7);
	rl_model_close(full);
}

/* qwen2_tied with element 3 of model.norm.weight NaN (its dtype's), in a directory of its
 * own: a range without it reads, one with it is refused naming it. */
static void
nan_case(rl_ops *cpu)
{
	char tmp[] = "/tmp/rl-test-part-XXXXXX", path[512], err[2048], *buf = NULL, *cfg = NULL;
	size_t n = 0, nc = 0, off;
	rl_st_file *f = NULL;
	const rl_st_tensor *t;
	rl_model *m = NULL, *full = NULL;
	int rv;

	T_OK(mkdtemp(tmp) != NULL, "mkdtemp");
	T_EQ_INT(rl_io_read_file("tests/fixtures/qwen2_tied/model.safetensors", 0, &buf, &n), RL_OK);
	T_EQ_INT(rl_io_read_file("tests/fixtures/qwen2_tied/config.json", 0, &cfg, &nc), RL_OK);
	T_EQ_INT(rl_st_open_mem(&f, "mem", buf, n), RL_OK);
	if (!buf || !cfg || !f)
		goto out;
	t = rl_st_find(f, "model.norm.weight");
	T_OK(t != NULL, "model.norm.weight");
	if (t == NULL)
		goto out;
	/* all bits set: a NaN in f32, f16, bf16 and f64 alike */
	off = (size_t)((const char *)t->data - buf);
	memset(buf + off + 3 * rl_dtype_size(t->dtype), 0xff, rl_dtype_size(t->dtype));
	snprintf(path, sizeof path, "%s/model.safetensors", tmp);
	T_EQ_INT(rl_io_write_atomic(path, buf, n, 0644), RL_OK);
	snprintf(path, sizeof path, "%s/config.json", tmp);
	T_EQ_INT(rl_io_write_atomic(path, cfg, nc, 0644), RL_OK);

	T_EQ_INT(rl_model_open(&full, "tests/fixtures/qwen2_tied", cpu), RL_OK);
	if (full == NULL)
		goto out;
	size_t at = full->tt.t[full->lnf_w].off + 3;
	/* the shard before the NaN: read */
	T_EQ_INT(rl_model_open_part(&m, tmp, cpu, 0, 0), RL_OK);
	if (m != NULL) {
		T_EQ_INT(rl_model_load_range(m, 0, at), RL_OK);
		/* read once only */
		T_CAPTURE(rl_model_load_range(m, 0, at), &rv, err);
		T_EQ_INT(rv, RL_EINVAL);
		T_OK(strstr(err, "rl_model_open_part") != NULL, "%s", err);
	}
	rl_model_close(m);
	m = NULL;
	/* the shard with it: refused, naming the file, tensor and element */
	T_EQ_INT(rl_model_open_part(&m, tmp, cpu, 0, 0), RL_OK);
	if (m != NULL) {
		T_CAPTURE(rl_model_load_range(m, at - 1, m->tt.total), &rv, err);
		T_EQ_INT(rv, RL_EFORMAT);
		T_OK(strstr(err, "model.norm.weight") != NULL && strstr(err, "model.safetensors") != NULL &&
		    strstr(err, "1 non-finite") != NULL && strstr(err, "element 3") != NULL, "%s", err);
		T_OK(m->part_set == NULL, "the files closed after a failed read");
	}
out:
	rl_model_close(m);
	rl_model_close(full);
	rl_st_close(f);
	free(buf);
	free(cfg);
	snprintf(path, sizeof path, "%s/model.safetensors", tmp);
	unlink(path);
	snprintf(path, sizeof path, "%s/config.json", tmp);
	unlink(path);
	rmdir(tmp);
}

int
main(void)
{
	rl_ops *cpu = NULL;

	T_BEGIN("test_model_part");
	T_EQ_INT(rl_ops_cpu_open(&cpu), RL_OK);
	if (!cpu)
		T_END();
	fixture(cpu, "gpt2");
	fixture(cpu, "llama");
	fixture(cpu, "qwen2_tied");
	nan_case(cpu);
	rl_ops_close(cpu);
	T_END();
}

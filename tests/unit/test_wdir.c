/* test_wdir.c — lib/sync/wdir.c, the version directory: a version written
 * and read back byte for byte and verified, a changed, shortened or missing
 * blob refused, publish/prune keeping the newest K, a rewind dropping the
 * newer versions onto a new line, rl-train's ROOT/latest -> step-N layout,
 * and rl_wdir_check_target's answers. */
#include "base/core.h"
#include "base/io.h"
#include "t.h"
#include "sync/wdir.h"
#include "sync/wsync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpd[256];

/* a version with three blobs of awkward sizes (empty, under and over one
 * piece), contents depending on version and seed */
static rl_wver *
make_ver(uint64_t version, unsigned seed)
{
	static const uint64_t sizes[] = { 0, 1000, RL_WSYNC_PIECE + 17 };
	static const char *const names[] = { "empty.txt", "config.json", "model.safetensors" };
	rl_wver *v;

	T_EQ_INT(rl_wver_create(&v, version), RL_OK);
	for (int i = 0; i < 3; i++) {
		uint8_t *p = malloc(sizes[i] + 1);
		for (uint64_t k = 0; k < sizes[i]; k++)
			p[k] = (uint8_t)(k * 31 + seed * 7 + (unsigned)i);
		T_EQ_INT(rl_wver_add_blob(v, names[i], p, sizes[i], 0, 1), RL_OK);
		free(p);
	}
	T_EQ_INT(rl_wver_hash(v), RL_OK);
	return v;
}

static int
same_bytes(const rl_wver *a, const rl_wver *b)
{
	if (a->nblobs != b->nblobs || a->hash != b->hash || a->version != b->version)
		return 0;
	for (int i = 0; i < a->nblobs; i++) {
		const rl_wblob *x = &a->blobs[i], *y = rl_wver_find(b, x->name);
		if (y == NULL || y->size != x->size || y->hash != x->hash ||
		    (x->size && memcmp(x->data, y->data, x->size) != 0))
			return 0;
	}
	return 1;
}

static void
path(char *buf, size_t n, const char *rel)
{
	snprintf(buf, n, "%s/%s", tmpd, rel);
}

static void
test_roundtrip(void)
{
	char d[512], f[600];
	rl_wver *v = make_ver(7, 1), *r = NULL;
	struct stat st;

	path(d, sizeof d, "rt");
	T_EQ_INT(rl_wver_write_dir(v, d), RL_OK);
	T_EQ_INT(rl_wver_write_dir(v, d), RL_EEXIST);
	snprintf(f, sizeof f, "%s/%s", d, RL_WSYNC_MANIFEST);
	T_OK(stat(f, &st) == 0 && st.st_size > 0, "the manifest is written");
	/* version 0: the number the manifest records */
	T_EQ_INT(rl_wver_read_dir(&r, d, 0), RL_OK);
	T_OK(r != NULL && same_bytes(v, r), "read back: same version, names, sizes, hashes and bytes");
	T_EQ_INT(rl_wver_verify(r), RL_OK);
	rl_wver_destroy(r);
	r = NULL;

	/* one byte changed in the big blob's second piece */
	snprintf(f, sizeof f, "%s/model.safetensors", d);
	FILE *fp = fopen(f, "r+b");
	T_OK(fp != NULL, "open %s", f);
	fseek(fp, (long)RL_WSYNC_PIECE + 3, SEEK_SET);
	int c = fgetc(fp);
	fseek(fp, (long)RL_WSYNC_PIECE + 3, SEEK_SET);
	fputc(c ^ 0x40, fp);
	fclose(fp);
	T_EQ_INT(rl_wver_read_dir(&r, d, 0), RL_ECHECKSUM);
	T_OK(r == NULL, "nothing handed out for a corrupted version");

	/* shortened: the sizes no longer match */
	T_OK(truncate(f, 100) == 0, "truncate");
	T_EQ_INT(rl_wver_read_dir(&r, d, 0), RL_ECHECKSUM);
	T_OK(r == NULL, "nothing handed out for a short blob");

	/* missing */
	T_OK(unlink(f) == 0, "unlink");
	T_EQ_INT(rl_wver_read_dir(&r, d, 0), RL_ENOENT);
	T_OK(r == NULL, "nothing handed out for a missing blob");

	/* a directory that does not exist */
	path(d, sizeof d, "nope");
	T_EQ_INT(rl_wver_read_dir(&r, d, 0), RL_ENOENT);
	rl_wver_destroy(v);
}

static void
test_publish_prune(void)
{
	char d[512], p[600], want[600];
	uint64_t l = 0;
	rl_wver *r = NULL;

	path(d, sizeof d, "pub/deep/er");   /* parents created */
	for (uint64_t k = 1; k <= 4; k++) {
		rl_wver *v = make_ver(k, (unsigned)k);
		T_EQ_INT(rl_wdir_publish_ver(d, v, 2), RL_OK);
		rl_wver_destroy(v);
	}
	T_EQ_INT(rl_wdir_latest(d, &l, p, sizeof p), RL_OK);
	T_OK(l == 4, "latest is 4, not %llu", (unsigned long long)l);
	snprintf(want, sizeof want, "%s/v000004", d);
	T_EQ_STR(p, want);
	T_EQ_INT(rl_wdir_before(d, 4, &l, NULL, 0), RL_OK);
	T_OK(l == 3, "the one before is 3, not %llu", (unsigned long long)l);
	T_EQ_INT(rl_wdir_before(d, 3, &l, NULL, 0), RL_ENOENT);   /* 1 and 2 pruned */
	snprintf(p, sizeof p, "%s/v000002", d);
	T_OK(access(p, F_OK) != 0, "v000002 pruned");
	snprintf(p, sizeof p, "%s/latest/config.json", d);
	T_OK(access(p, R_OK) == 0, "latest points at a version directory");

	/* what latest names reads back as version 4, whole */
	snprintf(p, sizeof p, "%s/latest", d);
	T_EQ_INT(rl_wver_read_dir(&r, p, 0), RL_OK);
	rl_wver *v4 = make_ver(4, 4);
	T_OK(r != NULL && same_bytes(v4, r), "latest holds version 4's bytes");
	rl_wver_destroy(r);

	/* not newer: refused, nothing changes */
	T_EQ_INT(rl_wdir_publish_ver(d, v4, 2), RL_ESTALE);
	rl_wver_destroy(v4);

	/* prune to one */
	T_EQ_INT(rl_wdir_prune(d, 1), RL_OK);
	T_EQ_INT(rl_wdir_before(d, 4, &l, NULL, 0), RL_ENOENT);
	T_EQ_INT(rl_wdir_latest(d, &l, NULL, 0), RL_OK);
	T_OK(l == 4, "prune kept the latest");
}

static void
test_rewind(void)
{
	char d[512], p[600];
	uint64_t l = 0, lin = 99, lin2 = 0;
	rl_wver *r = NULL;

	path(d, sizeof d, "rw");
	for (uint64_t k = 1; k <= 3; k++) {
		rl_wver *v = make_ver(k, (unsigned)k);
		T_EQ_INT(rl_wdir_publish_ver(d, v, 5), RL_OK);
		rl_wver_destroy(v);
	}
	/* a trainer resumed from version 2 publishes another version 2 */
	rl_wver *v2 = make_ver(2, 50);
	T_EQ_INT(rl_wdir_rewind_ver(d, v2, 5, &lin), RL_OK);
	T_OK(lin == 1, "the rewind starts line 1, not %llu", (unsigned long long)lin);
	T_EQ_INT(rl_wdir_latest(d, &l, p, sizeof p), RL_OK);
	T_OK(l == 2, "latest is the rewound 2, not %llu", (unsigned long long)l);
	T_EQ_INT(rl_wdir_lineage(p, &lin2), RL_OK);
	T_OK(lin2 == 1, "its rlsync.json records line 1");
	T_EQ_INT(rl_wver_read_dir(&r, p, 0), RL_OK);
	T_OK(r != NULL && same_bytes(v2, r), "the rewound version 2 is the new bytes");
	rl_wver_destroy(r);
	snprintf(p, sizeof p, "%s/v000003", d);
	T_OK(access(p, F_OK) != 0, "version 3 dropped");
	T_EQ_INT(rl_wdir_before(d, 2, &l, NULL, 0), RL_OK);
	T_OK(l == 1, "version 1 kept");
	/* the same again: nothing to do, the line stays */
	T_EQ_INT(rl_wdir_rewind_ver(d, v2, 5, &lin), RL_OK);
	T_OK(lin == 1, "a repeated rewind keeps line 1");
	/* a publish after it continues the line */
	rl_wver *v3 = make_ver(3, 51);
	T_EQ_INT(rl_wdir_publish_ver(d, v3, 5), RL_OK);
	T_EQ_INT(rl_wdir_latest(d, &l, p, sizeof p), RL_OK);
	T_EQ_INT(rl_wdir_lineage(p, &lin2), RL_OK);
	T_OK(l == 3 && lin2 == 1, "version 3 after the rewind is on line 1");
	rl_wver_destroy(v2);
	rl_wver_destroy(v3);
}

/* rl-train's layout: ROOT/step-00000100 and ROOT/latest -> step-00000100 */
static void
test_train_layout(void)
{
	char d[512], p[600], want[600];
	uint64_t l = 0;
	rl_wver *v = make_ver(1, 9);

	path(d, sizeof d, "train");
	T_EQ_INT(rl_io_mkdir_p(d, 0755), RL_OK);
	snprintf(p, sizeof p, "%s/step-00000100", d);
	T_EQ_INT(rl_wver_write_dir(v, p), RL_OK);
	snprintf(p, sizeof p, "%s/latest", d);
	T_OK(symlink("step-00000100", p) == 0, "symlink");
	T_EQ_INT(rl_wdir_latest(d, &l, p, sizeof p), RL_OK);
	snprintf(want, sizeof want, "%s/step-00000100", d);
	T_OK(l == 100, "step-00000100 is version 100, not %llu", (unsigned long long)l);
	T_EQ_STR(p, want);
	rl_wver_destroy(v);
}

static void
test_check_target(void)
{
	char d[512];

	path(d, sizeof d, "tgt");
	T_EQ_INT(rl_wdir_check_target(d), RL_OK);          /* creatable */
	T_EQ_INT(rl_io_mkdir_p(d, 0755), RL_OK);
	T_EQ_INT(rl_wdir_check_target(d), RL_OK);          /* writable */
	path(d, sizeof d, "tgt/no/such");
	T_EQ_INT(rl_wdir_check_target(d), RL_EIO);         /* parent missing */
	path(d, sizeof d, "file");
	FILE *f = fopen(d, "w");
	T_OK(f != NULL, "create %s", d);
	fclose(f);
	T_EQ_INT(rl_wdir_check_target(d), RL_EIO);         /* not a directory */
}

int
main(void)
{
	T_BEGIN("test_wdir");
	rl_log_init("test_wdir", RL_LOG_QUIET);
	snprintf(tmpd, sizeof tmpd, "%s/rl-test-wdir.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (mkdtemp(tmpd) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	test_roundtrip();
	test_publish_prune();
	test_rewind();
	test_train_layout();
	test_check_target();
	rl_io_remove_tree(tmpd);
	T_END();
}

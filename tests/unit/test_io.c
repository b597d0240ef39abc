/*
 * test_io.c — rl_buf, whole-file reads with a bound, atomic writes (the old
 * file survives a failed write; no temp files left), mkdir -p, full reads
 * and writes over a pipe.
 */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/io.h"
#include "t.h"

static int
count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

int
main(void)
{
	char dir[] = "/tmp/rl-test-io.XXXXXX", path[256], sub[256];
	rl_buf b;
	char *text;
	size_t n, got;
	int fd[2];

	T_BEGIN("test_io");
	rl_log_init("test_io", RL_LOG_NORMAL);

	rl_buf_init(&b);
	for (int i = 0; i < 1000; i++)
		T_OK(rl_buf_printf(&b, "%d,", i) == 0);
	T_OK(rl_buf_putc(&b, '!') == 0);
	T_OK(b.len == 3891 && b.p[b.len - 1] == '!' && memcmp(b.p, "0,1,2,", 6) == 0);
	T_OK(((uintptr_t)b.p & 15) == 0);
	{
		size_t len;
		uint8_t *p = rl_buf_steal(&b, &len);
		T_OK(len == 3891 && b.p == NULL && b.len == 0);
		free(p);
	}
	rl_buf_fini(&b);
	rl_buf_fini(NULL);

	T_OK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/a.txt", dir);
	T_OK(rl_io_write_atomic(path, "hello\n", 6, 0) == 0);
	T_OK(rl_io_read_file(path, 0, &text, &n) == 0 && n == 6 && strcmp(text, "hello\n") == 0);
	free(text);
	T_EQ_INT(rl_io_read_file(path, 5, &text, &n), RL_ETOOBIG);
	T_OK(text == NULL);
	T_OK(rl_io_write_atomic(path, "second version", 14, 0) == 0);
	T_OK(rl_io_read_file(path, 14, &text, &n) == 0 && n == 14 && memcmp(text, "second version", 14) == 0);
	free(text);
	T_EQ_INT(count_entries(dir), 1);

	/* streaming form: abort leaves the old file alone and no temp behind */
	{
		rl_io_atomic a;
		T_OK(rl_io_atomic_open(&a, path, 0600) == 0);
		fputs("partial", a.f);
		rl_io_atomic_abort(&a);
		T_OK(rl_io_read_file(path, 0, &text, &n) == 0 && n == 14);
		free(text);
		T_EQ_INT(count_entries(dir), 1);
		T_OK(rl_io_atomic_open(&a, path, 0600) == 0);
		fputs("third", a.f);
		T_OK(rl_io_atomic_commit(&a) == 0);
		T_OK(a.f == NULL && a.tmp == NULL);
		rl_io_atomic_abort(&a);
		T_OK(rl_io_read_file(path, 0, &text, &n) == 0 && strcmp(text, "third") == 0);
		free(text);
	}

	/* errors: missing file, missing directory */
	snprintf(sub, sizeof sub, "%s/missing/x", dir);
	T_EQ_INT(rl_io_read_file(sub, 0, &text, &n), RL_ENOENT);
	T_OK(rl_io_write_atomic(sub, "x", 1, 0) != 0);
	T_EQ_INT(count_entries(dir), 1);

	/* mkdir -p */
	snprintf(sub, sizeof sub, "%s/d1/d2/d3", dir);
	T_OK(rl_io_mkdir_p(sub, 0) == 0);
	T_OK(rl_io_mkdir_p(sub, 0) == 0);
	T_EQ_INT(rl_io_mkdir_p(path, 0), RL_EEXIST);

	/* full reads/writes through a pipe */
	T_OK(pipe(fd) == 0);
	T_OK(rl_io_write_full(fd[1], "0123456789", 10, "pipe") == 0);
	close(fd[1]);
	{
		char buf[32];
		T_OK(rl_io_read_full(fd[0], buf, sizeof buf, &got, "pipe") == 0 && got == 10);
		T_OK(memcmp(buf, "0123456789", 10) == 0);
	}
	close(fd[0]);

	/* rl_io_fopen "-" */
	{
		FILE *f;
		T_OK(rl_io_fopen(&f, "-", "r") == 0 && f == stdin);
		T_OK(rl_io_fopen(&f, "-", "w") == 0 && f == stdout);
		T_EQ_INT(rl_io_fopen(&f, "/nonexistent/rl-test", "r"), RL_ENOENT);
		T_OK(f == NULL);
		T_OK(rl_io_fopen(&f, path, "rb") == 0 && f != NULL);
		T_OK(rl_io_fclose(f, path) == 0);
	}

	/* rl_io_remove_tree: nested directories, files, a symbolic link that
	 * points out of the tree (the link goes, its target stays) */
	{
		char t[300], p[400], outside[300];
		struct stat st;
		snprintf(t, sizeof t, "%s/tree", dir);
		snprintf(outside, sizeof outside, "%s/outside", dir);
		T_OK(rl_io_write_atomic(outside, "keep", 4, 0) == 0);
		snprintf(p, sizeof p, "%s/a/b/c", t);
		T_OK(rl_io_mkdir_p(p, 0) == 0);
		snprintf(p, sizeof p, "%s/a/b/c/f", t);
		T_OK(rl_io_write_atomic(p, "x", 1, 0) == 0);
		snprintf(p, sizeof p, "%s/a/g", t);
		T_OK(rl_io_write_atomic(p, "y", 1, 0) == 0);
		snprintf(p, sizeof p, "%s/link", t);
		T_OK(symlink(outside, p) == 0);
		T_EQ_INT(rl_io_remove_tree(t), RL_OK);
		T_OK(stat(t, &st) != 0 && errno == ENOENT);
		T_OK(stat(outside, &st) == 0 && st.st_size == 4);
		T_EQ_INT(rl_io_remove_tree(t), RL_OK); /* gone already: not an error */
		T_EQ_INT(rl_io_remove_tree(outside), RL_OK); /* a plain file */
		T_OK(stat(outside, &st) != 0);
	}

	{
		char cmd[300];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		T_OK(system(cmd) == 0);
	}
	T_END();
}

/*
 * io.c — checked file I/O: rl_buf, full reads/writes, bounded whole-file
 * reads, atomic replacement (temp + fsync + rename + directory fsync), a
 * checked close of stdout, mkdir -p.
 *
 * Leaves out: Windows.  Temp files live beside their destination so the
 * rename stays within one file system.
 */
#include "base/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- rl_buf ------------------------------------------------------------------ */

void
rl_buf_init(rl_buf *b)
{
	b->p = NULL;
	b->len = 0;
	b->cap = 0;
}

void
rl_buf_fini(rl_buf *b)
{
	if (b == NULL)
		return;
	free(b->p);
	rl_buf_init(b);
}

int
rl_buf_reserve(rl_buf *b, size_t extra)
{
	size_t need, cap;
	void *p;

	if (rl_add_size(&need, b->len, extra) != 0)
		return RL_ETOOBIG;
	if (need <= b->cap)
		return RL_OK;
	cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	/* malloc/realloc align to 16 bytes on the 64-bit libcs we build for */
	p = realloc(b->p, cap);
	if (p == NULL) {
		rl_error("out of memory (asked for %zu bytes)", cap);
		return RL_ENOMEM;
	}
	b->p = p;
	b->cap = cap;
	return RL_OK;
}

int
rl_buf_append(rl_buf *b, const void *p, size_t n)
{
	int rv;

	if (n == 0)
		return RL_OK;
	if ((rv = rl_buf_reserve(b, n)) != 0)
		return rv;
	memcpy(b->p + b->len, p, n);
	b->len += n;
	return RL_OK;
}

int
rl_buf_putc(rl_buf *b, int c)
{
	int rv;

	if (b->len == b->cap && (rv = rl_buf_reserve(b, 1)) != 0)
		return rv;
	b->p[b->len++] = (uint8_t)c;
	return RL_OK;
}

int
rl_buf_printf(rl_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n, rv;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return RL_EINVAL;
	if ((rv = rl_buf_reserve(b, (size_t)n + 1)) != 0)
		return rv;
	va_start(ap, fmt);
	vsnprintf((char *)b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
	return RL_OK;
}

uint8_t *
rl_buf_steal(rl_buf *b, size_t *len)
{
	uint8_t *p = b->p;

	if (len)
		*len = b->len;
	rl_buf_init(b);
	return p;
}

/* ---- descriptors ---------------------------------------------------------------- */

static const char *
fdname(char *buf, size_t n, int fd, const char *name)
{
	if (name)
		return name;
	snprintf(buf, n, "fd %d", fd);
	return buf;
}

int
rl_io_read_full(int fd, void *buf, size_t n, size_t *got, const char *name)
{
	size_t off = 0;
	char nb[32];

	while (off < n) {
		ssize_t r = read(fd, (char *)buf + off, n - off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rl_error("cannot read '%s': %s", fdname(nb, sizeof nb, fd, name), strerror(errno));
			*got = off;
			return RL_EIO;
		}
		if (r == 0)
			break;
		off += (size_t)r;
	}
	*got = off;
	return RL_OK;
}

int
rl_io_write_full(int fd, const void *buf, size_t n, const char *name)
{
	size_t off = 0;
	char nb[32];

	while (off < n) {
		ssize_t w = write(fd, (const char *)buf + off, n - off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			rl_error("cannot write '%s': %s", fdname(nb, sizeof nb, fd, name), strerror(errno));
			return errno == EPIPE ? RL_ECLOSED : RL_EIO;
		}
		off += (size_t)w;
	}
	return RL_OK;
}

/* ---- FILE streams ----------------------------------------------------------------- */

static atomic_int stdout_closing; /* rl_io_close_stdout has begun: the watcher stands down */
static pthread_t stdout_watcher;
static int stdout_watching;

static void *
watch_stdout(void *arg)
{
	struct pollfd p = { .fd = STDOUT_FILENO, .events = 0 };

	(void)arg;
	for (;;) {
		int r = poll(&p, 1, -1);
		if (r < 0 && errno == EINTR)
			continue;
		/* POLLNVAL: the program closed its own stdout (at its end), not a reader gone */
		if (atomic_load(&stdout_closing) || (r > 0 && (p.revents & POLLNVAL)))
			return NULL;
		if (r > 0 && (p.revents & (POLLERR | POLLHUP))) {
			rl_error("the reader of standard output has gone (it stopped or failed): stopping");
			_exit(1);
		}
		if (r < 0)
			return NULL;
	}
}

void
rl_io_watch_stdout(void)
{
	struct stat st;

	if (stdout_watching || fstat(STDOUT_FILENO, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
		return;
	if (pthread_create(&stdout_watcher, NULL, watch_stdout, NULL) != 0)
		rl_verbose("cannot watch standard output's reader: %s", strerror(errno));
	else
		stdout_watching = 1;
}

int
rl_io_would_wait(FILE *f, int fd, int *live)
{
	struct pollfd pf;
	struct stat st;

	if (f != NULL) {
#ifdef __GLIBC__
		/* what stdio read ahead is there already (glibc's FILE fields) */
		if (f->_IO_read_ptr < f->_IO_read_end)
			return 0;
#endif
		if (feof(f) || ferror(f))
			return 0;
		fd = fileno(f);
	}
	if (fd < 0)
		return 0;
	if (*live == 0)
		*live = fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) ? 1 : 2;
	if (*live != 1)
		return 0;
	pf.fd = fd;
	pf.events = POLLIN;
	pf.revents = 0;
	return poll(&pf, 1, 0) == 0;
}

int
rl_io_same_file(const char *in, const char *out)
{
	struct stat a, b;

	if (!in || !out || strcmp(in, "-") == 0 || strcmp(out, "-") == 0)
		return 0;
	if (stat(in, &a) != 0 || stat(out, &b) != 0)
		return 0;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino && S_ISREG(a.st_mode);
}

int
rl_io_fopen(FILE **out, const char *path, const char *mode)
{
	FILE *f;

	*out = NULL;
	if (strcmp(path, "-") == 0) {
		*out = mode[0] == 'r' ? stdin : stdout;
		return RL_OK;
	}
	f = fopen(path, mode);
	if (f == NULL) {
		int e = errno;
		rl_error("cannot open '%s': %s", path, strerror(e));
		return e == ENOENT ? RL_ENOENT : RL_EIO;
	}
	*out = f;
	return RL_OK;
}

int
rl_io_fread(FILE *f, void *buf, size_t n, size_t *got, const char *name)
{
	size_t r = 0;

	while (r < n) {
		size_t k = fread((char *)buf + r, 1, n - r, f);
		r += k;
		if (k == 0) {
			if (ferror(f)) {
				if (errno == EINTR) {
					clearerr(f);
					continue;
				}
				rl_error("cannot read '%s': %s", name ? name : "<stream>", strerror(errno));
				*got = r;
				return RL_EIO;
			}
			break;
		}
	}
	*got = r;
	return RL_OK;
}

int
rl_io_fwrite(FILE *f, const void *buf, size_t n, const char *name)
{
	if (n == 0)
		return RL_OK;
	if (fwrite(buf, 1, n, f) != n) {
		int e = errno;
		rl_error("cannot write '%s': %s", name ? name : "<stream>", strerror(e));
		return e == EPIPE ? RL_ECLOSED : RL_EIO;
	}
	return RL_OK;
}

int
rl_io_fclose(FILE *f, const char *name)
{
	const char *n = name ? name : "<stream>";

	if (f == NULL)
		return RL_OK;
	if (f == stdin)
		return RL_OK;
	if (f == stdout || f == stderr) {
		if (fflush(f) != 0) {
			rl_error("cannot write '%s': %s", n, strerror(errno));
			return RL_EIO;
		}
		return RL_OK;
	}
	if (fclose(f) != 0) {
		rl_error("cannot write '%s': %s", n, strerror(errno));
		return RL_EIO;
	}
	return RL_OK;
}

int
rl_io_close_stdout(void)
{
	/* fflush first: fclose's error alone would not say whether the data or the
	 * descriptor failed, and a closed stdout (EBADF) must count as failure. */
	int bad = ferror(stdout), e = 0;

	atomic_store(&stdout_closing, 1);
	if (stdout_watching) {
		/* a thread blocked in poll holds the pipe's file: closing fd 1 would not
		 * end it, and the reader would never see the end of its input */
		pthread_cancel(stdout_watcher);
		pthread_join(stdout_watcher, NULL);
		stdout_watching = 0;
	}
	if (fflush(stdout) != 0) {
		bad = 1;
		e = errno;
	}
	if (fclose(stdout) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	if (bad) {
		if (e)
			rl_error("cannot write '<stdout>': %s", strerror(e));
		else
			rl_error("cannot write '<stdout>'");
		return RL_EIO;
	}
	return RL_OK;
}

/* ---- whole files ------------------------------------------------------------------- */

int
rl_io_read_file(const char *path, size_t max, char **out, size_t *len)
{
	FILE *f = NULL;
	rl_buf b;
	int rv;
	const char *name = strcmp(path, "-") == 0 ? "<stdin>" : path;

	*out = NULL;
	*len = 0;
	rl_buf_init(&b);
	if ((rv = rl_io_fopen(&f, path, "rb")) != 0)
		return rv;
	for (;;) {
		size_t got;
		if ((rv = rl_buf_reserve(&b, 65536 + 1)) != 0)
			goto out;
		if ((rv = rl_io_fread(f, b.p + b.len, 65536, &got, name)) != 0)
			goto out;
		b.len += got;
		if (max && b.len > max) {
			rl_error("'%s' is larger than %zu bytes", name, max);
			rv = RL_ETOOBIG;
			goto out;
		}
		if (got < 65536)
			break;
	}
	b.p[b.len] = 0;
	*len = b.len;
	*out = (char *)rl_buf_steal(&b, NULL);
out:
	if (f != stdin)
		fclose(f);
	rl_buf_fini(&b);
	return rv;
}

static int
fsync_dir_of(const char *path)
{
	char *dir = rl_try_malloc(strlen(path) + 2, "path");
	char *slash;
	int fd, rv = RL_OK;

	if (dir == NULL)
		return RL_ENOMEM;
	strcpy(dir, path);
	slash = strrchr(dir, '/');
	if (slash == NULL)
		strcpy(dir, ".");
	else if (slash == dir)
		dir[1] = 0;
	else
		*slash = 0;
	fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0 || fsync(fd) != 0) {
		/* some file systems refuse fsync on directories (EINVAL): not fatal */
		if (errno != EINVAL) {
			rl_error("cannot sync directory '%s': %s", dir, strerror(errno));
			rv = RL_EIO;
		}
	}
	if (fd >= 0)
		close(fd);
	free(dir);
	return rv;
}

static atomic_uint tmp_counter;

static char *
tmp_name(const char *path)
{
	size_t n = strlen(path) + 64;
	char *t = rl_try_malloc(n, "path");

	if (t)
		snprintf(t, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
	return t;
}

int
rl_io_atomic_open(rl_io_atomic *a, const char *path, int mode)
{
	int fd;

	a->f = NULL;
	a->path = NULL;
	a->tmp = NULL;
	if ((a->path = strdup(path)) == NULL || (a->tmp = tmp_name(path)) == NULL)
		goto nomem;
	fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode ? mode : 0644);
	if (fd < 0) {
		int e = errno;
		rl_error("cannot create '%s': %s", a->tmp, strerror(e));
		free(a->path);
		free(a->tmp);
		a->path = a->tmp = NULL;
		return e == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if ((a->f = fdopen(fd, "wb")) == NULL) {
		close(fd);
		unlink(a->tmp);
		goto nomem;
	}
	return RL_OK;
nomem:
	free(a->path);
	free(a->tmp);
	a->path = a->tmp = NULL;
	rl_error("out of memory");
	return RL_ENOMEM;
}

void
rl_io_atomic_abort(rl_io_atomic *a)
{
	if (a == NULL)
		return;
	if (a->f)
		fclose(a->f);
	if (a->tmp)
		unlink(a->tmp);
	free(a->path);
	free(a->tmp);
	a->f = NULL;
	a->path = a->tmp = NULL;
}

int
rl_io_atomic_commit(rl_io_atomic *a)
{
	int rv = RL_OK;

	if (fflush(a->f) != 0 || ferror(a->f) || fsync(fileno(a->f)) != 0) {
		rl_error("cannot write '%s': %s", a->tmp, strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	if (fclose(a->f) != 0) {
		a->f = NULL;
		rl_error("cannot write '%s': %s", a->tmp, strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	a->f = NULL;
	if (rename(a->tmp, a->path) != 0) {
		rl_error("cannot rename '%s' to '%s': %s", a->tmp, a->path, strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	rv = fsync_dir_of(a->path);
	free(a->path);
	free(a->tmp);
	a->path = a->tmp = NULL;
	return rv;
fail:
	rl_io_atomic_abort(a);
	return rv;
}

int
rl_io_write_atomic(const char *path, const void *buf, size_t n, int mode)
{
	rl_io_atomic a;
	int rv;

	if ((rv = rl_io_atomic_open(&a, path, mode)) != 0)
		return rv;
	if ((rv = rl_io_fwrite(a.f, buf, n, a.tmp)) != 0) {
		rl_io_atomic_abort(&a);
		return rv;
	}
	return rl_io_atomic_commit(&a);
}

int
rl_io_mkdir_p(const char *path, int mode)
{
	char *p = strdup(path);
	int rv = RL_OK;

	if (p == NULL)
		return RL_ENOMEM;
	if (p[0] == 0) {
		free(p);
		rl_error("cannot create directory '': empty path");
		return RL_EINVAL;
	}
	for (char *s = p + 1;; s++) {
		if (*s == '/' || *s == 0) {
			char c = *s;
			*s = 0;
			if (mkdir(p, mode ? mode : 0755) != 0 && errno != EEXIST) {
				rl_error("cannot create directory '%s': %s", p, strerror(errno));
				rv = errno == ENOENT ? RL_ENOENT : RL_EIO;
				break;
			}
			*s = c;
			if (c == 0)
				break;
		}
	}
	if (rv == RL_OK) {
		struct stat st;
		if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
			rl_error("cannot create directory '%s': not a directory", path);
			rv = RL_EEXIST;
		}
	}
	free(p);
	return rv;
}

int
rl_io_remove_tree(const char *path)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	int rv = RL_OK, err = 0;

	if (lstat(path, &st) != 0)
		return errno == ENOENT ? RL_OK : RL_EIO;
	if (!S_ISDIR(st.st_mode))
		return unlink(path) == 0 || errno == ENOENT ? RL_OK : RL_EIO;
	if ((d = opendir(path)) != NULL) {
		while ((e = readdir(d)) != NULL) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			size_t n = strlen(path) + strlen(e->d_name) + 2;
			char *sub = malloc(n);
			int r;
			if (sub == NULL) {
				rv = RL_ENOMEM;
				break;
			}
			snprintf(sub, n, "%s/%s", path, e->d_name);
			if ((r = rl_io_remove_tree(sub)) != RL_OK && rv == RL_OK) {
				rv = r;
				err = errno;
			}
			free(sub);
		}
		closedir(d);
	}
	if (rmdir(path) != 0 && errno != ENOENT && rv == RL_OK) {
		rv = RL_EIO;
		err = errno;
	}
	if (rv == RL_EIO)
		errno = err;
	return rv;
}

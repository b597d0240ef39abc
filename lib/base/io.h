/*
 * io.h — checked file I/O: a growable byte buffer, reads and writes that
 * retry on EINTR and short counts, a bounded whole-file read, atomic file
 * replacement (temp file + fsync + rename + fsync of the directory) and a
 * checked close of stdout.
 *
 * Every failing function logs one line with rl_error() naming the path (and
 * the system's reason) and returns an rl_err; callers only propagate it.
 * Leaves out: mmap views (the model loader has its own), sockets (nng).
 */
#ifndef RL_IO_H
#define RL_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/core.h"

/* ---- growable buffer ---------------------------------------------------------
 * p is owned by the buffer (malloc'd, may be NULL while cap is 0); len bytes are
 * used.  The memory is 16-byte aligned.  Not thread-safe. */
typedef struct rl_buf {
	uint8_t *p;
	size_t len;
	size_t cap;
} rl_buf;

void rl_buf_init(rl_buf *b);                 /* empty, no allocation */
void rl_buf_fini(rl_buf *b);                 /* frees; accepts NULL; leaves b empty */
static inline void rl_buf_reset(rl_buf *b) { b->len = 0; }
/* Make room for `extra` more bytes after len (RL_ENOMEM / RL_ETOOBIG). */
int rl_buf_reserve(rl_buf *b, size_t extra);
int rl_buf_append(rl_buf *b, const void *p, size_t n);
int rl_buf_putc(rl_buf *b, int c);
int rl_buf_printf(rl_buf *b, const char *fmt, ...) RL_PRINTF(2, 3);
/* Take ownership of the bytes: returns p (caller frees), leaves b empty. */
uint8_t *rl_buf_steal(rl_buf *b, size_t *len);

/* ---- descriptors -------------------------------------------------------------
 * name is only used in messages (NULL: "fd N").  rl_io_read_full stores the
 * count read in *got (short only at end of file) and returns RL_OK; errors
 * RL_EIO.  rl_io_write_full writes everything or fails (RL_EIO; RL_ECLOSED on
 * EPIPE). */
int rl_io_read_full(int fd, void *buf, size_t n, size_t *got, const char *name);
int rl_io_write_full(int fd, const void *buf, size_t n, const char *name);

/* ---- FILE streams --------------------------------------------------------------
 * rl_io_fopen: "-" means stdin (mode "r...") or stdout (mode "w..."/"a...").
 * rl_io_fread: like rl_io_read_full on a FILE (short only at end of file).
 * rl_io_fwrite: everything or RL_EIO.  rl_io_fclose: fclose that reports a
 * failed flush (RL_EIO); never closes stdin/stdout/stderr, only flushes them. */
int rl_io_fopen(FILE **out, const char *path, const char *mode);
int rl_io_fread(FILE *f, void *buf, size_t n, size_t *got, const char *name);
int rl_io_fwrite(FILE *f, const void *buf, size_t n, const char *name);
int rl_io_fclose(FILE *f, const char *name);
/* 1 when out (an output path about to be opened for writing) is the file in
 * (both exist and are the same inode; "-" is never the same), else 0: opening
 * out would empty the input before it is read. */
int rl_io_same_file(const char *in, const char *out);
/* 1 when reading more from f (or, f NULL, from descriptor fd) would wait:
 * a pipe, socket or terminal with nothing buffered in f and nothing to read
 * now.  0 for regular files, at the end and when data is there.  For readers
 * that send what they have (rl-queue put, cat) before they block on a live
 * producer.  *live caches the descriptor's kind across calls (0 at first). */
int rl_io_would_wait(FILE *f, int fd, int *live);
/* For a program whose standard output is its data and may block for long on
 * something else (rl-rollout waiting for weights, rl-reward waiting for
 * records): when stdout is a pipe or socket, a thread waits for its reader to
 * go away and then ends the process (exit status 1, one line saying so).
 * Without it, `rl-rollout | rl-reward | rl-train` hung for the weights
 * timeout after rl-train stopped: rl-reward, blocked reading, never wrote to
 * notice, and rl-rollout waited for a weights version that would not come. */
void rl_io_watch_stdout(void);
/* Flush and close stdout; a failure (disk full, EPIPE, closed stdout) is logged
 * and returned as RL_EIO.  Call once at the end of main (BSD cat). */
int rl_io_close_stdout(void);

/* ---- whole files -----------------------------------------------------------------
 * rl_io_read_file: reads all of path ("-" is stdin) into a new malloc'd buffer
 * with one extra NUL byte after the data (so text can be parsed in place);
 * *out is owned by the caller.  A file longer than max bytes fails with
 * RL_ETOOBIG (max 0: no limit).  RL_ENOENT when the file does not exist. */
int rl_io_read_file(const char *path, size_t max, char **out, size_t *len);

/* rl_io_write_atomic: replaces path with exactly these bytes or leaves it as it
 * was: writes "<path>.tmp.<pid>.<n>" in the same directory, fsyncs it, renames
 * it over path and fsyncs the directory.  mode: permission bits of a new file
 * (0: 0644). */
int rl_io_write_atomic(const char *path, const void *buf, size_t n, int mode);

/* Streaming form of rl_io_write_atomic, for files written piece by piece:
 * rl_io_atomic_open gives a FILE (a->f) on a temp file; rl_io_atomic_commit
 * flushes, fsyncs, renames and frees; rl_io_atomic_abort removes the temp file.
 * After either, the struct is empty; abort on an empty struct does nothing. */
typedef struct rl_io_atomic {
	FILE *f;
	char *path;   /* owned: destination */
	char *tmp;    /* owned: temp file */
} rl_io_atomic;
int rl_io_atomic_open(rl_io_atomic *a, const char *path, int mode);
int rl_io_atomic_commit(rl_io_atomic *a);
void rl_io_atomic_abort(rl_io_atomic *a);

/* mkdir -p: creates path and its missing parents (mode 0755 when 0). */
int rl_io_mkdir_p(const char *path, int mode);

/* rm -r: removes path and everything under it, without following symbolic
 * links.  A path that does not exist is not an error.  Logs nothing: a caller
 * cleaning up after itself ignores the result, one that must know names the
 * path.  RL_OK, or RL_EIO with errno from the first thing that could not be
 * removed (it goes on with the rest), RL_ENOMEM. */
int rl_io_remove_tree(const char *path);

#endif

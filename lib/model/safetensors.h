/*
 * safetensors.h — a checked reader (mmap'd, read-only views) and a streaming
 * writer for the safetensors format: 8-byte little-endian header length N,
 * N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]},
 * "__metadata__": {str: str}}, then the data (offsets relative to its start).
 *
 * The reader treats the file as hostile: header length bounded by the file
 * size and RL_ST_MAX_HEADER, JSON parsed by length, no duplicate names, every
 * dtype known, every range inside the file, ranges not overlapping, and
 * shape x dtype size equal to the range.  Each failure is logged naming the
 * file and the tensor and returns RL_EFORMAT (RL_EIO / RL_ENOENT for system
 * errors).
 *
 * Sharded checkpoints (model.safetensors.index.json with a "weight_map") are
 * opened as one rl_st_set.
 *
 * Leaves out: model semantics (names, layouts; see model.c), dtype
 * conversion beyond rl_st_to_f32.
 */
#ifndef RL_SAFETENSORS_H
#define RL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"

#define RL_ST_MAX_HEADER ((size_t)100 << 20) /* 100 MiB, as the Rust crate */
#define RL_ST_MAX_DIMS 8

typedef struct rl_st_tensor {
	char *name;
	int dtype;                    /* rl_dtype */
	int ndim;
	int64_t shape[RL_ST_MAX_DIMS];
	size_t nelem;
	size_t nbytes;
	const void *data;             /* view into the mapping; not aligned in general */
} rl_st_tensor;

typedef struct rl_st_file {
	char *path;
	void *map;                    /* whole file, read-only */
	size_t size;
	rl_st_tensor *t;              /* sorted by name */
	int n;
	int borrowed;                 /* 1: map is the caller's memory (rl_st_open_mem) */
} rl_st_file;

/* rl_st_open maps and validates path.  *out is the caller's, closed with
 * rl_st_close (NULL ok).  Not thread-safe while opening; reading views is. */
int rl_st_open(rl_st_file **out, const char *path);
void rl_st_close(rl_st_file *f);
/* rl_st_open_mem validates size bytes at data (borrowed: the caller keeps
 * them alive and unchanged until rl_st_close) as a safetensors file; name
 * stands for the path in messages.  Same checks and errors as rl_st_open. */
int rl_st_open_mem(rl_st_file **out, const char *name, const void *data, size_t size);
/* Lookup by exact name; NULL when absent. */
const rl_st_tensor *rl_st_find(const rl_st_file *f, const char *name);

/* A set of files: one model.safetensors, or the shards listed by an index. */
typedef struct rl_st_set {
	rl_st_file **files;
	int nfiles;
} rl_st_set;
/* rl_st_set_open opens DIR/model.safetensors when present, else
 * DIR/model.safetensors.index.json (every shard it names must exist, every
 * tensor it maps must be in its shard), the order transformers loads them in.
 * A name present in two shards is an error. */
int rl_st_set_open(rl_st_set **out, const char *dir);
void rl_st_set_close(rl_st_set *s);
/* Lookup over all files; *file (optional) receives the file's path. */
const rl_st_tensor *rl_st_set_find(const rl_st_set *s, const char *name, const char **file);

/* Convert n elements of t (F32, BF16, F16, F64) starting at element first to
 * f32 in out.  RL_ESHAPE for other dtypes. */
int rl_st_to_f32(float *out, const rl_st_tensor *t, size_t first, size_t n);

/* ---- writer -------------------------------------------------------------- */
typedef struct rl_st_entry {
	const char *name;             /* borrowed */
	int dtype;
	int ndim;
	int64_t shape[RL_ST_MAX_DIMS];
} rl_st_entry;
/* fill writes the nbytes of entry i into buf (exactly shape x dtype bytes).
 * Returns 0 or an rl_err which aborts the write. */
typedef int (*rl_st_fill_fn)(void *ctx, int i, void *buf, size_t nbytes);
/* rl_st_write writes path (created or truncated) with the n entries in order,
 * header padded to 8 bytes, metadata pairs meta[2k] = key, meta[2k+1] = value
 * (nmeta pairs, may be 0), then fsyncs it.  Duplicate names: RL_EINVAL. */
int rl_st_write(const char *path, const rl_st_entry *e, int n, const char *const *meta, int nmeta,
    rl_st_fill_fn fill, void *ctx);

/* rl_st_write_mem: the same file built in memory (*out malloc'd, the
 * caller's; *outn bytes), no fsync: for a version that goes to rl-sync
 * without a checkpoint directory.  RL_ENOMEM, RL_EINVAL, or fill's error. */
int rl_st_write_mem(uint8_t **out, size_t *outn, const rl_st_entry *e, int n, const char *const *meta, int nmeta,
    rl_st_fill_fn fill, void *ctx);

/* lib-private: read a whole small file (at most limit bytes, RL_ETOOBIG from its size
 * before reading), NUL-terminated, with rl_io_read_file;
 * *buf is the caller's (free). Errors are logged naming the path. */
int rli_read_file(const char *path, char **buf, size_t *len, size_t limit);

#endif

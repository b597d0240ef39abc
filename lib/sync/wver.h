/*
 * wver.h — rl_wver, one version of the weights in memory: a number plus a
 * complete, ordered set of named byte blobs (the files of a checkpoint
 * directory, or the tensors of a tensor table) with 1 MiB piece hashes, a
 * hash per blob and one over the version.  Readers never see a half-made
 * version: every blob is verified piece by piece before a version is handed
 * out, written to disk or served.
 *
 * Leaves out: reading and writing directories (wdir.h), moving versions
 * (wsync.h, wshm.h).  The 64-bit checksum is rl_hash64 (XXH64, base/hash.h).
 */
#ifndef RL_WVER_H
#define RL_WVER_H

#include <stddef.h>
#include <stdint.h>

#define RL_WSYNC_PIECE ((size_t)1 << 20)        /* hashing granularity, bytes */
#define RL_WSYNC_CHUNK_DEFAULT ((size_t)4 << 20) /* transfer chunk, multiple of PIECE */
#define RL_WSYNC_CHUNK_MAX ((size_t)64 << 20)
#define RL_WSYNC_MAX_BLOBS 65536
#define RL_WSYNC_NAME_MAX 255
#define RL_WSYNC_MANIFEST "rlsync.json"         /* per-version file in a version dir */

typedef struct rl_wblob {
	char *name;          /* owned; a file name or tensor name, no '/' for files */
	uint64_t size;       /* bytes */
	uint8_t *data;       /* size bytes; owned by the rl_wver unless borrowed */
	int elem;            /* element size for byte-plane shuffling: 1 (none), 2, 4 */
	int device;          /* -1: host memory (the only kind this build moves) */
	uint64_t hash;       /* hash of the piece hashes (rl_wver_hash fills it) */
	uint64_t *pieces;    /* owned; ceil(size / RL_WSYNC_PIECE) piece hashes */
} rl_wblob;

typedef struct rl_wver {
	uint64_t version;    /* >= 1 */
	uint64_t hash;       /* over version number, names, sizes and blob hashes */
	int nblobs;
	rl_wblob *blobs;     /* owned array */
	int borrowed;        /* 1: blob data belongs to the caller (rl_wver_add_blob copy=0) */
	uint32_t chunk;      /* transfer chunk size a server serves it with (0: default);
	                      * kept in rlsync.json so a restarted server keeps its chunking */
	void *map;           /* NULL, or a read-only shared mapping the blobs point into
	                      * (shared memory transport, wshm.h); unmapped by destroy */
	size_t mapn;
	uint64_t lineage;    /* the line of versions it belongs to: 0 until the first
	                      * rewind (a resumed trainer's), one more after each; set by
	                      * a fetch (the server's) and kept in rlsync.json */
} rl_wver;

/* rl_wver_create: an empty version numbered `version`.  *out is owned by the
 * caller (rl_wver_destroy).  rl_wver_add_blob appends a blob: copy=1 copies
 * data, copy=0 borrows it (the caller keeps it alive and unchanged until
 * destroy; mixing modes is refused with RL_EINVAL).  Names must be unique,
 * 1..255 bytes.  elem 0 picks a default from the name (2 for *.safetensors
 * and *.bin, else 1).  Not thread-safe on one rl_wver. */
int rl_wver_create(rl_wver **out, uint64_t version);
int rl_wver_add_blob(rl_wver *v, const char *name, const void *data, uint64_t size, int elem, int copy);
/* rl_wver_add_blob_owned: like copy=1, but takes data (malloc'd) instead of
 * copying it: freed by rl_wver_destroy, also when this fails. */
int rl_wver_add_blob_owned(rl_wver *v, const char *name, void *data, uint64_t size, int elem);
#define RLI_WVER_TAKE 2 /* rl_wver_add_blob's copy mode behind _owned */
void rl_wver_destroy(rl_wver *v);

/* rl_wver_hash computes every piece hash, blob hash and the version hash.
 * Call it after the last add_blob (publishers do it for you). */
int rl_wver_hash(rl_wver *v);
/* rl_wver_verify recomputes and compares with the stored hashes:
 * RL_ECHECKSUM (logged, naming the blob) if anything differs. */
int rl_wver_verify(const rl_wver *v);
/* rl_wver_total: bytes over all blobs. */
uint64_t rl_wver_total(const rl_wver *v);
/* rl_wver_find: the blob called name, or NULL. */
const rl_wblob *rl_wver_find(const rl_wver *v, const char *name);

#endif

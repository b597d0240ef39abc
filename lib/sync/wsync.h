/*
 * wsync.h — versioned weight distribution (rl-sync): the trainer publishes
 * version v of the weights, rollout workers are told and pull it.
 *
 * A version is a number plus a complete, ordered set of named byte blobs (the
 * files of a checkpoint directory today; the tensors of a tensor table when a
 * caller has one) with sizes and checksums.  Readers never see a half-made
 * version: every blob is verified piece by piece (1 MiB pieces, 64-bit hash)
 * before a version is handed out, written to disk or served.
 *
 * This header has four layers:
 *   1. the 64-bit checksum: rl_hash64 (XXH64) in base/hash.h.
 *   2. rl_wver — an in-memory version: blobs, piece hashes, version hash;
 *      read from / written to a directory (atomically; see wdir.h).
 *   3. The nng service (rl_wsync_server_*) and its client (rl_wsync_client_*):
 *      REQ/REP with contexts, chunked, zstd-compressed, byte-plane shuffled,
 *      optionally XOR-delta against the previous version; long-poll for new
 *      versions.  Beside it a bulk stream (TCP, TLS next to tls+tcp://,
 *      or a Unix socket) that
 *      writes whole uncompressed chunks straight from memory into the
 *      client's buffer, used by default with a server on the same host.
 *      The wire format is in docs/sync.md.
 *   4. rl_wsync — one handle over transports chosen by URL (tcp://, ipc://,
 *      inproc:// -> nng; file:// or a path -> wdir), the calls rl-train
 *      (publish) and rl-rollout (poll, fetch) use.  The transport vtable is
 *      where NCCL broadcast and CUDA IPC plug in later (nccl://, cuda-ipc://
 *      are recognised and refused with RL_ENOTSUP in this build).
 *
 * Leaves out: device memory (every blob is host memory here; rl_wblob.device
 * is the hook), sharded safetensors awareness (a shard is just a blob).
 */
#ifndef RL_WSYNC_H
#define RL_WSYNC_H

#include <stddef.h>
#include <stdint.h>
#include <signal.h>

/* ---- 1. checksum: rl_hash64 (XXH64) in base/hash.h ------------------------ */
#include "base/hash.h"

/* ---- 2. versions: sync/wver.h; directories: sync/wdir.h ------------------ */
#include "sync/wver.h"
#include "sync/wdir.h"

/* ---- codec (used by the service; public for tests and benchmarks) ----------
 * A chunk is encoded as: optional XOR with the same bytes of a base version,
 * byte-plane shuffle by elem, zstd at `level` — or stored raw when zstd does
 * not save at least 3%, or (planes of a delta with at most 1/16 non-zero
 * bytes) sparse: zstd'd zero-run lengths plus the non-zero bytes.  flags report what was applied. */
enum { RL_WENC_ZSTD = 1, RL_WENC_DELTA = 2, RL_WENC_SHUF = 4 };
/* rl_wsync_encode: *out is malloc'd (caller frees), *outn its size. */
int rl_wsync_encode(uint8_t **out, size_t *outn, uint32_t *flags, const uint8_t *raw, const uint8_t *base,
		    size_t n, int elem, int level);
/* rl_wsync_decode: writes exactly n bytes to dst; base is required when flags
 * has RL_WENC_DELTA.  RL_EFORMAT for anything that does not decode to n bytes. */
int rl_wsync_decode(uint8_t *dst, size_t n, const uint8_t *enc, size_t encn, uint32_t flags, const uint8_t *base,
		    int elem);

/* ---- 3. nng service and client --------------------------------------------- */
typedef struct rl_wsync_server rl_wsync_server;
typedef struct rl_wsync_server_opts {
	const char *listen;    /* nng URL; tcp://127.0.0.1:7401 if NULL */
	const char *data_dir;  /* NULL: memory only; else versions persisted (wdir layout) */
	int keep_previous;     /* also hold (and serve) the version before the latest */
	int contexts;          /* concurrent requests incl. parked waits; 0 -> 64 */
	int threads;           /* worker threads; 0 -> 4 */
	size_t max_msg;        /* NNG_OPT_RECVMAXSZ; 0 -> RL_WSYNC_CHUNK_MAX + 64 KiB */
	int level;             /* zstd level for encodings the server makes; 0 -> 1 */
	uint64_t max_bytes;    /* largest version accepted; 0 -> half the physical memory */
	int bulk;              /* -1: no bulk stream; else (tcp://, tls+tcp:// and ipc:// URLs)
	                        * a second listener streams whole raw chunks straight from
	                        * memory (tcp: same host, an ephemeral port the clients are
	                        * told; tls+tcp: the same under TLS with the REP listener's
	                        * files, base/nngx.h) */
	int shm;               /* -1: no shared memory service; else every version is kept
	                        * in a sealed memfd that clients on this host map (wshm.h) */
	double part_timeout_s; /* a version pushed in parts is aborted when a part is not in
	                        * this long after its first part began; 0 -> 60 */
} rl_wsync_server_opts;

/* rl_wsync_server_open starts serving in background threads.  With data_dir
 * it first loads the latest complete version found there (if any).  *out is
 * owned by the caller; rl_wsync_server_close stops and frees (NULL ok). */
int rl_wsync_server_open(rl_wsync_server **out, const rl_wsync_server_opts *o);
void rl_wsync_server_close(rl_wsync_server *s);
/* rl_wsync_server_url: the URL it listens on, with the port the system
 * chose for a tcp:// port 0 (borrowed, lives as long as s). */
const char *rl_wsync_server_url(const rl_wsync_server *s);
/* rl_wsync_server_latest: newest published version number, 0 if none. */
uint64_t rl_wsync_server_latest(rl_wsync_server *s);
/* rl_wsync_server_publish publishes v in-process (takes ownership of v on
 * success).  Versions must increase (RL_ESTALE otherwise). */
int rl_wsync_server_publish(rl_wsync_server *s, rl_wver *v);

typedef struct rl_wsync_stats {
	uint64_t bytes_sent, bytes_recv;  /* message bodies on the wire (client side) */
	uint64_t chunks, retries;         /* chunks moved, chunks re-requested after a bad checksum */
	uint64_t raw_bytes;               /* decoded bytes */
	uint64_t bulk_chunks;             /* of chunks, those that came over the bulk stream */
	uint64_t shm_versions;            /* versions mapped from the server's shared memory */
} rl_wsync_stats;

/* How a client fetches (rl_wsync_client_opts.transport, --transport):
 *   AUTO   shared memory when the server runs on this host (it advertises a
 *          host+boot id that matches ours), else the bulk stream / REQ/REP as
 *          `stored` and `bulk` say; a failing shm fetch falls back (verbose note);
 *   SHM    shared memory only (RL_ENOTSUP if the server is elsewhere);
 *   STREAM never shared memory: bulk stream where possible, else REQ/REP;
 *   NNG    REQ/REP messages only (no shm, no bulk stream). */
enum { RL_WSYNC_T_AUTO = 0, RL_WSYNC_T_SHM, RL_WSYNC_T_STREAM, RL_WSYNC_T_NNG, RL_WSYNC_T_FILE };
/* rl_wsync_transport_parse: "auto", "shm", "stream", "nng", "file" -> RL_WSYNC_T_*;
 * RL_EINVAL (not logged) for anything else. */
int rl_wsync_transport_parse(const char *name, int *out);

typedef struct rl_wsync_client rl_wsync_client;
typedef struct rl_wsync_client_opts {
	int timeout_ms;       /* per request; 0 -> 10000 */
	int parallel;         /* chunks in flight; 0 -> 4 */
	int level;            /* zstd level for push; 0 -> 1 */
	size_t chunk;         /* push chunk size; 0 -> RL_WSYNC_CHUNK_DEFAULT */
	int retries;          /* re-sends of a chunk with a bad checksum; 0 -> 3 */
	int stored;           /* fetch of whole chunks: 1 uncompressed, -1 zstd-compressed,
	                       * 0 auto: uncompressed when the server is on this host
	                       * (loopback, ipc://, inproc://), where compression only
	                       * costs CPU.  Deltas are always compressed. */
	int bulk;             /* -1: never use the server's bulk stream for uncompressed
	                       * whole chunks (REQ/REP only) */
	size_t max_msg;       /* NNG_OPT_RECVMAXSZ; 0 -> RL_WSYNC_CHUNK_MAX + 64 KiB */
	uint64_t max_bytes;   /* largest version fetched; 0 -> half the physical memory */
	int transport;        /* RL_WSYNC_T_AUTO (0), _SHM, _STREAM or _NNG; a version fetched
	                       * over shm (rl_wsync_fetch) is a read-only mapping (v->map) */
} rl_wsync_client_opts;

/* rl_wsync_client_open dials url (non-blocking dial: a server that starts
 * later is found).  o may be NULL.  Not thread-safe: one thread per client. */
int rl_wsync_client_open(rl_wsync_client **out, const char *url, const rl_wsync_client_opts *o);
void rl_wsync_client_close(rl_wsync_client *c);
/* rl_wsync_status: the server's state as a JSON text (malloc'd, caller frees):
 * {"latest":N,"previous":N,"versions":[{"version","hash","bytes","blobs",
 * "chunks","delta_base"}...],"pushing":N|null,...}. */
int rl_wsync_status(rl_wsync_client *c, char **json);
/* rl_wsync_poll long-polls: returns RL_OK with *latest > have as soon as the
 * server has such a version, RL_ETIMEDOUT after timeout_ms (-1: forever). */
int rl_wsync_poll(rl_wsync_client *c, uint64_t have, int timeout_ms, uint64_t *latest);
/* rl_wsync_poll_line: the same for a caller that holds a version of line
 * `lineage` (rl_wver.lineage of what it fetched; 0 if nothing): RL_OK also
 * when the server's line is another one (the trainer resumed from an older
 * checkpoint and the server rewound), whatever *latest is: the caller then
 * takes the latest, even if its number is not above `have`.  *latest_lineage
 * is the server's line (0 from a server older than rewinds, which never
 * answers early).  RL_ETIMEDOUT as rl_wsync_poll. */
int rl_wsync_poll_line(rl_wsync_client *c, uint64_t have, uint64_t lineage, int timeout_ms, uint64_t *latest,
		       uint64_t *latest_lineage);
/* rl_wsync_fetch gets version `version` (0: latest) into memory.  If base is
 * non-NULL and the server holds a delta of that version against base, only
 * the delta moves.  Every chunk is verified; a bad one is re-requested up to
 * `retries` times (then RL_ECHECKSUM).  RL_ENOENT: the server has no such
 * version (it moved on; fetch the latest).  *out is owned by the caller. */
int rl_wsync_fetch(rl_wsync_client *c, rl_wver **out, uint64_t version, const rl_wver *base);
/* rl_wsync_fetch_into fetches into dst, a version of the same layout
 * (blob names, order and sizes; RL_ESHAPE otherwise) whose buffers are
 * overwritten: a worker's double buffer, so no memory is allocated per
 * version.  base (the other buffer) must not be dst.  On success dst holds
 * the version (number, hashes); on failure dst->version is 0 and its bytes
 * are undefined. */
int rl_wsync_fetch_into(rl_wsync_client *c, rl_wver *dst, uint64_t version, const rl_wver *base);
/* rl_wsync_push sends v to the server.  base non-NULL: send v XOR base (the
 * server must still hold base as its latest; otherwise this falls back to a
 * full push).  Hashes v if not yet hashed.  v is borrowed.
 * Transport (opts.transport): AUTO hands v to a server on this host (same
 * host id, as for fetch) as one sealed memfd over its shared memory service,
 * ignoring base (a delta only costs CPU on one host; one copy, no codec), and
 * falls back to chunks if that fails; SHM only that (RL_ENOTSUP if the
 * server is elsewhere); STREAM and NNG always send chunks (deltas against
 * base, whole chunks uncompressed to a loopback server unless stored < 0). */
int rl_wsync_push(rl_wsync_client *c, rl_wver *v, const rl_wver *base);
/* rl_wsync_push_part: push v as part `index` of `count` parts of version
 * v->version (docs/sync.md, "A version pushed in parts"): v holds only this
 * part's blobs (the parts' blob names disjoint), base this part's previous
 * version for a delta (or NULL).  Several processes push the parts of one
 * version at once; the server publishes it when the last part is in, and
 * *published (may be NULL) says whether this call's part was that one.
 * Parts go as chunks, never over shared memory. */
int rl_wsync_push_part(rl_wsync_client *c, rl_wver *v, const rl_wver *base, int index, int count, int *published);
/* rl_wsync_push_rewind: push v (whole) for a trainer resumed from version
 * v->version: the server drops the versions it holds (and keeps in its
 * data directory) from that number up, serves v as the latest, on a new line
 * (v->lineage says which on return), and workers on the old line are told
 * (rl_wsync_poll_line).  If the server's latest is v (number and hash) it
 * keeps it; if it holds nothing at or above v->version this is an ordinary
 * push.  Only a resumed trainer may do this: an ordinary push of an old
 * version stays refused (RL_ESTALE).  A server older than rewinds refuses it
 * as such (RL_ESTALE, with a hint). */
int rl_wsync_push_rewind(rl_wsync_client *c, rl_wver *v);
/* Counters since open (or the last reset). */
void rl_wsync_client_stats(rl_wsync_client *c, rl_wsync_stats *st, int reset);

/* Test hooks: the next n chunk replies this process's servers send (REQ/REP
 * or bulk), or chunks (or shared memory objects) its clients push, are
 * corrupted after checksumming (one payload byte flipped).  Also read from the
 * environment when a server opens: RL_WSYNC_TEST_CORRUPT=n, and
 * RL_WSYNC_TEST_SLOW_MS=ms (sleep before each chunk reply, to kill a client
 * mid-transfer in tests), RL_WSYNC_TEST_SLOW_COMMIT_MS=ms (sleep in each
 * PUSH_COMMIT before the version is saved). */
void rl_wsync_test_corrupt(int n);

/* ---- 4. one handle over transports --------------------------------------------
 * A transport moves versions; this is the seam for GPU transports.  An
 * implementation fills the table and a `self`; rl_wsync_open picks one by
 * URL.  Contract for each entry (all may block; none is called concurrently
 * on one handle):
 *   publish: make v visible as a whole (atomically) to readers; v borrowed.
 *   poll:    wait up to timeout_ms for a version > have; RL_ETIMEDOUT if none.
 *   fetch:   get `version` (0 = latest) into *out (caller owns); base is a
 *            hint for deltas, may be ignored.
 *   close:   free self.
 * A NCCL transport would publish by broadcasting each blob from the trainer
 * rank and fetch into device blobs (rl_wblob.device >= 0); a CUDA IPC one
 * would publish cudaIpcMemHandle_t's of the trainer's weight buffer. */
typedef struct rl_wsync_transport {
	const char *name;
	int (*publish)(void *self, rl_wver *v);
	int (*poll)(void *self, uint64_t have, int timeout_ms, uint64_t *latest);
	int (*fetch)(void *self, rl_wver **out, uint64_t version, const rl_wver *base);
	void (*close)(void *self);
	/* optional (NULL: RL_ENOTSUP, and poll without lines): */
	int (*rewind)(void *self, rl_wver *v);  /* publish v, dropping every version from its
	                                         * number up, on a new line (v->lineage set) */
	int (*poll_line)(void *self, uint64_t have, uint64_t lineage, int timeout_ms, uint64_t *latest,
			 uint64_t *latest_lineage);   /* poll, and RL_OK when the line is another */
} rl_wsync_transport;

typedef struct rl_wsync rl_wsync;
/* rl_wsync_open: url is tcp://, ipc://, inproc:// (nng client of an rl-sync
 * server), file://DIR or a plain path (the wdir file transport; keep = old
 * versions kept by publish, 0 -> 2), nccl:// or cuda-ipc:// (RL_ENOTSUP). */
int rl_wsync_open(rl_wsync **out, const char *url, int keep);
/* rl_wsync_open_with: the same with a client transport (RL_WSYNC_T_*): FILE
 * needs a directory URL, the others an nng URL (RL_EINVAL otherwise). */
int rl_wsync_open_with(rl_wsync **out, const char *url, int keep, int transport);
/* rl_wsync_open_transport wraps a caller-made transport (takes self). */
int rl_wsync_open_transport(rl_wsync **out, const rl_wsync_transport *t, void *self);
void rl_wsync_close(rl_wsync *s);
const char *rl_wsync_transport_name(const rl_wsync *s);
/* The trainer: publish v (borrowed).  Over nng the previous published
 * version is used as delta base when delta=1 and the layout matches (and is
 * kept only while pushes do not go over shared memory, rl_wsync_push). */
int rl_wsync_publish(rl_wsync *s, rl_wver *v, int delta);
/* The trainer, from a checkpoint directory it just wrote. */
int rl_wsync_publish_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version, int delta);
/* The trainer resumed from a checkpoint of version v->version (v borrowed):
 * publish it again, dropping whatever was published above it before the
 * trainer stopped (rl_wsync_push_rewind; a directory: rl_wdir_rewind_ver).
 * The next publish goes as a delta against v.  _dir: from the checkpoint
 * directory, numbered `version`. */
int rl_wsync_rewind(rl_wsync *s, rl_wver *v);
int rl_wsync_rewind_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version);
/* Rollout workers. */
int rl_wsync_poll_version(rl_wsync *s, uint64_t have, int timeout_ms, uint64_t *latest);
/* rl_wsync_poll_version for a worker holding a version of line `lineage`
 * (rl_wver.lineage): RL_OK also when the source moved to another line
 * (*latest_lineage != lineage): then take the latest whatever its number. */
int rl_wsync_poll_version_line(rl_wsync *s, uint64_t have, uint64_t lineage, int timeout_ms, uint64_t *latest,
			       uint64_t *latest_lineage);
int rl_wsync_fetch_version(rl_wsync *s, rl_wver **out, uint64_t version, const rl_wver *base);
/* rl_wsync_fetch_version of `version`, or, when the server no longer holds it (RL_ENOENT:
 * a newer one was published between the poll and the fetch, and the server keeps only the
 * latest), of the latest it holds then (a few tries); (*out)->version says which. */
int rl_wsync_fetch_newest(rl_wsync *s, rl_wver **out, uint64_t version, const rl_wver *base);


/* ---- 5. pulling into a version directory (pull.c; rl-sync pull) ------------ */
typedef struct rl_wsync_pull_opts {
	const char *url;                  /* the server */
	const char *out;                  /* version directory (wdir.h) written */
	rl_wsync_client_opts client;
	uint64_t version;                 /* 0: the latest; else this one (not with follow) */
	int wait;                         /* wait for a version if the server has none yet */
	int follow;                       /* keep pulling each new version (a delta when possible) */
	int keep;                         /* versions kept in out; 0 -> 2 */
	volatile sig_atomic_t *stop;      /* set (by a signal handler) to stop cleanly; NULL none */
} rl_wsync_pull_opts;
/* rl_wsync_pull fetches versions newer than out's latest into out, following
 * the server back when it rewound.  RL_OK also when out already holds the
 * server's latest, and on a stop.  Without wait or follow and with no
 * version on the server: RL_ENOENT and *empty = 1 (rl-sync exits 3); *empty
 * is 0 otherwise.  Logs every failure.  Test hook RL_SYNC_TEST_PULL_PAUSE_MS:
 * a pause between poll and fetch. */
int rl_wsync_pull(int *empty, const rl_wsync_pull_opts *o);

#endif

/*
 * wsync_int.h — lib/sync's private insides shared by wver.c, codec.c,
 * wire.c, server.c and client.c: the rl-sync wire format's constants and
 * headers, the helpers both ends use, and the test hooks.
 *
 * Wire format (all integers little-endian; see docs/sync.md):
 *   every message: header (40 bytes) then body
 *     u32 magic "RLSY", u16 proto (1), u16 op, u32 header length (40),
 *     i32 status (rl_err, replies), u64 version, u64 a, u64 b
 *   a reply has op | 0x8000.  Chunk bodies start with u32 flags, u32 elem,
 *   u64 raw length, then the encoded bytes.
 *   bulk stream (a second socket, under TLS next to tls+tcp://): 48-byte request "RLSB" for a range
 *   of chunks, each answered by a 48-byte header and the raw chunk bytes.
 * Not installed; nothing outside lib/sync includes it.
 */
#ifndef RL_WSYNC_INT_H
#define RL_WSYNC_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "sync/wver.h"

#define WS_MAGIC 0x59534c52u /* "RLSY" little-endian */
#define WS_PROTO 1
#define WS_HDR 40
/* A request made with a shared key (--auth-key-file) has header length 88:
 * bytes 40..47 u64 time (Unix ns), 48..55 u64 nonce, 56..87 the MAC of
 * rli_auth_seal (base/auth.h) with a = bytes 0..55 and b = everything from
 * byte 88.  A keyed
 * server refuses a request with a shorter header, a wrong HMAC, a stale time
 * or a seen (time, nonce) (base/auth.h); the protocol version stays 1, as a
 * server without a key skips the longer header.
 * tls: the client dialled tls+tcp:// (sign) or the server listens there
 * (check).  Over TLS the MAC is rli_auth_seal_head's over bytes 0..55 alone,
 * TLS protecting the rest; a server there takes either proof, one on plain
 * tcp:// refuses the header-only one, saying so. */
#define WS_AUTH_HDR 88
void rli_ws_auth_sign(uint8_t *msg, size_t len, int tls);
int rli_ws_auth_check(const uint8_t *msg, size_t len, int tls, const char **why);
/* The same proof on the other sockets' requests (the bulk stream's, the
 * shared memory service's): every one has its header length at bytes 8..11;
 * with a key that field says base + 48, and bytes base..base+47 hold the
 * time, the nonce and the MAC with a = bytes 0..base+15, b = the rest (these
 * requests have none).  A keyed server refuses the request otherwise. */
#define WS_AUTH_EXTRA 48
void rli_ws_auth_sign_at(uint8_t *msg, size_t base, size_t len);
int rli_ws_auth_check_at(const uint8_t *msg, size_t base, size_t len, const char **why);
#define WM_MAGIC 0x4d574c52u /* "RLWM": manifest */
#define WS_WAIT_MAX_MS 30000 /* a parked long-poll is answered at least this often */
enum { OP_STATUS = 1, OP_WAIT, OP_MANIFEST, OP_CHUNK, OP_PUSH_BEGIN, OP_PUSH_CHUNK, OP_PUSH_COMMIT, OP_DATA,
       OP_SHM, OP_REPLY = 0x8000 };

/* bulk stream (a second listener; docs/sync.md): the client asks for a range
 * of whole chunks with one 48-byte request, the server answers each chunk with
 * a 48-byte header and the raw bytes, written straight from the version */
#define WB_MAGIC 0x42534c52u /* "RLSB" */
#define WB_PROTO 1
#define WB_HDR 48
#define WB_GET 1
#define WB_MAX_CONNS 256

static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static inline uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* a parsed message header; body points into the message */
typedef struct whdr {
	uint16_t op;
	int32_t status;
	uint64_t version, a, b;
	const uint8_t *body;
	size_t bodyn;
} whdr;

/* chunk table of a version at a chunk size */
typedef struct cref {
	int blob;
	uint64_t off;
	size_t len;
} cref;

/* chunk body: u32 flags, u32 elem, u64 raw length, then the payload.  A
 * CHUNK request's b is the delta base the client holds (0 none); bit 63
 * asks for whole chunks stored, not compressed (fast links). */
#define CHUNK_STORED ((uint64_t)1 << 63)
#define CB_HDR 16
#define WAIT_LINEAGE ((uint64_t)1 << 63) /* WAIT: version = this | the client's lineage */
#define PUSH_REWIND 1                     /* PUSH_BEGIN a: drop the versions from this one up */
/* PUSH_BEGIN a: this push is part (a >> 16) & 0xffff of (a >> 32) & 0xffff
 * parts of the version; its PUSH_CHUNKs and PUSH_COMMIT carry b = part + 1
 * (docs/sync.md, "A version pushed in parts") */
#define PUSH_PART 2
#define PUSH_PART_A(index, count) (PUSH_PART | (uint64_t)(index) << 16 | (uint64_t)(count) << 32)
#define PUSH_PART_MAX 4096
/* PUSH_COMMIT reply b of a part: the part is staged, or the version published */
enum { PART_STAGED = 1, PART_PUBLISHED = 2 };

/* an encoded chunk's segment header (codec.c) */
#define SEG_HDR 8

/* test hook: corrupt the next n chunks sent or pushed (rl_wsync_test_corrupt) */
extern atomic_int rli_ws_test_corrupt;

/* wver.c */
static inline size_t rli_wver_npieces(uint64_t size) { return (size_t)((size + RL_WSYNC_PIECE - 1) / RL_WSYNC_PIECE); }
uint64_t rli_wver_blob_hash(const rl_wblob *b);
uint64_t rli_wver_version_hash(const rl_wver *v);

/* codec.c: rl_wsync_decode, and with pieces non-NULL also checks each
 * RL_WSYNC_PIECE of the output against pieces[] (the chunk starts on a piece
 * boundary): RL_ECHECKSUM on a mismatch */
int rli_ws_decode_chunk(uint8_t *dst, size_t n, const uint8_t *enc, size_t encn, uint32_t flags,
			const uint8_t *base, int elem, const uint64_t *pieces);

/* wire.c */
void rli_ws_hdr_fill(uint8_t *p, uint16_t op, int32_t status, uint64_t version, uint64_t a, uint64_t b);
/* rli_ws_hdr_parse: validates magic, protocol version and lengths; msg is hostile */
int rli_ws_hdr_parse(whdr *h, const uint8_t *p, size_t n, const char **why);
int rli_ws_chunk_table(cref **out, size_t *nout, const rl_wver *v, size_t chunk);
/* 1 when a and b have the same blob names and sizes */
int rli_ws_same_layout(const rl_wver *a, const rl_wver *b);
int rli_ws_manifest_encode(uint8_t **out, size_t *outn, const rl_wver *v, uint32_t chunk, uint64_t delta_base);
/* rli_ws_manifest_decode: a hostile manifest into a version with allocated
 * (zeroed if zero=1), unverified blobs and the expected hashes. */
int rli_ws_manifest_decode(rl_wver **out, uint32_t *chunk, uint64_t *delta_base, const uint8_t *p, size_t n,
			   const char **why, int alloc, uint64_t limit);
/* all of (a, an) then (b, bn) on a blocking socket; 0 or -1 */
int rli_ws_sock_send2(int fd, const void *a, size_t an, const void *b, size_t bn);
/* exactly n bytes; 0, or -1 (error, timeout or the peer closed) */
int rli_ws_sock_recv(int fd, void *p, size_t n);
void rli_ws_sock_timeouts(int fd, int ms);
/* one end of a bulk stream connection: the socket, and over tls+tcp:// its
 * TLS (base/tls_ossl.h) or NULL.  The rli_wb_ calls return RL_OK,
 * RL_ETIMEDOUT (the socket's timeout), RL_ECLOSED or RL_ENET. */
struct rli_tls_sock;
typedef struct wbio {
	int fd;
	struct rli_tls_sock *tls;
} wbio;
/* all of (a, an) then (b, bn): one sendmsg on a plain socket, two TLS
 * writes (records of up to 16 KiB) over TLS */
int rli_wb_send2(const wbio *io, const void *a, size_t an, const void *b, size_t bn);
/* exactly n bytes */
int rli_wb_recv(const wbio *io, void *p, size_t n);
/* 1 to n bytes, *got of them */
int rli_wb_recv_some(const wbio *io, void *p, size_t n, size_t *got);
/* half the machine's memory: what one version may claim in a manifest */
uint64_t rli_ws_default_max_bytes(void);
/* an nng error while opening `what` at url: logged, mapped to an rl_err */
int rli_ws_nng_err(int r, const char *what, const char *url);

/* client.c: 1 when c's last push went over shared memory (wsync.c keeps no
 * delta base then) */
struct rl_wsync_client;
int rli_wsync_client_last_push_shm(const struct rl_wsync_client *c);

#endif

/*
 * qproto.h — the rl-queue wire protocol: one nng REQ/REP message per request
 * and per reply, a fixed 32-byte header, an op-specific fixed part and an
 * optional body.
 *
 *   header (little-endian, 32 bytes):
 *     0  u8[4] magic "RLQP"      4  u8 version (1)   5  u8 op (reply: op|0x80)
 *     6  u16 flags               8  u16 header length (32; readers skip more)
 *     10 u16 status (rl_err, replies)                 12 u32 body raw length
 *     16 u64 request id (echoed)                      24 u64 arg (op argument)
 *   then the op's fixed part (never compressed), then the body: a record batch
 *   or JSON text, zstd-compressed when RL_QF_ZSTD is set (the body is then one
 *   zstd frame; "body raw length" is its decompressed size, checked against
 *   the receiver's limit before anything is allocated).
 *
 * Ops and their parts (request / reply):
 *   PING     -            / -
 *   PUT      arg = stage; body = record batch (a stream frame's content)
 *                         / fixed rl_qput_result (16 bytes)
 *   LEASE    fixed rl_qlease_req (32 bytes) / fixed lease part (32 bytes) + batch
 *   ACK      fixed (16 bytes) + u64 ids[n] / fixed (16 bytes)
 *   VERSION  arg = trainer version (RL_QF_REWIND: also lower) / arg = version now in force
 *   STAT     -            / body = JSON object
 *   REPORT   body = JSON object (a stage's stats, see wstat.h; at most
 *            RL_QP_MAX_REPORT bytes decompressed) / -
 *            Brokers older than REPORT answer "unknown op" (RL_EINVAL): a
 *            client then stops reporting; nothing else changes.
 * An error reply has status != 0 and a UTF-8 message as body.
 *
 * Shared key (--auth-key-file): a request sets RL_QF_AUTH and header length
 * 80; header bytes 32..79 are u64 time (Unix ns), u64 nonce (random), u8[32]
 * the MAC of rli_auth_seal (auth.h) with a = bytes 0..47 and b = everything
 * from byte 80 (the fixed part and the body).  A broker with a key refuses a request without
 * the flag, with a wrong HMAC, a time more than 300 s from its clock or a
 * (time, nonce) pair it has seen (auth.h), before the op is looked at.  The
 * version stays 1: a broker without a key skips the longer header.
 * Over tls+tcp:// the MAC is rli_auth_seal_head's over bytes 0..47 alone
 * (TLS protects the rest); a broker on plain tcp:// refuses that proof.
 *
 * Leaves out: sockets (qclient.c, qserve.c) and what records mean (queue.c).
 * Everything here is pure and thread-safe.
 */
#ifndef RL_QPROTO_H
#define RL_QPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"
#include "base/io.h"

#define RL_QP_MAGIC "RLQP"
#define RL_QP_VERSION 1
#define RL_QP_HDR_LEN 32
/* the header of a request that carries the shared key's proof */
#define RL_QP_AUTH_HDR_LEN 80
/* Default bound on one message and on one decompressed body. */
#define RL_QP_MAX_MSG ((size_t)64 << 20)
/* Bound on a REPORT body (decompressed): larger ones are refused. */
#define RL_QP_MAX_REPORT ((size_t)64 << 10)

enum rl_qop {
	RL_QOP_PING = 1,
	RL_QOP_PUT = 2,
	RL_QOP_LEASE = 3,
	RL_QOP_ACK = 4,
	RL_QOP_VERSION = 5,
	RL_QOP_STAT = 6,
	RL_QOP_REPORT = 7,
	RL_QOP_REPLY = 0x80
};

enum rl_qflag {
	RL_QF_ZSTD = 1,        /* the body is one zstd frame */
	RL_QF_ACCEPT_ZSTD = 2, /* request: the reply body may be compressed */
	RL_QF_REWIND = 4,      /* VERSION request: arg is the version, even below the broker's
	                        * (a trainer resumed from an older checkpoint) */
	RL_QF_AUTH = 8         /* request: header bytes 32..79 carry the key's proof */
};

/* Stages name the state a put moves records into and the state a lease takes
 * them from: put PROMPT / lease PROMPT (rollout), put GENERATED / lease
 * GENERATED (reward), put SCORED / lease SCORED (train: whole groups). */
enum rl_qstage { RL_QSTAGE_PROMPT = 0, RL_QSTAGE_GENERATED = 1, RL_QSTAGE_SCORED = 2, RL_QSTAGE_COUNT };

/* Ack kinds (ACK fixed part).  EXTEND with ids counts in `late` those the
 * lease no longer holds (expired, or aborted by early stop). */
/* TRAINED: the trainer trained these records but holds their lease until a
 * full checkpoint covers them (docs/queue.md, "Exactly once"): they no
 * longer count as in flight for the staleness gate; the lease is renewed. */
/* GROUPS: lease id 0, the ids are n / 2 ranges [lo, hi] (ascending,
 * disjoint) of group ids a resumed trainer's full checkpoint holds: the
 * broker finishes (done) the samples of those groups it still has scored;
 * `done` counts them.  Brokers older than this answer RL_EINVAL. */
enum rl_qack { RL_QACK_DONE = 0, RL_QACK_RELEASE = 1, RL_QACK_EXTEND = 2, RL_QACK_TRAINED = 3, RL_QACK_GROUPS = 4 };

typedef struct rl_qhdr {
	uint8_t op, version;
	uint16_t flags, hdr_len, status;
	uint32_t raw_len;  /* decompressed body length */
	uint64_t req_id, arg;
} rl_qhdr;

typedef struct rl_qlease_req {
	uint32_t stage;
	uint32_t max_records;  /* train: whole groups, at most this many samples (one group may exceed) */
	uint32_t wait_ms;      /* long poll: wait this long for work when none is ready */
	uint32_t lease_ms;     /* 0: the broker's --lease-timeout */
	uint32_t group_hint;   /* rollout: samples it will generate per prompt (0: the prompt's group_size) */
	uint32_t min_records;  /* wait (up to wait_ms) until this many are available; 0: 1 */
	uint64_t ack_lease;    /* if not 0: first acknowledge (DONE) every record of this lease */
} rl_qlease_req;
#define RL_QLEASE_REQ_LEN 32

typedef struct rl_qlease_info {
	uint64_t lease_id;     /* 0 when nothing was leased */
	uint64_t deadline_ms;  /* wall clock, ms since the epoch */
	uint64_t version;      /* trainer version in force */
	uint32_t n;            /* records in the batch */
	uint32_t aborts;       /* the broker's early stops so far (low 32 bits; 0 from brokers
	                        * without --oversample): a rollout worker that sees it change asks
	                        * which of its prompts are still leased (EXTEND with their ids) */
} rl_qlease_info;
#define RL_QLEASE_INFO_LEN 32

typedef struct rl_qack_req {
	uint64_t lease_id;
	uint32_t kind;         /* enum rl_qack */
	uint32_t n;            /* ids that follow; 0 = every record of the lease */
} rl_qack_req;
#define RL_QACK_REQ_LEN 16

typedef struct rl_qack_result {
	uint32_t done;         /* records acknowledged, released or extended */
	uint32_t late;         /* ids no longer held by this lease (expired, redelivered, unknown) */
	uint64_t deadline_ms;  /* EXTEND: the new deadline */
} rl_qack_result;
#define RL_QACK_RESULT_LEN 16

typedef struct rl_qput_result {
	uint32_t accepted;     /* new records stored */
	uint32_t duplicates;   /* ids already known or finished: dropped (idempotent puts) */
	uint32_t replaced;     /* scored puts that completed a leased or generated record */
	uint32_t rejected;     /* records refused (index outside its group) */
} rl_qput_result;
#define RL_QPUT_RESULT_LEN 16

/* Little-endian loads and stores. */
static inline void rl_le16_put(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void rl_le32_put(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void rl_le64_put(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t rl_le16_get(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rl_le32_get(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static inline uint64_t rl_le64_get(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* rl_qhdr_encode writes h as 32 bytes (magic, version and hdr_len filled in). */
void rl_qhdr_encode(uint8_t out[RL_QP_HDR_LEN], const rl_qhdr *h);
/* rl_qhdr_decode parses the header at the start of msg.  RL_EFORMAT for a
 * short message, bad magic or a header length outside [32, len];
 * RL_EVERSION for another protocol version. */
int rl_qhdr_decode(rl_qhdr *h, const void *msg, size_t len);

void rl_qlease_req_encode(uint8_t out[RL_QLEASE_REQ_LEN], const rl_qlease_req *r);
void rl_qlease_req_decode(rl_qlease_req *r, const uint8_t in[RL_QLEASE_REQ_LEN]);
void rl_qlease_info_encode(uint8_t out[RL_QLEASE_INFO_LEN], const rl_qlease_info *r);
void rl_qlease_info_decode(rl_qlease_info *r, const uint8_t in[RL_QLEASE_INFO_LEN]);
void rl_qack_req_encode(uint8_t out[RL_QACK_REQ_LEN], const rl_qack_req *r);
void rl_qack_req_decode(rl_qack_req *r, const uint8_t in[RL_QACK_REQ_LEN]);
void rl_qack_result_encode(uint8_t out[RL_QACK_RESULT_LEN], const rl_qack_result *r);
void rl_qack_result_decode(rl_qack_result *r, const uint8_t in[RL_QACK_RESULT_LEN]);
void rl_qput_result_encode(uint8_t out[RL_QPUT_RESULT_LEN], const rl_qput_result *r);
void rl_qput_result_decode(rl_qput_result *r, const uint8_t in[RL_QPUT_RESULT_LEN]);

/* rl_qbody_get: the body of a message as plain bytes.  When h->flags has
 * RL_QF_ZSTD, body (blen bytes, one zstd frame) is decompressed into out,
 * refusing a frame whose content size is unknown, differs from h->raw_len or
 * exceeds max (RL_ETOOBIG); otherwise the bytes are copied.  Appends to out. */
int rl_qbody_get(rl_buf *out, const rl_qhdr *h, const void *body, size_t blen, size_t max);

/* rl_qzstd_compress appends one zstd frame (content size and checksum
 * recorded) of src to out at the given level. */
int rl_qzstd_compress(rl_buf *out, const void *src, size_t n, int level);

const char *rl_qstage_name(int stage);   /* "prompt", "generated", "scored"; "?" otherwise */
/* rl_qstage_parse accepts the state names and the consumer names
 * ("rollout" = prompt, "reward" = generated, "train" = scored); -1 if unknown. */
int rl_qstage_parse(const char *s);
const char *rl_qop_name(int op);

/* rl_qauth_sign fills in the proof of a request built with header length
 * RL_QP_AUTH_HDR_LEN (a fresh time and nonce each call: a retry is signed
 * anew): with tls (the client dialled tls+tcp://) rli_auth_seal_head's,
 * else rli_auth_seal's.  rl_qauth_check: RL_OK when this process has no key
 * or the request's proof is good and fresh, else RL_EINVAL with why set (a
 * message for the client).  A broker with tls (listening on tls+tcp://)
 * takes either proof; one without refuses a header-only proof, saying so. */
void rl_qauth_sign(uint8_t *msg, size_t len, int tls);
int rl_qauth_check(const uint8_t *msg, size_t len, const rl_qhdr *h, int tls, const char **why);

#endif

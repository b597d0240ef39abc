/*
 * traj_int.h — lib-private parts of the trajectory module shared by traj.c
 * (records, batches), traj_json.c (JSONL) and traj_stream.c (reader, writer).
 */
#ifndef RL_TRAJ_INT_H
#define RL_TRAJ_INT_H

#include <zstd.h>
#include <zstd_errors.h>

#include "stream/traj.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rl-trajectory(5) decoding is written for little-endian hosts"
#endif

/* One field slot.  data points at own (owned) or into a batch (borrowed).
 * own/owncap survive rl_traj_clear so slots reuse their memory. */
typedef struct rli_slot {
	uint16_t tag;
	uint8_t dtype;
	uint32_t nbytes;
	const void *data;
	void *own;
	size_t owncap;
} rli_slot;

struct rl_traj {
	rli_slot *s;
	size_t n;      /* fields in use */
	size_t cap;    /* slots allocated (>= n; slots past n may hold memory) */
};

struct rl_traj_batch {
	rl_buf data;       /* header (RL_TRAJ_HEADER_LEN bytes) + records */
	size_t hdr;        /* header bytes at the start of data */
	size_t *off;       /* (n) record offsets into data */
	size_t n, cap;
	size_t bytes;      /* record bytes */
	rl_buf frame;      /* the compressed frame this batch was decoded from */
	int frame_ok;      /* frame matches data */
	ZSTD_CCtx *cctx;
	ZSTD_DCtx *dctx;
};

#define RLI_ALIGN8(x) (((x) + 7) & ~(size_t)7)

/* Padded size of a field's data (STR/JSON keep one NUL byte). */
static inline size_t
rli_padded(int dtype, size_t nbytes)
{
	return dtype == RL_TRAJ_STR || dtype == RL_TRAJ_JSON ? RLI_ALIGN8(nbytes + 1) : RLI_ALIGN8(nbytes);
}

/* Check one serialised record at p (n bytes available, n >= 8): sets *len to
 * its length.  Logs "WHAT: MSG" on failure (what may be NULL). */
int rli_record_check(const uint8_t *p, size_t n, const rl_traj_limits *lim, const char *what, size_t *len);
/* Decode a record already checked: t borrows p. */
int rli_record_load(rl_traj *t, const uint8_t *p);
/* Valid UTF-8 without NUL bytes. */
int rli_utf8_ok(const uint8_t *s, size_t n);
const rl_traj_limits *rli_limits(const rl_traj_limits *lim);

#endif

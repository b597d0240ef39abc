/*
 * traj.h — trajectory records and the stream format rl-trajectory(5).
 *
 * A record (rl_traj) is an ordered list of typed, tagged fields.  A batch
 * (rl_traj_batch) is a list of records kept in their serialised form, so a
 * record can be copied from one batch to another with a memcpy.  A stream is a
 * sequence of independent zstd frames (content checksum on), one batch each;
 * the same records also have a JSONL form, one object per line.  Readers
 * detect binary vs JSONL from the first bytes.
 *
 * Binary layout (all integers little-endian; every piece 8-byte aligned):
 *   batch  = header, record * nrecords          (the decompressed frame)
 *   header = "RLTJ", u16 version (1), u16 header_len (>= 16, multiple of 8),
 *            u32 nrecords, u32 flags (0), then header_len - 16 bytes reserved
 *   record = u32 record_len (bytes, this header included, multiple of 8),
 *            u32 nfields, field * nfields
 *   field  = u16 tag (!= 0), u8 dtype, u8 flags (0), u32 nbytes, data,
 *            zero padding to a multiple of 8 (STR and JSON: at least one zero
 *            byte, so their data is NUL-terminated in place)
 * Decoders check every length against the data and the limits; padding and
 * flags must be zero and a tag may occur once per record, so every record has
 * exactly one encoding (binary -> JSONL -> binary is byte-identical).
 *
 * Ownership: a record's fields either point into memory the record owns (what
 * setters and the JSONL parser store) or are borrowed from a batch / buffer
 * (what decoding gives: zero-copy); a borrowed record is valid while that
 * batch or buffer is unchanged.  Setting a field always copies.
 * Thread-safety: none of these objects may be used by two threads at once;
 * distinct objects are independent.
 * Leaves out: the queue's wire header (rl-queue adds its own around a frame).
 */
#ifndef RL_TRAJ_H
#define RL_TRAJ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/core.h"
#include "base/io.h"

#define RL_TRAJ_MAGIC "RLTJ"
#define RL_TRAJ_VERSION 1
#define RL_TRAJ_HEADER_LEN 16

/* ---- field types -----------------------------------------------------------------
 * A field's dtype is an rl_dtype (F32 ... BOOL, see core.h) or one of these.
 * STR is UTF-8 text without NUL bytes; JSON is UTF-8 JSON text in compact form
 * (as cJSON_PrintUnformatted prints it).  A dtype this build does not know is
 * carried as opaque bytes. */
enum { RL_TRAJ_STR = 64, RL_TRAJ_JSON = 65 };

/* ---- tags ---------------------------------------------------------------------------
 * 1..1023: the core fields below (fixed forever: never renumbered or reused).
 * 1024..32767: stage-specific fields added by rlpipe programs.
 * 32768..65535: free for users' own fields.
 * The comment gives the canonical dtype and shape, and the JSONL key.
 * "finish" is one of "eos" (end-of-sequence token), "stop" (a stop string),
 * "length" (max tokens reached), "abort" (cancelled). */
enum rl_traj_tag {
	RL_TAG_ID = 1,             /* U64 scalar       "id": unique record id */
	RL_TAG_GROUP = 2,          /* U64 scalar       "group": prompt id, shared by its n samples */
	RL_TAG_INDEX = 3,          /* I32 scalar       "index": sample number within the group */
	RL_TAG_GROUP_SIZE = 4,     /* I32 scalar       "group_size": n */
	RL_TAG_VERSION = 5,        /* I32 (2)          "version": [first, last] policy version used */
	RL_TAG_PROMPT = 6,         /* I32 (P)          "prompt": prompt token ids */
	RL_TAG_RESPONSE = 7,       /* I32 (R)          "response": response token ids */
	RL_TAG_PROMPT_TEXT = 8,    /* STR              "prompt_text" */
	RL_TAG_RESPONSE_TEXT = 9,  /* STR              "response_text" */
	RL_TAG_LOGPROBS = 10,      /* F32 (R)          "logprobs": behaviour policy, per response token */
	RL_TAG_REF_LOGPROBS = 11,  /* F32 (R)          "ref_logprobs": reference policy */
	RL_TAG_FINISH = 12,        /* STR              "finish": eos | stop | length | abort */
	RL_TAG_REWARD = 13,        /* F32 scalar       "reward" */
	RL_TAG_TOKEN_REWARDS = 14, /* F32 (R)          "token_rewards" */
	RL_TAG_META = 15,          /* JSON             "meta": task, answer, source text, ... */
	RL_TAG_TEMPERATURE = 16,   /* F32 scalar       "temperature" */
	RL_TAG_TOP_P = 17,         /* F32 scalar       "top_p" */
	RL_TAG_TOP_K = 18,         /* I32 scalar       "top_k" (0: off) */
	RL_TAG_MAX_TOKENS = 19,    /* I32 scalar       "max_tokens" */
	RL_TAG_SEED = 20,          /* U64 scalar       "seed" */
	RL_TAG_VALUES = 21,        /* F32 (R)          "values": critic values (PPO) */
	RL_TAG_ADVANTAGES = 22,    /* F32 (R)          "advantages" */
	RL_TAG_LOSS_MASK = 23,     /* U8 (R)           "loss_mask": 1 = token trained on */
	RL_TAG_TASK = 24,          /* STR              "task": e.g. "gsm8k" */
	RL_TAG_WORKER = 25,        /* STR              "worker": who generated it */
	RL_TAG_TS_CREATED = 32,    /* F64 scalar       "ts_created": wall seconds, prompt entered */
	RL_TAG_TS_GEN_START = 33,  /* F64 scalar       "ts_gen_start" */
	RL_TAG_TS_GEN_END = 34,    /* F64 scalar       "ts_gen_end" */
	RL_TAG_TS_SCORED = 35,     /* F64 scalar       "ts_scored" */
	RL_TAG_TS_TRAINED = 36,    /* F64 scalar       "ts_trained" */
	/* multi-turn episodes (rl-rollout --env): a response holds the model's turns and the
	 * environment's observations between them (loss_mask 0) */
	RL_TAG_TURNS = 37,         /* I32 (2T)         "turns": [start, end) of each model turn in response */
	RL_TAG_TURN_VERSIONS = 38, /* I32 (2T)         "turn_versions": [first, last] version of each turn */
	RL_TAG_TURN_REWARDS = 39,  /* F32 (T)          "turn_rewards": the environment's reward per turn */
	RL_TAG_ENV_ERROR = 40,     /* STR              "env_error": why the episode failed */
	RL_TAG_CORE_MAX = 1023,
	RL_TAG_STAGE_MIN = 1024,
	RL_TAG_USER_MIN = 32768,
	RL_TAG_MAX = 65535
};

/* JSONL key of a tag (NULL for a tag this build does not name) and back
 * (-1 for an unknown name).  Unnamed tags appear in JSONL as "t<decimal tag>". */
const char *rl_traj_tag_name(unsigned tag);
int rl_traj_tag_parse(const char *name);
/* Canonical dtype of a named tag (-1 if unknown) and whether it is a scalar. */
int rl_traj_tag_dtype(unsigned tag, int *is_scalar);
/* "F32", ..., "STR", "JSON"; NULL for an unknown dtype.  Parse: -1 if unknown. */
const char *rl_traj_dtype_name(int dtype);
int rl_traj_dtype_parse(const char *name);
/* Bytes per element: rl_dtype_size, 1 for STR/JSON, 0 for an unknown dtype. */
size_t rl_traj_dtype_size(int dtype);

/* ---- limits ---------------------------------------------------------------------------
 * Every decoder takes limits (NULL: the defaults).  A size over a limit is
 * RL_ETOOBIG with a message naming the limit. */
typedef struct rl_traj_limits {
	size_t max_frame;    /* decompressed batch bytes; default 256 MiB */
	size_t max_record;   /* bytes of one record; default 64 MiB */
	size_t max_fields;   /* fields in one record; default 1024 */
	size_t max_records;  /* records in one batch; default 1M */
	size_t max_line;     /* bytes of one JSONL line; default 64 MiB */
} rl_traj_limits;
void rl_traj_limits_default(rl_traj_limits *lim);

/* ---- records ----------------------------------------------------------------------------- */
typedef struct rl_traj rl_traj;

/* A read-only view of one field.  data is 8-byte aligned (when the record
 * came from a batch or a setter); nbytes / dtype size = number of elements. */
typedef struct rl_traj_field {
	unsigned tag;
	int dtype;
	size_t nbytes;
	const void *data;
} rl_traj_field;

int rl_traj_create(rl_traj **out);
void rl_traj_destroy(rl_traj *t);          /* accepts NULL */
void rl_traj_clear(rl_traj *t);            /* remove every field, keep memory */
/* Deep copy: *out owns all its data (independent of src's batch). */
int rl_traj_dup(rl_traj **out, const rl_traj *src);
/* Make every borrowed field of t owned (so it outlives its batch). */
int rl_traj_own(rl_traj *t);

size_t rl_traj_nfields(const rl_traj *t);
/* i-th field in record order; RL_ENOENT past the end. */
int rl_traj_field_at(const rl_traj *t, size_t i, rl_traj_field *out);
/* Field with this tag: RL_OK, or RL_ENOENT (out untouched). */
int rl_traj_find(const rl_traj *t, unsigned tag, rl_traj_field *out);
int rl_traj_has(const rl_traj *t, unsigned tag);
/* Set (copying nbytes from data) or replace a field; a replaced field keeps
 * its position, a new one goes last.  RL_EINVAL for tag 0, nbytes not a
 * multiple of the dtype size, or STR/JSON text with NUL bytes or bad UTF-8;
 * JSON text is not parsed here (see rl_traj_set_json). */
int rl_traj_set(rl_traj *t, unsigned tag, int dtype, const void *data, size_t nbytes);
/* Remove a field (RL_OK whether or not it was there). */
int rl_traj_del(rl_traj *t, unsigned tag);

/* Typed access.  Getters: RL_ENOENT when absent, RL_ESHAPE when the field has
 * another dtype or shape; they never log.  Scalar getters convert: get_u64 /
 * get_i64 / get_i32 take any integer (or BOOL) scalar whose value fits; get_f32
 * / get_f64 take any float or integer scalar.  Array getters give borrowed
 * pointers (valid until the field changes or the record / batch goes) and want
 * exactly their dtype.  Setters store the canonical dtype and copy. */
int rl_traj_get_u64(const rl_traj *t, unsigned tag, uint64_t *out);
int rl_traj_get_i64(const rl_traj *t, unsigned tag, int64_t *out);
int rl_traj_get_i32(const rl_traj *t, unsigned tag, int32_t *out);
int rl_traj_get_f32(const rl_traj *t, unsigned tag, float *out);
int rl_traj_get_f64(const rl_traj *t, unsigned tag, double *out);
int rl_traj_set_u64(rl_traj *t, unsigned tag, uint64_t v);
int rl_traj_set_i64(rl_traj *t, unsigned tag, int64_t v);
int rl_traj_set_i32(rl_traj *t, unsigned tag, int32_t v);
int rl_traj_set_f32(rl_traj *t, unsigned tag, float v);
int rl_traj_set_f64(rl_traj *t, unsigned tag, double v);

int rl_traj_get_i32s(const rl_traj *t, unsigned tag, const int32_t **data, size_t *n);
int rl_traj_get_f32s(const rl_traj *t, unsigned tag, const float **data, size_t *n);
int rl_traj_get_f64s(const rl_traj *t, unsigned tag, const double **data, size_t *n);
int rl_traj_get_u8s(const rl_traj *t, unsigned tag, const uint8_t **data, size_t *n);
int rl_traj_set_i32s(rl_traj *t, unsigned tag, const int32_t *data, size_t n);
int rl_traj_set_f32s(rl_traj *t, unsigned tag, const float *data, size_t n);
int rl_traj_set_f64s(rl_traj *t, unsigned tag, const double *data, size_t n);
int rl_traj_set_u8s(rl_traj *t, unsigned tag, const uint8_t *data, size_t n);

/* Text: *s is NUL-terminated and borrowed; len (may be NULL) is its length.
 * get_str accepts STR and JSON fields. */
int rl_traj_get_str(const rl_traj *t, unsigned tag, const char **s, size_t *len);
int rl_traj_set_str(rl_traj *t, unsigned tag, const char *s);
/* NUL and bytes that do not start a valid UTF-8 sequence become '?', in
 * place: text a STR field can hold, valid characters kept. */
void rl_utf8_fix(char *s, size_t n);
/* Bytes (1..4) of the valid UTF-8 character at s[0..n), or 0 where none
 * starts (a stray or missing continuation byte, an overlong form, a
 * surrogate, a code point past U+10FFFF). */
size_t rl_utf8_char_len(const void *s, size_t n);
int rl_traj_set_strn(rl_traj *t, unsigned tag, const char *s, size_t len);
/* JSON: parses text and stores it in compact form (RL_EINVAL if not JSON).
 * Read it back with rl_traj_get_str. */
int rl_traj_set_json(rl_traj *t, unsigned tag, const char *text);

/* Convenience for the core fields. */
int rl_traj_set_version(rl_traj *t, int32_t first, int32_t last);
/* first and last policy version; a one-element version field gives it twice. */
int rl_traj_get_version(const rl_traj *t, int32_t *first, int32_t *last);

/* ---- single records: binary and JSONL --------------------------------------------------
 * rl_traj_encode appends t's serialised record to out.  rl_traj_decode parses
 * one record (its length taken from its header; *used, if not NULL, gets it)
 * into t, replacing its fields; t borrows buf.  `what` prefixes messages (e.g.
 * "'x.rlt': byte 1234"; NULL: "record").  Errors: RL_EFORMAT, RL_ETOOBIG. */
int rl_traj_encode(rl_buf *out, const rl_traj *t);
int rl_traj_decode(rl_traj *t, size_t *used, const void *buf, size_t n,
                   const rl_traj_limits *lim, const char *what);
/* Size rl_traj_encode would append. */
size_t rl_traj_encoded_size(const rl_traj *t);

/* JSONL: rl_traj_to_json appends one line (with '\n') to out; RL_EFORMAT if a
 * JSON field does not hold valid JSON.  rl_traj_from_json parses one line
 * (n bytes, need not be NUL-terminated) into t, which then owns its data;
 * errors name `what` (e.g. "'x.jsonl': line 3") and the key. */
int rl_traj_to_json(rl_buf *out, const rl_traj *t);
int rl_traj_from_json(rl_traj *t, const char *line, size_t n,
                      const rl_traj_limits *lim, const char *what);

/* ---- batches ---------------------------------------------------------------------------
 * Records in serialised form plus an index.  A batch decoded from a frame keeps
 * that frame, so passing it on unchanged needs no recompression
 * (rl_traj_batch_frame).  A batch caches its zstd contexts, so reuse one batch
 * object rather than creating one per frame. */
typedef struct rl_traj_batch rl_traj_batch;

int rl_traj_batch_create(rl_traj_batch **out);
void rl_traj_batch_destroy(rl_traj_batch *b);   /* accepts NULL */
void rl_traj_batch_clear(rl_traj_batch *b);
size_t rl_traj_batch_count(const rl_traj_batch *b);
/* Total bytes of the serialised records (header excluded). */
size_t rl_traj_batch_bytes(const rl_traj_batch *b);

/* Append a record (serialised: copies) / a raw record from rl_traj_batch_raw
 * or rl_traj_encode (checked, copied: a memcpy). */
int rl_traj_batch_add(rl_traj_batch *b, const rl_traj *t);
int rl_traj_batch_add_raw(rl_traj_batch *b, const void *rec, size_t n, const rl_traj_limits *lim);
/* Record i decoded into t (t borrows from b until b changes). */
int rl_traj_batch_get(const rl_traj_batch *b, size_t i, rl_traj *t);
/* Record i's serialised bytes (borrowed). */
int rl_traj_batch_raw(const rl_traj_batch *b, size_t i, const void **rec, size_t *n);
/* Records without an id get one: the 64-bit FNV-1a hash of the record's
 * serialised bytes with the top bit cleared (the same record always gets the
 * same id, so a put sent twice is a duplicate, not a second prompt); with
 * with_group, records without a group get their id as group (a prompt is its
 * own group).  *out is b itself when no record lacked anything, else fixed,
 * cleared and refilled (b unchanged).  t is scratch. */
int rl_traj_batch_fill_ids(rl_traj_batch **out, rl_traj_batch *b, int with_group, rl_traj_batch *fixed,
                           rl_traj *t);

/* Encode: appends one zstd frame (content checksum and size set) holding the
 * batch to out.  level: zstd level (0: default 1; negative: faster; levels
 * above 1 gain little on token ids and log-probs, see bench/RESULTS.md).  An empty
 * batch gives a valid frame with zero records. */
int rl_traj_batch_encode(rl_buf *out, rl_traj_batch *b, int level);
/* Decode the zstd frame at the start of buf (n bytes); *used gets the frame's
 * compressed size (trailing bytes are left alone).  Replaces b's contents,
 * checks every record, keeps a copy of the frame for rl_traj_batch_frame.
 * Errors name `what` and the byte offset within the frame / batch:
 * RL_EFORMAT (bad magic, lengths, truncation), RL_EVERSION (+ hint),
 * RL_ECHECKSUM, RL_ETOOBIG (a limit). */
int rl_traj_batch_decode(rl_traj_batch *b, size_t *used, const void *buf, size_t n,
                         const rl_traj_limits *lim, const char *what);
/* The compressed frame b was decoded from, if b is unchanged since (RL_OK),
 * else RL_ENOENT.  Borrowed. */
int rl_traj_batch_frame(const rl_traj_batch *b, const void **frame, size_t *n);
/* The decompressed batch payload (header + records), built on demand; borrowed. */
int rl_traj_batch_payload(rl_traj_batch *b, const void **p, size_t *n);

/* ---- streams ------------------------------------------------------------------------------ */
enum { RL_TRAJ_AUTO = 0, RL_TRAJ_BINARY = 1, RL_TRAJ_JSONL = 2 };

/* Reader over a FILE (borrowed, not closed), a file descriptor (borrowed), or
 * a memory buffer (borrowed, must outlive the reader).  name is copied, used
 * in messages ("-" or NULL: "<stdin>").  Binary vs JSONL is detected from the
 * first bytes (zstd magic vs '{' after optional whitespace); an empty input
 * has no records.  Every error names the source and the byte offset (binary)
 * or line number (JSONL); after an error the reader only returns that error. */
typedef struct rl_traj_reader rl_traj_reader;
int rl_traj_reader_open_file(rl_traj_reader **out, FILE *f, const char *name, const rl_traj_limits *lim);
int rl_traj_reader_open_fd(rl_traj_reader **out, int fd, const char *name, const rl_traj_limits *lim);
int rl_traj_reader_open_mem(rl_traj_reader **out, const void *buf, size_t n, const char *name,
                            const rl_traj_limits *lim);
void rl_traj_reader_close(rl_traj_reader *r);   /* accepts NULL */
/* Next record: RL_OK with *t set (borrowed, valid until the next call), or
 * RL_OK with *t == NULL at the end of the input; else an error (logged). */
int rl_traj_reader_next(rl_traj_reader *r, rl_traj **t);
/* Next batch: one frame (binary) or up to 256 lines or 8 MiB (JSONL; less
 * when a pipe has no more lines at hand).  *b
 * borrowed, valid until the next call; NULL at the end.  A JSONL batch ends
 * before a bad line: its records come out and the error is returned by the
 * next call.  Do not mix with _next on one reader. */
int rl_traj_reader_next_batch(rl_traj_reader *r, rl_traj_batch **b);
/* JSONL lines in another schema: FN is called with each non-blank line (n
 * bytes, not NUL-terminated), its name for messages ("'FILE': line N") and
 * its number, and T cleared; it fills T and returns RL_OK, returns RL_ENOENT
 * to leave the line to the record parser, or an error (logged) that stops
 * the reader as a bad line does.  rl-train reads TRL's SFT rows this way. */
typedef int (*rl_traj_line_fn)(void *ctx, rl_traj *t, const char *line, size_t n, const char *what,
                               uint64_t lineno);
void rl_traj_reader_set_line_fn(rl_traj_reader *r, rl_traj_line_fn fn, void *ctx);
/* RL_TRAJ_BINARY / RL_TRAJ_JSONL once detected (after the first _next), else 0. */
int rl_traj_reader_format(const rl_traj_reader *r);
/* Byte offset of the input consumed so far. */
uint64_t rl_traj_reader_offset(const rl_traj_reader *r);
/* 1 when the next rl_traj_reader_next has to read more input (the current
 * frame's records, or the complete JSONL lines already read, are used up):
 * a filter in a pipe flushes its output then, or it may wait on its input
 * while holding records its reader downstream waits for. */
int rl_traj_reader_drained(const rl_traj_reader *r);
/* 1 when drained and reading more would wait (a pipe with nothing to read
 * now, rl_io_would_wait); 0 for regular files: a filter that batches its
 * work (rl-reward --model) fills its batches from a file and flushes only
 * when a live producer has nothing more yet. */
int rl_traj_reader_would_wait(rl_traj_reader *r);

/* Writer to a FILE (borrowed; flushed, not closed), a file descriptor
 * (borrowed) or a growable buffer (borrowed).  Binary writers collect records
 * into a batch and write a frame when it holds batch_records records or
 * batch_bytes bytes, and on flush/close; each frame is flushed to the FILE or
 * fd at once (pipes see whole batches).  JSONL writers write a line per record. */
typedef struct rl_traj_writer_opts {
	int format;            /* RL_TRAJ_BINARY (default) or RL_TRAJ_JSONL */
	int level;             /* zstd level; 0: 1 */
	size_t batch_records;  /* 0: 256 */
	size_t batch_bytes;    /* 0: 8 MiB */
} rl_traj_writer_opts;
typedef struct rl_traj_writer rl_traj_writer;
int rl_traj_writer_open_file(rl_traj_writer **out, FILE *f, const char *name, const rl_traj_writer_opts *o);
int rl_traj_writer_open_fd(rl_traj_writer **out, int fd, const char *name, const rl_traj_writer_opts *o);
int rl_traj_writer_open_buf(rl_traj_writer **out, rl_buf *buf, const rl_traj_writer_opts *o);
int rl_traj_writer_put(rl_traj_writer *w, const rl_traj *t);
/* Write the pending batch, then b: b's kept frame as-is when it has one and
 * the writer is binary (no recompression), else re-encoded. */
int rl_traj_writer_put_batch(rl_traj_writer *w, rl_traj_batch *b);
/* Write the pending records as a frame (binary) and flush the FILE. */
int rl_traj_writer_flush(rl_traj_writer *w);
/* Flush and free; returns the flush's error.  Accepts NULL. */
int rl_traj_writer_close(rl_traj_writer *w);

#endif

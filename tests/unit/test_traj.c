/*
 * test_traj.c — trajectory records and rl-trajectory(5) streams: typed
 * access, random records binary -> JSONL -> binary byte-identical, frame
 * pass-through, readers over memory and pipes, and every kind of bad input
 * (each must fail with a clean error, never crash).
 */
/* t.h's T_OK without a message expands to an empty format string */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include <zstd.h>

#include "base/io.h"
#include "base/rng.h"
#include "t.h"
#include "stream/traj.h"

static uint64_t rs = 12345;
static uint64_t
rnd(void)
{
	rs += 0x9e3779b97f4a7c15ull;
	return rl_rng_mix(rs);
}
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* Random bits of an element, no NaN (NaN payloads are not kept by JSONL). */
static void
rand_elem(uint8_t *p, int dt)
{
	uint64_t r = rnd();
	switch (dt) {
	case RL_F32: {
		uint32_t u = (uint32_t)r;
		if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffff))
			u &= ~0x7fffffu;
		memcpy(p, &u, 4);
		break;
	}
	case RL_F64: {
		if ((r & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (r & 0xfffffffffffffull))
			r &= ~0xfffffffffffffull;
		memcpy(p, &r, 8);
		break;
	}
	case RL_BF16: case RL_F16: {
		uint16_t h = (uint16_t)r;
		uint16_t em = dt == RL_BF16 ? 0x7f80 : 0x7c00, mm = dt == RL_BF16 ? 0x7f : 0x3ff;
		if ((h & em) == em && (h & mm))
			h &= (uint16_t)~mm;
		memcpy(p, &h, 2);
		break;
	}
	default:
		memcpy(p, &r, rl_dtype_size(dt));
	}
}

static const char *const texts[] = {
	"", "hello", "line\nbreak\ttab \"quote\" back\\slash", "\x01\x1f ctrl", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
	"The answer is \\boxed{42}.",
};

static void
rand_record(rl_traj *t)
{
	rl_traj_clear(t);
	for (unsigned tag = 1; tag <= 36; tag++) {
		int scalar, dt = rl_traj_tag_dtype(tag, &scalar);
		if (dt < 0 || rndn(3) == 0)
			continue;
		if (dt == RL_TRAJ_STR) {
			T_OK(rl_traj_set_str(t, tag, texts[rndn(RL_ARRAY_LEN(texts))]) == 0);
		} else if (dt == RL_TRAJ_JSON) {
			T_OK(rl_traj_set_json(t, tag, "{ \"answer\": \"42\", \"n\": [1, 2.5, -3e-7], \"s\": \"\\u00e9\\n\", \"o\": {}}") == 0);
		} else {
			/* version is I32[2]: readers refuse other lengths */
			size_t n = scalar ? 1 : tag == RL_TAG_VERSION ? 2 : rndn(40), es = rl_dtype_size(dt);
			uint8_t buf[40 * 8];
			for (size_t i = 0; i < n; i++)
				rand_elem(buf + i * es, dt);
			T_OK(rl_traj_set(t, tag, dt, buf, n * es) == 0);
		}
	}
	/* unknown tags, every dtype, plus an opaque dtype */
	for (int k = 0; k < 4; k++) {
		unsigned tag = 1024 + (unsigned)rndn(64000);
		int dt = (int)rndn(RL_DTYPE_COUNT + 3);
		if (rl_traj_has(t, tag))
			continue;
		if (dt == RL_DTYPE_COUNT) {
			T_OK(rl_traj_set_str(t, tag, texts[rndn(RL_ARRAY_LEN(texts))]) == 0);
		} else if (dt == RL_DTYPE_COUNT + 1) {
			uint8_t b[13];
			for (size_t i = 0; i < sizeof b; i++)
				b[i] = (uint8_t)rnd();
			T_OK(rl_traj_set(t, tag, 200, b, rndn(sizeof b)) == 0);
		} else if (dt == RL_DTYPE_COUNT + 2) {
			/* a known tag with a non-canonical dtype goes as "t<tag>" */
			T_OK(rl_traj_set_f64(t, RL_TAG_REWARD, -0.0) == 0);
		} else {
			uint8_t buf[9 * 8];
			size_t n = rndn(9), es = rl_dtype_size(dt);
			for (size_t i = 0; i < n; i++)
				rand_elem(buf + i * es, dt);
			T_OK(rl_traj_set(t, tag, dt, buf, n * es) == 0);
		}
	}
}

static void
test_typed(void)
{
	rl_traj *t;
	const int32_t *ip;
	const float *fp;
	const char *s;
	size_t n;
	uint64_t u;
	int64_t i64;
	int32_t i32, a, b;
	float f;
	double d;
	int32_t toks[] = { 5, 6, 7 };
	float lp[] = { -0.5f, -1.5f, -2.5f };

	T_OK(rl_traj_create(&t) == 0);
	T_EQ_INT(rl_traj_get_u64(t, RL_TAG_ID, &u), RL_ENOENT);
	T_OK(rl_traj_set_u64(t, RL_TAG_ID, 0xfedcba9876543210ull) == 0);
	T_OK(rl_traj_get_u64(t, RL_TAG_ID, &u) == 0 && u == 0xfedcba9876543210ull);
	T_EQ_INT(rl_traj_get_i64(t, RL_TAG_ID, &i64), RL_ESHAPE);
	T_OK(rl_traj_set_i32(t, RL_TAG_INDEX, -3) == 0);
	T_EQ_INT(rl_traj_get_u64(t, RL_TAG_INDEX, &u), RL_ESHAPE);
	T_OK(rl_traj_get_i32(t, RL_TAG_INDEX, &i32) == 0 && i32 == -3);
	T_OK(rl_traj_get_f64(t, RL_TAG_INDEX, &d) == 0 && d == -3);
	T_OK(rl_traj_set_f32(t, RL_TAG_REWARD, 0.75f) == 0);
	T_OK(rl_traj_get_f32(t, RL_TAG_REWARD, &f) == 0 && f == 0.75f);
	T_EQ_INT(rl_traj_get_i32(t, RL_TAG_REWARD, &i32), RL_ESHAPE);
	T_OK(rl_traj_set_i32s(t, RL_TAG_RESPONSE, toks, 3) == 0);
	T_OK(rl_traj_set_f32s(t, RL_TAG_LOGPROBS, lp, 3) == 0);
	T_OK(rl_traj_get_i32s(t, RL_TAG_RESPONSE, &ip, &n) == 0 && n == 3 && ip[2] == 7);
	T_OK(rl_traj_get_f32s(t, RL_TAG_LOGPROBS, &fp, &n) == 0 && n == 3 && fp[1] == -1.5f);
	T_EQ_INT(rl_traj_get_f32s(t, RL_TAG_RESPONSE, &fp, &n), RL_ESHAPE);
	T_EQ_INT(rl_traj_get_i32(t, RL_TAG_RESPONSE, &i32), RL_ESHAPE);
	T_OK(rl_traj_set_str(t, RL_TAG_FINISH, "length") == 0);
	T_OK(rl_traj_get_str(t, RL_TAG_FINISH, &s, &n) == 0 && n == 6 && strcmp(s, "length") == 0);
	T_EQ_INT(rl_traj_set_str(t, RL_TAG_FINISH, "bad \xff utf8"), RL_EINVAL);
	T_EQ_INT(rl_traj_set_strn(t, RL_TAG_FINISH, "nul\0inside", 10), RL_EINVAL);
	T_EQ_INT(rl_traj_set_json(t, RL_TAG_META, "{not json"), RL_EINVAL);
	T_OK(rl_traj_set_json(t, RL_TAG_META, " { \"answer\" : 42 } ") == 0);
	T_OK(rl_traj_get_str(t, RL_TAG_META, &s, NULL) == 0 && strcmp(s, "{\"answer\":42}") == 0);
	T_OK(rl_traj_set_version(t, 4, 6) == 0 && rl_traj_get_version(t, &a, &b) == 0 && a == 4 && b == 6);
	T_EQ_INT(rl_traj_set(t, 0, RL_F32, lp, 4), RL_EINVAL);
	T_EQ_INT(rl_traj_set(t, 99, RL_F32, lp, 3), RL_EINVAL);
	/* replacing keeps the position; deleting keeps the order of the rest */
	T_OK(rl_traj_set_u64(t, RL_TAG_ID, 1) == 0);
	{
		rl_traj_field fl;
		T_OK(rl_traj_field_at(t, 0, &fl) == 0 && fl.tag == RL_TAG_ID);
		T_OK(rl_traj_del(t, RL_TAG_INDEX) == 0 && !rl_traj_has(t, RL_TAG_INDEX));
		T_OK(rl_traj_field_at(t, 1, &fl) == 0 && fl.tag == RL_TAG_REWARD);
		T_OK(rl_traj_set_i32(t, RL_TAG_INDEX, 9) == 0);
		T_OK(rl_traj_field_at(t, rl_traj_nfields(t) - 1, &fl) == 0 && fl.tag == RL_TAG_INDEX);
		/* setting a field from its own data (aliasing) */
		T_OK(rl_traj_get_i32s(t, RL_TAG_RESPONSE, &ip, &n) == 0);
		T_OK(rl_traj_set_i32s(t, RL_TAG_RESPONSE, ip + 1, 2) == 0);
		T_OK(rl_traj_get_i32s(t, RL_TAG_RESPONSE, &ip, &n) == 0 && n == 2 && ip[0] == 6 && ip[1] == 7);
	}
	T_OK(strcmp(rl_traj_tag_name(RL_TAG_LOGPROBS), "logprobs") == 0);
	T_EQ_INT(rl_traj_tag_parse("ref_logprobs"), RL_TAG_REF_LOGPROBS);
	T_EQ_INT(rl_traj_tag_parse("nope"), -1);
	rl_traj_destroy(t);
	rl_traj_destroy(NULL);
}

/* Random batches: binary -> records -> JSONL -> records -> binary must give
 * the same bytes; JSONL -> JSONL the same text. */
static void
test_roundtrip(void)
{
	rl_traj *t, *u;
	rl_traj_batch *b, *b2, *b3;
	rl_buf frame, js, js2, frame2;
	int fails = 0;

	rl_traj_create(&t);
	rl_traj_create(&u);
	rl_traj_batch_create(&b);
	rl_traj_batch_create(&b2);
	rl_traj_batch_create(&b3);
	rl_buf_init(&frame);
	rl_buf_init(&frame2);
	rl_buf_init(&js);
	rl_buf_init(&js2);
	for (int iter = 0; iter < 60; iter++) {
		size_t nrec = rndn(12), used;
		const void *p1, *p2;
		size_t n1, n2;

		rl_traj_batch_clear(b);
		for (size_t i = 0; i < nrec; i++) {
			rand_record(t);
			T_OK(rl_traj_batch_add(b, t) == 0);
		}
		frame.len = 0;
		T_OK(rl_traj_batch_encode(&frame, b, (int)rndn(4) - 1) == 0);
		T_OK(rl_traj_batch_decode(b2, &used, frame.p, frame.len, NULL, "test") == 0);
		T_EQ_INT(used, frame.len);
		T_EQ_INT(rl_traj_batch_count(b2), nrec);
		js.len = 0;
		for (size_t i = 0; i < nrec; i++) {
			T_OK(rl_traj_batch_get(b2, i, u) == 0);
			T_OK(rl_traj_to_json(&js, u) == 0);
		}
		/* back from JSONL */
		rl_traj_batch_clear(b3);
		js2.len = 0;
		for (size_t off = 0, line = 1; off < js.len; line++) {
			const char *s = (const char *)js.p + off;
			const char *nl = memchr(s, '\n', js.len - off);
			T_OK(nl != NULL);
			if (nl == NULL)
				break;
			if (rl_traj_from_json(u, s, (size_t)(nl - s), NULL, "roundtrip") != 0) {
				fprintf(stderr, "line: %.*s\n", (int)(nl - s), s);
				fails++;
				break;
			}
			T_OK(rl_traj_batch_add(b3, u) == 0);
			T_OK(rl_traj_to_json(&js2, u) == 0);
			off += (size_t)(nl - s) + 1;
		}
		T_OK(js.len == js2.len && memcmp(js.p, js2.p, js.len) == 0, "JSONL -> JSONL differs (iter %d)", iter);
		T_OK(rl_traj_batch_payload(b, &p1, &n1) == 0 && rl_traj_batch_payload(b3, &p2, &n2) == 0);
		if (n1 != n2 || memcmp(p1, p2, n1) != 0) {
			fails++;
			for (size_t i = 0; i < nrec; i++) {
				const void *r1, *r2;
				size_t l1, l2;
				rl_traj_batch_raw(b, i, &r1, &l1);
				rl_traj_batch_raw(b3, i, &r2, &l2);
				if (l1 != l2 || memcmp(r1, r2, l1)) {
					rl_traj_batch_get(b, i, u);
					js.len = 0;
					rl_traj_to_json(&js, u);
					fprintf(stderr, "record %zu differs: %.*s", i, (int)js.len, (char *)js.p);
					break;
				}
			}
		}
		/* the same records re-encoded give the same frame */
		frame2.len = 0;
		T_OK(rl_traj_batch_encode(&frame2, b3, 3) == 0);
		T_OK(rl_traj_batch_decode(b2, &used, frame2.p, frame2.len, NULL, "test") == 0);
		T_OK(rl_traj_batch_payload(b2, &p2, &n2) == 0 && n1 == n2 && memcmp(p1, p2, n1) == 0);
	}
	T_EQ_INT(fails, 0);
	rl_buf_fini(&frame);
	rl_buf_fini(&frame2);
	rl_buf_fini(&js);
	rl_buf_fini(&js2);
	rl_traj_batch_destroy(b);
	rl_traj_batch_destroy(b2);
	rl_traj_batch_destroy(b3);
	rl_traj_destroy(t);
	rl_traj_destroy(u);
}

/* Frames pass through a writer untouched; raw records copy between batches. */
static void
test_passthrough(void)
{
	rl_traj *t;
	rl_traj_batch *b, *sub;
	rl_traj_writer *w;
	rl_traj_reader *r;
	rl_buf in, out;
	const void *fp, *rec;
	size_t fn, rn, used;
	uint64_t id;

	rl_traj_create(&t);
	rl_traj_batch_create(&b);
	rl_traj_batch_create(&sub);
	rl_buf_init(&in);
	rl_buf_init(&out);
	for (int i = 0; i < 10; i++) {
		rand_record(t);
		rl_traj_set_u64(t, RL_TAG_ID, (uint64_t)i);
		rl_traj_batch_add(b, t);
	}
	T_OK(rl_traj_batch_encode(&in, b, 5) == 0);
	T_EQ_INT(rl_traj_batch_frame(b, &fp, &fn), RL_ENOENT);
	T_OK(rl_traj_batch_decode(b, &used, in.p, in.len, NULL, NULL) == 0);
	T_OK(rl_traj_batch_frame(b, &fp, &fn) == 0 && fn == in.len && memcmp(fp, in.p, fn) == 0);
	T_OK(rl_traj_writer_open_buf(&w, &out, NULL) == 0);
	T_OK(rl_traj_writer_put_batch(w, b) == 0);
	T_OK(rl_traj_writer_close(w) == 0);
	T_OK(out.len == in.len && memcmp(out.p, in.p, in.len) == 0, "frame was re-encoded");
	/* odd records into a new batch by memcpy */
	for (size_t i = 1; i < 10; i += 2) {
		T_OK(rl_traj_batch_raw(b, i, &rec, &rn) == 0);
		T_OK(rl_traj_batch_add_raw(sub, rec, rn, NULL) == 0);
	}
	T_EQ_INT(rl_traj_batch_count(sub), 5);
	T_OK(rl_traj_batch_get(sub, 2, t) == 0 && rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == 5);
	/* a modified batch is re-encoded (its old frame no longer applies) */
	rl_traj_batch_add(b, t);
	T_EQ_INT(rl_traj_batch_frame(b, &fp, &fn), RL_ENOENT);
	/* a reader over two concatenated frames sees all records in order */
	out.len = 0;
	T_OK(rl_traj_batch_encode(&out, b, 1) == 0 && rl_traj_batch_encode(&out, sub, 1) == 0);
	T_OK(rl_traj_reader_open_mem(&r, out.p, out.len, "mem", NULL) == 0);
	{
		rl_traj *x;
		size_t n = 0;
		while (rl_traj_reader_next(r, &x) == 0 && x != NULL)
			n++;
		T_EQ_INT(n, 16);
		T_EQ_INT(rl_traj_reader_format(r), RL_TRAJ_BINARY);
		T_EQ_INT(rl_traj_reader_offset(r), out.len);
	}
	rl_traj_reader_close(r);
	rl_buf_fini(&in);
	rl_buf_fini(&out);
	rl_traj_batch_destroy(b);
	rl_traj_batch_destroy(sub);
	rl_traj_destroy(t);
}

/* Writer -> pipe -> reader, binary and JSONL, with a reader that must get the
 * first batch before the writer has closed (no read-ahead). */
static void
test_pipe(int format)
{
	int fd[2];
	rl_traj *t;
	rl_traj_writer *w;
	rl_traj_reader *r;
	rl_traj_writer_opts o = { .format = format, .batch_records = 3 };
	rl_traj *x;
	uint64_t id;
	FILE *wf;

	T_OK(pipe(fd) == 0);
	rl_traj_create(&t);
	wf = fdopen(fd[1], "wb");
	T_OK(rl_traj_writer_open_file(&w, wf, "pipe", &o) == 0);
	for (int i = 0; i < 3; i++) {
		rl_traj_set_u64(t, RL_TAG_ID, (uint64_t)i + 100);
		rl_traj_set_str(t, RL_TAG_RESPONSE_TEXT, "some text");
		T_OK(rl_traj_writer_put(w, t) == 0);
	}
	/* binary: the batch is full and has been written; JSONL: flushed per
	 * line to a pipe.  The reader must get all 3 without more input. */
	T_OK(rl_traj_reader_open_fd(&r, fd[0], "pipe", NULL) == 0);
	for (int i = 0; i < 3; i++) {
		T_OK(rl_traj_reader_next(r, &x) == 0 && x != NULL);
		T_OK(x && rl_traj_get_u64(x, RL_TAG_ID, &id) == 0 && id == (uint64_t)i + 100);
	}
	T_OK(rl_traj_writer_close(w) == 0);
	fclose(wf);
	T_OK(rl_traj_reader_next(r, &x) == 0 && x == NULL);
	T_EQ_INT(rl_traj_reader_format(r), format);
	rl_traj_reader_close(r);
	close(fd[0]);
	rl_traj_destroy(t);
}

/* A stage's loop: read a record, set a field, write it on.  Unknown fields
 * and field order survive; the records are independent of the input after
 * rl_traj_dup / rl_traj_own. */
static void
test_read_modify_write(void)
{
	static const char in[] =
		"{\"id\":1,\"t40000\":{\"dtype\":\"I16\",\"data\":[1,-2]},\"response\":[4,5],\"meta\":{\"answer\":\"4\"}}\n"
		"{\"id\":2,\"reward\":0.25,\"t65535\":{\"dtype\":\"STR\",\"data\":\"x\"}}\n";
	static const char want[] =
		"{\"id\":1,\"t40000\":{\"dtype\":\"I16\",\"data\":[1,-2]},\"response\":[4,5],\"meta\":{\"answer\":\"4\"},\"reward\":1}\n"
		"{\"id\":2,\"reward\":1,\"t65535\":{\"dtype\":\"STR\",\"data\":\"x\"}}\n";
	rl_buf bin, out;
	rl_traj_reader *r;
	rl_traj_writer *w;
	rl_traj_writer_opts jo = { .format = RL_TRAJ_JSONL };
	rl_traj *t, *keep = NULL;

	rl_buf_init(&bin);
	rl_buf_init(&out);
	/* JSONL -> binary */
	T_OK(rl_traj_reader_open_mem(&r, in, strlen(in), "in", NULL) == 0);
	T_OK(rl_traj_writer_open_buf(&w, &bin, NULL) == 0);
	while (rl_traj_reader_next(r, &t) == 0 && t != NULL)
		T_OK(rl_traj_writer_put(w, t) == 0);
	T_OK(rl_traj_writer_close(w) == 0);
	rl_traj_reader_close(r);
	/* binary -> set reward -> JSONL */
	T_OK(rl_traj_reader_open_mem(&r, bin.p, bin.len, "bin", NULL) == 0);
	T_OK(rl_traj_writer_open_buf(&w, &out, &jo) == 0);
	while (rl_traj_reader_next(r, &t) == 0 && t != NULL) {
		T_OK(rl_traj_set_f32(t, RL_TAG_REWARD, 1.0f) == 0);
		T_OK(rl_traj_writer_put(w, t) == 0);
		if (keep == NULL)
			T_OK(rl_traj_dup(&keep, t) == 0);
		else
			T_OK(rl_traj_own(t) == 0);
	}
	T_OK(rl_traj_writer_close(w) == 0);
	rl_traj_reader_close(r);
	T_OK(out.len == strlen(want) && memcmp(out.p, want, out.len) == 0, "got:\n%.*s", (int)out.len, (char *)out.p);
	/* the duplicate outlives the reader and its buffer */
	memset(bin.p, 0xee, bin.len);
	rl_buf_fini(&bin);
	{
		const int32_t *rt;
		size_t n;
		T_OK(keep && rl_traj_get_i32s(keep, RL_TAG_RESPONSE, &rt, &n) == 0 && n == 2 && rt[1] == 5);
	}
	rl_traj_destroy(keep);
	rl_buf_fini(&out);
}

/* ---- bad input ------------------------------------------------------------------------- */

/* Read everything from memory; return the first error (0 if none). */
static int
read_all(const void *p, size_t n, const rl_traj_limits *lim, size_t *nrec)
{
	rl_traj_reader *r;
	rl_traj *x;
	int rv;

	*nrec = 0;
	if (rl_traj_reader_open_mem(&r, p, n, "bad", lim) != 0)
		return -1;
	while ((rv = rl_traj_reader_next(r, &x)) == 0 && x != NULL)
		(*nrec)++;
	/* errors are sticky */
	if (rv != 0)
		T_EQ_INT(rl_traj_reader_next(r, &x), rv);
	rl_traj_reader_close(r);
	return rv;
}

/* Compress a raw payload as one frame. */
static void
compress(rl_buf *out, const void *p, size_t n)
{
	size_t bound = ZSTD_compressBound(n), z;
	out->len = 0;
	rl_buf_reserve(out, bound);
	z = ZSTD_compress(out->p, bound, p, n, 1);
	T_OK(!ZSTD_isError(z));
	out->len = z;
}

static void
test_bad(void)
{
	rl_traj *t;
	rl_traj_batch *b;
	rl_buf good, bad, pl;
	rl_traj_limits lim;
	const void *p;
	size_t n, nrec;
	int rv;

	rl_traj_create(&t);
	rl_traj_batch_create(&b);
	rl_buf_init(&good);
	rl_buf_init(&bad);
	rl_buf_init(&pl);
	for (int i = 0; i < 5; i++) {
		rand_record(t);
		rl_traj_batch_add(b, t);
	}
	rl_traj_batch_encode(&good, b, 3);
	T_OK(read_all(good.p, good.len, NULL, &nrec) == 0 && nrec == 5);

	/* truncated: every prefix fails (or, at 0, is empty) */
	for (size_t k = 1; k < good.len; k += 1 + k / 8) {
		rv = read_all(good.p, k, NULL, &nrec);
		T_OK(rv == RL_EFORMAT || rv == RL_ECHECKSUM, "prefix %zu of %zu: %d", k, good.len, rv);
	}
	/* flipped bytes anywhere: an error, never a crash; success only where the
	 * flip did not change the decompressed batch (zstd has bits that do not
	 * matter, e.g. in entropy tables; the content checksum covers the rest) */
	{
		rl_traj_batch *b2;
		const void *q, *orig;
		size_t qn, on, used;
		int unnoticed = 0, harmless = 0;
		rl_traj_batch_create(&b2);
		T_OK(rl_traj_batch_payload(b, &orig, &on) == 0);
		for (size_t k = 0; k < good.len; k++) {
			for (int bit = 0; bit < 8; bit += 3) {
				rl_buf_reset(&bad);
				rl_buf_append(&bad, good.p, good.len);
				bad.p[k] ^= (uint8_t)(1u << bit);
				rv = read_all(bad.p, bad.len, NULL, &nrec);
				if (rv != 0)
					continue;
				T_OK(rl_traj_batch_decode(b2, &used, bad.p, bad.len, NULL, "flip") == 0);
				T_OK(rl_traj_batch_payload(b2, &q, &qn) == 0);
				if (qn == on && memcmp(q, orig, on) == 0)
					harmless++;
				else
					unnoticed++;
			}
		}
		T_EQ_INT(unnoticed, 0);
		T_OK(harmless < (int)good.len / 20, "%d harmless flips", harmless);
		rl_traj_batch_destroy(b2);
	}
	/* payload-level damage under a valid zstd frame */
	T_OK(rl_traj_batch_payload(b, &p, &n) == 0);
	rl_buf_reset(&pl);
	rl_buf_append(&pl, p, n);
	pl.p[0] = 'X';                                   /* wrong magic */
	compress(&bad, pl.p, pl.len);
	T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EFORMAT);
	pl.p[0] = 'R';
	pl.p[4] = 2;                                     /* version 2 */
	compress(&bad, pl.p, pl.len);
	T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EVERSION);
	pl.p[4] = 1;
	pl.p[8] = 6;                                     /* more records than there are */
	compress(&bad, pl.p, pl.len);
	T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EFORMAT);
	pl.p[8] = 5;
	{
		/* first record's length larger than the data / first field's length
		 * larger than the record */
		uint32_t big = 0x7ffffff8u, keep, fkeep;
		memcpy(&keep, pl.p + 16, 4);
		memcpy(pl.p + 16, &big, 4);
		compress(&bad, pl.p, pl.len);
		T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_ETOOBIG);
		big = keep + 8;
		memcpy(pl.p + 16, &big, 4);
		compress(&bad, pl.p, pl.len);
		T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EFORMAT);
		memcpy(pl.p + 16, &keep, 4);
		memcpy(&fkeep, pl.p + 28, 4);
		big = keep;
		memcpy(pl.p + 28, &big, 4);
		compress(&bad, pl.p, pl.len);
		T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EFORMAT);
		memcpy(pl.p + 28, &fkeep, 4);
	}
	/* decompressed size over the limit (checked from the frame header, before
	 * decompressing) */
	rl_traj_limits_default(&lim);
	lim.max_frame = 64;
	T_EQ_INT(read_all(good.p, good.len, &lim, &nrec), RL_ETOOBIG);
	T_EQ_INT(rl_traj_batch_decode(b, &n, good.p, good.len, &lim, "limit"), RL_ETOOBIG);
	/* a frame without a content size in its header, streamed over the limit */
	{
		ZSTD_CCtx *c = ZSTD_createCCtx();
		ZSTD_inBuffer in = { pl.p, pl.len, 0 };
		ZSTD_outBuffer out;
		rl_buf_reset(&bad);
		rl_buf_reserve(&bad, ZSTD_compressBound(pl.len) + 64);
		out.dst = bad.p;
		out.size = bad.cap;
		out.pos = 0;
		ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
		T_OK(ZSTD_compressStream2(c, &out, &in, ZSTD_e_end) == 0);
		bad.len = out.pos;
		ZSTD_freeCCtx(c);
		T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), 0);
		T_EQ_INT(nrec, 5);
		lim.max_frame = 100;
		T_EQ_INT(read_all(bad.p, bad.len, &lim, &nrec), RL_ETOOBIG);
	}
	/* records over the record limit */
	rl_traj_limits_default(&lim);
	lim.max_record = 16;
	T_EQ_INT(read_all(good.p, good.len, &lim, &nrec), RL_ETOOBIG);
	/* garbage, and a zstd frame after garbage */
	T_EQ_INT(read_all("hello world", 11, NULL, &nrec), RL_EFORMAT);
	rl_buf_reset(&bad);
	rl_buf_append(&bad, good.p, good.len);
	rl_buf_append(&bad, "\x28\xb5\x2f\xfd", 4);
	T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), RL_EFORMAT);
	T_EQ_INT(nrec, 5);
	/* skippable frames: skipped; one longer than the input is truncation */
	rl_buf_reset(&bad);
	rl_buf_append(&bad, "\x50\x2a\x4d\x18\x03\x00\x00\x00" "abc", 11);
	rl_buf_append(&bad, good.p, good.len);
	T_EQ_INT(read_all(bad.p, bad.len, NULL, &nrec), 0);
	T_EQ_INT(nrec, 5);
	T_EQ_INT(read_all("\x50\x2a\x4d\x18\x00\x40\x00\x00\x00\x00\x00", 11, NULL, &nrec), RL_EFORMAT);
	T_EQ_INT(read_all("", 0, NULL, &nrec), 0);
	T_EQ_INT(nrec, 0);

	/* JSONL */
	{
		static const struct { const char *text; int rv; size_t nrec; } cases[] = {
			{ "{\"id\":1}\n\n  \n{\"id\":2}", 0, 2 },
			{ "{\"id\":1}\n[1,2]\n", RL_EFORMAT, 1 },
			{ "{\"id\":1}\n{\"id\":\n", RL_EFORMAT, 1 },
			{ "{\"reward\":\"high\"}\n", RL_EFORMAT, 0 },
			{ "{\"prompt\":[1,\"x\"]}\n", RL_EFORMAT, 0 },
			{ "{\"prompt\":[1,2.5]}\n", RL_EFORMAT, 0 },
			{ "{\"prompt\":[1,4294967296]}\n", RL_EFORMAT, 0 },
			{ "{\"prompt\":7}\n", RL_EFORMAT, 0 },
			{ "{\"finish\":3}\n", RL_EFORMAT, 0 },
			{ "{\"id\":-1}\n", RL_EFORMAT, 0 },
			{ "{\"id\":1,\"id\":2}\n", RL_EFORMAT, 0 },
			{ "{\"reward\":1,\"t13\":{\"dtype\":\"F32\",\"data\":[1]}}\n", RL_EFORMAT, 0 },
			{ "{\"bogus\":1}\n", RL_EFORMAT, 0 },
			{ "{\"t0\":{\"dtype\":\"F32\",\"data\":[]}}\n", RL_EFORMAT, 0 },
			{ "{\"t70000\":{\"dtype\":\"F32\",\"data\":[]}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":\"F99\",\"data\":[]}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":\"F32\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":7,\"hex\":\"00\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":99,\"hex\":\"0g\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":9966666666999999,\"hex\":\"00\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":-1e300,\"hex\":\"00\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":99.5,\"hex\":\"00\"}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":\"I8\",\"data\":[127,-128]},\"t2001\":{\"dtype\":\"BOOL\",\"data\":[true,0]}}\n", 0, 1 },
			{ "{\"response_text\":\"bad \xff\"}\n", RL_EFORMAT, 0 },
			{ "{\"logprobs\":[-1.5,\"-inf\",\"nan\"]}\n", 0, 1 },
			/* a finite number that would round to infinity is out of range */
			{ "{\"reward\":1e39}\n", RL_EFORMAT, 0 },
			{ "{\"logprobs\":[0,-3.4028235677973366e38]}\n", RL_EFORMAT, 0 },
			{ "{\"logprobs\":[3.4028235677973362e38,-3.4028234663852886e38]}\n", 0, 1 },
			{ "{\"t2000\":{\"dtype\":\"F16\",\"data\":[65519,-65504]}}\n", 0, 1 },
			{ "{\"t2000\":{\"dtype\":\"F16\",\"data\":[65520]}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":\"BF16\",\"data\":[3.38953139e38]}}\n", 0, 1 },
			{ "{\"t2000\":{\"dtype\":\"BF16\",\"data\":[3.4e38]}}\n", RL_EFORMAT, 0 },
			{ "{\"t2000\":{\"dtype\":\"F64\",\"data\":[1e300]}}\n", 0, 1 },
			{ "\xef\xbb\xbf{}", RL_EFORMAT, 0 },
		};
		for (size_t i = 0; i < RL_ARRAY_LEN(cases); i++) {
			rv = read_all(cases[i].text, strlen(cases[i].text), NULL, &nrec);
			T_OK(rv == cases[i].rv && nrec == cases[i].nrec, "JSONL case %zu: rv %d nrec %zu", i, rv, nrec);
		}
		rl_traj_limits_default(&lim);
		lim.max_line = 10;
		T_EQ_INT(read_all("{\"id\":1234567}\n", 15, &lim, &nrec), RL_ETOOBIG);
	}
	rl_buf_fini(&good);
	rl_buf_fini(&bad);
	rl_buf_fini(&pl);
	rl_traj_batch_destroy(b);
	rl_traj_destroy(t);
}

/* Hostile records straight into rl_traj_decode: random bytes never crash. */
static void
test_random_records(void)
{
	rl_traj *t;
	uint64_t buf[64];
	size_t used;
	int ok = 0;

	rl_traj_create(&t);
	for (int i = 0; i < 20000; i++) {
		size_t n = 8 + rndn(sizeof buf - 8);
		for (size_t k = 0; k < RL_ARRAY_LEN(buf); k++)
			buf[k] = rnd() & (i % 2 ? 0x00ff00ff000000ffull : ~0ull);
		uint32_t len = (uint32_t)(n & ~(size_t)7), nf = (uint32_t)rndn(6);
		memcpy(buf, &len, 4);
		memcpy((char *)buf + 4, &nf, 4);
		if (rl_traj_decode(t, &used, buf, n, NULL, NULL) == 0) {
			ok++;
			T_OK(used <= n);
		}
	}
	(void)ok;
	rl_traj_destroy(t);
}

/* version is I32[2]: another length (or dtype) made a record unversioned,
 * out of reach of the broker's staleness gate; both readers refuse it */
static void
test_version_shape(void)
{
	static const char *const bad[] = {
		"{\"version\":[]}", "{\"version\":[3]}", "{\"version\":[0,1,2]}",
		"{\"t5\":{\"dtype\":\"F64\",\"data\":[1,2]}}",
	};
	const int32_t three[3] = { 0, 1, 2 };
	rl_traj *t = NULL, *u = NULL;
	rl_buf rec;
	size_t used;

	T_OK(rl_traj_create(&t) == 0 && rl_traj_create(&u) == 0);
	rl_buf_init(&rec);
	T_EQ_INT(rl_traj_from_json(t, "{\"version\":[3,4]}", 17, NULL, "v"), 0);
	for (size_t i = 0; i < RL_ARRAY_LEN(bad); i++)
		T_EQ_INT(rl_traj_from_json(t, bad[i], strlen(bad[i]), NULL, "v"), RL_EFORMAT);
	rl_traj_clear(t);
	T_OK(rl_traj_set(t, RL_TAG_VERSION, RL_I32, three, sizeof three) == 0);
	T_OK(rl_traj_encode(&rec, t) == 0);
	T_EQ_INT(rl_traj_decode(u, &used, rec.p, rec.len, NULL, "v"), RL_EFORMAT);
	rec.len = 0;
	T_OK(rl_traj_set_version(t, 5, 6) == 0);
	T_OK(rl_traj_encode(&rec, t) == 0);
	T_EQ_INT(rl_traj_decode(u, &used, rec.p, rec.len, NULL, "v"), 0);
	rl_buf_fini(&rec);
	rl_traj_destroy(t);
	rl_traj_destroy(u);
}

/* JSONL batches end at 256 records or 8 MiB, whichever comes first (rl-queue
 * put sends a batch as one message of 64 MiB at most), and a bad line ends a
 * batch: the records before it come out, the error with the next call. */
static void
test_jsonl_batches(void)
{
	enum { N = 100, TEXT = 200000 };
	rl_buf in;
	rl_traj_reader *r;
	rl_traj_batch *b;
	char *text = malloc(TEXT + 1);
	size_t total = 0, batches = 0, max = 0;
	int rv;

	memset(text, 'x', TEXT);
	text[TEXT] = 0;
	rl_buf_init(&in);
	for (int i = 0; i < N; i++)
		rl_buf_printf(&in, "{\"id\":%d,\"response_text\":\"%s\"}\n", i + 1, text);
	T_OK(rl_traj_reader_open_mem(&r, in.p, in.len, "big", NULL) == 0);
	while ((rv = rl_traj_reader_next_batch(r, &b)) == 0 && b != NULL) {
		total += rl_traj_batch_count(b);
		batches++;
		max = RL_MAX(max, rl_traj_batch_bytes(b));
	}
	T_EQ_INT(rv, 0);
	T_EQ_INT(total, N);
	T_OK(batches >= 3, "%zu batches", batches);
	T_OK(max < ((size_t)8 << 20) + TEXT + 4096, "a batch of %zu bytes", max);
	rl_traj_reader_close(r);

	/* 300 small lines and a bad one: all 300 come out, then the error */
	in.len = 0;
	for (int i = 0; i < 300; i++)
		rl_buf_printf(&in, "{\"id\":%d}\n", i + 1);
	rl_buf_printf(&in, "{\"id\":\n{\"id\":999}\n");
	T_OK(rl_traj_reader_open_mem(&r, in.p, in.len, "bad", NULL) == 0);
	total = 0;
	while ((rv = rl_traj_reader_next_batch(r, &b)) == 0 && b != NULL)
		total += rl_traj_batch_count(b);
	T_EQ_INT(rv, RL_EFORMAT);
	T_EQ_INT(total, 300);
	T_EQ_INT(rl_traj_reader_next_batch(r, &b), RL_EFORMAT);   /* sticky */
	rl_traj_reader_close(r);
	rl_buf_fini(&in);
	free(text);
}

/* FNV-1a, 64 bits, from its published parameters: the reference the ids
 * rl_traj_batch_fill_ids gives are checked against. */
static uint64_t
fnv1a_ref(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* Records without an id get the hash of their bytes; prompts also their id
 * as group; a batch that lacks nothing is passed through as it is. */
static void
test_fill_ids(void)
{
	rl_traj_batch *b, *fixed, *out;
	rl_traj *t;
	const void *rec;
	size_t len;
	uint64_t id, g, want[3];

	rl_traj_batch_create(&b);
	rl_traj_batch_create(&fixed);
	rl_traj_create(&t);
	for (int i = 0; i < 3; i++) {
		rl_traj_clear(t);
		if (i == 1)
			rl_traj_set_u64(t, RL_TAG_ID, 5);
		rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, i == 2 ? "two" : "zero or one");
		rl_traj_batch_add(b, t);
		T_OK(rl_traj_batch_raw(b, (size_t)i, &rec, &len) == 0);
		want[i] = i == 1 ? 5 : fnv1a_ref(rec, len) & 0x7fffffffffffffffULL;
	}
	T_OK(want[0] != want[2] && want[0] >> 63 == 0);
	T_EQ_INT(rl_traj_batch_fill_ids(&out, b, 1, fixed, t), 0);
	T_OK(out == fixed && rl_traj_batch_count(out) == 3);
	for (int i = 0; i < 3; i++) {
		T_OK(rl_traj_batch_get(out, (size_t)i, t) == 0 && rl_traj_get_u64(t, RL_TAG_ID, &id) == 0);
		T_OK(id == want[i], "record %d: id %llu, expected %llu", i, (unsigned long long)id,
		     (unsigned long long)want[i]);
		T_OK(rl_traj_get_u64(t, RL_TAG_GROUP, &g) == 0 && g == id, "record %d: its id as group", i);
	}
	/* the filled batch lacks nothing: passed through; without groups asked
	 * for, a batch with ids lacks nothing either */
	T_EQ_INT(rl_traj_batch_fill_ids(&out, fixed, 1, b, t), 0);
	T_OK(out == fixed);
	rl_traj_batch_clear(b);
	rl_traj_clear(t);
	rl_traj_set_u64(t, RL_TAG_ID, 9);
	rl_traj_batch_add(b, t);
	T_EQ_INT(rl_traj_batch_fill_ids(&out, b, 0, fixed, t), 0);
	T_OK(out == b);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	rl_traj_batch_destroy(fixed);
}

/* 64-bit integers in JSONL: below 2^53 numbers, from 2^53 on strings.  A
 * number from 2^53 on is refused (2^53 + 1 reads as the double 2^53, so two
 * ids would become one); a string is exact. */
static void
test_json_2p53(void)
{
	struct { const char *line; int ok; uint64_t id; } c[] = {
		{ "{\"id\":9007199254740991}", 1, 9007199254740991ULL },
		{ "{\"id\":9007199254740992}", 0, 0 },
		{ "{\"id\":9007199254740993}", 0, 0 },
		{ "{\"id\":1e17}", 0, 0 },
		{ "{\"id\":\"9007199254740993\"}", 1, 9007199254740993ULL },
		{ "{\"id\":\"18446744073709551615\"}", 1, UINT64_MAX },
	};
	rl_traj *t;
	rl_buf out = { 0 };
	char msg[1024];
	uint64_t id;
	int rv;

	rl_traj_create(&t);
	for (size_t i = 0; i < RL_ARRAY_LEN(c); i++) {
		rl_traj_clear(t);
		T_CAPTURE(rl_traj_from_json(t, c[i].line, strlen(c[i].line), NULL, "in"), &rv, msg);
		if (c[i].ok) {
			T_OK(rv == 0 && rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == c[i].id, "%s", c[i].line);
		} else {
			T_OK(rv != 0, "%s: refused", c[i].line);
			T_OK(strstr(msg, "2^53") != NULL && strstr(msg, "'id'") != NULL, "%s: %s", c[i].line, msg);
		}
	}
	/* the writer: 2^53 - 1 a number, 2^53 a string, both read back exact */
	for (uint64_t v = 9007199254740991ULL; v <= 9007199254740992ULL; v++) {
		rl_traj_clear(t);
		rl_traj_set_u64(t, RL_TAG_ID, v);
		out.len = 0;
		T_OK(rl_traj_to_json(&out, t) == 0);
		T_OK(memchr(out.p, '"', out.len) != NULL && strstr((const char *)out.p, v < 9007199254740992ULL ?
		    "\"id\":9007199254740991" : "\"id\":\"9007199254740992\"") != NULL, "%.*s", (int)out.len, out.p);
		rl_traj_clear(t);
		T_OK(rl_traj_from_json(t, (const char *)out.p, out.len - 1, NULL, "back") == 0 &&
		     rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == v);
	}
	rl_buf_fini(&out);
	rl_traj_destroy(t);
}

int
main(void)
{
	T_BEGIN("test_traj");
	test_fill_ids();
	test_json_2p53();
	rl_log_init("test_traj", RL_LOG_QUIET);
	test_typed();
	test_roundtrip();
	test_version_shape();
	test_passthrough();
	test_pipe(RL_TRAJ_BINARY);
	test_pipe(RL_TRAJ_JSONL);
	test_read_modify_write();
	/* the bad-input tests log thousands of expected errors: muted unless
	 * RL_TEST_VERBOSE is set (failed checks still count in the verdict) */
	{
		int saved = dup(2), quiet = getenv("RL_TEST_VERBOSE") == NULL;
		int fails = t_fail;
		if (quiet) {
			fflush(stderr);
			freopen("/dev/null", "w", stderr);
		}
		test_bad();
		test_random_records();
		test_jsonl_batches();
		if (quiet) {
			fflush(stderr);
			dup2(saved, 2);
			if (t_fail > fails)
				fprintf(stderr, "bad-input checks failed: rerun with RL_TEST_VERBOSE=1 to see which\n");
		}
		close(saved);
	}
	T_END();
}

/*
 * traj_stream.c — rl-trajectory(5) stream readers and writers over a FILE,
 * a file descriptor or memory, binary (zstd frames) or JSONL.
 *
 * The reader never asks its source for more bytes than the current frame or
 * line needs (it walks zstd block headers to learn a frame's length), so a
 * stage reading a pipe gets each batch as soon as the writer has flushed it
 * and never waits for bytes that belong to a later batch.
 * Leaves out: seeking, reading a stream that mixes binary and JSONL.
 */
#include "stream/traj_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { SRC_FILE, SRC_FD, SRC_MEM };
/* JSONL batches end at 256 records or 8 MiB, as the binary writer's frames
 * do: rl-queue put sends a batch as one message (64 MiB at most) */
enum { JSONL_BATCH = 256, JSONL_BATCH_BYTES = 8 << 20 };

struct rl_traj_reader {
	int src;
	FILE *f;
	int fd;
	char *name;
	rl_traj_limits lim;
	rl_buf buf;          /* stream sources: bytes read and not dropped */
	const uint8_t *p;    /* window: buf.p, or the memory source */
	size_t len;          /* bytes in the window */
	size_t pos;          /* consumed bytes of the window */
	uint64_t base;       /* stream offset of p[0] */
	int eof;
	int err;             /* sticky error */
	int fmt;
	uint64_t line;       /* JSONL: lines consumed */
	int live;            /* source a pipe or terminal: 0 not known yet, 1 yes, 2 no */
	rl_traj_batch *batch;
	size_t next;         /* _next: next record of batch */
	rl_traj *cur;
	char what[512];
	rl_traj_line_fn line_fn; /* JSONL: a converter tried before the record parser */
	void *line_ctx;
};

static void
set_what_byte(rl_traj_reader *r, const char *kind, uint64_t off)
{
	snprintf(r->what, sizeof r->what, "'%s': %s byte %llu", r->name, kind, (unsigned long long)off);
}

static int
reader_new(rl_traj_reader **out, int src, const char *name, const rl_traj_limits *lim)
{
	rl_traj_reader *r = calloc(1, sizeof *r);
	int rv;

	*out = NULL;
	if (r == NULL) {
		rl_error("out of memory");
		return RL_ENOMEM;
	}
	r->src = src;
	r->fd = -1;
	r->lim = *rli_limits(lim);
	rl_buf_init(&r->buf);
	r->name = strdup(name == NULL || strcmp(name, "-") == 0 ? "<stdin>" : name);
	if (r->name == NULL || (rv = rl_traj_batch_create(&r->batch)) != 0 ||
	    (rv = rl_traj_create(&r->cur)) != 0) {
		rl_traj_reader_close(r);
		rl_error("out of memory");
		return RL_ENOMEM;
	}
	*out = r;
	return RL_OK;
}

int
rl_traj_reader_open_file(rl_traj_reader **out, FILE *f, const char *name, const rl_traj_limits *lim)
{
	int rv = reader_new(out, SRC_FILE, name, lim);
	if (rv == 0)
		(*out)->f = f;
	return rv;
}

int
rl_traj_reader_open_fd(rl_traj_reader **out, int fd, const char *name, const rl_traj_limits *lim)
{
	int rv = reader_new(out, SRC_FD, name, lim);
	if (rv == 0)
		(*out)->fd = fd;
	return rv;
}

int
rl_traj_reader_open_mem(rl_traj_reader **out, const void *buf, size_t n, const char *name,
                        const rl_traj_limits *lim)
{
	int rv = reader_new(out, SRC_MEM, name ? name : "<memory>", lim);
	if (rv == 0) {
		(*out)->p = buf;
		(*out)->len = n;
		(*out)->eof = 1;
	}
	return rv;
}

void
rl_traj_reader_close(rl_traj_reader *r)
{
	if (r == NULL)
		return;
	rl_buf_fini(&r->buf);
	rl_traj_batch_destroy(r->batch);
	rl_traj_destroy(r->cur);
	free(r->name);
	free(r);
}

int rl_traj_reader_format(const rl_traj_reader *r) { return r->fmt; }

void
rl_traj_reader_set_line_fn(rl_traj_reader *r, rl_traj_line_fn fn, void *ctx)
{
	r->line_fn = fn;
	r->line_ctx = ctx;
}
uint64_t rl_traj_reader_offset(const rl_traj_reader *r) { return r->base + r->pos; }

int
rl_traj_reader_drained(const rl_traj_reader *r)
{
	if (r->fmt == RL_TRAJ_BINARY)
		return !r->batch || r->next >= rl_traj_batch_count(r->batch);
	if (r->fmt == RL_TRAJ_JSONL)
		return r->pos >= r->len || memchr(r->p + r->pos, '\n', r->len - r->pos) == NULL;
	return 1;
}

/* Read from the source into the window until `want` unconsumed bytes are
 * there or the input ends.  FILE sources read exactly what is missing (stdio
 * would block for more); descriptors take what one read() gives, up to
 * `hint` bytes.  line: FILE only, read up to the next newline instead. */
static int
more(rl_traj_reader *r, size_t want, size_t hint, int line)
{
	int rv;

	if (r->src == SRC_MEM)
		return RL_OK;
	while (!r->eof && r->len - r->pos < want) {
		size_t missing = want - (r->len - r->pos), n = 0;
		if (r->pos > 0) {
			/* drop what was consumed */
			memmove(r->buf.p, r->buf.p + r->pos, r->len - r->pos);
			r->base += r->pos;
			r->buf.len = r->len - r->pos;
			r->len = r->buf.len;
			r->pos = 0;
		}
		if (r->src == SRC_FD) {
			size_t ask = RL_MAX(missing, hint);
			if ((rv = rl_buf_reserve(&r->buf, ask)) != 0)
				return rv;
			for (;;) {
				ssize_t k = read(r->fd, r->buf.p + r->buf.len, ask);
				if (k < 0 && errno == EINTR)
					continue;
				if (k < 0) {
					rl_error("cannot read '%s': %s", r->name, strerror(errno));
					return RL_EIO;
				}
				n = (size_t)k;
				break;
			}
		} else if (line) {
			int c = 0;
			if ((rv = rl_buf_reserve(&r->buf, 4096)) != 0)
				return rv;
			while (n < 4096 && (c = getc_unlocked(r->f)) != EOF) {
				r->buf.p[r->buf.len + n++] = (uint8_t)c;
				if (c == '\n')
					break;
			}
			if (c == EOF && ferror(r->f)) {
				rl_error("cannot read '%s': %s", r->name, strerror(errno));
				return RL_EIO;
			}
			if (c == '\n')
				want = 0;   /* got the line */
		} else {
			if ((rv = rl_buf_reserve(&r->buf, missing)) != 0)
				return rv;
			n = fread(r->buf.p + r->buf.len, 1, missing, r->f);
			if (n < missing && ferror(r->f)) {
				rl_error("cannot read '%s': %s", r->name, strerror(errno));
				return RL_EIO;
			}
		}
		if (n == 0)
			r->eof = 1;
		r->buf.len += n;
		r->p = r->buf.p;
		r->len = r->buf.len;
	}
	return RL_OK;
}

static int
detect(rl_traj_reader *r)
{
	int rv;

	for (;;) {
		uint8_t c;
		if ((rv = more(r, 1, 1, 0)) != 0)
			return rv;
		if (r->pos == r->len) {
			r->fmt = RL_TRAJ_JSONL;   /* empty: no records either way */
			return RL_OK;
		}
		c = r->p[r->pos];
		if ((c & 0xf0) == 0x50) {
			/* a skippable frame (50..5f 2a 4d 18), or text such as '[' */
			if ((rv = more(r, 4, 1, 0)) != 0)
				return rv;
			if (r->len - r->pos >= 4 && (r->p[r->pos + 1] != 0x2a || r->p[r->pos + 2] != 0x4d ||
			    r->p[r->pos + 3] != 0x18)) {
				rl_error("'%s': byte %llu: not a trajectory stream (starts with %s, neither a zstd frame "
				    "nor a JSON object)", r->name, (unsigned long long)(r->base + r->pos),
				    c == '[' ? "a JSON array" : "text");
				rl_hint("rl-trajectory(5) streams are zstd frames or JSONL, one object per line");
				return RL_EFORMAT;
			}
		}
		if (c == 0x28 || (c & 0xf0) == 0x50) {
			r->fmt = RL_TRAJ_BINARY;
			return RL_OK;
		}
		if (c == '{') {
			r->fmt = RL_TRAJ_JSONL;
			return RL_OK;
		}
		if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
			/* leading blank lines belong to JSONL; keep them for line counting */
			if ((rv = more(r, r->len - r->pos + 1, 1, 0)) != 0)
				return rv;
			size_t i = r->pos;
			while (i < r->len && (r->p[i] == ' ' || r->p[i] == '\t' || r->p[i] == '\r' || r->p[i] == '\n'))
				i++;
			if (i < r->len && r->p[i] == '{') {
				r->fmt = RL_TRAJ_JSONL;
				return RL_OK;
			}
			if (i == r->len && r->eof) {
				r->fmt = RL_TRAJ_JSONL;
				return RL_OK;
			}
			if (i == r->len)
				continue;
			c = r->p[i];
		}
		rl_error("'%s': byte %llu: not a trajectory stream (starts with neither a zstd frame nor a JSON object)",
		         r->name, (unsigned long long)(r->base + r->pos));
		rl_hint("rl-trajectory(5) streams are zstd frames or JSONL, one object per line");
		return RL_EFORMAT;
	}
}

/* How long is the zstd (or skippable) frame at the window position?  Walks
 * the block headers in the bytes there: RL_OK with *total set, or *need set
 * to the bytes required to go on (and *total 0), or an error. */
static int
frame_len(rl_traj_reader *r, size_t *total, size_t *need)
{
	const uint8_t *p = r->p + r->pos;
	size_t avail = r->len - r->pos, o, hs;
	unsigned fhd, single, checksum;
	uint64_t off = r->base + r->pos;
	uint32_t magic;

	*total = 0;
	if (avail < 4) {
		*need = 4;
		return RL_OK;
	}
	memcpy(&magic, p, 4);
	if ((magic & 0xfffffff0u) == 0x184d2a50u) {
		uint32_t sz;
		if (avail < 8) {
			*need = 8;
			return RL_OK;
		}
		memcpy(&sz, p + 4, 4);
		if (sz > r->lim.max_frame) {
			rl_error("'%s': byte %llu: skippable frame of %u bytes over the limit of %zu", r->name,
			         (unsigned long long)off, sz, r->lim.max_frame);
			return RL_ETOOBIG;
		}
		if (avail < 8 + (size_t)sz) {
			*need = 8 + (size_t)sz;
			return RL_OK;
		}
		*total = 8 + (size_t)sz;
		return RL_OK;
	}
	if (magic != 0xfd2fb528u) {
		rl_error("'%s': byte %llu: not a zstd frame (bad magic %08x)", r->name, (unsigned long long)off, magic);
		return RL_EFORMAT;
	}
	/* frame header (RFC 8878 3.1.1.1): descriptor, window, dictionary id,
	 * content size */
	if (avail < 5) {
		*need = 5;
		return RL_OK;
	}
	fhd = p[4];
	single = (fhd >> 5) & 1;
	checksum = (fhd >> 2) & 1;
	if (fhd & 0x08) {
		rl_error("'%s': byte %llu: bad zstd frame header", r->name, (unsigned long long)off);
		return RL_EFORMAT;
	}
	{
		static const uint8_t didsz[4] = { 0, 1, 2, 4 };
		size_t fcs_sz = (fhd >> 6) == 0 ? (size_t)single : (size_t)1 << (fhd >> 6);
		size_t fcs_at = 5 + !single + didsz[fhd & 3];
		hs = fcs_at + fcs_sz;
		if (avail < hs) {
			*need = hs;
			return RL_OK;
		}
		if (fcs_sz) {
			uint64_t v = 0;
			for (size_t k = 0; k < fcs_sz; k++)
				v |= (uint64_t)p[fcs_at + k] << (8 * k);
			if (fcs_sz == 2)
				v += 256;
			if (v > r->lim.max_frame) {
				rl_error("'%s': byte %llu: decompressed size %llu over the limit of %zu bytes", r->name,
				         (unsigned long long)off, (unsigned long long)v, r->lim.max_frame);
				return RL_ETOOBIG;
			}
		}
	}
	o = hs;
	for (;;) {
		uint32_t bh, type, bsz;
		if (avail < o + 3) {
			*need = o + 3;
			return RL_OK;
		}
		bh = (uint32_t)p[o] | (uint32_t)p[o + 1] << 8 | (uint32_t)p[o + 2] << 16;
		type = (bh >> 1) & 3;
		bsz = bh >> 3;
		if (type == 3 || bsz > ZSTD_BLOCKSIZE_MAX) {
			rl_error("'%s': byte %llu: corrupt zstd block header", r->name, (unsigned long long)(off + o));
			return RL_EFORMAT;
		}
		o += 3 + (type == 1 ? 1 : bsz);
		/* compressed data is never much larger than its content */
		if (o > r->lim.max_frame + r->lim.max_frame / 64 + 65536) {
			rl_error("'%s': byte %llu: zstd frame larger than the %zu byte limit", r->name,
			         (unsigned long long)off, r->lim.max_frame);
			return RL_ETOOBIG;
		}
		if (bh & 1)
			break;
	}
	if (checksum)
		o += 4;
	if (avail < o) {
		*need = o;
		return RL_OK;
	}
	*total = o;
	return RL_OK;
}

/* Read and decode the next frame into r->batch: RL_OK (b->n may be 0 for an
 * empty batch or a skippable frame), RL_ECLOSED at the end. */
static int
read_frame(rl_traj_reader *r)
{
	size_t total = 0, need = 0, used;
	int rv;

	for (;;) {
		if ((rv = more(r, 1, 65536, 0)) != 0)
			return rv;
		if (r->pos == r->len)
			return RL_ECLOSED;
		if ((rv = frame_len(r, &total, &need)) != 0)
			return rv;
		if (total)
			break;
		if ((rv = more(r, need, need, 0)) != 0)
			return rv;
		if (r->len - r->pos < need) {
			rl_error("'%s': byte %llu: truncated frame (the stream ends at byte %llu)", r->name,
			         (unsigned long long)(r->base + r->pos), (unsigned long long)(r->base + r->len));
			return RL_EFORMAT;
		}
	}
	set_what_byte(r, "frame at", r->base + r->pos);
	rv = rl_traj_batch_decode(r->batch, &used, r->p + r->pos, total, &r->lim, r->what);
	if (rv != 0)
		return rv;
	r->pos += total;
	r->next = 0;
	return RL_OK;
}

/* Next JSONL line (without its newline): RL_OK with *line NULL at the end. */
static int
read_line(rl_traj_reader *r, const char **line, size_t *n)
{
	size_t scan = 0;
	int rv;

	*line = NULL;
	for (;;) {
		const uint8_t *s = r->p + r->pos, *nl;
		size_t avail = r->len - r->pos;
		nl = avail > scan ? memchr(s + scan, '\n', avail - scan) : NULL;
		if (nl != NULL || (r->eof && avail > 0)) {
			size_t len = nl ? (size_t)(nl - s) : avail;
			r->line++;
			if (len > r->lim.max_line) {
				rl_error("'%s': line %llu: longer than the limit of %zu bytes", r->name,
				         (unsigned long long)r->line, r->lim.max_line);
				return RL_ETOOBIG;
			}
			*line = (const char *)s;
			*n = len;
			r->pos += len + (nl != NULL);
			return RL_OK;
		}
		if (r->eof)
			return RL_OK;
		if (avail > r->lim.max_line) {
			rl_error("'%s': line %llu: longer than the limit of %zu bytes", r->name,
			         (unsigned long long)r->line + 1, r->lim.max_line);
			return RL_ETOOBIG;
		}
		scan = avail;
		if ((rv = more(r, avail + 1, 65536, 1)) != 0)
			return rv;
	}
}

static int
blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			return 0;
	return 1;
}

/* Parse the next non-blank line into r->cur: RL_ECLOSED at the end. */
static int
next_json(rl_traj_reader *r)
{
	const char *line;
	size_t n;
	int rv;

	do {
		if ((rv = read_line(r, &line, &n)) != 0)
			return rv;
		if (line == NULL)
			return RL_ECLOSED;
	} while (blank(line, n));
	snprintf(r->what, sizeof r->what, "'%s': line %llu", r->name, (unsigned long long)r->line);
	if (r->line_fn) {
		rl_traj_clear(r->cur);
		rv = r->line_fn(r->line_ctx, r->cur, line, n, r->what, r->line);
		if (rv != RL_ENOENT)
			return rv;
	}
	return rl_traj_from_json(r->cur, line, n, &r->lim, r->what);
}

static int
start(rl_traj_reader *r)
{
	int rv;

	if (r->err)
		return r->err;
	if (r->fmt == 0 && (rv = detect(r)) != 0)
		return r->err = rv;
	return RL_OK;
}

int
rl_traj_reader_next(rl_traj_reader *r, rl_traj **t)
{
	int rv;

	*t = NULL;
	if ((rv = start(r)) != 0)
		return rv;
	if (r->fmt == RL_TRAJ_JSONL) {
		rv = next_json(r);
	} else {
		rv = RL_OK;
		while (r->next >= rl_traj_batch_count(r->batch) && (rv = read_frame(r)) == 0)
			;
		if (rv == 0)
			rv = rl_traj_batch_get(r->batch, r->next++, r->cur);
	}
	if (rv == RL_ECLOSED)
		return RL_OK;
	if (rv != 0)
		return r->err = rv;
	*t = r->cur;
	return RL_OK;
}

/* 1 when the next JSONL line is not at hand: no whole line in the window and
 * the source, a pipe or a terminal, has nothing to read now */
static int
jsonl_would_wait(rl_traj_reader *r)
{
	if (r->src == SRC_MEM || r->eof || r->live == 2 || !rl_traj_reader_drained(r))
		return 0;
	return r->src == SRC_FD ? rl_io_would_wait(NULL, r->fd, &r->live) : rl_io_would_wait(r->f, -1, &r->live);
}

int
rl_traj_reader_would_wait(rl_traj_reader *r)
{
	if (r->src == SRC_MEM || r->eof || r->live == 2 || !rl_traj_reader_drained(r))
		return 0;
	return r->src == SRC_FD ? rl_io_would_wait(NULL, r->fd, &r->live) : rl_io_would_wait(r->f, -1, &r->live);
}

int
rl_traj_reader_next_batch(rl_traj_reader *r, rl_traj_batch **b)
{
	int rv;

	*b = NULL;
	if ((rv = start(r)) != 0)
		return rv;
	if (r->fmt == RL_TRAJ_BINARY) {
		rv = read_frame(r);
		r->next = rl_traj_batch_count(r->batch);
	} else {
		rl_traj_batch_clear(r->batch);
		while (rl_traj_batch_count(r->batch) < JSONL_BATCH &&
		       rl_traj_batch_bytes(r->batch) < JSONL_BATCH_BYTES) {
			/* a live producer (tail -f, a generator): what came so far goes
			 * on now rather than after 256 lines */
			if (rl_traj_batch_count(r->batch) > 0 && jsonl_would_wait(r))
				break;
			if ((rv = next_json(r)) != 0)
				break;
			if ((rv = rl_traj_batch_add(r->batch, r->cur)) != 0)
				break;
		}
		if (rv != 0 && rl_traj_batch_count(r->batch) > 0) {
			/* hand out the lines before the end or the bad line; an
			 * error comes back (sticky) from the next call */
			if (rv != RL_ECLOSED)
				r->err = rv;
			rv = RL_OK;
		}
	}
	if (rv == RL_ECLOSED)
		return RL_OK;
	if (rv != 0)
		return r->err = rv;
	*b = r->batch;
	return RL_OK;
}

/* ---- writer ------------------------------------------------------------------------------------ */

enum { DST_FILE, DST_FD, DST_BUF };

struct rl_traj_writer {
	int dst;
	FILE *f;
	int fd;
	rl_buf *out;
	char *name;
	rl_traj_writer_opts o;
	int flush_lines;      /* JSONL to a pipe, socket or terminal: flush each line */
	rl_traj_batch *pend;
	rl_traj *tmp_t;
	rl_buf tmp;
	int err;
};

static int
writer_new(rl_traj_writer **out, int dst, const char *name, const rl_traj_writer_opts *o)
{
	rl_traj_writer *w = calloc(1, sizeof *w);

	*out = NULL;
	if (w == NULL)
		goto nomem;
	w->dst = dst;
	w->fd = -1;
	if (o)
		w->o = *o;
	if (w->o.format == RL_TRAJ_AUTO)
		w->o.format = RL_TRAJ_BINARY;
	if (w->o.format != RL_TRAJ_BINARY && w->o.format != RL_TRAJ_JSONL) {
		free(w);
		return RL_EINVAL;
	}
	if (w->o.batch_records == 0)
		w->o.batch_records = 256;
	if (w->o.batch_bytes == 0)
		w->o.batch_bytes = (size_t)8 << 20;
	rl_buf_init(&w->tmp);
	w->name = strdup(name == NULL || strcmp(name, "-") == 0 ? "<stdout>" : name);
	if (w->name == NULL || rl_traj_batch_create(&w->pend) != 0 || rl_traj_create(&w->tmp_t) != 0) {
		rl_traj_batch_destroy(w->pend);
		rl_traj_destroy(w->tmp_t);
		free(w->name);
		free(w);
		goto nomem;
	}
	*out = w;
	return RL_OK;
nomem:
	rl_error("out of memory");
	return RL_ENOMEM;
}

static int
is_stream_fd(int fd)
{
	struct stat st;
	return fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode);
}

int
rl_traj_writer_open_file(rl_traj_writer **out, FILE *f, const char *name, const rl_traj_writer_opts *o)
{
	int rv = writer_new(out, DST_FILE, name, o);
	if (rv == 0) {
		(*out)->f = f;
		(*out)->flush_lines = is_stream_fd(fileno(f));
	}
	return rv;
}

int
rl_traj_writer_open_fd(rl_traj_writer **out, int fd, const char *name, const rl_traj_writer_opts *o)
{
	int rv = writer_new(out, DST_FD, name, o);
	if (rv == 0)
		(*out)->fd = fd;
	return rv;
}

int
rl_traj_writer_open_buf(rl_traj_writer **out, rl_buf *buf, const rl_traj_writer_opts *o)
{
	int rv = writer_new(out, DST_BUF, "<memory>", o);
	if (rv == 0)
		(*out)->out = buf;
	return rv;
}

static int
emit(rl_traj_writer *w, const void *p, size_t n, int flush)
{
	int rv = RL_OK;

	switch (w->dst) {
	case DST_FILE:
		rv = rl_io_fwrite(w->f, p, n, w->name);
		if (rv == 0 && flush && fflush(w->f) != 0) {
			rl_error("cannot write '%s': %s", w->name, strerror(errno));
			rv = errno == EPIPE ? RL_ECLOSED : RL_EIO;
		}
		break;
	case DST_FD:
		rv = rl_io_write_full(w->fd, p, n, w->name);
		break;
	case DST_BUF:
		rv = rl_buf_append(w->out, p, n);
		break;
	}
	if (rv != 0)
		w->err = rv;
	return rv;
}

static int
write_pending(rl_traj_writer *w)
{
	int rv;

	if (rl_traj_batch_count(w->pend) == 0)
		return RL_OK;
	w->tmp.len = 0;
	if ((rv = rl_traj_batch_encode(&w->tmp, w->pend, w->o.level)) != 0)
		return w->err = rv;
	rl_traj_batch_clear(w->pend);
	return emit(w, w->tmp.p, w->tmp.len, 1);
}

int
rl_traj_writer_put(rl_traj_writer *w, const rl_traj *t)
{
	int rv;

	if (w->err)
		return w->err;
	if (w->o.format == RL_TRAJ_JSONL) {
		w->tmp.len = 0;
		if ((rv = rl_traj_to_json(&w->tmp, t)) != 0)
			return rv;
		return emit(w, w->tmp.p, w->tmp.len, w->flush_lines);
	}
	if ((rv = rl_traj_batch_add(w->pend, t)) != 0)
		return w->err = rv;
	if (rl_traj_batch_count(w->pend) >= w->o.batch_records || rl_traj_batch_bytes(w->pend) >= w->o.batch_bytes)
		return write_pending(w);
	return RL_OK;
}

int
rl_traj_writer_put_batch(rl_traj_writer *w, rl_traj_batch *b)
{
	const void *frame;
	size_t n;
	int rv;

	if (w->err)
		return w->err;
	if ((rv = write_pending(w)) != 0)
		return rv;
	if (w->o.format == RL_TRAJ_JSONL) {
		for (size_t i = 0; i < rl_traj_batch_count(b); i++) {
			if ((rv = rl_traj_batch_get(b, i, w->tmp_t)) != 0)
				return rv;
			if ((rv = rl_traj_writer_put(w, w->tmp_t)) != 0)
				return rv;
		}
		return RL_OK;
	}
	if (rl_traj_batch_count(b) == 0)
		return RL_OK;
	if (rl_traj_batch_frame(b, &frame, &n) == 0)
		return emit(w, frame, n, 1);
	w->tmp.len = 0;
	if ((rv = rl_traj_batch_encode(&w->tmp, b, w->o.level)) != 0)
		return w->err = rv;
	return emit(w, w->tmp.p, w->tmp.len, 1);
}

int
rl_traj_writer_flush(rl_traj_writer *w)
{
	int rv;

	if (w->err)
		return w->err;
	if ((rv = write_pending(w)) != 0)
		return rv;
	if (w->dst == DST_FILE && fflush(w->f) != 0) {
		rl_error("cannot write '%s': %s", w->name, strerror(errno));
		return w->err = errno == EPIPE ? RL_ECLOSED : RL_EIO;
	}
	return RL_OK;
}

int
rl_traj_writer_close(rl_traj_writer *w)
{
	int rv;

	if (w == NULL)
		return RL_OK;
	rv = rl_traj_writer_flush(w);
	rl_traj_batch_destroy(w->pend);
	rl_traj_destroy(w->tmp_t);
	rl_buf_fini(&w->tmp);
	free(w->name);
	free(w);
	return rv;
}

/*
 * test_traj_stream.c — the stream layer of rl-trajectory(5) (traj_stream.c):
 * where the binary writer cuts frames (record count, bytes, flush), what the
 * reader reports between frames (rl_traj_reader_drained, _offset, _format),
 * format detection, reassembly of frames that arrive in small pieces over a
 * pipe, and the messages for truncated and foreign input (source named, byte
 * offset or line number).  test_traj.c covers the records themselves and
 * their round trips.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/io.h"
#include "stream/traj.h"
#include "t.h"

/* n records with ids first.. and a text of textlen bytes, written to buf. */
static void
write_records(rl_buf *buf, const rl_traj_writer_opts *o, uint64_t first, int n, size_t textlen)
{
	rl_traj_writer *w;
	rl_traj *t;
	char *text = malloc(textlen + 1);

	memset(text, 'x', textlen);
	text[textlen] = 0;
	T_OK(rl_traj_create(&t) == 0, "create");
	T_OK(rl_traj_writer_open_buf(&w, buf, o) == 0, "open writer");
	for (int i = 0; i < n; i++) {
		T_OK(rl_traj_set_u64(t, RL_TAG_ID, first + (uint64_t)i) == 0, "set id");
		T_OK(rl_traj_set_str(t, RL_TAG_RESPONSE_TEXT, text) == 0, "set text");
		T_OK(rl_traj_writer_put(w, t) == 0, "put %d", i);
	}
	T_OK(rl_traj_writer_close(w) == 0, "close writer");
	rl_traj_destroy(t);
	free(text);
}

/* The record counts of the batches of a buffer, in order; returns how many. */
static int
batch_sizes(const rl_buf *buf, size_t *sizes, int max)
{
	rl_traj_reader *r;
	rl_traj_batch *b;
	int n = 0, rv;

	T_OK(rl_traj_reader_open_mem(&r, buf->p, buf->len, "mem", NULL) == 0, "open reader");
	while ((rv = rl_traj_reader_next_batch(r, &b)) == 0 && b != NULL)
		if (n < max)
			sizes[n++] = rl_traj_batch_count(b);
	T_EQ_INT(rv, 0);
	rl_traj_reader_close(r);
	return n;
}

static void
test_frames_by_count(void)
{
	rl_buf buf = { 0 };
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY, .batch_records = 4 };
	size_t s[16];
	int n;

	write_records(&buf, &o, 1, 10, 20);
	n = batch_sizes(&buf, s, 16);
	T_EQ_INT(n, 3);
	T_EQ_INT(s[0], 4);
	T_EQ_INT(s[1], 4);
	T_EQ_INT(s[2], 2);   /* the rest, written by close */
	rl_buf_fini(&buf);

	/* JSONL has no frames: the reader cuts batches of at most 256 lines */
	o.format = RL_TRAJ_JSONL;
	write_records(&buf, &o, 1, 600, 4);
	n = batch_sizes(&buf, s, 16);
	T_EQ_INT(n, 3);
	T_EQ_INT(s[0], 256);
	T_EQ_INT(s[1], 256);
	T_EQ_INT(s[2], 88);
	rl_buf_fini(&buf);
}

/* batch_bytes: records of ~1 KB with a 4 KB bound make many small frames,
 * each of a few records; with the default bound the same records are one. */
static void
test_frames_by_bytes(void)
{
	rl_buf buf = { 0 };
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY, .batch_bytes = 4096 };
	size_t s[64], total = 0;
	int n;

	write_records(&buf, &o, 1, 40, 1000);
	n = batch_sizes(&buf, s, 64);
	T_OK(n >= 8 && n <= 20, "%d frames for 40 KB of records under a 4 KB bound", n);
	for (int i = 0; i < n && i < 64; i++) {
		T_OK(s[i] >= 1 && s[i] <= 5, "frame %d holds %zu records", i, s[i]);
		total += s[i];
	}
	T_EQ_INT(total, 40);
	rl_buf_fini(&buf);

	o.batch_bytes = 0;
	write_records(&buf, &o, 1, 40, 1000);
	T_EQ_INT(batch_sizes(&buf, s, 64), 1);
	rl_buf_fini(&buf);
}

/* _drained is 1 exactly when the current frame's records are used up;
 * _offset is the end of the frames read so far; _format once detected. */
static void
test_drained_offset(void)
{
	rl_buf buf = { 0 };
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY, .batch_records = 3 };
	rl_traj_reader *r;
	rl_traj *t;
	uint64_t id, off1 = 0;

	write_records(&buf, &o, 100, 6, 10);
	T_OK(rl_traj_reader_open_mem(&r, buf.p, buf.len, "mem", NULL) == 0, "open");
	T_EQ_INT(rl_traj_reader_format(r), 0);
	for (int i = 0; i < 6; i++) {
		T_OK(rl_traj_reader_next(r, &t) == 0 && t != NULL, "record %d", i);
		T_OK(t && rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == 100u + (uint64_t)i, "id %d", i);
		T_EQ_INT(rl_traj_reader_drained(r), i % 3 == 2);
		if (i == 0)
			off1 = rl_traj_reader_offset(r);
		if (i == 2)
			T_OK(rl_traj_reader_offset(r) == off1, "offset moves only with a new frame");
	}
	T_OK(off1 > 0 && off1 < buf.len, "first frame ends at %llu of %zu", (unsigned long long)off1, buf.len);
	T_OK(rl_traj_reader_next(r, &t) == 0 && t == NULL, "end");
	T_OK(rl_traj_reader_offset(r) == buf.len, "offset at the end: %llu of %zu",
	     (unsigned long long)rl_traj_reader_offset(r), buf.len);
	T_EQ_INT(rl_traj_reader_format(r), RL_TRAJ_BINARY);
	rl_traj_reader_close(r);
	rl_buf_fini(&buf);
}

static void
test_detect(void)
{
	const char *jl = " \n\t{\"id\":7}\n{\"id\":8}\n";
	rl_traj_reader *r;
	rl_traj *t;
	uint64_t id;

	/* empty input: no records and no format */
	T_OK(rl_traj_reader_open_mem(&r, "", 0, "empty", NULL) == 0, "open empty");
	T_OK(rl_traj_reader_next(r, &t) == 0 && t == NULL, "empty has no record");
	rl_traj_reader_close(r);

	/* whitespace before the first '{' is JSONL */
	T_OK(rl_traj_reader_open_mem(&r, jl, strlen(jl), "ws", NULL) == 0, "open ws");
	T_OK(rl_traj_reader_next(r, &t) == 0 && t != NULL, "first line");
	T_OK(t && rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == 7, "id 7");
	T_EQ_INT(rl_traj_reader_format(r), RL_TRAJ_JSONL);
	T_OK(rl_traj_reader_next(r, &t) == 0 && t != NULL, "second line");
	T_OK(rl_traj_reader_next(r, &t) == 0 && t == NULL, "end");
	rl_traj_reader_close(r);
}

/* Every bad input is an error that names the source and where, and stays. */
static void
expect_error(const void *p, size_t n, const char *name, const char *where)
{
	rl_traj_reader *r;
	rl_traj *t = NULL;
	char msg[2048];
	int rv = 0;

	T_OK(rl_traj_reader_open_mem(&r, p, n, name, NULL) == 0, "open %s", name);
	T_CAPTURE(({ int e_; while ((e_ = rl_traj_reader_next(r, &t)) == 0 && t != NULL) ; e_; }), &rv, msg);
	T_OK(rv != 0, "%s: an error, got %d", name, rv);
	T_OK(strstr(msg, name) != NULL, "%s: the message names the source: %s", name, msg);
	T_OK(strstr(msg, where) != NULL, "%s: the message says '%s': %s", name, where, msg);
	T_OK(rl_traj_reader_next(r, &t) == rv, "%s: the error is sticky", name);
	rl_traj_reader_close(r);
}

static void
test_bad_input(void)
{
	rl_buf buf = { 0 };
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY, .batch_records = 2 };
	const char *jl = "{\"id\":1}\n{\"id\":2}\n{\"id\":\n";

	write_records(&buf, &o, 1, 4, 30);
	expect_error(buf.p, buf.len - 5, "cut-binary", "byte");
	expect_error("PK\3\4 a zip file", 16, "foreign", "byte 0");
	expect_error(jl, strlen(jl), "cut-jsonl", "line 3");
	rl_buf_fini(&buf);
}

/* A binary stream fed to a pipe 7 bytes at a time by another process: the
 * reader assembles every frame from short reads and gets every record. */
static void
test_pipe_trickle(void)
{
	rl_buf buf = { 0 };
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY, .batch_records = 5 };
	rl_traj_reader *r;
	rl_traj *t;
	uint64_t id, want = 1;
	int fd[2], status = 0;
	pid_t pid;

	write_records(&buf, &o, 1, 23, 50);
	T_OK(pipe(fd) == 0, "pipe");
	pid = fork();
	if (pid == 0) {
		close(fd[0]);
		for (size_t at = 0; at < buf.len; at += 7) {
			size_t k = buf.len - at < 7 ? buf.len - at : 7;
			if (write(fd[1], buf.p + at, k) != (ssize_t)k)
				_exit(1);
			if (at % 70 == 0)
				usleep(1000);
		}
		_exit(0);
	}
	close(fd[1]);
	alarm(30);   /* a reader that waits for bytes it does not need hangs: fail instead */
	T_OK(rl_traj_reader_open_fd(&r, fd[0], "trickle", NULL) == 0, "open fd");
	while (rl_traj_reader_next(r, &t) == 0 && t != NULL) {
		T_OK(rl_traj_get_u64(t, RL_TAG_ID, &id) == 0 && id == want, "id %llu, expected %llu",
		     (unsigned long long)id, (unsigned long long)want);
		want++;
	}
	alarm(0);
	T_EQ_INT(want - 1, 23);
	rl_traj_reader_close(r);
	close(fd[0]);
	T_OK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer");
	rl_buf_fini(&buf);
}

/* A writer on a file descriptor: what it wrote reads back, and flush writes
 * the pending records as a frame of their own. */
static void
test_writer_fd(void)
{
	char path[] = "/tmp/test_traj_stream.XXXXXX";
	int fd = mkstemp(path);
	rl_traj_writer_opts o = { .format = RL_TRAJ_BINARY };
	rl_traj_writer *w;
	rl_traj *t;
	char *data = NULL;
	size_t len = 0, s[8];
	rl_buf view;

	T_OK(fd >= 0, "mkstemp");
	rl_traj_create(&t);
	T_OK(rl_traj_writer_open_fd(&w, fd, path, &o) == 0, "open fd writer");
	for (int i = 0; i < 5; i++) {
		rl_traj_set_u64(t, RL_TAG_ID, (uint64_t)i + 1);
		T_OK(rl_traj_writer_put(w, t) == 0, "put");
		if (i == 1)
			T_OK(rl_traj_writer_flush(w) == 0, "flush");
	}
	T_OK(rl_traj_writer_close(w) == 0, "close");
	close(fd);
	T_OK(rl_io_read_file(path, 1 << 20, &data, &len) == 0, "read back");
	view = (rl_buf){ .p = (uint8_t *)data, .len = len };
	T_EQ_INT(batch_sizes(&view, s, 8), 2);
	T_EQ_INT(s[0], 2);
	T_EQ_INT(s[1], 3);
	free(data);
	unlink(path);
	rl_traj_destroy(t);
}

int
main(void)
{
	T_BEGIN("test_traj_stream");
	rl_log_init("test_traj_stream", RL_LOG_QUIET);
	signal(SIGPIPE, SIG_IGN);
	test_frames_by_count();
	test_frames_by_bytes();
	test_drained_offset();
	test_detect();
	test_bad_input();
	test_pipe_trickle();
	test_writer_fd();
	T_END();
}

/*
 * put.c — `rl-queue put URL FILE...`: send prompts (or trajectories) from
 * JSONL files or binary streams to the broker, batch by batch.  Binary frames
 * go out as they are (no recompression) unless records need an id.  A record
 * without an id gets one from a hash of its bytes, so putting the same file
 * twice is idempotent; a prompt without a group gets its id as group.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/progress.h"
#include "rollout/prompt.h"
#include "queue/qclient.h"
#include "rlq.h"
#include "stream/traj.h"

static const char usage_text[] =
	"usage: rl-queue put [OPTION]... URL [FILE|-]...\n"
	"Send records (JSONL or binary streams, detected per file) to the broker\n"
	"at URL.  No FILE, or -, reads standard input.\n"
	"\n"
	"  -s, --stage STAGE    prompt (default), generated or scored\n"
	"  -t, --timeout S      give up when the broker is busy or unreachable\n"
	"                       for S seconds (default 60)\n"
	"  -z, --compress MODE  auto (default: off on loopback), on or off\n"
	"  -q, --quiet          print errors only\n"
	"  -v, --verbose        print more\n"
	"      --config FILE    options from a YAML file (keys: long options)\n"
	"      --version        print the program version and exit\n"
	"  -h, --help           print this help and exit\n"
	"\n"
	"Exit status: 0 success, 1 bad input or refused, 2 usage error,\n"
	"3 broker busy or unreachable until the timeout.\n";

/* The progress line: records sent, and the share of the input's bytes read
 * when every input is a regular file (else no bar, only counts). */
static rl_progress prog;
static double total_bytes, bytes_before;   /* total_bytes 0: unknown */
static FILE *cur_file;

static void
show(unsigned long long nrec)
{
	double dt = rl_progress_elapsed(&prog), frac = -1;
	long pos;

	if (total_bytes > 0 && cur_file && (pos = ftell(cur_file)) >= 0)
		frac = RL_MIN((bytes_before + (double)pos) / total_bytes, 0.999);
	rl_progress_draw(&prog, frac, "%llu records, %.0f records/s", nrec, dt > 0 ? nrec / dt : 0.0);
}

/* A stream that reads the text put peeked at (nws newlines, then a line)
 * and then the rest of a pipe it could not rewind.  Takes line (malloc'd);
 * closing it leaves rest open. */
typedef struct peeked {
	char *line;
	size_t n, off, nws;
	FILE *rest;
} peeked;

static ssize_t
peeked_read(void *arg, char *buf, size_t size)
{
	peeked *pk = arg;
	size_t k = 0;

	for (; k < size && pk->nws > 0; pk->nws--)
		buf[k++] = '\n';
	if (k < size && pk->off < pk->n) {
		size_t m = RL_MIN(size - k, pk->n - pk->off);
		memcpy(buf + k, pk->line + pk->off, m);
		pk->off += m;
		k += m;
	}
	if (k < size && pk->off == pk->n) {
		size_t m = fread(buf + k, 1, size - k, pk->rest);
		if (m == 0 && k == 0 && ferror(pk->rest))
			return -1;
		k += m;
	}
	return (ssize_t)k;
}

static int
peeked_close(void *arg)
{
	peeked *pk = arg;

	free(pk->line);
	free(pk);
	return 0;
}

static FILE *
peeked_open(char *line, size_t n, size_t nws, FILE *rest)
{
	cookie_io_functions_t io = { .read = peeked_read, .close = peeked_close };
	peeked *pk = calloc(1, sizeof *pk);
	FILE *f;

	if (pk == NULL) {
		free(line);
		return NULL;
	}
	*pk = (peeked){ .line = line, .n = n, .nws = nws, .rest = rest };
	if ((f = fopencookie(pk, "rb", io)) == NULL)
		peeked_close(pk);
	return f;
}

/* Prompt lines from f (the first already read into first/n), in batches of
 * 256 or 8 MiB (a put is one message of 64 MiB at most).  A bad line ends
 * the input: the prompts before it are sent, then its error is returned. */
static int
put_prompt_lines(rl_qclient *cl, FILE *f, const char *path, const char *first, size_t n, rl_traj_batch *b,
    rl_traj *t, unsigned long long *nrec, unsigned long long *acc, unsigned long long *dup,
    unsigned long long *rej)
{
	char *line = NULL, what[512];
	size_t cap = 0;
	ssize_t len = (ssize_t)n;
	unsigned long long ln = 1;
	const char *cur = first;
	int rv = RL_OK, bad = RL_OK, live = 0;

	rl_traj_batch_clear(b);
	for (;;) {
		if (cur) {
			while (len > 0 && (cur[len - 1] == '\n' || cur[len - 1] == '\r'))
				len--;
			if (len > 0) {
				snprintf(what, sizeof what, "put: '%s': line %llu", path, ln);
				if ((bad = rl_prompt_line_to_traj(t, cur, (size_t)len, what)) != 0)
					cur = NULL;   /* send what came before it */
			}
			if (cur && len > 0) {
				/* the same text on two lines is two prompts; the same file put twice is
				 * still idempotent: the id hashes the line and its number */
				if (!rl_traj_has(t, RL_TAG_ID)) {
					uint64_t id = (rl_fnv1a(RL_FNV1A_INIT, (const uint8_t *)cur, (size_t)len) ^
					    (ln * 0x9e3779b97f4a7c15ULL)) & 0x7fffffffffffffffULL;
					if ((rv = rl_traj_set_u64(t, RL_TAG_ID, id)) != 0)
						break;
				}
				if ((rv = rl_traj_batch_add(b, t)) != 0)
					break;
			}
		}
		/* a live producer (tail -f, a script): the prompts so far go on
		 * now rather than after 256 lines */
		if (rl_traj_batch_count(b) == 256 || rl_traj_batch_bytes(b) >= (size_t)8 << 20 ||
		    (!cur && rl_traj_batch_count(b) > 0) || (rl_traj_batch_count(b) > 0 && rl_io_would_wait(f, -1, &live))) {
			rl_traj_batch *send;
			rl_qput_result res;
			rl_traj_batch *fixed = NULL;
			if ((rv = rl_traj_batch_create(&fixed)) != 0)
				break;
			if ((rv = rl_traj_batch_fill_ids(&send, b, 1, fixed, t)) == 0 &&
			    (rv = rl_qclient_put(cl, RL_QSTAGE_PROMPT, send, &res)) == 0) {
				*nrec += rl_traj_batch_count(send);
				*acc += res.accepted + res.replaced;
				*dup += res.duplicates;
				*rej += res.rejected;
				show(*nrec);
			} else if (rv != 0) {
				rl_progress_done(&prog);
				rl_error("put: '%s': the broker did not take a batch of %zu prompts: %s", path,
				    rl_traj_batch_count(b), rl_strerror(rv));
			}
			rl_traj_batch_destroy(fixed);
			rl_traj_batch_clear(b);
			if (rv != 0)
				break;
		}
		if (!cur)
			break;
		len = getline(&line, &cap, f);
		ln++;
		cur = len >= 0 ? line : NULL;
	}
	free(line);
	return rv != RL_OK ? rv : bad;
}

int
rlq_put_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "stage", required_argument, NULL, 's' },
		{ "timeout", required_argument, NULL, 't' },
		{ "compress", required_argument, NULL, 'z' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_qclient_opts o;
	rl_qclient *cl = NULL;
	rl_traj_batch *fixed = NULL;
	rl_traj *t = NULL;
	unsigned long long nrec = 0, acc = 0, dup = 0, rej = 0;
	int c, stage = RL_QSTAGE_PROMPT, rv = RL_OK, verbosity = RL_LOG_NORMAL;
	const char *url;
	double d;

	rl_qclient_opts_default(&o);
	rl_cli_init("rl-queue put", opts);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	opterr = 0;
	while ((c = rl_cli_getopt(argc, argv, ":s:t:z:qvh", NULL)) != -1) {
		switch (c) {
		case 's':
			if ((stage = rl_qstage_parse(optarg)) < 0)
				return rl_cli_usage("--stage: bad value '%s' (prompt, generated or scored)", optarg);
			break;
		case 't':
			if ((rv = rl_cli_double(c, optarg, 0, 86400, &d)) != 0)
				return rv;
			o.retry_ms = (int)(d * 1000);
			o.timeout_ms = RL_MAX(1000, RL_MIN(o.timeout_ms, o.retry_ms));
			break;
		case 'z':
			if (strcmp(optarg, "auto") == 0) o.compress = -1;
			else if (strcmp(optarg, "on") == 0) o.compress = 1;
			else if (strcmp(optarg, "off") == 0) o.compress = 0;
			else
				return rl_cli_usage("--compress: bad value '%s' (auto, on or off)", optarg);
			break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':': return rl_cli_usage("put: option '%s' needs an argument", argv[optind - 1]);
		default: return rl_cli_usage("put: unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return rl_cli_usage("put: missing the broker URL");
	rl_log_set_level(verbosity);
	url = argv[optind++];
	if ((rv = rl_qclient_open(&cl, url, &o)) != 0)
		return 1;
	if ((rv = rl_traj_batch_create(&fixed)) != 0 || (rv = rl_traj_create(&t)) != 0)
		goto out;
	rl_progress_init(&prog, verbosity == RL_LOG_QUIET);
	for (int i = optind; i < argc; i++) {
		struct stat st;
		if (strcmp(argv[i], "-") == 0 || stat(argv[i], &st) != 0 || !S_ISREG(st.st_mode)) {
			total_bytes = 0;
			break;
		}
		total_bytes += (double)st.st_size;
	}
	for (int i = optind; i < argc || (i == optind && optind == argc); i++) {
		const char *path = i < argc ? argv[i] : "-";
		rl_traj_reader *r = NULL;
		FILE *f = NULL, *in;

		if (cur_file) {
			struct stat st;
			if (i > optind && stat(argv[i - 1], &st) == 0)
				bytes_before += (double)st.st_size;
			cur_file = NULL;
		}
		if ((rv = rl_io_fopen(&f, path, "rb")) != 0)
			break;
		cur_file = f;
		in = f;
		if (stage == RL_QSTAGE_PROMPT) {
			/* rl-rollout's prompt lines ({"prompt": text or messages, ...}) become prompt records */
			int c0;
			size_t nws = 0;
			while ((c0 = getc(f)) == ' ' || c0 == '\t' || c0 == '\n' || c0 == '\r')
				nws += c0 == '\n';
			if (c0 != EOF)
				ungetc(c0, f);
			if (c0 == '{') {
				char *line = NULL;
				size_t cap = 0;
				ssize_t len = getline(&line, &cap, f);
				if (len > 0 && rl_prompt_line_is(line, (size_t)len)) {
					rv = put_prompt_lines(cl, f, path, line, (size_t)len, fixed, t, &nrec, &acc, &dup, &rej);
					free(line);
					if (f != stdin)
						fclose(f);
					if (rv != 0)
						break;
					continue;
				}
				/* records after all: read them from the start, or, from a pipe,
				 * from the peeked text and then the rest */
				if (f != stdin && fseek(f, 0, SEEK_SET) == 0) {
					free(line);
				} else if ((in = peeked_open(line, len > 0 ? (size_t)len : 0, nws, f)) == NULL) {
					rl_error("put: '%s': out of memory", path);
					rv = RL_ENOMEM;
					if (f != stdin)
						fclose(f);
					break;
				}
			}
		}
		if ((rv = rl_traj_reader_open_file(&r, in, path, NULL)) == 0) {
			for (;;) {
				rl_traj_batch *b, *send;
				rl_qput_result res;
				if ((rv = rl_traj_reader_next_batch(r, &b)) != 0 || b == NULL)
					break;
				if (rl_traj_batch_count(b) == 0)
					continue;
				if ((rv = rl_traj_batch_fill_ids(&send, b, stage == RL_QSTAGE_PROMPT, fixed, t)) != 0)
					break;
				if ((rv = rl_qclient_put(cl, stage, send, &res)) != 0) {
					rl_progress_done(&prog);
					rl_error("put: '%s': the broker did not take a batch of %zu records: %s", path,
					    rl_traj_batch_count(send), rl_strerror(rv));
					break;
				}
				nrec += rl_traj_batch_count(send);
				acc += res.accepted + res.replaced;
				dup += res.duplicates;
				rej += res.rejected;
				show(nrec);
			}
		}
		rl_traj_reader_close(r);
		if (in != f)
			fclose(in);
		if (f != stdin)
			fclose(f);
		if (rv != 0)
			break;
	}
	if (rv == 0)
		rl_progress_draw(&prog, total_bytes > 0 ? 1 : -1, "%llu records, %.0f records/s", nrec,
		    rl_progress_elapsed(&prog) > 0 ? nrec / rl_progress_elapsed(&prog) : 0.0);
	rl_progress_done(&prog);
	rl_info("put: %llu records: %llu accepted, %llu duplicates, %llu rejected", nrec, acc, dup, rej);
out:
	rl_traj_destroy(t);
	rl_traj_batch_destroy(fixed);
	rl_qclient_close(cl);
	if (rv == RL_EBUSY || rv == RL_ETIMEDOUT || rv == RL_ENET)
		return 3;
	return rv == 0 ? 0 : 1;
}

/*
 * rl-sync — versioned weight distribution from the trainer to rollout workers.
 *
 *   rl-sync serve --listen URL [--data-dir DIR] [--keep-previous]
 *   rl-sync push URL CKPT_DIR [--version N] [--delta BASE_DIR] [--rewind]
 *   rl-sync pull URL --out DIR [--wait] [--follow] [--keep K]
 *   rl-sync status URL [--json]
 *   rl-sync publish DIR CKPT_DIR --version N [--keep K]     (file transport)
 *
 * Parses options and calls lib/sync/wsync.h and lib/sync/wdir.h; nothing else here.
 * Exit: 0 ok, 1 runtime failure, 2 usage, 3 no version to pull (pull without
 * --wait), 4 checksum failure.
 */
#include "base/core.h"
#include "base/io.h"
#include "sync/wdir.h"
#include "sync/wsync.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <errno.h>
#include <libgen.h>

static const char usage_text[] =
	"usage: rl-sync serve --listen URL [--data-dir DIR] [--keep-previous] [--threads N] [--no-shm]\n"
	"       rl-sync push URL CKPT_DIR [--version N] [--delta BASE_DIR] [--rewind] [--level L] [--chunk MIB]\n"
	"                    [--stored|--compress] [--transport auto|shm|stream|nng]\n"
	"       rl-sync pull URL --out DIR [--wait] [--follow] [--keep K] [--version N] [--stored|--compress]\n"
	"                    [--transport auto|shm|stream|nng]\n"
	"       rl-sync status URL [--json]\n"
	"       rl-sync publish DIR CKPT_DIR --version N [--keep K]\n"
	"common: [--timeout MS] [--parallel N] [-q] [-v] [--help]\n";

static const char help_text[] =
	"rl-sync moves versioned model weights from the trainer to rollout workers.\n"
	"\n"
	"  serve    hold the latest version (and --keep-previous the one before) and serve it\n"
	"  push     send checkpoint directory CKPT_DIR to a server as a new version\n"
	"  pull     fetch the latest version into DIR/vNNNNNN (DIR/latest points at it)\n"
	"  status   print what a server holds\n"
	"  publish  put CKPT_DIR into the versioned directory DIR (file transport)\n"
	"\n"
	"options:\n"
	"  -l, --listen URL       serve: nng URL to listen on (default tcp://127.0.0.1:7401)\n"
	"  -d, --data-dir DIR     serve: keep versions in DIR; a restarted server serves the last one\n"
	"  -p, --keep-previous    serve: also hold and serve the previous version\n"
	"  -t, --threads N        serve: worker threads (default 4)\n"
	"  -M, --no-shm           serve: no shared memory for workers on this host\n"
	"  -n, --version N        push/publish: version number (push default: server's latest + 1);\n"
	"                         pull: fetch version N instead of the latest\n"
	"  -D, --delta BASE_DIR   push: send only the XOR against BASE_DIR, the server's latest version\n"
	"                         (not to a server on this host with --transport auto: see there)\n"
	"  -R, --rewind           push: the version of a resumed trainer: the server drops the versions\n"
	"                         from its number up and its workers move to it (needs --version N)\n"
	"  -L, --level L          push: zstd level (default 1)\n"
	"  -c, --chunk MIB        push: chunk size in MiB (default 4)\n"
	"  -o, --out DIR          pull: versioned output directory\n"
	"  -w, --wait             pull: wait for a version if the server has none yet\n"
	"  -f, --follow           pull: keep pulling each new version (as a delta when possible)\n"
	"  -k, --keep K           pull/publish: versions kept in DIR (default 2)\n"
	"  -S, --stored           push/pull: whole chunks uncompressed (the default with a server\n"
	"                         on this host; deltas are always compressed)\n"
	"  -Z, --compress         push/pull: whole chunks zstd-compressed (the default with a\n"
	"                         server on another host)\n"
	"  -x, --transport T      pull: auto (shared memory when the server is on this host, else\n"
	"                         the stream), shm, stream (bulk stream or REQ/REP) or nng (REQ/REP);\n"
	"                         push: auto (to a server on this host the version goes as one sealed\n"
	"                         shared memory object, no delta; else chunks), shm, or stream and\n"
	"                         nng (chunks, and deltas with --delta)\n"
	"  -j, --json             status: print JSON\n"
	"  -T, --timeout MS       per-request timeout (default 10000)\n"
	"  -P, --parallel N       chunks in flight (default 4)\n"
	"  -q, --quiet            errors only\n"
	"  -v, --verbose          more messages\n"
	"  -h, --help             this text\n";

static const struct option longopts[] = {
	{ "listen", required_argument, NULL, 'l' },
	{ "data-dir", required_argument, NULL, 'd' },
	{ "keep-previous", no_argument, NULL, 'p' },
	{ "threads", required_argument, NULL, 't' },
	{ "version", required_argument, NULL, 'n' },
	{ "delta", required_argument, NULL, 'D' },
	{ "rewind", no_argument, NULL, 'R' },
	{ "level", required_argument, NULL, 'L' },
	{ "chunk", required_argument, NULL, 'c' },
	{ "out", required_argument, NULL, 'o' },
	{ "wait", no_argument, NULL, 'w' },
	{ "follow", no_argument, NULL, 'f' },
	{ "keep", required_argument, NULL, 'k' },
	{ "json", no_argument, NULL, 'j' },
	{ "transport", required_argument, NULL, 'x' },
	{ "no-shm", no_argument, NULL, 'M' },
	{ "stored", no_argument, NULL, 'S' },
	{ "compress", no_argument, NULL, 'Z' },
	{ "timeout", required_argument, NULL, 'T' },
	{ "parallel", required_argument, NULL, 'P' },
	{ "quiet", no_argument, NULL, 'q' },
	{ "verbose", no_argument, NULL, 'v' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

typedef struct cfg {
	const char *cmd, *url, *dir, *ckpt, *listen, *data_dir, *out, *delta;
	int keep_previous, threads, level, wait, follow, keep, json, stored, timeout, parallel, verbosity;
	int transport, no_shm, rewind;
	unsigned long long version;
	size_t chunk;
} cfg;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static int
usage(const char *fmt, const char *arg)
{
	if (fmt) {
		fprintf(stderr, "rl-sync: ");
		fprintf(stderr, fmt, arg);
		fputc('\n', stderr);
	}
	fputs(usage_text, stderr);
	return 2;
}

static int
num(const char *s, long long lo, long long hi, long long *out)
{
	char *end;
	long long v = strtoll(s, &end, 10);

	if (*s == 0 || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static int
exit_code(int rv)
{
	return rv == RL_OK ? 0 : rv == RL_ECHECKSUM ? 4 : 1;
}

static void
install_signals(void)
{
	rl_stop_signals(on_signal, 0);
	signal(SIGPIPE, SIG_IGN);
	/* past a file size limit (ulimit -f) writing a version fails with EFBIG,
	 * reported like a full disk, instead of killing the process */
	signal(SIGXFSZ, SIG_IGN);
}

static int
cmd_serve(const cfg *c)
{
	rl_wsync_server_opts o = { 0 };
	rl_wsync_server *s;
	int rv;

	o.listen = c->listen;
	o.data_dir = c->data_dir;
	o.keep_previous = c->keep_previous;
	o.threads = c->threads;
	o.shm = c->no_shm ? -1 : 0;
	install_signals();
	if ((rv = rl_wsync_server_open(&s, &o)) != 0)
		return exit_code(rv);
	rl_info("listening on %s%s", rl_wsync_server_url(s),
		c->data_dir ? "" : " (memory only; --data-dir keeps versions across restarts)");
	while (!stop)
		usleep(100000);
	rl_verbose("stopping");
	rl_wsync_server_close(s);
	return 0;
}

static rl_wsync_client_opts
client_opts(const cfg *c)
{
	rl_wsync_client_opts o = { 0 };

	o.timeout_ms = c->timeout;
	o.parallel = c->parallel;
	o.level = c->level;
	o.chunk = c->chunk;
	o.stored = c->stored;
	o.transport = c->transport;
	return o;
}

/* the server's latest version number, from status */
static int
server_latest(rl_wsync_client *cl, unsigned long long *latest)
{
	char *js;
	cJSON *j;
	const cJSON *l;
	int rv;

	if ((rv = rl_wsync_status(cl, &js)) != 0)
		return rv;
	j = cJSON_Parse(js);
	free(js);
	l = cJSON_GetObjectItemCaseSensitive(j, "latest");
	if (!cJSON_IsNumber(l)) {
		cJSON_Delete(j);
		rl_error("malformed status reply");
		return RL_EFORMAT;
	}
	*latest = (unsigned long long)l->valuedouble;
	cJSON_Delete(j);
	return RL_OK;
}

static int
cmd_push(const cfg *c)
{
	rl_wsync_client_opts o = client_opts(c);
	rl_wsync_client *cl = NULL;
	rl_wver *v = NULL, *base = NULL;
	rl_wsync_stats st;
	double t0 = rl_now();
	int rv;

	if ((rv = rl_wver_read_dir(&v, c->ckpt, 0)) != 0)
		goto out;
	if (v->nblobs == 0) {
		rl_error("'%s' has no files to push", c->ckpt);
		rl_hint("for a versioned directory give its version: '%s/latest'", c->ckpt);
		rv = RL_ENOENT;
		goto out;
	}
	if (c->delta && (rv = rl_wver_read_dir(&base, c->delta, 0)) != 0)
		goto out;
	if (base && base->version == 0) {
		rl_error("'%s': no %s, so its version number is unknown", c->delta, RL_WSYNC_MANIFEST);
		rl_hint("use a directory written by rl-sync (pull --out, serve --data-dir, publish)");
		rv = RL_EINVAL;
		goto out;
	}
	if ((rv = rl_wsync_client_open(&cl, c->url, &o)) != 0)
		goto out;
	if (c->version) {
		v->version = c->version;
	} else if (v->version == 0 && c->rewind) {
		rl_error("push --rewind: '%s' records no version number (no %s)", c->ckpt, RL_WSYNC_MANIFEST);
		rl_hint("give the version the trainer resumed from: --version N");
		rv = RL_EINVAL;
		goto out;
	} else if (v->version == 0) {
		unsigned long long l;
		if ((rv = server_latest(cl, &l)) != 0)
			goto out;
		v->version = l + 1;
	}
	if ((rv = rl_wver_hash(v)) != 0 ||
	    (rv = c->rewind ? rl_wsync_push_rewind(cl, v) : rl_wsync_push(cl, v, base)) != 0)
		goto out;
	rl_wsync_client_stats(cl, &st, 0);
	rl_info("pushed version %llu: %llu bytes as %llu on the wire in %.2f s", (unsigned long long)v->version,
		(unsigned long long)rl_wver_total(v), (unsigned long long)st.bytes_sent, rl_now() - t0);
out:
	rl_wsync_client_close(cl);
	rl_wver_destroy(v);
	rl_wver_destroy(base);
	return exit_code(rv);
}

/* pull's output directory, before anything is fetched: a directory this
 * process can write in, or a name that one can be created at. */
static int
check_out_dir(const char *dir)
{
	struct stat st;
	char *d, *parent;
	int ok;

	if (stat(dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode)) {
			rl_error("cannot pull into '%s': not a directory", dir);
			return RL_EIO;
		}
		if (access(dir, W_OK | X_OK) != 0) {
			rl_error("cannot pull into '%s': %s", dir, strerror(errno));
			return RL_EIO;
		}
		return RL_OK;
	}
	if (errno != ENOENT) {
		rl_error("cannot pull into '%s': %s", dir, strerror(errno));
		return RL_EIO;
	}
	d = rl_xstrdup(dir);
	parent = dirname(d);
	ok = access(parent, W_OK | X_OK) == 0;
	if (!ok)
		rl_error("cannot pull into '%s': cannot create it in '%s': %s", dir, parent, strerror(errno));
	free(d);
	return ok ? RL_OK : RL_EIO;
}

static int
cmd_pull(const cfg *c)
{
	rl_wsync_client_opts o = client_opts(c);
	rl_wsync_client *cl = NULL;
	rl_wver *have = NULL;
	uint64_t last = 0, lin = 0;
	int rv, keep = c->keep ? c->keep : 2, noversion = 0, again = 0, behind = 0;
	int pause_ms = getenv("RL_SYNC_TEST_PULL_PAUSE_MS") ? atoi(getenv("RL_SYNC_TEST_PULL_PAUSE_MS")) : 0;

	install_signals();
	if ((rv = check_out_dir(c->out)) != 0)
		return exit_code(rv);
	if ((rv = rl_wsync_client_open(&cl, c->url, &o)) != 0)
		goto out;
	{
		/* resume after what the output directory already holds */
		char path[4096];
		uint64_t l;
		if (rl_wdir_latest(c->out, &l, path, sizeof path) == RL_OK) {
			last = l;
			rl_wdir_lineage(path, &lin);
			if (c->follow && rl_wver_read_dir(&have, path, 0) != RL_OK)
				have = NULL;
		}
	}
	do {
		uint64_t want = c->version, latest = 0, llin = lin;
		rl_wver *v = NULL;
		rl_wsync_stats st;
		double t0 = rl_now();

		if (want == 0) {
			int wait = c->wait || c->follow;
			rv = RL_ETIMEDOUT;
			while (!stop) {
				/* RL_OK also when the server rewound (a resumed trainer):
				 * its line is another than the directory's */
				rv = rl_wsync_poll_line(cl, last, lin, wait ? 1000 : 0, &latest, &llin);
				if (rv == RL_ENET && wait) {
					rl_warn("still waiting for '%s'", c->url);
					continue;
				}
				if (rv == RL_ETIMEDOUT && wait && latest > 0 && latest < last && !behind) {
					/* said once: the wait is for a version newer than the directory's */
					rl_warn("'%s' has version %llu, older than version %llu in '%s': waiting for a "
						"version newer than %llu", c->url, (unsigned long long)latest,
						(unsigned long long)last, c->out, (unsigned long long)last);
					behind = 1;
				}
				if (rv != RL_ETIMEDOUT || !wait)
					break;
			}
			if (stop) {
				rv = RL_OK; /* SIGINT/SIGTERM: a clean stop */
				break;
			}
			if (rv == RL_ETIMEDOUT) {
				if (latest == 0) {
					rl_error("'%s' has no version yet", c->url);
					rl_hint("use --wait to wait for one");
					rv = RL_ENOENT;
					noversion = 1;
				} else if (latest < last) {
					/* not "already holds": the directory's version is another one */
					rl_error("'%s' has version %llu, older than version %llu in '%s'", c->url,
						 (unsigned long long)latest, (unsigned long long)last, c->out);
					rl_hint("a server restarted without --data-dir, or another run's?  pull into "
						"another directory");
					rv = RL_ESTALE;
				} else {
					rl_info("'%s' has version %llu, which '%s' already holds", c->url,
						(unsigned long long)latest, c->out);
					rv = RL_OK;
				}
				goto out;
			}
			if (rv != 0)
				goto out;
		}
		if (pause_ms > 0 && !again) /* test hook: a push lands between poll and fetch */
			usleep((useconds_t)pause_ms * 1000);
		rv = rl_wsync_fetch(cl, &v, want ? want : latest, have);
		if (rv == RL_ENOENT && !want && (c->follow || again < 8)) {
			/* the server moved on while we asked: take the newer one (also
			 * without --follow, where a bare continue ended the loop and the
			 * pull exited 1 without a word) */
			again = 1 + (again < 8 ? again : 7);
			continue;
		}
		if (rv == RL_ENOENT && want)
			rl_error("'%s' does not hold version %llu", c->url, (unsigned long long)want);
		else if (rv == RL_ENOENT)
			rl_error("'%s' replaced version %llu by a newer one %d times while it was fetched", c->url,
				 (unsigned long long)latest, again + 1);
		if (rv != 0)
			goto out;
		again = 0;
		rl_wsync_client_stats(cl, &st, 1);
		if (v->lineage != lin && last > 0 && !want) {
			/* the directory follows the server back: the versions above
			 * this one are dropped there too */
			if (v->version <= last)
				rl_info("'%s' went back to version %llu (a resumed trainer): rewinding '%s' from %llu", c->url,
				(unsigned long long)v->version, c->out, (unsigned long long)last);
			rv = rl_wdir_rewind_ver(c->out, v, keep, &lin);
		} else {
			rv = rl_wdir_publish_ver(c->out, v, keep);
		}
		if (rv != 0) {
			rl_wver_destroy(v);
			goto out;
		}
		if (st.shm_versions)
			rl_info("pulled version %llu: %llu bytes over shared memory in %.2f s", (unsigned long long)v->version,
				(unsigned long long)rl_wver_total(v), rl_now() - t0);
		else
			rl_info("pulled version %llu: %llu bytes (%llu on the wire%s) in %.2f s",
				(unsigned long long)v->version, (unsigned long long)rl_wver_total(v),
				(unsigned long long)st.bytes_recv, st.retries ? ", with re-sent chunks" : "", rl_now() - t0);
		last = v->version;
		lin = v->lineage;
		rl_wver_destroy(have);
		have = v;
	} while ((c->follow || again) && !stop);
out:
	rl_wver_destroy(have);
	rl_wsync_client_close(cl);
	if (noversion)
		return 3;
	return exit_code(rv);
}

static int
cmd_status(const cfg *c)
{
	rl_wsync_client_opts o = client_opts(c);
	rl_wsync_client *cl = NULL;
	char *js = NULL;
	cJSON *j = NULL;
	const cJSON *it;
	int rv;

	if ((rv = rl_wsync_client_open(&cl, c->url, &o)) != 0 || (rv = rl_wsync_status(cl, &js)) != 0)
		goto out;
	if (c->json) {
		printf("%s\n", js);
		goto out;
	}
	if ((j = cJSON_Parse(js)) == NULL) {
		rl_error("malformed status reply from '%s'", c->url);
		rv = RL_EFORMAT;
		goto out;
	}
	it = cJSON_GetObjectItemCaseSensitive(j, "latest");
	printf("latest: %.0f\n", cJSON_IsNumber(it) ? it->valuedouble : 0);
	it = cJSON_GetObjectItemCaseSensitive(j, "lineage");
	if (cJSON_IsNumber(it) && it->valuedouble > 0)
		printf("line: %.0f (rewound %.0f times by resumed trainers)\n", it->valuedouble, it->valuedouble);
	cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "versions")) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, "version");
		const cJSON *h = cJSON_GetObjectItemCaseSensitive(it, "hash");
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(it, "bytes");
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "blobs");
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(it, "delta_base");
		if (!cJSON_IsNumber(v) || !cJSON_IsString(h) || !cJSON_IsNumber(b) || !cJSON_IsNumber(n))
			continue;
		printf("version %.0f: %.0f bytes in %.0f blobs, hash %s", v->valuedouble, b->valuedouble, n->valuedouble,
		       h->valuestring);
		if (cJSON_IsNumber(d) && d->valuedouble > 0)
			printf(", delta from %.0f", d->valuedouble);
		printf("\n");
	}
	it = cJSON_GetObjectItemCaseSensitive(j, "pushing");
	if (cJSON_IsNumber(it))
		printf("receiving: %.0f\n", it->valuedouble);
	it = cJSON_GetObjectItemCaseSensitive(j, "bulk");
	if (cJSON_IsString(it) && it->valuestring[0])
		printf("bulk stream: %s\n", it->valuestring);
	it = cJSON_GetObjectItemCaseSensitive(j, "shm");
	if (cJSON_IsString(it) && it->valuestring[0]) {
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "shm_served");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "shm_pushes");
		printf("shared memory: @%s (%.0f versions handed out, %.0f pushed)\n", it->valuestring,
		       cJSON_IsNumber(n) ? n->valuedouble : 0, cJSON_IsNumber(p) ? p->valuedouble : 0);
	}
out:
	cJSON_Delete(j);
	free(js);
	rl_wsync_client_close(cl);
	return exit_code(rv);
}

static int
cmd_publish(const cfg *c)
{
	return exit_code(rl_wdir_publish(c->dir, c->ckpt, c->version, c->keep ? c->keep : 2));
}

int
main(int argc, char **argv)
{
	cfg c = { 0 };
	int opt, nargs;
	long long v;

	c.verbosity = RL_LOG_NORMAL;
	rl_log_init("rl-sync", RL_LOG_NORMAL);
	/* chunk-sized messages (4-64 MiB) come and go all the time: keep them in
	 * the heap instead of fresh, page-faulted mappings each time */
	mallopt(M_MMAP_THRESHOLD, 128 << 20);
	mallopt(M_TRIM_THRESHOLD, 512 << 20);
	while ((opt = getopt_long(argc, argv, "l:d:pt:n:D:RL:c:o:wfk:jSZT:P:qvhx:M", longopts, NULL)) != -1) {
		switch (opt) {
		case 'l': c.listen = optarg; break;
		case 'd': c.data_dir = optarg; break;
		case 'p': c.keep_previous = 1; break;
		case 't':
			if (num(optarg, 1, 256, &v))
				return usage("--threads: want 1..256, not '%s'", optarg);
			c.threads = (int)v;
			break;
		case 'n':
			if (num(optarg, 1, (long long)1 << 53, &v))
				return usage("--version: want a number >= 1, not '%s'", optarg);
			c.version = (unsigned long long)v;
			break;
		case 'D': c.delta = optarg; break;
		case 'R': c.rewind = 1; break;
		case 'L':
			if (num(optarg, -7, 19, &v) || v == 0)
				return usage("--level: want -7..19 (not 0), not '%s'", optarg);
			c.level = (int)v;
			break;
		case 'c':
			if (num(optarg, 1, (long long)(RL_WSYNC_CHUNK_MAX >> 20), &v))
				return usage("--chunk: want 1..64 (MiB), not '%s'", optarg);
			c.chunk = (size_t)v << 20;
			break;
		case 'o': c.out = optarg; break;
		case 'w': c.wait = 1; break;
		case 'f': c.follow = 1; break;
		case 'k':
			if (num(optarg, 1, 1000000, &v))
				return usage("--keep: want a number >= 1, not '%s'", optarg);
			c.keep = (int)v;
			break;
		case 'j': c.json = 1; break;
		case 'x':
			if (rl_wsync_transport_parse(optarg, &c.transport) != 0 || c.transport == RL_WSYNC_T_FILE)
				return usage("--transport: want auto, shm, stream or nng, not '%s'", optarg);
			break;
		case 'M': c.no_shm = 1; break;
		case 'S': c.stored = 1; break;
		case 'Z': c.stored = -1; break;
		case 'T':
			if (num(optarg, 1, 86400000, &v))
				return usage("--timeout: want milliseconds >= 1, not '%s'", optarg);
			c.timeout = (int)v;
			break;
		case 'P':
			if (num(optarg, 1, 64, &v))
				return usage("--parallel: want 1..64, not '%s'", optarg);
			c.parallel = (int)v;
			break;
		case 'q': c.verbosity = RL_LOG_QUIET; break;
		case 'v': c.verbosity++; break;
		case 'h':
			fputs(usage_text, stdout);
			fputs("\n", stdout);
			fputs(help_text, stdout);
			return rl_io_close_stdout() ? 1 : 0;
		default: return usage(NULL, NULL);
		}
	}
	rl_log_set_level(c.verbosity);
	if (optind >= argc)
		return usage("missing command", NULL);
	c.cmd = argv[optind++];
	nargs = argc - optind;
	if (c.rewind && strcmp(c.cmd, "push") != 0)
		return usage("--rewind is an option of push, not of %s", c.cmd);
	if (strcmp(c.cmd, "serve") == 0) {
		if (nargs != 0)
			return usage("serve: unexpected argument '%s'", argv[optind]);
		if (c.listen && strncmp(c.listen, "inproc://", 9) == 0)
			return usage("serve: --listen '%s': inproc:// reaches only the same process; use tcp:// or ipc://",
				     c.listen);
		return cmd_serve(&c);
	}
	if (strcmp(c.cmd, "push") == 0) {
		if (nargs != 2)
			return usage("push: want URL CKPT_DIR%s", "");
		if (c.rewind && c.delta)
			return usage("push: --rewind sends the version whole: drop --delta%s", "");
		c.url = argv[optind];
		c.ckpt = argv[optind + 1];
		return cmd_push(&c);
	}
	if (strcmp(c.cmd, "pull") == 0) {
		if (nargs != 1)
			return usage("pull: want URL%s", "");
		if (c.out == NULL)
			return usage("pull: --out DIR is required%s", "");
		if (c.follow && c.version)
			return usage("pull: --follow and --version do not go together%s", "");
		c.url = argv[optind];
		return cmd_pull(&c);
	}
	if (strcmp(c.cmd, "status") == 0) {
		if (nargs != 1)
			return usage("status: want URL%s", "");
		c.url = argv[optind];
		return cmd_status(&c);
	}
	if (strcmp(c.cmd, "publish") == 0) {
		if (nargs != 2)
			return usage("publish: want DIR CKPT_DIR%s", "");
		if (c.version == 0)
			return usage("publish: --version N is required%s", "");
		c.dir = argv[optind];
		c.ckpt = argv[optind + 1];
		return cmd_publish(&c);
	}
	return usage("unknown command '%s'", c.cmd);
}

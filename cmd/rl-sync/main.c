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
#include "base/cli.h"
#include "base/io.h"
#include "base/auth.h"
#include "base/nngx.h"
#include "sync/wdir.h"
#include "sync/wsync.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>

static const char usage_text[] =
	"usage: rl-sync serve --listen URL [--data-dir DIR] [--keep-previous] [--threads N] [--no-shm]\n"
	"                    [--part-timeout S]\n"
	"       rl-sync push URL CKPT_DIR [--version N] [--delta BASE_DIR] [--rewind] [--level L] [--chunk MIB]\n"
	"                    [--part I/N]\n"
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
	"      --part-timeout S   serve: a version pushed in parts is dropped when a part is still\n"
	"                         missing S seconds after its first began (default 60)\n"
	"      --listen-public    serve: allow a non-loopback --listen without TLS client\n"
	"                         certificates\n"
	"      --tls-cert FILE    tls+tcp://: this end's certificate (PEM)\n"
	"      --tls-key FILE     its private key (PEM)\n"
	"      --tls-ca FILE      the CA the other end's certificate must be signed by\n"
	"                         (serve: clients must present one)\n"
	"      --tls-key-pass-file F  the first line is the password of an encrypted\n"
	"                         --tls-key (mode 600)\n"
	"      --tls-crl FILE     refuse the other end's certificate when this CRL (PEM)\n"
	"                         revokes it\n"
	"      --auth-key-file F  a shared key (mode 600): serve refuses requests without\n"
	"                         its HMAC; clients sign theirs (allows a public --listen)\n"
	"  -n, --version N        push/publish: version number (push default: server's latest + 1);\n"
	"                         pull: fetch version N instead of the latest\n"
	"  -D, --delta BASE_DIR   push: send only the XOR against BASE_DIR, the server's latest version\n"
	"                         (not to a server on this host with --transport auto: see there)\n"
	"  -R, --rewind           push: the version of a resumed trainer: the server drops the versions\n"
	"                         from its number up and its workers move to it (needs --version N)\n"
	"      --part I/N         push: CKPT_DIR's files are part I (0..N-1) of N parts of version\n"
	"                         --version N, pushed by N processes at once; the server publishes\n"
	"                         the version when all are in (--delta: this part's previous one)\n"
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
	"      --config FILE      options from a YAML file (keys: long options)\n"
	"      --version          print the program version and exit (alone, before a command)\n"
	"  -h, --help             this text\n";

enum { OPT_LISTEN_PUBLIC = 256, OPT_TLS_CERT, OPT_TLS_KEY, OPT_TLS_CA, OPT_TLS_PASS, OPT_TLS_CRL, OPT_AUTH_KEY, OPT_PART, OPT_PART_TIMEOUT };

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
	{ "listen-public", no_argument, NULL, OPT_LISTEN_PUBLIC },
	{ "tls-cert", required_argument, NULL, OPT_TLS_CERT },
	{ "tls-key", required_argument, NULL, OPT_TLS_KEY },
	{ "tls-ca", required_argument, NULL, OPT_TLS_CA },
	{ "tls-key-pass-file", required_argument, NULL, OPT_TLS_PASS },
	{ "tls-crl", required_argument, NULL, OPT_TLS_CRL },
	{ "auth-key-file", required_argument, NULL, OPT_AUTH_KEY },
	{ "part", required_argument, NULL, OPT_PART },
	{ "part-timeout", required_argument, NULL, OPT_PART_TIMEOUT },
	{ NULL, 0, NULL, 0 },
};

typedef struct cfg {
	const char *cmd, *url, *dir, *ckpt, *listen, *data_dir, *out, *delta;
	int keep_previous, threads, level, wait, follow, keep, json, stored, timeout, parallel, verbosity;
	int transport, no_shm, rewind, listen_public;
	int part, parts;          /* push --part I/N: part I of N (parts 0: a whole version) */
	double part_timeout;
	unsigned long long version;
	size_t chunk;
} cfg;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

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
	o.part_timeout_s = c->part_timeout;
	if (c->listen && rli_listen_policy("serve", c->listen,
					   rli_auth_key(NULL) || (strncmp(c->listen, "tls+", 4) == 0 && rli_nng_tls_authenticates()),
					   c->listen_public) != 0)
		return 2;
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
	if (c->parts) {
		int pub = 0;
		if ((rv = rl_wver_hash(v)) != 0 || (rv = rl_wsync_push_part(cl, v, base, c->part, c->parts, &pub)) != 0)
			goto out;
		rl_wsync_client_stats(cl, &st, 0);
		rl_info("pushed part %d of %d of version %llu: %llu bytes as %llu on the wire in %.2f s%s", c->part,
			c->parts, (unsigned long long)v->version, (unsigned long long)rl_wver_total(v),
			(unsigned long long)st.bytes_sent, rl_now() - t0, pub ? "; the version is published" :
			"; the version waits for its other parts");
		goto out;
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

static int
cmd_pull(const cfg *c)
{
	rl_wsync_pull_opts o = { 0 };
	int empty, rv;

	o.url = c->url;
	o.out = c->out;
	o.client = client_opts(c);
	o.version = c->version;
	o.wait = c->wait;
	o.follow = c->follow;
	o.keep = c->keep;
	o.stop = &stop;
	install_signals();
	rv = rl_wsync_pull(&empty, &o);
	return empty ? 3 : exit_code(rv);
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

/* the usage-error hint names the subcommand's --help when argv[1] is one
 * (every synopsis starts with it) */
static void
cli_init(int argc, char **argv)
{
	static const char *const cmds[] = { "serve", "push", "pull", "status", "publish" };
	static char help[32];

	for (size_t i = 0; argc > 1 && i < RL_ARRAY_LEN(cmds); i++)
		if (strcmp(argv[1], cmds[i]) == 0) {
			snprintf(help, sizeof help, "rl-sync %s", cmds[i]);
			rl_cli_init(help, longopts);
			return;
		}
	rl_cli_init(NULL, longopts);
}

int
main(int argc, char **argv)
{
	cfg c = { 0 };
	int opt, nargs, rv;
	long long v;
	const char *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL, *auth_key = NULL;
	const char *tls_pass = NULL, *tls_crl = NULL;

	c.verbosity = RL_LOG_NORMAL;
	rl_log_init("rl-sync", RL_LOG_NORMAL);
	/* alone, before a command: the program's version; after one (pull
	 * --version N) it stays the weight version it always was */
	if (argc == 2 && strcmp(argv[1], "--version") == 0)
		return rl_cli_print_version();
	/* chunk-sized messages (4-64 MiB) come and go all the time: keep them in
	 * the heap instead of fresh, page-faulted mappings each time */
	mallopt(M_MMAP_THRESHOLD, 128 << 20);
	mallopt(M_TRIM_THRESHOLD, 512 << 20);
	cli_init(argc, argv);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	while ((opt = rl_cli_getopt(argc, argv, "l:d:pt:n:D:RL:c:o:wfk:jSZT:P:qvhx:M", NULL)) != -1) {
		switch (opt) {
		case 'l': c.listen = optarg; break;
		case 'd': c.data_dir = optarg; break;
		case 'p': c.keep_previous = 1; break;
		case 't':
			if ((rv = rl_cli_int32(opt, optarg, 1, 256, &c.threads)) != 0)
				return rv;
			break;
		case 'n':
			if ((rv = rl_cli_int(opt, optarg, 1, (long long)1 << 53, &v)) != 0)
				return rv;
			c.version = (unsigned long long)v;
			break;
		case 'D': c.delta = optarg; break;
		case 'R': c.rewind = 1; break;
		case 'L':
			if ((rv = rl_cli_int32(opt, optarg, -7, 19, &c.level)) != 0)
				return rv;
			if (c.level == 0)
				return rl_cli_usage("--level: bad value '%s' (0 is no zstd level: -7 to -1 or 1 to 19)", optarg);
			break;
		case 'c':
			/* in MiB */
			if ((rv = rl_cli_int(opt, optarg, 1, (long long)(RL_WSYNC_CHUNK_MAX >> 20), &v)) != 0)
				return rv;
			c.chunk = (size_t)v << 20;
			break;
		case 'o': c.out = optarg; break;
		case 'w': c.wait = 1; break;
		case 'f': c.follow = 1; break;
		case 'k':
			if ((rv = rl_cli_int32(opt, optarg, 1, 1000000, &c.keep)) != 0)
				return rv;
			break;
		case 'j': c.json = 1; break;
		case 'x':
			if (rl_wsync_transport_parse(optarg, &c.transport) != 0 || c.transport == RL_WSYNC_T_FILE)
				return rl_cli_usage("--transport: bad value '%s' (auto, shm, stream or nng)", optarg);
			break;
		case 'M': c.no_shm = 1; break;
		case OPT_LISTEN_PUBLIC: c.listen_public = 1; break;
		case OPT_TLS_CERT: tls_cert = optarg; break;
		case OPT_TLS_KEY: tls_key = optarg; break;
		case OPT_TLS_CA: tls_ca = optarg; break;
		case OPT_TLS_PASS: tls_pass = optarg; break;
		case OPT_TLS_CRL: tls_crl = optarg; break;
		case OPT_AUTH_KEY: auth_key = optarg; break;
		case OPT_PART: {
			char *e1, *e2;
			long i = strtol(optarg, &e1, 10), n = *e1 == '/' ? strtol(e1 + 1, &e2, 10) : 0;
			if (*e1 != '/' || e1 == optarg || *e2 || e2 == e1 + 1 || n < 1 || n > 4096 || i < 0 || i >= n)
				return rl_cli_usage("--part: bad value '%s' (I/N: part I of N, 0 <= I < N <= 4096)", optarg);
			c.part = (int)i;
			c.parts = (int)n;
			break;
		}
		case OPT_PART_TIMEOUT: {
			char *e;
			c.part_timeout = strtod(optarg, &e);
			if (e == optarg || *e || !(c.part_timeout > 0 && c.part_timeout <= 86400))
				return rl_cli_usage("--part-timeout: bad value '%s' (seconds, above 0, at most 86400)", optarg);
			break;
		}
		case 'S': c.stored = 1; break;
		case 'Z': c.stored = -1; break;
		case 'T':
			if ((rv = rl_cli_int32(opt, optarg, 1, 86400000, &c.timeout)) != 0)
				return rv;
			break;
		case 'P':
			if ((rv = rl_cli_int32(opt, optarg, 1, 64, &c.parallel)) != 0)
				return rv;
			break;
		case 'q': c.verbosity = RL_LOG_QUIET; break;
		case 'v': c.verbosity++; break;
		case 'h':
			fputs(usage_text, stdout);
			fputs("\n", stdout);
			fputs(help_text, stdout);
			return rl_io_close_stdout() ? 1 : 0;
		default: return 2; /* getopt_long said what was wrong */
		}
	}
	rl_log_set_level(c.verbosity);
	if ((tls_cert || tls_key || tls_ca || tls_pass || tls_crl) &&
	    (rli_nng_tls_files(tls_cert, tls_key, tls_ca) != 0 || (tls_pass && rli_nng_tls_opt('p', tls_pass) != 0) ||
	     (tls_crl && rli_nng_tls_opt('r', tls_crl) != 0)))
		return 2;
	if (auth_key && rli_auth_set_file(auth_key) != 0)
		return 2;
	if (optind >= argc)
		return rl_cli_usage("missing command (serve, push, pull, status or publish)");
	c.cmd = argv[optind++];
	nargs = argc - optind;
	if (c.rewind && strcmp(c.cmd, "push") != 0)
		return rl_cli_usage("--rewind is an option of push, not of %s", c.cmd);
	if (c.parts && strcmp(c.cmd, "push") != 0)
		return rl_cli_usage("--part is an option of push, not of %s", c.cmd);
	if (c.part_timeout > 0 && strcmp(c.cmd, "serve") != 0)
		return rl_cli_usage("--part-timeout is an option of serve, not of %s", c.cmd);
	if (strcmp(c.cmd, "serve") == 0) {
		if (nargs != 0)
			return rl_cli_usage("serve: unexpected argument '%s'", argv[optind]);
		if (c.listen && strncmp(c.listen, "inproc://", 9) == 0)
			return rl_cli_usage("serve: --listen '%s': inproc:// reaches only the same process; use tcp:// or ipc://",
				     c.listen);
		return cmd_serve(&c);
	}
	if (strcmp(c.cmd, "push") == 0) {
		if (nargs != 2)
			return rl_cli_usage("push: want URL CKPT_DIR");
		if (c.rewind && c.delta)
			return rl_cli_usage("push: --rewind sends the version whole: drop --delta");
		if (c.parts && (c.rewind || !c.version))
			return rl_cli_usage("push --part: %s", c.rewind ? "a rewind goes whole, not in parts" :
					    "give the version the parts belong to: --version N");
		c.url = argv[optind];
		c.ckpt = argv[optind + 1];
		return cmd_push(&c);
	}
	if (strcmp(c.cmd, "pull") == 0) {
		if (nargs != 1)
			return rl_cli_usage("pull: want URL");
		if (c.out == NULL)
			return rl_cli_usage("pull: --out DIR is required");
		if (c.follow && c.version)
			return rl_cli_usage("pull: --follow and --version do not go together");
		c.url = argv[optind];
		return cmd_pull(&c);
	}
	if (strcmp(c.cmd, "status") == 0) {
		if (nargs != 1)
			return rl_cli_usage("status: want URL");
		c.url = argv[optind];
		return cmd_status(&c);
	}
	if (strcmp(c.cmd, "publish") == 0) {
		if (nargs != 2)
			return rl_cli_usage("publish: want DIR CKPT_DIR");
		if (c.version == 0)
			return rl_cli_usage("publish: --version N is required");
		c.dir = argv[optind];
		c.ckpt = argv[optind + 1];
		return cmd_publish(&c);
	}
	return rl_cli_usage("unknown command '%s'", c.cmd);
}

/*
 * serve.c — `rl-queue serve`: parse options into rl_qserve_config and run
 * the broker (lib/queue/qserve.c) until SIGINT or SIGTERM, with the HTTP listener
 * (lib/queue/qhttp.c) beside it when --http is given.
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/auth.h"
#include "base/nngx.h"
#include "base/io.h"
#include "queue/qhttp.h"
#include "queue/qserve.h"
#include "rlq.h"

static const char usage_text[] =
	"usage: rl-queue serve [OPTION]...\n"
	"Run the broker: it keeps the state of every sample, leases work to the\n"
	"stages, bounds staleness and memory, and journals changes.\n"
	"\n"
	"  -l, --listen URL         nng URL to listen on (default tcp://127.0.0.1:7400)\n"
	"  -d, --data-dir DIR       journal every change to DIR/journal and replay it\n"
	"                           at start (default: in memory only)\n"
	"  -k, --max-staleness K    trainer never gets samples older than version v-K;\n"
	"                           prompts leased while in flight <= (K+1) x batch (0)\n"
	"  -k auto[:MAX]            K chosen between 0 and MAX (default 4) from the\n"
	"                           trainer's and generators' idle time and the drift\n"
	"      --auto-hold N        auto: trainer steps between decisions (default 3)\n"
	"      --auto-bubble F      auto: raise K above this idle fraction of the\n"
	"                           bottleneck stage (default 0.05)\n"
	"      --auto-drift LO:HI   auto: raise only below LO, lower above HI, the mean\n"
	"                           |actor/ppo_kl| of the window (default 0.01:0.03)\n"
	"  -b, --train-batch B      groups per trainer step, for the gate: rl-rollout's\n"
	"                           --train-batch, rl-train's --batch (default 8; 0: no gate)\n"
	"      --stale drop|regen   what happens to a stale group (default drop)\n"
	"      --oversample F       over-sampling with early stop: admit (F-1) x batch\n"
	"                           groups more than the gate while fewer than batch are\n"
	"                           complete (F > 1, at most 16; with -k auto only while\n"
	"                           K <= 1 or groups go stale); abort a\n"
	"                           prompt still generating once its group could only be\n"
	"                           trained more than K versions after its lease (all of\n"
	"                           them when (K+1) x batch groups are complete)\n"
	"      --stragglers requeue|drop|continue  what early stop does with a prompt\n"
	"                           still generating: aborted and put back at the head of\n"
	"                           the prompts (default), aborted and dropped, or left to\n"
	"                           its generator (rl-rollout --partial: new weights)\n"
	"  -t, --lease-timeout S    seconds a lease lasts unless renewed (default 60)\n"
	"  -m, --max-bytes SIZE     memory bound on stored records; producers are\n"
	"                           told busy above it (k/M/G suffixes; default 1G)\n"
	"      --max-msg SIZE       largest request accepted (default --max-bytes/64,\n"
	"                           1M to 64M)\n"
	"      --max-conns N        connections at once; bodies being received are\n"
	"                           bounded by N x --max-msg (default --max-bytes /\n"
	"                           --max-msg, at least 64)\n"
	"      --compact-bytes SIZE compact the journal past this size (default 256M)\n"
	"      --recover-journal    start from a journal damaged before its end with the\n"
	"                           changes before the damage (the file is copied first)\n"
	"      --contexts N         requests served at once (default 64)\n"
	"      --http ADDR          serve /metrics (Prometheus), /api/stats (JSON) and\n"
	"                           a live dashboard at / on ADDR (HOST:PORT, :PORT)\n"
	"      --http-public        allow --http on a non-loopback address\n"
	"      --http-max-conns N   --http connections at once; more are answered 503\n"
	"                           and closed (default 64)\n"
	"      --http-timeout S     seconds an --http connection has to send a request\n"
	"                           head, from its start or the last response, and to\n"
	"                           take a response; idle ones close then (default 10)\n"
	"      --listen-public      allow --listen on a non-loopback address without\n"
	"                           TLS client certificates\n"
	"      --tls-cert FILE      tls+tcp://: this server's certificate (PEM)\n"
	"      --tls-key FILE       its private key (PEM)\n"
	"      --tls-ca FILE        require client certificates signed by this CA\n"
	"      --tls-key-pass-file FILE  the first line is the password of an encrypted\n"
	"                           --tls-key (mode 600)\n"
	"      --tls-crl FILE       refuse client certificates this CRL (PEM) revokes\n"
	"      --auth-key-file FILE every request must carry a MAC made with this shared key\n"
	"                           (mode 600; allows a non-loopback --listen)\n"
	"  -q, --quiet              print errors only\n"
	"  -v, --verbose            print more\n"
	"      --config FILE        options from a YAML file (keys: long options)\n"
	"      --version            print the program version and exit\n"
	"  -h, --help               print this help and exit\n"
	"\n"
	"Exit status: 0 stopped by a signal, 1 runtime failure, 2 usage error\n"
	"(a public --http address without --http-public, a public --listen address\n"
	"without --listen-public too), 3 cannot listen on\n"
	"URL or on the --http address.\n";

static volatile sig_atomic_t stop_flag;

static void
on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static int
stats_cb(void *arg, char **json)
{
	return rl_qserve_stats_json(arg, json);
}

enum { OPT_STALE = 256, OPT_MAX_MSG, OPT_MAX_CONNS, OPT_COMPACT, OPT_CONTEXTS, OPT_HTTP, OPT_HTTP_PUBLIC, OPT_HTTP_MAX_CONNS, OPT_HTTP_TIMEOUT, OPT_RECOVER,
       OPT_LISTEN_PUBLIC, OPT_TLS_CERT, OPT_TLS_KEY, OPT_TLS_CA, OPT_TLS_PASS, OPT_TLS_CRL, OPT_AUTH_KEY, OPT_AUTO_HOLD, OPT_AUTO_BUBBLE,
       OPT_AUTO_DRIFT, OPT_OVERSAMPLE, OPT_STRAGGLERS };

/* --max-staleness K or auto[:MAX] */
static int
parse_staleness(const char *arg, rl_qserve_config *cfg)
{
	long long v;
	int rv;

	if (strncmp(arg, "auto", 4) == 0 && (arg[4] == 0 || arg[4] == ':')) {
		v = 4;
		if (arg[4] == ':' && (rv = rl_cli_int('k', arg + 5, 0, 1000000, &v)) != 0)
			return rv;
		cfg->queue.auto_k = 1;
		cfg->queue.auto_kmax = (uint32_t)v;
		cfg->queue.max_staleness = 0;   /* on-policy until measured otherwise */
		cfg->autok.kmax = (uint32_t)v;
		return RL_OK;
	}
	if ((rv = rl_cli_int('k', arg, 0, 1000000, &v)) != 0)
		return rv;
	cfg->queue.auto_k = 0;
	cfg->queue.max_staleness = (uint32_t)v;
	return RL_OK;
}

int
rlq_serve_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "data-dir", required_argument, NULL, 'd' },
		{ "max-staleness", required_argument, NULL, 'k' },
		{ "train-batch", required_argument, NULL, 'b' },
		{ "stale", required_argument, NULL, OPT_STALE },
		{ "lease-timeout", required_argument, NULL, 't' },
		{ "max-bytes", required_argument, NULL, 'm' },
		{ "max-msg", required_argument, NULL, OPT_MAX_MSG },
		{ "max-conns", required_argument, NULL, OPT_MAX_CONNS },
		{ "compact-bytes", required_argument, NULL, OPT_COMPACT },
		{ "contexts", required_argument, NULL, OPT_CONTEXTS },
		{ "http", required_argument, NULL, OPT_HTTP },
		{ "http-public", no_argument, NULL, OPT_HTTP_PUBLIC },
		{ "http-max-conns", required_argument, NULL, OPT_HTTP_MAX_CONNS },
		{ "http-timeout", required_argument, NULL, OPT_HTTP_TIMEOUT },
		{ "listen-public", no_argument, NULL, OPT_LISTEN_PUBLIC },
		{ "tls-cert", required_argument, NULL, OPT_TLS_CERT },
		{ "tls-key", required_argument, NULL, OPT_TLS_KEY },
		{ "tls-ca", required_argument, NULL, OPT_TLS_CA },
		{ "tls-key-pass-file", required_argument, NULL, OPT_TLS_PASS },
		{ "tls-crl", required_argument, NULL, OPT_TLS_CRL },
		{ "auth-key-file", required_argument, NULL, OPT_AUTH_KEY },
		{ "recover-journal", no_argument, NULL, OPT_RECOVER },
		{ "auto-hold", required_argument, NULL, OPT_AUTO_HOLD },
		{ "auto-bubble", required_argument, NULL, OPT_AUTO_BUBBLE },
		{ "auto-drift", required_argument, NULL, OPT_AUTO_DRIFT },
		{ "oversample", required_argument, NULL, OPT_OVERSAMPLE },
		{ "stragglers", required_argument, NULL, OPT_STRAGGLERS },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_qserve_config cfg = { .listen = "tcp://127.0.0.1:7400" };
	const char *http = NULL, *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL, *auth_key = NULL;
	const char *tls_pass = NULL, *tls_crl = NULL;
	rl_qserve *s = NULL;
	rl_qhttp *hs = NULL;
	int http_max_conns = 64;
	double http_timeout = 10;
	int c, rv, http_public = 0, listen_public = 0, verbosity = RL_LOG_NORMAL, auto_opts = 0, straggler_opt = 0;
	long long v;
	uint64_t sz;
	double d;

	rl_queue_config_default(&cfg.queue);
	rl_autok_config_default(&cfg.autok, 4);
	/* rl-rollout's and rl-train's default: without a gate, samples pile up
	 * at old versions and K = 0 drops nearly all of them as stale */
	cfg.queue.train_batch = 8;
	rl_cli_init("rl-queue serve", opts);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	opterr = 0;
	while ((c = rl_cli_getopt(argc, argv, ":l:d:k:b:t:m:qvh", NULL)) != -1) {
		switch (c) {
		case 'l': cfg.listen = optarg; break;
		case 'd': cfg.queue.data_dir = optarg; break;
		case 'k':
			if ((rv = parse_staleness(optarg, &cfg)) != 0)
				return rv;
			break;
		case OPT_AUTO_HOLD:
			if ((rv = rl_cli_int(c, optarg, 1, 1000000, &v)) != 0)
				return rv;
			cfg.autok.hold = (uint32_t)v;
			auto_opts = 1;
			break;
		case OPT_AUTO_BUBBLE:
			if ((rv = rl_cli_double(c, optarg, 0, 1, &cfg.autok.bubble)) != 0)
				return rv;
			auto_opts = 1;
			break;
		case OPT_AUTO_DRIFT: {
			char *end;
			cfg.autok.drift_low = strtod(optarg, &end);
			if (end == optarg || *end != ':' || (cfg.autok.drift_high = strtod(end + 1, &end), *end != 0) ||
			    !(cfg.autok.drift_low >= 0) || !(cfg.autok.drift_high > cfg.autok.drift_low) ||
			    !isfinite(cfg.autok.drift_high))
				return rl_cli_usage("--auto-drift: bad value '%s' (LO:HI, 0 <= LO < HI)", optarg);
			auto_opts = 1;
			break;
		}
		case 'b':
			if ((rv = rl_cli_int(c, optarg, 0, 100000000, &v)) != 0)
				return rv;
			cfg.queue.train_batch = (uint32_t)v;
			break;
		case OPT_STALE:
			if (strcmp(optarg, "drop") == 0) {
				cfg.queue.stale = RL_QSTALE_DROP;
			} else if (strcmp(optarg, "regen") == 0) {
				cfg.queue.stale = RL_QSTALE_REGEN;
			} else {
				return rl_cli_usage("--stale: bad value '%s' (drop or regen)", optarg);
			}
			break;
		case OPT_OVERSAMPLE:
			if ((rv = rl_cli_double(c, optarg, 1, 16, &cfg.queue.oversample)) != 0)
				return rv;
			break;
		case OPT_STRAGGLERS:
			if (strcmp(optarg, "requeue") == 0)
				cfg.queue.stragglers = RL_QSTRAG_REQUEUE;
			else if (strcmp(optarg, "drop") == 0)
				cfg.queue.stragglers = RL_QSTRAG_DROP;
			else if (strcmp(optarg, "continue") == 0)
				cfg.queue.stragglers = RL_QSTRAG_CONTINUE;
			else
				return rl_cli_usage("--stragglers: bad value '%s' (requeue, drop or continue)", optarg);
			straggler_opt = 1;
			break;
		case 't':
			if ((rv = rl_cli_double(c, optarg, 0.001, 86400 * 7, &d)) != 0)
				return rv;
			cfg.queue.lease_ms = (uint32_t)(d * 1000 + 0.5);
			break;
		case 'm':
		case OPT_MAX_MSG:
		case OPT_COMPACT:
			if ((rv = rl_cli_bytes(c, optarg, 1024, 1ULL << 62, &sz)) != 0)
				return rv;
			if (c == 'm')
				cfg.queue.max_bytes = sz;
			else if (c == OPT_MAX_MSG)
				cfg.max_msg = (size_t)RL_MIN(sz, (uint64_t)UINT32_MAX);
			else
				cfg.queue.compact_bytes = sz;
			break;
		case OPT_MAX_CONNS:
			if ((rv = rl_cli_int(c, optarg, 1, 65536, &v)) != 0)
				return rv;
			cfg.max_conns = (int)v;
			break;
		case OPT_CONTEXTS:
			if ((rv = rl_cli_int(c, optarg, 8, 4096, &v)) != 0)
				return rv;
			cfg.nctx = (int)v;
			break;
		case OPT_HTTP: http = optarg; break;
		case OPT_HTTP_PUBLIC: http_public = 1; break;
		case OPT_HTTP_MAX_CONNS:
			if ((rv = rl_cli_int32(c, optarg, 1, 10000, &http_max_conns)) != 0)
				return rv;
			break;
		case OPT_HTTP_TIMEOUT:
			if ((rv = rl_cli_double(c, optarg, 0.05, 86400, &http_timeout)) != 0)
				return rv;
			break;
		case OPT_LISTEN_PUBLIC: listen_public = 1; break;
		case OPT_TLS_CERT: tls_cert = optarg; break;
		case OPT_TLS_KEY: tls_key = optarg; break;
		case OPT_TLS_CA: tls_ca = optarg; break;
		case OPT_TLS_PASS: tls_pass = optarg; break;
		case OPT_TLS_CRL: tls_crl = optarg; break;
		case OPT_AUTH_KEY: auth_key = optarg; break;
		case OPT_RECOVER: cfg.queue.recover = 1; break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':': return rl_cli_usage("serve: option '%s' needs an argument", argv[optind - 1]);
		default: return rl_cli_usage("serve: unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return rl_cli_usage("serve: unexpected argument '%s'", argv[optind]);
	if (auto_opts && !cfg.queue.auto_k)
		return rl_cli_usage("--auto-hold, --auto-bubble and --auto-drift need --max-staleness auto[:MAX]");
	if (straggler_opt && !(cfg.queue.oversample > 1))
		return rl_cli_usage("--stragglers needs --oversample F with F > 1");
	if (cfg.queue.oversample > 1 && cfg.queue.train_batch == 0)
		return rl_cli_usage("--oversample needs the gate: --train-batch above 0");
	rl_log_set_level(verbosity);
	if (cfg.queue.oversample > 1 && cfg.queue.stragglers == RL_QSTRAG_CONTINUE && cfg.queue.max_staleness == 0 &&
	    !cfg.queue.auto_k)
		rl_warn("serve: --stragglers continue with --max-staleness 0: a straggler that finishes after its "
		    "step is older than the next version, and %s", cfg.queue.stale == RL_QSTALE_DROP ? "dropped" :
		    "generated again");
	if (cfg.queue.train_batch == 0)
		rl_warn("serve: --train-batch 0: no admission gate; groups generated more than %u versions "
		    "before the trainer's are %s", cfg.queue.max_staleness,
		    cfg.queue.stale == RL_QSTALE_DROP ? "dropped" : "generated again");
	if ((tls_cert || tls_key || tls_ca || tls_pass || tls_crl) &&
	    (rli_nng_tls_files(tls_cert, tls_key, tls_ca) != 0 || (tls_pass && rli_nng_tls_opt('p', tls_pass) != 0) ||
	     (tls_crl && rli_nng_tls_opt('r', tls_crl) != 0)))
		return 2;
	if (auth_key && rli_auth_set_file(auth_key) != 0)
		return 2;
	/* TLS that checks client certificates, or the shared key, protects the socket */
	if (rli_listen_policy("serve", cfg.listen,
			      rli_auth_key(NULL) || (strncmp(cfg.listen, "tls+", 4) == 0 && rli_nng_tls_authenticates()),
			      listen_public) != 0)
		return 2;
	if (http) {   /* refuse a bad or public address before anything listens */
		char url[300];
		int loop;
		if (rl_qhttp_parse_addr(url, sizeof url, &loop, http) != 0)
			return rl_cli_usage("--http: bad value '%s' (HOST:PORT, [IPV6]:PORT or :PORT)", http);
		if (!loop && !http_public) {
			rl_error("serve: refusing --http on '%s': not a loopback address", http);
			rl_hint("the listener has no authentication; add --http-public to serve beyond this machine");
			return 2;
		}
	}

	rl_stop_signals(on_signal, 0);
	signal(SIGPIPE, SIG_IGN);
	/* past a file size limit (ulimit -f) a journal write fails with EFBIG,
	 * which is answered and logged like a full disk, instead of a silent death */
	signal(SIGXFSZ, SIG_IGN);

	if ((rv = rl_qserve_open(&s, &cfg)) != 0)
		return rv == RL_ENET ? 3 : 1;
	if (http) {
		rl_qhttp_config hc = {
			.addr = http, .allow_public = http_public,
			.stats = stats_cb, .arg = s,
			.max_conns = http_max_conns, .timeout_s = http_timeout,
		};
		if ((rv = rl_qhttp_open(&hs, &hc)) != 0) {
			rl_qserve_close(s);
			return rv == RL_ENET ? 3 : 1;
		}
		rl_info("http on %s (/metrics, /api/stats, /)", rl_qhttp_url(hs));
	}
	rl_info("serving on %s%s%s", cfg.listen, cfg.queue.data_dir ? ", journal in " : "",
	    cfg.queue.data_dir ? cfg.queue.data_dir : "");
	rv = rl_qserve_run(s, &stop_flag);
	rl_qhttp_close(hs);   /* before the broker its handlers read */
	rl_qserve_close(s);
	if (rv != 0) {
		rl_error("serve: stopped: %s", rl_strerror(rv));
		return 1;
	}
	rl_verbose("serve: stopped");
	return 0;
}

/*
 * stat.c — `rl-queue stat URL [--json] [--watch [SECONDS]]`: the broker's
 * state: depth per state, throughput per stage, staleness histogram, lease
 * expiries, drops, and where the broker's time goes; with --watch, again
 * every SECONDS (the screen redrawn on a terminal, one block or JSON line
 * per refresh otherwise) until interrupted or --count refreshes.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "queue/qclient.h"
#include "rlq.h"

static const char usage_text[] =
	"usage: rl-queue stat [OPTION]... URL\n"
	"       rl-queue stat [OPTION]... URL --watch [SECONDS]\n"
	"Print the state of the broker at URL.\n"
	"\n"
	"  -j, --json           print one JSON object (as the broker sends it)\n"
	"  -w, --watch[=S]      print it again every S seconds (default 1) until\n"
	"                       interrupted; a terminal is redrawn in place\n"
	"  -c, --count N        with --watch: stop after N refreshes\n"
	"  -t, --timeout S      wait S seconds for the broker (default 5)\n"
	"  -q, --quiet          print errors only\n"
	"  -v, --verbose        print more\n"
	"      --config FILE    options from a YAML file (keys: long options)\n"
	"      --version        print the program version and exit\n"
	"  -h, --help           print this help and exit\n"
	"\n"
	"Exit status: 0 success, 1 failure, 2 usage error, 3 broker unreachable.\n";

static double
num(const cJSON *o, const char *path)
{
	char key[64];
	const char *dot;

	while ((dot = strchr(path, '.')) != NULL) {
		size_t n = (size_t)(dot - path);
		if (n >= sizeof key)
			return 0;
		memcpy(key, path, n);
		key[n] = 0;
		o = cJSON_GetObjectItemCaseSensitive(o, key);
		path = dot + 1;
	}
	o = cJSON_GetObjectItemCaseSensitive(o, path);
	return cJSON_IsNumber(o) ? o->valuedouble : 0;
}

static const char *
str(const cJSON *o, const char *key)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(e) ? e->valuestring : "?";
}

/* Stage workers' reports: one line per worker, the stage sums, the trainer's last step. */
static void
print_workers(const cJSON *o)
{
	static const char *const stages[] = { "rollout", "reward", "train" };
	const cJSON *ws = cJSON_GetObjectItemCaseSensitive(o, "workers"), *w, *t;
	char k[64];

	if (cJSON_GetArraySize(ws) == 0) {
		printf("workers: none reporting\n");
		return;
	}
	printf("%-8s %-28s %-7s %6s %10s %10s %10s %6s  %s\n", "role", "worker", "state", "busy", "records/s",
	    "tokens/s", "records", "age", "gpu");
	cJSON_ArrayForEach(w, ws) {
		const cJSON *g = cJSON_GetObjectItemCaseSensitive(w, "gpu");
		char gpu[96] = "-";
		if (g)
			snprintf(gpu, sizeof gpu, "%.0f%% %.1f/%.1f GiB", 100 * num(g, "util"), num(g, "mem_used") / 1073741824.0,
			    num(g, "mem_total") / 1073741824.0);
		printf("%-8s %-28s %-7s %5.0f%% %10.1f %10.1f %10.0f %5.0fs  %s\n", str(w, "role"), str(w, "worker"),
		    str(w, "state"), 100 * num(w, "busy_frac"), num(w, "records_per_s"), num(w, "tokens_per_s"),
		    num(w, "records"), num(w, "age_s"), gpu);
	}
	printf("stages:");
	for (size_t i = 0; i < RL_ARRAY_LEN(stages); i++) {
		snprintf(k, sizeof k, "stages.%s.live", stages[i]);
		printf(" %s %.0f live", stages[i], num(o, k));
		snprintf(k, sizeof k, "stages.%s.records_per_s", stages[i]);
		printf(" %.1f records/s;", num(o, k));
	}
	printf("\n");
	if ((t = cJSON_GetObjectItemCaseSensitive(o, "train")) != NULL)
		printf("train: version %.0f  reward %.4g  length %.4g  ppo_kl %.4g  entropy %.4g  step %.2fs\n",
		    num(t, "version"), num(t, "reward_mean"), num(t, "response_length"), num(t, "ppo_kl"),
		    num(t, "entropy"), num(t, "step_s"));
}

static void
print_text(const cJSON *o)
{
	static const char *const states[] = { "prompt", "leased", "generated", "scoring", "scored", "training", "expanded" };
	static const char *const stages[][3] = {
		{ "rollout", "put_prompt", "leased_rollout" },
		{ "reward", "put_generated", "leased_reward" },
		{ "train", "put_scored", "leased_train" },
	};
	const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "staleness"), *e;
	char k[64];
	int i = 0;

	printf("version %.0f  max-staleness %.0f  train-batch %.0f  in flight %.0f/%.0f\n", num(o, "version"),
	    num(o, "max_staleness"), num(o, "train_batch"), num(o, "inflight"), num(o, "inflight_cap"));
	printf("memory %.0f / %.0f bytes  groups %.0f (%.0f ready)  leases %.0f\n", num(o, "bytes"),
	    num(o, "max_bytes"), num(o, "groups"), num(o, "ready_groups"), num(o, "leases"));
	printf("depth:");
	for (size_t s = 0; s < RL_ARRAY_LEN(states); s++) {
		snprintf(k, sizeof k, "depth.%s", states[s]);
		printf(" %s %.0f", states[s], num(o, k));
	}
	printf("\n%-8s %12s %12s %10s %10s\n", "stage", "put", "leased", "put/s", "leased/s");
	for (size_t s = 0; s < RL_ARRAY_LEN(stages); s++) {
		char a[64], b[64], c[64], d[64];
		snprintf(a, sizeof a, "total.%s", stages[s][1]);
		snprintf(b, sizeof b, "total.%s", stages[s][2]);
		snprintf(c, sizeof c, "rate.%s", stages[s][1]);
		snprintf(d, sizeof d, "rate.%s", stages[s][2]);
		printf("%-8s %12.0f %12.0f %10.1f %10.1f\n", stages[s][0], num(o, a), num(o, b), num(o, c), num(o, d));
	}
	printf("done %.0f (%.1f/s)  duplicates %.0f  rejected %.0f  busy %.0f  gate-blocked %.0f\n",
	    num(o, "total.done"), num(o, "rate.done"), num(o, "total.duplicates"), num(o, "total.rejected"),
	    num(o, "total.busy"), num(o, "total.gate_blocked"));
	printf("lease expiries %.0f (%.0f records)  released %.0f  late acks %.0f\n", num(o, "total.expired_leases"),
	    num(o, "total.expired_records"), num(o, "total.released"), num(o, "total.late_acks"));
	printf("stale: dropped %.0f  regenerated %.0f  unversioned %.0f\n", num(o, "total.stale_dropped"),
	    num(o, "total.stale_regenerated"), num(o, "total.unversioned"));
	if (cJSON_GetObjectItemCaseSensitive(o, "oversample"))
		printf("early stop: oversample %.2f  complete groups %.0f  stops %.0f  aborted %.0f (requeued %.0f, "
		    "dropped %.0f with %.0f samples)  late samples refused %.0f\n", num(o, "oversample"),
		    num(o, "complete_groups"), num(o, "total.early_stops"), num(o, "total.aborted"),
		    num(o, "total.abort_requeued"), num(o, "total.abort_dropped"), num(o, "total.abort_dropped_samples"),
		    num(o, "total.abort_late"));
	printf("staleness (v - version of samples trained):");
	cJSON_ArrayForEach(e, h) {
		printf(" %d%s:%.0f", i, i == 8 ? "+" : "", e->valuedouble);
		i++;
	}
	printf("\n");
	if (cJSON_GetObjectItemCaseSensitive(o, "journal"))
		printf("journal %.0f bytes  %.0f syncs  %.0f compactions\n", num(o, "journal.bytes"),
		    num(o, "journal.syncs"), num(o, "journal.compactions"));
	printf("server: %.0f requests (%.0f bad), %.0f waiting; time in state %.3fs, decompress %.3fs, "
	    "compress %.3fs, journal %.3fs, lock wait %.3fs\n", num(o, "server.requests"), num(o, "server.bad_requests"),
	    num(o, "server.waiting"), num(o, "server.state_s"), num(o, "server.decompress_s"),
	    num(o, "server.compress_s"), num(o, "server.journal_s"), num(o, "server.lock_wait_s"));
	print_workers(o);
}

static volatile sig_atomic_t stop_flag;

static void
on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

/* Prints one refresh; returns 0 or an rl_err. */
static int
show(rl_qclient *cl, int js, int tty, int watch)
{
	char *json = NULL;
	cJSON *doc;
	int rv;

	rv = rl_qclient_stats(cl, &json);
	if (watch && tty)
		printf("\033[H\033[2J");
	if (rv != 0) {
		if (watch) {
			if (tty)
				printf("broker unreachable: %s (retrying)\n", rl_strerror(rv));
			rl_error("stat: no stats from the broker: %s", rl_strerror(rv));
			fflush(stdout);
		}
		return rv;
	}
	if (js) {
		printf("%s\n", json);
	} else if ((doc = cJSON_Parse(json)) != NULL) {
		print_text(doc);
		cJSON_Delete(doc);
		if (watch && !tty)
			printf("\n");
	} else {
		rl_error("stat: the broker sent stats that are not JSON");
		rv = RL_EFORMAT;
	}
	free(json);
	fflush(stdout);
	return rv;
}

int
rlq_stat_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "watch", optional_argument, NULL, 'w' },
		{ "count", required_argument, NULL, 'c' },
		{ "timeout", required_argument, NULL, 't' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_qclient_opts o;
	rl_qclient *cl = NULL;
	struct sigaction sa;
	int c, js = 0, rv, verbosity = RL_LOG_NORMAL, watch = 0, tty, closed;
	double d, every = 1, count = 0;
	long done = 0;

	rl_qclient_opts_default(&o);
	o.timeout_ms = 5000;
	rl_cli_init("rl-queue stat", opts);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	opterr = 0;
	while ((c = rl_cli_getopt(argc, argv, ":jw::c:t:qvh", NULL)) != -1) {
		switch (c) {
		case 'j': js = 1; break;
		case 'w':
			watch = 1;
			if (optarg && (rv = rl_cli_double(c, optarg, 0.05, 86400, &every)) != 0)
				return rv;
			break;
		case 'c': {
			long long v;
			if ((rv = rl_cli_int(c, optarg, 1, 1000000000, &v)) != 0)
				return rv;
			count = (double)v;
			break;
		}
		case 't':
			if ((rv = rl_cli_double(c, optarg, 0.001, 86400, &d)) != 0)
				return rv;
			o.timeout_ms = (int)(d * 1000);
			break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':': return rl_cli_usage("stat: option '%s' needs an argument", argv[optind - 1]);
		default: return rl_cli_usage("stat: unknown option '%s'", argv[optind - 1]);
		}
	}
	/* `--watch 2`: getopt leaves the 2 among the operands; a URL is never a
	 * bare number, so a numeric operand beside the URL is the interval */
	if (watch && argc - optind == 2) {
		int k = strspn(argv[optind], "0123456789.") == strlen(argv[optind]) ? optind : optind + 1;
		if ((rv = rl_cli_double('w', argv[k], 0.05, 86400, &every)) != 0)
			return rv;
		if (k == optind)
			argv[optind] = argv[optind + 1];
		argc--;
	}
	if (optind != argc - 1)
		return rl_cli_usage("%s", optind >= argc ? "stat: missing the broker URL" : "stat: too many arguments");
	if (count > 0 && !watch)
		return rl_cli_usage("stat: --count goes with --watch");
	rl_log_set_level(verbosity);
	o.retry_ms = o.timeout_ms;   /* a lost connection is retried within the timeout */
	if ((rv = rl_qclient_open(&cl, argv[optind], &o)) != 0)
		return 1;
	if (!watch) {
		rv = show(cl, js, 0, 0);
		rl_qclient_close(cl);
		if (rl_io_close_stdout() != 0 && rv == 0)
			rv = RL_EIO;
		return rv == 0 ? 0 : rv == RL_ETIMEDOUT || rv == RL_ENET ? 3 : 1;
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	tty = isatty(STDOUT_FILENO);
	while (!stop_flag) {
		double next = rl_now() + every;
		rv = show(cl, js, tty, 1);
		if (rv == RL_EFORMAT || ferror(stdout))
			break;
		if (count > 0 && ++done >= (long)count)
			break;
		while (!stop_flag && rl_now() < next) {
			double left = next - rl_now();
			usleep((useconds_t)(RL_MIN(left, 0.1) * 1e6) + 1);
		}
	}
	rl_qclient_close(cl);
	closed = rl_io_close_stdout();
	if (stop_flag)   /* interrupted: how --watch ends, whatever the last refresh found */
		return closed != 0;
	if (closed != 0 && rv == 0)
		rv = RL_EIO;
	return rv == 0 ? 0 : 1;
}

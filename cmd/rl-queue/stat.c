/*
 * stat.c — `rl-queue stat URL [--json]`: the broker's state: depth per
 * state, throughput per stage, staleness histogram, lease expiries, drops,
 * and where the broker's time goes.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io.h"
#include "qclient.h"
#include "rlq.h"

static const char usage_text[] =
	"usage: rl-queue stat [OPTION]... URL\n"
	"Print the state of the broker at URL.\n"
	"\n"
	"  -j, --json           print one JSON object (as the broker sends it)\n"
	"  -t, --timeout S      wait S seconds for the broker (default 5)\n"
	"  -q, --quiet          print errors only\n"
	"  -v, --verbose        print more\n"
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
}

int
rlq_stat_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_qclient_opts o;
	rl_qclient *cl = NULL;
	char *json = NULL, *end;
	cJSON *doc;
	int c, js = 0, rv, verbosity = RL_LOG_NORMAL;
	double d;

	rl_qclient_opts_default(&o);
	o.timeout_ms = 5000;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":jt:qvh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': js = 1; break;
		case 't':
			d = strtod(optarg, &end);
			if (*optarg == 0 || *end || !(d > 0 && d <= 86400)) {
				rl_error("stat: --timeout wants seconds from 0 to 86400, not '%s'", optarg);
				return 2;
			}
			o.timeout_ms = (int)(d * 1000);
			break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':':
			rl_error("stat: option '%s' needs an argument", argv[optind - 1]);
			fputs(usage_text, stderr);
			return 2;
		default:
			rl_error("stat: unknown option '%s'", argv[optind - 1]);
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		rl_error(optind >= argc ? "stat: missing the broker URL" : "stat: too many arguments");
		fputs(usage_text, stderr);
		return 2;
	}
	rl_log_set_level(verbosity);
	o.retry_ms = o.timeout_ms;   /* a lost connection is retried within the timeout */
	if ((rv = rl_qclient_open(&cl, argv[optind], &o)) != 0)
		return 1;
	rv = rl_qclient_stats(cl, &json);
	rl_qclient_close(cl);
	if (rv != 0)
		return rv == RL_ETIMEDOUT ? 3 : 1;
	if (js) {
		printf("%s\n", json);
	} else if ((doc = cJSON_Parse(json)) != NULL) {
		print_text(doc);
		cJSON_Delete(doc);
	} else {
		rl_error("stat: the broker sent stats that are not JSON");
		rv = RL_EFORMAT;
	}
	free(json);
	if (rl_io_close_stdout() != 0 && rv == 0)
		rv = RL_EIO;
	return rv == 0 ? 0 : 1;
}

/*
 * get.c — `rl-queue get URL --stage S -n N`: lease up to N records of a
 * stage and print them (JSONL, or binary frames as the broker sent them).
 * The lease is kept (the records return to the pool when it expires) unless
 * --ack or --release says otherwise.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "queue/qclient.h"
#include "rlq.h"
#include "stream/traj.h"

static const char usage_text[] =
	"usage: rl-queue get [OPTION]... URL\n"
	"Lease records from the broker at URL and print them.\n"
	"\n"
	"  -s, --stage STAGE      rollout (prompts), reward (generated) or\n"
	"                         train (scored, whole groups); required\n"
	"  -n, --count N          lease up to N records (default 1)\n"
	"  -m, --min N            train: wait for at least N samples (default 1)\n"
	"  -w, --wait S           wait up to S seconds in all for work (default 0)\n"
	"  -t, --lease-timeout S  lease for S seconds (default: the broker's)\n"
	"  -g, --group-size N     rollout: samples that will be made per prompt\n"
	"      --ack              mark the records done after printing them\n"
	"      --release          hand the records back after printing them\n"
	"  -S, --stream           print binary zstd frames instead of JSONL\n"
	"  -q, --quiet            print errors only\n"
	"  -v, --verbose          print more (lease ids)\n"
	"      --config FILE      options from a YAML file (keys: long options)\n"
	"      --version          print the program version and exit\n"
	"  -h, --help             print this help and exit\n"
	"\n"
	"Exit status: 0 success (also when nothing was leased), 1 failure,\n"
	"2 usage error, 3 broker unreachable.\n";

enum { OPT_ACK = 256, OPT_RELEASE };

/* Seconds from 0 to 86400 into milliseconds. */
static int
secs(int c, const char *s, uint32_t *ms)
{
	double d;
	int rv = rl_cli_double(c, s, 0, 86400, &d);

	if (rv == 0)
		*ms = (uint32_t)(d * 1000 + 0.5);
	return rv;
}

int
rlq_get_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "stage", required_argument, NULL, 's' },
		{ "count", required_argument, NULL, 'n' },
		{ "min", required_argument, NULL, 'm' },
		{ "wait", required_argument, NULL, 'w' },
		{ "lease-timeout", required_argument, NULL, 't' },
		{ "group-size", required_argument, NULL, 'g' },
		{ "ack", no_argument, NULL, OPT_ACK },
		{ "release", no_argument, NULL, OPT_RELEASE },
		{ "stream", no_argument, NULL, 'S' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_qlease_req req = { .max_records = 1 };
	rl_traj_writer_opts wo = { .format = RL_TRAJ_JSONL };
	rl_traj_writer *w = NULL;
	rl_qclient_opts o;
	rl_qclient *cl = NULL;
	rl_qlease l, *held = NULL;
	size_t nheld = 0;
	uint32_t want = 1, got = 0;
	double t_end;
	int c, stage = -1, after = -1, rv = RL_OK, verbosity = RL_LOG_NORMAL;

	rl_qclient_opts_default(&o);
	rl_qlease_init(&l);
	rl_cli_init("rl-queue get", opts);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	opterr = 0;
	while ((c = rl_cli_getopt(argc, argv, ":s:n:m:w:t:g:SqvhH", NULL)) != -1) {
		switch (c) {
		case 's':
			if ((stage = rl_qstage_parse(optarg)) < 0)
				return rl_cli_usage("--stage: bad value '%s' (rollout, reward or train)", optarg);
			break;
		case 'n':
		case 'm':
		case 'g': {
			int n;
			if ((rv = rl_cli_int32(c, optarg, 1, 10000000, &n)) != 0)
				return rv;
			*(c == 'n' ? &want : c == 'm' ? &req.min_records : &req.group_hint) = (uint32_t)n;
			break;
		}
		case 'w': if ((rv = secs(c, optarg, &req.wait_ms)) != 0) return rv; break;
		case 't': if ((rv = secs(c, optarg, &req.lease_ms)) != 0) return rv; break;
		case OPT_ACK: after = RL_QACK_DONE; break;
		case OPT_RELEASE: after = RL_QACK_RELEASE; break;
		case 'S': wo.format = RL_TRAJ_BINARY; break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':': return rl_cli_usage("get: option '%s' needs an argument", argv[optind - 1]);
		default: return rl_cli_usage("get: unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1 || stage < 0)
		return rl_cli_usage("%s", optind >= argc ? "get: missing the broker URL" : stage < 0 ?
		    "get: --stage is required" : "get: too many arguments");
	rl_log_set_level(verbosity);
	if (wo.format == RL_TRAJ_BINARY && isatty(STDOUT_FILENO)) {   /* before anything is leased */
		rl_error("get: refusing to write a binary stream to a terminal");
		rl_hint("redirect or pipe standard output, or leave out --stream");
		return 2;
	}
	req.stage = (uint32_t)stage;
	o.retry_ms = 0;
	o.timeout_ms = 5000;
	o.dedup = 0;
	if ((rv = rl_qclient_open(&cl, argv[optind], &o)) != 0)
		return 1;
	if ((rv = rl_traj_writer_open_file(&w, stdout, "<stdout>", &wo)) != 0)
		goto out;
	t_end = rl_now() + req.wait_ms / 1000.0;
	while (got < want) {
		rl_qack_result ar;
		double left = t_end - rl_now();
		req.max_records = want - got;
		req.wait_ms = left > 0 ? (uint32_t)(left * 1000) : 0;   /* --wait bounds the whole get */
		if ((rv = rl_qclient_lease(cl, &req, &l)) != 0 || l.id == 0)
			break;
		got += (uint32_t)rl_qlease_count(&l);
		rl_verbose("get: lease %llu: %zu records, deadline %llu", (unsigned long long)l.id, rl_qlease_count(&l),
		    (unsigned long long)l.deadline_ms);
		if ((rv = rl_traj_writer_put_batch(w, l.batch)) == 0)
			rv = rl_traj_writer_flush(w);
		/* --release hands the leases back at the end: released at once, the
		 * same records would come again in the next round of this loop */
		if (after == RL_QACK_RELEASE) {
			rl_qlease *nh = realloc(held, (nheld + 1) * sizeof *held);
			if (nh == NULL) {
				rl_error("get: out of memory");
				rv = RL_ENOMEM;
				break;
			}
			held = nh;
			held[nheld++] = l;
			rl_qlease_init(&l);   /* the next lease gets a batch of its own */
		}
		if (rv != 0)
			break;
		if (after == RL_QACK_DONE && (rv = rl_qclient_ack(cl, &l, &ar)) != 0)
			break;
	}
	for (size_t i = 0; i < nheld; i++) {
		rl_qack_result ar;
		int rv2 = rl_qclient_release(cl, &held[i], &ar);
		if (rv2 != 0 && rv == 0)
			rv = rv2;
		rl_qlease_fini(&held[i]);
	}
	free(held);
	rl_verbose("get: %u records", got);
out:
	if (rl_traj_writer_close(w) != 0 && rv == 0)
		rv = RL_EIO;
	rl_qlease_fini(&l);
	rl_qclient_close(cl);
	if (rl_io_close_stdout() != 0 && rv == 0)
		rv = RL_EIO;
	if (rv == RL_ETIMEDOUT || rv == RL_ENET) /* unreachable, or gone mid-request */
		return 3;
	return rv == 0 ? 0 : 1;
}

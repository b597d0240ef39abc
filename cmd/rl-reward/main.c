/*
 * rl-reward — scores trajectories: reads records (binary stream or JSONL),
 * sets `reward` and meta.scores from the built-in verifiers and/or user
 * reward programs (--exec), writes the records in input order.
 * `rl-reward gen-arith` writes prompts for the synthetic arith task.
 *
 * This file parses options and maps errors to exit codes; the work is in
 * lib/reward/ (the verifiers, the scorer and its stream and queue loops,
 * reward_exec.c's coprocesses, synth.c's arith prompts).  A usage error is
 * base/cli.h's: its message and hint on stderr, exit status 2.
 */
#include "base/auth.h"
#include "base/nngx.h"
#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "queue/qclient.h"
#include "queue/wstat.h"
#include "reward/reward.h"
#include "reward/reward_exec.h"
#include "reward/synth.h"
#include "rollout/rmscore.h"
#include "stream/traj.h"

#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
	"usage: rl-reward [options] --task NAME[:WEIGHT] ... [FILE|-]...\n"
	"       rl-reward [options] --exec 'CMD ARGS' [FILE|-]...\n"
	"       rl-reward [options] --model RM_DIR [--task ...] [FILE|-]...\n"
	"       rl-reward [options] --queue URL (--task ... | --exec ... | --model ...)\n"
	"       rl-reward gen-arith [--n N] [--seed S] [--digits D] [--ops OPS] [--split all|train|test]\n"
	"                           [--reverse] [-o FILE]\n"
	"Scores trajectory records (binary stream or JSONL, detected) and writes them with\n"
	"`reward` and meta.scores set.\n"
	"\n"
	"  -t, --task SPEC          add a reward component (repeatable):\n"
	"                             gsm8k, math, dapo, countdown, exact, arith, length  NAME[:WEIGHT]\n"
	"                             auto: gsm8k/math/dapo/countdown/arith by meta.task or data_source\n"
	"                             regex[:WEIGHT]:PATTERN   first group of PATTERN equals meta.answer\n"
	"                             format[:WEIGHT]:PATTERN  1 when PATTERN matches the response\n"
	"  -e, --exec 'CMD ARGS'    user reward program (coprocess, argv without a shell): one JSONL\n"
	"                           record in per line, one reply out: a number or {\"reward\": x}\n"
	"      --exec-weight W      weight of the --exec component (default 1)\n"
	"      --judge URL          an LLM judge: an OpenAI-compatible API (http://HOST:PORT/v1), asked\n"
	"                           per record with --judge-template; its verdict is the score\n"
	"      --judge-template F   Jinja template of the judge's prompt (prompt, response,\n"
	"                           ground_truth, meta)\n"
	"      --judge-model NAME   the request's model (default: the first of URL/models)\n"
	"      --judge-pattern RE   the verdict: RE's first group, as a number (default: the last\n"
	"                           number of the reply)\n"
	"      --judge-weight W     weight of the --judge component (default 1)\n"
	"      --judge-timeout SEC  per request (default 60)\n"
	"      --judge-jobs N       requests in flight (default 8)\n"
	"      --judge-max-tokens N the judge's reply at most (default 512)\n"
	"      --judge-key-file F   an API key sent as Authorization: Bearer (a file of mode 600)\n"
	"  -m, --model DIR          a reward model (...ForSequenceClassification): its score of the\n"
	"                           record's prompt + response ids, meta.scores.model\n"
	"      --model-weight W     weight of the --model component (default 1)\n"
	"      --rm-norm MODE       none (default), batch (standardised over each round) or running\n"
	"                           (over every score so far)\n"
	"      --device DEV         where --model runs: cpu (default) or cuda\n"
	"      --rm-max-tokens N    --model: padded tokens per forward (default 8192, at least the\n"
	"                           model's context)\n"
	"  -j, --jobs N             --exec workers (default 1)\n"
	"      --timeout SEC        per-record --exec timeout (default 30)\n"
	"      --batch N            records per scoring round with --exec (default 64 x jobs) or\n"
	"                           --model (default 256)\n"
	"                           or per lease with --queue (default 256)\n"
	"      --auth-key-file F   the broker's shared key (a file of mode 600)\n"
	"      --tls-cert F, --tls-key F, --tls-ca F  for a tls+tcp:// --queue URL: this client's\n"
	"                           certificate and key, the CA of the broker's (PEM)\n"
	"      --tls-key-pass-file F  the password of an encrypted --tls-key (first line; mode 600)\n"
	"      --tls-crl F          refuse a broker certificate this CRL (PEM) revokes\n"
	"      --queue URL          lease generated records from rl-queue at URL, put them back\n"
	"                           scored; runs until SIGINT/SIGTERM\n"
	"      --idle-exit SEC      with --queue: exit after SEC seconds with nothing to score\n"
	"      --broker-timeout SEC with --queue: exit 1 after SEC seconds without a reply from the\n"
	"                           broker (default 300; 0: wait for ever)\n"
	"      --gsm8k-mode MODE    strict (number after the last ####, default) or flexible (last number)\n"
	"      --max-length N       length task: budget in tokens (or characters)\n"
	"      --length-unit UNIT   tokens (default; characters when a record has no tokens) or chars\n"
	"      --overlong-buffer N  DAPO's soft overlong penalty (verl's overlong_buffer.len): add\n"
	"                           min(-(len - (max - N)) / N * F, 0) to the reward, len the response tokens\n"
	"      --overlong-penalty F its factor (verl's penalty_factor; default 1)\n"
	"      --max-response-len M the budget max (default: each record's max_tokens)\n"
	"  -o, --output FILE        write here instead of stdout\n"
	"      --jsonl              write JSONL instead of the binary stream\n"
	"  -q, --quiet              no summary\n"
	"  -v, --verbose            say why each failed record failed\n"
	"      --config FILE        options from a YAML file (keys: long options)\n"
	"      --version            print the program version and exit\n"
	"  -h, --help               this text\n"
	"See rl-reward(1) for the exact rule of each task.\n";

/* ---- gen-arith -------------------------------------------------------------------- */

static int
gen_arith(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "n", required_argument, 0, 'n' },      { "seed", required_argument, 0, 's' },
		{ "digits", required_argument, 0, 'd' }, { "ops", required_argument, 0, 'p' },
		{ "split", required_argument, 0, 'S' },  { "reverse", no_argument, 0, 'r' },
		{ "output", required_argument, 0, 'o' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	rl_synth_arith o;
	long long n = 1000;
	const char *out = "-";
	FILE *f = stdout;
	int c, rv;
	static char prog[] = "rl-reward: gen-arith";

	rl_synth_arith_init(&o);
	rl_cli_init("rl-reward gen-arith", lo);
	argv[0] = prog;   /* getopt's own messages: "rl-reward: gen-arith: unrecognized option ..." */
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	optind = 1;
	while ((c = rl_cli_getopt(argc, argv, "n:s:d:p:S:ro:h", NULL)) != -1) {
		switch (c) {
		case 'n':
			if ((rv = rl_cli_int(c, optarg, 0, LONG_MAX, &n)) != 0)
				return rv;
			break;
		case 's':
			if ((rv = rl_cli_u64(c, optarg, &o.seed)) != 0)
				return rv;
			break;
		case 'd':
			if ((rv = rl_cli_int32(c, optarg, 1, 9, &o.digits)) != 0)
				return rv;
			break;
		case 'p':
			if (strlen(optarg) == 0 || strlen(optarg) >= sizeof o.ops || strspn(optarg, "+-*") != strlen(optarg))
				return rl_cli_usage("--ops: bad value '%s' (some of the operators + - *)", optarg);
			strcpy(o.ops, optarg);
			break;
		case 'S':
			if (strcmp(optarg, "all") == 0)
				o.split = RL_SPLIT_ALL;
			else if (strcmp(optarg, "train") == 0)
				o.split = RL_SPLIT_TRAIN;
			else if (strcmp(optarg, "test") == 0)
				o.split = RL_SPLIT_TEST;
			else
				return rl_cli_usage("--split: bad value '%s' (all, train or test)", optarg);
			break;
		case 'r': o.reverse = 1; break;
		case 'o': out = optarg; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		default: fputs("rl-reward: hint: rl-reward gen-arith --help lists the options\n", stderr); return 2;
		}
	}
	if (optind < argc)
		return rl_cli_usage("gen-arith: unexpected argument '%s'", argv[optind]);
	if (strcmp(out, "-") != 0 && rl_io_fopen(&f, out, "w") != 0)
		return 1;
	rv = rl_synth_arith_write(f, &o, (uint64_t)n);
	if (f != stdout) {
		if (rl_io_fclose(f, out) != 0)
			rv = RL_EIO;
	} else if (rl_io_close_stdout() != 0) {
		rv = RL_EIO;
	}
	return rv ? 1 : 0;
}

/* ---- scoring ---------------------------------------------------------------------- */

/* --judge's options together: a usage error (2) or 0. */
static int
judge_opts_check(const rl_reward_judge_opts *jo, const char *tmpl, const char *key)
{
	struct stat st;

	if (!jo->url)
		return jo->model || jo->pattern || tmpl || key ? rl_cli_usage("--judge-* options need --judge URL") : 0;
	if (!tmpl)
		return rl_cli_usage("--judge needs --judge-template FILE (the judge's prompt)");
	if (strncmp(jo->url, "https://", 8) == 0)
		return rl_cli_usage("--judge '%s': https is not supported; reach the server over http (a local "
		    "proxy or an SSH tunnel)", jo->url);
	if (strncmp(jo->url, "http://", 7) != 0 && stat(jo->url, &st) == 0 && S_ISDIR(st.st_mode))
		return rl_cli_usage("--judge '%s' is a model directory: rl-reward asks a judge over HTTP; serve it "
		    "with rl-rollout serve -m %s and give its URL (http://127.0.0.1:PORT/v1)", jo->url, jo->url);
	if (strncmp(jo->url, "http://", 7) != 0)
		return rl_cli_usage("--judge '%s': want the http:// URL of an OpenAI-compatible API", jo->url);
	return 0;
}

/* The key in file path (its first line) into *out. */
static int
read_key(const char *path, char **out)
{
	size_t n;

	if (rl_io_read_file(path, 4096, out, &n) != 0)
		return -1;
	(*out)[strcspn(*out, "\r\n")] = 0;
	if ((*out)[0] == 0) {
		rl_error("--judge-key-file '%s': empty", path);
		return -1;
	}
	return 0;
}

static volatile sig_atomic_t stop_flag;

static void
on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

int
main(int argc, char **argv)
{
	enum { O_EXEC_WEIGHT = 256, O_TIMEOUT, O_BATCH, O_GSM8K_MODE, O_MAX_LENGTH, O_LENGTH_UNIT, O_JSONL,
	       O_QUEUE, O_IDLE_EXIT, O_BROKER_TIMEOUT, O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_TLS_PASS, O_TLS_CRL, O_AUTH_KEY,
	       O_OVERLONG_BUFFER, O_OVERLONG_PENALTY, O_MAX_RESPONSE_LEN, O_JUDGE, O_JTMPL, O_JMODEL, O_JPAT,
	       O_JWEIGHT, O_JTIMEOUT, O_JJOBS, O_JMAXTOK, O_JKEY, O_MODEL_WEIGHT, O_RM_NORM, O_DEVICE,
	       O_RM_MAX_TOKENS };
	static const struct option lo[] = {
		{ "task", required_argument, 0, 't' },
		{ "exec", required_argument, 0, 'e' },
		{ "exec-weight", required_argument, 0, O_EXEC_WEIGHT },
		{ "judge", required_argument, 0, O_JUDGE }, { "judge-template", required_argument, 0, O_JTMPL },
		{ "judge-model", required_argument, 0, O_JMODEL }, { "judge-pattern", required_argument, 0, O_JPAT },
		{ "judge-weight", required_argument, 0, O_JWEIGHT }, { "judge-timeout", required_argument, 0, O_JTIMEOUT },
		{ "judge-jobs", required_argument, 0, O_JJOBS }, { "judge-max-tokens", required_argument, 0, O_JMAXTOK },
		{ "judge-key-file", required_argument, 0, O_JKEY },
		{ "model", required_argument, 0, 'm' },
		{ "model-weight", required_argument, 0, O_MODEL_WEIGHT },
		{ "rm-norm", required_argument, 0, O_RM_NORM },
		{ "device", required_argument, 0, O_DEVICE },
		{ "rm-max-tokens", required_argument, 0, O_RM_MAX_TOKENS },
		{ "jobs", required_argument, 0, 'j' },
		{ "timeout", required_argument, 0, O_TIMEOUT },
		{ "batch", required_argument, 0, O_BATCH },
		{ "gsm8k-mode", required_argument, 0, O_GSM8K_MODE },
		{ "max-length", required_argument, 0, O_MAX_LENGTH },
		{ "length-unit", required_argument, 0, O_LENGTH_UNIT },
		{ "overlong-buffer", required_argument, 0, O_OVERLONG_BUFFER },
		{ "overlong-penalty", required_argument, 0, O_OVERLONG_PENALTY },
		{ "max-response-len", required_argument, 0, O_MAX_RESPONSE_LEN },
		{ "output", required_argument, 0, 'o' },
		{ "jsonl", no_argument, 0, O_JSONL },
		{ "queue", required_argument, 0, O_QUEUE },
		{ "tls-cert", required_argument, 0, O_TLS_CERT },
		{ "tls-key", required_argument, 0, O_TLS_KEY },
		{ "tls-ca", required_argument, 0, O_TLS_CA },
		{ "tls-key-pass-file", required_argument, 0, O_TLS_PASS },
		{ "tls-crl", required_argument, 0, O_TLS_CRL },
	{ "auth-key-file", required_argument, 0, O_AUTH_KEY },
		{ "idle-exit", required_argument, 0, O_IDLE_EXIT },
		{ "broker-timeout", required_argument, 0, O_BROKER_TIMEOUT },
		{ "quiet", no_argument, 0, 'q' },
		{ "verbose", no_argument, 0, 'v' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	rl_reward_task tasks[RL_REWARD_MAX_TASKS];
	rl_reward_scorer sc;
	rl_reward_exec_opts xo;
	rl_reward_judge_opts jo;
	const char *jtmpl = NULL, *jkey = NULL;
	char *jtext = NULL, *jkeytext = NULL;
	rl_traj_writer_opts wo = { 0 };
	rl_traj_writer *w = NULL;
	rl_rmscore_opts rmo = { 0 };
	rl_rmscore *rm = NULL;
	const char *exec_cmd = NULL, *out = NULL, *queue_url = NULL;
	double idle_exit = 0, broker_timeout = RL_QCLIENT_BROKER_TIMEOUT_S;
	FILE *of = NULL;
	size_t ntasks = 0;
	long long batch = 0, v;
	int c, rv = 0, verbosity = RL_LOG_NORMAL, status = 0, has_length = 0, has_overlong_opt = 0;
	double t0;

	rl_log_init("rl-reward", RL_LOG_NORMAL);
	if (rl_cli_wants_version(argc, argv))
		return rl_cli_print_version();
	if (argc > 1 && strcmp(argv[1], "gen-arith") == 0)
		return gen_arith(argc - 1, argv + 1);
	static const char *const lists[] = { "task", NULL };
	rl_cli_init("rl-reward", lo);
	rl_cli_repeatable(lists);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;

	memset(&sc, 0, sizeof sc);
	sc.exec_weight = 1.0;
	sc.model_weight = 1.0;
	sc.opts.gsm8k_mode = RL_GSM8K_STRICT;
	sc.opts.overlong_penalty = 1.0;
	rl_reward_exec_opts_default(&xo);
	rl_reward_judge_opts_default(&jo);
	sc.judge_weight = 1.0;
	wo.format = RL_TRAJ_BINARY;
	while ((c = rl_cli_getopt(argc, argv, "t:e:m:j:o:qvh", NULL)) != -1) {
		switch (c) {
		case 't':
			if (ntasks == RL_REWARD_MAX_TASKS) {
				rv = rl_cli_usage("at most %d tasks", RL_REWARD_MAX_TASKS);
				goto usage;
			}
			if (rl_reward_task_parse(&tasks[ntasks], optarg, tasks, ntasks) != 0) {
				fputs("rl-reward: hint: rl-reward --help lists the options\n", stderr);
				rv = 2;
				goto usage;
			}
			has_length |= tasks[ntasks].kind == RL_TASK_LENGTH;
			ntasks++;
			break;
		case 'e': exec_cmd = optarg; break;
		case O_EXEC_WEIGHT: rv = rl_cli_double(c, optarg, -1e300, DBL_MAX, &sc.exec_weight); break;
		case O_JUDGE: jo.url = optarg; break;
		case O_JTMPL: jtmpl = optarg; break;
		case O_JMODEL: jo.model = optarg; break;
		case O_JPAT: jo.pattern = optarg; break;
		case O_JWEIGHT: rv = rl_cli_double(c, optarg, -1e300, DBL_MAX, &sc.judge_weight); break;
		case O_JTIMEOUT:
			if ((rv = rl_cli_double(c, optarg, 0, 1e6, &jo.timeout_s)) == 0 && jo.timeout_s <= 0)
				rv = rl_cli_usage("--judge-timeout: bad value '%s' (a number above 0)", optarg);
			break;
		case O_JJOBS: rv = rl_cli_int32(c, optarg, 1, 1024, &jo.jobs); break;
		case O_JMAXTOK: rv = rl_cli_int32(c, optarg, 1, 1 << 20, &jo.max_tokens); break;
		case O_JKEY: jkey = optarg; break;
		case 'm': rmo.model_dir = optarg; break;
		case O_MODEL_WEIGHT: rv = rl_cli_double(c, optarg, -1e300, DBL_MAX, &sc.model_weight); break;
		case O_DEVICE: rmo.device = optarg; break;
		case O_RM_MAX_TOKENS: rv = rl_cli_int32(c, optarg, 1, 1 << 24, &rmo.max_tokens); break;
		case O_RM_NORM:
			rmo.norm = strcmp(optarg, "none") == 0 ? RL_RM_NORM_NONE : strcmp(optarg, "batch") == 0 ?
			    RL_RM_NORM_BATCH : strcmp(optarg, "running") == 0 ? RL_RM_NORM_RUNNING : -1;
			if (rmo.norm < 0)
				rv = rl_cli_usage("--rm-norm: bad value '%s' (none, batch or running)", optarg);
			break;
		case 'j': rv = rl_cli_int32(c, optarg, 1, 1024, &xo.workers); break;
		case O_TIMEOUT:
			if ((rv = rl_cli_double(c, optarg, 0, DBL_MAX, &xo.timeout_s)) == 0 && xo.timeout_s <= 0)
				rv = rl_cli_usage("--timeout: bad value '%s' (a number above 0)", optarg);
			break;
		case O_BATCH: rv = rl_cli_int(c, optarg, 1, 1 << 20, &batch); break;
		case O_GSM8K_MODE:
			if (strcmp(optarg, "strict") == 0)
				sc.opts.gsm8k_mode = RL_GSM8K_STRICT;
			else if (strcmp(optarg, "flexible") == 0)
				sc.opts.gsm8k_mode = RL_GSM8K_FLEXIBLE;
			else
				rv = rl_cli_usage("--gsm8k-mode: bad value '%s' (strict or flexible)", optarg);
			break;
		case O_MAX_LENGTH:
			if ((rv = rl_cli_int(c, optarg, 1, LONG_MAX, &v)) == 0)
				sc.opts.max_length = (long)v;
			break;
		case O_LENGTH_UNIT:
			if (strcmp(optarg, "tokens") == 0)
				sc.opts.length_chars = 0;
			else if (strcmp(optarg, "chars") == 0)
				sc.opts.length_chars = 1;
			else
				rv = rl_cli_usage("--length-unit: bad value '%s' (tokens or chars)", optarg);
			break;
		case O_OVERLONG_BUFFER:
			if ((rv = rl_cli_int(c, optarg, 1, INT32_MAX, &v)) == 0)
				sc.opts.overlong_buffer = (long)v;
			break;
		case O_OVERLONG_PENALTY:
			rv = rl_cli_double(c, optarg, 0, 1e30, &sc.opts.overlong_penalty);
			has_overlong_opt = 1;
			break;
		case O_MAX_RESPONSE_LEN:
			if ((rv = rl_cli_int(c, optarg, 1, INT32_MAX, &v)) == 0)
				sc.opts.max_resp_len = (long)v;
			has_overlong_opt = 1;
			break;
		case 'o': out = optarg; break;
		case O_JSONL: wo.format = RL_TRAJ_JSONL; break;
		case O_QUEUE: queue_url = optarg; break;
		case O_TLS_CERT: rli_nng_tls_opt('c', optarg); break;
		case O_TLS_KEY: rli_nng_tls_opt('k', optarg); break;
		case O_TLS_CA: rli_nng_tls_opt('a', optarg); break;
		case O_TLS_PASS: rli_nng_tls_opt('p', optarg); break;
		case O_TLS_CRL: rli_nng_tls_opt('r', optarg); break;
		case O_AUTH_KEY: rv = rli_auth_set_file(optarg) != 0 ? 2 : 0; break;
		case O_IDLE_EXIT: rv = rl_cli_double(c, optarg, 0, DBL_MAX, &idle_exit); break;
		case O_BROKER_TIMEOUT: rv = rl_cli_double(c, optarg, 0, DBL_MAX, &broker_timeout); break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity = RL_LOG_VERBOSE; break;
		case 'h': fputs(usage_text, stdout); status = rl_io_close_stdout() ? 1 : 0; goto done;
		default: fputs("rl-reward: hint: rl-reward --help lists the options\n", stderr); rv = 2; break;
		}
		if (rv != 0)
			goto usage;
	}
	rl_log_set_level(verbosity);
	if (ntasks == 0 && !exec_cmd && !jo.url && !rmo.model_dir)
		rv = rl_cli_usage("nothing to score with: give --task NAME, --exec 'CMD', --judge URL or --model DIR");
	else if (!rmo.model_dir && (rmo.norm || rmo.device || rmo.max_tokens))
		rv = rl_cli_usage("--rm-norm, --rm-max-tokens and --device are options of --model DIR");
	else if ((rv = judge_opts_check(&jo, jtmpl, jkey)) != 0)
		;
	else if (has_length && sc.opts.max_length <= 0)
		rv = rl_cli_usage("the length task needs --max-length N");
	else if (has_overlong_opt && sc.opts.overlong_buffer <= 0)
		rv = rl_cli_usage("--overlong-penalty and --max-response-len need --overlong-buffer N");
	else if (sc.opts.max_resp_len > 0 && sc.opts.max_resp_len < sc.opts.overlong_buffer)
		rv = rl_cli_usage("--max-response-len %ld is shorter than --overlong-buffer %ld",
				  sc.opts.max_resp_len, sc.opts.overlong_buffer);
	else if (queue_url && (optind < argc || out || wo.format == RL_TRAJ_JSONL))
		rv = rl_cli_usage("--queue reads from and writes to the broker: no FILE, -o or --jsonl");
	if (rv != 0)
		goto usage;
	if (out && strcmp(out, "-") == 0)
		out = NULL;
	if (!queue_url && !out && wo.format == RL_TRAJ_BINARY && isatty(STDOUT_FILENO)) {
		rl_error("refusing to write a binary stream to a terminal");
		rl_hint("add --jsonl, -o FILE, or pipe into rl-train / rl-queue cat");
		return 2;
	}
	sc.tasks = tasks;
	sc.ntasks = ntasks;

	if (jo.url) {
		size_t n;
		if (rl_io_read_file(jtmpl, 1 << 20, &jtext, &n) != 0 || (jkey && read_key(jkey, &jkeytext) != 0)) {
			status = 1;
			goto out;
		}
		jo.tmpl = jtext;
		jo.tmpl_name = jtmpl;
		jo.api_key = jkeytext;
		if ((rv = rl_reward_judge_create(&sc.judge, &jo)) != 0) {
			/* a bad template or pattern is the command line's; a judge that
			 * cannot be asked for its model is not */
			status = rv == RL_EINVAL || rv == RL_EFORMAT ? 2 : 1;
			goto out;
		}
		if (batch == 0)
			batch = 8L * jo.jobs;
	}

	if (exec_cmd) {
		if ((rv = rl_reward_exec_create(&sc.exec, exec_cmd, &xo)) != 0) {
			status = rv == RL_EINVAL ? 2 : 1;   /* an empty --exec, an unclosed quote: usage */
			goto out;
		}
		if (batch == 0)
			batch = 64L * xo.workers;
	}
	if (rmo.model_dir) {
		if ((rv = rl_rmscore_open(&rm, &rmo)) != 0) {
			status = 1;
			goto out;
		}
		sc.model_fn = rl_rmscore_fn;
		sc.model_ctx = rm;
		if (batch == 0)
			batch = 256;
	} else if (!exec_cmd && !queue_url && !jo.url) {
		if (batch != 0)
			rl_warn("--batch applies to --exec, --judge, --model and --queue only: ignored (built-in "
			    "tasks score record by record)");
		batch = 1;
	}
	if (queue_url) {
		rl_qclient *qc = NULL;
		rl_qclient_opts qco;
		/* with --exec, rounds of 4 records per worker, so a long lease can be
		 * extended between them */
		rl_reward_queue_opts qo = { .batch = (uint32_t)batch, .wait_ms = 500, .idle_exit_s = idle_exit,
					    .chunk = exec_cmd ? 4u * (uint32_t)xo.workers : 0 };
		rl_stop_signals(on_signal, 0);
		rl_qclient_opts_stage(&qco, broker_timeout);
		if ((rv = rl_qclient_open(&qc, queue_url, &qco)) == 0)
			rl_qclient_set_stop(qc, &stop_flag);
		if (rv != 0) {
			status = 1;
			goto out;
		}
		t0 = rl_now();
		if (rl_wstat_open(&qo.stats, queue_url, "reward", "cpu") != 0)
			rl_warn("no stats reports to the broker");
		rv = rl_reward_queue(&sc, qc, &qo, &stop_flag);
		rl_wstat_close(qo.stats);
		rl_qclient_close(qc);
		if (rv != 0)
			status = 1;
		rl_reward_stats_print(&sc, rl_now() - t0);
		goto out;
	}
	for (int i = optind; out && i < argc; i++) {
		if (rl_io_same_file(argv[i], out)) {
			rl_error("-o '%s' is the input '%s': writing it would empty it before it is read", out, argv[i]);
			rl_hint("write to another file, then rename it");
			return 2;
		}
	}
	if (out) {
		if (rl_io_fopen(&of, out, "wb") != 0) {
			status = 1;
			goto out;
		}
	}
	if (!of)
		rl_io_watch_stdout(); /* blocked reading, it must stop when the stage after it has */
	if ((rv = rl_traj_writer_open_file(&w, of ? of : stdout, out ? out : "<stdout>", &wo)) != 0) {
		status = 1;
		goto out;
	}

	t0 = rl_now();
	for (int i = optind; i == optind || i < argc; i++) {
		const char *path = i < argc ? argv[i] : "-";
		FILE *f = stdin;
		rl_traj_reader *r = NULL;

		if (strcmp(path, "-") != 0 && rl_io_fopen(&f, path, "rb") != 0) {
			status = 1;
			break;
		}
		rv = rl_traj_reader_open_file(&r, f, path, NULL);
		if (rv == 0)
			rv = rl_reward_stream(&sc, r, w, (size_t)batch);
		rl_traj_reader_close(r);
		if (f != stdin)
			fclose(f);
		if (rv != 0) {
			/* the reader or writer logged where; what was scored is written */
			status = 1;
			break;
		}
	}
	if (rl_traj_writer_close(w) != 0)
		status = 1;
	w = NULL;
	rl_reward_stats_print(&sc, rl_now() - t0);
out:
	rl_traj_writer_close(w);
	rl_reward_exec_destroy(sc.exec);
	rl_reward_judge_destroy(sc.judge);
	free(jtext);
	free(jkeytext);
	if (rm != NULL) {
		size_t nr, nt;
		double sec;
		rl_rmscore_stats(rm, &nr, &nt, &sec);
		rl_verbose("model: %zu records, %zu tokens in %.3f s of forwards (%.0f tokens/s)", nr, nt, sec,
		    sec > 0 ? (double)nt / sec : 0.0);
		rl_rmscore_close(rm);
	}
	if (of && rl_io_fclose(of, out) != 0)
		status = 1;
	if (!of && !queue_url) {
		if (status != 0)
			fclose(stdout); /* a failed write is reported already */
		else if (rl_io_close_stdout() != 0)
			status = 1;
	}
done:
	for (size_t i = 0; i < ntasks; i++)
		rl_reward_task_fini(&tasks[i]);
	return status;
usage:
	status = rv;
	goto done;
}

/*
 * cat.c — `rl-queue cat [FILE|-]...`: read trajectory streams (binary or
 * JSONL, detected per file) and write their records as JSONL, or with
 * --stream as binary zstd frames.  Binary frames pass through to --stream
 * output without recompression.  With -o the output file appears only when
 * everything succeeded (temp file + rename).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "rlq.h"
#include "stream/traj.h"

static const char usage_text[] =
	"usage: rl-queue cat [OPTION]... [FILE|-]...\n"
	"Print the records of trajectory streams (binary or JSONL) as JSONL, or\n"
	"convert them to the binary form.  No FILE, or -, reads standard input.\n"
	"\n"
	"  -s, --stream         write binary zstd frames instead of JSONL\n"
	"  -j, --jsonl          write JSONL (the default)\n"
	"  -o, --output FILE    write to FILE (replaced only on success)\n"
	"  -b, --batch N        records per frame when --stream encodes JSONL\n"
	"                       (default 256; binary frames pass through whole)\n"
	"  -l, --level N        zstd level with --stream (default 1)\n"
	"      --max-frame SIZE refuse frames that decompress to more than SIZE\n"
	"                       bytes (k/M/G suffixes; default 256M)\n"
	"      --max-record SIZE refuse records larger than SIZE (default 64M)\n"
	"  -q, --quiet          print errors only\n"
	"  -v, --verbose        print more\n"
	"      --config FILE    options from a YAML file (keys: long options)\n"
	"      --version        print the program version and exit\n"
	"  -h, --help           print this help and exit\n"
	"\n"
	"Exit status: 0 success, 1 bad input or I/O error, 2 usage error.\n"
	"See rl-trajectory(5).\n";

enum { OPT_MAX_FRAME = 256, OPT_MAX_RECORD };

static int
cat_one(rl_traj_writer *w, const char *path, const rl_traj_limits *lim, unsigned long long *nrec)
{
	rl_traj_reader *r = NULL;
	rl_traj *t = NULL;
	FILE *f = NULL;
	int rv;

	if ((rv = rl_io_fopen(&f, path, "rb")) != 0)
		return rv;
	if ((rv = rl_traj_create(&t)) != 0)
		goto out;
	if ((rv = rl_traj_reader_open_file(&r, f, path, lim)) != 0)
		goto out;
	for (;;) {
		rl_traj_batch *b;
		if ((rv = rl_traj_reader_next_batch(r, &b)) != 0 || b == NULL)
			break;
		*nrec += rl_traj_batch_count(b);
		if (rl_traj_reader_format(r) == RL_TRAJ_BINARY) {
			/* a frame passes through as it is */
			if ((rv = rl_traj_writer_put_batch(w, b)) != 0)
				break;
			continue;
		}
		/* JSONL: record by record, so the writer cuts frames at --batch
		 * records (the reader's batches are its own size) */
		for (size_t i = 0; i < rl_traj_batch_count(b) && rv == 0; i++)
			if ((rv = rl_traj_batch_get(b, i, t)) == 0)
				rv = rl_traj_writer_put(w, t);
		if (rv != 0)
			break;
	}
out:
	rl_traj_destroy(t);
	rl_traj_reader_close(r);
	if (f != stdin)
		fclose(f);
	return rv;
}

int
rlq_cat_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "stream", no_argument, NULL, 's' },
		{ "jsonl", no_argument, NULL, 'j' },
		{ "output", required_argument, NULL, 'o' },
		{ "batch", required_argument, NULL, 'b' },
		{ "level", required_argument, NULL, 'l' },
		{ "max-frame", required_argument, NULL, OPT_MAX_FRAME },
		{ "max-record", required_argument, NULL, OPT_MAX_RECORD },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	rl_traj_writer_opts wo = { .format = RL_TRAJ_JSONL };
	rl_traj_limits lim;
	rl_traj_writer *w = NULL;
	rl_io_atomic out = { 0 };
	const char *output = NULL;
	unsigned long long nrec = 0;
	int c, rv = RL_OK, verbosity = RL_LOG_NORMAL, status;
	long long v;
	uint64_t sz;

	rl_traj_limits_default(&lim);
	rl_cli_init("rl-queue cat", opts);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	opterr = 0;
	while ((c = rl_cli_getopt(argc, argv, ":sjo:b:l:qvh", NULL)) != -1) {
		switch (c) {
		case 's': wo.format = RL_TRAJ_BINARY; break;
		case 'j': wo.format = RL_TRAJ_JSONL; break;
		case 'o': output = optarg; break;
		case 'b':
			if ((rv = rl_cli_int(c, optarg, 1, 1000000, &v)) != 0)
				return rv;
			wo.batch_records = (size_t)v;
			break;
		case 'l':
			if ((rv = rl_cli_int(c, optarg, -7, 22, &v)) != 0)
				return rv;
			wo.level = (int)v;
			break;
		case OPT_MAX_FRAME:
		case OPT_MAX_RECORD:
			if ((rv = rl_cli_bytes(c, optarg, 16, 1ULL << 62, &sz)) != 0)
				return rv;
			if (c == OPT_MAX_FRAME)
				lim.max_frame = (size_t)sz;
			else
				lim.max_record = (size_t)sz;
			break;
		case 'q': verbosity = RL_LOG_QUIET; break;
		case 'v': verbosity++; break;
		case 'h': fputs(usage_text, stdout); return rl_io_close_stdout() ? 1 : 0;
		case ':': return rl_cli_usage("cat: option '%s' needs an argument", argv[optind - 1]);
		default: return rl_cli_usage("cat: unknown option '%s'", argv[optind - 1]);
		}
	}
	rl_log_set_level(verbosity);
	if (wo.format == RL_TRAJ_BINARY && (output == NULL || strcmp(output, "-") == 0) && isatty(STDOUT_FILENO)) {
		rl_error("cat: refusing to write a binary stream to a terminal");
		rl_hint("add -o FILE, or redirect or pipe standard output");
		return 2;
	}

	if (output != NULL && strcmp(output, "-") != 0) {
		if ((rv = rl_io_atomic_open(&out, output, 0644)) != 0)
			return 1;
		rv = rl_traj_writer_open_file(&w, out.f, output, &wo);
	} else {
		rv = rl_traj_writer_open_file(&w, stdout, "<stdout>", &wo);
	}
	if (rv != 0)
		goto done;
	if (optind == argc)
		rv = cat_one(w, "-", &lim, &nrec);
	for (int i = optind; i < argc && rv == 0; i++)
		rv = cat_one(w, argv[i], &lim, &nrec);
	status = rl_traj_writer_close(w);
	if (rv == 0)
		rv = status;
	if (rv == 0 && out.f)
		rv = rl_io_atomic_commit(&out);
	rl_verbose("cat: %llu records", nrec);
done:
	rl_io_atomic_abort(&out);
	if (output == NULL || strcmp(output, "-") == 0) {
		if (rv != 0)
			fclose(stdout);   /* the failure is reported already */
		else
			rv = rl_io_close_stdout();
	}
	return rv == 0 ? 0 : 1;
}

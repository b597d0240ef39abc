/*
 * rl-queue — the data plane of rlpipe.  main.c only dispatches to the
 * subcommands listed in rlq.h; each parses its own options.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "rlq.h"

/* The subcommands: one X(NAME, summary) line each; NAME.c defines
 * int rlq_NAME_main(int argc, char **argv). */
#define RLQ_SUBCOMMANDS(X) \
	X(cat, "print trajectory streams as JSONL, or convert them to the binary form") \
	X(serve, "run the broker") \
	X(put, "send prompts or trajectories to a broker") \
	X(get, "lease records from a broker and print them") \
	X(stat, "print a broker's state and throughput")

#define RLQ_DECLARE(name, summary) int rlq_##name##_main(int argc, char **argv);
RLQ_SUBCOMMANDS(RLQ_DECLARE)
#undef RLQ_DECLARE

static const struct {
	const char *name;
	int (*main)(int, char **);
	const char *summary;
} cmds[] = {
#define RLQ_ENTRY(name, summary) { #name, rlq_##name##_main, summary },
	RLQ_SUBCOMMANDS(RLQ_ENTRY)
#undef RLQ_ENTRY
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: rl-queue COMMAND [OPTION]... [ARG]...\n"
	           "       rl-queue COMMAND --help\n"
	           "       rl-queue --version\n\ncommands:\n");
	for (size_t i = 0; i < RL_ARRAY_LEN(cmds); i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\nSee rl-trajectory(5) for the stream format.\n");
}

int
main(int argc, char **argv)
{
	rl_log_init("rl-queue", RL_LOG_NORMAL);
	if (rl_cli_wants_version(argc, argv))
		return rl_cli_print_version();
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(stdout);
		return rl_io_close_stdout() ? 1 : 0;
	}
	for (size_t i = 0; i < RL_ARRAY_LEN(cmds); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].main(argc - 1, argv + 1);
	rl_error("unknown command '%s'", argv[1]);
	rl_hint("'rl-queue --help' lists the commands");
	return 2;
}

/*
 * rl-rollout — the generation stage.  main.c only dispatches to subcommands
 * (the table below); each lives in its own file.
 */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "core.h"

static const struct subcmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} subcmds[] = {
	{ "tokenize", rl_cmd_tokenize, "encode text or chats to token ids, or decode ids (debugging prompts)" },
};

static void
usage(FILE *f)
{
	fprintf(f, "usage: rl-rollout COMMAND [OPTIONS] [ARGS]\n\ncommands:\n");
	for (size_t i = 0; i < RL_ARRAY_LEN(subcmds); i++)
		fprintf(f, "  %-10s %s\n", subcmds[i].name, subcmds[i].summary);
	fprintf(f, "\n'rl-rollout COMMAND --help' describes each; see rl-rollout(1).\n");
}

int
main(int argc, char **argv)
{
	rl_log_init("rl-rollout", RL_LOG_NORMAL);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(stdout);
		return fclose(stdout) == 0 ? 0 : 1;
	}
	for (size_t i = 0; i < RL_ARRAY_LEN(subcmds); i++)
		if (strcmp(argv[1], subcmds[i].name) == 0)
			return subcmds[i].run(argc - 1, argv + 1);
	rl_error("unknown command '%s'", argv[1]);
	usage(stderr);
	return 2;
}

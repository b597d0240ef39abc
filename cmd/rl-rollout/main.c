/*
 * rl-rollout — the generation stage.  main.c only dispatches to subcommands
 * (the table below); each lives in its own file.
 */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "base/cli.h"
#include "base/core.h"

static const struct subcmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} subcmds[] = {
	{ "tokenize", rl_cmd_tokenize, "encode text or chats to token ids, or decode ids (debugging prompts)" },
	{ "serve", rl_cmd_serve, "serve the model behind an OpenAI-compatible HTTP API" },
};


int
main(int argc, char **argv)
{
	rl_log_init("rl-rollout", RL_LOG_NORMAL);
	if (rl_cli_wants_version(argc, argv))
		return rl_cli_print_version();
	/* a subcommand by name; anything else is generation (rl-rollout -m MODEL ...) */
	if (argc >= 2)
		for (size_t i = 0; i < RL_ARRAY_LEN(subcmds); i++)
			if (strcmp(argv[1], subcmds[i].name) == 0)
				return subcmds[i].run(argc - 1, argv + 1);
	return rl_cmd_generate(argc, argv);
}

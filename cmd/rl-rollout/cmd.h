/*
 * cmd.h — rl-rollout's subcommands.  Each takes the arguments after the
 * program name (argv[0] is the subcommand's name) and returns the exit status.
 */
#ifndef RL_ROLLOUT_CMD_H
#define RL_ROLLOUT_CMD_H

#include "rollout/rollout.h"

int rl_cmd_tokenize(int argc, char **argv);
int rl_cmd_serve(int argc, char **argv);
/* generation and --score: argv[0] is the program name */
int rl_cmd_generate(int argc, char **argv);

/* The broadcast weights group's options, shared by generation and serve
 * (wgroup_opts.c): their getopt values and struct option rows, one option
 * into o (0, a usage error's 2, or -1: not one of them), and what goes
 * together among the weight sources and --max-staleness (0 or 2). */
enum { RLO_WGROUP = 1000, RLO_WGRANK, RLO_WGSIZE, RLO_WGBACK };
#define RLO_WGROUP_LONGOPTS \
	{ "weights-group", required_argument, 0, RLO_WGROUP }, \
	{ "weights-group-rank", required_argument, 0, RLO_WGRANK }, \
	{ "weights-group-size", required_argument, 0, RLO_WGSIZE }, \
	{ "weights-group-backend", required_argument, 0, RLO_WGBACK }
int rl_cmd_wgroup_opt(rl_rollout_opts *o, int c, const char *a);
int rl_cmd_wgroup_check(const rl_rollout_opts *o);

#endif

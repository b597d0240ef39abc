/*
 * cmd.h — rl-rollout's subcommands.  Each takes the arguments after the
 * program name (argv[0] is the subcommand's name) and returns the exit status.
 */
#ifndef RL_ROLLOUT_CMD_H
#define RL_ROLLOUT_CMD_H

int rl_cmd_tokenize(int argc, char **argv);
int rl_cmd_serve(int argc, char **argv);
/* generation and --score: argv[0] is the program name */
int rl_cmd_generate(int argc, char **argv);

#endif

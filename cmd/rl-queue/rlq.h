/*
 * rlq.h — the subcommands of rl-queue.  Each lives in its own file
 * (cat.c, serve.c, ...) as `int rlq_NAME_main(int argc, char **argv)`, which
 * gets argv[0] == "NAME", returns the exit status (0 ok, 1 runtime failure,
 * 2 usage error, 3+ its own) and prints its own --help.
 *
 * To add one: write NAME.c and add one X(NAME, "summary") line to the
 * table in main.c.
 */
#ifndef RLQ_H
#define RLQ_H

#endif

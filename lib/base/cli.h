/*
 * cli.h — what the five commands' option parsing shares: one usage-error
 * convention and one parser for each kind of option value.
 *
 * A usage error is two lines on stderr and exit status 2:
 *   rl-train: --lr: bad value 'x' (a number from 0 to 1)
 *   rl-train: hint: rl-train --help lists the options
 * The first line goes through rl_error (so the program name is the one
 * rl_log_init set); the hint names the command whose --help to read, which
 * for a program with subcommands is "rl-queue serve", not "rl-queue".
 *
 * The value parsers take getopt_long's return value c to name the option
 * ("--top-p", or "-n" for an option without a long form) from the table
 * given to rl_cli_init.  Each returns 0 and sets *out, or prints the usage
 * error and returns 2 (*out untouched), so a command writes
 *   if ((rv = rl_cli_double(c, optarg, 0, 1, &o.top_p)) != 0) return rv;
 * State is per process (one command parses its options once, on one thread).
 *
 * A run file (--config FILE, every program): a YAML mapping whose keys are
 * the long options of the table given to rl_cli_init, without the dashes
 * (base/conf.h reads it).  rl_cli_config turns its entries into options
 * placed before the command line's, so that an option given on the command
 * line overrides the file's (the last value wins, as when an option is
 * repeated; options that add up, such as rl-reward --task, add up).  A
 * switch takes true or false (false: not given); a list gives the option
 * once per element, for the options named by rl_cli_repeatable only.  The parse loop then calls rl_cli_getopt instead of
 * getopt_long, so that a usage error about an option from the file names
 * the file and line:
 *   rl-train: 'run.yaml': line 3: --lr: bad value 'x' (a number from 0 to 1)
 */
#ifndef RL_CLI_H
#define RL_CLI_H

#include <getopt.h>
#include <stdint.h>

#include "base/core.h"

/* help_cmd: the command whose --help the hint names (borrowed; NULL: the
 * program name); longopts: the table given to getopt_long (borrowed). */
void rl_cli_init(const char *help_cmd, const struct option *longopts);

/* Takes --config FILE (or --config=FILE) out of the arguments and puts the
 * file's options after argv[0], before the rest (see above).  *argv becomes
 * an array owned here until the next call.  Returns 0 (also without
 * --config), or prints what was wrong — the file and line, and the key:
 * unknown key, wrong type (a mapping, a list or a value a switch cannot
 * take), no value — and returns 2.  Call after rl_cli_init. */
int rl_cli_config(int *argc, char ***argv);
/* The long options that may be repeated, so a run file may give them a
 * list (names: NULL-terminated, borrowed; call before rl_cli_config). */
void rl_cli_repeatable(const char *const *names);
/* getopt_long over the table given to rl_cli_init; also notes which
 * argument is being parsed, for the file-and-line prefix of usage errors. */
int rl_cli_getopt(int argc, char *const *argv, const char *shortopts, int *longindex);

/* --version: "PROG (rlpipe) VERSION" on stdout, VERSION from git describe
 * at build time (else the Makefile's VERSION); returns the exit status (1
 * when stdout cannot be written).  rl_cli_version is VERSION alone. */
int rl_cli_print_version(void);
const char *rl_cli_version(void);
/* 1 when argv[1..] holds --version before any "--". */
int rl_cli_wants_version(int argc, char **argv);

/* Prints "PROG: <message>" and the hint line; returns 2.  While the loop
 * parses an option from a --config file: "PROG: 'FILE': line L: <message>". */
int rl_cli_usage(const char *fmt, ...) RL_PRINTF(1, 2);

/* "--name" for a long option whose val is c, else "-c".  The string lives in
 * a static buffer until the next call. */
const char *rl_cli_opt(int c);

/* A number in [lo, hi] (strtod syntax, finite, nothing after it). */
int rl_cli_double(int c, const char *arg, double lo, double hi, double *out);
/* A whole number in [lo, hi] ("2.5" and "1e3" are refused). */
int rl_cli_int(int c, const char *arg, long long lo, long long hi, long long *out);
/* Same, into an int (lo and hi within int's range). */
int rl_cli_int32(int c, const char *arg, int lo, int hi, int *out);
/* Every one of 64 bits: seeds (a double keeps 53). */
int rl_cli_u64(int c, const char *arg, uint64_t *out);
/* A size in bytes in [lo, hi]: a whole number or a decimal with a k, M or G
 * suffix (powers of 1024) and an optional B or iB: "512", "64M", "1.5GB",
 * "64MiB". */
int rl_cli_bytes(int c, const char *arg, uint64_t lo, uint64_t hi, uint64_t *out);

#endif

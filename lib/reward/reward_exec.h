/*
 * reward_exec.h — user reward programs run as coprocesses (rl-reward --exec).
 *
 * Protocol: each worker is started once from an argv (no shell) with its
 * stdin and stdout on pipes and its stderr inherited.  For each record it
 * gets one line (a JSONL record, '\n'-terminated) and must answer with one
 * line: a JSON number or an object with a numeric "reward".  A worker that
 * exits, is killed, answers something else, writes more than max_reply bytes
 * or takes longer than the timeout is killed (with its process group) and
 * restarted before its next record; only that record is marked failed.
 *
 * Workers are spread over records as they become free; results come back
 * indexed, so the caller keeps input order.  One thread drives everything
 * with poll(2).  SIGPIPE is blocked around writes (and reset to the default in
 * workers), so a dead worker never kills the caller.
 *
 * Thread-safety: one rl_reward_exec per thread.
 * Leaves out: a shell (write `sh -c '...'` yourself), worker pools over the network.
 */
#ifndef RL_REWARD_EXEC_H
#define RL_REWARD_EXEC_H

#include <stddef.h>

typedef enum rl_exec_status {
	RL_EXEC_OK = 0,
	RL_EXEC_TIMEOUT,   /* no reply within the timeout: killed */
	RL_EXEC_CRASH,     /* exited or killed by a signal before replying */
	RL_EXEC_JUNK,      /* replied with something that is not a reward */
	RL_EXEC_SPAWN,     /* could not (re)start the worker */
	RL_EXEC_HTTP,      /* --judge: no connection, or an HTTP error status */
	RL_EXEC_STATUS_COUNT
} rl_exec_status;

/* "ok", "timeout", "crash", "junk", "spawn", "http" */
const char *rl_reward_exec_status_name(int status);

typedef struct rl_reward_exec_result {
	double reward;     /* NaN unless status is RL_EXEC_OK */
	int status;        /* rl_exec_status */
	char reason[160];  /* "" when ok, else e.g. "worker exited with status 3" */
} rl_reward_exec_result;

typedef struct rl_reward_exec_opts {
	int workers;        /* >= 1; default 1 */
	double timeout_s;   /* per record, from when it is handed to a worker; default 30 */
	size_t max_reply;   /* bytes of one reply line; default 1 MiB */
	int subreaper;      /* default 1: make the process a child subreaper
	                     * (prctl PR_SET_CHILD_SUBREAPER), so descendants that
	                     * leave a worker's process group are reaped, and killed
	                     * when the pool is destroyed; 0 for a process that
	                     * runs other children of its own */
} rl_reward_exec_opts;

void rl_reward_exec_opts_default(rl_reward_exec_opts *o);

typedef struct rl_reward_exec rl_reward_exec;

/* Splits cmd into an argv the way a shell splits words, without any
 * expansion: whitespace separates words, '...' quotes literally, "..."
 * quotes with \" \\ \$ \` escapes, a backslash outside quotes escapes the
 * next character.  *argv (NULL-terminated) and its strings are one
 * allocation: free(*argv).  RL_EINVAL (logged) for an unterminated quote or
 * an empty command. */
int rl_reward_exec_split(char ***argv, const char *cmd);

/* Starts o->workers workers running cmd (see rl_reward_exec_split).
 * RL_EINVAL for a bad command line, RL_ENOENT when the program cannot be
 * run (logged with the reason and a hint), RL_EIO for other failures. */
int rl_reward_exec_create(rl_reward_exec **out, const char *cmd, const rl_reward_exec_opts *o);

/* Scores n records: lines[i] (lens[i] bytes, ending in '\n') goes to a
 * worker; res[i] gets its result.  Returns 0 when every record has a result
 * (failed records are results too, not errors), RL_ENOMEM or RL_EIO for a
 * failure of the caller's own process (poll, pipes).  Blocks until done. */
int rl_reward_exec_run(rl_reward_exec *x, rl_reward_exec_result *res, const char *const *lines,
		       const size_t *lens, size_t n);

/* Counters since create: worker restarts. */
size_t rl_reward_exec_restarts(const rl_reward_exec *x);

/* Closes the workers' stdin, gives them 2 seconds to exit, then kills them.
 * Accepts NULL. */
void rl_reward_exec_destroy(rl_reward_exec *x);

#endif

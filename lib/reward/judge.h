/*
 * judge.h — an LLM as judge (rl-reward --judge URL): for each record a prompt
 * is rendered from a Jinja template, sent as one user message to an
 * OpenAI-compatible chat completions endpoint (rl-rollout serve, vLLM, any
 * such server), and the verdict in the reply is parsed into a score.
 *
 * Template variables: prompt (the record's prompt_text), response
 * (response_text), ground_truth (meta.answer, else
 * meta.reward_model.ground_truth; as text), meta (the record's meta object).
 * Verdict: with a pattern, its first capture group (or whole match) as a
 * number; without, the last number in the reply's text.
 *
 * Failures are results, as --exec's are (reward_exec.h): no reply within the
 * timeout (RL_EXEC_TIMEOUT), no connection or an HTTP error status
 * (RL_EXEC_HTTP), a reply without a verdict or a template that fails on the
 * record (RL_EXEC_JUNK).  Each names its reason.
 *
 * Leaves out: running the judge model in-process, streaming, retries (a
 * failed record is counted and handled by the --on-bad policy downstream).
 */
#ifndef RL_REWARD_JUDGE_H
#define RL_REWARD_JUDGE_H

#include <stddef.h>

#include "reward/reward_exec.h"
#include "stream/traj.h"

typedef struct rl_reward_judge_opts {
	const char *url;        /* the API's base URL, e.g. http://127.0.0.1:8000/v1 */
	const char *model;      /* the "model" of requests; NULL: the first of GET URL/models */
	const char *tmpl;       /* the template's text (NUL-terminated) */
	const char *tmpl_name;  /* names it in messages (a file name) */
	const char *pattern;    /* PCRE2 pattern of the verdict, or NULL */
	const char *api_key;    /* sent as Authorization: Bearer, or NULL */
	double timeout_s;       /* per request (default 60) */
	int jobs;               /* requests in flight (default 8) */
	int max_tokens;         /* of the judge's reply (default 512) */
} rl_reward_judge_opts;

void rl_reward_judge_opts_default(rl_reward_judge_opts *o);

typedef struct rl_reward_judge rl_reward_judge;

/* Parses the template and the pattern and, without o->model, asks the
 * server for its model.  RL_EINVAL (logged, naming the template line or the
 * pattern's offset, or the URL) for bad options, RL_EIO when the server
 * cannot be asked for its model, RL_ENOMEM. */
int rl_reward_judge_create(rl_reward_judge **out, const rl_reward_judge_opts *o);

/* Judges n records: res[i] gets record i's score or failure.  Returns 0 when
 * every record has a result (failures are results), RL_ENOMEM otherwise. */
int rl_reward_judge_run(rl_reward_judge *j, rl_reward_exec_result *res, rl_traj *const *recs, size_t n);

/* The model the requests name (given, or the server's). */
const char *rl_reward_judge_model(const rl_reward_judge *j);

void rl_reward_judge_destroy(rl_reward_judge *j);   /* NULL ok */

#endif

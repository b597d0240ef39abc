/*
 * rmscore.h — a reward model's score of trajectory records (rl-reward
 * --model): the component rl_reward_scorer.model_fn calls (reward.h), here
 * because models are on reward's neighbour floor.
 *
 * A record's tokens (prompt ids then response ids, as rl-rollout wrote them)
 * go through the model's forward in batches of rows; the score is the score
 * head at the last non-pad token (rl_model_score_index), as transformers'
 * ...ForSequenceClassification computes it.  Records are not re-tokenized:
 * the reward model must share the policy's vocabulary (an id outside it
 * fails the record).  Leaves out: text-only records (no ids), packing
 * several records into one row.
 */
#ifndef RL_RMSCORE_H
#define RL_RMSCORE_H

#include <stddef.h>

#include "stream/traj.h"

enum { RL_RM_NORM_NONE = 0, RL_RM_NORM_BATCH, RL_RM_NORM_RUNNING };

typedef struct rl_rmscore_opts {
	const char *model_dir;  /* a ...ForSequenceClassification directory */
	const char *device;     /* "cpu" (NULL) or "cuda" */
	int norm;               /* RL_RM_NORM_*: scores as they are, standardised over the
	                         * round's records, or over every score so far */
	int max_tokens;         /* rows x longest record per forward; 0: 8192 */
} rl_rmscore_opts;

typedef struct rl_rmscore rl_rmscore;

/* Opens the model on the device.  A causal LM (no score head) is refused
 * with RL_EINVAL and a hint; num_labels other than 1 or a head of another
 * shape as rl_model_open refuses them.  *out is the caller's (close). */
int rl_rmscore_open(rl_rmscore **out, const rl_rmscore_opts *o);
void rl_rmscore_close(rl_rmscore *r);
/* reward.h's model_fn: ctx is an rl_rmscore.  A record without prompt or
 * response ids, with an id outside the vocabulary or longer than the
 * model's context gets why[i] and no score. */
int rl_rmscore_fn(void *ctx, double *score, const char **why, rl_traj *const *recs, size_t n);
/* Counters since open: records scored, their tokens, seconds in forwards. */
void rl_rmscore_stats(const rl_rmscore *r, size_t *records, size_t *tokens, double *seconds);

#endif

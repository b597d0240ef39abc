/*
 * eval.h — rl-train's validation (--eval-prompts): greedy generation on
 * held-out prompt lines with a step's weights, scored by a reward task,
 * logged as verl's val-core/... metrics through lib/train's eval hook.
 * Leaves out: sampled (temperature > 0) validation, several tasks.
 */
#ifndef RL_TRAIN_CMD_EVAL_H
#define RL_TRAIN_CMD_EVAL_H

#include "reward/reward.h"
#include "train/opts.h"

typedef struct eval_cfg {
	const char *prompts;   /* --eval-prompts FILE */
	const char *device;
	int max_tokens;        /* --eval-max-tokens (default 256, rl-rollout's) */
	int samples;           /* --eval-samples N: the first N lines (0: all) */
	int quiet;
	rl_reward_task task;   /* --eval-task (parsed) */
	char tmp[4096];        /* the records of the last validation */
} eval_cfg;

/* Checks the options (a usage error: 2), the task and every prompt line (1),
 * makes the temporary records file and sets o's hook; 0 when all is well. */
int eval_setup(eval_cfg *c, rl_train_opts *o, const char *task, int every);
void eval_fini(eval_cfg *c);
/* Checks every line of c->prompts (a JSON object with "prompt"); logs
 * FILE:LINE and the reason of the first bad one, RL_EINVAL then. */
int eval_check_prompts(const eval_cfg *c);
/* rl_train_eval_fn: ctx is an eval_cfg. */
int eval_run(void *ctx, int step, const char *ckpt_dir, rl_train_put_fn put, void *pctx);

#endif

/*
 * eval.c — rl-train's validation (eval.h): at an eval step, rl-rollout's
 * generation (lib/rollout) runs greedily on the held-out prompts with the
 * step's checkpoint, rl-reward's scorer (lib/reward) scores the records, and
 * the means per data_source go to the step's metrics line.  The weights come
 * from the checkpoint directory the step has just written: the trainer's
 * model carries training buffers an engine does not share, and lib/train may
 * not include lib/rollout.  Leaves out: sampling, pass@k, several tasks.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "rollout/rollout.h"
#include "stream/traj.h"
#include "eval.h"

int
eval_check_prompts(const eval_cfg *c)
{
	char *buf = NULL;
	size_t len = 0;
	int rv, line = 0, used = 0;

	if ((rv = rl_io_read_file(c->prompts, (size_t)1 << 30, &buf, &len)) != 0)
		return rv;
	for (char *p = buf, *e; p < buf + len; p = e + 1) {
		cJSON *j, *pr;
		if (!(e = memchr(p, '\n', (size_t)(buf + len - p))))
			e = buf + len;
		line++;
		while (p < e && (*p == ' ' || *p == '\t' || *p == '\r'))
			p++;
		if (p == e)
			continue;
		if (!(j = cJSON_ParseWithLength(p, (size_t)(e - p))) || !cJSON_IsObject(j)) {
			rl_error("--eval-prompts %s:%d: not a JSON object", c->prompts, line);
			rv = RL_EINVAL;
		} else if (!(pr = cJSON_GetObjectItemCaseSensitive(j, "prompt")) ||
		    !(cJSON_IsString(pr) || cJSON_IsArray(pr))) {
			rl_error("--eval-prompts %s:%d: no \"prompt\" (a string or chat messages)", c->prompts, line);
			rv = RL_EINVAL;
		}
		cJSON_Delete(j);
		if (rv != 0)
			break;
		used++;
	}
	free(buf);
	if (rv == 0 && used == 0) {
		rl_error("--eval-prompts %s: no prompt lines", c->prompts);
		rv = RL_EINVAL;
	}
	return rv;
}

/* The first `samples` prompt lines into a file of their own (all: the file itself). */
static int
eval_input(const eval_cfg *c, char *path, size_t cap, int *made)
{
	char *buf = NULL;
	size_t len = 0, end = 0;
	int rv, n = 0, fd;

	*made = 0;
	if (c->samples <= 0) {
		snprintf(path, cap, "%s", c->prompts);
		return RL_OK;
	}
	if ((rv = rl_io_read_file(c->prompts, (size_t)1 << 30, &buf, &len)) != 0)
		return rv;
	for (size_t i = 0; i < len && n < c->samples; i = end) {
		const char *e = memchr(buf + i, '\n', len - i);
		end = e ? (size_t)(e - buf) + 1 : len;
		for (size_t k = i; k < end; k++)
			if (buf[k] != ' ' && buf[k] != '\t' && buf[k] != '\r' && buf[k] != '\n') {
				n++;
				break;
			}
	}
	snprintf(path, cap, "%s.in", c->tmp);
	if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0 ||
	    write(fd, buf, end) != (ssize_t)end || close(fd) != 0) {
		rl_error("cannot write '%s'", path);
		rv = RL_EIO;
	} else
		*made = 1;
	free(buf);
	return rv;
}

typedef struct dsacc {
	char name[128];
	double rsum, lsum;
	long n;
} dsacc;

static int
eval_score(const eval_cfg *c, dsacc **acc, int *nacc)
{
	rl_traj_reader *rd = NULL;
	rl_traj *t = NULL;          /* borrowed from the reader */
	rl_reward_scorer sc;
	FILE *f;
	int rv = 0, cap = 0;

	memset(&sc, 0, sizeof sc);
	sc.tasks = &c->task;
	sc.ntasks = 1;
	if (!(f = fopen(c->tmp, "rb"))) {
		rl_error("cannot open '%s'", c->tmp);
		return RL_EIO;
	}
	if ((rv = rl_traj_reader_open_file(&rd, f, c->tmp, NULL)) != 0)
		goto out;
	while ((rv = rl_traj_reader_next(rd, &t)) == 0 && t) {
		const char *meta = NULL, *ds = "unknown";
		const int32_t *resp;
		size_t nresp = 0;
		float r = NAN;
		cJSON *mj = NULL, *d;
		int k;

		if ((rv = rl_reward_score_records(&sc, &t, 1)) != 0)
			goto out;
		rl_traj_get_f32(t, RL_TAG_REWARD, &r);
		if (rl_traj_get_i32s(t, RL_TAG_RESPONSE, &resp, &nresp) != 0)
			nresp = 0;
		if (rl_traj_get_str(t, RL_TAG_META, &meta, NULL) == 0 && (mj = cJSON_Parse(meta)) &&
		    (d = cJSON_GetObjectItemCaseSensitive(mj, "data_source")) && cJSON_IsString(d))
			ds = d->valuestring;
		for (k = 0; k < *nacc && strcmp((*acc)[k].name, ds) != 0; k++)
			;
		if (k == *nacc) {
			if (*nacc == cap) {
				dsacc *na = realloc(*acc, sizeof **acc * (size_t)(cap = cap ? cap * 2 : 4));
				if (!na) {
					cJSON_Delete(mj);
					rv = RL_ENOMEM;
					goto out;
				}
				*acc = na;
			}
			memset(&(*acc)[k], 0, sizeof **acc);
			snprintf((*acc)[k].name, sizeof (*acc)[k].name, "%s", ds);
			(*nacc)++;
		}
		cJSON_Delete(mj);
		/* a record the task could not score (no ground truth) counts as 0,
		 * as verl's reward manager returns 0 for it: the mean stays over
		 * every prompt */
		(*acc)[k].rsum += isfinite(r) ? r : 0.0;
		(*acc)[k].lsum += (double)nresp;
		(*acc)[k].n++;
	}
out:
	rl_traj_reader_close(rd);
	fclose(f);
	return rv;
}

int
eval_run(void *ctx, int step, const char *ckpt_dir, rl_train_put_fn put, void *pctx)
{
	eval_cfg *c = ctx;
	rl_rollout_opts ro;
	char in[4200], key[320];
	dsacc *acc = NULL;
	int rv, made = 0, nacc = 0;

	if ((rv = eval_input(c, in, sizeof in, &made)) != 0)
		return rv;
	rl_rollout_opts_default(&ro);
	ro.model_dir = ckpt_dir;
	ro.input = in;
	ro.out_path = c->tmp;
	ro.jsonl = 1;
	ro.device = c->device;
	ro.n = 1;
	ro.go.sp.temperature = 0;
	ro.go.max_new = c->max_tokens;
	ro.quiet = 1;
	rl_verbose("validation at step %d on %s", step, c->prompts);
	if ((rv = rl_rollout_run(&ro)) != 0) {
		rl_error("validation at step %d failed", step);
		goto out;
	}
	if ((rv = eval_score(c, &acc, &nacc)) != 0)
		goto out;
	/* verl's process_validation_metrics: val-core/{data_source}/reward/mean@N
	 * for the test score; the rest under val-aux */
	for (int k = 0; k < nacc; k++) {
		snprintf(key, sizeof key, "val-core/%s/reward/mean@1", acc[k].name);
		put(pctx, key, acc[k].rsum / (double)acc[k].n);
		snprintf(key, sizeof key, "val-aux/%s/response_length/mean@1", acc[k].name);
		put(pctx, key, acc[k].lsum / (double)acc[k].n);
	}
out:
	free(acc);
	if (made)
		unlink(in);
	return rv;
}

int
eval_setup(eval_cfg *c, rl_train_opts *o, const char *task, int every)
{
	const char *td = getenv("TMPDIR");
	int fd;

	if (!task)
		return rl_cli_usage("--eval-prompts needs --eval-task T (the reward task that scores the "
		    "validation: gsm8k, math, countdown, exact, arith, dapo, auto, regex:P, format:P)");
	if (rl_reward_task_parse(&c->task, task, NULL, 0) != 0)
		return 2;
	if (c->task.kind == RL_TASK_LENGTH) {
		rl_reward_task_fini(&c->task);
		return rl_cli_usage("--eval-task length: a length budget is not a validation score");
	}
	if (eval_check_prompts(c) != 0) {
		rl_reward_task_fini(&c->task);
		return 1;
	}
	snprintf(c->tmp, sizeof c->tmp, "%s/rl-train-eval-XXXXXX", td && *td ? td : "/tmp");
	if ((fd = mkstemp(c->tmp)) < 0) {
		rl_error("cannot create a temporary file '%s'", c->tmp);
		rl_reward_task_fini(&c->task);
		return 1;
	}
	close(fd);
	c->device = o->device;
	c->quiet = o->quiet;
	o->eval_fn = eval_run;
	o->eval_ctx = c;
	o->eval_every = every < 0 ? 0 : every;
	return 0;
}

void
eval_fini(eval_cfg *c)
{
	unlink(c->tmp);
	rl_reward_task_fini(&c->task);
}

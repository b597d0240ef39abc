/*
 * dpodata.c — preference pairs as rl-train --algo dpo reads them (docs/train.md,
 * "DPO"): a pair line, parsed and tokenized by rl_pref_parse (prefs.h), becomes
 * a group of two records, the chosen completion (index 0, reward 1) and the
 * rejected one (index 1, reward 0), so that the feed, --resume (by group) and
 * data parallelism treat a pair as they treat any group.
 * Leaves out: the loss (step.c, algo.c), pairs formed from scored groups (the
 * step takes the higher reward as chosen there).
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/json.h"
#include "train/prefs.h"
#include "train/trainer.h"

/* One side of the pair as a record of group lineno; ids must differ (the
 * grouper drops a repeated id as a duplicate): 2 lineno + index. */
static int
side(rl_traj *t, const rl_pref *p, int index, uint64_t lineno)
{
	const int32_t *r = index == 0 ? p->chosen : p->rejected;
	int n = index == 0 ? p->clen : p->rlen, rv;

	rl_traj_clear(t);
	if ((rv = rl_traj_set_u64(t, RL_TAG_ID, 2 * lineno + (uint64_t)index)) != 0 ||
	    (rv = rl_traj_set_u64(t, RL_TAG_GROUP, lineno)) != 0 ||
	    (rv = rl_traj_set_i32(t, RL_TAG_INDEX, index)) != 0 ||
	    (rv = rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, 2)) != 0 ||
	    (rv = rl_traj_set_f32(t, RL_TAG_REWARD, index == 0 ? 1.0f : 0.0f)) != 0 ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_PROMPT, p->prompt, (size_t)p->plen)) != 0)
		return rv;
	return rl_traj_set_i32s(t, RL_TAG_RESPONSE, r, (size_t)n);
}

int
rli_dpo_line(void *ctx, rl_traj *t, const char *line, size_t n, const char *what, uint64_t lineno)
{
	trainer *tr = ctx;
	rl_pref p = { 0 };
	cJSON *j;
	int rv, pair;

	/* a pair names chosen or rejected; anything else (a record of rl-rollout,
	 * a line that is not JSON) is left to the record parser, which names it */
	if (!(j = rl_json_parse_all(line, n)))
		return RL_ENOENT;
	pair = cJSON_IsObject(j) && (cJSON_GetObjectItemCaseSensitive(j, "chosen") ||
	    cJSON_GetObjectItemCaseSensitive(j, "rejected"));
	cJSON_Delete(j);
	if (!pair)
		return RL_ENOENT;
	if (!tr->pair_rej && (rv = rl_traj_create(&tr->pair_rej)) != 0)
		return rv;
	if ((rv = rli_feed_tok(tr)) != 0 || (rv = rl_pref_parse(&p, tr->tok, line, n, what)) != 0)
		goto out;
	if ((rv = side(t, &p, 0, lineno)) != 0 || (rv = side(tr->pair_rej, &p, 1, lineno)) != 0)
		goto out;
	tr->pair_ready = 1;
out:
	if (rv != RL_OK)
		rl_traj_clear(t);
	rl_pref_fini(&p);
	return rv;
}

/*
 * record.c — the trajectory record of one finished sample: the fields of
 * rl-trajectory(5) that rl-rollout writes (ids, group, tokens, log-probs,
 * texts, meta, sampling parameters, times).  Writing or putting the record
 * is the caller's (run.c).
 */
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/json.h"
#include "base/rng.h"
#include "rollout/rollout_int.h"

/* The response text: the ids the tokenizer knows, decoded without special
 * tokens, made valid UTF-8.  *text is the caller's. */
static int
response_text(char **text, size_t *tlen, const gen *g, const rl_gen_sample *s)
{
	/* a model's vocabulary is often larger than its tokenizer's (padding rows):
	 * such ids have no text */
	int32_t *ids = rl_try_malloc(sizeof(int32_t) * (size_t)(s->n + 1), "response ids");
	int k = 0, V = rl_tokenizer_vocab_size(g->tok), rv;

	if (!ids)
		return RL_ENOMEM;
	for (int i = 0; i < s->n; i++)
		if (s->tok[i] >= 0 && s->tok[i] < V)
			ids[k++] = s->tok[i];
	rv = rl_tokenizer_decode(text, tlen, g->tok, ids, (size_t)k, RL_TOK_SKIP_SPECIAL);
	free(ids);
	if (rv != 0)
		return rv;
	/* the record's text field holds UTF-8 without NUL: anything else is replaced
	 * (a response cut inside a character ends in a partial one) */
	rl_utf8_fix(*text, *tlen);
	return RL_OK;
}

/* The prompt's meta, with "baseline": true added for the greedy sample.
 * *out is the caller's. */
static int
baseline_meta(char **out, const char *meta)
{
	cJSON *j = cJSON_Parse(meta);

	if (!j)
		j = cJSON_CreateObject();
	if (!j || !cJSON_AddBoolToObject(j, "baseline", 1)) {
		cJSON_Delete(j);
		return RL_ENOMEM;
	}
	*out = rl_json_print(j);
	cJSON_Delete(j);
	return RL_OK;
}

int
rli_record_build(rl_traj *t, gen *g, const prompt *p, const rl_gen_sample *s)
{
	char *text = NULL, *meta = NULL;
	size_t tlen = 0;
	int rv;

	rl_traj_clear(t);
	if ((rv = rl_traj_set_u64(t, RL_TAG_ID, rl_rng_mix(p->group * 0x100000001b3ULL + (uint64_t)s->index + 1))) ||
	    (rv = rl_traj_set_u64(t, RL_TAG_GROUP, p->group)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_INDEX, s->index)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, p->gsize)) ||
	    (rv = rl_traj_set_version(t, s->ver_first, s->ver_last)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_PROMPT, p->ids, (size_t)p->nids)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_RESPONSE, s->tok, (size_t)s->n)) ||
	    (rv = rl_traj_set_f32s(t, RL_TAG_LOGPROBS, s->logp, (size_t)s->n)))
		goto out;
	if ((rv = rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, p->text)) != RL_OK) /* utf8_fix'ed when parsed */
		goto out;
	if ((rv = response_text(&text, &tlen, g, s)) != RL_OK)
		goto out;
	if ((rv = rl_traj_set_strn(t, RL_TAG_RESPONSE_TEXT, text, tlen)) != RL_OK ||
	    (rv = rl_traj_set_str(t, RL_TAG_FINISH, rl_finish_name(s->finish))) != RL_OK)
		goto out;
	if (s->greedy && (rv = baseline_meta(&meta, p->meta)) != RL_OK)
		goto out;
	if ((rv = rl_traj_set_json(t, RL_TAG_META, meta ? meta : p->meta)) != 0)
		goto out;
	if ((rv = rl_traj_set_f32(t, RL_TAG_TEMPERATURE, s->greedy ? 0.0f : g->o.go.sp.temperature)) ||
	    (rv = rl_traj_set_f32(t, RL_TAG_TOP_P, g->o.go.sp.top_p)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_TOP_K, g->o.go.sp.top_k)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_MAX_TOKENS, p->max_new ? p->max_new : g->o.go.max_new)) ||
	    (rv = rl_traj_set_u64(t, RL_TAG_SEED, s->seed)) ||
	    (rv = rl_traj_set_f64(t, RL_TAG_TS_GEN_START, s->t_start)) ||
	    (rv = rl_traj_set_f64(t, RL_TAG_TS_GEN_END, s->t_end)))
		goto out;
out:
	free(text);
	free(meta);
	return rv;
}

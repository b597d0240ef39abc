/*
 * serve_ep.c — episodes of `rl-rollout serve`: the calls that carry one
 * X-Episode-Id become one multi-turn record (rl-trajectory(5): loss_mask,
 * turns, turn_versions).  An episode keeps every token of its calls; a call
 * whose rendered prompt starts with the text the episode's previous call
 * showed its client (that prompt, the answer, and the stop string and
 * special tokens sampled after it) continues from those exact tokens, only the new text
 * after it being tokenized (no re-tokenization drift).  A call that does not
 * start so is a mismatch: counted, logged, and the episode starts again
 * from that call (the turns before it are dropped from the record).
 * POST /rl/episodes/ID/reward writes the record with its reward; an episode
 * idle past --episode-timeout, or open when the server stops, is written
 * without a reward (meta.end "timeout" / "shutdown"); an --agent run that
 * fails ends its episode so too (meta.end "agent_error", sv_ep_close).
 * Records go out through serve_agent.c, which routes an agent run's into
 * its group.
 *
 * Everything here runs on the engine thread.  Leaves out: several samples
 * per call (n > 1 is refused with an episode), token-id prompts.
 */
#include "rollout/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/hash.h"
#include "base/json.h"

struct sv_episode {
	char id[SV_EPISODE_ID_MAX + 1];
	int32_t *tok;          /* the first call's prompt, then everything after it */
	float *logp;
	uint8_t *mask;
	int n, cap, plen;
	int32_t *turns, *tver; /* [start, end) in the response, [first, last] version, per model turn */
	int nturn, tcap;
	char *prompt_text;     /* the first call's prompt, rendered */
	rl_buf view;           /* what the next call's prompt must start with */
	rl_buf tail;           /* special tokens sampled after the answer's text, as text */
	int busy, calls, saved_n, saved_turn;
	double last;
	sv_episode *next;
};

static sv_episode *
find(serve *s, const char *id)
{
	for (sv_episode *e = s->eps; e; e = e->next)
		if (strcmp(e->id, id) == 0)
			return e;
	return NULL;
}

int
sv_ep_open(serve *s, const char *id)
{
	return find(s, id) != NULL;
}

static void
ep_free(sv_episode *e)
{
	if (!e)
		return;
	free(e->tok);
	free(e->logp);
	free(e->mask);
	free(e->turns);
	free(e->tver);
	free(e->prompt_text);
	rl_buf_fini(&e->view);
	rl_buf_fini(&e->tail);
	free(e);
}

static int
push(sv_episode *e, int32_t t, float lp, uint8_t m)
{
	if (e->n == e->cap) {
		int nc = e->cap ? e->cap * 2 : 256;
		int32_t *nt = realloc(e->tok, sizeof *nt * (size_t)nc);
		if (nt)
			e->tok = nt;
		float *nl = nt ? realloc(e->logp, sizeof *nl * (size_t)nc) : NULL;
		if (nl)
			e->logp = nl;
		uint8_t *nm = nl ? realloc(e->mask, (size_t)nc) : NULL;
		if (!nm)
			return RL_ENOMEM;
		e->mask = nm;
		e->cap = nc;
	}
	e->tok[e->n] = t;
	e->logp[e->n] = lp;
	e->mask[e->n] = m;
	e->n++;
	return RL_OK;
}

uint64_t
sv_ep_key(const char *id)
{
	return rl_hash64(id, strlen(id), 0x6b76) | 1;
}

/* The episode leaves the list; its kept KV cache, if any, goes too. */
static void
unlink_ep(serve *s, sv_episode *e)
{
	rl_engine_forget(s->g->e, sv_ep_key(e->id));
	for (sv_episode **pp = &s->eps; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	s->neps--;
}

/* The record of an episode: the first call's prompt, then every token after it. */
static int
write_record(serve *s, sv_episode *e, int has_reward, double reward, const char *end)
{
	rl_traj *t = NULL;
	char *text = NULL, *meta = NULL;
	size_t tlen = 0;
	int rv, nr = e->n - e->plen;
	uint64_t h = rl_hash64(e->id, strlen(e->id), 0x5e7e);
	cJSON *m = cJSON_CreateObject();

	if ((rv = rl_traj_create(&t)) != 0)
		goto out;
	cJSON_AddStringToObject(m, "episode_id", e->id);
	cJSON_AddNumberToObject(m, "calls", e->calls);
	if (end)
		cJSON_AddStringToObject(m, "end", end);
	if (!(meta = rl_json_print(m))) {
		rv = RL_ENOMEM;
		goto out;
	}
	if ((rv = rl_tokenizer_decode(&text, &tlen, s->g->tok, e->tok + e->plen, (size_t)nr, RL_TOK_SKIP_SPECIAL)) != 0)
		goto out;
	rl_utf8_fix(text, tlen);
	if ((rv = rl_traj_set_u64(t, RL_TAG_ID, h)) || (rv = rl_traj_set_u64(t, RL_TAG_GROUP, h)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_INDEX, 0)) || (rv = rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, 1)) ||
	    (rv = rl_traj_set_version(t, e->nturn ? e->tver[0] : 0, e->nturn ? e->tver[2 * e->nturn - 1] : 0)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_PROMPT, e->tok, (size_t)e->plen)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_RESPONSE, e->tok + e->plen, (size_t)nr)) ||
	    (rv = rl_traj_set_f32s(t, RL_TAG_LOGPROBS, e->logp + e->plen, (size_t)nr)) ||
	    (rv = rl_traj_set_u8s(t, RL_TAG_LOSS_MASK, e->mask + e->plen, (size_t)nr)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_TURNS, e->turns, 2 * (size_t)e->nturn)) ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_TURN_VERSIONS, e->tver, 2 * (size_t)e->nturn)) ||
	    (rv = rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, e->prompt_text)) ||
	    (rv = rl_traj_set_strn(t, RL_TAG_RESPONSE_TEXT, text, tlen)) ||
	    (rv = rl_traj_set_json(t, RL_TAG_META, meta)))
		goto out;
	if (has_reward && (rv = rl_traj_set_f32(t, RL_TAG_REWARD, (float)reward)) != 0)
		goto out;
	if ((rv = sv_agent_emit(s, e->id, t)) != 0) {
		rl_error("cannot write the record of episode '%s': %s", e->id, rl_strerror(rv));
		goto out;
	}
	nng_mtx_lock(s->mu);
	s->n_ep_written++;
	nng_mtx_unlock(s->mu);
out:
	cJSON_Delete(m);
	free(meta);
	free(text);
	rl_traj_destroy(t);
	return rv;
}

/* The prompt of an episode's call: its ids (continuing the episode's tokens
 * when the rendered text starts with what the episode showed), or an HTTP
 * status with msg.  text: the call's prompt rendered. */
int
sv_ep_begin(serve *s, sv_req *r, const char *text, size_t tlen, char *msg, size_t ml)
{
	sv_episode *e = find(s, r->episode);
	rl_tokens add = { 0 };
	const char *rest;
	size_t rl;
	int rv;

	if (e && e->busy) {
		snprintf(msg, ml, "a call of episode '%s' is still in flight", e->id);
		return 409;
	}
	if (e && (tlen < e->view.len || memcmp(text, e->view.p, e->view.len) != 0)) {
		nng_mtx_lock(s->mu);
		s->n_ep_mismatch++;
		nng_mtx_unlock(s->mu);
		rl_warn("episode '%s': the prompt does not continue what call %d showed; the episode starts "
		    "again from this call (%d tokens dropped)", e->id, e->calls, e->n);
		unlink_ep(s, e);
		ep_free(e);
		e = NULL;
	}
	if (!e) {
		if (!(e = calloc(1, sizeof *e)) || !(e->prompt_text = strndup(text, tlen))) {
			ep_free(e);
			return 500;
		}
		snprintf(e->id, sizeof e->id, "%s", r->episode);
		for (int i = 0; i < r->plen; i++)
			if (push(e, r->prompt[i], 0.0f, 0) != 0) {
				ep_free(e);
				return 500;
			}
		e->plen = r->plen;
		e->next = s->eps;
		s->eps = e;
		s->neps++;
		e->saved_n = e->n;
		e->busy = 1;
		r->ep = e;
		return 0;
	}
	/* the text after what was shown: the special tokens sampled after the answer
	 * (an end of turn the template writes again) are in the tokens already */
	rest = text + e->view.len;
	rl = tlen - e->view.len;
	if (e->tail.len && rl >= e->tail.len && memcmp(rest, e->tail.p, e->tail.len) == 0) {
		rest += e->tail.len;
		rl -= e->tail.len;
	}
	e->saved_n = e->n;
	e->saved_turn = e->nturn;
	if ((rv = rl_tokenizer_encode(&add, s->g->tok, rest, rl, RL_TOK_SPECIAL)) != 0)
		return 500;
	for (size_t i = 0; i < add.n; i++)
		if (push(e, add.ids[i], 0.0f, 0) != 0) {
			rl_tokens_fini(&add);
			e->n = e->saved_n;
			return 500;
		}
	rl_tokens_fini(&add);
	free(r->prompt);
	if (!(r->prompt = malloc(sizeof(int32_t) * (size_t)e->n))) {
		e->n = e->saved_n;
		return 500;
	}
	memcpy(r->prompt, e->tok, sizeof(int32_t) * (size_t)e->n);
	r->plen = e->n;
	e->busy = 1;
	r->ep = e;
	return 0;
}

/* The call ended: its sampled tokens join the episode (ok), or the episode
 * goes back to before it (failed, dropped). */
void
sv_ep_end(serve *s, sv_req *r, const rl_gen_sample *gs, const char *text, size_t tlen, int ok)
{
	sv_episode *e = r->ep;
	const sv_choice *c = &r->ch[0];
	int start = e->n - e->plen, k;

	r->ep = NULL;
	e->busy = 0;
	e->last = rl_now();
	if (!ok) {
		e->n = e->saved_n;
		e->nturn = e->saved_turn;
		if (e->n == e->plen && e->calls == 0) {
			unlink_ep(s, e);
			ep_free(e);
		}
		return;
	}
	for (int i = 0; i < c->n; i++)
		if (push(e, c->tok[i], c->logp[i], 1) != 0)
			goto oom;
	if (e->nturn == e->tcap) {
		int nc = e->tcap ? e->tcap * 2 : 8;
		int32_t *nt = realloc(e->turns, sizeof *nt * 2 * (size_t)nc);
		if (nt)
			e->turns = nt;
		int32_t *nv = nt ? realloc(e->tver, sizeof *nv * 2 * (size_t)nc) : NULL;
		if (!nv)
			goto oom;
		e->tver = nv;
		e->tcap = nc;
	}
	e->turns[2 * e->nturn] = start;
	e->turns[2 * e->nturn + 1] = e->n - e->plen;
	e->tver[2 * e->nturn] = gs->ver_first;
	e->tver[2 * e->nturn + 1] = gs->ver_last;
	e->nturn++;
	e->calls++;
	/* what the client saw: its prompt and the answer; then the special tokens at the end */
	e->view.len = 0;
	e->tail.len = 0;
	if (rl_buf_append(&e->view, r->ptext, r->ptlen) != 0 || rl_buf_append(&e->view, text, tlen) != 0)
		goto oom;
	/* a stop string is cut from the answer but was sampled: a client that writes
	 * it back (a tool call's closing tag) continues the tokens, not repeats them */
	size_t te = sv_text_end(r, c);
	if (te < c->raw.len && rl_buf_append(&e->tail, c->raw.p + te, c->raw.len - te) != 0)
		goto oom;
	for (k = c->n; k > 0 && rl_tokenizer_is_special(s->g->tok, c->tok[k - 1]); k--)
		;
	for (; k < c->n; k++) {
		size_t bl = 0;
		const char *b = rl_tokenizer_token(s->g->tok, c->tok[k], &bl);
		if (b && rl_buf_append(&e->tail, b, bl) != 0)
			goto oom;
	}
	return;
oom:
	rl_error("episode '%s': out of memory; it is dropped", e->id);
	unlink_ep(s, e);
	ep_free(e);
}

/* POST /rl/episodes/ID/reward: writes the record.  0, or an HTTP status with msg. */
int
sv_ep_reward(serve *s, const char *id, double reward, char *msg, size_t ml, int *tokens, int *turns)
{
	sv_episode *e = find(s, id);
	int rv;

	if (!e) {
		snprintf(msg, ml, "no episode '%s' (never started, already ended, or idle past --episode-timeout)", id);
		return 404;
	}
	if (e->busy) {
		snprintf(msg, ml, "a call of episode '%s' is still in flight", id);
		return 409;
	}
	*tokens = e->n - e->plen;
	*turns = e->nturn;
	rv = write_record(s, e, 1, reward, NULL);
	unlink_ep(s, e);
	ep_free(e);
	if (rv) {
		snprintf(msg, ml, "the record of episode '%s' could not be written: %s", id, rl_strerror(rv));
		return 500;
	}
	return 0;
}

int
sv_ep_close(serve *s, const char *id, const char *end)
{
	sv_episode *e = find(s, id);
	int rv = RL_OK;

	if (!e)
		return 0;
	if (e->busy)
		return 1;
	if (e->calls > 0)
		rv = write_record(s, e, 0, 0, end);
	unlink_ep(s, e);
	ep_free(e);
	(void)rv; /* logged by write_record */
	return 0;
}

/* Ends episodes idle past the timeout (all idle ones when all is set), written
 * without a reward. */
int
sv_ep_expire(serve *s, double timeout, int all)
{
	double now = rl_now();
	int rv = RL_OK;

	for (sv_episode *e = s->eps, *nx; e; e = nx) {
		nx = e->next;
		if (e->busy || (!all && now - e->last < timeout))
			continue;
		if (e->calls > 0) {
			int r2 = write_record(s, e, 0, 0, all ? "shutdown" : "timeout");
			if (!rv)
				rv = r2;
		}
		if (!all) {
			nng_mtx_lock(s->mu);
			s->n_ep_idle++;
			nng_mtx_unlock(s->mu);
		}
		unlink_ep(s, e);
		ep_free(e);
	}
	return rv;
}

/*
 * serve.c — `rl-rollout serve`: the policy behind an OpenAI-compatible HTTP
 * API (rl-rollout(1)).  The project's HTTP server (base/httpd.h: bounded
 * connections, deadlines, bodies up to --max-body) calls the handler on its
 * thread with the body read; the handler checks the key, routes, parses the
 * fields (serve_api.c) and puts the request in an inbox.  One engine thread
 * (the caller's) owns the engine: it tokenizes what comes in, submits it,
 * steps the engine, and answers as samples finish (rli_httpd_answer), so
 * concurrent requests share its continuous batching.  A stream
 * (`"stream": true`) gets its head at once and server-sent events as tokens
 * come (rli_httpd_stream_write); a connection gone (the client left, or
 * stopped reading past the server's bound) drops the request from the
 * engine at its next event.
 *
 * New weights (--weights-from, --sync, --weights-group) are polled between
 * steps and loaded as in generation.  With --agent CMD (serve_agent.c) the
 * loop also runs the agents of the prompt lines and stops when the input is
 * done; with --queue alone, clients lease episodes of the queue's prompt
 * lines through POST /rl/episodes.  Leaves out: TLS.
 */
#include "rollout/serve_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "base/json.h"
#include "base/rng.h"
#include "queue/qhttp.h"
#include "tok/chat_json.h"

static void
count(serve *s, uint64_t *c)
{
	nng_mtx_lock(s->mu);
	(*c)++;
	nng_mtx_unlock(s->mu);
}

/* ---- answers ---------------------------------------------------------------------------------------- */

/* ---- answers counted by route and status (/metrics) --------------------------------------------------- */

static const char *const route_name[SV_NROUTE] = { "/v1/chat/completions", "/v1/completions", "/v1/models",
	"/rl/episodes", "/rl/episodes/{id}/reward", "/metrics", "/health", "other" };
static const int code_list[SV_NCODE - 1] = { 200, 400, 401, 404, 405, 409, 413, 429, 500, 503 };

static int
route_of(const char *path)
{
	for (int i = 0; i < SV_NROUTE - 1; i++)
		if (strcmp(path, route_name[i]) == 0)
			return i;
	if (strncmp(path, "/v1/models/", 11) == 0)
		return SV_RT_MODELS;
	if (strncmp(path, "/rl/episodes/", 13) == 0)
		return SV_RT_REWARD;
	return SV_RT_OTHER;
}

static void
tally(serve *s, int rt, int status)
{
	int k = 0;

	while (k < SV_NCODE - 1 && code_list[k] != status)
		k++;
	nng_mtx_lock(s->mu);
	s->http[rt][k]++;
	nng_mtx_unlock(s->mu);
}

/* A JSON answer: into rep on the server's thread, or, with rep NULL, to
 * the connection of r, whose answer is due (any thread).  A connection
 * gone by then is nothing more to answer. */
static void
respond(serve *s, int rt, rli_httpd_reply *rep, sv_req *r, int status, const char *json, int close)
{
	static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
	    "\"code\":null}}";
	rli_httpd_reply a = { .status = status, .type = "application/json", .close = close };

	tally(s, rt, status);
	if (rep) {
		if ((a.owned = strdup(json)) != NULL) {
			a.len = strlen(json);
		} else {
			a.status = 500;
			a.body = oom;
			a.len = sizeof oom - 1;
		}
		*rep = a;
		return;
	}
	a.body = json;
	a.len = strlen(json);
	if (r->waiting && s->srv)
		(void)rli_httpd_answer(s->srv, r->hid, &a);
	r->waiting = 0;
}

static void
respond_error(serve *s, int rt, rli_httpd_reply *rep, sv_req *r, int status, const char *msg, const char *param,
    int close)
{
	char *j = sv_error_json(status, msg, param);

	respond(s, rt, rep, r, j ? status : 500, j ? j : "{}", close);
	free(j);
}

/* A request's error after the handler: as JSON on its connection, or (a
 * stream whose head went out) by ending the stream. */
static void
req_error(serve *s, sv_req *r, int status, const char *msg, const char *param)
{
	count(s, &s->n_errors);
	if (r->waiting)
		respond_error(s, r->route, NULL, r, status, msg, param, 0);
	r->done = 1;
}

/* ---- streams ---------------------------------------------------------------------------------------- */

/* Queues bytes on a stream (engine thread); a connection gone cancels the request. */
static void
stream_put(serve *s, sv_req *r, rl_buf *b)
{
	if (!r->dead && b->len && rli_httpd_stream_write(s->srv, r->hid, b->p, b->len) != 0) {
		r->dead = 1;
		nng_mtx_lock(s->mu);
		r->cancel = 1;
		nng_mtx_unlock(s->mu);
	}
	b->len = 0;
}

/* ---- the engine thread ------------------------------------------------------------------------------ */

/* Room in c for one more token (and its top list when the request asks for one). */
static int
choice_room(sv_choice *c, int top)
{
	int nc;

	if (c->n < c->cap)
		return RL_OK;
	nc = c->cap ? c->cap * 2 : 64;
	int32_t *nt = realloc(c->tok, sizeof *nt * (size_t)nc);
	if (nt)
		c->tok = nt;
	float *nl = nt ? realloc(c->logp, sizeof *nl * (size_t)nc) : NULL;
	if (nl)
		c->logp = nl;
	if (nl && top > 0) {
		int32_t *ti = realloc(c->top_id, sizeof *ti * (size_t)nc * top);
		if (ti)
			c->top_id = ti;
		float *tl = ti ? realloc(c->top_lp, sizeof *tl * (size_t)nc * top) : NULL;
		if (!tl)
			return RL_ENOMEM;
		c->top_lp = tl;
	}
	if (!nl)
		return RL_ENOMEM;
	c->cap = nc;
	return RL_OK;
}

/* The top log-probs of the token about to come (on_token follows for it). */
static void
on_top(void *ctx, void *user, int index, const int32_t *ids, const float *lp, int n)
{
	sv_req *r = user;
	sv_choice *c;

	(void)ctx;
	if (index < 0 || index >= r->n || r->top <= 0)
		return;
	c = &r->ch[index];
	if (choice_room(c, r->top) != 0)
		return;
	for (int k = 0; k < r->top; k++) {
		c->top_id[(size_t)c->n * r->top + k] = k < n ? ids[k] : -1;
		c->top_lp[(size_t)c->n * r->top + k] = k < n ? lp[k] : 0.0f;
	}
}

static void
on_token(void *ctx, void *user, int index, int32_t t, float lp)
{
	serve *s = ctx;
	sv_req *r = user;
	sv_choice *c;
	size_t bl = 0;
	const char *b;

	if (index < 0 || index >= r->n)
		return;
	c = &r->ch[index];
	if (choice_room(c, r->top) != 0)
		return;
	c->tok[c->n] = t;
	c->logp[c->n] = lp;
	c->n++;
	/* the text leaves special tokens out, as skip_special_tokens does */
	if (!rl_tokenizer_is_special(s->g->tok, t) && (b = rl_tokenizer_token(s->g->tok, t, &bl)) && bl)
		rl_buf_append(&c->raw, b, bl);
	if (r->stream && !r->cancel) {
		rl_buf out;
		rl_buf_init(&out);
		if (sv_stream_chunks(s, r, index, &out) == 0)
			stream_put(s, r, &out);
		rl_buf_fini(&out);
	}
}

static int
on_done(void *ctx, const rl_gen_sample *gs)
{
	serve *s = ctx;
	sv_req *r = gs->user;
	rl_buf out;
	char *j;

	if (gs->index >= 0 && gs->index < r->n)
		r->ch[gs->index].finish = gs->finish;
	rl_buf_init(&out);
	if (r->stream && !r->cancel && gs->index < r->n)
		sv_stream_chunks(s, r, gs->index, &out);
	if (--r->remaining > 0 || !gs->last_of_request) {
		if (out.len)
			stream_put(s, r, &out);
		rl_buf_fini(&out);
		return RL_OK;
	}
	r->in_engine = 0;
	if (r->ep) {
		/* the text the client gets, which its next call repeats */
		char *txt = r->cancel ? NULL : sv_final_text(r, &r->ch[0], 0, sv_text_end(r, &r->ch[0]));
		sv_ep_end(s, r, gs, txt, txt ? strlen(txt) : 0, txt != NULL && gs->finish != RL_FINISH_ABORT);
		free(txt);
	}
	if (r->cancel) {
		count(s, &s->n_cancelled);
		r->done = 1;
	} else if (r->stream) {
		sv_stream_end(s, r, &out);
		stream_put(s, r, &out);
		r->done = 1;
	} else if ((j = sv_answer_json(s, r)) != NULL) {
		respond(s, r->route, NULL, r, 200, j, 0);
		r->done = 1;
		free(j);
	} else {
		req_error(s, r, 500, "out of memory building the answer", NULL);
	}
	rl_buf_fini(&out);
	return RL_OK;
}

/* The prompt's token ids: chat messages through the model's chat template, a
 * completion's text as a prompt line's, or its ids as given.  0 or an HTTP status. */
static int
tokenize(serve *s, sv_req *r, char *msg, size_t ml)
{
	const cJSON *b = r->body, *v;
	rl_tokens ids = { 0 };
	int rv = 0;

	if (r->kind == SV_CHAT) {
		rl_prompt_chat ch = { 0 };
		int flags = RL_TOK_GEN_PROMPT;
		v = cJSON_GetObjectItemCaseSensitive(b, "messages");
		rv = rl_prompt_chat_parse(&ch, v, cJSON_GetObjectItemCaseSensitive(b, "chat_template_kwargs"), "messages");
		if (rv == 0 && (ch.thinking < 0 ? !s->g->o.no_think : ch.thinking) == 0)
			flags |= RL_TOK_NO_THINKING;
		if (rv == 0)
			rv = rl_tokenizer_apply_chat_tools(&ids, s->g->tok, ch.msgs, ch.n, r->tools, s->g->o.tmpl, flags);
		/* an episode's calls are matched on the rendered text */
		if (rv == 0 && r->episode[0])
			rv = rl_tokenizer_render_chat_tools(&r->ptext, &r->ptlen, s->g->tok, ch.msgs, ch.n, r->tools,
			    s->g->o.tmpl, flags);
		rl_prompt_chat_fini(&ch);
		if (rv) {
			snprintf(msg, ml, "'messages' cannot be rendered with the model's chat template (%s; the "
			    "server's log says where)", rl_strerror(rv));
			rv = 400;
		}
	} else if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(b, "prompt"))) {
		if (r->episode[0] && !(r->ptext = strdup(v->valuestring)))
			rv = 500;
		r->ptlen = r->ptext ? strlen(r->ptext) : 0;
		if (rv == 0 && rl_tokenizer_encode(&ids, s->g->tok, v->valuestring, strlen(v->valuestring), RL_TOK_SPECIAL) != 0) {
			snprintf(msg, ml, "out of memory encoding the prompt");
			rv = 500;
		}
	} else {
		const cJSON *it;
		int i = 0;
		cJSON_ArrayForEach(it, v) {
			if (!cJSON_IsNumber(it) || it->valuedouble != (int)it->valuedouble || it->valuedouble < 0 ||
			    it->valuedouble >= s->g->m->cfg.vocab_size) {
				snprintf(msg, ml, "'prompt'[%d] is not a token id of the model's vocabulary [0, %d)", i,
				    s->g->m->cfg.vocab_size);
				rv = 400;
				break;
			}
			int32_t id = (int32_t)it->valuedouble;
			if (ids.n == ids.cap) {
				size_t nc = ids.cap ? ids.cap * 2 : 64;
				int32_t *n2 = realloc(ids.ids, nc * sizeof *n2);
				if (!n2) {
					rv = 500;
					break;
				}
				ids.ids = n2;
				ids.cap = nc;
			}
			ids.ids[ids.n++] = id;
			i++;
		}
	}
	if (rv == 0 && ids.n == 0) {
		snprintf(msg, ml, "the prompt is empty");
		rv = 400;
	}
	if (rv == 0) {
		r->prompt = ids.ids;
		r->plen = (int)ids.n;
		ids.ids = NULL;
	}
	rl_tokens_fini(&ids);
	return rv;
}

/* POST /rl/episodes/ID/reward: the episode's record written, or the error. */
static void
reward(serve *s, sv_req *r)
{
	char msg[400], ok[600];
	int st, tokens = 0, turns = 0;

	if ((st = sv_ep_reward(s, r->episode, r->reward, msg, sizeof msg, &tokens, &turns)) != 0) {
		req_error(s, r, st, msg, NULL);
		return;
	}
	snprintf(ok, sizeof ok, "{\"episode_id\":\"%s\",\"reward\":%.17g,\"tokens\":%d,\"turns\":%d}", r->episode,
	    r->reward, tokens, turns);
	respond(s, r->route, NULL, r, 200, ok, 0);
	r->done = 1;
}

/* POST /rl/episodes: an episode of a leased prompt line, or the error. */
static void
hand(serve *s, sv_req *r)
{
	char msg[600], *j = NULL;
	int st;

	if ((st = sv_agent_hand(s, &j, msg, sizeof msg)) != 0) {
		req_error(s, r, st, st == 500 ? "out of memory" : msg, NULL);
		return;
	}
	respond(s, r->route, NULL, r, 200, j, 0);
	free(j);
	r->done = 1;
}

/* --max-staleness K (AReaL's rule, as in generation): a new episode is refused
 * while the episodes started (written and open) make more batches of
 * --train-batch than the trainer's version + K would take. */
static int
stale(serve *s, sv_req *r, char *msg, size_t ml)
{
	const rl_rollout_opts *o = &s->g->o;
	uint64_t started = s->n_ep_written + (uint64_t)s->neps;
	int batches;

	/* --agent runs are held back before they start, by prompt line (serve_agent.c) */
	if (o->max_staleness < 0 || sv_ep_open(s, r->episode) || sv_agent_owns(s, r->episode))
		return 0;
	batches = (int)(started / (uint64_t)RL_MAX(o->train_batch, 1));
	if (batches <= s->g->version + o->max_staleness)
		return 0;
	snprintf(msg, ml, "new episodes wait for the trainer: %llu episodes started make %d batches of %d, more "
	    "than weights version %d + --max-staleness %d allows; retry when the trainer catches up",
	    (unsigned long long)started, batches, o->train_batch, s->g->version, o->max_staleness);
	count(s, &s->n_stale);
	return 1;
}

/* Tokenizes and submits a new request, or answers its error. */
static void
start(serve *s, sv_req *r)
{
	char msg[512];
	rl_gen_req q;
	int st, rv;

	if (r->kind == SV_REWARD) {
		reward(s, r);
		return;
	}
	if (r->kind == SV_LEASE) {
		hand(s, r);
		return;
	}
	if ((st = tokenize(s, r, msg, sizeof msg)) != 0) {
		req_error(s, r, st, msg, r->kind == SV_CHAT ? "messages" : "prompt");
		return;
	}
	if (r->episode[0] && sv_agent_refuse(s, r->episode)) {
		snprintf(msg, sizeof msg, "episode '%s' has ended (its record is written)", r->episode);
		req_error(s, r, 409, msg, NULL);
		return;
	}
	if (r->episode[0] && stale(s, r, msg, sizeof msg)) {
		req_error(s, r, 429, msg, NULL);
		return;
	}
	if (r->episode[0] && (st = sv_ep_begin(s, r, r->ptext, r->ptlen, msg, sizeof msg)) != 0) {
		req_error(s, r, st, st == 500 ? "out of memory" : msg, NULL);
		return;
	}
	if (!(r->ch = rl_try_calloc((size_t)r->n, sizeof *r->ch, "choices"))) {
		req_error(s, r, 500, "out of memory", NULL);
		return;
	}
	memset(&q, 0, sizeof q);
	q.prompt = r->prompt;
	q.plen = r->plen;
	q.n = r->n;
	q.max_new = r->max_tokens;
	q.seed = r->has_seed ? r->seed : rl_rng_mix(s->next_id * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(rl_wall() * 1e6));
	q.user = r;
	q.sp = &r->sp;
	q.stop = r->stop;
	q.nstop = r->nstop;
	q.top = r->top;
	q.keep_key = r->ep ? sv_ep_key(r->episode) : 0;
	if ((rv = rl_engine_submit_req(s->g->e, &q)) != 0) {
		if (rv == RL_ETOOBIG)
			snprintf(msg, sizeof msg, "the prompt of %d tokens and n=%d do not fit: the model's context is "
			    "%d tokens, the server has %d slots", r->plen, r->n, s->g->m->cfg.max_pos, s->g->o.go.slots);
		else
			snprintf(msg, sizeof msg, "cannot queue the request: %s", rl_strerror(rv));
		if (r->ep)
			sv_ep_end(s, r, NULL, NULL, 0, 0);
		req_error(s, r, rv == RL_ETOOBIG ? 400 : 500, msg, rv == RL_ETOOBIG ? "prompt" : NULL);
		return;
	}
	r->remaining = r->n;
	r->in_engine = 1;
	nng_mtx_lock(s->mu);
	s->n_requests++;
	s->prompt_tokens += (uint64_t)r->plen;
	nng_mtx_unlock(s->mu);
}

static void
req_free(serve *s, sv_req *r)
{
	/* a stream ends with its connection, once its events are out */
	if (r->stream && !r->dead && s->srv)
		rli_httpd_stream_end(s->srv, r->hid);
	for (int i = 0; r->ch && i < r->n; i++) {
		free(r->ch[i].tok);
		free(r->ch[i].logp);
		free(r->ch[i].top_id);
		free(r->ch[i].top_lp);
		rl_buf_fini(&r->ch[i].raw);
	}
	free(r->ch);
	free(r->prompt);
	free(r->ptext);
	cJSON_Delete(r->body);
	free(r);
	nng_mtx_lock(s->mu);
	s->nreq--;
	nng_mtx_unlock(s->mu);
}

/* The requests the HTTP handler queued since the last call, taken at once. */
static sv_req *
inbox_take(serve *s)
{
	sv_req *in;

	nng_mtx_lock(s->mu);
	in = s->inbox;
	s->inbox = NULL;
	nng_mtx_unlock(s->mu);
	return in;
}

/* One pass of the engine thread: new requests in, cancelled ones out, the
 * answered ones freed.  Returns 1 when the engine has work. */
static int
tend(serve *s)
{
	sv_req *in, **pp;

	in = inbox_take(s);
	while (in) {
		sv_req *r = in;
		in = in->next;
		if (!r->done)
			start(s, r);
		r->next = s->live;
		s->live = r;
	}
	for (pp = &s->live; *pp;) {
		sv_req *r = *pp;
		int cancel;
		nng_mtx_lock(s->mu);
		cancel = r->cancel;
		nng_mtx_unlock(s->mu);
		if (cancel && r->in_engine) {
			if (rl_engine_cancel(s->g->e, r, on_done, s) == 1) {
				if (r->ep)
					sv_ep_end(s, r, NULL, NULL, 0, 0);
				r->in_engine = 0;
				r->done = 1;
				count(s, &s->n_cancelled);
			}
		}
		if (r->done) {
			*pp = r->next;
			req_free(s, r);
			continue;
		}
		pp = &r->next;
	}
	if (s->g->o.episode_timeout > 0 && s->eps)
		sv_ep_expire(s, s->g->o.episode_timeout, 0);
	nng_mtx_lock(s->mu);
	s->running = rl_engine_active(s->g->e);
	s->queued = rl_engine_waiting(s->g->e);
	s->gen_tokens = rl_engine_stats_get(s->g->e)->gen_tokens;
	s->steps = rl_engine_stats_get(s->g->e)->steps;
	s->prefilled = rl_engine_stats_get(s->g->e)->prefill_tokens + rl_engine_stats_get(s->g->e)->fed_tokens +
	    rl_engine_stats_get(s->g->e)->reused_seqs;
	s->reused = rl_engine_stats_get(s->g->e)->reused_tokens;
	s->kv_hits = rl_engine_stats_get(s->g->e)->reused_seqs;
	s->n_handed = sv_agent_handed(s);
	s->q_put = s->g->q_put;
	s->evicted = rl_engine_stats_get(s->g->e)->kept_evicted;
	rl_engine_kept(s->g->e, &s->kept, &s->kept_blk);
	s->neps_seen = s->neps;
	nng_mtx_unlock(s->mu);
	return s->running > 0 || s->queued > 0;
}

/* Prometheus text of the server's counters (GET /metrics). */
static void
metrics(serve *s, rli_httpd_reply *rep)
{
	rl_buf b;

	rl_buf_init(&b);
	nng_mtx_lock(s->mu);
	rl_buf_printf(&b, "# HELP rlserve_requests_total Generation requests submitted to the engine.\n"
	    "# TYPE rlserve_requests_total counter\nrlserve_requests_total %llu\n"
	    "# HELP rlserve_errors_total Requests answered with an error.\n"
	    "# TYPE rlserve_errors_total counter\nrlserve_errors_total %llu\n"
	    "# HELP rlserve_cancelled_total Requests dropped because their client went away.\n"
	    "# TYPE rlserve_cancelled_total counter\nrlserve_cancelled_total %llu\n"
	    "# HELP rlserve_generated_tokens_total Tokens sampled.\n"
	    "# TYPE rlserve_generated_tokens_total counter\nrlserve_generated_tokens_total %llu\n"
	    "# HELP rlserve_decode_steps_total Engine decode steps (one token for every sequence decoded together).\n"
	    "# TYPE rlserve_decode_steps_total counter\nrlserve_decode_steps_total %llu\n"
	    "# HELP rlserve_episodes_open Episodes with calls and no reward yet.\n"
	    "# TYPE rlserve_episodes_open gauge\nrlserve_episodes_open %d\n"
	    "# HELP rlserve_episode_mismatch_total Episode calls whose prompt did not continue the episode's text.\n"
	    "# TYPE rlserve_episode_mismatch_total counter\nrlserve_episode_mismatch_total %llu\n"
	    "# HELP rlserve_episodes_written_total Episode records written.\n"
	    "# TYPE rlserve_episodes_written_total counter\nrlserve_episodes_written_total %llu\n"
	    "# HELP rlserve_weights_version Weight version generating now.\n"
	    "# TYPE rlserve_weights_version gauge\nrlserve_weights_version %d\n"
	    "# HELP rlserve_stale_refused_total New episodes refused by --max-staleness.\n"
	    "# TYPE rlserve_stale_refused_total counter\nrlserve_stale_refused_total %llu\n"
	    "# HELP rlserve_requests_in_flight Requests read and not yet answered.\n"
	    "# TYPE rlserve_requests_in_flight gauge\nrlserve_requests_in_flight %d\n"
	    "# HELP rlserve_running_sequences Sequences holding an engine slot.\n"
	    "# TYPE rlserve_running_sequences gauge\nrlserve_running_sequences %d\n"
	    "# HELP rlserve_queued_requests Requests waiting for a slot.\n"
	    "# TYPE rlserve_queued_requests gauge\nrlserve_queued_requests %d\n"
	    "# HELP rlserve_prompt_tokens_forwarded_total Prompt tokens run through the model (prefills, and the new "
	    "tokens after a kept cache).\n"
	    "# TYPE rlserve_prompt_tokens_forwarded_total counter\nrlserve_prompt_tokens_forwarded_total %llu\n"
	    "# HELP rlserve_prompt_tokens_reused_total Prompt tokens an episode's kept KV cache already held.\n"
	    "# TYPE rlserve_prompt_tokens_reused_total counter\nrlserve_prompt_tokens_reused_total %llu\n"
	    "# HELP rlserve_kv_kept_evicted_total Kept episode caches dropped for room.\n"
	    "# TYPE rlserve_kv_kept_evicted_total counter\nrlserve_kv_kept_evicted_total %llu\n"
	    "# HELP rlserve_kv_kept_caches Episode KV caches kept between calls.\n"
	    "# TYPE rlserve_kv_kept_caches gauge\nrlserve_kv_kept_caches %d\n"
	    "# HELP rlserve_kv_kept_blocks KV cache blocks they hold.\n"
	    "# TYPE rlserve_kv_kept_blocks gauge\nrlserve_kv_kept_blocks %d\n",
	    (unsigned long long)s->n_requests, (unsigned long long)s->n_errors, (unsigned long long)s->n_cancelled,
	    (unsigned long long)s->gen_tokens, (unsigned long long)s->steps, s->neps_seen,
	    (unsigned long long)s->n_ep_mismatch, (unsigned long long)s->n_ep_written, s->version,
	    (unsigned long long)s->n_stale, s->nreq, s->running, s->queued, (unsigned long long)s->prefilled,
	    (unsigned long long)s->reused, (unsigned long long)s->evicted, s->kept, s->kept_blk);
	rl_buf_printf(&b, "# HELP rlserve_prompt_tokens_total Prompt tokens of the requests submitted (usage.prompt_tokens).\n"
	    "# TYPE rlserve_prompt_tokens_total counter\nrlserve_prompt_tokens_total %llu\n"
	    "# HELP rlserve_kv_reuse_hits_total Episode calls that took their episode's kept KV cache over.\n"
	    "# TYPE rlserve_kv_reuse_hits_total counter\nrlserve_kv_reuse_hits_total %llu\n"
	    "# HELP rlserve_episodes_idle_ended_total Episodes ended by --episode-timeout (written without a reward).\n"
	    "# TYPE rlserve_episodes_idle_ended_total counter\nrlserve_episodes_idle_ended_total %llu\n"
	    "# HELP rlserve_episodes_handed_out_total Episodes of leased prompt lines handed out (POST /rl/episodes).\n"
	    "# TYPE rlserve_episodes_handed_out_total counter\nrlserve_episodes_handed_out_total %llu\n"
	    "# HELP rlserve_queue_records_put_total Records put to rl-queue (--queue) and accepted.\n"
	    "# TYPE rlserve_queue_records_put_total counter\nrlserve_queue_records_put_total %llu\n"
	    "# HELP rlserve_http_requests_total HTTP answers by route and status code (code \"other\": any not listed).\n"
	    "# TYPE rlserve_http_requests_total counter\n",
	    (unsigned long long)s->prompt_tokens, (unsigned long long)s->kv_hits, (unsigned long long)s->n_ep_idle,
	    (unsigned long long)s->n_handed, (unsigned long long)s->q_put);
	for (int rt = 0; rt < SV_NROUTE; rt++)
		for (int k = 0; k < SV_NCODE; k++) {
			char code[8];
			if (!s->http[rt][k])
				continue;
			if (k < SV_NCODE - 1)
				snprintf(code, sizeof code, "%d", code_list[k]);
			else
				snprintf(code, sizeof code, "other");
			rl_buf_printf(&b, "rlserve_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n", route_name[rt], code,
			    (unsigned long long)s->http[rt][k]);
		}
	nng_mtx_unlock(s->mu);
	if (b.len == 0) {
		rl_buf_fini(&b);
		respond_error(s, SV_RT_METRICS, rep, NULL, 500, "out of memory", NULL, 0);
		return;
	}
	rep->status = 200;
	rep->type = "text/plain; version=0.0.4; charset=utf-8";
	rep->owned = (char *)b.p;   /* the server frees it */
	rep->len = b.len;
}

/* ---- HTTP ------------------------------------------------------------------------------------------- */

/* The body of a request read: parsed into r.  0, or the status of the error
 * with msg and param filled in. */
static int
read_body(serve *s, sv_req *r, const rli_httpd_req *rq, char *msg, size_t ml, char *param, size_t pl)
{
	const char *end = NULL;
	int st;

	param[0] = 0;
	/* POST /rl/episodes takes no fields: an empty body is one */
	r->body = r->kind == SV_LEASE && rq->body_len == 0 ? cJSON_CreateObject() :
	    cJSON_ParseWithLengthOpts(rq->body ? rq->body : "", rq->body_len, &end, 0);
	if (!r->body) {
		snprintf(msg, ml, "the request body is not valid JSON (at byte %ld)",
		    end && rq->body ? (long)(end - rq->body) : 0L);
		return 400;
	}
	if (r->kind == SV_REWARD) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->body, "reward");
		if (!cJSON_IsNumber(v) || v->valuedouble != v->valuedouble) {
			snprintf(msg, ml, "the body must be {\"reward\": NUMBER}");
			snprintf(param, pl, "reward");
			return 400;
		}
		r->reward = v->valuedouble;
	} else if (r->kind == SV_LEASE) {
		if (!cJSON_IsObject(r->body)) {
			snprintf(msg, ml, "the body must be a JSON object (or empty)");
			return 400;
		}
	} else if ((st = sv_parse(s, r, msg, ml, param, pl)) != 0) {
		return st;
	}
	if (s->failed || s->stop) {
		snprintf(msg, ml, "the server is stopping or its engine failed");
		return 503;
	}
	return 0;
}

/* The checks of a POST's head: 0, or the error answered in rep. */
static int
post_head(serve *s, const rli_httpd_req *rq, rli_httpd_reply *rep, int rt, int kind)
{
	char msg[200];

	/* a request without Content-Length has no body (RFC 9112), which only POST /rl/episodes allows */
	if (!rq->has_length && kind != SV_LEASE) {
		respond_error(s, rt, rep, NULL, 400, "a JSON body with a Content-Length header is required", NULL, 1);
		return 1;
	}
	if (rq->too_large) {
		snprintf(msg, sizeof msg, "the request body of %llu bytes is larger than the server's limit of %zu "
		    "(--max-body)", rq->length, s->max_body);
		respond_error(s, rt, rep, NULL, 413, msg, NULL, 1);
		return 1;
	}
	nng_mtx_lock(s->mu);
	if (s->nreq >= s->max_requests) {
		nng_mtx_unlock(s->mu);
		respond_error(s, rt, rep, NULL, 429, "too many requests in flight; retry later", NULL, 0);
		return 1;
	}
	s->nreq++;
	nng_mtx_unlock(s->mu);
	return 0;
}

/* POST to a generation or episode route (the server's thread, the body
 * read): an error now, or the request to the engine thread, which answers
 * it later or streams it. */
static void
start_post(serve *s, const rli_httpd_req *rq, rli_httpd_reply *rep, int kind, const char *episode)
{
	int rt = kind == SV_CHAT ? SV_RT_CHAT : kind == SV_COMPLETIONS ? SV_RT_COMPL : kind == SV_LEASE ? SV_RT_EPISODES :
	    SV_RT_REWARD;
	char msg[512], param[64];
	sv_req *r;
	int st;

	if (post_head(s, rq, rep, rt, kind) != 0)
		return;
	if (!(r = calloc(1, sizeof *r))) {
		nng_mtx_lock(s->mu);
		s->nreq--;
		nng_mtx_unlock(s->mu);
		respond_error(s, rt, rep, NULL, 500, "out of memory", NULL, 1);
		return;
	}
	r->sv = s;
	r->kind = kind;
	r->route = rt;
	r->hid = rq->id;
	snprintf(r->episode, sizeof r->episode, "%s", episode ? episode : "");
	r->created = (long)time(NULL);
	nng_mtx_lock(s->mu);
	snprintf(r->id, sizeof r->id, "%s-%016llx", kind == SV_CHAT ? "chatcmpl" : kind == SV_REWARD ? "reward" :
	    kind == SV_LEASE ? "episode" : "cmpl",
	    (unsigned long long)rl_rng_mix(++s->next_id ^ (uint64_t)r->created << 20));
	nng_mtx_unlock(s->mu);
	if ((st = read_body(s, r, rq, msg, sizeof msg, param, sizeof param)) != 0) {
		count(s, &s->n_errors);
		respond_error(s, rt, rep, NULL, st, msg, param[0] ? param : NULL, 0);
		req_free(s, r);
		return;
	}
	if (r->stream) {
		/* the head now; the events as they come, the connection closed after them */
		tally(s, rt, 200);
		rep->status = 200;
		rep->type = "text/event-stream";
		rep->extra = "X-Accel-Buffering: no\r\n";
		rep->stream = 1;
	} else {
		rep->later = 1;
		r->waiting = 1;
	}
	nng_mtx_lock(s->mu);
	r->next = s->inbox;
	s->inbox = r;
	nng_cv_wake(s->cv);
	nng_mtx_unlock(s->mu);
}

/* Episode ids go into records and logs: a short, plain alphabet. */
static int
episode_id_ok(const char *id)
{
	size_t n = strlen(id);

	if (n == 0 || n > SV_EPISODE_ID_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9') ||
		    id[i] == '.' || id[i] == '_' || id[i] == ':' || id[i] == '-'))
			return 0;
	return 1;
}

/* The server's handler (its thread): every route. */
static void
on_http(void *arg, const rli_httpd_req *rq, rli_httpd_reply *rep)
{
	serve *s = arg;
	const char *method = rq->method;
	char path[256], msg[400];
	int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
	int rt;
	char *j;

	snprintf(path, sizeof path, "%s", rq->path);
	path[strcspn(path, "#")] = 0;
	rt = route_of(path);
	if (strcmp(path, "/health") == 0 && get) {
		respond(s, rt, rep, NULL, s->failed ? 503 : 200, "{}", 0);
		return;
	}
	/* the counters say who uses the server and how: behind the key too */
	if ((strncmp(path, "/v1/", 4) == 0 || strncmp(path, "/rl/", 4) == 0 || strcmp(path, "/metrics") == 0) &&
	    !sv_auth_ok(s, rq->authorization)) {
		respond_error(s, rt, rep, NULL, 401, "Incorrect API key provided (Authorization: Bearer KEY)", NULL, 0);
		return;
	}
	if (strcmp(path, "/metrics") == 0 && get) {
		tally(s, rt, 200);
		metrics(s, rep);
		return;
	}
	if ((strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0) && post) {
		const char *ep = rli_httpd_field(rq, "X-Episode-Id");
		if (ep && !episode_id_ok(ep)) {
			respond_error(s, rt, rep, NULL, 400, "X-Episode-Id: want 1 to 128 characters of A-Z a-z 0-9 . _ : -", NULL, 1);
			return;
		}
		return start_post(s, rq, rep, strcmp(path, "/v1/chat/completions") == 0 ? SV_CHAT : SV_COMPLETIONS, ep);
	}
	if (strcmp(path, "/rl/episodes") == 0 && post)
		return start_post(s, rq, rep, SV_LEASE, NULL);
	if (strncmp(path, "/rl/episodes/", 13) == 0 && post) {
		char id[SV_EPISODE_ID_MAX + 2];
		size_t il = strcspn(path + 13, "/");
		if (il < sizeof id && strcmp(path + 13 + il, "/reward") == 0) {
			memcpy(id, path + 13, il);
			id[il] = 0;
			if (episode_id_ok(id))
				return start_post(s, rq, rep, SV_REWARD, id);
		}
	}
	if ((strcmp(path, "/v1/models") == 0 || (strncmp(path, "/v1/models/", 11) == 0)) && get) {
		int one = path[10] == '/';
		if (one && strcmp(path + 11, s->name) != 0) {
			snprintf(msg, sizeof msg, "The model '%.200s' does not exist", path + 11);
			respond_error(s, rt, rep, NULL, 404, msg, "model", 0);
			return;
		}
		if (!(j = sv_models_json(s, one))) {
			respond_error(s, rt, rep, NULL, 500, "out of memory", NULL, 0);
			return;
		}
		respond(s, rt, rep, NULL, 200, j, 0);
		free(j);
		return;
	}
	if (strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0 ||
	    strcmp(path, "/v1/models") == 0) {
		snprintf(msg, sizeof msg, "Method %s is not allowed on %s", method, path);
		respond_error(s, rt, rep, NULL, 405, msg, NULL, 1);
		return;
	}
	snprintf(msg, sizeof msg, "Invalid URL (%s %s)", method, path);
	respond_error(s, rt, rep, NULL, 404, msg, NULL, 1);
}

/* Listens on o.listen (loopback unless --listen-public or a key protects it). */
static int
listen_http(serve *s)
{
	const rl_rollout_opts *o = &s->g->o;
	rli_httpd_config sc = { 0 };
	char host[256], port[16];
	int loop, rv;

	if (rl_qhttp_parse_addr(s->url, sizeof s->url, &loop, o->listen) != 0) {
		rl_error("--listen: '%s' is not HOST:PORT, [IPV6]:PORT or :PORT", o->listen);
		return RL_EINVAL;
	}
	if (!loop && !o->listen_public) {
		rl_error("--listen: refusing to serve on '%s': not a loopback address", o->listen);
		rl_hint("add --listen-public to serve beyond this machine (with --api-key, or anyone can use it)");
		return RL_EINVAL;
	}
	if (!loop && !s->key[0])
		rl_warn("--listen: serving the model without an API key on '%s'", s->url);
	rl_qhttp_split_url(host, sizeof host, port, sizeof port, s->url);
	sc.host = host;
	sc.port = port;
	sc.opt = "--listen";
	/* every request in flight keeps its connection; 64 more for idle
	 * keep-alive clients, /health and /metrics */
	sc.max_conns = o->http_max_conns > 0 ? o->http_max_conns : o->max_requests + 64;
	sc.timeout_s = o->http_timeout;
	sc.max_body = s->max_body;
	sc.body_timeout_s = o->body_timeout;
	sc.fn = on_http;
	sc.arg = s;
	if ((rv = rli_httpd_open(&s->srv, &sc, s->url)) != 0)
		return rv;
	if (strcmp(port, "0") == 0) {
		char *colon = strrchr(s->url, ':');
		snprintf(colon + 1, sizeof s->url - (size_t)(colon + 1 - s->url), "%d", rli_httpd_port(s->srv));
	}
	return RL_OK;
}

static int
read_key(serve *s)
{
	const rl_rollout_opts *o = &s->g->o;
	size_t n = o->api_key ? strlen(o->api_key) : 0;

	if (!o->api_key)
		return RL_OK;
	while (n > 0 && (o->api_key[n - 1] == '\n' || o->api_key[n - 1] == '\r' || o->api_key[n - 1] == ' '))
		n--;
	if (n == 0 || n >= sizeof s->key) {
		rl_error("--api-key: the key is empty or longer than %zu bytes", sizeof s->key - 1);
		return RL_EINVAL;
	}
	memcpy(s->key, o->api_key, n);
	s->key[n] = 0;
	return RL_OK;
}

/* Answers and closes every request left, lets the last answers go out,
 * then stops the listener and frees the requests. */
static void
shut(serve *s)
{
	sv_req *in;

	nng_mtx_lock(s->mu);
	s->stop = 1;
	nng_mtx_unlock(s->mu);
	tend(s);
	for (sv_req *r = s->live; r; r = r->next) {
		if (r->in_engine)
			rl_engine_cancel(s->g->e, r, NULL, NULL);
		if (r->ep)
			sv_ep_end(s, r, NULL, NULL, 0, 0);
		r->in_engine = 0;
		if (r->waiting)
			respond_error(s, r->route, NULL, r, 503, "the server is stopping", NULL, 1);
		if (r->stream && !r->dead && s->srv)
			rli_httpd_stream_end(s->srv, r->hid);
		r->dead = 1;
		r->done = 1;
	}
	/* open episodes are written, unrewarded: nothing generated is lost */
	sv_ep_expire(s, 0, 1);
	if (s->srv) {
		rli_httpd_drain(s->srv, 0.5);
		rli_httpd_close(s->srv);
		s->srv = NULL;
	}
	/* requests the handler queued meanwhile have no connection left */
	in = inbox_take(s);
	while (in) {
		sv_req *r = in;
		in = in->next;
		r->waiting = 0;
		r->dead = 1;
		r->done = 1;
		r->next = s->live;
		s->live = r;
	}
	while (s->live || s->inbox) {
		tend(s);
		nng_msleep(5);
	}
}

int
rli_serve_run(gen *g)
{
	serve *s = rl_try_calloc(1, sizeof *s, "server");
	const char *slash;
	int rv;

	if (!s)
		return RL_ENOMEM;
	s->g = g;
	s->max_body = g->o.max_body;
	s->max_requests = g->o.max_requests;
	slash = strrchr(g->o.model_dir, '/');
	while (slash && slash[1] == 0 && slash > g->o.model_dir) {
		/* "dir/" names dir */
		const char *p = slash - 1;
		while (p > g->o.model_dir && *p != '/')
			p--;
		slash = *p == '/' ? p : NULL;
	}
	s->name = g->o.served_name ? g->o.served_name : slash ? slash + 1 : g->o.model_dir;
	if ((rv = read_key(s)) != 0)
		goto out;
	if (nng_mtx_alloc(&s->mu) != 0 || nng_cv_alloc(&s->cv, s->mu) != 0) {
		rv = RL_ENOMEM;
		goto out;
	}
	rl_engine_set_token(g->e, on_token, s);
	rl_engine_set_top(g->e, on_top, s);
	if ((rv = listen_http(s)) != 0)
		goto out;
	rl_info("serving '%s' at %s/v1", s->name, s->url);
	if ((g->o.agent_cmd || g->o.queue_url) && (rv = sv_agent_open(s)) != 0)
		goto out;
	while (!rli_stop_requested()) {
		int finished = 0;
		/* new weights: loaded between steps once the running sequences are done
		 * (rl_engine_hold drains them), or at once with --partial */
		if ((g->o.weights_from || g->o.sync_url || g->wg) && (rv = rli_poll_weights(g, 0)) != 0) {
			rl_error("new weights could not be loaded: %s", rl_strerror(rv));
			s->failed = 1;
			break;
		}
		nng_mtx_lock(s->mu);
		s->version = g->version;
		nng_mtx_unlock(s->mu);
		if (s->ag && ((rv = sv_agent_pump(s, &finished)) != 0 || finished))
			break;
		if (!tend(s)) {
			nng_mtx_lock(s->mu);
			/* agents' exits do not wake the thread: they are polled often */
			if (!s->inbox)
				nng_cv_until(s->cv, nng_clock() + (s->ag ? 10 : 100));
			nng_mtx_unlock(s->mu);
			continue;
		}
		if ((rv = rl_engine_step(g->e, on_done, s)) != 0) {
			rl_error("the engine failed: %s", rl_strerror(rv));
			s->failed = 1;
			break;
		}
	}
	rl_info("served %llu requests (%llu errors, %llu dropped by their clients)",
	    (unsigned long long)s->n_requests, (unsigned long long)s->n_errors, (unsigned long long)s->n_cancelled);
out:
	sv_agent_stop(s);
	if (s->mu)
		shut(s);
	{
		int r2 = sv_agent_close(s);
		if (!rv)
			rv = r2;
	}
	if (s->cv)
		nng_cv_free(s->cv);
	if (s->mu)
		nng_mtx_free(s->mu);
	free(s);
	return rv;
}

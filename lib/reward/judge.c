/*
 * judge.c — an LLM as judge over an OpenAI-compatible chat completions
 * endpoint (judge.h): the prompt rendered per record, requests kept in flight
 * over nng's HTTP client (one connection per request), the verdict parsed.
 *
 * Requests are answered in the order they were sent: the oldest is waited
 * for, then its slot takes the next record, so at most o->jobs are in flight
 * and a slow request holds back only the results after it, not the others'
 * progress on the server.
 *
 * Leaves out: chunked replies (servers answer a non-streaming completion
 * with a Content-Length), redirects, retries.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "reward/judge.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <pcre2.h>

#include "base/core.h"
#include "base/json.h"
#include "tok/jinja.h"

struct rl_reward_judge {
	rl_reward_judge_opts o;
	char *url, *model, *key;   /* owned copies */
	rl_jinja *tmpl;
	pcre2_code *re;
	nng_url *chat;             /* URL/chat/completions */
	nng_http_client *client;
};

typedef struct slot {
	nng_http_req *req;
	nng_http_res *res;
	nng_aio *aio;
	size_t rec;
	int busy;
} slot;

void
rl_reward_judge_opts_default(rl_reward_judge_opts *o)
{
	memset(o, 0, sizeof *o);
	o->timeout_s = 60;
	o->jobs = 8;
	o->max_tokens = 512;
}

const char *
rl_reward_judge_model(const rl_reward_judge *j)
{
	return j->model;
}

/* ---- the verdict ------------------------------------------------------------------- */

/* The last number of text: an optional sign, digits, an optional fraction. */
static int
last_number(const char *text, size_t len, double *v)
{
	size_t i = len, end, start;

	while (i > 0 && !(text[i - 1] >= '0' && text[i - 1] <= '9'))
		i--;
	if (i == 0)
		return -1;
	end = i;
	while (i > 0 && ((text[i - 1] >= '0' && text[i - 1] <= '9') || text[i - 1] == '.'))
		i--;
	if (i > 0 && text[i - 1] == '-')
		i--;
	start = i;
	while (start < end && text[start] == '.')   /* "..5": the number starts at the digits */
		start++;
	char buf[64];
	if (end - start >= sizeof buf)
		return -1;
	memcpy(buf, text + start, end - start);
	buf[end - start] = 0;
	char *e;
	*v = strtod(buf, &e);
	return e == buf ? -1 : 0;
}

/* The verdict of reply text (len bytes) under j's rule into *score: 0, or -1
 * with *why set. */
static int
verdict(const rl_reward_judge *j, const char *text, size_t len, double *score, const char **why)
{
	if (!j->re) {
		if (last_number(text, len, score) != 0) {
			*why = "the reply has no number";
			return -1;
		}
		return 0;
	}
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(j->re, NULL);
	int rc;
	if (!md) {
		*why = "out of memory";
		return -1;
	}
	rc = pcre2_match(j->re, (PCRE2_SPTR)text, len, 0, 0, md, NULL);
	if (rc < 0) {
		pcre2_match_data_free(md);
		*why = "the reply does not match --judge-pattern";
		return -1;
	}
	PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
	int g = rc > 1 && ov[2] != PCRE2_UNSET ? 1 : 0;
	size_t a = ov[2 * g], b = ov[2 * g + 1];
	char buf[64], *e;
	pcre2_match_data_free(md);
	if (b - a == 0 || b - a >= sizeof buf) {
		*why = "the verdict the pattern matched is not a number";
		return -1;
	}
	memcpy(buf, text + a, b - a);
	buf[b - a] = 0;
	*score = strtod(buf, &e);
	if (e == buf || *e != 0 || !isfinite(*score)) {
		*why = "the verdict the pattern matched is not a number";
		return -1;
	}
	return 0;
}

/* ---- requests ---------------------------------------------------------------------- */

/* obj[name] = the n bytes of s as a string (text up to a NUL, as cJSON keeps it) */
static cJSON *
add_strn(cJSON *obj, const char *name, const char *s, size_t n)
{
	char *c = strndup(s, n);
	cJSON *v = c ? cJSON_AddStringToObject(obj, name, c) : NULL;

	free(c);
	return v;
}

/* The template's variables for record t. */
static cJSON *
context_of(const rl_traj *t)
{
	const char *s;
	size_t n;
	cJSON *ctx = cJSON_CreateObject(), *meta = NULL, *gt = NULL;

	if (!ctx)
		return NULL;
	if (rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &s, &n) == 0 && !add_strn(ctx, "prompt", s, n))
		goto fail;
	if (rl_traj_get_str(t, RL_TAG_RESPONSE_TEXT, &s, &n) == 0 && !add_strn(ctx, "response", s, n))
		goto fail;
	if (rl_traj_get_str(t, RL_TAG_META, &s, &n) == 0 && (meta = cJSON_ParseWithLength(s, n)) != NULL) {
		cJSON *rm = cJSON_GetObjectItemCaseSensitive(meta, "reward_model");
		gt = cJSON_GetObjectItemCaseSensitive(meta, "answer");
		if (!gt && cJSON_IsObject(rm))
			gt = cJSON_GetObjectItemCaseSensitive(rm, "ground_truth");
		if (gt) {
			cJSON *c = cJSON_IsString(gt) ? cJSON_CreateString(gt->valuestring) : NULL;
			char *p = c ? NULL : cJSON_PrintUnformatted(gt);
			if (!c && p)
				c = cJSON_CreateString(p);
			free(p);
			if (!c)
				goto fail;
			cJSON_AddItemToObject(ctx, "ground_truth", c);
		}
		cJSON_AddItemToObject(ctx, "meta", meta);
	}
	return ctx;
fail:
	cJSON_Delete(meta);
	cJSON_Delete(ctx);
	return NULL;
}

/* The request body for record t into *body (caller frees), or a reason. */
static int
body_of(const rl_reward_judge *j, const rl_traj *t, char **body, const char **why)
{
	cJSON *ctx = context_of(t), *req = NULL, *msgs, *m;
	char *text = NULL;
	size_t len;
	int rv;

	*body = NULL;
	if (!ctx)
		return RL_ENOMEM;
	if ((rv = rl_jinja_render(&text, &len, j->tmpl, ctx, NULL)) != 0) {
		cJSON_Delete(ctx);
		*why = "the judge template failed on this record (logged)";
		return rv == RL_ENOMEM ? RL_ENOMEM : RL_EINVAL;
	}
	cJSON_Delete(ctx);
	rv = RL_ENOMEM;
	if (!(req = cJSON_CreateObject()) || !cJSON_AddStringToObject(req, "model", j->model) ||
	    !(msgs = cJSON_AddArrayToObject(req, "messages")) || !(m = cJSON_CreateObject()))
		goto out;
	cJSON_AddItemToArray(msgs, m);
	if (!cJSON_AddStringToObject(m, "role", "user") || !add_strn(m, "content", text, len) ||
	    !cJSON_AddNumberToObject(req, "temperature", 0) ||
	    !cJSON_AddNumberToObject(req, "max_tokens", j->o.max_tokens))
		goto out;
	if ((*body = cJSON_PrintUnformatted(req)) != NULL)
		rv = RL_OK;
out:
	free(text);
	cJSON_Delete(req);
	return rv;
}

static void
slot_free(slot *s)
{
	if (s->aio)
		nng_aio_free(s->aio);
	if (s->req)
		nng_http_req_free(s->req);
	if (s->res)
		nng_http_res_free(s->res);
	memset(s, 0, sizeof *s);
}

static void
fail(rl_reward_exec_result *r, int status, const char *why)
{
	r->reward = NAN;
	r->status = status;
	snprintf(r->reason, sizeof r->reason, "%s", why);
}

/* Sends record i from slot s; a record that cannot be sent gets its result
 * now (s stays free).  RL_ENOMEM only. */
static int
slot_send(rl_reward_judge *j, slot *s, rl_traj *t, size_t i, rl_reward_exec_result *res)
{
	const char *why = NULL;
	char *body = NULL, auth[600];
	int rv;

	if ((rv = body_of(j, t, &body, &why)) != 0) {
		if (rv == RL_ENOMEM)
			return rv;
		fail(&res[i], RL_EXEC_JUNK, why);
		return RL_OK;
	}
	rv = nng_http_req_alloc(&s->req, j->chat);
	if (rv == 0)
		rv = nng_http_res_alloc(&s->res);
	if (rv == 0)
		rv = nng_aio_alloc(&s->aio, NULL, NULL);
	if (rv == 0 && (rv = nng_http_req_set_method(s->req, "POST")) == 0 &&
	    (rv = nng_http_req_set_header(s->req, "Content-Type", "application/json")) == 0)
		rv = nng_http_req_copy_data(s->req, body, strlen(body));
	if (rv == 0 && j->key) {
		snprintf(auth, sizeof auth, "Bearer %s", j->key);
		rv = nng_http_req_set_header(s->req, "Authorization", auth);
	}
	free(body);
	if (rv != 0) {
		slot_free(s);
		return RL_ENOMEM;
	}
	nng_aio_set_timeout(s->aio, (nng_duration)(j->o.timeout_s * 1000));
	nng_http_client_transact(j->client, s->req, s->res, s->aio);
	s->rec = i;
	s->busy = 1;
	return RL_OK;
}

/* The reply's message text into *text (borrowed from *root), or a reason. */
static const char *
reply_text(const char *data, size_t n, cJSON **root, const char **text, size_t *len)
{
	const cJSON *ch, *msg, *c;

	if (!(*root = cJSON_ParseWithLength(data, n)))
		return "the reply is not JSON";
	ch = cJSON_GetObjectItemCaseSensitive(*root, "choices");
	msg = cJSON_IsArray(ch) ? cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ch, 0), "message") : NULL;
	c = cJSON_GetObjectItemCaseSensitive(msg, "content");
	if (!cJSON_IsString(c))
		return "the reply has no choices[0].message.content";
	*text = c->valuestring;
	*len = strlen(c->valuestring);
	return NULL;
}

/* Waits for slot s and writes its record's result. */
static void
slot_finish(rl_reward_judge *j, slot *s, rl_reward_exec_result *res)
{
	rl_reward_exec_result *r = &res[s->rec];
	const char *why = NULL, *text;
	char msg[sizeof r->reason];
	cJSON *root = NULL;
	void *data;
	size_t n, len;
	int rv, st;

	nng_aio_wait(s->aio);
	rv = nng_aio_result(s->aio);
	if (rv == NNG_ETIMEDOUT) {
		snprintf(msg, sizeof msg, "no reply from the judge within %g s", j->o.timeout_s);
		fail(r, RL_EXEC_TIMEOUT, msg);
	} else if (rv != 0) {
		snprintf(msg, sizeof msg, "%.100s: %s", j->url, nng_strerror(rv));
		fail(r, RL_EXEC_HTTP, msg);
	} else if ((st = nng_http_res_get_status(s->res)) != 200) {
		snprintf(msg, sizeof msg, "the judge answered HTTP %d", st);
		fail(r, RL_EXEC_HTTP, msg);
	} else {
		nng_http_res_get_data(s->res, &data, &n);
		if ((why = reply_text(data, n, &root, &text, &len)) == NULL &&
		    verdict(j, text, len, &r->reward, &why) == 0) {
			r->status = RL_EXEC_OK;
			r->reason[0] = 0;
		} else {
			fail(r, RL_EXEC_JUNK, why);
		}
	}
	cJSON_Delete(root);
	slot_free(s);
}

int
rl_reward_judge_run(rl_reward_judge *j, rl_reward_exec_result *res, rl_traj *const *recs, size_t n)
{
	int jobs = j->o.jobs > 0 ? j->o.jobs : 1, rv = RL_OK;
	slot *sl = rl_try_calloc((size_t)jobs, sizeof *sl, "judge requests");
	size_t next = 0;

	if (!sl)
		return RL_ENOMEM;
	/* round robin over the slots: the oldest request is the next waited for */
	for (size_t k = 0; rv == RL_OK; k = (k + 1) % (size_t)jobs) {
		slot *s = &sl[k];
		if (s->busy)
			slot_finish(j, s, res);
		while (!s->busy && next < n && rv == RL_OK)
			rv = slot_send(j, s, recs[next], next, res), next++;
		int any = 0;
		for (int q = 0; q < jobs; q++)
			any |= sl[q].busy;
		if (!any && next >= n)
			break;
	}
	for (int q = 0; q < jobs; q++) {
		if (sl[q].busy)
			nng_aio_cancel(sl[q].aio), nng_aio_wait(sl[q].aio);
		slot_free(&sl[q]);
	}
	free(sl);
	return rv;
}

/* ---- set-up ------------------------------------------------------------------------ */

/* GET URL/models: the first model's id into j->model. */
static int
ask_model(rl_reward_judge *j)
{
	char u[4096];
	nng_url *url = NULL;
	nng_http_req *req = NULL;
	nng_http_res *res = NULL;
	nng_aio *aio = NULL;
	cJSON *root = NULL;
	const cJSON *id;
	void *data;
	size_t n;
	int rv;

	snprintf(u, sizeof u, "%s/models", j->url);
	if ((rv = nng_url_parse(&url, u)) != 0 || (rv = nng_http_req_alloc(&req, url)) != 0 ||
	    (rv = nng_http_res_alloc(&res)) != 0 || (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0)
		goto out;
	if (j->key) {
		char auth[600];
		snprintf(auth, sizeof auth, "Bearer %s", j->key);
		if ((rv = nng_http_req_set_header(req, "Authorization", auth)) != 0)
			goto out;
	}
	nng_aio_set_timeout(aio, (nng_duration)(j->o.timeout_s * 1000));
	nng_http_client_transact(j->client, req, res, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0)
		goto out;
	if (nng_http_res_get_status(res) != 200) {
		rl_error("--judge %s: GET %s answered HTTP %d", j->url, u, nng_http_res_get_status(res));
		rl_hint("name the model with --judge-model");
		rv = -1;
		goto out;
	}
	nng_http_res_get_data(res, &data, &n);
	root = cJSON_ParseWithLength(data, n);
	id = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "data"), 0), "id");
	if (!cJSON_IsString(id)) {
		rl_error("--judge %s: GET %s lists no model (data[0].id)", j->url, u);
		rl_hint("name the model with --judge-model");
		rv = -1;
	} else if (!(j->model = strdup(id->valuestring))) {
		rv = NNG_ENOMEM;
	}
out:
	if (rv > 0) {
		rl_error("--judge %s: cannot ask it for its model (GET %s): %s", j->url, u, nng_strerror(rv));
		rl_hint("is the server up? name the model with --judge-model to start without asking");
	}
	cJSON_Delete(root);
	if (aio)
		nng_aio_free(aio);
	if (req)
		nng_http_req_free(req);
	if (res)
		nng_http_res_free(res);
	if (url)
		nng_url_free(url);
	return rv == 0 ? RL_OK : rv == NNG_ENOMEM ? RL_ENOMEM : RL_EIO;
}

static int
compile_pattern(rl_reward_judge *j, const char *pat)
{
	int errc;
	PCRE2_SIZE off;
	PCRE2_UCHAR msg[256];

	j->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errc, &off, NULL);
	if (!j->re) {
		pcre2_get_error_message(errc, msg, sizeof msg);
		rl_error("--judge-pattern '%s': at offset %zu: %s", pat, (size_t)off, (const char *)msg);
		return RL_EINVAL;
	}
	return RL_OK;
}

int
rl_reward_judge_create(rl_reward_judge **out, const rl_reward_judge_opts *o)
{
	rl_reward_judge *j = rl_try_calloc(1, sizeof *j, "judge");
	char u[4096];
	nng_url *base = NULL;
	size_t n;
	int rv;

	*out = NULL;
	if (!j)
		return RL_ENOMEM;
	j->o = *o;
	n = strlen(o->url);
	while (n > 0 && o->url[n - 1] == '/')
		n--;
	if (!(j->url = strndup(o->url, n)) || (o->api_key && !(j->key = strdup(o->api_key))) ||
	    (o->model && !(j->model = strdup(o->model)))) {
		rv = RL_ENOMEM;
		goto out;
	}
	if (strncmp(j->url, "http://", 7) != 0) {
		rl_error("--judge '%s': want an http:// URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1)",
		    o->url);
		rv = RL_EINVAL;
		goto out;
	}
	snprintf(u, sizeof u, "%s/chat/completions", j->url);
	if (nng_url_parse(&j->chat, u) != 0 || nng_url_parse(&base, j->url) != 0) {
		rl_error("--judge '%s': not a URL nng can parse", o->url);
		rv = RL_EINVAL;
		goto out;
	}
	if (nng_http_client_alloc(&j->client, base) != 0) {
		rv = RL_ENOMEM;
		goto out;
	}
	if ((rv = rl_jinja_parse(&j->tmpl, o->tmpl, strlen(o->tmpl), o->tmpl_name)) != 0)
		goto out;
	if (o->pattern && (rv = compile_pattern(j, o->pattern)) != 0)
		goto out;
	if (!j->model && (rv = ask_model(j)) != 0)
		goto out;
	*out = j;
	j = NULL;
out:
	if (base)
		nng_url_free(base);
	rl_reward_judge_destroy(j);
	return rv;
}

void
rl_reward_judge_destroy(rl_reward_judge *j)
{
	if (!j)
		return;
	if (j->client)
		nng_http_client_free(j->client);
	if (j->chat)
		nng_url_free(j->chat);
	pcre2_code_free(j->re);
	rl_jinja_free(j->tmpl);
	free(j->url);
	free(j->model);
	free(j->key);
	free(j);
}

/*
 * serve_api.c — the OpenAI side of `rl-rollout serve`: the fields of a
 * /v1/completions or /v1/chat/completions request into an sv_req, and the
 * JSON of answers, stream chunks, model lists and errors, shaped as OpenAI's
 * API documents them (and the `openai` clients read them).
 *
 * Tools: the request's "tools" go to the chat template, and with tool_choice
 * "auto" (the default) the answer's Hermes <tool_call> blocks come back as
 * tool_calls (serve_tools.c); "none" renders the tools and parses nothing.
 *
 * Log-probs: each sampled token's, and with top_logprobs N (chat) or logprobs N
 * (completions; up to 20 as vLLM allows, where OpenAI stops at 5) the N likeliest
 * tokens of each position, from the distribution the sampled token's log-prob
 * comes from (the engine's: logits / temperature, before top-p; rl-rollout(1)).
 *
 * Leaves out: tool_choice "required" or a named function, penalties, logit_bias, echo, best_of, suffix,
 * a list of prompts: each is refused with 400 naming the field rather than
 * ignored.
 */
#include "rollout/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

/* ---- text ------------------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0 when invalid. */
static size_t
utf8_seq(const uint8_t *p, size_t n)
{
	size_t len;
	uint32_t cp;

	if (p[0] < 0x80)
		return 1;
	if ((p[0] & 0xe0) == 0xc0)
		len = 2, cp = p[0] & 0x1f;
	else if ((p[0] & 0xf0) == 0xe0)
		len = 3, cp = p[0] & 0x0f;
	else if ((p[0] & 0xf8) == 0xf0)
		len = 4, cp = p[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	/* overlong forms, surrogates and past U+10FFFF are not UTF-8 */
	if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

/* p[0..n) as UTF-8 in a new string: an invalid byte becomes U+FFFD, as
 * Python's errors="replace" (vLLM's detokenizer) shows it. */
static char *
utf8_clean(const uint8_t *p, size_t n)
{
	char *o = rl_try_malloc(n * 3 + 1, "response text"), *w = o;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n;) {
		size_t l = utf8_seq(p + i, n - i);
		if (l == 0) {
			memcpy(w, "\xef\xbf\xbd", 3);
			w += 3;
			i++;
			continue;
		}
		memcpy(w, p + i, l);
		w += l;
		i += l;
	}
	*w = 0;
	return o;
}

/* Bytes at the end of p[0..n) that open a UTF-8 sequence the next token may complete. */
static size_t
utf8_open_tail(const uint8_t *p, size_t n)
{
	for (size_t k = 1; k <= 3 && k <= n; k++) {
		uint8_t b = p[n - k];
		if ((b & 0xc0) == 0x80)
			continue;
		size_t want = (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 1;
		return want > k ? k : 0;
	}
	return 0;
}

static size_t
max_stop(const sv_req *r)
{
	size_t m = 0;
	for (int i = 0; i < r->nstop; i++)
		m = RL_MAX(m, strlen(r->stop[i]));
	for (int i = 0; i < r->sv->g->o.nstop; i++)
		m = RL_MAX(m, strlen(r->sv->g->o.stops[i]));
	return m;
}

/* Where the first stop string in c's text starts (its length when none). */
static size_t
first_stop(const sv_req *r, const sv_choice *c)
{
	size_t end = c->raw.len;

	for (int i = 0; i < r->nstop + r->sv->g->o.nstop; i++) {
		const char *st = i < r->nstop ? r->stop[i] : r->sv->g->o.stops[i - r->nstop];
		const uint8_t *at = *st ? memmem(c->raw.p, c->raw.len, st, strlen(st)) : NULL;
		if (at && (size_t)(at - c->raw.p) < end)
			end = (size_t)(at - c->raw.p);
	}
	return end;
}

size_t
sv_text_end(const sv_req *r, const sv_choice *c)
{
	return c->finish == RL_FINISH_STOP ? first_stop(r, c) : c->raw.len;
}

size_t
sv_ready_len(const sv_req *r, const sv_choice *c)
{
	size_t n = c->raw.len, ms;

	if (c->finish)
		return sv_text_end(r, c);
	n -= utf8_open_tail(c->raw.p, n);
	ms = max_stop(r);
	if (ms == 0)
		return n;
	/* the token callback runs before the engine looks for stop strings: a stop
	 * string the last token completed is in the text already, and never goes out */
	n = RL_MIN(n, first_stop(r, c));
	return n > ms - 1 ? n - (ms - 1) : 0;
}

char *
sv_final_text(const sv_req *r, const sv_choice *c, size_t from, size_t to)
{
	(void)r;
	return utf8_clean(c->raw.p + from, to > from ? to - from : 0);
}

/* ---- errors ----------------------------------------------------------------------------------------- */

char *
sv_error_json(int status, const char *msg, const char *param)
{
	const char *type = "invalid_request_error", *code = NULL;
	cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
	char *s;

	switch (status) {
	case 401: type = "invalid_request_error"; code = "invalid_api_key"; break;
	case 404: code = strstr(msg, "model") ? "model_not_found" : "unknown_url"; break;
	case 413: code = "request_too_large"; break;
	case 429: type = "rate_limit_error"; code = "rate_limit_exceeded"; break;
	case 500: type = "server_error"; break;
	case 503: type = "server_error"; code = "service_unavailable"; break;
	}
	cJSON_AddStringToObject(e, "message", msg);
	cJSON_AddStringToObject(e, "type", type);
	if (param && *param)
		cJSON_AddStringToObject(e, "param", param);
	else
		cJSON_AddNullToObject(e, "param");
	if (code)
		cJSON_AddStringToObject(e, "code", code);
	else
		cJSON_AddNullToObject(e, "code");
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return s;
}

int
sv_auth_ok(const serve *s, const char *authz)
{
	size_t kl = strlen(s->key), al;
	unsigned diff = 0;

	if (!s->key[0])
		return 1;
	if (!authz || strncmp(authz, "Bearer ", 7) != 0)
		return 0;
	authz += 7;
	al = strlen(authz);
	/* every byte of the key is compared whatever the first difference */
	for (size_t i = 0; i < kl; i++)
		diff |= (unsigned)(uint8_t)s->key[i] ^ (unsigned)(uint8_t)(i < al ? authz[i] : 0);
	return diff == 0 && al == kl;
}

/* ---- requests --------------------------------------------------------------------------------------- */

#define FAIL(st, p, ...) do { snprintf(param, pl, "%s", p); snprintf(msg, ml, __VA_ARGS__); return st; } while (0)

static int
is_set(const cJSON *v)
{
	return v && !cJSON_IsNull(v);
}

/* A field the server does not implement: refused unless absent or at its no-op value. */
static int
unsupported(const cJSON *b, char *msg, size_t ml, char *param, size_t pl)
{
	static const char *const zero_ok[] = { "presence_penalty", "frequency_penalty" };
	const cJSON *v;

	for (size_t i = 0; i < RL_ARRAY_LEN(zero_ok); i++)
		if (is_set(v = cJSON_GetObjectItemCaseSensitive(b, zero_ok[i])) &&
		    (!cJSON_IsNumber(v) || v->valuedouble != 0))
			FAIL(400, zero_ok[i], "'%s' is not supported by this server (only 0)", zero_ok[i]);
	if (is_set(v = cJSON_GetObjectItemCaseSensitive(b, "logit_bias")) && cJSON_GetArraySize(v) > 0)
		FAIL(400, "logit_bias", "'logit_bias' is not supported by this server");
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "echo")))
		FAIL(400, "echo", "'echo' is not supported by this server");
	if (is_set(v = cJSON_GetObjectItemCaseSensitive(b, "best_of")) && (!cJSON_IsNumber(v) || v->valuedouble != 1))
		FAIL(400, "best_of", "'best_of' is not supported by this server (only 1)");
	if (is_set(cJSON_GetObjectItemCaseSensitive(b, "suffix")))
		FAIL(400, "suffix", "'suffix' is not supported by this server");
	return 0;
}

static int
get_int(const cJSON *b, const char *k, long lo, long hi, long *out, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, k);

	if (!is_set(v))
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble)
		FAIL(400, k, "'%s' must be an integer", k);
	if (v->valuedouble < lo || v->valuedouble > hi)
		FAIL(400, k, "'%s' is %.0f; it must be in [%ld, %ld]", k, v->valuedouble, lo, hi);
	*out = (long)v->valuedouble;
	return 0;
}

static int
get_num(const cJSON *b, const char *k, double lo, double hi, double *out, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, k);

	if (!is_set(v))
		return 0;
	if (!cJSON_IsNumber(v))
		FAIL(400, k, "'%s' must be a number", k);
	if (v->valuedouble < lo || v->valuedouble > hi)
		FAIL(400, k, "'%s' is %g; it must be in [%g, %g]", k, v->valuedouble, lo, hi);
	*out = v->valuedouble;
	return 0;
}

static int
parse_stop(sv_req *r, const cJSON *v, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *it;

	if (!is_set(v))
		return 0;
	if (cJSON_IsString(v)) {
		if (*v->valuestring)
			r->stop[r->nstop++] = v->valuestring;
		return 0;
	}
	if (!cJSON_IsArray(v))
		FAIL(400, "stop", "'stop' must be a string or a list of strings");
	if (cJSON_GetArraySize(v) > SV_MAX_STOP)
		FAIL(400, "stop", "'stop' holds %d strings; at most %d", cJSON_GetArraySize(v), SV_MAX_STOP);
	cJSON_ArrayForEach(it, v) {
		if (!cJSON_IsString(it))
			FAIL(400, "stop", "'stop' must be a string or a list of strings");
		if (*it->valuestring)
			r->stop[r->nstop++] = it->valuestring;
	}
	return 0;
}

/* tools / tool_choice, as OpenAI's chat API takes them. */
static int
parse_tools(sv_req *r, const cJSON *b, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "tools");
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(b, "tool_choice"), *it;
	int i = 0;

	if (is_set(t) && r->kind != SV_CHAT)
		FAIL(400, "tools", "'tools' is a field of /v1/chat/completions");
	if (is_set(c) && r->kind != SV_CHAT)
		FAIL(400, "tool_choice", "'tool_choice' is a field of /v1/chat/completions");
	if (is_set(t)) {
		if (!cJSON_IsArray(t))
			FAIL(400, "tools", "'tools' must be a list of tools");
		cJSON_ArrayForEach(it, t) {
			const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
			const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
			if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0)
				FAIL(400, "tools", "'tools'[%d]: \"type\" must be \"function\"", i);
			if (!cJSON_IsObject(f) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
				FAIL(400, "tools", "'tools'[%d]: \"function\" must be an object with a string \"name\"", i);
			i++;
		}
		if (i > 0)
			r->tools = t;
	}
	if (is_set(c)) {
		if (cJSON_IsObject(c))
			FAIL(400, "tool_choice", "'tool_choice' naming a function is not supported by this server "
			    "(only \"auto\" and \"none\")");
		if (!cJSON_IsString(c))
			FAIL(400, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object");
		if (strcmp(c->valuestring, "required") == 0)
			FAIL(400, "tool_choice", "'tool_choice' \"required\" is not supported by this server (only "
			    "\"auto\" and \"none\")");
		if (strcmp(c->valuestring, "auto") != 0 && strcmp(c->valuestring, "none") != 0)
			FAIL(400, "tool_choice", "'tool_choice' is \"%.40s\"; it must be \"auto\" or \"none\"",
			    c->valuestring);
		if (strcmp(c->valuestring, "auto") == 0 && !r->tools)
			FAIL(400, "tool_choice", "'tool_choice' \"auto\" needs 'tools'");
	}
	r->tool_parse = r->tools && !(cJSON_IsString(c) && strcmp(c->valuestring, "none") == 0);
	return 0;
}

/* logprobs / top_logprobs: chat takes a boolean and 0..20, completions an integer 0..20. */
static int
parse_logprobs(sv_req *r, const cJSON *b, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "logprobs");
	long top = 0;
	int st;

	if (r->kind == SV_CHAT) {
		if (is_set(v) && !cJSON_IsBool(v))
			FAIL(400, "logprobs", "'logprobs' must be a boolean");
		r->logprobs = cJSON_IsTrue(v);
		if ((st = get_int(b, "top_logprobs", 0, 20, &top, msg, ml, param, pl)) != 0)
			return st;
		if (top > 0 && !r->logprobs)
			FAIL(400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
		r->top = (int)top;
		return 0;
	}
	if ((st = get_int(b, "logprobs", 0, RL_GEN_MAX_TOP, &top, msg, ml, param, pl)) != 0)
		return st;
	r->logprobs = is_set(v);
	r->top = (int)top;
	return 0;
}

int
sv_parse(serve *s, sv_req *r, char *msg, size_t ml, char *param, size_t pl)
{
	const cJSON *b = r->body, *v;
	long n = 1, mt = 0;
	double t = 1.0, tp = 1.0;
	int st;

	if (!cJSON_IsObject(b))
		FAIL(400, "", "the request body must be a JSON object");
	v = cJSON_GetObjectItemCaseSensitive(b, "model");
	if (!cJSON_IsString(v))
		FAIL(400, "model", "'model' is required (a string)");
	if (strcmp(v->valuestring, s->name) != 0)
		FAIL(404, "model", "The model '%.200s' does not exist; this server serves '%s'", v->valuestring, s->name);
	if (r->kind == SV_CHAT) {
		v = cJSON_GetObjectItemCaseSensitive(b, "messages");
		if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
			FAIL(400, "messages", "'messages' is required (a non-empty list of messages)");
	} else {
		v = cJSON_GetObjectItemCaseSensitive(b, "prompt");
		if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 && cJSON_IsString(cJSON_GetArrayItem(v, 0)))
			FAIL(400, "prompt", "a list of prompts is not supported by this server: one request per prompt");
		if (!cJSON_IsString(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0))
			FAIL(400, "prompt", "'prompt' is required (a string or a list of token ids)");
	}
	if ((st = unsupported(b, msg, ml, param, pl)) != 0)
		return st;
	if ((st = get_int(b, "n", 1, RL_MIN(SV_MAX_N, s->g->o.go.slots), &n, msg, ml, param, pl)) != 0 ||
	    (st = get_int(b, "max_tokens", 1, 100000000, &mt, msg, ml, param, pl)) != 0 ||
	    (st = get_int(b, "max_completion_tokens", 1, 100000000, &mt, msg, ml, param, pl)) != 0 ||
	    (st = get_num(b, "temperature", 0, 2, &t, msg, ml, param, pl)) != 0 ||
	    (st = get_num(b, "top_p", 0, 1, &tp, msg, ml, param, pl)) != 0)
		return st;
	if (tp <= 0)
		FAIL(400, "top_p", "'top_p' must be above 0");
	if (r->episode[0] && n > 1)
		FAIL(400, "n", "an episode's call takes one sample ('n': 1)");
	if (r->episode[0] && r->kind == SV_COMPLETIONS && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "prompt")))
		FAIL(400, "prompt", "an episode's completion call takes a text prompt");
	r->n = (int)n;
	r->max_tokens = (int)mt;
	/* below 1e-5 is greedy, as --temperature and vLLM take it */
	r->sp = (rl_sample_params){ t < 1e-5 ? 0.0f : (float)t, s->g->o.go.sp.top_k, (float)tp };
	v = cJSON_GetObjectItemCaseSensitive(b, "seed");
	if (is_set(v)) {
		if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble)
			FAIL(400, "seed", "'seed' must be an integer");
		r->seed = (uint64_t)(long long)v->valuedouble;
		r->has_seed = 1;
	}
	if ((st = parse_stop(r, cJSON_GetObjectItemCaseSensitive(b, "stop"), msg, ml, param, pl)) != 0 ||
	    (st = parse_logprobs(r, b, msg, ml, param, pl)) != 0 ||
	    (st = parse_tools(r, b, msg, ml, param, pl)) != 0)
		return st;
	v = cJSON_GetObjectItemCaseSensitive(b, "return_tokens_as_token_ids");
	if (is_set(v) && !cJSON_IsBool(v))
		FAIL(400, "return_tokens_as_token_ids", "'return_tokens_as_token_ids' must be a boolean");
	r->token_ids = cJSON_IsTrue(v);
	v = cJSON_GetObjectItemCaseSensitive(b, "stream");
	if (is_set(v) && !cJSON_IsBool(v))
		FAIL(400, "stream", "'stream' must be a boolean");
	r->stream = cJSON_IsTrue(v);
	v = cJSON_GetObjectItemCaseSensitive(b, "stream_options");
	if (is_set(v)) {
		if (!r->stream)
			FAIL(400, "stream_options", "'stream_options' is only allowed with 'stream': true");
		r->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "include_usage"));
	}
	return 0;
}

/* ---- answers ---------------------------------------------------------------------------------------- */

static const char *
finish_reason(int f)
{
	return f == RL_FINISH_LENGTH ? "length" : f == RL_FINISH_ABORT ? "abort" : "stop";
}

static cJSON *
head(serve *s, sv_req *r, const char *object)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "id", r->id);
	cJSON_AddStringToObject(o, "object", object);
	cJSON_AddNumberToObject(o, "created", (double)r->created);
	cJSON_AddStringToObject(o, "model", s->name);
	return o;
}

/* The text of token t as the log-probs show it ("token_id:N" with return_tokens_as_token_ids);
 * malloc'd, its bytes in *bytes, *bl. */
static char *
token_text(serve *s, sv_req *r, int32_t t, const char **bytes, size_t *bl)
{
	char idt[32];

	*bl = 0;
	*bytes = rl_tokenizer_token(s->g->tok, t, bl);
	/* vLLM's return_tokens_as_token_ids: "token_id:N", what a client needs to
	 * rebuild the exact tokens */
	snprintf(idt, sizeof idt, "token_id:%d", (int)t);
	return r->token_ids ? strdup(idt) : utf8_clean((const uint8_t *)(*bytes ? *bytes : ""), *bytes ? *bl : 0);
}

/* Token i's top list: chat's [{token, logprob, bytes}] into arr, or completions'
 * {token: logprob} appended to list (a token text seen twice keeps the likelier). */
static void
top_json(serve *s, sv_req *r, const sv_choice *c, int i, cJSON *arr, cJSON *list)
{
	cJSON *d = list ? cJSON_CreateObject() : NULL;

	for (int k = 0; c->top_id && k < r->top; k++) {
		int32_t t = c->top_id[(size_t)i * r->top + k];
		const char *bytes;
		size_t bl;
		char *txt;
		if (t < 0 || !(txt = token_text(s, r, t, &bytes, &bl)))
			continue;
		if (arr) {
			cJSON *e = cJSON_CreateObject(), *ba;
			cJSON_AddStringToObject(e, "token", txt);
			cJSON_AddNumberToObject(e, "logprob", c->top_lp[(size_t)i * r->top + k]);
			ba = cJSON_AddArrayToObject(e, "bytes");
			for (size_t b = 0; bytes && b < bl; b++)
				cJSON_AddItemToArray(ba, cJSON_CreateNumber((uint8_t)bytes[b]));
			cJSON_AddItemToArray(arr, e);
		} else if (!cJSON_GetObjectItemCaseSensitive(d, txt)) {
			cJSON_AddNumberToObject(d, txt, c->top_lp[(size_t)i * r->top + k]);
		}
		free(txt);
	}
	if (list)
		cJSON_AddItemToArray(list, d);
}

/* The log-probs of tokens [from, to) of c, in the request kind's shape. */
static cJSON *
logprobs_json(serve *s, sv_req *r, const sv_choice *c, int from, int to)
{
	cJSON *o = cJSON_CreateObject(), *content = NULL, *toks = NULL, *lps = NULL, *offs = NULL, *tops = NULL;
	size_t off = 0;

	if (r->kind == SV_CHAT) {
		content = cJSON_AddArrayToObject(o, "content");
	} else {
		toks = cJSON_AddArrayToObject(o, "tokens");
		lps = cJSON_AddArrayToObject(o, "token_logprobs");
		if (r->top > 0)
			tops = cJSON_AddArrayToObject(o, "top_logprobs");
		else
			cJSON_AddNullToObject(o, "top_logprobs");
		offs = cJSON_AddArrayToObject(o, "text_offset");
	}
	for (int i = from; i < to; i++) {
		size_t bl = 0;
		const char *bytes = rl_tokenizer_token(s->g->tok, c->tok[i], &bl);
		char idt[32], *txt;
		/* vLLM's return_tokens_as_token_ids: "token_id:N", what a client needs to
		 * rebuild the exact tokens */
		snprintf(idt, sizeof idt, "token_id:%d", (int)c->tok[i]);
		txt = r->token_ids ? strdup(idt) : utf8_clean((const uint8_t *)(bytes ? bytes : ""), bytes ? bl : 0);
		if (!txt)
			break;
		if (content) {
			cJSON *e = cJSON_CreateObject(), *ba = cJSON_AddArrayToObject(e, "bytes");
			cJSON_AddStringToObject(e, "token", txt);
			cJSON_AddNumberToObject(e, "logprob", c->logp[i]);
			for (size_t k = 0; k < bl; k++)
				cJSON_AddItemToArray(ba, cJSON_CreateNumber((uint8_t)bytes[k]));
			top_json(s, r, c, i, cJSON_AddArrayToObject(e, "top_logprobs"), NULL);
			cJSON_AddItemToArray(content, e);
		} else {
			if (tops)
				top_json(s, r, c, i, NULL, tops);
			cJSON_AddItemToArray(toks, cJSON_CreateString(txt));
			cJSON_AddItemToArray(lps, cJSON_CreateNumber(c->logp[i]));
			cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
			off += strlen(txt);
		}
		free(txt);
	}
	return o;
}

static void
add_usage(cJSON *o, const sv_req *r)
{
	cJSON *u = cJSON_AddObjectToObject(o, "usage");
	int gen = 0;

	for (int i = 0; i < r->n; i++)
		gen += r->ch[i].n;
	cJSON_AddNumberToObject(u, "prompt_tokens", r->plen);
	cJSON_AddNumberToObject(u, "completion_tokens", gen);
	cJSON_AddNumberToObject(u, "total_tokens", r->plen + gen);
}

char *
sv_answer_json(serve *s, sv_req *r)
{
	cJSON *o = head(s, r, r->kind == SV_CHAT ? "chat.completion" : "text_completion");
	cJSON *chs = cJSON_AddArrayToObject(o, "choices");
	char *out;

	for (int i = 0; i < r->n; i++) {
		const sv_choice *c = &r->ch[i];
		cJSON *e = cJSON_CreateObject();
		char *txt = sv_final_text(r, c, 0, sv_text_end(r, c));
		cJSON_AddNumberToObject(e, "index", i);
		cJSON *calls = NULL;
		if (r->kind == SV_CHAT) {
			cJSON *m = cJSON_AddObjectToObject(e, "message");
			char *content = NULL;
			cJSON_AddStringToObject(m, "role", "assistant");
			if (r->tool_parse && txt && sv_tools_parse(txt, r->id, &content, &calls) == 0) {
				if (content)
					cJSON_AddStringToObject(m, "content", content);
				else
					cJSON_AddNullToObject(m, "content");
				free(content);
			} else {
				cJSON_AddStringToObject(m, "content", txt ? txt : "");
			}
			/* vLLM answers an empty list when tools were offered and none called */
			if (calls)
				cJSON_AddItemToObject(m, "tool_calls", calls);
			else if (r->tools)
				cJSON_AddArrayToObject(m, "tool_calls");
		} else {
			cJSON_AddStringToObject(e, "text", txt ? txt : "");
		}
		free(txt);
		if (r->logprobs)
			cJSON_AddItemToObject(e, "logprobs", logprobs_json(s, r, c, 0, c->n));
		else
			cJSON_AddNullToObject(e, "logprobs");
		cJSON_AddStringToObject(e, "finish_reason", calls ? "tool_calls" : finish_reason(c->finish));
		cJSON_AddItemToArray(chs, e);
	}
	add_usage(o, r);
	out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return out;
}

char *
sv_models_json(serve *s, int one)
{
	cJSON *m = cJSON_CreateObject(), *o;
	char *out;

	cJSON_AddStringToObject(m, "id", s->name);
	cJSON_AddStringToObject(m, "object", "model");
	cJSON_AddNumberToObject(m, "created", 0);
	cJSON_AddStringToObject(m, "owned_by", "rlpipe");
	cJSON_AddNumberToObject(m, "max_model_len", s->g->m->cfg.max_pos);
	if (one) {
		o = m;
	} else {
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "object", "list");
		cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
	}
	out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return out;
}

/* ---- streams ---------------------------------------------------------------------------------------- */

static int
put_event(rl_buf *out, cJSON *o)
{
	char *s = cJSON_PrintUnformatted(o);
	int rv;

	cJSON_Delete(o);
	if (!s)
		return RL_ENOMEM;
	rv = rl_buf_printf(out, "data: %s\n\n", s);
	free(s);
	return rv;
}

/* One chunk of choice i: delta text (NULL: none), log-probs of tokens [lf, lt), finish reason. */
static int
chunk(serve *s, sv_req *r, int i, int role, const char *text, int lf, int lt, const char *fin, rl_buf *out)
{
	cJSON *o = head(s, r, r->kind == SV_CHAT ? "chat.completion.chunk" : "text_completion");
	cJSON *e = cJSON_CreateObject();

	cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
	cJSON_AddNumberToObject(e, "index", i);
	if (r->kind == SV_CHAT) {
		cJSON *d = cJSON_AddObjectToObject(e, "delta");
		if (role)
			cJSON_AddStringToObject(d, "role", "assistant");
		if (text)
			cJSON_AddStringToObject(d, "content", text);
	} else {
		cJSON_AddStringToObject(e, "text", text ? text : "");
	}
	if (r->logprobs && lt > lf)
		cJSON_AddItemToObject(e, "logprobs", logprobs_json(s, r, &r->ch[i], lf, lt));
	else
		cJSON_AddNullToObject(e, "logprobs");
	if (fin)
		cJSON_AddStringToObject(e, "finish_reason", fin);
	else
		cJSON_AddNullToObject(e, "finish_reason");
	return put_event(out, o);
}

/* Bytes of raw[0..n) that may go out as content when tool calls are parsed:
 * none from the first "<tool_call>" on, nor a tail that may begin one. */
static size_t
tool_hold(const uint8_t *p, size_t n)
{
	static const char tag[] = "<tool_call>";
	size_t tl = sizeof tag - 1;

	for (size_t i = 0; i < n; i++) {
		size_t k = RL_MIN(tl, n - i);
		if (p[i] == '<' && memcmp(p + i, tag, k) == 0)
			return i;
	}
	return n;
}

/* The final chunk of a stream whose answer holds tool calls: all the calls
 * in one delta, each with its index, id, name and whole arguments (the shape
 * of OpenAI's first delta of a call, the arguments not split). */
static int
tool_chunk(serve *s, sv_req *r, int i, cJSON *calls, rl_buf *out)
{
	cJSON *o = head(s, r, "chat.completion.chunk"), *e = cJSON_CreateObject(), *d, *it;
	int k = 0;

	cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
	cJSON_AddNumberToObject(e, "index", i);
	d = cJSON_AddObjectToObject(e, "delta");
	cJSON_ArrayForEach(it, calls)
		cJSON_AddNumberToObject(it, "index", k++);
	cJSON_AddItemToObject(d, "tool_calls", calls);
	cJSON_AddNullToObject(e, "logprobs");
	cJSON_AddStringToObject(e, "finish_reason", "tool_calls");
	return put_event(out, o);
}

int
sv_stream_chunks(serve *s, sv_req *r, int i, rl_buf *out)
{
	sv_choice *c = &r->ch[i];
	size_t ready = sv_ready_len(r, c), end = ready;
	cJSON *calls = NULL;
	int rv = RL_OK;

	if (r->tool_parse) {
		ready = tool_hold(c->raw.p, ready);
		if (c->finish && ready < end) {
			char *txt = sv_final_text(r, c, 0, end), *content = NULL;
			if (!txt || sv_tools_parse(txt, r->id, &content, &calls) != 0) {
				free(txt);
				return RL_ENOMEM;
			}
			free(txt);
			free(content);
			/* no call parsed: the held text goes out as content */
			if (!calls)
				ready = end;
		}
	}

	if (!c->started && r->kind == SV_CHAT)
		rv = chunk(s, r, i, 1, "", 0, 0, NULL, out);
	c->started = 1;
	if (rv == 0 && (ready > c->sent || (r->logprobs && c->n > c->lp_sent))) {
		char *txt = sv_final_text(r, c, c->sent, RL_MAX(ready, c->sent));
		if (!txt)
			return RL_ENOMEM;
		rv = chunk(s, r, i, 0, txt, c->lp_sent, c->n, NULL, out);
		free(txt);
		c->sent = RL_MAX(ready, c->sent);
		c->lp_sent = c->n;
	}
	if (rv == 0 && calls)
		return tool_chunk(s, r, i, calls, out);
	cJSON_Delete(calls);
	if (rv == 0 && c->finish)
		rv = chunk(s, r, i, 0, r->kind == SV_CHAT ? NULL : "", 0, 0, finish_reason(c->finish), out);
	return rv;
}

int
sv_stream_end(serve *s, sv_req *r, rl_buf *out)
{
	int rv = RL_OK;

	if (r->include_usage) {
		cJSON *o = head(s, r, r->kind == SV_CHAT ? "chat.completion.chunk" : "text_completion");
		cJSON_AddArrayToObject(o, "choices");
		add_usage(o, r);
		rv = put_event(out, o);
	}
	return rv ? rv : rl_buf_printf(out, "data: [DONE]\n\n");
}

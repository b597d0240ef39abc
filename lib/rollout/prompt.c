/*
 * prompt.c — prompt lines to prompt records (see prompt.h).
 */
#include "rollout/prompt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/json.h"

/* A prompt is text or a non-empty list of message objects.  A list of
 * anything else (numbers above all) is not: in rl-trajectory(5) "prompt" is
 * the I32[] token-id field, and such a line is a record. */
static int
is_prompt_value(const cJSON *p)
{
	const cJSON *m;

	if (cJSON_IsString(p))
		return 1;
	if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
		return 0;
	cJSON_ArrayForEach(m, p)
		if (!cJSON_IsObject(m))
			return 0;
	return 1;
}

void
rl_prompt_chat_fini(rl_prompt_chat *c)
{
	if (!c)
		return;
	for (size_t i = 0; c->own && i < c->n; i++)
		free(c->own[i]);
	free(c->own);
	free(c->msgs);
	memset(c, 0, sizeof(*c));
}

/* The text of content parts (an array), joined with "\n", into a new
 * string; NULL (logged) for a part that is not text. */
static char *
join_parts(const cJSON *parts, const char *what, size_t k)
{
	size_t len = 0, i = 0;
	const cJSON *x;
	char *s, *o;

	cJSON_ArrayForEach(x, parts) {
		const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
		const cJSON *tx = cJSON_GetObjectItemCaseSensitive(x, "text");
		i++;
		if (cJSON_IsString(x)) {
			len += strlen(x->valuestring) + 1;
			continue;
		}
		if (!cJSON_IsObject(x) || !cJSON_IsString(ty)) {
			rl_error("%s: message %zu: content part %zu is not an object with a \"type\"", what, k, i);
			return NULL;
		}
		if (strcmp(ty->valuestring, "text") != 0) {
			rl_error("%s: message %zu: content part %zu is of type \"%s\"; rlpipe renders text only",
			    what, k, i, ty->valuestring);
			rl_hint("keep the text parts ({\"type\": \"text\", \"text\": ..}) and drop the others");
			return NULL;
		}
		if (!cJSON_IsString(tx)) {
			rl_error("%s: message %zu: content part %zu (text) needs a string \"text\"", what, k, i);
			return NULL;
		}
		len += strlen(tx->valuestring) + 1;
	}
	o = s = rl_xmalloc(len + 1);
	cJSON_ArrayForEach(x, parts) {
		const char *t = cJSON_IsString(x) ? x->valuestring
						  : cJSON_GetObjectItemCaseSensitive(x, "text")->valuestring;
		size_t n = strlen(t);
		if (o != s)
			*o++ = '\n';
		memcpy(o, t, n);
		o += n;
	}
	*o = 0;
	return s;
}

int
rl_prompt_chat_parse(rl_prompt_chat *c, const cJSON *msgs, const cJSON *kwargs, const char *what)
{
	const cJSON *m, *x;
	size_t n = (size_t)cJSON_GetArraySize(msgs);

	memset(c, 0, sizeof(*c));
	c->thinking = -1;
	if (kwargs && !cJSON_IsNull(kwargs)) {
		if (!cJSON_IsObject(kwargs)) {
			rl_error("%s: \"chat_template_kwargs\" must be an object", what);
			return RL_EFORMAT;
		}
		cJSON_ArrayForEach(x, kwargs) {
			if (strcmp(x->string, "enable_thinking") != 0) {
				/* rlpipe renders templates in C: no other argument reaches them */
				rl_error("%s: chat_template_kwargs: \"%s\" is not one rlpipe knows (enable_thinking)",
				    what, x->string);
				return RL_EFORMAT;
			}
			if (!cJSON_IsBool(x)) {
				rl_error("%s: chat_template_kwargs: \"enable_thinking\" must be true or false", what);
				return RL_EFORMAT;
			}
			c->thinking = cJSON_IsTrue(x);
		}
	}
	if (!msgs)
		return 0;
	if (!cJSON_IsArray(msgs)) {
		rl_error("%s: the messages are not a list", what);
		return RL_EFORMAT;
	}
	c->msgs = rl_xcalloc(n ? n : 1, sizeof(*c->msgs));
	c->own = rl_xcalloc(n ? n : 1, sizeof(*c->own));
	cJSON_ArrayForEach(m, msgs) {
		const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
		const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
		const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
		const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
		size_t k = c->n + 1;
		rl_chat_msg *o = &c->msgs[c->n];

		if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
			rl_error("%s: message %zu needs a string \"role\"", what, k);
			return RL_EFORMAT;
		}
		o->role = role->valuestring;
		if (cJSON_IsString(content)) {
			o->content = content->valuestring;
		} else if (cJSON_IsArray(content)) {
			if (!(c->own[c->n] = join_parts(content, what, k)))
				return RL_EFORMAT;
			o->content = c->own[c->n];
		} else {
			rl_error("%s: message %zu: \"content\" must be text or a list of content parts (it is %s)",
			    what, k, content ? rl_json_type_name(content) : "missing");
			return RL_EFORMAT;
		}
		if (rc && !cJSON_IsNull(rc)) {
			if (!cJSON_IsString(rc)) {
				rl_error("%s: message %zu: \"reasoning_content\" must be text", what, k);
				return RL_EFORMAT;
			}
			o->reasoning = rc->valuestring;
		}
		if (tc && !cJSON_IsNull(tc) && !(cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0)) {
			rl_error("%s: message %zu: tool calls are not rendered by rlpipe's chat templates", what, k);
			rl_hint("render such chats beforehand with the model's own template and give the text");
			return RL_EFORMAT;
		}
		c->n++;
	}
	return 0;
}

int
rl_prompt_line_is(const char *line, size_t n)
{
	cJSON *j = rl_json_parse_all(line, n);
	int ok = j && cJSON_IsObject(j) && is_prompt_value(cJSON_GetObjectItemCaseSensitive(j, "prompt"));
	cJSON_Delete(j);
	return ok;
}

static int
take_u64(cJSON *j, const char *key, uint64_t *out)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
	if (!v || !cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
	    v->valuedouble != floor(v->valuedouble))
		return 0;
	*out = (uint64_t)v->valuedouble;
	cJSON_DeleteItemFromObjectCaseSensitive(j, key);
	return 1;
}

int
rl_prompt_line_to_traj(rl_traj *t, const char *line, size_t n, const char *what)
{
	cJSON *j = rl_json_parse_all(line, n), *p;
	char *meta = NULL;
	uint64_t u;
	int rv = RL_EFORMAT, k;

	rl_traj_clear(t);
	if (memchr(line, 0, n) != NULL) {
		/* cJSON would cut a string there: the prompt or meta would change silently */
		rl_error("%s: a NUL byte at byte %zu, which JSON text cannot hold", what,
		         (size_t)((const char *)memchr(line, 0, n) - line));
		goto out;
	}
	if (!j || !cJSON_IsObject(j)) {
		rl_error("%s: not a JSON object", what);
		goto out;
	}
	if ((k = rl_json_nul_member(line, n)) >= 0) {
		/* cJSON would cut the string there: the prompt or meta would change silently */
		p = cJSON_GetArrayItem(j, k);
		rl_error("%s: field '%s': \\u0000 (NUL) in its name or value, which text and meta fields cannot hold",
		         what, p && p->string ? p->string : "?");
		goto out;
	}
	if (rl_json_dup_key(j)) {
		/* cJSON finds the first, Python's json (the data's likely writer) the last */
		rl_error("%s: key \"%s\" appears twice", what, rl_json_dup_key(j));
		goto out;
	}
	p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
	if (!p || !is_prompt_value(p)) {
		rl_error("%s: \"prompt\" must be a string or a list of message objects", what);
		rl_hint("a line whose \"prompt\" holds token ids is a record: put it in a file of records");
		goto out;
	}
	if (cJSON_IsArray(p) || cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs")) {
		/* refused here, not by every rl-rollout that leases it */
		rl_prompt_chat c;
		int crv = rl_prompt_chat_parse(&c, cJSON_IsArray(p) ? p : NULL,
		    cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs"), what);
		rl_prompt_chat_fini(&c);
		if (crv != 0)
			goto out;
	}
	if (cJSON_IsString(p)) {
		if ((rv = rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, p->valuestring)) != 0) {
			rl_error("%s: the prompt is not valid UTF-8 text", what);
			goto out;
		}
		cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
	}
	if (take_u64(j, "id", &u))
		rl_traj_set_u64(t, RL_TAG_ID, u);
	if (take_u64(j, "group", &u))
		rl_traj_set_u64(t, RL_TAG_GROUP, u);
	meta = rl_json_print(j);
	rv = rl_traj_set_json(t, RL_TAG_META, meta);
out:
	free(meta);
	cJSON_Delete(j);
	return rv;
}

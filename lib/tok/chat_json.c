/*
 * chat_json.c — chat messages from JSON into rl_chat_msg (chat_json.h):
 * roles, text content or text content parts, reasoning_content, and the
 * chat_template_kwargs rlpipe knows.
 * Leaves out: non-text content parts and tool calls (refused, named).
 */
#include "tok/chat_json.h"

#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/json.h"

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
 * string *out (the caller's); RL_EFORMAT (logged) for a part that is not
 * text. */
static int
join_parts(char **out, const cJSON *parts, const char *what, size_t k)
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
			return RL_EFORMAT;
		}
		if (strcmp(ty->valuestring, "text") != 0) {
			rl_error("%s: message %zu: content part %zu is of type \"%s\"; rlpipe renders text only",
			    what, k, i, ty->valuestring);
			rl_hint("keep the text parts ({\"type\": \"text\", \"text\": ..}) and drop the others");
			return RL_EFORMAT;
		}
		if (!cJSON_IsString(tx)) {
			rl_error("%s: message %zu: content part %zu (text) needs a string \"text\"", what, k, i);
			return RL_EFORMAT;
		}
		len += strlen(tx->valuestring) + 1;
	}
	if (!(o = s = rl_try_malloc(len + 1, "chat message")))
		return RL_ENOMEM;
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
	*out = s;
	return RL_OK;
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
	if (!(c->msgs = rl_try_calloc(n ? n : 1, sizeof(*c->msgs), "chat messages")) ||
	    !(c->own = rl_try_calloc(n ? n : 1, sizeof(*c->own), "chat messages")))
		return RL_ENOMEM;
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
		if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0 && (!content || cJSON_IsNull(content))) {
			o->content = ""; /* a turn of tool calls alone */
		} else if (cJSON_IsString(content)) {
			o->content = content->valuestring;
		} else if (cJSON_IsArray(content)) {
			int jrv = join_parts(&c->own[c->n], content, what, k);
			if (jrv != RL_OK)
				return jrv;
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
			const cJSON *it;
			int j = 0;
			if (!cJSON_IsArray(tc)) {
				rl_error("%s: message %zu: \"tool_calls\" must be a list", what, k);
				return RL_EFORMAT;
			}
			cJSON_ArrayForEach(it, tc) {
				const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
				j++;
				if (!cJSON_IsObject(f) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name"))) {
					rl_error("%s: message %zu: tool call %d needs a \"function\" with a string \"name\"",
					    what, k, j);
					return RL_EFORMAT;
				}
			}
			o->tool_calls = tc;
		}
		c->n++;
	}
	return 0;
}


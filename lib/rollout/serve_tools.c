/*
 * serve_tools.c — tool calls in a chat answer: the Hermes format that
 * Qwen2.5's and Qwen3's chat templates (and Hermes models) teach, where the
 * model writes each call as
 *   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 * parsed back into OpenAI's `tool_calls` as vLLM's hermes tool parser does:
 * the text before the first <tool_call> is the content (null when empty), a
 * last block the model did not close is still read, and when any block is
 * not a JSON object with a string "name" and an "arguments" the whole text
 * stays content with no tool calls.
 * Leaves out: other families' formats (Llama 3's JSON, Mistral's
 * [TOOL_CALLS], ...), and streaming the calls as they are generated.
 */
#include "rollout/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/hash.h"

static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>";

/* p[0..n) as a new string, or NULL (logged) when there is no memory for it. */
static char *
copy(const char *p, size_t n)
{
	char *o = rl_try_malloc(n + 1, "tool call text");

	if (o) {
		memcpy(o, p, n);
		o[n] = 0;
	}
	return o;
}

/* One call as OpenAI writes it; NULL when BLOCK[0..n) is not a Hermes call
 * (or on no memory: either way the text stays content). */
static cJSON *
one_call(const char *block, size_t n, const char *rid, int k)
{
	char *txt = copy(block, n), id[40];
	cJSON *j = txt ? cJSON_Parse(txt) : NULL, *name, *args, *o = NULL, *f;
	char *astr = NULL;

	free(txt);
	name = cJSON_GetObjectItemCaseSensitive(j, "name");
	args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
	/* vLLM reads call["name"] and call["arguments"]: either missing fails the parse */
	if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !args)
		goto out;
	/* the same JSON value, compact as OpenAI writes arguments (vLLM's
	 * json.dumps puts spaces after ':' and ','; a client parses either) */
	if (!(astr = cJSON_PrintUnformatted(args)))
		goto out;
	/* a stable id per request and position, so a replayed answer is the same */
	uint64_t h = rl_hash64(rid, strlen(rid), (uint64_t)k + 1);
	snprintf(id, sizeof id, "call_%016llx%08x", (unsigned long long)h, (unsigned)k);
	o = cJSON_CreateObject();
	if (!o || !cJSON_AddStringToObject(o, "id", id) || !cJSON_AddStringToObject(o, "type", "function") ||
	    !(f = cJSON_AddObjectToObject(o, "function")) || !cJSON_AddStringToObject(f, "name", name->valuestring) ||
	    !cJSON_AddStringToObject(f, "arguments", astr)) {
		cJSON_Delete(o);
		o = NULL;
	}
out:
	free(astr);
	cJSON_Delete(j);
	return o;
}

int
sv_tools_parse(const char *text, const char *rid, char **content, cJSON **calls)
{
	const char *first = strstr(text, open_tag), *p = first;
	cJSON *arr = NULL;

	*content = NULL;
	*calls = NULL;
	if (first) {
		if (!(arr = cJSON_CreateArray()))
			return RL_ENOMEM;
		while (p) {
			const char *b = p + sizeof open_tag - 1, *e = strstr(b, close_tag);
			size_t n = e ? (size_t)(e - b) : strlen(b);
			cJSON *c = one_call(b, n, rid, cJSON_GetArraySize(arr));
			if (!c) {
				cJSON_Delete(arr);
				arr = NULL;
				first = NULL;
				break;
			}
			cJSON_AddItemToArray(arr, c);
			p = e ? strstr(e + sizeof close_tag - 1, open_tag) : NULL;
		}
	}
	if (!first) {
		if (!(*content = copy(text, strlen(text))))
			return RL_ENOMEM;
	} else if (first > text) {
		if (!(*content = copy(text, (size_t)(first - text)))) {
			cJSON_Delete(arr);
			return RL_ENOMEM;
		}
	}
	*calls = arr;
	return RL_OK;
}

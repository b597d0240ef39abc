/*
 * test_serve_tools.c — the Hermes tool-call parser of `rl-rollout serve` on
 * crafted model outputs, against the answers vLLM's hermes parser gives for
 * the same text (content before the first block, arguments re-serialized as
 * a JSON string, malformed blocks leaving everything as content).
 */
#include "rollout/serve_int.h"

#include "t.h"

static cJSON *
parse(const char *text, char **content)
{
	cJSON *calls = NULL;

	T_OK(sv_tools_parse(text, "chatcmpl-1", content, &calls) == 0);
	return calls;
}

static const char *
fn(const cJSON *calls, int i, const char *k)
{
	cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, i), "function");
	cJSON *v = cJSON_GetObjectItemCaseSensitive(f, k);
	return cJSON_IsString(v) ? v->valuestring : "";
}

int
main(void)
{
	char *content;
	cJSON *calls;

	T_BEGIN("serve_tools");
	/* no block: all content */
	calls = parse("just text", &content);
	T_OK(calls == NULL);
	T_OK(content && strcmp(content, "just text") == 0);
	free(content);

	/* one call, nothing before it: content null; arguments a JSON string */
	calls = parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n"
		      "</tool_call>", &content);
	T_OK(content == NULL);
	T_OK(cJSON_GetArraySize(calls) == 1);
	T_OK(strcmp(fn(calls, 0, "name"), "get_weather") == 0);
	T_OK(strcmp(fn(calls, 0, "arguments"), "{\"city\":\"Paris\",\"n\":2}") == 0, "%s", fn(calls, 0, "arguments"));
	{
		cJSON *c = cJSON_GetArrayItem(calls, 0);
		cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
		T_OK(cJSON_IsString(id) && strncmp(id->valuestring, "call_", 5) == 0);
		T_OK(strcmp(cJSON_GetObjectItemCaseSensitive(c, "type")->valuestring, "function") == 0);
	}
	cJSON_Delete(calls);

	/* text before, two calls (ids differ), the last one left open, non-ASCII kept */
	calls = parse("Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
		      "<tool_call>{\"name\": \"b\", \"arguments\": {\"q\": \"é\"}}", &content);
	T_OK(content && strcmp(content, "Let me check.\n") == 0);
	T_OK(cJSON_GetArraySize(calls) == 2);
	T_OK(strcmp(fn(calls, 0, "name"), "a") == 0 && strcmp(fn(calls, 0, "arguments"), "{}") == 0);
	T_OK(strcmp(fn(calls, 1, "name"), "b") == 0);
	T_OK(strcmp(fn(calls, 1, "arguments"), "{\"q\":\"é\"}") == 0, "%s", fn(calls, 1, "arguments"));
	T_OK(strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "id")->valuestring,
		    cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 1), "id")->valuestring) != 0);
	free(content);
	cJSON_Delete(calls);

	/* a malformed block (bad JSON, or no name): no calls, the whole text is content */
	{
		static const char *const bad[] = {
			"x<tool_call>{\"name\": \"a\", \"arguments\": {}</tool_call>",
			"<tool_call>{\"arguments\": {}}</tool_call>",
			"<tool_call>[1]</tool_call>",
			"<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>nope</tool_call>",
		};
		for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
			calls = parse(bad[i], &content);
			T_OK(calls == NULL, "case %zu", i);
			T_OK(content && strcmp(content, bad[i]) == 0, "case %zu", i);
			free(content);
		}
	}
	/* a call without "arguments" fails vLLM's parse (KeyError): all content */
	calls = parse("<tool_call>{\"name\": \"now\"}</tool_call>", &content);
	T_OK(calls == NULL && content && strcmp(content, "<tool_call>{\"name\": \"now\"}</tool_call>") == 0);
	cJSON_Delete(calls);
	free(content);
	T_END();
}

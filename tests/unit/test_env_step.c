/*
 * test_env_step.c — the step line rl-rollout --env sends after a model turn
 * (rl-env(5)) on crafted turn texts: the raw text as "action", and in chat
 * framing the turn's Hermes <tool_call> blocks as "tool_calls" in OpenAI's
 * shape ({"id", "type": "function", "function": {"name", "arguments": a JSON
 * string}}), as Qwen's template teaches the model to write them.
 */
#include "rollout/rollout_int.h"

#include "t.h"

/* The step line for TEXT, checked to be one JSON object on one line. */
static cJSON *
step(const char *text, int turn, int chat)
{
	char *msg = NULL;
	cJSON *j;

	T_OK(rli_env_step_msg(&msg, "42", turn, text, chat) == 0);
	size_t n = strlen(msg);
	T_OK(n > 0 && msg[n - 1] == '\n' && memchr(msg, '\n', n - 1) == NULL, "%s", msg);
	j = cJSON_Parse(msg);
	T_OK(cJSON_IsObject(j), "%s", msg);
	T_EQ_STR(cJSON_GetObjectItemCaseSensitive(j, "op")->valuestring, "step");
	T_EQ_STR(cJSON_GetObjectItemCaseSensitive(j, "id")->valuestring, "42");
	/* the action is the turn's text, unchanged, calls and all */
	T_EQ_STR(cJSON_GetObjectItemCaseSensitive(j, "action")->valuestring, text);
	free(msg);
	return j;
}

static const char *
field(const cJSON *calls, int i, const char *k)
{
	const cJSON *c = cJSON_GetArrayItem(calls, i), *f = cJSON_GetObjectItemCaseSensitive(c, "function");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(strcmp(k, "id") && strcmp(k, "type") ? f : c, k);
	return cJSON_IsString(v) ? v->valuestring : "(missing)";
}

int
main(void)
{
	static const char turn[] = "Let me compute.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 17, "
	    "\"b\": 25}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
	cJSON *j, *j2, *calls, *args;

	T_BEGIN("env_step");
	j = step(turn, 0, 1);
	calls = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
	T_OK(cJSON_IsArray(calls) && cJSON_GetArraySize(calls) == 2);
	T_EQ_STR(field(calls, 0, "type"), "function");
	T_EQ_STR(field(calls, 0, "name"), "add");
	T_EQ_STR(field(calls, 1, "name"), "now");
	T_EQ_STR(field(calls, 1, "arguments"), "{}");
	/* arguments: a string holding the JSON object, as OpenAI sends them */
	args = cJSON_Parse(field(calls, 0, "arguments"));
	T_OK(cJSON_IsObject(args) && cJSON_GetObjectItemCaseSensitive(args, "a")->valueint == 17 &&
	    cJSON_GetObjectItemCaseSensitive(args, "b")->valueint == 25 && cJSON_GetArraySize(args) == 2);
	cJSON_Delete(args);
	T_OK(strncmp(field(calls, 0, "id"), "call_", 5) == 0);
	T_OK(strcmp(field(calls, 0, "id"), field(calls, 1, "id")) != 0);
	/* the same calls in a later turn get other ids (an environment keys results by id) */
	j2 = step(turn, 1, 1);
	T_OK(strcmp(field(cJSON_GetObjectItemCaseSensitive(j2, "tool_calls"), 0, "id"), field(calls, 0, "id")) != 0);
	cJSON_Delete(j2);
	cJSON_Delete(j);

	/* plain framing: no tool_calls, even for a block */
	j = step(turn, 0, 0);
	T_OK(cJSON_GetObjectItemCaseSensitive(j, "tool_calls") == NULL);
	cJSON_Delete(j);
	/* no block, or a malformed one (vLLM's hermes parser: no calls): no field */
	static const char *const none[] = { "The answer is 42.", "<tool_call>\n{\"name\": \"add\"}\n</tool_call>",
					    "<tool_call>\n{not json}\n</tool_call>", "" };
	for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
		j = step(none[i], 0, 1);
		T_OK(cJSON_GetObjectItemCaseSensitive(j, "tool_calls") == NULL, "case %zu", i);
		cJSON_Delete(j);
	}
	/* a last block the model did not close (stopped at --max-tokens or a stop string) is still read */
	j = step("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"\\u00e9\\n\"}}\n", 2, 1);
	calls = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
	T_OK(cJSON_GetArraySize(calls) == 1);
	T_EQ_STR(field(calls, 0, "name"), "f");
	args = cJSON_Parse(field(calls, 0, "arguments"));
	T_EQ_STR(cJSON_GetObjectItemCaseSensitive(args, "x")->valuestring, "é\n");
	cJSON_Delete(args);
	cJSON_Delete(j);
	T_END();
}

/*
 * prompt.c — prompt lines to prompt records (see prompt.h).
 */
#include "prompt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core.h"
#include "json.h"

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

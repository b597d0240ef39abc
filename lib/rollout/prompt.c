/*
 * prompt.c — prompt lines, the one parser of them: into prompt records for
 * rl-queue (rl_prompt_line_to_traj), into token ids for rl-rollout's run
 * (rli_prompt_parse_line, and rli_prompt_from_record for a leased record),
 * and chat lines for rl-rollout tokenize (rl_prompt_chat_line); chat
 * messages (rl_prompt_chat_parse, lib/tok/chat_json.c) for all of them.  Rendering chats and
 * encoding text are lib/tok's.
 */
#include "rollout/prompt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/json.h"
#include "rollout/rollout_int.h"

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

/* One JSON object of a line of n bytes into *out (the caller's).  RL_EFORMAT
 * (logged, naming `what`) for anything else, and for a NUL byte or a \u0000
 * in a string, which cJSON would cut there: the prompt or meta would change
 * silently. */
static int
line_object(cJSON **out, const char *line, size_t n, const char *what)
{
	cJSON *j;
	int k;

	*out = NULL;
	if (memchr(line, 0, n) != NULL) {
		rl_error("%s: a NUL byte at byte %zu, which JSON text cannot hold", what,
		         (size_t)((const char *)memchr(line, 0, n) - line));
		return RL_EFORMAT;
	}
	j = rl_json_parse_all(line, n); /* one object a line: a second one is an error */
	if (!j || !cJSON_IsObject(j)) {
		rl_error("%s: not a JSON object", what);
		cJSON_Delete(j);
		return RL_EFORMAT;
	}
	if ((k = rl_json_nul_member(line, n)) >= 0) {
		const cJSON *m = cJSON_GetArrayItem(j, k);
		rl_error("%s: field '%s': \\u0000 (NUL) in its name or value, which text and meta fields cannot hold",
		         what, m && m->string ? m->string : "?");
		cJSON_Delete(j);
		return RL_EFORMAT;
	}
	*out = j;
	return RL_OK;
}

int
rl_prompt_line_to_traj(rl_traj *t, const char *line, size_t n, const char *what)
{
	cJSON *j = NULL, *p;
	char *meta = NULL;
	uint64_t u;
	int rv;

	rl_traj_clear(t);
	if ((rv = line_object(&j, line, n, what)) != 0)
		goto out;
	rv = RL_EFORMAT;
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

static int
tokens_push(rl_tokens *t, int32_t id)
{
	if (t->n == t->cap) {
		size_t nc = t->cap ? 2 * t->cap : 64;
		int32_t *ni = realloc(t->ids, nc * sizeof *ni);
		if (!ni)
			return RL_ENOMEM;
		t->ids = ni;
		t->cap = nc;
	}
	t->ids[t->n++] = id;
	return RL_OK;
}

/* Parses a prompt object ({"prompt": text or messages, other keys...}; j is
 * consumed) into tokens, text and meta.  RL_EFORMAT (logged, naming `where`,
 * e.g. "'p.jsonl': line 3") for a bad one.  ids, when not NULL, are the prompt's
 * token ids already (queue records): then "prompt" may be absent. */
int
rli_prompt_parse_obj(gen *g, cJSON *j, const char *where, const int32_t *pre_ids, size_t npre, prompt **out)
{
	cJSON *pr, *kw = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs");
	rl_tokens ids = { 0 };
	rl_prompt_chat ch = { 0 };
	char *text = NULL;
	size_t tlen = 0;
	int rv = RL_EFORMAT, flags = RL_TOK_GEN_PROMPT;

	*out = NULL;
	pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
	if (rl_json_dup_key(j)) {
		/* which of two "prompt" (or "answer") keys was meant is not known */
		rl_error("%s: key \"%s\" appears twice", where, rl_json_dup_key(j));
		goto out;
	}
	if (pre_ids) {
		for (size_t i = 0; i < npre; i++)
			if ((rv = tokens_push(&ids, pre_ids[i])) != 0)
				goto out;
		if (cJSON_IsString(pr)) {
			if (!(text = strdup(pr->valuestring))) {
				rv = RL_ENOMEM;
				goto out;
			}
		} else if ((rv = rl_tokenizer_decode(&text, &tlen, g->tok, pre_ids, npre, 0)) != 0)
			goto out;
	} else if (!pr) {
		rl_error("%s: no \"prompt\" key", where);
		goto out;
	} else if (cJSON_IsString(pr) && !g->o.chat) {
		/* the text is the model's input as it stands: a special token spelled in it
		 * ("<|im_start|>" of a chat rendered beforehand) is that token, as a Hugging
		 * Face tokenizer (so vLLM, verl), rl-rollout tokenize and rl-train take it, not
		 * its bytes.  Chat messages are not matched (apply_chat) */
		if (kw) {
			rl_error("%s: chat_template_kwargs on a text prompt, which no chat template renders "
			    "without --chat", where);
			goto out;
		}
		if (!(text = strdup(pr->valuestring))) {
			rv = RL_ENOMEM;
			goto out;
		}
		tlen = strlen(text);
		if ((rv = rl_tokenizer_encode(&ids, g->tok, text, tlen, RL_TOK_SPECIAL)) != 0)
			goto out;
	} else {
		if (!cJSON_IsString(pr) && (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) == 0)) {
			rl_error("%s: \"prompt\" must be a string or a non-empty list of messages", where);
			rv = RL_EFORMAT;
			goto out;
		}
		/* OpenAI content parts, reasoning_content, chat_template_kwargs: lib/rollout/prompt.c */
		rv = rl_prompt_chat_parse(&ch, cJSON_IsString(pr) ? NULL : pr, kw, where);
		if (rv == 0 && cJSON_IsString(pr)) {
			if (!(ch.msgs = rl_try_calloc(1, sizeof(*ch.msgs), "chat"))) {
				rv = RL_ENOMEM;
				goto out;
			}
			ch.msgs[0] = (rl_chat_msg){ "user", pr->valuestring, NULL, NULL };
			ch.n = 1;
		}
		if (rv == 0 && (ch.thinking < 0 ? !g->o.no_think : ch.thinking) == 0)
			flags |= RL_TOK_NO_THINKING;
		/* --chat-template auto: the model's own template's system turn is put in
		 * when the chat has none; a template neither ChatML nor plain is
		 * rendered by the Jinja engine, and one that does not parse is
		 * RL_ENOTSUP, which stops the run (no chat prompt can be used), while
		 * one chat it refuses (raise_exception) is this line's error;
		 * lib/tok/tokenizer.c */
		if (rv == 0 &&
		    ((rv = rl_tokenizer_apply_chat(&ids, g->tok, ch.msgs, ch.n, g->o.tmpl, flags)) != 0 ||
		     (rv = rl_tokenizer_render_chat(&text, &tlen, g->tok, ch.msgs, ch.n, g->o.tmpl, flags)) != 0)) {
			rl_error("%s: cannot apply the chat template", where);
			if (rv == RL_EINVAL)
				rv = RL_EFORMAT; /* this line's chat (a role, its kwargs), not the run's */
		}
		if (rv)
			goto out;
	}
	if (ids.n == 0) {
		rl_error("%s: the prompt is empty", where);
		rv = RL_EFORMAT;
		goto out;
	}
	/* prompt_text is UTF-8: a line's Latin-1 byte (or a decoded id that ends
	 * inside a character) becomes '?' there; the ids are what is generated from */
	rl_utf8_fix(text, strlen(text));
	for (size_t i = 0; i < ids.n; i++) {
		if (ids.ids[i] < 0 || ids.ids[i] >= g->m->cfg.vocab_size) {
			rl_error("%s: prompt token %zu is id %d, outside the model's vocabulary [0, %d)", where, i,
			    ids.ids[i], g->m->cfg.vocab_size);
			rl_hint("a tokenizer with more ids than the model's embedding rows?");
			rv = RL_EFORMAT;
			goto out;
		}
	}
	if ((int)ids.n >= g->m->cfg.max_pos) {
		rl_error("%s: the prompt has %zu tokens, the model's context is %d", where,
		    ids.n, g->m->cfg.max_pos);
		rv = RL_ETOOBIG;
		goto out;
	}
	cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
	int max_new = 0;
	{
		cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
		if (mt && !cJSON_IsNull(mt)) {
			if (!cJSON_IsNumber(mt) || !(mt->valuedouble >= 1) || mt->valuedouble != floor(mt->valuedouble)) {
				char shown[40];
				char *s = cJSON_PrintUnformatted(mt);
				snprintf(shown, sizeof shown, "%s", s ? s : "?");
				free(s);
				rl_error("%s: \"max_tokens\" must be an integer >= 1, not %s", where, shown);
				rv = RL_EFORMAT;
				goto out;
			}
			max_new = (int)RL_MIN(mt->valuedouble, 1e7);
			/* --max-tokens is the ceiling (it sizes the engine's buffers): the records
			 * carry the limit applied, not the one asked for */
			if (max_new > g->o.go.max_new) {
				if (!g->warned_max_tokens)
					rl_warn("%s: \"max_tokens\" %d is more than --max-tokens %d, which applies "
					    "(said once)", where, max_new, g->o.go.max_new);
				g->warned_max_tokens = 1;
				max_new = g->o.go.max_new;
			}
		}
	}
	prompt *p = rl_xcalloc(1, sizeof *p);
	p->max_new = max_new;
	p->line = g->lines;
	p->text = text;
	text = NULL;
	p->meta = rl_json_print(j);
	p->ids = ids.ids;
	p->nids = (int)ids.n;
	ids.ids = NULL;
	*out = p;
	rv = RL_OK;
out:
	free(text);
	rl_tokens_fini(&ids);
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(j);
	return rv;
}

/* One prompt line of a file. */
int
rli_prompt_parse_line(gen *g, const char *line, size_t len, prompt **out)
{
	char where[512];
	cJSON *j;
	int rv;

	*out = NULL;
	snprintf(where, sizeof where, "'%s': line %llu", g->o.input, (unsigned long long)g->lines);
	if ((rv = line_object(&j, line, len, where)) != 0)
		return rv;
	return rli_prompt_parse_obj(g, j, where, NULL, 0, out);
}

/* A leased prompt record into a prompt: its token ids, or its prompt_text, or
 * meta.prompt (text or messages); the rest of meta is kept. */
int
rli_prompt_from_record(gen *g, const rl_traj *t, prompt **out)
{
	const char *metas, *ptext;
	const int32_t *ids = NULL;
	size_t nids = 0;
	cJSON *j = NULL;
	uint64_t id = 0, group = 0;
	char where[128];
	int rv;

	rl_traj_get_u64(t, RL_TAG_ID, &id);
	snprintf(where, sizeof where, "queue prompt %llu", (unsigned long long)id);
	if (rl_traj_get_u64(t, RL_TAG_GROUP, &group) != RL_OK)
		group = id;
	if (rl_traj_get_str(t, RL_TAG_META, &metas, NULL) == RL_OK)
		j = cJSON_Parse(metas);
	if (!j || !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		j = cJSON_CreateObject();
	}
	if (rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &ptext, NULL) == RL_OK) {
		cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
		cJSON_AddStringToObject(j, "prompt", ptext);
	}
	if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &ids, &nids) != RL_OK || nids == 0)
		ids = NULL;
	if ((rv = rli_prompt_parse_obj(g, j, where, ids, nids, out)) != 0)
		return rv;
	(*out)->group = group;
	return RL_OK;
}
void
rli_prompt_free(prompt *p)
{
	if (!p)
		return;
	free(p->text);
	free(p->meta);
	free(p->ids);
	free(p);
}

int
rl_prompt_chat_line(rl_prompt_chat *ch, cJSON **root, const char *line, size_t len, const char *what)
{
	const char *p = line;
	const cJSON *kw = NULL, *arr;
	int nk;

	while (*p == ' ' || *p == '\t')
		p++;
	*root = NULL;
	memset(ch, 0, sizeof(*ch));
	ch->thinking = -1;
	if (memchr(line, 0, len) != NULL) {
		rl_error("%s: a NUL byte at byte %zu, which a chat message cannot hold", what,
		    (size_t)((const char *)memchr(line, 0, len) - line));
		return RL_EFORMAT;
	}
	if (*p != '[' && *p != '{') {
		if (!(ch->msgs = rl_try_calloc(1, sizeof(*ch->msgs), "chat")))
			return RL_ENOMEM;
		ch->msgs[0] = (rl_chat_msg){ "user", line, NULL, NULL };
		ch->n = 1;
		return 0;
	}
	*root = rl_json_parse_all(line, len);
	if (*root != NULL && (nk = rl_json_nul_member(line, len)) >= 0) {
		const cJSON *m = cJSON_GetArrayItem(*root, nk);
		if (cJSON_IsObject(*root))
			rl_error("%s: field '%s': \\u0000 (NUL) in its name or value, which a chat message "
			    "cannot hold", what, m && m->string ? m->string : "?");
		else
			rl_error("%s: message %d: \\u0000 (NUL), which a chat message cannot hold", what, nk + 1);
		return RL_EFORMAT;
	}
	arr = *root;
	if (cJSON_IsObject(arr)) {
		if (rl_json_dup_key(arr)) {
			rl_error("%s: key \"%s\" appears twice", what, rl_json_dup_key(arr));
			return RL_EFORMAT;
		}
		kw = cJSON_GetObjectItemCaseSensitive(arr, "chat_template_kwargs");
		arr = cJSON_GetObjectItemCaseSensitive(arr, "messages");
	}
	if (!cJSON_IsArray(arr)) {
		rl_error("%s: expected a JSON array of messages or {\"messages\": [...]}", what);
		return RL_EFORMAT;
	}
	return rl_prompt_chat_parse(ch, arr, kw, what);
}

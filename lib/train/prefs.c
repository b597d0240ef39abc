/*
 * prefs.c — preference pairs (prefs.h): the JSON forms of TRL's preference
 * datasets to prompt, chosen and rejected token ids.
 * Leaves out: other columns (kept by no one yet), ref log-probs in the line.
 */
#include "train/prefs.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"

void
rl_pref_fini(rl_pref *p)
{
	if (!p)
		return;
	free(p->prompt);
	free(p->chosen);
	free(p->rejected);
	memset(p, 0, sizeof *p);
}

static int
bad(const char *where, const char *what)
{
	rl_error("%s: %s", where, what);
	return RL_EFORMAT;
}

/* The messages of array a (its role/content strings borrowed) into *msgs[*n]. */
static int
messages(const cJSON *a, const char *key, rl_chat_msg **msgs, size_t *n, const char *where)
{
	int k = 0, cnt = cJSON_GetArraySize(a);
	const cJSON *m;

	*n = 0;
	if (!(*msgs = rl_try_calloc((size_t)(cnt ? cnt : 1), sizeof(rl_chat_msg), "chat messages")))
		return RL_ENOMEM;
	cJSON_ArrayForEach(m, a) {
		const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
		const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
		if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
			rl_error("%s: message %d of '%s' needs a \"role\" and a \"content\" string", where, k, key);
			return RL_EFORMAT;
		}
		(*msgs)[k++] = (rl_chat_msg){ role->valuestring, content->valuestring, NULL, NULL };
	}
	*n = (size_t)k;
	return RL_OK;
}

static int
same_msg(const rl_chat_msg *a, const rl_chat_msg *b)
{
	return strcmp(a->role, b->role) == 0 && strcmp(a->content, b->content) == 0;
}

static int
take(int32_t **dst, int *n, const int32_t *src, size_t cnt)
{
	if (!(*dst = rl_try_malloc(sizeof(int32_t) * (cnt ? cnt : 1), "token ids")))
		return RL_ENOMEM;
	if (cnt)
		memcpy(*dst, src, sizeof(int32_t) * cnt);
	*n = (int)cnt;
	return RL_OK;
}

/* The completion: the tokens the whole conversation conv[n] adds after the
 * prompt's rendering pt. */
static int
chat_completion(int32_t **dst, int *len, rl_tokenizer *tok, const rl_chat_msg *conv, size_t n,
    const rl_tokens *pt, const char *key, const char *where)
{
	rl_tokens full = { 0 };
	int rv;

	if ((rv = rl_tokenizer_apply_chat(&full, tok, conv, n, RL_CHAT_AUTO, 0)) != 0)
		goto out;
	if (full.n < pt->n || memcmp(full.ids, pt->ids, sizeof(int32_t) * pt->n) != 0) {
		rl_error("%s: the chat template does not render '%s' as a continuation of the prompt", where, key);
		rv = RL_EFORMAT;
		goto out;
	}
	rv = take(dst, len, full.ids + pt->n, full.n - pt->n);
out:
	rl_tokens_fini(&full);
	return rv;
}

/* prompt + msgs[n] as one conversation (*conv malloc'd) */
static int
join(rl_chat_msg **conv, const rl_chat_msg *prompt, size_t np, const rl_chat_msg *msgs, size_t n)
{
	if (!(*conv = rl_try_calloc(np + n + 1, sizeof **conv, "chat messages")))
		return RL_ENOMEM;
	memcpy(*conv, prompt, np * sizeof **conv);
	memcpy(*conv + np, msgs, n * sizeof **conv);
	return RL_OK;
}

static int
parse_chat(rl_pref *o, rl_tokenizer *tok, const cJSON *p, const cJSON *c, const cJSON *r, const char *where)
{
	rl_chat_msg *pm = NULL, *cm = NULL, *rm = NULL, *convc = NULL, *convr = NULL;
	size_t np = 0, nc = 0, nr = 0, ncc, ncr;
	const rl_chat_msg *prompt;
	rl_tokens pt = { 0 };
	int rv;

	if ((rv = messages(c, "chosen", &cm, &nc, where)) != 0 || (rv = messages(r, "rejected", &rm, &nr, where)) != 0)
		goto out;
	if (p) {
		if ((rv = messages(p, "prompt", &pm, &np, where)) != 0 || (rv = join(&convc, pm, np, cm, nc)) != 0 ||
		    (rv = join(&convr, pm, np, rm, nr)) != 0)
			goto out;
		prompt = pm;
		ncc = np + nc;
		ncr = np + nr;
	} else {
		/* implicit prompt: the leading messages both conversations share */
		while (np < nc && np < nr && same_msg(&cm[np], &rm[np]))
			np++;
		if (np == 0) {
			rv = bad(where, "no 'prompt', and 'chosen' and 'rejected' share no leading message");
			goto out;
		}
		if (np == nc && np == nr) {
			rv = bad(where, "'chosen' and 'rejected' are identical");
			goto out;
		}
		if (np == nc || np == nr) {
			rv = bad(where, np == nc ? "'chosen' is empty after the shared prompt" :
			    "'rejected' is empty after the shared prompt");
			goto out;
		}
		prompt = cm;
		ncc = nc;
		ncr = nr;
	}
	if ((rv = rl_tokenizer_apply_chat(&pt, tok, prompt, np, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT)) != 0 ||
	    (rv = take(&o->prompt, &o->plen, pt.ids, pt.n)) != 0 ||
	    (rv = chat_completion(&o->chosen, &o->clen, tok, p ? convc : cm, ncc, &pt, "chosen", where)) != 0 ||
	    (rv = chat_completion(&o->rejected, &o->rlen, tok, p ? convr : rm, ncr, &pt, "rejected", where)) != 0)
		goto out;
out:
	rl_tokens_fini(&pt);
	free(pm);
	free(cm);
	free(rm);
	free(convc);
	free(convr);
	return rv;
}

/* Text: TRL's extract_prompt for the implicit form, EOS after each completion. */
static int
parse_text(rl_pref *o, rl_tokenizer *tok, const char *p, const char *c, const char *r, const char *where)
{
	size_t pl, cl = strlen(c), rl = strlen(r);
	rl_tokens t = { 0 };
	int32_t eos = rl_tokenizer_eos_id(tok);
	int rv;

	if (p) {
		pl = strlen(p);
	} else {
		size_t i = 0;
		while (i < cl && i < rl && c[i] == r[i])
			i++;
		if (i == cl && i == rl)
			return bad(where, "'chosen' and 'rejected' are identical");
		if (i > 0 && c[i - 1] == ' ')
			i--;   /* the space starts the completions, as TRL cuts it */
		if (i == 0)
			return bad(where, "no 'prompt', and 'chosen' and 'rejected' share no leading text");
		p = c;
		pl = i;
		c += i, cl -= i;
		r += i, rl -= i;
	}
	const char *txt[3] = { p, c, r };
	size_t len[3] = { pl, cl, rl };
	int32_t **dst[3] = { &o->prompt, &o->chosen, &o->rejected };
	int *n[3] = { &o->plen, &o->clen, &o->rlen };
	for (int k = 0; k < 3; k++) {
		t.n = 0;
		if ((rv = rl_tokenizer_encode(&t, tok, txt[k], len[k], 0)) != 0)
			goto out;
		if ((rv = take(dst[k], n[k], t.ids, t.n)) != 0)
			goto out;
		if (k > 0 && eos >= 0) {
			int32_t *np = realloc(*dst[k], sizeof(int32_t) * (size_t)(*n[k] + 1));
			if (!np) {
				rv = RL_ENOMEM;
				goto out;
			}
			np[(*n[k])++] = eos;
			*dst[k] = np;
		}
	}
	rv = RL_OK;
out:
	rl_tokens_fini(&t);
	return rv;
}

int
rl_pref_parse(rl_pref *out, rl_tokenizer *tok, const char *line, size_t len, const char *where)
{
	cJSON *j = cJSON_ParseWithLength(line, len);
	const cJSON *p, *c, *r;
	int rv;

	memset(out, 0, sizeof *out);
	if (!j || !cJSON_IsObject(j)) {
		rv = bad(where, j ? "not a JSON object" : "not JSON");
		goto out;
	}
	p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
	c = cJSON_GetObjectItemCaseSensitive(j, "chosen");
	r = cJSON_GetObjectItemCaseSensitive(j, "rejected");
	if (!c || !r) {
		rv = bad(where, !c ? "no 'chosen'" : "no 'rejected'");
		goto out;
	}
	if (cJSON_IsString(c) && cJSON_IsString(r) && (!p || cJSON_IsString(p))) {
		if (!*c->valuestring || !*r->valuestring || (p && !*p->valuestring)) {
			rv = bad(where, !*c->valuestring ? "'chosen' is empty" : !*r->valuestring ? "'rejected' is empty" :
			    "'prompt' is empty");
			goto out;
		}
		rv = parse_text(out, tok, p ? p->valuestring : NULL, c->valuestring, r->valuestring, where);
	} else if (cJSON_IsArray(c) && cJSON_IsArray(r) && (!p || cJSON_IsArray(p))) {
		if (!cJSON_GetArraySize(c) || !cJSON_GetArraySize(r) || (p && !cJSON_GetArraySize(p))) {
			rv = bad(where, !cJSON_GetArraySize(c) ? "'chosen' is empty" :
			    !cJSON_GetArraySize(r) ? "'rejected' is empty" : "'prompt' is empty");
			goto out;
		}
		rv = parse_chat(out, tok, p, c, r, where);
	} else {
		rv = bad(where, "'prompt', 'chosen' and 'rejected' must be all text or all lists of messages");
		goto out;
	}
	if (rv != RL_OK)
		goto out;
	if (out->plen < 1)
		rv = bad(where, "the prompt has no tokens (its first token is never predicted)");
	else if (out->clen < 1 || out->rlen < 1)
		rv = bad(where, out->clen < 1 ? "'chosen' has no tokens" : "'rejected' has no tokens");
	else if (out->clen == out->rlen && memcmp(out->chosen, out->rejected, sizeof(int32_t) * (size_t)out->clen) == 0)
		rv = bad(where, "'chosen' and 'rejected' are identical");
out:
	cJSON_Delete(j);
	if (rv != RL_OK)
		rl_pref_fini(out);
	return rv;
}

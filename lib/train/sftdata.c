/*
 * sftdata.c — TRL's SFT dataset rows as rl-train --algo sft reads them
 * (docs/train.md, "SFT data"): language modelling {"text"}, prompt/completion
 * as text or as message lists, and conversations {"messages"}.  Each row
 * becomes one record of token ids: prompt, response and, for conversations,
 * a loss_mask that keeps the loss on the assistant turns.  Chats are
 * rendered by the tokenizer's chat API (rl_tokenizer_apply_chat), never
 * here, so every template the tokenizer renders works the same way.
 * Leaves out: "tools" (refused), packing, truncation (an over-long row is a
 * bad record for the grouper, --on-bad).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/json.h"
#include "tok/chat_json.h"
#include "train/trainer.h"

/* A row's token ids and where the prompt ends; mask (n) when some
 * response tokens are not trained. */
typedef struct sft_row {
	rl_tokens ids;
	size_t nprompt;
	uint8_t *mask;
} sft_row;

static int
is_messages(const cJSON *v)
{
	const cJSON *m;

	if (!cJSON_IsArray(v))
		return 0;
	cJSON_ArrayForEach(m, v)
		if (!cJSON_IsObject(m))
			return 0;
	return 1;
}

static int
push_eos(rl_tokens *t, const rl_tokenizer *tok)
{
	int32_t eos = rl_tokenizer_eos_id(tok);

	if (eos < 0 || (t->n > 0 && t->ids[t->n - 1] == eos))
		return RL_OK;
	if (t->n == t->cap) {
		size_t nc = t->cap ? 2 * t->cap : 16;
		int32_t *ni = realloc(t->ids, nc * sizeof *ni);
		if (!ni)
			return RL_ENOMEM;
		t->ids = ni;
		t->cap = nc;
	}
	t->ids[t->n++] = eos;
	return RL_OK;
}

static int
is_prefix(const rl_tokens *a, const rl_tokens *b)
{
	return a->n <= b->n && (a->n == 0 || memcmp(a->ids, b->ids, a->n * sizeof *a->ids) == 0);
}

/* TRL's prompt/completion split: the completion is what the whole row adds
 * to the prompt alone, cut at the prompt's length when the two disagree on
 * the tokens at the seam (TRL warns and does the same). */
static void
split_at_prompt(sft_row *r, const rl_tokens *prompt, const char *what)
{
	if (!is_prefix(prompt, &r->ids))
		rl_warn("%s: the prompt's tokens differ from the start of prompt+completion's; split at "
		    "the prompt's length (%zu tokens), as TRL does", what, prompt->n);
	r->nprompt = prompt->n;
}

/* {"text": T}: every token trained but the first, which nothing predicts;
 * EOS appended as TRL appends eos_token. */
static int
row_text(sft_row *r, rl_tokenizer *tok, const cJSON *text, const char *what)
{
	int rv;

	if (!cJSON_IsString(text)) {
		rl_error("%s: field 'text': expected a string, got %s", what, rl_json_type_name(text));
		return RL_EFORMAT;
	}
	if (text->valuestring[0] == 0) {
		rl_error("%s: field 'text' is empty", what);
		return RL_EFORMAT;
	}
	if ((rv = rl_tokenizer_encode(&r->ids, tok, text->valuestring, strlen(text->valuestring),
	    RL_TOK_SPECIAL)) != 0 || (rv = push_eos(&r->ids, tok)) != 0)
		return rv;
	if (r->ids.n < 2) {
		rl_error("%s: field 'text' is one token and the tokenizer has no EOS: nothing to train", what);
		return RL_EFORMAT;
	}
	r->nprompt = 1;
	return RL_OK;
}

/* {"prompt": P, "completion": C} as text: prompt+completion+EOS tokenized
 * whole, the loss on the completion. */
static int
row_pc_text(sft_row *r, rl_tokenizer *tok, const char *p, const char *c, const char *what)
{
	rl_tokens pt = { 0 };
	size_t np = strlen(p), nc = strlen(c);
	char *pc = rl_try_malloc(np + nc + 1, "prompt+completion");
	int rv;

	if (!pc)
		return RL_ENOMEM;
	memcpy(pc, p, np);
	memcpy(pc + np, c, nc + 1);
	if ((rv = rl_tokenizer_encode(&pt, tok, p, np, RL_TOK_SPECIAL)) != 0 ||
	    (rv = rl_tokenizer_encode(&r->ids, tok, pc, np + nc, RL_TOK_SPECIAL)) != 0 ||
	    (rv = push_eos(&r->ids, tok)) != 0)
		goto out;
	split_at_prompt(r, &pt, what);
out:
	rl_tokens_fini(&pt);
	free(pc);
	return rv;
}

/* Conversational prompt/completion: the prompt rendered with the generation
 * prompt, the whole conversation without; no EOS added (the template ends
 * the turn). */
static int
row_pc_chat(sft_row *r, rl_tokenizer *tok, const rl_prompt_chat *p, const rl_prompt_chat *c, int flags,
    const char *what)
{
	rl_tokens pt = { 0 };
	rl_chat_msg *all = rl_try_calloc(p->n + c->n, sizeof *all, "chat messages");
	int rv;

	if (!all)
		return RL_ENOMEM;
	memcpy(all, p->msgs, p->n * sizeof *all);
	memcpy(all + p->n, c->msgs, c->n * sizeof *all);
	if ((rv = rl_tokenizer_apply_chat(&pt, tok, p->msgs, p->n, RL_CHAT_AUTO, flags | RL_TOK_GEN_PROMPT)) != 0 ||
	    (rv = rl_tokenizer_apply_chat(&r->ids, tok, all, p->n + c->n, RL_CHAT_AUTO, flags)) != 0) {
		rl_error("%s: the chat could not be rendered", what);
		goto out;
	}
	split_at_prompt(r, &pt, what);
out:
	rl_tokens_fini(&pt);
	free(all);
	return rv;
}

/* {"messages": [...]}: the loss on the assistant turns only.  Turn k's
 * tokens are what rendering messages 1..k adds to rendering 1..k-1 with the
 * generation prompt; both must be prefixes of the whole conversation's
 * rendering, or the spans are not the tokens trained on. */
static int
row_messages(sft_row *r, rl_tokenizer *tok, const rl_prompt_chat *ch, int flags, const char *what)
{
	rl_tokens a = { 0 }, b = { 0 };
	size_t first = 0, last = 0;
	int rv, any = 0;

	if ((rv = rl_tokenizer_apply_chat(&r->ids, tok, ch->msgs, ch->n, RL_CHAT_AUTO, flags)) != 0) {
		rl_error("%s: the chat could not be rendered", what);
		return rv;
	}
	if (!(r->mask = rl_try_calloc(r->ids.n ? r->ids.n : 1, 1, "loss mask")))
		return RL_ENOMEM;
	for (size_t k = 0; k < ch->n; k++) {
		if (strcmp(ch->msgs[k].role, "assistant") != 0)
			continue;
		a.n = b.n = 0;
		if ((rv = rl_tokenizer_apply_chat(&a, tok, ch->msgs, k, RL_CHAT_AUTO, flags | RL_TOK_GEN_PROMPT)) != 0 ||
		    (rv = rl_tokenizer_apply_chat(&b, tok, ch->msgs, k + 1, RL_CHAT_AUTO, flags)) != 0) {
			rl_error("%s: the chat up to message %zu could not be rendered", what, k + 1);
			goto out;
		}
		if (!is_prefix(&a, &b) || !is_prefix(&b, &r->ids)) {
			rl_error("%s: message %zu: the chat template renders the conversation up to this assistant "
			    "turn differently from the start of the whole conversation, so the turn's tokens cannot "
			    "be found", what, k + 1);
			rl_hint("give the row as prompt/completion, or as a record with token ids and a loss_mask");
			rv = RL_EFORMAT;
			goto out;
		}
		if (!any)
			first = a.n;
		any = 1;
		last = b.n;
		memset(r->mask + a.n, 1, b.n - a.n);
	}
	if (!any) {
		rl_error("%s: field 'messages' has no assistant message: nothing to train", what);
		rv = RL_EFORMAT;
		goto out;
	}
	if (first == 0) {
		rl_error("%s: the chat renders no tokens before the first assistant turn: no prompt to "
		    "predict it from", what);
		rv = RL_EFORMAT;
		goto out;
	}
	/* nothing after the last assistant turn is trained: leave it out */
	r->ids.n = last;
	r->nprompt = first;
out:
	rl_tokens_fini(&a);
	rl_tokens_fini(&b);
	return rv;
}

/* Which TRL form a row is: 't' text, 'p' prompt/completion, 'm' messages,
 * 0 an rlpipe record (a "prompt" of token ids, say). */
static int
row_kind(const cJSON *j)
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");

	if (cJSON_GetObjectItemCaseSensitive(j, "messages"))
		return 'm';
	if (cJSON_GetObjectItemCaseSensitive(j, "completion"))
		return 'p';
	if (cJSON_GetObjectItemCaseSensitive(j, "text"))
		return 't';
	if (p && (cJSON_IsString(p) || (is_messages(p) && cJSON_GetArraySize(p) > 0)))
		return 'p'; /* a prompt line without its completion: named below */
	return 0;
}

/* chat_template_kwargs to apply_chat flags; "tools" refused. */
static int
chat_flags(int *flags, const cJSON *j, rl_tokenizer *tok, const char *what)
{
	const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
	rl_prompt_chat kw;
	int rv;

	*flags = 0;
	if (tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && cJSON_GetArraySize(tools) == 0)) {
		rl_error("%s: field 'tools': tool definitions are not rendered by rlpipe's chat templates", what);
		return RL_EFORMAT;
	}
	rv = rl_prompt_chat_parse(&kw, NULL, cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs"), what);
	if (rv == RL_OK && kw.thinking == 0 && rl_tokenizer_chat_thinking(tok))
		*flags = RL_TOK_NO_THINKING;
	rl_prompt_chat_fini(&kw);
	return rv;
}

static int
row_pc(sft_row *r, rl_tokenizer *tok, const cJSON *j, const char *what)
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "completion");
	rl_prompt_chat pc = { 0 }, cc = { 0 };
	char wp[600], wc[600];
	int rv, flags;

	if (!p || !c) {
		rl_error("%s: missing field '%s' (TRL's prompt/completion rows have both)", what,
		    p ? "completion" : "prompt");
		return RL_EFORMAT;
	}
	if (cJSON_IsString(p) && cJSON_IsString(c)) {
		if (p->valuestring[0] == 0 || c->valuestring[0] == 0) {
			rl_error("%s: field '%s' is empty", what, p->valuestring[0] == 0 ? "prompt" : "completion");
			return RL_EFORMAT;
		}
		return row_pc_text(r, tok, p->valuestring, c->valuestring, what);
	}
	if (!is_messages(p) || !is_messages(c)) {
		rl_error("%s: fields 'prompt' and 'completion' must both be strings or both be lists of messages "
		    "(they are %s and %s)", what, rl_json_type_name(p), rl_json_type_name(c));
		return RL_EFORMAT;
	}
	if (cJSON_GetArraySize(p) == 0 || cJSON_GetArraySize(c) == 0) {
		rl_error("%s: field '%s' is an empty list", what, cJSON_GetArraySize(p) == 0 ? "prompt" : "completion");
		return RL_EFORMAT;
	}
	if ((rv = chat_flags(&flags, j, tok, what)) != 0)
		return rv;
	snprintf(wp, sizeof wp, "%s: field 'prompt'", what);
	snprintf(wc, sizeof wc, "%s: field 'completion'", what);
	if ((rv = rl_prompt_chat_parse(&pc, p, NULL, wp)) == 0 && (rv = rl_prompt_chat_parse(&cc, c, NULL, wc)) == 0)
		rv = row_pc_chat(r, tok, &pc, &cc, flags, what);
	rl_prompt_chat_fini(&pc);
	rl_prompt_chat_fini(&cc);
	return rv;
}

static int
row_convert(sft_row *r, rl_tokenizer *tok, const cJSON *j, int kind, const char *what)
{
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
	rl_prompt_chat ch = { 0 };
	int rv, flags;

	if (kind == 't')
		return row_text(r, tok, cJSON_GetObjectItemCaseSensitive(j, "text"), what);
	if (kind == 'p')
		return row_pc(r, tok, j, what);
	if (!is_messages(m) || cJSON_GetArraySize(m) == 0) {
		rl_error("%s: field 'messages': expected a non-empty list of message objects, got %s", what,
		    cJSON_IsArray(m) && cJSON_GetArraySize(m) == 0 ? "an empty list" : rl_json_type_name(m));
		return RL_EFORMAT;
	}
	if ((rv = chat_flags(&flags, j, tok, what)) != 0)
		return rv;
	if ((rv = rl_prompt_chat_parse(&ch, m, NULL, what)) == 0)
		rv = row_messages(r, tok, &ch, flags, what);
	rl_prompt_chat_fini(&ch);
	return rv;
}

int
rli_sft_line(void *ctx, rl_traj *t, const char *line, size_t n, const char *what, uint64_t lineno)
{
	trainer *tr = ctx;
	cJSON *j = NULL;
	sft_row r = { 0 };
	int rv, kind;

	rl_traj_clear(t);
	/* a line that is not JSON is left to the record parser, which names it */
	if (!(j = rl_json_parse_all(line, n)) || !cJSON_IsObject(j) || !(kind = row_kind(j))) {
		rv = RL_ENOENT;
		goto out;
	}
	if (rl_json_nul_member(line, n) >= 0) {
		/* cJSON's strings end at a NUL: the text would be cut there */
		rl_error("%s: \\u0000 in the row, which rlpipe's text cannot hold", what);
		rv = RL_EFORMAT;
		goto out;
	}
	if ((rv = rli_feed_tok(tr)) != 0 || (rv = row_convert(&r, tr->tok, j, kind, what)) != 0)
		goto out;
	if (r.ids.n <= r.nprompt) {
		rl_error("%s: the completion renders no tokens: nothing to train", what);
		rv = RL_EFORMAT;
		goto out;
	}
	/* the line number is the id: the row's group of one, for --resume */
	if ((rv = rl_traj_set_u64(t, RL_TAG_ID, lineno)) != 0 ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_PROMPT, r.ids.ids, r.nprompt)) != 0 ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_RESPONSE, r.ids.ids + r.nprompt, r.ids.n - r.nprompt)) != 0)
		goto out;
	if (r.mask && memchr(r.mask + r.nprompt, 0, r.ids.n - r.nprompt))
		rv = rl_traj_set_u8s(t, RL_TAG_LOSS_MASK, r.mask + r.nprompt, r.ids.n - r.nprompt);
out:
	if (rv != RL_OK && rv != RL_ENOENT)
		rl_traj_clear(t);
	cJSON_Delete(j);
	rl_tokens_fini(&r.ids);
	free(r.mask);
	return rv;
}

/* test_prompt.c — lib/rollout/prompt.c, the one parser of prompt lines:
 * text prompts and chat messages into token ids (rli_prompt_parse_line, with
 * the bytes tokenizer: a byte is its own id, <|im_start|> 259, <|im_end|>
 * 260), content parts joined, chat_template_kwargs, prompt lines into
 * records for rl-queue (rl_prompt_line_to_traj), tokenize's chat lines
 * (rl_prompt_chat_line), and bad lines refused with the line named. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "rollout/prompt.h"
#include "rollout/rollout_int.h"
#include "tok/tokenizer.h"
#include "t.h"

static char msg[2048];
#define HAS(s) T_OK(strstr(msg, (s)) != NULL, "stderr \"%s\" lacks \"%s\"", msg, (s))

static char tmpdir[] = "/tmp/rl-prompt-test.XXXXXX";

/* ids equal to the bytes of s, in order from ids[at] */
static int
ids_are_bytes(const int32_t *ids, const char *s)
{
	for (size_t i = 0; s[i]; i++)
		if (ids[i] != (unsigned char)s[i])
			return 0;
	return 1;
}

static int
parse(gen *g, const char *line, prompt **p)
{
	g->lines++;
	return rli_prompt_parse_line(g, line, strlen(line), p);
}

static void
test_text(gen *g)
{
	prompt *p = NULL;
	int rv;

	T_EQ_INT(parse(g, "{\"prompt\": \"hi!\", \"answer\": 4}", &p), 0);
	if (!p)
		return;
	T_EQ_INT(p->nids, 3);
	T_EQ_INT(p->ids[0], 'h');
	T_EQ_INT(p->ids[1], 'i');
	T_EQ_INT(p->ids[2], '!');
	T_EQ_STR(p->text, "hi!");
	T_EQ_STR(p->meta, "{\"answer\":4}");
	T_EQ_INT(p->line, 1);
	T_EQ_INT(p->max_new, 0);
	rli_prompt_free(p);
	/* a special token spelled in a text prompt is that token */
	T_EQ_INT(parse(g, "{\"prompt\": \"a<|eos|>\", \"max_tokens\": 5}", &p), 0);
	if (p) {
		T_EQ_INT(p->nids, 2);
		T_EQ_INT(p->ids[0], 'a');
		T_EQ_INT(p->ids[1], 257);
		T_EQ_INT(p->max_new, 5);
		T_EQ_STR(p->meta, "{\"max_tokens\":5}");
	}
	rli_prompt_free(p);
	T_CAPTURE(parse(g, "{\"prompt\": \"\"}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 3: the prompt is empty");
	T_OK(p == NULL, "%s", "no prompt");
	T_CAPTURE(parse(g, "{\"prompt\": \"x\", \"max_tokens\": 2.5}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 4: \"max_tokens\" must be an integer >= 1, not 2.5");
	/* the context is 32 tokens here */
	T_CAPTURE(parse(g, "{\"prompt\": \"0123456789abcdef0123456789abcdef\"}", &p), &rv, msg);
	T_EQ_INT(rv, RL_ETOOBIG);
	HAS("'p.jsonl': line 5: the prompt has 32 tokens, the model's context is 32");
}

static void
test_chat(gen *g)
{
	prompt *p = NULL;
	/* <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n */
	static const char *user_hi = "[259, user\\nhi, 260, \\n, 259, assistant\\n]";
	int rv;

	T_EQ_INT(parse(g, "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"id\": 7}", &p), 0);
	if (p) {
		T_EQ_INT(p->nids, 1 + 7 + 1 + 1 + 1 + 10);
		T_OK(p->ids[0] == 259 && ids_are_bytes(p->ids + 1, "user\nhi") && p->ids[8] == 260 &&
		    p->ids[9] == '\n' && p->ids[10] == 259 && ids_are_bytes(p->ids + 11, "assistant\n"), "%s", user_hi);
		T_EQ_STR(p->text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
		T_EQ_STR(p->meta, "{\"id\":7}");
	}
	rli_prompt_free(p);
	/* content parts: the text ones joined with "\n" */
	T_EQ_INT(parse(g, "{\"prompt\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, \"b\"]}]}",
	    &p), 0);
	if (p) {
		T_EQ_STR(p->text, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
		T_OK(p->ids[0] == 259 && ids_are_bytes(p->ids + 1, "user\na\nb") && p->ids[9] == 260, "%s", "parts");
	}
	rli_prompt_free(p);
	/* --chat: a text prompt is one user message */
	g->o.chat = 1;
	T_EQ_INT(parse(g, "{\"prompt\": \"hi\"}", &p), 0);
	if (p)
		T_EQ_STR(p->text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
	rli_prompt_free(p);
	g->o.chat = 0;
	T_CAPTURE(parse(g, "{\"prompt\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 9: message 1: content part 1 is of type \"image_url\"; rlpipe renders text only");
	T_CAPTURE(parse(g, "{\"prompt\": [{\"content\": \"x\"}]}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 10: message 1 needs a string \"role\"");
	T_CAPTURE(parse(g, "{\"prompt\": \"x\", \"chat_template_kwargs\": {\"enable_thinking\": false}}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 11: chat_template_kwargs on a text prompt");
}

static void
test_bad_lines(gen *g)
{
	prompt *p = NULL;
	int rv;

	T_CAPTURE(parse(g, "[1, 2]", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 12: not a JSON object");
	T_CAPTURE(parse(g, "{\"prompt\": \"a\"} {}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 13: not a JSON object");
	T_CAPTURE(parse(g, "{\"prompt\": \"a\", \"prompt\": \"b\"}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 14: key \"prompt\" appears twice");
	T_CAPTURE(parse(g, "{\"prompt\": \"a\\u0000b\"}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 15: field 'prompt': \\u0000 (NUL) in its name or value");
	T_CAPTURE(rli_prompt_parse_line(g, "{\"prompt\": \"a\0\"}", 16, &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 15: a NUL byte at byte 13, which JSON text cannot hold");
	T_CAPTURE(parse(g, "{\"answer\": 1}", &p), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'p.jsonl': line 16: no \"prompt\" key");
}

/* Token-id prompts: a leased record's ids are the prompt as they stand. */
static void
test_ids(gen *g)
{
	rl_traj *t = NULL;
	prompt *p = NULL;
	int32_t ids[3] = { 'o', 'k', 257 };

	T_EQ_INT(rl_traj_create(&t), 0);
	if (!t)
		return;
	T_EQ_INT(rl_traj_set_u64(t, RL_TAG_ID, 12), 0);
	T_EQ_INT(rl_traj_set_i32s(t, RL_TAG_PROMPT, ids, 3), 0);
	T_EQ_INT(rl_traj_set_json(t, RL_TAG_META, "{\"answer\":\"x\"}"), 0);
	T_EQ_INT(rli_prompt_from_record(g, t, &p), 0);
	if (p) {
		T_EQ_INT(p->nids, 3);
		T_OK(p->ids[0] == 'o' && p->ids[1] == 'k' && p->ids[2] == 257, "%s", "ids kept");
		T_EQ_STR(p->text, "ok<|eos|>");
		T_EQ_INT(p->group, 12); /* no group: its id */
		T_EQ_STR(p->meta, "{\"answer\":\"x\"}");
	}
	rli_prompt_free(p);
	rl_traj_destroy(t);
}

/* Prompt lines into records for rl-queue. */
static void
test_line_to_traj(void)
{
	rl_traj *t = NULL;
	const char *s;
	uint64_t u = 0;
	int rv;

	T_EQ_INT(rl_traj_create(&t), 0);
	if (!t)
		return;
	T_EQ_INT(rl_prompt_line_is("{\"prompt\": \"x\"}", 15), 1);
	T_EQ_INT(rl_prompt_line_is("{\"prompt\": [1, 2]}", 18), 0);
	const char *l = "{\"prompt\": \"2+2?\", \"id\": 5, \"group\": 9, \"answer\": \"4\"}";
	T_EQ_INT(rl_prompt_line_to_traj(t, l, strlen(l), "line 1"), 0);
	T_EQ_INT(rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &s, NULL), 0);
	T_EQ_STR(s, "2+2?");
	T_EQ_INT(rl_traj_get_u64(t, RL_TAG_ID, &u), 0);
	T_EQ_INT(u, 5);
	T_EQ_INT(rl_traj_get_u64(t, RL_TAG_GROUP, &u), 0);
	T_EQ_INT(u, 9);
	T_EQ_INT(rl_traj_get_str(t, RL_TAG_META, &s, NULL), 0);
	T_EQ_STR(s, "{\"answer\":\"4\"}");
	l = "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
	T_EQ_INT(rl_prompt_line_to_traj(t, l, strlen(l), "line 2"), 0);
	T_OK(rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &s, NULL) != 0, "%s", "a chat has no prompt_text");
	T_EQ_INT(rl_traj_get_str(t, RL_TAG_META, &s, NULL), 0);
	T_EQ_STR(s, "{\"prompt\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
	l = "{\"prompt\": \"a\", \"answer\": 1, \"answer\": 2}";
	T_CAPTURE(rl_prompt_line_to_traj(t, l, strlen(l), "line 3"), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 3: key \"answer\" appears twice");
	l = "{\"prompt\": [3, 4]}";
	T_CAPTURE(rl_prompt_line_to_traj(t, l, strlen(l), "line 4"), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 4: \"prompt\" must be a string or a list of message objects");
	l = "{\"prompt\": \"a\", \"chat_template_kwargs\": {\"foo\": 1}}";
	T_CAPTURE(rl_prompt_line_to_traj(t, l, strlen(l), "line 5"), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 5: chat_template_kwargs: \"foo\" is not one rlpipe knows (enable_thinking)");
	rl_traj_destroy(t);
}

/* rl-rollout tokenize --chat lines. */
static void
test_chat_line(void)
{
	rl_prompt_chat ch;
	cJSON *root = NULL;
	int rv;
	const char *l = "plain words";

	T_EQ_INT(rl_prompt_chat_line(&ch, &root, l, strlen(l), "line 1"), 0);
	T_EQ_INT(ch.n, 1);
	T_EQ_STR(ch.msgs[0].role, "user");
	T_EQ_STR(ch.msgs[0].content, "plain words");
	T_OK(root == NULL, "%s", "text: no JSON");
	rl_prompt_chat_fini(&ch);
	l = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": [\"x\", "
	    "{\"type\": \"text\", \"text\": \"y\"}]}], \"chat_template_kwargs\": {\"enable_thinking\": false}}";
	T_EQ_INT(rl_prompt_chat_line(&ch, &root, l, strlen(l), "line 2"), 0);
	T_EQ_INT(ch.n, 2);
	T_EQ_INT(ch.thinking, 0);
	if (ch.n == 2)
		T_EQ_STR(ch.msgs[1].content, "x\ny");
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(root);
	l = "{\"messages\": [], \"messages\": []}";
	T_CAPTURE(rl_prompt_chat_line(&ch, &root, l, strlen(l), "line 3"), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 3: key \"messages\" appears twice");
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(root);
	l = "{\"msgs\": []}";
	T_CAPTURE(rl_prompt_chat_line(&ch, &root, l, strlen(l), "line 4"), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("line 4: expected a JSON array of messages or {\"messages\": [...]}");
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(root);
}

int
main(void)
{
	gen g;
	struct rl_model m;
	char path[600];
	FILE *f;

	T_BEGIN("test_prompt");
	rl_log_init("test_prompt", RL_LOG_NORMAL);
	if (!mkdtemp(tmpdir))
		return 1;
	snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
	if (!(f = fopen(path, "wb")) || fputs(rl_tokenizer_bytes_json(), f) < 0 || fclose(f) != 0)
		return 1;
	memset(&g, 0, sizeof g);
	memset(&m, 0, sizeof m);
	rl_rollout_opts_default(&g.o);
	g.o.input = "p.jsonl";
	m.cfg.vocab_size = 261;
	m.cfg.max_pos = 32;
	g.m = &m;
	T_EQ_INT(rl_tokenizer_open(&g.tok, tmpdir), 0);
	if (!g.tok)
		T_END();
	test_text(&g);
	test_chat(&g);
	test_bad_lines(&g);
	test_ids(&g);
	test_line_to_traj();
	test_chat_line();
	rl_tokenizer_close(g.tok);
	unlink(path);
	rmdir(tmpdir);
	T_END();
}

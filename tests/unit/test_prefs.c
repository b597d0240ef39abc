/*
 * test_prefs.c — preference lines (lib/train/prefs.h) with rlpipe's bytes
 * tokenizer and its ChatML template: ids are the bytes (0..255), EOS 257,
 * <|im_start|> 259, <|im_end|> 260, so every expectation is written out here
 * as the text it must decode to.
 *   TRL's standard form (text; EOS after each completion), the
 *   conversational form (the prompt rendered with the generation prompt, the
 *   completion what the whole conversation adds), the implicit prompt in
 *   both forms (TRL's extract_prompt: the shared prefix, a trailing space
 *   left to the completions; the shared leading messages), and every bad line
 *   named: not JSON, missing key, empty, identical, mixed types, no shared
 *   prompt, a message without role.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "tok/tokenizer.h"
#include "train/prefs.h"
#include "t.h"

static const char tokjson[] =
    "{\"model\": {\"type\": \"rlpipe-bytes\", \"bos_token\": \"<|bos|>\", \"eos_token\": \"<|eos|>\","
    " \"pad_token\": \"<|pad|>\", \"chat_template\": \"chatml\"}, \"added_tokens\": ["
    "{\"id\": 256, \"content\": \"<|bos|>\", \"special\": true},"
    "{\"id\": 257, \"content\": \"<|eos|>\", \"special\": true},"
    "{\"id\": 258, \"content\": \"<|pad|>\", \"special\": true},"
    "{\"id\": 259, \"content\": \"<|im_start|>\", \"special\": true},"
    "{\"id\": 260, \"content\": \"<|im_end|>\", \"special\": true}]}";

/* ids as text: bytes as themselves, 257 "<E>", 259 "<S>", 260 "<F>" */
static const char *
show(const int32_t *ids, int n)
{
	static char buf[4096];
	size_t k = 0;
	for (int i = 0; i < n && k + 4 < sizeof buf; i++) {
		if (ids[i] < 256)
			buf[k++] = (char)ids[i];
		else
			k += (size_t)snprintf(buf + k, sizeof buf - k, "%s",
			    ids[i] == 257 ? "<E>" : ids[i] == 259 ? "<S>" : ids[i] == 260 ? "<F>" : "<?>");
	}
	buf[k] = 0;
	return buf;
}

static void
ok_line(rl_tokenizer *tok, const char *line, const char *p, const char *c, const char *r)
{
	rl_pref pr;
	T_EQ_INT(rl_pref_parse(&pr, tok, line, strlen(line), "t: line 1"), RL_OK);
	T_EQ_STR(show(pr.prompt, pr.plen), p);
	T_EQ_STR(show(pr.chosen, pr.clen), c);
	T_EQ_STR(show(pr.rejected, pr.rlen), r);
	rl_pref_fini(&pr);
}

static void
bad_line(rl_tokenizer *tok, const char *line, const char *why)
{
	rl_pref pr;
	char err[1024] = { 0 };
	int rv = 0;
	T_CAPTURE(rl_pref_parse(&pr, tok, line, strlen(line), "pairs.jsonl: line 7"), &rv, err);
	T_EQ_INT(rv, RL_EFORMAT);
	T_OK(strstr(err, "pairs.jsonl: line 7: ") != NULL && strstr(err, why) != NULL, "'%s': got '%s'", why, err);
	T_OK(pr.prompt == NULL && pr.chosen == NULL && pr.rejected == NULL, "nothing left allocated");
}

int
main(void)
{
	char path[64];
	rl_tokenizer *tok = NULL;

	T_BEGIN("test_prefs");
	snprintf(path, sizeof path, "/tmp/test_prefs.%d.json", (int)getpid());
	FILE *f = fopen(path, "w");
	fputs(tokjson, f);
	fclose(f);
	T_EQ_INT(rl_tokenizer_open(&tok, path), RL_OK);
	unlink(path);

	/* standard text form: EOS after each completion */
	ok_line(tok, "{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"5\"}", "2+2=", "4<E>", "5<E>");
	/* implicit text prompt: the shared prefix, its trailing space left to the completions */
	ok_line(tok, "{\"chosen\": \"The sky is blue\", \"rejected\": \"The sky is green\"}", "The sky is",
	    " blue<E>", " green<E>");
	/* conversational */
	ok_line(tok,
	    "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}],"
	    " \"chosen\": [{\"role\": \"assistant\", \"content\": \"hello\"}],"
	    " \"rejected\": [{\"role\": \"assistant\", \"content\": \"go\"}]}",
	    "<S>user\nhi<F>\n<S>assistant\n", "hello<F>\n", "go<F>\n");
	/* implicit conversational prompt: the shared leading messages */
	ok_line(tok,
	    "{\"chosen\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"},"
	    " {\"role\": \"assistant\", \"content\": \"hello\"}],"
	    " \"rejected\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"},"
	    " {\"role\": \"assistant\", \"content\": \"good day to you\"}]}",
	    "<S>system\nbe brief<F>\n<S>user\nhi<F>\n<S>assistant\n", "hello<F>\n", "good day to you<F>\n");

	bad_line(tok, "{\"prompt\": \"a\", \"chosen\": \"b\"", "not JSON");
	bad_line(tok, "[1, 2]", "not a JSON object");
	bad_line(tok, "{\"prompt\": \"a\", \"rejected\": \"b\"}", "no 'chosen'");
	bad_line(tok, "{\"prompt\": \"a\", \"chosen\": \"b\"}", "no 'rejected'");
	bad_line(tok, "{\"prompt\": \"a\", \"chosen\": \"\", \"rejected\": \"b\"}", "'chosen' is empty");
	bad_line(tok, "{\"prompt\": \"\", \"chosen\": \"c\", \"rejected\": \"b\"}", "'prompt' is empty");
	bad_line(tok, "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"b\"}", "'chosen' and 'rejected' are identical");
	bad_line(tok, "{\"chosen\": \"same\", \"rejected\": \"same\"}", "'chosen' and 'rejected' are identical");
	bad_line(tok, "{\"chosen\": \"abc\", \"rejected\": \"xyz\"}", "share no leading text");
	bad_line(tok, "{\"prompt\": \"a\", \"chosen\": [], \"rejected\": \"b\"}", "must be all text or all lists");
	bad_line(tok, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [],"
	    " \"rejected\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", "'chosen' is empty");
	bad_line(tok, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}],"
	    " \"chosen\": [{\"content\": \"x\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"y\"}]}",
	    "message 0 of 'chosen' needs a \"role\" and a \"content\" string");
	bad_line(tok, "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"x\"}],"
	    " \"rejected\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"x\"}]}",
	    "'chosen' and 'rejected' are identical");
	bad_line(tok, "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}],"
	    " \"rejected\": [{\"role\": \"user\", \"content\": \"r\"}]}", "share no leading message");
	bad_line(tok, "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}],"
	    " \"rejected\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"x\"}]}",
	    "'chosen' is empty after the shared prompt");
	rl_tokenizer_close(tok);
	T_END();
}

/* test_sftdata.c — lib/train/sftdata.c, TRL's SFT rows into records
 * (rli_sft_line), with the bytes tokenizer (a byte is its own id, <|eos|>
 * 257, <|im_start|> 259, <|im_end|> 260, ChatML): each form's ids and loss
 * mask on hand-worked rows, rlpipe records left to the record parser, and
 * bad rows refused with the line named.
 * `test_sftdata TOKDIR ROWS.jsonl` instead prints each row's record as
 * JSON (or {"error": N}) for tests/cli/rl-train-sft-data.bats, which
 * compares it with an independent rendering (tests/fixtures/sft_oracle.py). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "stream/traj.h"
#include "train/trainer.h"
#include "t.h"

static char msg[4096];
#define HAS(s) T_OK(strstr(msg, (s)) != NULL, "stderr \"%s\" lacks \"%s\"", msg, (s))

static char tmpdir[] = "/tmp/rl-sftdata-test.XXXXXX";

static int
conv(trainer *tr, rl_traj *t, const char *line)
{
	return rli_sft_line(tr, t, line, strlen(line), "'d.jsonl': line 7", 7);
}

/* the record's ids as "p:97 | r:98 257 | m:1 1" */
static void
show(const rl_traj *t, char *out, size_t cap)
{
	const int32_t *p = NULL, *r = NULL;
	const uint8_t *m = NULL;
	size_t np = 0, nr = 0, nm = 0, o = 0;

	rl_traj_get_i32s(t, RL_TAG_PROMPT, &p, &np);
	rl_traj_get_i32s(t, RL_TAG_RESPONSE, &r, &nr);
	rl_traj_get_u8s(t, RL_TAG_LOSS_MASK, &m, &nm);
	o += snprintf(out + o, cap - o, "p:");
	for (size_t i = 0; i < np && o < cap; i++)
		o += snprintf(out + o, cap - o, " %d", p[i]);
	o += snprintf(out + o, cap - o, " | r:");
	for (size_t i = 0; i < nr && o < cap; i++)
		o += snprintf(out + o, cap - o, " %d", r[i]);
	if (nm && o < cap) {
		o += snprintf(out + o, cap - o, " | m:");
		for (size_t i = 0; i < nm && o < cap; i++)
			o += snprintf(out + o, cap - o, " %d", m[i]);
	}
}

static void
test_forms(trainer *tr, rl_traj *t)
{
	char s[2048];
	uint64_t id = 0;

	T_EQ_INT(conv(tr, t, "{\"text\": \"ab\"}"), 0);
	show(t, s, sizeof s);
	T_EQ_STR(s, "p: 97 | r: 98 257");
	T_EQ_INT(rl_traj_get_u64(t, RL_TAG_ID, &id), 0);
	T_EQ_INT(id, 7);
	T_EQ_INT(conv(tr, t, "{\"prompt\": \"a\", \"completion\": \"b\", \"source\": \"x\"}"), 0);
	show(t, s, sizeof s);
	T_EQ_STR(s, "p: 97 | r: 98 257");
	/* ChatML: "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" is the prompt */
	T_EQ_INT(conv(tr, t, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], "
	    "\"completion\": [{\"role\": \"assistant\", \"content\": \"A\"}]}"), 0);
	show(t, s, sizeof s);
	T_EQ_STR(s, "p: 259 117 115 101 114 10 113 260 10 259 97 115 115 105 115 116 97 110 116 10 | r: 65 260 10");
	/* two assistant turns: the user turn between them is not trained */
	T_EQ_INT(conv(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
	    "{\"role\": \"assistant\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"r\"}, "
	    "{\"role\": \"assistant\", \"content\": \"B\"}]}"), 0);
	show(t, s, sizeof s);
	T_EQ_STR(s, "p: 259 117 115 101 114 10 113 260 10 259 97 115 115 105 115 116 97 110 116 10 | r: 65 260 10 "
	    "259 117 115 101 114 10 114 260 10 259 97 115 115 105 115 116 97 110 116 10 66 260 10 | m: 1 1 1 "
	    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 1");
	/* a trailing user turn trains nothing: left out */
	T_EQ_INT(conv(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
	    "{\"role\": \"assistant\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"r\"}]}"), 0);
	show(t, s, sizeof s);
	T_EQ_STR(s, "p: 259 117 115 101 114 10 113 260 10 259 97 115 115 105 115 116 97 110 116 10 | r: 65 260 10");
}

static void
test_not_sft(trainer *tr, rl_traj *t)
{
	T_EQ_INT(conv(tr, t, "{\"id\": 1, \"prompt\": [1, 2], \"response\": [3]}"), RL_ENOENT);
	T_EQ_INT(conv(tr, t, "{\"id\": 1, \"prompt_text\": \"a\", \"response_text\": \"b\"}"), RL_ENOENT);
	T_EQ_INT(conv(tr, t, "not json"), RL_ENOENT);
}

static void
bad(trainer *tr, rl_traj *t, const char *line, const char *want)
{
	int rv;

	T_CAPTURE(conv(tr, t, line), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	HAS("'d.jsonl': line 7");
	HAS(want);
	T_EQ_INT(rl_traj_nfields(t), 0);
}

static void
test_bad(trainer *tr, rl_traj *t)
{
	bad(tr, t, "{\"prompt\": \"a\"}", "missing field 'completion'");
	bad(tr, t, "{\"completion\": \"a\"}", "missing field 'prompt'");
	bad(tr, t, "{\"prompt\": \"a\", \"completion\": \"\"}", "field 'completion' is empty");
	bad(tr, t, "{\"prompt\": \"a\", \"completion\": 3}", "both be strings or both be lists of messages");
	bad(tr, t, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": []}",
	    "field 'completion' is an empty list");
	bad(tr, t, "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": [{\"content\": \"q\"}]}",
	    "field 'completion': message 1 needs a string \"role\"");
	bad(tr, t, "{\"text\": 5}", "field 'text': expected a string, got a number");
	bad(tr, t, "{\"text\": \"\"}", "field 'text' is empty");
	bad(tr, t, "{\"text\": \"a\\u0000b\"}", "\\u0000 in the row");
	bad(tr, t, "{\"messages\": \"hi\"}", "field 'messages': expected a non-empty list");
	bad(tr, t, "{\"messages\": []}", "an empty list");
	bad(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "has no assistant message");
	bad(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": 1}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
	    "message 1: \"content\" must be text");
	bad(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
	    "\"content\": \"a\"}], \"tools\": [{\"type\": \"function\"}]}", "field 'tools'");
	bad(tr, t, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
	    "\"content\": \"a\"}], \"chat_template_kwargs\": {\"x\": 1}}", "\"x\" is not one rlpipe knows");
}

/* TOKDIR ROWS: one JSON line per row, the record or {"error": rv} */
static int
dump(trainer *tr, const char *rows)
{
	FILE *f = fopen(rows, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	uint64_t no = 0;
	rl_traj *t = NULL;
	rl_buf b;

	if (!f || rl_traj_create(&t) != 0)
		return 2;
	rl_buf_init(&b);
	while ((n = getline(&line, &cap, f)) > 0) {
		int rv = rli_sft_line(tr, t, line, (size_t)n, rows, ++no);
		b.len = 0;
		if (rv == 0 && rl_traj_to_json(&b, t) == 0)
			fwrite(b.p, 1, b.len, stdout);
		else
			printf("{\"error\": %d}\n", rv);
	}
	free(line);
	rl_buf_fini(&b);
	rl_traj_destroy(t);
	fclose(f);
	return 0;
}

int
main(int argc, char **argv)
{
	trainer tr;
	rl_traj *t = NULL;
	char path[600];
	FILE *f;

	T_BEGIN("test_sftdata");
	rl_log_init("test_sftdata", RL_LOG_NORMAL);
	memset(&tr, 0, sizeof tr);
	if (argc == 3) {
		if (rl_tokenizer_open(&tr.tok, argv[1]) != 0)
			return 2;
		int rv = dump(&tr, argv[2]);
		rl_tokenizer_close(tr.tok);
		return rv;
	}
	if (!mkdtemp(tmpdir))
		return 1;
	snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
	if (!(f = fopen(path, "wb")) || fputs(rl_tokenizer_bytes_json(), f) < 0 || fclose(f) != 0)
		return 1;
	T_EQ_INT(rl_tokenizer_open(&tr.tok, tmpdir), 0);
	T_EQ_INT(rl_traj_create(&t), 0);
	if (tr.tok && t) {
		test_forms(&tr, t);
		test_not_sft(&tr, t);
		test_bad(&tr, t);
	}
	rl_traj_destroy(t);
	rl_tokenizer_close(tr.tok);
	unlink(path);
	rmdir(tmpdir);
	T_END();
}

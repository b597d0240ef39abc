/*
 * tokenize.c — `rl-rollout tokenize`: look at what the tokenizer does to a
 * prompt.  Encodes each input line (or NUL-terminated record with -0) to one
 * JSON line {"ids":[...]}; with --chat each line is a chat (JSON messages, or
 * plain text taken as one user message) rendered with the chat template, and
 * the rendered text is printed beside the ids; with --decode each line holds
 * ids ([...] or {"ids":[...]}) and the exact decoded bytes are printed.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "base/cli.h"
#include "base/core.h"
#include "base/json.h"
#include "rollout/prompt.h"
#include "tok/tokenizer.h"
#include "stream/traj.h"

typedef struct tok_config {
	const char *model;
	const char *input;
	int chat, decode, nul, special, gen_prompt, skip_special, tpl;
	int thinking; /* enable_thinking where a line does not say: 1, or 0 (--no-thinking) */
} tok_config;

static const char usage_text[] =
	"usage: rl-rollout tokenize -m MODEL_DIR [--chat] [--decode] [OPTIONS] [FILE|-]\n"
	"\n"
	"Encode each input line to one JSON line {\"ids\":[...]}, or decode ids back.\n"
	"\n"
	"  -m, --model DIR          model directory (tokenizer.json) or tokenizer file\n"
	"  -c, --chat               each line is a chat: a JSON array of {\"role\",\"content\"}\n"
	"                           messages (content text or OpenAI content parts),\n"
	"                           {\"messages\":[...], \"chat_template_kwargs\":{...}}, or\n"
	"                           plain text (one user message); prints\n"
	"                           {\"ids\":[...],\"text\":\"...\"}\n"
	"  -t, --template NAME      chat template: auto (default), chatml, plain\n"
	"  -G, --no-generation-prompt  do not end a chat with the assistant prompt\n"
	"      --no-thinking        enable_thinking=false (Qwen3's template) where a line's\n"
	"                           chat_template_kwargs do not say\n"
	"  -d, --decode             each line is [ids...] or {\"ids\":[...]}; print the text\n"
	"  -S, --no-special         do not match special-token strings in the text\n"
	"      --skip-special       with --decode: leave special tokens out\n"
	"  -0, --null               text records end with NUL instead of newline (the\n"
	"                           input of encoding, the output of --decode); JSON\n"
	"                           lines always end with newline\n"
	"  -q, --quiet              errors only\n"
	"  -v, --verbose            more messages\n"
	"      --config FILE        options from a YAML file (keys: long options)\n"
	"      --version            print the program version and exit\n"
	"  -h, --help               this help\n";

static void
json_str(FILE *f, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	fputc('"', f);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = p[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\r')
			fputs("\\r", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c < 0x20 || c == 0x7f)
			fprintf(f, "\\u%04x", c);
		else if (c < 0x80)
			fputc(c, f);
		else {
			/* copy valid UTF-8, write U+FFFD for a broken byte (overlong
			 * forms and surrogates included: the line stays UTF-8) */
			size_t k = rl_utf8_char_len(p + i, n - i);
			if (k) {
				fwrite(p + i, 1, k, f);
				i += k - 1;
			} else {
				fputs("\\ufffd", f);
			}
		}
	}
	fputc('"', f);
}

static void
print_ids(FILE *f, const rl_tokens *t)
{
	fputs("{\"ids\":[", f);
	for (size_t i = 0; i < t->n; i++)
		fprintf(f, i ? ",%d" : "%d", (int)t->ids[i]);
	fputc(']', f);
}

static int
decode_line(FILE *out, const rl_tokenizer *tok, const tok_config *c, const char *line, size_t lineno)
{
	cJSON *root = rl_json_parse_all(line, strlen(line));
	const cJSON *arr = root;
	int32_t *ids = NULL;
	char *text = NULL;
	size_t n = 0, len;
	int rv = RL_EFORMAT;
	if (cJSON_IsObject(arr))
		arr = cJSON_GetObjectItemCaseSensitive(arr, "ids");
	if (!cJSON_IsArray(arr)) {
		rl_error("line %zu: expected a JSON array of token ids or {\"ids\": [...]}", lineno);
		goto out;
	}
	ids = rl_xcalloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof(*ids));
	for (const cJSON *x = arr->child; x; x = x->next) {
		if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int32_t)x->valuedouble) {
			rl_error("line %zu: token %zu is not an integer", lineno, n + 1);
			goto out;
		}
		ids[n] = (int32_t)x->valuedouble;
		size_t tl;
		if (rl_tokenizer_token(tok, ids[n], &tl) == NULL) {
			rl_error("line %zu: token %zu: id %d is not in the vocabulary (0..%d)", lineno, n + 1, (int)ids[n],
			    (int)rl_tokenizer_vocab_size(tok) - 1);
			goto out;
		}
		n++;
	}
	if ((rv = rl_tokenizer_decode(&text, &len, tok, ids, n, c->skip_special ? RL_TOK_SKIP_SPECIAL : 0)) != 0) {
		rl_error("line %zu: cannot decode: %s", lineno, rl_strerror(rv));
		goto out;
	}
	fwrite(text, 1, len, out);
	fputc(c->nul ? 0 : '\n', out);
out:
	free(text);
	free(ids);
	cJSON_Delete(root);
	return rv;
}

static int
encode_line(FILE *out, rl_tokenizer *tok, const tok_config *c, const char *line, size_t len, size_t lineno)
{
	rl_tokens t = { 0 };
	int rv, flags = c->special ? RL_TOK_SPECIAL : 0;
	if (!c->chat) {
		if ((rv = rl_tokenizer_encode(&t, tok, line, len, flags)) == 0) {
			print_ids(out, &t);
			fputs("}\n", out);
		} else {
			rl_error("line %zu: cannot encode: %s", lineno, rl_strerror(rv));
		}
		rl_tokens_fini(&t);
		return rv;
	}
	cJSON *root = NULL;
	rl_prompt_chat ch;
	char *text = NULL, what[64];
	size_t tlen;
	if (c->gen_prompt)
		flags |= RL_TOK_GEN_PROMPT;
	snprintf(what, sizeof what, "line %zu", lineno);
	if ((rv = rl_prompt_chat_line(&ch, &root, line, len, what)) == 0 && (ch.thinking < 0 ? c->thinking : ch.thinking) == 0)
		flags |= RL_TOK_NO_THINKING;
	if (rv == 0 && (rv = rl_tokenizer_apply_chat(&t, tok, ch.msgs, ch.n, c->tpl, flags)) == 0 &&
	    (rv = rl_tokenizer_render_chat(&text, &tlen, tok, ch.msgs, ch.n, c->tpl, flags)) == 0) {
		print_ids(out, &t);
		fputs(",\"text\":", out);
		json_str(out, text, tlen);
		fputs("}\n", out);
	} else if (rv != RL_EFORMAT) {
		rl_error("line %zu: cannot apply the chat template: %s", lineno, rl_strerror(rv));
	}
	free(text);
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(root);
	rl_tokens_fini(&t);
	return rv;
}

int
rl_cmd_tokenize(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "chat", no_argument, NULL, 'c' },
		{ "template", required_argument, NULL, 't' },
		{ "no-generation-prompt", no_argument, NULL, 'G' },
		{ "decode", no_argument, NULL, 'd' },
		{ "no-special", no_argument, NULL, 'S' },
		{ "skip-special", no_argument, NULL, 1 },
		{ "no-thinking", no_argument, NULL, 2 },
		{ "null", no_argument, NULL, '0' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	tok_config c = { .special = 1, .gen_prompt = 1, .thinking = 1, .tpl = RL_CHAT_AUTO, .input = "-" };
	rl_tokenizer *tok = NULL;
	FILE *in = NULL;
	char *line = NULL;
	size_t cap = 0, lineno = 0;
	int o, rv = 0, status = 1;
	static char prog[] = "rl-rollout: tokenize";

	rl_cli_init("rl-rollout tokenize", opts);
	argv[0] = prog;   /* getopt's own messages: "rl-rollout: tokenize: unrecognized option ..." */
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	optind = 1;
	while ((o = rl_cli_getopt(argc, argv, "m:ct:GdS0qvh", NULL)) != -1) {
		switch (o) {
		case 'm': c.model = optarg; break;
		case 'c': c.chat = 1; break;
		case 't':
			if ((c.tpl = rl_chat_template_parse(optarg)) < 0)
				return rl_cli_usage("tokenize: --template: unknown chat template '%s' (auto, chatml, plain)",
				    optarg);
			break;
		case 'G': c.gen_prompt = 0; break;
		case 'd': c.decode = 1; break;
		case 'S': c.special = 0; break;
		case 1: c.skip_special = 1; break;
		case 2: c.thinking = 0; break;
		case '0': c.nul = 1; break;
		case 'q': rl_log_set_level(RL_LOG_QUIET); break;
		case 'v': rl_log_set_level(rl_log_level() + 1); break;
		case 'h':
			fputs(usage_text, stdout);
			return fclose(stdout) == 0 ? 0 : 1;
		default:
			fputs("rl-rollout: hint: rl-rollout tokenize --help lists the options\n", stderr);
			return 2;
		}
	}
	if (!c.model)
		return rl_cli_usage("tokenize: -m MODEL_DIR is required");
	if (c.chat && c.decode)
		return rl_cli_usage("tokenize: --chat and --decode do not go together");
	if (optind + 1 < argc)
		return rl_cli_usage("tokenize: one input file at most");
	if (optind < argc)
		c.input = argv[optind];
	if ((rv = rl_tokenizer_open(&tok, c.model)) != 0)
		goto out;
	rl_verbose("tokenizer '%s': %s, %d ids, eos %d, chat template %s", c.model, rl_tokenizer_kind(tok),
		   (int)rl_tokenizer_vocab_size(tok), (int)rl_tokenizer_eos_id(tok),
		   rl_chat_template_name(rl_tokenizer_chat_template(tok)));
	in = strcmp(c.input, "-") == 0 ? stdin : fopen(c.input, "rb");
	if (!in) {
		rl_error("cannot open '%s': %s", c.input, strerror(errno));
		goto out;
	}
	for (;;) {
		int delim = c.nul && !c.decode ? 0 : '\n';
		ssize_t n = getdelim(&line, &cap, delim, in);
		if (n < 0)
			break;
		lineno++;
		if (n > 0 && line[n - 1] == delim)
			line[--n] = 0;
		if (c.decode)
			rv = decode_line(stdout, tok, &c, line, lineno);
		else
			rv = encode_line(stdout, tok, &c, line, (size_t)n, lineno);
		if (rv)
			goto out;
	}
	if (ferror(in)) {
		rl_error("cannot read '%s': %s", c.input, strerror(errno));
		goto out;
	}
	status = 0;
out:
	if (in && in != stdin)
		fclose(in);
	free(line);
	rl_tokenizer_close(tok);
	if (fclose(stdout) != 0 && status == 0) {
		rl_error("cannot write to standard output: %s", strerror(errno));
		status = 1;
	}
	return status;
}

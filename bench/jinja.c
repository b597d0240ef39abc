/*
 * bench/jinja.c — chat template rendering time with the Jinja engine.
 *
 *   build/bench/jinja [-r REPEAT] NAME=TEMPLATE_FILE ...
 *
 * For each template (a tokenizer_config.json, whose "chat_template" is used, or
 * a .jinja file) renders a 10-turn conversation (a system prompt, five user
 * and four assistant turns of about 200 bytes, the generation prompt) REPEAT
 * times (default 2000) and prints one JSON line per template: the parse time,
 * the render time of a parsed template, and parse + render, in microseconds
 * per call (wall clock, one core), and the output size.  When the template
 * file lies in a model directory (tokenizer.json beside it), the tokenizer is
 * opened there and the same conversation timed through it too: "chat_render_us"
 * (rl_tokenizer_render_chat, the template parsed once at open) and
 * "chat_ids_us" (rl_tokenizer_apply_chat: render and encode).
 * The real templates are in the npm cache of tests/tokenizer/fetch.sh.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "tok/jinja.h"
#include "tok/tokenizer.h"

static cJSON *
conversation(void)
{
	static const char turn[] = "Explain, in a paragraph, why the sky is blue and why sunsets are red; "
				   "mention Rayleigh scattering, the path length of light through the air, "
				   "and what changes at noon. Keep it short.";
	cJSON *ctx = cJSON_CreateObject(), *ms = cJSON_AddArrayToObject(ctx, "messages");
	for (int i = 0; i < 10; i++) {
		cJSON *m = cJSON_CreateObject();
		cJSON_AddStringToObject(m, "role", i == 0 ? "system" : i % 2 ? "user" : "assistant");
		cJSON_AddStringToObject(m, "content", turn);
		cJSON_AddItemToArray(ms, m);
	}
	cJSON_AddTrueToObject(ctx, "add_generation_prompt");
	cJSON_AddStringToObject(ctx, "bos_token", "<s>");
	cJSON_AddStringToObject(ctx, "eos_token", "</s>");
	return ctx;
}

/* The conversation through a tokenizer opened on DIR: microseconds per
 * render_chat and per apply_chat, or -1 each when DIR has no tokenizer.json. */
static int
bench_tokenizer(const char *dir, const cJSON *ctx, int repeat, double *render_us, double *ids_us)
{
	char tj[4096];
	rl_tokenizer *t = NULL;
	rl_chat_msg m[16];
	size_t n = 0, len;
	int rv;
	*render_us = *ids_us = -1;
	snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
	if (access(tj, R_OK) != 0)
		return 0;
	if ((rv = rl_tokenizer_open(&t, dir)) != 0)
		return rv;
	const cJSON *x;
	cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(ctx, "messages"))
		if (n < 16)
			m[n++] = (rl_chat_msg){ .role = cJSON_GetObjectItemCaseSensitive(x, "role")->valuestring,
						.content = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring };
	rl_tokens ids = { 0 };
	double t0 = rl_now();
	for (int i = 0; i < repeat && !rv; i++) {
		char *text = NULL;
		rv = rl_tokenizer_render_chat(&text, &len, t, m, n, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT);
		free(text);
	}
	double t1 = rl_now();
	for (int i = 0; i < repeat && !rv; i++) {
		ids.n = 0;
		rv = rl_tokenizer_apply_chat(&ids, t, m, n, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT);
	}
	double t2 = rl_now();
	*render_us = (t1 - t0) / repeat * 1e6;
	*ids_us = (t2 - t1) / repeat * 1e6;
	rl_tokens_fini(&ids);
	rl_tokenizer_close(t);
	return rv;
}

static int
bench_one(const char *name, const char *path, int repeat, const cJSON *ctx)
{
	char *src = NULL, *out = NULL;
	size_t n, on = 0;
	int rv;
	if ((rv = rl_io_read_file(path, 0, &src, &n)) != 0)
		return rv;
	cJSON *cfg = cJSON_ParseWithLength(src, n);
	const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
	const char *text = cJSON_IsString(ct) ? ct->valuestring : src;
	size_t tn = strlen(text);
	rl_jinja *t = NULL;
	double t0 = rl_now();
	for (int i = 0; i < repeat; i++) {
		rl_jinja_free(t);
		if ((rv = rl_jinja_parse(&t, text, tn, path)) != 0)
			goto out;
	}
	double t1 = rl_now();
	for (int i = 0; i < repeat; i++) {
		free(out);
		if ((rv = rl_jinja_render(&out, &on, t, ctx, NULL)) != 0)
			goto out;
	}
	double t2 = rl_now(), chat_us, ids_us;
	char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
	if (!dir) {
		rv = RL_ENOMEM;
		goto out;
	}
	if (slash)
		*slash = 0;
	rv = bench_tokenizer(slash ? dir : ".", ctx, repeat, &chat_us, &ids_us);
	free(dir);
	if (rv)
		goto out;
	printf("{\"bench\":\"jinja\",\"template\":\"%s\",\"turns\":10,\"repeat\":%d,\"parse_us\":%.2f,"
	       "\"render_us\":%.2f,\"parse_render_us\":%.2f,\"output_bytes\":%zu",
	       name, repeat, (t1 - t0) / repeat * 1e6, (t2 - t1) / repeat * 1e6, (t2 - t0) / repeat * 1e6, on);
	if (chat_us >= 0)
		printf(",\"chat_render_us\":%.2f,\"chat_ids_us\":%.2f", chat_us, ids_us);
	printf("}\n");
out:
	free(out);
	rl_jinja_free(t);
	cJSON_Delete(cfg);
	free(src);
	return rv;
}

int
main(int argc, char **argv)
{
	int repeat = 2000, c, rv = 0;
	while ((c = getopt(argc, argv, "r:")) != -1) {
		if (c == 'r')
			repeat = atoi(argv[optind - 1]);
		else
			return 2;
	}
	if (optind >= argc || repeat < 1) {
		fprintf(stderr, "usage: jinja [-r REPEAT] NAME=TEMPLATE_FILE ...\n");
		return 2;
	}
	cJSON *ctx = conversation();
	for (int i = optind; i < argc && !rv; i++) {
		char *eq = strchr(argv[i], '=');
		if (!eq) {
			fprintf(stderr, "jinja: expected NAME=FILE, got '%s'\n", argv[i]);
			rv = 2;
			break;
		}
		*eq = 0;
		rv = bench_one(argv[i], eq + 1, repeat, ctx) ? 1 : 0;
	}
	cJSON_Delete(ctx);
	return rv;
}

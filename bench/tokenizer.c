/*
 * bench/tokenizer.c — encode and decode speed of one tokenizer on one core.
 *
 *   build/bench/tokenizer -m MODEL_DIR [-n NAME] [-r REPEAT] CORPUS
 *
 * CORPUS holds NUL-terminated records (tests/tokenizer/gen_corpus.py).  Prints
 * JSON lines: load time; encode of every record with an empty word cache
 * ("cold": the first pass), then REPEAT more passes ("warm"); decode of all
 * ids.  MB/s counts input bytes (decode: output bytes) per second, 1 MB = 1e6,
 * per wall-clock second and per CPU second of this process.
 * Then the pre-tokenizer alone on the same text: the hand-written Qwen2 and
 * GPT-2 matchers against PCRE2 (JIT) running the same patterns.
 * bench/tokenizer.sh runs it beside the JavaScript encoder.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "tok/tok_impl.h"
#include "tok/tokenizer.h"

static double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wall0, cpu0;

static void
start(void)
{
	wall0 = rl_now();
	cpu0 = cpu_now();
}

/* One JSON line for the work since start(): wall and CPU seconds, MB/s of both
 * (on a loaded machine the CPU figure is the one-core speed). */
static void
line(const char *name, const char *op, size_t bytes, size_t records, size_t tokens)
{
	double s = rl_now() - wall0, c = cpu_now() - cpu0;
	printf("{\"bench\":\"tokenizer\",\"impl\":\"c\",\"tokenizer\":\"%s\",\"op\":\"%s\",\"bytes\":%zu,"
	       "\"records\":%zu,\"tokens\":%zu,\"seconds\":%.4f,\"cpu_seconds\":%.4f,\"mb_per_s\":%.2f,"
	       "\"mb_per_cpu_s\":%.2f}\n",
	       name, op, bytes, records, tokens, s, c, s > 0 ? bytes / s / 1e6 : 0.0, c > 0 ? bytes / c / 1e6 : 0.0);
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	const char *model = NULL, *name = "model";
	int repeat = 3, o;
	rl_log_init("tokenizer-bench", RL_LOG_NORMAL);
	while ((o = getopt(argc, argv, "m:n:r:")) != -1) {
		switch (o) {
		case 'm': model = optarg; break;
		case 'n': name = optarg; break;
		case 'r': repeat = atoi(optarg); break;
		default: goto usage;
		}
	}
	if (!model || optind + 1 != argc) {
	usage:
		fprintf(stderr, "usage: tokenizer -m MODEL_DIR [-n NAME] [-r REPEAT] CORPUS\n");
		return 2;
	}
	FILE *f = fopen(argv[optind], "rb");
	if (!f) {
		rl_error("cannot open '%s'", argv[optind]);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	size_t len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *text = rl_xmalloc(len + 1);
	if (fread(text, 1, len, f) != len) {
		rl_error("cannot read '%s'", argv[optind]);
		return 1;
	}
	fclose(f);
	text[len] = 0;

	size_t nrec = 0;
	for (size_t i = 0; i < len; i++)
		nrec += text[i] == 0;
	size_t *off = rl_xcalloc(nrec + 1, sizeof(*off)), k = 0;
	for (size_t i = 0; i < len; i++)
		if (text[i] == 0)
			off[++k] = i + 1;

	rl_tokenizer *tok;
	start();
	if (rl_tokenizer_open(&tok, model) != 0)
		return 1;
	line(name, "load", 0, 0, (size_t)rl_tokenizer_vocab_size(tok));

	rl_tokens *ids = rl_xcalloc(nrec, sizeof(*ids));
	size_t bytes = len - nrec, ntok = 0;
	start();
	for (size_t r = 0; r < nrec; r++)
		if (rl_tokenizer_encode(&ids[r], tok, text + off[r], off[r + 1] - off[r] - 1, RL_TOK_SPECIAL) != 0)
			return 1;
	for (size_t r = 0; r < nrec; r++)
		ntok += ids[r].n;
	line(name, "encode_cold", bytes, nrec, ntok);
	if (repeat > 0) {
		start();
		for (int p = 0; p < repeat; p++)
			for (size_t r = 0; r < nrec; r++) {
				ids[r].n = 0;
				rl_tokenizer_encode(&ids[r], tok, text + off[r], off[r + 1] - off[r] - 1, RL_TOK_SPECIAL);
			}
		line(name, "encode_warm", bytes * (size_t)repeat, nrec * (size_t)repeat, ntok * (size_t)repeat);
	}
	size_t out = 0;
	int passes = repeat > 0 ? repeat : 1;
	start();
	for (int p = 0; p < passes; p++)
		for (size_t r = 0; r < nrec; r++) {
			char *d;
			size_t dl;
			if (rl_tokenizer_decode(&d, &dl, tok, ids[r].ids, ids[r].n, 0) != 0)
				return 1;
			out += dl;
			free(d);
		}
	line(name, "decode", out, nrec * (size_t)passes, ntok * (size_t)passes);
	const char *pats[2] = { rli_tok_qwen2_pattern, rli_tok_gpt2_pattern };
	const char *pnames[2] = { "split_qwen2", "split_gpt2" };
	for (int p = 0; p < 2; p++)
		for (int force = 0; force < 2; force++) {
			rli_splitter sp;
			uint32_t *ends = NULL;
			size_t ne = 0, cap = 0, pieces = 0;
			char op[64];
			if (rli_splitter_init(&sp, pats[p], force) != 0)
				return 1;
			start();
			for (int k = 0; k < passes; k++)
				for (size_t r = 0; r < nrec; r++) {
					ne = 0;
					rli_split(&sp, (const uint8_t *)text + off[r], off[r + 1] - off[r] - 1, &ends, &ne, &cap);
					pieces += ne;
				}
			snprintf(op, sizeof(op), "%s_%s", pnames[p], force ? "pcre2" : "hand");
			line(name, op, bytes * (size_t)passes, nrec * (size_t)passes, pieces);
			free(ends);
			rli_splitter_fini(&sp);
		}
	for (size_t r = 0; r < nrec; r++)
		rl_tokens_fini(&ids[r]);
	free(ids);
	free(off);
	free(text);
	rl_tokenizer_close(tok);
	return 0;
}

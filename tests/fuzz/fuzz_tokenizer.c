/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer.  The first input byte
 * picks what the rest is:
 *   0: a tokenizer.json (loading must fail cleanly or give a usable tokenizer);
 *   1: text for a small byte-level BPE with the GPT-2 split: decode(encode(x)) == x,
 *      with and without special tokens;
 *   2: text for a small BPE with NFC and the Qwen2 split: decode(encode(x)) == NFC(x),
 *      and NFC(NFC(x)) == NFC(x);
 *   3: text for both split patterns: the hand-written matchers agree with PCRE2
 *      (invalid UTF-8 included: both split it as U+FFFD would; U+0085, U+180E, U+FEFF
 *      included: the PCRE2 path spells \s as the ECMAScript set, as the hand matchers
 *      have it; without code points one library assigns and the other does not: utf8proc 2.8 has
 *      Unicode 15.0, PCRE2 10.42 has 14.0, so U+1E05F, a Cyrillic modifier letter of
 *      15.0, is a letter to the first and unassigned to the second).
 * Built and run by tests/fuzz/run-tokenizer.sh, not by make check.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "tok/tok_impl.h"
#include "tok/tokenizer.h"
#include <utf8proc.h>

static rl_tokenizer *gpt2_like, *qwen_like;
static rli_splitter hand[2], re[2];
static pcre2_code *unassigned;        /* \p{Cn}: PCRE2's Unicode has no such character */
static pcre2_match_data *unassigned_md;

/* cp is assigned in one library's Unicode and not in the other's */
static int
unicode_versions_differ(uint32_t cp)
{
	uint8_t u[4];
	utf8proc_ssize_t l = utf8proc_encode_char((utf8proc_int32_t)cp, u);
	int pcre_cn = pcre2_match(unassigned, u, (PCRE2_SIZE)l, 0, 0, unassigned_md, NULL) >= 0;
	int u8p_cn = utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_CN;
	return pcre_cn != u8p_cn;
}
static char dir[] = "/tmp/rl-fuzz-tok.XXXXXX";

/* byte-level spelling of one byte, JSON-escaped */
static void
put_byte(FILE *f, int b)
{
	uint32_t cp = rli_byte_to_cp((uint8_t)b);
	if (cp == '"' || cp == '\\')
		fprintf(f, "\\%c", (char)cp);
	else if (cp < 0x80)
		fputc((int)cp, f);
	else
		fprintf(f, "%c%c", (char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)));
}

static rl_tokenizer *
make(const char *name, const char *pretok, int nfc)
{
	static const char *m[][2] = { { "t", "h" }, { "th", "e" }, { " ", "the" }, { "i", "n" }, { " ", "in" },
				      { "e", "r" }, { "a", "n" }, { "\xc3", "\xa9" }, { "\xe4", "\xbd" }, { "\xe4\xbd", "\xa0" }, { " ", " " } };
	char path[256];
	snprintf(path, sizeof(path), "%s/%s.json", dir, name);
	FILE *f = fopen(path, "w");
	fprintf(f, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
	for (int b = 0; b < 256; b++) {
		fputc('"', f);
		put_byte(f, b);
		fprintf(f, "\":%d,", b);
	}
	int id = 256;
	for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		fputc('"', f);
		for (const char *p = m[i][0]; *p; p++)
			put_byte(f, (uint8_t)*p);
		for (const char *p = m[i][1]; *p; p++)
			put_byte(f, (uint8_t)*p);
		fprintf(f, "\":%d%s", id++, i + 1 < sizeof(m) / sizeof(m[0]) ? "," : "");
	}
	fprintf(f, "},\"merges\":[");
	for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		fputs("[\"", f);
		for (const char *p = m[i][0]; *p; p++)
			put_byte(f, (uint8_t)*p);
		fputs("\",\"", f);
		for (const char *p = m[i][1]; *p; p++)
			put_byte(f, (uint8_t)*p);
		fprintf(f, "\"]%s", i + 1 < sizeof(m) / sizeof(m[0]) ? "," : "");
	}
	fprintf(f, "]},\"added_tokens\":[{\"id\":%d,\"content\":\"<|s|>\",\"special\":true},"
		   "{\"id\":%d,\"content\":\"<a>\",\"special\":false,\"lstrip\":true,\"rstrip\":true}],"
		   "\"normalizer\":%s,\"pre_tokenizer\":%s,\"decoder\":{\"type\":\"ByteLevel\"}}",
		id, id + 1, nfc ? "{\"type\":\"NFC\"}" : "null", pretok);
	fclose(f);
	rl_tokenizer *t;
	if (rl_tokenizer_open(&t, path) != 0)
		abort();
	return t;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rl_log_init("fuzz_tokenizer", RL_LOG_QUIET);
	if (!mkdtemp(dir))
		abort();
	gpt2_like = make("gpt2", "{\"type\":\"ByteLevel\",\"use_regex\":true}", 0);
	char q[1024];
	snprintf(q, sizeof(q),
		 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},"
		 "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
		 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
		 "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
	qwen_like = make("qwen", q, 1);
	const char *pats[2] = { rli_tok_gpt2_pattern, rli_tok_qwen2_pattern };
	for (int i = 0; i < 2; i++)
		if (rli_splitter_init(&hand[i], pats[i], 0) != 0 || rli_splitter_init(&re[i], pats[i], 1) != 0 ||
		    hand[i].kind == RLI_SPLIT_PCRE2)
			abort();
	int err;
	PCRE2_SIZE at;
	unassigned = pcre2_compile((PCRE2_SPTR) "^\\p{Cn}$", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
	if (!unassigned || !(unassigned_md = pcre2_match_data_create_from_pattern(unassigned, NULL)))
		abort();
	return 0;
}

static void
check_roundtrip(rl_tokenizer *t, const uint8_t *s, size_t n, int flags, int nfc)
{
	rl_tokens v = { 0 };
	char *d = NULL;
	size_t dl;
	uint8_t *want = (uint8_t *)s, *again = NULL;
	size_t wl = n, al;
	if (nfc && rli_nfc(s, n, &want, &wl) != 1) {
		want = (uint8_t *)s;
		wl = n;
	}
	if (nfc && want != s && rli_nfc(want, wl, &again, &al) == 1) {
		if (al != wl || memcmp(again, want, wl) != 0)
			abort(); /* NFC is not idempotent */
		free(again);
	}
	if (rl_tokenizer_encode(&v, t, (const char *)s, n, flags) != 0 ||
	    rl_tokenizer_decode(&d, &dl, t, v.ids, v.n, 0) != 0)
		abort();
	/* rstrip/lstrip of <a> drop white space, so only compare without it */
	if (!memmem(s, n, "<a>", 3) && (dl != wl || memcmp(d, want, wl) != 0))
		abort();
	for (size_t i = 0; i < v.n; i++)
		if (v.ids[i] < 0 || v.ids[i] >= rl_tokenizer_vocab_size(t))
			abort();
	free(d);
	if (want != s)
		free(want);
	rl_tokens_fini(&v);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const uint8_t *s = data + 1;
	size_t n = size - 1;
	switch (data[0] & 3) {
	case 0: {
		char path[300];
		snprintf(path, sizeof(path), "%s/in.json", dir);
		FILE *f = fopen(path, "wb");
		fwrite(s, 1, n, f);
		fclose(f);
		rl_tokenizer *t;
		if (rl_tokenizer_open(&t, path) == 0) {
			check_roundtrip(t, (const uint8_t *)"hello w\xc3\xa9rld \xff", 14, RL_TOK_SPECIAL, 0);
			rl_tokenizer_close(t);
		}
		break;
	}
	case 1:
		check_roundtrip(gpt2_like, s, n, 0, 0);
		check_roundtrip(gpt2_like, s, n, RL_TOK_SPECIAL, 0);
		break;
	case 2:
		check_roundtrip(qwen_like, s, n, RL_TOK_SPECIAL, 1);
		break;
	case 3: {
		size_t i = 0;
		while (i < n) {
			uint32_t cp;
			int l = rli_utf8_char(s + i, n - i, &cp);
			if (l && unicode_versions_differ(cp))
				return 0;
			i += l ? (size_t)l : 1;
		}
		static uint32_t *e1, *e2;
		static size_t c1, c2;
		for (int p = 0; p < 2; p++) {
			size_t n1 = 0, n2 = 0;
			if (rli_split(&hand[p], s, n, &e1, &n1, &c1) != 0 || rli_split(&re[p], s, n, &e2, &n2, &c2) != 0)
				abort();
			if (n1 != n2 || (n1 && memcmp(e1, e2, n1 * sizeof(*e1)) != 0))
				abort();
		}
		break;
	}
	}
	return 0;
}

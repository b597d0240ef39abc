/* test_tokenizer.c — the tokenizer without network: the bytes tokenizer,
 * small byte-level BPE files written here (both merge encodings, GPT-2's file
 * pair), merge order against a naive reference BPE on random words, the
 * hand-written split patterns against PCRE2 on random text, NFC, added and
 * special tokens, chat templates, decoding of invalid UTF-8, and bad input
 * (missing model, unknown merge token, oversize file, ...).  The real
 * vocabularies are checked against their JavaScript encoders in
 * test_tokenizer_oracle.c. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "tok/tok_impl.h"
#include "tok/tokenizer.h"
#include "t.h"

static char tmpdir[] = "/tmp/rl-tok-test.XXXXXX";

static uint64_t rng_s = 0x1234567;
static uint32_t
rnd(uint32_t n)
{
	rng_s = rng_s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_s >> 33) % n;
}

static char *
tpath(const char *sub, const char *name)
{
	static char buf[4][512];
	static int k;
	char *p = buf[k++ & 3];
	snprintf(p, 512, "%s/%s%s%s", tmpdir, sub, *sub ? "/" : "", name);
	return p;
}

static void
write_file(const char *path, const char *s, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(s, 1, n, f) != n || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

static void
mkd(const char *sub)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", tpath(sub, ""));
	if (system(cmd) != 0)
		exit(1);
}

/* Byte-level spelling of raw bytes. */
static char *
bl(const char *raw, size_t n)
{
	char *o = rl_xmalloc(n * 2 + 1), *p = o;
	for (size_t i = 0; i < n; i++) {
		uint32_t cp = rli_byte_to_cp((uint8_t)raw[i]);
		if (cp < 0x80) {
			*p++ = (char)cp;
		} else {
			*p++ = (char)(0xc0 | (cp >> 6));
			*p++ = (char)(0x80 | (cp & 0x3f));
		}
	}
	*p = 0;
	return o;
}

/* A byte-level BPE tokenizer.json: the 256 bytes as ids 0..255, then one
 * token per merge (raw strings, in rank order).  PAIRS: 1 = ["a","b"] merges,
 * 0 = "a b" strings.  EXTRA is spliced into the top-level object. */
static void
write_bpe(const char *file, const char *const *ml, const char *const *mr, int nm, int pairs, const char *extra,
	  int nfc)
{
	cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
	cJSON *merges = cJSON_CreateArray();
	int id = 0;
	for (int b = 0; b < 256; b++) {
		char c = (char)b, *s = bl(&c, 1);
		cJSON_AddNumberToObject(vocab, s, id++);
		free(s);
	}
	for (int i = 0; i < nm; i++) {
		char *a = bl(ml[i], strlen(ml[i])), *b = bl(mr[i], strlen(mr[i]));
		char *ab = rl_xmalloc(strlen(a) + strlen(b) + 2);
		sprintf(ab, "%s%s", a, b);
		if (!cJSON_GetObjectItemCaseSensitive(vocab, ab))
			cJSON_AddNumberToObject(vocab, ab, id++);
		if (pairs) {
			cJSON *p = cJSON_CreateArray();
			cJSON_AddItemToArray(p, cJSON_CreateString(a));
			cJSON_AddItemToArray(p, cJSON_CreateString(b));
			cJSON_AddItemToArray(merges, p);
		} else {
			sprintf(ab, "%s %s", a, b);
			cJSON_AddItemToArray(merges, cJSON_CreateString(ab));
		}
		free(a);
		free(b);
		free(ab);
	}
	cJSON_AddStringToObject(model, "type", "BPE");
	cJSON_AddItemToObject(model, "vocab", vocab);
	cJSON_AddItemToObject(model, "merges", merges);
	cJSON_AddItemToObject(root, "model", model);
	if (nfc)
		cJSON_AddItemToObject(root, "normalizer", cJSON_Parse("{\"type\":\"NFC\"}"));
	cJSON_AddItemToObject(root, "pre_tokenizer",
			      cJSON_Parse("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"));
	cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\":\"ByteLevel\"}"));
	if (extra) {
		cJSON *x = cJSON_Parse(extra);
		for (cJSON *c = x->child; c;) {
			cJSON *nx = c->next;
			cJSON_AddItemToObject(root, c->string, cJSON_DetachItemViaPointer(x, c));
			c = nx;
		}
		cJSON_Delete(x);
	}
	char *s = cJSON_Print(root);
	write_file(file, s, strlen(s));
	free(s);
	cJSON_Delete(root);
}

static int
enc(rl_tokenizer *t, const char *s, int flags, int32_t *out, int max)
{
	rl_tokens v = { 0 };
	int rv = rl_tokenizer_encode(&v, t, s, strlen(s), flags);
	int n = rv ? -1 : (int)v.n;
	for (int i = 0; i < n && i < max; i++)
		out[i] = v.ids[i];
	rl_tokens_fini(&v);
	return n;
}

static int
roundtrip(rl_tokenizer *t, const char *s, size_t n, int flags)
{
	rl_tokens v = { 0 };
	char *d = NULL;
	size_t dl = 0;
	int ok = rl_tokenizer_encode(&v, t, s, n, flags) == 0 &&
		 rl_tokenizer_decode(&d, &dl, t, v.ids, v.n, 0) == 0 && dl == n && memcmp(d, s, n) == 0;
	free(d);
	rl_tokens_fini(&v);
	return ok;
}

static void
test_bytes(void)
{
	rl_tokenizer *t = NULL;
	int32_t ids[64];
	mkd("bytes");
	write_file(tpath("bytes", "tokenizer.json"), rl_tokenizer_bytes_json(), strlen(rl_tokenizer_bytes_json()));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bytes", "")), 0);
	if (!t)
		return;
	T_EQ_STR(rl_tokenizer_kind(t), "bytes");
	T_EQ_INT(rl_tokenizer_vocab_size(t), 261);
	T_EQ_INT(rl_tokenizer_bos_id(t), 256);
	T_EQ_INT(rl_tokenizer_eos_id(t), 257);
	T_EQ_INT(rl_tokenizer_pad_id(t), 258);
	T_EQ_INT(rl_tokenizer_chat_template(t), RL_CHAT_CHATML);
	T_EQ_INT(enc(t, "hi<|eos|>", RL_TOK_SPECIAL, ids, 64), 3);
	T_EQ_INT(ids[0], 'h');
	T_EQ_INT(ids[2], 257);
	T_EQ_INT(enc(t, "hi<|eos|>", 0, ids, 64), 9);
	T_EQ_INT(ids[2], '<');
	T_OK(rl_tokenizer_is_special(t, 259) && !rl_tokenizer_is_special(t, 'a'), "%s", "check");
	T_OK(roundtrip(t, "\xff\x00\xc3(\xe2\x82 ok <|im_end|>", 21, RL_TOK_SPECIAL), "%s", "check");

	rl_chat_msg m[2] = { { "system", "be brief", NULL , NULL }, { "user", "hi <|im_end|>", NULL , NULL } };
	rl_tokens v = { 0 };
	char *text = NULL;
	size_t len;
	T_EQ_INT(rl_tokenizer_render_chat(&text, &len, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), 0);
	T_EQ_STR(text, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi <|im_end|><|im_end|>\n"
		       "<|im_start|>assistant\n");
	free(text);
	T_EQ_INT(rl_tokenizer_apply_chat(&v, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), 0);
	/* 259 "system\nbe brief" 260 "\n" 259 "user\nhi <|im_end|>" 260 "\n" 259 "assistant\n" */
	T_EQ_INT(v.n, 1 + 15 + 1 + 1 + 1 + 18 + 1 + 1 + 1 + 10);
	int specials = 0;
	for (size_t i = 0; i < v.n; i++)
		specials += v.ids[i] >= 256;
	T_EQ_INT(specials, 5); /* the user's "<|im_end|>" stays text */
	T_EQ_INT(v.ids[0], 259);
	T_EQ_INT(v.ids[v.n - 11], 259);
	v.n = 0;
	T_EQ_INT(rl_tokenizer_apply_chat(&v, t, m + 1, 1, RL_CHAT_AUTO, RL_TOK_SPECIAL), 0);
	T_EQ_INT(v.n, 1 + 8 + 1 + 1 + 1); /* content's <|im_end|> is a token when allowed */
	v.n = 0;
	T_EQ_INT(rl_tokenizer_apply_chat(&v, t, m + 1, 1, RL_CHAT_PLAIN, RL_TOK_GEN_PROMPT), 0);
	T_EQ_INT(v.ids[0], 256);
	T_EQ_INT(v.n, 1 + strlen("user: hi <|im_end|>\nassistant:"));
	T_EQ_INT(rl_tokenizer_render_chat(&text, &len, t, m + 1, 1, RL_CHAT_PLAIN, RL_TOK_GEN_PROMPT), 0);
	T_EQ_STR(text, "<|bos|>user: hi <|im_end|>\nassistant:");
	free(text);
	rl_tokens_fini(&v);

	char *d;
	int32_t bad[2] = { 65, 261 };
	T_EQ_INT(rl_tokenizer_decode(&d, &len, t, bad, 2, 0), RL_EINVAL);
	int32_t sk[3] = { 256, 65, 257 };
	T_EQ_INT(rl_tokenizer_decode(&d, &len, t, sk, 3, RL_TOK_SKIP_SPECIAL), 0);
	T_EQ_STR(d, "A");
	free(d);
	rl_tokenizer_close(t);
}

static void
test_small_bpe(void)
{
	static const char *ml[] = { "h", "l", "he", "l", "hel", "a", "b" };
	static const char *mr[] = { "e", "l", "l", "o", "lo", "b", "c" };
	rl_tokenizer *t = NULL, *t2 = NULL;
	int32_t a[64], b[64];
	mkd("bpe");
	mkd("bpe2");
	write_bpe(tpath("bpe", "tokenizer.json"), ml, mr, 7, 0,
		  "{\"added_tokens\":[{\"id\":300,\"content\":\"<|x|>\",\"special\":true},"
		  "{\"id\":301,\"content\":\"<y>\",\"special\":false},"
		  "{\"id\":302,\"content\":\"<|x|>>\",\"special\":true},"
		  "{\"id\":303,\"content\":\"<s>\",\"special\":true,\"lstrip\":true,\"rstrip\":true}]}",
		  1);
	write_bpe(tpath("bpe2", "tokenizer.json"), ml, mr, 7, 1, NULL, 1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bpe", "tokenizer.json")), 0);
	T_EQ_INT(rl_tokenizer_open(&t2, tpath("bpe2", "")), 0);
	if (!t || !t2)
		return;
	T_EQ_INT(rl_tokenizer_vocab_size(t), 304);
	/* lstrip/rstrip: the white space beside <s> goes */
	T_EQ_INT(enc(t, "a \t<s>\n b", RL_TOK_SPECIAL, a, 64), 3);
	T_EQ_INT(a[1], 303);
	/* hello: "h e"(0) -> he, then "l l"(1) beats "he l"(2) and "l o"(3): he ll o */
	T_EQ_INT(enc(t, "hello", 0, a, 64), 3);
	T_EQ_INT(a[0], rl_tokenizer_lookup(t, "he", 2));
	T_EQ_INT(a[1], rl_tokenizer_lookup(t, "ll", 2));
	T_EQ_INT(a[2], 'o');
	/* helo: he, then "he l"(2) beats "l o"(3): hel o; "hel lo" never gets its chance */
	T_EQ_INT(enc(t, "helo", 0, a, 64), 2);
	T_EQ_INT(enc(t2, "helo", 0, b, 64), 2); /* the ["a","b"] merge encoding: same ids */
	T_OK(a[0] == b[0] && a[1] == b[1], "%s", "check");
	T_EQ_INT(a[0], rl_tokenizer_lookup(t, "hel", 3));
	T_EQ_INT(enc(t, "hlo", 0, a, 64), 2); /* h lo */
	T_EQ_INT(a[1], rl_tokenizer_lookup(t, "lo", 2));
	T_EQ_INT(enc(t, "abc", 0, a, 64), 2); /* "a b" ranks before "b c" */
	T_EQ_INT(a[0], rl_tokenizer_lookup(t, "ab", 2));
	/* added tokens: longest match; special only when allowed; non-special always */
	T_EQ_INT(enc(t, "x<|x|>>y<y>", RL_TOK_SPECIAL, a, 64), 4);
	T_EQ_INT(a[1], 302);
	T_EQ_INT(a[3], 301);
	T_EQ_INT(enc(t, "x<|x|>y", 0, a, 64), 7); /* pieces x <| x |> y, no merges */
	T_OK(!rl_tokenizer_is_special(t, 301) && rl_tokenizer_is_special(t, 300), "%s", "check");
	/* NFC: e + U+0301 encodes as é */
	T_EQ_INT(enc(t, "e\xcc\x81", 0, a, 64), enc(t, "\xc3\xa9", 0, b, 64));
	T_OK(a[0] == b[0] && a[1] == b[1], "%s", "check");
	T_EQ_INT(enc(t2, "caf\xc3\xa9 \xff\xfe", 0, a, 64), 8);
	const char *rt = "he said \xe2\x82 \xc3\xa9\xff\xfe\xfd 'll 're hello<|x|> <y>";
	T_OK(roundtrip(t, rt, strlen(rt), 0), "%s", "check");
	T_OK(roundtrip(t, rt, strlen(rt), RL_TOK_SPECIAL), "%s", "check");
	rl_tokenizer_close(t);
	rl_tokenizer_close(t2);
}

static void
write_encoder(const char *sub)
{
	cJSON *v = cJSON_CreateObject();
	for (int b = 0; b < 256; b++) {
		char c = (char)b, *s = bl(&c, 1);
		cJSON_AddNumberToObject(v, s, b);
		free(s);
	}
	cJSON_AddNumberToObject(v, "\xc4\xa0t", 256); /* "Ġt" */
	cJSON_AddNumberToObject(v, "\xc4\xa0th", 257);
	cJSON_AddNumberToObject(v, "<|endoftext|>", 258);
	char *s = cJSON_Print(v);
	write_file(tpath(sub, "encoder.json"), s, strlen(s));
	free(s);
	cJSON_Delete(v);
}

/* GPT-2's own file pair: encoder.json + vocab.bpe. */
static void
test_gpt2_files(void)
{
	rl_tokenizer *t = NULL;
	int32_t a[64];
	mkd("gpt2");
	write_encoder("gpt2");
	const char *bpe = "#version: 0.2\n\xc4\xa0 t\n\xc4\xa0t h\n";
	write_file(tpath("gpt2", "vocab.bpe"), bpe, strlen(bpe));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("gpt2", "")), 0);
	if (!t)
		return;
	T_EQ_INT(enc(t, "a th", 0, a, 64), 2);
	T_EQ_INT(a[1], 257);
	T_EQ_INT(enc(t, "<|endoftext|>", RL_TOK_SPECIAL, a, 64), 1);
	T_EQ_INT(a[0], 258);
	T_EQ_INT(rl_tokenizer_eos_id(t), 258);
	T_OK(enc(t, "<|endoftext|>", 0, a, 64) > 1, "%s", "check");
	rl_tokenizer_close(t);
	rl_tokenizer *t2 = NULL;
	T_EQ_INT(rl_tokenizer_open(&t2, tpath("gpt2", "encoder.json")), 0);
	rl_tokenizer_close(t2);
}

/* Reference BPE: repeatedly merge the lowest-ranked adjacent pair (leftmost
 * on ties), one occurrence at a time.  O(n^2); checks the heap version. */
static int
naive_bpe(char **sym, int n, char *const *ml, char *const *mr, int nm)
{
	for (;;) {
		int best = -1, at = -1;
		for (int i = 0; i + 1 < n; i++)
			for (int r = 0; r < nm && (best < 0 || r < best); r++)
				if (strcmp(sym[i], ml[r]) == 0 && strcmp(sym[i + 1], mr[r]) == 0) {
					best = r;
					at = i;
				}
		if (best < 0)
			return n;
		char *m = rl_xmalloc(strlen(sym[at]) + strlen(sym[at + 1]) + 1);
		sprintf(m, "%s%s", sym[at], sym[at + 1]);
		free(sym[at]);
		free(sym[at + 1]);
		sym[at] = m;
		memmove(sym + at + 1, sym + at + 2, (size_t)(n - at - 2) * sizeof(*sym));
		n--;
	}
}

static void
test_merge_order(void)
{
	enum { NM = 60 };
	char *ml[NM], *mr[NM], *toks[NM + 3] = { "a", "b", "c" };
	int nt = 3, nm = 0;
	while (nm < NM) {
		char *x = toks[rnd((uint32_t)nt)], *y = toks[rnd((uint32_t)nt)];
		char xy[64];
		if (strlen(x) + strlen(y) > 10)
			continue;
		snprintf(xy, sizeof(xy), "%s%s", x, y);
		int dup = 0;
		for (int i = 0; i < nt; i++)
			dup |= strcmp(toks[i], xy) == 0;
		if (dup)
			continue;
		ml[nm] = x;
		mr[nm] = y;
		toks[nt++] = rl_xstrdup(xy);
		nm++;
	}
	mkd("merge");
	write_bpe(tpath("merge", "tokenizer.json"), (const char *const *)ml, (const char *const *)mr, nm, 1, NULL, 0);
	rl_tokenizer *t = NULL;
	T_EQ_INT(rl_tokenizer_open(&t, tpath("merge", "")), 0);
	if (!t)
		return;
	int bad = 0;
	for (int w = 0; w < 400; w++) {
		int n = w == 0 ? 2500 : 1 + (int)rnd(w < 200 ? 12 : 300);
		char *word = rl_xmalloc((size_t)n + 1);
		char **sym = rl_xmalloc((size_t)n * sizeof(*sym));
		for (int i = 0; i < n; i++) {
			word[i] = "abc"[rnd(w % 2 ? 3 : 2)];
			sym[i] = rl_xmalloc(2);
			sym[i][0] = word[i];
			sym[i][1] = 0;
		}
		word[n] = 0;
		int k = naive_bpe(sym, n, ml, mr, nm);
		rl_tokens v = { 0 };
		T_EQ_INT(rl_tokenizer_encode(&v, t, word, (size_t)n, 0), 0);
		int same = (int)v.n == k;
		for (int i = 0; same && i < k; i++)
			same = v.ids[i] == rl_tokenizer_lookup(t, sym[i], strlen(sym[i]));
		if (!same && bad++ < 3)
			fprintf(stderr, "FAIL merge order: word %d '%.60s' (%d bytes): %zu ids, reference %d\n", w, word,
				n, v.n, k);
		for (int i = 0; i < k; i++)
			free(sym[i]);
		free(sym);
		free(word);
		rl_tokens_fini(&v);
	}
	T_EQ_INT(bad, 0);
	for (int i = 3; i < nt; i++)
		free(toks[i]);
	rl_tokenizer_close(t);
}

/* The hand-written GPT-2 and Qwen2 matchers against PCRE2 running the same
 * patterns.  The alphabet holds U+0085, U+180E and U+FEFF, where PCRE2's own
 * \s and ECMAScript's \s (ours) disagree (the PCRE2 path spells \s as the
 * ECMAScript set), and invalid UTF-8 (which the PCRE2 path matches as U+FFFD,
 * the rule of the hand matchers). */
static void
test_split(void)
{
	static const char *alpha[] = {
		"a", "Z", "s", "t", "re", "ve", "ll", "d", "m", "S", "LL", "'", "'", "1", "9", "\xd9\xa3" /* ٣ */,
		"\xe2\x85\xab" /* Ⅻ */, " ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\xc2\xa0", "\xe3\x80\x80",
		"\xe2\x80\xa8", "\x0b", ".", ",", "!", "(", ")", "-", "_", "\xe2\x80\x94", "\xc3\xa9", "\xd0\x96",
		"\xe4\xbd\xa0", "\xe5\xa5\xbd", "\xea\xb0\x80", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
		"\xcc\x81" /* combining acute: Mn, neither L nor N */, "\xe0\xa4\xbe" /* Mc */, "\xc2\xb2" /* No */,
		"\xf0\xa0\x80\x80" /* CJK ext B */, "$", "<", "|", ">", "\x01", "\xc2\x85", "\xe1\xa0\x8e",
		"\xef\xbb\xbf", "\xff", "\xc3" /* truncated */, "\x80", "\xef\xbf\xbd",
	};
	const char *pats[2] = { rli_tok_gpt2_pattern, rli_tok_qwen2_pattern };
	for (int p = 0; p < 2; p++) {
		rli_splitter hand, re;
		T_EQ_INT(rli_splitter_init(&hand, pats[p], 0), 0);
		T_EQ_INT(rli_splitter_init(&re, pats[p], 1), 0);
		T_EQ_INT(hand.kind, p ? RLI_SPLIT_QWEN2 : RLI_SPLIT_GPT2);
		T_EQ_INT(re.kind, RLI_SPLIT_PCRE2);
		uint32_t *e1 = NULL, *e2 = NULL;
		size_t n1, n2, c1 = 0, c2 = 0;
		int bad = 0;
		char buf[1024];
		for (int k = 0; k < 20000; k++) {
			size_t len = 0;
			int parts = 1 + (int)rnd(k < 10000 ? 8 : 40);
			for (int i = 0; i < parts; i++) {
				const char *x = alpha[rnd(RL_ARRAY_LEN(alpha))];
				int rep = rnd(6) == 0 ? 1 + (int)rnd(20) : 1;
				for (int r = 0; r < rep && len + strlen(x) < sizeof(buf); r++) {
					memcpy(buf + len, x, strlen(x));
					len += strlen(x);
				}
			}
			n1 = n2 = 0;
			T_EQ_INT(rli_split(&hand, (const uint8_t *)buf, len, &e1, &n1, &c1), 0);
			T_EQ_INT(rli_split(&re, (const uint8_t *)buf, len, &e2, &n2, &c2), 0);
			if ((n1 != n2 || memcmp(e1, e2, n1 * sizeof(*e1)) != 0) && bad++ < 3)
				fprintf(stderr, "FAIL split (%s): '%.*s': %zu pieces, PCRE2 %zu\n", p ? "qwen2" : "gpt2",
					(int)len, buf, n1, n2);
		}
		T_EQ_INT(bad, 0);
		/* Known splits. */
		const char *s = p ? "I'M  going\n\n  to 123 (x)" : "I'M  going\n\n  to 123 (x)";
		n1 = 0;
		rli_split(&hand, (const uint8_t *)s, strlen(s), &e1, &n1, &c1);
		/* gpt2: I ' M ␠ ␠going \n\n␠ ␠to ␠123 ␠( x ) ; qwen2: I 'M ␠ ␠going \n\n ␠ ␠to ␠ 1 2 3 ␠( x ) */
		T_EQ_INT(n1, p ? 14 : 11);
		T_EQ_INT(e1[p ? 4 : 5], p ? 12 : 13); /* qwen2 keeps "\n\n", gpt2 takes "\n\n " */
		free(e1);
		free(e2);
		rli_splitter_fini(&hand);
		rli_splitter_fini(&re);
	}
	rli_splitter bad;
	T_EQ_INT(rli_splitter_init(&bad, "(unclosed", 0), RL_EFORMAT);

	/* Any pattern on PCRE2: \s is the ECMAScript set (U+0085 is not space,
	 * U+FEFF is), inside a class too; an invalid byte splits as U+FFFD (a
	 * symbol) would, and the piece ends are offsets in the original text. */
	rli_splitter sp;
	uint32_t *e = NULL;
	size_t n = 0, c = 0;
	T_EQ_INT(rli_splitter_init(&sp, "\\s+|[^\\s]+", 0), 0);
	const char *s1 = "a\xc2\x85" "b\xef\xbb\xbf c";
	T_EQ_INT(rli_split(&sp, (const uint8_t *)s1, strlen(s1), &e, &n, &c), 0);
	T_EQ_INT(n, 3);
	T_OK(n == 3 && e[0] == 4 && e[1] == 8 && e[2] == 9, "ends %u %u", n ? e[0] : 0, n > 1 ? e[1] : 0);
	rli_splitter_fini(&sp);
	T_EQ_INT(rli_splitter_init(&sp, "\\p{S}+|\\p{L}+", 0), 0);
	const char *s2 = "x\xff\xe2\x82\xacy\xc3";
	n = 0;
	T_EQ_INT(rli_split(&sp, (const uint8_t *)s2, strlen(s2), &e, &n, &c), 0);
	T_OK(n == 4 && e[0] == 1 && e[1] == 5 && e[2] == 6 && e[3] == 7, "%zu pieces", n);
	rli_splitter_fini(&sp);
	free(e);
}

static void
test_nfc(void)
{
	uint8_t *o = NULL;
	size_t n;
	T_EQ_INT(rli_nfc((const uint8_t *)"plain ascii", 11, &o, &n), 0);
	T_EQ_INT(rli_nfc((const uint8_t *)"\xe4\xbd\xa0\xe5\xa5\xbd \xc3\xa9", 9, &o, &n), 0);
	T_EQ_INT(rli_nfc((const uint8_t *)"e\xcc\x81\xff", 4, &o, &n), 1);
	T_OK(n == 3 && memcmp(o, "\xc3\xa9\xff", 3) == 0, "%s", "check");
	free(o);
	/* Hangul jamo compose; an invalid byte in the middle stays put */
	T_EQ_INT(rli_nfc((const uint8_t *)"\xe1\x84\x80\xe1\x85\xa1\x80x", 8, &o, &n), 1);
	T_OK(n == 5 && memcmp(o, "\xea\xb0\x80\x80x", 5) == 0, "%s", "check");
	free(o);
}

/* Bad input: each is refused with the right code (the messages go to stderr). */
static void
test_bad(void)
{
	rl_tokenizer *t = NULL;
	static const char *ml[] = { "a" }, *mr[] = { "b" };
	mkd("bad");
	const char *nomodel = "{\"version\":\"1.0\",\"added_tokens\":[]}";
	write_file(tpath("bad", "nomodel.json"), nomodel, strlen(nomodel));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "nomodel.json")), RL_EFORMAT);
	T_OK(t == NULL, "%s", "check");

	/* a merge naming a token that is not in the vocabulary */
	write_bpe(tpath("bad", "unk.json"), ml, mr, 1, 0, "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", 0);
	write_bpe(tpath("bad", "good.json"), ml, mr, 1, 0, NULL, 0);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "good.json")), 0);
	rl_tokenizer_close(t);
	{
		cJSON *r = cJSON_Parse("{}");
		FILE *f = fopen(tpath("bad", "good.json"), "rb");
		char buf[65536];
		size_t k = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[k] = 0;
		cJSON_Delete(r);
		r = cJSON_Parse(buf);
		cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "merges");
		cJSON_ReplaceItemInArray(m, 0, cJSON_CreateString("a zz"));
		char *s = cJSON_Print(r);
		write_file(tpath("bad", "unk.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "unk.json")), RL_EFORMAT);
		cJSON_ReplaceItemInArray(m, 0, cJSON_CreateString("ab"));
		s = cJSON_Print(r);
		write_file(tpath("bad", "onetoken.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "onetoken.json")), RL_EFORMAT);
		cJSON_ReplaceItemInArray(m, 0, cJSON_Parse("[\"a\",\"b\",\"c\"]"));
		s = cJSON_Print(r);
		write_file(tpath("bad", "triple.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "triple.json")), RL_EFORMAT);
		cJSON_ReplaceItemInArray(m, 0, cJSON_Parse("[\"a\",\"b\"]"));
		cJSON_DeleteItemFromObject(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "vocab"), "A");
		s = cJSON_Print(r);
		write_file(tpath("bad", "nobyte.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "nobyte.json")), RL_EFORMAT);
		cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "model"), "type", cJSON_CreateString("WordPiece"));
		s = cJSON_Print(r);
		write_file(tpath("bad", "wp.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "wp.json")), RL_ENOTSUP);
		cJSON_Delete(r);
	}
	write_file(tpath("bad", "trunc.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", 40);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "trunc.json")), RL_EFORMAT);
	/* over the size limit: a sparse file, refused before it is read */
	FILE *f = fopen(tpath("bad", "huge.json"), "wb");
	T_OK(f && ftruncate(fileno(f), (off_t)RL_TOKENIZER_MAX_FILE + 1) == 0, "%s", "check");
	fclose(f);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "huge.json")), RL_ETOOBIG);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "missing.json")), RL_ENOENT);
	mkd("empty");
	T_EQ_INT(rl_tokenizer_open(&t, tpath("empty", "")), RL_ENOENT);
	const char *bytes_def = "{\"model\":{\"type\":\"rlpipe-bytes\"}}";
	write_file(tpath("bad", "bytesdef.json"), bytes_def, strlen(bytes_def));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "bytesdef.json")), 0);
	if (t) {
		T_EQ_INT(rl_tokenizer_vocab_size(t), 261); /* the default specials */
		T_EQ_INT(rl_tokenizer_eos_id(t), 257);
		rl_tokenizer_close(t);
		t = NULL;
	}
	const char *bytes_bad = "{\"model\":{\"type\":\"rlpipe-bytes\"},\"added_tokens\":[{\"id\":3,\"content\":\"<x>\"}]}";
	write_file(tpath("bad", "bytes.json"), bytes_bad, strlen(bytes_bad));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("bad", "bytes.json")), RL_EFORMAT);
	mkd("badgpt2");
	write_encoder("badgpt2");
	write_file(tpath("badgpt2", "vocab.bpe"), "#version: 0.2\n\xc4\xa0 t\nab\n", 22);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("badgpt2", "")), RL_EFORMAT);
	rl_tokenizer_close(NULL);
}

/* The chat template the tokenizer of directory sub chose (-1: no tokenizer). */
static int
tpl_of(const char *sub)
{
	rl_tokenizer *t = NULL;
	int k;
	if (rl_tokenizer_open(&t, tpath(sub, "")) != 0 || !t)
		return -1;
	k = rl_tokenizer_chat_template(t);
	rl_tokenizer_close(t);
	return k;
}

/* The chat template in chat_template.jinja (where recent transformers saves
 * it) or chat_template.json wins over tokenizer_config.json's, as in
 * transformers. */
static void
test_template_files(void)
{
	static const char cfg_plain[] = "{\"chat_template\": \"{% for m in messages %}{{ m.content }}{% endfor %}\"}";
	static const char jinja_chatml[] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
	static const char tj[] = "{\"chat_template\": \"<|im_start|>{{ x }}\"}";
	rl_tokenizer *t = NULL;
	mkd("tpl");
	write_file(tpath("tpl", "tokenizer.json"), rl_tokenizer_bytes_json(), strlen(rl_tokenizer_bytes_json()));
	write_file(tpath("tpl", "tokenizer_config.json"), cfg_plain, strlen(cfg_plain));
	T_EQ_INT(tpl_of("tpl"), RL_CHAT_PLAIN);
	/* chat_template.json's template replaces the config's */
	write_file(tpath("tpl", "chat_template.json"), tj, strlen(tj));
	T_EQ_INT(tpl_of("tpl"), RL_CHAT_CHATML);
	/* chat_template.jinja wins over both: a plain one makes it plain again */
	write_file(tpath("tpl", "chat_template.jinja"), "{{ messages[0].content }}", 25);
	T_EQ_INT(tpl_of("tpl"), RL_CHAT_PLAIN);
	/* the Qwen case: the ChatML template only in chat_template.jinja */
	remove(tpath("tpl", "chat_template.json"));
	write_file(tpath("tpl", "chat_template.jinja"), jinja_chatml, strlen(jinja_chatml));
	T_EQ_INT(tpl_of("tpl"), RL_CHAT_CHATML);
	/* a broken chat_template.json is an error naming it, as the config's is */
	write_file(tpath("tpl", "chat_template.json"), "{", 1);
	remove(tpath("tpl", "chat_template.jinja"));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("tpl", "")), RL_EFORMAT);
	T_OK(t == NULL, "%s", "no tokenizer on error");
}

/* A template that is neither ChatML nor plain is rendered by the Jinja
 * engine, from a list of named templates too (its "default"), with bos_token,
 * add_generation_prompt and reasoning_content; its markers become special
 * tokens.  Expected text: jinja2's rendering of the same template. */
static void
test_template_jinja(void)
{
	static const char cfg[] =
	    "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, {\"name\": \"default\", \"template\": "
	    "\"{{ bos_token }}{% for m in messages %}[{{ m.role|upper }}] {{ m.content|trim }}{% if m.reasoning_content is "
	    "defined %}({{ m.reasoning_content }}){% endif %}<|eos|>{% endfor %}{% if add_generation_prompt %}[ASSISTANT]"
	    "{% endif %}\"}]}";
	const rl_chat_msg m[2] = { { "user", " hi ", NULL , NULL }, { "assistant", "4", "2+2" , NULL } };
	rl_tokenizer *t = NULL;
	char *text = NULL;
	size_t n = 0;
	rl_tokens ids = { 0 };
	mkd("tj");
	write_file(tpath("tj", "tokenizer.json"), rl_tokenizer_bytes_json(), strlen(rl_tokenizer_bytes_json()));
	write_file(tpath("tj", "tokenizer_config.json"), cfg, strlen(cfg));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("tj", "")), 0);
	if (!t)
		return;
	T_EQ_INT(rl_tokenizer_render_chat(&text, &n, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), 0);
	T_EQ_STR(text ? text : "", "<|bos|>[USER] hi<|eos|>[ASSISTANT] 4(2+2)<|eos|>[ASSISTANT]");
	T_EQ_INT(rl_tokenizer_apply_chat(&ids, t, m, 1, RL_CHAT_AUTO, 0), 0);
	T_OK(ids.n == 1 + 9 + 1 && ids.ids[0] == 256 && ids.ids[10] == 257, "%zu ids", ids.n);
	/* enable_thinking=false on a template that never names it: an error */
	free(text);
	text = NULL;
	T_EQ_INT(rl_tokenizer_render_chat(&text, &n, t, m, 2, RL_CHAT_AUTO, RL_TOK_NO_THINKING), RL_EINVAL);
	free(text);
	/* the template is parsed once, at open: renders reuse it, and several at
	 * once on one handle give the same text */
	for (int k = 0; k < 3; k++) {
		text = NULL;
		T_EQ_INT(rl_tokenizer_render_chat(&text, &n, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), 0);
		T_EQ_STR(text ? text : "", "<|bos|>[USER] hi<|eos|>[ASSISTANT] 4(2+2)<|eos|>[ASSISTANT]");
		free(text);
	}
	rl_tokens_fini(&ids);
	rl_tokenizer_close(t);
	/* a template that does not parse: the tokenizer opens (text encodes, an
	 * explicit template renders), every chat with it fails as RL_ENOTSUP */
	static const char broken[] = "{\"chat_template\": \"{% for m in messages %}{{ m.content }\"}";
	write_file(tpath("tj", "tokenizer_config.json"), broken, strlen(broken));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("tj", "")), 0);
	if (!t)
		return;
	T_EQ_INT(rl_tokenizer_encode(&ids, t, "hi", 2, 0), 0);
	T_EQ_INT(ids.n, 2);
	for (int k = 0; k < 2; k++) {
		text = NULL;
		T_EQ_INT(rl_tokenizer_render_chat(&text, &n, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), RL_ENOTSUP);
		T_OK(text == NULL, "%s", "no text");
	}
	T_EQ_INT(rl_tokenizer_render_chat(&text, &n, t, m, 1, RL_CHAT_CHATML, 0), 0);
	free(text);
	rl_tokens_fini(&ids);
	rl_tokenizer_close(t);
}

/* Qwen's rules, found in a template by what it names (a made-up template
 * holding the markers, written to chat_template.jinja): reasoning kept only
 * after the last user query, tool turns grouped, the enable_thinking switch,
 * a generation prompt that opens a think block; the real Qwen3 template is
 * checked against Jinja in rl-rollout-tokenize.bats. */
static char *
render(rl_tokenizer *t, const rl_chat_msg *m, size_t n, int flags)
{
	char *text = NULL;
	size_t len;
	return rl_tokenizer_render_chat(&text, &len, t, m, n, RL_CHAT_AUTO, flags) == 0 ? text : NULL;
}

static void
test_qwen_rules(void)
{
	static const char q3[] = "<|im_start|> reasoning_content last_query_index </think> <tool_response> "
				 "enable_thinking '<think>\\n\\n</think>\\n\\n'";
	static const char q3think[] = "<|im_start|> reasoning_content last_query_index </think> "
				      "'<|im_start|>assistant\\n<think>\\n'";
	const rl_chat_msg m[] = {
		{ "user", "q1", NULL , NULL },
		{ "assistant", "<think>\nold\n</think>\n\na1", NULL , NULL },
		{ "user", "q2", NULL , NULL },
		{ "assistant", "\n\nx</think>\n\na2", NULL , NULL },
		{ "tool", "r1", NULL , NULL },
		{ "tool", "r2", NULL , NULL },
		{ "assistant", "a3", "\nwhy\n" , NULL },
	};
	rl_tokenizer *t = NULL;
	char *s;
	mkd("q3");
	write_file(tpath("q3", "tokenizer.json"), rl_tokenizer_bytes_json(), strlen(rl_tokenizer_bytes_json()));
	write_file(tpath("q3", "chat_template.jinja"), q3, strlen(q3));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("q3", "")), 0);
	if (!t)
		return;
	T_EQ_INT(rl_tokenizer_chat_thinking(t), 1);
	s = render(t, m, 7, RL_TOK_GEN_PROMPT | RL_TOK_NO_THINKING);
	T_EQ_STR(s, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
		    "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\na2<|im_end|>\n"
		    "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
		    "<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\na3<|im_end|>\n"
		    "<|im_start|>assistant\n<think>\n\n</think>\n\n");
	free(s);
	/* a role the template would drop */
	const rl_chat_msg dev[] = { { "developer", "x", NULL , NULL } };
	T_OK(render(t, dev, 1, 0) == NULL, "%s", "developer refused");
	/* explicit chatml: no Qwen rules, no switch */
	char *text = NULL;
	size_t len;
	T_EQ_INT(rl_tokenizer_render_chat(&text, &len, t, m, 2, RL_CHAT_CHATML, 0), 0);
	T_EQ_STR(text, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nold\n</think>\n\na1<|im_end|>\n");
	free(text);
	T_EQ_INT(rl_tokenizer_render_chat(&text, &len, t, m, 1, RL_CHAT_CHATML, RL_TOK_NO_THINKING), RL_EINVAL);
	rl_tokenizer_close(t);
	t = NULL;
	/* a thinking-only template: the generation prompt opens the block; no switch */
	write_file(tpath("q3", "chat_template.jinja"), q3think, strlen(q3think));
	T_EQ_INT(rl_tokenizer_open(&t, tpath("q3", "")), 0);
	if (!t)
		return;
	T_EQ_INT(rl_tokenizer_chat_thinking(t), 0);
	s = render(t, m, 1, RL_TOK_GEN_PROMPT);
	T_EQ_STR(s, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\n");
	free(s);
	T_OK(render(t, m, 1, RL_TOK_GEN_PROMPT | RL_TOK_NO_THINKING) == NULL, "%s", "no switch");
	/* without <tool_response> in it, a tool turn is a ChatML turn of its own */
	s = render(t, m + 4, 1, 0);
	T_EQ_STR(s, "<|im_start|>tool\nr1<|im_end|>\n");
	free(s);
	rl_tokenizer_close(t);
}

/* BPE "ignore_merges" (Llama 3): a pre-token that is a vocabulary token is
 * that token; the merges would split "abc" into "ab" "c" here ("a b" ranks
 * first, and no merge joins "ab" and "c"). */
static void
test_ignore_merges(void)
{
	static const char *ml[] = { "a", "b", "a" };
	static const char *mr[] = { "b", "c", "bc" };
	rl_tokenizer *t = NULL;
	int32_t ids[8];
	char *text = NULL;
	size_t len = 0;
	cJSON *j;
	mkd("im");
	write_bpe(tpath("im", "tokenizer.json"), ml, mr, 3, 0, NULL, 0);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("im", "")), 0);
	if (t) {
		T_EQ_INT(enc(t, "abc", 0, ids, 8), 2);
		T_EQ_INT(ids[0], rl_tokenizer_lookup(t, "ab", 2));
		rl_tokenizer_close(t);
	}
	T_EQ_INT(rl_io_read_file(tpath("im", "tokenizer.json"), 0, &text, &len), 0);
	j = cJSON_Parse(text);
	cJSON_AddTrueToObject(cJSON_GetObjectItemCaseSensitive(j, "model"), "ignore_merges");
	free(text);
	text = cJSON_Print(j);
	write_file(tpath("im", "tokenizer.json"), text, strlen(text));
	cJSON_free(text);
	cJSON_Delete(j);
	t = NULL;
	T_EQ_INT(rl_tokenizer_open(&t, tpath("im", "")), 0);
	if (t) {
		T_EQ_INT(enc(t, "abc", 0, ids, 8), 1);
		T_EQ_INT(ids[0], rl_tokenizer_lookup(t, "abc", 3));
		/* a piece not in the vocabulary still goes through the merges */
		T_EQ_INT(enc(t, "abcc", 0, ids, 8), 3);
		rl_tokenizer_close(t);
	}
}

/* SentencePiece-style BPE (Gemma 3's form of tokenizer.json): the expected
 * ids are worked out by hand from the algorithm Hugging Face documents
 * (characters as symbols, a space normalised to U+2581, characters outside
 * the vocabulary as their <0xNN> tokens, merges by rank). */
static void
write_spm(const char *name, const char *normalizer, const char *pretok, const char *decoder, int drop_byte)
{
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);
	if (!f)
		exit(1);
	fprintf(f, "{\"normalizer\": %s, \"pre_tokenizer\": %s, \"decoder\": %s,\n", normalizer, pretok, decoder);
	fprintf(f, "\"added_tokens\": [{\"id\": 264, \"content\": \"<s>\", \"special\": true},"
		   "{\"id\": 265, \"content\": \"\xe2\x96\x81\xe2\x96\x81\", \"special\": false}],\n");
	fprintf(f, "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": "
		   "{\"<unk>\": 0");
	for (int b = 0; b < 256; b++)
		if (b != drop_byte)
			fprintf(f, ", \"<0x%02X>\": %d", b, b + 1);
	fprintf(f, ", \"\xe2\x96\x81\": 257, \"a\": 258, \"b\": 259, \"ab\": 260, \"\xe2\x96\x81" "a\": 261, "
		   "\"\xe2\x96\x81" "ab\": 262, \"\xc3\xa9\": 263, \"<s>\": 264, \"\xe2\x96\x81\xe2\x96\x81\": 265},\n");
	fprintf(f, "\"merges\": [[\"a\", \"b\"], [\"\xe2\x96\x81\", \"a\"], [\"\xe2\x96\x81" "a\", \"b\"], "
		   "[\"\xe2\x96\x81\", \"ab\"], [\"\xe2\x96\x81\", \"\xe2\x96\x81\"]]}}\n");
	fclose(f);
	write_file(tpath("spm", name), s, n);
	free(s);
}

static void
spm_case(rl_tokenizer *t, const char *text, size_t len, int flags, const int32_t *want, size_t nwant,
	 const char *back)
{
	rl_tokens v = { 0 };
	char *d = NULL;
	size_t dl = 0;
	T_EQ_INT(rl_tokenizer_encode(&v, t, text, len, flags), 0);
	int same = v.n == nwant && memcmp(v.ids, want, nwant * sizeof(int32_t)) == 0;
	T_OK(same, "spm '%.*s': %zu ids (want %zu), first %d", (int)len, text, v.n, nwant, v.n ? v.ids[0] : -1);
	T_EQ_INT(rl_tokenizer_decode(&d, &dl, t, v.ids, v.n, 0), 0);
	T_OK(d && dl == strlen(back) && memcmp(d, back, dl) == 0, "spm decode of '%.*s'", (int)len, text);
	free(d);
	rl_tokens_fini(&v);
}

static void
test_spm(void)
{
	rl_tokenizer *t = NULL;
	const char *norm = "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}";
	const char *pre = "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"MergedWithPrevious\", "
			  "\"invert\": false}";
	const char *dec = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
			  "\"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}";
	mkd("spm");
	write_spm("ok.json", norm, pre, dec, -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "ok.json")), 0);
	if (!t)
		return;
	/* a b ▁ a b -> (a b) ▁ (a b) -> ab (▁ ab) */
	spm_case(t, "ab ab", 5, 0, (const int32_t[]){ 260, 262 }, 2, "ab ab");
	/* U+2581 in the text is the space symbol; decoding gives a space */
	spm_case(t, "\xe2\x96\x81" "a", 4, 0, (const int32_t[]){ 261 }, 1, " a");
	/* \x07 and ñ are not in the vocabulary: their bytes; é is */
	spm_case(t, "ba\x07\xc3\xa9\xc3\xb1", 7, 0, (const int32_t[]){ 259, 258, 8, 263, 0xc3 + 1, 0xb1 + 1 }, 6,
		 "ba\x07\xc3\xa9\xc3\xb1");
	/* an invalid byte is its own byte token, given back exactly */
	spm_case(t, "a\xff" "b", 3, 0, (const int32_t[]){ 258, 256, 259 }, 3, "a\xff" "b");
	/* the added "▁▁" matches those characters as written (not two spaces,
	 * which merge by the last rule), and decodes to two spaces */
	spm_case(t, "x\xe2\x96\x81\xe2\x96\x81y  ", 10, 0, (const int32_t[]){ 0x78 + 1, 265, 0x79 + 1, 265 }, 4,
		 "x  y  ");
	/* a special token only when asked */
	spm_case(t, "<s>", 3, RL_TOK_SPECIAL, (const int32_t[]){ 264 }, 1, "<s>");
	spm_case(t, "<s>", 3, 0, (const int32_t[]){ '<' + 1, 's' + 1, '>' + 1 }, 3, "<s>");
	T_EQ_INT(rl_tokenizer_lookup(t, " ", 1), 257);
	T_EQ_INT(rl_tokenizer_lookup(t, "<0x07>", 6), -1);
	rl_tokenizer_close(t);
	t = NULL;

	/* what the form does not have is refused, naming it (the message: bats) */
	write_spm("lower.json", "{\"type\": \"Lowercase\"}", pre, dec, -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "lower.json")), RL_ENOTSUP);
	write_spm("prepend.json",
		  "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}, "
		  "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}]}",
		  pre, dec, -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "prepend.json")), RL_ENOTSUP);
	write_spm("meta.json", norm, "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\"}", dec, -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "meta.json")), RL_ENOTSUP);
	write_spm("strip.json", norm, "null",
		  "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Strip\", "
		  "\"content\": \" \", \"start\": 1, \"stop\": 0}]}", -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "strip.json")), RL_ENOTSUP);
	write_spm("nobyte.json", norm, pre, dec, 0x41);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "nobyte.json")), RL_EFORMAT);
	/* no pre-tokenizer and no decoder is the same form */
	write_spm("bare.json", norm, "null", "null", -1);
	T_EQ_INT(rl_tokenizer_open(&t, tpath("spm", "bare.json")), 0);
	rl_tokenizer_close(t);
}

/* Split pre-tokenizers in turn (DeepSeek V3's form): each cuts the pieces
 * of the one before; five are more than the loader takes. */
static void
test_split_chain(void)
{
	rl_tokenizer *t = NULL;
	rl_tokens v = { 0 };
	static const char *ml[] = { "1", "x" }, *mr[] = { "2", " " };
	const char *pre = "{\"type\": \"Sequence\", \"pretokenizers\": ["
			  "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\"},"
			  "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": \"Isolated\"},"
			  "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}";
	mkd("chain");
	write_bpe(tpath("chain", "tokenizer.json"), ml, mr, 2, 0, NULL, 0);
	{
		FILE *f = fopen(tpath("chain", "tokenizer.json"), "rb");
		char buf[65536];
		size_t k = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[k] = 0;
		cJSON *r = cJSON_Parse(buf);
		cJSON_DeleteItemFromObject(r, "pre_tokenizer");
		cJSON_AddItemToObject(r, "pre_tokenizer", cJSON_Parse(pre));
		char *s = cJSON_Print(r);
		write_file(tpath("chain", "tokenizer.json"), s, strlen(s));
		free(s);
		/* "1212x 12": digits in threes first ("121" "2" "x " "12"), then
		 * white space cuts "x " (so the merge x+space does not apply); the
		 * merge 1+2 joins "12" inside "121" but not across "121|2" */
		T_EQ_INT(rl_tokenizer_open(&t, tpath("chain", "tokenizer.json")), 0);
		if (t) {
			int32_t one = rl_tokenizer_lookup(t, "1", 1), two = rl_tokenizer_lookup(t, "2", 1),
				ot = rl_tokenizer_lookup(t, "12", 2), sp = rl_tokenizer_lookup(t, " ", 1);
			T_EQ_INT(rl_tokenizer_encode(&v, t, "1212x 12", 8, 0), 0);
			int32_t want[] = { ot, one, two, rl_tokenizer_lookup(t, "x", 1), sp, ot };
			T_OK(rl_tokenizer_lookup(t, "x ", 2) >= 0, "%s", "the merge x+space");
			T_OK(v.n == 6 && memcmp(v.ids, want, sizeof(want)) == 0, "chain: %zu ids", v.n);
			rl_tokens_fini(&v);
			rl_tokenizer_close(t);
			t = NULL;
		}
		cJSON *l = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers");
		for (int k2 = 0; k2 < 3; k2++)
			cJSON_InsertItemInArray(l, 0, cJSON_Duplicate(l->child, 1));
		s = cJSON_Print(r);
		write_file(tpath("chain", "five.json"), s, strlen(s));
		free(s);
		T_EQ_INT(rl_tokenizer_open(&t, tpath("chain", "five.json")), RL_ENOTSUP);
		cJSON_Delete(r);
	}
}

int
main(void)
{
	T_BEGIN("test_tokenizer");
	rl_log_init("test_tokenizer", RL_LOG_QUIET);
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_bytes();
	test_small_bpe();
	test_gpt2_files();
	test_merge_order();
	test_split();
	test_nfc();
	test_bad();
	test_template_files();
	test_template_jinja();
	test_qwen_rules();
	test_ignore_merges();
	test_spm();
	test_split_chain();
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpdir);
	T_END();
}

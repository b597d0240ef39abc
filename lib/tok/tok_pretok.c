/*
 * tok_pretok.c — the text side of the tokenizer: strict UTF-8 decoding,
 * Unicode classes (letter, number, white space) and an NFC quick check from
 * libutf8proc, NFC itself, GPT-2's byte <-> code point table, and the split
 * patterns.  The GPT-2 and Qwen2 patterns are matched by hand (exact and much
 * faster than a regex engine); any other Split pattern goes to PCRE2 (UTF+UCP).
 *
 * Invalid UTF-8: every byte that does not start a valid, complete, shortest-form
 * sequence is one character of its own with no letter/number/space class — the
 * class U+FFFD (a symbol) has — so text with broken bytes splits the way the
 * same text with U+FFFD in their place would, and BPE still sees the raw bytes.
 *
 * \s is the ECMAScript set (the reference encoders run in JavaScript): Zs, Zl,
 * Zp, TAB..CR and U+FEFF.  Hugging Face's Rust regex differs on U+FEFF (not
 * space there) and U+0085 (space there); docs/tokenizer.md notes it.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/core.h"
#include "tok/tok_impl.h"

const char rli_tok_gpt2_pattern[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char rli_tok_qwen2_pattern[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { C_L = 1, C_N = 2, C_S = 4, C_NL = 8, C_NFC = 16 };

static uint8_t bmp_class[0x10000];
static uint8_t *nfc_unsafe; /* bitmap over 0..0x10FFFF */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

int
rli_is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0xa0 || cp == 0x1680 ||
	       (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
	       cp == 0x205f || cp == 0x3000 || cp == 0xfeff;
}

static void
mark_unsafe(uint32_t cp)
{
	if (cp < 0x110000)
		nfc_unsafe[cp >> 3] |= (uint8_t)(1u << (cp & 7));
}

static int
cp_class(uint32_t cp)
{
	int c = 0, cat = utf8proc_category((utf8proc_int32_t)cp);
	if (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
		c |= C_L;
	else if (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO)
		c |= C_N;
	if (rli_is_space(cp))
		c |= C_S;
	if (cp == '\r' || cp == '\n')
		c |= C_NL;
	if (nfc_unsafe[cp >> 3] & (1u << (cp & 7)))
		c |= C_NFC;
	return c;
}

/* NFC can change a text only around a character with a non-zero combining
 * class, one that NFC itself changes (singletons, composition exclusions), or
 * one that can be the second half of a composition (any later character of a
 * canonical decomposition, Hangul jamo).  Mark those: text without them is in
 * NFC already (the quick check of UAX #15, made conservative). */
static void
build_tables(void)
{
	static uint8_t bits[0x110000 / 8];
	nfc_unsafe = bits;
	for (uint32_t cp = 0; cp < 0x110000; cp++) {
		const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
		if (p->combining_class)
			mark_unsafe(cp);
		if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
			utf8proc_int32_t d[32];
			int bc = 0;
			utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32,
								     UTF8PROC_DECOMPOSE, &bc);
			for (utf8proc_ssize_t i = 1; i < k && i < 32; i++)
				mark_unsafe((uint32_t)d[i]);
			uint8_t in[4], *out = NULL;
			utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, in);
			utf8proc_ssize_t m = utf8proc_map(in, n, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			if (m != n || !out || memcmp(in, out, (size_t)n) != 0)
				mark_unsafe(cp);
			free(out);
		}
	}
	for (uint32_t cp = 0x1100; cp < 0x1200; cp++)
		mark_unsafe(cp);
	for (uint32_t cp = 0; cp < 0x10000; cp++)
		bmp_class[cp] = (uint8_t)cp_class(cp);
}

static inline void
tables(void)
{
	pthread_once(&tables_once, build_tables);
}

int
rli_utf8_char(const uint8_t *s, size_t n, uint32_t *cp)
{
	uint8_t b = s[0];
	if (b < 0x80) {
		*cp = b;
		return 1;
	}
	if (b < 0xc2 || b > 0xf4)
		return 0;
	if (b < 0xe0) {
		if (n < 2 || (s[1] & 0xc0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x1f) << 6) | (s[1] & 0x3f);
		return 2;
	}
	if (b < 0xf0) {
		uint8_t lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
		if (n < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
		return 3;
	}
	{
		uint8_t lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
		if (n < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
		      ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
		return 4;
	}
}

/* Class of the character at S[I] and its length in *LEN (1 for an invalid byte). */
static inline int
cls_at(const uint8_t *s, size_t n, size_t i, int *len)
{
	uint32_t cp;
	if (s[i] < 0x80) {
		*len = 1;
		return bmp_class[s[i]];
	}
	int l = rli_utf8_char(s + i, n - i, &cp);
	if (l == 0) {
		*len = 1;
		return 0;
	}
	*len = l;
	return cp < 0x10000 ? bmp_class[cp] : cp_class(cp);
}

#define OTHER(c) (((c) & (C_L | C_N | C_S)) == 0)

/* End of the run of characters from I whose class satisfies the test. */
static size_t
run_mask(const uint8_t *s, size_t n, size_t i, int mask)
{
	int l;
	while (i < n && (cls_at(s, n, i, &l) & mask))
		i += (size_t)l;
	return i;
}

static size_t
run_other(const uint8_t *s, size_t n, size_t i)
{
	int l;
	while (i < n && OTHER(cls_at(s, n, i, &l)))
		i += (size_t)l;
	return i;
}

static inline int
lower(uint8_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at S[I] (S[I] == '\''); returns the length or 0. */
static size_t
contraction(const uint8_t *s, size_t n, size_t i, int fold)
{
	if (i + 1 >= n)
		return 0;
	int a = fold ? lower(s[i + 1]) : s[i + 1];
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return 2;
	if (i + 2 >= n)
		return 0;
	int b = fold ? lower(s[i + 2]) : s[i + 2];
	if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
		return 3;
	return 0;
}

/* White space from I (class C_S at I): \s*[\r\n]+ (when QWEN), \s+(?!\S), \s+. */
static size_t
space_piece(const uint8_t *s, size_t n, size_t i, int qwen)
{
	size_t j = i, last = i, nl_end = 0;
	int l, chars = 0;
	while (j < n) {
		int c = cls_at(s, n, j, &l);
		if (!(c & C_S))
			break;
		if (c & C_NL)
			nl_end = j + 1;
		last = j;
		j += (size_t)l;
		chars++;
	}
	if (qwen && nl_end)
		return nl_end;
	if (j == n || chars == 1)
		return j;
	return last;
}

static size_t
gpt2_next(const uint8_t *s, size_t n, size_t i)
{
	int l, l2, c;
	size_t k;
	if (s[i] == '\'' && (k = contraction(s, n, i, 0)) != 0)
		return i + k;
	c = cls_at(s, n, i, &l);
	if (s[i] == ' ' && i + 1 < n) {
		int c2 = cls_at(s, n, i + 1, &l2);
		if (c2 & C_L)
			return run_mask(s, n, i + 1 + (size_t)l2, C_L);
		if (c2 & C_N)
			return run_mask(s, n, i + 1 + (size_t)l2, C_N);
		if (OTHER(c2))
			return run_other(s, n, i + 1 + (size_t)l2);
	}
	if (c & C_L)
		return run_mask(s, n, i + (size_t)l, C_L);
	if (c & C_N)
		return run_mask(s, n, i + (size_t)l, C_N);
	if (OTHER(c))
		return run_other(s, n, i + (size_t)l);
	return space_piece(s, n, i, 0);
}

static size_t
qwen2_next(const uint8_t *s, size_t n, size_t i)
{
	int l, l2, c;
	size_t k, j;
	if (s[i] == '\'' && (k = contraction(s, n, i, 1)) != 0)
		return i + k;
	c = cls_at(s, n, i, &l);
	if (c & C_L)
		return run_mask(s, n, i + (size_t)l, C_L);
	if (!(c & (C_NL | C_L | C_N)) && i + (size_t)l < n) {
		int c2 = cls_at(s, n, i + (size_t)l, &l2);
		if (c2 & C_L)
			return run_mask(s, n, i + (size_t)l + (size_t)l2, C_L);
	}
	if (c & C_N)
		return i + (size_t)l;
	j = 0;
	if (OTHER(c))
		j = run_other(s, n, i + (size_t)l);
	else if (s[i] == ' ' && i + 1 < n && OTHER(cls_at(s, n, i + 1, &l2)))
		j = run_other(s, n, i + 1 + (size_t)l2);
	if (j) {
		while (j < n && (s[j] == '\r' || s[j] == '\n'))
			j++;
		return j;
	}
	return space_piece(s, n, i, 1);
}

static int
push_end(uint32_t **ends, size_t *n_ends, size_t *cap, size_t e)
{
	if (*n_ends == *cap) {
		size_t nc = *cap ? *cap * 2 : 256;
		uint32_t *p = realloc(*ends, nc * sizeof(**ends));
		if (!p)
			return RL_ENOMEM;
		*ends = p;
		*cap = nc;
	}
	(*ends)[(*n_ends)++] = (uint32_t)e;
	return 0;
}

static int split_pcre2(const rli_splitter *sp, const uint8_t *s, size_t n, uint32_t **ends, size_t *n_ends,
		       size_t *cap_ends);

/* PCRE2 cannot match an invalid UTF-8 byte against any class, while the rule
 * of this module (and of the oracles) is that such a byte splits as U+FFFD
 * would.  Text with invalid bytes is therefore matched as a copy with U+FFFD
 * in their place, and the piece ends are mapped back. */
static int
split_invalid(const rli_splitter *sp, const uint8_t *s, size_t n, uint32_t **ends, size_t *n_ends,
	      size_t *cap_ends)
{
	size_t bad = 0, k = 0, from = *n_ends;
	uint32_t cp;
	int rv;
	for (size_t i = 0; i < n;) {
		int l = rli_utf8_char(s + i, n - i, &cp);
		bad += !l;
		i += l ? (size_t)l : 1;
	}
	if (!bad)
		return split_pcre2(sp, s, n, ends, n_ends, cap_ends);
	uint8_t *c = rl_try_malloc(n + 2 * bad + 1, "split copy");
	uint32_t *map = rl_try_malloc((n + 2 * bad + 1) * sizeof(uint32_t), "split copy");
	if (!c || !map) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n;) {
		int l = rli_utf8_char(s + i, n - i, &cp);
		if (!l) {
			map[k] = (uint32_t)i;
			memcpy(c + k, "\xef\xbf\xbd", 3);
			k += 3;
			i++;
			continue;
		}
		for (int j = 0; j < l; j++) {
			map[k] = (uint32_t)(i + (size_t)j);
			c[k++] = s[i + (size_t)j];
		}
		i += (size_t)l;
	}
	map[k] = (uint32_t)n;
	if ((rv = split_pcre2(sp, c, k, ends, n_ends, cap_ends)) != 0)
		goto out;
	for (size_t q = from; q < *n_ends; q++)
		(*ends)[q] = map[(*ends)[q]];
out:
	free(c);
	free(map);
	return rv;
}

int
rli_split(const rli_splitter *sp, const uint8_t *s, size_t n, uint32_t **ends, size_t *n_ends,
	  size_t *cap_ends)
{
	size_t i = 0, e;
	int rv;
	tables();
	if (sp->kind == RLI_SPLIT_GPT2 || sp->kind == RLI_SPLIT_QWEN2) {
		int q = sp->kind == RLI_SPLIT_QWEN2;
		while (i < n) {
			e = q ? qwen2_next(s, n, i) : gpt2_next(s, n, i);
			if ((rv = push_end(ends, n_ends, cap_ends, e)) != 0)
				return rv;
			i = e;
		}
		return 0;
	}
	if (sp->kind == RLI_SPLIT_NONE)
		return n ? push_end(ends, n_ends, cap_ends, n) : 0;
	return split_invalid(sp, s, n, ends, n_ends, cap_ends);
}

/* PCRE2: gaps between matches are pieces too; an empty match moves the
 * search on by one character without cutting the text there. */
static int
split_pcre2(const rli_splitter *sp, const uint8_t *s, size_t n, uint32_t **ends, size_t *n_ends,
	    size_t *cap_ends)
{
	int rv;
	size_t prev = 0, at = 0;
	while (at <= n) {
		int rc = pcre2_match((pcre2_code *)sp->re, s, n, at, 0, (pcre2_match_data *)sp->md, NULL);
		if (rc < 0)
			break;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer((pcre2_match_data *)sp->md);
		size_t ms = ov[0], me = ov[1];
		if (me > ms) {
			if (ms > prev && (rv = push_end(ends, n_ends, cap_ends, ms)) != 0)
				return rv;
			if ((rv = push_end(ends, n_ends, cap_ends, me)) != 0)
				return rv;
			prev = at = me;
		} else {
			uint32_t cp;
			int l = ms < n ? rli_utf8_char(s + ms, n - ms, &cp) : 1;
			at = ms + (size_t)(l ? l : 1);
		}
	}
	if (prev < n)
		return push_end(ends, n_ends, cap_ends, n);
	return 0;
}

/* The ECMAScript \s set (rli_is_space), as PCRE2 class contents. */
#define JS_SPACE "\\x{9}-\\x{d}\\x{20}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"

/* PATTERN with \s (and \S outside a class) spelt as the ECMAScript set, which
 * the hand matchers and the JavaScript oracles use; PCRE2's own \s differs on
 * U+0085, U+180E and U+FEFF.  \S inside a class is left to PCRE2.  The
 * position of a bad-pattern error then refers to this text. */
static char *
js_space(const char *p)
{
	size_t n = strlen(p), cnt = 0, k = 0;
	int in_class = 0;
	for (size_t i = 0; i < n; i++)
		cnt += p[i] == '\\';
	char *o = rl_try_malloc(n + cnt * (sizeof(JS_SPACE) + 4) + 1, "split pattern");
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\\' && i + 1 < n) {
			char c = p[i + 1];
			const char *put = NULL;
			if (c == 's')
				put = in_class ? JS_SPACE : "[" JS_SPACE "]";
			else if (c == 'S' && !in_class)
				put = "[^" JS_SPACE "]";
			if (put) {
				memcpy(o + k, put, strlen(put));
				k += strlen(put);
			} else {
				o[k++] = p[i];
				o[k++] = c;
			}
			i++;
			continue;
		}
		if (p[i] == '[' && !in_class) {
			in_class = 1;
			o[k++] = p[i];
			/* a ']' (or '^]') right after '[' is a literal */
			if (i + 1 < n && p[i + 1] == '^')
				o[k++] = p[++i];
			if (i + 1 < n && p[i + 1] == ']')
				o[k++] = p[++i];
			continue;
		}
		if (p[i] == ']' && in_class)
			in_class = 0;
		o[k++] = p[i];
	}
	o[k] = 0;
	return o;
}

int
rli_splitter_init(rli_splitter *sp, const char *pattern, int force_pcre2)
{
	memset(sp, 0, sizeof(*sp));
	tables();
	if (!force_pcre2 && strcmp(pattern, rli_tok_gpt2_pattern) == 0) {
		sp->kind = RLI_SPLIT_GPT2;
		return 0;
	}
	if (!force_pcre2 && strcmp(pattern, rli_tok_qwen2_pattern) == 0) {
		sp->kind = RLI_SPLIT_QWEN2;
		return 0;
	}
	int err;
	PCRE2_SIZE off;
	char *js = js_space(pattern);
	if (!js)
		return RL_ENOMEM;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)js, PCRE2_ZERO_TERMINATED,
				       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
	free(js);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(err, msg, sizeof(msg));
		rl_error("bad split pattern at offset %zu: %s", (size_t)off, (char *)msg);
		return RL_EFORMAT;
	}
	(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
	if (!md) {
		pcre2_code_free(re);
		return RL_ENOMEM;
	}
	sp->kind = RLI_SPLIT_PCRE2;
	sp->re = re;
	sp->md = md;
	return 0;
}

void
rli_splitter_fini(rli_splitter *sp)
{
	if (!sp)
		return;
	if (sp->md)
		pcre2_match_data_free((pcre2_match_data *)sp->md);
	if (sp->re)
		pcre2_code_free((pcre2_code *)sp->re);
	memset(sp, 0, sizeof(*sp));
}

int
rli_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len)
{
	size_t i = 0;
	int l, any = 0;
	tables();
	while (i < n) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if (cls_at(s, n, i, &l) & C_NFC) {
			any = 1;
			break;
		}
		i += (size_t)l;
	}
	if (!any)
		return 0;
	/* Normalise each maximal valid run; invalid bytes stay where they are. */
	size_t cap = n * 3 + 16, len = 0;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return -RL_ENOMEM;
	i = 0;
	while (i < n) {
		size_t j = i;
		uint32_t cp;
		while (j < n) {
			int k = rli_utf8_char(s + j, n - j, &cp);
			if (!k)
				break;
			j += (size_t)k;
		}
		if (j > i) {
			utf8proc_uint8_t *d = NULL;
			utf8proc_ssize_t dl = utf8proc_map(s + i, (utf8proc_ssize_t)(j - i), &d,
							   UTF8PROC_STABLE | UTF8PROC_COMPOSE);
			if (dl < 0) {
				free(buf);
				return -RL_ENOMEM;
			}
			if (len + (size_t)dl + 1 > cap) {
				cap = (len + (size_t)dl + 1) * 2;
				uint8_t *p = realloc(buf, cap);
				if (!p) {
					free(d);
					free(buf);
					return -RL_ENOMEM;
				}
				buf = p;
			}
			memcpy(buf + len, d, (size_t)dl);
			len += (size_t)dl;
			free(d);
		}
		if (j < n) {
			if (len + 1 > cap) {
				cap = cap * 2 + 1;
				uint8_t *p = realloc(buf, cap);
				if (!p) {
					free(buf);
					return -RL_ENOMEM;
				}
				buf = p;
			}
			buf[len++] = s[j++];
		}
		i = j;
	}
	*out = buf;
	*out_len = len;
	return 1;
}

/* GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68
 * bytes take the code points from U+0100 on, in byte order. */
static int
printable(uint32_t b)
{
	return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t
rli_byte_to_cp(uint8_t b)
{
	uint32_t k = 0;
	if (printable(b))
		return b;
	for (uint32_t i = 0; i < b; i++)
		k += !printable(i);
	return 256 + k;
}

static int16_t cp_byte[256 + 68];
static pthread_once_t cp_byte_once = PTHREAD_ONCE_INIT;

static void
build_cp_byte(void)
{
	for (int b = 0; b < 256; b++)
		cp_byte[rli_byte_to_cp((uint8_t)b)] = (int16_t)b;
}

int
rli_cp_to_byte(uint32_t cp)
{
	if (cp >= 256 + 68)
		return -1;
	if (cp < 256 && !printable(cp))
		return -1;
	pthread_once(&cp_byte_once, build_cp_byte);
	return cp_byte[cp];
}

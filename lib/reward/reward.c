/*
 * reward.c — the built-in verifiers (gsm8k, math, dapo, countdown, exact, regex,
 * format, length, arith) and the task list that names and weights them.
 *
 * Everything here is a pure function of its arguments: scanning by hand
 * (no regex for the numeric tasks, so gsm8k scores well over 50k records/s),
 * countdown evaluated by a recursive-descent parser over checked 64-bit
 * rationals.  PCRE2 only for the user's regex:/format: patterns.
 *
 * Leaves out: stream I/O, the coprocess protocol (reward_exec.c).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "reward/reward.h"

#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "queue/qclient.h"
#include "queue/wstat.h"

#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SET_WHY(w, s) do { if (w) *(w) = (s); } while (0)

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void
trim(const char **s, size_t *n)
{
	while (*n > 0 && is_space((unsigned char)**s)) {
		(*s)++;
		(*n)--;
	}
	while (*n > 0 && is_space((unsigned char)(*s)[*n - 1]))
		(*n)--;
}

/* A number as the verifiers compare it: its value, and for a decimal written
 * out (integer or fraction, no exponent) its canonical text: '-' when
 * negative, the integer digits without leading zeros ("0" when none), then
 * '.' and the fraction's digits without trailing zeros when any are left
 * ("018.50" -> "18.5", "-0.0" -> "0").  Two decimals are equal when their
 * texts are: exactly, at any size ("1000001" is not "1000000", and a 100-digit
 * answer is compared digit by digit).  A number known only as a value (a
 * fraction a/b) compares within a relative 1e-9: the rounding of the
 * division, nothing more. */
#define NUM_CAP 128
typedef struct {
	double d;
	int dec;	/* 1: text holds the canonical decimal; 0: value only; -1: too long to compare */
	char text[NUM_CAP];
} num;

static void
num_value(num *v, double d)
{
	v->d = d;
	v->dec = 0;
	v->text[0] = 0;
}

/* Canonical text of the decimal in raw (optional '-', digits, optional '.'
 * and digits; no commas). */
static void
num_decimal(num *v, const char *raw, size_t n)
{
	size_t i = 0, ib, ie, fe, k = 0;
	int neg = 0;

	if (i < n && raw[i] == '-') {
		neg = 1;
		i++;
	}
	while (i < n && raw[i] == '0')
		i++;
	ib = i;
	while (i < n && is_digit((unsigned char)raw[i]))
		i++;
	ie = i;
	fe = ie;
	if (i < n && raw[i] == '.') {
		i++;
		fe = n;
		while (fe > i && raw[fe - 1] == '0')
			fe--;
		if (fe == i)
			fe = ie; /* no fraction left */
	}
	if ((ie - ib) + (fe - ie) + 3 >= sizeof v->text) {
		v->dec = -1;
		v->text[0] = 0;
		return;
	}
	if (neg && (ie > ib || fe > ie))
		v->text[k++] = '-';
	if (ie == ib)
		v->text[k++] = '0';
	memcpy(v->text + k, raw + ib, ie - ib);
	k += ie - ib;
	if (fe > ie) {
		memcpy(v->text + k, raw + ie, fe - ie); /* '.' and the digits */
		k += fe - ie;
	}
	v->text[k] = 0;
	v->dec = 1;
}

static int
num_eq(const num *a, const num *b)
{
	if (a->dec < 0 || b->dec < 0)
		return 0;
	if (a->dec && b->dec)
		return strcmp(a->text, b->text) == 0;
	return fabs(a->d - b->d) <= 1e-9 * fmax(1.0, fabs(b->d));
}

/* ---- gsm8k ---------------------------------------------------------------------- */

/* Scans one number starting at s[i] (a digit, or '-' before a digit): digits
 * with thousands commas ("1,234" — a comma is part of the number only when
 * exactly three digits follow), an optional fraction ('.' then digits).
 * Stores it (value and canonical text) and returns the index after it. */
static size_t
scan_number(num *val, const char *s, size_t n, size_t i)
{
	char buf[NUM_CAP + 8];
	size_t k = 0;
	int over = 0;

#define NUM_PUT(c) do { if (k < sizeof buf - 1) buf[k++] = (c); else over = 1; } while (0)
	if (s[i] == '-')
		NUM_PUT(s[i++]);
	while (i < n) {
		if (is_digit((unsigned char)s[i])) {
			NUM_PUT(s[i]);
			i++;
		} else if (s[i] == ',' && i + 3 < n && is_digit((unsigned char)s[i + 1]) &&
			   is_digit((unsigned char)s[i + 2]) && is_digit((unsigned char)s[i + 3]) &&
			   (i + 4 >= n || !is_digit((unsigned char)s[i + 4]))) {
			i++; /* thousands separator */
		} else {
			break;
		}
	}
	if (i + 1 < n && s[i] == '.' && is_digit((unsigned char)s[i + 1])) {
		NUM_PUT(s[i]);
		i++;
		while (i < n && is_digit((unsigned char)s[i])) {
			NUM_PUT(s[i]);
			i++;
		}
	}
#undef NUM_PUT
	buf[k] = 0;
	val->d = strtod(buf, NULL);
	if (over) {
		val->dec = -1;
		val->text[0] = 0;
	} else {
		num_decimal(val, buf, k);
	}
	return i;
}

/* A number starts at s[i]: a digit, or a '-' right before a digit that does
 * not follow a digit ("10-4" is 10 and 4, not 10 and -4). */
static int
number_starts(const char *s, size_t n, size_t i)
{
	if (is_digit((unsigned char)s[i]))
		return 1;
	return s[i] == '-' && i + 1 < n && is_digit((unsigned char)s[i + 1]) &&
	       (i == 0 || !is_digit((unsigned char)s[i - 1]));
}

/* The last number in s[0..n); 0 on success, -1 when there is none. */
static int
last_number(num *val, const char *s, size_t n)
{
	int found = 0;
	size_t i = 0;

	while (i < n) {
		if (number_starts(s, n, i)) {
			i = scan_number(val, s, n, i);
			found = 1;
		} else {
			i++;
		}
	}
	return found ? 0 : -1;
}

/* Last occurrence of "####" in s[0..n), or NULL. */
static const char *
last_hashes(const char *s, size_t n)
{
	if (n < 4)
		return NULL;
	for (size_t i = n - 4 + 1; i-- > 0;)
		if (s[i] == '#' && s[i + 1] == '#' && s[i + 2] == '#' && s[i + 3] == '#')
			return s + i;
	return NULL;
}

/* The number right after the last "####" (spaces and '$' allowed between). */
static int
after_hashes(num *val, const char *s, size_t n)
{
	const char *h = last_hashes(s, n);
	size_t i;

	if (!h)
		return -1;
	i = (size_t)(h - s) + 4;
	while (i < n && (is_space((unsigned char)s[i]) || s[i] == '$'))
		i++;
	if (i >= n || !(is_digit((unsigned char)s[i]) || (s[i] == '-' && i + 1 < n && is_digit((unsigned char)s[i + 1]))))
		return -2;
	scan_number(val, s, n, i);
	return 0;
}

static int
gsm8k_truth(num *val, const char *truth)
{
	size_t n = strlen(truth), i = 0;
	const char *h = last_hashes(truth, n);

	if (h) {
		i = (size_t)(h - truth) + 4;
	}
	while (i < n && (is_space((unsigned char)truth[i]) || truth[i] == '$'))
		i++;
	if (i >= n || !number_starts(truth, n, i))
		return -1;
	scan_number(val, truth, n, i);
	return 0;
}

static int
gsm8k_score(double *score, const char **why, const char *resp, size_t n, const char *truth, int mode)
{
	num want, got;
	int rv;

	*score = 0;
	if (gsm8k_truth(&want, truth) != 0) {
		SET_WHY(why, "ground truth is not a number");
		return RL_EFORMAT;
	}
	if (mode == RL_GSM8K_FLEXIBLE) {
		if (last_number(&got, resp, n) != 0) {
			SET_WHY(why, "no number in response");
			return 0;
		}
	} else if ((rv = after_hashes(&got, resp, n)) != 0) {
		SET_WHY(why, rv == -1 ? "no #### in response" : "no number after ####");
		return 0;
	}
	if (num_eq(&got, &want)) {
		*score = 1;
		SET_WHY(why, NULL);
	} else {
		SET_WHY(why, got.dec < 0 || want.dec < 0 ? "number too long to compare" : "wrong answer");
	}
	return 0;
}

double
rl_reward_gsm8k(const char *resp, size_t n, const char *truth, int mode, const char **why)
{
	double s;

	gsm8k_score(&s, why, resp, n, truth, mode);
	return s;
}

/* ---- math ----------------------------------------------------------------------- */

/* Index just past the '}' matching the '{' at s[i], or 0 when it does not
 * close.  \{ and \} are literal braces and do not count. */
static size_t
match_brace(const char *s, size_t n, size_t i)
{
	int depth = 0;

	for (; i < n; i++) {
		if (s[i] == '\\' && i + 1 < n) {
			i++;
			continue;
		}
		if (s[i] == '{') {
			depth++;
		} else if (s[i] == '}') {
			if (--depth == 0)
				return i + 1;
		}
	}
	return 0;
}

static int
starts(const char *s, size_t n, size_t i, const char *lit)
{
	size_t l = strlen(lit);
	return i + l <= n && memcmp(s + i, lit, l) == 0;
}

long
rl_reward_math_last_boxed(char *out, size_t cap, const char *s, size_t n)
{
	size_t at = (size_t)-1, i, j, end;

	for (i = n; i-- > 0;) {
		if (s[i] == '\\' && (starts(s, n, i, "\\boxed") || starts(s, n, i, "\\fbox"))) {
			at = i;
			break;
		}
	}
	if (at == (size_t)-1)
		return -1;
	i = at + (s[at + 1] == 'b' ? 6 : 5);
	while (i < n && is_space((unsigned char)s[i]))
		i++;
	if (i < n && s[i] == '{') {
		end = match_brace(s, n, i);
		if (end == 0)
			return -1;
		i++;
		end--;
	} else {
		/* "\boxed 5": up to the next space or '$' */
		for (end = i; end < n && !is_space((unsigned char)s[end]) && s[end] != '$'; end++)
			;
		if (end == i)
			return -1;
	}
	j = end - i;
	if (j + 1 > cap)
		return -1;
	memcpy(out, s + i, j);
	out[j] = 0;
	return (long)j;
}

/* The arguments of \sqrt and \frac in braces: "\sqrt2" is "\sqrt{2}",
 * "\frac12" and "\frac1{2}" are "\frac{1}{2}" (an argument without braces is
 * one character), so that both spellings compare equal as strings.  Copies
 * s[i..e) to b->t, fixing the arguments inside groups too (nested at most 64
 * deep; deeper groups are copied as they are).  -1 when it does not fit. */
typedef struct { char *t; size_t j, cap; } brbuf;

static int
brace_args(brbuf *b, const char *s, size_t i, size_t e, int depth)
{
#define PUT(c) do { if (b->j + 1 >= b->cap) return -1; b->t[b->j++] = (c); } while (0)
	while (i < e) {
		int args = starts(s, e, i, "\\sqrt") ? 1 : starts(s, e, i, "\\frac") ? 2 : 0;
		if (!args) {
			/* another command is copied whole (its name could end in "sqrt") */
			if (s[i] == '\\' && i + 1 < e) {
				PUT(s[i++]);
				do
					PUT(s[i++]);
				while (i < e && isalpha((unsigned char)s[i]) && isalpha((unsigned char)s[i - 1]));
				continue;
			}
			PUT(s[i++]);
			continue;
		}
		for (int q = 0; q < 5; q++)
			PUT(s[i++]);
		for (int a = 0; a < args && i < e; a++) {
			if (s[i] == '{') {
				size_t end = match_brace(s, e, i);
				if (!end || depth >= 64)
					break; /* unbalanced or too deep: the rest as it is */
				PUT('{');
				if (brace_args(b, s, i + 1, end - 1, depth + 1))
					return -1;
				PUT('}');
				i = end;
			} else if (s[i] == '[' || s[i] == '\\' || s[i] == '}') {
				break; /* \sqrt[3]{..}, \frac\pi2: as written */
			} else {
				PUT('{');
				PUT(s[i++]);
				PUT('}');
			}
		}
	}
#undef PUT
	return 0;
}

long
rl_reward_math_normalize(char *out, size_t cap, const char *s, size_t n)
{
	/* Braces opened by an unwrapped command (\text{) are dropped with their
	 * closing brace; a small stack remembers which '{' was which. */
	unsigned char drop[256];
	int depth = 0;
	size_t i = 0, k = 0;
	static const char *const unwrap[] = { "\\text{", "\\textbf{", "\\textrm{", "\\mathrm{", "\\mathbf{", "\\mbox{" };
	static const char *const skip[] = { "\\left", "\\right", "\\displaystyle", "\\circ",
					    "\\%", "\\$", "\\!", "\\,", "\\;", "\\:", "\\ " };

#define EMIT(c) do { if (k + 1 >= cap) return -1; out[k++] = (c); } while (0)
	while (i < n) {
		unsigned char c = (unsigned char)s[i];
		size_t m;
		int hit = 0;

		if (is_space(c) || c == '$' || c == '%') {
			i++;
			continue;
		}
		if (c == '^' && (starts(s, n, i, "^{\\circ}") || starts(s, n, i, "^\\circ"))) {
			i += s[i + 1] == '{' ? 8 : 6;
			continue;
		}
		if (c == '\\') {
			/* units on the right, "5\text{ cm}": the answer ends there */
			if (k > 0 && (starts(s, n, i, "\\text{") || starts(s, n, i, "\\mbox{"))) {
				size_t b = i + (s[i + 1] == 't' ? 6 : 5);
				if (b < n && is_space((unsigned char)s[b]))
					break;
			}
			for (m = 0; m < RL_ARRAY_LEN(unwrap); m++) {
				if (starts(s, n, i, unwrap[m])) {
					if (depth < (int)sizeof drop)
						drop[depth] = 1;
					depth++;
					i += strlen(unwrap[m]);
					hit = 1;
					break;
				}
			}
			if (hit)
				continue;
			if (starts(s, n, i, "\\dfrac") || starts(s, n, i, "\\tfrac")) {
				for (const char *p = "\\frac"; *p; p++)
					EMIT(*p);
				i += 6;
				continue;
			}
			for (m = 0; m < RL_ARRAY_LEN(skip); m++) {
				size_t l = strlen(skip[m]);
				/* \left/\right only as whole commands, not \leftarrow */
				if (starts(s, n, i, skip[m]) &&
				    !(isalpha((unsigned char)skip[m][l - 1]) && i + l < n && isalpha((unsigned char)s[i + l]))) {
					i += l;
					hit = 1;
					break;
				}
			}
			if (hit)
				continue;
			/* any other escaped character is kept with its backslash */
			EMIT('\\');
			i++;
			if (i < n)
				EMIT(s[i++]);
			continue;
		}
		if (c == '{') {
			if (depth < (int)sizeof drop)
				drop[depth] = 0;
			depth++;
			EMIT('{');
			i++;
			continue;
		}
		if (c == '}') {
			if (depth > 0) {
				depth--;
				if (depth < (int)sizeof drop && drop[depth]) {
					i++;
					continue;
				}
			}
			EMIT('}');
			i++;
			continue;
		}
		EMIT((char)c);
		i++;
	}
#undef EMIT
	while (k > 0 && out[k - 1] == '.')
		k--;
	if (k >= cap)
		return -1;
	out[k] = 0;
	/* "x=3" (a name of at most two characters, one '='): the value */
	char *eq = strchr(out, '=');
	if (eq && eq - out <= 2 && !strchr(eq + 1, '=')) {
		k -= (size_t)(eq + 1 - out);
		memmove(out, eq + 1, k + 1);
	}
	brbuf b = { malloc(cap), 0, cap };
	if (!b.t)
		return -1;
	if (brace_args(&b, out, 0, k, 0)) {
		free(b.t);
		return -1;
	}
	memcpy(out, b.t, b.j);
	out[b.j] = 0;
	free(b.t);
	return (long)b.j;
}

/* A plain decimal number (thousands commas allowed) filling s[0..n). */
static int
plain_number(num *out, const char *s, size_t n)
{
	size_t i = 0;

	if (n == 0)
		return -1;
	if (s[0] == '-' || s[0] == '+')
		i = 1;
	if (i >= n || !(is_digit((unsigned char)s[i]) || (s[i] == '.' && i + 1 < n && is_digit((unsigned char)s[i + 1]))))
		return -1;
	if (s[i] == '.') {
		char buf[NUM_CAP + 8];
		size_t k = 0;
		/* ".5" */
		if (n + 3 >= sizeof buf)
			return -1;
		if (s[0] == '-')
			buf[k++] = '-';
		buf[k++] = '0';
		for (size_t j = i; j < n; j++) {
			if (j > i && !is_digit((unsigned char)s[j]))
				return -1;
			buf[k++] = s[j];
		}
		buf[k] = 0;
		out->d = strtod(buf, NULL);
		num_decimal(out, buf, k);
		return 0;
	}
	/* scan_number takes the '-' itself */
	size_t end = scan_number(out, s, n, s[0] == '-' ? 0 : i);
	return end == n ? 0 : -1;
}

/* A number in a normalised math answer: a decimal, \frac{a}{b}, \fracab or a/b. */
static int
math_number(num *out, const char *s)
{
	size_t n = strlen(s), i = 0;
	num a, b;
	int neg = 0;

	if (n > 0 && s[0] == '-' && starts(s, n, 1, "\\frac")) {
		neg = 1;
		i = 1;
	}
	if (starts(s, n, i, "\\frac")) {
		i += 5;
		if (i < n && s[i] == '{') {
			size_t e1 = match_brace(s, n, i), e2;
			if (!e1 || e1 >= n || s[e1] != '{')
				return -1;
			e2 = match_brace(s, n, e1);
			if (e2 != n)
				return -1;
			if (plain_number(&a, s + i + 1, e1 - i - 2) || plain_number(&b, s + e1 + 1, e2 - e1 - 2))
				return -1;
		} else if (i + 2 == n && is_digit((unsigned char)s[i]) && is_digit((unsigned char)s[i + 1])) {
			num_value(&a, s[i] - '0');
			num_value(&b, s[i + 1] - '0');
		} else {
			return -1;
		}
		if (b.d == 0)
			return -1;
		num_value(out, (neg ? -a.d : a.d) / b.d);
		return 0;
	}
	const char *slash = memchr(s, '/', n);
	if (slash) {
		if (plain_number(&a, s, (size_t)(slash - s)) || plain_number(&b, slash + 1, n - (size_t)(slash - s) - 1) ||
		    b.d == 0)
			return -1;
		num_value(out, a.d / b.d);
		return 0;
	}
	return plain_number(out, s, n);
}

int
rl_reward_math_number(double *out, const char *s)
{
	num v;

	if (math_number(&v, s) != 0)
		return -1;
	*out = v.d;
	return 0;
}

#define MATH_CAP 4096

static int
math_score(double *score, const char **why, const char *resp, size_t n, const char *truth)
{
	char box[MATH_CAP], got[MATH_CAP], want[MATH_CAP];
	long bl;
	size_t tn = strlen(truth);
	num a, b;

	*score = 0;
	/* the truth may be a full solution with its own \boxed{} */
	bl = rl_reward_math_last_boxed(box, sizeof box, truth, tn);
	if (bl >= 0 ? rl_reward_math_normalize(want, sizeof want, box, (size_t)bl) < 0
		    : rl_reward_math_normalize(want, sizeof want, truth, tn) < 0) {
		SET_WHY(why, "ground truth too long");
		return RL_EFORMAT;
	}
	bl = rl_reward_math_last_boxed(box, sizeof box, resp, n);
	if (bl < 0) {
		SET_WHY(why, "no \\boxed{} in response");
		return 0;
	}
	if (rl_reward_math_normalize(got, sizeof got, box, (size_t)bl) < 0) {
		SET_WHY(why, "boxed answer too long");
		return 0;
	}
	if (strcmp(got, want) == 0 ||
	    (math_number(&a, got) == 0 && math_number(&b, want) == 0 && num_eq(&a, &b))) {
		*score = 1;
		SET_WHY(why, NULL);
	} else {
		SET_WHY(why, "wrong answer");
	}
	return 0;
}

double
rl_reward_math(const char *resp, size_t n, const char *truth, const char **why)
{
	double s;

	math_score(&s, why, resp, n, truth);
	return s;
}

/* ---- dapo (verl's math_dapo: "Answer: ..." and the Minerva normaliser) ------------ */

/* The rewrites below work on an rl_buf (lib/base/io.h) kept NUL-terminated. */
typedef rl_buf dstr;
#define DS(d) ((char *)(d)->p)

static int
dstr_put(dstr *d, const char *p, size_t n)
{
	if (rl_buf_reserve(d, n + 1) != RL_OK)
		return -1;
	memcpy(d->p + d->len, p, n);
	d->len += n;
	d->p[d->len] = 0;
	return 0;
}

/* d becomes o (o emptied); an empty o is an empty string, not NULL. */
static int
dstr_take(dstr *d, dstr *o)
{
	if (!o->p && dstr_put(o, "", 0))
		return -1;
	rl_buf_fini(d);
	*d = *o;
	rl_buf_init(o);
	return 0;
}

/* Every `from` replaced by the shorter (or equal) `to`, left to right, as
 * Python's str.replace does. */
static void
dstr_replace(dstr *d, const char *from, const char *to)
{
	size_t fl = strlen(from), tl = strlen(to), i = 0, k = 0;

	while (i < d->len) {
		if (i + fl <= d->len && memcmp(DS(d) + i, from, fl) == 0) {
			memcpy(DS(d) + k, to, tl);
			k += tl;
			i += fl;
		} else {
			DS(d)[k++] = DS(d)[i++];
		}
	}
	d->len = k;
	DS(d)[k] = 0;
}

/* Bytes of the UTF-8 sequence starting at s[i] (1 for a stray byte). */
static size_t
u8len(const char *s, size_t n, size_t i)
{
	unsigned char c = (unsigned char)s[i];
	size_t l = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;

	for (size_t j = 1; j < l; j++)
		if (i + j >= n || ((unsigned char)s[i + j] & 0xc0) != 0x80)
			return 1;
	return l;
}

/* Python's \s on the characters that matter here (ASCII, and \x1c..\x1f). */
static int
py_space(int c)
{
	return is_space(c) || (c >= 0x1c && c <= 0x1f);
}

/* `pre` + (lazy: up to the first `close`; greedy: the last) on the same line,
 * replaced by what lies between, for every match (re.sub of
 * (\\text\{)(.*?)(\}) and (\\boxed\{)(.*)(\}) ). */
static int
unwrap_cmd(dstr *d, const char *pre, int greedy)
{
	dstr o = { 0 };
	size_t pl = strlen(pre), i = 0;

	while (i < d->len) {
		if (i + pl <= d->len && memcmp(DS(d) + i, pre, pl) == 0) {
			size_t j = i + pl, close = (size_t)-1;
			for (; j < d->len && DS(d)[j] != '\n'; j++) {
				if (DS(d)[j] == '}') {
					close = j;
					if (!greedy)
						break;
				}
			}
			if (close != (size_t)-1) {
				if (dstr_put(&o, DS(d) + i + pl, close - i - pl))
					goto oom;
				i = close + 1;
				continue;
			}
		}
		if (dstr_put(&o, DS(d) + i, 1))
			goto oom;
		i++;
	}
	if (dstr_take(d, &o))
		goto oom;
	return 0;
oom:
	rl_buf_fini(&o);
	return -1;
}

/* verl's math_dapo normalize_final_answer (the Minerva rule), rewrite by
 * rewrite and in its order, on the text in d. */
static int
dapo_normalize(dstr *d)
{
	static const char *const subst[][2] = {
		{ "an ", "" }, { "a ", "" }, { ".$", "$" }, { "\\$", "" }, { "\\ ", "" }, { " ", "" },
		{ "mbox", "text" }, { ",\\text{and}", "," }, { "\\text{and}", "," }, { "\\text{m}", "\\text{}" },
	};
	static const char *const removed[] = {
		"square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
		"sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
		"meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
		"\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
		"\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", "\"", "\\dots",
	};
	char *eq = NULL;
	dstr o = { 0 };
	size_t i;

	/* the part after the last '=' */
	for (i = 0; i < d->len; i++)
		if (DS(d)[i] == '=')
			eq = DS(d) + i;
	if (eq) {
		d->len -= (size_t)(eq + 1 - DS(d));
		memmove(DS(d), eq + 1, d->len + 1);
	}
	for (i = 0; i < RL_ARRAY_LEN(subst); i++)
		dstr_replace(d, subst[i][0], subst[i][1]);
	for (i = 0; i < RL_ARRAY_LEN(removed); i++)
		dstr_replace(d, removed[i], "");
	/* a line with two '$': what the first two enclose, in '$' */
	for (i = 0; i < d->len;) {
		size_t e = i, d1 = (size_t)-1, d2 = (size_t)-1;
		while (e < d->len && DS(d)[e] != '\n') {
			if (DS(d)[e] == '$') {
				if (d1 == (size_t)-1)
					d1 = e;
				else if (d2 == (size_t)-1)
					d2 = e;
			}
			e++;
		}
		if (d2 != (size_t)-1) {
			if (dstr_put(&o, "$", 1) || dstr_put(&o, DS(d) + d1 + 1, d2 - d1 - 1) || dstr_put(&o, "$", 1))
				goto oom;
		} else if (dstr_put(&o, DS(d) + i, e - i)) {
			goto oom;
		}
		if (e < d->len && dstr_put(&o, "\n", 1))
			goto oom;
		i = e + 1;
	}
	if (dstr_take(d, &o))
		goto oom;
	if (unwrap_cmd(d, "\\text{", 0) || unwrap_cmd(d, "\\textbf{", 0) || unwrap_cmd(d, "\\overline{", 0) ||
	    unwrap_cmd(d, "\\boxed{", 1))
		return -1;
	/* "frac" X Y with X not '{' -> "frac{X}{Y}"; "sqrt" X with X not '{' -> "sqrt{X}" */
	for (int pass = 0; pass < 2; pass++) {
		const char *w = pass ? "sqrt" : "frac";
		for (i = 0; i < d->len;) {
			if (i + 4 < d->len && memcmp(DS(d) + i, w, 4) == 0 && DS(d)[i + 4] != '{') {
				size_t x = i + 4, xl = u8len(DS(d), d->len, x), y = x + xl, yl;
				if (pass == 0 && (y >= d->len || DS(d)[y] == '\n')) {
					if (dstr_put(&o, DS(d) + i, 1))
						goto oom;
					i++;
					continue;
				}
				yl = pass ? 0 : u8len(DS(d), d->len, y);
				if (dstr_put(&o, w, 4) || dstr_put(&o, "{", 1) || dstr_put(&o, DS(d) + x, xl) ||
				    dstr_put(&o, "}", 1) ||
				    (pass == 0 && (dstr_put(&o, "{", 1) || dstr_put(&o, DS(d) + y, yl) || dstr_put(&o, "}", 1))))
					goto oom;
				i = y + yl;
				continue;
			}
			if (dstr_put(&o, DS(d) + i, 1))
				goto oom;
			i++;
		}
		if (dstr_take(d, &o))
			goto oom;
	}
	dstr_replace(d, "$", "");
	/* "100,000" -> "100000" when nothing but digits and commas */
	for (i = 0; i < d->len && (is_digit((unsigned char)DS(d)[i]) || DS(d)[i] == ','); i++)
		;
	if (i == d->len) {
		size_t digits = 0;
		for (i = 0; i < d->len; i++)
			digits += DS(d)[i] != ',';
		if (digits > 0)
			dstr_replace(d, ",", "");
	}
	/* strip */
	for (i = 0; i < d->len && py_space((unsigned char)DS(d)[i]); i++)
		;
	d->len -= i;
	memmove(DS(d), DS(d) + i, d->len + 1);
	while (d->len > 0 && py_space((unsigned char)DS(d)[d->len - 1]))
		DS(d)[--d->len] = 0;
	return 0;
oom:
	rl_buf_fini(&o);
	return -1;
}

long
rl_reward_dapo_normalize(char **out, const char *s, size_t n)
{
	dstr d = { 0 };

	*out = NULL;
	if (dstr_put(&d, s, n) || dapo_normalize(&d)) {
		rl_buf_fini(&d);
		return -1;
	}
	*out = DS(&d);
	return (long)d.len;
}

/* The text of the last match of (?i)Answer\s*:\s*([^\n]+) in s[0..n), as
 * Python's re.findall finds them (left to right, not overlapping); *len -1
 * when there is none. */
static const char *
dapo_extract(const char *s, size_t n, long *len)
{
	const char *got = NULL;
	size_t i = 0;

	*len = -1;
	while (i + 6 <= n) {
		size_t j, k, ws;
		if (strncasecmp(s + i, "answer", 6) != 0) {
			i++;
			continue;
		}
		for (j = i + 6; j < n && py_space((unsigned char)s[j]); j++)
			;
		if (j >= n || s[j] != ':') {
			i++;
			continue;
		}
		for (ws = k = j + 1; k < n && py_space((unsigned char)s[k]); k++)
			;
		if (k < n) {
			/* greedy \s*, then the rest of the line */
			size_t e = k;
			while (e < n && s[e] != '\n')
				e++;
			got = s + k;
			*len = (long)(e - k);
			i = e;
			continue;
		}
		/* only whitespace to the end: \s* gives characters back until
		 * [^\n]+ can take one, the last that is not a newline */
		while (k > ws && s[k - 1] == '\n')
			k--;
		if (k > ws) {
			got = s + k - 1;
			*len = 1;
			i = k;
			continue;
		}
		i++;
	}
	return got;
}

static int
dapo_score(double *score, const char **why, const char *resp, size_t n, const char *truth)
{
	char *pred = NULL, *want = NULL;
	const char *a;
	long al;
	size_t start = n, cps = 0;

	*score = -1;
	/* the last 300 characters (code points) of the response */
	while (start > 0 && cps < 300) {
		start--;
		if (((unsigned char)resp[start] & 0xc0) != 0x80)
			cps++;
	}
	a = dapo_extract(resp + start, n - start, &al);
	if (!a) {
		a = "[INVALID]";
		al = 9;
	}
	if (rl_reward_dapo_normalize(&pred, a, (size_t)al) < 0 ||
	    rl_reward_dapo_normalize(&want, truth, strlen(truth)) < 0) {
		free(pred);
		free(want);
		SET_WHY(why, "out of memory");
		return RL_ENOMEM;
	}
	if (strcmp(pred, want) == 0) {
		*score = 1;
		SET_WHY(why, NULL);
	} else {
		SET_WHY(why, al == 9 && strcmp(a, "[INVALID]") == 0 ? "no \"Answer:\" in the last 300 characters"
								    : "wrong answer");
	}
	free(pred);
	free(want);
	return 0;
}

double
rl_reward_dapo(const char *resp, size_t n, const char *truth, const char **why)
{
	double s;

	if (dapo_score(&s, why, resp, n, truth) != 0)
		return -1;
	return s;
}

/* ---- countdown ------------------------------------------------------------------ */

typedef struct rat { int64_t n, d; } rat;

typedef struct cparse {
	const char *s;
	size_t n, i;
	int depth;
	int64_t *lits;
	size_t cap, nlits;
	int err;
	const char *why;
} cparse;

static int64_t
gcd64(int64_t a, int64_t b)
{
	if (a < 0)
		a = -a;
	if (b < 0)
		b = -b;
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

static void
cfail(cparse *p, int err, const char *why)
{
	if (!p->err) {
		p->err = err;
		p->why = why;
	}
}

/* r = reduce(n/d) with d != 0; INT64_MIN is refused so negation never overflows. */
static rat
mkrat(cparse *p, int64_t n, int64_t d)
{
	rat r = { 0, 1 };
	int64_t g;

	if (n == INT64_MIN || d == INT64_MIN) {
		cfail(p, RL_ETOOBIG, "overflow");
		return r;
	}
	if (d < 0) {
		n = -n;
		d = -d;
	}
	g = gcd64(n, d);
	if (g > 1) {
		n /= g;
		d /= g;
	}
	r.n = n;
	r.d = d;
	return r;
}

static rat
rat_op(cparse *p, rat a, rat b, char op)
{
	int64_t x, y, z;
	rat zero = { 0, 1 };

	if (p->err)
		return zero;
	switch (op) {
	case '+':
	case '-':
		if (__builtin_mul_overflow(a.n, b.d, &x) || __builtin_mul_overflow(b.n, a.d, &y) ||
		    (op == '+' ? __builtin_add_overflow(x, y, &z) : __builtin_sub_overflow(x, y, &z)) ||
		    __builtin_mul_overflow(a.d, b.d, &y))
			break;
		return mkrat(p, z, y);
	case '*':
		if (__builtin_mul_overflow(a.n, b.n, &x) || __builtin_mul_overflow(a.d, b.d, &y))
			break;
		return mkrat(p, x, y);
	case '/':
		if (b.n == 0) {
			cfail(p, RL_EINVAL, "division by zero");
			return zero;
		}
		if (__builtin_mul_overflow(a.n, b.d, &x) || __builtin_mul_overflow(a.d, b.n, &y))
			break;
		return mkrat(p, x, y);
	}
	cfail(p, RL_ETOOBIG, "overflow");
	return zero;
}

static void
cskip(cparse *p)
{
	while (p->i < p->n && is_space((unsigned char)p->s[p->i]))
		p->i++;
}

static rat cexpr(cparse *p);

static rat
cfactor(cparse *p)
{
	rat r = { 0, 1 };

	cskip(p);
	if (p->err)
		return r;
	if (p->i < p->n && p->s[p->i] == '(') {
		if (++p->depth > 64) {
			cfail(p, RL_ETOOBIG, "parentheses nested too deep");
			return r;
		}
		p->i++;
		r = cexpr(p);
		cskip(p);
		if (p->i >= p->n || p->s[p->i] != ')') {
			cfail(p, RL_EFORMAT, "unbalanced parentheses");
			return r;
		}
		p->i++;
		p->depth--;
		return r;
	}
	if (p->i < p->n && is_digit((unsigned char)p->s[p->i])) {
		int64_t v = 0;
		while (p->i < p->n && is_digit((unsigned char)p->s[p->i])) {
			if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, p->s[p->i] - '0', &v)) {
				cfail(p, RL_ETOOBIG, "overflow");
				return r;
			}
			p->i++;
		}
		if (p->i < p->n && (p->s[p->i] == '.' || isalpha((unsigned char)p->s[p->i]))) {
			cfail(p, RL_EFORMAT, "not an integer");
			return r;
		}
		if (p->nlits < p->cap)
			p->lits[p->nlits] = v;
		p->nlits++;
		r.n = v;
		return r;
	}
	cfail(p, RL_EFORMAT, p->i >= p->n ? "unexpected end of equation" : "unexpected character in equation");
	return r;
}

static rat
cterm(cparse *p)
{
	rat a = cfactor(p);

	for (;;) {
		cskip(p);
		if (p->err || p->i >= p->n || (p->s[p->i] != '*' && p->s[p->i] != '/'))
			return a;
		char op = p->s[p->i++];
		rat b = cfactor(p);
		a = rat_op(p, a, b, op);
	}
}

static rat
cexpr(cparse *p)
{
	rat a = cterm(p);

	for (;;) {
		cskip(p);
		if (p->err || p->i >= p->n || (p->s[p->i] != '+' && p->s[p->i] != '-'))
			return a;
		char op = p->s[p->i++];
		rat b = cterm(p);
		a = rat_op(p, a, b, op);
	}
}

int
rl_reward_countdown_eval(int64_t *num, int64_t *den, int64_t *lits, size_t cap, size_t *nlits,
			 const char *expr, size_t n, const char **why)
{
	cparse p = { .s = expr, .n = n, .lits = lits, .cap = cap };
	rat r = cexpr(&p);

	cskip(&p);
	if (!p.err && p.i < p.n)
		cfail(&p, RL_EFORMAT, p.s[p.i] == ')' ? "unbalanced parentheses" : "unexpected character in equation");
	if (nlits)
		*nlits = p.nlits;
	if (p.err) {
		SET_WHY(why, p.why);
		return p.err;
	}
	*num = r.n;
	*den = r.d;
	SET_WHY(why, NULL);
	return 0;
}

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* Content of the last <answer>...</answer>; NULL when there is none. */
static const char *
last_answer_tag(size_t *len, const char *s, size_t n)
{
	const char *open = NULL;

	for (size_t i = 0; i + 8 <= n; i++)
		if (memcmp(s + i, "<answer>", 8) == 0)
			open = s + i;
	if (!open)
		return NULL;
	const char *b = open + 8, *e = s + n;
	for (const char *q = b; q + 9 <= e; q++) {
		if (memcmp(q, "</answer>", 9) == 0) {
			*len = (size_t)(q - b);
			return b;
		}
	}
	return NULL;
}

double
rl_reward_countdown(const char *resp, size_t n, const int64_t *numbers, size_t count, int64_t target,
		    const char **why)
{
	int64_t lits[64], want[64], num, den;
	size_t len, nl, i;
	const char *eq = last_answer_tag(&len, resp, n), *eqs;

	if (!eq) {
		SET_WHY(why, "no <answer>...</answer> in response");
		return 0;
	}
	/* "expr = value": the value must be the target too */
	eqs = memchr(eq, '=', len);
	if (eqs) {
		const char *v = eqs + 1;
		size_t vn = len - (size_t)(v - eq);
		int64_t vnum, vden;
		trim(&v, &vn);
		if (rl_reward_countdown_eval(&vnum, &vden, NULL, 0, NULL, v, vn, why) != 0 || vden != 1 ||
		    vnum != target) {
			SET_WHY(why, "value after = is not the target");
			return 0;
		}
		len = (size_t)(eqs - eq);
	}
	if (rl_reward_countdown_eval(&num, &den, lits, RL_ARRAY_LEN(lits), &nl, eq, len, why) != 0)
		return 0;
	if (nl != count || count > RL_ARRAY_LEN(want)) {
		SET_WHY(why, nl < count ? "does not use every number" : "uses a number not given or more than once");
		return 0;
	}
	memcpy(want, numbers, count * sizeof *want);
	qsort(want, count, sizeof *want, cmp_i64);
	qsort(lits, nl, sizeof *lits, cmp_i64);
	for (i = 0; i < count; i++) {
		if (want[i] != lits[i]) {
			SET_WHY(why, "uses a number not given or more than once");
			return 0;
		}
	}
	if (den != 1 || num != target) {
		SET_WHY(why, "wrong value");
		return 0;
	}
	SET_WHY(why, NULL);
	return 1;
}

/* ---- exact, arith, length --------------------------------------------------------- */

double
rl_reward_exact(const char *resp, size_t n, const char *truth, const char **why)
{
	size_t tn = strlen(truth);

	trim(&resp, &n);
	trim(&truth, &tn);
	if (n == tn && memcmp(resp, truth, n) == 0) {
		SET_WHY(why, NULL);
		return 1;
	}
	SET_WHY(why, "not equal");
	return 0;
}

double
rl_reward_arith(const char *resp, size_t n, const char *truth, const char **why)
{
	size_t i = 0, b, tn = strlen(truth);

	while (i < n && resp[i] == ' ')
		i++;
	b = i;
	if (i < n && resp[i] == '-')
		i++;
	if (i >= n || !is_digit((unsigned char)resp[i])) {
		SET_WHY(why, "response does not start with a number");
		return 0;
	}
	while (i < n && is_digit((unsigned char)resp[i]))
		i++;
	if (i < n && !is_space((unsigned char)resp[i])) {
		SET_WHY(why, "number not followed by the end or a space");
		return 0;
	}
	trim(&truth, &tn);
	if (i - b == tn && memcmp(resp + b, truth, tn) == 0) {
		SET_WHY(why, NULL);
		return 1;
	}
	SET_WHY(why, "wrong answer");
	return 0;
}

double
rl_reward_length(long len, long max_len)
{
	double p;

	if (max_len <= 0 || len <= max_len)
		return 0;
	p = -(double)(len - max_len) / (double)max_len;
	return p < -1 ? -1 : p;
}

long
rl_reward_utf8_len(const char *s, size_t n)
{
	long c = 0;

	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xc0) != 0x80;
	return c;
}

/* ---- tasks ---------------------------------------------------------------------- */

static const char *const kind_names[RL_TASK_KIND_COUNT] = {
	[RL_TASK_GSM8K] = "gsm8k",   [RL_TASK_MATH] = "math",     [RL_TASK_COUNTDOWN] = "countdown",
	[RL_TASK_EXACT] = "exact",   [RL_TASK_REGEX] = "regex",   [RL_TASK_FORMAT] = "format",
	[RL_TASK_LENGTH] = "length", [RL_TASK_ARITH] = "arith",     [RL_TASK_DAPO] = "dapo",
	[RL_TASK_AUTO] = "auto",
};

static int
parse_weight(double *w, const char *s, size_t n)
{
	char buf[64], *end;

	if (n == 0 || n >= sizeof buf)
		return -1;
	memcpy(buf, s, n);
	buf[n] = 0;
	*w = strtod(buf, &end);
	return (*end || !isfinite(*w)) ? -1 : 0;
}

static int
name_taken(const char *name, const rl_reward_task *taken, size_t ntaken)
{
	for (size_t i = 0; i < ntaken; i++)
		if (strcmp(taken[i].name, name) == 0)
			return 1;
	return 0;
}

int
rl_reward_task_parse(rl_reward_task *t, const char *spec, const rl_reward_task *taken, size_t ntaken)
{
	const char *colon = strchr(spec, ':');
	size_t nl = colon ? (size_t)(colon - spec) : strlen(spec);
	int kind = -1, errc;
	PCRE2_SIZE erroff;

	memset(t, 0, sizeof *t);
	t->weight = 1.0;
	for (int k = 0; k < RL_TASK_KIND_COUNT; k++)
		if (strlen(kind_names[k]) == nl && memcmp(kind_names[k], spec, nl) == 0)
			kind = k;
	if (kind < 0) {
		rl_error("unknown task '%.*s'", (int)nl, spec);
		rl_hint("tasks: gsm8k math dapo countdown exact regex:PATTERN format:PATTERN length arith auto");
		return RL_EINVAL;
	}
	t->kind = kind;
	if (kind == RL_TASK_REGEX || kind == RL_TASK_FORMAT) {
		const char *pat, *c2;
		if (!colon || !colon[1]) {
			rl_error("task '%s' needs a pattern: %s[:WEIGHT]:PATTERN", spec, kind_names[kind]);
			return RL_EINVAL;
		}
		pat = colon + 1;
		c2 = strchr(pat, ':');
		if (c2 && parse_weight(&t->weight, pat, (size_t)(c2 - pat)) == 0)
			pat = c2 + 1;
		else
			t->weight = 1.0;
		if (!*pat) {
			rl_error("task '%s' has an empty pattern", spec);
			return RL_EINVAL;
		}
		t->pattern = rl_xstrdup(pat);
		t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
				      PCRE2_UTF | PCRE2_DOTALL | PCRE2_MATCH_INVALID_UTF, &errc, &erroff, NULL);
		if (!t->re) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(errc, msg, sizeof msg);
			rl_error("task '%s': bad pattern at offset %zu: %s", spec, (size_t)erroff, (char *)msg);
			free(t->pattern);
			t->pattern = NULL;
			return RL_EINVAL;
		}
		pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
	} else if (colon) {
		if (parse_weight(&t->weight, colon + 1, strlen(colon + 1)) != 0) {
			rl_error("task '%s': weight '%s' is not a number", spec, colon + 1);
			return RL_EINVAL;
		}
	}
	snprintf(t->name, sizeof t->name, "%s", kind_names[kind]);
	for (int k = 2; name_taken(t->name, taken, ntaken); k++)
		snprintf(t->name, sizeof t->name, "%s%d", kind_names[kind], k);
	return 0;
}

void
rl_reward_task_fini(rl_reward_task *t)
{
	if (!t)
		return;
	pcre2_code_free(t->re);
	free(t->pattern);
	t->re = NULL;
	t->pattern = NULL;
}

static const char *
json_scalar(const cJSON *j, char *buf, size_t cap)
{
	if (cJSON_IsString(j))
		return j->valuestring;
	if (cJSON_IsNumber(j) && isfinite(j->valuedouble) && rl_reward_decimal(buf, cap, j->valuedouble) == 0)
		return buf;
	return NULL;
}

/* d as plain decimal text (no exponent), with the fewest significant digits
 * that read back as d: 1e20 -> "100000000000000000000", 1e-7 -> "0.0000001",
 * 0.1 -> "0.1".  -1 when it does not fit in cap. */
int
rl_reward_decimal(char *buf, size_t cap, double d)
{
	char e[40], dig[24];
	int p, ex, nd = 0, k = 0;
	const char *q;

	if (!isfinite(d))
		return -1;
	for (p = 1; p <= 17; p++) {
		snprintf(e, sizeof e, "%.*e", p - 1, d);
		if (strtod(e, NULL) == d)
			break;
	}
	/* e: [-]D[.DDD]e[+-]XX */
	q = e;
	if (*q == '-')
		q++;
	for (; *q && *q != 'e'; q++)
		if (is_digit((unsigned char)*q))
			dig[nd++] = *q;
	ex = atoi(q + 1);
	while (nd > 1 && dig[nd - 1] == '0')
		nd--;
	if (nd == 1 && dig[0] == '0') {
		if (cap < 2)
			return -1;
		memcpy(buf, "0", 2);
		return 0;
	}
	/* value = 0.dig x 10^(ex + 1) */
	int ip = ex + 1; /* digits before the point */
	size_t need = (size_t)(2 + (ip > 0 ? (ip > nd ? ip : nd) : nd - ip) + 2);
	if (need >= cap)
		return -1;
	if (d < 0)
		buf[k++] = '-';
	if (ip <= 0) {
		buf[k++] = '0';
		buf[k++] = '.';
		for (int i = 0; i < -ip; i++)
			buf[k++] = '0';
		for (int i = 0; i < nd; i++)
			buf[k++] = dig[i];
	} else {
		for (int i = 0; i < ip; i++)
			buf[k++] = i < nd ? dig[i] : '0';
		if (nd > ip) {
			buf[k++] = '.';
			for (int i = ip; i < nd; i++)
				buf[k++] = dig[i];
		}
	}
	buf[k] = 0;
	return 0;
}

const char *
rl_reward_truth(const cJSON *meta, char *buf, size_t cap)
{
	const cJSON *a, *rm;
	const char *s;

	if (!cJSON_IsObject(meta))
		return NULL;
	a = cJSON_GetObjectItemCaseSensitive(meta, "answer");
	if (a && (s = json_scalar(a, buf, cap)))
		return s;
	rm = cJSON_GetObjectItemCaseSensitive(meta, "reward_model");
	if (cJSON_IsObject(rm)) {
		a = cJSON_GetObjectItemCaseSensitive(rm, "ground_truth");
		if (a && (s = json_scalar(a, buf, cap)))
			return s;
	}
	return NULL;
}

/* An integer-valued JSON number into *v. */
static int
json_int(int64_t *v, const cJSON *j)
{
	if (!cJSON_IsNumber(j))
		return -1;
	double d = j->valuedouble;
	if (!(d >= -9e15 && d <= 9e15) || d != floor(d))
		return -1;
	*v = (int64_t)d;
	return 0;
}

/* Countdown's numbers and target: meta.numbers (or meta.nums) and
 * meta.target, else the same keys in meta.reward_model.ground_truth. */
static int
countdown_truth(int64_t *nums, size_t cap, size_t *count, int64_t *target, const cJSON *meta, const char **why)
{
	const cJSON *src = meta, *arr, *tg, *e;
	size_t k = 0;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			const cJSON *rm = cJSON_GetObjectItemCaseSensitive(meta, "reward_model");
			src = cJSON_IsObject(rm) ? cJSON_GetObjectItemCaseSensitive(rm, "ground_truth") : NULL;
		}
		if (!cJSON_IsObject(src))
			continue;
		arr = cJSON_GetObjectItemCaseSensitive(src, "numbers");
		if (!arr)
			arr = cJSON_GetObjectItemCaseSensitive(src, "nums");
		tg = cJSON_GetObjectItemCaseSensitive(src, "target");
		if (!arr || !tg)
			continue;
		if (!cJSON_IsArray(arr) || json_int(target, tg) != 0) {
			*why = "countdown numbers must be an array of integers and target an integer";
			return RL_EFORMAT;
		}
		cJSON_ArrayForEach(e, arr) {
			if (k >= cap || json_int(&nums[k], e) != 0) {
				*why = k >= cap ? "more than 64 countdown numbers"
						: "countdown numbers must be an array of integers and target an integer";
				return RL_EFORMAT;
			}
			k++;
		}
		*count = k;
		return 0;
	}
	*why = "no meta.numbers and meta.target";
	return RL_ENOENT;
}

/* Case-insensitive substring search. */
static int
has_word(const char *s, const char *w)
{
	size_t n = strlen(w);

	for (; *s; s++)
		if (strncasecmp(s, w, n) == 0)
			return 1;
	return 0;
}

/* The task a meta.task or meta.data_source value names, -1 for none.  verl
 * scores the data sources "math", "math_dapo", "math_dapo_reasoning" and
 * "aime*" with math_dapo ("Answer: ..."), not with \boxed{}: so does dapo. */
static int
auto_word_kind(const char *v, int is_source)
{
	static const struct { const char *word; int kind; } map[] = {
		{ "gsm8k", RL_TASK_GSM8K }, { "countdown", RL_TASK_COUNTDOWN },
		{ "arith", RL_TASK_ARITH }, { "math", RL_TASK_MATH },
	};

	if (is_source ? (strcmp(v, "math") == 0 || strcmp(v, "math_dapo") == 0 ||
			 strcmp(v, "math_dapo_reasoning") == 0 || strncmp(v, "aime", 4) == 0)
		      : strcasecmp(v, "dapo") == 0)
		return RL_TASK_DAPO;
	for (size_t i = 0; i < RL_ARRAY_LEN(map); i++)
		if (has_word(v, map[i].word))
			return map[i].kind;
	return -1;
}

int
rl_reward_auto_kind(const cJSON *meta)
{
	static const char *const keys[] = { "task", "data_source" };

	if (!cJSON_IsObject(meta))
		return -1;
	for (size_t k = 0; k < RL_ARRAY_LEN(keys); k++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, keys[k]);
		int kind;
		if (cJSON_IsString(v) && (kind = auto_word_kind(v->valuestring, k == 1)) >= 0)
			return kind;
	}
	return -1;
}

int
rl_reward_task_score(double *score, const char **why, const rl_reward_task *t, const rl_reward_opts *o,
		     const char *resp, size_t n, const cJSON *meta, long ntokens)
{
	char buf[400]; /* a JSON number's truth as plain decimal text: up to ~330 characters */
	const char *truth = NULL, *w = NULL;
	int rv = 0, kind = t->kind;

	*score = 0;
	*why = NULL;
	if (kind == RL_TASK_AUTO && (kind = rl_reward_auto_kind(meta)) < 0) {
		*why = "no gsm8k, math, dapo, countdown or arith in meta.task or meta.data_source";
		return RL_ENOENT;
	}
	if (kind != RL_TASK_COUNTDOWN && kind != RL_TASK_FORMAT && kind != RL_TASK_LENGTH) {
		truth = rl_reward_truth(meta, buf, sizeof buf);
		if (!truth) {
			*why = "no ground truth (meta.answer or meta.reward_model.ground_truth)";
			return RL_ENOENT;
		}
	}
	switch (kind) {
	case RL_TASK_GSM8K:
		rv = gsm8k_score(score, &w, resp, n, truth, o ? o->gsm8k_mode : RL_GSM8K_STRICT);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_MATH:
		rv = math_score(score, &w, resp, n, truth);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_DAPO:
		rv = dapo_score(score, &w, resp, n, truth);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_COUNTDOWN: {
		int64_t nums[64], target;
		size_t count = 0;
		if ((rv = countdown_truth(nums, RL_ARRAY_LEN(nums), &count, &target, meta, why)) != 0)
			return rv;
		*score = rl_reward_countdown(resp, n, nums, count, target, &w);
		return 0;
	}
	case RL_TASK_EXACT:
		*score = rl_reward_exact(resp, n, truth, &w);
		return 0;
	case RL_TASK_ARITH:
		*score = rl_reward_arith(resp, n, truth, &w);
		return 0;
	case RL_TASK_LENGTH: {
		long len = (o && !o->length_chars && ntokens >= 0) ? ntokens : rl_reward_utf8_len(resp, n);
		*score = rl_reward_length(len, o ? o->max_length : 0);
		return 0;
	}
	case RL_TASK_REGEX:
	case RL_TASK_FORMAT: {
		pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
		int m;
		if (!md) {
			*why = "out of memory";
			return RL_ENOMEM;
		}
		m = pcre2_match(t->re, (PCRE2_SPTR)resp, n, 0, 0, md, NULL);
		if (m >= 0 && t->kind == RL_TASK_FORMAT) {
			*score = 1;
		} else if (m >= 0) {
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
			const char *g = resp + ov[0];
			size_t gn = ov[1] - ov[0], tn = strlen(truth);
			/* the first capture group when the pattern has one and it took part */
			if (m >= 2 && ov[2] != PCRE2_UNSET) {
				g = resp + ov[2];
				gn = ov[3] - ov[2];
			}
			trim(&g, &gn);
			trim(&truth, &tn);
			*score = (gn == tn && memcmp(g, truth, gn) == 0);
		} else if (m != PCRE2_ERROR_NOMATCH) {
			/* match limits hit: a zero score, not a failed record */
			*score = 0;
		}
		pcre2_match_data_free(md);
		return 0;
	}
	}
	*why = "unknown task";
	return RL_EINVAL;
}

/* ---- scoring records --------------------------------------------------------------- */

static void
add_reason(char *err, size_t cap, const char *name, const char *why)
{
	size_t k = strlen(err);

	if (k + 3 >= cap)
		return;
	snprintf(err + k, cap - k, "%s%s: %s", k ? "; " : "", name, why);
}

/* Scores one record; er is its --exec result or NULL. */
static int
score_one(rl_reward_scorer *s, rl_traj *t, const rl_reward_exec_result *er)
{
	const char *resp = NULL, *mtext = NULL, *why;
	size_t rn = 0, mn = 0, ntok = 0, nc = s->ntasks;
	const int32_t *tok;
	long ntokens = -1;
	cJSON *meta = NULL, *scores;
	char err[1024] = "", *text = NULL;
	double total = 0, sc[RL_REWARD_MAX_TASKS + 1];
	int ok[RL_REWARD_MAX_TASKS + 1] = { 0 }, failed = 0, bad_truth = 0, rv = 0;

	if (rl_traj_get_str(t, RL_TAG_RESPONSE_TEXT, &resp, &rn) != 0)
		resp = NULL;
	if (rl_traj_get_i32s(t, RL_TAG_RESPONSE, &tok, &ntok) == 0)
		ntokens = (long)ntok;
	if (rl_traj_get_str(t, RL_TAG_META, &mtext, &mn) == 0) {
		meta = cJSON_ParseWithLength(mtext, mn);
		if (!cJSON_IsObject(meta)) {
			/* leave such a meta alone: there is nowhere to put scores */
			cJSON_Delete(meta);
			meta = NULL;
		}
	} else {
		mtext = NULL;
		if (!(meta = cJSON_CreateObject()))
			return RL_ENOMEM;
	}

	for (size_t i = 0; i < nc; i++) {
		why = NULL;
		if (!meta) {
			why = "meta is not a JSON object";
		} else if (!resp) {
			why = "record has no response_text";
		} else {
			rv = rl_reward_task_score(&sc[i], &why, &s->tasks[i], &s->opts, resp, rn, meta, ntokens);
			if (rv == RL_ENOMEM)
				goto out;
			if (rv == 0)
				why = NULL;
			rv = 0;
		}
		if (why) {
			add_reason(err, sizeof err, s->tasks[i].name, why);
			failed = 1;
			bad_truth = 1;
		} else {
			ok[i] = 1;
			total += s->tasks[i].weight * sc[i];
		}
	}
	if (s->exec) {
		if (er->status == RL_EXEC_OK) {
			sc[nc] = er->reward;
			ok[nc] = 1;
			total += s->exec_weight * er->reward;
		} else {
			char r[256];
			snprintf(r, sizeof r, "%s: %s", rl_reward_exec_status_name(er->status), er->reason);
			add_reason(err, sizeof err, "exec", r);
			failed = 1;
		}
		s->st.exec_failed[er->status]++;
	}
	if (!failed && !isfinite((float)total)) {
		/* the record's reward is an f32: 1e300 from a worker, or a weight of 1e39,
		 * would become inf */
		char r[96];
		snprintf(r, sizeof r, "weighted sum %g is outside the f32 range", total);
		add_reason(err, sizeof err, "reward", r);
		failed = 1;
		s->st.out_of_range++;
	}

	/* meta.scores.NAME, meta.reward_error */
	if (meta) {
		scores = cJSON_GetObjectItemCaseSensitive(meta, "scores");
		if (!cJSON_IsObject(scores)) {
			cJSON_DeleteItemFromObjectCaseSensitive(meta, "scores");
			scores = cJSON_AddObjectToObject(meta, "scores");
		}
		for (size_t i = 0; i < nc + (s->exec != NULL); i++) {
			const char *name = i < nc ? s->tasks[i].name : "exec";
			cJSON *v = ok[i] ? cJSON_CreateNumber(sc[i]) : cJSON_CreateNull();
			if (!scores || !v) {
				cJSON_Delete(v);
				rv = RL_ENOMEM;
				goto out;
			}
			if (cJSON_GetObjectItemCaseSensitive(scores, name))
				cJSON_ReplaceItemInObjectCaseSensitive(scores, name, v);
			else
				cJSON_AddItemToObject(scores, name, v);
		}
		cJSON_DeleteItemFromObjectCaseSensitive(meta, "reward_error");
		if (failed && !cJSON_AddStringToObject(meta, "reward_error", err)) {
			rv = RL_ENOMEM;
			goto out;
		}
		if (!(text = rl_json_print(meta))) {
			rv = RL_ENOMEM;
			goto out;
		}
		/* cJSON printed it: compact, valid JSON, no need to parse it again */
		if ((rv = rl_traj_set(t, RL_TAG_META, RL_TRAJ_JSON, text, strlen(text))) != 0)
			goto out;
	}
	if ((rv = rl_traj_set_f32(t, RL_TAG_REWARD, failed ? NAN : (float)total)) != 0 ||
	    (rv = rl_traj_set_f64(t, RL_TAG_TS_SCORED, rl_wall())) != 0)
		goto out;

	s->st.records++;
	if (failed) {
		s->st.failed++;
		s->st.no_truth += bad_truth;
		if (rl_log_level() >= RL_LOG_VERBOSE) {
			uint64_t id = 0;
			rl_traj_get_u64(t, RL_TAG_ID, &id);
			rl_verbose("record %llu: %s", (unsigned long long)id, err);
		}
	} else {
		s->st.reward_sum += total;
	}
	for (size_t i = 0; i < nc + (s->exec != NULL); i++) {
		if (ok[i]) {
			s->st.comp_sum[i] += sc[i];
			s->st.comp_n[i]++;
		}
	}
out:
	free(text);
	cJSON_Delete(meta);
	return rv;
}

int
rl_reward_score_records(rl_reward_scorer *s, rl_traj *const *recs, size_t n)
{
	rl_reward_exec_result *res = NULL;
	const char **lines = NULL;
	size_t *lens = NULL, *off = NULL;
	rl_buf buf;
	int rv = 0;

	rl_buf_init(&buf);
	if (s->ntasks > RL_REWARD_MAX_TASKS) {
		rl_error("at most %d tasks", RL_REWARD_MAX_TASKS);
		return RL_EINVAL;
	}
	if (s->exec && n > 0) {
		res = rl_try_calloc(n, sizeof *res, "exec results");
		lines = rl_try_calloc(n, sizeof *lines, "exec lines");
		lens = rl_try_calloc(n, sizeof *lens, "exec lines");
		off = rl_try_calloc(n + 1, sizeof *off, "exec lines");
		if (!res || !lines || !lens || !off) {
			rv = RL_ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			off[i] = buf.len;
			if ((rv = rl_traj_to_json(&buf, recs[i])) != 0)
				goto out;
		}
		off[n] = buf.len;
		for (size_t i = 0; i < n; i++) {
			lines[i] = (const char *)buf.p + off[i];
			lens[i] = off[i + 1] - off[i];
		}
		if ((rv = rl_reward_exec_run(s->exec, res, lines, lens, n)) != 0)
			goto out;
	}
	for (size_t i = 0; i < n; i++)
		if ((rv = score_one(s, recs[i], res ? &res[i] : NULL)) != 0)
			goto out;
out:
	rl_buf_fini(&buf);
	free(res);
	free(lines);
	free(lens);
	free(off);
	return rv;
}

int
rl_reward_stream(rl_reward_scorer *s, rl_traj_reader *r, rl_traj_writer *w, size_t batch)
{
	rl_traj **pend = NULL;
	size_t np = 0;
	int rv = 0, rerr = 0;

	if (batch < 1)
		batch = 1;
	pend = rl_try_calloc(batch, sizeof *pend, "record batch");
	if (!pend)
		return RL_ENOMEM;
	for (;;) {
		rl_traj *t = NULL;
		if (rl_traj_reader_drained(r)) {
			/* about to wait on the input: what is pending goes downstream first
			 * (in a pipe the next stage may be waiting for exactly these) */
			if (np > 0) {
				if ((rv = rl_reward_score_records(s, pend, np)) != 0)
					goto out;
				for (size_t i = 0; i < np; i++) {
					if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
						goto out;
					rl_traj_destroy(pend[i]);
					pend[i] = NULL;
				}
				np = 0;
			}
			if ((rv = rl_traj_writer_flush(w)) != 0)
				goto out;
		}
		if ((rerr = rl_traj_reader_next(r, &t)) != 0 || !t)
			break;
		if (batch == 1) {
			/* no copy: the reader's record is scored and written in place */
			if ((rv = rl_reward_score_records(s, &t, 1)) != 0 || (rv = rl_traj_writer_put(w, t)) != 0)
				goto out;
			continue;
		}
		if ((rv = rl_traj_dup(&pend[np], t)) != 0)
			goto out;
		np++;
		if (np == batch) {
			if ((rv = rl_reward_score_records(s, pend, np)) != 0)
				goto out;
			for (size_t i = 0; i < np; i++) {
				if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
					goto out;
			}
			for (size_t i = 0; i < np; i++) {
				rl_traj_destroy(pend[i]);
				pend[i] = NULL;
			}
			np = 0;
		}
	}
	/* what was read before the end or an error is still scored and written */
	if (np > 0) {
		if ((rv = rl_reward_score_records(s, pend, np)) != 0)
			goto out;
		for (size_t i = 0; i < np; i++)
			if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
				goto out;
	}
out:
	for (size_t i = 0; i < np; i++)
		rl_traj_destroy(pend[i]);
	free(pend);
	return rv ? rv : rerr;
}

int
rl_reward_queue(rl_reward_scorer *s, rl_qclient *c, const rl_reward_queue_opts *o, volatile sig_atomic_t *stop)
{
	uint32_t batch = o && o->batch ? o->batch : 256, wait_ms = o && o->wait_ms ? o->wait_ms : 500;
	double idle_exit = o ? o->idle_exit_s : 0, last = rl_now();
	rl_wstat *ws = o ? o->stats : NULL;
	rl_traj **recs = NULL;
	rl_traj_batch *out = NULL;
	rl_qlease l;
	rl_qput_result pr;
	int rv = 0;

	rl_qlease_init(&l);
	recs = rl_try_calloc(batch, sizeof *recs, "record batch");
	if (!recs || (rv = rl_traj_batch_create(&out)) != 0) {
		rv = rv ? rv : RL_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < batch; i++)
		if ((rv = rl_traj_create(&recs[i])) != 0)
			goto out;
	while (!*stop) {
		size_t n;
		rl_wstat_phase(ws, RL_WSTAT_IDLE);
		if ((rv = rl_qclient_lease_generated(c, batch, wait_ms, &l)) != 0) {
			if (*stop && !rl_qclient_gone(c))
				rv = 0;   /* signalled while the request went unanswered: a stop */
			goto out;
		}
		n = rl_qlease_count(&l);
		if (n > 0)
			rl_wstat_phase(ws, RL_WSTAT_BUSY);
		if (l.id == 0 || n == 0) {
			if (idle_exit > 0 && rl_now() - last >= idle_exit)
				break;
			continue;
		}
		/* the records borrow from the lease's batch; setters copy what changes */
		for (size_t i = 0; i < n; i++)
			if ((rv = rl_traj_batch_get(l.batch, i, recs[i])) != 0)
				goto out;
		uint64_t deadline = l.deadline_ms, now_ms = (uint64_t)(rl_wall() * 1000.0);
		uint64_t span = deadline > now_ms ? deadline - now_ms : 0;
		size_t chunk = o && o->chunk ? o->chunk : n;
		for (size_t i = 0; i < n; i += chunk) {
			if ((rv = rl_reward_score_records(s, recs + i, RL_MIN(chunk, n - i))) != 0)
				goto out;
			now_ms = (uint64_t)(rl_wall() * 1000.0);
			if (i + chunk < n && deadline && deadline - RL_MIN(deadline, now_ms) < span / 2) {
				rl_qack_result ar = { 0 };
				if (rl_qclient_extend(c, &l, &ar) == 0 && ar.deadline_ms > now_ms) {
					deadline = ar.deadline_ms;
					span = deadline - now_ms;
					rl_verbose("queue: lease %llu extended", (unsigned long long)l.id);
				} else {
					rl_warn("queue: could not extend lease %llu; its records may be scored twice",
						(unsigned long long)l.id);
				}
			}
		}
		rl_traj_batch_clear(out);
		for (size_t i = 0; i < n; i++)
			if ((rv = rl_traj_batch_add(out, recs[i])) != 0)
				goto out;
		if ((rv = rl_qclient_put_scored(c, out, &pr)) != 0) {
			rl_error("queue: could not put %zu scored records: %s", n, rl_strerror(rv));
			goto out;
		}
		rl_wstat_add(ws, n, 0);
		rl_verbose("queue: lease %llu: %zu records scored", (unsigned long long)l.id, n);
		last = rl_now();
	}
out:
	if (recs)
		for (uint32_t i = 0; i < batch; i++)
			rl_traj_destroy(recs[i]);
	free(recs);
	rl_traj_batch_destroy(out);
	rl_qlease_fini(&l);
	return rv;
}

void
rl_reward_stats_print(const rl_reward_scorer *s, double seconds)
{
	const rl_reward_stats *st = &s->st;
	size_t good = st->records - st->failed;
	char line[2048];
	size_t k = 0;

	rl_info("%zu records in %.2f s (%.0f/s), %zu failed", st->records, seconds,
		seconds > 0 ? (double)st->records / seconds : 0.0, st->failed);
	if (st->failed) {
		k = 0;
		line[0] = 0;
		if (st->no_truth)
			k += (size_t)snprintf(line + k, sizeof line - k, " %zu without usable ground truth, response_text or meta,", st->no_truth);
		if (st->out_of_range && k < sizeof line)
			k += (size_t)snprintf(line + k, sizeof line - k, " %zu with a weighted sum outside the f32 range,",
					      st->out_of_range);
		for (int e = 1; e < RL_EXEC_STATUS_COUNT; e++)
			if (st->exec_failed[e] && k < sizeof line)
				k += (size_t)snprintf(line + k, sizeof line - k, " %zu %s,", st->exec_failed[e],
						      rl_reward_exec_status_name(e));
		if (k > 0 && k < sizeof line)
			line[k - 1] = 0;
		rl_info("failures:%s", line);
	}
	if (good)
		rl_info("reward mean %.4f over %zu records", st->reward_sum / (double)good, good);
	else
		rl_info("reward mean n/a (no record scored cleanly)");
	k = 0;
	line[0] = 0;
	for (size_t i = 0; i < s->ntasks + (s->exec != NULL) && k < sizeof line; i++) {
		const char *name = i < s->ntasks ? s->tasks[i].name : "exec";
		if (st->comp_n[i])
			k += (size_t)snprintf(line + k, sizeof line - k, "%s%s %.4f (%zu)", k ? ", " : "", name,
					      st->comp_sum[i] / (double)st->comp_n[i], st->comp_n[i]);
		else
			k += (size_t)snprintf(line + k, sizeof line - k, "%s%s n/a", k ? ", " : "", name);
	}
	rl_info("mean per component: %s", line);
	if (s->exec)
		rl_info("exec: %zu timeouts, %zu crashes, %zu junk replies, %zu worker restarts",
			st->exec_failed[RL_EXEC_TIMEOUT], st->exec_failed[RL_EXEC_CRASH], st->exec_failed[RL_EXEC_JUNK],
			rl_reward_exec_restarts(s->exec));
}

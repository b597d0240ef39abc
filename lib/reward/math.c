/*
 * math.c — the math verifier (the last \boxed{} answer, normalised and compared
 * as a string or as a number) and dapo (verl's math_dapo: "Answer: ..." and the
 * Minerva normaliser).
 *
 * Leaves out: symbolic equivalence (no computer algebra).
 */
#include "reward/reward.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/core.h"
#include "base/io.h"
#include "reward/reward_int.h"

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
		rli_reward_num_decimal(out, buf, k);
		return 0;
	}
	/* rli_reward_scan_number takes the '-' itself */
	size_t end = rli_reward_scan_number(out, s, n, s[0] == '-' ? 0 : i);
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
			rli_reward_num_value(&a, s[i] - '0');
			rli_reward_num_value(&b, s[i + 1] - '0');
		} else {
			return -1;
		}
		if (b.d == 0)
			return -1;
		rli_reward_num_value(out, (neg ? -a.d : a.d) / b.d);
		return 0;
	}
	const char *slash = memchr(s, '/', n);
	if (slash) {
		if (plain_number(&a, s, (size_t)(slash - s)) || plain_number(&b, slash + 1, n - (size_t)(slash - s) - 1) ||
		    b.d == 0)
			return -1;
		rli_reward_num_value(out, a.d / b.d);
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

int
rli_reward_math_score(double *score, const char **why, const char *resp, size_t n, const char *truth)
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
	    (math_number(&a, got) == 0 && math_number(&b, want) == 0 && rli_reward_num_eq(&a, &b))) {
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

	rli_reward_math_score(&s, why, resp, n, truth);
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

int
rli_reward_dapo_score(double *score, const char **why, const char *resp, size_t n, const char *truth)
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

	if (rli_reward_dapo_score(&s, why, resp, n, truth) != 0)
		return -1;
	return s;
}

/*
 * countdown.c — the countdown verifier: the expression in the last
 * <answer>...</answer> evaluated by a recursive-descent parser over checked
 * 64-bit rationals, its numbers checked against the given ones as a multiset.
 *
 * Leaves out: reading the numbers and target from meta (tasks.c).
 */
#include "reward/reward.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "reward/reward_int.h"

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

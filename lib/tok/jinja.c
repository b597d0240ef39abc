/*
 * jinja.c — the Jinja subset of chat templates (jinja.h): a scanner that
 * applies jinja2's whitespace rules as transformers configures them
 * (trim_blocks, lstrip_blocks), a recursive-descent parser to a node tree,
 * and a tree-walking renderer over a small Python-like value type.
 *
 * Every value, node and output buffer lives in an arena freed as a whole, so
 * errors inside the parser and the renderer unwind with longjmp to the public
 * entry points without leaking.  Leaves out what jinja.h lists.
 */
#include "tok/jinja.h"

#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

/* ---- arena ------------------------------------------------------------------------- */

typedef struct chunk {
	struct chunk *next;
	size_t used, cap;
	max_align_t data[];
} chunk;

typedef struct arena {
	chunk *head;
	size_t total, max;
} arena;

static void *
arena_get(arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (!a->head || a->head->cap - a->head->used < n) {
		size_t cap = n > 65536 ? n : 65536;
		if (a->total + cap > a->max)
			return NULL;
		chunk *c = malloc(sizeof *c + cap);
		if (!c)
			return NULL;
		c->next = a->head, c->used = 0, c->cap = cap;
		a->head = c;
		a->total += cap;
	}
	void *p = (char *)a->head->data + a->head->used;
	a->head->used += n;
	return p;
}

static void
arena_free(arena *a)
{
	for (chunk *c = a->head, *nx; c; c = nx) {
		nx = c->next;
		free(c);
	}
	a->head = NULL;
	a->total = 0;
}

/* ---- values ------------------------------------------------------------------------ */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC, V_LOOP };

typedef struct list list;
typedef struct dict dict;
typedef struct node node;

typedef struct val {
	int t;
	int flag; /* V_LIST: a tuple; V_DICT: a namespace (attributes settable) */
	union {
		int64_t i;
		double f;
		struct {
			const char *p;
			size_t n;
		} s; /* V_STR, and V_UNDEF's name for messages */
		list *l;
		dict *d;
		const node *m;
		const struct loopst *lp;
	};
} val;

/* a for loop's `loop`: its fields are computed when read */
typedef struct loopst {
	const struct list *items;
	size_t i;
} loopst;

struct list {
	val *v;
	size_t n, cap;
};

struct dict {
	val *k, *v; /* keys are V_STR */
	size_t n, cap;
};

/* ---- nodes ------------------------------------------------------------------------- */

enum {
	N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETATTR, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK,
	N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
	N_BIN, N_NEG, N_POS, N_AND, N_OR, N_NOT, N_COND, N_CONCAT, N_CMP
};

struct node {
	int k, op, line, neg;
	const char *s; /* names, text */
	size_t n;
	val lit;
	node *a, *b, *c, *d;
	node **kv; /* arguments, list items, dict pairs (key, value, ...) */
	const char **kn; /* keyword names of arguments (NULL: positional) */
	int nk;
	const char **names; /* for/set targets, macro parameters */
	int nnames;
	node *next;
};

struct rl_jinja {
	arena a;
	node *body;
	char *name;
};

/* ---- scanner ----------------------------------------------------------------------- */

enum { P_TEXT, P_VAR, P_STMT };
typedef struct piece {
	int k, line;
	const char *p;
	size_t n;
} piece;

typedef struct ps {
	arena *a;
	const char *name;
	char *err;      /* where the message goes instead of the log, or NULL */
	size_t errlen;
	jmp_buf jb;
	int rv;
	piece *pc;
	size_t np, cap, ip;
	/* the expression tokenizer over one piece */
	const char *p, *e;
	int line;
	int tk, tline;
	const char *tp;
	size_t tn;
} ps;

enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

static void pfail(ps *s, int line, const char *fmt, ...) RL_PRINTF(3, 4);
static void
pfail(ps *s, int line, const char *fmt, ...)
{
	char m[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	if (s->err)
		snprintf(s->err, s->errlen, "'%s': line %d: %s", s->name, line, m);
	else
		rl_error("'%s': line %d: %s", s->name, line, m);
	s->rv = RL_EFORMAT;
	longjmp(s->jb, 1);
}

static void *
palloc(ps *s, size_t n)
{
	void *p = arena_get(s->a, n);
	if (!p) {
		if (s->err)
			snprintf(s->err, s->errlen, "'%s': out of memory parsing the template", s->name);
		else
			rl_error("'%s': out of memory parsing the template", s->name);
		s->rv = RL_ENOMEM;
		longjmp(s->jb, 1);
	}
	memset(p, 0, n);
	return p;
}

static void
add_piece(ps *s, int k, const char *p, size_t n, int line)
{
	if (s->np == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		piece *q = palloc(s, cap * sizeof *q);
		if (s->np)
			memcpy(q, s->pc, s->np * sizeof *q);
		s->pc = q, s->cap = cap;
	}
	s->pc[s->np++] = (piece){ k, line, p, n };
}

static int
count_nl(const char *p, const char *e)
{
	int n = 0;
	for (; p < e; p++)
		n += *p == '\n';
	return n;
}

/* End of a tag's content (the position of its closing "}}", "%}" or "#}"),
 * skipping quoted strings inside expressions; NULL when unterminated. */
static const char *
tag_end(const char *p, const char *e, char kind)
{
	char close = kind == '{' ? '}' : kind;
	for (; p + 1 < e; p++) {
		if (kind != '#' && (*p == '\'' || *p == '"')) {
			char q = *p;
			for (p++; p < e && *p != q; p++)
				if (*p == '\\' && p + 1 < e)
					p++;
			if (p >= e)
				return NULL;
			continue;
		}
		if (p[0] == close && p[1] == '}')
			return p;
	}
	return NULL;
}

static int
is_ws(int c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Does the statement content [p, e) (without its - or +) consist of WORD? */
static int
is_word_tag(const char *p, const char *e, const char *word)
{
	while (p < e && is_ws(*p))
		p++;
	while (e > p && is_ws(e[-1]))
		e--;
	return (size_t)(e - p) == strlen(word) && memcmp(p, word, (size_t)(e - p)) == 0;
}

/* Text before a tag at q: jinja2's "-" and lstrip_blocks rules. */
static void
text_before(ps *s, const char *tp, const char *q, int line, int line_starting)
{
	const char *te = q;
	char kind = q[1], mod = q[2];
	if (mod == '-') {
		while (te > tp && is_ws(te[-1]))
			te--;
	} else if (mod != '+' && kind != '{') {
		const char *l = te;
		while (l > tp && l[-1] != '\n')
			l--;
		if (l > tp || line_starting) {
			const char *w = l;
			while (w < te && is_ws(*w))
				w++;
			if (w == te)
				te = l;
		}
	}
	if (te > tp)
		add_piece(s, P_TEXT, tp, (size_t)(te - tp), line);
}

static void
scan(ps *s, const char *src, size_t len)
{
	const char *p = src, *e = src + len, *raw = NULL;
	int line = 1, line_starting = 1;
	if (len && e[-1] == '\n') /* keep_trailing_newline=False */
		e -= (len > 1 && e[-2] == '\r') ? 2 : 1;
	while (p < e) {
		const char *q = p;
		for (; q + 1 < e; q++) {
			if (q[0] != '{' || (q[1] != '{' && q[1] != '%' && q[1] != '#'))
				continue;
			if (!raw)
				break;
			const char *c = q + 2 + (q + 2 < e && (q[2] == '-' || q[2] == '+'));
			const char *ce = tag_end(c, e, '%');
			if (q[1] == '%' && ce && is_word_tag(c, ce - (ce[-1] == '-' || ce[-1] == '+'), "endraw"))
				break;
		}
		if (q + 1 >= e) {
			if (raw)
				pfail(s, line, "{%% raw %%} without {%% endraw %%}");
			add_piece(s, P_TEXT, p, (size_t)(e - p), line);
			break;
		}
		text_before(s, p, q, line, line_starting);
		line += count_nl(p, q);
		char kind = q[1];
		const char *c = q + 2 + (q[2] == '-' || q[2] == '+');
		const char *ce = tag_end(c, e, kind == '{' ? '{' : kind);
		if (!ce)
			pfail(s, line, "unterminated %s", kind == '{' ? "{{" : kind == '%' ? "{%" : "{#");
		int rmod = ce > c && (ce[-1] == '-' || ce[-1] == '+') ? ce[-1] : 0;
		const char *cend = ce - (rmod != 0);
		if (kind == '%' && is_word_tag(c, cend, "raw"))
			raw = ce;
		else if (kind == '%' && raw)
			raw = NULL;
		else if (kind != '#')
			add_piece(s, kind == '{' ? P_VAR : P_STMT, c, (size_t)(cend - c), line);
		line += count_nl(q, ce + 2);
		p = ce + 2;
		const char *after = p;
		if (rmod == '-') {
			while (p < e && is_ws(*p))
				p++;
		} else if (kind != '{' && rmod != '+') {
			if (p < e && *p == '\n')
				p++;
			else if (p + 1 < e && p[0] == '\r' && p[1] == '\n')
				p += 2;
		}
		line += count_nl(after, p);
		line_starting = p > after && p[-1] == '\n';
	}
}

/* ---- expression tokens ------------------------------------------------------------- */

static void
next_tok(ps *s)
{
	while (s->p < s->e && is_ws(*s->p))
		s->line += *s->p++ == '\n';
	s->tline = s->line;
	s->tp = s->p;
	if (s->p >= s->e) {
		s->tk = T_END, s->tn = 0;
		return;
	}
	const char *p = s->p;
	if (isalpha((unsigned char)*p) || *p == '_') {
		while (p < s->e && (isalnum((unsigned char)*p) || *p == '_'))
			p++;
		s->tk = T_NAME;
	} else if (isdigit((unsigned char)*p)) {
		s->tk = T_INT;
		while (p < s->e && (isdigit((unsigned char)*p) || *p == '_'))
			p++;
		if (p + 1 < s->e && *p == '.' && isdigit((unsigned char)p[1])) {
			s->tk = T_FLOAT;
			for (p++; p < s->e && isdigit((unsigned char)*p); p++)
				;
		}
		if (p < s->e && (*p == 'e' || *p == 'E')) {
			const char *x = p + 1;
			if (x < s->e && (*x == '+' || *x == '-'))
				x++;
			if (x < s->e && isdigit((unsigned char)*x)) {
				s->tk = T_FLOAT;
				for (p = x; p < s->e && isdigit((unsigned char)*p); p++)
					;
			}
		}
	} else if (*p == '\'' || *p == '"') {
		char q = *p++;
		while (p < s->e && *p != q)
			p += (*p == '\\' && p + 1 < s->e) ? 2 : 1;
		if (p >= s->e)
			pfail(s, s->line, "unterminated string");
		p++;
		s->tk = T_STR;
	} else {
		static const char *two[] = { "==", "!=", "<=", ">=", "//", "**", NULL };
		s->tk = T_OP;
		p++;
		for (int i = 0; two[i]; i++)
			if (s->p + 1 < s->e && s->p[0] == two[i][0] && s->p[1] == two[i][1])
				p = s->p + 2;
		if (!strchr("+-*/%~()[]{}.,:|<>=!?", *s->p))
			pfail(s, s->line, "unexpected character '%c'", *s->p);
	}
	s->tn = (size_t)(p - s->p);
	s->line += count_nl(s->p, p);
	s->p = p;
}

static int
tok_is(ps *s, int k, const char *text)
{
	return s->tk == k && (!text || (s->tn == strlen(text) && memcmp(s->tp, text, s->tn) == 0));
}

static int
accept(ps *s, int k, const char *text)
{
	if (!tok_is(s, k, text))
		return 0;
	next_tok(s);
	return 1;
}

static void
expect(ps *s, int k, const char *text)
{
	if (!accept(s, k, text))
		pfail(s, s->tline, "expected '%s', got '%.*s'", text ? text : "a name", (int)s->tn, s->tp);
}

static const char *
tok_name(ps *s)
{
	if (s->tk != T_NAME)
		pfail(s, s->tline, "expected a name, got '%.*s'", (int)s->tn, s->tp);
	char *n = palloc(s, s->tn + 1);
	memcpy(n, s->tp, s->tn);
	next_tok(s);
	return n;
}

static node *
mk(ps *s, int k, int line)
{
	node *n = palloc(s, sizeof *n);
	n->k = k, n->line = line;
	return n;
}

/* A string literal's value: Python's escapes. */
static val
str_lit(ps *s)
{
	const char *p = s->tp + 1, *e = s->tp + s->tn - 1;
	char *o = palloc(s, s->tn * 2 + 1), *w = o;
	for (; p < e; p++) {
		if (*p != '\\' || p + 1 >= e) {
			*w++ = *p;
			continue;
		}
		char c = *++p;
		unsigned long u;
		switch (c) {
		case 'n': *w++ = '\n'; break;
		case 't': *w++ = '\t'; break;
		case 'r': *w++ = '\r'; break;
		case 'b': *w++ = '\b'; break;
		case 'f': *w++ = '\f'; break;
		case 'v': *w++ = '\v'; break;
		case 'a': *w++ = '\a'; break;
		case '0': *w++ = '\0'; break;
		case '\n': break;
		case 'x': case 'u': case 'U': {
			int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
			char hex[9] = { 0 };
			if (e - p - 1 < nd)
				pfail(s, s->tline, "bad \\%c escape", c);
			memcpy(hex, p + 1, (size_t)nd);
			u = strtoul(hex, NULL, 16);
			p += nd;
			if (u < 0x80) *w++ = (char)u;
			else if (u < 0x800) *w++ = (char)(0xC0 | u >> 6), *w++ = (char)(0x80 | (u & 63));
			else if (u < 0x10000) *w++ = (char)(0xE0 | u >> 12), *w++ = (char)(0x80 | ((u >> 6) & 63)), *w++ = (char)(0x80 | (u & 63));
			else *w++ = (char)(0xF0 | u >> 18), *w++ = (char)(0x80 | ((u >> 12) & 63)), *w++ = (char)(0x80 | ((u >> 6) & 63)), *w++ = (char)(0x80 | (u & 63));
			break;
		}
		case '\\': case '\'': case '"': *w++ = c; break;
		default: *w++ = '\\', *w++ = c; break;
		}
	}
	val v = { .t = V_STR };
	v.s.p = o, v.s.n = (size_t)(w - o);
	return v;
}

/* ---- expressions ------------------------------------------------------------------- */

static node *p_expr(ps *s, int cond);
static node *p_unary(ps *s);

static void
add_kid(ps *s, node *n, node *kid, const char *kw)
{
	if ((n->nk & (n->nk - 1)) == 0 || n->nk == 0) {
		int cap = n->nk ? 2 * n->nk : 4;
		node **kv = palloc(s, (size_t)cap * sizeof *kv);
		const char **kn = palloc(s, (size_t)cap * sizeof *kn);
		if (n->nk)
			memcpy(kv, n->kv, (size_t)n->nk * sizeof *kv), memcpy(kn, n->kn, (size_t)n->nk * sizeof *kn);
		n->kv = kv, n->kn = kn;
	}
	n->kv[n->nk] = kid;
	n->kn[n->nk++] = kw;
}

/* "(a, b, k=v)" after the "(" has been seen */
static void
p_args(ps *s, node *n)
{
	while (!accept(s, T_OP, ")")) {
		const char *kw = NULL;
		if (s->tk == T_NAME && s->p < s->e) {
			const char *q = s->p;
			while (q < s->e && is_ws(*q))
				q++;
			if (q < s->e && *q == '=' && (q + 1 >= s->e || q[1] != '=')) {
				kw = tok_name(s);
				expect(s, T_OP, "=");
			}
		}
		add_kid(s, n, p_expr(s, 1), kw);
		if (!accept(s, T_OP, ",")) {
			expect(s, T_OP, ")");
			break;
		}
	}
}

static node *
p_primary(ps *s)
{
	int line = s->tline;
	node *n;
	if (s->tk == T_STR) {
		n = mk(s, N_LIT, line);
		n->lit = str_lit(s);
		next_tok(s);
		while (s->tk == T_STR) { /* adjacent literals join */
			val b = str_lit(s);
			char *j = palloc(s, n->lit.s.n + b.s.n + 1);
			memcpy(j, n->lit.s.p, n->lit.s.n);
			memcpy(j + n->lit.s.n, b.s.p, b.s.n);
			n->lit.s.p = j, n->lit.s.n += b.s.n;
			next_tok(s);
		}
		return n;
	}
	if (s->tk == T_INT || s->tk == T_FLOAT) {
		char buf[64];
		size_t k = 0;
		for (size_t i = 0; i < s->tn && k < sizeof buf - 1; i++)
			if (s->tp[i] != '_')
				buf[k++] = s->tp[i];
		buf[k] = 0;
		n = mk(s, N_LIT, line);
		if (s->tk == T_INT)
			n->lit.t = V_INT, n->lit.i = strtoll(buf, NULL, 10);
		else
			n->lit.t = V_FLOAT, n->lit.f = strtod(buf, NULL);
		next_tok(s);
		return n;
	}
	if (s->tk == T_NAME) {
		const char *nm = tok_name(s);
		n = mk(s, N_LIT, line);
		if (!strcmp(nm, "true") || !strcmp(nm, "True"))
			n->lit.t = V_BOOL, n->lit.i = 1;
		else if (!strcmp(nm, "false") || !strcmp(nm, "False"))
			n->lit.t = V_BOOL, n->lit.i = 0;
		else if (!strcmp(nm, "none") || !strcmp(nm, "None"))
			n->lit.t = V_NONE;
		else
			n->k = N_NAME, n->s = nm;
		return n;
	}
	if (accept(s, T_OP, "(")) {
		if (accept(s, T_OP, ")"))
			return mk(s, N_TUPLE, line);
		node *e = p_expr(s, 1);
		if (!tok_is(s, T_OP, ",")) {
			expect(s, T_OP, ")");
			return e;
		}
		n = mk(s, N_TUPLE, line);
		add_kid(s, n, e, NULL);
		while (accept(s, T_OP, ",") && !tok_is(s, T_OP, ")"))
			add_kid(s, n, p_expr(s, 1), NULL);
		expect(s, T_OP, ")");
		return n;
	}
	if (accept(s, T_OP, "[")) {
		n = mk(s, N_LIST, line);
		while (!accept(s, T_OP, "]")) {
			add_kid(s, n, p_expr(s, 1), NULL);
			if (!accept(s, T_OP, ",")) {
				expect(s, T_OP, "]");
				break;
			}
		}
		return n;
	}
	if (accept(s, T_OP, "{")) {
		n = mk(s, N_DICT, line);
		while (!accept(s, T_OP, "}")) {
			add_kid(s, n, p_expr(s, 1), NULL);
			expect(s, T_OP, ":");
			add_kid(s, n, p_expr(s, 1), NULL);
			if (!accept(s, T_OP, ",")) {
				expect(s, T_OP, "}");
				break;
			}
		}
		return n;
	}
	if (s->tk == T_END)
		pfail(s, line, "an expression is missing at the end of the tag");
	pfail(s, line, "unexpected '%.*s'", (int)s->tn, s->tp);
	return NULL;
}

static node *
p_postfix(ps *s, node *n)
{
	for (;;) {
		int line = s->tline;
		if (accept(s, T_OP, ".")) {
			node *a = mk(s, N_ATTR, line);
			a->a = n;
			if (s->tk == T_INT) { /* x.0 is x[0] */
				a->k = N_ITEM;
				a->b = p_primary(s);
			} else {
				a->s = tok_name(s);
			}
			n = a;
		} else if (accept(s, T_OP, "[")) {
			node *parts[3] = { NULL, NULL, NULL };
			int np = 0;
			for (;;) {
				if (!tok_is(s, T_OP, ":") && !tok_is(s, T_OP, "]"))
					parts[np] = p_expr(s, 1);
				if (np < 2 && accept(s, T_OP, ":"))
					np++;
				else
					break;
			}
			expect(s, T_OP, "]");
			node *a = mk(s, np ? N_SLICE : N_ITEM, line);
			a->a = n, a->b = parts[0], a->c = parts[1], a->d = parts[2];
			if (!np && !a->b)
				pfail(s, line, "empty subscript");
			n = a;
		} else if (accept(s, T_OP, "(")) {
			node *a = mk(s, N_CALL, line);
			a->a = n;
			p_args(s, a);
			n = a;
		} else {
			return n;
		}
	}
}

/* filters and tests after a unary expression */
static node *
p_filters(ps *s, node *n)
{
	for (;;) {
		int line = s->tline;
		if (accept(s, T_OP, "|")) {
			node *f = mk(s, N_FILTER, line);
			f->a = n;
			f->s = tok_name(s);
			if (accept(s, T_OP, "("))
				p_args(s, f);
			n = p_postfix(s, f);
		} else if (accept(s, T_NAME, "is")) {
			node *t = mk(s, N_TEST, line);
			t->a = n;
			t->neg = accept(s, T_NAME, "not");
			t->s = tok_name(s);
			if (accept(s, T_OP, "("))
				p_args(s, t);
			else if (s->tk == T_STR || s->tk == T_INT || s->tk == T_FLOAT ||
			    (s->tk == T_NAME && !tok_is(s, T_NAME, "and") && !tok_is(s, T_NAME, "or") &&
			     !tok_is(s, T_NAME, "else") && !tok_is(s, T_NAME, "if") && !tok_is(s, T_NAME, "in")))
				add_kid(s, t, p_postfix(s, p_primary(s)), NULL);
			n = t;
		} else {
			return n;
		}
	}
}

static node *
p_unary1(ps *s, int filters)
{
	int line = s->tline;
	node *n;
	if (tok_is(s, T_OP, "-") || tok_is(s, T_OP, "+")) {
		n = mk(s, *s->tp == '-' ? N_NEG : N_POS, line);
		next_tok(s);
		n->a = p_unary1(s, 0);
	} else {
		n = p_primary(s);
	}
	n = p_postfix(s, n);
	return filters ? p_filters(s, n) : n;
}

static node *
p_unary(ps *s)
{
	return p_unary1(s, 1);
}

static node *
bin(ps *s, int op, node *a, node *b, int line)
{
	node *n = mk(s, N_BIN, line);
	n->op = op, n->a = a, n->b = b;
	return n;
}

static node *
p_pow(ps *s)
{
	node *n = p_unary(s);
	while (tok_is(s, T_OP, "**")) {
		int line = s->tline;
		next_tok(s);
		n = bin(s, 'P', n, p_unary(s), line);
	}
	return n;
}

static node *
p_math2(ps *s)
{
	node *n = p_pow(s);
	for (;;) {
		int line = s->tline, op;
		if (tok_is(s, T_OP, "*")) op = '*';
		else if (tok_is(s, T_OP, "/")) op = '/';
		else if (tok_is(s, T_OP, "//")) op = 'F';
		else if (tok_is(s, T_OP, "%")) op = '%';
		else return n;
		next_tok(s);
		n = bin(s, op, n, p_pow(s), line);
	}
}

static node *
p_concat(ps *s)
{
	node *n = p_math2(s);
	if (!tok_is(s, T_OP, "~"))
		return n;
	node *c = mk(s, N_CONCAT, s->tline);
	add_kid(s, c, n, NULL);
	while (accept(s, T_OP, "~"))
		add_kid(s, c, p_math2(s), NULL);
	return c;
}

static node *
p_math1(ps *s)
{
	node *n = p_concat(s);
	for (;;) {
		int line = s->tline, op;
		if (tok_is(s, T_OP, "+")) op = '+';
		else if (tok_is(s, T_OP, "-")) op = '-';
		else return n;
		next_tok(s);
		n = bin(s, op, n, p_concat(s), line);
	}
}

static node *
p_compare(ps *s)
{
	node *n = p_math1(s);
	for (;;) {
		int line = s->tline, op;
		if (tok_is(s, T_OP, "==")) op = 'e';
		else if (tok_is(s, T_OP, "!=")) op = 'n';
		else if (tok_is(s, T_OP, "<")) op = '<';
		else if (tok_is(s, T_OP, ">")) op = '>';
		else if (tok_is(s, T_OP, "<=")) op = 'l';
		else if (tok_is(s, T_OP, ">=")) op = 'g';
		else if (tok_is(s, T_NAME, "in")) op = 'i';
		else if (tok_is(s, T_NAME, "not")) {
			const char *q = s->p;
			while (q < s->e && is_ws(*q))
				q++;
			if (!(s->e - q >= 2 && q[0] == 'i' && q[1] == 'n' && (s->e - q == 2 || !isalnum((unsigned char)q[2]))))
				return n;
			next_tok(s);
			op = 'I';
		} else
			return n;
		next_tok(s);
		node *c = mk(s, N_CMP, line);
		c->op = op, c->a = n, c->b = p_math1(s);
		n = c;
	}
}

static node *
p_not(ps *s)
{
	int line = s->tline;
	if (accept(s, T_NAME, "not")) {
		node *n = mk(s, N_NOT, line);
		n->a = p_not(s);
		return n;
	}
	return p_compare(s);
}

static node *
p_and(ps *s)
{
	node *n = p_not(s);
	while (tok_is(s, T_NAME, "and")) {
		node *a = mk(s, N_AND, s->tline);
		next_tok(s);
		a->a = n, a->b = p_not(s);
		n = a;
	}
	return n;
}

static node *
p_or(ps *s)
{
	node *n = p_and(s);
	while (tok_is(s, T_NAME, "or")) {
		node *a = mk(s, N_OR, s->tline);
		next_tok(s);
		a->a = n, a->b = p_and(s);
		n = a;
	}
	return n;
}

/* COND: allow "x if c else y" (a for loop's iterable does not: its "if" filters) */
static node *
p_expr(ps *s, int cond)
{
	node *n = p_or(s);
	while (cond && tok_is(s, T_NAME, "if")) {
		node *c = mk(s, N_COND, s->tline);
		next_tok(s);
		c->a = n;
		c->b = p_or(s);
		if (accept(s, T_NAME, "else"))
			c->c = p_expr(s, 1);
		n = c;
	}
	return n;
}

/* an expression, or a tuple of them without parentheses */
static node *
p_tuple(ps *s, int cond)
{
	int line = s->tline;
	node *n = p_expr(s, cond);
	if (!tok_is(s, T_OP, ","))
		return n;
	node *t = mk(s, N_TUPLE, line);
	add_kid(s, t, n, NULL);
	while (accept(s, T_OP, ",") && s->tk != T_END && !tok_is(s, T_NAME, "if"))
		add_kid(s, t, p_expr(s, cond), NULL);
	return t;
}

/* ---- statements -------------------------------------------------------------------- */

static void
start_piece(ps *s, const piece *pc)
{
	s->p = pc->p, s->e = pc->p + pc->n, s->line = pc->line;
	next_tok(s);
}

static void
expect_end(ps *s)
{
	if (s->tk != T_END)
		pfail(s, s->tline, "unexpected '%.*s' at the end of the tag", (int)s->tn, s->tp);
}

static void
p_names(ps *s, node *n)
{
	do {
		const char **nm = palloc(s, (size_t)(n->nnames + 1) * sizeof *nm);
		if (n->nnames)
			memcpy(nm, n->names, (size_t)n->nnames * sizeof *nm);
		nm[n->nnames++] = tok_name(s);
		n->names = nm;
	} while (accept(s, T_OP, ","));
}

static node *p_body(ps *s, const char *const *stops, const char **stop, int line0);

static const char *const STOP_IF[] = { "elif", "else", "endif", NULL };
static const char *const STOP_FOR[] = { "else", "endfor", NULL };
static const char *const STOP_ENDFOR[] = { "endfor", NULL };

static node *
p_if(ps *s, int line)
{
	node *n = mk(s, N_IF, line);
	const char *stop;
	n->a = p_tuple(s, 1);
	expect_end(s);
	n->b = p_body(s, STOP_IF, &stop, line);
	if (!strcmp(stop, "elif")) {
		n->c = p_if(s, s->tline);
	} else if (!strcmp(stop, "else")) {
		static const char *const e[] = { "endif", NULL };
		expect_end(s);
		n->c = p_body(s, e, &stop, line);
		expect_end(s);
	} else {
		expect_end(s);
	}
	return n;
}

static node *
p_for(ps *s, int line)
{
	node *n = mk(s, N_FOR, line);
	const char *stop;
	p_names(s, n);
	expect(s, T_NAME, "in");
	n->a = p_tuple(s, 0);
	if (accept(s, T_NAME, "if"))
		n->d = p_expr(s, 0);
	if (tok_is(s, T_NAME, "recursive"))
		pfail(s, s->tline, "recursive loops are not supported");
	expect_end(s);
	n->b = p_body(s, STOP_FOR, &stop, line);
	expect_end(s);
	if (!strcmp(stop, "else")) {
		n->c = p_body(s, STOP_ENDFOR, &stop, line);
		expect_end(s);
	}
	return n;
}

static node *
p_set(ps *s, int line)
{
	node *n = mk(s, N_SET, line);
	const char *stop;
	p_names(s, n);
	if (n->nnames == 1 && accept(s, T_OP, ".")) {
		n->k = N_SETATTR;
		n->s = tok_name(s);
	}
	if (accept(s, T_OP, "=")) {
		n->a = p_tuple(s, 1);
		expect_end(s);
		return n;
	}
	if (n->k != N_SET || n->nnames != 1)
		pfail(s, line, "a {%% set %%} block takes one name");
	static const char *const e[] = { "endset", NULL };
	expect_end(s);
	n->k = N_SETBLOCK;
	n->b = p_body(s, e, &stop, line);
	expect_end(s);
	return n;
}

static node *
p_macro(ps *s, int line)
{
	node *n = mk(s, N_MACRO, line);
	const char *stop;
	n->s = tok_name(s);
	expect(s, T_OP, "(");
	while (!accept(s, T_OP, ")")) {
		const char **nm = palloc(s, (size_t)(n->nnames + 1) * sizeof *nm);
		if (n->nnames)
			memcpy(nm, n->names, (size_t)n->nnames * sizeof *nm);
		nm[n->nnames] = tok_name(s);
		n->names = nm;
		/* defaults ride in kv, one per parameter (NULL: none) */
		add_kid(s, n, accept(s, T_OP, "=") ? p_expr(s, 1) : NULL, NULL);
		n->nnames++;
		if (!accept(s, T_OP, ",")) {
			expect(s, T_OP, ")");
			break;
		}
	}
	expect_end(s);
	static const char *const e[] = { "endmacro", NULL };
	n->b = p_body(s, e, &stop, line);
	expect_end(s);
	return n;
}

static node *
p_stmt(ps *s, const piece *pc)
{
	int line = s->tline;
	if (accept(s, T_NAME, "if"))
		return p_if(s, line);
	if (accept(s, T_NAME, "for"))
		return p_for(s, line);
	if (accept(s, T_NAME, "set"))
		return p_set(s, line);
	if (accept(s, T_NAME, "macro"))
		return p_macro(s, line);
	if (accept(s, T_NAME, "break") || accept(s, T_NAME, "continue")) {
		node *n = mk(s, is_word_tag(pc->p, pc->p + pc->n, "break") ? N_BREAK : N_CONTINUE, line);
		expect_end(s);
		return n;
	}
	if (accept(s, T_NAME, "generation")) {
		/* transformers' AssistantTracker tag: rendered as its body */
		static const char *const e[] = { "endgeneration", NULL };
		const char *stop;
		node *n = mk(s, N_BLOCK, line);
		expect_end(s);
		n->b = p_body(s, e, &stop, line);
		expect_end(s);
		return n;
	}
	pfail(s, line, "unknown or unsupported tag '%.*s'", (int)s->tn, s->tp);
	return NULL;
}

/* Statements up to one of STOPS (NULL: the end of the template); *stop gets
 * the word, and the tokenizer is left after it. */
static node *
p_body(ps *s, const char *const *stops, const char **stop, int line0)
{
	node *head = NULL, **tail = &head;
	while (s->ip < s->np) {
		const piece *pc = &s->pc[s->ip++];
		node *n;
		if (pc->k == P_TEXT) {
			n = mk(s, N_TEXT, pc->line);
			n->s = pc->p, n->n = pc->n;
		} else if (pc->k == P_VAR) {
			start_piece(s, pc);
			n = mk(s, N_OUT, pc->line);
			n->a = p_tuple(s, 1);
			expect_end(s);
		} else {
			start_piece(s, pc);
			for (int i = 0; stops && stops[i]; i++)
				if (tok_is(s, T_NAME, stops[i])) {
					*stop = stops[i];
					next_tok(s);
					return head;
				}
			n = p_stmt(s, pc);
		}
		*tail = n;
		tail = &n->next;
	}
	if (stops) {
		int last = 0;
		while (stops[last + 1])
			last++;
		pfail(s, line0, "missing {%% %s %%} for the tag on this line", stops[last]);
	}
	return head;
}

int
rl_jinja_parse(rl_jinja **out, const char *src, size_t len, const char *name)
{
	return rl_jinja_parse_msg(out, src, len, name, NULL, 0);
}

int
rl_jinja_parse_msg(rl_jinja **out, const char *src, size_t len, const char *name, char *err, size_t errlen)
{
	*out = NULL;
	if (err && errlen)
		err[0] = 0;
	rl_jinja *t = calloc(1, sizeof *t);
	if (!t)
		return RL_ENOMEM;
	t->a.max = (size_t)1 << 30;
	t->name = strdup(name ? name : "template");
	ps *s = calloc(1, sizeof *s);
	if (!s || !t->name) {
		free(s);
		rl_jinja_free(t);
		return RL_ENOMEM;
	}
	s->a = &t->a;
	s->name = t->name;
	s->err = errlen ? err : NULL;
	s->errlen = errlen;
	if (setjmp(s->jb)) {
		int rv = s->rv;
		free(s);
		rl_jinja_free(t);
		return rv;
	}
	scan(s, src, len);
	t->body = p_body(s, NULL, NULL, 1);
	free(s);
	*out = t;
	return RL_OK;
}

void
rl_jinja_free(rl_jinja *t)
{
	if (!t)
		return;
	arena_free(&t->a);
	free(t->name);
	free(t);
}

/* ---- renderer: state, errors, allocation ------------------------------------------- */

typedef struct var {
	const char *name;
	val v;
	struct var *next;
} var;

typedef struct frame {
	struct frame *up;
	var *vars;
} frame;

typedef struct sbuf {
	char *p;
	size_t n, cap;
} sbuf;

typedef struct rs {
	arena a;
	jmp_buf jb;
	int rv;
	const char *name;
	const cJSON *ctx;
	frame *root;
	sbuf *out;
	size_t max_out, max_iter, iters;
	int max_depth, depth;
	int line; /* of the statement being run, for messages */
	time_t now;
} rs;

enum { FLOW_BREAK = -1, FLOW_CONTINUE = -2 };

static void rfail(rs *r, int rv, int line, const char *fmt, ...) RL_PRINTF(4, 5);
static void
rfail(rs *r, int rv, int line, const char *fmt, ...)
{
	char m[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	rl_error("'%s': line %d: %s", r->name, line ? line : r->line, m);
	r->rv = rv;
	longjmp(r->jb, 1);
}

static void *
ralloc(rs *r, size_t n)
{
	void *p = arena_get(&r->a, n ? n : 1);
	if (!p) {
		rl_error("'%s': the render needs more than %zu MiB of memory", r->name, r->a.max >> 20);
		r->rv = r->a.total + n > r->a.max ? RL_ETOOBIG : RL_ENOMEM;
		longjmp(r->jb, 1);
	}
	return p;
}

static void
sb_add(rs *r, sbuf *b, const char *p, size_t n, int line)
{
	if (b->n + n > r->max_out)
		rfail(r, RL_ETOOBIG, line, "the output would pass %zu bytes (the cap)", r->max_out);
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *q = ralloc(r, cap);
		if (b->n)
			memcpy(q, b->p, b->n);
		b->p = q, b->cap = cap;
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void
sb_puts(rs *r, sbuf *b, const char *p)
{
	sb_add(r, b, p, strlen(p), 0);
}

static val
mkstr(rs *r, const char *p, size_t n)
{
	char *q = ralloc(r, n + 1);
	memcpy(q, p, n);
	q[n] = 0;
	val v = { .t = V_STR };
	v.s.p = q, v.s.n = n;
	return v;
}

static val
sbval(sbuf *b)
{
	val v = { .t = V_STR };
	v.s.p = b->p ? b->p : "", v.s.n = b->n;
	return v;
}

static val vint(int64_t i) { val v = { .t = V_INT }; v.i = i; return v; }
static val vbool(int b) { val v = { .t = V_BOOL }; v.i = b != 0; return v; }
static val vnone(void) { val v = { .t = V_NONE }; return v; }
static val vundef(const char *name) { val v = { .t = V_UNDEF }; v.s.p = name, v.s.n = 0; return v; }

static list *
newlist(rs *r, size_t cap)
{
	list *l = ralloc(r, sizeof *l);
	l->n = 0, l->cap = cap ? cap : 4;
	l->v = ralloc(r, l->cap * sizeof *l->v);
	return l;
}

static void
lpush(rs *r, list *l, val v)
{
	if (l->n == l->cap) {
		val *nv = ralloc(r, 2 * l->cap * sizeof *nv);
		memcpy(nv, l->v, l->n * sizeof *nv);
		l->v = nv, l->cap *= 2;
	}
	l->v[l->n++] = v;
}

static val
vlist(list *l, int tuple)
{
	val v = { .t = V_LIST, .flag = tuple };
	v.l = l;
	return v;
}

static dict *
newdict(rs *r)
{
	dict *d = ralloc(r, sizeof *d);
	d->n = 0, d->cap = 4;
	d->k = ralloc(r, 4 * sizeof *d->k);
	d->v = ralloc(r, 4 * sizeof *d->v);
	return d;
}

static val *
dget(const dict *d, const char *k, size_t n)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].s.n == n && memcmp(d->k[i].s.p, k, n) == 0)
			return &d->v[i];
	return NULL;
}

static void
dset(rs *r, dict *d, val k, val v)
{
	val *o = dget(d, k.s.p, k.s.n);
	if (o) {
		*o = v;
		return;
	}
	if (d->n == d->cap) {
		val *nk = ralloc(r, 2 * d->cap * sizeof *nk), *nv = ralloc(r, 2 * d->cap * sizeof *nv);
		memcpy(nk, d->k, d->n * sizeof *nk);
		memcpy(nv, d->v, d->n * sizeof *nv);
		d->k = nk, d->v = nv, d->cap *= 2;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
}

static val
from_json(rs *r, const cJSON *j)
{
	val v = { 0 };
	if (cJSON_IsNull(j)) {
		v.t = V_NONE;
	} else if (cJSON_IsBool(j)) {
		v = vbool(cJSON_IsTrue(j));
	} else if (cJSON_IsNumber(j)) {
		double f = j->valuedouble;
		if (f == floor(f) && fabs(f) < 9e15)
			v = vint((int64_t)f);
		else
			v.t = V_FLOAT, v.f = f;
	} else if (cJSON_IsString(j)) {
		v = mkstr(r, j->valuestring, strlen(j->valuestring));
	} else if (cJSON_IsArray(j)) {
		list *l = newlist(r, (size_t)cJSON_GetArraySize(j));
		for (const cJSON *c = j->child; c; c = c->next)
			lpush(r, l, from_json(r, c));
		v = vlist(l, 0);
	} else if (cJSON_IsObject(j)) {
		dict *d = newdict(r);
		for (const cJSON *c = j->child; c; c = c->next)
			dset(r, d, mkstr(r, c->string, strlen(c->string)), from_json(r, c));
		v.t = V_DICT, v.d = d;
	}
	return v;
}

/* ---- Python's str(), repr() and json.dumps ------------------------------------------ */

static void
fmt_float(char *b, size_t bn, double f)
{
	if (isnan(f)) { snprintf(b, bn, "nan"); return; }
	if (isinf(f)) { snprintf(b, bn, f < 0 ? "-inf" : "inf"); return; }
	char e[40];
	int prec;
	for (prec = 1; prec <= 17; prec++) {
		snprintf(e, sizeof e, "%.*e", prec - 1, f);
		if (strtod(e, NULL) == f)
			break;
	}
	/* e: [-]d[.ddd]e[+-]XX */
	char dig[24];
	int nd = 0, neg = e[0] == '-';
	const char *p = e + neg;
	for (; *p && *p != 'e'; p++)
		if (isdigit((unsigned char)*p))
			dig[nd++] = *p;
	int ex = atoi(p + 1);
	while (nd > 1 && dig[nd - 1] == '0')
		nd--;
	char *w = b;
	if (neg) *w++ = '-';
	if (ex >= -4 && ex < 16) {
		if (ex < 0) {
			*w++ = '0', *w++ = '.';
			for (int i = 0; i < -ex - 1; i++) *w++ = '0';
			for (int i = 0; i < nd; i++) *w++ = dig[i];
		} else {
			for (int i = 0; i <= ex; i++) *w++ = i < nd ? dig[i] : '0';
			*w++ = '.';
			if (nd > ex + 1)
				for (int i = ex + 1; i < nd; i++) *w++ = dig[i];
			else
				*w++ = '0';
		}
		*w = 0;
	} else {
		*w++ = dig[0];
		if (nd > 1) {
			*w++ = '.';
			for (int i = 1; i < nd; i++) *w++ = dig[i];
		}
		snprintf(w, bn - (size_t)(w - b), "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
	}
}

static void to_str(rs *r, sbuf *b, val v, int repr);

static void
repr_str(rs *r, sbuf *b, const char *p, size_t n)
{
	int sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
	char q = sq && !dq ? '"' : '\'';
	sb_add(r, b, &q, 1, 0);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		char e[8];
		if (c == '\\' || c == (unsigned char)q) { e[0] = '\\', e[1] = (char)c, e[2] = 0; }
		else if (c == '\n') strcpy(e, "\\n");
		else if (c == '\r') strcpy(e, "\\r");
		else if (c == '\t') strcpy(e, "\\t");
		else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
		else { e[0] = (char)c, e[1] = 0; }
		sb_puts(r, b, e);
	}
	sb_add(r, b, &q, 1, 0);
}

static void
to_str(rs *r, sbuf *b, val v, int repr)
{
	char n[48];
	switch (v.t) {
	case V_UNDEF: if (repr) sb_puts(r, b, "Undefined"); return;
	case V_NONE: sb_puts(r, b, "None"); return;
	case V_BOOL: sb_puts(r, b, v.i ? "True" : "False"); return;
	case V_INT: snprintf(n, sizeof n, "%lld", (long long)v.i); sb_puts(r, b, n); return;
	case V_FLOAT: fmt_float(n, sizeof n, v.f); sb_puts(r, b, n); return;
	case V_STR:
		if (repr) repr_str(r, b, v.s.p, v.s.n);
		else sb_add(r, b, v.s.p, v.s.n, 0);
		return;
	case V_LIST:
		sb_puts(r, b, v.flag ? "(" : "[");
		for (size_t i = 0; i < v.l->n; i++) {
			if (i) sb_puts(r, b, ", ");
			to_str(r, b, v.l->v[i], 1);
		}
		sb_puts(r, b, v.flag && v.l->n == 1 ? ",)" : v.flag ? ")" : "]");
		return;
	case V_DICT:
		if (v.flag) { sb_puts(r, b, "<Namespace>"); return; }
		sb_puts(r, b, "{");
		for (size_t i = 0; i < v.d->n; i++) {
			if (i) sb_puts(r, b, ", ");
			to_str(r, b, v.d->k[i], 1);
			sb_puts(r, b, ": ");
			to_str(r, b, v.d->v[i], 1);
		}
		sb_puts(r, b, "}");
		return;
	default: sb_puts(r, b, "<function>"); return;
	}
}

typedef struct jopt {
	int ascii, indent, sort;
	const char *item_sep, *key_sep;
} jopt;

static void
json_str(rs *r, sbuf *b, const char *p, size_t n, int ascii)
{
	sb_puts(r, b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		char e[16];
		if (c == '"') strcpy(e, "\\\"");
		else if (c == '\\') strcpy(e, "\\\\");
		else if (c == '\n') strcpy(e, "\\n");
		else if (c == '\r') strcpy(e, "\\r");
		else if (c == '\t') strcpy(e, "\\t");
		else if (c == '\b') strcpy(e, "\\b");
		else if (c == '\f') strcpy(e, "\\f");
		else if (c < 0x20 || (ascii && c == 0x7f)) snprintf(e, sizeof e, "\\u%04x", c);
		else if (ascii && c >= 0x80) {
			unsigned u = 0;
			int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
			u = c & (0x3F >> k);
			for (int j = 0; j < k && i + 1 < n; j++)
				u = u << 6 | ((unsigned char)p[++i] & 0x3F);
			if (u >= 0x10000) {
				u -= 0x10000;
				snprintf(e, sizeof e, "\\ud%03x\\ud%03x", 0x800 | (u >> 10), 0xC00 | (u & 0x3FF));
			} else {
				snprintf(e, sizeof e, "\\u%04x", u);
			}
		} else { e[0] = (char)c, e[1] = 0; }
		sb_puts(r, b, e);
	}
	sb_puts(r, b, "\"");
}

static int
key_cmp(const void *a, const void *b)
{
	const val *x = *(val *const *)a, *y = *(val *const *)b;
	size_t n = x->s.n < y->s.n ? x->s.n : y->s.n;
	int c = memcmp(x->s.p, y->s.p, n);
	return c ? c : (x->s.n > y->s.n) - (x->s.n < y->s.n);
}

static void
json_nl(rs *r, sbuf *b, const jopt *o, int depth)
{
	sb_puts(r, b, "\n");
	for (int i = 0; i < o->indent * depth; i++)
		sb_puts(r, b, " ");
}

static void
to_json(rs *r, sbuf *b, val v, const jopt *o, int depth, int line)
{
	char n[48];
	if (depth > 200)
		rfail(r, RL_ETOOBIG, line, "tojson: nesting deeper than 200");
	switch (v.t) {
	case V_NONE: sb_puts(r, b, "null"); return;
	case V_BOOL: sb_puts(r, b, v.i ? "true" : "false"); return;
	case V_INT: snprintf(n, sizeof n, "%lld", (long long)v.i); sb_puts(r, b, n); return;
	case V_FLOAT:
		if (isnan(v.f)) sb_puts(r, b, "NaN");
		else if (isinf(v.f)) sb_puts(r, b, v.f < 0 ? "-Infinity" : "Infinity");
		else { fmt_float(n, sizeof n, v.f); sb_puts(r, b, n); }
		return;
	case V_STR: json_str(r, b, v.s.p, v.s.n, o->ascii); return;
	case V_LIST:
		if (!v.l->n) { sb_puts(r, b, "[]"); return; }
		sb_puts(r, b, "[");
		for (size_t i = 0; i < v.l->n; i++) {
			if (i) sb_puts(r, b, o->item_sep);
			if (o->indent >= 0) json_nl(r, b, o, depth + 1);
			to_json(r, b, v.l->v[i], o, depth + 1, line);
		}
		if (o->indent >= 0) json_nl(r, b, o, depth);
		sb_puts(r, b, "]");
		return;
	case V_DICT: {
		if (!v.d->n) { sb_puts(r, b, "{}"); return; }
		val **ks = ralloc(r, v.d->n * sizeof *ks);
		for (size_t i = 0; i < v.d->n; i++)
			ks[i] = &v.d->k[i];
		if (o->sort)
			qsort(ks, v.d->n, sizeof *ks, key_cmp);
		sb_puts(r, b, "{");
		for (size_t i = 0; i < v.d->n; i++) {
			if (i) sb_puts(r, b, o->item_sep);
			if (o->indent >= 0) json_nl(r, b, o, depth + 1);
			json_str(r, b, ks[i]->s.p, ks[i]->s.n, o->ascii);
			sb_puts(r, b, o->key_sep);
			to_json(r, b, v.d->v[ks[i] - v.d->k], o, depth + 1, line);
		}
		if (o->indent >= 0) json_nl(r, b, o, depth);
		sb_puts(r, b, "}");
		return;
	}
	default:
		rfail(r, RL_EINVAL, line, "tojson: %s is not JSON serializable",
		    v.t == V_UNDEF ? "an undefined value" : "a function");
	}
}

/* ---- value semantics --------------------------------------------------------------- */

static const char *
tname(val v)
{
	static const char *n[] = { "undefined", "none", "bool", "int", "float", "string", "list", "dict", "macro",
				   "function", "loop" };
	return v.t == V_LIST && v.flag ? "tuple" : v.t == V_DICT && v.flag ? "namespace" : n[v.t];
}

static int
truthy(val v)
{
	switch (v.t) {
	case V_UNDEF: case V_NONE: return 0;
	case V_BOOL: case V_INT: return v.i != 0;
	case V_FLOAT: return v.f != 0;
	case V_STR: return v.s.n != 0;
	case V_LIST: return v.l->n != 0;
	case V_DICT: return v.flag || v.d->n != 0;
	default: return 1;
	}
}

static int isnum(val v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num(val v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

static int
veq(val a, val b)
{
	if (isnum(a) && isnum(b))
		return a.t == V_FLOAT || b.t == V_FLOAT ? num(a) == num(b) : a.i == b.i;
	if (a.t != b.t)
		return 0;
	switch (a.t) {
	case V_UNDEF: case V_NONE: return 1;
	case V_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
	case V_LIST:
		if (a.l->n != b.l->n) return 0;
		for (size_t i = 0; i < a.l->n; i++)
			if (!veq(a.l->v[i], b.l->v[i])) return 0;
		return 1;
	case V_DICT:
		if (a.d == b.d) return 1;
		if (a.flag || b.flag || a.d->n != b.d->n) return 0;
		for (size_t i = 0; i < a.d->n; i++) {
			val *o = dget(b.d, a.d->k[i].s.p, a.d->k[i].s.n);
			if (!o || !veq(a.d->v[i], *o)) return 0;
		}
		return 1;
	default: return a.m == b.m && a.i == b.i;
	}
}

static int
vcmp(rs *r, val a, val b, int line)
{
	if (isnum(a) && isnum(b)) {
		double x = num(a), y = num(b);
		if (a.t != V_FLOAT && b.t != V_FLOAT)
			return (a.i > b.i) - (a.i < b.i);
		return (x > y) - (x < y);
	}
	if (a.t == V_STR && b.t == V_STR) {
		size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
		int c = memcmp(a.s.p, b.s.p, n);
		return c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
	}
	rfail(r, RL_EINVAL, line, "cannot order %s and %s", tname(a), tname(b));
	return 0;
}

/* UTF-8 code points: Python indexes strings by them */
static size_t
u8len(const char *p, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)p[i] & 0xC0) != 0x80;
	return k;
}

static size_t
u8off(const char *p, size_t n, size_t cp)
{
	size_t i = 0;
	for (; i < n && cp; cp--)
		for (i++; i < n && ((unsigned char)p[i] & 0xC0) == 0x80; i++)
			;
	return i;
}

static size_t
vlen(rs *r, val v, int line)
{
	switch (v.t) {
	case V_UNDEF: return 0;
	case V_STR: return u8len(v.s.p, v.s.n);
	case V_LIST: return v.l->n;
	case V_DICT: return v.d->n;
	default: rfail(r, RL_EINVAL, line, "object of type %s has no length", tname(v));
	}
	return 0;
}

/* Iterate: a list of the items (strings give characters, dicts keys). */
static list *
iter_list(rs *r, val v, int line)
{
	list *l;
	switch (v.t) {
	case V_UNDEF: return newlist(r, 1);
	case V_LIST: return v.l;
	case V_DICT:
		if (v.flag) break;
		l = newlist(r, v.d->n);
		for (size_t i = 0; i < v.d->n; i++)
			lpush(r, l, v.d->k[i]);
		return l;
	case V_STR:
		l = newlist(r, v.s.n);
		for (size_t i = 0; i < v.s.n;) {
			size_t j = i + 1;
			while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xC0) == 0x80)
				j++;
			lpush(r, l, mkstr(r, v.s.p + i, j - i));
			i = j;
		}
		return l;
	default: break;
	}
	rfail(r, RL_EINVAL, line, "%s is not iterable", tname(v));
	return NULL;
}

static val
getitem(rs *r, val o, val k, int line)
{
	if (o.t == V_DICT && !o.flag) {
		if (k.t != V_STR)
			return vundef(NULL);
		val *x = dget(o.d, k.s.p, k.s.n);
		return x ? *x : vundef(NULL);
	}
	if ((o.t == V_LIST || o.t == V_STR) && (k.t == V_INT || k.t == V_BOOL)) {
		int64_t n = (int64_t)vlen(r, o, line), i = k.i < 0 ? k.i + n : k.i;
		if (i < 0 || i >= n)
			return vundef(NULL);
		if (o.t == V_LIST)
			return o.l->v[i];
		size_t a = u8off(o.s.p, o.s.n, (size_t)i), b = u8off(o.s.p, o.s.n, (size_t)i + 1);
		return mkstr(r, o.s.p + a, b - a);
	}
	if (o.t == V_UNDEF)
		rfail(r, RL_EINVAL, line, "'%s' is undefined", o.s.p ? o.s.p : "value");
	return vundef(NULL);
}

static val
getattr(rs *r, val o, const char *name, int line)
{
	if (name[0] == '_')
		rfail(r, RL_EINVAL, line, "access to attribute '%s' of a %s is refused (only data keys and the "
		    "documented methods are readable)", name, tname(o));
	if (o.t == V_DICT) {
		val *x = dget(o.d, name, strlen(name));
		return x ? *x : vundef(NULL);
	}
	if (o.t == V_LOOP) {
		size_t i = o.lp->i, n = o.lp->items->n;
		if (!strcmp(name, "index")) return vint((int64_t)i + 1);
		if (!strcmp(name, "index0")) return vint((int64_t)i);
		if (!strcmp(name, "revindex")) return vint((int64_t)(n - i));
		if (!strcmp(name, "revindex0")) return vint((int64_t)(n - i - 1));
		if (!strcmp(name, "first")) return vbool(i == 0);
		if (!strcmp(name, "last")) return vbool(i + 1 == n);
		if (!strcmp(name, "length")) return vint((int64_t)n);
		if (!strcmp(name, "previtem")) return i ? o.lp->items->v[i - 1] : vundef(NULL);
		if (!strcmp(name, "nextitem")) return i + 1 < n ? o.lp->items->v[i + 1] : vundef(NULL);
		return vundef(NULL);
	}
	if (o.t == V_UNDEF)
		rfail(r, RL_EINVAL, line, "'%s' is undefined (reading its attribute '%s')", o.s.p ? o.s.p : "value",
		    name);
	return vundef(NULL);
}

static int64_t
clampi(int64_t i, int64_t n, int step)
{
	if (i < 0) {
		i += n;
		if (i < 0) i = step < 0 ? -1 : 0;
	} else if (i >= n) {
		i = step < 0 ? n - 1 : n;
	}
	return i;
}

static val
slice(rs *r, val o, val a, val b, val c, int line)
{
	int64_t step = c.t == V_INT ? c.i : 1;
	if (step == 0)
		rfail(r, RL_EINVAL, line, "slice step cannot be zero");
	int64_t n = (int64_t)vlen(r, o, line);
	int64_t lo = a.t == V_INT ? clampi(a.i, n, (int)step) : step < 0 ? n - 1 : 0;
	int64_t hi = b.t == V_INT ? clampi(b.i, n, (int)step) : step < 0 ? -1 : n;
	list *items = o.t == V_LIST ? o.l : iter_list(r, o, line);
	list *out = newlist(r, 4);
	for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
		lpush(r, out, items->v[i]);
	if (o.t == V_LIST)
		return vlist(out, o.flag);
	sbuf s = { 0 };
	for (size_t i = 0; i < out->n; i++)
		sb_add(r, &s, out->v[i].s.p, out->v[i].s.n, line);
	return s.p ? sbval(&s) : mkstr(r, "", 0);
}

static val
arith(rs *r, int op, val a, val b, int line)
{
	if (op == '+' && a.t == V_STR && b.t == V_STR) {
		sbuf s = { 0 };
		sb_add(r, &s, a.s.p, a.s.n, line);
		sb_add(r, &s, b.s.p, b.s.n, line);
		return s.p ? sbval(&s) : mkstr(r, "", 0);
	}
	if (op == '+' && a.t == V_LIST && b.t == V_LIST) {
		list *l = newlist(r, a.l->n + b.l->n);
		for (size_t i = 0; i < a.l->n; i++) lpush(r, l, a.l->v[i]);
		for (size_t i = 0; i < b.l->n; i++) lpush(r, l, b.l->v[i]);
		return vlist(l, a.flag);
	}
	if (op == '*' && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
		val s = a.t == V_STR ? a : b;
		int64_t k = a.t == V_INT ? a.i : b.i;
		sbuf o = { 0 };
		for (int64_t i = 0; i < k; i++)
			sb_add(r, &o, s.s.p, s.s.n, line);
		return o.p ? sbval(&o) : mkstr(r, "", 0);
	}
	if (!isnum(a) || !isnum(b))
		rfail(r, RL_EINVAL, line, "unsupported operand types for '%s': %s and %s",
		    op == 'F' ? "//" : op == 'P' ? "**" : (char[]){ (char)op, 0 }, tname(a), tname(b));
	int fl = a.t == V_FLOAT || b.t == V_FLOAT;
	double x = num(a), y = num(b);
	val v = { .t = V_FLOAT };
	if ((op == '/' || op == 'F' || op == '%') && y == 0)
		rfail(r, RL_EINVAL, line, "division by zero");
	switch (op) {
	case '+': if (!fl) return vint(a.i + b.i); v.f = x + y; break;
	case '-': if (!fl) return vint(a.i - b.i); v.f = x - y; break;
	case '*': if (!fl) return vint(a.i * b.i); v.f = x * y; break;
	case '/': v.f = x / y; break;
	case 'F':
		if (!fl) return vint(a.i / b.i - ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))));
		v.f = floor(x / y);
		break;
	case '%':
		if (!fl) { int64_t m = a.i % b.i; return vint(m && ((m < 0) != (b.i < 0)) ? m + b.i : m); }
		v.f = fmod(x, y);
		if (v.f && ((v.f < 0) != (y < 0))) v.f += y;
		break;
	case 'P':
		if (!fl && b.i >= 0) { int64_t p = 1; for (int64_t i = 0; i < b.i && i < 64; i++) p *= a.i; return vint(p); }
		v.f = pow(x, y);
		break;
	}
	return v;
}

static int
contains(rs *r, val hay, val x, int line)
{
	if (hay.t == V_STR) {
		if (x.t != V_STR)
			rfail(r, RL_EINVAL, line, "'in <string>' requires a string, not %s", tname(x));
		if (!x.s.n) return 1;
		for (size_t i = 0; i + x.s.n <= hay.s.n; i++)
			if (memcmp(hay.s.p + i, x.s.p, x.s.n) == 0) return 1;
		return 0;
	}
	if (hay.t == V_DICT && !hay.flag)
		return x.t == V_STR && dget(hay.d, x.s.p, x.s.n) != NULL;
	if (hay.t == V_UNDEF)
		return 0;
	list *l = iter_list(r, hay, line);
	for (size_t i = 0; i < l->n; i++)
		if (veq(l->v[i], x)) return 1;
	return 0;
}

/* ---- evaluation -------------------------------------------------------------------- */

#define MAXARGS 12
typedef struct args {
	val pos[MAXARGS], kv[MAXARGS];
	const char *kn[MAXARGS];
	int np, nk;
} args;

static val eval(rs *r, const node *n, frame *f);
static int exec_list(rs *r, const node *n, frame *f);

static void
eval_args(rs *r, const node *n, frame *f, args *a)
{
	a->np = a->nk = 0;
	for (int i = 0; i < n->nk; i++) {
		if (a->np == MAXARGS || a->nk == MAXARGS)
			rfail(r, RL_EINVAL, n->line, "more than %d arguments", MAXARGS);
		if (n->kn[i])
			a->kn[a->nk] = n->kn[i], a->kv[a->nk++] = eval(r, n->kv[i], f);
		else
			a->pos[a->np++] = eval(r, n->kv[i], f);
	}
}

/* argument I (positional) or keyword NAME, else DEF */
static val
arg(const args *a, int i, const char *name, val def)
{
	if (i >= 0 && i < a->np)
		return a->pos[i];
	for (int k = 0; name && k < a->nk; k++)
		if (!strcmp(a->kn[k], name))
			return a->kv[k];
	return def;
}

static const char *
cstr(rs *r, val v, const char *what, int line)
{
	if (v.t != V_STR)
		rfail(r, RL_EINVAL, line, "%s: expected a string, got %s", what, tname(v));
	return v.s.p;
}

static val
str_of(rs *r, val v)
{
	if (v.t == V_STR)
		return v;
	sbuf b = { 0 };
	to_str(r, &b, v, 0);
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static frame *
push_frame(rs *r, frame *up)
{
	frame *f = ralloc(r, sizeof *f);
	f->up = up, f->vars = NULL;
	return f;
}

static void
fset(rs *r, frame *f, const char *name, val v)
{
	for (var *x = f->vars; x; x = x->next)
		if (!strcmp(x->name, name)) {
			x->v = v;
			return;
		}
	var *x = ralloc(r, sizeof *x);
	x->name = name, x->v = v, x->next = f->vars;
	f->vars = x;
}

enum { G_RANGE = 1, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };

static val
lookup(rs *r, frame *f, const char *name)
{
	for (; f; f = f->up)
		for (var *x = f->vars; x; x = x->next)
			if (!strcmp(x->name, name))
				return x->v;
	static const char *g[] = { "", "range", "namespace", "dict", "raise_exception", "strftime_now", NULL };
	for (int i = 1; g[i]; i++)
		if (!strcmp(name, g[i])) {
			val v = { .t = V_FUNC };
			v.i = i;
			return v;
		}
	const cJSON *j = r->ctx ? cJSON_GetObjectItemCaseSensitive(r->ctx, name) : NULL;
	if (j) {
		val v = from_json(r, j);
		fset(r, r->root, name, v); /* convert once */
		return v;
	}
	return vundef(name);
}

static int
eq_name(const char *a, const char *b)
{
	return !strcmp(a, b);
}

static int
do_test(rs *r, const char *t, val v, const args *a, int line)
{
	val x = arg(a, 0, NULL, vundef(NULL));
	if (eq_name(t, "defined")) return v.t != V_UNDEF;
	if (eq_name(t, "undefined")) return v.t == V_UNDEF;
	if (eq_name(t, "none")) return v.t == V_NONE;
	if (eq_name(t, "string")) return v.t == V_STR;
	if (eq_name(t, "mapping")) return v.t == V_DICT && !v.flag;
	if (eq_name(t, "iterable")) return v.t == V_STR || v.t == V_LIST || (v.t == V_DICT && !v.flag) || v.t == V_UNDEF;
	if (eq_name(t, "sequence")) return v.t == V_STR || v.t == V_LIST || (v.t == V_DICT && !v.flag);
	if (eq_name(t, "number")) return isnum(v);
	if (eq_name(t, "integer")) return v.t == V_INT;
	if (eq_name(t, "float")) return v.t == V_FLOAT;
	if (eq_name(t, "boolean")) return v.t == V_BOOL;
	if (eq_name(t, "true")) return v.t == V_BOOL && v.i;
	if (eq_name(t, "false")) return v.t == V_BOOL && !v.i;
	if (eq_name(t, "callable")) return v.t == V_MACRO || v.t == V_FUNC;
	if (eq_name(t, "even") || eq_name(t, "odd")) {
		if (v.t != V_INT) rfail(r, RL_EINVAL, line, "test '%s' needs an integer, got %s", t, tname(v));
		return (v.i % 2 == 0) == eq_name(t, "even");
	}
	if (eq_name(t, "divisibleby")) {
		if (v.t != V_INT || x.t != V_INT || !x.i) rfail(r, RL_EINVAL, line, "divisibleby needs integers");
		return v.i % x.i == 0;
	}
	if (eq_name(t, "equalto") || eq_name(t, "eq") || eq_name(t, "==")) return veq(v, x);
	if (eq_name(t, "ne") || eq_name(t, "!=")) return !veq(v, x);
	if (eq_name(t, "sameas")) return veq(v, x) && v.t == x.t;
	if (eq_name(t, "lt") || eq_name(t, "<")) return vcmp(r, v, x, line) < 0;
	if (eq_name(t, "le") || eq_name(t, "<=")) return vcmp(r, v, x, line) <= 0;
	if (eq_name(t, "gt") || eq_name(t, ">")) return vcmp(r, v, x, line) > 0;
	if (eq_name(t, "ge") || eq_name(t, ">=")) return vcmp(r, v, x, line) >= 0;
	if (eq_name(t, "in")) return contains(r, x, v, line);
	if (eq_name(t, "lower") || eq_name(t, "upper")) {
		if (v.t != V_STR) return 0;
		for (size_t i = 0; i < v.s.n; i++)
			if (eq_name(t, "lower") ? isupper((unsigned char)v.s.p[i]) : islower((unsigned char)v.s.p[i])) return 0;
		return 1;
	}
	rfail(r, RL_EINVAL, line, "unknown test '%s'", t);
	return 0;
}

/* strip: which ends (1 left, 2 right), CHARS (NULL: whitespace) */
static val
strip(rs *r, val s, int ends, val chars)
{
	const char *p = s.s.p, *e = p + s.s.n;
	const char *set = chars.t == V_STR ? chars.s.p : NULL;
	size_t sn = chars.t == V_STR ? chars.s.n : 0;
#define IN_SET(c) (set ? memchr(set, (c), sn) != NULL : (is_ws(c) || ((unsigned char)(c) >= 0x1c && (unsigned char)(c) <= 0x1f)))
	if (ends & 1) while (p < e && IN_SET(*p)) p++;
	if (ends & 2) while (e > p && IN_SET(e[-1])) e--;
#undef IN_SET
	return mkstr(r, p, (size_t)(e - p));
}

static val
casemap(rs *r, val s, int mode) /* 'u' upper, 'l' lower, 't' title, 'c' capitalize */
{
	val o = mkstr(r, s.s.p, s.s.n);
	char *p = (char *)o.s.p;
	int prev_alpha = 0;
	for (size_t i = 0; i < o.s.n; i++) {
		unsigned char c = (unsigned char)p[i];
		int up = mode == 'u' || (mode == 't' && !prev_alpha) || (mode == 'c' && i == 0);
		p[i] = (char)(up ? toupper(c) : tolower(c));
		prev_alpha = isalpha(c) || c >= 0x80;
	}
	return o;
}

static val
replace(rs *r, val s, val old, val nw, int64_t count, int line)
{
	sbuf b = { 0 };
	const char *p = s.s.p, *e = p + s.s.n;
	if (!old.s.n) {
		sb_add(r, &b, p, (size_t)(e - p), line);
		return sbval(&b);
	}
	while (p < e) {
		const char *q = count ? NULL : NULL;
		for (const char *x = p; x + old.s.n <= e; x++)
			if (memcmp(x, old.s.p, old.s.n) == 0) { q = x; break; }
		if (!q || count == 0) break;
		sb_add(r, &b, p, (size_t)(q - p), line);
		sb_add(r, &b, nw.s.p, nw.s.n, line);
		p = q + old.s.n;
		if (count > 0) count--;
	}
	sb_add(r, &b, p, (size_t)(e - p), line);
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static val
split(rs *r, val s, val sep, int64_t max, int line)
{
	list *l = newlist(r, 4);
	const char *p = s.s.p, *e = p + s.s.n;
	if (sep.t != V_STR) {
		for (;;) {
			while (p < e && is_ws(*p)) p++;
			if (p >= e) break;
			const char *q = p;
			if (max-- == 0) { q = e; while (q > p && is_ws(q[-1])) q--; lpush(r, l, mkstr(r, p, (size_t)(q - p))); break; }
			while (q < e && !is_ws(*q)) q++;
			lpush(r, l, mkstr(r, p, (size_t)(q - p)));
			p = q;
		}
		return vlist(l, 0);
	}
	if (!sep.s.n)
		rfail(r, RL_EINVAL, line, "split: empty separator");
	for (;;) {
		const char *q = NULL;
		for (const char *x = p; max != 0 && x + sep.s.n <= e; x++)
			if (memcmp(x, sep.s.p, sep.s.n) == 0) { q = x; break; }
		if (!q) { lpush(r, l, mkstr(r, p, (size_t)(e - p))); break; }
		lpush(r, l, mkstr(r, p, (size_t)(q - p)));
		p = q + sep.s.n;
		if (max > 0) max--;
	}
	return vlist(l, 0);
}

static int
affix(val s, val x, int end)
{
	if (x.t != V_STR || x.s.n > s.s.n) return 0;
	return memcmp(s.s.p + (end ? s.s.n - x.s.n : 0), x.s.p, x.s.n) == 0;
}

/* str.format with {} / {0} / {name} fields */
static val
format(rs *r, val s, const args *a, int line)
{
	sbuf b = { 0 };
	int auto_i = 0;
	for (size_t i = 0; i < s.s.n; i++) {
		char c = s.s.p[i];
		if ((c == '{' || c == '}') && i + 1 < s.s.n && s.s.p[i + 1] == c) { sb_add(r, &b, &c, 1, line); i++; continue; }
		if (c != '{') { sb_add(r, &b, &c, 1, line); continue; }
		size_t j = i + 1;
		while (j < s.s.n && s.s.p[j] != '}') j++;
		if (j >= s.s.n) rfail(r, RL_EINVAL, line, "format: single '{'");
		char key[64];
		size_t kn = j - i - 1 < sizeof key - 1 ? j - i - 1 : sizeof key - 1;
		memcpy(key, s.s.p + i + 1, kn);
		key[kn] = 0;
		val v;
		if (!kn) v = arg(a, auto_i++, NULL, vundef(NULL));
		else if (isdigit((unsigned char)key[0])) v = arg(a, atoi(key), NULL, vundef(NULL));
		else v = arg(a, -1, key, vundef(NULL));
		if (v.t == V_UNDEF) rfail(r, RL_EINVAL, line, "format: no value for '{%s}'", key);
		to_str(r, &b, v, 0);
		i = j;
	}
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static val
method(rs *r, val o, const char *m, const args *a, int line)
{
	val u = vundef(NULL), none = vnone();
	if (o.t == V_STR) {
		if (eq_name(m, "startswith") || eq_name(m, "endswith")) {
			val x = arg(a, 0, NULL, u);
			int end = m[0] == 'e', hit = 0;
			if (x.t == V_LIST)
				for (size_t i = 0; i < x.l->n; i++) hit |= affix(o, x.l->v[i], end);
			else
				hit = affix(o, x, end);
			return vbool(hit);
		}
		if (eq_name(m, "strip")) return strip(r, o, 3, arg(a, 0, NULL, none));
		if (eq_name(m, "lstrip")) return strip(r, o, 1, arg(a, 0, NULL, none));
		if (eq_name(m, "rstrip")) return strip(r, o, 2, arg(a, 0, NULL, none));
		if (eq_name(m, "split")) {
			val mx = arg(a, 1, "maxsplit", vint(-1));
			return split(r, o, arg(a, 0, "sep", none), mx.t == V_INT ? mx.i : -1, line);
		}
		if (eq_name(m, "replace")) {
			val c = arg(a, 2, "count", vint(-1));
			val x = arg(a, 0, NULL, u), y = arg(a, 1, NULL, u);
			cstr(r, x, "replace", line), cstr(r, y, "replace", line);
			return replace(r, o, x, y, c.t == V_INT ? c.i : -1, line);
		}
		if (eq_name(m, "upper")) return casemap(r, o, 'u');
		if (eq_name(m, "lower")) return casemap(r, o, 'l');
		if (eq_name(m, "title")) return casemap(r, o, 't');
		if (eq_name(m, "capitalize")) return casemap(r, o, 'c');
		if (eq_name(m, "format")) return format(r, o, a, line);
		if (eq_name(m, "join")) {
			list *l = iter_list(r, arg(a, 0, NULL, u), line);
			sbuf b = { 0 };
			for (size_t i = 0; i < l->n; i++) {
				if (i) sb_add(r, &b, o.s.p, o.s.n, line);
				val s = str_of(r, l->v[i]);
				sb_add(r, &b, s.s.p, s.s.n, line);
			}
			return b.p ? sbval(&b) : mkstr(r, "", 0);
		}
		if (eq_name(m, "find") || eq_name(m, "count")) {
			val x = arg(a, 0, NULL, u);
			cstr(r, x, m, line);
			int64_t cnt = 0;
			for (size_t i = 0; i + x.s.n <= o.s.n; i++)
				if (memcmp(o.s.p + i, x.s.p, x.s.n) == 0) {
					if (m[0] == 'f') return vint((int64_t)u8len(o.s.p, i));
					cnt++;
					if (x.s.n) i += x.s.n - 1;
				}
			return vint(m[0] == 'f' ? -1 : cnt);
		}
	} else if (o.t == V_DICT && !o.flag) {
		if (eq_name(m, "items") || eq_name(m, "keys") || eq_name(m, "values")) {
			list *l = newlist(r, o.d->n);
			for (size_t i = 0; i < o.d->n; i++) {
				if (m[0] == 'k') { lpush(r, l, o.d->k[i]); continue; }
				if (m[0] == 'v') { lpush(r, l, o.d->v[i]); continue; }
				list *p = newlist(r, 2);
				lpush(r, p, o.d->k[i]);
				lpush(r, p, o.d->v[i]);
				lpush(r, l, vlist(p, 1));
			}
			return vlist(l, 0);
		}
		if (eq_name(m, "get")) {
			val k = arg(a, 0, NULL, u), *x = k.t == V_STR ? dget(o.d, k.s.p, k.s.n) : NULL;
			return x ? *x : arg(a, 1, "default", none);
		}
	}
	rfail(r, RL_EINVAL, line, "calling '%s' on a %s is refused (not a known safe method)", m, tname(o));
	return u;
}

static val call_macro(rs *r, val m, const args *a, int line);

/* map / select / reject / selectattr / rejectattr */
static val
f_seq(rs *r, const char *f, val v, const args *a, int line)
{
	list *l = iter_list(r, v, line), *o = newlist(r, l->n);
	int attr = strstr(f, "attr") != NULL, rej = f[0] == 'r';
	args sub = { 0 };
	for (int i = attr + 1; i < a->np; i++)
		sub.pos[sub.np++] = a->pos[i];
	for (size_t i = 0; i < l->n; i++) {
		val x = l->v[i];
		if (f[0] == 'm') {
			val at = arg(a, -1, "attribute", vundef(NULL));
			if (at.t == V_STR)
				x = getitem(r, x, at, line);
			else
				rfail(r, RL_EINVAL, line, "map: only map(attribute=...) is supported");
			if (x.t == V_UNDEF) x = arg(a, -1, "default", x);
			lpush(r, o, x);
			continue;
		}
		val y = attr ? getitem(r, x, mkstr(r, cstr(r, arg(a, 0, NULL, vundef(NULL)), f, line),
		    strlen(arg(a, 0, NULL, vundef(NULL)).s.p)), line) : x;
		val tn = arg(a, attr, NULL, vundef(NULL));
		int ok = tn.t == V_STR ? do_test(r, tn.s.p, y, &sub, line) : truthy(y);
		if (ok != rej)
			lpush(r, o, x);
	}
	return vlist(o, 0);
}

static val
f_tojson(rs *r, val v, const args *a, int line)
{
	jopt o = { 0, -1, 0, ", ", ": " };
	val ind = arg(a, 0, "indent", vnone()), sep = arg(a, -1, "separators", vnone());
	o.ascii = truthy(arg(a, -1, "ensure_ascii", vbool(0)));
	o.sort = truthy(arg(a, -1, "sort_keys", vbool(0)));
	if (ind.t == V_INT) {
		o.indent = (int)(ind.i < 0 ? 0 : ind.i);
		o.item_sep = ",";
	} else if (ind.t != V_NONE) {
		rfail(r, RL_EINVAL, line, "tojson: indent must be an integer");
	}
	if (sep.t == V_LIST && sep.l->n == 2) {
		o.item_sep = cstr(r, sep.l->v[0], "tojson separators", line);
		o.key_sep = cstr(r, sep.l->v[1], "tojson separators", line);
	}
	sbuf b = { 0 };
	to_json(r, &b, v, &o, 0, line);
	return sbval(&b);
}

static val
f_join(rs *r, val v, const args *a, int line)
{
	val sep = arg(a, 0, "d", mkstr(r, "", 0)), at = arg(a, 1, "attribute", vnone());
	list *l = iter_list(r, v, line);
	sbuf b = { 0 };
	for (size_t i = 0; i < l->n; i++) {
		if (i) sb_add(r, &b, sep.s.p, sep.s.n, line);
		val s = str_of(r, at.t == V_STR ? getitem(r, l->v[i], at, line) : l->v[i]);
		sb_add(r, &b, s.s.p, s.s.n, line);
	}
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static val
f_indent(rs *r, val v, const args *a, int line)
{
	val w = arg(a, 0, "width", vint(4));
	int first = truthy(arg(a, 1, "first", vbool(0))), blank = truthy(arg(a, 2, "blank", vbool(0)));
	sbuf pad = { 0 }, b = { 0 };
	if (w.t == V_STR) sb_add(r, &pad, w.s.p, w.s.n, line);
	else for (int64_t i = 0; i < w.i; i++) sb_puts(r, &pad, " ");
	v = str_of(r, v);
	const char *p = v.s.p, *e = p + v.s.n;
	for (int ln = 0; p <= e; ln++) {
		const char *q = memchr(p, '\n', (size_t)(e - p));
		if (!q) q = e;
		if ((ln || first) && (blank || q > p) && pad.n) sb_add(r, &b, pad.p, pad.n, line);
		sb_add(r, &b, p, (size_t)(q - p), line);
		if (q == e) break;
		sb_puts(r, &b, "\n");
		p = q + 1;
	}
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static val
filter(rs *r, const char *f, val v, const args *a, int line)
{
	val u = vundef(NULL);
	if (eq_name(f, "tojson")) return f_tojson(r, v, a, line);
	if (eq_name(f, "length") || eq_name(f, "count")) return vint((int64_t)vlen(r, v, line));
	if (eq_name(f, "default") || eq_name(f, "d")) {
		int b = truthy(arg(a, 1, "boolean", vbool(0)));
		return (v.t == V_UNDEF || (b && !truthy(v))) ? arg(a, 0, "default_value", mkstr(r, "", 0)) : v;
	}
	if (eq_name(f, "string")) return str_of(r, v);
	if (eq_name(f, "safe")) return v;
	if (eq_name(f, "trim")) return strip(r, str_of(r, v), 3, arg(a, 0, "chars", vnone()));
	if (eq_name(f, "upper")) return casemap(r, str_of(r, v), 'u');
	if (eq_name(f, "lower")) return casemap(r, str_of(r, v), 'l');
	if (eq_name(f, "title")) return casemap(r, str_of(r, v), 't');
	if (eq_name(f, "capitalize")) return casemap(r, str_of(r, v), 'c');
	if (eq_name(f, "replace")) {
		val c = arg(a, 2, "count", vnone());
		return replace(r, str_of(r, v), str_of(r, arg(a, 0, "old", u)), str_of(r, arg(a, 1, "new", u)),
		    c.t == V_INT ? c.i : -1, line);
	}
	if (eq_name(f, "items")) {
		if (v.t == V_UNDEF) return vlist(newlist(r, 1), 0);
		if (v.t != V_DICT || v.flag) rfail(r, RL_EINVAL, line, "items: expected a mapping, got %s", tname(v));
		return method(r, v, "items", a, line);
	}
	if (eq_name(f, "list")) return vlist(iter_list(r, v, line), 0);
	if (eq_name(f, "join")) return f_join(r, v, a, line);
	if (eq_name(f, "first") || eq_name(f, "last")) {
		list *l = iter_list(r, v, line);
		return l->n ? l->v[f[0] == 'f' ? 0 : l->n - 1] : u;
	}
	if (eq_name(f, "reverse")) {
		if (v.t == V_STR) return slice(r, v, u, u, vint(-1), line);
		list *l = iter_list(r, v, line), *o = newlist(r, l->n);
		for (size_t i = l->n; i-- > 0;) lpush(r, o, l->v[i]);
		return vlist(o, 0);
	}
	if (eq_name(f, "int")) {
		if (v.t == V_FLOAT) return vint((int64_t)v.f);
		if (v.t == V_INT || v.t == V_BOOL) return vint(v.i);
		if (v.t == V_STR) { char *end; val s = strip(r, v, 3, vnone()); long long x = strtoll(s.s.p, &end, 10);
			if (*end == 0 && s.s.n) return vint(x);
			double d = strtod(s.s.p, &end); if (*end == 0 && s.s.n) return vint((int64_t)d); }
		return arg(a, 0, "default", vint(0));
	}
	if (eq_name(f, "float")) {
		val o = { .t = V_FLOAT };
		if (isnum(v)) { o.f = num(v); return o; }
		if (v.t == V_STR) { char *end; o.f = strtod(v.s.p, &end); if (*end == 0 && v.s.n) return o; }
		o.f = 0;
		return arg(a, 0, "default", o);
	}
	if (eq_name(f, "abs")) {
		if (v.t == V_INT) return vint(v.i < 0 ? -v.i : v.i);
		if (v.t == V_FLOAT) { v.f = fabs(v.f); return v; }
		rfail(r, RL_EINVAL, line, "abs: expected a number, got %s", tname(v));
	}
	if (eq_name(f, "indent")) return f_indent(r, v, a, line);
	if (eq_name(f, "map") || eq_name(f, "select") || eq_name(f, "reject") || eq_name(f, "selectattr") ||
	    eq_name(f, "rejectattr"))
		return f_seq(r, f, v, a, line);
	rfail(r, RL_EINVAL, line, "unknown filter '%s'", f);
	return u;
}

static val
call_global(rs *r, int g, const args *a, int line)
{
	val u = vundef(NULL);
	if (g == G_RAISE) {
		val m = str_of(r, arg(a, 0, "message", mkstr(r, "", 0)));
		rfail(r, RL_EINVAL, line, "raise_exception: %s", m.s.p);
	}
	if (g == G_NAMESPACE || g == G_DICT) {
		val v = { .t = V_DICT, .flag = g == G_NAMESPACE };
		v.d = newdict(r);
		if (a->np && a->pos[0].t == V_DICT)
			for (size_t i = 0; i < a->pos[0].d->n; i++)
				dset(r, v.d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
		for (int i = 0; i < a->nk; i++)
			dset(r, v.d, mkstr(r, a->kn[i], strlen(a->kn[i])), a->kv[i]);
		return v;
	}
	if (g == G_RANGE) {
		int64_t lo = 0, hi, st = 1;
		val x = arg(a, 0, NULL, u), y = arg(a, 1, NULL, u), z = arg(a, 2, NULL, u);
		if (x.t != V_INT || (y.t != V_UNDEF && y.t != V_INT) || (z.t != V_UNDEF && z.t != V_INT))
			rfail(r, RL_EINVAL, line, "range: expected integers");
		if (y.t == V_INT) lo = x.i, hi = y.i; else hi = x.i;
		if (z.t == V_INT) st = z.i;
		if (!st) rfail(r, RL_EINVAL, line, "range: step cannot be zero");
		double cnt = ((double)hi - (double)lo) / (double)st;
		if (cnt > (double)r->max_iter)
			rfail(r, RL_ETOOBIG, line, "range of %.0f items refused (the loop cap is %zu iterations)", cnt, r->max_iter);
		list *l = newlist(r, cnt > 0 ? (size_t)cnt + 1 : 1);
		for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
			lpush(r, l, vint(i));
		return vlist(l, 0);
	}
	/* strftime_now */
	val fm = arg(a, 0, NULL, u);
	char out[256];
	time_t t = r->now ? r->now : time(NULL);
	struct tm tm;
	localtime_r(&t, &tm);
	size_t n = strftime(out, sizeof out, cstr(r, fm, "strftime_now", line), &tm);
	return mkstr(r, out, n);
}

static val
call(rs *r, const node *n, frame *f)
{
	args a;
	if (n->a->k == N_ATTR) {
		val o = eval(r, n->a->a, f);
		if (o.t == V_STR || (o.t == V_DICT && !o.flag)) {
			val *x = o.t == V_DICT ? dget(o.d, n->a->s, strlen(n->a->s)) : NULL;
			if (!x || (x->t != V_MACRO && x->t != V_FUNC)) {
				eval_args(r, n, f, &a);
				return method(r, o, n->a->s, &a, n->line);
			}
		}
	}
	val fn = eval(r, n->a, f);
	eval_args(r, n, f, &a);
	if (fn.t == V_FUNC)
		return call_global(r, (int)fn.i, &a, n->line);
	if (fn.t == V_MACRO)
		return call_macro(r, fn, &a, n->line);
	rfail(r, RL_EINVAL, n->line, "%s%s%s is not callable (%s)", n->a->k == N_NAME ? "'" : "",
	    n->a->k == N_NAME ? n->a->s : "the value", n->a->k == N_NAME ? "'" : "", tname(fn));
	return fn;
}

static val
call_macro(rs *r, val mv, const args *a, int line)
{
	const node *m = mv.m;
	if (a->np > m->nnames)
		rfail(r, RL_EINVAL, line, "macro '%s' takes %d arguments, got %d", m->s, m->nnames, a->np);
	if (++r->depth > r->max_depth)
		rfail(r, RL_ETOOBIG, line, "macro calls nested deeper than %d (runaway recursion?)", r->max_depth);
	frame *f = push_frame(r, r->root);
	for (int i = 0; i < a->nk; i++) {
		int k = 0;
		while (k < m->nnames && strcmp(m->names[k], a->kn[i])) k++;
		if (k == m->nnames)
			rfail(r, RL_EINVAL, line, "macro '%s' has no parameter '%s'", m->s, a->kn[i]);
	}
	for (int i = 0; i < m->nnames; i++) {
		val v = arg(a, i, m->names[i], vundef(m->names[i]));
		if (v.t == V_UNDEF && m->kv[i])
			v = eval(r, m->kv[i], f);
		fset(r, f, m->names[i], v);
	}
	sbuf b = { 0 }, *save = r->out;
	r->out = &b;
	int rv = exec_list(r, m->b, f);
	r->out = save;
	r->depth--;
	(void)rv;
	return b.p ? sbval(&b) : mkstr(r, "", 0);
}

static val
eval_cmp(rs *r, const node *n, frame *f)
{
	val a = eval(r, n->a, f), b = eval(r, n->b, f);
	switch (n->op) {
	case 'e': return vbool(veq(a, b));
	case 'n': return vbool(!veq(a, b));
	case '<': return vbool(vcmp(r, a, b, n->line) < 0);
	case '>': return vbool(vcmp(r, a, b, n->line) > 0);
	case 'l': return vbool(vcmp(r, a, b, n->line) <= 0);
	case 'g': return vbool(vcmp(r, a, b, n->line) >= 0);
	case 'i': return vbool(contains(r, b, a, n->line));
	default: return vbool(!contains(r, b, a, n->line));
	}
}

static val
eval(rs *r, const node *n, frame *f)
{
	val v, w;
	args a;
	switch (n->k) {
	case N_LIT: return n->lit;
	case N_NAME: return lookup(r, f, n->s);
	case N_LIST: case N_TUPLE: {
		list *l = newlist(r, (size_t)n->nk);
		for (int i = 0; i < n->nk; i++)
			lpush(r, l, eval(r, n->kv[i], f));
		return vlist(l, n->k == N_TUPLE);
	}
	case N_DICT:
		v.t = V_DICT, v.flag = 0, v.d = newdict(r);
		for (int i = 0; i + 1 < n->nk; i += 2) {
			val k = eval(r, n->kv[i], f);
			if (k.t != V_STR) rfail(r, RL_EINVAL, n->line, "dict keys must be strings here, got %s", tname(k));
			dset(r, v.d, k, eval(r, n->kv[i + 1], f));
		}
		return v;
	case N_ATTR: return getattr(r, eval(r, n->a, f), n->s, n->line);
	case N_ITEM:
		v = eval(r, n->a, f);
		w = eval(r, n->b, f);
		if (w.t == V_STR && w.s.n && w.s.p[0] == '_')
			rfail(r, RL_EINVAL, n->line, "access to key '%s' of a %s is refused", w.s.p, tname(v));
		return getitem(r, v, w, n->line);
	case N_SLICE: {
		val u = vundef(NULL);
		v = eval(r, n->a, f);
		if (v.t != V_LIST && v.t != V_STR) rfail(r, RL_EINVAL, n->line, "cannot slice a %s", tname(v));
		return slice(r, v, n->b ? eval(r, n->b, f) : u, n->c ? eval(r, n->c, f) : u, n->d ? eval(r, n->d, f) : u,
		    n->line);
	}
	case N_CALL: return call(r, n, f);
	case N_FILTER:
		v = eval(r, n->a, f);
		eval_args(r, n, f, &a);
		return filter(r, n->s, v, &a, n->line);
	case N_TEST:
		v = eval(r, n->a, f);
		eval_args(r, n, f, &a);
		return vbool(do_test(r, n->s, v, &a, n->line) != n->neg);
	case N_BIN: return arith(r, n->op, eval(r, n->a, f), eval(r, n->b, f), n->line);
	case N_NEG: case N_POS:
		v = eval(r, n->a, f);
		if (!isnum(v)) rfail(r, RL_EINVAL, n->line, "bad operand type for unary %c: %s", n->k == N_NEG ? '-' : '+', tname(v));
		if (n->k == N_POS) return v;
		if (v.t == V_FLOAT) { v.f = -v.f; return v; }
		return vint(-v.i);
	case N_AND: v = eval(r, n->a, f); return truthy(v) ? eval(r, n->b, f) : v;
	case N_OR: v = eval(r, n->a, f); return truthy(v) ? v : eval(r, n->b, f);
	case N_NOT: return vbool(!truthy(eval(r, n->a, f)));
	case N_COND: return truthy(eval(r, n->b, f)) ? eval(r, n->a, f) : n->c ? eval(r, n->c, f) : vundef(NULL);
	case N_CONCAT: {
		sbuf b = { 0 };
		for (int i = 0; i < n->nk; i++)
			to_str(r, &b, eval(r, n->kv[i], f), 0);
		return b.p ? sbval(&b) : mkstr(r, "", 0);
	}
	case N_CMP: return eval_cmp(r, n, f);
	default: rfail(r, RL_EINVAL, n->line, "internal: bad expression node");
	}
	return vundef(NULL);
}

/* ---- statements -------------------------------------------------------------------- */

static void
bind(rs *r, frame *f, const node *n, val v)
{
	if (n->nnames == 1) {
		fset(r, f, n->names[0], v);
		return;
	}
	if (v.t != V_LIST || v.l->n != (size_t)n->nnames)
		rfail(r, RL_EINVAL, n->line, "cannot unpack %s into %d names", tname(v), n->nnames);
	for (int i = 0; i < n->nnames; i++)
		fset(r, f, n->names[i], v.l->v[i]);
}

/* One frame serves every iteration: it is cut back to the loop's own names
 * before each (assignments in the body do not carry over, as in jinja2), and
 * the `loop` object is updated in place, so a loop allocates nothing per
 * iteration itself. */
static int
exec_for(rs *r, const node *n, frame *f)
{
	list *all = iter_list(r, eval(r, n->a, f), n->line), *items = all;
	frame *t = push_frame(r, f);
	if (n->d) { /* the loop's "if" filters before loop.* counts */
		items = newlist(r, all->n);
		for (size_t i = 0; i < all->n; i++) {
			if (++r->iters > r->max_iter)
				rfail(r, RL_ETOOBIG, n->line, "more than %zu loop iterations (the cap)", r->max_iter);
			var *keep = t->vars;
			bind(r, t, n, all->v[i]);
			if (truthy(eval(r, n->d, t)))
				lpush(r, items, all->v[i]);
			if (!keep)
				keep = t->vars;
			t->vars = keep;
		}
	}
	if (!items->n)
		return n->c ? exec_list(r, n->c, f) : 0;
	loopst *ls = ralloc(r, sizeof *ls);
	val lv = { .t = V_LOOP };
	var *base = NULL;
	t->vars = NULL;
	ls->items = items;
	lv.lp = ls;
	for (size_t i = 0; i < items->n; i++) {
		if (++r->iters > r->max_iter)
			rfail(r, RL_ETOOBIG, n->line, "more than %zu loop iterations (the cap)", r->max_iter);
		ls->i = i;
		t->vars = base;
		bind(r, t, n, items->v[i]);
		fset(r, t, "loop", lv);
		base = t->vars;
		if (exec_list(r, n->b, t) == FLOW_BREAK)
			break;
	}
	return 0;
}

static int
exec_one(rs *r, const node *n, frame *f)
{
	val v;
	r->line = n->line;
	switch (n->k) {
	case N_TEXT: sb_add(r, r->out, n->s, n->n, n->line); return 0;
	case N_OUT:
		to_str(r, r->out, eval(r, n->a, f), 0);
		return 0;
	case N_IF: return truthy(eval(r, n->a, f)) ? exec_list(r, n->b, f) : exec_list(r, n->c, f);
	case N_FOR: return exec_for(r, n, f);
	case N_SET: bind(r, f, n, eval(r, n->a, f)); return 0;
	case N_SETATTR:
		v = lookup(r, f, n->names[0]);
		if (v.t != V_DICT || !v.flag)
			rfail(r, RL_EINVAL, n->line, "cannot set attribute '%s' of %s '%s' (only a namespace())",
			    n->s, tname(v), n->names[0]);
		dset(r, v.d, mkstr(r, n->s, strlen(n->s)), eval(r, n->a, f));
		return 0;
	case N_SETBLOCK: {
		sbuf b = { 0 }, *save = r->out;
		r->out = &b;
		exec_list(r, n->b, f);
		r->out = save;
		fset(r, f, n->names[0], b.p ? sbval(&b) : mkstr(r, "", 0));
		return 0;
	}
	case N_MACRO:
		v.t = V_MACRO, v.flag = 0, v.m = n;
		fset(r, f, n->s, v);
		return 0;
	case N_BREAK: return FLOW_BREAK;
	case N_CONTINUE: return FLOW_CONTINUE;
	case N_BLOCK: return exec_list(r, n->b, f);
	}
	return 0;
}

static int
exec_list(rs *r, const node *n, frame *f)
{
	for (; n; n = n->next) {
		int rv = exec_one(r, n, f);
		if (rv)
			return rv;
	}
	return 0;
}

int
rl_jinja_render(char **text, size_t *len, const rl_jinja *t, const cJSON *ctx, const rl_jinja_opts *opts)
{
	*text = NULL;
	if (len)
		*len = 0;
	rs *r = calloc(1, sizeof *r);
	if (!r)
		return RL_ENOMEM;
	r->name = t->name;
	r->ctx = ctx;
	r->max_out = opts && opts->max_output ? opts->max_output : (size_t)16 << 20;
	r->max_iter = opts && opts->max_iter ? opts->max_iter : 1000000;
	r->max_depth = opts && opts->max_depth ? opts->max_depth : 64;
	r->now = opts ? opts->now : 0;
	r->a.max = r->max_out * 8 + ((size_t)256 << 20);
	volatile int rv = RL_OK;
	sbuf out = { 0 };
	if (setjmp(r->jb)) {
		rv = r->rv;
		goto out;
	}
	r->root = push_frame(r, NULL);
	r->out = &out;
	exec_list(r, t->body, r->root);
	char *s = malloc(out.n + 1);
	if (!s) {
		rv = RL_ENOMEM;
		goto out;
	}
	if (out.n)
		memcpy(s, out.p, out.n);
	s[out.n] = 0;
	*text = s;
	if (len)
		*len = out.n;
out:
	arena_free(&r->a);
	free(r);
	return rv;
}

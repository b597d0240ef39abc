/*
 * test_jinja.c — the Jinja engine's language pieces, each checked against
 * the output jinja2 gives for the same template (trim_blocks, lstrip_blocks,
 * as transformers renders), and its sandbox refusals.
 * With arguments "--render TEMPLATE CONTEXT.json" it renders one template to
 * stdout: tests/tokenizer/jinja_oracle.py compares that with python3-jinja2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "t.h"
#include "tok/jinja.h"

/* render SRC with the JSON context CTX; the output, or "ERR:<code>" */
static char *
render(const char *src, const char *ctx)
{
	rl_jinja *t = NULL;
	static char err[32];
	int rv = rl_jinja_parse(&t, src, strlen(src), "t.jinja");
	if (rv) {
		snprintf(err, sizeof err, "PARSE:%d", rv);
		return strdup(err);
	}
	cJSON *j = ctx ? cJSON_Parse(ctx) : NULL;
	rl_jinja_opts o = { 0 };
	o.now = 1753963200; /* 2025-07-31 12:00 UTC */
	o.max_iter = 100000;
	o.max_output = 1 << 20;
	char *out = NULL;
	size_t n;
	rv = rl_jinja_render(&out, &n, t, j, &o);
	cJSON_Delete(j);
	rl_jinja_free(t);
	if (rv) {
		snprintf(err, sizeof err, "ERR:%d", rv);
		return strdup(err);
	}
	return out;
}

static int dump; /* --dump: print each case as a JSON line (for jinja2) */

static void
dump_case(const char *src, const char *ctx, const char *want)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "src", src);
	cJSON_AddStringToObject(o, "ctx", ctx ? ctx : "{}");
	cJSON_AddStringToObject(o, "want", want);
	char *p = cJSON_PrintUnformatted(o);
	puts(p);
	free(p);
	cJSON_Delete(o);
}

#define R(src, ctx, want)                                  \
	do {                                               \
		if (dump) {                                \
			dump_case(src, ctx, want);         \
			break;                             \
		}                                          \
		char *got_ = render(src, ctx);             \
		T_EQ_STR(got_, want);                      \
		free(got_);                                \
	} while (0)

static int
render_file(const char *tp, const char *cp)
{
	char *src = NULL, *ctx = NULL, *out = NULL;
	size_t n, cn, on;
	int rv;
	if ((rv = rl_io_read_file(tp, 0, &src, &n)) != 0 || (rv = rl_io_read_file(cp, 0, &ctx, &cn)) != 0)
		return 1;
	rl_jinja *t = NULL;
	cJSON *j = cJSON_ParseWithLength(ctx, cn);
	rl_jinja_opts o = { 0 };
	o.now = 1753963200;
	if (!j || (rv = rl_jinja_parse(&t, src, n, tp)) != 0 || (rv = rl_jinja_render(&out, &on, t, j, &o)) != 0) {
		cJSON_Delete(j);
		rl_jinja_free(t);
		free(src), free(ctx);
		return 3;
	}
	fwrite(out, 1, on, stdout);
	free(out), free(src), free(ctx);
	cJSON_Delete(j);
	rl_jinja_free(t);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--render")) {
		setenv("TZ", "UTC", 1);
		return render_file(argv[2], argv[3]);
	}
	dump = argc == 2 && !strcmp(argv[1], "--dump");
	T_BEGIN("test_jinja");
	setenv("TZ", "UTC", 1);
	/* expected strings: jinja2 3.1 with trim_blocks=True, lstrip_blocks=True */
	R("a{{ 1 + 2 }}b", NULL, "a3b");
	R("{{ x }}|{{ y }}|{{ z }}", "{\"x\":null,\"y\":true,\"z\":[1,\"a\",null]}", "None|True|[1, 'a', None]");
	R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 * 2 }}", NULL,
	  "3 -4 1 2 3.5 1024 3.0");
	R("{{ 'a' ~ 1 ~ none }}{{ 'x' * 3 }}{{ [1] + [2] }}", NULL, "a1Nonexxx[1, 2]");
	R("{% if a %}A{% elif b %}B{% else %}C{% endif %}", "{\"a\":0,\"b\":1}", "B");
	R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}",
	  "{\"xs\":[5,6]}", "10TrueFalse2 21FalseTrue2 ");
	R("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }},{% else %}none{% endfor %}",
	  "{\"xs\":[1,2,3]}", "21False,32True,");
	R("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
	R("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
	  "{\"d\":{\"b\":1,\"a\":2}}", "b=1;a=2;ba");
	R("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
	  NULL, "02");
	R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
	R("{% for i in [1,2] %}{% if i == 1 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}", NULL, "[5][]");
	R("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}", NULL, "111");
	R("{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}", NULL,
	  "1x2y1;1x2y2;");
	R("{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", NULL, "4");
	R("{% set b %}in{{ 1 }}{% endset %}[{{ b }}]", NULL, "[in1]");
	R("{% macro m(a, b='d') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}", NULL, "<1d><2x>");
	R("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
	R("a{% generation %}b{{ 1 }}{% endgeneration %}c", NULL, "ab1c");
	R("{{ 'b' if x else 'c' }}{{ 'd' if not x }}", "{\"x\":false}", "cd");
	R("{{ 'ab' in 'xaby' }}{{ 2 in [1,2] }}{{ 'k' in d }}{{ 3 not in [3] }}", "{\"d\":{\"k\":1}}", "TrueTrueTrueFalse");
	R("{{ s[1:3] }}{{ s[::-1] }}{{ s[-1] }}{{ xs[1:] }}{{ xs[-2:] }}", "{\"s\":\"héllo\",\"xs\":[1,2,3]}",
	  "élollého[2, 3][2, 3]");
	R("{{ m.a }}{{ m['b'] }}{{ m.c is defined }}{{ m.c is none }}", "{\"m\":{\"a\":1,\"b\":2}}", "12FalseFalse");
	R("{{ x is string }}{{ x is mapping }}{{ m is mapping }}{{ xs is iterable }}{{ 3 is odd }}{{ n is none }}",
	  "{\"x\":\"s\",\"m\":{},\"xs\":[],\"n\":null}", "TrueFalseTrueTrueTrueTrue");
	R("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\"\\n'|tojson }}|{{ d|tojson(separators=(',', ':')) }}",
	  "{\"d\":{\"a\":[1,2.5],\"b\":{}}}",
	  "{\"a\": [1, 2.5], \"b\": {}}|{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": {}\n}|\"é\\\"\\n\"|{\"a\":[1,2.5],\"b\":{}}");
	R("{{ ' a '|trim }}|{{ 'aB'|upper }}{{ 'aB'|lower }}|{{ xs|length }}{{ 'hé'|length }}|{{ u|default('d') }}|{{ xs|join(',') }}|{{ xs|first }}{{ xs|last }}|{{ 'aXa'|replace('a','b') }}|{{ 3|string }}|{{ '42'|int + 1 }}|{{ 'hello world'|title }}",
	  "{\"xs\":[1,2,3]}", "a|ABab|32|d|1,2,3|13|bXb|3|43|Hello World");
	R("{{ s.startswith('ab') }}{{ s.endswith(('x','c')) }}|{{ ' x '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ s.split('b') }}|{{ 'a b  c'.split() }}|{{ s.replace('b','B') }}|{{ s.upper() }}|{{ '{} {x}'.format(1, x=2) }}",
	  "{\"s\":\"abc\"}", "TrueTrue|x|a|['a', 'c']|['a', 'b', 'c']|aBc|ABC|1 2");
	R("{{ d.get('a') }}{{ d.get('z', 5) }}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}{{ d.keys()|list }}",
	  "{\"d\":{\"a\":1}}", "15a1['a']");
	R("{{ xs|selectattr('a', 'equalto', 1)|list|length }}{{ xs|map(attribute='a')|join }}{{ [0,1,2]|select('odd')|list }}",
	  "{\"xs\":[{\"a\":1},{\"a\":2}]}", "112[1]");
	R("{{ s|tojson(ensure_ascii=True) }}{{ d|tojson(sort_keys=True) }}", "{\"s\":\"é🎉\",\"d\":{\"b\":1,\"a\":[]}}",
	  "\"\\u00e9\\ud83c\\udf89\"{\"a\": [], \"b\": 1}");
	R("{% for x in 'abc' %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') }}{{ loop.revindex }} {% endfor %}",
	  NULL, "-ab3 abc2 bc-1 ");
	R("{{ 9 is divisibleby 3 }}{{ 2 is even }}{{ x is not defined }}{{ (1, 2)|list }}{{ (1,) }}", NULL,
	  "TrueTrueTrue[1, 2](1,)");
	R("{{ 'a,b,c'.split(',', 1) }}{{ 'x'.join(['1', '2']) }}{{ 'aXbX'.rstrip('X') }}{{ ' '|length }}", NULL,
	  "['a', 'b,c']1x2aXb1");
	R("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}", NULL, "ERR:1");
	R("{{ 1 < 'a' }}", NULL, "ERR:1");
	R("{{ strftime_now('%Y-%m-%d %b') }}", NULL, "2025-07-31 Jul");
	R("{{ 0.1 + 0.2 }} {{ 1e20 * 1.0 }} {{ 1e-5 * 1.0 }} {{ 10 / 4 }}", NULL, "0.30000000000000004 1e+20 1e-05 2.5");
	/* whitespace control: trim_blocks, lstrip_blocks, -, + */
	R("<\n  {% if 1 %}\n  x\n  {% endif %}\n>", NULL, "<\n  x\n>");
	R("a  {%- if 1 -%}  b  {%- endif -%}  c", NULL, "abc");
	R("a\n{{- 'b' -}}\nc", NULL, "abc");
	R("  {%+ if 1 %}x{% endif +%}\ny", NULL, "  x\ny");
	R("a {# c #}\n  {# d #}\nb\n", NULL, "a b");
	/* errors and the sandbox */
	R("{{ raise_exception('no ' ~ 'way') }}", NULL, "ERR:1");
	R("{{ ''.__class__ }}", NULL, "ERR:1");
	R("{{ m['__class__'] }}", "{\"m\":{}}", "ERR:1");
	R("{{ 'a'.format.__globals__ }}", NULL, "ERR:1");
	R("{{ x.y.z }}", NULL, "ERR:1");
	R("{% for i in range(100000000) %}{% endfor %}", NULL, "ERR:8");
	R("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, "ERR:8");
	R("{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}", NULL, "ERR:8");
	R("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "ERR:8");
	R("{% if x %}", NULL, "PARSE:5");
	R("{{ 1 + }}", NULL, "PARSE:5");
	R("{% extends 'x' %}", NULL, "PARSE:5");
	if (dump)
		return 0;
	{
		/* the refusal names the template and line, and raise_exception's message */
		char buf[2048], *o;
		T_CAPTURE(render("a\n\n{{ raise_exception('bad role: ' ~ r) }}", "{\"r\":\"x\"}"), &o, buf);
		free(o);
		T_OK(strstr(buf, "'t.jinja': line 3: raise_exception: bad role: x") != NULL, "%s", buf);
		T_CAPTURE(render("\n{{ ''.__class__ }}", NULL), &o, buf);
		free(o);
		T_OK(strstr(buf, "line 2: access to attribute '__class__'") != NULL, "%s", buf);
	}
	T_END();
}

/*
 * jinja.h — a sandboxed Jinja engine for the subset chat templates use.
 *
 * Renders Hugging Face chat templates as transformers does (jinja2 with
 * trim_blocks and lstrip_blocks, its tojson, raise_exception and strftime_now,
 * the loopcontrols extension, the {% generation %} tag rendered as its body).
 * Statements: if/elif/else, for (with an `if` filter, else, loop.*), set
 * (names, tuples in for, namespace attributes, set blocks), macro and calls,
 * raw, break/continue; expressions, filters, tests and the string/dict methods
 * listed in docs/tokenizer.md.  Whitespace control as jinja2 (-, +, one trailing
 * newline of the source dropped).
 *
 * Sandbox: only data keys and the listed methods are reachable (any attribute
 * starting with "_" and any other method is refused), loop iterations and macro
 * recursion are bounded, and the output is capped; a refusal names what is
 * refused and the template line.
 *
 * Leaves out: template inheritance/include/import, {% call %} blocks, filter
 * blocks, autoescape, recursive loops, Python's "%" string formatting.
 */
#ifndef RL_JINJA_H
#define RL_JINJA_H

#include <stddef.h>
#include <time.h>

#include <cjson/cJSON.h>

typedef struct rl_jinja rl_jinja;

/* Limits and the clock of one render; zero fields take the defaults. */
typedef struct rl_jinja_opts {
	size_t max_output;  /* bytes of output (default 16 MiB): RL_ETOOBIG */
	size_t max_iter;    /* loop iterations in all (default 1,000,000): RL_ETOOBIG */
	int max_depth;      /* macro call depth (default 64): RL_ETOOBIG */
	time_t now;         /* strftime_now's time (0: the current time), local */
} rl_jinja_opts;

/* Parse LEN bytes of SRC.  NAME (copied) names the template in messages.  On
 * success *out owns the template (rl_jinja_free).  RL_EFORMAT, logged as
 * "'NAME': line N: what", for a syntax error or a construct left out; RL_ENOMEM. */
int rl_jinja_parse(rl_jinja **out, const char *src, size_t len, const char *name);
/* The same, with the message of a failure written to ERR (ERRLEN bytes,
 * NUL-terminated) instead of the log: for a caller that parses ahead of use
 * and reports the error when the template is wanted. */
int rl_jinja_parse_msg(rl_jinja **out, const char *src, size_t len, const char *name, char *err, size_t errlen);
void rl_jinja_free(rl_jinja *t); /* accepts NULL */

/* Render T with the variables of the JSON object CTX (borrowed; NULL for
 * none).  *text (caller frees, NUL-terminated) and *len get the output.
 * Errors are logged as "'NAME': line N: what": RL_EINVAL (a type error, an
 * undefined name called, raise_exception's message, a refused attribute),
 * RL_ETOOBIG (a limit of OPTS; OPTS may be NULL), RL_ENOMEM.  A template is
 * read-only while rendering: any number of threads may render it at once. */
int rl_jinja_render(char **text, size_t *len, const rl_jinja *t, const cJSON *ctx, const rl_jinja_opts *opts);

#endif

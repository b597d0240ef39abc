/*
 * cli.c — option values and usage errors for the commands (see cli.h).
 * Leaves out: the option tables, help texts and config structs, which are
 * each command's own; reading YAML, which is conf.c's.
 */
#include "base/cli.h"
#include "base/conf.h"
#include "base/io.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *help_cmd;
static const struct option *opts;

/* The argv rl_cli_config made: [1, nconf] came from the file, each at
 * conf_line[i]; cur is the argument rl_cli_getopt last parsed (-1 when the
 * loop is over). */
static char **new_argv, **conf_args, *conf_path;
static int nconf, *conf_line, cur = -1;
static const char *const *repeatable;

void
rl_cli_init(const char *cmd, const struct option *longopts)
{
	help_cmd = cmd;
	opts = longopts;
	repeatable = NULL;
}

int
rl_cli_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (cur >= 1 && cur <= nconf) {
		char msg[1024];
		vsnprintf(msg, sizeof msg, fmt, ap);
		rl_error("'%s': line %d: %s", conf_path, conf_line[cur], msg);
	} else {
		rl_vlog(-1, NULL, fmt, ap);
	}
	va_end(ap);
	rl_hint("%s --help lists the options", help_cmd ? help_cmd : rl_log_prog());
	return 2;
}

const char *
rl_cli_opt(int c)
{
	static char buf[64];

	for (const struct option *o = opts; o && o->name; o++) {
		if (o->val == c && o->flag == NULL) {
			snprintf(buf, sizeof buf, "--%s", o->name);
			return buf;
		}
	}
	snprintf(buf, sizeof buf, "-%c", c > 32 && c < 127 ? c : '?');
	return buf;
}

int
rl_cli_double(int c, const char *arg, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (end == arg || *end || !isfinite(v) || !(v >= lo && v <= hi))
		return rl_cli_usage("%s: bad value '%s' (a number from %.10g to %.10g)", rl_cli_opt(c), arg, lo, hi);
	*out = v;
	return 0;
}

int
rl_cli_int(int c, const char *arg, long long lo, long long hi, long long *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(arg, &end, 10);
	if (end == arg || *end || errno == ERANGE || v < lo || v > hi)
		return rl_cli_usage("%s: bad value '%s' (a whole number from %lld to %lld)", rl_cli_opt(c), arg, lo, hi);
	*out = v;
	return 0;
}

int
rl_cli_int32(int c, const char *arg, int lo, int hi, int *out)
{
	long long v;
	int rv;

	if ((rv = rl_cli_int(c, arg, lo, hi, &v)) != 0)
		return rv;
	*out = (int)v;
	return 0;
}

int
rl_cli_u64(int c, const char *arg, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	/* strtoull takes "-1" as 2^64-1: only digits */
	if (*arg < '0' || *arg > '9' || (v = strtoull(arg, &end, 10), *end) || errno == ERANGE)
		return rl_cli_usage("%s: bad value '%s' (a whole number from 0 to %llu)", rl_cli_opt(c), arg,
				    (unsigned long long)UINT64_MAX);
	*out = (uint64_t)v;
	return 0;
}

int
rl_cli_bytes(int c, const char *arg, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	double v, mul = 1;

	errno = 0;
	v = strtod(arg, &end);
	if (end == arg || !(v >= 0) || !isfinite(v))
		goto bad;
	switch (*end) {
	case 0: break;
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	default: goto bad;
	}
	if (mul > 1 && end[0] == 'i' && end[1] == 'B')
		end += 2;   /* 64MiB */
	else if (*end == 'B' || *end == 'b')
		end++;
	/* a fraction of a byte is a typo, not a size */
	if (*end || v * mul != floor(v * mul) || v * mul < (double)lo || v * mul > (double)hi)
		goto bad;
	*out = (uint64_t)(v * mul);
	return 0;
bad:
	return rl_cli_usage("%s: bad value '%s' (a size from %llu to %llu bytes; k, M, G suffixes)", rl_cli_opt(c), arg,
			    (unsigned long long)lo, (unsigned long long)hi);
}

int
rl_cli_getopt(int argc, char *const *argv, const char *shortopts, int *longindex)
{
	int c = getopt_long(argc, argv, shortopts, opts, longindex);

	cur = c == -1 ? -1 : optind - 1;
	return c;
}

void
rl_cli_repeatable(const char *const *names)
{
	repeatable = names;
}

static int
is_repeatable(const char *name)
{
	for (const char *const *r = repeatable; r && *r; r++)
		if (strcmp(*r, name) == 0)
			return 1;
	return 0;
}

/* the usage error's hint line alone, after a message printed already */
static int
hint_only(void)
{
	rl_hint("%s --help lists the options", help_cmd ? help_cmd : rl_log_prog());
	return 2;
}

static void
conf_free(void)
{
	for (int i = 1; i <= nconf; i++)
		free(conf_args[i]);
	free(conf_args);
	free(conf_line);
	free(new_argv);
	free(conf_path);
	conf_args = new_argv = NULL;
	conf_line = NULL;
	conf_path = NULL;
	nconf = 0;
	cur = -1;
}

/* YAML 1.1 and 1.2 spellings of a boolean: 1 true, 0 false, -1 neither */
static int
yaml_bool(const char *v)
{
	static const char *const t[] = { "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON" };
	static const char *const f[] = { "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF" };

	for (size_t i = 0; i < RL_ARRAY_LEN(t); i++) {
		if (strcmp(v, t[i]) == 0)
			return 1;
		if (strcmp(v, f[i]) == 0)
			return 0;
	}
	return -1;
}

/* The argument for entry e, or NULL when a switch is false; *bad says why
 * the entry cannot be an option (NULL: it can). */
static char *
conf_arg(const rl_conf_entry *e, const struct option *o, const char **bad)
{
	char *a;
	int b;

	*bad = NULL;
	if (e->type == RL_CONF_MAPPING || e->type == RL_CONF_NESTED) {
		*bad = "wrong type: a mapping or a nested list, not a value";
		return NULL;
	}
	if (e->in_seq && !is_repeatable(o->name)) {
		*bad = "wrong type: a list, for an option given once";
		return NULL;
	}
	if (o->has_arg == no_argument || (o->has_arg == optional_argument && e->type != RL_CONF_SCALAR)) {
		b = e->type == RL_CONF_SCALAR ? yaml_bool(e->val) : o->has_arg == optional_argument ? 1 : -1;
		if (b < 0 || (e->in_seq && o->has_arg == no_argument)) {
			*bad = "wrong type: a switch takes true or false";
			return NULL;
		}
	} else if (o->has_arg == optional_argument && (b = yaml_bool(e->val)) >= 0) {
		;
	} else if (e->type == RL_CONF_NULL) {
		*bad = "no value";
		return NULL;
	} else {
		b = 2;
	}
	if (b == 0)
		return NULL;
	if ((a = rl_try_malloc(strlen(o->name) + strlen(e->val) + 4, "an option from a run file")) == NULL)
		return NULL;
	if (b == 1)
		sprintf(a, "--%s", o->name);
	else
		sprintf(a, "--%s=%s", o->name, e->val);
	return a;
}

/* Finds --config in argv[1..] before "--": its index (the FILE is at *file),
 * 0 if none, -1 after printing a usage error. */
static int
find_config(int argc, char **argv, const char **file)
{
	int at = 0;

	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		const char *f = NULL;
		if (strcmp(argv[i], "--config") == 0)
			f = i + 1 < argc ? argv[i + 1] : "";
		else if (strncmp(argv[i], "--config=", 9) == 0)
			f = argv[i] + 9;
		else
			continue;
		if (at) {
			rl_cli_usage("--config: given twice ('%s' and '%s')", *file, f);
			return -1;
		}
		if (!*f) {
			rl_cli_usage("--config: needs a FILE");
			return -1;
		}
		at = i;
		*file = f;
	}
	return at;
}

int
rl_cli_config(int *argc, char ***argv)
{
	rl_conf c = { 0 };
	const char *file = NULL, *bad;
	int at, skip, n = 0, rv = 2;

	conf_free();
	if ((at = find_config(*argc, *argv, &file)) <= 0)
		return at < 0 ? 2 : 0;
	skip = strcmp((*argv)[at], "--config") == 0 ? 2 : 1;
	if (rl_conf_read(&c, file) != 0)
		return hint_only();
	if ((conf_path = strdup(file)) == NULL ||
	    (conf_args = rl_try_calloc(c.n + 1, sizeof *conf_args, "a run file's options")) == NULL ||
	    (conf_line = rl_try_calloc(c.n + 1, sizeof *conf_line, "a run file's options")) == NULL ||
	    (new_argv = rl_try_calloc(c.n + (size_t)*argc + 1, sizeof *new_argv, "a run file's options")) == NULL) {
		rl_error("out of memory reading '%s'", file);
		rv = 1;
		goto out;
	}
	for (size_t i = 0; i < c.n; i++) {
		const rl_conf_entry *e = &c.e[i];
		const struct option *o = opts;
		char *a;
		while (o && o->name && strcmp(o->name, e->key) != 0)
			o++;
		if (!o || !o->name || !strcmp(e->key, "config") || !strcmp(e->key, "help")) {
			rl_error("'%s': line %d: unknown key '%s'", file, e->line, e->key);
			rl_hint("the keys are the long options of '%s --help' without their dashes (not help or config)",
			    help_cmd ? help_cmd : rl_log_prog());
			goto out;
		}
		a = conf_arg(e, o, &bad);
		if (bad) {
			rl_error("'%s': line %d: key '%s': %s", file, e->line, e->key, bad);
			rl_hint("%s --help says what --%s takes", help_cmd ? help_cmd : rl_log_prog(), e->key);
			goto out;
		}
		if (a == NULL && (o->has_arg == no_argument || yaml_bool(e->val) == 0))
			continue;   /* a switch set to false */
		if (a == NULL) {
			rv = 1;
			goto out;
		}
		conf_args[++n] = a;
		conf_line[n] = e->line;
	}
	nconf = n;
	new_argv[0] = (*argv)[0];
	for (int i = 1; i <= n; i++)
		new_argv[i] = conf_args[i];
	for (int i = 1, k = n + 1; i < *argc; i++)
		if (i < at || i >= at + skip)
			new_argv[k++] = (*argv)[i];
	*argc = *argc - skip + n;
	*argv = new_argv;
	rv = 0;
out:
	if (rv != 0) {
		nconf = n;
		conf_free();
	}
	rl_conf_fini(&c);
	return rv;
}

#ifndef RL_VERSION
#define RL_VERSION "unknown"
#endif

const char *
rl_cli_version(void)
{
	return RL_VERSION;
}

int
rl_cli_wants_version(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "--version") == 0)
			return 1;
	return 0;
}

int
rl_cli_print_version(void)
{
	printf("%s (rlpipe) %s\n", rl_log_prog(), RL_VERSION);
	return rl_io_close_stdout() ? 1 : 0;
}

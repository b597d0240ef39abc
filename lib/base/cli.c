/*
 * cli.c — option values and usage errors for the commands (see cli.h).
 * Leaves out: the option tables, help texts and config structs, which are
 * each command's own.
 */
#include "base/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *help_cmd;
static const struct option *opts;

void
rl_cli_init(const char *cmd, const struct option *longopts)
{
	help_cmd = cmd;
	opts = longopts;
}

int
rl_cli_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rl_vlog(-1, NULL, fmt, ap);
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

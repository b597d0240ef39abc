/*
 * core.c — error strings, logging, checked allocation, size arithmetic and the
 * stop signals.
 */
#include "base/core.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const errstr[RL_ERR_COUNT] = {
	[RL_OK] = "success",
	[RL_EINVAL] = "invalid argument",
	[RL_ENOMEM] = "out of memory",
	[RL_EIO] = "input/output error",
	[RL_ENOENT] = "not found",
	[RL_EFORMAT] = "malformed input",
	[RL_EVERSION] = "unsupported version",
	[RL_ECHECKSUM] = "checksum mismatch",
	[RL_ETOOBIG] = "size over limit",
	[RL_ESHAPE] = "shape or dtype mismatch",
	[RL_ETIMEDOUT] = "timed out",
	[RL_ECLOSED] = "closed",
	[RL_EBUSY] = "busy, try again",
	[RL_ESTALE] = "stale data",
	[RL_ENOTSUP] = "not supported",
	[RL_ENODEV] = "no such device",
	[RL_EDEVICE] = "device error",
	[RL_ENET] = "network error",
	[RL_EEXIST] = "already exists",
	[RL_EINTR] = "interrupted",
};

const char *
rl_strerror(int rv)
{
	if (rv < 0 || rv >= RL_ERR_COUNT || errstr[rv] == NULL)
		return "unknown error";
	return errstr[rv];
}

static const char *log_prog = "rlpipe";
static int log_lvl = RL_LOG_NORMAL;
static pthread_mutex_t log_mtx = PTHREAD_MUTEX_INITIALIZER;

void rl_log_init(const char *prog, int level) { if (prog) log_prog = prog; log_lvl = level; }
void rl_log_set_level(int level) { log_lvl = level; }
int rl_log_level(void) { return log_lvl; }
const char *rl_log_prog(void) { return log_prog; }

void
rl_vlog(int level, const char *prefix, const char *fmt, va_list ap)
{
	char buf[4096];

	if (level > log_lvl)
		return;
	vsnprintf(buf, sizeof buf, fmt, ap);
	pthread_mutex_lock(&log_mtx);
	fprintf(stderr, "%s: %s%s\n", log_prog, prefix ? prefix : "", buf);
	fflush(stderr);
	pthread_mutex_unlock(&log_mtx);
}

#define DEFLOG(name, level, prefix)                 \
	void name(const char *fmt, ...)             \
	{                                           \
		va_list ap;                         \
		va_start(ap, fmt);                  \
		rl_vlog(level, prefix, fmt, ap);    \
		va_end(ap);                         \
	}
DEFLOG(rl_error, -1, NULL)
DEFLOG(rl_warn, RL_LOG_NORMAL, "warning: ")
DEFLOG(rl_info, RL_LOG_NORMAL, NULL)
DEFLOG(rl_verbose, RL_LOG_VERBOSE, NULL)
DEFLOG(rl_debug, RL_LOG_DEBUG, NULL)
DEFLOG(rl_hint, -1, "hint: ")

void *
rl_try_malloc(size_t n, const char *what)
{
	void *p = malloc(n ? n : 1);
	if (p == NULL)
		rl_error("cannot allocate %zu bytes for %s", n, what ? what : "buffer");
	return p;
}

void *
rl_try_calloc(size_t count, size_t size, const char *what)
{
	void *p = calloc(count ? count : 1, size ? size : 1);
	if (p == NULL)
		rl_error("cannot allocate %zu x %zu bytes for %s", count, size, what ? what : "buffer");
	return p;
}

void *
rl_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (p == NULL) {
		fprintf(stderr, "%s: out of memory (%zu bytes)\n", log_prog, n);
		abort();
	}
	return p;
}

void *
rl_xcalloc(size_t count, size_t size)
{
	void *p = calloc(count ? count : 1, size ? size : 1);
	if (p == NULL) {
		fprintf(stderr, "%s: out of memory (%zu x %zu bytes)\n", log_prog, count, size);
		abort();
	}
	return p;
}

char *
rl_xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(rl_xmalloc(n), s, n);
}

int
rl_mul_size(size_t *out, size_t a, size_t b)
{
	if (__builtin_mul_overflow(a, b, out))
		return RL_ETOOBIG;
	return RL_OK;
}

int
rl_add_size(size_t *out, size_t a, size_t b)
{
	if (__builtin_add_overflow(a, b, out))
		return RL_ETOOBIG;
	return RL_OK;
}

double
rl_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double
rl_wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const struct { const char *name; size_t size; } dtypes[RL_DTYPE_COUNT] = {
	[RL_F32] = { "F32", 4 }, [RL_BF16] = { "BF16", 2 }, [RL_F16] = { "F16", 2 },
	[RL_F64] = { "F64", 8 }, [RL_I8] = { "I8", 1 }, [RL_U8] = { "U8", 1 },
	[RL_I16] = { "I16", 2 }, [RL_I32] = { "I32", 4 }, [RL_U32] = { "U32", 4 },
	[RL_I64] = { "I64", 8 }, [RL_U64] = { "U64", 8 }, [RL_BOOL] = { "BOOL", 1 },
};

size_t rl_dtype_size(int dt) { return dt >= 0 && dt < RL_DTYPE_COUNT ? dtypes[dt].size : 0; }
const char *rl_dtype_name(int dt) { return dt >= 0 && dt < RL_DTYPE_COUNT ? dtypes[dt].name : "?"; }

int
rl_dtype_parse(const char *name)
{
	for (int i = 0; i < RL_DTYPE_COUNT; i++)
		if (strcmp(name, dtypes[i].name) == 0)
			return i;
	return -1;
}

float
rl_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	union { uint32_t u; float f; } v;

	if (exp == 0) {
		if (man == 0) {
			u = sign;
		} else { /* subnormal: normalise */
			exp = 127 - 15 + 1;
			while (!(man & 0x400)) { man <<= 1; exp--; }
			u = sign | (exp << 23) | ((man & 0x3ff) << 13);
		}
	} else if (exp == 31) {
		u = sign | 0x7f800000u | (man << 13);
	} else {
		u = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	v.u = u;
	return v.f;
}

uint16_t
rl_f32_to_f16(float f)
{
	union { float f; uint32_t u; } v = { f };
	uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00);
	if (a >= 0x477ff000u) /* rounds to >= 65520: inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) { /* subnormal or zero in f16 */
		if (a < 0x33000000u)
			return (uint16_t)sign;
		uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
		/* value = m * 2^(e-150); f16 subnormal unit 2^-24: q = m * 2^(e-126) */
		uint32_t sh = 126 - e; /* 14..24 */
		uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
		return (uint16_t)(sign | q);
	}
	uint32_t r = a + 0xfff + ((a >> 13) & 1) - 0x38000000u;
	return (uint16_t)(sign | (r >> 13));
}

/* the stage's handler, and what a second stop signal writes before it
 * ends the process (made when the handler is installed: the signal handler
 * only counts and writes) */
static void (*stop_h)(int);
static volatile sig_atomic_t stop_seen;
static char stop_msg[160];
static size_t stop_len;

static void
stop_wrap(int sig)
{
	if (stop_seen++ > 0) {
		ssize_t w = write(2, stop_msg, stop_len);
		(void)w;
		_exit(128 + sig);
	}
	if (stop_h)
		stop_h(sig);
}

void
rl_stop_signals(void (*h)(int), int sa_flags)
{
	struct sigaction sa, old;
	int n;

	n = snprintf(stop_msg, sizeof stop_msg, "%s: a second stop signal: exiting at once\n", log_prog);
	stop_len = n > 0 && (size_t)n < sizeof stop_msg ? (size_t)n : 0;
	stop_h = h;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = stop_wrap;
	sa.sa_flags = sa_flags & ~SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	if (sigaction(SIGINT, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
		return;
	sigaction(SIGINT, &sa, NULL);
}

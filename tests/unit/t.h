/*
 * t.h — the C unit tests' few macros.  Each test binary prints one line per
 * failure ("FAIL file:line: ...") and a one-line verdict, and exits 0 when
 * everything passed, 1 on any failure, 77 when it skipped itself (T_SKIP).
 */
#ifndef RL_T_H
#define RL_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_fail, t_pass;
static const char *t_name = "test";

#define T_BEGIN(name) (t_name = (name))
#define T_OK(cond, ...)                                                          \
	do {                                                                     \
		if (cond) {                                                      \
			t_pass++;                                                \
		} else {                                                         \
			t_fail++;                                                \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, " " __VA_ARGS__);                        \
			fputc('\n', stderr);                                     \
		}                                                                \
	} while (0)
#define T_EQ_INT(a, b)                                                           \
	do {                                                                     \
		long long t_a_ = (long long)(a), t_b_ = (long long)(b);          \
		T_OK(t_a_ == t_b_, "%lld, expected %lld", t_a_, t_b_);           \
	} while (0)
#define T_EQ_STR(a, b)                                                           \
	do {                                                                     \
		const char *t_a_ = (a), *t_b_ = (b);                             \
		T_OK(strcmp(t_a_, t_b_) == 0, "\"%s\", expected \"%s\"", t_a_, t_b_); \
	} while (0)
/* |a-b| <= atol + rtol*|b| (b is the reference) */
#define T_CLOSE(a, b, atol, rtol)                                                \
	do {                                                                     \
		double t_a_ = (double)(a), t_b_ = (double)(b);                   \
		T_OK(fabs(t_a_ - t_b_) <= (atol) + (rtol) * fabs(t_b_) && !isnan(t_a_), \
		    "%.9g vs ref %.9g", t_a_, t_b_);                             \
	} while (0)
#define T_SKIP(...)                                                              \
	do {                                                                     \
		printf("%s: skipped: ", t_name);                                 \
		printf(__VA_ARGS__);                                             \
		printf("\n");                                                    \
		exit(77);                                                        \
	} while (0)
#define T_END()                                                                  \
	do {                                                                     \
		printf("%s: %s (%d checks, %d failed)\n", t_name,                \
		       t_fail ? "FAIL" : "ok", t_pass + t_fail, t_fail);         \
		return t_fail ? 1 : 0;                                           \
	} while (0)

/* T_CAPTURE(expr, rvp, buf): runs *rvp = expr with fd 2 redirected to a
 * temporary file, then puts what it wrote to stderr in the char array buf
 * (NUL-terminated, cut to its size).  For checking error messages. */
#define T_CAPTURE(expr, rvp, buf)                                              \
	do {                                                                   \
		FILE *tf_ = tmpfile();                                         \
		int saved_ = dup(2);                                           \
		fflush(stderr);                                                \
		dup2(fileno(tf_), 2);                                          \
		*(rvp) = (expr);                                               \
		fflush(stderr);                                                \
		dup2(saved_, 2);                                               \
		close(saved_);                                                 \
		rewind(tf_);                                                   \
		size_t n_ = fread((buf), 1, sizeof(buf) - 1, tf_);             \
		(buf)[n_] = 0;                                                 \
		fclose(tf_);                                                   \
	} while (0)

#endif

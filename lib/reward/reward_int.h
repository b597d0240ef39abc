/*
 * reward_int.h — what the verifier files of lib/reward share and no caller sees:
 * the character classes, the number type the numeric verifiers compare
 * (scan.c), and each task's scoring function that tasks.c dispatches to.
 *
 * Leaves out: the public verifiers and the scorer (reward.h).
 */
#ifndef RL_REWARD_INT_H
#define RL_REWARD_INT_H

#include <stddef.h>

#include "reward/reward.h"

/* *w = s when w is not NULL: the verifiers' optional reason */
#define SET_WHY(w, s) do { if (w) *(w) = (s); } while (0)

static inline int is_digit(int c) { return c >= '0' && c <= '9'; }
static inline int
is_space(int c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* *s, *n: the text without the whitespace at either end */
static inline void
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

/* ---- scan.c ------------------------------------------------------------------------ */

/* v = the value d alone (dec 0: compared within a relative 1e-9). */
void rli_reward_num_value(num *v, double d);
/* v = the decimal raw[0..n) (sign, digits, optional fraction): value and canonical text. */
void rli_reward_num_decimal(num *v, const char *raw, size_t n);
/* 1 when a and b are the same number (see num), else 0. */
int rli_reward_num_eq(const num *a, const num *b);
/* Scans the number at s[i] (a digit, or '-' before one) into *val; the index after it. */
size_t rli_reward_scan_number(num *val, const char *s, size_t n, size_t i);
/* 1 when a number starts at s[i]: a digit, or '-' before a digit not after a digit. */
int rli_reward_number_starts(const char *s, size_t n, size_t i);
/* The last number in s[0..n) into *val: 0, or -1 when there is none. */
int rli_reward_last_number(num *val, const char *s, size_t n);

/* ---- the tasks' scoring functions: 0 and *score (0 for a wrong answer, *why saying
 * why), RL_EFORMAT when the truth is unusable, RL_ENOMEM (dapo) ------------------------ */

int rli_reward_gsm8k_score(double *score, const char **why, const char *resp, size_t n, const char *truth,
    int mode);  /* reward.c */
int rli_reward_math_score(double *score, const char **why, const char *resp, size_t n,
    const char *truth); /* math.c */
int rli_reward_dapo_score(double *score, const char **why, const char *resp, size_t n,
    const char *truth); /* math.c */

#endif

/*
 * reward.c — the small verifiers: gsm8k ("####" or the last number), exact,
 * arith, length and the UTF-8 length they use.
 *
 * Each is a pure function of its arguments.  The rest of lib/reward: number
 * scanning (scan.c), math and dapo (math.c), countdown (countdown.c), the task
 * list and ground truth (tasks.c), scoring records, streams and the queue
 * (score.c), the --exec coprocesses (reward_exec.c).
 */
#include "reward/reward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "reward/reward_int.h"

/* ---- gsm8k ---------------------------------------------------------------------- */

/* Last occurrence of "####" in s[0..n), or NULL. */
static const char *
last_hashes(const char *s, size_t n)
{
	if (n < 4)
		return NULL;
	for (size_t i = n - 4 + 1; i-- > 0;)
		if (s[i] == '#' && s[i + 1] == '#' && s[i + 2] == '#' && s[i + 3] == '#')
			return s + i;
	return NULL;
}

/* The number right after the last "####" (spaces and '$' allowed between). */
static int
after_hashes(num *val, const char *s, size_t n)
{
	const char *h = last_hashes(s, n);
	size_t i;

	if (!h)
		return -1;
	i = (size_t)(h - s) + 4;
	while (i < n && (is_space((unsigned char)s[i]) || s[i] == '$'))
		i++;
	if (i >= n || !(is_digit((unsigned char)s[i]) || (s[i] == '-' && i + 1 < n && is_digit((unsigned char)s[i + 1]))))
		return -2;
	rli_reward_scan_number(val, s, n, i);
	return 0;
}

static int
gsm8k_truth(num *val, const char *truth)
{
	size_t n = strlen(truth), i = 0;
	const char *h = last_hashes(truth, n);

	if (h) {
		i = (size_t)(h - truth) + 4;
	}
	while (i < n && (is_space((unsigned char)truth[i]) || truth[i] == '$'))
		i++;
	if (i >= n || !rli_reward_number_starts(truth, n, i))
		return -1;
	rli_reward_scan_number(val, truth, n, i);
	return 0;
}

int
rli_reward_gsm8k_score(double *score, const char **why, const char *resp, size_t n, const char *truth, int mode)
{
	num want, got;
	int rv;

	*score = 0;
	if (gsm8k_truth(&want, truth) != 0) {
		SET_WHY(why, "ground truth is not a number");
		return RL_EFORMAT;
	}
	if (mode == RL_GSM8K_FLEXIBLE) {
		if (rli_reward_last_number(&got, resp, n) != 0) {
			SET_WHY(why, "no number in response");
			return 0;
		}
	} else if ((rv = after_hashes(&got, resp, n)) != 0) {
		SET_WHY(why, rv == -1 ? "no #### in response" : "no number after ####");
		return 0;
	}
	if (rli_reward_num_eq(&got, &want)) {
		*score = 1;
		SET_WHY(why, NULL);
	} else {
		SET_WHY(why, got.dec < 0 || want.dec < 0 ? "number too long to compare" : "wrong answer");
	}
	return 0;
}

double
rl_reward_gsm8k(const char *resp, size_t n, const char *truth, int mode, const char **why)
{
	double s;

	rli_reward_gsm8k_score(&s, why, resp, n, truth, mode);
	return s;
}

/* ---- exact, arith, length --------------------------------------------------------- */

double
rl_reward_exact(const char *resp, size_t n, const char *truth, const char **why)
{
	size_t tn = strlen(truth);

	trim(&resp, &n);
	trim(&truth, &tn);
	if (n == tn && memcmp(resp, truth, n) == 0) {
		SET_WHY(why, NULL);
		return 1;
	}
	SET_WHY(why, "not equal");
	return 0;
}

double
rl_reward_arith(const char *resp, size_t n, const char *truth, const char **why)
{
	size_t i = 0, b, tn = strlen(truth);

	while (i < n && resp[i] == ' ')
		i++;
	b = i;
	if (i < n && resp[i] == '-')
		i++;
	if (i >= n || !is_digit((unsigned char)resp[i])) {
		SET_WHY(why, "response does not start with a number");
		return 0;
	}
	while (i < n && is_digit((unsigned char)resp[i]))
		i++;
	if (i < n && !is_space((unsigned char)resp[i])) {
		SET_WHY(why, "number not followed by the end or a space");
		return 0;
	}
	trim(&truth, &tn);
	if (i - b == tn && memcmp(resp + b, truth, tn) == 0) {
		SET_WHY(why, NULL);
		return 1;
	}
	SET_WHY(why, "wrong answer");
	return 0;
}

double
rl_reward_length(long len, long max_len)
{
	double p;

	if (max_len <= 0 || len <= max_len)
		return 0;
	p = -(double)(len - max_len) / (double)max_len;
	return p < -1 ? -1 : p;
}

long
rl_reward_utf8_len(const char *s, size_t n)
{
	long c = 0;

	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xc0) != 0x80;
	return c;
}

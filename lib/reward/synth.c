/*
 * synth.c — the `arith` task generator (see synth.h for the contract).
 *
 * Draws come from the shared counter-based RNG (rng.h): problem i uses
 * counters derived from i only, so files are reproducible and problems can be
 * made in any order or in parallel.
 */
#include "reward/synth.h"

#include "base/core.h"
#include "base/rng.h"

#include <stdio.h>
#include <string.h>

void
rl_synth_arith_init(rl_synth_arith *o)
{
	memset(o, 0, sizeof *o);
	o->digits = 2;
	strcpy(o->ops, "+");
	o->split = RL_SPLIT_ALL;
}

int
rl_synth_arith_check(const rl_synth_arith *o)
{
	size_t n = strnlen(o->ops, sizeof o->ops);

	if (o->digits < 1 || o->digits > 9) {
		rl_error("arith: digits must be 1 to 9, not %d", o->digits);
		return RL_EINVAL;
	}
	if (n == 0 || n == sizeof o->ops || strspn(o->ops, "+-*") != n) {
		rl_error("arith: operators must be some of \"+-*\", not \"%.*s\"", (int)n, o->ops);
		return RL_EINVAL;
	}
	if (o->split < RL_SPLIT_ALL || o->split > RL_SPLIT_TEST) {
		rl_error("arith: bad split %d", o->split);
		return RL_EINVAL;
	}
	return 0;
}

int
rl_synth_arith_is_test(int64_t a, char op, int64_t b)
{
	/* a fixed seed: the split must not depend on the run's seed */
	uint64_t h = rl_rng_u64(0x5e11a7e5ULL, ((uint64_t)a << 34) ^ ((uint64_t)(unsigned char)op << 56) ^ (uint64_t)b);
	return h % 10 == 0;
}

int
rl_synth_arith_make(char *prompt, size_t pcap, char *answer, size_t acap, const rl_synth_arith *o, uint64_t i)
{
	int64_t lim = 1, a, b, r;
	size_t nops = strnlen(o->ops, sizeof o->ops);
	char op, num[32];
	int len;

	if (rl_synth_arith_check(o) != 0)
		return RL_EINVAL;
	for (int d = 0; d < o->digits; d++)
		lim *= 10;
	/* Rejection sampling into the split: 64 draws per problem, each with its
	 * own counter, so problem i never depends on problem i-1. */
	for (uint64_t t = 0;; t++) {
		uint64_t c = (i << 8 | (t & 0xff)) * 3;
		a = (int64_t)(rl_rng_u64(o->seed, c) % (uint64_t)lim);
		b = (int64_t)(rl_rng_u64(o->seed, c + 1) % (uint64_t)lim);
		op = o->ops[rl_rng_u64(o->seed, c + 2) % nops];
		if (o->split == RL_SPLIT_ALL || t >= 255 ||
		    rl_synth_arith_is_test(a, op, b) == (o->split == RL_SPLIT_TEST))
			break;
	}
	r = op == '+' ? a + b : op == '-' ? a - b : a * b;
	len = snprintf(prompt, pcap, "%lld%c%lld=", (long long)a, op, (long long)b);
	if (len < 0 || (size_t)len >= pcap)
		return RL_EINVAL;
	len = snprintf(num, sizeof num, "%lld", (long long)r);
	if (o->reverse) {
		/* digits reversed, the sign stays in front */
		int s = num[0] == '-';
		for (int x = s, y = len - 1; x < y; x++, y--) {
			char tmp = num[x];
			num[x] = num[y];
			num[y] = tmp;
		}
	}
	if ((size_t)len >= acap)
		return RL_EINVAL;
	memcpy(answer, num, (size_t)len + 1);
	return 0;
}

int
rl_synth_arith_write(FILE *f, const rl_synth_arith *o, uint64_t n)
{
	char p[32], a[32];
	int rv;

	if ((rv = rl_synth_arith_check(o)) != 0)
		return rv;
	for (uint64_t i = 0; i < n; i++) {
		if ((rv = rl_synth_arith_make(p, sizeof p, a, sizeof a, o, i)) != 0)
			return rv;
		/* prompts and answers are digits and + - * =: nothing to escape */
		if (fprintf(f, "{\"prompt\":\"%s\",\"answer\":\"%s\",\"task\":\"arith\"}\n", p, a) < 0) {
			rl_error("arith: write failed");
			return RL_EIO;
		}
	}
	return 0;
}

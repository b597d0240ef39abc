/*
 * tasks.c — the task list: parsing --task specs (names, weights, the PCRE2
 * patterns of regex: and format:), the ground truth in a record's meta, the
 * kind `auto` stands for, and rl_reward_task_score, which runs one task.
 *
 * Leaves out: the verifiers themselves (reward.c, math.c, countdown.c), combining
 * the tasks into a record's reward (score.c).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "reward/reward.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/core.h"
#include "reward/reward_int.h"

/* ---- tasks ---------------------------------------------------------------------- */

static const char *const kind_names[RL_TASK_KIND_COUNT] = {
	[RL_TASK_GSM8K] = "gsm8k",   [RL_TASK_MATH] = "math",     [RL_TASK_COUNTDOWN] = "countdown",
	[RL_TASK_EXACT] = "exact",   [RL_TASK_REGEX] = "regex",   [RL_TASK_FORMAT] = "format",
	[RL_TASK_LENGTH] = "length", [RL_TASK_ARITH] = "arith",     [RL_TASK_DAPO] = "dapo",
	[RL_TASK_AUTO] = "auto",
};

static int
parse_weight(double *w, const char *s, size_t n)
{
	char buf[64], *end;

	if (n == 0 || n >= sizeof buf)
		return -1;
	memcpy(buf, s, n);
	buf[n] = 0;
	*w = strtod(buf, &end);
	return (*end || !isfinite(*w)) ? -1 : 0;
}

static int
name_taken(const char *name, const rl_reward_task *taken, size_t ntaken)
{
	for (size_t i = 0; i < ntaken; i++)
		if (strcmp(taken[i].name, name) == 0)
			return 1;
	return 0;
}

int
rl_reward_task_parse(rl_reward_task *t, const char *spec, const rl_reward_task *taken, size_t ntaken)
{
	const char *colon = strchr(spec, ':');
	size_t nl = colon ? (size_t)(colon - spec) : strlen(spec);
	int kind = -1, errc;
	PCRE2_SIZE erroff;

	memset(t, 0, sizeof *t);
	t->weight = 1.0;
	for (int k = 0; k < RL_TASK_KIND_COUNT; k++)
		if (strlen(kind_names[k]) == nl && memcmp(kind_names[k], spec, nl) == 0)
			kind = k;
	if (kind < 0) {
		rl_error("unknown task '%.*s'", (int)nl, spec);
		rl_hint("tasks: gsm8k math dapo countdown exact regex:PATTERN format:PATTERN length arith auto");
		return RL_EINVAL;
	}
	t->kind = kind;
	if (kind == RL_TASK_REGEX || kind == RL_TASK_FORMAT) {
		const char *pat, *c2;
		if (!colon || !colon[1]) {
			rl_error("task '%s' needs a pattern: %s[:WEIGHT]:PATTERN", spec, kind_names[kind]);
			return RL_EINVAL;
		}
		pat = colon + 1;
		c2 = strchr(pat, ':');
		if (c2 && parse_weight(&t->weight, pat, (size_t)(c2 - pat)) == 0)
			pat = c2 + 1;
		else
			t->weight = 1.0;
		if (!*pat) {
			rl_error("task '%s' has an empty pattern", spec);
			return RL_EINVAL;
		}
		t->pattern = rl_xstrdup(pat);
		t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
				      PCRE2_UTF | PCRE2_DOTALL | PCRE2_MATCH_INVALID_UTF, &errc, &erroff, NULL);
		if (!t->re) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(errc, msg, sizeof msg);
			rl_error("task '%s': bad pattern at offset %zu: %s", spec, (size_t)erroff, (char *)msg);
			free(t->pattern);
			t->pattern = NULL;
			return RL_EINVAL;
		}
		pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
	} else if (colon) {
		if (parse_weight(&t->weight, colon + 1, strlen(colon + 1)) != 0) {
			rl_error("task '%s': weight '%s' is not a number", spec, colon + 1);
			return RL_EINVAL;
		}
	}
	snprintf(t->name, sizeof t->name, "%s", kind_names[kind]);
	for (int k = 2; name_taken(t->name, taken, ntaken); k++)
		snprintf(t->name, sizeof t->name, "%s%d", kind_names[kind], k);
	return 0;
}

void
rl_reward_task_fini(rl_reward_task *t)
{
	if (!t)
		return;
	pcre2_code_free(t->re);
	free(t->pattern);
	t->re = NULL;
	t->pattern = NULL;
}

static const char *
json_scalar(const cJSON *j, char *buf, size_t cap)
{
	if (cJSON_IsString(j))
		return j->valuestring;
	if (cJSON_IsNumber(j) && isfinite(j->valuedouble) && rl_reward_decimal(buf, cap, j->valuedouble) == 0)
		return buf;
	return NULL;
}

/* d as plain decimal text (no exponent), with the fewest significant digits
 * that read back as d: 1e20 -> "100000000000000000000", 1e-7 -> "0.0000001",
 * 0.1 -> "0.1".  -1 when it does not fit in cap. */
int
rl_reward_decimal(char *buf, size_t cap, double d)
{
	char e[40], dig[24];
	int p, ex, nd = 0, k = 0;
	const char *q;

	if (!isfinite(d))
		return -1;
	for (p = 1; p <= 17; p++) {
		snprintf(e, sizeof e, "%.*e", p - 1, d);
		if (strtod(e, NULL) == d)
			break;
	}
	/* e: [-]D[.DDD]e[+-]XX */
	q = e;
	if (*q == '-')
		q++;
	for (; *q && *q != 'e'; q++)
		if (is_digit((unsigned char)*q))
			dig[nd++] = *q;
	ex = atoi(q + 1);
	while (nd > 1 && dig[nd - 1] == '0')
		nd--;
	if (nd == 1 && dig[0] == '0') {
		if (cap < 2)
			return -1;
		memcpy(buf, "0", 2);
		return 0;
	}
	/* value = 0.dig x 10^(ex + 1) */
	int ip = ex + 1; /* digits before the point */
	size_t need = (size_t)(2 + (ip > 0 ? (ip > nd ? ip : nd) : nd - ip) + 2);
	if (need >= cap)
		return -1;
	if (d < 0)
		buf[k++] = '-';
	if (ip <= 0) {
		buf[k++] = '0';
		buf[k++] = '.';
		for (int i = 0; i < -ip; i++)
			buf[k++] = '0';
		for (int i = 0; i < nd; i++)
			buf[k++] = dig[i];
	} else {
		for (int i = 0; i < ip; i++)
			buf[k++] = i < nd ? dig[i] : '0';
		if (nd > ip) {
			buf[k++] = '.';
			for (int i = ip; i < nd; i++)
				buf[k++] = dig[i];
		}
	}
	buf[k] = 0;
	return 0;
}

const char *
rl_reward_truth(const cJSON *meta, char *buf, size_t cap)
{
	const cJSON *a, *rm;
	const char *s;

	if (!cJSON_IsObject(meta))
		return NULL;
	a = cJSON_GetObjectItemCaseSensitive(meta, "answer");
	if (a && (s = json_scalar(a, buf, cap)))
		return s;
	rm = cJSON_GetObjectItemCaseSensitive(meta, "reward_model");
	if (cJSON_IsObject(rm)) {
		a = cJSON_GetObjectItemCaseSensitive(rm, "ground_truth");
		if (a && (s = json_scalar(a, buf, cap)))
			return s;
	}
	return NULL;
}

/* An integer-valued JSON number into *v. */
static int
json_int(int64_t *v, const cJSON *j)
{
	if (!cJSON_IsNumber(j))
		return -1;
	double d = j->valuedouble;
	if (!(d >= -9e15 && d <= 9e15) || d != floor(d))
		return -1;
	*v = (int64_t)d;
	return 0;
}

/* Countdown's numbers and target: meta.numbers (or meta.nums) and
 * meta.target, else the same keys in meta.reward_model.ground_truth. */
static int
countdown_truth(int64_t *nums, size_t cap, size_t *count, int64_t *target, const cJSON *meta, const char **why)
{
	const cJSON *src = meta, *arr, *tg, *e;
	size_t k = 0;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			const cJSON *rm = cJSON_GetObjectItemCaseSensitive(meta, "reward_model");
			src = cJSON_IsObject(rm) ? cJSON_GetObjectItemCaseSensitive(rm, "ground_truth") : NULL;
		}
		if (!cJSON_IsObject(src))
			continue;
		arr = cJSON_GetObjectItemCaseSensitive(src, "numbers");
		if (!arr)
			arr = cJSON_GetObjectItemCaseSensitive(src, "nums");
		tg = cJSON_GetObjectItemCaseSensitive(src, "target");
		if (!arr || !tg)
			continue;
		if (!cJSON_IsArray(arr) || json_int(target, tg) != 0) {
			*why = "countdown numbers must be an array of integers and target an integer";
			return RL_EFORMAT;
		}
		cJSON_ArrayForEach(e, arr) {
			if (k >= cap || json_int(&nums[k], e) != 0) {
				*why = k >= cap ? "more than 64 countdown numbers"
						: "countdown numbers must be an array of integers and target an integer";
				return RL_EFORMAT;
			}
			k++;
		}
		*count = k;
		return 0;
	}
	*why = "no meta.numbers and meta.target";
	return RL_ENOENT;
}

/* Case-insensitive substring search. */
static int
has_word(const char *s, const char *w)
{
	size_t n = strlen(w);

	for (; *s; s++)
		if (strncasecmp(s, w, n) == 0)
			return 1;
	return 0;
}

/* The task a meta.task or meta.data_source value names, -1 for none.  verl
 * scores the data sources "math", "math_dapo", "math_dapo_reasoning" and
 * "aime*" with math_dapo ("Answer: ..."), not with \boxed{}: so does dapo. */
static int
auto_word_kind(const char *v, int is_source)
{
	static const struct { const char *word; int kind; } map[] = {
		{ "gsm8k", RL_TASK_GSM8K }, { "countdown", RL_TASK_COUNTDOWN },
		{ "arith", RL_TASK_ARITH }, { "math", RL_TASK_MATH },
	};

	if (is_source ? (strcmp(v, "math") == 0 || strcmp(v, "math_dapo") == 0 ||
			 strcmp(v, "math_dapo_reasoning") == 0 || strncmp(v, "aime", 4) == 0)
		      : strcasecmp(v, "dapo") == 0)
		return RL_TASK_DAPO;
	for (size_t i = 0; i < RL_ARRAY_LEN(map); i++)
		if (has_word(v, map[i].word))
			return map[i].kind;
	return -1;
}

int
rl_reward_auto_kind(const cJSON *meta)
{
	static const char *const keys[] = { "task", "data_source" };

	if (!cJSON_IsObject(meta))
		return -1;
	for (size_t k = 0; k < RL_ARRAY_LEN(keys); k++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, keys[k]);
		int kind;
		if (cJSON_IsString(v) && (kind = auto_word_kind(v->valuestring, k == 1)) >= 0)
			return kind;
	}
	return -1;
}

int
rl_reward_task_score(double *score, const char **why, const rl_reward_task *t, const rl_reward_opts *o,
		     const char *resp, size_t n, const cJSON *meta, long ntokens)
{
	char buf[400]; /* a JSON number's truth as plain decimal text: up to ~330 characters */
	const char *truth = NULL, *w = NULL;
	int rv = 0, kind = t->kind;

	*score = 0;
	*why = NULL;
	if (kind == RL_TASK_AUTO && (kind = rl_reward_auto_kind(meta)) < 0) {
		*why = "no gsm8k, math, dapo, countdown or arith in meta.task or meta.data_source";
		return RL_ENOENT;
	}
	if (kind != RL_TASK_COUNTDOWN && kind != RL_TASK_FORMAT && kind != RL_TASK_LENGTH) {
		truth = rl_reward_truth(meta, buf, sizeof buf);
		if (!truth) {
			*why = "no ground truth (meta.answer or meta.reward_model.ground_truth)";
			return RL_ENOENT;
		}
	}
	switch (kind) {
	case RL_TASK_GSM8K:
		rv = rli_reward_gsm8k_score(score, &w, resp, n, truth, o ? o->gsm8k_mode : RL_GSM8K_STRICT);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_MATH:
		rv = rli_reward_math_score(score, &w, resp, n, truth);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_DAPO:
		rv = rli_reward_dapo_score(score, &w, resp, n, truth);
		if (rv)
			*why = w;
		return rv;
	case RL_TASK_COUNTDOWN: {
		int64_t nums[64], target;
		size_t count = 0;
		if ((rv = countdown_truth(nums, RL_ARRAY_LEN(nums), &count, &target, meta, why)) != 0)
			return rv;
		*score = rl_reward_countdown(resp, n, nums, count, target, &w);
		return 0;
	}
	case RL_TASK_EXACT:
		*score = rl_reward_exact(resp, n, truth, &w);
		return 0;
	case RL_TASK_ARITH:
		*score = rl_reward_arith(resp, n, truth, &w);
		return 0;
	case RL_TASK_LENGTH: {
		long len = (o && !o->length_chars && ntokens >= 0) ? ntokens : rl_reward_utf8_len(resp, n);
		*score = rl_reward_length(len, o ? o->max_length : 0);
		return 0;
	}
	case RL_TASK_REGEX:
	case RL_TASK_FORMAT: {
		pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
		int m;
		if (!md) {
			*why = "out of memory";
			return RL_ENOMEM;
		}
		m = pcre2_match(t->re, (PCRE2_SPTR)resp, n, 0, 0, md, NULL);
		if (m >= 0 && t->kind == RL_TASK_FORMAT) {
			*score = 1;
		} else if (m >= 0) {
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
			const char *g = resp + ov[0];
			size_t gn = ov[1] - ov[0], tn = strlen(truth);
			/* the first capture group when the pattern has one and it took part */
			if (m >= 2 && ov[2] != PCRE2_UNSET) {
				g = resp + ov[2];
				gn = ov[3] - ov[2];
			}
			trim(&g, &gn);
			trim(&truth, &tn);
			*score = (gn == tn && memcmp(g, truth, gn) == 0);
		} else if (m != PCRE2_ERROR_NOMATCH) {
			/* match limits hit: a zero score, not a failed record */
			*score = 0;
		}
		pcre2_match_data_free(md);
		return 0;
	}
	}
	*why = "unknown task";
	return RL_EINVAL;
}

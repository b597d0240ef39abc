/* test_reward.c — the built-in verifiers on the completions in
 * tests/fixtures/reward/cases.jsonl (one case a line: task, response, meta,
 * the expected score or "error"), then the pieces one by one: the countdown
 * evaluator, math normalisation, task specs with weights and patterns,
 * regex/format, length, and the arith generator (reproducible, disjoint
 * splits, answers that the verifier accepts). */
#include "base/core.h"
#include "reward/reward.h"
#include "base/rng.h"
#include "reward/synth.h"
#include "stream/traj.h"
#include "t.h"

#include <stdint.h>

static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *s;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	s = malloc((size_t)n + 1);
	if (fread(s, 1, (size_t)n, f) != (size_t)n)
		n = 0;
	s[n] = 0;
	fclose(f);
	return s;
}

static void
fixture_cases(void)
{
	char *text = slurp("tests/fixtures/reward/cases.jsonl"), *line, *save = NULL;
	int ncase = 0;

	T_OK(text != NULL, "cannot read tests/fixtures/reward/cases.jsonl");
	if (!text)
		return;
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		cJSON *c = cJSON_Parse(line);
		const cJSON *task = cJSON_GetObjectItem(c, "task"), *resp = cJSON_GetObjectItem(c, "response"),
			    *meta = cJSON_GetObjectItem(c, "meta"), *want = cJSON_GetObjectItem(c, "want"),
			    *note = cJSON_GetObjectItem(c, "note"), *mode = cJSON_GetObjectItem(c, "mode");
		rl_reward_task t;
		rl_reward_opts o = { 0 };
		double score = -1;
		const char *why = NULL;
		int rv;

		T_OK(c && cJSON_IsString(task) && cJSON_IsString(resp) && want, "bad case line: %s", line);
		if (!c || !cJSON_IsString(task) || !cJSON_IsString(resp) || !want) {
			cJSON_Delete(c);
			continue;
		}
		if (mode && strcmp(mode->valuestring, "flexible") == 0)
			o.gsm8k_mode = RL_GSM8K_FLEXIBLE;
		T_EQ_INT(rl_reward_task_parse(&t, task->valuestring, NULL, 0), 0);
		rv = rl_reward_task_score(&score, &why, &t, &o, resp->valuestring, strlen(resp->valuestring), meta, -1);
		if (cJSON_IsString(want)) {
			T_OK(rv != 0 && why != NULL, "%s case '%s': want an error, got rv %d score %g", task->valuestring,
			     note->valuestring, rv, score);
		} else {
			T_OK(rv == 0 && score == want->valuedouble, "%s case '%s': want %g, got rv %d score %g (%s)",
			     task->valuestring, note->valuestring, want->valuedouble, rv, score, why ? why : "-");
		}
		rl_reward_task_fini(&t);
		cJSON_Delete(c);
		ncase++;
	}
	T_OK(ncase >= 60, "only %d cases", ncase);
	free(text);
}

static void
countdown_eval(void)
{
	int64_t num, den, lits[8];
	size_t nl;
	const char *why;
	char deep[300];

	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "1 + 2 * 3", 9, &why), 0);
	T_EQ_INT(num, 7);
	T_EQ_INT(den, 1);
	T_EQ_INT(nl, 3);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "(1+2)*3", 7, &why), 0);
	T_EQ_INT(num, 9);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "7/2-1", 5, &why), 0);
	T_EQ_INT(num, 5);
	T_EQ_INT(den, 2);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "10-2-3", 6, &why), 0); /* left assoc */
	T_EQ_INT(num, 5);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "12/4/3", 6, &why), 0);
	T_EQ_INT(num, 1);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "1/(2-2)", 7, &why), RL_EINVAL);
	T_EQ_STR(why, "division by zero");
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "9223372036854775807+1", 21, &why), RL_ETOOBIG);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "99999999999999999999", 20, &why), RL_ETOOBIG);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "-1+2", 4, &why), RL_EFORMAT);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "1+", 2, &why), RL_EFORMAT);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "1)", 2, &why), RL_EFORMAT);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, "", 0, &why), RL_EFORMAT);
	/* a hostile nesting depth is refused, not a stack overflow */
	memset(deep, '(', 150);
	deep[150] = '1';
	memset(deep + 151, ')', 149);
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 8, &nl, deep, 300, &why), RL_ETOOBIG);
	/* more literals than room: counted, not written past the end */
	T_EQ_INT(rl_reward_countdown_eval(&num, &den, lits, 2, &nl, "1+1+1+1", 7, &why), 0);
	T_EQ_INT(nl, 4);
	/* the classic numbers game: each number exactly once */
	static const struct { const char *eq; int64_t target; double want; } cd[] = {
		{ "<answer>(100 - 75 + 50 - 25) * 3 * 6 / 6</answer>", 150, 0 },     /* 6 used twice */
		{ "<answer>(100 - 75 + 50 - 25) * 3 + 6 * 0</answer>", 150, 0 },     /* 0 is not given */
		{ "<answer>(100 - 75 + 50) * 6 / 3 - 25</answer>", 125, 1 },
		{ "<answer>(100 - 75 + 50) * 6 / 3 - 25</answer>", 126, 0 },
		{ "<answer>100 + 75 - 25 + 50 / (3 + 6)</answer>", 150, 0 },         /* 50/9 is not an integer */
		{ "<answer>(100 + 50) / (75 / 25) * 6 / 3</answer>", 100, 1 },
		{ "<answer>100 * 75 * 50 * 25 * 6 * 3</answer>", 168750000, 1 },
	};
	int64_t nums[] = { 25, 50, 75, 100, 3, 6 };
	for (size_t i = 0; i < RL_ARRAY_LEN(cd); i++)
		T_OK(rl_reward_countdown(cd[i].eq, strlen(cd[i].eq), nums, 6, cd[i].target, NULL) == cd[i].want,
		     "countdown %s = %lld", cd[i].eq, (long long)cd[i].target);
}

static void
math_pieces(void)
{
	char out[256];
	const char *why;
	double v;

	T_EQ_INT(rl_reward_math_last_boxed(out, sizeof out, "a \\boxed{1} b \\boxed{{2}+{3}} c", 31), 7);
	T_EQ_STR(out, "{2}+{3}");
	T_EQ_INT(rl_reward_math_last_boxed(out, sizeof out, "\\boxed{\\{1\\}}", 13), 5);
	T_EQ_STR(out, "\\{1\\}");
	T_EQ_INT(rl_reward_math_last_boxed(out, sizeof out, "\\boxed 5$", 9), 1);
	T_EQ_STR(out, "5");
	T_EQ_INT(rl_reward_math_last_boxed(out, sizeof out, "no box", 6), -1);
	T_EQ_INT(rl_reward_math_last_boxed(out, 3, "\\boxed{12345}", 13), -1);
	T_OK(rl_reward_math_normalize(out, sizeof out, "\\left( \\dfrac{1}{2}, 3 \\right)", 30) > 0);
	T_EQ_STR(out, "(\\frac{1}{2},3)");
	T_OK(rl_reward_math_normalize(out, sizeof out, "\\text{ 5 cm}.", 13) > 0);
	T_EQ_STR(out, "5cm");
	T_OK(rl_reward_math_normalize(out, sizeof out, "x \\leftarrow y", 14) > 0);
	T_EQ_STR(out, "x\\leftarrowy");
	T_OK(rl_reward_math_normalize(out, sizeof out, "45^{\\circ}", 10) > 0);
	T_EQ_STR(out, "45");
	T_EQ_INT(rl_reward_math_normalize(out, 4, "123456", 6), -1);
	/* the rewrites of the Hendrycks MATH rule that verl's math reward uses */
	T_OK(rl_reward_math_normalize(out, sizeof out, "5\\text{ cm}^2", strlen("5\\text{ cm}^2")) > 0);
	T_EQ_STR(out, "5");
	T_OK(rl_reward_math_normalize(out, sizeof out, "\\$5", strlen("\\$5")) > 0);
	T_EQ_STR(out, "5");
	T_OK(rl_reward_math_normalize(out, sizeof out, "x = 3", strlen("x = 3")) > 0);
	T_EQ_STR(out, "3");
	T_OK(rl_reward_math_normalize(out, sizeof out, "abc=3", strlen("abc=3")) > 0);
	T_EQ_STR(out, "abc=3");
	T_OK(rl_reward_math_normalize(out, sizeof out, "x=y=3", strlen("x=y=3")) > 0);
	T_EQ_STR(out, "x=y=3");
	T_OK(rl_reward_math_normalize(out, sizeof out, "\\frac{\\sqrt3}2 + \\sqrt 2", strlen("\\frac{\\sqrt3}2 + \\sqrt 2")) > 0);
	T_EQ_STR(out, "\\frac{\\sqrt{3}}{2}+\\sqrt{2}");
	T_OK(rl_reward_math_normalize(out, sizeof out, "\\dfrac12\\sqrt[3]{x}\\pi2\\{", strlen("\\dfrac12\\sqrt[3]{x}\\pi2\\{")) > 0);
	T_EQ_STR(out, "\\frac{1}{2}\\sqrt[3]{x}\\pi2\\{");
	T_EQ_INT(rl_reward_math_normalize(out, 8, "\\sqrt12", strlen("\\sqrt12")), -1);
	T_CLOSE(rl_reward_math("so \\boxed{\\sqrt2}", strlen("so \\boxed{\\sqrt2}"), "\\sqrt{2}", &why), 1, 0, 0);
	T_CLOSE(rl_reward_math("\\boxed{x=4}", strlen("\\boxed{x=4}"), "3", &why), 0, 0, 0);
	T_CLOSE(rl_reward_math("\\boxed{\\sqrt3}", strlen("\\boxed{\\sqrt3}"), "\\sqrt{2}", &why), 0, 0, 0);
	T_EQ_INT(rl_reward_math_number(&v, "\\frac{3}{4}"), 0);
	T_CLOSE(v, 0.75, 0, 0);
	T_EQ_INT(rl_reward_math_number(&v, "-\\frac{3}{4}"), 0);
	T_CLOSE(v, -0.75, 0, 0);
	T_EQ_INT(rl_reward_math_number(&v, "\\frac34"), 0);
	T_CLOSE(v, 0.75, 0, 0);
	T_EQ_INT(rl_reward_math_number(&v, "3/4"), 0);
	T_EQ_INT(rl_reward_math_number(&v, ".5"), 0);
	T_CLOSE(v, 0.5, 0, 0);
	T_EQ_INT(rl_reward_math_number(&v, "1/0"), -1);
	T_EQ_INT(rl_reward_math_number(&v, "x"), -1);
	T_EQ_INT(rl_reward_math_number(&v, "\\frac{x}{2}"), -1);
	T_EQ_INT(rl_reward_math_number(&v, "1,2"), -1);
	/* JSON number ground truths as plain decimals, the fewest digits that read back */
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 1e20), 0);
	T_EQ_STR(out, "100000000000000000000");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 1e-7), 0);
	T_EQ_STR(out, "0.0000001");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 0.1), 0);
	T_EQ_STR(out, "0.1");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, -72), 0);
	T_EQ_STR(out, "-72");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 0), 0);
	T_EQ_STR(out, "0");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 9007199254740993.0), 0); /* 2^53 + 1 reads as 2^53 */
	T_EQ_STR(out, "9007199254740992");
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 123.456), 0);
	T_EQ_STR(out, "123.456");
	T_EQ_INT(rl_reward_decimal(out, 5, 123.456), -1);
	T_EQ_INT(rl_reward_decimal(out, sizeof out, 1e300), -1); /* 301 digits: more than out holds */
	{
		char big[400];
		T_EQ_INT(rl_reward_decimal(big, sizeof big, -1.5e300), 0);
		T_OK(strlen(big) == 302 && big[0] == '-' && big[1] == '1' && big[2] == '5', "%.8s... %zu", big, strlen(big));
		T_EQ_INT(rl_reward_decimal(big, sizeof big, 5e-324), 0);
		T_OK(strlen(big) == 326 && big[325] == '5', "%zu", strlen(big));
	}
}

static void
task_specs(void)
{
	rl_reward_task t[4];
	rl_reward_opts o = { 0 };
	double s;
	const char *why;
	cJSON *meta = cJSON_Parse("{\"answer\": \"42\"}");

	T_EQ_INT(rl_reward_task_parse(&t[0], "gsm8k:0.5", NULL, 0), 0);
	T_CLOSE(t[0].weight, 0.5, 0, 0);
	T_EQ_STR(t[0].name, "gsm8k");
	T_EQ_INT(rl_reward_task_parse(&t[1], "format:0.1:^<think>.*</think>\\s*<answer>.*</answer>$", t, 1), 0);
	T_CLOSE(t[1].weight, 0.1, 0, 0);
	T_EQ_STR(t[1].pattern, "^<think>.*</think>\\s*<answer>.*</answer>$");
	T_EQ_INT(rl_reward_task_parse(&t[2], "regex:answer is (\\d+)", t, 2), 0);
	T_CLOSE(t[2].weight, 1, 0, 0);
	T_EQ_INT(rl_reward_task_parse(&t[3], "regex:2:12:(\\d+)", t, 3), 0);
	T_EQ_STR(t[3].name, "regex2");
	T_CLOSE(t[3].weight, 2, 0, 0);
	T_EQ_STR(t[3].pattern, "12:(\\d+)");

	/* format: DOTALL, so .* crosses lines */
	const char *r1 = "<think>a\nb</think>\n<answer>42</answer>";
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[1], &o, r1, strlen(r1), meta, -1), 0);
	T_CLOSE(s, 1, 0, 0);
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[1], &o, "<answer>42</answer>", 19, meta, -1), 0);
	T_CLOSE(s, 0, 0, 0);
	/* regex: group 1 against the truth; invalid UTF-8 in the response is tolerated */
	const char *r2 = "so the answer is 42 \xff\xfe";
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[2], &o, r2, strlen(r2), meta, -1), 0);
	T_CLOSE(s, 1, 0, 0);
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[2], &o, "the answer is 41", 16, meta, -1), 0);
	T_CLOSE(s, 0, 0, 0);
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[2], &o, "no match", 8, meta, -1), 0);
	T_CLOSE(s, 0, 0, 0);
	for (int i = 0; i < 4; i++)
		rl_reward_task_fini(&t[i]);

	rl_log_set_level(RL_LOG_QUIET);
	T_EQ_INT(rl_reward_task_parse(&t[0], "bogus", NULL, 0), RL_EINVAL);
	T_EQ_INT(rl_reward_task_parse(&t[0], "gsm8k:x", NULL, 0), RL_EINVAL);
	T_EQ_INT(rl_reward_task_parse(&t[0], "gsm8k:inf", NULL, 0), RL_EINVAL);
	T_EQ_INT(rl_reward_task_parse(&t[0], "regex", NULL, 0), RL_EINVAL);
	T_EQ_INT(rl_reward_task_parse(&t[0], "regex:0.5:", NULL, 0), RL_EINVAL);
	T_EQ_INT(rl_reward_task_parse(&t[0], "regex:(unclosed", NULL, 0), RL_EINVAL);
	rl_log_set_level(RL_LOG_NORMAL);

	/* length: tokens when known, else characters (UTF-8 code points) */
	T_EQ_INT(rl_reward_task_parse(&t[0], "length", NULL, 0), 0);
	o.max_length = 4;
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[0], &o, "abcdef", 6, NULL, 2), 0);
	T_CLOSE(s, 0, 0, 0);
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[0], &o, "abcdef", 6, NULL, 6), 0);
	T_CLOSE(s, -0.5, 1e-12, 0);
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[0], &o, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 8, NULL, -1), 0);
	T_CLOSE(s, 0, 0, 0);
	o.length_chars = 1;
	T_EQ_INT(rl_reward_task_score(&s, &why, &t[0], &o, "abcdefghijklmnop", 16, NULL, 2), 0);
	T_CLOSE(s, -1, 0, 0);
	rl_reward_task_fini(&t[0]);
	T_EQ_INT(rl_reward_utf8_len("h\xc3\xa9llo", 6), 5);

	/* truth: numbers print without a trailing .0 */
	char buf[64];
	cJSON *m2 = cJSON_Parse("{\"reward_model\": {\"ground_truth\": 1500}}");
	T_EQ_STR(rl_reward_truth(m2, buf, sizeof buf), "1500");
	T_OK(rl_reward_truth(NULL, buf, sizeof buf) == NULL);
	cJSON_Delete(m2);
	cJSON_Delete(meta);
}

static void
arith(void)
{
	rl_synth_arith o, te;
	char p[32], a[32], p2[32], a2[32];
	int test_hits = 0, correct = 0;

	rl_synth_arith_init(&o);
	o.seed = 7;
	T_EQ_INT(rl_synth_arith_make(p, sizeof p, a, sizeof a, &o, 3), 0);
	T_EQ_INT(rl_synth_arith_make(p2, sizeof p2, a2, sizeof a2, &o, 3), 0);
	T_EQ_STR(p, p2);
	T_EQ_STR(a, a2);
	/* prompt "A+B=", answer the sum, accepted by the verifier */
	for (uint64_t i = 0; i < 2000; i++) {
		long x, y;
		char op;
		T_EQ_INT(rl_synth_arith_make(p, sizeof p, a, sizeof a, &o, i), 0);
		T_OK(sscanf(p, "%ld%c%ld=", &x, &op, &y) == 3 && op == '+' && x >= 0 && x < 100 && y >= 0 && y < 100,
		     "prompt %s", p);
		T_EQ_INT(atol(a), x + y);
		correct += rl_reward_arith(a, strlen(a), a, NULL) == 1;
		test_hits += rl_synth_arith_is_test(x, op, y);
	}
	T_EQ_INT(correct, 2000);
	T_OK(test_hits > 120 && test_hits < 300, "test share %d / 2000", test_hits);
	/* the splits never share a problem */
	o.split = RL_SPLIT_TRAIN;
	te = o;
	te.split = RL_SPLIT_TEST;
	te.seed = 8;
	for (uint64_t i = 0; i < 500; i++) {
		long x, y;
		char op;
		rl_synth_arith_make(p, sizeof p, a, sizeof a, &o, i);
		sscanf(p, "%ld%c%ld=", &x, &op, &y);
		T_EQ_INT(rl_synth_arith_is_test(x, op, y), 0);
		rl_synth_arith_make(p, sizeof p, a, sizeof a, &te, i);
		sscanf(p, "%ld%c%ld=", &x, &op, &y);
		T_EQ_INT(rl_synth_arith_is_test(x, op, y), 1);
	}
	/* other operators, reversed answers */
	rl_synth_arith_init(&o);
	strcpy(o.ops, "-");
	o.digits = 3;
	o.reverse = 1;
	int neg = 0;
	for (uint64_t i = 0; i < 200; i++) {
		long x, y, r;
		char op, rev[32];
		rl_synth_arith_make(p, sizeof p, a, sizeof a, &o, i);
		sscanf(p, "%ld%c%ld=", &x, &op, &y);
		r = x - y;
		snprintf(rev, sizeof rev, "%ld", r < 0 ? -r : r);
		size_t L = strlen(rev);
		for (size_t u = 0; u < L / 2; u++) {
			char c = rev[u];
			rev[u] = rev[L - 1 - u];
			rev[L - 1 - u] = c;
		}
		T_EQ_STR(a + (r < 0), rev);
		T_OK((r < 0) == (a[0] == '-'));
		neg += r < 0;
	}
	T_OK(neg > 50, "only %d negative of 200", neg);
	rl_log_set_level(RL_LOG_QUIET);
	o.digits = 0;
	T_EQ_INT(rl_synth_arith_make(p, sizeof p, a, sizeof a, &o, 0), RL_EINVAL);
	o.digits = 2;
	strcpy(o.ops, "+/");
	T_EQ_INT(rl_synth_arith_check(&o), RL_EINVAL);
	rl_log_set_level(RL_LOG_NORMAL);
}

/* The record scorer: meta edits, NaN on failure, stale reward_error removed,
 * other stages' scores kept, weights summed. */
static void
scorer(void)
{
	rl_reward_task tk[2];
	rl_reward_scorer sc;
	rl_traj *t[4];
	const char *m;
	float r;

	T_EQ_INT(rl_reward_task_parse(&tk[0], "gsm8k:2", NULL, 0), 0);
	T_EQ_INT(rl_reward_task_parse(&tk[1], "format:0.5:^####", tk, 1), 0);
	memset(&sc, 0, sizeof sc);
	sc.tasks = tk;
	sc.ntasks = 2;
	for (int i = 0; i < 4; i++)
		T_EQ_INT(rl_traj_create(&t[i]), 0);
	rl_traj_set_str(t[0], RL_TAG_RESPONSE_TEXT, "#### 5");
	rl_traj_set_json(t[0], RL_TAG_META, "{\"answer\":\"5\",\"scores\":{\"old\":0.5},\"reward_error\":\"stale\"}");
	rl_traj_set_str(t[1], RL_TAG_RESPONSE_TEXT, "#### 5");
	rl_traj_set_json(t[1], RL_TAG_META, "[1,2]");
	rl_traj_set_json(t[2], RL_TAG_META, "{\"answer\":\"5\"}");
	rl_traj_set_str(t[3], RL_TAG_RESPONSE_TEXT, "so 5");
	T_EQ_INT(rl_reward_score_records(&sc, t, 4), 0);

	T_EQ_INT(rl_traj_get_f32(t[0], RL_TAG_REWARD, &r), 0);
	T_CLOSE(r, 2.5, 1e-6, 0);
	T_EQ_INT(rl_traj_get_str(t[0], RL_TAG_META, &m, NULL), 0);
	T_EQ_STR(m, "{\"answer\":\"5\",\"scores\":{\"old\":0.5,\"gsm8k\":1,\"format\":1}}");
	T_OK(rl_traj_has(t[0], RL_TAG_TS_SCORED));
	/* meta that is not an object: left alone, NaN */
	T_EQ_INT(rl_traj_get_f32(t[1], RL_TAG_REWARD, &r), 0);
	T_OK(isnan(r));
	T_EQ_INT(rl_traj_get_str(t[1], RL_TAG_META, &m, NULL), 0);
	T_EQ_STR(m, "[1,2]");
	/* no response_text: NaN, both components null, the reason names them */
	T_EQ_INT(rl_traj_get_f32(t[2], RL_TAG_REWARD, &r), 0);
	T_OK(isnan(r));
	rl_traj_get_str(t[2], RL_TAG_META, &m, NULL);
	T_OK(strstr(m, "\"gsm8k\":null") && strstr(m, "\"format\":null") &&
	     strstr(m, "\"reward_error\":\"gsm8k: record has no response_text; format: record has no response_text\""),
	     "%s", m);
	/* no meta at all: one is made; gsm8k finds no ground truth */
	T_EQ_INT(rl_traj_get_f32(t[3], RL_TAG_REWARD, &r), 0);
	T_OK(isnan(r));
	rl_traj_get_str(t[3], RL_TAG_META, &m, NULL);
	T_OK(strstr(m, "\"format\":0") && strstr(m, "no ground truth"), "%s", m);
	T_EQ_INT(sc.st.records, 4);
	T_EQ_INT(sc.st.failed, 3);
	T_CLOSE(sc.st.reward_sum, 2.5, 1e-9, 0);
	/* scoring again replaces our keys, still keeps "old", and drops reward_error when clean */
	T_EQ_INT(rl_reward_score_records(&sc, t, 1), 0);
	rl_traj_get_str(t[0], RL_TAG_META, &m, NULL);
	T_EQ_STR(m, "{\"answer\":\"5\",\"scores\":{\"old\":0.5,\"gsm8k\":1,\"format\":1}}");
	for (int i = 0; i < 4; i++)
		rl_traj_destroy(t[i]);
	rl_reward_task_fini(&tk[0]);
	rl_reward_task_fini(&tk[1]);
}

/* Hostile responses: random strings over the characters the parsers care
 * about go through every verifier (the sanitizer build catches any read out
 * of bounds); the scores stay in range.  The buffers are exactly n bytes,
 * not NUL-terminated, so a scan past the end is caught too. */
static void
random_responses(void)
{
	static const char *const atoms[] = {
		"0", "7", "42", "1,000", ",", ".", "-", "+", "*", "/", "(", ")", "#", "####", "$", " ", "\n",
		"\\boxed{", "\\boxed", "\\fbox{", "{", "}", "\\{", "\\}", "\\frac", "\\dfrac{1}{2}", "\\left(",
		"\\right", "\\text{", "^\\circ", "^{\\circ}", "\\%", "%", "<answer>", "</answer>", "=", "\xff", "\xc3",
	};
	rl_reward_task tasks[RL_TASK_KIND_COUNT];
	const char *specs[RL_TASK_KIND_COUNT] = { "gsm8k", "math", "countdown", "exact", "regex:(\\d+)",
						  "format:^#", "length", "arith", "dapo", "auto" };
	cJSON *meta = cJSON_Parse("{\"answer\":\"42\",\"numbers\":[7,42,1],\"target\":49,\"task\":\"gsm8k\"}");
	rl_reward_opts o = { .max_length = 10 };
	rl_rng r = { 99, 0 };
	int bad = 0, hits[RL_TASK_KIND_COUNT] = { 0 };

	for (int k = 0; k < RL_TASK_KIND_COUNT; k++)
		T_EQ_INT(rl_reward_task_parse(&tasks[k], specs[k], tasks, (size_t)k), 0);
	for (int it = 0; it < 20000; it++) {
		char tmp[512];
		size_t n = 0, natoms = rl_rng_next(&r) % 24;
		for (size_t a = 0; a < natoms; a++) {
			const char *x = atoms[rl_rng_next(&r) % RL_ARRAY_LEN(atoms)];
			size_t l = strlen(x);
			memcpy(tmp + n, x, l);
			n += l;
		}
		char *resp = malloc(n ? n : 1);
		memcpy(resp, tmp, n);
		for (int k = 0; k < RL_TASK_KIND_COUNT; k++) {
			double sc = -5;
			const char *why;
			int rv = rl_reward_task_score(&sc, &why, &tasks[k], &o, resp, n, meta, -1);
			if (rv != 0 || !(sc >= -1 && sc <= 1))
				bad++;
			hits[k] += sc != 0;
		}
		free(resp);
	}
	T_EQ_INT(bad, 0);
	/* the generator reaches every verifier's non-zero branch (gsm8k, math and
	 * the format/length/regex tasks; countdown and exact rarely by chance) */
	T_OK(hits[RL_TASK_GSM8K] > 0 && hits[RL_TASK_MATH] > 0 && hits[RL_TASK_FORMAT] > 0 &&
	     hits[RL_TASK_LENGTH] > 0 && hits[RL_TASK_REGEX] > 0 && hits[RL_TASK_ARITH] > 0,
	     "hits: %d %d %d %d %d %d", hits[0], hits[1], hits[4], hits[5], hits[6], hits[7]);
	for (int k = 0; k < RL_TASK_KIND_COUNT; k++)
		rl_reward_task_fini(&tasks[k]);
	cJSON_Delete(meta);
}

int
main(void)
{
	T_BEGIN("test_reward");
	random_responses();
	scorer();
	fixture_cases();
	countdown_eval();
	math_pieces();
	task_specs();
	arith();
	T_END();
}

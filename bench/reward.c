/*
 * bench/reward.c — throughput of the built-in verifiers, one core.
 *
 *   build/bench/reward [--records N] [--seconds S]     JSON lines on stdout
 *   build/bench/reward --emit FILE [--records N]       write a gsm8k stream for bench/reward.sh
 *
 * For each task it builds N realistic records in memory (chain-of-thought
 * responses of a few hundred bytes, meta with the ground truth and the
 * question), then times two things:
 *   "verifier": the pure function on the response string and ground truth;
 *   "scorer":   rl_reward_score_records on the records, i.e. everything
 *               rl-reward does per record but the stream I/O (meta JSON parsed
 *               and printed, scores and reward set).
 * The end-to-end figures through the program (stream decode + encode) come
 * from bench/reward.sh.
 */
#include "base/core.h"
#include "reward/reward.h"
#include "base/rng.h"
#include "stream/traj.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen {
	char resp[1024];
	char meta[512];
	char truth[64];
} gen;

static void
make(gen *g, int kind, rl_rng *r, size_t i)
{
	long a = 2 + (long)(rl_rng_next(r) % 2000), b = 2 + (long)(rl_rng_next(r) % 50), ans = a * b;
	long guess = (rl_rng_next(r) & 1) ? ans : ans + 1;

	switch (kind) {
	case RL_TASK_GSM8K:
		snprintf(g->resp, sizeof g->resp,
			 "Let's think step by step. Each box costs $%ld and she buys %ld boxes.\n"
			 "So the boxes cost %ld * %ld = <<%ld*%ld=%ld>>%ld dollars.\n"
			 "She also had a coupon, but it does not apply to boxes, so the total stays the same.\n"
			 "#### %ld",
			 a, b, b, a, b, a, ans, ans, guess);
		snprintf(g->truth, sizeof g->truth, "%ld", ans);
		snprintf(g->meta, sizeof g->meta,
			 "{\"answer\":\"%ld\",\"data_source\":\"openai/gsm8k\",\"index\":%zu,"
			 "\"question\":\"A box costs $%ld. How much do %ld boxes cost?\"}",
			 ans, i, a, b);
		break;
	case RL_TASK_MATH:
		snprintf(g->resp, sizeof g->resp,
			 "We need $\\frac{%ld}{%ld}$ in lowest terms. Dividing numerator and denominator by their "
			 "greatest common divisor gives the reduced fraction. Therefore the answer is "
			 "$\\boxed{\\dfrac{%ld}{%ld}}$.",
			 a, b, (guess == ans) ? a : a + 1, b);
		snprintf(g->truth, sizeof g->truth, "\\frac{%ld}{%ld}", a, b);
		snprintf(g->meta, sizeof g->meta, "{\"answer\":\"\\\\frac{%ld}{%ld}\",\"data_source\":\"math\"}", a, b);
		break;
	case RL_TASK_COUNTDOWN:
		snprintf(g->resp, sizeof g->resp,
			 "<think>We have %ld, %ld and 3. Try %ld * %ld = %ld, then subtract 3 to get %ld.</think>\n"
			 "<answer>(%ld * %ld) - 3</answer>",
			 a, b, a, b, ans, ans - 3, a, b);
		snprintf(g->meta, sizeof g->meta, "{\"numbers\":[%ld,%ld,3],\"target\":%ld}", a, b,
			 guess == ans ? ans - 3 : ans);
		break;
	case RL_TASK_ARITH:
		snprintf(g->resp, sizeof g->resp, "%ld\n", guess % 199);
		snprintf(g->truth, sizeof g->truth, "%ld", ans % 199);
		snprintf(g->meta, sizeof g->meta, "{\"answer\":\"%ld\",\"task\":\"arith\"}", ans % 199);
		break;
	}
}

static int
emit(const char *path, size_t n)
{
	FILE *f = fopen(path, "wb");
	rl_traj_writer *w = NULL;
	rl_traj *t = NULL;
	rl_rng r = { 1, 0 };
	gen g;
	int rv;

	if (!f) {
		perror(path);
		return 1;
	}
	if ((rv = rl_traj_writer_open_file(&w, f, path, NULL)) != 0 || (rv = rl_traj_create(&t)) != 0)
		goto out;
	for (size_t i = 0; i < n && rv == 0; i++) {
		make(&g, RL_TASK_GSM8K, &r, i);
		rl_traj_clear(t);
		if ((rv = rl_traj_set_u64(t, RL_TAG_ID, i)) == 0 && (rv = rl_traj_set_u64(t, RL_TAG_GROUP, i / 8)) == 0 &&
		    (rv = rl_traj_set_str(t, RL_TAG_RESPONSE_TEXT, g.resp)) == 0 &&
		    (rv = rl_traj_set_json(t, RL_TAG_META, g.meta)) == 0)
			rv = rl_traj_writer_put(w, t);
	}
out:
	if (rl_traj_writer_close(w) != 0)
		rv = 1;
	rl_traj_destroy(t);
	if (fclose(f) != 0)
		rv = 1;
	return rv ? 1 : 0;
}

int
main(int argc, char **argv)
{
	size_t n = 20000;
	double min_s = 0.5;
	const char *emit_path = NULL;
	static const struct { int kind; const char *spec; } tasks[] = {
		{ RL_TASK_GSM8K, "gsm8k" }, { RL_TASK_MATH, "math" }, { RL_TASK_COUNTDOWN, "countdown" },
		{ RL_TASK_ARITH, "arith" },
	};

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--records") == 0 && i + 1 < argc)
			n = (size_t)atol(argv[++i]);
		else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			min_s = atof(argv[++i]);
		else if (strcmp(argv[i], "--emit") == 0 && i + 1 < argc)
			emit_path = argv[++i];
		else {
			fprintf(stderr, "usage: reward [--records N] [--seconds S] [--emit FILE]\n");
			return 2;
		}
	}
	rl_log_init("bench/reward", RL_LOG_NORMAL);
	if (n == 0)
		n = 1;
	if (emit_path)
		return emit(emit_path, n);

	gen *g = rl_xcalloc(n, sizeof *g);
	rl_traj **recs = rl_xcalloc(n, sizeof *recs);
	for (size_t k = 0; k < RL_ARRAY_LEN(tasks); k++) {
		rl_rng r = { 42, 0 };
		rl_reward_task t;
		rl_reward_scorer sc;
		size_t reps = 0;
		double t0, dt, acc = 0;

		for (size_t i = 0; i < n; i++) {
			make(&g[i], tasks[k].kind, &r, i);
			if (!recs[i] && rl_traj_create(&recs[i]) != 0)
				return 1;
			rl_traj_clear(recs[i]);
			if (rl_traj_set_str(recs[i], RL_TAG_RESPONSE_TEXT, g[i].resp) != 0 ||
			    rl_traj_set_json(recs[i], RL_TAG_META, g[i].meta) != 0)
				return 1;
		}
		if (rl_reward_task_parse(&t, tasks[k].spec, NULL, 0) != 0)
			return 1;

		/* the pure verifier (countdown has its truth in meta: skipped here) */
		if (tasks[k].kind != RL_TASK_COUNTDOWN) {
			t0 = rl_now();
			do {
				for (size_t i = 0; i < n; i++) {
					const char *resp = g[i].resp;
					size_t rn = strlen(resp);
					switch (tasks[k].kind) {
					case RL_TASK_GSM8K: acc += rl_reward_gsm8k(resp, rn, g[i].truth, RL_GSM8K_STRICT, NULL); break;
					case RL_TASK_MATH: acc += rl_reward_math(resp, rn, g[i].truth, NULL); break;
					case RL_TASK_ARITH: acc += rl_reward_arith(resp, rn, g[i].truth, NULL); break;
					}
				}
				reps++;
				dt = rl_now() - t0;
			} while (dt < min_s);
			printf("{\"bench\":\"reward\",\"what\":\"verifier\",\"task\":\"%s\",\"records\":%zu,\"seconds\":%.4f,"
			       "\"records_per_s\":%.0f,\"mean_score\":%.4f}\n",
			       tasks[k].spec, n * reps, dt, (double)(n * reps) / dt, acc / (double)(n * reps));
		}

		memset(&sc, 0, sizeof sc);
		sc.tasks = &t;
		sc.ntasks = 1;
		reps = 0;
		t0 = rl_now();
		do {
			/* in rounds of 256, like rl-reward's stream loop with --exec */
			for (size_t i = 0; i < n; i += 256)
				if (rl_reward_score_records(&sc, recs + i, RL_MIN((size_t)256, n - i)) != 0)
					return 1;
			reps++;
			dt = rl_now() - t0;
		} while (dt < min_s);
		printf("{\"bench\":\"reward\",\"what\":\"scorer\",\"task\":\"%s\",\"records\":%zu,\"seconds\":%.4f,"
		       "\"records_per_s\":%.0f,\"mean_reward\":%.4f,\"failed\":%zu}\n",
		       tasks[k].spec, sc.st.records, dt, (double)sc.st.records / dt,
		       sc.st.records > sc.st.failed ? sc.st.reward_sum / (double)(sc.st.records - sc.st.failed) : 0.0,
		       sc.st.failed);
		fflush(stdout);
		rl_reward_task_fini(&t);
	}
	for (size_t i = 0; i < n; i++)
		rl_traj_destroy(recs[i]);
	free(recs);
	free(g);
	return 0;
}

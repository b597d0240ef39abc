/*
 * test_dpo.c — rl_dpo_loss (algo.h) against TRL's DPOTrainer formulas in
 * PyTorch (tests/fixtures/train/dpo_ref.py, float64 with autograd): the
 * loss, its gradient with respect to each pair's chosen and rejected
 * log-probs, and the metrics, for sigmoid (with and without label
 * smoothing), hinge and ipo at two betas, on pairs whose margins run from
 * -300 to +300 (log sigmoid must not overflow).  Both sides are float64:
 * tolerance 1e-9 relative.  Skips when /usr/bin/python3 has no torch.
 * Also: bad arguments are RL_EINVAL, names parse.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "train/algo.h"
#include "t.h"

#define P 6

static const double pc[P] = { -12.5, -3.25, -40, -7, -0.5, -20 };
static const double pr[P] = { -13.75, -2.0, -41, -300, -1.5, -25 };
static const double rc[P] = { -12.0, -3.0, -38, -7.5, -0.75, -320 };
static const double rr[P] = { -14.0, -2.5, -40, -9, -1.0, -18 };

static const struct { const char *type; double beta, ls; } cases[] = {
	{ "sigmoid", 0.1, 0 }, { "sigmoid", 0.5, 0.2 }, { "hinge", 0.1, 0 }, { "hinge", 0.5, 0 },
	{ "ipo", 0.1, 0 }, { "ipo", 0.5, 0 },
};

/* One run of dpo_ref.py over every case (PyTorch's start-up is the cost). */
static void
check_all(void)
{
	char path[64], cmd[256], line[4096];
	int ncase = (int)(sizeof cases / sizeof cases[0]), k = 0;
	snprintf(path, sizeof path, "/tmp/test_dpo.%d.txt", (int)getpid());
	FILE *f = fopen(path, "w");
	T_OK(f != NULL, "cannot write %s", path);
	if (!f)
		return;
	for (int c = 0; c < ncase; c++) {
		fprintf(f, "%s %.17g %.17g", cases[c].type, cases[c].beta, cases[c].ls);
		for (int i = 0; i < P; i++)
			fprintf(f, " %.17g,%.17g,%.17g,%.17g", pc[i], pr[i], rc[i], rr[i]);
		fprintf(f, "\n");
	}
	fclose(f);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/fixtures/train/dpo_ref.py < %s", path);
	f = popen(cmd, "r");
	T_OK(f != NULL, "popen");
	while (f && k < ncase && fgets(line, sizeof line, f)) {
		double want[7 + 2 * P], dc[P], dr[P];
		char *p = line, *e;
		rl_dpo_stats st;
		for (int j = 0; j < 7 + 2 * P; j++) {
			want[j] = strtod(p, &e);
			T_OK(e != p, "%s: output field %d", cases[k].type, j);
			p = e;
		}
		T_EQ_INT(rl_dpo_loss(dc, dr, &st, pc, pr, rc, rr, P, rl_dpo_loss_parse(cases[k].type), cases[k].beta,
		    cases[k].ls), RL_OK);
		double got[7] = { st.loss, st.reward_chosen, st.reward_rejected, st.accuracy, st.margin,
			st.logp_chosen, st.logp_rejected };
		for (int j = 0; j < 7; j++)
			T_CLOSE(got[j], want[j], 1e-12, 1e-9);
		for (int i = 0; i < P; i++) {
			T_CLOSE(dc[i], want[7 + 2 * i], 1e-12, 1e-9);
			T_CLOSE(dr[i], want[8 + 2 * i], 1e-12, 1e-9);
		}
		k++;
	}
	if (f)
		pclose(f);
	unlink(path);
	T_OK(k == ncase, "dpo_ref.py answered %d of %d cases", k, ncase);
}

int
main(void)
{
	double d[P];
	rl_dpo_stats st;

	T_BEGIN("test_dpo");
	T_EQ_INT(rl_dpo_loss_parse("sigmoid"), RL_DPO_SIGMOID);
	T_EQ_INT(rl_dpo_loss_parse("ipo"), RL_DPO_IPO);
	T_EQ_INT(rl_dpo_loss_parse("hinge"), RL_DPO_HINGE);
	T_EQ_INT(rl_dpo_loss_parse("kto"), -1);
	T_EQ_STR(rl_dpo_loss_name(RL_DPO_IPO), "ipo");
	T_EQ_INT(rl_dpo_loss(d, d, &st, pc, pr, rc, rr, 0, RL_DPO_SIGMOID, 0.1, 0), RL_EINVAL);
	T_EQ_INT(rl_dpo_loss(d, d, &st, pc, pr, rc, rr, P, RL_DPO_SIGMOID, 0, 0), RL_EINVAL);
	T_EQ_INT(rl_dpo_loss(d, d, &st, pc, pr, rc, rr, P, RL_DPO_SIGMOID, 0.1, 0.5), RL_EINVAL);
	T_EQ_INT(rl_dpo_loss(d, d, &st, pc, pr, rc, rr, P, 7, 0.1, 0), RL_EINVAL);
	/* a hand value: one pair, z = 0: sigmoid loss log 2, d/dpc = -beta/2 */
	{
		double a = -1, b = -1, r1 = -2, r2 = -2, g1, g2;
		T_EQ_INT(rl_dpo_loss(&g1, &g2, &st, &a, &b, &r1, &r2, 1, RL_DPO_SIGMOID, 0.2, 0), RL_OK);
		T_CLOSE(st.loss, log(2.0), 1e-15, 0);
		T_CLOSE(g1, -0.1, 1e-15, 0);
		T_CLOSE(g2, 0.1, 1e-15, 0);
		T_CLOSE(st.reward_chosen, 0.2, 1e-15, 0);
		T_CLOSE(st.accuracy, 0, 0, 0);
	}
	if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
		printf("test_dpo: no PyTorch at /usr/bin/python3: the comparison with TRL's formulas is skipped\n");
		T_END();
	}
	check_all();
	T_END();
}

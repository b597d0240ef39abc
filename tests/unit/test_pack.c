/*
 * test_pack.c — packed micro-batches (rl-train --micro-tokens, docs/train.md):
 *   model: three sequences (70, 5 and 100 positions: query blocks of the CPU attention
 *     that straddle a sequence's start) packed into one row with segment and position
 *     ids give each sequence's log-probs and the gradients of a loss on them as the
 *     sequences run alone, one row each;
 *   trainer: one step on the same records padded (--max-tokens-per-micro) and packed
 *     (--micro-tokens) for GRPO under each loss aggregation, PPO with its value head and
 *     SFT: the same loss, value loss, token count, gradient norm and, through AdamW's
 *     first update with lr = 1 and eps = 1 (d = -g / (|g| + 1), test_train.c), the same
 *     gradient at every parameter; then GRPO with 2 epochs x 2 mini-batches (old
 *     log-probs recomputed packed) to the same weights; a record longer than the
 *     budget is refused with its id named.
 *
 * The padded path is the one checked against PyTorch (test_model.c) and finite
 * differences (test_train.c); packed must equal it to float rounding: the same sums in
 * another order (bounds 2e-5 + 1e-3 relative).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "model/model.h"
#include "train/train.h"
#include "train/trainer.h"
#include "t.h"

/* The model of the tests: Llama (RoPE: attention sees relative positions only) or,
 * with gpt2 set, GPT-2 (learned absolute positions: a position that does not restart
 * at a sequence's start changes its log-probs). */
static int gpt2;

static rl_model *
tiny_model(rl_ops *ops, int value_head)
{
	rl_config c = { .arch = RL_ARCH_LLAMA, .vocab_size = 64, .hidden_size = 16, .n_layer = 2,
		.n_head = 2, .n_kv_head = 1, .head_dim = 8, .intermediate_size = 32, .max_pos = 256,
		.rope_theta = 10000, .norm_eps = 1e-6f, .bos_id = -1, .eos_id = -1, .dtype = RL_F32 };
	rl_config g = { .arch = RL_ARCH_GPT2, .vocab_size = 64, .hidden_size = 16, .n_layer = 2,
		.n_head = 2, .n_kv_head = 2, .head_dim = 8, .intermediate_size = 64, .max_pos = 256,
		.norm_eps = 1e-5f, .qkv_bias = 1, .o_bias = 1, .tie_embeddings = 1, .bos_id = -1,
		.eos_id = -1, .dtype = RL_F32 };
	rl_model *m = NULL;

	if (gpt2)
		c = g;
	snprintf(c.model_type, sizeof c.model_type, "%s", gpt2 ? "gpt2" : "llama");
	if (rl_model_init_random(&m, &c, ops, 5) != 0 || (value_head && rl_model_add_value_head(m, NULL, 9) != 0)) {
		fprintf(stderr, "cannot make the tiny model\n");
		exit(1);
	}
	return m;
}

/* ---- the model: packed row against each sequence alone ------------------------ */

static void
test_model_packed(rl_ops *ops)
{
	enum { NS = 3, TOT = 175 };
	const int len[NS] = { 70, 5, 100 };
	int32_t tok[TOT], tgt[TOT], seg[TOT], pos[TOT];
	float lp[TOT], lpa[TOT], *dlp = calloc(TOT, sizeof(float));
	rl_model *m = tiny_model(ops, 0), *a = tiny_model(ops, 0);
	size_t tot = m->tt.total;
	float *g = malloc(tot * sizeof(float)), *ga = calloc(tot, sizeof(float)), *gi = malloc(tot * sizeof(float));

	for (int s = 0, n = 0; s < NS; s++)
		for (int t = 0; t < len[s]; t++, n++) {
			tok[n] = (7 * n + 3 * s + 1) % 64;
			tgt[n] = t + 1 < len[s] ? (5 * n + 2) % 64 : -1;
			seg[n] = s;
			pos[n] = t;
			dlp[n] = tgt[n] >= 0 ? 0.01f * (float)((n % 7) - 3) : 0.0f;
		}
	T_EQ_INT(rl_model_train_reserve(m, TOT), RL_OK);
	T_EQ_INT(rl_model_train_reserve(a, TOT), RL_OK);
	T_EQ_INT(rl_model_forward(m, lp, NULL, tok, tgt, seg, pos, 1, TOT, 0.8f), RL_OK);
	T_EQ_INT(rl_model_backward(m, dlp, NULL), RL_OK);
	for (int i = 0; i < m->tt.n; i++)
		T_EQ_INT(rl_model_get(m, i, RL_MODEL_GRAD, g + m->tt.t[i].off), RL_OK);
	for (int s = 0, n0 = 0; s < NS; n0 += len[s], s++) {
		T_EQ_INT(rl_model_forward(a, lpa + n0, NULL, tok + n0, tgt + n0, NULL, NULL, 1, len[s], 0.8f), RL_OK);
		T_EQ_INT(rl_model_backward(a, dlp + n0, NULL), RL_OK);
	}
	for (int i = 0; i < a->tt.n; i++)
		T_EQ_INT(rl_model_get(a, i, RL_MODEL_GRAD, gi + a->tt.t[i].off), RL_OK);
	memcpy(ga, gi, tot * sizeof(float));
	int bad = 0;
	for (int n = 0; n < TOT; n++)
		bad += tgt[n] >= 0 && !(fabsf(lp[n] - lpa[n]) <= 2e-5f + 1e-4f * fabsf(lpa[n]));
	T_OK(bad == 0, "packed log-probs: %d of %d differ from the sequences alone", bad, TOT);
	double gn = 0;
	bad = 0;
	for (int i = 0; i < m->tt.n; i++)
		for (size_t k = 0; k < m->tt.t[i].n; k++) {
			size_t e = m->tt.t[i].off + k;
			gn += (double)ga[e] * ga[e];
			bad += !(fabsf(g[e] - ga[e]) <= 2e-6f + 1e-3f * fabsf(ga[e]));
		}
	T_OK(bad == 0, "packed gradients: %d elements differ from the sequences alone", bad);
	T_OK(gn > 1e-8, "gradient norm^2 %g: the check needs a real gradient", gn);
	free(dlp);
	free(g);
	free(ga);
	free(gi);
	rl_model_close(m);
	rl_model_close(a);
}

/* ---- the trainer: padded against packed ------------------------------------------ */

/* Group g's sample i: prompt of 2..4 tokens, response of 2..9 tokens, one of 40 (the
 * long tail), rewards that differ within the group. */
static void
add_records(rl_grouper *gr, int ngroups, int gsize)
{
	for (int g = 0; g < ngroups; g++)
		for (int i = 0; i < gsize; i++) {
			int32_t p[4], r[64];
			int np = 2 + (g + i) % 3, nr = (g == 1 && i == 2) ? 40 : 2 + (3 * g + 5 * i) % 8;
			rl_traj *t;
			for (int k = 0; k < np; k++)
				p[k] = 1 + (g * 5 + k) % 60;
			for (int k = 0; k < nr; k++)
				r[k] = 3 + (g * 11 + i * 7 + k * 3) % 60;
			rl_traj_create(&t);
			rl_traj_set_u64(t, RL_TAG_ID, (uint64_t)(g * gsize + i + 1));
			rl_traj_set_u64(t, RL_TAG_GROUP, (uint64_t)g + 100);
			rl_traj_set_i32(t, RL_TAG_INDEX, i);
			rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gsize);
			rl_traj_set_i32s(t, RL_TAG_PROMPT, p, (size_t)np);
			rl_traj_set_i32s(t, RL_TAG_RESPONSE, r, (size_t)nr);
			rl_traj_set_f32(t, RL_TAG_REWARD, (float)((g + 2 * i) % 3) * 0.5f);
			T_EQ_INT(rl_grouper_add(gr, t, "test"), RL_OK);
			rl_traj_destroy(t);
		}
}

typedef struct run {
	mstat ms;
	float gnorm;
	int rv, nbin, maxrow;
	float *p0, *p1;   /* parameters before and after */
	size_t n;
} run;

/* One step of algo on the records of add_records; pack: --micro-tokens budget (0: padded
 * with --max-tokens-per-micro 64). */
static int
one_step(int algo, int agg, int pack, int epochs, int minis, float lr, run *out)
{
	trainer tr = { 0 };
	rl_train_opts o;
	rl_grouper *gr;
	rl_grouper_opts go = { 0 };
	double lrv = 0;
	int rec = 0, nupd = 0;
	rl_ops *ops = NULL;

	memset(out, 0, sizeof *out);
	if (rl_ops_open(&ops, "cpu") != 0) {
		fprintf(stderr, "no CPU backend\n");
		exit(1);
	}
	rl_train_opts_default(&o);
	o.algo = algo;
	o.lr = lr;
	o.adam_eps = 1.0f;
	o.grad_clip = 0;
	o.weight_decay = 0;
	o.ppo_epochs = epochs;
	o.mini_batches = minis;
	o.micro_tokens = pack;
	o.max_tokens_micro = 64;
	tr.o = &o;
	tr.ops = ops;
	tr.m = tiny_model(ops, algo == RL_ALGO_PPO);
	tr.pack = pack > 0;
	tr.maxtok = pack > 0 ? pack : 64;
	tr.world = 1;
	tr.agg = agg >= 0 ? agg : rl_algo_default_agg(algo);
	T_EQ_INT(rli_step_reserve(&tr), RL_OK);
	go.vocab = 64;
	go.max_tokens = tr.m->cfg.max_pos; /* the budget is layout()'s to check here */
	go.sft = algo == RL_ALGO_SFT;
	T_EQ_INT(rl_grouper_create(&gr, &go), RL_OK);
	add_records(gr, 4, 3);
	tr.groups = calloc(4, sizeof *tr.groups);
	tr.cap_groups = 4;
	while (tr.ngroups < 4 && rl_grouper_pop(gr, &tr.groups[tr.ngroups]) == RL_OK)
		tr.ngroups++;
	rl_grouper_destroy(gr);
	T_EQ_INT(tr.ngroups, 4);
	out->n = tr.m->tt.total;
	out->p0 = malloc(out->n * sizeof(float));
	out->p1 = malloc(out->n * sizeof(float));
	memcpy(out->p0, tr.m->params, out->n * sizeof(float));
	if ((out->rv = rli_step_prepare(&tr)) == 0 && (out->rv = rli_step_old(&tr, &rec)) == 0)
		out->rv = rli_step_update(&tr, rec, &out->ms, &out->gnorm, &lrv, &nupd);
	memcpy(out->p1, tr.m->params, out->n * sizeof(float));
	out->nbin = tr.nbin;
	out->maxrow = tr.maxrow;
	rli_train_fini(&tr, RL_OK);
	return out->rv;
}

static void
run_free(run *r)
{
	free(r->p0);
	free(r->p1);
}

/* The padded and packed runs agree: metrics, and with first_update the gradient at every
 * parameter (recovered from AdamW's first step), else the weights. */
static void
compare(const char *what, const run *a, const run *b, int first_update)
{
	int bad = 0, moved = 0;
	size_t worst = 0;
	double wd = 0;

	T_EQ_INT(a->rv, RL_OK);
	T_EQ_INT(b->rv, RL_OK);
	T_OK(fabs(a->ms.loss - b->ms.loss) <= 1e-6 + 1e-4 * fabs(a->ms.loss), "%s: loss %.9g padded, %.9g packed",
	    what, a->ms.loss, b->ms.loss);
	T_OK(fabs(a->ms.vf_loss - b->ms.vf_loss) <= 1e-6 + 1e-4 * fabs(a->ms.vf_loss),
	    "%s: value loss %.9g padded, %.9g packed", what, a->ms.vf_loss, b->ms.vf_loss);
	T_OK(a->ms.ntok == b->ms.ntok, "%s: %g tokens padded, %g packed", what, (double)a->ms.ntok,
	    (double)b->ms.ntok);
	T_OK(fabsf(a->gnorm - b->gnorm) <= 1e-5f + 1e-4f * a->gnorm, "%s: gradient norm %.9g padded, %.9g packed",
	    what, a->gnorm, b->gnorm);
	for (size_t e = 0; e < a->n; e++) {
		double da = (double)a->p1[e] - a->p0[e], db = (double)b->p1[e] - b->p0[e], x, y;
		if (first_update) {
			x = -da / (1 - fabs(da));
			y = -db / (1 - fabs(db));
		} else {
			x = a->p1[e];
			y = b->p1[e];
		}
		moved += da != 0;
		double d = fabs(x - y) - (2e-5 + 1e-3 * fabs(x));
		if (d > 0) {
			bad++;
			if (d > wd) {
				wd = d;
				worst = e;
			}
		}
	}
	T_OK(bad == 0, "%s: %d parameters differ (worst at %zu: %.9g padded, %.9g packed)", what, bad, worst,
	    (double)a->p1[worst], (double)b->p1[worst]);
	T_OK(moved > 100, "%s: only %d parameters moved", what, moved);
	/* packing did pack: fewer micro-batches than sequences, none over the budget */
	T_OK(b->nbin < 12 && b->maxrow <= 48, "%s: %d packed micro-batches, longest %d", what, b->nbin, b->maxrow);
}

static void
test_trainer(void)
{
	static const struct { int algo, agg, gpt2; const char *name; } cases[] = {
		{ RL_ALGO_GRPO, RL_AGG_TOKEN_MEAN, 0, "grpo token-mean" },
		{ RL_ALGO_GRPO, RL_AGG_SEQ_MEAN_TOKEN_MEAN, 0, "grpo seq-mean-token-mean" },
		{ RL_ALGO_GRPO, RL_AGG_SEQ_MEAN_TOKEN_SUM, 0, "grpo seq-mean-token-sum" },
		{ RL_ALGO_DRGRPO, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 0, "dr-grpo seq-mean-token-sum-norm" },
		{ RL_ALGO_PPO, -1, 0, "ppo (value head)" },
		{ RL_ALGO_SFT, -1, 0, "sft" },
		{ RL_ALGO_GRPO, RL_AGG_TOKEN_MEAN, 1, "gpt-2 grpo token-mean" },
		{ RL_ALGO_PPO, -1, 1, "gpt-2 ppo (value head)" },
		{ RL_ALGO_SFT, -1, 1, "gpt-2 sft" },
	};
	run a, b;

	for (size_t k = 0; k < RL_ARRAY_LEN(cases); k++) {
		gpt2 = cases[k].gpt2;
		one_step(cases[k].algo, cases[k].agg, 0, 1, 1, 1.0f, &a);
		one_step(cases[k].algo, cases[k].agg, 48, 1, 1, 1.0f, &b);
		compare(cases[k].name, &a, &b, 1);
		run_free(&a);
		run_free(&b);
	}
	gpt2 = 0;
	/* 2 epochs x 2 mini-batches: pi_old recomputed packed, four updates */
	one_step(RL_ALGO_GRPO, -1, 0, 2, 2, 1e-2f, &a);
	one_step(RL_ALGO_GRPO, -1, 48, 2, 2, 1e-2f, &b);
	compare("grpo 2 epochs x 2 mini-batches", &a, &b, 0);
	run_free(&a);
	run_free(&b);
	/* a record longer than the budget: refused, named */
	{
		char err[1024];
		int rv = 0;
		T_CAPTURE(one_step(RL_ALGO_GRPO, -1, 30, 1, 1, 1.0f, &a), &rv, err);
		T_EQ_INT(rv, RL_ETOOBIG);
		T_OK(strstr(err, "record 6") && strstr(err, "--micro-tokens 30"), "error: %s", err);
		run_free(&a);
	}
}

int
main(void)
{
	rl_ops *ops = NULL;

	T_BEGIN("test_pack");
	rl_log_init("test_pack", RL_LOG_QUIET);
	if (rl_ops_open(&ops, "cpu") != 0) {
		fprintf(stderr, "no CPU backend\n");
		return 1;
	}
	test_model_packed(ops);
	gpt2 = 1;
	test_model_packed(ops);
	gpt2 = 0;
	rl_ops_close(ops);
	test_trainer();
	T_END();
}

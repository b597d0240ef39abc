/*
 * test_train.c — the trainer's pieces (lib/train/trainer.h) below the CLI:
 *   feed: groups assembled from records that arrive out of order, in
 *     completion order and by index; a bad group dropped and marked done
 *     (--on-bad skip) or an error (--on-bad error); --resume's group rule
 *     (groups done skipped, groups pending read again and not counted as
 *     new) and its record rule (positions before the checkpoint skipped
 *     unless pending); the acknowledgement bookkeeping (records of the
 *     step's groups leave the held list, the others stay, in order);
 *   step: one GRPO step on a tiny random model: the advantages and the
 *     metrics' loss against values computed here, and the weight change
 *     against a central finite difference of the loss.
 *
 * The step's check: AdamW's first update is lr * g / (|g| + eps) (bias
 * correction makes m_hat = g and v_hat = g^2), so with lr = 1, eps = 1 and no
 * clipping or decay the change d of an element gives its gradient back as
 * g = -d / (1 - |d|).  The loss at the step's start is
 *   L(p) = sum_t -w_t A_t exp(lp_t(p) - lp_t(p0))    (w_t = 1 / tokens)
 * whose gradient at p0 is what the step's backward computes; its central
 * difference with h = 1e-2 on fp32 log-probs (error ~1e-6 each, L a sum of 8)
 * is good to ~1e-5; the recovered g to ~1e-7 (fp32 weights near 1).  Bound
 * 5e-5 + 2%: a wrong sign, a missing loss weight or advantage, a gradient
 * taken at the wrong tokens all change g by far more.
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

static char path[256];

static rl_model *
tiny_model(rl_ops **ops)
{
	rl_config c = { .arch = RL_ARCH_LLAMA, .vocab_size = 64, .hidden_size = 16, .n_layer = 1,
		.n_head = 2, .n_kv_head = 1, .head_dim = 8, .intermediate_size = 32, .max_pos = 32,
		.rope_theta = 10000, .norm_eps = 1e-6f, .bos_id = -1, .eos_id = -1, .dtype = RL_F32 };
	rl_model *m = NULL;

	snprintf(c.model_type, sizeof c.model_type, "llama");
	if (rl_ops_open(ops, "cpu") != 0 || rl_model_init_random(&m, &c, *ops, 5) != 0) {
		fprintf(stderr, "cannot make the tiny model\n");
		exit(1);
	}
	return m;
}

/* A record of group_size 2 as a JSONL line; reward < 0: none (bad). */
static void
rec(FILE *f, int id, int group, int index, double reward)
{
	fprintf(f, "{\"id\":%d,\"group\":%d,\"index\":%d,\"group_size\":2,\"prompt\":[1,2,3],"
	    "\"response\":[%d,%d]", id, group, index, 10 + id, 11 + id);
	if (reward >= 0)
		fprintf(f, ",\"reward\":%g", reward);
	fprintf(f, "}\n");
}

/* Groups 20 and 10 complete out of order, 30 has a bad record, 40 is fine,
 * 50 stays incomplete. */
static void
write_input(void)
{
	FILE *f = fopen(path, "w");

	rec(f, 1, 10, 1, 1);
	rec(f, 2, 20, 0, 0);
	rec(f, 3, 20, 1, 1);
	rec(f, 4, 10, 0, 0);
	rec(f, 5, 30, 0, 1);
	rec(f, 6, 30, 1, -1);
	rec(f, 7, 40, 0, 0);
	rec(f, 8, 40, 1, 1);
	rec(f, 9, 50, 0, 1);
	fclose(f);
}

static void
feed_begin(trainer *tr, rl_train_opts *o, int on_bad, int batch)
{
	memset(tr, 0, sizeof *tr);
	rl_train_opts_default(o);
	o->input = path;
	o->on_bad = on_bad;
	o->batch = batch;
	tr->o = o;
	tr->m = tiny_model(&tr->ops);
	tr->maxtok = 64;
	tr->world = 1;
	if (rli_feed_open(tr) != RL_OK) {
		fprintf(stderr, "rli_feed_open failed\n");
		exit(1);
	}
}

static void
step_done(trainer *tr)
{
	for (int gi = 0; gi < tr->ngroups; gi++)
		T_EQ_INT(rli_feed_mark_done(tr, tr->groups[gi].group), RL_OK);
	rli_feed_free_groups(tr);
}

static void
test_feed(void)
{
	trainer tr;
	rl_train_opts o;

	write_input();

	/* out of order: group 20 completes first, samples ordered by index */
	feed_begin(&tr, &o, RL_BAD_SKIP, 2);
	T_EQ_INT(rli_feed_collect(&tr), RL_OK);
	T_EQ_INT(tr.ngroups, 2);
	T_EQ_INT(tr.groups[0].group, 20);
	T_EQ_INT(tr.groups[0].s[0].id, 2);
	T_EQ_INT(tr.groups[0].s[1].id, 3);
	T_EQ_INT(tr.groups[1].group, 10);
	T_EQ_INT(tr.groups[1].s[0].id, 4);
	T_EQ_INT(tr.groups[1].s[1].id, 1);
	T_EQ_INT(tr.groups[1].s[1].pos, 1);
	T_EQ_INT(tr.records, 4);
	T_EQ_INT(tr.groups_used, 2);
	/* acknowledgements: the step's records leave the held list, the rest
	 * (a duplicate, a dropped group's) stay, in order */
	tr.held = calloc(4, sizeof *tr.held);
	tr.capheld = tr.nheld = 4;
	tr.held[0].id = 2, tr.held[0].lease = 7;
	tr.held[1].id = 99, tr.held[1].lease = 7;
	tr.held[2].id = 4, tr.held[2].lease = 8;
	tr.held[3].id = 98, tr.held[3].lease = 9;
	/* not covered by a full checkpoint: trained, still held */
	T_EQ_INT(rli_feed_ack(&tr, 1, 0), RL_OK);
	T_EQ_INT(tr.nheld, 4);
	T_OK(tr.held[0].trained && !tr.held[1].trained && tr.held[2].trained && !tr.held[3].trained);
	/* covered: acknowledged (no broker here), the others stay in order */
	T_EQ_INT(rli_feed_ack(&tr, 0, 1), RL_OK);
	T_EQ_INT(tr.nheld, 2);
	T_EQ_INT(tr.held[0].id, 99);
	T_EQ_INT(tr.held[1].id, 98);
	step_done(&tr);
	T_OK(rl_gset_has(&tr.done, 10) && rl_gset_has(&tr.done, 20));
	/* the bad group 30 is dropped and done; 40 is read; 50 never completes */
	T_EQ_INT(rli_feed_collect(&tr), RL_ENOENT);
	T_EQ_INT(tr.ngroups, 1);
	T_EQ_INT(tr.groups[0].group, 40);
	T_OK(rl_gset_has(&tr.done, 30));
	T_OK(!rl_gset_has(&tr.done, 40) && !rl_gset_has(&tr.done, 50));
	T_EQ_INT(tr.records, 9);
	T_EQ_INT(rl_grouper_stats_get(tr.gr)->bad_groups, 1);
	T_EQ_INT(rl_grouper_stats_get(tr.gr)->incomplete, 1);
	rli_train_fini(&tr, RL_OK);

	/* --on-bad error: the bad record ends the collection */
	feed_begin(&tr, &o, RL_BAD_ERROR, 2);
	T_EQ_INT(rli_feed_collect(&tr), RL_OK);
	step_done(&tr);
	T_EQ_INT(rli_feed_collect(&tr), RL_EFORMAT);
	T_OK(!rl_gset_has(&tr.done, 30));
	rli_train_fini(&tr, RL_OK);

	/* --resume, the group rule: 20 was done (its records skipped wherever
	 * they come), 10 was pending (read again, not new) */
	feed_begin(&tr, &o, RL_BAD_SKIP, 2);
	tr.by_group = 1;
	T_EQ_INT(rl_gset_add(&tr.skip, 20), RL_OK);
	T_EQ_INT(rl_gset_add(&tr.pend_groups, 10), RL_OK);
	T_EQ_INT(rli_feed_collect(&tr), RL_OK);
	T_EQ_INT(tr.ngroups, 2);
	T_EQ_INT(tr.groups[0].group, 10);
	T_EQ_INT(tr.groups[1].group, 40);
	T_EQ_INT(tr.skipped_done, 2);
	T_EQ_INT(tr.records_new, 4); /* 5..8 */
	T_EQ_INT(tr.records, 8);
	rli_train_fini(&tr, RL_OK);

	/* --resume, the record rule: 4 records consumed, 1 and 4 still pending */
	feed_begin(&tr, &o, RL_BAD_SKIP, 1);
	tr.skip_records = 4;
	tr.pend = calloc(2, sizeof *tr.pend);
	tr.pend[0] = 1, tr.pend[1] = 4;
	tr.npend = 2;
	T_EQ_INT(rli_feed_collect(&tr), RL_OK);
	T_EQ_INT(tr.ngroups, 1);
	T_EQ_INT(tr.groups[0].group, 10);
	T_EQ_INT(tr.ipend, 1);
	T_EQ_INT(rl_grouper_stats_get(tr.gr)->records, 2); /* 2 and 3 never reached the grouper */
	rli_train_fini(&tr, RL_OK);
	unlink(path);
}

/* sum_t -w A_t exp(lp_t - old_t) over the step's sequences at the model's
 * current weights, w = 1 / tokens; old == NULL: the log-probs go to lp0. */
static double
loss_at(rl_model *m, rl_group *g, const float *adv, float *lp0, const float *old)
{
	int32_t tok[32], tgt[32];
	float lp[32];
	double L = 0;
	int ntok = 0, k = 0;

	for (int i = 0; i < g->size; i++)
		ntok += g->s[i].rlen;
	for (int i = 0; i < g->size; i++) {
		const rl_sample *s = &g->s[i];
		int T = s->plen + s->rlen - 1;
		for (int t = 0; t < T; t++) {
			tok[t] = t < s->plen ? s->prompt[t] : s->response[t - s->plen];
			tgt[t] = t >= s->plen - 1 ? s->response[t - s->plen + 1] : -1;
		}
		if (rl_model_forward(m, lp, NULL, tok, tgt, NULL, NULL, 1, T, 1.0f) != 0) {
			fprintf(stderr, "forward failed\n");
			exit(1);
		}
		for (int j = 0; j < s->rlen; j++, k++) {
			float l = lp[s->plen - 1 + j];
			if (!old)
				lp0[k] = l;
			else
				L += -(double)adv[k] / ntok * exp((double)l - old[k]);
		}
	}
	return L;
}

static void
test_step(void)
{
	trainer tr = { 0 };
	rl_train_opts o;
	rl_grouper *gr;
	rl_grouper_opts go = { 0 };
	mstat ms = { 0 };
	float gnorm = 0, lp0[8], adv[8];
	double lr = 0, A = 0.5 / (sqrt(0.5) + 1e-6), gsum = 0;
	int rec0 = -1, nupd = 0, nchecked = 0;

	rl_train_opts_default(&o);
	o.algo = RL_ALGO_GRPO;
	o.lr = 1.0f;
	o.adam_eps = 1.0f;
	o.grad_clip = 0;
	o.weight_decay = 0;
	tr.o = &o;
	tr.m = tiny_model(&tr.ops);
	tr.maxtok = 64;
	tr.world = 1;
	tr.agg = RL_AGG_TOKEN_MEAN;
	T_EQ_INT(rli_step_reserve(&tr), RL_OK);

	/* one group: rewards 1 (3 response tokens) and 0 (5) */
	go.vocab = 64;
	go.max_tokens = 32;
	T_EQ_INT(rl_grouper_create(&gr, &go), RL_OK);
	{
		int32_t p[3] = { 1, 2, 3 }, r0[3] = { 7, 8, 9 }, r1[5] = { 20, 21, 22, 23, 24 };
		for (int i = 0; i < 2; i++) {
			rl_traj *t;
			rl_traj_create(&t);
			rl_traj_set_u64(t, RL_TAG_ID, (uint64_t)i + 1);
			rl_traj_set_u64(t, RL_TAG_GROUP, 5);
			rl_traj_set_i32(t, RL_TAG_INDEX, i);
			rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, 2);
			rl_traj_set_i32s(t, RL_TAG_PROMPT, p, 3);
			rl_traj_set_i32s(t, RL_TAG_RESPONSE, i ? r1 : r0, i ? 5 : 3);
			rl_traj_set_f32(t, RL_TAG_REWARD, i ? 0.0f : 1.0f);
			T_EQ_INT(rl_grouper_add(gr, t, "test"), RL_OK);
			rl_traj_destroy(t);
		}
	}
	tr.groups = calloc(1, sizeof *tr.groups);
	tr.cap_groups = 1;
	T_EQ_INT(rl_grouper_pop(gr, &tr.groups[0]), RL_OK);
	tr.ngroups = 1;
	rl_grouper_destroy(gr);

	T_EQ_INT(rli_step_prepare(&tr), RL_OK);
	T_EQ_INT(tr.nseq, 2);
	for (int t = 0; t < 8; t++) {
		adv[t] = (float)(t < 3 ? A : -A);
		T_CLOSE(tr.adv_tok[t], adv[t], 1e-6, 0);
	}
	T_EQ_INT(rli_step_old(&tr, &rec0), RL_OK);
	T_EQ_INT(rec0, 0); /* one pass: pi_old is the current policy */

	/* the loss's gradient by central differences, at the first 4 elements of
	 * every tensor (some are unused: embedding rows of absent tokens) */
	rl_model *m = tr.m;
	size_t total = m->tt.total;
	float *p0 = malloc(total * sizeof *p0);
	int ncand = 0, *idx = malloc(sizeof(int) * 4 * (size_t)m->tt.n);
	double *gfd = malloc(sizeof(double) * 4 * (size_t)m->tt.n);
	memcpy(p0, m->params, total * sizeof *p0);
	loss_at(m, &tr.groups[0], adv, lp0, NULL);
	for (int i = 0; i < m->tt.n; i++)
		for (size_t k = 0; k < 4 && k < m->tt.t[i].n; k++) {
			size_t e = m->tt.t[i].off + k;
			const float h = 1e-2f;
			m->params[e] = p0[e] + h;
			rl_model_params_changed(m);
			double lp = loss_at(m, &tr.groups[0], adv, NULL, lp0);
			m->params[e] = p0[e] - h;
			rl_model_params_changed(m);
			double lm = loss_at(m, &tr.groups[0], adv, NULL, lp0);
			m->params[e] = p0[e];
			rl_model_params_changed(m);
			idx[ncand] = (int)e;
			gfd[ncand++] = (lp - lm) / (2 * h);
		}

	T_EQ_INT(rli_step_update(&tr, rec0, &ms, &gnorm, &lr, &nupd), RL_OK);
	T_EQ_INT(nupd, 1);
	T_EQ_INT(m->step, 1);
	T_CLOSE(lr, 1.0, 0, 0);
	/* ratio 1 on every token: the policy loss is -sum_t w A_t */
	T_CLOSE(ms.loss, -(3 * A - 5 * A) / 8, 1e-6, 1e-5);
	T_CLOSE(ms.ntok, 8, 0, 0);
	T_CLOSE(ms.clip, 0, 0, 0);
	for (int c = 0; c < ncand; c++) {
		double d = (double)m->params[idx[c]] - p0[idx[c]];
		double g = -d / (1 - fabs(d));
		T_CLOSE(g, gfd[c], 5e-5, 2e-2);
		gsum += gfd[c] * gfd[c];
		nchecked += fabs(gfd[c]) > 1e-3;
	}
	/* enough elements with a real gradient for the check to mean something */
	T_OK(nchecked >= 8, "%d elements with |g| > 1e-3", nchecked);
	/* the global norm covers at least the elements seen here */
	T_OK(gnorm >= sqrt(gsum) * 0.98, "grad norm %g below %g", gnorm, sqrt(gsum));
	free(p0);
	free(idx);
	free(gfd);
	rli_train_fini(&tr, RL_OK);
}

int
main(void)
{
	T_BEGIN("test_train");
	rl_log_init("test_train", RL_LOG_QUIET);
	snprintf(path, sizeof path, "/tmp/test_train.%ld.jsonl", (long)getpid());
	test_feed();
	test_step();
	T_END();
}

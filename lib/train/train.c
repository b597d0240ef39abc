/*
 * train.c — the learner (see train.h).
 *
 * Per step: collect `batch` complete groups (groups.h), drop what carries no
 * signal (DAPO) and set ReMax baselines aside, compute advantages and loss
 * weights on the host (algo.h), then for every micro-batch: pad sequences into
 * rows, forward (model.h), per-token loss and its gradient (ops->pg_loss),
 * backward; AdamW; publish a checkpoint; write one metrics line.
 *
 * Host arrays hold per-token values in the micro-batch's (B, T) layout; the
 * backend copies live in one allocation reserved once, so a step allocates
 * nothing on the backend.
 *
 * Data parallel (train.h, docs/parallel.md): the same steps on every rank,
 * each rank's micro-batches over its share of every mini-batch, the weights
 * of the whole mini-batch, a bucketed gradient all-reduce before AdamW.
 */
#include "train/train.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model/ckpt.h"
#include "compute/comm.h"
#include "sync/wgroup.h"
#include "base/core.h"
#include "train/groups.h"
#include "base/gset.h"
#include "base/io.h"
#include "base/json.h"
#include "model/model.h"
#include "queue/qclient.h"
#include "base/progress.h"
#include "queue/wstat.h"
#include "sync/wckpt.h"
#include "sync/wsync.h"
#include "train/tfevents.h"
#include "tok/tokenizer.h"
#include "stream/traj.h"

void
rl_train_opts_default(rl_train_opts *o)
{
	memset(o, 0, sizeof *o);
	o->device = "cpu";
	o->input = "-";
	o->algo = RL_ALGO_GRPO;
	o->agg = -1;
	o->norm_std = 1;
	o->batch = 8;
	o->broker_timeout = RL_QCLIENT_BROKER_TIMEOUT_S;
	o->ppo_epochs = 1;
	o->mini_batches = 1;
	o->max_tokens_micro = 8192;
	o->clip_low = 0.2f;
	o->clip_high = 0.2f;
	o->kl_coef = 0.0f;
	o->gamma = 1.0f;
	o->lambda = 1.0f;
	o->vf_coef = 0.1f;
	o->value_clip = 0.5f;
	o->whiten_adv = 1;
	o->lr = 1e-6f;
	o->weight_decay = 0.0f;
	o->beta1 = 0.9f;
	o->beta2 = 0.999f;
	o->adam_eps = 1e-8f;
	o->grad_clip = 1.0f;
	o->min_lr_ratio = 0.0f;
	o->sched = RL_SCHED_CONSTANT;
	o->keep = 3;
	o->on_bad = RL_BAD_ERROR;
	o->dp_check_every = 10;
	o->dp_bucket_mb = 25;
	o->dp_overlap = 1;
	o->skip_zero_adv = -1;
}

const char *
rl_train_skip_inexact(const rl_train_opts *o)
{
	if (o->algo == RL_ALGO_PPO)
		return "ppo's value loss has a gradient on every token";
	if (o->kl_type && !o->kl_in_reward)
		return "the KL loss term (--kl without --kl-in-reward) has a gradient on every token";
	if (o->ent_coef != 0)
		return "the entropy bonus (--ent-coef) has a gradient on every token";
	return NULL;
}

/* One sequence of the step: a sample and where its values go. */
typedef struct seqref {
	rl_sample *s;
	int toff;       /* offset of its response tokens in the step's token arrays */
	float reward;   /* effective reward (KL-in-reward applied) */
	int skip;       /* --skip-zero-adv: every advantage 0, no forward/backward */
} seqref;

typedef struct trainer {
	const rl_train_opts *o;
	rl_ops *ops;
	rl_model *m, *ref;
	rl_tokenizer *tok;
	rl_grouper *gr;
	rl_traj_reader *rd;
	FILE *in;
	FILE *metrics;
	rl_tfevents *tf;
	int agg;
	/* the step's groups and sequences */
	rl_group *groups;
	int ngroups, cap_groups;
	seqref *seq;
	int nseq, cap_seq;
	/* --skip-zero-adv (docs/train.md): sequences whose advantages are all 0
	 * give an exactly zero gradient when the loss has no other term */
	int skip_zero;           /* on for this run */
	seqref *kseq;            /* the trained sequences of a range, compacted */
	int cap_kseq;
	int nskip;               /* sequences of the step skipped */
	long tok_skip, tok_all;  /* their response tokens, and the step's */
	float *adv_tok, *w_tok, *old_tok, *kl_tok; /* (step tokens) */
	double reward_kl;        /* --kl-in-reward: mean over sequences of their token-mean KL */
	int has_mask;         /* some record had a loss_mask: weight-0 tokens are left out of the metrics */
	float *val_tok, *ret_tok; /* (step tokens) PPO: V_old and GAE returns */
	int cap_tok;
	/* micro-batch host buffers (max_tokens) */
	int maxtok;
	int32_t *h_tok, *h_tgt;
	float *h_old, *h_beh, *h_ref, *h_adv, *h_w, *h_stats, *h_lp, *h_ent;
	float *h_gspo;        /* gspo: the pi_old given to pg_loss (gspo_old) */
	float *h_vold, *h_ret, *h_v, *h_dv;   /* PPO (max_tokens each, one allocation) */
	float *d_dval;                         /* PPO: value gradient (max_tokens), backend */
	/* backend buffers: one allocation */
	void *d_mem;
	float *d_old, *d_beh, *d_ref, *d_adv, *d_w, *d_dlp, *d_dent, *d_stats;
	/* data position and counters */
	uint64_t records, groups_used, skip_records;
	/* --resume: records at or before skip_records still to read (ascending
	 * positions, trainer_state.json "records_pending"), the next one at ipend */
	uint64_t *pend;
	size_t npend, ipend;
	int groups_pending;      /* the final checkpoint: tr->groups were not trained */
	/* groups done: trained, or consumed and dropped (bad, no signal, a skipped
	 * step), never to be trained again; trainer_state.json "groups_done" */
	rl_gset done;
	/* --resume from a checkpoint with "groups_done" (the group rule): records
	 * of those groups (skip) are skipped wherever they come in the input; those
	 * of groups pending then (pend_groups) are read again, not counted as new */
	int by_group;
	rl_gset skip, pend_groups;
	uint64_t skipped_done;   /* records skipped by the group rule */
	uint64_t records_new;    /* records of groups neither done nor pending at the checkpoint */
	uint64_t dropped_nosignal, dropped_stale;
	uint64_t steps_skipped;  /* steps whose every update had a non-finite gradient norm */
	double t_wait;
	double t_model;  /* seconds in model forward/backward/AdamW this step */
	double t_pub;    /* seconds publishing the step's checkpoint */
	rl_wsync *ws;    /* --sync */
	/* queue mode */
	rl_qclient *qc;
	rl_qlease lease;
	rl_traj *qt;
	struct { uint64_t id, lease; } *held;   /* leased records not yet acknowledged */
	size_t nheld, capheld;
	uint64_t q_late;
	int last_gsize;          /* group size seen last (lease sizing) */
	double idle_since;       /* when the last records came (--idle-exit) */
	int qgone;               /* the broker stopped answering (--broker-timeout): rank 0's client
	                          * said so, or rank 0's end message (dp_send_lease) */
	rl_wstat *wst;           /* stats reported to the broker (wstat.h) */
	rl_progress prog;        /* steps, on a terminal */
	/* data parallelism */
	rl_comm *comm;           /* NULL: one process */
	rl_wgroup *wg;           /* --weights-group (rank 0) */
	int rank, world;
	int qfollow;             /* queue mode, rank > 0: records come from rank 0's leases */
	rl_comm_reducer *red;    /* the bucketed gradient all-reduce */
	int zero;                /* ZeRO-1: this rank keeps the AdamW state of [zlo, zhi) only */
	size_t zlo, zhi;
	float *zm, *zv;          /* (zhi - zlo) AdamW moments of the shard, backend memory */
	double t_comm;           /* seconds in the gradient all-reduce this step */
} trainer;

static volatile sig_atomic_t train_stop;

static int dp_send_lease(trainer *tr, int end);
static int dp_end_lease(trainer *tr);
static int dp_follow_lease(trainer *tr);
static int dp_grad_ready(void *ctx, size_t from);
static int zero_open(trainer *tr);
static int zero_full_alloc(trainer *tr);
static int zero_step(trainer *tr, const rl_adamw *p, float *grad_norm);
static int zero_gather_opt(trainer *tr);
static void zero_release_opt(trainer *tr);

static void
on_train_signal(int sig)
{
	train_stop = sig ? sig : 1;
}

static int train_stop_file; /* the signal that stopped a file/stdin run */

int
rl_train_stopped_by(void)
{
	return train_stop_file;
}

/* ---- metrics ------------------------------------------------------------------ */

typedef struct mstat {
	double loss, clip, clip_lower, kl, ratio_logsum, ent, ce;
	double ntok;
	double vf_loss, vf_clip, vpred;  /* PPO */
} mstat;

static void
metric(cJSON *j, trainer *tr, int step, const char *name, double v)
{
	if (!isfinite(v))
		cJSON_AddNullToObject(j, name);
	else
		cJSON_AddNumberToObject(j, name, v);
	if (tr->tf && isfinite(v))
		rl_tfevents_scalar(tr->tf, name, step, v, 0);
}

/* ---- input -------------------------------------------------------------------- */

/* Records that carry text but no token ids (hand-written SFT data, say) are
 * tokenized with the model's tokenizer; SFT responses get the EOS token. */
static int
tokenize_if_needed(trainer *tr, const rl_traj *in, rl_traj **out)
{
	const char *pt, *rt;
	rl_tokens p = { 0 }, r = { 0 };
	int rv;

	*out = NULL;
	if (rl_traj_has(in, RL_TAG_PROMPT) && rl_traj_has(in, RL_TAG_RESPONSE))
		return RL_OK;
	if (rl_traj_get_str(in, RL_TAG_PROMPT_TEXT, &pt, NULL) != RL_OK ||
	    rl_traj_get_str(in, RL_TAG_RESPONSE_TEXT, &rt, NULL) != RL_OK)
		return RL_OK; /* the grouper names what is missing */
	if (!tr->tok) {
		if ((rv = rl_tokenizer_open(&tr->tok, tr->m->src_dir ? tr->m->src_dir : tr->o->model_dir)) != 0) {
			rl_hint("records without token ids need the model's tokenizer.json");
			return rv;
		}
	}
	if ((rv = rl_tokenizer_encode(&p, tr->tok, pt, strlen(pt), RL_TOK_SPECIAL)) != 0 ||
	    (rv = rl_tokenizer_encode(&r, tr->tok, rt, strlen(rt), RL_TOK_SPECIAL)) != 0)
		goto out;
	if (tr->o->algo == RL_ALGO_SFT && rl_tokenizer_eos_id(tr->tok) >= 0) {
		int32_t eos = rl_tokenizer_eos_id(tr->tok);
		if (r.n == 0 || r.ids[r.n - 1] != eos) {
			int32_t *ni = realloc(r.ids, (r.n + 1) * sizeof *ni);
			if (!ni) {
				rv = RL_ENOMEM;
				goto out;
			}
			r.ids = ni;
			r.cap = r.n + 1;
			r.ids[r.n++] = eos;
		}
	}
	if ((rv = rl_traj_dup(out, in)) != 0)
		goto out;
	rl_traj_set_i32s(*out, RL_TAG_PROMPT, p.ids, p.n);
	rl_traj_set_i32s(*out, RL_TAG_RESPONSE, r.ids, r.n);
out:
	rl_tokens_fini(&p);
	rl_tokens_fini(&r);
	return rv;
}

/* Queue mode: lease scored groups into the grouper.  RL_OK when records came
 * (or none yet), RL_ENOENT when idle past --idle-exit or stopped by a signal. */
static int
lease_more(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	rl_qlease_req req = { 0 };
	char where[128];
	int rv;

	if (tr->idle_since == 0)
		tr->idle_since = rl_now();
	if (train_stop)
		return dp_end_lease(tr);
	req.stage = RL_QSTAGE_SCORED;
	/* lease only what this step still needs, so the broker's staleness gate
	 * decides on every group at the version that will train it */
	{
		int need = o->batch - tr->ngroups;
		req.max_records = (uint32_t)RL_MAX(need, 1) * (uint32_t)RL_MAX(tr->last_gsize, 1);
	}
	req.min_records = 1;
	req.wait_ms = 500;
	rl_wstat_phase(tr->wst, RL_WSTAT_IDLE);
	rv = rl_qclient_lease(tr->qc, &req, &tr->lease);
	rl_wstat_phase(tr->wst, RL_WSTAT_BUSY);
	if (rl_qclient_gone(tr->qc)) {
		/* no reply for --broker-timeout (logged): no more records; the
		 * run ends with a checkpoint, then fails (rl_train_run) */
		tr->qgone = 1;
		return dp_end_lease(tr);
	}
	if (rv == RL_ETIMEDOUT || rv == RL_EBUSY)
		rv = RL_OK;
	if (rv != RL_OK)
		return rv;
	size_t n = rl_qlease_count(&tr->lease);
	if (n == 0) {
		if (o->idle_exit > 0 && rl_now() - tr->idle_since > o->idle_exit)
			return dp_end_lease(tr);
		return dp_send_lease(tr, 0);
	}
	if ((rv = dp_send_lease(tr, 0)) != RL_OK)
		return rv;
	tr->idle_since = rl_now();
	for (size_t i = 0; i < n; i++) {
		uint64_t id = 0;
		if ((rv = rl_traj_batch_get(tr->lease.batch, i, tr->qt)) != 0)
			return rv;
		rl_traj_get_u64(tr->qt, RL_TAG_ID, &id);
		if (tr->nheld == tr->capheld) {
			size_t nc = tr->capheld ? 2 * tr->capheld : 256;
			void *np = realloc(tr->held, nc * sizeof *tr->held);
			if (!np)
				return RL_ENOMEM;
			tr->held = np;
			tr->capheld = nc;
		}
		{
			int32_t gs;
			if (rl_traj_get_i32(tr->qt, RL_TAG_GROUP_SIZE, &gs) == RL_OK && gs > 0)
				tr->last_gsize = gs;
		}
		tr->held[tr->nheld].id = id;
		tr->held[tr->nheld].lease = tr->lease.id;
		tr->nheld++;
		tr->records++;
		snprintf(where, sizeof where, "'%s': lease %llu record %zu", o->queue_url,
		    (unsigned long long)tr->lease.id, i);
		if ((rv = rl_grouper_add(tr->gr, tr->qt, where)) != RL_OK)
			return rv;
	}
	return RL_OK;
}

/* Queue mode, after a step: acknowledge the trained samples, one request per
 * lease.  Records the grouper dropped (duplicates, bad groups) stay held and
 * are handed back at the end. */
static void
ack_trained(trainer *tr)
{
	size_t keep = 0, n = 0;
	uint64_t *ids = malloc(sizeof(uint64_t) * (tr->nheld + 1));
	uint8_t *done = calloc(tr->nheld + 1, 1);

	if (!ids || !done) {
		free(ids);
		free(done);
		return; /* the leases expire and the broker redelivers: at-least-once */
	}
	for (size_t i = 0; i < tr->nheld; i++)
		for (int gi = 0; gi < tr->ngroups && !done[i]; gi++)
			for (int k = 0; k < tr->groups[gi].size; k++)
				if (tr->groups[gi].s[k].id == tr->held[i].id)
					done[i] = 1;
	/* one acknowledgement per lease */
	for (size_t i = 0; i < tr->nheld; i++) {
		if (done[i] != 1)
			continue;
		n = 0;
		for (size_t k = i; k < tr->nheld; k++)
			if (done[k] == 1 && tr->held[k].lease == tr->held[i].lease) {
				ids[n++] = tr->held[k].id;
				done[k] = 2;
			}
		rl_qack_result res = { 0 };
		if (rl_qclient_ack_ids(tr->qc, tr->held[i].lease, RL_QACK_DONE, ids, (uint32_t)n, &res) == RL_OK)
			tr->q_late += res.late;
	}
	for (size_t i = 0; i < tr->nheld; i++)
		if (!done[i])
			tr->held[keep++] = tr->held[i];
	tr->nheld = keep;
	free(ids);
	free(done);
}

/* Reads records until a complete group pops out: RL_OK, RL_ENOENT at the end. */
static int
next_group(trainer *tr, rl_group *g)
{
	rl_traj *t, *tt;
	char where[256];
	int rv;
	double t0 = rl_now();

	for (;;) {
		if (rl_grouper_pop(tr->gr, g) == RL_OK) {
			tr->t_wait += rl_now() - t0;
			return RL_OK;
		}
		if (tr->qc || tr->qfollow) {
			if ((rv = tr->qc ? lease_more(tr) : dp_follow_lease(tr)) != RL_OK)
				return rv;
			continue;
		}
		if (train_stop) {
			/* the groups held stay pending in the last checkpoint */
			tr->t_wait += rl_now() - t0;
			return RL_ENOENT;
		}
		if ((rv = rl_traj_reader_next(tr->rd, &t)) != RL_OK)
			return rv;
		if (t == NULL) {
			if (train_stop)
				return RL_ENOENT; /* what is held stays pending */
			rl_grouper_finish(tr->gr);
			tr->t_wait += rl_now() - t0;
			return RL_ENOENT;
		}
		tr->records++;
		if (tr->by_group) {
			uint64_t grp;
			if (rl_grouper_group_of(tr->gr, t, &grp) == RL_OK) {
				if (rl_gset_has(&tr->skip, grp)) {
					tr->skipped_done++;
					continue;
				}
				if (!rl_gset_has(&tr->pend_groups, grp))
					tr->records_new++;
			}
		} else if (tr->records <= tr->skip_records) {
			/* consumed before --resume, unless its group was still pending then */
			while (tr->ipend < tr->npend && tr->pend[tr->ipend] < tr->records)
				tr->ipend++;
			if (tr->ipend == tr->npend || tr->pend[tr->ipend] != tr->records)
				continue;
		}
		snprintf(where, sizeof where, "'%s': record %llu", tr->o->input,
		    (unsigned long long)tr->records);
		if ((rv = tokenize_if_needed(tr, t, &tt)) != RL_OK)
			return rv;
		rv = rl_grouper_add_at(tr->gr, tt ? tt : t, where, tr->records);
		rl_traj_destroy(tt);
		if (rv != RL_OK)
			return rv;
	}
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The group is done: its records are never trained again, here or after a
 * --resume. */
static int
mark_done(trainer *tr, uint64_t group)
{
	if (rl_gset_add(&tr->done, group) != RL_OK) {
		rl_error("out of memory for the set of groups done (%zu ranges)", tr->done.n);
		return RL_ENOMEM;
	}
	return RL_OK;
}

/* the grouper dropped a bad group: consumed */
static int
on_bad_group(void *ctx, uint64_t group)
{
	return mark_done(ctx, group);
}

static int
grow(void **p, int *cap, int need, size_t elt)
{
	if (need <= *cap)
		return RL_OK;
	int ncap = *cap ? *cap : 16;
	while (ncap < need)
		ncap *= 2;
	void *np = realloc(*p, (size_t)ncap * elt);
	if (!np)
		return RL_ENOMEM;
	*p = np;
	*cap = ncap;
	return RL_OK;
}

static void
free_groups(trainer *tr)
{
	for (int i = 0; i < tr->ngroups; i++)
		rl_group_fini(&tr->groups[i]);
	tr->ngroups = 0;
	tr->nseq = 0;
}

/* Collects the step's groups.  RL_OK with ngroups == batch, RL_ENOENT at the
 * end of the input (ngroups may be > 0: a partial last step is not trained). */
static int
collect(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	rl_group g;
	int rv;

	while (tr->ngroups < o->batch) {
		if ((rv = next_group(tr, &g)) != RL_OK)
			return rv;
		tr->groups_used++;
		if (o->algo == RL_ALGO_DAPO) {
			int keep;
			float *r = malloc(sizeof(float) * g.size);
			int goff[2] = { 0, g.size };
			for (int i = 0; i < g.size; i++)
				r[i] = g.s[i].reward;
			rl_groups_with_signal(&keep, r, goff, 1);
			free(r);
			if (!keep) {
				tr->dropped_nosignal++;
				rv = mark_done(tr, g.group);
				rl_group_fini(&g);
				if (rv != RL_OK)
					return rv;
				continue;
			}
		}
		if ((rv = grow((void **)&tr->groups, &tr->cap_groups, tr->ngroups + 1, sizeof g)) != 0)
			return rv;
		tr->groups[tr->ngroups++] = g;
	}
	return RL_OK;
}

/* ---- the step ------------------------------------------------------------------ */

/* KL estimator per token on the host (k1, k2, k3 as in ops.h). */
static float
kl_est(int type, float lp, float ref)
{
	float d = lp - ref;
	switch (type) {
	case 1: return d;
	case 2: return 0.5f * d * d;
	case 3: return expf(-d) + d - 1.0f;
	default: return 0;
	}
}

static int recompute_old(trainer *tr, const seqref *sq, int a0, int b0);

/* Lays out the step's sequences and computes advantages and the KL-in-reward
 * penalty.  ReMax baselines are taken out of the training set. */
static int
prepare(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	int ntok = 0, rv, G = 0;
	int *goff = NULL;
	float *rew = NULL, *adv = NULL, *base = NULL;

	tr->nseq = 0;
	for (int gi = 0; gi < tr->ngroups; gi++) {
		rl_group *g = &tr->groups[gi];
		float baseline = NAN;
		if (o->algo == RL_ALGO_REMAX) {
			for (int i = 0; i < g->size; i++)
				if (g->s[i].is_baseline)
					baseline = g->s[i].reward;
			if (isnan(baseline)) {
				rl_error("group %llu has no greedy baseline sample (remax)",
				    (unsigned long long)g->group);
				rl_hint("generate with rl-rollout --greedy-baseline");
				return RL_EFORMAT;
			}
		}
		for (int i = 0; i < g->size; i++) {
			rl_sample *s = &g->s[i];
			if (s->is_baseline)
				continue;
			if ((rv = grow((void **)&tr->seq, &tr->cap_seq, tr->nseq + 1, sizeof(seqref))) != 0)
				return rv;
			if (s->plen < 1) {
				rl_error("record %llu has an empty prompt (the first token is never predicted)",
				    (unsigned long long)s->id);
				return RL_EFORMAT;
			}
			if (s->plen + s->rlen - 1 > tr->maxtok || s->plen + s->rlen > tr->m->cfg.max_pos) {
				rl_error("record %llu: %d prompt + %d response tokens exceed the model's %d "
				    "positions or --max-tokens-per-micro %d", (unsigned long long)s->id,
				    s->plen, s->rlen, tr->m->cfg.max_pos, tr->maxtok);
				return RL_ETOOBIG;
			}
			tr->seq[tr->nseq] = (seqref){ s, ntok, s->reward, 0 };
			tr->nseq++;
			ntok += s->rlen;
		}
		G++;
	}
	if (ntok + 1 > tr->cap_tok) {
		int ncap = RL_MAX(ntok + 1, 2 * tr->cap_tok);
		float **arrs[] = { &tr->adv_tok, &tr->w_tok, &tr->old_tok, &tr->kl_tok, &tr->val_tok, &tr->ret_tok };
		for (size_t i = 0; i < RL_ARRAY_LEN(arrs); i++) {
			float *np = realloc(*arrs[i], (size_t)ncap * sizeof(float));
			if (!np)
				return RL_ENOMEM;
			*arrs[i] = np;
		}
		tr->cap_tok = ncap;
	}

	/* KL as a reward penalty, from the records' behaviour and reference log-probs */
	tr->reward_kl = 0;
	if (o->kl_type && o->kl_in_reward) {
		int nk = 0;
		for (int i = 0; i < tr->nseq; i++) {
			rl_sample *s = tr->seq[i].s;
			double sum = 0;
			if (!s->logprobs || !s->ref_logprobs) {
				rl_error("record %llu: --kl-in-reward needs 'logprobs' and 'ref_logprobs' in the records",
				    (unsigned long long)s->id);
				return RL_EFORMAT;
			}
			for (int t = 0; t < s->rlen; t++) {
				float k = kl_est(o->kl_type, s->logprobs[t], s->ref_logprobs[t]);
				tr->kl_tok[tr->seq[i].toff + t] = k;
				sum += k;
			}
			tr->seq[i].reward = (float)(s->reward - o->kl_coef * sum);
			if (s->rlen > 0) {
				tr->reward_kl += sum / s->rlen;
				nk++;
			}
		}
		/* verl's actor/reward_kl_penalty: the sequences' token means, averaged */
		tr->reward_kl = nk ? tr->reward_kl / nk : 0;
	}

	int S = tr->nseq;
	int *toff = malloc(sizeof(int) * (S + 1));
	goff = malloc(sizeof(int) * (G + 1));
	rew = malloc(sizeof(float) * (S + 1));
	adv = malloc(sizeof(float) * (S + 1));
	base = malloc(sizeof(float) * (S + 1));
	if (!toff || !goff || !rew || !adv || !base) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < S; i++) {
		toff[i] = tr->seq[i].toff;
		rew[i] = tr->seq[i].reward;
	}
	toff[S] = ntok;
	/* group offsets over the training sequences (baselines removed) */
	{
		int si = 0, gi = 0;
		goff[0] = 0;
		for (int k = 0; k < tr->ngroups; k++) {
			rl_group *g = &tr->groups[k];
			for (int i = 0; i < g->size; i++)
				if (!g->s[i].is_baseline) {
					if (o->algo == RL_ALGO_REMAX)
						for (int j = 0; j < g->size; j++)
							if (g->s[j].is_baseline)
								base[si] = g->s[j].reward;
					si++;
				}
			goff[++gi] = si;
		}
	}
	switch (o->algo) {
	case RL_ALGO_GRPO:
	case RL_ALGO_DRGRPO:
	case RL_ALGO_DAPO:
	case RL_ALGO_GSPO:
	case RL_ALGO_RLOO: {
		rl_adv_cfg c;
		rl_adv_cfg_default(&c, o->algo);
		c.norm_std = o->algo == RL_ALGO_DRGRPO ? 0 : o->norm_std;
		if ((rv = rl_adv_outcome(adv, rew, goff, G, &c)) != 0)
			goto out;
		rl_adv_broadcast(tr->adv_tok, adv, toff, S);
		break;
	}
	case RL_ALGO_REMAX:
		/* verl's: the reward-to-go of the token rewards (the KL penalty per
		 * token when it is in the reward) minus the greedy sample's reward */
		for (int i = 0; i < S; i++)
			rew[i] = tr->seq[i].s->reward;
		if ((rv = rl_adv_remax_tok(tr->adv_tok, rew, base, o->kl_in_reward && o->kl_type ? tr->kl_tok : NULL,
		    o->kl_coef, toff, S)) != 0)
			goto out;
		break;
	case RL_ALGO_REINFORCEPP:
		/* token-level: rewards with the KL penalty per token when it is in the reward */
		for (int i = 0; i < S; i++)
			rew[i] = tr->seq[i].s->reward;
		if ((rv = rl_adv_reinforcepp(tr->adv_tok, rew, o->kl_in_reward && o->kl_type ? tr->kl_tok : NULL,
		    o->kl_coef, toff, S, o->gamma)) != 0)
			goto out;
		break;
	case RL_ALGO_PPO:
		/* V_old and π_old of every sequence of the step (every rank: GAE and the
		 * whitening need the whole step), then GAE on token rewards */
		memset(tr->adv_tok, 0, sizeof(float) * (size_t)ntok);
		memset(tr->w_tok, 0, sizeof(float) * (size_t)ntok);
		if ((rv = recompute_old(tr, tr->seq, 0, S)) != 0)
			goto out;
		for (int i = 0; i < S; i++)
			rew[i] = tr->seq[i].s->reward;
		if ((rv = rl_adv_gae(tr->adv_tok, tr->ret_tok, rew, o->kl_in_reward && o->kl_type ? tr->kl_tok : NULL,
		    o->kl_coef, tr->val_tok, toff, S, o->gamma, o->lambda, o->whiten_adv)) != 0)
			goto out;
		break;
	case RL_ALGO_SFT:
		for (int t = 0; t < ntok; t++)
			tr->adv_tok[t] = 1.0f;
		break;
	default:
		rv = RL_ENOTSUP;
		goto out;
	}
	/* --skip-zero-adv: a sequence whose every advantage is exactly 0 (a group
	 * whose samples all got the same reward) adds -0 * ratio to the loss and
	 * an exactly zero gradient; its tokens still count in the loss weights,
	 * which mini_weights computes over all of the mini-batch */
	tr->nskip = 0;
	tr->tok_skip = 0;
	tr->tok_all = ntok;
	for (int i = 0; tr->skip_zero && i < S; i++) {
		seqref *q = &tr->seq[i];
		int z = 1;
		for (int t = 0; t < q->s->rlen && z; t++)
			z = tr->adv_tok[q->toff + t] == 0.0f;
		q->skip = z;
		tr->nskip += z;
		tr->tok_skip += z ? q->s->rlen : 0;
	}
	rv = RL_OK;
out:
	free(toff);
	free(goff);
	free(rew);
	free(adv);
	free(base);
	return rv;
}

/* Sequences [a, b) of the step form one mini-batch: per-token loss weights. */
static int
mini_weights(trainer *tr, int a, int b)
{
	int S = b - a, maxlen = 0, rv, masked = 0;
	int *toff = malloc(sizeof(int) * (S + 1));
	uint8_t *mask = NULL;

	if (!toff)
		return RL_ENOMEM;
	for (int i = 0; i < S; i++) {
		toff[i] = tr->seq[a + i].toff - tr->seq[a].toff;
		maxlen = RL_MAX(maxlen, tr->seq[a + i].s->rlen);
		masked |= tr->seq[a + i].s->loss_mask != NULL;
	}
	toff[S] = (b < tr->nseq ? tr->seq[b].toff : tr->seq[tr->nseq - 1].toff + tr->seq[tr->nseq - 1].s->rlen) -
	    tr->seq[a].toff;
	if (masked) {
		/* records' loss_mask: their 0 tokens get no weight and do not count */
		if ((mask = malloc((size_t)toff[S] + 1)) == NULL) {
			free(toff);
			return RL_ENOMEM;
		}
		for (int i = 0; i < S; i++) {
			const rl_sample *s = tr->seq[a + i].s;
			for (int t = 0; t < s->rlen; t++)
				mask[toff[i] + t] = s->loss_mask ? s->loss_mask[t] : 1;
		}
		tr->has_mask = 1;
	}
	rv = rl_loss_weights_masked(tr->w_tok + tr->seq[a].toff, toff, S, tr->agg,
	    tr->o->norm_len > 0 ? tr->o->norm_len : RL_MAX(maxlen, 1), mask);
	free(mask);
	free(toff);
	return rv;
}

/* Fills the host (B, T) buffers for the B sequences sq; returns T. */
static int
fill_rows(trainer *tr, const seqref *sq, int B)
{
	int T = 0;

	for (int i = 0; i < B; i++)
		T = RL_MAX(T, sq[i].s->plen + sq[i].s->rlen - 1);
	for (int r = 0; r < B; r++) {
		const seqref *q = &sq[r];
		rl_sample *s = q->s;
		int L = s->plen + s->rlen;
		for (int t = 0; t < T; t++) {
			int n = r * T + t, j = t - (s->plen - 1); /* response token index predicted at t */
			tr->h_tok[n] = t < s->plen ? s->prompt[t] : (t < L ? s->response[t - s->plen] : 0);
			if (j >= 0 && j < s->rlen) {
				tr->h_tgt[n] = s->response[j];
				tr->h_adv[n] = tr->adv_tok[q->toff + j];
				tr->h_w[n] = tr->w_tok[q->toff + j];
				tr->h_old[n] = tr->old_tok[q->toff + j];
				tr->h_beh[n] = s->logprobs ? s->logprobs[j] : 0.0f;
				tr->h_ref[n] = s->ref_logprobs ? s->ref_logprobs[j] : 0.0f;
			} else {
				tr->h_tgt[n] = -1;
				tr->h_adv[n] = tr->h_w[n] = tr->h_old[n] = tr->h_beh[n] = tr->h_ref[n] = 0;
			}
		}
	}
	return T;
}

/* The sequences of [a, b) of the step that are trained: *sq is tr->seq + a
 * and *n = b - a, or without those --skip-zero-adv skips, compacted into
 * tr->kseq (valid until the next call). */
static int
trained_seqs(trainer *tr, int a, int b, seqref **sq, int *n)
{
	int k = 0, rv;

	if (!tr->skip_zero || tr->nskip == 0) {
		*sq = tr->seq + a;
		*n = b - a;
		return RL_OK;
	}
	if ((rv = grow((void **)&tr->kseq, &tr->cap_kseq, RL_MAX(b - a, 1), sizeof(seqref))) != 0)
		return rv;
	for (int i = a; i < b; i++)
		if (!tr->seq[i].skip)
			tr->kseq[k++] = tr->seq[i];
	*sq = tr->kseq;
	*n = k;
	return RL_OK;
}

/* Micro-batch boundaries within sq[a, b): returns the first sequence not taken. */
static int
micro_end(trainer *tr, const seqref *sq, int a, int b)
{
	int T = 0, e = a;
	float temp = sq[a].s->temperature;

	while (e < b) {
		rl_sample *s = sq[e].s;
		int nT = RL_MAX(T, s->plen + s->rlen - 1);
		if (e > a && ((e - a + 1) * nT > tr->maxtok || s->temperature != temp))
			break;
		T = nT;
		e++;
	}
	return e;
}

/* Recompute the old log-probs of sequences sq[a0, b0) with the current
 * weights (and with a value head, their values V_old). */
static int
recompute_old(trainer *tr, const seqref *sq, int a0, int b0)
{
	int rv;
	for (int a = a0; a < b0;) {
		int e = micro_end(tr, sq, a, b0), B = e - a, T = fill_rows(tr, sq + a, B);
		double t0 = rl_now();
		rv = rl_model_forward(tr->m, tr->h_lp, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T,
		    sq[a].s->temperature);
		tr->t_model += rl_now() - t0;
		if (rv != 0)
			return rv;
		if (tr->m->val) {
			tr->ops->download(tr->ops, tr->h_v, tr->m->val, sizeof(float) * (size_t)B * T);
			if ((rv = tr->ops->status(tr->ops)) != 0)
				return rv;
		}
		for (int r = 0; r < B; r++) {
			rl_sample *s = sq[a + r].s;
			for (int j = 0; j < s->rlen; j++) {
				tr->old_tok[sq[a + r].toff + j] = tr->h_lp[r * T + s->plen - 1 + j];
				if (tr->m->val)
					tr->val_tok[sq[a + r].toff + j] = tr->h_v[r * T + s->plen - 1 + j];
			}
		}
		a = e;
	}
	return RL_OK;
}

/* PPO: the clipped value loss of the micro-batch sq[0, B) laid out in rows
 * of T by fill_rows, after its forward; its gradient (times vf_coef) to d_dval. */
static int
value_loss(trainer *tr, const seqref *sq, int B, int T, mstat *ms)
{
	const rl_train_opts *o = tr->o;
	int N = B * T, nclip = 0;

	tr->ops->download(tr->ops, tr->h_v, tr->m->val, sizeof(float) * (size_t)N);
	memset(tr->h_vold, 0, sizeof(float) * (size_t)N);
	memset(tr->h_ret, 0, sizeof(float) * (size_t)N);
	for (int r = 0; r < B; r++) {
		const seqref *q = &sq[r];
		for (int j = 0; j < q->s->rlen; j++) {
			int n = r * T + q->s->plen - 1 + j;
			tr->h_vold[n] = tr->val_tok[q->toff + j];
			tr->h_ret[n] = tr->ret_tok[q->toff + j];
			ms->vpred += tr->h_v[n];
		}
	}
	/* h_w is 0 on padding: those tokens get no loss and no gradient */
	ms->vf_loss += rl_value_loss(tr->h_dv, tr->h_v, tr->h_vold, tr->h_ret, tr->h_w, N, o->value_clip, &nclip);
	ms->vf_clip += nclip;
	for (int n = 0; n < N; n++)
		tr->h_dv[n] *= o->vf_coef;
	tr->ops->upload(tr->ops, tr->d_dval, tr->h_dv, sizeof(float) * (size_t)N);
	return tr->ops->status(tr->ops);
}

/* GSPO (verl's loss mode "gspo"): every token of a sequence takes the
 * sequence's importance ratio, exp of the mean over its tokens of lp - old.
 * pg_loss computes a token ratio exp(lp - old'); with old' = lp - mean that
 * ratio is the sequence's, and its gradient through lp is the token's own
 * (the mean is a constant there, as verl detaches it): GSPO-token, which
 * verl computes.  The mean is over the tokens trained on (loss_mask), capped
 * at 10 as verl caps the log-ratio.  old_h is the host pi_old (N); the result
 * goes to d_old. */
static int
gspo_old(trainer *tr, const seqref *sq, int B, int T, const float *old_h)
{
	rl_ops *ops = tr->ops;
	size_t nb = (size_t)B * T * sizeof(float);

	ops->download(ops, tr->h_lp, tr->m->lp, nb);
	if (ops->status(ops) != 0)
		return ops->status(ops);
	memcpy(tr->h_gspo, old_h, nb);
	for (int r = 0; r < B; r++) {
		const rl_sample *smp = sq[r].s;
		double sum = 0;
		int cnt = 0;
		for (int j = 0; j < smp->rlen; j++) {
			int n = r * T + smp->plen - 1 + j;
			if (tr->has_mask && tr->h_w[n] == 0.0f)
				continue;
			sum += (double)tr->h_lp[n] - old_h[n];
			cnt++;
		}
		double mean = cnt ? sum / cnt : 0;
		if (mean > 10)
			mean = 10;
		for (int j = 0; j < smp->rlen; j++) {
			int n = r * T + smp->plen - 1 + j;
			tr->h_gspo[n] = (float)((double)tr->h_lp[n] - mean);
		}
	}
	ops->upload(ops, tr->d_old, tr->h_gspo, nb);
	return ops->status(ops);
}

/* One micro-batch, the B sequences sq: forward, loss, backward (gradients
 * accumulated), statistics into ms. */
static int
micro(trainer *tr, const seqref *sq, int B, int recomputed, mstat *ms)
{
	const rl_train_opts *o = tr->o;
	rl_ops *ops = tr->ops;
	int T = fill_rows(tr, sq, B), N = B * T, rv;
	float temp = sq[0].s->temperature;
	rl_pg_params p = { 0 };
	const float *ref = NULL, *beh = NULL, *old;
	int want_ent = o->ent_coef != 0;

	double t0 = rl_now();
	rv = rl_model_forward(tr->m, NULL, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T, temp);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		return rv;
	size_t nb = (size_t)N * sizeof(float);
	ops->upload(ops, tr->d_adv, tr->h_adv, nb);
	ops->upload(ops, tr->d_w, tr->h_w, nb);
	if (o->old_from_behaviour) {
		ops->upload(ops, tr->d_old, tr->h_beh, nb);
		old = tr->d_old;
	} else if (recomputed) {
		ops->upload(ops, tr->d_old, tr->h_old, nb);
		old = tr->d_old;
	} else {
		old = tr->m->lp; /* one pass: pi_old is the current policy (gspo's ratio is 1 too) */
	}
	if (o->algo == RL_ALGO_GSPO && old == tr->d_old &&
	    (rv = gspo_old(tr, sq, B, T, o->old_from_behaviour ? tr->h_beh : tr->h_old)) != 0)
		return rv;
	if (o->tis_cap > 0 && !o->old_from_behaviour) {
		for (int i = 0; i < B; i++)
			if (!sq[i].s->logprobs) {
				rl_error("record %llu: --tis-cap needs behaviour 'logprobs' in the records",
				    (unsigned long long)sq[i].s->id);
				return RL_EFORMAT;
			}
		ops->upload(ops, tr->d_beh, tr->h_beh, nb);
		beh = tr->d_beh;
	}
	if (o->kl_type && !o->kl_in_reward) {
		if (tr->ref) {
			if ((rv = rl_model_forward(tr->ref, NULL, NULL, tr->h_tok, tr->h_tgt, NULL, NULL, B, T, temp)) != 0)
				return rv;
			ref = tr->ref->lp;
		} else {
			for (int i = 0; i < B; i++)
				if (!sq[i].s->ref_logprobs) {
					rl_error("record %llu: the KL term needs 'ref_logprobs' in the records or --ref MODEL_DIR",
					    (unsigned long long)sq[i].s->id);
					return RL_EFORMAT;
				}
			ops->upload(ops, tr->d_ref, tr->h_ref, nb);
			ref = tr->d_ref;
		}
	}
	p.clip_low = o->clip_low;
	p.clip_high = o->clip_high;
	p.dual_clip = o->dual_clip;
	p.tis_cap = o->tis_cap;
	p.kl_coef = ref ? o->kl_coef : 0;
	p.kl_type = o->kl_type ? o->kl_type : 1;
	p.ent_coef = o->ent_coef;
	ops->pg_loss(ops, tr->d_dlp, want_ent ? tr->d_dent : NULL, tr->d_stats, tr->m->lp, old, beh, ref,
	    want_ent ? tr->m->ent : NULL, tr->d_adv, tr->d_w, N, &p);
	if (o->algo == RL_ALGO_PPO && (rv = value_loss(tr, sq, B, T, ms)) != 0)
		return rv;
	t0 = rl_now();
	rv = rl_model_backward_value(tr->m, tr->d_dlp, want_ent ? tr->d_dent : NULL,
	    o->algo == RL_ALGO_PPO ? tr->d_dval : NULL);
	if (rv == 0)
		rv = ops->sync(ops);
	tr->t_model += rl_now() - t0;
	if (rv != 0)
		return rv;
	/* statistics for the metrics line */
	ops->download(ops, tr->h_stats, tr->d_stats, nb * RL_PG_NSTAT);
	ops->download(ops, tr->h_lp, tr->m->lp, nb);
	ops->download(ops, tr->h_ent, tr->m->ent, nb);
	if ((rv = ops->status(ops)) != 0)
		return rv;
	for (int n = 0; n < N; n++) {
		if (tr->h_tgt[n] < 0 || (tr->has_mask && tr->h_w[n] == 0.0f))
			continue;
		float *st = tr->h_stats + (size_t)n * RL_PG_NSTAT;
		/* actor/pg_loss is the policy-gradient term alone, as verl's: the op's
		 * token loss also holds the KL and entropy terms, reported apart
		 * (actor/kl_loss, actor/entropy); taken out again here, in double */
		double pg = st[RL_PG_LOSS];
		if (ref != NULL)
			pg -= (double)p.kl_coef * st[RL_PG_KL];
		if (want_ent)
			pg += (double)p.ent_coef * tr->h_ent[n];
		ms->loss += (double)tr->h_w[n] * pg;
		/* verl's pg_clipfrac counts the ratio clip (-A clip(r) > -A r) and
		 * pg_clipfrac_lower the dual clip apart (max of those > -A c, A < 0);
		 * the op's CLIPPED flag is either (its stats are 0 where w is 0) */
		float A = tr->h_adv[n], r = st[RL_PG_RATIO], rc = fminf(fmaxf(r, 1.0f - p.clip_low), 1.0f + p.clip_high);
		if (tr->h_w[n] != 0) {
			ms->clip += -A * rc > -A * r;
			ms->clip_lower += p.dual_clip > 0 && A < 0 && fmaxf(-A * r, -A * rc) > -A * p.dual_clip;
		}
		ms->ratio_logsum += -logf(st[RL_PG_RATIO] > 0 ? st[RL_PG_RATIO] : 1e-30f);
		ms->kl += st[RL_PG_KL];
		ms->ent += tr->h_ent[n];
		ms->ce += -tr->h_lp[n];
		ms->ntok += 1;
	}
	return RL_OK;
}

/* ---- checkpoints ------------------------------------------------------------------- */

/* The positions of the records read but not trained, which --resume reads
 * again: those of groups still incomplete or complete but not yet in a step,
 * those of tr->groups when they were not trained (groups_pending), and those
 * an earlier --resume has still to read.  Ascending; *pos malloc'd. */
static int
pending_records(trainer *tr, uint64_t **pos, size_t *n)
{
	uint64_t *p;
	size_t np, extra = 0;
	int rv;

	if ((rv = rl_grouper_pending(tr->gr, &p, &np)) != RL_OK)
		return rv;
	if (tr->groups_pending)
		for (int gi = 0; gi < tr->ngroups; gi++)
			extra += (size_t)tr->groups[gi].size;
	extra += tr->npend - tr->ipend;
	if (extra) {
		uint64_t *q = realloc(p, (np + extra) * sizeof *q);
		if (!q) {
			free(p);
			return RL_ENOMEM;
		}
		p = q;
		for (int gi = 0; tr->groups_pending && gi < tr->ngroups; gi++)
			for (int k = 0; k < tr->groups[gi].size; k++)
				if (tr->groups[gi].s[k].pos)
					p[np++] = tr->groups[gi].s[k].pos;
		for (size_t i = tr->ipend; i < tr->npend; i++)
			if (tr->pend[i] > tr->records)
				p[np++] = tr->pend[i];
		qsort(p, np, sizeof *p, cmp_u64);
	}
	*pos = p;
	*n = np;
	return RL_OK;
}

static int
write_state(trainer *tr, const char *dir)
{
	char path[4200], *txt;
	cJSON *j = cJSON_CreateObject(), *pj;
	uint64_t *pend;
	size_t npend;
	int rv;

	if ((rv = pending_records(tr, &pend, &npend)) != RL_OK) {
		cJSON_Delete(j);
		return rv;
	}
	cJSON_AddNumberToObject(j, "global_step", tr->m->step);
	cJSON_AddNumberToObject(j, "version", tr->m->step);
	cJSON_AddNumberToObject(j, "records_consumed", (double)RL_MAX(tr->records, tr->skip_records));
	pj = cJSON_AddArrayToObject(j, "records_pending");
	for (size_t i = 0; i < npend; i++)
		cJSON_AddItemToArray(pj, cJSON_CreateNumber((double)pend[i]));
	free(pend);
	cJSON_AddNumberToObject(j, "groups_consumed", (double)tr->groups_used);
	{
		/* the group rule of --resume (docs/train.md): ids as decimal strings */
		rl_gset pg;
		cJSON *dj = rl_gset_to_json(&tr->done), *pj2 = NULL;
		rl_gset_init(&pg);
		rv = rl_grouper_pending_groups(tr->gr, &pg);
		for (int gi = 0; rv == RL_OK && tr->groups_pending && gi < tr->ngroups; gi++)
			rv = rl_gset_add(&pg, tr->groups[gi].group);
		if (rv == RL_OK)
			rv = rl_gset_add_all(&pg, &tr->pend_groups);
		if (rv == RL_OK)
			pj2 = rl_gset_to_json(&pg);
		rl_gset_fini(&pg);
		if (!dj || !pj2) {
			cJSON_Delete(dj);
			cJSON_Delete(pj2);
			cJSON_Delete(j);
			rl_error("out of memory writing the groups done in '%s'", dir);
			return RL_ENOMEM;
		}
		cJSON_AddItemToObject(j, "groups_done", dj);
		cJSON_AddItemToObject(j, "groups_pending", pj2);
	}
	cJSON_AddStringToObject(j, "algo", rl_algo_name(tr->o->algo));
	cJSON_AddNumberToObject(j, "seed", (double)tr->o->seed);
	txt = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	snprintf(path, sizeof path, "%s/trainer_state.json", dir);
	rv = rl_io_write_atomic(path, txt, strlen(txt), 0644);
	free(txt);
	return rv;
}

static void
remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[4096];

	if (!d)
		return;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* Keeps the newest `keep` step directories, and always the newest full one
 * (with optimizer state) so that --resume has something to start from. */
static void
prune(trainer *tr)
{
	DIR *d;
	struct dirent *e;
	int steps[4096], n = 0, full = -1;
	char p[4096];

	if (tr->o->keep <= 0 || !(d = opendir(tr->o->out_dir)))
		return;
	while ((e = readdir(d)) != NULL && n < 4096) {
		int s = rl_ckpt_step_num(e->d_name);
		if (s < 0)
			continue;
		steps[n++] = s;
		snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", tr->o->out_dir, e->d_name);
		if (access(p, R_OK) == 0 && s > full)
			full = s;
	}
	closedir(d);
	for (int i = 0; i < n; i++) {
		int newer = 0;
		for (int k = 0; k < n; k++)
			newer += steps[k] > steps[i];
		if (newer >= tr->o->keep && steps[i] != full) {
			snprintf(p, sizeof p, "%s/step-%08d", tr->o->out_dir, steps[i]);
			remove_dir(p);
		}
	}
}

/* Weights that went NaN or infinite are never published (rollout workers and
 * `latest` would follow them): one pass over the parameters, before anything
 * of the version leaves the process. */
static int
check_finite(trainer *tr)
{
	double ss = tr->ops->sumsq(tr->ops, tr->m->params, tr->m->tt.total);
	int rv;

	if ((rv = tr->ops->status(tr->ops)) != 0)
		return rv;
	if (isfinite(ss))
		return RL_OK;
	rl_error("step %d: the weights are not finite (NaN or infinite); version %d not published",
	    tr->m->step, tr->m->step);
	rl_hint("the update diverged: lower --lr, or check --beta1, --beta2 and --adam-eps");
	return RL_EINVAL;
}

/* Writes the step's checkpoint; push: also send it to --sync (not when the
 * same version is only rewritten with its optimizer state). */
static int
publish(trainer *tr, int full, int push)
{
	char dir[4096];
	int rv, every = tr->o->ckpt_every;

	if ((rv = check_finite(tr)) != 0)
		return rv;
	/* the weights group: straight from the parameters, before any file */
	if (push && tr->wg && (rv = rl_wgroup_send(tr->wg, tr->m->step)) != 0)
		return rv;
	if (push && (tr->ws || tr->wg) && every > 1 && !full && tr->m->step % every != 0) {
		/* --ckpt-every: rl-sync or the group carries this version; no directory, no fsync */
		rl_wver *v = NULL;
		if (!tr->ws)
			return RL_OK;
		if ((rv = rl_wver_from_ckpt(&v, tr->m, (uint64_t)tr->m->step)) == 0)
			rv = rl_wsync_publish(tr->ws, v, 1);
		rl_wver_destroy(v);
		if (rv != 0)
			rl_error("cannot publish version %d to '%s'", tr->m->step, tr->o->sync_url);
		return rv;
	}
	if ((rv = rl_ckpt_save(tr->m, tr->o->out_dir, full, dir, sizeof dir)) != 0)
		return rv;
	if (full && (rv = write_state(tr, dir)) != 0)
		return rv;
	/* rl-sync: the new version goes out as a delta against the last one */
	if (push && tr->ws && (rv = rl_wsync_publish_dir(tr->ws, dir, (uint64_t)tr->m->step, 1)) != 0) {
		rl_error("cannot publish version %d to '%s'", tr->m->step, tr->o->sync_url);
		return rv;
	}
	prune(tr);
	rl_verbose("published version %d in '%s'%s", tr->m->step, dir, full ? " (with optimizer)" : "");
	return RL_OK;
}

/* Makes --out ready before anything is computed (rank 0): a directory this
 * process can write in (created when missing); without --resume it must hold
 * no step directories of an earlier run (the new steps would collide with them
 * and --keep would prune the new ones as older); on --resume, step directories
 * newer than the checkpoint resumed from (resume_step; those written after it
 * without optimizer state) are removed and `latest` points back at it.  Temp
 * directories left by killed runs (.step-N.tmp.PID whose PID is gone) go. */
static int
prepare_out(const rl_train_opts *o, int resume_step)
{
	const char *root = o->out_dir;
	struct stat st;
	DIR *d;
	struct dirent *e;
	char p[4096];
	int first = -1, n = 0, rv = RL_OK;

	if (stat(root, &st) != 0) {
		if (errno != ENOENT || mkdir(root, 0755) != 0) {
			rl_error("cannot create '%s': %s", root, strerror(errno));
			return RL_EIO;
		}
	} else if (!S_ISDIR(st.st_mode)) {
		rl_error("--out '%s' is not a directory", root);
		return RL_EINVAL;
	}
	if (access(root, W_OK | X_OK) != 0) {
		rl_error("cannot write in '%s': %s", root, strerror(errno));
		return RL_EIO;
	}
	if (!(d = opendir(root))) {
		rl_error("cannot open '%s': %s", root, strerror(errno));
		return RL_EIO;
	}
	while ((e = readdir(d)) != NULL) {
		int s = rl_ckpt_step_num(e->d_name);
		long pid;
		char *dot;
		if (e->d_name[0] == '.' && (dot = strstr(e->d_name, ".tmp.")) != NULL &&
		    sscanf(dot, ".tmp.%ld", &pid) == 1 && pid > 0 &&
		    (pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))) {
			snprintf(p, sizeof p, "%s/%s", root, e->d_name);
			rl_verbose("removing '%s' (left by a run that was killed)", p);
			if (unlink(p) != 0)
				remove_dir(p);
			continue;
		}
		if (s < 0)
			continue;
		if (resume_step < 0) {
			if (first < 0 || s < first)
				first = s;
			n++;
		} else if (s > resume_step) {
			snprintf(p, sizeof p, "%s/%s", root, e->d_name);
			rl_warn("removing '%s': newer than the checkpoint resumed from (step %d)", p, resume_step);
			remove_dir(p);
		}
	}
	closedir(d);
	if (n > 0) {
		rl_error("'%s' already holds %d step directories of an earlier run (step-%08d, ...)", root, n, first);
		rl_hint("continue that run with --resume, or give a new --out");
		return RL_EEXIST;
	}
	if (resume_step >= 0) {
		char name[32], lnk[4096], ltmp[4096];
		snprintf(name, sizeof name, "step-%08d", resume_step);
		snprintf(lnk, sizeof lnk, "%s/latest", root);
		snprintf(ltmp, sizeof ltmp, "%s/.latest.tmp.%ld", root, (long)getpid());
		unlink(ltmp);
		if (symlink(name, ltmp) != 0 || rename(ltmp, lnk) != 0) {
			rl_error("cannot point '%s' at '%s': %s", lnk, name, strerror(errno));
			unlink(ltmp);
			rv = RL_EIO;
		}
	}
	return rv;
}

/* ---- the run -------------------------------------------------------------------------- */

static int
reserve(trainer *tr)
{
	rl_ops *ops = tr->ops;
	size_t n = (size_t)tr->maxtok;
	int rv;

	if ((rv = rl_model_train_reserve(tr->m, tr->maxtok)) != 0)
		return rv;
	if (tr->ref && (rv = rl_model_eval_reserve(tr->ref, tr->maxtok)) != 0)
		return rv;
	tr->h_tok = rl_try_calloc(n, sizeof(int32_t), "token rows");
	tr->h_tgt = rl_try_calloc(n, sizeof(int32_t), "target rows");
	tr->h_old = rl_try_calloc(n * (8 + RL_PG_NSTAT), sizeof(float), "per-token buffers");
	if (!tr->h_tok || !tr->h_tgt || !tr->h_old)
		return RL_ENOMEM;
	tr->h_beh = tr->h_old + n;
	tr->h_ref = tr->h_beh + n;
	tr->h_adv = tr->h_ref + n;
	tr->h_w = tr->h_adv + n;
	tr->h_lp = tr->h_w + n;
	tr->h_ent = tr->h_lp + n;
	tr->h_stats = tr->h_ent + n;
	tr->h_gspo = tr->h_stats + n * RL_PG_NSTAT;
	if ((rv = ops->alloc(ops, &tr->d_mem, n * (7 + RL_PG_NSTAT) * sizeof(float))) != 0)
		return rv;
	tr->d_old = tr->d_mem;
	tr->d_beh = tr->d_old + n;
	tr->d_ref = tr->d_beh + n;
	tr->d_adv = tr->d_ref + n;
	tr->d_w = tr->d_adv + n;
	tr->d_dlp = tr->d_w + n;
	tr->d_dent = tr->d_dlp + n;
	tr->d_stats = tr->d_dent + n;
	if (tr->m->vh_w >= 0) {
		if (!(tr->h_vold = rl_try_calloc(4 * n, sizeof(float), "value buffers")))
			return RL_ENOMEM;
		tr->h_ret = tr->h_vold + n;
		tr->h_v = tr->h_ret + n;
		tr->h_dv = tr->h_v + n;
		if ((rv = ops->alloc(ops, (void **)&tr->d_dval, n * sizeof(float))) != 0)
			return rv;
	}
	return RL_OK;
}

static int
write_metrics(trainer *tr, const mstat *ms, float gnorm, double lr, double t_step, double t_upd,
    double t_wait, int nupdates)
{
	const rl_train_opts *o = tr->o;
	cJSON *j = cJSON_CreateObject();
	int step = tr->m->step, S = tr->nseq, err;
	double rsum = 0, rmin = INFINITY, rmax = -INFINITY, lsum = 0, lmax = 0, amin = INFINITY, amax = -INFINITY,
	    asum = 0, stal = 0, stalmax = 0, clipped = 0, acc = 0;
	long ntok = 0;
	char *txt;

	for (int i = 0; i < S; i++) {
		rl_sample *s = tr->seq[i].s;
		double a = s->rlen ? tr->adv_tok[tr->seq[i].toff] : 0;
		rsum += s->reward;
		rmin = fmin(rmin, s->reward);
		rmax = fmax(rmax, s->reward);
		acc += s->reward > 0;
		lsum += s->rlen;
		lmax = fmax(lmax, s->rlen);
		ntok += s->plen + s->rlen;
		clipped += strcmp(s->finish, "length") == 0;
		asum += a;
		amin = fmin(amin, a);
		amax = fmax(amax, a);
		if (s->ver_first >= 0) {
			/* the policy that generated it vs the one being updated (version = step before update) */
			double d = (step - 1) - s->ver_first;
			stal += d;
			stalmax = fmax(stalmax, d);
		}
	}
	/* the token statistics cover the trained tokens (not the skipped ones);
	 * none trained: 0, as before (the broker's charts and /metrics want numbers) */
	double nt = ms->ntok > 0 ? ms->ntok : 1;
	cJSON_AddNumberToObject(j, "step", step);
	metric(j, tr, step, "training/global_step", step);
	if (o->algo == RL_ALGO_SFT) {
		metric(j, tr, step, "actor/sft_loss", ms->ce / nt);
	} else {
		metric(j, tr, step, "actor/pg_loss", ms->loss / nupdates);
		metric(j, tr, step, "actor/pg_clipfrac", ms->clip / nt);
		metric(j, tr, step, "actor/pg_clipfrac_lower", ms->clip_lower / nt);
		metric(j, tr, step, "actor/ppo_kl", ms->ratio_logsum / nt);
		if (o->kl_type && !o->kl_in_reward)
			metric(j, tr, step, "actor/kl_loss", ms->kl / nt);
		if (o->kl_type && o->kl_in_reward) {
			metric(j, tr, step, "actor/reward_kl_penalty", tr->reward_kl);
			metric(j, tr, step, "actor/reward_kl_penalty_coeff", o->kl_coef);
		}
	}
	metric(j, tr, step, "actor/entropy", ms->ent / nt);
	metric(j, tr, step, "actor/grad_norm", gnorm);
	metric(j, tr, step, "actor/lr", lr);
	if (o->algo != RL_ALGO_SFT) {
		metric(j, tr, step, "critic/score/mean", S ? rsum / S : NAN);
		metric(j, tr, step, "critic/score/max", rmax);
		metric(j, tr, step, "critic/score/min", rmin);
		metric(j, tr, step, "critic/score/positive_frac", S ? acc / S : NAN);
		metric(j, tr, step, "critic/advantages/mean", S ? asum / S : NAN);
		metric(j, tr, step, "critic/advantages/max", amax);
		metric(j, tr, step, "critic/advantages/min", amin);
		/* --skip-zero-adv: the share of the step not run through the model */
		metric(j, tr, step, "actor/skipped_seq_frac", S ? (double)tr->nskip / S : NAN);
		metric(j, tr, step, "actor/skipped_token_frac", tr->tok_all ? (double)tr->tok_skip / tr->tok_all : NAN);
	}
	if (o->algo == RL_ALGO_PPO) {
		int ntk = S ? tr->seq[S - 1].toff + tr->seq[S - 1].s->rlen : 0;
		rl_stat3 vs = rl_stat_f32(tr->val_tok, (size_t)ntk), rs = rl_stat_f32(tr->ret_tok, (size_t)ntk);
		metric(j, tr, step, "critic/vf_loss", ms->vf_loss / nupdates);
		metric(j, tr, step, "critic/vf_clipfrac", ms->vf_clip / nt);
		metric(j, tr, step, "critic/vpred_mean", ms->vpred / nt);
		metric(j, tr, step, "critic/vf_explained_var", rl_explained_var(tr->val_tok, tr->ret_tok, ntk));
		metric(j, tr, step, "critic/values/mean", vs.mean);
		metric(j, tr, step, "critic/values/max", vs.max);
		metric(j, tr, step, "critic/values/min", vs.min);
		metric(j, tr, step, "critic/returns/mean", rs.mean);
		metric(j, tr, step, "critic/returns/max", rs.max);
		metric(j, tr, step, "critic/returns/min", rs.min);
	}
	metric(j, tr, step, "response_length/mean", S ? lsum / S : NAN);
	metric(j, tr, step, "response_length/max", lmax);
	metric(j, tr, step, "response_length/clip_ratio", S ? clipped / S : NAN);
	metric(j, tr, step, "timing_s/gen", t_wait);
	metric(j, tr, step, "timing_s/update_actor", t_upd);
	metric(j, tr, step, "timing_s/model", tr->t_model);
	metric(j, tr, step, "timing_s/publish", tr->t_pub);
	if (tr->world > 1) {
		int nb, early = rl_comm_reducer_early(tr->red, &nb);
		metric(j, tr, step, "timing_s/allreduce", tr->t_comm);
		metric(j, tr, step, "dp/world_size", tr->world);
		/* the share of the last update's gradient buckets sent during its backward pass */
		metric(j, tr, step, "dp/buckets_overlapped_frac", nb ? (double)early / nb : NAN);
		metric(j, tr, step, "dp/zero_stage", tr->zero);
	}
	{
		/* this rank's AdamW state, resident memory now and at its peak */
		struct rusage ru;
		size_t nopt = tr->zero ? tr->zhi - tr->zlo : tr->m->tt.total;
		metric(j, tr, step, "memory/optimizer_state_mb", 2.0 * (double)nopt * sizeof(float) / (1 << 20));
		long pages = 0;
		FILE *f = fopen("/proc/self/statm", "r");
		if (f && fscanf(f, "%*s %ld", &pages) == 1)
			metric(j, tr, step, "memory/rss_mb", (double)pages * (double)sysconf(_SC_PAGESIZE) / (1 << 20));
		if (f)
			fclose(f);
		if (getrusage(RUSAGE_SELF, &ru) == 0)
			metric(j, tr, step, "memory/max_rss_mb", ru.ru_maxrss / 1024.0);
	}
	/* the share of the step (update + publish) spent outside the model's compute */
	metric(j, tr, step, "perf/overhead_frac",
	    t_upd + tr->t_pub > 0 ? (t_upd + tr->t_pub - tr->t_model) / (t_upd + tr->t_pub) : NAN);
	metric(j, tr, step, "timing_s/step", t_step);
	metric(j, tr, step, "perf/total_num_tokens", (double)ntok);
	metric(j, tr, step, "perf/throughput", t_upd > 0 ? ntok / t_upd : NAN);
	metric(j, tr, step, "staleness/mean", S ? stal / S : NAN);
	metric(j, tr, step, "staleness/max", stalmax);
	metric(j, tr, step, "train/sequences", S);
	metric(j, tr, step, "train/groups_dropped_no_signal", (double)tr->dropped_nosignal);
	metric(j, tr, step, "train/steps_skipped", (double)tr->steps_skipped);
	txt = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	rl_wstat_train_metrics(tr->wst, txt);
	rl_wstat_add(tr->wst, (uint64_t)S, (uint64_t)ntok);
	if (tr->metrics == stderr)
		rl_progress_clear(&tr->prog);
	errno = 0;
	fprintf(tr->metrics, "%s\n", txt);
	fflush(tr->metrics);
	err = errno;
	free(txt);
	if (tr->tf)
		rl_tfevents_flush(tr->tf);
	if (ferror(tr->metrics)) {
		const char *path = tr->o->metrics_path;
		rl_error("cannot write '%s': %s", !path ? "(standard error)" : strcmp(path, "-") == 0 ?
		    "(standard output)" : path, err ? strerror(err) : "write error");
		return RL_EIO;
	}
	return RL_OK;
}

/* ---- data parallelism ------------------------------------------------------------------ */

/* Sums the gradients of every rank, in buckets of byte ranges of m->grads
 * (rl_comm_reducer): those the last backward handed over already are in
 * flight or done; the rest go now.  t_comm counts the wait, i.e. the part of
 * the all-reduce not hidden behind the backward pass. */
static int
allreduce_grads(trainer *tr)
{
	double t0 = rl_now();
	int rv;

	if ((rv = tr->ops->sync(tr->ops)) != 0)
		return rv;
	rv = rl_comm_reducer_wait(tr->red);
	tr->t_comm += rl_now() - t0;
	return rv;
}

static int
dp_grad_ready(void *ctx, size_t from)
{
	return rl_comm_reducer_ready(ctx, from);
}

static int
dp_reducer_open(trainer *tr)
{
	size_t total = tr->m->tt.total;
	size_t bucket = (size_t)(tr->o->dp_bucket_mb * (1 << 20)) / sizeof(float);
	int rv;

	if ((rv = rl_comm_reducer_create(&tr->red, tr->comm, tr->m->grads, total, bucket ? bucket : total,
	    tr->o->dp_overlap)) != 0)
		return rv;
	rl_verbose("gradient all-reduce: %zu buckets of %g MiB, %s", (total + bucket - 1) / (bucket ? bucket : total),
	    tr->o->dp_bucket_mb, rl_comm_reducer_overlaps(tr->red) ? "overlapped with the backward pass" :
	    "after the backward pass");
	return RL_OK;
}

/* Queue mode with several ranks: rank 0 alone leases from the broker and
 * passes each lease's records to the others (the compressed frame, as the
 * broker sent it), so every rank's grouper sees the same records in the same
 * order and forms the same steps; acknowledgements stay with rank 0.  A
 * message: u64 end flag, u64 frame bytes, then the frame.  end: no more
 * records (1: idle exit, signal; 2: the broker is gone).  Rank 0 sends one after every poll of the
 * broker, records or not, so the others never wait longer than a poll. */
static int
dp_send_lease(trainer *tr, int end)
{
	const void *frame = NULL;
	uint64_t hdr[2] = { (uint64_t)end, 0 };
	rl_buf b;
	int rv;

	if (tr->world == 1)
		return RL_OK;
	rl_buf_init(&b);
	if (!end && rl_qlease_count(&tr->lease) > 0) {
		size_t fn = 0;
		if (rl_traj_batch_frame(tr->lease.batch, &frame, &fn) != RL_OK) {
			if ((rv = rl_traj_batch_encode(&b, tr->lease.batch, 0)) != 0)
				goto out;
			frame = b.p;
			fn = b.len;
		}
		hdr[1] = fn;
	}
	if ((rv = rl_comm_host_broadcast(tr->comm, hdr, sizeof hdr, 0)) == 0 && hdr[1])
		rv = rl_comm_host_broadcast(tr->comm, (void *)frame, (size_t)hdr[1], 0);
out:
	rl_buf_fini(&b);
	return rv;
}

/* Rank 0: no more records; RL_ENOENT once the others know. */
static int
dp_end_lease(trainer *tr)
{
	int rv = dp_send_lease(tr, tr->qgone ? 2 : 1);
	return rv ? rv : RL_ENOENT;
}

/* Ranks > 0 in queue mode: the next message of dp_send_lease into the
 * grouper.  RL_OK (records or none yet), RL_ENOENT when rank 0 ends. */
static int
dp_follow_lease(trainer *tr)
{
	uint64_t hdr[2];
	uint8_t *buf;
	rl_traj_limits lim;
	size_t used;
	char where[128];
	int rv;

	if ((rv = rl_comm_host_broadcast(tr->comm, hdr, sizeof hdr, 0)) != 0)
		return rv;
	if (hdr[0]) {
		tr->qgone = hdr[0] == 2;
		return RL_ENOENT;
	}
	if (hdr[1] == 0)
		return RL_OK;
	if (hdr[1] > ((uint64_t)1 << 32)) {
		rl_error("rank 0 sent a lease of %llu bytes (corrupt message)", (unsigned long long)hdr[1]);
		return RL_EFORMAT;
	}
	if (!(buf = rl_try_malloc((size_t)hdr[1], "lease from rank 0")))
		return RL_ENOMEM;
	rl_traj_limits_default(&lim);
	if ((rv = rl_comm_host_broadcast(tr->comm, buf, (size_t)hdr[1], 0)) == 0)
		rv = rl_traj_batch_decode(tr->lease.batch, &used, buf, (size_t)hdr[1], &lim, "lease from rank 0");
	free(buf);
	for (size_t i = 0, n = rl_traj_batch_count(tr->lease.batch); rv == 0 && i < n; i++) {
		int32_t gs;
		if ((rv = rl_traj_batch_get(tr->lease.batch, i, tr->qt)) != 0)
			break;
		if (rl_traj_get_i32(tr->qt, RL_TAG_GROUP_SIZE, &gs) == RL_OK && gs > 0)
			tr->last_gsize = gs;
		tr->records++;
		snprintf(where, sizeof where, "'%s' (through rank 0): record %zu", tr->o->queue_url, i);
		rv = rl_grouper_add(tr->gr, tr->qt, where);
	}
	return rv;
}

/* ---- ZeRO-1 ----------------------------------------------------------------------------- */

/* Full AdamW moments in m->m, m->v (zeroed), for a while: loading them on
 * --resume, writing them in a checkpoint (rank 0). */
static int
zero_full_alloc(trainer *tr)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t bytes = m->tt.total * sizeof(float);
	int rv;

	if (m->m)
		return RL_OK;
	if ((rv = o->alloc(o, (void **)&m->m, bytes)) != 0 || (rv = o->alloc(o, (void **)&m->v, bytes)) != 0)
		return rv;
	o->zero(o, m->m, bytes); /* the padding between tensors too */
	o->zero(o, m->v, bytes);
	return o->status(o);
}

/* Every rank keeps the AdamW moments of its shard [zlo, zhi) of the flat
 * parameter space (rl_comm_shard), never the full ones (m->no_adam_state):
 * the shard of the state loaded on --resume (the same file on every rank,
 * whatever world size wrote it; then dropped), zeros otherwise. */
static int
zero_open(trainer *tr)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t n, bytes;
	int rv;

	rl_comm_shard(tr->comm, m->tt.total, tr->rank, &tr->zlo, &tr->zhi);
	n = tr->zhi - tr->zlo;
	bytes = (n ? n : 1) * sizeof(float);
	if ((rv = o->alloc(o, (void **)&tr->zm, bytes)) != 0 || (rv = o->alloc(o, (void **)&tr->zv, bytes)) != 0)
		return rv;
	if (m->m) {
		o->copy(o, tr->zm, m->m + tr->zlo, n * sizeof(float));
		o->copy(o, tr->zv, m->v + tr->zlo, n * sizeof(float));
	} else {
		o->zero(o, tr->zm, n * sizeof(float));
		o->zero(o, tr->zv, n * sizeof(float));
	}
	if ((rv = o->sync(o)) != 0)
		return rv;
	o->free(o, m->m);
	o->free(o, m->v);
	m->m = m->v = NULL;
	tr->zero = 1;
	rl_verbose("ZeRO-1: AdamW state of elements [%zu, %zu) of %zu here (%.1f MiB instead of %.1f)", tr->zlo,
	    tr->zhi, m->tt.total, 2.0 * n * sizeof(float) / (1 << 20), 2.0 * m->tt.total * sizeof(float) / (1 << 20));
	return RL_OK;
}

/* One AdamW update, ZeRO-1: reduce-scatter the gradients, the global norm
 * from every shard's sum of squares, AdamW on the own shard (tensor by
 * tensor, for the weight-decay flags), all-gather the parameters.  The same
 * arithmetic as rl_model_step on the same sums. */
static int
zero_step(trainer *tr, const rl_adamw *p, float *grad_norm)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t total = m->tt.total, lo = tr->zlo, hi = tr->zhi;
	double t0 = rl_now(), ss, tc;
	float scale = 1.0f;
	int rv;

	/* the caller counts this call as model time: the communication is t_comm's */
	if ((rv = o->sync(o)) != 0 || (rv = rl_comm_reduce_scatter(tr->comm, m->grads, total)) != 0)
		return rv;
	tc = rl_now() - t0;
	ss = hi > lo ? o->sumsq(o, m->grads + lo, hi - lo) : 0.0;
	if ((rv = rl_comm_host_allreduce_f64(tr->comm, &ss, 1)) != 0)
		return rv;
	double norm = sqrt(ss);
	*grad_norm = (float)norm;
	if (!isfinite(norm)) {
		rl_warn("gradient norm is %g; step skipped", norm);
		rl_model_zero_grad(m);
		return o->status(o);
	}
	if (p->max_grad_norm > 0)
		scale = (float)RL_MIN(1.0, p->max_grad_norm / (norm + 1e-6));
	m->step++;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		size_t a = RL_MAX(t->off, lo), b = RL_MIN(t->off + t->n, hi);
		if (a >= b)
			continue;
		o->adamw(o, m->params + a, NULL, m->grads + a, tr->zm + (a - lo), tr->zv + (a - lo), b - a,
		    rl_adamw_lr(p, t), p->beta1, p->beta2, p->eps,
		    (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f, m->step, scale);
	}
	rl_model_zero_grad(m);
	t0 = rl_now();
	if ((rv = o->sync(o)) != 0 || (rv = rl_comm_allgather_shards(tr->comm, m->params, total)) != 0)
		return rv;
	tc += rl_now() - t0;
	tr->t_comm += tc;
	tr->t_model -= tc;
	return rl_model_params_changed(m);
}

/* Before a full checkpoint (every rank): rank 0 collects the shards of the
 * AdamW state into full m->m, m->v (the layout rl_ckpt_save writes), in
 * pieces of 4 MiB broadcast from each shard's owner. */
static int
zero_gather_opt(trainer *tr)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t total = m->tt.total, piece = (size_t)1 << 20;
	float *h = rl_try_malloc(piece * sizeof(float), "optimizer state piece");
	int rv = RL_OK;

	if (!h)
		return RL_ENOMEM;
	if (tr->rank == 0 && (rv = zero_full_alloc(tr)) != 0)
		goto out;
	for (int k = 0; k < 2 && rv == 0; k++) {
		const float *mine = k ? tr->zv : tr->zm;
		float *full = k ? m->v : m->m;
		for (int r = 0; r < tr->world && rv == 0; r++) {
			size_t lo, hi;
			rl_comm_shard(tr->comm, total, r, &lo, &hi);
			for (size_t off = lo; off < hi && rv == 0; off += piece) {
				size_t len = RL_MIN(piece, hi - off);
				if (tr->rank == r) {
					o->download(o, h, mine + (off - lo), len * sizeof(float));
					if ((rv = o->status(o)) != 0)
						break;
				}
				if (r != 0 && (rv = rl_comm_host_broadcast(tr->comm, h, len * sizeof(float), r)) != 0)
					break;
				if (tr->rank == 0) {
					o->upload(o, full + off, h, len * sizeof(float));
					rv = o->status(o);
				}
			}
		}
	}
out:
	free(h);
	return rv;
}

/* After the checkpoint: rank 0 drops the full state again. */
static void
zero_release_opt(trainer *tr)
{
	if (!tr->zero)
		return;
	tr->ops->free(tr->ops, tr->m->m);
	tr->ops->free(tr->ops, tr->m->v);
	tr->m->m = tr->m->v = NULL;
}

static uint64_t
fnv(uint64_t x, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		x = (x ^ b[i]) * 1099511628211ull;
	return x;
}

/* FNV-1a over the bytes of the master weights (downloaded in pieces). */
static int
weights_hash(trainer *tr, uint64_t *out)
{
	size_t total = tr->m->tt.total * sizeof(float), piece = (size_t)4 << 20;
	uint8_t *h = rl_try_malloc(RL_MIN(piece, total) + 1, "checksum buffer");
	uint64_t x = 1469598103934665603ull;
	int rv = RL_OK;

	if (!h)
		return RL_ENOMEM;
	for (size_t off = 0; off < total; off += piece) {
		size_t k = RL_MIN(piece, total - off);
		tr->ops->download(tr->ops, h, (const uint8_t *)tr->m->params + off, k);
		if ((rv = tr->ops->status(tr->ops)) != 0)
			break;
		x = fnv(x, h, k);
	}
	free(h);
	*out = x;
	return rv;
}

/* Every rank's weights must be bitwise rank 0's: the optimizer steps are
 * identical only if the gradients, options and starting points are. */
static int
check_same_weights(trainer *tr)
{
	uint64_t mine, *all;
	int rv;

	if ((rv = weights_hash(tr, &mine)) != 0)
		return rv;
	if (!(all = malloc(sizeof *all * (size_t)tr->world)))
		return RL_ENOMEM;
	rv = rl_comm_host_allgather(tr->comm, all, &mine, sizeof mine);
	for (int r = 1; rv == 0 && r < tr->world; r++)
		if (all[r] != all[0]) {
			rl_error("after step %d the weights of rank %d differ from rank 0's (the ranks diverged)",
			    tr->m->step, r);
			rl_hint("every rank must run with the same options and input");
			rv = RL_ECHECKSUM;
		}
	free(all);
	if (rv == 0)
		rl_verbose("step %d: weights identical on all %d ranks (checksum %016llx)", tr->m->step, tr->world,
		    (unsigned long long)mine);
	return rv;
}

/* Every rank must be about to train the same step, or all stop: exchanges
 * (have a step, hash of the step's sample ids).  *go = 0: the input ended. */
static int
agree_step(trainer *tr, int have, int *go)
{
	uint64_t mine[2] = { (uint64_t)have, 1469598103934665603ull }, *all;
	int rv, ends = 0;

	*go = have;
	if (tr->world == 1)
		return RL_OK;
	for (int g = 0; have && g < tr->ngroups; g++)
		for (int i = 0; i < tr->groups[g].size; i++) {
			const rl_sample *q = &tr->groups[g].s[i];
			mine[1] = fnv(mine[1], &q->id, sizeof q->id);
			mine[1] = fnv(mine[1], &q->reward, sizeof q->reward);
			mine[1] = fnv(mine[1], q->prompt, sizeof(int32_t) * (size_t)q->plen);
			mine[1] = fnv(mine[1], q->response, sizeof(int32_t) * (size_t)q->rlen);
		}
	if (!(all = malloc(sizeof mine * (size_t)tr->world)))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(tr->comm, all, mine, sizeof mine)) != 0)
		goto out;
	for (int r = 0; r < tr->world; r++)
		ends += all[2 * r] == 0;
	if (ends == tr->world) {
		*go = 0;
	} else if (ends > 0) {
		for (int r = 0; r < tr->world; r++)
			if (all[2 * r] == 0) {
				rl_error("rank %d ran out of input before step %d while rank %d has a full step", r,
				    tr->m->step + 1, all[0] ? 0 : (r + 1) % tr->world);
				break;
			}
		rl_hint("with several ranks every rank reads the whole input (the same file or stream)");
		rv = RL_EINVAL;
	} else {
		for (int r = 1; r < tr->world; r++)
			if (all[2 * r + 1] != all[1]) {
				rl_error("step %d: rank %d has other groups than rank 0", tr->m->step + 1, r);
				rl_hint("with several ranks every rank reads the whole input (the same file or stream)");
				rv = RL_EINVAL;
				break;
			}
	}
out:
	free(all);
	return rv;
}

static int
train_step(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	int rv, E = RL_MAX(o->ppo_epochs, 1), M = RL_MAX(o->mini_batches, 1), recomputed = 0, nupd = 0, n;
	seqref *sq;
	mstat ms = { 0 };
	float gnorm = 0;
	double t0 = rl_now(), lr = 0, t_wait = tr->t_wait;
	int step0 = tr->m->step;

	tr->t_wait = 0;
	tr->t_model = 0;
	if ((rv = prepare(tr)) != 0)
		return rv;
	if (tr->nseq == 0)
		return RL_OK;
	if (M > tr->nseq)
		M = tr->nseq;
	if (o->algo == RL_ALGO_PPO && !o->old_from_behaviour)
		recomputed = 1; /* prepare's pass over the step for V_old gave π_old too */
	if ((E > 1 || M > 1) && !o->old_from_behaviour && !recomputed) {
		/* each rank needs pi_old of the sequences it trains only */
		for (int mb = 0; mb < M; mb++) {
			int a = (int)((long)tr->nseq * mb / M), b = (int)((long)tr->nseq * (mb + 1) / M);
			int ra = a + (int)((long)(b - a) * tr->rank / tr->world);
			int rb = a + (int)((long)(b - a) * (tr->rank + 1) / tr->world);
			if ((rv = trained_seqs(tr, ra, rb, &sq, &n)) != 0 || (rv = recompute_old(tr, sq, 0, n)) != 0)
				return rv;
		}
		recomputed = 1;
	}
	tr->t_comm = 0;
	for (int ep = 0; ep < E; ep++) {
		for (int mb = 0; mb < M; mb++) {
			int a = (int)((long)tr->nseq * mb / M), b = (int)((long)tr->nseq * (mb + 1) / M);
			/* the weights of the whole mini-batch (global counts), on every rank */
			if ((rv = mini_weights(tr, a, b)) != 0)
				return rv;
			/* this rank's contiguous share of the mini-batch, less what is skipped;
			 * a rank left with nothing still takes part in the all-reduce */
			int ra = a + (int)((long)(b - a) * tr->rank / tr->world);
			int rb = a + (int)((long)(b - a) * (tr->rank + 1) / tr->world);
			if ((rv = trained_seqs(tr, ra, rb, &sq, &n)) != 0)
				return rv;
			for (int s = 0; s < n;) {
				int e = micro_end(tr, sq, s, n);
				/* the last backward completes the gradients: buckets go out as layers finish */
				if (tr->red && e == n) {
					tr->m->grad_ready = dp_grad_ready;
					tr->m->grad_ready_ctx = tr->red;
				}
				rv = micro(tr, sq + s, e - s, recomputed, &ms);
				tr->m->grad_ready = NULL;
				if (rv != 0)
					return rv;
				s = e;
			}
			if (tr->world > 1 && !tr->zero && (rv = allreduce_grads(tr)) != 0)
				return rv;
			rl_adamw ad = { 0 };
			lr = rl_lr_at(tr->m->step + 1, o->lr, o->warmup, o->total_steps, o->sched, o->min_lr_ratio);
			ad.lr = (float)lr;
			ad.beta1 = o->beta1;
			ad.beta2 = o->beta2;
			ad.eps = o->adam_eps;
			ad.weight_decay = o->weight_decay;
			ad.max_grad_norm = o->grad_clip;
			if (o->critic_lr > 0)
				ad.aux_lr = (float)rl_lr_at(tr->m->step + 1, o->critic_lr, o->warmup, o->total_steps,
				    o->sched, o->min_lr_ratio);
			double t1 = rl_now();
			rv = tr->zero ? zero_step(tr, &ad, &gnorm) : rl_model_step(tr->m, &ad, &gnorm);
			tr->t_model += rl_now() - t1;
			if (rv != 0)
				return rv;
			nupd++;
		}
	}
	if (tr->world > 1) {
		/* the metrics of the whole step: every rank's token statistics summed */
		double v[8] = { ms.loss, ms.clip, ms.kl, ms.ratio_logsum, ms.ent, ms.ce, ms.ntok, ms.clip_lower };
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 8)) != 0)
			return rv;
		ms.loss = v[0], ms.clip = v[1], ms.kl = v[2], ms.ratio_logsum = v[3], ms.ent = v[4], ms.ce = v[5];
		ms.ntok = v[6], ms.clip_lower = v[7];
	}
	if (tr->world > 1 && o->algo == RL_ALGO_PPO) {
		double v[3] = { ms.vf_loss, ms.vf_clip, ms.vpred };
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 3)) != 0)
			return rv;
		ms.vf_loss = v[0], ms.vf_clip = v[1], ms.vpred = v[2];
	}
	ms.vf_clip /= E;
	ms.vpred /= E;
	ms.ntok /= E; /* statistics averaged over the passes */
	ms.clip /= E;
	ms.clip_lower /= E;
	ms.ratio_logsum /= E;
	ms.kl /= E;
	ms.ent /= E;
	ms.ce /= E;
	double t_upd = rl_now() - t0;
	if (tr->m->step == step0) {
		/* every update was skipped (non-finite gradient norm, logged): the
		 * weights did not change, so there is no new version to publish; the
		 * step's groups are consumed, as verl and TRL skip such a step */
		tr->steps_skipped++;
		if (tr->qc)
			ack_trained(tr);
		return RL_OK;
	}
	int full = (o->save_every > 0 && tr->m->step % o->save_every == 0) ||
	    (o->max_steps > 0 && tr->m->step >= o->max_steps);
	double t_pub = rl_now();
	if (tr->zero && full && (rv = zero_gather_opt(tr)) != 0)
		return rv;
	if (tr->rank == 0 && (rv = publish(tr, full, 1)) != 0)
		return rv;
	zero_release_opt(tr);
	tr->t_pub = rl_now() - t_pub;
	if (tr->world > 1 && o->dp_check_every > 0 && tr->m->step % o->dp_check_every == 0 &&
	    (rv = check_same_weights(tr)) != 0)
		return rv;
	if (tr->qc) {
		/* the new version first, so the broker's gate judges later groups by it */
		rl_qclient_set_version(tr->qc, (uint64_t)tr->m->step, NULL);
		ack_trained(tr);
	}
	if (tr->rank != 0)
		return RL_OK;
	return write_metrics(tr, &ms, gnorm, lr, rl_now() - t0 + t_wait, t_upd, t_wait, nupd);
}

int
rl_train_run(const rl_train_opts *o)
{
	trainer tr = { 0 };
	rl_grouper_opts go = { 0 };
	char dir[4096];
	cJSON *state = NULL;
	int rv, start_step;

	tr.o = o;
	tr.agg = o->agg >= 0 ? o->agg : rl_algo_default_agg(o->algo);
	{
		const char *why = rl_train_skip_inexact(o);
		if (o->skip_zero_adv > 0 && why) {
			rl_error("--skip-zero-adv would change the update: %s", why);
			rl_hint("leave it out: it is on by default wherever it is exact (--no-skip-zero-adv turns it off)");
			return RL_EINVAL;
		}
		tr.skip_zero = o->skip_zero_adv != 0 && !why && o->algo != RL_ALGO_SFT;
	}
	tr.maxtok = o->max_tokens_micro;
	if (!o->out_dir) {
		rl_error("no output directory (--out DIR)");
		return RL_EINVAL;
	}
	tr.world = o->comm && o->comm->world > 1 ? o->comm->world : 1;
	tr.rank = tr.world > 1 ? o->comm->rank : 0;
	{
		/* several ranks on "cuda": each on the GPU of its LOCAL_RANK */
		char dev[32];
		const char *d = o->device;
		if (tr.world > 1 && strcmp(d, "cuda") == 0) {
			snprintf(dev, sizeof dev, "cuda:%d", o->comm->local_rank);
			d = dev;
		}
		if ((rv = rl_ops_open(&tr.ops, d)) != 0)
			return rv;
	}
	if (tr.world > 1) {
		if ((rv = rl_comm_open(&tr.comm, o->comm, tr.ops)) != 0)
			goto out;
		rl_verbose("data parallel: rank %d of %d, %s backend", tr.rank, tr.world, rl_comm_backend(tr.comm));
	}
	if (o->resume) {
		int rstep;
		if ((rv = rl_ckpt_find_full(o->out_dir, dir, sizeof dir, &rstep, &state, 0)) != 0)
			goto out;
		if (tr.rank == 0 && (rv = prepare_out(o, rstep)) != 0)
			goto out;
		if ((rv = rl_model_open(&tr.m, dir, tr.ops)) != 0)
			goto out;
	} else {
		if (!o->model_dir) {
			rl_error("no model (-m MODEL_DIR)");
			rv = RL_EINVAL;
			goto out;
		}
		if (tr.rank == 0 && (rv = prepare_out(o, -1)) != 0)
			goto out;
		if ((rv = rl_model_open(&tr.m, o->model_dir, tr.ops)) != 0)
			goto out;
	}
	if (o->resume && o->algo == RL_ALGO_PPO) {
		/* the optimizer state of a value head is only in a ppo run's checkpoint */
		cJSON *alg = cJSON_GetObjectItem(state, "algo");
		if (cJSON_IsString(alg) && strcmp(alg->valuestring, "ppo") != 0) {
			rl_error("cannot resume '%s' with --algo ppo: it was trained with --algo %s", dir,
			    alg->valuestring);
			rl_hint("start a ppo run from it with -m '%s' (a new --out) instead", dir);
			rv = RL_EINVAL;
			goto out;
		}
	}
	/* PPO's value head: from the directory the policy came from, else new */
	if (o->algo == RL_ALGO_PPO &&
	    (rv = rl_model_add_value_head(tr.m, o->resume ? dir : o->model_dir, o->seed)) != 0)
		goto out;
	if (o->ref_dir && (rv = rl_model_open(&tr.ref, o->ref_dir, tr.ops)) != 0)
		goto out;
	tr.m->no_adam_state = tr.world > 1 && o->zero; /* ZeRO: only a shard, from zero_open */
	tr.m->recompute = o->recompute;
	if ((rv = reserve(&tr)) != 0)
		goto out;
	if (tr.world > 1 && !o->zero && (rv = dp_reducer_open(&tr)) != 0)
		goto out;
	if (o->resume) {
		if (tr.m->no_adam_state && (rv = zero_full_alloc(&tr)) != 0)
			goto out;
		if ((rv = rl_ckpt_load_optimizer(tr.m, dir)) != 0)
			goto out;
		tr.skip_records = (uint64_t)cJSON_GetObjectItem(state, "records_consumed")->valuedouble;
		{
			/* records of groups that were still pending: read again */
			cJSON *pa = cJSON_GetObjectItem(state, "records_pending"), *e;
			int n = cJSON_GetArraySize(pa);
			if (n > 0 && !(tr.pend = rl_try_calloc((size_t)n, sizeof *tr.pend, "pending records"))) {
				rv = RL_ENOMEM;
				goto out;
			}
			cJSON_ArrayForEach(e, pa)
				if (cJSON_IsNumber(e) && e->valuedouble >= 1)
					tr.pend[tr.npend++] = (uint64_t)e->valuedouble;
			qsort(tr.pend, tr.npend, sizeof *tr.pend, cmp_u64);
		}
		if (cJSON_GetObjectItem(state, "groups_consumed"))
			tr.groups_used = (uint64_t)cJSON_GetObjectItem(state, "groups_consumed")->valuedouble;
		if (cJSON_GetObjectItem(state, "groups_done")) {
			/* the group rule: whatever order the records come in */
			char where[4200];
			snprintf(where, sizeof where, "'%s/trainer_state.json': groups_done", dir);
			if ((rv = rl_gset_from_json(&tr.done, cJSON_GetObjectItem(state, "groups_done"), where)) != 0 ||
			    (rv = rl_gset_add_all(&tr.skip, &tr.done)) != 0)
				goto out;
			snprintf(where, sizeof where, "'%s/trainer_state.json': groups_pending", dir);
			if (cJSON_GetObjectItem(state, "groups_pending") &&
			    (rv = rl_gset_from_json(&tr.pend_groups, cJSON_GetObjectItem(state, "groups_pending"), where)) != 0)
				goto out;
			tr.by_group = 1;
			rl_info("resuming from '%s' at step %d (skipping the records of the %llu groups done)", dir,
			    tr.m->step, (unsigned long long)rl_gset_count(&tr.done));
		} else {
			rl_info("resuming from '%s' at step %d (skipping %llu records already consumed)", dir,
			    tr.m->step, (unsigned long long)(tr.skip_records - tr.npend));
		}
	}
	if (tr.world > 1) {
		/* one starting point: rank 0's weights (and optimizer state on --resume) */
		size_t nb = tr.m->tt.total * sizeof(float);
		int st = tr.m->step, *steps;
		if ((rv = rl_comm_broadcast(tr.comm, tr.m->params, nb, 0)) != 0 ||
		    (o->resume && ((rv = rl_comm_broadcast(tr.comm, tr.m->m, nb, 0)) != 0 ||
		    (rv = rl_comm_broadcast(tr.comm, tr.m->v, nb, 0)) != 0)))
			goto out;
		if ((rv = rl_model_params_changed(tr.m)) != 0)
			goto out;
		if (!(steps = malloc(sizeof *steps * (size_t)tr.world))) {
			rv = RL_ENOMEM;
			goto out;
		}
		rv = rl_comm_host_allgather(tr.comm, steps, &st, sizeof st);
		for (int r = 1; rv == 0 && r < tr.world; r++)
			if (steps[r] != steps[0]) {
				rl_error("rank %d starts at step %d, rank 0 at step %d", r, steps[r], steps[0]);
				rl_hint("every rank must --resume from the same checkpoint directory");
				rv = RL_EINVAL;
			}
		free(steps);
		if (rv != 0)
			goto out;
		if (o->zero && (rv = zero_open(&tr)) != 0)
			goto out;
	}
	start_step = tr.m->step;
	rl_progress_init(&tr.prog, o->quiet);
	go.on_bad = o->on_bad;
	go.sft = o->algo == RL_ALGO_SFT;
	go.need_logprobs = o->old_from_behaviour || o->tis_cap > 0;
	go.vocab = tr.m->cfg.vocab_size;
	go.max_tokens = RL_MIN(tr.m->cfg.max_pos, tr.maxtok + 1);
	go.on_bad_group = on_bad_group;
	go.ctx = &tr;
	if ((rv = rl_grouper_create(&tr.gr, &go)) != 0)
		goto out;
	rl_qlease_init(&tr.lease);
	if (o->queue_url && tr.rank > 0) {
		/* data parallel: rank 0 leases and hands every lease to the others
		 * (docs/parallel.md); a signal here is left to rank 0 to act on */
		rl_stop_signals(on_train_signal, 0);
		tr.qfollow = 1;
		if ((rv = rl_traj_batch_create(&tr.lease.batch)) != 0 || (rv = rl_traj_create(&tr.qt)) != 0)
			goto out;
	} else if (o->queue_url) {
		rl_qclient_opts qo;
		rl_stop_signals(on_train_signal, 0);
		rl_qclient_opts_stage(&qo, o->broker_timeout);
		if ((rv = rl_qclient_open(&tr.qc, o->queue_url, &qo)) != 0 || (rv = rl_traj_create(&tr.qt)) != 0)
			goto out;
		rl_qclient_set_stop(tr.qc, &train_stop);
		/* the broker's staleness gate starts from our version */
		rl_qclient_set_version(tr.qc, (uint64_t)tr.m->step, NULL);
		if (rl_wstat_open(&tr.wst, o->queue_url, "train", strcmp(tr.ops->name, "cpu") == 0 ? "cpu" : o->device) != 0)
			rl_warn("no stats reports to the broker");
	} else {
		/* SIGINT/SIGTERM: stop at the next step boundary (or record read) and
		 * write a full checkpoint that --resume continues from; reads restart
		 * (a blocked read waits for its data), a second signal ends at once */
		rl_stop_signals(on_train_signal, SA_RESTART | SA_RESETHAND);
		if ((rv = rl_io_fopen(&tr.in, o->input, "rb")) != 0)
			goto out;
		if ((rv = rl_traj_reader_open_file(&tr.rd, tr.in, o->input, NULL)) != 0)
			goto out;
	}
	if (tr.rank != 0) {
		tr.metrics = NULL; /* rank 0 writes the metrics of the whole step */
	} else if (o->metrics_path && strcmp(o->metrics_path, "-") != 0) {
		if (!(tr.metrics = fopen(o->metrics_path, o->resume ? "a" : "w"))) {
			rl_error("cannot open '%s': %s", o->metrics_path, strerror(errno));
			rv = RL_EIO;
			goto out;
		}
	} else {
		tr.metrics = o->metrics_path ? stdout : stderr;
	}
	if (tr.rank == 0 && o->tfevents_dir && (rv = rl_tfevents_open(&tr.tf, o->tfevents_dir)) != 0)
		goto out;
	if (tr.rank == 0 && o->sync_url && (rv = rl_wsync_open_with(&tr.ws, o->sync_url, 0, o->sync_transport)) != 0)
		goto out;
	/* versions pushed after the checkpoint resumed from are lost with the
	 * run that made them: rl-sync goes back to this one, and the workers
	 * that loaded them move to it */
	if (tr.ws && o->resume && (rv = rl_wsync_rewind_dir(tr.ws, dir, (uint64_t)tr.m->step)) != 0) {
		rl_error("cannot rewind '%s' to version %d, the checkpoint resumed from", o->sync_url, tr.m->step);
		goto out;
	}
	if (tr.rank == 0 && o->wgroup_addr) {
		/* the rollout workers start from this trainer's weights (a resumed run's too) */
		rl_wgroup_opts wo = { o->wgroup_addr, 0, o->wgroup_size, o->wgroup_backend, 0 };
		if ((rv = rl_wgroup_open(&tr.wg, &wo, tr.m)) != 0 || (rv = rl_wgroup_send(tr.wg, tr.m->step)) != 0)
			goto out;
	}
	rl_verbose("training %s (%zu parameters) with %s on %s, %d groups per step",
	    tr.m->cfg.model_type, rl_model_nparams(tr.m), rl_algo_name(o->algo), tr.ops->name, o->batch);
	rl_verbose("activations: %.1f MiB for micro-batches of %d tokens%s",
	    rl_model_act_bytes(tr.m) / 1048576.0, tr.maxtok, o->recompute ? " (recomputed per layer)" : "");
	for (;;) {
		if (o->max_steps > 0 && tr.m->step >= o->max_steps)
			break;
		if (train_stop && !tr.qc && !tr.qfollow)
			break;
		int have;
		rv = collect(&tr);
		if (rv != RL_OK && rv != RL_ENOENT)
			goto out;
		if ((rv = agree_step(&tr, rv == RL_OK, &have)) != RL_OK)
			goto out;
		if (!have) {
			rl_progress_done(&tr.prog);
			if (train_stop && !tr.qc && !tr.qfollow)
				break;
			if (tr.ngroups > 0 && tr.rank == 0 && !tr.qgone)
				rl_info("end of input: %d groups left over (less than --batch %d), not trained",
				    tr.ngroups, o->batch);
			rv = RL_OK;
			break;
		}
		if (tr.qc) {
			/* a step can outlast a lease: renew every lease still held */
			for (size_t i = 0; i < tr.nheld; i++) {
				int seen = 0;
				for (size_t k = 0; k < i && !seen; k++)
					seen = tr.held[k].lease == tr.held[i].lease;
				rl_qack_result res;
				if (!seen)
					rl_qclient_ack_ids(tr.qc, tr.held[i].lease, RL_QACK_EXTEND, NULL, 0, &res);
			}
		}
		for (int gi = 0; gi < tr.ngroups; gi++)
			if ((rv = mark_done(&tr, tr.groups[gi].group)) != 0)
				goto out;
		if ((rv = train_step(&tr)) != 0)
			goto out;
		free_groups(&tr);
		if (tr.rank == 0) {
			int done = tr.m->step - start_step, todo = o->max_steps - start_step;
			double dt = rl_progress_elapsed(&tr.prog), rate = dt > 0 ? done / dt : 0.0;
			if (o->max_steps > 0)
				rl_progress_draw(&tr.prog, (double)done / RL_MAX(todo, 1), "%d/%d steps, %.2f steps/s", done,
				    todo, rate);
			else
				rl_progress_draw(&tr.prog, -1, "%d steps, %.2f steps/s", done, rate);
		}
	}
	rl_progress_done(&tr.prog);
	if (train_stop && !tr.qc && !tr.qfollow) {
		train_stop_file = train_stop;
		if (tr.rank == 0)
			rl_info("stopped by a signal after step %d: --resume continues from its checkpoint", tr.m->step);
	}
	/* a last full checkpoint, so that the run can be resumed */
	{
		int need = 0;
		char opt[4096];
		if (tr.m->step > start_step && tr.rank == 0) {
			snprintf(opt, sizeof opt, "%s/step-%08d/optimizer.safetensors", o->out_dir, tr.m->step);
			need = access(opt, R_OK) != 0;
		}
		/* ZeRO: every rank sends its share of the optimizer state */
		if (tr.zero && ((rv = rl_comm_host_broadcast(tr.comm, &need, sizeof need, 0)) != 0 ||
		    (need && (rv = zero_gather_opt(&tr)) != 0)))
			goto out;
		if (need && tr.rank == 0) {
			snprintf(dir, sizeof dir, "%s/step-%08d", o->out_dir, tr.m->step);
			remove_dir(dir);
			tr.groups_pending = 1;
			if ((rv = publish(&tr, 1, 0)) != 0)
				goto out;
		}
		zero_release_opt(&tr);
	}
	if (tr.world > 1) {
		if ((rv = check_same_weights(&tr)) != 0 || (rv = rl_comm_finish(tr.comm)) != 0)
			goto out;
	}
	if (tr.steps_skipped && tr.rank == 0)
		rl_warn("%llu steps skipped (non-finite gradient norm): their groups were consumed, not trained",
		    (unsigned long long)tr.steps_skipped);
	{
		const rl_grouper_stats *st = rl_grouper_stats_get(tr.gr);
		if (!o->quiet && tr.rank == 0)
			rl_info("%d steps; %llu records, %llu duplicates dropped, %llu bad records, %llu groups "
			    "dropped (bad), %llu (no signal), %llu incomplete", tr.m->step - start_step,
			    (unsigned long long)st->records, (unsigned long long)st->duplicates,
			    (unsigned long long)st->bad_records, (unsigned long long)st->bad_groups,
			    (unsigned long long)tr.dropped_nosignal, (unsigned long long)st->incomplete);
		if (tr.by_group && !o->quiet && tr.rank == 0)
			rl_info("%llu records skipped: their groups were done before --resume",
			    (unsigned long long)tr.skipped_done);
	}
	if (tr.qgone) {
		/* a broker that stopped answering ends the run as a failure, after
		 * the checkpoint above (when anything was trained since the last
		 * full one); what was leased and not trained expires there */
		if (tr.rank == 0)
			rl_error("stopped after step %d: the broker at '%s' did not answer; --resume continues from "
			    "the last checkpoint", tr.m->step, o->queue_url);
		rv = RL_ETIMEDOUT;
		goto out;
	}
	/* file or pipe input that ended before one step: a failure, not a run
	 * (a generator that died at its start closed the pipe; a Makefile or a
	 * pipeline's status must not take it for a trained policy).  A --resume
	 * that finds no record past its checkpoint has nothing left to do. */
	if (!tr.qc && !tr.qfollow && !train_stop && tr.m->step == start_step &&
	    !(o->max_steps > 0 && start_step >= o->max_steps) &&
	    (!o->resume || (tr.by_group ? tr.records_new > 0 : tr.records > tr.skip_records))) {
		if (tr.rank == 0) {
			rl_error("'%s' ended before the first step: %llu records, %d complete groups (--batch %d)",
			    o->input ? o->input : "-", (unsigned long long)(tr.by_group ? tr.records_new :
			    tr.records - RL_MIN(tr.records, tr.skip_records)), tr.ngroups, o->batch);
			rl_hint("an upstream stage that failed closes the pipe early: see its messages above");
		}
		rv = RL_ENOENT;
		goto out;
	}
out:
	free_groups(&tr);
	free(tr.groups);
	free(tr.pend);
	rl_gset_fini(&tr.done);
	rl_gset_fini(&tr.skip);
	rl_gset_fini(&tr.pend_groups);
	free(tr.seq);
	free(tr.kseq);
	free(tr.adv_tok);
	free(tr.w_tok);
	free(tr.old_tok);
	free(tr.kl_tok);
	free(tr.val_tok);
	free(tr.ret_tok);
	free(tr.h_vold);
	if (tr.ops && tr.d_dval)
		tr.ops->free(tr.ops, tr.d_dval);
	free(tr.h_tok);
	free(tr.h_tgt);
	free(tr.h_old);
	if (tr.ops && tr.d_mem)
		tr.ops->free(tr.ops, tr.d_mem);
	if (tr.ops) {
		tr.ops->free(tr.ops, tr.zm);
		tr.ops->free(tr.ops, tr.zv);
	}
	rl_traj_reader_close(tr.rd);
	if (tr.qc && tr.nheld) {
		/* records leased but not trained go back to the broker at once: one
		 * request per lease (it was one per record, each retried for a
		 * minute when the broker was gone), and no retries once stopping */
		rl_qack_result res;
		size_t back = 0, i = 0;
		uint64_t *ids = malloc(tr.nheld * sizeof *ids);
		while (ids != NULL && i < tr.nheld) {
			size_t j = i, n = 0;
			for (; j < tr.nheld && tr.held[j].lease == tr.held[i].lease; j++)
				ids[n++] = tr.held[j].id;
			if (rl_qclient_ack_ids(tr.qc, tr.held[i].lease, RL_QACK_RELEASE, ids, (uint32_t)n, &res) == RL_OK)
				back += n;
			else if (train_stop)
				break; /* the broker is gone: the rest would fail the same way */
			i = j;
		}
		free(ids);
		if (back == tr.nheld)
			rl_verbose("%zu leased records not trained handed back", tr.nheld);
		else
			rl_warn("%zu of %zu leased records not trained could not be handed back: the broker gives "
			    "them out again when their lease expires", tr.nheld - back, tr.nheld);
	}
	rl_progress_done(&tr.prog);
	rl_wstat_close(tr.wst);
	rl_qlease_fini(&tr.lease);
	rl_traj_destroy(tr.qt);
	free(tr.held);
	rl_qclient_close(tr.qc);
	if (tr.in && tr.in != stdin)
		fclose(tr.in);
	if (tr.metrics && tr.metrics != stdout && tr.metrics != stderr)
		fclose(tr.metrics);
	rl_tfevents_close(tr.tf);
	rl_wsync_close(tr.ws);
	{
		/* the group's end: the workers go on with the last version */
		int r2 = rl_wgroup_close(tr.wg, rv == 0);
		if (rv == 0)
			rv = r2;
	}
	rl_grouper_destroy(tr.gr);
	rl_tokenizer_close(tr.tok);
	rl_model_close(tr.ref);
	rl_comm_reducer_destroy(tr.red);
	rl_model_close(tr.m);
	rl_comm_close(tr.comm);
	rl_ops_close(tr.ops);
	cJSON_Delete(state);
	return rv;
}

int
rl_train_init_model(const char *config_path, const char *tokenizer, const char *out_dir, uint64_t seed)
{
	rl_config cfg = { 0 };
	rl_ops *ops = NULL;
	rl_model *m = NULL;
	rl_tokenizer *tk = NULL;
	char tmpdir[4096], path[4200];
	int rv;

	if ((rv = rl_config_load(&cfg, config_path)) != 0)
		return rv;
	if ((rv = rl_ops_open(&ops, "cpu")) != 0)
		goto out;
	if ((rv = rl_model_init_random(&m, &cfg, ops, seed)) != 0)
		goto out;
	/* the tokenizer goes in first, so the directory appears complete */
	snprintf(tmpdir, sizeof tmpdir, "%s.tok.%ld", out_dir, (long)getpid());
	if ((rv = rl_io_mkdir_p(tmpdir, 0755)) != 0)
		goto out;
	snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
	if (strcmp(tokenizer, "bytes") == 0) {
		const char *j = rl_tokenizer_bytes_json();
		rv = rl_io_write_atomic(path, j, strlen(j), 0644);
	} else {
		char *buf;
		size_t n;
		if ((rv = rl_io_read_file(tokenizer, RL_TOKENIZER_MAX_FILE, &buf, &n)) == 0) {
			rv = rl_io_write_atomic(path, buf, n, 0644);
			free(buf);
		}
	}
	if (rv == 0 && (rv = rl_tokenizer_open(&tk, tmpdir)) == 0 &&
	    rl_tokenizer_vocab_size(tk) > cfg.vocab_size) {
		rl_error("the tokenizer has %d ids but config.json's vocab_size is %d",
		    rl_tokenizer_vocab_size(tk), cfg.vocab_size);
		rv = RL_ESHAPE;
	}
	if (rv == 0) {
		free(m->src_dir);
		m->src_dir = rl_xstrdup(tmpdir);
		rv = rl_model_save(m, out_dir);
	}
	snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
	unlink(path);
	rmdir(tmpdir);
out:
	rl_tokenizer_close(tk);
	rl_model_close(m);
	rl_ops_close(ops);
	rl_config_fini(&cfg);
	return rv;
}

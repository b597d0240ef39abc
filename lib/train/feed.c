/*
 * feed.c — the trainer's input (trainer.h): records from a file or stdin,
 * from rl-queue leases, or (data parallel, queue mode, ranks > 0) from rank
 * 0's leases; into the grouper (groups.h), out as the step's groups.  Keeps
 * the --resume rules of what to skip (docs/train.md) and the queue's lease
 * bookkeeping: acknowledged once a full checkpoint covers the step that
 * trained them, renewed until then, handed back at the end.
 * Leaves out: what a group becomes in the step (step.c), the checkpoint's
 * record of the position (save.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "base/io.h"
#include "train/trainer.h"

static int dp_send_lease(trainer *tr, int end);
static int dp_end_lease(trainer *tr);
static int dp_follow_lease(trainer *tr);
static int group_done(trainer *tr, const rl_traj *t);
static void ack_resumed_groups(trainer *tr);
static void mark_new(trainer *tr);

int
rli_feed_tok(trainer *tr)
{
	int rv;

	if (tr->tok)
		return RL_OK;
	if ((rv = rl_tokenizer_open(&tr->tok, tr->m->src_dir ? tr->m->src_dir : tr->o->model_dir)) != 0)
		rl_hint("records without token ids need the model's tokenizer.json");
	return rv;
}

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
	if ((rv = rli_feed_tok(tr)) != 0)
		return rv;
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
	double renew;
	int rv, fresh = 0;

	if (tr->idle_since == 0)
		tr->idle_since = rl_now();
	if (rli_train_stop)
		return dp_end_lease(tr);
	req.stage = RL_QSTAGE_SCORED;
	/* lease only what this step still needs, so the broker's staleness gate
	 * decides on every group at the version that will train it */
	{
		int need = o->batch - tr->ngroups;
		req.max_records = (uint32_t)RL_MAX(need, 1) * (uint32_t)RL_MAX(tr->last_gsize, 1);
	}
	req.min_records = 1;
	/* the leases held outlive a wait for records */
	renew = tr->renew_s > 0 ? tr->renew_s : 6;
	req.wait_ms = (uint32_t)(RL_MIN(renew, 0.5) * 1000);
	if (tr->nheld && rl_now() - tr->t_renew >= renew)
		rli_feed_renew(tr);
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
	{
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double left = tr->lease.deadline_ms / 1000.0 - (ts.tv_sec + ts.tv_nsec / 1e9);
		if (left > 0)
			tr->renew_s = RL_MAX(left / 3, 0.05);
	}
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
		tr->held[tr->nheld].trained = group_done(tr, tr->qt) ? 2 : 0;
		tr->held[tr->nheld].renewed = rl_now();
		tr->nheld++;
		tr->records++;
		if (tr->held[tr->nheld - 1].trained) {
			tr->skipped_done++;
			continue;
		}
		fresh = 1;
		snprintf(where, sizeof where, "'%s': lease %llu record %zu", o->queue_url,
		    (unsigned long long)tr->lease.id, i);
		if ((rv = rl_grouper_add(tr->gr, tr->qt, where)) != RL_OK)
			return rv;
	}
	/* records of groups done only (handed out again) are no work: --idle-exit runs on */
	if (fresh)
		tr->idle_since = rl_now();
	return RL_OK;
}

/* A record of a group done (trained here, or in the checkpoint resumed
 * from): a broker that lost an acknowledgement (restarted, or a lease that
 * expired) hands it out again; it is never trained twice. */
static int
group_done(trainer *tr, const rl_traj *t)
{
	uint64_t grp;

	return rl_grouper_group_of(tr->gr, t, &grp) == RL_OK && rl_gset_has(&tr->done, grp);
}

int
rli_feed_ack(trainer *tr, int mark, int covered)
{
	size_t keep = 0, n = 0;
	uint64_t *ids = NULL;
	uint8_t *done = NULL;
	int rv = RL_OK;

	for (size_t i = 0; mark && i < tr->nheld; i++)
		for (int gi = 0; gi < tr->ngroups && !tr->held[i].trained; gi++)
			for (int k = 0; k < tr->groups[gi].size; k++)
				if (tr->groups[gi].s[k].id == tr->held[i].id)
					tr->held[i].trained = 2;
	/* exactly once: only a full checkpoint makes a trained group survive a
	 * crash; until then its lease is renewed, and a trainer killed before
	 * gets it back through the lease's expiry */
	if (!covered) {
		/* the broker's staleness gate counts them out of flight */
		if (mark)
			mark_new(tr);
		return RL_OK;
	}
	if (!tr->nheld)
		return RL_OK;
	ids = rl_try_malloc(sizeof(uint64_t) * tr->nheld, "acknowledged ids");
	done = rl_try_calloc(tr->nheld, 1, "acknowledged records");
	if (!ids || !done) {
		rv = RL_ENOMEM;
		goto out;
	}
	/* one acknowledgement per lease; a failed one (a broker restarted
	 * meanwhile) is not retried: the broker hands the records out again and
	 * group_done acknowledges them at the next full checkpoint */
	for (size_t i = 0; i < tr->nheld; i++) {
		if (!tr->held[i].trained || done[i])
			continue;
		n = 0;
		for (size_t k = i; k < tr->nheld; k++)
			if (tr->held[k].trained && !done[k] && tr->held[k].lease == tr->held[i].lease) {
				ids[n++] = tr->held[k].id;
				done[k] = 1;
			}
		rl_qack_result res = { 0 };
		if (tr->qc && rl_qclient_ack_ids(tr->qc, tr->held[i].lease, RL_QACK_DONE, ids, (uint32_t)n, &res) == RL_OK)
			tr->q_late += res.late;
	}
	/* records the grouper dropped (duplicates, bad groups) stay held and are
	 * handed back at the end */
	for (size_t i = 0; i < tr->nheld; i++)
		if (!done[i])
			tr->held[keep++] = tr->held[i];
	tr->nheld = keep;
out:
	free(ids);
	free(done);
	return rv;
}

/* The records trained since the last marks (trained 2), marked TRAINED
 * for the staleness gate: one request per lease that holds some, which
 * renews that lease too.  The other leases wait for rli_feed_renew (before
 * every step, and every third of the lease time while waiting for records):
 * renewing every lease held after every step too cost a round trip per
 * lease, and leases pile up until a full checkpoint.  A failed mark is not
 * retried here: the next renewal marks every trained record again. */
static void
mark_new(trainer *tr)
{
	size_t i = 0;
	uint64_t *ids = tr->nheld ? rl_try_malloc(tr->nheld * sizeof *ids, "trained ids") : NULL;

	if (!ids) {
		if (tr->nheld)
			rli_feed_renew(tr);
		return;
	}
	while (tr->qc && i < tr->nheld) {
		size_t j = i, n = 0;
		rl_qack_result res;
		for (; j < tr->nheld && tr->held[j].lease == tr->held[i].lease; j++)
			if (tr->held[j].trained == 2) {
				ids[n++] = tr->held[j].id;
				tr->held[j].trained = 1;
			}
		if (n) {
			double now = rl_now();
			rl_qclient_ack_ids(tr->qc, tr->held[i].lease, RL_QACK_TRAINED, ids, (uint32_t)n, &res);
			for (size_t k = i; k < j; k++)
				tr->held[k].renewed = now;
		}
		i = j;
	}
	free(ids);
}

/* Renews the leases last renewed before `older` (rl_now() clock); all of
 * them with older > every renewal. */
static void
renew_before(trainer *tr, double older)
{
	/* a step can outlast a lease, and trained records wait for the next
	 * full checkpoint: the leases renewed, their trained records marked
	 * (again: a broker restarted from a snapshot has forgotten the marks);
	 * one lease's records are next to each other */
	size_t i = 0;
	uint64_t *ids = tr->nheld ? rl_try_malloc(tr->nheld * sizeof *ids, "trained ids") : NULL;

	while (tr->qc && i < tr->nheld) {
		size_t j = i, n = 0;
		rl_qack_result res;
		double now = rl_now();
		int due = tr->held[i].renewed < older;
		for (; j < tr->nheld && tr->held[j].lease == tr->held[i].lease; j++)
			if (due && tr->held[j].trained && ids) {
				ids[n++] = tr->held[j].id;
				tr->held[j].trained = 1;
			}
		/* without memory for the ids: a plain renewal, the gate counts them a while longer */
		if (due) {
			rl_qclient_ack_ids(tr->qc, tr->held[i].lease, n ? RL_QACK_TRAINED : RL_QACK_EXTEND,
			    n ? ids : NULL, (uint32_t)n, &res);
			for (size_t k = i; k < j; k++)
				tr->held[k].renewed = now;
		}
		i = j;
	}
	free(ids);
}

void
rli_feed_renew(trainer *tr)
{
	double now = rl_now();

	renew_before(tr, now + 1);
	tr->t_renew = now;
}

void
rli_feed_renew_old(trainer *tr)
{
	/* a tenth of the lease time (renew_s is a third of it): a step starts
	 * with nine tenths of it left or more, as good as renewing every lease
	 * before every step for any step much shorter than a lease, without a
	 * round trip per lease held per step (they pile up until a full
	 * checkpoint); not known yet: all of them */
	if (tr->renew_s <= 0) {
		rli_feed_renew(tr);
		return;
	}
	renew_before(tr, rl_now() - 0.3 * tr->renew_s);
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
		if (rli_train_stop) {
			/* the groups held stay pending in the last checkpoint */
			tr->t_wait += rl_now() - t0;
			return RL_ENOENT;
		}
		if (tr->pair_ready) {
			/* the rejected side of the pair line read last */
			tr->pair_ready = 0;
			t = tr->pair_rej;
		} else if ((rv = rl_traj_reader_next(tr->rd, &t)) != RL_OK) {
			return rv;
		}
		if (t == NULL) {
			if (rli_train_stop)
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

int
rli_feed_mark_done(trainer *tr, uint64_t group)
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
	return rli_feed_mark_done(ctx, group);
}

int
rli_feed_grow(void **p, int *cap, int need, size_t elt)
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

void
rli_feed_free_groups(trainer *tr)
{
	for (int i = 0; i < tr->ngroups; i++)
		rl_group_fini(&tr->groups[i]);
	tr->ngroups = 0;
	tr->nseq = 0;
}

/* --online (docs/train.md, "Online DPO"): the group's pair is its first
 * sample of the highest reward (chosen) and its first of the lowest
 * (rejected), as OpenRLHF's iterative DPO picks best and worst of n; the
 * other samples are freed.  *keep 0: every reward equal, no pair. */
static void
online_pair(rl_group *g, int *keep)
{
	int hi = 0, lo = 0;

	for (int i = 1; i < g->size; i++) {
		if (g->s[i].reward > g->s[hi].reward)
			hi = i;
		if (g->s[i].reward < g->s[lo].reward)
			lo = i;
	}
	*keep = g->s[hi].reward > g->s[lo].reward;
	if (!*keep || g->size == 2)
		return;
	rl_sample c = g->s[hi], r = g->s[lo];
	for (int i = 0; i < g->size; i++)
		if (i != hi && i != lo)
			rl_sample_fini(&g->s[i]);
	g->s[0] = c;
	g->s[1] = r;
	g->size = g->n = 2;
}

int
rli_feed_collect(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	rl_group g;
	int rv;

	while (tr->ngroups < o->batch) {
		if ((rv = next_group(tr, &g)) != RL_OK)
			return rv;
		tr->groups_used++;
		if (o->online || o->algo == RL_ALGO_DAPO) {
			int keep;
			float *r = rl_try_malloc(sizeof(float) * (size_t)g.size, "group rewards");
			int goff[2] = { 0, g.size };
			if (!r) {
				rl_group_fini(&g);
				return RL_ENOMEM;
			}
			for (int i = 0; i < g.size; i++)
				r[i] = g.s[i].reward;
			if (o->online)
				online_pair(&g, &keep);
			else
				rl_groups_with_signal(&keep, r, goff, 1);
			free(r);
			if (!keep) {
				tr->dropped_nosignal++;
				rv = rli_feed_mark_done(tr, g.group);
				rl_group_fini(&g);
				if (rv != RL_OK)
					return rv;
				continue;
			}
		}
		if ((rv = rli_feed_grow((void **)&tr->groups, &tr->cap_groups, tr->ngroups + 1, sizeof g)) != 0) {
			rl_group_fini(&g);
			return rv;
		}
		tr->groups[tr->ngroups++] = g;
	}
	return RL_OK;
}

int
rli_feed_open(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	rl_grouper_opts go = { 0 };
	int rv;

	go.on_bad = o->on_bad != RL_BAD_AUTO ? o->on_bad : o->queue_url ? RL_BAD_SKIP : RL_BAD_ERROR;
	go.sft = o->algo == RL_ALGO_SFT;
	go.need_logprobs = o->old_from_behaviour || o->tis_cap > 0;
	go.vocab = tr->m->cfg.vocab_size;
	go.max_tokens = RL_MIN(tr->m->cfg.max_pos, tr->maxtok + 1);
	go.on_bad_group = on_bad_group;
	go.ctx = tr;
	if ((rv = rl_grouper_create(&tr->gr, &go)) != 0)
		return rv;
	rl_qlease_init(&tr->lease);
	if (o->queue_url && tr->rank > 0) {
		/* data parallel: rank 0 leases and hands every lease to the others
		 * (docs/parallel.md); a signal here is left to rank 0 to act on */
		rl_stop_signals(rli_train_on_signal, 0);
		tr->qfollow = 1;
		if ((rv = rl_traj_batch_create(&tr->lease.batch)) != 0 || (rv = rl_traj_create(&tr->qt)) != 0)
			return rv;
	} else if (o->queue_url) {
		rl_qclient_opts qo;
		rl_stop_signals(rli_train_on_signal, 0);
		rl_qclient_opts_stage(&qo, o->broker_timeout);
		if ((rv = rl_qclient_open(&tr->qc, o->queue_url, &qo)) != 0 || (rv = rl_traj_create(&tr->qt)) != 0)
			return rv;
		rl_qclient_set_stop(tr->qc, &rli_train_stop);
		/* the broker's staleness gate starts from our version; a resumed
		 * run's records generated for the versions it lost are not stale.
		 * A new run rewinds too: it may follow a trainer killed before its
		 * first checkpoint, whose leases would otherwise hold their groups
		 * until they time out, stale by then */
		rl_qclient_rewind_version(tr->qc, (uint64_t)tr->m->version, NULL);
		if (tr->resumed)
			ack_resumed_groups(tr);
		if (rl_wstat_open(&tr->wst, o->queue_url, "train", strcmp(tr->ops->name, "cpu") == 0 ? "cpu" :
		    o->device) != 0)
			rl_warn("no stats reports to the broker");
	} else {
		/* SIGINT/SIGTERM: stop at the next step boundary (or record read) and
		 * write a full checkpoint that --resume continues from; reads restart
		 * (a blocked read waits for its data), a second signal ends at once */
		rl_stop_signals(rli_train_on_signal, SA_RESTART | SA_RESETHAND);
		if ((rv = rl_io_fopen(&tr->in, o->input, "rb")) != 0)
			return rv;
		if ((rv = rl_traj_reader_open_file(&tr->rd, tr->in, o->input, NULL)) != 0)
			return rv;
		if (o->algo == RL_ALGO_SFT)
			rl_traj_reader_set_line_fn(tr->rd, rli_sft_line, tr);
		else if (o->algo == RL_ALGO_DPO || o->algo == RL_ALGO_RM)
			rl_traj_reader_set_line_fn(tr->rd, rli_dpo_line, tr);
	}
	return RL_OK;
}

/* The groups of the checkpoint resumed from, told to the broker after the
 * rewind (which ended the dead trainer's leases): a trainer killed after its
 * checkpoint but before it acknowledged the checkpoint's groups left their
 * samples scored there, and nothing else would finish them (a trainer
 * resumed at --max-steps leases nothing).  The broker finishes those it
 * still has (RL_QACK_GROUPS).  A broker older than this refuses the kind:
 * such samples are then acknowledged when leased again (group_done). */
static void
ack_resumed_groups(trainer *tr)
{
	const size_t chunk = (size_t)1 << 20;   /* ranges per request: 16 MiB */
	uint64_t total = 0;

	for (size_t i = 0; i < tr->done.n; i += chunk) {
		size_t m = RL_MIN(chunk, tr->done.n - i);
		rl_qack_result res;
		if (rl_qclient_ack_ids(tr->qc, 0, RL_QACK_GROUPS, &tr->done.r[i][0], (uint32_t)(2 * m), &res) != RL_OK) {
			rl_verbose("the broker did not take the checkpoint's groups: their samples are "
			    "acknowledged when leased again");
			return;
		}
		total += res.done;
	}
	if (total)
		rl_info("%llu scored samples of the checkpoint's groups acknowledged to the broker (trained before "
		    "the restart)", (unsigned long long)total);
}

/* Records leased but not trained go back to the broker at once: one request
 * per lease, and no retries once stopping. */
static void
hand_back(trainer *tr)
{
	rl_qack_result res;
	size_t back = 0, i = 0;
	uint64_t *ids = rl_try_malloc(tr->nheld * sizeof *ids, "leased ids");

	while (ids != NULL && i < tr->nheld) {
		size_t j = i, n = 0;
		for (; j < tr->nheld && tr->held[j].lease == tr->held[i].lease; j++)
			ids[n++] = tr->held[j].id;
		if (rl_qclient_ack_ids(tr->qc, tr->held[i].lease, RL_QACK_RELEASE, ids, (uint32_t)n, &res) == RL_OK)
			back += n;
		else if (rli_train_stop)
			break; /* the broker is gone: the rest would fail the same way */
		i = j;
	}
	free(ids);
	if (back == tr->nheld)
		rl_verbose("%zu leased records not trained handed back", tr->nheld);
	else
		rl_warn("%zu of %zu leased records not trained could not be handed back: the broker gives "
		    "them out again when their lease expires", tr->nheld - back, tr->nheld);
}

void
rli_feed_close(trainer *tr)
{
	rli_feed_free_groups(tr);
	free(tr->groups);
	tr->groups = NULL;
	tr->cap_groups = 0;
	rl_traj_reader_close(tr->rd);
	tr->rd = NULL;
	if (tr->qc && tr->nheld)
		hand_back(tr);
	rl_wstat_close(tr->wst);
	tr->wst = NULL;
	rl_qlease_fini(&tr->lease);
	rl_traj_destroy(tr->qt);
	tr->qt = NULL;
	rl_traj_destroy(tr->pair_rej);
	tr->pair_rej = NULL;
	tr->pair_ready = 0;
	free(tr->held);
	tr->held = NULL;
	tr->nheld = tr->capheld = 0;
	rl_qclient_close(tr->qc);
	tr->qc = NULL;
	if (tr->in && tr->in != stdin)
		fclose(tr->in);
	tr->in = NULL;
	rl_grouper_destroy(tr->gr);
	tr->gr = NULL;
	rl_tokenizer_close(tr->tok);
	tr->tok = NULL;
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
		if (group_done(tr, tr->qt))
			continue; /* as rank 0 does */
		snprintf(where, sizeof where, "'%s' (through rank 0): record %zu", tr->o->queue_url, i);
		rv = rl_grouper_add(tr->gr, tr->qt, where);
	}
	return rv;
}

/*
 * metrics.c — the trainer's metrics line (trainer.h): one JSON object per
 * step (rl-metrics(5); verl's names where verl has the quantity), also as
 * TensorBoard scalars (--tfevents) and in the stats reported to rl-queue.
 * Leaves out: computing the statistics (step.c sums them per token).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/core.h"
#include "train/trainer.h"

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

int
rli_metrics_write(trainer *tr, const mstat *ms, float gnorm, double lr, double t_step, double t_upd,
    double t_wait, int nupdates)
{
	const rl_train_opts *o = tr->o;
	cJSON *j;
	int step = tr->m->version, S = tr->nseq, err;
	double rsum = 0, rmin = INFINITY, rmax = -INFINITY, lsum = 0, lmax = 0, amin = INFINITY, amax = -INFINITY,
	    asum = 0, stal = 0, stalmax = 0, clipped = 0, acc = 0;
	long ntok = 0;
	char *txt;

	if (!(j = cJSON_CreateObject()))
		return RL_ENOMEM;
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
	 * none trained: 0 rather than null (the broker's charts and /metrics want numbers) */
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
	if (!txt)
		return RL_ENOMEM;
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

int
rli_metrics_open(trainer *tr)
{
	const rl_train_opts *o = tr->o;

	if (tr->rank != 0) {
		tr->metrics = NULL; /* rank 0 writes the metrics of the whole step */
	} else if (o->metrics_path && strcmp(o->metrics_path, "-") != 0) {
		if (!(tr->metrics = fopen(o->metrics_path, o->resume ? "a" : "w"))) {
			rl_error("cannot open '%s': %s", o->metrics_path, strerror(errno));
			return RL_EIO;
		}
	} else {
		tr->metrics = o->metrics_path ? stdout : stderr;
	}
	if (tr->rank == 0 && o->tfevents_dir)
		return rl_tfevents_open(&tr->tf, o->tfevents_dir);
	return RL_OK;
}

int
rli_metrics_gather(trainer *tr, mstat *ms, int E)
{
	int rv;

	if (tr->world > 1) {
		/* the metrics of the whole step: every rank's token statistics summed */
		double v[8] = { ms->loss, ms->clip, ms->kl, ms->ratio_logsum, ms->ent, ms->ce, ms->ntok, ms->clip_lower };
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 8)) != 0)
			return rv;
		ms->loss = v[0], ms->clip = v[1], ms->kl = v[2], ms->ratio_logsum = v[3], ms->ent = v[4], ms->ce = v[5];
		ms->ntok = v[6], ms->clip_lower = v[7];
	}
	if (tr->world > 1 && tr->o->algo == RL_ALGO_PPO) {
		double v[3] = { ms->vf_loss, ms->vf_clip, ms->vpred };
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 3)) != 0)
			return rv;
		ms->vf_loss = v[0], ms->vf_clip = v[1], ms->vpred = v[2];
	}
	/* statistics averaged over the passes */
	ms->vf_clip /= E;
	ms->vpred /= E;
	ms->ntok /= E;
	ms->clip /= E;
	ms->clip_lower /= E;
	ms->ratio_logsum /= E;
	ms->kl /= E;
	ms->ent /= E;
	ms->ce /= E;
	return RL_OK;
}

void
rli_metrics_close(trainer *tr)
{
	if (tr->metrics && tr->metrics != stdout && tr->metrics != stderr)
		fclose(tr->metrics);
	tr->metrics = NULL;
	rl_tfevents_close(tr->tf);
	tr->tf = NULL;
}

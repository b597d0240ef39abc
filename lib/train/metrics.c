/*
 * metrics.c — the trainer's metrics line (trainer.h): one JSON object per
 * step (rl-metrics(5); verl's names where verl has the quantity), also as
 * TensorBoard scalars (--tfevents) and in the stats reported to rl-queue.
 * Leaves out: computing the statistics (step.c sums them per token).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "train/trainer.h"

/* mean, min and max of a per-token array over the response tokens of the
 * step's samples that the policy sampled (tr->mask_tok: loss_mask 1), as
 * verl takes its token statistics over response_mask; NaN when none. */
static rl_stat3
tok_stat(const trainer *tr, const float *v)
{
	rl_stat3 st = { 0, INFINITY, -INFINITY, 0 };
	double sum = 0;

	for (int i = 0; i < tr->nseq; i++) {
		const rl_sample *s = tr->seq[i].s;
		for (int t = 0; t < s->rlen; t++) {
			float x = v[tr->seq[i].toff + t];
			if (!tr->mask_tok[tr->seq[i].toff + t])
				continue;
			sum += x;
			st.min = fmin(st.min, x);
			st.max = fmax(st.max, x);
			st.n++;
		}
	}
	if (st.n == 0)
		st.mean = st.min = st.max = NAN;
	else
		st.mean = sum / (double)st.n;
	return st;
}

/* mean, min and max of per-sample values; NaN when n is 0. */
typedef struct seqstat { double sum, min, max; int n; } seqstat;
static void ss_add(seqstat *a, double x) { a->sum += x; a->min = fmin(a->min, x); a->max = fmax(a->max, x); a->n++; }
static double ss_mean(const seqstat *a) { return a->n ? a->sum / a->n : NAN; }
static double ss_min(const seqstat *a) { return a->n ? a->min : NAN; }
static double ss_max(const seqstat *a) { return a->n ? a->max : NAN; }
#define SEQSTAT_INIT { 0, INFINITY, -INFINITY, 0 }

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

static void
metric3(cJSON *j, trainer *tr, int step, const char *name, double mean, double max, double min)
{
	char k[96];

	snprintf(k, sizeof k, "%s/mean", name);
	metric(j, tr, step, k, mean);
	snprintf(k, sizeof k, "%s/max", name);
	metric(j, tr, step, k, max);
	snprintf(k, sizeof k, "%s/min", name);
	metric(j, tr, step, k, min);
}

/* The validation hook's metrics go where the step's do. */
struct eval_put { cJSON *j; trainer *tr; int step; };
static void
eval_put(void *pctx, const char *name, double v)
{
	struct eval_put *ep = pctx;
	metric(ep->j, ep->tr, ep->step, name, v);
}

/* The step's metrics as Prometheus text (exposition format 0.0.4), for
 * node_exporter's textfile collector or any scraper of a file: one gauge per
 * key, "rltrain_" and the key with every character outside [a-zA-Z0-9_]
 * made '_' (actor/pg_loss -> rltrain_actor_pg_loss); null values left out.
 * Replaced atomically, so a scrape never reads half a file. */
static int
prom_write(const cJSON *j, const char *path)
{
	rl_buf b;
	const cJSON *e;
	int rv = RL_OK;

	rl_buf_init(&b);
	cJSON_ArrayForEach(e, j) {
		char name[160];
		size_t k = 0;
		if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
			continue;
		k = (size_t)snprintf(name, sizeof name, "rltrain_");
		for (const char *c = e->string; *c && k + 1 < sizeof name; c++)
			name[k++] = (isalnum((unsigned char)*c) || *c == '_') ? *c : '_';
		name[k] = 0;
		if ((rv = rl_buf_printf(&b, "# TYPE %s gauge\n%s %.17g\n", name, name, e->valuedouble)) != 0)
			break;
	}
	if (rv == 0)
		rv = rl_io_write_atomic(path, b.p, b.len, 0644);
	rl_buf_fini(&b);
	return rv;
}

/* verl's data metrics (trainer/ppo/metric_utils.py, compute_data_metrics):
 * scores and rewards per sample over the samples with a response (an
 * aborted sample, 0 tokens, is left out and counted), advantages and
 * returns over the sampled response tokens, lengths per sample. */
static void
data_metrics(cJSON *j, trainer *tr, int step)
{
	const rl_train_opts *o = tr->o;
	seqstat score = SEQSTAT_INIT, reward = SEQSTAT_INIT, rlen = SEQSTAT_INIT, plen = SEQSTAT_INIT,
	    rlen_na = SEQSTAT_INIT;
	int S = tr->nseq, aborted = 0, clipped = 0, clipped_na = 0, positive = 0;

	for (int i = 0; i < S; i++) {
		const rl_sample *s = tr->seq[i].s;
		const uint8_t *mk = s->loss_mask;
		int clip = strcmp(s->finish, "length") == 0, len = 0;
		/* the response's length is its sampled tokens' (loss_mask 1): an
		 * environment's inserted tokens are not the policy's; the record's
		 * mask, as --overlong-filter's does not shorten a response */
		for (int t = 0; t < s->rlen; t++)
			len += mk ? mk[t] != 0 : 1;
		ss_add(&rlen, len);
		ss_add(&plen, s->plen);
		clipped += clip;
		if (s->rlen == 0) {
			aborted++;
			continue;
		}
		ss_add(&rlen_na, len);
		clipped_na += clip;
		ss_add(&score, s->reward);
		ss_add(&reward, tr->seq[i].reward);
		positive += s->reward > 0;
	}
	if (o->algo != RL_ALGO_SFT && o->algo != RL_ALGO_DPO && o->algo != RL_ALGO_RM) {
		rl_stat3 adv = tok_stat(tr, tr->adv_tok), ret = o->algo == RL_ALGO_PPO ? tok_stat(tr, tr->ret_tok) : adv;
		metric3(j, tr, step, "critic/score", ss_mean(&score), ss_max(&score), ss_min(&score));
		metric(j, tr, step, "critic/score/positive_frac", score.n ? (double)positive / score.n : NAN);
		metric3(j, tr, step, "critic/rewards", ss_mean(&reward), ss_max(&reward), ss_min(&reward));
		metric3(j, tr, step, "critic/advantages", adv.mean, adv.max, adv.min);
		/* the value targets: A + V_old under PPO, the advantages themselves
		 * for the outcome estimators (verl sets returns = advantages) */
		metric3(j, tr, step, "critic/returns", ret.mean, ret.max, ret.min);
	}
	metric3(j, tr, step, "response_length", ss_mean(&rlen), ss_max(&rlen), ss_min(&rlen));
	metric(j, tr, step, "response_length/clip_ratio", S ? (double)clipped / S : NAN);
	metric3(j, tr, step, "response_length_non_aborted", ss_mean(&rlen_na), ss_max(&rlen_na), ss_min(&rlen_na));
	metric(j, tr, step, "response_length_non_aborted/clip_ratio", rlen_na.n ? (double)clipped_na / rlen_na.n : NAN);
	metric(j, tr, step, "response/aborted_ratio", S ? (double)aborted / S : NAN);
	if (o->overlong_filter)
		metric(j, tr, step, "response/overlong_filtered_ratio", S ? (double)tr->noverlong / S : NAN);
	metric3(j, tr, step, "prompt_length", ss_mean(&plen), ss_max(&plen), ss_min(&plen));
}

/* This rank's AdamW state and what it allocated for the model (as rl-train
 * --plan counts it), resident memory now and at its peak. */
static void
memory_metrics(cJSON *j, trainer *tr, int step)
{
	struct rusage ru;
	size_t nopt = tr->zero ? tr->zhi - tr->zlo : tr->m->tt.total - tr->m->goff;
	metric(j, tr, step, "memory/optimizer_state_mb", 2.0 * (double)nopt * sizeof(float) / (1 << 20));
	size_t slots = tr->m->tt.total;
	double wb = 4.0 * (double)slots;
	if (tr->m->w != (void *)tr->m->params)
		wb += (double)slots * (double)rl_dtype_size(tr->m->ops->act_dtype);
	metric(j, tr, step, "memory/weights_mb", wb / (1 << 20));
	metric(j, tr, step, "memory/grads_mb", tr->m->grads ? 4.0 * (double)(slots - tr->m->goff) / (1 << 20) : 0);
	metric(j, tr, step, "memory/activations_mb", (double)rl_model_act_bytes(tr->m) / (1 << 20));
	/* measured: the gradients' resident pages at their peak this step (ZeRO-2 samples
	 * during the backward pass; otherwise the buffer as it stands, all of it touched) */
	rli_dp_grads_resident(tr);
	if (tr->gres_peak > 0)
		metric(j, tr, step, "memory/grads_resident_mb", tr->gres_peak / (1 << 20));
	tr->gres_peak = 0;
	/* measured: the parameters' resident pages at their peak this step (ZeRO-3
	 * samples at each gather; otherwise the whole table as it stands) */
	rli_dp_params_resident(tr);
	if (tr->pres_peak > 0)
		metric(j, tr, step, "memory/params_resident_mb", tr->pres_peak / (1 << 20));
	tr->pres_peak = 0;
	/* the same at the load, ZeRO-3 (dp.c): on the first step's line */
	/* measured: the reference model's (--ref, DPO's) resident pages at their peak
	 * (ZeRO-3 samples each unit of its forwards; else the whole table) */
	rli_dp_ref_resident(tr);
	if (tr->ref_pres_peak > 0)
		metric(j, tr, step, "memory/ref_params_resident_mb", tr->ref_pres_peak / (1 << 20));
	if (tr->ref)
		metric(j, tr, step, "memory/ref_activations_mb", (double)rl_model_act_bytes(tr->ref) / (1 << 20));
	tr->ref_pres_peak = 0;
	if (tr->ref_load_pres > 0)
		metric(j, tr, step, "memory/ref_load_params_resident_mb", tr->ref_load_pres / (1 << 20));
	tr->ref_load_pres = 0;
	if (tr->load_pres > 0)
		metric(j, tr, step, "memory/load_params_resident_mb", tr->load_pres / (1 << 20));
	tr->load_pres = 0;
	/* the same while this step's directory was written (ZeRO-3, save.c) */
	if (tr->save_pres_peak > 0)
		metric(j, tr, step, "memory/save_params_resident_mb", tr->save_pres_peak / (1 << 20));
	tr->save_pres_peak = 0;
	/* the same while a version was built in parts unit by unit (save.c) */
	if (tr->pub_pres_peak > 0)
		metric(j, tr, step, "memory/publish_params_resident_mb", tr->pub_pres_peak / (1 << 20));
	tr->pub_pres_peak = 0;
	long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f && fscanf(f, "%*s %ld", &pages) == 1)
		metric(j, tr, step, "memory/rss_mb", (double)pages * (double)sysconf(_SC_PAGESIZE) / (1 << 20));
	if (f)
		fclose(f);
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		metric(j, tr, step, "memory/max_rss_mb", ru.ru_maxrss / 1024.0);
		/* CPU seconds of every thread since the previous line (the first:
		 * since the start): on a shared machine the cost of a step that
		 * wall time hides behind other jobs' load */
		double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
		    ru.ru_stime.tv_usec * 1e-6;
		metric(j, tr, step, "perf/cpu_s", cpu - tr->cpu_last);
		tr->cpu_last = cpu;
		/* page faults since the previous line: the pages given back and
		 * touched again (ZeRO-2/3), each one a trip into the kernel */
		metric(j, tr, step, "perf/minor_faults", (double)ru.ru_minflt - tr->minflt_last);
		tr->minflt_last = (double)ru.ru_minflt;
	}
}

/* The loss terms of the step, under the names of verl (policy gradient, PPO's
 * critic), TRL (dpo, rm) or rlpipe (sft); nt is the trained token count (NaN
 * when none). */
static void
loss_metrics(cJSON *j, trainer *tr, int step, const mstat *ms, int nupdates, double nt)
{
	const rl_train_opts *o = tr->o;

	if (o->algo == RL_ALGO_SFT) {
		metric(j, tr, step, "actor/sft_loss", ms->ce / nt);
	} else if (o->algo == RL_ALGO_DPO) {
		/* TRL's DPOTrainer names, means over the step's pairs (and passes) */
		static const char *const dn[7] = { "actor/dpo_loss", "rewards/chosen", "rewards/rejected",
			"rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected" };
		double npair = ms->npairs > 0 ? ms->npairs : NAN;
		for (int i = 0; i < 7; i++)
			metric(j, tr, step, dn[i], ms->dpo[i] / npair);
		if (o->rpo_alpha > 0)
			metric(j, tr, step, "nll_loss", ms->nll / (ms->nll_tok > 0 ? ms->nll_tok : NAN));
	} else if (o->algo == RL_ALGO_RM) {
		/* the scores of the chosen and rejected sides, means over the pairs */
		static const char *const rn[5] = { "actor/rm_loss", "rewards/chosen", "rewards/rejected",
			"rewards/accuracies", "rewards/margins" };
		double npair = ms->npairs > 0 ? ms->npairs : NAN;
		for (int i = 0; i < 5; i++)
			metric(j, tr, step, rn[i], ms->dpo[i] / npair);
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
	if (o->algo != RL_ALGO_DPO && o->algo != RL_ALGO_RM)   /* no entropy computed */
		metric(j, tr, step, "actor/entropy", ms->ent / nt);
}

/* PPO's critic: value loss and clipping, and the values over the sampled
 * tokens; runs after data_metrics, since it packs val_tok/ret_tok in place. */
static void
critic_metrics(cJSON *j, trainer *tr, int step, const mstat *ms, int nupdates, double nt)
{
	int S = tr->nseq, ntk = S ? tr->seq[S - 1].toff + tr->seq[S - 1].s->rlen : 0;
	rl_stat3 vs = tok_stat(tr, tr->val_tok);

	if (tr->has_mask) {
		/* over the sampled tokens only: pack them to the front (V_old and the
		 * returns are not used again after the step's updates) */
		int k = 0;
		for (int t = 0; t < ntk; t++)
			if (tr->mask_tok[t]) {
				tr->val_tok[k] = tr->val_tok[t];
				tr->ret_tok[k] = tr->ret_tok[t];
				k++;
			}
		ntk = k;
	}
	metric(j, tr, step, "critic/vf_loss", ms->vf_loss / nupdates);
	metric(j, tr, step, "critic/vf_clipfrac", ms->vf_clip / nt);
	metric(j, tr, step, "critic/vpred_mean", ms->vpred / nt);
	metric(j, tr, step, "critic/vf_explained_var", rl_explained_var(tr->val_tok, tr->ret_tok, ntk));
	metric3(j, tr, step, "critic/values", vs.mean, vs.max, vs.min);
}

int
rli_metrics_write(trainer *tr, const mstat *ms, float gnorm, double lr, double t_step, double t_upd,
    double t_wait, int nupdates)
{
	const rl_train_opts *o = tr->o;
	cJSON *j;
	int step = tr->m->version, S = tr->nseq, err;
	double stal = 0, stalmax = 0;
	long ntok = 0, nresp = 0;
	char *txt;

	if (!(j = cJSON_CreateObject()))
		return RL_ENOMEM;
	for (int i = 0; i < S; i++) {
		rl_sample *s = tr->seq[i].s;
		ntok += s->plen + s->rlen;
		nresp += s->rlen;
		if (s->ver_first >= 0) {
			/* the policy that generated it vs the one being updated (version = step before update) */
			double d = (step - 1) - s->ver_first;
			stal += d;
			stalmax = fmax(stalmax, d);
		}
	}
	/* the token statistics cover the trained tokens (not the skipped ones);
	 * none trained: null, not a 0 that reads as a measured value */
	double nt = ms->ntok > 0 ? ms->ntok : NAN;
	cJSON_AddNumberToObject(j, "step", step);
	metric(j, tr, step, "training/global_step", step);
	loss_metrics(j, tr, step, ms, nupdates, nt);
	metric(j, tr, step, "actor/grad_norm", gnorm);
	metric(j, tr, step, "actor/lr", lr);
	data_metrics(j, tr, step);
	if (o->algo == RL_ALGO_PPO)
		critic_metrics(j, tr, step, ms, nupdates, nt);
	if (o->algo != RL_ALGO_SFT && o->algo != RL_ALGO_DPO && o->algo != RL_ALGO_RM) {
		/* --skip-zero-adv: the share of the step not run through the model */
		metric(j, tr, step, "actor/skipped_seq_frac", S ? (double)tr->nskip / S : NAN);
		metric(j, tr, step, "actor/skipped_token_frac", tr->tok_all ? (double)tr->tok_skip / tr->tok_all : NAN);
	}
	metric(j, tr, step, "timing_s/gen", t_wait);
	metric(j, tr, step, "timing_s/update_actor", t_upd);
	metric(j, tr, step, "timing_s/model", tr->t_model);
	metric(j, tr, step, "timing_s/publish", tr->t_pub);
	if (tr->qc) /* the queue wiring: the version told to the broker and the acknowledgements */
		metric(j, tr, step, "timing_s/ack", tr->t_ack);
	/* since rl_train_run started: the first step's less its timing_s/step is
	 * the start-up, the run's wall time less the last one the exit */
	metric(j, tr, step, "timing_s/elapsed", rl_now() - tr->t_begin);
	if (tr->world > 1) {
		int nb, early = rl_comm_reducer_early(tr->red, &nb);
		metric(j, tr, step, "timing_s/allreduce", tr->t_comm);
		/* the update's phases: what the main thread waited for (gathers,
		 * gradient reductions) and the optimizer; the rest of timing_s/model
		 * is the passes' compute */
		metric(j, tr, step, "timing_s/param_gather", tr->t_gather);
		metric(j, tr, step, "timing_s/grad_reduce", tr->t_rs);
		metric(j, tr, step, "timing_s/optimizer", tr->t_opt);
		metric(j, tr, step, "dp/world_size", tr->world);
		/* the share of the last update's gradient buckets sent during its backward pass */
		metric(j, tr, step, "dp/buckets_overlapped_frac", nb ? (double)early / nb : NAN);
		/* with LoRA ZeRO-3 shards the base alone: tr->zero 0, z3p set */
		metric(j, tr, step, "dp/zero_stage", tr->zero ? tr->zero : tr->z3p.zp ? 3 : 0);
		if (tr->z3p.zp) /* ZeRO-3: unit gathers of the step's passes (not a save's whole-model one) */
			metric(j, tr, step, "dp/units_gathered", tr->z3p.ngather);
		if (tr->z3p.zp) /* the gathered ranges whose pages came from the unit pool (dp.c) */
			metric(j, tr, step, "dp/units_pooled", tr->z3p.npooled);
		if (tr->z3p.zp) /* the gathered ranges whose whole pages were mapped from their owners' shards (dp.c) */
			metric(j, tr, step, "dp/units_mapped", tr->z3p.nmapped);
		if (tr->z3p.zp) /* 1: the gathers read the other ranks' shards in place (dp.c), 0: through the ring */
			metric(j, tr, step, "dp/shards_in_place", tr->z3p.peer != NULL);
		if (tr->z3r.zp) /* the same of the reference's forwards (present once it is open) */
			metric(j, tr, step, "dp/ref_units_gathered", tr->z3r.ngather);
	}
	memory_metrics(j, tr, step);
	/* the share of the step (update + publish) spent outside the model's compute */
	metric(j, tr, step, "perf/overhead_frac",
	    t_upd + tr->t_pub > 0 ? (t_upd + tr->t_pub - tr->t_model) / (t_upd + tr->t_pub) : NAN);
	/* what --micro-tokens would save: the padding positions of the step's training passes */
	metric(j, tr, step, "perf/pad_frac", ms->npos > 0 ? ms->npad / ms->npos : 0);
	metric(j, tr, step, "timing_s/step", t_step);
	/* verl's compute_timing_metrics and compute_throughout_metrics: per
	 * token, generation over response tokens and the update over all; the
	 * throughput over the whole step, per rank (verl's per GPU) */
	metric(j, tr, step, "timing_per_token_ms/gen", nresp ? t_wait * 1000 / (double)nresp : NAN);
	metric(j, tr, step, "timing_per_token_ms/update_actor", ntok ? t_upd * 1000 / (double)ntok : NAN);
	metric(j, tr, step, "perf/total_num_tokens", (double)ntok);
	metric(j, tr, step, "perf/time_per_step", t_step);
	metric(j, tr, step, "perf/throughput", t_step > 0 ? ntok / (t_step * (tr->world > 1 ? tr->world : 1)) : NAN);
	metric(j, tr, step, "staleness/mean", S ? stal / S : NAN);
	metric(j, tr, step, "staleness/max", stalmax);
	metric(j, tr, step, "train/sequences", S);
	metric(j, tr, step, "train/groups_dropped_no_signal", (double)tr->dropped_nosignal);
	metric(j, tr, step, "train/steps_skipped", (double)tr->steps_skipped);
	if (o->eval_fn && tr->rank == 0 && ((o->eval_every > 0 && step % o->eval_every == 0) ||
	    (o->max_steps > 0 && step == o->max_steps))) {
		char dir[4096];
		struct eval_put ep = { j, tr, step };
		snprintf(dir, sizeof dir, "%s/step-%08d", o->out_dir, step);
		/* the validation reads the step's directory: a version written in
		 * the background must be there first */
		if ((err = rli_save_wait(tr)) != 0 || (err = o->eval_fn(o->eval_ctx, step, dir, eval_put, &ep)) != 0) {
			cJSON_Delete(j);
			return err;
		}
	}
	if (o->prom_path && (err = prom_write(j, o->prom_path)) != 0) {
		cJSON_Delete(j);
		return err;
	}
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
		if (!(tr->metrics = fopen(o->metrics_path, tr->resumed ? "a" : "w"))) {
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
		double v[10] = { ms->loss, ms->clip, ms->kl, ms->ratio_logsum, ms->ent, ms->ce, ms->ntok, ms->clip_lower,
			ms->npos, ms->npad };
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 10)) != 0)
			return rv;
		ms->loss = v[0], ms->clip = v[1], ms->kl = v[2], ms->ratio_logsum = v[3], ms->ent = v[4], ms->ce = v[5];
		ms->ntok = v[6], ms->clip_lower = v[7], ms->npos = v[8], ms->npad = v[9];
	}
	if (tr->world > 1 && (tr->o->algo == RL_ALGO_DPO || tr->o->algo == RL_ALGO_RM)) {
		double v[10];
		memcpy(v, ms->dpo, sizeof ms->dpo);
		v[7] = ms->npairs, v[8] = ms->nll, v[9] = ms->nll_tok;
		if ((rv = rl_comm_host_allreduce_f64(tr->comm, v, 10)) != 0)
			return rv;
		memcpy(ms->dpo, v, sizeof ms->dpo);
		ms->npairs = v[7], ms->nll = v[8], ms->nll_tok = v[9];
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

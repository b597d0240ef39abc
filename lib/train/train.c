/*
 * train.c — the learner's run (train.h; its pieces share trainer.h): opens
 * the backend, the model, the input and the outputs; then per step collects
 * `batch` complete groups (feed.c), drops what carries no signal (DAPO),
 * computes the update (step.c), publishes a checkpoint (save.c) and writes
 * one metrics line (metrics.c); with several ranks they agree on every step
 * first (dp.c).  At the end: a last full checkpoint that --resume continues
 * from, the run's summary, and the run's status.  Also rl-train --init.
 *
 * Data parallel (train.h, docs/parallel.md): the same steps on every rank,
 * each rank's micro-batches over its share of every mini-batch, the weights
 * of the whole mini-batch, a bucketed gradient all-reduce before AdamW.
 * Leaves out: option parsing (cmd/rl-train).
 */
#include "train/train.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/io.h"
#include "model/ckpt.h"
#include "model/lora.h"
#include "model/model.h"
#include "tok/tokenizer.h"
#include "train/plan.h"
#include "train/trainer.h"

void
rl_train_opts_default(rl_train_opts *o)
{
	memset(o, 0, sizeof *o);
	o->device = "auto";
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
	o->dpo_beta = 0.1f;
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
	o->save_minutes = 10;
	o->on_bad = RL_BAD_AUTO;
	o->dp_check_every = 10;
	o->dp_bucket_mb = 25;
	o->dp_overlap = 1;
	o->skip_zero_adv = -1;
	o->lora_alpha = 16.0f;          /* verl's lora_alpha and target_modules defaults */
	o->lora_targets = RL_LORA_ALL;
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

volatile sig_atomic_t rli_train_stop;

void
rli_train_on_signal(int sig)
{
	rli_train_stop = sig ? sig : 1;
}

static int train_stop_file; /* the signal that stopped a file/stdin run */

int
rl_train_stopped_by(void)
{
	return train_stop_file;
}

/* One step: the update of the groups collected, its checkpoint, the
 * acknowledgement of its records, its metrics line. */

/* Test hook (tests/cli/exactly-once.bats): RL_TRAIN_TEST_DIE=N:saved dies
 * as kill -9 would right after step N's checkpoint is written (a step
 * written in the background: handed to its thread), before the broker hears
 * of version N; N:versioned after that, before the step's groups are
 * acknowledged: the two moments a crash splits (acknowledgements follow
 * full checkpoints, which are written in place). */
static void
test_die(const trainer *tr, const char *where)
{
	const char *e = getenv("RL_TRAIN_TEST_DIE");
	char *end;
	long n;

	if (e == NULL)
		return;
	n = strtol(e, &end, 10);
	if (*end == ':' && n == tr->m->version && strcmp(end + 1, where) == 0)
		raise(SIGKILL);
}
static int
train_step(trainer *tr)
{
	const rl_train_opts *o = tr->o;
	int rv, recomputed, nupd, step0 = tr->m->step;
	mstat ms = { 0 };
	float gnorm = 0;
	double t0 = rl_now(), lr = 0, t_wait = tr->t_wait, t_upd;

	tr->t_wait = 0;
	tr->t_model = 0;
	tr->t_gather = tr->t_rs = tr->t_opt = 0;
	tr->z3p.ngather = tr->z3r.ngather = 0;
	tr->z3p.npooled = tr->z3r.npooled = 0;
	tr->z3p.nmapped = tr->z3r.nmapped = 0;
	if ((rv = rli_step_prepare(tr)) != 0)
		return rv;
	if (tr->nseq == 0)
		return RL_OK;
	if ((rv = rli_step_old(tr, &recomputed)) != 0)
		return rv;
	tr->t_comm = 0;
	if ((rv = rli_step_update(tr, recomputed, &ms, &gnorm, &lr, &nupd)) != 0 ||
	    (rv = rli_metrics_gather(tr, &ms, RL_MAX(o->ppo_epochs, 1))) != 0)
		return rv;
	t_upd = rl_now() - t0;
	if (tr->m->step == step0) {
		/* every update was skipped (non-finite gradient norm, logged): the
		 * weights did not change, so there is no new version to publish; the
		 * step's groups are consumed, as verl and TRL skip such a step */
		tr->steps_skipped++;
		return tr->qc ? rli_feed_ack(tr, 1, 0) : RL_OK;
	}
	/* one version per trainer step, whatever its AdamW updates (E x M): the
	 * staleness gates, --max-steps and the step-N names all count these */
	tr->m->version++;
	if ((rv = rli_save_step(tr)) != 0)
		return rv;
	test_die(tr, "saved");
	if (tr->world > 1 && o->dp_check_every > 0 && tr->m->version % o->dp_check_every == 0 &&
	    (rv = rli_dp_check_weights(tr)) != 0)
		return rv;
	tr->t_ack = 0;
	if (tr->qc) {
		double t_ack = rl_now();
		/* the new version first, so the broker's gate judges later groups by it */
		rl_qclient_set_version(tr->qc, (uint64_t)tr->m->version, NULL);
		test_die(tr, "versioned");
		if ((rv = rli_feed_ack(tr, 1, tr->last_full)) != 0)
			return rv;
		tr->t_ack = rl_now() - t_ack;
	}
	if (tr->rank != 0)
		return RL_OK;
	return rli_metrics_write(tr, &ms, gnorm, lr, rl_now() - t0 + t_wait, t_upd, t_wait, nupd);
}

/* The options' consequences that need no resource; the ranks. */
static int
setup(trainer *tr, const rl_train_opts *o)
{
	const char *why = rl_train_skip_inexact(o);

	tr->o = o;
	tr->agg = o->agg >= 0 ? o->agg : rl_algo_default_agg(o->algo);
	if (o->skip_zero_adv > 0 && why) {
		rl_error("--skip-zero-adv would change the update: %s", why);
		rl_hint("leave it out: it is on by default wherever it is exact (--no-skip-zero-adv turns it off)");
		return RL_EINVAL;
	}
	tr->skip_zero = o->skip_zero_adv != 0 && !why && o->algo != RL_ALGO_SFT && o->algo != RL_ALGO_DPO &&
	    o->algo != RL_ALGO_RM;
	tr->pack = o->micro_tokens > 0;
	tr->maxtok = tr->pack ? o->micro_tokens : o->max_tokens_micro;
	if (!o->out_dir) {
		rl_error("no output directory (--out DIR)");
		return RL_EINVAL;
	}
	tr->world = o->comm && o->comm->world > 1 ? o->comm->world : 1;
	tr->rank = tr->world > 1 ? o->comm->rank : 0;
	return RL_OK;
}

/* LoRA: the frozen base and the adapters on it, new (dir NULL) or from the
 * adapter checkpoint dir, whose adapter_config.json names the base (else -m).
 * ZeRO-3 shards the base only: checked here, each rank's shard read in
 * rli_dp_start; the adapters are whole on every rank as without ZeRO. */
static int
open_lora(trainer *tr, const char *dir)
{
	const rl_train_opts *o = tr->o;
	rl_lora_opts lo = { o->lora_rank, o->lora_alpha, o->lora_dropout, o->lora_targets, o->seed };
	char *base = NULL;
	int rv;

	if (o->zero == 1 || o->zero == 2) {
		rl_error("--lora-rank with --zero %d: the adapters' gradients and AdamW state are not sharded (they are "
		    "small)", o->zero);
		rl_hint("--zero 3 shards the frozen base; without --zero the adapters' gradients are all-reduced");
		return RL_ENOTSUP;
	}
	if (o->wgroup_addr) {
		/* the group broadcasts the parameter buffer: the frozen base would go, not the adapters */
		rl_error("--lora-rank with --weights-group: the group sends whole models; use --sync (adapter versions)");
		return RL_ENOTSUP;
	}
	if (dir != NULL) {
		rl_lora_opts was;
		if ((rv = rl_lora_config_read(dir, &was, &base)) != 0)
			return rv;
		if (base == NULL && o->model_dir != NULL)
			base = rl_xstrdup(o->model_dir);
		if (base == NULL) {
			rl_error("'%s/%s' names no base model: give it with -m BASE", dir, RL_LORA_CONFIG_FILE);
			return RL_EINVAL;
		}
	}
	if (tr->world > 1 && o->zero == 3)
		rv = rl_model_open_part(&tr->m, base ? base : o->model_dir, tr->ops, 0, o->seed);
	else
		rv = rl_model_open(&tr->m, base ? base : o->model_dir, tr->ops);
	if (rv == 0)
		rv = rl_model_add_lora(tr->m, &lo);
	if (rv == 0 && dir != NULL)
		rv = rl_model_lora_load(tr->m, dir);
	if (rv == 0)
		rl_verbose("LoRA: rank %d, alpha %g, dropout %g on '%s'", lo.r, lo.alpha, lo.dropout,
		    base ? base : o->model_dir);
	tr->ref_base = rl_train_ref_is_base(o->lora_rank, o->algo == RL_ALGO_DPO, o->ref_dir,
	    base ? base : o->model_dir);
	/* ZeRO-3: the base's forwards gather the policy's units (a rank without
	 * one runs its gathers: rli_zero3_ref_idle) */
	if (rv == 0 && tr->ref_base)
		rl_verbose("reference: the base '%s' with the adapters off (no second model)",
		    base ? base : o->model_dir);
	free(base);
	return rv;
}

/* The model trained, from dir: a reward model (--algo rm) opens as one (a
 * causal LM gets a new score head, model.h), any other algorithm needs a
 * language model. */
static int
open_policy(trainer *tr, const char *dir, int resumed)
{
	const rl_train_opts *o = tr->o;
	int rv;

	if (o->lora_rank > 0)
		return open_lora(tr, resumed ? dir : NULL);
	if (tr->world > 1 && o->zero == 3)
		/* ZeRO-3: checked here, each rank reads its shard in rli_dp_start */
		rv = rl_model_open_part(&tr->m, dir, tr->ops, o->algo == RL_ALGO_RM, o->seed);
	else if (o->algo == RL_ALGO_RM)
		return rl_model_open_rm(&tr->m, dir, tr->ops, o->seed);
	else
		rv = rl_model_open(&tr->m, dir, tr->ops);
	if (rv != 0 || o->algo == RL_ALGO_RM)
		return rv;
	if (tr->m->cfg.seq_cls) {
		rl_error("'%s' is a reward model (%s has no language-model head): --algo %s trains a policy",
		    dir, "...ForSequenceClassification", rl_algo_name(o->algo));
		rl_hint("give it to rl-reward --model, or train it further with --algo rm");
		return RL_EINVAL;
	}
	return RL_OK;
}

/* --ref DIR: whole, or with ZeRO-3 checked here and each rank's shard read
 * in rli_dp_start.  Its log-probs are of the policy's tokens: the same
 * vocabulary (a smaller one would be read past its embedding). */
static int
open_ref(trainer *tr, const char *policy_dir)
{
	const rl_train_opts *o = tr->o;
	int rv;

	if (tr->world > 1 && o->zero == 3)
		rv = rl_model_open_part(&tr->ref, o->ref_dir, tr->ops, 0, o->seed);
	else
		rv = rl_model_open(&tr->ref, o->ref_dir, tr->ops);
	if (rv != 0)
		return rv;
	return rl_train_ref_check(&tr->m->cfg, policy_dir, &tr->ref->cfg, o->ref_dir);
}

/* --resume auto (the default): resume when --out holds a full checkpoint,
 * start fresh when it is absent or holds no step directory; step
 * directories without any full checkpoint (a run killed before its first)
 * are refused by name rather than overwritten or silently trained over. */
static int
resume_auto(const rl_train_opts *o, int *resume)
{
	DIR *d;
	struct dirent *e;
	char dir[4096];
	cJSON *st = NULL;
	int n = 0, lo = -1, hi = -1, step;

	*resume = 0;
	if (!(d = opendir(o->out_dir)))
		return RL_OK; /* absent (created fresh), or not a directory: rli_save_prepare_out says so */
	while ((e = readdir(d)) != NULL) {
		int s = rl_ckpt_step_num(e->d_name);
		if (s < 0)
			continue;
		n++;
		lo = lo < 0 || s < lo ? s : lo;
		hi = s > hi ? s : hi;
	}
	closedir(d);
	if (n == 0)
		return RL_OK;
	if (rl_ckpt_find_full(o->out_dir, dir, sizeof dir, &step, &st, 1) == RL_OK) {
		cJSON_Delete(st);
		*resume = 1;
		rl_info("'%s' holds a run: resuming it from step %d (--fresh refuses instead)", o->out_dir, step);
		return RL_OK;
	}
	rl_error("'%s' holds %d step directories (step-%08d to step-%08d) but no full checkpoint to resume from "
	    "(optimizer.safetensors and trainer_state.json)", o->out_dir, n, lo, hi);
	rl_hint("a run killed before its first full checkpoint (--save-minutes, --save-every) leaves these: "
	    "remove them to start over, or give a new --out");
	return RL_EEXIST;
}

/* The backend and the communicator; the policy from -m, or on --resume from
 * the newest full checkpoint in --out (its directory to dir, its
 * trainer_state.json to *state) with its optimizer state; PPO's value head,
 * the reference model, the step's buffers. */
static int
open_model(trainer *tr, char *dir, size_t dirsz, cJSON **state)
{
	const rl_train_opts *o = tr->o;
	char dev[32];
	const char *d = o->device;
	int rv, rstep = 0, shards;

	/* several ranks on "cuda": each on the GPU of its LOCAL_RANK */
	if (tr->world > 1 && (strcmp(d, "cuda") == 0 || strcmp(d, "auto") == 0)) {
		snprintf(dev, sizeof dev, "%s:%d", d, o->comm->local_rank);
		d = dev;
	}
	if ((rv = rl_ops_open(&tr->ops, d)) != 0)
		return rv;
	if (tr->world > 1) {
		if ((rv = rl_comm_open(&tr->comm, o->comm, tr->ops)) != 0)
			return rv;
		rl_verbose("data parallel: rank %d of %d, %s backend", tr->rank, tr->world, rl_comm_backend(tr->comm));
	}
	if (tr->rank == 0) {
		/* one trainer per --out (and rl-rollout tells a live one's steps from leftovers) */
		int fd;
		if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
			fd = -1; /* rli_save_prepare_out says why */
		else if ((rv = rl_ckpt_lock_run(o->out_dir, &fd)) != 0)
			return rv;
		tr->lockfd = fd + 1;
	}
	if (o->resume == RL_RESUME_YES)
		tr->resumed = 1;
	else if (o->resume == RL_RESUME_AUTO && tr->rank == 0 && (rv = resume_auto(o, &tr->resumed)) != 0)
		return rv;
	/* every rank follows rank 0's choice (the ranks may see --out at different moments) */
	if (tr->world > 1 && o->resume == RL_RESUME_AUTO &&
	    (rv = rl_comm_host_broadcast(tr->comm, &tr->resumed, sizeof tr->resumed, 0)) != 0)
		return rv;
	if (tr->resumed) {
		if ((rv = rl_ckpt_find_full(o->out_dir, dir, dirsz, &rstep, state, 0)) != 0 ||
		    (tr->rank == 0 && (rv = rli_runfile_check(o)) != 0) ||
		    (tr->rank == 0 && (rv = rli_save_prepare_out(o, rstep)) != 0) ||
		    (tr->rank == 0 && (rv = rli_runfile_write(o)) != 0) ||
		    (rv = open_policy(tr, dir, 1)) != 0)
			return rv;
	} else {
		if (!o->model_dir) {
			rl_error("no model (-m MODEL_DIR)%s", o->resume == RL_RESUME_AUTO ?
			    " and no checkpoint to resume in --out" : "");
			return RL_EINVAL;
		}
		if ((tr->rank == 0 && (rv = rli_save_prepare_out(o, -1)) != 0) ||
		    (tr->rank == 0 && (rv = rli_runfile_write(o)) != 0) ||
		    (rv = open_policy(tr, o->model_dir, 0)) != 0)
			return rv;
	}
	if (tr->resumed && (o->algo == RL_ALGO_PPO || o->algo == RL_ALGO_RM)) {
		/* the optimizer state of a value (rm: score) head is only in a
		 * checkpoint of the same algorithm */
		cJSON *alg = cJSON_GetObjectItem(*state, "algo");
		if (cJSON_IsString(alg) && strcmp(alg->valuestring, rl_algo_name(o->algo)) != 0) {
			rl_error("cannot resume '%s' with --algo %s: it was trained with --algo %s", dir,
			    rl_algo_name(o->algo), alg->valuestring);
			rl_hint("start a %s run from it with -m '%s' (a new --out) instead", rl_algo_name(o->algo), dir);
			return RL_EINVAL;
		}
	}
	/* PPO's value head: from the directory the policy came from, else new */
	/* rm's score head is the same linear layer on the last hidden state */
	if ((o->algo == RL_ALGO_PPO || o->algo == RL_ALGO_RM) &&
	    (rv = rl_model_add_value_head(tr->m, tr->resumed ? dir : o->model_dir, o->seed)) != 0)
		return rv;
	if (o->ref_dir && !tr->ref_base && (rv = open_ref(tr, tr->resumed ? dir : o->model_dir)) != 0)
		return rv;
	/* ZeRO: only a shard, from dp.c's zero_open; with LoRA the adapters' whole */
	tr->m->no_adam_state = tr->world > 1 && o->zero && !tr->m->lora;
	tr->m->recompute = o->recompute;
	if ((rv = rli_step_reserve(tr)) != 0)
		return rv;
	if (tr->world > 1 && o->zero != 1 && (rv = rli_dp_reducer_open(tr)) != 0)
		return rv;
	if (!tr->resumed)
		return RL_OK;
	/* the version is the directory's step-N; the AdamW count is the file's */
	tr->m->version = rstep;
	if ((rv = rl_ckpt_opt_sharded(dir, &shards)) != 0)
		return rv;
	if (shards == 0) {
		/* the whole state in one file: loaded whole, ZeRO keeps its shard */
		if (tr->m->no_adam_state && (rv = rli_zero_full_alloc(tr)) != 0)
			return rv;
		return rl_ckpt_load_optimizer(tr->m, dir);
	}
	/* saved per shard: the step and master weights here; with ZeRO each
	 * rank reads its own range (dp.c), else rank 0 reads all of it (the
	 * others get it from rank 0 in rli_dp_start) */
	if ((rv = rl_ckpt_load_optimizer(tr->m, dir)) != 0)
		return rv;
	rl_verbose("resuming the AdamW state saved in %d shards", shards);
	if (tr->m->no_adam_state) {
		tr->opt_dir = rl_xstrdup(dir);
		return RL_OK;
	}
	return tr->rank == 0 ? rl_ckpt_read_opt_range(tr->m, dir, 0, tr->m->tt.total, tr->m->m, tr->m->v) : RL_OK;
}

static void
draw_progress(trainer *tr, int start_step)
{
	int max = tr->o->max_steps, done = tr->m->version - start_step, todo = max - start_step;
	double dt = rl_progress_elapsed(&tr->prog), rate = dt > 0 ? done / dt : 0.0;

	if (max > 0)
		rl_progress_draw(&tr->prog, (double)done / RL_MAX(todo, 1), "%d/%d steps, %.2f steps/s", done, todo,
		    rate);
	else
		rl_progress_draw(&tr->prog, -1, "%d steps, %.2f steps/s", done, rate);
}

/* Steps until --max-steps, the end of the input or a signal. */
static int
run_steps(trainer *tr, int start_step)
{
	const rl_train_opts *o = tr->o;
	int rv, have;

	for (;;) {
		if (o->max_steps > 0 && tr->m->version >= o->max_steps)
			return RL_OK;
		if (rli_train_stop && !tr->qc && !tr->qfollow)
			return RL_OK;
		rv = rli_feed_collect(tr);
		if (rv != RL_OK && rv != RL_ENOENT)
			return rv;
		if ((rv = rli_dp_agree_step(tr, rv == RL_OK, &have)) != RL_OK)
			return rv;
		if (!have) {
			rl_progress_done(&tr->prog);
			if (rli_train_stop && !tr->qc && !tr->qfollow)
				return RL_OK;
			if (tr->ngroups > 0 && tr->rank == 0 && !tr->qgone)
				rl_info("end of input: %d groups left over (less than --batch %d), not trained",
				    tr->ngroups, o->batch);
			return RL_OK;
		}
		rli_feed_renew_old(tr);
		for (int gi = 0; gi < tr->ngroups; gi++)
			if ((rv = rli_feed_mark_done(tr, tr->groups[gi].group)) != 0)
				return rv;
		if ((rv = train_step(tr)) != 0)
			return rv;
		rli_feed_free_groups(tr);
		if (tr->rank == 0)
			draw_progress(tr, start_step);
	}
}

/* The run's summary (rank 0) and its status: a broker that stopped
 * answering, or input that ended before the first step, fail the run. */
static int
finish(trainer *tr, int start_step)
{
	const rl_train_opts *o = tr->o;
	const rl_grouper_stats *st = rl_grouper_stats_get(tr->gr);

	if (st->bad_groups && tr->rank == 0)
		rl_warn("%llu groups dropped as bad (%llu bad records): not trained (--on-bad error stops at the first)",
			(unsigned long long)st->bad_groups, (unsigned long long)st->bad_records);
	if (tr->steps_skipped && tr->rank == 0)
		rl_warn("%llu steps skipped (non-finite gradient norm): their groups were consumed, not trained",
		    (unsigned long long)tr->steps_skipped);
	if (!o->quiet && tr->rank == 0)
		rl_info("%d steps; %llu records, %llu duplicates dropped, %llu bad records, %llu groups "
		    "dropped (bad), %llu (no signal), %llu incomplete", tr->m->version - start_step,
		    (unsigned long long)st->records, (unsigned long long)st->duplicates,
		    (unsigned long long)st->bad_records, (unsigned long long)st->bad_groups,
		    (unsigned long long)tr->dropped_nosignal, (unsigned long long)st->incomplete);
	if (tr->by_group && !o->quiet && tr->rank == 0)
		rl_info("%llu records skipped: their groups were done before --resume",
		    (unsigned long long)tr->skipped_done);
	if (tr->qgone) {
		/* a broker that stopped answering ends the run as a failure, after
		 * the last checkpoint (when anything was trained since the last
		 * full one); what was leased and not trained expires there */
		if (tr->rank == 0)
			rl_error("stopped after step %d: the broker at '%s' did not answer; --resume continues from "
			    "the last checkpoint", tr->m->version, o->queue_url);
		return RL_ETIMEDOUT;
	}
	/* file or pipe input that ended before one step: a failure, not a run
	 * (a generator that died at its start closed the pipe; a Makefile or a
	 * pipeline's status must not take it for a trained policy).  A --resume
	 * that finds no record past its checkpoint has nothing left to do. */
	if (!tr->qc && !tr->qfollow && !rli_train_stop && tr->m->version == start_step &&
	    !(o->max_steps > 0 && start_step >= o->max_steps) &&
	    (!tr->resumed || (tr->by_group ? tr->records_new > 0 : tr->records > tr->skip_records))) {
		if (tr->rank == 0) {
			rl_error("'%s' ended before the first step: %llu records, %d complete groups (--batch %d)",
			    o->input ? o->input : "-", (unsigned long long)(tr->by_group ? tr->records_new :
			    tr->records - RL_MIN(tr->records, tr->skip_records)), tr->ngroups, o->batch);
			rl_hint("an upstream stage that failed closes the pipe early: see its messages above");
		}
		return RL_ENOENT;
	}
	return RL_OK;
}

int
rli_train_fini(trainer *tr, int rv)
{
	int r2;

	/* a version still being written: finished (its failure, logged, fails
	 * a run that had not) before the model and the rl-sync client go */
	r2 = rli_save_wait(tr);
	if (rv == 0)
		rv = r2;
	rl_ckpt_snap_free(tr->snap);
	rli_feed_free_groups(tr);
	free(tr->pend);
	free(tr->opt_dir);
	rl_gset_fini(&tr->done);
	rl_gset_fini(&tr->skip);
	rl_gset_fini(&tr->pend_groups);
	free(tr->seq);
	free(tr->kseq);
	free(tr->pseq);
	free(tr->pbin);
	free(tr->h_seg);
	free(tr->h_off);
	free(tr->adv_tok);
	free(tr->w_tok);
	free(tr->old_tok);
	free(tr->kl_tok);
	free(tr->val_tok);
	free(tr->ret_tok);
	free(tr->mask_tok);
	free(tr->h_vold);
	if (tr->ops && tr->d_dval)
		tr->ops->free(tr->ops, tr->d_dval);
	free(tr->h_tok);
	free(tr->h_tgt);
	free(tr->h_old);
	if (tr->ops && tr->d_mem)
		tr->ops->free(tr->ops, tr->d_mem);
	if (tr->ops) {
		rli_zero3_join(tr); /* a prefetch in flight writes m->params */
		rli_zero3_close(tr);
		tr->ops->free(tr->ops, tr->zm);
		tr->ops->free(tr->ops, tr->zv);
		tr->ops->free(tr->ops, tr->zg);
		tr->ops->free(tr->ops, tr->z3p.zp);
		tr->ops->free(tr->ops, tr->z3r.zp);
		free(tr->z3p.kept);
	}
	rli_feed_close(tr);
	rl_progress_done(&tr->prog);
	rli_metrics_close(tr);
	rl_wsync_close(tr->ws);
	rl_wsync_client_close(tr->wpc);
	rl_wver_destroy(tr->wpart);
	/* the group's end: the workers go on with the last version */
	r2 = rl_wgroup_close(tr->wg, rv == 0);
	if (rv == 0)
		rv = r2;
	rl_model_close(tr->ref);
	rl_comm_reducer_destroy(tr->red);
	if (tr->m)
		rli_dp_grads_unmap(tr);
	rl_model_close(tr->m);
	rl_comm_close(tr->comm);
	rl_ops_close(tr->ops);
	if (tr->lockfd > 0)
		close(tr->lockfd - 1);
	memset(tr, 0, sizeof *tr);
	return rv;
}

int
rl_train_run(const rl_train_opts *o)
{
	trainer tr = { 0 };
	char dir[4096];
	cJSON *state = NULL;
	int rv, start_step;

	tr.t_begin = rl_now();
	if ((rv = setup(&tr, o)) != 0)
		return rv;
	if ((rv = open_model(&tr, dir, sizeof dir, &state)) != 0 ||
	    (tr.resumed && (rv = rli_save_load_state(&tr, state, dir)) != 0) ||
	    (tr.world > 1 && (rv = rli_dp_start(&tr)) != 0))
		goto out;
	start_step = tr.m->version;
	tr.t_full = rl_now();
	tr.have_full = tr.resumed;
	rl_progress_init(&tr.prog, o->quiet);
	if ((rv = rli_feed_open(&tr)) != 0 || (rv = rli_metrics_open(&tr)) != 0 || (rv = rli_save_open(&tr, dir)) != 0)
		goto out;
	rl_verbose("training %s (%zu parameters) with %s on %s, %d groups per step",
	    tr.m->cfg.model_type, rl_model_nparams(tr.m), rl_algo_name(o->algo), tr.ops->name, o->batch);
	rl_verbose("activations: %.1f MiB for micro-batches of %d tokens%s",
	    rl_model_act_bytes(tr.m) / 1048576.0, tr.maxtok, o->recompute ? " (recomputed per layer)" : "");
	if ((rv = run_steps(&tr, start_step)) != 0)
		goto out;
	rl_progress_done(&tr.prog);
	if (rli_train_stop && !tr.qc && !tr.qfollow) {
		train_stop_file = rli_train_stop;
		if (tr.rank == 0)
			rl_info("stopped by a signal after step %d: --resume continues from its checkpoint", tr.m->version);
	}
	if ((rv = rli_save_final(&tr, start_step)) != 0)
		goto out;
	/* what was trained since the last full checkpoint is covered now */
	if (tr.qc && (rv = rli_feed_ack(&tr, 0, 1)) != 0)
		goto out;
	if (tr.world > 1 && ((rv = rli_dp_check_weights(&tr)) != 0 || (rv = rl_comm_finish(tr.comm)) != 0))
		goto out;
	rv = finish(&tr, start_step);
out:
	rv = rli_train_fini(&tr, rv);
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

/*
 * runfile.c — OUT/run.yaml: the effective options of a training run,
 * written beside its checkpoints, and the --resume check that the options
 * which change what the algorithm computes are the same as the run's.
 *
 * The keys are rl-train's long options and the values what rl-train takes,
 * so `rl-train --config OUT/run.yaml` starts the same run again.  Only rank
 * 0 writes it.  Left out: options that do not change the computation
 * (paths of metrics, transports, data-parallel layout), which are recorded
 * only where listed below as information.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/conf.h"
#include "base/core.h"
#include "base/io.h"
#include "model/lora.h"
#include "train/algo.h"
#include "train/trainer.h"

enum { VAL_SZ = 96 };

/* One entry: key, value as rl-train takes it ("" when not set: not written),
 * and whether a change alters the algorithm's meaning. */
typedef struct entry {
	const char *key;
	char val[VAL_SZ];
	int meaning;
} entry;

/* The shortest decimal that reads back as the same float32 (9 digits always
 * do): 0.001, not 0.00100000005, as the user wrote it. */
static void
fmt_f(char *v, float x)
{
	for (int p = 1; p <= 9; p++) {
		snprintf(v, VAL_SZ, "%.*g", p, (double)x);
		if ((float)strtod(v, NULL) == x)
			return;
	}
}

/* The entries of o in a fixed order; returns their number (at most cap). */
static int
entries(entry *e, int cap, const rl_train_opts *o)
{
	int n = 0;
#define ADD(k, m) (e[n].key = (k), e[n].meaning = (m), e[n].val[0] = 0, e[n++].val)
#define F(k, x) fmt_f(ADD(k, 1), (x))
#define I(k, x) snprintf(ADD(k, 1), VAL_SZ, "%d", (x))
#define B(k, x) snprintf(ADD(k, 1), VAL_SZ, "%s", (x) ? "true" : "false")
	snprintf(ADD("algo", 1), VAL_SZ, "%s", rl_algo_name(o->algo));
	I("batch", o->batch);
	if (o->agg >= 0)
		snprintf(ADD("loss-agg", 1), VAL_SZ, "%s", rl_agg_name(o->agg));
	if (o->norm_len > 0)
		I("norm-len", o->norm_len);
	B("no-std", !o->norm_std);
	F("clip-low", o->clip_low);
	F("clip-high", o->clip_high);
	F("dual-clip", o->dual_clip);
	F("tis-cap", o->tis_cap);
	B("old-from-behaviour", o->old_from_behaviour);
	if (o->overlong_filter)   /* absent from run files written before the option */
		B("overlong-filter", 1);
	if (o->kl_type > 0) {   /* rl-train refuses the other KL options without --kl */
		snprintf(ADD("kl", 1), VAL_SZ, "k%d", o->kl_type);
		F("kl-coef", o->kl_coef);
		B("kl-in-reward", o->kl_in_reward);
	}
	if (o->algo == RL_ALGO_DPO) {
		F("beta", o->dpo_beta);
		snprintf(ADD("dpo-loss", 1), VAL_SZ, "%s", rl_dpo_loss_name(o->dpo_loss));
		F("label-smoothing", o->label_smoothing);
		F("rpo-alpha", o->rpo_alpha);
	}
	if (o->online)   /* absent from run files written before the option */
		B("online", 1);
	F("ent-coef", o->ent_coef);
	F("gamma", o->gamma);
	F("lambda", o->lambda);
	I("ppo-epochs", o->ppo_epochs);
	I("mini-batches", o->mini_batches);
	F("vf-coef", o->vf_coef);
	F("value-clip", o->value_clip);
	F("critic-lr", o->critic_lr);
	B("no-whiten-adv", !o->whiten_adv);
	F("lr", o->lr);
	F("weight-decay", o->weight_decay);
	F("beta1", o->beta1);
	F("beta2", o->beta2);
	F("adam-eps", o->adam_eps);
	F("grad-clip", o->grad_clip);
	F("min-lr-ratio", o->min_lr_ratio);
	I("warmup", o->warmup);
	I("total-steps", o->total_steps);
	snprintf(ADD("schedule", 1), VAL_SZ, "%s", o->sched == RL_SCHED_COSINE ? "cosine" : "constant");
	if (o->lora_rank > 0) {
		char *v;
		I("lora-rank", o->lora_rank);
		F("lora-alpha", o->lora_alpha);
		F("lora-dropout", o->lora_dropout);
		v = ADD("lora-targets", 1);
		for (int k = 0; k < RL_LORA_NMOD; k++)
			if (o->lora_targets & (1u << k))
				snprintf(v + strlen(v), VAL_SZ - strlen(v), "%s%s", v[0] ? "," : "", rl_lora_module_name(k));
	}
	/* information: a change is allowed without --allow-change */
	snprintf(ADD("seed", 0), VAL_SZ, "%llu", (unsigned long long)o->seed);
	I("max-tokens-per-micro", o->max_tokens_micro);
	e[n - 1].meaning = 0;
	if (o->micro_tokens > 0) {
		/* packing changes the sums' order, not the update: as max-tokens-per-micro */
		I("micro-tokens", o->micro_tokens);
		e[n - 1].meaning = 0;
	}
	I("save-every", o->save_every);
	e[n - 1].meaning = 0;
	I("max-steps", o->max_steps);
	e[n - 1].meaning = 0;
#undef ADD
#undef F
#undef I
#undef B
	return n <= cap ? n : cap;
}

/* A path as a YAML single-quoted scalar ('' for a quote). */
static void
put_quoted(rl_buf *b, const char *key, const char *s, int *rv)
{
	if (*rv || !s)
		return;
	if ((*rv = rl_buf_printf(b, "%s: '", key)) != 0)
		return;
	for (; *s && !*rv; s++)
		*rv = *s == '\'' ? rl_buf_printf(b, "''") : rl_buf_printf(b, "%c", *s);
	if (!*rv)
		*rv = rl_buf_printf(b, "'\n");
}

int
rli_runfile_write(const rl_train_opts *o)
{
	entry e[64];
	int n = entries(e, 64, o), rv = 0;
	rl_buf b = { 0 };
	char path[4096];

	rv = rl_buf_printf(&b, "# the options of this run (rl-train); rl-train --resume checks them,\n"
	                       "# rl-train --config %s starts the same run again\n", "run.yaml");
	put_quoted(&b, "model", o->model_dir, &rv);
	put_quoted(&b, "out", o->out_dir, &rv);
	put_quoted(&b, "ref", o->ref_dir, &rv);
	put_quoted(&b, "device", o->device, &rv);
	for (int i = 0; i < n && !rv; i++)
		rv = rl_buf_printf(&b, "%s: %s\n", e[i].key, e[i].val);
	snprintf(path, sizeof path, "%s/run.yaml", o->out_dir);
	if (!rv && (rv = rl_io_write_atomic(path, b.p, b.len, 0644)) != 0)
		rl_error("cannot write '%s': %s", path, rl_strerror(rv));
	rl_buf_fini(&b);
	return rv;
}

int
rli_runfile_check(const rl_train_opts *o)
{
	entry e[64];
	int n = entries(e, 64, o), ndiff = 0, rv;
	rl_conf c = { 0 };
	char path[4096];

	snprintf(path, sizeof path, "%s/run.yaml", o->out_dir);
	if (access(path, F_OK) != 0) {
		rl_warn("'%s' is missing: the options of the run resumed cannot be checked", path);
		return RL_OK;
	}
	if ((rv = rl_conf_read(&c, path)) != 0)
		return rv;
	for (int i = 0; i < n; i++) {
		const char *was = NULL;
		if (!e[i].meaning)
			continue;
		for (size_t k = 0; k < c.n; k++)
			if (strcmp(c.e[k].key, e[i].key) == 0)
				was = c.e[k].val;
		if (was ? strcmp(was, e[i].val) == 0 : e[i].val[0] == 0)
			continue;
		ndiff++;
		if (o->allow_change)
			rl_warn("--%s changed: %s in the run, %s now (--allow-change)", e[i].key, was ? was : "not set",
			    e[i].val[0] ? e[i].val : "not set");
		else
			rl_error("--%s: %s in the run ('%s'), %s now", e[i].key, was ? was : "not set", path,
			    e[i].val[0] ? e[i].val : "not set");
	}
	/* keys of the run this build no longer writes are not checked: a run
	 * from an older rl-train still resumes */
	rl_conf_fini(&c);
	if (ndiff && !o->allow_change) {
		rl_hint("these change what the algorithm computes; resume with the run's values, or add "
		        "--allow-change to resume with the new ones");
		return RL_EINVAL;
	}
	return RL_OK;
}

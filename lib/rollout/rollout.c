/*
 * rollout.c — rl_rollout_run and rl_rollout_score: the run's set-up (model,
 * tokenizer, stop ids, output, the weights sources, --resume's checkpoint)
 * and tear-down around the loops of run.c and score.c.  Option checking
 * (what goes together, the terminal and same-file refusals) is rl-rollout's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "base/rng.h"
#include "model/lora.h"
#include "rollout/rollout_int.h"

void
rl_rollout_opts_default(rl_rollout_opts *o)
{
	memset(o, 0, sizeof(*o));
	rl_gen_opts_default(&o->go);
	o->n = 1;
	o->device = "auto";
	o->input = "-";
	o->tmpl = RL_CHAT_AUTO;
	o->max_staleness = -1;
	o->train_batch = 8;
	o->weights_timeout = 600;
	o->env_timeout = 60;
	o->broker_timeout = RL_QCLIENT_BROKER_TIMEOUT_S;
	o->max_requests = 256;
	o->max_body = (size_t)4 << 20;
	o->episode_timeout = 600;
	o->kv_reuse_mem = -1;
	o->body_timeout = 30;
	o->http_timeout = 10;
	o->agents = 8;
	o->agent_timeout = 300;
}

/* The model, its tokenizer, the stop and EOS ids.  RL_OK or an error (logged). */
static int
open_model(gen *g)
{
	rl_rollout_opts *o = &g->o;
	int rv;

	if ((rv = rl_ops_open(&g->ops, o->device)) != 0 || (rv = rl_model_open(&g->m, o->model_dir, g->ops)) != 0 ||
	    (o->adapter_dir && (rv = rl_model_apply_adapter(g->m, o->adapter_dir)) != 0) ||
	    (rv = rl_tokenizer_open(&g->tok, o->model_dir)) != 0)
		return rv;
	if (g->m->cfg.seq_cls) {
		rl_error("'%s' is a reward model (...ForSequenceClassification): it has no language-model head "
		    "to generate or score log-probs with", o->model_dir);
		rl_hint("score records with it: rl-reward --model '%s'", o->model_dir);
		return RL_EINVAL;
	}
	if (o->no_think && (o->tmpl != RL_CHAT_AUTO || !rl_tokenizer_chat_thinking(g->tok))) {
		rl_error("--no-thinking: the %s chat template has no enable_thinking switch",
		    o->tmpl != RL_CHAT_AUTO ? rl_chat_template_name(o->tmpl) : "model's");
		rl_hint("the switch is Qwen3's template's (--chat-template auto on a Qwen3 model)");
		return RL_EINVAL;
	}
	/* a --stop spelled as a special token: such tokens do not show in the text, so it
	 * never matched; it ends a sequence as that token's --stop-id would (the same tokens) */
	for (int i = 0; i < o->nstop; i++) {
		int32_t id = rl_tokenizer_lookup(g->tok, o->stops[i], strlen(o->stops[i]));
		if (id >= 0 && id < g->m->cfg.vocab_size && rl_tokenizer_is_special(g->tok, id) &&
		    o->nstop_ids < RL_ROLLOUT_MAX_STOPS) {
			o->stop_ids[o->nstop_ids++] = id;
			rl_verbose("--stop '%s' is the special token %d: it stops as --stop-id %d", o->stops[i], id, id);
		}
	}
	o->go.nstop_ids = o->nstop_ids;
	rli_eos_set(g);
	for (int i = 0; i < o->nstop_ids; i++)
		if (o->stop_ids[i] >= g->m->cfg.vocab_size) {
			/* it could never be drawn: the sequence would run on as if no --stop-id were given */
			rl_error("--stop-id %d is outside the model's vocabulary [0, %d)", (int)o->stop_ids[i],
			    g->m->cfg.vocab_size);
			rl_hint("rl-rollout tokenize -m MODEL shows the ids of a text");
			return RL_EINVAL;
		}
	return RL_OK;
}

/* The records' writer, on -o FILE or stdout. */
static int
open_output(gen *g)
{
	rl_traj_writer_opts wo = { 0 };

	if (g->o.out_path && strcmp(g->o.out_path, "-") != 0) {
		if (!(g->out = fopen(g->o.out_path, "wb"))) {
			rl_error("cannot open '%s': %s", g->o.out_path, strerror(errno));
			return RL_EIO;
		}
	} else {
		g->out = stdout;
		/* waiting for weights, it must stop when the stage after it has */
		if (!g->o.queue_url)
			rl_io_watch_stdout();
	}
	wo.format = g->o.jsonl ? RL_TRAJ_JSONL : RL_TRAJ_BINARY;
	return rl_traj_writer_open_file(&g->w, g->out, g->o.out_path ? g->o.out_path : "-", &wo);
}

/* The weights to start from: rl-sync's, the group's, --resume's checkpoint,
 * --weights-from's latest (not a killed run's leftover). */
static int
open_weights(gen *g)
{
	rl_rollout_opts *o = &g->o;
	int rv;

	if (o->sync_url) {
		snprintf(g->sync_dir, sizeof g->sync_dir, "%s/rl-rollout-sync.%ld",
		    getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
		/* sync_dir is made only when a sharded version must go through it:
		 * made here, every run that failed or was killed would leave it in
		 * TMPDIR */
		if ((rv = rl_wsync_open_with(&g->ws, o->sync_url, 0, o->sync_transport)) != 0 ||
		    (rv = rli_poll_weights(g, 1)) != 0)
			return rv;
	}
	if (o->wgo.addr) {
		/* joins the trainer's group, then starts from its weights */
		int v;
		o->wgo.timeout = o->weights_timeout > 0 ? o->weights_timeout : 1e9;
		if ((rv = rl_wgroup_open(&g->wg, &o->wgo, g->m)) != 0 ||
		    (rv = rl_wgroup_wait(g->wg, o->weights_timeout > 0 ? o->weights_timeout : 1e9, &v)) != 0 ||
		    (rv = rli_group_take(g)) != 0)
			return rv;
	}
	if (o->resume_dir) {
		/* the checkpoint's weights and version; -m gives the architecture when it is another directory */
		if (strcmp(o->model_dir, g->resume_path) != 0) {
			if ((rv = rli_load_weights(g, g->resume_path, g->resume_step)) != 0)
				return rv;
		} else {
			g->version = g->resume_step;
			rl_engine_set_version(g->e, g->resume_step);
		}
		rl_info("resuming from '%s': weights version %d, nonce 0x%08llx, %llu groups done", g->resume_path,
		    g->resume_step, (unsigned long long)(g->nonce >> 32), (unsigned long long)rl_gset_count(&g->done));
	}
	if (o->weights_from) {
		int ver;
		char path[4096];
		cJSON *st = NULL;
		/* a resuming trainer removes what is newer than its checkpoint: remember
		 * those directories now, before it can have removed them (none while a
		 * trainer runs there: a generator restarted beside it loads its newest) */
		if (rl_ckpt_run_live(o->weights_from) ||
		    rl_ckpt_find_full(o->weights_from, path, sizeof path, &g->left_after, &st, 1) != RL_OK)
			g->left_after = -1; /* a live trainer's steps are not leftovers */
		cJSON_Delete(st);
		/* without a full checkpoint no trainer can resume there (and a new run
		 * into it is refused): its steps are a live trainer's, not leftovers */
		if (g->left_after >= 0 && (rv = rl_ckpt_leftovers_scan(&g->left, o->weights_from, g->left_after)) != 0)
			return rv;
		if (rli_latest_version(o->weights_from, &ver, path, sizeof path) == RL_OK && ver > g->version &&
		    !rli_leftover(g, path) && (rv = rli_load_weights(g, path, ver)) != 0)
			return rv;
	}
	return RL_OK;
}

/* Closes what the run opened; rv is its result so far, returned or replaced
 * by the first error of closing. */
static int
finish(gen *g, int rv)
{
	int stdout_closed = 0, r2;

	if (g->w && (r2 = rl_traj_writer_close(g->w)) != 0 && !rv)
		rv = r2;
	if (g->out && g->out != stdout && fclose(g->out) != 0 && !rv) {
		rl_error("cannot write '%s': %s", g->o.out_path, strerror(errno));
		rv = RL_EIO;
	}
	if (g->wg) {
		/* the records go downstream first (the trainer ends the group only
		 * once it has them all), then the group's end is awaited */
		r2 = RL_OK;
		if (g->out == stdout) {
			g->out = NULL;
			r2 = rl_io_close_stdout() ? RL_EIO : RL_OK;
			stdout_closed = 1;
		}
		if (!rv)
			rv = r2;
		if (!rv)
			rl_verbose("waiting for the trainer to end the weights group");
		r2 = rl_wgroup_close(g->wg, rv == 0);
		if (!rv)
			rv = r2;
	}
	rli_env_close(g);
	rl_engine_destroy(g->e);
	rl_gset_fini(&g->done);
	rl_ckpt_leftovers_fini(&g->left);
	rl_wver_destroy(g->wbase);
	rl_wsync_close(g->ws);
	rl_tokenizer_close(g->tok);
	rl_model_close(g->m);
	rl_ops_close(g->ops);
	/* only when the records went there (rollout.h): a caller with its own
	 * output on stdout (rl-train's validation) keeps it */
	if (!rv && !stdout_closed && g->out == stdout && rl_io_close_stdout())
		rv = RL_EIO;
	return rv;
}

static int
rollout(const rl_rollout_opts *opts, int score)
{
	gen *g = rl_try_calloc(1, sizeof(*g), "rl-rollout state");
	int rv;

	if (!g)
		return RL_ENOMEM;
	g->o = *opts;
	g->o.go.stop = g->o.stops;
	g->o.go.nstop = g->o.nstop;
	g->o.go.stop_ids = g->o.stop_ids;
	g->o.go.nstop_ids = g->o.nstop_ids;
	if (g->o.go.slots < g->o.n + g->o.greedy)
		g->o.go.slots = g->o.n + g->o.greedy;
	g->pending_version = -1;
	g->nonce = (rl_rng_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)) & 0xffffffff00000000ULL);
	g->left_after = -1;
	if (g->o.resume_dir && (rv = rli_resume_open(g)) != 0) {
		rl_gset_fini(&g->done);
		free(g);
		return rv;
	}
	if (!g->o.model_dir && !g->o.resume_dir) {
		rl_error("no model (-m MODEL_DIR) and no checkpoint to resume in '%s'", opts->resume_dir ? opts->resume_dir : "-");
		rl_gset_fini(&g->done);
		free(g);
		return RL_EINVAL;
	}
	if (!g->o.model_dir)
		g->o.model_dir = g->resume_path;
	if ((rv = open_model(g)) != 0 || (rv = open_output(g)) != 0)
		goto out;
	if (score) {
		rv = rli_run_score(g);
		goto out;
	}
	/* an episode reserves cache for all of it at admission: a default of the whole
	 * context (32k for many models) would let few episodes run at once */
	if (g->o.env_cmd && g->o.go.max_episode <= 0)
		g->o.go.max_episode = RL_MIN(g->m->cfg.max_pos, 1024);
	if (g->o.listen)
		g->o.go.keep_mem = g->o.kv_reuse_mem < 0 ? g->o.go.kv_mem / 2 : (size_t)g->o.kv_reuse_mem;
	if ((rv = rl_engine_create(&g->e, g->m, g->tok, &g->o.go)) != 0 || (rv = open_weights(g)) != 0)
		goto out;
	if (g->o.env_cmd && (rv = rli_env_open(g)) != 0)
		goto out;
	rv = g->o.listen ? rli_serve_run(g) : g->o.queue_url ? rli_run_queue(g) : rli_run_generate(g);
out:
	rv = finish(g, rv);
	free(g);
	return rv;
}

int
rl_rollout_run(const rl_rollout_opts *o)
{
	return rollout(o, o->score_field != NULL);
}

int
rl_rollout_serve(const rl_rollout_opts *o)
{
	if (!o->listen) {
		rl_error("serve mode needs an address to listen on");
		return RL_EINVAL;
	}
	return rollout(o, 0);
}

int
rl_rollout_score(const rl_rollout_opts *o)
{
	if (!o->score_field) {
		rl_error("score mode needs the field to write (--score FIELD)");
		return RL_EINVAL;
	}
	return rollout(o, 1);
}

/*
 * run.c — rl_rollout_run's loops: pipe mode (prompt lines of a file, with
 * the staleness gate and --resume's skipping of groups done) and queue mode
 * (prompts leased from rl-queue, groups put back when complete); the
 * engine's done callback, progress and timing, the ids that end a sequence
 * as EOS, and --resume's checkpoint state.  Records are built in record.c,
 * weights polled in weights.c.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "base/rng.h"
#include "rollout/rollout_int.h"

/* Queue mode: p is no longer being generated. */
static void
qlive_remove(gen *g, const prompt *p)
{
	for (size_t i = 0; i < g->nqlive; i++) {
		if (g->qlive[i] == p) {
			g->qlive[i] = g->qlive[--g->nqlive];
			return;
		}
	}
}

/* The engine's done callback: the sample's record goes out (queue mode:
 * into its group's batch, put when the group is complete). */
int
rli_sample_done_cb(void *ctx, const rl_gen_sample *s)
{
	gen *g = ctx;
	prompt *p = g->env ? rli_env_prompt(s->user) : s->user;
	rl_traj *t = NULL;
	int rv;

	if ((rv = rl_traj_create(&t)) != 0)
		return rv;
	rv = rli_record_build(t, g, p, s);
	if (g->env) {
		/* an episode's fields; the episode is freed */
		int rv2 = rli_env_record(t, g, s->user, s);
		if (rv == RL_OK)
			rv = rv2;
	}
	if (rv != RL_OK)
		goto out;
	if (g->qc) {
		if ((rv = rl_traj_batch_add(p->out, t)) != 0)
			goto out;
	} else if ((rv = rl_traj_writer_put(g->w, t)) != 0) {
		goto out;
	}
	g->samples++;
	g->tokens += (uint64_t)s->n;
	if (--p->remaining == 0) {
		/* a complete group goes downstream at once (pipes: the trainer waits for it) */
		if (g->qc) {
			rl_qput_result res;
			double tp = rl_now();
			/* the put completes the prompt's lease; retried while the broker is busy.
			 * Episodes were scored by their environment: they go to the trainers */
			rv = g->env ? rl_qclient_put_scored(g->qc, p->out, &res) : rl_qclient_put_generated(g->qc, p->out, &res);
			g->t_put += rl_now() - tp;
			if (rv == RL_OK)
				g->q_put += res.accepted;
			else
				rl_error("cannot put the samples of group %llu: %s", (unsigned long long)p->group,
				    rl_strerror(rv));
			rl_traj_batch_destroy(p->out);
			qlive_remove(g, p);
		} else {
			double tw = rl_now();
			rv = rl_traj_writer_flush(g->w);
			g->t_write += rl_now() - tw;
		}
		rli_prompt_free(p);
	}
out:
	rl_traj_destroy(t);
	return rv;
}
static void
eos_add(gen *g, int id)
{
	if (id < 0 || id == g->o.go.eos_id || g->o.go.neos_more == (int)RL_ARRAY_LEN(g->eos_more))
		return;
	for (int i = 0; i < g->o.go.neos_more; i++)
		if (g->eos_more[i] == id)
			return;
	g->eos_more[g->o.go.neos_more++] = id;
}

/* The ids that end a sequence as EOS, as vLLM has them: config.json's
 * eos_token_id (an id or a list) and also the tokenizer's eos_token and
 * generation_config.json's eos_token_id (vLLM adds the latter to every
 * request's stop ids).  config.json's alone are not enough: Llama-3-8B-Instruct's
 * names <|end_of_text|> while the chat turn ends with <|eot_id|> (in
 * generation_config.json), and without it a sample runs on past its answer to
 * the token limit.  A generation_config.json that cannot be read is said and
 * left out. */
void
rli_eos_set(gen *g)
{
	char path[4200];
	cJSON *j = NULL;
	struct stat st;

	g->o.go.eos_id = g->m->cfg.eos_id >= 0 ? g->m->cfg.eos_id : rl_tokenizer_eos_id(g->tok);
	g->o.go.eos_more = g->eos_more;
	g->o.go.neos_more = 0;
	for (int i = 0; i < g->m->cfg.n_eos_more; i++)
		eos_add(g, g->m->cfg.eos_more[i]);
	eos_add(g, rl_tokenizer_eos_id(g->tok));
	snprintf(path, sizeof path, "%s/generation_config.json", g->o.model_dir);
	if (stat(path, &st) != 0)
		return;
	/* a FIFO would block the open for ever */
	if (!S_ISREG(st.st_mode)) {
		rl_warn("'%s' is not a regular file: its eos_token_id does not end sequences", path);
		return;
	}
	if (rl_json_load(&j, path, 0) != RL_OK) {
		rl_warn("'%s' cannot be read: its eos_token_id does not end sequences", path);
		return;
	}
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *it;
	if (cJSON_IsNumber(e))
		eos_add(g, e->valueint);
	else if (cJSON_IsArray(e))
		cJSON_ArrayForEach(it, e)
			if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < 2147483647.0)
				eos_add(g, it->valueint);
	cJSON_Delete(j);
}
/* One engine step; its time, less the puts and writes of the groups it
 * completed, is decoding time.  Its share of the slots (the sequences it
 * decoded over --slots) weighs that time for the busy/idle measure: one long
 * answer decoding alone in 8 slots is 1/8 busy, the empty slots are the idle
 * capacity a larger staleness bound would fill.  A step that decoded nothing
 * (admission or environment feeds only) counts at the slots in use. */
static int
engine_step(gen *g)
{
	const rl_engine_stats *st = rl_engine_stats_get(g->e);
	uint64_t n0 = st->occ_steps, a0 = st->occ_active;
	double t = rl_now(), io = g->t_put + g->t_write, dt, share;
	int rv = rl_engine_step(g->e, rli_sample_done_cb, g);
	int slots = RL_MAX(g->o.go.slots, 1);

	dt = rl_now() - t - (g->t_put + g->t_write - io);
	if (st->occ_steps > n0)
		share = (double)(st->occ_active - a0) / (double)(st->occ_steps - n0) / slots;
	else
		share = (double)rl_engine_active(g->e) / slots;
	share = RL_MIN(RL_MAX(share, 0.0), 1.0);
	g->t_engine += dt;
	g->t_engine_occ += dt * share;
	g->step_share = share;
	return rv;
}

static void
progress(gen *g, int end)
{
	double dt = rl_now() - g->t0;
	if (end) {
		rl_progress_done(&g->prog);
		if (!g->o.quiet)
			rl_info("%llu prompts, %llu samples, %llu tokens in %.1f s (%.0f tokens/s)%s",
			    (unsigned long long)g->groups, (unsigned long long)g->samples,
			    (unsigned long long)g->tokens, dt, dt > 0 ? g->tokens / dt : 0.0,
			    g->bad ? "; bad lines skipped" : "");
		if (g->bad && !g->o.quiet)
			rl_info("%llu bad prompt lines skipped", (unsigned long long)g->bad);
		if (g->o.resume_dir && !g->o.quiet)
			rl_info("%llu prompts not generated: their groups were done in '%s'",
			    (unsigned long long)g->skipped, g->resume_path);
		if (g->e) {
			const rl_engine_stats *st = rl_engine_stats_get(g->e);
			rl_verbose("tokens: %llu prefilled, %llu sampled, %llu inserted by environments",
			    (unsigned long long)st->prefill_tokens, (unsigned long long)st->gen_tokens,
			    (unsigned long long)st->fed_tokens);
		}
		rl_verbose("time: decoding %.2f s, new weights %.2f s (%d loaded), waiting for weights %.2f s, "
		    "leases %.2f s, puts %.2f s, output %.2f s, other %.2f s", g->t_engine, g->t_weights, g->nloads,
		    g->t_wait, g->t_lease, g->t_put, g->t_write,
		    dt - g->t_engine - g->t_weights - g->t_wait - g->t_lease - g->t_put - g->t_write);
	} else {
		rl_progress_draw(&g->prog, -1, "%llu prompts, %llu samples, %.0f tokens/s",
		    (unsigned long long)g->groups, (unsigned long long)g->samples, dt > 0 ? g->tokens / dt : 0.0);
	}
}

int
rli_run_generate(gen *g)
{
	FILE *in = NULL;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int rv, eof = 0, fail = RL_OK, have_line = 0;
	double last_prog = 0;

	if ((rv = rl_io_fopen(&in, g->o.input, "r")) != 0)
		return rv;
	if (g->o.auto_k)
		rli_autok_init(g);
	g->t0 = rl_now();
	rl_progress_init(&g->prog, g->o.quiet);
	for (;;) {
		/* keep enough requests waiting to refill every free slot */
		while (!eof && (g->env ? rl_engine_waiting(g->e) + rli_env_pending(g) :
		    rl_engine_waiting(g->e) * RL_MAX(g->o.n, 1)) < g->o.go.slots) {
			prompt *p;
			if (!have_line) {
				errno = 0;
				if ((len = getline(&line, &cap, in)) < 0) {
					if (ferror(in)) {
						rl_error("cannot read '%s': %s", g->o.input, strerror(errno));
						rv = RL_EIO;
						goto out;
					}
					eof = 1;
					break;
				}
				have_line = 1;
			}
			/* --resume: the group this line gets, when it is valid, was done */
			int done = g->o.resume_dir && rl_gset_has(&g->done, g->nonce | (g->groups & 0xffffffffULL));
			if (!done && (g->o.weights_from || g->ws || g->wg) && g->o.max_staleness >= 0) {
				/* the staleness gate: group k belongs to trainer batch k / train_batch
				 * (groups skipped by --resume count as emitted); auto: K as the
				 * rule has it now */
				if ((rv = rli_autok_poll(g)) != 0)
					goto out;
				int need = (int)(g->groups / (uint64_t)g->o.train_batch) - g->o.max_staleness;
				if (g->version < need) {
					if (rl_engine_active(g->e) > 0 || rl_engine_waiting(g->e) > 0 || rli_env_pending(g) > 0)
						break; /* generate what we have, check again next step */
					if ((rv = rl_traj_writer_flush(g->w)) != 0 || (rv = rli_wait_version(g, need)) != 0)
						goto out;
				}
			}
			have_line = 0;
			g->lines++;
			while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
				line[--len] = 0;
			if (len == 0 || strspn(line, " \t") == (size_t)len)
				continue;
			if ((rv = rli_prompt_parse_line(g, line, (size_t)len, &p)) != 0) {
				if (g->o.skip_bad && (rv == RL_EFORMAT || rv == RL_ETOOBIG)) {
					g->bad++;
					continue;
				}
				/* finish and write what is already running, then fail */
				if (rv == RL_EFORMAT || rv == RL_ETOOBIG)
					rl_hint("--skip-bad skips such lines; the prompts before it are still written");
				fail = rv;
				eof = 1;
				break;
			}
			p->group = g->nonce | (g->groups & 0xffffffffULL);
			if (done) {
				/* trained (or dropped) before: the counter moves on, nothing is generated */
				rli_prompt_free(p);
				g->groups++;
				g->skipped++;
				continue;
			}
			p->remaining = p->gsize = g->o.n + (g->o.greedy ? 1 : 0);
			if (g->env) {
				/* one episode a sample, started when an environment answers its reset */
				if ((rv = rli_env_start(g, p, line, (size_t)len)) != 0)
					goto out;
				g->groups++;
				continue;
			}
			rv = rl_engine_submit(g->e, p->ids, p->nids, g->o.n, g->o.greedy, p->max_new,
			    rl_rng_u64(g->o.seed, p->line), p);
			if (rv != RL_OK) {
				rl_error("'%s': line %llu: cannot generate for this prompt", g->o.input,
				    (unsigned long long)p->line);
				rli_prompt_free(p);
				if (g->o.skip_bad) {
					g->bad++;
					continue;
				}
				fail = rv;
				eof = 1;
				break;
			}
			g->groups++;
		}
		if ((rv = rli_poll_weights(g, 0)) != 0)
			goto out;
		/* environments: answers taken, resets sent; wait on them only when no
		 * sequence can be decoded */
		if (g->env) {
			int busy = rl_engine_runnable(g->e) > 0 ||
			    (rl_engine_waiting(g->e) > 0 && rl_engine_active(g->e) < g->o.go.slots);
			if ((rv = rli_env_poll(g, busy ? 0 : 20)) != 0)
				goto out;
		}
		if (rl_engine_active(g->e) == 0 && rl_engine_waiting(g->e) == 0 && rli_env_pending(g) == 0) {
			if (eof)
				break;
			continue;
		}
		if ((rv = engine_step(g)) != 0)
			goto out;
		if (rl_now() - last_prog > 0.5) {
			progress(g, 0);
			last_prog = rl_now();
		}
	}
	rv = rl_traj_writer_flush(g->w);
	if (rv == RL_OK)
		rv = fail;
	if (rv == RL_OK)
		rv = rli_env_finish(g);
out:
	progress(g, 1);
	if (g->o.auto_k && !g->o.quiet)
		rl_info("max-staleness auto: K %u at the end, %llu changes over %llu windows", g->ak.k,
		    (unsigned long long)g->ak.changes, (unsigned long long)g->ak.windows);
	free(line);
	if (in && in != stdin)
		fclose(in);
	return rv;
}
/* Set by rl_rollout_stop (a signal handler): queue mode leases no more */
static volatile sig_atomic_t stop_requested;

void
rl_rollout_stop(void)
{
	stop_requested = 1;
}

int
rli_stop_requested(void)
{
	return stop_requested != 0;
}

const volatile sig_atomic_t *
rli_stop_flag(void)
{
	return &stop_requested;
}


/* --env and serve --agent in queue mode: the reset's (the agent's) "line" for a leased prompt record, as the
 * prompt line looked in pipe mode: its meta's fields and "prompt" (its text).
 * rl-queue put keeps a line's other fields as meta, so an environment reads
 * them where it would read them from the file. */
int
rli_queue_line(const rl_traj *t, char **out)
{
	const char *metas = NULL, *ptext = NULL;
	cJSON *j = NULL;

	*out = NULL;
	if (rl_traj_get_str(t, RL_TAG_META, &metas, NULL) == RL_OK)
		j = cJSON_Parse(metas);
	if (!j || !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		if (!(j = cJSON_CreateObject()))
			return RL_ENOMEM;
	}
	if (rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &ptext, NULL) == RL_OK) {
		cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
		if (!cJSON_AddStringToObject(j, "prompt", ptext)) {
			cJSON_Delete(j);
			return RL_ENOMEM;
		}
	}
	*out = rl_json_print(j);
	cJSON_Delete(j);
	return *out ? RL_OK : RL_ENOMEM;
}

/* Submits a leased prompt: a group to the engine, or with --env one episode
 * a sample, started when an environment answers its reset.  Not RL_OK: the
 * prompt cannot be generated for (RL_ENOMEM: nothing can). */
static int
queue_submit(gen *g, const rl_traj *t, prompt *p)
{
	char *line = NULL;
	int rv;

	if (!g->env)
		return rl_engine_submit(g->e, p->ids, p->nids, g->o.n, g->o.greedy, p->max_new,
		    rl_rng_u64(g->o.seed, p->group), p);
	if ((rv = rli_queue_line(t, &line)) == RL_OK)
		rv = rli_env_start(g, p, line, strlen(line));
	free(line);
	return rv;
}

/* The done callback of a cancelled group: its samples are thrown away. */
static int
aborted_done_cb(void *ctx, const rl_gen_sample *s)
{
	prompt *p = s->user;

	(void)ctx;
	if (--p->remaining == 0) {
		rl_traj_batch_destroy(p->out);
		rli_prompt_free(p);
	}
	return RL_OK;
}

static int
queue_cancel(gen *g, prompt *p)
{
	int rv;

	qlive_remove(g, p);
	g->q_aborted++;
	rl_verbose("prompt %llu: aborted by the broker's early stop", (unsigned long long)p->qid);
	if (g->env)
		return rli_env_cancel(g, p);
	if ((rv = rl_engine_cancel(g->e, p, aborted_done_cb, g)) == 1) {
		/* still queued: no sample of it ran */
		rl_traj_batch_destroy(p->out);
		rli_prompt_free(p);
		rv = RL_OK;
	}
	return rv;
}

/* The broker's early stop aborted prompts (its count moved): asks, lease by
 * lease, which of the prompts generated here it still holds (EXTEND with
 * their ids: those it lost come back late) and cancels the others.  Their
 * work is lost; the broker re-queued or dropped them.  A broker that does not
 * answer changes nothing: a put of an aborted group is harmless (it
 * completes a re-queued prompt not leased again, or is refused). */
static int
queue_check_aborts(gen *g)
{
	uint64_t *ids = g->nqlive ? rl_try_malloc(g->nqlive * sizeof *ids, "prompt ids") : NULL;
	uint64_t *lids = g->nqlive ? rl_try_malloc(g->nqlive * sizeof *lids, "lease ids") : NULL;
	size_t nl = 0;
	int rv = RL_OK;

	if (ids == NULL || lids == NULL) {
		free(ids);
		free(lids);
		return g->nqlive ? RL_ENOMEM : RL_OK;
	}
	for (size_t i = 0; i < g->nqlive; i++) {
		size_t k = 0;
		while (k < nl && lids[k] != g->qlive[i]->qlease)
			k++;
		if (k == nl)
			lids[nl++] = g->qlive[i]->qlease;
	}
	for (size_t k = 0; k < nl && rv == RL_OK; k++) {
		rl_qack_result res;
		uint32_t n = 0;
		int arv;
		for (size_t i = 0; i < g->nqlive; i++)
			if (g->qlive[i]->qlease == lids[k])
				ids[n++] = g->qlive[i]->qid;
		arv = rl_qclient_ack_ids(g->qc, lids[k], RL_QACK_EXTEND, ids, n, &res);
		if (arv != RL_OK && arv != RL_ENOENT)
			continue;
		if (arv == RL_OK && res.late == 0)
			continue;
		/* some or all lost: one id at a time when only some */
		for (size_t i = g->nqlive; i-- > 0 && rv == RL_OK;) {
			prompt *p = g->qlive[i];
			if (p->qlease != lids[k])
				continue;
			if (arv == RL_OK && res.late < n &&
			    (rl_qclient_ack_ids(g->qc, lids[k], RL_QACK_EXTEND, &p->qid, 1, &res) != RL_OK || res.late == 0))
				continue;
			rv = queue_cancel(g, p);
		}
	}
	free(ids);
	free(lids);
	return rv;
}

/* The prompts in generation, for the broker's aborts to find them. */
static int
qlive_add(gen *g, prompt *p)
{
	if (g->nqlive == g->capqlive) {
		size_t nc = g->capqlive ? 2 * g->capqlive : 64;
		prompt **np = realloc(g->qlive, nc * sizeof *np);
		if (np == NULL)
			return RL_ENOMEM;
		g->qlive = np;
		g->capqlive = nc;
	}
	g->qlive[g->nqlive++] = p;
	return RL_OK;
}

/* The trainer moved on: the broker's gate counts these prompts as
 * generated by its version, so they start on it.  A trainer that writes its
 * versions in the background (rl-train(1)) tells the broker when the update
 * is done, while the files are still being written: until the version is
 * there, new sequences are held (rli_poll_weights), never started on an
 * older one. */
static int
want_leased_version(gen *g, const rl_qlease *lease)
{
	if (rl_qlease_count(lease) == 0)
		return RL_OK;
	if ((int)lease->version < g->want_version)
		g->want_version = 0; /* the broker went back (a resumed trainer) */
	if ((int)lease->version <= g->version || !(g->ws || g->o.weights_from || g->wg))
		return RL_OK;
	if ((int)lease->version > g->want_version) {
		g->want_version = (int)lease->version;
		g->want_since = rl_now();
	}
	return rli_poll_weights(g, 1);
}

int
rli_run_queue(gen *g)
{
	rl_qlease lease;
	rl_qclient_opts qo;
	rl_traj *t = NULL;
	int rv = RL_OK, G = g->o.n + (g->o.greedy ? 1 : 0);
	double idle_since = rl_now(), last_prog = 0, empty_since = 0;

	rl_qlease_init(&lease);
	rl_qclient_opts_stage(&qo, g->o.broker_timeout);
	if ((rv = rl_qclient_open(&g->qc, g->o.queue_url, &qo)) == 0)
		rl_qclient_set_stop(g->qc, &stop_requested);
	if (rv != 0)
		return rv;
	if ((rv = rl_traj_create(&t)) != 0)
		goto out;
	if (rl_wstat_open(&g->wst, g->o.queue_url, "rollout", strcmp(g->ops->name, "cpu") == 0 ? "cpu" : g->o.device) != 0)
		rl_warn("no stats reports to the broker");
	g->t0 = rl_now();
	rl_progress_init(&g->prog, g->o.quiet);
	for (;;) {
		/* --env: an episode is one sequence, and those at their environments count */
		int room = g->env ? g->o.go.slots - rl_engine_active(g->e) - rl_engine_waiting(g->e) - rli_env_pending(g) :
		    g->o.go.slots - rl_engine_active(g->e) - rl_engine_waiting(g->e) * G;
		uint64_t s0 = g->samples, k0 = g->tokens;
		int busy = rl_engine_active(g->e) > 0 || rli_env_pending(g) > 0;
		/* new weights are fetched and loaded while nothing is generated: idle */
		rl_wstat_phase(g->wst, RL_WSTAT_IDLE);
		if ((rv = rli_poll_weights(g, 0)) != 0)
			goto out;
		/* while decoding, a lease that found nothing is not retried for 10 ms
		 * (a round trip per decoding step would cost as much as the step) */
		if (!stop_requested && room >= G && (!busy || rl_now() - empty_since >= 0.01)) {
			double tl = rl_now();
			rv = rl_qclient_lease_prompts(g->qc, (uint32_t)(room / G), (uint32_t)G, busy ? 0 : 200, &lease);
			g->t_lease += rl_now() - tl;
			/* no reply for --broker-timeout: the broker is gone (logged); what
			 * is being generated is not put, its prompts' leases expire there */
			if (rv != RL_OK && (rv != RL_ETIMEDOUT || rl_qclient_gone(g->qc)) && rv != RL_EBUSY)
				goto out;
			rv = RL_OK;
			empty_since = rl_qlease_count(&lease) ? 0 : rl_now();
			if ((rv = want_leased_version(g, &lease)) != 0)
				goto out;
			/* the broker closed a step early: stop what it took back */
			if (lease.aborts != g->q_aborts) {
				g->q_aborts = lease.aborts;
				if ((rv = queue_check_aborts(g)) != 0)
					goto out;
			}
			for (size_t i = 0; i < rl_qlease_count(&lease); i++) {
				prompt *p;
				rl_qack_result ares;
				if ((rv = rl_traj_batch_get(lease.batch, i, t)) != 0)
					goto out;
				int prv = rli_prompt_from_record(g, t, &p);
				if (prv == RL_ENOTSUP) {
					rv = prv; /* no chat prompt can be used (a foreign template): not one to drop */
					goto out;
				}
				if (prv != RL_OK) {
					/* an unusable prompt is given up (acknowledged), not retried forever */
					uint64_t id = 0;
					rl_traj_get_u64(t, RL_TAG_ID, &id);
					rl_qclient_ack_ids(g->qc, lease.id, RL_QACK_DONE, &id, 1, &ares);
					g->q_bad++;
					continue;
				}
				p->remaining = p->gsize = G;
				p->qlease = lease.id;
				rl_traj_get_u64(t, RL_TAG_ID, &p->qid);
				rl_traj_batch_create(&p->out);
				if ((prv = queue_submit(g, t, p)) == RL_ENOMEM) {
					/* episodes queued before it hold p: the run ends, they are dropped with it */
					if (!g->env) {
						rl_traj_batch_destroy(p->out);
						rli_prompt_free(p);
					}
					rv = prv;
					goto out;
				}
				if (prv != RL_OK) {
					uint64_t id = 0;
					rl_traj_get_u64(t, RL_TAG_ID, &id);
					rl_qclient_ack_ids(g->qc, lease.id, RL_QACK_DONE, &id, 1, &ares);
					rl_traj_batch_destroy(p->out);
					rli_prompt_free(p);
					g->q_bad++;
					continue;
				}
				g->groups++;
				if ((rv = qlive_add(g, p)) != 0)
					goto out;
			}
		}
		if (g->env) {
			int run = rl_engine_runnable(g->e) > 0 ||
			    (rl_engine_waiting(g->e) > 0 && rl_engine_active(g->e) < g->o.go.slots);
			if ((rv = rli_env_poll(g, run ? 0 : 20)) != 0)
				goto out;
		}
		if (rl_engine_active(g->e) == 0 && rl_engine_waiting(g->e) == 0 && rli_env_pending(g) == 0) {
			if (stop_requested)
				break;
			if (g->o.idle_exit > 0 && rl_now() - idle_since > g->o.idle_exit)
				break;
			continue;
		}
		idle_since = rl_now();
		rl_wstat_phase(g->wst, RL_WSTAT_BUSY);
		if ((rv = engine_step(g)) != 0)
			goto out;
		/* the step was busy on the share of the slots it decoded */
		rl_wstat_phase_part(g->wst, RL_WSTAT_IDLE, g->step_share);
		rl_wstat_add(g->wst, g->samples - s0, g->tokens - k0);
		if (rl_now() - last_prog > 0.5) {
			progress(g, 0);
			last_prog = rl_now();
		}
	}
out:
	progress(g, 1);
	if (g->q_bad)
		rl_warn("%llu leased prompts could not be used (acknowledged and dropped)",
		    (unsigned long long)g->q_bad);
	if (g->q_aborted && !g->o.quiet) {
		uint64_t nc, nk;
		rli_env_counts(g, &nc, &nk);
		if (g->env)
			rl_info("%llu prompts aborted by the broker's early stop (not put): %llu episodes cancelled, "
			    "%llu environment processes stopped in a request", (unsigned long long)g->q_aborted,
			    (unsigned long long)nc, (unsigned long long)nk);
		else
			rl_info("%llu prompts aborted by the broker's early stop (not put)", (unsigned long long)g->q_aborted);
	}
	free(g->qlive);
	g->qlive = NULL;
	g->nqlive = g->capqlive = 0;
	rl_traj_destroy(t);
	rl_qlease_fini(&lease);
	rl_wstat_close(g->wst);
	g->wst = NULL;
	rl_qclient_close(g->qc);
	g->qc = NULL;
	return rv;
}

/* Whether dir holds a step directory: absent or empty, there is no run yet. */
static int
has_steps(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return errno != ENOENT; /* unreadable: rl_ckpt_find_full names the error */
	while (!n && (e = readdir(d)) != NULL)
		n = rl_ckpt_step_num(e->d_name) >= 0;
	closedir(d);
	return n;
}

/* --resume DIR: the checkpoint rl-train --resume takes, its groups done, and
 * the nonce they were generated under (kept, so that the counter gives every
 * prompt the group it had).  RL_OK, or an error (logged). */
int
rli_resume_open(gen *g)
{
	cJSON *state = NULL, *gd;
	char where[4200];
	uint64_t nonce = 0;
	int rv, have = 0;

	if (!has_steps(g->o.resume_dir)) {
		/* the same command line starts a run and continues it (rl-train resumes by default) */
		rl_info("nothing to resume in '%s' (no step directory): generating from the first prompt", g->o.resume_dir);
		g->o.resume_dir = NULL;
		return RL_OK;
	}
	if ((rv = rl_ckpt_find_full(g->o.resume_dir, g->resume_path, sizeof g->resume_path, &g->resume_step, &state,
	    0)) != 0) {
		rl_hint("--resume takes rl-train's --out directory of the run to continue");
		return rv;
	}
	snprintf(where, sizeof where, "'%s/trainer_state.json': groups_done", g->resume_path);
	if (!(gd = cJSON_GetObjectItem(state, "groups_done"))) {
		rl_error("%s: missing (written by an older rl-train): the groups trained cannot be told", where);
		rl_hint("continue that run on a file of the records (rl-train --resume skips them by position)");
		rv = RL_EFORMAT;
		goto out;
	}
	if ((rv = rl_gset_from_json(&g->done, gd, where)) != 0)
		goto out;
	for (size_t i = 0; i < g->done.n; i++) {
		uint64_t lo = g->done.r[i][0] >> 32, hi = g->done.r[i][1] >> 32;
		if (!have) {
			nonce = lo;
			have = 1;
		}
		if (lo != nonce || hi != nonce) {
			rl_error("%s: groups of several rl-rollout runs (nonces 0x%08llx and 0x%08llx): which "
			    "prompts were trained cannot be told from one prompt file", where, (unsigned long long)nonce,
			    (unsigned long long)(lo != nonce ? lo : hi));
			rl_hint("rl-rollout --resume continues a run whose groups all came from one rl-rollout "
			    "(itself started with --resume after a stop); generate anew into a new --out instead");
			rv = RL_EINVAL;
			goto out;
		}
	}
	if (have)
		g->nonce = nonce << 32;
out:
	cJSON_Delete(state);
	return rv;
}
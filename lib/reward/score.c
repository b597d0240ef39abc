/*
 * score.c — the scorer: each record's reward from the tasks, the --exec pool and the judge
 * (meta.scores, meta.reward_error, ts_scored), a stream scored in rounds, the
 * queue loop (lease generated records, score, put them back as scored), and the
 * summary.
 *
 * Leaves out: the verifiers (reward.c, math.c, countdown.c, tasks.c), the
 * coprocess protocol (reward_exec.c), the stream format (traj.h).
 */
#include "reward/reward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "queue/qclient.h"
#include "queue/wstat.h"

/* ---- scoring records --------------------------------------------------------------- */

/* The components in order: the tasks, then --exec, then --judge. */
static size_t
ncomp(const rl_reward_scorer *s)
{
	return s->ntasks + (s->exec != NULL) + (s->judge != NULL);
}

static const char *
comp_name(const rl_reward_scorer *s, size_t i)
{
	if (i < s->ntasks)
		return s->tasks[i].name;
	return s->exec && i == s->ntasks ? "exec" : "judge";
}

static void
add_reason(char *err, size_t cap, const char *name, const char *why)
{
	size_t k = strlen(err);

	if (k + 3 >= cap)
		return;
	snprintf(err + k, cap - k, "%s%s: %s", k ? "; " : "", name, why);
}

double
rl_reward_overlong(long len, long max_len, long buffer, double factor)
{
	double exceed = (double)len - (double)(max_len - buffer);
	double p = -exceed / (double)buffer * factor;

	return p < 0 ? p : 0.0;
}

/* The overlong penalty of t into *pen, or a reason why there is none. */
static const char *
overlong_of(const rl_reward_scorer *s, const rl_traj *t, long ntokens, double *pen)
{
	long max_len = s->opts.max_resp_len;
	int32_t mt;

	if (ntokens < 0)
		return "record has no response tokens";
	if (max_len <= 0) {
		if (rl_traj_get_i32(t, RL_TAG_MAX_TOKENS, &mt) != 0 || mt <= 0)
			return "record has no max_tokens (give --max-response-len N)";
		max_len = mt;
	}
	if (max_len < s->opts.overlong_buffer)
		return "the response budget is shorter than --overlong-buffer";
	*pen = rl_reward_overlong(ntokens, max_len, s->opts.overlong_buffer, s->opts.overlong_penalty);
	return NULL;
}

/* Sets obj[name] = v (v owned by obj after, freed on failure). */
static int
put_item(cJSON *obj, const char *name, cJSON *v)
{
	if (!obj || !v) {
		cJSON_Delete(v);
		return RL_ENOMEM;
	}
	if (cJSON_GetObjectItemCaseSensitive(obj, name))
		cJSON_ReplaceItemInObjectCaseSensitive(obj, name, v);
	else
		cJSON_AddItemToObject(obj, name, v);
	return RL_OK;
}

/* The record's meta with meta.scores.NAME for each component (null when it
 * failed), meta.scores.overlong when pen is given, and meta.reward_error
 * when err is. */
static int
write_scores(rl_reward_scorer *s, rl_traj *t, cJSON *meta, const double *sc, const int *ok, const double *pen,
    const char *err)
{
	cJSON *scores = cJSON_GetObjectItemCaseSensitive(meta, "scores");
	char *text;
	int rv;

	if (!cJSON_IsObject(scores)) {
		cJSON_DeleteItemFromObjectCaseSensitive(meta, "scores");
		scores = cJSON_AddObjectToObject(meta, "scores");
	}
	for (size_t i = 0; i < ncomp(s); i++) {
		if ((rv = put_item(scores, comp_name(s, i), ok[i] ? cJSON_CreateNumber(sc[i]) : cJSON_CreateNull())) != 0)
			return rv;
	}
	if (pen && (rv = put_item(scores, "overlong", cJSON_CreateNumber(*pen))) != 0)
		return rv;
	cJSON_DeleteItemFromObjectCaseSensitive(meta, "reward_error");
	if (err && !cJSON_AddStringToObject(meta, "reward_error", err))
		return RL_ENOMEM;
	if (!(text = rl_json_print(meta)))
		return RL_ENOMEM;
	/* cJSON printed it: compact, valid JSON, no need to parse it again */
	rv = rl_traj_set(t, RL_TAG_META, RL_TRAJ_JSON, text, strlen(text));
	free(text);
	return rv;
}

/* Component i, an --exec or --judge result r of weight w, into the record's
 * sums; counts[status] counts it. */
static void
ext_component(const char *name, const rl_reward_exec_result *r, double w, double *sc, int *ok, double *total,
    char *err, size_t errcap, int *failed, size_t *counts)
{
	if (r->status == RL_EXEC_OK) {
		*sc = r->reward;
		*ok = 1;
		*total += w * r->reward;
	} else {
		char why[256];
		snprintf(why, sizeof why, "%s: %s", rl_reward_exec_status_name(r->status), r->reason);
		add_reason(err, errcap, name, why);
		*failed = 1;
	}
	counts[r->status]++;
}

/* Scores one record; er and jr are its --exec and --judge results or NULL. */
static int
score_one(rl_reward_scorer *s, rl_traj *t, const rl_reward_exec_result *er, const rl_reward_exec_result *jr)
{
	const char *resp = NULL, *mtext = NULL, *why;
	size_t rn = 0, mn = 0, ntok = 0, nc = s->ntasks;
	const int32_t *tok;
	long ntokens = -1;
	cJSON *meta = NULL;
	char err[1024] = "";
	double total = 0, sc[RL_REWARD_MAX_TASKS + 2], pen = 0;
	int ok[RL_REWARD_MAX_TASKS + 2] = { 0 }, failed = 0, bad_truth = 0, rv = 0, has_pen = 0;

	if (rl_traj_get_str(t, RL_TAG_RESPONSE_TEXT, &resp, &rn) != 0)
		resp = NULL;
	if (rl_traj_get_i32s(t, RL_TAG_RESPONSE, &tok, &ntok) == 0)
		ntokens = (long)ntok;
	if (rl_traj_get_str(t, RL_TAG_META, &mtext, &mn) == 0) {
		meta = cJSON_ParseWithLength(mtext, mn);
		if (!cJSON_IsObject(meta)) {
			/* leave such a meta alone: there is nowhere to put scores */
			cJSON_Delete(meta);
			meta = NULL;
		}
	} else {
		mtext = NULL;
		if (!(meta = cJSON_CreateObject()))
			return RL_ENOMEM;
	}

	for (size_t i = 0; i < nc; i++) {
		why = NULL;
		if (!meta) {
			why = "meta is not a JSON object";
		} else if (!resp) {
			why = "record has no response_text";
		} else {
			rv = rl_reward_task_score(&sc[i], &why, &s->tasks[i], &s->opts, resp, rn, meta, ntokens);
			if (rv == RL_ENOMEM)
				goto out;
			if (rv == 0)
				why = NULL;
			rv = 0;
		}
		if (why) {
			add_reason(err, sizeof err, s->tasks[i].name, why);
			failed = 1;
			bad_truth = 1;
		} else {
			ok[i] = 1;
			total += s->tasks[i].weight * sc[i];
		}
	}
	if (s->exec) {
		ext_component("exec", er, s->exec_weight, &sc[nc], &ok[nc], &total, err, sizeof err, &failed,
		    s->st.exec_failed);
		nc++;
	}
	if (s->judge)
		ext_component("judge", jr, s->judge_weight, &sc[nc], &ok[nc], &total, err, sizeof err, &failed,
		    s->st.judge_failed);
	if (s->opts.overlong_buffer > 0) {
		if ((why = overlong_of(s, t, ntokens, &pen)) != NULL) {
			add_reason(err, sizeof err, "overlong", why);
			failed = 1;
			s->st.overlong_failed++;
		} else {
			has_pen = 1;
			total += pen;
			s->st.overlong_n += pen < 0;
			s->st.overlong_sum += pen;
		}
	}
	if (!failed && !isfinite((float)total)) {
		/* the record's reward is an f32: 1e300 from a worker, or a weight of 1e39,
		 * would become inf */
		char r[96];
		snprintf(r, sizeof r, "weighted sum %g is outside the f32 range", total);
		add_reason(err, sizeof err, "reward", r);
		failed = 1;
		s->st.out_of_range++;
	}

	/* meta.scores.NAME, meta.reward_error */
	if (meta && (rv = write_scores(s, t, meta, sc, ok, has_pen ? &pen : NULL, failed ? err : NULL)) != 0)
		goto out;
	if ((rv = rl_traj_set_f32(t, RL_TAG_REWARD, failed ? NAN : (float)total)) != 0 ||
	    (rv = rl_traj_set_f64(t, RL_TAG_TS_SCORED, rl_wall())) != 0)
		goto out;

	s->st.records++;
	if (failed) {
		s->st.failed++;
		s->st.no_truth += bad_truth;
		if (rl_log_level() >= RL_LOG_VERBOSE) {
			uint64_t id = 0;
			rl_traj_get_u64(t, RL_TAG_ID, &id);
			rl_verbose("record %llu: %s", (unsigned long long)id, err);
		}
	} else {
		s->st.reward_sum += total;
	}
	for (size_t i = 0; i < ncomp(s); i++) {
		if (ok[i]) {
			s->st.comp_sum[i] += sc[i];
			s->st.comp_n[i]++;
		}
	}
out:
	cJSON_Delete(meta);
	return rv;
}

int
rl_reward_score_records(rl_reward_scorer *s, rl_traj *const *recs, size_t n)
{
	rl_reward_exec_result *res = NULL, *jres = NULL;
	const char **lines = NULL;
	size_t *lens = NULL, *off = NULL;
	rl_buf buf;
	int rv = 0;

	rl_buf_init(&buf);
	if (s->ntasks > RL_REWARD_MAX_TASKS) {
		rl_error("at most %d tasks", RL_REWARD_MAX_TASKS);
		return RL_EINVAL;
	}
	if (s->exec && n > 0) {
		res = rl_try_calloc(n, sizeof *res, "exec results");
		lines = rl_try_calloc(n, sizeof *lines, "exec lines");
		lens = rl_try_calloc(n, sizeof *lens, "exec lines");
		off = rl_try_calloc(n + 1, sizeof *off, "exec lines");
		if (!res || !lines || !lens || !off) {
			rv = RL_ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			off[i] = buf.len;
			if ((rv = rl_traj_to_json(&buf, recs[i])) != 0)
				goto out;
		}
		off[n] = buf.len;
		for (size_t i = 0; i < n; i++) {
			lines[i] = (const char *)buf.p + off[i];
			lens[i] = off[i + 1] - off[i];
		}
		if ((rv = rl_reward_exec_run(s->exec, res, lines, lens, n)) != 0)
			goto out;
	}
	if (s->judge && n > 0) {
		if (!(jres = rl_try_calloc(n, sizeof *jres, "judge results"))) {
			rv = RL_ENOMEM;
			goto out;
		}
		if ((rv = rl_reward_judge_run(s->judge, jres, recs, n)) != 0)
			goto out;
	}
	for (size_t i = 0; i < n; i++)
		if ((rv = score_one(s, recs[i], res ? &res[i] : NULL, jres ? &jres[i] : NULL)) != 0)
			goto out;
out:
	rl_buf_fini(&buf);
	free(res);
	free(jres);
	free(lines);
	free(lens);
	free(off);
	return rv;
}

int
rl_reward_stream(rl_reward_scorer *s, rl_traj_reader *r, rl_traj_writer *w, size_t batch)
{
	rl_traj **pend = NULL;
	size_t np = 0;
	int rv = 0, rerr = 0;

	if (batch < 1)
		batch = 1;
	pend = rl_try_calloc(batch, sizeof *pend, "record batch");
	if (!pend)
		return RL_ENOMEM;
	for (;;) {
		rl_traj *t = NULL;
		if (rl_traj_reader_drained(r)) {
			/* about to wait on the input: what is pending goes downstream first
			 * (in a pipe the next stage may be waiting for exactly these) */
			if (np > 0) {
				if ((rv = rl_reward_score_records(s, pend, np)) != 0)
					goto out;
				for (size_t i = 0; i < np; i++) {
					if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
						goto out;
					rl_traj_destroy(pend[i]);
					pend[i] = NULL;
				}
				np = 0;
			}
			if ((rv = rl_traj_writer_flush(w)) != 0)
				goto out;
		}
		if ((rerr = rl_traj_reader_next(r, &t)) != 0 || !t)
			break;
		if (batch == 1) {
			/* no copy: the reader's record is scored and written in place */
			if ((rv = rl_reward_score_records(s, &t, 1)) != 0 || (rv = rl_traj_writer_put(w, t)) != 0)
				goto out;
			continue;
		}
		if ((rv = rl_traj_dup(&pend[np], t)) != 0)
			goto out;
		np++;
		if (np == batch) {
			if ((rv = rl_reward_score_records(s, pend, np)) != 0)
				goto out;
			for (size_t i = 0; i < np; i++) {
				if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
					goto out;
			}
			for (size_t i = 0; i < np; i++) {
				rl_traj_destroy(pend[i]);
				pend[i] = NULL;
			}
			np = 0;
		}
	}
	/* what was read before the end or an error is still scored and written */
	if (np > 0) {
		if ((rv = rl_reward_score_records(s, pend, np)) != 0)
			goto out;
		for (size_t i = 0; i < np; i++)
			if ((rv = rl_traj_writer_put(w, pend[i])) != 0)
				goto out;
	}
out:
	for (size_t i = 0; i < np; i++)
		rl_traj_destroy(pend[i]);
	free(pend);
	return rv ? rv : rerr;
}

int
rl_reward_queue(rl_reward_scorer *s, rl_qclient *c, const rl_reward_queue_opts *o, volatile sig_atomic_t *stop)
{
	uint32_t batch = o && o->batch ? o->batch : 256, wait_ms = o && o->wait_ms ? o->wait_ms : 500;
	double idle_exit = o ? o->idle_exit_s : 0, last = rl_now();
	rl_wstat *ws = o ? o->stats : NULL;
	rl_traj **recs = NULL;
	rl_traj_batch *out = NULL;
	rl_qlease l;
	rl_qput_result pr;
	int rv = 0;

	rl_qlease_init(&l);
	recs = rl_try_calloc(batch, sizeof *recs, "record batch");
	if (!recs || (rv = rl_traj_batch_create(&out)) != 0) {
		rv = rv ? rv : RL_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < batch; i++)
		if ((rv = rl_traj_create(&recs[i])) != 0)
			goto out;
	while (!*stop) {
		size_t n;
		rl_wstat_phase(ws, RL_WSTAT_IDLE);
		if ((rv = rl_qclient_lease_generated(c, batch, wait_ms, &l)) != 0) {
			if (*stop && !rl_qclient_gone(c))
				rv = 0;   /* signalled while the request went unanswered: a stop */
			goto out;
		}
		n = rl_qlease_count(&l);
		if (n > 0)
			rl_wstat_phase(ws, RL_WSTAT_BUSY);
		if (l.id == 0 || n == 0) {
			if (idle_exit > 0 && rl_now() - last >= idle_exit)
				break;
			continue;
		}
		/* the records borrow from the lease's batch; setters copy what changes */
		for (size_t i = 0; i < n; i++)
			if ((rv = rl_traj_batch_get(l.batch, i, recs[i])) != 0)
				goto out;
		uint64_t deadline = l.deadline_ms, now_ms = (uint64_t)(rl_wall() * 1000.0);
		uint64_t span = deadline > now_ms ? deadline - now_ms : 0;
		size_t chunk = o && o->chunk ? o->chunk : n;
		for (size_t i = 0; i < n; i += chunk) {
			if ((rv = rl_reward_score_records(s, recs + i, RL_MIN(chunk, n - i))) != 0)
				goto out;
			now_ms = (uint64_t)(rl_wall() * 1000.0);
			if (i + chunk < n && deadline && deadline - RL_MIN(deadline, now_ms) < span / 2) {
				rl_qack_result ar = { 0 };
				if (rl_qclient_extend(c, &l, &ar) == 0 && ar.deadline_ms > now_ms) {
					deadline = ar.deadline_ms;
					span = deadline - now_ms;
					rl_verbose("queue: lease %llu extended", (unsigned long long)l.id);
				} else {
					rl_warn("queue: could not extend lease %llu; its records may be scored twice",
						(unsigned long long)l.id);
				}
			}
		}
		rl_traj_batch_clear(out);
		for (size_t i = 0; i < n; i++)
			if ((rv = rl_traj_batch_add(out, recs[i])) != 0)
				goto out;
		if ((rv = rl_qclient_put_scored(c, out, &pr)) != 0) {
			rl_error("queue: could not put %zu scored records: %s", n, rl_strerror(rv));
			goto out;
		}
		rl_wstat_add(ws, n, 0);
		rl_verbose("queue: lease %llu: %zu records scored", (unsigned long long)l.id, n);
		last = rl_now();
	}
out:
	if (recs)
		for (uint32_t i = 0; i < batch; i++)
			rl_traj_destroy(recs[i]);
	free(recs);
	rl_traj_batch_destroy(out);
	rl_qlease_fini(&l);
	return rv;
}

void
rl_reward_stats_print(const rl_reward_scorer *s, double seconds)
{
	const rl_reward_stats *st = &s->st;
	size_t good = st->records - st->failed;
	char line[2048];
	size_t k = 0;

	rl_info("%zu records in %.2f s (%.0f/s), %zu failed", st->records, seconds,
		seconds > 0 ? (double)st->records / seconds : 0.0, st->failed);
	if (st->failed) {
		k = 0;
		line[0] = 0;
		if (st->no_truth)
			k += (size_t)snprintf(line + k, sizeof line - k, " %zu without usable ground truth, response_text or meta,", st->no_truth);
		if (st->out_of_range && k < sizeof line)
			k += (size_t)snprintf(line + k, sizeof line - k, " %zu with a weighted sum outside the f32 range,",
					      st->out_of_range);
		if (st->overlong_failed && k < sizeof line)
			k += (size_t)snprintf(line + k, sizeof line - k, " %zu without a length budget for the overlong penalty,",
					      st->overlong_failed);
		for (int e = 1; e < RL_EXEC_STATUS_COUNT; e++) {
			if (st->exec_failed[e] && k < sizeof line)
				k += (size_t)snprintf(line + k, sizeof line - k, " %zu %s,", st->exec_failed[e],
						      rl_reward_exec_status_name(e));
			if (st->judge_failed[e] && k < sizeof line)
				k += (size_t)snprintf(line + k, sizeof line - k, " %zu judge %s,", st->judge_failed[e],
						      rl_reward_exec_status_name(e));
		}
		if (k > 0 && k < sizeof line)
			line[k - 1] = 0;
		rl_info("failures:%s", line);
	}
	if (good)
		rl_info("reward mean %.4f over %zu records", st->reward_sum / (double)good, good);
	else
		rl_info("reward mean n/a (no record scored cleanly)");
	k = 0;
	line[0] = 0;
	for (size_t i = 0; i < ncomp(s) && k < sizeof line; i++) {
		const char *name = comp_name(s, i);
		if (st->comp_n[i])
			k += (size_t)snprintf(line + k, sizeof line - k, "%s%s %.4f (%zu)", k ? ", " : "", name,
					      st->comp_sum[i] / (double)st->comp_n[i], st->comp_n[i]);
		else
			k += (size_t)snprintf(line + k, sizeof line - k, "%s%s n/a", k ? ", " : "", name);
	}
	rl_info("mean per component: %s", line);
	if (s->opts.overlong_buffer > 0)
		rl_info("overlong penalty on %zu records, mean %.4f over them", st->overlong_n,
			st->overlong_n ? st->overlong_sum / (double)st->overlong_n : 0.0);
	if (s->exec)
		rl_info("exec: %zu timeouts, %zu crashes, %zu junk replies, %zu worker restarts",
			st->exec_failed[RL_EXEC_TIMEOUT], st->exec_failed[RL_EXEC_CRASH], st->exec_failed[RL_EXEC_JUNK],
			rl_reward_exec_restarts(s->exec));
	if (s->judge)
		rl_info("judge (%s): %zu timeouts, %zu HTTP or connection errors, %zu replies without a verdict",
			rl_reward_judge_model(s->judge), st->judge_failed[RL_EXEC_TIMEOUT], st->judge_failed[RL_EXEC_HTTP],
			st->judge_failed[RL_EXEC_JUNK]);
}

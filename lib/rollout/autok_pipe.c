/*
 * autok_pipe.c — rl-rollout --max-staleness auto[:MAX] in the pipe wiring:
 * the broker's rule (queue/autok.h) fed from what rl-rollout sees.  Its own
 * side: decoding time weighted by the share of the slots each step decoded
 * is busy, the rest of it (empty slots) idle; the time it waited for a weights version (the
 * staleness gate) or for the trainer to read its output (a full pipe) is
 * idle.  The trainer's side: the lines rl-train appends to its --metrics file
 * (--trainer-metrics FILE), one per step: "step" (the version), the
 * |actor/ppo_kl| (the drift), "timing_s/gen" (the time it waited for records:
 * idle) and "timing_s/step" less that (busy).
 *
 * Only whole lines are read (the trainer may be writing the next); a line
 * that is not a JSON object or lacks "step" is warned about once, with the
 * file and line, and skipped.  A file that is not there yet is waited for.
 *
 * Leaves out: the gate itself (run.c applies g->o.max_staleness to the next
 * prompt; what was generated under a larger K is in the pipe already), the
 * queue wiring (the broker runs the rule there).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "rollout/rollout_int.h"

void
rli_autok_init(gen *g)
{
	rl_autok_config c;

	rl_autok_config_default(&c, (uint32_t)g->o.auto_kmax);
	rl_autok_init(&g->ak, &c, 0);
	memset(&g->akt, 0, sizeof g->akt);
	g->o.max_staleness = 0;
	g->ak_off = 0;
	g->ak_line = 0;
	g->ak_last = 0;
	rl_autok_update(&g->ak, &g->akt);   /* the base: nothing measured yet */
}

static double
num(const cJSON *j, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* One metrics line into the totals. */
static void
take_line(gen *g, const char *line)
{
	cJSON *j = cJSON_Parse(line);
	double step, kl, wait, st;

	g->ak_line++;
	if (!cJSON_IsObject(j) || isnan(step = num(j, "step"))) {
		if (!g->ak_warned)
			rl_warn("'%s': line %llu: not a metrics line of rl-train (a JSON object with \"step\"): "
			    "skipped (said once)", g->o.trainer_metrics, (unsigned long long)g->ak_line);
		g->ak_warned = 1;
		cJSON_Delete(j);
		return;
	}
	kl = num(j, "actor/ppo_kl");
	wait = num(j, "timing_s/gen");
	st = num(j, "timing_s/step");
	g->akt.version = step;
	if (isfinite(kl)) {
		g->akt.drift_sum += fabs(kl);
		g->akt.drift_n += 1;
	}
	if (isfinite(wait) && wait >= 0)
		g->akt.train_idle += wait;
	if (isfinite(st) && st >= 0)
		g->akt.train_busy += isfinite(wait) && wait >= 0 && st > wait ? st - wait : isfinite(wait) ? 0 : st;
	cJSON_Delete(j);
}

/* Reads the whole lines appended since the last look. */
static int
read_new(gen *g)
{
	FILE *f = fopen(g->o.trainer_metrics, "rb");
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (f == NULL) {
		if (errno == ENOENT)
			return RL_OK;   /* the trainer has not written its first step yet */
		rl_error("cannot read --trainer-metrics '%s': %s", g->o.trainer_metrics, strerror(errno));
		return RL_EIO;
	}
	if (fseeko(f, g->ak_off, SEEK_SET) != 0) {
		fclose(f);
		return RL_OK;
	}
	while ((n = getline(&line, &cap, f)) > 0) {
		if (line[n - 1] != '\n')
			break;   /* being written: read again next time */
		g->ak_off += n;
		line[n - 1] = 0;
		if (strspn(line, " \t\r") != (size_t)(n - 1))
			take_line(g, line);
	}
	free(line);
	fclose(f);
	return RL_OK;
}

int
rli_autok_poll(gen *g)
{
	uint32_t k0 = g->ak.k;
	int rv;

	if (!g->o.auto_k || rl_now() - g->ak_last < 0.1)
		return RL_OK;
	g->ak_last = rl_now();
	if ((rv = read_new(g)) != 0)
		return rv;
	/* busy by slot occupancy: the empty slots of a step are idle capacity */
	g->akt.gen_busy = g->t_engine_occ;
	g->akt.gen_idle = g->t_wait + g->t_write + (g->t_engine - g->t_engine_occ);
	g->akt.trained = (double)g->samples;
	uint64_t w0 = g->ak.windows;
	if (rl_autok_update(&g->ak, &g->akt)) {
		g->o.max_staleness = (int)g->ak.k;
		rl_info("max-staleness auto: %s (trainer step %.0f)", g->ak.why, g->akt.version);
	} else if (g->ak.windows != w0) {
		rl_verbose("max-staleness auto: %s (trainer step %.0f)", g->ak.why, g->akt.version);
	}
	(void)k0;
	return RL_OK;
}

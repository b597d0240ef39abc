/*
 * qserve_workers.c — the broker's table of stage workers (see
 * qserve_workers.h): report validation, per-interval busy fraction and
 * rates, timelines, train step history, JSON for the stats snapshot.
 *
 * A report is checked whole before anything is stored, so a malformed one
 * changes nothing.  Leaves out: persistence (the table is rebuilt from the
 * next reports after a restart).
 */
#include "queue/qserve_workers.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/qproto.h"

static const char *const roles[] = { "rollout", "reward", "train" };
#define NROLES 3
#define NSNAP 32

enum { S_VERSION, S_REWARD, S_LEN, S_PPO_KL, S_KL_REF, S_ENTROPY, S_STEP_S, S_STALE_MEAN, S_STALE_MAX, S_COUNT };
static const char *const step_key[S_COUNT] = {
	"version", "reward_mean", "response_length", "ppo_kl", "kl_ref", "entropy", "step_s", "staleness_mean",
	"staleness_max"
};
/* stage history columns: wall time, then records/s and busy fraction per role */
enum { H_T, H_RATE, H_BUSY = H_RATE + NROLES, H_COUNT = H_BUSY + NROLES };
#define SERIES_COLS 10

/* A whole run's history in RLI_WORKERS_POINTS points at most: each point is
 * the mean of `width` consecutive entries (the last point may hold fewer);
 * when the points are all used, neighbours merge in pairs and the width
 * doubles.  A run of any length is drawn whole at a resolution that halves
 * as it grows, in bounded memory, and a run shorter than the points is kept
 * entry for entry.  A column is averaged over the entries that have it. */
typedef struct series {
	double sum[RLI_WORKERS_POINTS][SERIES_COLS];
	int cnt[RLI_WORKERS_POINTS][SERIES_COLS];
	int n[RLI_WORKERS_POINTS];   /* entries in each point */
	int np, width, cols;
	double entries;
} series;

typedef struct wrk {
	char id[128], device[64], gpu_name[96];
	int role, final, has_gpu, used;
	double first, last;                      /* monotonic s */
	double uptime, busy, idle, records, tokens;
	double busy_frac, rec_rate, tok_rate;    /* over the last interval */
	double gpu_index, gpu_util, gpu_mem_util, gpu_mem_used, gpu_mem_total;
	float tl[RLI_WORKERS_TIMELINE];          /* busy fraction per report, oldest first */
	float gtl[RLI_WORKERS_TIMELINE];         /* GPU utilisation per report (NaN: none reported) */
	int ntl;
	double snap[NSNAP][5];                   /* totals of the last reports: uptime, busy, idle, records, tokens */
	int nsnap;
} wrk;

struct rli_workers {
	pthread_mutex_t mtx;
	wrk w[RLI_WORKERS_MAX];
	/* the trainer's steps, the whole run */
	series steps;
	double last_step[S_COUNT];
	double last_version;
	double drift_sum, drift_n;   /* |ppo_kl| of every step taken, for --max-staleness auto */
	char last_trainer[128];
	double reports;
	/* records/s and busy fraction per stage (live workers), sampled at most
	 * once a second as reports come, the whole run */
	series stages;
	double slast;
};

int
rli_workers_create(rli_workers **out)
{
	rli_workers *ws;

	*out = NULL;
	if ((ws = rl_try_calloc(1, sizeof *ws, "worker table")) == NULL)
		return RL_ENOMEM;
	pthread_mutex_init(&ws->mtx, NULL);
	ws->last_version = -1;
	ws->steps.width = ws->stages.width = 1;
	ws->steps.cols = S_COUNT;
	ws->stages.cols = H_COUNT;
	*out = ws;
	return RL_OK;
}

void
rli_workers_destroy(rli_workers *ws)
{
	if (ws == NULL)
		return;
	pthread_mutex_destroy(&ws->mtx);
	free(ws);
}

static void
series_add(series *s, const double *v)
{
	int b;

	if (s->np == 0 || s->n[s->np - 1] >= s->width) {
		if (s->np == RLI_WORKERS_POINTS) {
			for (int i = 0; i < RLI_WORKERS_POINTS / 2; i++) {
				int a = 2 * i, c = 2 * i + 1;
				for (int k = 0; k < s->cols; k++) {
					s->sum[i][k] = s->sum[a][k] + s->sum[c][k];
					s->cnt[i][k] = s->cnt[a][k] + s->cnt[c][k];
				}
				s->n[i] = s->n[a] + s->n[c];
			}
			s->np = RLI_WORKERS_POINTS / 2;
			s->width *= 2;
		}
		b = s->np++;
		memset(s->sum[b], 0, sizeof s->sum[b]);
		memset(s->cnt[b], 0, sizeof s->cnt[b]);
		s->n[b] = 0;
	}
	b = s->np - 1;
	for (int k = 0; k < s->cols; k++)
		if (!isnan(v[k])) {
			s->sum[b][k] += v[k];
			s->cnt[b][k]++;
		}
	s->n[b]++;
	s->entries++;
}

/* Point i's column k, or NaN where none of its entries had it. */
static double
series_get(const series *s, int i, int k)
{
	return s->cnt[i][k] ? s->sum[i][k] / s->cnt[i][k] : NAN;
}

/* ---- validation ------------------------------------------------------------------------------------ */

static int
fail(char *why, size_t n, const char *msg, const char *key)
{
	snprintf(why, n, "malformed stats report: %s%s%s", key ? "'" : "", key ? key : "", key ? "' " : "");
	strncat(why, msg, n - strlen(why) - 1);
	return RL_EFORMAT;
}

/* A number at key: required or optional (*v untouched if absent), finite, in [lo, hi]. */
static int
get_num(const cJSON *o, const char *key, int required, double lo, double hi, double *v, char *why, size_t wn)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, key);

	if (e == NULL)
		return required ? fail(why, wn, "is missing", key) : RL_OK;
	if (!cJSON_IsNumber(e))
		return fail(why, wn, "is not a number", key);
	if (!isfinite(e->valuedouble) || e->valuedouble < lo || e->valuedouble > hi)
		return fail(why, wn, "is out of range", key);
	*v = e->valuedouble;
	return RL_OK;
}

/* A string of 1..max-1 bytes from the allowed set (NULL: printable ASCII). */
static int
get_str(const cJSON *o, const char *key, int required, char *out, size_t max, const char *allowed, char *why,
    size_t wn)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, key);
	size_t len;

	if (e == NULL)
		return required ? fail(why, wn, "is missing", key) : RL_OK;
	if (!cJSON_IsString(e))
		return fail(why, wn, "is not a string", key);
	len = strlen(e->valuestring);
	if (len == 0 || len >= max)
		return fail(why, wn, "has a bad length", key);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)e->valuestring[i];
		int ok = allowed ? ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    (c && strchr(allowed, c))) : (c >= 0x20 && c < 0x7f && c != '"' && c != '\\');
		if (!ok)
			return fail(why, wn, "holds a character that is not allowed", key);
	}
	memcpy(out, e->valuestring, len + 1);
	return RL_OK;
}

typedef struct parsed {
	wrk w;
	double steps[256][S_COUNT];
	int nsteps;
} parsed;

static int
parse(parsed *p, const char *json, size_t n, char *why, size_t wn)
{
	const char *end = NULL;
	cJSON *o = cJSON_ParseWithLengthOpts(json, n, &end, 0);
	const cJSON *e, *g, *st;
	char role[16];
	int rv = RL_OK;

	memset(p, 0, sizeof *p);
	if (o == NULL)
		return fail(why, wn, "not JSON", NULL);
	while (end && end < json + n && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
		end++;
	if (end != json + n) {
		rv = fail(why, wn, "text after the JSON object", NULL);
		goto out;
	}
	if (!cJSON_IsObject(o)) {
		rv = fail(why, wn, "not a JSON object", NULL);
		goto out;
	}
	if ((rv = get_str(o, "role", 1, role, sizeof role, NULL, why, wn)) != 0)
		goto out;
	p->w.role = -1;
	for (int r = 0; r < NROLES; r++)
		if (strcmp(role, roles[r]) == 0)
			p->w.role = r;
	if (p->w.role < 0) {
		rv = fail(why, wn, "is not rollout, reward or train", "role");
		goto out;
	}
	if ((rv = get_str(o, "worker", 1, p->w.id, sizeof p->w.id, "._:@/+-", why, wn)) != 0 ||
	    (rv = get_str(o, "device", 0, p->w.device, sizeof p->w.device, "._:-", why, wn)) != 0 ||
	    (rv = get_num(o, "uptime_s", 1, 0, 1e10, &p->w.uptime, why, wn)) != 0 ||
	    (rv = get_num(o, "busy_s", 1, 0, 1e10, &p->w.busy, why, wn)) != 0 ||
	    (rv = get_num(o, "idle_s", 1, 0, 1e10, &p->w.idle, why, wn)) != 0 ||
	    (rv = get_num(o, "records", 1, 0, 1e18, &p->w.records, why, wn)) != 0 ||
	    (rv = get_num(o, "tokens", 1, 0, 1e18, &p->w.tokens, why, wn)) != 0)
		goto out;
	if (!p->w.device[0])
		strcpy(p->w.device, "cpu");
	if ((e = cJSON_GetObjectItemCaseSensitive(o, "final")) != NULL) {
		if (!cJSON_IsBool(e)) {
			rv = fail(why, wn, "is not true or false", "final");
			goto out;
		}
		p->w.final = cJSON_IsTrue(e);
	}
	if ((g = cJSON_GetObjectItemCaseSensitive(o, "gpu")) != NULL) {
		if (!cJSON_IsObject(g)) {
			rv = fail(why, wn, "is not an object", "gpu");
			goto out;
		}
		if ((rv = get_num(g, "index", 1, 0, 4096, &p->w.gpu_index, why, wn)) != 0 ||
		    (rv = get_num(g, "util", 1, 0, 1, &p->w.gpu_util, why, wn)) != 0 ||
		    (rv = get_num(g, "mem_util", 0, 0, 1, &p->w.gpu_mem_util, why, wn)) != 0 ||
		    (rv = get_num(g, "mem_used", 1, 0, 1e16, &p->w.gpu_mem_used, why, wn)) != 0 ||
		    (rv = get_num(g, "mem_total", 1, 0, 1e16, &p->w.gpu_mem_total, why, wn)) != 0 ||
		    (rv = get_str(g, "name", 0, p->w.gpu_name, sizeof p->w.gpu_name, NULL, why, wn)) != 0)
			goto out;
		p->w.has_gpu = 1;
	}
	if ((st = cJSON_GetObjectItemCaseSensitive(o, "steps")) != NULL) {
		if (!cJSON_IsArray(st) || cJSON_GetArraySize(st) > 256) {
			rv = fail(why, wn, "is not an array of at most 256 steps", "steps");
			goto out;
		}
		cJSON_ArrayForEach(e, st) {
			double *s = p->steps[p->nsteps];
			if (!cJSON_IsObject(e)) {
				rv = fail(why, wn, "holds something that is not an object", "steps");
				goto out;
			}
			for (int k = 0; k < S_COUNT; k++) {
				s[k] = NAN;
				if ((rv = get_num(e, step_key[k], k == S_VERSION, k == S_VERSION ? 0 : -1e30, 1e30, &s[k], why,
				    wn)) != 0)
					goto out;
			}
			p->nsteps++;
		}
	}
out:
	cJSON_Delete(o);
	return rv;
}

/* ---- the table ---------------------------------------------------------------------------------------- */

/* Under mtx: sums over live workers per role. */
static void
stage_sums(rli_workers *ws, double now, double *rsum, double *tsum, double *bsum, int *live, int *all)
{
	for (int r = 0; r < NROLES; r++)
		rsum[r] = tsum[r] = bsum[r] = 0, live[r] = all[r] = 0;
	for (int i = 0; i < RLI_WORKERS_MAX; i++) {
		const wrk *w = &ws->w[i];
		if (!w->used)
			continue;
		all[w->role]++;
		if (w->final || now - w->last > RLI_WORKERS_SILENT)
			continue;
		live[w->role]++;
		rsum[w->role] += w->rec_rate;
		tsum[w->role] += w->tok_rate;
		bsum[w->role] += w->busy_frac;
	}
}

static void
expire(rli_workers *ws, double now)
{
	for (int i = 0; i < RLI_WORKERS_MAX; i++)
		if (ws->w[i].used && now - ws->w[i].last > RLI_WORKERS_TTL)
			ws->w[i].used = 0;
}

int
rli_workers_report(rli_workers *ws, const char *json, size_t n, double now, char *why, size_t whylen)
{
	parsed *p;
	wrk *w = NULL, *oldest = NULL;
	int rv;

	if ((p = rl_try_malloc(sizeof *p, "stats report")) == NULL)
		return RL_ENOMEM;
	if ((rv = parse(p, json, n, why, whylen)) != 0) {
		free(p);
		return rv;
	}
	pthread_mutex_lock(&ws->mtx);
	expire(ws, now);
	for (int i = 0; i < RLI_WORKERS_MAX && !w; i++)
		if (ws->w[i].used && strcmp(ws->w[i].id, p->w.id) == 0)
			w = &ws->w[i];
	if (w && (w->role != p->w.role || p->w.uptime < w->uptime)) {
		/* the same name, another process: start over */
		w->used = 0;
		w = NULL;
	}
	if (w == NULL) {
		for (int i = 0; i < RLI_WORKERS_MAX; i++) {
			if (!ws->w[i].used) {
				w = &ws->w[i];
				break;
			}
			if (!oldest || ws->w[i].last < oldest->last)
				oldest = &ws->w[i];
		}
		if (w == NULL)
			w = oldest;
		memset(w, 0, sizeof *w);
		memcpy(w->id, p->w.id, sizeof w->id);
		w->role = p->w.role;
		w->first = now;
		/* the first interval is the worker's life so far */
	}
	{
		double cur[5] = { p->w.uptime, p->w.busy, p->w.idle, p->w.records, p->w.tokens }, *b, db, di, du;
		float tlv;
		int j;
		if (w->nsnap > 0 && (cur[1] < w->busy || cur[2] < w->idle || cur[3] < w->records || cur[4] < w->tokens))
			w->nsnap = 0;   /* totals went backwards: start over */
		if (w->nsnap == 0) {
			/* the worker's start: its first report covers its life so far */
			memset(w->snap[0], 0, sizeof w->snap[0]);
			w->nsnap = 1;
		}
		/* this report's own interval, for the timeline */
		b = w->snap[w->nsnap - 1];
		db = cur[1] - b[1], di = cur[2] - b[2];
		tlv = db + di > 0 ? (float)(db / (db + di)) : (float)w->busy_frac;
		if (w->nsnap == NSNAP) {
			memmove(w->snap, w->snap + 1, sizeof w->snap[0] * (NSNAP - 1));
			w->nsnap--;
		}
		memcpy(w->snap[w->nsnap++], cur, sizeof cur);
		/* fraction and rates over the reports of the last RLI_WORKERS_WINDOW seconds
		 * (at least the last interval), so a short final interval does not decide them */
		for (j = 0; j < w->nsnap - 2 && cur[0] - w->snap[j][0] > RLI_WORKERS_WINDOW; j++)
			;
		b = w->snap[j];
		db = cur[1] - b[1], di = cur[2] - b[2], du = cur[0] - b[0];
		if (db + di > 0)
			w->busy_frac = db / (db + di);
		if (du > 0) {
			w->rec_rate = (cur[3] - b[3]) / du;
			w->tok_rate = (cur[4] - b[4]) / du;
		}
		if (w->ntl == RLI_WORKERS_TIMELINE) {
			memmove(w->tl, w->tl + 1, sizeof w->tl[0] * (RLI_WORKERS_TIMELINE - 1));
			memmove(w->gtl, w->gtl + 1, sizeof w->gtl[0] * (RLI_WORKERS_TIMELINE - 1));
			w->ntl--;
		}
		w->gtl[w->ntl] = p->w.has_gpu ? (float)p->w.gpu_util : NAN;
		w->tl[w->ntl++] = tlv;
	}
	w->uptime = p->w.uptime;
	w->busy = p->w.busy;
	w->idle = p->w.idle;
	w->records = p->w.records;
	w->tokens = p->w.tokens;
	w->final = p->w.final;
	w->last = now;
	w->used = 1;
	memcpy(w->device, p->w.device, sizeof w->device);
	w->has_gpu = p->w.has_gpu;
	if (w->has_gpu) {
		memcpy(w->gpu_name, p->w.gpu_name, sizeof w->gpu_name);
		w->gpu_index = p->w.gpu_index;
		w->gpu_util = p->w.gpu_util;
		w->gpu_mem_util = p->w.gpu_mem_util;
		w->gpu_mem_used = p->w.gpu_mem_used;
		w->gpu_mem_total = p->w.gpu_mem_total;
	}
	/* train steps: a step already recorded from this trainer (a report
	 * whose reply was lost, then sent again) is not added twice */
	if (strcmp(ws->last_trainer, p->w.id) != 0) {
		memcpy(ws->last_trainer, p->w.id, sizeof ws->last_trainer);
		ws->last_version = -1;
	}
	for (int i = 0; i < p->nsteps; i++) {
		if (p->steps[i][S_VERSION] <= ws->last_version)
			continue;
		ws->last_version = p->steps[i][S_VERSION];
		if (!isnan(p->steps[i][S_PPO_KL])) {
			ws->drift_sum += fabs(p->steps[i][S_PPO_KL]);
			ws->drift_n++;
		}
		memcpy(ws->last_step, p->steps[i], sizeof ws->last_step);
		series_add(&ws->steps, p->steps[i]);
	}
	ws->reports++;
	if (now - ws->slast >= 1.0 || ws->stages.np == 0) {
		double rsum[NROLES], tsum[NROLES], bsum[NROLES], e[SERIES_COLS];
		int live[NROLES], all[NROLES];
		/* a final report ends the worker's rate: record what it had */
		if (w->final)
			w->final = 0;
		stage_sums(ws, now, rsum, tsum, bsum, live, all);
		w->final = p->w.final;
		e[H_T] = rl_wall();
		for (int r = 0; r < NROLES; r++) {
			e[H_RATE + r] = rsum[r];
			e[H_BUSY + r] = live[r] ? bsum[r] / live[r] : NAN;
		}
		series_add(&ws->stages, e);
		ws->slast = now;
	}
	pthread_mutex_unlock(&ws->mtx);
	free(p);
	return RL_OK;
}

/* obj[key]: column k of every point, null where a point has none. */
static int
series_json(cJSON *obj, const char *key, const series *s, int k)
{
	cJSON *a = cJSON_AddArrayToObject(obj, key);

	if (a == NULL)
		return RL_ENOMEM;
	for (int i = 0; i < s->np; i++) {
		double v = series_get(s, i, k);
		if (!cJSON_AddItemToArray(a, isnan(v) ? cJSON_CreateNull() : cJSON_CreateNumber(v)))
			return RL_ENOMEM;
	}
	return RL_OK;
}

static int
cmp_wrk(const void *a, const void *b)
{
	const wrk *x = *(wrk *const *)a, *y = *(wrk *const *)b;
	if (x->role != y->role)
		return x->role - y->role;
	return strcmp(x->id, y->id);
}

int
rli_workers_json(rli_workers *ws, void *obj, double now)
{
	cJSON *o = obj, *arr, *stages, *st[NROLES];
	wrk *list[RLI_WORKERS_MAX];
	double rsum[NROLES], tsum[NROLES], bsum[NROLES];
	int n = 0, live[NROLES], all[NROLES];

	pthread_mutex_lock(&ws->mtx);
	expire(ws, now);
	for (int i = 0; i < RLI_WORKERS_MAX; i++)
		if (ws->w[i].used)
			list[n++] = &ws->w[i];
	qsort(list, (size_t)n, sizeof list[0], cmp_wrk);
	if ((arr = cJSON_AddArrayToObject(o, "workers")) == NULL)
		goto nomem;
	for (int i = 0; i < n; i++) {
		wrk *w = list[i];
		cJSON *e = cJSON_CreateObject(), *tl;
		int is_live = !w->final && now - w->last <= RLI_WORKERS_SILENT;
		if (e == NULL)
			goto nomem;
		cJSON_AddItemToArray(arr, e);
		cJSON_AddStringToObject(e, "worker", w->id);
		cJSON_AddStringToObject(e, "role", roles[w->role]);
		cJSON_AddStringToObject(e, "device", w->device);
		cJSON_AddStringToObject(e, "state", w->final ? "exited" : is_live ? "live" : "silent");
		cJSON_AddNumberToObject(e, "age_s", now - w->last);
		cJSON_AddNumberToObject(e, "uptime_s", w->uptime);
		cJSON_AddNumberToObject(e, "busy_s", w->busy);
		cJSON_AddNumberToObject(e, "idle_s", w->idle);
		cJSON_AddNumberToObject(e, "records", w->records);
		cJSON_AddNumberToObject(e, "tokens", w->tokens);
		cJSON_AddNumberToObject(e, "busy_frac", w->busy_frac);
		cJSON_AddNumberToObject(e, "records_per_s", w->rec_rate);
		cJSON_AddNumberToObject(e, "tokens_per_s", w->tok_rate);
		if ((tl = cJSON_AddArrayToObject(e, "timeline")) != NULL)
			for (int k = 0; k < w->ntl; k++)
				cJSON_AddItemToArray(tl, cJSON_CreateNumber(round(w->tl[k] * 1000) / 1000));
		if (w->has_gpu && (tl = cJSON_AddArrayToObject(e, "gpu_timeline")) != NULL)
			for (int k = 0; k < w->ntl; k++)
				cJSON_AddItemToArray(tl, isnan(w->gtl[k]) ? cJSON_CreateNull() :
				    cJSON_CreateNumber(round(w->gtl[k] * 1000) / 1000));
		if (w->has_gpu) {
			cJSON *g = cJSON_AddObjectToObject(e, "gpu");
			if (g) {
				cJSON_AddNumberToObject(g, "index", w->gpu_index);
				cJSON_AddStringToObject(g, "name", w->gpu_name[0] ? w->gpu_name : "GPU");
				cJSON_AddNumberToObject(g, "util", w->gpu_util);
				cJSON_AddNumberToObject(g, "mem_util", w->gpu_mem_util);
				cJSON_AddNumberToObject(g, "mem_used", w->gpu_mem_used);
				cJSON_AddNumberToObject(g, "mem_total", w->gpu_mem_total);
			}
		}
	}
	stage_sums(ws, now, rsum, tsum, bsum, live, all);
	if ((stages = cJSON_AddObjectToObject(o, "stages")) == NULL)
		goto nomem;
	for (int r = 0; r < NROLES; r++) {
		if ((st[r] = cJSON_AddObjectToObject(stages, roles[r])) == NULL)
			goto nomem;
		cJSON_AddNumberToObject(st[r], "workers", all[r]);
		cJSON_AddNumberToObject(st[r], "live", live[r]);
		cJSON_AddNumberToObject(st[r], "records_per_s", rsum[r]);
		cJSON_AddNumberToObject(st[r], "tokens_per_s", tsum[r]);
		if (live[r])
			cJSON_AddNumberToObject(st[r], "busy_frac", bsum[r] / live[r]);
	}
	if (ws->stages.np > 0) {
		cJSON *h = cJSON_AddObjectToObject(o, "stage_history");
		char key[32];
		if (h == NULL)
			goto nomem;
		for (int k = 0; k < H_COUNT; k++) {
			if (k == H_T)
				snprintf(key, sizeof key, "t");
			else if (k < H_BUSY)
				snprintf(key, sizeof key, "%s", roles[k - H_RATE]);
			else
				snprintf(key, sizeof key, "%s_busy", roles[k - H_BUSY]);
			if (series_json(h, key, &ws->stages, k) != 0)
				goto nomem;
		}
		cJSON_AddNumberToObject(h, "samples_per_point", ws->stages.width);
	}
	if (ws->steps.np > 0) {
		cJSON *t = cJSON_AddObjectToObject(o, "train"), *h = cJSON_AddObjectToObject(o, "train_history");
		if (t == NULL || h == NULL)
			goto nomem;
		for (int k = 0; k < S_COUNT; k++) {
			if (!isnan(ws->last_step[k]))
				cJSON_AddNumberToObject(t, step_key[k], ws->last_step[k]);
			if (series_json(h, step_key[k], &ws->steps, k) != 0)
				goto nomem;
		}
		cJSON_AddNumberToObject(h, "steps_per_point", ws->steps.width);
		cJSON_AddNumberToObject(t, "steps", ws->steps.entries);
	}
	pthread_mutex_unlock(&ws->mtx);
	return RL_OK;
nomem:
	pthread_mutex_unlock(&ws->mtx);
	return RL_ENOMEM;
}

void
rli_workers_totals(rli_workers *ws, double now, double *train_busy, double *train_idle, double *gen_busy,
    double *gen_idle, double *drift_sum, double *drift_n)
{
	*train_busy = *train_idle = *gen_busy = *gen_idle = 0;
	pthread_mutex_lock(&ws->mtx);
	expire(ws, now);
	for (int i = 0; i < RLI_WORKERS_MAX; i++) {
		const wrk *w = &ws->w[i];
		if (!w->used)
			continue;
		if (strcmp(roles[w->role], "train") == 0) {
			*train_busy += w->busy;
			*train_idle += w->idle;
		} else if (strcmp(roles[w->role], "rollout") == 0) {
			*gen_busy += w->busy;
			*gen_idle += w->idle;
		}
	}
	*drift_sum = ws->drift_sum;
	*drift_n = ws->drift_n;
	pthread_mutex_unlock(&ws->mtx);
}

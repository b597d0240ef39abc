/*
 * wstat.c — a stage's stats and its reporter thread (see wstat.h), and the
 * NVML sampler loaded at run time.
 *
 * The counters sit under one mutex; the reporter thread takes a snapshot,
 * samples the GPU and sends outside it, so the stage's hooks never wait on
 * the network.
 */
#include "queue/wstat.h"

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queue/qclient.h"

#define MAX_STEPS 256      /* steps waiting for a report */
#define STEPS_PER_REPORT 128

/* train step fields, in report order */
enum { S_VERSION, S_REWARD, S_LEN, S_PPO_KL, S_KL_REF, S_ENTROPY, S_STEP_S, S_STALE_MEAN, S_STALE_MAX, S_COUNT };
static const char *const step_key[S_COUNT] = {
	"version", "reward_mean", "response_length", "ppo_kl", "kl_ref", "entropy", "step_s", "staleness_mean",
	"staleness_max"
};
static const char *const step_metric[S_COUNT] = {
	"step", "critic/score/mean", "response_length/mean", "actor/ppo_kl", "actor/kl_loss", "actor/entropy",
	"timing_s/step", "staleness/mean", "staleness/max"
};

typedef struct step {
	double v[S_COUNT];
	unsigned mask;         /* bit k: v[k] is present */
} step;

struct rl_wstat {
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	pthread_t th;
	int started, stop, refused;
	int last_rv;           /* the last report's result */
	char role[16], worker[128], device[64];
	rl_qclient *qc;
	rl_nvml *nv;
	double interval, t0, since, acc[2];
	int phase;
	double part;           /* busy share of an open busy interval (see rl_wstat_phase_part) */
	uint64_t records, tokens;
	step steps[MAX_STEPS];
	int nsteps;
	uint64_t steps_dropped;
};

/* ---- NVML ---------------------------------------------------------------------------------------- */

typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;

struct rl_nvml {
	void *lib;
	void *dev;
	int index;
	char name[96];
	int (*shutdown)(void);
	int (*util)(void *, nvml_util *);
	int (*mem)(void *, nvml_mem *);
	const char *(*err)(int);
};

static const char *
nvml_err(const rl_nvml *n, int r)
{
	const char *s = n->err ? n->err(r) : NULL;
	return s ? s : "NVML error";
}

int
rl_nvml_open(rl_nvml **out, const char *device)
{
	const char *libname = getenv("RL_NVML_LIB"), *cvd = getenv("CUDA_VISIBLE_DEVICES");
	int (*init)(void), (*by_index)(unsigned, void **), (*by_uuid)(const char *, void **), (*getname)(void *, char *, unsigned);
	int (*get_index)(void *, unsigned *);
	char entry[128] = "";
	long n = 0;
	rl_nvml *v;
	int r;

	*out = NULL;
	if (device == NULL || strncmp(device, "cuda", 4) != 0)
		return RL_ENODEV;
	if (device[4] == ':') {
		char *end;
		n = strtol(device + 5, &end, 10);
		if (end == device + 5 || *end || n < 0)
			return RL_ENODEV;
	} else if (device[4] != 0) {
		return RL_ENODEV;
	}
	if (cvd && *cvd) {
		/* the N-th visible device */
		const char *p = cvd;
		for (long i = 0; i < n && p; i++)
			if ((p = strchr(p, ',')) != NULL)
				p++;
		if (p == NULL)
			return RL_ENODEV;
		size_t len = strcspn(p, ",");
		if (len == 0 || len >= sizeof entry)
			return RL_ENODEV;
		memcpy(entry, p, len);
		entry[len] = 0;
	}
	if ((v = calloc(1, sizeof *v)) == NULL)
		return RL_ENOMEM;
	if ((v->lib = dlopen(libname && *libname ? libname : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL) {
		rl_verbose("no GPU stats: cannot load NVML: %s", dlerror());
		free(v);
		return RL_ENODEV;
	}
	*(void **)&init = dlsym(v->lib, "nvmlInit_v2");
	*(void **)&v->shutdown = dlsym(v->lib, "nvmlShutdown");
	*(void **)&by_index = dlsym(v->lib, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&by_uuid = dlsym(v->lib, "nvmlDeviceGetHandleByUUID");
	*(void **)&getname = dlsym(v->lib, "nvmlDeviceGetName");
	*(void **)&get_index = dlsym(v->lib, "nvmlDeviceGetIndex");
	*(void **)&v->util = dlsym(v->lib, "nvmlDeviceGetUtilizationRates");
	*(void **)&v->mem = dlsym(v->lib, "nvmlDeviceGetMemoryInfo");
	*(void **)&v->err = dlsym(v->lib, "nvmlErrorString");
	if (!init || !v->shutdown || !by_index || !v->util || !v->mem) {
		rl_verbose("no GPU stats: the NVML library lacks the functions needed");
		dlclose(v->lib);
		free(v);
		return RL_ENODEV;
	}
	if ((r = init()) != 0) {
		rl_verbose("no GPU stats: NVML did not start: %s", nvml_err(v, r));
		dlclose(v->lib);
		free(v);
		return RL_ENODEV;
	}
	v->index = (int)n;
	if (entry[0] && strspn(entry, "0123456789") != strlen(entry)) {
		r = by_uuid ? by_uuid(entry, &v->dev) : -1;
		v->index = -1;
	} else {
		if (entry[0])
			v->index = atoi(entry);
		r = by_index((unsigned)v->index, &v->dev);
	}
	if (r != 0) {
		rl_verbose("no GPU stats: NVML has no GPU '%s': %s", entry[0] ? entry : device, nvml_err(v, r));
		rl_nvml_close(v);
		return RL_ENODEV;
	}
	if (v->index < 0 && get_index) {
		unsigned u;
		if (get_index(v->dev, &u) == 0)
			v->index = (int)u;
	}
	if (!getname || getname(v->dev, v->name, sizeof v->name) != 0)
		snprintf(v->name, sizeof v->name, "GPU %d", v->index);
	v->name[sizeof v->name - 1] = 0;
	*out = v;
	return RL_OK;
}

int
rl_nvml_sample(rl_nvml *n, rl_gpu_sample *s)
{
	nvml_util u;
	nvml_mem m;
	int r;

	memset(s, 0, sizeof *s);
	if ((r = n->util(n->dev, &u)) != 0 || (r = n->mem(n->dev, &m)) != 0) {
		rl_verbose("NVML: %s", nvml_err(n, r));
		return RL_EDEVICE;
	}
	s->index = n->index;
	memcpy(s->name, n->name, sizeof s->name);
	s->util = RL_MIN(u.gpu, 100u) / 100.0;
	s->mem_util = RL_MIN(u.memory, 100u) / 100.0;
	s->mem_used = (double)m.used;
	s->mem_total = (double)m.total;
	return RL_OK;
}

void
rl_nvml_close(rl_nvml *n)
{
	if (n == NULL)
		return;
	if (n->lib) {
		n->shutdown();
		dlclose(n->lib);
	}
	free(n);
}

/* ---- counters ------------------------------------------------------------------------------------ */

/* Closes the open interval, part of it busy and the rest idle (under mtx). */
static void
close_interval(rl_wstat *w, double now, double part)
{
	double dt = now - w->since;

	w->acc[1] += part * dt;
	w->acc[0] += (1 - part) * dt;
	w->since = now;
}

void
rl_wstat_phase(rl_wstat *w, int phase)
{
	if (w == NULL)
		return;
	pthread_mutex_lock(&w->mtx);
	close_interval(w, rl_now(), w->phase ? w->part : 0);
	w->phase = phase == RL_WSTAT_BUSY;
	pthread_mutex_unlock(&w->mtx);
}

void
rl_wstat_phase_part(rl_wstat *w, int phase, double part)
{
	if (w == NULL)
		return;
	/* NaN or out of range (a caller's 0/0): the whole interval's phase decides */
	if (!(part >= 0 && part <= 1))
		part = w->phase ? 1 : 0;
	pthread_mutex_lock(&w->mtx);
	close_interval(w, rl_now(), part);
	w->part = part;
	w->phase = phase == RL_WSTAT_BUSY;
	pthread_mutex_unlock(&w->mtx);
}

void
rl_wstat_add(rl_wstat *w, uint64_t records, uint64_t tokens)
{
	if (w == NULL)
		return;
	pthread_mutex_lock(&w->mtx);
	w->records += records;
	w->tokens += tokens;
	pthread_mutex_unlock(&w->mtx);
}

void
rl_wstat_train_metrics(rl_wstat *w, const char *json)
{
	cJSON *o;
	step s = { { 0 }, 0 };

	if (w == NULL || json == NULL || (o = cJSON_Parse(json)) == NULL)
		return;
	for (int k = 0; k < S_COUNT; k++) {
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, step_metric[k]);
		if (cJSON_IsNumber(e) && isfinite(e->valuedouble)) {
			s.v[k] = e->valuedouble;
			s.mask |= 1u << k;
		}
	}
	if (!(s.mask & 1u << S_KL_REF)) {
		/* the KL to the reference: the loss term's, else the reward's (--kl-in-reward) */
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "actor/reward_kl_penalty");
		if (cJSON_IsNumber(e) && isfinite(e->valuedouble)) {
			s.v[S_KL_REF] = e->valuedouble;
			s.mask |= 1u << S_KL_REF;
		}
	}
	cJSON_Delete(o);
	if (!(s.mask & 1u << S_VERSION))
		return;
	pthread_mutex_lock(&w->mtx);
	if (w->nsteps == MAX_STEPS) {
		memmove(w->steps, w->steps + 1, sizeof w->steps[0] * (MAX_STEPS - 1));
		w->nsteps--;
		w->steps_dropped++;
	}
	w->steps[w->nsteps++] = s;
	pthread_mutex_unlock(&w->mtx);
}

/* The report as JSON; *nsteps gets the steps put in it.  gpu may be NULL. */
static int
build(rl_wstat *w, int final, const rl_gpu_sample *gpu, char **out, int *nsteps)
{
	cJSON *o = cJSON_CreateObject(), *g, *a;
	double now = rl_now(), busy, idle;
	int n;

	*out = NULL;
	*nsteps = 0;
	if (o == NULL)
		return RL_ENOMEM;
	pthread_mutex_lock(&w->mtx);
	/* an open busy interval counts at the last part known (1 unless the
	 * worker gives parts) */
	busy = w->acc[1] + (w->phase == 1 ? w->part * (now - w->since) : 0);
	idle = w->acc[0] + (w->phase == 0 ? now - w->since : (1 - w->part) * (now - w->since));
	cJSON_AddStringToObject(o, "role", w->role);
	cJSON_AddStringToObject(o, "worker", w->worker);
	cJSON_AddStringToObject(o, "device", w->device);
	cJSON_AddNumberToObject(o, "uptime_s", now - w->t0);
	cJSON_AddNumberToObject(o, "busy_s", busy);
	cJSON_AddNumberToObject(o, "idle_s", idle);
	cJSON_AddNumberToObject(o, "records", (double)w->records);
	cJSON_AddNumberToObject(o, "tokens", (double)w->tokens);
	cJSON_AddBoolToObject(o, "final", final);
	n = RL_MIN(w->nsteps, STEPS_PER_REPORT);
	if (n > 0 && (a = cJSON_AddArrayToObject(o, "steps")) != NULL) {
		for (int i = 0; i < n; i++) {
			cJSON *e = cJSON_CreateObject();
			if (e == NULL)
				break;
			for (int k = 0; k < S_COUNT; k++)
				if (w->steps[i].mask & 1u << k)
					cJSON_AddNumberToObject(e, step_key[k], w->steps[i].v[k]);
			cJSON_AddItemToArray(a, e);
		}
	}
	pthread_mutex_unlock(&w->mtx);
	if (gpu && (g = cJSON_AddObjectToObject(o, "gpu")) != NULL) {
		cJSON_AddNumberToObject(g, "index", gpu->index);
		cJSON_AddStringToObject(g, "name", gpu->name);
		cJSON_AddNumberToObject(g, "util", gpu->util);
		cJSON_AddNumberToObject(g, "mem_util", gpu->mem_util);
		cJSON_AddNumberToObject(g, "mem_used", gpu->mem_used);
		cJSON_AddNumberToObject(g, "mem_total", gpu->mem_total);
	}
	*out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	*nsteps = n;
	return *out ? RL_OK : RL_ENOMEM;
}

int
rl_wstat_report_json(rl_wstat *w, int final, char **out)
{
	rl_gpu_sample g;
	int n;

	*out = NULL;
	if (w == NULL)
		return RL_EINVAL;
	return build(w, final, w->nv && rl_nvml_sample(w->nv, &g) == 0 ? &g : NULL, out, &n);
}

/* One report to the broker; steps it carried leave the queue once taken. */
static void
send_report(rl_wstat *w, int final)
{
	rl_gpu_sample g;
	char *txt = NULL;
	int n, rv;

	if (w->refused || w->qc == NULL)
		return;
	if (build(w, final, w->nv && rl_nvml_sample(w->nv, &g) == 0 ? &g : NULL, &txt, &n) != 0)
		return;
	rv = rl_qclient_report(w->qc, txt, strlen(txt));
	w->last_rv = rv;
	free(txt);
	if (rv == RL_OK) {
		pthread_mutex_lock(&w->mtx);
		n = RL_MIN(n, w->nsteps);
		memmove(w->steps, w->steps + n, sizeof w->steps[0] * (size_t)(w->nsteps - n));
		w->nsteps -= n;
		pthread_mutex_unlock(&w->mtx);
	} else if (rv == RL_EINVAL || rv == RL_EFORMAT || rv == RL_ETOOBIG) {
		/* an older broker, or one that will not take ours: stop asking */
		rl_warn("the broker does not take stats reports (%s): not reporting", rl_strerror(rv));
		rl_hint("rl-queue from this release shows per-worker stats; the queue itself works as before");
		w->refused = 1;
	}
}

static void *
reporter(void *arg)
{
	rl_wstat *w = arg;
	struct timespec ts;

	pthread_mutex_lock(&w->mtx);
	while (!w->stop) {
		double next;
		clock_gettime(CLOCK_REALTIME, &ts);
		next = ts.tv_sec + ts.tv_nsec / 1e9 + w->interval;
		ts.tv_sec = (time_t)next;
		ts.tv_nsec = (long)((next - (double)ts.tv_sec) * 1e9);
		while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mtx, &ts) == 0)
			;
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->mtx);
		send_report(w, 0);
		pthread_mutex_lock(&w->mtx);
	}
	pthread_mutex_unlock(&w->mtx);
	return NULL;
}

/* ---- open / close --------------------------------------------------------------------------------- */

static void
worker_id(char *out, size_t n)
{
	const char *env = getenv("RL_WORKER_ID");
	char host[64] = "localhost";
	size_t i;

	if (env && *env) {
		snprintf(out, n, "%s", env);
	} else {
		gethostname(host, sizeof host);
		host[sizeof host - 1] = 0;
		snprintf(out, n, "%s:%ld", host, (long)getpid());
	}
	for (i = 0; out[i]; i++) {
		char c = out[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("._:@/+-", c)))
			out[i] = '_';
	}
}

int
rl_wstat_open(rl_wstat **out, const char *url, const char *role, const char *device)
{
	const char *iv = getenv("RL_STATS_INTERVAL");
	rl_qclient_opts qo;
	double interval = 2;
	rl_wstat *w;
	int rv;

	*out = NULL;
	if (role == NULL || (strcmp(role, "rollout") && strcmp(role, "reward") && strcmp(role, "train"))) {
		rl_error("stats: unknown role '%s'", role ? role : "(null)");
		return RL_EINVAL;
	}
	if (iv && *iv) {
		char *end;
		interval = strtod(iv, &end);
		if (*end || !(interval >= 0 && interval <= 3600)) {
			rl_error("RL_STATS_INTERVAL: '%s' is not seconds from 0 to 3600", iv);
			return RL_EINVAL;
		}
		if (interval == 0)
			return RL_OK;
		interval = RL_MAX(interval, 0.05);
	}
	if ((w = rl_try_calloc(1, sizeof *w, "worker stats")) == NULL)
		return RL_ENOMEM;
	pthread_mutex_init(&w->mtx, NULL);
	pthread_cond_init(&w->cv, NULL);
	snprintf(w->role, sizeof w->role, "%s", role);
	worker_id(w->worker, sizeof w->worker);
	if (device == NULL || strcmp(device, "auto") == 0)
		device = device ? "cuda" : "cpu";
	snprintf(w->device, sizeof w->device, "%s", device);
	w->interval = interval;
	w->t0 = w->since = rl_now();
	w->phase = RL_WSTAT_IDLE;
	w->part = 1;
	rl_nvml_open(&w->nv, w->device);
	rl_qclient_opts_default(&qo);
	qo.timeout_ms = 1500;
	qo.retry_ms = 0;
	qo.dedup = 0;
	if ((rv = rl_qclient_open(&w->qc, url, &qo)) != 0)
		goto fail;
	if (pthread_create(&w->th, NULL, reporter, w) != 0) {
		rl_error("stats: cannot start the reporter thread");
		rv = RL_ENOMEM;
		goto fail;
	}
	w->started = 1;
	*out = w;
	return RL_OK;
fail:
	rl_qclient_close(w->qc);
	rl_nvml_close(w->nv);
	pthread_mutex_destroy(&w->mtx);
	pthread_cond_destroy(&w->cv);
	free(w);
	return rv;
}

void
rl_wstat_close(rl_wstat *w)
{
	if (w == NULL)
		return;
	if (w->started) {
		pthread_mutex_lock(&w->mtx);
		w->stop = 1;
		pthread_cond_signal(&w->cv);
		pthread_mutex_unlock(&w->mtx);
		pthread_join(w->th, NULL);
	}
	rl_wstat_phase(w, w->phase);   /* close the open interval */
	/* a broker that did not answer the last report is not waited for again */
	if (w->last_rv != RL_ETIMEDOUT && w->last_rv != RL_ENET && w->last_rv != RL_ECLOSED) {
		for (int i = 0; i < 2 && w->nsteps > STEPS_PER_REPORT && !w->refused; i++)
			send_report(w, 0);
		send_report(w, 1);
	}
	if (w->steps_dropped)
		rl_verbose("stats: %llu train steps never reached the broker", (unsigned long long)w->steps_dropped);
	rl_qclient_close(w->qc);
	rl_nvml_close(w->nv);
	pthread_mutex_destroy(&w->mtx);
	pthread_cond_destroy(&w->cv);
	free(w);
}

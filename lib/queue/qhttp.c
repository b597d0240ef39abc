/*
 * qhttp.c — rl-queue's HTTP listener (see qhttp.h): the address check, the
 * Prometheus rendering of the stats JSON, the routes and the page.
 *
 * The HTTP itself is base/httpd.c's: it bounds connections, their deadlines and
 * the request head, refuses bodies (413) and malformed requests, and calls
 * route() on its one thread for a parsed request.  The routes take GET and
 * HEAD only (405 otherwise, 404 for other paths); the data routes check the
 * shared key.  The stats callback takes the broker's lock briefly.
 * Leaves out: TLS (http:// only), routes that take a body.
 */
#include "queue/qhttp.h"
#include "base/httpd.h"
#include "base/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct rl_qhttp {
	rl_qhttp_config cfg;
	rli_httpd *srv;
	char url[300];
	rl_buf page;
};

/* ---- address ---------------------------------------------------------------------------------------- */

static int
is_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;

	if (strcmp(host, "localhost") == 0)
		return 1;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return 0;
}

int
rl_qhttp_parse_addr(char *url, size_t n, int *loopback, const char *addr)
{
	char host[256];
	const char *p = addr, *colon, *port;
	size_t hl;
	long v;
	char *end;
	int v6 = 0, w;

	*loopback = 0;
	if (strncmp(p, "http://", 7) == 0)
		p += 7;
	else if (strstr(p, "://") != NULL)
		return RL_EINVAL;                    /* https:// and others: not served */
	if (*p == '[') {
		const char *rb = strchr(p, ']');
		if (rb == NULL || rb[1] != ':')
			return RL_EINVAL;
		hl = (size_t)(rb - p - 1);
		p++;
		colon = rb + 1;
		v6 = 1;
	} else {
		if ((colon = strrchr(p, ':')) == NULL || memchr(p, ':', (size_t)(colon - p)) != NULL)
			return RL_EINVAL;            /* no port, or a bare IPv6 literal */
		hl = (size_t)(colon - p);
	}
	if (hl >= sizeof host)
		return RL_EINVAL;
	memcpy(host, p, hl);
	host[hl] = 0;
	if (hl == 0 && !v6)
		strcpy(host, "127.0.0.1");
	for (size_t i = 0; host[i]; i++)
		if (host[i] == '/' || host[i] == '@' || host[i] == '?' || host[i] == '#' || host[i] <= ' ')
			return RL_EINVAL;
	port = colon + 1;
	if (*port < '0' || *port > '9')
		return RL_EINVAL;
	v = strtol(port, &end, 10);
	if (*end != 0 && strcmp(end, "/") != 0)
		return RL_EINVAL;
	if (v < 0 || v > 65535 || (v6 && hl == 0))
		return RL_EINVAL;
	*loopback = is_loopback(host);
	w = snprintf(url, n, v6 ? "http://[%s]:%ld" : "http://%s:%ld", host, v);
	return w < 0 || (size_t)w >= n ? RL_ETOOBIG : RL_OK;
}

/* ---- Prometheus text -------------------------------------------------------------------------------- */

enum { M_GAUGE, M_COUNTER };

typedef struct metric {
	const char *path;      /* in the stats JSON, dot-separated */
	const char *name;
	int type;
	const char *help;
	const char *label;     /* label="value" or NULL */
} metric;

static const metric metrics[] = {
	{ "version", "rlqueue_trainer_version", M_GAUGE, "Policy version the trainer last reported.", NULL },
	{ "max_staleness", "rlqueue_max_staleness", M_GAUGE, "Staleness bound K (versions).", NULL },
	{ "autok.max", "rlqueue_autok_max_staleness_max", M_GAUGE, "--max-staleness auto: the largest K it may choose.", NULL },
	{ "autok.changes", "rlqueue_autok_changes_total", M_COUNTER, "--max-staleness auto: changes of K.", NULL },
	{ "autok.windows", "rlqueue_autok_windows_total", M_COUNTER, "--max-staleness auto: windows of trainer steps decided on.", NULL },
	{ "autok.train_idle_frac", "rlqueue_autok_idle_fraction", M_GAUGE,
	  "--max-staleness auto: idle fraction of the stage over the last window.", "stage=\"train\"" },
	{ "autok.rollout_idle_frac", "rlqueue_autok_idle_fraction", M_GAUGE, NULL, "stage=\"rollout\"" },
	{ "autok.bubble", "rlqueue_autok_bubble_fraction", M_GAUGE,
	  "--max-staleness auto: the smaller of the two idle fractions, the time K can give back.", NULL },
	{ "autok.drift", "rlqueue_autok_drift", M_GAUGE, "--max-staleness auto: mean |actor/ppo_kl| over the last window.", NULL },
	{ "train_batch", "rlqueue_train_batch", M_GAUGE, "Groups per trainer step, for the gate (0: no gate).", NULL },
	{ "inflight", "rlqueue_inflight_samples", M_GAUGE, "Samples in flight and buffered, counted by the gate.", NULL },
	{ "inflight_cap", "rlqueue_inflight_cap_samples", M_GAUGE, "Gate bound (K+1) x batch (0: none).", NULL },
	{ "bytes", "rlqueue_memory_bytes", M_GAUGE, "Bytes of stored records.", NULL },
	{ "max_bytes", "rlqueue_memory_max_bytes", M_GAUGE, "Memory bound on stored records.", NULL },
	{ "groups", "rlqueue_groups", M_GAUGE, "Groups the broker holds.", NULL },
	{ "ready_groups", "rlqueue_ready_groups", M_GAUGE, "Complete scored groups waiting for the trainer.", NULL },
	{ "leases", "rlqueue_leases", M_GAUGE, "Leases outstanding.", NULL },
	{ "depth.prompt", "rlqueue_depth", M_GAUGE, "Records per state.", "state=\"prompt\"" },
	{ "depth.leased", "rlqueue_depth", M_GAUGE, NULL, "state=\"leased\"" },
	{ "depth.generated", "rlqueue_depth", M_GAUGE, NULL, "state=\"generated\"" },
	{ "depth.scoring", "rlqueue_depth", M_GAUGE, NULL, "state=\"scoring\"" },
	{ "depth.scored", "rlqueue_depth", M_GAUGE, NULL, "state=\"scored\"" },
	{ "depth.training", "rlqueue_depth", M_GAUGE, NULL, "state=\"training\"" },
	{ "depth.expanded", "rlqueue_depth", M_GAUGE, NULL, "state=\"expanded\"" },
	{ "total.put_prompt", "rlqueue_put_records_total", M_COUNTER, "Records accepted, by kind.", "kind=\"prompt\"" },
	{ "total.put_generated", "rlqueue_put_records_total", M_COUNTER, NULL, "kind=\"generated\"" },
	{ "total.put_scored", "rlqueue_put_records_total", M_COUNTER, NULL, "kind=\"scored\"" },
	{ "total.leased_rollout", "rlqueue_leased_records_total", M_COUNTER, "Records leased, by stage.", "stage=\"rollout\"" },
	{ "total.leased_reward", "rlqueue_leased_records_total", M_COUNTER, NULL, "stage=\"reward\"" },
	{ "total.leased_train", "rlqueue_leased_records_total", M_COUNTER, NULL, "stage=\"train\"" },
	{ "total.done", "rlqueue_done_records_total", M_COUNTER, "Records acknowledged by the trainer.", NULL },
	{ "rate.put_prompt", "rlqueue_put_records_per_second", M_GAUGE, "Records accepted per second over the broker's window, by kind.", "kind=\"prompt\"" },
	{ "rate.put_generated", "rlqueue_put_records_per_second", M_GAUGE, NULL, "kind=\"generated\"" },
	{ "rate.put_scored", "rlqueue_put_records_per_second", M_GAUGE, NULL, "kind=\"scored\"" },
	{ "rate.leased_rollout", "rlqueue_leased_records_per_second", M_GAUGE, "Records leased per second over the broker's window, by stage.", "stage=\"rollout\"" },
	{ "rate.leased_reward", "rlqueue_leased_records_per_second", M_GAUGE, NULL, "stage=\"reward\"" },
	{ "rate.leased_train", "rlqueue_leased_records_per_second", M_GAUGE, NULL, "stage=\"train\"" },
	{ "rate.done", "rlqueue_done_records_per_second", M_GAUGE, "Records acknowledged per second over the broker's window.", NULL },
	{ "rate.window_s", "rlqueue_rate_window_seconds", M_GAUGE, "Length of the window the rates are taken over.", NULL },
	{ "total.duplicates", "rlqueue_duplicates_total", M_COUNTER, "Records dropped as already known.", NULL },
	{ "total.rejected", "rlqueue_rejected_total", M_COUNTER, "Records rejected.", NULL },
	{ "total.expired_leases", "rlqueue_lease_expiries_total", M_COUNTER, "Leases that expired unacknowledged.", NULL },
	{ "total.expired_records", "rlqueue_lease_expired_records_total", M_COUNTER, "Records returned to the pool by expired leases.", NULL },
	{ "total.released", "rlqueue_released_records_total", M_COUNTER, "Records released by their lessee.", NULL },
	{ "total.late_acks", "rlqueue_late_acks_total", M_COUNTER, "Records acknowledged after their lease expired or no longer held them.", NULL },
	{ "total.busy", "rlqueue_busy_replies_total", M_COUNTER, "Puts answered busy (memory bound).", NULL },
	{ "total.gate_blocked", "rlqueue_gate_blocked_total", M_COUNTER, "Prompt leases held back by the staleness gate.", NULL },
	{ "total.stale_dropped", "rlqueue_stale_dropped_total", M_COUNTER, "Samples dropped as older than v-K.", NULL },
	{ "total.stale_regenerated", "rlqueue_stale_regenerated_total", M_COUNTER, "Samples of stale groups dropped so that their prompt is generated again.", NULL },
	{ "total.unversioned", "rlqueue_unversioned_total", M_COUNTER, "Samples trained that carried no version.", NULL },
	{ "total.early_stops", "rlqueue_early_stops_total", M_COUNTER, "Early stops (--oversample) that aborted stragglers.", NULL },
	{ "total.abort_requeued", "rlqueue_aborted_prompts_total", M_COUNTER, "Straggler prompts aborted by early stop, by what became of them.", "outcome=\"requeued\"" },
	{ "total.abort_dropped", "rlqueue_aborted_prompts_total", M_COUNTER, NULL, "outcome=\"dropped\"" },
	{ "total.abort_dropped_samples", "rlqueue_aborted_dropped_samples_total", M_COUNTER, "Samples of dropped stragglers' groups that had arrived.", NULL },
	{ "total.abort_late", "rlqueue_aborted_late_samples_total", M_COUNTER, "Samples of an aborted attempt put late, refused.", NULL },
	{ "complete_groups", "rlqueue_complete_groups", M_GAUGE, "Groups complete and not yet trained (early stop closes the step at (K+1) x B).", NULL },
	{ "journal.bytes", "rlqueue_journal_bytes", M_GAUGE, "Size of the journal.", NULL },
	{ "journal.syncs", "rlqueue_journal_syncs_total", M_COUNTER, "Journal fsyncs.", NULL },
	{ "journal.compactions", "rlqueue_journal_compactions_total", M_COUNTER, "Journal compactions.", NULL },
	{ "server.requests", "rlqueue_requests_total", M_COUNTER, "Requests served.", NULL },
	{ "server.bad_requests", "rlqueue_bad_requests_total", M_COUNTER, "Malformed requests.", NULL },
	{ "server.waiting", "rlqueue_waiting_requests", M_GAUGE, "Lease requests waiting (long poll).", NULL },
	{ "server.contexts", "rlqueue_contexts", M_GAUGE, "Requests the broker serves at once.", NULL },
	{ "server.decompress_s", "rlqueue_server_seconds_total", M_COUNTER, "Broker time, by part.", "part=\"decompress\"" },
	{ "server.compress_s", "rlqueue_server_seconds_total", M_COUNTER, NULL, "part=\"compress\"" },
	{ "server.state_s", "rlqueue_server_seconds_total", M_COUNTER, NULL, "part=\"state\"" },
	{ "server.journal_s", "rlqueue_server_seconds_total", M_COUNTER, NULL, "part=\"journal\"" },
	{ "server.lock_wait_s", "rlqueue_server_seconds_total", M_COUNTER, NULL, "part=\"lock_wait\"" },
	{ "server.reports", "rlqueue_reports_total", M_COUNTER, "Stats reports taken from stage workers.", NULL },
	{ "stages.rollout.live", "rlqueue_stage_workers", M_GAUGE, "Workers reporting, by stage.", "stage=\"rollout\"" },
	{ "stages.reward.live", "rlqueue_stage_workers", M_GAUGE, NULL, "stage=\"reward\"" },
	{ "stages.train.live", "rlqueue_stage_workers", M_GAUGE, NULL, "stage=\"train\"" },
	{ "stages.rollout.records_per_s", "rlqueue_stage_records_per_second", M_GAUGE,
	  "Records per second the stage's workers reported (sum over live workers).", "stage=\"rollout\"" },
	{ "stages.reward.records_per_s", "rlqueue_stage_records_per_second", M_GAUGE, NULL, "stage=\"reward\"" },
	{ "stages.train.records_per_s", "rlqueue_stage_records_per_second", M_GAUGE, NULL, "stage=\"train\"" },
	{ "stages.rollout.tokens_per_s", "rlqueue_stage_tokens_per_second", M_GAUGE,
	  "Tokens per second the stage's workers reported (sum over live workers).", "stage=\"rollout\"" },
	{ "stages.reward.tokens_per_s", "rlqueue_stage_tokens_per_second", M_GAUGE, NULL, "stage=\"reward\"" },
	{ "stages.train.tokens_per_s", "rlqueue_stage_tokens_per_second", M_GAUGE, NULL, "stage=\"train\"" },
	{ "stages.rollout.busy_frac", "rlqueue_stage_busy_fraction", M_GAUGE,
	  "Mean busy fraction of the stage's live workers.", "stage=\"rollout\"" },
	{ "stages.reward.busy_frac", "rlqueue_stage_busy_fraction", M_GAUGE, NULL, "stage=\"reward\"" },
	{ "stages.train.busy_frac", "rlqueue_stage_busy_fraction", M_GAUGE, NULL, "stage=\"train\"" },
	{ "train.version", "rlqueue_train_step_version", M_GAUGE, "Policy version after the trainer's last reported step.", NULL },
	{ "train.reward_mean", "rlqueue_train_reward_mean", M_GAUGE, "Mean reward of the last step's samples (critic/score/mean).", NULL },
	{ "train.response_length", "rlqueue_train_response_length_mean", M_GAUGE, "Mean response length of the last step (tokens).", NULL },
	{ "train.ppo_kl", "rlqueue_train_ppo_kl", M_GAUGE, "KL between the old and the updated policy in the last step (actor/ppo_kl).", NULL },
	{ "train.kl_ref", "rlqueue_train_kl_ref", M_GAUGE, "KL to the reference policy in the last step (actor/kl_loss, or actor/reward_kl_penalty).", NULL },
	{ "train.entropy", "rlqueue_train_entropy", M_GAUGE, "Mean token entropy of the last step.", NULL },
	{ "train.step_s", "rlqueue_train_step_seconds", M_GAUGE, "Length of the last step (timing_s/step).", NULL },
};

/* Per-worker families: one sample per worker in the stats' "workers" array. */
typedef struct wmetric {
	const char *key;       /* in the worker object ("gpu." prefix: in its gpu object) */
	const char *name;
	int type;
	const char *help;
} wmetric;

static const wmetric wmetrics[] = {
	{ "busy_frac", "rlqueue_worker_busy_fraction", M_GAUGE,
	  "Share of the worker's last report interval spent computing rather than waiting on the queue or weights." },
	{ "busy_s", "rlqueue_worker_busy_seconds_total", M_COUNTER, "Seconds the worker spent computing." },
	{ "idle_s", "rlqueue_worker_idle_seconds_total", M_COUNTER, "Seconds the worker spent waiting on the queue or weights." },
	{ "records", "rlqueue_worker_records_total", M_COUNTER, "Records the worker generated, scored or trained." },
	{ "tokens", "rlqueue_worker_tokens_total", M_COUNTER, "Tokens the worker generated or trained." },
	{ "records_per_s", "rlqueue_worker_records_per_second", M_GAUGE, "Records per second over the worker's last report interval." },
	{ "tokens_per_s", "rlqueue_worker_tokens_per_second", M_GAUGE, "Tokens per second over the worker's last report interval." },
	{ "up", "rlqueue_worker_up", M_GAUGE, "1 while the worker reports, 0 once it exited or fell silent." },
	{ "age_s", "rlqueue_worker_report_age_seconds", M_GAUGE, "Seconds since the worker's last report." },
	{ "gpu.util", "rlqueue_worker_gpu_utilization_ratio", M_GAUGE, "GPU utilisation NVML reported (0..1)." },
	{ "gpu.mem_util", "rlqueue_worker_gpu_memory_utilization_ratio", M_GAUGE, "GPU memory bandwidth utilisation NVML reported (0..1)." },
	{ "gpu.mem_used", "rlqueue_worker_gpu_memory_used_bytes", M_GAUGE, "GPU memory in use (NVML)." },
	{ "gpu.mem_total", "rlqueue_worker_gpu_memory_total_bytes", M_GAUGE, "GPU memory in total (NVML)." },
};

static const cJSON *
lookup(const cJSON *o, const char *path)
{
	char key[64];
	const char *dot;

	while ((dot = strchr(path, '.')) != NULL) {
		size_t n = (size_t)(dot - path);
		if (n >= sizeof key)
			return NULL;
		memcpy(key, path, n);
		key[n] = 0;
		o = cJSON_GetObjectItemCaseSensitive(o, key);
		path = dot + 1;
	}
	o = cJSON_GetObjectItemCaseSensitive(o, path);
	return cJSON_IsNumber(o) ? o : NULL;
}

static int
put_num(rl_buf *out, double v)
{
	if (v != v)
		return rl_buf_printf(out, "NaN\n");
	if (v > 1e308 || v < -1e308)
		return rl_buf_printf(out, v > 0 ? "+Inf\n" : "-Inf\n");
	return rl_buf_printf(out, "%.17g\n", v);
}

/* A label value in quotes, with \\, \" and newlines escaped. */
static int
put_label(rl_buf *out, const char *v)
{
	int rv = rl_buf_putc(out, '"');

	for (; rv == 0 && *v; v++) {
		if (*v == '\\' || *v == '"')
			rv = rl_buf_printf(out, "\\%c", *v);
		else if (*v == '\n')
			rv = rl_buf_printf(out, "\\n");
		else
			rv = rl_buf_putc(out, *v);
	}
	return rv ? rv : rl_buf_putc(out, '"');
}

static int
header(rl_buf *out, const char *name, const char *type, const char *help, const char **last)
{
	int rv = RL_OK;

	if (*last && strcmp(*last, name) == 0)
		return RL_OK;
	*last = name;
	if (help)
		rv = rl_buf_printf(out, "# HELP %s %s\n", name, help);
	if (rv == 0)
		rv = rl_buf_printf(out, "# TYPE %s %s\n", name, type);
	return rv;
}

int
rl_qhttp_prometheus(rl_buf *out, const char *json)
{
	cJSON *o = cJSON_Parse(json);
	const cJSON *h, *e, *c;
	const char *last = NULL, *help = NULL;
	double cum = 0;
	int rv = RL_OK, i = 0, nb;

	if (!cJSON_IsObject(o)) {
		cJSON_Delete(o);
		return RL_EFORMAT;
	}
	for (size_t k = 0; k < RL_ARRAY_LEN(metrics) && rv == 0; k++) {
		const metric *m = &metrics[k];
		const cJSON *v = lookup(o, m->path);
		if (m->help)
			help = m->help;
		if (v == NULL)
			continue;
		rv = header(out, m->name, m->type == M_COUNTER ? "counter" : "gauge", help, &last);
		if (rv == 0)
			rv = m->label ? rl_buf_printf(out, "%s{%s} ", m->name, m->label) : rl_buf_printf(out, "%s ", m->name);
		if (rv == 0)
			rv = put_num(out, v->valuedouble);
	}
	/* staleness: buckets 0..7 and 8+ -> a cumulative histogram with le 0..7, +Inf */
	h = cJSON_GetObjectItemCaseSensitive(o, "staleness");
	nb = cJSON_GetArraySize(h);
	if (rv == 0 && cJSON_IsArray(h) && nb > 0) {
		rv = header(out, "rlqueue_staleness", "histogram",
		    "Samples handed to the trainer by v minus the version that generated them.", &last);
		cJSON_ArrayForEach(e, h) {
			if (rv != 0 || !cJSON_IsNumber(e))
				break;
			cum += e->valuedouble;
			if (i < nb - 1)
				rv = rl_buf_printf(out, "rlqueue_staleness_bucket{le=\"%d\"} %.17g\n", i, cum);
			i++;
		}
		if (rv == 0)
			rv = rl_buf_printf(out, "rlqueue_staleness_bucket{le=\"+Inf\"} %.17g\n", cum);
		if (rv == 0 && (c = lookup(o, "staleness_sum")) != NULL)
			rv = rl_buf_printf(out, "rlqueue_staleness_sum %.17g\n", c->valuedouble);
		if (rv == 0)
			rv = rl_buf_printf(out, "rlqueue_staleness_count %.17g\n", cum);
	}
	/* per worker: role and worker labels (the broker admits only [A-Za-z0-9._:@/+-] in ids,
	 * escaped anyway) */
	h = cJSON_GetObjectItemCaseSensitive(o, "workers");
	for (size_t k = 0; rv == 0 && cJSON_IsArray(h) && k < RL_ARRAY_LEN(wmetrics); k++) {
		const wmetric *m = &wmetrics[k];
		int gpu = strncmp(m->key, "gpu.", 4) == 0;
		cJSON_ArrayForEach(e, h) {
			const cJSON *src = gpu ? cJSON_GetObjectItemCaseSensitive(e, "gpu") : e, *v, *role, *id, *gi;
			double val;
			if (rv != 0 || src == NULL)
				continue;
			role = cJSON_GetObjectItemCaseSensitive(e, "role");
			id = cJSON_GetObjectItemCaseSensitive(e, "worker");
			if (!cJSON_IsString(role) || !cJSON_IsString(id))
				continue;
			if (strcmp(m->key, "up") == 0) {
				v = cJSON_GetObjectItemCaseSensitive(e, "state");
				if (!cJSON_IsString(v))
					continue;
				val = strcmp(v->valuestring, "live") == 0;
			} else {
				v = cJSON_GetObjectItemCaseSensitive(src, gpu ? m->key + 4 : m->key);
				if (!cJSON_IsNumber(v))
					continue;
				val = v->valuedouble;
			}
			rv = header(out, m->name, m->type == M_COUNTER ? "counter" : "gauge", m->help, &last);
			if (rv == 0)
				rv = rl_buf_printf(out, "%s{role=", m->name);
			if (rv == 0)
				rv = put_label(out, role->valuestring);
			if (rv == 0)
				rv = rl_buf_printf(out, ",worker=");
			if (rv == 0)
				rv = put_label(out, id->valuestring);
			if (rv == 0 && gpu && cJSON_IsNumber(gi = cJSON_GetObjectItemCaseSensitive(src, "index")))
				rv = rl_buf_printf(out, ",gpu=\"%d\"", (int)gi->valuedouble);
			if (rv == 0)
				rv = rl_buf_printf(out, "} ");
			if (rv == 0)
				rv = put_num(out, val);
		}
	}
	cJSON_Delete(o);
	return rv;
}

/* ---- routes ----------------------------------------------------------------------------------------- */

static void
text(rli_httpd_reply *rep, int status, const char *msg)
{
	rep->status = status;
	rep->type = "text/plain; charset=utf-8";
	rep->body = msg;
	rep->len = strlen(msg);
}

/* With a shared key, the data routes (/api/stats, /metrics) need
 * "Authorization: Bearer KEY"; the page itself holds no data. */
static int
authorized(const char *v)
{
	size_t klen, n;
	const uint8_t *key = rli_auth_key(&klen);
	uint8_t want[RLI_AUTH_MAC_LEN], got[RLI_AUTH_MAC_LEN];

	if (!key)
		return 1;
	if (v == NULL || strncasecmp(v, "Bearer ", 7) != 0)
		return 0;
	v += 7;
	while (*v == ' ')
		v++;
	n = strlen(v);
	while (n && (v[n - 1] == ' ' || v[n - 1] == '\r'))
		n--;
	/* compare MACs of both, so the time depends on neither the key's length
	 * nor where the two differ */
	rli_auth_mac(want, key, klen, NULL, 0);
	rli_auth_mac(got, v, n, NULL, 0);
	return rli_auth_equal(want, got, sizeof want);
}

static void
serve_stats(rl_qhttp *h, rli_httpd_reply *rep, int prom)
{
	char *json = NULL;
	rl_buf b;
	int rv;

	if ((rv = h->cfg.stats(h->cfg.arg, &json)) != 0) {
		text(rep, 500, rl_strerror(rv));
		return;
	}
	if (!prom) {
		rep->status = 200;
		rep->type = "application/json";
		rep->owned = json;
		rep->len = strlen(json);
		return;
	}
	rl_buf_init(&b);
	rv = rl_qhttp_prometheus(&b, json);
	free(json);
	if (rv != 0) {
		rl_buf_fini(&b);
		text(rep, 500, rl_strerror(rv));
		return;
	}
	rep->status = 200;
	rep->type = "text/plain; version=0.0.4; charset=utf-8";
	rep->len = b.len;
	rep->owned = (char *)rl_buf_steal(&b, NULL);
}

/* Every route takes GET and HEAD only; the server has refused bodies. */
static void
route(void *arg, const rli_httpd_req *rq, rli_httpd_reply *rep)
{
	static const char unauth[] = "this broker has a shared key: send 'Authorization: Bearer KEY' "
	    "(the contents of its --auth-key-file)\n";
	rl_qhttp *h = arg;
	int page = strcmp(rq->path, "/") == 0, prom = strcmp(rq->path, "/metrics") == 0;

	if (!page && !prom && strcmp(rq->path, "/api/stats") != 0) {
		text(rep, 404, "no such page: this listener serves /, /metrics and /api/stats\n");
		return;
	}
	if (strcmp(rq->method, "GET") != 0 && strcmp(rq->method, "HEAD") != 0) {
		text(rep, 405, "only GET and HEAD are served here\n");
		rep->extra = "Allow: GET, HEAD\r\n";
		return;
	}
	if (page) {   /* no data in it, so no key */
		rep->status = 200;
		rep->type = "text/html; charset=utf-8";
		rep->body = h->page.p;
		rep->len = h->page.len;
		return;
	}
	if (!authorized(rq->authorization)) {
		text(rep, 401, unauth);
		rep->extra = "WWW-Authenticate: Bearer realm=\"rl-queue\"\r\n";
		return;
	}
	serve_stats(h, rep, prom);
}

/* ---- listener --------------------------------------------------------------------------------------- */

void
rl_qhttp_split_url(char *host, size_t hn, char *port, size_t pn, const char *url)
{
	const char *p = url + 7, *colon = strrchr(p, ':');
	size_t l;

	if (*p == '[')
		p++;
	l = (size_t)(colon - p) - (colon[-1] == ']');
	snprintf(host, hn, "%.*s", (int)l, p);
	snprintf(port, pn, "%s", colon + 1);
}

int
rl_qhttp_open(rl_qhttp **out, const rl_qhttp_config *cfg)
{
	rl_qhttp *h;
	rli_httpd_config sc = { 0 };
	char host[256], port[16];
	int rv = RL_OK, loop;

	*out = NULL;
	if ((h = rl_try_calloc(1, sizeof *h, "http listener")) == NULL)
		return RL_ENOMEM;
	h->cfg = *cfg;
	if ((rv = rl_qhttp_parse_addr(h->url, sizeof h->url, &loop, cfg->addr)) != 0) {
		rl_error("--http: '%s' is not HOST:PORT, [IPV6]:PORT or :PORT", cfg->addr);
		rv = RL_EINVAL;
		goto fail;
	}
	if (!loop && !cfg->allow_public) {
		rl_error("--http: refusing to serve on '%s': not a loopback address", cfg->addr);
		rl_hint("the listener has no authentication; add --http-public to serve beyond this machine");
		rv = RL_EINVAL;
		goto fail;
	}
	if (!loop)
		rl_warn("--http: serving stats without authentication on '%s'", h->url);
	if ((rv = rl_qhttp_page_build(&h->page, NULL)) != 0)
		goto fail;
	rl_qhttp_split_url(host, sizeof host, port, sizeof port, h->url);
	sc.host = host;
	sc.port = port;
	sc.max_conns = cfg->max_conns;
	sc.timeout_s = cfg->timeout_s;
	sc.fn = route;
	sc.arg = h;
	if ((rv = rli_httpd_open(&h->srv, &sc, h->url)) != 0)
		goto fail;
	if (strcmp(port, "0") == 0) {
		char *colon = strrchr(h->url, ':');
		snprintf(colon + 1, sizeof h->url - (size_t)(colon + 1 - h->url), "%d", rli_httpd_port(h->srv));
	}
	*out = h;
	return RL_OK;
fail:
	rl_qhttp_close(h);
	return rv;
}

int
rl_qhttp_page_build(rl_buf *out, const char *chartjs)
{
	static const char marker[] = "<!--CHARTJS-->";
	const char *at = strstr(rl_qhttp_page, marker), *path = chartjs;
	char *js = NULL, why[600];
	size_t jn = 0;
	int rv;

	if (path == NULL)
		path = getenv("RL_CHARTJS") && *getenv("RL_CHARTJS") ? getenv("RL_CHARTJS") : RL_QHTTP_CHARTJS;
	why[0] = 0;
	if (access(path, R_OK) != 0 || rl_io_read_file(path, 16u << 20, &js, &jn) != RL_OK)
		snprintf(why, sizeof why, "cannot read Chart.js from '%s' (%s): install libjs-chart.js or set RL_CHARTJS",
		    path, strerror(errno));
	else if (strstr(js, "</script") != NULL || strstr(js, "</SCRIPT") != NULL)
		snprintf(why, sizeof why, "'%s' holds '</script' and cannot be put inline", path);
	out->len = 0;
	if (at == NULL)   /* the page is built with the marker; without it, as it is */
		return rl_buf_append(out, rl_qhttp_page, strlen(rl_qhttp_page));
	if ((rv = rl_buf_append(out, rl_qhttp_page, (size_t)(at - rl_qhttp_page))) != 0)
		goto out;
	if (why[0] == 0) {
		if ((rv = rl_buf_printf(out, "<script>\n")) != 0 || (rv = rl_buf_append(out, js, jn)) != 0 ||
		    (rv = rl_buf_printf(out, "\n</script>\n")) != 0)
			goto out;
	} else {
		static int warned;
		if (!warned++)
			rl_warn("--http: the dashboard has no charts: %s", why);
		/* the reason goes into a JS string: no quote, backslash or '<' from a path */
		for (char *p = why; *p; p++)
			if (*p == '"' || *p == '\\' || *p == '<' || *p == '>' || (unsigned char)*p < 0x20)
				*p = '?';
		if ((rv = rl_buf_printf(out, "<script>window.CHARTJS_MISSING = \"%s\";</script>\n", why)) != 0)
			goto out;
	}
	rv = rl_buf_append(out, at + strlen(marker), strlen(at + strlen(marker)) + 1);
	if (rv == 0)
		out->len--;   /* the NUL is kept past the end */
out:
	free(js);
	return rv;
}

const char *
rl_qhttp_url(const rl_qhttp *h)
{
	return h->url;
}

void
rl_qhttp_close(rl_qhttp *h)
{
	if (h == NULL)
		return;
	rli_httpd_close(h->srv);   /* joins the thread before the page it sends is freed */
	rl_buf_fini(&h->page);
	free(h);
}

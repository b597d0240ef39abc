/*
 * test_wstat.c — stage stats: the client side (lib/queue/wstat.c: busy/idle
 * accounting, the report it builds, train steps, NVML absent), the
 * broker's worker table (lib/queue/qserve_workers.c: busy fraction and rates over
 * a window, timeline, restarts, TTL, train history without duplicates), and
 * a live broker (inproc) that takes good reports, refuses malformed and
 * oversized ones with a reason and keeps serving, and shows reports sent by
 * rl_wstat's thread, final one included.
 */
#include <cjson/cJSON.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "queue/qproto.h"
#include "queue/qserve.h"
#include "queue/qserve_workers.h"
#include "t.h"
#include "queue/wstat.h"

static double
jnum(const cJSON *o, const char *k)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsNumber(e) ? e->valuedouble : NAN;
}

static const cJSON *
worker(const cJSON *stats, const char *id)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(stats, "workers")) {
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(e, "worker");
		if (cJSON_IsString(w) && strcmp(w->valuestring, id) == 0)
			return e;
	}
	return NULL;
}

static cJSON *
table_json(rli_workers *ws, double now)
{
	cJSON *o = cJSON_CreateObject();
	T_EQ_INT(rli_workers_json(ws, o, now), RL_OK);
	return o;
}

static int
rep(rli_workers *ws, double now, const char *fmt, ...)
{
	char buf[4096], why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	return rli_workers_report(ws, buf, strlen(buf), now, why, sizeof why);
}

static void
test_table(void)
{
	rli_workers *ws;
	cJSON *o;
	const cJSON *w, *tl;
	char why[200];

	T_EQ_INT(rli_workers_create(&ws), RL_OK);
	/* first report: its interval is the worker's life so far */
	T_EQ_INT(rep(ws, 100, "{\"role\":\"rollout\",\"worker\":\"a:1\",\"uptime_s\":4,\"busy_s\":3,\"idle_s\":1,"
	    "\"records\":40,\"tokens\":400}"), RL_OK);
	o = table_json(ws, 100.5);
	w = worker(o, "a:1");
	T_OK(w != NULL);
	T_CLOSE(jnum(w, "busy_frac"), 0.75, 1e-12, 0);
	T_CLOSE(jnum(w, "records_per_s"), 10, 1e-12, 0);
	T_CLOSE(jnum(w, "tokens_per_s"), 100, 1e-12, 0);
	T_EQ_STR(cJSON_GetObjectItem(w, "state")->valuestring, "live");
	T_EQ_STR(cJSON_GetObjectItem(w, "device")->valuestring, "cpu");
	T_OK(cJSON_GetObjectItem(w, "gpu") == NULL, "no GPU reported: none shown");
	T_CLOSE(jnum(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stages"), "rollout"), "records_per_s"), 10, 1e-12, 0);
	T_OK(cJSON_GetObjectItem(o, "train") == NULL, "no train step yet");
	cJSON_Delete(o);
	/* second: all idle for 2 s -> the window (both intervals) says 3/6 busy; the timeline 1 then 0 */
	T_EQ_INT(rep(ws, 102, "{\"role\":\"rollout\",\"worker\":\"a:1\",\"uptime_s\":6,\"busy_s\":3,\"idle_s\":3,"
	    "\"records\":40,\"tokens\":400,\"gpu\":{\"index\":1,\"name\":\"X\",\"util\":0.5,\"mem_used\":10,"
	    "\"mem_total\":20}}"), RL_OK);
	o = table_json(ws, 102);
	w = worker(o, "a:1");
	T_CLOSE(jnum(w, "busy_frac"), 0.5, 1e-12, 0);
	T_CLOSE(jnum(w, "records_per_s"), 40.0 / 6, 1e-12, 0);
	tl = cJSON_GetObjectItem(w, "timeline");
	T_EQ_INT(cJSON_GetArraySize(tl), 2);
	T_CLOSE(cJSON_GetArrayItem(tl, 0)->valuedouble, 0.75, 1e-3, 0);
	T_CLOSE(cJSON_GetArrayItem(tl, 1)->valuedouble, 0, 1e-12, 0);
	T_CLOSE(jnum(cJSON_GetObjectItem(w, "gpu"), "util"), 0.5, 0, 0);
	cJSON_Delete(o);
	/* 20 s later, busy throughout: the window (10 s) has forgotten the idle part */
	for (int k = 1; k <= 10; k++)
		T_EQ_INT(rep(ws, 102 + 2 * k, "{\"role\":\"rollout\",\"worker\":\"a:1\",\"uptime_s\":%d,\"busy_s\":%d,"
		    "\"idle_s\":3,\"records\":%d,\"tokens\":400}", 6 + 2 * k, 3 + 2 * k, 40 + 10 * k), RL_OK);
	o = table_json(ws, 122);
	w = worker(o, "a:1");
	T_CLOSE(jnum(w, "busy_frac"), 1, 1e-12, 0);
	T_CLOSE(jnum(w, "records_per_s"), 5, 1e-12, 0);
	T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(w, "timeline")), 12);
	cJSON_Delete(o);
	/* a restart under the same name (uptime went back): counted afresh */
	T_EQ_INT(rep(ws, 123, "{\"role\":\"rollout\",\"worker\":\"a:1\",\"uptime_s\":1,\"busy_s\":0.25,\"idle_s\":0.75,"
	    "\"records\":2,\"tokens\":4}"), RL_OK);
	o = table_json(ws, 123);
	w = worker(o, "a:1");
	T_CLOSE(jnum(w, "busy_frac"), 0.25, 1e-12, 0);
	T_CLOSE(jnum(w, "records_per_s"), 2, 1e-12, 0);
	T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(w, "timeline")), 1);
	cJSON_Delete(o);
	/* the trainer's steps: history in order, a step sent twice kept once, NaN-free */
	T_EQ_INT(rep(ws, 124, "{\"role\":\"train\",\"worker\":\"t:9\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":0,"
	    "\"records\":8,\"tokens\":80,\"steps\":[{\"version\":1,\"reward_mean\":0.5,\"response_length\":7},"
	    "{\"version\":2,\"reward_mean\":0.75,\"ppo_kl\":0.01}]}"), RL_OK);
	T_EQ_INT(rep(ws, 125, "{\"role\":\"train\",\"worker\":\"t:9\",\"uptime_s\":2,\"busy_s\":1,\"idle_s\":1,"
	    "\"records\":8,\"tokens\":80,\"final\":true,\"steps\":[{\"version\":2,\"reward_mean\":0.75},"
	    "{\"version\":3,\"reward_mean\":1}]}"), RL_OK);
	o = table_json(ws, 125);
	{
		const cJSON *h = cJSON_GetObjectItem(o, "train_history"), *t = cJSON_GetObjectItem(o, "train");
		const cJSON *rw = cJSON_GetObjectItem(h, "reward_mean"), *len = cJSON_GetObjectItem(h, "response_length");
		T_EQ_INT(cJSON_GetArraySize(rw), 3);
		T_CLOSE(cJSON_GetArrayItem(rw, 2)->valuedouble, 1, 0, 0);
		T_OK(cJSON_IsNumber(cJSON_GetArrayItem(len, 0)) && cJSON_IsNull(cJSON_GetArrayItem(len, 1)),
		    "a field a step lacks is null");
		T_CLOSE(jnum(t, "version"), 3, 0, 0);
		T_CLOSE(jnum(t, "reward_mean"), 1, 0, 0);
		T_EQ_STR(cJSON_GetObjectItem(worker(o, "t:9"), "state")->valuestring, "exited");
		/* an exited worker is not counted in its stage's rate */
		T_EQ_INT(jnum(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stages"), "train"), "live"), 0);
		T_EQ_INT(jnum(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stages"), "train"), "workers"), 1);
		T_OK(cJSON_GetObjectItem(o, "stage_history") != NULL);
	}
	cJSON_Delete(o);
	/* silent, then gone after the TTL */
	o = table_json(ws, 123 + RLI_WORKERS_SILENT + 1);
	T_EQ_STR(cJSON_GetObjectItem(worker(o, "a:1"), "state")->valuestring, "silent");
	cJSON_Delete(o);
	o = table_json(ws, 126 + RLI_WORKERS_TTL);
	T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(o, "workers")), 0);
	cJSON_Delete(o);
	/* malformed reports: refused with a reason, the table unchanged */
	{
		static const char *const bad[] = {
			"", "[]", "{", "{\"role\":\"rollout\"} x", "nope",
			"{\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"judge\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a b\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\\\"}\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":-1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":\"1\",\"idle_s\":1,\"records\":1,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1e300,\"tokens\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,"
			"\"final\":1}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,"
			"\"gpu\":{\"index\":0,\"util\":2,\"mem_used\":1,\"mem_total\":2}}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,"
			"\"steps\":[{\"reward_mean\":1}]}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,"
			"\"steps\":[1]}",
			"{\"role\":\"reward\",\"worker\":\"a\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,"
			"\"device\":\"cu da\"}",
		};
		for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
			why[0] = 0;
			T_EQ_INT(rli_workers_report(ws, bad[i], strlen(bad[i]), 130, why, sizeof why), RL_EFORMAT);
			T_OK(strncmp(why, "malformed stats report", 22) == 0, "%s", why);
		}
		/* a report of 300 steps */
		{
			char *big = malloc(20000);
			size_t n = (size_t)sprintf(big, "{\"role\":\"train\",\"worker\":\"b\",\"uptime_s\":1,\"busy_s\":1,"
			    "\"idle_s\":1,\"records\":1,\"tokens\":1,\"steps\":[");
			for (int k = 0; k < 300; k++)
				n += (size_t)sprintf(big + n, "%s{\"version\":%d}", k ? "," : "", k + 100);
			strcpy(big + n, "]}");
			T_EQ_INT(rli_workers_report(ws, big, strlen(big), 130, why, sizeof why), RL_EFORMAT);
			free(big);
		}
		/* a NUL inside the text */
		T_EQ_INT(rli_workers_report(ws, "{\"role\":\"rollout\"}\0{}", 21, 130, why, sizeof why), RL_EFORMAT);
		o = table_json(ws, 130);
		T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(o, "workers")), 0);
		cJSON_Delete(o);
	}
	/* more workers than the table holds: the longest silent makes room */
	for (int k = 0; k < RLI_WORKERS_MAX + 5; k++)
		T_EQ_INT(rep(ws, 200 + k * 0.01, "{\"role\":\"reward\",\"worker\":\"w%d\",\"uptime_s\":1,\"busy_s\":1,"
		    "\"idle_s\":0,\"records\":1,\"tokens\":0}", k), RL_OK);
	o = table_json(ws, 205);
	T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(o, "workers")), RLI_WORKERS_MAX);
	T_OK(worker(o, "w0") == NULL && worker(o, "w260") != NULL);
	cJSON_Delete(o);
	rli_workers_destroy(ws);
}

static void
test_client(void)
{
	rl_wstat *w;
	rl_nvml *nv;
	char *txt;
	cJSON *o;

	/* NVML: never faked.  No CUDA device, no GPU; a library that is not there, no GPU */
	T_EQ_INT(rl_nvml_open(&nv, "cpu"), RL_ENODEV);
	T_EQ_INT(rl_nvml_open(&nv, "cuda:x"), RL_ENODEV);
	setenv("RL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
	T_EQ_INT(rl_nvml_open(&nv, "cuda:0"), RL_ENODEV);
	T_OK(nv == NULL);
	unsetenv("RL_NVML_LIB");
	/* off */
	setenv("RL_STATS_INTERVAL", "0", 1);
	T_EQ_INT(rl_wstat_open(&w, "inproc://nowhere", "train", "cpu"), RL_OK);
	T_OK(w == NULL);
	rl_wstat_phase(w, RL_WSTAT_BUSY);   /* NULL: nothing happens */
	rl_wstat_add(w, 1, 1);
	rl_wstat_close(w);
	setenv("RL_STATS_INTERVAL", "soon", 1);
	T_EQ_INT(rl_wstat_open(&w, "inproc://nowhere", "train", "cpu"), RL_EINVAL);
	setenv("RL_STATS_INTERVAL", "100", 1);
	T_EQ_INT(rl_wstat_open(&w, "inproc://nowhere", "judge", "cpu"), RL_EINVAL);
	setenv("RL_WORKER_ID", "node 7/gpu\"0", 1);
	T_EQ_INT(rl_wstat_open(&w, "inproc://nowhere", "train", "cpu"), RL_OK);
	/* 0.2 s idle, 0.3 s busy, 0.1 s idle */
	usleep(200000);
	rl_wstat_phase(w, RL_WSTAT_BUSY);
	usleep(300000);
	rl_wstat_phase(w, RL_WSTAT_IDLE);
	usleep(100000);
	rl_wstat_add(w, 5, 50);
	rl_wstat_add(w, 1, 10);
	rl_wstat_train_metrics(w, "{\"step\":4,\"critic/score/mean\":0.5,\"response_length/mean\":12,"
	    "\"actor/ppo_kl\":0.001,\"actor/entropy\":2,\"timing_s/step\":0.3,\"actor/grad_norm\":1}");
	rl_wstat_train_metrics(w, "{\"step\":5,\"critic/score/mean\":null}");
	/* --kl-in-reward: the KL to the reference is the reward's */
	rl_wstat_train_metrics(w, "{\"step\":6,\"actor/reward_kl_penalty\":0.02,\"actor/reward_kl_penalty_coeff\":0.1}");
	rl_wstat_train_metrics(w, "{\"no step\":1}");
	rl_wstat_train_metrics(w, "not json");
	T_EQ_INT(rl_wstat_report_json(w, 1, &txt), RL_OK);
	o = cJSON_Parse(txt);
	T_OK(o != NULL, "%s", txt);
	T_EQ_STR(cJSON_GetObjectItem(o, "role")->valuestring, "train");
	T_EQ_STR(cJSON_GetObjectItem(o, "worker")->valuestring, "node_7/gpu_0");
	/* sleeps only overshoot; a loaded machine may add a lot */
	T_OK(jnum(o, "busy_s") >= 0.3 && jnum(o, "busy_s") < 0.3 + 0.25, "%g", jnum(o, "busy_s"));
	T_OK(jnum(o, "idle_s") >= 0.3 && jnum(o, "idle_s") < 0.3 + 0.5, "%g", jnum(o, "idle_s"));
	T_CLOSE(jnum(o, "uptime_s"), jnum(o, "busy_s") + jnum(o, "idle_s"), 1e-3, 0);
	T_EQ_INT(jnum(o, "records"), 6);
	T_EQ_INT(jnum(o, "tokens"), 60);
	T_OK(cJSON_IsTrue(cJSON_GetObjectItem(o, "final")));
	T_OK(cJSON_GetObjectItem(o, "gpu") == NULL, "a CPU worker reports no GPU");
	{
		const cJSON *st = cJSON_GetObjectItem(o, "steps"), *s0 = cJSON_GetArrayItem(st, 0), *s1 = cJSON_GetArrayItem(st, 1);
		T_EQ_INT(cJSON_GetArraySize(st), 3);
		T_CLOSE(jnum(cJSON_GetArrayItem(st, 2), "kl_ref"), 0.02, 0, 0);
		T_CLOSE(jnum(s0, "version"), 4, 0, 0);
		T_CLOSE(jnum(s0, "reward_mean"), 0.5, 0, 0);
		T_CLOSE(jnum(s0, "ppo_kl"), 0.001, 0, 0);
		T_CLOSE(jnum(s0, "step_s"), 0.3, 0, 0);
		T_OK(cJSON_GetObjectItem(s0, "kl_ref") == NULL);
		T_OK(cJSON_GetObjectItem(s1, "reward_mean") == NULL, "null is left out");
	}
	/* what the client builds, the broker takes */
	{
		rli_workers *ws;
		char why[200];
		rli_workers_create(&ws);
		T_EQ_INT(rli_workers_report(ws, txt, strlen(txt), 1, why, sizeof why), RL_OK);
		rli_workers_destroy(ws);
	}
	cJSON_Delete(o);
	free(txt);
	rl_wstat_close(w);   /* the broker is not there: returns anyway */
	unsetenv("RL_WORKER_ID");
}

/* A worker that gives the busy share of its intervals (rl-rollout: slots
 * decoding / slots): busy_s takes that share of each, idle_s the rest. */
static void
test_part(void)
{
	rl_wstat *w;
	char *txt;
	cJSON *o;
	double b, i;

	setenv("RL_STATS_INTERVAL", "100", 1);
	T_EQ_INT(rl_wstat_open(&w, "inproc://nowhere", "rollout", "cpu"), RL_OK);
	rl_wstat_phase_part(NULL, RL_WSTAT_IDLE, 0.5);   /* NULL: nothing happens */
	/* 0.1 s idle; 0.4 s at 1 slot of 8 */
	usleep(100000);
	rl_wstat_phase(w, RL_WSTAT_BUSY);
	usleep(400000);
	rl_wstat_phase_part(w, RL_WSTAT_IDLE, 0.125);
	T_EQ_INT(rl_wstat_report_json(w, 0, &txt), RL_OK);
	o = cJSON_Parse(txt);
	b = jnum(o, "busy_s");
	i = jnum(o, "idle_s");
	/* sleeps only overshoot; a loaded machine may add a lot */
	T_OK(b >= 0.05 && b < 0.05 + 0.05, "busy %g", b);
	T_OK(i >= 0.45 && i < 0.45 + 0.5, "idle %g", i);
	T_CLOSE(jnum(o, "uptime_s"), b + i, 1e-3, 0);
	cJSON_Delete(o);
	free(txt);
	/* an open busy interval counts at the last share given, in a report sent
	 * before its own is known; a share out of range: the phase decides */
	rl_wstat_phase(w, RL_WSTAT_BUSY);
	usleep(400000);
	T_EQ_INT(rl_wstat_report_json(w, 0, &txt), RL_OK);
	o = cJSON_Parse(txt);
	T_OK(jnum(o, "busy_s") - b >= 0.05 && jnum(o, "busy_s") - b < 0.05 + 0.05, "busy %g", jnum(o, "busy_s") - b);
	cJSON_Delete(o);
	free(txt);
	rl_wstat_phase_part(w, RL_WSTAT_IDLE, NAN);
	T_EQ_INT(rl_wstat_report_json(w, 0, &txt), RL_OK);
	o = cJSON_Parse(txt);
	T_OK(jnum(o, "busy_s") - b >= 0.4 && jnum(o, "busy_s") - b < 0.4 + 0.2, "busy %g", jnum(o, "busy_s") - b);
	T_CLOSE(jnum(o, "uptime_s"), jnum(o, "busy_s") + jnum(o, "idle_s"), 1e-3, 0);
	cJSON_Delete(o);
	free(txt);
	rl_wstat_close(w);
}

/* ---- a live broker ----------------------------------------------------------------------- */

static volatile sig_atomic_t stop_flag;

static void *
serve(void *arg)
{
	rl_qserve_run(arg, &stop_flag);
	return NULL;
}

/* Sends one raw request; returns the reply's status (-1: no reply) and its body in why. */
static int
raw(nng_socket s, uint16_t flags, uint32_t raw_len, const void *body, size_t n, char *why, size_t wn)
{
	uint8_t hb[RL_QP_HDR_LEN];
	rl_qhdr h = { .op = RL_QOP_REPORT, .flags = flags, .raw_len = raw_len, .req_id = 7 };
	nng_msg *m, *r = NULL;
	rl_qhdr rh;

	rl_qhdr_encode(hb, &h);
	nng_msg_alloc(&m, 0);
	nng_msg_append(m, hb, sizeof hb);
	nng_msg_append(m, body, n);
	if (nng_sendmsg(s, m, 0) != 0 || nng_recvmsg(s, &r, 0) != 0)
		return -1;
	if (rl_qhdr_decode(&rh, nng_msg_body(r), nng_msg_len(r)) != 0) {
		nng_msg_free(r);
		return -1;
	}
	snprintf(why, wn, "%.*s", (int)(nng_msg_len(r) - rh.hdr_len), (const char *)nng_msg_body(r) + rh.hdr_len);
	nng_msg_free(r);
	return rh.status;
}

static void
test_broker(void)
{
	rl_qserve_config cfg = { 0 };
	rl_qserve *s;
	pthread_t th;
	nng_socket sk;
	char why[300], *js;
	static const char good[] = "{\"role\":\"reward\",\"worker\":\"r:1\",\"uptime_s\":2,\"busy_s\":1,\"idle_s\":1,"
	    "\"records\":10,\"tokens\":0}";
	cJSON *o;
	rl_wstat *w;

	cfg.listen = "inproc://test-wstat";
	rl_queue_config_default(&cfg.queue);
	T_EQ_INT(rl_qserve_open(&s, &cfg), RL_OK);
	pthread_create(&th, NULL, serve, s);
	nng_req0_open(&sk);
	nng_socket_set_ms(sk, NNG_OPT_RECVTIMEO, 5000);
	nng_socket_set_size(sk, NNG_OPT_RECVMAXSZ, 1 << 20);
	T_EQ_INT(nng_dial(sk, cfg.listen, NULL, 0), 0);
	T_EQ_INT(raw(sk, 0, sizeof good - 1, good, sizeof good - 1, why, sizeof why), 0);
	/* malformed */
	T_EQ_INT(raw(sk, 0, 5, "{\"a\":", 5, why, sizeof why), RL_EFORMAT);
	T_OK(strstr(why, "malformed stats report") != NULL, "%s", why);
	/* oversized, plain */
	{
		size_t n = RL_QP_MAX_REPORT + 1;
		char *big = malloc(n);
		memset(big, ' ', n);
		big[0] = '{';
		big[n - 1] = '}';
		T_EQ_INT(raw(sk, 0, (uint32_t)n, big, n, why, sizeof why), RL_ETOOBIG);
		T_OK(strstr(why, "over") != NULL, "%s", why);
		/* oversized once decompressed: refused before it is inflated */
		{
			rl_buf z;
			rl_buf_init(&z);
			rl_qzstd_compress(&z, big, n, 1);
			T_EQ_INT(raw(sk, RL_QF_ZSTD, (uint32_t)n, z.p, z.len, why, sizeof why), RL_ETOOBIG);
			/* a frame whose size disagrees with the header */
			T_EQ_INT(raw(sk, RL_QF_ZSTD, 10, z.p, z.len, why, sizeof why), RL_EFORMAT);
			rl_buf_fini(&z);
		}
		free(big);
	}
	/* still serving: a good compressed report, then the stats */
	{
		static const char g2[] = "{\"role\":\"rollout\",\"worker\":\"g:2\",\"uptime_s\":1,\"busy_s\":1,\"idle_s\":0,"
		    "\"records\":3,\"tokens\":30}";
		rl_buf z;
		rl_buf_init(&z);
		rl_qzstd_compress(&z, g2, sizeof g2 - 1, 1);
		T_EQ_INT(raw(sk, RL_QF_ZSTD, sizeof g2 - 1, z.p, z.len, why, sizeof why), 0);
		rl_buf_fini(&z);
	}
	/* a stage's reporter thread, then its final report at close */
	setenv("RL_STATS_INTERVAL", "0.05", 1);
	setenv("RL_WORKER_ID", "train-1", 1);
	T_EQ_INT(rl_wstat_open(&w, cfg.listen, "train", "cpu"), RL_OK);
	rl_wstat_phase(w, RL_WSTAT_BUSY);
	rl_wstat_add(w, 4, 40);
	rl_wstat_train_metrics(w, "{\"step\":1,\"critic/score/mean\":0.25}");
	usleep(300000);
	T_EQ_INT(rl_qserve_stats_json(s, &js), RL_OK);
	o = cJSON_Parse(js);
	free(js);
	T_EQ_STR(cJSON_GetObjectItem(worker(o, "train-1"), "state")->valuestring, "live");
	T_CLOSE(jnum(cJSON_GetObjectItem(o, "train"), "reward_mean"), 0.25, 0, 0);
	cJSON_Delete(o);
	rl_wstat_train_metrics(w, "{\"step\":2,\"critic/score/mean\":0.5}");
	rl_wstat_close(w);
	unsetenv("RL_WORKER_ID");
	T_EQ_INT(rl_qserve_stats_json(s, &js), RL_OK);
	o = cJSON_Parse(js);
	free(js);
	T_OK(worker(o, "r:1") && worker(o, "g:2"), "good reports kept");
	T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(o, "workers")), 3);
	T_EQ_STR(cJSON_GetObjectItem(worker(o, "train-1"), "state")->valuestring, "exited");
	T_EQ_INT(jnum(worker(o, "train-1"), "records"), 4);
	T_CLOSE(jnum(cJSON_GetObjectItem(o, "train"), "reward_mean"), 0.5, 0, 0);
	T_OK(jnum(cJSON_GetObjectItem(o, "server"), "bad_requests") >= 4);
	cJSON_Delete(o);
	nng_close(sk);
	stop_flag = 1;
	pthread_join(th, NULL);
	rl_qserve_close(s);
}

/* A long run: 2000 steps in reports of 100 are kept whole in at most
 * RLI_WORKERS_POINTS points, each the mean of the same number of steps (4
 * once 2000 > 2 x 512), in order, the first and the last step included. */
static void
test_whole_run(void)
{
	rli_workers *ws;
	char *buf = malloc(16384), why[200];
	cJSON *o;
	const cJSON *h, *ver, *rw, *st;
	int n;

	T_EQ_INT(rli_workers_create(&ws), RL_OK);
	for (int r = 0; r < 20; r++) {
		int len = snprintf(buf, 16384, "{\"role\":\"train\",\"worker\":\"t:1\",\"uptime_s\":%d,\"busy_s\":%d,"
		    "\"idle_s\":0,\"records\":%d,\"tokens\":%d,\"steps\":[", r + 1, r + 1, r, r);
		for (int i = 1; i <= 100; i++) {
			int v = r * 100 + i;
			len += snprintf(buf + len, 16384 - (size_t)len, "%s{\"version\":%d,\"reward_mean\":%g%s}",
			    i > 1 ? "," : "", v, v / 1000.0, v % 2 ? ",\"staleness_max\":3" : "");
		}
		len += snprintf(buf + len, 16384 - (size_t)len, "]}");
		T_EQ_INT(rli_workers_report(ws, buf, (size_t)len, 100 + r, why, sizeof why), RL_OK);
	}
	o = table_json(ws, 120);
	h = cJSON_GetObjectItem(o, "train_history");
	ver = cJSON_GetObjectItem(h, "version");
	rw = cJSON_GetObjectItem(h, "reward_mean");
	st = cJSON_GetObjectItem(h, "staleness_max");
	n = cJSON_GetArraySize(ver);
	T_EQ_INT(n, 500);
	T_OK(n <= RLI_WORKERS_POINTS, "%d points", n);
	T_CLOSE(jnum(h, "steps_per_point"), 4, 0, 0);
	T_CLOSE(jnum(cJSON_GetObjectItem(o, "train"), "steps"), 2000, 0, 0);
	T_CLOSE(jnum(cJSON_GetObjectItem(o, "train"), "version"), 2000, 0, 0);
	for (int i = 0; i < n; i++) {
		double want = 4.0 * i + 2.5;   /* the mean of steps 4i+1 .. 4i+4 */
		T_CLOSE(cJSON_GetArrayItem(ver, i)->valuedouble, want, 1e-9, 0);
		T_CLOSE(cJSON_GetArrayItem(rw, i)->valuedouble, want / 1000, 1e-12, 0);
		T_CLOSE(cJSON_GetArrayItem(st, i)->valuedouble, 3, 0, 0);   /* the mean of the steps that have it */
	}
	T_OK(cJSON_GetObjectItem(o, "stage_history") != NULL && cJSON_GetObjectItem(cJSON_GetObjectItem(o,
	    "stage_history"), "train_busy") != NULL, "stage busy fractions");
	cJSON_Delete(o);
	rli_workers_destroy(ws);
	free(buf);
}

int
main(void)
{
	T_BEGIN("wstat");
	rl_log_init("test_wstat", RL_LOG_QUIET);
	test_table();
	test_whole_run();
	test_client();
	test_part();
	test_broker();
	T_END();
}

/*
 * bench/wstat.c — what stage stats cost: a stage's hooks (rl_wstat_phase
 * and rl_wstat_add, called around every lease and engine step), building
 * one report, the broker taking one report (parse, check, store), and one
 * stats snapshot of a full worker table (256 workers, 300 train steps)
 * turned into JSON and Prometheus text (what a /metrics scrape costs).
 *
 * usage: wstat [SECONDS_PER_CASE] (default 1).  One JSON object per line;
 * ns or us per operation, by wall clock and by the thread's CPU time.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/io.h"
#include "queue/qhttp.h"
#include "queue/qserve_workers.h"
#include "queue/wstat.h"

static double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void
emit(const char *op, double n, double wall, double cpu, const char *unit, double scale, const char *extra)
{
	printf("{\"bench\":\"wstat\",\"op\":\"%s\",\"n\":%.0f,\"%s\":%.3f,\"%s_cpu\":%.3f,\"wall_s\":%.2f%s}\n", op, n,
	    unit, wall / n * scale, unit, cpu / n * scale, wall, extra ? extra : "");
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 1.0, t0, c0;
	long n;
	rl_wstat *w;
	rli_workers *ws;
	char why[200], rep[1024];

	rl_log_init("bench-wstat", RL_LOG_QUIET);
	/* the hooks: a phase change and a count, as rl-rollout does per engine step */
	setenv("RL_STATS_INTERVAL", "3600", 1);
	if (rl_wstat_open(&w, "inproc://bench-wstat-none", "rollout", "cpu") != 0)
		return 1;
	t0 = rl_now(), c0 = cpu_now(), n = 0;
	while (rl_now() - t0 < secs) {
		for (int i = 0; i < 1000; i++) {
			rl_wstat_phase(w, (i & 1) ? RL_WSTAT_BUSY : RL_WSTAT_IDLE);
			rl_wstat_add(w, 1, 100);
		}
		n += 1000;
	}
	emit("hooks(phase+add)", (double)n, rl_now() - t0, cpu_now() - c0, "ns", 1e9, NULL);
	/* building one report (with 50 train steps waiting) */
	for (int i = 0; i < 50; i++) {
		char m[200];
		snprintf(m, sizeof m, "{\"step\":%d,\"critic/score/mean\":0.5,\"response_length/mean\":120,"
		    "\"actor/ppo_kl\":0.001,\"actor/entropy\":1.5,\"timing_s/step\":2}", i + 1);
		rl_wstat_train_metrics(w, m);
	}
	t0 = rl_now(), c0 = cpu_now(), n = 0;
	while (rl_now() - t0 < secs) {
		char *txt;
		rl_wstat_report_json(w, 0, &txt);
		free(txt);
		n++;
	}
	emit("build_report(50 steps)", (double)n, rl_now() - t0, cpu_now() - c0, "us", 1e6, NULL);
	rl_wstat_close(w);
	/* the broker: one report from one of 256 workers */
	rli_workers_create(&ws);
	t0 = rl_now(), c0 = cpu_now(), n = 0;
	while (rl_now() - t0 < secs) {
		int k = (int)(n % 256);
		double up = 1 + (double)n / 256;
		int len = snprintf(rep, sizeof rep, "{\"role\":\"%s\",\"worker\":\"node-%d:%d\",\"device\":\"cuda:%d\","
		    "\"uptime_s\":%.3f,\"busy_s\":%.3f,\"idle_s\":%.3f,\"records\":%ld,\"tokens\":%ld,\"final\":false,"
		    "\"gpu\":{\"index\":%d,\"name\":\"GPU\",\"util\":0.9,\"mem_util\":0.3,\"mem_used\":2e10,"
		    "\"mem_total\":8e10}%s}", k % 3 == 0 ? "rollout" : k % 3 == 1 ? "reward" : "train", k / 8, k, k % 8, up,
		    up * 0.8, up * 0.2, n, n * 100, k % 8,
		    k % 3 == 2 ? ",\"steps\":[{\"version\":1,\"reward_mean\":0.5,\"response_length\":100}]" : "");
		if (rli_workers_report(ws, rep, (size_t)len, 1000 + (double)n * 1e-3, why, sizeof why) != 0) {
			fprintf(stderr, "%s\n", why);
			return 1;
		}
		n++;
	}
	emit("broker_report", (double)n, rl_now() - t0, cpu_now() - c0, "us", 1e6, NULL);
	/* a snapshot with 256 workers, as JSON and as Prometheus text */
	{
		size_t jbytes = 0, pbytes = 0;
		double tnow = 1000 + (double)n * 1e-3;
		for (int i = 0; i < 300; i++) {
			int len = snprintf(rep, sizeof rep, "{\"role\":\"train\",\"worker\":\"node-0:2\",\"uptime_s\":%d,"
			    "\"busy_s\":1,\"idle_s\":1,\"records\":1,\"tokens\":1,\"steps\":[{\"version\":%d,\"reward_mean\":0.5,"
			    "\"response_length\":100,\"ppo_kl\":0.001,\"entropy\":1,\"step_s\":2}]}", 1000000 + i, 1000 + i);
			rli_workers_report(ws, rep, (size_t)len, tnow, why, sizeof why);
		}
		t0 = rl_now(), c0 = cpu_now(), n = 0;
		while (rl_now() - t0 < secs) {
			cJSON *o = cJSON_CreateObject();
			char *txt;
			rl_buf b;
			rli_workers_json(ws, o, tnow);
			txt = cJSON_PrintUnformatted(o);
			rl_buf_init(&b);
			rl_qhttp_prometheus(&b, txt);
			jbytes = strlen(txt);
			pbytes = b.len;
			rl_buf_fini(&b);
			free(txt);
			cJSON_Delete(o);
			n++;
		}
		snprintf(rep, sizeof rep, ",\"workers\":256,\"json_bytes\":%zu,\"prometheus_bytes\":%zu", jbytes, pbytes);
		emit("snapshot+prometheus", (double)n, rl_now() - t0, cpu_now() - c0, "us", 1e6, rep);
	}
	rli_workers_destroy(ws);
	return 0;
}

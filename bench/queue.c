/* bench/queue.c — throughput of rl-queue on loopback: 2 producers put
 * scored groups (8 samples of 64 prompt + 512 response tokens with
 * log-probs, 64 records per put), 2 consumers lease whole groups (up to 64
 * samples per lease) and ack them, as a trainer does.  The broker is the
 * real `rl-queue serve` in its own process, with and without --data-dir.
 * Prints one JSON line per configuration: records/s through the broker,
 * p50/p99 lease latency, the broker's CPU (cores, and share of all CPU
 * used), and where the broker's time goes (its stats).
 *
 * RLQ_BENCH_AUTH=KEYFILE: the plain run, then the same with --auth-key-file
 * on the broker and the clients (what the HMAC of every request costs); with
 * RLQ_BENCH_TLS=DIR too, both runs over tls+tcp://.
 *
 * RLQ_BENCH_TLS=DIR: the plain run, then tls+tcp:// with client
 * certificates from DIR, on the engine RL_TLS_ENGINE selects (openssl by
 * default, or mbedtls) for the broker and the clients alike.
 *
 * Each line also gives the CPU seconds of broker and clients per record
 * trained (cpu_us_per_record) and the workers that stopped on an error.
 *
 * usage: queue [SECONDS] [BIN]   (default 4 s, build/bin/rl-queue)
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/nngx.h"
#include "base/tls_ossl.h"
#include "queue/qclient.h"
#include "stream/traj.h"

#define BATCH 64
#define GROUP 8
#define PROMPT 64
#define RESPONSE 512

static char url[64];
static const char *tls_dir;  /* RLQ_BENCH_TLS */
static const char *auth_file;  /* RLQ_BENCH_AUTH: a key file for broker and clients */
static const char *tls_file(const char *name);
static double duration = 4;
static volatile int running;
static uint64_t next_group[2];
static size_t rec_bytes;
static int compress;   /* -1 auto (off on loopback) or 1 */

typedef struct {
	int k;
	uint64_t records;
	double *lat;
	size_t nlat, caplat;
	int failed;
} worker;

/* offsets of the id and group values within each record of a payload */
static size_t id_off[BATCH], group_off[BATCH];
static pthread_mutex_t offsets_mtx = PTHREAD_MUTEX_INITIALIZER;
static int offsets_found;

static void
find_offsets(const uint8_t *p, size_t n)
{
	size_t off = RL_TRAJ_HEADER_LEN;

	for (int r = 0; r < BATCH && off < n; r++) {
		uint32_t len = rl_le32_get(p + off), nf = rl_le32_get(p + off + 4);
		size_t f = off + 8;
		for (uint32_t i = 0; i < nf; i++) {
			uint16_t tag = rl_le16_get(p + f);
			uint32_t nb = rl_le32_get(p + f + 4);
			if (tag == RL_TAG_ID)
				id_off[r] = f + 8;
			if (tag == RL_TAG_GROUP)
				group_off[r] = f + 8;
			f += 8 + ((nb + 7) & ~7u);
		}
		off += len;
	}
}

static void *
producer(void *arg)
{
	worker *w = arg;
	rl_qclient *c;
	rl_traj_batch *b;
	rl_traj *t;
	const void *pp;
	size_t n;
	uint8_t *p;
	int32_t prompt[PROMPT], resp[RESPONSE];
	float lp[RESPONSE];

	rl_qclient_opts o;
	rl_qclient_opts_default(&o);
	o.compress = compress;
	if (rl_qclient_open(&c, url, &o) != 0) {
		w->failed = 1;
		return NULL;
	}
	rl_traj_batch_create(&b);
	rl_traj_create(&t);
	for (int i = 0; i < PROMPT; i++)
		prompt[i] = 1000 + i * 7;
	for (int r = 0; r < BATCH; r++) {
		for (int i = 0; i < RESPONSE; i++) {
			resp[i] = (int32_t)((r * 131 + i * 17) % 50000);
			lp[i] = -0.01f * (float)((r + i) % 300);
		}
		rl_traj_clear(t);
		rl_traj_set_u64(t, RL_TAG_ID, 1);
		rl_traj_set_u64(t, RL_TAG_GROUP, 1);
		rl_traj_set_i32(t, RL_TAG_INDEX, r % GROUP);
		rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, GROUP);
		rl_traj_set_version(t, 0, 0);
		rl_traj_set_i32s(t, RL_TAG_PROMPT, prompt, PROMPT);
		rl_traj_set_i32s(t, RL_TAG_RESPONSE, resp, RESPONSE);
		rl_traj_set_f32s(t, RL_TAG_LOGPROBS, lp, RESPONSE);
		rl_traj_set_f32(t, RL_TAG_REWARD, (float)(r % 2));
		rl_traj_batch_add(b, t);
	}
	rl_traj_batch_payload(b, &pp, &n);
	p = malloc(n);
	memcpy(p, pp, n);
	/* every producer waits for the offsets: one that wrote ids before they
	 * were found would overwrite the batch's magic */
	pthread_mutex_lock(&offsets_mtx);
	if (!offsets_found) {
		find_offsets(p, n);
		rec_bytes = (n - RL_TRAJ_HEADER_LEN) / BATCH;
		offsets_found = 1;
	}
	pthread_mutex_unlock(&offsets_mtx);
	while (running) {
		rl_qput_result res;
		uint64_t g0 = __atomic_fetch_add(&next_group[0], BATCH / GROUP, __ATOMIC_RELAXED);
		for (int r = 0; r < BATCH; r++) {
			uint64_t g = g0 + (uint64_t)(r / GROUP);
			rl_le64_put(p + id_off[r], g * GROUP + (uint64_t)(r % GROUP));
			rl_le64_put(p + group_off[r], g);
		}
		if (rl_qclient_put_raw(c, RL_QSTAGE_SCORED, p, n, 0, &res) != 0) {
			w->failed = 1;
			break;
		}
		w->records += res.accepted;
	}
	free(p);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	rl_qclient_close(c);
	return NULL;
}

static void *
consumer(void *arg)
{
	worker *w = arg;
	rl_qclient_opts o;
	rl_qclient *c;
	rl_qlease l;
	rl_qack_result ar;

	rl_qclient_opts_default(&o);
	o.dedup = 0;   /* ids are unique here; dedup costs a hash lookup per record */
	o.compress = compress;
	if (rl_qclient_open(&c, url, &o) != 0) {
		w->failed = 1;
		return NULL;
	}
	rl_qlease_init(&l);
	while (running) {
		rl_qlease_req req = { .stage = RL_QSTAGE_SCORED, .max_records = BATCH, .min_records = BATCH,
		                      .wait_ms = 100 };
		double t0 = rl_now();
		size_t had = rl_qlease_count(&l);
		/* ack the previous batch and lease the next in one round trip */
		if (rl_qclient_ack_lease(c, &l, &req) != 0) {
			w->failed = 1;
			break;
		}
		if (w->nlat == w->caplat) {
			w->caplat = w->caplat ? w->caplat * 2 : 4096;
			w->lat = realloc(w->lat, w->caplat * sizeof *w->lat);
		}
		w->lat[w->nlat++] = rl_now() - t0;
		w->records += had;
	}
	if (l.id && rl_qclient_ack(c, &l, &ar) == 0)
		w->records += rl_qlease_count(&l);
	rl_qlease_fini(&l);
	rl_qclient_close(c);
	return NULL;
}

static double
proc_cpu(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) != NULL)
		sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
	fclose(f);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double
self_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	    ru.ru_stime.tv_usec / 1e6;
}

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double
jnum(const char *json, const char *key)
{
	char pat[64];
	const char *p;
	snprintf(pat, sizeof pat, "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

static int
run(const char *bin, const char *dir)
{
	worker w[4];
	pthread_t th[4];
	pid_t pid;
	int port = 20000 + (int)(getpid() % 30000), st;
	double t0, t1, c0, c1, s0, s1, *all;
	size_t nall = 0;
	uint64_t put = 0, got = 0;
	rl_qclient *c;
	char *json = NULL;

	/* nng's mbedTLS engine checks DNS names only, so it is refused an address */
	const char *eng = getenv("RL_TLS_ENGINE");
	snprintf(url, sizeof url, "%s://%s:%d", tls_dir ? "tls+tcp" : "tcp",
		 tls_dir && eng && strcmp(eng, "mbedtls") == 0 ? "localhost" : "127.0.0.1",
		 port + (dir ? 1 : 0) + (compress > 0 ? 2 : 0) + (tls_dir ? 4 : 0) + (auth_file ? 5 : 0));
	if ((pid = fork()) == 0) {
		const char *av[16];
		int n = 0;
		av[n++] = bin, av[n++] = "serve", av[n++] = "-q", av[n++] = "--listen", av[n++] = url;
		av[n++] = "--max-bytes", av[n++] = "2G";
		if (tls_dir) {
			av[n++] = "--tls-cert", av[n++] = tls_file("srv.pem");
			av[n++] = "--tls-key", av[n++] = tls_file("srv.key");
			av[n++] = "--tls-ca", av[n++] = tls_file("ca.pem");
		}
		if (auth_file)
			av[n++] = "--auth-key-file", av[n++] = auth_file;
		if (dir)
			av[n++] = "--data-dir", av[n++] = dir;
		av[n] = NULL;
		execv(bin, (char *const *)av);
		_exit(127);
	}
	if (rl_qclient_open(&c, url, NULL) != 0 || rl_qclient_ping(c) != 0) {
		fprintf(stderr, "queue bench: broker did not start\n");
		kill(pid, SIGKILL);
		return 1;
	}
	memset(w, 0, sizeof w);
	running = 1;
	c0 = proc_cpu(pid);
	s0 = self_cpu();
	t0 = rl_now();
	for (int i = 0; i < 4; i++) {
		w[i].k = i;
		pthread_create(&th[i], NULL, i < 2 ? producer : consumer, &w[i]);
	}
	usleep((useconds_t)(duration * 1e6));
	running = 0;
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	t1 = rl_now();
	c1 = proc_cpu(pid);
	s1 = self_cpu();
	rl_qclient_stats(c, &json);
	rl_qclient_close(c);
	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
	for (int i = 0; i < 4; i++) {
		if (w[i].failed)
			fprintf(stderr, "queue bench: worker %d failed\n", i);
		if (i < 2)
			put += w[i].records;
		else
			got += w[i].records;
	}
	all = malloc((w[2].nlat + w[3].nlat + 1) * sizeof *all);
	for (int i = 2; i < 4; i++)
		for (size_t k = 0; k < w[i].nlat; k++)
			all[nall++] = w[i].lat[k];
	qsort(all, nall, sizeof *all, cmp);
	printf("{\"bench\":\"queue\",\"auth\":%s,\"tls\":%s,\"tls_engine\":\"%s\",\"data_dir\":%s,\"wire_zstd\":%s,\"seconds\":%.2f,\"record_bytes\":%d,\"batch\":%d,"
	    "\"put_records\":%llu,\"trained_records\":%llu,\"records_per_s\":%.0f,\"mb_per_s\":%.1f,"
	    "\"lease_p50_ms\":%.3f,\"lease_p99_ms\":%.3f,\"leases\":%zu,"
	    "\"broker_cpu_cores\":%.2f,\"broker_cpu_share\":%.2f,\"clients_cpu_cores\":%.2f,"
	    "\"broker_time_s\":{\"state\":%.3f,\"decompress\":%.3f,\"compress\":%.3f,\"journal\":%.3f,\"lock_wait\":%.3f},"
	    "\"journal_syncs\":%.0f,\"cpu_us_per_record\":%.2f,\"failed_workers\":%d}\n",
	    auth_file ? "true" : "false", tls_dir ? "true" : "false", tls_dir ? rl_tls_engine_name() : "", dir ? "true" : "false", compress > 0 ? "true" : "false", t1 - t0, (int)rec_bytes, BATCH, (unsigned long long)put, (unsigned long long)got,
	    (double)got / (t1 - t0), (double)got * (double)rec_bytes / 1e6 / (t1 - t0),
	    nall ? all[nall / 2] * 1e3 : 0, nall ? all[(size_t)(nall * 0.99)] * 1e3 : 0, nall,
	    (c1 - c0) / (t1 - t0), (c1 - c0) / ((c1 - c0) + (s1 - s0) + 1e-9), (s1 - s0) / (t1 - t0),
	    json ? jnum(json, "state_s") : -1, json ? jnum(json, "decompress_s") : -1,
	    json ? jnum(json, "compress_s") : -1, json ? jnum(json, "journal_s") : -1,
	    json ? jnum(json, "lock_wait_s") : -1, json ? jnum(json, "syncs") : 0,
	    got ? ((c1 - c0) + (s1 - s0)) / (double)got * 1e6 : 0, w[0].failed + w[1].failed + w[2].failed + w[3].failed);
	fflush(stdout);
	free(json);
	free(all);
	free(w[2].lat);
	free(w[3].lat);
	return 0;
}

/* RLQ_BENCH_TLS=DIR (ca.pem, srv.pem/key, cli.pem/key): plain tcp:// and
 * tls+tcp:// with client certificates, each without --data-dir */
static const char *
tls_file(const char *name)
{
	static char buf[8][600];
	static int k;
	char *b = buf[k++ % 8];
	snprintf(b, 600, "%s/%s", tls_dir, name);
	return b;
}

int
main(int argc, char **argv)
{
	const char *bin = argc > 2 ? argv[2] : "build/bin/rl-queue";
	char dir[] = "/tmp/rlq-bench-XXXXXX", cmd[128];
	int rv;

	if (argc > 1)
		duration = atof(argv[1]);
	rl_log_init("queue-bench", RL_LOG_QUIET);
	signal(SIGPIPE, SIG_IGN);
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "queue bench: no %s\n", bin);
		return 1;
	}
	compress = -1;
	if (getenv("RLQ_BENCH_AUTH")) {
		/* the shared key against none: the same run twice, over TLS when
		 * RLQ_BENCH_TLS is set too */
		if (getenv("RLQ_BENCH_TLS")) {
			tls_dir = getenv("RLQ_BENCH_TLS");
			if (rli_nng_tls_files(tls_file("cli.pem"), tls_file("cli.key"), tls_file("ca.pem")) != 0)
				return 1;
		}
		rv = run(bin, NULL);
		auth_file = getenv("RLQ_BENCH_AUTH");
		if (rli_auth_set_file(auth_file) != 0)
			return 1;
		rv |= run(bin, NULL);
		return rv;
	}
	if (getenv("RLQ_BENCH_TLS")) {
		const char *d = getenv("RLQ_BENCH_TLS");
		rv = run(bin, NULL);
		tls_dir = d;
		if (rli_nng_tls_files(tls_file("cli.pem"), tls_file("cli.key"), tls_file("ca.pem")) != 0)
			return 1;
		rv |= run(bin, NULL);
		return rv;
	}
	rv = run(bin, NULL);
	if (mkdtemp(dir) == NULL)
		return 1;
	rv |= run(bin, dir);
	compress = 1;   /* what a remote link costs: zstd on the wire both ways */
	rv |= run(bin, NULL);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		rv = 1;
	return rv;
}

/* test_queue_net.c — the broker over nng on 127.0.0.1, with real processes:
 *  - malformed and oversized requests get an error reply or a closed pipe,
 *    and the broker keeps serving; many clients at once; long poll;
 *  - kill -9 a consumer holding leases: after the lease timeout its records
 *    go to another consumer, and every record is trained exactly once;
 *  - kill -9 the broker (--data-dir) under load and restart it: every
 *    acknowledged record reaches the trainer, none twice;
 *  - the staleness bound holds under a producer much faster than the
 *    trainer (K = 1 and K = 0), and stale samples are dropped.
 * Each scenario runs in its own process (forked before any nng use, so
 * workers can fork cleanly) under an alarm.  Skips without build/bin/rl-queue. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "queue/qclient.h"
#include "t.h"
#include "t_port.h"
#include "stream/traj.h"

static char bin[512];

/* ---- processes ---------------------------------------------------------------- */
static int
port_open(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
	close(fd);
	return ok;
}

/* Starts rl-queue serve on 127.0.0.1 (a port from t_free_port unless *port
 * is set: a restart) with extra args; waits until it listens.  A broker that
 * exits first (its port taken after the check) starts again on another port,
 * or, on a set port, again on the same one a moment later.  Returns the pid,
 * or -1. */
static pid_t
broker(int *port, char *url, const char *const *extra)
{
	for (int attempt = 0; attempt < 20; attempt++) {
		const char *argv[32];
		int n = 0, p = *port ? *port : t_free_port(), st;
		pid_t pid;

		if (p == 0)
			return -1;
		sprintf(url, "tcp://127.0.0.1:%d", p);
		argv[n++] = bin;
		argv[n++] = "serve";
		argv[n++] = "--listen";
		argv[n++] = url;
		argv[n++] = "-q";
		for (int i = 0; extra && extra[i]; i++)
			argv[n++] = extra[i];
		argv[n] = NULL;
		if ((pid = fork()) == 0) {
			execv(bin, (char *const *)argv);
			_exit(127);
		}
		for (int w = 0; w < 500; w++) {
			if (waitpid(pid, &st, WNOHANG) == pid)
				break;
			if (port_open(p)) {
				*port = p;
				return pid;
			}
			usleep(10000);
		}
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		if (*port)
			usleep(100000);   /* a fixed port: it may still be held; retry */
	}
	return -1;
}

static void
stop(pid_t pid, int sig)
{
	int st;
	if (pid > 0) {
		kill(pid, sig);
		waitpid(pid, &st, 0);
	}
}

/* Reads one line (without '\n') from fd within ms; 0 at EOF or timeout. */
static int
read_line(int fd, char *buf, size_t n, int ms)
{
	size_t k = 0;

	while (k + 1 < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char c;
		if (poll(&p, 1, ms) <= 0 || read(fd, &c, 1) != 1)
			return 0;
		if (c == '\n')
			break;
		buf[k++] = c;
	}
	buf[k] = 0;
	return 1;
}

static void
say(int fd, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (write(fd, buf, (size_t)n) != n)
		_exit(3);
}

/* ---- records ------------------------------------------------------------------- */
static void
add(rl_traj_batch *b, rl_traj *t, uint64_t id, uint64_t g, int idx, int gs, int version, int R)
{
	static int32_t tok[1024];
	rl_traj_clear(t);
	rl_traj_set_u64(t, RL_TAG_ID, id);
	rl_traj_set_u64(t, RL_TAG_GROUP, g);
	rl_traj_set_i32(t, RL_TAG_INDEX, idx);
	rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gs);
	if (version >= 0)
		rl_traj_set_version(t, version, version);
	for (int i = 0; i < R; i++)
		tok[i] = (int32_t)(id + (uint64_t)i);
	if (R)
		rl_traj_set_i32s(t, RL_TAG_RESPONSE, tok, (size_t)R);
	rl_traj_batch_add(b, t);
}

/* puts groups g0..g0+ng-1 of gs scored samples; sample id = g*16 + index */
static int
put_groups(rl_qclient *c, int stage, uint64_t g0, int ng, int gs, int version)
{
	rl_traj_batch *b;
	rl_traj *t;
	rl_qput_result r;
	int rv;

	rl_traj_batch_create(&b);
	rl_traj_create(&t);
	for (int g = 0; g < ng; g++)
		for (int i = 0; i < gs; i++)
			add(b, t, (g0 + (uint64_t)g) * 16 + (uint64_t)i, g0 + (uint64_t)g, i, gs, version, 32);
	rv = rl_qclient_put(c, stage, b, &r);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	return rv;
}

static uint64_t
rec_u64(rl_qlease *l, size_t i, unsigned tag, rl_traj *t)
{
	uint64_t v = 0;
	rl_traj_batch_get(l->batch, i, t);
	rl_traj_get_u64(t, tag, &v);
	return v;
}

static int
rec_version(rl_qlease *l, size_t i, rl_traj *t)
{
	int32_t a = -1, b = -1;
	rl_traj_batch_get(l->batch, i, t);
	rl_traj_get_version(t, &a, &b);
	return a;
}

static double
stat_num(rl_qclient *c, const char *obj, const char *key)
{
	char *json = NULL, pat[96], *p;
	double v = -1;

	if (rl_qclient_stats(c, &json) != 0)
		return -1;
	snprintf(pat, sizeof pat, "\"%s\":{", obj);
	p = obj ? strstr(json, pat) : json;
	if (p) {
		snprintf(pat, sizeof pat, "\"%s\":", key);
		if ((p = strstr(p, pat)) != NULL)
			v = strtod(p + strlen(pat), NULL);
	}
	free(json);
	return v;
}

/* ---- scenario: bad requests, concurrency, long poll ---------------------------------- */
static char g_url[64];

static void *
worker(void *arg)
{
	long k = (long)arg, bad = 0;
	rl_qclient *c;
	rl_qlease l;
	rl_qack_result ar;

	if (rl_qclient_open(&c, g_url, NULL) != 0)
		return (void *)1;
	rl_qlease_init(&l);
	for (int i = 0; i < 30; i++) {
		if (put_groups(c, RL_QSTAGE_GENERATED, 100000 + (uint64_t)k * 1000 + (uint64_t)i, 1, 1, 0) != 0)
			bad++;
		if (rl_qclient_lease_generated(c, 1, 1000, &l) != 0 || l.id == 0)
			bad++;
		else if (rl_qclient_release(c, &l, &ar) != 0)
			bad++;
	}
	rl_qlease_fini(&l);
	rl_qclient_close(c);
	return (void *)bad;
}

static void *
late_put(void *arg)
{
	rl_qclient *c;
	(void)arg;
	usleep(300000);
	if (rl_qclient_open(&c, g_url, NULL) == 0) {
		put_groups(c, RL_QSTAGE_SCORED, 900, 1, 2, 0);
		rl_qclient_close(c);
	}
	return NULL;
}

static void
scenario_bad_requests(void)
{
	static const char *const extra[] = { "--max-msg", "64k", NULL };
	int port = 0;
	pid_t b = broker(&port, g_url, extra);
	nng_socket s;
	nng_msg *m;
	rl_qclient *c;
	rl_qlease l;
	pthread_t th[8];
	uint8_t hb[RL_QP_HDR_LEN];
	rl_qhdr h = { 0 }, rh;
	double t0;
	void *ret;

	T_OK(b > 0);
	if (b <= 0)
		return;
	/* raw messages */
	T_EQ_INT(nng_req0_open(&s), 0);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 2000);
	nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	T_EQ_INT(nng_dial(s, g_url, NULL, 0), 0);
	T_EQ_INT(nng_send(s, "hello", 5, 0), 0);
	T_EQ_INT(nng_recvmsg(s, &m, 0), 0);
	T_EQ_INT(rl_qhdr_decode(&rh, nng_msg_body(m), nng_msg_len(m)), 0);
	T_EQ_INT(rh.status, RL_EFORMAT);
	nng_msg_free(m);
	/* another protocol version */
	h.op = RL_QOP_PING;
	rl_qhdr_encode(hb, &h);
	hb[4] = 9;
	T_EQ_INT(nng_send(s, hb, sizeof hb, 0), 0);
	T_EQ_INT(nng_recvmsg(s, &m, 0), 0);
	T_EQ_INT(rl_qhdr_decode(&rh, nng_msg_body(m), nng_msg_len(m)), 0);
	T_EQ_INT(rh.status, RL_EVERSION);
	nng_msg_free(m);
	/* a zstd body that lies about its size; a put that is no batch; unknown op */
	{
		uint8_t buf[RL_QP_HDR_LEN + 64];
		rl_buf z;
		rl_buf_init(&z);
		rl_qzstd_compress(&z, "RLTJ-not-really-a-batch", 23, 1);
		h.op = RL_QOP_PUT;
		h.flags = RL_QF_ZSTD;
		h.raw_len = 5000000;
		rl_qhdr_encode(buf, &h);
		memcpy(buf + RL_QP_HDR_LEN, z.p, z.len);
		T_EQ_INT(nng_send(s, buf, RL_QP_HDR_LEN + z.len, 0), 0);
		T_EQ_INT(nng_recvmsg(s, &m, 0), 0);
		rl_qhdr_decode(&rh, nng_msg_body(m), nng_msg_len(m));
		T_OK(rh.status == RL_EFORMAT || rh.status == RL_ETOOBIG, "status %u", rh.status);
		nng_msg_free(m);
		h.raw_len = 23;
		rl_qhdr_encode(buf, &h);
		T_EQ_INT(nng_send(s, buf, RL_QP_HDR_LEN + z.len, 0), 0);
		T_EQ_INT(nng_recvmsg(s, &m, 0), 0);
		rl_qhdr_decode(&rh, nng_msg_body(m), nng_msg_len(m));
		T_OK(rh.status == RL_EFORMAT || rh.status == RL_EVERSION, "status %u", rh.status);
		nng_msg_free(m);
		h.op = 77;
		h.flags = 0;
		h.raw_len = 0;
		rl_qhdr_encode(buf, &h);
		T_EQ_INT(nng_send(s, buf, RL_QP_HDR_LEN, 0), 0);
		T_EQ_INT(nng_recvmsg(s, &m, 0), 0);
		rl_qhdr_decode(&rh, nng_msg_body(m), nng_msg_len(m));
		T_EQ_INT(rh.status, RL_EINVAL);
		nng_msg_free(m);
		rl_buf_fini(&z);
	}
	/* oversized: the broker closes that pipe, no reply */
	{
		size_t big = 200000;
		uint8_t *p = calloc(1, big);
		h.op = RL_QOP_PUT;
		h.flags = 0;
		h.raw_len = (uint32_t)(big - RL_QP_HDR_LEN);
		rl_qhdr_encode(p, &h);
		nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 500);
		T_EQ_INT(nng_send(s, p, big, 0), 0);
		T_OK(nng_recvmsg(s, &m, 0) != 0);
		free(p);
	}
	nng_close(s);
	/* the broker still serves */
	T_EQ_INT(rl_qclient_open(&c, g_url, NULL), 0);
	T_EQ_INT(rl_qclient_ping(c), 0);
	T_OK(stat_num(c, "server", "bad_requests") >= 4);
	/* a put bigger than --max-msg is refused at once */
	{
		rl_qclient_opts o;
		rl_qclient *c2;
		rl_qclient_opts_default(&o);
		o.retry_ms = 1000;
		o.timeout_ms = 1000;
		rl_qclient_open(&c2, g_url, &o);
		rl_log_set_level(-2);
		T_OK(put_groups(c2, RL_QSTAGE_PROMPT, 1, 100, 8, 0) != 0);
		rl_log_set_level(RL_LOG_QUIET);
		rl_qclient_close(c2);
	}
	T_EQ_INT(rl_qclient_ping(c), 0);
	/* 8 clients at once */
	for (long i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, worker, (void *)i);
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], &ret);
		T_EQ_INT((long)ret, 0);
	}
	T_EQ_INT(stat_num(c, "total", "put_generated"), 240);
	/* long poll: a train lease waits for a group put 300 ms later */
	rl_qlease_init(&l);
	pthread_create(&th[0], NULL, late_put, NULL);
	t0 = rl_now();
	T_EQ_INT(rl_qclient_lease_scored(c, 8, 2, 5000, &l), 0);
	T_EQ_INT(rl_qlease_count(&l), 2);
	T_OK(rl_now() - t0 < 2.0, "long poll took %.2fs", rl_now() - t0);
	pthread_join(th[0], NULL);
	/* nothing there: a lease with a short wait comes back empty */
	t0 = rl_now();
	T_EQ_INT(rl_qclient_lease_scored(c, 8, 1, 200, &l), 0);
	T_EQ_INT(l.id, 0);
	T_OK(rl_now() - t0 >= 0.15);
	/* consumer-side dedup: a lease expires after its records were trained
	 * (the late ack is refused); the redelivery is dropped by the client
	 * and acknowledged, never handed to the caller again */
	{
		rl_qlease_req req = { .stage = RL_QSTAGE_SCORED, .max_records = 8, .lease_ms = 200 };
		rl_qack_result ar;
		double done0 = stat_num(c, "total", "done");
		T_EQ_INT(put_groups(c, RL_QSTAGE_SCORED, 910, 1, 2, 0), 0);
		T_EQ_INT(rl_qclient_lease(c, &req, &l), 0);
		T_EQ_INT(rl_qlease_count(&l), 2);
		usleep(400000);
		T_EQ_INT(rl_qclient_ack(c, &l, &ar), RL_ENOENT);
		req.wait_ms = 2000;
		T_EQ_INT(rl_qclient_lease(c, &req, &l), 0);
		T_EQ_INT(rl_qlease_count(&l), 0);
		T_EQ_INT(l.dropped, 2);
		T_EQ_INT(stat_num(c, "total", "done"), done0 + 2);
	}
	/* random requests with a valid header: every one gets a reply */
	{
		nng_socket r;
		uint8_t buf[RL_QP_HDR_LEN + 2048];
		int replies = 0, n = 300;
		T_EQ_INT(nng_req0_open(&r), 0);
		nng_socket_set_ms(r, NNG_OPT_RECVTIMEO, 3000);
		nng_socket_set_ms(r, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
		T_EQ_INT(nng_dial(r, g_url, NULL, 0), 0);
		for (int i = 0; i < n; i++) {
			rl_qhdr rq = { 0 };
			size_t len = RL_QP_HDR_LEN + (size_t)(random() % 2048);
			for (size_t k = RL_QP_HDR_LEN; k < len; k++)
				buf[k] = (uint8_t)random();
			if (i % 3 == 0 && len >= RL_QP_HDR_LEN + 16) {
				/* a plausible batch header: the records' decoder gets the garbage */
				memcpy(buf + RL_QP_HDR_LEN, RL_TRAJ_MAGIC, 4);
				rl_le16_put(buf + RL_QP_HDR_LEN + 4, RL_TRAJ_VERSION);
				rl_le16_put(buf + RL_QP_HDR_LEN + 6, RL_TRAJ_HEADER_LEN);
				rl_le32_put(buf + RL_QP_HDR_LEN + 8, (uint32_t)(random() % 4));
			}
			rq.op = (uint8_t)(1 + random() % 6);
			rq.flags = (uint16_t)(random() % 4);
			rq.raw_len = (uint32_t)(random() % 4096);
			rq.arg = (uint64_t)(random() % 4);
			rl_qhdr_encode(buf, &rq);
			if (nng_send(r, buf, len, 0) == 0 && nng_recvmsg(r, &m, 0) == 0) {
				rl_qhdr rh2;
				if (rl_qhdr_decode(&rh2, nng_msg_body(m), nng_msg_len(m)) == 0 && (rh2.op & RL_QOP_REPLY))
					replies++;
				nng_msg_free(m);
			}
		}
		nng_close(r);
		T_EQ_INT(replies, n);
		T_EQ_INT(rl_qclient_ping(c), 0);
	}
	rl_qlease_fini(&l);
	rl_qclient_close(c);
	stop(b, SIGTERM);
}

/* ---- scenario: kill -9 a consumer holding leases ----------------------------------------------- */
static void
consumer_hold(const char *url, int out)
{
	rl_qclient *c;
	rl_qlease l;
	rl_traj *t;
	int held = 0;

	rl_traj_create(&t);
	rl_qlease_init(&l);
	if (rl_qclient_open(&c, url, NULL) != 0)
		_exit(2);
	while (held < 2) {
		if (rl_qclient_lease_scored(c, 8, 1, 5000, &l) != 0)
			_exit(2);
		if (l.id == 0)
			continue;
		for (size_t i = 0; i < rl_qlease_count(&l); i++)
			say(out, "%llu\n", (unsigned long long)rec_u64(&l, i, RL_TAG_ID, t));
		held++;
	}
	say(out, "ready\n");
	pause();
	_exit(0);
}

static void
consumer_ack(const char *url, int go, int out)
{
	rl_qclient *c;
	rl_qlease l;
	rl_qack_result ar;
	rl_traj *t;
	char line[64];

	if (!read_line(go, line, sizeof line, 30000))
		_exit(2);
	rl_traj_create(&t);
	rl_qlease_init(&l);
	if (rl_qclient_open(&c, url, NULL) != 0)
		_exit(2);
	for (;;) {
		if (rl_qclient_lease_scored(c, 8, 1, 3000, &l) != 0)
			_exit(2);
		if (l.id == 0)
			break;
		for (size_t i = 0; i < rl_qlease_count(&l); i++)
			say(out, "%llu\n", (unsigned long long)rec_u64(&l, i, RL_TAG_ID, t));
		if (rl_qclient_ack(c, &l, &ar) != 0)
			_exit(2);
	}
	_exit(0);
}

static void
scenario_kill_consumer(void)
{
	static const char *const extra[] = { "--lease-timeout", "1", NULL };
	int port = 0, kp[2], gp[2], go[2], seen[40] = { 0 }, nk = 0, ng = 0, dup = 0;
	char url[64], line[64];
	uint64_t kids[40];
	pid_t b = broker(&port, url, extra), k, g;
	rl_qclient *c;

	T_OK(b > 0);
	if (b <= 0)
		return;
	if (pipe(kp) || pipe(gp) || pipe(go))
		return;
	if ((k = fork()) == 0) {
		close(kp[0]);
		consumer_hold(url, kp[1]);
	}
	if ((g = fork()) == 0) {
		close(gp[0]);
		close(go[1]);
		consumer_ack(url, go[0], gp[1]);
	}
	close(kp[1]);
	close(gp[1]);
	close(go[0]);
	T_EQ_INT(rl_qclient_open(&c, url, NULL), 0);
	/* 10 groups of 4: ids g*16 + i for g = 1..10 */
	T_EQ_INT(put_groups(c, RL_QSTAGE_SCORED, 1, 10, 4, 0), 0);
	while (read_line(kp[0], line, sizeof line, 10000) && strcmp(line, "ready") != 0)
		if (nk < 40)
			kids[nk++] = strtoull(line, NULL, 10);
	T_EQ_INT(nk, 16);
	stop(k, SIGKILL);
	T_EQ_INT(write(go[1], "go\n", 3), 3);
	while (read_line(gp[0], line, sizeof line, 20000)) {
		uint64_t id = strtoull(line, NULL, 10);
		int gi = (int)(id / 16) - 1, ii = (int)(id % 16);
		ng++;
		if (gi >= 0 && gi < 10 && ii < 4 && seen[gi * 4 + ii]++)
			dup++;
	}
	{
		int st;
		waitpid(g, &st, 0);
		T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	/* each record trained exactly once, the killed consumer's included */
	T_EQ_INT(ng, 40);
	T_EQ_INT(dup, 0);
	for (int i = 0; i < 40; i++)
		T_EQ_INT(seen[i], 1);
	for (int i = 0; i < nk; i++) {
		int gi = (int)(kids[i] / 16) - 1, ii = (int)(kids[i] % 16);
		T_OK(gi >= 0 && gi < 10 && seen[gi * 4 + ii] == 1);
	}
	T_OK(stat_num(c, "total", "expired_records") >= 16);
	T_EQ_INT(stat_num(c, "total", "done"), 40);
	rl_qclient_close(c);
	stop(b, SIGTERM);
}

/* ---- scenario: kill -9 the broker under load ------------------------------------------------------ */
#define NB 120   /* producer batches of 4 groups x 4 samples */

static void
producer(const char *url, int out)
{
	rl_qclient_opts o;
	rl_qclient *c;

	rl_qclient_opts_default(&o);
	o.retry_ms = 30000;
	o.timeout_ms = 1000;
	if (rl_qclient_open(&c, url, &o) != 0)
		_exit(2);
	for (int b = 0; b < NB; b++) {
		if (put_groups(c, RL_QSTAGE_SCORED, 1000 + (uint64_t)b * 4, 4, 4, 0) != 0)
			_exit(2);
		say(out, "%d\n", b);
		usleep(3000);
	}
	say(out, "end\n");
	_exit(0);
}

static void
trainer(const char *url, int stopfd, int out)
{
	rl_qclient_opts o;
	rl_qclient *c;
	rl_qlease l;
	rl_qack_result ar;
	rl_traj *t;
	unsigned dropped = 0;

	rl_qclient_opts_default(&o);
	o.retry_ms = 30000;
	o.timeout_ms = 1000;
	rl_traj_create(&t);
	rl_qlease_init(&l);
	if (rl_qclient_open(&c, url, &o) != 0)
		_exit(2);
	for (;;) {
		struct pollfd p = { .fd = stopfd, .events = POLLIN };
		if (poll(&p, 1, 0) > 0)
			break;
		if (rl_qclient_lease_scored(c, 32, 1, 300, &l) != 0)
			_exit(2);
		for (size_t i = 0; i < rl_qlease_count(&l); i++)
			say(out, "%llu\n", (unsigned long long)rec_u64(&l, i, RL_TAG_ID, t));
		if (l.id) {
			int rv = rl_qclient_ack(c, &l, &ar);
			if (rv != 0 && rv != RL_ENOENT)   /* ENOENT: the lease expired while the broker was down */
				_exit(4);
		}
		dropped += l.dropped;
	}
	say(out, "dropped %u\n", dropped);
	_exit(0);
}

static void
scenario_kill_broker(void)
{
	char dir[] = "/tmp/rlq-net-XXXXXX", url[64], line[64];
	const char *extra[] = { "--data-dir", dir, "--lease-timeout", "2", NULL };
	int port = 0, pp[2], tp[2], sp[2], acked = -1, done = 0, dup = 0, killed = 0, ended = 0;
	static uint8_t seen[(1000 + NB * 4 + 4) * 16];
	pid_t b, p, tr;
	rl_qclient *c;
	double t_end;

	if (mkdtemp(dir) == NULL)
		return;
	b = broker(&port, url, extra);
	T_OK(b > 0);
	if (b <= 0 || pipe(pp) || pipe(tp) || pipe(sp))
		return;
	if ((p = fork()) == 0) {
		close(pp[0]);
		producer(url, pp[1]);
	}
	if ((tr = fork()) == 0) {
		close(tp[0]);
		close(sp[1]);
		trainer(url, sp[0], tp[1]);
	}
	close(pp[1]);
	close(tp[1]);
	close(sp[0]);
	fcntl(tp[0], F_SETFL, O_NONBLOCK);
	/* collect what the trainer receives as it comes */
	t_end = rl_now() + 60;
	while (!ended && rl_now() < t_end) {
		if (!read_line(pp[0], line, sizeof line, 5000))
			break;
		if (strcmp(line, "end") == 0)
			ended = 1;
		else
			acked = atoi(line);
		if (!killed && acked >= 40) {
			stop(b, SIGKILL);   /* mid-load */
			killed = 1;
			b = broker(&port, url, extra);
			T_OK(b > 0, "broker did not restart");
		}
	}
	T_OK(ended);
	T_EQ_INT(acked, NB - 1);
	T_OK(killed);
	/* let the trainer drain, then stop it */
	T_EQ_INT(rl_qclient_open(&c, url, NULL), 0);
	for (t_end = rl_now() + 20; rl_now() < t_end; usleep(100000)) {
		if (stat_num(c, "total", "done") >= 0 && stat_num(c, NULL, "groups") == 0)
			break;
	}
	T_EQ_INT(stat_num(c, NULL, "groups"), 0);
	T_EQ_INT(write(sp[1], "x", 1), 1);
	fcntl(tp[0], F_SETFL, 0);
	while (read_line(tp[0], line, sizeof line, 10000)) {
		uint64_t id;
		if (strncmp(line, "dropped", 7) == 0)
			break;
		id = strtoull(line, NULL, 10);
		if (id < sizeof seen) {
			if (seen[id]++)
				dup++;
			done++;
		}
	}
	{
		int st = 0;
		if (waitpid(tr, &st, WNOHANG) == tr)
			T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "trainer failed: %s %d", WIFEXITED(st) ? "exit" : "signal",
			    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
	stop(tr, SIGTERM);
	stop(p, SIGTERM);
	/* every acknowledged record reached the trainer, none twice */
	T_EQ_INT(dup, 0);
	for (int bb = 0; bb < NB; bb++)
		for (int g = 0; g < 4; g++)
			for (int i = 0; i < 4; i++) {
				uint64_t id = (1000 + (uint64_t)bb * 4 + (uint64_t)g) * 16 + (uint64_t)i;
				T_OK(seen[id] == 1, "record %llu seen %d times", (unsigned long long)id, seen[id]);
			}
	T_EQ_INT(done, NB * 16);
	rl_qclient_close(c);
	stop(b, SIGTERM);
	{
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		T_EQ_INT(system(cmd), 0);
	}
}

/* ---- scenario: staleness bound under a fast producer ---------------------------------------------- */
static void
rollout(const char *url, int out)
{
	rl_qclient *c;
	rl_qlease l;
	rl_traj *t;
	int idle = 0;

	rl_traj_create(&t);
	rl_qlease_init(&l);
	if (rl_qclient_open(&c, url, NULL) != 0)
		_exit(2);
	while (idle < 3) {
		if (rl_qclient_lease_prompts(c, 4, 4, 1000, &l) != 0)
			_exit(2);
		if (l.id == 0) {
			idle++;
			continue;
		}
		idle = 0;
		for (size_t i = 0; i < rl_qlease_count(&l); i++) {
			uint64_t g = rec_u64(&l, i, RL_TAG_GROUP, t);
			/* samples carry the version in force when the prompt was leased */
			if (put_groups(c, RL_QSTAGE_GENERATED, g, 1, 4, (int)l.version) != 0)
				_exit(2);
		}
	}
	say(out, "idle\n");
	_exit(0);
}

static void
scenario_staleness(int K)
{
	char url[64], ks[8], line[32];
	/* the gate in samples: (K+1) x 2 groups x 4 samples = (K+1) x 8 */
	const char *extra[] = { "--max-staleness", ks, "--train-batch", "2", NULL };
	int port = 0, rp[2], worst = 0, steps = 12, bad = 0;
	pid_t b, r;
	rl_qclient *c;
	rl_qlease rl;
	rl_traj *t;
	rl_qack_result ar;
	rl_traj_batch *pb;
	uint64_t v = 0;

	snprintf(ks, sizeof ks, "%d", K);
	b = broker(&port, url, extra);
	T_OK(b > 0);
	if (b <= 0 || pipe(rp))
		return;
	if ((r = fork()) == 0) {
		close(rp[0]);
		rollout(url, rp[1]);
	}
	close(rp[1]);
	rl_traj_create(&t);
	rl_qlease_init(&rl);
	T_EQ_INT(rl_qclient_open(&c, url, NULL), 0);
	/* 60 prompts, 4 samples each: far more than the trainer takes */
	rl_traj_batch_create(&pb);
	for (int i = 1; i <= 60; i++)
		add(pb, t, (uint64_t)i * 16 + 15, (uint64_t)i, 0, 4, -1, 0);   /* prompt id apart from sample ids */
	{
		rl_qput_result res;
		T_EQ_INT(rl_qclient_put_prompts(c, pb, &res), 0);
		T_EQ_INT(res.accepted, 60);
	}
	rl_traj_batch_destroy(pb);
	/* a fake reward stage: score what is generated (in this process, a thread would do too) */
	for (int step = 0; step < steps; step++) {
		rl_qlease ls[8];
		size_t got = 0;
		int nl = 0;
		double t_end = rl_now() + 10;
		while (got < 8 && nl < 8 && rl_now() < t_end) {
			rl_qlease g;
			rl_qlease_init(&g);
			if (rl_qclient_lease_generated(c, 64, 50, &g) == 0 && g.id) {
				rl_qput_result pr;
				T_EQ_INT(rl_qclient_put_scored(c, g.batch, &pr), 0);
			}
			rl_qlease_fini(&g);
			rl_qlease_init(&ls[nl]);
			if (rl_qclient_lease_scored(c, (uint32_t)(8 - got), (uint32_t)(8 - got), 50, &ls[nl]) != 0 ||
			    ls[nl].id == 0) {
				rl_qlease_fini(&ls[nl]);
				continue;
			}
			for (size_t i = 0; i < rl_qlease_count(&ls[nl]); i++) {
				int ver = rec_version(&ls[nl], i, t);
				if (ver < 0 || (int)v - ver > K)
					bad++;
				if ((int)v - ver > worst)
					worst = (int)v - ver;
			}
			got += rl_qlease_count(&ls[nl]);
			nl++;
		}
		T_OK(got >= 8, "step %d: only %zu samples", step, got);
		/* in flight never above (K+1) x B */
		T_OK(stat_num(c, NULL, "inflight") <= (K + 1) * 8);
		/* a laggard puts a group generated long ago: it must never arrive */
		if (step == 6)
			T_EQ_INT(put_groups(c, RL_QSTAGE_SCORED, 5000, 1, 4, 0), 0);
		/* the new version first, then the acks that free the gate: so
		 * nothing is leased to rollout at the old version in between */
		v++;
		T_EQ_INT(rl_qclient_set_version(c, v, NULL), 0);
		for (int i = 0; i < nl; i++) {
			T_EQ_INT(rl_qclient_ack(c, &ls[i], &ar), 0);
			rl_qlease_fini(&ls[i]);
		}
	}
	T_EQ_INT(bad, 0);
	T_OK(worst <= K, "worst staleness %d > K %d", worst, K);
	T_OK(stat_num(c, "total", "gate_blocked") > 0);
	T_OK(stat_num(c, "total", "stale_dropped") >= 4);
	/* the producer stopped for lack of admission, not of prompts */
	T_OK(stat_num(c, "depth", "prompt") > 0);
	rl_qlease_fini(&rl);
	rl_traj_destroy(t);
	rl_qclient_close(c);
	stop(r, SIGKILL);
	(void)line;
	stop(b, SIGTERM);
}

/* Runs fn in a child process under an alarm; the child's failures count. */
static void
run(const char *name, void (*fn)(void), int secs)
{
	pid_t pid;
	int st;

	fflush(stdout);
	if ((pid = fork()) == 0) {
		setpgid(0, 0);
		alarm((unsigned)secs);
		t_fail = 0;
		srandom((unsigned)getpid() ^ (unsigned)time(NULL));
		t_pass = 0;
		fn();
		printf("  %s: %d checks, %d failed\n", name, t_pass + t_fail, t_fail);
		fflush(stdout);
		_exit(t_fail ? 1 : 0);
	}
	waitpid(pid, &st, 0);
	kill(-pid, SIGKILL);   /* anything the scenario left behind */
	T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s %d", name,
	    WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

static void staleness1(void) { scenario_staleness(1); }
static void staleness0(void) { scenario_staleness(0); }

/* ---- scenario: a broker that does not answer vs one that answers busy or nothing ------------------ */
static void *
drain_later(void *arg)
{
	const char *url = arg;
	rl_qclient *c;
	rl_qlease l;
	rl_qack_result ar;

	usleep(2500000);   /* longer than the stage client's broker timeout below */
	rl_qlease_init(&l);
	if (rl_qclient_open(&c, url, NULL) == 0) {
		for (int i = 0; i < 20 && rl_qclient_lease_scored(c, 1000, 1, 100, &l) == 0 && l.id; i++)
			rl_qclient_ack(c, &l, &ar);
		rl_qclient_close(c);
	}
	rl_qlease_fini(&l);
	return NULL;
}

static void
scenario_broker_gone(void)
{
	static const char *const extra[] = { "--max-bytes", "8K", NULL };
	char url[64];
	int port = 0, rv = 0, nput = 0;
	pid_t b = broker(&port, url, extra);
	rl_qclient_opts o;
	rl_qclient *fast, *c;
	rl_qlease l;
	pthread_t th;
	double t0;

	T_OK(b > 0);
	if (b <= 0)
		return;
	rl_qlease_init(&l);
	/* fill the broker until it answers busy */
	rl_qclient_opts_default(&o);
	o.retry_ms = 0;
	T_EQ_INT(rl_qclient_open(&fast, url, &o), 0);
	while (nput < 100 && (rv = put_groups(fast, RL_QSTAGE_SCORED, 100 + (uint64_t)nput, 1, 4, 0)) == 0)
		nput++;
	T_EQ_INT(rv, RL_EBUSY);
	T_OK(nput > 0);
	rl_qclient_close(fast);
	/* a stage's client with a 1 s broker timeout: busy for 2.5 s is an answer,
	 * not silence; the put goes through once a consumer drains */
	rl_qclient_opts_stage(&o, 1.0);
	T_EQ_INT(o.broker_timeout_ms, 1000);
	T_EQ_INT(rl_qclient_open(&c, url, &o), 0);
	pthread_create(&th, NULL, drain_later, url);
	t0 = rl_now();
	T_EQ_INT(put_groups(c, RL_QSTAGE_SCORED, 1000, 1, 4, 0), 0);
	T_OK(rl_now() - t0 > 1.5, "the busy put ended after %.2f s", rl_now() - t0);
	T_EQ_INT(rl_qclient_gone(c), 0);
	pthread_join(th, NULL);
	/* a lease that waits 2 s for work and gets none: the wait is not silence */
	t0 = rl_now();
	T_EQ_INT(rl_qclient_lease_prompts(c, 1, 1, 2000, &l), 0);
	T_EQ_INT((int)l.id, 0);
	T_OK(rl_now() - t0 > 1.5);
	T_EQ_INT(rl_qclient_gone(c), 0);
	/* no answer at all: RL_ETIMEDOUT after about the timeout, and at once after that */
	stop(b, SIGKILL);
	rl_log_set_level(-2);
	t0 = rl_now();
	T_EQ_INT(rl_qclient_ping(c), RL_ETIMEDOUT);
	T_OK(rl_now() - t0 >= 0.9 && rl_now() - t0 < 5, "gone after %.2f s", rl_now() - t0);
	T_EQ_INT(rl_qclient_gone(c), 1);
	t0 = rl_now();
	T_EQ_INT(rl_qclient_lease_prompts(c, 1, 1, 200, &l), RL_ETIMEDOUT);
	T_OK(rl_now() - t0 < 0.1);
	rl_log_set_level(RL_LOG_QUIET);
	rl_qlease_fini(&l);
	rl_qclient_close(c);
}

int
main(void)
{
	const char *b = getenv("RL_BUILD");

	T_BEGIN("test_queue_net");
	snprintf(bin, sizeof bin, "%s/bin/rl-queue", b ? b : "build");
	if (access(bin, X_OK) != 0)
		T_SKIP("no %s (build it first)", bin);
	rl_log_init("test_queue_net", RL_LOG_QUIET);
	signal(SIGPIPE, SIG_IGN);
	run("bad requests", scenario_bad_requests, 60);
	run("kill consumer", scenario_kill_consumer, 60);
	run("kill broker", scenario_kill_broker, 90);
	run("staleness K=1", staleness1, 60);
	run("staleness K=0", staleness0, 60);
	run("broker gone", scenario_broker_gone, 60);
	T_END();
}

/*
 * bench/sync.c — seconds to deliver a GPT-2-124M-sized bf16 weight set
 * (~250 MB, written as a safetensors file) from an rl-sync server to 1 and 4
 * subscribers on loopback, whole and as a delta after a typical RL update,
 * with bytes on the wire; and, in the same run, the seconds to copy the same
 * bytes to the same number of receivers through plain loopback TCP sockets.
 *
 * Prints one JSON object per case on stdout.
 *   build/bench/sync [--mb N] [--lr X] [--subs 1,4] [--level L] [--parallel N]
 *                    [--stored|--compress] [--reps N] [--transport auto|shm|stream|nng]
 *                    [--push-only] [--push-parts 1,2,4]
 * Each figure is the median of --reps (5) interleaved runs; "cpu" figures are
 * the process's user + system seconds over the same interval (less sensitive
 * to other load on a shared machine than wall-clock seconds), and
 * vs_raw_tcp_paired is the median of the per-repetition ratios (each pair
 * taken back to back).  The load average is printed with each case.
 * Whole chunks: by default (as the library does for a server on this host)
 * uncompressed, over the server's bulk stream; --compress asks for them
 * zstd-compressed over REQ/REP; --stored forces uncompressed.  Deltas are
 * always compressed.
 * --transport (default stream, the rows before shared memory existed): shm
 * maps the server's sealed memfd (docs/sync.md) — "seconds" is then
 * fetch_into (one copy out of the mapping into the worker's buffer, plus
 * the checksum pass), "seconds_fresh_alloc" is fetch (map + checksum pass,
 * no copy).  The server always keeps its versions in a memfd, so
 * push_seconds include that one copy.
 * --mb scales the model down (tensor shapes are kept, layers dropped) for a
 * quick run; the default is the full 124M parameters.
 *
 * --push-only: the trainer's side only.  Median seconds (and CPU seconds)
 * to push a new version to a server on this host, version after version,
 * three ways: "delta" (chunks, XOR against the previous version + zstd: what
 * rl-train did before shared memory, and still does to a server on another
 * host), "whole" (uncompressed chunks over REQ/REP, no delta), "shm" (the
 * default to a server on this host: one sealed memfd handed over, checked
 * by the server); and, for reference, "dir": the same bytes written as a
 * version directory (rl_wdir_publish_ver, with fsync) under $TMPDIR.  The
 * other passes push with the stream transport (chunks), as they did before
 * the shared memory push existed, so their delta rows stay comparable.
 *
 * --push-parts P1,P2,..: seconds to push a version as P parts by P threads
 * at once, each with its own connection (the ranks of rl-train
 * --push-parts), until the last part's push returned (the server then has
 * assembled, re-hashed and published it): whole (uncompressed chunks), then
 * as deltas (each part against the previous version's part).
 *
 * The delta case: fp32 master weights w ~ N(0, 0.02) (layer-norm gains ~ 1),
 * one Adam-like step w -= lr * g with |g| ~ 1 (Adam normalises the update),
 * both versions rounded to bf16.
 */
#include "base/core.h"
#include "sync/wdir.h"
#include "sync/wsync.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <unistd.h>

static uint64_t
xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* approximately N(0, 1): sum of 4 uniforms, scaled */
static float
gauss(uint64_t *s)
{
	float u = 0;

	for (int k = 0; k < 4; k++)
		u += (float)(xs(s) >> 40) / (float)(1 << 24) - 0.5f;
	return u * 1.7320508f;
}

typedef struct tinfo {
	char name[64];
	size_t rows, cols;
	int norm; /* layer-norm gain: ~1 */
} tinfo;

/* GPT-2 124M's tensors; nlayer layers */
static int
gpt2_tensors(tinfo *t, int nlayer)
{
	int n = 0;
	const char *per[] = { "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
			      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
			      "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias" };
	size_t shp[][2] = { { 768, 1 }, { 768, 1 }, { 768, 2304 }, { 2304, 1 }, { 768, 768 }, { 768, 1 },
			    { 768, 1 }, { 768, 1 }, { 768, 3072 }, { 3072, 1 }, { 3072, 768 }, { 768, 1 } };

	t[n++] = (tinfo){ "wte.weight", 50257, 768, 0 };
	t[n++] = (tinfo){ "wpe.weight", 1024, 768, 0 };
	for (int l = 0; l < nlayer; l++)
		for (int k = 0; k < 12; k++) {
			snprintf(t[n].name, sizeof t[n].name, "h.%d.%s", l, per[k]);
			t[n].rows = shp[k][0];
			t[n].cols = shp[k][1];
			t[n].norm = strstr(per[k], "ln_") && strstr(per[k], "weight");
			n++;
		}
	t[n++] = (tinfo){ "ln_f.weight", 768, 1, 1 };
	t[n++] = (tinfo){ "ln_f.bias", 768, 1, 0 };
	return n;
}

/* safetensors bytes for bf16 values w (nparam) laid out as t */
static uint8_t *
safetensors(size_t *outn, const tinfo *t, int nt, const uint16_t *w, size_t nparam)
{
	size_t cap = 64 + (size_t)nt * 160, hl = 0, off = 0, total;
	char *h = malloc(cap);
	uint8_t *p;

	hl += (size_t)snprintf(h + hl, cap - hl, "{");
	for (int i = 0; i < nt; i++) {
		size_t n = t[i].rows * t[i].cols * 2;
		if (t[i].cols == 1)
			hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%zu],"
					       "\"data_offsets\":[%zu,%zu]}", i ? "," : "", t[i].name, t[i].rows, off, off + n);
		else
			hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%zu,%zu],"
					       "\"data_offsets\":[%zu,%zu]}", i ? "," : "", t[i].name, t[i].rows, t[i].cols,
					       off, off + n);
		off += n;
	}
	hl += (size_t)snprintf(h + hl, cap - hl, "}");
	while (hl % 8)
		h[hl++] = ' ';
	total = 8 + hl + nparam * 2;
	p = rl_xmalloc(total);
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(p + 8, h, hl);
	memcpy(p + 8 + hl, w, nparam * 2);
	free(h);
	*outn = total;
	return p;
}

/* user + system seconds of this process */
static double
cpu_now(void)
{
	struct rusage r;

	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

/* ---- raw TCP baseline ----------------------------------------------------------- */
typedef struct tcpjob {
	int fd;
	const uint8_t *src;
	uint8_t *dst;
	size_t n;
} tcpjob;

static void *
tcp_send(void *arg)
{
	tcpjob *j = arg;
	size_t done = 0;

	while (done < j->n) {
		ssize_t w = send(j->fd, j->src + done, RL_MIN((size_t)1 << 20, j->n - done), 0);
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	shutdown(j->fd, SHUT_WR);
	return NULL;
}

static void *
tcp_recv(void *arg)
{
	tcpjob *j = arg;
	size_t done = 0;

	while (done < j->n) {
		ssize_t r = recv(j->fd, j->dst + done, j->n - done, 0);
		if (r <= 0)
			break;
		done += (size_t)r;
	}
	return NULL;
}

/* seconds to copy n bytes to k receivers over loopback TCP (connections set up before the clock) */
static double
raw_tcp(const uint8_t *src, size_t n, int k, double *cpu)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	tcpjob snd[8], rcv[8];
	pthread_t ts[8], tr[8];
	double t0, t;

	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	bind(ls, (struct sockaddr *)&a, sizeof a);
	getsockname(ls, (struct sockaddr *)&a, &al);
	listen(ls, 16);
	for (int i = 0; i < k; i++) {
		rcv[i].fd = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(rcv[i].fd, (struct sockaddr *)&a, sizeof a) != 0) {
			perror("connect");
			exit(1);
		}
		snd[i].fd = accept(ls, NULL, NULL);
		snd[i].src = src;
		snd[i].n = rcv[i].n = n;
		rcv[i].dst = rl_xmalloc(n);
		memset(rcv[i].dst, 0, n); /* fault the pages in before the clock, as rl-sync's are not */
	}
	*cpu = cpu_now();
	t0 = rl_now();
	for (int i = 0; i < k; i++) {
		pthread_create(&tr[i], NULL, tcp_recv, &rcv[i]);
		pthread_create(&ts[i], NULL, tcp_send, &snd[i]);
	}
	for (int i = 0; i < k; i++) {
		pthread_join(ts[i], NULL);
		pthread_join(tr[i], NULL);
	}
	t = rl_now() - t0;
	*cpu = cpu_now() - *cpu;
	for (int i = 0; i < k; i++) {
		if (memcmp(rcv[i].dst, src, n) != 0)
			fprintf(stderr, "sync: raw tcp copy differs\n");
		close(snd[i].fd);
		close(rcv[i].fd);
		free(rcv[i].dst);
	}
	close(ls);
	return t;
}

/* ---- rl-sync subscribers -------------------------------------------------------------- */
static int stored, transport = RL_WSYNC_T_STREAM;

static double median(double *x, int n);

/* --push-only: pushes of versions alternating between the contents a and b
 * (each push's base is the previous one), one way; prints one JSON line */
static int
push_only(const char *url, const char *how, rl_wver *a, rl_wver *b, int reps, uint64_t *ver, size_t nparam)
{
	rl_wsync_client_opts po = { .timeout_ms = 60000 };
	rl_wsync_client *pc = NULL;
	double ts[16], cs[16], la[2][3];
	int dir = strcmp(how, "dir") == 0, delta = strcmp(how, "delta") == 0;
	char d[4096];
	rl_wsync_stats st;

	po.transport = strcmp(how, "shm") == 0 ? RL_WSYNC_T_SHM : RL_WSYNC_T_STREAM;
	if (dir) {
		const char *tmp = getenv("TMPDIR");
		snprintf(d, sizeof d, "%s/rl-bench-sync.%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
	} else if (rl_wsync_client_open(&pc, url, &po) != 0) {
		return 1;
	}
	getloadavg(la[0], 3);
	for (int r = -1; r < reps; r++) { /* r = -1: the first version, not timed */
		rl_wver *v = (r & 1) ? a : b, *base = (r & 1) ? b : a;
		double t, c;
		int rv;
		v->version = ++*ver;
		rl_wver_hash(v); /* outside the timer: the trainer has the hashes at hand either way */
		c = cpu_now();
		t = rl_now();
		rv = dir ? rl_wdir_publish_ver(d, v, 2) : rl_wsync_push(pc, v, delta && r >= 0 ? base : NULL);
		t = rl_now() - t;
		c = cpu_now() - c;
		if (rv != 0) {
			fprintf(stderr, "sync: push (%s) failed: %s\n", how, rl_strerror(rv));
			return 1;
		}
		if (r >= 0) {
			ts[r] = t;
			cs[r] = c;
		}
	}
	getloadavg(la[1], 3);
	if (pc)
		rl_wsync_client_stats(pc, &st, 0);
	else
		memset(&st, 0, sizeof st);
	printf("{\"bench\":\"sync\",\"case\":\"push\",\"how\":\"%s\",\"params\":%zu,\"bytes\":%llu,\"reps\":%d,"
	       "\"push_seconds\":%.3f,\"push_cpu_seconds\":%.3f,\"push_wire_bytes_per_version\":%llu,"
	       "\"shm_versions\":%llu,\"load_avg\":[%.2f,%.2f]}\n",
	       how, nparam, (unsigned long long)rl_wver_total(a), reps, median(ts, reps), median(cs, reps),
	       (unsigned long long)(st.bytes_sent / (uint64_t)(reps + 1)), (unsigned long long)st.shm_versions,
	       la[0][0], la[1][0]);
	fflush(stdout);
	rl_wsync_client_close(pc);
	if (dir) {
		char cmd[4200];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
		if (system(cmd) != 0)
			fprintf(stderr, "sync: cannot remove %s\n", d);
	}
	return 0;
}
/* --push-parts: one version pushed as P parts by P threads at once, each
 * with its own client (as P trainer ranks): the model file cut into P byte
 * ranges, blobs model-0000k-of-0000P.safetensors (config.json with part 0),
 * borrowed from a or b.  "seconds": from the start until every part's push
 * returned (the last one returns when the server has published).  how:
 * "whole" (uncompressed chunks) or "delta" (each part against its previous
 * one). */
typedef struct partjob {
	const char *url;
	rl_wver *v, *base;
	int index, count, rv;
} partjob;

static void *
part_main(void *arg)
{
	partjob *j = arg;
	rl_wsync_client_opts po = { .timeout_ms = 60000, .transport = RL_WSYNC_T_STREAM };
	rl_wsync_client *pc = NULL;

	if ((j->rv = rl_wsync_client_open(&pc, j->url, &po)) == 0)
		j->rv = rl_wsync_push_part(pc, j->v, j->base, j->index, j->count, NULL);
	rl_wsync_client_close(pc);
	return NULL;
}

/* part k of P of the version whose model file is f (n bytes) */
static rl_wver *
part_ver(const uint8_t *f, uint64_t n, int k, int P)
{
	rl_wver *v;
	char name[64];
	uint64_t lo = n * (uint64_t)k / (uint64_t)P, hi = n * (uint64_t)(k + 1) / (uint64_t)P;

	rl_wver_create(&v, 0);
	snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, P);
	rl_wver_add_blob(v, name, f + lo, hi - lo, 2, 0);
	if (k == 0)
		rl_wver_add_blob(v, "config.json", "{\"model_type\":\"gpt2\"}", 21, 1, 0);
	return v;
}

static int
push_parts(const char *url, const char *how, const uint8_t *fa, const uint8_t *fb, uint64_t n, int P, int reps,
    uint64_t *ver, size_t nparam)
{
	rl_wver *pa[8], *pb[8];
	double ts[16], cs[16], la[2][3];
	int delta = strcmp(how, "delta") == 0;

	for (int k = 0; k < P; k++) {
		pa[k] = part_ver(fa, n, k, P);
		pb[k] = part_ver(fb, n, k, P);
	}
	getloadavg(la[0], 3);
	for (int r = -1; r < reps; r++) { /* r = -1: the first version, not timed */
		pthread_t th[8];
		partjob jb[8];
		double t, c;
		int rv = 0;
		++*ver;
		for (int k = 0; k < P; k++) {
			rl_wver *v = (r & 1) ? pa[k] : pb[k];
			v->version = *ver;
			rl_wver_hash(v); /* outside the timer, as in push_only */
			jb[k] = (partjob){ url, v, delta && r >= 0 ? ((r & 1) ? pb[k] : pa[k]) : NULL, k, P, 0 };
		}
		c = cpu_now();
		t = rl_now();
		for (int k = 0; k < P; k++)
			pthread_create(&th[k], NULL, part_main, &jb[k]);
		for (int k = 0; k < P; k++) {
			pthread_join(th[k], NULL);
			rv = rv ? rv : jb[k].rv;
		}
		t = rl_now() - t;
		c = cpu_now() - c;
		if (rv != 0) {
			fprintf(stderr, "sync: push in %d parts (%s) failed: %s\n", P, how, rl_strerror(rv));
			return 1;
		}
		if (r >= 0) {
			ts[r] = t;
			cs[r] = c;
		}
	}
	getloadavg(la[1], 3);
	printf("{\"bench\":\"sync\",\"case\":\"push_parts\",\"how\":\"%s\",\"parts\":%d,\"params\":%zu,"
	       "\"bytes\":%llu,\"reps\":%d,\"push_seconds\":%.3f,\"push_cpu_seconds\":%.3f,"
	       "\"load_avg\":[%.2f,%.2f]}\n",
	       how, P, nparam, (unsigned long long)n + 21, reps, median(ts, reps), median(cs, reps), la[0][0], la[1][0]);
	fflush(stdout);
	for (int k = 0; k < P; k++) {
		rl_wver_destroy(pa[k]);
		rl_wver_destroy(pb[k]);
	}
	return 0;
}

static uint64_t bulk_chunks, all_chunks, shm_versions; /* of the last deliver() */

static double
median(double *x, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
			double t = x[j];
			x[j] = x[j - 1];
			x[j - 1] = t;
		}
	return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

typedef struct subjob {
	const char *url;
	int parallel;
	uint64_t version;
	const rl_wver *base;
	rl_wver *dst; /* preallocated buffer, or NULL: fetch allocates */
	rl_wver *got;
	rl_wsync_stats st;
	int rv;
} subjob;

static void *
sub_fetch(void *arg)
{
	subjob *j = arg;
	rl_wsync_client *c;
	rl_wsync_client_opts o = { .timeout_ms = 60000, .parallel = j->parallel, .stored = stored,
				   .transport = transport };

	if ((j->rv = rl_wsync_client_open(&c, j->url, &o)) != 0)
		return NULL;
	if (j->dst) {
		j->rv = rl_wsync_fetch_into(c, j->dst, j->version, j->base);
		j->got = j->dst;
	} else {
		j->rv = rl_wsync_fetch(c, &j->got, j->version, j->base);
	}
	rl_wsync_client_stats(c, &j->st, 0);
	rl_wsync_client_close(c);
	return NULL;
}

static double
deliver(const char *url, int k, int parallel, uint64_t version, rl_wver **bases, rl_wver **dsts, const rl_wver *want,
	uint64_t *wire, double *cpu)
{
	subjob j[8];
	pthread_t th[8];
	double c0 = cpu_now(), t0 = rl_now(), t;

	*wire = 0;
	bulk_chunks = all_chunks = shm_versions = 0;
	for (int i = 0; i < k; i++) {
		j[i] = (subjob){ .url = url, .parallel = parallel, .version = version, .base = bases ? bases[i] : NULL,
				 .dst = dsts ? dsts[i] : NULL };
		pthread_create(&th[i], NULL, sub_fetch, &j[i]);
	}
	for (int i = 0; i < k; i++)
		pthread_join(th[i], NULL);
	t = rl_now() - t0;
	*cpu = cpu_now() - c0;
	for (int i = 0; i < k; i++) {
		if (j[i].rv != 0 || j[i].got == NULL || j[i].got->hash != want->hash ||
		    memcmp(j[i].got->blobs[0].data, want->blobs[0].data, (size_t)want->blobs[0].size) != 0) {
			fprintf(stderr, "sync: subscriber %d got a wrong version (%s)\n", i, rl_strerror(j[i].rv));
			exit(1);
		}
		*wire += j[i].st.bytes_recv;
		bulk_chunks += j[i].st.bulk_chunks;
		all_chunks += j[i].st.chunks;
		shm_versions += j[i].st.shm_versions;
		if (j[i].dst == NULL)
			rl_wver_destroy(j[i].got);
	}
	return t;
}

int
main(int argc, char **argv)
{
	double mb = 0, lr = 1e-6;
	int reps = 5, level = 1, parallel = 4, subs[4] = { 1, 4 }, nsubs = 2, nlayer = 12, nt;
	tinfo t[2 + 12 * 24 + 2];
	size_t nparam = 0, fsize;
	float *master;
	uint16_t *w1, *w2;
	uint8_t *f1, *f2;
	rl_wver *v1, *v2;
	rl_wsync_server *srv;
	rl_wsync_server_opts so = { 0 };
	rl_wsync_client *pc;
	/* chunks, as before the shared memory push: the delta rows stay comparable */
	rl_wsync_client_opts po = { .timeout_ms = 60000, .transport = RL_WSYNC_T_STREAM };
	rl_wsync_stats st;
	int only_push = 0, nparts = 0, parts[4];
	char url[64];
	uint64_t changed = 0;

	rl_log_init("sync", RL_LOG_QUIET);
	mallopt(M_MMAP_THRESHOLD, 128 << 20); /* as rl-sync(1) does */
	mallopt(M_TRIM_THRESHOLD, 512 << 20);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc)
			mb = atof(argv[++i]);
		else if (strcmp(argv[i], "--lr") == 0 && i + 1 < argc)
			lr = atof(argv[++i]);
		else if (strcmp(argv[i], "--level") == 0 && i + 1 < argc)
			level = atoi(argv[++i]);
		else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
			reps = atoi(argv[++i]);
			reps = RL_MAX(1, RL_MIN(16, reps));
		}
		else if (strcmp(argv[i], "--stored") == 0)
			stored = 1;
		else if (strcmp(argv[i], "--push-only") == 0)
			only_push = 1;
		else if (strcmp(argv[i], "--push-parts") == 0 && i + 1 < argc) {
			char *s = argv[++i];
			for (char *tok = strtok(s, ","); tok && nparts < 4; tok = strtok(NULL, ","))
				parts[nparts++] = RL_MAX(1, RL_MIN(8, atoi(tok)));
		}
		else if (strcmp(argv[i], "--compress") == 0)
			stored = -1;
		else if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc) {
			if (rl_wsync_transport_parse(argv[++i], &transport) != 0 || transport == RL_WSYNC_T_FILE) {
				fprintf(stderr, "sync: --transport: auto, shm, stream or nng\n");
				return 2;
			}
		} else if (strcmp(argv[i], "--parallel") == 0 && i + 1 < argc)
			parallel = atoi(argv[++i]);
		else if (strcmp(argv[i], "--subs") == 0 && i + 1 < argc) {
			char *s = argv[++i];
			nsubs = 0;
			for (char *tok = strtok(s, ","); tok && nsubs < 4; tok = strtok(NULL, ","))
				subs[nsubs++] = RL_MAX(1, RL_MIN(8, atoi(tok)));
		} else {
			fprintf(stderr, "usage: sync [--mb N] [--lr X] [--subs 1,4] [--level L] [--parallel N] "
				"[--stored|--compress] [--reps N] [--transport T] [--push-only] [--push-parts 1,2,4]\n");
			return 2;
		}
	}
	if (mb > 0) /* drop layers to approach the size asked for (embeddings stay) */
		nlayer = RL_MAX(0, RL_MIN(12, (int)((mb * 1e6 / 2 - 39.4e6) / 7.09e6)));
	nt = gpt2_tensors(t, nlayer);
	for (int i = 0; i < nt; i++)
		nparam += t[i].rows * t[i].cols;

	/* version 1 and an Adam-like step for version 2 */
	master = rl_xmalloc(nparam * 4);
	w1 = rl_xmalloc(nparam * 2);
	w2 = rl_xmalloc(nparam * 2);
	{
		size_t o = 0;
		uint64_t s = 0x853c49e6748fea9bULL;
		for (int i = 0; i < nt; i++) {
			size_t n = t[i].rows * t[i].cols;
			for (size_t k = 0; k < n; k++, o++) {
				master[o] = t[i].norm ? 1.0f + 0.05f * gauss(&s) : 0.02f * gauss(&s);
				w1[o] = rl_f32_to_bf16(master[o]);
				master[o] -= (float)lr * gauss(&s);
				w2[o] = rl_f32_to_bf16(master[o]);
				changed += w1[o] != w2[o];
			}
		}
	}
	free(master);
	f1 = safetensors(&fsize, t, nt, w1, nparam);
	f2 = safetensors(&fsize, t, nt, w2, nparam);
	free(w1);
	free(w2);
	rl_wver_create(&v1, 1);
	rl_wver_add_blob(v1, "model.safetensors", f1, fsize, 2, 0);
	rl_wver_add_blob(v1, "config.json", "{\"model_type\":\"gpt2\"}", 21, 1, 0);
	rl_wver_create(&v2, 2);
	rl_wver_add_blob(v2, "model.safetensors", f2, fsize, 2, 0);
	rl_wver_add_blob(v2, "config.json", "{\"model_type\":\"gpt2\"}", 21, 1, 0);
	rl_wver_hash(v1);
	rl_wver_hash(v2);

	snprintf(url, sizeof url, "tcp://127.0.0.1:%d", 40000 + (int)(getpid() % 20000));
	so.listen = url;
	po.level = level;
	if (rl_wsync_server_open(&srv, &so) != 0 || rl_wsync_client_open(&pc, url, &po) != 0) {
		fprintf(stderr, "sync: cannot start a server on %s\n", url);
		return 1;
	}
	if (nparts > 0) {
		uint64_t ver = 0;
		int rc = 0;
		rl_wsync_client_close(pc);
		for (int h = 0; h < 2 && rc == 0; h++)
			for (int i = 0; i < nparts && rc == 0; i++)
				rc = push_parts(url, h ? "delta" : "whole", f1, f2, fsize, parts[i], reps, &ver, nparam);
		rl_wsync_server_close(srv);
		rl_wver_destroy(v1);
		rl_wver_destroy(v2);
		free(f1);
		free(f2);
		return rc;
	}
	if (only_push) {
		uint64_t ver = 0;
		const char *hows[] = { "delta", "whole", "shm", "dir" };
		int rc = 0;
		rl_wsync_client_close(pc);
		pc = NULL;
		for (int i = 0; i < 4 && rc == 0; i++)
			rc = push_only(url, hows[i], v1, v2, reps, &ver, nparam);
		rl_wsync_server_close(srv);
		rl_wver_destroy(v1);
		rl_wver_destroy(v2);
		free(f1);
		free(f2);
		return rc;
	}
	for (int pass = 0; pass < 2; pass++) {
		const char *kind = pass ? "delta" : "full";
		rl_wver *v = pass ? v2 : v1;
		double tp, tcp, td;
		uint64_t pwire, wire;

		rl_wsync_client_stats(pc, &st, 1);
		tp = rl_now();
		if (rl_wsync_push(pc, v, pass ? v1 : NULL) != 0) {
			fprintf(stderr, "sync: push failed\n");
			return 1;
		}
		tp = rl_now() - tp;
		rl_wsync_client_stats(pc, &st, 1);
		pwire = st.bytes_sent;
		for (int si = 0; si < nsubs; si++) {
			int k = subs[si];
			rl_wver *bases[8];
			for (int i = 0; i < k; i++)
				bases[i] = pass ? v1 : NULL;
			/* warm-up fetch of the same version is not done: every run is cold on the client */
			/* a worker's steady state: fetch into its other (already touched) buffer */
			rl_wver *dsts[8];
			double ta;
			uint64_t wa;
			for (int i = 0; i < k; i++) {
				uint8_t *b = rl_xmalloc((size_t)fsize);
				memset(b, 0, (size_t)fsize);
				rl_wver_create(&dsts[i], 0);
				rl_wver_add_blob(dsts[i], "model.safetensors", b, fsize, 2, 0);
				rl_wver_add_blob(dsts[i], "config.json", rl_xcalloc(1, 21), 21, 1, 0);
			}
			double rd[16], ra[16], rt[16], cd[16], ct[16], pr[16], cpu_a, la[2][3];
			/* interleaved repetitions, medians: the machine may be shared */
			getloadavg(la[0], 3);
			for (int r = 0; r < reps; r++) {
				rd[r] = deliver(url, k, parallel, v->version, bases, dsts, v, &wire, &cd[r]);
				rt[r] = raw_tcp(f1, (size_t)fsize, k, &ct[r]);
				pr[r] = rd[r] / rt[r];
				/* a fresh process: fetch allocates (page faults included) */
				ra[r] = deliver(url, k, parallel, v->version, bases, NULL, v, &wa, &cpu_a);
			}
			getloadavg(la[1], 3);
			td = median(rd, reps);
			ta = median(ra, reps);
			tcp = median(rt, reps);
			for (int i = 0; i < k; i++) {
				free(dsts[i]->blobs[0].data);
				free(dsts[i]->blobs[1].data);
				rl_wver_destroy(dsts[i]);
			}
			printf("{\"bench\":\"sync\",\"case\":\"%s\",\"subscribers\":%d,\"params\":%zu,\"bytes\":%llu,"
			       "\"changed_frac\":%.5f,\"lr\":%g,\"level\":%d,\"parallel\":%d,\"whole_chunks\":\"%s\","
			       "\"transport\":\"%s\",\"shm_versions\":%llu,"
			       "\"bulk_chunk_frac\":%.2f,\"reps\":%d,"
			       "\"seconds\":%.3f,\"wire_bytes_per_sub\":%llu,\"wire_ratio\":%.4f,"
			       "\"push_seconds\":%.3f,\"push_wire_bytes\":%llu,"
			       "\"raw_tcp_seconds\":%.3f,\"vs_raw_tcp\":%.2f,\"vs_raw_tcp_paired\":%.2f,"
			       "\"cpu_seconds\":%.3f,\"raw_tcp_cpu_seconds\":%.3f,\"seconds_fresh_alloc\":%.3f,"
			       "\"load_avg\":[%.2f,%.2f]}\n",
			       kind, k, nparam, (unsigned long long)rl_wver_total(v), (double)changed / (double)nparam, lr,
			       level, parallel, stored > 0 ? "stored" : stored < 0 ? "zstd" : "auto",
			       (const char *[]){ "auto", "shm", "stream", "nng" }[transport], (unsigned long long)shm_versions,
			       all_chunks ? (double)bulk_chunks / (double)all_chunks : 0.0, reps, td, (unsigned long long)(wire / (uint64_t)k),
			       (double)(wire / (uint64_t)k) / (double)rl_wver_total(v), tp, (unsigned long long)pwire, tcp,
			       td / tcp, median(pr, reps), median(cd, reps), median(ct, reps), ta, la[0][0], la[1][0]);
			fflush(stdout);
		}
	}
	rl_wsync_client_close(pc);
	rl_wsync_server_close(srv);
	rl_wver_destroy(v1);
	rl_wver_destroy(v2);
	free(f1);
	free(f2);
	return 0;
}

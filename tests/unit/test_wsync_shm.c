/*
 * test_wsync_shm.c — the same-host shared memory transport of rl-sync
 * (lib/sync/wshm.c and its use in lib/sync/server.c and client.c): host id, sealed objects that
 * cannot be written, refusal of unsealed or wrongly sized objects, a server
 * handing versions to a client that maps them (bytes equal, no chunks moved),
 * fetch_into over shm, a corrupted object (forced shm: RL_ECHECKSUM; auto:
 * falls back to the stream and gets the right bytes), a server without shm
 * (forced: RL_ENOTSUP; auto: the stream), a version dropped by the server
 * while a client still maps it (unchanged; the server's descriptor is gone),
 * the descriptor service (wrong version, garbage, a silent client, nobody
 * listening), and the --transport names.  The push the other way (a
 * trainer on the server's host hands over its own sealed memfd): taken
 * without chunks or a delta, served to shm and stream clients from that
 * object, kept across a restart with --data-dir; a corrupted object refused
 * (forced shm: RL_ECHECKSUM; auto: the chunks follow); a server without shm
 * (forced: RL_ENOTSUP; auto: chunks with a delta); the PUT request without a
 * descriptor, for a version nobody pushes, to a service that takes none.
 * The two-process and kill cases are in tests/cli/rl-sync-shm.bats.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/core.h"
#include "t.h"
#include "sync/wshm.h"
#include "sync/wsync.h"
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* a version: three blobs of awkward sizes (one empty), random bytes */
static rl_wver *
make_ver(uint64_t num, uint32_t seed)
{
	static const uint64_t sizes[] = { 3 * 1048576 + 17, 0, 4097 };
	static const char *names[] = { "model.safetensors", "empty", "config.json" };
	rl_wver *v;
	uint32_t x = seed * 2654435761u + 1;

	if (rl_wver_create(&v, num) != RL_OK)
		return NULL;
	for (int i = 0; i < 3; i++) {
		uint8_t *b = malloc(sizes[i] + 1);
		for (uint64_t k = 0; k < sizes[i]; k++) {
			x ^= x << 13, x ^= x >> 17, x ^= x << 5;
			b[k] = (uint8_t)x;
		}
		if (rl_wver_add_blob(v, names[i], b, sizes[i], 0, 1) != RL_OK) {
			free(b);
			rl_wver_destroy(v);
			return NULL;
		}
		free(b);
	}
	if (rl_wver_hash(v) != RL_OK) {
		rl_wver_destroy(v);
		return NULL;
	}
	return v;
}

static int
same_bytes(const rl_wver *a, const rl_wver *b)
{
	if (a->nblobs != b->nblobs || a->hash != b->hash)
		return 0;
	for (int i = 0; i < a->nblobs; i++)
		if (a->blobs[i].size != b->blobs[i].size ||
		    (a->blobs[i].size && memcmp(a->blobs[i].data, b->blobs[i].data, a->blobs[i].size) != 0))
			return 0;
	return 1;
}

/* descriptors of this process whose target contains s */
static int
count_fds(const char *s)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char p[300], t[300];
	int n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL) {
		ssize_t k;
		snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
		if ((k = readlink(p, t, sizeof t - 1)) > 0) {
			t[k] = 0;
			n += strstr(t, s) != NULL;
		}
	}
	closedir(d);
	return n;
}

/* count_fds once it reaches want (the service closes its duplicate just
 * after the reply, maybe after the client went on), at most 2 s */
static int
settle_fds(const char *s, int want)
{
	int n = count_fds(s);

	for (int i = 0; i < 200 && n != want; i++) {
		usleep(10000);
		n = count_fds(s);
	}
	return n;
}

/* mappings of this process whose name contains s */
static int
count_maps(const char *s)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof line, f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

static void
test_objects(void)
{
	char a[32], b[32];
	rl_wver *v = make_ver(7, 1), *m = NULL;
	int fd = -1, fd2;
	uint8_t one = 1;

	T_EQ_INT(rl_wshm_hostid(a, sizeof a), RL_OK);
	T_EQ_INT(rl_wshm_hostid(b, sizeof b), RL_OK);
	T_OK(strlen(a) == 16 && strcmp(a, b) == 0, "host id '%s' '%s'", a, b);
	T_EQ_INT(rl_wshm_hostid(a, 8), RL_EIO);
	T_OK(v != NULL);
	if (v == NULL)
		return;
	/* blobs page-aligned: 3 MiB + 17 -> 769 pages, empty, 4097 -> 2 pages */
	T_EQ_INT(rl_wshm_size(v), (uint64_t)(769 + 2) * 4096);
	T_EQ_INT(rl_wshm_make(&fd, v, 0, 0), RL_OK);
	T_OK(fd >= 0);
	/* sealed: no writes, no resizing, no unsealing */
	T_OK(pwrite(fd, &one, 1, 0) < 0, "a sealed object took a write");
	T_OK(ftruncate(fd, 4096) != 0, "a sealed object shrank");
	T_OK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	T_OK(fcntl(fd, F_ADD_SEALS, 0) != 0 || (fcntl(fd, F_GET_SEALS) & F_SEAL_SEAL));
	/* a manifest-only copy maps it and verifies */
	T_EQ_INT(rl_wver_create(&m, 7), RL_OK);
	for (int i = 0; i < v->nblobs; i++)
		T_EQ_INT(rl_wver_add_blob(m, v->blobs[i].name, v->blobs[i].data, v->blobs[i].size, 0, 0), RL_OK);
	T_EQ_INT(rl_wver_hash(m), RL_OK);
	T_EQ_INT(rl_wshm_map(m, fd), RL_OK);
	T_OK(m->map != NULL && m->blobs[0].data != v->blobs[0].data);
	T_OK(same_bytes(m, v));
	T_EQ_INT(rl_wver_verify(m), RL_OK);
	rl_wver_destroy(m);
	close(fd);

	/* an unsealed object, and one of the wrong size, are refused */
	fd2 = memfd_create("rlsync-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	T_OK(fd2 >= 0 && ftruncate(fd2, (off_t)rl_wshm_size(v)) == 0);
	T_EQ_INT(rl_wshm_map(v, fd2), RL_EFORMAT);
	T_OK(ftruncate(fd2, 4096) == 0 && fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) == 0);
	T_EQ_INT(rl_wshm_map(v, fd2), RL_EFORMAT);
	T_OK(v->map == NULL);
	close(fd2);

	/* repoint: the version's bytes now live in the object only */
	T_EQ_INT(rl_wshm_make(&fd, v, 1, 0), RL_OK);
	T_OK(v->map != NULL && v->borrowed == 1);
	T_EQ_INT(rl_wver_verify(v), RL_OK);
	close(fd);
	rl_wver_destroy(v);
}

/* a lookup that holds one object, version 5 */
static int fake_fd = -1;
static int
fake_lookup(void *arg, uint64_t version, int *fd, uint64_t *got, uint64_t *size)
{
	(void)arg;
	if (version != 0 && version != 5)
		return RL_ENOENT;
	*fd = dup(fake_fd);
	*got = 5;
	*size = 4096;
	return RL_OK;
}

/* the service: right and wrong requests, garbage, a silent client */
static void
test_srv(void)
{
	rl_wshm_srv *s = NULL;
	int fd = -1, c;
	uint64_t got = 0, size = 0;
	struct sockaddr_un a;
	socklen_t al;
	uint8_t junk[24], rep[32];
	ssize_t k;

	fake_fd = memfd_create("rlsync-fake", MFD_CLOEXEC);
	T_OK(fake_fd >= 0 && ftruncate(fake_fd, 4096) == 0);
	T_EQ_INT(rl_wshm_srv_open(&s, fake_lookup, NULL), RL_OK);
	if (s == NULL)
		return;
	T_EQ_INT(rl_wshm_recv(&fd, &got, &size, rl_wshm_srv_name(s), 0, 2000), RL_OK);
	T_OK(fd >= 0 && got == 5 && size == 4096);
	if (fd >= 0)
		close(fd);
	T_EQ_INT(rl_wshm_recv(&fd, &got, &size, rl_wshm_srv_name(s), 9, 2000), RL_ENOENT);
	T_OK(fd == -1);
	T_EQ_INT(rl_wshm_recv(&fd, &got, &size, "rlsync-nobody-here", 0, 2000), RL_ENET);
	/* a silent client costs the service its 1 s timeout, then it serves on */
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	memcpy(a.sun_path + 1, rl_wshm_srv_name(s), strlen(rl_wshm_srv_name(s)));
	al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(rl_wshm_srv_name(s)));
	c = socket(AF_UNIX, SOCK_STREAM, 0);
	T_OK(c >= 0 && connect(c, (struct sockaddr *)&a, al) == 0);
	close(c);
	/* garbage: an error reply, no descriptor */
	c = socket(AF_UNIX, SOCK_STREAM, 0);
	memset(junk, 'x', sizeof junk);
	T_OK(c >= 0 && connect(c, (struct sockaddr *)&a, al) == 0 && write(c, junk, sizeof junk) == (ssize_t)sizeof junk);
	k = recv(c, rep, sizeof rep, MSG_WAITALL);
	T_OK(k == 32 && rep[12] == RL_EFORMAT, "reply %zd bytes, status %d", k, k >= 13 ? rep[12] : -1);
	close(c);
	T_EQ_INT(rl_wshm_recv(&fd, &got, &size, rl_wshm_srv_name(s), 5, 3000), RL_OK);
	if (fd >= 0)
		close(fd);
	/* the service counts a descriptor after sending it: give its thread a moment */
	for (int i = 0; i < 200 && rl_wshm_srv_served(s) < 2; i++)
		usleep(10000);
	T_EQ_INT(rl_wshm_srv_served(s), 2);
	rl_wshm_srv_close(s);
	close(fake_fd);
}

/* a taker that records what it was given */
static uint64_t took_version, took_size;
static int
fake_take(void *arg, uint64_t version, int fd, uint64_t *size)
{
	struct stat st;

	(void)arg;
	if (fstat(fd, &st) != 0)
		return RL_EIO;
	took_version = version;
	took_size = (uint64_t)st.st_size;
	*size = took_size;
	return version == 7 ? RL_OK : RL_ENOENT;
}

/* the PUT request of the service */
static void
test_srv_put(void)
{
	rl_wshm_srv *s = NULL, *s2 = NULL;
	rl_wver *v = make_ver(7, 9);
	int fd = -1, c;
	struct sockaddr_un a;
	socklen_t al;
	uint8_t q[24] = { 0 }, rep[32];
	ssize_t k;

	if (v == NULL)
		return;
	T_EQ_INT(rl_wshm_make(&fd, v, 0, 0), RL_OK);
	T_EQ_INT(rl_wshm_srv_open2(&s, fake_lookup, fake_take, NULL), RL_OK);
	T_EQ_INT(rl_wshm_srv_open(&s2, fake_lookup, NULL), RL_OK);
	if (s == NULL || s2 == NULL || fd < 0)
		goto out;
	T_EQ_INT(rl_wshm_send(rl_wshm_srv_name(s), 7, fd, 2000), RL_OK);
	T_OK(took_version == 7 && took_size == rl_wshm_size(v), "took version %llu, %llu bytes",
	     (unsigned long long)took_version, (unsigned long long)took_size);
	T_EQ_INT(rl_wshm_send(rl_wshm_srv_name(s), 8, fd, 2000), RL_ENOENT);
	T_EQ_INT(rl_wshm_srv_taken(s), 1);
	T_EQ_INT(rl_wshm_send(rl_wshm_srv_name(s2), 7, fd, 2000), RL_ENOTSUP);
	T_EQ_INT(rl_wshm_send(rl_wshm_srv_name(s), 7, -1, 2000), RL_EINVAL);
	T_EQ_INT(rl_wshm_send("rlsync-nobody-here", 7, fd, 2000), RL_ENET);
	/* a PUT without a descriptor: RL_EFORMAT, and the service goes on */
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	memcpy(a.sun_path + 1, rl_wshm_srv_name(s), strlen(rl_wshm_srv_name(s)));
	al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(rl_wshm_srv_name(s)));
	q[0] = 'R', q[1] = 'L', q[2] = 'S', q[3] = 'M', q[4] = 1, q[6] = 2, q[8] = 24, q[16] = 7;
	c = socket(AF_UNIX, SOCK_STREAM, 0);
	T_OK(c >= 0 && connect(c, (struct sockaddr *)&a, al) == 0 && write(c, q, sizeof q) == (ssize_t)sizeof q);
	k = recv(c, rep, sizeof rep, MSG_WAITALL);
	T_OK(k == 32 && rep[12] == RL_EFORMAT && rep[6] == 2 && rep[7] == 0x80, "reply %zd bytes, status %d", k,
	     k >= 13 ? rep[12] : -1);
	close(c);
	T_EQ_INT(rl_wshm_send(rl_wshm_srv_name(s), 7, fd, 2000), RL_OK);
	T_EQ_INT(rl_wshm_srv_taken(s), 2);
out:
	if (fd >= 0)
		close(fd);
	rl_wshm_srv_close(s);
	rl_wshm_srv_close(s2);
	rl_wver_destroy(v);
}

/* a number from the server's status JSON, -1 if absent */
static long long
status_num(rl_wsync_client *c, const char *key)
{
	char *js = NULL, pat[64];
	const char *p;
	long long n = -1;

	if (rl_wsync_status(c, &js) != RL_OK)
		return -1;
	snprintf(pat, sizeof pat, "\"%s\":", key);
	if ((p = strstr(js, pat)) != NULL)
		n = atoll(p + strlen(pat));
	free(js);
	return n;
}

static rl_wsync_server *serve(const char *url, int shm);

/* the trainer's push to a server on its host */
static void
test_push(const char *dir)
{
	char url[512], dd[512], tag[64];
	rl_wsync_server *s = NULL;
	rl_wsync_server_opts so = { 0 };
	rl_wsync_client *p = NULL, *c = NULL, *cs = NULL;
	rl_wsync_client_opts aut = { .timeout_ms = 5000 };
	rl_wsync_client_opts shm = { .timeout_ms = 5000, .transport = RL_WSYNC_T_SHM };
	rl_wsync_client_opts str = { .timeout_ms = 5000, .transport = RL_WSYNC_T_STREAM };
	rl_wver *v1 = make_ver(1, 11), *v2 = make_ver(2, 12), *v3 = make_ver(3, 13), *got = NULL;
	rl_wsync_stats st;
	rl_wsync *h = NULL;

	if (v1 == NULL || v2 == NULL || v3 == NULL)
		goto out;
	snprintf(url, sizeof url, "ipc://%s/p.sock", dir);
	snprintf(dd, sizeof dd, "%s/pdata", dir);
	so.listen = url;
	so.data_dir = dd;
	T_EQ_INT(rl_wsync_server_open(&s, &so), RL_OK);
	if (s == NULL)
		goto out;
	T_EQ_INT(rl_wsync_client_open(&p, url, &aut), RL_OK);
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(rl_wsync_client_open(&cs, url, &str), RL_OK);
	if (p == NULL || c == NULL || cs == NULL)
		goto out;
	/* whole, then with a base: both as shared memory, no chunk, no delta */
	T_EQ_INT(rl_wsync_push(p, v1, NULL), RL_OK);
	T_EQ_INT(rl_wsync_push(p, v2, v1), RL_OK);
	rl_wsync_client_stats(p, &st, 1);
	T_OK(st.shm_versions == 2 && st.chunks == 0 && st.bytes_sent < 65536, "shm %llu chunks %llu sent %llu",
	     (unsigned long long)st.shm_versions, (unsigned long long)st.chunks, (unsigned long long)st.bytes_sent);
	T_EQ_INT(status_num(c, "shm_pushes"), 2);
	T_EQ_INT(status_num(c, "delta_base"), 0);
	T_EQ_INT(status_num(c, "latest"), 2);
	/* the server serves the pusher's object itself (no copy of its own) */
	snprintf(tag, sizeof tag, "memfd:rlsync-%ld-v2", (long)getpid());
	T_EQ_INT(settle_fds(tag, 1), 1);
	T_EQ_INT(rl_wsync_fetch(c, &got, 0, NULL), RL_OK);
	T_OK(got && got->map && same_bytes(got, v2), "shm worker");
	rl_wver_destroy(got);
	got = NULL;
	T_EQ_INT(rl_wsync_fetch(cs, &got, 0, NULL), RL_OK);
	T_OK(got && got->map == NULL && same_bytes(got, v2), "stream worker");
	rl_wver_destroy(got);
	got = NULL;

	/* a corrupted object: auto falls back to the chunks, forced shm fails */
	rl_wsync_test_corrupt(1);
	T_EQ_INT(rl_wsync_push(p, v3, v2), RL_OK);
	rl_wsync_test_corrupt(0);
	rl_wsync_client_stats(p, &st, 1);
	T_OK(st.shm_versions == 0 && st.chunks > 0, "fell back: shm %llu chunks %llu",
	     (unsigned long long)st.shm_versions, (unsigned long long)st.chunks);
	T_EQ_INT(status_num(c, "push_chunks_rejected"), 1);
	T_EQ_INT(status_num(c, "shm_pushes"), 2);
	T_EQ_INT(rl_wsync_fetch(c, &got, 0, NULL), RL_OK);
	T_OK(got && same_bytes(got, v3));
	rl_wver_destroy(got);
	got = NULL;
	v1->version = 4;
	T_EQ_INT(rl_wver_hash(v1), RL_OK);
	rl_wsync_test_corrupt(1);
	T_EQ_INT(rl_wsync_push(c, v1, NULL), RL_ECHECKSUM);
	rl_wsync_test_corrupt(0);
	T_EQ_INT(status_num(c, "latest"), 3);
	T_EQ_INT(rl_wsync_push(c, v1, NULL), RL_OK);

	/* the handle rl-train uses: shared memory, and no delta base kept */
	T_EQ_INT(rl_wsync_open(&h, url, 0), RL_OK);
	if (h) {
		v2->version = 5;
		T_EQ_INT(rl_wver_hash(v2), RL_OK);
		T_EQ_INT(rl_wsync_publish(h, v2, 1), RL_OK);
		T_EQ_INT(status_num(c, "shm_pushes"), 4);
		rl_wsync_close(h);
	}
	rl_wsync_client_close(c);
	rl_wsync_client_close(cs);
	rl_wsync_client_close(p);
	c = cs = p = NULL;
	/* restarted: the version taken as shared memory was saved */
	rl_wsync_server_close(s);
	s = NULL;
	T_EQ_INT(rl_wsync_server_open(&s, &so), RL_OK);
	T_EQ_INT(s ? rl_wsync_server_latest(s) : 0, 5);
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(c ? rl_wsync_fetch(c, &got, 0, NULL) : RL_EINVAL, RL_OK);
	/* read back from the directory: the blobs in file name order */
	T_OK(got && got->hash == v2->hash && got->nblobs == v2->nblobs);
	for (int i = 0; got && i < v2->nblobs; i++) {
		const rl_wblob *b = rl_wver_find(got, v2->blobs[i].name);
		T_OK(b && b->size == v2->blobs[i].size && (b->size == 0 || memcmp(b->data, v2->blobs[i].data, b->size) == 0),
		     "blob %s", v2->blobs[i].name);
	}
	rl_wver_destroy(got);
	got = NULL;
	rl_wsync_client_close(c);
	c = NULL;
	rl_wsync_server_close(s);

	/* a server without shm: forced shm is refused, auto sends chunks (a delta) */
	snprintf(url, sizeof url, "ipc://%s/pn.sock", dir);
	if ((s = serve(url, -1)) == NULL)
		goto out;
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(rl_wsync_client_open(&p, url, &aut), RL_OK);
	v1->version = 1;
	v2->version = 2;
	T_EQ_INT(rl_wver_hash(v1), RL_OK);
	T_EQ_INT(rl_wver_hash(v2), RL_OK);
	T_EQ_INT(rl_wsync_push(c, v1, NULL), RL_ENOTSUP);
	T_EQ_INT(rl_wsync_push(p, v1, NULL), RL_OK);
	T_EQ_INT(rl_wsync_push(p, v2, v1), RL_OK);
	T_EQ_INT(status_num(c, "delta_base"), 1);
	T_EQ_INT(status_num(c, "shm_pushes"), 0);
out:
	rl_wsync_client_close(c);
	rl_wsync_client_close(cs);
	rl_wsync_client_close(p);
	rl_wsync_server_close(s);
	rl_wver_destroy(v1);
	rl_wver_destroy(v2);
	rl_wver_destroy(v3);
}

static rl_wsync_server *
serve(const char *url, int shm)
{
	rl_wsync_server_opts so = { .listen = url, .shm = shm };
	rl_wsync_server *s = NULL;

	T_EQ_INT(rl_wsync_server_open(&s, &so), RL_OK);
	return s;
}

static void
test_service(const char *dir)
{
	char url[512], tag[64];
	rl_wsync_server *s;
	rl_wsync_client *c = NULL, *ca = NULL;
	rl_wsync_client_opts shm = { .timeout_ms = 5000, .transport = RL_WSYNC_T_SHM };
	rl_wsync_client_opts aut = { .timeout_ms = 5000 };
	rl_wver *ref = make_ver(1, 3), *ref2 = make_ver(2, 4), *got = NULL, *dst = NULL;
	rl_wsync_stats st;

	snprintf(url, sizeof url, "ipc://%s/s.sock", dir);
	if ((s = serve(url, 0)) == NULL || ref == NULL || ref2 == NULL)
		return;
	{
		rl_wver *p = make_ver(1, 3);
		T_EQ_INT(rl_wsync_server_publish(s, p), RL_OK);
	}
	snprintf(tag, sizeof tag, "memfd:rlsync-%ld-v1", (long)getpid());
	T_EQ_INT(count_fds(tag), 1); /* the server's */
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(rl_wsync_fetch(c, &got, 0, NULL), RL_OK);
	rl_wsync_client_stats(c, &st, 1);
	T_OK(got && got->map != NULL && same_bytes(got, ref), "fetched over shm");
	T_OK(st.shm_versions == 1 && st.chunks == 0 && st.bulk_chunks == 0, "shm %llu chunks %llu",
	     (unsigned long long)st.shm_versions, (unsigned long long)st.chunks);
	T_EQ_INT(settle_fds(tag, 1), 1); /* the client keeps a mapping, not a descriptor */

	/* fetch_into: into the caller's buffer, no mapping kept */
	T_EQ_INT(rl_wver_create(&dst, 0), RL_OK);
	for (int i = 0; i < ref->nblobs; i++) {
		uint8_t *z = calloc(1, ref->blobs[i].size + 1);
		T_EQ_INT(rl_wver_add_blob(dst, ref->blobs[i].name, z, ref->blobs[i].size, 0, 1), RL_OK);
		free(z);
	}
	T_EQ_INT(rl_wsync_fetch_into(c, dst, 0, NULL), RL_OK);
	T_OK(dst->map == NULL && dst->version == 1 && same_bytes(dst, ref));

	/* the server drops v1: its descriptor goes, the client's mapping stays
	 * valid and unchanged (no tearing) */
	T_EQ_INT(rl_wsync_server_publish(s, ref2), RL_OK);
	ref2 = NULL;
	T_EQ_INT(settle_fds(tag, 0), 0);
	T_OK(count_maps(tag) >= 1, "the client still maps v1");
	T_OK(got && same_bytes(got, ref) && rl_wver_verify(got) == RL_OK);
	rl_wver_destroy(got);
	got = NULL;
	T_EQ_INT(count_maps(tag), 0);
	/* v2 into the same-layout buffer, then a specific old version is gone */
	T_EQ_INT(rl_wsync_fetch_into(c, dst, 0, NULL), RL_OK);
	T_EQ_INT(dst->version, 2);
	T_EQ_INT(rl_wsync_fetch(c, &got, 1, NULL), RL_ENOENT);
	rl_wsync_client_close(c);
	c = NULL;
	rl_wsync_server_close(s);
	rl_wver_destroy(dst);

	/* a corrupted object: forced shm fails the checksum, auto falls back */
	snprintf(url, sizeof url, "ipc://%s/c.sock", dir);
	setenv("RL_WSYNC_TEST_CORRUPT_SHM", "1", 1);
	s = serve(url, 0);
	unsetenv("RL_WSYNC_TEST_CORRUPT_SHM");
	if (s == NULL)
		goto out;
	T_EQ_INT(rl_wsync_server_publish(s, make_ver(1, 3)), RL_OK);
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(rl_wsync_fetch(c, &got, 0, NULL), RL_ECHECKSUM);
	T_OK(got == NULL);
	T_EQ_INT(rl_wsync_client_open(&ca, url, &aut), RL_OK);
	T_EQ_INT(rl_wsync_fetch(ca, &got, 0, NULL), RL_OK);
	rl_wsync_client_stats(ca, &st, 1);
	T_OK(got && got->map == NULL && same_bytes(got, ref), "auto fell back to the stream");
	T_OK(st.shm_versions == 0 && st.bulk_chunks > 0, "shm %llu bulk %llu", (unsigned long long)st.shm_versions,
	     (unsigned long long)st.bulk_chunks);
	rl_wver_destroy(got);
	got = NULL;
	rl_wsync_client_close(c);
	rl_wsync_client_close(ca);
	c = ca = NULL;
	rl_wsync_server_close(s);

	/* a server without shm */
	snprintf(url, sizeof url, "ipc://%s/n.sock", dir);
	if ((s = serve(url, -1)) == NULL)
		goto out;
	T_EQ_INT(rl_wsync_server_publish(s, make_ver(1, 3)), RL_OK);
	T_EQ_INT(rl_wsync_client_open(&c, url, &shm), RL_OK);
	T_EQ_INT(rl_wsync_fetch(c, &got, 0, NULL), RL_ENOTSUP);
	T_EQ_INT(rl_wsync_client_open(&ca, url, &aut), RL_OK);
	T_EQ_INT(rl_wsync_fetch(ca, &got, 0, NULL), RL_OK);
	T_OK(got && got->map == NULL && same_bytes(got, ref));
	rl_wver_destroy(got);
	rl_wsync_client_close(c);
	rl_wsync_client_close(ca);
	rl_wsync_server_close(s);
out:
	rl_wver_destroy(ref);
	rl_wver_destroy(ref2);
}

static void
test_names(const char *dir)
{
	int t = -1;
	rl_wsync *w = NULL;
	rl_wsync_client *c = NULL;
	rl_wsync_client_opts bad = { .transport = RL_WSYNC_T_FILE };

	T_EQ_INT(rl_wsync_transport_parse("auto", &t), RL_OK);
	T_EQ_INT(t, RL_WSYNC_T_AUTO);
	T_EQ_INT(rl_wsync_transport_parse("shm", &t), RL_OK);
	T_EQ_INT(t, RL_WSYNC_T_SHM);
	T_EQ_INT(rl_wsync_transport_parse("stream", &t), RL_OK);
	T_EQ_INT(t, RL_WSYNC_T_STREAM);
	T_EQ_INT(rl_wsync_transport_parse("nng", &t), RL_OK);
	T_EQ_INT(t, RL_WSYNC_T_NNG);
	T_EQ_INT(rl_wsync_transport_parse("file", &t), RL_OK);
	T_EQ_INT(t, RL_WSYNC_T_FILE);
	T_EQ_INT(rl_wsync_transport_parse("SHM", &t), RL_EINVAL);
	T_EQ_INT(rl_wsync_transport_parse("", &t), RL_EINVAL);
	T_EQ_INT(rl_wsync_open_with(&w, "tcp://127.0.0.1:1", 0, RL_WSYNC_T_FILE), RL_EINVAL);
	T_EQ_INT(rl_wsync_open_with(&w, dir, 0, RL_WSYNC_T_SHM), RL_EINVAL);
	T_EQ_INT(rl_wsync_open_with(&w, dir, 0, RL_WSYNC_T_FILE), RL_OK);
	T_EQ_STR(rl_wsync_transport_name(w), "file");
	rl_wsync_close(w);
	T_EQ_INT(rl_wsync_client_open(&c, "tcp://127.0.0.1:1", &bad), RL_EINVAL);
}

int
main(void)
{
	char dir[] = "/tmp/test_wsync_shm.XXXXXX";

	T_BEGIN("test_wsync_shm");
	rl_log_init("test_wsync_shm", RL_LOG_QUIET);
	if (mkdtemp(dir) == NULL)
		T_SKIP("no temporary directory");
	test_objects();
	test_srv();
	test_srv_put();
	test_service(dir);
	test_push(dir);
	test_names(dir);
	{
		char cmd[600];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", dir);
	}
	T_END();
}

/*
 * wshm.c — same-host weight transport: sealed memfd objects handed over an
 * abstract Unix socket with SCM_RIGHTS (design and reasons in wshm.h and
 * docs/sync.md).  Leaves out: anything but Linux.
 *
 * Socket protocol (SOCK_STREAM, one request per connection):
 *   request 24 bytes: u32 "RLSM", u16 1, u16 op 1 (GET), u32 24, u32 0, u64 version
 *   reply   32 bytes: u32 "RLSM", u16 1, u16 0x8001, u32 32, i32 status,
 *                     u64 version, u64 object size; the descriptor rides
 *                     along (SCM_RIGHTS) when status is 0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wshm.h"
#include "core.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SM_MAGIC 0x4d534c52u /* "RLSM" little-endian */
#define SM_REQ 24
#define SM_REP 32

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static size_t
read_small(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "r");
	size_t k;

	if (f == NULL)
		return 0;
	k = fread(buf, 1, n, f);
	fclose(f);
	return k;
}

int
rl_wshm_hostid(char *out, size_t n)
{
	char buf[256];
	size_t k = read_small("/etc/machine-id", buf, 128);

	k += read_small("/proc/sys/kernel/random/boot_id", buf + k, 128);
	if (k == 0 || n < 17)
		return RL_EIO;
	snprintf(out, n, "%016llx", (unsigned long long)rl_wsync_hash64(buf, k, 0x726c73686d));
	return RL_OK;
}

static uint64_t
align_up(uint64_t x)
{
	return (x + RL_WSHM_ALIGN - 1) / RL_WSHM_ALIGN * RL_WSHM_ALIGN;
}

uint64_t
rl_wshm_size(const rl_wver *v)
{
	uint64_t t = 0;

	for (int i = 0; i < v->nblobs; i++)
		t = align_up(t) + v->blobs[i].size;
	return align_up(t ? t : 1);
}

/* point v's blobs into the mapping m (v->map takes it) */
static void
repoint(rl_wver *v, uint8_t *m, size_t n, int free_old)
{
	uint64_t off = 0;

	for (int i = 0; i < v->nblobs; i++) {
		off = align_up(off);
		if (free_old && v->borrowed != 1)
			free(v->blobs[i].data);
		v->blobs[i].data = m + off;
		off += v->blobs[i].size;
	}
	if (v->map)
		munmap(v->map, v->mapn);
	v->map = m;
	v->mapn = n;
	v->borrowed = 1; /* the data belongs to the mapping */
}

int
rl_wshm_make(int *fd, rl_wver *v, int repoint_v, int corrupt)
{
	uint64_t size = rl_wshm_size(v), off = 0;
	uint8_t *w = MAP_FAILED, *r;
	char name[64];
	int f, rv;

	*fd = -1;
	if ((uint64_t)(size_t)size != size)
		return RL_ETOOBIG;
	snprintf(name, sizeof name, "rlsync-%ld-v%llu", (long)getpid(), (unsigned long long)v->version);
	if ((f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0) {
		rl_error("cannot create shared memory for version %llu: %s", (unsigned long long)v->version,
			 strerror(errno));
		return RL_EIO;
	}
	if (ftruncate(f, (off_t)size) != 0) {
		rl_error("cannot size shared memory for version %llu (%llu bytes): %s", (unsigned long long)v->version,
			 (unsigned long long)size, strerror(errno));
		rv = errno == ENOSPC || errno == ENOMEM ? RL_ENOMEM : RL_EIO;
		goto fail;
	}
	/* a writable mapping must be gone before F_SEAL_WRITE is accepted */
	if ((w = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)) == MAP_FAILED) {
		rl_error("cannot map shared memory for version %llu: %s", (unsigned long long)v->version,
			 strerror(errno));
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < v->nblobs; i++) {
		off = align_up(off);
		if (v->blobs[i].size)
			memcpy(w + off, v->blobs[i].data, (size_t)v->blobs[i].size);
		off += v->blobs[i].size;
	}
	if (corrupt && off > 0)
		w[off / 2] ^= 0x5a;
	munmap(w, (size_t)size);
	if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
		rl_error("cannot seal shared memory for version %llu: %s", (unsigned long long)v->version,
			 strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	if (repoint_v && !corrupt) {
		if ((r = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, f, 0)) == MAP_FAILED) {
			rl_error("cannot map shared memory for version %llu: %s", (unsigned long long)v->version,
				 strerror(errno));
			rv = RL_ENOMEM;
			goto fail;
		}
		repoint(v, r, (size_t)size, 1);
	}
	*fd = f;
	return RL_OK;
fail:
	close(f);
	return rv;
}

int
rl_wshm_map(rl_wver *v, int fd)
{
	struct stat st;
	uint64_t size = rl_wshm_size(v);
	int seals = fcntl(fd, F_GET_SEALS);
	int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
	uint8_t *m;

	if (seals < 0 || (seals & want) != want) {
		rl_error("version %llu: the shared memory object is not sealed against writes",
			 (unsigned long long)v->version);
		return RL_EFORMAT;
	}
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || (uint64_t)(size_t)size != size) {
		rl_error("version %llu: the shared memory object has %lld bytes, the manifest says %llu",
			 (unsigned long long)v->version, (long long)st.st_size, (unsigned long long)size);
		return RL_EFORMAT;
	}
	if ((m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		rl_error("version %llu: cannot map shared memory: %s", (unsigned long long)v->version, strerror(errno));
		return RL_ENOMEM;
	}
	repoint(v, m, (size_t)size, 0);
	return RL_OK;
}

/* ---- service ------------------------------------------------------------------- */
struct rl_wshm_srv {
	int fd, stop[2];
	pthread_t th;
	int started;
	rl_wshm_lookup lookup;
	void *arg;
	char name[108];
	_Atomic uint64_t served;
};

static int
send_reply(int c, int32_t status, uint64_t version, uint64_t size, int fd)
{
	uint8_t p[SM_REP];
	struct iovec io = { p, sizeof p };
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct msghdr mh = { 0 };

	memset(p, 0, sizeof p);
	put32(p, SM_MAGIC);
	put16(p + 4, 1);
	put16(p + 6, 0x8001);
	put32(p + 8, SM_REP);
	put32(p + 12, (uint32_t)status);
	put64(p + 16, version);
	put64(p + 24, size);
	mh.msg_iov = &io;
	mh.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&cm, 0, sizeof cm);
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof cm.b;
		struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(h), &fd, sizeof fd);
	}
	return sendmsg(c, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof p ? 0 : -1;
}

static void
serve_conn(rl_wshm_srv *s, int c)
{
	uint8_t q[SM_REQ];
	size_t got = 0;
	struct timeval tv = { 1, 0 };
	uint64_t ver = 0, size = 0;
	int fd = -1, st;

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	while (got < sizeof q) {
		ssize_t k = recv(c, q + got, sizeof q - got, 0);
		if (k <= 0)
			return;
		got += (size_t)k;
	}
	if (get32(q) != SM_MAGIC || get16(q + 4) != 1 || get16(q + 6) != 1 || get32(q + 8) != SM_REQ) {
		send_reply(c, RL_EFORMAT, 0, 0, -1);
		return;
	}
	st = s->lookup(s->arg, get64(q + 16), &fd, &ver, &size);
	if (send_reply(c, st, ver, size, st == RL_OK ? fd : -1) == 0 && st == RL_OK)
		s->served++;
	if (fd >= 0)
		close(fd);
}

static void *
srv_main(void *arg)
{
	rl_wshm_srv *s = arg;
	struct pollfd p[2] = { { s->fd, POLLIN, 0 }, { s->stop[0], POLLIN, 0 } };

	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		if (p[0].revents & POLLIN) {
			int c = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				/* one tiny request; nothing blocks longer than the 1 s timeouts */
				serve_conn(s, c);
				close(c);
			}
		}
	}
	return NULL;
}

static socklen_t
abstract_addr(struct sockaddr_un *a, const char *name)
{
	size_t n = strlen(name);

	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	memcpy(a->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int
rl_wshm_srv_open(rl_wshm_srv **out, rl_wshm_lookup lookup, void *arg)
{
	rl_wshm_srv *s;
	struct sockaddr_un a;
	char hid[32];
	uint64_t rnd;
	int rv = RL_EIO;

	*out = NULL;
	if ((s = rl_try_calloc(1, sizeof *s, "shm service")) == NULL)
		return RL_ENOMEM;
	s->fd = s->stop[0] = s->stop[1] = -1;
	s->lookup = lookup;
	s->arg = arg;
	if (rl_wshm_hostid(hid, sizeof hid) != 0)
		snprintf(hid, sizeof hid, "0");
	rnd = rl_wsync_hash64(&s, sizeof s, (uint64_t)rl_now() * 1000003u ^ (uint64_t)getpid());
	snprintf(s->name, sizeof s->name, "rlsync-%.8s-%ld-%016llx", hid, (long)getpid(), (unsigned long long)rnd);
	if ((s->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(s->fd, (struct sockaddr *)&a, abstract_addr(&a, s->name)) != 0 || listen(s->fd, 64) != 0 ||
	    pipe2(s->stop, O_CLOEXEC) != 0) {
		rl_error("cannot open the shared memory service '@%s': %s", s->name, strerror(errno));
		goto fail;
	}
	if (pthread_create(&s->th, NULL, srv_main, s) != 0)
		goto fail;
	s->started = 1;
	*out = s;
	return RL_OK;
fail:
	rl_wshm_srv_close(s);
	return rv;
}

void
rl_wshm_srv_close(rl_wshm_srv *s)
{
	if (s == NULL)
		return;
	if (s->started) {
		(void)!write(s->stop[1], "x", 1);
		pthread_join(s->th, NULL);
	}
	if (s->fd >= 0)
		close(s->fd);
	if (s->stop[0] >= 0)
		close(s->stop[0]);
	if (s->stop[1] >= 0)
		close(s->stop[1]);
	free(s);
}

const char *rl_wshm_srv_name(const rl_wshm_srv *s) { return s->name; }
uint64_t rl_wshm_srv_served(const rl_wshm_srv *s) { return atomic_load(&((rl_wshm_srv *)s)->served); }

int
rl_wshm_recv(int *fd, uint64_t *got, uint64_t *size, const char *name, uint64_t version, int timeout_ms)
{
	struct sockaddr_un a;
	uint8_t q[SM_REQ], p[SM_REP];
	struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec io = { p, sizeof p };
	struct msghdr mh = { 0 };
	struct cmsghdr *h;
	int c, rv = RL_ENET, st;
	ssize_t k;

	*fd = -1;
	if (strlen(name) == 0 || strlen(name) > 100)
		return RL_EINVAL;
	if ((c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return RL_EIO;
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(c, (struct sockaddr *)&a, abstract_addr(&a, name)) != 0) {
		rl_verbose("cannot reach the shared memory service '@%s': %s", name, strerror(errno));
		goto out;
	}
	memset(q, 0, sizeof q);
	put32(q, SM_MAGIC);
	put16(q + 4, 1);
	put16(q + 6, 1);
	put32(q + 8, SM_REQ);
	put64(q + 16, version);
	if (send(c, q, sizeof q, MSG_NOSIGNAL) != (ssize_t)sizeof q)
		goto out;
	memset(&cm, 0, sizeof cm);
	mh.msg_iov = &io;
	mh.msg_iovlen = 1;
	mh.msg_control = cm.b;
	mh.msg_controllen = sizeof cm.b;
	if ((k = recvmsg(c, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL)) != (ssize_t)sizeof p) {
		rl_verbose("shared memory service '@%s': short reply", name);
		goto out;
	}
	for (h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(h), sizeof(int));
	rv = RL_EFORMAT;
	if (get32(p) != SM_MAGIC || get16(p + 4) != 1 || get16(p + 6) != 0x8001 || get32(p + 8) != SM_REP ||
	    (mh.msg_flags & MSG_CTRUNC))
		goto out;
	st = (int32_t)get32(p + 12);
	if (st < 0 || st >= RL_ERR_COUNT)
		goto out;
	if ((rv = st) != RL_OK)
		goto out;
	if (*fd < 0) {
		rv = RL_EFORMAT;
		goto out;
	}
	*got = get64(p + 16);
	*size = get64(p + 24);
out:
	if (rv != RL_OK && *fd >= 0) {
		close(*fd);
		*fd = -1;
	}
	close(c);
	return rv;
}

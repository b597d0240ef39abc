/*
 * wshm.c — same-host weight transport: sealed memfd objects handed over an
 * abstract Unix socket with SCM_RIGHTS (design and reasons in wshm.h and
 * docs/sync.md).  Leaves out: anything but Linux.
 *
 * Socket protocol (SOCK_STREAM, one request per connection):
 *   request 24 bytes: u32 "RLSM", u16 1, u16 op, u32 24, u32 0, u64 version;
 *                     with a shared key 72 (u32 72 at byte 8, then time,
 *                     nonce and MAC: wsync_int.h), refused without one
 *     op 1 GET:  the server's object of that version (0: latest)
 *     op 2 PUT:  the client's sealed object of that version rides along
 *                (SCM_RIGHTS) for the server to take (a trainer's push)
 *   reply   32 bytes: u32 "RLSM", u16 1, u16 0x8000 | op, u32 32, i32 status,
 *                     u64 version, u64 object size; for GET the descriptor
 *                     rides along when status is 0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sync/wshm.h"
#include "base/core.h"
#include "base/auth.h"
#include "base/hash.h"
#include "sync/wsync_int.h"
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
enum { SM_GET = 1, SM_PUT = 2 };


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
	snprintf(out, n, "%016llx", (unsigned long long)rl_hash64(buf, k, 0x726c73686d));
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
	uint8_t *r;
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
	/* pwrite, not a writable mapping: the kernel copies into the pages it
	 * allocates (no zero-fill, no page-table work; measured ~2x faster for
	 * 250 MB), and no writable mapping is left to stop F_SEAL_WRITE */
	for (int i = 0; i < v->nblobs; i++) {
		const uint8_t *p = v->blobs[i].data;
		uint64_t left = v->blobs[i].size;
		off = align_up(off);
		while (left > 0) {
			ssize_t k = pwrite(f, p, (size_t)RL_MIN(left, (uint64_t)1 << 30), (off_t)off);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				rl_error("cannot fill shared memory for version %llu: %s", (unsigned long long)v->version,
					 k < 0 ? strerror(errno) : "short write");
				rv = k < 0 && (errno == ENOSPC || errno == ENOMEM) ? RL_ENOMEM : RL_EIO;
				goto fail;
			}
			p += k;
			off += (uint64_t)k;
			left -= (uint64_t)k;
		}
	}
	if (corrupt && off > 0) {
		uint8_t b = 0;
		if (pread(f, &b, 1, (off_t)(off / 2)) == 1) {
			b ^= 0x5a;
			(void)!pwrite(f, &b, 1, (off_t)(off / 2));
		}
	}
	if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
		rl_error("cannot seal shared memory for version %llu: %s", (unsigned long long)v->version,
			 strerror(errno));
		rv = RL_EIO;
		goto fail;
	}
	if (repoint_v && !corrupt) {
		if ((r = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED | MAP_POPULATE, f, 0)) == MAP_FAILED) {
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
	/* populated: the caller reads every byte at once (the checksum pass) */
	if ((m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0)) == MAP_FAILED) {
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
	rl_wshm_take take;
	void *arg;
	char name[108];
	_Atomic uint64_t served, taken;
};

/* send the n bytes of buf and, when fd >= 0, the descriptor fd with them.
 * 0 on success. */
static int
send_msg(int c, const uint8_t *buf, size_t n, int fd)
{
	struct iovec io = { (void *)buf, n };
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct msghdr mh = { 0 };

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
	return sendmsg(c, &mh, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

static int
send_reply(int c, int op, int32_t status, uint64_t version, uint64_t size, int fd)
{
	uint8_t p[SM_REP];

	memset(p, 0, sizeof p);
	put32(p, SM_MAGIC);
	put16(p + 4, 1);
	put16(p + 6, (uint16_t)(0x8000 | op));
	put32(p + 8, SM_REP);
	put32(p + 12, (uint32_t)status);
	put64(p + 16, version);
	put64(p + 24, size);
	return send_msg(c, p, sizeof p, fd);
}

/* recv exactly n bytes; the first descriptor that comes with them goes to
 * *fd (else -1), any other is closed.  0 on success; -1 on a short read or
 * when the kernel had to drop descriptors (MSG_CTRUNC: not this protocol). */
static int
recv_msg(int c, uint8_t *q, size_t n, int *fd)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	size_t got = 0;

	*fd = -1;
	while (got < n) {
		struct iovec io = { q + got, n - got };
		struct msghdr mh = { 0 };
		struct cmsghdr *h;
		ssize_t k;

		memset(&cm, 0, sizeof cm);
		mh.msg_iov = &io;
		mh.msg_iovlen = 1;
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof cm.b;
		if ((k = recvmsg(c, &mh, MSG_CMSG_CLOEXEC)) <= 0)
			goto fail;
		for (h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
			int f;
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			/* one descriptor is expected; close any other that came */
			for (size_t i = 0; i + sizeof(int) <= h->cmsg_len - CMSG_LEN(0); i += sizeof(int)) {
				memcpy(&f, CMSG_DATA(h) + i, sizeof f);
				if (*fd < 0)
					*fd = f;
				else
					close(f);
			}
		}
		if (mh.msg_flags & MSG_CTRUNC)
			goto fail;
		got += (size_t)k;
	}
	return 0;
fail:
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	return -1;
}

static void
serve_conn(rl_wshm_srv *s, int c)
{
	uint8_t q[SM_REQ + WS_AUTH_EXTRA];
	struct timeval tv = { 1, 0 };
	uint64_t ver = 0, size = 0;
	size_t qn = SM_REQ;
	const char *no;
	int fd = -1, st, op, fd2;

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (recv_msg(c, q, SM_REQ, &fd) != 0)
		goto out;
	if (get32(q + 8) == SM_REQ + WS_AUTH_EXTRA) {
		qn += WS_AUTH_EXTRA;
		if (recv_msg(c, q + SM_REQ, WS_AUTH_EXTRA, &fd2) != 0)
			goto out;
		if (fd2 >= 0)
			close(fd2);
	}
	op = get16(q + 6);
	if (get32(q) != SM_MAGIC || get16(q + 4) != 1 || (op != SM_GET && op != SM_PUT) || get32(q + 8) != qn) {
		send_reply(c, SM_GET, RL_EFORMAT, 0, 0, -1);
		goto out;
	}
	/* the socket's name is no secret (any local user can connect to an
	 * abstract one): a keyed server hands out and takes objects for keyed
	 * clients only */
	if (rli_ws_auth_check_at(q, SM_REQ, qn, &no) != 0) {
		rl_warn("shared memory service: refused a %s request: %s", op == SM_PUT ? "push" : "get", no);
		send_reply(c, op, RL_EINVAL, 0, 0, -1);
		goto out;
	}
	if (op == SM_PUT) {
		/* the taker maps (or dups) what it keeps; ours is closed below */
		ver = get64(q + 16);
		if (fd < 0)
			st = RL_EFORMAT;
		else if (s->take == NULL)
			st = RL_ENOTSUP;
		else
			st = s->take(s->arg, ver, fd, &size);
		/* counted before the reply: the version is taken whether or not the
		 * reply gets through, and a pusher that reads the count after its
		 * OK (test_wsync_shm) must find it there */
		if (st == RL_OK)
			s->taken++;
		send_reply(c, SM_PUT, st, ver, size, -1);
		goto out;
	}
	if (fd >= 0) { /* a GET brings no descriptor */
		close(fd);
		fd = -1;
	}
	st = s->lookup(s->arg, get64(q + 16), &fd, &ver, &size);
	/* counted before the reply, as a take is; taken back when it did not go out */
	if (st == RL_OK)
		s->served++;
	if (send_reply(c, SM_GET, st, ver, size, st == RL_OK ? fd : -1) != 0 && st == RL_OK)
		s->served--;
out:
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
	return rl_wshm_srv_open2(out, lookup, NULL, arg);
}

int
rl_wshm_srv_open2(rl_wshm_srv **out, rl_wshm_lookup lookup, rl_wshm_take take, void *arg)
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
	s->take = take;
	s->arg = arg;
	if (rl_wshm_hostid(hid, sizeof hid) != 0)
		snprintf(hid, sizeof hid, "0");
	rnd = rl_hash64(&s, sizeof s, (uint64_t)rl_now() * 1000003u ^ (uint64_t)getpid());
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
uint64_t rl_wshm_srv_taken(const rl_wshm_srv *s) { return atomic_load(&((rl_wshm_srv *)s)->taken); }

/* one request to the service called name: op, version, optionally a
 * descriptor to send (sendfd >= 0); the reply's status, version, size and
 * (GET) descriptor */
static int
exchange(int op, int sendfd, int *fd, uint64_t *got, uint64_t *size, const char *name, uint64_t version,
	 int timeout_ms)
{
	struct sockaddr_un a;
	uint8_t q[SM_REQ + WS_AUTH_EXTRA], p[SM_REP];
	size_t qn = rli_auth_key(NULL) ? SM_REQ + WS_AUTH_EXTRA : SM_REQ;
	struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
	int c, rv = RL_ENET, st;

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
	put16(q + 6, (uint16_t)op);
	put32(q + 8, SM_REQ);
	put64(q + 16, version);
	if (qn > SM_REQ)
		rli_ws_auth_sign_at(q, SM_REQ, qn);
	if (send_msg(c, q, qn, sendfd) != 0)
		goto out;
	if (recv_msg(c, p, sizeof p, fd) != 0) {
		rl_verbose("shared memory service '@%s': short or malformed reply", name);
		goto out;
	}
	rv = RL_EFORMAT;
	if (get32(p) != SM_MAGIC || get16(p + 4) != 1 || get16(p + 6) != (0x8000 | op) || get32(p + 8) != SM_REP)
		goto out;
	st = (int32_t)get32(p + 12);
	if (st < 0 || st >= RL_ERR_COUNT)
		goto out;
	*got = get64(p + 16);
	*size = get64(p + 24);
	if ((rv = st) != RL_OK)
		goto out;
	if (op == SM_GET && *fd < 0)
		rv = RL_EFORMAT;
out:
	if ((rv != RL_OK || op != SM_GET) && *fd >= 0) {
		close(*fd);
		*fd = -1;
	}
	close(c);
	return rv;
}

int
rl_wshm_recv(int *fd, uint64_t *got, uint64_t *size, const char *name, uint64_t version, int timeout_ms)
{
	return exchange(SM_GET, -1, fd, got, size, name, version, timeout_ms);
}

int
rl_wshm_send(const char *name, uint64_t version, int fd, int timeout_ms)
{
	uint64_t got = 0, size = 0;
	int none;

	if (fd < 0)
		return RL_EINVAL;
	return exchange(SM_PUT, fd, &none, &got, &size, name, version, timeout_ms);
}

/*
 * comm.c — the communicator (see comm.h): launch configuration, nng
 * rendezvous, the CPU ring backend and the NCCL backend, ZeRO-1's
 * reduce-scatter and all-gather, the bucketed overlapped all-reduce.
 *
 * Ring wire format: every message starts with a 16-byte header
 *   u32 magic "RLC1", u8 kind, u8 op, u16 from-rank, u32 collective number,
 *   u32 aux (segment index; the failed rank in an ABORT)
 * then up to seg_bytes of payload.  Both sides compute the same segment
 * counts, so a mismatch of kind, op, number or segment means the ranks are
 * out of step (different code paths): refused with both names.
 *
 * Sends are synchronous with small socket buffers: each rank alternates
 * "send segment k, receive segment k", so the cycle never deadlocks and
 * memory stays at a few segments per connection.
 *
 * Same host: when both ends of a ring edge are on one host (the producer's
 * memfd, offered in the ring hello, opens and holds the offer's nonce:
 * comm_shm.h), the bulk collectives' segments go through a shared-memory
 * channel instead (same headers, same order, so the same results); the
 * sockets keep the control plane: hello, host collectives, aborts, goodbye
 * and the lost-peer events.  RL_COMM_SHM=0 keeps every edge on TCP.
 *
 * Overlap: rl_comm_reducer runs the all-reduce of gradient buckets on its
 * own thread (ring) or on the NCCL stream while the caller computes.
 *
 * Leaves out: IPv6.
 */
#include "compute/comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "base/core.h"
#include "base/nngx.h"
#include "compute/comm_shm.h"

#if HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#define MAGIC 0x31434c52u /* "RLC1" little-endian */
#define HDR 16
#define SLICE_MS 100
#define RDV_VERSION 2 /* 2: the ring hello may carry a shared-memory offer */
#define SHM_SLOTS 4
#define RDV_REFUSED 0xffffffffu /* in a rendezvous answer's version: a refusal, its text follows */

enum { K_DATA = 1, K_HELLO, K_ABORT, K_BYE };
enum { OP_NONE = 0, OP_ALLREDUCE, OP_BCAST, OP_ALLGATHER };

enum { B_SINGLE = 0, B_CPU, B_NCCL };

/* The ring sockets' pipe events, in a block of its own rather than in
 * rl_comm: nng runs the callbacks on its reaper thread, and a close that
 * rli_nng_close_timed leaves hanging may still run them after rl_comm_close;
 * the block is then left allocated (rl_comm_close) so that they never write
 * freed memory. */
struct pipe_watch {
	_Atomic uint32_t prev_pipe, next_pipe;   /* pipe ids in use (0: none yet) */
	_Atomic int prev_lost, next_lost;
};

struct rl_comm {
	int rank, world, local_rank, backend;
	double timeout;
	const char *addr_opts, *world_opts, *timeout_opts; /* for hints (rl_comm_opts) */
	size_t seg;
	rl_ops *ops;
	uint32_t seq;               /* collectives so far */
	int failed, finished;
	nng_socket prev, next;      /* ring: receive from rank-1, send to rank+1 */
	int have_prev, have_next;
	nng_listener lst;
	struct pipe_watch *pw;      /* what the ring sockets' pipe callbacks write */
	int close_left;             /* a ring socket's close was left hanging (nng #1543) */
	_Atomic int interrupted;                 /* rl_comm_interrupt */
	int shm_on;                 /* RL_COMM_SHM: offer and accept shared-memory edges */
	rli_shm_chan *shm_out, *shm_in;  /* the edges to rank+1 and from rank-1 in shared memory (NULL: TCP) */
	nng_msg *pending;           /* a message from rank-1 read while waiting on shm_in */
	float *stage;               /* host staging for a device rl_ops on the cpu backend */
	size_t stage_n;
#if HAVE_NCCL
	ncclComm_t nc;
	cudaStream_t stream;
#endif
};

static const char *
op_name(int op)
{
	switch (op) {
	case OP_ALLREDUCE: return "all-reduce";
	case OP_BCAST: return "broadcast";
	case OP_ALLGATHER: return "all-gather";
	default: return "set-up";
	}
}

static int
prev_of(const rl_comm *c)
{
	return (c->rank + c->world - 1) % c->world;
}

static int
next_of(const rl_comm *c)
{
	return (c->rank + 1) % c->world;
}

/* ---- launch configuration ------------------------------------------------------------ */

void
rl_comm_opts_default(rl_comm_opts *o)
{
	memset(o, 0, sizeof *o);
	o->rank = o->world = o->local_rank = -1;
	o->backend = "auto";
	o->timeout = 0;
}

static int
env_int(const char *name, int *out, int *found)
{
	const char *s = getenv(name);
	char *end;
	long v;

	*found = 0;
	if (!s || !*s)
		return RL_OK;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < -1000000000L || v > 1000000000L) {
		rl_error("%s='%s' is not a whole number", name, s);
		return RL_EINVAL;
	}
	*out = (int)v;
	*found = 1;
	return RL_OK;
}

int
rl_comm_opts_from_env(rl_comm_opts *o)
{
	int rank = -1, world = -1, local = -1, f_rank = 0, f_world = 0, f_local = 0, rv;
	const char *rank_name = "RANK", *world_name = "WORLD_SIZE";

	if ((rv = env_int("RANK", &rank, &f_rank)) != 0 || (rv = env_int("WORLD_SIZE", &world, &f_world)) != 0 ||
	    (rv = env_int("LOCAL_RANK", &local, &f_local)) != 0)
		return rv;
	if (!f_rank && !f_world) {
		if ((rv = env_int("SLURM_PROCID", &rank, &f_rank)) != 0 ||
		    (rv = env_int("SLURM_NTASKS", &world, &f_world)) != 0 ||
		    (!f_local && (rv = env_int("SLURM_LOCALID", &local, &f_local)) != 0))
			return rv;
		rank_name = "SLURM_PROCID";
		world_name = "SLURM_NTASKS";
	}
	if (o->world < 0) {
		o->world = f_world ? world : 1;
	} else {
		world_name = "--world";
	}
	if (o->rank < 0) {
		if (!f_rank && o->world > 1) {
			rl_error("%s=%d but no rank (RANK, SLURM_PROCID or --rank)", world_name, o->world);
			return RL_EINVAL;
		}
		o->rank = f_rank ? rank : 0;
	} else {
		rank_name = "--rank";
	}
	if (o->local_rank < 0)
		o->local_rank = f_local ? local : 0;
	if (o->world < 1) {
		rl_error("%s=%d: the world size must be at least 1", world_name, o->world);
		return RL_EINVAL;
	}
	if (o->rank < 0 || o->rank >= o->world) {
		rl_error("%s=%d is not below %s=%d (ranks are 0 .. %d)", rank_name, o->rank, world_name,
		    o->world, o->world - 1);
		return RL_EINVAL;
	}
	if (o->local_rank < 0) {
		rl_error("LOCAL_RANK=%d is negative", o->local_rank);
		return RL_EINVAL;
	}
	if (o->timeout <= 0) {
		const char *t = getenv("RL_COMM_TIMEOUT");
		o->timeout = 600;
		if (t && *t) {
			char *end;
			double v = strtod(t, &end);
			if (end == t || *end || !(v > 0 && v <= 1e6)) {
				rl_error("RL_COMM_TIMEOUT='%s' is not a number of seconds", t);
				return RL_EINVAL;
			}
			o->timeout = v;
		}
	}
	if (!o->master && o->world > 1) {
		const char *a = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
		if (!a || !*a) {
			rl_error("world size %d but no rendezvous address", o->world);
			rl_hint("set MASTER_ADDR (and MASTER_PORT, default 29500) or pass --rendezvous HOST:PORT");
			return RL_EINVAL;
		}
		snprintf(o->master_buf, sizeof o->master_buf, "%s:%s", a, p && *p ? p : "29500");
		o->master = o->master_buf;
	}
	return RL_OK;
}

/* HOST:PORT (or tcp://HOST:PORT) to a dotted IPv4 address and port;
 * addr_opts names what set it, for the hint. */
static int
resolve(const char *master, const char *addr_opts, char ip[64], int *port)
{
	char host[256];
	const char *s = master, *colon;
	struct addrinfo hints = { 0 }, *res = NULL;
	char *end;
	long p;
	int e;

	if (strncmp(s, "tcp://", 6) == 0)
		s += 6;
	colon = strrchr(s, ':');
	if (!colon || colon == s || (size_t)(colon - s) >= sizeof host) {
		rl_error("rendezvous address '%s' is not HOST:PORT", master);
		return RL_EINVAL;
	}
	p = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || p < 1 || p > 65535) {
		rl_error("rendezvous port '%s' is not a port number (1 .. 65535)", colon + 1);
		return RL_EINVAL;
	}
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	if ((e = getaddrinfo(host, NULL, &hints, &res)) != 0 || !res) {
		rl_error("cannot resolve the rendezvous host '%s': %s", host, gai_strerror(e));
		rl_hint("%s must name rank 0's host", addr_opts);
		return RL_ENET;
	}
	inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, 64);
	freeaddrinfo(res);
	*port = (int)p;
	return RL_OK;
}

/* ---- sockets -------------------------------------------------------------------------- */

static void
on_prev_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct pipe_watch *w = arg;
	if (ev == NNG_PIPE_EV_REM_POST && atomic_load(&w->prev_pipe) == (uint32_t)nng_pipe_id(p))
		atomic_store(&w->prev_lost, 1);
}

static void
on_next_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct pipe_watch *w = arg;
	if (ev == NNG_PIPE_EV_ADD_POST) {
		uint32_t zero = 0;
		atomic_compare_exchange_strong(&w->next_pipe, &zero, (uint32_t)nng_pipe_id(p));
	} else if (ev == NNG_PIPE_EV_REM_POST && atomic_load(&w->next_pipe) == (uint32_t)nng_pipe_id(p)) {
		atomic_store(&w->next_lost, 1);
	}
}

static void
put_hdr(uint8_t *h, int kind, int op, int from, uint32_t seq, uint32_t aux)
{
	uint32_t m = MAGIC;
	uint16_t f = (uint16_t)from;
	memcpy(h, &m, 4);
	h[4] = (uint8_t)kind;
	h[5] = (uint8_t)op;
	memcpy(h + 6, &f, 2);
	memcpy(h + 8, &seq, 4);
	memcpy(h + 12, &aux, 4);
}

/* Tells the next rank (best effort) that `culprit` failed, so that it fails
 * with the same name instead of waiting for its own timeout. */
static void
send_abort(rl_comm *c, int culprit)
{
	nng_msg *m;
	if (!c->have_next || atomic_load(&c->pw->next_lost) || nng_msg_alloc(&m, HDR) != 0)
		return;
	put_hdr(nng_msg_body(m), K_ABORT, OP_NONE, c->rank, c->seq, (uint32_t)culprit);
	if (nng_sendmsg(c->next, m, NNG_FLAG_NONBLOCK) != 0)
		nng_msg_free(m);
	else
		usleep(50000); /* let it leave before this process does */
}

/* Marks the communicator failed, names the culprit and passes it on. */
static int
fail(rl_comm *c, int rv, int culprit)
{
	if (!c->failed) {
		c->failed = rv;
		if (culprit >= 0)
			send_abort(c, culprit);
	}
	return rv;
}

/* which: 1 the previous rank (we wait on it), 2 the next (we send to it), 3 both */
static int
lost_check(rl_comm *c, const char *what, int which)
{
	if (atomic_load(&c->interrupted)) {
		rl_verbose("%s #%u interrupted", what, c->seq);
		return fail(c, RL_ECLOSED, -1);
	}
	if ((which & 1) && atomic_load(&c->pw->prev_lost)) {
		rl_error("lost the connection to rank %d during %s #%u (its process exited or its host is "
		    "unreachable)", prev_of(c), what, c->seq);
		return fail(c, RL_ECLOSED, prev_of(c));
	}
	if ((which & 2) && atomic_load(&c->pw->next_lost)) {
		rl_error("lost the connection to rank %d during %s #%u (its process exited or its host is "
		    "unreachable)", next_of(c), what, c->seq);
		return fail(c, RL_ECLOSED, next_of(c));
	}
	return RL_OK;
}

static int
send_msg(rl_comm *c, nng_msg *m, int op)
{
	double t0 = rl_now();
	int e, rv;

	/* the send queue would take it even with nobody at the other end */
	if ((rv = lost_check(c, op_name(op), 2)) != 0) {
		nng_msg_free(m);
		return rv;
	}
	for (;;) {
		if ((e = nng_sendmsg(c->next, m, 0)) == 0)
			return RL_OK;
		if (e != NNG_ETIMEDOUT) {
			nng_msg_free(m);
			rl_error("cannot send to rank %d: %s", next_of(c), nng_strerror(e));
			return fail(c, RL_ENET, next_of(c));
		}
		if ((rv = lost_check(c, op_name(op), 2)) != 0) {
			nng_msg_free(m);
			return rv;
		}
		if (rl_now() - t0 > c->timeout) {
			nng_msg_free(m);
			rl_error("rank %d took nothing for %g s during %s #%u (timeout; it may be hung, or waiting "
			    "on another rank)", next_of(c), c->timeout, op_name(op), c->seq);
			return fail(c, RL_ETIMEDOUT, next_of(c));
		}
	}
}

static int
send_seg(rl_comm *c, int kind, int op, uint32_t aux, const void *p, size_t n)
{
	nng_msg *m;
	if (nng_msg_alloc(&m, HDR + n) != 0) {
		rl_error("cannot allocate a %zu-byte message", HDR + n);
		return fail(c, RL_ENOMEM, -1);
	}
	put_hdr(nng_msg_body(m), kind, op, c->rank, c->seq, aux);
	if (n)
		memcpy((uint8_t *)nng_msg_body(m) + HDR, p, n);
	return send_msg(c, m, op);
}

/* Checks a ring header from the previous rank (len: payload bytes): an
 * abort fails the communicator naming the rank that failed; else it must be
 * (kind, op, seq, aux) with n payload bytes. */
static int
check_hdr(rl_comm *c, const uint8_t *h, size_t len, int kind, int op, uint32_t aux, size_t n)
{
	uint32_t magic, seq, a;
	uint16_t from;

	memcpy(&magic, h, 4);
	if (magic != MAGIC) {
		rl_error("a malformed message from rank %d (%zu bytes)", prev_of(c), len + HDR);
		return fail(c, RL_EFORMAT, prev_of(c));
	}
	memcpy(&from, h + 6, 2);
	memcpy(&seq, h + 8, 4);
	memcpy(&a, h + 12, 4);
	if (h[4] == K_ABORT) {
		if ((int)a == c->rank)
			rl_error("rank %d reports this rank as failed", from);
		else
			rl_error("rank %d failed or went away (reported by rank %d during %s #%u)", (int)a, from,
			    op_name(op), c->seq);
		return fail(c, RL_ECLOSED, (int)a);
	}
	if (h[4] != kind || h[5] != op || seq != c->seq || a != aux || len != n || from != prev_of(c)) {
		rl_error("ranks out of step: rank %d sent %s #%u part %u (%zu bytes) while this rank expects "
		    "%s #%u part %u (%zu bytes)", from, h[4] == K_BYE ? "its goodbye" : op_name(h[5]), seq, a,
		    len, op_name(op), c->seq, aux, n);
		rl_hint("every rank must run the same command on the same input");
		return fail(c, RL_EFORMAT, -1);
	}
	return RL_OK;
}

/* A message (header h) came by the other transport than the one this rank
 * waits on: one rank runs a host collective where the other runs a bulk
 * one (their op codes may even agree), so the ranks are out of step.  any
 * = 0: only a message of this very collective proves it (shared memory seen
 * while waiting on the socket: a later collective's segment may overtake
 * the socket's last message of this one). */
static int
cross_check(rl_comm *c, const uint8_t *h, int op, const char *came, const char *want, int any)
{
	uint32_t seq;
	uint16_t from;

	memcpy(&seq, h + 8, 4);
	if (!any && seq != c->seq)
		return RL_OK;
	memcpy(&from, h + 6, 2);
	rl_error("ranks out of step: rank %d sent %s #%u %s while this rank expects %s #%u %s", from,
	    h[4] == K_BYE ? "its goodbye after" : op_name(h[5]), seq, came, op_name(op), c->seq, want);
	rl_hint("every rank must run the same command on the same input");
	return fail(c, RL_EFORMAT, -1);
}

/* While waiting on the socket: a segment of this collective waiting in the
 * shared memory from the previous rank means the ranks are out of step. */
static int
shm_cross(rl_comm *c, int op)
{
	const uint8_t *h, *d;
	size_t len;

	if (rli_shm_chan_peek(c->shm_in, 0, &h, &d, &len) != RL_OK)
		return RL_OK;
	return cross_check(c, h, op, "through shared memory", "on its socket", 0);
}

/* Receives the next ring message from the previous rank; checks it is
 * (kind, op, seq, aux) with n payload bytes.  *out is the caller's. */
/* The wait for the previous rank since t0 past the timeout: said, and the
 * ring failed */
static int
lag_check(rl_comm *c, int op, double t0)
{
	if (rl_now() - t0 <= c->timeout)
		return RL_OK;
	rl_error("no data from rank %d for %g s during %s #%u (timeout; it may be hung, or "
	    "waiting on another rank)", prev_of(c), c->timeout, op_name(op), c->seq);
	rl_hint("%s sets how long a rank may lag", c->timeout_opts);
	return fail(c, RL_ETIMEDOUT, prev_of(c));
}

static int
recv_seg(rl_comm *c, nng_msg **out, int kind, int op, uint32_t aux, size_t n)
{
	double t0 = rl_now();
	nng_msg *m;
	int e, rv;

	if ((m = c->pending) != NULL) {
		c->pending = NULL;
	} else {
		for (;;) {
			if ((e = nng_recvmsg(c->prev, &m, 0)) == 0)
				break;
			if (e != NNG_ETIMEDOUT) {
				rl_error("cannot receive from rank %d: %s", prev_of(c), nng_strerror(e));
				return fail(c, RL_ENET, prev_of(c));
			}
			if ((rv = lost_check(c, op_name(op), 1)) != 0)
				return rv;
			if (c->shm_in && (rv = shm_cross(c, op)) != 0)
				return rv;
			if ((rv = lag_check(c, op, t0)) != 0)
				return rv;
		}
	}
	if (nng_msg_len(m) < HDR) {
		rl_error("a malformed message from rank %d's connection (%zu bytes)", prev_of(c), nng_msg_len(m));
		nng_msg_free(m);
		return fail(c, RL_EFORMAT, prev_of(c));
	}
	if ((rv = check_hdr(c, nng_msg_body(m), nng_msg_len(m) - HDR, kind, op, aux, n)) != 0) {
		nng_msg_free(m);
		return rv;
	}
	*out = m;
	return RL_OK;
}

/* ---- the shared-memory edges ----------------------------------------------------------- */

/* Sends one segment to the next rank through its shared-memory channel:
 * waits for a free slot in slices, with send_msg's checks. */
static int
shm_send_seg(rl_comm *c, int op, uint32_t aux, const void *p, size_t n)
{
	double t0 = rl_now();
	uint8_t *h, *d;
	int rv;

	if ((rv = lost_check(c, op_name(op), 2)) != 0)
		return rv;
	while (rli_shm_chan_reserve(c->shm_out, SLICE_MS, &h, &d) != 0) {
		if ((rv = lost_check(c, op_name(op), 2)) != 0)
			return rv;
		if (rl_now() - t0 > c->timeout) {
			rl_error("rank %d took nothing for %g s during %s #%u (timeout; it may be hung, or waiting "
			    "on another rank)", next_of(c), c->timeout, op_name(op), c->seq);
			return fail(c, RL_ETIMEDOUT, next_of(c));
		}
	}
	put_hdr(h, K_DATA, op, c->rank, c->seq, aux);
	if (n)
		memcpy(d, p, n);
	rli_shm_chan_post(c->shm_out, n);
	return RL_OK;
}

/* Waits for the next segment from the previous rank's shared-memory
 * channel; *src (n bytes) stays valid until rli_shm_chan_release.  Between
 * slices it reads the socket too, where an abort arrives; any other message
 * there belongs to a later collective and is kept for recv_seg. */
static int
shm_recv_seg(rl_comm *c, const uint8_t **src, int op, uint32_t aux, size_t n)
{
	double t0 = rl_now();
	const uint8_t *h;
	size_t len;
	nng_msg *m;
	int rv;

	for (;;) {
		rv = rli_shm_chan_peek(c->shm_in, SLICE_MS, &h, src, &len);
		if (rv == RL_OK)
			break;
		if (rv != RL_ETIMEDOUT) {
			rl_error("a malformed segment in the shared memory of rank %d", prev_of(c));
			return fail(c, rv, prev_of(c));
		}
		if (!c->pending && nng_recvmsg(c->prev, &m, NNG_FLAG_NONBLOCK) == 0) {
			const uint8_t *mh = nng_msg_body(m);
			if (nng_msg_len(m) < HDR) {
				rl_error("a malformed message from rank %d's connection (%zu bytes)", prev_of(c),
				    nng_msg_len(m));
				nng_msg_free(m);
				return fail(c, RL_EFORMAT, prev_of(c));
			}
			if (mh[4] == K_ABORT) {
				rv = check_hdr(c, mh, nng_msg_len(m) - HDR, K_DATA, op, aux, n);
				nng_msg_free(m);
				return rv;
			}
			c->pending = m;
		}
		/* the previous rank posts all its segments of a collective before it
		 * sends anything of a later one, so with a socket message in hand
		 * the segment must be there by now, or the ranks are out of step */
		if (c->pending) {
			if (rli_shm_chan_peek(c->shm_in, 0, &h, src, &len) == RL_OK)
				break;
			return cross_check(c, nng_msg_body(c->pending), op, "on its socket", "through shared memory", 1);
		}
		if ((rv = lost_check(c, op_name(op), 1)) != 0)
			return rv;
		if ((rv = lag_check(c, op, t0)) != 0)
			return rv;
	}
	if ((rv = check_hdr(c, h, len, K_DATA, op, aux, n)) != 0) {
		rli_shm_chan_release(c->shm_in);
		return rv;
	}
	return RL_OK;
}

static int
ring_check(rl_comm *c)
{
	if (c->failed) {
		rl_error("the communicator failed earlier (%s)", rl_strerror(c->failed));
		return c->failed;
	}
	return RL_OK;
}

/* ---- ring collectives on host memory -------------------------------------------------- */

/* dst[i] += src's f32 i.  In blocks of a fixed 16, which -O2 turns into
 * vector adds (one f32 add per element all the same: the sums do not
 * change); src may be unaligned (an nng message body). */
static void
add_f32(float *restrict dst, const uint8_t *restrict src, size_t nf)
{
	size_t i = 0;

	for (; i + 16 <= nf; i += 16) {
		float v[16];
		memcpy(v, src + i * sizeof(float), sizeof v);
		for (int j = 0; j < 16; j++)
			dst[i + j] += v[j];
	}
	for (; i < nf; i++) {
		float v;
		memcpy(&v, src + i * sizeof(float), sizeof v);
		dst[i] += v;
	}
}

/* Sends segment k (len bytes at p) of a bulk collective (shm: through the
 * shared-memory edge when there is one) or a control one. */
static int
send_data(rl_comm *c, int shm, int op, uint32_t k, const void *p, size_t len)
{
	if (shm && c->shm_out)
		return shm_send_seg(c, op, k, p, len);
	return send_seg(c, K_DATA, op, k, p, len);
}

/* Receives segment k (len bytes) into dst (add = 1: f32 sum into dst; 0:
 * copy); from a shared-memory slot the sum reads the peer's slot directly. */
static int
recv_data(rl_comm *c, int shm, int op, uint32_t k, uint8_t *dst, size_t len, int add)
{
	nng_msg *m = NULL;
	const uint8_t *src;
	int rv;

	if (shm && c->shm_in) {
		if ((rv = shm_recv_seg(c, &src, op, k, len)) != 0)
			return rv;
	} else {
		if ((rv = recv_seg(c, &m, K_DATA, op, k, len)) != 0)
			return rv;
		src = (const uint8_t *)nng_msg_body(m) + HDR;
	}
	if (add)
		add_f32((float *)dst, src, len / sizeof(float));
	else if (len)
		memcpy(dst, src, len);
	if (m)
		nng_msg_free(m);
	else
		rli_shm_chan_release(c->shm_in);
	return RL_OK;
}

/* One ring step: send bytes [sp, sp+sn) to the next rank and receive rn
 * bytes from the previous one, segment by segment; each received segment goes
 * to rp (add = 1: f32 sum into rp; 0: copy).  shm: a bulk collective, which
 * may use the shared-memory edges. */
static int
ring_step(rl_comm *c, int op, const uint8_t *sp, size_t sn, uint8_t *rp, size_t rn, int add, int shm)
{
	size_t seg = c->seg;
	size_t ns = sn ? (sn + seg - 1) / seg : 1, nr = rn ? (rn + seg - 1) / seg : 1;
	int rv;

	for (size_t k = 0; k < RL_MAX(ns, nr); k++) {
		if (k < ns) {
			size_t off = k * seg, len = sn ? RL_MIN(seg, sn - off) : 0;
			if ((rv = send_data(c, shm, op, (uint32_t)k, sp + off, len)) != 0)
				return rv;
		}
		if (k < nr) {
			size_t off = k * seg, len = rn ? RL_MIN(seg, rn - off) : 0;
			if ((rv = recv_data(c, shm, op, (uint32_t)k, rp + off, len, add)) != 0)
				return rv;
		}
	}
	return RL_OK;
}

static size_t
chunk_lo(size_t n, int i, int N)
{
	return (size_t)((unsigned __int128)n * (unsigned)i / (unsigned)N);
}

/* Chunk i of the elements [lo, hi) of a buffer of n: rank i's shard of n
 * (chunk_lo) clipped to [lo, hi), so possibly empty. */
static size_t
chunk_at(size_t n, size_t lo, size_t hi, int i, int N)
{
	return RL_MIN(RL_MAX(chunk_lo(n, i, N), lo), hi);
}

/* N-1 ring steps over the N chunks of [lo, hi) of buf (n elements): at step
 * s rank r sends chunk r - s + shift and receives chunk r - s + shift - 1
 * (mod N), added to its own (reduce) or copied over it.  The building block
 * of the collectives below; chunks are the shards of n clipped to [lo, hi),
 * so a range's reduce-scatter leaves each element's sum with the rank that
 * owns it in the whole buffer (ZeRO-2's buckets). */
static int
ring_pass(rl_comm *c, float *buf, size_t n, size_t lo, size_t hi, int op, int shift, int reduce)
{
	int N = c->world, r = c->rank, rv;

	for (int s = 0; s < N - 1; s++) {
		int sc = ((r - s + shift) % N + N) % N, rc = (sc + N - 1) % N;
		size_t slo = chunk_at(n, lo, hi, sc, N), shi = chunk_at(n, lo, hi, sc + 1, N);
		size_t rlo = chunk_at(n, lo, hi, rc, N), rhi = chunk_at(n, lo, hi, rc + 1, N);
		if ((rv = ring_step(c, op, (const uint8_t *)(buf + slo), (shi - slo) * sizeof(float),
		    (uint8_t *)(buf + rlo), (rhi - rlo) * sizeof(float), reduce, 1)) != 0)
			return rv;
	}
	return RL_OK;
}

static int
ring_allreduce(rl_comm *c, float *buf, size_t n)
{
	int rv;

	c->seq++;
	/* reduce-scatter: after N-1 steps rank r holds the full sum of chunk r+1;
	 * then the all-gather of the reduced chunks */
	if ((rv = ring_pass(c, buf, n, 0, n, OP_ALLREDUCE, 0, 1)) != 0)
		return rv;
	return ring_pass(c, buf, n, 0, n, OP_ALLGATHER, 1, 0);
}

/* Reduce-scatter whose last step lands on the own chunk: rank r ends with
 * the full sum of chunk r (ring_allreduce's first half, shifted by one). */
static int
ring_reduce_scatter(rl_comm *c, float *buf, size_t n, size_t lo, size_t hi)
{
	c->seq++;
	return ring_pass(c, buf, n, lo, hi, OP_ALLREDUCE, -1, 1);
}

/* All-gather of chunks: rank r starts with chunk r. */
static int
ring_allgather_chunks(rl_comm *c, float *buf, size_t n)
{
	c->seq++;
	return ring_pass(c, buf, n, 0, n, OP_ALLGATHER, 0, 0);
}

static int
ring_allgather(rl_comm *c, uint8_t *out, const void *in, size_t bytes)
{
	int N = c->world, r = c->rank, rv;

	c->seq++;
	memmove(out + (size_t)r * bytes, in, bytes);
	for (int s = 0; s < N - 1; s++) {
		int sb = ((r - s) % N + N) % N, rb = ((r - s - 1) % N + N) % N;
		if ((rv = ring_step(c, OP_ALLGATHER, out + (size_t)sb * bytes, bytes, out + (size_t)rb * bytes,
		    bytes, 0, 0)) != 0)
			return rv;
	}
	return RL_OK;
}

/* Chain broadcast root -> root+1 -> ... -> root-1, pipelined by segment;
 * shm as in ring_step. */
static int
ring_broadcast(rl_comm *c, uint8_t *buf, size_t bytes, int root, int shm)
{
	size_t seg = c->seg, ns = bytes ? (bytes + seg - 1) / seg : 1;
	int forward = next_of(c) != root, rv;

	c->seq++;
	for (size_t k = 0; k < ns; k++) {
		size_t off = k * seg, len = bytes ? RL_MIN(seg, bytes - off) : 0;
		if (c->rank != root && (rv = recv_data(c, shm, OP_BCAST, (uint32_t)k, buf + off, len, 0)) != 0)
			return rv;
		if (forward && (rv = send_data(c, shm, OP_BCAST, (uint32_t)k, buf + off, len)) != 0)
			return rv;
	}
	return RL_OK;
}

/* ---- rendezvous ------------------------------------------------------------------------ */

typedef struct rdv_hello {
	uint32_t magic, version;
	int32_t rank, world, local_rank, port, backend;
	char host[64];
} rdv_hello;

typedef struct rdv_entry {
	char addr[96];      /* "tcp://IP:PORT" of the rank's ring listener */
	char host[64];
	int32_t local_rank;
} rdv_entry;

typedef struct rdv_table_hdr {
	uint32_t magic, version;
	int32_t world, backend;
	uint8_t nccl_id[128];
} rdv_table_hdr;

static int
is_loopback(const char *ip)
{
	return strncmp(ip, "127.", 4) == 0;
}

/* Rank 0 gives up: every rank whose hello it holds (ctx[1..n]) gets the
 * reason, so that the log of a rank on another host says why instead of
 * "Connection reset".  Best effort. */
static void
rdv_refuse(nng_ctx *ctx, int n, nng_aio *aio, const char *why)
{
	uint32_t hd[2] = { MAGIC, RDV_REFUSED };
	size_t wl = strlen(why) + 1;
	int sent = 0;

	for (int i = 1; i <= n; i++) {
		nng_msg *m;
		if (nng_msg_alloc(&m, sizeof hd + wl) != 0)
			return;
		memcpy(nng_msg_body(m), hd, sizeof hd);
		memcpy((uint8_t *)nng_msg_body(m) + sizeof hd, why, wl);
		nng_aio_set_msg(aio, m);
		nng_aio_set_timeout(aio, 1000);
		nng_ctx_send(ctx[i], aio);
		nng_aio_wait(aio);
		if (nng_aio_result(aio) != 0)
			nng_msg_free(m);
		else
			sent++;
	}
	/* nng has no linger: give the answers a moment to leave before the
	 * socket closes */
	if (sent)
		usleep(200000);
}

/* Rank 0: collects every other rank's hello, answers all with the table. */
static int
rdv_serve(rl_comm *c, const char *url, rdv_entry *tab, rdv_table_hdr *th, nng_socket *out)
{
	nng_socket s;
	nng_ctx *ctx = NULL;
	nng_aio *aio = NULL;
	int e, rv = RL_OK, N = c->world, got = 0;
	char *seen = NULL, why[256];
	const char *hint;
	double t0 = rl_now();

	if ((e = nng_rep0_open(&s)) != 0) {
		rl_error("cannot open a socket: %s", nng_strerror(e));
		return RL_ENET;
	}
	*out = s;
	if ((e = nng_listen(s, url, NULL, 0)) != 0) {
		rl_error("rank 0 cannot listen on %s: %s", url, nng_strerror(e));
		rl_hint("%s must name rank 0's host and a free port", c->addr_opts);
		return RL_ENET;
	}
	ctx = calloc((size_t)N, sizeof *ctx);
	seen = calloc((size_t)N, 1);
	if (!ctx || !seen || nng_aio_alloc(&aio, NULL, NULL) != 0) {
		rv = RL_ENOMEM;
		goto out;
	}
	nng_aio_set_timeout(aio, SLICE_MS);
	for (int i = 1; i < N; i++)
		if ((e = nng_ctx_open(&ctx[i], s)) != 0) {
			rl_error("cannot open a context: %s", nng_strerror(e));
			rv = RL_ENET;
			goto out;
		}
	while (got < N - 1) {
		nng_msg *m;
		rdv_hello h;
		nng_sockaddr sa;
		char ip[64] = "?";
		nng_ctx_recv(ctx[got + 1], aio);
		nng_aio_wait(aio);
		if ((e = nng_aio_result(aio)) == NNG_ETIMEDOUT) {
			if (rl_now() - t0 > c->timeout) {
				char miss[256] = "";
				size_t l = 0;
				for (int i = 1; i < N && l < sizeof miss - 16; i++)
					if (!seen[i])
						l += (size_t)snprintf(miss + l, sizeof miss - l, "%s%d", l ? ", " : "", i);
				rl_error("rendezvous on %s: rank(s) %s did not join within %g s", url, miss, c->timeout);
				rl_hint("start every rank with the same %s and %s", c->addr_opts, c->world_opts);
				rv = RL_ETIMEDOUT;
				goto out;
			}
			continue;
		}
		if (e != 0) {
			rl_error("rendezvous: %s", nng_strerror(e));
			rv = RL_ENET;
			goto out;
		}
		m = nng_aio_get_msg(aio);
		if (nng_msg_len(m) != sizeof h) {
			rl_warn("rendezvous: ignoring a %zu-byte message that is not a hello", nng_msg_len(m));
			nng_msg_free(m);
			continue;
		}
		memcpy(&h, nng_msg_body(m), sizeof h);
		h.host[sizeof h.host - 1] = 0;
		if (nng_pipe_get_addr(nng_msg_get_pipe(m), NNG_OPT_REMADDR, &sa) == 0 && sa.s_family == NNG_AF_INET)
			inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof ip);
		nng_msg_free(m);
		if (h.magic != MAGIC || h.version != RDV_VERSION) {
			rl_error("rendezvous: a hello of another version from %s (rlpipe builds differ?)", ip);
			rdv_refuse(ctx, got, aio, "another rank's hello was of another version (rlpipe builds differ?)");
			rv = RL_EVERSION;
			goto out;
		}
		hint = NULL;
		if (h.world != N) {
			snprintf(why, sizeof why, "rank %d (host %s) says the world size is %d, rank 0 says %d", h.rank,
			    h.host, h.world, N);
			rv = RL_EINVAL;
		} else if (h.rank <= 0 || h.rank >= N || seen[h.rank]) {
			snprintf(why, sizeof why, "rank %d (host %s) joined %s", h.rank, h.host,
			    h.rank > 0 && h.rank < N ? "twice" : "with a rank out of range");
			hint = "every process needs its own RANK";
			rv = RL_EINVAL;
		} else if (h.backend != th->backend) {
			snprintf(why, sizeof why, "rank %d uses the %s backend, rank 0 %s", h.rank,
			    h.backend == B_NCCL ? "nccl" : "cpu", th->backend == B_NCCL ? "nccl" : "cpu");
			hint = "give every rank the same --device";
			rv = RL_EINVAL;
		}
		if (rv != 0) {
			rl_error("rendezvous: %s", why);
			if (hint)
				rl_hint("%s", hint);
			rdv_refuse(ctx, got + 1, aio, why);
			goto out;
		}
		seen[h.rank] = 1;
		snprintf(tab[h.rank].addr, sizeof tab[h.rank].addr, "tcp://%s:%d", ip, h.port);
		memcpy(tab[h.rank].host, h.host, sizeof h.host);
		tab[h.rank].local_rank = h.local_rank;
		got++;
	}
	/* everyone is in: answer each context with the same table (header then entries) */
	for (int i = 1; i < N; i++) {
		nng_msg *m;
		size_t len = sizeof *th + (size_t)N * sizeof *tab;
		if (nng_msg_alloc(&m, len) != 0) {
			rv = RL_ENOMEM;
			goto out;
		}
		memcpy(nng_msg_body(m), th, sizeof *th);
		memcpy((uint8_t *)nng_msg_body(m) + sizeof *th, tab, (size_t)N * sizeof *tab);
		nng_aio_set_msg(aio, m);
		nng_aio_set_timeout(aio, 5000);
		nng_ctx_send(ctx[i], aio);
		nng_aio_wait(aio);
		if ((e = nng_aio_result(aio)) != 0) {
			nng_msg_free(m);
			rl_error("rendezvous: cannot answer rank %d: %s", i, nng_strerror(e));
			rv = RL_ENET;
			goto out;
		}
	}
out:
	if (ctx)
		for (int i = 1; i < N; i++)
			if (nng_ctx_id(ctx[i]) > 0)
				nng_ctx_close(ctx[i]);
	nng_aio_free(aio);
	free(ctx);
	free(seen);
	return rv;
}

/* Other ranks: sends the hello to rank 0 and waits for the table. */
static int
rdv_join(rl_comm *c, const char *url, int port, int backend, rdv_entry *tab, rdv_table_hdr *th,
    nng_socket *out)
{
	nng_socket s;
	rdv_hello h;
	nng_msg *m = NULL;
	double t0 = rl_now();
	int e;

	memset(&h, 0, sizeof h);
	h.magic = MAGIC;
	h.version = RDV_VERSION;
	h.rank = c->rank;
	h.world = c->world;
	h.local_rank = c->local_rank;
	h.port = port;
	h.backend = backend;
	gethostname(h.host, sizeof h.host - 1);
	if ((e = nng_req0_open(&s)) != 0) {
		rl_error("cannot open a socket: %s", nng_strerror(e));
		return RL_ENET;
	}
	*out = s;
	/* one request, never re-sent: rank 0 answers when everyone has joined */
	nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 50);
	nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 500);
	nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, sizeof *th + (size_t)c->world * sizeof *tab + 64);
	if ((e = nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
		rl_error("cannot dial rank 0 at %s: %s", url, nng_strerror(e));
		return RL_ENET;
	}
	/* the request waits for a connection to rank 0, so the timeout starts here */
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, (nng_duration)(c->timeout * 1000));
	if ((e = nng_send(s, &h, sizeof h, 0)) != 0) {
		if (e == NNG_ETIMEDOUT) {
			rl_error("cannot reach rank 0 at %s within %g s", url, c->timeout);
			rl_hint("is rank 0 running, and is %s the same everywhere? (%s sets the wait)", c->addr_opts,
			    c->timeout_opts);
			return RL_ETIMEDOUT;
		}
		rl_error("cannot send to rank 0 at %s: %s", url, nng_strerror(e));
		return RL_ENET;
	}
	/* one wait for the answer: a req socket's receive timeout cancels the request */
	{
		double left = c->timeout - (rl_now() - t0);
		nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, (nng_duration)(RL_MAX(left, 0.1) * 1000));
	}
	if ((e = nng_recvmsg(s, &m, 0)) != 0) {
		if (e == NNG_ETIMEDOUT) {
			rl_error("no answer from rank 0 at %s within %g s", url, c->timeout);
			rl_hint("is rank 0 running, and are %s and %s the same everywhere? (%s sets the wait)",
			    c->addr_opts, c->world_opts, c->timeout_opts);
			return RL_ETIMEDOUT;
		}
		rl_error("rendezvous with rank 0 at %s: %s", url, nng_strerror(e));
		return RL_ENET;
	}
	if (nng_msg_len(m) > 8) {
		uint32_t hd[2];
		memcpy(hd, nng_msg_body(m), sizeof hd);
		if (hd[0] == MAGIC && hd[1] == RDV_REFUSED) {
			char *why = (char *)nng_msg_body(m) + 8;
			why[nng_msg_len(m) - 9] = 0;
			rl_error("rendezvous: rank 0 at %s gave up: %s", url, why);
			nng_msg_free(m);
			return RL_EINVAL;
		}
	}
	if (nng_msg_len(m) != sizeof *th + (size_t)c->world * sizeof *tab) {
		rl_error("rendezvous: rank 0's answer has %zu bytes, expected %zu", nng_msg_len(m),
		    sizeof *th + (size_t)c->world * sizeof *tab);
		nng_msg_free(m);
		return RL_EFORMAT;
	}
	memcpy(th, nng_msg_body(m), sizeof *th);
	memcpy(tab, (uint8_t *)nng_msg_body(m) + sizeof *th, (size_t)c->world * sizeof *tab);
	nng_msg_free(m);
	if (th->magic != MAGIC || th->version != RDV_VERSION || th->world != c->world) {
		rl_error("rendezvous: rank 0's answer is of another version or world size");
		return RL_EVERSION;
	}
	if (th->backend != backend) {
		rl_error("rendezvous: rank 0 uses the %s backend, this rank %s", th->backend == B_NCCL ? "nccl" : "cpu",
		    backend == B_NCCL ? "nccl" : "cpu");
		return RL_EINVAL;
	}
	return RL_OK;
}

/* ---- NCCL -------------------------------------------------------------------------------- */

#if HAVE_NCCL
/* Waits for the NCCL work queued on c->stream (or a non-blocking call in
 * progress when stream_too is 0), bounded by the timeout and the ring's view
 * of the peers; aborts the communicator on failure. */
static int
nccl_wait(rl_comm *c, const char *what, int stream_too)
{
	double t0 = rl_now();
	ncclResult_t st;
	int rv;

	for (;;) {
		if (ncclCommGetAsyncError(c->nc, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
			rl_error("nccl: %s failed: %s", what, ncclGetErrorString(st));
			ncclCommAbort(c->nc);
			c->nc = NULL;
			return fail(c, RL_EDEVICE, -1);
		}
		if (st == ncclSuccess) {
			if (!stream_too)
				return RL_OK;
			cudaError_t ce = cudaStreamQuery(c->stream);
			if (ce == cudaSuccess)
				return RL_OK;
			if (ce != cudaErrorNotReady) {
				rl_error("nccl: %s: %s", what, cudaGetErrorString(ce));
				ncclCommAbort(c->nc);
				c->nc = NULL;
				return fail(c, RL_EDEVICE, -1);
			}
		}
		if ((rv = lost_check(c, what, 3)) != 0 || rl_now() - t0 > c->timeout) {
			if (!rv) {
				rl_error("nccl: %s did not finish within %g s (timeout; a rank may be hung)", what, c->timeout);
				rv = fail(c, RL_ETIMEDOUT, -1);
			}
			ncclCommAbort(c->nc);
			c->nc = NULL;
			return rv;
		}
		usleep(200);
	}
}

static int
nccl_open(rl_comm *c, const rdv_table_hdr *th)
{
	ncclUniqueId id;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclResult_t r;
	cudaError_t ce;

	memcpy(&id, th->nccl_id, sizeof id);
	if ((ce = cudaSetDevice(c->ops->device)) != cudaSuccess ||
	    (ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		rl_error("nccl: cannot use device %d: %s", c->ops->device, cudaGetErrorString(ce));
		return RL_EDEVICE;
	}
	cfg.blocking = 0;
	r = ncclCommInitRankConfig(&c->nc, c->world, id, c->rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress) {
		rl_error("nccl: cannot create the communicator: %s", ncclGetErrorString(r));
		return RL_EDEVICE;
	}
	return nccl_wait(c, "communicator set-up", 0);
}

static int
nccl_call(rl_comm *c, ncclResult_t r, const char *what)
{
	if (r != ncclSuccess && r != ncclInProgress) {
		rl_error("nccl: %s: %s", what, ncclGetErrorString(r));
		return fail(c, RL_EDEVICE, -1);
	}
	return nccl_wait(c, what, 1);
}
#endif

/* ---- open / close ------------------------------------------------------------------------ */

/* One rank: no rendezvous, no ring.  Asked for nccl by name, a one-rank NCCL
 * communicator, so that one GPU exercises the NCCL path (test_comm_cuda);
 * "auto" stays single. */
static int
open_single(rl_comm *c, const rl_comm_opts *o)
{
	c->backend = B_SINGLE;
#if HAVE_NCCL
	if (o->backend && strcmp(o->backend, "nccl") == 0) {
		rdv_table_hdr th;
		ncclUniqueId id;
		ncclResult_t r;
		if (!c->ops || c->ops->device < 0) {
			rl_error("the nccl backend needs a CUDA device (--device cuda)");
			return RL_EINVAL;
		}
		if ((r = ncclGetUniqueId(&id)) != ncclSuccess) {
			rl_error("nccl: cannot create a unique id: %s", ncclGetErrorString(r));
			return RL_EDEVICE;
		}
		memset(&th, 0, sizeof th);
		memcpy(th.nccl_id, &id, sizeof id);
		c->backend = B_NCCL;
		return nccl_open(c, &th);
	}
#else
	(void)o;
#endif
	return RL_OK;
}

/* The backend of a world of several ranks: o->backend, or for "auto" NCCL
 * when there is a device and the build has it, else the CPU ring. */
static int
pick_backend(rl_comm *c, const rl_comm_opts *o)
{
	const char *b = o->backend ? o->backend : "auto";
	int device = c->ops && c->ops->device >= 0;

	if (strcmp(b, "cpu") == 0) {
		c->backend = B_CPU;
	} else if (strcmp(b, "nccl") == 0 || (strcmp(b, "auto") == 0 && device && HAVE_NCCL)) {
		if (!HAVE_NCCL) {
			rl_error("the nccl backend is not in this build (no NCCL found at build time)");
			return RL_ENOTSUP;
		}
		if (!device) {
			rl_error("the nccl backend needs a CUDA device (--device cuda)");
			return RL_EINVAL;
		}
		c->backend = B_NCCL;
	} else if (strcmp(b, "auto") == 0) {
		c->backend = B_CPU;
	} else {
		rl_error("unknown communication backend '%s' (auto, cpu, nccl)", b);
		return RL_EINVAL;
	}
	return RL_OK;
}

/* RL_COMM_SHM: unset or 1, same-host edges of the CPU ring through shared
 * memory; 0, every edge on TCP. */
static int
shm_setting(rl_comm *c)
{
	const char *e = getenv("RL_COMM_SHM");

	if (e && *e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0) {
		rl_error("RL_COMM_SHM='%s' is not 0 or 1", e);
		rl_hint("RL_COMM_SHM=0 keeps the ring on TCP; 1 (the default) uses shared memory between ranks on one host");
		return RL_EINVAL;
	}
	c->shm_on = !(e && strcmp(e, "0") == 0);
	return RL_OK;
}

/* The ring's sockets and this rank's listener (on an ephemeral port, set in
 * *port, so that the port can go into the rendezvous hello). */
static int
ring_listen(rl_comm *c, const char *ip, int *port)
{
	char lurl[128];
	nng_sockaddr sa;
	int e;

	if ((e = nng_pair0_open(&c->prev)) != 0 || (e = nng_pair0_open(&c->next)) != 0) {
		rl_error("cannot open a socket: %s", nng_strerror(e));
		return RL_ENET;
	}
	c->have_prev = c->have_next = 1;
	nng_pipe_notify(c->prev, NNG_PIPE_EV_REM_POST, on_prev_pipe, c->pw);
	nng_pipe_notify(c->next, NNG_PIPE_EV_ADD_POST, on_next_pipe, c->pw);
	nng_pipe_notify(c->next, NNG_PIPE_EV_REM_POST, on_next_pipe, c->pw);
	nng_socket_set_ms(c->prev, NNG_OPT_RECVTIMEO, SLICE_MS);
	nng_socket_set_ms(c->next, NNG_OPT_SENDTIMEO, SLICE_MS);
	nng_socket_set_size(c->prev, NNG_OPT_RECVMAXSZ, c->seg + HDR + 64);
	nng_socket_set_int(c->prev, NNG_OPT_RECVBUF, 4);
	nng_socket_set_int(c->next, NNG_OPT_SENDBUF, 4);
	nng_socket_set_ms(c->next, NNG_OPT_RECONNMINT, 50);
	nng_socket_set_ms(c->next, NNG_OPT_RECONNMAXT, 1000);
	snprintf(lurl, sizeof lurl, "tcp://%s:0", is_loopback(ip) ? "127.0.0.1" : "0.0.0.0");
	if ((e = nng_listener_create(&c->lst, c->prev, lurl)) != 0 || (e = nng_listener_start(c->lst, 0)) != 0) {
		rl_error("cannot listen on %s: %s", lurl, nng_strerror(e));
		return RL_ENET;
	}
	if ((e = nng_listener_get_addr(c->lst, NNG_OPT_LOCADDR, &sa)) != 0 || sa.s_family != NNG_AF_INET) {
		rl_error("cannot read the ring listener's port: %s", nng_strerror(e));
		return RL_ENET;
	}
	*port = ntohs(sa.s_in.sa_port);
	return RL_OK;
}

/* Accepts the previous rank's shared-memory offer (len bytes of hello
 * payload) when this rank takes them; a refusal is no error (TCP stays). */
static void
shm_accept(rl_comm *c, const uint8_t *p, size_t len)
{
	rli_shm_offer of;
	char why[160];

	if (!c->shm_on || len != sizeof of)
		return;
	memcpy(&of, p, sizeof of);
	of.host[sizeof of.host - 1] = 0;
	of.boot_id[sizeof of.boot_id - 1] = 0;
	if (rli_shm_chan_attach(&c->shm_in, &of, c->seg, why) != 0)
		rl_verbose("ring edge from rank %d stays on TCP: %s", prev_of(c), why);
}

/* The ring: dial the next rank, say hello (with a shared-memory offer when
 * RL_COMM_SHM allows), hear the previous one's hello (its pipe is the one to
 * watch for a lost neighbour). */
static int
ring_connect(rl_comm *c, const rdv_entry *tab)
{
	int nx = next_of(c), e, rv;
	rli_shm_offer of;
	nng_msg *m;
	double t0;

	if ((e = nng_dial(c->next, tab[nx].addr, NULL, 0)) != 0) {
		rl_error("cannot connect to rank %d at %s: %s", nx, tab[nx].addr, nng_strerror(e));
		return fail(c, RL_ENET, nx);
	}
	memset(&of, 0, sizeof of);
	if (c->shm_on && c->backend == B_CPU && rli_shm_chan_create(&c->shm_out, c->seg, SHM_SLOTS, &of) != 0)
		rl_verbose("ring edge to rank %d stays on TCP: no shared memory", nx);
	if ((rv = send_seg(c, K_HELLO, OP_NONE, 0, &of, c->shm_out ? sizeof of : 0)) != 0)
		return rv;
	t0 = rl_now();
	for (;;) {
		if ((e = nng_recvmsg(c->prev, &m, 0)) == 0)
			break;
		if (e != NNG_ETIMEDOUT || rl_now() - t0 > c->timeout) {
			rl_error("no hello from rank %d within %g s: %s", prev_of(c), c->timeout, nng_strerror(e));
			return fail(c, RL_ETIMEDOUT, prev_of(c));
		}
		if ((rv = lost_check(c, "set-up", 3)) != 0)
			return rv;
	}
	atomic_store(&c->pw->prev_pipe, (uint32_t)nng_pipe_id(nng_msg_get_pipe(m)));
	uint8_t *h = nng_msg_body(m);
	size_t len = nng_msg_len(m);
	uint16_t from = 0xffff;
	if (len >= HDR)
		memcpy(&from, h + 6, 2);
	if ((len != HDR && len != HDR + sizeof of) || h[4] != K_HELLO || from != prev_of(c)) {
		nng_msg_free(m);
		rl_error("a stranger connected to this rank's ring port (expected rank %d's hello)", prev_of(c));
		return fail(c, RL_EFORMAT, -1);
	}
	shm_accept(c, h + HDR, len - HDR);
	nng_msg_free(m);
	return RL_OK;
}

/* Ends the set-up with a barrier that also settles each edge's transport:
 * every rank says whether it mapped its previous rank's channel, and an
 * edge uses shared memory only when both of its ends do. */
static int
ring_settle(rl_comm *c)
{
	uint8_t mine = (uint8_t)(1 | (c->shm_in ? 2 : 0)), *all;
	int rv;

	if (!(all = malloc((size_t)c->world)))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(c, all, &mine, 1)) == 0) {
		if (c->shm_out && !(all[next_of(c)] & 2)) {
			rli_shm_chan_close(c->shm_out);
			c->shm_out = NULL;
		}
		rli_shm_chan_drop_fd(c->shm_out);
	}
	free(all);
	return rv;
}

int
rl_comm_open(rl_comm **out, const rl_comm_opts *o, rl_ops *ops)
{
	rl_comm *c;
	char ip[64], url[128];
	int port = 0, rv = RL_OK;
	rdv_entry *tab = NULL;
	rdv_table_hdr th;
	nng_socket rdv = NNG_SOCKET_INITIALIZER;

	*out = NULL;
	if (o->world < 1 || o->rank < 0 || o->rank >= o->world) {
		rl_error("rank %d of world %d: the launch configuration is incomplete", o->rank, o->world);
		return RL_EINVAL;
	}
	if (!(c = calloc(1, sizeof *c)))
		return RL_ENOMEM;
	if (!(c->pw = calloc(1, sizeof *c->pw))) {
		free(c);
		return RL_ENOMEM;
	}
	c->rank = o->rank;
	c->world = o->world;
	c->local_rank = o->local_rank < 0 ? 0 : o->local_rank;
	c->timeout = o->timeout > 0 ? o->timeout : 600;
	c->addr_opts = o->addr_opts ? o->addr_opts : "MASTER_ADDR/MASTER_PORT or --rendezvous";
	c->world_opts = o->world_opts ? o->world_opts : "WORLD_SIZE or --world";
	c->timeout_opts = o->timeout_opts ? o->timeout_opts : "RL_COMM_TIMEOUT or --comm-timeout";
	c->seg = o->seg_bytes ? o->seg_bytes : (size_t)1 << 20;
	c->seg &= ~(size_t)3; /* whole floats per segment */
	if (c->seg == 0)
		c->seg = 4;
	c->ops = ops;
	if (c->world == 1) {
		if ((rv = open_single(c, o)) != 0) {
			if (c->backend == B_NCCL) {
				rl_comm_close(c);
			} else {
				free(c->pw);
				free(c);
			}
			return rv;
		}
		*out = c;
		return RL_OK;
	}

	if ((rv = pick_backend(c, o)) != 0 || (rv = shm_setting(c)) != 0)
		goto out;
	if (!o->master) {
		rl_error("world size %d but no rendezvous address", c->world);
		rv = RL_EINVAL;
		goto out;
	}
	if ((rv = resolve(o->master, c->addr_opts, ip, &port)) != 0)
		goto out;
	snprintf(url, sizeof url, "tcp://%s:%d", ip, port);
	if ((rv = ring_listen(c, ip, &port)) != 0)
		goto out;

	if (!(tab = calloc((size_t)c->world, sizeof *tab))) {
		rv = RL_ENOMEM;
		goto out;
	}
	memset(&th, 0, sizeof th);
	th.magic = MAGIC;
	th.version = RDV_VERSION;
	th.world = c->world;
	th.backend = c->backend;
	if (c->rank == 0) {
#if HAVE_NCCL
		if (c->backend == B_NCCL) {
			ncclUniqueId id;
			ncclResult_t r = ncclGetUniqueId(&id);
			if (r != ncclSuccess) {
				rl_error("nccl: cannot create a unique id: %s", ncclGetErrorString(r));
				rv = RL_EDEVICE;
				goto out;
			}
			memcpy(th.nccl_id, &id, sizeof id);
		}
#endif
		snprintf(tab[0].addr, sizeof tab[0].addr, "tcp://%s:%d", ip, port);
		gethostname(tab[0].host, sizeof tab[0].host - 1);
		tab[0].local_rank = c->local_rank;
		rv = rdv_serve(c, url, tab, &th, &rdv);
	} else {
		rv = rdv_join(c, url, port, c->backend, tab, &th, &rdv);
	}
	if (rv != 0 || (rv = ring_connect(c, tab)) != 0)
		goto out;
#if HAVE_NCCL
	if (c->backend == B_NCCL && (rv = nccl_open(c, &th)) != 0)
		goto out;
#endif
	/* everyone has the table once this passes: rank 0 may close the rendezvous */
	if ((rv = ring_settle(c)) != 0)
		goto out;
	rl_verbose("rank %d of %d (%s backend) ring: %s -> %s; edge from rank %d over %s, to rank %d over %s",
	    c->rank, c->world, c->backend == B_NCCL ? "nccl" : "cpu", tab[c->rank].addr, tab[next_of(c)].addr,
	    prev_of(c), rl_comm_transport(c, 0), next_of(c), rl_comm_transport(c, 1));
out:
	if (nng_socket_id(rdv) > 0)
		rli_nng_close_timed(rdv, "rendezvous socket");
	free(tab);
	if (rv != 0) {
		if (!c->failed)
			c->failed = rv;
		rl_comm_close(c);
		return rv;
	}
	*out = c;
	return RL_OK;
}

int
rl_comm_finish(rl_comm *c)
{
	int rv;
	nng_msg *m;

	if (!c || c->world == 1)
		return RL_OK;
	if ((rv = rl_comm_barrier(c)) != 0)
		return rv;
	/* A goodbye round the ring.  The last message a socket sends may still
	 * be queued when it closes, so: once a rank has the goodbye of the rank
	 * before it, it closes that side (nothing more will come), and it keeps
	 * its sending side open until the next rank has closed too, i.e. has
	 * received everything. */
	if ((rv = send_seg(c, K_BYE, OP_NONE, 0, NULL, 0)) != 0)
		return rv;
	if ((rv = recv_seg(c, &m, K_BYE, OP_NONE, 0, 0)) != 0)
		return rv;
	nng_msg_free(m);
	c->finished = 1;
	if (!rli_nng_close_timed(c->prev, "ring socket"))
		c->close_left = 1;
	c->have_prev = 0;
	for (double t0 = rl_now(); !atomic_load(&c->pw->next_lost) && rl_now() - t0 < c->timeout;)
		usleep(2000);
	return RL_OK;
}

void
rl_comm_set_timeout(rl_comm *c, double seconds)
{
	if (c)
		c->timeout = seconds > 0 ? seconds : 1e18;
}

void
rl_comm_close(rl_comm *c)
{
	if (!c)
		return;
	/* leaving without rl_comm_finish is a failure of this rank: say so */
	if (c->world > 1 && !c->finished && !c->failed)
		send_abort(c, c->rank);
#if HAVE_NCCL
	if (c->nc) {
		if (c->failed)
			ncclCommAbort(c->nc);
		else
			ncclCommDestroy(c->nc);
	}
	if (c->stream)
		cudaStreamDestroy(c->stream);
#endif
	if (c->have_next && !rli_nng_close_timed(c->next, "ring socket"))
		c->close_left = 1;
	if (c->have_prev && !rli_nng_close_timed(c->prev, "ring socket"))
		c->close_left = 1;
	if (c->pending)
		nng_msg_free(c->pending);
	rli_shm_chan_close(c->shm_out);
	rli_shm_chan_close(c->shm_in);
	/* a close still under way in nng may yet call on_prev_pipe/on_next_pipe
	 * with c->pw: leave those 16 bytes to it */
	if (!c->close_left)
		free(c->pw);
	free(c->stage);
	free(c);
}

int rl_comm_rank(const rl_comm *c) { return c ? c->rank : 0; }
int rl_comm_world(const rl_comm *c) { return c ? c->world : 1; }
int rl_comm_local_rank(const rl_comm *c) { return c ? c->local_rank : 0; }

const char *
rl_comm_backend(const rl_comm *c)
{
	if (!c || c->backend == B_SINGLE)
		return "single";
	return c->backend == B_NCCL ? "nccl" : "cpu";
}

const char *
rl_comm_transport(const rl_comm *c, int to_next)
{
	if (!c || c->backend == B_SINGLE)
		return "none";
	if (c->backend == B_NCCL)
		return "nccl";
	return (to_next ? c->shm_out : c->shm_in) ? "shm" : "tcp";
}

/* ---- collectives ----------------------------------------------------------------------- */

/* The cpu backend with a device rl_ops stages through this host buffer. */
static int
stage_reserve(rl_comm *c, size_t n)
{
	if (c->stage_n >= n)
		return RL_OK;
	float *p = rl_try_malloc(n * sizeof(float), "communication staging buffer");
	if (!p)
		return RL_ENOMEM;
	free(c->stage);
	c->stage = p;
	c->stage_n = n;
	return RL_OK;
}

static int
on_device(const rl_comm *c)
{
	return c->ops && c->ops->device >= 0;
}

int
rl_comm_allreduce(rl_comm *c, float *buf, size_t n)
{
	int rv;

	if (c->backend == B_SINGLE)
		return RL_OK;
	if ((rv = ring_check(c)) != 0)
		return rv;
#if HAVE_NCCL
	if (c->backend == B_NCCL) {
		c->seq++;
		if ((rv = c->ops->sync(c->ops)) != 0)
			return fail(c, rv, -1);
		return nccl_call(c, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->nc, c->stream), "all-reduce");
	}
#endif
	if (!on_device(c))
		return ring_allreduce(c, buf, n);
	/* device memory through the host, in pieces of at most 16 Mi floats */
	size_t piece = RL_MIN(n, (size_t)16 << 20);
	if ((rv = stage_reserve(c, piece ? piece : 1)) != 0)
		return rv;
	for (size_t off = 0; off < n || (n == 0 && off == 0); off += piece) {
		size_t k = RL_MIN(piece, n - off);
		c->ops->download(c->ops, c->stage, buf + off, k * sizeof(float));
		if ((rv = c->ops->status(c->ops)) != 0 || (rv = ring_allreduce(c, c->stage, k)) != 0)
			return rv;
		c->ops->upload(c->ops, buf + off, c->stage, k * sizeof(float));
		if ((rv = c->ops->status(c->ops)) != 0)
			return rv;
		if (n == 0)
			break;
	}
	return RL_OK;
}

void
rl_comm_interrupt(rl_comm *c)
{
	if (c)
		atomic_store(&c->interrupted, 1);
}

int
rl_comm_broadcast(rl_comm *c, void *buf, size_t bytes, int root)
{
	int rv;

	if (root < 0 || root >= c->world) {
		rl_error("broadcast from rank %d in a world of %d", root, c->world);
		return RL_EINVAL;
	}
	if (c->backend == B_SINGLE)
		return RL_OK;
	if ((rv = ring_check(c)) != 0)
		return rv;
#if HAVE_NCCL
	if (c->backend == B_NCCL) {
		c->seq++;
		if ((rv = c->ops->sync(c->ops)) != 0)
			return fail(c, rv, -1);
		return nccl_call(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->nc, c->stream), "broadcast");
	}
#endif
	if (!on_device(c))
		return ring_broadcast(c, buf, bytes, root, 1);
	size_t piece = RL_MIN(bytes, (size_t)64 << 20);
	if ((rv = stage_reserve(c, piece / sizeof(float) + 1)) != 0)
		return rv;
	for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += piece) {
		size_t k = RL_MIN(piece, bytes - off);
		if (c->rank == root) {
			c->ops->download(c->ops, c->stage, (uint8_t *)buf + off, k);
			if ((rv = c->ops->status(c->ops)) != 0)
				return rv;
		}
		if ((rv = ring_broadcast(c, (uint8_t *)c->stage, k, root, 1)) != 0)
			return rv;
		if (c->rank != root) {
			c->ops->upload(c->ops, (uint8_t *)buf + off, c->stage, k);
			if ((rv = c->ops->status(c->ops)) != 0)
				return rv;
		}
		if (bytes == 0)
			break;
	}
	return RL_OK;
}

void
rl_comm_shard(const rl_comm *c, size_t n, int rank, size_t *lo, size_t *hi)
{
	int N = c ? c->world : 1;
	*lo = chunk_lo(n, rank, N);
	*hi = chunk_lo(n, rank + 1, N);
}

/* kind 0: reduce-scatter, 1: all-gather of shards */
static int
shard_collective(rl_comm *c, float *buf, size_t n, int kind)
{
	int rv;

	if (c->backend == B_SINGLE)
		return RL_OK;
	if ((rv = ring_check(c)) != 0)
		return rv;
#if HAVE_NCCL
	if (c->backend == B_NCCL) {
		size_t k = n / (size_t)c->world;
		if (k * (size_t)c->world != n) {
			rl_error("nccl: %zu elements do not split evenly over %d ranks", n, c->world);
			return RL_ENOTSUP;
		}
		c->seq++;
		if ((rv = c->ops->sync(c->ops)) != 0)
			return fail(c, rv, -1);
		if (kind == 0)
			return nccl_call(c, ncclReduceScatter(buf, buf + k * (size_t)c->rank, k, ncclFloat32, ncclSum,
			    c->nc, c->stream), "reduce-scatter");
		return nccl_call(c, ncclAllGather(buf + k * (size_t)c->rank, buf, k, ncclFloat32, c->nc, c->stream),
		    "all-gather");
	}
#endif
	if (!on_device(c))
		return kind == 0 ? ring_reduce_scatter(c, buf, n, 0, n) : ring_allgather_chunks(c, buf, n);
	/* device memory: the whole buffer through the host */
	if ((rv = stage_reserve(c, n ? n : 1)) != 0)
		return rv;
	c->ops->download(c->ops, c->stage, buf, n * sizeof(float));
	if ((rv = c->ops->status(c->ops)) != 0)
		return rv;
	rv = kind == 0 ? ring_reduce_scatter(c, c->stage, n, 0, n) : ring_allgather_chunks(c, c->stage, n);
	if (rv != 0)
		return rv;
	c->ops->upload(c->ops, buf, c->stage, n * sizeof(float));
	return c->ops->status(c->ops);
}

int
rl_comm_reduce_scatter(rl_comm *c, float *buf, size_t n)
{
	return shard_collective(c, buf, n, 0);
}

int
rl_comm_reduce_scatter_range(rl_comm *c, float *buf, size_t n, size_t lo, size_t hi)
{
	int rv;

	if (lo > hi || hi > n) {
		rl_error("reduce-scatter of elements [%zu, %zu) of a buffer of %zu", lo, hi, n);
		return RL_EINVAL;
	}
	if (c->backend == B_SINGLE)
		return RL_OK;
	if (c->backend != B_CPU || on_device(c)) {
		rl_error("the reduce-scatter of a part of a buffer runs on the CPU ring over host memory only");
		return RL_ENOTSUP;
	}
	if ((rv = ring_check(c)) != 0)
		return rv;
	return ring_reduce_scatter(c, buf, n, lo, hi);
}

int
rl_comm_allgather_shards(rl_comm *c, float *buf, size_t n)
{
	return shard_collective(c, buf, n, 1);
}

int
rl_comm_host_allgather(rl_comm *c, void *out, const void *in, size_t bytes)
{
	int rv;

	if (c->world == 1) {
		memmove(out, in, bytes);
		return RL_OK;
	}
	if ((rv = ring_check(c)) != 0)
		return rv;
	return ring_allgather(c, out, in, bytes);
}

int
rl_comm_host_broadcast(rl_comm *c, void *buf, size_t bytes, int root)
{
	int rv;

	if (root < 0 || root >= c->world) {
		rl_error("broadcast from rank %d in a world of %d", root, c->world);
		return RL_EINVAL;
	}
	if (c->world == 1)
		return RL_OK;
	if ((rv = ring_check(c)) != 0)
		return rv;
	return ring_broadcast(c, buf, bytes, root, 0);
}

int
rl_comm_barrier(rl_comm *c)
{
	uint8_t one = 1, *all;
	int rv;

	if (c->world == 1)
		return RL_OK;
	if (!(all = malloc((size_t)c->world)))
		return RL_ENOMEM;
	rv = rl_comm_host_allgather(c, all, &one, 1);
	free(all);
	return rv;
}

int
rl_comm_host_allreduce_f64(rl_comm *c, double *buf, size_t n)
{
	double *all;
	int rv;

	if (c->world == 1 || n == 0)
		return RL_OK;
	if (!(all = rl_try_malloc((size_t)c->world * n * sizeof(double), "all-reduce buffer")))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(c, all, buf, n * sizeof(double))) == 0) {
		for (size_t i = 0; i < n; i++) {
			double s = 0;
			for (int r = 0; r < c->world; r++)
				s += all[(size_t)r * n + i];
			buf[i] = s;
		}
	}
	free(all);
	return rv;
}

/* ---- bucketed all-reduce overlapped with compute ------------------------------------------ */

enum { R_SYNC = 0, R_THREAD, R_STREAM };

struct rl_comm_reducer {
	rl_comm *c;
	float *buf;
	size_t n, bucket;
	int mode;
	int nb;                 /* buckets */
	int queued;             /* buckets declared final this round (a prefix, in bucket order) */
	int done;               /* buckets reduced this round */
	int err;                /* first error of the round */
	int pre;                /* buckets declared final while part of buf was not (from > 0) */
	int early;              /* pre of the last round */
	int quit, have_thread;
	int scatter;            /* reduce-scatter to the shards of buf (rl_comm_reducer_scatter) */
	void (*done_fn)(void *ctx, size_t lo, size_t hi);
	void *done_ctx;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

/* Bucket k: [n - (k+1) B, n - k B), clipped at 0. */
static void
bucket_range(const rl_comm_reducer *r, int k, size_t *lo, size_t *hi)
{
	size_t top = (size_t)k * r->bucket;
	*hi = r->n - top;
	*lo = r->n - top > r->bucket ? r->n - top - r->bucket : 0;
}

static void *
reducer_main(void *arg)
{
	rl_comm_reducer *r = arg;

	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (!r->quit && r->done == r->queued)
			pthread_cond_wait(&r->cv, &r->mu);
		if (r->done == r->queued)
			break; /* quit, nothing pending */
		int k = r->done, rv = r->err;
		pthread_mutex_unlock(&r->mu);
		if (rv == 0) {
			size_t lo, hi;
			bucket_range(r, k, &lo, &hi);
			rv = r->c->failed ? ring_check(r->c) : r->scatter ? ring_reduce_scatter(r->c, r->buf, r->n, lo,
			    hi) : ring_allreduce(r->c, r->buf + lo, hi - lo);
			if (rv == 0 && r->done_fn)
				r->done_fn(r->done_ctx, lo, hi);
		}
		pthread_mutex_lock(&r->mu);
		if (rv && !r->err)
			r->err = rv;
		r->done++;
		pthread_cond_broadcast(&r->cv);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int
rl_comm_reducer_create(rl_comm_reducer **out, rl_comm *c, float *buf, size_t n, size_t bucket, int overlap)
{
	rl_comm_reducer *r;

	*out = NULL;
	if (!(r = calloc(1, sizeof *r)))
		return RL_ENOMEM;
	r->c = c;
	r->buf = buf;
	r->n = n;
	r->bucket = bucket ? bucket : (n ? n : 1);
	r->nb = n ? (int)RL_MIN((n + r->bucket - 1) / r->bucket, (size_t)INT32_MAX) : 0;
	if (n && (size_t)r->nb * r->bucket < n)
		r->bucket = (n + (size_t)r->nb - 1) / (size_t)r->nb;
	r->mode = R_SYNC;
	if (overlap && c->world > 1) {
#if HAVE_NCCL
		if (c->backend == B_NCCL)
			r->mode = R_STREAM;
		else
#endif
		if (!on_device(c))
			r->mode = R_THREAD;
	}
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	if (r->mode == R_THREAD) {
		if (pthread_create(&r->th, NULL, reducer_main, r) != 0) {
			rl_warn("cannot start the communication thread: the all-reduce will not overlap");
			r->mode = R_SYNC;
		} else {
			r->have_thread = 1;
		}
	}
	*out = r;
	return RL_OK;
}

int
rl_comm_reducer_scatter(rl_comm_reducer *r, void (*done)(void *ctx, size_t lo, size_t hi), void *ctx)
{
	if (r->mode == R_STREAM || (r->c->backend != B_SINGLE && (r->c->backend != B_CPU || on_device(r->c)))) {
		rl_error("the bucketed reduce-scatter runs on the CPU ring over host memory only");
		return RL_ENOTSUP;
	}
	r->scatter = 1;
	r->done_fn = done;
	r->done_ctx = ctx;
	return RL_OK;
}

int
rl_comm_reducer_early(const rl_comm_reducer *r, int *total)
{
	if (total)
		*total = r ? r->nb : 0;
	return r && r->mode != R_SYNC ? r->early : 0;
}

int
rl_comm_reducer_overlaps(const rl_comm_reducer *r)
{
	return r && r->mode != R_SYNC;
}

#if HAVE_NCCL
/* Queues buckets [r->done, upto) on the NCCL stream, after the compute queued so far. */
static int
reducer_stream_queue(rl_comm_reducer *r, int upto)
{
	rl_comm *c = r->c;
	int rv;

	if (r->done >= upto)
		return RL_OK;
	if ((rv = c->ops->sync(c->ops)) != 0)
		return fail(c, rv, -1);
	for (; r->done < upto; r->done++) {
		size_t lo, hi;
		ncclResult_t nr;
		bucket_range(r, r->done, &lo, &hi);
		c->seq++;
		nr = ncclAllReduce(r->buf + lo, r->buf + lo, hi - lo, ncclFloat32, ncclSum, c->nc, c->stream);
		if (nr != ncclSuccess && nr != ncclInProgress) {
			rl_error("nccl: all-reduce: %s", ncclGetErrorString(nr));
			return fail(c, RL_EDEVICE, -1);
		}
		/* a non-blocking communicator may still be enqueuing: wait for that, not the stream */
		if ((rv = nccl_wait(c, "all-reduce", 0)) != 0)
			return rv;
	}
	return RL_OK;
}
#endif

int
rl_comm_reducer_ready(rl_comm_reducer *r, size_t from)
{
	int upto = 0, rv;

	/* buckets [0, upto) lie in [from, n) */
	while (upto < r->nb) {
		size_t lo, hi;
		bucket_range(r, upto, &lo, &hi);
		if (lo < from)
			break;
		upto++;
	}
	if (from > 0)
		r->pre = RL_MAX(r->pre, upto);
	if (r->mode == R_THREAD) {
		pthread_mutex_lock(&r->mu);
		if (upto > r->queued) {
			r->queued = upto;
			pthread_cond_broadcast(&r->cv);
		}
		rv = r->err;
		pthread_mutex_unlock(&r->mu);
		return rv;
	}
#if HAVE_NCCL
	if (r->mode == R_STREAM) {
		if (!r->err && (rv = reducer_stream_queue(r, upto)) != 0)
			r->err = rv;
		return r->err;
	}
#endif
	if (upto > r->queued)
		r->queued = upto;
	return r->err;
}

/* Without a thread: reduces buckets [r->done, upto) here, in order. */
static int
reducer_sync_upto(rl_comm_reducer *r, int upto)
{
	int rv = RL_OK;

	for (; rv == 0 && r->done < upto; r->done++) {
		size_t lo, hi;
		bucket_range(r, r->done, &lo, &hi);
		rv = r->scatter ? rl_comm_reduce_scatter_range(r->c, r->buf, r->n, lo, hi) :
		    rl_comm_allreduce(r->c, r->buf + lo, hi - lo);
		if (rv == 0 && r->done_fn)
			r->done_fn(r->done_ctx, lo, hi);
	}
	return rv;
}

int
rl_comm_reducer_wait(rl_comm_reducer *r)
{
	int rv;

	r->early = r->pre;
	r->pre = 0;
	if (r->mode == R_THREAD) {
		pthread_mutex_lock(&r->mu);
		r->queued = r->nb;
		pthread_cond_broadcast(&r->cv);
		while (r->done < r->nb)
			pthread_cond_wait(&r->cv, &r->mu);
		rv = r->err;
		r->queued = r->done = r->err = 0;
		pthread_mutex_unlock(&r->mu);
		return rv;
	}
#if HAVE_NCCL
	if (r->mode == R_STREAM) {
		if (!r->err && (rv = reducer_stream_queue(r, r->nb)) != 0)
			r->err = rv;
		if (!r->err && (rv = nccl_wait(r->c, "all-reduce", 1)) != 0)
			r->err = rv;
		rv = r->err;
		r->queued = r->done = r->err = 0;
		return rv;
	}
#endif
	rv = r->err ? r->err : reducer_sync_upto(r, r->nb);
	r->queued = r->done = r->err = 0;
	return rv;
}

int
rl_comm_reducer_drain(rl_comm_reducer *r, int keep)
{
	int rv;

	if (r->mode == R_THREAD) {
		pthread_mutex_lock(&r->mu);
		while (!r->err && r->queued - r->done > keep)
			pthread_cond_wait(&r->cv, &r->mu);
		rv = r->err;
		pthread_mutex_unlock(&r->mu);
		return rv;
	}
	if (r->mode == R_SYNC && !r->err && (rv = reducer_sync_upto(r, r->queued - keep)) != 0)
		r->err = rv;
	return r->err; /* a stream's buckets are on the device already */
}

void
rl_comm_reducer_destroy(rl_comm_reducer *r)
{
	if (!r)
		return;
	if (r->have_thread) {
		pthread_mutex_lock(&r->mu);
		r->quit = 1;
		if (!r->err)
			r->err = RL_EINTR; /* buckets not started are dropped */
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->th, NULL);
	}
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	free(r);
}

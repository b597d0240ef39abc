/*
 * wgroup.c — the weights broadcast group (see wgroup.h): the root's send,
 * whole or in element ranges, the members' receiving thread with two
 * staging buffers and the checks of a version sent in ranges, the hand-over
 * to the model between engine steps.
 * Leaves out: ranges on the nccl and ipc backends (a ZeRO-3 trainer, the
 * one sender of ranges, keeps its parameters in host memory).
 */
#include "sync/wgroup.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/comm.h"
#include "base/core.h"
#include "base/hash.h"
#include "sync/wcuda.h"

#define WG_MAGIC 0x32574c52u /* "RLW2" little-endian: a version's header */
#define WG_PIECE 0x50574c52u /* "RLWP": a range's header */
#define WG_END (-1)

/* The header of one version, and of each of its ranges, by host broadcast
 * (64 bytes).  A version's: pieces 0 when the whole table follows in one
 * broadcast, else the number of ranges that follow, each a range header
 * (piece its index, [lo, hi) its elements, sum the XXH64 of their bytes)
 * and then its elements. */
typedef struct {
	uint32_t magic, mode;  /* WG_MAGIC or WG_PIECE; WG_* of the trainer */
	int64_t version;
	uint64_t n;            /* f32 elements of the version */
	uint64_t table;        /* hash of the tensor table */
	uint32_t pieces, piece;
	uint64_t lo, hi, sum;
} wg_hdr;

enum { WG_RING, WG_NCCL, WG_IPC };

struct rl_wgroup {
	rl_model *m;
	rl_comm *c;
	int rank, world, on_device, mode;
	size_t n;             /* m->tt.total */
	uint64_t table;
	/* members */
	void *buf[2];         /* staging: device (nccl) or host */
	pthread_t th;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int ready, busy;      /* buffer with the newest untaken version / being taken; -1 none */
	int ready_ver, last_ver;
	int ended, err;       /* the root said the end / the thread's error */
	double timeout;       /* the group's timeout (resolved), for the end */
	/* root: the version being sent in ranges (rl_wgroup_send_begin) */
	int sending, s_ver;
	uint32_t s_pieces, s_sent;
	size_t s_hi;          /* where the next range starts */
};

/* FNV-1a over the names, offsets and sizes of the tensor table: two models
 * with the same table lay their parameters out the same way. */
static uint64_t
table_hash(const rl_model *m)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		uint64_t v[2] = { (uint64_t)t->off, (uint64_t)t->n };
		for (const char *p = t->name; *p; p++)
			h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
		for (size_t k = 0; k < sizeof v; k++)
			h = (h ^ ((const uint8_t *)v)[k]) * 0x100000001b3ULL;
	}
	return h ^ (uint64_t)m->tt.total;
}

/* 1 when HOST:PORT names this host's loopback (every rank is on this host) */
static int
loopback(const char *addr)
{
	return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "localhost:", 10) == 0 || strncmp(addr, "[::1]", 5) == 0;
}

/* Member: the ranges of the version h announces, into buf.  They must come
 * in table order, each starting where the one before ended, the last at
 * the table's end, each with the bytes its checksum says; anything else
 * refuses the version: its buffer is never marked ready, so the version
 * taken before (and one complete and not yet taken) stays, and the group
 * ends with the error, the stream being out of step past it. */
static int
recv_ranges(rl_wgroup *g, const wg_hdr *h, float *buf)
{
	long long v = (long long)h->version;
	uint64_t next = 0;
	int rv;

	if (g->mode != WG_RING) {
		rl_error("weights group: version %lld comes in ranges, which only the cpu backend carries", v);
		return RL_EFORMAT;
	}
	for (uint32_t i = 0; i < h->pieces; i++) {
		wg_hdr p;
		if ((rv = rl_comm_host_broadcast(g->c, &p, sizeof p, 0)) != 0)
			return rv;
		if (p.magic != WG_PIECE || p.version != h->version) {
			rl_error("weights group: version %lld refused: range %u of %u missing (%s came instead)", v, i + 1,
			    h->pieces, p.magic != WG_MAGIC ? "a malformed header" : p.version == WG_END ?
			    "the end of the group" : "the next version");
			return RL_EFORMAT;
		}
		if (p.piece != i || p.lo != next || p.hi <= p.lo || p.hi > g->n) {
			rl_error("weights group: version %lld refused: range %u of %u has elements [%llu, %llu) where "
			    "range %u of %u starting at element %llu was due (ranges in table order, none missing, "
			    "within the %zu elements)", v, p.piece + 1, h->pieces, (unsigned long long)p.lo,
			    (unsigned long long)p.hi, i + 1, h->pieces, (unsigned long long)next, g->n);
			return RL_EFORMAT;
		}
		if ((rv = rl_comm_broadcast(g->c, buf + p.lo, (p.hi - p.lo) * sizeof(float), 0)) != 0)
			return rv;
		if (rl_hash64(buf + p.lo, (p.hi - p.lo) * sizeof(float), 0) != p.sum) {
			rl_error("weights group: version %lld refused: range %u of %u (elements [%llu, %llu)) does not "
			    "match its checksum", v, i + 1, h->pieces, (unsigned long long)p.lo, (unsigned long long)p.hi);
			return RL_EFORMAT;
		}
		next = p.hi;
	}
	if (next != g->n) {
		rl_error("weights group: version %lld refused: its %u ranges end at element %llu of %zu", v, h->pieces,
		    (unsigned long long)next, g->n);
		return RL_EFORMAT;
	}
	return RL_OK;
}

static void *
recv_thread(void *arg)
{
	rl_wgroup *g = arg;
	int rv = RL_OK;

	for (;;) {
		wg_hdr h;
		int k;
		if ((rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0)) != 0)
			break;
		if (h.magic != WG_MAGIC) {
			rl_error("weights group: a malformed version header from the trainer");
			rv = RL_EFORMAT;
			break;
		}
		if (h.version == WG_END) {
			/* the orderly end, at once: the trainer need not wait for this
			 * worker's own end (it goes on with the weights it has) */
			rl_comm_set_timeout(g->c, g->timeout);
			rv = rl_comm_finish(g->c);
			pthread_mutex_lock(&g->mu);
			g->ended = 1;
			g->err = rv;
			pthread_cond_broadcast(&g->cv);
			pthread_mutex_unlock(&g->mu);
			return NULL;
		}
		if (h.mode != (uint32_t)g->mode) {
			static const char *names[] = { "cpu", "nccl", "ipc" };
			rl_error("weights group: the trainer uses the %s backend, this worker %s",
			    h.mode < 3 ? names[h.mode] : "?", names[g->mode]);
			rl_hint("give every rank the same --weights-group-backend");
			rv = RL_EINVAL;
			break;
		}
		if (h.n != g->n || h.table != g->table) {
			rl_error("weights group: the trainer's model has %llu parameters (tensor table %016llx), "
			    "this one %zu (%016llx): not the same architecture", (unsigned long long)h.n,
			    (unsigned long long)h.table, g->n, (unsigned long long)g->table);
			rv = RL_ESHAPE;
			break;
		}
		/* a buffer neither waiting to be taken nor being taken */
		pthread_mutex_lock(&g->mu);
		for (;;) {
			for (k = 0; k < 2; k++)
				if (k != g->busy && k != g->ready)
					break;
			if (k < 2)
				break;
			if (g->busy < 0) { /* both hold versions: the older one goes */
				k = g->ready;
				g->ready = -1;
				break;
			}
			pthread_cond_wait(&g->cv, &g->mu);
		}
		pthread_mutex_unlock(&g->mu);
		if (g->mode == WG_IPC) {
			/* the trainer's parameters, exported: copied device to device, then
			 * the barrier tells the trainer it may change them again */
			rl_wcuda_handle wh;
			if ((rv = rl_comm_host_broadcast(g->c, &wh, sizeof wh, 0)) != 0 ||
			    (rv = rl_wcuda_import_copy(g->buf[k], g->n * sizeof(float), &wh, g->m->ops->device)) != 0 ||
			    (rv = rl_comm_barrier(g->c)) != 0)
				break;
		} else if (h.pieces > 0) {
			if ((rv = recv_ranges(g, &h, g->buf[k])) != 0)
				break;
		} else if ((rv = rl_comm_broadcast(g->c, g->buf[k], g->n * sizeof(float), 0)) != 0) {
			break;
		}
		/* what the member holds, comparable across runs and ways of sending
		 * (a pass over the version: only when asked for) */
		if (rl_log_level() >= 2 && !g->on_device)
			rl_verbose("weights group: version %lld received, %zu elements in %u range%s, xxh64 %016llx",
			    (long long)h.version, g->n, h.pieces ? h.pieces : 1, h.pieces > 1 ? "s" : "",
			    (unsigned long long)rl_hash64(g->buf[k], g->n * sizeof(float), 0));
		pthread_mutex_lock(&g->mu);
		g->ready = k;
		g->ready_ver = (int)h.version;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
	}
	pthread_mutex_lock(&g->mu);
	g->err = rv ? rv : RL_EIO;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

int
rl_wgroup_open(rl_wgroup **out, const rl_wgroup_opts *o, rl_model *m)
{
	rl_comm_opts co;
	rl_wgroup *g;
	const char *be = o->backend ? o->backend : "auto";
	int rv;

	*out = NULL;
	if (o->world < 2 || o->rank < 0 || o->rank >= o->world || !o->addr) {
		rl_error("weights group: rank %d of %d at '%s': want a rank below a size of 2 or more and an address",
		    o->rank, o->world, o->addr ? o->addr : "");
		return RL_EINVAL;
	}
	if (!(g = calloc(1, sizeof *g)))
		return RL_ENOMEM;
	g->m = m;
	g->rank = o->rank;
	g->world = o->world;
	g->n = m->tt.total;
	g->table = table_hash(m);
	g->ready = g->busy = -1;
	g->ready_ver = g->last_ver = -1;
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	rl_comm_opts_default(&co);
	co.rank = o->rank;
	co.world = o->world;
	co.local_rank = 0;
	co.master = o->addr;
	co.backend = be;
	co.timeout = o->timeout; /* 0: RL_COMM_TIMEOUT, else 600 s (rl_comm_opts_from_env) */
	co.addr_opts = "--weights-group HOST:PORT";
	co.world_opts = "--weights-group-size";
	co.timeout_opts = o->timeout > 0 ? "--weights-timeout" : "RL_COMM_TIMEOUT";
	if ((rv = rl_comm_opts_from_env(&co)) != 0)
		goto fail;
	/* the backend this rank would get: NCCL (device buffers, staging on the
	 * device) only between models on GPUs; the ring otherwise, where members
	 * stage in host memory (a comm without ops) and the root's device
	 * parameters, if any, go through the host in the comm */
	if (strcmp(be, "ipc") == 0 || (strcmp(be, "auto") == 0 && m->ops->device >= 0 && loopback(o->addr)))
		g->mode = WG_IPC;
	else if (strcmp(be, "nccl") == 0 || (strcmp(be, "auto") == 0 && m->ops->device >= 0 && HAVE_NCCL))
		g->mode = WG_NCCL;
	else if (strcmp(be, "cpu") == 0 || strcmp(be, "auto") == 0)
		g->mode = WG_RING;
	else {
		rl_error("weights group: unknown backend '%s' (auto, cpu, nccl, ipc)", be);
		rv = RL_EINVAL;
		goto fail;
	}
	if (g->mode == WG_IPC && (!HAVE_CUDA || m->ops->device < 0)) {
		rl_error("weights group: the ipc backend needs the model on a GPU (--device cuda)");
		rv = RL_EINVAL;
		goto fail;
	}
	g->on_device = g->mode != WG_RING;
	co.backend = g->mode == WG_NCCL ? "nccl" : "cpu"; /* ipc: the ring carries handles only */
	if ((rv = rl_comm_open(&g->c, &co, g->mode == WG_NCCL || (g->rank == 0 && g->mode == WG_RING) ? m->ops :
	    NULL)) != 0)
		goto fail;
	if (g->rank > 0) {
		size_t bytes = g->n * sizeof(float);
		for (int k = 0; k < 2; k++) {
			if (g->on_device)
				rv = m->ops->alloc(m->ops, &g->buf[k], bytes);
			else if (!(g->buf[k] = rl_try_malloc(bytes, "weights staging buffer")))
				rv = RL_ENOMEM;
			if (rv != 0)
				goto fail;
		}
	}
	if (g->rank > 0) {
		/* The next version may be long in coming (a trainer waiting for
		 * its samples, a long step or save) while this member generates:
		 * that wait has no limit here; a dead trainer is still seen at once,
		 * and a member that needs a version bounds its own wait
		 * (rl_wgroup_wait), as does its end (rl_wgroup_close).  With the
		 * group's timeout on this wait, a member died in the middle of its
		 * work whenever the trainer published nothing for that long. */
		g->timeout = co.timeout > 0 ? co.timeout : 600;
		rl_comm_set_timeout(g->c, 0);
		if (pthread_create(&g->th, NULL, recv_thread, g) != 0) {
			rl_error("weights group: cannot start the receiving thread");
			rv = RL_ENOMEM;
			goto fail;
		}
		g->started = 1;
	}
	rl_verbose("weights group: rank %d of %d on %s, %s backend, %.1f MiB a version", g->rank, g->world,
	    o->addr, g->mode == WG_IPC ? "ipc" : rl_comm_backend(g->c), (double)(g->n * sizeof(float)) / 1048576.0);
	*out = g;
	return RL_OK;
fail:
	rl_wgroup_close(g, 0);
	return rv;
}

int
rl_wgroup_send(rl_wgroup *g, int version)
{
	wg_hdr h = { WG_MAGIC, (uint32_t)g->mode, version, g->n, g->table, 0, 0, 0, 0, 0 };
	int rv;

	if (g->rank != 0 || version < 0 || g->sending)
		return RL_EINVAL;
	if ((rv = g->m->ops->sync(g->m->ops)) != 0)
		return rv;
	if (g->mode == WG_IPC) {
		/* the parameters themselves, exported; unchanged until every member
		 * has copied them (the barrier) */
		rl_wcuda_src *src = NULL;
		rl_wcuda_handle wh;
		if ((rv = rl_wcuda_export(&src, &wh, g->m->params, g->n * sizeof(float), (uint64_t)version,
		    g->m->ops->device)) == 0 && (rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0)) == 0 &&
		    (rv = rl_comm_host_broadcast(g->c, &wh, sizeof wh, 0)) == 0)
			rv = rl_comm_barrier(g->c);
		rl_wcuda_src_close(src);
	} else if ((rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0)) == 0) {
		rv = rl_comm_broadcast(g->c, g->m->params, g->n * sizeof(float), 0);
	}
	if (rv != 0) {
		rl_error("weights group: version %d did not reach every member", version);
		return rv;
	}
	g->last_ver = version;
	return RL_OK;
}

int
rl_wgroup_send_begin(rl_wgroup *g, int version, int pieces)
{
	wg_hdr h = { WG_MAGIC, (uint32_t)g->mode, version, g->n, g->table, (uint32_t)pieces, 0, 0, 0, 0 };
	int rv;

	if (g->rank != 0 || version < 0 || pieces < 1 || g->sending)
		return RL_EINVAL;
	if (g->mode != WG_RING || g->m->ops->device >= 0) {
		rl_error("weights group: version %d in ranges needs the cpu backend and the parameters in host memory",
		    version);
		return RL_ENOTSUP;
	}
	if ((rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0)) != 0) {
		rl_error("weights group: version %d did not reach every member", version);
		return rv;
	}
	g->sending = 1;
	g->s_ver = version;
	g->s_pieces = (uint32_t)pieces;
	g->s_sent = 0;
	g->s_hi = 0;
	return RL_OK;
}

int
rl_wgroup_send_range(rl_wgroup *g, size_t lo, size_t hi)
{
	float *p = g->m->params;
	wg_hdr h = { WG_PIECE, (uint32_t)g->mode, g->s_ver, g->n, g->table, g->s_pieces, g->s_sent, lo, hi, 0 };
	int rv;

	if (g->rank != 0 || !g->sending)
		return RL_EINVAL;
	/* what the members would refuse is not sent */
	if (lo != g->s_hi || hi <= lo || hi > g->n || g->s_sent >= g->s_pieces) {
		rl_error("weights group: version %d: range %u of %u as elements [%zu, %zu): the ranges go in table "
		    "order, from element %zu, within %zu", g->s_ver, g->s_sent + 1, g->s_pieces, lo, hi, g->s_hi, g->n);
		return RL_EINVAL;
	}
	h.sum = rl_hash64(p + lo, (hi - lo) * sizeof(float), 0);
	if ((rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0)) != 0 ||
	    (rv = rl_comm_broadcast(g->c, p + lo, (hi - lo) * sizeof(float), 0)) != 0) {
		rl_error("weights group: range %u of %u of version %d did not reach every member", g->s_sent + 1,
		    g->s_pieces, g->s_ver);
		return rv;
	}
	g->s_sent++;
	g->s_hi = hi;
	return RL_OK;
}

int
rl_wgroup_send_end(rl_wgroup *g)
{
	if (g->rank != 0 || !g->sending)
		return RL_EINVAL;
	if (g->s_sent != g->s_pieces || g->s_hi != g->n) {
		rl_error("weights group: version %d ends after %u of its %u ranges, at element %zu of %zu", g->s_ver,
		    g->s_sent, g->s_pieces, g->s_hi, g->n);
		return RL_EINVAL;
	}
	g->sending = 0;
	g->last_ver = g->s_ver;
	return RL_OK;
}

int
rl_wgroup_poll(rl_wgroup *g, int *version)
{
	int rv;

	pthread_mutex_lock(&g->mu);
	*version = g->ready >= 0 ? g->ready_ver : -1;
	rv = g->ready < 0 && g->err ? g->err : RL_OK;
	pthread_mutex_unlock(&g->mu);
	return rv;
}

int
rl_wgroup_wait(rl_wgroup *g, double timeout, int *version)
{
	struct timespec ts;
	int rv;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)timeout;
	ts.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&g->mu);
	while (g->ready < 0 && !g->err && !g->ended)
		if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) != 0)
			break;
	*version = g->ready >= 0 ? g->ready_ver : -1;
	rv = g->ready < 0 && g->err ? g->err : RL_OK;
	if (g->ready < 0 && g->ended && !rv) {
		rl_error("weights group: the trainer ended the group");
		rv = RL_ECLOSED;
	}
	pthread_mutex_unlock(&g->mu);
	return rv;
}

int
rl_wgroup_take(rl_wgroup *g, int *version)
{
	rl_ops *o = g->m->ops;
	int k, rv;

	pthread_mutex_lock(&g->mu);
	k = g->ready;
	if (k >= 0) {
		g->busy = k;
		g->ready = -1;
		*version = g->ready_ver;
	}
	pthread_mutex_unlock(&g->mu);
	if (k < 0)
		return RL_ENOENT;
	if (g->on_device)
		o->copy(o, g->m->params, g->buf[k], g->n * sizeof(float));
	else
		o->upload(o, g->m->params, g->buf[k], g->n * sizeof(float));
	rv = o->sync(o);
	pthread_mutex_lock(&g->mu);
	g->busy = -1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	if (rv == 0)
		rv = rl_model_params_changed(g->m);
	if (rv == 0)
		g->last_ver = *version;
	return rv;
}

size_t
rl_wgroup_bytes(const rl_wgroup *g)
{
	return g->n * sizeof(float);
}

int
rl_wgroup_close(rl_wgroup *g, int ok)
{
	int rv = RL_OK;

	if (g == NULL)
		return RL_OK;
	/* the end in the middle of a version's ranges would read as a range
	 * missing: the members are told this rank failed instead */
	ok = ok && !g->sending;
	if (g->rank == 0 && g->c && ok) {
		wg_hdr h = { WG_MAGIC, (uint32_t)g->mode, WG_END, g->n, g->table, 0, 0, 0, 0, 0 };
		rv = rl_comm_host_broadcast(g->c, &h, sizeof h, 0);
	}
	if (g->started) {
		if (ok) {
			/* the trainer's end, at most the group's timeout */
			struct timespec ts;
			int late = 0;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)RL_MIN(g->timeout, 1e8);
			pthread_mutex_lock(&g->mu);
			while (!g->ended && !g->err && !late)
				late = pthread_cond_timedwait(&g->cv, &g->mu, &ts) != 0;
			late = late && !g->ended && !g->err;
			pthread_mutex_unlock(&g->mu);
			if (late) {
				rl_error("weights group: the trainer did not end the group within %.0f s", g->timeout);
				rv = RL_ETIMEDOUT;
				ok = 0;
			}
		}
		if (!ok)
			rl_comm_interrupt(g->c);
		pthread_join(g->th, NULL);
		if (ok && (!g->ended || g->err)) {
			rv = g->err ? g->err : RL_EIO;
			rl_error("weights group: %s (%s)", g->ended ? "the trainer's end failed" :
			    "left before the trainer ended it", rl_strerror(rv));
		}
	}
	if (g->c) {
		if (g->rank == 0 && ok && rv == 0)
			rv = rl_comm_finish(g->c);
		rl_comm_close(g->c);
	}
	for (int k = 0; k < 2; k++)
		if (g->buf[k]) {
			if (g->on_device)
				g->m->ops->free(g->m->ops, g->buf[k]);
			else
				free(g->buf[k]);
		}
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	free(g);
	return rv;
}

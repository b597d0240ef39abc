/*
 * dp.c — what data parallelism adds to the trainer (trainer.h,
 * docs/parallel.md): one starting point for every rank (rank 0's weights
 * broadcast; with ZeRO-3 each rank's shard read from the files), the bucketed
 * gradient all-reduce overlapped with the backward pass, ZeRO-1 (each rank
 * keeps the AdamW state of its shard and saves it as its own file), ZeRO-2
 * (and its gradients: each micro-batch's reduce-scattered bucket by bucket
 * during the backward pass, summed into the shard, the full buffer's pages
 * given back), and the checks that the ranks stay in step (the same groups
 * per step, bitwise equal weights).
 * Leaves out: the communicator itself (compute/comm.h), the passing of queue
 * leases from rank 0 (feed.c), ZeRO-2 and ZeRO-3 on device memory (the
 * pages given back are host pages), ZeRO-3's prefetch of more than one unit.
 * ZeRO-3: the parameters sharded too, each unit (embedding, layer, head)
 * gathered before it is computed (the next one on a thread meanwhile, after
 * the gradient buckets the last layer handed over) into pages of the unit
 * pool and given back after, or kept for the next pass (--zero3-keep); the
 * reference model (--ref, DPO's)
 * sharded the same way, forward only (rli_z3: the model a gather serves).
 * With LoRA (--lora-rank) ZeRO-3 shards the frozen base only, table
 * elements [0, goff): the adapters after it stay whole on every rank with
 * their gradients all-reduced and their AdamW state, as without ZeRO (they
 * are small; tr->zero stays 0).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/core.h"
#include "base/hash.h"
#include "compute/comm_shm.h"
#include "model/ckpt.h"
#include "train/trainer.h"

/* Sums the gradients of every rank, in buckets of byte ranges of m->grads
 * (rl_comm_reducer): those the last backward handed over already are in
 * flight or done; the rest go now.  t_comm counts the wait, i.e. the part of
 * the all-reduce not hidden behind the backward pass. */
int
rli_dp_allreduce_grads(trainer *tr)
{
	double t0 = rl_now();
	int rv;

	if ((rv = tr->ops->sync(tr->ops)) != 0 || (rv = rli_zero3_join(tr)) != 0)
		return rv;
	double t1 = rl_now();
	tr->z3_rs = 0; /* the wait reduces every bucket left */
	rv = rl_comm_reducer_wait(tr->red);
	tr->t_rs += rl_now() - t1;
	tr->t_comm += rl_now() - t0;
	return rv;
}

int
rli_dp_grad_ready(void *ctx, size_t from)
{
	return rl_comm_reducer_ready(ctx, from);
}

/* ---- ZeRO-2: gradients sharded ---------------------------------------------------------- */

/* Zeroes p[0, n) of host memory, giving the whole pages inside back to the
 * kernel (MADV_DONTNEED: they read as zeros and take no memory until the
 * next backward writes them).  The pages at the ends may hold neighbours'
 * elements, which another thread may be writing: those are only memset. */
static void
release_host(float *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, e = (uintptr_t)(p + n), pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t ia = (a + pg - 1) / pg * pg, ie = e / pg * pg;

	if (ie <= ia || madvise((void *)ia, ie - ia, MADV_DONTNEED) != 0) {
		memset(p, 0, n * sizeof(float));
		return;
	}
	memset(p, 0, ia - a);
	memset((void *)ie, 0, e - ie);
}

/* Asks for transparent huge pages over the whole 2 MiB pages of p[0, n):
 * ZeRO-2/3 give a buffer's pages back and fault them in again many times a
 * step, and one 2 MiB fault costs about what one 4 KiB fault does.  Advice
 * only: where the kernel has none to give, 4 KiB pages as before. */
static void
huge_pages(float *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, e = (uintptr_t)(p + n), hp = (uintptr_t)2 << 20;
	uintptr_t ia = (a + hp - 1) / hp * hp, ie = e / hp * hp;

	if (getenv("RL_NO_THP"))
		return;
	if (ie > ia)
		(void)madvise((void *)ia, ie - ia, MADV_HUGEPAGE);
}

/* The bytes of [p, p + bytes) in resident pages (mincore), the pages at
 * the ends counted whole; 0 when it cannot tell. */
static double
resident_bytes(const void *p, size_t bytes)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p / pg * pg;
	size_t np = ((uintptr_t)p + bytes - a + pg - 1) / pg, k = 0;
	unsigned char *v;

	if (!p || !bytes || !(v = malloc(np)))
		return 0;
	if (mincore((void *)a, np * pg, v) == 0)
		for (size_t i = 0; i < np; i++)
			k += v[i] & 1;
	free(v);
	return (double)k * (double)pg;
}

/* Measured, not computed: the gradient memory resident now (the full
 * buffer's pages, ZeRO-2's shard); its peak this step in tr->gres_peak. */
void
rli_dp_grads_resident(trainer *tr)
{
	double b = 0;

	if (tr->m->grads && tr->ops->device < 0) {
		b = resident_bytes(tr->m->grads, (tr->m->tt.total - tr->m->goff) * sizeof(float));
		if (tr->zg)
			b += resident_bytes(tr->zg, (tr->zhi - tr->zlo) * sizeof(float));
	}
	tr->gres_peak = RL_MAX(tr->gres_peak, b);
}

/* A bucket of m->grads reduce-scattered (the reducer's thread, or its wait):
 * the own shard's sums join the shard's gradients, the bucket is cleared for
 * the next micro-batch.  Host memory (zero_open checks). */
static void
zero2_bucket_done(void *ctx, size_t lo, size_t hi)
{
	trainer *tr = ctx;
	float *g = tr->m->grads;
	size_t a = RL_MAX(lo, tr->zlo), b = RL_MIN(hi, tr->zhi);

	for (size_t i = a; i < b; i++)
		tr->zg[i - tr->zlo] += g[i];
	release_host(g + lo, hi - lo);
}

/* Buckets of ZeRO-2 handed over and not yet reduced (so still resident)
 * before the backward pass waits for the communication: a bound on the
 * gradient memory, whatever the link's speed. */
#define ZERO2_INFLIGHT 2

/* m->grad_ready of every backward with ZeRO-2 (ctx: the trainer): samples
 * the resident gradient memory at the layer boundaries (its peak is during
 * the backward pass), hands the final buckets over, and waits while more
 * than ZERO2_INFLIGHT of them are in flight. */
int
rli_zero2_grad_ready(void *ctx, size_t from)
{
	trainer *tr = ctx;
	int rv;

	rli_dp_grads_resident(tr);
	/* ZeRO-3: the ring is the prefetch's until it is done */
	if ((rv = rli_zero3_join(tr)) != 0 || (rv = rl_comm_reducer_ready(tr->red, from)) != 0)
		return rv;
	if (tr->z3p.zp && !tr->o->zero3_no_prefetch) {
		tr->z3_rs = 1; /* reduced by the next param_need: on its prefetch thread, else there */
		return RL_OK;
	}
	double t0 = rl_now();
	rv = rl_comm_reducer_drain(tr->red, ZERO2_INFLIGHT);
	t0 = rl_now() - t0; /* a wait inside the backward: communication, not model time */
	tr->t_comm += t0;
	tr->t_rs += t0;
	tr->t_model -= t0;
	return rv;
}

/* ZeRO-2/3 on host memory: m->grads moved into a mapping whose 2 MiB pages
 * line up with the reducer's buckets.  The buckets are laid from the
 * buffer's end, so with its end on a 2 MiB boundary and buckets of a
 * multiple of 2 MiB, a bucket given back after its reduce-scatter is whole
 * huge pages, and the next backward faults it in again once per 2 MiB.
 * Where the buffer lay (malloc's mapping, 16 bytes in) every bucket edge
 * split a huge page, and the pages came back 4 KiB at a time: about 19,700
 * faults a step on bench/zero.sh's model.  Nothing moves when the buckets
 * are not such a multiple, without huge pages (RL_NO_THP), with
 * RL_ZERO2_NO_ALIGN=1 (bench/zero.sh compares) or when the mapping cannot
 * be made. */
static void
grads_align(trainer *tr, size_t bucket)
{
	rl_model *m = tr->m;
	const size_t hp = (size_t)2 << 20;
	size_t bytes = (m->tt.total - m->goff) * sizeof(float), pad = (hp - bytes % hp) % hp, len = pad + bytes + hp;
	uintptr_t base;
	void *map;

	if (tr->ops->device >= 0 || tr->o->zero < 2 || m->lora || getenv("RL_NO_THP") || (bucket * sizeof(float)) % hp ||
	    (getenv("RL_ZERO2_NO_ALIGN") && strcmp(getenv("RL_ZERO2_NO_ALIGN"), "0") != 0) ||
	    (map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
		return;
	base = ((uintptr_t)map + hp - 1) / hp * hp;
	tr->ops->free(tr->ops, m->grads);   /* all zeros still, as the new pages read */
	m->grads = (float *)(base + pad);
	tr->gmap = map;
	tr->gmap_len = len;
}

void
rli_dp_grads_unmap(trainer *tr)
{
	if (tr == NULL || tr->gmap == NULL)
		return;
	munmap(tr->gmap, tr->gmap_len);
	tr->gmap = NULL;
	tr->m->grads = NULL;
}

int
rli_dp_reducer_open(trainer *tr)
{
	size_t total = tr->m->tt.total - tr->m->goff;   /* the gradients there are (LoRA: adapters') */
	size_t bucket = (size_t)(tr->o->dp_bucket_mb * (1 << 20)) / sizeof(float);
	int rv;

	grads_align(tr, bucket);

	/* ZeRO-3's gathers run on the main thread between the buckets: one thread
	 * for every collective keeps one order on every rank */
	if ((rv = rl_comm_reducer_create(&tr->red, tr->comm, tr->m->grads, total, bucket ? bucket : total,
	    tr->o->dp_overlap && tr->o->zero != 3)) != 0)
		return rv;
	if (tr->o->zero >= 2 && tr->ops->device >= 0) {
		rl_error("--zero %d runs on the CPU backend only (it gives host pages back)", tr->o->zero);
		rl_hint("use --zero 1 on --device cuda");
		return RL_ENOTSUP;
	}
	/* LoRA: the adapters' gradients are all-reduced whatever --zero (ZeRO-3 shards the base only) */
	if (tr->o->zero >= 2 && !tr->m->lora && (rv = rl_comm_reducer_scatter(tr->red, zero2_bucket_done, tr)) != 0)
		return rv;
	rl_verbose("gradient all-reduce: %zu buckets of %g MiB, %s", (total + bucket - 1) / (bucket ? bucket : total),
	    tr->o->dp_bucket_mb, rl_comm_reducer_overlaps(tr->red) ? "overlapped with the backward pass" :
	    "after the backward pass");
	return RL_OK;
}

/* ---- ZeRO-3: parameters sharded ------------------------------------------------------- */

/* The end of the part of m's table ZeRO-3 shards: the whole table, or with
 * LoRA the frozen base before the adapters (goff, set by the training
 * buffers' reserve). */
static size_t
z3_end(const rl_model *m)
{
	return m->lora ? m->goff : m->tt.total;
}

/* The element ranges of unit u (model.h, param_need): the embedding, layer
 * l from its first tensor (ln1_w) to the next layer's, the head from the
 * final norm to the end of the sharded part (z3_end), with a tied lm_head the embedding's
 * wte too.  The table is in that order (model.c). */
static int
unit_ranges(const rl_model *m, int u, size_t r[2][2])
{
	const int L = m->cfg.n_layer;
	const rl_tensor *t = m->tt.t;
	size_t head = t[m->lnf_w].off;

	if (u == 0) {
		r[0][0] = 0;
		r[0][1] = t[m->layer[0].ln1_w].off;
		return 1;
	}
	if (u <= L) {
		r[0][0] = t[m->layer[u - 1].ln1_w].off;
		r[0][1] = u < L ? t[m->layer[u].ln1_w].off : head;
		return 1;
	}
	r[0][0] = head;
	r[0][1] = z3_end(m);
	if (m->lm_w != m->wte)
		return 1;
	r[1][0] = t[m->wte].off;
	r[1][1] = t[m->wte].off + t[m->wte].n;
	return 2;
}

/* The unit whose own range (unit_ranges' first) holds element off of the
 * table: what a tensor starting there belongs to. */
int
rli_zero3_unit_of(const rl_model *m, size_t off)
{
	size_t r[2][2];

	for (int u = 0; u <= m->cfg.n_layer; u++) {
		unit_ranges(m, u, r);
		if (off < r[0][1])
			return u;
	}
	return m->cfg.n_layer + 1;
}

void
rli_zero3_unit_span(const rl_model *m, int u, size_t *lo, size_t *hi)
{
	size_t r[2][2];

	unit_ranges(m, u, r);
	*lo = r[0][0];
	*hi = r[0][1];
}

/* ---- ZeRO-3's unit pool ----------------------------------------------------------------
 * A unit's pages of m->params given back with MADV_DONTNEED come back at its
 * next gather as page faults the kernel answers with zeroed pages (2 MiB
 * ones with huge pages): zeroing and faulting a unit each time it is
 * gathered (its forward and its backward, each micro-batch), on the cores
 * the passes compute on.
 * Instead the whole pages of a unit's range are mapped from a slot of a
 * small memfd (MAP_SHARED | MAP_FIXED | MAP_POPULATE: the pages the slot's
 * previous unit wrote enter the page table in one call, nothing zeroed; the
 * gather then overwrites every element) and given back by mapping fresh
 * anonymous memory over them (reads as zeros, holds no pages, as after
 * MADV_DONTNEED).  The memory stays bounded: RLI_Z3_SLOTS slots of the
 * largest unit, the free slots' pages counted among the resident parameters
 * (pool_idle_bytes), and all of them given back with the whole model
 * (z3_release: a hole punched in the memfd).  A range that finds no free
 * slot of its size (the whole model of a save, a kept unit too many) is
 * written into anonymous memory as without the pool.  The prefetch thread
 * maps slots; the main thread unmaps them only after joining it, so the
 * slots need no lock.  RL_ZERO3_NO_POOL=1 turns the pool off (bench/zero.sh
 * compares). */

/* The whole pages inside p[lo, hi), [*ia, *ie); 0 when there are none. */
static int
inner_pages(const float *p, size_t lo, size_t hi, uintptr_t *ia, uintptr_t *ie)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);

	*ia = ((uintptr_t)(p + lo) + pg - 1) / pg * pg;
	*ie = (uintptr_t)(p + hi) / pg * pg;
	return *ie > *ia;
}

/* The pool of z (sized from its model's units), or none: a failure here
 * only costs the faults the pool avoids. */
static void
pool_open(rli_z3 *z)
{
	size_t r[2][2], most = 0;
	uintptr_t ia, ie;
	int fd;

	z->pool_fd = -1;
	if (getenv("RL_ZERO3_NO_POOL") && strcmp(getenv("RL_ZERO3_NO_POOL"), "0") != 0)
		return;
	for (int u = 0; u <= z->m->cfg.n_layer + 1; u++)
		for (int k = 0, n = unit_ranges(z->m, u, r); k < n; k++)
			if (inner_pages(z->m->params, r[k][0], r[k][1], &ia, &ie))
				most = RL_MAX(most, (size_t)(ie - ia));
	if (!most)
		return;
	if ((fd = memfd_create("rl-zero3-units", MFD_CLOEXEC)) < 0 ||
	    ftruncate(fd, (off_t)(most * RLI_Z3_SLOTS)) != 0) {
		rl_verbose("ZeRO-3: no pool of unit pages (%s): each gather faults fresh pages in", strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	z->pool_fd = fd;
	z->slot_bytes = most;
}

/* [at, at + bytes) fresh anonymous memory again (with the huge-page advice
 * the rest of m->params has); 0, or the error that leaves a hole there. */
static int
anon_over(rli_z3 *z, char *at, size_t bytes)
{
	if (mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
		rl_error("ZeRO-3: cannot map %zu bytes of the parameter table back: %s", bytes, strerror(errno));
		z->pool_err = RL_ENOMEM;
		return RL_ENOMEM;
	}
	if (!getenv("RL_NO_THP"))
		(void)madvise(at, bytes, MADV_HUGEPAGE);
	return RL_OK;
}

/* A free slot mapped over the whole pages of m->params[lo, hi), about to be
 * gathered into; nothing when there is no pool, no free slot big enough, or
 * the range is one already mapped (a tied head's embedding). */
static void
pool_map(rli_z3 *z, size_t lo, size_t hi)
{
	uintptr_t ia, ie;
	int k = -1;

	if (!z->slot_bytes || !inner_pages(z->m->params, lo, hi, &ia, &ie) || ie - ia > z->slot_bytes)
		return;
	for (int i = 0; i < RLI_Z3_SLOTS; i++) {
		struct rli_z3_slot *s = &z->slot[i];
		if (s->at) {
			if ((uintptr_t)s->at < ie && (uintptr_t)s->at + s->bytes > ia)
				return; /* mapped there already */
			continue;
		}
		if (k < 0 || s->held > z->slot[k].held)
			k = i; /* the free one with the most pages written already */
	}
	if (k < 0)
		return;
	if (mmap((void *)ia, ie - ia, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, z->pool_fd,
	    (off_t)((size_t)k * z->slot_bytes)) == MAP_FAILED) {
		(void)anon_over(z, (char *)ia, ie - ia); /* a failed MAP_FIXED may have unmapped the range */
		return;
	}
	z->slot[k].at = (char *)ia;
	z->slot[k].bytes = ie - ia;
	z->slot[k].held = RL_MAX(z->slot[k].held, ie - ia);
	z->npooled++;
}

/* The slots mapped inside m->params[lo, hi) given back to the pool, their
 * ranges anonymous memory again. */
static void
pool_unmap(rli_z3 *z, size_t lo, size_t hi)
{
	uintptr_t a = (uintptr_t)(z->m->params + lo), e = (uintptr_t)(z->m->params + hi);

	for (int i = 0; i < RLI_Z3_SLOTS; i++) {
		struct rli_z3_slot *s = &z->slot[i];
		if (s->at && (uintptr_t)s->at >= a && (uintptr_t)s->at + s->bytes <= e) {
			(void)anon_over(z, s->at, s->bytes);
			s->at = NULL;
		}
	}
}

/* Every slot given back and its pages to the kernel (nothing is mapped). */
static void
pool_purge(rli_z3 *z)
{
	int held = 0;

	if (!z->slot_bytes)
		return;
	pool_unmap(z, 0, z3_end(z->m));
	for (int i = 0; i < RLI_Z3_SLOTS; i++)
		held |= z->slot[i].held != 0;
	if (held && fallocate(z->pool_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
	    (off_t)(z->slot_bytes * RLI_Z3_SLOTS)) == 0)
		for (int i = 0; i < RLI_Z3_SLOTS; i++)
			z->slot[i].held = 0;
}

/* The pool's pages not mapped in m->params (mincore there counts the rest). */
static double
pool_idle_bytes(const rli_z3 *z)
{
	double b = 0;

	for (int i = 0; i < RLI_Z3_SLOTS; i++)
		b += (double)z->slot[i].held - (z->slot[i].at ? (double)z->slot[i].bytes : 0);
	return b;
}

static void
pool_close(rli_z3 *z)
{
	if (!z->slot_bytes)
		return;
	pool_unmap(z, 0, z3_end(z->m));
	close(z->pool_fd);
	z->pool_fd = -1;
	z->slot_bytes = 0;
}

/* ---- ZeRO-3's shards read in place ---------------------------------------------------
 * With every rank on one host, a gather need not pass through the ring: each
 * rank's master shard (zp) is the shared mapping of a memfd, every other rank
 * maps it read-only (/proc/PID/fd/FD, as the ring's shared-memory edges do),
 * and a gather copies each owner's part straight from its shard into
 * m->params: one copy of the unit per rank instead of the owner's copy, the
 * ring's copy into a slot and the receiver's copy out of it, and no
 * collective at all per unit.  A shard changes only in AdamW (rli_zero_step):
 * before it every rank has left its passes (the gradient norm's all-reduce
 * comes after the last gather of the step), and after it a barrier keeps
 * every rank from gathering until every shard is written.  Used only when
 * every rank mapped every other rank's shard (host memory, one host; agreed
 * by an all-reduce), else the ring as before.  RL_ZERO3_NO_DIRECT=1 turns it
 * off (bench/zero.sh compares).
 * Where the pads agree (map_wanted), a gather copies even less: the whole
 * pages of each owner's part are mapped read-only from the owner's memfd
 * into m->params (map_part), the partial pages at the ends copied, and a
 * unit given back is fresh anonymous memory mapped over them (give_back);
 * no pool then.  RL_ZERO3_NO_MAP=1: the copies (bench/zero.sh compares). */

typedef struct shard_offer {
	char boot[40], host[64], name[48];
	int32_t pid, fd;
	uint64_t bytes, pad;     /* the memfd's length, and its bytes before the shard (zpad) */
} shard_offer;

static int
direct_wanted(const trainer *tr)
{
	const char *e = getenv("RL_ZERO3_NO_DIRECT");

	return tr->world > 1 && tr->ops->device < 0 && !(e && strcmp(e, "0") != 0);
}

static void
shard_name(const rli_z3 *z, char *out, size_t len)
{
	snprintf(out, len, "rl-zero3-shard-%d-%s", z->tr->rank, z == &z->tr->z3r ? "ref" : "policy");
}

/* z->zp for n elements: a memfd's shared mapping when the shards may be read
 * in place (z->zfd), else the ops' memory.  The memfd starts z->zpad bytes
 * before the shard, so that each element has there the offset within its
 * page that it has in m->params: whole pages of the shard can be mapped
 * into m->params (map_part). */
static int
shard_alloc(rli_z3 *z, size_t n)
{
	rl_ops *o = z->tr->ops;
	size_t bytes = (n ? n : 1) * sizeof(float);
	char name[48];
	void *p;
	int fd;

	z->zfd = -1;
	z->zpad = 0;
	if (!direct_wanted(z->tr))
		return o->alloc(o, (void **)&z->zp, bytes);
	z->zpad = (uintptr_t)(z->m->params + z->zlo) % (uintptr_t)sysconf(_SC_PAGESIZE);
	bytes += z->zpad;
	shard_name(z, name, sizeof name);
	if ((fd = memfd_create(name, MFD_CLOEXEC)) < 0 || ftruncate(fd, (off_t)bytes) != 0 ||
	    (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		rl_verbose("ZeRO-3: the shard in ordinary memory (%s): gathers through the ring", strerror(errno));
		if (fd >= 0)
			close(fd);
		z->zpad = 0;
		return o->alloc(o, (void **)&z->zp, (n ? n : 1) * sizeof(float));
	}
	z->zp = (float *)((char *)p + z->zpad);
	z->zfd = fd;
	return RL_OK;
}

static void
offer_local(rli_z3 *z, shard_offer *me)
{
	rli_shm_offer here; /* this machine's host and boot id, as the ring's shared-memory edges check them */

	memset(me, 0, sizeof *me);
	rli_shm_offer_local(&here);
	memcpy(me->host, here.host, sizeof me->host);
	memcpy(me->boot, here.boot_id, sizeof me->boot);
	if (z->zfd < 0 || !me->boot[0])
		return;
	shard_name(z, me->name, sizeof me->name);
	me->pid = (int32_t)getpid();
	me->fd = z->zfd;
	me->pad = z->zpad;
	me->bytes = (uint64_t)((z->zhi > z->zlo ? z->zhi - z->zlo : 1) * sizeof(float) + z->zpad);
}

/* Rank r's shard (its offer o) mapped read-only into z->peer[r], its memfd
 * kept open (z->peer_fd[r]); 0, or 1 when it cannot be (another host,
 * another file behind the descriptor, a size that is not its shard's). */
static int
peer_map(rli_z3 *z, const shard_offer *o, const shard_offer *me, int r)
{
	char path[64], link[160];
	size_t lo, hi, want;
	struct stat st;
	ssize_t k;
	void *p;
	int fd;

	if (o->pid <= 0 || !o->name[0] || strcmp(o->boot, me->boot) != 0 || strcmp(o->host, me->host) != 0)
		return 1;
	rl_comm_shard(z->tr->comm, z3_end(z->m), r, &lo, &hi);
	if (o->pad >= (uint64_t)sysconf(_SC_PAGESIZE) || o->pad % sizeof(float))
		return 1;
	want = (hi > lo ? hi - lo : 1) * sizeof(float) + (size_t)o->pad;
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)o->pid, (int)o->fd);
	if ((k = readlink(path, link, sizeof link - 1)) < 0)
		return 1;
	link[k] = 0;
	size_t nl = strlen(o->name);
	if (strncmp(link, "/memfd:", 7) != 0 || strncmp(link + 7, o->name, nl) != 0 || (link[7 + nl] && link[7 + nl] != ' '))
		return 1;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return 1;
	if (fstat(fd, &st) != 0 || o->bytes != want || (uint64_t)st.st_size != want ||
	    (p = mmap(NULL, want, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		close(fd);
		return 1;
	}
	z->peer[r] = (const float *)((const char *)p + o->pad);
	z->peer_bytes[r] = want;
	z->peer_pad[r] = (size_t)o->pad;
	z->peer_fd[r] = fd;
	return 0;
}

static void
peers_close(rli_z3 *z)
{
	if (!z->peer)
		return;
	for (int r = 0; r < z->tr->world; r++)
		if (z->peer[r] && r != z->tr->rank) {
			munmap((char *)z->peer[r] - z->peer_pad[r], z->peer_bytes[r]);
			close(z->peer_fd[r]);
		}
	free(z->peer);
	free(z->peer_bytes);
	free(z->peer_pad);
	free(z->peer_fd);
	z->peer = NULL;
	z->peer_bytes = z->peer_pad = NULL;
	z->peer_fd = NULL;
	z->map = 0;
}

/* Whether gathers may map the shards' whole pages (map_part): every shard's
 * pad gives its elements the in-page offsets they have in this rank's
 * m->params (each rank allocates m->params alike, so they normally agree;
 * where not, the copies).  RL_ZERO3_NO_MAP=1: the copies (for measuring). */
static int
map_wanted(const rli_z3 *z)
{
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	const char *e = getenv("RL_ZERO3_NO_MAP");

	if (e && strcmp(e, "0") != 0)
		return 0;
	for (int r = 0; r < z->tr->world; r++) {
		size_t lo, hi;
		rl_comm_shard(z->tr->comm, z3_end(z->m), r, &lo, &hi);
		if (z->peer_pad[r] != (uintptr_t)(z->m->params + lo) % pg)
			return 0;
	}
	return 1;
}

/* Every rank's shard mapped here, or none (collective: every rank calls it
 * once its shard is written, with the same model). */
static int
peers_open(rli_z3 *z)
{
	trainer *tr = z->tr;
	const int N = tr->world;
	shard_offer me, *all;
	double bad = 0;
	int rv;

	if (N < 2)
		return RL_OK;
	offer_local(z, &me);
	if (!(all = rl_try_calloc((size_t)N, sizeof *all, "shard offers")))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(tr->comm, all, &me, sizeof me)) != 0) {
		free(all);
		return rv;
	}
	z->peer = rl_try_calloc((size_t)N, sizeof *z->peer, "shard maps");
	z->peer_bytes = rl_try_calloc((size_t)N, sizeof *z->peer_bytes, "shard maps");
	z->peer_pad = rl_try_calloc((size_t)N, sizeof *z->peer_pad, "shard maps");
	z->peer_fd = rl_try_calloc((size_t)N, sizeof *z->peer_fd, "shard maps");
	bad = !z->peer || !z->peer_bytes || !z->peer_pad || !z->peer_fd || !me.name[0];
	for (int r = 0; !bad && r < N; r++)
		if (r != tr->rank)
			bad = peer_map(z, &all[r], &me, r);
	free(all);
	if ((rv = rl_comm_host_allreduce_f64(tr->comm, &bad, 1)) != 0 || bad > 0) {
		peers_close(z);
		if (rv == 0)
			rl_verbose("ZeRO-3: %g rank(s) cannot read the other shards in place: gathers through the ring", bad);
		return rv;
	}
	z->peer[tr->rank] = z->zp;
	z->peer_bytes[tr->rank] = me.bytes;
	z->peer_pad[tr->rank] = z->zpad;
	z->peer_fd[tr->rank] = z->zfd;
	z->map = map_wanted(z);
	rl_verbose("ZeRO-3: every rank's shard read in place (one host): gathers without the ring, %s",
	    z->map ? "their whole pages mapped" : "copied");
	return RL_OK;
}

/* The shard and the maps of z given back (the trainer's end). */
static void
shard_close(rli_z3 *z)
{
	peers_close(z);
	if (z->zfd < 0)
		return;
	munmap((char *)z->zp - z->zpad, (z->zhi > z->zlo ? z->zhi - z->zlo : 1) * sizeof(float) + z->zpad);
	close(z->zfd);
	z->zfd = -1;
	z->zp = NULL;
}

/* Rank r's part p[a, b) of a gather (its shard starting at element slo)
 * with the whole pages inside mapped from its memfd, read-only, rather than
 * copied: the page-table entries of pages that exist, no copy and no page
 * of this rank's; the partial pages at the ends are copied.  0, -1 when it
 * cannot be mapped (no whole page; copy it), or the error of a failed remap
 * (m->params has a hole there). */
static int
map_part(rli_z3 *z, int r, size_t a, size_t b, size_t slo)
{
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	float *p = z->m->params;
	uintptr_t ia, ie, off;

	if (!inner_pages(p, a, b, &ia, &ie))
		return -1;
	off = z->peer_pad[r] + (ia - (uintptr_t)(p + slo)); /* the memfd's byte of element (ia - p) / 4 */
	if (off % pg)
		return -1;
	if (mmap((void *)ia, ie - ia, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE, z->peer_fd[r],
	    (off_t)off) == MAP_FAILED)
		return anon_over(z, (char *)ia, ie - ia) != 0 ? z->pool_err : -1; /* MAP_FIXED may have unmapped it */
	memcpy(p + a, z->peer[r] + (a - slo), ia - (uintptr_t)(p + a));
	memcpy((void *)ie, z->peer[r] + ((const float *)ie - p - slo), (uintptr_t)(p + b) - ie);
	z->nmapped++;
	return 0;
}

/* z->m->params[lo, hi) from the shards that hold it: each owner copies its
 * part from its master shard and broadcasts it, in rank order (every rank
 * computes the same owners); with the shards read in place, each part read
 * from its owner's shard (mapped or copied). */
static int
gather_range(rli_z3 *z, size_t lo, size_t hi)
{
	trainer *tr = z->tr;
	float *p = z->m->params;
	int rv;

	if (z->pool_err)
		return z->pool_err;
	if (!z->map)
		pool_map(z, lo, hi);
	for (int r = 0; r < tr->world; r++) {
		size_t slo, shi;
		rl_comm_shard(tr->comm, z3_end(z->m), r, &slo, &shi);
		size_t a = RL_MAX(lo, slo), b = RL_MIN(hi, shi);
		if (a >= b)
			continue;
		if (z->peer) { /* read in place */
			if (z->map && (rv = map_part(z, r, a, b, slo)) >= 0) {
				if (rv > 0)
					return rv;
				continue;
			}
			memcpy(p + a, z->peer[r] + (a - slo), (b - a) * sizeof(float));
			continue;
		}
		if (r == tr->rank)
			memcpy(p + a, z->zp + (a - z->zlo), (b - a) * sizeof(float));
		if ((rv = rl_comm_broadcast(tr->comm, p + a, (b - a) * sizeof(float), r)) != 0)
			return rv;
	}
	return RL_OK;
}

/* The bytes of m->params and of its master shard resident now (the whole
 * table when m is not sharded). */
static double
model_resident(trainer *tr, const rl_model *m, const float *zp, size_t n)
{
	double b = 0;

	if (m && tr->ops->device < 0) {
		b = resident_bytes(m->params, m->tt.total * sizeof(float));
		if (zp)
			b += resident_bytes(zp, n * sizeof(float));
	}
	return b;
}

static double
params_resident(trainer *tr)
{
	return model_resident(tr, tr->m, tr->z3p.zp, tr->z3p.zhi - tr->z3p.zlo) + pool_idle_bytes(&tr->z3p);
}

void
rli_dp_params_resident(trainer *tr)
{
	tr->pres_peak = RL_MAX(tr->pres_peak, params_resident(tr));
}

void
rli_dp_ref_resident(trainer *tr)
{
	tr->ref_pres_peak = RL_MAX(tr->ref_pres_peak, model_resident(tr, tr->ref, tr->z3r.zp, tr->z3r.zhi - tr->z3r.zlo) +
	    pool_idle_bytes(&tr->z3r));
}

/* The resident parameters of z's model into its peak. */
static void
z3_resident(rli_z3 *z)
{
	double b = model_resident(z->tr, z->m, z->zp, z->zhi - z->zlo) + pool_idle_bytes(z);

	*z->pres_peak = RL_MAX(*z->pres_peak, b);
}

/* The unit's ranges of m->params from the shards. */
static int
gather_unit(rli_z3 *z, int u)
{
	size_t r[2][2];
	int rv = RL_OK;

	for (int k = 0, n = unit_ranges(z->m, u, r); rv == 0 && k < n; k++)
		rv = gather_range(z, r[k][0], r[k][1]);
	return rv;
}

static void *
prefetch_main(void *arg)
{
	trainer *tr = arg;

	/* the backward's final buckets first, then the gather: one thread issues
	 * both, in the order every rank computes */
	tr->z3_pfrv = tr->z3_rs ? rl_comm_reducer_drain(tr->red, 0) : RL_OK;
	tr->z3_rs = 0;
	if (tr->z3_pfrv == 0)
		tr->z3_pfrv = gather_unit(tr->z3_pfz, tr->z3_pfz->pf);
	return NULL;
}

/* Waits for the prefetch in flight (of whichever model): the communicator
 * is the caller's again, and the prefetched unit is in its m->params (or
 * its error returned).  Every release and every other collective comes
 * after one of these, so the thread never shares the ring or a page being
 * given back. */
static int
prefetch_join(trainer *tr)
{
	if (tr->z3_busy) {
		double t0 = rl_now();
		pthread_join(tr->z3_th, NULL);
		tr->z3_busy = 0;
		t0 = rl_now() - t0; /* the part of the gather the compute did not hide */
		tr->t_comm += t0;
		tr->t_gather += t0;
		tr->t_model -= t0;
	}
	return tr->z3_pfrv;
}

int
rli_zero3_join(trainer *tr)
{
	return tr->z3p.zp ? prefetch_join(tr) : RL_OK;
}

/* Unit u is in m->params: the current one, the prefetched one or one kept
 * (z->kept); the embedding also while a tied head is, when the embedding
 * unit is wte alone (z->emb_in_head). */
static int
unit_in(const rli_z3 *z, int u)
{
	const int head = z->m->cfg.n_layer + 1;

	if (u < 0)
		return 0;
	if (u == z->unit || u == z->pf)
		return 1;
	for (int k = 0; k < z->nkept; k++)
		if (z->kept[k] == u)
			return 1;
	return u == 0 && z->emb_in_head && unit_in(z, head);
}

/* m->params[lo, hi) given back: its pool slots to the pool, then its whole
 * pages to the kernel (MADV_DONTNEED), or, where gathers map the shards'
 * pages (map_part), fresh anonymous memory over them: a shard's pages
 * given back with MADV_DONTNEED would stay mapped there, read as the shard
 * and counted as resident by mincore. */
static void
give_back(rli_z3 *z, size_t lo, size_t hi)
{
	float *p = z->m->params;
	uintptr_t ia, ie;

	pool_unmap(z, lo, hi);
	if (!z->map || !inner_pages(p, lo, hi, &ia, &ie)) {
		release_host(p + lo, hi - lo);
		return;
	}
	if (anon_over(z, (char *)ia, ie - ia) != 0)
		return; /* a hole: every later need fails (pool_err) */
	memset(p + lo, 0, ia - (uintptr_t)(p + lo));
	memset((void *)ie, 0, (uintptr_t)(p + hi) - ie);
}

/* Gives unit u's pages back, but not the elements a resident unit shares
 * with it (the embedding's wte in a tied head); u is no longer listed. */
static void
drop_unit(rli_z3 *z, int u)
{
	const int head = z->m->cfg.n_layer + 1;
	size_t r[2][2];
	int n;

	if (u < 0 || unit_in(z, u))
		return;
	n = unit_ranges(z->m, u, r);
	if (u == 0 && z->m->lm_w == z->m->wte && unit_in(z, head))
		return; /* its wte is the head's too (and an embedding unit is wte alone) */
	if (u == head && n == 2 && unit_in(z, 0))
		n = 1;  /* the tied wte stays for the embedding */
	for (int k = 0; k < n; k++)
		give_back(z, r[k][0], r[k][1]);
}

static size_t
unit_elems(const rli_z3 *z, int u)
{
	size_t r[2][2], e = 0;

	for (int k = 0, n = unit_ranges(z->m, u, r); k < n; k++)
		e += r[k][1] - r[k][0];
	return e;
}

/* Unit u, just used, joins the kept ones (the most recent first); the least
 * recent ones over z->keep elements are given back. */
static void
keep_unit(rli_z3 *z, int u)
{
	size_t sum = 0;
	int k, n;

	if (u < 0 || unit_in(z, u))
		return;
	if (!z->kept) { /* nothing kept: given back */
		drop_unit(z, u);
		return;
	}
	memmove(z->kept + 1, z->kept, sizeof *z->kept * (size_t)z->nkept);
	z->kept[0] = u;
	z->nkept++;
	for (k = 0; k < z->nkept; k++) {
		sum += unit_elems(z, z->kept[k]);
		if (sum > z->keep)
			break;
	}
	for (n = z->nkept; n > k; n--) {
		int v = z->kept[n - 1];
		z->nkept = n - 1;
		drop_unit(z, v);
	}
}

/* Takes u off the kept list (it becomes the current or prefetched one). */
static void
unkeep_unit(rli_z3 *z, int u)
{
	for (int k = 0; k < z->nkept; k++)
		if (z->kept[k] == u) {
			memmove(z->kept + k, z->kept + k + 1, sizeof *z->kept * (size_t)(z->nkept - k - 1));
			z->nkept--;
			return;
		}
}

/* Every page of z's m->params given back, no unit listed; with purge the
 * pool's pages too (else kept for the next unit: a walk over the units). */
static void
z3_release(rli_z3 *z, int purge)
{
	if (!z->zp)
		return;
	prefetch_join(z->tr);
	if (purge)
		pool_purge(z);
	give_back(z, 0, z3_end(z->m));
	z->unit = z->pf = -1;
	z->nkept = 0;
}

void
rli_zero3_release(trainer *tr)
{
	z3_release(&tr->z3p, 1);
}

void
rli_zero3_close(trainer *tr)
{
	if (tr->z3p.zp) {
		pool_close(&tr->z3p);
		shard_close(&tr->z3p);
	}
	if (tr->z3r.zp) {
		pool_close(&tr->z3r);
		shard_close(&tr->z3r);
	}
}

/* The buckets the backward handed over since the last param_need, reduced
 * here when no prefetch thread takes them (ZeRO-3). */
static int
rs_pending(trainer *tr)
{
	if (!tr->z3_rs)
		return RL_OK;
	double t0 = rl_now();
	int rv = rl_comm_reducer_drain(tr->red, 0);
	t0 = rl_now() - t0; /* inside a pass: communication, not model time */
	tr->z3_rs = 0;
	tr->t_comm += t0;
	tr->t_rs += t0;
	tr->t_model -= t0;
	return rv;
}

/* The backward pass is about to write unit u's gradients into m->grads,
 * whose pages ZeRO-2's reduce-scatter gave back: they are faulted in here
 * in one call per range (MADV_POPULATE_WRITE) rather than one read fault
 * (the zero page, as the backward's accumulating stores read first) and one
 * write fault per page.  The same pages the backward writes next, no more;
 * where the kernel lacks the advice, the faults as before.  The backward's
 * calls are (u, u - 1) and, for the first layer, (1, -1); the forward's
 * (u, u + 1) and (head, -1). */
static void
prefault_grads(rli_z3 *z, int unit, int next)
{
	trainer *tr = z->tr;
	size_t r[2][2];
	uintptr_t ia, ie;

	if (z != &tr->z3p || tr->m->lora || !tr->m->grads || getenv("RL_ZERO3_NO_PREFAULT") ||
	    (next >= 0 ? next >= unit : unit != 1))
		return;
	for (int k = 0, n = unit_ranges(z->m, unit, r); k < n; k++)
		if (inner_pages(tr->m->grads, r[k][0], r[k][1], &ia, &ie))
			(void)madvise((void *)ia, ie - ia, MADV_POPULATE_WRITE);
}

/* A unit is resident as the current one (z->unit), the prefetched one
 * (z->pf) or a kept one (z->kept, --zero3-keep); the ranks all call this
 * with the same model and (unit, next), so they decide the same gathers and
 * start them in the same order.  The only units sharing elements are the
 * embedding and a tied head (drop_unit keeps what one still needs); the
 * head is never prefetched while the embedding is computed.  One prefetch
 * thread serves both models: a pass of one joins the other's first. */
int
rli_zero3_param_need(void *ctx, int unit, int next)
{
	rli_z3 *z = ctx;
	trainer *tr = z->tr;
	double t0;
	int rv, prev, pf;

	if ((rv = prefetch_join(tr)) != 0 || (rv = z->pool_err) != 0)
		return rv;
	z3_resident(z); /* the peak: the current and the prefetched unit beside the shard */
	if (z->unit == -2)
		z3_release(z, 1); /* the whole model (a save) not given back yet */
	prev = z->unit;
	pf = z->pf;
	int have = unit_in(z, unit);
	unkeep_unit(z, unit);
	z->unit = unit;
	z->pf = -1;
	if (prev != unit)
		keep_unit(z, prev);    /* --zero3-keep 0: given back */
	if (pf != unit)
		keep_unit(z, pf);      /* not what came */
	if (!have) {
		z->ngather++;
		t0 = rl_now();
		if ((rv = gather_unit(z, unit)) != 0)
			return rv;
		t0 = rl_now() - t0; /* inside a pass: communication, not model time */
		tr->t_comm += t0;
		tr->t_gather += t0;
		tr->t_model -= t0;
	}
	z3_resident(z);
	prefault_grads(z, unit, next);
	if (next < 0 || next == unit || tr->o->zero3_no_prefetch)
		return rs_pending(tr);
	if (unit_in(z, next)) {
		unkeep_unit(z, next);  /* kept: nothing to gather */
		z->pf = next;
		return rs_pending(tr);
	}
	z->pf = next;
	tr->z3_pfz = z;
	tr->z3_pfrv = RL_OK;
	z->ngather++;
	if (pthread_create(&tr->z3_th, NULL, prefetch_main, tr) == 0) {
		tr->z3_busy = 1;
		return RL_OK;
	}
	if ((rv = rs_pending(tr)) != 0)
		return rv;
	return gather_unit(z, next); /* no thread: gathered now */
}

int
rli_zero3_gather_all(trainer *tr)
{
	int rv;

	if (!tr->z3p.zp)
		return RL_OK;
	rli_zero3_release(tr);
	if ((rv = gather_range(&tr->z3p, 0, z3_end(tr->m))) != 0)
		return rv;
	tr->z3p.unit = -2; /* everything */
	return RL_OK;
}

/* Unit u alone in m->params, whatever was there given back first; u < 0:
 * nothing.  A walk over the units outside a pass (a version built part by
 * part, save.c); every rank calls it with the same u, in the same order. */
int
rli_zero3_unit_only(trainer *tr, int u)
{
	int rv;

	if (!tr->z3p.zp)
		return RL_OK;
	z3_release(&tr->z3p, u < 0); /* the walk's units one after another in the same slot */
	if (u < 0)
		return RL_OK;
	if ((rv = gather_unit(&tr->z3p, u)) != 0)
		return rv;
	tr->z3p.unit = u;
	tr->z3p.ngather++;
	rli_dp_params_resident(tr);
	return RL_OK;
}

/* The gathers of one rl_model_forward of z's model, computing nothing. */
static int
idle_forward(rli_z3 *z)
{
	const int L = z->m->cfg.n_layer;
	int rv = RL_OK;

	for (int u = 0; rv == 0 && u <= L + 1; u++)
		rv = rli_zero3_param_need(z, u, u <= L ? u + 1 : -1);
	return rv;
}

int
rli_zero3_ref_done(trainer *tr)
{
	int rv;

	if (!tr->z3r.zp)
		return RL_OK;
	rv = prefetch_join(tr);
	z3_resident(&tr->z3r);
	z3_release(&tr->z3r, 1);
	return rv;
}

int
rli_zero3_ref_idle(trainer *tr)
{
	int rv;

	/* LoRA's base as the reference: its forward is the policy's, adapters off
	 * (the same gathers as the policy's forward, before or after it alike) */
	if (tr->ref_base && tr->z3p.zp)
		return idle_forward(&tr->z3p);
	if (!tr->z3r.zp)
		return RL_OK; /* a whole reference: its forward takes no collective */
	rv = idle_forward(&tr->z3r);
	return rv != 0 ? rv : rli_zero3_ref_done(tr);
}

/* The hooks a pass calls, in its order, with nothing computed: the gathers
 * of rl_model_forward, with ref those of the reference's forward after it,
 * then those of the backward and its gradient hand-overs (grads_final's
 * offsets; the idle rank's buffer is zeros). */
int
rli_zero3_idle_pass(trainer *tr, int backward, int ref)
{
	rl_model *m = tr->m;
	const int L = m->cfg.n_layer;
	double t0 = rl_now();
	int rv = idle_forward(&tr->z3p);

	if (rv != 0 || (ref && (rv = rli_zero3_ref_idle(tr)) != 0) || !backward)
		goto out;
	if ((rv = rli_zero3_param_need(&tr->z3p, L + 1, L)) != 0)
		goto out;
	if (m->grad_ready && (rv = m->grad_ready(m->grad_ready_ctx, m->tt.t[m->lnf_w].off)) != 0)
		goto out;
	for (int l = L - 1; rv == 0 && l >= 0; l--)
		if ((rv = rli_zero3_param_need(&tr->z3p, 1 + l, l > 0 ? l : -1)) == 0 && m->grad_ready)
			rv = m->grad_ready(m->grad_ready_ctx, m->tt.t[m->layer[l].ln1_w].off);
	if (rv == 0 && m->grad_ready)
		rv = m->grad_ready(m->grad_ready_ctx, 0);
out:
	/* a pass like the others: its waits, taken out of the model's time
	 * by the hooks, are inside it */
	tr->t_model += rl_now() - t0;
	return rv;
}

/* ---- ZeRO-1 ----------------------------------------------------------------------------- */

/* Full AdamW moments in m->m, m->v (zeroed), for a while: loading them on
 * --resume, writing them in a checkpoint (rank 0). */
int
rli_zero_full_alloc(trainer *tr)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t bytes = m->tt.total * sizeof(float);
	int rv;

	if (m->m)
		return RL_OK;
	if ((rv = o->alloc(o, (void **)&m->m, bytes)) != 0 || (rv = o->alloc(o, (void **)&m->v, bytes)) != 0)
		return rv;
	o->zero(o, m->m, bytes); /* the padding between tensors too */
	o->zero(o, m->v, bytes);
	return o->status(o);
}

/* ZeRO-3: the shard's master weights moved from m->params into z->zp a
 * chunk at a time, each chunk's pages of m->params given back once copied
 * (chunk ends on page boundaries, so no page still to copy is cleared), so
 * that the shard is not held twice; the resident parameters sampled into
 * *pres after the first chunk (the peak: the rest of the shard in m->params
 * and the chunk in zp) and after the last. */
static int
adopt_shard(rli_z3 *z, double *pres)
{
	const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), chunk = (uintptr_t)256 << 10;
	rl_ops *o = z->tr->ops;
	float *src = z->m->params + z->zlo;
	size_t n = z->zhi - z->zlo, k = 0;

	while (k < n) {
		uintptr_t e = ((uintptr_t)(src + k) + chunk) / pg * pg;
		size_t c = RL_MIN(n - k, (size_t)(e - (uintptr_t)(src + k)) / sizeof(float));
		o->copy(o, z->zp + k, src + k, c * sizeof(float));
		if (k == 0)
			*pres = RL_MAX(*pres, model_resident(z->tr, z->m, z->zp, n));
		release_host(src + k, c);
		k += c;
	}
	*pres = RL_MAX(*pres, model_resident(z->tr, z->m, z->zp, n));
	return o->status(o);
}

/* ZeRO-3: model m, whose shard [lo, hi) of the table m->params holds (read
 * there by load_shard), becomes z: the shard moved into z->zp, m->params
 * only the passes' scratch, gathered unit by unit through m->param_need;
 * keep > 0: units used are kept gathered up to keep elements. */
static int
z3_open(trainer *tr, rli_z3 *z, rl_model *m, size_t lo, size_t hi, size_t keep, double *load_pres, double *peak)
{
	rl_ops *o = tr->ops;
	int rv;

	*z = (rli_z3){ .tr = tr, .m = m, .zlo = lo, .zhi = hi, .unit = -1, .pf = -1, .keep = keep, .pres_peak = peak,
	    .zfd = -1, .pool_fd = -1 };
	if ((rv = shard_alloc(z, hi - lo)) != 0 || (rv = adopt_shard(z, load_pres)) != 0 ||
	    (rv = o->sync(o)) != 0 || (rv = peers_open(z)) != 0)
		return rv;
	huge_pages(m->params, z3_end(m));
	release_host(m->params, z3_end(m));
	if (!z->map)
		pool_open(z); /* mapped gathers write no pages of their own */
	if (keep && !(z->kept = rl_try_calloc((size_t)m->cfg.n_layer + 2, sizeof *z->kept, "kept units")))
		return RL_ENOMEM;
	z->emb_in_head = m->lm_w == m->wte;
	for (int i = 0; i < m->tt.n; i++)
		if (m->tt.t[i].off < m->tt.t[m->layer[0].ln1_w].off && i != m->wte)
			z->emb_in_head = 0;
	m->param_need = rli_zero3_param_need;
	m->param_need_ctx = z;
	return RL_OK;
}

/* Every rank keeps the AdamW moments of its shard [zlo, zhi) of the flat
 * parameter space (rl_comm_shard), never the full ones (m->no_adam_state):
 * on --resume its range of the saved state (read from the shards, or cut
 * from the whole state of an unsharded checkpoint, then dropped), whatever
 * world size wrote it; zeros otherwise. */
static int
zero_open(trainer *tr)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t n, bytes;
	int rv;

	rl_comm_shard(tr->comm, m->tt.total, tr->rank, &tr->zlo, &tr->zhi);
	n = tr->zhi - tr->zlo;
	bytes = (n ? n : 1) * sizeof(float);
	if ((rv = o->alloc(o, (void **)&tr->zm, bytes)) != 0 || (rv = o->alloc(o, (void **)&tr->zv, bytes)) != 0)
		return rv;
	if (tr->opt_dir) {
		/* saved per shard: this rank's range, from whichever shards hold it */
		if ((rv = rl_ckpt_read_opt_range(m, tr->opt_dir, tr->zlo, tr->zhi, tr->zm, tr->zv)) != 0)
			return rv;
	} else if (m->m) {
		o->copy(o, tr->zm, m->m + tr->zlo, n * sizeof(float));
		o->copy(o, tr->zv, m->v + tr->zlo, n * sizeof(float));
	} else {
		o->zero(o, tr->zm, n * sizeof(float));
		o->zero(o, tr->zv, n * sizeof(float));
	}
	if (tr->o->zero >= 2) {
		/* the shard's gradients; the full buffer only as the backward's scratch */
		if ((rv = o->alloc(o, (void **)&tr->zg, bytes)) != 0)
			return rv;
		o->zero(o, tr->zg, bytes);
		huge_pages(m->grads, m->tt.total - m->goff);
		release_host(m->grads, m->tt.total - m->goff);
	}
	if (tr->o->zero == 3) {
		/* the shard's master weights; m->params only as the passes' scratch */
		if ((rv = z3_open(tr, &tr->z3p, m, tr->zlo, tr->zhi, tr->o->zero3_keep, &tr->load_pres,
		    &tr->pres_peak)) != 0)
			return rv;
	}
	if ((rv = o->sync(o)) != 0)
		return rv;
	o->free(o, m->m);
	o->free(o, m->v);
	m->m = m->v = NULL;
	tr->zero = tr->o->zero;
	rl_verbose("ZeRO-%d: AdamW state of elements [%zu, %zu) of %zu here (%.1f MiB instead of %.1f)", tr->zero, tr->zlo,
	    tr->zhi, m->tt.total, 2.0 * n * sizeof(float) / (1 << 20), 2.0 * m->tt.total * sizeof(float) / (1 << 20));
	return RL_OK;
}

/* After an update: ZeRO-1 zeroes the full gradients; ZeRO-2's full buffer
 * is clear already (each bucket once reduced), its shard is zeroed. */
static void
zero_clear_grads(trainer *tr)
{
	if (tr->zero >= 2)
		tr->ops->zero(tr->ops, tr->zg, (tr->zhi - tr->zlo) * sizeof(float));
	else
		rl_model_zero_grad(tr->m);
}

/* Test hook (rl-train-zero3.bats, the shards read in place):
 * RL_TRAIN_TEST_SLOW_ADAMW=R makes rank R sleep 0.3 s before writing its
 * shard, so that a rank reading it before it is written would read the old
 * weights. */
static void
slow_adamw_hook(const trainer *tr)
{
	const char *e = getenv("RL_TRAIN_TEST_SLOW_ADAMW");

	if (e && *e && atoi(e) == tr->rank)
		usleep(300000);
}

/* One AdamW update, ZeRO-1 (ZeRO-2: the shard's gradients summed already): reduce-scatter the gradients, the global norm
 * from every shard's sum of squares, AdamW on the own shard (tensor by
 * tensor, for the weight-decay flags), all-gather the parameters.  The same
 * arithmetic as rl_model_step on the same sums. */
int
rli_zero_step(trainer *tr, const rl_adamw *p, float *grad_norm)
{
	rl_ops *o = tr->ops;
	rl_model *m = tr->m;
	size_t total = m->tt.total, lo = tr->zlo, hi = tr->zhi;
	double t0 = rl_now(), ss, tc;
	float scale = 1.0f;
	int rv;

	/* the caller counts this call as model time: the communication is t_comm's;
	 * ZeRO-2's gradients are reduced already, in the shard's own buffer */
	if ((rv = o->sync(o)) != 0 || (rv = rli_zero3_join(tr)) != 0 ||
	    (tr->zero == 1 && (rv = rl_comm_reduce_scatter(tr->comm, m->grads, total)) != 0))
		return rv;
	tc = rl_now() - t0;
	if (tr->zero == 1)
		tr->t_rs += tc;
	float *g = tr->zero >= 2 ? tr->zg - lo : m->grads; /* g[e]: element e's gradient, e in [lo, hi) */
	ss = hi > lo ? o->sumsq(o, g + lo, hi - lo) : 0.0;
	if ((rv = rl_comm_host_allreduce_f64(tr->comm, &ss, 1)) != 0)
		return rv;
	double norm = sqrt(ss);
	*grad_norm = (float)norm;
	if (!isfinite(norm)) {
		rl_warn("gradient norm is %g; step skipped", norm);
		zero_clear_grads(tr);
		return o->status(o);
	}
	if (p->max_grad_norm > 0)
		scale = (float)RL_MIN(1.0, p->max_grad_norm / (norm + 1e-6));
	m->step++;
	rli_zero3_release(tr); /* what m->params holds is about to be stale */
	slow_adamw_hook(tr);
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		size_t a = RL_MAX(t->off, lo), b = RL_MIN(t->off + t->n, hi);
		if (a >= b)
			continue;
		o->adamw(o, tr->z3p.zp ? tr->z3p.zp + (a - lo) : m->params + a, NULL, g + a, tr->zm + (a - lo), tr->zv + (a - lo), b - a,
		    rl_adamw_lr(p, t), p->beta1, p->beta2, p->eps,
		    (t->flags & RL_T_DECAY) ? p->weight_decay : 0.0f, m->step, scale);
	}
	zero_clear_grads(tr);
	if (tr->z3p.zp && tr->z3p.peer) {
		/* the shards read in place: none is read before every rank wrote its
		 * own (a wait of the gathers) */
		t0 = rl_now();
		if ((rv = o->sync(o)) != 0 || (rv = rl_comm_barrier(tr->comm)) != 0)
			return rv;
		t0 = rl_now() - t0;
		tr->t_gather += t0;
		tr->t_comm += t0;
		tr->t_model -= t0;
	}
	if (tr->z3p.zp) /* no all-gather: the next passes gather unit by unit */
		return o->status(o);
	t0 = rl_now();
	if ((rv = o->sync(o)) != 0 || (rv = rl_comm_allgather_shards(tr->comm, m->params, total)) != 0)
		return rv;
	tr->t_gather += rl_now() - t0;
	tc += rl_now() - t0;
	tr->t_comm += tc;
	tr->t_model -= tc;
	return rl_model_params_changed(m);
}

int
rli_zero_ckpt_id(trainer *tr)
{
	if (tr->rank == 0) {
		/* unique enough to tell one save from another: time, process, step */
		double t = rl_now();
		long pid = (long)getpid();
		uint64_t x = rl_fnv1a(RL_FNV1A_INIT, &t, sizeof t);
		x = rl_fnv1a(x, &pid, sizeof pid);
		tr->ckpt_id = rl_fnv1a(x, &tr->m->version, sizeof tr->m->version);
	}
	return rl_comm_host_broadcast(tr->comm, &tr->ckpt_id, sizeof tr->ckpt_id, 0);
}

int
rli_zero_save_shards(trainer *tr, int ok)
{
	rl_ckpt_shards sh = { tr->world, tr->ckpt_id };
	char dir[4200];
	int rv, mine, *all;

	tr->shard_pending = 0;
	if ((rv = rl_comm_host_broadcast(tr->comm, &ok, sizeof ok, 0)) != 0)
		return rv;
	if (!ok) {
		if (tr->rank != 0)
			rl_error("rank 0 could not write step %d's checkpoint; no optimizer shard written", tr->m->version);
		return RL_EIO;
	}
	snprintf(dir, sizeof dir, "%s/step-%08d", tr->o->out_dir, tr->m->version);
	mine = rl_ckpt_write_opt_shard(tr->m, dir, &sh, tr->rank, tr->zlo, tr->zhi, tr->zm, tr->zv);
	if (!(all = rl_try_malloc(sizeof *all * (size_t)tr->world, "shard statuses")))
		return RL_ENOMEM;
	/* trainer_state.json, which makes the directory a full checkpoint, only
	 * after every shard is in */
	if ((rv = rl_comm_host_allgather(tr->comm, all, &mine, sizeof mine)) == 0)
		for (int r = 0; r < tr->world; r++)
			if (all[r] != 0) {
				rl_error("rank %d could not write its optimizer shard in '%s'; step %d is not a full "
				    "checkpoint", r, dir, tr->m->version);
				rv = RL_EIO;
				break;
			}
	free(all);
	return rv;
}

/* The fingerprints below are FNV-1a started from FP_INIT, not from FNV's
 * offset basis RL_FNV1A_INIT (a digit short of it): the weights checksum is
 * printed (-v) and compared between ranks, and keeps the values it has. */
#define FP_INIT 1469598103934665603ull

/* FNV-1a over the bytes of the master weights from table element from on
 * (downloaded in pieces). */
static int
weights_hash(trainer *tr, size_t from, uint64_t *out)
{
	size_t total = (tr->m->tt.total - from) * sizeof(float), piece = (size_t)4 << 20;
	uint8_t *h = rl_try_malloc(RL_MIN(piece, total) + 1, "checksum buffer");
	uint64_t x = FP_INIT;
	int rv = RL_OK;

	if (!h)
		return RL_ENOMEM;
	for (size_t off = 0; off < total; off += piece) {
		size_t k = RL_MIN(piece, total - off);
		tr->ops->download(tr->ops, h, (const uint8_t *)(tr->m->params + from) + off, k);
		if ((rv = tr->ops->status(tr->ops)) != 0)
			break;
		x = rl_fnv1a(x, h, k);
	}
	free(h);
	*out = x;
	return rv;
}

/* Every rank's weights must be bitwise rank 0's: the optimizer steps are
 * identical only if the gradients, options and starting points are.  With
 * LoRA and ZeRO-3 the adapters (whole on every rank) are compared. */
int
rli_dp_check_weights(trainer *tr)
{
	uint64_t mine, *all;
	int rv;

	if (tr->z3p.zp && !tr->m->lora)
		return RL_OK; /* ZeRO-3: each rank holds other weights; the gathers give all the same */
	if ((rv = weights_hash(tr, tr->z3p.zp ? tr->m->goff : 0, &mine)) != 0)
		return rv;
	if (!(all = rl_try_malloc(sizeof *all * (size_t)tr->world, "checksums")))
		return RL_ENOMEM;
	rv = rl_comm_host_allgather(tr->comm, all, &mine, sizeof mine);
	for (int r = 1; rv == 0 && r < tr->world; r++)
		if (all[r] != all[0]) {
			rl_error("after step %d the weights of rank %d differ from rank 0's (the ranks diverged)",
			    tr->m->version, r);
			rl_hint("every rank must run with the same options and input");
			rv = RL_ECHECKSUM;
		}
	free(all);
	if (rv == 0)
		rl_verbose("step %d: weights identical on all %d ranks (checksum %016llx)", tr->m->version, tr->world,
		    (unsigned long long)mine);
	return rv;
}

/* Every rank must be about to train the same step, or all stop: exchanges
 * (have a step, hash of the step's sample ids).  *go = 0: the input ended. */
int
rli_dp_agree_step(trainer *tr, int have, int *go)
{
	uint64_t mine[2] = { (uint64_t)have, FP_INIT }, *all;
	int rv, ends = 0;

	*go = have;
	if (tr->world == 1)
		return RL_OK;
	for (int g = 0; have && g < tr->ngroups; g++)
		for (int i = 0; i < tr->groups[g].size; i++) {
			const rl_sample *q = &tr->groups[g].s[i];
			mine[1] = rl_fnv1a(mine[1], &q->id, sizeof q->id);
			mine[1] = rl_fnv1a(mine[1], &q->reward, sizeof q->reward);
			mine[1] = rl_fnv1a(mine[1], q->prompt, sizeof(int32_t) * (size_t)q->plen);
			mine[1] = rl_fnv1a(mine[1], q->response, sizeof(int32_t) * (size_t)q->rlen);
		}
	if (!(all = rl_try_malloc(sizeof mine * (size_t)tr->world, "step fingerprints")))
		return RL_ENOMEM;
	if ((rv = rl_comm_host_allgather(tr->comm, all, mine, sizeof mine)) != 0)
		goto out;
	for (int r = 0; r < tr->world; r++)
		ends += all[2 * r] == 0;
	if (ends == tr->world) {
		*go = 0;
	} else if (ends > 0) {
		for (int r = 0; r < tr->world; r++)
			if (all[2 * r] == 0) {
				rl_error("rank %d ran out of input before step %d while rank %d has a full step", r,
				    tr->m->version + 1, all[0] ? 0 : (r + 1) % tr->world);
				break;
			}
		rl_hint("with several ranks every rank reads the whole input (the same file or stream)");
		rv = RL_EINVAL;
	} else {
		for (int r = 1; r < tr->world; r++)
			if (all[2 * r + 1] != all[1]) {
				rl_error("step %d: rank %d has other groups than rank 0", tr->m->version + 1, r);
				rl_hint("with several ranks every rank reads the whole input (the same file or stream)");
				rv = RL_EINVAL;
				break;
			}
	}
out:
	free(all);
	return rv;
}

/* ZeRO-3 (rl_model_open_part): this rank's shard of m's table read from
 * the files, no other page of m->params written (its resident bytes into
 * *pres); the outcome agreed by every rank (a sum of failures), so that a
 * rank whose range holds a bad tensor stops all of them, each with an
 * error, none left waiting in a collective.  what: the model, for them. */
static int
load_shard(trainer *tr, rl_model *m, const char *what, double *pres)
{
	size_t lo, hi;
	double bad;
	int rv, r2;

	rl_comm_shard(tr->comm, z3_end(m), tr->rank, &lo, &hi);
	rv = rl_model_load_range(m, lo, hi);
	bad = rv != 0;
	if ((r2 = rl_comm_host_allreduce_f64(tr->comm, &bad, 1)) != 0)
		return r2;
	if (bad == 0) {
		*pres = model_resident(tr, m, NULL, 0);
		rl_verbose("read elements [%zu, %zu) of %zu of the %s (this rank's shard)", lo, hi, m->tt.total, what);
		return RL_OK;
	}
	if (rv == 0)
		rl_error("rank %d: %.0f other rank%s could not read %s shard of the %s (said above)", tr->rank, bad,
		    bad > 1 ? "s" : "", bad > 1 ? "their" : "its", what);
	return rv ? rv : RL_EFORMAT;
}

int
rli_zero3_ref_load(trainer *tr)
{
	rl_model *ref = tr->ref;
	size_t lo, hi;
	int rv;

	if ((rv = load_shard(tr, ref, "reference model", &tr->ref_load_pres)) != 0 ||
	    (rv = rl_model_params_changed(ref)) != 0)
		return rv;
	rl_comm_shard(tr->comm, ref->tt.total, tr->rank, &lo, &hi);
	/* forward only, always in the same direction: nothing kept gathered */
	return z3_open(tr, &tr->z3r, ref, lo, hi, 0, &tr->ref_load_pres, &tr->ref_pres_peak);
}

/* LoRA with ZeRO-3: the frozen base [0, goff) sharded as ZeRO-3 shards a
 * whole table (its shard read by load_shard), the adapters and their AdamW
 * state whole here as without ZeRO (tr->zero 0: rl_model_step updates them
 * after the all-reduce). */
static int
lora_z3_open(trainer *tr)
{
	size_t lo, hi;
	int rv;

	rl_comm_shard(tr->comm, tr->m->goff, tr->rank, &lo, &hi);
	if ((rv = z3_open(tr, &tr->z3p, tr->m, lo, hi, tr->o->zero3_keep, &tr->load_pres, &tr->pres_peak)) != 0)
		return rv;
	rl_verbose("ZeRO-3 with LoRA: elements [%zu, %zu) of the frozen base's %zu here, the %zu of the adapters "
	    "whole", lo, hi, tr->m->goff, tr->m->tt.total - tr->m->goff);
	return tr->ops->status(tr->ops);
}

int
rli_dp_start(trainer *tr)
{
	size_t nb = tr->m->tt.total * sizeof(float), nob = (tr->m->tt.total - tr->m->goff) * sizeof(float);
	int rv, st = tr->m->step, *steps;

	/* one starting point: rank 0's weights (and optimizer state on --resume);
	 * ZeRO-3: each rank's shard read from the files by itself (with LoRA
	 * rank 0's adapters beside it) */
	if (tr->m->part_set != NULL) {
		rv = load_shard(tr, tr->m, "model", &tr->load_pres);
		if (rv == 0 && tr->m->lora)
			rv = rl_comm_broadcast(tr->comm, tr->m->params + tr->m->goff, nob, 0);
	} else
		rv = rl_comm_broadcast(tr->comm, tr->m->params, nb, 0);
	if (rv != 0 ||
	    (tr->resumed && tr->m->m && ((rv = rl_comm_broadcast(tr->comm, tr->m->m, nob, 0)) != 0 ||
	    (rv = rl_comm_broadcast(tr->comm, tr->m->v, nob, 0)) != 0)))
		return rv;
	if ((rv = rl_model_params_changed(tr->m)) != 0)
		return rv;
	if (!(steps = rl_try_malloc(sizeof *steps * (size_t)tr->world, "steps of the ranks")))
		return RL_ENOMEM;
	rv = rl_comm_host_allgather(tr->comm, steps, &st, sizeof st);
	for (int r = 1; rv == 0 && r < tr->world; r++)
		if (steps[r] != steps[0]) {
			rl_error("rank %d starts at step %d, rank 0 at step %d", r, steps[r], steps[0]);
			rl_hint("every rank must --resume from the same checkpoint directory");
			rv = RL_EINVAL;
		}
	free(steps);
	if (rv != 0 || (tr->o->zero && (rv = tr->m->lora ? lora_z3_open(tr) : zero_open(tr)) != 0))
		return rv;
	/* the reference (--ref) opened for ZeRO-3 (train.c): its shard, as the policy's */
	return tr->ref && tr->ref->part_set ? rli_zero3_ref_load(tr) : RL_OK;
}

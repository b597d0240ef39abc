/*
 * comm_shm.c — the shared-memory channel of one ring edge (see comm_shm.h).
 *
 * Layout of the memfd: a 4 KiB header page (magic, nonce, sizes, then the
 * producer's head counter and the consumer's tail counter on cache lines
 * of their own, each with a "sleeping" flag), then `slots` slots, each a
 * 64-byte slot header (the ring message header and the payload length)
 * followed by slot_bytes of payload, rounded up to whole pages.
 *
 * Waits spin briefly (a segment usually arrives within microseconds of the
 * other side's post), then sleep on a futex of the counter, so an idle rank
 * burns no CPU.  A side that is about to sleep sets its flag before it
 * reads the counter a last time, and the other side reads the flag after
 * it moves the counter (both sequentially consistent), so a post never
 * misses a sleeper; the futex's own compare closes the rest of the race.
 *
 * Leaves out: huge pages for the slots, cross-host use (the offer's
 * /proc/PID/fd path only opens on the producer's host).
 */
#include "compute/comm_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"

#define CHAN_MAGIC 0x31484353434c52ull /* "RLCSHC1" */
#define PAGE 4096u
#define SLOT_HDR 64u
#define SPINS 256

struct chan_hdr {
	uint64_t magic, nonce;
	uint64_t slot_bytes, stride;
	uint32_t slots, pad;
	_Alignas(64) _Atomic uint32_t head;     /* slots posted (producer) */
	_Atomic uint32_t head_sleep;            /* the consumer sleeps on head */
	_Alignas(64) _Atomic uint32_t tail;     /* slots released (consumer) */
	_Atomic uint32_t tail_sleep;            /* the producer sleeps on tail */
};

struct rli_shm_chan {
	struct chan_hdr *h;
	uint8_t *base;
	size_t map_bytes, stride, slot_bytes;
	uint32_t slots;
	uint32_t pos;           /* own counter: head for the producer, tail for the consumer */
	int fd;                 /* producer's memfd until rli_shm_chan_drop_fd; else -1 */
};

_Static_assert(sizeof(struct chan_hdr) <= PAGE, "channel header fits its page");

void
rli_shm_offer_local(rli_shm_offer *o)
{
	FILE *f;

	memset(o, 0, sizeof *o);
	gethostname(o->host, sizeof o->host - 1);
	if ((f = fopen("/proc/sys/kernel/random/boot_id", "r")) != NULL) {
		if (!fgets(o->boot_id, sizeof o->boot_id, f))
			o->boot_id[0] = 0;
		o->boot_id[strcspn(o->boot_id, "\n")] = 0;
		fclose(f);
	}
}

static size_t
stride_of(size_t slot_bytes)
{
	return (SLOT_HDR + slot_bytes + PAGE - 1) / PAGE * PAGE;
}

static uint8_t *
slot_at(const rli_shm_chan *ch, uint32_t i)
{
	return ch->base + PAGE + (size_t)(i % ch->slots) * ch->stride;
}

int
rli_shm_chan_create(rli_shm_chan **out, size_t slot_bytes, int slots, rli_shm_offer *offer)
{
	rli_shm_chan *ch;
	uint64_t nonce = 0;
	int rv = RL_EIO;

	*out = NULL;
	if (!(ch = calloc(1, sizeof *ch)))
		return RL_ENOMEM;
	ch->fd = -1;
	ch->slots = (uint32_t)slots;
	ch->slot_bytes = slot_bytes;
	ch->stride = stride_of(slot_bytes);
	ch->map_bytes = PAGE + ch->stride * (size_t)slots;
	if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) {
		rl_verbose("shared-memory ring: no random nonce: %s", strerror(errno));
		goto out;
	}
	if ((ch->fd = memfd_create("rlpipe-comm", MFD_CLOEXEC)) < 0) {
		rl_verbose("shared-memory ring: memfd_create: %s", strerror(errno));
		goto out;
	}
	if (ftruncate(ch->fd, (off_t)ch->map_bytes) != 0) {
		rl_verbose("shared-memory ring: cannot size a %zu-byte memfd: %s", ch->map_bytes, strerror(errno));
		goto out;
	}
	ch->base = mmap(NULL, ch->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ch->fd, 0);
	if (ch->base == MAP_FAILED) {
		ch->base = NULL;
		rl_verbose("shared-memory ring: cannot map %zu bytes: %s", ch->map_bytes, strerror(errno));
		goto out;
	}
	ch->h = (struct chan_hdr *)ch->base;
	ch->h->magic = CHAN_MAGIC;
	ch->h->nonce = nonce;
	ch->h->slot_bytes = slot_bytes;
	ch->h->stride = ch->stride;
	ch->h->slots = ch->slots;
	rli_shm_offer_local(offer);
	offer->pid = (int32_t)getpid();
	offer->fd = ch->fd;
	offer->nonce = nonce;
	offer->slots = ch->slots;
	offer->slot_bytes = slot_bytes;
	*out = ch;
	return RL_OK;
out:
	rli_shm_chan_close(ch);
	return rv;
}

int
rli_shm_chan_attach(rli_shm_chan **out, const rli_shm_offer *offer, size_t slot_bytes, char why[160])
{
	rli_shm_offer here;
	rli_shm_chan *ch = NULL;
	struct stat st;
	char path[64];
	int fd = -1;

	*out = NULL;
	rli_shm_offer_local(&here);
	if (!here.boot_id[0]) {
		snprintf(why, 160, "cannot read /proc/sys/kernel/random/boot_id");
		return RL_ENOTSUP;
	}
	if (strncmp(here.host, offer->host, sizeof here.host) != 0 ||
	    strncmp(here.boot_id, offer->boot_id, sizeof here.boot_id) != 0) {
		snprintf(why, 160, "another host (%.40s)", offer->host);
		return RL_ENOTSUP;
	}
	if (offer->slot_bytes != slot_bytes || offer->slots < 1 || offer->slots > 64) {
		snprintf(why, 160, "segments of %llu bytes there, %zu here", (unsigned long long)offer->slot_bytes,
		    slot_bytes);
		return RL_ENOTSUP;
	}
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)offer->pid, (int)offer->fd);
	if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0) {
		snprintf(why, 160, "cannot open %s: %s (another pid namespace?)", path, strerror(errno));
		return RL_ENOTSUP;
	}
	if (!(ch = calloc(1, sizeof *ch))) {
		close(fd);
		snprintf(why, 160, "out of memory");
		return RL_ENOTSUP;
	}
	ch->fd = -1;
	ch->slots = offer->slots;
	ch->slot_bytes = slot_bytes;
	ch->stride = stride_of(slot_bytes);
	ch->map_bytes = PAGE + ch->stride * (size_t)ch->slots;
	if (fstat(fd, &st) != 0 || (size_t)st.st_size != ch->map_bytes) {
		snprintf(why, 160, "%s is not the channel offered (size)", path);
		goto fail;
	}
	ch->base = mmap(NULL, ch->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ch->base == MAP_FAILED) {
		ch->base = NULL;
		snprintf(why, 160, "cannot map %s: %s", path, strerror(errno));
		goto fail;
	}
	ch->h = (struct chan_hdr *)ch->base;
	if (ch->h->magic != CHAN_MAGIC || ch->h->nonce != offer->nonce || ch->h->slots != ch->slots ||
	    ch->h->slot_bytes != slot_bytes || ch->h->stride != ch->stride) {
		snprintf(why, 160, "%s is not the channel offered (nonce)", path);
		goto fail;
	}
	close(fd);
	*out = ch;
	return RL_OK;
fail:
	close(fd);
	rli_shm_chan_close(ch);
	return RL_ENOTSUP;
}

void
rli_shm_chan_drop_fd(rli_shm_chan *ch)
{
	if (ch && ch->fd >= 0) {
		close(ch->fd);
		ch->fd = -1;
	}
}

void
rli_shm_chan_close(rli_shm_chan *ch)
{
	if (!ch)
		return;
	if (ch->base)
		munmap(ch->base, ch->map_bytes);
	rli_shm_chan_drop_fd(ch);
	free(ch);
}

static void
futex_wait(_Atomic uint32_t *addr, uint32_t val, int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	/* shared, not FUTEX_PRIVATE: the other side is another process */
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void
futex_wake(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static inline void
relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Waits until ready(ctr) (the counter moved by the other side), up to ms;
 * sleeps on ctr with *sleep set.  1 when ready. */
static int
wait_counter(_Atomic uint32_t *ctr, _Atomic uint32_t *sleep, uint32_t want_ne, uint32_t lim, int producer, int ms)
{
	double t0 = 0;
	uint32_t v;

	/* producer: ready while pos - tail < slots; consumer: while head != pos */
#define READY(v) (producer ? want_ne - (v) < lim : (v) != want_ne)
	for (int i = 0; i < SPINS; i++) {
		v = atomic_load(ctr);
		if (READY(v))
			return 1;
		relax();
	}
	t0 = rl_now();
	for (;;) {
		double left_ms = ms - (rl_now() - t0) * 1000.0;
		atomic_store(sleep, 1);
		v = atomic_load(ctr);
		if (READY(v)) {
			atomic_store(sleep, 0);
			return 1;
		}
		if (left_ms <= 0) {
			atomic_store(sleep, 0);
			return 0;
		}
		futex_wait(ctr, v, left_ms < 1 ? 1 : (int)left_ms);
		atomic_store(sleep, 0);
		if (READY(atomic_load(ctr)))
			return 1;
	}
#undef READY
}

int
rli_shm_chan_reserve(rli_shm_chan *ch, int ms, uint8_t **hdr, uint8_t **data)
{
	if (!wait_counter(&ch->h->tail, &ch->h->tail_sleep, ch->pos, ch->slots, 1, ms))
		return RL_ETIMEDOUT;
	*hdr = slot_at(ch, ch->pos);
	*data = *hdr + SLOT_HDR;
	return RL_OK;
}

void
rli_shm_chan_post(rli_shm_chan *ch, size_t len)
{
	uint64_t l = len;
	memcpy(slot_at(ch, ch->pos) + RLI_SHM_MSG_HDR, &l, sizeof l);
	ch->pos++;
	atomic_store(&ch->h->head, ch->pos);
	if (atomic_load(&ch->h->head_sleep))
		futex_wake(&ch->h->head);
}

int
rli_shm_chan_peek(rli_shm_chan *ch, int ms, const uint8_t **hdr, const uint8_t **data, size_t *len)
{
	uint64_t l;

	if (!wait_counter(&ch->h->head, &ch->h->head_sleep, ch->pos, 0, 0, ms))
		return RL_ETIMEDOUT;
	*hdr = slot_at(ch, ch->pos);
	memcpy(&l, *hdr + RLI_SHM_MSG_HDR, sizeof l);
	if (l > ch->slot_bytes)
		return RL_EFORMAT;
	*data = *hdr + SLOT_HDR;
	*len = (size_t)l;
	return RL_OK;
}

void
rli_shm_chan_release(rli_shm_chan *ch)
{
	ch->pos++;
	atomic_store(&ch->h->tail, ch->pos);
	if (atomic_load(&ch->h->tail_sleep))
		futex_wake(&ch->h->tail);
}

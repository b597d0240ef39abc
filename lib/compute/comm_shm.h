/*
 * comm_shm.h — one directed edge of the CPU ring through shared memory: a
 * single-producer/single-consumer queue of a few fixed-size slots in a
 * memfd, with head/tail counters and futex waits.  comm.c uses it for the
 * bulk bytes of the collectives when both ends of an edge are on one host;
 * the nng sockets stay the control plane (hello, abort, goodbye, faults).
 *
 * The producer creates the channel and describes it in an offer (sent in
 * the ring hello); the consumer attaches by opening /proc/PID/fd/FD of the
 * producer's memfd, which works only on the same host and in the same pid
 * namespace, and checks the offer's random nonce in the mapped header, so a
 * stale or foreign file is never taken for the channel.
 *
 * Leaves out: more than one producer or consumer, slots of varying size,
 * waits longer than one call's slice (the caller loops, checking faults).
 * Thread-safety: the producer side and the consumer side each from one
 * thread at a time.
 */
#ifndef RL_COMM_SHM_H
#define RL_COMM_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct rli_shm_chan rli_shm_chan;

#define RLI_SHM_MSG_HDR 16   /* bytes of message header stored with each slot */

/* What the consumer needs to attach: sent in the ring hello. */
typedef struct rli_shm_offer {
	char host[64];          /* gethostname */
	char boot_id[40];       /* /proc/sys/kernel/random/boot_id */
	int32_t pid, fd;        /* the producer's memfd */
	uint64_t nonce;         /* random, also in the mapped header */
	uint32_t slots;
	uint32_t pad;
	uint64_t slot_bytes;    /* payload bytes a slot holds (the ring segment) */
} rli_shm_offer;

/* Fills the host and boot id of this machine into o (zeroed first). */
void rli_shm_offer_local(rli_shm_offer *o);

/* Producer: a channel of `slots` slots of slot_bytes; *offer describes it.
 * RL_ENOMEM, RL_EIO (memfd/mmap failed, logged as verbose: the caller falls
 * back to the sockets).  *out is the caller's (rli_shm_chan_close). */
int rli_shm_chan_create(rli_shm_chan **out, size_t slot_bytes, int slots, rli_shm_offer *offer);
/* Consumer: maps the channel of an offer whose slot size must be
 * slot_bytes.  On failure RL_ENOTSUP with the reason in why (another host,
 * another pid namespace, sizes differ, ...). */
int rli_shm_chan_attach(rli_shm_chan **out, const rli_shm_offer *offer, size_t slot_bytes, char why[160]);
/* Producer: closes the memfd once the consumer has mapped it (the mapping
 * keeps the memory; nothing is left behind when both processes exit). */
void rli_shm_chan_drop_fd(rli_shm_chan *ch);
void rli_shm_chan_close(rli_shm_chan *ch);   /* NULL ok */

/* Producer: waits up to ms for a free slot; *hdr (RLI_SHM_MSG_HDR bytes)
 * and *data (slot_bytes) are the slot's, to fill before post.  RL_OK or
 * RL_ETIMEDOUT. */
int rli_shm_chan_reserve(rli_shm_chan *ch, int ms, uint8_t **hdr, uint8_t **data);
/* Producer: the reserved slot holds len payload bytes; hands it over. */
void rli_shm_chan_post(rli_shm_chan *ch, size_t len);
/* Consumer: waits up to ms for the next slot; its header, payload and
 * length stay valid until release.  RL_OK, RL_ETIMEDOUT, or RL_EFORMAT for
 * a length beyond the slot (a corrupt channel). */
int rli_shm_chan_peek(rli_shm_chan *ch, int ms, const uint8_t **hdr, const uint8_t **data, size_t *len);
/* Consumer: gives the slot seen by peek back to the producer. */
void rli_shm_chan_release(rli_shm_chan *ch);

#endif

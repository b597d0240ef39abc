/*
 * comm.h — the communicator for data parallelism: rank, world size, sum
 * all-reduce of f32 buffers, broadcast, barrier, and small host-side
 * collectives (all-gather, f64 sum) for counts and checksums.
 *
 * Backends:
 * - "cpu": a ring over nng pair0 TCP connections (rank r sends to r+1 and
 *   receives from r-1).  All-reduce is reduce-scatter + all-gather in
 *   segments, so every rank ends with bitwise the same sums.  Buffers in host
 *   memory; with a CUDA rl_ops they are staged through the host.
 * - "nccl" (HAVE_NCCL builds): NCCL on device buffers from the CUDA rl_ops,
 *   non-blocking communicator polled with a deadline; the nng ring stays up
 *   as the control plane (host collectives, fault detection).
 * "auto" picks nccl for a CUDA rl_ops when the build has NCCL, else cpu.
 *
 * Rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT (nng req/rep); every
 * other rank sends its rank and ring port; rank 0 answers everyone with the
 * table of ring addresses (and the NCCL unique id).  Then the ring connects
 * and says hello; a barrier ends rl_comm_open.
 *
 * Faults: every wait is sliced (100 ms) and bounded by the timeout; a peer
 * whose connection drops is noticed at once (its process died), and the
 * failing rank tells the next one, so every survivor fails with a message
 * naming the rank that went away.  A communicator that failed stays failed.
 *
 * Leaves out: IPv6 rendezvous, ranks joining late, overlap with compute
 * (every call is synchronous), reductions other than sum.
 *
 * Thread-safety: one thread uses a communicator at a time.
 */
#ifndef RL_COMM_H
#define RL_COMM_H

#include <stddef.h>

#include "ops.h"

typedef struct rl_comm rl_comm;

typedef struct rl_comm_opts {
	int rank;               /* -1: from the environment */
	int world;              /* -1: from the environment */
	int local_rank;         /* -1: from the environment (else 0) */
	const char *master;     /* "HOST:PORT" of rank 0's rendezvous; NULL: MASTER_ADDR/MASTER_PORT */
	const char *backend;    /* "auto" (default), "cpu", "nccl" */
	double timeout;         /* seconds any one wait may take (default 600; env RL_COMM_TIMEOUT) */
	size_t seg_bytes;       /* ring segment size (default 1 MiB) */
	char master_buf[300];   /* storage for master when built from the environment */
} rl_comm_opts;

void rl_comm_opts_default(rl_comm_opts *o);

/* Fills what is unset (-1 / NULL) from the launch environment: torchrun's
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (default 29500),
 * else SLURM's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (with MASTER_ADDR),
 * else a single process (rank 0 of 1).  RL_COMM_TIMEOUT sets the timeout
 * unless already set.  Validates: world >= 1, 0 <= rank < world, a master
 * address when world > 1.  RL_EINVAL with the variable named. */
int rl_comm_opts_from_env(rl_comm_opts *o);

/* Joins the group described by o (complete: see rl_comm_opts_from_env).
 * ops (borrowed, may be NULL = host memory) says where the buffers of
 * rl_comm_allreduce / rl_comm_broadcast live.  World 1 needs no network.
 * Errors: RL_EINVAL (bad options), RL_ENET (cannot listen / connect),
 * RL_ETIMEDOUT (a rank did not join), RL_ENOTSUP (nccl in a build without
 * it), RL_EDEVICE (NCCL).  *out is the caller's (rl_comm_close). */
int rl_comm_open(rl_comm **out, const rl_comm_opts *o, rl_ops *ops);

/* The orderly end: a barrier and a goodbye round the ring, after which no
 * rank takes another's exit for a failure.  Call it on success only. */
int rl_comm_finish(rl_comm *c);
/* Leaves the group.  Without a successful rl_comm_finish first this rank's
 * exit is a failure: the next rank is told, and so all the others fail
 * naming this rank.  NULL ok. */
void rl_comm_close(rl_comm *c);

int rl_comm_rank(const rl_comm *c);
int rl_comm_world(const rl_comm *c);
int rl_comm_local_rank(const rl_comm *c);
const char *rl_comm_backend(const rl_comm *c);   /* "cpu", "nccl", or "single" for world 1 */

/* Sum all-reduce in place: buf (n) f32 in the memory of the rl_ops given to
 * rl_comm_open.  Every rank gets bitwise the same result. */
int rl_comm_allreduce(rl_comm *c, float *buf, size_t n);
/* Broadcast bytes of buf (rl_ops memory) from root to every rank. */
int rl_comm_broadcast(rl_comm *c, void *buf, size_t bytes, int root);
int rl_comm_barrier(rl_comm *c);

/* Host memory, control plane (always the nng ring): out (world * bytes) gets
 * every rank's in (bytes) in rank order. */
int rl_comm_host_allgather(rl_comm *c, void *out, const void *in, size_t bytes);
/* Host memory, control plane (always the nng ring): bytes of buf go from
 * root to every rank (small messages: step data, flags). */
int rl_comm_host_broadcast(rl_comm *c, void *buf, size_t bytes, int root);
/* Host f64 sum, added in rank order on every rank (identical results);
 * meant for small n (counts, statistics). */
int rl_comm_host_allreduce_f64(rl_comm *c, double *buf, size_t n);

#endif

/*
 * comm.h — the communicator for data parallelism: rank, world size, sum
 * all-reduce of f32 buffers, broadcast, barrier, and small host-side
 * collectives (all-gather, f64 sum) for counts and checksums.
 *
 * Backends:
 * - "cpu": a ring over nng pair0 TCP connections (rank r sends to r+1 and
 *   receives from r-1); between two ranks on one host the bulk collectives'
 *   bytes go through shared memory instead (RL_COMM_SHM=0: TCP only).  All-reduce is reduce-scatter + all-gather in
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
 * Leaves out: IPv6 rendezvous, ranks joining late, reductions other than
 * sum.  Overlap with compute: only the bucketed all-reduce and reduce-scatter
 * (rl_comm_reducer).
 *
 * Thread-safety: one thread uses a communicator at a time (a reducer's
 * thread counts as using it from its first ready to its wait).
 */
#ifndef RL_COMM_H
#define RL_COMM_H

#include <stddef.h>

#include "compute/ops.h"

typedef struct rl_comm rl_comm;

typedef struct rl_comm_opts {
	int rank;               /* -1: from the environment */
	int world;              /* -1: from the environment */
	int local_rank;         /* -1: from the environment (else 0) */
	const char *master;     /* "HOST:PORT" of rank 0's rendezvous; NULL: MASTER_ADDR/MASTER_PORT */
	const char *backend;    /* "auto" (default), "cpu", "nccl" */
	double timeout;         /* seconds any one wait may take (default 600; env RL_COMM_TIMEOUT) */
	size_t seg_bytes;       /* ring segment size (default 1 MiB) */
	/* for hints, the options that set rank 0's address, the world size and
	 * the waits (NULL: data parallel's MASTER_ADDR/MASTER_PORT or
	 * --rendezvous, WORLD_SIZE or --world, RL_COMM_TIMEOUT or
	 * --comm-timeout); borrowed, must outlive the comm */
	const char *addr_opts, *world_opts, *timeout_opts;
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
/* How the bulk collectives travel on this rank's edge to the next rank
 * (to_next = 1) or from the previous one (0): "shm" (shared memory, both on
 * one host), "tcp", "nccl", or "none" for world 1. */
const char *rl_comm_transport(const rl_comm *c, int to_next);

/* Sum all-reduce in place: buf (n) f32 in the memory of the rl_ops given to
 * rl_comm_open.  Every rank gets bitwise the same result. */
int rl_comm_allreduce(rl_comm *c, float *buf, size_t n);
/* ZeRO-1 sharding of a buffer of n elements: rank r's shard is
 * [n r / N, n (r+1) / N) (N the world size). */
void rl_comm_shard(const rl_comm *c, size_t n, int rank, size_t *lo, size_t *hi);
/* Sum reduce-scatter in place on buf (n) f32 in rl_ops memory: afterwards
 * this rank's shard holds the sum over the ranks (computed by this rank; the
 * rest of buf holds partial sums).  NCCL needs n divisible by the world size
 * (RL_ENOTSUP otherwise). */
int rl_comm_reduce_scatter(rl_comm *c, float *buf, size_t n);
/* Sum reduce-scatter of the elements [lo, hi) of buf (n) f32, host memory
 * and the CPU ring only (RL_ENOTSUP otherwise): afterwards the elements of
 * [lo, hi) in this rank's shard of n (rl_comm_shard) hold the sum over the
 * ranks; the rest of [lo, hi) holds partial sums.  With lo = 0, hi = n it is
 * rl_comm_reduce_scatter.  ZeRO-2 reduces gradient buckets with it. */
int rl_comm_reduce_scatter_range(rl_comm *c, float *buf, size_t n, size_t lo, size_t hi);
/* All-gather in place: every rank's shard of buf (n) f32 goes to all ranks. */
int rl_comm_allgather_shards(rl_comm *c, float *buf, size_t n);

/* Bucketed all-reduce of one buffer whose parts become final one after the
 * other, from its end towards its start (gradients during a backward pass:
 * the last layers' first).  buf (n) f32 in rl_ops memory is cut into buckets
 * of `bucket` elements laid from the end (bucket k = [n-(k+1)B, n-kB),
 * clipped at 0), each reduced with rl_comm_allreduce's sum.
 * - overlap, host memory (cpu backend, host rl_ops): a communication thread
 *   reduces each bucket as soon as rl_comm_reducer_ready says it is final,
 *   while the caller goes on computing the rest of buf;
 * - overlap, nccl: each final bucket is queued on the communicator's stream
 *   (after the compute queued so far), and runs while later compute does;
 * - otherwise (overlap 0, or a device rl_ops staged through the host): every
 *   bucket is reduced in rl_comm_reducer_wait, in the same order.
 * Every rank must see the same buckets (same n and bucket); results are
 * bitwise identical across ranks.  While a round is in flight (from the first
 * ready to wait) the caller must not use c, and must not write to the part of
 * buf it declared final.  *out is the caller's (rl_comm_reducer_destroy,
 * before rl_comm_close). */
typedef struct rl_comm_reducer rl_comm_reducer;
int rl_comm_reducer_create(rl_comm_reducer **out, rl_comm *c, float *buf, size_t n, size_t bucket, int overlap);
/* Elements [from, n) of buf are final for this round: buckets inside go out.
 * Returns the first error of the round so far (the round must still be
 * ended with rl_comm_reducer_wait). */
int rl_comm_reducer_ready(rl_comm_reducer *r, size_t from);
/* Waits until at most `keep` of the buckets declared final are not reduced
 * yet (without a thread: reduces the others here, in order), so that a
 * caller that frees reduced buckets (ZeRO-2) bounds what it holds.  The
 * first error of the round. */
int rl_comm_reducer_drain(rl_comm_reducer *r, int keep);
/* Ends the round: reduces what is left, waits for every bucket; buf then
 * holds the sums.  The first error of the round, else RL_OK. */
int rl_comm_reducer_wait(rl_comm_reducer *r);
/* Turns r into a bucketed reduce-scatter: each bucket [lo, hi) goes through
 * rl_comm_reduce_scatter_range(buf, n, lo, hi), leaving this rank's shard of
 * n summed; then done(ctx, lo, hi) runs (on the communication thread when
 * overlapped, else in wait), e.g. to take the shard's part and clear the
 * bucket.  Before the first round.  RL_ENOTSUP unless the CPU ring and host
 * memory (or world 1). */
int rl_comm_reducer_scatter(rl_comm_reducer *r, void (*done)(void *ctx, size_t lo, size_t hi), void *ctx);
/* Buckets of the last round declared final while some of buf was not yet
 * (a ready with from > 0): those that could overlap (*total: all of them). */
int rl_comm_reducer_early(const rl_comm_reducer *r, int *total);
/* 1 when buckets really overlap with the caller's work (thread or stream). */
int rl_comm_reducer_overlaps(const rl_comm_reducer *r);
void rl_comm_reducer_destroy(rl_comm_reducer *r);   /* NULL ok; ends a round in flight first */

/* Broadcast bytes of buf (rl_ops memory) from root to every rank. */
int rl_comm_broadcast(rl_comm *c, void *buf, size_t bytes, int root);
int rl_comm_barrier(rl_comm *c);
/* From any thread: a wait on the ring in progress (within its 100 ms slice)
 * and every later call fail with RL_ECLOSED; then rl_comm_close tells the
 * others this rank failed.  For a thread blocked in a collective that its
 * owner must stop (the NCCL backend's device waits are not interrupted). */
void rl_comm_interrupt(rl_comm *c);
/* Sets how long a wait on the ring may take from now on (seconds; <= 0: no
 * limit, a peer that dies is still seen at once).  Between collectives, from
 * the thread that runs them. */
void rl_comm_set_timeout(rl_comm *c, double seconds);

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

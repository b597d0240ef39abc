/*
 * wgroup.h — a weights broadcast group: the trainer (rank 0) sends every new
 * version of its parameters to rollout workers (ranks 1..N-1) with one
 * collective broadcast over the communicator of comm.h: NCCL from GPU to
 * GPUs, the nng ring over TCP otherwise.  No server in between, no
 * serialisation: the f32 parameter buffer goes as it is, and each member
 * copies it into its model in place.
 *
 * Members receive on a thread of their own into one of two staging buffers,
 * so the trainer's broadcast never waits for a member to finish a generation
 * step: the newest complete version waits in one buffer while the next
 * arrives in the other (an older version not taken yet is dropped).  The
 * member takes it between its engine steps (rl_wgroup_take).
 *
 * Wire, per version: a 64-byte header by host broadcast (magic, version,
 * element count, a hash of the model's tensor table, the number of ranges),
 * then the elements: in one broadcast (rl_wgroup_send), or as that many
 * element ranges in table order, each a header (its index, first and end
 * element, the XXH64 of its bytes) and its elements (rl_wgroup_send_begin,
 * _range, _end: a root that has only part of its parameters at a time, a
 * ZeRO-3 trainer, sends each part while it has it; cpu backend only).
 * Members receive the whole version either way.  A member refuses a version
 * whose ranges come out of order, overlap, leave a gap, stop short or do
 * not match their checksums: the error names the range, the version is
 * never handed to the model (the one before stays), and the group ends.
 * A member whose model has another tensor table fails at the first version,
 * naming both.  Version -1 ends the group (rl_wgroup_close on the root).
 *
 * Faults are the communicator's: a member or trainer that dies makes the
 * others fail at once with its rank named.  The timeout (rl-rollout gives a
 * member its --weights-timeout) bounds the rendezvous, a member's wait for
 * a version it needs (rl_wgroup_wait) and for the trainer's end
 * (rl_wgroup_close); the receiving thread itself waits for the next version
 * without a limit, since a trainer may publish nothing for a long time
 * while the member generates.
 *
 * The end belongs to the trainer: a member that has finished its own work
 * waits for the trainer's end of the group (rl_wgroup_close), its output
 * closed first so that the trainer downstream sees the end of its input.
 *
 * Leaves out: trainer and member on the same GPU (NCCL refuses two ranks on
 * one device; use rl-sync's same-host transports), members joining late.
 */
#ifndef RL_WGROUP_H
#define RL_WGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct rl_wgroup rl_wgroup;

typedef struct rl_wgroup_opts {
	const char *addr;     /* HOST:PORT where the root listens for the rendezvous */
	int rank;             /* 0: the trainer; 1..world-1: members */
	int world;            /* trainer + members, >= 2 */
	const char *backend;  /* "auto" (nccl for a CUDA model when built with it), "cpu", "nccl" */
	double timeout;       /* seconds a wait may take; 0: RL_COMM_TIMEOUT, else 600 */
} rl_wgroup_opts;

/* Joins the group (blocks until every rank has joined, or the timeout) for
 * the parameters of m (borrowed; it must outlive the group).  Members start
 * their receiving thread.  *out is the caller's (rl_wgroup_close). */
int rl_wgroup_open(rl_wgroup **out, const rl_wgroup_opts *o, rl_model *m);
/* Root: sends m's parameters as version (>= 0) to every member; returns when
 * every member has them in a staging buffer. */
int rl_wgroup_send(rl_wgroup *g, int version);
/* Root: version (>= 0) in pieces (>= 1) element ranges of m's parameters:
 * begin announces it, each range sends m->params[lo, hi) as it is now
 * (the first from 0, each next from where the one before ended), end checks
 * that pieces ranges covered the table.  Between begin and end the caller
 * may change the parameters outside the ranges not yet sent (a ZeRO-3
 * trainer gathers the next unit there).  RL_ENOTSUP unless the group is on
 * the cpu backend and the parameters in host memory; RL_EINVAL for a range
 * out of order, nothing of it sent.  After any failure the group is left
 * with rl_wgroup_close(g, 0) (members would read the end as a range
 * missing). */
int rl_wgroup_send_begin(rl_wgroup *g, int version, int pieces);
int rl_wgroup_send_range(rl_wgroup *g, size_t lo, size_t hi);
int rl_wgroup_send_end(rl_wgroup *g);
/* Member: the newest version received and not taken yet, or -1 (*version);
 * the group's error once it failed (the first one, then every call). */
int rl_wgroup_poll(rl_wgroup *g, int *version);
/* Member: waits up to timeout seconds for a version not taken yet. */
int rl_wgroup_wait(rl_wgroup *g, double timeout, int *version);
/* Member: copies the pending version into m's parameters (then
 * rl_model_params_changed); *version gets it.  RL_ENOENT when none. */
int rl_wgroup_take(rl_wgroup *g, int *version);
/* Bytes one version carries. */
size_t rl_wgroup_bytes(const rl_wgroup *g);
/* Leaves the group.  ok: an orderly end (root: sends the end; member: waits
 * for the root's end, up to the timeout); else the others are told this rank
 * failed.  Returns the group's error, if any.  NULL ok. */
int rl_wgroup_close(rl_wgroup *g, int ok);

#endif

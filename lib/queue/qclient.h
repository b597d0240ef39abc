/*
 * qclient.h — the client side of rl-queue, used by every stage:
 *
 *   rl-queue put / a data loader:  rl_qclient_put_prompts
 *   rl-rollout:  rl_qclient_lease_prompts -> generate -> rl_qclient_put_generated
 *                (the put completes the prompt lease; rl_qclient_ack for a
 *                prompt it gives up on, rl_qclient_release to hand it back)
 *   rl-reward:   rl_qclient_lease_generated -> score -> rl_qclient_put_scored
 *   rl-train:    rl_qclient_lease_scored (whole groups) -> train ->
 *                rl_qclient_ack, then rl_qclient_set_version after the step
 *   everyone:    rl_qclient_stats, rl_qclient_ping; rl_qclient_report (stage
 *                stats, sent by lib/queue/wstat.c's reporter thread)
 *
 * Every call is one request/reply over an nng REQ socket.  Puts are
 * idempotent (by record id), so the client retries them on timeouts, lost
 * connections and "busy" (exponential backoff with jitter, 1 ms .. 250 ms)
 * until opts.retry_ms has passed.  A lease that timed out is retried too:
 * the first one, if it was granted, expires on the broker.  Records that this
 * client already acknowledged and that come back (redelivered after a lease
 * expired) are dropped from the lease and acknowledged again (opts.dedup).
 *
 * A broker that does not answer at all is told from one that answers "busy"
 * or "nothing to lease": after opts.broker_timeout_ms without any reply to a
 * request (a lease's own wait not counted) the client takes the broker for
 * gone, the request fails with RL_ETIMEDOUT (logged with the URL and the time
 * waited) and every later request fails at once (rl_qclient_gone).  A busy
 * reply is a reply: the stages (rl_qclient_opts_stage) retry busy for as long
 * as the broker answers it.  A broker restarted within the timeout (its
 * journal replayed) gets the request again and answers it.
 *
 * Bodies are zstd-compressed on the wire when opts.compress says so (auto:
 * off for ipc://, inproc:// and loopback tcp://, where compressing costs more
 * than it saves); a batch read from a stream keeps its frame and is sent
 * without recompression.
 *
 * Thread-safety: one rl_qclient per thread (open several for concurrency).
 */
#ifndef RL_QCLIENT_H
#define RL_QCLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/core.h"
#include "queue/qproto.h"
#include "stream/traj.h"

/* The stages' --broker-timeout default, in seconds: long enough for a broker
 * restarted by hand or by a supervisor to replay its journal (docs/queue.md). */
#define RL_QCLIENT_BROKER_TIMEOUT_S 300

typedef struct rl_qclient_opts {
	int timeout_ms;     /* one round trip, on top of a lease's wait; default 10000 */
	int retry_ms;       /* give up retrying one request after this long, busy or not; default
	                     * 60000; 0: no retries; -1: no such bound (broker_timeout_ms only) */
	int broker_timeout_ms; /* no reply at all for this long: the broker is gone (see above);
	                     * default 0: no such bound (retry_ms only) */
	int compress;       /* -1 auto (default), 0 off, 1 on */
	int level;          /* zstd level for bodies this client compresses; default 1 */
	size_t max_msg;     /* bound on a reply (and decompressed body); default RL_QP_MAX_MSG */
	int dedup;          /* drop redelivered records already acknowledged here (the last
	                     * 256K ids, ~6 MB once the first ack is made); default 1 */
} rl_qclient_opts;
void rl_qclient_opts_default(rl_qclient_opts *o);
/* rl_qclient_opts_stage: the defaults, and the rule of every stage's client
 * (rl-rollout, rl-reward, rl-train --queue): busy is retried while the broker
 * answers it, silence for broker_timeout_s seconds (0: for ever) ends it. */
void rl_qclient_opts_stage(rl_qclient_opts *o, double broker_timeout_s);

typedef struct rl_qclient rl_qclient;

/* rl_qclient_open: a client for the broker at url (nng URL; dialled in the
 * background, so the broker may start later).  o may be NULL (defaults).
 * RL_ENET when the URL is unusable (logged). */
int rl_qclient_open(rl_qclient **out, const char *url, const rl_qclient_opts *o);
void rl_qclient_close(rl_qclient *c);   /* accepts NULL */
/* While *stop is non-zero (a stage's SIGTERM flag), a failed or busy request
 * is not retried: a stage being stopped while the broker is gone must not
 * wait out retry_ms for every request it still makes.  stop may be NULL. */
void rl_qclient_set_stop(rl_qclient *c, const volatile sig_atomic_t *stop);
/* rl_qclient_gone: 1 once a request went unanswered for broker_timeout_ms
 * (logged then); from then on every request fails at once with
 * RL_ETIMEDOUT, so that a stage stopping on it waits no longer. */
int rl_qclient_gone(const rl_qclient *c);

/* A lease: the records (batch, owned) and what the broker said about it. */
typedef struct rl_qlease {
	uint64_t id;          /* 0: nothing leased */
	uint64_t deadline_ms; /* wall clock ms */
	uint64_t version;     /* trainer version in force when leased */
	int stage;
	rl_traj_batch *batch; /* owned; NULL until the first lease */
	uint32_t dropped;     /* redelivered records dropped by dedup */
	uint32_t aborts;      /* the broker's early stops so far (rl_qlease_info.aborts) */
} rl_qlease;
void rl_qlease_init(rl_qlease *l);
void rl_qlease_fini(rl_qlease *l);   /* accepts an initialised, unused lease */
static inline size_t rl_qlease_count(const rl_qlease *l) { return l->batch ? rl_traj_batch_count(l->batch) : 0; }

/* ---- puts: b is borrowed (its kept frame, if any, is sent as-is when compression
 * is on and the frame header holds the content size; else the payload is sent,
 * compressed when compression is on) ------------------------------------------
 * Errors: RL_EBUSY (still busy when retry_ms ran out), RL_ETIMEDOUT (no reply),
 * RL_EFORMAT / RL_ETOOBIG (the broker refused the batch; its reason logged). */
int rl_qclient_put(rl_qclient *c, int stage, rl_traj_batch *b, rl_qput_result *res);
int rl_qclient_put_prompts(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res);
int rl_qclient_put_generated(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res);
int rl_qclient_put_scored(rl_qclient *c, rl_traj_batch *b, rl_qput_result *res);
/* A raw batch payload (rl-trajectory(5) header + records) or one zstd frame
 * of it (frame != 0, with the content size in its header: RL_EFORMAT
 * otherwise): sent as given. */
int rl_qclient_put_raw(rl_qclient *c, int stage, const void *p, size_t n, int frame, rl_qput_result *res);

/* ---- leases ----------------------------------------------------------------------------
 * Waits up to wait_ms for work (long poll on the broker); RL_OK with
 * l->id == 0 and no records when none came.  l is reused (previous records
 * dropped).  Train leases hold whole groups: up to max samples, at least
 * min (0: 1) unless wait_ms ran out. */
int rl_qclient_lease(rl_qclient *c, const rl_qlease_req *req, rl_qlease *l);
int rl_qclient_lease_prompts(rl_qclient *c, uint32_t max, uint32_t group_size, uint32_t wait_ms, rl_qlease *l);
int rl_qclient_lease_generated(rl_qclient *c, uint32_t max, uint32_t wait_ms, rl_qlease *l);
int rl_qclient_lease_scored(rl_qclient *c, uint32_t max, uint32_t min, uint32_t wait_ms, rl_qlease *l);
/* rl_qclient_ack_lease: acknowledge every record of l (when it holds a
 * lease) and lease the next records into l, in one round trip (a trainer's
 * loop: lease, train, ack_lease, train, ...). */
int rl_qclient_ack_lease(rl_qclient *c, rl_qlease *l, const rl_qlease_req *req);

/* ---- acks ------------------------------------------------------------------------------
 * rl_qclient_ack: every record of l is done (training samples finished,
 * prompts given up).  rl_qclient_release: hand them back now.
 * rl_qclient_extend: renew the lease (long training steps).
 * rl_qclient_ack_ids: any kind (enum rl_qack) for some ids of lease id.
 * RL_ENOENT: the lease had expired (res->late counts the ids). */
int rl_qclient_ack(rl_qclient *c, const rl_qlease *l, rl_qack_result *res);
int rl_qclient_release(rl_qclient *c, const rl_qlease *l, rl_qack_result *res);
int rl_qclient_extend(rl_qclient *c, const rl_qlease *l, rl_qack_result *res);
int rl_qclient_ack_ids(rl_qclient *c, uint64_t lease_id, int kind, const uint64_t *ids, uint32_t n,
                       rl_qack_result *res);

/* rl_qclient_set_version: the trainer's policy version is now v; *now (may
 * be NULL) gets the broker's (the larger of the two). */
int rl_qclient_set_version(rl_qclient *c, uint64_t v, uint64_t *now);
/* The same, with the version also going down (a resumed trainer: see
 * rl_queue_rewind_version); a broker older than this sets max(v, its). */
int rl_qclient_rewind_version(rl_qclient *c, uint64_t v, uint64_t *now);
/* rl_qclient_stats: the broker's stats as JSON text (*json malloc'd, caller frees). */
int rl_qclient_stats(rl_qclient *c, char **json);
int rl_qclient_ping(rl_qclient *c);
/* rl_qclient_report: send a stage's stats report (JSON text, n bytes, at
 * most RL_QP_MAX_REPORT) once, without retries; failures are logged at the
 * verbose level only (a lost report is replaced by the next).  RL_EINVAL:
 * the broker does not know reports (older) or refused this one. */
int rl_qclient_report(rl_qclient *c, const char *json, size_t n);

#endif

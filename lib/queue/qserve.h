/*
 * qserve.h — the rl-queue broker on nng: a REP socket with a pool of contexts
 * (each its own receive -> handle -> reply cycle on an aio, so many clients
 * are served at once), long-polling leases, lease expiry on a timer and group
 * commit of the journal (one write + fdatasync covers every request that
 * arrived meanwhile; no reply leaves before its changes are durable).
 *
 * The HTTP listener (/metrics, /api/stats, the dashboard) is lib/queue/qhttp.c;
 * rl-queue serve feeds it rl_qserve_stats_json.
 */
#ifndef RL_QSERVE_H
#define RL_QSERVE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/core.h"
#include "queue/autok.h"
#include "queue/queue.h"

typedef struct rl_qserve_config {
	const char *listen;      /* nng URL; borrowed */
	rl_queue_config queue;
	size_t max_msg;          /* NNG_OPT_RECVMAXSZ and decompressed-body bound; 0: rl_qserve_auto_msg() */
	int max_conns;           /* connections at once; 0: rl_qserve_auto_conns() */
	int nctx;                /* concurrent requests (contexts); 0: 64 */
	int level;               /* zstd level of reply bodies for clients that accept zstd; 0: 1 */
	rl_autok_config autok;   /* with queue.auto_k: the rule that moves K (autok.h), evaluated
	                          * as stats reports arrive; each change logged and journaled */
} rl_qserve_config;

typedef struct rl_qserve rl_qserve;

/* Bodies being received count against --max-bytes.  nng reads a request
 * whole before the broker sees it, into a message of the size its frame
 * declares (up to max_msg), so each connection may hold max_msg bytes the
 * broker cannot yet count record by record; the broker bounds them as
 * connections x max_msg instead.  Defaults that keep that product within
 * max_bytes: max_msg = max_bytes / 64 clamped to [1 MiB, RL_QP_MAX_MSG],
 * and connections = max_bytes / max_msg, at least 64. */
size_t rl_qserve_auto_msg(uint64_t max_bytes);
int rl_qserve_auto_conns(uint64_t max_bytes, size_t max_msg);

/* rl_qserve_open: opens (and replays) the queue and listens.  Errors:
 * RL_ENET (cannot listen: logged with the URL), and rl_queue_open's. */
int rl_qserve_open(rl_qserve **out, const rl_qserve_config *cfg);
/* rl_qserve_run: serves until *stop becomes non-zero (a signal handler sets
 * it) or the journal fails (RL_EIO).  Call from one thread. */
int rl_qserve_run(rl_qserve *s, volatile sig_atomic_t *stop);
/* rl_qserve_stats_json: the broker's stats (what `rl-queue stat --json`
 * prints) as a NUL-terminated JSON object in *out (malloc'd; caller frees).
 * Takes the queue lock; safe from any thread while the server is open.
 * Errors: RL_ENOMEM. */
int rl_qserve_stats_json(rl_qserve *s, char **out);
/* Stops serving, writes pending journal ops, frees.  Accepts NULL. */
void rl_qserve_close(rl_qserve *s);

#endif

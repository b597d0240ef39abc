/*
 * qserve_workers.h — the broker's table of stage workers, fed by REPORT
 * requests (wstat.h describes the report) and shown in the stats JSON.
 * Private to lib/ (rli_): used by qserve.c and the unit tests.
 *
 * Per worker it keeps the latest totals, the busy fraction and rates over
 * its reports of the last RLI_WORKERS_WINDOW seconds (at least its last
 * interval; from its start until then), and a timeline of the busy
 * fractions of its last RLI_WORKERS_TIMELINE report intervals.  Workers not heard
 * from for RLI_WORKERS_TTL seconds are dropped (a final report marks a
 * worker exited; it stays listed until then); at most RLI_WORKERS_MAX are
 * kept (the longest silent one makes room).  The train steps from the
 * reports and the stages' rates and busy fractions (sampled at most once a
 * second) are kept for the whole run in at most RLI_WORKERS_POINTS points:
 * when they are all used, neighbours merge and a point covers twice as many
 * entries (the JSON says how many: steps_per_point, samples_per_point).
 *
 * Thread-safety: every function takes the table's own lock.
 */
#ifndef RL_QSERVE_WORKERS_H
#define RL_QSERVE_WORKERS_H

#include <stddef.h>

#include "base/core.h"

#define RLI_WORKERS_MAX 256
#define RLI_WORKERS_TTL 120.0        /* seconds */
#define RLI_WORKERS_SILENT 15.0      /* seconds without a report: not counted in stage rates */
#define RLI_WORKERS_WINDOW 10.0      /* seconds of reports the busy fraction and rates are taken over */
#define RLI_WORKERS_TIMELINE 60
#define RLI_WORKERS_POINTS 512

typedef struct rli_workers rli_workers;

int rli_workers_create(rli_workers **out);
void rli_workers_destroy(rli_workers *ws);   /* accepts NULL */

/* rli_workers_report: validates a report (json, n bytes, not necessarily
 * NUL-terminated) and stores it at monotonic time now (seconds).
 * RL_EFORMAT with the reason in why (whylen bytes) when any part is
 * malformed: the table is then unchanged.  RL_ENOMEM. */
int rli_workers_report(rli_workers *ws, const char *json, size_t n, double now, char *why, size_t whylen);

/* rli_workers_totals: the busy and idle seconds of the trainers and of the
 * rollout workers in the table, summed (workers past the TTL dropped first),
 * and the sum and count of |ppo_kl| over every train step taken; the inputs
 * of --max-staleness auto (autok.h). */
void rli_workers_totals(rli_workers *ws, double now, double *train_busy, double *train_idle, double *gen_busy,
    double *gen_idle, double *drift_sum, double *drift_n);

/* rli_workers_json: adds "workers", "stages" and, once a train step was
 * reported, "train" and "train_history" to obj (a cJSON object, passed as
 * void * to keep cJSON out of this header).  Drops workers past the TTL. */
int rli_workers_json(rli_workers *ws, void *obj, double now);

#endif

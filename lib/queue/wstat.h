/*
 * wstat.h — a stage's own stats, reported to rl-queue: what a worker did
 * (records, tokens), where its time went (busy computing vs idle waiting on
 * the queue or on weights), the GPU it runs on (utilisation and memory from
 * NVML, loaded with dlopen at run time), and for the trainer its step
 * metrics (reward mean, response length, KL, entropy, version, step time).
 *
 * A reporter thread with its own broker connection sends one REPORT every
 * interval (RL_STATS_INTERVAL seconds, default 2; 0 turns reports off) and a
 * last one, marked final, from rl_wstat_close.  The broker keeps the latest
 * report per worker (see qserve.c) and shows them on /metrics, /api/stats,
 * the dashboard and `rl-queue stat`.
 *
 * The report (JSON, at most RL_QP_MAX_REPORT bytes):
 *   {"role": "rollout"|"reward"|"train", "worker": ID, "device": "cpu"|"cuda:N",
 *    "uptime_s", "busy_s", "idle_s", "records", "tokens": totals since start,
 *    "final": bool,
 *    (busy_s of a rollout worker is slot-weighted: the integral over time of
 *    slots decoding / slots, idle_s the rest of its uptime; see
 *    rl_wstat_phase_part)
 *    "gpu": {"index", "name", "util", "mem_util", "mem_used", "mem_total"}  (only from NVML),
 *    "steps": [{"version", "reward_mean", "response_length", "ppo_kl", "kl_ref",
 *               "entropy", "step_s", "staleness_mean", "staleness_max"}, ...]
 *               (train: steps since the last report)}
 * ID is RL_WORKER_ID, else HOST:PID; characters outside [A-Za-z0-9._:@/+-]
 * become '_'.
 *
 * Leaves out: per-kernel timing, host CPU load, several GPUs per worker.
 * Thread-safety: every function may be called from any thread; a NULL
 * handle is accepted everywhere and does nothing (stages call the hooks
 * unconditionally).
 */
#ifndef RL_WSTAT_H
#define RL_WSTAT_H

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"

enum rl_wstat_phase { RL_WSTAT_IDLE = 0, RL_WSTAT_BUSY = 1 };

typedef struct rl_wstat rl_wstat;

/* rl_wstat_open: stats for a worker of role ("rollout", "reward", "train")
 * on device (borrowed: "cpu", "cuda", "cuda:N"; NULL = "cpu"), reported to
 * the broker at url.  The clock starts in the idle phase.  Never fatal to a
 * stage: RL_OK with *out == NULL when RL_STATS_INTERVAL is 0; RL_EINVAL for
 * a bad role or interval (logged); RL_ENOMEM, RL_ENET (logged). */
int rl_wstat_open(rl_wstat **out, const char *url, const char *role, const char *device);
/* Stops the reporter and sends the final report, unless the last report
 * found no broker (a broker that stops answering delays this by at most a
 * few seconds: 1.5 s to send, 1.5 s for the reply, per report), and frees.
 * Accepts NULL. */
void rl_wstat_close(rl_wstat *w);

/* The worker is now busy (computing) or idle (waiting on the queue or
 * weights): the time since the last change goes to the previous phase. */
void rl_wstat_phase(rl_wstat *w, int phase);
/* For a worker of several slots that learns after the fact how much of its
 * capacity an interval used (rl-rollout: the share of its slots an engine
 * step decoded): the time since the last change goes `part` (0..1) to busy
 * and the rest to idle, whatever the phase was; then the phase is entered.
 * Until the next part is known, an open busy interval counts at this part
 * (in reports sent meanwhile).  NaN or out of range: the phase decides. */
void rl_wstat_phase_part(rl_wstat *w, int phase, double part);
/* Counts work done: records (samples generated, scored or trained) and tokens. */
void rl_wstat_add(rl_wstat *w, uint64_t records, uint64_t tokens);
/* rl-train: one step's metrics line (the JSON object rl-train writes, as
 * text); the fields above are taken from it (verl names: step,
 * critic/score/mean, response_length/mean, actor/ppo_kl, actor/kl_loss,
 * actor/entropy, timing_s/step, staleness/mean, staleness/max), absent or
 * non-finite ones left out.  At
 * most 256 steps wait for the next report; older ones are dropped. */
void rl_wstat_train_metrics(rl_wstat *w, const char *json);

/* rl_wstat_report_json: the report as it would be sent now (malloc'd
 * NUL-terminated text in *out; the caller frees).  Steps are not taken out
 * of the queue.  For tests and `-v` dumps. */
int rl_wstat_report_json(rl_wstat *w, int final, char **out);

/* ---- NVML ---------------------------------------------------------------------------
 * libnvidia-ml.so.1 (RL_NVML_LIB overrides the name) loaded with dlopen; no
 * build dependency.  A device string "cuda[:N]" names the GPU: N is an index
 * into CUDA_VISIBLE_DEVICES when that is set (a number or a GPU UUID), else
 * the NVML index.  "cpu" or anything else: no GPU. */
typedef struct rl_nvml rl_nvml;
typedef struct rl_gpu_sample {
	int index;                 /* NVML index */
	char name[96];
	double util;               /* fraction of the last sample period a kernel ran, 0..1 */
	double mem_util;           /* fraction of it memory was read or written, 0..1 */
	double mem_used, mem_total; /* bytes */
} rl_gpu_sample;
/* RL_OK with *out set; RL_ENODEV when there is no GPU for device (not a CUDA
 * device, no library, NVML cannot start or finds no such GPU; the reason at
 * verbose level). */
int rl_nvml_open(rl_nvml **out, const char *device);
/* RL_OK and *s filled; RL_EDEVICE when NVML fails (the reason at verbose level). */
int rl_nvml_sample(rl_nvml *n, rl_gpu_sample *s);
void rl_nvml_close(rl_nvml *n);   /* accepts NULL */

#endif

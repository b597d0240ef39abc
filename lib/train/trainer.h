/*
 * trainer.h — the learner's state shared by the files of lib/train that
 * implement rl_train_run (train.h): train.c runs the loop, feed.c brings the
 * records in and forms the step's groups, step.c computes the update,
 * save.c writes and publishes checkpoints, metrics.c the metrics line, dp.c
 * what data parallelism adds (gradient all-reduce, ZeRO-1, agreement checks).
 * Internal to lib/train (and its unit tests): nothing here is a stable API.
 *
 * One trainer per rl_train_run; it owns every pointer in it (rli_train_fini
 * frees them all, NULL ones included).  Not thread-safe.
 */
#ifndef RL_TRAINER_H
#define RL_TRAINER_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "base/gset.h"
#include "base/progress.h"
#include "compute/comm.h"
#include "compute/ops.h"
#include "model/model.h"
#include "queue/qclient.h"
#include "queue/wstat.h"
#include "stream/traj.h"
#include "sync/wgroup.h"
#include "sync/wckpt.h"
#include "sync/wsync.h"
#include "tok/tokenizer.h"
#include "train/groups.h"
#include "train/tfevents.h"
#include "train/algo.h"
#include "train/opts.h"

/* One sequence of the step: a sample and where its values go. */
typedef struct seqref {
	rl_sample *s;
	int toff;       /* offset of its response tokens in the step's token arrays */
	float reward;   /* effective reward (KL-in-reward applied) */
	int skip;       /* --skip-zero-adv: every advantage 0, no forward/backward */
	double ref_lp;  /* DPO: the reference's log-prob of the response (summed over trained tokens) */
	int ntrain;     /* DPO: its trained tokens (loss_mask 1) */
} seqref;

/* ZeRO-3: one model whose parameters are sharded over the ranks (the
 * policy's, the reference's).  This rank holds the f32 master weights of
 * elements [zlo, zhi) of its flat table in zp; m->params is scratch holding
 * the unit being computed (unit, -1 none, -2 the whole model), the one
 * prefetched (pf) and those kept (kept, the most recent first, up to keep
 * elements: --zero3-keep). */
/* Slots of ZeRO-3's unit pool: the unit computed, the one prefetched, one spare
 * (a kept unit, or a tied head's embedding beside them) */
#define RLI_Z3_SLOTS 3

typedef struct rli_z3 {
	struct trainer *tr;
	rl_model *m;
	float *zp;
	size_t zlo, zhi;
	int unit, pf;
	int *kept, nkept;
	size_t keep;
	int emb_in_head;         /* the embedding unit is wte alone, and the head's (tied) */
	int ngather;             /* units gathered this step (dp/units_gathered, dp/ref_units_gathered) */
	int npooled;             /* ranges of them gathered into pool slots (dp/units_pooled) */
	double *pres_peak;       /* where the resident bytes' peak is kept (mincore, at each unit) */
	/* the pool of pages gathered units are mapped from (dp.c, "the unit pool"): a memfd of
	 * RLI_Z3_SLOTS slots of slot_bytes (0: no pool, every gather faults in fresh pages) */
	int pool_fd;
	size_t slot_bytes;
	struct rli_z3_slot {
		char *at;        /* where in m->params the slot is mapped now, NULL: not mapped */
		size_t bytes;    /* the length of that mapping */
		size_t held;     /* the slot's pages the memfd holds (the most ever mapped since a purge) */
	} slot[RLI_Z3_SLOTS];
	int pool_err;            /* a failed remap (m->params may have a hole): every later need fails */
	/* the shards read in place (dp.c): zp a memfd's shared mapping (zfd, -1: ops memory), and
	 * when every rank mapped every other's, peer[r] rank r's shard (peer[rank] = zp) and a
	 * gather copies from those, no collective; NULL: gathers through the ring */
	int zfd;
	size_t zpad;             /* bytes of the memfd before zp: element e at the in-page offset it has in m->params */
	const float **peer;
	size_t *peer_bytes;      /* the length of each peer's mapping (its pad included) */
	size_t *peer_pad;        /* each shard's pad (zpad) */
	int *peer_fd;            /* each shard's memfd, open (mapped gathers; peer_fd[rank] = zfd) */
	int map;                 /* gathers map the owners' whole pages into m->params rather than copy them */
	int nmapped;             /* ranges of the step's gathers mapped so (dp/units_mapped) */
} rli_z3;

typedef struct trainer {
	const rl_train_opts *o;
	rl_ops *ops;
	rl_model *m, *ref;
	int ref_base;            /* LoRA: the reference is m's base, its forward m's with the adapters
	                          * off (rl_train_ref_is_base); ref stays NULL */
	rl_tokenizer *tok;
	rl_grouper *gr;
	rl_traj_reader *rd;
	FILE *in;
	FILE *metrics;
	rl_tfevents *tf;
	int agg;
	/* the step's groups and sequences */
	rl_group *groups;
	int ngroups, cap_groups;
	seqref *seq;
	int nseq, cap_seq;
	/* --skip-zero-adv (docs/train.md): sequences whose advantages are all 0
	 * give an exactly zero gradient when the loss has no other term */
	int skip_zero;           /* on for this run */
	seqref *kseq;            /* the trained sequences of a range, compacted */
	int cap_kseq;
	int nskip;               /* sequences of the step skipped */
	int noverlong;           /* sequences of the step --overlong-filter masked out */
	long tok_skip, tok_all;  /* their response tokens, and the step's */
	float *adv_tok, *w_tok, *old_tok, *kl_tok; /* (step tokens) */
	double reward_kl;        /* --kl-in-reward: mean over sequences of their token-mean KL */
	int has_mask;         /* some record had a loss_mask: weight-0 tokens are left out of the metrics */
	uint8_t *mask_tok;    /* (step tokens) 1 = sampled (trained on), 0 = inserted (loss_mask 0) */
	float *val_tok, *ret_tok; /* (step tokens) PPO: V_old and GAE returns */
	int cap_tok;
	/* micro-batch host buffers (max_tokens) */
	int maxtok;
	int pack;                /* --micro-tokens: packed rows (step.c, pack_plan) */
	int32_t *h_tok, *h_tgt;
	int32_t *h_seg, *h_pos;  /* packed: segment and position ids (max_tokens) */
	int *h_off;              /* index of each sequence's first position in the micro-batch */
	seqref *pseq;            /* the sequences of a range in micro-batch order (micro_plan) */
	int *pbin;               /* micro-batch k is pseq[pbin[k], pbin[k + 1]) */
	int cap_pseq;
	int nbin;                /* micro-batches of the last micro_plan */
	int maxrow;              /* positions of the longest micro-batch row so far (tests) */
	float *h_old, *h_beh, *h_ref, *h_adv, *h_w, *h_stats, *h_lp, *h_ent;
	float *h_gspo;        /* gspo: the pi_old given to pg_loss (gspo_old) */
	float *h_vold, *h_ret, *h_v, *h_dv;   /* PPO (max_tokens each, one allocation) */
	float *d_dval;                         /* PPO: value gradient (max_tokens), backend */
	/* backend buffers: one allocation */
	void *d_mem;
	float *d_old, *d_beh, *d_ref, *d_adv, *d_w, *d_dlp, *d_dent, *d_stats;
	/* data position and counters */
	uint64_t records, groups_used, skip_records;
	/* --resume: records at or before skip_records still to read (ascending
	 * positions, trainer_state.json "records_pending"), the next one at ipend */
	uint64_t *pend;
	size_t npend, ipend;
	int groups_pending;      /* the final checkpoint: tr->groups were not trained */
	int resumed;             /* this run continues a checkpoint of --out (--resume, or auto) */
	double t_full;           /* rl_now() of the last full checkpoint (or of the start) */
	/* groups done: trained, or consumed and dropped (bad, no signal, a skipped
	 * step), never to be trained again; trainer_state.json "groups_done" */
	rl_gset done;
	/* --resume from a checkpoint with "groups_done" (the group rule): records
	 * of those groups (skip) are skipped wherever they come in the input; those
	 * of groups pending then (pend_groups) are read again, not counted as new */
	int by_group;
	rl_gset skip, pend_groups;
	uint64_t skipped_done;   /* records skipped by the group rule */
	uint64_t records_new;    /* records of groups neither done nor pending at the checkpoint */
	uint64_t dropped_nosignal, dropped_stale;
	uint64_t steps_skipped;  /* steps whose every update had a non-finite gradient norm */
	double t_wait;
	double t_model;  /* seconds in model forward/backward/AdamW this step */
	double t_pub;    /* seconds publishing the step's checkpoint */
	double t_ack;    /* seconds telling the broker the version and acknowledging */
	double t_begin;  /* when rl_train_run started: timing_s/elapsed counts from it */
	/* background publishing (save.c): the copy of the weights, the thread
	 * writing it, its version, outcome and seconds */
	struct rl_ckpt_snap *snap;
	pthread_t bg_th;
	int bg_running, bg_only, bg_version, bg_rv;
	double bg_s;
	rl_wsync *ws;    /* --sync */
	rl_wsync_client *wpc;    /* --push-parts: this rank's client */
	rl_wver *wpart;          /* --push-parts: the part pushed last, the next one's delta base */
	/* queue mode */
	rl_qclient *qc;
	rl_qlease lease;
	rl_traj *qt;
	/* leased records not yet acknowledged; trained: in a group done, waiting
	 * for the full checkpoint that covers it (docs/queue.md, exactly once),
	 * 2 while the broker has not been sent its TRAINED mark yet; renewed:
	 * rl_now() when its lease was last renewed (leased, marked or renewed) */
	struct { uint64_t id, lease; int trained; double renewed; } *held;
	double t_renew;          /* rl_now() of the last renewal of the leases held */
	double renew_s;          /* renew them this often: a third of the broker's lease (0: not known yet) */
	int last_full;           /* the last step's checkpoint was a full one */
	int lockfd;              /* 1 + the descriptor of rl_ckpt_lock_run on --out (0: none) */
	int have_full;           /* --out holds a full checkpoint of this run (resumed, or saved) */
	size_t nheld, capheld;
	uint64_t q_late;
	int last_gsize;          /* group size seen last (lease sizing) */
	double idle_since;       /* when the last records came (--idle-exit) */
	int qgone;               /* the broker stopped answering (--broker-timeout): rank 0's client
	                          * said so, or rank 0's end message (dp_send_lease) */
	rl_wstat *wst;           /* stats reported to the broker (wstat.h) */
	rl_progress prog;        /* steps, on a terminal */
	/* data parallelism */
	rl_comm *comm;           /* NULL: one process */
	rl_wgroup *wg;           /* --weights-group (rank 0) */
	int rank, world;
	int qfollow;             /* queue mode, rank > 0: records come from rank 0's leases */
	rl_comm_reducer *red;    /* the bucketed gradient all-reduce */
	int zero;                /* ZeRO stage 1, 2 or 3: this rank keeps the AdamW state of [zlo, zhi) only */
	size_t zlo, zhi;
	float *zm, *zv;          /* (zhi - zlo) AdamW moments of the shard, backend memory */
	void *gmap;              /* ZeRO-2/3 on the host: the mapping m->grads lies in (rli_dp_reducer_open) */
	size_t gmap_len;
	float *zg;               /* ZeRO-2: (zhi - zlo) gradients of the shard, summed over ranks and
	                          * micro-batches (host memory) */
	rli_z3 z3p;              /* ZeRO-3: the policy's parameters sharded (z3p.zp NULL: not sharded) */
	rli_z3 z3r;              /* ZeRO-3: the reference model's (--ref, DPO's reference), forward only */
	int z3_busy, z3_pfrv;    /* ZeRO-3's prefetch: a gather in flight on z3_th into z3_pfz->pf's
	                          * unit for the next param_need, its result */
	rli_z3 *z3_pfz;
	pthread_t z3_th;
	int z3_rs;               /* buckets handed over for the prefetch thread to reduce-scatter */
	double pres_peak;        /* bytes of parameters resident at most this step (ZeRO-3) */
	double ref_pres_peak;    /* the same of the reference model's (m->params and z3r's shard) */
	double pub_pres_peak;    /* the same while this step's part was built unit by unit (save.c) */
	double save_pres_peak;   /* the same while a directory was written this step (ZeRO-3, save.c) */
	int z3_save;             /* ZeRO-3: this rank writes (rank 0) or follows a save unit by unit (save.c) */
	struct unit_walk *z3_walk; /* ZeRO-3: a directory step that also publishes, its one walk over
	                          * the units (save.c), else NULL */
	double ref_load_pres;    /* the reference's at its load (ZeRO-3), until the next metrics */
	double load_pres;        /* the same at the load (ZeRO-3: the shard read, dp.c), until the first metrics */
	double gres_peak;        /* bytes of gradients resident at most this step (rli_dp_grads_resident) */
	char *opt_dir;           /* --resume from sharded AdamW state: the directory each shard reads */
	uint64_t ckpt_id;        /* ZeRO: the id of the full checkpoint being written (every shard's) */
	int shard_pending;       /* ZeRO: this full checkpoint's shards are still to write */
	double t_comm;           /* seconds in the gradient all-reduce this step */
	double t_gather, t_rs, t_opt; /* this step's waits for parameter gathers (ZeRO-3's units, ZeRO-1's
	                          * all-gather) and for gradient reductions, and AdamW's own time
	                          * (its collectives not counted): the phases of the update */
	double cpu_last;         /* the process's CPU seconds at the last metrics line (perf/cpu_s) */
	double minflt_last;      /* its minor page faults then (perf/minor_faults) */
	/* DPO: a pair line gives two records; the rejected one waits here */
	rl_traj *pair_rej;
	int pair_ready;
} trainer;

/* A step's token statistics for the metrics line (sums over tokens). */
typedef struct mstat {
	double loss, clip, clip_lower, kl, ratio_logsum, ent, ce;
	double ntok;
	double vf_loss, vf_clip, vpred;  /* PPO */
	double npos, npad;               /* positions the training passes ran; those of padding */
	/* DPO: sums over pairs of rl_dpo_stats' fields (loss, rewards/chosen,
	 * rewards/rejected, accuracies, margins, logps/chosen, logps/rejected), the
	 * pairs, and the RPO term's NLL summed over the chosen tokens */
	double dpo[7], npairs, nll, nll_tok;
} mstat;

/* SIGINT/SIGTERM seen (the signal number): stop at the next step boundary
 * or record read (train.c sets the handler up through rli_train_on_signal). */
extern volatile sig_atomic_t rli_train_stop;
void rli_train_on_signal(int sig);
/* Frees everything the trainer holds (each pointer may be NULL); returns
 * rv, or when rv is RL_OK the status of closing the weights group. */
int rli_train_fini(trainer *tr, int rv);

/* ---- feed.c: records in, groups out ---- */
/* The grouper and the input (queue lease, rank 0's leases, or file/stdin). */
int rli_feed_open(trainer *tr);
/* Collects the step's groups: RL_OK with ngroups == batch, RL_ENOENT at the
 * end of the input (ngroups may be > 0: a partial last step is not trained). */
int rli_feed_collect(trainer *tr);
/* The group is done: never trained again, here or after a --resume. */
int rli_feed_mark_done(trainer *tr, uint64_t group);
/* Queue mode, before a step: renew every lease still held. */
void rli_feed_renew(trainer *tr);
/* Renews (and marks again) only the leases last renewed more than a tenth
 * of the lease time ago: before a step (docs/queue.md, "Exactly once"). */
void rli_feed_renew_old(trainer *tr);
/* Queue mode, after a step: the step's records are trained (mark); when covered
 * (the step's checkpoint was a full one) every trained record held is
 * acknowledged, one request per lease; the others stay held.  RL_ENOMEM,
 * else RL_OK. */
int rli_feed_ack(trainer *tr, int mark, int covered);
/* Releases the step's groups (tr->groups stays allocated). */
void rli_feed_free_groups(trainer *tr);
/* Grows *p (of *cap elements of elt bytes) to hold need. */
int rli_feed_grow(void **p, int *cap, int need, size_t elt);
/* Hands back the records leased and not trained; closes the input. */
void rli_feed_close(trainer *tr);
/* tr->tok, opened from the model's directory on first use. */
int rli_feed_tok(trainer *tr);

/* ---- sftdata.c: TRL's SFT rows (docs/train.md, "SFT data") ---- */
/* An rl_traj_line_fn (CTX the trainer): a JSONL line in one of TRL's SFT
 * forms ({"text"}, {"prompt","completion"} as text or messages,
 * {"messages"}) becomes a record of token ids, with a loss_mask where only
 * the assistant turns train; RL_ENOENT for any other line (an rlpipe
 * record); RL_EFORMAT (logged with WHAT) for a bad row. */
int rli_sft_line(void *ctx, rl_traj *t, const char *line, size_t n, const char *what, uint64_t lineno);

/* ---- dpodata.c: preference pairs as records (docs/train.md, "DPO") ---- */
/* An rl_traj_line_fn (CTX the trainer): a pair line (rl_pref_parse) becomes
 * the chosen record in T (group = the line number, index 0, reward 1) and the
 * rejected one in tr->pair_rej (index 1, reward 0), tr->pair_ready set;
 * RL_ENOENT for a line that is an rlpipe record (it has "group" or token
 * ids); RL_EFORMAT for a bad pair (logged with WHAT). */
int rli_dpo_line(void *ctx, rl_traj *t, const char *line, size_t n, const char *what, uint64_t lineno);

/* ---- step.c: one optimizer step's computation ---- */
/* Host and backend buffers for micro-batches of tr->maxtok tokens. */
int rli_step_reserve(trainer *tr);
/* Lays out the step's sequences (tr->groups) and computes advantages. */
int rli_step_prepare(trainer *tr);
/* pi_old where the step needs it (several epochs or mini-batches);
 * *recomputed: tr->old_tok holds it. */
int rli_step_old(trainer *tr, int *recomputed);
/* The step's E x M AdamW updates; statistics into ms, the last update's
 * gradient norm and learning rate, the number of updates. */
int rli_step_update(trainer *tr, int recomputed, mstat *ms, float *gnorm, double *lr, int *nupd);

/* ---- save.c: checkpoints ---- */
/* Makes --out ready (rank 0): see the comment at its definition. */
int rli_save_prepare_out(const rl_train_opts *o, int resume_step);
/* OUT/run.yaml (runfile.c): write o's effective options; on --resume, compare
 * the algorithm's options with the run's, naming each difference, and refuse
 * (RL_EINVAL) unless o->allow_change.  A run without run.yaml is a warning. */
int rli_runfile_write(const rl_train_opts *o);
int rli_runfile_check(const rl_train_opts *o);
/* --resume: the data position of trainer_state.json (state, from dir). */
int rli_save_load_state(trainer *tr, const cJSON *state, const char *dir);
/* Opens --sync and --weights-group (rank 0); on --resume rewinds rl-sync to
 * the version resumed from (dir). */
int rli_save_open(trainer *tr, const char *dir);
/* Writes the step's checkpoint (full: with optimizer state and
 * trainer_state.json); push: also to --sync and the weights group. */
int rli_save_publish(trainer *tr, int full, int push);
/* After a step's updates: its checkpoint (every rank takes part). */
int rli_save_step(trainer *tr);
/* Waits for the version being published in the background (if any): its
 * outcome; then none is. */
int rli_save_wait(trainer *tr);
/* The last full checkpoint, so that the run can be resumed. */
int rli_save_final(trainer *tr, int start_step);

/* ---- metrics.c ---- */
/* Opens the metrics stream and --tfevents (rank 0). */
int rli_metrics_open(trainer *tr);
/* The statistics of the whole step: summed over ranks, averaged over the E
 * passes. */
int rli_metrics_gather(trainer *tr, mstat *ms, int E);
/* Writes the step's metrics line (and tfevents scalars). */
int rli_metrics_write(trainer *tr, const mstat *ms, float gnorm, double lr, double t_step, double t_upd,
    double t_wait, int nupdates);
void rli_metrics_close(trainer *tr);

/* ---- dp.c: data parallelism ---- */
int rli_dp_reducer_open(trainer *tr);
/* The mapping rli_dp_reducer_open moved m->grads into, unmapped (m->grads
 * then NULL); before the model is closed.  Accepts a trainer without one. */
void rli_dp_grads_unmap(trainer *tr);
/* m->grad_ready for the last backward of an update (ctx: tr->red). */
int rli_dp_grad_ready(void *ctx, size_t from);
int rli_dp_allreduce_grads(trainer *tr);
/* Every rank starts from rank 0's weights (and optimizer state), at the
 * same step; ZeRO-1 shards the optimizer state. */
int rli_dp_start(trainer *tr);
/* Every rank's weights are bitwise rank 0's, or RL_ECHECKSUM. */
int rli_dp_check_weights(trainer *tr);
/* Every rank is about to train the same step, or all stop (*go = 0). */
int rli_dp_agree_step(trainer *tr, int have, int *go);
/* ZeRO-2: m->grad_ready of every backward (ctx: the trainer). */
int rli_zero2_grad_ready(void *ctx, size_t from);
/* Samples the gradient memory resident now into tr->gres_peak (mincore of
 * the host buffers; 0 on a device). */
void rli_dp_grads_resident(trainer *tr);
int rli_zero_full_alloc(trainer *tr);
/* ZeRO-3 (dp.c): m->param_need of every pass (ctx: the trainer): the
 * unit's parameters from the shards (prefetched when the last call named
 * it), the previous unit's pages given back, the gather of `next` started
 * on a thread. */
int rli_zero3_param_need(void *ctx, int unit, int next);
/* ZeRO-3: the gathers (and, with backward, the gradient hand-overs) of a
 * forward or forward + backward pass, without computing: a rank out of
 * micro-batches in a round takes part in the others' collectives. */
int rli_zero3_idle_pass(trainer *tr, int backward, int ref);
/* ZeRO-3: the reference model (tr->ref, opened with rl_model_open_part)
 * sharded as the policy is: each rank's shard read from its files (the
 * ranks agreeing on failures), forwards gathering unit by unit (tr->z3r). */
int rli_zero3_ref_load(trainer *tr);
/* ZeRO-3: after a forward of the reference, its units given back. */
int rli_zero3_ref_done(trainer *tr);
/* ZeRO-3: the gathers of one forward of the reference, computing nothing
 * (a rank with fewer reference passes than another); LoRA's base as the
 * reference (tr->ref_base): those of the policy's forward. */
int rli_zero3_ref_idle(trainer *tr);
/* The reference's parameter memory resident now into tr->ref_pres_peak. */
void rli_dp_ref_resident(trainer *tr);
/* ZeRO-3: the whole model gathered into m->params (checkpoints and
 * publishing), and given back again. */
int rli_zero3_gather_all(trainer *tr);
/* ZeRO-3: unit u alone gathered (the rest given back; u < 0 none), for a
 * walk over the units outside a pass; every rank the same u in turn. */
int rli_zero3_unit_of(const rl_model *m, size_t off);
int rli_zero3_unit_only(trainer *tr, int u);
/* Unit u's own elements [*lo, *hi) of the table (a tied head's embedding is
 * the embedding unit's): units 0..n_layer+1 in turn cover it in order. */
void rli_zero3_unit_span(const rl_model *m, int u, size_t *lo, size_t *hi);
void rli_zero3_release(trainer *tr);
/* ZeRO-3: the unit pools closed (their slots' ranges of m->params anonymous
 * memory again), before the models are; a no-op without ZeRO-3. */
void rli_zero3_close(trainer *tr);
/* ZeRO-3: waits for the prefetch in flight (before any other collective). */
int rli_zero3_join(trainer *tr);
/* The parameter memory resident now (mincore of m->params and the shard)
 * into tr->pres_peak. */
void rli_dp_params_resident(trainer *tr);
int rli_zero_step(trainer *tr, const rl_adamw *p, float *grad_norm);
/* ZeRO, a full checkpoint: rank 0 draws its id, every rank learns it. */
int rli_zero_ckpt_id(trainer *tr);
/* Every rank writes its shard of the AdamW state into the step directory
 * rank 0 just saved (ok: whether it did; rank 0's word counts), and all
 * learn whether every shard was written. */
int rli_zero_save_shards(trainer *tr, int ok);

#endif

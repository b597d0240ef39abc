/*
 * train.h — the learner behind rl-train: reads scored trajectories, forms
 * steps of complete groups, computes advantages (algo.h), log-probs under the
 * current policy (model.h), the policy-gradient loss (ops->pg_loss), the
 * backward pass and AdamW, and after each step publishes the new weights as
 * a checkpoint directory (ckpt.h) that rl-rollout --weights-from reads.
 *
 * Queue mode (queue_url): records are leased from rl-queue (whole scored
 * groups); after a step is applied its samples are acknowledged and the new
 * version is reported to the broker (its staleness gate).  Leases held across
 * a step are extended first.
 *
 * Data parallelism (comm != NULL with world > 1, docs/parallel.md): every
 * rank reads the whole input and forms the same steps; each mini-batch's
 * sequences are split by rank in contiguous shares; the loss weights are
 * computed over the whole mini-batch (global counts), so the all-reduced
 * (summed) gradient is the one a single process computes.  Gradients are
 * all-reduced in buckets, handed to a communication thread (or the NCCL
 * stream) as the last backward pass of a mini-batch finishes each layer, so
 * the all-reduce overlaps with the rest of that pass; AdamW then runs on every
 * rank on identical gradients; a parameter checksum is compared every
 * dp_check_every steps; rank 0 alone writes checkpoints and metrics.  Queue
 * mode with several ranks: rank 0 alone leases and acknowledges, and passes
 * every lease's records to the other ranks over the communicator.
 *
 * PPO (docs/train.md): the policy gets a value head on its shared trunk
 * (model.h, rl_model_add_value_head; loaded from the model or checkpoint
 * directory's value_head.safetensors, else initialised from seed).  Each
 * step starts with a forward pass over all its sequences (π_old log-probs and
 * the values V_old, on every rank), then GAE (algo.h) gives advantages and
 * returns; every micro-batch's loss is the policy loss plus vf_coef times
 * the clipped value loss, whose gradient flows into the head and the trunk.
 *
 * Zero advantages (skip_zero_adv, docs/train.md): a sequence whose token
 * advantages are all 0 adds an exactly zero gradient when the loss has no
 * other term (rl_train_skip_inexact); its forward and backward are skipped
 * after the loss weights, mini-batches and rank shares are computed over the
 * whole step, so the update is the same up to fp32 summation order.  A step
 * with nothing left to train still makes its AdamW updates.
 *
 * Leaves out: a separate critic model, rl-sync publishing (cmd/rl-train).
 *
 * One step (optimizer update) takes `batch` groups.  With ppo_epochs E and
 * mini_batches M, the step's sequences are split into M mini-batches and
 * each is updated on E times (E*M AdamW updates, one version published);
 * the "old" log-probs of the ratio are then recomputed once at the start
 * of the step (π_old); with E = M = 1 they equal the current log-probs and
 * cost nothing.  Micro-batches: sequences padded into rows, at most
 * max_tokens_micro = rows x longest row tokens, gradients accumulated.
 *
 * Not thread-safe.
 */
#ifndef RL_TRAIN_H
#define RL_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "train/algo.h"
#include "compute/comm.h"
#include "compute/ops.h"

typedef struct rl_train_opts {
	/* model and output */
	const char *model_dir;     /* -m: initial policy (ignored on --resume with a checkpoint) */
	const char *out_dir;       /* --out: ROOT of step-NNNNNNNN checkpoints + latest */
	const char *ref_dir;       /* --ref: frozen reference model for KL (NULL: records' ref_logprobs) */
	const char *device;        /* "cpu", "cuda[:N]", "auto" */
	const char *input;         /* FILE or "-" */
	const char *metrics_path;  /* --metrics FILE ("-" stdout); NULL: stderr */
	const char *tfevents_dir;  /* --tfevents DIR or NULL */
	const char *sync_url;      /* --sync URL: also push each version to rl-sync (or a directory) */
	int sync_transport;        /* --sync-transport: RL_WSYNC_T_* (0: auto) */
	const char *wgroup_addr;   /* --weights-group HOST:PORT: broadcast each version (wgroup.h) */
	int wgroup_size;           /* its size: this trainer + the rollout workers */
	const char *wgroup_backend; /* auto, cpu, nccl */
	const char *queue_url;     /* --queue URL: lease scored groups from rl-queue instead of input */
	double idle_exit;          /* queue mode: stop after this many seconds without records (0: never) */
	double broker_timeout;     /* queue mode: fail after this many seconds without a reply from the
	                            * broker, after a last full checkpoint (0: never; default 300) */
	/* algorithm */
	int algo;                  /* rl_algo */
	int agg;                   /* rl_agg; -1: the algorithm's default */
	int norm_std;              /* GRPO: divide by group std (1) */
	int norm_len;              /* seq-mean-token-sum-norm constant; 0: longest response of the step */
	int batch;                 /* groups per step */
	int ppo_epochs, mini_batches;
	int max_tokens_micro;      /* token budget of one micro-batch (rows x T) */
	int recompute;             /* activation recomputation (rl_model.recompute) */
	float clip_low, clip_high, dual_clip, tis_cap;
	int kl_type;               /* 0 off, 1..3 k1/k2/k3 */
	float kl_coef;
	int kl_in_reward;          /* KL as a token-level reward penalty instead of a loss term */
	float ent_coef;
	float gamma, lambda;
	/* PPO */
	float vf_coef;             /* weight of the value loss in the total loss (0.1) */
	float value_clip;          /* value clip range around V_old (0.5; <= 0 off) */
	float critic_lr;           /* lr of the value head (0: --lr), same schedule */
	int whiten_adv;            /* whiten GAE advantages over the step (1) */
	int old_from_behaviour;    /* ratio against the records' log-probs instead of recomputing */
	int skip_zero_adv;         /* no forward/backward for sequences whose advantages are all 0:
	                            * -1 where exact (default), 0 off, 1 on (RL_EINVAL where not exact) */
	/* optimizer */
	float lr, weight_decay, beta1, beta2, adam_eps, grad_clip, min_lr_ratio;
	int warmup, total_steps, sched;
	/* run control */
	int max_steps;             /* stop after this many steps in total (0: end of input) */
	int save_every;            /* full checkpoint (with optimizer) every N steps; 0: last only */
	int keep;                  /* keep the newest K step directories (0: all) */
	int ckpt_every;            /* with sync_url: a step directory every N steps (0, 1: every step);
	                            * the versions between go to sync_url from memory only */
	int resume;                /* continue from out_dir/latest */
	int on_bad;                /* RL_BAD_ERROR or RL_BAD_SKIP */
	uint64_t seed;
	int quiet;
	/* data parallelism */
	const rl_comm_opts *comm;  /* NULL or world 1: one process */
	int dp_check_every;        /* compare a parameter checksum across ranks every N steps (0: at the end only) */
	double dp_bucket_mb;       /* gradient all-reduce bucket (MiB; default 25) */
	int dp_overlap;            /* all-reduce buckets while the backward pass goes on (1) */
	int zero;                  /* 1: ZeRO-1, AdamW state sharded across the ranks (0 off) */
} rl_train_opts;

void rl_train_opts_default(rl_train_opts *o);

/* Why skipping zero-advantage sequences would change the update with these
 * options (a loss term with a gradient on every token: ppo's value loss, a
 * KL loss term, an entropy bonus), or NULL where it is exact: such a
 * sequence's policy-gradient term is -0 * ratio, so its gradient is exactly
 * zero, and the loss weights are computed before it is dropped.  Static
 * string. */
const char *rl_train_skip_inexact(const rl_train_opts *o);

/* Runs the learner until the input ends or max_steps; returns RL_OK or the
 * first error (logged).  Writes one JSON metrics object per step. */
int rl_train_run(const rl_train_opts *o);
/* The signal (SIGINT, SIGTERM) that stopped the last rl_train_run on file or
 * stdin input after its checkpoint, else 0: rl-train then exits 128 + it, so
 * that a pipeline or Makefile sees the run did not finish its input. */
int rl_train_stopped_by(void);

/* rl-train --init: writes a randomly initialised model directory out_dir from
 * a config.json (HF keys) and a tokenizer ("bytes" for rlpipe's bytes
 * tokenizer, or a tokenizer.json path, copied). */
int rl_train_init_model(const char *config_path, const char *tokenizer, const char *out_dir,
    uint64_t seed);

#endif

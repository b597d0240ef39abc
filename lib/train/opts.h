/*
 * opts.h — rl_train_opts, the options of the learner (train.h): what
 * rl-train's command line sets and rl_train_opts_default fills in.
 * Leaves out: the functions that take them (train.h).
 */
#ifndef RL_TRAIN_OPTS_H
#define RL_TRAIN_OPTS_H

#include <stdint.h>

#include "compute/comm.h"

/* rl_train_opts.resume: AUTO resumes when --out holds a full checkpoint and
 * starts fresh when it holds no step directory; YES must resume; NO must not
 * (and refuses an --out with step directories). */
enum { RL_RESUME_AUTO = 0, RL_RESUME_YES = 1, RL_RESUME_NO = 2 };

/* Validation hook (docs/train.md, "Validation"): called on rank 0 after step
 * `step`'s checkpoint ckpt_dir is written, every eval_every steps and at
 * --max-steps; it adds its metrics (val-core/...) to the step's line through
 * put.  lib/train does not generate: the command supplies the generator. */
typedef void (*rl_train_put_fn)(void *pctx, const char *name, double v);
typedef int (*rl_train_eval_fn)(void *ctx, int step, const char *ckpt_dir, rl_train_put_fn put,
    void *pctx);

typedef struct rl_train_opts {
	/* model and output */
	const char *model_dir;     /* -m: initial policy (ignored on --resume with a checkpoint) */
	const char *out_dir;       /* --out: ROOT of step-NNNNNNNN checkpoints + latest */
	const char *ref_dir;       /* --ref: frozen reference model for KL (NULL: records' ref_logprobs) */
	const char *device;        /* "cpu", "cuda[:N]", "auto" */
	const char *input;         /* FILE or "-" */
	const char *metrics_path;  /* --metrics FILE ("-" stdout); NULL: stderr */
	const char *tfevents_dir;  /* --tfevents DIR or NULL */
	const char *prom_path;     /* --prom-file FILE: the last step as Prometheus text, or NULL */
	const char *sync_url;      /* --sync URL: also push each version to rl-sync (or a directory) */
	int sync_transport;        /* --sync-transport: RL_WSYNC_T_* (0: auto) */
	int push_parts;            /* --push-parts: every rank pushes its part of each version */
	int publish_inline;        /* --publish-inline: write each version before the next step */
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
	int micro_tokens;          /* > 0: packed micro-batches of at most this many tokens, one row
	                            * of sequences kept apart (segments), no padding; replaces
	                            * max_tokens_micro (docs/train.md, "Packed micro-batches") */
	int recompute;             /* activation recomputation (rl_model.recompute) */
	float clip_low, clip_high, dual_clip, tis_cap;
	int kl_type;               /* 0 off, 1..3 k1/k2/k3 */
	float kl_coef;
	int kl_in_reward;          /* KL as a token-level reward penalty instead of a loss term */
	float ent_coef;
	float gamma, lambda;
	/* DPO (docs/train.md, "DPO") */
	float dpo_beta;            /* --beta (0.1) */
	int dpo_loss;              /* --dpo-loss: RL_DPO_* */
	float label_smoothing;     /* --label-smoothing (sigmoid only) */
	float rpo_alpha;           /* --rpo-alpha: weight of the NLL of the chosen completions (0 off) */
	int online;                /* --online (dpo, rm): a scored group of any size gives the pair
	                            * (highest reward, lowest); a group of equal rewards none */
	/* PPO */
	float vf_coef;             /* weight of the value loss in the total loss (0.1) */
	float value_clip;          /* value clip range around V_old (0.5; <= 0 off) */
	float critic_lr;           /* lr of the value head (0: --lr), same schedule */
	int whiten_adv;            /* whiten GAE advantages over the step (1) */
	int old_from_behaviour;    /* ratio against the records' log-probs instead of recomputing */
	int overlong_filter;       /* DAPO's overlong filtering: samples cut at max_tokens (finish
	                            * "length") get loss_mask 0 on every token */
	int skip_zero_adv;         /* no forward/backward for sequences whose advantages are all 0:
	                            * -1 where exact (default), 0 off, 1 on (RL_EINVAL where not exact) */
	/* optimizer */
	float lr, weight_decay, beta1, beta2, adam_eps, grad_clip, min_lr_ratio;
	int warmup, total_steps, sched;
	/* run control */
	int max_steps;             /* stop after this many steps in total (0: end of input) */
	int save_every;            /* full checkpoint (with optimizer) every N steps (0: by time only) */
	double save_minutes;       /* also a full checkpoint when M minutes passed since the last (0: off) */
	int keep;                  /* keep the newest K step directories (0: all) */
	int ckpt_every;            /* with sync_url: a step directory every N steps (0, 1: every step);
	                            * the versions between go to sync_url from memory only */
	int resume;                /* RL_RESUME_AUTO (default), RL_RESUME_YES or RL_RESUME_NO */
	int allow_change;          /* --resume with options that change the algorithm (run.yaml differs) */
	int on_bad;                /* RL_BAD_ERROR, RL_BAD_SKIP or RL_BAD_AUTO (default: skip with
	                            * --queue, error otherwise) */
	uint64_t seed;
	int quiet;
	/* data parallelism */
	const rl_comm_opts *comm;  /* NULL or world 1: one process */
	int dp_check_every;        /* compare a parameter checksum across ranks every N steps (0: at the end only) */
	double dp_bucket_mb;       /* gradient all-reduce bucket (MiB; default 25) */
	int dp_overlap;            /* all-reduce buckets while the backward pass goes on (1) */
	int zero;                  /* ZeRO stage: 1 AdamW state sharded across the ranks, 2 gradients too,
	                            * 3 parameters too (0 off) */
	int zero3_no_prefetch;     /* ZeRO-3: each unit gathered when needed, none ahead */
	size_t zero3_keep;         /* ZeRO-3: parameters of used units kept gathered (0: none) */
	/* LoRA (model/lora.h, docs/lora.md): adapters trained on the frozen policy */
	int lora_rank;             /* 0: full fine-tuning */
	float lora_alpha;          /* scaling alpha / rank (PEFT's default 8) */
	float lora_dropout;        /* on the adapters' input (0) */
	/* validation (eval_fn NULL: none) */
	rl_train_eval_fn eval_fn;
	void *eval_ctx;
	int eval_every;            /* steps between validations (0: at --max-steps only) */
	unsigned lora_targets;     /* bits RL_LORA_Q.. (PEFT's default for Llama/Qwen: q_proj, v_proj) */
} rl_train_opts;

#endif

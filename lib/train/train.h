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
 * max_tokens_micro = rows x longest row tokens, or with micro_tokens packed
 * into one row of at most that many tokens; gradients accumulated.
 *
 * Not thread-safe.
 */
#ifndef RL_TRAIN_H
#define RL_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "compute/ops.h"
#include "train/algo.h"
#include "train/opts.h"

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
/* rl-train --merge-adapter: the base model (base_dir, else adapter_dir's
 * adapter_config.json base_model_name_or_path) with adapter_dir's LoRA
 * adapters folded into its weights (on the CPU), saved as the Hugging Face
 * directory out_dir (atomic; RL_EEXIST when it exists). */
int rl_train_merge_adapter(const char *adapter_dir, const char *base_dir, const char *out_dir);
int rl_train_init_model(const char *config_path, const char *tokenizer, const char *out_dir,
    uint64_t seed);

#endif

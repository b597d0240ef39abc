/*
 * plan.h — the memory a training run takes per rank, before it runs: the
 * weights, gradients, AdamW state and activations rl-train allocates for a
 * model config, world size, ZeRO stage, LoRA, micro-batch and device, and
 * the KV cache of a generator sharing the GPU; and whether that fits a GPU.
 *
 * The model's own functions size the parts (rl_model_param_count,
 * rl_model_act_bytes_for), so the plan is the program's accounting, not a
 * formula beside it: for what runs (ZeRO 0 and 1, no LoRA) it equals what
 * rl-train then allocates (the memory/... metrics; tests/cli/rl-train-plan.bats),
 * and for LoRA on the CPU too (tests/cli/rl-train-lora.bats).  ZeRO-2 runs on
 * the CPU backend, where its gradients are the shard (1/N) the plan counts plus
 * a working set the plan leaves out (the layer being differentiated, a tied
 * embedding, two buckets: docs/parallel.md).  ZeRO-3, ZeRO-2 and LoRA on CUDA
 * are planned as they are specified (issue 32) but do not run yet; the plan
 * says so.
 *
 * A reference model (--ref for the KL term, DPO's reference) is planned from
 * its own config: its weights as rl_model_open allocates them (the f32
 * table, plus the compute copy on CUDA), or with ZeRO-3 on several ranks
 * its shard plus two of its layers gathered; and the one layer's
 * activations its forward-only reserve takes (rl_model_eval_reserve).
 *
 * Leaves out: allocator slack and fragmentation, cuBLAS workspaces and CUDA
 * graphs (tens of MiB), the CUDA context (~500 MiB), NCCL buffers.
 */
#ifndef RL_PLAN_H
#define RL_PLAN_H

#include <stddef.h>

#include "model/config.h"

typedef struct rl_plan_opts {
	int world;             /* data-parallel ranks (>= 1) */
	int zero;              /* 0..3 */
	int cuda;              /* bf16 compute copy and activations; else all f32 (CPU) */
	int lora_rank;         /* 0: full fine-tuning */
	unsigned lora_targets; /* bits RL_PLAN_Q.. (0 with a rank: all seven) */
	int max_tokens;        /* --max-tokens-per-micro */
	int recompute;         /* --recompute: one layer's activations */
	int value_head;        /* PPO's value head */
	long long kv_tokens;   /* a colocated generator's KV cache, tokens */
	double gpu_bytes;      /* > 0: say whether the total fits */
	const rl_config *ref;  /* the reference model's config; NULL: none */
} rl_plan_opts;

enum { RL_PLAN_Q = 1, RL_PLAN_K = 2, RL_PLAN_V = 4, RL_PLAN_O = 8, RL_PLAN_GATE = 16, RL_PLAN_UP = 32,
       RL_PLAN_DOWN = 64 };

typedef struct rl_plan {
	size_t params;         /* parameters of the model */
	size_t trainable;      /* those trained (the adapters' with LoRA) */
	double weights;        /* bytes per rank: master weights (+ the bf16 copy on CUDA) */
	double grads, optim, acts, kv, total;
	double ref_weights;    /* the reference's parameters (0 without one) */
	double ref_acts;       /* its forward's activations */
	double ref;            /* ref_weights + ref_acts, in total */
	int runs;              /* 1 when rl-train runs this configuration today */
	int fits;              /* with gpu_bytes: total <= gpu_bytes */
} rl_plan;

/* RL_EINVAL (logged) for an option out of range. */
int rl_train_plan(rl_plan *out, const rl_config *c, const rl_plan_opts *o);
/* A reference model of config ref (from ref_dir) for a policy of config
 * policy (from policy_dir, NULL: unnamed): RL_EINVAL for a reward model,
 * RL_ESHAPE for another vocabulary (its log-probs are of the policy's
 * tokens); logged, naming both.  What rl-train checks at the open and
 * rl-train --plan before it plans. */
int rl_train_ref_check(const rl_config *policy, const char *policy_dir, const rl_config *ref, const char *ref_dir);
/* With LoRA (lora_rank > 0), whether the reference is the frozen base itself,
 * computed as the policy's forward with the adapters off and no second model
 * (docs/lora.md): DPO's default reference (dpo_default: no --ref; the initial
 * policy, whose adapters B are zero), or ref_dir naming base_dir, the same
 * directory once realpath(3) has resolved both.  0 otherwise, and where
 * either path does not resolve (the open then says why). */
int rl_train_ref_is_base(int lora_rank, int dpo_default, const char *ref_dir, const char *base_dir);

#endif

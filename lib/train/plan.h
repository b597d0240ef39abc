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
 * Leaves out: allocator slack and fragmentation, cuBLAS workspaces and CUDA
 * graphs (tens of MiB), the CUDA context (~500 MiB), NCCL buffers, and a
 * reference model (--ref: its weights and one layer's activations again).
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
} rl_plan_opts;

enum { RL_PLAN_Q = 1, RL_PLAN_K = 2, RL_PLAN_V = 4, RL_PLAN_O = 8, RL_PLAN_GATE = 16, RL_PLAN_UP = 32,
       RL_PLAN_DOWN = 64 };

typedef struct rl_plan {
	size_t params;         /* parameters of the model */
	size_t trainable;      /* those trained (the adapters' with LoRA) */
	double weights;        /* bytes per rank: master weights (+ the bf16 copy on CUDA) */
	double grads, optim, acts, kv, total;
	int runs;              /* 1 when rl-train runs this configuration today */
	int fits;              /* with gpu_bytes: total <= gpu_bytes */
} rl_plan;

/* RL_EINVAL (logged) for an option out of range. */
int rl_train_plan(rl_plan *out, const rl_config *c, const rl_plan_opts *o);

#endif

/*
 * lora.h — LoRA adapters (Hu et al. 2021, as PEFT implements them) on the
 * linear layers of a Llama-family model: y = x W^T + b + (alpha/r) B A x,
 * A (r, in), B (out, r).  The base weights are frozen: the backward computes
 * no gradient for them and rl_model_step moves only the adapters (and a
 * value head).  Adapters are tensors of the model's table (flag RL_T_LORA)
 * named as PEFT saves them, so gradients, AdamW state, data-parallel
 * reductions and the optimizer file cover them unchanged.
 *
 * Leaves out: GPT-2 (Conv1D layers), the CUDA backend (the adapter's slice
 * additions and dropout run as host loops over f32 activations), rsLoRA,
 * DoRA, and biases in the adapters (PEFT's bias="none").
 */
#ifndef RL_LORA_H
#define RL_LORA_H

#include <stdint.h>

#include "model/model.h"

/* The modules an adapter can target, in PEFT's names. */
enum {
	RL_LORA_Q, RL_LORA_K, RL_LORA_V, RL_LORA_O, RL_LORA_GATE, RL_LORA_UP, RL_LORA_DOWN,
	RL_LORA_NMOD
};
#define RL_LORA_ALL ((1u << RL_LORA_NMOD) - 1)

typedef struct rl_lora_opts {
	int r;                  /* rank >= 1 */
	float alpha;            /* scaling = alpha / r */
	float dropout;          /* on the adapter's input, [0, 1); training forwards only */
	unsigned targets;       /* bit RL_LORA_Q ... */
	uint64_t seed;          /* A's init and the dropout masks */
} rl_lora_opts;

/* PEFT's name of module k ("q_proj", ..., "down_proj"). */
const char *rl_lora_module_name(int k);
/* Parses a comma-separated list of module names, or "all-linear" (every
 * one), into *mask.  RL_EINVAL naming the entry that is not a module. */
int rl_lora_targets_parse(const char *list, unsigned *mask);

/* Adds adapters to m: for each layer and targeted module, A initialised as
 * PEFT does (kaiming_uniform_ with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)),
 * deterministic in seed) and B zero, so the model computes exactly what it
 * did.  Call before rl_model_train_reserve/eval_reserve.  RL_ENOTSUP for
 * GPT-2 or a backend other than the CPU, RL_EINVAL for bad options; on
 * failure the model must be closed. */
int rl_model_add_lora(rl_model *m, const rl_lora_opts *lo);
/* The adapters' options (NULL when m has none). */
const rl_lora_opts *rl_model_lora(const rl_model *m);
/* Index in m->tt of layer l's module k's A (b = 0) or B (b = 1), or -1. */
int rl_model_lora_tensor(const rl_model *m, int l, int k, int b);
/* Folds every adapter into its base weight, W += (alpha/r) B A (in f32),
 * and zeroes B: the model computes the same and its base tensors are the
 * merged model's (rl_model_save then writes a merged checkpoint). */
int rl_model_lora_merge(rl_model *m);

#endif

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
/* off != 0: the forwards that follow compute the frozen base alone, the
 * adapters skipped (a reference that is the initial policy: B is zero at the
 * start); no dropout masks are drawn and the dropout's pass count is left as
 * it was, so the policy's own forwards draw the masks they would without it.
 * Such a forward uses the model's activation buffers like any other: it
 * overwrites what a backward needs, and rl_model_backward refuses to
 * differentiate it.  off 0 switches the adapters back on.  RL_EINVAL when m
 * has no adapters. */
int rl_model_lora_off(rl_model *m, int off);
/* Index in m->tt of layer l's module k's A (b = 0) or B (b = 1), or -1. */
int rl_model_lora_tensor(const rl_model *m, int l, int k, int b);
/* Folds every adapter into its base weight, W += (alpha/r) B A (the sum in
 * double), and removes the adapters: the model computes the same, as a plain
 * model (rl_model_lora NULL; rl_model_save then writes the merged model; the
 * adapters' tensors stay at the end of the table, B zeroed, in no file). */
int rl_model_lora_merge(rl_model *m);

/* ---- PEFT's files (docs/lora.md) ----------------------------------------------------------
 * DIR/adapter_config.json: peft_type "LORA", r, lora_alpha, lora_dropout,
 * target_modules, base_model_name_or_path, task_type "CAUSAL_LM", bias "none",
 * fan_in_fan_out false, use_rslora false, use_dora false, and PEFT's other keys
 * at their defaults; DIR/adapter_model.safetensors: every A and B in f32 under
 * "base_model.model.<module>.lora_A.weight" (lora_B). */
#define RL_LORA_CONFIG_FILE "adapter_config.json"
#define RL_LORA_WEIGHTS_FILE "adapter_model.safetensors"
/* adapter_config.json of m's adapters (cJSON_free; NULL when m has none). */
char *rl_lora_config_json(const rl_model *m);
/* Reads DIR/adapter_config.json into *lo (seed 0) and, when base is non-NULL,
 * base_model_name_or_path into *base (the caller's, NULL when absent).
 * RL_ENOENT without the file; RL_EFORMAT naming the file and the field for
 * what it cannot represent here: another peft_type, use_dora, use_rslora,
 * bias other than "none", fan_in_fan_out, per-layer rank_pattern or
 * alpha_pattern, a target outside lora.h's modules. */
int rl_lora_config_read(const char *dir, rl_lora_opts *lo, char **base);
/* Folds the adapter in DIR (adapter_config.json, adapter_model.safetensors)
 * into m's weights, W += (alpha/r) B A: base + adapter as one model, on any
 * backend (the arithmetic is on the host).  m has no adapters of its own.
 * Errors as rl_lora_config_read and rl_model_lora_load; RL_ENOTSUP for GPT-2. */
int rl_model_apply_adapter(rl_model *m, const char *dir);
/* Sets m's adapters from DIR/adapter_model.safetensors (any float dtype):
 * every A and B of m must be there with its shape (RL_ENOENT / RL_ESHAPE naming
 * the file and the tensor), and no adapter that m lacks (RL_EINVAL). */
int rl_model_lora_load(rl_model *m, const char *dir);

#endif

/*
 * tensor.h — the tensor table: one list of (name, shape, offset) that lays
 * out a model's parameters, and with the same offsets its gradients and the
 * AdamW moments, each in ONE allocation.  The same table drives checkpoint
 * I/O (names are Hugging Face's), weight sync and NCCL buffers.
 *
 * Offsets are in elements, so a buffer of any element type (f32 master
 * weights, bf16 compute copies) uses the same table.  Each tensor starts on a
 * multiple of RL_TT_ALIGN elements, except one added with RL_T_FOLLOWS, which
 * starts right where the previous one ends: that is how q, k, v projections
 * form one (NH+2NKV)*HD x C matrix for the fused QKV GEMM and gate, up one
 * 2H x C matrix for the fused gate|up GEMM.
 *
 * Leaves out: memory (the model allocates), dtype conversion (ckpt.c, model.c).
 */
#ifndef RL_TENSOR_H
#define RL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define RL_TT_ALIGN 16          /* elements: 64 bytes of f32, 32 of bf16 */
#define RL_TT_NAME 96

enum {
	RL_T_FOLLOWS = 1 << 0,  /* starts where the previous tensor ends (fused views) */
	RL_T_TRANSPOSE = 1 << 1,/* stored (out, in) here, (in, out) in the file (GPT-2 Conv1D) */
	RL_T_DECAY = 1 << 2,    /* AdamW weight decay applies (2-D projections, untied lm_head) */
	RL_T_AUX = 1 << 3,      /* not part of the HF model: the PPO value head, kept at the end of the
	                         * table and saved to its own file (ckpt.h) */
	RL_T_LORA = 1 << 4,     /* a LoRA adapter (lora.h): after the model's tensors, trained while
	                         * they are frozen, saved in PEFT's layout */
};

typedef struct rl_tensor {
	char name[RL_TT_NAME];  /* Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight" */
	int ndim;               /* 1 or 2 */
	int64_t shape[2];       /* our layout: (out, in) for projections */
	size_t off;             /* element offset into the table's buffers */
	size_t n;               /* elements */
	unsigned flags;
} rl_tensor;

typedef struct rl_ttable {
	rl_tensor *t;
	int n, cap;
	size_t total;           /* elements spanned, a multiple of RL_TT_ALIGN */
} rl_ttable;

/* Appends a tensor with shape (d0) (d1 == 0) or (d0, d1); returns its index.
 * Aborts only on a failed small allocation (the table is tiny). */
int rl_ttable_add(rl_ttable *tt, const char *name, unsigned flags, int64_t d0, int64_t d1);
/* Index of name, or -1. */
int rl_ttable_find(const rl_ttable *tt, const char *name);
void rl_ttable_fini(rl_ttable *tt);

/* Element count of t in the file's layout: same as t->n; shape in the file's
 * layout (transposed for RL_T_TRANSPOSE) into shape[2], returns ndim. */
int rl_tensor_file_shape(const rl_tensor *t, int64_t shape[2]);

#endif

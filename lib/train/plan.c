/*
 * plan.c — the memory of a training run per rank (plan.h).
 *
 * Parts, in bytes per rank, for P parameter slots (the tensor table's total):
 *   weights      4P fp32 master weights, plus 2P of bf16 compute copy on CUDA;
 *                ZeRO-3 keeps 1/N of both and gathers two layers at a time
 *                (the one computing and the one prefetched)
 *   gradients    4P fp32; ZeRO-2 and 3 keep 1/N
 *   optimizer    8P fp32 AdamW moments; ZeRO 1 to 3 keep 1/N
 *   activations  what rl_model_train_reserve takes for the micro-batch
 *   KV cache     tokens x layers x 2 x kv heads x head size, in the act dtype
 * With LoRA the base weights are frozen (bf16 on CUDA, f32 on the CPU;
 * ZeRO-3 shards them, and only them) and only the adapters (rank r: r (in + out) per target matrix and
 * layer) have master weights, gradients and AdamW state, whole on every rank: on the CPU what rl-train allocates
 * (model.h's goff), each adapter tensor rounded up to RL_TT_ALIGN elements.
 * A reference that is LoRA's base (rl_train_ref_is_base) is no part: its
 * forward is the policy's, in the policy's buffers.
 */
#include "train/plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "model/model.h"

/* in and out sizes of LoRA's target matrices, in RL_PLAN_* bit order */
static void
target_dims(const rl_config *c, int k, size_t *in, size_t *out)
{
	size_t C = (size_t)c->hidden_size, Q = (size_t)c->n_head * c->head_dim;
	size_t KV = (size_t)c->n_kv_head * c->head_dim, I = (size_t)c->intermediate_size;
	static const int which[7] = { 0, 1, 1, 2, 3, 3, 4 };

	switch (which[k]) {
	case 0: *in = C, *out = Q; break;        /* q_proj */
	case 1: *in = C, *out = KV; break;       /* k_proj, v_proj */
	case 2: *in = Q, *out = C; break;        /* o_proj */
	case 3: *in = C, *out = I; break;        /* gate_proj, up_proj */
	default: *in = I, *out = C; break;       /* down_proj */
	}
}

/* The reference model's parts: weights and activations as the trainer
 * allocates them (train.c's open_ref, step.c's rli_step_reserve), which
 * shards it only with ZeRO-3 on more than one rank. */
static void
plan_ref(rl_plan *p, const rl_config *r, const rl_plan_opts *o, double act)
{
	size_t n, slots, emb, layer_slots;
	int ld = o->cuda ? (r->vocab_size + 63) / 64 * 64 : r->vocab_size;
	double wb = 4 + (o->cuda ? act : 0);   /* the f32 table, and the compute copy beside it */

	rl_model_param_count(r, 0, &n, &slots);
	emb = RL_MIN(slots, (size_t)r->vocab_size * r->hidden_size * (r->tie_embeddings ? 1 : 2));
	layer_slots = r->n_layer > 0 ? (slots - emb) / (size_t)r->n_layer : 0;
	if (o->zero >= 3 && o->world > 1)
		p->ref_weights = wb * (double)slots / o->world + 2 * act * (double)layer_slots;
	else
		p->ref_weights = wb * (double)slots;
	p->ref_acts = (double)rl_model_act_bytes_for(r, (size_t)act, ld, rl_model_logit_chunk_bytes(!o->cuda, 0),
	    o->max_tokens, 1, 0);
	p->ref = p->ref_weights + p->ref_acts;
}

int
rl_train_ref_is_base(int lora_rank, int dpo_default, const char *ref_dir, const char *base_dir)
{
	char a[PATH_MAX], b[PATH_MAX];

	if (lora_rank <= 0)
		return 0;
	if (ref_dir == NULL)
		return dpo_default;
	if (base_dir == NULL || realpath(ref_dir, a) == NULL || realpath(base_dir, b) == NULL)
		return 0;
	return strcmp(a, b) == 0;
}

int
rl_train_ref_check(const rl_config *policy, const char *policy_dir, const rl_config *ref, const char *ref_dir)
{
	if (ref->seq_cls) {
		rl_error("--ref '%s' is a reward model (%s has no language-model head)", ref_dir,
		    "...ForSequenceClassification");
		return RL_EINVAL;
	}
	if (ref->vocab_size != policy->vocab_size) {
		rl_error("--ref '%s': vocab_size %d in its config.json, the policy's is %d%s%s%s", ref_dir, ref->vocab_size,
		    policy->vocab_size, policy_dir ? " ('" : "", policy_dir ? policy_dir : "", policy_dir ? "')" : "");
		rl_hint("the reference scores the policy's tokens: give a model with the policy's vocabulary");
		return RL_ESHAPE;
	}
	return RL_OK;
}

int
rl_train_plan(rl_plan *p, const rl_config *c, const rl_plan_opts *o)
{
	size_t n, slots, trainable, layer_slots;
	double N = o->world, act = o->cuda ? 2 : 4;
	int ld = c->vocab_size;

	*p = (rl_plan){ 0 };
	if (o->world < 1 || o->zero < 0 || o->zero > 3 || o->lora_rank < 0 || o->max_tokens < 1 || o->kv_tokens < 0) {
		rl_error("plan: world %d, ZeRO %d, LoRA rank %d, %d tokens a micro-batch, %lld KV tokens: out of range",
		    o->world, o->zero, o->lora_rank, o->max_tokens, o->kv_tokens);
		return RL_EINVAL;
	}
	rl_model_param_count(c, o->value_head, &n, &slots);
	p->params = n;
	trainable = slots;
	if (o->lora_rank > 0) {
		unsigned t = o->lora_targets ? o->lora_targets : 127;
		trainable = 0;
		for (int k = 0; k < 7; k++) {
			size_t in, out;
			if (!(t & (1u << k)))
				continue;
			target_dims(c, k, &in, &out);
			trainable += (size_t)c->n_layer * (size_t)o->lora_rank * (in + out);
		}
	}
	p->trainable = o->lora_rank > 0 ? trainable : n;
	/* a layer's share of the slots, for ZeRO-3's gathers: all but the embeddings */
	layer_slots = c->n_layer > 0 ? (slots - RL_MIN(slots, (size_t)c->vocab_size * c->hidden_size *
	    (c->tie_embeddings ? 1 : 2))) / (size_t)c->n_layer : 0;
	if (o->lora_rank > 0) {
		/* the frozen base in the compute dtype (ZeRO-3 on several ranks shards
		 * it, and gathers two layers), the adapters like full weights, whole
		 * on every rank with their gradients and AdamW state (dp.c) */
		p->weights = o->zero >= 3 && o->world > 1 ? act * ((double)slots / N + 2.0 * (double)layer_slots) :
		    act * (double)slots;
		p->weights += (4 + (o->cuda ? 2 : 0)) * (double)trainable;
	} else if (o->zero >= 3) {
		p->weights = (4 + (o->cuda ? 2 : 0)) * (double)slots / N + 2 * act * (double)layer_slots;
	} else {
		p->weights = (4 + (o->cuda ? 2 : 0)) * (double)slots;
	}
	p->grads = 4 * (double)trainable / (o->zero >= 2 && o->lora_rank == 0 ? N : 1);
	p->optim = 8 * (double)trainable / (o->zero >= 1 && o->lora_rank == 0 ? N : 1);
	if (o->cuda)
		ld = (c->vocab_size + 63) / 64 * 64;   /* the strided LM head's row stride */
	p->acts = (double)rl_model_act_bytes_for(c, (size_t)act, ld, rl_model_logit_chunk_bytes(!o->cuda, 1),
	    o->max_tokens, o->recompute, o->value_head);
	p->kv = (double)o->kv_tokens * c->n_layer * 2.0 * c->n_kv_head * c->head_dim * act;
	if (o->ref)
		plan_ref(p, o->ref, o, act);
	p->total = p->weights + p->grads + p->optim + p->acts + p->kv + p->ref;
	/* LoRA trains on the CPU backend, without ZeRO or with ZeRO-3 sharding the
	 * base (docs/lora.md); ZeRO-2 and 3 on the CPU backend (docs/parallel.md) */
	p->runs = o->lora_rank == 0 ? o->zero <= 1 || (o->zero >= 2 && !o->cuda) :
	    (o->zero == 0 || o->zero == 3) && !o->cuda;
	p->fits = o->gpu_bytes > 0 && p->total <= o->gpu_bytes;
	return RL_OK;
}

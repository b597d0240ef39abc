/*
 * config.h — a model's hyper-parameters from a Hugging Face config.json, for
 * the Llama family (model_type "llama", "qwen2", "qwen3", "mistral"), Gemma 3
 * ("gemma3_text", "gemma3") and GPT-2 ("gpt2"),
 * and back to a config.json that transformers loads.
 *
 * Keys read (HF names): Llama family: vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size (required); num_key_value_heads,
 * head_dim, rope_theta, rms_norm_eps, max_position_embeddings,
 * tie_word_embeddings, attention_bias, mlp_bias, hidden_act, rope_scaling,
 * rope_parameters (transformers 5: rope_type and rope_theta in one object),
 * use_sliding_window, bos_token_id, eos_token_id, pad_token_id,
 * initializer_range, torch_dtype (optional, HF's defaults).  A config whose
 * "architectures" names a ...ForSequenceClassification class is a reward
 * model (seq_cls): its labels (id2label's size, else num_labels, else
 * transformers' default 2) must be 1, anything else is RL_ENOTSUP.  Qwen2 always has q/k/v biases and no o_proj bias; Qwen3 always
 * has q/k RMSNorm.  Mistral has no attention biases and a sliding_window W
 * (default 4096, null for none): query i sees keys (i - W, i].  Gemma 3
 * ("gemma3_text", or "gemma3" whose text_config is read and nothing else):
 * query_pre_attn_scalar, sliding_window, layer_types or sliding_window_pattern
 * (every Nth layer full attention, default 6), rope_local_base_freq, rope_scaling
 * "linear" (full-attention layers only), hidden_activation gelu_pytorch_tanh;
 * attn_logit_softcapping and final_logit_softcapping must be null (Gemma 3's;
 * Gemma 2's tanh soft-capping is not implemented).  GPT-2: vocab_size, n_embd, n_layer, n_head, n_positions
 * (required); n_inner, layer_norm_epsilon, activation_function,
 * tie_word_embeddings, bos/eos.  rope_type "default" and "llama3" (Llama 3.1 /
 * 3.2: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
 * are read.  What we cannot compute the same way as transformers (another
 * rope_type: linear outside Gemma 3, dynamic, yarn, longrope, ...; mlp_bias,
 * other activations, soft-capping) is refused with RL_ENOTSUP rather than computed
 * differently.
 *
 * Leaves out: tokenizer settings, generation_config.json.
 */
#ifndef RL_CONFIG_H
#define RL_CONFIG_H

#include "base/core.h"

/* Gemma 3: the most layers whose attention type is recorded (the 27B has 62). */
#define RL_CONFIG_MAX_LOCAL 256

typedef enum rl_arch { RL_ARCH_LLAMA = 0, RL_ARCH_GPT2 = 1 } rl_arch;

typedef struct rl_config {
	int arch;               /* rl_arch */
	char model_type[16];    /* "llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gpt2" */
	int vocab_size;         /* V */
	int hidden_size;        /* C */
	int n_layer;            /* L */
	int n_head;             /* NH */
	int n_kv_head;          /* NKV (GPT-2: NH) */
	int head_dim;           /* HD */
	int intermediate_size;  /* H (GPT-2: n_inner or 4C) */
	int max_pos;            /* the longest context computed: max_position_embeddings / n_positions
				 * (rl_model caps it at sliding_window on a backend without windows) */
	int max_pos_config;     /* Mistral: the config's max_position_embeddings (0: max_pos) */
	int sliding_window;     /* W: a query of a windowed layer sees the last W positions (0: no window);
				 * Mistral: every layer, Gemma 3: its sliding_attention layers */
	int gemma;              /* Gemma 3: RMSNorms scale by (1 + w); four per layer (input,
				 * post_attention, pre_feedforward, post_feedforward); embeddings times
				 * sqrt(hidden_size); GELU (tanh) gated MLP */
	float attn_scale;       /* the scores' scale: Gemma 3 query_pre_attn_scalar^-0.5; 0: 1/sqrt(head_dim) */
	float rope_local_theta; /* Gemma 3: rope_local_base_freq, the base of the sliding layers (unscaled) */
	float rope_linear;      /* Gemma 3: rope_scaling "linear" factor of the full-attention layers (0: none) */
	unsigned char local[RL_CONFIG_MAX_LOCAL]; /* Gemma 3: 1 for a sliding_attention layer */
	float rope_theta;
	float rope_factor;      /* rope_type "llama3": factor; 0 for no scaling (then the next three 0) */
	float rope_low_freq;    /* low_freq_factor */
	float rope_high_freq;   /* high_freq_factor */
	int rope_orig_max_pos;  /* original_max_position_embeddings */
	float norm_eps;         /* rms_norm_eps / layer_norm_epsilon */
	int qkv_bias;           /* q, k, v projections have biases */
	int o_bias;             /* o_proj has a bias (Llama attention_bias) */
	int qk_norm;            /* Qwen3 per-head RMSNorm of q and k */
	int tie_embeddings;     /* lm_head is embed_tokens */
	int bos_id, eos_id;     /* -1 when absent; eos_id: the first of an eos_token_id list */
	int eos_more[7];        /* the list's other ids (Llama-3.1-Instruct: <|eom_id|>, <|eot_id|>): */
	int n_eos_more;         /* each ends a generated sequence as EOS does */
	int dtype;              /* torch_dtype: RL_F32, RL_BF16 or RL_F16; the dtype checkpoints are saved in */
	int seq_cls;            /* a reward model: "architectures" names ...ForSequenceClassification
	                         * (num_labels 1, score.weight is the head, no lm_head) */
	int pad_id;             /* pad_token_id, -1 when absent */
	float init_std;         /* initializer_range (default 0.02): a new score head's std */
	char *raw;              /* the config.json text it was parsed from (owned; NULL when built in code) */
} rl_config;

/* rl_config_parse parses config.json text (len bytes); what names it in
 * errors ("'dir/config.json'").  cfg->raw keeps a copy.  RL_EFORMAT for
 * malformed JSON or missing/ill-typed keys, RL_ENOTSUP for features we do not
 * implement; each logged naming what and the key. */
int rl_config_parse(rl_config *cfg, const char *text, size_t len, const char *what);
/* rl_config_load reads path (a config.json) and parses it. */
int rl_config_load(rl_config *cfg, const char *path);
/* rl_config_check validates sizes (positive, NH % NKV == 0, HD even, ...). */
int rl_config_check(const rl_config *cfg, const char *what);
/* rl_config_to_json returns a malloc'd config.json for cfg: the original text
 * with torch_dtype set (and "architectures" added when it has none) when
 * cfg->raw is set, else one written from the fields with architectures and
 * model_type.  Caller frees. */
char *rl_config_to_json(const rl_config *cfg);
/* Frees cfg->raw (NULL-safe). */
void rl_config_fini(rl_config *cfg);
/* Deep copy (raw duplicated). */
void rl_config_copy(rl_config *dst, const rl_config *src);

#endif

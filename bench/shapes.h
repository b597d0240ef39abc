/*
 * bench/shapes.h — the model shapes the GPU benchmarks share: GPT-2 124M and
 * Qwen2.5-0.5B as their Hugging Face config.json (random weights; nothing
 * is downloaded).
 */
#ifndef RL_BENCH_SHAPES_H
#define RL_BENCH_SHAPES_H

static const char *gpt2_json =
    "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"vocab_size\":50257,"
    "\"n_embd\":768,\"n_layer\":12,\"n_head\":12,\"n_positions\":1024,\"n_ctx\":1024,"
    "\"n_inner\":null,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";
static const char *qwen_json =
    "{\"model_type\":\"qwen2\",\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":151936,"
    "\"hidden_size\":896,\"intermediate_size\":4864,\"num_hidden_layers\":24,"
    "\"num_attention_heads\":14,\"num_key_value_heads\":2,\"max_position_embeddings\":32768,"
    "\"rope_theta\":1000000.0,\"rms_norm_eps\":1e-06,\"hidden_act\":\"silu\","
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}";

/* The RL_CUDA_* switches set in the environment as one JSON string value ("" when none:
 * the defaults), e.g. "RL_CUDA_BGRAD=1 RL_CUDA_NORM_BWD_ADD=1", so that a benchmark's line
 * says which paths it measured.  Characters JSON would need escaped are left out. */
#include <stdlib.h>
#include <string.h>
extern char **environ;
static inline const char *
bench_cuda_env(void)
{
	static char buf[512];
	size_t n = 0;
	buf[0] = '\0';
	for (char **e = environ; e && *e; e++) {
		if (strncmp(*e, "RL_CUDA_", 8) != 0)
			continue;
		for (const char *p = *e; *p && n + 2 < sizeof buf; p++)
			if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
				buf[n++] = *p;
		if (n + 2 < sizeof buf)
			buf[n++] = ' ';
	}
	if (n > 0)
		n--;  /* the last space */
	buf[n] = '\0';
	return buf;
}
#endif

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

#endif

/* test_config.c — model/config.h: config.json as Hugging Face writes it for each
 * supported family (Llama 3.2 with its llama3 rope_scaling, Qwen2.5, Qwen3, Mistral 7B, GPT-2;
 * the published configs of Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B and gpt2, trimmed
 * of most keys the parser does not read) read into the fields the model uses; the
 * defaults transformers applies when a key is absent (Qwen3's head_dim of 128, not
 * hidden/heads); transformers 5's rope_parameters; what is refused, with its error
 * code (RL_EFORMAT for malformed or missing keys, RL_ENOTSUP for what is not
 * implemented); rl_config_load and rl_config_to_json. */
#include "model/config.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char llama32[] =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 128000,"
	" \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
	" \"intermediate_size\": 8192, \"max_position_embeddings\": 131072, \"mlp_bias\": false,"
	" \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
	" \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
	" \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
	" \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
	" \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
	" \"vocab_size\": 128256}";

static const char qwen25[] =
	"{\"architectures\": [\"Qwen2ForCausalLM\"], \"bos_token_id\": 151643, \"eos_token_id\": 151643,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 896, \"intermediate_size\": 4864,"
	" \"max_position_embeddings\": 32768, \"model_type\": \"qwen2\", \"num_attention_heads\": 14,"
	" \"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06,"
	" \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true,"
	" \"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char qwen3[] =
	"{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 151643,"
	" \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
	" \"intermediate_size\": 3072, \"max_position_embeddings\": 40960, \"model_type\": \"qwen3\","
	" \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8,"
	" \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000,"
	" \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
	" \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char gpt2[] =
	"{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"],"
	" \"bos_token_id\": 50256, \"eos_token_id\": 50256, \"layer_norm_epsilon\": 1e-05,"
	" \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, \"n_inner\": null,"
	" \"n_layer\": 12, \"n_positions\": 1024, \"scale_attn_weights\": true, \"vocab_size\": 50257}";

static int
parse(rl_config *c, const char *json)
{
	return rl_config_parse(c, json, strlen(json), "config");
}

/* json with the first occurrence of `from` replaced by `to`, in one of two static
 * buffers used in turn (so the result of one edit can be edited again). */
static const char *
edit(const char *json, const char *from, const char *to)
{
	static char bufs[2][4096];
	static int turn;
	char *buf = bufs[turn ^= 1];
	const char *p = strstr(json, from);

	if (p == NULL || strlen(json) - strlen(from) + strlen(to) >= sizeof bufs[0]) {
		fprintf(stderr, "test_config: '%s' not in the fixture\n", from);
		exit(1);
	}
	snprintf(buf, sizeof bufs[0], "%.*s%s%s", (int)(p - json), json, to, p + strlen(from));
	return buf;
}

/* rv of parsing json, the config freed */
static int
parse_rv(const char *json)
{
	rl_config c;
	int rv = parse(&c, json);
	rl_config_fini(&c);
	return rv;
}

static void
test_llama(void)
{
	rl_config c;

	T_EQ_INT(parse(&c, llama32), RL_OK);
	T_EQ_INT(c.arch, RL_ARCH_LLAMA);
	T_EQ_STR(c.model_type, "llama");
	T_EQ_INT(c.vocab_size, 128256);
	T_EQ_INT(c.hidden_size, 2048);
	T_EQ_INT(c.n_layer, 16);
	T_EQ_INT(c.n_head, 32);
	T_EQ_INT(c.n_kv_head, 8);
	T_EQ_INT(c.head_dim, 64);
	T_EQ_INT(c.intermediate_size, 8192);
	T_EQ_INT(c.max_pos, 131072);
	T_EQ_INT(c.rope_theta, 500000);
	T_OK(c.rope_factor == 32.0f && c.rope_low_freq == 1.0f && c.rope_high_freq == 4.0f,
	    "%g %g %g", c.rope_factor, c.rope_low_freq, c.rope_high_freq);
	T_EQ_INT(c.rope_orig_max_pos, 8192);
	T_OK(c.norm_eps == 1e-5f, "%g", c.norm_eps);
	T_EQ_INT(c.qkv_bias, 0);
	T_EQ_INT(c.o_bias, 0);
	T_EQ_INT(c.qk_norm, 0);
	T_EQ_INT(c.tie_embeddings, 1);
	T_EQ_INT(c.bos_id, 128000);
	T_EQ_INT(c.eos_id, 128001);
	T_EQ_INT(c.n_eos_more, 0);
	T_EQ_INT(c.dtype, RL_BF16);
	T_OK(c.raw != NULL && strcmp(c.raw, llama32) == 0, "raw keeps the text");
	rl_config_fini(&c);
	T_OK(c.raw == NULL, "fini clears raw");

	/* Llama-3.2-1B-Instruct: three ids end generation */
	T_EQ_INT(parse(&c, edit(llama32, "\"eos_token_id\": 128001", "\"eos_token_id\": [128001, 128008, 128009]")),
	    RL_OK);
	T_EQ_INT(c.eos_id, 128001);
	T_EQ_INT(c.n_eos_more, 2);
	T_EQ_INT(c.eos_more[0], 128008);
	T_EQ_INT(c.eos_more[1], 128009);
	rl_config_fini(&c);

	/* LlamaConfig's defaults: no scaling, theta 10000, kv heads = heads, head_dim =
	 * hidden / heads, 2048 positions, eps 1e-6, untied, f32, no bos/eos */
	T_EQ_INT(parse(&c, "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 64,"
			   " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 128}"),
	    RL_OK);
	T_EQ_INT(c.n_kv_head, 4);
	T_EQ_INT(c.head_dim, 16);
	T_EQ_INT(c.max_pos, 2048);
	T_EQ_INT(c.rope_theta, 10000);
	T_OK(c.rope_factor == 0 && c.rope_orig_max_pos == 0, "no rope scaling");
	T_OK(c.norm_eps == 1e-6f, "%g", c.norm_eps);
	T_EQ_INT(c.tie_embeddings, 0);
	T_EQ_INT(c.bos_id, -1);
	T_EQ_INT(c.eos_id, -1);
	T_EQ_INT(c.dtype, RL_F32);
	rl_config_fini(&c);

	/* attention_bias: q, k, v and o alike */
	T_EQ_INT(parse(&c, edit(llama32, "\"attention_bias\": false", "\"attention_bias\": true")), RL_OK);
	T_EQ_INT(c.qkv_bias, 1);
	T_EQ_INT(c.o_bias, 1);
	rl_config_fini(&c);
	/* transformers >= 4.56 writes "dtype" */
	T_EQ_INT(parse(&c, edit(llama32, "\"torch_dtype\": \"bfloat16\"", "\"dtype\": \"float16\"")), RL_OK);
	T_EQ_INT(c.dtype, RL_F16);
	rl_config_fini(&c);
}

static void
test_qwen(void)
{
	rl_config c;

	T_EQ_INT(parse(&c, qwen25), RL_OK);
	T_EQ_INT(c.arch, RL_ARCH_LLAMA);
	T_EQ_STR(c.model_type, "qwen2");
	T_EQ_INT(c.vocab_size, 151936);
	T_EQ_INT(c.hidden_size, 896);
	T_EQ_INT(c.n_layer, 24);
	T_EQ_INT(c.n_head, 14);
	T_EQ_INT(c.n_kv_head, 2);
	T_EQ_INT(c.head_dim, 64);       /* 896 / 14 */
	T_EQ_INT(c.intermediate_size, 4864);
	T_EQ_INT(c.max_pos, 32768);
	T_EQ_INT(c.rope_theta, 1000000);
	T_OK(c.norm_eps == 1e-6f, "%g", c.norm_eps);
	T_EQ_INT(c.qkv_bias, 1);        /* Qwen2: q/k/v biases, whatever attention_bias says */
	T_EQ_INT(c.o_bias, 0);
	T_EQ_INT(c.qk_norm, 0);
	T_EQ_INT(c.tie_embeddings, 1);
	T_EQ_INT(c.eos_id, 151643);
	rl_config_fini(&c);
	/* Qwen2Config's max_position_embeddings default is 32768, not Llama's 2048 */
	T_EQ_INT(parse(&c, edit(qwen25, "\"max_position_embeddings\": 32768, ", "")), RL_OK);
	T_EQ_INT(c.max_pos, 32768);
	rl_config_fini(&c);

	T_EQ_INT(parse(&c, qwen3), RL_OK);
	T_EQ_STR(c.model_type, "qwen3");
	T_EQ_INT(c.hidden_size, 1024);
	T_EQ_INT(c.n_layer, 28);
	T_EQ_INT(c.n_head, 16);
	T_EQ_INT(c.n_kv_head, 8);
	T_EQ_INT(c.head_dim, 128);      /* not 1024 / 16 */
	T_EQ_INT(c.intermediate_size, 3072);
	T_EQ_INT(c.max_pos, 40960);
	T_EQ_INT(c.rope_theta, 1000000);
	T_OK(c.rope_factor == 0, "rope_scaling null: none");
	T_EQ_INT(c.qk_norm, 1);
	T_EQ_INT(c.qkv_bias, 0);
	T_EQ_INT(c.o_bias, 0);
	T_EQ_INT(c.bos_id, 151643);
	T_EQ_INT(c.eos_id, 151645);
	T_EQ_INT(c.dtype, RL_BF16);
	rl_config_fini(&c);
	/* Qwen3Config's head_dim default is 128, where Llama and Qwen2 take hidden / heads (64) */
	T_EQ_INT(parse(&c, edit(qwen3, "\"head_dim\": 128, ", "")), RL_OK);
	T_EQ_INT(c.head_dim, 128);
	rl_config_fini(&c);
	T_EQ_INT(parse(&c, edit(edit(qwen3, "\"head_dim\": 128, ", ""), "\"qwen3\"", "\"llama\"")), RL_OK);
	T_EQ_INT(c.head_dim, 64);
	T_EQ_INT(c.qk_norm, 0);
	rl_config_fini(&c);
}

static void
test_gpt2(void)
{
	rl_config c;

	T_EQ_INT(parse(&c, gpt2), RL_OK);
	T_EQ_INT(c.arch, RL_ARCH_GPT2);
	T_EQ_STR(c.model_type, "gpt2");
	T_EQ_INT(c.vocab_size, 50257);
	T_EQ_INT(c.hidden_size, 768);
	T_EQ_INT(c.n_layer, 12);
	T_EQ_INT(c.n_head, 12);
	T_EQ_INT(c.n_kv_head, 12);
	T_EQ_INT(c.head_dim, 64);
	T_EQ_INT(c.intermediate_size, 3072);    /* n_inner null: 4 * n_embd */
	T_EQ_INT(c.max_pos, 1024);
	T_OK(c.norm_eps == 1e-5f, "%g", c.norm_eps);
	T_EQ_INT(c.qkv_bias, 1);
	T_EQ_INT(c.o_bias, 1);
	T_EQ_INT(c.qk_norm, 0);
	T_EQ_INT(c.tie_embeddings, 1);          /* GPT2Config ties by default */
	T_EQ_INT(c.bos_id, 50256);
	T_EQ_INT(c.eos_id, 50256);
	T_EQ_INT(c.dtype, RL_F32);              /* no torch_dtype */
	T_OK(c.rope_theta == 0 && c.rope_factor == 0, "GPT-2 has no RoPE");
	rl_config_fini(&c);
	T_EQ_INT(parse(&c, edit(gpt2, "\"n_inner\": null", "\"n_inner\": 1000")), RL_OK);
	T_EQ_INT(c.intermediate_size, 1000);
	rl_config_fini(&c);
}

static void
test_rope(void)
{
	rl_config c;

	/* transformers 5: rope_type and rope_theta in rope_parameters, no top-level theta */
	T_EQ_INT(parse(&c, edit(qwen3, "\"rope_scaling\": null, \"rope_theta\": 1000000,",
				"\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0},")),
	    RL_OK);
	T_EQ_INT(c.rope_theta, 1000000);
	T_OK(c.rope_factor == 0, "default rope: no scaling");
	rl_config_fini(&c);
	T_EQ_INT(parse(&c, edit(llama32, "\"rope_scaling\"", "\"rope_parameters\"")), RL_OK);
	T_OK(c.rope_factor == 32.0f && c.rope_low_freq == 1.0f && c.rope_high_freq == 4.0f &&
	    c.rope_orig_max_pos == 8192, "llama3 scaling from rope_parameters");
	rl_config_fini(&c);
	/* the legacy "type" key names the rope type too */
	T_EQ_INT(parse(&c, edit(llama32, "\"rope_type\": \"llama3\"", "\"type\": \"llama3\"")), RL_OK);
	T_OK(c.rope_factor == 32.0f, "%g", c.rope_factor);
	rl_config_fini(&c);

	/* what is refused */
	T_EQ_INT(parse_rv(edit(llama32, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(llama32, "\"rope_type\": \"llama3\"", "\"rope_type\": \"linear\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(llama32, "\"low_freq_factor\": 1.0, ", "")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"factor\": 32.0", "\"factor\": -2")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"original_max_position_embeddings\": 8192",
				   "\"original_max_position_embeddings\": 8192.5")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"rope_type\": \"llama3\"}",
				   "\"rope_type\": \"llama3\", \"partial_rotary_factor\": 0.5}")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(qwen3, "\"rope_scaling\": null", "\"rope_scaling\": 2")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(qwen3, "\"rope_scaling\": null",
			       "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}}")),
	    RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(qwen3, "\"rope_theta\": 1000000", "\"rope_theta\": \"big\"")), RL_EFORMAT);
}

static void
test_refused(void)
{
	/* malformed */
	T_EQ_INT(parse_rv("{\"model_type\": \"llama\""), RL_EFORMAT);
	T_EQ_INT(parse_rv("[1, 2]"), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gpt2, "\"model_type\": \"gpt2\", ", "")), RL_EFORMAT);
	/* another family */
	T_EQ_INT(parse_rv(edit(llama32, "\"llama\"", "\"gemma2\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(llama32, "\"llama\"", "\"qwen3_moe\"")), RL_ENOTSUP);
	/* a required key missing, per family */
	T_EQ_INT(parse_rv(edit(llama32, "\"hidden_size\": 2048, ", "")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"vocab_size\": 128256", "\"vocab_size\": null")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(qwen25, "\"intermediate_size\": 4864, ", "")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(qwen3, "\"num_hidden_layers\": 28, ", "")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gpt2, "\"n_positions\": 1024, ", "")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gpt2, "\"n_embd\": 768, ", "")), RL_EFORMAT);
	/* ill-typed or out of range */
	T_EQ_INT(parse_rv(edit(llama32, "\"vocab_size\": 128256", "\"vocab_size\": 128256.5")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"vocab_size\": 128256", "\"vocab_size\": 3000000000")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"vocab_size\": 128256", "\"vocab_size\": \"128256\"")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"1e-5\"")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"int8\"")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"eos_token_id\": 128001", "\"eos_token_id\": [1, -2]")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"eos_token_id\": 128001", "\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]")),
	    RL_EFORMAT);
	/* sizes rl_config_check refuses */
	T_EQ_INT(parse_rv(edit(llama32, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"head_dim\": 64", "\"head_dim\": 63")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 0")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(llama32, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gpt2, "\"n_head\": 12", "\"n_head\": 7")), RL_EFORMAT);
	/* features not implemented */
	T_EQ_INT(parse_rv(edit(llama32, "\"mlp_bias\": false", "\"mlp_bias\": true")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(llama32, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(qwen25, "\"use_sliding_window\": false", "\"use_sliding_window\": true")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gpt2, "\"gelu_new\"", "\"relu\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gpt2, "\"scale_attn_weights\": true", "\"scale_attn_weights\": false")), RL_ENOTSUP);
	/* the other tanh GELU spelling is the same function */
	T_EQ_INT(parse_rv(edit(gpt2, "\"gelu_new\"", "\"gelu_pytorch_tanh\"")), RL_OK);
}

/* rl_config_load from a file; rl_config_to_json back, for a config with its text and one
 * built in code (raw NULL), read again into the same fields. */
static void
test_load_and_json(void)
{
	char dir[] = "/tmp/rl-test-config.XXXXXX", path[64];
	rl_config c, d, e;
	char *js;
	FILE *f;

	if (mkdtemp(dir) == NULL) {
		T_OK(0, "mkdtemp");
		return;
	}
	snprintf(path, sizeof path, "%s/config.json", dir);
	f = fopen(path, "w");
	fputs(qwen3, f);
	fclose(f);
	T_EQ_INT(rl_config_load(&c, path), RL_OK);
	T_EQ_INT(c.head_dim, 128);
	T_EQ_INT(c.qk_norm, 1);

	/* with raw: the same text, torch_dtype set to the config's dtype */
	c.dtype = RL_F32;
	js = rl_config_to_json(&c);
	T_EQ_INT(parse(&d, js), RL_OK);
	T_EQ_INT(d.dtype, RL_F32);
	T_EQ_INT(d.n_layer, 28);
	rl_config_fini(&d);
	free(js);

	/* without raw: written from the fields */
	rl_config_copy(&d, &c);
	free(d.raw);
	d.raw = NULL;
	d.dtype = RL_BF16;
	js = rl_config_to_json(&d);
	T_EQ_INT(parse(&e, js), RL_OK);
	T_OK(strstr(js, "Qwen3ForCausalLM") != NULL, "architectures written");
	T_EQ_STR(e.model_type, "qwen3");
	T_OK(e.vocab_size == d.vocab_size && e.hidden_size == d.hidden_size && e.n_layer == d.n_layer &&
	    e.n_head == d.n_head && e.n_kv_head == d.n_kv_head && e.head_dim == d.head_dim &&
	    e.intermediate_size == d.intermediate_size && e.max_pos == d.max_pos &&
	    e.rope_theta == d.rope_theta && e.norm_eps == d.norm_eps && e.qk_norm == d.qk_norm &&
	    e.qkv_bias == d.qkv_bias && e.tie_embeddings == d.tie_embeddings && e.bos_id == d.bos_id &&
	    e.eos_id == d.eos_id && e.dtype == RL_BF16, "qwen3 fields read back");
	rl_config_fini(&e);
	free(js);
	rl_config_fini(&d);
	rl_config_fini(&c);

	/* Llama 3.2 with its scaling and eos list, written from the fields */
	T_EQ_INT(parse(&c, edit(llama32, "\"eos_token_id\": 128001", "\"eos_token_id\": [128001, 128009]")), RL_OK);
	free(c.raw);
	c.raw = NULL;
	js = rl_config_to_json(&c);
	T_EQ_INT(parse(&e, js), RL_OK);
	T_OK(e.rope_factor == 32.0f && e.rope_low_freq == 1.0f && e.rope_high_freq == 4.0f &&
	    e.rope_orig_max_pos == 8192 && e.rope_theta == 500000.0f, "llama3 rope read back");
	T_OK(e.eos_id == 128001 && e.n_eos_more == 1 && e.eos_more[0] == 128009, "eos list read back");
	rl_config_fini(&e);
	free(js);
	rl_config_fini(&c);

	/* GPT-2 written from the fields */
	T_EQ_INT(parse(&c, gpt2), RL_OK);
	free(c.raw);
	c.raw = NULL;
	js = rl_config_to_json(&c);
	T_EQ_INT(parse(&e, js), RL_OK);
	T_OK(e.arch == RL_ARCH_GPT2 && e.hidden_size == 768 && e.intermediate_size == 3072 && e.max_pos == 1024 &&
	    e.tie_embeddings == 1, "gpt2 fields read back");
	rl_config_fini(&e);
	free(js);
	rl_config_fini(&c);

	unlink(path);
	snprintf(path, sizeof path, "%s/missing.json", dir);
	T_EQ_INT(rl_config_load(&c, path), RL_ENOENT);
	rmdir(dir);
}

/* Mistral-7B-v0.1's published config.json (trimmed): a 4096-token sliding window */
static const char mistral01[] =
	"{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","
	" \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
	" \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
	" \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";

/* Mistral: Llama's layout without biases; the sliding window kept beside the whole
 * context (computed on the CPU), the config's max_position_embeddings written back. */
static void
test_mistral(void)
{
	rl_config c;
	char *js;

	T_EQ_INT(parse(&c, mistral01), 0);
	T_EQ_INT(c.arch, RL_ARCH_LLAMA);
	T_EQ_STR(c.model_type, "mistral");
	T_EQ_INT(c.head_dim, 128);
	T_EQ_INT(c.n_kv_head, 8);
	T_EQ_INT(c.qkv_bias + c.o_bias + c.qk_norm, 0);
	T_EQ_INT(c.sliding_window, 4096);
	T_EQ_INT(c.max_pos, 32768);
	T_EQ_INT(c.max_pos_config, 32768);
	T_OK(c.rope_theta == 10000.0f, "mistral");
	free(c.raw);
	c.raw = NULL;
	js = rl_config_to_json(&c);
	T_OK(strstr(js, "\"max_position_embeddings\":\t32768") != NULL, "mistral");
	T_OK(strstr(js, "\"sliding_window\":\t4096") != NULL, "mistral");
	T_OK(strstr(js, "MistralForCausalLM") != NULL, "mistral");
	T_OK(strstr(js, "attention_bias") == NULL, "mistral");
	rl_config_fini(&c);
	free(js);
	/* v0.2 / v0.3: no window, the whole context */
	T_EQ_INT(parse(&c, edit(mistral01, "\"sliding_window\": 4096", "\"sliding_window\": null")), 0);
	T_EQ_INT(c.sliding_window, 0);
	T_EQ_INT(c.max_pos, 32768);
	rl_config_fini(&c);
	/* MistralConfig's defaults: window 4096, 4096 * 32 positions, head_dim hidden/heads */
	T_EQ_INT(parse(&c, edit(edit(mistral01, "\"sliding_window\": 4096, ", ""),
	    "\"max_position_embeddings\": 32768, ", "")), 0);
	T_EQ_INT(c.sliding_window, 4096);
	T_EQ_INT(c.max_pos, 131072);
	T_EQ_INT(c.max_pos_config, 131072);
	rl_config_fini(&c);
	/* a window wider than the context never binds */
	T_EQ_INT(parse(&c, edit(mistral01, "\"sliding_window\": 4096", "\"sliding_window\": 65536")), 0);
	T_EQ_INT(c.max_pos, 32768);
	rl_config_fini(&c);
	T_EQ_INT(parse_rv(edit(mistral01, "\"sliding_window\": 4096", "\"sliding_window\": 0")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(mistral01, "\"sliding_window\": 4096", "\"sliding_window\": -1")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(mistral01, "\"sliding_window\": 4096", "\"sliding_window\": \"x\"")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(mistral01, "\"rope_theta\": 10000.0", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}")),
	    RL_ENOTSUP);
}

/* gemma-3-1b-it's published config.json (gemma3_text) */
static const char gemma1b[] =
	"{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
	" \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"cache_implementation\": \"hybrid\","
	" \"eos_token_id\": [1, 106], \"final_logit_softcapping\": null, \"head_dim\": 256,"
	" \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 1152, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 6912, \"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\","
	" \"num_attention_heads\": 4, \"num_hidden_layers\": 26, \"num_key_value_heads\": 1,"
	" \"pad_token_id\": 0, \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
	" \"rope_local_base_freq\": 10000, \"rope_scaling\": null, \"rope_theta\": 1000000,"
	" \"sliding_window\": 512, \"sliding_window_pattern\": 6, \"torch_dtype\": \"bfloat16\","
	" \"use_cache\": true, \"vocab_size\": 262144}";

/* gemma-3-4b-it's (gemma3: the text model nested, Gemma3TextConfig's defaults for the rest) */
static const char gemma4b[] =
	"{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": 255999,"
	" \"eoi_token_index\": 256000, \"eos_token_id\": [1, 106], \"image_token_index\": 262144,"
	" \"mm_tokens_per_image\": 256, \"model_type\": \"gemma3\","
	" \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
	" \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},"
	" \"sliding_window\": 1024}, \"torch_dtype\": \"bfloat16\","
	" \"vision_config\": {\"hidden_size\": 1152, \"model_type\": \"siglip_vision_model\"}}";

/* Gemma 3: Gemma3TextConfig's defaults, the layer types from sliding_window_pattern or
 * layer_types, the scale, the two RoPE bases; gemma3's text_config kept as a gemma3_text
 * config; what is refused. */
static void
test_gemma3(void)
{
	rl_config c;
	char *js;

	T_EQ_INT(parse(&c, gemma1b), 0);
	T_EQ_INT(c.arch, RL_ARCH_LLAMA);
	T_EQ_STR(c.model_type, "gemma3_text");
	T_EQ_INT(c.gemma, 1);
	T_EQ_INT(c.qk_norm, 1);
	T_EQ_INT(c.head_dim, 256);
	T_EQ_INT(c.n_kv_head, 1);
	T_EQ_INT(c.tie_embeddings, 1);
	T_EQ_INT(c.sliding_window, 512);
	T_EQ_INT(c.max_pos, 32768);
	T_EQ_INT(c.eos_id, 1);
	T_EQ_INT(c.n_eos_more, 1);
	T_EQ_INT(c.eos_more[0], 106);
	T_OK(c.attn_scale == 0.0625f, "gemma3 scale %g", c.attn_scale);
	T_OK(c.rope_theta == 1e6f && c.rope_local_theta == 1e4f && c.rope_linear == 0, "gemma3 rope");
	/* every 6th layer (5, 11, ...) full attention */
	for (int l = 0; l < 26; l++)
		T_EQ_INT(c.local[l], (l + 1) % 6 != 0);
	T_EQ_INT(c.dtype, RL_BF16);
	free(c.raw);
	c.raw = NULL;
	js = rl_config_to_json(&c);
	T_OK(strstr(js, "Gemma3ForCausalLM") != NULL && strstr(js, "\"query_pre_attn_scalar\":\t256") != NULL &&
	    strstr(js, "\"sliding_window\":\t512") != NULL && strstr(js, "gelu_pytorch_tanh") != NULL, "%s", js);
	T_OK(strstr(js, "\"full_attention\"") != NULL && strstr(js, "\"sliding_attention\"") != NULL, "gemma3 layers");
	free(js);
	rl_config_fini(&c);

	/* gemma3: the text model; linear scaling; eos from the top */
	T_EQ_INT(parse(&c, gemma4b), 0);
	T_EQ_STR(c.model_type, "gemma3_text");
	T_EQ_INT(c.hidden_size, 2560);
	T_EQ_INT(c.n_layer, 34);
	T_EQ_INT(c.n_head, 8);
	T_EQ_INT(c.n_kv_head, 4);
	T_EQ_INT(c.vocab_size, 262208);
	T_OK(c.rope_linear == 8.0f, "gemma3 linear %g", c.rope_linear);
	T_EQ_INT(c.sliding_window, 1024);
	T_EQ_INT(c.eos_id, 1);
	T_EQ_INT(c.eos_more[0], 106);
	T_EQ_INT(c.dtype, RL_BF16);
	js = rl_config_to_json(&c);
	T_OK(strstr(js, "\"model_type\":\t\"gemma3_text\"") != NULL && strstr(js, "Gemma3ForCausalLM") != NULL &&
	    strstr(js, "vision_config") == NULL && strstr(js, "106") != NULL, "%s", js);
	free(js);
	rl_config_fini(&c);

	/* layer_types instead of the pattern */
	T_EQ_INT(parse(&c, edit(gemma1b, "\"num_hidden_layers\": 26", "\"num_hidden_layers\": 3, \"layer_types\": "
	    "[\"full_attention\", \"sliding_attention\", \"full_attention\"]")), 0);
	T_EQ_INT(c.local[0] + 2 * c.local[1] + 4 * c.local[2], 2);
	rl_config_fini(&c);
	/* refused, by name */
	T_EQ_INT(parse_rv(edit(gemma1b, "\"num_hidden_layers\": 26", "\"num_hidden_layers\": 2, \"layer_types\": "
	    "[\"full_attention\", \"chunked_attention\"]")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"num_hidden_layers\": 26", "\"num_hidden_layers\": 2, \"layer_types\": "
	    "[\"full_attention\"]")), RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", "
	    "\"factor\": 8}")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"linear\"}")),
	    RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"attn_logit_softcapping\": null", "\"attn_logit_softcapping\": 50.0")),
	    RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 30.0")),
	    RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"gelu_pytorch_tanh\"", "\"silu\"")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"query_pre_attn_scalar\": 256", "\"query_pre_attn_scalar\": 0")),
	    RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"sliding_window_pattern\": 6", "\"sliding_window_pattern\": 0")),
	    RL_EFORMAT);
	T_EQ_INT(parse_rv(edit(gemma4b, "\"text_config\": {", "\"text_configs\": {")), RL_EFORMAT);
	/* transformers 5: one RoPE object per layer type */
	T_EQ_INT(parse(&c, edit(gemma1b, "\"rope_scaling\": null", "\"rope_parameters\": {\"full_attention\": "
	    "{\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 500000.0}, \"sliding_attention\": "
	    "{\"rope_type\": \"default\", \"rope_theta\": 20000.0}}")), 0);
	T_OK(c.rope_theta == 5e5f && c.rope_linear == 8.0f && c.rope_local_theta == 2e4f, "gemma3 rope_parameters");
	rl_config_fini(&c);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"rope_scaling\": null", "\"rope_parameters\": {\"sliding_attention\": "
	    "{\"rope_type\": \"linear\", \"factor\": 8.0}}")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"rope_scaling\": null", "\"rope_parameters\": {\"rope_type\": "
	    "\"default\", \"rope_theta\": 1000000}")), RL_ENOTSUP);
	T_EQ_INT(parse_rv(edit(gemma1b, "\"rope_scaling\": null", "\"rope_parameters\": {\"full_attention\": "
	    "{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25}}")), RL_ENOTSUP);
}

int
main(void)
{
	T_BEGIN("test_config");
	rl_log_init("test_config", RL_LOG_QUIET);
	test_llama();
	test_gemma3();
	test_qwen();
	test_gpt2();
	test_rope();
	test_refused();
	test_mistral();
	test_load_and_json();
	T_END();
}

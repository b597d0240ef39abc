/*
 * gpu_gen.c — generation throughput of the model on the CUDA backend
 * (rl_model_prefill / rl_model_decode over the paged KV cache, sampling on the
 * device with ops->sample, temperature 1): random-initialised GPT-2 124M and
 * Qwen2.5-0.5B shapes, prompts of 64 tokens, `new` generated tokens, batch
 * (slots) 1, 64 and 256, all sequences in lock-step.  One JSON line per run:
 * decode tokens/s (generated tokens over the decode loop's time), prefill ms,
 * and the fraction of the memory-bandwidth bound (weights in bf16 + the KV read
 * per step, over 3.0e12 B/s measured on the H100 here).
 *
 * Usage: gpu_gen [gpt2|qwen|all] [new]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kvcache.h"
#include "model.h"
#include "ops.h"
#include "rng.h"


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

#define HBM_BPS 3.0e12

static int
bench(rl_ops *o, const char *name, const char *json, int B, int P, int NEW)
{
	rl_config cfg;
	rl_model *m = NULL;
	rl_kvcache *kv = NULL;
	rl_kvseq *s = NULL, **sp = NULL;
	int32_t **prompts = NULL, *ntok = NULL, *tok = NULL, *dtok = NULL;
	uint64_t *seed = NULL, *ctr = NULL, *dseed = NULL, *dctr = NULL;
	float *dlp = NULL;
	int rv;
	memset(&cfg, 0, sizeof cfg);
	if ((rv = rl_config_parse(&cfg, json, strlen(json), name)))
		return rv;
	if ((rv = rl_model_init_random(&m, &cfg, o, 7)) || (rv = rl_model_infer_reserve(m, B * P, B)))
		goto out;
	size_t kvtok = (size_t)2 * cfg.n_kv_head * (cfg.hidden_size / cfg.n_head) * 2 * cfg.n_layer;
	if ((rv = rl_kvcache_open(&kv, o, &cfg, kvtok * (size_t)B * (P + NEW + 32) + ((size_t)64 << 20), 16)))
		goto out;
	s = rl_xcalloc(B, sizeof *s);
	sp = rl_xcalloc(B, sizeof *sp);
	prompts = rl_xcalloc(B, sizeof *prompts);
	ntok = rl_xcalloc(B, sizeof *ntok);
	tok = rl_xcalloc(B, sizeof *tok);
	seed = rl_xcalloc(B, 8);
	ctr = rl_xcalloc(B, 8);
	rl_rng r = { 99, 0 };
	for (int b = 0; b < B; b++) {
		rl_kvseq_init(&s[b], kv);
		sp[b] = &s[b];
		prompts[b] = rl_xmalloc(P * 4);
		for (int i = 0; i < P; i++)
			prompts[b][i] = (int32_t)(rl_rng_next(&r) % (uint64_t)cfg.vocab_size);
		ntok[b] = P;
		seed[b] = 1000 + b;
	}
	if ((rv = o->alloc(o, (void **)&dtok, B * 4)) || (rv = o->alloc(o, (void **)&dlp, B * 4)) ||
	    (rv = o->alloc(o, (void **)&dseed, B * 8)) || (rv = o->alloc(o, (void **)&dctr, B * 8)))
		goto out;
	o->upload(o, dseed, seed, B * 8);
	rl_sample_params sp_ = { 1.0f, 0, 1.0f };
	double t0 = rl_now();
	if ((rv = rl_model_prefill(m, kv, sp, (const int32_t *const *)prompts, ntok, B, NULL)))
		goto out;
	if ((rv = o->sync(o)))
		goto out;
	double tp = rl_now() - t0;
	t0 = rl_now();
	for (int step = 0; step < NEW; step++) {
		for (int b = 0; b < B; b++)
			ctr[b] = (uint64_t)step;
		o->upload(o, dctr, ctr, B * 8);
		o->sample(o, dtok, dlp, m->logits, dseed, dctr, B, cfg.vocab_size, &sp_);
		o->download(o, tok, dtok, B * 4);
		if (step + 1 < NEW && (rv = rl_model_decode(m, kv, sp, tok, B, NULL)))
			goto out;
	}
	if ((rv = o->sync(o)))
		goto out;
	double td = rl_now() - t0;
	double wbytes = (double)rl_model_nparams(m) * 2;
	double kvread = (double)kvtok * B * (P + NEW / 2.0);  /* mean context over the run */
	double step_s = td / NEW, bound = (wbytes + kvread) / HBM_BPS;
	printf("{\"what\":\"rlpipe_generate\",\"model\":\"%s\",\"batch\":%d,\"prompt\":%d,\"new\":%d,"
	    "\"prefill_ms\":%.1f,\"decode_step_ms\":%.3f,\"tokens_per_s\":%.0f,\"bw_bound_fraction\":%.3f}\n",
	    name, B, P, NEW, tp * 1e3, step_s * 1e3, B * NEW / td, bound / step_s);
	fflush(stdout);
out:
	if (rv)
		fprintf(stderr, "gpu_gen: %s batch %d: %s\n", name, B, rl_strerror(rv));
	if (s)
		for (int b = 0; b < B; b++) {
			rl_kvcache_release(kv, &s[b]);
			free(prompts[b]);
		}
	o->free(o, dtok); o->free(o, dlp); o->free(o, dseed); o->free(o, dctr);
	rl_kvcache_close(kv);
	rl_model_close(m);
	rl_config_fini(&cfg);
	free(s); free(sp); free(prompts); free(ntok); free(tok); free(seed); free(ctr);
	return rv;
}

int
main(int argc, char **argv)
{
	rl_ops *o = NULL;
	const char *which = argc > 1 ? argv[1] : "all";
	int NEW = argc > 2 ? atoi(argv[2]) : 256, rv = 0;
	rl_log_init("gpu_gen", 1);
	if ((rv = rl_ops_open(&o, "cuda")) != RL_OK) {
		fprintf(stderr, "gpu_gen: no CUDA backend: %s\n", rl_strerror(rv));
		return 1;
	}
	int bs[] = { 1, 64, 256 };
	for (int i = 0; i < 3; i++) {
		if (!strcmp(which, "all") || !strcmp(which, "gpt2"))
			rv |= bench(o, "gpt2-124m", gpt2_json, bs[i], 64, NEW);
		if (!strcmp(which, "all") || !strcmp(which, "qwen"))
			rv |= bench(o, "qwen2.5-0.5b", qwen_json, bs[i], 64, NEW);
	}
	rl_ops_close(o);
	return rv ? 1 : 0;
}

/*
 * gpu_train.c — training-step throughput of the model on the CUDA backend:
 * random-initialised GPT-2 124M shape (batch 16 x 1024) and Qwen2.5-0.5B shape
 * (batch 8 x 1024), the same work as ../shared/bench/torch_baseline.py train:
 * forward (log-probs of the next tokens), a GRPO-style loss (-(lp * adv).mean(),
 * advantage per row), backward, AdamW.  Prints one JSON line per model:
 * tokens/s, ms per step, MFU against 989 TFLOP/s (6 P + 12 L C T flops per
 * token, as the baseline counts), device memory in use.
 *
 * Usage: gpu_train [gpt2|qwen|all] [steps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"

#if HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "shapes.h"

static int
bench(rl_ops *o, const char *name, const char *json, int B, int T, int steps)
{
	rl_config cfg;
	rl_model *m = NULL;
	int rv, N = B * T;
	int32_t *tok = NULL, *tgt = NULL;
	float *dlp = NULL, *ddlp = NULL;
	memset(&cfg, 0, sizeof cfg);
	if ((rv = rl_config_parse(&cfg, json, strlen(json), name)))
		return rv;
	if ((rv = rl_model_init_random(&m, &cfg, o, 1234)) || (rv = rl_model_train_reserve(m, N)))
		goto out;
	tok = rl_xmalloc(N * 4);
	tgt = rl_xmalloc(N * 4);
	dlp = rl_xmalloc(N * 4);
	rl_rng r = { 42, 0 };
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)(rl_rng_next(&r) % (uint64_t)cfg.vocab_size);
	for (int b = 0; b < B; b++) {
		float adv = (float)(rl_rng_next_uniform(&r) * 2 - 1);
		for (int t = 0; t < T; t++) {
			tgt[b * T + t] = t + 1 < T ? tok[b * T + t + 1] : -1;
			dlp[b * T + t] = t + 1 < T ? -adv / (float)(B * (T - 1)) : 0.0f;
		}
	}
	if ((rv = o->alloc(o, (void **)&ddlp, (size_t)N * 4)))
		goto out;
	o->upload(o, ddlp, dlp, (size_t)N * 4);
	rl_adamw hp = { .lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
		.max_grad_norm = 0 };
	double t0 = 0;
	for (int s = 0; s < steps + 3; s++) {
		if (s == 3) {
			if ((rv = o->sync(o)))
				goto out;
			t0 = rl_now();
		}
		if ((rv = rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f)) ||
		    (rv = rl_model_backward(m, ddlp, NULL)) || (rv = rl_model_step(m, &hp, NULL)))
			goto out;
	}
	if ((rv = o->sync(o)))
		goto out;
	double dt = (rl_now() - t0) / steps;
	double P = (double)rl_model_nparams(m);
	double flops_tok = 6 * P + 12.0 * cfg.n_layer * cfg.hidden_size * T;
	double tps = N / dt, used = 0;
#if HAVE_CUDA
	size_t fr = 0, tot = 0;
	if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
		used = (double)(tot - fr) / (1 << 30);
#endif
	printf("{\"what\":\"rlpipe_train_step\",\"model\":\"%s\",\"params\":%.0f,\"batch\":%d,\"seq\":%d,"
	    "\"step_ms\":%.1f,\"tokens_per_s\":%.0f,\"mfu_vs_989\":%.3f,\"device_mem_used_gb\":%.1f,"
	    "\"switches\":\"%s\"}\n",
	    name, P, B, T, dt * 1e3, tps, tps * flops_tok / 989e12, used, bench_cuda_env());
	fflush(stdout);
out:
	if (rv)
		fprintf(stderr, "gpu_train: %s: %s\n", name, rl_strerror(rv));
	if (ddlp)
		o->free(o, ddlp);
	rl_model_close(m);
	rl_config_fini(&cfg);
	free(tok);
	free(tgt);
	free(dlp);
	return rv;
}

int
main(int argc, char **argv)
{
	rl_ops *o = NULL;
	const char *which = argc > 1 ? argv[1] : "all";
	int steps = argc > 2 ? atoi(argv[2]) : 10, rv = 0;
	rl_log_init("gpu_train", 1);
	if ((rv = rl_ops_open(&o, "cuda")) != RL_OK) {
		fprintf(stderr, "gpu_train: no CUDA backend: %s\n", rl_strerror(rv));
		return 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "gpt2"))
		rv |= bench(o, "gpt2-124m", gpt2_json, 16, 1024, steps);
	if (!strcmp(which, "all") || !strcmp(which, "qwen"))
		rv |= bench(o, "qwen2.5-0.5b", qwen_json, 8, 1024, steps);
	rl_ops_close(o);
	return rv ? 1 : 0;
}

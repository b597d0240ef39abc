/*
 * bench/rollout — generated tokens/s of the engine on the CPU for a ~10M
 * parameter Qwen2-shaped model, with 1, 8 and 64 slots, and the continuous
 * batching check: prompts whose response lengths vary 10x (uniform 12..120
 * tokens, mean 66) against equal lengths (66), same total work.
 *
 * usage: bench/rollout [REQUESTS_PER_SLOT]   (default 2)
 * Prints one JSON line per measurement.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "base/rng.h"

static int
sink(void *ctx, const rl_gen_sample *s)
{
	(void)ctx;
	(void)s;
	return 0;
}

static double
run(rl_model *m, int slots, int nreq, int vary, uint64_t *tokens)
{
	rl_gen_opts go;
	rl_engine *e;
	int32_t prompt[16];
	double t0;

	rl_gen_opts_default(&go);
	go.slots = slots;
	go.max_new = 120;
	go.kv_mem = (size_t)512 << 20;
	go.sp.temperature = 1.0f;
	if (rl_engine_create(&e, m, NULL, &go) != 0)
		exit(1);
	for (int i = 0; i < nreq; i++) {
		for (int j = 0; j < 16; j++)
			prompt[j] = (int32_t)(rl_rng_u64(7, (uint64_t)i * 16 + j) % 4000);
		int len = vary ? 12 + (int)(rl_rng_u64(9, (uint64_t)i) % 109) : 66;
		rl_engine_submit(e, prompt, 16, 1, 0, len, (uint64_t)i, NULL);
	}
	t0 = rl_now();
	while (rl_engine_active(e) || rl_engine_waiting(e))
		if (rl_engine_step(e, sink, NULL) != 0)
			exit(1);
	t0 = rl_now() - t0;
	*tokens = rl_engine_stats_get(e)->gen_tokens;
	{
		const rl_engine_stats *st = rl_engine_stats_get(e);
		fprintf(stderr, "slots %d: prefill %.3f s, decode %.3f s, sample %.3f s, steps %llu\n", slots,
		    st->t_prefill, st->t_decode, st->t_sample, (unsigned long long)st->steps);
	}
	rl_engine_destroy(e);
	return t0;
}

int
main(int argc, char **argv)
{
	rl_config cfg = { 0 };
	rl_ops *ops;
	rl_model *m;
	int per = argc > 1 ? atoi(argv[1]) : 2;
	uint64_t tok;

	rl_log_init("bench/rollout", RL_LOG_NORMAL);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 4096, .hidden_size = 384, .n_layer = 6, .n_head = 6,
		.n_kv_head = 2, .head_dim = 64, .intermediate_size = 1024, .max_pos = 256, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	if (rl_ops_cpu_open(&ops) || rl_model_init_random(&m, &cfg, ops, 1))
		return 1;
	printf("{\"bench\":\"rollout\",\"model\":\"qwen2-shape\",\"params\":%zu,\"device\":\"cpu\"}\n",
	    rl_model_nparams(m));
	int slots[] = { 1, 8, 64 };
	for (int i = 0; i < 3; i++) {
		int n = slots[i] * per;
		double t = run(m, slots[i], n, 0, &tok);
		printf("{\"bench\":\"rollout\",\"slots\":%d,\"requests\":%d,\"lengths\":\"equal\",\"tokens\":%llu,"
		    "\"seconds\":%.3f,\"tok_s\":%.1f}\n", slots[i], n, (unsigned long long)tok, t, tok / t);
		fflush(stdout);
	}
	/* continuous batching: same number of requests, lengths 12..120 vs all 66 */
	{
		int n = 64 * per;
		uint64_t te, tv;
		double se = run(m, 64, n, 0, &te), sv = run(m, 64, n, 1, &tv);
		printf("{\"bench\":\"rollout\",\"slots\":64,\"requests\":%d,\"lengths\":\"equal\",\"tokens\":%llu,"
		    "\"seconds\":%.3f,\"tok_s\":%.1f}\n", n, (unsigned long long)te, se, te / se);
		printf("{\"bench\":\"rollout\",\"slots\":64,\"requests\":%d,\"lengths\":\"vary10x\",\"tokens\":%llu,"
		    "\"seconds\":%.3f,\"tok_s\":%.1f,\"ratio_vs_equal\":%.3f}\n", n, (unsigned long long)tv, sv,
		    tv / sv, (tv / sv) / (te / se));
	}
	rl_model_close(m);
	rl_ops_close(ops);
	return 0;
}

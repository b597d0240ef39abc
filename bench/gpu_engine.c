/*
 * gpu_engine.c — generation throughput of the engine (lib/rollout/engine.c: continuous
 * batching, shared prompt KV, sampling on the device) on the CUDA backend, the
 * path rl-rollout takes: random-initialised GPT-2 124M and Qwen2.5-0.5B shapes,
 * groups of 8 samples of 64-token prompts, response limits drawn from 64..256
 * per request (so sequences finish at different steps and waiting groups are
 * admitted while others decode: the batch size changes from step to step),
 * 2 x slots sequences in all, temperature 1.  Each setting runs three ways:
 * "graph" (rl_model_decode_sample with CUDA graphs, the default), "nograph"
 * (the same step op by op) and "legacy" (RL_DECODE_LEGACY=1: rl_model_decode
 * + ops->sample).  One JSON line per run: generated tokens/s over the whole
 * run (prefills included), steps, mean batch, decode and prefill seconds,
 * graph recordings and replays, host and wait ms per decode step.  Before the
 * timed runs of each size, one untimed run (op by op) sets up what every mode uses
 * once (the cache pool, scratch, cuBLAS heuristics), so the first mode timed does not
 * pay it (without it the first mode, graphs, reads 10-20% slower).
 * RL_DECODE_GRAPH_AFTER=N: a batch size is recorded after N runs op by op (model.h);
 * GPU_ENGINE_STEPS=N: the engine's decode_steps (rl-rollout --decode-steps).
 *
 * Usage: gpu_engine [gpt2|qwen|all] [slots]   (default all, slots 64 and 256)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "base/rng.h"

#include "shapes.h"

static int
sink(void *ctx, const rl_gen_sample *s)
{
	(void)ctx;
	(void)s;
	return 0;
}

static int
run(rl_model *m, const char *name, int slots, const char *mode, FILE *out)
{
	rl_gen_opts go;
	rl_engine *e = NULL;
	int32_t prompt[64];
	rl_rng r = { 4242, 0 };
	int rv, nreq = 2 * slots / 8;

	if (!strcmp(mode, "legacy"))
		setenv("RL_DECODE_LEGACY", "1", 1);
	else
		unsetenv("RL_DECODE_LEGACY");
	m->no_graph = !strcmp(mode, "nograph");
	rl_gen_opts_default(&go);
	go.slots = slots;
	go.max_new = 256;
	go.max_prefill_tokens = 64 * 64;
	/* every sequence to its limit: (64 + 256) tokens each, plus a block per sample */
	size_t per_tok = (size_t)2 * m->cfg.n_layer * m->cfg.n_kv_head * m->cfg.head_dim * 2;
	go.kv_mem = per_tok * (size_t)slots * (64 + 256 + 32) + ((size_t)64 << 20);
	go.sp.temperature = 1.0f;
	if (getenv("GPU_ENGINE_STEPS"))
		go.decode_steps = atoi(getenv("GPU_ENGINE_STEPS"));
	if ((rv = rl_engine_create(&e, m, NULL, &go)) != 0)
		goto out;
	for (int q = 0; q < nreq; q++) {
		for (int i = 0; i < 64; i++)
			prompt[i] = (int32_t)(rl_rng_next(&r) % (uint64_t)m->cfg.vocab_size);
		int max_new = 64 + (int)(rl_rng_next(&r) % 193);
		if ((rv = rl_engine_submit(e, prompt, 64, 8, 0, max_new, 100 + (uint64_t)q, NULL)) != 0)
			goto out;
	}
	rl_decode_stats d0 = m->dstats;
	double t0 = rl_now();
	while (rl_engine_active(e) || rl_engine_waiting(e))
		if ((rv = rl_engine_step(e, sink, NULL)) != 0)
			goto out;
	if ((rv = m->ops->sync(m->ops)) != 0)
		goto out;
	double t = rl_now() - t0;
	const rl_engine_stats *st = rl_engine_stats_get(e);
	double n = (double)(m->dstats.steps - d0.steps);
	fprintf(out, "{\"what\":\"rlpipe_engine\",\"model\":\"%s\",\"slots\":%d,\"mode\":\"%s\",\"samples\":%llu,"
	    "\"tokens\":%llu,\"steps\":%llu,\"mean_batch\":%.1f,\"s\":%.3f,\"decode_s\":%.3f,\"prefill_s\":%.3f,"
	    "\"graph_captures\":%llu,\"graph_launches\":%llu,\"host_ms_per_step\":%.3f,\"wait_ms_per_step\":%.3f,"
	    "\"graph_after\":%d,\"decode_steps\":%d,\"tokens_per_s\":%.0f}\n", name, slots, mode, (unsigned long long)st->samples,
	    (unsigned long long)st->gen_tokens, (unsigned long long)st->steps,
	    st->steps ? (double)st->gen_tokens / (double)st->steps : 0.0, t, st->t_decode, st->t_prefill,
	    (unsigned long long)(m->dstats.captures - d0.captures),
	    (unsigned long long)(m->dstats.launches - d0.launches),
	    n > 0 ? (m->dstats.t_host - d0.t_host) * 1e3 / n : 0.0,
	    n > 0 ? (m->dstats.t_wait - d0.t_wait) * 1e3 / n : 0.0, m->graph_after, go.decode_steps, (double)st->gen_tokens / t);
	fflush(out);
out:
	if (rv)
		fprintf(stderr, "gpu_engine: %s slots %d %s: %s\n", name, slots, mode, rl_strerror(rv));
	rl_engine_destroy(e);
	unsetenv("RL_DECODE_LEGACY");
	m->no_graph = 0;
	return rv;
}

int
main(int argc, char **argv)
{
	rl_ops *o = NULL;
	const char *which = argc > 1 ? argv[1] : "all";
	int only = argc > 2 ? atoi(argv[2]) : 0, rv = 0;
	const char *names[2] = { "gpt2-124m", "qwen2.5-0.5b" }, *jsons[2] = { gpt2_json, qwen_json };
	const char *modes[3] = { "graph", "nograph", "legacy" };
	int slots[2] = { 64, 256 };

	rl_log_init("gpu_engine", 1);
	if ((rv = rl_ops_open(&o, "cuda")) != RL_OK) {
		fprintf(stderr, "gpu_engine: no CUDA backend: %s\n", rl_strerror(rv));
		return 1;
	}
	for (int k = 0; k < 2; k++) {
		rl_config cfg;
		rl_model *m = NULL;
		if (strcmp(which, "all") && strncmp(names[k], which, strlen(which)))
			continue;
		memset(&cfg, 0, sizeof cfg);
		if ((rv = rl_config_parse(&cfg, jsons[k], strlen(jsons[k]), names[k])) ||
		    (rv = rl_model_init_random(&m, &cfg, o, 7))) {
			fprintf(stderr, "gpu_engine: %s: %s\n", names[k], rl_strerror(rv));
			rl_config_fini(&cfg);
			rv = 1;
			break;
		}
		for (int i = 0; i < 2; i++) {
			if (only && only != slots[i])
				continue;
			/* a warm-up at this size, untimed (its line goes to stderr): the cache pool,
			 * the scratch for this batch and the GEMM heuristics are set up before the
			 * timed modes, so the first of them does not pay for it */
			rv |= run(m, names[k], slots[i], "nograph", stderr);
			for (int j = 0; j < 3; j++)
				rv |= run(m, names[k], slots[i], modes[j], stdout);
		}
		rl_model_close(m);
		rl_config_fini(&cfg);
	}
	rl_ops_close(o);
	return rv ? 1 : 0;
}

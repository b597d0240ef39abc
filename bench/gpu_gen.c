/*
 * gpu_gen.c — generation throughput of the model on the CUDA backend
 * (rl_model_prefill, then rl_model_decode_sample over the paged KV cache:
 * the decode step and the sampling on the device, temperature 1, one packed
 * upload and one download per step, replayed from a CUDA graph):
 * random-initialised GPT-2 124M and Qwen2.5-0.5B shapes, prompts of 64
 * tokens, `new` generated tokens, batch (slots) 1, 64 and 256, all sequences
 * in lock-step.  One JSON line per run: decode tokens/s (generated tokens over
 * the decode loop's time), decode step ms, of which host ms per step (packing
 * the inputs and queueing the work) and wait ms per step (the one
 * synchronisation), graph launches, prefill ms, and the fraction of the
 * memory-bandwidth bound (weights in bf16 + the KV read per step, over 3.0e12
 * B/s measured on the H100 here).
 *
 * Usage: gpu_gen [gpt2|qwen|all] [new] [graph|nograph|both] [slots] [steps]   (default
 * both: each run with graphs, then op by op, for the ratio; RL_CUDA_GRAPH=0
 * turns graphs off in the backend altogether; slots: only that batch size, 0 all;
 * steps: decode steps a call, rl_model_decode_multi when more than 1 (multi-step
 * decoding: the tokens fed back on the device, one wait per call), default 1;
 * GPU_GEN_TRACE=1 prints the prefill time and the time at steps 1, 2, 4, ... to stderr)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"


#include "shapes.h"

#define HBM_BPS 3.0e12

static int
bench(rl_ops *o, const char *name, const char *json, int B, int P, int NEW, int graphs, int multi)
{
	rl_config cfg;
	rl_model *m = NULL;
	rl_kvcache *kv = NULL;
	rl_kvseq *s = NULL, **sp = NULL;
	int32_t **prompts = NULL, *ntok = NULL, *tok = NULL, *dtok = NULL, *ntk = NULL;
	float *hlp = NULL;
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
	ntk = rl_xcalloc((size_t)B * multi, sizeof *ntk);
	hlp = rl_xcalloc((size_t)B * multi, sizeof *hlp);
	m->no_graph = !graphs;
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
	int trace = getenv("GPU_GEN_TRACE") != NULL;
	if (trace)
		fprintf(stderr, "gpu_gen: %s batch %d graphs %d: prefill %.1f ms\n", name, B, graphs, tp * 1e3);
	t0 = rl_now();
	/* the first token from the prefill's logits, then NEW - 1 decode steps */
	for (int b = 0; b < B; b++)
		ctr[b] = 0;
	o->upload(o, dctr, ctr, B * 8);
	o->sample(o, dtok, dlp, m->logits, dseed, dctr, B, cfg.vocab_size, &sp_);
	o->download(o, tok, dtok, B * 4);
	rl_decode_stats s0 = m->dstats;
	for (int step = 1, n; step < NEW; step += n) {
		n = NEW - step < multi ? NEW - step : multi;
		for (int b = 0; b < B; b++)
			ctr[b] = (uint64_t)step;
		if ((rv = multi > 1 ? rl_model_decode_multi(m, kv, sp, tok, seed, ctr, B, B, &sp_, n, ntk, hlp)
		    : rl_model_decode_sample(m, kv, sp, tok, seed, ctr, B, B, &sp_, ntk, hlp)))
			goto out;
		memcpy(tok, ntk + (size_t)(n - 1) * B, (size_t)B * 4);
		if (trace && (step & (step - 1)) == 0)
			fprintf(stderr, "gpu_gen: step %d at %.1f ms\n", step, (rl_now() - t0) * 1e3);
	}
	if ((rv = o->sync(o)))
		goto out;
	double td = rl_now() - t0;
	double nst = (double)(m->dstats.steps - s0.steps);
	double host_ms = nst > 0 ? (m->dstats.t_host - s0.t_host) * 1e3 / nst : 0;
	double wait_ms = nst > 0 ? (m->dstats.t_wait - s0.t_wait) * 1e3 / nst : 0;
	double wbytes = (double)rl_model_nparams(m) * 2;
	double kvread = (double)kvtok * B * (P + NEW / 2.0);  /* mean context over the run */
	double step_s = td / NEW, bound = (wbytes + kvread) / HBM_BPS;
	printf("{\"what\":\"rlpipe_generate\",\"model\":\"%s\",\"batch\":%d,\"prompt\":%d,\"new\":%d,"
	    "\"graphs\":%d,\"steps_per_call\":%d,\"prefill_ms\":%.1f,\"decode_step_ms\":%.3f,\"host_ms_per_step\":%.3f,"
	    "\"wait_ms_per_step\":%.3f,\"graph_captures\":%llu,\"graph_launches\":%llu,"
	    "\"one_launch_steps\":%llu,\"tokens_per_s\":%.0f,\"bw_bound_fraction\":%.3f,\"switches\":\"%s\"}\n",
	    name, B, P, NEW, graphs && o->graph_begin != NULL, multi, tp * 1e3, step_s * 1e3, host_ms, wait_ms,
	    (unsigned long long)(m->dstats.captures - s0.captures),
	    (unsigned long long)(m->dstats.launches - s0.launches),
	    (unsigned long long)(m->dstats.onestep - s0.onestep), B * NEW / td, bound / step_s, bench_cuda_env());
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
	free(s); free(sp); free(prompts); free(ntok); free(tok); free(seed); free(ctr); free(ntk); free(hlp);
	return rv;
}

int
main(int argc, char **argv)
{
	rl_ops *o = NULL;
	const char *which = argc > 1 ? argv[1] : "all";
	int NEW = argc > 2 ? atoi(argv[2]) : 256, rv = 0;
	const char *mode = argc > 3 ? argv[3] : "both";
	int gmodes[2], ng = 0;
	if (strcmp(mode, "nograph") != 0)
		gmodes[ng++] = 1;
	if (strcmp(mode, "graph") != 0)
		gmodes[ng++] = 0;
	rl_log_init("gpu_gen", 1);
	if ((rv = rl_ops_open(&o, "cuda")) != RL_OK) {
		fprintf(stderr, "gpu_gen: no CUDA backend: %s\n", rl_strerror(rv));
		return 1;
	}
	int bs[] = { 1, 64, 256 }, only = argc > 4 ? atoi(argv[4]) : 0, multi = argc > 5 ? atoi(argv[5]) : 1;
	if (multi < 1)
		multi = 1;
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < ng && (!only || only == bs[i]); k++) {
			if (!strcmp(which, "all") || !strcmp(which, "gpt2"))
				rv |= bench(o, "gpt2-124m", gpt2_json, bs[i], 64, NEW, gmodes[k], multi);
			if (!strcmp(which, "all") || !strcmp(which, "qwen"))
				rv |= bench(o, "qwen2.5-0.5b", qwen_json, bs[i], 64, NEW, gmodes[k], multi);
		}
	rl_ops_close(o);
	return rv ? 1 : 0;
}

/*
 * bench/slots — should the engine's slot count follow the cache instead of
 * a fixed --slots?  The engine on the CPU (the ~10M parameter Qwen2 shape of
 * bench/rollout) on a long-tail workload: groups of 4 samples, seven groups
 * in eight answer in 12 tokens and one in 120 (no EOS), for --slots 16 to
 * 256 under two cache budgets: rl-rollout's default (256M) and a small one
 * (16M) that the worst-case reservation fills.  Per run: generated tokens/s
 * (wall and CPU), the sequences decoded per step, the cache blocks in use
 * and committed per step (fractions of the pool), and the share of steps at
 * which a waiting group was held back by the slots or by the cache.
 *
 * usage: bench/slots [GROUPS]   (default 64)
 * Prints one JSON line per run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/core.h"
#include "base/rng.h"
#include "model/model.h"
#include "rollout/engine.h"

static int
sink(void *ctx, const rl_gen_sample *s)
{
	(void)ctx;
	(void)s;
	return 0;
}

static double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void
run(rl_model *m, int slots, size_t kv_mem, int ngroups)
{
	rl_gen_opts go;
	rl_engine *e;
	int32_t prompt[16];
	double t0, c0;

	rl_gen_opts_default(&go);
	go.slots = slots;
	go.max_new = 120;
	go.kv_mem = kv_mem;
	go.sp.temperature = 1.0f;
	if (rl_engine_create(&e, m, NULL, &go) != 0)
		exit(1);
	for (int i = 0; i < ngroups; i++) {
		for (int j = 0; j < 16; j++)
			prompt[j] = (int32_t)(rl_rng_u64(7, (uint64_t)i * 16 + j) % 4000);
		if (rl_engine_submit(e, prompt, 16, 4, 0, i % 8 == 7 ? 120 : 12, (uint64_t)i, NULL) != 0)
			exit(1);
	}
	t0 = rl_now();
	c0 = cpu_now();
	while (rl_engine_active(e) || rl_engine_waiting(e))
		if (rl_engine_step(e, sink, NULL) != 0)
			exit(1);
	t0 = rl_now() - t0;
	c0 = cpu_now() - c0;
	const rl_engine_stats *st = rl_engine_stats_get(e);
	double n = st->occ_steps ? (double)st->occ_steps : 1, nb = st->nblk ? (double)st->nblk : 1;
	printf("{\"bench\":\"slots\",\"kv_mem_mib\":%zu,\"kv_blocks\":%llu,\"slots\":%d,\"groups\":%d,\"tokens\":%llu,"
	    "\"seconds\":%.3f,\"cpu_s\":%.3f,\"tok_s\":%.1f,\"steps\":%llu,\"mean_active\":%.1f,\"kv_used_frac\":%.3f,"
	    "\"kv_committed_frac\":%.3f,\"held_by_slots_frac\":%.3f,\"held_by_kv_frac\":%.3f}\n",
	    kv_mem >> 20, (unsigned long long)st->nblk, slots, ngroups, (unsigned long long)st->gen_tokens, t0, c0,
	    st->gen_tokens / t0, (unsigned long long)st->occ_steps, st->occ_active / n, st->occ_used / n / nb,
	    st->occ_committed / n / nb, st->held_slots / n, st->held_kv / n);
	fflush(stdout);
	rl_engine_destroy(e);
}

int
main(int argc, char **argv)
{
	rl_config cfg;
	rl_ops *ops;
	rl_model *m;
	int ngroups = argc > 1 ? atoi(argv[1]) : 64;
	size_t budgets[] = { (size_t)256 << 20, (size_t)16 << 20 };
	int slots[] = { 16, 32, 64, 128, 256 };

	rl_log_init("bench/slots", RL_LOG_NORMAL);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 4096, .hidden_size = 384, .n_layer = 6, .n_head = 6,
		.n_kv_head = 2, .head_dim = 64, .intermediate_size = 1024, .max_pos = 256, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	if (rl_ops_cpu_open(&ops) || rl_model_init_random(&m, &cfg, ops, 1))
		return 1;
	printf("{\"bench\":\"slots\",\"model\":\"qwen2-shape\",\"params\":%zu,\"device\":\"cpu\"}\n", rl_model_nparams(m));
	for (size_t b = 0; b < RL_ARRAY_LEN(budgets); b++)
		for (size_t i = 0; i < RL_ARRAY_LEN(slots); i++)
			run(m, slots[i], budgets[b], ngroups);
	rl_model_close(m);
	rl_ops_close(ops);
	return 0;
}

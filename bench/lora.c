/*
 * lora.c — LoRA against full fine-tuning on the CPU, on one model and batch:
 * a training step's time (forward + backward, and the AdamW step), the
 * gradient and AdamW bytes, and the bytes of what a step publishes: the full
 * model's model.safetensors against the adapter's adapter_model.safetensors
 * (both written by rl_ckpt_save), and the whole rl-sync version
 * (rl_wver_from_ckpt: every file of it, before deltas and compression).  JSON
 * lines on stdout, one per mode.
 *
 * Usage: lora [--layers L] [--hidden C] [--heads NH] [--kv-heads NKV] [--ffn H]
 *             [--vocab V] [--batch B] [--seq T] [--steps N] [--rank R]
 *             [--targets LIST]
 * Defaults: the ~10M-parameter Qwen2-style config of bench/model_cpu.c, B 4,
 * T 256, 3 steps after one warm-up, rank 16 on every projection (all-linear).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/io.h"
#include "compute/ops.h"
#include "model/ckpt.h"
#include "model/lora.h"
#include "model/model.h"
#include "sync/wckpt.h"

static int L = 10, C = 256, NH = 8, NKV = 4, H = 768, V = 8192, B = 4, T = 256, STEPS = 3, R = 16;
static const char *targets = "all-linear";

/* CPU seconds of the process (all threads): on a shared machine steadier than wall time. */
static double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long long
file_size(const char *dir, const char *name)
{
	char p[4300];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

/* One mode: rank 0 is full fine-tuning. */
static int
run(const rl_config *cfg, int rank, unsigned mask)
{
	rl_ops *o = NULL;
	rl_model *m = NULL;
	rl_adamw hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
			.max_grad_norm = 1.0f };
	const int N = B * T;
	int32_t *tok = rl_xmalloc((size_t)N * 4), *tgt = rl_xmalloc((size_t)N * 4);
	float *dlp = rl_xmalloc((size_t)N * 4);
	double tfb = 0, tst = 0, tcpu = 0;
	char tmpl[] = "/tmp/rl-bench-lora.XXXXXX", dir[4200];
	int rv;

	for (int i = 0; i < N; i++) {
		tok[i] = (int32_t)((i * 7919u) % (unsigned)V);
		tgt[i] = (int32_t)(((i + 1) * 7919u) % (unsigned)V);
		dlp[i] = -1.0f / N;
	}
	if ((rv = rl_ops_cpu_open(&o)) != 0 || (rv = rl_model_init_random(&m, cfg, o, 1)) != 0)
		goto out;
	if (rank > 0) {
		rl_lora_opts lo = { .r = rank, .alpha = 2.0f * rank, .targets = mask, .seed = 1 };
		if ((rv = rl_model_add_lora(m, &lo)) != 0)
			goto out;
	}
	if ((rv = rl_model_train_reserve(m, N)) != 0)
		goto out;
	for (int s = 0; s <= STEPS; s++) { /* step 0 warms up */
		double t0 = rl_now(), c0 = cpu_now();
		if ((rv = rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f)) != 0 ||
		    (rv = rl_model_backward(m, dlp, NULL)) != 0)
			goto out;
		double t1 = rl_now();
		if ((rv = rl_model_step(m, &hp, NULL)) != 0)
			goto out;
		if (s > 0) {
			tfb += t1 - t0;
			tst += rl_now() - t1;
			tcpu += cpu_now() - c0;
		}
	}
	if (mkdtemp(tmpl) == NULL) {
		rv = RL_EIO;
		goto out;
	}
	if ((rv = rl_ckpt_save(m, tmpl, 0, dir, sizeof dir)) != 0)
		goto out;
	size_t trained = m->tt.total - m->goff;
	rl_wver *ver = NULL;
	if ((rv = rl_wver_from_ckpt(&ver, m, 1)) != 0)
		goto out;
	unsigned long long sync_bytes = (unsigned long long)rl_wver_total(ver);
	rl_wver_destroy(ver);
	printf("{\"bench\":\"lora\",\"mode\":\"%s\",\"rank\":%d,\"params\":%zu,\"trained\":%zu,\"B\":%d,\"T\":%d,"
	    "\"steps\":%d,\"step_ms\":%.1f,\"step_cpu_ms\":%.1f,\"fwd_bwd_ms\":%.1f,\"adamw_ms\":%.2f,\"grad_adam_bytes\":%zu,"
	    "\"version_bytes\":%lld,\"sync_version_bytes\":%llu}\n", rank ? "lora" : "full", rank, rl_model_nparams(m), trained, B, T, STEPS,
	    1e3 * (tfb + tst) / STEPS, 1e3 * tcpu / STEPS, 1e3 * tfb / STEPS, 1e3 * tst / STEPS, 3 * trained * sizeof(float),
	    file_size(dir, rank ? RL_LORA_WEIGHTS_FILE : "model.safetensors"), sync_bytes);
	fflush(stdout);
	rl_io_remove_tree(tmpl);
out:
	rl_model_close(m);
	rl_ops_close(o);
	free(tok);
	free(tgt);
	free(dlp);
	return rv;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "layers", 1, 0, 'l' }, { "hidden", 1, 0, 'c' }, { "heads", 1, 0, 'a' }, { "kv-heads", 1, 0, 'k' },
		{ "ffn", 1, 0, 'f' }, { "vocab", 1, 0, 'v' }, { "batch", 1, 0, 'b' }, { "seq", 1, 0, 't' },
		{ "steps", 1, 0, 's' }, { "rank", 1, 0, 'r' }, { "targets", 1, 0, 'g' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	rl_config cfg = { 0 };
	unsigned mask = 0;
	int ch;

	rl_log_init("bench-lora", RL_LOG_NORMAL);
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 'l': L = atoi(optarg); break;
		case 'c': C = atoi(optarg); break;
		case 'a': NH = atoi(optarg); break;
		case 'k': NKV = atoi(optarg); break;
		case 'f': H = atoi(optarg); break;
		case 'v': V = atoi(optarg); break;
		case 'b': B = atoi(optarg); break;
		case 't': T = atoi(optarg); break;
		case 's': STEPS = atoi(optarg); break;
		case 'r': R = atoi(optarg); break;
		case 'g': targets = optarg; break;
		default:
			fprintf(ch == 'h' ? stdout : stderr, "usage: lora [--layers L] [--hidden C] [--heads NH] "
			    "[--kv-heads NKV] [--ffn H] [--vocab V] [--batch B] [--seq T] [--steps N] [--rank R] "
			    "[--targets LIST]\n");
			return ch == 'h' ? 0 : 2;
		}
	}
	if (L < 1 || C < 1 || NH < 1 || NKV < 1 || C % NH || NH % NKV || H < 1 || V < 2 || B < 1 || T < 2 ||
	    STEPS < 1 || R < 1 || rl_lora_targets_parse(targets, &mask) != 0) {
		fprintf(stderr, "lora: bad sizes\n");
		return 2;
	}
	cfg.arch = RL_ARCH_LLAMA;
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	cfg.vocab_size = V;
	cfg.hidden_size = C;
	cfg.n_layer = L;
	cfg.n_head = NH;
	cfg.n_kv_head = NKV;
	cfg.head_dim = C / NH;
	cfg.intermediate_size = H;
	cfg.max_pos = T + 16;
	cfg.rope_theta = 10000;
	cfg.norm_eps = 1e-6f;
	cfg.qkv_bias = 1;
	cfg.tie_embeddings = 1;
	cfg.bos_id = cfg.eos_id = -1;
	cfg.dtype = RL_F32;
	if (run(&cfg, 0, mask) != 0 || run(&cfg, R, mask) != 0)
		return 1;
	return 0;
}

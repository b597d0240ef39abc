/*
 * model_cpu.c — CPU model throughput: training forward+backward tokens/s
 * (and the AdamW step's time), prefill and decode tokens/s over the paged KV
 * cache, for a ~10M-parameter Qwen2-style config (--arch: Llama, Mistral or
 * Gemma 3 of the same sizes; --window W their sliding window, default 64: Gemma 3
 * with five local layers in six); then, for qwen2, runs bench/model_cpu_torch.py
 * (Debian's PyTorch, /usr/bin/python3) on the same config and shapes in the same
 * run.  The training figure is forward + backward; "forward" is the forward alone
 * (log-probs and entropy, as rl-train's old and reference log-probs).  JSON lines
 * on stdout, one per figure.
 *
 * Usage: model_cpu [--arch qwen2|llama|mistral|gemma3] [--window W] [--layers L]
 *          [--hidden C] [--heads NH] [--kv-heads NKV] [--ffn H] [--vocab V]
 *          [--batch B] [--seq T] [--steps N] [--decode-batch B] [--prompt P]
 *          [--decode-tokens D] [--no-torch]
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kvcache.h"
#include "model/model.h"
#include "compute/ops.h"

static int L = 10, C = 256, NH = 8, NKV = 4, H = 768, V = 8192, B = 4, T = 256, STEPS = 3;
static int DB = 16, P = 32, D = 32, torch = 1, WIN = 64;
static const char *arch = "qwen2";

static void
usage(FILE *fp)
{
	fprintf(fp, "usage: model_cpu [--arch qwen2|llama|mistral|gemma3] [--window W] [--layers L]\n"
	    "         [--hidden C] [--heads NH] [--kv-heads NKV] [--ffn H] [--vocab V] [--batch B]\n"
	    "         [--seq T] [--steps N] [--decode-batch B] [--prompt P] [--decode-tokens D]\n"
	    "         [--no-torch]\n");
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "layers", 1, 0, 'l' }, { "hidden", 1, 0, 'c' }, { "heads", 1, 0, 'a' },
		{ "kv-heads", 1, 0, 'k' }, { "ffn", 1, 0, 'f' }, { "vocab", 1, 0, 'v' },
		{ "batch", 1, 0, 'b' }, { "seq", 1, 0, 't' }, { "steps", 1, 0, 's' },
		{ "decode-batch", 1, 0, 'B' }, { "prompt", 1, 0, 'p' }, { "decode-tokens", 1, 0, 'd' },
		{ "no-torch", 0, 0, 'n' }, { "help", 0, 0, 'h' }, { "arch", 1, 0, 'A' },
		{ "window", 1, 0, 'w' }, { 0, 0, 0, 0 }
	};
	rl_config cfg = { 0 };
	rl_ops *o = NULL;
	rl_model *m = NULL;
	rl_kvcache *kv = NULL;
	int ch, rv;

	rl_log_init("model_cpu", RL_LOG_NORMAL);
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
		case 'B': DB = atoi(optarg); break;
		case 'p': P = atoi(optarg); break;
		case 'd': D = atoi(optarg); break;
		case 'n': torch = 0; break;
		case 'A': arch = optarg; break;
		case 'w': WIN = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	cfg.arch = RL_ARCH_LLAMA;
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	cfg.vocab_size = V;
	cfg.hidden_size = C;
	cfg.n_layer = L;
	cfg.n_head = NH;
	cfg.n_kv_head = NKV;
	cfg.head_dim = NH > 0 ? C / NH : 0;
	cfg.intermediate_size = H;
	cfg.max_pos = RL_MAX(T, P + D) + 16;
	cfg.rope_theta = 10000;
	cfg.norm_eps = 1e-6f;
	cfg.qkv_bias = 1;
	cfg.tie_embeddings = 1;
	cfg.bos_id = cfg.eos_id = -1;
	cfg.dtype = RL_F32;
	if (strcmp(arch, "qwen2") != 0) {
		/* the same sizes without biases; Mistral's window on every layer, Gemma 3's on
		 * five in six, with its norms, scale (query_pre_attn_scalar = head_dim) and GELU */
		snprintf(cfg.model_type, sizeof cfg.model_type, "%s",
		    strcmp(arch, "gemma3") == 0 ? "gemma3_text" : arch);
		cfg.qkv_bias = 0;
		torch = 0;
		if (strcmp(arch, "mistral") == 0) {
			cfg.sliding_window = WIN;
		} else if (strcmp(arch, "gemma3") == 0) {
			cfg.gemma = cfg.qk_norm = 1;
			cfg.sliding_window = WIN;
			cfg.attn_scale = 1.0f / sqrtf((float)cfg.head_dim);
			cfg.rope_local_theta = 10000;
			for (int l = 0; l < L && l < RL_CONFIG_MAX_LOCAL; l++)
				cfg.local[l] = (l + 1) % 6 != 0;
		} else if (strcmp(arch, "llama") != 0) {
			fprintf(stderr, "model_cpu: --arch %s: not qwen2, llama, mistral or gemma3\n", arch);
			return 2;
		}
	}
	if ((rv = rl_ops_cpu_open(&o)) != 0 || (rv = rl_model_init_random(&m, &cfg, o, 1)) != 0 ||
	    (rv = rl_model_train_reserve(m, B * T)) != 0)
		goto out;

	/* ---- training: forward + backward, then the AdamW step ---- */
	{
		int N = B * T;
		int32_t *tok = rl_xmalloc((size_t)N * 4), *tgt = rl_xmalloc((size_t)N * 4);
		float *dlp = rl_xmalloc((size_t)N * 4), *dent = rl_xmalloc((size_t)N * 4);
		rl_adamw hp = { 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.0f };
		double tfb = 0, tst = 0, tfw = 0, t0;
		for (int i = 0; i < N; i++) {
			tok[i] = (int32_t)((i * 7919u) % (unsigned)V);
			tgt[i] = (int32_t)(((i + 1) * 7919u) % (unsigned)V);
			dlp[i] = -1.0f / N;
			dent[i] = -0.01f / N;
		}
		for (int s = 0; s <= STEPS; s++) { /* step 0 warms up */
			t0 = rl_now();
			if ((rv = rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f)) != 0)
				goto out;
			if (s > 0)
				tfw += rl_now() - t0;
			t0 = rl_now();
			if ((rv = rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f)) != 0 ||
			    (rv = rl_model_backward(m, dlp, dent)) != 0)
				goto out;
			double t1 = rl_now();
			if ((rv = rl_model_step(m, &hp, NULL)) != 0)
				goto out;
			if (s > 0) {
				tfb += t1 - t0;
				tst += rl_now() - t1;
			}
		}
		printf("{\"bench\":\"model_cpu\",\"impl\":\"rlpipe\",\"arch\":\"%s\",\"window\":%d,"
		    "\"what\":\"forward\",\"params\":%zu,\"B\":%d,\"T\":%d,\"steps\":%d,\"tokens_per_s\":%.1f}\n",
		    arch, cfg.sliding_window, rl_model_nparams(m), B, T, STEPS, (double)N * STEPS / tfw);
		printf("{\"bench\":\"model_cpu\",\"impl\":\"rlpipe\",\"arch\":\"%s\",\"what\":\"train_fwd_bwd\","
		    "\"params\":%zu,\"B\":%d,\"T\":%d,\"steps\":%d,\"tokens_per_s\":%.1f,\"adamw_ms\":%.2f}\n",
		    arch, rl_model_nparams(m), B, T, STEPS, (double)N * STEPS / tfb, 1e3 * tst / STEPS);
		fflush(stdout);
		free(tok);
		free(tgt);
		free(dlp);
		free(dent);
	}

	/* ---- generation: prefill DB prompts of P tokens, then D decode steps ---- */
	{
		rl_kvseq *seq = rl_xcalloc((size_t)DB, sizeof *seq), **sp = rl_xcalloc((size_t)DB, sizeof *sp);
		int32_t *ptok = rl_xmalloc((size_t)DB * P * 4), *dtok = rl_xmalloc((size_t)DB * 4);
		const int32_t **pr = rl_xcalloc((size_t)DB, sizeof *pr);
		int *np = rl_xcalloc((size_t)DB, sizeof *np);
		size_t per_tok = (size_t)2 * L * NKV * cfg.head_dim * 4;
		double t0, tp, td;

		if ((rv = rl_model_infer_reserve(m, DB * P, DB)) != 0 ||
		    (rv = rl_kvcache_open(&kv, o, &cfg, per_tok * (size_t)DB * (P + D + 32), 16)) != 0)
			goto out;
		for (int i = 0; i < DB; i++) {
			rl_kvseq_init(&seq[i], kv);
			sp[i] = &seq[i];
			for (int j = 0; j < P; j++)
				ptok[i * P + j] = (int32_t)(((i * P + j) * 104729u) % (unsigned)V);
			pr[i] = ptok + i * P;
			np[i] = P;
			dtok[i] = (int32_t)((i * 31u) % (unsigned)V);
		}
		t0 = rl_now();
		if ((rv = rl_model_prefill(m, kv, sp, pr, np, DB, NULL)) != 0)
			goto out;
		tp = rl_now() - t0;
		t0 = rl_now();
		for (int s = 0; s < D; s++)
			if ((rv = rl_model_decode(m, kv, sp, dtok, DB, NULL)) != 0)
				goto out;
		td = rl_now() - t0;
		printf("{\"bench\":\"model_cpu\",\"impl\":\"rlpipe\",\"arch\":\"%s\",\"what\":\"prefill\","
		    "\"batch\":%d,\"prompt\":%d,\"tokens_per_s\":%.1f}\n", arch, DB, P, (double)DB * P / tp);
		printf("{\"bench\":\"model_cpu\",\"impl\":\"rlpipe\",\"arch\":\"%s\",\"what\":\"decode\","
		    "\"batch\":%d,\"prompt\":%d,\"steps\":%d,\"tokens_per_s\":%.1f}\n", arch, DB, P, D,
		    (double)DB * D / td);
		fflush(stdout);
		for (int i = 0; i < DB; i++)
			rl_kvcache_release(kv, &seq[i]);
		free(seq);
		free(sp);
		free(ptok);
		free(dtok);
		free(pr);
		free(np);
	}

	if (torch) {
		char cmd[1024];
		snprintf(cmd, sizeof cmd, "/usr/bin/python3 bench/model_cpu_torch.py --layers %d --hidden %d "
		    "--heads %d --kv-heads %d --ffn %d --vocab %d --batch %d --seq %d --steps %d "
		    "--decode-batch %d --prompt %d --decode-tokens %d", L, C, NH, NKV, H, V, B, T, STEPS, DB,
		    P, D);
		fflush(stdout);
		if (system(cmd) != 0)
			rl_warn("the PyTorch half failed (run from the repository root; needs python3-torch)");
	}
out:
	if (rv != 0)
		rl_error("benchmark failed: %s", rl_strerror(rv));
	rl_kvcache_close(kv);
	rl_model_close(m);
	rl_ops_close(o);
	return rv ? 1 : 0;
}

/*
 * gpu_kernels.c — single-op timings of the CUDA backend at the GPT-2 124M
 * training shape (N = 16 x 1024 tokens): cuBLASLt GEMMs (TFLOP/s), attention
 * forward and backward (the default path, then flash2 through a second backend
 * opened with RL_CUDA_ATTN=flash2, once per backward variant RL_CUDA_FLASH_BWD=det,
 * fused, fused3, fused32; GPT-2's 12 heads of 64, Qwen 0.5B's 14/2 at 8 x 1024, and 8/2 heads
 * of 128), fused log-prob forward + backward over
 * V = 50257, and decode attention.  The LM head at the whole training batch (16384 rows,
 * one chunk, as rl_model_forward/backward run it with the logits kept): its GEMMs through
 * the plain ops (padded scratch + copies) and through the strided ops of lib/compute/ops.h (row
 * stride V rounded up to head_ld_align, no copies) with the output features split at a
 * multiple of 64 (as the backend does: one unsplit GEMM each is 3.7x slower, docs/cuda.md),
 * and the whole head step (forward GEMM + log-prob, log-prob
 * backward + backward GEMMs) each way.  One JSON line per op; each the mean of `iters`
 * runs after a warm-up, timed around ops->sync.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "compute/ops.h"

static rl_ops *o;

static void *
dev(size_t bytes, int fill)
{
	void *p = NULL;
	if (o->alloc(o, &p, bytes)) {
		fprintf(stderr, "gpu_kernels: out of device memory\n");
		exit(1);
	}
	if (fill) {
		/* small random bf16 values (never zeros: they can time faster) */
		uint16_t *h = rl_xmalloc(bytes);
		uint64_t s = 88172645463325252ULL;
		for (size_t i = 0; i < bytes / 2; i++) {
			s ^= s << 13; s ^= s >> 7; s ^= s << 17;
			h[i] = rl_f32_to_bf16(((float)(s % 2000) - 1000.0f) / 1000.0f);
		}
		o->upload(o, p, h, bytes);
		free(h);
	} else {
		o->zero(o, p, bytes);
	}
	return p;
}

#define TIME(label, iters, flops, body) do { \
	body; if (o->sync(o)) { fprintf(stderr, "gpu_kernels: %s failed\n", label); exit(1); } \
	double t0_ = rl_now(); \
	for (int it_ = 0; it_ < (iters); it_++) { body; } \
	if (o->sync(o)) { fprintf(stderr, "gpu_kernels: %s failed\n", label); exit(1); } \
	double ms_ = (rl_now() - t0_) / (iters) * 1e3; \
	printf("{\"what\":\"kernel\",\"op\":\"%s\",\"ms\":%.3f,\"tflops\":%.1f}\n", label, ms_, \
	    (flops) > 0 ? (flops) / ms_ / 1e9 : 0.0); \
	fflush(stdout); } while (0)

/* attn_fwd and attn_bwd at (B, T, NH, NKV, HD); flops counted over the full T x T
 * square (the rows before flash2 did so), so causal work is half of what is counted */
static void
attn_rows(int B, int T, int NH, int NKV, int HD, const char *tag)
{
	char lab[96];
	int W = (NH + 2 * NKV) * HD;
	size_t N = (size_t)B * T;
	void *qkv = dev(N * W * 2, 1), *out = dev(N * NH * HD * 2, 0);
	void *dqkv = dev(N * W * 2, 0), *dout = dev(N * NH * HD * 2, 1);
	float *lse = dev((size_t)B * NH * T * 4, 0);
	double f = 4.0 * B * NH * (double)T * T * HD;
	snprintf(lab, sizeof lab, "attn_fwd %dx%d NH%d NKV%d HD%d%s", B, T, NH, NKV, HD, tag);
	TIME(lab, 10, f, o->attn_fwd(o, out, lse, qkv, NULL, B, T, NH, NKV, HD));
	snprintf(lab, sizeof lab, "attn_bwd %dx%d NH%d NKV%d HD%d%s", B, T, NH, NKV, HD, tag);
	TIME(lab, 10, 2.5 * f, o->attn_bwd(o, dqkv, dout, out, lse, qkv, NULL, B, T, NH, NKV, HD));
	o->free(o, qkv); o->free(o, out); o->free(o, dqkv); o->free(o, dout); o->free(o, lse);
}

/* The LM head over R rows of width C, vocabulary V (see the header); tag names the
 * backend's RL_CUDA_HEAD_LD; plain: time the plain ops too */
static void
head_rows(int R, int C, int V, const char *tag, int plain)
{
	char lab[128];
	int al = o->head_ld_align, ld = al > 0 ? (V + al - 1) / al * al : V;
	/* the logits are written by the head GEMM before anything reads them: zeroed, not filled */
	void *lg = dev((size_t)R * ld * 2, 0), *h = dev((size_t)R * C * 2, 1), *wte = dev((size_t)V * C * 2, 1);
	void *dh = dev((size_t)R * C * 2, 0);
	float *dw = dev((size_t)V * C * 4, 0), *lp = dev((size_t)R * 4, 0), *ent = dev((size_t)R * 4, 0);
	float *lse = dev((size_t)R * 4, 0), *dlp = dev((size_t)R * 4, 0);
	int32_t *tgt = dev((size_t)R * 4, 0);
	float *hd = rl_xmalloc((size_t)R * 4);
	for (int i = 0; i < R; i++)
		hd[i] = -1.0f / R;  /* a gradient that is not all zeros downstream */
	o->upload(o, dlp, hd, (size_t)R * 4);
	free(hd);
	double f = 2.0 * R * C * V;
	if (plain) {
		snprintf(lab, sizeof lab, "lm_head matmul_fwd %dx%dx%d (padded copy)", R, C, V);
		TIME(lab, 10, f, o->matmul_fwd(o, lg, h, wte, NULL, R, C, V));
		snprintf(lab, sizeof lab, "lm_head matmul_bwd %dx%dx%d (padded copy, dinp+dw)", R, C, V);
		TIME(lab, 10, 2 * f, o->matmul_bwd(o, dh, dw, NULL, lg, h, wte, R, C, V));
		snprintf(lab, sizeof lab, "lm_head step %dx%dx%d plain ops (fwd+lp, lp bwd+bwd)", R, C, V);
		TIME(lab, 10, 3 * f, (o->matmul_fwd(o, lg, h, wte, NULL, R, C, V),
		    o->logprob_fwd(o, lp, ent, lse, lg, tgt, R, V, 1.0f),
		    o->logprob_bwd(o, lg, lg, tgt, lse, dlp, NULL, R, V, 1.0f),
		    o->matmul_bwd(o, dh, dw, NULL, lg, h, wte, R, C, V)));
	}
	if (o->matmul_fwd_ld) {
		snprintf(lab, sizeof lab, "lm_head matmul_fwd_ld %dx%dx%d ld%d%s", R, C, V, ld, tag);
		TIME(lab, 10, f, o->matmul_fwd_ld(o, lg, ld, h, wte, R, C, V));
		snprintf(lab, sizeof lab, "lm_head matmul_bwd_ld %dx%dx%d ld%d%s (dinp+dw)", R, C, V, ld, tag);
		TIME(lab, 10, 2 * f, o->matmul_bwd_ld(o, dh, dw, lg, ld, h, wte, R, C, V));
		snprintf(lab, sizeof lab, "logprob_fwd_ld %dx%d ld%d +ent", R, V, ld);
		TIME(lab, 10, 0, o->logprob_fwd_ld(o, lp, ent, lse, lg, ld, tgt, R, V, 1.0f));
		snprintf(lab, sizeof lab, "logprob_bwd_ld %dx%d ld%d", R, V, ld);
		TIME(lab, 10, 0, (o->matmul_fwd_ld(o, lg, ld, h, wte, R, C, V),
		    o->logprob_bwd_ld(o, lg, lg, ld, tgt, lse, dlp, NULL, R, V, 1.0f)));
		snprintf(lab, sizeof lab, "lm_head step %dx%dx%d strided ld%d%s (fwd+lp, lp bwd+bwd)", R, C, V, ld,
		    tag);
		TIME(lab, 10, 3 * f, (o->matmul_fwd_ld(o, lg, ld, h, wte, R, C, V),
		    o->logprob_fwd_ld(o, lp, ent, lse, lg, ld, tgt, R, V, 1.0f),
		    o->logprob_bwd_ld(o, lg, lg, ld, tgt, lse, dlp, NULL, R, V, 1.0f),
		    o->matmul_bwd_ld(o, dh, dw, lg, ld, h, wte, R, C, V)));
	}
	o->free(o, lg); o->free(o, h); o->free(o, wte); o->free(o, dh); o->free(o, dw); o->free(o, lp);
	o->free(o, ent); o->free(o, lse); o->free(o, dlp); o->free(o, tgt);
}

int
main(void)
{
	rl_log_init("gpu_kernels", 1);
	if (rl_ops_open(&o, "cuda") != RL_OK) {
		fprintf(stderr, "gpu_kernels: no CUDA backend\n");
		return 1;
	}
	const int B = 16, T = 1024, N = B * T, C = 768, NH = 12, HD = 64, V = 50257;
	void *x = dev((size_t)N * 4 * C * 2, 1), *w = dev((size_t)4 * C * C * 2, 1);
	void *y = dev((size_t)N * 4 * C * 2, 0), *bias = dev((size_t)4 * C * 2, 1);
	void *dx = dev((size_t)N * 4 * C * 2, 0);
	float *dw = dev((size_t)4 * C * C * 4, 0);
	char lab[96];
	int shapes[][2] = { { C, 3 * C }, { C, C }, { C, 4 * C }, { 4 * C, C } };
	for (int i = 0; i < 4; i++) {
		int K = shapes[i][0], M = shapes[i][1];
		double f = 2.0 * N * K * M;
		snprintf(lab, sizeof lab, "matmul_fwd %dx%dx%d +bias", N, K, M);
		TIME(lab, 20, f, o->matmul_fwd(o, y, x, w, bias, N, K, M));
		snprintf(lab, sizeof lab, "matmul_bwd %dx%dx%d (dinp+dw)", N, K, M);
		TIME(lab, 20, 2 * f, o->matmul_bwd(o, dx, dw, NULL, y, x, w, N, K, M));
	}
	/* attention: the default path, then flash2 (RL_CUDA_ATTN=flash2, a second backend)
	 * with each of its backward variants (RL_CUDA_FLASH_BWD: det, the two-pass default;
	 * fused, one pass with dQ by atomics; fused3, the same for 3 blocks per SM; fused32,
	 * 32-query tiles for 4 blocks per SM) */
	attn_rows(B, T, NH, NH, HD, "");
	attn_rows(8, T, 14, 2, 64, "");
	{
		static const char *bwd[] = { "det", "fused", "fused3", "fused32" };
		rl_ops *o0 = o;
		setenv("RL_CUDA_ATTN", "flash2", 1);
		for (int v = 0; v < 4; v++) {
			char tag[32];
			setenv("RL_CUDA_FLASH_BWD", bwd[v], 1);
			if (rl_ops_open(&o, "cuda") != RL_OK) {
				fprintf(stderr, "gpu_kernels: cannot open a second CUDA backend\n");
				return 1;
			}
			snprintf(tag, sizeof tag, " flash2 %s", bwd[v]);
			attn_rows(B, T, NH, NH, HD, tag);
			attn_rows(8, T, 14, 2, 64, tag);
			attn_rows(4, T, 8, 2, 128, tag);
			rl_ops_close(o);
		}
		o = o0;
		unsetenv("RL_CUDA_ATTN");
		unsetenv("RL_CUDA_FLASH_BWD");
	}
	/* log-prob over a chunk of 2048 rows */
	{
		int R = 2048;
		void *lg = dev((size_t)R * V * 2, 1);
		float *lp = dev(R * 4, 0), *ent = dev(R * 4, 0), *lse = dev(R * 4, 0), *dlp = dev(R * 4, 0);
		int32_t *tgt = dev(R * 4, 0);
		TIME("logprob_fwd 2048x50257 +ent", 10, 0, o->logprob_fwd(o, lp, ent, lse, lg, tgt, R, V, 1.0f));
		TIME("logprob_bwd 2048x50257", 10, 0, o->logprob_bwd(o, lg, lg, tgt, lse, dlp, NULL, R, V, 1.0f));
		double f = 2.0 * R * C * V;
		void *h = dev((size_t)R * C * 2, 1), *wte = dev((size_t)V * C * 2, 1);
		TIME("lm_head matmul_fwd 2048x768x50257", 10, f, o->matmul_fwd(o, lg, h, wte, NULL, R, C, V));
		o->free(o, lg); o->free(o, lp); o->free(o, ent); o->free(o, lse); o->free(o, dlp); o->free(o, tgt);
		o->free(o, h); o->free(o, wte);
	}
	/* the LM head at the whole batch: plain and strided */
	head_rows(N, C, V, " split", 1);
	rl_ops_close(o);
	return 0;
}

/*
 * test_model_head.c — the model's strided LM-head path (lib/model/model_train.c with a backend
 * that has ops.h's matmul_fwd_ld / matmul_bwd_ld / logprob_fwd_ld / logprob_bwd_ld) on
 * the CPU, where no backend has it: a copy of the CPU table whose strided ops run the
 * CPU reference's plain ops row for row (logits (N, ld), ld = V rounded up to 64),
 * against the plain CPU model.  Both do the same arithmetic on the same numbers in the
 * same order (the logit chunks are set to the same number of rows on both sides), so
 * log-probs, entropy, every gradient and the parameters after two AdamW steps must be
 * equal bit for bit.  The strided ops check their stride (>= V, a multiple of the
 * alignment) and that the model hands them the same buffer in forward and backward;
 * the wrapper's allocations start as NaN, so a read of logits never written shows.
 * Cases: the fixtures (V 96, stride 128) with 1-row, 5-row and whole-batch chunks
 * (the backward then reuses the forward's logits), random models of odd vocabularies
 * (GPT-2 1001, Qwen2 5003) with several chunks and one, and a forward-only model.
 * What runs on a GPU (the CUDA strided ops) is test_cuda_ops / test_cuda_model's.
 */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "model/safetensors.h"
#include "t.h"

#define ALIGN 64
#define TEMP 0.8f

static int bad_ld;          /* strided ops called with a bad stride */
static long nfwd_ld, nbwd_ld, nlpf_ld, nlpb_ld;

static int
w_alloc(rl_ops *o, void **p, size_t bytes)
{
	int rv = rl_cpu_alloc(o, p, bytes);
	if (rv == RL_OK)
		memset(*p, 0xff, bytes);  /* NaN */
	return rv;
}

static void
check_ld(int ld, int V)
{
	if (ld < V || ld % ALIGN != 0)
		bad_ld++;
}

/* rows of x (N, ld) to y (N, V) and back */
static float *
pack(const float *x, int N, int V, int ld)
{
	float *y = rl_xmalloc((size_t)N * V * 4 + 4);
	for (int n = 0; n < N; n++)
		memcpy(y + (size_t)n * V, x + (size_t)n * ld, (size_t)V * 4);
	return y;
}

static void
unpack(float *x, const float *y, int N, int V, int ld)
{
	for (int n = 0; n < N; n++)
		memcpy(x + (size_t)n * ld, y + (size_t)n * V, (size_t)V * 4);
}

static void
w_matmul_fwd_ld(rl_ops *o, void *out, int ld, const void *inp, const void *w, int N, int C, int OC)
{
	check_ld(ld, OC);
	nfwd_ld++;
	float *y = rl_xmalloc((size_t)N * OC * 4 + 4);
	rl_cpu_matmul_fwd(o, y, inp, w, NULL, N, C, OC);
	unpack(out, y, N, OC, ld);
	free(y);
}

static void
w_matmul_bwd_ld(rl_ops *o, void *dinp, float *dw, const void *dout, int ld, const void *inp,
    const void *w, int N, int C, int OC)
{
	check_ld(ld, OC);
	nbwd_ld++;
	float *y = pack(dout, N, OC, ld);
	rl_cpu_matmul_bwd(o, dinp, dw, NULL, y, inp, w, N, C, OC);
	free(y);
}

static void
w_logprob_fwd_ld(rl_ops *o, float *lp, float *ent, float *lse, const void *logits, int ld,
    const int32_t *tgt, int N, int V, float inv_temp)
{
	check_ld(ld, V);
	nlpf_ld++;
	float *y = pack(logits, N, V, ld);
	rl_cpu_logprob_fwd(o, lp, ent, lse, y, tgt, N, V, inv_temp);
	free(y);
}

static void
w_logprob_bwd_ld(rl_ops *o, void *dlogits, const void *logits, int ld, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp)
{
	check_ld(ld, V);
	nlpb_ld++;
	float *y = pack(logits, N, V, ld);
	rl_cpu_logprob_bwd(o, y, y, tgt, lse, dlp, dent, N, V, inv_temp);
	unpack(dlogits, y, N, V, ld);
	free(y);
}

static rl_st_file *ex;

static void *
get(const char *name, size_t *n)
{
	const rl_st_tensor *t = rl_st_find(ex, name);
	if (t == NULL) {
		fprintf(stderr, "expected.safetensors has no '%s'\n", name);
		exit(1);
	}
	float *p = rl_xmalloc(t->nelem * sizeof(float) + 1);
	if (t->dtype == RL_I32)
		memcpy(p, t->data, t->nbytes);
	else if (rl_st_to_f32(p, t, 0, t->nelem) != 0)
		exit(1);
	if (n)
		*n = t->nelem;
	return p;
}

static int
same(const char *what, const float *a, const float *b, size_t n)
{
	int ok = memcmp(a, b, n * 4) == 0;
	T_OK(ok, "%s: strided and plain differ", what);
	return ok;
}

/* fixture fix (vocab > 0: a random model of its config with that vocabulary, seed 3),
 * logits in chunks of `rows` rows on both sides (0: the whole batch); train 0: forward
 * only (rl_model_eval_reserve) */
static void
run(rl_ops *cpu, rl_ops *st, const char *fix, int vocab, int rows, int train)
{
	char dir[256], path[300], what[200];
	rl_model *mp = NULL, *ms = NULL;
	size_t n;

	snprintf(dir, sizeof dir, "tests/fixtures/%s", fix);
	snprintf(path, sizeof path, "%s/expected.safetensors", dir);
	if (access(path, R_OK) != 0) {
		printf("skip %s (no fixture)\n", fix);
		return;
	}
	T_EQ_INT(rl_st_open(&ex, path), 0);
	if (!ex)
		return;
	T_EQ_INT(rl_model_open(&mp, dir, cpu), 0);
	T_EQ_INT(rl_model_open(&ms, dir, st), 0);
	if (!mp || !ms)
		goto out;
	if (vocab > 0) {
		rl_config cfg;
		rl_config_copy(&cfg, &mp->cfg);  /* its strings outlive the model */
		cfg.vocab_size = vocab;
		rl_model_close(mp);
		rl_model_close(ms);
		mp = ms = NULL;
		T_EQ_INT(rl_model_init_random(&mp, &cfg, cpu, 3), 0);
		T_EQ_INT(rl_model_init_random(&ms, &cfg, st, 3), 0);
		rl_config_fini(&cfg);
		if (!mp || !ms)
			goto out;
	}
	int32_t *tok = get("tok", &n), *tgt = get("tgt", NULL), *seg = get("seg", NULL), *pos = get("pos", NULL);
	const int B = 2, T = (int)n / 2, N = B * T, V = mp->cfg.vocab_size, ld = (V + ALIGN - 1) / ALIGN * ALIGN;
	const char *nm = vocab > 0 ? "random" : fix;
	if (rows > 0) {
		mp->logit_chunk_bytes = (size_t)rows * V * 4;
		ms->logit_chunk_bytes = (size_t)rows * ld * 4;
	}
	float *lp[2], *ent[2], *dlp = rl_xmalloc(N * 4), *dent = rl_xmalloc(N * 4);
	rl_model *m[2] = { mp, ms };
	long f0 = nfwd_ld, l0 = nlpf_ld, b0 = nbwd_ld, lb0 = nlpb_ld;
	for (int i = 0; i < N; i++) {
		dlp[i] = tgt[i] >= 0 ? -1.0f / N : 0;
		dent[i] = tgt[i] >= 0 ? -0.05f / N : 0;
	}
	for (int k = 0; k < 2; k++) {
		lp[k] = rl_xmalloc(N * 4);
		ent[k] = rl_xmalloc(N * 4);
		T_EQ_INT(train ? rl_model_train_reserve(m[k], N) : rl_model_eval_reserve(m[k], N), 0);
		T_EQ_INT(rl_model_forward(m[k], lp[k], ent[k], tok, tgt, seg, pos, B, T, TEMP), 0);
	}
	snprintf(what, sizeof what, "%s V=%d ld=%d rows=%d%s", nm, V, ld, rows, train ? "" : " forward only");
	int ok = same(what, lp[1], lp[0], N) & same(what, ent[1], ent[0], N);
	/* chunks: every one through the strided ops */
	int nch = rows > 0 ? (N + rows - 1) / rows : 1;
	T_EQ_INT(nfwd_ld - f0, nch);
	T_EQ_INT(nlpf_ld - l0, nch);
	if (train) {
		for (int step = 0; step < 2; step++) {
			rl_adamw hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
				.weight_decay = 0.1f, .max_grad_norm = 1.0f };
			float gn[2];
			for (int k = 0; k < 2; k++) {
				if (step > 0)
					T_EQ_INT(rl_model_forward(m[k], NULL, NULL, tok, tgt, seg, pos, B, T, TEMP), 0);
				T_EQ_INT(rl_model_backward(m[k], dlp, dent), 0);
			}
			for (int i = 0; i < mp->tt.n && step == 0; i++) {
				const rl_tensor *t = &mp->tt.t[i];
				float *g0 = rl_xmalloc(t->n * 4), *g1 = rl_xmalloc(t->n * 4);
				T_EQ_INT(rl_model_get(mp, i, RL_MODEL_GRAD, g0), 0);
				T_EQ_INT(rl_model_get(ms, i, RL_MODEL_GRAD, g1), 0);
				snprintf(what, sizeof what, "%s V=%d rows=%d grad %s", nm, V, rows, t->name);
				ok &= same(what, g1, g0, t->n);
				free(g0);
				free(g1);
			}
			for (int k = 0; k < 2; k++)
				T_EQ_INT(rl_model_step(m[k], &hp, &gn[k]), 0);
			T_OK(gn[0] == gn[1], "grad norm %g vs %g", gn[1], gn[0]);
		}
		for (int i = 0; i < mp->tt.n; i++) {
			const rl_tensor *t = &mp->tt.t[i];
			float *p0 = rl_xmalloc(t->n * 4), *p1 = rl_xmalloc(t->n * 4);
			rl_model_get(mp, i, RL_MODEL_PARAM, p0);
			rl_model_get(ms, i, RL_MODEL_PARAM, p1);
			snprintf(what, sizeof what, "%s V=%d rows=%d 2 steps %s", nm, V, rows, t->name);
			ok &= same(what, p1, p0, t->n);
			free(p0);
			free(p1);
		}
		/* the backward recomputes every chunk but a kept whole batch */
		T_EQ_INT(nfwd_ld - f0, 2 * (nch + (nch > 1 ? nch : 0)));
		T_EQ_INT(nbwd_ld - b0, 2 * nch);
		T_EQ_INT(nlpb_ld - lb0, 2 * nch);
	}
	printf("%s %s V=%d ld=%d, chunks of %d rows%s\n", ok ? "ok  " : "FAIL", nm, V, ld, rows ? rows : N,
	    train ? "" : ", forward only");
	for (int k = 0; k < 2; k++) {
		free(lp[k]);
		free(ent[k]);
	}
	free(dlp); free(dent); free(tok); free(tgt); free(seg); free(pos);
out:
	rl_model_close(mp);
	rl_model_close(ms);
	rl_st_close(ex);
	ex = NULL;
}

int
main(void)
{
	rl_ops *cpu = NULL;
	T_BEGIN("test_model_head");
	T_EQ_INT(rl_ops_cpu_open(&cpu), RL_OK);
	if (!cpu)
		T_END();
	T_OK(cpu->matmul_fwd_ld == NULL && cpu->head_ld_align == 0, "the CPU backend has no strided head");
	/* the CPU table with strided LM-head ops (same ctx; closed through cpu only) */
	rl_ops st = *cpu;
	st.alloc = w_alloc;
	st.head_ld_align = ALIGN;
	st.matmul_fwd_ld = w_matmul_fwd_ld;
	st.matmul_bwd_ld = w_matmul_bwd_ld;
	st.logprob_fwd_ld = w_logprob_fwd_ld;
	st.logprob_bwd_ld = w_logprob_bwd_ld;
	st.close = NULL;

	run(cpu, &st, "gpt2", 0, 1, 1);
	run(cpu, &st, "gpt2", 0, 5, 1);
	run(cpu, &st, "gpt2", 0, 0, 1);
	run(cpu, &st, "qwen2", 0, 5, 1);
	run(cpu, &st, "qwen3", 0, 0, 1);
	run(cpu, &st, "gpt2", 1001, 4, 1);
	run(cpu, &st, "gpt2", 1001, 0, 1);
	run(cpu, &st, "qwen2", 5003, 7, 1);
	run(cpu, &st, "qwen2", 5003, 0, 0);
	T_EQ_INT(bad_ld, 0);
	rl_ops_close(cpu);
	T_END();
}

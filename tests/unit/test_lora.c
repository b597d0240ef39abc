/*
 * test_lora.c — LoRA adapters (model/lora.h) on the CPU backend:
 *   - a new adapter (B = 0) gives the base model's log-probs bit for bit;
 *     A's init is PEFT's kaiming-uniform bound 1/sqrt(in);
 *   - with B random, the log-probs and the gradients of every A and B
 *     against tests/fixtures/lora_ref.py (PyTorch autograd, float64, through
 *     W + scale B A) on Qwen2 (biases, untied head) and Qwen3 (q/k-norm, tied
 *     head), with and without --recompute; skipped without torch;
 *   - AdamW steps move the adapters and leave every base tensor bit for bit;
 *   - merging gives the adapted model's log-probs;
 *   - dropout: on in a training model's forwards, off without gradients, and
 *     the same masks in a recomputed backward;
 *   - the adapters off (rl_model_lora_off, a reference that is the base): the
 *     base's log-probs bit for bit with B random and dropout on, no masks
 *     drawn (the next forwards and gradients as if it had not run), no
 *     backward of it;
 *   - bad options: unknown target, rank 0, GPT-2, adapters after the buffers.
 *
 * Tolerance: the model runs in f32, the reference in float64.  Log-probs are
 * O(5) through two layers: f32 rounding ~1e-6 relative, bound 1e-4 absolute.
 * Gradients are O(1e-2..1) sums over 14 tokens: bound 2e-4 + 2e-3 relative,
 * ~100x the rounding; a missing path or a wrong scale is off by the whole
 * term (the check also requires each gradient to be non-trivial).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "compute/ops.h"
#include "model/lora.h"
#include "model/model.h"
#include "t.h"

#define B 2
#define T 7
#define N (B * T)

static int32_t tok[N], tgt[N];
static float coef[N];
static int have_torch;

static rl_model *
open_model(rl_ops *o, const char *dir, const rl_lora_opts *lo, int recompute)
{
	rl_model *m = NULL;
	if (rl_model_open(&m, dir, o) != 0)
		return NULL;
	m->recompute = recompute;
	if (lo != NULL && rl_model_add_lora(m, lo) != 0) {
		rl_model_close(m);
		return NULL;
	}
	if (rl_model_train_reserve(m, N) != 0) {
		rl_model_close(m);
		return NULL;
	}
	return m;
}

/* lp of m over the batch, then (with grads) the backward of L = sum coef * lp. */
static int
pass(rl_model *m, float *lp, int backward)
{
	int rv = rl_model_forward(m, lp, NULL, tok, tgt, NULL, NULL, B, T, 1.0f);
	if (rv == 0 && backward) {
		rl_model_zero_grad(m);
		rv = rl_model_backward(m, coef, NULL);
	}
	return rv;
}

static void
put_floats(FILE *f, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%.9g", i ? "," : "", x[i]);
}

/* Compares m's log-probs lp and adapter gradients with lora_ref.py's. */
static void
check_ref(rl_model *m, const char *dir, const float *lp, const char *what)
{
	char path[] = "/tmp/rl-test-lora.XXXXXX", cmd[256];
	int fd = mkstemp(path), bad = 0, checked = 0;
	FILE *f = fdopen(fd, "w"), *p;
	const rl_lora_opts *lo = rl_model_lora(m);
	float *buf = malloc(m->tt.total * sizeof *buf);
	double x;

	fprintf(f, "{\"model\":\"%s\",\"scale\":%.9g,\"B\":%d,\"T\":%d,\"tok\":[", dir, lo->alpha / lo->r, B, T);
	for (int n = 0; n < N; n++)
		fprintf(f, "%s%d", n ? "," : "", tok[n]);
	fprintf(f, "],\"tgt\":[");
	for (int n = 0; n < N; n++)
		fprintf(f, "%s%d", n ? "," : "", tgt[n]);
	fprintf(f, "],\"c\":[");
	put_floats(f, coef, N);
	fprintf(f, "],\"adapters\":{");
	int first = 1;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if (!(t->flags & RL_T_LORA))
			continue;
		rl_model_get(m, i, RL_MODEL_PARAM, buf);
		fprintf(f, "%s\"%s\":{\"shape\":[%lld,%lld],\"data\":[", first ? "" : ",", t->name,
		    (long long)t->shape[0], (long long)t->shape[1]);
		put_floats(f, buf, t->n);
		fprintf(f, "]}");
		first = 0;
	}
	fprintf(f, "}}\n");
	fclose(f);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/fixtures/lora_ref.py < %s", path);
	p = popen(cmd, "r");
	T_OK(p != NULL, "popen");
	for (int n = 0; n < N; n++) {
		T_OK(fscanf(p, "%lf", &x) == 1, "%s: reference lp %d", what, n);
		if (fabs(lp[n] - x) > 1e-4)
			bad++;
	}
	T_OK(bad == 0, "%s: %d log-probs off the reference", what, bad);
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		double gmax = 0;
		if (!(t->flags & RL_T_LORA))
			continue;
		rl_model_get(m, i, RL_MODEL_GRAD, buf);
		bad = 0;
		for (size_t k = 0; k < t->n; k++) {
			if (fscanf(p, "%lf", &x) != 1) {
				bad++;
				break;
			}
			gmax = fmax(gmax, fabs(x));
			if (!(fabs(buf[k] - x) <= 2e-4 + 2e-3 * fabs(x)))
				bad++;
			checked++;
		}
		T_OK(bad == 0, "%s: %s: %d of %zu gradient elements off the reference", what, t->name, bad, t->n);
		T_OK(gmax > 1e-3, "%s: %s: reference gradient ~0", what, t->name);
	}
	T_OK(pclose(p) == 0, "%s: lora_ref.py failed", what);
	T_OK(checked > 0, "%s: no gradients compared", what);
	unlink(path);
	free(buf);
}

static void
case_model(rl_ops *o, const char *dir, int recompute)
{
	rl_lora_opts lo = { .r = 4, .alpha = 8, .targets = RL_LORA_ALL, .seed = 5 };
	rl_model *m0 = open_model(o, dir, NULL, recompute), *m = open_model(o, dir, &lo, recompute);
	float lp0[N], lp1[N], lp2[N], *buf, *ref;
	char what[128];

	snprintf(what, sizeof what, "%s%s", dir, recompute ? " (recompute)" : "");
	T_OK(m0 != NULL && m != NULL, "%s: open", what);
	if (m0 == NULL || m == NULL)
		return;
	buf = malloc(m->tt.total * sizeof *buf);
	ref = malloc(m->tt.total * sizeof *ref);
	T_EQ_INT(pass(m0, lp0, 0), 0);
	T_EQ_INT(pass(m, lp1, 0), 0);
	T_OK(memcmp(lp0, lp1, sizeof lp0) == 0, "%s: a new adapter changes the log-probs", what);

	/* A: PEFT's bound; B: zero; shapes (r, in), (out, r) */
	int ia = rl_model_lora_tensor(m, 1, RL_LORA_GATE, 0), ib = rl_model_lora_tensor(m, 1, RL_LORA_GATE, 1);
	T_OK(ia >= 0 && ib >= 0, "adapter tensors");
	T_EQ_INT(m->tt.t[ia].shape[0], 4);
	T_EQ_INT(m->tt.t[ia].shape[1], m->cfg.hidden_size);
	T_EQ_INT(m->tt.t[ib].shape[0], m->cfg.intermediate_size);
	T_EQ_INT(m->tt.t[ib].shape[1], 4);
	T_EQ_STR(m->tt.t[ia].name, "base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight");
	rl_model_get(m, ia, RL_MODEL_PARAM, buf);
	double amax = 0, bound = 1 / sqrt((double)m->cfg.hidden_size);
	for (size_t k = 0; k < m->tt.t[ia].n; k++)
		amax = fmax(amax, fabs(buf[k]));
	T_OK(amax <= bound && amax > 0.9 * bound, "A's init: max |a| %.4g, bound %.4g", amax, bound);

	/* B random: the adapters matter */
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if (!(t->flags & RL_T_LORA) || !strstr(t->name, "lora_B"))
			continue;
		for (size_t k = 0; k < t->n; k++)
			buf[k] = (float)(0.2 * (rl_rng_uniform(99 + i, k) - 0.5));
		rl_model_set(m, i, buf);
	}
	T_EQ_INT(pass(m, lp2, 1), 0);
	double dmax = 0;
	for (int n = 0; n < N; n++)
		dmax = fmax(dmax, fabs(lp2[n] - lp0[n]));
	T_OK(dmax > 1e-3, "%s: the adapters change the log-probs (max %.3g)", what, dmax);
	if (have_torch)
		check_ref(m, dir, lp2, what);
	/* no gradient reaches a frozen tensor */
	int nz = 0;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if ((t->flags & RL_T_LORA) || t->ndim != 2)
			continue;
		rl_model_get(m, i, RL_MODEL_GRAD, buf);
		for (size_t k = 0; k < t->n; k++)
			nz += buf[k] != 0;
	}
	T_EQ_INT(nz, 0);
	/* gradients and AdamW state only for the adapters: from the first one on */
	T_EQ_INT(m->goff, m->tt.t[rl_model_lora_tensor(m, 0, RL_LORA_Q, 0)].off);

	/* AdamW: adapters move, the base stays bit for bit */
	rl_adamw p = { .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		       .max_grad_norm = 1.0f };
	rl_model_get(m, ia, RL_MODEL_PARAM, ref);
	for (int s = 0; s < 3; s++) {
		float gn = 0;
		T_EQ_INT(pass(m, lp1, 1), 0);
		T_EQ_INT(rl_model_step(m, &p, &gn), 0);
		T_OK(gn > 0 && isfinite(gn), "grad norm %g", gn);
	}
	rl_model_get(m, ia, RL_MODEL_PARAM, buf);
	T_OK(memcmp(buf, ref, m->tt.t[ia].n * sizeof *buf) != 0, "%s: A did not move", what);
	int moved = 0;
	for (int i = 0; i < m0->tt.n; i++) {
		rl_model_get(m0, i, RL_MODEL_PARAM, ref);
		rl_model_get(m, i, RL_MODEL_PARAM, buf);
		moved += memcmp(buf, ref, m0->tt.t[i].n * sizeof *buf) != 0;
	}
	T_EQ_INT(moved, 0);

	/* merged: the same log-probs through W + scale B A */
	T_EQ_INT(pass(m, lp1, 0), 0);
	T_EQ_INT(rl_model_lora_merge(m), 0);
	T_EQ_INT(pass(m, lp2, 0), 0);
	for (int n = 0; n < N; n++)
		T_CLOSE(lp2[n], lp1[n], 2e-5, 0);
	free(buf);
	free(ref);
	rl_model_close(m0);
	rl_model_close(m);
}

static void
case_dropout(rl_ops *o, const char *dir)
{
	rl_lora_opts lo = { .r = 4, .alpha = 8, .dropout = 0.5f, .targets = RL_LORA_ALL, .seed = 5 };
	rl_lora_opts l0 = lo;
	rl_model *a = open_model(o, dir, &lo, 0), *b = open_model(o, dir, &lo, 1), *c = NULL;
	float lpa[N], lpb[N], lpc[N], *ga, *gb;

	l0.dropout = 0;
	c = open_model(o, dir, &l0, 0);
	T_OK(a && b && c, "dropout models");
	if (!a || !b || !c)
		return;
	ga = malloc(a->tt.total * sizeof *ga);
	gb = malloc(a->tt.total * sizeof *gb);
	for (rl_model **mp = (rl_model *[]){ a, b, c, NULL }; *mp; mp++)
		for (int i = 0; i < (*mp)->tt.n; i++)
			if (strstr((*mp)->tt.t[i].name, "lora_B")) {
				for (size_t k = 0; k < (*mp)->tt.t[i].n; k++)
					ga[k] = (float)(0.2 * (rl_rng_uniform(7 + i, k) - 0.5));
				rl_model_set(*mp, i, ga);
			}
	T_EQ_INT(pass(a, lpa, 1), 0);
	T_EQ_INT(pass(b, lpb, 1), 0);
	T_EQ_INT(pass(c, lpc, 0), 0);
	T_OK(memcmp(lpa, lpb, sizeof lpa) == 0, "recompute: the same dropout masks in the forward");
	T_OK(memcmp(lpa, lpc, sizeof lpa) != 0, "dropout 0.5 leaves the log-probs as without");
	int bad = 0;
	for (int i = 0; i < a->tt.n; i++) {
		if (!(a->tt.t[i].flags & RL_T_LORA))
			continue;
		rl_model_get(a, i, RL_MODEL_GRAD, ga);
		rl_model_get(b, i, RL_MODEL_GRAD, gb);
		for (size_t k = 0; k < a->tt.t[i].n; k++)
			bad += !(fabs(ga[k] - gb[k]) <= 1e-6 + 1e-5 * fabs(ga[k]));
	}
	T_EQ_INT(bad, 0);
	/* the next forward draws new masks */
	T_EQ_INT(pass(a, lpb, 0), 0);
	T_OK(memcmp(lpa, lpb, sizeof lpa) != 0, "the same masks twice");
	free(ga);
	free(gb);
	rl_model_close(a);
	rl_model_close(b);
	rl_model_close(c);
	/* without gradients (evaluation) no dropout */
	rl_model *e = NULL;
	T_EQ_INT(rl_model_open(&e, dir, o), 0);
	T_EQ_INT(rl_model_add_lora(e, &lo), 0);
	T_EQ_INT(rl_model_eval_reserve(e, N), 0);
	rl_model *e0 = open_model(o, dir, NULL, 0);
	T_EQ_INT(rl_model_forward(e, lpa, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
	T_EQ_INT(pass(e0, lpb, 0), 0);
	T_OK(memcmp(lpa, lpb, sizeof lpa) == 0, "dropout in an evaluation forward");
	rl_model_close(e);
	rl_model_close(e0);
}

static void
case_off(rl_ops *o, const char *dir)
{
	rl_lora_opts lo = { .r = 4, .alpha = 8, .dropout = 0.5f, .targets = RL_LORA_ALL, .seed = 5 };
	rl_model *a = open_model(o, dir, &lo, 0), *a2 = open_model(o, dir, &lo, 0), *base = open_model(o, dir, NULL, 0);
	float lpoff[N], lpb[N], lpa[N], lpa2[N], *ga, *gb;
	char err[1024];
	int rv, bad = 0;

	T_OK(a && a2 && base, "adapters-off models");
	if (!a || !a2 || !base)
		return;
	ga = malloc(a->tt.total * sizeof *ga);
	gb = malloc(a->tt.total * sizeof *gb);
	for (rl_model **mp = (rl_model *[]){ a, a2, NULL }; *mp; mp++)
		for (int i = 0; i < (*mp)->tt.n; i++)
			if (strstr((*mp)->tt.t[i].name, "lora_B")) {
				for (size_t k = 0; k < (*mp)->tt.t[i].n; k++)
					ga[k] = (float)(0.2 * (rl_rng_uniform(7 + i, k) - 0.5));
				rl_model_set(*mp, i, ga);
			}
	T_EQ_INT(rl_model_lora_off(a, 1), 0);
	T_EQ_INT(pass(a, lpoff, 0), 0);
	T_EQ_INT(pass(base, lpb, 0), 0);
	T_OK(memcmp(lpoff, lpb, sizeof lpb) == 0, "adapters off: not the base's log-probs");
	T_CAPTURE(rl_model_backward(a, coef, NULL), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(err, "adapters off") != NULL, "message: %s", err);
	/* back on: the same forward and gradients as a model that never switched them off */
	T_EQ_INT(rl_model_lora_off(a, 0), 0);
	T_EQ_INT(pass(a, lpa, 1), 0);
	T_EQ_INT(pass(a2, lpa2, 1), 0);
	T_OK(memcmp(lpa, lpa2, sizeof lpa) == 0, "adapters on again: other log-probs (dropout masks drawn?)");
	T_OK(memcmp(lpa, lpb, sizeof lpa) != 0, "adapters on: the base's log-probs");
	for (int i = 0; i < a->tt.n; i++) {
		if (!(a->tt.t[i].flags & RL_T_LORA))
			continue;
		rl_model_get(a, i, RL_MODEL_GRAD, ga);
		rl_model_get(a2, i, RL_MODEL_GRAD, gb);
		bad += memcmp(ga, gb, a->tt.t[i].n * sizeof *ga) != 0;
	}
	T_EQ_INT(bad, 0);
	T_CAPTURE(rl_model_lora_off(base, 1), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(err, "no LoRA adapters") != NULL, "message: %s", err);
	free(ga);
	free(gb);
	rl_model_close(a);
	rl_model_close(a2);
	rl_model_close(base);
}

static void
case_bad(rl_ops *o)
{
	char err[1024];
	unsigned mask = 0;
	int rv;
	rl_model *m = NULL;
	rl_lora_opts lo = { .r = 4, .alpha = 8, .targets = RL_LORA_ALL };

	T_EQ_INT(rl_lora_targets_parse("q_proj,v_proj", &mask), 0);
	T_EQ_INT(mask, (1u << RL_LORA_Q) | (1u << RL_LORA_V));
	T_EQ_INT(rl_lora_targets_parse("all-linear", &mask), 0);
	T_EQ_INT(mask, RL_LORA_ALL);
	T_CAPTURE(rl_lora_targets_parse("q_proj,qproj", &mask), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(err, "'qproj' is not a module") != NULL, "message: %s", err);
	T_CAPTURE(rl_lora_targets_parse("", &mask), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);

	T_EQ_INT(rl_model_open(&m, "tests/fixtures/gpt2", o), 0);
	T_CAPTURE(rl_model_add_lora(m, &lo), &rv, err);
	T_EQ_INT(rv, RL_ENOTSUP);
	T_OK(strstr(err, "GPT-2") != NULL, "message: %s", err);
	rl_model_close(m);
	m = NULL;
	T_EQ_INT(rl_model_open(&m, "tests/fixtures/qwen2", o), 0);
	lo.r = 0;
	T_CAPTURE(rl_model_add_lora(m, &lo), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(err, "rank 0") != NULL, "message: %s", err);
	lo.r = 4;
	T_EQ_INT(rl_model_train_reserve(m, N), 0);
	T_CAPTURE(rl_model_add_lora(m, &lo), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(err, "before reserving") != NULL, "message: %s", err);
	rl_model_close(m);
}

int
main(void)
{
	rl_ops *o = NULL;

	T_BEGIN("test_lora");
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	for (int n = 0; n < N; n++) {
		tok[n] = (int32_t)(rl_rng_uniform(11, (uint64_t)n) * 90);
		tgt[n] = n % T == T - 1 ? -1 : (int32_t)(rl_rng_uniform(12, (uint64_t)n) * 90);
		coef[n] = (float)(rl_rng_uniform(13, (uint64_t)n) - 0.3);
	}
	have_torch = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
	if (!have_torch)
		printf("test_lora: no PyTorch at /usr/bin/python3: the comparison with the reference is skipped\n");
	case_model(o, "tests/fixtures/qwen2", 0);
	case_model(o, "tests/fixtures/qwen3", 0);
	case_model(o, "tests/fixtures/qwen3", 1);
	case_dropout(o, "tests/fixtures/qwen2");
	case_off(o, "tests/fixtures/qwen2");
	case_bad(o);
	T_END();
}

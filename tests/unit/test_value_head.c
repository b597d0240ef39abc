/*
 * test_value_head.c — PPO's value head on the shared trunk (model.h):
 *   - forward: value = value_head.weight . h + bias (a zero weight gives the
 *     bias exactly; the values are linear in the head);
 *   - backward: the gradient of L = sum_n c[n] value[n] (+ a log-prob term)
 *     against central finite differences, for the head's weight and bias and
 *     for trunk tensors (final norm, attention, MLP, embedding), which the
 *     value gradient reaches through the final norm;
 *   - checkpoints: the head goes to value_head.safetensors, not into
 *     model.safetensors; reloading gives the same values bitwise; AdamW
 *     moves it with aux_lr;
 *   - bad input: a head of the wrong shape or without its bias, adding the
 *     head after the training buffers exist.
 *
 * Finite differences: fp32 model, loss O(1), step eps = 1e-2 (2e-3 for the
 * embedding, whose elements are O(0.02) and feed an RMSNorm: a larger step
 * is not in the linear range, measured 4% off at 1e-2).  The central
 * difference's truncation error is O(eps^2 f''') ~ 1e-4 here and its rounding
 * error ~ 1e-7 |L| / eps <= 1e-4; the bound atol 5e-4 + rtol 2e-2 is a few
 * times that.  A missing path (no gradient into
 * the trunk, a dropped bias) is off by the whole gradient, O(1e-2..1).
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/ckpt.h"
#include "model/config.h"
#include "model/model.h"
#include "compute/ops.h"
#include "base/rng.h"
#include "model/safetensors.h"
#include "t.h"
#include "sync/wckpt.h"
#include "sync/wsync.h"

#define B 2
#define T 7
#define N (B * T)

static const char cfg_json[] =
    "{\"model_type\":\"qwen2\",\"vocab_size\":40,\"hidden_size\":16,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":24,"
    "\"max_position_embeddings\":32,\"tie_word_embeddings\":true,\"torch_dtype\":\"float32\"}";

static int32_t tok[N], tgt[N];
static float cval[N], clp[N];
static char tmpd[] = "/tmp/rl-test-vh.XXXXXX";

/* stmt with stderr sent to /dev/null (an expected error message) */
#define QUIET(stmt)                                                              \
	do {                                                                     \
		fflush(stderr);                                                  \
		int s_ = dup(2), n_ = open("/dev/null", O_WRONLY);               \
		dup2(n_, 2);                                                     \
		stmt;                                                            \
		fflush(stderr);                                                  \
		dup2(s_, 2);                                                     \
		close(s_);                                                       \
		close(n_);                                                       \
	} while (0)

/* L = sum_n cval[n] value[n] + with_lp * sum_n clp[n] lp[n], in double. */
static double
loss(rl_model *m, int with_lp)
{
	float lp[N], val[N];
	double L = 0;

	if (rl_model_forward(m, lp, NULL, tok, tgt, NULL, NULL, B, T, 1.0f) != 0)
		return NAN;
	m->ops->download(m->ops, val, m->val, sizeof val);
	for (int n = 0; n < N; n++)
		L += (double)cval[n] * val[n] + (with_lp ? (double)clp[n] * lp[n] : 0);
	return L;
}

/* Checks the analytic gradient of tensor i (elements [0, count) in steps of
 * stride) against central differences. */
static void
fd_check(rl_model *m, int i, int stride, int count, int with_lp, float eps)
{
	const rl_tensor *t = &m->tt.t[i];
	float *p = rl_xmalloc(t->n * sizeof(float)), *g = rl_xmalloc(t->n * sizeof(float));
	int bad = 0, checked = 0;
	double gmax = 0;

	rl_model_get(m, i, RL_MODEL_PARAM, p);
	rl_model_get(m, i, RL_MODEL_GRAD, g);
	for (int j = 0; j < count && (size_t)j < t->n; j += stride) {
		float keep = p[j];
		double lp, lm, fd;
		p[j] = keep + eps;
		rl_model_set(m, i, p);
		lp = loss(m, with_lp);
		p[j] = keep - eps;
		rl_model_set(m, i, p);
		lm = loss(m, with_lp);
		p[j] = keep;
		rl_model_set(m, i, p);
		fd = (lp - lm) / (2.0 * eps);
		if (!(fabs(fd - g[j]) <= 5e-4 + 2e-2 * fabs(fd))) {
			if (bad++ == 0)
				fprintf(stderr, "  %s[%d]: analytic %.6g, finite difference %.6g\n", t->name, j, g[j], fd);
		}
		gmax = fmax(gmax, fabs(g[j]));
		checked++;
	}
	T_OK(bad == 0, "%s: %d of %d gradient elements off", t->name, bad, checked);
	/* a check against all-zero gradients would pass vacuously */
	T_OK(gmax > 1e-3, "%s: gradient is ~0 (max %.3g)", t->name, gmax);
	free(p);
	free(g);
}

static rl_model *
new_model(rl_ops *o, const rl_config *cfg, uint64_t seed)
{
	rl_model *m = NULL;
	if (rl_model_init_random(&m, cfg, o, seed) != 0)
		return NULL;
	return m;
}

static int
fill_zero(void *ctx, int i, void *buf, size_t nbytes)
{
	(void)ctx;
	(void)i;
	memset(buf, 0, nbytes);
	return 0;
}

/* DIR/value_head.safetensors of zeros: weight [1, wcols], bias [1] (optional). */
static void
write_head(const char *dir, int64_t wcols, int with_bias)
{
	char path[700];
	rl_st_entry e[2] = { { "value_head.weight", RL_F32, 2, { 1, wcols } },
		{ "value_head.bias", RL_F32, 1, { 1 } } };

	snprintf(path, sizeof path, "%s/%s", dir, RL_VALUE_HEAD_FILE);
	T_EQ_INT(rl_st_write(path, e, with_bias ? 2 : 1, NULL, 0, fill_zero, NULL), 0);
}

int
main(void)
{
	rl_ops *o = NULL;
	rl_config cfg = { 0 };
	rl_model *m = NULL, *m2 = NULL;
	char dir[600], path[700];
	int C;

	T_BEGIN("test_value_head");
	if (mkdtemp(tmpd) == NULL)
		return 1;
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	T_EQ_INT(rl_config_parse(&cfg, cfg_json, strlen(cfg_json), "config"), 0);
	C = cfg.hidden_size;
	for (int n = 0; n < N; n++) {
		tok[n] = (int32_t)(rl_rng_uniform(11, (uint64_t)n) * cfg.vocab_size);
		/* the last position of each row has no target */
		tgt[n] = n % T == T - 1 ? -1 : (int32_t)(rl_rng_uniform(12, (uint64_t)n) * cfg.vocab_size);
		cval[n] = tgt[n] < 0 ? 0 : (float)(2 * rl_rng_uniform(13, (uint64_t)n) - 1);
		clp[n] = tgt[n] < 0 ? 0 : (float)(2 * rl_rng_uniform(14, (uint64_t)n) - 1);
	}

	/* ---- forward ---- */
	m = new_model(o, &cfg, 5);
	T_OK(m != NULL, "init");
	if (m == NULL)
		goto out;
	T_EQ_INT(m->vh_w, -1);
	T_EQ_INT(rl_model_add_value_head(m, NULL, 7), 0);
	T_OK(m->vh_w >= 0 && m->vh_b >= 0, "value head tensors in the table");
	T_OK(m->tt.t[m->vh_w].flags & RL_T_AUX, "value head is RL_T_AUX");
	T_EQ_INT(m->tt.t[m->vh_w].n, C);
	T_EQ_INT(rl_model_add_value_head(m, NULL, 7), 0); /* a no-op */
	{
		/* deterministic in seed */
		rl_model *mb = new_model(o, &cfg, 5);
		float w1[64], w2[64];
		T_EQ_INT(rl_model_add_value_head(mb, NULL, 7), 0);
		rl_model_get(m, m->vh_w, RL_MODEL_PARAM, w1);
		rl_model_get(mb, mb->vh_w, RL_MODEL_PARAM, w2);
		T_OK(memcmp(w1, w2, sizeof(float) * C) == 0, "same seed, same head");
		double ss = 0;
		for (int j = 0; j < C; j++)
			ss += (double)w1[j] * w1[j];
		T_OK(ss > 0 && sqrt(ss / C) < 5.0 / (C + 1), "small init, rms %.3g", sqrt(ss / C));
		rl_model_close(mb);
	}
	T_EQ_INT(rl_model_train_reserve(m, N), 0);
	{
		/* after the reserve: refused */
		rl_model *mc = new_model(o, &cfg, 5);
		int rv = 0;
		rl_model_eval_reserve(mc, N);
		QUIET(rv = rl_model_add_value_head(mc, NULL, 7));
		T_EQ_INT(rv, RL_EINVAL);
		rl_model_close(mc);
	}
	{
		float w[64], keep[64], b = 0.7f, val[N], val2[N];
		rl_model_get(m, m->vh_w, RL_MODEL_PARAM, keep);
		memset(w, 0, sizeof w);
		rl_model_set(m, m->vh_w, w);
		rl_model_set(m, m->vh_b, &b);
		T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
		o->download(o, val, m->val, sizeof val);
		int all = 1;
		for (int n = 0; n < N; n++)
			all &= val[n] == 0.7f;
		T_OK(all, "zero weight: every value is the bias");
		/* linear in the head: doubling the weight (bias 0) doubles the values */
		b = 0;
		rl_model_set(m, m->vh_b, &b);
		for (int j = 0; j < C; j++)
			w[j] = 0.3f * (float)(2 * rl_rng_uniform(21, (uint64_t)j) - 1);
		rl_model_set(m, m->vh_w, w);
		loss(m, 0);
		o->download(o, val, m->val, sizeof val);
		for (int j = 0; j < C; j++)
			w[j] *= 2;
		rl_model_set(m, m->vh_w, w);
		loss(m, 0);
		o->download(o, val2, m->val, sizeof val2);
		double err = 0, mag = 0;
		for (int n = 0; n < N; n++) {
			err = fmax(err, fabs(val2[n] - 2 * val[n]));
			mag = fmax(mag, fabs(val[n]));
		}
		T_OK(err <= 1e-5 * (1 + mag) && mag > 0.05, "values linear in the head: err %.3g, |v| %.3g", err, mag);
		/* a head large enough that its gradient into the trunk is not at noise level */
		for (int j = 0; j < C; j++)
			w[j] = 0.5f * (float)(2 * rl_rng_uniform(22, (uint64_t)j) - 1);
		b = 0.1f;
		rl_model_set(m, m->vh_w, w);
		rl_model_set(m, m->vh_b, &b);
	}

	/* ---- backward against finite differences ---- */
	for (int with_lp = 0; with_lp < 2; with_lp++) {
		float *d_c = NULL, *d_l = NULL, zero[N] = { 0 };
		o->alloc(o, (void **)&d_c, sizeof cval);
		o->alloc(o, (void **)&d_l, sizeof clp);
		o->upload(o, d_c, cval, sizeof cval);
		o->upload(o, d_l, with_lp ? clp : zero, sizeof clp);
		rl_model_zero_grad(m);
		T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
		T_EQ_INT(rl_model_backward_value(m, d_l, NULL, d_c), 0);
		fd_check(m, m->vh_w, 1, C, with_lp, 1e-2f);
		fd_check(m, m->vh_b, 1, 1, with_lp, 1e-2f);
		fd_check(m, m->lnf_w, 1, C, with_lp, 1e-2f);
		fd_check(m, m->layer[1].proj_w, 7, 24 * 16, with_lp, 1e-2f);
		fd_check(m, m->layer[0].qkv_w, 5, 32 * 16, with_lp, 1e-2f);
		fd_check(m, m->layer[0].ln1_w, 1, C, with_lp, 1e-2f);
		fd_check(m, m->wte, 3, 40 * 16, with_lp, 2e-3f);
		o->free(o, d_c);
		o->free(o, d_l);
	}
	{
		/* a value gradient on a model without a head is refused */
		rl_model *mc = new_model(o, &cfg, 5);
		float *d = NULL;
		int rv = 0;
		o->alloc(o, (void **)&d, sizeof cval);
		o->upload(o, d, cval, sizeof cval);
		rl_model_train_reserve(mc, N);
		rl_model_forward(mc, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f);
		T_OK(mc->val == NULL, "no values without a head");
		QUIET(rv = rl_model_backward_value(mc, d, NULL, d));
		T_EQ_INT(rv, RL_EINVAL);
		o->free(o, d);
		rl_model_close(mc);
	}

	/* ---- checkpoints ---- */
	{
		float val[N], val2[N], g[64];
		rl_st_file *f = NULL;
		T_EQ_INT(rl_model_forward(m, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
		o->download(o, val, m->val, sizeof val);
		T_EQ_INT(rl_ckpt_save(m, tmpd, 1, dir, sizeof dir), 0);
		snprintf(path, sizeof path, "%s/model.safetensors", dir);
		T_EQ_INT(rl_st_open(&f, path), 0);
		T_OK(f && rl_st_find(f, "value_head.weight") == NULL && rl_st_find(f, "value_head.bias") == NULL,
		    "model.safetensors holds only the Hugging Face tensors");
		T_OK(f && rl_st_find(f, "model.norm.weight") != NULL, "model.safetensors has the model");
		rl_st_close(f);
		f = NULL;
		snprintf(path, sizeof path, "%s/%s", dir, RL_VALUE_HEAD_FILE);
		T_EQ_INT(rl_st_open(&f, path), 0);
		if (f) {
			const rl_st_tensor *t = rl_st_find(f, "value_head.weight");
			T_OK(t && t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == C && t->dtype == RL_F32,
			    "value_head.weight [1, C] f32");
			T_OK(rl_st_find(f, "value_head.bias") != NULL, "value_head.bias");
		}
		rl_st_close(f);
		f = NULL;
		/* the same version built in memory (rl-train --ckpt-every, for
		 * rl-sync): the directory's model.safetensors to the byte, no head */
		{
			rl_wver *v = NULL, *d = NULL;
			T_EQ_INT(rl_wver_from_ckpt(&v, m, 1), 0);
			T_EQ_INT(rl_wver_read_dir(&d, dir, 0), 0);
			const rl_wblob *x = d ? rl_wver_find(d, "model.safetensors") : NULL;
			const rl_wblob *y = v ? rl_wver_find(v, "model.safetensors") : NULL;
			T_OK(x && y && x->size == y->size && memcmp(x->data, y->data, x->size) == 0,
			    "in-memory model.safetensors differs from the directory's");
			T_OK(v && rl_wver_find(v, RL_VALUE_HEAD_FILE) == NULL, "the value head went to the generator");
			rl_wver_destroy(v);
			rl_wver_destroy(d);
		}
		snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
		T_EQ_INT(rl_st_open(&f, path), 0);
		T_OK(f && rl_st_find(f, "value_head.weight.exp_avg") != NULL, "optimizer state of the head");
		rl_st_close(f);
		/* loading the directory: a plain policy; with the head added, the same values */
		T_EQ_INT(rl_model_open(&m2, dir, o), 0);
		if (m2) {
			T_EQ_INT(m2->vh_w, -1);
			T_EQ_INT(rl_model_add_value_head(m2, dir, 99), 0);
			T_EQ_INT(rl_model_train_reserve(m2, N), 0);
			T_EQ_INT(rl_model_forward(m2, NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
			o->download(o, val2, m2->val, sizeof val2);
			T_OK(memcmp(val, val2, sizeof val) == 0, "values after save/load are bitwise equal");
			T_EQ_INT(rl_ckpt_load_optimizer(m2, dir), 0);
			/* aux_lr: an lr-0 step leaves the trunk alone and moves the head */
			float h0[64], h1[64], n0[64], n1[64], *d = NULL;
			rl_adamw ad = { .lr = 0, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .aux_lr = 1e-2f };
			o->alloc(o, (void **)&d, sizeof cval);
			o->upload(o, d, cval, sizeof cval);
			rl_model_backward_value(m2, d, NULL, d);
			rl_model_get(m2, m2->vh_w, RL_MODEL_PARAM, h0);
			rl_model_get(m2, m2->lnf_w, RL_MODEL_PARAM, n0);
			T_EQ_INT(rl_model_step(m2, &ad, g), 0);
			rl_model_get(m2, m2->vh_w, RL_MODEL_PARAM, h1);
			rl_model_get(m2, m2->lnf_w, RL_MODEL_PARAM, n1);
			T_OK(memcmp(n0, n1, sizeof(float) * C) == 0, "lr 0: trunk unchanged");
			T_OK(memcmp(h0, h1, sizeof(float) * C) != 0, "aux_lr: head moved");
			o->free(o, d);
		}
		rl_model_close(m2);
		m2 = NULL;
	}

	/* ---- bad value head files ---- */
	{
		int rv = 0;
		snprintf(dir, sizeof dir, "%s/bad", tmpd);
		mkdir(dir, 0755);
		write_head(dir, C + 1, 1);
		m2 = new_model(o, &cfg, 5);
		QUIET(rv = rl_model_add_value_head(m2, dir, 1));
		T_EQ_INT(rv, RL_ESHAPE);
		rl_model_close(m2);
		write_head(dir, C, 0);
		m2 = new_model(o, &cfg, 5);
		QUIET(rv = rl_model_add_value_head(m2, dir, 1));
		T_EQ_INT(rv, RL_ENOENT);
		rl_model_close(m2);
		write_head(dir, C, 1);
		m2 = new_model(o, &cfg, 5);
		T_EQ_INT(rl_model_add_value_head(m2, dir, 1), 0);
		float w[64];
		rl_model_get(m2, m2->vh_w, RL_MODEL_PARAM, w);
		T_OK(w[0] == 0 && w[C - 1] == 0, "loaded, not initialised");
		rl_model_close(m2);
		m2 = NULL;
	}
out:
	rl_model_close(m);
	rl_config_fini(&cfg);
	rl_ops_close(o);
	{
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf %s", tmpd);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", tmpd);
	}
	T_END();
}

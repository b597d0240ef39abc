/*
 * lora.c — LoRA adapters on a Llama-family model (lora.h): adding them to the
 * tensor table with PEFT's names and initialisation, their share of the
 * training forward and backward at the four places a layer's GEMMs write
 * (fused q|k|v, o_proj, fused gate|up, down_proj), dropout on their input,
 * switching them off for a forward of the base alone (a reference), and
 * merging them into the base weights.
 *
 * Leaves out: the base GEMMs (model_train.c), the frozen base's missing
 * gradients (GT in model_int.h), checkpoints (ckpt.c), the CUDA backend: the
 * adapter's GEMMs go through ops->matmul_*, but its output lands in a column
 * slice of a fused GEMM's output, which is added here by host loops.
 */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/io.h"
#include "base/rng.h"
#include "model/model_int.h"
#include "model/safetensors.h"

static const char *const mod_names[RL_LORA_NMOD] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
};

const char *
rl_lora_module_name(int k)
{
	return k >= 0 && k < RL_LORA_NMOD ? mod_names[k] : "?";
}

int
rl_lora_targets_parse(const char *list, unsigned *mask)
{
	const char *p = list;

	*mask = 0;
	if (list == NULL || *list == 0) {
		rl_error("LoRA targets: empty list (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear)");
		return RL_EINVAL;
	}
	while (*p) {
		size_t n = strcspn(p, ",");
		int k = -1;
		for (int j = 0; j < RL_LORA_NMOD; j++)
			if (strlen(mod_names[j]) == n && strncmp(p, mod_names[j], n) == 0)
				k = j;
		if (k >= 0)
			*mask |= 1u << k;
		else if (n == 10 && strncmp(p, "all-linear", n) == 0)
			*mask |= RL_LORA_ALL;
		else {
			rl_error("LoRA targets: '%.*s' is not a module (q_proj, k_proj, v_proj, o_proj, gate_proj, "
			    "up_proj, down_proj, or all-linear)", (int)n, p);
			return RL_EINVAL;
		}
		p += n;
		if (*p == ',')
			p++;
	}
	return RL_OK;
}

/* Module k of a layer: its input and output widths, the column its output starts at
 * in the fused GEMM's output, and that output's row width. */
static void
geom(const rl_config *c, int k, int *in, int *out, int *col, int *ld)
{
	const int C = c->hidden_size, QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim;
	const int H = c->intermediate_size;
	switch (k) {
	case RL_LORA_Q: *in = C, *out = QD, *col = 0, *ld = QD + 2 * KD; break;
	case RL_LORA_K: *in = C, *out = KD, *col = QD, *ld = QD + 2 * KD; break;
	case RL_LORA_V: *in = C, *out = KD, *col = QD + KD, *ld = QD + 2 * KD; break;
	case RL_LORA_O: *in = QD, *out = C, *col = 0, *ld = C; break;
	case RL_LORA_GATE: *in = C, *out = H, *col = 0, *ld = 2 * H; break;
	case RL_LORA_UP: *in = C, *out = H, *col = H, *ld = 2 * H; break;
	default: *in = H, *out = C, *col = 0, *ld = C; break;
	}
}

/* The modules a site's GEMM covers: [k0, k1). */
static void
site_mods(int site, int *k0, int *k1)
{
	static const int r[4][2] = {
		[RLI_LORA_QKV] = { RL_LORA_Q, RL_LORA_V + 1 }, [RLI_LORA_O] = { RL_LORA_O, RL_LORA_O + 1 },
		[RLI_LORA_FC] = { RL_LORA_GATE, RL_LORA_UP + 1 }, [RLI_LORA_DOWN] = { RL_LORA_DOWN, RL_LORA_DOWN + 1 },
	};
	*k0 = r[site][0];
	*k1 = r[site][1];
}

/* The base tensor module k of layer l adapts. */
static int
base_index(const rl_model *m, int l, int k)
{
	const rl_layer_idx *y = &m->layer[l];
	switch (k) {
	case RL_LORA_Q: return y->qkv_w;
	case RL_LORA_K: return y->qkv_w + 1;
	case RL_LORA_V: return y->qkv_w + 2;
	case RL_LORA_O: return y->o_w;
	case RL_LORA_GATE: return y->fc_w;
	case RL_LORA_UP: return y->fc_w + 1;
	default: return y->proj_w;
	}
}

/* PEFT's name of an adapter matrix: "base_model.model." + the base module's path +
 * ".lora_A.weight" (or lora_B). */
static void
peft_name(char *buf, size_t n, const char *base, int b)
{
	size_t len = strlen(base);
	if (len > 7 && strcmp(base + len - 7, ".weight") == 0)
		len -= 7;
	snprintf(buf, n, "base_model.model.%.*s.lora_%c.weight", (int)len, base, b ? 'B' : 'A');
}

int
rl_model_add_lora(rl_model *m, const rl_lora_opts *lo)
{
	const rl_config *c = &m->cfg;
	const int L = c->n_layer;
	size_t old = m->tt.total, maxin = 0;
	float *buf = NULL;
	rl_lora *lr;
	int rv = RL_OK;

	if (m->cfg.arch != RL_ARCH_LLAMA) {
		rl_error("LoRA: only Llama-family models (Llama, Qwen2/3, Mistral); GPT-2's Conv1D layers are not supported");
		return RL_ENOTSUP;
	}
	if (m->cfg.gemma) {
		rl_error("LoRA: Gemma 3's layer (its sandwich norms and GELU-gated MLP) has no adapters yet; "
		    "train all of its weights instead");
		return RL_ENOTSUP;
	}
	if (m->ops->device >= 0 || m->ops->act_dtype != RL_F32) {
		rl_error("LoRA runs on the CPU backend only (--device cpu); backend '%s' is not supported",
		    m->ops->name);
		return RL_ENOTSUP;
	}
	if (m->lora != NULL || m->grads != NULL || m->act != NULL) {
		rl_error("LoRA: add the adapters once, before reserving training buffers");
		return RL_EINVAL;
	}
	if (lo->r < 1 || !(lo->alpha > 0) || !(lo->dropout >= 0 && lo->dropout < 1) || lo->targets == 0 ||
	    (lo->targets & ~RL_LORA_ALL)) {
		rl_error("LoRA: rank %d, alpha %g, dropout %g, targets 0x%x: want rank >= 1, alpha > 0, dropout in "
		    "[0, 1) and at least one target", lo->r, lo->alpha, lo->dropout, lo->targets);
		return RL_EINVAL;
	}
	if ((lr = rl_try_calloc(1, sizeof *lr, "LoRA")) == NULL)
		return RL_ENOMEM;
	if ((lr->ix = rl_try_calloc((size_t)L, sizeof *lr->ix, "LoRA table")) == NULL) {
		free(lr);
		return RL_ENOMEM;
	}
	lr->o = *lo;
	lr->scale = lo->alpha / (float)lo->r;
	for (int l = 0; l < L; l++)
		for (int k = 0; k < RL_LORA_NMOD; k++) {
			int in, out, col, ld;
			char name[RL_TT_NAME];
			lr->ix[l][k][0] = lr->ix[l][k][1] = -1;
			if (!(lo->targets & (1u << k)))
				continue;
			geom(c, k, &in, &out, &col, &ld);
			maxin = RL_MAX(maxin, (size_t)in * lo->r);
			peft_name(name, sizeof name, m->tt.t[base_index(m, l, k)].name, 0);
			lr->ix[l][k][0] = rl_ttable_add(&m->tt, name, RL_T_LORA | RL_T_DECAY, lo->r, in);
			peft_name(name, sizeof name, m->tt.t[base_index(m, l, k)].name, 1);
			lr->ix[l][k][1] = rl_ttable_add(&m->tt, name, RL_T_LORA | RL_T_DECAY, out, lo->r);
		}
	m->lora = lr;
	if ((rv = rli_model_grow_params(m, old)) != 0)
		return rv;
	if ((buf = rl_try_malloc(RL_MAX(maxin, (size_t)1) * sizeof *buf, "LoRA init")) == NULL)
		return RL_ENOMEM;
	/* PEFT: kaiming_uniform_(A, a=sqrt(5)), whose bound gain * sqrt(3 / fan_in) with
	 * gain sqrt(2 / (1 + 5)) is 1/sqrt(in); B stays zero (the table's new memory is) */
	for (int l = 0; l < L && rv == 0; l++)
		for (int k = 0; k < RL_LORA_NMOD && rv == 0; k++) {
			int ia = lr->ix[l][k][0];
			if (ia < 0)
				continue;
			const rl_tensor *t = &m->tt.t[ia];
			double bound = 1.0 / sqrt((double)t->shape[1]);
			uint64_t s = rl_rng_u64(lo->seed, (uint64_t)l * RL_LORA_NMOD + k);
			for (size_t i = 0; i < t->n; i++)
				buf[i] = (float)((2 * rl_rng_uniform(s, i) - 1) * bound);
			rv = rl_model_set(m, ia, buf);
		}
	free(buf);
	return rv;
}

const rl_lora_opts *
rl_model_lora(const rl_model *m)
{
	return m->lora ? &m->lora->o : NULL;
}

int
rl_model_lora_off(rl_model *m, int off)
{
	if (m->lora == NULL) {
		rl_error("model: no LoRA adapters to switch %s", off ? "off" : "on");
		return RL_EINVAL;
	}
	m->lora->off = off != 0;
	return RL_OK;
}

int
rl_model_lora_tensor(const rl_model *m, int l, int k, int b)
{
	if (m->lora == NULL || l < 0 || l >= m->cfg.n_layer || k < 0 || k >= RL_LORA_NMOD)
		return -1;
	return m->lora->ix[l][k][b ? 1 : 0];
}

void
rli_lora_free(rl_model *m)
{
	rl_lora *lr = m->lora;
	if (lr == NULL)
		return;
	free(lr->ix);
	free(lr->u);
	free(lr->du);
	free(lr->d);
	free(lr->xa);
	free(lr->xd);
	free(lr);
	m->lora = NULL;
}

int
rli_lora_reserve(rl_model *m, int N)
{
	rl_lora *lr = m->lora;
	const rl_config *c = &m->cfg;
	size_t r, w;

	if (lr == NULL || N <= lr->maxN)
		return RL_OK;
	r = (size_t)N * lr->o.r;
	w = (size_t)N * RL_MAX(RL_MAX(c->hidden_size, c->intermediate_size), qkv_dim(c));
	free(lr->u), free(lr->du), free(lr->d), free(lr->xa), free(lr->xd);
	lr->u = rl_try_malloc(r * sizeof(float), "LoRA scratch");
	lr->du = rl_try_malloc(r * sizeof(float), "LoRA scratch");
	lr->d = rl_try_malloc(w * sizeof(float), "LoRA scratch");
	lr->xa = rl_try_malloc(w * sizeof(float), "LoRA scratch");
	lr->xd = rl_try_malloc(w * sizeof(float), "LoRA scratch");
	if (!lr->u || !lr->du || !lr->d || !lr->xa || !lr->xd) {
		lr->maxN = 0;
		return RL_ENOMEM;
	}
	lr->maxN = N;
	return RL_OK;
}

/* out (N, in) = x with module k of layer l's dropout mask applied (x * keep / (1 - p));
 * the mask is a function of (seed, AdamW step, forward in that step, l, k, element),
 * so the backward, a recomputed forward and a resumed run draw the same one.  In place
 * allowed. */
static void
drop_mask(const rl_lora *lr, int l, int k, const float *x, float *out, int N, int in)
{
	const float p = lr->o.dropout, keep = 1.0f / (1.0f - p);
	uint64_t key = (uint64_t)(uint32_t)lr->pass_step << 32 | (uint32_t)lr->pass;
	uint64_t s = rl_rng_u64(rl_rng_u64(lr->o.seed ^ 0x6c6f7261ULL, key), (uint64_t)l * RL_LORA_NMOD + k);
	size_t n = (size_t)N * in;

	for (size_t i = 0; i < n; i++)
		out[i] = rl_rng_uniform(s, i) < p ? 0.0f : x[i] * keep;
}

void
rli_lora_fwd(rl_model *m, int l, int site, const void *x, void *out, int N)
{
	rl_lora *lr = m->lora;
	rl_ops *o = m->ops;
	int k0, k1;

	if (lr->off)
		return;
	site_mods(site, &k0, &k1);
	for (int k = k0; k < k1; k++) {
		int ia = lr->ix[l][k][0], ib = lr->ix[l][k][1], in, od, col, ld;
		const float *xin = x;
		if (ia < 0)
			continue;
		geom(&m->cfg, k, &in, &od, &col, &ld);
		if (lr->drop) {
			drop_mask(lr, l, k, x, lr->xd, N, in);
			xin = lr->xd;
		}
		o->matmul_fwd(o, lr->u, xin, W(m, ia), NULL, N, in, lr->o.r);
		o->matmul_fwd(o, lr->d, lr->u, W(m, ib), NULL, N, lr->o.r, od);
		/* PEFT: result + lora_B(lora_A(dropout(x))) * scaling */
		for (int n = 0; n < N; n++) {
			float *y = (float *)out + (size_t)n * ld + col;
			const float *d = lr->d + (size_t)n * od;
			for (int j = 0; j < od; j++)
				y[j] += d[j] * lr->scale;
		}
	}
}

void
rli_lora_bwd(rl_model *m, int l, int site, const void *x, const void *dout, void *dx, int N)
{
	rl_lora *lr = m->lora;
	rl_ops *o = m->ops;
	const int r = lr->o.r;
	int k0, k1;

	site_mods(site, &k0, &k1);
	for (int k = k0; k < k1; k++) {
		int ia = lr->ix[l][k][0], ib = lr->ix[l][k][1], in, od, col, ld;
		const float *xin = x;
		if (ia < 0)
			continue;
		geom(&m->cfg, k, &in, &od, &col, &ld);
		for (int n = 0; n < N; n++) {
			const float *g = (const float *)dout + (size_t)n * ld + col;
			float *d = lr->d + (size_t)n * od;
			for (int j = 0; j < od; j++)
				d[j] = g[j] * lr->scale;
		}
		if (lr->drop) {
			drop_mask(lr, l, k, x, lr->xd, N, in);
			xin = lr->xd;
		}
		/* u = A x again (r columns: cheaper than keeping it per layer) */
		o->matmul_fwd(o, lr->u, xin, W(m, ia), NULL, N, in, r);
		o->matmul_bwd(o, lr->du, G(m, ib), NULL, lr->d, lr->u, W(m, ib), N, r, od);
		o->matmul_bwd(o, lr->xa, G(m, ia), NULL, lr->du, xin, W(m, ia), N, in, r);
		if (lr->drop)
			drop_mask(lr, l, k, lr->xa, lr->xa, N, in);
		float *dxf = dx;
		for (size_t i = 0; i < (size_t)N * in; i++)
			dxf[i] += lr->xa[i];
	}
}

/* W (out, in) of tensor iw += scale * B (out, r) A (r, in), the sum in double; w is
 * scratch of W's size. */
static int
fold(rl_model *m, int iw, const float *a, const float *b, int r, int in, int od, float scale, float *w)
{
	int rv;

	if ((rv = rl_model_get(m, iw, RL_MODEL_PARAM, w)) != 0)
		return rv;
	for (int i = 0; i < od; i++)
		for (int j = 0; j < in; j++) {
			double s = 0;
			for (int q = 0; q < r; q++)
				s += (double)b[(size_t)i * r + q] * a[(size_t)q * in + j];
			w[(size_t)i * in + j] += (float)(s * scale);
		}
	return rl_model_set(m, iw, w);
}

/* Largest tensor of m's table, in elements. */
static size_t
max_tensor(const rl_model *m)
{
	size_t n = 1;
	for (int i = 0; i < m->tt.n; i++)
		n = RL_MAX(n, m->tt.t[i].n);
	return n;
}

int
rl_model_lora_merge(rl_model *m)
{
	rl_lora *lr = m->lora;
	float *w = NULL, *a = NULL, *b = NULL;
	size_t maxw;
	int rv = RL_OK;

	if (lr == NULL)
		return RL_OK;
	maxw = max_tensor(m);
	if ((w = rl_try_malloc(maxw * sizeof *w, "LoRA merge")) == NULL ||
	    (a = rl_try_malloc(maxw * sizeof *a, "LoRA merge")) == NULL ||
	    (b = rl_try_malloc(maxw * sizeof *b, "LoRA merge")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int l = 0; l < m->cfg.n_layer; l++)
		for (int k = 0; k < RL_LORA_NMOD; k++) {
			int ia = lr->ix[l][k][0], ib = lr->ix[l][k][1];
			int in, od, col, ld;
			if (ia < 0)
				continue;
			geom(&m->cfg, k, &in, &od, &col, &ld);
			if ((rv = rl_model_get(m, ia, RL_MODEL_PARAM, a)) != 0 ||
			    (rv = rl_model_get(m, ib, RL_MODEL_PARAM, b)) != 0 ||
			    (rv = fold(m, base_index(m, l, k), a, b, lr->o.r, in, od, lr->scale, w)) != 0)
				goto out;
			memset(b, 0, (size_t)od * lr->o.r * sizeof *b);
			if ((rv = rl_model_set(m, ib, b)) != 0)
				goto out;
		}
	rli_lora_free(m); /* the tensors stay in the table (B zero), outside the model's files */
out:
	free(w);
	free(a);
	free(b);
	return rv;
}

/* Tensor name of f, of shape (d0, d1), into buf as f32; missing, misshapen, not float or
 * not finite: an error naming the file and the tensor. */
static int
read_factor(const rl_st_file *f, const char *name, int64_t d0, int64_t d1, float *buf)
{
	const rl_st_tensor *st = rl_st_find(f, name);
	int rv;

	if (st == NULL) {
		rl_error("'%s': no tensor '%s' (the adapter's config names its module)", f->path, name);
		return RL_ENOENT;
	}
	if (st->ndim != 2 || st->shape[0] != d0 || st->shape[1] != d1) {
		rl_error("'%s': tensor '%s' has %d dimensions [%lld, %lld], want [%lld, %lld]", f->path, name, st->ndim,
		    (long long)st->shape[0], (long long)(st->ndim > 1 ? st->shape[1] : 0), (long long)d0,
		    (long long)d1);
		return RL_ESHAPE;
	}
	if ((rv = rl_st_to_f32(buf, st, 0, st->nelem)) != 0) {
		rl_error("'%s': tensor '%s' has dtype %s, not a float type", f->path, name, rl_dtype_name(st->dtype));
		return rv;
	}
	return rl_check_finite(buf, st->nelem, f->path, name);
}

int
rl_model_apply_adapter(rl_model *m, const char *dir)
{
	size_t n = strlen(dir) + sizeof RL_LORA_WEIGHTS_FILE + 2, maxw;
	char *path = rl_xmalloc(n), name[RL_TT_NAME];
	float *w = NULL, *a = NULL, *b = NULL;
	rl_st_file *f = NULL;
	rl_lora_opts lo;
	int rv, used = 0;

	snprintf(path, n, "%s/%s", dir, RL_LORA_WEIGHTS_FILE);
	if ((rv = rl_lora_config_read(dir, &lo, NULL)) != 0)
		goto out;
	if (m->cfg.arch != RL_ARCH_LLAMA || m->lora != NULL) {
		rl_error("'%s': %s", dir, m->lora ? "the model has adapters of its own" :
		    "LoRA adapters are for Llama-family models; GPT-2's Conv1D layers are not supported");
		rv = RL_ENOTSUP;
		goto out;
	}
	if ((rv = rl_st_open(&f, path)) != 0)
		goto out;
	maxw = max_tensor(m);
	if ((w = rl_try_malloc(maxw * sizeof *w, "adapter")) == NULL ||
	    (a = rl_try_malloc(maxw * sizeof *a, "adapter")) == NULL ||
	    (b = rl_try_malloc(maxw * sizeof *b, "adapter")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int l = 0; l < m->cfg.n_layer; l++)
		for (int k = 0; k < RL_LORA_NMOD; k++) {
			int in, od, col, ld, iw = base_index(m, l, k);
			if (!(lo.targets & (1u << k)))
				continue;
			geom(&m->cfg, k, &in, &od, &col, &ld);
			if ((size_t)lo.r * RL_MAX(in, od) > maxw) {
				rl_error("'%s': rank %d is larger than the model's matrices", path, lo.r);
				rv = RL_ESHAPE;
				goto out;
			}
			peft_name(name, sizeof name, m->tt.t[iw].name, 0);
			if ((rv = read_factor(f, name, lo.r, in, a)) != 0)
				goto out;
			peft_name(name, sizeof name, m->tt.t[iw].name, 1);
			if ((rv = read_factor(f, name, od, lo.r, b)) != 0 ||
			    (rv = fold(m, iw, a, b, lo.r, in, od, lo.alpha / (float)lo.r, w)) != 0)
				goto out;
			used += 2;
		}
	if (f->n != used) {
		rl_error("'%s': %d tensors, but the adapter's config implies %d (a module or layer it does not name?)",
		    path, f->n, used);
		rv = RL_EINVAL;
		goto out;
	}
	rl_verbose("adapter '%s' (rank %d, alpha %g) merged into the model", dir, lo.r, lo.alpha);
out:
	free(w);
	free(a);
	free(b);
	free(path);
	rl_st_close(f);
	return rv;
}

char *
rl_lora_config_json(const rl_model *m)
{
	const rl_lora *lr = m->lora;
	cJSON *root, *tm;
	char *js;

	if (lr == NULL)
		return NULL;
	root = cJSON_CreateObject();
	/* PEFT's LoraConfig keys; the ones without a counterpart here at its defaults */
	cJSON_AddObjectToObject(root, "alpha_pattern");
	cJSON_AddNullToObject(root, "auto_mapping");
	if (m->src_dir != NULL)
		cJSON_AddStringToObject(root, "base_model_name_or_path", m->src_dir);
	else
		cJSON_AddNullToObject(root, "base_model_name_or_path");
	cJSON_AddStringToObject(root, "bias", "none");
	cJSON_AddNullToObject(root, "exclude_modules");
	cJSON_AddFalseToObject(root, "fan_in_fan_out");
	cJSON_AddTrueToObject(root, "inference_mode");
	cJSON_AddTrueToObject(root, "init_lora_weights");
	cJSON_AddNullToObject(root, "layers_pattern");
	cJSON_AddNullToObject(root, "layers_to_transform");
	cJSON_AddNumberToObject(root, "lora_alpha", lr->o.alpha);
	cJSON_AddFalseToObject(root, "lora_bias");
	cJSON_AddNumberToObject(root, "lora_dropout", lr->o.dropout);
	cJSON_AddNullToObject(root, "modules_to_save");
	cJSON_AddStringToObject(root, "peft_type", "LORA");
	cJSON_AddNumberToObject(root, "r", lr->o.r);
	cJSON_AddObjectToObject(root, "rank_pattern");
	cJSON_AddNullToObject(root, "revision");
	tm = cJSON_AddArrayToObject(root, "target_modules");
	for (int k = 0; k < RL_LORA_NMOD; k++)
		if (lr->o.targets & (1u << k))
			cJSON_AddItemToArray(tm, cJSON_CreateString(mod_names[k]));
	cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM");
	cJSON_AddFalseToObject(root, "use_dora");
	cJSON_AddFalseToObject(root, "use_rslora");
	js = cJSON_Print(root);
	cJSON_Delete(root);
	return js;
}

/* RL_EFORMAT naming path and key unless key is absent, null, or a JSON boolean false
 * (want_false) / an empty object (!want_false). */
static int
cfg_default(const char *path, const cJSON *root, const char *key, int want_false)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
	if (v == NULL || cJSON_IsNull(v) || (want_false && cJSON_IsFalse(v)) ||
	    (!want_false && cJSON_IsObject(v) && v->child == NULL))
		return RL_OK;
	rl_error("'%s': \"%s\" is set; LoRA here supports only %s", path, key,
	    want_false ? "false" : "an empty object (one rank and alpha for every module)");
	return RL_EFORMAT;
}

int
rl_lora_config_read(const char *dir, rl_lora_opts *lo, char **base)
{
	size_t n = strlen(dir) + sizeof RL_LORA_CONFIG_FILE + 2, len = 0;
	char *path = rl_xmalloc(n), *text = NULL;
	cJSON *root = NULL;
	const cJSON *v;
	int rv;

	snprintf(path, n, "%s/%s", dir, RL_LORA_CONFIG_FILE);
	memset(lo, 0, sizeof *lo);
	if (base != NULL)
		*base = NULL;
	if ((rv = rl_io_read_file(path, (size_t)1 << 20, &text, &len)) != 0) {
		rl_error("cannot read '%s': %s", path, rl_strerror(rv));
		goto out;
	}
	rv = RL_EFORMAT;
	if ((root = cJSON_ParseWithLength(text, len)) == NULL || !cJSON_IsObject(root)) {
		rl_error("'%s': not a JSON object", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
	if (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA") != 0) {
		rl_error("'%s': \"peft_type\" is %s, not \"LORA\"", path, cJSON_IsString(v) ? v->valuestring : "missing");
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "r");
	if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != (int)v->valuedouble) {
		rl_error("'%s': \"r\" is not a positive integer", path);
		goto out;
	}
	lo->r = v->valueint;
	v = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
	lo->alpha = cJSON_IsNumber(v) ? (float)v->valuedouble : 8.0f; /* PEFT's default */
	if (!(lo->alpha > 0)) {
		rl_error("'%s': \"lora_alpha\" is not a positive number", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
	lo->dropout = cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
	if (!(lo->dropout >= 0 && lo->dropout < 1)) {
		rl_error("'%s': \"lora_dropout\" is not in [0, 1)", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "bias");
	if (v != NULL && !cJSON_IsNull(v) && (!cJSON_IsString(v) || strcmp(v->valuestring, "none") != 0)) {
		rl_error("'%s': \"bias\" is not \"none\"; adapters with biases are not supported", path);
		goto out;
	}
	if (cfg_default(path, root, "use_dora", 1) || cfg_default(path, root, "use_rslora", 1) ||
	    cfg_default(path, root, "fan_in_fan_out", 1) || cfg_default(path, root, "lora_bias", 1) ||
	    cfg_default(path, root, "rank_pattern", 0) || cfg_default(path, root, "alpha_pattern", 0))
		goto out;
	v = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
	if (cJSON_IsString(v)) {
		if ((rv = rl_lora_targets_parse(v->valuestring, &lo->targets)) != 0) {
			rl_error("'%s': \"target_modules\"", path);
			goto out;
		}
		rv = RL_EFORMAT;
	} else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
		const cJSON *e;
		cJSON_ArrayForEach(e, v) {
			unsigned k = 0;
			if (!cJSON_IsString(e) || rl_lora_targets_parse(e->valuestring, &k) != 0) {
				rl_error("'%s': \"target_modules\" holds an entry that is not one of lora.h's modules", path);
				goto out;
			}
			lo->targets |= k;
		}
	} else {
		rl_error("'%s': \"target_modules\" is not a list of module names", path);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
	if (base != NULL && cJSON_IsString(v))
		*base = rl_xstrdup(v->valuestring);
	rv = RL_OK;
out:
	cJSON_Delete(root);
	free(text);
	free(path);
	return rv;
}

int
rl_model_lora_load(rl_model *m, const char *dir)
{
	size_t n = strlen(dir) + sizeof RL_LORA_WEIGHTS_FILE + 2, maxn = 0;
	char *path = rl_xmalloc(n);
	rl_st_file *f = NULL;
	float *buf = NULL;
	int rv, want = 0;

	snprintf(path, n, "%s/%s", dir, RL_LORA_WEIGHTS_FILE);
	if (m->lora == NULL) {
		rl_error("'%s': the model has no adapters to load into", path);
		rv = RL_EINVAL;
		goto out;
	}
	if ((rv = rl_st_open(&f, path)) != 0)
		goto out;
	for (int i = 0; i < m->tt.n; i++)
		if (m->tt.t[i].flags & RL_T_LORA) {
			maxn = RL_MAX(maxn, m->tt.t[i].n);
			want++;
		}
	if ((buf = rl_try_malloc(RL_MAX(maxn, (size_t)1) * sizeof *buf, "adapter")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		if (!(t->flags & RL_T_LORA))
			continue;
		if ((rv = read_factor(f, t->name, t->shape[0], t->shape[1], buf)) != 0 ||
		    (rv = rl_model_set(m, i, buf)) != 0)
			goto out;
	}
	if (f->n != want) {
		rl_error("'%s': %d tensors, but the adapter's config implies %d (a module or layer it does not name?)",
		    path, f->n, want);
		rv = RL_EINVAL;
	}
out:
	free(buf);
	free(path);
	rl_st_close(f);
	return rv;
}

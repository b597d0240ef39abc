/*
 * model.c — Llama-family (Gemma 3's layer in model_gemma.c) and GPT-2 decoders over
 * ops.h: the tensor table, the check of what the backend can compute,
 * loading a Hugging Face directory (whole, or checked first and then one
 * range of the flat table read: a ZeRO-3 rank's shard), random init, host
 * access to the weights, the value head, freeing, and the layer pieces
 * (norms, MLP up-projection) that training and inference both run.
 *
 * Leaves out: the training passes (model_train.c), the inference passes
 * (model_infer.c), saving (ckpt.c), the block allocator (kvcache.c).
 */
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "compute/ops_cpu.h"
#include "model/model_int.h"
#include "model/safetensors.h"

/* ---- the tensor table ------------------------------------------------------- */

static void
build_table(rl_model *m)
{
	const rl_config *c = &m->cfg;
	rl_ttable *tt = &m->tt;
	int C = c->hidden_size, V = c->vocab_size, H = c->intermediate_size;
	int QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, HD = c->head_dim;
	char n[RL_TT_NAME];
	const unsigned D = RL_T_DECAY, DT = RL_T_DECAY | RL_T_TRANSPOSE;

	m->layer = rl_xcalloc((size_t)c->n_layer, sizeof *m->layer);
	m->wpe = m->lnf_b = -1;
	m->vh_w = m->vh_b = -1;
#define ADD(flags, d0, d1, ...) (snprintf(n, sizeof n, __VA_ARGS__), rl_ttable_add(tt, n, flags, d0, d1))
	if (c->arch == RL_ARCH_GPT2) {
		m->wte = ADD(0, V, C, "transformer.wte.weight");
		m->wpe = ADD(0, c->max_pos, C, "transformer.wpe.weight");
		for (int l = 0; l < c->n_layer; l++) {
			rl_layer_idx *y = &m->layer[l];
			const char *p = "transformer.h";
			y->pa_w = y->pf_w = -1;
			y->ln1_w = ADD(0, C, 0, "%s.%d.ln_1.weight", p, l);
			y->ln1_b = ADD(0, C, 0, "%s.%d.ln_1.bias", p, l);
			y->qkv_w = ADD(DT, 3 * C, C, "%s.%d.attn.c_attn.weight", p, l);
			y->qkv_b = ADD(0, 3 * C, 0, "%s.%d.attn.c_attn.bias", p, l);
			y->qn_w = y->kn_w = -1;
			y->o_w = ADD(DT, C, C, "%s.%d.attn.c_proj.weight", p, l);
			y->o_b = ADD(0, C, 0, "%s.%d.attn.c_proj.bias", p, l);
			y->ln2_w = ADD(0, C, 0, "%s.%d.ln_2.weight", p, l);
			y->ln2_b = ADD(0, C, 0, "%s.%d.ln_2.bias", p, l);
			y->fc_w = ADD(DT, H, C, "%s.%d.mlp.c_fc.weight", p, l);
			y->fc_b = ADD(0, H, 0, "%s.%d.mlp.c_fc.bias", p, l);
			y->proj_w = ADD(DT, C, H, "%s.%d.mlp.c_proj.weight", p, l);
			y->proj_b = ADD(0, C, 0, "%s.%d.mlp.c_proj.bias", p, l);
		}
		m->lnf_w = ADD(0, C, 0, "transformer.ln_f.weight");
		m->lnf_b = ADD(0, C, 0, "transformer.ln_f.bias");
	} else {
		m->wte = ADD(0, V, C, "model.embed_tokens.weight");
		for (int l = 0; l < c->n_layer; l++) {
			rl_layer_idx *y = &m->layer[l];
			const char *p = "model.layers";
			y->pa_w = y->pf_w = -1;
			y->ln1_w = ADD(0, C, 0, "%s.%d.input_layernorm.weight", p, l);
			y->ln1_b = -1;
			y->qkv_w = ADD(D, QD, C, "%s.%d.self_attn.q_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, KD, C, "%s.%d.self_attn.k_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, KD, C, "%s.%d.self_attn.v_proj.weight", p, l);
			y->qkv_b = -1;
			if (c->qkv_bias) {
				y->qkv_b = ADD(0, QD, 0, "%s.%d.self_attn.q_proj.bias", p, l);
				ADD(RL_T_FOLLOWS, KD, 0, "%s.%d.self_attn.k_proj.bias", p, l);
				ADD(RL_T_FOLLOWS, KD, 0, "%s.%d.self_attn.v_proj.bias", p, l);
			}
			y->qn_w = y->kn_w = -1;
			if (c->qk_norm) {
				y->qn_w = ADD(0, HD, 0, "%s.%d.self_attn.q_norm.weight", p, l);
				y->kn_w = ADD(0, HD, 0, "%s.%d.self_attn.k_norm.weight", p, l);
			}
			y->o_w = ADD(D, C, QD, "%s.%d.self_attn.o_proj.weight", p, l);
			y->o_b = c->o_bias ? ADD(0, C, 0, "%s.%d.self_attn.o_proj.bias", p, l) : -1;
			/* Gemma 3's sandwich: a norm after attention, then one before and one after the MLP */
			if (c->gemma) {
				y->pa_w = ADD(0, C, 0, "%s.%d.post_attention_layernorm.weight", p, l);
				y->ln2_w = ADD(0, C, 0, "%s.%d.pre_feedforward_layernorm.weight", p, l);
			} else {
				y->ln2_w = ADD(0, C, 0, "%s.%d.post_attention_layernorm.weight", p, l);
			}
			y->ln2_b = -1;
			y->fc_w = ADD(D, H, C, "%s.%d.mlp.gate_proj.weight", p, l);
			ADD(D | RL_T_FOLLOWS, H, C, "%s.%d.mlp.up_proj.weight", p, l);
			y->fc_b = -1;
			y->proj_w = ADD(D, C, H, "%s.%d.mlp.down_proj.weight", p, l);
			y->proj_b = -1;
			if (c->gemma)
				y->pf_w = ADD(0, C, 0, "%s.%d.post_feedforward_layernorm.weight", p, l);
		}
		m->lnf_w = ADD(0, C, 0, "model.norm.weight");
	}
	/* a reward model has no lm_head: the embedding stands in for it, so the
	 * passes run unchanged (their log-probs unused) */
	m->lm_w = c->tie_embeddings || c->seq_cls ? m->wte : ADD(D, V, C, "lm_head.weight");
#undef ADD
}

size_t
rl_model_nparams(const rl_model *m)
{
	size_t n = 0;
	for (int i = 0; i < m->tt.n; i++)
		n += m->tt.t[i].n;
	return n;
}

void
rl_model_param_count(const rl_config *c, int value_head, size_t *n, size_t *slots)
{
	rl_model m = { 0 };

	m.cfg = *c;   /* borrowed: not finalised here */
	build_table(&m);
	if (value_head) {   /* as rl_model_add_value_head adds it */
		rl_ttable_add(&m.tt, "value_head.weight", RL_T_AUX, 1, c->hidden_size);
		rl_ttable_add(&m.tt, "value_head.bias", RL_T_AUX, 1, 0);
	}
	*n = rl_model_nparams(&m);
	*slots = m.tt.total;
	rl_ttable_fini(&m.tt);
	free(m.layer);
}

/* Tensor name of m's table in set: as named, or without GPT-2's "transformer.", or as
 * Gemma 3's multimodal checkpoints name the language model's "model.X": "model.language_model.X"
 * (transformers >= 4.52) or "language_model.model.X" (earlier). */
static const rl_st_tensor *
find_tensor(const rl_st_set *set, const char *name, const char **file)
{
	const rl_st_tensor *st = rl_st_set_find(set, name, file);
	char alt[RL_TT_NAME + 32];

	if (st == NULL && strncmp(name, "transformer.", 12) == 0)
		st = rl_st_set_find(set, name + 12, file);
	if (st == NULL && strncmp(name, "model.", 6) == 0) {
		snprintf(alt, sizeof alt, "model.language_model.%s", name + 6);
		if ((st = rl_st_set_find(set, alt, file)) == NULL) {
			snprintf(alt, sizeof alt, "language_model.%s", name);
			st = rl_st_set_find(set, alt, file);
		}
	}
	if (st == NULL && strcmp(name, "lm_head.weight") == 0)
		st = rl_st_set_find(set, "language_model.lm_head.weight", file);
	return st;
}

/* A tensor of a Gemma 3 multimodal checkpoint that the text model leaves out: the vision
 * tower and the projector into the text embeddings. */
static int
vision_tensor(const char *name)
{
	return strncmp(name, "vision_tower.", 13) == 0 || strncmp(name, "multi_modal_projector.", 22) == 0 ||
	    strncmp(name, "model.vision_tower.", 19) == 0 || strncmp(name, "model.multi_modal_projector.", 28) == 0;
}

/* Every tensor of m's table is in set with the shape config.json implies and a float
 * dtype.  Run before anything is allocated from the config: a config.json that does not
 * belong to the weights is then a shape error, whatever sizes it names, and what is
 * allocated afterwards is bounded by the files' sizes. */
static int
check_files(const rl_model *m, const rl_st_set *set, const char *dir)
{
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		const char *file = NULL, *name = t->name;
		const rl_st_tensor *st = find_tensor(set, name, &file);
		int64_t shp[2];
		int nd = rl_tensor_file_shape(t, shp);

		if (st == NULL) {
			rl_error("'%s': no tensor '%s' in %s", dir, name,
			    set->nfiles > 1 ? "its shards" : "model.safetensors");
			return RL_ENOENT;
		}
		if (st->ndim != nd || st->shape[0] != shp[0] || (nd == 2 && st->shape[1] != shp[1])) {
			char got[64] = "", want[64];
			for (int d = 0; d < st->ndim && strlen(got) < 40; d++)
				snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
				    (long long)st->shape[d]);
			if (nd == 2)
				snprintf(want, sizeof want, "%lld, %lld", (long long)shp[0], (long long)shp[1]);
			else
				snprintf(want, sizeof want, "%lld", (long long)shp[0]);
			rl_error("'%s': tensor '%s' has shape [%s], config.json implies [%s]", file, st->name,
			    got, want);
			return RL_ESHAPE;
		}
		if (st->dtype != RL_F32 && st->dtype != RL_BF16 && st->dtype != RL_F16 && st->dtype != RL_F64) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", file, st->name,
			    rl_dtype_name(st->dtype));
			return RL_ESHAPE;
		}
	}
	return RL_OK;
}

/* The number of layers bounds the table build_table makes: no more than the files hold
 * tensors (each layer has several), checked before the table is built. */
static int
check_layers(const rl_config *cfg, const rl_st_set *set, const char *dir)
{
	size_t total = 0;

	for (int f = 0; f < set->nfiles; f++)
		total += (size_t)set->files[f]->n;
	if ((size_t)cfg->n_layer <= total)
		return RL_OK;
	rl_error("'%s/config.json': \"%s\" is %d, but the model's safetensors files (%s) hold %zu tensors in all",
	    dir, cfg->arch == RL_ARCH_GPT2 ? "n_layer" : "num_hidden_layers", cfg->n_layer,
	    set->files[0]->path, total);
	rl_hint("config.json does not belong to these weights");
	return RL_ESHAPE;
}

/* What the backend's ops cannot compute.  Gemma 3 needs ops the CUDA kernels lack: refused
 * there, naming them.  Mistral's window is computed on the CPU only; elsewhere the context
 * is capped at the window, where it does not bind yet, as the CUDA kernels compute it. */
static int
check_backend(rl_model *m, const char *dir)
{
	rl_config *c = &m->cfg;

	m->cpu = strcmp(m->ops->name, "cpu") == 0;
	if (m->cpu && c->gemma && (m->gw1 = rl_try_malloc(((size_t)c->hidden_size + 2 * (size_t)c->head_dim) *
	    sizeof(float), "Gemma norm scratch")) == NULL)
		return RL_ENOMEM;
	if (m->cpu)
		return RL_OK;
	if (c->gemma) {
		rl_error("%s: Gemma 3 is not supported on the '%s' backend: its kernels lack the (1 + w) "
		    "RMSNorm, the GELU-gated MLP, the query_pre_attn_scalar scale and sliding-window attention",
		    dir ? dir : "model", m->ops->name);
		rl_hint("run it with --device cpu");
		return RL_ENOTSUP;
	}
	if (c->sliding_window > 0 && c->max_pos > c->sliding_window) {
		rl_warn("%s: the '%s' backend has no sliding-window attention: the context is capped at "
		    "sliding_window (%d positions, not %d)", dir ? dir : "model", m->ops->name, c->sliding_window,
		    c->max_pos);
		c->max_pos = c->sliding_window;
	}
	return RL_OK;
}

/* A model of cfg with zeroed weights (part: not written, rl_model_open_part); with set
 * (loading dir), its tensors are checked against the files' headers first (check_files). */
static int
model_new(rl_model **out, const rl_config *cfg, rl_ops *ops, const rl_st_set *set, const char *dir, int part)
{
	rl_model *m;
	size_t bytes = 0;
	int rv;

	*out = NULL;
	if (set != NULL && (rv = check_layers(cfg, set, dir)) != 0)
		return rv;
	m = rl_xcalloc(1, sizeof *m);
	rl_config_copy(&m->cfg, cfg);
	m->ops = ops;
	build_table(m);
	if ((rv = check_backend(m, dir)) != 0)
		goto fail;
	if (set != NULL && (rv = check_files(m, set, dir)) != 0)
		goto fail;
	if ((rv = rl_mul_size(&bytes, m->tt.total, sizeof(float))) != 0 ||
	    (rv = ops->alloc(ops, (void **)&m->params, bytes)) != 0)
		goto fail;
	/* part: each rank writes its own range later; the rest stays untouched */
	if (!part || ops->act_dtype != RL_F32)
		ops->zero(ops, m->params, bytes);
	if (ops->act_dtype == RL_F32) {
		m->w = m->params;
	} else {
		bytes = m->tt.total * asz(m);
		if ((rv = ops->alloc(ops, &m->w, bytes)) != 0)
			goto fail;
		ops->zero(ops, m->w, bytes);
	}
	*out = m;
	return RL_OK;
fail:
	if (rv == RL_ENOMEM || rv == RL_ETOOBIG) {
		int big = 0;
		for (int i = 1; i < m->tt.n; i++)
			if (m->tt.t[i].n > m->tt.t[big].n)
				big = i;
		rl_error("%s%s%s: cannot allocate %zu bytes for the %zu parameters of its %d tensors "
		    "(the largest '%s', %zu elements)", set ? "'" : "", set ? set->files[0]->path : "model",
		    set ? "'" : "", bytes, m->tt.total, m->tt.n, m->tt.t[big].name, m->tt.t[big].n);
	}
	rl_model_close(m);
	return rv;
}

void
rli_model_free_act(rl_model *m)
{
	rl_model_act *a = m->act;
	if (a == NULL)
		return;
	m->ops->free(m->ops, a->amem);
	m->ops->free(m->ops, a->fmem);
	m->ops->free(m->ops, a->imem);
	free(a->hpos);
	free(a);
	m->act = NULL;
	m->lp = m->ent = m->val = NULL;
}

void
rli_model_free_inf(rl_model *m)
{
	rl_model_inf *f = m->inf;
	if (f == NULL)
		return;
	m->ops->free(m->ops, f->amem);
	m->ops->free(m->ops, f->fmem);
	m->ops->free(m->ops, f->imem);
	m->ops->free(m->ops, f->bt);
	for (int i = 0; i < f->ngraph; i++)
		if (f->graphs[i].g)
			m->ops->graph_destroy(m->ops, f->graphs[i].g);
	free(f->graphs);
	m->ops->free(m->ops, f->dstep);
	if (m->ops->host_free) {
		m->ops->host_free(m->ops, f->hstep);
		m->ops->host_free(m->ops, f->hmulti);
	} else {
		free(f->hstep);
		free(f->hmulti);
	}
	free(f->htok);
	free(f->hbt);
	free(f->hlogits);
	free(f->steplay);
	free(f);
	m->inf = NULL;
	m->logits = NULL;
}

void
rl_model_close(rl_model *m)
{
	if (m == NULL)
		return;
	rli_model_free_act(m);
	rli_model_free_inf(m);
	rli_lora_free(m);
	if (m->w != m->params)
		m->ops->free(m->ops, m->w);
	m->ops->free(m->ops, m->params);
	m->ops->free(m->ops, m->grads);
	m->ops->free(m->ops, m->gsink);
	m->ops->free(m->ops, m->m);
	m->ops->free(m->ops, m->v);
	rl_ttable_fini(&m->tt);
	free(m->layer);
	free(m->gw1);
	free(m->src_dir);
	rl_st_set_close(m->part_set);
	free(m->part_master);
	rl_config_fini(&m->cfg);
	free(m);
}

/* ---- host access ---------------------------------------------------------------- */

/* dst[c][r] = src[r][c] for src [R, C] (row-major), in 32 x 32 tiles so
 * both sides stay in cache (a plain double loop writes with stride R: ~5x
 * slower on GPT-2's [768, 2304] weights). */
static void
transpose(float *dst, const float *src, size_t R, size_t C)
{
	enum { TB = 32 };
#pragma omp parallel for schedule(static) if (R * C > ((size_t)1 << 18))
	for (size_t r0 = 0; r0 < R; r0 += TB)
		for (size_t c0 = 0; c0 < C; c0 += TB) {
			size_t r1 = RL_MIN(r0 + TB, R), c1 = RL_MIN(c0 + TB, C);
			for (size_t r = r0; r < r1; r++)
				for (size_t c = c0; c < c1; c++)
					dst[c * R + r] = src[r * C + c];
		}
}

int
rl_model_get(rl_model *m, int i, int kind, float *out)
{
	const rl_tensor *t = &m->tt.t[i];
	const float *src = kind == RL_MODEL_PARAM ? m->params : kind == RL_MODEL_GRAD ? m->grads :
	    kind == RL_MODEL_ADAM_M ? m->m : m->v;
	float *tmp;

	if (src == NULL)
		return RL_EINVAL;
	if (kind != RL_MODEL_PARAM) {
		/* gradients and moments start at table element goff; the frozen have none */
		if (t->off < m->goff) {
			memset(out, 0, t->n * sizeof(float));
			return RL_OK;
		}
		src -= m->goff;
	}
	if (!(t->flags & RL_T_TRANSPOSE)) {
		m->ops->download(m->ops, out, src + t->off, t->n * sizeof(float));
		return check_ops(m, "download");
	}
	if ((tmp = rl_try_malloc(t->n * sizeof(float), t->name)) == NULL)
		return RL_ENOMEM;
	m->ops->download(m->ops, tmp, src + t->off, t->n * sizeof(float));
	transpose(out, tmp, (size_t)t->shape[0], (size_t)t->shape[1]);
	free(tmp);
	return check_ops(m, "download");
}

int
rl_model_set(rl_model *m, int i, const float *in)
{
	const rl_tensor *t = &m->tt.t[i];
	float *tmp = NULL;
	const float *src = in;

	if (t->flags & RL_T_TRANSPOSE) {
		if ((tmp = rl_try_malloc(t->n * sizeof(float), t->name)) == NULL)
			return RL_ENOMEM;
		transpose(tmp, in, (size_t)t->shape[1], (size_t)t->shape[0]);
		src = tmp;
	}
	m->ops->upload(m->ops, m->params + t->off, src, t->n * sizeof(float));
	if (m->w != m->params)
		m->ops->cast(m->ops, W(m, i), m->ops->act_dtype, m->params + t->off, RL_F32, t->n);
	free(tmp);
	return check_ops(m, "upload");
}

int
rl_model_params_changed(rl_model *m)
{
	if (m->w != m->params)
		m->ops->cast(m->ops, m->w, m->ops->act_dtype, m->params, RL_F32, m->tt.total);
	return check_ops(m, "weights refresh");
}

/* ---- random init ------------------------------------------------------------------- */

static int init_score(rl_model *m, uint64_t seed);

int
rl_model_init_random(rl_model **out, const rl_config *cfg, rl_ops *ops, uint64_t seed)
{
	rl_model *m = NULL;
	float *buf = NULL;
	size_t maxn = 0;
	int rv;

	*out = NULL;
	if ((rv = rl_config_check(cfg, "config")) != 0 || (rv = model_new(&m, cfg, ops, NULL, NULL, 0)) != 0)
		return rv;
	for (int i = 0; i < m->tt.n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if ((buf = rl_try_malloc(maxn * sizeof(float), "init buffer")) == NULL) {
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		size_t len = strlen(t->name);
		int is_bias = len > 5 && strcmp(t->name + len - 5, ".bias") == 0;
		double std = 0.02;
		if (cfg->arch == RL_ARCH_GPT2 && strstr(t->name, "c_proj.weight") != NULL)
			std = 0.02 / sqrt(2.0 * cfg->n_layer);
		/* counter-based: the same values whatever the thread count */
#pragma omp parallel for schedule(static) if (t->n > ((size_t)1 << 16))
		for (size_t j = 0; j < t->n; j++) {
			if (t->ndim == 1) {
				/* Gemma's norms scale by 1 + w: w = 0 is the identity */
				buf[j] = is_bias || cfg->gemma ? 0.0f : 1.0f;
			} else {
				/* Box-Muller on counters keyed by the element's offset: the same
				 * values for a given seed whatever the backend. */
				uint64_t k = 2 * (uint64_t)(t->off + j);
				double u1 = rl_rng_uniform(seed, k), u2 = rl_rng_uniform(seed, k + 1);
				buf[j] = (float)(std * sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2));
			}
		}
		if ((rv = rl_model_set(m, i, buf)) != 0)
			goto out;
	}
	if (cfg->seq_cls && (rv = init_score(m, seed)) != 0)
		goto out;
	*out = m;
	m = NULL;
out:
	free(buf);
	rl_model_close(m);
	return rv;
}

/* ---- value head ---------------------------------------------------------------------- */

/* Moves buffer *p of old_n elements of esz bytes into a new zeroed one of new_n (a
 * model still to be read by rl_model_load_range: only the new elements zeroed and
 * LoRA adapters set already copied, the base's pages untouched). */
static int
grow_buf(rl_model *m, void **p, size_t old_n, size_t new_n, size_t esz)
{
	rl_ops *o = m->ops;
	void *np = NULL;
	size_t set = old_n;
	int rv;

	if ((rv = o->alloc(o, &np, new_n * esz)) != 0)
		return rv;
	if (m->part_set != NULL) {
		/* nothing of the base read yet (rl_model_open_part); the adapters
		 * (after it, never in a range read) are */
		for (int i = 0; i < m->tt.n; i++)
			if ((m->tt.t[i].flags & RL_T_LORA) && m->tt.t[i].off < set)
				set = m->tt.t[i].off;
		o->copy(o, (char *)np + set * esz, (char *)*p + set * esz, (old_n - set) * esz);
		o->zero(o, (char *)np + old_n * esz, (new_n - old_n) * esz);
	} else {
		o->zero(o, np, new_n * esz);
		o->copy(o, np, *p, old_n * esz);
	}
	o->free(o, *p);
	*p = np;
	return check_ops(m, "value head");
}

int
rli_model_grow_params(rl_model *m, size_t old_n)
{
	int rv;

	if (m->w != m->params && (rv = grow_buf(m, &m->w, old_n, m->tt.total, asz(m))) != 0)
		return rv;
	if ((rv = grow_buf(m, (void **)&m->params, old_n, m->tt.total, sizeof(float))) != 0)
		return rv;
	if (m->ops->act_dtype == RL_F32)
		m->w = m->params;
	return RL_OK;
}

/* Reads the head from path into buf (C + 1): weight then bias. */
static int
load_value_head(rl_model *m, const char *path, float *buf)
{
	const int64_t C = m->cfg.hidden_size;
	rl_st_file *f = NULL;
	int rv;

	if ((rv = rl_st_open(&f, path)) != 0)
		return rv;
	for (int k = 0; k < 2; k++) {
		const char *name = k == 0 ? "value_head.weight" : "value_head.bias";
		const rl_st_tensor *t = rl_st_find(f, name);
		int ok;
		if (t == NULL) {
			rl_error("'%s': no tensor '%s'", path, name);
			rv = RL_ENOENT;
			goto out;
		}
		ok = k == 0 ? t->ndim == 2 && t->shape[0] == 1 && t->shape[1] == C :
		    t->ndim == 1 && t->shape[0] == 1;
		if (!ok) {
			char got[64] = "";
			for (int d = 0; d < t->ndim && strlen(got) < 40; d++)
				snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
				    (long long)t->shape[d]);
			rl_error("'%s': tensor '%s' has shape [%s], the model's hidden_size implies [%s%lld]",
			    path, name, got, k == 0 ? "1, " : "", k == 0 ? (long long)C : 1LL);
			rl_hint("the value head belongs to another model; remove '%s' to start a new one", path);
			rv = RL_ESHAPE;
			goto out;
		}
		if ((rv = rl_st_to_f32(buf + (k ? C : 0), t, 0, t->nelem)) != 0) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", path, name,
			    rl_dtype_name(t->dtype));
			goto out;
		}
	}
out:
	rl_st_close(f);
	return rv;
}

int
rl_model_add_value_head(rl_model *m, const char *dir, uint64_t seed)
{
	const int C = m->cfg.hidden_size;
	size_t old = m->tt.total;
	char *path = NULL;
	float *buf = NULL;
	int rv;

	if (m->vh_w >= 0)
		return RL_OK;
	if (m->grads != NULL || m->act != NULL) {
		rl_error("value head: add it before reserving training buffers");
		return RL_EINVAL;
	}
	m->vh_w = rl_ttable_add(&m->tt, "value_head.weight", RL_T_AUX, 1, C);
	m->vh_b = rl_ttable_add(&m->tt, "value_head.bias", RL_T_AUX, 1, 0);
	if (m->w != m->params && (rv = grow_buf(m, &m->w, old, m->tt.total, asz(m))) != 0)
		return rv;
	if ((rv = grow_buf(m, (void **)&m->params, old, m->tt.total, sizeof(float))) != 0)
		return rv;
	if (m->ops->act_dtype == RL_F32)
		m->w = m->params;
	buf = rl_xcalloc((size_t)C + 1, sizeof *buf);
	if (dir != NULL) {
		size_t n = strlen(dir) + sizeof RL_VALUE_HEAD_FILE + 2;
		path = rl_xmalloc(n);
		snprintf(path, n, "%s/%s", dir, RL_VALUE_HEAD_FILE);
	}
	if (path != NULL && access(path, F_OK) == 0) {
		if ((rv = load_value_head(m, path, buf)) != 0)
			goto out;
		rl_verbose("value head loaded from '%s'", path);
	} else {
		/* small, so the first values are near 0 whatever the hidden state's scale;
		 * Box-Muller on counters keyed by the element (as rl_model_init_random) */
		double std = 1.0 / (C + 1);
		for (int j = 0; j < C; j++) {
			uint64_t k = 2 * (uint64_t)(m->tt.t[m->vh_w].off + (size_t)j);
			double u1 = rl_rng_uniform(seed, k), u2 = rl_rng_uniform(seed, k + 1);
			buf[j] = (float)(std * sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2));
		}
		rl_verbose("value head initialised (seed %llu)", (unsigned long long)seed);
	}
	if ((rv = rl_model_set(m, m->vh_w, buf)) != 0 || (rv = rl_model_set(m, m->vh_b, buf + C)) != 0)
		goto out;
out:
	free(path);
	free(buf);
	return rv;
}

/* ---- loading ------------------------------------------------------------------------- */

static int
known_extra(const char *name)
{
	/* buffers some exporters include: GPT-2's causal mask, old Llama rotary tables */
	size_t n = strlen(name);
	return (n >= 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
	    (n >= 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0) ||
	    strstr(name, "rotary_emb.inv_freq") != NULL;
}

/* lm_head.weight present in a tied model: it must be the embedding.  buf
 * holds at least the embedding's elements; the embedding is read back only
 * here, so a file without the head (the usual tied one) costs no second
 * (V, C) buffer. */
static int
check_tied_head(rl_model *m, const rl_st_set *set, float *buf)
{
	const char *file;
	const rl_st_tensor *st = rl_st_set_find(set, "lm_head.weight", &file);
	const rl_tensor *t = &m->tt.t[m->wte];
	float *wte = NULL;
	int rv = RL_OK;

	if (st == NULL)
		return RL_OK;
	if (st->nelem == t->n && rl_st_to_f32(buf, st, 0, t->n) == 0) {
		if ((wte = rl_try_malloc(t->n * sizeof(float), "tied head check")) == NULL)
			return RL_ENOMEM;
		if ((rv = rl_model_get(m, m->wte, RL_MODEL_PARAM, wte)) != 0)
			goto out;
		if (memcmp(buf, wte, t->n * sizeof(float)) == 0)
			goto out;
	}
	rl_error("'%s': tensor 'lm_head.weight' differs from the embedding but "
	    "tie_word_embeddings is true", file);
	rl_hint("set \"tie_word_embeddings\": false in config.json to load a separate head");
	rv = RL_EFORMAT;
out:
	free(wte);
	return rv;
}

int
rl_check_finite(const float *x, size_t n, const char *file, const char *name)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(x[i]) && bad++ == 0)
			first = i;
	}
	if (bad == 0)
		return RL_OK;
	rl_error("'%s': tensor '%s' has %zu non-finite values of %zu (the first, element %zu, is %g)", file, name, bad,
	    n, first, (double)x[first]);
	rl_hint("a diverged or damaged checkpoint; generate from an earlier step");
	return RL_EFORMAT;
}

/* A missing dir spelled as a Hugging Face Hub id (ORG/NAME: one slash, neither part
 * starting with '.', only the characters the Hub allows) is most likely one: say that only
 * local directories are read and how people download one. */
static int
check_hub_id(const char *dir)
{
	const char *sl = strchr(dir, '/');
	struct stat st;

	if (stat(dir, &st) == 0 || errno != ENOENT || sl == NULL || sl == dir || sl[1] == 0 ||
	    strchr(sl + 1, '/') != NULL || dir[0] == '.' || sl[1] == '.' ||
	    strspn(dir, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_./") != strlen(dir))
		return RL_OK;
	rl_error("'%s': no such directory; models are read from local directories only, not from "
	    "the Hugging Face Hub", dir);
	rl_hint("download it first, then pass the directory: huggingface-cli download %s --local-dir DIR "
	    "(or, with huggingface_hub >= 0.34: hf download %s --local-dir DIR)", dir, dir);
	return RL_ENOENT;
}

/* A reward model's head: score.weight [1, C] (and score.bias [1] where an
 * exporter wrote one; transformers' classes have none) into the value head. */
static int
load_score(rl_model *m, const rl_st_set *set, const char *dir, float *buf)
{
	const int64_t C = m->cfg.hidden_size;
	const char *file = NULL;
	const rl_st_tensor *w = rl_st_set_find(set, "score.weight", &file);
	const rl_st_tensor *b;
	int rv;

	if (w == NULL) {
		rl_error("'%s': no tensor 'score.weight': config.json names a ...ForSequenceClassification", dir);
		return RL_ENOENT;
	}
	if (w->ndim != 2 || w->shape[0] != 1 || w->shape[1] != C) {
		char got[64] = "";
		for (int d = 0; d < w->ndim && strlen(got) < 40; d++)
			snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
			    (long long)w->shape[d]);
		rl_error("'%s': tensor 'score.weight' has shape [%s]; a reward model's head is [1, %lld] "
		    "(one label, hidden_size %lld)", file, got, (long long)C, (long long)C);
		return RL_ESHAPE;
	}
	if ((rv = rl_model_add_value_head(m, NULL, 0)) != 0)
		return rv;
	buf[C] = 0;
	if ((rv = rl_st_to_f32(buf, w, 0, w->nelem)) != 0 ||
	    (rv = rl_check_finite(buf, (size_t)C, file, "score.weight")) != 0)
		return rv;
	if ((b = rl_st_set_find(set, "score.bias", &file)) != NULL) {
		if (b->nelem != 1 || rl_st_to_f32(buf + C, b, 0, 1) != 0) {
			rl_error("'%s': tensor 'score.bias' is not one float", file);
			return RL_ESHAPE;
		}
	}
	if ((rv = rl_model_set(m, m->vh_w, buf)) != 0 || (rv = rl_model_set(m, m->vh_b, buf + C)) != 0)
		return rv;
	return RL_OK;
}

int
rl_model_score_index(const rl_config *c, const int32_t *tok, int n)
{
	int pad = c->pad_id;

	if (pad < 0)
		return n - 1;
	for (int t = n - 1; t >= 0; t--)
		if (tok[t] != pad)
			return t;
	return 0;
}

static int open_dir(rl_model **out, const char *dir, rl_ops *ops, int as_rm, uint64_t seed, int part);

int
rl_model_open(rl_model **out, const char *dir, rl_ops *ops)
{
	return open_dir(out, dir, ops, 0, 0, 0);
}

int
rl_model_open_rm(rl_model **out, const char *dir, rl_ops *ops, uint64_t seed)
{
	return open_dir(out, dir, ops, 1, seed, 0);
}

int
rl_model_open_part(rl_model **out, const char *dir, rl_ops *ops, int as_rm, uint64_t seed)
{
	return open_dir(out, dir, ops, as_rm, seed, 1);
}

/* A new score head, as transformers' _init_weights makes score when a
 * checkpoint has none: normal(0, initializer_range), deterministic in seed. */
static int
init_score(rl_model *m, uint64_t seed)
{
	const int C = m->cfg.hidden_size;
	double std = m->cfg.init_std > 0 ? m->cfg.init_std : 0.02;
	float *buf;
	int rv;

	if ((rv = rl_model_add_value_head(m, NULL, seed)) != 0)
		return rv;
	buf = rl_xcalloc((size_t)C, sizeof *buf);
	for (int j = 0; j < C; j++) {
		uint64_t k = 2 * (uint64_t)(m->tt.t[m->vh_w].off + (size_t)j);
		double u1 = rl_rng_uniform(seed, k), u2 = rl_rng_uniform(seed, k + 1);
		buf[j] = (float)(std * sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2));
	}
	rv = rl_model_set(m, m->vh_w, buf);
	free(buf);
	rl_verbose("score head initialised: normal(0, %g), seed %llu", std, (unsigned long long)seed);
	return rv;
}

/* A causal LM opened as a reward model: the new head (init_score), or PPO's
 * value head file in dir where there is one. */
static int
new_score(rl_model *m, const char *dir, uint64_t seed)
{
	size_t n = strlen(dir) + sizeof RL_VALUE_HEAD_FILE + 2;
	char *path = rl_xmalloc(n);
	int rv;

	snprintf(path, n, "%s/%s", dir, RL_VALUE_HEAD_FILE);
	rv = access(path, F_OK) == 0 ? rl_model_add_value_head(m, dir, seed) : init_score(m, seed);
	free(path);
	return rv;
}

static int
open_dir(rl_model **out, const char *dir, rl_ops *ops, int as_rm, uint64_t seed, int part)
{
	rl_config cfg = { 0 };
	rl_model *m = NULL;
	rl_st_set *set = NULL;
	float *buf = NULL;
	char *path = NULL;
	size_t maxn = 0, plen = strlen(dir) + 32;
	int rv, used = 0, total = 0, big = 0, vision = 0, was_lm = 0;
	const char *unknown = NULL;

	*out = NULL;
	if ((rv = check_hub_id(dir)) != 0)
		return rv;
	path = rl_xmalloc(plen);
	snprintf(path, plen, "%s/config.json", dir);
	if ((rv = rl_config_load(&cfg, path)) != 0)
		goto out;
	if ((rv = rl_st_set_open(&set, dir)) != 0)
		goto out;
	if (as_rm && !cfg.seq_cls) {
		/* a causal LM becomes a reward model: its lm_head is dropped; without a
		 * pad id its EOS pads (TRL's reward scripts), the one saved and read by */
		cfg.seq_cls = 1;
		if (cfg.pad_id < 0)
			cfg.pad_id = cfg.eos_id;
		was_lm = 1;
	}
	if ((rv = model_new(&m, &cfg, ops, set, dir, part)) != 0)
		goto out;
	m->src_dir = rl_xstrdup(dir);
	if (part) {
		/* checked, not read: rl_model_load_range reads a range of it */
		m->part_set = set;
		used = m->tt.n;
		if ((buf = rl_try_malloc(((size_t)m->cfg.hidden_size + 1) * sizeof(float), "the score head")) == NULL) {
			rv = RL_ENOMEM;
			goto out;
		}
		goto heads;
	}
	for (int i = 0; i < m->tt.n; i++)
		if (m->tt.t[i].n > maxn) {
			maxn = m->tt.t[i].n;
			big = i;
		}
	/* + 1: the score head's weight and bias (load_score) */
	if ((buf = rl_try_malloc((maxn + 1) * sizeof(float), "the load buffer")) == NULL) {
		rl_error("'%s': cannot allocate the %zu bytes of tensor '%s'", dir, maxn * sizeof(float),
		    m->tt.t[big].name);
		rv = RL_ENOMEM;
		goto out;
	}
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		const char *file = NULL, *name = t->name;
		const rl_st_tensor *st = find_tensor(set, name, &file);

		/* found, with the shape and dtype config.json implies: check_files */
		if ((rv = rl_st_to_f32(buf, st, 0, st->nelem)) != 0) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", file, st->name,
			    rl_dtype_name(st->dtype));
			goto out;
		}
		if ((rv = rl_check_finite(buf, st->nelem, file, st->name)) != 0)
			goto out;
		if ((rv = rl_model_set(m, i, buf)) != 0)
			goto out;
		used++;
	}
	if (m->cfg.tie_embeddings && (rv = check_tied_head(m, set, buf)) != 0)
		goto out;
heads:
	if (m->cfg.seq_cls && !was_lm && (rv = load_score(m, set, dir, buf)) != 0)
		goto out;
	if (was_lm && (rv = new_score(m, dir, seed)) != 0)
		goto out;
	for (int f = 0; f < set->nfiles; f++)
		for (int j = 0; j < set->files[f]->n; j++) {
			const char *nm = set->files[f]->t[j].name;
			char full[RL_TT_NAME + 16];
			total++;
			if (m->cfg.gemma && vision_tensor(nm)) {
				vision++;
				continue;
			}
			snprintf(full, sizeof full, "transformer.%s", nm);
			if (rl_ttable_find(&m->tt, nm) < 0 && rl_ttable_find(&m->tt, full) < 0 &&
			    !known_extra(nm) && strcmp(nm, "lm_head.weight") != 0 && unknown == NULL &&
			    strncmp(nm, "model.language_model.", 21) != 0 && strncmp(nm, "language_model.", 15) != 0 &&
			    !(m->cfg.seq_cls && strncmp(nm, "score.", 6) == 0))
				unknown = nm;
		}
	if (vision > 0)
		rl_info("'%s': the text model of Gemma 3 is loaded; the %d tensors of its vision tower and "
		    "projector are left out", dir, vision);
	if (unknown != NULL)
		rl_warn("'%s': tensor '%s' (and maybe others) is not part of a %s model; ignored", dir,
		    unknown, m->cfg.model_type);
	rl_verbose("%s '%s': %s, %zu parameters from %d tensors", part ? "checked" : "loaded", dir,
	    m->cfg.model_type, rl_model_nparams(m), used);
	*out = m;
	m = NULL;
	if (part)
		set = NULL; /* the model's now */
out:
	if (m != NULL && m->part_set == set)
		m->part_set = NULL;
	free(buf);
	free(path);
	rl_st_set_close(set);
	rl_config_fini(&cfg);
	rl_model_close(m);
	return rv;
}

/* ---- a range of the table (rl_model_open_part, rl_model_load_range) ------------------- */

/* Where table tensor i is read from: the f32 master weights of a checkpoint's
 * optimizer state when rl_ckpt_load_optimizer found them there (the files'
 * layout, as model.safetensors), else the model's files (present, with the
 * shape and dtype config.json implies: check_files at the open). */
static int
part_source(const rl_model *m, const rl_st_file *mf, int i, const rl_st_tensor **st, const char **file)
{
	const rl_tensor *t = &m->tt.t[i];
	char key[RL_TT_NAME + 16];

	if (mf != NULL) {
		snprintf(key, sizeof key, "%s.master", t->name);
		if ((*st = rl_st_find(mf, key)) != NULL) {
			*file = m->part_master;
			if ((*st)->nelem == t->n && (*st)->dtype == RL_F32)
				return RL_OK;
			rl_error("'%s': tensor '%s' has the wrong shape or dtype", *file, key);
			return RL_ESHAPE;
		}
	}
	*st = find_tensor(m->part_set, t->name, file);
	return RL_OK;
}

/* Elements [a, b) of tensor i (the table's layout) from st into dst.  A
 * transposed tensor (GPT-2's Conv1D, stored [in, out]) is converted whole
 * into a buffer of its own first: only m->params' range is written. */
static int
part_read(const rl_model *m, int i, const rl_st_tensor *st, size_t a, size_t b, float *dst)
{
	const rl_tensor *t = &m->tt.t[i];
	size_t S0 = (size_t)t->shape[0], S1 = (size_t)t->shape[1];
	float *w;
	int rv;

	if (!(t->flags & RL_T_TRANSPOSE))
		return rl_st_to_f32(dst, st, a, b - a);
	if ((w = rl_try_malloc(t->n * sizeof *w, t->name)) == NULL)
		return RL_ENOMEM;
	/* table element k = (c, r) of [S0, S1] is the file's (r, c) of [S1, S0] */
	if ((rv = rl_st_to_f32(w, st, 0, t->n)) == 0)
		for (size_t k = a; k < b; k++)
			dst[k - a] = w[(k % S1) * S0 + k / S1];
	free(w);
	return rv;
}

/* rl_check_finite over elements [first, first + n) of a tensor. */
static int
part_finite(const float *x, size_t n, size_t first, const char *file, const char *name)
{
	size_t bad = 0, at = 0;

	for (size_t k = 0; k < n; k++)
		if (!isfinite(x[k]) && bad++ == 0)
			at = k;
	if (bad == 0)
		return RL_OK;
	rl_error("'%s': tensor '%s' has %zu non-finite values among its elements [%zu, %zu) (the first, element "
	    "%zu, is %g)", file, name, bad, first, first + n, first + at, (double)x[at]);
	rl_hint("a diverged or damaged checkpoint; generate from an earlier step");
	return RL_EFORMAT;
}

/* check_tied_head over the embedding's elements in [lo, hi): the files'
 * lm_head.weight against the files' embedding, converted alike, a chunk at
 * a time. */
static int
part_tied(rl_model *m, size_t lo, size_t hi)
{
	enum { CH = 1 << 14 };
	const char *file, *wfile;
	const rl_st_tensor *st = rl_st_set_find(m->part_set, "lm_head.weight", &file), *wt;
	const rl_tensor *t = &m->tt.t[m->wte];
	size_t a = RL_MAX(lo, t->off), b = RL_MIN(hi, t->off + t->n);
	float *x;
	int rv = RL_OK;

	if (st == NULL)
		return RL_OK;
	wt = find_tensor(m->part_set, t->name, &wfile);
	if ((x = rl_try_malloc(2 * CH * sizeof *x, "tied head check")) == NULL)
		return RL_ENOMEM;
	if (st->nelem != t->n)
		rv = RL_EFORMAT;
	for (size_t k = a; rv == 0 && k < b; k += CH) {
		size_t c = RL_MIN((size_t)CH, b - k);
		if (rl_st_to_f32(x, st, k - t->off, c) != 0 || rl_st_to_f32(x + CH, wt, k - t->off, c) != 0 ||
		    memcmp(x, x + CH, c * sizeof *x) != 0)
			rv = RL_EFORMAT;
	}
	free(x);
	if (rv == 0)
		return RL_OK;
	rl_error("'%s': tensor 'lm_head.weight' differs from the embedding but "
	    "tie_word_embeddings is true", file);
	rl_hint("set \"tie_word_embeddings\": false in config.json to load a separate head");
	return rv;
}

int
rl_model_load_range(rl_model *m, size_t lo, size_t hi)
{
	size_t end = m->vh_w >= 0 ? m->tt.t[m->vh_w].off : m->tt.total;
	rl_st_file *mf = NULL;
	int rv = RL_OK;

	if (m->part_set == NULL) {
		rl_error("load range: the model was not opened with rl_model_open_part, or was read already");
		return RL_EINVAL;
	}
	hi = RL_MIN(hi, m->tt.total);
	lo = RL_MIN(lo, hi);
	if (m->part_master != NULL && (rv = rl_st_open(&mf, m->part_master)) != 0)
		goto out;
	/* the padding between tensors too; the value head was set at the open */
	if (lo < RL_MIN(hi, end))
		m->ops->zero(m->ops, m->params + lo, (RL_MIN(hi, end) - lo) * sizeof(float));
	for (int i = 0; rv == 0 && i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		const rl_st_tensor *st = NULL;
		const char *file = NULL;
		size_t a = RL_MAX(lo, t->off), b = RL_MIN(hi, t->off + t->n);
		if (i == m->vh_w || i == m->vh_b || a >= b)
			continue;
		if ((rv = part_source(m, mf, i, &st, &file)) != 0)
			break;
		if ((rv = part_read(m, i, st, a - t->off, b - t->off, m->params + a)) != 0) {
			if (rv != RL_ENOMEM)
				rl_error("'%s': tensor '%s' has dtype %s, not a float type", file, st->name,
				    rl_dtype_name(st->dtype));
			break;
		}
		rv = part_finite(m->params + a, b - a, a - t->off, file, st->name);
	}
	if (rv == 0 && m->cfg.tie_embeddings)
		rv = part_tied(m, lo, hi);
	if (rv == 0 && m->w != m->params && hi > lo)
		m->ops->cast(m->ops, (char *)m->w + lo * asz(m), m->ops->act_dtype, m->params + lo, RL_F32, hi - lo);
	if (rv == 0)
		rv = check_ops(m, "upload");
out:
	rl_st_close(mf);
	rl_st_set_close(m->part_set);
	m->part_set = NULL;
	free(m->part_master);
	m->part_master = NULL;
	return rv;
}

/* ---- layer pieces both passes use ---------------------------------------------------- */

/* norm forward for either architecture: RMSNorm (Llama) or LayerNorm (GPT-2). */
void
rli_model_norm_fwd(rl_model *m, void *out, float *mean, float *rstd, const void *x, int wi, int bi, int N)
{
	rl_ops *o = m->ops;
	if (m->cfg.gemma)
		rli_gemma_norm_fwd(m, out, rstd, x, wi, N);
	else if (m->cfg.arch == RL_ARCH_GPT2)
		o->layernorm_fwd(o, out, mean, rstd, x, W(m, wi), W(m, bi), N, m->cfg.hidden_size,
		    m->cfg.norm_eps);
	else
		o->rmsnorm_fwd(o, out, rstd, x, W(m, wi), N, m->cfg.hidden_size, m->cfg.norm_eps);
}

/* x += t, then out = the norm of x (weights wi, bi): one kernel where the backend has it. */
void
rli_model_add_norm_fwd(rl_model *m, void *x, void *out, float *mean, float *rstd, const void *t, int wi, int bi,
    int N)
{
	rl_ops *o = m->ops;
	if (o->add_norm_fwd && !m->cfg.gemma) {
		o->add_norm_fwd(o, x, out, mean, rstd, t, W(m, wi), W(m, bi), N, m->cfg.hidden_size,
		    m->cfg.norm_eps, m->cfg.arch == RL_ARCH_GPT2);
		return;
	}
	o->add(o, x, x, t, (size_t)N * m->cfg.hidden_size);
	rli_model_norm_fwd(m, out, mean, rstd, x, wi, bi, N);
}

/* The MLP's activation: SwiGLU over gate|up, or GPT-2's GELU. */
static void
mlp_act_fwd(rl_model *m, void *h, const void *fc, int N)
{
	if (m->cfg.arch == RL_ARCH_GPT2)
		m->ops->gelu_fwd(m->ops, h, fc, (size_t)N * m->cfg.intermediate_size);
	else
		m->ops->swiglu_fwd(m->ops, h, fc, N, m->cfg.intermediate_size);
}

/* fc = up projection of xn, h = activation of fc; GPT-2's bias + GELU in the GEMM's
 * epilogue when the backend offers it (RL_CUDA_GELU_FUSE=1). */
void
rli_model_mlp_up_fwd(rl_model *m, void *h, void *fc, const void *xn, const rl_layer_idx *y, int N)
{
	rl_ops *o = m->ops;
	const rl_config *c = &m->cfg;
	if (c->arch == RL_ARCH_GPT2 && o->matmul_gelu_fwd) {
		o->matmul_gelu_fwd(o, h, fc, xn, W(m, y->fc_w), W(m, y->fc_b), N, c->hidden_size, fc_dim(c));
		return;
	}
	o->matmul_fwd(o, fc, xn, W(m, y->fc_w), W(m, y->fc_b), N, c->hidden_size, fc_dim(c));
	mlp_act_fwd(m, h, fc, N);
}

/* ---- attention of layer l: the ops table's, or the CPU's with window and scale ---------- */

void
rli_model_attn_fwd(rl_model *m, int l, void *out, float *lse, const void *qkv, const int32_t *seg, int B,
    int T)
{
	const rl_config *c = &m->cfg;
	if (attn_plain(c, l) || !m->cpu)
		m->ops->attn_fwd(m->ops, out, lse, qkv, seg, B, T, c->n_head, c->n_kv_head, c->head_dim);
	else
		rl_cpu_attn_fwd_ex(m->ops, out, lse, qkv, seg, B, T, c->n_head, c->n_kv_head, c->head_dim,
		    attn_scale(c), layer_window(c, l));
}

void
rli_model_attn_bwd(rl_model *m, int l, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T)
{
	const rl_config *c = &m->cfg;
	if (attn_plain(c, l) || !m->cpu)
		m->ops->attn_bwd(m->ops, dqkv, dout, out, lse, qkv, seg, B, T, c->n_head, c->n_kv_head, c->head_dim);
	else
		rl_cpu_attn_bwd_ex(m->ops, dqkv, dout, out, lse, qkv, seg, B, T, c->n_head, c->n_kv_head,
		    c->head_dim, attn_scale(c), layer_window(c, l));
}

void
rli_model_attn_decode(rl_model *m, int l, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *bt, const int32_t *ctx, int B, int BS, int btcols)
{
	const rl_config *c = &m->cfg;
	if (attn_plain(c, l) || !m->cpu)
		m->ops->attn_decode(m->ops, out, qkv, kc, vc, bt, ctx, B, c->n_head, c->n_kv_head, c->head_dim, BS,
		    btcols);
	else
		rl_cpu_attn_decode_ex(m->ops, out, qkv, kc, vc, bt, ctx, B, c->n_head, c->n_kv_head, c->head_dim,
		    BS, btcols, attn_scale(c), layer_window(c, l));
}

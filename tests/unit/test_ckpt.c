/*
 * test_ckpt.c — checkpoints: save/load round trips (bf16 tied Qwen2, GPT-2
 * loaded without the "transformer." prefix and saved with it, Conv1D kept
 * [in, out] in the file, f16 Llama read from two shards), HF conventions in what is written (names, shapes,
 * dtype, "format": "pt", no lm_head when tied, torch_dtype), atomicity
 * (existing directory refused, no temp left), `latest`, optimizer state,
 * random init (deterministic by seed, HF's std, GPT-2's scaled projections),
 * and a version's part built a tensor at a time in any order (rl_ckpt_part:
 * the files of rl_ckpt_part_files, a tensor never put refused by name; the
 * whole version so: rl_ckpt_weight_files').
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/ckpt.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "t.h"
#include "sync/wckpt.h"
#include "sync/wsync.h"

static char tmpd[] = "/tmp/rl-test-ckpt.XXXXXX";

static int
same_params(rl_model *a, rl_model *b, int kind)
{
	int ok = a->tt.n == b->tt.n && a->tt.total == b->tt.total;
	for (int i = 0; ok && i < a->tt.n; i++) {
		size_t n = a->tt.t[i].n;
		float *x = rl_xmalloc(n * 4), *y = rl_xmalloc(n * 4);
		ok = strcmp(a->tt.t[i].name, b->tt.t[i].name) == 0 && rl_model_get(a, i, kind, x) == 0 &&
		    rl_model_get(b, i, kind, y) == 0 && memcmp(x, y, n * 4) == 0;
		if (!ok)
			fprintf(stderr, "tensor %s differs\n", a->tt.t[i].name);
		free(x);
		free(y);
	}
	return ok;
}

/* rl_ckpt_snap: the copy is the weights when it was taken, whatever the
 * model does after; written as rl_ckpt_save writes (the PyTorch check in
 * main reads the first one back against the fixture's logits). */
static void
test_snap(rl_ops *o)
{
	rl_model *m = NULL, *b = NULL, *fresh = NULL;
	rl_ckpt_snap *s = NULL;
	char root[512], path[600];

	snprintf(root, sizeof root, "%s/snap", tmpd);
	T_EQ_INT(rl_model_open(&m, "tests/fixtures/qwen2", o), 0);
	T_EQ_INT(rl_model_open(&fresh, "tests/fixtures/qwen2", o), 0);
	if (m == NULL || fresh == NULL)
		return;
	T_OK(rl_ckpt_snap_ok(m), "a CPU model without LoRA can be copied");
	m->version = 1;
	T_EQ_INT(rl_ckpt_snap_take(&s, m), 0);
	for (size_t i = 0; i < m->tt.total; i++)
		m->params[i] += 1.0f; /* the next step trains on */
	m->version = 2;
	T_EQ_INT(rl_ckpt_snap_save(s, root, path, sizeof path), 0);
	T_OK(strstr(path, "step-00000001") != NULL, "the copy's version names the directory: %s", path);
	T_EQ_INT(rl_model_open(&b, path, o), 0);
	if (b != NULL)
		T_OK(same_params(b, fresh, RL_MODEL_PARAM), "the copy holds the weights when taken");
	rl_model_close(b);
	b = NULL;
	/* taken again: the same buffer, the new weights */
	T_EQ_INT(rl_ckpt_snap_take(&s, m), 0);
	T_EQ_INT(rl_ckpt_snap_save(s, root, path, sizeof path), 0);
	T_EQ_INT(rl_model_open(&b, path, o), 0);
	if (b != NULL)
		T_OK(same_params(b, m, RL_MODEL_PARAM) && !same_params(b, fresh, RL_MODEL_PARAM),
		    "the second copy holds the trained weights");
	rl_model_close(b);
	rl_ckpt_snap_free(s);
	rl_model_close(fresh);
	rl_model_close(m);
}

static void
round_trip(rl_ops *o, const char *fixture, const char *out)
{
	char src[256], dst[512], p[600];
	rl_model *a = NULL, *b = NULL;
	rl_st_file *f = NULL;

	snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
	snprintf(dst, sizeof dst, "%s/%s", tmpd, out);
	T_EQ_INT(rl_model_open(&a, src, o), 0);
	if (a == NULL)
		return;
	T_EQ_INT(rl_model_save(a, dst), 0);
	T_EQ_INT(rl_model_save(a, dst), RL_EEXIST);
	snprintf(p, sizeof p, "%s.tmp.%ld", dst, (long)getpid());
	T_OK(access(p, F_OK) != 0, "temp dir left behind");
	T_EQ_INT(rl_model_open(&b, dst, o), 0);
	if (b != NULL) {
		T_OK(same_params(a, b, RL_MODEL_PARAM), "%s: parameters differ after save/load", fixture);
		T_EQ_INT(b->cfg.dtype, a->cfg.dtype);
		T_EQ_INT(b->cfg.tie_embeddings, a->cfg.tie_embeddings);
		T_EQ_STR(b->cfg.model_type, a->cfg.model_type);
	}
	snprintf(p, sizeof p, "%s/model.safetensors", dst);
	T_EQ_INT(rl_st_open(&f, p), 0);
	if (f != NULL) {
		if (a->cfg.tie_embeddings)
			T_OK(rl_st_find(f, "lm_head.weight") == NULL, "tied head written");
		for (int i = 0; i < f->n; i++)
			T_EQ_INT(f->t[i].dtype, a->cfg.dtype);
		T_OK(strstr((const char *)f->map + 8, "\"format\":\"pt\"") != NULL, "no format=pt metadata");
		/* the index names model.safetensors for each of its tensors and nothing
		 * else (vLLM loads only the files an index names) */
		char *ix = NULL;
		size_t nix = 0, total = 0;
		snprintf(p, sizeof p, "%s/model.safetensors.index.json", dst);
		T_EQ_INT(rli_read_file(p, &ix, &nix, 1 << 20), 0);
		cJSON *root = cJSON_Parse(ix ? ix : ""), *wm = cJSON_GetObjectItem(root, "weight_map"), *j;
		T_EQ_INT(cJSON_GetArraySize(wm), f->n);
		for (int i = 0; i < f->n; i++) {
			j = cJSON_GetObjectItem(wm, f->t[i].name);
			T_OK(cJSON_IsString(j) && strcmp(j->valuestring, "model.safetensors") == 0, "index: %s",
			    f->t[i].name);
			total += f->t[i].nbytes;
		}
		j = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_size");
		T_OK(cJSON_IsNumber(j) && j->valuedouble == (double)total, "index total_size");
		cJSON_Delete(root);
		free(ix);
		if (a->cfg.arch == RL_ARCH_GPT2) {
			/* GPT2LMHeadModel's state_dict names, Conv1D weight [in, out] */
			const rl_st_tensor *t = rl_st_find(f, "transformer.h.1.attn.c_attn.weight");
			T_OK(t != NULL && t->shape[0] == a->cfg.hidden_size && t->shape[1] == 3 * a->cfg.hidden_size,
			    "c_attn.weight missing or not [C, 3C]");
			t = rl_st_find(f, "transformer.h.0.mlp.c_proj.weight");
			T_OK(t != NULL && t->shape[0] == a->cfg.intermediate_size, "mlp.c_proj.weight not [H, C]");
		} else {
			T_OK(!a->cfg.qkv_bias || rl_st_find(f, "model.layers.1.self_attn.k_proj.bias") != NULL,
			    "k_proj.bias missing");
		}
	}
	rl_st_close(f);
	rl_model_close(a);
	rl_model_close(b);
}

/* The tokenizer's side files go with the weights: transformers >= 4.5x keeps
 * the chat template in chat_template.jinja (not in tokenizer_config.json),
 * sentencepiece models their vocabulary in tokenizer.model.  Both save paths
 * (a directory, a weights version for rl-sync) carry each one present. */
static void
test_side_files(rl_ops *o)
{
	static const char *const side[] = { "tokenizer.json", "generation_config.json", "chat_template.jinja",
		"chat_template.json", "tokenizer.model", "added_tokens.json" };
	char src[600], dst[700], p[800], cmd[1600];
	rl_model *m = NULL;
	rl_wver *v = NULL;

	snprintf(src, sizeof src, "%s/side-src", tmpd);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp tests/fixtures/qwen2/config.json tests/fixtures/qwen2/model.safetensors '%s/'",
	    src, src);
	T_EQ_INT(system(cmd), 0);
	for (size_t k = 0; k < RL_ARRAY_LEN(side); k++) {
		snprintf(p, sizeof p, "%s/%s", src, side[k]);
		FILE *fp = fopen(p, "w");
		T_OK(fp != NULL && fprintf(fp, "%s\n", side[k]) > 0 && fclose(fp) == 0, "cannot write %s", p);
	}
	T_EQ_INT(rl_model_open(&m, src, o), 0);
	if (m == NULL)
		return;
	snprintf(dst, sizeof dst, "%s/side-dst", tmpd);
	T_EQ_INT(rl_model_save(m, dst), 0);
	T_EQ_INT(rl_wver_from_ckpt(&v, m, 1), 0);
	for (size_t k = 0; k < RL_ARRAY_LEN(side); k++) {
		snprintf(cmd, sizeof cmd, "cmp -s '%s/%s' '%s/%s'", src, side[k], dst, side[k]);
		T_OK(system(cmd) == 0, "%s not copied into the saved directory", side[k]);
		const rl_wblob *b = v ? rl_wver_find(v, side[k]) : NULL;
		T_OK(b != NULL && b->size == strlen(side[k]) + 1, "%s not in the weights version", side[k]);
	}
	rl_wver_destroy(v);
	rl_model_close(m);
}

static void
test_random_and_optimizer(rl_ops *o)
{
	rl_config c = { .arch = RL_ARCH_LLAMA, .vocab_size = 50, .hidden_size = 24, .n_layer = 2,
		.n_head = 4, .n_kv_head = 2, .head_dim = 6, .intermediate_size = 40, .max_pos = 32,
		.rope_theta = 10000, .norm_eps = 1e-6f, .qkv_bias = 1, .bos_id = -1, .eos_id = 3,
		.dtype = RL_F32 };
	rl_config g = { .arch = RL_ARCH_GPT2, .vocab_size = 64, .hidden_size = 32, .n_layer = 4,
		.n_head = 4, .n_kv_head = 4, .head_dim = 8, .intermediate_size = 128, .max_pos = 32,
		.norm_eps = 1e-5f, .qkv_bias = 1, .o_bias = 1, .tie_embeddings = 1, .bos_id = -1,
		.eos_id = -1, .dtype = RL_F32 };
	rl_model *a = NULL, *b = NULL, *c2 = NULL;
	char root[512], path[600], latest[600];
	int32_t tok[16], tgt[16];
	float dlp[16], norm;
	rl_adamw hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		.max_grad_norm = 1.0f };

	snprintf(c.model_type, sizeof c.model_type, "qwen2");
	snprintf(g.model_type, sizeof g.model_type, "gpt2");
	T_EQ_INT(rl_model_init_random(&a, &c, o, 42), 0);
	T_EQ_INT(rl_model_init_random(&b, &c, o, 42), 0);
	T_EQ_INT(rl_model_init_random(&c2, &c, o, 43), 0);
	if (a == NULL || b == NULL || c2 == NULL)
		return;
	T_OK(same_params(a, b, RL_MODEL_PARAM), "same seed, different weights");
	/* weight sync: one flat copy of the table's buffer makes c2 equal to a */
	o->copy(o, c2->params, a->params, a->tt.total * sizeof(float));
	T_EQ_INT(rl_model_params_changed(c2), 0);
	T_OK(same_params(a, c2, RL_MODEL_PARAM), "flat copy differs");
	rl_model_close(c2);
	c2 = NULL;
	T_EQ_INT(rl_model_init_random(&c2, &c, o, 43), 0);
	if (c2 == NULL)
		return;
	{
		int i = rl_ttable_find(&a->tt, "model.layers.0.mlp.up_proj.weight");
		size_t n = a->tt.t[i].n;
		float *x = rl_xmalloc(n * 4), *y = rl_xmalloc(n * 4);
		double s = 0, s2 = 0;
		rl_model_get(a, i, RL_MODEL_PARAM, x);
		rl_model_get(c2, i, RL_MODEL_PARAM, y);
		T_OK(memcmp(x, y, n * 4) != 0, "different seeds, same weights");
		for (size_t j = 0; j < n; j++) {
			s += x[j];
			s2 += (double)x[j] * x[j];
		}
		/* 960 draws: the sample std is within 10% of 0.02 with overwhelming odds */
		T_CLOSE(sqrt(s2 / n - (s / n) * (s / n)), 0.02, 0.002, 0);
		T_CLOSE(s / n, 0.0, 0.003, 0);
		free(x);
		free(y);
		i = rl_ttable_find(&a->tt, "model.norm.weight");
		x = rl_xmalloc(a->tt.t[i].n * 4);
		rl_model_get(a, i, RL_MODEL_PARAM, x);
		T_OK(x[0] == 1.0f && x[a->tt.t[i].n - 1] == 1.0f, "norm weight not 1");
		free(x);
		i = rl_ttable_find(&a->tt, "model.layers.1.self_attn.v_proj.bias");
		x = rl_xmalloc(a->tt.t[i].n * 4);
		rl_model_get(a, i, RL_MODEL_PARAM, x);
		T_OK(x[0] == 0.0f, "bias not 0");
		free(x);
	}
	/* the fused views: q, k, v adjacent; gate, up adjacent */
	{
		const rl_ttable *tt = &a->tt;
		int q = rl_ttable_find(tt, "model.layers.1.self_attn.q_proj.weight");
		int k = rl_ttable_find(tt, "model.layers.1.self_attn.k_proj.weight");
		int v = rl_ttable_find(tt, "model.layers.1.self_attn.v_proj.weight");
		int gt = rl_ttable_find(tt, "model.layers.1.mlp.gate_proj.weight");
		int up = rl_ttable_find(tt, "model.layers.1.mlp.up_proj.weight");
		int kb = rl_ttable_find(tt, "model.layers.1.self_attn.k_proj.bias");
		int qb = rl_ttable_find(tt, "model.layers.1.self_attn.q_proj.bias");
		T_EQ_INT(tt->t[k].off, tt->t[q].off + tt->t[q].n);
		T_EQ_INT(tt->t[v].off, tt->t[k].off + tt->t[k].n);
		T_EQ_INT(tt->t[up].off, tt->t[gt].off + tt->t[gt].n);
		T_EQ_INT(tt->t[kb].off, tt->t[qb].off + tt->t[qb].n);
		T_EQ_INT(tt->t[q].off % RL_TT_ALIGN, 0);
	}
	/* a model built in code saves a config.json that loads back */
	snprintf(path, sizeof path, "%s/random", tmpd);
	T_EQ_INT(rl_model_save(a, path), 0);
	rl_model_close(b);
	b = NULL;
	T_EQ_INT(rl_model_open(&b, path, o), 0);
	if (b != NULL) {
		T_OK(same_params(a, b, RL_MODEL_PARAM), "random model differs after save/load");
		T_EQ_INT(b->cfg.n_kv_head, 2);
		T_EQ_INT(b->cfg.head_dim, 6);
		T_EQ_INT(b->cfg.qkv_bias, 1);
		T_EQ_INT(b->cfg.eos_id, 3);
	}

	/* training checkpoints: two steps, latest, optimizer state */
	for (int i = 0; i < 16; i++) {
		tok[i] = (i * 7) % 50;
		tgt[i] = i % 8 == 7 ? -1 : ((i + 1) * 7) % 50;
		dlp[i] = tgt[i] >= 0 ? -1.0f / 14 : 0;
	}
	snprintf(root, sizeof root, "%s/run", tmpd);
	/* a bf16 checkpoint: model.safetensors rounds, optimizer.safetensors keeps the f32 masters */
	a->cfg.dtype = RL_BF16;
	T_EQ_INT(rl_ckpt_latest(root, latest, sizeof latest), RL_ENOENT);
	T_EQ_INT(rl_model_train_reserve(a, 16), 0);
	for (int s = 1; s <= 2; s++) {
		T_EQ_INT(rl_model_forward(a, NULL, NULL, tok, tgt, NULL, NULL, 2, 8, 1.0f), 0);
		T_EQ_INT(rl_model_backward(a, dlp, NULL), 0);
		T_EQ_INT(rl_model_step(a, &hp, &norm), 0);
		T_OK(norm > 0 && isfinite(norm), "grad norm %g", norm);
		a->version = s;   /* the trainer's step names the directory */
		T_EQ_INT(rl_ckpt_save(a, root, 1, path, sizeof path), 0);
		T_EQ_INT(rl_ckpt_latest(root, latest, sizeof latest), 0);
		T_EQ_STR(latest, path);
	}
	T_EQ_INT(rl_ckpt_save(a, root, 1, NULL, 0), RL_EEXIST);
	T_OK(strstr(latest, "step-00000002") != NULL, "latest is %s", latest);
	/* the same version built in memory (rl-train --ckpt-every): the very bytes
	 * of the directory's weight files, and no trainer state */
	{
		rl_wver *v = NULL, *d = NULL;
		T_EQ_INT(rl_wver_from_ckpt(&v, a, 2), 0);
		T_EQ_INT(rl_wver_read_dir(&d, latest, 2), 0);
		if (v != NULL && d != NULL) {
			T_EQ_INT(v->nblobs, d->nblobs);
			T_OK(rl_wver_find(v, "model.safetensors") != NULL && rl_wver_find(v, "config.json") != NULL,
			    "weights and config in memory");
			for (int i = 0; i < d->nblobs; i++) {
				const rl_wblob *x = &d->blobs[i], *y = rl_wver_find(v, x->name);
				T_OK(y != NULL && y->size == x->size && memcmp(y->data, x->data, x->size) == 0,
				    "blob '%s' differs from the file", x->name);
			}
			T_OK(v->hash == d->hash, "version hashes differ");
		}
		rl_wver_destroy(v);
		rl_wver_destroy(d);
	}
	rl_model_close(b);
	b = NULL;
	T_EQ_INT(rl_model_open(&b, latest, o), 0);
	if (b != NULL) {
		T_EQ_INT(b->cfg.dtype, RL_BF16);
		T_OK(!same_params(a, b, RL_MODEL_PARAM), "bf16 checkpoint kept f32 weights?");
		T_EQ_INT(rl_model_train_reserve(b, 16), 0);
		T_EQ_INT(rl_ckpt_load_optimizer(b, latest), 0);
		T_EQ_INT(b->step, 2);
		T_OK(same_params(a, b, RL_MODEL_PARAM), "params differ");
		T_OK(same_params(a, b, RL_MODEL_ADAM_M), "adam m differs");
		T_OK(same_params(a, b, RL_MODEL_ADAM_V), "adam v differs");
		/* resumed training takes the identical step */
		for (rl_model *x = a;; x = b) {
			T_EQ_INT(rl_model_forward(x, NULL, NULL, tok, tgt, NULL, NULL, 2, 8, 1.0f), 0);
			T_EQ_INT(rl_model_backward(x, dlp, NULL), 0);
			T_EQ_INT(rl_model_step(x, &hp, NULL), 0);
			if (x == b)
				break;
		}
		T_OK(same_params(a, b, RL_MODEL_PARAM), "resumed step differs");
	}
	rl_model_close(a);
	rl_model_close(b);
	rl_model_close(c2);
	a = b = NULL;

	/* GPT-2 init: residual projections std 0.02/sqrt(2L) */
	T_EQ_INT(rl_model_init_random(&a, &g, o, 7), 0);
	if (a != NULL) {
		int i = rl_ttable_find(&a->tt, "transformer.h.2.mlp.c_proj.weight");
		size_t n = a->tt.t[i].n;
		float *x = rl_xmalloc(n * 4);
		double s2 = 0;
		rl_model_get(a, i, RL_MODEL_PARAM, x);
		for (size_t j = 0; j < n; j++)
			s2 += (double)x[j] * x[j];
		T_CLOSE(sqrt(s2 / n), 0.02 / sqrt(8.0), 0.0005, 0);
		free(x);
		snprintf(path, sizeof path, "%s/gpt2-random", tmpd);
		T_EQ_INT(rl_model_save(a, path), 0);
		rl_model_close(b);
		b = NULL;
		T_EQ_INT(rl_model_open(&b, path, o), 0);
		if (b != NULL)
			T_OK(same_params(a, b, RL_MODEL_PARAM), "gpt2 random differs after save/load");
	}
	rl_model_close(a);
	rl_model_close(b);
}

/* rl_ckpt_part with the tensors put last to first, each twice, the other
 * parts' tensors too (nothing for them): the files rl_ckpt_part_files
 * builds in table order, byte for byte; one tensor left out: refused, named. */
static void
test_part_any_order(rl_ops *o, const char *fixture)
{
	char src[256], err[512];
	rl_model *m = NULL;

	snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
	T_EQ_INT(rl_model_open(&m, src, o), 0);
	if (m == NULL)
		return;
	for (int part = 0; part < 3; part++) {
		rl_ckpt_file *ref = NULL, *got = NULL;
		rl_ckpt_part *p = NULL;
		int nref = 0, ngot = 0, rv;

		T_EQ_INT(rl_ckpt_part_files(&ref, &nref, m, part, 3), 0);
		T_EQ_INT(rl_ckpt_part_open(&p, m, part, 3), 0);
		if (p == NULL || ref == NULL)
			break;
		for (int i = m->tt.n - 1; i >= 0; i--) {
			T_EQ_INT(rl_ckpt_part_put(p, i), 0);
			T_EQ_INT(rl_ckpt_part_put(p, i), 0);
		}
		T_EQ_INT(rl_ckpt_part_finish(p, &got, &ngot), 0);
		T_EQ_INT(ngot, nref);
		T_OK(nref >= (part == 0 ? 3 : 1), "%s part %d: %d files", fixture, part, nref);
		for (int k = 0; k < nref && k < ngot; k++) {
			T_EQ_STR(got[k].name, ref[k].name);
			T_OK(got[k].size == ref[k].size && memcmp(got[k].data, ref[k].data, ref[k].size) == 0,
			    "%s part %d: %s differs from rl_ckpt_part_files'", fixture, part, ref[k].name);
		}
		rl_ckpt_files_free(got, ngot);
		rl_ckpt_part_close(p);
		/* the part's first tensor (the one before it in the table is another
		 * part's, or none) left out */
		p = NULL;
		T_EQ_INT(rl_ckpt_part_open(&p, m, part, 3), 0);
		if (p == NULL) {
			rl_ckpt_files_free(ref, nref);
			break;
		}
		/* the part's first tensor in the table: the first whose name is in
		 * the header of the reference's part file */
		int first = -1;
		uint64_t hl = 0;
		for (int b = 7; b >= 0; b--)
			hl = hl << 8 | ref[0].data[b];
		for (int i = 0; i < m->tt.n && first < 0 && 8 + hl <= ref[0].size; i++) {
			char key[300];
			snprintf(key, sizeof key, "\"%s\"", m->tt.t[i].name);
			if (memmem(ref[0].data + 8, hl, key, strlen(key)) != NULL)
				first = i;
		}
		T_OK(first >= 0, "%s part %d: no tensor of the part found", fixture, part);
		for (int i = 0; i < m->tt.n; i++)
			if (i != first)
				T_EQ_INT(rl_ckpt_part_put(p, i), 0);
		got = NULL;
		ngot = 0;
		T_CAPTURE(rl_ckpt_part_finish(p, &got, &ngot), &rv, err);
		T_EQ_INT(rv, RL_EINVAL);
		T_OK(got == NULL && ngot == 0, "a part left incomplete handed over files");
		T_OK(first >= 0 && strstr(err, m->tt.t[first].name) != NULL && strstr(err, "never encoded") != NULL,
		    "the error does not name the tensor: %s", err);
		rl_ckpt_part_close(p);
		rl_ckpt_files_free(ref, nref);
	}
	rl_model_close(m);
}

/* rl_ckpt_part's whole version (part 0 of 0), tensors put last to first:
 * rl_ckpt_weight_files' files, names, order and bytes; a tensor left out
 * refused by name; a part past 0 of 0 refused. */
static void
test_whole_any_order(rl_ops *o, const char *fixture)
{
	char src[256], err[512];
	rl_model *m = NULL;
	rl_ckpt_file *ref = NULL, *got = NULL;
	rl_ckpt_part *p = NULL;
	int nref = 0, ngot = 0, rv;

	snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
	T_EQ_INT(rl_model_open(&m, src, o), 0);
	if (m == NULL)
		return;
	T_EQ_INT(rl_ckpt_weight_files(&ref, &nref, m), 0);
	T_EQ_INT(rl_ckpt_part_open(&p, m, 0, 0), 0);
	if (p == NULL || ref == NULL)
		goto out;
	for (int i = m->tt.n - 1; i >= 0; i--)
		T_EQ_INT(rl_ckpt_part_put(p, i), 0);
	T_EQ_INT(rl_ckpt_part_finish(p, &got, &ngot), 0);
	T_EQ_INT(ngot, nref);
	T_OK(nref >= 3, "%s: %d files in the whole version", fixture, nref);
	for (int k = 0; k < nref && k < ngot; k++) {
		T_EQ_STR(got[k].name, ref[k].name);
		T_OK(got[k].size == ref[k].size && memcmp(got[k].data, ref[k].data, ref[k].size) == 0,
		    "%s: %s differs from rl_ckpt_weight_files'", fixture, ref[k].name);
	}
	rl_ckpt_files_free(got, ngot);
	got = NULL;
	ngot = 0;
	rl_ckpt_part_close(p);
	p = NULL;
	/* the last tensor of model.safetensors never put */
	T_EQ_INT(rl_ckpt_part_open(&p, m, 0, 0), 0);
	if (p == NULL)
		goto out;
	for (int i = 0; i < m->tt.n - 1; i++)
		T_EQ_INT(rl_ckpt_part_put(p, i), 0);
	T_CAPTURE(rl_ckpt_part_finish(p, &got, &ngot), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(got == NULL && ngot == 0, "a whole version left incomplete handed over files");
	T_OK(strstr(err, m->tt.t[m->tt.n - 1].name) != NULL && strstr(err, "never encoded") != NULL,
	    "the error does not name the tensor: %s", err);
	rl_ckpt_part_close(p);
	p = NULL;
	T_CAPTURE(rl_ckpt_part_open(&p, m, 1, 0), &rv, err);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(p == NULL, "part 1 of 0 opened");
out:
	rl_ckpt_part_close(p);
	rl_ckpt_files_free(ref, nref);
	rl_model_close(m);
}

int
main(void)
{
	rl_ops *o = NULL;
	char cmd[128];

	T_BEGIN("test_ckpt");
	if (access("tests/fixtures/qwen2/config.json", R_OK) != 0)
		T_SKIP("run from the repository root (tests/fixtures missing)");
	if (mkdtemp(tmpd) == NULL)
		T_SKIP("no temporary directory");
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	round_trip(o, "qwen2_tied", "q2t");
	round_trip(o, "qwen2", "q2");
	round_trip(o, "qwen3", "q3");
	round_trip(o, "gpt2", "g2");
	round_trip(o, "llama", "ll"); /* two f16 shards in, one f16 file out */
	round_trip(o, "llama3", "l3"); /* rope_scaling "llama3": the saved config keeps it */
	round_trip(o, "mistral", "mi"); /* sliding_window and max_position_embeddings kept */
	round_trip(o, "gemma3", "ge"); /* the sandwich norms, layer_types, Gemma3ForCausalLM */
	test_snap(o);
	/* What HF would load: the PyTorch reference, reading parameters by their HF
	 * names and layouts only, reproduces the fixtures' logits from what we saved. */
	if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0) {
		char py[1024];
		snprintf(py, sizeof py, "/usr/bin/python3 tests/fixtures/check_saved.py qwen2_tied=%s/q2t "
		    "qwen2=%s/q2 qwen3=%s/q3 gpt2=%s/g2 llama=%s/ll llama3=%s/l3 mistral=%s/mi "
		    "qwen2=%s/snap/step-00000001", tmpd, tmpd, tmpd, tmpd, tmpd, tmpd, tmpd, tmpd);
		T_EQ_INT(system(py), 0);
	} else {
		printf("test_ckpt: no PyTorch at /usr/bin/python3; HF layout check by the reference skipped\n");
	}
	test_side_files(o);
	test_random_and_optimizer(o);
	test_part_any_order(o, "qwen2_tied"); /* bf16 */
	test_part_any_order(o, "llama");      /* f16 */
	test_whole_any_order(o, "qwen2_tied"); /* bf16 */
	test_whole_any_order(o, "llama");      /* f16 */
	test_whole_any_order(o, "gpt2");       /* f32, Conv1D transposed in the file */
	rl_ops_close(o);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpd);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpd);
	T_END();
}

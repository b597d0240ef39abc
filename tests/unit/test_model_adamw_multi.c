/*
 * test_model_adamw_multi.c — rl_model_step through the optional adamw_multi op (ops.h)
 * gives the same parameters and moments, bit for bit, as its loop over adamw: a CPU
 * backend whose adamw_multi runs the CPU adamw on each segment (with the segment's lr
 * and wd class), against the plain CPU backend (adamw_multi NULL: the model's loop).
 * A tiny Qwen2 (decayed projections, undecayed norms, fused q|k|v and gate|up views)
 * with a value head (RL_T_AUX: its own learning rate), two steps with clipping.  So the
 * model's segment table (offsets, sizes, classes and the lr/wd of each class) is checked
 * on every `make check`; the CUDA op itself is checked against adamw in test_cuda_ops.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "base/rng.h"
#include "t.h"

#define B 2
#define T 6
#define N (B * T)

static const char cfg_json[] =
    "{\"model_type\":\"qwen2\",\"vocab_size\":37,\"hidden_size\":24,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":40,"
    "\"max_position_embeddings\":32,\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";

static int calls, last_nseg, bad_cls;

/* adamw_multi on the CPU: adamw per segment */
static void
multi(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v, const rl_adamw_seg *seg,
    int nseg, const float *lr, const float *wd, float b1, float b2, float eps, int t, float grad_scale)
{
	calls++;
	last_nseg = nseg;
	for (int s = 0; s < nseg; s++) {
		if (seg[s].cls < 0 || seg[s].cls >= RL_ADAMW_NCLS) {
			bad_cls++;
			continue;
		}
		o->adamw(o, param + seg[s].off, wcopy ? (float *)wcopy + seg[s].off : NULL, grad + seg[s].off,
		    m + seg[s].off, v + seg[s].off, seg[s].n, lr[seg[s].cls], b1, b2, eps, wd[seg[s].cls], t,
		    grad_scale);
	}
}

static rl_model *
model(rl_ops *o, const rl_config *cfg)
{
	rl_model *m = NULL;
	if (rl_model_init_random(&m, cfg, o, 3) != 0 || rl_model_add_value_head(m, NULL, 4) != 0 ||
	    rl_model_train_reserve(m, N) != 0) {
		rl_model_close(m);
		return NULL;
	}
	return m;
}

int
main(void)
{
	rl_ops *a = NULL, *b = NULL;
	rl_config cfg = { 0 };
	rl_model *ma = NULL, *mb = NULL;
	int32_t tok[N], tgt[N];
	float dlp[N], dval[N];

	T_BEGIN("test_model_adamw_multi");
	T_EQ_INT(rl_ops_cpu_open(&a), 0);
	T_EQ_INT(rl_ops_cpu_open(&b), 0);
	T_EQ_INT(rl_config_parse(&cfg, cfg_json, strlen(cfg_json), "config"), 0);
	if (!a || !b)
		T_END();
	T_OK(a->adamw_multi == NULL, "the CPU backend has no adamw_multi");
	b->adamw_multi = multi;
	ma = model(a, &cfg);
	mb = model(b, &cfg);
	T_OK(ma && mb, "models");
	if (!ma || !mb)
		goto out;
	for (int n = 0; n < N; n++) {
		tok[n] = (int32_t)(rl_rng_uniform(21, (uint64_t)n) * cfg.vocab_size);
		tgt[n] = n % T == T - 1 ? -1 : (int32_t)(rl_rng_uniform(22, (uint64_t)n) * cfg.vocab_size);
		dlp[n] = tgt[n] < 0 ? 0 : (float)(2 * rl_rng_uniform(23, (uint64_t)n) - 1);
		dval[n] = (float)(2 * rl_rng_uniform(24, (uint64_t)n) - 1);
	}
	/* aux_lr != lr: the value head's class; weight decay on the projections only */
	rl_adamw hp = { .lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
		.max_grad_norm = 0.5f, .aux_lr = 7e-3f };
	for (int k = 0; k < 2; k++) {
		float na = 0, nb = 0;
		rl_model *ms[2] = { ma, mb };
		for (int j = 0; j < 2; j++) {
			T_EQ_INT(rl_model_forward(ms[j], NULL, NULL, tok, tgt, NULL, NULL, B, T, 1.0f), 0);
			T_EQ_INT(rl_model_backward_value(ms[j], dlp, NULL, dval), 0);
		}
		T_EQ_INT(rl_model_step(ma, &hp, &na), 0);
		T_EQ_INT(rl_model_step(mb, &hp, &nb), 0);
		T_OK(na == nb && na > 0, "step %d: grad norms %g and %g", k + 1, na, nb);
	}
	T_EQ_INT(calls, 2);
	T_EQ_INT(last_nseg, ma->tt.n);
	T_EQ_INT(bad_cls, 0);
	int differ = 0, moved = 0;
	for (int i = 0; i < ma->tt.n; i++) {
		const rl_tensor *t = &ma->tt.t[i];
		float *x = rl_xmalloc(t->n * 4), *y = rl_xmalloc(t->n * 4), *p0 = rl_xmalloc(t->n * 4);
		for (int kind = RL_MODEL_PARAM; kind <= RL_MODEL_ADAM_V; kind++) {
			if (kind == RL_MODEL_GRAD)
				continue;
			rl_model_get(ma, i, kind, x);
			rl_model_get(mb, i, kind, y);
			if (memcmp(x, y, t->n * 4) != 0) {
				if (!differ++)
					printf("# %s (kind %d) differs\n", t->name, kind);
			}
		}
		/* every tensor took a step (a segment left out would keep its parameters) */
		rl_model *m0 = NULL;
		if (rl_model_init_random(&m0, &cfg, a, 3) == 0 && rl_model_add_value_head(m0, NULL, 4) == 0) {
			rl_model_get(m0, i, RL_MODEL_PARAM, p0);
			rl_model_get(mb, i, RL_MODEL_PARAM, y);
			moved += memcmp(p0, y, t->n * 4) != 0;
		}
		rl_model_close(m0);
		free(x);
		free(y);
		free(p0);
	}
	T_OK(differ == 0, "%d tensors differ between adamw_multi and the loop over adamw", differ);
	T_OK(moved == ma->tt.n, "%d of %d tensors updated", moved, ma->tt.n);
	printf("%s %d tensors, 2 steps: adamw_multi %s the loop's bits\n", differ ? "FAIL" : "ok  ", ma->tt.n,
	    differ ? "does not give" : "gives");
out:
	rl_model_close(ma);
	rl_model_close(mb);
	rl_config_fini(&cfg);
	rl_ops_close(a);
	rl_ops_close(b);
	T_END();
}

/*
 * ckpt_snap.c — a copy of a model's weights that another thread writes as a
 * checkpoint directory (rl_ckpt_save without the optimizer) while the model
 * trains on: rl-train's background publishing (docs/train.md).  Host
 * weights only (the CPU backend) and no LoRA adapters: a GPU's weights
 * would need a device-to-host copy on a stream of their own, adapters their
 * own tensors; RL_ENOTSUP says the caller saves in place instead.
 * Leaves out: the optimizer state (full checkpoints are written in place).
 */
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "compute/ops.h"
#include "model/ckpt.h"

struct rl_ckpt_snap {
	rl_model view; /* the model's description, its weights the copy's */
	rl_ops *ops;   /* a CPU backend of its own: the model's keeps the
	                * training passes' error state, which reading clears */
	float *buf;
	size_t n;
};

int
rl_ckpt_snap_ok(const rl_model *m)
{
	return m->cpu && m->lora == NULL && m->param_need == NULL && m->part_set == NULL;
}

int
rl_ckpt_snap_take(rl_ckpt_snap **sp, rl_model *m)
{
	rl_ckpt_snap *s = *sp;
	int rv;

	if (!rl_ckpt_snap_ok(m))
		return RL_ENOTSUP;
	if (s == NULL) {
		if ((s = rl_try_calloc(1, sizeof *s, "weights snapshot")) == NULL)
			return RL_ENOMEM;
		*sp = s;
	}
	if (s->ops == NULL && (rv = rl_ops_cpu_open(&s->ops)) != 0)
		return rv;
	if (s->n != m->tt.total) {
		free(s->buf);
		s->n = 0;
		if ((s->buf = rl_try_malloc(m->tt.total * sizeof(float), "weights snapshot")) == NULL)
			return RL_ENOMEM;
		s->n = m->tt.total;
	}
	memcpy(s->buf, m->params, s->n * sizeof(float));
	/* the description is shared read-only (tensor table, config, source
	 * directory: the model does not change them while it trains); what the
	 * training passes write is left out */
	s->view = *m;
	s->view.ops = s->ops;
	s->view.params = s->buf;
	s->view.w = m->w == (void *)m->params ? (void *)s->buf : NULL;
	s->view.grads = s->view.m = s->view.v = s->view.gsink = NULL;
	s->view.lp = s->view.ent = s->view.val = NULL;
	s->view.logits = NULL;
	s->view.act = NULL;
	s->view.inf = NULL;
	s->view.grad_ready = NULL;
	s->view.part_master = NULL;
	return RL_OK;
}

rl_model *
rl_ckpt_snap_model(rl_ckpt_snap *s)
{
	return &s->view;
}

int
rl_ckpt_snap_save(rl_ckpt_snap *s, const char *root, char *path, size_t len)
{
	return rl_ckpt_save(&s->view, root, 0, path, len);
}

void
rl_ckpt_snap_free(rl_ckpt_snap *s)
{
	if (s == NULL)
		return;
	rl_ops_close(s->ops);
	free(s->buf);
	free(s);
}

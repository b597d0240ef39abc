/*
 * score.c — score mode (rl_rollout_score): each record's response tokens
 * scored under the model, the log-probs written into a per-token f32 field;
 * nothing is generated and the records are otherwise copied.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/core.h"
#include "base/io.h"
#include "rollout/rollout_int.h"

int
rli_run_score(gen *g)
{
	FILE *in = NULL;
	rl_traj_reader *rd = NULL;
	rl_traj *t;
	int rv, tag, T = g->m->cfg.max_pos;
	int32_t *tok = NULL, *tgt = NULL;
	float *lp = NULL, *vals = NULL;
	uint64_t n = 0;

	tag = rl_traj_tag_parse(g->o.score_field);
	if (tag < 0) {
		unsigned u;
		char c;
		if (sscanf(g->o.score_field, "t%u%c", &u, &c) != 1 || u == 0 || u > RL_TAG_MAX) {
			rl_error("unknown field '%s' for --score", g->o.score_field);
			rl_hint("use logprobs, ref_logprobs or t<tag number>");
			return RL_EINVAL;
		}
		tag = (int)u;
	}
	if (tag <= RL_TAG_CORE_MAX) {
		int scalar = 1, dt = rl_traj_tag_dtype((unsigned)tag, &scalar);
		if (dt != RL_F32 || scalar) {
			rl_error("--score %s: not a per-token f32 field; the log-probs would replace it", g->o.score_field);
			rl_hint("use logprobs, ref_logprobs or a user tag t<N> with N >= %d", RL_TAG_USER_MIN);
			return RL_EINVAL;
		}
	}
	if ((rv = rl_model_train_reserve(g->m, T)) != 0)
		return rv;
	/* T is the model's context: from its config.json */
	if (!(tok = rl_try_calloc((size_t)T, 4, "score buffers")) || !(tgt = rl_try_calloc((size_t)T, 4, "score buffers")) ||
	    !(lp = rl_try_calloc((size_t)T, 4, "score buffers")) || !(vals = rl_try_calloc((size_t)T, 4, "score buffers"))) {
		rv = RL_ENOMEM;
		goto out;
	}
	if ((rv = rl_io_fopen(&in, g->o.input, "rb")) != 0 ||
	    (rv = rl_traj_reader_open_file(&rd, in, g->o.input, NULL)) != 0)
		goto out;
	for (;;) {
		const int32_t *p, *r;
		size_t np, nr;
		float temp = 1.0f;
		if ((rv = rl_traj_reader_next(rd, &t)) != 0)
			goto out;
		if (!t)
			break;
		n++;
		if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &p, &np) != RL_OK ||
		    rl_traj_get_i32s(t, RL_TAG_RESPONSE, &r, &nr) != RL_OK || np == 0) {
			rl_error("'%s': record %llu: no prompt and response token ids to score", g->o.input,
			    (unsigned long long)n);
			rv = RL_EFORMAT;
			goto out;
		}
		if ((int)(np + nr) > T) {
			rl_error("'%s': record %llu: %zu tokens exceed the model's context of %d", g->o.input,
			    (unsigned long long)n, np + nr, T);
			rv = RL_ETOOBIG;
			goto out;
		}
		for (size_t k = 0; k < np + nr; k++) {
			int32_t id = k < np ? p[k] : r[k - np];
			if (id < 0 || id >= g->m->cfg.vocab_size) {
				rl_error("'%s': record %llu: token id %d at '%s' index %zu is outside the vocabulary "
				    "(0..%d)", g->o.input, (unsigned long long)n, id, k < np ? "prompt" : "response",
				    k < np ? k : k - np, g->m->cfg.vocab_size - 1);
				rv = RL_EFORMAT;
				goto out;
			}
		}
		if (rl_traj_get_f32(t, RL_TAG_TEMPERATURE, &temp) != RL_OK || !(temp > 0))
			temp = 1.0f;
		int L = (int)(np + nr) - 1;
		for (int i = 0; i < L; i++) {
			tok[i] = i < (int)np ? p[i] : r[i - np];
			int j = i - ((int)np - 1);
			tgt[i] = j >= 0 && j < (int)nr ? r[j] : -1;
		}
		if (nr > 0) {
			if ((rv = rl_model_forward(g->m, lp, NULL, tok, tgt, NULL, NULL, 1, L, temp)) != 0)
				goto out;
			for (size_t j = 0; j < nr; j++)
				vals[j] = lp[np - 1 + j];
		}
		rl_traj *c = NULL;
		if ((rv = rl_traj_dup(&c, t)) != 0)
			goto out;
		if ((rv = rl_traj_set_f32s(c, (unsigned)tag, vals, nr)) == RL_OK)
			rv = rl_traj_writer_put(g->w, c);
		rl_traj_destroy(c);
		if (rv)
			goto out;
	}
	rv = rl_traj_writer_flush(g->w);
	if (!g->o.quiet)
		rl_info("%llu records scored into '%s'", (unsigned long long)n, g->o.score_field);
out:
	rl_traj_reader_close(rd);
	if (in && in != stdin)
		fclose(in);
	free(tok);
	free(tgt);
	free(lp);
	free(vals);
	return rv;
}
/* test_engine.c — the generation engine against the model's own forward passes:
 * - greedy decoding equals repeated argmax over a fresh full prefill of the
 *   sequence so far (the "train/inference mismatch" check, on fp32 CPU);
 * - every recorded log-prob equals the training forward's log-prob of that
 *   token at the sampling temperature (tolerance 2e-5 absolute: fp32 sums in
 *   different orders over a vocabulary of ~300);
 * - the same seed gives the same samples whatever else is in the batch; the
 *   samples of a group differ at temperature 1;
 * - finish reasons: EOS (as a stop id here), max tokens, the model's context;
 * - the decode step through rl_model_decode_sample (one packed upload, the
 *   default) gives the same samples bit for bit as rl_model_decode +
 *   ops->sample (RL_DECODE_LEGACY=1) on a workload where sequences finish and
 *   are admitted at different steps (engine_mix.h);
 * - first tokens of 4000 samples follow softmax(logits / T) cut to top-k then
 *   top-p (5 standard deviations a token), log-probs uncut;
 * - a prompt longer than the prefill packing budget is generated (alone);
 * - admission reserves exactly the blocks a group can fill;
 * - multi-step decoding (decode_steps 4 and 7: the tokens fed back on the
 *   backend, rl_model_decode_multi) gives the samples of one step at a time,
 *   with sequences that stop inside the steps and, with fewer slots than
 *   sequences, requests that wait for a slot. */
#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "rollout/engine.h"
#include "model/model.h"
#include "t.h"
#include "engine_mix.h"

#define MAXS 64
typedef struct out {
	int n[MAXS], finish[MAXS], index[MAXS], vf[MAXS], vl[MAXS];
	int32_t tok[MAXS][64];
	float lp[MAXS][64];
	void *user[MAXS];
	int count;
} out;

static int
collect(void *ctx, const rl_gen_sample *s)
{
	out *o = ctx;
	int k = o->count++;
	o->n[k] = s->n;
	o->finish[k] = s->finish;
	o->index[k] = s->index;
	o->user[k] = s->user;
	o->vf[k] = s->ver_first;
	o->vl[k] = s->ver_last;
	memcpy(o->tok[k], s->tok, sizeof(int32_t) * (size_t)s->n);
	memcpy(o->lp[k], s->logp, sizeof(float) * (size_t)s->n);
	return 0;
}

static void
run(rl_engine *e, out *o)
{
	int guard = 0;
	while ((rl_engine_active(e) || rl_engine_waiting(e)) && guard++ < 10000)
		if (rl_engine_step(e, collect, o) != 0)
			break;
}

/* the sample of (user, index) in o */
static int
find(const out *o, void *user, int index)
{
	for (int k = 0; k < o->count; k++)
		if (o->user[k] == user && o->index[k] == index)
			return k;
	return -1;
}

int
main(void)
{
	rl_config cfg = { 0 };
	rl_ops *ops;
	rl_model *m;
	rl_engine *e;
	rl_gen_opts go;
	static out o1, o2;
	int32_t pa[] = { 5, 17, 99, 3, 42 }, pb[] = { 7, 7, 7 };

	T_BEGIN("test_engine");
	rl_log_init("test_engine", RL_LOG_QUIET);
	cfg = (rl_config){
		.arch = RL_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 48, .n_layer = 2, .n_head = 4,
		.n_kv_head = 2, .head_dim = 12, .intermediate_size = 96, .max_pos = 40, .rope_theta = 10000,
		.norm_eps = 1e-6f, .qkv_bias = 1, .tie_embeddings = 1, .bos_id = -1, .eos_id = -1,
		.dtype = RL_F32 };
	snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
	T_EQ_INT(rl_ops_cpu_open(&ops), RL_OK);
	/* larger init so the distribution is not flat and greedy ties are unlikely */
	T_EQ_INT(rl_model_init_random(&m, &cfg, ops, 7), RL_OK);
	mix_sharpen(m, 3.0f);

	/* ---- greedy == repeated argmax of a full prefill ---- */
	rl_gen_opts_default(&go);
	go.slots = 8;
	go.kv_mem = 1 << 20;
	go.block_size = 4;
	go.max_new = 12;
	go.sp.temperature = 0;
	T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
	T_EQ_INT(rl_engine_submit(e, pa, 5, 1, 0, 0, 1, (void *)1), RL_OK);
	T_EQ_INT(rl_engine_submit(e, pb, 3, 2, 0, 0, 2, (void *)2), RL_OK);
	run(e, &o1);
	T_EQ_INT(o1.count, 3);
	rl_engine_destroy(e);
	{
		int k = find(&o1, (void *)1, 0);
		T_OK(k >= 0);
		T_EQ_INT(o1.n[k], 12);
		T_EQ_INT(o1.finish[k], RL_FINISH_LENGTH);
		/* naive greedy: fresh cache, prefill everything so far, argmax */
		rl_kvcache *kv;
		int32_t seqt[64];
		float *logits = malloc(sizeof(float) * 300);
		int n = 5, mism = 0;
		memcpy(seqt, pa, sizeof pa);
		T_EQ_INT(rl_kvcache_open(&kv, ops, &cfg, 1 << 20, 4), RL_OK);
		for (int step = 0; step < 12; step++) {
			rl_kvseq s;
			rl_kvseq *sp = &s;
			const int32_t *tp = seqt;
			rl_kvseq_init(&s, kv);
			T_EQ_INT(rl_model_prefill(m, kv, &sp, &tp, &n, 1, logits), RL_OK);
			rl_kvcache_release(kv, &s);
			int best = 0;
			for (int v = 1; v < 300; v++)
				if (logits[v] > logits[best])
					best = v;
			mism += best != o1.tok[k][step];
			seqt[n++] = best;
		}
		T_EQ_INT(mism, 0);
		rl_kvcache_close(kv);
		free(logits);
		/* the two greedy samples of a group are identical */
		int a = find(&o1, (void *)2, 0), b = find(&o1, (void *)2, 1);
		T_OK(a >= 0 && b >= 0 && memcmp(o1.tok[a], o1.tok[b], sizeof(int32_t) * 12) == 0);
	}

	/* ---- sampled: log-probs equal the training forward's at the same temperature ---- */
	go.sp.temperature = 0.7f;
	go.max_new = 20;
	T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
	memset(&o2, 0, sizeof o2);
	T_EQ_INT(rl_engine_submit(e, pa, 5, 4, 0, 0, 11, (void *)1), RL_OK);
	run(e, &o2);
	rl_engine_destroy(e);
	T_EQ_INT(o2.count, 4);
	T_EQ_INT(rl_model_train_reserve(m, 64), RL_OK);
	{
		int differ = 0;
		double maxd = 0;
		for (int k = 0; k < o2.count; k++) {
			int32_t tok[64], tgt[64];
			float lp[64];
			int L = 5 + o2.n[k] - 1;
			for (int t = 0; t < L; t++) {
				tok[t] = t < 5 ? pa[t] : o2.tok[k][t - 5];
				tgt[t] = t >= 4 ? o2.tok[k][t - 4] : -1;
			}
			T_EQ_INT(rl_model_forward(m, lp, NULL, tok, tgt, NULL, NULL, 1, L, 0.7f), RL_OK);
			for (int j = 0; j < o2.n[k]; j++)
				maxd = fmax(maxd, fabs(lp[4 + j] - o2.lp[k][j]));
			if (k > 0 && memcmp(o2.tok[k], o2.tok[0], sizeof(int32_t) * 5) != 0)
				differ++;
		}
		T_OK(maxd < 2e-5, "max |lp_engine - lp_train| = %g", maxd);
		T_OK(differ >= 2, "only %d of 3 samples differ from sample 0", differ);
	}

	/* ---- same seed, same sample, whatever the batch around it ---- */
	{
		static out o3;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
		T_EQ_INT(rl_engine_submit(e, pb, 3, 3, 0, 0, 99, (void *)5), RL_OK);
		T_EQ_INT(rl_engine_submit(e, pa, 5, 4, 0, 0, 11, (void *)1), RL_OK);
		run(e, &o3);
		rl_engine_destroy(e);
		for (int i = 0; i < 4; i++) {
			int a = find(&o2, (void *)1, i), b = find(&o3, (void *)1, i);
			T_OK(a >= 0 && b >= 0 && o2.n[a] == o3.n[b] &&
			    memcmp(o2.tok[a], o3.tok[b], sizeof(int32_t) * (size_t)o2.n[a]) == 0, "sample %d", i);
		}
	}

	/* ---- finish reasons: a stop id (EOS), the context limit ---- */
	{
		static out o4;
		int32_t stop = o1.tok[find(&o1, (void *)1, 0)][3]; /* greedy emits it at step 3 */
		go.sp.temperature = 0;
		go.max_new = 64;
		go.eos_id = stop;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
		T_EQ_INT(rl_engine_submit(e, pa, 5, 1, 0, 0, 1, (void *)1), RL_OK);
		run(e, &o4);
		T_EQ_INT(o4.count, 1);
		T_EQ_INT(o4.finish[0], RL_FINISH_EOS);
		int first = 0;
		while (o1.tok[find(&o1, (void *)1, 0)][first] != stop)
			first++;
		T_EQ_INT(o4.n[0], first + 1); /* the EOS is part of the response */
		/* a prompt filling the context is refused; one that nearly does ends by length */
		int32_t longp[40] = { 0 };
		T_EQ_INT(rl_engine_submit(e, longp, 40, 1, 0, 0, 1, NULL), RL_ETOOBIG);
		go.eos_id = -1;
		rl_engine_destroy(e);
		static out o5;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
		T_EQ_INT(rl_engine_submit(e, longp, 35, 1, 0, 0, 1, (void *)3), RL_OK);
		run(e, &o5);
		T_EQ_INT(o5.count, 1);
		T_EQ_INT(o5.finish[0], RL_FINISH_LENGTH);
		T_EQ_INT(o5.n[0], 5);
		/* a group larger than the slots is refused with a hint */
		T_EQ_INT(rl_engine_submit(e, pa, 5, 9, 0, 0, 1, NULL), RL_ETOOBIG);
		rl_engine_destroy(e);
	}
	/* ---- a prompt longer than the prefill packing budget: prefilled alone, the
	 * buffers grown to it, the same samples as with a budget that holds it (not
	 * refused while the model's context holds it) ---- */
	{
		rl_gen_opts go2;
		static out big, small;
		int32_t lp[22];
		for (int i = 0; i < 22; i++)
			lp[i] = (i * 37 + 5) % 300;
		for (int k = 0; k < 2; k++) {
			out *o = k ? &small : &big;
			rl_gen_opts_default(&go2);
			go2.slots = 6;
			go2.kv_mem = 1 << 20;
			go2.block_size = 4;
			go2.max_new = 10;
			go2.sp.temperature = 0.9f;
			go2.max_prefill_tokens = k ? 8 : 4096;
			T_EQ_INT(rl_engine_create(&e, m, NULL, &go2), RL_OK);
			T_EQ_INT(rl_engine_submit(e, pa, 5, 2, 0, 0, 31, (void *)1), RL_OK);
			T_EQ_INT(rl_engine_submit(e, lp, 22, 2, 0, 0, 32, (void *)2), RL_OK);
			T_EQ_INT(rl_engine_submit(e, pb, 3, 1, 0, 0, 33, (void *)3), RL_OK);
			run(e, o);
			rl_engine_destroy(e);
		}
		T_EQ_INT(small.count, 5);
		int same = big.count == small.count;
		for (int k = 0; k < big.count && same; k++) {
			int j = find(&small, big.user[k], big.index[k]);
			same = j >= 0 && small.n[j] == big.n[k] &&
			    memcmp(small.tok[j], big.tok[k], sizeof(int32_t) * (size_t)big.n[k]) == 0;
		}
		T_OK(same, "a prompt longer than the prefill budget: other samples than with a budget that holds it");
	}
	/* ---- admission reserves what a group can use, no more: a pool of exactly that
	 * many blocks takes the group (not up to two blocks more a sample),
	 * and every sample runs to its limit in it, one step or four at a time ---- */
	{
		rl_gen_opts go2;
		/* a block: 4 tokens x 2 kv heads x 12 x f32, K and V, 2 layers */
		const size_t blk = 4 * 2 * 12 * 4 * 2 * 2;
		int32_t p8[8] = { 9, 8, 7, 6, 5, 4, 3, 2 };
		for (int ds = 1; ds <= 4; ds += 3) {
			static out o;
			memset(&o, 0, sizeof o);
			rl_gen_opts_default(&go2);
			go2.slots = 4;
			go2.block_size = 4;
			go2.max_new = 12;
			go2.sp.temperature = 1.0f;
			go2.decode_steps = ds;
			/* 5 prompt tokens in 2 blocks; each of 4 samples puts 5 + 12 - 1 = 16 tokens in
			 * the cache, 2 blocks more, and 3 of them copy the partly filled block 1: 13 */
			go2.kv_mem = 13 * blk;
			T_EQ_INT(rl_engine_create(&e, m, NULL, &go2), RL_OK);
			T_EQ_INT(rl_engine_submit(e, pa, 5, 3, 1, 0, 41, (void *)1), RL_OK);
			/* 8 prompt tokens (full blocks); 2 samples of 8 + 12 - 1 = 19 tokens: 3 blocks each */
			T_EQ_INT(rl_engine_submit(e, p8, 8, 2, 0, 0, 42, (void *)2), RL_OK);
			/* one sample of 5 + 12 - 1 = 16 tokens, alone in its blocks: 4 */
			T_EQ_INT(rl_engine_submit(e, pa, 5, 1, 0, 0, 43, (void *)3), RL_OK);
			run(e, &o);
			T_EQ_INT(rl_engine_active(e) + rl_engine_waiting(e), 0);
			rl_engine_destroy(e);
			T_EQ_INT(o.count, 7);
			int full = 0;
			for (int k = 0; k < o.count; k++)
				full += o.n[k] == 12 && o.finish[k] == RL_FINISH_LENGTH;
			T_OK(full == 7, "decode_steps %d: %d of 7 samples reached their 12 tokens", ds, full);
		}
		/* one block less cannot hold the first group; 4 blocks hold the single sample */
		go2.kv_mem = 12 * blk;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go2), RL_OK);
		T_EQ_INT(rl_engine_submit(e, pa, 5, 3, 1, 0, 41, (void *)1), RL_ETOOBIG);
		rl_engine_destroy(e);
		go2.kv_mem = 4 * blk;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go2), RL_OK);
		T_EQ_INT(rl_engine_submit(e, pa, 5, 1, 0, 0, 43, (void *)3), RL_OK);
		rl_engine_destroy(e);
	}
	/* ---- the engine draws from the distribution it says: first tokens of 4000 samples
	 * (groups of 40 sharing a prompt, 100 seeds) against softmax(logits / T) cut to the
	 * top-k, then the top-p of those, from a fresh prefill; the recorded log-prob is the
	 * uncut one ---- */
	{
		rl_gen_opts go2;
		static out o;
		enum { G = 40, R = 100 };
		rl_sample_params sp = { 0.7f, 6, 0.8f };
		double pr[300] = { 0 }, cnt[300] = { 0 }, lse = 0, mx = -1e300, tot = 0;
		float *lg = malloc(sizeof(float) * 300);
		rl_kvcache *kv;
		rl_kvseq s, *sq = &s;
		const int32_t *tp = pa;
		int five = 5, idx[300], bad = 0, lpbad = 0;
		T_EQ_INT(rl_kvcache_open(&kv, ops, &cfg, 1 << 20, 4), RL_OK);
		rl_kvseq_init(&s, kv);
		T_EQ_INT(rl_model_prefill(m, kv, &sq, &tp, &five, 1, lg), RL_OK);
		rl_kvcache_release(kv, &s);
		rl_kvcache_close(kv);
		/* the exact rule, written out: sort by weight (ties: lower id), keep k, then
		 * while the mass before a token (over the k) is below p */
		for (int v = 0; v < 300; v++) {
			idx[v] = v;
			mx = fmax(mx, lg[v] / sp.temperature);
		}
		for (int v = 0; v < 300; v++)
			lse += exp(lg[v] / sp.temperature - mx);
		lse = mx + log(lse);
		for (int a = 0; a < 300; a++)
			for (int b = a + 1; b < 300; b++)
				if (lg[idx[b]] > lg[idx[a]] || (lg[idx[b]] == lg[idx[a]] && idx[b] < idx[a])) {
					int t = idx[a];
					idx[a] = idx[b];
					idx[b] = t;
				}
		double ksum = 0, c = 0;
		for (int i = 0; i < sp.top_k; i++)
			ksum += exp(lg[idx[i]] / sp.temperature - lse);
		for (int i = 0; i < sp.top_k && (i == 0 || c < sp.top_p * ksum); i++) {
			pr[idx[i]] = exp(lg[idx[i]] / sp.temperature - lse);
			c += pr[idx[i]];
		}
		for (int v = 0; v < 300; v++)
			pr[v] /= c;
		rl_gen_opts_default(&go2);
		go2.slots = G;
		go2.kv_mem = 1 << 20;
		go2.block_size = 4;
		go2.max_new = 1;
		go2.sp = sp;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go2), RL_OK);
		for (int r = 0; r < R; r++) {
			T_EQ_INT(rl_engine_submit(e, pa, 5, G, 0, 0, 1000 + (uint64_t)r, NULL), RL_OK);
			memset(&o, 0, sizeof o);
			run(e, &o);
			for (int k = 0; k < o.count; k++) {
				int t = o.tok[k][0];
				cnt[t]++;
				tot++;
				lpbad += !(fabs(o.lp[k][0] - (lg[t] / sp.temperature - lse)) < 2e-5);
			}
		}
		rl_engine_destroy(e);
		free(lg);
		T_OK(tot == G * R, "%g samples", tot);
		for (int v = 0; v < 300; v++) {
			double f = cnt[v] / tot, sd = sqrt(pr[v] * (1 - pr[v]) / tot);
			/* 5 standard deviations (by chance ~1e-6 a token); outside the kept set, never */
			bad += pr[v] == 0 ? cnt[v] > 0 : fabs(f - pr[v]) > 5 * sd;
		}
		T_OK(bad == 0, "%d tokens drawn off their probability under T, top-k, top-p", bad);
		T_OK(lpbad == 0, "%d log-probs are not log_softmax(logits / T) of the whole vocabulary", lpbad);
	}
	/* ---- weights changing mid-generation (--partial): first and last versions ---- */
	{
		static out o6;
		go.eos_id = -1;
		go.max_new = 10;
		go.sp.temperature = 1.0f;
		T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
		rl_engine_set_version(e, 3);
		T_EQ_INT(rl_engine_submit(e, pa, 5, 2, 0, 0, 1, (void *)1), RL_OK);
		for (int i = 0; i < 4; i++)
			T_EQ_INT(rl_engine_step(e, collect, &o6), RL_OK);
		rl_engine_set_version(e, 4);
		run(e, &o6);
		rl_engine_destroy(e);
		T_EQ_INT(o6.count, 2);
		T_EQ_INT(o6.vf[0], 3);
		T_EQ_INT(o6.vl[0], 4);
		T_EQ_INT(o6.vf[1], 3);
		T_EQ_INT(o6.vl[1], 4);
	}
	/* ---- packed decode step == legacy decode + sample, bit for bit ---- */
	{
		static mix_out ma, mb;
		int st, len;
		T_EQ_INT(mix_run(m, 6, 1, 0, NULL, NULL, &ma), RL_OK);
		T_EQ_INT(mix_run(m, 6, 0, 0, NULL, NULL, &mb), RL_OK);
		mix_kinds(&ma, &st, &len);
		T_OK(st > 0 && len > 0, "workload: %d stopped early, %d ran to their limit", st, len);
		T_OK(ma.count > 30, "workload: %d samples", ma.count);
		T_OK(mix_same(&ma, &mb), "packed decode step differs from rl_model_decode + sample");
		T_EQ_INT((int)ma.ds.steps, 0);
		T_OK(mb.ds.steps > 20 && mb.ds.direct == mb.ds.steps && mb.ds.launches == 0,
		    "decode_sample steps %d direct %d launches %d", (int)mb.ds.steps, (int)mb.ds.direct,
		    (int)mb.ds.launches);
	}
	/* ---- multi-step decoding == one step at a time ---- */
	{
		static out ref, mo;
		static const int32_t stops[] = { 3, 29, 57, 88, 101, 140, 171, 203, 222, 260, 291 };
		int32_t pc[] = { 11, 12, 13, 14, 15, 16, 17 };
		for (int slots = 16; slots >= 5; slots -= 11)
			for (int ds = 1; ds <= 7; ds += 3) {
				out *o = ds == 1 ? &ref : &mo;
				memset(o, 0, sizeof *o);
				rl_gen_opts_default(&go);
				go.slots = slots;
				go.kv_mem = 1 << 20;
				go.block_size = 4;
				go.max_new = 23;
				go.sp.temperature = 1.0f;
				go.stop_ids = stops;
				go.nstop_ids = (int)(sizeof stops / sizeof stops[0]);
				go.decode_steps = ds;
				T_EQ_INT(rl_engine_create(&e, m, NULL, &go), RL_OK);
				T_EQ_INT(rl_engine_submit(e, pa, 5, 4, 0, 0, 21, (void *)1), RL_OK);
				T_EQ_INT(rl_engine_submit(e, pb, 3, 3, 1, 0, 22, (void *)2), RL_OK);
				T_EQ_INT(rl_engine_submit(e, pc, 7, 4, 0, 9, 23, (void *)3), RL_OK);
				run(e, o);
				rl_engine_destroy(e);
				if (ds == 1) {
					int early = 0;
					for (int k = 0; k < ref.count; k++)
						early += ref.finish[k] == RL_FINISH_STOP;
					T_OK(ref.count == 12 && early > 0 && early < 12,
					    "multi-step workload: %d samples, %d stopped early", ref.count, early);
					continue;
				}
				/* the same tokens; the log-probs within fp32 sums in another order (the
				 * batch around a sequence differs: finished rows stay in it to the end of
				 * the steps, waiting requests come in later) */
				int bad = mo.count != ref.count;
				double maxd = 0;
				for (int k = 0; k < ref.count && !bad; k++) {
					int j = find(&mo, ref.user[k], ref.index[k]);
					bad = j < 0 || mo.n[j] != ref.n[k] || mo.finish[j] != ref.finish[k] ||
					    memcmp(mo.tok[j], ref.tok[k], sizeof(int32_t) * (size_t)ref.n[k]) != 0;
					for (int t = 0; !bad && t < ref.n[k]; t++)
						maxd = fmax(maxd, fabs(mo.lp[j][t] - ref.lp[k][t]));
				}
				T_OK(!bad && maxd < 1e-5, "decode_steps %d, %d slots: the samples differ from one step at a time "
				    "(tokens %s, log-probs by %g)", ds, slots, bad ? "differ" : "equal", maxd);
			}
	}
	rl_model_close(m);
	rl_ops_close(ops);
	T_END();
}

/*
 * engine.c — continuous-batching generation over the paged KV cache (see
 * engine.h).  A decode step is one rl_model_decode_sample call (inputs up in
 * one copy, the step replayed from a backend graph, tokens down in one copy);
 * RL_DECODE_LEGACY=1 goes back to rl_model_decode + ops->sample (the same
 * results, more copies and synchronisations).
 */
#include "rollout/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "model/kvcache.h"
#include "base/rng.h"

typedef struct req {
	int32_t *prompt;
	int plen, n, greedy, running, reserve, max_new;
	int resp_from;    /* multi-turn: prompt[resp_from..plen) opens the response (else plen) */
	int first_index;  /* multi-turn: the sample's index in its group */
	int episode;      /* a multi-turn request */
	const char *const *xstop; /* the request's or episode's own stop strings (borrowed) */
	int nxstop;
	uint64_t seed;
	void *user;
	rl_sample_params sp;  /* its sampling parameters (the engine's unless submitted with its own) */
	int top;          /* top log-probs asked for (rl_gen_req.top) */
	uint64_t key;     /* rl_gen_req.keep_key (0: none) */
	struct req *next;
} req;

/* A finished sample's cache kept for the next call of its conversation. */
typedef struct kept {
	uint64_t key;
	rl_kvseq kv;
	int32_t *tok;     /* (n) the tokens in kv */
	int n;
	uint64_t tick;    /* when kept: the oldest goes first */
	struct kept *next;
} kept;

typedef struct seq {
	int used, done;
	req *r;
	int index, greedy;
	rl_kvseq kv;
	int32_t *tok;     /* (cap) */
	float *logp;      /* (cap) */
	uint8_t *mask;    /* (cap) multi-turn: 1 sampled, 0 inserted */
	int n, max_n;
	int base;         /* tokens in the cache before tok[0] */
	int skip;         /* tok[0 .. skip): the prompt's tail after a reused cache, not reported */
	int cap;          /* tok, logp, mask hold cap tokens */
	int fed;          /* tok[0 .. fed) are in the cache; fed < n - 1: inserted tokens still to feed */
	int waiting;      /* multi-turn: the turn ended, waiting for rl_engine_feed / rl_engine_end */
	int turn_start, turn_ver;
	uint64_t seed;
	int ver_first, ver_last;
	double t_start;
	char *text;       /* decoded response bytes, kept only with stop strings */
	size_t tlen, tcap;
} seq;

struct rl_engine {
	rl_gen_opts o;
	rl_model *m;
	rl_ops *ops;
	rl_tokenizer *tok;
	rl_kvcache *kv;
	int V, slots, version, hold;
	int legacy;             /* RL_DECODE_LEGACY=1: decode, then sample_rows */
	size_t asz;
	seq *s;                 /* (slots) */
	req *head, *tail;
	int nwaiting, committed;
	int prefill_cap;        /* prompt tokens the model's inference buffers hold: the packing
	                         * budget, or more once a longer prompt came (0: lost, see grow_prefill) */
	size_t maxstop;
	/* backend buffers */
	void *d_rows;           /* (slots, V) act: prefill logits replicated per sample */
	int32_t *d_tok;
	float *d_logp;
	uint64_t *d_seed, *d_ctr;
	/* host mirrors */
	int32_t *h_tok;
	float *h_logp;
	int32_t *h_mtok;        /* multi-step decoding's tokens and log-probs (steps, slots) */
	float *h_mlogp;
	uint64_t *h_seed, *h_ctr;
	rl_kvseq **bseq;        /* (slots) */
	int *bidx;              /* (slots) slot index of batch row */
	rl_engine_stats st;
	rl_gen_done_fn turn;    /* multi-turn: the turn callback */
	void *turn_ctx;
	rl_gen_token_fn tokfn;  /* every sampled token (rl_engine_set_token) */
	void *tok_ctx;
	int own_sp;             /* a request with its own sampling parameters was submitted */
	int sp_turn;            /* the slot whose parameter set the last step decoded */
	int cap;                /* response tokens a slot holds: max(max_new, max_episode) */
	rl_gen_top_fn topfn;    /* top log-probs (rl_engine_set_top) */
	void *top_ctx;
	float *d_topf, *h_topf; /* (slots, V) f32: logits of the rows that want top log-probs */
	int top_ready;          /* h_topf holds this step's rows */
	int32_t top_id[RL_GEN_MAX_TOP]; /* the token being appended: its top list */
	float top_lp[RL_GEN_MAX_TOP];
	int top_n;
	kept *kept;             /* kept caches (rl_gen_req.keep_key), newest first */
	int kept_blk;           /* blocks they hold */
	int keep_blocks;        /* at most (o.keep_mem in blocks) */
	uint64_t tick;
};

static const char *const finish_names[] = { "", "eos", "stop", "length", "abort" };

const char *
rl_finish_name(int f)
{
	return f >= 1 && f <= 4 ? finish_names[f] : "?";
}

void
rl_gen_opts_default(rl_gen_opts *o)
{
	memset(o, 0, sizeof *o);
	o->slots = 64;
	o->kv_mem = (size_t)256 << 20;
	o->block_size = 16;
	o->max_prefill_tokens = 4096;
	o->max_new = 256;
	o->sp.temperature = 1.0f;
	o->sp.top_p = 1.0f;
	o->eos_id = -1;
	o->include_stop = 1;
	o->decode_steps = 1;
}

int
rl_engine_create(rl_engine **out, rl_model *m, rl_tokenizer *tok, const rl_gen_opts *o)
{
	rl_engine *e = rl_xcalloc(1, sizeof *e);
	rl_ops *ops = m->ops;
	int rv, S;

	*out = NULL;
	e->o = *o;
	e->m = m;
	e->ops = ops;
	e->tok = tok;
	e->V = m->cfg.vocab_size;
	e->slots = S = o->slots > 0 ? o->slots : 64;
	e->asz = rl_dtype_size(ops->act_dtype);
	e->legacy = getenv("RL_DECODE_LEGACY") != NULL && atoi(getenv("RL_DECODE_LEGACY")) > 0;
	if (o->nstop > 0 && !tok) {
		rl_error("stop strings need the model's tokenizer");
		free(e);
		return RL_EINVAL;
	}
	for (int i = 0; i < o->nstop; i++)
		e->maxstop = RL_MAX(e->maxstop, strlen(o->stop[i]));
	if ((rv = rl_kvcache_open(&e->kv, ops, &m->cfg, o->kv_mem, o->block_size > 0 ? o->block_size : 16)) != 0)
		goto fail;
	if ((rv = rl_model_infer_reserve(m, RL_MAX(o->max_prefill_tokens, 1), S)) != 0)
		goto fail;
	e->prefill_cap = RL_MAX(o->max_prefill_tokens, 1);
	if (o->keep_mem > 0 && o->kv_mem > 0)
		e->keep_blocks = (int)RL_MIN((double)e->kv->nblk, (double)e->kv->nblk * ((double)o->keep_mem / (double)o->kv_mem));
	e->cap = RL_MAX(RL_MAX(o->max_new, o->max_episode), 1);
	e->s = rl_xcalloc((size_t)S, sizeof *e->s);
	for (int i = 0; i < S; i++) {
		e->s[i].tok = rl_try_malloc(sizeof(int32_t) * (size_t)e->cap, "response tokens");
		e->s[i].logp = rl_try_malloc(sizeof(float) * (size_t)e->cap, "response log-probs");
		e->s[i].mask = o->max_episode > 0 ? rl_try_malloc((size_t)e->cap, "loss mask") : NULL;
		e->s[i].cap = e->cap;
		if (!e->s[i].tok || !e->s[i].logp || (o->max_episode > 0 && !e->s[i].mask)) {
			rv = RL_ENOMEM;
			goto fail;
		}
	}
	if ((rv = ops->alloc(ops, &e->d_rows, (size_t)S * e->V * e->asz)) != 0 ||
	    (rv = ops->alloc(ops, (void **)&e->d_tok, (size_t)S * 4)) != 0 ||
	    (rv = ops->alloc(ops, (void **)&e->d_logp, (size_t)S * 4)) != 0 ||
	    (rv = ops->alloc(ops, (void **)&e->d_seed, (size_t)S * 8)) != 0 ||
	    (rv = ops->alloc(ops, (void **)&e->d_ctr, (size_t)S * 8)) != 0)
		goto fail;
	e->h_tok = rl_xcalloc((size_t)S, 4);
	e->h_logp = rl_xcalloc((size_t)S, 4);
	if (o->decode_steps > 1) {
		e->o.decode_steps = RL_MIN(o->decode_steps, RL_GEN_MAX_STEPS);
		e->h_mtok = rl_xcalloc((size_t)S * e->o.decode_steps, 4);
		e->h_mlogp = rl_xcalloc((size_t)S * e->o.decode_steps, 4);
	}
	e->h_seed = rl_xcalloc((size_t)S, 8);
	e->h_ctr = rl_xcalloc((size_t)S, 8);
	e->bseq = rl_xcalloc((size_t)S, sizeof *e->bseq);
	e->bidx = rl_xcalloc((size_t)S, sizeof *e->bidx);
	*out = e;
	return RL_OK;
fail:
	rl_engine_destroy(e);
	return rv;
}

static void
free_req(req *r)
{
	free(r->prompt);
	free(r);
}

static void
drop_kept(rl_engine *e, kept *k)
{
	for (kept **pp = &e->kept; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			break;
		}
	e->kept_blk -= k->kv.nblk;
	rl_kvcache_release(e->kv, &k->kv);
	free(k->tok);
	free(k);
}

/* Drops the oldest kept caches but `except` until blocks `extra` more fit under `limit`
 * (1 when they do). */
static int
evict_kept(rl_engine *e, int extra, int limit, const kept *except)
{
	while (e->kept_blk + extra > limit) {
		kept *old = NULL;
		for (kept *k = e->kept; k; k = k->next)
			if (k != except && (!old || k->tick < old->tick))
				old = k;
		if (!old)
			return 0;
		drop_kept(e, old);
		e->st.kept_evicted++;
	}
	return 1;
}

void
rl_engine_forget(rl_engine *e, uint64_t key)
{
	for (kept *k = e->kept, *nx; k; k = nx) {
		nx = k->next;
		if (k->key == key)
			drop_kept(e, k);
	}
}

void
rl_engine_kept(const rl_engine *e, int *caches, int *blocks)
{
	int n = 0;
	for (const kept *k = e->kept; k; k = k->next)
		n++;
	*caches = n;
	*blocks = e->kept_blk;
}

void
rl_engine_destroy(rl_engine *e)
{
	if (!e)
		return;
	while (e->kept)
		drop_kept(e, e->kept);
	if (e->s) {
		for (int i = 0; i < e->slots; i++) {
			if (e->s[i].used)
				rl_kvcache_release(e->kv, &e->s[i].kv);
			free(e->s[i].tok);
			free(e->s[i].logp);
			free(e->s[i].mask);
			free(e->s[i].text);
		}
	}
	for (req *r = e->head, *n; r; r = n) {
		n = r->next;
		free_req(r);
	}
	/* requests with running samples are freed with their last sample */
	if (e->s)
		for (int i = 0; i < e->slots; i++)
			if (e->s[i].used && e->s[i].r && --e->s[i].r->running == 0)
				free_req(e->s[i].r);
	free(e->s);
	if (e->ops) {
		e->ops->free(e->ops, e->d_rows);
		e->ops->free(e->ops, e->d_tok);
		e->ops->free(e->ops, e->d_logp);
		e->ops->free(e->ops, e->d_seed);
		e->ops->free(e->ops, e->d_ctr);
		e->ops->free(e->ops, e->d_topf);
	}
	free(e->h_topf);
	rl_kvcache_close(e->kv);
	free(e->h_tok);
	free(e->h_logp);
	free(e->h_mtok);
	free(e->h_mlogp);
	free(e->h_seed);
	free(e->h_ctr);
	free(e->bseq);
	free(e->bidx);
	free(e);
}

static int
blocks_for(const rl_engine *e, int ntok)
{
	return (ntok + e->kv->BS - 1) / e->kv->BS;
}

/* Worst-case cache blocks of a group: its prompt's, the blocks each sample
 * fills past them, and the copies of a partly filled last prompt block: every
 * sample but the last to write into it copies it first (the last finds it
 * its own).  A sample of maxnew tokens puts plen + maxnew - 1 in the cache
 * (its last token is never fed back; multi-step decoding stops at the limit
 * too).  This was blocks_for(maxnew) + 1 a sample, up to two blocks more than
 * can be used: a group that fitted the pool was refused, and fewer were
 * admitted at once than the pool holds. */
static int
group_reserve(const rl_engine *e, int plen, int nseq, int max_new)
{
	int maxnew = RL_MAX(1, RL_MIN(max_new, e->m->cfg.max_pos - plen));
	int pb = blocks_for(e, plen);
	return pb + nseq * (blocks_for(e, plen + maxnew - 1) - pb) + (plen % e->kv->BS ? nseq - 1 : 0);
}

/* A prompt longer than the packing budget (max_prefill_tokens) is prefilled
 * alone: the model's inference buffers grow to its length, once, between steps
 * (nothing in them outlives a step; rl_model_infer_reserve drops the decode
 * graphs with them).  Until then such a prompt was refused even when the
 * model's context held it.  When the larger buffers cannot be had, the old
 * size is reserved again and the prompt refused; if even that fails the
 * engine can no longer prefill or decode (prefill_cap 0: every step fails). */
static int
grow_prefill(rl_engine *e, int plen)
{
	int rv, old = e->prefill_cap;

	if (old == 0)
		return RL_ENOMEM;
	if (plen <= old)
		return RL_OK;
	if ((rv = rl_model_infer_reserve(e->m, plen, e->slots)) == RL_OK) {
		e->prefill_cap = plen;
		return RL_OK;
	}
	rl_error("no memory to prefill a prompt of %d tokens (the buffers hold %d)", plen, old);
	rl_hint("shorten the prompt, or free memory for the inference buffers");
	if (rl_model_infer_reserve(e->m, old, e->slots) != RL_OK)
		e->prefill_cap = 0;
	return rv;
}

static int
submit(rl_engine *e, const int32_t *prompt, int plen, int n, int greedy_extra, int max_new,
    uint64_t seed, void *user, req **out)
{
	req *r;
	int nseq = n + (greedy_extra ? 1 : 0), rv;

	*out = NULL;
	if (plen < 1 || n < 0 || nseq < 1) {
		rl_error("generation request: empty prompt or no samples");
		return RL_EINVAL;
	}
	if (plen >= e->m->cfg.max_pos) {
		rl_error("prompt of %d tokens leaves no room in the model's context of %d", plen, e->m->cfg.max_pos);
		return RL_ETOOBIG;
	}
	if (nseq > e->slots) {
		rl_error("a group of %d samples needs more than the %d slots", nseq, e->slots);
		rl_hint("raise --slots to at least the group size");
		return RL_ETOOBIG;
	}
	if (group_reserve(e, plen, nseq, max_new) > e->kv->nblk) {
		rl_error("the KV cache (%d blocks of %d tokens) cannot hold a group of %d samples of a "
		    "%d-token prompt", e->kv->nblk, e->kv->BS, nseq, plen);
		rl_hint("raise --kv-mem or lower --max-tokens");
		return RL_ETOOBIG;
	}
	if ((rv = grow_prefill(e, plen)) != 0)
		return rv;
	r = rl_xcalloc(1, sizeof *r);
	r->prompt = rl_try_malloc((size_t)plen * 4, "prompt");
	if (!r->prompt) {
		free(r);
		return RL_ENOMEM;
	}
	memcpy(r->prompt, prompt, (size_t)plen * 4);
	r->plen = plen;
	r->n = n;
	r->greedy = greedy_extra != 0;
	r->seed = seed;
	r->user = user;
	r->max_new = max_new;
	r->reserve = group_reserve(e, plen, nseq, max_new);
	r->resp_from = plen;
	r->sp = e->o.sp;
	*out = r;
	return RL_OK;
}

static void
enqueue(rl_engine *e, req *r)
{
	if (e->tail)
		e->tail->next = r;
	else
		e->head = r;
	e->tail = r;
	e->nwaiting++;
}

int
rl_engine_submit(rl_engine *e, const int32_t *prompt, int plen, int n, int greedy_extra, int max_new,
    uint64_t seed, void *user)
{
	req *r;
	int rv;

	if (max_new <= 0 || max_new > e->o.max_new)
		max_new = e->o.max_new;
	if ((rv = submit(e, prompt, plen, n, greedy_extra, max_new, seed, user, &r)) != 0)
		return rv;
	enqueue(e, r);
	return RL_OK;
}

/* The cache is reserved for the whole episode (max_episode tokens after the
 * prompt): a sequence waiting on its environment never loses its blocks, and
 * no running one runs out of them. */
int
rl_engine_submit_episode(rl_engine *e, const int32_t *prompt, int plen, int resp_from, int index,
    uint64_t seed, const char *const *stop, int nstop, void *user)
{
	req *r;
	int rv, limit = e->o.max_episode > 0 ? e->o.max_episode : e->o.max_new;

	if (resp_from < 1 || resp_from > plen || plen - resp_from >= limit) {
		rl_error("episode: %d inserted tokens after a %d-token prompt leave no room in %d tokens",
		    plen - resp_from, resp_from, limit);
		return RL_ETOOBIG;
	}
	if (nstop > 0 && !e->tok) {
		rl_error("stop strings need the model's tokenizer");
		return RL_EINVAL;
	}
	if (plen < e->m->cfg.max_pos && group_reserve(e, plen, 1, limit - (plen - resp_from)) > e->kv->nblk) {
		rl_error("the KV cache (%d blocks of %d tokens) cannot hold an episode of %d tokens after a "
		    "%d-token prompt", e->kv->nblk, e->kv->BS, limit, resp_from);
		rl_hint("raise --kv-mem or lower --max-episode-tokens");
		return RL_ETOOBIG;
	}
	if ((rv = submit(e, prompt, plen, 1, 0, limit - (plen - resp_from), seed, user, &r)) != 0)
		return rv;
	r->resp_from = resp_from;
	r->first_index = index;
	r->episode = 1;
	r->xstop = stop;
	r->nxstop = nstop;
	enqueue(e, r);
	return RL_OK;
}

int
rl_engine_submit_req(rl_engine *e, const rl_gen_req *q)
{
	req *r;
	int rv, max_new = q->max_new;

	if (q->nstop > 0 && !e->tok) {
		rl_error("stop strings need the model's tokenizer");
		return RL_EINVAL;
	}
	if (max_new <= 0 || max_new > e->o.max_new)
		max_new = e->o.max_new;
	if ((rv = submit(e, q->prompt, q->plen, q->n, q->greedy_extra, max_new, q->seed, q->user, &r)) != 0)
		return rv;
	if (q->sp) {
		r->sp = *q->sp;
		e->own_sp = 1;
	}
	r->xstop = q->stop;
	r->nxstop = q->nstop;
	r->top = RL_MAX(0, RL_MIN(q->top, RL_MIN(RL_GEN_MAX_TOP, e->V)));
	r->key = q->n == 1 && !q->greedy_extra && e->keep_blocks > 0 ? q->keep_key : 0;
	if (r->top > 0 && !e->h_topf) {
		/* the logits of a whole batch as f32, on the backend and on the host */
		size_t bytes = (size_t)e->slots * e->V * 4;
		if ((e->h_topf = rl_try_malloc(bytes, "top log-probs")) == NULL ||
		    (rv = e->ops->alloc(e->ops, (void **)&e->d_topf, bytes)) != 0) {
			free(e->h_topf);
			e->h_topf = NULL;
			free_req(r);
			return rv ? rv : RL_ENOMEM;
		}
	}
	enqueue(e, r);
	return RL_OK;
}

void
rl_engine_set_token(rl_engine *e, rl_gen_token_fn fn, void *ctx)
{
	e->tokfn = fn;
	e->tok_ctx = ctx;
}

void
rl_engine_set_top(rl_engine *e, rl_gen_top_fn fn, void *ctx)
{
	e->topfn = fn;
	e->top_ctx = ctx;
}

/* The logits of batch rows [0, B) down to the host as f32 when a row's request asks for
 * top log-probs (the rows are few and V long: one cast and one copy, not a kernel). */
static int
fetch_top(rl_engine *e, const void *logits, int B)
{
	rl_ops *o = e->ops;
	int want = 0;

	e->top_ready = 0;
	for (int b = 0; b < B && !want; b++)
		want = e->s[e->bidx[b]].r->top > 0;
	if (!want || !e->h_topf)
		return RL_OK;
	o->cast(o, e->d_topf, RL_F32, logits, o->act_dtype, (size_t)B * e->V);
	o->download(o, e->h_topf, e->d_topf, (size_t)B * e->V * 4);
	e->top_ready = 1;
	return o->status(o);
}

/* The k likeliest tokens of row `row` of h_topf under log_softmax(z / temp), into
 * e->top_id / top_lp (likeliest first, ties to the lower id). */
static void
top_of(rl_engine *e, int row, int k, float temp)
{
	const float *z = e->h_topf + (size_t)row * e->V;
	const double inv = temp > 0.0f ? 1.0 / temp : 1.0;
	double mx = -1e300, sum = 0.0;
	int n = 0;

	for (int v = 0; v < e->V; v++)
		mx = RL_MAX(mx, (double)z[v] * inv);
	for (int v = 0; v < e->V; v++)
		sum += exp((double)z[v] * inv - mx);
	for (int v = 0; v < e->V; v++) {
		float x = z[v];
		int j;
		if (n == k && !(x > z[e->top_id[k - 1]]))
			continue;
		/* insertion into the sorted list; equal values keep the earlier (lower) id first */
		for (j = n < k ? n : k - 1; j > 0 && x > z[e->top_id[j - 1]]; j--)
			e->top_id[j] = e->top_id[j - 1];
		e->top_id[j] = v;
		if (n < k)
			n++;
	}
	for (int j = 0; j < n; j++)
		e->top_lp[j] = (float)((double)z[e->top_id[j]] * inv - mx - log(sum));
	e->top_n = n;
}

int
rl_engine_episode_fits(const rl_engine *e, int plen)
{
	int limit = e->o.max_episode > 0 ? e->o.max_episode : e->o.max_new;
	return plen < e->m->cfg.max_pos && group_reserve(e, plen, 1, limit) <= e->kv->nblk;
}

void
rl_engine_set_turn(rl_engine *e, rl_gen_done_fn turn, void *ctx)
{
	e->turn = turn;
	e->turn_ctx = ctx;
}

int
rl_engine_runnable(const rl_engine *e)
{
	int n = 0;
	for (int i = 0; i < e->slots; i++)
		n += e->s[i].used && !e->s[i].done && !e->s[i].waiting;
	return n;
}

int rl_engine_active(const rl_engine *e)
{
	int n = 0;
	for (int i = 0; i < e->slots; i++)
		n += e->s[i].used;
	return n;
}
int rl_engine_waiting(const rl_engine *e) { return e->nwaiting; }
void
rl_engine_set_version(rl_engine *e, int v)
{
	if (v != e->version)
		while (e->kept)
			drop_kept(e, e->kept);
	e->version = v;
}
void rl_engine_hold(rl_engine *e, int hold) { e->hold = hold; }
const rl_engine_stats *rl_engine_stats_get(const rl_engine *e) { return &e->st; }

static int
free_slots(const rl_engine *e)
{
	return e->slots - rl_engine_active(e);
}

static int
take_slot(rl_engine *e)
{
	for (int i = 0; i < e->slots; i++)
		if (!e->s[i].used)
			return i;
	return -1;
}

/* What a sequence reports, at the end of the sample or of a turn: its
 * tokens so far, why it stopped, versions, seed and times. */
static void
sample_of(const rl_engine *e, const seq *q, int why, rl_gen_sample *gs)
{
	memset(gs, 0, sizeof *gs);
	gs->user = q->r->user;
	gs->index = q->index;
	gs->greedy = q->greedy;
	gs->tok = q->tok + q->skip;
	gs->logp = q->logp + q->skip;
	gs->mask = q->r->episode ? q->mask : NULL;
	gs->n = q->n - q->skip;
	gs->finish = why;
	gs->ver_first = q->ver_first;
	gs->ver_last = q->ver_last;
	gs->seed = q->seed;
	gs->t_start = q->t_start;
	gs->t_end = rl_wall();
	gs->slot = (int)(q - e->s);
	gs->turn_start = q->turn_start;
	gs->turn_ver_first = q->turn_ver;
}

/* Keeps q's cache under its request's key: the tokens in it are the prompt's before
 * q->base and tok[0 .. fed) (a multi-step decode may have written more: cut off).
 * 1 when kept (q->kv is the kept cache's now), 0 when the budget or memory says no. */
static int
keep(rl_engine *e, seq *q)
{
	const req *r = q->r;
	int n = q->base + q->fed;
	kept *k;

	if (n < 1 || n > q->kv.len)
		return 0;
	rl_kvcache_truncate(e->kv, &q->kv, n);
	rl_engine_forget(e, r->key);
	if (!evict_kept(e, q->kv.nblk, e->keep_blocks, NULL))
		return 0;
	if (!(k = calloc(1, sizeof *k)) || !(k->tok = malloc(sizeof(int32_t) * (size_t)n))) {
		free(k);
		return 0;
	}
	memcpy(k->tok, r->prompt, sizeof(int32_t) * (size_t)q->base);
	memcpy(k->tok + q->base, q->tok, sizeof(int32_t) * (size_t)q->fed);
	k->n = n;
	k->key = r->key;
	k->kv = q->kv;
	memset(&q->kv, 0, sizeof q->kv);
	k->tick = ++e->tick;
	k->next = e->kept;
	e->kept = k;
	e->kept_blk += k->kv.nblk;
	return 1;
}

/* Releases a finished sequence and reports it. */
static int
finish(rl_engine *e, seq *q, int why, rl_gen_done_fn done, void *ctx)
{
	rl_gen_sample gs;
	req *r = q->r;
	int rv;

	q->done = 1;
	sample_of(e, q, why, &gs);
	gs.last_of_request = r->running == 1;
	e->st.samples++;
	rv = done ? done(ctx, &gs) : RL_OK;
	if (!r->key || why == RL_FINISH_ABORT || q->ver_first != e->version || !keep(e, q))
		rl_kvcache_release(e->kv, &q->kv);
	q->used = 0;
	q->waiting = 0;
	q->r = NULL;
	if (--r->running == 0) {
		e->committed -= r->reserve;
		free_req(r);
	}
	return rv;
}

/* Appends token t (log-prob lp) to q; returns the finish reason or 0. */
static int
append(rl_engine *e, seq *q, int32_t t, float lp)
{
	int stop_tok = 0;

	if (t == e->o.eos_id)
		stop_tok = RL_FINISH_EOS;
	for (int i = 0; !stop_tok && i < e->o.neos_more; i++)
		if (t == e->o.eos_more[i])
			stop_tok = RL_FINISH_EOS;
	for (int i = 0; !stop_tok && i < e->o.nstop_ids; i++)
		if (t == e->o.stop_ids[i])
			stop_tok = RL_FINISH_STOP;
	if (!stop_tok || e->o.include_stop || q->r->episode) {
		/* a turn's end-of-turn token stays: the next turn's context holds it */
		q->tok[q->n] = t;
		q->logp[q->n] = lp;
		if (q->mask)
			q->mask[q->n] = 1;
		q->n++;
		if (e->topfn && e->top_n > 0)
			e->topfn(e->top_ctx, q->r->user, q->index, e->top_id, e->top_lp, e->top_n);
		if (e->tokfn)
			e->tokfn(e->tok_ctx, q->r->user, q->index, t, lp);
	}
	q->ver_last = e->version;
	if (stop_tok)
		return stop_tok;
	if (e->o.nstop > 0 || q->r->nxstop > 0) {
		size_t bl = 0;
		/* stop strings are looked for in the text, where special tokens do not show */
		const char *b = rl_tokenizer_is_special(e->tok, t) ? NULL : rl_tokenizer_token(e->tok, t, &bl);
		if (b && bl) {
			if (q->tlen + bl + 1 > q->tcap) {
				size_t nc = RL_MAX(q->tcap * 2, q->tlen + bl + 64);
				char *nt = realloc(q->text, nc);
				if (!nt)
					return RL_FINISH_ABORT;
				q->text = nt;
				q->tcap = nc;
			}
			memcpy(q->text + q->tlen, b, bl);
			q->tlen += bl;
			q->text[q->tlen] = 0;
			/* a stop string can only end inside the bytes just added */
			size_t ms = e->maxstop;
			for (int i = 0; i < q->r->nxstop; i++)
				ms = RL_MAX(ms, strlen(q->r->xstop[i]));
			size_t from = q->tlen > bl + ms ? q->tlen - bl - ms : 0;
			for (int i = 0; i < e->o.nstop + q->r->nxstop; i++) {
				const char *st = i < e->o.nstop ? e->o.stop[i] : q->r->xstop[i - e->o.nstop];
				size_t sl = strlen(st);
				if (sl && memmem(q->text + from, q->tlen - from, st, sl))
					return RL_FINISH_STOP;
			}
		}
	}
	if (q->n >= q->max_n || q->base + q->n >= e->m->cfg.max_pos)
		return RL_FINISH_LENGTH;
	if (q->r->episode && q->n - q->turn_start >= e->o.max_new)
		return RL_FINISH_LENGTH;
	return 0;
}

/* A sequence's turn or the whole sample ended with reason why. */
static int
ended(rl_engine *e, seq *q, int why, rl_gen_done_fn done, void *ctx)
{
	rl_gen_sample gs;

	if (!q->r->episode || !e->turn)
		return finish(e, q, why, done, ctx);
	q->waiting = 1;
	sample_of(e, q, why, &gs);
	gs.full = q->n + 1 >= q->max_n || q->base + q->n + 1 >= e->m->cfg.max_pos;
	return e->turn(e->turn_ctx, &gs);
}

int
rl_engine_feed(rl_engine *e, int slot, const int32_t *ids, int n)
{
	seq *q;

	if (slot < 0 || slot >= e->slots || !(q = &e->s[slot])->used || !q->waiting || n < 0)
		return RL_EINVAL;
	if (q->n + n >= q->max_n || q->base + q->n + n >= e->m->cfg.max_pos)
		return RL_ETOOBIG;
	for (int i = 0; i < n; i++) {
		q->tok[q->n + i] = ids[i];
		q->logp[q->n + i] = 0.0f;
		q->mask[q->n + i] = 0;
	}
	q->n += n;
	q->waiting = 0;
	q->turn_start = q->n;
	q->turn_ver = e->version;
	q->tlen = 0;  /* stop strings are looked for in the new turn's text only */
	return RL_OK;
}

int
rl_engine_end(rl_engine *e, int slot, int why, rl_gen_done_fn done, void *ctx)
{
	seq *q;

	if (slot < 0 || slot >= e->slots || !(q = &e->s[slot])->used || !q->waiting)
		return RL_EINVAL;
	return finish(e, q, why, done, ctx);
}

int
rl_engine_cancel(rl_engine *e, void *user, rl_gen_done_fn done, void *ctx)
{
	req *prev = NULL;
	int rv;

	for (req *r = e->head; r; prev = r, r = r->next) {
		if (r->user != user)
			continue;
		if (prev)
			prev->next = r->next;
		else
			e->head = r->next;
		if (e->tail == r)
			e->tail = prev;
		e->nwaiting--;
		free_req(r);
		return 1;
	}
	for (int k = 0; k < e->slots; k++)
		if (e->s[k].used && !e->s[k].done && e->s[k].r->user == user &&
		    (rv = finish(e, &e->s[k], RL_FINISH_ABORT, done, ctx)) != 0)
			return rv;
	return 0;
}

static int
same_sp(const rl_sample_params *a, const rl_sample_params *b)
{
	return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

/* Samples one token for batch rows [0, B) whose logits start at `logits`;
 * rows b use sequences e->s[e->bidx[b]].  Greedy rows come last (from g). */
static int
sample_rows(rl_engine *e, const void *logits, int B, int g)
{
	rl_ops *o = e->ops;
	rl_sample_params greedy = { 0.0f, 0, 1.0f };
	double t0 = rl_now();

	for (int b = 0; b < B; b++) {
		seq *q = &e->s[e->bidx[b]];
		e->h_seed[b] = q->seed;
		e->h_ctr[b] = (uint64_t)(q->n - q->skip);
	}
	o->upload(o, e->d_seed, e->h_seed, (size_t)B * 8);
	o->upload(o, e->d_ctr, e->h_ctr, (size_t)B * 8);
	/* sampled rows in runs of one parameter set (one run unless requests bring their own) */
	for (int b0 = 0, b1; b0 < g; b0 = b1) {
		const rl_sample_params *sp = &e->s[e->bidx[b0]].r->sp;
		for (b1 = b0 + 1; b1 < g && same_sp(&e->s[e->bidx[b1]].r->sp, sp); b1++)
			;
		o->sample(o, e->d_tok + b0, e->d_logp + b0, (const char *)logits + (size_t)b0 * e->V * e->asz,
		    e->d_seed + b0, e->d_ctr + b0, b1 - b0, e->V, sp);
	}
	if (B > g)
		o->sample(o, e->d_tok + g, e->d_logp + g, (const char *)logits + (size_t)g * e->V * e->asz,
		    e->d_seed + g, e->d_ctr + g, B - g, e->V, &greedy);
	o->download(o, e->h_tok, e->d_tok, (size_t)B * 4);
	o->download(o, e->h_logp, e->d_logp, (size_t)B * 4);
	e->st.t_sample += rl_now() - t0;
	return o->status(o);
}

/* A sequence decoded as a greedy row: the greedy baseline, or a request at temperature 0
 * (the same draw: the first maximum, its log-prob at temperature 1). */
static int
is_greedy(const seq *q)
{
	return q->greedy || q->r->sp.temperature == 0.0f;
}

/* Appends the sampled token of each batch row to its sequence; reports the
 * ones that finished. */
static int
take_tokens(rl_engine *e, int B, rl_gen_done_fn done, void *ctx)
{
	int rv;

	for (int b = 0; b < B; b++) {
		seq *q = &e->s[e->bidx[b]];
		if (q->fed < q->n) {
			/* an inserted token was fed: the model's next token comes after the last */
			e->st.fed_tokens++;
			continue;
		}
		e->top_n = 0;
		if (e->top_ready && q->r->top > 0)
			top_of(e, b, q->r->top, is_greedy(q) ? 1.0f : q->r->sp.temperature);
		int why = append(e, q, e->h_tok[b], e->h_logp[b]);
		e->top_n = 0;
		e->st.gen_tokens++;
		if (why && (rv = ended(e, q, why, done, ctx)) != 0)
			return rv;
	}
	return RL_OK;
}

static uint64_t
sample_seed(uint64_t rseed, int index)
{
	return rl_rng_mix(rseed ^ rl_rng_mix((uint64_t)index + 0x51ed2701ULL));
}

/* The kept cache of r's key and how many of r's prompt tokens it holds (at most plen - 1:
 * the last is decoded for the first token's logits), or NULL. */
static kept *
find_kept(rl_engine *e, const req *r, int *match)
{
	*match = 0;
	if (!r->key)
		return NULL;
	for (kept *k = e->kept; k; k = k->next) {
		if (k->key != r->key)
			continue;
		int m = 0, lim = RL_MIN(k->n, r->plen - 1);
		while (m < lim && k->tok[m] == r->prompt[m])
			m++;
		*match = m;
		return m > 0 ? k : NULL;
	}
	return NULL;
}

/* r (one sample) takes the kept cache k over, cut to its first `match` tokens: the rest of
 * its prompt goes into tok[0 .. skip) to be fed (feed_observations, then the decode step
 * feeds the last and samples after it).  RL_ENOMEM (nothing changed) when the slot's
 * buffers cannot grow to the prompt's tail and the response. */
static int
admit_reused(rl_engine *e, req *r, kept *k, int match)
{
	int slot = take_slot(e), skip = r->plen - match;
	int maxnew = RL_MAX(1, RL_MIN(r->max_new, e->m->cfg.max_pos - r->plen));
	seq *q = &e->s[slot];

	if (skip + maxnew > q->cap) {
		int nc = skip + maxnew;
		int32_t *nt = realloc(q->tok, sizeof *nt * (size_t)nc);
		if (nt)
			q->tok = nt;
		float *nl = nt ? realloc(q->logp, sizeof *nl * (size_t)nc) : NULL;
		if (nl)
			q->logp = nl;
		uint8_t *nm = nl && q->mask ? realloc(q->mask, (size_t)nc) : NULL;
		if (nm)
			q->mask = nm;
		if (!nl || (q->mask && !nm))
			return RL_ENOMEM;
		q->cap = nc;
	}
	/* the cache moves from k to the slot */
	for (kept **pp = &e->kept; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			break;
		}
	e->kept_blk -= k->kv.nblk;
	q->kv = k->kv;
	free(k->tok);
	free(k);
	rl_kvcache_truncate(e->kv, &q->kv, match);
	q->used = 1;
	q->done = 0;
	q->r = r;
	q->index = r->first_index;
	q->greedy = 0;
	q->base = match;
	q->skip = skip;
	q->n = skip;
	memcpy(q->tok, r->prompt + match, sizeof(int32_t) * (size_t)skip);
	for (int t = 0; t < skip; t++) {
		q->logp[t] = 0.0f;
		if (q->mask)
			q->mask[t] = 0;
	}
	q->fed = 0;
	q->waiting = 0;
	q->turn_start = q->n;
	q->tlen = 0;
	q->max_n = q->n + maxnew;
	q->seed = sample_seed(r->seed, r->first_index);
	q->ver_first = q->ver_last = q->turn_ver = e->version;
	q->t_start = rl_wall();
	r->running++;
	e->st.reused_tokens += (uint64_t)match;
	e->st.reused_seqs++;
	return RL_OK;
}

/* Admits waiting requests: one packed prefill, forks, first tokens. */
static int
admit(rl_engine *e, rl_gen_done_fn done, void *ctx)
{
	req *batch[256];
	int nb = 0, ntok = 0, slots_left = free_slots(e), rv;
	rl_kvseq *pseq[256];
	const int32_t *ptok[256];
	int plen[256], first[256];

	while (e->head && !e->hold && nb < 256) {
		req *r = e->head;
		int nseq = r->n + r->greedy, match = 0;
		kept *k = find_kept(e, r, &match);
		/* kept caches give way to requests: only blocks no running request reserved */
		if (nseq > slots_left || e->committed + r->reserve > e->kv->nblk ||
		    !evict_kept(e, 0, e->kv->nblk - e->committed - r->reserve + (k ? k->kv.nblk : 0), k))
			break;
		/* prompts are packed up to the budget; a longer one goes alone */
		if (!k && nb > 0 && ntok + r->plen > e->o.max_prefill_tokens)
			break;
		if (k && (rv = admit_reused(e, r, k, match)) != 0) {
			if (rv != RL_ENOMEM)
				return rv;
			drop_kept(e, k);  /* no room for the longer response: prefilled instead */
			k = NULL;
		}
		e->head = r->next;
		if (!e->head)
			e->tail = NULL;
		e->nwaiting--;
		r->next = NULL;
		e->committed += r->reserve;
		slots_left -= nseq;
		if (k)
			continue;
		ntok += r->plen;
		batch[nb++] = r;
	}
	if (nb == 0)
		return RL_OK;
	/* sample 0 of each request takes a slot and is prefilled */
	for (int i = 0; i < nb; i++) {
		int k = take_slot(e);
		seq *q = &e->s[k];
		memset(&q->kv, 0, sizeof q->kv);
		rl_kvseq_init(&q->kv, e->kv);
		q->used = 1;
		q->done = 0;
		q->r = batch[i];
		first[i] = k;
		pseq[i] = &q->kv;
		ptok[i] = batch[i]->prompt;
		plen[i] = batch[i]->plen;
	}
	double t0 = rl_now();
	rv = rl_model_prefill(e->m, e->kv, pseq, ptok, plen, nb, NULL);
	e->st.t_prefill += rl_now() - t0;
	if (rv != RL_OK) {
		for (int i = 0; i < nb; i++) {
			e->s[first[i]].used = 0;
			rl_kvcache_release(e->kv, &e->s[first[i]].kv);
			e->committed -= batch[i]->reserve;
			free_req(batch[i]);
		}
		return rv;
	}
	e->st.prefill_tokens += (uint64_t)ntok;
	/* the other samples fork the prompt's blocks; rows: sampled ones, then greedy ones */
	int B = 0, g = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < nb; i++) {
			req *r = batch[i];
			int lo = pass == 0 ? 0 : r->n, hi = pass == 0 ? r->n : r->n + r->greedy;
			for (int j = lo; j < hi; j++) {
				int k = j == 0 ? first[i] : take_slot(e);
				seq *q = &e->s[k];
				if (j != 0) {
					memset(&q->kv, 0, sizeof q->kv);
					rl_kvseq_init(&q->kv, e->kv);
					rl_kvcache_fork(e->kv, &q->kv, &e->s[first[i]].kv);
					q->used = 1;
					q->done = 0;
					q->r = r;
				}
				q->index = j + r->first_index;
				q->greedy = pass == 1;
				q->base = r->resp_from;
				q->skip = 0;
				q->n = r->plen - r->resp_from;
				memcpy(q->tok, r->prompt + r->resp_from, sizeof(int32_t) * (size_t)q->n);
				for (int t = 0; t < q->n; t++) {
					q->logp[t] = 0.0f;
					if (q->mask)
						q->mask[t] = 0;
				}
				q->fed = q->n;
				q->waiting = 0;
				q->turn_start = q->n;
				q->tlen = 0;
				q->max_n = q->n + RL_MAX(1, RL_MIN(r->max_new, e->m->cfg.max_pos - r->plen));
				q->seed = sample_seed(r->seed, j + r->first_index);
				q->ver_first = q->ver_last = q->turn_ver = e->version;
				q->t_start = rl_wall();
				r->running++;
				e->ops->copy(e->ops, (char *)e->d_rows + (size_t)B * e->V * e->asz,
				    (const char *)e->m->logits + (size_t)i * e->V * e->asz, (size_t)e->V * e->asz);
				e->bidx[B++] = k;
			}
		}
		if (pass == 0)
			g = B;
	}
	if ((rv = sample_rows(e, e->d_rows, B, g)) != 0 || (rv = fetch_top(e, e->d_rows, B)) != 0)
		return rv;
	return take_tokens(e, B, done, ctx);
}


/* The parameter set this step decodes: the engine's, or with requests of their own, that
 * of the first sampled runnable sequence after the one the last step took. */
static const rl_sample_params *
step_params(rl_engine *e)
{
	if (!e->own_sp)
		return &e->o.sp;
	for (int i = 1; i <= e->slots; i++) {
		int k = (e->sp_turn + i) % e->slots;
		seq *q = &e->s[k];
		if (q->used && !q->done && !q->waiting && !is_greedy(q)) {
			e->sp_turn = k;
			return &q->r->sp;
		}
	}
	return &e->o.sp;
}

/* Observations appended by rl_engine_feed go into the cache in one forward (a
 * row a token, rl_model_extend) rather than one a decode step: all but the
 * last, which the decode step feeds as the one before the model's turn, so the
 * token counter the sampler draws with is what it was. */
static int
feed_observations(rl_engine *e)
{
	int nb = 0, rv;

	for (int k = 0; k < e->slots; k++) {
		seq *q = &e->s[k];
		if (q->used && !q->done && !q->waiting && q->fed < q->n - 1) {
			e->bseq[nb] = &q->kv;
			e->bidx[nb] = k;
			nb++;
		}
	}
	if (nb == 0)
		return RL_OK;
	const int32_t **tok = rl_xmalloc(sizeof *tok * (size_t)nb);
	int *ntok = rl_xmalloc(sizeof *ntok * (size_t)nb);
	for (int b = 0; b < nb; b++) {
		seq *q = &e->s[e->bidx[b]];
		tok[b] = q->tok + q->fed;
		ntok[b] = q->n - 1 - q->fed;
	}
	double t0 = rl_now();
	rv = rl_model_extend(e->m, e->kv, e->bseq, tok, ntok, nb);
	e->st.t_prefill += rl_now() - t0;
	if (rv == RL_OK)
		for (int b = 0; b < nb; b++) {
			e->s[e->bidx[b]].fed += ntok[b];
			e->st.fed_tokens += (uint64_t)ntok[b];
		}
	free(tok);
	free(ntok);
	return rv;
}

int
rl_engine_step(rl_engine *e, rl_gen_done_fn done, void *ctx)
{
	int rv, B = 0, g = 0;

	if (e->prefill_cap == 0) {
		rl_error("generation engine: no inference buffers (lost growing them for a long prompt)");
		return RL_ENOMEM;
	}
	if ((rv = admit(e, done, ctx)) != 0)
		return rv;
	if ((rv = feed_observations(e)) != 0)
		return rv;
	/* decode: sampled sequences first, greedy ones last; with requests of their own
	 * parameters, the sampled ones of one set (the sets in turn, from sp_turn) */
	const rl_sample_params *sp = step_params(e);
	for (int pass = 0; pass < 2; pass++) {
		for (int k = 0; k < e->slots; k++) {
			seq *q = &e->s[k];
			if (q->used && !q->done && !q->waiting && is_greedy(q) == pass &&
			    (pass == 1 || same_sp(&q->r->sp, sp))) {
				e->bidx[B] = k;
				e->bseq[B] = &q->kv;
				e->h_tok[B] = q->tok[q->fed++];
				B++;
			}
		}
		if (pass == 0)
			g = B;
	}
	if (B == 0)
		return RL_OK;
	/* the token fed is the last one appended; a dropped stop token never gets here */
	int32_t *feed = rl_xmalloc((size_t)B * 4);
	memcpy(feed, e->h_tok, (size_t)B * 4);
	/* multi-step decoding while no waiting request could take a slot: n steps, none past a
	 * sequence's token limit */
	int n = 1;
	int top = 0;
	for (int b = 0; b < B && !top; b++)
		top = e->s[e->bidx[b]].r->top > 0;
	if (!e->legacy && e->o.decode_steps > 1 && !e->turn && !top &&
	    (e->head == NULL || e->hold || free_slots(e) == 0)) {
		n = e->o.decode_steps;
		for (int b = 0; b < B; b++) {
			seq *q = &e->s[e->bidx[b]];
			n = RL_MIN(n, q->max_n - q->n);
		}
		n = RL_MAX(n, 1);
	}
	double t0 = rl_now();
	if (e->legacy) {
		rv = rl_model_decode(e->m, e->kv, e->bseq, feed, B, NULL);
	} else {
		for (int b = 0; b < B; b++) {
			seq *q = &e->s[e->bidx[b]];
			e->h_seed[b] = q->seed;
			e->h_ctr[b] = (uint64_t)(q->n - q->skip);
		}
		if (n > 1)
			rv = rl_model_decode_multi(e->m, e->kv, e->bseq, feed, e->h_seed, e->h_ctr, B, g, sp, n,
			    e->h_mtok, e->h_mlogp);
		else
			rv = rl_model_decode_sample(e->m, e->kv, e->bseq, feed, e->h_seed, e->h_ctr, B, g, sp,
			    e->h_tok, e->h_logp);
	}
	e->st.t_decode += rl_now() - t0;
	free(feed);
	if (rv != RL_OK)
		return rv;
	if (n > 1) {
		/* step by step as n single steps would append them; a sequence that finished at an
		 * earlier step of the n takes no more (its slot is free from then on, and no request
		 * is admitted before the n are taken) */
		for (int k = 0; k < n; k++) {
			for (int b = 0; b < B; b++) {
				seq *q = &e->s[e->bidx[b]];
				if (!q->used || q->done)
					continue;
				int why = append(e, q, e->h_mtok[(size_t)k * B + b], e->h_mlogp[(size_t)k * B + b]);
				if (k + 1 < n)
					q->fed++;  /* fed by step k + 1 */
				e->st.gen_tokens++;
				if (why && (rv = finish(e, q, why, done, ctx)) != 0)
					return rv;
			}
			e->st.steps++;
		}
		return RL_OK;
	}
	e->st.steps++;
	if (e->legacy && (rv = sample_rows(e, e->m->logits, B, g)) != 0)
		return rv;
	if ((rv = fetch_top(e, e->m->logits, B)) != 0)
		return rv;
	return take_tokens(e, B, done, ctx);
}

/*
 * engine.h — the generation engine behind rl-rollout: a fixed set of slots
 * with continuous batching over the paged KV cache (kvcache.h) and the
 * model's prefill/decode (model.h), sampling on the backend (ops->sample).
 *
 * A request is one prompt and n samples (a group).  Its prompt is prefilled
 * once (prompts of several requests packed into one prefill) and the n
 * samples fork its KV blocks, so the prompt's cache is shared.  Every step
 * decodes one token for every active sequence; a sequence that finishes
 * (EOS, a stop id or string, max tokens, the model's context) leaves its
 * slot, which the next waiting request can take at once.  Requests are
 * admitted only when the cache can hold them to their maximum length, so a
 * running sequence never runs out of blocks.
 *
 * Randomness: sample i of a request draws from rl_rng(seed_i, t) with
 * seed_i = mix(request seed, i) and t its token index: the same seed and
 * settings give the same output on one backend, and the draws do not depend
 * on what else is in the batch (the logits may, in their last bits, when a
 * kernel sums in another order for another batch size).
 *
 * A request may carry its own sampling parameters and stop strings
 * (rl_engine_submit_req, the OpenAI server's requests): a decode step
 * decodes the sequences of one parameter set (greedy ones ride along with
 * any), taking the sets in turn, so requests with different temperatures
 * share the engine at the cost of more, smaller steps.
 *
 * Leaves out: I/O, tokenizing prompts, weight updates (the caller swaps
 * weights between steps with rl_model_set), preemption.  Not thread-safe.
 */
#ifndef RL_ENGINE_H
#define RL_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "compute/ops.h"
#include "tok/tokenizer.h"

enum { RL_FINISH_EOS = 1, RL_FINISH_STOP, RL_FINISH_LENGTH, RL_FINISH_ABORT };
const char *rl_finish_name(int finish);  /* "eos", "stop", "length", "abort" */

typedef struct rl_gen_opts {
	int slots;                  /* sequences decoded together (default 64) */
	size_t kv_mem;              /* KV cache budget in bytes (default 256 MiB) */
	int block_size;             /* tokens per cache block (default 16) */
	int max_prefill_tokens;     /* prompt tokens packed into one prefill (default 4096); a
	                             * longer prompt is prefilled alone, the model's inference
	                             * buffers grown to it (kept) */
	int max_new;                /* response tokens at most (default 256) */
	rl_sample_params sp;        /* temperature 0 = greedy */
	const int32_t *stop_ids;    /* extra token ids that end a sequence (borrowed) */
	int nstop_ids;
	const char *const *stop;    /* stop strings (borrowed); need a tokenizer */
	int nstop;
	int32_t eos_id;             /* -1: none */
	const int *eos_more;        /* more ids that end a sequence as EOS ("eos"; borrowed: */
	int neos_more;              /* rl_config's eos_more, from an eos_token_id list) */
	int include_stop;           /* keep the stop id/EOS in the response (default 1) */
	int decode_steps;           /* decode steps queued at once while no request can be
	                             * admitted (rl_model_decode_multi: the host waits once for
	                             * them); at most RL_GEN_MAX_STEPS, and never past a
	                             * sequence's token limit; a sequence that stops inside them
	                             * has its later tokens dropped.  Default 1: every step alone */
	int max_episode;            /* multi-turn requests (rl_engine_submit_episode): tokens after the
	                             * prompt at most, the inserted ones included (0: max_new) */
	size_t keep_mem;            /* of kv_mem, the bytes finished requests' kept caches may hold
	                             * (rl_gen_req.keep_key; 0: none kept) */
} rl_gen_opts;
#define RL_GEN_MAX_STEPS 64

void rl_gen_opts_default(rl_gen_opts *o);

/* A finished sample, as given to the done callback (all borrowed for the call). */
typedef struct rl_gen_sample {
	void *user;                 /* the request's user pointer */
	int index;                  /* 0..n-1, then n for the greedy baseline */
	int greedy;                 /* the extra greedy sample (ReMax) */
	const int32_t *tok;         /* (n) response tokens */
	const float *logp;          /* (n) log-probs under the sampling distribution */
	int n;
	int finish;                 /* RL_FINISH_* */
	int ver_first, ver_last;    /* weight versions that produced its tokens */
	uint64_t seed;              /* the sample's seed */
	double t_start, t_end;      /* wall seconds */
	int last_of_request;        /* 1 when the request has no sample left running */
	/* multi-turn requests only (single-turn: mask NULL) */
	const uint8_t *mask;        /* (n) 1: sampled, 0: inserted (rl_engine_feed, the prefix) */
	int slot;                   /* the sequence's slot, for rl_engine_feed / rl_engine_end */
	int turn_start;             /* turn callback: index of the turn's first token */
	int turn_ver_first;         /* turn callback: the weight version of the turn's first token */
	int full;                   /* turn callback: no room for another turn (episode or context) */
} rl_gen_sample;

typedef int (*rl_gen_done_fn)(void *ctx, const rl_gen_sample *s);

typedef struct rl_engine rl_engine;

/* m must have been opened on its backend; tok may be NULL when no stop
 * strings are given.  Reserves the cache and buffers once. */
int rl_engine_create(rl_engine **out, rl_model *m, rl_tokenizer *tok, const rl_gen_opts *o);
void rl_engine_destroy(rl_engine *e);

/* Queues a request: prompt (plen tokens, copied), n samples (+1 greedy when
 * greedy_extra), its own response limit max_new (0 or more than the engine's:
 * the engine's), the request's seed, a user pointer handed back with each
 * sample.  RL_ETOOBIG when the prompt leaves no room in the model's context or
 * the cache could never hold the group; RL_ENOMEM when a prompt longer than
 * max_prefill_tokens finds no memory for the larger buffers; nothing queued
 * then. */
int rl_engine_submit(rl_engine *e, const int32_t *prompt, int plen, int n, int greedy_extra,
    int max_new, uint64_t seed, void *user);

/* A request with its own settings (rl_engine_submit's arguments, and): */
typedef struct rl_gen_req {
	const int32_t *prompt;      /* (plen) copied */
	int plen, n, greedy_extra, max_new;
	uint64_t seed;
	void *user;
	const rl_sample_params *sp; /* NULL: the engine's (copied) */
	const char *const *stop;    /* more stop strings (borrowed until its last sample finished) */
	int nstop;
	int top;                    /* 0..RL_GEN_MAX_TOP: the top callback gets the `top` likeliest
	                             * tokens of each sampled position (rl_engine_set_top) */
	uint64_t keep_key;          /* non-zero (n == 1, no greedy extra): the KV cache kept under this
	                             * key is reused for the prompt's prefix, and this sample's cache is
	                             * kept under it when it finishes (rl_gen_opts.keep_mem) */
} rl_gen_req;
#define RL_GEN_MAX_TOP 20
int rl_engine_submit_req(rl_engine *e, const rl_gen_req *q);

/* Called for every sampled token appended to a sequence (from
 * rl_engine_step), before the done or turn callback of the same token. */
typedef void (*rl_gen_token_fn)(void *ctx, void *user, int index, int32_t tok, float logp);
void rl_engine_set_token(rl_engine *e, rl_gen_token_fn fn, void *ctx);

/* Called, for a request submitted with top > 0, just before the token
 * callback of each sampled token: the n (= top, at most the vocabulary)
 * likeliest tokens of that position, ids[k] with log-prob lp[k], likeliest
 * first (ties: lower id first).  The distribution is the one the sampled
 * token's log-prob comes from: log_softmax(logits / temperature) over the
 * whole vocabulary (greedy rows: temperature 1), before top-k/top-p, so the
 * sampled token, when among them, has the same log-prob (up to the rounding
 * of the backend's sampler).  The logits go down to the host for those rows
 * (one cast and one copy a step while such a request runs); multi-step
 * decoding is off meanwhile. */
typedef void (*rl_gen_top_fn)(void *ctx, void *user, int index, const int32_t *ids, const float *lp, int n);
void rl_engine_set_top(rl_engine *e, rl_gen_top_fn fn, void *ctx);

/* KV reuse between the calls of a conversation (the OpenAI server's episodes).
 * A request submitted with keep_key leaves its finished sample's cache (its
 * prompt and response tokens, the last sampled one excepted) in the engine
 * under that key instead of freeing it.  A later request with the same key
 * whose prompt starts with those tokens takes the cache over: only the
 * prompt's remaining tokens are forwarded (rl_model_extend and the first
 * decode step, as an environment's observation is), the same tokens and
 * draws as a full prefill gives (the sampler's counter is the response's).
 * A prompt that shares only a part of them reuses that part (the cache is
 * truncated); one that shares none is prefilled.  Kept caches hold at most
 * keep_mem bytes of the cache's blocks, least recently kept first out, and only blocks no
 * running request has reserved: a request that needs them evicts them.  They
 * are dropped when the weights' version changes (a cache of other weights is
 * not what a prefill would compute) and are never kept for an aborted sample
 * or one whose tokens span two versions.  Drops the kept cache of `key`: */
void rl_engine_forget(rl_engine *e, uint64_t key);
/* Kept caches and the blocks they hold. */
void rl_engine_kept(const rl_engine *e, int *caches, int *blocks);

/* Drops the request whose user pointer is `user`: queued, it is removed
 * (no callback); running, each of its sequences finishes with
 * RL_FINISH_ABORT through done.  Returns 1 when it was found queued, else
 * 0 (or a non-zero return of done, as an error). */
int rl_engine_cancel(rl_engine *e, void *user, rl_gen_done_fn done, void *ctx);

/* One iteration: admits waiting requests while slots and cache allow, then
 * decodes one token for every active sequence; calls done for each sample
 * that finished (a non-zero return from done stops and is returned).
 * Returns RL_OK or an error. */
int rl_engine_step(rl_engine *e, rl_gen_done_fn done, void *ctx);

/* Multi-turn: one sample whose response starts with prompt[resp_from .. plen)
 * (inserted tokens, loss mask 0: an environment's first observation; resp_from
 * == plen: none), index `index` of its group (its seed as sample `index` of a
 * request with seed `seed`), at most max_episode tokens after
 * prompt[0 .. resp_from), each model turn at most max_new.  A turn that ends
 * (EOS, a stop, max_new, no room) does not finish the sample: the turn
 * callback (rl_engine_set_turn) gets it, and the sequence waits, keeping its
 * slot and KV cache, until rl_engine_feed appends the next observation or
 * rl_engine_end finishes it.  stop: nstop more stop strings of this episode's
 * turns (borrowed until it finishes; need the tokenizer).  Errors as
 * rl_engine_submit. */
int rl_engine_submit_episode(rl_engine *e, const int32_t *prompt, int plen, int resp_from, int index,
    uint64_t seed, const char *const *stop, int nstop, void *user);
/* 1 when the cache can hold an episode after a plen-token prompt, else 0. */
int rl_engine_episode_fits(const rl_engine *e, int plen);
/* The turn callback (called from rl_engine_step; a non-zero return stops it and is returned). */
void rl_engine_set_turn(rl_engine *e, rl_gen_done_fn turn, void *ctx);
/* Appends ids (n >= 0, loss mask 0, log-prob 0) to the waiting sequence of
 * `slot`; the next step feeds them into the cache it already has (nothing is
 * prefilled again): all but the last in one forward with the other slots'
 * (rl_model_extend), the last by its decode step, and the model's next turn
 * starts after them.  RL_ETOOBIG (nothing appended, not logged) when they leave
 * no room for a sampled token; RL_EINVAL when slot is not waiting. */
int rl_engine_feed(rl_engine *e, int slot, const int32_t *ids, int n);
/* Finishes the waiting sequence of `slot` with reason finish (RL_FINISH_*):
 * the done callback gets it, its slot and cache are freed. */
int rl_engine_end(rl_engine *e, int slot, int finish, rl_gen_done_fn done, void *ctx);
/* Sequences that a decode step would advance (active, not waiting on a feed). */
int rl_engine_runnable(const rl_engine *e);

int rl_engine_active(const rl_engine *e);    /* sequences being decoded */
int rl_engine_waiting(const rl_engine *e);   /* requests not yet admitted */
/* The weight version attributed to tokens generated from now on. */
void rl_engine_set_version(rl_engine *e, int version);
/* hold != 0: admit nothing new (running sequences go on). */
void rl_engine_hold(rl_engine *e, int hold);

typedef struct rl_engine_stats {
	uint64_t prefill_tokens, gen_tokens, steps, samples;
	uint64_t fed_tokens;                   /* inserted tokens fed (rl_engine_feed, and a reused
	                                        * cache's new prompt tokens); t_prefill has their
	                                        * forwards but for each one's last token */
	uint64_t reused_tokens;                /* prompt tokens a kept cache held (not forwarded) */
	uint64_t reused_seqs;                  /* requests that took a kept cache over (each one's
	                                        * last prompt token is fed by its first decode step) */
	uint64_t kept_evicted;                 /* kept caches dropped for room or the budget */
	double t_prefill, t_decode, t_sample;  /* seconds; decode steps sample inside t_decode
	                                        * (t_sample: after prefills, and RL_DECODE_LEGACY=1) */
} rl_engine_stats;
const rl_engine_stats *rl_engine_stats_get(const rl_engine *e);

#endif

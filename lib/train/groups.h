/*
 * groups.h — turning a stream of scored trajectory records into complete,
 * validated groups for the learner.
 *
 * A group is the n samples of one prompt (same "group" id, "group_size" n).
 * Records arrive in any order and may be redelivered (at-least-once queues):
 * a record whose id was already taken is dropped and counted.  A group is
 * released when all n samples are in.  Each record is validated before it is
 * accepted; what is wrong with it is named (record id, group, field), and by
 * policy either fails the run or drops the whole group, counted.
 *
 * Leaves out: batching groups into optimizer steps (rl-train), tokens.
 * Not thread-safe.
 */
#ifndef RL_GROUPS_H
#define RL_GROUPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/gset.h"
#include "stream/traj.h"

/* One validated sample, owning its arrays. */
typedef struct rl_sample {
	uint64_t id, group;
	int index, group_size;
	int32_t *prompt;      /* (plen) */
	int32_t *response;    /* (rlen) */
	float *logprobs;      /* (rlen) behaviour log-probs, NULL if the record had none */
	float *ref_logprobs;  /* (rlen) or NULL */
	float *values;        /* (rlen) or NULL */
	uint8_t *loss_mask;   /* (rlen) 1 = trained on, 0 = not (a tool's output in a multi-turn
	                       * response); NULL: every token */
	float *token_rewards; /* (rlen) per-token rewards (an environment's per-turn rewards), or NULL */
	int plen, rlen;
	uint64_t pos;         /* 1-based record number in the input; 0 when unknown (a queue) */
	float reward;
	float temperature;    /* 1 when absent */
	int32_t ver_first, ver_last; /* -1 when absent */
	int is_baseline;      /* ReMax greedy baseline sample (meta.baseline true) */
	char finish[8];       /* "eos", "stop", "length", "abort" or "" */
} rl_sample;

void rl_sample_fini(rl_sample *s);

typedef struct rl_group {
	uint64_t group;
	int n;                /* samples present */
	int size;             /* group_size */
	rl_sample *s;         /* (size) ordered by index */
} rl_group;

void rl_group_fini(rl_group *g);

/* RL_BAD_AUTO (rl_train_opts only): skip under --queue, where one failed
 * reward must not stop a long run, error on a file or a pipe */
enum { RL_BAD_ERROR = 0, RL_BAD_SKIP = 1, RL_BAD_AUTO = 2 };

typedef struct rl_grouper_opts {
	int on_bad;           /* RL_BAD_ERROR (default) or RL_BAD_SKIP */
	int need_logprobs;    /* records must carry behaviour logprobs */
	int need_ref;         /* records must carry ref_logprobs */
	int max_open_groups;  /* incomplete groups held at once (default 65536) */
	int vocab;            /* token ids must be in 0..vocab-1 (0: unchecked) */
	int max_tokens;       /* prompt + response tokens at most (0: unchecked) */
	int sft;              /* supervised data: reward optional (0), and a record without
	                         group/index/group_size is a group of one (group = id) */
	/* called with the id of each group dropped as bad once complete (its
	 * records consumed); non-zero fails the rl_grouper_add that completed it */
	int (*on_bad_group)(void *ctx, uint64_t group);
	void *ctx;
} rl_grouper_opts;

typedef struct rl_grouper_stats {
	uint64_t records, duplicates, bad_records, bad_groups, groups_out, incomplete;
} rl_grouper_stats;

typedef struct rl_grouper rl_grouper;

int rl_grouper_create(rl_grouper **out, const rl_grouper_opts *o);
void rl_grouper_destroy(rl_grouper *g);   /* NULL ok */

/* Offers one record (borrowed; copied when accepted).  `where` names it in
 * messages (e.g. "'-': record 12").  Returns RL_OK (taken, dropped as a
 * duplicate, or skipped as bad under RL_BAD_SKIP) or RL_EFORMAT (bad, under
 * RL_BAD_ERROR; logged). */
int rl_grouper_add(rl_grouper *g, const rl_traj *t, const char *where);
/* The same, keeping the record's position `pos` in its input (1-based) with
 * the sample, for rl_grouper_pending. */
int rl_grouper_add_at(rl_grouper *g, const rl_traj *t, const char *where, uint64_t pos);
/* The positions (non-zero, ascending) of the records held: in incomplete
 * groups (a bad record's too) and in complete groups not yet popped.  *pos
 * is malloc'd (caller frees; NULL when *n is 0).  RL_OK or RL_ENOMEM. */
int rl_grouper_pending(const rl_grouper *g, uint64_t **pos, size_t *n);
/* The group of record t as the grouper sees it ("group", or "id" for a
 * supervised record without one): RL_OK, or RL_ENOENT when it has none. */
int rl_grouper_group_of(const rl_grouper *g, const rl_traj *t, uint64_t *group);
/* Adds to *out the ids of the groups held (incomplete, or complete and not
 * yet popped): RL_OK or RL_ENOMEM. */
int rl_grouper_pending_groups(const rl_grouper *g, rl_gset *out);
/* Pops one complete group into *out (caller owns it: rl_group_fini):
 * RL_OK, or RL_ENOENT when none is complete. */
int rl_grouper_pop(rl_grouper *g, rl_group *out);
/* At the end of the input: the number of incomplete groups still held; each is
 * logged (group id, samples present / expected) and dropped. */
int rl_grouper_finish(rl_grouper *g);
const rl_grouper_stats *rl_grouper_stats_get(const rl_grouper *g);

#endif

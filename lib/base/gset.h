/*
 * gset.h — a set of u64 ids (trajectory groups) kept as sorted, disjoint,
 * inclusive ranges, and its JSON form.
 *
 * rl-train's full checkpoints list the groups done (trained, or consumed and
 * dropped) so that --resume skips their records wherever they come in the
 * input, and rl-rollout --resume does not generate them again (docs/train.md).
 * Group ids of one generator are a counter under a per-run nonce, so the set
 * of a run is a few ranges however many groups it holds.
 *
 * JSON form: an array of strings, each "N" (one id) or "LO-HI" (LO <= HI), in
 * decimal: ids go up to 2^64-1 and a JSON number (a double) keeps 53 bits.
 *
 * Leaves out: removal.  Not thread-safe.
 */
#ifndef RL_GSET_H
#define RL_GSET_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct rl_gset {
	uint64_t (*r)[2];     /* (n) [lo, hi], ascending, disjoint, not adjacent */
	size_t n, cap;
} rl_gset;

void rl_gset_init(rl_gset *s);
void rl_gset_fini(rl_gset *s);            /* NULL ok */
/* Adds id: RL_OK or RL_ENOMEM (s unchanged). */
int rl_gset_add(rl_gset *s, uint64_t id);
/* Adds every id of src: RL_OK or RL_ENOMEM. */
int rl_gset_add_all(rl_gset *s, const rl_gset *src);
/* 1 when id is in s, else 0. */
int rl_gset_has(const rl_gset *s, uint64_t id);
/* The number of ids (saturating at UINT64_MAX). */
uint64_t rl_gset_count(const rl_gset *s);
/* The JSON array (caller's: cJSON_Delete); NULL when out of memory. */
cJSON *rl_gset_to_json(const rl_gset *s);
/* Adds the ids of a JSON array in the form above to s.  RL_EFORMAT (logged,
 * naming where and the element) when it is not one; RL_ENOMEM. */
int rl_gset_from_json(rl_gset *s, const cJSON *a, const char *where);

#endif

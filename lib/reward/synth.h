/*
 * synth.h — the project's own synthetic task, `arith`: integer arithmetic
 * prompts with a checkable answer ("12+34=" -> "46"), small enough that the
 * demo's ~1M-parameter byte-level model learns it on a CPU in minutes.
 *
 * Problem i of a run is a pure function of (seed, i), so a generated file is
 * reproducible.  Train and test splits are disjoint whatever the seeds: a
 * problem belongs to the test split when a fixed hash of (a, op, b) is 0 mod
 * 10, and the generator rejects draws outside the split it was asked for.
 * The answer is all or nothing (rl_reward_arith), so there is no partial credit.
 *
 * Leaves out: the model and training (pipelines/demo), scoring (reward.h).
 */
#ifndef RL_SYNTH_H
#define RL_SYNTH_H

#include <stdint.h>
#include <stdio.h>

enum { RL_SPLIT_ALL = 0, RL_SPLIT_TRAIN, RL_SPLIT_TEST };

typedef struct rl_synth_arith {
	int digits;        /* operands are uniform in [0, 10^digits), 1..9 (default 2) */
	char ops[8];       /* operators to draw from, any of "+-*" (default "+") */
	int split;         /* RL_SPLIT_ALL, _TRAIN (90%) or _TEST (10%) */
	int reverse;       /* answer digits written least significant first */
	uint64_t seed;
} rl_synth_arith;

/* Defaults: 2 digits, "+", all, not reversed, seed 0. */
void rl_synth_arith_init(rl_synth_arith *o);

/* Checks o; logs and returns RL_EINVAL when digits or ops are out of range. */
int rl_synth_arith_check(const rl_synth_arith *o);

/* Problem i: writes the prompt ("12+34=") and the answer ("46", or "64"
 * reversed) into the caller's buffers (NUL-terminated; 32 bytes each are
 * always enough).  Returns 0, or RL_EINVAL for bad options. */
int rl_synth_arith_make(char *prompt, size_t pcap, char *answer, size_t acap, const rl_synth_arith *o, uint64_t i);

/* 1 when (a, op, b) belongs to the test split. */
int rl_synth_arith_is_test(int64_t a, char op, int64_t b);

/* Writes problems [0, n) as JSONL lines {"prompt": ..., "answer": ..., "task": "arith"}
 * to f.  Returns 0 or RL_EIO (logged) when a write fails. */
int rl_synth_arith_write(FILE *f, const rl_synth_arith *o, uint64_t n);

#endif

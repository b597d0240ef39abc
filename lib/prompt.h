/*
 * prompt.h — prompt lines, the JSONL that rl-rollout reads
 * ({"prompt": text or [{"role": .., "content": ..}], "answer": .., ...}),
 * turned into prompt records for rl-queue: `prompt_text` for a text prompt,
 * and `meta` with every other key (a message list stays in meta.prompt, where
 * rl-rollout --queue finds it).  "id" and "group" numbers become the record's
 * fields.
 */
#ifndef RL_PROMPT_H
#define RL_PROMPT_H

#include <stddef.h>

#include "traj.h"

/* 1 when line (n bytes) is a JSON object whose "prompt" is a string or a
 * non-empty list of objects (messages).  A list of numbers is rl-trajectory's
 * token-id field: 0, the line is a record. */
int rl_prompt_line_is(const char *line, size_t n);
/* Replaces t's fields with the record for one prompt line.  RL_EFORMAT
 * (logged, naming `what`) when it is not a prompt line. */
int rl_prompt_line_to_traj(rl_traj *t, const char *line, size_t n, const char *what);

#endif

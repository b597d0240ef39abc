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

#include <cjson/cJSON.h>

#include "tok/chat_json.h"
#include "tok/tokenizer.h"
#include "stream/traj.h"

/* 1 when line (n bytes) is a JSON object whose "prompt" is a string or a
 * non-empty list of objects (messages).  A list of numbers is rl-trajectory's
 * token-id field: 0, the line is a record. */
int rl_prompt_line_is(const char *line, size_t n);
/* Replaces t's fields with the record for one prompt line.  RL_EFORMAT
 * (logged, naming `what`) when it is not a prompt line, or when its messages
 * or chat_template_kwargs are what rl-rollout refuses (rl_prompt_chat_parse). */
int rl_prompt_line_to_traj(rl_traj *t, const char *line, size_t n, const char *what);

/* One chat line of len bytes (rl-rollout tokenize --chat) into CH: a JSON
 * array of messages, {"messages": [...], "chat_template_kwargs": {...}}, or
 * plain text, taken as one user message.  *root (the caller's, cJSON_Delete)
 * is the JSON parsed, NULL for text; the messages borrow from it or from
 * line, which must outlive CH.  RL_EFORMAT (logged, naming `what`) for a bad
 * line, a NUL byte or \u0000 among them (a message is a C string: it would be
 * cut).  rl_prompt_chat_fini frees CH either way. */
int rl_prompt_chat_line(rl_prompt_chat *ch, cJSON **root, const char *line, size_t len, const char *what);

#endif

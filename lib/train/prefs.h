/*
 * prefs.h — preference pairs for DPO: one JSONL line as TRL and OpenRLHF
 * write them, tokenized with the model's chat template.
 *
 * Forms (TRL's preference dataset types):
 *   {"prompt": TEXT, "chosen": TEXT, "rejected": TEXT}        standard
 *   {"prompt": [MSG...], "chosen": [MSG...], "rejected": [MSG...]}
 *                                                            conversational
 *   {"chosen": ..., "rejected": ...}                          implicit prompt:
 *       text: the longest common prefix (cut before a trailing space, as
 *       TRL's extract_prompt); messages: the longest run of equal leading
 *       messages.
 * A MSG is {"role": STRING, "content": STRING}.  Text completions get the
 * tokenizer's EOS appended (TRL's tokenize_row); a conversation is rendered
 * through rl_tokenizer_apply_chat: the prompt with the generation prompt, the
 * completion as what the whole conversation adds after it (the template must
 * render it as a continuation, else the line is refused).
 * Leaves out: reading files (the caller gives lines), batching, the loss.
 */
#ifndef RL_PREFS_H
#define RL_PREFS_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

typedef struct rl_pref {
	int32_t *prompt, *chosen, *rejected;
	int plen, clen, rlen;
} rl_pref;

void rl_pref_fini(rl_pref *p);   /* zeroes *p; NULL ok */

/* Parses and tokenizes one line (len bytes; need not be NUL-terminated) into
 * *out (caller frees with rl_pref_fini).  where names it in messages
 * ("FILE: line N").  Returns RL_OK; RL_EFORMAT, logged with where and what is
 * wrong (not JSON, a missing or mistyped key, an empty or identical chosen and
 * rejected, no shared prompt, a template that does not continue the prompt);
 * RL_ENOMEM; or the tokenizer's error. */
int rl_pref_parse(rl_pref *out, rl_tokenizer *tok, const char *line, size_t len, const char *where);

#endif

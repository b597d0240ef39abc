/*
 * chat_json.h — chat messages as JSON datasets write them, parsed into the
 * rl_chat_msg list the chat templates render: prompt lines (lib/rollout) and
 * SFT conversations (lib/train) read them through this one parser.
 * Leaves out: rendering (tokenizer.h), images and other non-text parts.  An
 * assistant turn's "tool_calls" list is kept as it is (its content may then be
 * null) for the model's own template to render.
 */
#ifndef RL_CHAT_JSON_H
#define RL_CHAT_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "tok/tokenizer.h"

/* A chat prompt's messages, as OpenAI's chat API and Hugging Face datasets
 * write them: {"role": .., "content": text or a list of content parts},
 * where the text parts ({"type": "text", "text": ..}, or a bare string) are
 * joined with "\n" as vLLM joins them for a template that takes text (Qwen's
 * templates do; Hugging Face's apply_chat_template fails on a list there);
 * an assistant turn's "reasoning_content" (Qwen3's template reads it) is
 * kept; and the line's "chat_template_kwargs" (vLLM's request field; only
 * {"enable_thinking": bool} is known) gives `thinking`. */
typedef struct rl_prompt_chat {
	rl_chat_msg *msgs; /* (n), owned; the strings are borrowed from the JSON
	                      parsed, or owned here (joined content parts) */
	size_t n;
	int thinking;      /* enable_thinking: 1, 0, or -1 when the line says nothing */
	char **own;        /* (n) joined contents, NULL where borrowed */
} rl_prompt_chat;

/* Parse MSGS (a JSON array, or NULL to check KWARGS alone; borrowed, must
 * outlive C) and KWARGS (the line's
 * "chat_template_kwargs", or NULL) into C.  RL_EFORMAT, logged with `what`
 * and the message and part number, for anything rlpipe cannot render as
 * text: a message without a string "role", a content that is neither text
 * nor a list of parts, a part that is not text (an image_url, audio, ...,
 * named), a tool call without a function name, an unknown chat_template_kwargs key.  c is zeroed
 * first; rl_prompt_chat_fini frees it either way. */
int rl_prompt_chat_parse(rl_prompt_chat *c, const cJSON *msgs, const cJSON *kwargs, const char *what);
void rl_prompt_chat_fini(rl_prompt_chat *c); /* accepts NULL */

#endif

/*
 * tokenizer.h — text <-> token ids for the models rlpipe trains.
 *
 * Implements byte-level BPE as Hugging Face `tokenizer.json` describes it (GPT-2,
 * Qwen2/Qwen2.5/Qwen3, Llama 3, DeepSeek V3 and other byte-level BPE vocabularies,
 * both merge encodings), SentencePiece-style BPE with byte fallback (Gemma 3),
 * GPT-2's original `encoder.json` + `vocab.bpe` pair, and rlpipe's own bytes
 * tokenizer (256 byte ids plus a few specials, `"model": {"type": "rlpipe-bytes"}`).
 * Added/special tokens are matched before BPE and never split; NFC is applied
 * where the file asks for it; decoding gives back the exact bytes, including
 * invalid UTF-8.  Chat prompts: ChatML and a plain template rendered by rlpipe's
 * own rules, any other model template by the Jinja engine (tok/jinja.h).
 *
 * Leaves out: Unigram/WordPiece models, byte-fallback BPE in forms other than
 * Gemma 3's (Llama 2's Prepend/Strip, Metaspace), pre-tokenizers other than
 * Split/ByteLevel, normalizers other than NFC,
 * post-processors (no BOS/EOS is added implicitly: callers add them).
 * docs/tokenizer.md has the details and the file format of the bytes tokenizer.
 *
 * Thread-safety: a handle is read-only after rl_tokenizer_open except for the
 * word cache and scratch buffers used by encoding, so rl_tokenizer_encode and
 * rl_tokenizer_apply_chat must not run concurrently on one handle (open one per
 * thread).  Decoding and the accessors are safe from any number of threads.
 */
#ifndef RL_TOKENIZER_H
#define RL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct rl_tokenizer rl_tokenizer;

/* Token id vector, caller-owned.  Zero-initialise it ({0}); functions that take
 * one as output append to it (growing ids); rl_tokens_fini frees it. */
typedef struct rl_tokens {
	int32_t *ids; /* (n) */
	size_t n, cap;
} rl_tokens;
void rl_tokens_fini(rl_tokens *t);

/* Files larger than this are refused with RL_ETOOBIG (tokenizer.json of Qwen3
 * is 11 MB, the largest common ones ~35 MB). */
#define RL_TOKENIZER_MAX_FILE ((size_t)128 << 20)

/* Flags for encode / apply_chat / decode. */
enum {
	RL_TOK_SPECIAL = 1 << 0,    /* encode: match special added tokens in the text
	                               (non-special added tokens always match) */
	RL_TOK_GEN_PROMPT = 1 << 1, /* apply_chat: end with the assistant prompt */
	RL_TOK_SKIP_SPECIAL = 1 << 2, /* decode: leave special tokens out */
	RL_TOK_NO_THINKING = 1 << 3 /* apply_chat: enable_thinking=false (a template
	                               with that switch, Qwen3's: see below) */
};

enum rl_chat_template { RL_CHAT_AUTO = 0, RL_CHAT_CHATML, RL_CHAT_PLAIN };

typedef struct rl_chat_msg {
	const char *role;      /* "system", "user", "assistant", ... (UTF-8, borrowed) */
	const char *content;   /* NUL-terminated, borrowed */
	const char *reasoning; /* an assistant turn's "reasoning_content", or NULL
	                          (only Qwen3's template reads it) */
	const cJSON *tool_calls; /* an assistant turn's OpenAI "tool_calls" (a
	                            list), or NULL; borrowed */
} rl_chat_msg;

/* Open a tokenizer from PATH: a model directory (tokenizer.json, else
 * encoder.json + vocab.bpe; tokenizer_config.json beside them is read for
 * eos/bos/pad and the chat template) or a tokenizer.json / encoder.json file.
 * On success *out owns the handle (rl_tokenizer_close).  Errors are logged with
 * the path and what is wrong: RL_ENOENT (missing file), RL_EFORMAT (bad JSON,
 * missing model, a merge naming an unknown token, ...), RL_ENOTSUP (a model or
 * pre-tokenizer this module does not implement), RL_ETOOBIG, RL_ENOMEM. */
int rl_tokenizer_open(rl_tokenizer **out, const char *path);
void rl_tokenizer_close(rl_tokenizer *tok); /* accepts NULL */

/* Encode LEN bytes of TEXT (any bytes; invalid UTF-8 is kept byte for byte)
 * and append the ids to OUT.  FLAGS: RL_TOK_SPECIAL.  Returns 0, RL_ENOMEM, or
 * RL_ETOOBIG for a text of 1 GiB or more (split it first). */
int rl_tokenizer_encode(rl_tokens *out, rl_tokenizer *tok, const char *text, size_t len, int flags);

/* Decode N ids into a new NUL-terminated buffer *TEXT of *LEN bytes (caller
 * frees; the bytes may contain NULs and invalid UTF-8 exactly as encoded).
 * FLAGS: RL_TOK_SKIP_SPECIAL.  RL_EINVAL (logged with its position) for an id
 * outside the vocabulary. */
int rl_tokenizer_decode(char **text, size_t *len, const rl_tokenizer *tok, const int32_t *ids, size_t n,
			int flags);

/* The bytes of one token (borrowed from TOK, not NUL-terminated), or NULL for
 * an unknown id.  For streaming decoders. */
const char *rl_tokenizer_token(const rl_tokenizer *tok, int32_t id, size_t *len);

/* Id of the token whose bytes are exactly S (vocabulary or added token), or -1. */
int32_t rl_tokenizer_lookup(const rl_tokenizer *tok, const char *s, size_t len);

/* Chat prompts.  TEMPLATE RL_CHAT_AUTO uses rl_tokenizer_chat_template(tok).
 *   ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
 *           "<|im_start|>assistant\n" with RL_TOK_GEN_PROMPT.
 *   plain:  BOS (when the tokenizer has one), then "ROLE: CONTENT\n" per
 *           message, then "assistant:" with RL_TOK_GEN_PROMPT.
 * apply_chat appends ids to OUT: template markers are always special tokens;
 * message text is encoded with RL_TOK_SPECIAL only when FLAGS has it (so user
 * text spelling "<|im_end|>" cannot forge a turn unless asked for).
 * render_chat writes the same prompt as text (*TEXT caller frees).
 * RL_CHAT_AUTO also puts in the system turn the model's ChatML template opens
 * a chat without one with (Qwen2/2.5's), as Hugging Face's apply_chat_template
 * does.  A model template that is neither ChatML nor plain (Llama 3's,
 * Gemma's, DeepSeek's, ...), or a ChatML one with <think> rules other than
 * Qwen3's (QwQ's, ...), is rendered by the Jinja engine as transformers
 * renders it (messages with role, content and reasoning_content,
 * add_generation_prompt, bos_token, eos_token, enable_thinking=false under
 * RL_TOK_NO_THINKING); its ids are that text encoded with special tokens
 * matched, as transformers tokenizes it, so there message text spelling a
 * special token is not kept apart.  A template error is logged with the
 * template's file and line: RL_ENOTSUP when the template does not parse (or
 * uses what the engine leaves out), RL_EINVAL when this chat fails to render
 * (raise_exception, a type error, a sandbox refusal), RL_ETOOBIG at a limit.
 * RL_CHAT_AUTO with a Qwen template follows its rules too (templates that
 * name <tool_response>, Qwen2.5's and Qwen3's): consecutive "tool" messages
 * are one user turn of <tool_response> blocks, and a role the template does
 * not render (it would drop it) is RL_EINVAL, logged.  Qwen3's template
 * (it names reasoning_content and last_query_index) also splits an assistant
 * turn's "<think>...</think>" (or takes its reasoning field): the reasoning
 * is kept, as "<think>\nR\n</think>\n\n", only for turns after the last user
 * query, and dropped before it; a template with the enable_thinking switch
 * follows the generation prompt with "<think>\n\n</think>\n\n" under
 * RL_TOK_NO_THINKING, and RL_TOK_NO_THINKING on any other template (or an
 * explicit chatml/plain) is RL_EINVAL, logged.
 * RL_ENOTSUP: ChatML on a tokenizer without <|im_start|>/<|im_end|>. */
int rl_tokenizer_apply_chat(rl_tokens *out, rl_tokenizer *tok, const rl_chat_msg *msgs, size_t n,
			    int template_, int flags);
int rl_tokenizer_render_chat(char **text, size_t *len, const rl_tokenizer *tok, const rl_chat_msg *msgs,
			     size_t n, int template_, int flags);
/* The same with TOOLS (OpenAI's "tools" list, or NULL) and any message's
 * tool_calls: rendered by the model's own chat template through the Jinja
 * engine, with `tools` and each message's `tool_calls` in its context, as
 * transformers' apply_chat_template(tools=...) renders them (for Qwen's
 * templates too, whose rules rlpipe otherwise follows itself).  RL_ENOTSUP,
 * logged, with an explicit template or a model without one. */
int rl_tokenizer_apply_chat_tools(rl_tokens *out, rl_tokenizer *tok, const rl_chat_msg *msgs, size_t n,
				  const cJSON *tools, int template_, int flags);
int rl_tokenizer_render_chat_tools(char **text, size_t *len, const rl_tokenizer *tok, const rl_chat_msg *msgs,
				   size_t n, const cJSON *tools, int template_, int flags);
/* The template chosen at open: ChatML when the model's chat template
 * (chat_template.jinja, else chat_template.json, else tokenizer_config.json's
 * chat_template, as transformers reads them) contains "<|im_start|>" (or the
 * bytes tokenizer says "chatml"), else plain. */
int rl_tokenizer_chat_template(const rl_tokenizer *tok);
/* 1 when the model's chat template has the enable_thinking switch (Qwen3's,
 * or a template the Jinja engine renders that names enable_thinking), so
 * RL_TOK_NO_THINKING can be used with RL_CHAT_AUTO; else 0. */
int rl_tokenizer_chat_thinking(const rl_tokenizer *tok);
const char *rl_chat_template_name(int template_); /* "chatml", "plain", "auto" */
int rl_chat_template_parse(const char *name);    /* inverse; -1 if unknown */

/* Accessors.  Ids are -1 where the tokenizer has no such token. */
int32_t rl_tokenizer_vocab_size(const rl_tokenizer *tok); /* highest id + 1 */
int32_t rl_tokenizer_eos_id(const rl_tokenizer *tok);
int32_t rl_tokenizer_bos_id(const rl_tokenizer *tok);
int32_t rl_tokenizer_pad_id(const rl_tokenizer *tok);
int rl_tokenizer_is_special(const rl_tokenizer *tok, int32_t id);
const char *rl_tokenizer_kind(const rl_tokenizer *tok); /* "bpe" or "bytes" */

/* The default bytes tokenizer.json (static, NUL-terminated): ids 0..255 are
 * bytes, 256.. <|bos|> <|eos|> <|pad|> <|im_start|> <|im_end|>.  Model
 * directories of rlpipe's tiny models carry this file. */
const char *rl_tokenizer_bytes_json(void);

#endif

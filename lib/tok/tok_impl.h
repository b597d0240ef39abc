/*
 * tok_impl.h — lib-private parts of the tokenizer shared by tokenizer.c
 * (loading, specials, chat), tok_pretok.c (Unicode classes, NFC, the split
 * patterns) and tok_bpe.c (merge tables, BPE, word cache).  Not installed.
 */
#ifndef RL_TOK_IMPL_H
#define RL_TOK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

/* ---- pre-tokenizer ------------------------------------------------------------ */
enum { RLI_SPLIT_NONE = 0, RLI_SPLIT_GPT2, RLI_SPLIT_QWEN2, RLI_SPLIT_PCRE2 };

extern const char rli_tok_gpt2_pattern[];
extern const char rli_tok_qwen2_pattern[];

typedef struct rli_splitter {
	int kind;      /* RLI_SPLIT_* */
	void *re;      /* pcre2_code_8 * for RLI_SPLIT_PCRE2 */
	void *md;      /* pcre2_match_data_8 * */
} rli_splitter;

/* Pick the hand-written matcher when PATTERN is one of the two known ones,
 * else compile it with PCRE2 (UTF, UCP, invalid UTF-8 allowed).  force_pcre2
 * is for tests.  Returns 0, RL_EFORMAT (bad regex, logged) or RL_ENOMEM. */
int rli_splitter_init(rli_splitter *sp, const char *pattern, int force_pcre2);
void rli_splitter_fini(rli_splitter *sp);

/* Split S[0..N) into pieces ("Isolated" behaviour: gaps between matches are
 * pieces too); appends each piece's end offset to *ENDS (grown with realloc).
 * Invalid UTF-8 bytes count as one character each of no letter/number/space
 * class, as U+FFFD would.  Returns 0 or RL_ENOMEM. */
int rli_split(const rli_splitter *sp, const uint8_t *s, size_t n, uint32_t **ends, size_t *n_ends,
	      size_t *cap_ends);

/* NFC of S[0..N) with invalid UTF-8 bytes kept in place: returns 1 and a new
 * buffer in *OUT (caller frees) when the text changes, 0 when it is already NFC
 * (*OUT untouched), or -RL_ENOMEM. */
int rli_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len);

/* Length (1..4) of the valid UTF-8 character at S[0..N) and its code point in
 * *CP, or 0 when S starts with an invalid byte. */
int rli_utf8_char(const uint8_t *s, size_t n, uint32_t *cp);

/* JS/Unicode "white space" as the oracles' \s has it. */
int rli_is_space(uint32_t cp);

/* GPT-2's byte <-> printable code point table. */
uint32_t rli_byte_to_cp(uint8_t b);
int rli_cp_to_byte(uint32_t cp); /* -1 when CP is not in the table */

/* ---- BPE ------------------------------------------------------------------------ */
typedef struct rli_bpe rli_bpe;

/* Build from the raw-bytes vocabulary: ID_OF_BYTE[256] single-byte token ids.
 * Merges are added in rank order with rli_bpe_add_merge. */
int rli_bpe_create(rli_bpe **out, const int32_t id_of_byte[256], size_t n_merges_hint);
int rli_bpe_add_merge(rli_bpe *b, int32_t left, int32_t right, int32_t merged); /* RL_EEXIST on duplicate */
void rli_bpe_destroy(rli_bpe *b);
/* BPE-encode one piece of raw bytes, appending ids. */
int rli_bpe_encode(rli_bpe *b, rl_tokens *out, const uint8_t *s, size_t n);
/* Merge the N symbols IDS (not cached), appending the result. */
int rli_bpe_merge_ids(rli_bpe *b, rl_tokens *out, const int32_t *ids, size_t n);

int rli_tokens_push(rl_tokens *t, int32_t id);

#endif

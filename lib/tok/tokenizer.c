/*
 * tokenizer.c — loading tokenizers (Hugging Face tokenizer.json, GPT-2's
 * encoder.json + vocab.bpe, rlpipe's bytes tokenizer), added/special tokens,
 * encoding and decoding, and the chat templates.  The text machinery is in
 * tok_pretok.c, the merges in tok_bpe.c.
 *
 * Encoding follows the reference pipeline: added tokens are found first
 * (leftmost, longest; special ones only with RL_TOK_SPECIAL), then each text
 * section between them is NFC-normalised (when the file asks), split by the
 * pre-tokenizer patterns (one or more Splits in turn), and every piece is
 * BPE-merged over its raw bytes.  SentencePiece-style BPE (byte_fallback,
 * Gemma 3's form) merges each section whole from its characters instead.
 *
 * Leaves out: see tokenizer.h.  docs/tokenizer.md has the design notes.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/core.h"
#include "base/io.h"
#include "tok/jinja.h"
#include "tok/tok_impl.h"

enum { KIND_BPE = 1, KIND_BYTES };
enum { T_PRESENT = 1, T_ADDED = 2, T_SPECIAL = 4, T_BYTE = 8 /* a byte-fallback token <0xNN> */ };
#define MAX_SPLIT 4   /* Split pre-tokenizers applied in turn (DeepSeek V3 has three) */
#define MAX_ID (1 << 24) /* ids above this are refused as malformed */

typedef struct added_tok {
	int32_t id;
	uint32_t off, len; /* bytes in the arena */
	uint8_t special, lstrip, rstrip;
} added_tok;

struct rl_tokenizer {
	int kind;
	int32_t ntok;           /* highest id + 1 */
	uint32_t *off, *len;    /* (ntok) token bytes in arena */
	uint8_t *tflags;        /* (ntok) T_* */
	uint8_t *arena;
	size_t arena_len, arena_cap;
	int32_t *hslot;         /* (hcap) bytes -> id index, -1 empty */
	size_t hcap;
	added_tok *added;
	size_t n_added;
	uint8_t first[256];     /* bit 1: an added token starts with this byte, bit 2: a special one */
	/* added tokens by their text (index_added): open addressing over indices
	 * into added; per first byte, the distinct lengths, longest first */
	int32_t *ahslot;
	size_t ahcap;
	uint32_t *alens, alen_at[257];
	rli_splitter split[MAX_SPLIT];
	int n_split;
	int nfc, prefix_space;
	/* SentencePiece-style BPE (BPE with byte_fallback, Gemma's): symbols are
	 * characters, a space and U+2581 are the same symbol (the file's normalizer
	 * makes them so), a character outside the vocabulary is its <0xNN> tokens.
	 * The table holds tokens decoded (U+2581 as a space, <0xNN> as its byte). */
	int spm;
	int32_t spm_space;      /* the token of U+2581, or -1 */
	int32_t spm_byte[256];
	int32_t *syms;          /* scratch: the symbols of one section */
	size_t cap_syms;
	int ignore_merges;      /* BPE "ignore_merges" (Llama 3): a piece in the vocabulary is one token */
	rli_bpe *bpe;
	int32_t eos, bos, pad;
	int chat;
	/* the model's template, as far as it is known (set_template): not ChatML
	 * nor plain, so RL_CHAT_AUTO cannot render it; the system turn its ChatML
	 * template opens a chat without one with; the file it came from; the
	 * Qwen rules it has (set_template) */
	int chat_foreign;
	int chat_tools, chat_reason, chat_switch, chat_genthink;
	char *chat_system;
	char *chat_src;
	char *chat_text; /* the template's Jinja text, kept where the engine renders it (chat_foreign) */
	rl_jinja *chat_jinja; /* chat_text parsed once, at open */
	char *chat_err;       /* why chat_text does not parse (reported at each render), or NULL */
	int chat_err_rv;
	uint32_t *ends;         /* scratch: piece ends of one section */
	size_t n_ends, cap_ends;
	uint32_t *ends2;        /* scratch: the pieces the next Split cuts again */
	size_t n_ends2, cap_ends2;
};

void
rl_tokens_fini(rl_tokens *t)
{
	if (!t)
		return;
	free(t->ids);
	memset(t, 0, sizeof(*t));
}

/* ---- files ------------------------------------------------------------------------ */

/* path's bytes, NUL-terminated (rl_io_read_file).  What is not a regular file, or is over
 * RL_TOKENIZER_MAX_FILE, is refused from its stat before anything is read.  A path "-" is
 * a file of that name here, not stdin. */
static int
read_file(const char *path, char **buf, size_t *len)
{
	struct stat st;

	if (stat(path, &st) != 0) {
		int e = errno;
		rl_error("cannot open '%s': %s", path, strerror(e));
		return e == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		rl_error("cannot read '%s': not a regular file", path);
		return RL_EIO;
	}
	if ((uint64_t)st.st_size > RL_TOKENIZER_MAX_FILE) {
		rl_error("'%s' is %llu bytes, over the %zu byte limit for tokenizer files", path,
			 (unsigned long long)st.st_size, RL_TOKENIZER_MAX_FILE);
		return RL_ETOOBIG;
	}
	return rl_io_read_file(strcmp(path, "-") == 0 ? "./-" : path, RL_TOKENIZER_MAX_FILE, buf, len);
}

static int
parse_json(cJSON **out, const char *path)
{
	char *buf = NULL;
	size_t len = 0;
	int rv;
	if ((rv = read_file(path, &buf, &len)) != 0)
		return rv;
	const char *end = NULL;
	*out = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
	if (!*out) {
		size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
		rl_error("cannot parse '%s': invalid JSON at byte %zu", path, at);
		rv = RL_EFORMAT;
	}
	free(buf);
	return rv;
}

/* Present, whatever its type: a FIFO or directory under a tokenizer file's name is then
 * refused by read_file, naming it, rather than skipped as if absent. */
static int
file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static char *
path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *p = rl_xmalloc(a + b + 2);
	memcpy(p, dir, a);
	p[a] = '/';
	memcpy(p + a + 1, name, b + 1);
	return p;
}

/* ---- the token table ---------------------------------------------------------------- */
static int
table_alloc(rl_tokenizer *t, int32_t ntok)
{
	t->ntok = ntok;
	t->off = rl_try_calloc((size_t)ntok, sizeof(uint32_t), "token table");
	t->len = rl_try_calloc((size_t)ntok, sizeof(uint32_t), "token table");
	t->tflags = rl_try_calloc((size_t)ntok, 1, "token table");
	return t->off && t->len && t->tflags ? 0 : RL_ENOMEM;
}

static int
table_set(rl_tokenizer *t, int32_t id, const uint8_t *s, size_t n, int flags)
{
	if (t->arena_len + n > t->arena_cap) {
		size_t c = t->arena_cap ? t->arena_cap : 1 << 20;
		while (c < t->arena_len + n)
			c *= 2;
		uint8_t *p = realloc(t->arena, c);
		if (!p)
			return RL_ENOMEM;
		t->arena = p;
		t->arena_cap = c;
	}
	memcpy(t->arena + t->arena_len, s, n);
	t->off[id] = (uint32_t)t->arena_len;
	t->len[id] = (uint32_t)n;
	t->tflags[id] = (uint8_t)(flags | T_PRESENT);
	t->arena_len += n;
	return 0;
}

static uint64_t
hbytes(const uint8_t *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

/* Index every token's bytes; the first id with given bytes wins (vocabulary
 * entries come before added tokens with the same bytes). */
static int
table_index(rl_tokenizer *t)
{
	size_t cap = 64;
	while (cap < (size_t)t->ntok * 2)
		cap *= 2;
	if (!(t->hslot = rl_try_malloc(cap * sizeof(int32_t), "token index")))
		return RL_ENOMEM;
	t->hcap = cap;
	for (size_t i = 0; i < cap; i++)
		t->hslot[i] = -1;
	for (int32_t id = 0; id < t->ntok; id++) {
		if (!(t->tflags[id] & T_PRESENT) || (t->tflags[id] & T_BYTE))
			continue;
		const uint8_t *s = t->arena + t->off[id];
		size_t n = t->len[id], h = hbytes(s, n) & (cap - 1);
		int dup = 0;
		while (t->hslot[h] >= 0) {
			int32_t o = t->hslot[h];
			if (t->len[o] == n && memcmp(t->arena + t->off[o], s, n) == 0) {
				dup = 1;
				break;
			}
			h = (h + 1) & (cap - 1);
		}
		if (!dup)
			t->hslot[h] = id;
	}
	return 0;
}

int32_t
rl_tokenizer_lookup(const rl_tokenizer *t, const char *s, size_t n)
{
	if (!t->hslot)
		return -1;
	size_t h = hbytes((const uint8_t *)s, n) & (t->hcap - 1);
	while (t->hslot[h] >= 0) {
		int32_t o = t->hslot[h];
		if (t->len[o] == n && memcmp(t->arena + t->off[o], s, n) == 0)
			return o;
		h = (h + 1) & (t->hcap - 1);
	}
	return -1;
}

/* Byte-level string (each code point stands for one byte) -> raw bytes.
 * Returns the length, or -1 when S holds a code point outside the table. */
static long
unbyte(const char *s, uint8_t *out)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t n = strlen(s), i = 0;
	long k = 0;
	while (i < n) {
		uint32_t cp;
		int l = rli_utf8_char(p + i, n - i, &cp), b;
		if (!l || (b = rli_cp_to_byte(cp)) < 0)
			return -1;
		out[k++] = (uint8_t)b;
		i += (size_t)l;
	}
	return k;
}

/* A SentencePiece vocabulary string -> the bytes it decodes to (U+2581 is a
 * space).  Returns the length; *BYTE is 0..255 for a byte-fallback token
 * "<0xNN>" (whose length is then 1), else -1. */
static long
unspm(const char *s, uint8_t *out, int *byte)
{
	size_t n = strlen(s), k = 0;
	unsigned v;
	char tail;
	*byte = -1;
	if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
	    sscanf(s + 3, "%2X%c", &v, &tail) == 2 && tail == '>' && strchr("0123456789ABCDEF", s[3]) &&
	    strchr("0123456789ABCDEF", s[4])) {
		*byte = (int)v;
		out[0] = (uint8_t)v;
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		if ((uint8_t)s[i] == 0xe2 && i + 2 < n && (uint8_t)s[i + 1] == 0x96 && (uint8_t)s[i + 2] == 0x81) {
			out[k++] = ' ';
			i += 2;
		} else {
			out[k++] = (uint8_t)s[i];
		}
	}
	return (long)k;
}

/* A vocabulary or merge string -> token bytes, as the model spells them. */
static long
tok_bytes(const rl_tokenizer *t, const char *s, uint8_t *out, int *byte)
{
	*byte = -1;
	return t->spm ? unspm(s, out, byte) : unbyte(s, out);
}

static int
add_added(rl_tokenizer *t, int32_t id, const char *content, size_t n, int special, int lstrip, int rstrip)
{
	added_tok *a = realloc(t->added, (t->n_added + 1) * sizeof(*a));
	int rv;
	if (!a)
		return RL_ENOMEM;
	t->added = a;
	int fl = T_ADDED | (special ? T_SPECIAL : 0);
	if ((rv = table_set(t, id, (const uint8_t *)content, n, fl)) != 0)
		return rv;
	a[t->n_added++] = (added_tok){ id, t->off[id], (uint32_t)n, (uint8_t)!!special, (uint8_t)!!lstrip,
				       (uint8_t)!!rstrip };
	/* SentencePiece-style: matched as written (Gemma's added "U+2581 U+2581" matches
	 * those characters, not spaces), decoded as the decoder makes it (spaces) */
	if (t->spm && memchr(content, 0xe2, n)) {
		uint8_t *d = rl_try_malloc(n + 1, "added token");
		char *z = strndup(content, n);
		int byte;
		if (!d || !z)
			rv = RL_ENOMEM;
		else
			rv = table_set(t, id, d, (size_t)unspm(z, d, &byte), fl);
		free(d);
		free(z);
		if (rv)
			return rv;
	}
	if (n)
		t->first[(uint8_t)content[0]] |= special ? 2 : 1;
	return 0;
}

static int
json_id(const cJSON *v, int32_t *id)
{
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_ID ||
	    v->valuedouble != (double)(int32_t)v->valuedouble)
		return RL_EFORMAT;
	*id = (int32_t)v->valuedouble;
	return 0;
}

static int
json_bool(const cJSON *o, const char *key)
{
	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* ---- BPE from a vocabulary and merges ---------------------------------------------- */
static int
resolve_part(rl_tokenizer *t, const char *path, size_t rank, const char *part, uint8_t *buf, long *n,
	     int32_t *id)
{
	int byte;
	*n = tok_bytes(t, part, buf, &byte);
	if (*n < 0 || byte >= 0 || (*id = rl_tokenizer_lookup(t, (const char *)buf, (size_t)*n)) < 0) {
		rl_error("'%s': merge %zu names unknown token '%s'", path, rank, part);
		return RL_EFORMAT;
	}
	return 0;
}

static int
add_merge(rl_tokenizer *t, const char *path, size_t rank, const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	uint8_t *buf = rl_try_malloc(la + lb + 2, "merge"); /* decoding never lengthens a string */
	int32_t ia, ib, im;
	long na, nb;
	int rv;
	if (!buf)
		return RL_ENOMEM;
	if ((rv = resolve_part(t, path, rank, a, buf, &na, &ia)) != 0 ||
	    (rv = resolve_part(t, path, rank, b, buf + na, &nb, &ib)) != 0)
		goto out;
	if ((im = rl_tokenizer_lookup(t, (const char *)buf, (size_t)(na + nb))) < 0) {
		rl_error("'%s': merge %zu ('%s' '%s') makes a token that is not in the vocabulary", path,
			 rank, a, b);
		rv = RL_EFORMAT;
		goto out;
	}
	rv = rli_bpe_add_merge(t->bpe, ia, ib, im);
	if (rv == RL_EEXIST)
		rv = 0; /* a repeated merge keeps its first (lowest) rank, as the reference does */
out:
	free(buf);
	return rv;
}

/* Split "a b" at its one space. */
static int
split_merge(char *s, char **a, char **b)
{
	char *sp = strchr(s, ' ');
	if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
		return RL_EFORMAT;
	*sp = 0;
	*a = s;
	*b = sp + 1;
	return 0;
}

static int
bpe_create(rl_tokenizer *t, const char *path, size_t n_merges)
{
	int32_t byte_id[256];
	if (t->spm) {
		for (int b = 0; b < 256; b++)
			if (t->spm_byte[b] < 0) {
				rl_error("'%s': BPE with byte_fallback, but the vocabulary has no token <0x%02X>", path, b);
				return RL_EFORMAT;
			}
		t->spm_space = rl_tokenizer_lookup(t, " ", 1);
		return rli_bpe_create(&t->bpe, t->spm_byte, n_merges);
	}
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		if ((byte_id[b] = rl_tokenizer_lookup(t, &c, 1)) < 0) {
			rl_error("'%s': the vocabulary has no token for byte 0x%02x", path, b);
			rl_hint("only byte-level BPE vocabularies (all 256 bytes present) are supported");
			return RL_EFORMAT;
		}
	}
	return rli_bpe_create(&t->bpe, byte_id, n_merges);
}

/* vocab: {"token": id, ...} in byte-level spelling.  Fills the table. */
static int
is_added(const cJSON *added, const char *s, int32_t id)
{
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
		int32_t aid;
		if (cJSON_IsString(c) && strcmp(c->valuestring, s) == 0 &&
		    json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &aid) == 0 && aid == id)
			return 1;
	}
	return 0;
}

/* Vocabulary entries that are added tokens too (DeepSeek V3's specials) may
 * be spelt as written rather than byte-level: ADDED defines them. */
static int
load_vocab(rl_tokenizer *t, const char *path, const cJSON *vocab, const cJSON *added)
{
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rv = 0;
	for (const cJSON *v = vocab->child; v; v = v->next) {
		int32_t id;
		size_t n = strlen(v->string);
		if (json_id(v, &id) != 0 || id >= t->ntok) {
			rl_error("'%s': vocabulary entry '%s' has no valid id", path, v->string);
			rv = RL_EFORMAT;
			break;
		}
		if (n + 1 > cap) {
			cap = n * 2 + 16;
			free(buf);
			if (!(buf = malloc(cap))) {
				rv = RL_ENOMEM;
				break;
			}
		}
		int byte;
		long k = tok_bytes(t, v->string, buf, &byte);
		if (k < 0 && is_added(added, v->string, id))
			continue;
		if (k < 0) {
			rl_error("'%s': vocabulary entry '%s' (id %d) is not in byte-level form", path, v->string,
				 (int)id);
			rl_hint("only byte-level BPE tokenizers are supported (GPT-2, Qwen, Llama 3 style)");
			rv = RL_ENOTSUP;
			break;
		}
		if (t->tflags[id] & T_PRESENT) {
			rl_error("'%s': id %d appears twice in the vocabulary", path, (int)id);
			rv = RL_EFORMAT;
			break;
		}
		if ((rv = table_set(t, id, buf, (size_t)k, byte >= 0 ? T_BYTE : 0)) != 0)
			break;
		if (byte >= 0 && t->spm_byte[byte] < 0)
			t->spm_byte[byte] = id;
	}
	free(buf);
	return rv;
}

static int32_t
max_id(const cJSON *vocab, const cJSON *added)
{
	int32_t m = -1, id;
	for (const cJSON *v = vocab ? vocab->child : NULL; v; v = v->next)
		if (json_id(v, &id) == 0 && id > m)
			m = id;
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next)
		if (json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) == 0 && id > m)
			m = id;
	return m;
}

static int
load_added(rl_tokenizer *t, const char *path, const cJSON *added, int min_id)
{
	int rv;
	if (added && !cJSON_IsArray(added)) {
		rl_error("'%s': \"added_tokens\" is not an array", path);
		return RL_EFORMAT;
	}
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
		int32_t id;
		if (json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) != 0 || !cJSON_IsString(c) ||
		    !c->valuestring[0] || id < min_id) {
			rl_error("'%s': an added token lacks a valid \"id\" or \"content\"%s", path,
				 min_id ? " (bytes tokenizer: ids start at 256)" : "");
			return RL_EFORMAT;
		}
		if ((rv = add_added(t, id, c->valuestring, strlen(c->valuestring), json_bool(a, "special"),
				    json_bool(a, "lstrip"), json_bool(a, "rstrip"))) != 0)
			return rv;
	}
	return 0;
}

static const char *
jtype(const cJSON *o)
{
	const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
	return cJSON_IsString(ty) ? ty->valuestring : "";
}

/* normalizer: null, NFC, or a Sequence of NFC. */
static int
load_normalizer(rl_tokenizer *t, const char *path, const cJSON *n)
{
	if (!n || cJSON_IsNull(n))
		return 0;
	if (strcmp(jtype(n), "NFC") == 0) {
		t->nfc = 1;
		return 0;
	}
	if (strcmp(jtype(n), "Sequence") == 0) {
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
		for (const cJSON *x = l ? l->child : NULL; x; x = x->next) {
			int rv = load_normalizer(t, path, x);
			if (rv)
				return rv;
		}
		return 0;
	}
	rl_error("'%s': normalizer '%s' is not supported", path, jtype(n));
	rl_hint("supported: NFC (or none)");
	return RL_ENOTSUP;
}

/* pre_tokenizer: ByteLevel (GPT-2 split when use_regex), or a Sequence of
 * one Split (Regex, Isolated) and ByteLevel without regex. */
static int
load_pretok(rl_tokenizer *t, const char *path, const cJSON *p, int *bytelevel)
{
	const char *ty = jtype(p);
	int rv;
	if (!p || cJSON_IsNull(p))
		return 0;
	if (strcmp(ty, "ByteLevel") == 0) {
		const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
		*bytelevel = 1;
		t->prefix_space |= json_bool(p, "add_prefix_space");
		if (!cJSON_IsFalse(ur)) {
			if (t->n_split)
				goto unsupported;
			t->n_split = 1;
			return rli_splitter_init(&t->split[0], rli_tok_gpt2_pattern, 0);
		}
		return 0;
	}
	if (strcmp(ty, "Split") == 0) {
		const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
		const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
		const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
		if (!cJSON_IsString(re) || t->n_split == MAX_SPLIT || *bytelevel || json_bool(p, "invert") ||
		    (beh && (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)))
			goto unsupported;
		if ((rv = rli_splitter_init(&t->split[t->n_split++], re->valuestring, 0)) != 0)
			rl_error("'%s': cannot use the Split pattern", path);
		return rv;
	}
	if (strcmp(ty, "Sequence") == 0) {
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
		for (const cJSON *x = l ? l->child : NULL; x; x = x->next)
			if ((rv = load_pretok(t, path, x, bytelevel)) != 0)
				return rv;
		return 0;
	}
unsupported:
	rl_error("'%s': pre-tokenizer '%s' (in this form) is not supported", path, ty);
	rl_hint("supported: ByteLevel, and Sequence[Split(Regex, Isolated) (up to %d), ByteLevel(use_regex=false)]",
		MAX_SPLIT);
	return RL_ENOTSUP;
}

/* A Replace of a String with a String, FROM -> TO. */
static int
is_replace(const cJSON *o, const char *from, const char *to)
{
	const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
	const cJSON *ps = pat ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
	return strcmp(jtype(o), "Replace") == 0 && cJSON_IsString(ps) && cJSON_IsString(c) &&
	       strcmp(ps->valuestring, from) == 0 && strcmp(c->valuestring, to) == 0;
}

/* SentencePiece-style BPE as Gemma's tokenizer.json has it: the normalizer
 * Replace(" " -> U+2581), no pre-tokenizer or a Split on the String " " (a no-op
 * once spaces are U+2581: the whole section is one piece), the decoder
 * Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse].  Anything else (Llama 2's
 * Prepend and Strip, Metaspace) is refused, naming it. */
static int
check_spm(const char *path, const cJSON *root)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
	const char *what = NULL, *ty = "";
	if (n && strcmp(jtype(n), "Sequence") == 0) {
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
		n = cJSON_GetArraySize(l) == 1 ? l->child : n;
	}
	if (!n || !is_replace(n, " ", "\xe2\x96\x81")) {
		what = "normalizer";
		ty = n ? jtype(n) : "none";
	}
	if (!what && p && !cJSON_IsNull(p)) {
		const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
		const cJSON *ps = pat ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
		if (strcmp(jtype(p), "Split") != 0 || !cJSON_IsString(ps) || strcmp(ps->valuestring, " ") != 0 ||
		    json_bool(p, "invert")) {
			what = "pre-tokenizer";
			ty = jtype(p);
		}
	}
	if (!what && d && !cJSON_IsNull(d)) {
		const cJSON *l = strcmp(jtype(d), "Sequence") == 0 ? cJSON_GetObjectItemCaseSensitive(d, "decoders") : NULL;
		for (const cJSON *x = l ? l->child : d; x; x = l ? x->next : NULL)
			if (!is_replace(x, "\xe2\x96\x81", " ") && strcmp(jtype(x), "ByteFallback") != 0 &&
			    strcmp(jtype(x), "Fuse") != 0) {
				what = "decoder";
				ty = jtype(x);
				break;
			}
	}
	if (!what)
		return 0;
	rl_error("'%s': BPE with byte_fallback: %s '%s' (in this form) is not supported", path, what, ty);
	rl_hint("supported: SentencePiece-style BPE as Gemma 3 has it: normalizer Replace(' ' -> '\xe2\x96\x81'), "
		"no pre-tokenizer or Split(' '), decoder Replace('\xe2\x96\x81' -> ' '), ByteFallback, Fuse");
	return RL_ENOTSUP;
}

static int
load_hf(rl_tokenizer *t, const char *path, cJSON *root)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
	int rv, bytelevel = 0;
	if (!cJSON_IsObject(model)) {
		rl_error("'%s' has no \"model\" object", path);
		rl_hint("a tokenizer.json needs {\"model\": {\"type\": \"BPE\", \"vocab\": ..., \"merges\": ...}}");
		return RL_EFORMAT;
	}
	const char *ty = jtype(model);
	if (strcmp(ty, "rlpipe-bytes") == 0) {
		/* without "added_tokens", the default specials */
		cJSON *def = added ? NULL : cJSON_Parse(rl_tokenizer_bytes_json());
		const cJSON *use = added ? added : cJSON_GetObjectItemCaseSensitive(def, "added_tokens");
		int32_t m = max_id(NULL, use);
		t->kind = KIND_BYTES;
		if ((rv = table_alloc(t, m < 255 ? 256 : m + 1)) != 0)
			goto bytes_out;
		for (int b = 0; b < 256; b++) {
			uint8_t c = (uint8_t)b;
			if ((rv = table_set(t, b, &c, 1, 0)) != 0)
				goto bytes_out;
		}
		if ((rv = load_added(t, path, use, 256)) == 0)
			rv = table_index(t);
bytes_out:
		cJSON_Delete(def);
		return rv;
	}
	if (ty[0] && strcmp(ty, "BPE") != 0) {
		rl_error("'%s': model type '%s' is not supported", path, ty);
		rl_hint("supported: BPE (byte-level) and rlpipe-bytes");
		return RL_ENOTSUP;
	}
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
	const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
	if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
		rl_error("'%s': the BPE model needs a \"vocab\" object and a \"merges\" array", path);
		return RL_EFORMAT;
	}
	for (const char *const *k = (const char *const[]){ "continuing_subword_prefix", "end_of_word_suffix", NULL };
	     *k; k++) {
		const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, *k);
		if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0])) {
			rl_error("'%s': BPE with a %s is not supported", path, *k);
			return RL_ENOTSUP;
		}
	}
	t->ignore_merges = json_bool(model, "ignore_merges");
	t->spm = json_bool(model, "byte_fallback");
	for (int b = 0; b < 256; b++)
		t->spm_byte[b] = -1;
	t->spm_space = -1;
	if (t->spm && t->ignore_merges) {
		rl_error("'%s': BPE with both byte_fallback and ignore_merges is not supported", path);
		return RL_ENOTSUP;
	}
	if (t->spm && (rv = check_spm(path, root)) != 0)
		return rv;
	if (!t->spm &&
	    ((rv = load_normalizer(t, path, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) != 0 ||
	     (rv = load_pretok(t, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &bytelevel)) != 0))
		return rv;
	if (strcmp(jtype(cJSON_GetObjectItemCaseSensitive(root, "decoder")), "ByteLevel") == 0)
		bytelevel = 1;
	if (!bytelevel && !t->spm) {
		rl_error("'%s': not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer or decoder)", path);
		return RL_ENOTSUP;
	}
	int32_t m = max_id(vocab, added);
	if (m < 0) {
		rl_error("'%s': the vocabulary is empty", path);
		return RL_EFORMAT;
	}
	t->kind = KIND_BPE;
	if ((rv = table_alloc(t, m + 1)) != 0 || (rv = load_vocab(t, path, vocab, added)) != 0 ||
	    (rv = load_added(t, path, added, 0)) != 0 || (rv = table_index(t)) != 0 ||
	    (rv = bpe_create(t, path, (size_t)cJSON_GetArraySize(merges))) != 0)
		return rv;
	size_t rank = 0;
	for (const cJSON *x = merges->child; x; x = x->next, rank++) {
		if (cJSON_IsString(x)) {
			char *s = rl_xstrdup(x->valuestring), *a, *b;
			if (split_merge(s, &a, &b) != 0) {
				rl_error("'%s': merge %zu '%s' is not two tokens separated by one space", path, rank,
					 x->valuestring);
				free(s);
				return RL_EFORMAT;
			}
			rv = add_merge(t, path, rank, a, b);
			free(s);
		} else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 && cJSON_IsString(x->child) &&
			   cJSON_IsString(x->child->next)) {
			rv = add_merge(t, path, rank, x->child->valuestring, x->child->next->valuestring);
		} else {
			rl_error("'%s': merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
			return RL_EFORMAT;
		}
		if (rv)
			return rv;
	}
	return 0;
}

/* GPT-2's own files: encoder.json {"token": id} and vocab.bpe ("#version" line, then "a b" lines). */
static int
load_gpt2(rl_tokenizer *t, const char *enc_path, const char *bpe_path)
{
	cJSON *enc = NULL;
	char *text = NULL;
	size_t len, rank = 0, line = 1;
	int rv;
	if ((rv = parse_json(&enc, enc_path)) != 0)
		return rv;
	if (!cJSON_IsObject(enc)) {
		rl_error("'%s' is not a JSON object of token ids", enc_path);
		rv = RL_EFORMAT;
		goto out;
	}
	t->kind = KIND_BPE;
	int32_t m = max_id(enc, NULL);
	if (m < 0) {
		rl_error("'%s': the vocabulary is empty", enc_path);
		rv = RL_EFORMAT;
		goto out;
	}
	if ((rv = table_alloc(t, m + 1)) != 0 || (rv = load_vocab(t, enc_path, enc, NULL)) != 0)
		goto out;
	int32_t eot = -1;
	for (int32_t id = 0; id < t->ntok; id++)
		if (t->len[id] == 13 && memcmp(t->arena + t->off[id], "<|endoftext|>", 13) == 0)
			eot = id;
	if (eot >= 0 && (rv = add_added(t, eot, "<|endoftext|>", 13, 1, 0, 0)) != 0)
		goto out;
	t->n_split = 1;
	if ((rv = table_index(t)) != 0 || (rv = rli_splitter_init(&t->split[0], rli_tok_gpt2_pattern, 0)) != 0 ||
	    (rv = read_file(bpe_path, &text, &len)) != 0 || (rv = bpe_create(t, bpe_path, 65536)) != 0)
		goto out;
	for (char *p = text, *nl; p < text + len; p = nl + 1, line++) {
		nl = memchr(p, '\n', (size_t)(text + len - p));
		if (!nl)
			nl = text + len;
		*nl = 0;
		if (nl > p && nl[-1] == '\r')
			nl[-1] = 0;
		if (!*p || (line == 1 && p[0] == '#'))
			continue;
		char *a, *b;
		if (split_merge(p, &a, &b) != 0) {
			rl_error("'%s' line %zu: a merge is two tokens separated by one space", bpe_path, line);
			rv = RL_EFORMAT;
			goto out;
		}
		if ((rv = add_merge(t, bpe_path, rank++, a, b)) != 0)
			goto out;
	}
out:
	cJSON_Delete(enc);
	free(text);
	return rv;
}

/* ---- special token ids and the chat template -------------------------------------- */
static int32_t
config_token(const rl_tokenizer *t, const cJSON *cfg, const char *key, const char *path)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
	if (cJSON_IsObject(v))
		v = cJSON_GetObjectItemCaseSensitive(v, "content");
	if (!cJSON_IsString(v))
		return -2; /* not given */
	int32_t id = rl_tokenizer_lookup(t, v->valuestring, strlen(v->valuestring));
	if (id < 0)
		rl_warn("'%s': %s '%s' is not a token of this tokenizer", path, key, v->valuestring);
	return id;
}

/* The Jinja string literal that opens at q (a quote), unescaped (\n, \t, and
 * a backslash before any other character: that character), into a new
 * string; NULL when it does not close. */
static char *
jinja_literal(const char *q)
{
	char quote = *q, *out = rl_xmalloc(strlen(q) + 1), *o = out;

	for (q++; *q && *q != quote; q++) {
		if (*q == '\\' && q[1]) {
			q++;
			*o++ = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q;
		} else {
			*o++ = *q;
		}
	}
	*o = 0;
	if (*q != quote) {
		free(out);
		return NULL;
	}
	return out;
}

/* The model's chat template tpl (Jinja text, or the bytes tokenizer's
 * "chatml" / "plain"), read from src.  rlpipe renders two templates itself:
 * ChatML (tpl names <|im_start|>) and plain.  Any other (Llama-3's
 * <|start_header_id|>, Gemma's, Mistral's [INST]) is foreign: RL_CHAT_AUTO
 * refuses it rather than render a prompt the model never saw.  A ChatML
 * template may open a chat that has no system turn with one of its own
 * (Qwen2 and Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."), as
 * Hugging Face's apply_chat_template, and so vLLM and verl, put in: it is
 * found as one quoted literal '<|im_start|>system\n...<|im_end|>\n' and put
 * in the same way.
 * The Qwen rules are found by what their Jinja text names (the escapes are
 * the template's own, a backslash and an n): tool turns as <tool_response>
 * blocks (Qwen2.5, Qwen3); the reasoning rule (Qwen3: reasoning_content and
 * last_query_index); the enable_thinking switch with its empty think block
 * (Qwen3); a generation prompt that opens a think block (Qwen3 thinking-only
 * models).  A ChatML template that names <think> without the reasoning rule
 * (QwQ's, or a fine-tune's) is foreign: which turns keep their reasoning
 * is not known. */
/* Parse the Jinja template once.  A template that does not parse fails every
 * chat with the parser's message (RL_ENOTSUP, as for a template rlpipe cannot
 * render), while text still encodes and explicit chatml/plain still work. */
static void
parse_template(rl_tokenizer *t)
{
	char err[512];
	rl_jinja_free(t->chat_jinja);
	t->chat_jinja = NULL;
	free(t->chat_err);
	t->chat_err = NULL;
	if (!t->chat_text)
		return;
	int rv = rl_jinja_parse_msg(&t->chat_jinja, t->chat_text, strlen(t->chat_text), t->chat_src, err,
				    sizeof err);
	if (rv) {
		t->chat_err_rv = rv == RL_EFORMAT ? RL_ENOTSUP : rv;
		t->chat_err = strdup(err[0] ? err : "cannot parse the chat template");
	}
}

static void
set_template(rl_tokenizer *t, const char *tpl, const char *src)
{
	static const char open_[] = "<|im_start|>system\\n", close_[] = "<|im_end|>\n";
	int chatml = strstr(tpl, "<|im_start|>") != NULL || strcmp(tpl, "chatml") == 0;

	t->chat = chatml ? RL_CHAT_CHATML : RL_CHAT_PLAIN;
	t->chat_foreign = !chatml && *tpl && strcmp(tpl, "plain") != 0;
	t->chat_tools = chatml && strstr(tpl, "<tool_response>") != NULL;
	t->chat_reason = chatml && strstr(tpl, "reasoning_content") && strstr(tpl, "last_query_index") &&
			 strstr(tpl, "</think>");
	t->chat_switch = t->chat_reason && strstr(tpl, "enable_thinking") &&
			 strstr(tpl, "'<think>\\n\\n</think>\\n\\n'");
	t->chat_genthink = t->chat_reason && strstr(tpl, "'<|im_start|>assistant\\n<think>\\n'");
	if (chatml && !t->chat_reason && strstr(tpl, "<think>"))
		t->chat_foreign = 2;
	free(t->chat_system);
	t->chat_system = NULL;
	free(t->chat_src);
	t->chat_src = rl_xstrdup(src);
	free(t->chat_text);
	/* kept for every Jinja template (not a bare "chatml"): tools and tool
	 * calls render through it */
	t->chat_text = t->chat_foreign || strstr(tpl, "{%") || strstr(tpl, "{{") ? rl_xstrdup(tpl) : NULL;
	parse_template(t);
	for (const char *p = strstr(tpl, open_); chatml && p && !t->chat_system; p = strstr(p + 1, open_)) {
		char *lit;
		size_t n;
		if (p == tpl || (p[-1] != '\'' && p[-1] != '"') || !(lit = jinja_literal(p - 1)))
			continue;
		n = strlen(lit);
		if (n > sizeof open_ - 2 + sizeof close_ - 1 && strcmp(lit + n - (sizeof close_ - 1), close_) == 0) {
			lit[n - (sizeof close_ - 1)] = 0;
			t->chat_system = rl_xstrdup(lit + sizeof open_ - 2);
		}
		free(lit);
	}
}

/* A "chat_template" value: its text, or, for a list of named templates, the
 * one named "default" (Hugging Face's choice; else the first); NULL when
 * there is none. */
static const char *
template_text(const cJSON *ct)
{
	const cJSON *x, *first = NULL;

	if (cJSON_IsString(ct))
		return ct->valuestring;
	if (!cJSON_IsArray(ct))
		return NULL;
	cJSON_ArrayForEach(x, ct) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
		const cJSON *tx = cJSON_GetObjectItemCaseSensitive(x, "template");
		if (!cJSON_IsString(tx))
			continue;
		if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0)
			return tx->valuestring;
		if (!first)
			first = tx;
	}
	return first ? first->valuestring : NULL;
}

static void
apply_config(rl_tokenizer *t, const cJSON *cfg, const char *path)
{
	int32_t id;
	if ((id = config_token(t, cfg, "eos_token", path)) != -2)
		t->eos = id;
	if ((id = config_token(t, cfg, "bos_token", path)) != -2)
		t->bos = id;
	if ((id = config_token(t, cfg, "pad_token", path)) != -2)
		t->pad = id;
	const char *tpl = template_text(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
	if (tpl)
		set_template(t, tpl, path);
}

/* The chat template saved beside tokenizer_config.json, which transformers
 * reads in its place: chat_template.jinja (the template's text; where
 * transformers >= 4.4x saves it), else chat_template.json's "chat_template"
 * (a processor's).  A Qwen directory saved by a recent transformers has its
 * template only there: its tokenizer_config.json has none. */
static int
template_file(rl_tokenizer *t, const char *dir)
{
	char *p = path_join(dir, "chat_template.jinja"), *text = NULL;
	cJSON *j = NULL;
	size_t len = 0;
	int rv = 0;

	if (file_exists(p)) {
		if ((rv = read_file(p, &text, &len)) == 0)
			set_template(t, text, p);
		goto out;
	}
	free(p);
	p = path_join(dir, "chat_template.json");
	if (file_exists(p) && (rv = parse_json(&j, p)) == 0) {
		const char *tpl = template_text(cJSON_GetObjectItemCaseSensitive(j, "chat_template"));
		if (tpl)
			set_template(t, tpl, p);
	}
out:
	cJSON_Delete(j);
	free(text);
	free(p);
	return rv;
}

static int32_t
find(const rl_tokenizer *t, const char *s)
{
	return rl_tokenizer_lookup(t, s, strlen(s));
}

static int index_added(rl_tokenizer *t);

int
rl_tokenizer_open(rl_tokenizer **out, const char *path)
{
	rl_tokenizer *t = NULL;
	cJSON *root = NULL, *cfg = NULL;
	char *dir = NULL, *tj = NULL, *enc = NULL, *bpe = NULL, *cj = NULL;
	struct stat st;
	int rv;

	*out = NULL;
	if (stat(path, &st) != 0) {
		rl_error("cannot open '%s': %s", path, strerror(errno));
		return errno == ENOENT ? RL_ENOENT : RL_EIO;
	}
	if (S_ISDIR(st.st_mode)) {
		dir = rl_xstrdup(path);
		tj = path_join(dir, "tokenizer.json");
	} else {
		const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
		dir = slash ? strndup(path, (size_t)(slash - path)) : rl_xstrdup(".");
		if (!dir)
			return RL_ENOMEM;
		if (strcmp(base, "encoder.json") == 0)
			enc = rl_xstrdup(path);
		else
			tj = rl_xstrdup(path);
	}
	if (tj && !file_exists(tj) && S_ISDIR(st.st_mode)) {
		enc = path_join(dir, "encoder.json");
		if (!file_exists(enc)) {
			rl_error("no tokenizer.json (or encoder.json + vocab.bpe) in '%s'", path);
			rv = RL_ENOENT;
			goto out;
		}
		free(tj);
		tj = NULL;
	}
	if (!(t = calloc(1, sizeof(*t)))) {
		rv = RL_ENOMEM;
		goto out;
	}
	t->eos = t->bos = t->pad = -1;
	if (tj) {
		if ((rv = parse_json(&root, tj)) != 0)
			goto out;
		if ((rv = load_hf(t, tj, root)) != 0)
			goto out;
	} else {
		bpe = path_join(dir, "vocab.bpe");
		if ((rv = load_gpt2(t, enc, bpe)) != 0)
			goto out;
	}

	if ((rv = index_added(t)) != 0)
		goto out;
	/* Defaults, then the model's own statements. */
	t->eos = find(t, "<|endoftext|>") >= 0 ? find(t, "<|endoftext|>") : find(t, "<|eos|>");
	t->bos = find(t, "<|bos|>");
	t->pad = find(t, "<|pad|>");
	t->chat = RL_CHAT_PLAIN;
	if (t->kind == KIND_BYTES) {
		const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
		t->chat = find(t, "<|im_start|>") >= 0 && find(t, "<|im_end|>") >= 0 ? RL_CHAT_CHATML : RL_CHAT_PLAIN;
		apply_config(t, model, tj);
	}
	cj = path_join(dir, "tokenizer_config.json");
	if (file_exists(cj)) {
		if ((rv = parse_json(&cfg, cj)) != 0)
			goto out;
		apply_config(t, cfg, cj);
	}
	if ((rv = template_file(t, dir)) != 0)
		goto out;
	rv = 0;
out:
	if (rv) {
		rl_tokenizer_close(t);
		t = NULL;
	}
	*out = t;
	cJSON_Delete(root);
	cJSON_Delete(cfg);
#ifdef __GLIBC__
	/* A large tokenizer.json is millions of small cJSON nodes, freed just now
	 * into glibc's fast bins; the first larger allocation after this would
	 * merge them all (0.3-0.4 s for Gemma 3's 33 MB file), inside whatever call
	 * comes first (a chat render, an encode).  Do it here, as part of opening. */
	if (root)
		malloc_trim(0);
#endif
	free(dir);
	free(tj);
	free(enc);
	free(bpe);
	free(cj);
	return rv;
}

void
rl_tokenizer_close(rl_tokenizer *t)
{
	if (!t)
		return;
	free(t->off);
	free(t->len);
	free(t->tflags);
	free(t->arena);
	free(t->hslot);
	free(t->added);
	free(t->ahslot);
	free(t->alens);
	for (int k = 0; k < MAX_SPLIT; k++)
		rli_splitter_fini(&t->split[k]);
	rli_bpe_destroy(t->bpe);
	free(t->ends);
	free(t->ends2);
	free(t->syms);
	free(t->chat_system);
	free(t->chat_text);
	free(t->chat_src);
	rl_jinja_free(t->chat_jinja);
	free(t->chat_err);
	free(t);
}

/* ---- encoding ---------------------------------------------------------------------- */
/* SentencePiece-style: one piece per section, its symbols the characters (a
 * space or U+2581 the U+2581 token), a character outside the vocabulary (or an
 * invalid UTF-8 byte) its byte-fallback tokens; then the merges. */
static int
encode_spm(rl_tokens *out, rl_tokenizer *t, const uint8_t *s, size_t n)
{
	size_t k = 0, need = n * 3; /* a space may become 3 byte symbols */
	if (need > t->cap_syms) {
		size_t c = t->cap_syms ? t->cap_syms : 256;
		while (c < need)
			c *= 2;
		int32_t *p = rl_try_malloc(c * sizeof(int32_t), "symbols");
		if (!p)
			return RL_ENOMEM;
		free(t->syms);
		t->syms = p;
		t->cap_syms = c;
	}
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		int l = rli_utf8_char(s + i, n - i, &cp);
		int32_t id = -1;
		if (l && (cp == ' ' || cp == 0x2581))
			id = t->spm_space;
		else if (l)
			id = rl_tokenizer_lookup(t, (const char *)s + i, (size_t)l);
		if (id >= 0) {
			t->syms[k++] = id;
		} else if (l && (cp == ' ' || cp == 0x2581)) {
			/* no U+2581 token: the normalised character's three bytes */
			for (int j = 0; j < 3; j++)
				t->syms[k++] = t->spm_byte[(uint8_t)"\xe2\x96\x81"[j]];
		} else {
			for (int j = 0; j < (l ? l : 1); j++)
				t->syms[k++] = t->spm_byte[s[i + (size_t)j]];
		}
		i += (size_t)(l ? l : 1);
	}
	return rli_bpe_merge_ids(t->bpe, out, t->syms, k);
}

/* Cut the pieces in t->ends again with each further Split, in turn. */
static int
split_more(rl_tokenizer *t, const uint8_t *s)
{
	int rv;
	for (int k = 1; k < t->n_split; k++) {
		uint32_t *e = t->ends2;
		size_t c = t->cap_ends2;
		t->ends2 = t->ends;
		t->cap_ends2 = t->cap_ends;
		t->n_ends2 = t->n_ends;
		t->ends = e;
		t->cap_ends = c;
		t->n_ends = 0;
		for (size_t j = 0, start = 0; j < t->n_ends2; j++) {
			size_t from = t->n_ends, end = t->ends2[j];
			if ((rv = rli_split(&t->split[k], s + start, end - start, &t->ends, &t->n_ends,
					    &t->cap_ends)) != 0)
				return rv;
			for (size_t q = from; q < t->n_ends; q++)
				t->ends[q] += (uint32_t)start;
			start = end;
		}
	}
	return 0;
}

static int
encode_section(rl_tokens *out, rl_tokenizer *t, const uint8_t *s, size_t n)
{
	uint8_t *norm = NULL, *pre = NULL;
	size_t nl;
	int rv = 0;
	if (!n)
		return 0;
	if (t->kind == KIND_BYTES) {
		for (size_t i = 0; i < n; i++)
			if ((rv = rli_tokens_push(out, s[i])) != 0)
				return rv;
		return 0;
	}
	if (t->spm)
		return encode_spm(out, t, s, n);
	if (t->nfc) {
		int r = rli_nfc(s, n, &norm, &nl);
		if (r < 0)
			return -r;
		if (r > 0) {
			s = norm;
			n = nl;
		}
	}
	if (t->prefix_space && s[0] != ' ') {
		if (!(pre = malloc(n + 1))) {
			rv = RL_ENOMEM;
			goto out;
		}
		pre[0] = ' ';
		memcpy(pre + 1, s, n);
		s = pre;
		n++;
	}
	t->n_ends = 0;
	if ((rv = rli_split(&t->split[0], s, n, &t->ends, &t->n_ends, &t->cap_ends)) != 0 ||
	    (rv = split_more(t, s)) != 0)
		goto out;
	for (size_t k = 0, start = 0; k < t->n_ends; k++) {
		int32_t id;
		/* ignore_merges (Llama 3's tokenizer.json, tiktoken's rule): a piece that is
		 * a vocabulary token is that token, whatever the merges would make of it */
		if (t->ignore_merges && (id = rl_tokenizer_lookup(t, (const char *)s + start, t->ends[k] - start)) >= 0 &&
		    !(t->tflags[id] & T_ADDED)) {
			if ((rv = rli_tokens_push(out, id)) != 0)
				goto out;
		} else if ((rv = rli_bpe_encode(t->bpe, out, s + start, t->ends[k] - start)) != 0) {
			goto out;
		}
		start = t->ends[k];
	}
out:
	free(norm);
	free(pre);
	return rv;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Index the added tokens by their text, and their lengths by first byte, so
 * that finding the longest at a position costs one probe per length rather
 * than a pass over all of them (Gemma 3 has 6,415). */
static int
index_added(rl_tokenizer *t)
{
	size_t cap = 16, m = 0, k = 0;
	while (cap < t->n_added * 2)
		cap *= 2;
	uint64_t *key = rl_try_malloc((t->n_added + 1) * sizeof(uint64_t), "added-token index");
	t->ahslot = rl_try_malloc(cap * sizeof(int32_t), "added-token index");
	t->alens = rl_try_malloc((t->n_added + 1) * sizeof(uint32_t), "added-token index");
	if (!key || !t->ahslot || !t->alens) {
		free(key);
		return RL_ENOMEM;
	}
	t->ahcap = cap;
	for (size_t i = 0; i < cap; i++)
		t->ahslot[i] = -1;
	for (size_t j = 0; j < t->n_added; j++) {
		const added_tok *a = &t->added[j];
		const uint8_t *c = t->arena + a->off;
		size_t h = hbytes(c, a->len) & (cap - 1);
		int dup = !a->len;
		for (; !dup && t->ahslot[h] >= 0; h = (h + 1) & (cap - 1)) {
			const added_tok *o = &t->added[t->ahslot[h]];
			dup = o->len == a->len && memcmp(t->arena + o->off, c, a->len) == 0;
		}
		if (dup)
			continue; /* the first of equal texts wins, as the linear scan had it */
		t->ahslot[h] = (int32_t)j;
		/* first byte ascending, then length descending */
		key[m++] = (uint64_t)c[0] << 32 | (UINT32_MAX - a->len);
	}
	qsort(key, m, sizeof(*key), cmp_u64);
	for (size_t i = 0, b = 0; b < 256; b++) {
		t->alen_at[b] = (uint32_t)k;
		for (; i < m && (key[i] >> 32) == b; i++) {
			uint32_t l = UINT32_MAX - (uint32_t)key[i];
			if (k == t->alen_at[b] || t->alens[k - 1] != l)
				t->alens[k++] = l;
		}
	}
	t->alen_at[256] = (uint32_t)k;
	free(key);
	return 0;
}

/* Longest added token at S[0..N) that FLAGS allows, or NULL. */
static const added_tok *
match_added(const rl_tokenizer *t, const uint8_t *s, size_t n, int flags)
{
	for (uint32_t j = t->alen_at[s[0]]; j < t->alen_at[s[0] + 1]; j++) {
		size_t l = t->alens[j];
		if (l > n)
			continue;
		for (size_t h = hbytes(s, l) & (t->ahcap - 1); t->ahslot[h] >= 0; h = (h + 1) & (t->ahcap - 1)) {
			const added_tok *a = &t->added[t->ahslot[h]];
			if (a->len == l && memcmp(t->arena + a->off, s, l) == 0) {
				if (!a->special || (flags & RL_TOK_SPECIAL))
					return a;
				break;
			}
		}
	}
	return NULL;
}

static size_t
space_len_back(const uint8_t *s, size_t n)
{
	size_t k = n;
	while (k > 0) {
		size_t st = k - 1;
		uint32_t cp;
		while (st > 0 && k - st < 4 && (s[st] & 0xc0) == 0x80)
			st--;
		if (rli_utf8_char(s + st, k - st, &cp) != (int)(k - st) || !rli_is_space(cp))
			break;
		k = st;
	}
	return n - k;
}

static size_t
space_len_fwd(const uint8_t *s, size_t n)
{
	size_t i = 0;
	uint32_t cp;
	int l;
	while (i < n && (l = rli_utf8_char(s + i, n - i, &cp)) > 0 && rli_is_space(cp))
		i += (size_t)l;
	return i;
}

int
rl_tokenizer_encode(rl_tokens *out, rl_tokenizer *t, const char *text, size_t len, int flags)
{
	const uint8_t *s = (const uint8_t *)text;
	size_t start = 0, i = 0;
	int rv, mask = flags & RL_TOK_SPECIAL ? 3 : 1;
	if (len > (size_t)INT32_MAX / 2) {
		rl_error("cannot encode %zu bytes at once (limit %d)", len, INT32_MAX / 2);
		return RL_ETOOBIG;
	}
	while (i < len) {
		const added_tok *a;
		if (!(t->first[s[i]] & mask) || !(a = match_added(t, s + i, len - i, flags))) {
			i++;
			continue;
		}
		size_t end = i;
		if (a->lstrip)
			end -= space_len_back(s + start, i - start);
		if ((rv = encode_section(out, t, s + start, end - start)) != 0 ||
		    (rv = rli_tokens_push(out, a->id)) != 0)
			return rv;
		i += a->len;
		if (a->rstrip)
			i += space_len_fwd(s + i, len - i);
		start = i;
	}
	return encode_section(out, t, s + start, len - start);
}

/* ---- decoding ---------------------------------------------------------------------- */
int
rl_tokenizer_decode(char **text, size_t *len, const rl_tokenizer *t, const int32_t *ids, size_t n, int flags)
{
	size_t total = 0;
	*text = NULL;
	*len = 0;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->ntok || !(t->tflags[ids[i]] & T_PRESENT)) {
			rl_error("cannot decode token %zu: id %d is not in the vocabulary (size %d)", i,
				 (int)ids[i], (int)t->ntok);
			return RL_EINVAL;
		}
		if (!((flags & RL_TOK_SKIP_SPECIAL) && (t->tflags[ids[i]] & T_SPECIAL)))
			total += t->len[ids[i]];
	}
	char *p = rl_try_malloc(total + 1, "decoded text");
	if (!p)
		return RL_ENOMEM;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if ((flags & RL_TOK_SKIP_SPECIAL) && (t->tflags[ids[i]] & T_SPECIAL))
			continue;
		memcpy(p + k, t->arena + t->off[ids[i]], t->len[ids[i]]);
		k += t->len[ids[i]];
	}
	p[k] = 0;
	*text = p;
	*len = k;
	return 0;
}

const char *
rl_tokenizer_token(const rl_tokenizer *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->ntok || !(t->tflags[id] & T_PRESENT))
		return NULL;
	*len = t->len[id];
	return (const char *)t->arena + t->off[id];
}

/* ---- chat ---------------------------------------------------------------------------- */
const char *
rl_chat_template_name(int tpl)
{
	return tpl == RL_CHAT_CHATML ? "chatml" : tpl == RL_CHAT_PLAIN ? "plain" : "auto";
}

int
rl_chat_template_parse(const char *name)
{
	if (strcmp(name, "chatml") == 0)
		return RL_CHAT_CHATML;
	if (strcmp(name, "plain") == 0)
		return RL_CHAT_PLAIN;
	if (strcmp(name, "auto") == 0)
		return RL_CHAT_AUTO;
	return -1;
}

int
rl_tokenizer_chat_template(const rl_tokenizer *t)
{
	return t->chat;
}

int
rl_tokenizer_chat_thinking(const rl_tokenizer *t)
{
	if (t->chat_foreign)
		return t->chat_text && strstr(t->chat_text, "enable_thinking") != NULL;
	return t->chat_reason && t->chat_switch;
}

/* A growable byte string. */
typedef struct sbuf {
	char *p;
	size_t n, cap;
} sbuf;

static int
sb_add(sbuf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t c = b->cap ? b->cap : 256;
		while (c < b->n + n + 1)
			c *= 2;
		char *p = realloc(b->p, c);
		if (!p)
			return RL_ENOMEM;
		b->p = p;
		b->cap = c;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

/* Qwen3's split of an assistant turn (its template's rule, step for step):
 * with a reasoning field, that is the reasoning and the content stays whole;
 * else, when the content has "</think>", the reasoning is what lies before
 * the first "</think>" (trailing newlines dropped) after the last "<think>"
 * in it (leading newlines dropped), and the content what follows the last
 * "</think>" (leading newlines dropped).  Slices of the message's strings. */
static void
split_reasoning(const rl_chat_msg *m, const char **r, size_t *rn, const char **c, size_t *cn)
{
	const char *s = m->content, *e = strstr(s, "</think>"), *p, *q;

	*c = s;
	*cn = strlen(s);
	*r = "";
	*rn = 0;
	if (m->reasoning) {
		*r = m->reasoning;
		*rn = strlen(m->reasoning);
		return;
	}
	if (!e)
		return;
	for (p = e; (q = strstr(p + 1, "</think>")) != NULL; p = q)
		;
	for (*c = p + 8; **c == '\n'; (*c)++)
		;
	*cn = strlen(*c);
	for (q = e; q > s && q[-1] == '\n'; q--)
		;
	*r = s;
	for (p = s; (p = strstr(p, "<think>")) != NULL && p + 7 <= q; p++)
		*r = p + 7;
	while (*r < q && **r == '\n')
		(*r)++;
	*rn = (size_t)(q - *r);
}

static int
starts_ends(const char *s, const char *pre, const char *suf)
{
	size_t n = strlen(s), a = strlen(pre), b = strlen(suf);
	return n >= a && n >= b && memcmp(s, pre, a) == 0 && memcmp(s + n - b, suf, b) == 0;
}

/* Where a rendered prompt goes: token ids (text is gathered in seg and
 * encoded before each special id and at the end) and/or its text.  The
 * first error sticks in rv and later calls do nothing, so a renderer writes
 * its turns straight and checks rv once. */
typedef struct chat_out {
	const rl_tokenizer *t;
	rl_tokens *ids;
	rl_tokenizer *enc;
	sbuf *text;
	sbuf seg;
	int flags;   /* encode flags (RL_TOK_SPECIAL) */
	int rv;
} chat_out;

static void
co_flush(chat_out *co)
{
	if (co->rv == 0 && co->seg.n && co->ids)
		co->rv = rl_tokenizer_encode(co->ids, co->enc, co->seg.p, co->seg.n, co->flags);
	co->seg.n = 0;
}

static void
co_special(chat_out *co, int32_t id)
{
	size_t l = 0;
	const char *s = rl_tokenizer_token(co->t, id, &l);

	co_flush(co);
	if (co->rv == 0 && co->ids)
		co->rv = rli_tokens_push(co->ids, id);
	if (co->rv == 0 && co->text)
		co->rv = sb_add(co->text, s, l);
}

static void
co_textn(chat_out *co, const char *s, size_t n)
{
	if (co->rv == 0 && co->ids)
		co->rv = sb_add(&co->seg, s, n);
	if (co->rv == 0 && co->text)
		co->rv = sb_add(co->text, s, n);
}

static void co_text(chat_out *co, const char *s) { co_textn(co, s, strlen(s)); }

/* The template to render (*tpl, resolved from RL_CHAT_AUTO) and what the
 * model's own template adds: its system turn when the chat has none (*sys),
 * tool turns (*tools), Qwen3's reasoning rules (*reason).  Errors: a template
 * rlpipe does not render, a thinking switch the template lacks, ChatML on a
 * tokenizer without its tokens. */
static int
chat_check(const rl_tokenizer *t, const rl_chat_msg *m, size_t n, int *tpl, int flags, int *sys, int *tools,
	   int *reason)
{
	int autot = *tpl == RL_CHAT_AUTO;

	*sys = *tools = *reason = 0;
	if (autot) {
		*tpl = t->chat;
		*sys = *tpl == RL_CHAT_CHATML && t->chat_system && (n == 0 || strcmp(m[0].role, "system") != 0);
		*tools = t->chat_tools;
		*reason = t->chat_reason;
	}
	if ((flags & RL_TOK_NO_THINKING) && !(*reason && t->chat_switch)) {
		if (autot)
			rl_error("enable_thinking=false: the model's chat template (%s%s%s) has no thinking switch",
			    t->chat_src ? "'" : "", t->chat_src ? t->chat_src : "the tokenizer's own",
			    t->chat_src ? "'" : "");
		else
			rl_error("enable_thinking=false: the %s template has no thinking switch (only the "
			    "model's own Qwen3 template, --chat-template auto, has)", rl_chat_template_name(*tpl));
		rl_hint("the switch is Qwen3's (its template names enable_thinking); leave thinking on here");
		return RL_EINVAL;
	}
	if (*tpl == RL_CHAT_CHATML && (find(t, "<|im_start|>") < 0 || find(t, "<|im_end|>") < 0)) {
		rl_error("ChatML needs the tokens <|im_start|> and <|im_end|>, which this tokenizer lacks");
		rl_hint("use the plain template (rl-rollout --chat-template plain, rl-rollout tokenize --template plain)");
		return RL_ENOTSUP;
	}
	return RL_OK;
}

/* One assistant turn under Qwen3's rules: turns after the last user query
 * (lastq) keep their reasoning, in <think> ... </think>, when they are the
 * last turn or have some. */
static void
chatml_assistant(chat_out *co, const rl_chat_msg *mi, int last, int after_query)
{
	const char *r, *c;
	size_t rn, cn;

	split_reasoning(mi, &r, &rn, &c, &cn);
	if (after_query && (last || rn)) {
		while (rn && *r == '\n')
			r++, rn--;
		while (rn && r[rn - 1] == '\n')
			rn--;
		while (cn && *c == '\n')
			c++, cn--;
		co_text(co, "<think>\n");
		co_textn(co, r, rn);
		co_text(co, "\n</think>\n\n");
	}
	co_textn(co, c, cn);
}

/* ChatML, with the model's system turn, tool turns and Qwen3's reasoning
 * where its template has them (chat_check). */
static int
chat_chatml(chat_out *co, const rl_chat_msg *m, size_t n, int sys, int tools, int reason, int gen, int nothink)
{
	const rl_tokenizer *t = co->t;
	int32_t ims = find(t, "<|im_start|>"), ime = find(t, "<|im_end|>");
	size_t lastq = n ? n - 1 : 0;

	/* Qwen3: the last user query is one that is not a tool response in disguise */
	for (size_t i = n; reason && i-- > 0;) {
		if (strcmp(m[i].role, "user") == 0 &&
		    !starts_ends(m[i].content, "<tool_response>", "</tool_response>")) {
			lastq = i;
			break;
		}
	}
	if (sys) {
		co_special(co, ims);
		co_text(co, "system\n");
		co_text(co, t->chat_system);
		co_special(co, ime);
		co_text(co, "\n");
	}
	for (size_t i = 0; i < n && co->rv == 0; i++) {
		const char *role = m[i].role;
		int tool = tools && strcmp(role, "tool") == 0;
		if (tools && !tool && strcmp(role, "user") != 0 && strcmp(role, "system") != 0 &&
		    strcmp(role, "assistant") != 0) {
			/* the template would leave the turn out without a word */
			rl_error("message %zu: role '%s' is not one the model's chat template renders "
			    "(system, user, assistant, tool)", i + 1, role);
			return RL_EINVAL;
		}
		if (tool) {
			/* consecutive tool results are one user turn */
			if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) {
				co_special(co, ims);
				co_text(co, "user");
			}
			co_text(co, "\n<tool_response>\n");
			co_text(co, m[i].content);
			co_text(co, "\n</tool_response>");
			if (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0) {
				co_special(co, ime);
				co_text(co, "\n");
			}
			continue;
		}
		co_special(co, ims);
		co_text(co, role);
		co_text(co, "\n");
		if (reason && strcmp(role, "assistant") == 0)
			chatml_assistant(co, &m[i], i + 1 == n, i > lastq);
		else
			co_text(co, m[i].content);
		co_special(co, ime);
		co_text(co, "\n");
	}
	if (gen) {
		co_special(co, ims);
		co_text(co, "assistant\n");
		if (reason && t->chat_genthink)
			co_text(co, "<think>\n");
		if (nothink)
			co_text(co, "<think>\n\n</think>\n\n");
	}
	return co->rv;
}

/* The prompt as a list of steps: a special id, or text to encode. */
/* A template rlpipe has no rules of its own for, rendered by the Jinja engine
 * as transformers' apply_chat_template renders it: messages (role, content,
 * reasoning_content), add_generation_prompt, bos_token, eos_token, and
 * enable_thinking=false under RL_TOK_NO_THINKING.  The ids are the text
 * encoded with special tokens matched, as transformers tokenizes a rendered
 * chat (the template writes its markers as text). */
static int
chat_jinja(const rl_tokenizer *t, const rl_chat_msg *m, size_t n, const cJSON *tools, int flags, rl_tokens *ids,
	   rl_tokenizer *enc, sbuf *text)
{
	cJSON *ctx = cJSON_CreateObject(), *ms = ctx ? cJSON_AddArrayToObject(ctx, "messages") : NULL;
	char *out = NULL;
	size_t len = 0;
	int rv = RL_ENOMEM;

	if (!ms)
		goto out;
	for (size_t i = 0; i < n; i++) {
		cJSON *o = cJSON_CreateObject();
		if (!o || !cJSON_AddItemToArray(ms, o) || !cJSON_AddStringToObject(o, "role", m[i].role) ||
		    !cJSON_AddStringToObject(o, "content", m[i].content) ||
		    (m[i].reasoning && !cJSON_AddStringToObject(o, "reasoning_content", m[i].reasoning)) ||
		    (m[i].tool_calls && !cJSON_AddItemToObject(o, "tool_calls", cJSON_Duplicate(m[i].tool_calls, 1))))
			goto out;
	}
	if (tools && !cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, 1)))
		goto out;
	if (!cJSON_AddBoolToObject(ctx, "add_generation_prompt", (flags & RL_TOK_GEN_PROMPT) != 0) ||
	    ((flags & RL_TOK_NO_THINKING) && !cJSON_AddFalseToObject(ctx, "enable_thinking")))
		goto out;
	const char *names[2] = { "bos_token", "eos_token" };
	int32_t tids[2] = { t->bos, t->eos };
	for (int k = 0; k < 2; k++) {
		size_t l = 0;
		const char *s = tids[k] >= 0 ? rl_tokenizer_token(t, tids[k], &l) : "";
		char *c = strndup(s ? s : "", l);
		cJSON *v = c ? cJSON_CreateString(c) : NULL;
		free(c);
		if (!v || !cJSON_AddItemToObject(ctx, names[k], v)) {
			cJSON_Delete(v);
			goto out;
		}
	}
	if (!t->chat_jinja) {
		rl_error("%s", t->chat_err ? t->chat_err : "the chat template was not parsed");
		rv = t->chat_err ? t->chat_err_rv : RL_ENOTSUP;
		goto out;
	}
	if ((rv = rl_jinja_render(&out, &len, t->chat_jinja, ctx, NULL)) != 0)
		goto out;
	if (ids && (rv = rl_tokenizer_encode(ids, enc, out, len, RL_TOK_SPECIAL)) != 0)
		goto out;
	if (text)
		rv = sb_add(text, out, len);
out:
	free(out);
	cJSON_Delete(ctx);
	return rv;
}

static int
chat_walk(const rl_tokenizer *t, const rl_chat_msg *m, size_t n, const cJSON *tools, int tpl, int flags,
	  rl_tokens *ids, rl_tokenizer *enc, sbuf *text)
{
	chat_out co = { .t = t, .ids = ids, .enc = enc, .text = text, .flags = flags & RL_TOK_SPECIAL };
	int rv, sys, qtools, reason, gen = flags & RL_TOK_GEN_PROMPT, nothink = flags & RL_TOK_NO_THINKING;

	if (tpl == RL_CHAT_AUTO && t->chat_foreign && t->chat_text) {
		if ((flags & RL_TOK_NO_THINKING) && !rl_tokenizer_chat_thinking(t)) {
			rl_error("enable_thinking=false: the model's chat template ('%s') has no thinking switch",
			    t->chat_src);
			rl_hint("the switch is a template's enable_thinking variable; leave thinking on here");
			return RL_EINVAL;
		}
		return chat_jinja(t, m, n, tools, flags, ids, enc, text);
	}
	/* tools and tool calls have no rules of rlpipe's own: the model's
	 * template renders them, as apply_chat_template(tools=...) does */
	int calls = 0;
	for (size_t i = 0; i < n; i++)
		calls |= m[i].tool_calls != NULL;
	if (tools || calls) {
		if (tpl != RL_CHAT_AUTO || !t->chat_text) {
			rl_error("%s: rendered only by the model's own chat template (%s)",
			    tools ? "tools" : "tool calls", t->chat_text ? "not with an explicit template" : "the model has none");
			return RL_ENOTSUP;
		}
		if ((flags & RL_TOK_NO_THINKING) && !rl_tokenizer_chat_thinking(t)) {
			rl_error("enable_thinking=false: the model's chat template ('%s') has no thinking switch",
			    t->chat_src);
			return RL_EINVAL;
		}
		return chat_jinja(t, m, n, tools, flags, ids, enc, text);
	}
	if ((rv = chat_check(t, m, n, &tpl, flags, &sys, &qtools, &reason)) != 0)
		return rv;
	if (tpl == RL_CHAT_CHATML) {
		rv = chat_chatml(&co, m, n, sys, qtools, reason, gen, nothink);
	} else {
		if (t->bos >= 0)
			co_special(&co, t->bos);
		for (size_t i = 0; i < n; i++) {
			co_text(&co, m[i].role);
			co_text(&co, ": ");
			co_text(&co, m[i].content);
			co_text(&co, "\n");
		}
		if (gen)
			co_text(&co, "assistant:");
		rv = co.rv;
	}
	if (rv == 0) {
		co_flush(&co);
		rv = co.rv;
	}
	free(co.seg.p);
	return rv;
}

int
rl_tokenizer_apply_chat(rl_tokens *out, rl_tokenizer *t, const rl_chat_msg *m, size_t n, int tpl, int flags)
{
	return chat_walk(t, m, n, NULL, tpl, flags & (RL_TOK_SPECIAL | RL_TOK_GEN_PROMPT | RL_TOK_NO_THINKING), out, t, NULL);
}

int
rl_tokenizer_apply_chat_tools(rl_tokens *out, rl_tokenizer *t, const rl_chat_msg *m, size_t n, const cJSON *tools,
			      int tpl, int flags)
{
	return chat_walk(t, m, n, tools, tpl, flags & (RL_TOK_SPECIAL | RL_TOK_GEN_PROMPT | RL_TOK_NO_THINKING), out, t,
	    NULL);
}

int
rl_tokenizer_render_chat(char **text, size_t *len, const rl_tokenizer *t, const rl_chat_msg *m, size_t n,
			 int tpl, int flags)
{
	return rl_tokenizer_render_chat_tools(text, len, t, m, n, NULL, tpl, flags);
}

int
rl_tokenizer_render_chat_tools(char **text, size_t *len, const rl_tokenizer *t, const rl_chat_msg *m, size_t n,
			       const cJSON *tools, int tpl, int flags)
{
	sbuf b = { 0 };
	int rv = chat_walk(t, m, n, tools, tpl, flags, NULL, NULL, &b);
	if (!rv && !b.p)
		rv = sb_add(&b, "", 0);
	if (rv) {
		free(b.p);
		return rv;
	}
	*text = b.p;
	*len = b.n;
	return 0;
}

/* ---- accessors --------------------------------------------------------------------- */
int32_t rl_tokenizer_vocab_size(const rl_tokenizer *t) { return t->ntok; }
int32_t rl_tokenizer_eos_id(const rl_tokenizer *t) { return t->eos; }
int32_t rl_tokenizer_bos_id(const rl_tokenizer *t) { return t->bos; }
int32_t rl_tokenizer_pad_id(const rl_tokenizer *t) { return t->pad; }
const char *rl_tokenizer_kind(const rl_tokenizer *t) { return t->kind == KIND_BYTES ? "bytes" : "bpe"; }

int
rl_tokenizer_is_special(const rl_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->ntok && (t->tflags[id] & T_SPECIAL);
}

const char *
rl_tokenizer_bytes_json(void)
{
	return "{\n"
	       "  \"version\": \"1.0\",\n"
	       "  \"model\": {\"type\": \"rlpipe-bytes\", \"bos_token\": \"<|bos|>\", \"eos_token\": \"<|eos|>\",\n"
	       "            \"pad_token\": \"<|pad|>\", \"chat_template\": \"chatml\"},\n"
	       "  \"added_tokens\": [\n"
	       "    {\"id\": 256, \"content\": \"<|bos|>\", \"special\": true},\n"
	       "    {\"id\": 257, \"content\": \"<|eos|>\", \"special\": true},\n"
	       "    {\"id\": 258, \"content\": \"<|pad|>\", \"special\": true},\n"
	       "    {\"id\": 259, \"content\": \"<|im_start|>\", \"special\": true},\n"
	       "    {\"id\": 260, \"content\": \"<|im_end|>\", \"special\": true}\n"
	       "  ]\n"
	       "}\n";
}

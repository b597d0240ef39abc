/*
 * traj.c — trajectory records (typed, tagged fields), their binary encoding
 * and batches of them in zstd frames: the core of rl-trajectory(5).
 *
 * JSONL lives in traj_json.c, stream readers and writers in traj_stream.c.
 * Leaves out: big-endian hosts (refused at compile time in traj_int.h).
 */
#include "stream/traj_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/json.h"

/* ---- tags and dtypes -------------------------------------------------------------- */

static const struct tagdef {
	uint16_t tag;
	int8_t dtype;
	uint8_t scalar;
	const char *name;
} tagdefs[] = {
	{ RL_TAG_ID, RL_U64, 1, "id" },
	{ RL_TAG_GROUP, RL_U64, 1, "group" },
	{ RL_TAG_INDEX, RL_I32, 1, "index" },
	{ RL_TAG_GROUP_SIZE, RL_I32, 1, "group_size" },
	{ RL_TAG_VERSION, RL_I32, 0, "version" },
	{ RL_TAG_PROMPT, RL_I32, 0, "prompt" },
	{ RL_TAG_RESPONSE, RL_I32, 0, "response" },
	{ RL_TAG_PROMPT_TEXT, RL_TRAJ_STR, 0, "prompt_text" },
	{ RL_TAG_RESPONSE_TEXT, RL_TRAJ_STR, 0, "response_text" },
	{ RL_TAG_LOGPROBS, RL_F32, 0, "logprobs" },
	{ RL_TAG_REF_LOGPROBS, RL_F32, 0, "ref_logprobs" },
	{ RL_TAG_FINISH, RL_TRAJ_STR, 0, "finish" },
	{ RL_TAG_REWARD, RL_F32, 1, "reward" },
	{ RL_TAG_TOKEN_REWARDS, RL_F32, 0, "token_rewards" },
	{ RL_TAG_META, RL_TRAJ_JSON, 0, "meta" },
	{ RL_TAG_TEMPERATURE, RL_F32, 1, "temperature" },
	{ RL_TAG_TOP_P, RL_F32, 1, "top_p" },
	{ RL_TAG_TOP_K, RL_I32, 1, "top_k" },
	{ RL_TAG_MAX_TOKENS, RL_I32, 1, "max_tokens" },
	{ RL_TAG_SEED, RL_U64, 1, "seed" },
	{ RL_TAG_VALUES, RL_F32, 0, "values" },
	{ RL_TAG_ADVANTAGES, RL_F32, 0, "advantages" },
	{ RL_TAG_LOSS_MASK, RL_U8, 0, "loss_mask" },
	{ RL_TAG_TASK, RL_TRAJ_STR, 0, "task" },
	{ RL_TAG_WORKER, RL_TRAJ_STR, 0, "worker" },
	{ RL_TAG_TS_CREATED, RL_F64, 1, "ts_created" },
	{ RL_TAG_TS_GEN_START, RL_F64, 1, "ts_gen_start" },
	{ RL_TAG_TS_GEN_END, RL_F64, 1, "ts_gen_end" },
	{ RL_TAG_TS_SCORED, RL_F64, 1, "ts_scored" },
	{ RL_TAG_TS_TRAINED, RL_F64, 1, "ts_trained" },
	{ RL_TAG_TURNS, RL_I32, 0, "turns" },
	{ RL_TAG_TURN_VERSIONS, RL_I32, 0, "turn_versions" },
	{ RL_TAG_TURN_REWARDS, RL_F32, 0, "turn_rewards" },
	{ RL_TAG_ENV_ERROR, RL_TRAJ_STR, 0, "env_error" },
};

static const struct tagdef *
tagdef(unsigned tag)
{
	for (size_t i = 0; i < RL_ARRAY_LEN(tagdefs); i++)
		if (tagdefs[i].tag == tag)
			return &tagdefs[i];
	return NULL;
}

const char *
rl_traj_tag_name(unsigned tag)
{
	const struct tagdef *d = tagdef(tag);
	return d ? d->name : NULL;
}

int
rl_traj_tag_parse(const char *name)
{
	for (size_t i = 0; i < RL_ARRAY_LEN(tagdefs); i++)
		if (strcmp(tagdefs[i].name, name) == 0)
			return tagdefs[i].tag;
	return -1;
}

int
rl_traj_tag_dtype(unsigned tag, int *is_scalar)
{
	const struct tagdef *d = tagdef(tag);

	if (d == NULL)
		return -1;
	if (is_scalar)
		*is_scalar = d->scalar;
	return d->dtype;
}

const char *
rl_traj_dtype_name(int dtype)
{
	if (dtype == RL_TRAJ_STR)
		return "STR";
	if (dtype == RL_TRAJ_JSON)
		return "JSON";
	if (dtype >= 0 && dtype < RL_DTYPE_COUNT)
		return rl_dtype_name(dtype);
	return NULL;
}

int
rl_traj_dtype_parse(const char *name)
{
	if (strcmp(name, "STR") == 0)
		return RL_TRAJ_STR;
	if (strcmp(name, "JSON") == 0)
		return RL_TRAJ_JSON;
	return rl_dtype_parse(name);
}

size_t
rl_traj_dtype_size(int dtype)
{
	if (dtype == RL_TRAJ_STR || dtype == RL_TRAJ_JSON)
		return 1;
	return rl_dtype_size(dtype);
}

/* Element size for length checks: unknown dtypes are opaque bytes. */
static size_t
elsize(int dtype)
{
	size_t s = rl_traj_dtype_size(dtype);
	return s ? s : 1;
}

void
rl_traj_limits_default(rl_traj_limits *lim)
{
	lim->max_frame = (size_t)256 << 20;
	lim->max_record = (size_t)64 << 20;
	lim->max_fields = 1024;
	lim->max_records = (size_t)1 << 20;
	lim->max_line = (size_t)64 << 20;
}

const rl_traj_limits *
rli_limits(const rl_traj_limits *lim)
{
	static const rl_traj_limits def = {
		(size_t)256 << 20, (size_t)64 << 20, 1024, (size_t)1 << 20, (size_t)64 << 20
	};
	return lim ? lim : &def;
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

/* The length of the valid multi-byte sequence at s[i] (lead byte >= 0x80),
 * or 0: overlong forms, surrogates and code points past U+10FFFF are not. */
static size_t
utf8_seq(const uint8_t *s, size_t n, size_t i)
{
	uint8_t c = s[i];
	size_t k;
	uint32_t cp;

	if (c >= 0xc2 && c <= 0xdf) {
		k = 1;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		k = 2;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		k = 3;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (n - i <= k)
		return 0;
	for (size_t j = 1; j <= k; j++) {
		if ((s[i + j] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i + j] & 0x3f);
	}
	if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return k + 1;
}

size_t
rl_utf8_char_len(const void *text, size_t n)
{
	const uint8_t *s = text;

	if (n == 0)
		return 0;
	return s[0] < 0x80 ? 1 : utf8_seq(s, n, 0);
}

void
rl_utf8_fix(char *text, size_t n)
{
	uint8_t *s = (uint8_t *)text;
	size_t i = 0;

	while (i < n) {
		size_t k;
		if (s[i] != 0 && s[i] < 0x80) {
			i++;
		} else if (s[i] != 0 && (k = utf8_seq(s, n, i)) != 0) {
			i += k;
		} else {
			s[i++] = '?';
		}
	}
}

int
rli_utf8_ok(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		/* ASCII fast path, 8 bytes at a time (no high bit, no NUL) */
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, s + i, 8);
			if ((w & 0x8080808080808080ull) ||
			    ((w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull))
				break;
			i += 8;
		}
		if (i >= n)
			break;
		uint8_t c = s[i];
		if (c == 0)
			return 0;
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t k = utf8_seq(s, n, i);
		if (k == 0)
			return 0;
		i += k;
	}
	return 1;
}

/* ---- records ---------------------------------------------------------------------------- */

int
rl_traj_create(rl_traj **out)
{
	rl_traj *t = calloc(1, sizeof *t);

	*out = t;
	if (t == NULL) {
		rl_error("out of memory");
		return RL_ENOMEM;
	}
	return RL_OK;
}

void
rl_traj_destroy(rl_traj *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->cap; i++)
		free(t->s[i].own);
	free(t->s);
	free(t);
}

void
rl_traj_clear(rl_traj *t)
{
	t->n = 0;
}

size_t
rl_traj_nfields(const rl_traj *t)
{
	return t->n;
}

static rli_slot *
slot_of(const rl_traj *t, unsigned tag)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->s[i].tag == tag)
			return &t->s[i];
	return NULL;
}

static void
view(rl_traj_field *f, const rli_slot *s)
{
	f->tag = s->tag;
	f->dtype = s->dtype;
	f->nbytes = s->nbytes;
	f->data = s->data;
}

int
rl_traj_field_at(const rl_traj *t, size_t i, rl_traj_field *out)
{
	if (i >= t->n)
		return RL_ENOENT;
	view(out, &t->s[i]);
	return RL_OK;
}

int
rl_traj_find(const rl_traj *t, unsigned tag, rl_traj_field *out)
{
	const rli_slot *s = slot_of(t, tag);

	if (s == NULL)
		return RL_ENOENT;
	if (out)
		view(out, s);
	return RL_OK;
}

int
rl_traj_has(const rl_traj *t, unsigned tag)
{
	return slot_of(t, tag) != NULL;
}

/* Grow the slot array to at least n slots (new slots zeroed). */
static int
reserve_slots(rl_traj *t, size_t n)
{
	size_t cap;
	rli_slot *s;

	if (n <= t->cap)
		return RL_OK;
	cap = t->cap ? t->cap * 2 : 16;
	while (cap < n)
		cap *= 2;
	s = realloc(t->s, cap * sizeof *s);
	if (s == NULL) {
		rl_error("out of memory (record with %zu fields)", n);
		return RL_ENOMEM;
	}
	memset(s + t->cap, 0, (cap - t->cap) * sizeof *s);
	t->s = s;
	t->cap = cap;
	return RL_OK;
}

/* Copy nbytes into the slot's own memory, 8-aligned, NUL after text.  data
 * may point into the slot's current memory: the old block is freed only after
 * the copy. */
static int
slot_store(rli_slot *s, int dtype, const void *data, size_t nbytes)
{
	size_t need = rli_padded(dtype, nbytes);

	if (need == 0)
		need = 8;
	if (s->owncap < need) {
		void *p = malloc(need);
		if (p == NULL) {
			rl_error("out of memory (field of %zu bytes)", nbytes);
			return RL_ENOMEM;
		}
		if (nbytes)
			memcpy(p, data, nbytes);
		free(s->own);
		s->own = p;
		s->owncap = need;
	} else if (nbytes) {
		memmove(s->own, data, nbytes);
	}
	memset((char *)s->own + nbytes, 0, need - nbytes);
	s->data = s->own;
	s->dtype = (uint8_t)dtype;
	s->nbytes = (uint32_t)nbytes;
	return RL_OK;
}

int
rl_traj_set(rl_traj *t, unsigned tag, int dtype, const void *data, size_t nbytes)
{
	rli_slot *s;
	int rv;

	if (tag == 0 || tag > RL_TAG_MAX || dtype < 0 || dtype > 255 || nbytes > UINT32_MAX - 16 ||
	    nbytes % elsize(dtype) != 0 || (nbytes && data == NULL))
		return RL_EINVAL;
	if ((dtype == RL_TRAJ_STR || dtype == RL_TRAJ_JSON) && !rli_utf8_ok(data, nbytes))
		return RL_EINVAL;
	s = slot_of(t, tag);
	if (s == NULL) {
		if ((rv = reserve_slots(t, t->n + 1)) != 0)
			return rv;
		s = &t->s[t->n];
		/* a failed store leaves t as it was (n unchanged) */
		if ((rv = slot_store(s, dtype, data, nbytes)) != 0)
			return rv;
		s->tag = (uint16_t)tag;
		t->n++;
		return RL_OK;
	}
	return slot_store(s, dtype, data, nbytes);
}

int
rl_traj_del(rl_traj *t, unsigned tag)
{
	rli_slot *s = slot_of(t, tag), keep;
	size_t i;

	if (s == NULL)
		return RL_OK;
	i = (size_t)(s - t->s);
	keep = *s;
	memmove(&t->s[i], &t->s[i + 1], (t->n - i - 1) * sizeof *s);
	t->n--;
	t->s[t->n] = keep;   /* the slot's memory stays for reuse */
	return RL_OK;
}

int
rl_traj_own(rl_traj *t)
{
	for (size_t i = 0; i < t->n; i++) {
		rli_slot *s = &t->s[i];
		if (s->data != s->own || s->own == NULL) {
			int rv = slot_store(s, s->dtype, s->data, s->nbytes);
			if (rv != 0)
				return rv;
		}
	}
	return RL_OK;
}

int
rl_traj_dup(rl_traj **out, const rl_traj *src)
{
	rl_traj *t;
	int rv;

	if ((rv = rl_traj_create(&t)) != 0)
		return rv;
	for (size_t i = 0; i < src->n; i++) {
		const rli_slot *s = &src->s[i];
		if ((rv = rl_traj_set(t, s->tag, s->dtype, s->data, s->nbytes)) != 0) {
			rl_traj_destroy(t);
			*out = NULL;
			return rv;
		}
	}
	*out = t;
	return RL_OK;
}

/* ---- typed access ------------------------------------------------------------------------ */

/* Read the single element of a scalar field as int64/uint64/double. */
static int
scalar(const rl_traj *t, unsigned tag, int *isint, int64_t *si, uint64_t *ui, double *d)
{
	const rli_slot *s = slot_of(t, tag);
	const void *p;

	if (s == NULL)
		return RL_ENOENT;
	if (rl_traj_dtype_size(s->dtype) == 0 || s->dtype == RL_TRAJ_STR || s->dtype == RL_TRAJ_JSON ||
	    s->nbytes != rl_dtype_size(s->dtype))
		return RL_ESHAPE;
	p = s->data;
	*isint = 1;
	*si = 0;
	*ui = 0;
	switch (s->dtype) {
	case RL_I8: *si = *(const int8_t *)p; break;
	case RL_I16: { int16_t v; memcpy(&v, p, 2); *si = v; break; }
	case RL_I32: { int32_t v; memcpy(&v, p, 4); *si = v; break; }
	case RL_I64: memcpy(si, p, 8); break;
	case RL_U8: case RL_BOOL: *ui = *(const uint8_t *)p; *si = (int64_t)*ui; *isint = 2; break;
	case RL_U32: { uint32_t v; memcpy(&v, p, 4); *ui = v; *si = v; *isint = 2; break; }
	case RL_U64: memcpy(ui, p, 8); *isint = 3; break;
	default: *isint = 0; break;
	}
	if (*isint == 1) {
		*ui = (uint64_t)*si;
		*d = (double)*si;
	} else if (*isint >= 2) {
		*d = (double)*ui;
	} else {
		switch (s->dtype) {
		case RL_F32: { float v; memcpy(&v, p, 4); *d = v; break; }
		case RL_F64: memcpy(d, p, 8); break;
		case RL_BF16: { uint16_t v; memcpy(&v, p, 2); *d = rl_bf16_to_f32(v); break; }
		case RL_F16: { uint16_t v; memcpy(&v, p, 2); *d = rl_f16_to_f32(v); break; }
		default: return RL_ESHAPE;
		}
	}
	return RL_OK;
}

int
rl_traj_get_u64(const rl_traj *t, unsigned tag, uint64_t *out)
{
	int isint, rv;
	int64_t si;
	uint64_t ui;
	double d;

	if ((rv = scalar(t, tag, &isint, &si, &ui, &d)) != 0)
		return rv;
	if (!isint || (isint == 1 && si < 0))
		return RL_ESHAPE;
	*out = ui;
	return RL_OK;
}

int
rl_traj_get_i64(const rl_traj *t, unsigned tag, int64_t *out)
{
	int isint, rv;
	int64_t si;
	uint64_t ui;
	double d;

	if ((rv = scalar(t, tag, &isint, &si, &ui, &d)) != 0)
		return rv;
	if (!isint || (isint == 3 && ui > INT64_MAX))
		return RL_ESHAPE;
	*out = isint == 3 ? (int64_t)ui : si;
	return RL_OK;
}

int
rl_traj_get_i32(const rl_traj *t, unsigned tag, int32_t *out)
{
	int64_t v;
	int rv;

	if ((rv = rl_traj_get_i64(t, tag, &v)) != 0)
		return rv;
	if (v < INT32_MIN || v > INT32_MAX)
		return RL_ESHAPE;
	*out = (int32_t)v;
	return RL_OK;
}

int
rl_traj_get_f64(const rl_traj *t, unsigned tag, double *out)
{
	int isint, rv;
	int64_t si;
	uint64_t ui;

	if ((rv = scalar(t, tag, &isint, &si, &ui, out)) != 0)
		return rv;
	return RL_OK;
}

int
rl_traj_get_f32(const rl_traj *t, unsigned tag, float *out)
{
	double d;
	int rv;

	if ((rv = rl_traj_get_f64(t, tag, &d)) != 0)
		return rv;
	*out = (float)d;
	return RL_OK;
}

int rl_traj_set_u64(rl_traj *t, unsigned tag, uint64_t v) { return rl_traj_set(t, tag, RL_U64, &v, 8); }
int rl_traj_set_i64(rl_traj *t, unsigned tag, int64_t v) { return rl_traj_set(t, tag, RL_I64, &v, 8); }
int rl_traj_set_i32(rl_traj *t, unsigned tag, int32_t v) { return rl_traj_set(t, tag, RL_I32, &v, 4); }
int rl_traj_set_f32(rl_traj *t, unsigned tag, float v) { return rl_traj_set(t, tag, RL_F32, &v, 4); }
int rl_traj_set_f64(rl_traj *t, unsigned tag, double v) { return rl_traj_set(t, tag, RL_F64, &v, 8); }

static int
array(const rl_traj *t, unsigned tag, int dtype, const void **data, size_t *n)
{
	const rli_slot *s = slot_of(t, tag);

	if (s == NULL)
		return RL_ENOENT;
	if (s->dtype != dtype)
		return RL_ESHAPE;
	*data = s->data;
	*n = s->nbytes / rl_dtype_size(dtype);
	return RL_OK;
}

int rl_traj_get_i32s(const rl_traj *t, unsigned tag, const int32_t **d, size_t *n) { return array(t, tag, RL_I32, (const void **)d, n); }
int rl_traj_get_f32s(const rl_traj *t, unsigned tag, const float **d, size_t *n) { return array(t, tag, RL_F32, (const void **)d, n); }
int rl_traj_get_f64s(const rl_traj *t, unsigned tag, const double **d, size_t *n) { return array(t, tag, RL_F64, (const void **)d, n); }
int rl_traj_get_u8s(const rl_traj *t, unsigned tag, const uint8_t **d, size_t *n) { return array(t, tag, RL_U8, (const void **)d, n); }

static int
set_array(rl_traj *t, unsigned tag, int dtype, const void *data, size_t n)
{
	size_t nb;

	if (rl_mul_size(&nb, n, rl_dtype_size(dtype)) != 0)
		return RL_EINVAL;
	return rl_traj_set(t, tag, dtype, data, nb);
}

int rl_traj_set_i32s(rl_traj *t, unsigned tag, const int32_t *d, size_t n) { return set_array(t, tag, RL_I32, d, n); }
int rl_traj_set_f32s(rl_traj *t, unsigned tag, const float *d, size_t n) { return set_array(t, tag, RL_F32, d, n); }
int rl_traj_set_f64s(rl_traj *t, unsigned tag, const double *d, size_t n) { return set_array(t, tag, RL_F64, d, n); }
int rl_traj_set_u8s(rl_traj *t, unsigned tag, const uint8_t *d, size_t n) { return set_array(t, tag, RL_U8, d, n); }

int
rl_traj_get_str(const rl_traj *t, unsigned tag, const char **str, size_t *len)
{
	const rli_slot *s = slot_of(t, tag);

	if (s == NULL)
		return RL_ENOENT;
	if (s->dtype != RL_TRAJ_STR && s->dtype != RL_TRAJ_JSON)
		return RL_ESHAPE;
	*str = s->data;
	if (len)
		*len = s->nbytes;
	return RL_OK;
}

int
rl_traj_set_strn(rl_traj *t, unsigned tag, const char *str, size_t len)
{
	return rl_traj_set(t, tag, RL_TRAJ_STR, str, len);
}

int
rl_traj_set_str(rl_traj *t, unsigned tag, const char *str)
{
	return rl_traj_set(t, tag, RL_TRAJ_STR, str, strlen(str));
}

int
rl_traj_set_json(rl_traj *t, unsigned tag, const char *text)
{
	cJSON *j = cJSON_Parse(text);
	char *s;
	int rv;

	if (j == NULL)
		return RL_EINVAL;
	s = rl_json_print(j);
	cJSON_Delete(j);
	if (s == NULL)
		return RL_ENOMEM;
	rv = rl_traj_set(t, tag, RL_TRAJ_JSON, s, strlen(s));
	free(s);
	return rv;
}

int
rl_traj_set_version(rl_traj *t, int32_t first, int32_t last)
{
	int32_t v[2] = { first, last };
	return rl_traj_set_i32s(t, RL_TAG_VERSION, v, 2);
}

int
rl_traj_get_version(const rl_traj *t, int32_t *first, int32_t *last)
{
	const int32_t *v;
	size_t n;
	int rv;

	if ((rv = rl_traj_get_i32s(t, RL_TAG_VERSION, &v, &n)) != 0)
		return rv;
	if (n < 1 || n > 2)
		return RL_ESHAPE;
	*first = v[0];
	*last = v[n - 1];
	return RL_OK;
}

/* ---- binary records ---------------------------------------------------------------------- */

static inline uint32_t
rd32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline uint16_t
rd16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

size_t
rl_traj_encoded_size(const rl_traj *t)
{
	size_t n = 8;

	for (size_t i = 0; i < t->n; i++)
		n += 8 + rli_padded(t->s[i].dtype, t->s[i].nbytes);
	return n;
}

int
rl_traj_encode(rl_buf *out, const rl_traj *t)
{
	size_t len = rl_traj_encoded_size(t);
	uint8_t *p;
	uint32_t u;
	int rv;

	if (len > UINT32_MAX) {
		rl_error("record of %zu bytes is too large to encode", len);
		return RL_ETOOBIG;
	}
	if ((rv = rl_buf_reserve(out, len)) != 0)
		return rv;
	p = out->p + out->len;
	u = (uint32_t)len;
	memcpy(p, &u, 4);
	u = (uint32_t)t->n;
	memcpy(p + 4, &u, 4);
	p += 8;
	for (size_t i = 0; i < t->n; i++) {
		const rli_slot *s = &t->s[i];
		size_t pad = rli_padded(s->dtype, s->nbytes);
		memcpy(p, &s->tag, 2);
		p[2] = s->dtype;
		p[3] = 0;
		memcpy(p + 4, &s->nbytes, 4);
		p += 8;
		if (s->nbytes)
			memcpy(p, s->data, s->nbytes);
		memset(p + s->nbytes, 0, pad - s->nbytes);
		p += pad;
	}
	out->len += len;
	return RL_OK;
}

#define FAIL(code, ...)                          \
	do {                                     \
		char m_[256];                    \
		snprintf(m_, sizeof m_, __VA_ARGS__); \
		rl_error("%s: %s", what ? what : "record", m_); \
		return code;                     \
	} while (0)

/* Does a tag occur twice among the nf (already checked) fields of record p?
 * Few fields: compare the tags collected in small[].  Many: a bitmap over all
 * 65536 tags, zero between calls (each set bit is cleared again), so hostile
 * records with many fields cost linear time. */
static int
dup_tag(const uint8_t *p, size_t nf, const uint16_t *small, size_t nsmall, unsigned *tag)
{
	static _Thread_local uint64_t seen[65536 / 64];
	size_t off = 8, i, k;
	int dup = 0;

	if (nf <= nsmall) {
		for (i = 1; i < nf; i++)
			for (k = 0; k < i; k++)
				if (small[k] == small[i]) {
					*tag = small[i];
					return 1;
				}
		return 0;
	}
	for (i = 0; i < nf; i++) {
		uint16_t t = rd16(p + off);
		if (seen[t / 64] & (1ull << (t % 64))) {
			*tag = t;
			dup = 1;
			break;
		}
		seen[t / 64] |= 1ull << (t % 64);
		off += 8 + rli_padded(p[off + 2], rd32(p + off + 4));
	}
	off = 8;
	for (k = 0; k < i; k++) {
		uint16_t t = rd16(p + off);
		seen[t / 64] &= ~(1ull << (t % 64));
		off += 8 + rli_padded(p[off + 2], rd32(p + off + 4));
	}
	return dup;
}

/* Does a JSON field hold one JSON value (what the JSONL writer copies out
 * verbatim)?  Checked here so a bad one is refused where it is read, with
 * its place, not later when a lease is printed. */
static int
json_ok(const uint8_t *p, size_t n)
{
	cJSON *j = rl_json_parse_all((const char *)p, n);

	cJSON_Delete(j);
	return j != NULL;
}

int
rli_record_check(const uint8_t *p, size_t n, const rl_traj_limits *lim, const char *what, size_t *lenp)
{
	size_t len, nf, off = 8;
	uint16_t small[32];
	unsigned tagdup;

	lim = rli_limits(lim);
	if (n < 8)
		FAIL(RL_EFORMAT, "truncated record header (%zu of 8 bytes)", n);
	len = rd32(p);
	nf = rd32(p + 4);
	if (len < 8 || len % 8)
		FAIL(RL_EFORMAT, "bad record length %zu (must be >= 8 and a multiple of 8)", len);
	if (len > lim->max_record)
		FAIL(RL_ETOOBIG, "record length %zu over the limit of %zu bytes", len, lim->max_record);
	if (len > n)
		FAIL(RL_EFORMAT, "record length %zu larger than the %zu bytes left", len, n);
	if (nf > lim->max_fields)
		FAIL(RL_ETOOBIG, "%zu fields over the limit of %zu", nf, lim->max_fields);
	for (size_t i = 0; i < nf; i++) {
		uint16_t tag;
		unsigned dt;
		size_t nb, pad;
		if (len - off < 8)
			FAIL(RL_EFORMAT, "field %zu at record byte %zu: header beyond the record end (%zu)", i, off, len);
		tag = rd16(p + off);
		dt = p[off + 2];
		nb = rd32(p + off + 4);
		if (tag == 0)
			FAIL(RL_EFORMAT, "field %zu at record byte %zu: tag 0", i, off);
		if (p[off + 3] != 0)
			FAIL(RL_EFORMAT, "field %zu (tag %u) at record byte %zu: nonzero flags", i, tag, off);
		if (nb % elsize((int)dt))
			FAIL(RL_EFORMAT, "field %zu (tag %u): %zu bytes is not a whole number of %s elements",
			     i, tag, nb, rl_traj_dtype_name((int)dt));
		off += 8;
		pad = rli_padded((int)dt, nb);
		if (pad > len - off)
			FAIL(RL_EFORMAT, "field %zu (tag %u) at record byte %zu: length %zu beyond the record end (%zu)",
			     i, tag, off - 8, nb, len);
		for (size_t k = nb; k < pad; k++)
			if (p[off + k] != 0)
				FAIL(RL_EFORMAT, "field %zu (tag %u): nonzero padding at record byte %zu", i, tag, off + k);
		if ((dt == RL_TRAJ_STR || dt == RL_TRAJ_JSON) && !rli_utf8_ok(p + off, nb))
			FAIL(RL_EFORMAT, "field %zu (tag %u): text is not UTF-8 without NUL bytes", i, tag);
		if (tag == RL_TAG_VERSION && (dt != RL_I32 || nb != 8))
			FAIL(RL_EFORMAT, "field %zu (tag %u, version) at record byte %zu: %s[%zu], not I32[2] [first, last]",
			     i, tag, off - 8, rl_traj_dtype_name((int)dt), nb / elsize((int)dt));
		if (dt == RL_TRAJ_JSON && !json_ok(p + off, nb))
			FAIL(RL_EFORMAT, "field %zu (tag %u) at record byte %zu: not valid JSON", i, tag, off - 8);
		if (i < RL_ARRAY_LEN(small))
			small[i] = tag;
		off += pad;
	}
	if (off != len)
		FAIL(RL_EFORMAT, "%zu bytes after the last field (record length %zu)", len - off, len);
	if (dup_tag(p, nf, small, RL_ARRAY_LEN(small), &tagdup))
		FAIL(RL_EFORMAT, "tag %u occurs twice", tagdup);
	*lenp = len;
	return RL_OK;
}

int
rli_record_load(rl_traj *t, const uint8_t *p)
{
	size_t nf = rd32(p + 4), off = 8;
	int rv;

	if ((rv = reserve_slots(t, nf)) != 0)
		return rv;
	for (size_t i = 0; i < nf; i++) {
		rli_slot *s = &t->s[i];
		s->tag = rd16(p + off);
		s->dtype = p[off + 2];
		s->nbytes = rd32(p + off + 4);
		s->data = p + off + 8;
		off += 8 + rli_padded(s->dtype, s->nbytes);
	}
	t->n = nf;
	return RL_OK;
}

int
rl_traj_decode(rl_traj *t, size_t *used, const void *buf, size_t n, const rl_traj_limits *lim, const char *what)
{
	size_t len;
	int rv;

	if ((rv = rli_record_check(buf, n, lim, what, &len)) != 0)
		return rv;
	if ((rv = rli_record_load(t, buf)) != 0)
		return rv;
	if (used)
		*used = len;
	return RL_OK;
}

/* ---- batches -------------------------------------------------------------------------------- */

int
rl_traj_batch_create(rl_traj_batch **out)
{
	rl_traj_batch *b = calloc(1, sizeof *b);

	*out = b;
	if (b == NULL) {
		rl_error("out of memory");
		return RL_ENOMEM;
	}
	rl_buf_init(&b->data);
	rl_buf_init(&b->frame);
	b->hdr = RL_TRAJ_HEADER_LEN;
	return RL_OK;
}

void
rl_traj_batch_destroy(rl_traj_batch *b)
{
	if (b == NULL)
		return;
	rl_buf_fini(&b->data);
	rl_buf_fini(&b->frame);
	free(b->off);
	ZSTD_freeCCtx(b->cctx);
	ZSTD_freeDCtx(b->dctx);
	free(b);
}

void
rl_traj_batch_clear(rl_traj_batch *b)
{
	b->data.len = 0;
	b->hdr = RL_TRAJ_HEADER_LEN;
	b->n = 0;
	b->bytes = 0;
	b->frame_ok = 0;
}

size_t rl_traj_batch_count(const rl_traj_batch *b) { return b->n; }
size_t rl_traj_batch_bytes(const rl_traj_batch *b) { return b->bytes; }

/* Room for one more record of len bytes; data starts with the header. */
static int
batch_grow(rl_traj_batch *b, size_t len)
{
	int rv;

	if (b->data.len == 0) {
		if ((rv = rl_buf_reserve(&b->data, b->hdr)) != 0)
			return rv;
		memset(b->data.p, 0, b->hdr);
		b->data.len = b->hdr;
	}
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		size_t *o = realloc(b->off, cap * sizeof *o);
		if (o == NULL) {
			rl_error("out of memory (batch of %zu records)", cap);
			return RL_ENOMEM;
		}
		b->off = o;
		b->cap = cap;
	}
	return rl_buf_reserve(&b->data, len);
}

int
rl_traj_batch_add(rl_traj_batch *b, const rl_traj *t)
{
	size_t start;
	int rv;

	if ((rv = batch_grow(b, rl_traj_encoded_size(t))) != 0)
		return rv;
	start = b->data.len;
	if ((rv = rl_traj_encode(&b->data, t)) != 0)
		return rv;
	b->off[b->n++] = start;
	b->bytes += b->data.len - start;
	b->frame_ok = 0;
	return RL_OK;
}

int
rl_traj_batch_add_raw(rl_traj_batch *b, const void *rec, size_t n, const rl_traj_limits *lim)
{
	size_t len;
	int rv;

	if ((rv = rli_record_check(rec, n, lim, NULL, &len)) != 0)
		return rv;
	if ((rv = batch_grow(b, len)) != 0)
		return rv;
	b->off[b->n++] = b->data.len;
	memcpy(b->data.p + b->data.len, rec, len);
	b->data.len += len;
	b->bytes += len;
	b->frame_ok = 0;
	return RL_OK;
}

int
rl_traj_batch_get(const rl_traj_batch *b, size_t i, rl_traj *t)
{
	if (i >= b->n)
		return RL_ENOENT;
	return rli_record_load(t, b->data.p + b->off[i]);
}

int
rl_traj_batch_raw(const rl_traj_batch *b, size_t i, const void **rec, size_t *n)
{
	if (i >= b->n)
		return RL_ENOENT;
	*rec = b->data.p + b->off[i];
	*n = rd32(b->data.p + b->off[i]);
	return RL_OK;
}

int
rl_traj_batch_payload(rl_traj_batch *b, const void **p, size_t *n)
{
	uint16_t v = RL_TRAJ_VERSION, h = (uint16_t)b->hdr;
	uint32_t cnt = (uint32_t)b->n, flags = 0;
	int rv;

	if (b->data.len == 0 && (rv = batch_grow(b, 0)) != 0)
		return rv;
	memcpy(b->data.p, RL_TRAJ_MAGIC, 4);
	memcpy(b->data.p + 4, &v, 2);
	memcpy(b->data.p + 6, &h, 2);
	memcpy(b->data.p + 8, &cnt, 4);
	memcpy(b->data.p + 12, &flags, 4);
	*p = b->data.p;
	*n = b->data.len;
	return RL_OK;
}

int
rl_traj_batch_encode(rl_buf *out, rl_traj_batch *b, int level)
{
	const void *src;
	size_t n, bound, z;
	int rv;

	if (b->n > UINT32_MAX)
		return RL_ETOOBIG;
	if ((rv = rl_traj_batch_payload(b, &src, &n)) != 0)
		return rv;
	if (b->cctx == NULL && (b->cctx = ZSTD_createCCtx()) == NULL) {
		rl_error("out of memory (zstd compression context)");
		return RL_ENOMEM;
	}
	ZSTD_CCtx_reset(b->cctx, ZSTD_reset_session_and_parameters);
	ZSTD_CCtx_setParameter(b->cctx, ZSTD_c_compressionLevel, level ? level : 1);
	ZSTD_CCtx_setParameter(b->cctx, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(b->cctx, ZSTD_c_contentSizeFlag, 1);
	bound = ZSTD_compressBound(n);
	if ((rv = rl_buf_reserve(out, bound)) != 0)
		return rv;
	z = ZSTD_compress2(b->cctx, out->p + out->len, bound, src, n);
	if (ZSTD_isError(z)) {
		rl_error("zstd: cannot compress a batch: %s", ZSTD_getErrorName(z));
		return RL_EIO;
	}
	out->len += z;
	return RL_OK;
}

#undef FAIL
#define FAIL(code, ...)                          \
	do {                                     \
		char m_[256];                    \
		snprintf(m_, sizeof m_, __VA_ARGS__); \
		rl_error("%s: %s", what ? what : "frame", m_); \
		rv = code;                       \
		goto out;                        \
	} while (0)

/* Decompress the frame [buf, buf+fsz) into b->data, bounded by max_frame. */
static int
inflate(rl_traj_batch *b, const uint8_t *buf, size_t fsz, const rl_traj_limits *lim, const char *what)
{
	unsigned long long csize = ZSTD_getFrameContentSize(buf, fsz);
	int rv = RL_OK;

	if (b->dctx == NULL && (b->dctx = ZSTD_createDCtx()) == NULL) {
		rl_error("out of memory (zstd decompression context)");
		return RL_ENOMEM;
	}
	ZSTD_DCtx_reset(b->dctx, ZSTD_reset_session_and_parameters);
	b->data.len = 0;
	if (csize == ZSTD_CONTENTSIZE_ERROR)
		FAIL(RL_EFORMAT, "not a zstd frame");
	if (csize != ZSTD_CONTENTSIZE_UNKNOWN) {
		size_t z;
		if (csize > lim->max_frame)
			FAIL(RL_ETOOBIG, "decompressed size %llu over the limit of %zu bytes", csize, lim->max_frame);
		if ((rv = rl_buf_reserve(&b->data, (size_t)csize + 1)) != 0)
			goto out;
		z = ZSTD_decompressDCtx(b->dctx, b->data.p, (size_t)csize, buf, fsz);
		if (ZSTD_isError(z))
			FAIL(ZSTD_getErrorCode(z) == ZSTD_error_checksum_wrong ? RL_ECHECKSUM : RL_EFORMAT,
			     "zstd: %s", ZSTD_getErrorName(z));
		if (z != csize)
			FAIL(RL_EFORMAT, "frame holds %zu bytes, its header says %llu", z, csize);
		b->data.len = z;
		return RL_OK;
	}
	/* content size not in the header (e.g. `zstd` fed from a pipe): stream */
	{
		ZSTD_inBuffer in = { buf, fsz, 0 };
		for (;;) {
			ZSTD_outBuffer o;
			size_t z;
			if (b->data.cap - b->data.len < 65536) {
				size_t room = RL_MIN(b->data.cap ? b->data.cap : 1 << 20, lim->max_frame + 1 - b->data.len);
				if (room == 0)
					FAIL(RL_ETOOBIG, "decompressed size over the limit of %zu bytes", lim->max_frame);
				if ((rv = rl_buf_reserve(&b->data, room)) != 0)
					goto out;
			}
			o.dst = b->data.p + b->data.len;
			o.size = RL_MIN(b->data.cap - b->data.len, lim->max_frame + 1 - b->data.len);
			o.pos = 0;
			z = ZSTD_decompressStream(b->dctx, &o, &in);
			if (ZSTD_isError(z))
				FAIL(ZSTD_getErrorCode(z) == ZSTD_error_checksum_wrong ? RL_ECHECKSUM : RL_EFORMAT,
				     "zstd: %s", ZSTD_getErrorName(z));
			b->data.len += o.pos;
			if (b->data.len > lim->max_frame)
				FAIL(RL_ETOOBIG, "decompressed size over the limit of %zu bytes", lim->max_frame);
			if (z == 0)
				break;
			if (in.pos == in.size && o.pos < o.size)
				FAIL(RL_EFORMAT, "truncated zstd frame");
		}
	}
out:
	if (rv != 0)
		b->data.len = 0;
	return rv;
}

int
rl_traj_batch_decode(rl_traj_batch *b, size_t *used, const void *buf, size_t n,
                     const rl_traj_limits *lim, const char *what)
{
	const uint8_t *p = buf;
	size_t fsz, hdr, off, cnt;
	uint16_t ver;
	int rv = RL_OK;

	lim = rli_limits(lim);
	rl_traj_batch_clear(b);
	if (used)
		*used = 0;
	if (n >= 4 && (rd32(p) & 0xfffffff0u) == 0x184d2a50u) {
		/* a skippable frame: no records */
		if (n < 8 || rd32(p + 4) > n - 8)
			FAIL(RL_EFORMAT, "truncated skippable frame");
		if (used)
			*used = 8 + (size_t)rd32(p + 4);
		return RL_OK;
	}
	if (n < 4 || rd32(p) != 0xfd2fb528u)
		FAIL(RL_EFORMAT, "not a zstd frame (bad magic)");
	fsz = ZSTD_findFrameCompressedSize(buf, n);
	if (ZSTD_isError(fsz))
		FAIL(RL_EFORMAT, "%s", ZSTD_getErrorCode(fsz) == ZSTD_error_srcSize_wrong
		                       ? "truncated zstd frame" : ZSTD_getErrorName(fsz));
	if ((rv = inflate(b, buf, fsz, lim, what)) != 0)
		goto out;
	p = b->data.p;
	if (b->data.len < RL_TRAJ_HEADER_LEN)
		FAIL(RL_EFORMAT, "batch of %zu bytes is shorter than its header", b->data.len);
	if (memcmp(p, RL_TRAJ_MAGIC, 4) != 0)
		FAIL(RL_EFORMAT, "not a trajectory batch (bad magic %02x%02x%02x%02x)", p[0], p[1], p[2], p[3]);
	ver = rd16(p + 4);
	if (ver != RL_TRAJ_VERSION) {
		rl_error("%s: batch format version %u; this build reads version %d", what ? what : "frame",
		         ver, RL_TRAJ_VERSION);
		rl_hint("the stream was written by a %s rlpipe; use a matching 'rl-queue cat' to convert it to JSONL",
		        ver > RL_TRAJ_VERSION ? "newer" : "older");
		rv = RL_EVERSION;
		goto out;
	}
	hdr = rd16(p + 6);
	cnt = rd32(p + 8);
	if (hdr < RL_TRAJ_HEADER_LEN || hdr % 8 || hdr > b->data.len)
		FAIL(RL_EFORMAT, "bad batch header length %zu", hdr);
	if (rd32(p + 12) != 0)
		FAIL(RL_EFORMAT, "batch header flags 0x%x not understood", (unsigned)rd32(p + 12));
	if (cnt > lim->max_records)
		FAIL(RL_ETOOBIG, "%zu records over the limit of %zu", cnt, lim->max_records);
	/* records are >= 8 bytes: a count the data cannot hold is refused before
	 * allocating the index */
	if (cnt > (b->data.len - hdr) / 8)
		FAIL(RL_EFORMAT, "header says %zu records, the batch has room for at most %zu", cnt,
		     (b->data.len - hdr) / 8);
	if (cnt > b->cap) {
		size_t *o = realloc(b->off, (cnt ? cnt : 1) * sizeof *o);
		if (o == NULL) {
			rl_error("out of memory (batch of %zu records)", cnt);
			rv = RL_ENOMEM;
			goto out;
		}
		b->off = o;
		b->cap = cnt;
	}
	b->hdr = hdr;
	off = hdr;
	for (size_t i = 0; i < cnt; i++) {
		char w[512];
		size_t len;
		snprintf(w, sizeof w, "%s: record %zu at batch byte %zu", what ? what : "frame", i, off);
		if ((rv = rli_record_check(p + off, b->data.len - off, lim, w, &len)) != 0)
			goto out;
		b->off[i] = off;
		off += len;
	}
	if (off != b->data.len)
		FAIL(RL_EFORMAT, "%zu bytes after record %zu (the header says %zu records)", b->data.len - off,
		     cnt, cnt);
	b->n = cnt;
	b->bytes = off - hdr;
	b->frame.len = 0;
	if ((rv = rl_buf_append(&b->frame, buf, fsz)) != 0)
		goto out;
	b->frame_ok = 1;
	if (used)
		*used = fsz;
	return RL_OK;
out:
	rl_traj_batch_clear(b);
	return rv;
}

int
rl_traj_batch_frame(const rl_traj_batch *b, const void **frame, size_t *n)
{
	if (!b->frame_ok)
		return RL_ENOENT;
	*frame = b->frame.p;
	*n = b->frame.len;
	return RL_OK;
}

int
rl_traj_batch_fill_ids(rl_traj_batch **out, rl_traj_batch *b, int with_group, rl_traj_batch *fixed, rl_traj *t)
{
	size_t n = rl_traj_batch_count(b), missing = 0;
	int rv;

	*out = b;
	for (size_t i = 0; i < n; i++) {
		if ((rv = rl_traj_batch_get(b, i, t)) != 0)
			return rv;
		if (!rl_traj_has(t, RL_TAG_ID) || (with_group && !rl_traj_has(t, RL_TAG_GROUP)))
			missing++;
	}
	if (missing == 0)
		return RL_OK;
	rl_traj_batch_clear(fixed);
	for (size_t i = 0; i < n; i++) {
		const void *rec;
		size_t len;
		uint64_t id;
		if ((rv = rl_traj_batch_raw(b, i, &rec, &len)) != 0 || (rv = rl_traj_batch_get(b, i, t)) != 0)
			return rv;
		if (rl_traj_get_u64(t, RL_TAG_ID, &id) != 0) {
			id = rl_fnv1a(RL_FNV1A_INIT, rec, len) & 0x7fffffffffffffffULL;
			if ((rv = rl_traj_set_u64(t, RL_TAG_ID, id)) != 0)
				return rv;
		}
		if (with_group && !rl_traj_has(t, RL_TAG_GROUP) && (rv = rl_traj_set_u64(t, RL_TAG_GROUP, id)) != 0)
			return rv;
		if ((rv = rl_traj_batch_add(fixed, t)) != 0)
			return rv;
	}
	*out = fixed;
	return RL_OK;
}

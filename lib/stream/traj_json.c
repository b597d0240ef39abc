/*
 * traj_json.c — the JSONL form of trajectory records (rl-trajectory(5)).
 *
 * One JSON object per line, keys in field order.  A named tag whose field has
 * its canonical dtype and shape is written plainly ("reward": 1, "prompt":
 * [1,2], "meta": {...}); any other field as "t<tag>": {"dtype": "F64",
 * "data": [...]} (or {"dtype": N, "hex": "..."} for a dtype this build does
 * not know).  Numbers are printed so that they parse back to the same bits:
 * floats in the shortest form that round-trips, 64-bit integers from 2^53
 * as decimal strings, non-finite floats as "nan", "inf", "-inf".
 *
 * Leaves out: NaN payloads and signs (every NaN reads back as the default
 * quiet NaN).  "\u0000" anywhere in a field's value is refused: STR fields
 * hold no NUL bytes, and cJSON's NUL-terminated strings would cut the text
 * (or a meta string, or a number written as a string) there silently.
 */
#include "stream/traj_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

#define TWO53 9007199254740992.0

/* ---- output ------------------------------------------------------------------------ */

static int
put_str(rl_buf *o, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	int rv;

	/* worst case every byte becomes \u00XX */
	if ((rv = rl_buf_reserve(o, n * 6 + 2)) != 0)
		return rv;
	char *p = (char *)o->p + o->len;
	*p++ = '"';
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c != '"' && c != '\\') {
			*p++ = (char)c;
			continue;
		}
		*p++ = '\\';
		switch (c) {
		case '"': *p++ = '"'; break;
		case '\\': *p++ = '\\'; break;
		case '\n': *p++ = 'n'; break;
		case '\r': *p++ = 'r'; break;
		case '\t': *p++ = 't'; break;
		case '\b': *p++ = 'b'; break;
		case '\f': *p++ = 'f'; break;
		default:
			*p++ = 'u'; *p++ = '0'; *p++ = '0';
			*p++ = hex[c >> 4]; *p++ = hex[c & 15];
		}
	}
	*p++ = '"';
	o->len = (size_t)(p - (char *)o->p);
	return RL_OK;
}

static int
put_nonfinite(rl_buf *o, double d)
{
	if (isnan(d))
		return rl_buf_append(o, "\"nan\"", 5);
	return d > 0 ? rl_buf_append(o, "\"inf\"", 5) : rl_buf_append(o, "\"-inf\"", 6);
}

/* Floats: %.6g when that reads back (through strtod, as cJSON reads) to the
 * same float, which keeps values people type short ("0.7", not
 * "0.699999988"); else %.9g, which always does for a float (9 significant
 * digits land well inside the float's rounding interval, so the double
 * rounding of strtod then (float) cannot move it).  Doubles: %.15g or %.17g.
 * Deterministic, so JSONL -> binary -> JSONL is byte-identical. */
static int
put_f32(rl_buf *o, float f)
{
	char b[40];
	int n;

	if (!isfinite(f))
		return put_nonfinite(o, f);
	n = snprintf(b, sizeof b, "%.6g", (double)f);
	if ((float)strtod(b, NULL) != f)
		n = snprintf(b, sizeof b, "%.9g", (double)f);
	return rl_buf_append(o, b, (size_t)n);
}

static int
put_f64(rl_buf *o, double d)
{
	char b[40];
	int n;

	if (!isfinite(d))
		return put_nonfinite(o, d);
	n = snprintf(b, sizeof b, "%.15g", d);
	if (strtod(b, NULL) != d)
		n = snprintf(b, sizeof b, "%.17g", d);
	return rl_buf_append(o, b, (size_t)n);
}

/* Element i of a numeric field. */
static int
put_elem(rl_buf *o, int dt, const uint8_t *p)
{
	switch (dt) {
	case RL_F32: { float v; memcpy(&v, p, 4); return put_f32(o, v); }
	case RL_F64: { double v; memcpy(&v, p, 8); return put_f64(o, v); }
	case RL_BF16: { uint16_t v; memcpy(&v, p, 2); return put_f32(o, rl_bf16_to_f32(v)); }
	case RL_F16: { uint16_t v; memcpy(&v, p, 2); return put_f32(o, rl_f16_to_f32(v)); }
	case RL_I8: return rl_buf_printf(o, "%d", *(const int8_t *)p);
	case RL_U8: case RL_BOOL: return rl_buf_printf(o, "%u", *p);
	case RL_I16: { int16_t v; memcpy(&v, p, 2); return rl_buf_printf(o, "%d", v); }
	case RL_I32: { int32_t v; memcpy(&v, p, 4); return rl_buf_printf(o, "%d", v); }
	case RL_U32: { uint32_t v; memcpy(&v, p, 4); return rl_buf_printf(o, "%u", v); }
	case RL_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		if (v > -(int64_t)TWO53 && v < (int64_t)TWO53)
			return rl_buf_printf(o, "%lld", (long long)v);
		return rl_buf_printf(o, "\"%lld\"", (long long)v);
	}
	case RL_U64: {
		uint64_t v;
		memcpy(&v, p, 8);
		if (v < (uint64_t)TWO53)
			return rl_buf_printf(o, "%llu", (unsigned long long)v);
		return rl_buf_printf(o, "\"%llu\"", (unsigned long long)v);
	}
	}
	return RL_EINVAL;
}

static int
put_array(rl_buf *o, int dt, const uint8_t *p, size_t nbytes)
{
	size_t es = rl_dtype_size(dt);
	int rv;

	if ((rv = rl_buf_putc(o, '[')) != 0)
		return rv;
	for (size_t i = 0; i < nbytes / es; i++) {
		if (i && (rv = rl_buf_putc(o, ',')) != 0)
			return rv;
		if ((rv = put_elem(o, dt, p + i * es)) != 0)
			return rv;
	}
	return rl_buf_putc(o, ']');
}

static int
put_json(rl_buf *o, const rl_traj_field *f)
{
	const char *end = NULL;
	cJSON *j;

	/* the text is NUL-terminated in place (rl-trajectory(5) padding rule) */
	j = cJSON_ParseWithOpts(f->data, &end, 1);
	if (j == NULL) {
		rl_error("field tag %u does not hold valid JSON", f->tag);
		return RL_EFORMAT;
	}
	cJSON_Delete(j);
	return rl_buf_append(o, f->data, f->nbytes);
}

int
rl_traj_to_json(rl_buf *o, const rl_traj *t)
{
	int rv;

	if ((rv = rl_buf_putc(o, '{')) != 0)
		return rv;
	for (size_t i = 0; i < rl_traj_nfields(t); i++) {
		rl_traj_field f;
		int scalar = 0, cdt;
		const uint8_t *p;

		rl_traj_field_at(t, i, &f);
		p = f.data;
		if (i && (rv = rl_buf_putc(o, ',')) != 0)
			return rv;
		cdt = rl_traj_tag_dtype(f.tag, &scalar);
		if (cdt == f.dtype && (!scalar || f.nbytes == rl_dtype_size(cdt))) {
			if ((rv = rl_buf_printf(o, "\"%s\":", rl_traj_tag_name(f.tag))) != 0)
				return rv;
			if (f.dtype == RL_TRAJ_STR)
				rv = put_str(o, f.data, f.nbytes);
			else if (f.dtype == RL_TRAJ_JSON)
				rv = put_json(o, &f);
			else if (scalar)
				rv = put_elem(o, f.dtype, p);
			else
				rv = put_array(o, f.dtype, p, f.nbytes);
			if (rv != 0)
				return rv;
			continue;
		}
		if ((rv = rl_buf_printf(o, "\"t%u\":{\"dtype\":", f.tag)) != 0)
			return rv;
		if (rl_traj_dtype_name(f.dtype) == NULL) {
			static const char hex[] = "0123456789abcdef";
			if ((rv = rl_buf_printf(o, "%d,\"hex\":\"", f.dtype)) != 0 ||
			    (rv = rl_buf_reserve(o, f.nbytes * 2 + 2)) != 0)
				return rv;
			for (size_t k = 0; k < f.nbytes; k++) {
				o->p[o->len++] = (uint8_t)hex[p[k] >> 4];
				o->p[o->len++] = (uint8_t)hex[p[k] & 15];
			}
			if ((rv = rl_buf_append(o, "\"}", 2)) != 0)
				return rv;
			continue;
		}
		if ((rv = rl_buf_printf(o, "\"%s\",\"data\":", rl_traj_dtype_name(f.dtype))) != 0)
			return rv;
		if (f.dtype == RL_TRAJ_STR)
			rv = put_str(o, f.data, f.nbytes);
		else if (f.dtype == RL_TRAJ_JSON)
			rv = put_json(o, &f);
		else
			rv = put_array(o, f.dtype, p, f.nbytes);
		if (rv != 0 || (rv = rl_buf_putc(o, '}')) != 0)
			return rv;
	}
	return rl_buf_append(o, "}\n", 2);
}

/* ---- input -------------------------------------------------------------------------- */

#define JFAIL(...)                                               \
	do {                                                     \
		char m_[256];                                    \
		snprintf(m_, sizeof m_, __VA_ARGS__);            \
		rl_error("%s: %s", what ? what : "JSON record", m_); \
		rv = RL_EFORMAT;                                 \
		goto out;                                        \
	} while (0)

/* A float from a number or "nan"/"inf"/"-inf". */
static int
get_float(const cJSON *v, double *d)
{
	if (cJSON_IsNumber(v)) {
		*d = v->valuedouble;
		return 1;
	}
	if (cJSON_IsString(v)) {
		const char *s = v->valuestring;
		if (strcmp(s, "nan") == 0 || strcmp(s, "NaN") == 0) { *d = NAN; return 1; }
		if (strcmp(s, "inf") == 0 || strcmp(s, "Infinity") == 0) { *d = INFINITY; return 1; }
		if (strcmp(s, "-inf") == 0 || strcmp(s, "-Infinity") == 0) { *d = -INFINITY; return 1; }
	}
	return 0;
}

/* Convert one JSON value to one element of dtype dt at dst.  On failure
 * writes the reason to err. */
static int
elem(void *dst, int dt, const cJSON *v, char *err, size_t errn)
{
	double d;

	if (dt == RL_F32 || dt == RL_F64 || dt == RL_BF16 || dt == RL_F16) {
		if (!get_float(v, &d)) {
			snprintf(err, errn, "expected a number, got %s", rl_json_type_name(v));
			return 0;
		}
		if (dt == RL_F64) {
			memcpy(dst, &d, 8);
			return 1;
		}
		/* a finite number that rounds to infinity is out of range, not
		 * "inf" (2^128 - 2^103: the least double that float rounds up) */
		if (isfinite(d) && fabs(d) >= 0x1.ffffffp127)
			goto frange;
		float f = (float)d;
		if (dt == RL_F32) {
			memcpy(dst, &f, 4);
		} else {
			uint16_t h = dt == RL_BF16 ? rl_f32_to_bf16(f) : rl_f32_to_f16(f);
			if (isfinite(d) && isinf(dt == RL_BF16 ? rl_bf16_to_f32(h) : rl_f16_to_f32(h)))
				goto frange;
			memcpy(dst, &h, 2);
		}
		return 1;
	}
	if (dt == RL_BOOL && cJSON_IsBool(v)) {
		*(uint8_t *)dst = cJSON_IsTrue(v) ? 1 : 0;
		return 1;
	}
	if ((dt == RL_I64 || dt == RL_U64) && cJSON_IsString(v)) {
		const char *s = v->valuestring;
		char *end;
		errno = 0;
		if (*s == 0 || !(*s == '-' || (*s >= '0' && *s <= '9')) || (dt == RL_U64 && *s == '-')) {
			snprintf(err, errn, "expected an integer, got the string \"%.40s\"", s);
			return 0;
		}
		if (dt == RL_I64) {
			long long x = strtoll(s, &end, 10);
			memcpy(dst, &(int64_t){ x }, 8);
		} else {
			unsigned long long x = strtoull(s, &end, 10);
			memcpy(dst, &(uint64_t){ x }, 8);
		}
		if (*end != 0 || errno == ERANGE) {
			snprintf(err, errn, "\"%.40s\" is not a %s integer", s, rl_dtype_name(dt));
			return 0;
		}
		return 1;
	}
	if (!cJSON_IsNumber(v)) {
		snprintf(err, errn, "expected an integer, got %s", rl_json_type_name(v));
		return 0;
	}
	d = v->valuedouble;
	if (d != floor(d) || !isfinite(d)) {
		snprintf(err, errn, "expected an integer, got %.17g", d);
		return 0;
	}
	/* 2^53 + 1 is read as the double 2^53: from 2^53 on, a number may
	 * stand for several integers, so only a string says which */
	if (fabs(d) >= TWO53) {
		snprintf(err, errn, "integer of 2^53 or more must be written as a string");
		return 0;
	}
	switch (dt) {
	case RL_I8: if (d < -128 || d > 127) goto range; *(int8_t *)dst = (int8_t)d; return 1;
	case RL_U8: case RL_BOOL: if (d < 0 || d > 255) goto range; *(uint8_t *)dst = (uint8_t)d; return 1;
	case RL_I16: if (d < -32768 || d > 32767) goto range; memcpy(dst, &(int16_t){ (int16_t)d }, 2); return 1;
	case RL_I32: if (d < INT32_MIN || d > INT32_MAX) goto range; memcpy(dst, &(int32_t){ (int32_t)d }, 4); return 1;
	case RL_U32: if (d < 0 || d > UINT32_MAX) goto range; memcpy(dst, &(uint32_t){ (uint32_t)d }, 4); return 1;
	case RL_I64: memcpy(dst, &(int64_t){ (int64_t)d }, 8); return 1;
	case RL_U64: if (d < 0) goto range; memcpy(dst, &(uint64_t){ (uint64_t)d }, 8); return 1;
	}
	snprintf(err, errn, "dtype %d has no JSON form", dt);
	return 0;
range:
	snprintf(err, errn, "%.17g out of range for %s", d, rl_dtype_name(dt));
	return 0;
frange:
	snprintf(err, errn, "%g out of range for %s (it would be infinite)", d, rl_dtype_name(dt));
	return 0;
}

/* Store v as a field of dtype dt: scalar (one element) or array. */
static int
set_numeric(rl_traj *t, unsigned tag, int dt, const cJSON *v, int scalar, rl_buf *tmp,
            const char *key, const char *what)
{
	size_t es = rl_dtype_size(dt), n, i = 0;
	char err[160];
	const cJSON *e;
	int rv = RL_OK;

	tmp->len = 0;
	if (scalar) {
		if ((rv = rl_buf_reserve(tmp, es)) != 0)
			goto out;
		if (!elem(tmp->p, dt, v, err, sizeof err))
			JFAIL("field '%s': %s", key, err);
		return rl_traj_set(t, tag, dt, tmp->p, es);
	}
	if (!cJSON_IsArray(v))
		JFAIL("field '%s': expected an array, got %s", key, rl_json_type_name(v));
	n = (size_t)cJSON_GetArraySize(v);
	if (rl_mul_size(&n, n, es) != 0 || n > UINT32_MAX - 16)
		JFAIL("field '%s': array too long", key);
	if ((rv = rl_buf_reserve(tmp, n)) != 0)
		goto out;
	cJSON_ArrayForEach(e, v) {
		if (!elem(tmp->p + i * es, dt, e, err, sizeof err))
			JFAIL("field '%s' element %zu: %s", key, i, err);
		i++;
	}
	rv = rl_traj_set(t, tag, dt, tmp->p, n);
out:
	return rv;
}

static int
set_text(rl_traj *t, unsigned tag, int dt, const cJSON *v, const char *key, const char *what)
{
	int rv = RL_OK;

	if (dt == RL_TRAJ_JSON) {
		char *s = rl_json_print(v);
		if (s == NULL) {
			rl_error("out of memory");
			return RL_ENOMEM;
		}
		rv = rl_traj_set(t, tag, RL_TRAJ_JSON, s, strlen(s));
		free(s);
		if (rv == RL_EINVAL)
			JFAIL("field '%s': text is not valid UTF-8", key);
		return rv;
	}
	if (!cJSON_IsString(v))
		JFAIL("field '%s': expected a string, got %s", key, rl_json_type_name(v));
	rv = rl_traj_set(t, tag, RL_TRAJ_STR, v->valuestring, strlen(v->valuestring));
	if (rv == RL_EINVAL)
		JFAIL("field '%s': text is not valid UTF-8", key);
out:
	return rv;
}

static int
hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* "t<tag>": {"dtype": NAME, "data": ...} or {"dtype": N, "hex": "..."} */
static int
set_typed(rl_traj *t, unsigned tag, const cJSON *v, rl_buf *tmp, const char *key, const char *what)
{
	const cJSON *dt, *data, *hex;
	int rv = RL_OK, d;

	if (!cJSON_IsObject(v))
		JFAIL("field '%s': expected an object {\"dtype\": ..., \"data\": ...}, got %s", key,
		      rl_json_type_name(v));
	dt = cJSON_GetObjectItemCaseSensitive(v, "dtype");
	data = cJSON_GetObjectItemCaseSensitive(v, "data");
	hex = cJSON_GetObjectItemCaseSensitive(v, "hex");
	if (cJSON_GetArraySize(v) != 2 || dt == NULL || (data == NULL) == (hex == NULL))
		JFAIL("field '%s': expected exactly the keys \"dtype\" and \"data\" (or \"hex\")", key);
	if (cJSON_IsNumber(dt) && hex) {
		const char *s = cJSON_IsString(hex) ? hex->valuestring : NULL;
		size_t n;
		double x = dt->valuedouble;
		d = x >= 0 && x <= 255 ? (int)x : -1;
		if (x != d || rl_traj_dtype_name(d) != NULL)
			JFAIL("field '%s': \"hex\" is for dtypes this build does not know (0..255)", key);
		if (s == NULL || strlen(s) % 2)
			JFAIL("field '%s': \"hex\" must be a string of hex digit pairs", key);
		n = strlen(s) / 2;
		tmp->len = 0;
		if ((rv = rl_buf_reserve(tmp, n + 1)) != 0)
			goto out;
		for (size_t i = 0; i < n; i++) {
			int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
			if (hi < 0 || lo < 0)
				JFAIL("field '%s': bad hex digit at position %zu", key, 2 * i);
			tmp->p[i] = (uint8_t)(hi << 4 | lo);
		}
		return rl_traj_set(t, tag, d, tmp->p, n);
	}
	if (!cJSON_IsString(dt) || (d = rl_traj_dtype_parse(dt->valuestring)) < 0 || data == NULL)
		JFAIL("field '%s': \"dtype\" must name a dtype (F32, I32, U64, STR, JSON, ...)", key);
	if (d == RL_TRAJ_STR || d == RL_TRAJ_JSON)
		return set_text(t, tag, d, data, key, what);
	return set_numeric(t, tag, d, data, 0, tmp, key, what);
out:
	return rv;
}

int
rl_traj_from_json(rl_traj *t, const char *line, size_t n, const rl_traj_limits *lim, const char *what)
{
	cJSON *j = NULL;
	const cJSON *v;
	rl_buf tmp;
	int rv = RL_OK, nulk;

	lim = rli_limits(lim);
	rl_buf_init(&tmp);
	rl_traj_clear(t);
	if (n > lim->max_line) {
		rl_error("%s: line of %zu bytes over the limit of %zu", what ? what : "JSON record", n, lim->max_line);
		return RL_ETOOBIG;
	}
	{
		/* cJSON keeps strings NUL-terminated: a raw NUL would cut one */
		const char *z = memchr(line, 0, n);
		if (z != NULL) {
			rl_error("%s: a NUL byte at byte %zu, which JSON text cannot hold", what ? what : "JSON record",
			         (size_t)(z - line));
			return RL_EFORMAT;
		}
	}
	if ((rv = rl_json_parse(&j, line, n, what)) != 0)
		return rv;
	if (!cJSON_IsObject(j))
		JFAIL("expected a JSON object, got %s", rl_json_type_name(j));
	if ((nulk = rl_json_nul_member(line, n)) >= 0) {
		const cJSON *m = cJSON_GetArrayItem(j, nulk);
		JFAIL("field '%s': \\u0000 in its name or value (fields hold no NUL characters)",
		      m && m->string ? m->string : "?");
	}
	cJSON_ArrayForEach(v, j) {
		const char *key = v->string;
		int tag = rl_traj_tag_parse(key), typed = 0;

		if (tag < 0 && key[0] == 't' && key[1] >= '1' && key[1] <= '9' && strlen(key) <= 6) {
			char *end;
			long x = strtol(key + 1, &end, 10);
			if (*end == 0 && x >= 1 && x <= RL_TAG_MAX) {
				tag = (int)x;
				typed = 1;
			}
		}
		if (tag < 0) {
			rl_error("%s: unknown field '%s'", what ? what : "JSON record", key);
			rl_hint("fields are named in rl-trajectory(5); other tags are written \"t<number>\": "
			        "{\"dtype\": ..., \"data\": ...}");
			rv = RL_EFORMAT;
			goto out;
		}
		if (rl_traj_has(t, (unsigned)tag))
			JFAIL("field '%s': tag %d occurs twice", key, tag);
		if (rl_traj_nfields(t) >= lim->max_fields) {
			rl_error("%s: more than %zu fields", what ? what : "JSON record", lim->max_fields);
			rv = RL_ETOOBIG;
			goto out;
		}
		if (typed) {
			rv = set_typed(t, (unsigned)tag, v, &tmp, key, what);
		} else {
			int scalar, dt = rl_traj_tag_dtype((unsigned)tag, &scalar);
			if (dt == RL_TRAJ_STR || dt == RL_TRAJ_JSON)
				rv = set_text(t, (unsigned)tag, dt, v, key, what);
			else
				rv = set_numeric(t, (unsigned)tag, dt, v, scalar, &tmp, key, what);
		}
		if (rv != 0) {
			if (rv == RL_EINVAL) {
				rl_error("%s: field '%s': bad value", what ? what : "JSON record", key);
				rv = RL_EFORMAT;
			}
			goto out;
		}
	}
	if (rl_traj_has(t, RL_TAG_VERSION)) {
		/* a version of another length would make the record unversioned, out
		 * of reach of the broker's staleness gate */
		const int32_t *vv;
		size_t vn = 0;
		if (rl_traj_get_i32s(t, RL_TAG_VERSION, &vv, &vn) != 0)
			JFAIL("field 'version': wants [first, last], two I32 integers, not another dtype");
		if (vn != 2)
			JFAIL("field 'version': wants [first, last], two integers, not %zu", vn);
	}
	if (rl_traj_encoded_size(t) > lim->max_record) {
		rl_error("%s: record of %zu bytes over the limit of %zu", what ? what : "JSON record",
		         rl_traj_encoded_size(t), lim->max_record);
		rv = RL_ETOOBIG;
	}
out:
	cJSON_Delete(j);
	rl_buf_fini(&tmp);
	if (rv != 0)
		rl_traj_clear(t);
	return rv;
}

/*
 * json.c — typed getters over cJSON; errors name the document and key path.
 *
 * Leaves out: JSON output helpers, keys containing dots (not addressable by
 * a dotted path; use cJSON_GetObjectItemCaseSensitive for those).
 */
#include "base/json.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/io.h"

const char *
rl_json_type_name(const cJSON *v)
{
	if (v == NULL)
		return "nothing";
	if (cJSON_IsObject(v))
		return "an object";
	if (cJSON_IsArray(v))
		return "an array";
	if (cJSON_IsString(v))
		return "a string";
	if (cJSON_IsNumber(v))
		return "a number";
	if (cJSON_IsBool(v))
		return "a boolean";
	if (cJSON_IsNull(v))
		return "null";
	return "an invalid value";
}

/* end: where cJSON stopped; 1 when only spaces (or NULs) follow up to lim */
static int
only_space_after(const char *end, const char *lim)
{
	const char *p = end;

	if (end == NULL)
		return 1;
	while (p < lim && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == 0))
		p++;
	return p >= lim;
}

/* ---- "\u0000" ----
 * cJSON decodes \u0000 into its NUL-terminated strings, which cuts them, so
 * the escape is looked for in the line itself: a quick search, then (only
 * when it is there) a walk over the top-level members of the already
 * parsed, so valid, object to find the one holding it. */

static int
is_nul_escape(const char *p, const char *e)
{
	return e - p >= 6 && p[0] == '\\' && p[1] == 'u' && memcmp(p + 2, "0000", 4) == 0;
}

/* p at the opening quote of a valid string: returns the byte after the closing one */
static const char *
skip_string(const char *p, const char *e, int *nul)
{
	for (p++; p < e && *p != '"'; p++) {
		if (*p == '\\') {
			if (is_nul_escape(p, e))
				*nul = 1;
			p++;
		}
	}
	return p < e ? p + 1 : e;
}

static const char *
skip_ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* p at a valid value: returns the byte after it */
static const char *
skip_value(const char *p, const char *e, int *nul)
{
	int depth = 0;

	while (p < e) {
		char c = *p;
		if (c == '"') {
			p = skip_string(p, e, nul);
			if (depth == 0)
				return p;
			continue;
		}
		if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (depth == 0)
				return p;        /* the enclosing object's end: a scalar ended here */
			if (--depth == 0)
				return p + 1;
		} else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n')) {
			return p;
		}
		p++;
	}
	return p;
}

int
rl_json_nul_member(const char *line, size_t n)
{
	const char *p = line, *e = line + n;
	int k = 0, nul, obj;

	if (n < 6 || memmem(line, n, "\\u0000", 6) == NULL)
		return -1;
	p = skip_ws(p, e);
	if (p >= e || (*p != '{' && *p != '['))
		return -1;
	obj = *p == '{';
	for (p++;; k++) {
		p = skip_ws(p, e);
		nul = 0;
		if (obj) {
			if (p >= e || *p != '"')
				return -1;
			p = skip_ws(skip_string(p, e, &nul), e);
			if (p >= e || *p != ':')
				return -1;
			p = skip_ws(p + 1, e);
		}
		if (p >= e || *p == ']' || *p == '}')
			return -1;
		p = skip_value(p, e, &nul);
		if (nul)
			return k;
		p = skip_ws(p, e);
		if (p >= e || *p != ',')
			return -1;
		p++;
	}
}

/* 1 when the number j would not read back from cJSON's 15 digits */
static int
lossy_number(const cJSON *j)
{
	char b[40];

	if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
		return 0;
	snprintf(b, sizeof b, "%1.15g", j->valuedouble);
	return strtod(b, NULL) != j->valuedouble;
}

/* 1 when j or a value under it is such a number */
static int
has_lossy(const cJSON *j)
{
	if (lossy_number(j))
		return 1;
	for (const cJSON *c = j->child; c != NULL; c = c->next)
		if (has_lossy(c))
			return 1;
	return 0;
}

/* the lossy numbers under parent become raw 17-digit text (keys kept) */
static int
fix_numbers(cJSON *parent)
{
	for (cJSON *it = parent->child, *next; it != NULL; it = next) {
		next = it->next;
		if (lossy_number(it)) {
			char b[40];
			cJSON *raw;
			snprintf(b, sizeof b, "%1.17g", it->valuedouble);
			if ((raw = cJSON_CreateRaw(b)) == NULL)
				return -1;
			if (it->string != NULL && (raw->string = strdup(it->string)) == NULL) {
				cJSON_Delete(raw);
				return -1;
			}
			if (!cJSON_ReplaceItemViaPointer(parent, it, raw)) {
				cJSON_Delete(raw);
				return -1;
			}
		} else if (it->child != NULL && fix_numbers(it) != 0) {
			return -1;
		}
	}
	return 0;
}

char *
rl_json_print(const cJSON *j)
{
	cJSON *d;
	char *s = NULL;

	if (j == NULL || !has_lossy(j))
		return j ? cJSON_PrintUnformatted(j) : NULL;
	if (cJSON_IsNumber(j)) {
		if ((s = malloc(40)) != NULL)
			snprintf(s, 40, "%1.17g", j->valuedouble);
		return s;
	}
	if ((d = cJSON_Duplicate(j, 1)) == NULL)
		return NULL;
	if (fix_numbers(d) == 0)
		s = cJSON_PrintUnformatted(d);
	cJSON_Delete(d);
	return s;
}

cJSON *
rl_json_parse_all(const char *text, size_t n)
{
	const char *end = NULL;
	cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);

	if (j != NULL && !only_space_after(end, text + n)) {
		cJSON_Delete(j);
		return NULL;
	}
	return j;
}

int
rl_json_parse(cJSON **out, const char *text, size_t n, const char *what)
{
	const char *end = NULL;
	cJSON *j;

	*out = NULL;
	j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
	if (j == NULL) {
		const char *e = cJSON_GetErrorPtr();
		size_t off = e && e >= text && e <= text + n ? (size_t)(e - text) : 0;
		rl_error("%s: invalid JSON near byte %zu", what ? what : "JSON", off);
		return RL_EFORMAT;
	}
	if (end != NULL) {
		const char *p = end, *lim = text + n;
		while (p < lim && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == 0))
			p++;
		if (p < lim) {
			rl_error("%s: invalid JSON: trailing text at byte %zu", what ? what : "JSON",
			         (size_t)(p - text));
			cJSON_Delete(j);
			return RL_EFORMAT;
		}
	}
	*out = j;
	return RL_OK;
}

int
rl_json_load(cJSON **out, const char *path, size_t max)
{
	char *text;
	size_t n;
	int rv;

	*out = NULL;
	if ((rv = rl_io_read_file(path, max ? max : (size_t)64 << 20, &text, &n)) != 0)
		return rv;
	rv = rl_json_parse(out, text, n, path);
	free(text);
	return rv;
}

/* One path component: [s, s+len). */
static const cJSON *
step(const cJSON *cur, const char *s, size_t len)
{
	if (cJSON_IsArray(cur)) {
		size_t i = 0;
		if (len == 0 || len > 9)
			return NULL;
		for (size_t k = 0; k < len; k++) {
			if (!isdigit((unsigned char)s[k]))
				return NULL;
			i = i * 10 + (size_t)(s[k] - '0');
		}
		return cJSON_GetArrayItem(cur, (int)i);
	}
	if (!cJSON_IsObject(cur))
		return NULL;
	for (const cJSON *c = cur->child; c; c = c->next)
		if (c->string && strlen(c->string) == len && memcmp(c->string, s, len) == 0)
			return c;
	return NULL;
}

const cJSON *
rl_json_find(const cJSON *obj, const char *path)
{
	const cJSON *cur = obj;
	const char *s = path;

	if (path == NULL || *path == 0)
		return obj;
	while (cur) {
		const char *dot = strchr(s, '.');
		size_t len = dot ? (size_t)(dot - s) : strlen(s);
		cur = step(cur, s, len);
		if (dot == NULL)
			break;
		s = dot + 1;
	}
	return cur;
}

static void
type_error(const char *what, const char *path, const char *want, const cJSON *got)
{
	if (what)
		rl_error("%s: %s: expected %s, got %s", what, path, want, rl_json_type_name(got));
	else
		rl_error("%s: expected %s, got %s", path, want, rl_json_type_name(got));
}

/* Find a required key: RL_ENOENT (logged) when absent. */
static int
need(const cJSON *obj, const char *what, const char *path, const cJSON **v)
{
	*v = rl_json_find(obj, path);
	if (*v == NULL) {
		if (what)
			rl_error("%s: missing key %s", what, path);
		else
			rl_error("missing key %s", path);
		return RL_ENOENT;
	}
	return RL_OK;
}

int
rl_json_get_obj(const cJSON *obj, const char *what, const char *path, const cJSON **out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	if (!cJSON_IsObject(v)) {
		type_error(what, path, "an object", v);
		return RL_EFORMAT;
	}
	*out = v;
	return RL_OK;
}

int
rl_json_get_arr(const cJSON *obj, const char *what, const char *path, const cJSON **out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	if (!cJSON_IsArray(v)) {
		type_error(what, path, "an array", v);
		return RL_EFORMAT;
	}
	*out = v;
	return RL_OK;
}

static int
conv_str(const cJSON *v, const char *what, const char *path, const char **out)
{
	if (!cJSON_IsString(v) || v->valuestring == NULL) {
		type_error(what, path, "a string", v);
		return RL_EFORMAT;
	}
	*out = v->valuestring;
	return RL_OK;
}

static int
conv_bool(const cJSON *v, const char *what, const char *path, int *out)
{
	if (!cJSON_IsBool(v)) {
		type_error(what, path, "a boolean", v);
		return RL_EFORMAT;
	}
	*out = cJSON_IsTrue(v);
	return RL_OK;
}

static int
conv_f64(const cJSON *v, const char *what, const char *path, double *out)
{
	if (!cJSON_IsNumber(v)) {
		type_error(what, path, "a number", v);
		return RL_EFORMAT;
	}
	*out = v->valuedouble;
	return RL_OK;
}

/* Integer in [lo, hi]: a JSON number that is integral, or (when strings is
 * set) a decimal string, for values beyond 2^53. */
static int
conv_int(const cJSON *v, const char *what, const char *path, int strings, int is_unsigned,
         int64_t lo, int64_t hi, int64_t *si, uint64_t *ui)
{
	if (cJSON_IsNumber(v)) {
		double d = v->valuedouble;
		if (d != floor(d) || !isfinite(d)) {
			type_error(what, path, "an integer", v);
			return RL_EFORMAT;
		}
		if (is_unsigned) {
			if (d < 0 || d >= 18446744073709551616.0)
				goto range;
			*ui = (uint64_t)d;
		} else {
			if (d < (double)lo || d > (double)hi || d >= 9223372036854775808.0)
				goto range;
			*si = (int64_t)d;
		}
		return RL_OK;
	}
	if (strings && cJSON_IsString(v) && v->valuestring) {
		const char *s = v->valuestring;
		char *end;
		errno = 0;
		if (*s == 0 || isspace((unsigned char)*s) || (is_unsigned && *s == '-'))
			goto bad;
		if (is_unsigned)
			*ui = strtoull(s, &end, 10);
		else
			*si = strtoll(s, &end, 10);
		if (*end != 0)
			goto bad;
		if (errno == ERANGE)
			goto range;
		return RL_OK;
	}
bad:
	type_error(what, path, "an integer", v);
	return RL_EFORMAT;
range:
	if (what)
		rl_error("%s: %s: integer out of range", what, path);
	else
		rl_error("%s: integer out of range", path);
	return RL_EFORMAT;
}

int
rl_json_get_str(const cJSON *obj, const char *what, const char *path, const char **out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	return conv_str(v, what, path, out);
}

int
rl_json_get_bool(const cJSON *obj, const char *what, const char *path, int *out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	return conv_bool(v, what, path, out);
}

int
rl_json_get_f64(const cJSON *obj, const char *what, const char *path, double *out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	return conv_f64(v, what, path, out);
}

int
rl_json_get_int(const cJSON *obj, const char *what, const char *path, int *out)
{
	const cJSON *v;
	int64_t x;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	if ((rv = conv_int(v, what, path, 0, 0, INT_MIN, INT_MAX, &x, NULL)) != 0)
		return rv;
	*out = (int)x;
	return RL_OK;
}

int
rl_json_get_i64(const cJSON *obj, const char *what, const char *path, int64_t *out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	return conv_int(v, what, path, 1, 0, INT64_MIN, INT64_MAX, out, NULL);
}

int
rl_json_get_u64(const cJSON *obj, const char *what, const char *path, uint64_t *out)
{
	const cJSON *v;
	int rv;

	if ((rv = need(obj, what, path, &v)) != 0)
		return rv;
	return conv_int(v, what, path, 1, 1, 0, 0, NULL, out);
}

/* Optional: absent or null gives the default. */
static const cJSON *
opt(const cJSON *obj, const char *path)
{
	const cJSON *v = rl_json_find(obj, path);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

int
rl_json_opt_str(const cJSON *obj, const char *what, const char *path, const char *def, const char **out)
{
	const cJSON *v = opt(obj, path);

	if (v == NULL) {
		*out = def;
		return RL_OK;
	}
	return conv_str(v, what, path, out);
}

int
rl_json_opt_bool(const cJSON *obj, const char *what, const char *path, int def, int *out)
{
	const cJSON *v = opt(obj, path);

	if (v == NULL) {
		*out = def;
		return RL_OK;
	}
	return conv_bool(v, what, path, out);
}

int
rl_json_opt_f64(const cJSON *obj, const char *what, const char *path, double def, double *out)
{
	const cJSON *v = opt(obj, path);

	if (v == NULL) {
		*out = def;
		return RL_OK;
	}
	return conv_f64(v, what, path, out);
}

int
rl_json_opt_int(const cJSON *obj, const char *what, const char *path, int def, int *out)
{
	const cJSON *v = opt(obj, path);
	int64_t x;
	int rv;

	if (v == NULL) {
		*out = def;
		return RL_OK;
	}
	if ((rv = conv_int(v, what, path, 0, 0, INT_MIN, INT_MAX, &x, NULL)) != 0)
		return rv;
	*out = (int)x;
	return RL_OK;
}

int
rl_json_opt_i64(const cJSON *obj, const char *what, const char *path, int64_t def, int64_t *out)
{
	const cJSON *v = opt(obj, path);

	if (v == NULL) {
		*out = def;
		return RL_OK;
	}
	return conv_int(v, what, path, 1, 0, INT64_MIN, INT64_MAX, out, NULL);
}

/* Element path "path.i" for messages. */
static void
elem_path(char *buf, size_t n, const char *path, size_t i)
{
	snprintf(buf, n, "%s.%zu", path, i);
}

int
rl_json_get_i32s(const cJSON *obj, const char *what, const char *path, int32_t **out, size_t *n)
{
	const cJSON *a, *e;
	int32_t *p = NULL;
	size_t cnt, i = 0;
	int rv;

	*out = NULL;
	*n = 0;
	if ((rv = rl_json_get_arr(obj, what, path, &a)) != 0)
		return rv;
	cnt = (size_t)cJSON_GetArraySize(a);
	if (cnt && (p = rl_try_calloc(cnt, sizeof *p, path)) == NULL)
		return RL_ENOMEM;
	cJSON_ArrayForEach(e, a) {
		char ep[256];
		int64_t x;
		elem_path(ep, sizeof ep, path, i);
		if ((rv = conv_int(e, what, ep, 0, 0, INT32_MIN, INT32_MAX, &x, NULL)) != 0) {
			free(p);
			return rv;
		}
		p[i++] = (int32_t)x;
	}
	*out = p;
	*n = cnt;
	return RL_OK;
}

int
rl_json_get_f32s(const cJSON *obj, const char *what, const char *path, float **out, size_t *n)
{
	const cJSON *a, *e;
	float *p = NULL;
	size_t cnt, i = 0;
	int rv;

	*out = NULL;
	*n = 0;
	if ((rv = rl_json_get_arr(obj, what, path, &a)) != 0)
		return rv;
	cnt = (size_t)cJSON_GetArraySize(a);
	if (cnt && (p = rl_try_calloc(cnt, sizeof *p, path)) == NULL)
		return RL_ENOMEM;
	cJSON_ArrayForEach(e, a) {
		char ep[256];
		double d;
		elem_path(ep, sizeof ep, path, i);
		if ((rv = conv_f64(e, what, ep, &d)) != 0) {
			free(p);
			return rv;
		}
		p[i++] = (float)d;
	}
	*out = p;
	*n = cnt;
	return RL_OK;
}

const char *
rl_json_dup_key(const cJSON *obj)
{
	for (const cJSON *a = obj ? obj->child : NULL; a; a = a->next)
		for (const cJSON *b = a->next; a->string && b; b = b->next)
			if (b->string && strcmp(a->string, b->string) == 0)
				return a->string;
	return NULL;
}

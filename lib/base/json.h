/*
 * json.h — typed getters over cJSON whose errors name the key path.
 *
 * Paths are dotted key names relative to the object passed in ("meta.answer",
 * "rope_scaling.factor"); a purely numeric component indexes an array
 * ("layers.3.name").  `what` names the document in messages (a file name, or
 * "'data.jsonl': line 12"); it may be NULL.  A failing required getter logs
 *     PROG: 'config.json': meta.answer: expected a string, got a number
 * and returns RL_ENOENT (missing) or RL_EFORMAT (wrong type or out of range).
 * The _opt getters return RL_OK and store `def` when the key is absent (or JSON
 * null), and fail like the required ones on a present key of the wrong type.
 *
 * Ownership: getters return borrowed pointers into the cJSON tree, except the
 * array getters, which return a new malloc'd array the caller frees.
 * Leaves out: writing JSON (use cJSON directly) and JSON Schema.
 */
#ifndef RL_JSON_H
#define RL_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/core.h"

/* Parse n bytes (need not be NUL-terminated).  Trailing non-space text is an
 * error.  On error logs "WHAT: invalid JSON near byte N" (RL_EFORMAT).
 * *out is owned by the caller (cJSON_Delete). */
int rl_json_parse(cJSON **out, const char *text, size_t n, const char *what);
/* The same without a message: NULL for invalid JSON or trailing text (a
 * second value, junk after the first). */
cJSON *rl_json_parse_all(const char *text, size_t n);
/* For the text of a JSON object or array (already parsed, so valid): the
 * index of the first top-level member whose name or value (or the first
 * element) that holds an escaped NUL (\u0000), or -1.  cJSON keeps strings NUL-terminated, so such a string would be cut
 * there; cJSON_GetArrayItem(obj, index)->string names the member (its name
 * as cut, when the NUL is in the name). */
int rl_json_nul_member(const char *s, size_t n);
/* cJSON_PrintUnformatted without its number loss: cJSON prints a number with
 * 15 significant digits whenever they read back within a relative 2^-52, so
 * 2^53 came out 9.00719925474099e+15.  Here every number reads back as the
 * same double (17 digits where 15 do not).  NULL when out of memory. */
char *rl_json_print(const cJSON *j);
/* The first member name of object obj that appears twice, or NULL.  cJSON's
 * lookups find the first of two equal keys, Python's json keeps the last:
 * data written by one and read by the other would differ without a word. */
const char *rl_json_dup_key(const cJSON *obj);
/* Read and parse a whole file (at most max bytes; 0: 64 MiB). */
int rl_json_load(cJSON **out, const char *path, size_t max);

/* Look a path up without logging: the node or NULL. */
const cJSON *rl_json_find(const cJSON *obj, const char *path);
/* "object", "array", "string", "number", "boolean", "null" */
const char *rl_json_type_name(const cJSON *v);

int rl_json_get_obj(const cJSON *obj, const char *what, const char *path, const cJSON **out);
int rl_json_get_arr(const cJSON *obj, const char *what, const char *path, const cJSON **out);
int rl_json_get_str(const cJSON *obj, const char *what, const char *path, const char **out);
int rl_json_get_bool(const cJSON *obj, const char *what, const char *path, int *out);
int rl_json_get_f64(const cJSON *obj, const char *what, const char *path, double *out);
/* Integers: the number must be integral and in range.  u64/i64 also accept a
 * decimal string (JSON numbers above 2^53 lose precision in cJSON). */
int rl_json_get_int(const cJSON *obj, const char *what, const char *path, int *out);
int rl_json_get_i64(const cJSON *obj, const char *what, const char *path, int64_t *out);
int rl_json_get_u64(const cJSON *obj, const char *what, const char *path, uint64_t *out);

int rl_json_opt_str(const cJSON *obj, const char *what, const char *path, const char *def, const char **out);
int rl_json_opt_bool(const cJSON *obj, const char *what, const char *path, int def, int *out);
int rl_json_opt_f64(const cJSON *obj, const char *what, const char *path, double def, double *out);
int rl_json_opt_int(const cJSON *obj, const char *what, const char *path, int def, int *out);
int rl_json_opt_i64(const cJSON *obj, const char *what, const char *path, int64_t def, int64_t *out);

/* Arrays of numbers (e.g. token ids): *out is malloc'd (NULL when n is 0),
 * owned by the caller.  An element of the wrong type names its index
 * ("prompt.17: expected an integer, got a string"). */
int rl_json_get_i32s(const cJSON *obj, const char *what, const char *path, int32_t **out, size_t *n);
int rl_json_get_f32s(const cJSON *obj, const char *what, const char *path, float **out, size_t *n);

#endif

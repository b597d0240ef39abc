/*
 * test_json.c — typed JSON getters: values, defaults, and errors that name
 * the document and the key path (checked by capturing stderr).
 */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#include <stdlib.h>
#include <unistd.h>

#include "base/json.h"
#include "t.h"

static char errbuf[4096];
static int saved_fd = -1;
static FILE *cap;

/* Capture what the library logs on stderr between begin and end. */
static void
cap_begin(void)
{
	fflush(stderr);
	cap = tmpfile();
	saved_fd = dup(2);
	dup2(fileno(cap), 2);
}

static const char *
cap_end(void)
{
	size_t n;

	fflush(stderr);
	dup2(saved_fd, 2);
	close(saved_fd);
	rewind(cap);
	n = fread(errbuf, 1, sizeof errbuf - 1, cap);
	errbuf[n] = 0;
	fclose(cap);
	return errbuf;
}

int
main(void)
{
	static const char doc[] =
		"{\"name\": \"gsm8k\", \"n\": 8, \"lr\": 1e-6, \"on\": true, \"big\": \"18446744073709551615\","
		" \"neg\": -5, \"frac\": 2.5, \"meta\": {\"answer\": 42, \"tags\": [\"a\", \"b\"]},"
		" \"toks\": [1, 2, 3], \"bad_toks\": [1, \"x\"], \"lp\": [-0.5, -1], \"nul\": null}";
	cJSON *j;
	const cJSON *o;
	const char *s;
	int i, b;
	int64_t i64;
	uint64_t u64;
	double d;
	int32_t *toks;
	float *lp;
	size_t n;

	T_BEGIN("test_json");
	rl_log_init("test_json", RL_LOG_NORMAL);
	T_OK(rl_json_parse(&j, doc, strlen(doc), "doc.json") == 0);
	T_OK(rl_json_get_str(j, "doc.json", "name", &s) == 0 && strcmp(s, "gsm8k") == 0);
	T_OK(rl_json_get_int(j, "doc.json", "n", &i) == 0 && i == 8);
	T_OK(rl_json_get_f64(j, "doc.json", "lr", &d) == 0 && d == 1e-6);
	T_OK(rl_json_get_bool(j, "doc.json", "on", &b) == 0 && b == 1);
	T_OK(rl_json_get_u64(j, "doc.json", "big", &u64) == 0 && u64 == UINT64_MAX);
	T_OK(rl_json_get_i64(j, "doc.json", "neg", &i64) == 0 && i64 == -5);
	T_OK(rl_json_get_int(j, "doc.json", "meta.answer", &i) == 0 && i == 42);
	T_OK(rl_json_get_str(j, "doc.json", "meta.tags.1", &s) == 0 && strcmp(s, "b") == 0);
	T_OK(rl_json_get_obj(j, "doc.json", "meta", &o) == 0 && rl_json_get_int(o, NULL, "answer", &i) == 0);
	T_OK(rl_json_get_i32s(j, "doc.json", "toks", &toks, &n) == 0 && n == 3 && toks[2] == 3);
	free(toks);
	T_OK(rl_json_get_f32s(j, "doc.json", "lp", &lp, &n) == 0 && n == 2 && lp[1] == -1.0f);
	free(lp);
	/* defaults: absent and null */
	T_OK(rl_json_opt_int(j, "doc.json", "missing", 7, &i) == 0 && i == 7);
	T_OK(rl_json_opt_f64(j, "doc.json", "nul", 0.5, &d) == 0 && d == 0.5);
	T_OK(rl_json_opt_str(j, "doc.json", "meta.nothing", "dflt", &s) == 0 && strcmp(s, "dflt") == 0);
	T_OK(rl_json_opt_bool(j, "doc.json", "on", 0, &b) == 0 && b == 1);
	T_OK(rl_json_opt_i64(j, "doc.json", "neg", 0, &i64) == 0 && i64 == -5);

	/* errors name the document and the path */
	cap_begin();
	T_EQ_INT(rl_json_get_str(j, "doc.json", "meta.answer", &s), RL_EFORMAT);
	T_OK(strstr(cap_end(), "doc.json: meta.answer: expected a string, got a number") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_get_int(j, "doc.json", "meta.question", &i), RL_ENOENT);
	T_OK(strstr(cap_end(), "doc.json: missing key meta.question") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_get_int(j, "doc.json", "frac", &i), RL_EFORMAT);
	T_OK(strstr(cap_end(), "frac: expected an integer") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_get_u64(j, "doc.json", "neg", &u64), RL_EFORMAT);
	T_OK(strstr(cap_end(), "neg: integer out of range") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_get_i32s(j, "doc.json", "bad_toks", &toks, &n), RL_EFORMAT);
	T_OK(strstr(cap_end(), "doc.json: bad_toks.1: expected an integer, got a string") != NULL, "%s", errbuf);
	T_OK(toks == NULL && n == 0);
	cap_begin();
	T_EQ_INT(rl_json_opt_int(j, "doc.json", "name", 1, &i), RL_EFORMAT);
	T_OK(strstr(cap_end(), "name: expected an integer, got a string") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_get_obj(j, "doc.json", "toks", &o), RL_EFORMAT);
	T_OK(strstr(cap_end(), "toks: expected an object, got an array") != NULL, "%s", errbuf);
	cJSON_Delete(j);

	/* parse errors: position; trailing text; not NUL-terminated input */
	cap_begin();
	T_EQ_INT(rl_json_parse(&j, "{\"a\": [1, 2,, 3]}", 17, "x.json"), RL_EFORMAT);
	T_OK(strstr(cap_end(), "x.json: invalid JSON near byte") != NULL, "%s", errbuf);
	cap_begin();
	T_EQ_INT(rl_json_parse(&j, "{} {}", 5, "y.json"), RL_EFORMAT);
	T_OK(strstr(cap_end(), "y.json: invalid JSON: trailing text at byte 3") != NULL, "%s", errbuf);
	T_OK(rl_json_parse(&j, "{\"k\": 1}XXXX", 8, "z") == 0);
	cJSON_Delete(j);
	/* rl_json_parse_all: NULL for junk after the value, no message */
	j = rl_json_parse_all("{\"prompt\":\"ab\"} {\"prompt\":\"cd\"}", 31);
	T_OK(j == NULL);
	j = rl_json_parse_all("0.5abc", 6);
	T_OK(j == NULL);
	j = rl_json_parse_all(" 1 \r\n", 6);
	T_OK(cJSON_IsNumber(j) && j->valuedouble == 1);
	cJSON_Delete(j);

	/* escaped NULs: an odd run of backslashes before u0000; the index of the
	 * member that holds one, in its value (nested too) or in its name */
#define NULM(lit) rl_json_nul_member(lit, sizeof(lit) - 1)
	T_EQ_INT(NULM("{\"a\":\"x\\u0000\"}"), 0);
	T_EQ_INT(NULM("{\"a\":\"x\\\\u0000\"}"), -1);
	T_EQ_INT(NULM("{\"a\":\"x\\\\\\u0000\"}"), 0);
	T_EQ_INT(NULM("{\"a\":\"x\\u00001\"}"), 0);
	T_EQ_INT(NULM("{\"a\":\"x\\u0001\"}"), -1);
	T_EQ_INT(NULM("{ \"a\" : 1 , \"b\" : [ 2, {\"c\": \"\\u0000\"} ] }"), 1);
	T_EQ_INT(NULM("{\"a\":\"\\\"\\u0000\",\"b\":2}"), 0);
	T_EQ_INT(NULM("{\"a\":1,\"b\\u0000c\":2}"), 1);
	T_EQ_INT(NULM("{\"a\":\"u0000\",\"b\":\"\\\\\",\"c\":\"\\u0000\"}"), 2);
	T_EQ_INT(NULM("[ \"a\", [\"\\u0000\"] ]"), 1);
	T_EQ_INT(NULM("[]"), -1);
	T_EQ_INT(NULM("\"\\u0000\""), -1);  /* neither object nor array */
#undef NULM
	/* a key that appears twice: the first such name; nested objects are their own */
	{
		static const char *const cases[][2] = {
			{ "{\"a\":1,\"b\":2}", NULL }, { "{\"prompt\":\"a\",\"x\":1,\"prompt\":\"b\"}", "prompt" },
			{ "{\"m\":{\"k\":1},\"k\":2}", NULL }, { "{\"a\":1,\"b\":1,\"b\":2,\"a\":3}", "a" },
			{ "{}", NULL },
		};
		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
			cJSON *d = cJSON_Parse(cases[i][0]);
			const char *k = rl_json_dup_key(d);
			T_OK(d != NULL && (cases[i][1] ? k && strcmp(k, cases[i][1]) == 0 : k == NULL), "dup key in %s",
			    cases[i][0]);
			cJSON_Delete(d);
		}
		T_OK(rl_json_dup_key(NULL) == NULL, "%s", "NULL");
	}

	/* rl_json_print: every number reads back as the same double (cJSON's own
	 * printer gave 2^53 as 9.00719925474099e+15), keys and order kept */
	{
		const char *in = "{\"uid\":9007199254740992,\"a\":{\"b\":[0.1,123456789012345.6,-7,1e300]},"
				 "\"s\":\"x\",\"t\":0.30000000000000004}";
		char *out;
		T_OK((j = rl_json_parse_all(in, strlen(in))) != NULL);
		out = rl_json_print(j);
		T_EQ_STR(out, "{\"uid\":9007199254740992,\"a\":{\"b\":[0.1,123456789012345.59,-7,1e+300]},"
			      "\"s\":\"x\",\"t\":0.30000000000000004}");
		free(out);
		out = rl_json_print(cJSON_GetObjectItem(j, "uid"));
		T_EQ_STR(out, "9007199254740992");
		free(out);
		out = rl_json_print(cJSON_GetObjectItem(j, "s"));
		T_EQ_STR(out, "\"x\"");
		free(out);
		/* the caller's tree is not changed */
		T_OK(cJSON_IsNumber(cJSON_GetObjectItem(j, "uid")));
		cJSON_Delete(j);
	}
	cap_begin();
	T_EQ_INT(rl_json_load(&j, "/nonexistent/rl.json", 0), RL_ENOENT);
	T_OK(strstr(cap_end(), "cannot open '/nonexistent/rl.json'") != NULL, "%s", errbuf);
	T_END();
}

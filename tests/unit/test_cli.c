/* test_cli.c — base/cli.h: each value parser's accepted and refused forms,
 * the option name in the message and the usage-error exit status 2. */
#include "base/cli.h"
#include "t.h"

#include <unistd.h>

static const struct option longopts[] = {
	{"top-p", required_argument, NULL, 'p'},
	{"seed", required_argument, NULL, 1000},
	{NULL, 0, NULL, 0},
};

static char msg[1024];

int
main(void)
{
	double d = -1;
	long long i = -1;
	int i32 = -1, rv;
	uint64_t u = 0;

	T_BEGIN("test_cli");
	rl_log_init("rl-test", 0);
	rl_cli_init("rl-test sub", longopts);
	T_EQ_STR(rl_cli_opt('p'), "--top-p");
	T_EQ_STR(rl_cli_opt(1000), "--seed");
	T_EQ_STR(rl_cli_opt('n'), "-n");

	T_EQ_INT(rl_cli_double('p', "0.5", 0, 1, &d), 0);
	T_CLOSE(d, 0.5, 0, 0);
	const char *bad_d[] = {"", "x", "0.5x", "2", "-0.1", "nan", "inf", "1e999"};
	for (size_t k = 0; k < RL_ARRAY_LEN(bad_d); k++) {
		T_CAPTURE(rl_cli_double('p', bad_d[k], 0, 1, &d), &rv, msg);
		T_EQ_INT(rv, 2);
		T_OK(strstr(msg, "rl-test: --top-p: bad value '") == msg, "%s", msg);
		T_OK(strstr(msg, "rl-test: hint: rl-test sub --help lists the options\n") != NULL, "%s", msg);
	}
	T_CLOSE(d, 0.5, 0, 0);

	T_EQ_INT(rl_cli_int('n', "-3", -5, 5, &i), 0);
	T_EQ_INT(i, -3);
	const char *bad_i[] = {"2.5", "1e3", "6", "-6", "", "3 ", "99999999999999999999"};
	for (size_t k = 0; k < RL_ARRAY_LEN(bad_i); k++) {
		T_CAPTURE(rl_cli_int('n', bad_i[k], -5, 5, &i), &rv, msg);
		T_EQ_INT(rv, 2);
		T_OK(strstr(msg, "-n: bad value") != NULL, "%s", msg);
	}
	T_EQ_INT(i, -3);
	T_EQ_INT(rl_cli_int32('n', "2147483647", 0, 2147483647, &i32), 0);
	T_EQ_INT(i32, 2147483647);

	T_EQ_INT(rl_cli_u64(1000, "18446744073709551615", &u), 0);
	T_OK(u == UINT64_MAX);
	T_EQ_INT(rl_cli_u64(1000, "9007199254740993", &u), 0);
	T_OK(u == 9007199254740993ULL, "a seed keeps all its bits");
	const char *bad_u[] = {"-1", "18446744073709551616", "1.0", " 1", ""};
	for (size_t k = 0; k < RL_ARRAY_LEN(bad_u); k++) {
		T_CAPTURE(rl_cli_u64(1000, bad_u[k], &u), &rv, msg);
		T_EQ_INT(rv, 2);
	}

	struct { const char *s; uint64_t v; } ok_b[] = {
		{"512", 512}, {"4k", 4096}, {"64M", 64ull << 20}, {"1.5GB", 3ull << 29}, {"2kb", 2048}, {"64MiB", 64ull << 20},
	};
	for (size_t k = 0; k < RL_ARRAY_LEN(ok_b); k++) {
		T_EQ_INT(rl_cli_bytes('n', ok_b[k].s, 0, 1ull << 40, &u), 0);
		T_OK(u == ok_b[k].v, "%s", ok_b[k].s);
	}
	const char *bad_b[] = {"1T", "-1", "0.5", "4q", "2G", "", "k", "12iB", "4kiBB"};
	for (size_t k = 0; k < RL_ARRAY_LEN(bad_b); k++) {
		T_CAPTURE(rl_cli_bytes('n', bad_b[k], 0, 1ull << 30, &u), &rv, msg);
		T_EQ_INT(rv, 2);
		T_OK(strstr(msg, "bad value") != NULL, "%s", msg);
	}
	T_END();
}

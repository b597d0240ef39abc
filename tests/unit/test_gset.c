/* test_gset.c — id ranges: ids added in any order merge into ranges, lookups,
 * ids beyond 2^53 survive the JSON form exactly, malformed JSON is refused
 * naming the element. */
#include <inttypes.h>

#include "base/core.h"
#include "base/gset.h"
#include "t.h"

int
main(void)
{
	rl_gset s, u;
	cJSON *j;
	char *txt;
	uint64_t big = 0xfedcba9800000000ULL;

	T_BEGIN("gset");
	rl_gset_init(&s);
	/* a counter's ids in completion order: one range */
	uint64_t order[] = { 3, 1, 0, 2, 5, 4, 7, 6 };
	for (int i = 0; i < 8; i++)
		T_EQ_INT(rl_gset_add(&s, big | order[i]), RL_OK);
	T_EQ_INT(s.n, 1);
	T_EQ_INT(rl_gset_count(&s), 8);
	T_OK(rl_gset_has(&s, big | 7) && rl_gset_has(&s, big) && !rl_gset_has(&s, big | 8) &&
	    !rl_gset_has(&s, big - 1));
	/* a hole stays a hole; adding twice changes nothing */
	rl_gset_add(&s, big | 10);
	rl_gset_add(&s, big | 10);
	rl_gset_add(&s, 0);
	rl_gset_add(&s, UINT64_MAX);
	T_EQ_INT(s.n, 4);
	T_EQ_INT(rl_gset_count(&s), 11);
	T_OK(!rl_gset_has(&s, big | 9) && rl_gset_has(&s, 0) && !rl_gset_has(&s, 1) && rl_gset_has(&s, UINT64_MAX));
	rl_gset_add(&s, big | 9); /* joins both neighbours */
	rl_gset_add(&s, big | 8);
	T_EQ_INT(s.n, 3);

	/* JSON: decimal strings, exact beyond 2^53 */
	j = rl_gset_to_json(&s);
	txt = cJSON_PrintUnformatted(j);
	T_EQ_STR(txt, "[\"0\",\"18364758542507835392-18364758542507835402\",\"18446744073709551615\"]");
	rl_gset_init(&u);
	T_EQ_INT(rl_gset_from_json(&u, j, "t"), RL_OK);
	T_EQ_INT(u.n, 3);
	T_OK(rl_gset_has(&u, big | 10) && !rl_gset_has(&u, big | 11) && rl_gset_has(&u, UINT64_MAX));
	free(txt);
	cJSON_Delete(j);

	/* add_all: overlapping and touching ranges merge */
	rl_gset_fini(&u);
	rl_gset_init(&u);
	rl_gset_add(&u, 5);
	rl_gset_add(&u, big | 11);
	T_EQ_INT(rl_gset_add_all(&u, &s), RL_OK);
	T_EQ_INT(u.n, 4);
	T_EQ_INT(rl_gset_count(&u), 15);

	/* refused: numbers, signs, reversed ranges, overflow, trailing text */
	const char *bad[] = { "[1]", "[\"-1\"]", "[\"5-3\"]", "[\"18446744073709551616\"]", "[\"1-2x\"]",
		"[\"\"]", "{}" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		rl_gset v;
		rl_gset_init(&v);
		j = cJSON_Parse(bad[i]);
		T_OK(rl_gset_from_json(&v, j, "trainer_state.json 'groups_done'") == RL_EFORMAT, "%s", bad[i]);
		cJSON_Delete(j);
		rl_gset_fini(&v);
	}
	rl_gset_fini(&u);
	rl_gset_fini(&s);
	rl_gset_fini(NULL);
	T_END();
}

/* test_groups.c — group assembly: out-of-order arrival, duplicates dropped,
 * each kind of bad record named (error) or its group dropped (skip),
 * incomplete groups reported at the end. */
#include <math.h>

#include "base/core.h"
#include "train/groups.h"
#include "stream/traj.h"
#include "t.h"

static rl_traj *
mk(uint64_t id, uint64_t group, int index, int gsize, float reward, int rlen, int nlp)
{
	rl_traj *t;
	int32_t p[3] = { 1, 2, 3 }, r[8];
	float lp[8];

	rl_traj_create(&t);
	for (int i = 0; i < 8; i++)
		r[i] = 10 + i, lp[i] = -0.1f * i;
	rl_traj_set_u64(t, RL_TAG_ID, id);
	rl_traj_set_u64(t, RL_TAG_GROUP, group);
	rl_traj_set_i32(t, RL_TAG_INDEX, index);
	rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gsize);
	rl_traj_set_i32s(t, RL_TAG_PROMPT, p, 3);
	rl_traj_set_i32s(t, RL_TAG_RESPONSE, r, (size_t)rlen);
	if (nlp >= 0)
		rl_traj_set_f32s(t, RL_TAG_LOGPROBS, lp, (size_t)nlp);
	if (!isinf(reward))
		rl_traj_set_f32(t, RL_TAG_REWARD, reward);
	rl_traj_set_version(t, 3, 4);
	return t;
}

static int
add(rl_grouper *g, rl_traj *t)
{
	int rv = rl_grouper_add(g, t, "test");
	rl_traj_destroy(t);
	return rv;
}

int
main(void)
{
	rl_grouper *g;
	rl_grouper_opts o = { 0 };
	rl_group grp;

	T_BEGIN("test_groups");
	rl_log_init("test_groups", RL_LOG_QUIET);

	/* two interleaved groups of 2, one duplicate */
	rl_grouper_create(&g, &o);
	T_EQ_INT(add(g, mk(1, 100, 1, 2, 1.0f, 4, 4)), RL_OK);
	T_EQ_INT(add(g, mk(3, 200, 0, 2, 0.0f, 2, 2)), RL_OK);
	T_EQ_INT(rl_grouper_pop(g, &grp), RL_ENOENT);
	T_EQ_INT(add(g, mk(1, 100, 1, 2, 1.0f, 4, 4)), RL_OK); /* redelivered */
	T_EQ_INT(add(g, mk(2, 100, 0, 2, 0.5f, 3, 3)), RL_OK);
	T_EQ_INT(rl_grouper_pop(g, &grp), RL_OK);
	T_EQ_INT(grp.group, 100);
	T_EQ_INT(grp.n, 2);
	T_EQ_INT(grp.s[0].id, 2);
	T_EQ_INT(grp.s[1].id, 1);
	T_EQ_INT(grp.s[1].rlen, 4);
	T_EQ_INT(grp.s[1].response[3], 13);
	T_CLOSE(grp.s[1].logprobs[2], -0.2, 1e-7, 0);
	T_EQ_INT(grp.s[0].ver_first, 3);
	T_EQ_INT(grp.s[0].ver_last, 4);
	T_CLOSE(grp.s[0].reward, 0.5, 0, 0);
	rl_group_fini(&grp);
	T_EQ_INT(rl_grouper_stats_get(g)->duplicates, 1);
	T_EQ_INT(rl_grouper_finish(g), 1); /* group 200 has 1 of 2 */
	rl_grouper_destroy(g);

	/* bad records under the error policy: each one is an error */
	rl_grouper_create(&g, &o);
	T_EQ_INT(add(g, mk(10, 1, 0, 2, INFINITY, 2, 2)), RL_EFORMAT); /* no reward */
	T_EQ_INT(add(g, mk(11, 1, 0, 2, NAN, 2, 2)), RL_EFORMAT);      /* NaN reward */
	T_EQ_INT(add(g, mk(12, 1, 0, 2, 1.0f, 3, 2)), RL_EFORMAT);     /* logprobs length */
	T_EQ_INT(add(g, mk(13, 1, 5, 2, 1.0f, 2, 2)), RL_EFORMAT);     /* index >= size */
	/* a group_size out of range names the field, allocates no group */
	T_EQ_INT(add(g, mk(14, 2, 0, -3, 1.0f, 2, 2)), RL_EFORMAT);
	T_EQ_INT(add(g, mk(15, 3, 0, 2000000000, 1.0f, 2, 2)), RL_EFORMAT);
	rl_grouper_destroy(g);

	/* logprobs required */
	o.need_logprobs = 1;
	rl_grouper_create(&g, &o);
	T_EQ_INT(add(g, mk(20, 1, 0, 1, 1.0f, 2, -1)), RL_EFORMAT);
	rl_grouper_destroy(g);

	/* skip policy: the whole group with a bad member is dropped, counted */
	o.need_logprobs = 0;
	o.on_bad = RL_BAD_SKIP;
	rl_grouper_create(&g, &o);
	T_EQ_INT(add(g, mk(30, 7, 0, 3, 1.0f, 2, 2)), RL_OK);
	T_EQ_INT(add(g, mk(31, 7, 1, 3, NAN, 2, 2)), RL_OK);
	T_EQ_INT(add(g, mk(32, 7, 2, 3, 0.0f, 2, 2)), RL_OK);
	T_EQ_INT(add(g, mk(33, 8, 0, 1, 0.0f, 2, 2)), RL_OK);
	T_EQ_INT(add(g, mk(34, 9, 0, -3, 0.0f, 2, 2)), RL_OK);       /* bad group_size: */
	T_EQ_INT(add(g, mk(35, 9, 0, 70000, 0.0f, 2, 2)), RL_OK);    /* the record alone */
	T_EQ_INT(rl_grouper_pop(g, &grp), RL_OK);
	T_EQ_INT(grp.group, 8);
	rl_group_fini(&grp);
	T_EQ_INT(rl_grouper_pop(g, &grp), RL_ENOENT);
	T_EQ_INT(rl_grouper_stats_get(g)->bad_groups, 1);
	T_EQ_INT(rl_grouper_stats_get(g)->bad_records, 3);
	T_EQ_INT(rl_grouper_finish(g), 0);
	rl_grouper_destroy(g);

	/* many groups (table growth) */
	o.on_bad = RL_BAD_ERROR;
	rl_grouper_create(&g, &o);
	int popped = 0;
	for (int i = 0; i < 3000; i++)
		T_EQ_INT(add(g, mk(1000 + (uint64_t)i, (uint64_t)(i % 1500), i / 1500, 2, 1.0f, 1, 1)), RL_OK);
	while (rl_grouper_pop(g, &grp) == RL_OK) {
		popped++;
		rl_group_fini(&grp);
	}
	T_EQ_INT(popped, 1500);
	rl_grouper_destroy(g);
	T_END();
}

/*
 * qbatch.h — a broker put's payload for the queue simulations (test_autok,
 * test_earlystop): n records of group g (group size gs), ids id0.., and with
 * v >= 0 a version [v, v] and a 4-token response (a generated sample; v < 0:
 * a prompt).  The caller frees the buffer.
 */
#ifndef RL_TEST_QBATCH_H
#define RL_TEST_QBATCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/io.h"
#include "stream/traj.h"

static rl_buf
mk(uint64_t id0, size_t n, uint64_t g, int gs, int v)
{
	rl_traj_batch *b;
	rl_traj *t;
	rl_buf out;
	const void *p;
	size_t len;
	int32_t tok[4] = { 1, 2, 3, 4 };

	rl_buf_init(&out);
	rl_traj_batch_create(&b);
	rl_traj_create(&t);
	for (size_t i = 0; i < n; i++) {
		rl_traj_clear(t);
		rl_traj_set_u64(t, RL_TAG_ID, id0 + i);
		rl_traj_set_u64(t, RL_TAG_GROUP, g);
		rl_traj_set_i32(t, RL_TAG_INDEX, (int)i);
		rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gs);
		if (v >= 0) {
			rl_traj_set_version(t, v, v);
			rl_traj_set_i32s(t, RL_TAG_RESPONSE, tok, 4);
		}
		rl_traj_batch_add(b, t);
	}
	rl_traj_batch_payload(b, &p, &len);
	rl_buf_append(&out, p, len);
	rl_traj_destroy(t);
	rl_traj_batch_destroy(b);
	return out;
}

#endif

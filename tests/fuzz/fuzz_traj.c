/*
 * fuzz_traj.c — libFuzzer target for the rl-trajectory(5) decoders: the
 * stream reader (binary frames and JSONL, auto-detected), batch decoding,
 * and the JSONL writer/parser on whatever records survive.
 *
 * Invariant checked beyond "no crash": once a record has been through JSONL
 * once, JSONL -> record -> JSONL is a fixed point and encodes to the same
 * bytes.  Built and run by tests/fuzz/run.sh (`make fuzz`), not by make check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/io.h"
#include "stream/traj.h"

static void
roundtrip(const rl_traj *t, const rl_traj_limits *lim)
{
	static rl_traj *a, *b;
	rl_buf j1, j2, j3, e2, e3;

	if (a == NULL && (rl_traj_create(&a) != 0 || rl_traj_create(&b) != 0))
		abort();
	rl_buf_init(&j1);
	rl_buf_init(&j2);
	rl_buf_init(&j3);
	rl_buf_init(&e2);
	rl_buf_init(&e3);
	if (rl_traj_to_json(&j1, t) != 0)
		goto out;
	if (rl_traj_from_json(a, (const char *)j1.p, j1.len - 1, lim, "j1") != 0)
		goto out;
	if (rl_traj_to_json(&j2, a) != 0)
		abort();
	if (rl_traj_from_json(b, (const char *)j2.p, j2.len - 1, lim, "j2") != 0)
		goto out;
	if (rl_traj_to_json(&j3, b) != 0)
		abort();
	if (j2.len != j3.len || memcmp(j2.p, j3.p, j2.len) != 0)
		abort();
	if (rl_traj_encode(&e2, a) != 0 || rl_traj_encode(&e3, b) != 0)
		abort();
	if (e2.len != e3.len || memcmp(e2.p, e3.p, e2.len) != 0)
		abort();
out:
	rl_buf_fini(&j1);
	rl_buf_fini(&j2);
	rl_buf_fini(&j3);
	rl_buf_fini(&e2);
	rl_buf_fini(&e3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	static rl_traj_batch *batch;
	rl_traj_limits lim;
	rl_traj_reader *r;
	rl_traj *t;
	size_t used;

	if (!init) {
		rl_log_init("fuzz_traj", RL_LOG_QUIET);
		if (rl_traj_batch_create(&batch) != 0)
			abort();
		init = 1;
	}
	rl_traj_limits_default(&lim);
	lim.max_frame = 1 << 20;
	lim.max_record = 1 << 18;
	lim.max_fields = 64;
	lim.max_line = 1 << 18;

	if (rl_traj_reader_open_mem(&r, data, size, "fuzz", &lim) != 0)
		abort();
	while (rl_traj_reader_next(r, &t) == 0 && t != NULL)
		roundtrip(t, &lim);
	rl_traj_reader_close(r);

	/* the batch API on the same bytes; on success re-encode and compare */
	if (rl_traj_batch_decode(batch, &used, data, size, &lim, "fuzz") == 0) {
		const void *p1, *p2;
		size_t n1, n2;
		rl_buf out;
		static rl_traj_batch *again;
		if (again == NULL && rl_traj_batch_create(&again) != 0)
			abort();
		if (used > size)
			abort();
		rl_buf_init(&out);
		if (rl_traj_batch_encode(&out, batch, 1) != 0)
			abort();
		if (rl_traj_batch_decode(again, &used, out.p, out.len, &lim, "again") != 0)
			abort();
		if (rl_traj_batch_payload(batch, &p1, &n1) != 0 || rl_traj_batch_payload(again, &p2, &n2) != 0)
			abort();
		if (n1 != n2 || memcmp(p1, p2, n1) != 0)
			abort();
		rl_buf_fini(&out);
	}
	return 0;
}

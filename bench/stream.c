/*
 * bench/stream.c — throughput of the rl-trajectory(5) codec on one core:
 * encode+compress (records -> batch -> zstd frame) and decompress+decode
 * (frame -> checked batch -> records, reading every token and log-prob),
 * in MB/s of raw record bytes, plus the compression ratio.
 *
 * Records as rl-rollout writes them: 64 prompt + 512 response tokens (ids
 * from a Zipf-like distribution over a 151k vocabulary), 512 behaviour
 * log-probs (mostly near 0, like sampled tokens), ids, version, finish,
 * reward, timestamps.  256 records per frame (the writer's default).
 *
 * usage: stream [SECONDS_PER_CASE] (default 1).  One JSON object per line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/io.h"
#include "base/rng.h"
#include "stream/traj.h"

enum { NREC = 1024, BATCH = 256, P = 64, R = 512, VOCAB = 151936 };

static uint64_t st = 42;
static double
uni(void)
{
	st += 0x9e3779b97f4a7c15ull;
	return (double)(rl_rng_mix(st) >> 11) * 0x1.0p-53;
}

static double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int32_t
token(void)
{
	/* Zipf-ish: frequent small ids, a long tail */
	double u = uni();
	return (int32_t)(pow(u, 3.0) * (VOCAB - 1));
}

int
main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 1.0;
	static int levels[] = { -1, 1, 3 };
	rl_traj *t[NREC], *x;
	rl_traj_batch *b, *d;
	rl_buf frames[NREC / BATCH];
	size_t raw = 0, comp = 0;
	int32_t toks[P + R];
	float lp[R];

	rl_log_init("stream", RL_LOG_NORMAL);
	for (int i = 0; i < NREC; i++) {
		rl_traj_create(&t[i]);
		for (int k = 0; k < P + R; k++)
			toks[k] = token();
		for (int k = 0; k < R; k++)
			lp[k] = (float)log(1.0 - 0.999 * pow(uni(), 4.0));
		rl_traj_set_u64(t[i], RL_TAG_ID, 1000000ull + (uint64_t)i);
		rl_traj_set_u64(t[i], RL_TAG_GROUP, 5000ull + (uint64_t)i / 8);
		rl_traj_set_i32(t[i], RL_TAG_INDEX, i % 8);
		rl_traj_set_i32(t[i], RL_TAG_GROUP_SIZE, 8);
		rl_traj_set_version(t[i], 41, 42);
		rl_traj_set_i32s(t[i], RL_TAG_PROMPT, toks, P);
		rl_traj_set_i32s(t[i], RL_TAG_RESPONSE, toks + P, R);
		rl_traj_set_f32s(t[i], RL_TAG_LOGPROBS, lp, R);
		rl_traj_set_str(t[i], RL_TAG_FINISH, uni() < 0.8 ? "eos" : "length");
		rl_traj_set_f32(t[i], RL_TAG_REWARD, uni() < 0.5 ? 1.0f : 0.0f);
		rl_traj_set_f64(t[i], RL_TAG_TS_GEN_START, 1763800000.0 + i);
		rl_traj_set_f64(t[i], RL_TAG_TS_GEN_END, 1763800001.5 + i);
	}
	rl_traj_batch_create(&b);
	rl_traj_batch_create(&d);
	rl_traj_create(&x);
	for (size_t f = 0; f < NREC / BATCH; f++)
		rl_buf_init(&frames[f]);

	for (size_t li = 0; li < RL_ARRAY_LEN(levels); li++) {
		int level = levels[li];
		double t0, c0, wall, cpu;
		long iters;
		uint64_t check = 0;

		/* encode + compress */
		iters = 0;
		t0 = rl_now();
		c0 = cpu_now();
		do {
			raw = comp = 0;
			for (size_t f = 0; f < NREC / BATCH; f++) {
				rl_traj_batch_clear(b);
				for (size_t i = 0; i < BATCH; i++)
					if (rl_traj_batch_add(b, t[f * BATCH + i]) != 0)
						return 1;
				raw += rl_traj_batch_bytes(b);
				frames[f].len = 0;
				if (rl_traj_batch_encode(&frames[f], b, level) != 0)
					return 1;
				comp += frames[f].len;
			}
			iters++;
		} while (rl_now() - t0 < secs);
		wall = rl_now() - t0;
		cpu = cpu_now() - c0;
		printf("{\"bench\":\"stream\",\"op\":\"encode\",\"level\":%d,\"record_bytes\":%zu,\"records\":%ld,"
		       "\"mb_s\":%.1f,\"mb_s_cpu\":%.1f,\"ratio\":%.3f,\"wall_s\":%.2f}\n",
		       level, raw / NREC, iters * NREC, (double)raw * (double)iters / wall / 1e6,
		       (double)raw * (double)iters / cpu / 1e6, (double)raw / (double)comp, wall);
		fflush(stdout);

		/* decompress + decode, touching every token and log-prob */
		iters = 0;
		t0 = rl_now();
		c0 = cpu_now();
		do {
			for (size_t f = 0; f < NREC / BATCH; f++) {
				size_t used;
				if (rl_traj_batch_decode(d, &used, frames[f].p, frames[f].len, NULL, "bench") != 0)
					return 1;
				for (size_t i = 0; i < rl_traj_batch_count(d); i++) {
					const int32_t *rt;
					const float *l;
					size_t n, m;
					uint64_t id;
					rl_traj_batch_get(d, i, x);
					if (rl_traj_get_u64(x, RL_TAG_ID, &id) || rl_traj_get_i32s(x, RL_TAG_RESPONSE, &rt, &n) ||
					    rl_traj_get_f32s(x, RL_TAG_LOGPROBS, &l, &m) || n != m)
						return 1;
					for (size_t k = 0; k < n; k++)
						check += (uint64_t)rt[k] + (uint64_t)(l[k] < -1.0f);
					check += id;
				}
			}
			iters++;
		} while (rl_now() - t0 < secs);
		wall = rl_now() - t0;
		cpu = cpu_now() - c0;
		printf("{\"bench\":\"stream\",\"op\":\"decode\",\"level\":%d,\"record_bytes\":%zu,\"records\":%ld,"
		       "\"mb_s\":%.1f,\"mb_s_cpu\":%.1f,\"ratio\":%.3f,\"wall_s\":%.2f,\"check\":%llu}\n",
		       level, raw / NREC, iters * NREC, (double)raw * (double)iters / wall / 1e6,
		       (double)raw * (double)iters / cpu / 1e6, (double)raw / (double)comp, wall,
		       (unsigned long long)(check % 1000000007ull));
		fflush(stdout);
	}

	/* JSONL for comparison (what a script in another language would read) */
	{
		rl_buf js;
		double t0 = rl_now();
		long iters = 0;
		rl_buf_init(&js);
		do {
			js.len = 0;
			for (int i = 0; i < NREC; i++)
				rl_traj_to_json(&js, t[i]);
			iters++;
		} while (rl_now() - t0 < secs);
		printf("{\"bench\":\"stream\",\"op\":\"jsonl_write\",\"record_bytes\":%zu,\"jsonl_bytes\":%zu,"
		       "\"mb_s\":%.1f}\n", raw / NREC, js.len / NREC, (double)raw * (double)iters / (rl_now() - t0) / 1e6);
		rl_buf_fini(&js);
	}

	for (int i = 0; i < NREC; i++)
		rl_traj_destroy(t[i]);
	for (size_t f = 0; f < NREC / BATCH; f++)
		rl_buf_fini(&frames[f]);
	rl_traj_batch_destroy(b);
	rl_traj_batch_destroy(d);
	rl_traj_destroy(x);
	return 0;
}

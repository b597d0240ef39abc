/* test_comm.c — the communicator's CPU ring backend with real processes on
 * 127.0.0.1 (forked before any nng use, each under an alarm):
 *  - 2 and 3 ranks: all-reduce of awkward sizes (0, 1, fewer elements than
 *    ranks, not a multiple of the world, several segments) equals the sum
 *    computed locally, bitwise the same on every rank; broadcast from each
 *    root; host all-gather and f64 sum; barrier; orderly finish;
 *  - a rank killed with SIGKILL, and a rank that leaves without finishing:
 *    the survivors fail with RL_ECLOSED within seconds, far below the timeout;
 *  - a hung rank: the others fail with RL_ETIMEDOUT after the timeout;
 *  - the bucketed all-reduce (rl_comm_reducer) with its communication thread,
 *    fed part by part from the end as a backward pass does, over two rounds:
 *    exact sums, bitwise equal on every rank and to the same buckets reduced
 *    without overlap; host broadcast; a rank killed while the thread reduces;
 *  - ZeRO's reduce-scatter to the own shard and all-gather of the shards;
 *    ZeRO-2's reduce-scatter of parts of a buffer to the shards of the whole,
 *    alone and as the buckets of a reducer (overlapped or not, two rounds
 *    accumulated by its callback): the own shard's sums, equal to a naive sum;
 *  - launch configuration: WORLD_SIZE=0, RANK >= WORLD_SIZE, a non-number,
 *    no MASTER_ADDR, SLURM variables, an unreachable and an unresolvable master. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/comm.h"
#include "base/core.h"
#include "t.h"
#include "t_port.h"

/* the value rank r contributes at index i: exact in f32, so sums are exact */
static float
val(int r, size_t i)
{
	return (float)((int)((i * 7 + (size_t)r * 13) % 101) - 50) * 0.25f;
}

static char master[64];

static int
join(rl_comm **c, int rank, int world, double timeout)
{
	rl_comm_opts o;
	rl_comm_opts_default(&o);
	o.rank = rank;
	o.world = world;
	o.master = master;
	o.backend = "cpu";
	o.timeout = timeout;
	o.seg_bytes = 4096; /* several segments per chunk below */
	return rl_comm_open(c, &o, NULL);
}

/* ---- the collectives ------------------------------------------------------------- */

static int
worker_ok(int rank, int world)
{
	rl_comm *c;
	int bad = 0;
	size_t sizes[] = { 0, 1, 2, 5, 1000, 4099, 100003 };

	alarm(60);
	if (join(&c, rank, world, 20) != 0)
		return 10;
	if (rl_comm_rank(c) != rank || rl_comm_world(c) != world || strcmp(rl_comm_backend(c), "cpu"))
		bad |= 1;
	for (size_t k = 0; k < RL_ARRAY_LEN(sizes); k++) {
		size_t n = sizes[k];
		float *b = malloc((n + 1) * sizeof *b), *all;
		for (size_t i = 0; i < n; i++)
			b[i] = val(rank, i);
		if (rl_comm_allreduce(c, b, n) != 0) {
			free(b);
			return 11;
		}
		for (size_t i = 0; i < n; i++) {
			float s = 0;
			for (int r = 0; r < world; r++)
				s += val(r, i);
			if (b[i] != s)
				bad |= 2;
		}
		/* bitwise the same everywhere: gather every rank's result */
		all = malloc((size_t)world * (n + 1) * sizeof *all);
		if (rl_comm_host_allgather(c, all, b, n * sizeof *b) != 0)
			return 12;
		for (int r = 0; r < world; r++)
			if (memcmp(all + (size_t)r * n, b, n * sizeof *b))
				bad |= 4;
		free(all);
		free(b);
	}
	/* non-exact values: still bitwise identical on every rank */
	{
		size_t n = 30011;
		float *b = malloc(n * sizeof *b), *all = malloc((size_t)world * n * sizeof *b);
		for (size_t i = 0; i < n; i++)
			b[i] = 1.0f / (float)(i + 1 + (size_t)rank * 3) + 1e-3f * (float)rank;
		if (rl_comm_allreduce(c, b, n) || rl_comm_host_allgather(c, all, b, n * sizeof *b))
			return 13;
		for (int r = 0; r < world; r++)
			if (memcmp(all + (size_t)r * n, b, n * sizeof *b))
				bad |= 8;
		free(b);
		free(all);
	}
	for (int root = 0; root < world; root++) {
		size_t n = 10007;
		uint8_t *b = malloc(n);
		for (size_t i = 0; i < n; i++)
			b[i] = rank == root ? (uint8_t)(i * 31 + (size_t)root) : 0xee;
		if (rl_comm_broadcast(c, b, n, root) != 0)
			return 14;
		for (size_t i = 0; i < n; i++)
			if (b[i] != (uint8_t)(i * 31 + (size_t)root))
				bad |= 16;
		free(b);
	}
	{
		double d[3] = { rank, 1, 0.5 * rank };
		if (rl_comm_host_allreduce_f64(c, d, 3) != 0)
			return 15;
		if (d[0] != world * (world - 1) / 2.0 || d[1] != world || d[2] != world * (world - 1) / 4.0)
			bad |= 32;
	}
	if (rl_comm_barrier(c) != 0 || rl_comm_finish(c) != 0)
		return 16;
	rl_comm_close(c);
	return bad ? 20 + bad : 0;
}

/* ---- the bucketed all-reduce ------------------------------------------------------------ */

/* One round as rl-train runs it: the buffer is written from the end in
 * pieces of `step` elements (NaN before, so a bucket reduced too early shows),
 * each piece declared final; then wait. */
static int
reducer_round(rl_comm_reducer *rd, float *b, size_t n, size_t step, int rank, int round)
{
	for (size_t i = 0; i < n; i++)
		b[i] = NAN;
	for (size_t from = n; from > 0;) {
		size_t lo = from > step ? from - step : 0;
		for (size_t i = lo; i < from; i++)
			b[i] = val(rank + round, i);
		from = lo;
		if (rl_comm_reducer_ready(rd, from) != 0)
			return -1;
		usleep(200); /* "compute": the thread gets going meanwhile */
	}
	return rl_comm_reducer_wait(rd);
}

/* ZeRO-2's use of a reduce-scatter bucket: add the own shard's part into
 * acc, clear the bucket (as the trainer does before the next micro-batch). */
typedef struct zcb {
	float *buf, *acc;
	size_t n, lo, hi;
	int rank, world, calls, bad;
} zcb;

static void
zero2_done(void *ctx, size_t lo, size_t hi)
{
	zcb *z = ctx;
	size_t a = RL_MAX(lo, z->lo), b = RL_MIN(hi, z->hi);

	z->calls++;
	if (lo >= hi || hi > z->n)
		z->bad = 1;
	for (size_t i = a; i < b; i++)
		z->acc[i] += z->buf[i];
	memset(z->buf + lo, 0, (hi - lo) * sizeof(float));
}

static int
worker_reducer(int rank, int world)
{
	rl_comm *c;
	rl_comm_reducer *ov, *sq;
	size_t n = 100003, bucket = 4099;
	float *b = malloc(n * sizeof *b), *ref = malloc(n * sizeof *ref), *all = malloc((size_t)world * n * sizeof *b);
	int bad = 0;
	char msg[32];

	alarm(60);
	if (join(&c, rank, world, 20) != 0)
		return 10;
	if (rl_comm_reducer_create(&ov, c, b, n, bucket, 1) || rl_comm_reducer_create(&sq, c, ref, n, bucket, 0))
		return 11;
	if (!rl_comm_reducer_overlaps(ov) || rl_comm_reducer_overlaps(sq))
		bad |= 1;
	for (int round = 0; round < 2; round++) {
		if (reducer_round(ov, b, n, 1000 + 3000 * (size_t)round, rank, round) != 0 ||
		    reducer_round(sq, ref, n, 7777, rank, round) != 0)
			return 12;
		for (size_t i = 0; i < n; i++) {
			float s = 0;
			for (int r = 0; r < world; r++)
				s += val(r + round, i);
			if (b[i] != s)
				bad |= 2;
		}
		if (memcmp(b, ref, n * sizeof *b))
			bad |= 4;
		{
			int tot, e = rl_comm_reducer_early(ov, &tot);
			if (tot != 25 || e < 20 || e >= tot || rl_comm_reducer_early(sq, NULL) != 0)
				bad |= 128;
		}
		if (rl_comm_host_allgather(c, all, b, n * sizeof *b) != 0)
			return 13;
		for (int r = 0; r < world; r++)
			if (memcmp(all + (size_t)r * n, b, n * sizeof *b))
				bad |= 8;
	}
	/* a buffer smaller than a bucket, and one of fewer elements than ranks */
	for (size_t m = 1; m <= 2; m++) {
		rl_comm_reducer *t;
		size_t k = m == 1 ? 1 : 3000;
		if (rl_comm_reducer_create(&t, c, b, k, bucket, 1) || reducer_round(t, b, k, 700, rank, 0) != 0)
			return 14;
		for (size_t i = 0; i < k; i++) {
			float s = 0;
			for (int r = 0; r < world; r++)
				s += val(r, i);
			if (b[i] != s)
				bad |= 16;
		}
		rl_comm_reducer_destroy(t);
	}
	rl_comm_reducer_destroy(ov);
	rl_comm_reducer_destroy(sq);
	/* ZeRO: reduce-scatter to the own shard, all-gather of the shards */
	{
		size_t zs[] = { 1, 2, 5, 4099, 100003 };
		for (size_t q = 0; q < RL_ARRAY_LEN(zs); q++) {
			size_t k = zs[q], lo, hi;
			rl_comm_shard(c, k, rank, &lo, &hi);
			if (hi < lo || hi > k || (k >= (size_t)world && hi == lo))
				bad |= 64;
			for (size_t i = 0; i < k; i++)
				b[i] = val(rank, i);
			if (rl_comm_reduce_scatter(c, b, k) != 0)
				return 17;
			for (size_t i = 0; i < k; i++) {
				float sum = 0;
				for (int r = 0; r < world; r++)
					sum += val(r, i);
				if (i >= lo && i < hi && b[i] != sum)
					bad |= 64;
				if (i < lo || i >= hi)
					b[i] = NAN;
				ref[i] = sum;
			}
			if (rl_comm_allgather_shards(c, b, k) != 0)
				return 18;
			if (memcmp(b, ref, k * sizeof *b))
				bad |= 64;
		}
	}
	/* ZeRO-2: a part [lo, hi) of a buffer reduce-scattered to the shards of
	 * the whole, on ranges that start and end inside shards, cover one shard's
	 * middle only, or are empty */
	{
		size_t k = 100003, rg[][2] = { { 0, 100003 }, { 17, 99001 }, { 40000, 40001 }, { 5, 5 },
		    { 33330, 33339 }, { 60000, 100003 } };
		size_t lo, hi;
		rl_comm_shard(c, k, rank, &lo, &hi);
		for (size_t q = 0; q < RL_ARRAY_LEN(rg); q++) {
			size_t a = rg[q][0], e = rg[q][1];
			for (size_t i = 0; i < k; i++)
				b[i] = val(rank + (int)q, i);
			if (rl_comm_reduce_scatter_range(c, b, k, a, e) != 0)
				return 19;
			for (size_t i = 0; i < k; i++) {
				float sum = 0;
				for (int r = 0; r < world; r++)
					sum += val(r + (int)q, i);
				if (i >= a && i < e && i >= lo && i < hi && b[i] != sum)
					bad |= 256;
				if ((i < a || i >= e) && b[i] != val(rank + (int)q, i))
					bad |= 256; /* outside the range: untouched */
			}
		}
		if (rl_comm_reduce_scatter_range(c, b, k, 10, 5) != RL_EINVAL)
			bad |= 256;
	}
	/* ZeRO-2's bucketed reduce-scatter, overlapped and not: each bucket's
	 * callback sees the own shard's sums of it, then clears the bucket */
	for (int overlap = 0; overlap <= 1; overlap++) {
		rl_comm_reducer *t;
		zcb z = { .buf = b, .acc = ref, .rank = rank, .world = world, .n = n };
		rl_comm_shard(c, n, rank, &z.lo, &z.hi);
		memset(ref, 0, n * sizeof *ref);
		if (rl_comm_reducer_create(&t, c, b, n, bucket, overlap) || rl_comm_reducer_scatter(t, zero2_done, &z))
			return 20;
		for (int round = 0; round < 2; round++)
			if (reducer_round(t, b, n, 1000 + 3000 * (size_t)round, rank, round) != 0)
				return 21;
		/* drain(1): after each piece, all but one of the final buckets are reduced
		 * (their callbacks ran); a third round, to zeros */
		for (size_t from = n, c0 = (size_t)z.calls; from > 0;) {
			from = from > 7000 ? from - 7000 : 0;
			if (rl_comm_reducer_ready(t, from) != 0 || rl_comm_reducer_drain(t, 1) != 0)
				return 22;
			size_t final = RL_MIN((n - from) / bucket + (from == 0), (size_t)25);
			if ((size_t)z.calls - c0 + 1 < final)
				bad |= 2048;
		}
		if (rl_comm_reducer_wait(t) != 0)
			return 23;
		rl_comm_reducer_destroy(t);
		for (size_t i = 0; i < n; i++) {
			float s0 = 0, s1 = 0;
			for (int r = 0; r < world; r++) {
				s0 += val(r, i);
				s1 += val(r + 1, i);
			}
			if (b[i] != 0 || (i >= z.lo && i < z.hi ? ref[i] != s0 + s1 : ref[i] != 0))
				bad |= 512;
		}
		if (z.calls != 3 * 25 || z.bad)
			bad |= 1024;
	}
	snprintf(msg, sizeof msg, "%s", rank == 1 ? "from rank 1" : "xxxxxxxxxxx");
	if (rl_comm_host_broadcast(c, msg, 12, 1) != 0)
		return 15;
	if (strcmp(msg, "from rank 1"))
		bad |= 32;
	if (rl_comm_finish(c) != 0)
		return 16;
	rl_comm_close(c);
	free(b);
	free(ref);
	free(all);
	return bad ? 20 + bad : 0;
}

/* Rank 1 is killed while the others' threads reduce: their wait fails fast. */
static int
worker_reducer_fault(int rank, int world)
{
	rl_comm *c;
	rl_comm_reducer *rd;
	size_t n = 200000;
	float *b = calloc(n, sizeof *b);
	int rv;

	alarm(60);
	if (join(&c, rank, world, 30) != 0 || rl_comm_reducer_create(&rd, c, b, n, 5000, 1) != 0)
		return 10;
	if (rank == 1) {
		usleep(300000);
		raise(SIGKILL);
	}
	rv = reducer_round(rd, b, n, 5000, rank, 0);
	rl_comm_reducer_destroy(rd);
	rl_comm_close(c);
	return rv == RL_ECLOSED ? 4 : 5;
}

typedef int (*worker_fn)(int rank, int world);

/* Runs world processes; returns how many exited 0; codes[] their exit codes. */
static int
run_world(int world, worker_fn fn, int *codes, double *secs)
{
	pid_t pid[8];
	int ok = 0;
	double t0 = rl_now();

	snprintf(master, sizeof master, "127.0.0.1:%d", t_free_port());
	for (int r = 0; r < world; r++) {
		if ((pid[r] = fork()) == 0)
			_exit(fn(r, world));
	}
	for (int r = 0; r < world; r++) {
		int st;
		waitpid(pid[r], &st, 0);
		codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		ok += codes[r] == 0;
	}
	if (secs)
		*secs = rl_now() - t0;
	return ok;
}

/* ---- faults -------------------------------------------------------------------------- */

static int fault_mode; /* 1: rank 1 SIGKILLs itself; 2: rank 1 leaves without finish; 3: hangs */

static int
worker_fault(int rank, int world)
{
	rl_comm *c;
	float b[1000];
	int rv;

	alarm(60);
	if (join(&c, rank, world, fault_mode == 3 ? 1.5 : 30) != 0)
		return 10;
	for (int i = 0; i < 1000; i++)
		b[i] = (float)i;
	/* rank 1's last segments of this one may die with it (mode 1): then the
	 * survivors fail here already, which is as good */
	if ((rv = rl_comm_allreduce(c, b, 1000)) != 0)
		return fault_mode == 1 && rank != 1 && rv == RL_ECLOSED ? 4 : 11;
	if (rank == 1) {
		if (fault_mode == 1)
			raise(SIGKILL);
		if (fault_mode == 2) {
			rl_comm_close(c);
			return 3;
		}
		sleep(6);
		return 3;
	}
	/* the survivors: two collectives, the second one can never complete */
	rv = rl_comm_allreduce(c, b, 1000);
	if (rv == 0)
		rv = rl_comm_allreduce(c, b, 1000);
	rl_comm_close(c);
	if (fault_mode == 3)
		return rv == RL_ETIMEDOUT || rv == RL_ECLOSED ? 4 : 5;
	return rv == RL_ECLOSED ? 4 : 5;
}

/* ---- launch configuration -------------------------------------------------------------- */

static const char *envs[] = { "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
	"SLURM_NTASKS", "SLURM_LOCALID", "RL_COMM_TIMEOUT" };

static void
clear_env(void)
{
	for (size_t i = 0; i < RL_ARRAY_LEN(envs); i++)
		unsetenv(envs[i]);
}

static int
from_env(rl_comm_opts *o)
{
	rl_comm_opts_default(o);
	return rl_comm_opts_from_env(o);
}

static void
test_env(void)
{
	rl_comm_opts o;

	clear_env();
	T_EQ_INT(from_env(&o), RL_OK);
	T_EQ_INT(o.rank, 0);
	T_EQ_INT(o.world, 1);
	T_OK(o.timeout == 600);

	setenv("WORLD_SIZE", "0", 1);
	setenv("RANK", "0", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL);
	setenv("WORLD_SIZE", "2", 1);
	setenv("RANK", "2", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL);
	setenv("RANK", "x1", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL);
	setenv("RANK", "1", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL); /* no MASTER_ADDR */
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("LOCAL_RANK", "1", 1);
	setenv("RL_COMM_TIMEOUT", "7.5", 1);
	T_EQ_INT(from_env(&o), RL_OK);
	T_EQ_INT(o.rank, 1);
	T_EQ_INT(o.world, 2);
	T_EQ_INT(o.local_rank, 1);
	T_OK(o.timeout == 7.5);
	T_EQ_STR(o.master, "127.0.0.1:29500");
	setenv("RL_COMM_TIMEOUT", "soon", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL);
	unsetenv("RL_COMM_TIMEOUT");

	/* the command line wins over the environment */
	rl_comm_opts_default(&o);
	o.rank = 0;
	o.world = 3;
	o.master = "localhost:1234";
	T_EQ_INT(rl_comm_opts_from_env(&o), RL_OK);
	T_EQ_INT(o.world, 3);
	T_EQ_STR(o.master, "localhost:1234");
	rl_comm_opts_default(&o);
	o.world = 3;
	o.rank = 3;
	T_EQ_INT(rl_comm_opts_from_env(&o), RL_EINVAL);

	/* SLURM */
	clear_env();
	setenv("SLURM_PROCID", "3", 1);
	setenv("SLURM_NTASKS", "4", 1);
	setenv("SLURM_LOCALID", "1", 1);
	setenv("MASTER_ADDR", "node0", 1);
	setenv("MASTER_PORT", "29511", 1);
	T_EQ_INT(from_env(&o), RL_OK);
	T_EQ_INT(o.rank, 3);
	T_EQ_INT(o.world, 4);
	T_EQ_INT(o.local_rank, 1);
	T_EQ_STR(o.master, "node0:29511");
	setenv("SLURM_NTASKS", "3", 1);
	T_EQ_INT(from_env(&o), RL_EINVAL);
	clear_env();

	/* bad master addresses: refused fast, with the reason */
	{
		rl_comm *c = NULL;
		double t0;
		rl_comm_opts_default(&o);
		o.rank = 1;
		o.world = 2;
		o.timeout = 1;
		o.backend = "cpu";
		o.master = "no-such-host.invalid:29500";
		t0 = rl_now();
		T_EQ_INT(rl_comm_open(&c, &o, NULL), RL_ENET);
		T_OK(rl_now() - t0 < 20, "%.1f s", rl_now() - t0);
		o.master = "127.0.0.1";
		T_EQ_INT(rl_comm_open(&c, &o, NULL), RL_EINVAL);
		o.master = "127.0.0.1:70000";
		T_EQ_INT(rl_comm_open(&c, &o, NULL), RL_EINVAL);
		o.backend = "gloo";
		o.master = "127.0.0.1:1";
		T_EQ_INT(rl_comm_open(&c, &o, NULL), RL_EINVAL);
		T_OK(c == NULL);
	}
}

/* A master nobody serves: rank 1 gives up after the timeout. */
static int
worker_unreachable(int rank, int world)
{
	rl_comm *c;
	double t0 = rl_now();
	alarm(30);
	int rv = join(&c, 1, 2, 1.0);
	double dt = rl_now() - t0;
	return rv == RL_ETIMEDOUT && dt >= 0.9 && dt < 5 ? 0 : 1;
}

/* Rank 0 alone: the others never come. */
static int
worker_alone(int rank, int world)
{
	rl_comm *c;
	alarm(30);
	return join(&c, 0, 3, 1.0) == RL_ETIMEDOUT ? 0 : 1;
}

/* Two processes both claim rank 1. */
static int
worker_dup(int rank, int world)
{
	rl_comm *c;
	alarm(30);
	int rv = join(&c, rank == 2 ? 1 : rank, 3, 3.0);
	if (rv == 0) {
		rl_comm_close(c);
		return 2;
	}
	return 0;
}

int
main(void)
{
	int codes[8], ok;
	double secs;

	T_BEGIN("test_comm");
	rl_log_init("test_comm", getenv("T_VERBOSE") ? RL_LOG_VERBOSE : RL_LOG_QUIET);
	test_env();

	for (int world = 2; world <= 3; world++) {
		ok = run_world(world, worker_ok, codes, &secs);
		T_OK(ok == world, "world %d: exit codes %d %d %d", world, codes[0], codes[1], world > 2 ? codes[2] : 0);
	}

	for (int world = 2; world <= 3; world++) {
		ok = run_world(world, worker_reducer, codes, &secs);
		T_OK(ok == world, "reducer, world %d: exit codes %d %d %d", world, codes[0], codes[1],
		    world > 2 ? codes[2] : 0);
	}
	run_world(3, worker_reducer_fault, codes, &secs);
	T_EQ_INT(codes[0], 4);
	T_EQ_INT(codes[2], 4);
	T_OK(secs < 10, "reducer with a killed rank: %.1f s", secs);

	/* killed rank, departed rank: survivors out with RL_ECLOSED fast (timeout 30 s) */
	for (fault_mode = 1; fault_mode <= 2; fault_mode++) {
		run_world(3, worker_fault, codes, &secs);
		T_EQ_INT(codes[0], 4);
		T_EQ_INT(codes[2], 4);
		T_OK(secs < 10, "mode %d: %.1f s", fault_mode, secs);
	}
	/* hung rank: the timeout (1.5 s) ends it; rank 1 sleeps 6 s */
	fault_mode = 3;
	run_world(3, worker_fault, codes, &secs);
	T_EQ_INT(codes[0], 4);
	T_EQ_INT(codes[2], 4);

	/* rendezvous failures */
	ok = run_world(1, worker_unreachable, codes, NULL);
	T_EQ_INT(ok, 1);
	ok = run_world(1, worker_alone, codes, NULL);
	T_EQ_INT(ok, 1);
	ok = run_world(3, worker_dup, codes, NULL);
	T_EQ_INT(ok, 3);
	T_END();
}

/* test_comm_shm.c — the CPU ring's shared-memory edges between processes
 * on one host (forked before any nng use, each under an alarm):
 *  - 2 and 3 ranks with shared memory on and with RL_COMM_SHM=0: every edge
 *    reports the transport asked for (so a silent fall-back to TCP fails
 *    here), and the bulk collectives (all-reduce, reduce-scatter, ZeRO-2's
 *    range reduce-scatter, all-gather of shards, broadcast, the overlapped
 *    bucketed reducer) on values whose sums round, at small segments (many
 *    laps of the 4-slot channel) and at the default 1 MiB, give results
 *    bitwise equal to the TCP transport's, interleaved with control-plane
 *    collectives that stay on the sockets;
 *  - one rank with RL_COMM_SHM=0 in a ring of 3: only its own edges fall
 *    back, the results stay the same; RL_COMM_SHM=x is refused;
 *  - a rank killed with SIGKILL in the middle of large all-reduces, and a
 *    rank that leaves without finishing: the survivors fail with RL_ECLOSED
 *    within seconds (timeout 30 s), no hang;
 *  - ranks out of step across the transports (a bulk collective against a
 *    host one): "out of step" within seconds, not after the timeout. */
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/comm.h"
#include "base/core.h"
#include "base/io.h"
#include "t.h"
#include "t_port.h"

static char master[64];
static char outdir[160];
static size_t seg_bytes;
static int shm_off_rank = -1;   /* the rank run with RL_COMM_SHM=0 (-1: as the parent's env) */
static int all_tcp;             /* RL_COMM_SHM=0 for every rank */
static int kill_pipe[2] = { -1, -1 };

/* The transport this rank's edge to (to_next) or from its neighbour must use. */
static const char *
expected(int rank, int world, int to_next)
{
	int nb = (rank + (to_next ? 1 : world - 1)) % world;
	if (all_tcp || (shm_off_rank >= 0 && (rank == shm_off_rank || nb == shm_off_rank)))
		return "tcp";
	return "shm";
}

/* values whose f32 sums round, so that another order of additions shows */
static float
val(int r, size_t i)
{
	return 1.0f / (float)(i + 1 + (size_t)r * 3) + 1e-3f * (float)r + (float)((i * 7919) % 13) * 0.37f;
}

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
	o.seg_bytes = seg_bytes;
	if (rank == shm_off_rank)
		setenv("RL_COMM_SHM", "0", 1);
	return rl_comm_open(c, &o, NULL);
}

static int
dump(const char *tag, int rank, const void *p, size_t bytes)
{
	char path[160];
	FILE *f;
	snprintf(path, sizeof path, "%.120s/%s.%d", outdir, tag, rank);
	if (!(f = fopen(path, "wb")) || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
		return -1;
	return 0;
}

/* The collectives; every result is written to OUTDIR/TAG.RANK for the
 * parent to compare across transports. */
static int
worker(int rank, int world)
{
	rl_comm *c;
	size_t n = 300007, lo, hi;
	float *b = malloc(n * sizeof *b), *out = malloc(4 * n * sizeof *b);
	uint8_t *bc = malloc(200003);
	rl_comm_reducer *rd;
	size_t o = 0;

	alarm(60);
	if (join(&c, rank, world, 20) != 0)
		return 10;
	if (strcmp(rl_comm_transport(c, 0), expected(rank, world, 0)) ||
	    strcmp(rl_comm_transport(c, 1), expected(rank, world, 1)))
		return 11;
	for (size_t i = 0; i < n; i++)
		b[i] = val(rank, i);
	if (rl_comm_allreduce(c, b, n) != 0)
		return 12;
	memcpy(out + o, b, n * sizeof *b);
	o += n;
	/* a control-plane collective between bulk ones */
	{
		double d[2] = { rank, 1 };
		if (rl_comm_host_allreduce_f64(c, d, 2) != 0 || d[1] != world)
			return 13;
	}
	for (size_t i = 0; i < n; i++)
		b[i] = val(rank + 1, i);
	if (rl_comm_reduce_scatter(c, b, n) != 0)
		return 14;
	rl_comm_shard(c, n, rank, &lo, &hi);
	memcpy(out + o, b + lo, (hi - lo) * sizeof *b);
	o += hi - lo;
	if (rl_comm_allgather_shards(c, b, n) != 0)
		return 15;
	memcpy(out + o, b, n * sizeof *b);
	o += n;
	for (size_t i = 0; i < n; i++)
		b[i] = val(rank + 2, i);
	if (rl_comm_reduce_scatter_range(c, b, n, 1234, 250001) != 0)
		return 16;
	memcpy(out + o, b, n * sizeof *b);
	o += n;
	if (dump("collectives", rank, out, o * sizeof *b) != 0)
		return 17;
	for (int root = 0; root < world; root++) {
		for (size_t i = 0; i < 200003; i++)
			bc[i] = rank == root ? (uint8_t)(i * 31 + (size_t)root) : 0xee;
		if (rl_comm_broadcast(c, bc, 200003, root) != 0)
			return 18;
		for (size_t i = 0; i < 200003; i++)
			if (bc[i] != (uint8_t)(i * 31 + (size_t)root))
				return 19;
		/* the root goes on to a control collective at once: its message
		 * may reach a rank still reading the broadcast's last segments */
		if (rl_comm_barrier(c) != 0)
			return 20;
	}
	/* the overlapped reducer: its thread uses the channels */
	if (rl_comm_reducer_create(&rd, c, b, n, 40000, 1) != 0)
		return 21;
	for (size_t from = n; from > 0;) {
		size_t l = from > 50000 ? from - 50000 : 0;
		for (size_t i = l; i < from; i++)
			b[i] = val(rank + 3, i);
		from = l;
		if (rl_comm_reducer_ready(rd, from) != 0)
			return 22;
	}
	if (rl_comm_reducer_wait(rd) != 0)
		return 23;
	rl_comm_reducer_destroy(rd);
	if (dump("reducer", rank, b, n * sizeof *b) != 0)
		return 24;
	if (rl_comm_finish(c) != 0)
		return 25;
	rl_comm_close(c);
	free(b);
	free(out);
	free(bc);
	return 0;
}

typedef int (*worker_fn)(int rank, int world);

/* Runs world processes (rank `victim`, when >= 0, is killed with SIGKILL
 * once it writes to kill_pipe); codes[] their exit codes. */
static int
run_world(int world, worker_fn fn, int *codes, double *secs, int victim)
{
	pid_t pid[8];
	int ok = 0;
	double t0 = rl_now();

	snprintf(master, sizeof master, "127.0.0.1:%d", t_free_port());
	for (int r = 0; r < world; r++) {
		if ((pid[r] = fork()) == 0)
			_exit(fn(r, world));
	}
	if (victim >= 0) {
		char k;
		if (read(kill_pipe[0], &k, 1) == 1)
			kill(pid[victim], SIGKILL);
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

static int fault_leave; /* 0: rank 1 is killed from outside; 1: it leaves without finishing */

/* All-reduces of 16 MB until one fails; RL_ECLOSED (4) is the expected end. */
static int
worker_fault(int rank, int world)
{
	rl_comm *c;
	size_t n = 4 << 20;
	float *b = calloc(n, sizeof *b);
	int rv = 0;

	alarm(60);
	if (join(&c, rank, world, 30) != 0)
		return 10;
	if (strcmp(rl_comm_transport(c, 0), "shm") || strcmp(rl_comm_transport(c, 1), "shm"))
		return 11;
	for (int i = 0; i < 1000 && rv == 0; i++) {
		if (rank == 1 && i == 3) {
			if (fault_leave) {
				rl_comm_close(c);
				return 3;
			}
			/* the parent kills this rank at once: within this all-reduce */
			if (write(kill_pipe[1], "k", 1) != 1)
				return 12;
		}
		rv = rl_comm_allreduce(c, b, n);
	}
	rl_comm_close(c);
	free(b);
	return rv == RL_ECLOSED ? 4 : 5;
}

static int
same_files(const char *a, const char *b)
{
	FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
	int same = fa && fb, x, y;

	while (same) {
		x = getc(fa);
		y = getc(fb);
		if (x != y)
			same = 0;
		if (x == EOF || y == EOF)
			break;
	}
	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	return same;
}

/* Runs worker() once per transport setting in sub-directories shm/ and tcp/
 * (shm_off: the rank without shared memory in the first, -1: none) and
 * compares every result file. */
static void
compare_transports(int world, size_t seg, int shm_off)
{
	char base[160], path_a[240], path_b[240];
	int codes[8], ok;
	const char *tags[] = { "collectives", "reducer" };

	seg_bytes = seg;
	snprintf(base, sizeof base, "%s", outdir);
	/* shared memory (all, or all but shm_off) */
	snprintf(outdir, sizeof outdir, "%.120s/shm", base);
	rl_io_mkdir_p(outdir, 0700);
	shm_off_rank = shm_off;
	all_tcp = 0;
	unsetenv("RL_COMM_SHM");
	ok = run_world(world, worker, codes, NULL, -1);
	T_OK(ok == world, "shm, world %d, seg %zu: exit codes %d %d %d", world, seg, codes[0], codes[1],
	    world > 2 ? codes[2] : 0);
	/* TCP everywhere */
	snprintf(outdir, sizeof outdir, "%.120s/tcp", base);
	rl_io_mkdir_p(outdir, 0700);
	shm_off_rank = -1;
	all_tcp = 1;
	setenv("RL_COMM_SHM", "0", 1);
	ok = run_world(world, worker, codes, NULL, -1);
	unsetenv("RL_COMM_SHM");
	T_OK(ok == world, "tcp, world %d, seg %zu: exit codes %d %d %d", world, seg, codes[0], codes[1],
	    world > 2 ? codes[2] : 0);
	snprintf(outdir, sizeof outdir, "%s", base);
	for (int r = 0; r < world; r++)
		for (size_t t = 0; t < RL_ARRAY_LEN(tags); t++) {
			snprintf(path_a, sizeof path_a, "%s/shm/%s.%d", base, tags[t], r);
			snprintf(path_b, sizeof path_b, "%s/tcp/%s.%d", base, tags[t], r);
			T_OK(same_files(path_a, path_b), "world %d seg %zu rank %d %s: shm and tcp results differ", world,
			    seg, r, tags[t]);
			/* every rank ends with the same all-reduce */
			snprintf(path_b, sizeof path_b, "%s/shm/%s.0", base, tags[t]);
			if (t == 1)
				T_OK(same_files(path_a, path_b), "world %d rank %d: reducer differs from rank 0", world, r);
		}
}

/* Ranks out of step across the transports: a bulk collective (shared
 * memory) on one rank against a host one (socket) on the other, even of
 * the same kind (broadcast), or one more bulk collective on one rank; each
 * rank reports out of step (RL_EFORMAT: 4) or, when the other found it
 * first, the other's departure (5). */
static int cross_mode;

static int
worker_cross(int rank, int world)
{
	rl_comm *c;
	float b[1000] = { 0 };
	int rv, bulk = (rank == 0) == (cross_mode != 1);

	alarm(60);
	if (join(&c, rank, world, 30) != 0)
		return 10;
	if (strcmp(rl_comm_transport(c, 0), "shm") || strcmp(rl_comm_transport(c, 1), "shm"))
		return 11;
	if (cross_mode < 2)
		rv = bulk ? rl_comm_broadcast(c, b, sizeof b, 0) : rl_comm_host_broadcast(c, b, sizeof b, 0);
	else if (cross_mode == 2)
		rv = bulk ? rl_comm_allreduce(c, b, 1000) : rl_comm_host_allgather(c, b, b, 100);
	else if (rank == 1 && (rv = rl_comm_broadcast(c, b, sizeof b, 1)) == 0)
		rv = rl_comm_allreduce(c, b, 1000); /* one bulk collective more than rank 0: the numbers differ too */
	else
		rv = 0;
	if (rv == 0)
		rv = rl_comm_barrier(c);
	rl_comm_close(c);
	return rv == RL_EFORMAT ? 4 : rv == RL_ECLOSED ? 5 : 6;
}

/* RL_COMM_SHM neither 0 nor 1: refused before any connection. */
static int
worker_badenv(int rank, int world)
{
	rl_comm *c = NULL;
	alarm(30);
	setenv("RL_COMM_SHM", "yes", 1);
	return join(&c, 1, 2, 2) == RL_EINVAL && c == NULL ? 0 : 1;
}

int
main(void)
{
	int codes[8];
	double secs;
	char tmpl[] = "/tmp/test_comm_shm.XXXXXX";

	T_BEGIN("test_comm_shm");
	rl_log_init("test_comm_shm", getenv("T_VERBOSE") ? RL_LOG_VERBOSE : RL_LOG_QUIET);
	if (!mkdtemp(tmpl))
		T_SKIP("no temporary directory");
	unsetenv("RL_COMM_SHM");

	for (int world = 2; world <= 3; world++) {
		char d[64];
		snprintf(d, sizeof d, "%s/w%d", tmpl, world);
		snprintf(outdir, sizeof outdir, "%s", d);
		rl_io_mkdir_p(outdir, 0700);
		compare_transports(world, 4096, -1);          /* 4-slot channels lapped many times */
		snprintf(outdir, sizeof outdir, "%.60s/big", d);
		rl_io_mkdir_p(outdir, 0700);
		compare_transports(world, 0, -1);             /* the default 1 MiB segments */
	}
	snprintf(outdir, sizeof outdir, "%s/mixed", tmpl);
	rl_io_mkdir_p(outdir, 0700);
	compare_transports(3, 65536, 1);                      /* rank 1 without: its edges on TCP */

	run_world(1, worker_badenv, codes, NULL, -1);
	T_EQ_INT(codes[0], 0);

	/* killed within an all-reduce, and gone without finishing: survivors out
	 * with RL_ECLOSED far below the 30 s timeout */
	seg_bytes = 0;
	shm_off_rank = -1;
	all_tcp = 0;
	if (pipe(kill_pipe) != 0)
		T_SKIP("no pipe");
	for (fault_leave = 0; fault_leave <= 1; fault_leave++) {
		run_world(3, worker_fault, codes, &secs, fault_leave ? -1 : 1);
		T_EQ_INT(codes[0], 4);
		T_EQ_INT(codes[1], fault_leave ? 3 : 128 + SIGKILL);
		T_EQ_INT(codes[2], 4);
		T_OK(secs < 10, "rank 1 %s: %.1f s", fault_leave ? "left" : "killed", secs);
	}
	/* out of step across transports: found at once, not after the 30 s timeout */
	for (cross_mode = 0; cross_mode <= 3; cross_mode++) {
		run_world(2, worker_cross, codes, &secs, -1);
		T_OK((codes[0] == 4 || codes[1] == 4) && codes[0] >= 4 && codes[0] <= 5 && codes[1] >= 4 &&
		    codes[1] <= 5, "cross mode %d: exit codes %d %d", cross_mode, codes[0], codes[1]);
		T_OK(secs < 10, "cross mode %d: %.1f s", cross_mode, secs);
	}
	rl_io_remove_tree(tmpl);
	T_END();
}

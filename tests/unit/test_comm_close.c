/* test_comm_close.c — rl_comm_close when the ring sockets' closes are left
 * hanging (rli_nng_close_timed gives up on a close that takes over its
 * wait, nng #1543): nng may still run the pipe callbacks afterwards, from its
 * reaper thread, and they must not touch freed memory.
 * RL_NNG_TEST_CLOSE_WAIT_MS=0 makes every close that has not finished at
 * once count as left; each rank then stays alive long enough for the late
 * callbacks to run.  Two ranks on 127.0.0.1 (forked before any nng use):
 *  - an orderly run: all-reduce, rl_comm_finish, rl_comm_close;
 *  - rank 1 leaves without rl_comm_finish: rank 0 fails with RL_ECLOSED,
 *    then closes.
 * In a plain build a late callback into freed memory goes unnoticed; the
 * test is for a memory checker: tests/cli/comm-memcheck.bats runs it under
 * valgrind, and a SANITIZE=address build (build-san) catches it too. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/core.h"
#include "compute/comm.h"
#include "t.h"
#include "t_port.h"

static char master[64];

static int
join(rl_comm **c, int rank, int world)
{
	rl_comm_opts o;

	rl_comm_opts_default(&o);
	o.rank = rank;
	o.world = world;
	o.master = master;
	o.backend = "cpu";
	o.timeout = 60;
	return rl_comm_open(c, &o, NULL);
}

/* mode 0: orderly; 1: rank 1 leaves without finishing.  Exit codes: 0 as
 * expected, else which step failed. */
static int
worker(int rank, int world, int mode)
{
	rl_comm *c;
	float v[3] = { 1.0f + (float)rank, 2.0f, 3.0f };
	int rv;

	alarm(120);
	if (join(&c, rank, world) != 0)
		return 10;
	if (rl_comm_allreduce(c, v, 3) != 0 || v[0] != 3.0f || v[1] != 4.0f || v[2] != 6.0f)
		return 11;
	if (mode == 1 && rank == 1) {
		rl_comm_close(c);
		usleep(1500000);
		return 0;
	}
	if (mode == 1) {
		/* rank 1 is gone: the next collective fails */
		rv = rl_comm_barrier(c);
		rl_comm_close(c);
		usleep(1500000);
		return rv == RL_ECLOSED ? 0 : 12;
	}
	if (rl_comm_finish(c) != 0)
		return 13;
	rl_comm_close(c);
	/* the closes run on: give their pipe callbacks time to fire */
	usleep(1500000);
	return 0;
}

static void
run(int mode)
{
	pid_t pid[2];

	snprintf(master, sizeof master, "127.0.0.1:%d", t_free_port());
	for (int r = 0; r < 2; r++)
		if ((pid[r] = fork()) == 0)
			_exit(worker(r, 2, mode));
	for (int r = 0; r < 2; r++) {
		int st = 0;
		waitpid(pid[r], &st, 0);
		T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "mode %d rank %d: status %d", mode, r,
		    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	}
}

int
main(void)
{
	T_BEGIN("test_comm_close");
	/* verbose: each left close says so ("closing the ring socket hangs"),
	 * which comm-memcheck.bats looks for to know the path ran */
	rl_log_init("test_comm_close", 2);
	setenv("RL_NNG_TEST_CLOSE_WAIT_MS", "0", 1);
	run(0);
	run(1);
	T_END();
}

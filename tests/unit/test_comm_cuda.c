/* test_comm_cuda.c — the communicator on device buffers (make gpucheck):
 *  - one GPU: 2 processes on cuda:0 with the cpu backend (device buffers
 *    staged through the host): all-reduce and broadcast results exact;
 *  - NCCL builds: one process with a one-rank NCCL communicator (backend
 *    "nccl" by name): all-reduce, broadcast, reduce-scatter and all-gather of
 *    shards run through NCCL and leave the buffer as it was;
 *  - two GPUs or more, NCCL builds: 2 processes on cuda:0 and cuda:1 with the
 *    nccl backend: the same checks (skipped, and said so, with one GPU).
 * Processes are forked before any CUDA use (a CUDA context does not survive
 * fork).  Skips (77) without a CUDA device.
 * Ran on an H100 (one GPU): the cpu-backend pair and the one-rank NCCL case. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/comm.h"
#include "base/core.h"
#include "compute/ops.h"
#include "t.h"
#include "t_port.h"

static float
val(int r, size_t i)
{
	return (float)((int)((i * 7 + (size_t)r * 13) % 101) - 50) * 0.25f;
}

/* exit 0 when device DEV opens, 77 when not */
static int
probe(const char *dev)
{
	pid_t p = fork();
	int st;
	if (p == 0) {
		rl_ops *o;
		_exit(rl_ops_open(&o, dev) == 0 ? 0 : 77);
	}
	waitpid(p, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int
worker(int rank, const char *dev, const char *backend, const char *master)
{
	rl_ops *ops;
	rl_comm *c;
	rl_comm_opts o;
	size_t n = 1000003;
	float *h, *d = NULL;
	int bad = 0;

	alarm(120);
	if (rl_ops_open(&ops, dev) != 0)
		return 10;
	rl_comm_opts_default(&o);
	o.rank = rank;
	o.world = 2;
	o.master = master;
	o.backend = backend;
	o.timeout = 60;
	if (rl_comm_open(&c, &o, ops) != 0)
		return 11;
	if (strcmp(rl_comm_backend(c), backend) != 0)
		bad |= 1;
	h = malloc(n * sizeof *h);
	if (ops->alloc(ops, (void **)&d, n * sizeof *h) != 0)
		return 12;
	for (size_t i = 0; i < n; i++)
		h[i] = val(rank, i);
	ops->upload(ops, d, h, n * sizeof *h);
	if (rl_comm_allreduce(c, d, n) != 0)
		return 13;
	ops->download(ops, h, d, n * sizeof *h);
	for (size_t i = 0; i < n; i++)
		if (h[i] != val(0, i) + val(1, i))
			bad |= 2;
	for (size_t i = 0; i < n; i++)
		h[i] = rank == 1 ? (float)i : -1.0f;
	ops->upload(ops, d, h, n * sizeof *h);
	if (rl_comm_broadcast(c, d, n * sizeof *h, 1) != 0)
		return 14;
	ops->download(ops, h, d, n * sizeof *h);
	for (size_t i = 0; i < n; i++)
		if (h[i] != (float)i)
			bad |= 4;
	if (ops->status(ops) != 0)
		bad |= 8;
	if (rl_comm_finish(c) != 0)
		return 15;
	rl_comm_close(c);
	ops->free(ops, d);
	rl_ops_close(ops);
	free(h);
	return bad ? 20 + bad : 0;
}

/* one rank, NCCL by name: the collectives go through NCCL and, with one
 * rank, must give back the input exactly */
static int
single_nccl(void)
{
	rl_ops *ops;
	rl_comm *c;
	rl_comm_opts o;
	size_t n = 1000003;
	float *h, *d = NULL;
	int bad = 0;

	alarm(120);
	if (rl_ops_open(&ops, "cuda:0") != 0)
		return 10;
	rl_comm_opts_default(&o);
	o.rank = 0;
	o.world = 1;
	o.backend = "nccl";
	o.timeout = 60;
	if (rl_comm_open(&c, &o, ops) != 0)
		return 11;
	if (strcmp(rl_comm_backend(c), "nccl") != 0)
		bad |= 1;
	h = malloc(n * sizeof *h);
	if (ops->alloc(ops, (void **)&d, n * sizeof *h) != 0)
		return 12;
	for (size_t i = 0; i < n; i++)
		h[i] = val(0, i);
	ops->upload(ops, d, h, n * sizeof *h);
	if (rl_comm_allreduce(c, d, n) != 0 || rl_comm_broadcast(c, d, n * sizeof *h, 0) != 0 ||
	    rl_comm_reduce_scatter(c, d, n) != 0 || rl_comm_allgather_shards(c, d, n) != 0)
		return 13;
	memset(h, 0, n * sizeof *h);
	ops->download(ops, h, d, n * sizeof *h);
	for (size_t i = 0; i < n; i++)
		if (h[i] != val(0, i))
			bad |= 2;
	if (ops->status(ops) != 0)
		bad |= 8;
	if (rl_comm_finish(c) != 0)
		return 15;
	rl_comm_close(c);
	ops->free(ops, d);
	rl_ops_close(ops);
	free(h);
	return bad ? 20 + bad : 0;
}

static int
run_single_nccl(void)
{
	pid_t p = fork();
	int st;
	if (p == 0)
		_exit(single_nccl());
	waitpid(p, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "one-rank nccl: exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		return 0;
	}
	return 1;
}

static int
pair(const char *dev0, const char *dev1, const char *backend)
{
	char master[64];
	pid_t p[2];
	int ok = 1;

	snprintf(master, sizeof master, "127.0.0.1:%d", t_free_port());
	for (int r = 0; r < 2; r++)
		if ((p[r] = fork()) == 0)
			_exit(worker(r, r ? dev1 : dev0, backend, master));
	for (int r = 0; r < 2; r++) {
		int st;
		waitpid(p[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "%s backend, rank %d on %s: exit %d\n", backend, r, r ? dev1 : dev0,
			    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			ok = 0;
		}
	}
	return ok;
}

int
main(void)
{
	T_BEGIN("test_comm_cuda");
	rl_log_init("test_comm_cuda", RL_LOG_NORMAL);
	if (probe("cuda:0") != 0)
		T_SKIP("no CUDA device");
	T_OK(pair("cuda:0", "cuda:0", "cpu"), "cpu backend, staged through the host");
	if (HAVE_NCCL)
		T_OK(run_single_nccl(), "one-rank nccl communicator");
	if (!HAVE_NCCL)
		printf("test_comm_cuda: no NCCL in this build: nccl backend not tested\n");
	else if (probe("cuda:1") != 0)
		printf("test_comm_cuda: one GPU: two-rank nccl not tested (NCCL needs one GPU per rank)\n");
	else
		T_OK(pair("cuda:0", "cuda:1", "nccl"), "nccl backend");
	T_END();
}

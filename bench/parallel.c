/*
 * bench/parallel — the CPU communicator's all-reduce (the ring on
 * 127.0.0.1: shared memory between these same-host ranks, TCP with
 * RL_COMM_SHM=0): W processes on this machine, sum all-reduce of f32 buffers
 * of growing size.  One JSON line per (world, bytes):
 *   {"bench":"allreduce","backend":"cpu","transport":"shm"|"tcp","world":W,"bytes":B,"reps":R,
 *    "seconds":per-call,"algbw_GBps":B/t,"busbw_GBps":B/t*2(W-1)/W}
 * (busbw as nccl-tests defines it: the per-link traffic of a ring).
 * Also the broadcast of the largest size.
 *
 * usage: parallel [--worlds 2,3] [--max-mb 64] [--seg-kb 1024] [--secs 0.3]
 * Leaves out: NCCL (needs GPUs; see docs/parallel.md for expected figures).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compute/comm.h"
#include "base/core.h"

static int
free_port(void)
{
	unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)(rl_now() * 1e6);
	for (;;) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0), port, ok;
		seed = seed * 1103515245u + 12345u;
		port = 20000 + (int)((seed >> 8) % 10000);
		a.sin_port = htons((uint16_t)port);
		ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok)
			return port;
	}
}

static int
worker(int rank, int world, const char *master, size_t max_bytes, size_t seg, double secs)
{
	rl_comm_opts o;
	rl_comm *c;
	float *buf;
	size_t n = max_bytes / sizeof(float);

	rl_comm_opts_default(&o);
	o.rank = rank;
	o.world = world;
	o.master = master;
	o.backend = "cpu";
	o.timeout = 60;
	o.seg_bytes = seg;
	if (rl_comm_open(&c, &o, NULL) != 0)
		return 1;
	if (!(buf = malloc(n * sizeof *buf)))
		return 1;
	for (size_t i = 0; i < n; i++)
		buf[i] = (float)(i % 13) * 0.5f;
	for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
		int reps = 0;
		double t0, dt, flag;
		rl_comm_allreduce(c, buf, bytes / sizeof(float)); /* warm-up */
		rl_comm_barrier(c);
		t0 = rl_now();
		/* rank 0 decides when to stop, so every rank makes the same calls */
		for (;;) {
			if (rl_comm_allreduce(c, buf, bytes / sizeof(float)) != 0)
				return 1;
			reps++;
			flag = rank == 0 && rl_now() - t0 < secs && reps < 100000 ? 1 : 0;
			if (rl_comm_host_allreduce_f64(c, &flag, 1) != 0)
				return 1;
			if (flag == 0)
				break;
		}
		dt = (rl_now() - t0) / reps;
		if (rank == 0)
			printf("{\"bench\":\"allreduce\",\"backend\":\"cpu\",\"transport\":\"%s\",\"world\":%d,\"bytes\":%zu,\"reps\":%d,"
			    "\"seconds\":%.6g,\"algbw_GBps\":%.4g,\"busbw_GBps\":%.4g,\"seg_bytes\":%zu}\n",
			    rl_comm_transport(c, 1), world, bytes, reps, dt, bytes / dt / 1e9, bytes / dt / 1e9 * 2 * (world - 1) / world, seg);
		fflush(stdout);
	}
	{
		double t0 = rl_now();
		int reps = 3;
		for (int i = 0; i < reps; i++)
			if (rl_comm_broadcast(c, buf, max_bytes, 0) != 0)
				return 1;
		rl_comm_barrier(c);
		double dt = (rl_now() - t0) / reps;
		if (rank == 0)
			printf("{\"bench\":\"broadcast\",\"backend\":\"cpu\",\"transport\":\"%s\",\"world\":%d,\"bytes\":%zu,\"reps\":%d,"
			    "\"seconds\":%.6g,\"algbw_GBps\":%.4g}\n", rl_comm_transport(c, 1), world, max_bytes, reps, dt, max_bytes / dt / 1e9);
		fflush(stdout);
	}
	if (rl_comm_finish(c) != 0)
		return 1;
	rl_comm_close(c);
	free(buf);
	return 0;
}

int
main(int argc, char **argv)
{
	const char *worlds = "2,3";
	size_t max_mb = 64, seg_kb = 1024;
	double secs = 0.3;
	int bad = 0;

	rl_log_init("parallel", RL_LOG_NORMAL);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--worlds") == 0 && i + 1 < argc)
			worlds = argv[++i];
		else if (strcmp(argv[i], "--max-mb") == 0 && i + 1 < argc)
			max_mb = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--seg-kb") == 0 && i + 1 < argc)
			seg_kb = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--secs") == 0 && i + 1 < argc)
			secs = atof(argv[++i]);
		else {
			fprintf(stderr, "usage: parallel [--worlds 2,3] [--max-mb 64] [--seg-kb 1024] [--secs 0.3]\n");
			return 2;
		}
	}
	for (const char *p = worlds; *p;) {
		int world = atoi(p), st;
		char master[64];
		pid_t pid[64];
		if (world < 2 || world > 64) {
			fprintf(stderr, "parallel: world sizes are 2 .. 64\n");
			return 2;
		}
		snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
		fflush(stdout);
		for (int r = 0; r < world; r++)
			if ((pid[r] = fork()) == 0)
				_exit(worker(r, world, master, max_mb << 20, seg_kb << 10, secs));
		for (int r = 0; r < world; r++) {
			waitpid(pid[r], &st, 0);
			bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
		}
		while (*p && *p != ',')
			p++;
		if (*p == ',')
			p++;
	}
	return bad;
}

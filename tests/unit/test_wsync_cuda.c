/*
 * test_wsync_cuda.c — CUDA IPC weight copy (lib/sync/wcuda.c) between two
 * processes on one GPU: the parent exports a device buffer of awkward size
 * (64 MiB + 123 bytes), the child opens the handle, copies device to device
 * into its own buffer and compares it (brought to the host only for the
 * check) bit for bit with the pattern; a wrong size, a bad magic and a
 * handle for a GPU that is not there are refused.  Both processes start
 * CUDA only after the fork.  Skips (77) without CUDA or without a GPU.
 */
#include "base/core.h"
#include "t.h"
#include "sync/wcuda.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if HAVE_CUDA
#include <cuda_runtime.h>

#define N (((size_t)64 << 20) + 123)

static void
pattern(uint8_t *p, size_t n)
{
	uint64_t s = 0x9e3779b97f4a7c15ULL;

	for (size_t i = 0; i < n; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		p[i] = (uint8_t)(s >> 32);
	}
}

static int
read_all(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(fd, (char *)p + got, n - got);
		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

/* the importer: exit 0 on success, 77 skipped, 1 failed */
static int
child(int rfd)
{
	rl_wcuda_handle h, bad;
	char tag;
	uint8_t *want = malloc(N), *got = malloc(N);
	void *d = NULL;

	if (read_all(rfd, &tag, 1) != 0 || tag == 'S')
		return 77;
	if (read_all(rfd, &h, sizeof h) != 0 || want == NULL || got == NULL)
		return 1;
	pattern(want, N);
	T_OK(cudaMalloc(&d, N) == cudaSuccess);
	T_OK(cudaMemset(d, 0, N) == cudaSuccess);
	T_EQ_INT(h.version, 42);
	bad = h;
	bad.magic ^= 1;
	T_EQ_INT(rl_wcuda_import_copy(d, N, &bad, -1), RL_EFORMAT);
	T_EQ_INT(rl_wcuda_import_copy(d, N - 1, &h, -1), RL_ESHAPE);
	bad = h;
	bad.uuid[0] ^= 0xff;
	T_EQ_INT(rl_wcuda_import_copy(d, N, &bad, -1), RL_ENODEV);
	T_EQ_INT(rl_wcuda_import_copy(d, N, &h, -1), RL_OK);
	T_OK(cudaMemcpy(got, d, N, cudaMemcpyDeviceToHost) == cudaSuccess);
	T_OK(memcmp(got, want, N) == 0, "the copied bytes differ");
	cudaFree(d);
	free(want);
	free(got);
	printf("test_wsync_cuda (importer): %s (%d checks, %d failed)\n", t_fail ? "FAIL" : "ok", t_pass + t_fail,
	       t_fail);
	fflush(stdout);
	return t_fail ? 1 : 0;
}

int
main(void)
{
	int pfd[2], st = 0, n = 0;
	pid_t pid;
	rl_wcuda_handle h;
	rl_wcuda_src *src = NULL;
	uint8_t *host;
	void *d = NULL;

	T_BEGIN("test_wsync_cuda");
	rl_log_init("test_wsync_cuda", RL_LOG_QUIET);
	if (pipe(pfd) != 0)
		T_SKIP("no pipe");
	fflush(stdout);
	if ((pid = fork()) < 0)
		T_SKIP("no fork");
	if (pid == 0) {
		close(pfd[1]);
		_exit(child(pfd[0]));
	}
	close(pfd[0]);
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		(void)!write(pfd[1], "S", 1);
		waitpid(pid, &st, 0);
		T_SKIP("no GPU");
	}
	host = malloc(N);
	pattern(host, N);
	T_OK(cudaSetDevice(0) == cudaSuccess);
	T_OK(cudaMalloc(&d, N) == cudaSuccess);
	T_OK(cudaMemcpy(d, host, N, cudaMemcpyHostToDevice) == cudaSuccess);
	T_EQ_INT(rl_wcuda_export(&src, &h, NULL, N, 42, 0), RL_EINVAL);
	T_EQ_INT(rl_wcuda_export(&src, &h, d, N, 42, 0), RL_OK);
	(void)!write(pfd[1], "H", 1);
	(void)!write(pfd[1], &h, sizeof h);
	close(pfd[1]);
	/* d and the event stay alive until the importer is done */
	T_OK(waitpid(pid, &st, 0) == pid);
	T_OK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "importer status %d", st);
	rl_wcuda_src_close(src);
	cudaFree(d);
	free(host);
	T_END();
}

#else

int
main(void)
{
	T_BEGIN("test_wsync_cuda");
	(void)t_fail, (void)t_pass;
	T_SKIP("built without CUDA (HAVE_CUDA=0)");
}

#endif

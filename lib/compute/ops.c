/*
 * ops.c — backend selection: rl_ops_open parses "cpu", "cuda", "cuda:N" and
 * "auto" and opens the matching table; rl_ops_close closes any.
 *
 * Leaves out: the backends themselves (ops_cpu.c, ops_cuda.c).
 */
#include <stdlib.h>
#include <string.h>

#include "compute/ops.h"

/*
 * Builds without CUDA (and CUDA builds of a tree that does not have
 * lib/compute/ops_cuda.c yet) get a rl_ops_cuda_open that says "not supported".  The
 * file test matters: a weak stub here would satisfy the linker before it ever
 * pulled ops_cuda.o out of librlpipe.a, silently hiding the real backend.
 */
#if !HAVE_CUDA || !__has_include("ops_cuda.c")
int
rl_ops_cuda_open(rl_ops **out, int device)
{
	*out = NULL;
	return RL_ENOTSUP;
}
#endif

int
rl_ops_device_ok(const char *d)
{
	size_t n;

	if (strcmp(d, "cpu") == 0 || strcmp(d, "auto") == 0 || strcmp(d, "cuda") == 0)
		return 1;
	if (strncmp(d, "cuda:", 5) != 0 || (n = strspn(d + 5, "0123456789")) == 0 || d[5 + n] != '\0')
		return 0;
	return n <= 4 && atoi(d + 5) <= 1024;
}

int
rl_ops_open(rl_ops **out, const char *device)
{
	int rv;
	*out = NULL;
	if (device == NULL || strcmp(device, "cpu") == 0)
		return rl_ops_cpu_open(out);
	if (strcmp(device, "auto") == 0 || strncmp(device, "auto:", 5) == 0) {
		/* "auto:N" is how a data-parallel rank asks for its own GPU */
		int n = device[4] == ':' ? atoi(device + 5) : 0;
		rv = rl_ops_cuda_open(out, n);
		/* the one line a GPU user needs to see that the run is on the CPU */
		if (rv == RL_ENOTSUP && !HAVE_CUDA) {
			rl_info("--device auto: this build has no CUDA support, using the cpu");
			return rl_ops_cpu_open(out);
		}
		if (rv == RL_ENODEV || rv == RL_ENOTSUP) {
			rl_info("--device auto: no usable CUDA device (%s), using the cpu", rl_strerror(rv));
			return rl_ops_cpu_open(out);
		}
		return rv;
	}
	if (strncmp(device, "cuda", 4) == 0 && (device[4] == '\0' || device[4] == ':')) {
		long n = 0;
		if (device[4] == ':') {
			if (!rl_ops_device_ok(device)) {
				rl_error("invalid device '%s'", device);
				rl_hint("use cpu, cuda, cuda:N (N a device number) or auto");
				return RL_EINVAL;
			}
			n = atoi(device + 5);
		}
		rv = rl_ops_cuda_open(out, (int)n);
		if (rv == RL_ENOTSUP) {
			rl_error("device '%s': this build has no CUDA support", device);
			rl_hint("rebuild with nvcc on PATH (see make features), or use --device cpu");
		} else if (rv == RL_ENODEV) {
			rl_error("device '%s': no such CUDA device on this machine", device);
			rl_hint("--device auto uses the CPU when there is no GPU");
		} else if (rv != RL_OK) {
			rl_error("device '%s': cannot open the CUDA backend: %s", device, rl_strerror(rv));
		}
		return rv;
	}
	rl_error("unknown device '%s'", device);
	rl_hint("use cpu, cuda, cuda:N or auto");
	return RL_EINVAL;
}

void
rl_ops_close(rl_ops *o)
{
	if (o != NULL && o->close != NULL)
		o->close(o);
}

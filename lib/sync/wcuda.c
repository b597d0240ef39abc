/*
 * wcuda.c — CUDA IPC export/import of a weight buffer (see wcuda.h).
 * Compiled in every build; the CUDA part only with HAVE_CUDA.
 */
#include "sync/wcuda.h"
#include "base/core.h"
#include <stdlib.h>
#include <string.h>

#if HAVE_CUDA
#include <cuda_runtime.h>

struct rl_wcuda_src {
	cudaEvent_t ev;
	int device;
};

static int
cu_fail(cudaError_t e, const char *what)
{
	rl_error("cuda ipc: %s: %s", what, cudaGetErrorString(e));
	return RL_EDEVICE;
}

int
rl_wcuda_export(rl_wcuda_src **out, rl_wcuda_handle *h, const void *d_buf, uint64_t size, uint64_t version,
		int device)
{
	rl_wcuda_src *s;
	struct cudaDeviceProp p;
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t eh;
	cudaError_t e;

	*out = NULL;
	if (d_buf == NULL || size == 0)
		return RL_EINVAL;
	if ((s = rl_try_calloc(1, sizeof *s, "cuda ipc source")) == NULL)
		return RL_ENOMEM;
	s->device = device;
	if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, device)) != cudaSuccess) {
		free(s);
		return cu_fail(e, "device");
	}
	if ((e = cudaIpcGetMemHandle(&mh, (void *)d_buf)) != cudaSuccess) {
		free(s);
		return cu_fail(e, "cudaIpcGetMemHandle");
	}
	if ((e = cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming | cudaEventInterprocess)) != cudaSuccess) {
		free(s);
		return cu_fail(e, "cudaEventCreate");
	}
	if ((e = cudaEventRecord(s->ev, 0)) != cudaSuccess || (e = cudaIpcGetEventHandle(&eh, s->ev)) != cudaSuccess) {
		cudaEventDestroy(s->ev);
		free(s);
		return cu_fail(e, "interprocess event");
	}
	memset(h, 0, sizeof *h);
	h->magic = RL_WCUDA_MAGIC;
	h->format = 1;
	h->version = version;
	h->size = size;
	memcpy(h->uuid, &p.uuid, sizeof h->uuid);
	memcpy(h->mem, &mh, sizeof h->mem < sizeof mh ? sizeof h->mem : sizeof mh);
	memcpy(h->event, &eh, sizeof h->event < sizeof eh ? sizeof h->event : sizeof eh);
	*out = s;
	return RL_OK;
}

void
rl_wcuda_src_close(rl_wcuda_src *s)
{
	if (s == NULL)
		return;
	cudaSetDevice(s->device);
	cudaEventDestroy(s->ev);
	free(s);
}

/* the ordinal of the visible GPU with this UUID, or -1 */
static int
find_uuid(const uint8_t *uuid)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return -1;
	for (int d = 0; d < n; d++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, d) == cudaSuccess && memcmp(&p.uuid, uuid, 16) == 0)
			return d;
	}
	return -1;
}

int
rl_wcuda_import_copy(void *d_dst, uint64_t size, const rl_wcuda_handle *h, int device)
{
	cudaIpcMemHandle_t mh;
	cudaIpcEventHandle_t eh;
	cudaEvent_t ev = NULL;
	cudaStream_t st = NULL;
	void *src = NULL;
	cudaError_t e;
	int rv = RL_OK, dev;

	if (h->magic != RL_WCUDA_MAGIC || h->format != 1 || h->reserved[0] || h->reserved[1]) {
		rl_error("cuda ipc: not a weights handle (magic or format)");
		return RL_EFORMAT;
	}
	if (h->size != size) {
		rl_error("cuda ipc: version %llu has %llu bytes, the buffer %llu", (unsigned long long)h->version,
			 (unsigned long long)h->size, (unsigned long long)size);
		return RL_ESHAPE;
	}
	if ((dev = find_uuid(h->uuid)) < 0 || (device >= 0 && device != dev)) {
		rl_error("cuda ipc: version %llu lives on a GPU this process does not see as device %d",
			 (unsigned long long)h->version, device);
		return RL_ENODEV;
	}
	memset(&mh, 0, sizeof mh);
	memset(&eh, 0, sizeof eh);
	memcpy(&mh, h->mem, sizeof mh < sizeof h->mem ? sizeof mh : sizeof h->mem);
	memcpy(&eh, h->event, sizeof eh < sizeof h->event ? sizeof eh : sizeof h->event);
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cu_fail(e, "cudaSetDevice");
	if ((e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess)
		return cu_fail(e, "cudaStreamCreate");
	if ((e = cudaIpcOpenEventHandle(&ev, eh)) != cudaSuccess) {
		rv = cu_fail(e, "cudaIpcOpenEventHandle");
		goto out;
	}
	if ((e = cudaIpcOpenMemHandle(&src, mh, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
		src = NULL;
		rv = cu_fail(e, "cudaIpcOpenMemHandle");
		goto out;
	}
	/* the exporter's writes are complete before our copy reads */
	if ((e = cudaStreamWaitEvent(st, ev, 0)) != cudaSuccess ||
	    (e = cudaMemcpyAsync(d_dst, src, (size_t)size, cudaMemcpyDeviceToDevice, st)) != cudaSuccess ||
	    (e = cudaStreamSynchronize(st)) != cudaSuccess)
		rv = cu_fail(e, "device-to-device copy");
out:
	if (src)
		cudaIpcCloseMemHandle(src);
	if (ev)
		cudaEventDestroy(ev);
	cudaStreamDestroy(st);
	return rv;
}

#else /* !HAVE_CUDA */

int
rl_wcuda_export(rl_wcuda_src **out, rl_wcuda_handle *h, const void *d_buf, uint64_t size, uint64_t version,
		int device)
{
	(void)h, (void)d_buf, (void)size, (void)version, (void)device;
	*out = NULL;
	return RL_ENOTSUP;
}

void rl_wcuda_src_close(rl_wcuda_src *s) { (void)s; }

int
rl_wcuda_import_copy(void *d_dst, uint64_t size, const rl_wcuda_handle *h, int device)
{
	(void)d_dst, (void)size, (void)h, (void)device;
	return RL_ENOTSUP;
}

#endif

/*
 * wcuda.h — weights between processes on one node through CUDA IPC: the
 * trainer exports a device buffer (cudaIpcGetMemHandle plus an interprocess
 * event recorded after its last write), a rollout worker on the same GPU or
 * node opens it and copies device to device into its own buffer — no copy
 * through the host.  The handle is plain bytes, to be carried by any
 * control channel (the rl-sync socket, a pipe).
 *
 * Leaves out: a device-side checksum (the bytes are not hashed on this path;
 * the handle's size and GPU UUID are checked), the wiring into rl_wsync /
 * rl-sync (the transport vtable in wsync.h is the seam), NCCL broadcast.
 * Without CUDA (HAVE_CUDA=0) every call returns RL_ENOTSUP.
 * Tested by tests/unit/test_wsync_cuda.c (two processes, one GPU; ran on an
 * H100, CUDA 13.0, 2026-11-22).
 */
#ifndef RL_WCUDA_H
#define RL_WCUDA_H

#include <stddef.h>
#include <stdint.h>

#define RL_WCUDA_MAGIC 0x43574c52u /* "RLWC" */

/* What the importer needs; 184 bytes, no pointers, fixed layout. */
typedef struct rl_wcuda_handle {
	uint32_t magic;        /* RL_WCUDA_MAGIC */
	uint32_t format;       /* 1 */
	uint64_t version;      /* the weights version it carries */
	uint64_t size;         /* bytes of the buffer */
	uint8_t uuid[16];      /* the GPU it lives on (cudaDeviceProp.uuid) */
	uint8_t mem[64];       /* cudaIpcMemHandle_t */
	uint8_t event[64];     /* cudaIpcEventHandle_t, recorded after the last write */
	uint64_t reserved[2];  /* 0 */
} rl_wcuda_handle;

typedef struct rl_wcuda_src rl_wcuda_src;

/* rl_wcuda_export: publish d_buf (size bytes of device memory on `device`,
 * allocated with cudaMalloc, owned by the caller) as `version`.  An event is
 * recorded on the legacy default stream, so work queued there before the
 * call is complete before any importer's copy starts.  *src (the event) must
 * live, and d_buf stay unchanged, until every importer has finished copying;
 * rl_wcuda_src_close frees it (NULL ok). */
int rl_wcuda_export(rl_wcuda_src **src, rl_wcuda_handle *h, const void *d_buf, uint64_t size, uint64_t version,
		    int device);
void rl_wcuda_src_close(rl_wcuda_src *src);

/* rl_wcuda_import_copy: in another process, copy the exported buffer into
 * d_dst (size bytes on the GPU whose UUID is in h; device -1 finds it)
 * device to device, and wait for the copy.  RL_EFORMAT for a malformed
 * handle, RL_ENODEV if no visible GPU has that UUID, RL_EDEVICE for a CUDA
 * failure (logged), RL_ENOTSUP without CUDA.  Thread-safe. */
int rl_wcuda_import_copy(void *d_dst, uint64_t size, const rl_wcuda_handle *h, int device);

#endif

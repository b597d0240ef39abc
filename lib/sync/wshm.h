/*
 * wshm.h — the same-host weight transport of rl-sync: a version's bytes are
 * placed once in a sealed memfd, whose file descriptor is handed to workers
 * over an abstract Unix socket (SCM_RIGHTS); a worker maps it read-only.
 * Nothing moves through a socket but a 32-byte reply and the descriptor.
 * The trainer's push to a server on its host goes the other way: it makes
 * the sealed memfd and hands it to the server (rl_wshm_send).
 *
 * Why memfd + SCM_RIGHTS and not shm_open: the kernel counts references to a
 * memfd (the server's descriptor, each worker's descriptor or mapping), so an
 * object disappears when its last user does, whatever way the processes die —
 * nothing is ever left in /dev/shm.  Seals (write, grow, shrink, seal) make
 * a published object immutable, and a worker checks the seals before it maps,
 * so a version it holds cannot change under it.  The abstract socket name
 * also vanishes with the server.  Linux only.
 *
 * Leaves out: the descriptor cannot cross network namespaces (containers on
 * one host without a shared netns fall back to the stream), and device
 * memory (CUDA IPC: wcuda.h).
 */
#ifndef RL_WSHM_H
#define RL_WSHM_H

#include "sync/wver.h"
#include <stddef.h>
#include <stdint.h>

#define RL_WSHM_ALIGN 4096 /* each blob starts on a page in the object */

/* rl_wshm_hostid writes a 16-hex-digit id of this host and boot (a hash of
 * /etc/machine-id and /proc/sys/kernel/random/boot_id) to out (n >= 17).
 * Two processes see the same id only on the same running kernel.  RL_EIO if
 * neither file can be read. */
int rl_wshm_hostid(char *out, size_t n);

/* rl_wshm_size: bytes of the object holding v (blobs page-aligned, in order). */
uint64_t rl_wshm_size(const rl_wver *v);

/* rl_wshm_make copies v's blobs into a new sealed memfd (*fd, close-on-exec,
 * owned by the caller).  repoint=1: v's blobs are then read from a read-only
 * shared mapping of it and v's own copies are freed (v->map holds the
 * mapping; rl_wver_destroy unmaps), so the bytes exist once.  corrupt=1 (a
 * test hook) flips one byte of the object after copying (v is not
 * repointed).  v must be hashed. */
int rl_wshm_make(int *fd, rl_wver *v, int repoint, int corrupt);

/* rl_wshm_map maps fd (from rl_wshm_recv) read-only and points v's blobs
 * (a manifest: names, sizes, hashes; data NULL) into it; v->map owns the
 * mapping.  Refuses (RL_EFORMAT) an object that is not sealed against writes
 * or whose size is not rl_wshm_size(v).  Does not verify the bytes. */
int rl_wshm_map(rl_wver *v, int fd);

/* ---- serving descriptors over an abstract Unix socket ------------------------- */
typedef struct rl_wshm_srv rl_wshm_srv;
/* lookup: a dup'd descriptor of `version` (0: latest) and its number and
 * size, or an rl_err (RL_ENOENT: not held).  Called from the service thread. */
typedef int (*rl_wshm_lookup)(void *arg, uint64_t version, int *fd, uint64_t *got, uint64_t *size);
int rl_wshm_srv_open(rl_wshm_srv **out, rl_wshm_lookup lookup, void *arg);
/* take: a client hands over its sealed object of `version` (a trainer's
 * push, rl_wshm_send).  fd is borrowed (closed after take returns: map or
 * dup it to keep it); *size the object's size for the reply.  The status
 * goes back to the client.  Called from the service thread, so GETs wait
 * while it runs.  NULL (rl_wshm_srv_open): pushes are refused, RL_ENOTSUP. */
typedef int (*rl_wshm_take)(void *arg, uint64_t version, int fd, uint64_t *size);
int rl_wshm_srv_open2(rl_wshm_srv **out, rl_wshm_lookup lookup, rl_wshm_take take, void *arg);
void rl_wshm_srv_close(rl_wshm_srv *s);
/* the socket's name without the leading NUL */
const char *rl_wshm_srv_name(const rl_wshm_srv *s);
uint64_t rl_wshm_srv_served(const rl_wshm_srv *s);
/* objects taken (pushes accepted) */
uint64_t rl_wshm_srv_taken(const rl_wshm_srv *s);

/* rl_wshm_recv asks the service called name for version (0: latest): *fd
 * (owned by the caller), *got, *size.  RL_ENET if it cannot connect. */
int rl_wshm_recv(int *fd, uint64_t *got, uint64_t *size, const char *name, uint64_t version, int timeout_ms);
/* rl_wshm_send hands fd (a sealed object made by rl_wshm_make, borrowed:
 * the caller closes it) of `version` to the service called name and
 * returns the taker's status (RL_ENET if it cannot connect, RL_ENOTSUP if
 * the service takes no pushes). */
int rl_wshm_send(const char *name, uint64_t version, int fd, int timeout_ms);

#endif

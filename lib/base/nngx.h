/*
 * nngx.h — small helpers around nng shared by the clients in lib/.
 */
#ifndef RL_NNGX_H
#define RL_NNGX_H

#include <nng/nng.h>

/* rli_nng_close_timed closes sock on a helper thread and waits for it at most
 * a second: nng 1.5's nng_close can hang (nng bug #1543, e.g. on a REQ socket
 * with a request that just timed out).  When it does, the thread and the
 * socket are leaked (logged at verbose level, naming `what`), which beats a
 * program that never exits.  Returns 1 when the close finished, 0 when it was
 * left hanging (then nothing the socket's callbacks may touch can be freed).
 * Thread-safe. */
int rli_nng_close_timed(nng_socket sock, const char *what);

/* A tcp:// (or tls+tcp://) URL to dial must end in a port 1..65535: nng takes
 * tcp://host:99999 and the dial then fails and retries until the timeout.
 * RL_OK for such a URL and for other schemes; else an error naming the URL
 * (RL_EINVAL). */
int rli_url_port_check(const char *url);
/* The same for a URL to listen on, where port 0 (any free one) is allowed
 * too; a missing port is not (nng would take it for 0). */
int rli_url_port_check_listen(const char *url);

/* rli_url_is_local: 1 for ipc://, inproc:// and a URL whose host is a
 * loopback address (127.0.0.0/8, ::1, localhost); 0 for a wildcard
 * (tcp://0.0.0.0:P, tcp://[*]:P, tcp://:P), another address or a host name. */
int rli_url_is_local(const char *url);
/* rli_listen_policy: a server listens beyond this machine only when its
 * requests are protected (secured: TLS or a shared key) or the user said so
 * (allow_public: --listen-public).  RL_OK, or RL_EINVAL logged with a hint
 * (prog names the command). */
int rli_listen_policy(const char *prog, const char *url, int secured, int allow_public);

#endif

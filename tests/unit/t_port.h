/*
 * t_port.h — a loopback TCP port for the C unit tests that listen on one
 * (the rule of tests/cli/port_helper.bash).  Drawn at random below the
 * kernel's ephemeral range (ip_local_port_range, 32768 by default), 20000
 * and up: there no outgoing connection and no listener bound to port 0 (the
 * ring's, rl-sync's bulk stream) can take it before the test listens.
 * Checked free by binding it on 127.0.0.1 (without SO_REUSEADDR, so a port
 * with connections still closing counts as taken too), and never the same
 * port twice in one process (a forked child draws its own).  Another program's explicit bind can still take
 * it between the check and the listen: callers that can, retry on another
 * port.  Not thread-safe: call it from the test's main thread.
 */
#ifndef RL_T_PORT_H
#define RL_T_PORT_H

#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Returns such a port, or 0 when 1000 draws found none. */
static inline int
t_free_port(void)
{
	static uint32_t seed;
	static pid_t owner;
	static int given[64], ngiven;
	int lo = 32768, base = 20000;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

	if (f) {
		if (fscanf(f, "%d", &lo) != 1)
			lo = 32768;
		fclose(f);
	}
	if (lo < 21024)
		base = 1024;   /* a lowered ephemeral range: the ports below it */
	if (lo - base < 1000)
		return 0;
	if (owner != getpid()) {   /* forked children draw other ports than their parent */
		owner = getpid();
		seed = ((uint32_t)owner * 2654435761u) ^ (uint32_t)time(NULL);
	}
	for (int tries = 0; tries < 1000; tries++) {
		struct sockaddr_in a = { .sin_family = AF_INET };
		int fd, port, ok, dup = 0;

		seed = seed * 1103515245u + 12345u;
		port = base + (int)((seed >> 8) % (uint32_t)(lo - base));
		for (int i = 0; i < ngiven; i++)
			dup |= given[i] == port;
		if (dup)
			continue;
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		a.sin_port = htons((uint16_t)port);
		if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
			return 0;
		ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok) {
			if (ngiven < (int)(sizeof given / sizeof given[0]))
				given[ngiven++] = port;
			return port;
		}
	}
	return 0;
}

#endif

/*
 * test_tls_ossl.c — the OpenSSL TLS engine (lib/base/tls_ossl.c) under nng's
 * tls+tcp:// transport: certificates made here with the openssl command, a
 * PAIR connection with mutual authentication to "localhost", messages whose
 * sizes straddle TLS's 16 KiB records and nng's 16 KiB buffers, up to 6 MB,
 * both ways at once, checked byte for byte; a client without a certificate
 * or with a key not its certificate's is refused, a dial of the server's
 * address, which its certificate does not name, is refused, and the
 * listener still takes the next client.  RL_TLS_ENGINE=mbedtls runs the same on nng's
 * engine.  On a socket of our own (rli_tls_sock_open, rl-sync's bulk stream)
 * a peer that sends its handshake a byte at a time, each within the
 * socket's SO_RCVTIMEO, is still dropped when the whole handshake has taken
 * that long.
 */
#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/core.h"
#include "base/nngx.h"
#include "base/tls_ossl.h"
#include "t.h"

static char dir[] = "/tmp/rl-tls-unit.XXXXXX";

static const char *
f(const char *name)
{
	static char b[4][256];
	static int k;
	k = (k + 1) % 4;
	snprintf(b[k], sizeof b[k], "%s/%s", dir, name);
	return b[k];
}

static int
make_pki(void)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && { "
		 "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=unit-ca && "
		 "openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=localhost && "
		 "printf 'subjectAltName=DNS:localhost\\n' > srv.ext && "
		 "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 "
		 "-extfile srv.ext && "
		 "openssl req -newkey rsa:2048 -nodes -keyout cli.key -out cli.csr -subj /CN=client && "
		 "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem -days 2; "
		 "} >/dev/null 2>&1",
		 dir);
	return system(cmd);
}

static void
fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		p[i] = (uint8_t)(x >> 24);
	}
}

static nng_socket
open_pair(void)
{
	nng_socket s;
	if (nng_pair1_open(&s) != 0)
		abort();
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 20000);
	nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0);
	return s;
}

/* a message of n bytes from a to b and one of m bytes from b to a, both
 * sent before either is received */
static void
exchange(nng_socket a, nng_socket b, size_t n, size_t m, uint32_t seed)
{
	uint8_t *x = malloc(n + 1), *y = malloc(m + 1);
	nng_msg *ma, *mb, *ra = NULL, *rb = NULL;

	fill(x, n, seed);
	fill(y, m, seed + 1);
	T_EQ_INT(nng_msg_alloc(&ma, 0), 0);
	T_EQ_INT(nng_msg_append(ma, x, n), 0);
	T_EQ_INT(nng_msg_alloc(&mb, 0), 0);
	T_EQ_INT(nng_msg_append(mb, y, m), 0);
	T_EQ_INT(nng_sendmsg(a, ma, 0), 0);
	T_EQ_INT(nng_sendmsg(b, mb, 0), 0);
	T_EQ_INT(nng_recvmsg(b, &rb, 0), 0);
	T_EQ_INT(nng_recvmsg(a, &ra, 0), 0);
	if (rb) {
		T_OK(nng_msg_len(rb) == n && memcmp(nng_msg_body(rb), x, n) == 0, "%zu bytes a->b", n);
		nng_msg_free(rb);
	}
	if (ra) {
		T_OK(nng_msg_len(ra) == m && memcmp(nng_msg_body(ra), y, m) == 0, "%zu bytes b->a", m);
		nng_msg_free(ra);
	}
	free(x);
	free(y);
}

/* a peer that dribbles a TLS record a byte every 100 ms: each byte comes
 * within the 400 ms SO_RCVTIMEO, the record would take 51 s */
static void
slow_handshake(void)
{
	rli_tls_ctx *x = NULL;
	rli_tls_sock *t = NULL;
	struct timeval to = { .tv_usec = 400000 }, back = { 0 };
	socklen_t bl = sizeof back;
	char why[320];
	int sv[2], rv;
	pid_t pid;
	double t0, dt;

	T_EQ_INT(rli_nng_tls_files(f("srv.pem"), f("srv.key"), f("ca.pem")), 0);
	T_EQ_INT(rli_nng_tls_ctx(&x, 1, "tls+tcp://127.0.0.1:1"), RL_OK);
	T_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	if ((pid = fork()) == 0) {
		static const unsigned char hdr[5] = { 0x16, 0x03, 0x01, 0x02, 0x00 }; /* handshake, 512 bytes */
		close(sv[0]);
		for (int i = 0; i < 5 + 512; i++) {
			unsigned char b = i < 5 ? hdr[i] : 0;
			if (write(sv[1], &b, 1) != 1)
				_exit(0);
			usleep(100000);
		}
		_exit(0);
	}
	close(sv[1]);
	setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &to, sizeof to);
	t0 = rl_now();
	rv = rli_tls_sock_open(&t, x, sv[0], why, sizeof why);
	dt = rl_now() - t0;
	T_OK(rv == RL_ETIMEDOUT && t == NULL, "a dribbled handshake: %d (%s)", rv, why);
	T_OK(dt >= 0.35 && dt < 2.0, "dropped after %.2f s (the limit: 0.4 s)", dt);
	T_OK(getsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &back, &bl) == 0 && back.tv_sec == 0 &&
		     back.tv_usec >= 390000 && back.tv_usec <= 410000,
	     "SO_RCVTIMEO is the caller's again: %ld.%06ld", (long)back.tv_sec, (long)back.tv_usec);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(sv[0]);
	rli_tls_ctx_free(x);
}

int
main(void)
{
	const char *want = getenv("RL_TLS_ENGINE");
	nng_socket srv, cli, bad;
	nng_listener l;
	char url[64], ipurl[64], msg[2048];
	int port = 0, rv;
	static const size_t sizes[] = { 1, 16383, 16384, 16385, 16406, 32768, 100003, 6000000 };

	T_BEGIN("tls_ossl");
	if (system("command -v openssl >/dev/null 2>&1") != 0)
		T_SKIP("no openssl command to make certificates");
	if (mkdtemp(dir) == NULL || make_pki() != 0)
		T_SKIP("could not make certificates with openssl");
	rl_log_init("test_tls_ossl", RL_LOG_QUIET);

	/* the server: its certificate, client certificates required */
	srv = open_pair();
	T_EQ_INT(rli_nng_tls_files(f("srv.pem"), f("srv.key"), f("ca.pem")), 0);
	T_EQ_INT(rli_nng_listen(srv, "tls+tcp://127.0.0.1:0", &l), 0);
	T_EQ_INT(nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
	T_EQ_STR(rl_tls_engine_name(), want && strcmp(want, "mbedtls") == 0 ? "mbed" : "openssl");
	snprintf(url, sizeof url, "tls+tcp://localhost:%d", port);

	/* no client certificate: refused at the dial, named */
	bad = open_pair();
	T_EQ_INT(rli_nng_tls_files(NULL, NULL, f("ca.pem")), 0);
	T_CAPTURE(rli_nng_dial(bad, url, NULL, 0), &rv, msg);
	T_OK(rv != 0 && strstr(msg, "TLS handshake failed") != NULL, "%d: %s", rv, msg);
	nng_close(bad);
	/* a key that is not the certificate's: refused before connecting */
	bad = open_pair();
	T_EQ_INT(rli_nng_tls_files(f("cli.pem"), f("srv.key"), f("ca.pem")), 0);
	T_CAPTURE(rli_nng_dial(bad, url, NULL, 0), &rv, msg);
	if (want && strcmp(want, "mbedtls") == 0) /* nng's engine finds it in the handshake */
		T_OK(rv != 0 && strstr(msg, "TLS handshake failed") != NULL, "%d: %s", rv, msg);
	else
		T_OK(rv != 0 && strstr(msg, "cannot use the certificate and key") != NULL, "%d: %s", rv, msg);
	nng_close(bad);

	/* the server's certificate names DNS:localhost only: its address is
	 * not a name it has (the OpenSSL engine checks IP subjectAltNames;
	 * nng's mbedTLS engine cannot, so an address is refused there) */
	bad = open_pair();
	snprintf(ipurl, sizeof ipurl, "tls+tcp://127.0.0.1:%d", port);
	T_EQ_INT(rli_nng_tls_files(f("cli.pem"), f("cli.key"), f("ca.pem")), 0);
	T_CAPTURE(rli_nng_dial(bad, ipurl, NULL, 0), &rv, msg);
	if (want && strcmp(want, "mbedtls") == 0)
		T_OK(rv != 0 && strstr(msg, "cannot check the address 127.0.0.1") != NULL, "%d: %s", rv, msg);
	else
		T_OK(rv != 0 && strstr(msg, "IP address mismatch: the certificate names DNS:localhost, not 127.0.0.1") &&
			     strstr(msg, "-addext subjectAltName=IP:127.0.0.1"),
		     "%d: %s", rv, msg);
	nng_close(bad);

	/* the client with its certificate: the listener still accepts */
	cli = open_pair();
	T_EQ_INT(rli_nng_tls_files(f("cli.pem"), f("cli.key"), f("ca.pem")), 0);
	T_EQ_INT(rli_nng_dial(cli, url, NULL, 0), 0);
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
		exchange(cli, srv, sizes[i], sizes[sizeof sizes / sizeof *sizes - 1 - i], (uint32_t)i);
	/* many small messages in a row */
	for (int i = 0; i < 200; i++)
		exchange(srv, cli, (size_t)(i * 97 % 5000) + 1, (size_t)(i * 31 % 3000) + 1, (uint32_t)(1000 + i));

	nng_close(cli);
	nng_close(srv);
	slow_handshake();
	snprintf(msg, sizeof msg, "rm -rf '%s'", dir);
	if (system(msg) != 0)
		t_fail++;
	T_END();
}

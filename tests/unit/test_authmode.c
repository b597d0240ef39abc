/*
 * test_authmode.c — which proof a request carries and which a server takes
 * (lib/queue/qproto.c, lib/sync/wire.c): over TLS the header-only MAC, on
 * plain tcp:// the MAC with the body's Poly1305 tag; a TLS server takes
 * both, a plain one refuses the header-only proof with its own reason and a
 * changed body with "wrong shared key".  The MACs themselves are checked
 * against Python in test_auth.c and tests/cli (rlq_auth.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/core.h"
#include "queue/qproto.h"
#include "sync/wsync_int.h"
#include "t.h"

/* a signed PUT of n body bytes over tls or not; the header decoded into h */
static uint8_t *
qmsg(size_t n, int tls, rl_qhdr *h)
{
	uint8_t *m = calloc(1, RL_QP_AUTH_HDR_LEN + n);
	rl_qhdr e = { .op = RL_QOP_PUT, .flags = RL_QF_AUTH, .hdr_len = RL_QP_AUTH_HDR_LEN, .req_id = 9 };

	rl_qhdr_encode(m, &e);
	for (size_t i = 0; i < n; i++)
		m[RL_QP_AUTH_HDR_LEN + i] = (uint8_t)(i * 7);
	rl_qauth_sign(m, RL_QP_AUTH_HDR_LEN + n, tls);
	rl_qhdr_decode(h, m, RL_QP_AUTH_HDR_LEN + n);
	return m;
}

static uint8_t *
wmsg(size_t n, int tls)
{
	uint8_t *m = calloc(1, WS_AUTH_HDR + n);

	rli_ws_hdr_fill(m, 3, 0, 1, 2, 3);
	for (size_t i = 0; i < n; i++)
		m[WS_AUTH_HDR + i] = (uint8_t)(i * 5);
	rli_ws_auth_sign(m, WS_AUTH_HDR + n, tls);
	return m;
}

int
main(void)
{
	char dir[] = "/tmp/rl-test-authmode.XXXXXX", path[128];
	const char *why = NULL;
	const size_t n = 5000, qn = RL_QP_AUTH_HDR_LEN + n, wn = WS_AUTH_HDR + n;
	uint8_t *m;
	rl_qhdr h;
	FILE *f;

	T_BEGIN("authmode");
	T_OK(mkdtemp(dir) != NULL, "tmpdir");
	snprintf(path, sizeof path, "%s/key", dir);
	f = fopen(path, "w");
	fputs("0123456789abcdef0123456789abcdef\n", f);
	fclose(f);
	chmod(path, 0600);
	T_EQ_INT(rli_auth_set_file(path), RL_OK);

	/* rl-queue: header-only proof */
	m = qmsg(n, 1, &h);
	T_EQ_INT(rl_qauth_check(m, qn, &h, 1, &why), RL_OK);
	m[qn - 1] ^= 1;   /* TLS guards the body: a change here is not the MAC's to see */
	rl_qauth_sign(m, qn, 1);
	T_EQ_INT(rl_qauth_check(m, qn, &h, 1, &why), RL_OK);
	rl_qauth_sign(m, qn, 1);
	T_EQ_INT(rl_qauth_check(m, qn, &h, 0, &why), RL_EINVAL);
	T_OK(why && strstr(why, "covers its header only") && strstr(why, "plain tcp://"), "why: %s", why ? why : "");
	m[5] ^= 1;        /* the op: covered */
	rl_qauth_sign(m, qn, 1);
	m[5] ^= 1;
	T_EQ_INT(rl_qauth_check(m, qn, &h, 1, &why), RL_EINVAL);
	T_OK(why && strstr(why, "wrong shared key"), "why: %s", why ? why : "");
	free(m);
	/* rl-queue: full proof, taken on both listeners; a changed body refused */
	m = qmsg(n, 0, &h);
	T_EQ_INT(rl_qauth_check(m, qn, &h, 0, &why), RL_OK);
	rl_qauth_sign(m, qn, 0);
	T_EQ_INT(rl_qauth_check(m, qn, &h, 1, &why), RL_OK);
	rl_qauth_sign(m, qn, 0);
	m[RL_QP_AUTH_HDR_LEN + 100] ^= 1;
	T_EQ_INT(rl_qauth_check(m, qn, &h, 0, &why), RL_EINVAL);
	T_OK(why && strstr(why, "wrong shared key"), "why: %s", why ? why : "");
	T_EQ_INT(rl_qauth_check(m, qn, &h, 1, &why), RL_EINVAL);
	free(m);

	/* rl-sync's REQ/REP: the same rules */
	m = wmsg(n, 1);
	T_EQ_INT(rli_ws_auth_check(m, wn, 1, &why), RL_OK);
	rli_ws_auth_sign(m, wn, 1);
	T_EQ_INT(rli_ws_auth_check(m, wn, 0, &why), RL_EINVAL);
	T_OK(why && strstr(why, "covers its header only"), "why: %s", why ? why : "");
	rli_ws_auth_sign(m, wn, 0);
	T_EQ_INT(rli_ws_auth_check(m, wn, 1, &why), RL_OK);
	rli_ws_auth_sign(m, wn, 0);
	T_EQ_INT(rli_ws_auth_check(m, wn, 0, &why), RL_OK);
	rli_ws_auth_sign(m, wn, 0);
	m[wn - 1] ^= 1;
	T_EQ_INT(rli_ws_auth_check(m, wn, 0, &why), RL_EINVAL);
	T_OK(why && strstr(why, "wrong shared key"), "why: %s", why ? why : "");
	/* the body put back: taken once (a refused MAC does not mark its
	 * nonce seen), then refused as a replay */
	m[wn - 1] ^= 1;
	T_EQ_INT(rli_ws_auth_check(m, wn, 0, &why), RL_OK);
	T_EQ_INT(rli_ws_auth_check(m, wn, 0, &why), RL_EINVAL);
	T_OK(why && strstr(why, "replay"), "why: %s", why ? why : "");
	free(m);

	rli_auth_clear();
	unlink(path);
	rmdir(dir);
	T_END();
}

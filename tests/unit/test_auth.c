/*
 * test_auth.c — lib/base/auth.c: the HMAC against RFC 4231's published
 * HMAC-SHA256 vectors, a request's seal against values made with Python's
 * hmac and python3-cryptography's Poly1305 (tests/cli/rlq_auth.py's seal()),
 * the key file's checks, the replay guard.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/core.h"
#include "t.h"

static void
write_key(const char *path, const void *p, size_t n, mode_t mode)
{
	FILE *f = fopen(path, "wb");

	fwrite(p, 1, n, f);
	fclose(f);
	chmod(path, mode);
}

static void
hex(char *out, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

int
main(void)
{
	char dir[] = "/tmp/rl-test-auth.XXXXXX", path[128], msg[512], hx[65];
	uint8_t key1[20], mac[RLI_AUTH_MAC_LEN];
	const char *why = NULL;
	uint64_t t, n;
	struct timespec ts;
	int rv;

	T_BEGIN("auth");
	rl_log_set_level(RL_LOG_QUIET);
	T_OK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof path, "%s/key", dir);

	/* RFC 4231 test case 1: key 0x0b x 20, "Hi There" */
	memset(key1, 0x0b, sizeof key1);
	write_key(path, key1, sizeof key1, 0600);
	T_EQ_INT(rli_auth_set_file(path), RL_OK);
	rli_auth_mac(mac, "Hi ", 3, "There", 5);
	hex(hx, mac, sizeof mac);
	T_EQ_STR(hx, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	/* test case 6: a 131-byte key (longer than the block), one part only */
	{
		uint8_t k6[131];
		const char *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
		memset(k6, 0xaa, sizeof k6);
		write_key(path, k6, sizeof k6, 0400);
		T_EQ_INT(rli_auth_set_file(path), RL_OK);
		rli_auth_mac(mac, d6, strlen(d6), NULL, 0);
		hex(hx, mac, sizeof mac);
		T_EQ_STR(hx, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
	}

	/* the seal, after the key changed back (each thread rekeys its HMAC) */
	write_key(path, key1, sizeof key1, 0600);
	T_EQ_INT(rli_auth_set_file(path), RL_OK);
	rli_auth_seal(mac, "Hi ", 3, "There", 5);
	hex(hx, mac, sizeof mac);
	T_EQ_STR(hx, "5b88f0b13eddc685a03565e227e444d38eaaf3ea17c2d6b053d61e7af39063e7");
	rli_auth_seal(mac, "header only", 11, NULL, 0);
	hex(hx, mac, sizeof mac);
	T_EQ_STR(hx, "98ee8b72e1dcabb7eafebb0f649ae66885cdc6964db2c1948dd133c411bc1b02");
	/* the proof over TLS: HMAC(K, "rlpipe header only 1\0" || a), by Python's hmac */
	rli_auth_seal_head(mac, "header only", 11);
	hex(hx, mac, sizeof mac);
	T_EQ_STR(hx, "f649339601606f4f427611f7eb713bee8e22ea78f278ba21d372f5037464dd09");
	{
		uint8_t a[48], *b = malloc(256000);
		memset(a, 'a', sizeof a);
		for (int i = 0; i < 256000; i++)
			b[i] = (uint8_t)i;
		rli_auth_seal(mac, a, sizeof a, b, 256000);
		hex(hx, mac, sizeof mac);
		T_EQ_STR(hx, "966c0cbda414f63c9df8dc4721ec4d17e1149a945ca0ba1e6de3e966c33469d3");
		b[128000] ^= 1;   /* one flipped bit of the body */
		rli_auth_seal(mac, a, sizeof a, b, 256000);
		hex(hx, mac, sizeof mac);
		T_OK(strcmp(hx, "966c0cbda414f63c9df8dc4721ec4d17e1149a945ca0ba1e6de3e966c33469d3") != 0, "tampered body");
		free(b);
	}

	/* the file's mode, as ssh checks a private key */
	write_key(path, "0123456789abcdef0123\n", 21, 0644);
	msg[0] = 0;
	rl_log_set_level(RL_LOG_NORMAL);
	T_CAPTURE(rli_auth_set_file(path), &rv, msg);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(msg, path) && strstr(msg, "permissions 0644 are too open"), "message: %s", msg);
	chmod(path, 0620);
	T_CAPTURE(rli_auth_set_file(path), &rv, msg);
	T_EQ_INT(rv, RL_EINVAL);
	T_OK(strstr(msg, "permissions 0620"), "message: %s", msg);
	write_key(path, "short\n", 6, 0600);
	T_CAPTURE(rli_auth_set_file(path), &rv, msg);
	T_EQ_INT(rv, RL_EFORMAT);
	snprintf(path, sizeof path, "%s/none", dir);
	T_CAPTURE(rli_auth_set_file(path), &rv, msg);
	T_EQ_INT(rv, RL_ENOENT);
	rl_log_set_level(RL_LOG_QUIET);

	/* constant-time compare */
	T_OK(rli_auth_equal("abcd", "abcd", 4), "equal");
	T_OK(!rli_auth_equal("abcd", "abce", 4), "last byte differs");
	T_OK(!rli_auth_equal("xbcd", "abcd", 4), "first byte differs");

	/* replay guard: a pair once, a stale time never */
	rli_auth_stamp(&t, &n);
	T_EQ_INT(rli_auth_fresh(t, n, &why), RL_OK);
	T_EQ_INT(rli_auth_fresh(t, n, &why), RL_EINVAL);
	T_OK(why && strstr(why, "replay"), "why: %s", why ? why : "");
	T_EQ_INT(rli_auth_fresh(t, n + 1, &why), RL_OK);
	clock_gettime(CLOCK_REALTIME, &ts);
	T_EQ_INT(rli_auth_fresh((uint64_t)(ts.tv_sec - 400) * 1000000000ull, 5, &why), RL_EINVAL);
	T_OK(why && strstr(why, "300 s"), "why: %s", why ? why : "");
	T_EQ_INT(rli_auth_fresh((uint64_t)(ts.tv_sec + 400) * 1000000000ull, 6, &why), RL_EINVAL);

	rli_auth_clear();
	T_OK(rli_auth_key(NULL) == NULL, "cleared");
	snprintf(path, sizeof path, "%s/key", dir);
	unlink(path);
	rmdir(dir);
	T_END();
}

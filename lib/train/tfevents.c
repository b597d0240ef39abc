/*
 * tfevents.c — TensorBoard scalar event files (see tfevents.h).
 */
#include "train/tfevents.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/core.h"

struct rl_tfevents {
	FILE *f;
	char *path;
};

static uint32_t crc_table[256];

static void
crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[i] = c;
	}
}

uint32_t
rl_crc32c(const void *data, size_t n)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const uint8_t *p = data;
	uint32_t c = 0xffffffffu;

	pthread_once(&once, crc_init);
	for (size_t i = 0; i < n; i++)
		c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
	return c ^ 0xffffffffu;
}

uint32_t
rl_crc32c_masked(const void *data, size_t n)
{
	uint32_t c = rl_crc32c(data, n);
	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static size_t
put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

static void
put_le(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Serialized Event into p (at least 64 + 2*taglen bytes); returns its length. */
static size_t
encode_event(uint8_t *p, const char *tag, int64_t step, double value, double wall, const char *version)
{
	size_t n = 0, tl = tag ? strlen(tag) : 0;
	union { double d; uint64_t u; } w = { wall };

	p[n++] = 0x09; /* wall_time, fixed64 */
	put_le(p + n, w.u, 8);
	n += 8;
	p[n++] = 0x10; /* step, varint */
	n += put_varint(p + n, (uint64_t)step);
	if (version) {
		size_t vl = strlen(version);
		p[n++] = 0x1a;
		n += put_varint(p + n, vl);
		memcpy(p + n, version, vl);
		n += vl;
	} else {
		/* Summary { Value { tag, simple_value } } */
		size_t vlen = 1 + (tl < 128 ? 1 : 2) + tl + 5;
		size_t slen = 1 + (vlen < 128 ? 1 : 2) + vlen;
		union { float f; uint32_t u; } fv = { (float)value };

		p[n++] = 0x2a;
		n += put_varint(p + n, slen);
		p[n++] = 0x0a;
		n += put_varint(p + n, vlen);
		p[n++] = 0x0a;
		n += put_varint(p + n, tl);
		memcpy(p + n, tag, tl);
		n += tl;
		p[n++] = 0x15;
		put_le(p + n, fv.u, 4);
		n += 4;
	}
	return n;
}

static size_t
encode_record(uint8_t *buf, size_t cap, const char *tag, int64_t step, double value, double wall,
    const char *version)
{
	size_t tl = tag ? strlen(tag) : 0, need = 12 + 4 + 64 + tl + (version ? strlen(version) : 0);
	size_t len;

	if (tl >= 16000 || cap < need)
		return 0;
	len = encode_event(buf + 12, tag, step, value, wall, version);
	put_le(buf, len, 8);
	put_le(buf + 8, rl_crc32c_masked(buf, 8), 4);
	put_le(buf + 12 + len, rl_crc32c_masked(buf + 12, len), 4);
	return 12 + len + 4;
}

size_t
rl_tfevents_encode_scalar(uint8_t *buf, size_t cap, const char *tag, int64_t step, double value,
    double wall_time)
{
	return encode_record(buf, cap, tag, step, value, wall_time, NULL);
}

int
rl_tfevents_open(rl_tfevents **out, const char *dir)
{
	char host[256] = "localhost";
	rl_tfevents *tf;
	uint8_t buf[128];
	size_t n;
	double now = rl_wall();

	*out = NULL;
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		rl_error("cannot create '%s': %s", dir, strerror(errno));
		return RL_EIO;
	}
	gethostname(host, sizeof host - 1);
	tf = rl_xcalloc(1, sizeof *tf);
	if (asprintf(&tf->path, "%s/events.out.tfevents.%lld.%s", dir, (long long)now, host) < 0)
		abort();
	if ((tf->f = fopen(tf->path, "ab")) == NULL) {
		rl_error("cannot open '%s': %s", tf->path, strerror(errno));
		free(tf->path);
		free(tf);
		return RL_EIO;
	}
	n = encode_record(buf, sizeof buf, NULL, 0, 0, now, "brain.Event:2");
	if (fwrite(buf, 1, n, tf->f) != n) {
		rl_tfevents_close(tf);
		return RL_EIO;
	}
	*out = tf;
	return RL_OK;
}

int
rl_tfevents_scalar(rl_tfevents *tf, const char *tag, int64_t step, double value, double wall_time)
{
	uint8_t buf[512];
	size_t n = rl_tfevents_encode_scalar(buf, sizeof buf, tag, step, value,
	    wall_time > 0 ? wall_time : rl_wall());

	if (n == 0)
		return RL_ETOOBIG;
	if (fwrite(buf, 1, n, tf->f) != n) {
		rl_error("cannot write '%s': %s", tf->path, strerror(errno));
		return RL_EIO;
	}
	return RL_OK;
}

int
rl_tfevents_flush(rl_tfevents *tf)
{
	if (fflush(tf->f) != 0) {
		rl_error("cannot write '%s': %s", tf->path, strerror(errno));
		return RL_EIO;
	}
	return RL_OK;
}

int
rl_tfevents_close(rl_tfevents *tf)
{
	int rv = RL_OK;

	if (tf == NULL)
		return RL_OK;
	if (tf->f && fclose(tf->f) != 0) {
		rl_error("cannot write '%s': %s", tf->path, strerror(errno));
		rv = RL_EIO;
	}
	free(tf->path);
	free(tf);
	return rv;
}

const char *rl_tfevents_path(const rl_tfevents *tf) { return tf->path; }

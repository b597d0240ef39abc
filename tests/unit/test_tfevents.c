/* test_tfevents.c — CRC-32C against RFC 3720's test vectors, an Event's bytes
 * against the protobuf encoding written out by hand, and a file read back
 * record by record with both checksums verified. */
#include <stdint.h>
#include <unistd.h>

#include "base/core.h"
#include "train/tfevents.h"
#include "t.h"

static uint64_t
le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int
main(void)
{
	uint8_t buf[256], zeros[32] = { 0 }, ones[32], inc[32];

	T_BEGIN("test_tfevents");
	for (int i = 0; i < 32; i++)
		ones[i] = 0xff, inc[i] = (uint8_t)i;
	T_EQ_INT(rl_crc32c("123456789", 9), 0xe3069283u);
	T_EQ_INT(rl_crc32c(zeros, 32), 0x8a9136aau);
	T_EQ_INT(rl_crc32c(ones, 32), 0x62a8ab43u);
	T_EQ_INT(rl_crc32c(inc, 32), 0x46dd794eu);

	/* Event{wall_time=0 (09 + 8 zero bytes), step=1 (10 01), summary (2a 0a)
	 *   {value (0a 08) {tag "a" (0a 01 61), simple_value 1.0f (15 00 00 80 3f)}}} */
	static const uint8_t ev[] = { 0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x01, 0x2a, 0x0a, 0x0a, 0x08,
		0x0a, 0x01, 'a', 0x15, 0x00, 0x00, 0x80, 0x3f };
	size_t n = rl_tfevents_encode_scalar(buf, sizeof buf, "a", 1, 1.0, 0.0);
	T_EQ_INT(n, 12 + sizeof ev + 4);
	T_EQ_INT(le(buf, 8), sizeof ev);
	T_OK(memcmp(buf + 12, ev, sizeof ev) == 0, "event bytes differ");
	T_EQ_INT(le(buf + 8, 4), rl_crc32c_masked(buf, 8));
	T_EQ_INT(le(buf + 12 + sizeof ev, 4), rl_crc32c_masked(ev, sizeof ev));
	T_EQ_INT(rl_tfevents_encode_scalar(buf, 10, "a", 1, 1.0, 0.0), 0);

	/* a file: version record + 3 scalars, all checksums valid */
	char dir[] = "/tmp/rl-tfev-XXXXXX";
	T_OK(mkdtemp(dir) != NULL);
	rl_tfevents *tf;
	T_EQ_INT(rl_tfevents_open(&tf, dir), RL_OK);
	for (int s = 0; s < 3; s++)
		T_EQ_INT(rl_tfevents_scalar(tf, "actor/pg_loss", s, 0.5 * s, 0), RL_OK);
	char path[512];
	snprintf(path, sizeof path, "%s", rl_tfevents_path(tf));
	T_EQ_INT(rl_tfevents_close(tf), RL_OK);
	FILE *f = fopen(path, "rb");
	T_OK(f != NULL);
	int records = 0;
	uint8_t hdr[12], data[512], crc[4];
	while (f && fread(hdr, 1, 12, f) == 12) {
		uint64_t len = le(hdr, 8);
		T_EQ_INT(le(hdr + 8, 4), rl_crc32c_masked(hdr, 8));
		T_OK(len < sizeof data);
		T_EQ_INT(fread(data, 1, len, f), len);
		T_EQ_INT(fread(crc, 1, 4, f), 4);
		T_EQ_INT(le(crc, 4), rl_crc32c_masked(data, len));
		records++;
	}
	T_EQ_INT(records, 4);
	if (f)
		fclose(f);
	unlink(path);
	rmdir(dir);
	T_END();
}

/* test_core.c — pins rl_strerror's strings (users grep for them) and the
 * checked size arithmetic. */
#include "base/core.h"
#include "t.h"

int
main(void)
{
	size_t s;

	T_BEGIN("test_core");
	T_EQ_STR(rl_strerror(RL_OK), "success");
	T_EQ_STR(rl_strerror(RL_EINVAL), "invalid argument");
	T_EQ_STR(rl_strerror(RL_ENOMEM), "out of memory");
	T_EQ_STR(rl_strerror(RL_EFORMAT), "malformed input");
	T_EQ_STR(rl_strerror(RL_EVERSION), "unsupported version");
	T_EQ_STR(rl_strerror(RL_ECHECKSUM), "checksum mismatch");
	T_EQ_STR(rl_strerror(RL_ETOOBIG), "size over limit");
	T_EQ_STR(rl_strerror(RL_EBUSY), "busy, try again");
	T_EQ_STR(rl_strerror(-1), "unknown error");
	T_EQ_STR(rl_strerror(RL_ERR_COUNT), "unknown error");
	for (int i = 0; i < RL_ERR_COUNT; i++)
		T_OK(strcmp(rl_strerror(i), "unknown error") != 0, "code %d has no string", i);
	T_EQ_INT(rl_mul_size(&s, (size_t)1 << 40, (size_t)1 << 30), RL_ETOOBIG);
	T_EQ_INT(rl_mul_size(&s, 3, 5), RL_OK);
	T_EQ_INT(s, 15);
	T_EQ_INT(rl_add_size(&s, SIZE_MAX, 1), RL_ETOOBIG);
	T_END();
}

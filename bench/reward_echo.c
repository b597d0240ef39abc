/*
 * bench/reward_echo.c — the most trivial --exec reward program: for each
 * input line, reply "1".  Used by bench/reward.sh to measure what the
 * coprocess protocol itself costs (pipes, scheduling, JSONL encoding).
 */
#include <stdio.h>
#include <stdlib.h>

int
main(void)
{
	char *line = NULL;
	size_t cap = 0;

	while (getline(&line, &cap, stdin) > 0) {
		if (fputs("1\n", stdout) < 0 || fflush(stdout) != 0)
			break;
	}
	free(line);
	return 0;
}

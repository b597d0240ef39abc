#!/usr/bin/env bats
# The communicator under valgrind's memcheck: tests/unit/test_comm_close.c's
# two ranks with every nng socket close left hanging
# (RL_NNG_TEST_CLOSE_WAIT_MS=0), so that nng runs the ring's pipe callbacks
# after rl_comm_close has returned.  They must read no freed memory (they
# did: "Invalid read of size 4 at on_prev_pipe" under frames of
# libnng.so.1.5.2).  Skipped without valgrind, without the test binary, or
# with a sanitizer build (valgrind cannot run those).  About 7 s on an idle
# 2-core machine.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

@test "rl_comm_close with the ring sockets' closes left hanging: valgrind finds no invalid access" {
	root=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
	t="$root/${RL_BUILD:-build}/tests/test_comm_close"
	command -v valgrind >/dev/null || skip "valgrind not installed"
	[ -x "$t" ] || skip "no ${RL_BUILD:-build}/tests/test_comm_close"
	if nm "$t" 2>/dev/null | grep -q ' U __asan_\| T __asan_'; then
		skip "a sanitizer build: valgrind cannot run it"
	fi
	run --separate-stderr valgrind -q --error-exitcode=9 "$t"
	echo "$stderr" | head -n 60
	assert_success
	assert_output --partial "test_comm_close: ok"
	# the path ran: closes were left to finish after rl_comm_close
	[[ "$stderr" == *"closing the ring socket hangs"* ]]
	[[ "$stderr" != *"Invalid read"* && "$stderr" != *"Invalid write"* ]]
}

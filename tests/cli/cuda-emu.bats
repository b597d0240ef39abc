#!/usr/bin/env bats
# The CUDA kernels that kernels/emu covers (decode.cu's split decode attention
# and its merge, norm.cu's fused add + norm) run on the CPU through the
# emulator, against the CPU reference: the kernel logic is checked in every
# `make check`, without a GPU.  Skipped without a C++ compiler or the library.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

@test "kernels/emu: split decode attention and add + norm match the CPU reference" {
	root=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
	command -v "${CXX:-g++}" >/dev/null || skip "no C++ compiler"
	[ -f "$root/${RL_BUILD:-build}/librlpipe.a" ] || skip "no ${RL_BUILD:-build}/librlpipe.a"
	run --separate-stderr sh "$root/kernels/emu/run.sh"
	assert_success
	# "emu_kernels: P of N cases passed", every case and at least the 40 of now
	summary=$(printf '%s\n' "$output" | sed -n 's/^emu_kernels: \([0-9]*\) of \([0-9]*\) cases passed$/\1 \2/p')
	set -- $summary
	[ "$#" = 2 ] && [ "$1" = "$2" ] && [ "$2" -ge 40 ]
}

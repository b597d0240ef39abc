#!/usr/bin/env bats
# CUDA kernels run on the CPU through kernels/emu (threads as fibers, barriers,
# mma.sync/ldmatrix/cp.async emulated lane by lane from the PTX layouts) against
# the CPU reference: decode.cu's two decode attention kernels and their merge
# (in the kernel, blocks in a random order, and the merge kernel), norm.cu's
# forward norms (fused add + norm, the row in registers), gemv.cu, logprob.cu's
# samplers (one block a row, and a row over several blocks), and flash2.cu's attention forward and backward (also
# with warps drifting apart).  The kernel logic is checked in every `make check`,
# without a GPU.  Skipped without a C++ compiler or the library.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

# passed NAME MIN: the "NAME: P of N cases passed" line has P = N >= MIN
passed() {
	local s
	s=$(printf '%s\n' "$output" | sed -n "s/^$1: \([0-9]*\) of \([0-9]*\) cases passed\$/\1 \2/p")
	set -- $s "$2"
	[ "$#" = 3 ] && [ "$1" = "$2" ] && [ "$2" -ge "$3" ]
}

@test "kernels/emu: decode attention, the forward norms, gemv, the sampler and flash2 match the CPU reference" {
	root=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
	command -v "${CXX:-g++}" >/dev/null || skip "no C++ compiler"
	[ -f "$root/${RL_BUILD:-build}/librlpipe.a" ] || skip "no ${RL_BUILD:-build}/librlpipe.a"
	run --separate-stderr sh "$root/kernels/emu/run.sh"
	assert_success
	passed emu_kernels 102
	passed emu_sample 20
	# a sanitized library (build-san) makes run.sh take flash2's quick set: 6 cases
	if nm "$root/${RL_BUILD:-build}/librlpipe.a" 2>/dev/null | grep -q ' U __asan_'; then
		passed emu_flash2 6
	else
		passed emu_flash2 10
	fi
	passed 'emu_flash2 (skew)' 2
}

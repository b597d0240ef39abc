#!/usr/bin/env bats
# CUDA kernels run on the CPU through kernels/emu (threads as fibers, barriers,
# mma.sync/ldmatrix/cp.async emulated lane by lane from the PTX layouts) against
# the CPU reference: decode.cu's three decode attention kernels and their merge
# (in the kernel, blocks in a random order, and the merge kernel), norm.cu's
# forward norms (fused add + norm, the row in registers) and backward norms (plain and
# added into dx), gemv.cu, fuse.cu,
# logprob.cu's samplers (one block a row, and a row over several blocks) and
# log-prob kernels (strided rows), flash2.cu's attention forward and backward,
# two-pass and fused (also with warps drifting apart), and elementwise.cu's vec
# kernels and multi-tensor AdamW (emu_ew: bit for bit against the element-wise
# forms), and step.cu's persistent decode step (emu_step: stage by stage and the
# whole kernel against the CPU ops, its grid barrier over blocks run at once).
# The kernel logic is checked in every `make check`,
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

@test "kernels/emu: decode attention, the forward norms, gemv, the sampler, flash2, the elementwise kernels and the decode step match the CPU reference" {
	root=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
	command -v "${CXX:-g++}" >/dev/null || skip "no C++ compiler"
	[ -f "$root/${RL_BUILD:-build}/librlpipe.a" ] || skip "no ${RL_BUILD:-build}/librlpipe.a"
	run --separate-stderr sh "$root/kernels/emu/run.sh"
	assert_success
	passed emu_kernels 206
	passed emu_sample 20
	passed emu_logprob 8
	passed emu_ew 76
	# a sanitized library (build-san) makes run.sh take flash2's quick set: 15 cases (the
	# self-test, 5 shapes by the two-pass backward, 5 + 4 by the fused one's tiles), and
	# emu_step's: 7 (5 step cases and the 2 barrier cases; its skew run then left out)
	if nm "$root/${RL_BUILD:-build}/librlpipe.a" 2>/dev/null | grep -q ' U __asan_'; then
		passed emu_flash2 15
		passed emu_step 7
	else
		passed emu_flash2 25
		passed emu_step 16
		passed 'emu_step (skew)' 7
	fi
	passed 'emu_flash2 (skew)' 5
}

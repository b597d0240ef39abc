#!/bin/sh
# kernels/emu/mutate.sh — shows that kernels/emu catches wrong flash2 kernels: each
# mutation below is applied to a copy of kernels/flash2.cu (a wrong mma/ldmatrix
# fragment layout, a missing mask, a missing rescale, a missing barrier, ...), the
# copy is run through `run.sh quick` (RL_EMU_FLASH2=copy; with its skew cases)
# and must FAIL.  Prints one line per mutation; exit 1 if any mutation passed (went
# unnoticed) or did not apply.  About 25 s per mutation (13 minutes for 31) on 2 shared cores,
# so not part of `make check`; run it after changing flash2.cu.
#   sh kernels/emu/mutate.sh         (needs build/librlpipe.a: `make` first)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${RL_BUILD:-build}
tmp=$root/$B/emu/mutant.cu
missed=0
mutant() {
	name=$1
	expr=$2
	case $expr in
	drop:*)	# drop:N: leave out the N-th barrier after a tile is used
		awk -v n="${expr#drop:}" '/this buffer is read: the next iteration may refill it/ { if (++c == n) next } { print }' \
		    "$root/kernels/flash2.cu" > "$tmp" ;;
	*)	sed "$expr" "$root/kernels/flash2.cu" > "$tmp" ;;
	esac
	if cmp -s "$tmp" "$root/kernels/flash2.cu"; then
		echo "NOT APPLIED  $name"
		missed=1
		return
	fi
	if RL_EMU_FLASH2=$tmp sh "$root/kernels/emu/run.sh" quick > "$tmp.log" 2>&1; then
		echo "MISSED       $name"
		missed=1
	else
		n=$(grep -c FAIL "$tmp.log")
		if [ "$n" -gt 0 ]; then
			echo "caught       $name ($n failed checks)"
		else
			echo "caught       $name (no verdict: $(tail -n 1 "$tmp.log" | cut -c1-60))"
		fi
	fi
}
# A fragment rows/columns exchanged (a1 <-> a2: (g, k+8) taken for (g+8, k))
mutant "A fragment from ldmatrix with a1/a2 swapped" \
    's/((lane >> 3) \& 1) \* 8, c0 + (lane >> 4))/((lane >> 4) \& 1) * 8, c0 + ((lane >> 3) \& 1))/'
# B fragment: b0 and b1 (k 0-7 and k 8-15) exchanged
mutant "B fragment with b0/b1 swapped" 's/f2_sw<HD>(r0 + (lane \& 7), c0 + (lane >> 3))/f2_sw<HD>(r0 + (lane \& 7), c0 + ((lane >> 3) ^ 1))/'
# accumulator layout: c1 taken as row g+8 instead of column 2tq+1
mutant "accumulator c1/c2 confused when storing" 's/f2_pack(acc\[n\]\[0\] \* f0, acc\[n\]\[1\] \* f0)/f2_pack(acc[n][0] * f0, acc[n][2] * f0)/'
# P's accumulators used as A fragments in the wrong order (a1 <-> a2)
mutant "P accumulators to A fragment in the wrong order" \
    '0,/f2_pack(s\[2 \* kk\]\[2\], s\[2 \* kk\]\[3\]),/s//f2_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),/'
# V (forward P V) and K (dQ pass dS K) loaded without .trans in f2_mma_px
mutant "V's and K's B fragments without ldmatrix.trans" 's/f2_ldsm_x4_t(xb, f2_at<HD>(x,/f2_ldsm_x4(xb, f2_at<HD>(x,/'
# the causal mask left out of the forward
mutant "forward without the causal mask" 's/if (!(key <= t \&\& st >= 0/if (!(st >= 0/'
# the seg (packing) mask left out of the dK/dV pass
mutant "dK/dV pass without the seg mask" 's/(!sg || ssk\[key - k0\] == sqv)/(1)/'
# the forward's unmasked fast path taken on the diagonal tile
mutant "forward fast path on the diagonal" 's/k0 + 63 > q0 + w0 ||/k0 + 63 > q0 + w0 + 16 ||/'
# the online softmax without rescaling O
mutant "online softmax without rescaling O" 's/o\[n\]\[0\] \*= a0;/o[n][0] *= 1.0f;/'
# the row max reduced over the wrong lanes (xor 4: another row's quad)
mutant "row max over the wrong lanes" '0,/x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));/s//x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 4));/'
# the staged output read back without the swizzle
mutant "staging tile read without the swizzle" 's/\*reinterpret_cast<const uint4 \*>(tile + f2_sw<HD>(r0 + r, c))/*reinterpret_cast<const uint4 *>(tile + (r0 + r) * HD + c * 8)/'
# the dK/dV pass skipping a warp whose keys meet the query tile's last rows
mutant "dK/dV pass skipping work on the diagonal" 's/if (k0 + w0 <= m0 + BM - 1) {/if (k0 + w0 + 16 <= m0 + BM - 1) {/'
# D = rowsum(dO * O) over half the row
mutant "D over half a row" 's/acc += __shfl_xor_sync(0xffffffffu, acc, 1);/acc += 0.0f;/'
# the cp.async pipelines: no wait for the current tile (all three kernels); prefetch into the
# buffer in use (forward); a query tile loaded into the other buffer (dK/dV pass)
mutant "no cp.async.wait_group before using a tile" 's/			f2_cp_wait(1);/			;/'
mutant "forward prefetching into the buffer in use" 's/bf16 \*nk = skv + ((it + 1) \& 1)/bf16 *nk = skv + (it \& 1)/'
mutant "dK/dV pass loading a query tile into the wrong buffer" 's/m0 = mfirst + (i % nm) \* BM, bf_ = i \& 1;/m0 = mfirst + (i % nm) * BM, bf_ = (i + 1) \& 1;/'
# the split dK/dV pass (few blocks: query heads in chunks, f32 partials, k_f2_dkv_sum)
mutant "dK/dV chunks starting at the wrong head" 's/int h0 = kvh \* G + chunk \* hper;/int h0 = kvh * G + chunk;/'
mutant "chunk sum leaving out the last chunk" 's/for (int c = 0; c < nch; c++) {/for (int c = 0; c < nch - 1; c++) {/'
# the barrier after a tile is used left out (forward, dQ pass, dK/dV pass): the next
# prefetch refills the buffer while a slower warp may still read it (run.sh's skew cases)
mutant "forward refilling a buffer without a barrier" drop:1
mutant "dQ pass refilling a buffer without a barrier" drop:2
mutant "dK/dV pass refilling a buffer without a barrier" drop:3
# the fused backward (RL_CUDA_FLASH_BWD=fused): dQ by atomics from the dK/dV pass, one
# barrier per tile (dQ of the previous tile from the other dS^T buffer)
mutant "fused: dQ over the dS^T rows of warps without work" 's/				if (kk < nkp) {/				if (1) {/'
mutant "fused: dS read for dQ without ldmatrix.trans" 's/f2_ldsm_x4_t(a, f2_at_t/f2_ldsm_x4(a, f2_at_t/'
mutant "fused: dS A fragment with a1/a2 swapped" \
    's/((lane >> 4) \& 1) \* 8, c0 + ((lane >> 3) \& 1))/((lane >> 3) \& 1) * 8, c0 + ((lane >> 4) \& 1))/'
mutant "fused: dQ row g + 8 added to row g" 's/f2_red2(qrow + 8 \* OW + 8 \* n,/f2_red2(qrow + 8 * n,/'
mutant "fused: D over part of a row" 's/for (int o = per \/ 2; o > 0; o >>= 1)/for (int o = per \/ 2; o > 1; o >>= 1)/'
mutant "fused: half of the dQ accumulator not zeroed" '/(dqacc + r \* HD + sub \* 8)\[1\] = z;/d'
mutant "fused: one dS^T buffer (written while the previous tile's is read)" \
    's/, \*sds = sds2 + bf_ \* F2_ROWS \* BM;/, *sds = sds2;/; s/const bf16 \*sds = sds2 + ((it - 1) \& 1) \* F2_ROWS \* BM;/const bf16 *sds = sds2;/'
mutant "fused: next tile's lse, D, segments stored over the current ones" 's/int nb = (bf_ ^ 1) \* BM/int nb = bf_ * BM/'
mutant "fused: no barrier per tile" '/tile it is in; tile it - 1 is done with/d'
mutant "fused: dK/dV staged through K while a warp may still read it for dQ" '/ \* a barrier first \*\//{n;d}'
rm -f "$tmp" "$tmp.log"
exit $missed

/*
 * ops_cpu_gemm512.h — the AVX-512 GEMM micro-kernel in intrinsics, included
 * once by lib/compute/ops_cpu.c.  Same contract as the template in ops_cpu_gemm.h
 * (gemm_tile_<SFX>): on an (m, n) tile
 *   c[i*ldc + j] (+)= sum_k a[i*lda + k*ak] * B[k][j],
 *   B[k][j] = b[k*ldb + j] (btrans 0) or b[j*ldb + k] (btrans 1),
 * each panel of 32 columns packed, zero-padded, into bbuf (k*32 floats).
 *
 * Why not the template: GCC kept the template's generic-vector accumulators
 * and B rows partly on the stack (a store and a reload per FMA pair in the
 * inner loop), ~70 GFLOP/s of a core's ~168.  Here the micro-tile is
 * G5_MR rows x 32 columns, 2*G5_MR accumulators + 2 B vectors in the 32 zmm
 * registers, and A is addressed in one of the two layouts the callers use:
 * rows contiguous in k (ak = 1: the forward and dinp products, Q K^T, P V),
 * or columns contiguous (lda = 1: the weight gradients, dK, dV), each with
 * a loop whose addresses are base + constant offsets.  Any other layout
 * takes a generic loop.  The sum order per output is the same as the
 * template's (k in order, one FMA each), so results are bitwise the same.
 */
#include <immintrin.h>

#define G5_MR 12
#define G5_T __attribute__((target("avx512f,avx2,fma")))

/* acc[2i], acc[2i+1] (+)= A row i (k steps) times the packed panel bp; the row
 * i element at step kk is A(i, kk), addressed by the layout (see above) */
#define G5_LOOP(AV)                                                                         \
	for (int kk = 0; kk < k; kk++) {                                                    \
		__m512 b0 = _mm512_loadu_ps(bp + (long)kk * 32);                            \
		__m512 b1 = _mm512_loadu_ps(bp + (long)kk * 32 + 16);                       \
		_Pragma("GCC unroll 16")                                                    \
		for (int i = 0; i < G5_MR; i++) {                                           \
			__m512 av = _mm512_set1_ps(AV);                                     \
			acc[2 * i] = _mm512_fmadd_ps(av, b0, acc[2 * i]);                   \
			acc[2 * i + 1] = _mm512_fmadd_ps(av, b1, acc[2 * i + 1]);           \
		}                                                                           \
	}

G5_T static void
gemm_tile_avx512i(float *c, long ldc, const float *a, long lda, long ak,
    const float *b, long ldb, int btrans, int m, int n, int k, int accum, float *bbuf)
{
	for (int j0 = 0; j0 < n; j0 += 32) {
		int nr = n - j0 < 32 ? n - j0 : 32;
		if (btrans) {
			for (int j = 0; j < 32; j++) {
				const float *src = b + (long)(j0 + j) * ldb;
				if (j < nr)
					for (int kk = 0; kk < k; kk++)
						bbuf[(long)kk * 32 + j] = src[kk];
				else
					for (int kk = 0; kk < k; kk++)
						bbuf[(long)kk * 32 + j] = 0.0f;
			}
		} else if (nr == 32) {
			for (int kk = 0; kk < k; kk++)
				memcpy(bbuf + (long)kk * 32, b + (long)kk * ldb + j0, 32 * sizeof(float));
		} else {
			for (int kk = 0; kk < k; kk++)
				for (int j = 0; j < 32; j++)
					bbuf[(long)kk * 32 + j] = j < nr ? b[(long)kk * ldb + j0 + j] : 0.0f;
		}
		const float *bp = bbuf;
		__mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
		__mmask16 m1 = nr <= 16 ? 0 : nr == 32 ? 0xffff : (__mmask16)((1u << (nr - 16)) - 1);
		for (int i0 = 0; i0 < m; i0 += G5_MR) {
			int mr = m - i0 < G5_MR ? m - i0 : G5_MR;
			__m512 acc[2 * G5_MR];
#pragma GCC unroll 32
			for (int i = 0; i < 2 * G5_MR; i++)
				acc[i] = _mm512_setzero_ps();
			if (mr == G5_MR && lda == 1) {
				const float *p = a + i0;
				G5_LOOP(p[(long)kk * ak + i]);
			} else if (mr == G5_MR && ak == 1) {
				/* four bases three rows apart, each row at base + 0/1/2 lda */
				const float *p0 = a + (long)i0 * lda, *p3 = p0 + 3 * lda, *p6 = p0 + 6 * lda,
				    *p9 = p0 + 9 * lda;
				for (int kk = 0; kk < k; kk++) {
					__m512 b0 = _mm512_loadu_ps(bp + (long)kk * 32);
					__m512 b1 = _mm512_loadu_ps(bp + (long)kk * 32 + 16);
					const float *q[4] = { p0 + kk, p3 + kk, p6 + kk, p9 + kk };
#pragma GCC unroll 16
					for (int i = 0; i < G5_MR; i++) {
						__m512 av = _mm512_set1_ps(q[i / 3][(i % 3) * lda]);
						acc[2 * i] = _mm512_fmadd_ps(av, b0, acc[2 * i]);
						acc[2 * i + 1] = _mm512_fmadd_ps(av, b1, acc[2 * i + 1]);
					}
				}
			} else {
				/* edge rows (mr < G5_MR) recompute row 0; their results are dropped */
				const float *ap[G5_MR];
				for (int i = 0; i < G5_MR; i++)
					ap[i] = a + (long)(i0 + (i < mr ? i : 0)) * lda;
				G5_LOOP(ap[i][(long)kk * ak]);
			}
			float *cp = c + (long)i0 * ldc + j0;
#pragma GCC unroll 16
			for (int i = 0; i < G5_MR; i++) {
				if (i >= mr)
					break;
				float *r = cp + (long)i * ldc;
				if (nr == 32) {
					if (accum) {
						acc[2 * i] = _mm512_add_ps(_mm512_loadu_ps(r), acc[2 * i]);
						acc[2 * i + 1] = _mm512_add_ps(_mm512_loadu_ps(r + 16), acc[2 * i + 1]);
					}
					_mm512_storeu_ps(r, acc[2 * i]);
					_mm512_storeu_ps(r + 16, acc[2 * i + 1]);
				} else {
					if (accum) {
						acc[2 * i] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, r), acc[2 * i]);
						acc[2 * i + 1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, r + 16),
						    acc[2 * i + 1]);
					}
					_mm512_mask_storeu_ps(r, m0, acc[2 * i]);
					_mm512_mask_storeu_ps(r + 16, m1, acc[2 * i + 1]);
				}
			}
		}
	}
}

#undef G5_LOOP
#undef G5_T

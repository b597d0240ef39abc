/*
 * ops_cpu_gemm.h — the CPU GEMM micro-kernel, a template included by
 * lib/compute/ops_cpu.c once per instruction set (no include guard on purpose).
 *
 * Before including, define GEMM_SFX (name suffix), GEMM_VL (floats per
 * vector), GEMM_MR (rows per micro-tile) and GEMM_TARGET (a target attribute
 * or nothing).  Defines gemm_tile_<SFX>, which computes on an (m, n) tile
 *   c[i*ldc + j] (+)= sum_k a[i*lda + k*ak] * B[k][j],
 *   B[k][j] = b[k*ldb + j] (btrans 0) or b[j*ldb + k] (btrans 1),
 * with micro-tiles of GEMM_MR rows by NR = 2*GEMM_VL columns held in vector
 * registers (one row of the B panel is two vectors, a is broadcast).  Each
 * panel of NR columns is first copied, zero-padded, into bbuf (k*NR floats) so
 * the micro-kernel streams it contiguously: a long stride through B would map
 * every row to the same few L1 sets.  accum = 0 overwrites c.
 *
 * Leaves out: blocking over m, n, k and threading (the driver in ops_cpu.c).
 */
#define GEMM_NR (2 * GEMM_VL)
#define GEMM_CAT_(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT_(a, b)

GEMM_TARGET static void
GEMM_CAT(gemm_tile_, GEMM_SFX)(float *c, long ldc, const float *a, long lda, long ak,
    const float *b, long ldb, int btrans, int m, int n, int k, int accum, float *bbuf)
{
	typedef float vt __attribute__((vector_size(GEMM_VL * 4), aligned(4), may_alias));

	for (int j0 = 0; j0 < n; j0 += GEMM_NR) {
		int nr = n - j0 < GEMM_NR ? n - j0 : GEMM_NR;
		const float *bp = bbuf;
		const long ldbp = GEMM_NR;
		if (btrans) {
			for (int j = 0; j < GEMM_NR; j++) {
				const float *src = b + (long)(j0 + j) * ldb;
				if (j < nr)
					for (int kk = 0; kk < k; kk++)
						bbuf[(long)kk * GEMM_NR + j] = src[kk];
				else
					for (int kk = 0; kk < k; kk++)
						bbuf[(long)kk * GEMM_NR + j] = 0.0f;
			}
		} else if (nr == GEMM_NR) {
			for (int kk = 0; kk < k; kk++)
				memcpy(bbuf + (long)kk * GEMM_NR, b + (long)kk * ldb + j0, GEMM_NR * sizeof(float));
		} else {
			for (int kk = 0; kk < k; kk++)
				for (int j = 0; j < GEMM_NR; j++)
					bbuf[(long)kk * GEMM_NR + j] = j < nr ? b[(long)kk * ldb + j0 + j] : 0.0f;
		}
		for (int i0 = 0; i0 < m; i0 += GEMM_MR) {
			int mr = m - i0 < GEMM_MR ? m - i0 : GEMM_MR;
			const float *ap[GEMM_MR];
			vt acc0[GEMM_MR], acc1[GEMM_MR];
#pragma GCC unroll 16
			for (int i = 0; i < GEMM_MR; i++) {
				/* rows past the edge recompute row 0; their results are dropped */
				ap[i] = a + (long)(i0 + (i < mr ? i : 0)) * lda;
				acc0[i] = (vt){ 0 };
				acc1[i] = (vt){ 0 };
			}
			for (int kk = 0; kk < k; kk++) {
				vt b0 = *(const vt *)(bp + (long)kk * ldbp);
				vt b1 = *(const vt *)(bp + (long)kk * ldbp + GEMM_VL);
#pragma GCC unroll 16
				for (int i = 0; i < GEMM_MR; i++) {
					float av = ap[i][(long)kk * ak];
					acc0[i] += b0 * av;
					acc1[i] += b1 * av;
				}
			}
			float *cp = c + (long)i0 * ldc + j0;
			if (nr == GEMM_NR) {
#pragma GCC unroll 16
				for (int i = 0; i < GEMM_MR; i++) {
					if (i >= mr)
						break;
					vt *c0 = (vt *)(cp + (long)i * ldc), *c1 = (vt *)(cp + (long)i * ldc + GEMM_VL);
					if (accum) {
						*c0 += acc0[i];
						*c1 += acc1[i];
					} else {
						*c0 = acc0[i];
						*c1 = acc1[i];
					}
				}
			} else {
				for (int i = 0; i < mr; i++) {
					float tmp[GEMM_NR];
					*(vt *)tmp = acc0[i];
					*(vt *)(tmp + GEMM_VL) = acc1[i];
					for (int j = 0; j < nr; j++)
						cp[(long)i * ldc + j] = (accum ? cp[(long)i * ldc + j] : 0.0f) + tmp[j];
				}
			}
		}
	}
}

#undef GEMM_NR
#undef GEMM_SFX
#undef GEMM_VL
#undef GEMM_MR
#undef GEMM_TARGET

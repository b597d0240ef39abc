/*
 * flash2.cu — causal flash attention, forward and backward, on the tensor cores
 * through mma.sync.m16n8k16 (bf16 operands, f32 accumulation) and ldmatrix, with
 * the scores, probabilities and output kept in the mma accumulator registers
 * (FlashAttention-2 style).  Contract of ops->attn_fwd / attn_bwd (lib/compute/ops.h):
 * qkv (B, T, (NH + 2 NKV) HD) bf16, GQA (query head h reads kv head h / G),
 * causal plus the seg mask (key s visible to query t iff s <= t and seg[s] ==
 * seg[t]; seg[t] < 0: out 0, lse 0, no gradient), lse (B, NH, T) f32 natural
 * log, dqkv overwritten.  HD 64 or 128 (rlk_flash2_ok); other shapes use attn.cu.
 *
 * Tiling (4 warps per block, each warp owns 16 rows of the block's 64):
 *   forward  k_f2_fwd: block = 64 queries of one (batch row, head); key/value
 *            tiles of 64 rows staged in shared memory; S = Q K^T, the online
 *            softmax (log2 domain, exp2f) and O += P V on the fragments; P is
 *            rounded to bf16 for P V (as attn.cu and flash.cu).
 *   backward k_f2_bwd_dq: block = 64 queries; writes D = rowsum(dO * O) to a
 *            scratch (B, NH, T) f32, then over the key tiles recomputes P =
 *            exp(S scale - lse), dP = dO V^T, dS = P (dP - D) scale, dQ += dS K.
 *            k_f2_bwd_dkv: block = 64 keys of one (batch row, kv head); over the
 *            G query heads of the group and the query tiles at or after the
 *            keys: recomputes S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK +=
 *            dS^T Q, so dK, dV of a GQA group are summed in registers.  With
 *            few such blocks (f2_hper) the heads are split over blocks and
 *            k_f2_dkv_sum adds their f32 partials, in order.
 *   dQ by a separate pass, not f32 atomics: every output element is written
 *   once by one block, so the backward is deterministic (bit for bit run to
 *   run) and needs no (B, T, NH, HD) f32 buffer nor a cast kernel; the price is
 *   recomputing S and dP for dQ (8 instead of 5 GEMM-sized products).  That is
 *   RL_CUDA_FLASH_BWD=det, the default.  The fused modes (k_f2_bwd_fused, below)
 *   take the other side: one pass, dQ added by f32 atomics into a zeroed
 *   accumulator and cast after (k_f2_bwd_prep, k_f2_dq_cast); dQ's low bits
 *   then vary run to run.
 * Shared memory tiles are row-major with the 16-byte chunks of a row XOR-swizzled
 * by (row & 7), so the 8 row addresses of an ldmatrix hit 8 different bank
 * groups.  Global loads are 16-byte cp.async into two buffers: the next tile is
 * in flight while the current one is used.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16, lane = 4 groupID + tq):
 *   A (16x16 row): a0 (g, 2tq..+1), a1 (g+8, 2tq..), a2 (g, 2tq+8..), a3 (g+8, 2tq+8..)
 *   B (16x8 col):  b0 (k 2tq..+1, n g), b1 (k 2tq+8..+9, n g)
 *   C (16x8):      c0,c1 (g, 2tq..+1), c2,c3 (g+8, 2tq..+1)
 * so an accumulator pair of n-tiles 2kk, 2kk+1 is the A fragment of k-step kk.
 * kernels/emu runs this source on the CPU with those layouts emulated.
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

/* ==== flash2 primitives: inline PTX; kernels/emu/cuda_emu.h has CPU versions ==== */
/* d (16x8 f32) += a (16x16 bf16, row) b (16x8 bf16, col), fragments as above */
static __device__ __forceinline__ void
f2_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* four 8x8 bf16 matrices from shared memory: lane 8i + j gives the address of row j
 * of matrix i; r[i] of lane l = (row l/4, columns 2(l%4), +1) of matrix i */
static __device__ __forceinline__ void
f2_ldsm_x4(uint32_t *r, const bf16 *p)
{
	unsigned a = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

/* the same, transposed: r[i] of lane l = (rows 2(l%4), +1; column l/4) of matrix i */
static __device__ __forceinline__ void
f2_ldsm_x4_t(uint32_t *r, const bf16 *p)
{
	unsigned a = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

/* 16 bytes global -> shared, asynchronously (cp.async.cg: through L2 only); complete
 * after f2_cp_commit and an f2_cp_wait that covers its group */
static __device__ __forceinline__ void
f2_cp16(bf16 *dst, const bf16 *src)
{
	unsigned a = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(a), "l"(src) : "memory");
}

static __device__ __forceinline__ void
f2_cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" : : : "memory");
}

/* wait until at most n (0 or 1) of this thread's committed groups are pending */
static __device__ __forceinline__ void
f2_cp_wait(int n)
{
	if (n)
		asm volatile("cp.async.wait_group 1;\n" : : : "memory");
	else
		asm volatile("cp.async.wait_group 0;\n" : : : "memory");
}

/* p[0] += a, p[1] += b atomically in global memory (p 8-byte aligned); sm_90 has a
 * two-float red, older GPUs two */
static __device__ __forceinline__ void
f2_red2(float *p, float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	atomicAdd(reinterpret_cast<float2 *>(p), make_float2(a, b));
#else
	atomicAdd(p, a);
	atomicAdd(p + 1, b);
#endif
}

#define F2_SMEM(name, bytes) extern __shared__ __align__(128) unsigned char name[]

/* ==== flash2 kernels (cut out unchanged by kernels/emu/run.sh) ==== */
#define F2_WARPS 4
#define F2_ROWS 64          /* rows (queries or keys) a block owns: 16 per warp */
#define F2_LOG2E 1.4426950408889634f
#define F2_LN2 0.6931471805599453f
#define F2_FUSED32_MINB 4   /* blocks per SM asked for the fused backward with 32-query tiles */

/* bytes of shared memory per block */
template <int HD> __host__ __device__ constexpr int f2_bk() { return HD == 64 ? 64 : 32; }  /* inner tile rows */
template <int HD> __host__ __device__ constexpr int f2_fwd_smem() { return (F2_ROWS + 4 * 64) * HD * 2 + 2 * 64 * 4; }
template <int HD> __host__ __device__ constexpr int f2_dq_smem() { return (2 * F2_ROWS + 4 * f2_bk<HD>()) * HD * 2 + F2_ROWS * 4 + 2 * f2_bk<HD>() * 4; }
template <int HD> __host__ __device__ constexpr int f2_dkv_smem() { return (2 * F2_ROWS + 4 * f2_bk<HD>()) * HD * 2 + F2_ROWS * 4 + 2 * f2_bk<HD>() * 12; }
template <int HD, int BM> __host__ __device__ constexpr int f2_fus_smem() { return (2 * F2_ROWS + 4 * BM) * HD * 2 + 2 * F2_ROWS * BM * 2 + F2_ROWS * 4 + 2 * BM * 12; }

static __device__ __forceinline__ int f2_imin(int a, int b) { return a < b ? a : b; }

/* element offset of 16-byte chunk c of row r in a swizzled tile of HD-element rows */
template <int HD>
static __device__ __forceinline__ int
f2_sw(int r, int c)
{
	return r * HD + ((c ^ (r & 7)) << 3);
}

/* the same for a tile of W-element rows, W 64 (as above) or 32 (4 chunks a row: XOR with
 * (r / 2) & 3, so the 8 rows of an ldmatrix phase still hit 8 bank groups) */
template <int W>
static __device__ __forceinline__ int
f2_swr(int r, int c)
{
	return W >= 64 ? r * W + ((c ^ (r & 7)) << 3) : r * W + ((c ^ ((r >> 1) & 3)) << 3);
}

/* ldmatrix.trans row address of this lane for the A fragment of a k-major tile: rows are
 * the k index (r0..r0+15), 16-byte chunks c0, c0+1 the fragment's 16 rows (A = tile^T) */
template <int W>
static __device__ __forceinline__ const bf16 *
f2_at_t(const bf16 *t, int r0, int c0, int lane)
{
	return t + f2_swr<W>(r0 + (lane & 7) + ((lane >> 4) & 1) * 8, c0 + ((lane >> 3) & 1));
}

/* ldmatrix row address of this lane for an A fragment (rows r0..r0+15, chunks c0, c0+1)
 * or, with .trans, for the B fragments of two n-tiles (k rows r0..r0+15, chunks c0, c0+1) */
template <int HD>
static __device__ __forceinline__ const bf16 *
f2_at(const bf16 *t, int r0, int c0, int lane)
{
	return t + f2_sw<HD>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c0 + (lane >> 4));
}

/* ... for the B fragments of two k-steps of one n-tile (n rows r0..r0+7, chunks c0..c0+3) */
template <int HD>
static __device__ __forceinline__ const bf16 *
f2_bt(const bf16 *t, int r0, int c0, int lane)
{
	return t + f2_sw<HD>(r0 + (lane & 7), c0 + (lane >> 3));
}

static __device__ __forceinline__ uint32_t
f2_pack(float lo, float hi)
{
	return (uint32_t)__bfloat16_as_ushort(tobf(lo)) | ((uint32_t)__bfloat16_as_ushort(tobf(hi)) << 16);
}

/* acc (this warp's 16 x HD, HD/8 accumulator fragments) += P X: P is this warp's
 * 16 x 16 NK scores s (2 NK accumulator fragments, packed to bf16 A fragments),
 * X the 16 NK x HD tile x in shared memory (swizzled, read with ldmatrix.trans):
 * the forward's O += P V and the backward's dQ += dS K */
template <int HD, int NK>
static __device__ __forceinline__ void
f2_mma_px(float (*acc)[4], float (*s)[4], const bf16 *x, int lane)
{
#pragma unroll
	for (int kk = 0; kk < NK; kk++) {
		uint32_t pa[4] = { f2_pack(s[2 * kk][0], s[2 * kk][1]), f2_pack(s[2 * kk][2], s[2 * kk][3]),
		    f2_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), f2_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
#pragma unroll
		for (int n = 0; n < HD / 16; n++) {
			uint32_t xb[4];
			f2_ldsm_x4_t(xb, f2_at<HD>(x, 16 * kk, 2 * n, lane));
			f2_mma(acc[2 * n], pa, xb[0], xb[1]);
			f2_mma(acc[2 * n + 1], pa, xb[2], xb[3]);
		}
	}
}

/* rows row0.. row0+R-1 (HD columns starting at src, row stride ld) into a swizzled tile
 * by cp.async; rows at or past T are zeroed by plain stores.  The caller commits. */
template <int HD, int R>
static __device__ __forceinline__ void
f2_load_async(bf16 *dst, const bf16 *src, size_t ld, int row0, int T)
{
	for (int i = threadIdx.x; i < R * HD / 8; i += F2_WARPS * 32) {
		int r = i / (HD / 8), c = i % (HD / 8);
		if (row0 + r < T)
			f2_cp16(dst + f2_sw<HD>(r, c), src + (size_t)(row0 + r) * ld + c * 8);
		else
			*reinterpret_cast<uint4 *>(dst + f2_sw<HD>(r, c)) = make_uint4(0, 0, 0, 0);
	}
}

/* a warp's 16 x HD f32 accumulators (n-tile n: columns 8n..8n+7), times the row factors
 * f0 (row g) and f1 (row g+8), into its rows r0.. of a swizzled tile, then to global rows
 * row0 + r (r0 + r < T) with stride ld */
template <int HD>
static __device__ __forceinline__ void
f2_store(bf16 *dst, size_t ld, int row0, int T, bf16 *tile, int r0, float (*acc)[4], float f0, float f1, int lane)
{
	int g = lane >> 2, tq = lane & 3;
#pragma unroll
	for (int n = 0; n < HD / 8; n++) {
		*reinterpret_cast<uint32_t *>(tile + f2_sw<HD>(r0 + g, n) + 2 * tq) = f2_pack(acc[n][0] * f0, acc[n][1] * f0);
		*reinterpret_cast<uint32_t *>(tile + f2_sw<HD>(r0 + g + 8, n) + 2 * tq) = f2_pack(acc[n][2] * f1, acc[n][3] * f1);
	}
	__syncwarp();
	for (int i = lane; i < 16 * HD / 8; i += 32) {
		int r = i / (HD / 8), c = i % (HD / 8);
		if (row0 + r0 + r < T)
			*reinterpret_cast<uint4 *>(dst + (size_t)(row0 + r0 + r) * ld + c * 8) =
			    *reinterpret_cast<const uint4 *>(tile + f2_sw<HD>(r0 + r, c));
	}
}

/* grid (ceil(T / 64), NH, B), F2_WARPS * 32 threads; sl2 = log2(e) / sqrt(HD) */
template <int HD>
__global__ void __launch_bounds__(F2_WARPS * 32)
k_f2_fwd(bf16 *out, float *lse, const bf16 *qkv, const int32_t *seg, int T, int NH, int NKV, float sl2)
{
	F2_SMEM(f2_fwd_raw, f2_fwd_smem<HD>());
	/* Q, then two buffers of K, V and the keys' segments: tile i in buffer i & 1 */
	bf16 *sq = reinterpret_cast<bf16 *>(f2_fwd_raw), *skv = sq + F2_ROWS * HD;
	int32_t *ssk2 = reinterpret_cast<int32_t *>(skv + 4 * 64 * HD);
	int qb = (int)gridDim.x - 1 - (int)blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	int q0 = qb * F2_ROWS, w0 = warp * 16;
	size_t LD = (size_t)(NH + 2 * NKV) * HD;
	const bf16 *base = qkv + (size_t)b * T * LD;
	const bf16 *kbase = base + (size_t)(NH + kvh) * HD, *vbase = base + (size_t)(NH + NKV + kvh) * HD;
	const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
	/* this lane's two query rows and their segments (-1: padding or past T) */
	int t0 = q0 + w0 + g, t1 = t0 + 8;
	int sq0 = t0 < T ? (sg ? sg[t0] : 0) : -1, sq1 = t1 < T ? (sg ? sg[t1] : 0) : -1;
	int qlast = f2_imin(T, q0 + F2_ROWS) - 1, ntile = qlast / 64 + 1;

	/* group 0: Q and key tile 0 */
	f2_load_async<HD, F2_ROWS>(sq, base + (size_t)h * HD, LD, q0, T);
	f2_load_async<HD, 64>(skv, kbase, LD, 0, T);
	f2_load_async<HD, 64>(skv + 64 * HD, vbase, LD, 0, T);
	if (sg)
		for (int i = threadIdx.x; i < 64; i += F2_WARPS * 32)
			ssk2[i] = i < T ? sg[i] : -2;
	f2_cp_commit();

	uint32_t qf[HD / 16][4];
	float o[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
	float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  /* m in log2 units; l per lane */

	for (int it = 0; it < ntile; it++) {
		int k0 = it * 64;
		bf16 *sk = skv + (it & 1) * 2 * 64 * HD, *sv = sk + 64 * HD;
		int32_t *ssk = ssk2 + (it & 1) * 64;
		/* prefetch tile it + 1 into the other buffer (free: the barrier at the end of
		 * the previous iteration), then wait for tile it */
		if (it + 1 < ntile) {
			bf16 *nk = skv + ((it + 1) & 1) * 2 * 64 * HD;
			f2_load_async<HD, 64>(nk, kbase, LD, k0 + 64, T);
			f2_load_async<HD, 64>(nk + 64 * HD, vbase, LD, k0 + 64, T);
			if (sg)
				for (int i = threadIdx.x; i < 64; i += F2_WARPS * 32)
					ssk2[((it + 1) & 1) * 64 + i] = k0 + 64 + i < T ? sg[k0 + 64 + i] : -2;
			f2_cp_commit();
			f2_cp_wait(1);
		} else {
			f2_cp_wait(0);
		}
		__syncthreads();
		if (it == 0)
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++)
				f2_ldsm_x4(qf[kk], f2_at<HD>(sq, w0, 2 * kk, lane));

		float s[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
			s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk += 2)
#pragma unroll
			for (int j = 0; j < 8; j++) {
				uint32_t kb[4];
				f2_ldsm_x4(kb, f2_bt<HD>(sk, 8 * j, 2 * kk, lane));
				f2_mma(s[j], qf[kk], kb[0], kb[1]);
				f2_mma(s[j], qf[kk + 1], kb[2], kb[3]);
			}
		/* masks: needed unless every key of the tile is at or before the warp's first row */
		if (sg || k0 + 63 > q0 + w0 || sq0 < 0 || sq1 < 0) {
#pragma unroll
			for (int j = 0; j < 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int key = k0 + 8 * j + 2 * tq + (e & 1), t = e < 2 ? t0 : t1, st = e < 2 ? sq0 : sq1;
					if (!(key <= t && st >= 0 && (!sg || ssk[key - k0] == st)))
						s[j][e] = -INFINITY;
				}
		}
		/* online softmax per row: max over the quad (the 4 lanes of a row) */
		float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			x0 = fmaxf(x0, fmaxf(s[j][0], s[j][1]));
			x1 = fmaxf(x1, fmaxf(s[j][2], s[j][3]));
		}
		x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
		x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
		x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
		x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
		float n0 = fmaxf(m0, x0 * sl2), n1 = fmaxf(m1, x1 * sl2);
		float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;  /* all masked so far */
		float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
		m0 = n0;
		m1 = n1;
		l0 *= a0;
		l1 *= a1;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			s[j][0] = exp2f(s[j][0] * sl2 - b0);
			s[j][1] = exp2f(s[j][1] * sl2 - b0);
			s[j][2] = exp2f(s[j][2] * sl2 - b1);
			s[j][3] = exp2f(s[j][3] * sl2 - b1);
			l0 += s[j][0] + s[j][1];
			l1 += s[j][2] + s[j][3];
		}
#pragma unroll
		for (int n = 0; n < HD / 8; n++) {
			o[n][0] *= a0;
			o[n][1] *= a0;
			o[n][2] *= a1;
			o[n][3] *= a1;
		}
		/* O += P V: P's accumulators are the A fragments; V's B fragments by ldmatrix.trans */
		f2_mma_px<HD, 4>(o, s, sv, lane);
		__syncthreads();  /* this buffer is read: the next iteration may refill it */
	}
	l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
	l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
	/* out = O / l (0 for rows without a visible key: padding); lse = ln 2 (m + log2 l) */
	f2_store<HD>(out + (size_t)b * T * NH * HD + (size_t)h * HD, (size_t)NH * HD, q0, T, sq, w0, o,
	    l0 > 0.0f ? 1.0f / l0 : 0.0f, l1 > 0.0f ? 1.0f / l1 : 0.0f, lane);
	if (tq == 0) {
		float *lr = lse + ((size_t)b * NH + h) * T;
		if (t0 < T)
			lr[t0] = l0 > 0.0f ? (m0 + log2f(l0)) * F2_LN2 : 0.0f;
		if (t1 < T)
			lr[t1] = l1 > 0.0f ? (m1 + log2f(l1)) * F2_LN2 : 0.0f;
	}
}

/* Backward, pass 1: dQ (and D).  grid (ceil(T / 64), NH, B).  Ds: (B, NH, T) f32 out. */
template <int HD>
__global__ void __launch_bounds__(F2_WARPS * 32)
k_f2_bwd_dq(bf16 *dqkv, float *Ds, const bf16 *dout, const bf16 *out, const float *lse, const bf16 *qkv,
    const int32_t *seg, int T, int NH, int NKV, float sl2, float scale)
{
	constexpr int BK = f2_bk<HD>();
	F2_SMEM(f2_dq_raw, f2_dq_smem<HD>());
	/* Q, dO, then two buffers of K, V (BK rows each); D; two buffers of key segments */
	bf16 *sq = reinterpret_cast<bf16 *>(f2_dq_raw), *sdo = sq + F2_ROWS * HD, *skv = sdo + F2_ROWS * HD;
	float *sD = reinterpret_cast<float *>(skv + 4 * BK * HD);
	int32_t *ssk2 = reinterpret_cast<int32_t *>(sD + F2_ROWS);
	int qb = (int)gridDim.x - 1 - (int)blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	int q0 = qb * F2_ROWS, w0 = warp * 16;
	size_t LD = (size_t)(NH + 2 * NKV) * HD, OW = (size_t)NH * HD;
	const bf16 *base = qkv + (size_t)b * T * LD;
	const bf16 *kbase = base + (size_t)(NH + kvh) * HD, *vbase = base + (size_t)(NH + NKV + kvh) * HD;
	const bf16 *dob = dout + (size_t)b * T * OW + (size_t)h * HD, *ob = out + (size_t)b * T * OW + (size_t)h * HD;
	const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
	int t0 = q0 + w0 + g, t1 = t0 + 8;
	int sq0 = t0 < T ? (sg ? sg[t0] : 0) : -1, sq1 = t1 < T ? (sg ? sg[t1] : 0) : -1;
	int qlast = f2_imin(T, q0 + F2_ROWS) - 1, ntile = qlast / BK + 1;

	/* group 0: Q, dO and key tile 0 */
	f2_load_async<HD, F2_ROWS>(sq, base + (size_t)h * HD, LD, q0, T);
	f2_load_async<HD, F2_ROWS>(sdo, dob, OW, q0, T);
	f2_load_async<HD, BK>(skv, kbase, LD, 0, T);
	f2_load_async<HD, BK>(skv + BK * HD, vbase, LD, 0, T);
	if (sg)
		for (int i = threadIdx.x; i < BK; i += F2_WARPS * 32)
			ssk2[i] = i < T ? sg[i] : -2;
	f2_cp_commit();
	{
		/* D = rowsum(dO * O) in f32: two lanes per row, half a row each */
		int r = w0 + (lane >> 1), t = q0 + r, d0 = (lane & 1) * (HD / 2);
		float acc = 0.0f;
		if (t < T)
			for (int d = d0; d < d0 + HD / 2; d += 8) {
				uint4 x = *reinterpret_cast<const uint4 *>(dob + (size_t)t * OW + d);
				uint4 y = *reinterpret_cast<const uint4 *>(ob + (size_t)t * OW + d);
				const bf16 *xe = reinterpret_cast<const bf16 *>(&x), *ye = reinterpret_cast<const bf16 *>(&y);
#pragma unroll
				for (int i = 0; i < 8; i++)
					acc += bf(xe[i]) * bf(ye[i]);
			}
		acc += __shfl_xor_sync(0xffffffffu, acc, 1);
		if ((lane & 1) == 0) {
			sD[r] = acc;
			if (t < T)
				Ds[((size_t)b * NH + h) * T + t] = acc;
		}
	}
	uint32_t qf[HD / 16][4], df[HD / 16][4];
	float D0 = 0.0f, D1 = 0.0f;
	const float *lr = lse + ((size_t)b * NH + h) * T;
	float L0 = t0 < T ? lr[t0] * F2_LOG2E : 0.0f, L1 = t1 < T ? lr[t1] * F2_LOG2E : 0.0f;
	float dq[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

	for (int it = 0; it < ntile; it++) {
		int k0 = it * BK;
		bf16 *sk = skv + (it & 1) * 2 * BK * HD, *sv = sk + BK * HD;
		int32_t *ssk = ssk2 + (it & 1) * BK;
		if (it + 1 < ntile) {
			bf16 *nk = skv + ((it + 1) & 1) * 2 * BK * HD;
			f2_load_async<HD, BK>(nk, kbase, LD, k0 + BK, T);
			f2_load_async<HD, BK>(nk + BK * HD, vbase, LD, k0 + BK, T);
			if (sg)
				for (int i = threadIdx.x; i < BK; i += F2_WARPS * 32)
					ssk2[((it + 1) & 1) * BK + i] = k0 + BK + i < T ? sg[k0 + BK + i] : -2;
			f2_cp_commit();
			f2_cp_wait(1);
		} else {
			f2_cp_wait(0);
		}
		__syncthreads();
		if (it == 0) {
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				f2_ldsm_x4(qf[kk], f2_at<HD>(sq, w0, 2 * kk, lane));
				f2_ldsm_x4(df[kk], f2_at<HD>(sdo, w0, 2 * kk, lane));
			}
			D0 = sD[w0 + g];
			D1 = sD[w0 + g + 8];
		}

		float s[BK / 8][4], dp[BK / 8][4];
#pragma unroll
		for (int j = 0; j < BK / 8; j++)
			s[j][0] = s[j][1] = s[j][2] = s[j][3] = dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk += 2)
#pragma unroll
			for (int j = 0; j < BK / 8; j++) {
				uint32_t kb[4], vb[4];
				f2_ldsm_x4(kb, f2_bt<HD>(sk, 8 * j, 2 * kk, lane));
				f2_mma(s[j], qf[kk], kb[0], kb[1]);
				f2_mma(s[j], qf[kk + 1], kb[2], kb[3]);
				f2_ldsm_x4(vb, f2_bt<HD>(sv, 8 * j, 2 * kk, lane));
				f2_mma(dp[j], df[kk], vb[0], vb[1]);
				f2_mma(dp[j], df[kk + 1], vb[2], vb[3]);
			}
		/* P = exp(S scale - lse) on visible keys; dS = P (dP - D) scale, over S */
		bool nomask = !sg && k0 + BK - 1 <= q0 + w0 && sq0 >= 0 && sq1 >= 0;
#pragma unroll
		for (int j = 0; j < BK / 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int key = k0 + 8 * j + 2 * tq + (e & 1), t = e < 2 ? t0 : t1, st = e < 2 ? sq0 : sq1;
				bool ok = nomask || (key <= t && st >= 0 && (!sg || ssk[key - k0] == st));
				float p = ok ? exp2f(s[j][e] * sl2 - (e < 2 ? L0 : L1)) : 0.0f;
				s[j][e] = p * (dp[j][e] - (e < 2 ? D0 : D1)) * scale;
			}
		/* dQ += dS K: K's B fragments by ldmatrix.trans */
		f2_mma_px<HD, BK / 16>(dq, s, sk, lane);
		__syncthreads();  /* this buffer is read: the next iteration may refill it */
	}
	f2_store<HD>(dqkv + (size_t)b * T * LD + (size_t)h * HD, LD, q0, T, sq, w0, dq, 1.0f, 1.0f, lane);
}

/* Backward, pass 2: dK, dV of 64 keys of one kv head, summed over hper of its G query
 * heads.  grid (ceil(T / 64), NKV x G / hper, B); Ds from pass 1.  hper = G: the sums
 * go to dqkv (bf16).  hper < G (few blocks otherwise): block (., kvh x nch + c, .) sums
 * heads c hper.. (c + 1) hper - 1 and writes f32 partials to part: dK of chunk c at
 * part[c n + ((b T + s) NKV + kvh) HD + d], dV at part[(nch + c) n + ...], n = B T NKV
 * HD; k_f2_dkv_sum adds the chunks in order. */
template <int HD>
__global__ void __launch_bounds__(F2_WARPS * 32)
k_f2_bwd_dkv(bf16 *dqkv, float *part, const float *Ds, const bf16 *dout, const float *lse, const bf16 *qkv,
    const int32_t *seg, int T, int NH, int NKV, int hper, float sl2, float scale)
{
	constexpr int BM = f2_bk<HD>();
	F2_SMEM(f2_dkv_raw, f2_dkv_smem<HD>());
	/* K, V (64 rows); two buffers of Q and dO (BM rows each); two buffers of the query
	 * tile's lse (log2 units), D and segments; the keys' segments */
	bf16 *sk = reinterpret_cast<bf16 *>(f2_dkv_raw), *sv = sk + F2_ROWS * HD, *sqo = sv + F2_ROWS * HD;
	float *sL2 = reinterpret_cast<float *>(sqo + 4 * BM * HD), *sD2 = sL2 + 2 * BM;
	int32_t *ssq2 = reinterpret_cast<int32_t *>(sD2 + 2 * BM), *ssk = ssq2 + 2 * BM;
	int G = NH / NKV, nch = G / hper, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
	int h0 = kvh * G + chunk * hper;  /* first query head of this block */
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	int k0 = blockIdx.x * F2_ROWS, w0 = warp * 16;
	size_t LD = (size_t)(NH + 2 * NKV) * HD, OW = (size_t)NH * HD;
	const bf16 *base = qkv + (size_t)b * T * LD;
	const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
	int s0 = k0 + w0 + g, s1 = s0 + 8;  /* this lane's two keys */
	/* the work: query tiles m0 = mfirst, mfirst + BM, ... < T of each of the hper heads */
	int mfirst = k0 / BM * BM, nm = (T - mfirst + BM - 1) / BM, ntile = hper * nm;
	/* issue the loads of work tile i into buffer i & 1 (the caller commits) */
	auto issue = [&](int i) {
		int h = h0 + i / nm, m0 = mfirst + (i % nm) * BM, bf_ = i & 1;
		f2_load_async<HD, BM>(sqo + bf_ * 2 * BM * HD, base + (size_t)h * HD, LD, m0, T);
		f2_load_async<HD, BM>(sqo + (bf_ * 2 + 1) * BM * HD, dout + (size_t)b * T * OW + (size_t)h * HD, OW, m0, T);
		const float *lr = lse + ((size_t)b * NH + h) * T, *dr = Ds + ((size_t)b * NH + h) * T;
		for (int j = threadIdx.x; j < BM; j += F2_WARPS * 32) {
			int t = m0 + j;
			sL2[bf_ * BM + j] = t < T ? lr[t] * F2_LOG2E : 0.0f;
			sD2[bf_ * BM + j] = t < T ? dr[t] : 0.0f;
			ssq2[bf_ * BM + j] = t < T ? (sg ? sg[t] : 0) : -1;
		}
	};

	/* group 0: K, V and work tile 0 */
	f2_load_async<HD, F2_ROWS>(sk, base + (size_t)(NH + kvh) * HD, LD, k0, T);
	f2_load_async<HD, F2_ROWS>(sv, base + (size_t)(NH + NKV + kvh) * HD, LD, k0, T);
	for (int i = threadIdx.x; i < F2_ROWS; i += F2_WARPS * 32)
		ssk[i] = k0 + i < T ? (sg ? sg[k0 + i] : 0) : -2;
	issue(0);
	f2_cp_commit();
	float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;

	for (int it = 0; it < ntile; it++) {
		int m0 = mfirst + (it % nm) * BM, bf_ = it & 1;
		bf16 *sq = sqo + bf_ * 2 * BM * HD, *sdo = sq + BM * HD;
		float *sL = sL2 + bf_ * BM, *sD = sD2 + bf_ * BM;
		int32_t *ssq = ssq2 + bf_ * BM;
		if (it + 1 < ntile) {
			issue(it + 1);
			f2_cp_commit();
			f2_cp_wait(1);
		} else {
			f2_cp_wait(0);
		}
		__syncthreads();
		/* nothing to do when all of this warp's keys come after the tile's queries */
		if (k0 + w0 <= m0 + BM - 1) {
			float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
			for (int j = 0; j < BM / 8; j++)
				st[j][0] = st[j][1] = st[j][2] = st[j][3] = dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
			/* S^T = K Q^T, dP^T = V dO^T: K, V rows are the A fragments */
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk += 2) {
				uint32_t ka[4], ka2[4], va[4], va2[4];
				f2_ldsm_x4(ka, f2_at<HD>(sk, w0, 2 * kk, lane));
				f2_ldsm_x4(ka2, f2_at<HD>(sk, w0, 2 * kk + 2, lane));
				f2_ldsm_x4(va, f2_at<HD>(sv, w0, 2 * kk, lane));
				f2_ldsm_x4(va2, f2_at<HD>(sv, w0, 2 * kk + 2, lane));
#pragma unroll
				for (int j = 0; j < BM / 8; j++) {
					uint32_t qb[4], ob[4];
					f2_ldsm_x4(qb, f2_bt<HD>(sq, 8 * j, 2 * kk, lane));
					f2_mma(st[j], ka, qb[0], qb[1]);
					f2_mma(st[j], ka2, qb[2], qb[3]);
					f2_ldsm_x4(ob, f2_bt<HD>(sdo, 8 * j, 2 * kk, lane));
					f2_mma(dpt[j], va, ob[0], ob[1]);
					f2_mma(dpt[j], va2, ob[2], ob[3]);
				}
			}
			bool nomask = !sg && k0 + w0 + 15 <= m0 && m0 + BM <= T;
#pragma unroll
			for (int j = 0; j < BM / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int ql = 8 * j + 2 * tq + (e & 1), t = m0 + ql, key = e < 2 ? s0 : s1, sqv = ssq[ql];
					bool ok = nomask || (key <= t && sqv >= 0 && (!sg || ssk[key - k0] == sqv));
					float p = ok ? exp2f(st[j][e] * sl2 - sL[ql]) : 0.0f;
					st[j][e] = p;
					dpt[j][e] = p * (dpt[j][e] - sD[ql]) * scale;
				}
			/* dV += P^T dO, dK += dS^T Q: dO's and Q's B fragments by ldmatrix.trans */
#pragma unroll
			for (int kk = 0; kk < BM / 16; kk++) {
				uint32_t pa[4] = { f2_pack(st[2 * kk][0], st[2 * kk][1]), f2_pack(st[2 * kk][2], st[2 * kk][3]),
				    f2_pack(st[2 * kk + 1][0], st[2 * kk + 1][1]), f2_pack(st[2 * kk + 1][2], st[2 * kk + 1][3]) };
				uint32_t da[4] = { f2_pack(dpt[2 * kk][0], dpt[2 * kk][1]), f2_pack(dpt[2 * kk][2], dpt[2 * kk][3]),
				    f2_pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]), f2_pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]) };
#pragma unroll
				for (int n = 0; n < HD / 16; n++) {
					uint32_t ob[4], qb[4];
					f2_ldsm_x4_t(ob, f2_at<HD>(sdo, 16 * kk, 2 * n, lane));
					f2_mma(dv[2 * n], pa, ob[0], ob[1]);
					f2_mma(dv[2 * n + 1], pa, ob[2], ob[3]);
					f2_ldsm_x4_t(qb, f2_at<HD>(sq, 16 * kk, 2 * n, lane));
					f2_mma(dk[2 * n], da, qb[0], qb[1]);
					f2_mma(dk[2 * n + 1], da, qb[2], qb[3]);
				}
			}
		}
		__syncthreads();  /* this buffer is read: the next iteration may refill it */
	}
	if (part) {
		size_t n = (size_t)gridDim.z * T * NKV * HD;
		float *pk = part + (size_t)chunk * n, *pv = part + (size_t)(nch + chunk) * n;
#pragma unroll
		for (int c = 0; c < HD / 8; c++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int key = e < 2 ? s0 : s1;
				size_t i = (((size_t)b * T + key) * NKV + kvh) * HD + 8 * c + 2 * tq + (e & 1);
				if (key < T) {
					pk[i] = dk[c][e];
					pv[i] = dv[c][e];
				}
			}
		return;
	}
	/* each warp stages through its own rows of the K and V tiles */
	bf16 *drow = dqkv + (size_t)b * T * LD;
	f2_store<HD>(drow + (size_t)(NH + kvh) * HD, LD, k0, T, sk, w0, dk, 1.0f, 1.0f, lane);
	f2_store<HD>(drow + (size_t)(NH + NKV + kvh) * HD, LD, k0, T, sv, w0, dv, 1.0f, 1.0f, lane);
}

/* dK, dV = the sums of nch chunks of f32 partials (k_f2_bwd_dkv with hper < G), in chunk
 * order, into dqkv; n = B T NKV HD elements each, grid-stride */
__global__ void
k_f2_dkv_sum(bf16 *dqkv, const float *part, size_t n, int NH, int NKV, int HD, int nch)
{
	size_t LD = (size_t)(NH + 2 * NKV) * HD, W = (size_t)NKV * HD;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		float k = 0.0f, v = 0.0f;
		for (int c = 0; c < nch; c++) {
			k += part[(size_t)c * n + i];
			v += part[(size_t)(nch + c) * n + i];
		}
		bf16 *row = dqkv + i / W * LD + (size_t)NH * HD + i % W;
		row[0] = tobf(k);
		row[W] = tobf(v);
	}
}

/* Backward in one pass (RL_CUDA_FLASH_BWD=fused, FlashAttention-2's way): dK, dV as
 * k_f2_bwd_dkv (same grid, hper, partials), and per query tile also dQ += dS K, added
 * by f32 atomics into dqacc (B, T, NH, HD), zeroed by k_f2_bwd_prep (which also writes
 * Ds) and cast into dqkv by k_f2_dq_cast.  5 GEMM-sized products instead of 8, P and
 * dS computed once; the order of the atomic adds varies, so dQ is not bit-for-bit
 * reproducible run to run.  Query tiles of BM rows (64, or 32: smaller score tiles,
 * fewer registers).  Each warp's dS^T (its 16 keys x BM queries) goes to a shared tile
 * (rows = keys, swizzled, two buffers); warp w takes queries 16 (w % RW) .. + 15 and
 * HD / CW columns of dQ (BM 64: 4 x 1 warps; BM 32: 2 x 2), reading dS with
 * ldmatrix.trans (A = the tile transposed) and K with .trans (as dQ += dS K in
 * k_f2_bwd_dq).  One barrier per tile: iteration it waits for tile it's copies, passes
 * the barrier (every warp is then done with tile it - 1: its Q/dO/lse/D buffer is free
 * and its dS^T complete), issues tile it + 1 into that buffer, computes tile it (dS^T
 * into sds[it & 1], dV, dK), then dQ of tile it - 1 from sds[(it - 1) & 1]; the lse, D
 * and segment loads of tile it + 1 go to registers first and to shared memory after the
 * products, so no warp waits on them.  MINB: blocks per multiprocessor asked of the
 * compiler (__launch_bounds__; 1 leaves it free). */
template <int HD, int BM, int MINB>
__global__ void __launch_bounds__(F2_WARPS * 32, MINB)
k_f2_bwd_fused(bf16 *dqkv, float *part, float *dqacc, const float *Ds, const bf16 *dout, const float *lse,
    const bf16 *qkv, const int32_t *seg, int T, int NH, int NKV, int hper, float sl2, float scale)
{
	constexpr int RW = BM / 16, CW = F2_WARPS / RW, HDW = HD / CW;
	F2_SMEM(f2_fus_raw, (f2_fus_smem<HD, BM>()));
	/* K, V (64 rows); two buffers of Q and dO (BM rows each); two of dS^T (64 x BM); two
	 * of the query tile's lse (log2 units), D and segments; the keys' segments */
	bf16 *sk = reinterpret_cast<bf16 *>(f2_fus_raw), *sv = sk + F2_ROWS * HD, *sqo = sv + F2_ROWS * HD;
	bf16 *sds2 = sqo + 4 * BM * HD;
	float *sL2 = reinterpret_cast<float *>(sds2 + 2 * F2_ROWS * BM), *sD2 = sL2 + 2 * BM;
	int32_t *ssq2 = reinterpret_cast<int32_t *>(sD2 + 2 * BM), *ssk = ssq2 + 2 * BM;
	int G = NH / NKV, nch = G / hper, kvh = blockIdx.y / nch, chunk = blockIdx.y % nch, b = blockIdx.z;
	int h0 = kvh * G + chunk * hper;  /* first query head of this block */
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	int k0 = blockIdx.x * F2_ROWS, w0 = warp * 16;
	int qr0 = 16 * (warp % RW), dc0 = (warp / RW) * (HDW / 8);  /* this warp's dQ rows, first chunk */
	size_t LD = (size_t)(NH + 2 * NKV) * HD, OW = (size_t)NH * HD;
	const bf16 *base = qkv + (size_t)b * T * LD;
	const int32_t *sg = seg ? seg + (size_t)b * T : NULL;
	int s0 = k0 + w0 + g, s1 = s0 + 8;  /* this lane's two keys */
	/* the work: query tiles m0 = mfirst, mfirst + BM, ... < T of each of the hper heads
	 * (mfirst = k0: BM divides 64) */
	int mfirst = k0 / BM * BM, nm = (T - mfirst + BM - 1) / BM, ntile = hper * nm;
	/* Q and dO of work tile i into buffer i & 1 (the caller commits) */
	auto issue = [&](int i) {
		int h = h0 + i / nm, m0 = mfirst + (i % nm) * BM, bf_ = i & 1;
		f2_load_async<HD, BM>(sqo + bf_ * 2 * BM * HD, base + (size_t)h * HD, LD, m0, T);
		f2_load_async<HD, BM>(sqo + (bf_ * 2 + 1) * BM * HD, dout + (size_t)b * T * OW + (size_t)h * HD, OW, m0, T);
	};
	/* this thread's lse (log2 units), D and segment of work tile i (threads < BM) */
	auto scal = [&](int i, float &L, float &D, int &S) {
		int h = h0 + i / nm, t = mfirst + (i % nm) * BM + (int)threadIdx.x;
		L = t < T ? lse[((size_t)b * NH + h) * T + t] * F2_LOG2E : 0.0f;
		D = t < T ? Ds[((size_t)b * NH + h) * T + t] : 0.0f;
		S = t < T ? (sg ? sg[t] : 0) : -1;
	};

	f2_load_async<HD, F2_ROWS>(sk, base + (size_t)(NH + kvh) * HD, LD, k0, T);
	f2_load_async<HD, F2_ROWS>(sv, base + (size_t)(NH + NKV + kvh) * HD, LD, k0, T);
	for (int i = threadIdx.x; i < F2_ROWS; i += F2_WARPS * 32)
		ssk[i] = k0 + i < T ? (sg ? sg[k0 + i] : 0) : -2;
	issue(0);
	f2_cp_commit();
	if (threadIdx.x < BM)
		scal(0, sL2[threadIdx.x], sD2[threadIdx.x], ssq2[threadIdx.x]);
	float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
	for (int n = 0; n < HD / 8; n++)
		dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
	/* the previous tile, for its dQ: head, first query, warps with work, row validity */
	int hp = 0, m0p = 0, nkp = 0;
	bool v0p = false, v1p = false;

	for (int it = 0; it <= ntile; it++) {
		f2_cp_wait(0);
		__syncthreads();  /* tile it is in; tile it - 1 is done with (its dS^T complete) */
		int h = h0 + it / nm, m0 = mfirst + (it % nm) * BM, bf_ = it & 1, nk = 0;
		bool v0 = false, v1 = false;
		if (it < ntile) {
			bf16 *sq = sqo + bf_ * 2 * BM * HD, *sdo = sq + BM * HD, *sds = sds2 + bf_ * F2_ROWS * BM;
			float *sL = sL2 + bf_ * BM, *sD = sD2 + bf_ * BM;
			int32_t *ssq = ssq2 + bf_ * BM;
			float nL = 0.0f, nD = 0.0f;
			int nS = 0;
			if (it + 1 < ntile) {
				issue(it + 1);
				f2_cp_commit();
				if (threadIdx.x < BM)
					scal(it + 1, nL, nD, nS);
			}
			/* only with BM 32 can a warp's keys all come after the tile's queries: warps
			 * 0 .. nk - 1 have work (and dS^T rows) */
			nk = f2_imin(F2_WARPS, (m0 + BM - 1 - k0) / 16 + 1);
			if (warp < nk) {
				/* S^T, dP^T, P^T and dS^T as in k_f2_bwd_dkv, written out again: one shared
				 * forced-inline function for both raises ptxas's spills here (6 -> 24 bytes
				 * in fused3) */
				float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
				for (int j = 0; j < BM / 8; j++)
					st[j][0] = st[j][1] = st[j][2] = st[j][3] = dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
#pragma unroll
				for (int kk = 0; kk < HD / 16; kk += 2) {
					uint32_t ka[4], ka2[4], va[4], va2[4];
					f2_ldsm_x4(ka, f2_at<HD>(sk, w0, 2 * kk, lane));
					f2_ldsm_x4(ka2, f2_at<HD>(sk, w0, 2 * kk + 2, lane));
					f2_ldsm_x4(va, f2_at<HD>(sv, w0, 2 * kk, lane));
					f2_ldsm_x4(va2, f2_at<HD>(sv, w0, 2 * kk + 2, lane));
#pragma unroll
					for (int j = 0; j < BM / 8; j++) {
						uint32_t qb[4], ob[4];
						f2_ldsm_x4(qb, f2_bt<HD>(sq, 8 * j, 2 * kk, lane));
						f2_mma(st[j], ka, qb[0], qb[1]);
						f2_mma(st[j], ka2, qb[2], qb[3]);
						f2_ldsm_x4(ob, f2_bt<HD>(sdo, 8 * j, 2 * kk, lane));
						f2_mma(dpt[j], va, ob[0], ob[1]);
						f2_mma(dpt[j], va2, ob[2], ob[3]);
					}
				}
				bool nomask = !sg && k0 + w0 + 15 <= m0 && m0 + BM <= T;
#pragma unroll
				for (int j = 0; j < BM / 8; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						int ql = 8 * j + 2 * tq + (e & 1), t = m0 + ql, key = e < 2 ? s0 : s1, sqv = ssq[ql];
						bool ok = nomask || (key <= t && sqv >= 0 && (!sg || ssk[key - k0] == sqv));
						float p = ok ? exp2f(st[j][e] * sl2 - sL[ql]) : 0.0f;
						st[j][e] = p;
						dpt[j][e] = p * (dpt[j][e] - sD[ql]) * scale;
					}
				/* dS^T to the shared tile (bf16, as it enters every product) */
#pragma unroll
				for (int j = 0; j < BM / 8; j++) {
					*reinterpret_cast<uint32_t *>(sds + f2_swr<BM>(w0 + g, j) + 2 * tq) = f2_pack(dpt[j][0], dpt[j][1]);
					*reinterpret_cast<uint32_t *>(sds + f2_swr<BM>(w0 + g + 8, j) + 2 * tq) = f2_pack(dpt[j][2], dpt[j][3]);
				}
				/* dV += P^T dO, dK += dS^T Q */
#pragma unroll
				for (int kk = 0; kk < BM / 16; kk++) {
					uint32_t pa[4] = { f2_pack(st[2 * kk][0], st[2 * kk][1]), f2_pack(st[2 * kk][2], st[2 * kk][3]),
					    f2_pack(st[2 * kk + 1][0], st[2 * kk + 1][1]), f2_pack(st[2 * kk + 1][2], st[2 * kk + 1][3]) };
					uint32_t da[4] = { f2_pack(dpt[2 * kk][0], dpt[2 * kk][1]), f2_pack(dpt[2 * kk][2], dpt[2 * kk][3]),
					    f2_pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]), f2_pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]) };
#pragma unroll
					for (int n = 0; n < HD / 16; n++) {
						uint32_t ob[4], qb[4];
						f2_ldsm_x4_t(ob, f2_at<HD>(sdo, 16 * kk, 2 * n, lane));
						f2_mma(dv[2 * n], pa, ob[0], ob[1]);
						f2_mma(dv[2 * n + 1], pa, ob[2], ob[3]);
						f2_ldsm_x4_t(qb, f2_at<HD>(sq, 16 * kk, 2 * n, lane));
						f2_mma(dk[2 * n], da, qb[0], qb[1]);
						f2_mma(dk[2 * n + 1], da, qb[2], qb[3]);
					}
				}
			}
			/* rows past T and padding queries (segment < 0) get no dQ */
			v0 = ssq[qr0 + g] >= 0;
			v1 = ssq[qr0 + g + 8] >= 0;
			if (it + 1 < ntile && threadIdx.x < BM) {
				int nb = (bf_ ^ 1) * BM + (int)threadIdx.x;
				sL2[nb] = nL;
				sD2[nb] = nD;
				ssq2[nb] = nS;
			}
		}
		if (it > 0) {
			/* dQ of tile it - 1 (this warp's 16 queries x HDW columns) = dS K over the keys
			 * of its warps with work */
			const bf16 *sds = sds2 + ((it - 1) & 1) * F2_ROWS * BM;
			float dq[HDW / 8][4];
#pragma unroll
			for (int n = 0; n < HDW / 8; n++)
				dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
			for (int kk = 0; kk < F2_WARPS; kk++) {
				if (kk < nkp) {
					uint32_t a[4];
					f2_ldsm_x4_t(a, f2_at_t<BM>(sds, 16 * kk, qr0 / 8, lane));
#pragma unroll
					for (int n = 0; n < HDW / 16; n++) {
						uint32_t xb[4];
						f2_ldsm_x4_t(xb, f2_at<HD>(sk, 16 * kk, dc0 + 2 * n, lane));
						f2_mma(dq[2 * n], a, xb[0], xb[1]);
						f2_mma(dq[2 * n + 1], a, xb[2], xb[3]);
					}
				}
			}
			float *qrow = dqacc + ((size_t)b * T + m0p + qr0 + g) * OW + (size_t)hp * HD + dc0 * 8 + 2 * tq;
#pragma unroll
			for (int n = 0; n < HDW / 8; n++) {
				if (v0p)
					f2_red2(qrow + 8 * n, dq[n][0], dq[n][1]);
				if (v1p)
					f2_red2(qrow + 8 * OW + 8 * n, dq[n][2], dq[n][3]);
			}
		}
		hp = h;
		m0p = m0;
		nkp = nk;
		v0p = v0;
		v1p = v1;
	}
	if (part) {
		size_t n = (size_t)gridDim.z * T * NKV * HD;
		float *pk = part + (size_t)chunk * n, *pv = part + (size_t)(nch + chunk) * n;
#pragma unroll
		for (int c = 0; c < HD / 8; c++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int key = e < 2 ? s0 : s1;
				size_t i = (((size_t)b * T + key) * NKV + kvh) * HD + 8 * c + 2 * tq + (e & 1);
				if (key < T) {
					pk[i] = dk[c][e];
					pv[i] = dv[c][e];
				}
			}
		return;
	}
	/* each warp stages through its own rows of the K and V tiles: the last dQ read K, so
	 * a barrier first */
	__syncthreads();
	bf16 *drow = dqkv + (size_t)b * T * LD;
	f2_store<HD>(drow + (size_t)(NH + kvh) * HD, LD, k0, T, sk, w0, dk, 1.0f, 1.0f, lane);
	f2_store<HD>(drow + (size_t)(NH + NKV + kvh) * HD, LD, k0, T, sv, w0, dv, 1.0f, 1.0f, lane);
}

/* For the fused backward: D = rowsum(dO * O) in f32 into Ds (B, NH, T) and the row's HD
 * f32 of dqacc (B, T, NH, HD) zeroed.  n = B T NH rows (b, t, h), HD / 8 threads a row
 * (16 bytes of dO and O each), blockDim.x a multiple of 32, grid-stride. */
__global__ void
k_f2_bwd_prep(float *Ds, float *dqacc, const bf16 *dout, const bf16 *out, int n, int T, int NH, int HD)
{
	int per = HD / 8, rpb = (int)blockDim.x / per, sub = (int)threadIdx.x % per;
	for (long i0 = (long)blockIdx.x * rpb; i0 < n; i0 += (long)gridDim.x * rpb) {
		long r = i0 + (long)threadIdx.x / per;
		float acc = 0.0f;
		if (r < n) {
			uint4 x = *reinterpret_cast<const uint4 *>(dout + r * HD + sub * 8);
			uint4 y = *reinterpret_cast<const uint4 *>(out + r * HD + sub * 8);
			const bf16 *xe = reinterpret_cast<const bf16 *>(&x), *ye = reinterpret_cast<const bf16 *>(&y);
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc += bf(xe[i]) * bf(ye[i]);
			float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			reinterpret_cast<float4 *>(dqacc + r * HD + sub * 8)[0] = z;
			reinterpret_cast<float4 *>(dqacc + r * HD + sub * 8)[1] = z;
		}
		for (int o = per / 2; o > 0; o >>= 1)
			acc += __shfl_xor_sync(0xffffffffu, acc, o);
		if (r < n && sub == 0) {
			long bt = r / NH;
			Ds[(bt / T * NH + r % NH) * T + bt % T] = acc;
		}
	}
}

/* dQ of the fused backward: dqacc (B, T, NH, HD) f32 to bf16 in dqkv's query columns;
 * n4 = B T NH HD / 4 groups of four, grid-stride */
__global__ void
k_f2_dq_cast(bf16 *dqkv, const float *dqacc, size_t n4, int NH, int NKV, int HD)
{
	size_t W = (size_t)NH * HD, LD = (size_t)(NH + 2 * NKV) * HD;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
		float4 v = reinterpret_cast<const float4 *>(dqacc)[i];
		size_t e = 4 * i;
		*reinterpret_cast<uint2 *>(dqkv + e / W * LD + e % W) = make_uint2(f2_pack(v.x, v.y), f2_pack(v.z, v.w));
	}
}

/* heads per dK/dV block: all G of a group unless that leaves fewer than 4 blocks per
 * multiprocessor of an H100 (528); then the smallest divisor of G that reaches it, or 1 */
static __host__ __device__ int
f2_hper(int B, int T, int NKV, int G)
{
	long blocks = (long)B * NKV * ((T + F2_ROWS - 1) / F2_ROWS);
	if (G <= 1 || blocks >= 528)
		return G;
	for (int d = 2; d <= G; d++)
		if (G % d == 0 && blocks * d >= 528)
			return G / d;
	return 1;
}

/* ==== flash2 launchers ==== */
template <typename K>
static int
f2_attr(K kern, int bytes)
{
	return (int)cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int HD>
static int
f2_fwd(void *s, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV)
{
	int e = f2_attr(k_f2_fwd<HD>, f2_fwd_smem<HD>());
	if (e)
		return e;
	dim3 grid((T + F2_ROWS - 1) / F2_ROWS, NH, B);
	k_f2_fwd<HD><<<grid, F2_WARPS * 32, f2_fwd_smem<HD>(), RLK_STREAM(s)>>>((bf16 *)out, lse,
	    (const bf16 *)qkv, seg, T, NH, NKV, F2_LOG2E / sqrtf((float)HD));
	RLK_RET();
}

template <int HD>
static int
f2_bwd(void *s, float *ws, void *dqkv, const void *dout, const void *out, const float *lse, const void *qkv,
    const int32_t *seg, int B, int T, int NH, int NKV)
{
	int G = NH / NKV, hper = f2_hper(B, T, NKV, G), nch = G / hper;
	float *part = hper < G ? ws + (size_t)B * NH * T : NULL;
	int e = f2_attr(k_f2_bwd_dq<HD>, f2_dq_smem<HD>());
	if (!e)
		e = f2_attr(k_f2_bwd_dkv<HD>, f2_dkv_smem<HD>());
	if (e)
		return e;
	float scale = 1.0f / sqrtf((float)HD);
	dim3 g1((T + F2_ROWS - 1) / F2_ROWS, NH, B), g2((T + F2_ROWS - 1) / F2_ROWS, NKV * nch, B);
	k_f2_bwd_dq<HD><<<g1, F2_WARPS * 32, f2_dq_smem<HD>(), RLK_STREAM(s)>>>((bf16 *)dqkv, ws,
	    (const bf16 *)dout, (const bf16 *)out, lse, (const bf16 *)qkv, seg, T, NH, NKV, F2_LOG2E * scale, scale);
	if ((e = (int)cudaGetLastError()))
		return e;
	k_f2_bwd_dkv<HD><<<g2, F2_WARPS * 32, f2_dkv_smem<HD>(), RLK_STREAM(s)>>>((bf16 *)dqkv, part, ws,
	    (const bf16 *)dout, lse, (const bf16 *)qkv, seg, T, NH, NKV, hper, F2_LOG2E * scale, scale);
	if (part) {
		if ((e = (int)cudaGetLastError()))
			return e;
		size_t n = (size_t)B * T * NKV * HD;
		k_f2_dkv_sum<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dqkv, part, n, NH, NKV, HD, nch);
	}
	RLK_RET();
}

/* f32 offset of the fused backward's dQ accumulator in ws: after D (rounded to 4 floats:
 * 16-byte aligned) and the dK/dV partials */
static size_t
f2_dqacc_off(int B, int T, int NH, int NKV, int HD)
{
	size_t d = ((size_t)B * NH * T + 3) / 4 * 4;
	int G = NH / NKV, hper = f2_hper(B, T, NKV, G);
	return hper < G ? d + (size_t)2 * (G / hper) * B * T * NKV * HD : d;
}

template <int HD, int BM, int MINB>
static int
f2_bwd_fused(void *s, float *ws, void *dqkv, const void *dout, const void *out, const float *lse, const void *qkv,
    const int32_t *seg, int B, int T, int NH, int NKV)
{
	int G = NH / NKV, hper = f2_hper(B, T, NKV, G), nch = G / hper;
	float *part = hper < G ? ws + ((size_t)B * NH * T + 3) / 4 * 4 : NULL;
	float *dqacc = ws + f2_dqacc_off(B, T, NH, NKV, HD);
	int e = f2_attr(k_f2_bwd_fused<HD, BM, MINB>, f2_fus_smem<HD, BM>());
	if (e)
		return e;
	float scale = 1.0f / sqrtf((float)HD);
	int rows = B * T * NH;
	k_f2_bwd_prep<<<rlk_blocks((size_t)rows * (HD / 8), 256), 256, 0, RLK_STREAM(s)>>>(ws, dqacc,
	    (const bf16 *)dout, (const bf16 *)out, rows, T, NH, HD);
	if ((e = (int)cudaGetLastError()))
		return e;
	dim3 g2((T + F2_ROWS - 1) / F2_ROWS, NKV * nch, B);
	k_f2_bwd_fused<HD, BM, MINB><<<g2, F2_WARPS * 32, f2_fus_smem<HD, BM>(), RLK_STREAM(s)>>>((bf16 *)dqkv, part, dqacc,
	    ws, (const bf16 *)dout, lse, (const bf16 *)qkv, seg, T, NH, NKV, hper, F2_LOG2E * scale, scale);
	if ((e = (int)cudaGetLastError()))
		return e;
	if (part) {
		size_t n = (size_t)B * T * NKV * HD;
		k_f2_dkv_sum<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dqkv, part, n, NH, NKV, HD, nch);
		if ((e = (int)cudaGetLastError()))
			return e;
	}
	size_t n4 = (size_t)rows * HD / 4;
	k_f2_dq_cast<<<rlk_blocks(n4, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dqkv, dqacc, n4, NH, NKV, HD);
	RLK_RET();
}

extern "C" int
rlk_flash2_ok(int NH, int NKV, int HD, const void *p0, const void *p1, const void *p2, const void *p3)
{
	uintptr_t a = (uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3;
	return (HD == 64 || HD == 128) && NKV > 0 && NH % NKV == 0 && (a & 15) == 0;
}

extern "C" size_t
rlk_flash2_ws_bytes(int B, int T, int NH, int NKV, int HD, int mode)
{
	size_t d = (size_t)B * T * NH * sizeof(float);
	if (NKV <= 0 || NH % NKV)
		return d;
	if (mode != RLK_F2_BWD_DET)
		return (f2_dqacc_off(B, T, NH, NKV, HD) + (size_t)B * T * NH * HD) * sizeof(float);
	int G = NH / NKV, hper = f2_hper(B, T, NKV, G);
	return hper < G ? d + (size_t)2 * (G / hper) * B * T * NKV * HD * sizeof(float) : d;
}

extern "C" int
rlk_flash2_fwd(void *s, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T, int NH,
    int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return 0;
	if (!rlk_flash2_ok(NH, NKV, HD, out, qkv, NULL, NULL))
		return (int)cudaErrorInvalidValue;
	return HD == 64 ? f2_fwd<64>(s, out, lse, qkv, seg, B, T, NH, NKV)
	    : f2_fwd<128>(s, out, lse, qkv, seg, B, T, NH, NKV);
}

extern "C" int
rlk_flash2_bwd(void *s, float *ws, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD, int mode)
{
	if (B <= 0 || T <= 0)
		return 0;
	if (!ws || !rlk_flash2_ok(NH, NKV, HD, dqkv, dout, out, qkv))
		return (int)cudaErrorInvalidValue;
	/* HD 128: query tiles of 32 (the registers), free register count, in every fused mode */
	if (mode != RLK_F2_BWD_DET && HD == 128)
		return f2_bwd_fused<128, 32, 1>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV);
	if (mode == RLK_F2_BWD_FUSED)
		return f2_bwd_fused<64, 64, 1>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV);
	if (mode == RLK_F2_BWD_FUSED3)
		return f2_bwd_fused<64, 64, 3>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV);
	if (mode == RLK_F2_BWD_FUSED32)
		return f2_bwd_fused<64, 32, F2_FUSED32_MINB>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV);
	return HD == 64 ? f2_bwd<64>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV)
	    : f2_bwd<128>(s, ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV);
}

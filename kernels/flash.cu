/*
 * flash.cu — causal attention forward without materialised scores (flash
 * style): one block of 4 warps per (64 query rows, head, batch row); each warp
 * owns 16 query rows.  Key/value tiles of 64 rows are staged in shared memory,
 * S = Q K^T and O += P V run on the tensor cores through WMMA (bf16 operands,
 * f32 accumulation), the online softmax (running max and sum per row) in f32.
 * P is rounded to bf16 before P V, as in the cuBLAS path (kernels/attn.cu), so
 * the two agree to bf16 rounding.  Writes out and lse (the backward of attn.cu
 * recomputes from them).  HD 64 or 128; other head sizes use attn.cu.
 *
 * Leaves out: the backward (attn.cu), Hopper wgmma (this is mma.sync-class code
 * that runs on sm_80 and sm_90 alike).
 */
#include <mma.h>

#include "kernels/common.cuh"
#include "kernels/launch.h"

using namespace nvcuda;

#define FA_BR 64   /* query rows per block */
#define FA_BC 64   /* keys per tile */
#define FA_WARPS 4

template <int HD>
struct fa_smem {
	bf16 q[FA_BR * HD];
	bf16 k[FA_BC * HD];
	bf16 v[FA_BC * HD];
	float s[FA_BR * FA_BC];
	bf16 p[FA_BR * FA_BC];
	float o[FA_BR * HD];
	float m[FA_BR], l[FA_BR], alpha[FA_BR];
	int segq[FA_BR], segk[FA_BC];
};

template <int HD>
__global__ void __launch_bounds__(FA_WARPS * 32)
k_flash_fwd(bf16 *out, float *lse, const bf16 *qkv, const int32_t *seg, int T, int NH, int NKV, float scale)
{
	extern __shared__ __align__(128) unsigned char fa_raw[];
	fa_smem<HD> &sh = *reinterpret_cast<fa_smem<HD> *>(fa_raw);
	int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
	int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	int q0 = qb * FA_BR;
	size_t LD = (size_t)(NH + 2 * NKV) * HD;
	const bf16 *base = qkv + (size_t)b * T * LD;
	const int32_t *sg = seg ? seg + (size_t)b * T : NULL;

	/* Q tile (zero rows past T), O = 0, running stats */
	for (int i = tid; i < FA_BR * HD / 8; i += blockDim.x) {
		int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
		uint4 v = make_uint4(0, 0, 0, 0);
		if (q0 + r < T)
			v = *reinterpret_cast<const uint4 *>(base + (size_t)(q0 + r) * LD + (size_t)h * HD + c);
		*reinterpret_cast<uint4 *>(&sh.q[r * HD + c]) = v;
	}
	for (int i = tid; i < FA_BR * HD; i += blockDim.x)
		sh.o[i] = 0.0f;
	for (int i = tid; i < FA_BR; i += blockDim.x) {
		sh.m[i] = -INFINITY;
		sh.l[i] = 0.0f;
		sh.segq[i] = (q0 + i < T) ? (sg ? sg[q0 + i] : 0) : -1;
	}
	__syncthreads();

	int qlast = min(T, q0 + FA_BR) - 1;
	for (int k0 = 0; k0 <= qlast; k0 += FA_BC) {
		/* K, V tiles */
		for (int i = tid; i < FA_BC * HD / 8; i += blockDim.x) {
			int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
			uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
			if (k0 + r < T) {
				const bf16 *row = base + (size_t)(k0 + r) * LD;
				kv = *reinterpret_cast<const uint4 *>(row + (size_t)(NH + kvh) * HD + c);
				vv = *reinterpret_cast<const uint4 *>(row + (size_t)(NH + NKV + kvh) * HD + c);
			}
			*reinterpret_cast<uint4 *>(&sh.k[r * HD + c]) = kv;
			*reinterpret_cast<uint4 *>(&sh.v[r * HD + c]) = vv;
		}
		for (int i = tid; i < FA_BC; i += blockDim.x)
			sh.segk[i] = (k0 + i < T) ? (sg ? sg[k0 + i] : 0) : -2;
		__syncthreads();

		/* S (16 x 64 per warp) = Q K^T */
		{
			wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FA_BC / 16];
#pragma unroll
			for (int j = 0; j < FA_BC / 16; j++)
				wmma::fill_fragment(acc[j], 0.0f);
#pragma unroll
			for (int d = 0; d < HD; d += 16) {
				wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
				wmma::load_matrix_sync(a, &sh.q[warp * 16 * HD + d], HD);
#pragma unroll
				for (int j = 0; j < FA_BC / 16; j++) {
					wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bk;
					wmma::load_matrix_sync(bk, &sh.k[j * 16 * HD + d], HD);
					wmma::mma_sync(acc[j], a, bk, acc[j]);
				}
			}
#pragma unroll
			for (int j = 0; j < FA_BC / 16; j++)
				wmma::store_matrix_sync(&sh.s[warp * 16 * FA_BC + j * 16], acc[j], FA_BC, wmma::mem_row_major);
		}
		__syncwarp();

		/* online softmax, one row at a time per warp: lane j holds columns j and j+32
		 * (consecutive lanes, consecutive words: no bank conflicts) */
		for (int rr = 0; rr < 16; rr++) {
			int r = warp * 16 + rr, t = q0 + r, sq = sh.segq[r];
			float *srow = &sh.s[r * FA_BC];
			int c0 = lane, c1 = lane + 32;
			bool ok0 = sq >= 0 && k0 + c0 <= t && sh.segk[c0] == sq;
			bool ok1 = sq >= 0 && k0 + c1 <= t && sh.segk[c1] == sq;
			float z0 = ok0 ? srow[c0] * scale : -INFINITY, z1 = ok1 ? srow[c1] * scale : -INFINITY;
			float mx = warp_max(fmaxf(z0, z1));
			float mold = sh.m[r], mnew = fmaxf(mold, mx);
			float p0 = mnew == -INFINITY ? 0.0f : __expf(z0 - mnew);
			float p1 = mnew == -INFINITY ? 0.0f : __expf(z1 - mnew);
			sh.p[r * FA_BC + c0] = tobf(p0);
			sh.p[r * FA_BC + c1] = tobf(p1);
			float sum = warp_sum(p0 + p1);
			if (lane == 0) {
				float a = mold == -INFINITY ? 0.0f : __expf(mold - mnew);
				sh.alpha[r] = a;
				sh.l[r] = sh.l[r] * a + sum;
				sh.m[r] = mnew;
			}
		}
		__syncwarp();
		/* O = alpha * O + P V */
		for (int i = lane; i < 16 * HD; i += 32) {
			int r = warp * 16 + i / HD;
			sh.o[warp * 16 * HD + i] *= sh.alpha[r];
		}
		__syncwarp();
		{
#pragma unroll
			for (int d = 0; d < HD; d += 16) {
				wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
				wmma::load_matrix_sync(acc, &sh.o[warp * 16 * HD + d], HD, wmma::mem_row_major);
#pragma unroll
				for (int c = 0; c < FA_BC; c += 16) {
					wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
					wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bv;
					wmma::load_matrix_sync(a, &sh.p[warp * 16 * FA_BC + c], FA_BC);
					wmma::load_matrix_sync(bv, &sh.v[c * HD + d], HD);
					wmma::mma_sync(acc, a, bv, acc);
				}
				wmma::store_matrix_sync(&sh.o[warp * 16 * HD + d], acc, HD, wmma::mem_row_major);
			}
		}
		__syncthreads();  /* K/V/segk reused by the next tile */
	}

	/* out = O / l; lse = m + log l (0 for padding queries) */
	for (int i = tid; i < FA_BR * HD; i += blockDim.x) {
		int r = i / HD, d = i % HD, t = q0 + r;
		if (t >= T)
			continue;
		float l = sh.l[r];
		out[((size_t)b * T + t) * NH * HD + (size_t)h * HD + d] = tobf(l > 0.0f ? sh.o[i] / l : 0.0f);
	}
	for (int r = tid; r < FA_BR; r += blockDim.x) {
		int t = q0 + r;
		if (t < T)
			lse[((size_t)b * NH + h) * T + t] = sh.l[r] > 0.0f ? sh.m[r] + logf(sh.l[r]) : 0.0f;
	}
}

template <int HD>
static int
launch(void *s, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV)
{
	size_t sm = sizeof(fa_smem<HD>) + 128;
	int e = (int)cudaFuncSetAttribute(k_flash_fwd<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
	if (e)
		return e;
	dim3 grid((T + FA_BR - 1) / FA_BR, NH, B);
	k_flash_fwd<HD><<<grid, FA_WARPS * 32, sm, RLK_STREAM(s)>>>((bf16 *)out, lse, (const bf16 *)qkv, seg,
	    T, NH, NKV, 1.0f / sqrtf((float)HD));
	RLK_RET();
}

extern "C" int
rlk_flash_fwd_ok(int HD, const void *qkv)
{
	return (HD == 64 || HD == 128) && ((uintptr_t)qkv & 15) == 0;
}

extern "C" int
rlk_flash_fwd(void *s, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T, int NH,
    int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return 0;
	if (NKV <= 0 || NH % NKV || !rlk_flash_fwd_ok(HD, qkv))
		return (int)cudaErrorInvalidValue;
	return HD == 64 ? launch<64>(s, out, lse, qkv, seg, B, T, NH, NKV)
	    : launch<128>(s, out, lse, qkv, seg, B, T, NH, NKV);
}

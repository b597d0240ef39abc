/*
 * attn.cu — causal attention with GQA and seg masks on the GPU.
 *
 * Training/prefill (attn_fwd/attn_bwd): scores are materialised per chunk of
 * batch rows in a caller-given workspace: S = Q K^T (fp32, cuBLAS batched GEMM
 * over every (row, head), bf16 operands, fp32 accumulate), a fused
 * mask + softmax kernel writes P (bf16) and lse, then O = P V.  The backward
 * recomputes S, forms dP = dO V^T, a fused kernel writes P and
 * dS = P (dP - D) / sqrt(HD), then dQ = dS K and dK = dS^T Q, dV = P^T dO
 * (fp32, summed over the query heads of each GQA group) are cast into dqkv.
 * Causality is used at the granularity of query blocks (QBLK rows): a block's
 * GEMMs stop at its last key, 62.5% of the square at T = 1024.  Still O(T^2)
 * memory traffic for S and P: a flash kernel would avoid it.
 *
 * Decode (attn_decode): one block per (sequence, query head) over the paged
 * cache, keys in chunks with an online softmax, fp32 accumulation.
 *
 * Leaves out: the KV-cache write (elementwise.cu).
 */
#include <cublas_v2.h>

#include "kernels/common.cuh"
#include "kernels/launch.h"

#define QBLK 256

/* ---- workspace layout ---------------------------------------------------------------- */
enum { P_Q, P_K, P_V, P_O, P_DO, P_S, P_P, P_DP, P_DS, P_DQ,
	/* grouped arrays for dK/dV, index g*(rows*NKV) + r*NKV + kvh */
	P_GDS, P_GQ, P_GP, P_GDO, P_GDK, P_GDV, P_NARR };

typedef struct {
	void **ptr;        /* P_NARR arrays of rows*NH pointers */
	float *S, *dP;     /* rows*NH*min(T,QBLK)*T */
	bf16 *P, *dS;      /* rows*NH*min(T,QBLK)*T */
	float *D;          /* rows*NH*T */
	float *dKV;        /* rows*T*2*NKV*HD */
} attn_ws;

static size_t
al256(size_t x)
{
	return (x + 255) & ~(size_t)255;
}

static size_t
ws_layout(attn_ws *w, char *base, int rows, int T, int NH, int NKV, int HD, int bwd)
{
	/* query blocks run one after another: scores of one block at a time */
	size_t sq = (size_t)rows * NH * (T < QBLK ? T : QBLK) * T, off = 0;
#define TAKE(field, type, count) do { if (w) w->field = (type)(base + off); off += al256((count)); } while (0)
	TAKE(ptr, void **, (size_t)P_NARR * rows * NH * sizeof(void *));
	TAKE(S, float *, sq * 4);
	TAKE(P, bf16 *, sq * 2);
	if (bwd) {
		TAKE(dP, float *, sq * 4);
		TAKE(dS, bf16 *, sq * 2);
		TAKE(D, float *, (size_t)rows * NH * T * 4);
		TAKE(dKV, float *, (size_t)rows * T * 2 * NKV * HD * 4);
	}
#undef TAKE
	return off;
}

extern "C" size_t
rlk_attn_ws_bytes(int rows, int T, int NH, int NKV, int HD, int bwd)
{
	return ws_layout(NULL, NULL, rows, T, NH, NKV, HD, bwd);
}

/* Query blocks: causality means query rows [q0, q1) need keys [0, q1) only, so the
 * square is cut into blocks of QBLK query rows and each block's GEMMs stop at q1:
 * (1 + 2 + ... + nb) / nb^2 of the square, 62.5% at T = 1024. */

/* Fill the pointer arrays for batch rows [b0, b0+rows), query rows [q0, q0+qn), keys
 * [0, kend): S, P, dP, dS per (row, head) are (qn x kend) with leading dimension kend. */
__global__ void k_attn_ptrs(void **ptr, int rows, const bf16 *qkv, const bf16 *out, const bf16 *dout,
    bf16 *dqkv, attn_ws w, int b0, int T, int NH, int NKV, int HD, int q0, int qn, int kend)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x, n = rows * NH;
	if (i >= n)
		return;
	int r = i / NH, h = i % NH, G = NH / NKV, kvh = h / G, g = h % G;
	size_t LD = (size_t)(NH + 2 * NKV) * HD, rowoff = (size_t)(b0 + r) * T;
	size_t sq = (size_t)qn * kend, qoff = rowoff + q0;
	const bf16 *q = qkv + qoff * LD + (size_t)h * HD;
	const bf16 *k = qkv + rowoff * LD + (size_t)(NH + kvh) * HD;
	const bf16 *v = qkv + rowoff * LD + (size_t)(NH + NKV + kvh) * HD;
	ptr[P_Q * n + i] = (void *)q;
	ptr[P_K * n + i] = (void *)k;
	ptr[P_V * n + i] = (void *)v;
	ptr[P_O * n + i] = (void *)(out ? out + qoff * NH * HD + (size_t)h * HD : NULL);
	ptr[P_DO * n + i] = (void *)(dout ? dout + qoff * NH * HD + (size_t)h * HD : NULL);
	ptr[P_S * n + i] = w.S + (size_t)i * sq;
	ptr[P_P * n + i] = w.P + (size_t)i * sq;
	ptr[P_DP * n + i] = w.dP ? w.dP + (size_t)i * sq : NULL;
	ptr[P_DS * n + i] = w.dS ? w.dS + (size_t)i * sq : NULL;
	ptr[P_DQ * n + i] = dqkv ? dqkv + qoff * LD + (size_t)h * HD : NULL;
	int j = g * rows * NKV + r * NKV + kvh;
	ptr[P_GDS * n + j] = ptr[P_DS * n + i];
	ptr[P_GQ * n + j] = (void *)q;
	ptr[P_GP * n + j] = ptr[P_P * n + i];
	ptr[P_GDO * n + j] = ptr[P_DO * n + i];
	size_t kvld = (size_t)2 * NKV * HD;
	ptr[P_GDK * n + j] = w.dKV ? w.dKV + (size_t)r * T * kvld + (size_t)kvh * HD : NULL;
	ptr[P_GDV * n + j] = w.dKV ? w.dKV + (size_t)r * T * kvld + (size_t)(NKV + kvh) * HD : NULL;
}

/* Row-major batched GEMM C = op(A) op(B) (M x N, K inner) through column-major cuBLAS. */
static cublasStatus_t
gemm_rm(cublasHandle_t h, int ta, int tb, int M, int N, int K, const void *const *A, int lda,
    const void *const *B, int ldb, void *const *C, cudaDataType ct, int ldc, float beta, int batch)
{
	float alpha = 1.0f;
	return cublasGemmBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
	    N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, ct, ldc, batch,
	    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static __device__ __forceinline__ bool
allowed(const int32_t *segrow, int t, int s)
{
	if (s > t)
		return false;
	if (!segrow)
		return true;
	int a = segrow[t];
	return a >= 0 && segrow[s] == a;
}

/* One block per score row (r, h, t = q0 + tq), row length kend: P = softmax(S * scale)
 * over allowed keys, and lse. */
__global__ void k_attn_softmax(bf16 *P, float *lse, const float *S, const int32_t *seg, int b0,
    int T, int NH, float scale, int q0, int qn, int kend)
{
	__shared__ float red[32];
	long row = blockIdx.x;  /* (r*NH + h)*qn + tq */
	int t = q0 + (int)(row % qn);
	long rh = row / qn;
	int h = (int)(rh % NH), r = (int)(rh / NH);
	const int32_t *sg = seg ? seg + (size_t)(b0 + r) * T : NULL;
	const float *srow = S + (size_t)row * kend;
	bf16 *prow = P + (size_t)row * kend;
	float m = -INFINITY;
	for (int s = threadIdx.x; s <= t; s += blockDim.x)
		if (allowed(sg, t, s))
			m = fmaxf(m, srow[s] * scale);
	m = block_max(m, red);
	float sum = 0.0f;
	for (int s = threadIdx.x; s <= t; s += blockDim.x)
		if (allowed(sg, t, s))
			sum += __expf(srow[s] * scale - m);
	sum = block_sum(sum, red);
	bool pad = (m == -INFINITY);
	float l = pad ? 0.0f : m + logf(sum);
	for (int s = threadIdx.x; s < kend; s += blockDim.x) {
		float p = (!pad && allowed(sg, t, s)) ? __expf(srow[s] * scale - l) : 0.0f;
		prow[s] = tobf(p);
	}
	if (threadIdx.x == 0)
		lse[((size_t)(b0 + r) * NH + h) * T + t] = l;
}

/* D[r,h,t] = sum_d dO * O, one warp per (r, h, t). */
__global__ void k_attn_D(float *D, const bf16 *dout, const bf16 *out, int b0, int rows, int T, int NH,
    int HD)
{
	long u = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (u >= (long)rows * NH * T)
		return;
	int t = (int)(u % T);
	long rh = u / T;
	int h = (int)(rh % NH), r = (int)(rh / NH);
	size_t off = ((size_t)(b0 + r) * T + t) * NH * HD + (size_t)h * HD;
	float a = 0.0f;
	for (int d = lane; d < HD; d += 32)
		a += bf(dout[off + d]) * bf(out[off + d]);
	a = warp_sum(a);
	if (lane == 0)
		D[u] = a;
}

/* One block per score row: recompute P from S and lse; dS = P (dP - D) * scale. */
__global__ void k_attn_dsoftmax(bf16 *P, bf16 *dS, const float *S, const float *dP, const float *lse,
    const float *D, const int32_t *seg, int b0, int T, int NH, float scale, int q0, int qn, int kend)
{
	long row = blockIdx.x;
	int t = q0 + (int)(row % qn);
	long rh = row / qn;
	int h = (int)(rh % NH), r = (int)(rh / NH);
	const int32_t *sg = seg ? seg + (size_t)(b0 + r) * T : NULL;
	bool pad = sg && sg[t] < 0;
	float l = lse[((size_t)(b0 + r) * NH + h) * T + t], Dv = D[rh * T + t];
	const float *srow = S + (size_t)row * kend, *dprow = dP + (size_t)row * kend;
	for (int s = threadIdx.x; s < kend; s += blockDim.x) {
		float p = 0.0f, ds = 0.0f;
		if (!pad && allowed(sg, t, s)) {
			p = __expf(srow[s] * scale - l);
			ds = p * (dprow[s] - Dv) * scale;
		}
		P[(size_t)row * kend + s] = tobf(p);
		dS[(size_t)row * kend + s] = tobf(ds);
	}
}

/* dqkv k and v slices (bf16) from the fp32 dKV scratch of `rows` batch rows. */
__global__ void k_attn_dkv(bf16 *dqkv, const float *dKV, int b0, int rows, int T, int NH, int NKV, int HD)
{
	size_t kvld = (size_t)2 * NKV * HD, n = (size_t)rows * T * kvld;
	size_t LD = (size_t)(NH + 2 * NKV) * HD;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		size_t tok = i / kvld, j = i % kvld;
		dqkv[((size_t)b0 * T + tok) * LD + (size_t)NH * HD + j] = tobf(dKV[i]);
	}
}

static int
chunk_rows(size_t ws_bytes, int B, int T, int NH, int NKV, int HD, int bwd)
{
	int rows = B;
	while (rows > 1 && rlk_attn_ws_bytes(rows, T, NH, NKV, HD, bwd) > ws_bytes)
		rows = (rows + 1) / 2;
	return rlk_attn_ws_bytes(rows, T, NH, NKV, HD, bwd) <= ws_bytes ? rows : 0;
}

#define CK(x) do { cublasStatus_t st_ = (x); if (st_ != CUBLAS_STATUS_SUCCESS) return -(int)st_; } while (0)

extern "C" int
rlk_attn_fwd(void *s, void *cublas, void *wsp, size_t ws_bytes, void *out, float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return 0;
	if (NKV <= 0 || NH % NKV)
		return (int)cudaErrorInvalidValue;
	int rows = chunk_rows(ws_bytes, B, T, NH, NKV, HD, 0);
	if (!rows)
		return (int)cudaErrorMemoryAllocation;
	cublasHandle_t h = (cublasHandle_t)cublas;
	int LD = (NH + 2 * NKV) * HD;
	float scale = 1.0f / sqrtf((float)HD);
	for (int b0 = 0; b0 < B; b0 += rows) {
		int rc = B - b0 < rows ? B - b0 : rows, n = rc * NH;
		attn_ws w = {};
		ws_layout(&w, (char *)wsp, rc, T, NH, NKV, HD, 0);
		void **p = w.ptr;
		for (int q0 = 0; q0 < T; q0 += QBLK) {
			int qn = T - q0 < QBLK ? T - q0 : QBLK, kend = q0 + qn;
			k_attn_ptrs<<<(n + 127) / 128, 128, 0, RLK_STREAM(s)>>>(w.ptr, rc, (const bf16 *)qkv,
			    (const bf16 *)out, NULL, NULL, w, b0, T, NH, NKV, HD, q0, qn, kend);
			CK(gemm_rm(h, 0, 1, qn, kend, HD, (const void **)(p + P_Q * n), LD,
			    (const void **)(p + P_K * n), LD, p + P_S * n, CUDA_R_32F, kend, 0.0f, n));
			k_attn_softmax<<<(unsigned)((size_t)n * qn), 256, 0, RLK_STREAM(s)>>>(w.P, lse, w.S, seg, b0,
			    T, NH, scale, q0, qn, kend);
			CK(gemm_rm(h, 0, 0, qn, HD, kend, (const void **)(p + P_P * n), kend,
			    (const void **)(p + P_V * n), LD, p + P_O * n, CUDA_R_16BF, NH * HD, 0.0f, n));
		}
	}
	RLK_RET();
}

extern "C" int
rlk_attn_bwd(void *s, void *cublas, void *wsp, size_t ws_bytes, void *dqkv, const void *dout,
    const void *out, const float *lse, const void *qkv, const int32_t *seg, int B, int T, int NH,
    int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return 0;
	if (NKV <= 0 || NH % NKV)
		return (int)cudaErrorInvalidValue;
	int rows = chunk_rows(ws_bytes, B, T, NH, NKV, HD, 1);
	if (!rows)
		return (int)cudaErrorMemoryAllocation;
	cublasHandle_t h = (cublasHandle_t)cublas;
	int LD = (NH + 2 * NKV) * HD, G = NH / NKV, KVLD = 2 * NKV * HD;
	float scale = 1.0f / sqrtf((float)HD);
	for (int b0 = 0; b0 < B; b0 += rows) {
		int rc = B - b0 < rows ? B - b0 : rows, n = rc * NH, nk = rc * NKV;
		attn_ws w = {};
		ws_layout(&w, (char *)wsp, rc, T, NH, NKV, HD, 1);
		void **p = w.ptr;
		long drows = (long)n * T;
		k_attn_D<<<(unsigned)((drows + 7) / 8), 256, 0, RLK_STREAM(s)>>>(w.D, (const bf16 *)dout,
		    (const bf16 *)out, b0, rc, T, NH, HD);
		size_t nkv = (size_t)rc * T * KVLD;
		int e = (int)cudaMemsetAsync(w.dKV, 0, nkv * sizeof(float), RLK_STREAM(s));
		if (e)
			return e;
		for (int q0 = 0; q0 < T; q0 += QBLK) {
			int qn = T - q0 < QBLK ? T - q0 : QBLK, kend = q0 + qn;
			k_attn_ptrs<<<(n + 127) / 128, 128, 0, RLK_STREAM(s)>>>(w.ptr, rc, (const bf16 *)qkv,
			    (const bf16 *)out, (const bf16 *)dout, (bf16 *)dqkv, w, b0, T, NH, NKV, HD, q0, qn, kend);
			CK(gemm_rm(h, 0, 1, qn, kend, HD, (const void **)(p + P_Q * n), LD,
			    (const void **)(p + P_K * n), LD, p + P_S * n, CUDA_R_32F, kend, 0.0f, n));
			CK(gemm_rm(h, 0, 1, qn, kend, HD, (const void **)(p + P_DO * n), NH * HD,
			    (const void **)(p + P_V * n), LD, p + P_DP * n, CUDA_R_32F, kend, 0.0f, n));
			k_attn_dsoftmax<<<(unsigned)((size_t)n * qn), 256, 0, RLK_STREAM(s)>>>(w.P, w.dS, w.S, w.dP,
			    lse, w.D, seg, b0, T, NH, scale, q0, qn, kend);
			/* dQ = dS K (rows q0..q0+qn) */
			CK(gemm_rm(h, 0, 0, qn, HD, kend, (const void **)(p + P_DS * n), kend,
			    (const void **)(p + P_K * n), LD, p + P_DQ * n, CUDA_R_16BF, LD, 0.0f, n));
			/* dK += dS^T Q, dV += P^T dO over keys 0..kend, summed over each GQA group */
			for (int g = 0; g < G; g++) {
				size_t o = (size_t)g * nk;
				CK(gemm_rm(h, 1, 0, kend, HD, qn, (const void **)(p + P_GDS * n + o), kend,
				    (const void **)(p + P_GQ * n + o), LD, p + P_GDK * n + o, CUDA_R_32F, KVLD, 1.0f, nk));
				CK(gemm_rm(h, 1, 0, kend, HD, qn, (const void **)(p + P_GP * n + o), kend,
				    (const void **)(p + P_GDO * n + o), NH * HD, p + P_GDV * n + o, CUDA_R_32F, KVLD,
				    1.0f, nk));
			}
		}
		k_attn_dkv<<<rlk_blocks(nkv, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dqkv, w.dKV, b0, rc, T, NH,
		    NKV, HD);
	}
	RLK_RET();
}

/* ---- decode attention over the paged cache ------------------------------------------------ */
#define DEC_THREADS 128
#define DEC_CHUNK 256
#define DEC_MAXHD 256

__global__ void __launch_bounds__(DEC_THREADS)
k_attn_decode(bf16 *out, const bf16 *qkv, const bf16 *kc, const bf16 *vc, const int32_t *bt,
    const int32_t *ctx_len, int NH, int NKV, int HD, int BS, int MAXBLK)
{
	__shared__ float q[DEC_MAXHD];
	__shared__ float sc[DEC_CHUNK];
	__shared__ float red[32];
	int b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
	size_t LD = (size_t)(NH + 2 * NKV) * HD, kvrow = (size_t)NKV * HD;
	float scale = 1.0f / sqrtf((float)HD);
	for (int d = threadIdx.x; d < HD; d += blockDim.x)
		q[d] = bf(qkv[(size_t)b * LD + (size_t)h * HD + d]) * scale;
	int L = ctx_len[b];
	const int32_t *tab = bt + (size_t)b * MAXBLK;
	float m = -INFINITY, l = 0.0f, acc[DEC_MAXHD / DEC_THREADS] = { 0.0f, 0.0f };
	__syncthreads();
	for (int c0 = 0; c0 < L; c0 += DEC_CHUNK) {
		int cn = min(DEC_CHUNK, L - c0);
		for (int j = threadIdx.x; j < cn; j += blockDim.x) {
			int s = c0 + j;
			const bf16 *k = kc + ((size_t)tab[s / BS] * BS + s % BS) * kvrow + (size_t)kvh * HD;
			float a = 0.0f;
			for (int d = 0; d < HD; d += 2) {
				float2 kk = __bfloat1622float2(*(const __nv_bfloat162 *)(k + d));
				a += q[d] * kk.x + q[d + 1] * kk.y;
			}
			sc[j] = a;
		}
		__syncthreads();
		float cm = -INFINITY;
		for (int j = threadIdx.x; j < cn; j += blockDim.x)
			cm = fmaxf(cm, sc[j]);
		cm = block_max(cm, red);
		float mn = fmaxf(m, cm), corr = __expf(m - mn);
		__syncthreads();
		float ps = 0.0f;
		for (int j = threadIdx.x; j < cn; j += blockDim.x) {
			float e = __expf(sc[j] - mn);
			sc[j] = e;
			ps += e;
		}
		ps = block_sum(ps, red);  /* has __syncthreads: sc[] visible after */
		l = l * corr + ps;
		m = mn;
#pragma unroll
		for (int a = 0; a < DEC_MAXHD / DEC_THREADS; a++) {
			int d = threadIdx.x + a * DEC_THREADS;
			float v = acc[a] * corr;
			if (d < HD)
				for (int j = 0; j < cn; j++) {
					int s = c0 + j;
					const bf16 *vr = vc + ((size_t)tab[s / BS] * BS + s % BS) * kvrow + (size_t)kvh * HD;
					v += sc[j] * bf(vr[d]);
				}
			acc[a] = v;
		}
		__syncthreads();
	}
#pragma unroll
	for (int a = 0; a < DEC_MAXHD / DEC_THREADS; a++) {
		int d = threadIdx.x + a * DEC_THREADS;
		if (d < HD)
			out[(size_t)b * NH * HD + (size_t)h * HD + d] = tobf(L > 0 ? acc[a] / l : 0.0f);
	}
}

extern "C" int
rlk_attn_decode(void *s, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD, int BS,
    int MAXBLK)
{
	if (B <= 0)
		return 0;
	if (HD > DEC_MAXHD || HD % 2 || NKV <= 0 || NH % NKV)
		return (int)cudaErrorInvalidValue;
	k_attn_decode<<<B * NH, DEC_THREADS, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)qkv,
	    (const bf16 *)kc, (const bf16 *)vc, block_table, ctx_len, NH, NKV, HD, BS, MAXBLK);
	RLK_RET();
}

/*
 * norm.cu — RMSNorm, LayerNorm and Qwen3 q/k-norm, forward and backward.  One
 * warp per row; statistics and weight gradients in fp32.  Backward kernels
 * accumulate the weight gradient of their rows in shared memory and add it to
 * the global f32 gradient once per block (atomicAdd), so dw/db are += as
 * lib/compute/ops.h asks.
 *
 * add_norm_fwd fuses the residual add in front of either forward norm (the
 * optional op of lib/compute/ops.h): each lane adds, rounds and stores its elements of
 * the row, then the norm reads them back (its own stores: no barrier needed).
 *
 * The backward norms keep the row in registers (k_norm_bwd_vec) where C allows; the
 * element-strided kernels are the fallback (and RL_CUDA_NORM_BWD_VEC=0).  Each has an
 * accumulating form (ACC = 1: layernorm_bwd_add / rmsnorm_bwd_add of lib/compute/ops.h), which adds
 * the old dx to the f32 value before its one rounding, so the model's residual gradient
 * takes the norm's gradient without a separate add pass.
 *
 * Leaves out: other fusion in the backward.
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define NORM_WARPS 8

static unsigned
norm_grid(long rows)
{
	long b = (rows + NORM_WARPS - 1) / NORM_WARPS;
	/* backward kernels flush shared partial sums once per block: cap the grid */
	return (unsigned)(b < 1 ? 1 : b);
}

static unsigned
norm_grid_bwd(long rows)
{
	long b = (rows + NORM_WARPS - 1) / NORM_WARPS;
	if (b > 528)
		b = 528;
	return (unsigned)(b < 1 ? 1 : b);
}

/* ---- the forward norms with the row in registers ----------------------------------------
 * One warp per row as below, but each lane loads 8 bf16 (16 bytes) at a time and keeps
 * its NCH chunks of the row in registers: all loads of a row are in flight at once and
 * the row is read from memory once (the element-strided kernels below issue one 2-byte
 * load per element and re-read the row per pass; a decode step's rows then cost a chain
 * of dependent round trips).  t != NULL: x += t first (rounded to bf16 and stored back,
 * add_norm_fwd), the norm of the sum; else the norm of xin.  ln: LayerNorm (mean, two
 * passes over the registers), else RMSNorm.  The same arithmetic per element as the
 * kernels below; the row sums are added in another order (f32 rounding only).  Taken
 * when C % 8 == 0, C <= 4096 and every pointer is 16-byte aligned (norm_vec below). */
template <int NCH>
__global__ void __launch_bounds__(NORM_WARPS * 32)
k_norm_vec(bf16 *xw, const bf16 *xin, const bf16 *t, bf16 *out, float *mean, float *rstd, const bf16 *w,
    const bf16 *b, int N, int C, float eps, int ln)
{
	int lane = threadIdx.x & 31;
	long r = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
	if (r >= N)
		return;
	uint4 v[NCH];
	const bf16 *src = t ? xw : xin;
#pragma unroll
	for (int k = 0; k < NCH; k++) {
		int c = (k * 32 + lane) * 8;
		v[k] = make_uint4(0, 0, 0, 0);
		if (c < C)
			v[k] = *(const uint4 *)(src + (size_t)r * C + c);
	}
	if (t) {
#pragma unroll
		for (int k = 0; k < NCH; k++) {
			int c = (k * 32 + lane) * 8;
			if (c < C) {
				uint4 u = *(const uint4 *)(t + (size_t)r * C + c);
				bf16 *a = (bf16 *)&v[k];
				const bf16 *d = (const bf16 *)&u;
#pragma unroll
				for (int e = 0; e < 8; e++)
					a[e] = tobf(bf(a[e]) + bf(d[e]));
				*(uint4 *)(xw + (size_t)r * C + c) = v[k];
			}
		}
	}
	float s1 = 0.0f;
#pragma unroll
	for (int k = 0; k < NCH; k++) {
		const bf16 *a = (const bf16 *)&v[k];
#pragma unroll
		for (int e = 0; e < 8; e++)
			s1 += ln ? bf(a[e]) : bf(a[e]) * bf(a[e]);  /* zeros past C add nothing */
	}
	s1 = warp_sum(s1);
	float mu = 0.0f, rs;
	if (ln) {
		mu = s1 / C;
		float var = 0.0f;
#pragma unroll
		for (int k = 0; k < NCH; k++) {
			if ((k * 32 + lane) * 8 >= C)
				continue;
			const bf16 *a = (const bf16 *)&v[k];
#pragma unroll
			for (int e = 0; e < 8; e++) {
				float d = bf(a[e]) - mu;
				var += d * d;
			}
		}
		rs = rsqrtf(warp_sum(var) / C + eps);
	} else {
		rs = rsqrtf(s1 / C + eps);
	}
#pragma unroll
	for (int k = 0; k < NCH; k++) {
		int c = (k * 32 + lane) * 8;
		if (c >= C)
			continue;
		uint4 wu = *(const uint4 *)(w + c), bu = make_uint4(0, 0, 0, 0), o;
		if (ln && b)
			bu = *(const uint4 *)(b + c);
		const bf16 *a = (const bf16 *)&v[k], *wv = (const bf16 *)&wu, *bv = (const bf16 *)&bu;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float y = (bf(a[e]) - mu) * rs * bf(wv[e]);
			if (ln && b)
				y += bf(bv[e]);
			ov[e] = tobf(y);
		}
		*(uint4 *)(out + (size_t)r * C + c) = o;
	}
	if (lane == 0) {
		if (ln && mean)
			mean[r] = mu;
		if (rstd)
			rstd[r] = rs;
	}
}


/* k_norm_vec when the shape and alignment allow it: 1 if launched (or failed to launch:
 * *err set), 0 to take the element-strided kernel */
static int
norm_vec(cudaStream_t st, int *err, bf16 *xw, const bf16 *xin, const bf16 *t, bf16 *out, float *mean,
    float *rstd, const bf16 *w, const bf16 *b, int N, int C, float eps, int ln)
{
	if (C <= 0 || C % 8 || C > 4096 || !rlk_a16(xw) || !rlk_a16(xin) || !rlk_a16(t) || !rlk_a16(out) || !rlk_a16(w) || !rlk_a16(b))
		return 0;
	int n = (C + 255) / 256;
	unsigned g = norm_grid(N);
	dim3 bl(NORM_WARPS * 32);
#define NV(K) k_norm_vec<K><<<g, bl, 0, st>>>(xw, xin, t, out, mean, rstd, w, b, N, C, eps, ln)
	if (n <= 1) NV(1);
	else if (n <= 2) NV(2);
	else if (n <= 3) NV(3);
	else if (n <= 4) NV(4);
	else if (n <= 6) NV(6);
	else if (n <= 8) NV(8);
	else if (n <= 12) NV(12);
	else NV(16);
#undef NV
	*err = (int)cudaGetLastError();
	return 1;
}

/* ---- the backward norms with the row in registers ---------------------------------------
 * One warp per row, each lane with its NCH chunks of 8 columns of x and dout in registers
 * (16-byte loads: one pass over both), w in registers for all the warp's rows.  LN:
 * LayerNorm (dw and db when db != NULL), else RMSNorm (dw).  Each lane sums the weight
 * gradient of its columns over the warp's rows in registers (f32), the block's warps add
 * theirs in shared memory, and the block adds the sum to dw (db) once (atomicAdd: +=).
 * The same arithmetic per element as k_layernorm_bwd / k_rmsnorm_bwd below; the sums are
 * added in another order (f32 rounding only).  ACC: dx's old value is added to the f32
 * result before its rounding (dx += ...; dx aliases neither x nor dout), loaded just before
 * the store (loaded with x and dout it is live through the row's sums: ptxas spilled 136
 * bytes for RMSNorm at NCH 4 on sm_90, against 24 this way and 36 for the plain kernel).
 * Taken when C % 8 == 0, C <= 1024 (the register budget: NCH <= 4) and the act pointers
 * 16-byte aligned (norm_bwd_vec). */
#ifndef NB_SMEM
#define NB_SMEM(name, bytes) extern __shared__ float name[]
#endif
template <int NCH, int LN, int ACC>
__global__ void __launch_bounds__(NORM_WARPS * 32, LN && NCH > 3 ? 1 : 2)  /* 2 blocks: 128 registers */
k_norm_bwd_vec(bf16 *dx, float *dw, float *db, const bf16 *dout, const bf16 *x, const bf16 *w, const float *mean,
    const float *rstd, int N, int C)
{
	NB_SMEM(sh, (size_t)2 * C * sizeof(float));  /* dw (C), db (C) */
	int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nb = LN && db ? 2 : 1;
	for (int c = threadIdx.x; c < nb * C; c += blockDim.x)
		sh[c] = 0.0f;
	float aw[NCH][8], ab[NCH][8];
	uint4 wr[NCH];
#pragma unroll
	for (int k = 0; k < NCH; k++) {
		int c = (k * 32 + lane) * 8;
		wr[k] = make_uint4(0, 0, 0, 0);
		if (c < C)
			wr[k] = *(const uint4 *)(w + c);
#pragma unroll
		for (int e = 0; e < 8; e++)
			aw[k][e] = ab[k][e] = 0.0f;
	}
	for (long r = (long)blockIdx.x * NORM_WARPS + wp; r < N; r += (long)gridDim.x * NORM_WARPS) {
		uint4 xv[NCH], gv[NCH];
#pragma unroll
		for (int k = 0; k < NCH; k++) {
			int c = (k * 32 + lane) * 8;
			xv[k] = gv[k] = make_uint4(0, 0, 0, 0);
			if (c < C) {
				xv[k] = *(const uint4 *)(x + (size_t)r * C + c);
				gv[k] = *(const uint4 *)(dout + (size_t)r * C + c);
			}
		}
		float mu = LN ? mean[r] : 0.0f, rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
#pragma unroll
		for (int k = 0; k < NCH; k++) {
			const bf16 *xa = (const bf16 *)&xv[k], *ga = (const bf16 *)&gv[k], *wa = (const bf16 *)&wr[k];
#pragma unroll
			for (int e = 0; e < 8; e++) {  /* zeros past C add nothing */
				float xf = bf(xa[e]), g = bf(ga[e]);
				if (LN) {
					float xh = (xf - mu) * rs, wg = g * bf(wa[e]);
					s1 += wg;
					s2 += wg * xh;
					aw[k][e] += g * xh;
					ab[k][e] += g;
				} else {
					s1 += g * bf(wa[e]) * xf;
					aw[k][e] += g * xf * rs;
				}
			}
		}
		s1 = warp_sum(s1);
		float kk = 0.0f;
		if (LN) {
			s1 = s1 / C;
			s2 = warp_sum(s2) / C;
		} else {
			kk = s1 * rs * rs * rs / C;
		}
#pragma unroll
		for (int k = 0; k < NCH; k++) {
			int c = (k * 32 + lane) * 8;
			if (c >= C)
				continue;
			const bf16 *xa = (const bf16 *)&xv[k], *ga = (const bf16 *)&gv[k], *wa = (const bf16 *)&wr[k];
			uint4 pv = make_uint4(0, 0, 0, 0), o;
			if (ACC)
				pv = *(const uint4 *)(dx + (size_t)r * C + c);
			const bf16 *pa = (const bf16 *)&pv;
			bf16 *ov = (bf16 *)&o;
#pragma unroll
			for (int e = 0; e < 8; e++) {
				float v;
				if (LN) {
					float xh = (bf(xa[e]) - mu) * rs, wg = bf(ga[e]) * bf(wa[e]);
					v = rs * (wg - s1 - xh * s2);
				} else {
					v = rs * bf(wa[e]) * bf(ga[e]) - kk * bf(xa[e]);
				}
				ov[e] = tobf(ACC ? v + bf(pa[e]) : v);
			}
			*(uint4 *)(dx + (size_t)r * C + c) = o;
		}
	}
	__syncthreads();
#pragma unroll
	for (int k = 0; k < NCH; k++) {
		int c = (k * 32 + lane) * 8;
		if (c >= C)
			continue;
#pragma unroll
		for (int e = 0; e < 8; e++) {
			atomicAdd(&sh[c + e], aw[k][e]);
			if (LN && db)
				atomicAdd(&sh[C + c + e], ab[k][e]);
		}
	}
	__syncthreads();
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		atomicAdd(&dw[c], sh[c]);
		if (LN && db)
			atomicAdd(&db[c], sh[C + c]);
	}
}

/* blocks for k_norm_bwd_vec: as many as fit on the device at once (each block's partial
 * sums cost C atomics), at most one per NORM_WARPS rows */
template <int NCH, int LN, int ACC>
static unsigned
norm_bwd_grid(long N, size_t smem)
{
	static int nsm, occ;
	if (!occ) {
		int dev = 0;
		if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) !=
		    cudaSuccess || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_norm_bwd_vec<NCH, LN, ACC>,
		    NORM_WARPS * 32, smem) != cudaSuccess || occ < 1) {
			cudaGetLastError();
			nsm = 132;
			occ = 2;
		}
	}
	long b = (N + NORM_WARPS - 1) / NORM_WARPS, cap = (long)nsm * occ;
	return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* k_norm_bwd_vec when the option, the shape and the alignment allow it: 1 if launched (or
 * failed to launch: *err set), 0 to take the element-strided kernel */
static int
norm_bwd_vec(cudaStream_t st, int *err, bf16 *dx, float *dw, float *db, const bf16 *dout, const bf16 *x,
    const bf16 *w, const float *mean, const float *rstd, int N, int C, int ln, int acc)
{
	if (!(rlk_get_opts() & RLK_OPT_NORM_BWD_VEC) || C <= 0 || C % 8 || C > 1024 || !rlk_a16(dx) || !rlk_a16(dout) ||
	    !rlk_a16(x) || !rlk_a16(w))
		return 0;
	int n = (C + 255) / 256;
	size_t sm = (size_t)2 * C * sizeof(float);
	dim3 bl(NORM_WARPS * 32);
#define NB(K, L, A) k_norm_bwd_vec<K, L, A><<<norm_bwd_grid<K, L, A>(N, sm), bl, sm, st>>>(dx, dw, db, dout, x, \
	w, mean, rstd, N, C)
#define NBN(L, A) do { if (n <= 1) NB(1, L, A); else if (n <= 2) NB(2, L, A); else if (n <= 3) NB(3, L, A); \
	else NB(4, L, A); } while (0)
	if (ln && acc)
		NBN(1, 1);
	else if (ln)
		NBN(1, 0);
	else if (acc)
		NBN(0, 1);
	else
		NBN(0, 0);
#undef NBN
#undef NB
	*err = (int)cudaGetLastError();
	return 1;
}

/* ---- RMSNorm ---------------------------------------------------------------------- */
__global__ void k_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int N, int C,
    float eps)
{
	int lane = threadIdx.x & 31;
	long r = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
	if (r >= N)
		return;
	const bf16 *xr = x + (size_t)r * C;
	float ss = 0.0f;
	for (int c = lane; c < C; c += 32) {
		float v = bf(xr[c]);
		ss += v * v;
	}
	ss = warp_sum(ss);
	float rs = rsqrtf(ss / C + eps);
	for (int c = lane; c < C; c += 32)
		out[(size_t)r * C + c] = tobf(bf(xr[c]) * rs * bf(w[c]));
	if (lane == 0 && rstd)
		rstd[r] = rs;
}

/* ACC: dx += (the f32 value before its rounding), as k_norm_bwd_vec */
template <int ACC> __global__ void k_rmsnorm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x,
    const bf16 *w, const float *rstd, int N, int C)
{
	NB_SMEM(shdw, (size_t)C * sizeof(float));
	int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	for (int c = threadIdx.x; c < C; c += blockDim.x)
		shdw[c] = 0.0f;
	__syncthreads();
	for (long r = (long)blockIdx.x * NORM_WARPS + wp; r < N; r += (long)gridDim.x * NORM_WARPS) {
		const bf16 *xr = x + (size_t)r * C, *gr = dout + (size_t)r * C;
		float rs = rstd[r], dot = 0.0f;
		for (int c = lane; c < C; c += 32) {
			float xv = bf(xr[c]), g = bf(gr[c]);
			dot += g * bf(w[c]) * xv;
			atomicAdd(&shdw[c], g * xv * rs);
		}
		dot = warp_sum(dot);
		float k = dot * rs * rs * rs / C;
		for (int c = lane; c < C; c += 32) {
			float v = rs * bf(w[c]) * bf(gr[c]) - k * bf(xr[c]);
			dx[(size_t)r * C + c] = tobf(ACC ? v + bf(dx[(size_t)r * C + c]) : v);
		}
	}
	__syncthreads();
	for (int c = threadIdx.x; c < C; c += blockDim.x)
		atomicAdd(&dw[c], shdw[c]);
}

extern "C" int
rlk_rmsnorm_fwd(void *s, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps)
{
	if (N <= 0)
		return 0;
	int e = 0;
	if (norm_vec(RLK_STREAM(s), &e, NULL, (const bf16 *)x, NULL, (bf16 *)out, NULL, rstd, (const bf16 *)w,
	    NULL, N, C, eps, 0))
		return e;
	k_rmsnorm_fwd<<<norm_grid(N), NORM_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)out, rstd,
	    (const bf16 *)x, (const bf16 *)w, N, C, eps);
	RLK_RET();
}

static int
set_smem(const void *fn, size_t bytes)
{
	if (bytes <= 48 * 1024)
		return 0;
	return (int)cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int ACC>
static int
rmsnorm_bwd(void *s, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd,
    int N, int C)
{
	if (N <= 0)
		return 0;
	int e = 0;
	if (norm_bwd_vec(RLK_STREAM(s), &e, (bf16 *)dx, dw, NULL, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w,
	    NULL, rstd, N, C, 0, ACC))
		return e;
	size_t sm = (size_t)C * sizeof(float);
	e = set_smem((const void *)k_rmsnorm_bwd<ACC>, sm);
	if (e)
		return e;
	k_rmsnorm_bwd<ACC><<<norm_grid_bwd(N), NORM_WARPS * 32, sm, RLK_STREAM(s)>>>((bf16 *)dx, dw,
	    (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, rstd, N, C);
	RLK_RET();
}

extern "C" int
rlk_rmsnorm_bwd(void *s, void *dx, float *dw, const void *dout, const void *x, const void *w,
    const float *rstd, int N, int C)
{
	return rmsnorm_bwd<0>(s, dx, dw, dout, x, w, rstd, N, C);
}

extern "C" int
rlk_rmsnorm_bwd_add(void *s, void *dx, float *dw, const void *dout, const void *x, const void *w,
    const float *rstd, int N, int C)
{
	return rmsnorm_bwd<1>(s, dx, dw, dout, x, w, rstd, N, C);
}

/* ---- LayerNorm ------------------------------------------------------------------------ */
__global__ void k_layernorm_fwd(bf16 *out, float *mean, float *rstd, const bf16 *x, const bf16 *w,
    const bf16 *b, int N, int C, float eps)
{
	int lane = threadIdx.x & 31;
	long r = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
	if (r >= N)
		return;
	const bf16 *xr = x + (size_t)r * C;
	float sum = 0.0f;
	for (int c = lane; c < C; c += 32)
		sum += bf(xr[c]);
	float mu = warp_sum(sum) / C;
	float var = 0.0f;
	for (int c = lane; c < C; c += 32) {
		float d = bf(xr[c]) - mu;
		var += d * d;
	}
	float rs = rsqrtf(warp_sum(var) / C + eps);
	for (int c = lane; c < C; c += 32) {
		float v = (bf(xr[c]) - mu) * rs * bf(w[c]);
		if (b)
			v += bf(b[c]);
		out[(size_t)r * C + c] = tobf(v);
	}
	if (lane == 0) {
		if (mean)
			mean[r] = mu;
		if (rstd)
			rstd[r] = rs;
	}
}

/* ACC: dx += (the f32 value before its rounding), as k_norm_bwd_vec */
template <int ACC> __global__ void k_layernorm_bwd(bf16 *dx, float *dw, float *db, const bf16 *dout,
    const bf16 *x, const bf16 *w, const float *mean, const float *rstd, int N, int C)
{
	NB_SMEM(sh, (size_t)2 * C * sizeof(float));
	float *shw = sh, *shb = sh + C;
	int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	for (int c = threadIdx.x; c < 2 * C; c += blockDim.x)
		sh[c] = 0.0f;
	__syncthreads();
	for (long r = (long)blockIdx.x * NORM_WARPS + wp; r < N; r += (long)gridDim.x * NORM_WARPS) {
		const bf16 *xr = x + (size_t)r * C, *gr = dout + (size_t)r * C;
		float mu = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
		for (int c = lane; c < C; c += 32) {
			float xh = (bf(xr[c]) - mu) * rs, g = bf(gr[c]), wg = g * bf(w[c]);
			s1 += wg;
			s2 += wg * xh;
			atomicAdd(&shw[c], g * xh);
			atomicAdd(&shb[c], g);
		}
		s1 = warp_sum(s1) / C;
		s2 = warp_sum(s2) / C;
		for (int c = lane; c < C; c += 32) {
			float xh = (bf(xr[c]) - mu) * rs, wg = bf(gr[c]) * bf(w[c]), v = rs * (wg - s1 - xh * s2);
			dx[(size_t)r * C + c] = tobf(ACC ? v + bf(dx[(size_t)r * C + c]) : v);
		}
	}
	__syncthreads();
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		atomicAdd(&dw[c], shw[c]);
		if (db)
			atomicAdd(&db[c], shb[c]);
	}
}

extern "C" int
rlk_layernorm_fwd(void *s, void *out, float *mean, float *rstd, const void *x, const void *w,
    const void *b, int N, int C, float eps)
{
	if (N <= 0)
		return 0;
	int e = 0;
	if (norm_vec(RLK_STREAM(s), &e, NULL, (const bf16 *)x, NULL, (bf16 *)out, mean, rstd, (const bf16 *)w,
	    (const bf16 *)b, N, C, eps, 1))
		return e;
	k_layernorm_fwd<<<norm_grid(N), NORM_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)out, mean, rstd,
	    (const bf16 *)x, (const bf16 *)w, (const bf16 *)b, N, C, eps);
	RLK_RET();
}

template <int ACC>
static int
layernorm_bwd(void *s, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w,
    const float *mean, const float *rstd, int N, int C)
{
	if (N <= 0)
		return 0;
	int e = 0;
	if (norm_bwd_vec(RLK_STREAM(s), &e, (bf16 *)dx, dw, db, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w,
	    mean, rstd, N, C, 1, ACC))
		return e;
	size_t sm = (size_t)2 * C * sizeof(float);
	e = set_smem((const void *)k_layernorm_bwd<ACC>, sm);
	if (e)
		return e;
	k_layernorm_bwd<ACC><<<norm_grid_bwd(N), NORM_WARPS * 32, sm, RLK_STREAM(s)>>>((bf16 *)dx, dw, db,
	    (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w, mean, rstd, N, C);
	RLK_RET();
}

extern "C" int
rlk_layernorm_bwd(void *s, void *dx, float *dw, float *db, const void *dout, const void *x,
    const void *w, const float *mean, const float *rstd, int N, int C)
{
	return layernorm_bwd<0>(s, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

extern "C" int
rlk_layernorm_bwd_add(void *s, void *dx, float *dw, float *db, const void *dout, const void *x,
    const void *w, const float *mean, const float *rstd, int N, int C)
{
	return layernorm_bwd<1>(s, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

/* ---- q/k-norm: RMSNorm over HD of each q and k head; v copied -------------------------- */
__global__ void k_qknorm_fwd(bf16 *out, float *rstd, const bf16 *in, const bf16 *wq, const bf16 *wk,
    int N, int NH, int NKV, int HD, float eps)
{
	int lane = threadIdx.x & 31, heads = NH + 2 * NKV;
	long u = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
	if (u >= (long)N * heads)
		return;
	long r = u / heads;
	int h = (int)(u % heads);
	size_t off = (size_t)r * heads * HD + (size_t)h * HD;
	if (h >= NH + NKV) {
		for (int d = lane; d < HD; d += 32)
			out[off + d] = in[off + d];
		return;
	}
	const bf16 *w = h < NH ? wq : wk;
	float ss = 0.0f;
	for (int d = lane; d < HD; d += 32) {
		float v = bf(in[off + d]);
		ss += v * v;
	}
	float rs = rsqrtf(warp_sum(ss) / HD + eps);
	for (int d = lane; d < HD; d += 32)
		out[off + d] = tobf(bf(in[off + d]) * rs * bf(w[d]));
	if (lane == 0)
		rstd[r * (NH + NKV) + h] = rs;
}

__global__ void k_qknorm_bwd(bf16 *din, float *dwq, float *dwk, const bf16 *dout, const bf16 *in,
    const bf16 *wq, const bf16 *wk, const float *rstd, int N, int NH, int NKV, int HD)
{
	extern __shared__ float sh[];  /* dwq (HD), dwk (HD) */
	int lane = threadIdx.x & 31, heads = NH + 2 * NKV;
	for (int c = threadIdx.x; c < 2 * HD; c += blockDim.x)
		sh[c] = 0.0f;
	__syncthreads();
	long total = (long)N * heads;
	for (long u = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5); u < total;
	     u += (long)gridDim.x * NORM_WARPS) {
		long r = u / heads;
		int h = (int)(u % heads);
		size_t off = (size_t)r * heads * HD + (size_t)h * HD;
		if (h >= NH + NKV) {
			for (int d = lane; d < HD; d += 32)
				din[off + d] = dout[off + d];
			continue;
		}
		const bf16 *w = h < NH ? wq : wk;
		float *shw = h < NH ? sh : sh + HD;
		float rs = rstd[r * (NH + NKV) + h], dot = 0.0f;
		for (int d = lane; d < HD; d += 32) {
			float xv = bf(in[off + d]), g = bf(dout[off + d]);
			dot += g * bf(w[d]) * xv;
			atomicAdd(&shw[d], g * xv * rs);
		}
		float k = warp_sum(dot) * rs * rs * rs / HD;
		for (int d = lane; d < HD; d += 32)
			din[off + d] = tobf(rs * bf(w[d]) * bf(dout[off + d]) - k * bf(in[off + d]));
	}
	__syncthreads();
	for (int c = threadIdx.x; c < HD; c += blockDim.x) {
		atomicAdd(&dwq[c], sh[c]);
		atomicAdd(&dwk[c], sh[HD + c]);
	}
}

extern "C" int
rlk_qknorm_fwd(void *s, void *qkv_out, float *rstd, const void *qkv_in, const void *wq,
    const void *wk, int N, int NH, int NKV, int HD, float eps)
{
	long rows = (long)N * (NH + 2 * NKV);
	if (rows <= 0)
		return 0;
	k_qknorm_fwd<<<norm_grid(rows), NORM_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)qkv_out, rstd,
	    (const bf16 *)qkv_in, (const bf16 *)wq, (const bf16 *)wk, N, NH, NKV, HD, eps);
	RLK_RET();
}

extern "C" int
rlk_qknorm_bwd(void *s, void *dqkv_in, float *dwq, float *dwk, const void *dqkv_out,
    const void *qkv_in, const void *wq, const void *wk, const float *rstd, int N, int NH, int NKV,
    int HD)
{
	long rows = (long)N * (NH + 2 * NKV);
	if (rows <= 0)
		return 0;
	size_t sm = (size_t)2 * HD * sizeof(float);
	k_qknorm_bwd<<<norm_grid_bwd(rows), NORM_WARPS * 32, sm, RLK_STREAM(s)>>>((bf16 *)dqkv_in, dwq,
	    dwk, (const bf16 *)dqkv_out, (const bf16 *)qkv_in, (const bf16 *)wq, (const bf16 *)wk, rstd,
	    N, NH, NKV, HD);
	RLK_RET();
}

/* ---- residual add + norm (forward) ------------------------------------------------------ */
__global__ void k_add_norm_fwd(bf16 *x, bf16 *out, float *mean, float *rstd, const bf16 *t, const bf16 *w,
    const bf16 *b, int N, int C, float eps, int ln)
{
	int lane = threadIdx.x & 31;
	long r = (long)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
	if (r >= N)
		return;
	bf16 *xr = x + (size_t)r * C;
	const bf16 *tr = t + (size_t)r * C;
	float s1 = 0.0f;
	for (int c = lane; c < C; c += 32) {
		bf16 v = tobf(bf(xr[c]) + bf(tr[c]));
		xr[c] = v;
		s1 += ln ? bf(v) : bf(v) * bf(v);
	}
	s1 = warp_sum(s1);
	float mu = 0.0f, rs;
	if (ln) {
		mu = s1 / C;
		float var = 0.0f;
		for (int c = lane; c < C; c += 32) {
			float d = bf(xr[c]) - mu;
			var += d * d;
		}
		rs = rsqrtf(warp_sum(var) / C + eps);
	} else {
		rs = rsqrtf(s1 / C + eps);
	}
	for (int c = lane; c < C; c += 32) {
		float v = (bf(xr[c]) - mu) * rs * bf(w[c]);
		if (ln && b)
			v += bf(b[c]);
		out[(size_t)r * C + c] = tobf(v);
	}
	if (lane == 0) {
		if (ln && mean)
			mean[r] = mu;
		if (rstd)
			rstd[r] = rs;
	}
}

extern "C" int
rlk_add_norm_fwd(void *s, void *x, void *out, float *mean, float *rstd, const void *t, const void *w,
    const void *b, int N, int C, float eps, int ln)
{
	if (N <= 0)
		return 0;
	int e = 0;
	if (norm_vec(RLK_STREAM(s), &e, (bf16 *)x, NULL, (const bf16 *)t, (bf16 *)out, mean, rstd, (const bf16 *)w,
	    (const bf16 *)b, N, C, eps, ln))
		return e;
	k_add_norm_fwd<<<norm_grid(N), NORM_WARPS * 32, 0, RLK_STREAM(s)>>>((bf16 *)x, (bf16 *)out, mean, rstd,
	    (const bf16 *)t, (const bf16 *)w, (const bf16 *)b, N, C, eps, ln);
	RLK_RET();
}

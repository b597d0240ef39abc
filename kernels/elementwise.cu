/*
 * elementwise.cu — memory-bound kernels with one thread per element (or per
 * pair): cast, add, GELU, SwiGLU, embedding, RoPE, bias gradient, sum of
 * squares, fused AdamW, KV-cache write.  Semantics: lib/ops.h.
 *
 * Leaves out: row reductions (norm.cu, logprob.cu), attention (attn.cu).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define GRID_STRIDE(i, n) \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

/* ---- cast ------------------------------------------------------------------ */
__global__ void k_f32_to_bf16(bf16 *out, const float *in, size_t n)
{
	GRID_STRIDE(i, n) out[i] = tobf(in[i]);
}
__global__ void k_bf16_to_f32(float *out, const bf16 *in, size_t n)
{
	GRID_STRIDE(i, n) out[i] = bf(in[i]);
}

extern "C" int
rlk_cast(void *s, void *out, int out_dt, const void *in, int in_dt, size_t n)
{
	if (n == 0)
		return 0;
	if (out_dt == in_dt) {
		size_t es = out_dt == RL_F32 ? 4 : 2;
		return (int)cudaMemcpyAsync(out, in, n * es, cudaMemcpyDeviceToDevice, RLK_STREAM(s));
	}
	if (out_dt == RL_BF16 && in_dt == RL_F32)
		k_f32_to_bf16<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const float *)in, n);
	else if (out_dt == RL_F32 && in_dt == RL_BF16)
		k_bf16_to_f32<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((float *)out, (const bf16 *)in, n);
	else
		return (int)cudaErrorInvalidValue;
	RLK_RET();
}

/* ---- add ------------------------------------------------------------------- */
/* Pairs of bf16 when everything is 4-byte aligned. */
__global__ void k_add2(__nv_bfloat162 *out, const __nv_bfloat162 *a, const __nv_bfloat162 *b, size_t n2)
{
	GRID_STRIDE(i, n2) {
		float2 x = __bfloat1622float2(a[i]), y = __bfloat1622float2(b[i]);
		out[i] = __floats2bfloat162_rn(x.x + y.x, x.y + y.y);
	}
}
__global__ void k_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
	GRID_STRIDE(i, n) out[i] = tobf(bf(a[i]) + bf(b[i]));
}

extern "C" int
rlk_add(void *s, void *out, const void *a, const void *b, size_t n)
{
	if (n == 0)
		return 0;
	if (n % 2 == 0 && (((uintptr_t)out | (uintptr_t)a | (uintptr_t)b) & 3) == 0)
		k_add2<<<rlk_blocks(n / 2, 256), 256, 0, RLK_STREAM(s)>>>((__nv_bfloat162 *)out,
		    (const __nv_bfloat162 *)a, (const __nv_bfloat162 *)b, n / 2);
	else
		k_add<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)a,
		    (const bf16 *)b, n);
	RLK_RET();
}

/* ---- GELU (tanh approximation) ----------------------------------------------- */
#define GELU_K 0.7978845608028654f  /* sqrt(2/pi) */

__global__ void k_gelu_fwd(bf16 *out, const bf16 *x, size_t n)
{
	GRID_STRIDE(i, n) {
		float v = bf(x[i]);
		float t = tanhf(GELU_K * (v + 0.044715f * v * v * v));
		out[i] = tobf(0.5f * v * (1.0f + t));
	}
}
__global__ void k_gelu_bwd(bf16 *dx, const bf16 *dout, const bf16 *x, size_t n)
{
	GRID_STRIDE(i, n) {
		float v = bf(x[i]);
		float t = tanhf(GELU_K * (v + 0.044715f * v * v * v));
		float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
		dx[i] = tobf(bf(dout[i]) * d);
	}
}

extern "C" int
rlk_gelu_fwd(void *s, void *out, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	k_gelu_fwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)x, n);
	RLK_RET();
}
extern "C" int
rlk_gelu_bwd(void *s, void *dx, const void *dout, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	k_gelu_bwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dx, (const bf16 *)dout,
	    (const bf16 *)x, n);
	RLK_RET();
}

/* ---- SwiGLU: out (N,H) = silu(gu[:, :H]) * gu[:, H:] ---------------------------- */
__global__ void k_swiglu_fwd(bf16 *out, const bf16 *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	GRID_STRIDE(i, n) {
		size_t r = i / H, c = i % H;
		float g = bf(gu[r * 2 * H + c]), u = bf(gu[r * 2 * H + H + c]);
		out[i] = tobf(g / (1.0f + expf(-g)) * u);
	}
}
__global__ void k_swiglu_bwd(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	GRID_STRIDE(i, n) {
		size_t r = i / H, c = i % H;
		float g = bf(gu[r * 2 * H + c]), u = bf(gu[r * 2 * H + H + c]), d = bf(dout[i]);
		float sg = 1.0f / (1.0f + expf(-g));
		dgu[r * 2 * H + c] = tobf(d * u * sg * (1.0f + g * (1.0f - sg)));
		dgu[r * 2 * H + H + c] = tobf(d * g * sg);
	}
}

extern "C" int
rlk_swiglu_fwd(void *s, void *out, const void *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	if (n == 0)
		return 0;
	k_swiglu_fwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)gu, N, H);
	RLK_RET();
}
extern "C" int
rlk_swiglu_bwd(void *s, void *dgu, const void *dout, const void *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	if (n == 0)
		return 0;
	k_swiglu_bwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dgu, (const bf16 *)dout,
	    (const bf16 *)gu, N, H);
	RLK_RET();
}

/* ---- embedding ----------------------------------------------------------------- */
__global__ void k_embed_fwd(bf16 *out, const int32_t *tok, const int32_t *pos, const bf16 *wte,
    const bf16 *wpe, int N, int C)
{
	size_t n = (size_t)N * C;
	GRID_STRIDE(i, n) {
		size_t r = i / C, c = i % C;
		float v = bf(wte[(size_t)tok[r] * C + c]);
		if (wpe)
			v += bf(wpe[(size_t)pos[r] * C + c]);
		out[i] = tobf(v);
	}
}
__global__ void k_embed_bwd(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tok,
    const int32_t *pos, int N, int C)
{
	size_t n = (size_t)N * C;
	GRID_STRIDE(i, n) {
		size_t r = i / C, c = i % C;
		float g = bf(dout[i]);
		atomicAdd(&dwte[(size_t)tok[r] * C + c], g);
		if (dwpe)
			atomicAdd(&dwpe[(size_t)pos[r] * C + c], g);
	}
}

extern "C" int
rlk_embed_fwd(void *s, void *out, const int32_t *tok, const int32_t *pos, const void *wte,
    const void *wpe, int N, int C)
{
	size_t n = (size_t)N * C;
	if (n == 0)
		return 0;
	k_embed_fwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, tok, pos,
	    (const bf16 *)wte, (const bf16 *)wpe, N, C);
	RLK_RET();
}
extern "C" int
rlk_embed_bwd(void *s, float *dwte, float *dwpe, const void *dout, const int32_t *tok,
    const int32_t *pos, int N, int C)
{
	size_t n = (size_t)N * C;
	if (n == 0)
		return 0;
	k_embed_bwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>(dwte, dwpe, (const bf16 *)dout,
	    tok, pos, N, C);
	RLK_RET();
}

/* ---- RoPE (rotate-half), in place on the q and k heads -------------------------- */
__global__ void k_rope(bf16 *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, float theta,
    float sign)
{
	int half = HD / 2, heads = NH + NKV;
	size_t n = (size_t)N * heads * half;
	size_t ld = (size_t)(NH + 2 * NKV) * HD;
	GRID_STRIDE(i, n) {
		int f = (int)(i % half);
		size_t rest = i / half;
		int h = (int)(rest % heads);
		size_t r = rest / heads;
		float inv = powf(theta, -2.0f * (float)f / (float)HD);
		float ang = (float)pos[r] * inv, sn, cs;
		sincosf(ang, &sn, &cs);
		sn *= sign;
		bf16 *p = qkv + r * ld + (size_t)h * HD;
		float a = bf(p[f]), b = bf(p[f + half]);
		p[f] = tobf(a * cs - b * sn);
		p[f + half] = tobf(b * cs + a * sn);
	}
}

extern "C" int
rlk_rope(void *s, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, float theta, int sign)
{
	size_t n = (size_t)N * (NH + NKV) * (HD / 2);
	if (n == 0)
		return 0;
	k_rope<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)qkv, pos, N, NH, NKV, HD, theta,
	    sign < 0 ? -1.0f : 1.0f);
	RLK_RET();
}

/* ---- bias gradient: column sums --------------------------------------------------- */
/* Block (32, 8): 32 columns, 8 row lanes; blockIdx.y strides over row chunks. */
__global__ void k_colsum(float *db, const bf16 *dout, int N, int OC, int rows_per)
{
	__shared__ float sh[8][33];
	int c = blockIdx.x * 32 + threadIdx.x;
	int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
	float acc = 0.0f;
	if (c < OC)
		for (int r = r0 + threadIdx.y; r < r1; r += 8)
			acc += bf(dout[(size_t)r * OC + c]);
	sh[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < OC) {
		for (int k = 1; k < 8; k++)
			acc += sh[k][threadIdx.x];
		atomicAdd(&db[c], acc);
	}
}

extern "C" int
rlk_colsum(void *s, float *db, const void *dout, int N, int OC)
{
	if (N <= 0 || OC <= 0)
		return 0;
	int rows_per = 256;
	dim3 grid((OC + 31) / 32, (N + rows_per - 1) / rows_per);
	k_colsum<<<grid, dim3(32, 8), 0, RLK_STREAM(s)>>>(db, (const bf16 *)dout, N, OC, rows_per);
	RLK_RET();
}

/* ---- sum of squares (double accumulation) ------------------------------------------ */
__global__ void k_sumsq(double *acc, const float *x, size_t n)
{
	double a = 0.0;
	GRID_STRIDE(i, n) { double v = x[i]; a += v * v; }
	for (int o = 16; o > 0; o >>= 1)
		a += __shfl_xor_sync(0xffffffffu, a, o);
	__shared__ double sh[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	if (lane == 0)
		sh[w] = a;
	__syncthreads();
	if (w == 0) {
		a = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0;
		for (int o = 16; o > 0; o >>= 1)
			a += __shfl_xor_sync(0xffffffffu, a, o);
		if (lane == 0)
			atomicAdd(acc, a);
	}
}

extern "C" int
rlk_sumsq(void *s, double *acc, const float *x, size_t n)
{
	if (n == 0)
		return 0;
	unsigned b = rlk_blocks(n, 256);
	if (b > 1024)
		b = 1024;
	k_sumsq<<<b, 256, 0, RLK_STREAM(s)>>>(acc, x, n);
	RLK_RET();
}

/* ---- AdamW on fp32 master weights, refreshing the bf16 copy ------------------------- */
__global__ void k_adamw(float *param, bf16 *wcopy, const float *grad, float *m, float *v, size_t n,
    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gs)
{
	GRID_STRIDE(i, n) {
		float g = grad[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * g;
		float vi = b2 * v[i] + (1.0f - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		float p = param[i];
		p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
		param[i] = p;
		if (wcopy)
			wcopy[i] = tobf(p);
	}
}

extern "C" int
rlk_adamw(void *s, float *param, void *wcopy, const float *grad, float *m, float *v, size_t n,
    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale)
{
	if (n == 0)
		return 0;
	k_adamw<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>(param, (bf16 *)wcopy, grad, m, v, n,
	    lr, b1, b2, eps, wd, bc1, bc2, grad_scale);
	RLK_RET();
}

/* ---- KV-cache write ------------------------------------------------------------------ */
__global__ void k_kv_write(bf16 *kc, bf16 *vc, const bf16 *qkv, const int32_t *slot, int N, int NH,
    int NKV, int HD)
{
	size_t per = (size_t)NKV * HD, n = (size_t)N * per;
	size_t ld = (size_t)(NH + 2 * NKV) * HD;
	GRID_STRIDE(i, n) {
		size_t r = i / per, j = i % per;
		int sl = slot[r];
		if (sl < 0)
			continue;
		const bf16 *row = qkv + r * ld + (size_t)NH * HD;
		kc[(size_t)sl * per + j] = row[j];
		vc[(size_t)sl * per + j] = row[per + j];
	}
}

extern "C" int
rlk_kv_write(void *s, void *kc, void *vc, const void *qkv, const int32_t *slot, int N, int NH,
    int NKV, int HD)
{
	size_t n = (size_t)N * NKV * HD;
	if (n == 0)
		return 0;
	k_kv_write<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)kc, (bf16 *)vc,
	    (const bf16 *)qkv, slot, N, NH, NKV, HD);
	RLK_RET();
}

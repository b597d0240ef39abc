/*
 * elementwise.cu — memory-bound kernels: cast, add, GELU, SwiGLU, embedding, RoPE,
 * bias gradient, sum of squares, fused AdamW (one tensor, or many in one launch),
 * KV-cache write.  Semantics: lib/compute/ops.h.
 *
 * cast, add, GELU, SwiGLU and RoPE have two forms: one thread per element (or pair),
 * and "vec" kernels (suffix 8) where each thread moves 8 bf16 (16 bytes) per load and
 * store, taken when every pointer is 16-byte aligned (and for SwiGLU H, for RoPE HD/2,
 * a multiple of 8); a size that is not a multiple of 8 leaves a tail of < 8 elements
 * that the first threads do one by one.  Both forms compute each element through the
 * same __device__ function, so they give the same bits.  rlk_set_opts(0) (the backend's
 * RL_CUDA_EW_VEC=0) keeps the element-wise forms.  The sum of squares reads float4 the same
 * way (its double sum then goes in another order).
 *
 * Leaves out: row reductions (norm.cu, logprob.cu), attention (attn.cu).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

#define GRID_STRIDE(i, n) \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

/* the first threads of the grid take a tail of < 8 elements: element i0 + t for thread t */
#define TAIL(i, i0, n) \
	for (size_t i = (i0) + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i = (n))

static unsigned rlk_opts_v = RLK_OPT_ALL;

extern "C" void rlk_set_opts(unsigned opts) { rlk_opts_v = opts; }
extern "C" unsigned rlk_get_opts(void) { return rlk_opts_v; }


/* the vec kernels: RLK_OPT_EW_VEC set and every pointer given 16-byte aligned */
static int
ew_vec(const void *a, const void *b, const void *c)
{
	return (rlk_opts_v & RLK_OPT_EW_VEC) && rlk_a16(a) && rlk_a16(b) && rlk_a16(c);
}

/* ---- cast ------------------------------------------------------------------ */
__global__ void k_f32_to_bf16(bf16 *out, const float *in, size_t n)
{
	GRID_STRIDE(i, n) out[i] = tobf(in[i]);
}
__global__ void k_bf16_to_f32(float *out, const bf16 *in, size_t n)
{
	GRID_STRIDE(i, n) out[i] = bf(in[i]);
}
__global__ void k_f32_to_bf168(bf16 *out, const float *in, size_t n)
{
	size_t n8 = n / 8;
	GRID_STRIDE(i, n8) {
		float4 a = ((const float4 *)in)[2 * i], b = ((const float4 *)in)[2 * i + 1];
		uint4 o;
		bf16 *ov = (bf16 *)&o;
		ov[0] = tobf(a.x); ov[1] = tobf(a.y); ov[2] = tobf(a.z); ov[3] = tobf(a.w);
		ov[4] = tobf(b.x); ov[5] = tobf(b.y); ov[6] = tobf(b.z); ov[7] = tobf(b.w);
		((uint4 *)out)[i] = o;
	}
	TAIL(i, n8 * 8, n) out[i] = tobf(in[i]);
}
__global__ void k_bf16_to_f328(float *out, const bf16 *in, size_t n)
{
	size_t n8 = n / 8;
	GRID_STRIDE(i, n8) {
		uint4 u = ((const uint4 *)in)[i];
		const bf16 *a = (const bf16 *)&u;
		((float4 *)out)[2 * i] = make_float4(bf(a[0]), bf(a[1]), bf(a[2]), bf(a[3]));
		((float4 *)out)[2 * i + 1] = make_float4(bf(a[4]), bf(a[5]), bf(a[6]), bf(a[7]));
	}
	TAIL(i, n8 * 8, n) out[i] = bf(in[i]);
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
	int vec = ew_vec(out, in, NULL);
	if (out_dt == RL_BF16 && in_dt == RL_F32) {
		if (vec)
			k_f32_to_bf168<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const float *)in, n);
		else
			k_f32_to_bf16<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const float *)in, n);
	} else if (out_dt == RL_F32 && in_dt == RL_BF16) {
		if (vec)
			k_bf16_to_f328<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((float *)out, (const bf16 *)in, n);
		else
			k_bf16_to_f32<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((float *)out, (const bf16 *)in, n);
	} else {
		return (int)cudaErrorInvalidValue;
	}
	RLK_RET();
}

/* ---- add ------------------------------------------------------------------- */
static __device__ __forceinline__ bf16 add1(bf16 a, bf16 b) { return tobf(bf(a) + bf(b)); }

/* Pairs of bf16 when everything is 4-byte aligned. */
__global__ void k_add2(__nv_bfloat162 *out, const __nv_bfloat162 *a, const __nv_bfloat162 *b, size_t n2)
{
	GRID_STRIDE(i, n2) {
		__nv_bfloat162 x = a[i], y = b[i], o;
		o.x = add1(x.x, y.x);
		o.y = add1(x.y, y.y);
		out[i] = o;
	}
}
__global__ void k_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
	GRID_STRIDE(i, n) out[i] = add1(a[i], b[i]);
}
__global__ void k_add8(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
	size_t n8 = n / 8;
	GRID_STRIDE(i, n8) {
		uint4 ua = ((const uint4 *)a)[i], ub = ((const uint4 *)b)[i], o;
		const bf16 *x = (const bf16 *)&ua, *y = (const bf16 *)&ub;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++)
			ov[e] = add1(x[e], y[e]);
		((uint4 *)out)[i] = o;
	}
	TAIL(i, n8 * 8, n) out[i] = add1(a[i], b[i]);
}

extern "C" int
rlk_add(void *s, void *out, const void *a, const void *b, size_t n)
{
	if (n == 0)
		return 0;
	if (ew_vec(out, a, b))
		k_add8<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)a,
		    (const bf16 *)b, n);
	else if (n % 2 == 0 && (((uintptr_t)out | (uintptr_t)a | (uintptr_t)b) & 3) == 0)
		k_add2<<<rlk_blocks(n / 2, 256), 256, 0, RLK_STREAM(s)>>>((__nv_bfloat162 *)out,
		    (const __nv_bfloat162 *)a, (const __nv_bfloat162 *)b, n / 2);
	else
		k_add<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)a,
		    (const bf16 *)b, n);
	RLK_RET();
}

/* ---- GELU (tanh approximation) ----------------------------------------------- */
#define GELU_K 0.7978845608028654f  /* sqrt(2/pi) */

static __device__ __forceinline__ float
gelu_f(float v)
{
	float t = tanhf(GELU_K * (v + 0.044715f * v * v * v));
	return 0.5f * v * (1.0f + t);
}
/* dout * gelu'(v) */
static __device__ __forceinline__ float
gelu_b(float g, float v)
{
	float t = tanhf(GELU_K * (v + 0.044715f * v * v * v));
	float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
	return g * d;
}

__global__ void k_gelu_fwd(bf16 *out, const bf16 *x, size_t n)
{
	GRID_STRIDE(i, n) out[i] = tobf(gelu_f(bf(x[i])));
}
__global__ void k_gelu_bwd(bf16 *dx, const bf16 *dout, const bf16 *x, size_t n)
{
	GRID_STRIDE(i, n) dx[i] = tobf(gelu_b(bf(dout[i]), bf(x[i])));
}
__global__ void k_gelu_fwd8(bf16 *out, const bf16 *x, size_t n)
{
	size_t n8 = n / 8;
	GRID_STRIDE(i, n8) {
		uint4 u = ((const uint4 *)x)[i], o;
		const bf16 *a = (const bf16 *)&u;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++)
			ov[e] = tobf(gelu_f(bf(a[e])));
		((uint4 *)out)[i] = o;
	}
	TAIL(i, n8 * 8, n) out[i] = tobf(gelu_f(bf(x[i])));
}
__global__ void k_gelu_bwd8(bf16 *dx, const bf16 *dout, const bf16 *x, size_t n)
{
	size_t n8 = n / 8;
	GRID_STRIDE(i, n8) {
		uint4 u = ((const uint4 *)x)[i], ug = ((const uint4 *)dout)[i], o;
		const bf16 *a = (const bf16 *)&u, *gv = (const bf16 *)&ug;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++)
			ov[e] = tobf(gelu_b(bf(gv[e]), bf(a[e])));
		((uint4 *)dx)[i] = o;
	}
	TAIL(i, n8 * 8, n) dx[i] = tobf(gelu_b(bf(dout[i]), bf(x[i])));
}

extern "C" int
rlk_gelu_fwd(void *s, void *out, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	if (ew_vec(out, x, NULL))
		k_gelu_fwd8<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)x, n);
	else
		k_gelu_fwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)x, n);
	RLK_RET();
}
extern "C" int
rlk_gelu_bwd(void *s, void *dx, const void *dout, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	if (ew_vec(dx, dout, x))
		k_gelu_bwd8<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dx, (const bf16 *)dout,
		    (const bf16 *)x, n);
	else
		k_gelu_bwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dx, (const bf16 *)dout,
		    (const bf16 *)x, n);
	RLK_RET();
}

/* ---- SwiGLU: out (N,H) = silu(gu[:, :H]) * gu[:, H:] ---------------------------- */
static __device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }
/* the gradients of gate (*dg) and up (*du) from d = dout */
static __device__ __forceinline__ void
swiglu_b(float g, float u, float d, float *dg, float *du)
{
	float sg = 1.0f / (1.0f + expf(-g));
	*dg = d * u * sg * (1.0f + g * (1.0f - sg));
	*du = d * g * sg;
}

__global__ void k_swiglu_fwd(bf16 *out, const bf16 *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	GRID_STRIDE(i, n) {
		size_t r = i / H, c = i % H;
		out[i] = tobf(swiglu_f(bf(gu[r * 2 * H + c]), bf(gu[r * 2 * H + H + c])));
	}
}
__global__ void k_swiglu_bwd(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	GRID_STRIDE(i, n) {
		size_t r = i / H, c = i % H;
		float dg, du;
		swiglu_b(bf(gu[r * 2 * H + c]), bf(gu[r * 2 * H + H + c]), bf(dout[i]), &dg, &du);
		dgu[r * 2 * H + c] = tobf(dg);
		dgu[r * 2 * H + H + c] = tobf(du);
	}
}
/* H a multiple of 8: 8 columns of a row per thread */
__global__ void k_swiglu_fwd8(bf16 *out, const bf16 *gu, int N, int H)
{
	size_t H8 = (size_t)H / 8, n8 = (size_t)N * H8;
	GRID_STRIDE(i, n8) {
		size_t r = i / H8, c = i % H8 * 8;
		uint4 ug = *(const uint4 *)(gu + r * 2 * H + c), uu = *(const uint4 *)(gu + r * 2 * H + H + c), o;
		const bf16 *gv = (const bf16 *)&ug, *uv = (const bf16 *)&uu;
		bf16 *ov = (bf16 *)&o;
#pragma unroll
		for (int e = 0; e < 8; e++)
			ov[e] = tobf(swiglu_f(bf(gv[e]), bf(uv[e])));
		*(uint4 *)(out + r * H + c) = o;
	}
}
__global__ void k_swiglu_bwd8(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int H)
{
	size_t H8 = (size_t)H / 8, n8 = (size_t)N * H8;
	GRID_STRIDE(i, n8) {
		size_t r = i / H8, c = i % H8 * 8;
		uint4 ug = *(const uint4 *)(gu + r * 2 * H + c), uu = *(const uint4 *)(gu + r * 2 * H + H + c);
		uint4 ud = *(const uint4 *)(dout + r * H + c), og, ou;
		const bf16 *gv = (const bf16 *)&ug, *uv = (const bf16 *)&uu, *dv = (const bf16 *)&ud;
		bf16 *ogv = (bf16 *)&og, *ouv = (bf16 *)&ou;
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float dg, du;
			swiglu_b(bf(gv[e]), bf(uv[e]), bf(dv[e]), &dg, &du);
			ogv[e] = tobf(dg);
			ouv[e] = tobf(du);
		}
		*(uint4 *)(dgu + r * 2 * H + c) = og;
		*(uint4 *)(dgu + r * 2 * H + H + c) = ou;
	}
}

extern "C" int
rlk_swiglu_fwd(void *s, void *out, const void *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	if (n == 0)
		return 0;
	if (H % 8 == 0 && ew_vec(out, gu, NULL))
		k_swiglu_fwd8<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)gu, N, H);
	else
		k_swiglu_fwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)out, (const bf16 *)gu, N, H);
	RLK_RET();
}
extern "C" int
rlk_swiglu_bwd(void *s, void *dgu, const void *dout, const void *gu, int N, int H)
{
	size_t n = (size_t)N * H;
	if (n == 0)
		return 0;
	if (H % 8 == 0 && ew_vec(dgu, dout, gu))
		k_swiglu_bwd8<<<rlk_blocks(n / 8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dgu, (const bf16 *)dout,
		    (const bf16 *)gu, N, H);
	else
		k_swiglu_bwd<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)dgu, (const bf16 *)dout,
		    (const bf16 *)gu, N, H);
	RLK_RET();
}

/* ---- embedding ----------------------------------------------------------------- */
__global__ void k_embed_fwd(bf16 *out, const int32_t *tok, const int32_t *pos, const bf16 *wte,
    const bf16 *wpe, int N, int C)
{
	size_t n = (size_t)N * C;
	pdl_trigger();
	pdl_wait();
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
	cudaError_t e = rlk_launch(k_embed_fwd, dim3(rlk_blocks(n, 256)), dim3(256), 0, RLK_STREAM(s), (bf16 *)out,
	    tok, pos, (const bf16 *)wte, (const bf16 *)wpe, N, C);
	if (e != cudaSuccess)
		return (int)e;
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
/* the angle's sine (times sign) and cosine for frequency f */
static __device__ __forceinline__ void
rope_sc(int f, int HD, const rl_rope &rope, int32_t pos, float sign, float *sn, float *cs)
{
	float inv = rope_inv(rope, f, HD);
	float ang = (float)pos * inv;
	sincosf(ang, sn, cs);
	*sn *= sign;
}
static __device__ __forceinline__ void
rope_rot(bf16 *pa, bf16 *pb, float sn, float cs)
{
	float a = bf(*pa), b = bf(*pb);
	*pa = tobf(a * cs - b * sn);
	*pb = tobf(b * cs + a * sn);
}

__global__ void k_rope(bf16 *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope,
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
		float sn, cs;
		rope_sc(f, HD, rope, pos[r], sign, &sn, &cs);
		bf16 *p = qkv + r * ld + (size_t)h * HD;
		rope_rot(p + f, p + f + half, sn, cs);
	}
}

/* HD/2 a multiple of 8: a thread takes 8 frequencies of one token (their sines and cosines
 * computed once) for ROPE_HPT heads, 16-byte loads and stores */
#define ROPE_HPT 4
__global__ void k_rope8(bf16 *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope,
    float sign)
{
	int half = HD / 2, heads = NH + NKV, fg = half / 8, hg = (heads + ROPE_HPT - 1) / ROPE_HPT;
	size_t n = (size_t)N * hg * fg;
	size_t ld = (size_t)(NH + 2 * NKV) * HD;
	GRID_STRIDE(i, n) {
		int f0 = (int)(i % fg) * 8;
		size_t rest = i / fg;
		int h0 = (int)(rest % hg) * ROPE_HPT, h1 = min(h0 + ROPE_HPT, heads);
		size_t r = rest / hg;
		int32_t ps = pos[r];
		float sn[8], cs[8];
#pragma unroll
		for (int e = 0; e < 8; e++)
			rope_sc(f0 + e, HD, rope, ps, sign, &sn[e], &cs[e]);
		for (int h = h0; h < h1; h++) {
			bf16 *p = qkv + r * ld + (size_t)h * HD + f0;
			uint4 ua = *(const uint4 *)p, ub = *(const uint4 *)(p + half);
			bf16 *av = (bf16 *)&ua, *bv = (bf16 *)&ub;
#pragma unroll
			for (int e = 0; e < 8; e++)
				rope_rot(&av[e], &bv[e], sn[e], cs[e]);
			*(uint4 *)p = ua;
			*(uint4 *)(p + half) = ub;
		}
	}
}

extern "C" int
rlk_rope(void *s, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope, int sign)
{
	size_t n = (size_t)N * (NH + NKV) * (HD / 2);
	if (n == 0)
		return 0;
	float sg = sign < 0 ? -1.0f : 1.0f;
	if ((HD / 2) % 8 == 0 && ew_vec(qkv, NULL, NULL)) {
		size_t n8 = (size_t)N * ((NH + NKV + ROPE_HPT - 1) / ROPE_HPT) * (HD / 16);
		k_rope8<<<rlk_blocks(n8, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)qkv, pos, N, NH, NKV, HD, rope, sg);
	} else {
		k_rope<<<rlk_blocks(n, 256), 256, 0, RLK_STREAM(s)>>>((bf16 *)qkv, pos, N, NH, NKV, HD, rope, sg);
	}
	RLK_RET();
}

/* ---- bias gradient: column sums --------------------------------------------------- */
/* The element form (any OC, any alignment; RL_CUDA_COLSUM_VEC=0).  Block (32, 8): 32 columns, 8 row lanes; blockIdx.y strides over row chunks. */
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

/* OC % 8 == 0 and dout 16-byte aligned: a block of 8 warps takes 256 columns (8 per lane,
 * 16-byte loads: a warp reads 512 contiguous bytes of a row) and COLSUM_ROWS rows (warp w:
 * rows w, w + 8, ...), f32 sums in registers, the warps' sums merged in shared memory,
 * one atomicAdd per column per block. */
#define COLSUM_ROWS 128
__global__ void __launch_bounds__(256)
k_colsum8(float *db, const bf16 *dout, int N, int OC)
{
	__shared__ float sh[8][256];
	int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
	int c0 = blockIdx.x * 256 + lane * 8;
	int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(N, r0 + COLSUM_ROWS);
	float acc[8];
#pragma unroll
	for (int e = 0; e < 8; e++)
		acc[e] = 0.0f;
	if (c0 < OC) {
#pragma unroll 4
		for (int r = r0 + wp; r < r1; r += 8) {
			uint4 u = *(const uint4 *)(dout + (size_t)r * OC + c0);
			const bf16 *a = (const bf16 *)&u;
#pragma unroll
			for (int e = 0; e < 8; e++)
				acc[e] += bf(a[e]);
		}
	}
#pragma unroll
	for (int e = 0; e < 8; e++)
		sh[wp][lane * 8 + e] = acc[e];
	__syncthreads();
	int c = blockIdx.x * 256 + threadIdx.x;
	if (c < OC) {
		float t = 0.0f;
#pragma unroll
		for (int k = 0; k < 8; k++)
			t += sh[k][threadIdx.x];
		atomicAdd(&db[c], t);
	}
}

extern "C" int
rlk_colsum(void *s, float *db, const void *dout, int N, int OC)
{
	if (N <= 0 || OC <= 0)
		return 0;
	if ((rlk_opts_v & RLK_OPT_COLSUM_VEC) && OC % 8 == 0 && rlk_a16(dout) && (N + COLSUM_ROWS - 1) / COLSUM_ROWS <= 65535) {
		dim3 grid((OC + 255) / 256, (N + COLSUM_ROWS - 1) / COLSUM_ROWS);
		k_colsum8<<<grid, 256, 0, RLK_STREAM(s)>>>(db, (const bf16 *)dout, N, OC);
		RLK_RET();
	}
	int rows_per = 256;
	dim3 grid((OC + 31) / 32, (N + rows_per - 1) / rows_per);
	k_colsum<<<grid, dim3(32, 8), 0, RLK_STREAM(s)>>>(db, (const bf16 *)dout, N, OC, rows_per);
	RLK_RET();
}

/* ---- sum of squares (double accumulation) ------------------------------------------ */
/* V4: float4 loads (x 16-byte aligned), the n % 4 tail by the grid's first threads */
template <int V4>
__global__ void k_sumsq(double *acc, const float *x, size_t n)
{
	double a = 0.0;
	if (V4) {
		size_t n4 = n / 4;
		GRID_STRIDE(i, n4) {
			float4 v = ((const float4 *)x)[i];
			a += (double)v.x * v.x;
			a += (double)v.y * v.y;
			a += (double)v.z * v.z;
			a += (double)v.w * v.w;
		}
		TAIL(i, n4 * 4, n) { double v = x[i]; a += v * v; }
	} else {
		GRID_STRIDE(i, n) { double v = x[i]; a += v * v; }
	}
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
	int v4 = ew_vec(x, NULL, NULL);
	unsigned b = rlk_blocks(v4 ? n / 4 : n, 256);
	if (b > 1024)
		b = 1024;
	if (v4)
		k_sumsq<1><<<b, 256, 0, RLK_STREAM(s)>>>(acc, x, n);
	else
		k_sumsq<0><<<b, 256, 0, RLK_STREAM(s)>>>(acc, x, n);
	RLK_RET();
}

/* ---- AdamW on fp32 master weights, refreshing the bf16 copy ------------------------- */
/* One element's update: m, v in place, the new parameter returned.  Every AdamW kernel
 * below goes through it, so they compute the same bits. */
static __device__ __forceinline__ float
adamw_upd(float p, float gr, float *m, float *v, float lr, float b1, float b2, float eps, float wd,
    float bc1, float bc2, float gs)
{
	float g = gr * gs;
	float mi = b1 * *m + (1.0f - b1) * g;
	float vi = b2 * *v + (1.0f - b2) * g * g;
	*m = mi;
	*v = vi;
	p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
	return p;
}

__global__ void k_adamw(float *param, bf16 *wcopy, const float *grad, float *m, float *v, size_t n,
    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gs)
{
	GRID_STRIDE(i, n) {
		float mi = m[i], vi = v[i];
		float p = adamw_upd(param[i], grad[i], &mi, &vi, lr, b1, b2, eps, wd, bc1, bc2, gs);
		m[i] = mi;
		v[i] = vi;
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

/* Multi-tensor AdamW: one block per chunk of the table (at most RLK_ADAMW_CHUNK elements of
 * one segment).  A chunk whose offset is a multiple of 4 goes by float4 (and 8-byte bf16
 * stores) when the launcher found every base pointer aligned (vec), then the chunk's last
 * n % 4 elements one by one; other chunks element by element. */
struct adamw_cls { float lr[RL_ADAMW_NCLS], wd[RL_ADAMW_NCLS]; };

__global__ void __launch_bounds__(256)
k_adamw_multi(const rlk_adamw_chunk *ch, float *param, bf16 *wcopy, const float *grad, float *m, float *v,
    adamw_cls cl, float b1, float b2, float eps, float bc1, float bc2, float gs, int vec)
{
	rlk_adamw_chunk c = ch[blockIdx.x];
	size_t off = (size_t)c.off;
	unsigned n = c.n, k = c.cls < RL_ADAMW_NCLS ? c.cls : 0;
	float lr = cl.lr[k], wd = cl.wd[k];
	unsigned i0 = 0;
	if (vec && off % 4 == 0) {
		unsigned n4 = n / 4;
		for (unsigned q = threadIdx.x; q < n4; q += blockDim.x) {
			size_t i = off + (size_t)q * 4;
			float4 p = *(const float4 *)(param + i), g = *(const float4 *)(grad + i);
			float4 mm = *(const float4 *)(m + i), vv = *(const float4 *)(v + i);
			p.x = adamw_upd(p.x, g.x, &mm.x, &vv.x, lr, b1, b2, eps, wd, bc1, bc2, gs);
			p.y = adamw_upd(p.y, g.y, &mm.y, &vv.y, lr, b1, b2, eps, wd, bc1, bc2, gs);
			p.z = adamw_upd(p.z, g.z, &mm.z, &vv.z, lr, b1, b2, eps, wd, bc1, bc2, gs);
			p.w = adamw_upd(p.w, g.w, &mm.w, &vv.w, lr, b1, b2, eps, wd, bc1, bc2, gs);
			*(float4 *)(param + i) = p;
			*(float4 *)(m + i) = mm;
			*(float4 *)(v + i) = vv;
			if (wcopy) {
				__nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
				uint2 u;
				u.x = *(const unsigned *)&lo;
				u.y = *(const unsigned *)&hi;
				*(uint2 *)(wcopy + i) = u;
			}
		}
		i0 = n4 * 4;
	}
	for (unsigned j = i0 + threadIdx.x; j < n; j += blockDim.x) {
		size_t i = off + j;
		float mi = m[i], vi = v[i];
		float p = adamw_upd(param[i], grad[i], &mi, &vi, lr, b1, b2, eps, wd, bc1, bc2, gs);
		m[i] = mi;
		v[i] = vi;
		param[i] = p;
		if (wcopy)
			wcopy[i] = tobf(p);
	}
}

extern "C" int
rlk_adamw_multi(void *s, const rlk_adamw_chunk *chunks, int nchunk, float *param, void *wcopy,
    const float *grad, float *m, float *v, const float *lr, const float *wd, float b1, float b2, float eps,
    float bc1, float bc2, float grad_scale)
{
	if (nchunk <= 0)
		return 0;
	adamw_cls cl;
	for (int k = 0; k < RL_ADAMW_NCLS; k++) {
		cl.lr[k] = lr[k];
		cl.wd[k] = wd[k];
	}
	int vec = ((uintptr_t)param | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) % 16 == 0 &&
	    (uintptr_t)wcopy % 8 == 0;
	/* gridDim.x goes to 2^31 - 1: 17.5 T elements */
	k_adamw_multi<<<(unsigned)nchunk, 256, 0, RLK_STREAM(s)>>>(chunks, param, (bf16 *)wcopy, grad, m, v, cl,
	    b1, b2, eps, bc1, bc2, grad_scale, vec);
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

/* The next decode step's inputs from this one's sampled tokens (launch.h: rlk_decode_advance) */
__global__ void k_decode_advance(int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS)
{
	int b = blockIdx.x * blockDim.x + threadIdx.x;
	if (b >= B)
		return;
	int p = pos[b] + 1;
	tok[b] = otok[b];
	pos[b] = p;
	ctx[b]++;
	ctr[b]++;
	slot[b] = bt[(size_t)b * cols + p / BS] * BS + p % BS;
}

extern "C" int
rlk_decode_advance(void *s, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS)
{
	if (B <= 0)
		return 0;
	if (cols < 1 || BS < 1)
		return (int)cudaErrorInvalidValue;
	k_decode_advance<<<(B + 127) / 128, 128, 0, RLK_STREAM(s)>>>(tok, pos, ctx, slot, ctr, bt, otok, B, cols, BS);
	RLK_RET();
}

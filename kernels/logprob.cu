/*
 * logprob.cu — the output layer on the GPU: fused log-softmax + target gather
 * + entropy over the vocabulary (one block per row, online max/sum in fp32,
 * logits read in bf16, never an (N,V) fp32 tensor), its backward, the fused
 * PPO/GRPO token loss and token sampling.  Semantics: lib/compute/ops.h.
 *
 * The log-prob kernels take the logits' row stride ld >= V (the strided LM head of
 * lib/compute/ops.h; ld = V otherwise).
 *
 * Leaves out: the LM-head GEMM (cuBLASLt, lib/compute/ops_cuda.c); chunking over N
 * (the caller's).
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"
#include "base/rng.h"

#define LP_THREADS 512

/* Online (max, sum e^(z-m), sum e^(z-m) z) merge. */
struct msz { float m, s, t; };

static __device__ __forceinline__ msz
msz_merge(msz a, msz b)
{
	if (b.m == -INFINITY)
		return a;
	if (a.m == -INFINITY)
		return b;
	float m = fmaxf(a.m, b.m);
	float ea = __expf(a.m - m), eb = __expf(b.m - m);
	msz r = { m, a.s * ea + b.s * eb, a.t * ea + b.t * eb };
	return r;
}

static __device__ __forceinline__ msz
msz_block(msz v)
{
	__shared__ float sm[32], ss[32], st[32];
	for (int o = 16; o > 0; o >>= 1) {
		msz u = { __shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o),
		    __shfl_xor_sync(0xffffffffu, v.t, o) };
		v = msz_merge(v, u);
	}
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) {
		sm[w] = v.m;
		ss[w] = v.s;
		st[w] = v.t;
	}
	__syncthreads();
	if (lane < nw) {
		v.m = sm[lane];
		v.s = ss[lane];
		v.t = st[lane];
	} else {
		v.m = -INFINITY;
		v.s = v.t = 0.0f;
	}
	for (int o = 16; o > 0; o >>= 1) {
		msz u = { __shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o),
		    __shfl_xor_sync(0xffffffffu, v.t, o) };
		v = msz_merge(v, u);
	}
	return v;
}

/* Row statistics of z = logits * inv_temp: max, sum exp, sum exp * z.  Reads
 * pairs of bf16 when the row is 4-byte aligned. */
static __device__ __forceinline__ msz
row_stats(const bf16 *row, int V, float it)
{
	msz a = { -INFINITY, 0.0f, 0.0f };
	bool pair = (((uintptr_t)row & 3) == 0);
	int V2 = pair ? V / 2 : 0;
	const __nv_bfloat162 *r2 = (const __nv_bfloat162 *)row;
	for (int j = threadIdx.x; j < V2; j += blockDim.x) {
		float2 f = __bfloat1622float2(r2[j]);
		float z0 = f.x * it, z1 = f.y * it, m = fmaxf(a.m, fmaxf(z0, z1));
		float sc = __expf(a.m - m), e0 = __expf(z0 - m), e1 = __expf(z1 - m);
		a.s = a.s * sc + e0 + e1;
		a.t = a.t * sc + e0 * z0 + e1 * z1;
		a.m = m;
	}
	for (int j = 2 * V2 + threadIdx.x; j < V; j += blockDim.x) {
		float z = bf(row[j]) * it, m = fmaxf(a.m, z);
		float sc = __expf(a.m - m), e = __expf(z - m);
		a.s = a.s * sc + e;
		a.t = a.t * sc + e * z;
		a.m = m;
	}
	return msz_block(a);
}

__global__ void __launch_bounds__(LP_THREADS)
k_logprob_fwd(float *lp, float *ent, float *lse, const bf16 *logits, size_t ld, const int32_t *tgt,
    int V, float it)
{
	long n = blockIdx.x;
	const bf16 *row = logits + (size_t)n * ld;
	msz a = row_stats(row, V, it);
	if (threadIdx.x != 0)
		return;
	float l = a.m + logf(a.s);
	int t = tgt[n];
	if (lse)
		lse[n] = (t < 0 || t >= V) ? 0.0f : l;
	if (t < 0 || t >= V) {
		lp[n] = 0.0f;
		if (ent)
			ent[n] = 0.0f;
		return;
	}
	lp[n] = bf(row[t]) * it - l;
	if (ent)
		ent[n] = l - a.t / a.s;
}

/* dz_j = dlp (onehot_j - p_j) + dent * (-p_j (log p_j + H));  dlogits = inv_temp * dz. */
static __device__ __forceinline__ float
lp_grad(float x, int j, int t, float l, float g, float ge, float H, float it)
{
	float z = x * it, lpj = z - l, p = __expf(lpj);
	float d = g * ((j == t ? 1.0f : 0.0f) - p);
	if (ge != 0.0f)
		d -= ge * p * (lpj + H);
	return d * it;
}

/* Pairs of bf16 when both rows are 4-byte aligned (with an even stride, every row),
 * then the odd element or an unaligned row one at a time.  In place: each element is
 * read and written by the same thread, the entropy pass's reads end at a barrier. */
__global__ void __launch_bounds__(LP_THREADS)
k_logprob_bwd(bf16 *dlogits, const bf16 *logits, size_t ld, const int32_t *tgt, const float *lse,
    const float *dlp, const float *dent, int V, float it)
{
	__shared__ float red[32];
	long n = blockIdx.x;
	const bf16 *row = logits + (size_t)n * ld;
	bf16 *drow = dlogits + (size_t)n * ld;
	bool pair = ((((uintptr_t)row) | ((uintptr_t)drow)) & 3) == 0;
	int V2 = pair ? V / 2 : 0;
	const __nv_bfloat162 *r2 = (const __nv_bfloat162 *)row;
	__nv_bfloat162 *d2 = (__nv_bfloat162 *)drow;
	int t = tgt[n];
	if (t < 0 || t >= V) {
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			drow[j] = tobf(0.0f);
		return;
	}
	float l = lse[n], g = dlp[n], ge = dent ? dent[n] : 0.0f, H = 0.0f;
	if (ge != 0.0f) {
		float pz = 0.0f;  /* sum p z */
		for (int j = threadIdx.x; j < V2; j += blockDim.x) {
			float2 f = __bfloat1622float2(r2[j]);
			float z0 = f.x * it, z1 = f.y * it;
			pz += __expf(z0 - l) * z0 + __expf(z1 - l) * z1;
		}
		for (int j = 2 * V2 + threadIdx.x; j < V; j += blockDim.x) {
			float z = bf(row[j]) * it;
			pz += __expf(z - l) * z;
		}
		H = l - block_sum(pz, red);
	}
	__syncthreads();
	for (int j = threadIdx.x; j < V2; j += blockDim.x) {
		float2 f = __bfloat1622float2(r2[j]);
		__nv_bfloat162 o;
		o.x = tobf(lp_grad(f.x, 2 * j, t, l, g, ge, H, it));
		o.y = tobf(lp_grad(f.y, 2 * j + 1, t, l, g, ge, H, it));
		d2[j] = o;
	}
	for (int j = 2 * V2 + threadIdx.x; j < V; j += blockDim.x)
		drow[j] = tobf(lp_grad(bf(row[j]), j, t, l, g, ge, H, it));
}

extern "C" int
rlk_logprob_fwd(void *s, float *lp, float *ent, float *lse, const void *logits, int ld,
    const int32_t *tgt, int N, int V, float inv_temp)
{
	if (N <= 0)
		return 0;
	k_logprob_fwd<<<N, LP_THREADS, 0, RLK_STREAM(s)>>>(lp, ent, lse, (const bf16 *)logits, (size_t)ld,
	    tgt, V, inv_temp);
	RLK_RET();
}

extern "C" int
rlk_logprob_bwd(void *s, void *dlogits, const void *logits, int ld, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp)
{
	if (N <= 0)
		return 0;
	k_logprob_bwd<<<N, LP_THREADS, 0, RLK_STREAM(s)>>>((bf16 *)dlogits, (const bf16 *)logits,
	    (size_t)ld, tgt, lse, dlp, dent, V, inv_temp);
	RLK_RET();
}

/* ---- fused PPO/GRPO token loss ------------------------------------------------------ */
__global__ void k_pg_loss(float *dlp, float *dent, float *stats, const float *lp, const float *old,
    const float *beh, const float *ref, const float *ent, const float *adv, const float *w, int N,
    rl_pg_params p)
{
	int n = blockIdx.x * blockDim.x + threadIdx.x;
	if (n >= N)
		return;
	float x = lp[n], A = adv[n], wn = w[n];
	float *st = stats + (size_t)n * RL_PG_NSTAT;
	if (wn == 0.0f) {
		/* ignored tokens may hold garbage (padding) */
		dlp[n] = 0.0f;
		if (dent)
			dent[n] = 0.0f;
		for (int k = 0; k < RL_PG_NSTAT; k++)
			st[k] = 0.0f;
		return;
	}
	float r = expf(x - old[n]);
	float rc = fminf(fmaxf(r, 1.0f - p.clip_low), 1.0f + p.clip_high);
	float u = -A * r, c = -A * rc;
	float pg = fmaxf(u, c), dpg = c > u ? 0.0f : -A * r;
	float clipped = c > u ? 1.0f : 0.0f;
	if (A < 0.0f && p.dual_clip > 0.0f && pg > -A * p.dual_clip) {
		pg = -A * p.dual_clip;
		dpg = 0.0f;
		clipped = 1.0f;
	}
	if (beh && p.tis_cap > 0.0f) {
		float tis = fminf(expf(old[n] - beh[n]), p.tis_cap);
		pg *= tis;
		dpg *= tis;
	}
	float loss = pg, d = dpg, kl = 0.0f;
	if (ref) {
		float dl = x - ref[n], dk;
		if (p.kl_type == 2) {
			kl = 0.5f * dl * dl;
			dk = dl;
		} else if (p.kl_type == 3) {
			kl = expf(-dl) + dl - 1.0f;
			dk = 1.0f - expf(-dl);
		} else {
			kl = dl;
			dk = 1.0f;
		}
		loss += p.kl_coef * kl;
		d += p.kl_coef * dk;
	}
	if (ent)
		loss -= p.ent_coef * ent[n];
	dlp[n] = wn * d;
	if (dent)
		dent[n] = ent ? -wn * p.ent_coef : 0.0f;
	st[RL_PG_LOSS] = loss;
	st[RL_PG_CLIPPED] = clipped;
	st[RL_PG_RATIO] = r;
	st[RL_PG_KL] = kl;
}

extern "C" int
rlk_pg_loss(void *s, float *dlp, float *dent, float *stats, const float *lp, const float *old,
    const float *beh, const float *ref, const float *ent, const float *adv, const float *w, int N,
    rl_pg_params p)
{
	if (N <= 0)
		return 0;
	k_pg_loss<<<(N + 255) / 256, 256, 0, RLK_STREAM(s)>>>(dlp, dent, stats, lp, old, beh, ref, ent,
	    adv, w, N, p);
	RLK_RET();
}

/* ---- sampling ------------------------------------------------------------------------------
 * One block per row, the CPU reference's exact rule (lib/compute/ops_cpu.c): e_j = exp(x_j/T - max),
 * top-k keeps the k largest e (ties: lower token id first), top-p then keeps the shortest
 * prefix of that set in (e desc, id asc) order whose mass reaches top_p of the set's mass,
 * and the token is drawn by inverse CDF in token-id order over the kept set with
 * u = rl_rng_uniform(seed, counter).  Thresholds are found by radix selection over the
 * bit patterns of e (non-negative floats order as unsigned integers), by count (top-k) and
 * by mass (top-p), so nothing is sorted.  Sums are in double. */
#define SMP_THREADS 1024

struct smp_row {
	const bf16 *x;
	int V;
	float T, m;
	/* top-k set: e > kv, or e == kv and id <= kid */
	int use_k;
	unsigned kv;
	int kid;
	/* top-p set (within top-k): e > pv, or e == pv and id <= pid */
	int use_p;
	unsigned pv;
	int pid;
};

/* z / T: no division at T = 1 (the same value; the division is a good part of a pass) */
static __device__ __forceinline__ float
smp_z(const smp_row &r, int j)
{
	float z = bf(r.x[j]);
	return r.T == 1.0f ? z : z / r.T;
}

static __device__ __forceinline__ float
smp_e(const smp_row &r, int j)
{
	return expf(smp_z(r, j) - r.m);
}

static __device__ __forceinline__ bool
smp_in(const smp_row &r, int j, unsigned b)
{
	if (r.use_k && !(b > r.kv || (b == r.kv && j <= r.kid)))
		return false;
	if (r.use_p && !(b > r.pv || (b == r.pv && j <= r.pid)))
		return false;
	return true;
}

static __device__ double
block_sum_d(double v, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* f(j) of smp_scan: whether j counts, and its weight */
static __device__ __forceinline__ bool
smp_f(const smp_row &r, int mode, unsigned tv, int j, double *v)
{
	float e = smp_e(r, j);
	unsigned b = __float_as_uint(e);
	bool in = mode == 0 ? smp_in(r, j, b) : mode == 1 ? b == tv :
	    (b == tv && (!r.use_k || b > r.kv || (b == r.kv && j <= r.kid)));
	*v = in ? (mode == 0 ? (double)e : 1.0) : 0.0;
	return in;
}

/* Find the first j in token-id order where the inclusive prefix sum of f(j) exceeds
 * target; -1 when none does.  mode 0: f = e over the kept set; 1: f = 1 over the ties
 * of value `tv` within the top-k set (mode 1 for kid, 2 for pid).
 * Each warp takes a contiguous range of ids, its lanes strided through it (coalesced
 * loads, several in flight); the warp totals are summed in warp order, so the one warp
 * whose range crosses target is known exactly, and that warp walks its range 32 ids at a
 * time with a warp scan.  If rounding leaves that walk short of target, the range's last
 * counted id.  scan: >= 32 doubles of shared memory. */
static __device__ int
smp_scan(const smp_row &r, int mode, unsigned tv, double target, double *scan)
{
	__shared__ int found;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int per = (r.V + nw - 1) / nw, j0 = min(r.V, w * per), j1 = min(r.V, j0 + per);
	double loc = 0.0, v;
#pragma unroll 4
	for (int j = j0 + lane; j < j1; j += 32) {
		smp_f(r, mode, tv, j, &v);
		loc += v;
	}
	for (int o = 16; o > 0; o >>= 1)
		loc += __shfl_xor_sync(0xffffffffu, loc, o);
	__syncthreads();  /* scan may hold a caller's values */
	if (lane == 0)
		scan[w] = loc;
	if (threadIdx.x == 0)
		found = -1;
	__syncthreads();
	double c = 0.0;
	for (int i = 0; i < w; i++)
		c += scan[i];
	if (c <= target && c + loc > target) {  /* the same in every lane: one warp at most */
		int last = -1, hit = -1;
		for (int jb = j0; jb < j1 && hit < 0; jb += 32) {
			int j = jb + lane;
			bool in = j < j1 && smp_f(r, mode, tv, j, &v);
			if (!in)
				v = 0.0;
			double sc = v;
			for (int o = 1; o < 32; o <<= 1) {
				double y = __shfl_up_sync(0xffffffffu, sc, o);
				if (lane >= o)
					sc += y;
			}
			unsigned cross = __ballot_sync(0xffffffffu, in && c + sc > target);
			unsigned any = __ballot_sync(0xffffffffu, in);
			if (cross)
				hit = jb + __ffs(cross) - 1;
			else if (any)
				last = jb + 31 - __clz(any);
			c += __shfl_sync(0xffffffffu, sc, 31);
		}
		if (lane == 0)
			found = hit >= 0 ? hit : last;
	}
	__syncthreads();
	int f = found;
	__syncthreads();
	return f;
}

/* Radix select over e's bits among the top-k set (when use_k is set in r): the value v
 * with  w(e > v) < lim <= w(e >= v), w = count (by_mass 0) or mass (1).  *above = w(e > v). */
static __device__ unsigned
smp_select(const smp_row &r, int by_mass, double lim, double *above_out, double *hist)
{
	__shared__ unsigned prefix_s;
	__shared__ double above_s;
	unsigned prefix = 0, mask = 0;
	double above = 0.0;
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = threadIdx.x; i < 256; i += blockDim.x)
			hist[i] = 0.0;
		__syncthreads();
		for (int j = threadIdx.x; j < r.V; j += blockDim.x) {
			float e = smp_e(r, j);
			unsigned b = __float_as_uint(e);
			if (r.use_k && !(b > r.kv || (b == r.kv && j <= r.kid)))
				continue;
			if ((b & mask) != prefix)
				continue;
			atomicAdd(&hist[(b >> shift) & 255u], by_mass ? (double)e : 1.0);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			double a = above;
			int d = 255;
			for (; d > 0; d--) {
				if (a + hist[d] >= lim)
					break;
				a += hist[d];
			}
			prefix_s = prefix | ((unsigned)d << shift);
			above_s = a;
		}
		__syncthreads();
		prefix = prefix_s;
		above = above_s;
		mask |= 255u << shift;
		__syncthreads();
	}
	*above_out = above;
	return prefix;
}

__global__ void __launch_bounds__(SMP_THREADS)
k_sample(int32_t *tok, float *logp, const bf16 *logits, const uint64_t *seed, const uint64_t *counter,
    int V, rl_sample_params p)
{
	__shared__ double hist[256];
	__shared__ double red[32];
	__shared__ double scan[32];
	__shared__ float redf[32];
	int b = blockIdx.x;
	smp_row r;
	r.x = logits + (size_t)b * V;
	r.V = V;
	r.use_k = r.use_p = 0;
	r.kv = r.pv = 0;
	r.kid = r.pid = V;
	if (!(p.temperature > 0.0f)) {
		/* greedy: first maximum, logp at temperature 1 */
		float m = -INFINITY;
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			m = fmaxf(m, bf(r.x[j]));
		m = block_max(m, redf);
		__shared__ int best;
		if (threadIdx.x == 0)
			best = V;
		__syncthreads();
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			if (bf(r.x[j]) == m)
				atomicMin(&best, j);
		double S = 0.0;
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			S += (double)expf(bf(r.x[j]) - m);
		S = block_sum_d(S, red);
		if (threadIdx.x == 0) {
			tok[b] = best;
			logp[b] = (float)(-log(S));
		}
		return;
	}
	r.T = p.temperature;
	float m = -INFINITY;
#pragma unroll 8
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		m = fmaxf(m, smp_z(r, j));
	r.m = block_max(m, redf);
	double S = 0.0;
#pragma unroll 8  /* loads in flight; the sum keeps its order */
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		S += (double)smp_e(r, j);
	S = block_sum_d(S, red);
	double total = S, above;
	int k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
	if (k < V) {
		unsigned kv = smp_select(r, 0, (double)k, &above, hist);
		double need = (double)k - above;  /* ties of value kv to keep, lowest ids first */
		int kid = smp_scan(r, 1, kv, need - 0.5, scan);
		r.kv = kv;
		r.kid = kid < 0 ? V : kid;
		r.use_k = 1;
		double t = 0.0;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			float e = smp_e(r, j);
			if (smp_in(r, j, __float_as_uint(e)))
				t += e;
		}
		total = block_sum_d(t, red);
	}
	if (p.top_p < 1.0f) {
		double lim = (double)p.top_p * total;
		if (!(lim > 0.0))
			lim = 1e-300;  /* the first token is always kept */
		unsigned pv = smp_select(r, 1, lim, &above, hist);
		/* ties of value pv kept in id order while the mass before them is < lim:
		 * the c-th tie is kept iff above + (c-1) pv < lim */
		double ve = (double)__uint_as_float(pv);
		double c = ve > 0.0 ? ceil((lim - above) / ve) : 1.0;
		if (c < 1.0)
			c = 1.0;
		int pid = smp_scan(r, 2, pv, c - 0.5, scan);
		r.pv = pv;
		r.pid = pid < 0 ? V : pid;
		r.use_p = 1;
	}
	double kt = S;
	if (r.use_k || r.use_p) {
		double t = 0.0;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			float e = smp_e(r, j);
			if (smp_in(r, j, __float_as_uint(e)))
				t += e;
		}
		kt = block_sum_d(t, red);
	}
	double u = rl_rng_uniform(seed[b], counter[b]);
	int t = smp_scan(r, 0, 0, u * kt, scan);
	if (t < 0) {
		/* rounding left the target past the end: the last kept token */
		__shared__ int last;
		if (threadIdx.x == 0)
			last = -1;
		__syncthreads();
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			if (smp_in(r, j, __float_as_uint(smp_e(r, j))))
				atomicMax(&last, j);
		__syncthreads();
		t = last < 0 ? V - 1 : last;
	}
	if (threadIdx.x == 0) {
		tok[b] = t;
		logp[b] = (float)((double)(bf(r.x[t]) / r.T - r.m) - log(S));
	}
}

/* ---- sampling split over blocks: temperature only (top_k 0, top_p 1) and greedy ----------
 * The row is cut into ranges of SS_SPAN consecutive ids, a warp per range, SS_WARPS ranges
 * per block, grid (ranges / SS_WARPS, B): at B = 1 a Qwen row (V = 151936) is 75 blocks
 * instead of one.  Each lane holds its SS_PER logits of the range in registers (ids
 * j0 + 32k + lane: coalesced loads, all in flight), and the warp writes the range's max m_r
 * of z = x / T, s_r = sum of expf(z - m_r) (double, per lane then the warp) and, greedy,
 * the first id of the maximum.  The block then fences, counts itself on cnt[row], and the
 * block that arrives last for the row (whichever it is) finishes it: M = max m_r, the
 * range weights W_r = s_r expf(m_r - M) in shared memory, the row total in range order
 * (lane l of warp 0 sums a contiguous group of ranges; each lane's prefix is the sum of
 * the groups before it in order, so the prefix of group l + 1 is exactly prefix l + sum l),
 * target = u * total with u = rl_rng_uniform(seed, counter), the range whose prefix
 * crosses the target, and warp 0 walks that range's SS_PER x 32 ids in order with the
 * contract's weights e_j = expf(z_j - M) (a double warp scan): the first id whose
 * cumulative weight exceeds the target.  Only one range of the row is read twice, and
 * one expf per logit.  The sums' order is fixed by the range index, not by the arrival
 * order, so a row gives the same sample whichever block finishes it.  Rounding can
 * leave the walk short of the target (the range weight and its ids' weights are summed
 * differently): then the range's last id of positive weight.  Greedy: the first id of the
 * maximum, logp = -log(sum of exp(x - max)) as k_sample.  The finishing block sets cnt[row]
 * back to 0 (the next launch, a graph replay included, finds it so). */
#define SS_WARPS 8
#define SS_THREADS (SS_WARPS * 32)
#define SS_PER 8
#define SS_SPAN (32 * SS_PER)
#define SS_MAXR 1024  /* ranges a row may have: V up to 262144 */

static __device__ __forceinline__ int
ss_warp_min(int v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

__global__ void __launch_bounds__(SS_THREADS)
k_sample_split(int32_t *tok, float *logp, const bf16 *logits, const uint64_t *seed, const uint64_t *counter,
    int V, float T, double *wsum, float *wmax, int *warg, unsigned *cnt)
{
	__shared__ double sW[SS_MAXR];
	__shared__ double sgrp[32];
	__shared__ float redf[32];
	__shared__ int last, best, hit_r;
	__shared__ double hit_c, total_s;
	const int b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int nr = gridDim.x * SS_WARPS, greedy = !(T > 0.0f);
	const bf16 *x = logits + (size_t)b * V;
	const int r = blockIdx.x * SS_WARPS + warp, j0 = r * SS_SPAN;
	pdl_trigger();
	pdl_wait();  /* the logits are the kernel's ahead (common.cuh) */
	float z[SS_PER];
	float m = -INFINITY;
#pragma unroll
	for (int k = 0; k < SS_PER; k++) {
		int j = j0 + k * 32 + lane;
		z[k] = -INFINITY;
		if (j < V) {
			float v = bf(x[j]);
			z[k] = greedy || T == 1.0f ? v : v / T;
		}
	}
#pragma unroll
	for (int k = 0; k < SS_PER; k++)
		m = fmaxf(m, z[k]);
	m = warp_max(m);
	double s = 0.0;
	int arg = 0x7fffffff;
	if (m != -INFINITY)
#pragma unroll
		for (int k = 0; k < SS_PER; k++) {
			if (j0 + k * 32 + lane < V)
				s += (double)expf(z[k] - m);
			if (z[k] == m && arg == 0x7fffffff)
				arg = j0 + k * 32 + lane;
		}
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	if (greedy)
		arg = ss_warp_min(arg);
	const size_t ri = (size_t)b * nr + r;
	if (lane == 0) {
		wsum[ri] = s;
		wmax[ri] = m;
		if (greedy)
			warg[ri] = arg;
	}
	/* count the block once its ranges are visible to the device; the last one goes on */
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		last = atomicAdd(&cnt[b], 1u) == gridDim.x - 1u;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	const double *rs = wsum + (size_t)b * nr;
	const float *rm = wmax + (size_t)b * nr;
	float mm = -INFINITY;
	for (int i = threadIdx.x; i < nr; i += blockDim.x)
		mm = fmaxf(mm, __ldcg(rm + i));
	const float M = block_max(mm, redf);
	if (threadIdx.x == 0)
		best = 0x7fffffff;
	for (int i = threadIdx.x; i < nr; i += blockDim.x) {
		float mi = __ldcg(rm + i);
		sW[i] = mi == -INFINITY ? 0.0 : __ldcg(rs + i) * (double)expf(mi - M);
	}
	__syncthreads();
	if (greedy) {
		int cand = 0x7fffffff;
		for (int i = threadIdx.x; i < nr; i += blockDim.x)
			if (__ldcg(rm + i) == M)
				cand = min(cand, __ldcg(warg + (size_t)b * nr + i));
		if (cand != 0x7fffffff)
			atomicMin(&best, cand);
	}
	if (warp == 0) {
		/* lane l: ranges [l q, l q + q); its prefix: the groups before it, in order */
		const int q = (nr + 31) / 32, i0 = min(nr, lane * q), i1 = min(nr, i0 + q);
		double g = 0.0;
		for (int i = i0; i < i1; i++)
			g += sW[i];
		sgrp[lane] = g;
		__syncwarp();
		double c = 0.0;
		for (int l = 0; l < lane; l++)
			c += sgrp[l];
		const double total = __shfl_sync(0xffffffffu, c + g, 31);
		if (lane == 0) {
			total_s = total;
			hit_r = -1;
		}
		__syncwarp();
		if (!greedy) {
			const double target = rl_rng_uniform(seed[b], counter[b]) * total;
			if (c <= target && c + g > target) {  /* one lane at most */
				int ri2 = -1;
				double cc = c, cr = c;
				for (int i = i0; i < i1; i++) {
					if (sW[i] > 0.0) {
						ri2 = i;
						cr = cc;
						if (cc + sW[i] > target)
							break;
					}
					cc += sW[i];
				}
				hit_r = ri2;  /* the crossing range, or the group's last of positive weight */
				hit_c = cr;
			}
		}
	}
	__syncthreads();
	if (greedy) {
		if (threadIdx.x == 0) {
			tok[b] = best;
			logp[b] = (float)(-log(total_s));
			cnt[b] = 0u;
		}
		return;
	}
	if (warp == 0) {
		int t = -1;
		const int hr = hit_r;
		if (hr >= 0) {
			/* walk the range: the first id whose cumulative weight exceeds the target */
			const double target = rl_rng_uniform(seed[b], counter[b]) * total_s;
			const int h0 = hr * SS_SPAN;
			float e[SS_PER];
#pragma unroll
			for (int k = 0; k < SS_PER; k++) {
				int j = h0 + k * 32 + lane;
				e[k] = 0.0f;
				if (j < V) {
					float v = bf(x[j]);
					e[k] = expf((T == 1.0f ? v : v / T) - M);
				}
			}
			double c = hit_c;
			int lastpos = -1;
#pragma unroll
			for (int k = 0; k < SS_PER; k++) {
				double sc = (double)e[k];
				for (int o = 1; o < 32; o <<= 1) {
					double y = __shfl_up_sync(0xffffffffu, sc, o);
					if (lane >= o)
						sc += y;
				}
				unsigned cross = __ballot_sync(0xffffffffu, e[k] > 0.0f && c + sc > target);
				unsigned pos = __ballot_sync(0xffffffffu, e[k] > 0.0f);
				if (t < 0 && cross)
					t = h0 + k * 32 + __ffs(cross) - 1;
				if (pos)
					lastpos = h0 + k * 32 + 31 - __clz(pos);
				c += __shfl_sync(0xffffffffu, sc, 31);
			}
			if (t < 0)
				t = lastpos;
		}
		if (t < 0)
			t = V - 1;  /* nothing of positive weight (as k_sample: the last id) */
		if (lane == 0) {
			tok[b] = t;
			float v = bf(x[t]);
			logp[b] = (float)((double)((T == 1.0f ? v : v / T) - M) - log(total_s));
			cnt[b] = 0u;
		}
	}
}

/* ranges of a row for k_sample_split, and its workspace: per range a double, a float, an int */
static inline int
ss_ranges(int V)
{
	return (V + SS_WARPS * SS_SPAN - 1) / (SS_WARPS * SS_SPAN) * SS_WARPS;
}

extern "C" int
rlk_sample(void *s, int32_t *tok, float *logp, const void *logits, const uint64_t *seed,
    const uint64_t *counter, int B, int V, rl_sample_params p)
{
	if (B <= 0)
		return 0;
	k_sample<<<B, SMP_THREADS, 0, RLK_STREAM(s)>>>(tok, logp, (const bf16 *)logits, seed, counter, V, p);
	RLK_RET();
}

extern "C" int
rlk_sample_split_ok(int B, int V, rl_sample_params p)
{
	int greedy = !(p.temperature > 0.0f), plain = !(p.top_k > 0 && p.top_k < V) && !(p.top_p < 1.0f);
	return B > 0 && B <= 65535 && V > 0 && ss_ranges(V) <= SS_MAXR && (greedy || plain);
}

extern "C" size_t
rlk_sample_ws_bytes(int B, int V)
{
	return (size_t)B * ss_ranges(V) * (sizeof(double) + sizeof(float) + sizeof(int));
}

extern "C" int
rlk_sample_split(void *s, void *ws, unsigned *cnt, int32_t *tok, float *logp, const void *logits,
    const uint64_t *seed, const uint64_t *counter, int B, int V, rl_sample_params p)
{
	if (B <= 0)
		return 0;
	if (!rlk_sample_split_ok(B, V, p) || !ws || !cnt)
		return (int)cudaErrorInvalidValue;
	const int nr = ss_ranges(V);
	double *wsum = (double *)ws;
	float *wmax = (float *)(wsum + (size_t)B * nr);
	int *warg = (int *)(wmax + (size_t)B * nr);
	dim3 grid((unsigned)(nr / SS_WARPS), (unsigned)B);
	cudaError_t e = rlk_launch(k_sample_split, grid, dim3(SS_THREADS), 0, RLK_STREAM(s), tok, logp,
	    (const bf16 *)logits, seed, counter, V, p.temperature, wsum, wmax, warg, cnt);
	if (e != cudaSuccess)
		return (int)e;
	RLK_RET();
}

/*
 * step.cu — a decode step's transformer blocks and LM head in one persistent kernel
 * (launch.h: rlk_decode_step), for one sequence (RLK_STEP_ROWS): at one slot a step is
 * latency, 5 dependent kernels a layer at about 6.5 us each even with programmatic launch,
 * and one launch for all layers replaces the kernel boundaries by a grid-wide barrier.
 *
 * k_decode_step<HD, G, GPT2> runs stages 0 .. 5 n_layer in order, every block through
 * every stage (st_stage): per layer
 *   0  norm + QKV product + RoPE + cache write (fu_gemv with fuse.cuh's QKV epilogue)
 *   1  attention: B NKV nsplit units (sequence, KV head, split) of ST_WARPS warps, unit u
 *      taken by block u mod nblk (decode.cuh's dc_lane), the splits merged inside the
 *      stage by the last unit of each (sequence, KV head) (dc_merge_last, counters cnt)
 *   2  o product + residual add into x
 *   3  norm + fc product + GELU (GPT-2) or SwiGLU into h
 *   4  proj product + residual add into x
 * then the final norm + LM head into logits.  The products are fuse.cuh's fu_gemv, a warp an
 * output, outputs strided over the grid; so the values are those of the separate kernels
 * (fuse.cu, decode.cu) but for attention's block of 8 warps instead of 4 (another order of
 * its sums).  Between two stages a grid barrier (st_grid_sync); the products load their
 * first weight chunks before it, so the barrier's latency hides the first weight loads.
 * Every block calls the barrier at every stage boundary, with or without work in the stage.
 *
 * The barrier: thread 0 of each block, after the block's __syncthreads, fences and adds 1 to
 * bar[0], then polls bar[0] (volatile, through L2) with __nanosleep until it reaches k nblk
 * (barrier k of the launch: a running count, never reset inside a launch), fences again, and
 * the block leaves through a second __syncthreads; a poll that lasts ST_SPIN_MAX rounds
 * (seconds) traps instead of hanging.  The release pattern (writes, bar.sync, fence, atomic)
 * and the acquire pattern (poll, fence, bar.sync, reads) are cooperative groups' grid.sync on
 * pre-Volta (the form the PTX memory model orders for every thread of both blocks, weak loads
 * included, so data another block wrote before the barrier is read after it, L1 or not;
 * partials written and read inside a stage go through dc_merge_last's own fences and __ldcg).
 * At the end each block counts itself on bar[1]; the one that makes it nblk (every block is
 * then past its last poll) sets both counters back to 0, so every launch, graph replays
 * included, finds them 0.  The launch is cooperative (cudaLaunchAttributeCooperative): the
 * runtime refuses it rather than start a grid that is not resident at once, so the barrier
 * cannot wait on a block that never runs.  The grid: multiprocessors x resident blocks of
 * 256 threads with the dynamic shared memory (queried once per instantiation and size,
 * cached: the first call of a shape must be outside graph capture).
 *
 * Dynamic shared memory: the normalised row (C bf16) in stages 0, 3 and the head, and
 * attention's arrays (decode.cuh's dc_lane_sm for 8 warps: 48 KB at G 8, HD 128) in stage
 * 1; the barrier's __syncthreads separates the two uses.
 *
 * Attention takes only the splits its context needs (split_keys keys each, at most nsplit):
 * a short context goes without the merge.  The products prefetch (fu_gemv's PF): a warp with
 * several outputs has the next one's weights in flight while it sums the current one.
 *
 * Checked: kernels/emu/emu_step.cpp runs st_stage stage by stage against the CPU ops, and the
 * whole kernel over 4 blocks at once (its barrier) against that; on an H100
 * tests/unit/test_cuda_step.c.  Measured there (bench/gpu-step.sh, RL_CUDA_STEP_PROFILE: the
 * stages timed from globaltimer stamps) it is slower than the separate kernels: a barrier
 * costs 0.6-1.5 us, but a stage is not faster than a kernel of its own (attention 9-10 us,
 * the products 2-12 us, latency-bound), docs/cuda.md.
 *
 * Leaves out: more than one sequence (RLK_STEP_ROWS), Qwen3's q/k-norm, the embedding and
 * the sampler (the caller's kernels before and after).
 */
#include <atomic>

#include "kernels/common.cuh"
#include "kernels/launch.h"
#include "kernels/fuse.cuh"
#include "kernels/decode.cuh"

/* globaltimer (ns, the same clock on every multiprocessor): the stage profile's stamps
 * (kernels/emu defines its own) */
static __device__ __forceinline__ unsigned long long
st_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* ==== step device code (kernels/emu/run.sh cuts from here to the launchers marker) */
#define ST_WARPS 8               /* warps a block: FU_WARPS */
#define ST_NR RLK_STEP_ROWS      /* rows of the products */
#define ST_SPIN_MAX (1u << 25)   /* polls of one barrier before a trap: each an L2 round trip
                                  * and a sleep, 0.15-0.2 us: 5-7 s */
#define ST_SLEEP_NS 32
#ifndef ST_G1_MINB
#define ST_G1_MINB 1             /* resident blocks an SM asked of the G 1 instantiations (2: at most
                                  * 128 registers, which spills since the products' prefetch) */
#endif

/* the kernel's arguments: the step and the per-sequence indices (launch.h) */
struct st_args {
	rlk_step s;
	const int32_t *pos, *slot, *bt, *ctx;
	int B;
};

/* Barrier number k of a launch of nblk blocks: returns in every thread of every block once
 * every block has called it k times (target = k nblk).  All threads of the block call it.
 * kind: RLK_STEP_BAR_* (launch.h); prof: the stage profile or NULL. */
static __device__ __forceinline__ void
st_grid_sync(unsigned *bar, unsigned target, int kind = RLK_STEP_BAR_SLEEP, unsigned long long *prof = NULL,
    unsigned k = 0)
{
	__syncthreads();  /* the block's writes of the stage are done ... */
	if (threadIdx.x == 0) {
		if (prof) {
			unsigned long long t = st_now();
			atomicMax(&prof[4 * k], t);
			atomicMin(&prof[4 * k + 1], t);
		}
#ifdef __CUDA_ARCH__
		if (kind == RLK_STEP_BAR_ACQ) {
			/* a release add, then acquire loads: the same order as the fences below */
			unsigned v;
			asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
			for (unsigned n = 0;; n++) {
				asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
				if (v >= target)
					break;
				if (n == ST_SPIN_MAX)
					__trap();
			}
		} else
#endif
		{
			__threadfence();  /* ... and ordered before its arrival (release) */
			atomicAdd(&bar[0], 1u);
			const volatile unsigned *c = bar;
			for (unsigned n = 0; *c < target; n++) {
				if (n == ST_SPIN_MAX)
					__trap();  /* a block that never arrives: fail the launch, do not hang */
				if (kind == RLK_STEP_BAR_SLEEP)
					__nanosleep(ST_SLEEP_NS);
			}
			__threadfence();  /* the other blocks' writes before this block's reads (acquire) */
		}
		if (prof) {
			unsigned long long t = st_now();
			atomicMin(&prof[4 * k + 2], t);
			atomicMax(&prof[4 * k + 3], t);
		}
	}
	__syncthreads();
}

/* The last block of a launch adds its stamps (n stages, barriers 1 .. n) into the profile's
 * sums and sets them back (launch.h: RLK_STEP_PROF_U64) */
static __device__ void
st_prof_add(unsigned long long *prof, int n)
{
	volatile unsigned long long *p = prof;
	unsigned long long *acc = prof + 4 * (n + 2);
	for (int k = 0; k <= n; k++) {
		const int kind = k == n ? 5 : k % 5;
		long long t0 = (long long)p[4 * k + 2];  /* the first block to start the stage */
		acc[4 * kind] += (unsigned long long)((long long)p[4 * (k + 1)] - t0);
		acc[4 * kind + 1] += (unsigned long long)((long long)p[4 * (k + 1) + 1] - t0);
		if (k < n) {
			acc[4 * kind + 2] += (unsigned long long)((long long)p[4 * (k + 1) + 2] - (long long)p[4 * (k + 1)]);
			acc[4 * kind + 3] += (unsigned long long)((long long)p[4 * (k + 1) + 3] - (long long)p[4 * (k + 1) + 2]);
		}
	}
	acc[24] += (unsigned long long)((long long)p[4 * (n + 1)] - (long long)p[2]);
	acc[25] += 1;
	if (acc[27])
		acc[26] += (unsigned long long)((long long)p[2] - (long long)acc[27]);
	acc[27] = p[4 * (n + 1)];
	for (int k = 0; k < n + 2; k++) {
		p[4 * k] = 0;
		p[4 * k + 1] = ~0ull;
		p[4 * k + 2] = ~0ull;
		p[4 * k + 3] = 0;
	}
}

/* After the last stage: the block that counts last on bar[1] resets both counters (every
 * block has left its last barrier before it counts); with a profile, it adds the launch's
 * stamps (n stages) first. */
static __device__ __forceinline__ void
st_grid_end(unsigned *bar, unsigned nblk, unsigned long long *prof = NULL, int n = 0)
{
	if (threadIdx.x != 0)
		return;
	if (prof) {
		unsigned long long t = st_now();
		atomicMax(&prof[4 * (n + 1)], t);
		atomicMin(&prof[4 * (n + 1) + 1], t);
		__threadfence();
	}
	if (atomicAdd(&bar[1], 1u) == nblk - 1u) {
		if (prof) {
			__threadfence();
			st_prof_add(prof, n);
		}
		bar[0] = 0u;
		bar[1] = 0u;
	}
}

/* the sync of fu_gemv and attention in the kernel: barrier number target / nblk, none before
 * the first stage (target 0: the kernel ahead in the stream has finished) */
struct st_bar {
	unsigned *bar;
	unsigned target;
	int kind;
	unsigned long long *prof;
	unsigned k;
	__device__ __forceinline__ void trigger() const {}
	__device__ __forceinline__ void wait() const
	{
		if (target)
			st_grid_sync(bar, target, kind, prof, k);
	}
};

/* Stage `stage` (0 .. 5 n_layer, see the top) of the step, as block bid of nblk: the product's
 * first weight chunks, sync.wait(), then the block's share of the stage. */
template <int HD, int G, int GPT2, class S>
static __device__ __forceinline__ void
st_stage(const st_args &a, int stage, int bid, int nblk, const S &sync)
{
	const rlk_step &s = a.s;
	const int C = s.C, NH = s.NH, NKV = s.NKV;
	const fu_qkv q0 = { NULL, NULL, NULL, NULL, 0, 0, 0, rl_rope() };
	bf16 *x = (bf16 *)s.x, *qkv = (bf16 *)s.qkv, *att = (bf16 *)s.att, *h = (bf16 *)s.h;
	if (stage == 5 * s.n_layer) {
		fu_gemv<ST_NR, 1, RL_EP_NONE, 1>((bf16 *)s.logits, x, (const bf16 *)s.lnf_w, (const bf16 *)s.lnf_b, s.eps,
		    GPT2, (const bf16 *)s.lm_w, (const bf16 *)NULL, C, s.V, q0, bid, nblk, sync);
		return;
	}
	const rlk_step_layer &y = s.layer[stage / 5];
	switch (stage % 5) {
	case 0: {
		const fu_qkv q = { (bf16 *)y.kc, (bf16 *)y.vc, a.pos, a.slot, NH, NKV, HD, GPT2 ? rl_rope() : s.rope };
		fu_gemv<ST_NR, 1, FU_EP_QKV, 1>(qkv, x, (const bf16 *)y.ln1_w, (const bf16 *)y.ln1_b, s.eps, GPT2,
		    (const bf16 *)y.qkv_w, (const bf16 *)y.qkv_b, C, (NH + 2 * NKV) * HD, q, bid, nblk, sync);
		break;
	}
	case 1: {
		sync.wait();
		FUSE_SMEM(st_sm);
		dc_lane_sm<HD, G, ST_WARPS> &sh = *(dc_lane_sm<HD, G, ST_WARPS> *)st_sm;
		const int units = a.B * NKV, n = units * s.nsplit;
		float2 *wml = s.nsplit > 1 ? (float2 *)(s.ws + (size_t)a.B * NH * s.nsplit * HD) : NULL;
		for (int u = bid; u < n; u += nblk) {
			/* the splits this sequence's context needs (split_keys keys each), at most nsplit:
			 * a short context skips the merge or most of it */
			const int unit = u % units, split = u / units;
			const int ns = dc_splits(a.ctx[unit / NKV], s.nsplit, s.split_keys);
			if (split >= ns)
				continue;
			__syncthreads();  /* the unit before is done with sh */
			dc_lane<HD, G, ST_WARPS>(sh, att, s.ws, wml, s.cnt, qkv, (const bf16 *)y.kc, (const bf16 *)y.vc, a.bt,
			    a.ctx, NH, NKV, s.BS, s.MAXBLK, s.nsplit, ns, unit, split);
		}
		break;
	}
	case 2:
		fu_gemv<ST_NR, 0, RL_EP_ADD, 1>(x, att, (const bf16 *)NULL, (const bf16 *)NULL, 0.0f, 0, (const bf16 *)y.o_w,
		    (const bf16 *)y.o_b, NH * HD, C, q0, bid, nblk, sync);
		break;
	case 3:
		fu_gemv<ST_NR, 1, GPT2 ? RL_EP_GELU : RL_EP_SWIGLU, 1>(h, x, (const bf16 *)y.ln2_w, (const bf16 *)y.ln2_b,
		    s.eps, GPT2, (const bf16 *)y.fc_w, (const bf16 *)y.fc_b, C, GPT2 ? s.H : 2 * s.H, q0, bid, nblk,
		    sync);
		break;
	default:
		fu_gemv<ST_NR, 0, RL_EP_ADD, 1>(x, h, (const bf16 *)NULL, (const bf16 *)NULL, 0.0f, 0, (const bf16 *)y.proj_w,
		    (const bf16 *)y.proj_b, s.H, C, q0, bid, nblk, sync);
		break;
	}
}

/* The whole step: every stage, a barrier before each but the first, then the counters reset. */
template <int HD, int G, int GPT2>
__global__ void __launch_bounds__(ST_WARPS * 32, G == 1 ? ST_G1_MINB : 1)
k_decode_step(st_args a)
{
	const int n = 5 * a.s.n_layer;
	unsigned long long *prof = a.s.prof;
	if (prof && threadIdx.x == 0) {
		unsigned long long t = st_now();
		atomicMin(&prof[2], t);
		atomicMax(&prof[3], t);
	}
	for (int k = 0; k <= n; k++) {
		const st_bar sync = { a.s.bar, (unsigned)k * gridDim.x, a.s.bar_kind, prof, (unsigned)k };
		st_stage<HD, G, GPT2>(a, k, (int)blockIdx.x, (int)gridDim.x, sync);
	}
	st_grid_end(a.s.bar, gridDim.x, prof, n);
}
/* ==== step launchers */


typedef void (*st_kernel)(st_args);

/* the instantiations: GPT-2 (G 1) at HD 64, 128; then RMSNorm/SwiGLU at HD 64 x G 1..8, HD 128 x G 1..8 */
#define ST_NK 18
#define ST_K(HD, G, P) k_decode_step<HD, G, P>
#define ST_A(HD, G) sizeof(dc_lane_sm<HD, G, ST_WARPS>)
#define ST_G8(M, HD) M(HD, 1, 0), M(HD, 2, 0), M(HD, 3, 0), M(HD, 4, 0), M(HD, 5, 0), M(HD, 6, 0), M(HD, 7, 0), M(HD, 8, 0)
#define ST_KK(HD, G, P) ST_K(HD, G, P)
#define ST_AA(HD, G, P) ST_A(HD, G)
static st_kernel const st_kern[ST_NK] = { ST_K(64, 1, 1), ST_K(128, 1, 1), ST_G8(ST_KK, 64), ST_G8(ST_KK, 128) };
static const size_t st_asz[ST_NK] = { ST_A(64, 1), ST_A(128, 1), ST_G8(ST_AA, 64), ST_G8(ST_AA, 128) };
static std::atomic<unsigned long> st_cap[ST_NK];  /* (shared memory << 32 | resident blocks), 0: none yet */

static int
st_index(const rlk_step *s)
{
	int G = s->NH / s->NKV;
	return s->gpt2 ? (s->HD == 128) : 2 + (s->HD == 128) * 8 + G - 1;
}

static size_t
st_smem(const rlk_step *s, int i)
{
	size_t row = (size_t)ST_NR * s->C * sizeof(bf16);
	return row > st_asz[i] ? row : st_asz[i];
}

extern "C" int
rlk_decode_step_ok(const rlk_step *s, int B)
{
	if (!s || B < 1 || B > RLK_STEP_ROWS || s->n_layer < 1)
		return 0;
	if (s->C <= 0 || s->C % 8 || s->C > 8192 || s->H <= 0 || s->H % 8 || s->V <= 0)
		return 0;
	if ((s->HD != 64 && s->HD != 128) || s->NKV <= 0 || s->NH % s->NKV || s->NH / s->NKV > DC_GMAX)
		return 0;
	if (s->gpt2 && s->NH != s->NKV)
		return 0;  /* GPT-2's instantiations: G 1 */
	if (s->BS < 1 || s->MAXBLK < 1 || !s->lm_w || !s->lnf_w)
		return 0;
	/* loaded 16 bytes at a time: the rows of x, att and h, the norm weights, the LM head */
	return rlk_a16(s->x) && rlk_a16(s->qkv) && rlk_a16(s->att) && rlk_a16(s->h) && rlk_a16(s->logits) && rlk_a16(s->lnf_w) &&
	    rlk_a16(s->lnf_b) && rlk_a16(s->lm_w);
}

extern "C" int
rlk_step_layer_ok(const rlk_step *s, const rlk_step_layer *l)
{
	if (!s || !l || !l->ln1_w || !l->qkv_w || !l->o_w || !l->ln2_w || !l->fc_w || !l->proj_w || !l->kc || !l->vc)
		return 0;
	/* the weights and norm weights load 16 bytes at a time, the cache rows (HD a multiple of 8) too */
	return rlk_a16(l->ln1_w) && rlk_a16(l->ln1_b) && rlk_a16(l->qkv_w) && rlk_a16(l->o_w) && rlk_a16(l->ln2_w) && rlk_a16(l->ln2_b) &&
	    rlk_a16(l->fc_w) && rlk_a16(l->proj_w) && rlk_a16(l->kc) && rlk_a16(l->vc);
}

extern "C" int
rlk_decode_step_blocks(const rlk_step *s, int B)
{
	int dev, nsm = 0, nb = 0;
	if (!rlk_decode_step_ok(s, B))
		return 0;
	const int i = st_index(s);
	const size_t sm = st_smem(s, i);
	unsigned long c = st_cap[i].load(std::memory_order_relaxed);
	if (c == 0 || (c >> 32) != sm) {
		const void *fn = (const void *)st_kern[i];
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
		    (sm > 48 * 1024 &&
		     cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess) ||
		    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, ST_WARPS * 32, sm) != cudaSuccess || nsm < 1 ||
		    nb < 1) {
			cudaGetLastError();
			return 0;
		}
		c = (unsigned long)sm << 32 | (unsigned)nsm * (unsigned)nb;
		st_cap[i].store(c, std::memory_order_relaxed);
	}
	return (int)(c & 0xffffffffu);
}

extern "C" int
rlk_decode_step(void *stream, const rlk_step *s, const int32_t *pos, const int32_t *slot, const int32_t *bt,
    const int32_t *ctx, int B)
{
	if (!rlk_decode_step_ok(s, B) || !pos || !slot || !bt || !ctx || !s->layer || !s->cnt || !s->bar)
		return (int)cudaErrorInvalidValue;
	if (s->nsplit < 1 || s->nsplit > RLK_DECODE_MAXSPLIT || (s->nsplit > 1 && (!s->ws || !rlk_a16(s->ws))))
		return (int)cudaErrorInvalidValue;  /* float4 loads of the partials */
	int n = rlk_decode_step_blocks(s, B);
	if (s->grid > 0 && s->grid < n)
		n = s->grid;
	if (n < 1)
		return (int)cudaErrorInvalidConfiguration;
	const int i = st_index(s);
	st_args a = { *s, pos, slot, bt, ctx, B };
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at[1];
	cfg.gridDim = dim3((unsigned)n);
	cfg.blockDim = dim3(ST_WARPS * 32);
	cfg.dynamicSmemBytes = st_smem(s, i);
	cfg.stream = RLK_STREAM(stream);
	at[0].id = cudaLaunchAttributeCooperative;
	at[0].val.cooperative = 1;
	cfg.attrs = at;
	cfg.numAttrs = s->plain ? 0 : 1;
	cudaError_t e = cudaLaunchKernelEx(&cfg, st_kern[i], a);
	if (e != cudaSuccess)
		return (int)e;
	RLK_RET();
}

/*
 * cuda_emu.h — just enough of CUDA's device side to run a kernel's source on
 * the CPU, unchanged: the threads of a block are cooperative fibers (ucontext)
 * run one block at a time; __shared__ arrays are statics (one block at a time
 * shares them); __syncthreads() and the warp shuffles are barriers over the
 * block or the warp, so a barrier or a full-mask shuffle that not every thread
 * (lane) reaches is reported as a deadlock instead of hanging.  bf16 is stored
 * as in CUDA (16 bits, round to nearest even), __expf is expf.  Atomics are plain
 * read-modify-writes and __threadfence does nothing (blocks run one after another,
 * a valid order); emu_block_shuffle runs a grid's blocks in a random order, for the
 * kernels whose last block to finish a group does the rest (counter pattern).
 * emu_launch_coop runs every block of a small grid at once (a cooperative launch), for a
 * grid-wide barrier: __nanosleep yields to the other fibers, so a block polling a counter
 * lets the others run; each block gets its part of the dynamic shared memory, but __shared__
 * statics would be one for all blocks: only for code without them.
 *
 * For kernels/emu/emu_*.cpp (kernels/emu/run.sh).  It checks index arithmetic,
 * block/warp merges and barrier placement; it says nothing about timing, the
 * memory model beyond barriers, occupancy or what nvcc does with the code.
 */
#ifndef RL_CUDA_EMU_H
#define RL_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__
#define RLK_GDC(x) ((void)0)  /* griddepcontrol (common.cuh): no-ops here */

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 { float x, y; };
/* vector types aligned as in CUDA (a sanitized build reports a misaligned access) */
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 r = { x, y, z, w }; return r; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = { x, y, z, w }; return r; }
static inline uint2 make_uint2(unsigned x, unsigned y) { uint2 r = { x, y }; return r; }
static inline float2 make_float2(float x, float y) { float2 r = { x, y }; return r; }

/* bf16 as CUDA stores it */
struct __nv_bfloat16 { uint16_t h; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __nv_bfloat16 bf16;

static inline float
__bfloat162float(__nv_bfloat16 v)
{
	uint32_t u = (uint32_t)v.h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline __nv_bfloat16
__float2bfloat16(float f)
{
	uint32_t u;
	__nv_bfloat16 r;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		r.h = (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
	else
		r.h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	return r;
}

static inline float2
__bfloat1622float2(__nv_bfloat162 v)
{
	float2 r = { __bfloat162float(v.x), __bfloat162float(v.y) };
	return r;
}

static inline __nv_bfloat162
__floats2bfloat162_rn(float a, float b)
{
	__nv_bfloat162 r = { __float2bfloat16(a), __float2bfloat16(b) };
	return r;
}

static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.h; }

/* IEEE fp32 arithmetic without contraction (run.sh compiles with -ffp-contract=off) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

static inline float emu_expf(float x) { return expf(x); }
#define __expf emu_expf
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

/* ---- the block's threads as fibers ---------------------------------------------------- */
#define EMU_MAXT 1024
#define EMU_STACK (256 * 1024)

struct emu_bar { int count; unsigned gen; };

struct emu_state {
	ucontext_t sched, fib[EMU_MAXT];
	char *stack[EMU_MAXT];
	int nt, cur, done[EMU_MAXT], progress;
	int bsize;  /* threads a block: nt, or fewer in emu_launch_coop (fiber cur: block cur / bsize) */
	emu_bar block[EMU_MAXT / 32], warp[EMU_MAXT / 32];
	float xch[EMU_MAXT];
	double xchd[EMU_MAXT];
	void (*body)(void *);
	void *arg;
};
static emu_state emu;

/* RL_EMU_SKEW=1: each scheduling round runs a random half of the warps, so warps drift
 * apart by many steps between block barriers (a missing __syncthreads shows as a race
 * on shared memory), and cp.async copies are done at once instead of at their wait */
static int emu_skew = getenv("RL_EMU_SKEW") != NULL && atoi(getenv("RL_EMU_SKEW")) > 0;
static uint64_t emu_skew_state = 0x853c49e6748fea9bull;

static dim3 threadIdx, blockIdx, blockDim, gridDim;
static int emu_coop;  /* in emu_launch_coop: every block of the grid runs at once */

/* dynamic shared memory (extern __shared__): one arena, filled with 0xff (NaN as bf16 and
 * f32) before every block, so a read of an element the block did not write shows; in
 * emu_launch_coop split into equal parts, one a block (emu_dyn_per() bytes each) */
#define EMU_DYN_SMEM (128 * 1024)
alignas(128) static unsigned char emu_dyn[EMU_DYN_SMEM];
static size_t
emu_dyn_per(void)
{
	return emu_coop ? EMU_DYN_SMEM / gridDim.x / 128 * 128 : EMU_DYN_SMEM;
}
static unsigned char *
emu_dyn_smem(size_t bytes)
{
	if (bytes > emu_dyn_per()) {
		fprintf(stderr, "emu: %zu bytes of dynamic shared memory not emulated\n", bytes);
		abort();
	}
	return emu_dyn + (emu_coop ? blockIdx.x * emu_dyn_per() : 0);
}

static void
emu_yield(void)
{
	swapcontext(&emu.fib[emu.cur], &emu.sched);
}

/* every one of `size` threads of the group must arrive */
static void
emu_barrier(emu_bar *b, int size)
{
	unsigned gen = b->gen;
	emu.progress = 1;
	if (++b->count == size) {
		b->count = 0;
		b->gen++;
		return;
	}
	while (b->gen == gen)
		emu_yield();
}

/* the barriers and shuffles by fiber (emu.cur: threadIdx.x but in emu_launch_coop) */
static inline void __syncthreads(void) { emu_barrier(&emu.block[emu.cur / emu.bsize], emu.bsize); }
static inline void __syncwarp(void) { emu_barrier(&emu.warp[emu.cur / 32], 32); }

static inline float
__shfl_xor_sync(unsigned mask, float v, int o)
{
	int t = emu.cur, w = t / 32;
	if (mask != 0xffffffffu) {
		fprintf(stderr, "emu: shuffle with a partial mask %#x is not emulated\n", mask);
		abort();
	}
	emu.xch[t] = v;
	emu_barrier(&emu.warp[w], 32);
	float r = emu.xch[(t & ~31) | ((t & 31) ^ o)];
	emu_barrier(&emu.warp[w], 32);
	return r;
}

static inline void
emu_full_mask(unsigned mask, const char *what)
{
	if (mask != 0xffffffffu) {
		fprintf(stderr, "emu: %s with a partial mask %#x is not emulated\n", what, mask);
		abort();
	}
}

/* the double shuffles (and ballot) by lane: src(lane) gives the lane read from, or -1 for
 * the lane's own value */
template <typename F>
static inline double
emu_shfl_d(unsigned mask, double v, F src)
{
	int t = emu.cur, w = t / 32;
	emu_full_mask(mask, "shuffle");
	emu.xchd[t] = v;
	emu_barrier(&emu.warp[w], 32);
	int l = src(t & 31);
	double r = l < 0 ? v : emu.xchd[(t & ~31) | l];
	emu_barrier(&emu.warp[w], 32);
	return r;
}

static inline double
__shfl_xor_sync(unsigned mask, double v, int o)
{
	return emu_shfl_d(mask, v, [o](int l) { return l ^ o; });
}

static inline int
__shfl_xor_sync(unsigned mask, int v, int o)
{
	return (int)emu_shfl_d(mask, (double)v, [o](int l) { return l ^ o; });
}

static inline double
__shfl_up_sync(unsigned mask, double v, int o)
{
	return emu_shfl_d(mask, v, [o](int l) { return l >= o ? l - o : -1; });
}

static inline double
__shfl_sync(unsigned mask, double v, int src)
{
	return emu_shfl_d(mask, v, [src](int) { return src & 31; });
}

static inline unsigned
__ballot_sync(unsigned mask, int pred)
{
	int t = emu.cur;
	unsigned r = 0;
	emu_full_mask(mask, "ballot");
	emu.xchd[t] = pred ? 1.0 : 0.0;
	emu_barrier(&emu.warp[t / 32], 32);
	for (int l = 0; l < 32; l++)
		if (emu.xchd[(t & ~31) | l] != 0.0)
			r |= 1u << l;
	emu_barrier(&emu.warp[t / 32], 32);
	return r;
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
/* fibers switch only at barriers and collectives: a read-modify-write is atomic here */
static inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
static inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
static inline int atomicMin(int *p, int v) { int o = *p; if (v < o) *p = v; return o; }
static inline int atomicMax(int *p, int v) { int o = *p; if (v > o) *p = v; return o; }
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) { unsigned long long o = *p; if (v < o) *p = v; return o; }
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) { unsigned long long o = *p; if (v > o) *p = v; return o; }
/* a counter that changed is progress for the deadlock check (another block may be polling it) */
static inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; emu.progress = 1; return o; }
/* a poll's sleep lets the other fibers run; a trap stops the run */
static inline void __nanosleep(unsigned) { swapcontext(&emu.fib[emu.cur], &emu.sched); }
static inline void
__trap(void)
{
	fprintf(stderr, "emu: __trap() in block %u thread %u\n", blockIdx.x, threadIdx.x);
	abort();
}
/* blocks run one after another: a block's writes are seen by every later block, so the
 * fence has nothing to do; the loads through L2 are plain loads */
static inline void __threadfence(void) {}
template <typename T> static inline T __ldcg(const T *p) { return *p; }

/* ---- warp-collective matrix instructions, as the PTX ISA defines them ----------------
 * Every lane of the warp must execute them (a missing lane is a deadlock).  The lanes'
 * fragments are scattered into whole matrices by the documented per-lane mapping, the
 * product is formed from the matrices, and each lane gathers its own elements back, so a
 * kernel that assumes another layout computes something else and fails its check.
 * lane = 4 groupID + tq. */
struct emu_warpx {
	float a[16][16], b[16][8], c[16][8];
	const uint16_t *rows[32];
};
static emu_warpx emu_wx[EMU_MAXT / 32];

static inline float emu_lo(uint32_t v) { __nv_bfloat16 h = { (uint16_t)(v & 0xffff) }; return __bfloat162float(h); }
static inline float emu_hi(uint32_t v) { __nv_bfloat16 h = { (uint16_t)(v >> 16) }; return __bfloat162float(h); }

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, d:
 *   A (16x16): a[0] = (g, 2tq | 2tq+1), a[1] = (g+8, ...), a[2] = (g, 2tq+8 | 2tq+9), a[3] = (g+8, ...)
 *   B (16x8):  b0 = (k 2tq | 2tq+1, n g), b1 = (k 2tq+8 | 2tq+9, n g)
 *   C, D:      d[0], d[1] = (g, 2tq | 2tq+1), d[2], d[3] = (g+8, ...)
 * (low 16 bits = the lower index).  f32 products of bf16 are exact; the sum over k is
 * done in f32, in k order (the hardware's order and rounding are not specified). */
static void
emu_mma_m16n8k16_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	int t = (int)threadIdx.x, w = t / 32, l = t & 31, g = l >> 2, tq = l & 3;
	emu_warpx &x = emu_wx[w];
	x.a[g][2 * tq] = emu_lo(a[0]);
	x.a[g][2 * tq + 1] = emu_hi(a[0]);
	x.a[g + 8][2 * tq] = emu_lo(a[1]);
	x.a[g + 8][2 * tq + 1] = emu_hi(a[1]);
	x.a[g][2 * tq + 8] = emu_lo(a[2]);
	x.a[g][2 * tq + 9] = emu_hi(a[2]);
	x.a[g + 8][2 * tq + 8] = emu_lo(a[3]);
	x.a[g + 8][2 * tq + 9] = emu_hi(a[3]);
	x.b[2 * tq][g] = emu_lo(b0);
	x.b[2 * tq + 1][g] = emu_hi(b0);
	x.b[2 * tq + 8][g] = emu_lo(b1);
	x.b[2 * tq + 9][g] = emu_hi(b1);
	x.c[g][2 * tq] = d[0];
	x.c[g][2 * tq + 1] = d[1];
	x.c[g + 8][2 * tq] = d[2];
	x.c[g + 8][2 * tq + 1] = d[3];
	emu_barrier(&emu.warp[w], 32);
	for (int i = 0; i < 4; i++) {
		int r = g + (i >> 1) * 8, c = 2 * tq + (i & 1);
		float s = 0.0f;
		for (int k = 0; k < 16; k++)
			s += x.a[r][k] * x.b[k][c];
		d[i] = x.c[r][c] + s;
	}
	emu_barrier(&emu.warp[w], 32);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8i + j gives the address of row
 * j of matrix i (16-byte aligned, 8 b16 elements).  Without .trans, r[i] of lane l holds
 * (row l/4, columns 2(l%4), 2(l%4)+1) of matrix i; with .trans, (rows 2(l%4), 2(l%4)+1,
 * column l/4). */
static void
emu_ldmatrix_x4(uint32_t *r, const void *p, int trans)
{
	int t = (int)threadIdx.x, w = t / 32, l = t & 31;
	emu_warpx &x = emu_wx[w];
	if ((uintptr_t)p & 15) {
		fprintf(stderr, "emu: ldmatrix row address %p of lane %d is not 16-byte aligned\n", p, l);
		abort();
	}
	x.rows[l] = (const uint16_t *)p;
	emu_barrier(&emu.warp[w], 32);
	for (int i = 0; i < 4; i++) {
		uint32_t lo, hi;
		if (!trans) {
			const uint16_t *row = x.rows[8 * i + l / 4];
			lo = row[2 * (l % 4)];
			hi = row[2 * (l % 4) + 1];
		} else {
			lo = x.rows[8 * i + 2 * (l % 4)][l / 4];
			hi = x.rows[8 * i + 2 * (l % 4) + 1][l / 4];
		}
		r[i] = lo | hi << 16;
	}
	emu_barrier(&emu.warp[w], 32);
}

/* ---- cp.async: each thread's copies are queued and done as late as the PTX rules
 * allow, at the cp.async.wait_group that covers their group (a copy issued but never
 * waited for is never done), so a read that comes before its wait sees the old
 * (poisoned) shared memory. */
#define EMU_CPQ 128
struct emu_cp { void *dst; const void *src; int group; };
static emu_cp emu_cpq[EMU_MAXT][EMU_CPQ];
static int emu_cpn[EMU_MAXT], emu_cpg[EMU_MAXT];

static void
emu_cp_async16(void *dst, const void *src)
{
	int t = (int)threadIdx.x;
	if (((uintptr_t)dst | (uintptr_t)src) & 15) {
		fprintf(stderr, "emu: cp.async of 16 bytes with an address not 16-byte aligned\n");
		abort();
	}
	if (emu_cpn[t] == EMU_CPQ) {
		fprintf(stderr, "emu: more than %d cp.async pending in thread %d\n", EMU_CPQ, t);
		abort();
	}
	if (emu_skew)
		memcpy(dst, src, 16);
	else
		emu_cpq[t][emu_cpn[t]++] = { dst, src, emu_cpg[t] };
}

static void emu_cp_commit(void) { emu_cpg[threadIdx.x]++; }

/* cp.async.wait_group n: every group but the n most recent committed ones is done */
static void
emu_cp_wait(int n)
{
	int t = (int)threadIdx.x, k = 0;
	for (int i = 0; i < emu_cpn[t]; i++) {
		emu_cp &c = emu_cpq[t][i];
		if (c.group < emu_cpg[t] - n)
			memcpy(c.dst, c.src, 16);
		else
			emu_cpq[t][k++] = c;
	}
	emu_cpn[t] = k;
}

static void
emu_trampoline(void)
{
	emu.body(emu.arg);
	emu.done[emu.cur] = 1;
	emu.progress = 1;
	swapcontext(&emu.fib[emu.cur], &emu.sched);
}

/* emu_block_shuffle set: emu_launch runs the blocks of a grid in a random order (drawn
 * from this state) instead of x fastest, then y, then z; a kernel whose blocks meet
 * through atomics (the last block of a group does the rest) must give the same result
 * in any order */
static int emu_block_shuffle;
static uint64_t emu_shuffle_state = 0x9e3779b97f4a7c15ull;

/* Runs fibers 0 .. nt-1 to their end: blocks of emu.bsize threads; coop: all the grid's blocks
 * (fiber t is thread t % bsize of block t / bsize), else the one block blockIdx. */
static void
emu_run(int nt, int coop)
{
	unsigned bx = blockIdx.x, by = blockIdx.y;
	memset(emu_dyn, 0xff, sizeof emu_dyn);
	memset(emu_cpn, 0, sizeof emu_cpn);
	memset(emu_cpg, 0, sizeof emu_cpg);
	memset(emu.block, 0, sizeof emu.block);
	memset(emu.warp, 0, sizeof emu.warp);
	for (int t = 0; t < nt; t++) {
		if (!emu.stack[t] && !(emu.stack[t] = (char *)malloc(EMU_STACK)))
			abort();
		emu.done[t] = 0;
		getcontext(&emu.fib[t]);
		emu.fib[t].uc_stack.ss_sp = emu.stack[t];
		emu.fib[t].uc_stack.ss_size = EMU_STACK;
		emu.fib[t].uc_link = NULL;
		makecontext(&emu.fib[t], emu_trampoline, 0);
	}
	/* rounds in a row without progress: a deadlock at 1, or with skew at 64 (a runnable warp
	 * is left out of 64 rounds in a row with probability 2^-64) */
	int idle = 0;
	for (;;) {
		int left = 0;
		unsigned run = ~0u;  /* warps scheduled this round (skew: a random half) */
		if (emu_skew) {
			emu_skew_state = emu_skew_state * 6364136223846793005ull + 1442695040888963407ull;
			run = (unsigned)(emu_skew_state >> 32);
		}
		emu.progress = 0;
		for (int t = 0; t < nt; t++) {
			if (emu.done[t])
				continue;
			left++;
			if (!(run >> (t / 32 % 32) & 1))
				continue;
			emu.cur = t;
			threadIdx = dim3((unsigned)(t % emu.bsize), 0, 0);
			if (coop)
				blockIdx = dim3((unsigned)(t / emu.bsize), 0, 0);
			swapcontext(&emu.sched, &emu.fib[t]);
		}
		if (!left)
			break;
		idle = emu.progress ? 0 : idle + 1;
		if (idle >= (emu_skew ? 64 : 1)) {
			if (coop)
				fprintf(stderr, "emu: deadlock in a cooperative grid: a barrier or shuffle not reached by "
				    "every thread of its block/warp, or a grid barrier not reached by every block\n");
			else
				fprintf(stderr, "emu: deadlock in block (%u,%u): a barrier or shuffle not "
				    "reached by every thread of its block/warp\n", bx, by);
			abort();
		}
	}
}

static void
emu_check_block(int nt, dim3 block)
{
	if (nt <= 0 || nt > EMU_MAXT || nt % 32 || block.y != 1 || block.z != 1) {
		fprintf(stderr, "emu: block of %d threads not emulated\n", nt);
		abort();
	}
}

/* Runs body(arg) as the kernel over grid x block (block.x threads, a multiple of 32). */
static void
emu_launch(dim3 grid, dim3 block, void (*body)(void *), void *arg)
{
	int nt = (int)(block.x * block.y * block.z);
	emu_check_block(nt, block);
	gridDim = grid;
	blockDim = block;
	emu.nt = emu.bsize = nt;
	emu.body = body;
	emu.arg = arg;
	size_t nb = (size_t)grid.x * grid.y * grid.z, *order = (size_t *)malloc((nb ? nb : 1) * sizeof(size_t));
	if (!order)
		abort();
	for (size_t i = 0; i < nb; i++)
		order[i] = i;
	for (size_t i = nb; emu_block_shuffle && i > 1; i--) {
		emu_shuffle_state = emu_shuffle_state * 6364136223846793005ull + 1442695040888963407ull;
		size_t j = (size_t)(emu_shuffle_state >> 33) % i, t = order[i - 1];
		order[i - 1] = order[j];
		order[j] = t;
	}
	for (size_t bi = 0; bi < nb; bi++) {
		unsigned bx = (unsigned)(order[bi] % grid.x), by = (unsigned)(order[bi] / grid.x % grid.y);
		unsigned bz = (unsigned)(order[bi] / grid.x / grid.y);
		blockIdx = dim3(bx, by, bz);
		emu_run(nt, 0);
	}
	free(order);
}

/* The grid's blocks all at once, as fibers scheduled together (grid.x x block.x threads at
 * most EMU_MAXT; a one-dimensional grid).  The dynamic shared memory is split between the
 * blocks (emu_dyn_per); __shared__ statics are one for all blocks: only for code without. */
static void
emu_launch_coop(dim3 grid, dim3 block, void (*body)(void *), void *arg)
{
	int bs = (int)(block.x * block.y * block.z);
	emu_check_block(bs, block);
	if (grid.y != 1 || grid.z != 1 || (long)grid.x * bs > EMU_MAXT) {
		fprintf(stderr, "emu: cooperative grid of %u x %d threads not emulated\n", grid.x, bs);
		abort();
	}
	gridDim = grid;
	blockDim = block;
	emu.bsize = bs;
	emu.nt = (int)grid.x * bs;
	emu.body = body;
	emu.arg = arg;
	emu_coop = 1;
	emu_run(emu.nt, 1);
	emu_coop = 0;
	emu.bsize = emu.nt = bs;
}

/* ---- test data: xorshift draws (the state is the caller's) --------------------------------- */
static inline uint32_t
emu_rnd(uint64_t *rs)
{
	*rs ^= *rs << 13;
	*rs ^= *rs >> 7;
	*rs ^= *rs << 17;
	return (uint32_t)(*rs >> 11);
}

/* uniform in [lo, hi) */
static inline float
frnd(uint64_t *rs, float lo, float hi)
{
	return lo + (hi - lo) * (float)(emu_rnd(rs) & 0xffffff) / 16777216.0f;
}

/* bf16 copies: device-side array and the f32 value it holds */
static inline void
fill_bf(uint64_t *rs, bf16 *d, float *f, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++) {
		d[i] = __float2bfloat16(frnd(rs, lo, hi));
		f[i] = __bfloat162float(d[i]);
	}
}

#endif

/*
 * emu_kernels.cpp — kernels of decode.cu and norm.cu run on the CPU through
 * cuda_emu.h (their source cut out of the .cu files by run.sh) against the CPU
 * reference of lib/compute/ops_cpu.c:
 *   - split decode attention (k_decode_split, k_decode_lane or k_decode_wide): HD 64 and 128,
 *     1 to 8 query heads per KV head, nsplit 1, 2, 3, 7, 22, 32, 44, 64, contexts of 1,
 *     the whole cache, exact multiples of a round (DC_UNROLL keys x the workers) and one
 *     past, random lengths, shared and shuffled blocks, then 24 random shapes;
 *     outputs and partials poisoned with NaN first; the splits merged inside the kernel
 *     by the last block (blocks in a random order, the counters back at 0 after the
 *     launch; grids up to 96 blocks launched again in another order: the same bits),
 *     and by k_decode_merge (2 to 70 splits);
 *   - add_norm_fwd: LayerNorm and RMSNorm, rows that fill a block partly, C not a
 *     multiple of 32; the updated x, out and statistics equal, bit for bit, the
 *     separate add then k_layernorm_fwd / k_rmsnorm_fwd (emulated), and out is
 *     within a bf16 rounding of the CPU reference;
 *   - k_gemv (matmul_fwd of 1-4 rows) against rl_cpu_matmul_fwd, with and without bias;
 *   - k_norm_vec (the row in registers, 16-byte loads): add + LayerNorm / RMSNorm
 *     and the plain norms, C from 8 to 4096 (1 to 16 chunks per lane, rows that
 *     end inside a chunk): the updated x equals the add bit for bit, out and the
 *     statistics within a bf16 rounding of the CPU reference;
 *   - fuse.cu's k_fused_gemv (matmul_fused_fwd: norm prologue, residual / GELU / SwiGLU
 *     epilogues), 1-4 rows: the same bits as the separate kernels it replaces
 *     (k_norm_vec, k_gemv, then the epilogue's arithmetic) where those take the shape
 *     (C <= 4096), and within bf16 roundings of the CPU ops composed (norm, matmul,
 *     add / gelu / swiglu); k_rope_kv (rope_kv_write) the same bits as k_rope then
 *     k_kv_write, within RoPE's tolerance of the CPU, the cache untouched at slot -1;
 *     the QKV epilogue (matmul_rope_kv_fwd) the same bits as k_fused_gemv then k_rope_kv;
 *     k_fused_gemv_split (rows over 2, 4 or 8 warps) within the tolerance, its QKV epilogue
 *     the same bits as it without then k_rope_kv; the prefetch (PF) the same bits.
 * Tolerance of decode attention as test_cuda_ops: fp32 throughout, one bf16
 * rounding of the output: atol 1e-3 max|ref| + rtol 8e-3.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops_cpu.h"
}

/* fuse.cu's dynamic shared memory: cuda_emu.h's arena (NaN-filled before every block) */
#define FUSE_SMEM(name) bf16 *name = (bf16 *)emu_dyn_smem(0)
#include "kernels.inc"

static int fails, cases;
static uint64_t rs = 0x9e3779b97f4a7c15ull;  /* emu_rnd, frnd, fill_bf: cuda_emu.h */

/* outputs off the reference by more than atol + rtol |ref| (NaN included): the count,
 * the first one's index (*first, when any) and the largest error (*worst) */
static size_t
out_bad(const bf16 *out, const float *ref, size_t n, double atol, double rtol, double *worst, size_t *first)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs(__bfloat162float(out[i]) - ref[i]);
		if (!(e <= atol + rtol * fabs(ref[i])) && !bad++)
			*first = i;
		if (!(e <= *worst))
			*worst = e;
	}
	return bad;
}

/* ---- split decode attention -------------------------------------------------------- */
struct dec_args {
	bf16 *out, *qkv, *kc, *vc;
	float *ws;
	float2 *wml;
	unsigned *cnt;
	int32_t *bt, *cl;
	int NH, NKV, HD, BS, MAXBLK, nsplit, lane, mk, nw;
};
static dec_args DA;

#define RW(H, G, W) k_decode_wide<H, G, W>(DA.out, DA.ws, DA.wml, DA.cnt, DA.qkv, DA.kc, DA.vc, DA.bt, DA.cl, \
	DA.NH, DA.NKV, DA.BS, DA.MAXBLK, DA.nsplit, DA.mk)
#define RS(H, G) do { if (DA.lane == 2 && DA.nw == 16) \
		RW(H, G, (H == 64 ? 16 : 8)); \
	else if (DA.lane == 2 && DA.nw == 8) \
		RW(H, G, 8); \
	else if (DA.lane == 2) \
		RW(H, G, 4); \
	else if (DA.lane) \
		k_decode_lane<H, G>(DA.out, DA.ws, DA.wml, DA.cnt, DA.qkv, DA.kc, DA.vc, DA.bt, DA.cl, DA.NH, DA.NKV, \
		    DA.BS, DA.MAXBLK, DA.nsplit, DA.mk); \
	else \
		k_decode_split<H, G>(DA.out, DA.ws, DA.wml, DA.cnt, DA.qkv, DA.kc, DA.vc, DA.bt, DA.cl, DA.NH, DA.NKV, \
		    DA.BS, DA.MAXBLK, DA.nsplit, DA.mk); } while (0)
#define RSG(H) switch (DA.NH / DA.NKV) { case 1: RS(H, 1); break; case 2: RS(H, 2); break; case 3: RS(H, 3); break; \
	case 4: RS(H, 4); break; case 5: RS(H, 5); break; case 6: RS(H, 6); break; case 7: RS(H, 7); break; \
	default: RS(H, 8); break; }

static void
run_split(void *)
{
	if (DA.HD == 64)
		RSG(64)
	else
		RSG(128)
}

static void
run_merge(void *)
{
	k_decode_merge(DA.out, DA.ws, DA.wml, DA.HD, DA.nsplit);
}

/* ctxmode 0: random lengths; 1: 1, the whole cache, UW, UW + 1, UW - 1, W (U: the keys a
 * worker takes per round, DC_UNROLL for k_decode_split, 32 for k_decode_lane and
 * k_decode_wide), then random.
 * lane_kernel: 0 k_decode_split, 1 k_decode_lane, 2 k_decode_wide (blocks of dw_nw<HD>::NW
 * warps when nsplit > 1, else DW_SMALL; min_keys 0 is taken as a round of its block, as its
 * launcher does; wide_nw forces 4, 8 or 16).  sep_merge: the splits merged by
 * k_decode_merge, else by the last block of each (sequence, KV head) inside the kernel:
 * then the blocks run in a random order, twice (another order), and the second output must
 * equal the first bit for bit with every counter back at 0 after each launch. */
static int lane_kernel, sep_merge;
static int min_keys;  /* the kernels' min_keys (splits by context with the in-kernel merge) */
static int wide_nw;   /* k_decode_wide's warps (rlk_set_decode_wide): 0 the launcher's rule */

static void
test_decode(int B, int NH, int NKV, int HD, int BS, int MAXBLK, int nsplit, int ctxmode)
{
	int NW = lane_kernel != 2 ? DC_WARPS : wide_nw ? wide_nw : nsplit == 1 ? DW_SMALL : HD == 64 ? dw_nw<64>::NW :
	    dw_nw<128>::NW;
	if (HD == 128 && NW == 16)
		NW = 8;  /* as the launcher: 16 warps at HD 64 only */
	int W = (NH + 2 * NKV) * HD, NBLK = B * MAXBLK + 3, cap = BS * MAXBLK, workers = nsplit * NW;
	int U = lane_kernel ? 32 : DC_UNROLL, inkernel = nsplit > 1 && nsplit <= DC_MAXSPLIT && !sep_merge;
	int mk = lane_kernel == 2 && min_keys <= 0 ? NW * 32 : min_keys;
	size_t ncache = (size_t)NBLK * BS * NKV * HD, nq = (size_t)B * W, no = (size_t)B * NH * HD;
	size_t nws = (size_t)B * NH * nsplit * (HD + 2);
	bf16 *kc = new bf16[ncache], *vc = new bf16[ncache], *q = new bf16[nq], *out = new bf16[no];
	bf16 *out2 = new bf16[no];
	float *fkc = new float[ncache], *fvc = new float[ncache], *fq = new float[nq], *ref = new float[no];
	float *ws = new float[nws ? nws : 1];
	unsigned *cnt = new unsigned[(size_t)B * NKV];
	int32_t *bt = new int32_t[(size_t)B * MAXBLK], *cl = new int32_t[B];

	fill_bf(&rs, kc, fkc, ncache, -2, 2);
	fill_bf(&rs, vc, fvc, ncache, -2, 2);
	fill_bf(&rs, q, fq, nq, -2, 2);
	for (int b = 0; b < B; b++) {
		int sp[] = { 1, cap, U * workers, U * workers + 1, U * workers - 1, workers };
		if (lane_kernel == 2) {  /* around one split's keys */
			int w[] = { 1, cap, mk, mk + 1, mk - 1, 32 };
			memcpy(sp, w, sizeof w);
		}
		cl[b] = 1 + (int)(emu_rnd(&rs) % (uint32_t)cap);
		if (ctxmode == 1 && b < 6 && sp[b] >= 1 && sp[b] <= cap)
			cl[b] = sp[b];
		for (int i = 0; i < MAXBLK; i++)
			bt[b * MAXBLK + i] = (int32_t)(emu_rnd(&rs) % (uint32_t)NBLK);  /* shared blocks allowed */
	}
	for (size_t i = 0; i < no; i++)
		out[i].h = out2[i].h = 0x7fc1;  /* NaN */
	for (size_t i = 0; i < nws; i++)
		ws[i] = NAN;
	memset(cnt, 0, (size_t)B * NKV * sizeof *cnt);
	rl_cpu_attn_decode(NULL, ref, fq, fkc, fvc, bt, cl, B, NH, NKV, HD, BS, MAXBLK);

	DA = { out, q, kc, vc, nsplit > 1 ? ws : NULL, nsplit > 1 ? (float2 *)(ws + (size_t)B * NH * nsplit * HD) : NULL,
	    inkernel ? cnt : NULL, bt, cl, NH, NKV, HD, BS, MAXBLK, nsplit, lane_kernel, mk, NW };
	emu_block_shuffle = inkernel;
	emu_launch(dim3((unsigned)(B * NKV), (unsigned)nsplit), dim3((unsigned)NW * 32), run_split, NULL);
	if (nsplit > 1 && !inkernel)
		emu_launch(dim3((unsigned)(B * NH)), dim3((unsigned)HD), run_merge, NULL);
	int cbad = 0, rbad = 0;
	for (int i = 0; i < B * NKV; i++)
		cbad += cnt[i] != 0;
	int twice = inkernel && B * NKV * nsplit <= 96;  /* the emulator's time: small grids only */
	if (twice) {
		/* again in another order: the same bits, the counters 0 again */
		DA.out = out2;
		emu_launch(dim3((unsigned)(B * NKV), (unsigned)nsplit), dim3((unsigned)NW * 32), run_split, NULL);
		for (int i = 0; i < B * NKV; i++)
			cbad += cnt[i] != 0;
		rbad = memcmp(out, out2, no * sizeof *out) != 0;
	}
	emu_block_shuffle = 0;

	double mx = 0, worst = 0;
	size_t bad = 0, at = 0;
	for (size_t i = 0; i < no; i++)
		mx = fmax(mx, fabs(ref[i]));
	bad = out_bad(out, ref, no, 1e-3 * mx, 8e-3, &worst, &at);
	cases++;
	if (bad || cbad || rbad)
		fails++;
	printf("%s decode %s%s B=%d NH=%d NKV=%d HD=%d BS=%d ctx<=%d nsplit=%d%s ctx0=%d: max err %.3g%s",
	    bad || cbad || rbad ? "FAIL" : "ok  ", lane_kernel == 2 ? "wide" : lane_kernel ? "lane" : "split",
	    nsplit == 1 ? "" : twice ? " (merge in kernel, twice)" : inkernel ? " (merge in kernel)" : " (merge kernel)", B, NH,
	    NKV, HD, BS, cap,
	    nsplit, mk && inkernel ? " (by context)" : "", cl[0], worst, bad ? "" : "\n");
	if (bad)
		printf(", %zu bad, first at %zu (seq %zu head %zu d %zu, ctx %d): %g vs %g\n", bad, at,
		    at / ((size_t)NH * HD), at / HD % NH, at % HD, cl[at / ((size_t)NH * HD)],
		    __bfloat162float(out[at]), ref[at]);
	if (cbad)
		printf("     %d counters left non-zero\n", cbad);
	if (rbad)
		printf("     the second launch (another block order) differs from the first\n");
	delete[] kc; delete[] vc; delete[] q; delete[] out; delete[] out2; delete[] fkc; delete[] fvc; delete[] fq;
	delete[] ref; delete[] ws; delete[] cnt; delete[] bt; delete[] cl;
}

/* ---- add + norm ----------------------------------------------------------------------- */
struct norm_args {
	bf16 *x, *out, *t, *w, *b;
	float *mean, *rstd, eps;
	int N, C, ln;
};
static norm_args NA;

/* the norms' tolerance against the CPU: out within a bf16 rounding, rstd (and mean) within
 * f32 rounding of a differently ordered sum; the number of misses, *worst the largest
 * output error */
static size_t
norm_bad(const bf16 *out, const float *ref, size_t n, const float *r1, const float *rr, const float *m1,
    const float *rm, int N, int ln, double *worst)
{
	size_t first, bad = out_bad(out, ref, n, 1e-5, 8e-3, worst, &first);
	for (int r = 0; r < N; r++)
		if (!(fabs(r1[r] - rr[r]) <= 1e-4 * fabs(rr[r])) || (ln && !(fabs(m1[r] - rm[r]) <= 1e-6 + 1e-4 * fabs(rm[r]))))
			bad++;
	return bad;
}

static void run_add_norm(void *) { k_add_norm_fwd(NA.x, NA.out, NA.mean, NA.rstd, NA.t, NA.w, NA.b, NA.N, NA.C, NA.eps, NA.ln); }
static void run_ln(void *) { k_layernorm_fwd(NA.out, NA.mean, NA.rstd, NA.x, NA.w, NA.b, NA.N, NA.C, NA.eps); }
static void run_rms(void *) { k_rmsnorm_fwd(NA.out, NA.rstd, NA.x, NA.w, NA.N, NA.C, NA.eps); }

static void
test_add_norm(int N, int C, int ln)
{
	size_t n = (size_t)N * C;
	bf16 *x = new bf16[n], *x2 = new bf16[n], *t = new bf16[n], *w = new bf16[C], *b = new bf16[C];
	bf16 *out = new bf16[n], *out2 = new bf16[n];
	float *fx = new float[n], *ft = new float[n], *fw = new float[C], *fb = new float[C], *xs = new float[n];
	float *ref = new float[n], *m1 = new float[N], *r1 = new float[N], *m2 = new float[N], *r2 = new float[N];
	float *rm = new float[N], *rr = new float[N], eps = ln ? 1e-5f : 1e-6f;
	unsigned grid = (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS);

	fill_bf(&rs, x, fx, n, -2, 2);
	fill_bf(&rs, t, ft, n, -2, 2);
	fill_bf(&rs, w, fw, C, 0.5f, 1.5f);
	fill_bf(&rs, b, fb, C, -0.5f, 0.5f);
	for (size_t i = 0; i < n; i++) {
		x2[i] = __float2bfloat16(fx[i] + ft[i]);  /* what add writes */
		xs[i] = __bfloat162float(x2[i]);
		out[i].h = out2[i].h = 0x7fc1;
	}
	for (int r = 0; r < N; r++)
		m1[r] = r1[r] = m2[r] = r2[r] = NAN;
	if (ln)
		rl_cpu_layernorm_fwd(NULL, ref, rm, rr, xs, fw, fb, N, C, eps);
	else
		rl_cpu_rmsnorm_fwd(NULL, ref, rr, xs, fw, N, C, eps);

	NA = { x, out, t, w, ln ? b : NULL, ln ? m1 : NULL, r1, eps, N, C, ln };
	emu_launch(dim3(grid), dim3(NORM_WARPS * 32), run_add_norm, NULL);
	NA = { x2, out2, NULL, w, ln ? b : NULL, ln ? m2 : NULL, r2, eps, N, C, ln };
	emu_launch(dim3(grid), dim3(NORM_WARPS * 32), ln ? run_ln : run_rms, NULL);

	int same = memcmp(x, x2, n * 2) == 0 && memcmp(out, out2, n * 2) == 0 && memcmp(r1, r2, (size_t)N * 4) == 0 &&
	    (!ln || memcmp(m1, m2, (size_t)N * 4) == 0);
	double worst = 0;
	size_t bad = norm_bad(out, ref, n, r1, rr, m1, rm, N, ln, &worst);
	cases++;
	if (bad || !same)
		fails++;
	printf("%s add_norm N=%d C=%d ln=%d: same bits as add + %s: %s, max err vs CPU %.3g, %zu bad\n",
	    bad || !same ? "FAIL" : "ok  ", N, C, ln, ln ? "layernorm" : "rmsnorm", same ? "yes" : "NO", worst, bad);
	delete[] x; delete[] x2; delete[] t; delete[] w; delete[] b; delete[] out; delete[] out2; delete[] fx;
	delete[] ft; delete[] fw; delete[] fb; delete[] xs; delete[] ref; delete[] m1; delete[] r1; delete[] m2;
	delete[] r2; delete[] rm; delete[] rr;
}

struct vec_args {
	bf16 *xw, *xin, *t, *out, *w, *b;
	float *mean, *rstd, eps;
	int N, C, ln, nch;
};
static vec_args VA;

#define NVK(K) k_norm_vec<K>(VA.xw, VA.xin, VA.t, VA.out, VA.mean, VA.rstd, VA.w, VA.b, VA.N, VA.C, VA.eps, VA.ln)
static void
run_vec(void *)
{
	switch (VA.nch) {  /* norm_vec's choice in norm.cu */
	case 1: NVK(1); break; case 2: NVK(2); break; case 3: NVK(3); break; case 4: NVK(4); break;
	case 6: NVK(6); break; case 8: NVK(8); break; case 12: NVK(12); break; default: NVK(16); break;
	}
}

/* add: x += t then the norm (add_norm_fwd), else the norm of x */
static void
test_norm_vec(int N, int C, int ln, int add)
{
	size_t n = (size_t)N * C;
	bf16 *x = new bf16[n], *x2 = new bf16[n], *t = new bf16[n], *w = new bf16[C], *b = new bf16[C], *out = new bf16[n];
	float *fx = new float[n], *ft = new float[n], *fw = new float[C], *fb = new float[C], *xs = new float[n];
	float *ref = new float[n], *m1 = new float[N], *r1 = new float[N], *rm = new float[N], *rr = new float[N];
	float eps = ln ? 1e-5f : 1e-6f;
	int k = (C + 255) / 256, nch = k <= 4 ? k : k <= 6 ? 6 : k <= 8 ? 8 : k <= 12 ? 12 : 16;
	fill_bf(&rs, x, fx, n, -2, 2);
	fill_bf(&rs, t, ft, n, -2, 2);
	fill_bf(&rs, w, fw, C, 0.5f, 1.5f);
	fill_bf(&rs, b, fb, C, -0.5f, 0.5f);
	for (size_t i = 0; i < n; i++) {
		x2[i] = add ? __float2bfloat16(fx[i] + ft[i]) : x[i];
		xs[i] = __bfloat162float(x2[i]);
		out[i].h = 0x7fc1;
	}
	for (int r = 0; r < N; r++)
		m1[r] = r1[r] = NAN;
	if (ln)
		rl_cpu_layernorm_fwd(NULL, ref, rm, rr, xs, fw, fb, N, C, eps);
	else
		rl_cpu_rmsnorm_fwd(NULL, ref, rr, xs, fw, N, C, eps);
	VA = { add ? x : NULL, add ? NULL : x, add ? t : NULL, out, w, ln ? b : NULL, ln ? m1 : NULL, r1, eps, N, C,
	    ln, nch };
	emu_launch(dim3((unsigned)((N + NORM_WARPS - 1) / NORM_WARPS)), dim3(NORM_WARPS * 32), run_vec, NULL);
	int same = memcmp(x, x2, n * 2) == 0;
	double worst = 0;
	size_t bad = norm_bad(out, ref, n, r1, rr, m1, rm, N, ln, &worst);
	cases++;
	if (bad || !same)
		fails++;
	printf("%s norm_vec<%d> N=%d C=%d ln=%d add=%d: x %s, max err vs CPU %.3g, %zu bad\n", bad || !same ? "FAIL" : "ok  ",
	    nch, N, C, ln, add, same ? "as the add" : "CHANGED", worst, bad);
	delete[] x; delete[] x2; delete[] t; delete[] w; delete[] b; delete[] out; delete[] fx; delete[] ft; delete[] fw;
	delete[] fb; delete[] xs; delete[] ref; delete[] m1; delete[] r1; delete[] rm; delete[] rr;
}

/* ---- gemv (matmul_fwd of a few rows) ------------------------------------------------ */
struct gemv_args {
	bf16 *out;
	const bf16 *inp, *w, *bias;
	int N, C, OC;
};
static gemv_args GA;

static void
run_gemv(void *)
{
	switch (GA.N) {
	case 1: k_gemv<1>(GA.out, GA.inp, GA.w, GA.bias, GA.C, GA.OC); break;
	case 2: k_gemv<2>(GA.out, GA.inp, GA.w, GA.bias, GA.C, GA.OC); break;
	case 3: k_gemv<3>(GA.out, GA.inp, GA.w, GA.bias, GA.C, GA.OC); break;
	default: k_gemv<4>(GA.out, GA.inp, GA.w, GA.bias, GA.C, GA.OC); break;
	}
}

static void
test_gemv(int N, int C, int OC, int bias)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	bf16 *x = new bf16[nx], *w = new bf16[nw], *b = new bf16[OC], *out = new bf16[no];
	float *fx = new float[nx], *fw = new float[nw], *fb = new float[OC], *ref = new float[no];
	fill_bf(&rs, x, fx, nx, -1, 1);
	fill_bf(&rs, w, fw, nw, -1, 1);
	fill_bf(&rs, b, fb, OC, -1, 1);
	for (size_t i = 0; i < no; i++)
		out[i].h = 0x7fc1;
	rl_cpu_matmul_fwd(NULL, ref, fx, fw, bias ? fb : NULL, N, C, OC);
	GA = { out, x, w, bias ? b : NULL, N, C, OC };
	emu_launch(dim3((unsigned)((OC + GV_WARPS - 1) / GV_WARPS)), dim3(GV_WARPS * 32), run_gemv, NULL);
	/* f32 sums of C products of values in [-1, 1] in another order, one bf16 rounding */
	double worst = 0;
	size_t first, bad = out_bad(out, ref, no, 1e-5 * C, 8e-3, &worst, &first);
	cases++;
	if (bad)
		fails++;
	printf("%s gemv N=%d C=%d OC=%d bias=%d: max err %.3g, %zu bad\n", bad ? "FAIL" : "ok  ", N, C, OC, bias, worst, bad);
	delete[] x; delete[] w; delete[] b; delete[] out; delete[] fx; delete[] fw; delete[] fb; delete[] ref;
}

/* ---- fuse.cu: matmul_fused_fwd's kernel ------------------------------------------------ */
struct fused_args {
	bf16 *out;
	const bf16 *x, *nw, *nb, *w, *bias;
	float eps;
	int N, C, OC, norm, ep;
	fu_qkv q;
};
static fused_args FA;

/* fu_ks_t > 1: k_fused_gemv_split with that many warps an output; fu_pf_t: k_fused_gemv's prefetch */
static int fu_ks_t = 1, fu_pf_t;
#define FGV(NR, NM, EP) do { if (fu_ks_t > 1) \
		k_fused_gemv_split<NR, NM, EP>(FA.out, FA.x, FA.nw, FA.nb, FA.eps, FA.norm == RL_NORM_LN, FA.w, FA.bias, \
		    FA.C, FA.OC, FA.q, fu_ks_t); \
	else if (fu_pf_t) \
		k_fused_gemv<NR, NM, EP, 1>(FA.out, FA.x, FA.nw, FA.nb, FA.eps, FA.norm == RL_NORM_LN, FA.w, FA.bias, FA.C, \
		    FA.OC, FA.q); \
	else \
		k_fused_gemv<NR, NM, EP>(FA.out, FA.x, FA.nw, FA.nb, FA.eps, FA.norm == RL_NORM_LN, FA.w, FA.bias, FA.C, \
		    FA.OC, FA.q); } while (0)
#define FGV_EP(NR, NM) switch (FA.ep) { case RL_EP_NONE: FGV(NR, NM, RL_EP_NONE); break; \
	case RL_EP_ADD: FGV(NR, NM, RL_EP_ADD); break; case RL_EP_GELU: FGV(NR, NM, RL_EP_GELU); break; \
	case RL_EP_SWIGLU: FGV(NR, NM, RL_EP_SWIGLU); break; default: FGV(NR, NM, FU_EP_QKV); break; }
#define FGV_NM(NR) if (FA.norm) { FGV_EP(NR, 1) } else { FGV_EP(NR, 0) }
static void
run_fused(void *)
{
	switch (FA.N) {  /* rlk_fused_gemv's dispatch */
	case 1: FGV_NM(1) break;
	case 2: FGV_NM(2) break;
	case 3: FGV_NM(3) break;
	default: FGV_NM(4) break;
	}
}

/* grid: blocks launched (0: one per FU_WARPS outputs; fewer: the warps take outputs in strides,
 * as fu_grid's cap makes them for the LM head) */
static void
test_fused(int N, int C, int OC, int norm, int ep, int bias, unsigned grid = 0)
{
	const int NO = ep == RL_EP_SWIGLU ? OC / 2 : OC, ln = norm == RL_NORM_LN;
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC, no = (size_t)N * NO;
	bf16 *x = new bf16[nx], *g = new bf16[C], *gb = new bf16[C], *w = new bf16[nw], *b = new bf16[OC];
	bf16 *out = new bf16[no], *out0 = new bf16[no], *xn = new bf16[nx], *y = new bf16[ny], *want = new bf16[no];
	float *fx = new float[nx], *fg = new float[C], *fgb = new float[C], *fw = new float[nw], *fb = new float[OC];
	float *fo = new float[no], *fxn = new float[nx], *fy = new float[ny], *ref = new float[no];
	float *st1 = new float[N], *st2 = new float[N], eps = ln ? 1e-5f : 1e-6f;
	fill_bf(&rs, x, fx, nx, -2, 2);
	fill_bf(&rs, g, fg, C, 0.5f, 1.5f);
	fill_bf(&rs, gb, fgb, C, -0.5f, 0.5f);
	/* weights ~ 1/sqrt(C): products of order 1 whatever C */
	float ws = 1.0f / sqrtf((float)C);
	fill_bf(&rs, w, fw, nw, -ws, ws);
	fill_bf(&rs, b, fb, OC, -0.5f, 0.5f);
	fill_bf(&rs, out0, fo, no, -2, 2);  /* the residual (RL_EP_ADD) */
	for (size_t i = 0; i < no; i++)
		out[i] = ep == RL_EP_ADD ? out0[i] : bf16{ 0x7fc1 };

	/* the separate kernels: k_norm_vec (C <= 4096) or the element-strided norm, k_gemv, then the
	 * epilogue as elementwise.cu computes it */
	const bf16 *in = x;
	int vec = C <= 4096;
	if (norm) {
		if (vec) {
			int k = (C + 255) / 256, nch = k <= 4 ? k : k <= 6 ? 6 : k <= 8 ? 8 : k <= 12 ? 12 : 16;
			VA = { NULL, x, NULL, xn, g, ln ? gb : NULL, ln ? st1 : NULL, st2, eps, N, C, ln, nch };
			emu_launch(dim3(1), dim3(NORM_WARPS * 32), run_vec, NULL);
		} else {
			NA = { x, xn, NULL, g, ln ? gb : NULL, ln ? st1 : NULL, st2, eps, N, C, ln };
			emu_launch(dim3(1), dim3(NORM_WARPS * 32), ln ? run_ln : run_rms, NULL);
		}
		in = xn;
	}
	GA = { y, in, w, bias ? b : NULL, N, C, OC };
	emu_launch(dim3((unsigned)((OC + GV_WARPS - 1) / GV_WARPS)), dim3(GV_WARPS * 32), run_gemv, NULL);
	for (int m = 0; m < N; m++)
		for (int j = 0; j < NO; j++) {
			float v = __bfloat162float(y[(size_t)m * OC + j]);
			size_t i = (size_t)m * NO + j;
			if (ep == RL_EP_NONE) {
				want[i] = y[i];
			} else if (ep == RL_EP_ADD) {
				want[i] = __float2bfloat16(__bfloat162float(out0[i]) + v);
			} else if (ep == RL_EP_GELU) {
				float t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
				want[i] = __float2bfloat16(0.5f * v * (1.0f + t));
			} else {
				float u = __bfloat162float(y[(size_t)m * OC + NO + j]);
				want[i] = __float2bfloat16(v / (1.0f + expf(-v)) * u);
			}
		}

	FA = { out, x, g, ln ? gb : NULL, w, bias ? b : NULL, eps, N, C, OC, norm, ep, {} };
	emu_launch(dim3(grid ? grid : (unsigned)(((long)NO * fu_ks_t + FU_WARPS - 1) / FU_WARPS)), dim3(FU_WARPS * 32),
	    run_fused, NULL);

	/* the CPU ops composed, f32 throughout (the GPU rounds the normalised rows and y to bf16) */
	const float *fin = fx;
	if (norm == RL_NORM_LN)
		rl_cpu_layernorm_fwd(NULL, fxn, st1, st2, fx, fg, fgb, N, C, eps);
	else if (norm == RL_NORM_RMS)
		rl_cpu_rmsnorm_fwd(NULL, fxn, st2, fx, fg, N, C, eps);
	if (norm)
		fin = fxn;
	rl_cpu_matmul_fwd(NULL, fy, fin, fw, bias ? fb : NULL, N, C, OC);
	if (ep == RL_EP_NONE)
		memcpy(ref, fy, no * 4);
	else if (ep == RL_EP_ADD)
		rl_cpu_add(NULL, ref, fo, fy, no);
	else if (ep == RL_EP_GELU)
		rl_cpu_gelu_fwd(NULL, ref, fy, no);
	else
		rl_cpu_swiglu_fwd(NULL, ref, fy, N, NO);
	/* y of order 1: the bf16 roundings of the normalised rows (random, ~2^-9 |x w| each, summed
	 * over C), of y and of the output, each at most 2^-9 relative; GELU's and SwiGLU's slopes
	 * about 1 */
	double worst = 0;
	size_t first = 0, bad = out_bad(out, ref, no, 1e-2, 1.6e-2, &worst, &first);
	int same = memcmp(out, want, no * 2) == 0;
	/* the element-strided norm sums in another order, and rows split over warps (fu_ks_t > 1)
	 * add the parts' sums: the bits may differ there (the prefetch sums as k_gemv does) */
	int must_same = (!norm || vec) && fu_ks_t == 1;
	cases++;
	if (bad || (must_same && !same))
		fails++;
	static const char *nn[] = { "none", "rms", "ln" }, *en[] = { "none", "add", "gelu", "swiglu" };
	printf("%s fused_gemv%s N=%d C=%d OC=%d norm=%s ep=%s bias=%d grid=%u ks=%d: same bits as the separate kernels: "
	    "%s, max err vs CPU %.3g, %zu bad\n", bad || (must_same && !same) ? "FAIL" : "ok  ", fu_pf_t ? " (prefetch)" : "",
	    N, C, OC, nn[norm], en[ep], bias, grid, fu_ks_t, same ? "yes" : must_same ? "NO" : fu_ks_t > 1 ? "no (split rows)" :
	    "no (other norm kernel)", worst, bad);
	if (bad)
		printf("     first bad: %zu: %g against %g\n", first, __bfloat162float(out[first]), ref[first]);
	delete[] x; delete[] g; delete[] gb; delete[] w; delete[] b; delete[] out; delete[] out0; delete[] xn;
	delete[] y; delete[] want; delete[] fx; delete[] fg; delete[] fgb; delete[] fw; delete[] fb; delete[] fo;
	delete[] fxn; delete[] fy; delete[] ref; delete[] st1; delete[] st2;
}

/* ---- fuse.cu: rope_kv_write's kernel ------------------------------------------------------ */
struct ropekv_args {
	bf16 *kc, *vc, *qkv;
	const int32_t *pos, *slot;
	int N, NH, NKV, HD;
	rl_rope rope;
};
static ropekv_args RK;
/* Llama 3.1's scaling: at HD 64 and 128 some frequencies in each of its three regions */
static const rl_rope rope_l3 = { 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f };
static void run_rope_kv(void *) { k_rope_kv(RK.kc, RK.vc, RK.qkv, RK.pos, RK.slot, RK.N, RK.NH, RK.NKV, RK.HD, RK.rope); }
static void run_rope(void *) { k_rope(RK.qkv, RK.pos, RK.N, RK.NH, RK.NKV, RK.HD, RK.rope, 1.0f); }
static void run_kv(void *) { k_kv_write(RK.kc, RK.vc, RK.qkv, RK.slot, RK.N, RK.NH, RK.NKV, RK.HD); }

static void
test_rope_kv(int N, int NH, int NKV, int HD, rl_rope rope, int nslot)
{
	const int W = (NH + 2 * NKV) * HD;
	size_t n = (size_t)N * W, nc = (size_t)nslot * NKV * HD;
	bf16 *q1 = new bf16[n], *q2 = new bf16[n], *k1 = new bf16[nc], *v1 = new bf16[nc], *k2 = new bf16[nc];
	bf16 *v2 = new bf16[nc];
	float *fq = new float[n], *kr = new float[nc], *vr = new float[nc];
	int32_t *pos = new int32_t[N], *slot = new int32_t[N];
	fill_bf(&rs, q1, fq, n, -2, 2);
	memcpy(q2, q1, n * 2);
	for (size_t i = 0; i < nc; i++) {
		k1[i].h = v1[i].h = k2[i].h = v2[i].h = 0x7fc1;
		kr[i] = vr[i] = NAN;
	}
	/* distinct slots in a random order, the last row skipped (slot -1) when N > 1 */
	for (int r = 0; r < N; r++) {
		pos[r] = (int)(emu_rnd(&rs) % 4096);
		slot[r] = r == N - 1 && N > 1 ? -1 : (int)((r * 7 + 3) % nslot);
	}
	RK = { k1, v1, q1, pos, slot, N, NH, NKV, HD, rope };
	emu_launch(dim3((unsigned)((n / 2 + 255) / 256)), dim3(256), run_rope_kv, NULL);
	RK = { k2, v2, q2, pos, slot, N, NH, NKV, HD, rope };
	if (rope.theta > 0)
		emu_launch(dim3((unsigned)((n / 2 + 255) / 256)), dim3(256), run_rope, NULL);
	emu_launch(dim3((unsigned)((n + 255) / 256)), dim3(256), run_kv, NULL);
	int same = memcmp(q1, q2, n * 2) == 0 && memcmp(k1, k2, nc * 2) == 0 && memcmp(v1, v2, nc * 2) == 0;
	/* the CPU: rope_fwd (sin/cos of angles up to 4096: a few f32 ulps of the angle), kv_write */
	if (rope.theta > 0)
		rl_cpu_rope_fwd(NULL, fq, pos, N, NH, NKV, HD, rope);
	rl_cpu_kv_write(NULL, kr, vr, fq, slot, N, NH, NKV, HD);
	double worst = 0;
	size_t first, bad = out_bad(q1, fq, n, 8e-3, 8e-3, &worst, &first);
	for (size_t i = 0; i < nc; i++) {
		/* unwritten slots stay poisoned on both sides */
		int kp = k1[i].h == 0x7fc1, vp = v1[i].h == 0x7fc1;
		if (kp != (kr[i] != kr[i]) || vp != (vr[i] != vr[i]))
			bad++;
		else if (!kp && (fabs(__bfloat162float(k1[i]) - kr[i]) > 8e-3 + 8e-3 * fabs(kr[i]) ||
		    __bfloat162float(v1[i]) != vr[i]))
			bad++;
	}
	cases++;
	if (bad || !same)
		fails++;
	printf("%s rope_kv N=%d NH=%d NKV=%d HD=%d theta=%g factor=%g: same bits as rope + kv_write: %s, max err vs "
	    "CPU %.3g, %zu bad\n", bad || !same ? "FAIL" : "ok  ", N, NH, NKV, HD, rope.theta, rope.factor,
	    same ? "yes" : "NO", worst, bad);
	delete[] q1; delete[] q2; delete[] k1; delete[] v1; delete[] k2; delete[] v2; delete[] fq; delete[] kr;
	delete[] vr; delete[] pos; delete[] slot;
}

/* the QKV epilogue (matmul_rope_kv_fwd): the same bits as k_fused_gemv without it, then k_rope_kv
 * (each checked against the CPU above); the cache's other slots left poisoned */
static void
test_fused_qkv(int N, int C, int NH, int NKV, int HD, int norm, rl_rope rope, int bias, unsigned grid = 0)
{
	const int OC = (NH + 2 * NKV) * HD, nslot = N + 2, ln = norm == RL_NORM_LN;
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC, nc = (size_t)nslot * NKV * HD;
	bf16 *x = new bf16[nx], *g = new bf16[C], *gb = new bf16[C], *w = new bf16[nw], *b = new bf16[OC];
	bf16 *y1 = new bf16[ny], *y2 = new bf16[ny], *k1 = new bf16[nc], *v1 = new bf16[nc], *k2 = new bf16[nc];
	bf16 *v2 = new bf16[nc];
	float *fx = new float[nx], *fg = new float[C], *fgb = new float[C], *fw = new float[nw], *fb = new float[OC];
	int32_t *pos = new int32_t[N], *slot = new int32_t[N];
	float ws = 1.0f / sqrtf((float)C), eps = ln ? 1e-5f : 1e-6f;
	fill_bf(&rs, x, fx, nx, -2, 2);
	fill_bf(&rs, g, fg, C, 0.5f, 1.5f);
	fill_bf(&rs, gb, fgb, C, -0.5f, 0.5f);
	fill_bf(&rs, w, fw, nw, -ws, ws);
	fill_bf(&rs, b, fb, OC, -0.5f, 0.5f);
	for (size_t i = 0; i < ny; i++)
		y1[i].h = y2[i].h = 0x7fc1;
	for (size_t i = 0; i < nc; i++)
		k1[i].h = v1[i].h = k2[i].h = v2[i].h = 0x7fc1;
	for (int r = 0; r < N; r++) {
		pos[r] = (int)(emu_rnd(&rs) % 4096);
		slot[r] = r == 1 ? -1 : nslot - 1 - r;  /* distinct, row 1 skipped */
	}
	unsigned gp = (unsigned)(((long)OC / 2 * fu_ks_t + FU_WARPS - 1) / FU_WARPS);
	unsigned gf = (unsigned)(((long)OC * fu_ks_t + FU_WARPS - 1) / FU_WARPS);
	FA = { y1, x, g, ln ? gb : NULL, w, bias ? b : NULL, eps, N, C, OC, norm, FU_EP_QKV,
	    { k1, v1, pos, slot, NH, NKV, HD, rope } };
	emu_launch(dim3(grid ? grid : gp), dim3(FU_WARPS * 32), run_fused, NULL);
	FA = { y2, x, g, ln ? gb : NULL, w, bias ? b : NULL, eps, N, C, OC, norm, RL_EP_NONE, {} };
	emu_launch(dim3(gf), dim3(FU_WARPS * 32), run_fused, NULL);
	RK = { k2, v2, y2, pos, slot, N, NH, NKV, HD, rope };
	emu_launch(dim3((unsigned)((ny / 2 + 255) / 256)), dim3(256), run_rope_kv, NULL);
	int same = memcmp(y1, y2, ny * 2) == 0 && memcmp(k1, k2, nc * 2) == 0 && memcmp(v1, v2, nc * 2) == 0;
	size_t written = 0;
	for (size_t i = 0; i < nc; i++)
		written += k1[i].h != 0x7fc1;
	/* rows with a slot wrote NKV * HD values each (values equal to the poison pattern aside) */
	int nw_rows = N - (N > 1);
	int ok = same && written == (size_t)nw_rows * NKV * HD;
	cases++;
	if (!ok)
		fails++;
	printf("%s fused_qkv N=%d C=%d NH=%d NKV=%d HD=%d norm=%d theta=%g factor=%g bias=%d ks=%d: same bits as "
	    "fused gemv + rope_kv: %s, %zu cache values written\n", ok ? "ok  " : "FAIL", N, C, NH, NKV, HD, norm,
	    rope.theta, rope.factor, bias,
	    fu_ks_t, same ? "yes" : "NO", written);
	delete[] x; delete[] g; delete[] gb; delete[] w; delete[] b; delete[] y1; delete[] y2; delete[] k1;
	delete[] v1; delete[] k2; delete[] v2; delete[] fx; delete[] fg; delete[] fgb; delete[] fw; delete[] fb;
	delete[] pos; delete[] slot;
}

int
main(void)
{
	/* nsplit 1 (many sequences), 2, 3, 7, 44 and 64 (B = 1 on an H100: 64); G 1, 2, 7, 8;
	 * each kernel: k_decode_split (key per warp), k_decode_lane (key per lane), then
	 * k_decode_wide (its splits by context: a round of 512 or 256 keys each) */
	for (lane_kernel = 0; lane_kernel < 3; lane_kernel++) {
	test_decode(3, 4, 4, 64, 16, 8, 1, 1);
	test_decode(6, 4, 4, 64, 16, 8, 1, 1);
	test_decode(6, 8, 4, 128, 8, 6, 2, 1);
	test_decode(6, 14, 2, 64, 16, 5, 3, 1);
	test_decode(2, 16, 2, 128, 16, 6, 7, 0);
	test_decode(6, 8, 1, 64, 4, 50, 7, 1);
	test_decode(3, 14, 2, 64, 16, 12, 44, 1);
	test_decode(1, 14, 2, 64, 16, 40, 64, 0);
	test_decode(1, 8, 1, 128, 1, 1, 64, 0);  /* context 1, 63 empty splits */
	test_decode(6, 2, 2, 128, 32, 70, 64, 1);  /* longer than one round of 8 x 256 workers */
	test_decode(3, 14, 2, 64, 16, 32, 32, 1);  /* Qwen 0.5B's heads with 32 splits: 1, 512 keys, ... */
	test_decode(1, 14, 2, 64, 16, 24, 32, 0);  /* the same at one slot (twice) */
	test_decode(1, 12, 12, 64, 16, 24, 22, 0); /* GPT-2 at one slot (22 splits) */
	/* random shapes (fixed seed): G 1-8, NKV 1-4, block sizes 1-32, nsplit 1-70 */
	for (int i = 0; i < 24; i++) {
		int G = 1 + (int)(emu_rnd(&rs) % 8), NKV = 1 + (int)(emu_rnd(&rs) % 4), HD = emu_rnd(&rs) % 2 ? 64 : 128;
		int bsz[] = { 1, 2, 4, 8, 16, 32 };
		test_decode(1 + (int)(emu_rnd(&rs) % 5), G * NKV, NKV, HD, bsz[emu_rnd(&rs) % 6], 1 + (int)(emu_rnd(&rs) % 12),
		    1 + (int)(emu_rnd(&rs) % 70), (int)(emu_rnd(&rs) % 2));
	}
	}
	/* splits by context (min_keys): several sequences of different lengths taking different
	 * numbers of the splits (the partials' stride stays nsplit), the three kernels */
	for (lane_kernel = 0; lane_kernel < 3; lane_kernel++) {
		min_keys = 64;
		test_decode(3, 14, 2, 64, 16, 32, 32, 0);
		min_keys = 32;
		test_decode(1, 12, 12, 64, 16, 24, 22, 0);
		min_keys = 128;
		test_decode(6, 2, 2, 128, 32, 70, 44, 1);
	}
	min_keys = 0;
	/* k_decode_lane: more than one 32-key round per worker with nsplit 1 and 2 */
	lane_kernel = 1;
	test_decode(2, 14, 2, 64, 16, 20, 1, 1);
	test_decode(3, 8, 8, 128, 8, 40, 2, 1);
	/* k_decode_wide: more than one round of its block in one split (nsplit 1: blocks of
	 * DW_SMALL warps, 128 keys a round); Qwen 0.5B's and GPT-2's heads at one slot past a
	 * round of 512 keys (two and three splits taken of 32 and 22) */
	lane_kernel = 2;
	test_decode(2, 14, 2, 64, 16, 70, 1, 1);
	test_decode(2, 16, 2, 128, 16, 40, 1, 0);
	test_decode(1, 14, 2, 64, 32, 40, 32, 0);
	test_decode(1, 12, 12, 64, 16, 90, 22, 0);
	/* its block size forced (RL_CUDA_DECODE_WIDE_WARPS): 8 and 4 warps with few sequences, 16
	 * with many (and 16 at HD 128: 8) */
	for (int i = 0; i < 3; i++) {
		wide_nw = i == 0 ? 8 : i == 1 ? 4 : 16;
		test_decode(1, 14, 2, 64, 16, 24, 32, 0);
		test_decode(1, 12, 12, 64, 16, 40, 22, 1);
		test_decode(3, 8, 2, 128, 16, 30, i == 2 ? 1 : 8, 1);
	}
	wide_nw = 0;
	/* the separate merge kernel (RL_CUDA_DECODE_MERGE=0, or more than DC_MAXSPLIT splits):
	 * 2, 7, 32, 64 and 70 splits (both kernels write the partials in dc_finish) */
	sep_merge = 1;
	lane_kernel = 0;
	test_decode(6, 8, 4, 128, 8, 6, 2, 1);
	test_decode(2, 16, 2, 128, 16, 6, 7, 0);
	test_decode(1, 14, 2, 64, 16, 12, 32, 0);
	test_decode(1, 14, 2, 64, 16, 12, 64, 0);
	lane_kernel = 1;
	test_decode(1, 8, 1, 64, 16, 10, 70, 0);
	lane_kernel = 2;
	test_decode(2, 14, 2, 64, 16, 70, 3, 1);
	sep_merge = 0;
	test_add_norm(1, 7, 1);
	test_add_norm(9, 33, 1);
	test_add_norm(17, 768, 1);
	test_add_norm(3, 4099, 1);
	test_add_norm(1, 896, 0);
	test_add_norm(11, 130, 0);
	/* k_norm_vec: 1, 3 (GPT-2's 768), 4 (Qwen's 896: half a chunk row), 6, 8, 12, 16 chunks */
	test_norm_vec(1, 8, 1, 1);
	test_norm_vec(9, 768, 1, 1);
	test_norm_vec(3, 768, 1, 0);
	test_norm_vec(17, 896, 0, 1);
	test_norm_vec(2, 896, 0, 0);
	test_norm_vec(5, 1536, 1, 1);
	test_norm_vec(2, 2048, 0, 1);
	test_norm_vec(2, 2824, 1, 0);
	test_norm_vec(1, 4096, 0, 1);
	/* gemv: 1-4 rows; C of 8 (one chunk), GPT-2's 768 and 3072, Qwen's 4864 (chunks past one
	 * round of 8 per lane), 8192; OC not a multiple of the 8 warps (the LM head's odd V) */
	test_gemv(1, 8, 5, 1);
	test_gemv(1, 768, 2304, 1);
	test_gemv(2, 3072, 77, 1);
	test_gemv(3, 4864, 40, 0);
	test_gemv(4, 896, 1155, 1);
	test_gemv(1, 8192, 9, 0);
	/* fuse.cu: GPT-2's layer (LayerNorm + c_attn, c_proj + residual, LayerNorm + c_fc + GELU,
	 * mlp c_proj + residual), Qwen's (RMSNorm + qkv, SwiGLU with a narrower H, down +
	 * residual), the head's shape with an odd OC, one chunk, C past k_norm_vec's 4096 (another
	 * norm kernel: tolerance only) and 8192, the most shared memory (4 x 6144) */
	test_fused(1, 768, 2304, RL_NORM_LN, RL_EP_NONE, 1);
	test_fused(1, 768, 768, RL_NORM_NONE, RL_EP_ADD, 1);
	test_fused(2, 768, 3072, RL_NORM_LN, RL_EP_GELU, 1);
	test_fused(3, 3072, 768, RL_NORM_NONE, RL_EP_ADD, 1);
	test_fused(1, 896, 1152, RL_NORM_RMS, RL_EP_NONE, 1);
	test_fused(4, 896, 1200, RL_NORM_RMS, RL_EP_SWIGLU, 0);
	test_fused(2, 4864, 896, RL_NORM_NONE, RL_EP_ADD, 0);
	test_fused(1, 128, 1001, RL_NORM_LN, RL_EP_NONE, 0);
	test_fused(3, 8, 6, RL_NORM_LN, RL_EP_SWIGLU, 1);
	test_fused(2, 64, 77, RL_NORM_NONE, RL_EP_GELU, 0);
	test_fused(1, 200, 13, RL_NORM_RMS, RL_EP_ADD, 1);
	test_fused(2, 4104, 33, RL_NORM_LN, RL_EP_NONE, 1);
	test_fused(1, 8192, 9, RL_NORM_RMS, RL_EP_GELU, 1);
	test_fused(4, 6144, 7, RL_NORM_LN, RL_EP_ADD, 1);
	/* fewer blocks than outputs / 8: strides over the outputs (3 blocks for 1001 outputs: 41 or
	 * 42 a warp, some warps one fewer; 2 blocks for SwiGLU's 600; 1 block of QKV pairs) */
	test_fused(1, 128, 1001, RL_NORM_LN, RL_EP_NONE, 0, 3);
	test_fused(2, 896, 1200, RL_NORM_RMS, RL_EP_SWIGLU, 1, 2);
	test_fused(3, 64, 77, RL_NORM_NONE, RL_EP_ADD, 1, 4);
	/* rope_kv_write: Qwen's heads, GPT-2's (no RoPE: kv_write alone), HD 8, one row */
	test_rope_kv(4, 14, 2, 64, rl_rope{ 1e6f }, 40);
	test_rope_kv(3, 12, 12, 64, rl_rope{ 0.0f }, 16);
	test_rope_kv(1, 2, 1, 8, rl_rope{ 1e4f }, 3);
	test_rope_kv(37, 8, 4, 128, rl_rope{ 1e4f }, 64);
	test_rope_kv(29, 8, 2, 128, rope_l3, 40);
	test_rope_kv(5, 6, 2, 64, rope_l3, 9);
	/* the QKV epilogue: Qwen2.5-0.5B's heads (14 + 2 + 2 of 64), GPT-2's (no RoPE), HD 128 and 8 */
	test_fused_qkv(1, 896, 14, 2, 64, RL_NORM_RMS, rl_rope{ 1e6f }, 1);
	test_fused_qkv(3, 896, 14, 2, 64, RL_NORM_RMS, rl_rope{ 1e4f }, 1);
	test_fused_qkv(2, 768, 12, 12, 64, RL_NORM_LN, rl_rope{ 0.0f }, 1);
	test_fused_qkv(4, 256, 4, 2, 128, RL_NORM_NONE, rl_rope{ 1e4f }, 0);
	test_fused_qkv(2, 64, 2, 1, 8, RL_NORM_LN, rl_rope{ 1e4f }, 0);
	test_fused_qkv(3, 896, 14, 2, 64, RL_NORM_RMS, rl_rope{ 1e6f }, 1, 1);
	test_fused_qkv(2, 512, 4, 2, 128, RL_NORM_RMS, rope_l3, 0);
	test_fused_qkv(4, 256, 6, 2, 64, RL_NORM_RMS, rope_l3, 1);
	/* rows split over 2, 4 or 8 warps (k_fused_gemv_split, RL_CUDA_GEMV_SPLIT): GPT-2's o and
	 * proj and Qwen's down (+ residual), GELU and SwiGLU with a norm, one chunk and 25 (warps
	 * whose part is empty), C 8192; the QKV epilogue: the same bits as the split product + k_rope_kv */
	fu_ks_t = 4;
	test_fused(1, 768, 768, RL_NORM_NONE, RL_EP_ADD, 1);
	test_fused(1, 3072, 768, RL_NORM_NONE, RL_EP_ADD, 1);
	test_fused(4, 4864, 896, RL_NORM_NONE, RL_EP_ADD, 0);
	test_fused_qkv(1, 896, 14, 2, 64, RL_NORM_RMS, rl_rope{ 1e6f }, 1);
	test_fused_qkv(2, 768, 12, 12, 64, RL_NORM_LN, rl_rope{ 0.0f }, 1);
	fu_ks_t = 2;
	test_fused(2, 768, 3072, RL_NORM_LN, RL_EP_GELU, 1);
	test_fused(3, 896, 1200, RL_NORM_RMS, RL_EP_SWIGLU, 0);
	test_fused_qkv(2, 64, 2, 1, 8, RL_NORM_LN, rl_rope{ 1e4f }, 0);
	fu_ks_t = 8;
	test_fused(1, 8, 6, RL_NORM_LN, RL_EP_SWIGLU, 1);
	test_fused(2, 200, 13, RL_NORM_RMS, RL_EP_ADD, 1);
	test_fused(1, 8192, 9, RL_NORM_RMS, RL_EP_GELU, 1);
	fu_ks_t = 1;
	/* the prefetch (k_fused_gemv's PF, RL_CUDA_GEMV_PF): the same bits as the separate kernels;
	 * the head's strides (3 blocks for 1001 outputs), rows of 2 and 3 rounds, SwiGLU in strides */
	fu_pf_t = 1;
	test_fused(1, 128, 1001, RL_NORM_LN, RL_EP_NONE, 0, 3);
	test_fused(3, 3072, 768, RL_NORM_NONE, RL_EP_ADD, 1);
	test_fused(2, 4864, 896, RL_NORM_NONE, RL_EP_ADD, 0);
	test_fused(2, 896, 1200, RL_NORM_RMS, RL_EP_SWIGLU, 1, 2);
	test_fused(2, 768, 3072, RL_NORM_LN, RL_EP_GELU, 1, 5);     /* every product (RL_CUDA_GEMV_PF=2): */
	test_fused_qkv(3, 896, 14, 2, 64, RL_NORM_RMS, rl_rope{ 1e6f }, 1, 7); /* grids of fewer blocks than outputs */
	fu_pf_t = 0;
	printf("emu_kernels: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

/*
 * emu_flash2.cpp — the kernels of kernels/flash2.cu (cut out unchanged by run.sh)
 * run on the CPU through cuda_emu.h, with mma.sync m16n8k16 and ldmatrix (.trans)
 * emulated lane by lane as the PTX ISA defines them (cp.async done at the latest moment
 * its wait_group allows), against the CPU reference
 * (rl_cpu_attn_fwd / rl_cpu_attn_bwd of lib/compute/ops_cpu.c).
 *
 * Cases: T = 1, T not a multiple of the 64-row blocks or of the 32-row inner tiles
 * of HD 128, exact multiples, B > 1, GQA group sizes 1, 2, 4, 7, packed segments,
 * trailing padding, leading padding, HD 64 and 128.  Outputs, lse, the D scratch,
 * dqkv and every block's dynamic shared memory are poisoned with NaN first.
 *
 * Tolerances (test_cuda_ops's for attention, where they are justified): out within
 * 1e-2 max|ref| + 1.6e-2 |ref| (P rounded to bf16 before P V, bf16 output); lse
 * within 1e-4 + 1e-4 |ref| (f32 throughout); dqkv within 2e-2 max|ref| + 3e-2 |ref|
 * (P and dS rounded to bf16 for the mma products, bf16 output); and a normalised
 * MSE bound, sum (x - ref)^2 / sum ref^2, of 1e-4 for out and 4e-4 for dqkv (bf16
 * rounding alone gives about 1e-5).  Padding queries: out, lse and dq exactly 0.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops_cpu.h"
}

/* the primitives flash2.cu writes in inline PTX */
static inline void f2_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) { emu_mma_m16n8k16_bf16(d, a, b0, b1); }
static inline void f2_ldsm_x4(uint32_t *r, const bf16 *p) { emu_ldmatrix_x4(r, p, 0); }
static inline void f2_ldsm_x4_t(uint32_t *r, const bf16 *p) { emu_ldmatrix_x4(r, p, 1); }
static inline void f2_cp16(bf16 *dst, const bf16 *src) { emu_cp_async16(dst, src); }
static inline void f2_cp_commit(void) { emu_cp_commit(); }
static inline void f2_cp_wait(int n) { emu_cp_wait(n); }
static inline void f2_red2(float *p, float a, float b) { atomicAdd(p, a); atomicAdd(p + 1, b); }
#define F2_SMEM(name, bytes) unsigned char *name = emu_dyn_smem(bytes)

#include "flash2.inc"

static int fails, cases;
static uint64_t rs = 0x2545f4914f6cdd1dull;  /* emu_rnd, frnd, fill_bf: cuda_emu.h */

struct f2_args {
	bf16 *out, *qkv, *dout, *dqkv;
	float *lse, *ws, *part, *dqacc;
	int32_t *seg;
	int B, T, NH, NKV, HD, hper;
	size_t n;
};
static f2_args FA;

static void
run_fwd(void *)
{
	float sl2 = F2_LOG2E / sqrtf((float)FA.HD);
	if (FA.HD == 64)
		k_f2_fwd<64>(FA.out, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, sl2);
	else
		k_f2_fwd<128>(FA.out, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, sl2);
}

static void
run_dq(void *)
{
	float sc = 1.0f / sqrtf((float)FA.HD);
	if (FA.HD == 64)
		k_f2_bwd_dq<64>(FA.dqkv, FA.ws, FA.dout, FA.out, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, F2_LOG2E * sc, sc);
	else
		k_f2_bwd_dq<128>(FA.dqkv, FA.ws, FA.dout, FA.out, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, F2_LOG2E * sc, sc);
}

static void
run_dkv(void *)
{
	float sc = 1.0f / sqrtf((float)FA.HD);
	if (FA.HD == 64)
		k_f2_bwd_dkv<64>(FA.dqkv, FA.part, FA.ws, FA.dout, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, FA.hper,
		    F2_LOG2E * sc, sc);
	else
		k_f2_bwd_dkv<128>(FA.dqkv, FA.part, FA.ws, FA.dout, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH, FA.NKV, FA.hper,
		    F2_LOG2E * sc, sc);
}

static void
run_prep(void *)
{
	k_f2_bwd_prep(FA.ws, FA.dqacc, FA.dout, FA.out, FA.B * FA.T * FA.NH, FA.T, FA.NH, FA.HD);
}

static int fused_bm;  /* the fused backward's query tile at HD 64: 64 or 32 */

static void
run_fused(void *)
{
	float sc = 1.0f / sqrtf((float)FA.HD);
	if (FA.HD == 64 && fused_bm == 32)
		k_f2_bwd_fused<64, 32, 1>(FA.dqkv, FA.part, FA.dqacc, FA.ws, FA.dout, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH,
		    FA.NKV, FA.hper, F2_LOG2E * sc, sc);
	else if (FA.HD == 64)
		k_f2_bwd_fused<64, 64, 1>(FA.dqkv, FA.part, FA.dqacc, FA.ws, FA.dout, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH,
		    FA.NKV, FA.hper, F2_LOG2E * sc, sc);
	else
		k_f2_bwd_fused<128, 32, 1>(FA.dqkv, FA.part, FA.dqacc, FA.ws, FA.dout, FA.lse, FA.qkv, FA.seg, FA.T, FA.NH,
		    FA.NKV, FA.hper, F2_LOG2E * sc, sc);
}

static void
run_cast(void *)
{
	k_f2_dq_cast(FA.dqkv, FA.dqacc, (size_t)FA.B * FA.T * FA.NH * FA.HD / 4, FA.NH, FA.NKV, FA.HD);
}

static void
run_sum(void *)
{
	k_f2_dkv_sum(FA.dqkv, FA.part, FA.n, FA.NH, FA.NKV, FA.HD, FA.NH / FA.NKV / FA.hper);
}

/* a (n) emulator values against ref: count outside atol + rtol |ref|, NMSE; extra: exact-zero
 * positions (zmask[i] set) must be 0 */
static int
cmp(const char *what, const char *name, const bf16 *gb, const float *gf, const float *ref, size_t n, double atol,
    double rtol, double nmse_max, const unsigned char *zmask)
{
	double worst = 0, se = 0, sr = 0;
	size_t bad = 0, at = 0;
	for (size_t i = 0; i < n; i++) {
		double g = gb ? __bfloat162float(gb[i]) : gf[i], e = fabs(g - ref[i]);
		int ok = e <= atol + rtol * fabs(ref[i]);
		if (zmask && zmask[i])
			ok = g == 0.0;
		if (!ok) {
			if (!bad)
				at = i;
			bad++;
		}
		if (!(e <= worst))
			worst = e;
		se += (g - ref[i]) * (g - ref[i]);
		sr += (double)ref[i] * ref[i];
	}
	double nmse = sr > 0 ? se / sr : se;
	int fail = bad || !(nmse <= nmse_max);
	printf("  %s %s: max err %.3g, nmse %.2g", what, fail ? "FAIL" : "ok", worst, nmse);
	if (bad)
		printf(", %zu bad, first at %zu: %g vs %g", bad, at, gb ? __bfloat162float(gb[at]) : gf[at], ref[at]);
	printf("\n");
	(void)name;
	return fail;
}

/* seg_mode 0: none; 1: packed (2-3 segments); 2: packed + trailing padding; 3: leading
 * padding, then packed.  hper: query heads per dK/dV block (0: the launcher's choice,
 * f2_hper, which splits every group here: these shapes have few blocks) */
static void
test_attn(int B, int T, int NH, int NKV, int HD, int seg_mode, int hper)
{
	int W = (NH + 2 * NKV) * HD;
	size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
	bf16 *qkv = new bf16[nq], *dout = new bf16[no], *out = new bf16[no], *dqkv = new bf16[nq];
	float *fq = new float[nq], *fdo = new float[no], *rout = new float[no], *rlse = new float[nl];
	float *rdq = new float[nq], *lse = new float[nl], *ws = new float[nl];
	unsigned char *zo = new unsigned char[no](), *zl = new unsigned char[nl](), *zq = new unsigned char[nq]();
	int32_t *seg = NULL;
	if (seg_mode) {
		seg = new int32_t[(size_t)B * T];
		for (int b = 0; b < B; b++) {
			int lead = seg_mode == 3 ? (int)(emu_rnd(&rs) % (uint32_t)(T / 3 + 1)) : 0;
			int cut1 = lead + (int)(emu_rnd(&rs) % (uint32_t)(T - lead + 1));
			int cut2 = cut1 + (int)(emu_rnd(&rs) % (uint32_t)(T - cut1 + 1));
			int pad = seg_mode == 2 ? T - (int)(emu_rnd(&rs) % (uint32_t)(T / 3 + 1)) : T;
			for (int t = 0; t < T; t++)
				seg[b * T + t] = t < lead || t >= pad ? -1 : t < cut1 ? 0 : t < cut2 ? 1 : 2;
		}
	}
	fill_bf(&rs, qkv, fq, nq, -2, 2);
	fill_bf(&rs, dout, fdo, no, -1, 1);
	for (size_t i = 0; i < no; i++)
		out[i].h = 0x7fc1;
	for (size_t i = 0; i < nq; i++)
		dqkv[i].h = 0x7fc1;
	for (size_t i = 0; i < nl; i++)
		lse[i] = ws[i] = NAN;
	/* padding queries: exact zeros expected */
	if (seg)
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++)
				if (seg[b * T + t] < 0) {
					for (int h = 0; h < NH; h++) {
						zl[((size_t)b * NH + h) * T + t] = 1;
						for (int d = 0; d < HD; d++) {
							zo[((size_t)b * T + t) * NH * HD + (size_t)h * HD + d] = 1;
							zq[((size_t)b * T + t) * W + (size_t)h * HD + d] = 1;
						}
					}
				}

	rl_cpu_attn_fwd(NULL, rout, rlse, fq, seg, B, T, NH, NKV, HD);
	rl_cpu_attn_bwd(NULL, rdq, fdo, rout, rlse, fq, seg, B, T, NH, NKV, HD);

	int G = NH / NKV;
	if (hper == 0)
		hper = f2_hper(B, T, NKV, G);
	int nch = G / hper;
	size_t n = (size_t)B * T * NKV * HD;
	float *part = nch > 1 ? new float[2 * nch * n] : NULL;
	for (size_t i = 0; part && i < 2 * nch * n; i++)
		part[i] = NAN;
	size_t nacc = (size_t)B * T * NH * HD;
	float *dqacc = new float[nacc];
	FA = { out, qkv, dout, dqkv, lse, ws, part, dqacc, seg, B, T, NH, NKV, HD, hper, n };
	unsigned nb = (unsigned)((T + F2_ROWS - 1) / F2_ROWS);
	emu_launch(dim3(nb, (unsigned)NH, (unsigned)B), dim3(F2_WARPS * 32), run_fwd, NULL);
	/* the backward from the emulated forward's out and lse, as a training step */
	emu_launch(dim3(nb, (unsigned)NH, (unsigned)B), dim3(F2_WARPS * 32), run_dq, NULL);
	emu_launch(dim3(nb, (unsigned)(NKV * nch), (unsigned)B), dim3(F2_WARPS * 32), run_dkv, NULL);
	if (part)
		emu_launch(dim3((unsigned)((n + 255) / 256 < 7 ? (n + 255) / 256 : 7)), dim3(256), run_sum, NULL);

	double mo = 0, mq = 0;
	for (size_t i = 0; i < no; i++)
		mo = fmax(mo, fabs(rout[i]));
	for (size_t i = 0; i < nq; i++)
		mq = fmax(mq, fabs(rdq[i]));
	printf("flash2 B=%d T=%d NH=%d NKV=%d HD=%d seg=%d, dK/dV: %d head(s) per block%s\n", B, T, NH, NKV, HD,
	    seg_mode, hper, nch > 1 ? " + k_f2_dkv_sum" : "");
	int f = 0;
	f |= cmp("out ", "", out, NULL, rout, no, 1e-2 * mo, 1.6e-2, 1e-4, zo);
	f |= cmp("lse ", "", NULL, lse, rlse, nl, 1e-4, 1e-4, 1e-8, zl);
	f |= cmp("dqkv", "", dqkv, NULL, rdq, nq, 2e-2 * mq, 3e-2, 4e-4, zq);
	cases++;
	if (f) {
		fails++;
		printf("FAIL flash2 B=%d T=%d NH=%d NKV=%d HD=%d seg=%d\n", B, T, NH, NKV, HD, seg_mode);
	}
	/* the fused backward (RL_CUDA_FLASH_BWD=fused, fused3: query tiles of 64 at HD 64, 32 at
	 * HD 128; fused32: 32 at HD 64): D and the zeroed f32 dQ accumulator by k_f2_bwd_prep,
	 * one pass for dK, dV and dQ (atomics), the dK/dV chunk sum, the cast; dqkv, D, the
	 * accumulator and the partials poisoned again */
	for (int bm = 64; bm >= 32; bm -= 32) {
		if (HD == 128 && bm == 64)
			continue;
		fused_bm = bm;
		for (size_t i = 0; i < nq; i++)
			dqkv[i].h = 0x7fc1;
		for (size_t i = 0; i < nl; i++)
			ws[i] = NAN;
		for (size_t i = 0; i < nacc; i++)
			dqacc[i] = NAN;
		for (size_t i = 0; part && i < 2 * nch * n; i++)
			part[i] = NAN;
		unsigned npb = 256 / (unsigned)(HD / 8), nr = (unsigned)(B * T * NH);
		emu_launch(dim3((nr + npb - 1) / npb < 5 ? (nr + npb - 1) / npb : 5), dim3(256), run_prep, NULL);
		emu_launch(dim3(nb, (unsigned)(NKV * nch), (unsigned)B), dim3(F2_WARPS * 32), run_fused, NULL);
		if (part)
			emu_launch(dim3((unsigned)((n + 255) / 256 < 7 ? (n + 255) / 256 : 7)), dim3(256), run_sum, NULL);
		emu_launch(dim3((unsigned)((nacc / 4 + 255) / 256 < 5 ? (nacc / 4 + 255) / 256 : 5)), dim3(256), run_cast,
		    NULL);
		printf("flash2 fused backward, %d-query tiles: B=%d T=%d NH=%d NKV=%d HD=%d seg=%d\n", bm, B, T, NH, NKV,
		    HD, seg_mode);
		f = cmp("dqkv", "", dqkv, NULL, rdq, nq, 2e-2 * mq, 3e-2, 4e-4, zq);
		cases++;
		if (f) {
			fails++;
			printf("FAIL flash2 fused backward (%d) B=%d T=%d NH=%d NKV=%d HD=%d seg=%d\n", bm, B, T, NH, NKV, HD,
			    seg_mode);
		}
	}
	delete[] dqacc;
	delete[] qkv; delete[] dout; delete[] out; delete[] dqkv; delete[] fq; delete[] fdo; delete[] rout;
	delete[] rlse; delete[] rdq; delete[] lse; delete[] ws; delete[] zo; delete[] zl; delete[] zq;
	delete[] seg;
	delete[] part;
}

/* ---- the emulated instructions against the PTX ISA's element formulas ------------------
 * One warp: A (16x16) and B (16x8) of small integers (exact in bf16 and f32) and C are
 * handed out by the ISA's per-element formulas for the .bf16 m16n8k16 fragments
 * (a_i, i = 0..7: row g for i in {0,1,4,5}, else g+8; column 2tq + (i & 1), + 8 for
 * i >= 4; b_i, i = 0..3: row 2tq + (i & 1), + 8 for i >= 2, column g; c_i: row g, + 8 for
 * i >= 2, column 2tq + (i & 1)); D must be A B + C element by element.  ldmatrix.x4 of
 * a 32x8 matrix M (matrix i = rows 8i..8i+7): lane l gets M[8i + l/4][2(l%4) + {0,1}],
 * with .trans M[8i + 2(l%4) + {0,1}][l/4]. */
static float SA[16][16], SB[16][8], SC[16][8], SD[16][8];
alignas(16) static uint16_t SM[32][8];
static int self_bad;

static uint32_t
pk(float lo, float hi)
{
	return (uint32_t)__float2bfloat16(lo).h | (uint32_t)__float2bfloat16(hi).h << 16;
}

static void
run_self(void *)
{
	int l = (int)threadIdx.x, g = l >> 2, tq = l & 3;
	float a[8], bb[4], d[4];
	for (int i = 0; i < 8; i++)
		a[i] = SA[g + ((i >> 1) & 1) * 8][2 * tq + (i & 1) + (i >= 4 ? 8 : 0)];
	for (int i = 0; i < 4; i++)
		bb[i] = SB[2 * tq + (i & 1) + (i >= 2 ? 8 : 0)][g];
	for (int i = 0; i < 4; i++)
		d[i] = SC[g + (i >= 2 ? 8 : 0)][2 * tq + (i & 1)];
	uint32_t ar[4] = { pk(a[0], a[1]), pk(a[2], a[3]), pk(a[4], a[5]), pk(a[6], a[7]) };
	f2_mma(d, ar, pk(bb[0], bb[1]), pk(bb[2], bb[3]));
	for (int i = 0; i < 4; i++)
		if (d[i] != SD[g + (i >= 2 ? 8 : 0)][2 * tq + (i & 1)])
			self_bad++;
	uint32_t r[4], rt[4];
	f2_ldsm_x4(r, (const bf16 *)SM[l]);
	f2_ldsm_x4_t(rt, (const bf16 *)SM[l]);
	for (int i = 0; i < 4; i++) {
		if (r[i] != ((uint32_t)SM[8 * i + l / 4][2 * (l % 4)] | (uint32_t)SM[8 * i + l / 4][2 * (l % 4) + 1] << 16))
			self_bad++;
		if (rt[i] != ((uint32_t)SM[8 * i + 2 * (l % 4)][l / 4] | (uint32_t)SM[8 * i + 2 * (l % 4) + 1][l / 4] << 16))
			self_bad++;
	}
}

static void
selftest(void)
{
	for (int r = 0; r < 16; r++)
		for (int k = 0; k < 16; k++)
			SA[r][k] = (float)((int)(emu_rnd(&rs) % 15) - 7);
	for (int k = 0; k < 16; k++)
		for (int c = 0; c < 8; c++)
			SB[k][c] = (float)((int)(emu_rnd(&rs) % 15) - 7);
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 8; c++) {
			SC[r][c] = (float)((int)(emu_rnd(&rs) % 101) - 50);
			float s = SC[r][c];
			for (int k = 0; k < 16; k++)
				s += SA[r][k] * SB[k][c];
			SD[r][c] = s;
		}
	for (int r = 0; r < 32; r++)
		for (int c = 0; c < 8; c++)
			SM[r][c] = (uint16_t)(r * 8 + c + 1);
	self_bad = 0;
	emu_launch(dim3(1), dim3(32), run_self, NULL);
	cases++;
	if (self_bad)
		fails++;
	printf("%s emulated mma.m16n8k16 and ldmatrix.x4 (.trans) against the ISA's element formulas: %d mismatches\n",
	    self_bad ? "FAIL" : "ok  ", self_bad);
}

int
main(int argc, char **argv)
{
	int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
	if (argc > 1 && strcmp(argv[1], "skew") == 0) {
		/* for RL_EMU_SKEW=1 (run.sh runs it so): three or more tiles in every pass, so a
		 * buffer is refilled while, without the barrier, a slower warp may still read it */
		test_attn(1, 200, 2, 1, 64, 2, 0);
		test_attn(1, 150, 2, 1, 128, 0, 2);
		printf("emu_flash2 (skew): %d of %d cases passed\n", cases - fails, cases);
		return fails ? 1 : 0;
	}
	selftest();
	test_attn(1, 1, 2, 1, 64, 0, 0);      /* T = 1 */
	test_attn(2, 37, 4, 2, 64, 1, 0);     /* B > 1, G = 2, packed, T < one block */
	test_attn(1, 100, 7, 1, 64, 2, 7);    /* G = 7 summed in registers, trailing padding */
	test_attn(2, 77, 4, 1, 128, 1, 2);    /* HD 128 (32-row inner tiles), G = 4 as 2 x 2 */
	test_attn(2, 64, 2, 1, 64, 0, 0);     /* exactly one block, no seg: the unmasked paths */
	if (!quick) {
		test_attn(1, 130, 2, 2, 64, 3, 0);    /* G = 1, leading padding, three blocks */
		test_attn(1, 129, 2, 1, 128, 2, 0);   /* HD 128, three blocks */
		test_attn(1, 200, 14, 2, 64, 0, 0);   /* Qwen-like group of 7 split 7 ways, no seg */
		test_attn(1, 150, 2, 2, 128, 3, 0);
	}
	printf("emu_flash2: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

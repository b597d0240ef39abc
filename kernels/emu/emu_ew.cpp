/*
 * emu_ew.cpp — the kernels of elementwise.cu (cut out by run.sh: ew.inc) run on the CPU
 * through cuda_emu.h:
 *   - the vec forms (16-byte loads, suffix 8) of cast, add, GELU, SwiGLU and RoPE
 *     against the element-wise forms, bit for bit (both call the same __device__ math,
 *     and here the same libm), and against the CPU reference of lib/compute/ops_cpu.c within a
 *     bf16 rounding; sizes that are not multiples of 8 (the tail), a grid smaller than
 *     the work (grid-stride loops), add in place, RoPE with head counts that are not a
 *     multiple of the heads a thread takes;
 *   - k_adamw_multi over a chunk table (segments of 1 element, crossing a chunk,
 *     starting unaligned right after the previous one, gaps) against k_adamw per
 *     segment, bit for bit, with the float4 path on and off; gaps untouched;
 *   - k_sumsq with float4 loads (a tail of 1 to 3) and without, against a double sum;
 *   - k_colsum8 (bias gradient, 16-byte loads) against a double sum, added (+=);
 *   - norm.cu's k_norm_bwd_vec (LayerNorm and RMSNorm backward with the row in registers)
 *     and the element-strided k_layernorm_bwd / k_rmsnorm_bwd, plain and accumulating
 *     (ACC: layernorm_bwd_add / rmsnorm_bwd_add, dx += ...), against the CPU reference with
 *     test_cuda_ops' tolerances: dw and db added (+=) to what they held, db NULL left alone,
 *     C from 7 to 4099, grids smaller than the rows; the ACC forms' dw, db bit for bit and
 *     dx's values those of the ACC 0 form over a dx of zeros.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include <stdarg.h>

#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops_cpu.h"
}
#include "kernels/launch.h"

#include "ew.inc"
#define NB_SMEM(name, bytes) float *name = (float *)emu_dyn_smem(bytes)
#include "normbwd.inc"

static int fails, cases;
static uint64_t rs = 0x2545f4914f6cdd1dull;

static void
report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void
report(int ok, const char *fmt, ...)
{
	va_list ap;
	cases++;
	if (!ok)
		fails++;
	printf("%s ", ok ? "ok  " : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* bf16 outputs against f32 references: within a bf16 rounding (+ atol); the count of misses */
static size_t
bad_bf(const bf16 *o, const float *ref, size_t n, double atol, double *worst)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs(__bfloat162float(o[i]) - ref[i]);
		if (!(e <= atol + 8e-3 * fabs(ref[i])))
			bad++;
		if (!(e <= *worst))
			*worst = e;
	}
	return bad;
}

static void
poison(bf16 *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i].h = 0x7fc1;
}

/* the launch: G blocks of 64 threads (a grid that may be smaller than the work) */
static dim3 EG, EB(64);
static void
grid_for(size_t units)
{
	size_t b = (units + 63) / 64;
	EG = dim3((unsigned)(b > 3 ? 3 : b < 1 ? 1 : b));
}

/* ---- cast, add, GELU ---------------------------------------------------------------- */
struct ew_args {
	bf16 *o, *a, *b;
	float *fo, *fa;
	size_t n;
	int vec;
};
static ew_args E;

static void run_f2b(void *) { if (E.vec) k_f32_to_bf168(E.o, E.fa, E.n); else k_f32_to_bf16(E.o, E.fa, E.n); }
static void run_b2f(void *) { if (E.vec) k_bf16_to_f328(E.fo, E.a, E.n); else k_bf16_to_f32(E.fo, E.a, E.n); }
static void run_add(void *) { if (E.vec) k_add8(E.o, E.a, E.b, E.n); else k_add(E.o, E.a, E.b, E.n); }
static void run_gf(void *) { if (E.vec) k_gelu_fwd8(E.o, E.a, E.n); else k_gelu_fwd(E.o, E.a, E.n); }
static void run_gb(void *) { if (E.vec) k_gelu_bwd8(E.o, E.b, E.a, E.n); else k_gelu_bwd(E.o, E.b, E.a, E.n); }

static void
test_ew(size_t n)
{
	bf16 *a = new bf16[n + 1], *b = new bf16[n + 1], *o1 = new bf16[n + 1], *o2 = new bf16[n + 1];
	bf16 *a2 = new bf16[n + 1];
	float *fa = new float[n + 1], *fb = new float[n + 1], *ref = new float[n + 1], *x = new float[n + 1];
	float *f1 = new float[n + 1], *f2 = new float[n + 1];
	fill_bf(&rs, a, fa, n, -4, 4);
	fill_bf(&rs, b, fb, n, -2, 2);
	for (size_t i = 0; i < n; i++)
		x[i] = frnd(&rs, -100, 100);

	/* cast both ways */
	poison(o1, n);
	poison(o2, n);
	E = { o1, NULL, NULL, NULL, x, n, 1 };
	grid_for(n / 8);
	emu_launch(EG, EB, run_f2b, NULL);
	E.o = o2;
	E.vec = 0;
	grid_for(n);
	emu_launch(EG, EB, run_f2b, NULL);
	int same = memcmp(o1, o2, n * 2) == 0, host = 1;
	for (size_t i = 0; i < n; i++)
		host &= o1[i].h == rl_f32_to_bf16(x[i]);
	report(same && host, "cast f32->bf16 n=%zu: vec %s, %s host rounding", n, same ? "same bits" : "DIFFERS",
	    host ? "equals" : "DIFFERS FROM");
	for (size_t i = 0; i < n; i++)
		f1[i] = f2[i] = NAN;
	E = { NULL, a, NULL, f1, NULL, n, 1 };
	grid_for(n / 8);
	emu_launch(EG, EB, run_b2f, NULL);
	E.fo = f2;
	E.vec = 0;
	grid_for(n);
	emu_launch(EG, EB, run_b2f, NULL);
	same = memcmp(f1, f2, n * 4) == 0 && memcmp(f1, fa, n * 4) == 0;
	report(same, "cast bf16->f32 n=%zu: vec %s", n, same ? "same bits, exact" : "DIFFERS");

	/* add, then add in place (out == a) */
	rl_cpu_add(NULL, ref, fa, fb, n);
	poison(o1, n);
	poison(o2, n);
	E = { o1, a, b, NULL, NULL, n, 1 };
	grid_for(n / 8);
	emu_launch(EG, EB, run_add, NULL);
	E.o = o2;
	E.vec = 0;
	grid_for(n);
	emu_launch(EG, EB, run_add, NULL);
	memcpy(a2, a, n * 2);
	E = { a2, a2, b, NULL, NULL, n, 1 };
	grid_for(n / 8);
	emu_launch(EG, EB, run_add, NULL);
	double worst = 0;
	size_t bad = bad_bf(o1, ref, n, 1e-6, &worst);
	same = memcmp(o1, o2, n * 2) == 0 && memcmp(o1, a2, n * 2) == 0;
	report(same && !bad, "add n=%zu: vec %s (in place too), max err vs CPU %.3g, %zu bad", n,
	    same ? "same bits" : "DIFFERS", worst, bad);

	/* GELU forward and backward */
	for (int bwd = 0; bwd < 2; bwd++) {
		if (bwd)
			rl_cpu_gelu_bwd(NULL, ref, fb, fa, n);
		else
			rl_cpu_gelu_fwd(NULL, ref, fa, n);
		poison(o1, n);
		poison(o2, n);
		E = { o1, a, b, NULL, NULL, n, 1 };
		grid_for(n / 8);
		emu_launch(EG, EB, bwd ? run_gb : run_gf, NULL);
		E.o = o2;
		E.vec = 0;
		grid_for(n);
		emu_launch(EG, EB, bwd ? run_gb : run_gf, NULL);
		worst = 0;
		bad = bad_bf(o1, ref, n, 1e-5, &worst);
		same = memcmp(o1, o2, n * 2) == 0;
		report(same && !bad, "gelu_%s n=%zu: vec %s, max err vs CPU %.3g, %zu bad", bwd ? "bwd" : "fwd", n,
		    same ? "same bits" : "DIFFERS", worst, bad);
	}
	delete[] a; delete[] b; delete[] o1; delete[] o2; delete[] a2; delete[] fa; delete[] fb; delete[] ref;
	delete[] x; delete[] f1; delete[] f2;
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */
struct sw_args {
	bf16 *o, *gu, *d;
	int N, H, vec;
};
static sw_args SW;
static void run_swf(void *) { if (SW.vec) k_swiglu_fwd8(SW.o, SW.gu, SW.N, SW.H); else k_swiglu_fwd(SW.o, SW.gu, SW.N, SW.H); }
static void run_swb(void *) { if (SW.vec) k_swiglu_bwd8(SW.o, SW.d, SW.gu, SW.N, SW.H); else k_swiglu_bwd(SW.o, SW.d, SW.gu, SW.N, SW.H); }

static void
test_swiglu(int N, int H)
{
	size_t n = (size_t)N * H;
	bf16 *gu = new bf16[2 * n], *d = new bf16[n], *o1 = new bf16[2 * n], *o2 = new bf16[2 * n];
	float *fgu = new float[2 * n], *fd = new float[n], *ref = new float[2 * n];
	fill_bf(&rs, gu, fgu, 2 * n, -4, 4);
	fill_bf(&rs, d, fd, n, -1, 1);
	for (int bwd = 0; bwd < 2; bwd++) {
		size_t no = bwd ? 2 * n : n;
		if (bwd)
			rl_cpu_swiglu_bwd(NULL, ref, fd, fgu, N, H);
		else
			rl_cpu_swiglu_fwd(NULL, ref, fgu, N, H);
		poison(o1, no);
		poison(o2, no);
		SW = { o1, gu, d, N, H, 1 };
		grid_for(n / 8);
		emu_launch(EG, EB, bwd ? run_swb : run_swf, NULL);
		SW.o = o2;
		SW.vec = 0;
		grid_for(n);
		emu_launch(EG, EB, bwd ? run_swb : run_swf, NULL);
		double worst = 0;
		size_t bad = bad_bf(o1, ref, no, 1e-5, &worst);
		int same = memcmp(o1, o2, no * 2) == 0;
		report(same && !bad, "swiglu_%s N=%d H=%d: vec %s, max err vs CPU %.3g, %zu bad", bwd ? "bwd" : "fwd", N, H,
		    same ? "same bits" : "DIFFERS", worst, bad);
	}
	delete[] gu; delete[] d; delete[] o1; delete[] o2; delete[] fgu; delete[] fd; delete[] ref;
}

/* ---- RoPE ------------------------------------------------------------------------------------ */
struct rope_args {
	bf16 *qkv;
	int32_t *pos;
	int N, NH, NKV, HD, vec;
	rl_rope rope;
	float sign;
};
static rope_args RA;
static void
run_rope(void *)
{
	if (RA.vec)
		k_rope8(RA.qkv, RA.pos, RA.N, RA.NH, RA.NKV, RA.HD, RA.rope, RA.sign);
	else
		k_rope(RA.qkv, RA.pos, RA.N, RA.NH, RA.NKV, RA.HD, RA.rope, RA.sign);
}

/* Llama 3.1's scaling (rope_type "llama3"); at HD 64 and 128 some frequencies fall in each of
 * its regions (kept, divided by factor, smoothed) */
static const rl_rope rope_l3 = { 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f };

static void
test_rope(int N, int NH, int NKV, int HD, rl_rope rope)
{
	size_t n = (size_t)N * (NH + 2 * NKV) * HD;
	bf16 *x1 = new bf16[n], *x2 = new bf16[n];
	float *fx = new float[n], *ref = new float[n];
	int32_t *pos = new int32_t[N];
	for (int r = 0; r < N; r++)
		pos[r] = (int32_t)(emu_rnd(&rs) % 4096);
	for (int bwd = 0; bwd < 2; bwd++) {
		fill_bf(&rs, x1, fx, n, -2, 2);
		memcpy(x2, x1, n * 2);
		memcpy(ref, fx, n * 4);
		if (bwd)
			rl_cpu_rope_bwd(NULL, ref, pos, N, NH, NKV, HD, rope);
		else
			rl_cpu_rope_fwd(NULL, ref, pos, N, NH, NKV, HD, rope);
		RA = { x1, pos, N, NH, NKV, HD, 1, rope, bwd ? -1.0f : 1.0f };
		grid_for((size_t)N * ((NH + NKV + ROPE_HPT - 1) / ROPE_HPT) * (HD / 16));
		emu_launch(EG, EB, run_rope, NULL);
		RA.qkv = x2;
		RA.vec = 0;
		grid_for((size_t)N * (NH + NKV) * (HD / 2));
		emu_launch(EG, EB, run_rope, NULL);
		double worst = 0;
		/* the test_cuda_ops tolerance: sin/cos of angles up to 4096 */
		size_t bad = bad_bf(x1, ref, n, 8e-3, &worst);
		int same = memcmp(x1, x2, n * 2) == 0;
		report(same && !bad, "rope_%s N=%d NH=%d NKV=%d HD=%d theta=%g factor=%g: vec %s, max err vs CPU %.3g, "
		    "%zu bad", bwd ? "bwd" : "fwd", N, NH, NKV, HD, rope.theta, rope.factor, same ? "same bits" : "DIFFERS",
		    worst, bad);
	}
	delete[] x1; delete[] x2; delete[] fx; delete[] ref; delete[] pos;
}

/* common.cuh's rope_inv against the CPU's rl_cpu_rope_inv, every frequency of a few head dims
 * and bases with and without the scaling.  The device's base theta^(-2f/HD) rounds differently
 * from the CPU's 1 / theta^(2f/HD): within 2 fp32 ulps (2.4e-7 relative) rather than bitwise.
 * The blend amplifies that: s grows with inv, and d log(new) / d log(inv) = 1 + (s + lo/(hi -
 * lo)) (1 - 1/factor) / (s + (1 - s)/factor), largest at s = 0: 1 + lo (factor - 1) / (hi - lo)
 * (11.3 for Llama 3.2's factor 32), so blended frequencies get that many times the bound.  And
 * the scaling must actually apply: each region holds some frequencies at HD >= 64. */
static void
test_rope_inv(void)
{
	static const int hds[3] = { 16, 64, 128 };
	const rl_rope ropes[4] = { { 1e4f }, { 5e5f }, rope_l3, { 100.0f, 4.0f, 1.0f, 3.0f, 24.0f } };
	for (int k = 0; k < 4; k++)
		for (int h = 0; h < 3; h++) {
			int HD = hds[h], bad = 0, reg[3] = { 0, 0, 0 };
			double worst = 0;
			for (int f = 0; f < HD / 2; f++) {
				float d = rope_inv(ropes[k], f, HD), c = rl_cpu_rope_inv(ropes[k], f, HD);
				rl_rope plain = { ropes[k].theta };
				float p = rl_cpu_rope_inv(plain, f, HD);
				double e = fabs((double)d - c) / c;
				/* the region of f: kept, divided, between */
				int g = c == p ? 0 : fabs((double)c * ropes[k].factor - p) <= 1e-6 * p ? 1 : 2;
				reg[g]++;
				const rl_rope &r = ropes[k];
				double amp = g == 2 ? 1 + r.lo * (r.factor - 1) / (r.hi - r.lo) : 1;
				worst = e / amp > worst ? e / amp : worst;
				bad += e > 2.4e-7 * amp;
			}
			int need = ropes[k].factor > 0 && HD >= 64;
			if (need && (!reg[0] || !reg[1] || !reg[2]))
				bad++;
			report(!bad, "rope_inv theta=%g factor=%g HD=%d: max rel diff vs CPU %.3g (blended: over its "
			    "amplification), kept/divided/smoothed "
			    "%d/%d/%d", ropes[k].theta, ropes[k].factor, HD, worst, reg[0], reg[1], reg[2]);
		}
}

/* ---- multi-tensor AdamW --------------------------------------------------------------------- */
struct adam_args {
	const rlk_adamw_chunk *ch;
	float *p, *g, *m, *v;
	bf16 *w;
	size_t off, n;
	float lr, wd, bc1, bc2;
	adamw_cls cl;
	int vec;
};
static adam_args AA;
static void
run_adam1(void *)
{
	k_adamw(AA.p + AA.off, AA.w + AA.off, AA.g + AA.off, AA.m + AA.off, AA.v + AA.off, AA.n, AA.lr, 0.9f, 0.95f,
	    1e-8f, AA.wd, AA.bc1, AA.bc2, 0.7f);
}
static void
run_adamm(void *)
{
	k_adamw_multi(AA.ch, AA.p, AA.w, AA.g, AA.m, AA.v, AA.cl, 0.9f, 0.95f, 1e-8f, AA.bc1, AA.bc2, 0.7f, AA.vec);
}

static void
test_adamw_multi(int vec)
{
	struct { size_t off, n; int cls; } sg[] = { { 0, 1, 0 }, { 16, 8193, 1 }, { 8209, 5, 1 }, { 8224, 9000, 2 },
	    { 17225, 7, 3 }, { 17240, 3, 0 }, { 17248, 16389, 1 } };
	const size_t L = 33664;
	float lr[4] = { 1e-3f, 2e-3f, 5e-4f, 3e-3f }, wd[4] = { 0, 0.1f, 0, 0.05f };
	float *p[2], *g = new float[L], *m[2], *v[2];
	bf16 *w[2];
	rlk_adamw_chunk ch[64];
	int nch = 0;
	for (int k = 0; k < 2; k++) {
		p[k] = new float[L];
		m[k] = new float[L];
		v[k] = new float[L];
		w[k] = new bf16[L];
	}
	for (size_t i = 0; i < L; i++) {
		p[0][i] = p[1][i] = frnd(&rs, -1, 1);
		g[i] = frnd(&rs, -1, 1);
		m[0][i] = m[1][i] = frnd(&rs, -0.1f, 0.1f);
		v[0][i] = v[1][i] = frnd(&rs, 0, 0.01f);
		w[0][i].h = w[1][i].h = 0x7fc1;
	}
	float *p0 = new float[L];
	memcpy(p0, p[0], L * 4);
	for (size_t s = 0; s < sizeof sg / sizeof sg[0]; s++)
		for (size_t a = 0; a < sg[s].n; a += RLK_ADAMW_CHUNK) {
			ch[nch].off = sg[s].off + a;
			ch[nch].n = (uint32_t)(sg[s].n - a < RLK_ADAMW_CHUNK ? sg[s].n - a : RLK_ADAMW_CHUNK);
			ch[nch].cls = (uint32_t)sg[s].cls;
			nch++;
		}
	for (int k = 0; k < 4; k++) {
		AA.cl.lr[k] = lr[k];
		AA.cl.wd[k] = wd[k];
	}
	for (int t = 1; t <= 3; t++) {
		AA.bc1 = (float)(1.0 - pow(0.9, t));
		AA.bc2 = (float)(1.0 - pow(0.95, t));
		AA.p = p[0]; AA.g = g; AA.m = m[0]; AA.v = v[0]; AA.w = w[0];
		for (size_t s = 0; s < sizeof sg / sizeof sg[0]; s++) {
			AA.off = sg[s].off;
			AA.n = sg[s].n;
			AA.lr = lr[sg[s].cls];
			AA.wd = wd[sg[s].cls];
			emu_launch(dim3(2), dim3(64), run_adam1, NULL);
		}
		AA.p = p[1]; AA.m = m[1]; AA.v = v[1]; AA.w = w[1]; AA.ch = ch; AA.vec = vec;
		emu_launch(dim3((unsigned)nch), dim3(64), run_adamm, NULL);
	}
	int same = memcmp(p[0], p[1], L * 4) == 0 && memcmp(m[0], m[1], L * 4) == 0 && memcmp(v[0], v[1], L * 4) == 0 &&
	    memcmp(w[0], w[1], L * 2) == 0;
	int gap = p[1][1] == p0[1] && p[1][8214] == p0[8214] && p[1][8223] == p0[8223] && p[1][17232] == p0[17232] &&
	    p[1][L - 1] == p0[L - 1] && w[1][8215].h == 0x7fc1 && p[1][5] == p0[5];
	int moved = p[1][0] != p0[0] && p[1][8208] != p0[8208] && p[1][17250] != p0[17250];
	report(same && gap && moved, "adamw_multi vec=%d, %d chunks, 3 steps: %s adamw per segment, gaps %s", vec, nch,
	    same ? "same bits as" : "DIFFERS FROM", gap && moved ? "untouched" : "WRONG");
	for (int k = 0; k < 2; k++) {
		delete[] p[k]; delete[] m[k]; delete[] v[k]; delete[] w[k];
	}
	delete[] g; delete[] p0;
}

/* ---- sum of squares ------------------------------------------------------------------------- */
struct ss_args { double *acc; float *x; size_t n; int v4; };
static ss_args SS;
static void run_ss(void *) { if (SS.v4) k_sumsq<1>(SS.acc, SS.x, SS.n); else k_sumsq<0>(SS.acc, SS.x, SS.n); }

static void
test_sumsq(size_t n)
{
	float *x = new float[n];
	double ref = 0, r[2];
	for (size_t i = 0; i < n; i++) {
		x[i] = frnd(&rs, -3, 3);
		ref += (double)x[i] * x[i];
	}
	for (int v4 = 0; v4 < 2; v4++) {
		r[v4] = 0;
		SS = { &r[v4], x, n, v4 };
		grid_for(v4 ? n / 4 : n);
		emu_launch(EG, EB, run_ss, NULL);
	}
	int ok = fabs(r[1] - ref) <= 1e-12 * ref && fabs(r[0] - ref) <= 1e-12 * ref;
	report(ok, "sumsq n=%zu: float4 %.17g, element %.17g, f64 %.17g", n, r[1], r[0], ref);
	delete[] x;
}

/* ---- bias gradient: column sums ----------------------------------------------------------- */
struct cs_args { float *db; bf16 *d; int N, OC; };
static cs_args CS;
static void run_cs(void *) { k_colsum8(CS.db, CS.d, CS.N, CS.OC); }

static void
test_colsum(int N, int OC)
{
	size_t n = (size_t)N * OC;
	bf16 *d = new bf16[n];
	float *fd = new float[n], *db = new float[OC];
	double *ref = new double[OC];
	fill_bf(&rs, d, fd, n, -1, 1);
	for (int c = 0; c < OC; c++)
		ref[c] = db[c] = frnd(&rs, -1, 1);  /* += */
	for (int r = 0; r < N; r++)
		for (int c = 0; c < OC; c++)
			ref[c] += fd[(size_t)r * OC + c];
	CS = { db, d, N, OC };
	emu_launch(dim3((unsigned)((OC + 255) / 256), (unsigned)((N + COLSUM_ROWS - 1) / COLSUM_ROWS)), dim3(256), run_cs,
	    NULL);
	double worst = 0;
	size_t bad = 0;
	for (int c = 0; c < OC; c++) {
		double e = fabs(db[c] - ref[c]);
		if (!(e <= 1e-5 * sqrt(N) + 1e-5 * fabs(ref[c])))
			bad++;
		worst = fmax(worst, e);
	}
	report(!bad, "colsum8 N=%d OC=%d: max err vs f64 %.3g, %zu bad", N, OC, worst, bad);
	delete[] d; delete[] fd; delete[] db; delete[] ref;
}

/* ---- norm backward (norm.cu): the row in registers, the element-strided fallback ----------- */
struct nb_args {
	bf16 *dx, *dout, *x, *w;
	float *dw, *db, *mean, *rstd;
	int N, C, ln, nch, vec, acc;
};
static nb_args NBA;
#define NBK(K, L, A) k_norm_bwd_vec<K, L, A>(NBA.dx, NBA.dw, NBA.db, NBA.dout, NBA.x, NBA.w, NBA.mean, NBA.rstd, NBA.N, \
	NBA.C)
template <int L, int A>
static void
nb_vec(void)
{
	switch (NBA.nch) { case 1: NBK(1, L, A); break; case 2: NBK(2, L, A); break; case 3: NBK(3, L, A); break;
	default: NBK(4, L, A); }
}
#undef NBK
static void
run_nb(void *)
{
	if (!NBA.vec && NBA.ln) {
		if (NBA.acc)
			k_layernorm_bwd<1>(NBA.dx, NBA.dw, NBA.db, NBA.dout, NBA.x, NBA.w, NBA.mean, NBA.rstd, NBA.N, NBA.C);
		else
			k_layernorm_bwd<0>(NBA.dx, NBA.dw, NBA.db, NBA.dout, NBA.x, NBA.w, NBA.mean, NBA.rstd, NBA.N, NBA.C);
	} else if (!NBA.vec) {
		if (NBA.acc)
			k_rmsnorm_bwd<1>(NBA.dx, NBA.dw, NBA.dout, NBA.x, NBA.w, NBA.rstd, NBA.N, NBA.C);
		else
			k_rmsnorm_bwd<0>(NBA.dx, NBA.dw, NBA.dout, NBA.x, NBA.w, NBA.rstd, NBA.N, NBA.C);
	} else if (NBA.ln) {
		if (NBA.acc)
			nb_vec<1, 1>();
		else
			nb_vec<1, 0>();
	} else {
		if (NBA.acc)
			nb_vec<0, 1>();
		else
			nb_vec<0, 0>();
	}
}

/* One launch of the form (vec, acc) over dx with dw, db accumulated into (db NULL unless
 * ln && with_db). */
static void
nb_launch(bf16 *dx, float *dw, float *db, bf16 *g, bf16 *x, bf16 *w, float *mean, float *rstd, int N, int C, int ln,
    int vec, int acc, unsigned grid)
{
	NBA = { dx, g, x, w, dw, db, mean, rstd, N, C, ln, (C + 255) / 256, vec, acc };
	emu_launch(dim3(grid), dim3(NORM_WARPS * 32), run_nb, NULL);
}

/* grid: blocks (fewer than N / NORM_WARPS: warps take several rows); with_db 0: db NULL;
 * vec: k_norm_bwd_vec (C % 8 == 0, C <= 1024), else k_layernorm_bwd / k_rmsnorm_bwd.
 * acc 0: dx (poisoned) overwritten, against the CPU op.  acc 1 (layernorm_bwd_add,
 * rmsnorm_bwd_add): dx holds random bf16 values d0 and gets d0 + the CPU op's dx (one
 * rounding: rtol as one bf16 step, atol the plain op's); the same form with ACC 0 and with
 * ACC 1 over a dx of zeros then give the same dx values, and dw, db bit for bit (the ACC
 * form changes the dx store only). */
static void
test_norm_bwd(int N, int C, int ln, int with_db, unsigned grid, int vec, int acc)
{
	size_t n = (size_t)N * C;
	bf16 *x = new bf16[n], *g = new bf16[n], *w = new bf16[C], *dx = new bf16[n], *d0 = new bf16[n];
	bf16 *dxp = new bf16[n];
	float *fx = new float[n], *fg = new float[n], *fw = new float[C], *ref = new float[n], *tmp = new float[n];
	float *fd0 = new float[n];
	float *mean = new float[N], *rstd = new float[N], *dw = new float[C], *db = new float[C];
	float *rdw = new float[C], *rdb = new float[C], *fb = new float[C], *pdw = new float[C], *pdb = new float[C];
	fill_bf(&rs, x, fx, n, -2, 2);
	fill_bf(&rs, g, fg, n, -1, 1);
	fill_bf(&rs, w, fw, C, 0.5f, 1.5f);
	fill_bf(&rs, d0, fd0, n, -3, 3);
	for (int c = 0; c < C; c++) {
		fb[c] = 0.0f;
		dw[c] = rdw[c] = pdw[c] = frnd(&rs, -1, 1);  /* accumulated into (+=) */
		db[c] = rdb[c] = pdb[c] = frnd(&rs, -1, 1);
	}
	if (ln)
		rl_cpu_layernorm_fwd(NULL, tmp, mean, rstd, fx, fw, fb, N, C, 1e-5f);
	else
		rl_cpu_rmsnorm_fwd(NULL, tmp, rstd, fx, fw, N, C, 1e-6f);
	if (ln)
		rl_cpu_layernorm_bwd(NULL, ref, rdw, with_db ? rdb : NULL, fg, fx, fw, mean, rstd, N, C);
	else
		rl_cpu_rmsnorm_bwd(NULL, ref, rdw, fg, fx, fw, rstd, N, C);
	double mx = 0, worst = 0, wdw = 0;
	for (size_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(ref[i]));
	size_t bad = 0, differ = 0;
	float *dbk = ln && with_db ? db : NULL;
	if (acc) {
		for (size_t i = 0; i < n; i++) {
			dx[i] = d0[i];
			dxp[i].h = 0;
			ref[i] += fd0[i];
		}
		nb_launch(dx, dw, dbk, g, x, w, mean, rstd, N, C, ln, vec, 1, grid);
		/* ACC 0 over poison, ACC 1 over zeros: the same values; dw, db as the first launch */
		bf16 *dxz = new bf16[n];
		float *zdw = new float[C], *zdb = new float[C];
		memcpy(zdw, pdw, C * sizeof(float));
		memcpy(zdb, pdb, C * sizeof(float));
		poison(dxz, n);
		nb_launch(dxz, pdw, ln && with_db ? pdb : NULL, g, x, w, mean, rstd, N, C, ln, vec, 0, grid);
		nb_launch(dxp, zdw, ln && with_db ? zdb : NULL, g, x, w, mean, rstd, N, C, ln, vec, 1, grid);
		for (size_t i = 0; i < n; i++)
			differ += !(__bfloat162float(dxz[i]) == __bfloat162float(dxp[i]));
		differ += memcmp(pdw, dw, C * sizeof(float)) != 0 || memcmp(pdb, db, C * sizeof(float)) != 0 ||
		    memcmp(zdw, dw, C * sizeof(float)) != 0 || memcmp(zdb, db, C * sizeof(float)) != 0;
		delete[] dxz; delete[] zdw; delete[] zdb;
	} else {
		poison(dx, n);
		nb_launch(dx, dw, dbk, g, x, w, mean, rstd, N, C, ln, vec, 0, grid);
	}
	bad += bad_bf(dx, ref, n, 2e-3 * mx, &worst);
	for (int c = 0; c < C; c++) {
		double e = fabs(dw[c] - rdw[c]), eb = fabs(db[c] - rdb[c]);
		if (!(e <= 1e-5 * sqrt(N) + 1e-4 * fabs(rdw[c])) || (ln && with_db && !(eb <= 1e-5 * sqrt(N) + 1e-4 * fabs(rdb[c]))))
			bad++;
		if (!ln || !with_db)
			bad += db[c] != rdb[c];  /* untouched */
		wdw = fmax(wdw, fmax(e, ln && with_db ? eb : 0));
	}
	char form[48], tail[48] = "";
	if (vec)
		snprintf(form, sizeof form, "norm_bwd_vec<%d>%s %s", (C + 255) / 256, acc ? " acc" : "", ln ? "layernorm" :
		    "rmsnorm");
	else
		snprintf(form, sizeof form, "%s_bwd%s", ln ? "layernorm" : "rmsnorm", acc ? " acc" : "");
	if (acc)
		snprintf(tail, sizeof tail, ", %zu differ from ACC 0", differ);
	report(!bad && !differ, "%s N=%d C=%d db=%d grid=%u: max err dx %.3g dw/db %.3g vs CPU, %zu bad%s", form, N, C,
	    with_db, grid, worst, wdw, bad, tail);
	delete[] x; delete[] g; delete[] w; delete[] dx; delete[] d0; delete[] dxp; delete[] fx; delete[] fg;
	delete[] fw; delete[] ref; delete[] tmp; delete[] fd0; delete[] mean; delete[] rstd; delete[] dw; delete[] db;
	delete[] rdw; delete[] rdb; delete[] fb; delete[] pdw; delete[] pdb;
}

int
main(void)
{
	size_t ns[] = { 1, 7, 8, 9, 1000, 4103 };
	for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
		test_ew(ns[i]);
	test_swiglu(1, 8);
	test_swiglu(5, 40);
	test_swiglu(3, 4864);
	test_rope(3, 14, 2, 64, rl_rope{ 1e6f });   /* Qwen2.5's heads: 16 rotated, 4 per thread */
	test_rope(2, 12, 12, 64, rl_rope{ 1e4f });
	test_rope(4, 5, 2, 128, rl_rope{ 1e4f });   /* 7 heads: a partial group */
	test_rope(2, 1, 1, 16, rl_rope{ 1e4f });    /* one chunk of 8 frequencies */
	test_rope(5, 24, 8, 128, rope_l3);          /* Llama 3.1 8B's heads and scaling */
	test_rope(3, 3, 1, 64, rope_l3);            /* Llama 3.2 1B's head dim, a partial group */
	test_rope_inv();
	test_adamw_multi(1);
	test_adamw_multi(0);
	test_sumsq(1);
	test_sumsq(7);
	test_sumsq(4099);
	/* one column block partly filled, several; rows not a multiple of 8 or of a block's */
	test_colsum(1, 8);
	test_colsum(77, 264);
	test_colsum(300, 768);
	test_colsum(129, 2304);
	/* 1 to 4 chunks per lane, rows ending inside a chunk (C 24, 896), warps over several rows */
	test_norm_bwd(1, 8, 1, 1, 1, 1, 0);
	test_norm_bwd(37, 768, 1, 1, 2, 1, 0);
	test_norm_bwd(9, 768, 1, 0, 2, 1, 0);
	test_norm_bwd(17, 896, 0, 0, 1, 1, 0);
	test_norm_bwd(5, 24, 0, 0, 1, 1, 0);
	test_norm_bwd(12, 512, 0, 0, 3, 1, 0);
	test_norm_bwd(3, 1024, 1, 1, 1, 1, 0);
	test_norm_bwd(20, 264, 1, 1, 2, 1, 0);
	/* the accumulating forms (layernorm_bwd_add, rmsnorm_bwd_add): GPT-2's 768, Qwen2.5's 896,
	 * each chunk count, db NULL, grids smaller than the rows */
	test_norm_bwd(37, 768, 1, 1, 2, 1, 1);
	test_norm_bwd(17, 896, 0, 0, 1, 1, 1);
	test_norm_bwd(1, 8, 1, 1, 1, 1, 1);
	test_norm_bwd(20, 264, 1, 0, 2, 1, 1);
	test_norm_bwd(12, 512, 0, 0, 3, 1, 1);
	test_norm_bwd(3, 1024, 1, 1, 1, 1, 1);
	/* the element-strided fallback (C % 8 != 0, C > 1024, RL_CUDA_NORM_BWD_VEC=0), plain and
	 * accumulating: C 7, 33, 1030 and 4099, warps over several rows */
	test_norm_bwd(5, 7, 1, 1, 1, 0, 0);
	test_norm_bwd(5, 7, 1, 1, 1, 0, 1);
	test_norm_bwd(70, 33, 0, 0, 2, 0, 0);
	test_norm_bwd(70, 33, 0, 0, 2, 0, 1);
	test_norm_bwd(9, 1030, 0, 0, 1, 0, 0);
	test_norm_bwd(9, 1030, 0, 0, 1, 0, 1);
	test_norm_bwd(3, 4099, 1, 1, 1, 0, 0);
	test_norm_bwd(3, 4099, 1, 1, 1, 0, 1);
	test_norm_bwd(37, 768, 1, 0, 2, 0, 1);
	printf("emu_ew: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

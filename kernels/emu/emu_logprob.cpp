/*
 * emu_logprob.cpp — k_logprob_fwd and k_logprob_bwd of logprob.cu (their source cut out
 * by run.sh) run on the CPU through cuda_emu.h against the CPU reference
 * rl_cpu_logprob_fwd / rl_cpu_logprob_bwd, on logits laid out with a row stride ld >= V
 * (the strided LM head of lib/compute/ops.h): ld = V (odd V: rows alternately 4-byte aligned
 * and not, so both the paired and the one-at-a-time loops run), V rounded up to 64
 * (every row paired), and V + 1; with and without entropy; backward out of place and
 * in place; rows with tgt < 0 and tgt = V - 1.  The stride's pad columns hold a
 * sentinel that must come back unchanged (and that would wreck lse if read).
 * Tolerances as test_cuda_ops: lp and entropy within 2e-4 + 1e-4 |ref|, lse 2e-4 +
 * 1e-5 |ref| (f32 from the same bf16 inputs; only summation order differs), dlogits
 * 1e-3 max|ref| + 8e-3 |ref| (one bf16 rounding).
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops_cpu.h"
}

#include "logprob.inc"

static int fails, cases;
static uint64_t rs = 0x6a09e667f3bcc909ull;

struct lp_args {
	float *lp, *ent, *lse;
	const float *dlp, *dent;
	bf16 *dlg;
	const bf16 *lg;
	const int32_t *tgt;
	size_t ld;
	int V;
	float it;
};
static lp_args LA;

static void run_fwd(void *) { k_logprob_fwd(LA.lp, LA.ent, LA.lse, LA.lg, LA.ld, LA.tgt, LA.V, LA.it); }
static void run_bwd(void *) { k_logprob_bwd(LA.dlg, LA.lg, LA.ld, LA.tgt, LA.lse, LA.dlp, LA.dent, LA.V, LA.it); }

/* got[i] within atol + rtol |ref[i]| (NaN fails): the count of those that are not */
static int
nbad(const float *got, const float *ref, int n, double atol, double rtol)
{
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += !(fabs((double)got[i] - ref[i]) <= atol + rtol * fabs(ref[i]));
	return bad;
}

static void
test_logprob(int N, int V, int ld, float it, int with_ent)
{
	const uint16_t SENT = 0x7e00;  /* bf16 2^125 */
	size_t nv = (size_t)N * V, nl = (size_t)N * ld;
	bf16 *lg = new bf16[nl], *lg2 = new bf16[nl], *dlg = new bf16[nl];
	float *flg = new float[nv], *dl = new float[nv];
	float *lp = new float[N], *ent = new float[N], *lse = new float[N];
	float *glp = new float[N], *gent = new float[N], *glse = new float[N];
	float *dlp = new float[N], *dent = new float[N];
	int32_t *tgt = new int32_t[N];
	for (size_t i = 0; i < nl; i++) {
		lg[i].h = SENT;
		dlg[i].h = SENT;
	}
	for (int n = 0; n < N; n++) {
		fill_bf(&rs, lg + (size_t)n * ld, flg + (size_t)n * V, V, -8, 8);
		tgt[n] = n % 7 == 3 ? -1 : n % 5 == 1 ? V - 1 : (int)(emu_rnd(&rs) % (uint32_t)V);
		dlp[n] = frnd(&rs, -1, 1);
		dent[n] = frnd(&rs, -0.1f, 0.1f);
		glp[n] = gent[n] = glse[n] = NAN;
	}
	memcpy(lg2, lg, nl * sizeof *lg);
	rl_cpu_logprob_fwd(NULL, lp, with_ent ? ent : NULL, lse, flg, tgt, N, V, it);
	LA = { glp, with_ent ? gent : NULL, glse, dlp, with_ent ? dent : NULL, dlg, lg, tgt, (size_t)ld, V, it };
	emu_launch(dim3((unsigned)N), dim3(LP_THREADS), run_fwd, NULL);
	int bad = nbad(glp, lp, N, 2e-4, 1e-4) + nbad(glse, lse, N, 2e-4, 1e-5);
	if (with_ent)
		bad += nbad(gent, ent, N, 2e-4, 1e-4);

	rl_cpu_logprob_bwd(NULL, dl, flg, tgt, lse, dlp, with_ent ? dent : NULL, N, V, it);
	float mx = 0;
	for (size_t i = 0; i < nv; i++)
		mx = fmaxf(mx, fabsf(dl[i]));
	int badd = 0, badpad = 0;
	/* out of place into dlg, then in place on lg2 */
	for (int pass = 0; pass < 2; pass++) {
		bf16 *out = pass ? lg2 : dlg;
		LA.dlg = out;
		LA.lg = pass ? lg2 : lg;
		emu_launch(dim3((unsigned)N), dim3(LP_THREADS), run_bwd, NULL);
		for (int n = 0; n < N; n++)
			for (int j = 0; j < ld; j++) {
				bf16 v = out[(size_t)n * ld + j];
				if (j >= V) {
					badpad += v.h != SENT;
					continue;
				}
				double r = dl[(size_t)n * V + j], e = fabs(__bfloat162float(v) - r);
				badd += !(e <= 1e-3 * mx + 8e-3 * fabs(r));
			}
	}
	for (size_t i = 0; i < nl; i++)
		badpad += (size_t)(i % ld) >= (size_t)V && lg[i].h != SENT;
	int ok = !bad && !badd && !badpad;
	cases++;
	if (!ok)
		fails++;
	printf("%s logprob N=%d V=%d ld=%d it=%g ent=%d: %d fwd, %d bwd values off, %d pad columns changed\n",
	    ok ? "ok  " : "FAIL", N, V, ld, it, with_ent, bad, badd, badpad);
	delete[] lg; delete[] lg2; delete[] dlg; delete[] flg; delete[] dl; delete[] lp; delete[] ent; delete[] lse;
	delete[] glp; delete[] gent; delete[] glse; delete[] dlp; delete[] dent; delete[] tgt;
}

int
main(void)
{
	test_logprob(3, 5, 5, 1.0f, 1);
	test_logprob(3, 5, 64, 1.0f, 1);
	test_logprob(8, 1001, 1001, 1.0f / 0.7f, 1);
	test_logprob(8, 1001, 1024, 1.0f / 0.7f, 1);
	test_logprob(8, 1001, 1002, 1.0f, 0);
	test_logprob(6, 1000, 1001, 1.0f, 1);   /* even V, odd stride */
	test_logprob(4, 50257, 50304, 1.0f, 1); /* GPT-2's head */
	test_logprob(3, 50257, 50257, 1.0f, 0);
	printf("emu_logprob: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

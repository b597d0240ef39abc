/*
 * emu_sample.cpp — k_sample of logprob.cu (its source cut out by run.sh) run on the CPU
 * through cuda_emu.h against the CPU reference rl_cpu_sample: greedy, temperature only,
 * top-k, top-p and both, vocabularies of 13, 1000, GPT-2's 50257 (rows not a multiple
 * of the 32 warps) and Qwen's 151936, with exact ties in every row.  As test_cuda_ops:
 * the token identical in all rows but at most one per case (a cumulative mass within an
 * f32 rounding of u can move it), the log-prob within 1e-4.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include "cuda_emu.h"

extern "C" {
#include "core.h"
#include "ops.h"
#include "ops_cpu.h"
#include "rng.h"
}

#include "sample.inc"

static int fails, cases;
static uint64_t rs = 0x2545f4914f6cdd1dull;

struct smp_args {
	int32_t *tok;
	float *logp;
	const bf16 *lg;
	const uint64_t *seed, *ctr;
	int V;
	rl_sample_params p;
};
static smp_args SA;

static void run_sample(void *) { k_sample(SA.tok, SA.logp, SA.lg, SA.seed, SA.ctr, SA.V, SA.p); }

static void
test_sample(int B, int V, float temp, int top_k, float top_p)
{
	size_t n = (size_t)B * V;
	bf16 *lg = new bf16[n];
	float *flg = new float[n], *lp = new float[B], *glp = new float[B];
	int32_t *tok = new int32_t[B], *gtok = new int32_t[B];
	uint64_t *seed = new uint64_t[B], *ctr = new uint64_t[B];
	rl_sample_params p = { temp, top_k, top_p };
	fill_bf(&rs, lg, flg, n, -6, 6);
	for (int b = 0; b < B; b++) {
		for (int i = 0; i < 8; i++) {  /* exact ties */
			size_t k = (size_t)b * V + emu_rnd(&rs) % (uint32_t)V;
			lg[k] = __float2bfloat16(5.5f);
			flg[k] = 5.5f;
		}
		seed[b] = emu_rnd(&rs);
		ctr[b] = (uint64_t)b * 3;
		gtok[b] = -7;
		glp[b] = NAN;
	}
	rl_cpu_sample(NULL, tok, lp, flg, seed, ctr, B, V, &p);
	SA = { gtok, glp, lg, seed, ctr, V, p };
	emu_launch(dim3((unsigned)B), dim3(SMP_THREADS), run_sample, NULL);
	int same = 0, badlp = 0;
	for (int b = 0; b < B; b++) {
		same += gtok[b] == tok[b];
		if (gtok[b] == tok[b] && !(fabsf(glp[b] - lp[b]) <= 1e-4f + 1e-4f * fabsf(lp[b])))
			badlp++;
	}
	int ok = same >= B - 1 && !badlp;
	cases++;
	if (!ok)
		fails++;
	printf("%s sample B=%d V=%d T=%g k=%d p=%g: %d/%d tokens as the CPU, %d log-probs off\n", ok ? "ok  " : "FAIL", B,
	    V, temp, top_k, top_p, same, B, badlp);
	delete[] lg; delete[] flg; delete[] lp; delete[] glp; delete[] tok; delete[] gtok; delete[] seed; delete[] ctr;
}

int
main(void)
{
	test_sample(6, 1000, 0.0f, 0, 1.0f);
	test_sample(7, 13, 1.5f, 3, 0.5f);
	test_sample(5, 1000, 1.0f, 0, 1.0f);
	test_sample(4, 50257, 1.0f, 0, 1.0f);
	test_sample(3, 50257, 0.7f, 50, 1.0f);
	test_sample(3, 50257, 1.0f, 0, 0.9f);
	test_sample(2, 151936, 1.0f, 20, 0.8f);
	test_sample(2, 151936, 1.0f, 0, 1.0f);
	printf("emu_sample: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

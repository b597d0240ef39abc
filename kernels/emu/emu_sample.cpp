/*
 * emu_sample.cpp — k_sample of logprob.cu (its source cut out by run.sh) run on the CPU
 * through cuda_emu.h against the CPU reference rl_cpu_sample: greedy, temperature only,
 * top-k, top-p and both, vocabularies of 13, 1000, GPT-2's 50257 (rows not a multiple
 * of the 32 warps) and Qwen's 151936, with exact ties in every row.  As test_cuda_ops:
 * the token identical in all rows but at most one per case (a cumulative mass within an
 * f32 rounding of u can move it), the log-prob within 1e-4.  Then k_sample_split (a row
 * over several blocks; greedy and temperature only) with its blocks in a random order,
 * twice: every token as the CPU, both launches the same bit for bit, counters back at 0.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops.h"
#include "compute/ops_cpu.h"
#include "base/rng.h"
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

/* k_sample_split's scratch and counters */
static double *SW;
static float *SM;
static int *SI;
static unsigned *SC;
static void
run_sample_split(void *)
{
	k_sample_split(SA.tok, SA.logp, SA.lg, SA.seed, SA.ctr, SA.V, SA.p.temperature, SW, SM, SI, SC);
}

/* split: k_sample_split (rows over several blocks, the last block of a row finishes it),
 * run with the blocks in a random order, then again in another order: the same tokens and
 * log-probs bit for bit, and every counter back at 0 after each launch */
static void
test_sample(int B, int V, float temp, int top_k, float top_p, int split = 0)
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
	int cbad = 0, rbad = 0;
	if (split) {
		int nr = ss_ranges(V);
		SW = new double[(size_t)B * nr];
		SM = new float[(size_t)B * nr];
		SI = new int[(size_t)B * nr];
		SC = new unsigned[B];
		for (size_t i = 0; i < (size_t)B * nr; i++) {
			SW[i] = NAN;
			SM[i] = NAN;
			SI[i] = -5;
		}
		memset(SC, 0, (size_t)B * sizeof *SC);
		emu_block_shuffle = 1;
		emu_launch(dim3((unsigned)(nr / SS_WARPS), (unsigned)B), dim3(SS_THREADS), run_sample_split, NULL);
		for (int b = 0; b < B; b++)
			cbad += SC[b] != 0;
		int32_t *t2 = new int32_t[B];
		float *l2 = new float[B];
		SA.tok = t2;
		SA.logp = l2;
		emu_launch(dim3((unsigned)(nr / SS_WARPS), (unsigned)B), dim3(SS_THREADS), run_sample_split, NULL);
		emu_block_shuffle = 0;
		for (int b = 0; b < B; b++)
			cbad += SC[b] != 0;
		rbad = memcmp(t2, gtok, (size_t)B * sizeof *t2) != 0 || memcmp(l2, glp, (size_t)B * sizeof *l2) != 0;
		delete[] t2; delete[] l2; delete[] SW; delete[] SM; delete[] SI; delete[] SC;
	} else {
		emu_launch(dim3((unsigned)B), dim3(SMP_THREADS), run_sample, NULL);
	}
	int same = 0, badlp = 0;
	for (int b = 0; b < B; b++) {
		same += gtok[b] == tok[b];
		if (gtok[b] == tok[b] && !(fabsf(glp[b] - lp[b]) <= 1e-4f + 1e-4f * fabsf(lp[b])))
			badlp++;
	}
	/* k_sample_split: every token as the CPU (these fixed inputs put no cumulative mass
	 * within rounding of u; the GPU test keeps the one-row allowance) */
	int ok = same >= B - (split ? 0 : 1) && !badlp && !cbad && !rbad;
	cases++;
	if (!ok)
		fails++;
	printf("%s sample%s B=%d V=%d T=%g k=%d p=%g: %d/%d tokens as the CPU, %d log-probs off%s%s\n", ok ? "ok  " : "FAIL",
	    split ? " (split, twice)" : "", B, V, temp, top_k, top_p, same, B, badlp, cbad ? ", counters left non-zero" : "",
	    rbad ? ", the second launch differs" : "");
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
	/* k_sample_split: greedy, T = 1 and T = 0.7; V of 13 (one range), 1000, 2048 (exactly
	 * one block), 2049, GPT-2's and Qwen's; 1 to 9 rows */
	test_sample(3, 13, 0.0f, 0, 1.0f, 1);
	test_sample(5, 13, 1.0f, 0, 1.0f, 1);
	test_sample(4, 1000, 0.7f, 0, 1.0f, 1);
	test_sample(9, 2048, 1.0f, 0, 1.0f, 1);
	test_sample(9, 2049, 1.3f, 0, 1.0f, 1);
	test_sample(6, 1000, 0.0f, 0, 1.0f, 1);
	test_sample(1, 50257, 1.0f, 0, 1.0f, 1);
	test_sample(3, 50257, 0.7f, 0, 1.0f, 1);
	test_sample(2, 50257, 0.0f, 0, 1.0f, 1);
	test_sample(2, 151936, 1.0f, 0, 1.0f, 1);
	test_sample(1, 151936, 0.0f, 0, 1.0f, 1);
	test_sample(24, 20000, 0.9f, 0, 1.0f, 1);  /* 24 draws over 10 blocks a row */
	printf("emu_sample: %d of %d cases passed\n", cases - fails, cases);
	return fails ? 1 : 0;
}

/*
 * emu_step.cpp — step.cu's persistent decode step run on the CPU through cuda_emu.h (its device
 * code, with fuse.cuh's and decode.cuh's, cut out of the sources by run.sh) against the CPU
 * reference of lib/compute/ops_cpu.c:
 *   - st_stage stage by stage, each stage one emu_launch over the same grid of 3 to 9 blocks in
 *     a random block order (the kernel boundary stands in for the grid barrier; the attention
 *     units' in-stage merge meets through its counters in any order), for random tiny models:
 *     GPT-2's shape (LayerNorm, GELU, every bias, HD 64, G 1) and Qwen2's (RMSNorm, SwiGLU,
 *     RoPE, a qkv bias only; HD 64 with G 7, HD 128 with G 2), 2 layers, one sequence,
 *     contexts of 1 to 300 over a shuffled block table (up to 19 cache blocks of 16, a second
 *     32-key round per warp), nsplit 1, 3 and 32 (most splits then empty), and splits by
 *     context (split_keys 64 and 256: 5, 1 and 2 of the splits taken);
 *     the logits, the final x and the cache rows written (every layer) against the CPU ops in
 *     lib/model/model.c's order with the GPU's bf16 roundings, every other cache row untouched, the
 *     merge counters back at 0;
 *   - the whole kernel k_decode_step over 4 blocks of 256 threads run at once (emu_launch_coop:
 *     its real barrier, a polling block sleeping while the others run, each block its own
 *     dynamic shared memory; the units' merge counters met by interleaved blocks): the same
 *     bits as the stage-by-stage run, the merge and barrier counters back at 0, and with the
 *     stage profile (RL_CUDA_STEP_PROFILE) one launch counted, its stamps set back;
 *   - the barrier alone (st_grid_sync, st_grid_end) over a cooperative grid of 4 blocks of 256
 *     threads run at once (emu_launch_coop: a block polling the counter sleeps, the others
 *     run), arriving at different times: no block leaves barrier k before every block has
 *     reached it, the counters 0 after each launch, twice; and a grid where one block skips a
 *     barrier stops (the emulator's deadlock check, in a child process) instead of passing.
 * With RL_EMU_SKEW=1 (cuda_emu.h: a random half of the warps each scheduling round) the warps
 * and blocks drift apart between barriers (run.sh runs the quick set so).
 * What only a GPU shows: the barrier's memory ordering (here blocks run as fibers on one
 * thread), the cooperative launch and its occupancy, timing.
 * Exit 0 when every case passes, 1 otherwise; one line per case.
 */
#include <fcntl.h>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_emu.h"

extern "C" {
#include "base/core.h"
#include "compute/ops_cpu.h"
}
#include "kernels/launch.h"

/* fuse.cuh's and step.cu's dynamic shared memory: cuda_emu.h's arena (NaN-filled before every block) */
#define FUSE_SMEM(name) bf16 *name = (bf16 *)emu_dyn_smem(0)
/* step.cu's globaltimer: a clock that ticks at every read */
static unsigned long long emu_clock;
static unsigned long long st_now(void) { return ++emu_clock; }
#include "step.inc"

static int fails, cases;
static uint64_t rs = 0x2545f4914f6cdd1dull;  /* emu_rnd, frnd, fill_bf: cuda_emu.h */

/* a tensor: the bf16 values the kernel reads and their f32 copy for the CPU */
struct ten {
	bf16 *d;
	float *f;
	size_t n;
};

static ten
mk(size_t n, float lo, float hi)
{
	ten t = { new bf16[n ? n : 1], new float[n ? n : 1], n };
	fill_bf(&rs, t.d, t.f, n, lo, hi);
	return t;
}

static void
rm(ten &t)
{
	delete[] t.d;
	delete[] t.f;
}

/* f32 values rounded to bf16, as the kernels store act */
static void
rnd(float *a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		a[i] = __bfloat162float(__float2bfloat16(a[i]));
}

struct lay {
	ten ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, proj_w, proj_b, kc, vc;
};

/* ---- the kernel's calls ---------------------------------------------------------------------- */
struct st_nosync {  /* the stage-by-stage run: the launch boundary is the barrier */
	void trigger() const {}
	void wait() const {}
};
static st_args SA;
static int s_stage, s_HD, s_G;

#define ST_EMU(F) do { \
	if (SA.s.gpt2) F(64, 1, 1); \
	else if (s_HD == 64 && s_G == 7) F(64, 7, 0); \
	else if (s_HD == 128 && s_G == 2) F(128, 2, 0); \
	else { fprintf(stderr, "emu_step: HD %d G %d gpt2 %d not instantiated here\n", s_HD, s_G, SA.s.gpt2); \
		abort(); } } while (0)
#define ST_ONE(HD, G, P) st_stage<HD, G, P>(SA, s_stage, (int)blockIdx.x, (int)gridDim.x, st_nosync())
#define ST_ALL(HD, G, P) k_decode_step<HD, G, P>(SA)
#define ST_SM(HD, G, P) s_sm = sizeof(dc_lane_sm<HD, G, ST_WARPS>)
static size_t s_sm;
static void run_stage(void *) { ST_EMU(ST_ONE); }
static void run_kernel(void *) { ST_EMU(ST_ALL); }

/* ---- one decode step of a random model --------------------------------------------------------- */
/* values off the reference by more than atol + rtol |ref| (NaN included); *worst the largest error,
 * *nmse the squared error over the squared reference */
static size_t
bad_count(const bf16 *out, const float *ref, size_t n, double atol, double rtol, double *worst, double *nmse)
{
	size_t bad = 0;
	double se = 0, sr = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs(__bfloat162float(out[i]) - ref[i]);
		if (!(e <= atol + rtol * fabs(ref[i])))
			bad++;
		if (!(e <= *worst))
			*worst = e;
		se += e * e;
		sr += (double)ref[i] * ref[i];
	}
	double q = sr > 0 ? se / sr : se;
	if (!(q <= *nmse))
		*nmse = q;
	return bad;
}

static void
test_step(int gpt2, int C, int NH, int NKV, int HD, int H, int V, int ctx, int nsplit, int nblk, int keys = 0,
    int l3 = 0)
{
	const int L = 2, BS = 16, MAXBLK = 20, NBLK = MAXBLK + 3, QKV = (NH + 2 * NKV) * HD, AD = NH * HD;
	const int FC = gpt2 ? H : 2 * H, B = 1, G = NH / NKV;
	const float eps = gpt2 ? 1e-5f : 1e-6f;
	/* GPT-2: ignored (no RoPE).  l3: Llama 3's scaling with an original context of 64, so that
	 * at HD 64 and 128 frequencies fall in each of its regions and positions run past it */
	const rl_rope rope = l3 ? rl_rope{ 1e4f, 8.0f, 1.0f, 4.0f, 64.0f } : rl_rope{ 1e4f };
	const size_t ncache = (size_t)NBLK * BS * NKV * HD, row = (size_t)NKV * HD;
	const float sc = 1.0f / sqrtf((float)C), sa = 1.0f / sqrtf((float)AD), sh = 1.0f / sqrtf((float)H);
	lay ly[2];
	for (int l = 0; l < L; l++) {
		lay &y = ly[l];
		y.ln1_w = mk(C, 0.5f, 1.5f);
		y.ln1_b = mk(gpt2 ? C : 0, -0.5f, 0.5f);
		y.qkv_w = mk((size_t)QKV * C, -sc, sc);
		y.qkv_b = mk(QKV, -0.5f, 0.5f);
		y.o_w = mk((size_t)C * AD, -sa, sa);
		y.o_b = mk(gpt2 ? C : 0, -0.5f, 0.5f);
		y.ln2_w = mk(C, 0.5f, 1.5f);
		y.ln2_b = mk(gpt2 ? C : 0, -0.5f, 0.5f);
		y.fc_w = mk((size_t)FC * C, -sc, sc);
		y.fc_b = mk(gpt2 ? FC : 0, -0.5f, 0.5f);
		y.proj_w = mk((size_t)C * H, -sh, sh);
		y.proj_b = mk(gpt2 ? C : 0, -0.5f, 0.5f);
		y.kc = mk(ncache, -1, 1);
		y.vc = mk(ncache, -1, 1);
	}
	ten lnf_w = mk(C, 0.5f, 1.5f), lnf_b = mk(gpt2 ? C : 0, -0.5f, 0.5f), lm_w = mk((size_t)V * C, -sc, sc);
	ten x = mk(C, -1, 1);

	/* the block table: distinct blocks in a random order (some never used), the token at ctx - 1 */
	int32_t bt[MAXBLK], perm[NBLK], pos = ctx - 1, cl = ctx, slot;
	for (int i = 0; i < NBLK; i++)
		perm[i] = i;
	for (int i = NBLK - 1; i > 0; i--) {
		int j = (int)(emu_rnd(&rs) % (uint32_t)(i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int i = 0; i < MAXBLK; i++)
		bt[i] = perm[i];
	slot = bt[pos / BS] * BS + pos % BS;

	/* the CPU reference: lib/model/model.c's fused decode path op by op, each act output rounded to bf16
	 * where the kernel stores it */
	float *rx = new float[C], *rxn = new float[C], *rq = new float[QKV], *ratt = new float[AD], *rt = new float[C];
	float *rfc = new float[FC], *rh = new float[H], *rlog = new float[V], mean, rstd;
	float *rkc[2], *rvc[2];
	memcpy(rx, x.f, C * 4);
	for (int l = 0; l < L; l++) {
		lay &y = ly[l];
		rkc[l] = new float[ncache];
		rvc[l] = new float[ncache];
		memcpy(rkc[l], y.kc.f, ncache * 4);
		memcpy(rvc[l], y.vc.f, ncache * 4);
		if (gpt2)
			rl_cpu_layernorm_fwd(NULL, rxn, &mean, &rstd, rx, y.ln1_w.f, y.ln1_b.f, 1, C, eps);
		else
			rl_cpu_rmsnorm_fwd(NULL, rxn, &rstd, rx, y.ln1_w.f, 1, C, eps);
		rnd(rxn, C);
		rl_cpu_matmul_fwd(NULL, rq, rxn, y.qkv_w.f, y.qkv_b.f, 1, C, QKV);
		rnd(rq, QKV);
		if (!gpt2) {
			rl_cpu_rope_fwd(NULL, rq, &pos, 1, NH, NKV, HD, rope);
			rnd(rq, QKV);
		}
		rl_cpu_kv_write(NULL, rkc[l], rvc[l], rq, &slot, 1, NH, NKV, HD);
		rl_cpu_attn_decode(NULL, ratt, rq, rkc[l], rvc[l], bt, &cl, 1, NH, NKV, HD, BS, MAXBLK);
		rnd(ratt, AD);
		rl_cpu_matmul_fwd(NULL, rt, ratt, y.o_w.f, gpt2 ? y.o_b.f : NULL, 1, AD, C);
		rnd(rt, C);
		rl_cpu_add(NULL, rx, rx, rt, C);
		rnd(rx, C);
		if (gpt2)
			rl_cpu_layernorm_fwd(NULL, rxn, &mean, &rstd, rx, y.ln2_w.f, y.ln2_b.f, 1, C, eps);
		else
			rl_cpu_rmsnorm_fwd(NULL, rxn, &rstd, rx, y.ln2_w.f, 1, C, eps);
		rnd(rxn, C);
		rl_cpu_matmul_fwd(NULL, rfc, rxn, y.fc_w.f, gpt2 ? y.fc_b.f : NULL, 1, C, FC);
		rnd(rfc, FC);
		if (gpt2)
			rl_cpu_gelu_fwd(NULL, rh, rfc, H);
		else
			rl_cpu_swiglu_fwd(NULL, rh, rfc, 1, H);
		rnd(rh, H);
		rl_cpu_matmul_fwd(NULL, rt, rh, y.proj_w.f, gpt2 ? y.proj_b.f : NULL, 1, H, C);
		rnd(rt, C);
		rl_cpu_add(NULL, rx, rx, rt, C);
		rnd(rx, C);
	}
	if (gpt2)
		rl_cpu_layernorm_fwd(NULL, rxn, &mean, &rstd, rx, lnf_w.f, lnf_b.f, 1, C, eps);
	else
		rl_cpu_rmsnorm_fwd(NULL, rxn, &rstd, rx, lnf_w.f, 1, C, eps);
	rnd(rxn, C);
	rl_cpu_matmul_fwd(NULL, rlog, rxn, lm_w.f, NULL, 1, C, V);
	rnd(rlog, V);

	/* the kernel's buffers, twice: the stage-by-stage run (1) and the whole kernel in one block (2);
	 * outputs, scratch and the partials poisoned (NaN) */
	size_t nws = (size_t)B * NH * nsplit * (HD + 2);
	bf16 *x1 = new bf16[C], *x2 = new bf16[C], *qkv = new bf16[QKV], *att = new bf16[AD], *hh = new bf16[H];
	bf16 *lg1 = new bf16[V], *lg2 = new bf16[V], *kc1[2], *vc1[2], *kc2[2], *vc2[2];
	float *ws = new float[nws + 4];
	unsigned cnt[8] = { 0 }, bar[2] = { 0, 0 };
	rlk_step_layer tab[2];
	for (size_t i = 0; i < nws + 4; i++)
		ws[i] = NAN;
	for (int l = 0; l < L; l++) {
		lay &y = ly[l];
		kc1[l] = new bf16[ncache];
		vc1[l] = new bf16[ncache];
		kc2[l] = new bf16[ncache];
		vc2[l] = new bf16[ncache];
		memcpy(kc1[l], y.kc.d, ncache * 2);
		memcpy(vc1[l], y.vc.d, ncache * 2);
		memcpy(kc2[l], y.kc.d, ncache * 2);
		memcpy(vc2[l], y.vc.d, ncache * 2);
		tab[l] = { y.ln1_w.d, gpt2 ? y.ln1_b.d : NULL, y.qkv_w.d, y.qkv_b.d, y.o_w.d, gpt2 ? y.o_b.d : NULL,
		    y.ln2_w.d, gpt2 ? y.ln2_b.d : NULL, y.fc_w.d, gpt2 ? y.fc_b.d : NULL, y.proj_w.d,
		    gpt2 ? y.proj_b.d : NULL, kc1[l], vc1[l] };
	}
	memcpy(x1, x.d, C * 2);
	memcpy(x2, x.d, C * 2);
	for (int i = 0; i < QKV; i++)
		qkv[i].h = 0x7fc1;
	for (int i = 0; i < AD; i++)
		att[i].h = 0x7fc1;
	for (int i = 0; i < H; i++)
		hh[i].h = 0x7fc1;
	for (int i = 0; i < V; i++)
		lg1[i].h = lg2[i].h = 0x7fc1;
	rlk_step s = { L, C, NH, NKV, HD, H, V, gpt2, eps, rope, BS, MAXBLK, tab, lnf_w.d, gpt2 ? lnf_b.d : NULL,
	    lm_w.d, x1, qkv, att, hh, lg1, ws, cnt, bar, nsplit };
	s.split_keys = keys;
	SA = { s, &pos, &slot, bt, &cl, B };
	s_HD = HD;
	s_G = G;
	emu_block_shuffle = 1;
	for (s_stage = 0; s_stage <= 5 * L; s_stage++)
		emu_launch(dim3((unsigned)nblk), dim3(ST_WARPS * 32), run_stage, NULL);
	emu_block_shuffle = 0;
	int cbad = 0;
	for (int i = 0; i < B * NKV; i++)
		cbad += cnt[i] != 0;

	/* the whole kernel over 4 blocks at once, on its own copies (its dynamic shared memory, the
	 * launcher's max(C bf16, attention's arrays), within a block's part of the emulator's) */
	for (int l = 0; l < L; l++) {
		tab[l].kc = kc2[l];
		tab[l].vc = vc2[l];
	}
	SA.s.x = x2;
	SA.s.logits = lg2;
	ST_EMU(ST_SM);
	if (s_sm < (size_t)C * 2)
		s_sm = (size_t)C * 2;
	if (s_sm > EMU_DYN_SMEM / 4) {
		fprintf(stderr, "emu_step: %zu bytes of shared memory a block, more than the emulator's\n", s_sm);
		abort();
	}
	/* with the stage profile (launch.h: RLK_STEP_PROF_U64): after the launch, one launch counted,
	 * every stage kind's span and the whole launch positive (the emulator's clock ticks at every
	 * read), the stamps set back for the next launch */
	const int ns = 5 * L;
	std::vector<unsigned long long> prof(RLK_STEP_PROF_U64(L), 0);
	for (int k = 0; k < ns + 2; k++)
		prof[4 * k + 1] = prof[4 * k + 2] = ~0ull;
	SA.s.prof = prof.data();
	emu_launch_coop(dim3(4), dim3(ST_WARPS * 32), run_kernel, NULL);
	SA.s.prof = NULL;
	const unsigned long long *acc = prof.data() + 4 * (ns + 2);
	int pbad = acc[25] != 1 || acc[24] == 0 || (long long)acc[24] < 0 || acc[26] != 0 || acc[27] == 0;
	for (int kind = 0; kind < 6; kind++)
		pbad += acc[4 * kind] == 0 || (long long)acc[4 * kind] < 0 || (long long)acc[4 * kind + 1] < 0;
	for (int k = 0; k < ns + 2; k++)
		pbad += prof[4 * k] != 0 || prof[4 * k + 1] != ~0ull || prof[4 * k + 2] != ~0ull || prof[4 * k + 3] != 0;
	for (int i = 0; i < B * NKV; i++)
		cbad += cnt[i] != 0;
	int barbad = bar[0] != 0 || bar[1] != 0 || pbad;
	int same = memcmp(x1, x2, C * 2) == 0 && memcmp(lg1, lg2, V * 2) == 0;
	for (int l = 0; l < L; l++)
		same = same && memcmp(kc1[l], kc2[l], ncache * 2) == 0 && memcmp(vc1[l], vc2[l], ncache * 2) == 0;

	/* Tolerance.  Both sides round to bf16 at the same points, so they differ only by the order of
	 * the f32 sums (norm statistics, products, attention's splits and warps): a value lands
	 * within an f32 ulp or so of the reference's, and once in a while its rounding goes to the
	 * neighbouring bf16 value (2^-8 relative).  Such a flip in x, xn, qkv, att or h moves what
	 * follows by 2^-8 of one term of a sum over 128 or more terms.  So the outputs stay within
	 * about a bf16 ulp: atol 2^-7 max|ref| + rtol 2^-7 per value, the normalised MSE under 1e-5
	 * (an index, layout or missing-op error is off by the values' own size).  Observed at these
	 * sizes: 0 (every rounding agrees). */
	double worst = 0, nmse = 0, mx = 0, mxx = 0;
	for (int i = 0; i < V; i++)
		mx = fmax(mx, fabs(rlog[i]));
	for (int i = 0; i < C; i++)
		mxx = fmax(mxx, fabs(rx[i]));
	size_t bad = bad_count(lg1, rlog, V, mx / 128, 1.0 / 128, &worst, &nmse);
	double xworst = 0, xnmse = 0;
	size_t xbad = bad_count(x1, rx, C, mxx / 128, 1.0 / 128, &xworst, &xnmse);
	/* the cache: the slot's rows of every layer within the same tolerance, every other row
	 * untouched (the same bits as before the launch) */
	size_t kbad = 0, other = 0;
	double kworst = 0, knmse = 0;
	for (int l = 0; l < L; l++) {
		lay &y = ly[l];
		size_t o = (size_t)slot * row;
		double m = 0;
		for (size_t i = 0; i < row; i++)
			m = fmax(m, fmax(fabs(rkc[l][o + i]), fabs(rvc[l][o + i])));
		kbad += bad_count(kc1[l] + o, rkc[l] + o, row, m / 128, 1.0 / 128, &kworst, &knmse);
		kbad += bad_count(vc1[l] + o, rvc[l] + o, row, m / 128, 1.0 / 128, &kworst, &knmse);
		for (size_t i = 0; i < ncache; i++)
			if ((i < o || i >= o + row) && (kc1[l][i].h != y.kc.d[i].h || vc1[l][i].h != y.vc.d[i].h))
				other++;
	}
	int fail = bad || xbad || kbad || other || cbad || barbad || !same || !(nmse <= 1e-5) ||
	    !(xnmse <= 1e-5) || !(knmse <= 1e-5);
	cases++;
	fails += fail;
	printf("%s step %s C=%d NH=%d NKV=%d HD=%d H=%d V=%d ctx=%d nsplit=%d keys=%d blocks=%d: logits max err %.3g "
	    "(max %.3g) nmse %.2g, x %.3g, cache rows %.3g; whole kernel on 4 blocks same bits: %s\n", fail ? "FAIL" : "ok  ",
	    gpt2 ? "gpt2" : l3 ? "llama3" : "qwen", C, NH, NKV, HD, H, V, ctx, nsplit, keys, nblk, worst, mx, nmse, xworst, kworst,
	    same ? "yes" : "NO");
	if (fail)
		printf("     bad: %zu logits, %zu x, %zu cache values at the slot, %zu elsewhere; %d counters, barrier (and profile) %s, "
		    "nmse x %.2g cache %.2g\n", bad, xbad, kbad, other, cbad, barbad ? "NOT 0" : "0", xnmse, knmse);

	for (int l = 0; l < L; l++) {
		lay &y = ly[l];
		ten *t[] = { &y.ln1_w, &y.ln1_b, &y.qkv_w, &y.qkv_b, &y.o_w, &y.o_b, &y.ln2_w, &y.ln2_b, &y.fc_w, &y.fc_b,
		    &y.proj_w, &y.proj_b, &y.kc, &y.vc };
		for (ten *p : t)
			rm(*p);
		delete[] rkc[l]; delete[] rvc[l]; delete[] kc1[l]; delete[] vc1[l]; delete[] kc2[l]; delete[] vc2[l];
	}
	rm(lnf_w); rm(lnf_b); rm(lm_w); rm(x);
	delete[] rx; delete[] rxn; delete[] rq; delete[] ratt; delete[] rt; delete[] rfc; delete[] rh; delete[] rlog;
	delete[] x1; delete[] x2; delete[] qkv; delete[] att; delete[] hh; delete[] lg1; delete[] lg2; delete[] ws;
}

/* ---- the barrier alone, all blocks at once ------------------------------------------------------- */
struct bar_args {
	unsigned *bar;
	int *stamp, nstage, skip, early;
};
static bar_args BA;

/* block b reaches barrier k after 8 ((b + k) % 4) extra block barriers, each a scheduling round
 * of the fibers (the blocks arrive in other orders at every barrier, 8 rounds apart), and stamps k;
 * after the barrier every block's stamp must be k or more.
 * BA.skip: block 1 leaves barrier 2 out (a grid that must not pass). */
static void
run_bar(void *)
{
	const unsigned nb = gridDim.x;
	const int b = (int)blockIdx.x;
	for (int k = 1; k <= BA.nstage; k++) {
		for (int i = 0; i < 8 * ((b + k) % 4); i++)
			__syncthreads();
		if (threadIdx.x == 0)
			BA.stamp[b] = k;
		if (BA.skip && b == 1 && k == 2)
			continue;
		st_grid_sync(BA.bar, (unsigned)k * nb);
		if (threadIdx.x % 64 == 0)
			for (unsigned j = 0; j < nb; j++)
				BA.early += BA.stamp[j] < k;
	}
	st_grid_end(BA.bar, nb);
}

static void
test_barrier(void)
{
	unsigned bar[2] = { 0, 0 };
	int stamp[4] = { 0, 0, 0, 0 }, zero = 1;
	BA = { bar, stamp, 7, 0, 0 };
	for (int r = 0; r < 2; r++) {
		emu_launch_coop(dim3(4), dim3(256), run_bar, NULL);
		zero = zero && bar[0] == 0 && bar[1] == 0;
	}
	int ok = BA.early == 0 && zero;
	cases++;
	fails += !ok;
	printf("%s barrier: 4 blocks x 256 threads at once, 7 barriers, twice: %d early leaves, counters %s\n",
	    ok ? "ok  " : "FAIL", BA.early, zero ? "0 after each launch" : "NOT 0");

	/* one block skips a barrier: the others must wait forever (the emulator reports the deadlock) */
	fflush(stdout);
	pid_t p = fork();
	if (p == 0) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, 2);
		bar[0] = bar[1] = 0;
		BA = { bar, stamp, 4, 1, 0 };
		emu_launch_coop(dim3(4), dim3(256), run_bar, NULL);
		_exit(0);  /* passed a barrier a block never reached */
	}
	int st = 0;
	ok = p > 0 && waitpid(p, &st, 0) == p && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
	cases++;
	fails += !ok;
	printf("%s barrier: a block that skips a barrier stops the grid (deadlock reported): %s\n", ok ? "ok  " : "FAIL",
	    ok ? "yes" : "NO");
}

/* argument "quick" (run.sh with a sanitized library): the five step cases marked q and the barrier */
int
main(int argc, char **argv)
{
	const int all = !(argc > 1 && strcmp(argv[1], "quick") == 0);
	/* GPT-2's shape: context 1 (the new token alone), 77 (5 blocks) with 3 splits, 300 (19 blocks,
	 * 10 chunks of 32 keys over 8 warps: a second round) with 1, the whole cache with 32 */
	if (all)
		test_step(1, 128, 2, 2, 64, 512, 257, 1, 1, 3);
	test_step(1, 128, 2, 2, 64, 512, 257, 77, 3, 5);  /* q */
	if (all)
		test_step(1, 128, 2, 2, 64, 512, 257, 300, 1, 4);
	test_step(1, 128, 2, 2, 64, 512, 257, 320, 32, 7);  /* q */
	/* Qwen2's: G 7 at HD 64 (Qwen2.5-0.5B's group), G 2 at HD 128; C 128 < NH HD = 448 */
	if (all) {
		test_step(0, 128, 7, 1, 64, 160, 300, 50, 1, 4);
		test_step(0, 128, 7, 1, 64, 160, 300, 100, 3, 6);
	}
	test_step(0, 128, 7, 1, 64, 160, 300, 257, 32, 5);  /* q */
	if (all)
		test_step(0, 256, 4, 2, 128, 192, 301, 33, 1, 5);
	test_step(0, 256, 4, 2, 128, 192, 301, 97, 3, 3);  /* q */
	if (all)
		test_step(0, 256, 4, 2, 128, 192, 301, 300, 32, 9);
	/* splits by context (split_keys): 320 keys at 64 a split use 5 of the 32; 77 at 256 one
	 * (no merge); Qwen's 257 and 300 at 256 two */
	test_step(1, 128, 2, 2, 64, 512, 257, 320, 32, 7, 64);  /* q */
	if (all) {
		test_step(1, 128, 2, 2, 64, 512, 257, 77, 3, 5, 256);
		test_step(0, 128, 7, 1, 64, 160, 300, 257, 32, 5, 256);
		test_step(0, 256, 4, 2, 128, 192, 301, 300, 32, 9, 256);
	}
	/* Llama 3's scaled RoPE (l3) */
	test_step(0, 128, 7, 1, 64, 160, 300, 257, 32, 5, 0, 1);  /* q */
	if (all)
		test_step(0, 256, 4, 2, 128, 192, 301, 300, 3, 9, 0, 1);
	test_barrier();
	printf("emu_step%s: %d of %d cases passed\n", emu_skew ? " (skew)" : "", cases - fails, cases);
	return fails ? 1 : 0;
}

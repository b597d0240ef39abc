/*
 * ops_cuda.c — the CUDA backend: the rl_ops table over kernels/launch.h and
 * cuBLASLt.  Activations and compute weights are bf16 (act_dtype RL_BF16);
 * master weights, gradients, optimizer state and statistics f32.  All work is
 * queued on one stream owned by the backend; the first failure is recorded
 * (sticky) and returned by status()/sync().
 *
 * GEMMs: cuBLASLt, bf16 operands, fp32 accumulation; the forward adds the bias
 * in the GEMM epilogue; weight gradients are accumulated straight into the
 * f32 gradient buffer (beta = 1).  Heuristic results are cached per shape.
 * Attention scratch (see kernels/attn.cu) grows to the largest size asked for
 * and is then reused, so a training step allocates nothing after the first.
 *
 * Graphs (the decode step, see docs/cuda.md): stream capture in thread-local mode
 * on the backend's stream, instantiated once and replayed with cudaGraphLaunch.
 * Scratch buffers that grow (GEMM padding, attention workspace) bump an epoch;
 * a graph recorded under an older epoch reports itself stale (graph_ok) so the
 * caller records it again.  RL_CUDA_GRAPH=0 leaves the graph hooks NULL.
 *
 * Leaves out: multi-GPU (comm.h).
 */
#if HAVE_CUDA
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include "base/core.h"
#include "compute/ops.h"
#include "kernels/launch.h"

#define LT_WS_BYTES ((size_t)32 << 20)
#define ATTN_WS_CAP ((size_t)3 << 30)  /* largest attention scratch before chunking rows */
/* cuBLASLt heuristic results, hashed by shape: a decode graph must find every GEMM's
 * algorithm here when it is recorded (a heuristic query while the stream is being
 * captured is not safe: some cuBLASLt versions fail it), and an engine runs up to a
 * few hundred batch sizes of ~6 GEMM shapes each, so the table holds thousands. */
#define ALGO_CACHE 8192   /* a power of two */
#define ALGO_PROBE 16

typedef struct algo_key {
	int ta, tb, m, n, k, lda, ldb, ldd, dt, epi;
	int al_a, al_b, al_d;  /* pointer alignments: an algorithm assumes those it was chosen for */
	int ldaux, al_aux;     /* GELU epilogues' auxiliary matrix */
	int al_c;              /* C's alignment when C is not D (matmul_add_fwd), else 0 */
} algo_key;

typedef struct algo_ent {
	algo_key key;
	cublasLtMatmulAlgo_t algo;
	int used;
	int nosup;             /* the bias-gradient epilogue: cuBLASLt had no algorithm or an error
	                        * for this key (asked once; the caller takes the column-sum kernel) */
} algo_ent;

enum { DK_AUTO, DK_LANE, DK_SPLIT, DK_V1, DK_WIDE };  /* decode attention kernels (RL_CUDA_DECODE_ATTN) */
enum { HL_OFF, HL_SPLIT };        /* strided LM head (RL_CUDA_HEAD_LD) */
enum { BG_OFF, BG_ON, BG_STRICT };  /* bias gradients in the dW GEMM's epilogue (RL_CUDA_BGRAD) */

#define STEP_TABS 64  /* decode_step's layer tables kept (one per weights and cache binding) */

typedef struct cuda_ctx {
	cudaStream_t stream;
	cublasLtHandle_t lt;
	cublasHandle_t blas;
	void *lt_ws;
	void *attn_ws;
	size_t attn_ws_bytes;
	double *dsum;          /* device scalar for sumsq */
	void *pad;             /* GEMM operand/result with a padded leading dimension */
	size_t pad_bytes;
	void *acc;             /* f32 partial sums of a split GEMM */
	size_t acc_bytes;
	int prof;              /* RL_CUDA_PROFILE set: time every op (synchronising) */
	int flash;             /* flash attention forward: RL_CUDA_ATTN=flash (see docs/cuda.md) */
	int flash2;            /* mma.sync flash attention fwd + bwd, the default (kernels/flash2.cu) */
	int f2_bwd;            /* flash2 backward: RLK_F2_BWD_* (RL_CUDA_FLASH_BWD=det|fused|...) */
	void *fa2_ws;          /* flash2 backward: D = rowsum(dO * O) (B, NH, T) f32, dK/dV partials,
	                        * the fused modes' f32 dQ accumulator */
	size_t fa2_ws_bytes;
	int gelu_fuse;         /* RL_CUDA_GELU_FUSE=1: bias + GELU (and its gradient) in GEMM epilogues */
	int gelu_nosup;        /* cuBLASLt had no algorithm for a GELU epilogue: fall back from then on */
	int no_gemv;           /* RL_CUDA_GEMV=0: matmul_fwd of <= 4 rows through cuBLASLt too */
	int head_ld;           /* RL_CUDA_HEAD_LD: HL_SPLIT (unset, =split, =1), =0 (off) */
	int no_fuse;           /* RL_CUDA_DECODE_FUSE=0: none of fuse.cu's ops (matmul_fused_fwd, ...) */
	int decode_kind;       /* RL_CUDA_DECODE_ATTN: DK_AUTO (unset), =lane / =split / =wide (that
	                        * decode.cu kernel always), =v1 (attn.cu's kernel only) */
	int nsm;               /* multiprocessors */
	void *dec_ws;          /* split decode attention partials */
	size_t dec_ws_bytes;
	void *dec_cnt;         /* its per-(sequence, KV head) counters (the merge in the kernel): zeroed */
	size_t dec_cnt_bytes;  /* when allocated, left 0 by every launch */
	int dec_merge_sep;     /* RL_CUDA_DECODE_MERGE=0: the splits merged by a second kernel */
	int dec_splits;        /* most splits per (sequence, KV head): RL_CUDA_DECODE_SPLITS, else 32 */
	int smp_split;         /* sample: rows split over blocks up to this B (RL_CUDA_SAMPLE_SPLIT; 0 never) */
	void *smp_ws;          /* its per-range partials */
	size_t smp_ws_bytes;
	void *smp_cnt;         /* its per-row counters: zeroed when allocated, left 0 by every launch */
	size_t smp_cnt_bytes;
	int dec_step;          /* RL_CUDA_DECODE_STEP=1: decode_step, the step in one kernel (kernels/step.cu) */
	int bgrad;             /* RL_CUDA_BGRAD: BG_OFF (unset, =0), BG_ON (=1), BG_STRICT (=strict) */
	int bgrad_warned;      /* said once that cuBLASLt took no bias-gradient epilogue */
	float *bg;             /* the epilogue's bias gradient (OC) f32, then added into dbias */
	size_t bg_bytes;
	struct step_tab { rl_step_layer *h; void *d; int n; } stab[STEP_TABS];  /* its layer tables */
	int nstab;
	void *stp_ws;          /* its attention partials */
	size_t stp_ws_bytes;
	unsigned *stp_cnt;     /* its barrier counters (2) then merge counters: zeroed when allocated, */
	size_t stp_cnt_bytes;  /* left 0 by every launch */
	int dec_keys;          /* RL_CUDA_DECODE_SPLIT_KEYS: keys a split of decode attention takes */
	int stp_grid;          /* RL_CUDA_STEP_GRID: its blocks at most (0: every resident one) */
	int stp_keys;          /* RL_CUDA_STEP_SPLIT_KEYS: keys an attention split takes at least */
	int stp_bar;           /* RL_CUDA_STEP_BAR: its barrier's poll (RLK_STEP_BAR_*) */
	int stp_prof;          /* RL_CUDA_STEP_PROFILE=1: its stage timings (launch.h), said at close */
	int stp_plain;         /* RL_CUDA_STEP_COOP=0: an ordinary launch (diagnostics) */
	unsigned long long *stp_pd;  /* their device buffer, for stp_pl layers */
	int stp_pl;
	unsigned epoch;        /* bumped whenever a scratch buffer moves (graphs recorded before are stale) */
	int capturing;         /* between graph_begin and graph_end */
	/* adamw_multi: the chunk tables of the last few segment tables (RL_CUDA_ADAMW_MULTI=0: off) */
	struct adam_plan { rl_adamw_seg *seg; int nseg; rlk_adamw_chunk *dch; int nch; unsigned long used; } adam[4];
	unsigned long adam_tick;
	struct { const char *name; double s; long n; } pt[64];
	int npt;
	int status;
	algo_ent algos[ALGO_CACHE];   /* open addressing, ALGO_PROBE slots from the key's hash */
} cuda_ctx;

#define CTX(o) ((cuda_ctx *)(o)->ctx)

static void
fail(rl_ops *o, const char *what, const char *detail)
{
	cuda_ctx *c = CTX(o);
	if (c->status == RL_OK) {
		rl_error("cuda: %s failed: %s", what, detail);
		c->status = RL_EDEVICE;
	}
}

static void
ck(rl_ops *o, const char *what, int e)
{
	if (e == 0)
		return;
	if (e < 0) {
		char b[64];
		snprintf(b, sizeof b, "cublas status %d", -e);
		fail(o, what, b);
	} else {
		fail(o, what, cudaGetErrorString((cudaError_t)e));
	}
}

#define S(o) ((void *)CTX(o)->stream)
static cudaError_t cu_alloc_raw(void **p, size_t bytes);

/* ---- optional per-op profile (RL_CUDA_PROFILE=1): synchronises around every op
 * and prints a table of total ms per op at close. */
static double
prof_t0(rl_ops *o)
{
	if (!CTX(o)->prof)
		return 0;
	cudaStreamSynchronize(CTX(o)->stream);
	return rl_now();
}

static void
prof_add(rl_ops *o, const char *name, double t0)
{
	cuda_ctx *c = CTX(o);
	if (!c->prof)
		return;
	cudaStreamSynchronize(c->stream);
	double dt = rl_now() - t0;
	int i;
	for (i = 0; i < c->npt; i++)
		if (c->pt[i].name == name)
			break;
	if (i == c->npt) {
		if (c->npt == (int)RL_ARRAY_LEN(c->pt))
			return;
		c->npt++;
		c->pt[i].name = name;
	}
	c->pt[i].s += dt;
	c->pt[i].n++;
}

/* ck with timing: every op wrapper goes through it */
#define CKP(o, name, expr) do { double t_ = prof_t0(o); ck((o), (name), (expr)); prof_add((o), (name), t_); } while (0)

/* The padded scratch for GEMMs whose row length is not a multiple of 8 elements
 * (16 bytes): cuBLASLt's fast kernels need aligned leading dimensions. */
static void *
grow_buf(rl_ops *o, void **buf, size_t *have, size_t bytes)
{
	cuda_ctx *c = CTX(o);
	if (*have >= bytes)
		return *buf;
	if (c->capturing) {
		/* a graph must not allocate: the caller runs the ops once without one first */
		fail(o, "scratch growth during graph capture", "not allowed");
		return NULL;
	}
	c->epoch++;
	if (*buf) {
		cudaStreamSynchronize(c->stream);
		cudaFree(*buf);
		*buf = NULL;
		*have = 0;
	}
	if (cu_alloc_raw(buf, bytes) != cudaSuccess) {
		rl_error("cuda: cannot allocate %zu bytes of GEMM scratch", bytes);
		if (c->status == RL_OK)
			c->status = RL_ENOMEM;
		*buf = NULL;
		return NULL;
	}
	*have = bytes;
	return *buf;
}

static void *
pad_buf(rl_ops *o, size_t bytes)
{
	return grow_buf(o, &CTX(o)->pad, &CTX(o)->pad_bytes, bytes);
}

/* ---- memory and control ------------------------------------------------------------ */
static cudaError_t
cu_alloc_raw(void **p, size_t bytes)
{
	cudaError_t e = cudaMalloc(p, bytes);
	if (e != cudaSuccess)
		cudaGetLastError();
	return e;
}

static int
cu_alloc(rl_ops *o, void **p, size_t bytes)
{
	*p = NULL;
	if (bytes == 0)
		bytes = 1;
	cudaError_t e = cudaMalloc(p, bytes);
	if (e != cudaSuccess) {
		rl_error("cuda: cannot allocate %zu bytes on device %d: %s", bytes, o->device,
		    cudaGetErrorString(e));
		cudaGetLastError();
		*p = NULL;
		return RL_ENOMEM;
	}
	return RL_OK;
}

static void
cu_free(rl_ops *o, void *p)
{
	if (p)
		ck(o, "cudaFree", (int)cudaFree(p));
}

static void
cu_upload(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	ck(o, "upload", (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CTX(o)->stream));
	ck(o, "upload", (int)cudaStreamSynchronize(CTX(o)->stream));
}

static void
cu_download(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	ck(o, "download", (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CTX(o)->stream));
	ck(o, "download", (int)cudaStreamSynchronize(CTX(o)->stream));
}

static void
cu_copy(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (bytes && dst != src)
		ck(o, "copy", (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(o)->stream));
}

static void
cu_zero(rl_ops *o, void *p, size_t bytes)
{
	if (bytes)
		ck(o, "zero", (int)cudaMemsetAsync(p, 0, bytes, CTX(o)->stream));
}

static void
cu_cast(rl_ops *o, void *out, int out_dt, const void *in, int in_dt, size_t n)
{
	if ((out_dt != RL_F32 && out_dt != RL_BF16) || (in_dt != RL_F32 && in_dt != RL_BF16)) {
		if (CTX(o)->status == RL_OK) {
			rl_error("cuda: cast from %s to %s is not supported", rl_dtype_name(in_dt),
			    rl_dtype_name(out_dt));
			CTX(o)->status = RL_ENOTSUP;
		}
		return;
	}
	CKP(o, "cast", rlk_cast(S(o), out, out_dt, in, in_dt, n));
}

static int
cu_status(rl_ops *o)
{
	cuda_ctx *c = CTX(o);
	int e = (int)cudaGetLastError();
	if (e)
		ck(o, "asynchronous kernel", e);
	int s = c->status;
	c->status = RL_OK;
	return s;
}

static int
cu_sync(rl_ops *o)
{
	ck(o, "cudaStreamSynchronize", (int)cudaStreamSynchronize(CTX(o)->stream));
	return cu_status(o);
}

/* ---- cuBLASLt GEMM (column-major) -------------------------------------------------- */
/* Largest power of two (at most 256) dividing the address. */
static uint32_t
ptr_align(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	uint32_t al = 256;
	while (al > 1 && (a & (al - 1)))
		al >>= 1;
	return al;
}

/* The cache entry of key (*hit) or, when there is none, the slot to fill (*put: the
 * first free slot of the key's probe sequence, else its first slot, evicted). */
static void
algo_find(cuda_ctx *c, const algo_key *key, algo_ent **hit, algo_ent **put)
{
	const unsigned char *b = (const unsigned char *)key;
	uint32_t h = 2166136261u;  /* FNV-1a */
	for (size_t i = 0; i < sizeof *key; i++)
		h = (h ^ b[i]) * 16777619u;
	*hit = *put = NULL;
	for (int i = 0; i < ALGO_PROBE; i++) {
		algo_ent *e = &c->algos[(h + (uint32_t)i) & (ALGO_CACHE - 1)];
		if (!e->used) {
			*put = e;
			return;
		}
		if (memcmp(&e->key, key, sizeof *key) == 0) {
			*hit = e;
			return;
		}
	}
	*put = &c->algos[h & (ALGO_CACHE - 1)];
}

/* Epilogues of lt_gemm_epi: GELU, its gradient, the bias gradient */
enum { EPI_PLAIN = 0, EPI_GELU_AUX, EPI_DGELU, EPI_BGRADB };

/* D (m x n, ldd, dtype dt) = op(A) (m x k) op(B) (k x n) + beta * D (+ bias (m) bf16).
 * gelu EPI_GELU_AUX: D = gelu(that), aux (m x n, ldaux, bf16) = that (bias added);
 * EPI_DGELU: D = that * gelu'(aux) (no bias);
 * EPI_BGRADB: D as EPI_PLAIN, and bias (n) f32, written (not added to), = the sums of
 * op(B) over k: bias[j] = sum_k op(B)[k][j] (cuBLASLt's CUBLASLT_EPILOGUE_BGRADB, its
 * type that of D).  For EPI_BGRADB any cuBLASLt failure (no algorithm, an attribute
 * refused, the launch refused) is returned and cached for the key, so the next call
 * with it returns CUBLAS_STATUS_NOT_SUPPORTED at once; so is a miss during graph
 * capture (without failing the recording: the caller falls back to the plain GEMM). */
static int
lt_gemm_c(rl_ops *o, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
    int ldb, void *D, int ldd, cudaDataType_t dt, float beta, const void *bias, int gelu, const void *aux,
    int ldaux, const void *Cm)
{
	cuda_ctx *c = CTX(o);
	cublasLtMatmulDesc_t desc = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasStatus_t st;
	int rv = 0;
	float alpha = 1.0f;
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	int has_aux = gelu == EPI_GELU_AUX || gelu == EPI_DGELU, bgrad = gelu == EPI_BGRADB;
	if (gelu == EPI_GELU_AUX)
		epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
	else if (gelu == EPI_DGELU)
		epi = CUBLASLT_EPILOGUE_DGELU;
	else if (bgrad)
		epi = CUBLASLT_EPILOGUE_BGRADB;

	/* The heuristic assumes 256-byte aligned pointers unless told otherwise, and an
	 * algorithm chosen for them can compute garbage on less aligned ones (offsets into
	 * a larger buffer, split GEMMs): pass the real alignments and key the cache on them.
	 * The bias (and the bias gradient: c->bg, a cudaMalloc'd block) is not in the key. */
	uint32_t al_a = ptr_align(A), al_b = ptr_align(B), al_d = ptr_align(D);
	uint32_t al_c = Cm && Cm != D ? ptr_align(Cm) : al_d;
	algo_key key = { ta, tb, m, n, k, lda, ldb, ldd, (int)dt, (int)epi, (int)al_a, (int)al_b, (int)al_d,
		has_aux ? ldaux : 0, has_aux ? (int)ptr_align(aux) : 0,
		Cm && Cm != D ? (int)al_c : 0 };
	algo_ent *ent = NULL, *slot = NULL;
	algo_find(c, &key, &ent, &slot);
	if (ent && ent->nosup)
		return -(int)CUBLAS_STATUS_NOT_SUPPORTED;
	if (!ent && c->capturing) {
		if (bgrad)
			return -(int)CUBLAS_STATUS_NOT_SUPPORTED;
		/* the op-by-op run before a recording fills the cache; a miss here means the
		 * shape was not run outside the capture: fail the recording, not the step */
		fail(o, "GEMM during graph capture", "no cached cuBLASLt algorithm for this shape");
		return -(int)CUBLAS_STATUS_INVALID_VALUE;
	}

#define LT(x) do { st = (x); if (st != CUBLAS_STATUS_SUCCESS) { rv = -(int)st; goto out; } } while (0)
	LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
	LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
	if (epi != CUBLASLT_EPILOGUE_DEFAULT)
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
	if (bias && gelu != EPI_DGELU) {
		/* a bias is bf16 (bf16 D); a bias gradient has D's type (cublasLt.h: "the same
		 * type as the output elements"), f32 here */
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
		cudaDataType_t bt = bgrad ? dt : CUDA_R_16BF;
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
	}
	if (has_aux) {
		int64_t ld64 = ldaux;
		int32_t at = CUDA_R_16BF;
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld64, sizeof ld64));
		LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
	}
	LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
	LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
	LT(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));

	if (!ent) {
		cublasLtMatmulHeuristicResult_t res;
		int nres = 0;
		size_t wsb = LT_WS_BYTES;
		LT(cublasLtMatmulPreferenceCreate(&pref));
		LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
		    sizeof wsb));
		LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
		    sizeof al_a));
		LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
		    sizeof al_b));
		LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
		    sizeof al_c));
		LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
		    sizeof al_d));
		LT(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, ld, ld, pref, 1, &res, &nres));
		if (nres < 1) {
			rv = -(int)CUBLAS_STATUS_NOT_SUPPORTED;
			goto out;
		}
		ent = slot;
		ent->key = key;
		ent->algo = res.algo;
		ent->used = 1;
		ent->nosup = 0;
	}
	LT(cublasLtMatmul(c->lt, desc, &alpha, A, la, B, lb, &beta, Cm ? Cm : D, ld, D, ld, &ent->algo, c->lt_ws,
	    LT_WS_BYTES, c->stream));
out:
#undef LT
	if (rv && bgrad) {
		/* remembered, so the fallback costs one heuristic query per shape */
		if (!ent)
			ent = slot;
		ent->key = key;
		ent->used = 1;
		ent->nosup = 1;
	}
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (la)
		cublasLtMatrixLayoutDestroy(la);
	if (lb)
		cublasLtMatrixLayoutDestroy(lb);
	if (ld)
		cublasLtMatrixLayoutDestroy(ld);
	if (desc)
		cublasLtMatmulDescDestroy(desc);
	return rv;
}

static int
lt_gemm_epi(rl_ops *o, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
    int ldb, void *D, int ldd, cudaDataType_t dt, float beta, const void *bias, int gelu, const void *aux,
    int ldaux)
{
	return lt_gemm_c(o, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, dt, beta, bias, gelu, aux, ldaux, NULL);
}

static int
lt_gemm(rl_ops *o, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
    int ldb, void *D, int ldd, cudaDataType_t dt, float beta, const void *bias)
{
	return lt_gemm_epi(o, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, dt, beta, bias, EPI_PLAIN, NULL, 0);
}

/* Row length padded to a multiple of 8 elements when it is not one and the tensor is
 * big enough for the copy to pay (the LM head: V = 50257, 151936 is fine). */
static int
padded(int n, size_t rows)
{
	if (n % 8 == 0 || (size_t)n * rows < ((size_t)1 << 20))
		return n;
	return (n + 7) & ~7;
}

/* Output features split at a multiple of 64: cuBLASLt's kernels for an odd m (the
 * LM head, V = 50257) run at a fraction of the rate (measured 85 TFLOP/s against
 * 600+ on this H100), so the bulk goes through an aligned GEMM and the few
 * remaining rows through a second, small one. */
static int
split_oc(int OC)
{
	return (OC >= 1024 && OC % 64) ? OC & ~63 : OC;
}

/* out (N, ldo) = inp (N,C) @ w(OC,C)^T + bias, the output features split at M (M == OC:
 * one GEMM).  Column-major view: out^T (OC x N, ld ldo) = op_T(w as C x OC) (OC x C) *
 * inp^T (C x N). */
static void
gemm_fwd_ld(rl_ops *o, void *out, int ldo, const void *inp, const void *w, const void *bias, int N,
    int C, int OC, int M)
{
	char *dst = out;
	ck(o, "matmul_fwd", lt_gemm(o, 1, 0, M, N, C, w, C, inp, C, dst, ldo, CUDA_R_16BF, 0.0f, bias));
	if (M < OC)
		ck(o, "matmul_fwd tail", lt_gemm(o, 1, 0, OC - M, N, C, (const char *)w + (size_t)M * C * 2, C,
		    inp, C, dst + (size_t)M * 2, ldo, CUDA_R_16BF, 0.0f,
		    bias ? (const char *)bias + (size_t)M * 2 : NULL));
}

static int bgrad_tried(rl_ops *o, int r, int N, int C, int OC);

/* dinp (N,C) = dout (N, ldo) @ w (skipped when NULL); dw (OC,C) f32 += dout^T @ inp
 * (skipped when NULL); the output features split at M (M == OC: one GEMM each).
 * bg (OC) f32, when not NULL (and dw not NULL, M == OC): the dw GEMM's epilogue also
 * writes the column sums of dout there; returns 1 when it did, 0 when bg was not
 * written (no such algorithm: the caller sums the columns itself). */
static int
gemm_bwd_ld(rl_ops *o, void *dinp, float *dw, const void *dout, int ldo, const void *inp,
    const void *w, int N, int C, int OC, int M, float *bg)
{
	int done = 0;
	const char *g = dout, *wt = (const char *)w + (size_t)M * C * 2;
	/* dinp^T (C x N) = w^T (C x OC) * dout^T (OC x N), the OC sum split at M */
	if (dinp && M == OC) {
		ck(o, "matmul_bwd dinp", lt_gemm(o, 0, 0, C, N, OC, w, C, g, ldo, dinp, C, CUDA_R_16BF,
		    0.0f, NULL));
	} else if (dinp) {
		/* both parts summed in f32, rounded to bf16 once */
		float *f = grow_buf(o, &CTX(o)->acc, &CTX(o)->acc_bytes, (size_t)N * C * 4);
		if (!f)
			return 0;
		ck(o, "matmul_bwd dinp", lt_gemm(o, 0, 0, C, N, M, w, C, g, ldo, f, C, CUDA_R_32F, 0.0f, NULL));
		ck(o, "matmul_bwd dinp tail", lt_gemm(o, 0, 0, C, N, OC - M, wt, C, g + (size_t)M * 2, ldo, f, C,
		    CUDA_R_32F, 1.0f, NULL));
		ck(o, "matmul_bwd dinp cast", rlk_cast(S(o), dinp, RL_BF16, f, RL_F32, (size_t)N * C));
	}
	/* dw^T (C x OC) += inp^T (C x N) * dout (N x OC), columns split at M.
	 *
	 * The bias gradient in this GEMM (RL_CUDA_BGRAD): cuBLASLt is column-major, so the
	 * row-major dout (N, OC) with row stride ldo is, as cuBLASLt reads it, the OC x N
	 * matrix dout^T (ld ldo), and dw (OC, C) row-major is the C x OC matrix D = dw^T.
	 * The GEMM is m = C, n = OC, k = N: A = inp^T (C x N, op N: the row-major inp
	 * (N, C) read as is), B = op_T(dout^T) = dout (N x OC, k x n).  dout is B, so the
	 * epilogue is BGRADB: "bias size = columns of D (n = OC), reduced over k (N)",
	 * bg[j] = sum_t dout[t][j], the bias gradient.  BGRADA would sum A = inp over the
	 * tokens (C values): not a gradient of anything here.  In the dinp GEMM (m = C,
	 * n = N, k = OC) neither fits: B = dout^T summed over k is a per-token sum. */
	if (dw) {
		int r = -1;
		if (bg && M == OC)
			r = bgrad_tried(o, lt_gemm_epi(o, 0, 1, C, M, N, inp, C, g, ldo, dw, C, CUDA_R_32F, 1.0f, bg,
			    EPI_BGRADB, NULL, 0), N, C, OC);
		if (r == 0)
			done = 1;
		else
			ck(o, "matmul_bwd dw", lt_gemm(o, 0, 1, C, M, N, inp, C, g, ldo, dw, C, CUDA_R_32F, 1.0f,
			    NULL));
		if (M < OC)
			ck(o, "matmul_bwd dw tail", lt_gemm(o, 0, 1, C, OC - M, N, inp, C, g + (size_t)M * 2, ldo,
			    dw + (size_t)M * C, C, CUDA_R_32F, 1.0f, NULL));
	}
	return done;
}

/* out (N,OC) = inp (N,C) @ w(OC,C)^T + bias. */
static void
matmul_fwd_(rl_ops *o, void *out, const void *inp, const void *w, const void *bias, int N, int C,
    int OC)
{
	if (N <= 0 || OC <= 0)
		return;
	if (N <= 4 && !CTX(o)->no_gemv && rlk_gemv_ok(N, C, inp, w)) {
		/* a few rows (decode): one warp per output feature, reading each weight once */
		ck(o, "matmul_fwd gemv", rlk_gemv(S(o), out, inp, w, bias, N, C, OC));
		return;
	}
	int ldo = padded(OC, (size_t)N);
	char *dst = out;
	if (ldo != OC && !(dst = pad_buf(o, (size_t)N * ldo * 2)))
		return;
	gemm_fwd_ld(o, dst, ldo, inp, w, bias, N, C, OC, split_oc(OC));
	if ((void *)dst != out)
		ck(o, "matmul_fwd unpad", (int)cudaMemcpy2DAsync(out, (size_t)OC * 2, dst, (size_t)ldo * 2,
		    (size_t)OC * 2, N, cudaMemcpyDeviceToDevice, CTX(o)->stream));
}

static void
matmul_bwd_(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
    const void *w, int N, int C, int OC)
{
	if (N <= 0)
		return;
	int ldo = padded(OC, (size_t)N);
	const char *g = dout;
	if (ldo != OC && (dinp || dw)) {
		void *pb = pad_buf(o, (size_t)N * ldo * 2);
		if (!pb)
			return;
		ck(o, "matmul_bwd pad", (int)cudaMemcpy2DAsync(pb, (size_t)ldo * 2, dout, (size_t)OC * 2,
		    (size_t)OC * 2, N, cudaMemcpyDeviceToDevice, CTX(o)->stream));
		g = pb;
	}
	/* the bias gradient from the dw GEMM's epilogue (RL_CUDA_BGRAD, see gemm_bwd_ld): one
	 * GEMM over unpadded rows; it writes, so it goes to c->bg and is added to dbias (which
	 * sums micro-batches) by cublasSaxpy, a read of 2 OC floats instead of the column-sum
	 * kernel's read of dout (N x OC bf16) */
	cuda_ctx *c = CTX(o);
	float *bg = NULL;
	int M = split_oc(OC);
	if (c->bgrad != BG_OFF && dbias && dw && ldo == OC && M == OC &&
	    !(bg = grow_buf(o, (void **)&c->bg, &c->bg_bytes, (size_t)RL_MAX(OC, 4096) * 4)))
		return;
	if (gemm_bwd_ld(o, dinp, dw, g, ldo, inp, w, N, C, OC, M, bg)) {
		const float one = 1.0f;
		ck(o, "matmul_bwd dbias add", -(int)cublasSaxpy(c->blas, OC, &one, bg, 1, dbias, 1));
	} else if (dbias) {
		ck(o, "matmul_bwd dbias", rlk_colsum(S(o), dbias, dout, N, OC));
	}
}

/* After the bias-gradient GEMM: r as is (0: it ran).  A failure is said once (with the
 * shape) and the caller falls back to the plain GEMM and the column-sum kernel; under
 * RL_CUDA_BGRAD=strict it is also recorded as the backend's error, so a test sees a
 * shape that cuBLASLt does not take. */
static int
bgrad_tried(rl_ops *o, int r, int N, int C, int OC)
{
	cuda_ctx *c = CTX(o);
	if (r == 0)
		return 0;
	if (c->bgrad == BG_STRICT) {
		char b[96];
		snprintf(b, sizeof b, "cublas status %d for N=%d C=%d OC=%d", -r, N, C, OC);
		fail(o, "matmul_bwd bias-gradient epilogue", b);
	} else if (!c->bgrad_warned) {
		c->bgrad_warned = 1;
		rl_warn("cuda: cuBLASLt took no bias-gradient epilogue for N=%d C=%d OC=%d (status %d); "
		    "the column-sum kernel runs where it does not", N, C, OC, -r);
	}
	return r;
}

static void
cu_matmul_fwd(rl_ops *o, void *out, const void *inp, const void *w, const void *bias, int N, int C,
    int OC)
{
	double t = prof_t0(o);
	matmul_fwd_(o, out, inp, w, bias, N, C, OC);
	prof_add(o, "matmul_fwd", t);
}

/* ops.h matmul_add_fwd: the residual as cuBLASLt's C with beta 1, so the GEMM's f32 sum,
 * the bias and the residual are rounded once and the add kernel's pass over out goes;
 * shapes the plain GEMM path would pad, split or run as a gemv, and pointers under 16-byte
 * alignment, take matmul_fwd then add. */
static void
cu_matmul_add_fwd(rl_ops *o, void *out, const void *inp, const void *w, const void *bias, const void *resid,
    int N, int C, int OC)
{
	double t = prof_t0(o);
	if (N > 4 && OC > 0 && OC % 8 == 0 && split_oc(OC) == OC && ptr_align(out) >= 16 && ptr_align(resid) >= 16 &&
	    ptr_align(inp) >= 16 && ptr_align(w) >= 16) {
		ck(o, "matmul_add_fwd", lt_gemm_c(o, 1, 0, OC, N, C, w, C, inp, C, out, OC, CUDA_R_16BF, 1.0f, bias,
		    EPI_PLAIN, NULL, 0, resid));
	} else if (N > 0 && OC > 0) {
		matmul_fwd_(o, out, inp, w, bias, N, C, OC);
		ck(o, "matmul_add_fwd add", rlk_add(S(o), out, out, resid, (size_t)N * OC));
	}
	prof_add(o, "matmul_add_fwd", t);
}

static void
cu_matmul_bwd(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
    const void *w, int N, int C, int OC)
{
	double t = prof_t0(o);
	matmul_bwd_(o, dinp, dw, dbias, dout, inp, w, N, C, OC);
	prof_add(o, "matmul_bwd", t);
}

/* The strided LM head (ops.h, matmul_fwd_ld and the rest): the logits' row stride is
 * already aligned (V rounded up to HEAD_LD_ALIGN), so the GEMMs read and write them in
 * place, with no padded scratch and no copy.  The output features are still split at a
 * multiple of 64 as in matmul_fwd_: with one GEMM each (the odd OC as the GEMM's m or
 * k) the whole GPT-2 head step takes 26.9 ms against 7.3 on the H100, and the odd-k
 * dinp GEMM rounds worse. */
#define HEAD_LD_ALIGN 64

static int
head_ld_bad(rl_ops *o, const char *what, int ld, int V)
{
	if (ld >= V)
		return 0;
	char b[64];
	snprintf(b, sizeof b, "row stride %d below %d", ld, V);
	fail(o, what, b);
	return 1;
}

static int
head_split(rl_ops *o, int OC)
{
	(void)o;
	return split_oc(OC);
}

static void
cu_matmul_fwd_ld(rl_ops *o, void *out, int ld, const void *inp, const void *w, int N, int C, int OC)
{
	double t = prof_t0(o);
	if (N > 0 && OC > 0 && !head_ld_bad(o, "matmul_fwd_ld", ld, OC))
		gemm_fwd_ld(o, out, ld, inp, w, NULL, N, C, OC, head_split(o, OC));
	prof_add(o, "matmul_fwd_ld", t);
}

static void
cu_matmul_bwd_ld(rl_ops *o, void *dinp, float *dw, const void *dout, int ld, const void *inp,
    const void *w, int N, int C, int OC)
{
	double t = prof_t0(o);
	if (N > 0 && OC > 0 && !head_ld_bad(o, "matmul_bwd_ld", ld, OC))
		gemm_bwd_ld(o, dinp, dw, dout, ld, inp, w, N, C, OC, head_split(o, OC), NULL);
	prof_add(o, "matmul_bwd_ld", t);
}

/* GELU epilogues: the shapes they take (no split or padded output, 16-byte rows and
 * pointers); anything else goes through the plain GEMM and the GELU kernels. */
static int
gelu_epi_ok(int OC, int rows_len, size_t N, const void *a, const void *b, const void *c)
{
	return OC == split_oc(OC) && padded(OC, N) == OC && OC % 8 == 0 && rows_len % 8 == 0 &&
	    ptr_align(a) >= 16 && ptr_align(b) >= 16 && ptr_align(c) >= 16;
}

static void
gelu_tried(rl_ops *o, int r)
{
	if (r == -(int)CUBLAS_STATUS_NOT_SUPPORTED && !CTX(o)->gelu_nosup) {
		CTX(o)->gelu_nosup = 1;
		rl_warn("cuda: cuBLASLt has no algorithm for a GELU epilogue here; GELU runs as its own kernel");
	}
}

static void
cu_matmul_gelu_fwd(rl_ops *o, void *h, void *pre, const void *inp, const void *w, const void *bias, int N,
    int C, int OC)
{
	double t = prof_t0(o);
	int r = -(int)CUBLAS_STATUS_NOT_SUPPORTED;
	if (N > 0 && OC > 0 && !CTX(o)->gelu_nosup && gelu_epi_ok(OC, C, (size_t)N, h, pre, inp))
		gelu_tried(o, r = lt_gemm_epi(o, 1, 0, OC, N, C, w, C, inp, C, h, OC, CUDA_R_16BF, 0.0f, bias,
		    EPI_GELU_AUX, pre, OC));
	if (r != -(int)CUBLAS_STATUS_NOT_SUPPORTED) {
		ck(o, "matmul_gelu_fwd", r);
	} else {
		matmul_fwd_(o, pre, inp, w, bias, N, C, OC);
		ck(o, "matmul_gelu_fwd gelu", rlk_gelu_fwd(S(o), h, pre, (size_t)N * OC));
	}
	prof_add(o, "matmul_gelu_fwd", t);
}

static void
cu_matmul_dgelu_bwd(rl_ops *o, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
    const void *w, const void *pre, int N, int C, int OC)
{
	double t = prof_t0(o);
	int r = -(int)CUBLAS_STATUS_NOT_SUPPORTED;
	/* dinp^T (C x N) = dgelu(w^T (C x OC) * dout^T (OC x N)) with aux = pre^T (C x N) */
	if (N > 0 && !CTX(o)->gelu_nosup && gelu_epi_ok(OC, C, (size_t)N, dinp, pre, dout))
		gelu_tried(o, r = lt_gemm_epi(o, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, CUDA_R_16BF, 0.0f, NULL,
		    EPI_DGELU, pre, C));
	if (r != -(int)CUBLAS_STATUS_NOT_SUPPORTED) {
		ck(o, "matmul_dgelu_bwd", r);
		matmul_bwd_(o, NULL, dw, dbias, dout, inp, w, N, C, OC);
	} else {
		matmul_bwd_(o, dinp, dw, dbias, dout, inp, w, N, C, OC);
		ck(o, "matmul_dgelu_bwd gelu", rlk_gelu_bwd(S(o), dinp, dinp, pre, (size_t)N * C));
	}
	prof_add(o, "matmul_dgelu_bwd", t);
}

/* matmul_fused_fwd (lib/compute/ops.h): one kernel (kernels/fuse.cu) where rlk_fused_gemv_ok takes the
 * shape, else the norm into xn, then the product (the fused kernel without its norm where it
 * takes that, else matmul_fwd into tmp and the epilogue's own kernel). */
static void
cu_matmul_fused_fwd(rl_ops *o, void *out, void *tmp, void *xn, const void *x, const void *nw, const void *nb,
    float eps, int norm, const void *w, const void *bias, int N, int C, int OC, int ep)
{
	cuda_ctx *c = CTX(o);
	double t = prof_t0(o);
	const void *in = x;
	if (norm < RL_NORM_NONE || norm > RL_NORM_LN || ep < RL_EP_NONE || ep > RL_EP_SWIGLU ||
	    (ep == RL_EP_SWIGLU && OC % 2)) {
		if (c->status == RL_OK) {
			rl_error("cuda: matmul_fused_fwd: norm %d, epilogue %d, OC %d not supported", norm, ep, OC);
			c->status = RL_EINVAL;
		}
		return;
	}
	if (N <= 0 || OC <= 0)
		return;
	if (!c->no_gemv && rlk_fused_gemv_ok(N, C, OC, norm, ep, x, nw, nb, w)) {
		ck(o, "matmul_fused_fwd", rlk_fused_gemv(S(o), out, x, nw, nb, eps, norm, w, bias, N, C, OC, ep));
		prof_add(o, "matmul_fused_fwd", t);
		return;
	}
	if (norm != RL_NORM_NONE) {
		ck(o, "matmul_fused_fwd norm", norm == RL_NORM_LN ?
		    rlk_layernorm_fwd(S(o), xn, NULL, NULL, x, nw, nb, N, C, eps) :
		    rlk_rmsnorm_fwd(S(o), xn, NULL, x, nw, N, C, eps));
		in = xn;
	}
	if (!c->no_gemv && rlk_fused_gemv_ok(N, C, OC, RL_NORM_NONE, ep, in, NULL, NULL, w)) {
		ck(o, "matmul_fused_fwd", rlk_fused_gemv(S(o), out, in, NULL, NULL, 0.0f, RL_NORM_NONE, w, bias, N, C,
		    OC, ep));
	} else {
		matmul_fwd_(o, ep == RL_EP_NONE ? out : tmp, in, w, bias, N, C, OC);
		if (ep == RL_EP_ADD)
			ck(o, "matmul_fused_fwd add", rlk_add(S(o), out, out, tmp, (size_t)N * OC));
		else if (ep == RL_EP_GELU)
			ck(o, "matmul_fused_fwd gelu", rlk_gelu_fwd(S(o), out, tmp, (size_t)N * OC));
		else if (ep == RL_EP_SWIGLU)
			ck(o, "matmul_fused_fwd swiglu", rlk_swiglu_fwd(S(o), out, tmp, N, OC / 2));
	}
	prof_add(o, "matmul_fused_fwd", t);
}

static void
cu_rope_kv_write(rl_ops *o, void *kc, void *vc, void *qkv, const int32_t *pos, const int32_t *slot, int N,
    int NH, int NKV, int HD, rl_rope rope)
{
	CKP(o, "rope_kv_write", rlk_rope_kv_write(S(o), kc, vc, qkv, pos, slot, N, NH, NKV, HD, rope));
}

/* matmul_rope_kv_fwd (lib/compute/ops.h): one kernel (kernels/fuse.cu's QKV epilogue) where
 * rlk_fused_qkv_ok takes the shape, else matmul_fused_fwd then rope_kv_write. */
static void
cu_matmul_rope_kv_fwd(rl_ops *o, void *qkv, void *xn, const void *x, const void *nw, const void *nb, float eps,
    int norm, const void *w, const void *bias, int N, int C, int NH, int NKV, int HD, rl_rope rope,
    const int32_t *pos, void *kc, void *vc, const int32_t *slot)
{
	if (N > 0 && !CTX(o)->no_gemv && rlk_fused_qkv_ok(N, C, NH, NKV, HD, norm, x, nw, nb, w)) {
		CKP(o, "matmul_rope_kv_fwd", rlk_fused_qkv(S(o), qkv, x, nw, nb, eps, norm, w, bias, N, C, NH, NKV, HD,
		    rope, pos, kc, vc, slot));
		return;
	}
	cu_matmul_fused_fwd(o, qkv, NULL, xn, x, nw, nb, eps, norm, w, bias, N, C, (NH + 2 * NKV) * HD, RL_EP_NONE);
	cu_rope_kv_write(o, kc, vc, qkv, pos, slot, N, NH, NKV, HD, rope);
}

/* ---- the rest of the table: thin wrappers over the launchers ---------------------------- */
static void
cu_embed_fwd(rl_ops *o, void *out, const int32_t *tok, const int32_t *pos, const void *wte,
    const void *wpe, int N, int C)
{
	CKP(o, "embed_fwd", rlk_embed_fwd(S(o), out, tok, pos, wte, wpe, N, C));
}

static void
cu_embed_bwd(rl_ops *o, float *dwte, float *dwpe, const void *dout, const int32_t *tok,
    const int32_t *pos, int N, int C)
{
	CKP(o, "embed_bwd", rlk_embed_bwd(S(o), dwte, dwpe, dout, tok, pos, N, C));
}

static void
cu_rmsnorm_fwd(rl_ops *o, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps)
{
	CKP(o, "rmsnorm_fwd", rlk_rmsnorm_fwd(S(o), out, rstd, x, w, N, C, eps));
}

static void
cu_rmsnorm_bwd(rl_ops *o, void *dx, float *dw, const void *dout, const void *x, const void *w,
    const float *rstd, int N, int C)
{
	CKP(o, "rmsnorm_bwd", rlk_rmsnorm_bwd(S(o), dx, dw, dout, x, w, rstd, N, C));
}

static void
cu_layernorm_fwd(rl_ops *o, void *out, float *mean, float *rstd, const void *x, const void *w,
    const void *b, int N, int C, float eps)
{
	CKP(o, "layernorm_fwd", rlk_layernorm_fwd(S(o), out, mean, rstd, x, w, b, N, C, eps));
}

static void
cu_layernorm_bwd(rl_ops *o, void *dx, float *dw, float *db, const void *dout, const void *x,
    const void *w, const float *mean, const float *rstd, int N, int C)
{
	CKP(o, "layernorm_bwd", rlk_layernorm_bwd(S(o), dx, dw, db, dout, x, w, mean, rstd, N, C));
}

static void
cu_layernorm_bwd_add(rl_ops *o, void *dx, float *dw, float *db, const void *dout, const void *x,
    const void *w, const float *mean, const float *rstd, int N, int C)
{
	CKP(o, "layernorm_bwd_add", rlk_layernorm_bwd_add(S(o), dx, dw, db, dout, x, w, mean, rstd, N, C));
}

static void
cu_rmsnorm_bwd_add(rl_ops *o, void *dx, float *dw, const void *dout, const void *x, const void *w,
    const float *rstd, int N, int C)
{
	CKP(o, "rmsnorm_bwd_add", rlk_rmsnorm_bwd_add(S(o), dx, dw, dout, x, w, rstd, N, C));
}

static void
cu_add_norm_fwd(rl_ops *o, void *x, void *out, float *mean, float *rstd, const void *t, const void *w,
    const void *b, int N, int C, float eps, int ln)
{
	CKP(o, "add_norm_fwd", rlk_add_norm_fwd(S(o), x, out, mean, rstd, t, w, b, N, C, eps, ln));
}

static void
cu_qknorm_fwd(rl_ops *o, void *qkv_out, float *rstd, const void *qkv_in, const void *wq,
    const void *wk, int N, int NH, int NKV, int HD, float eps)
{
	CKP(o, "qknorm_fwd", rlk_qknorm_fwd(S(o), qkv_out, rstd, qkv_in, wq, wk, N, NH, NKV, HD, eps));
}

static void
cu_qknorm_bwd(rl_ops *o, void *dqkv_in, float *dwq, float *dwk, const void *dqkv_out,
    const void *qkv_in, const void *wq, const void *wk, const float *rstd, int N, int NH, int NKV,
    int HD)
{
	CKP(o, "qknorm_bwd", rlk_qknorm_bwd(S(o), dqkv_in, dwq, dwk, dqkv_out, qkv_in, wq, wk, rstd, N, NH,
	    NKV, HD));
}

static void
cu_rope_fwd(rl_ops *o, void *qkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope)
{
	CKP(o, "rope_fwd", rlk_rope(S(o), qkv, pos, N, NH, NKV, HD, rope, 1));
}

static void
cu_rope_bwd(rl_ops *o, void *dqkv, const int32_t *pos, int N, int NH, int NKV, int HD, rl_rope rope)
{
	CKP(o, "rope_bwd", rlk_rope(S(o), dqkv, pos, N, NH, NKV, HD, rope, -1));
}

/* Grow the attention scratch to what `rows` batch rows need (at most ATTN_WS_CAP
 * unless a single row needs more). */
static int
attn_ws(rl_ops *o, int B, int T, int NH, int NKV, int HD, int bwd)
{
	cuda_ctx *c = CTX(o);
	size_t need = rlk_attn_ws_bytes(B, T, NH, NKV, HD, bwd);
	if (need > ATTN_WS_CAP) {
		size_t one = rlk_attn_ws_bytes(1, T, NH, NKV, HD, bwd);
		need = one > ATTN_WS_CAP ? one : ATTN_WS_CAP;
		/* whole rows only: round down to a multiple of one row's need */
	}
	if (c->attn_ws_bytes >= need)
		return RL_OK;
	if (c->capturing) {
		fail(o, "attention scratch growth during graph capture", "not allowed");
		return RL_EDEVICE;
	}
	c->epoch++;
	if (c->attn_ws) {
		cudaStreamSynchronize(c->stream);
		cudaFree(c->attn_ws);
		c->attn_ws = NULL;
		c->attn_ws_bytes = 0;
	}
	if (cu_alloc(o, &c->attn_ws, need) != RL_OK) {
		if (c->status == RL_OK)
			c->status = RL_ENOMEM;
		return RL_ENOMEM;
	}
	c->attn_ws_bytes = need;
	return RL_OK;
}

static void
cu_attn_fwd(rl_ops *o, void *out, float *lse, const void *qkv, const int32_t *seg, int B, int T,
    int NH, int NKV, int HD)
{
	cuda_ctx *c = CTX(o);
	if (c->flash2 && rlk_flash2_ok(NH, NKV, HD, out, qkv, NULL, NULL)) {
		CKP(o, "attn_fwd", rlk_flash2_fwd(S(o), out, lse, qkv, seg, B, T, NH, NKV, HD));
		return;
	}
	if (c->flash && rlk_flash_fwd_ok(HD, qkv)) {
		CKP(o, "attn_fwd", rlk_flash_fwd(S(o), out, lse, qkv, seg, B, T, NH, NKV, HD));
		return;
	}
	if (attn_ws(o, B, T, NH, NKV, HD, 0))
		return;
	CKP(o, "attn_fwd", rlk_attn_fwd(S(o), c->blas, c->attn_ws, c->attn_ws_bytes, out, lse, qkv, seg, B,
	    T, NH, NKV, HD));
}

static void
cu_attn_bwd(rl_ops *o, void *dqkv, const void *dout, const void *out, const float *lse,
    const void *qkv, const int32_t *seg, int B, int T, int NH, int NKV, int HD)
{
	cuda_ctx *c = CTX(o);
	if (c->flash2 && rlk_flash2_ok(NH, NKV, HD, dqkv, dout, out, qkv)) {
		void *ws = grow_buf(o, &c->fa2_ws, &c->fa2_ws_bytes,
		    RL_MAX(rlk_flash2_ws_bytes(B, T, NH, NKV, HD, c->f2_bwd), 256));
		if (ws)
			CKP(o, "attn_bwd", rlk_flash2_bwd(S(o), ws, dqkv, dout, out, lse, qkv, seg, B, T, NH, NKV, HD,
			    c->f2_bwd));
		return;
	}
	if (attn_ws(o, B, T, NH, NKV, HD, 1))
		return;
	CKP(o, "attn_bwd", rlk_attn_bwd(S(o), c->blas, c->attn_ws, c->attn_ws_bytes, dqkv, dout, out, lse,
	    qkv, seg, B, T, NH, NKV, HD));
}

static void
cu_swiglu_fwd(rl_ops *o, void *out, const void *gu, int N, int H)
{
	CKP(o, "swiglu_fwd", rlk_swiglu_fwd(S(o), out, gu, N, H));
}

static void
cu_swiglu_bwd(rl_ops *o, void *dgu, const void *dout, const void *gu, int N, int H)
{
	CKP(o, "swiglu_bwd", rlk_swiglu_bwd(S(o), dgu, dout, gu, N, H));
}

static void
cu_gelu_fwd(rl_ops *o, void *out, const void *x, size_t n)
{
	CKP(o, "gelu_fwd", rlk_gelu_fwd(S(o), out, x, n));
}

static void
cu_gelu_bwd(rl_ops *o, void *dx, const void *dout, const void *x, size_t n)
{
	CKP(o, "gelu_bwd", rlk_gelu_bwd(S(o), dx, dout, x, n));
}

static void
cu_add(rl_ops *o, void *out, const void *a, const void *b, size_t n)
{
	CKP(o, "add", rlk_add(S(o), out, a, b, n));
}

static void
cu_logprob_fwd(rl_ops *o, float *lp, float *ent, float *lse, const void *logits, const int32_t *tgt,
    int N, int V, float inv_temp)
{
	CKP(o, "logprob_fwd", rlk_logprob_fwd(S(o), lp, ent, lse, logits, V, tgt, N, V, inv_temp));
}

static void
cu_logprob_bwd(rl_ops *o, void *dlogits, const void *logits, const int32_t *tgt, const float *lse,
    const float *dlp, const float *dent, int N, int V, float inv_temp)
{
	CKP(o, "logprob_bwd", rlk_logprob_bwd(S(o), dlogits, logits, V, tgt, lse, dlp, dent, N, V,
	    inv_temp));
}

static void
cu_logprob_fwd_ld(rl_ops *o, float *lp, float *ent, float *lse, const void *logits, int ld,
    const int32_t *tgt, int N, int V, float inv_temp)
{
	if (!head_ld_bad(o, "logprob_fwd_ld", ld, V))
		CKP(o, "logprob_fwd_ld", rlk_logprob_fwd(S(o), lp, ent, lse, logits, ld, tgt, N, V, inv_temp));
}

static void
cu_logprob_bwd_ld(rl_ops *o, void *dlogits, const void *logits, int ld, const int32_t *tgt,
    const float *lse, const float *dlp, const float *dent, int N, int V, float inv_temp)
{
	if (!head_ld_bad(o, "logprob_bwd_ld", ld, V))
		CKP(o, "logprob_bwd_ld", rlk_logprob_bwd(S(o), dlogits, logits, ld, tgt, lse, dlp, dent, N, V,
		    inv_temp));
}

static void
cu_pg_loss(rl_ops *o, float *dlp, float *dent, float *stats, const float *lp, const float *old,
    const float *beh, const float *ref, const float *ent, const float *adv, const float *w, int N,
    const rl_pg_params *p)
{
	if (ref && (p->kl_type < 1 || p->kl_type > 3)) {
		rl_error("pg_loss: unknown kl_type %d (1, 2 or 3)", p->kl_type);
		if (CTX(o)->status == RL_OK)
			CTX(o)->status = RL_EINVAL;
		return;
	}
	CKP(o, "pg_loss", rlk_pg_loss(S(o), dlp, dent, stats, lp, old, beh, ref, ent, adv, w, N, *p));
}

static double
cu_sumsq(rl_ops *o, const float *x, size_t n)
{
	cuda_ctx *c = CTX(o);
	double r = 0.0;
	ck(o, "sumsq", (int)cudaMemsetAsync(c->dsum, 0, sizeof(double), c->stream));
	CKP(o, "sumsq", rlk_sumsq(S(o), c->dsum, x, n));
	cu_download(o, &r, c->dsum, sizeof r);
	return r;
}

static void
cu_adamw(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v, size_t n,
    float lr, float b1, float b2, float eps, float wd, int t, float grad_scale)
{
	if (t < 1) {
		rl_error("adamw: step %d must be >= 1", t);
		if (CTX(o)->status == RL_OK)
			CTX(o)->status = RL_EINVAL;
		return;
	}
	float bc1 = (float)(1.0 - pow((double)b1, (double)t));
	float bc2 = (float)(1.0 - pow((double)b2, (double)t));
	CKP(o, "adamw", rlk_adamw(S(o), param, wcopy, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2,
	    grad_scale));
}

/* field by field: the struct's padding may hold anything */
static int
same_segs(const rl_adamw_seg *a, const rl_adamw_seg *b, int n)
{
	for (int i = 0; i < n; i++)
		if (a[i].off != b[i].off || a[i].n != b[i].n || a[i].cls != b[i].cls)
			return 0;
	return 1;
}

/* The device chunk table of a segment table: found among the kept ones by content, else
 * built, uploaded once and kept in place of the least recently used.  NULL on failure
 * (recorded). */
static struct adam_plan *
adam_plan(rl_ops *o, const rl_adamw_seg *seg, int nseg)
{
	cuda_ctx *c = CTX(o);
	struct adam_plan *pl = &c->adam[0];
	rlk_adamw_chunk *h = NULL;
	size_t nch = 0;

	for (int i = 0; i < (int)RL_ARRAY_LEN(c->adam); i++) {
		struct adam_plan *q = &c->adam[i];
		if (q->seg && q->nseg == nseg && same_segs(q->seg, seg, nseg)) {
			q->used = ++c->adam_tick;
			return q;
		}
		if (q->used < pl->used)
			pl = q;
	}
	if (c->capturing) {
		fail(o, "adamw_multi: a new segment table during graph capture", "not allowed");
		return NULL;
	}
	for (int s = 0; s < nseg; s++) {
		if (seg[s].cls < 0 || seg[s].cls >= RL_ADAMW_NCLS) {
			rl_error("adamw_multi: segment %d has class %d (0 to %d)", s, seg[s].cls, RL_ADAMW_NCLS - 1);
			if (c->status == RL_OK)
				c->status = RL_EINVAL;
			return NULL;
		}
		nch += (seg[s].n + RLK_ADAMW_CHUNK - 1) / RLK_ADAMW_CHUNK;
	}
	if (nch > 0x7fffffff) {
		rl_error("adamw_multi: %zu chunks, more than a grid holds", nch);
		if (c->status == RL_OK)
			c->status = RL_EINVAL;
		return NULL;
	}
	/* the slot's old table may still be read by queued work */
	cudaStreamSynchronize(c->stream);
	cudaFree(pl->dch);
	free(pl->seg);
	memset(pl, 0, sizeof *pl);
	if ((pl->seg = rl_try_malloc((size_t)RL_MAX(nseg, 1) * sizeof *seg, "adamw segments")) == NULL ||
	    (h = rl_try_malloc(RL_MAX(nch, (size_t)1) * sizeof *h, "adamw chunks")) == NULL) {
		free(pl->seg);
		pl->seg = NULL;
		if (c->status == RL_OK)
			c->status = RL_ENOMEM;
		return NULL;
	}
	nch = 0;
	for (int s = 0; s < nseg; s++)
		for (size_t a = 0; a < seg[s].n; a += RLK_ADAMW_CHUNK) {
			h[nch].off = seg[s].off + a;
			h[nch].n = (uint32_t)RL_MIN((size_t)RLK_ADAMW_CHUNK, seg[s].n - a);
			h[nch].cls = (uint32_t)seg[s].cls;
			nch++;
		}
	/* on the backend's stream (non-blocking: a plain cudaMemcpy from pageable memory may
	 * return before its DMA is done, and nothing orders it before our kernels) */
	if (nch && (cu_alloc(o, (void **)&pl->dch, nch * sizeof *h) != RL_OK ||
	    cudaMemcpyAsync(pl->dch, h, nch * sizeof *h, cudaMemcpyHostToDevice, c->stream) != cudaSuccess ||
	    cudaStreamSynchronize(c->stream) != cudaSuccess)) {
		cudaGetLastError();
		free(h);
		cudaFree(pl->dch);
		free(pl->seg);
		memset(pl, 0, sizeof *pl);
		fail(o, "adamw_multi", "cannot upload the chunk table");
		return NULL;
	}
	free(h);
	for (int i = 0; i < nseg; i++)
		pl->seg[i] = seg[i];
	pl->nseg = nseg;
	pl->nch = (int)nch;
	pl->used = ++c->adam_tick;
	return pl;
}

static void
cu_adamw_multi(rl_ops *o, float *param, void *wcopy, const float *grad, float *m, float *v,
    const rl_adamw_seg *seg, int nseg, const float *lr, const float *wd, float b1, float b2, float eps,
    int t, float grad_scale)
{
	struct adam_plan *pl;
	if (t < 1) {
		rl_error("adamw: step %d must be >= 1", t);
		if (CTX(o)->status == RL_OK)
			CTX(o)->status = RL_EINVAL;
		return;
	}
	if (nseg <= 0 || (pl = adam_plan(o, seg, nseg)) == NULL)
		return;
	/* the bias corrections as cu_adamw computes them */
	float bc1 = (float)(1.0 - pow((double)b1, (double)t));
	float bc2 = (float)(1.0 - pow((double)b2, (double)t));
	CKP(o, "adamw_multi", rlk_adamw_multi(S(o), pl->dch, pl->nch, param, wcopy, grad, m, v, lr, wd, b1, b2, eps,
	    bc1, bc2, grad_scale));
}

static void
cu_kv_write(rl_ops *o, void *kc, void *vc, const void *qkv, const int32_t *slot, int N, int NH,
    int NKV, int HD)
{
	CKP(o, "kv_write", rlk_kv_write(S(o), kc, vc, qkv, slot, N, NH, NKV, HD));
}

/* Splits of the context per (sequence, KV head) for decode attention: about two
 * blocks per multiprocessor in all, from B and NKV only (a graph holds the grid), at
 * most c->dec_splits: 32 splits x 4 warps x 8 keys in flight per warp cover 1,024 keys
 * in one round of the key-per-warp kernel, and more splits mostly add empty workers and
 * partials to merge (RL_CUDA_DECODE_SPLITS=N sets another cap, up to 256). */
static int
decode_nsplit(const cuda_ctx *c, int B, int NKV)
{
	long units = (long)B * NKV, want = 2L * (c->nsm > 0 ? c->nsm : 132);
	long n = (want + units - 1) / units;
	return (int)(n < 1 ? 1 : n > c->dec_splits ? c->dec_splits : n);
}

/* A switch that names one of `words` (space-separated): its index, or -1 when unset,
 * empty or outside the list (said on stderr: the default is taken). */
static int
env_pick(const char *var, const char *words)
{
	const char *v = getenv(var);
	if (v == NULL || *v == '\0')
		return -1;
	size_t n = strlen(v);
	int i = 0;
	for (const char *p = words; *p; p += strcspn(p, " "), p += *p == ' ', i++)
		if (strncmp(p, v, n) == 0 && (p[n] == ' ' || p[n] == '\0'))
			return i;
	rl_warn("cuda: %s=%s is not one of %s: ignored", var, v, words);
	return -1;
}

/* An on-by-default switch: 1 when var is "0" (off); unset, empty or "1" is on, and any other
 * value is said on stderr and ignored (on). */
static int
env_off(const char *var)
{
	return env_pick(var, "0 1") == 0;
}

/* An integer switch in [lo, hi]: def when unset or empty, outside the range or not a
 * number (said on stderr). */
static int
env_int(const char *var, int def, int lo, int hi)
{
	const char *v = getenv(var);
	if (v == NULL || *v == '\0')
		return def;
	char *end;
	long n = strtol(v, &end, 10);
	if (*end != '\0' || n < lo || n > hi) {
		rl_warn("cuda: %s=%s is not a number from %d to %d: ignored", var, v, lo, hi);
		return def;
	}
	return (int)n;
}

/* Key per lane (k_decode_lane) or key per warp (k_decode_split).  A lane reading a whole
 * K row and a warp walking the V rows wins when each (sequence, KV head) has few splits
 * (many sequences: 163K against 118K tok/s at 256 GPT-2 slots on the H100, same run);
 * with many splits (a few sequences) each worker has only a few keys and the
 * key-per-warp kernel spreads them wider (0.70 against 0.74 ms a GPT-2 step at one
 * slot).  RL_CUDA_DECODE_ATTN=lane or =split forces one; =wide takes k_decode_wide
 * (never run on a GPU yet, so never the default). */
static int
decode_kernel(const cuda_ctx *c, int nsplit)
{
	if (c->decode_kind == DK_WIDE)
		return RLK_DEC_WIDE;
	if (c->decode_kind == DK_LANE || c->decode_kind == DK_SPLIT)
		return c->decode_kind == DK_LANE ? RLK_DEC_LANE : RLK_DEC_SPLIT;
	return nsplit <= 4 ? RLK_DEC_LANE : RLK_DEC_SPLIT;
}

static void
cu_attn_decode(rl_ops *o, void *out, const void *qkv, const void *kc, const void *vc,
    const int32_t *block_table, const int32_t *ctx_len, int B, int NH, int NKV, int HD, int BS,
    int MAXBLK)
{
	cuda_ctx *c = CTX(o);
	if (c->decode_kind != DK_V1 && B > 0 && rlk_attn_decode_split_ok(NH, NKV, HD)) {
		int nsplit = decode_nsplit(c, B, NKV);
		size_t wb = rlk_attn_decode_ws_bytes(B, NH, HD, nsplit);
		float *ws = NULL;
		/* B * NKV * nsplit < 2 * want whenever nsplit > 1: take that bound at once, so the
		 * scratch grows once per model shape, not per batch size (each growth makes the
		 * recorded graphs stale) */
		long want = 2L * (c->nsm > 0 ? c->nsm : 132);
		size_t bound = (size_t)(2 * want) * (size_t)(NH / NKV) * (size_t)(HD + 2) * sizeof(float);
		if (wb && !(ws = grow_buf(o, &c->dec_ws, &c->dec_ws_bytes, RL_MAX(wb, bound))))
			return;
		/* the counters of the merge in the kernel: B * NKV < want of them when nsplit > 1;
		 * zeroed once when allocated (each launch leaves them 0, graph replays included) */
		unsigned *cnt = NULL;
		if (nsplit > 1 && nsplit <= RLK_DECODE_MAXSPLIT && !c->dec_merge_sep) {
			size_t had = c->dec_cnt_bytes, nb = (size_t)RL_MAX((long)B * NKV, want) * sizeof(unsigned);
			if (!(cnt = grow_buf(o, &c->dec_cnt, &c->dec_cnt_bytes, nb)))
				return;
			if (c->dec_cnt_bytes != had)
				ck(o, "attn_decode counters", (int)cudaMemsetAsync(cnt, 0, c->dec_cnt_bytes, c->stream));
		}
		CKP(o, "attn_decode", rlk_attn_decode_split(S(o), ws, cnt, out, qkv, kc, vc, block_table, ctx_len, B,
		    NH, NKV, HD, BS, MAXBLK, nsplit, decode_kernel(c, nsplit), c->dec_keys));
		return;
	}
	CKP(o, "attn_decode", rlk_attn_decode(S(o), out, qkv, kc, vc, block_table, ctx_len, B, NH, NKV, HD,
	    BS, MAXBLK));
}

/* ---- decode_step: the step's blocks in one kernel (kernels/step.cu) ---------------------- */

/* d as the launcher takes it; layer: the device table (NULL for rlk_decode_step_ok, which
 * does not read it) */
static rlk_step
step_args(const rl_step_desc *d, const rlk_step_layer *layer)
{
	rlk_step s;
	memset(&s, 0, sizeof s);
	s.n_layer = d->n_layer;
	s.C = d->C;
	s.NH = d->NH;
	s.NKV = d->NKV;
	s.HD = d->HD;
	s.H = d->H;
	s.V = d->V;
	s.gpt2 = d->gpt2;
	s.eps = d->eps;
	s.rope = d->rope;
	s.BS = d->BS;
	s.MAXBLK = d->MAXBLK;
	s.layer = layer;
	s.lnf_w = d->lnf_w;
	s.lnf_b = d->lnf_b;
	s.lm_w = d->lm_w;
	s.x = d->x;
	s.qkv = d->qkv;
	s.att = d->att;
	s.h = d->h;
	s.logits = d->logits;
	s.nsplit = 1;
	return s;
}

/* The index of d's layer table among those uploaded, -1 when it is not there */
static int
step_tab_find(const cuda_ctx *c, const rl_step_desc *d)
{
	size_t bytes = (size_t)d->n_layer * sizeof *d->layer;
	for (int i = 0; i < c->nstab; i++)
		if (c->stab[i].n == d->n_layer && memcmp(c->stab[i].h, d->layer, bytes) == 0)
			return i;
	return -1;
}

/* The device copy of d's layer table: one per distinct table (weights and cache binding),
 * uploaded on first use outside graph capture and kept until close (a recorded graph holds
 * its address), at most STEP_TABS of them.  NULL when there is none and none can be made. */
static const rlk_step_layer *
step_table(rl_ops *o, const rl_step_desc *d)
{
	cuda_ctx *c = CTX(o);
	size_t bytes = (size_t)d->n_layer * sizeof *d->layer;
	int i = step_tab_find(c, d);
	if (i >= 0)
		return c->stab[i].d;
	if (c->nstab == STEP_TABS || c->capturing)
		return NULL;
	struct step_tab *t = &c->stab[c->nstab];
	if ((t->h = rl_try_malloc(bytes, "decode step table")) == NULL)
		return NULL;
	if (cu_alloc(o, &t->d, bytes) != RL_OK) {
		free(t->h);
		return NULL;
	}
	memcpy(t->h, d->layer, bytes);
	t->n = d->n_layer;
	cu_upload(o, t->d, t->h, bytes);
	c->nstab++;
	return t->d;
}

/* Splits of the context per (sequence, KV head): the grid's blocks over the B NKV units,
 * at most c->dec_splits and the merge's bound */
static int
step_nsplit(const cuda_ctx *c, int blocks, int B, int NKV)
{
	int n = blocks / (B * NKV), cap = RL_MIN(c->dec_splits, RLK_DECODE_MAXSPLIT);
	return n < 1 ? 1 : n > cap ? cap : n;
}

static void step_prof_say(cuda_ctx *c);

/* The stage profile's device buffer for n_layer layers (launch.h: RLK_STEP_PROF_U64), set up
 * outside graph capture on first use; another layer count says the sums so far and starts
 * again (graphs recorded before are stale).  NULL (the step fails) when none can be had. */
static unsigned long long *
step_prof(rl_ops *o, int n_layer)
{
	cuda_ctx *c = CTX(o);
	if (c->stp_pd && c->stp_pl == n_layer)
		return c->stp_pd;
	if (c->capturing)
		return NULL;
	if (c->stp_pd) {
		cudaStreamSynchronize(c->stream);
		step_prof_say(c);
		cudaFree(c->stp_pd);
		c->stp_pd = NULL;
		c->epoch++;
	}
	size_t n = RLK_STEP_PROF_U64(n_layer);
	unsigned long long *h = rl_try_malloc(n * sizeof *h, "decode step profile");
	if (h == NULL)
		return NULL;
	for (size_t k = 0; k < 4 * (5 * (size_t)n_layer + 2); k++)
		h[k] = k % 4 == 1 || k % 4 == 2 ? ~0ull : 0;
	for (size_t k = 4 * (5 * (size_t)n_layer + 2); k < n; k++)
		h[k] = 0;
	if (cu_alloc(o, (void **)&c->stp_pd, n * sizeof *h) == RL_OK) {
		cu_upload(o, c->stp_pd, h, n * sizeof *h);
		cudaStreamSynchronize(c->stream);
		c->stp_pl = n_layer;
	}
	free(h);
	return c->stp_pd;
}

/* The stage profile's sums per launch, on stderr (at close) */
static void
step_prof_say(cuda_ctx *c)
{
	unsigned long long a[RLK_STEP_PROF_ACC];
	static const char *const kind[6] = { "norm+qkv", "attention", "o+add", "norm+fc", "proj+add", "norm+head" };
	if (!c->stp_pd || cudaMemcpy(a, c->stp_pd + 4 * (5 * (size_t)c->stp_pl + 2), sizeof a, cudaMemcpyDeviceToHost) !=
	    cudaSuccess || a[25] == 0)
		return;
	double n = (double)a[25], per[6] = { c->stp_pl, c->stp_pl, c->stp_pl, c->stp_pl, c->stp_pl, 1 };
	fprintf(stderr, "cuda step profile: %d layers: %.0f launches, %.2f us each, %.2f us from one's end to the "
	    "next one's start\n", c->stp_pl, n, (double)(long long)a[24] / n / 1e3,
	    n > 1 ? (double)(long long)a[26] / (n - 1) / 1e3 : 0.0);
	for (int k = 0; k < 6; k++)
		fprintf(stderr, "cuda step profile: %-10s stage to last arrival %7.2f us, to first %7.2f us, barrier after "
		    "%6.2f us, its departures spread %6.2f us (each, mean of %d a launch)\n", kind[k],
		    (double)(long long)a[4 * k] / n / per[k] / 1e3, (double)(long long)a[4 * k + 1] / n / per[k] / 1e3,
		    (double)(long long)a[4 * k + 2] / n / per[k] / 1e3, (double)(long long)a[4 * k + 3] / n / per[k] / 1e3,
		    (int)per[k]);
}

static void
cu_decode_advance(rl_ops *o, int32_t *tok, int32_t *pos, int32_t *ctx, int32_t *slot, uint64_t *ctr,
    const int32_t *bt, const int32_t *otok, int B, int cols, int BS)
{
	CKP(o, "decode_advance", rlk_decode_advance(S(o), tok, pos, ctx, slot, ctr, bt, otok, B, cols, BS));
}

static int
cu_decode_step_ok(rl_ops *o, const rl_step_desc *d, int B)
{
	cuda_ctx *c = CTX(o);
	rlk_step s = step_args(d, NULL);
	if (!c->dec_step || B < 1 || B > RLK_STEP_ROWS || d->n_layer < 1 || !rlk_decode_step_ok(&s, B))
		return 0;
	for (int l = 0; l < d->n_layer; l++)
		if (!rlk_step_layer_ok(&s, &d->layer[l]))
			return 0;
	if (step_tab_find(c, d) < 0 && (c->nstab == STEP_TABS || c->capturing))
		return 0;  /* no table, and none can be made now */
	return rlk_decode_step_blocks(&s, B) > 0;
}

static void
cu_decode_step(rl_ops *o, const rl_step_desc *d, const int32_t *pos, const int32_t *slot, const int32_t *bt,
    const int32_t *ctx, int B)
{
	cuda_ctx *c = CTX(o);
	const rlk_step_layer *tab = step_table(o, d);
	if (tab == NULL) {
		fail(o, "decode_step", c->capturing ? "a new layer table during graph capture" : "no layer table");
		return;
	}
	rlk_step s = step_args(d, tab);
	int blocks = rlk_decode_step_blocks(&s, B);
	if (blocks < 1) {
		fail(o, "decode_step", "no resident grid");
		return;
	}
	if (c->stp_grid > 0 && c->stp_grid < blocks)
		blocks = c->stp_grid;
	s.grid = blocks;
	s.bar_kind = c->stp_bar;
	s.split_keys = c->stp_keys;
	s.plain = c->stp_plain;
	if (c->stp_prof && !(s.prof = step_prof(o, d->n_layer)))
		return;
	s.nsplit = step_nsplit(c, blocks, B, d->NKV);
	/* the scratch for the largest split count of any B <= RLK_STEP_ROWS at once (it grows
	 * once per model shape, not per batch) */
	size_t wb = rlk_attn_decode_ws_bytes(RLK_STEP_ROWS, d->NH, d->HD, step_nsplit(c, blocks, 1, d->NKV));
	size_t cb = (2 + (size_t)RLK_STEP_ROWS * d->NKV) * sizeof(unsigned), had = c->stp_cnt_bytes;
	if (s.nsplit > 1 && !(s.ws = grow_buf(o, &c->stp_ws, &c->stp_ws_bytes, wb)))
		return;
	if (!grow_buf(o, (void **)&c->stp_cnt, &c->stp_cnt_bytes, cb))
		return;
	if (c->stp_cnt_bytes != had)
		ck(o, "decode_step counters", (int)cudaMemsetAsync(c->stp_cnt, 0, c->stp_cnt_bytes, c->stream));
	s.bar = c->stp_cnt;
	s.cnt = c->stp_cnt + 2;
	CKP(o, "decode_step", rlk_decode_step(S(o), &s, pos, slot, bt, ctx, B));
}

/* Rows split over blocks (k_sample_split) for greedy and plain temperature sampling with
 * at most c->smp_split rows, else one block per row (k_sample: top-k, top-p).  The
 * scratch is taken for at least 256 rows at once and the counters for 1024, so that they
 * grow once per vocabulary rather than per batch size (a growth makes recorded graphs
 * stale). */
static void
cu_sample(rl_ops *o, int32_t *tok, float *logp, const void *logits, const uint64_t *seed,
    const uint64_t *counter, int B, int V, const rl_sample_params *p)
{
	cuda_ctx *c = CTX(o);
	if (B > 0 && B <= c->smp_split && rlk_sample_split_ok(B, V, *p)) {
		size_t had = c->smp_cnt_bytes;
		void *ws = grow_buf(o, &c->smp_ws, &c->smp_ws_bytes, rlk_sample_ws_bytes(RL_MAX(B, 256), V));
		unsigned *cnt = ws ? grow_buf(o, &c->smp_cnt, &c->smp_cnt_bytes, (size_t)RL_MAX(B, 1024) * sizeof(unsigned))
		    : NULL;
		if (!cnt)
			return;
		if (c->smp_cnt_bytes != had)
			ck(o, "sample counters", (int)cudaMemsetAsync(cnt, 0, c->smp_cnt_bytes, c->stream));
		CKP(o, "sample", rlk_sample_split(S(o), ws, cnt, tok, logp, logits, seed, counter, B, V, *p));
		return;
	}
	CKP(o, "sample", rlk_sample(S(o), tok, logp, logits, seed, counter, B, V, *p));
}

/* ---- staging, queued copies, graphs (optional hooks of ops.h) ------------------------- */
static int
cu_host_alloc(rl_ops *o, void **p, size_t bytes)
{
	cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault);
	if (e != cudaSuccess) {
		rl_error("cuda: cannot allocate %zu bytes of page-locked host memory: %s", bytes,
		    cudaGetErrorString(e));
		cudaGetLastError();
		*p = NULL;
		(void)o;
		return RL_ENOMEM;
	}
	return RL_OK;
}

static void
cu_host_free(rl_ops *o, void *p)
{
	if (p)
		ck(o, "cudaFreeHost", (int)cudaFreeHost(p));
}

static void
cu_upload_async(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		ck(o, "upload", (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CTX(o)->stream));
}

static void
cu_download_async(rl_ops *o, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		ck(o, "download", (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CTX(o)->stream));
}

typedef struct cu_graph {
	cudaGraphExec_t exec;
	unsigned epoch;
} cu_graph;

static int
cu_graph_begin(rl_ops *o)
{
	cuda_ctx *c = CTX(o);
	cudaError_t e;
	int st;

	if (c->prof || c->capturing)
		return RL_ENOTSUP;  /* the profile synchronises around every op */
	/* an error from before belongs to the caller, not to the capture */
	if ((st = cu_status(o)) != RL_OK) {
		c->status = st;
		return st;
	}
	/* thread-local: other threads (weight sync) may allocate meanwhile */
	if ((e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal)) != cudaSuccess) {
		cudaGetLastError();
		rl_warn("cuda: cannot begin a graph capture: %s", cudaGetErrorString(e));
		return RL_EDEVICE;
	}
	c->capturing = 1;
	return RL_OK;
}

static int
cu_graph_end(rl_ops *o, void **out)
{
	cuda_ctx *c = CTX(o);
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	cu_graph *cg;
	cudaError_t e;
	int st;

	*out = NULL;
	if (!c->capturing)
		return RL_EINVAL;
	c->capturing = 0;
	e = cudaStreamEndCapture(c->stream, &g);
	/* a failure recorded while capturing (an op that cannot be captured) is the capture's */
	st = c->status;
	c->status = RL_OK;
	if (e == cudaSuccess)
		e = cudaGetLastError();
	else
		cudaGetLastError();
	if (e != cudaSuccess || st != RL_OK || g == NULL) {
		rl_warn("cuda: graph capture failed: %s", e != cudaSuccess ? cudaGetErrorString(e) :
		    st != RL_OK ? rl_strerror(st) : "empty graph");
		if (g)
			cudaGraphDestroy(g);
		return RL_EDEVICE;
	}
	e = cudaGraphInstantiateWithFlags(&x, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess) {
		cudaGetLastError();
		rl_warn("cuda: cannot instantiate a graph: %s", cudaGetErrorString(e));
		return RL_EDEVICE;
	}
	if ((cg = rl_try_calloc(1, sizeof *cg, "graph")) == NULL) {
		cudaGraphExecDestroy(x);
		return RL_ENOMEM;
	}
	cg->exec = x;
	cg->epoch = c->epoch;
	*out = cg;
	return RL_OK;
}

static int
cu_graph_launch(rl_ops *o, void *g)
{
	cu_graph *cg = g;
	if (!cg || cg->epoch != CTX(o)->epoch)
		return RL_EINVAL;
	cudaError_t e = cudaGraphLaunch(cg->exec, CTX(o)->stream);
	if (e != cudaSuccess) {
		ck(o, "cudaGraphLaunch", (int)e);
		return RL_EDEVICE;
	}
	return RL_OK;
}

static int
cu_graph_ok(rl_ops *o, const void *g)
{
	const cu_graph *cg = g;
	return cg != NULL && cg->epoch == CTX(o)->epoch;
}

static void
cu_graph_destroy(rl_ops *o, void *g)
{
	cu_graph *cg = g;
	if (!cg)
		return;
	ck(o, "cudaGraphExecDestroy", (int)cudaGraphExecDestroy(cg->exec));
	free(cg);
}

static void
cu_close(rl_ops *o)
{
	if (!o)
		return;
	cuda_ctx *c = CTX(o);
	if (c) {
		if (c->stream)
			cudaStreamSynchronize(c->stream);
		if (c->prof)
			for (int i = 0; i < c->npt; i++)
				fprintf(stderr, "cuda profile: %-16s %8ld calls %10.2f ms total %8.3f ms/call\n",
				    c->pt[i].name, c->pt[i].n, c->pt[i].s * 1e3, c->pt[i].s * 1e3 / c->pt[i].n);
		cudaFree(c->pad);
		cudaFree(c->acc);
		cudaFree(c->bg);
		cudaFree(c->dec_ws);
		cudaFree(c->dec_cnt);
		cudaFree(c->smp_ws);
		cudaFree(c->stp_ws);
		cudaFree(c->stp_cnt);
		step_prof_say(c);
		cudaFree(c->stp_pd);
		for (int i = 0; i < c->nstab; i++) {
			cudaFree(c->stab[i].d);
			free(c->stab[i].h);
		}
		cudaFree(c->smp_cnt);
		cudaFree(c->fa2_ws);
		cudaFree(c->attn_ws);
		cudaFree(c->lt_ws);
		cudaFree(c->dsum);
		for (int i = 0; i < (int)RL_ARRAY_LEN(c->adam); i++) {
			cudaFree(c->adam[i].dch);
			free(c->adam[i].seg);
		}
		if (c->blas)
			cublasDestroy(c->blas);
		if (c->lt)
			cublasLtDestroy(c->lt);
		if (c->stream)
			cudaStreamDestroy(c->stream);
		free(c);
	}
	free(o);
}

int
rl_ops_cuda_open(rl_ops **out, int device)
{
	int n = 0, rv = RL_OK;
	rl_ops *o = NULL;
	cuda_ctx *c = NULL;
	cudaError_t e;

	*out = NULL;
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		cudaGetLastError();
		rl_verbose("cuda: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return RL_ENODEV;
	}
	if (device < 0 || device >= n) {
		rl_error("cuda: no device %d (%d present)", device, n);
		return RL_ENODEV;
	}
	if ((e = cudaSetDevice(device)) != cudaSuccess) {
		rl_error("cuda: cannot use device %d: %s", device, cudaGetErrorString(e));
		return RL_EDEVICE;
	}
	o = rl_try_calloc(1, sizeof *o, "cuda backend");
	c = rl_try_calloc(1, sizeof *c, "cuda backend");
	if (!o || !c) {
		free(o);
		free(c);
		return RL_ENOMEM;
	}
	o->ctx = c;
	c->prof = getenv("RL_CUDA_PROFILE") != NULL && atoi(getenv("RL_CUDA_PROFILE")) > 0;
	/* flash2 is the default attention (measured faster on the H100, docs/cuda.md);
	 * RL_CUDA_ATTN=cublas (or flash) names another path */
	int attn = env_pick("RL_CUDA_ATTN", "flash2 cublas flash");
	c->flash2 = attn <= 0;
	c->flash = attn == 2;
	/* flash2's backward: fused3 (one pass, dQ by f32 atomics, 3 blocks per SM; the
	 * default: fastest on the H100), det (two passes, bit-for-bit
	 * reproducible), fused (one pass, 2 blocks per SM), fused32 (32-query tiles, 4
	 * blocks per SM): docs/cuda.md */
	int f2b = env_pick("RL_CUDA_FLASH_BWD", "det fused fused3 fused32");  /* RLK_F2_BWD_* order */
	c->f2_bwd = f2b < 0 ? RLK_F2_BWD_FUSED3 : f2b;
	/* GPT-2's bias + GELU in the GEMM epilogues: on unless RL_CUDA_GELU_FUSE=0 */
	c->gelu_fuse = !env_off("RL_CUDA_GELU_FUSE");
	c->no_gemv = env_off("RL_CUDA_GEMV");
	c->no_fuse = env_off("RL_CUDA_DECODE_FUSE");
	c->decode_kind = env_pick("RL_CUDA_DECODE_ATTN", "lane split v1 wide") + 1;  /* DK_* */
	c->head_ld = env_pick("RL_CUDA_HEAD_LD", "split 0 1") == 1 ? HL_OFF : HL_SPLIT;
	/* the faster forms of the elementwise kernels, the norm backward and the bias gradient
	 * (on unless the switch is 0; process-wide: the kernels' option word) */
	{
		const char *sw[] = { "RL_CUDA_EW_VEC", "RL_CUDA_NORM_BWD_VEC", "RL_CUDA_COLSUM_VEC" };
		unsigned bit[] = { RLK_OPT_EW_VEC, RLK_OPT_NORM_BWD_VEC, RLK_OPT_COLSUM_VEC }, ko = RLK_OPT_ALL;
		for (int i = 0; i < 3; i++)
			if (env_off(sw[i]))
				ko &= ~bit[i];
		rlk_set_opts(ko);
	}
	c->dec_merge_sep = env_off("RL_CUDA_DECODE_MERGE");
	c->dec_splits = env_int("RL_CUDA_DECODE_SPLITS", 32, 1, 256);
	/* the splits a sequence's context takes of those: one per RL_CUDA_DECODE_SPLIT_KEYS keys
	 * (0, the default: all).  H100: fewer splits are much slower at one slot
	 * (GPT-2 2,528 tok/s with all, 2,320 at 32 keys a split, 1,513 at 256; Qwen 1,012 against
	 * 575 at 256) and the same at 64 and 256 slots: spreading a short context over many
	 * blocks beats the merge it costs.  A diagnostic. */
	c->dec_keys = env_int("RL_CUDA_DECODE_SPLIT_KEYS", 0, 0, 1 << 20);
	/* the decode step in one kernel: off unless RL_CUDA_DECODE_STEP=1 (H100:
	 * correct, but slower than the separate kernels; docs/cuda.md) */
	c->dec_step = env_pick("RL_CUDA_DECODE_STEP", "0 1") == 1;
	/* its diagnostics: a smaller grid, the barrier's poll, the stage profile */
	c->stp_grid = env_int("RL_CUDA_STEP_GRID", 0, 0, 1 << 20);
	c->stp_keys = env_int("RL_CUDA_STEP_SPLIT_KEYS", 256, 0, 1 << 20);
	{
		int b = env_pick("RL_CUDA_STEP_BAR", "sleep spin acq");
		c->stp_bar = b == 1 ? RLK_STEP_BAR_SPIN : b == 2 ? RLK_STEP_BAR_ACQ : RLK_STEP_BAR_SLEEP;
	}
	c->stp_prof = env_pick("RL_CUDA_STEP_PROFILE", "0 1") == 1;
	c->stp_plain = env_pick("RL_CUDA_STEP_COOP", "0 1") == 0;
	/* bias gradients in the dw GEMM's epilogue instead of the column-sum kernel: off unless
	 * RL_CUDA_BGRAD=1 (or =strict: a shape cuBLASLt refuses is an error; for tests) (session
	 * 8, H100: correct, about 1% slower on GPT-2) */
	{
		int bg = env_pick("RL_CUDA_BGRAD", "0 1 strict");
		c->bgrad = bg == 1 ? BG_ON : bg == 2 ? BG_STRICT : BG_OFF;
	}
	c->smp_split = env_int("RL_CUDA_SAMPLE_SPLIT", 65535, 0, 65535);
	if (cudaDeviceGetAttribute(&c->nsm, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
		cudaGetLastError();
		c->nsm = 0;
	}
	/* programmatic dependent launch of the decode step's kernels (common.cuh): compute
	 * capability 9.0 and up, unless RL_CUDA_PDL=0 */
	{
		int major = 0;
		if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
			cudaGetLastError();
			major = 0;
		}
		rlk_set_pdl(major >= 9 && !env_off("RL_CUDA_PDL"));
	}
	/* fuse.cu's products (never run on a GPU yet: off until measured):
	 * RL_CUDA_GEMV_SPLIT=auto|2|4|8 splits each output's weight row over warps,
	 * RL_CUDA_GEMV_PF=1 prefetches the next tile in the head and residual products, =2 in
	 * every product with the grid capped at one resident wave */
	{
		static const int ksv[] = { 0, -1, 2, 4, 8 };
		int k = env_pick("RL_CUDA_GEMV_SPLIT", "0 auto 2 4 8"), pf = env_pick("RL_CUDA_GEMV_PF", "0 1 2");
		rlk_set_gemv(ksv[k < 0 ? 0 : k], pf < 0 ? 0 : pf);
		/* RL_CUDA_DECODE_ATTN=wide's block: RL_CUDA_DECODE_WIDE_WARPS=4|8|16 (unset: 16 with
		 * few sequences, 4 with many) */
		static const int nwv[] = { 0, 4, 8, 16 };
		int w = env_pick("RL_CUDA_DECODE_WIDE_WARPS", "0 4 8 16");
		rlk_set_decode_wide(nwv[w < 0 ? 0 : w]);
	}
	o->name = "cuda";
	o->act_dtype = RL_BF16;
	o->device = device;
	if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		rl_error("cuda: cannot create a stream: %s", cudaGetErrorString(e));
		rv = RL_EDEVICE;
		goto out;
	}
	if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS || cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS) {
		rl_error("cuda: cannot initialise cuBLAS on device %d", device);
		rv = RL_EDEVICE;
		goto out;
	}
	if ((rv = cu_alloc(o, &c->lt_ws, LT_WS_BYTES)) || (rv = cu_alloc(o, (void **)&c->dsum, sizeof(double))))
		goto out;

	o->alloc = cu_alloc;
	o->free = cu_free;
	o->upload = cu_upload;
	o->download = cu_download;
	o->copy = cu_copy;
	o->zero = cu_zero;
	o->cast = cu_cast;
	o->sync = cu_sync;
	o->status = cu_status;
	o->embed_fwd = cu_embed_fwd;
	o->embed_bwd = cu_embed_bwd;
	o->rmsnorm_fwd = cu_rmsnorm_fwd;
	o->rmsnorm_bwd = cu_rmsnorm_bwd;
	o->layernorm_fwd = cu_layernorm_fwd;
	o->layernorm_bwd = cu_layernorm_bwd;
	o->qknorm_fwd = cu_qknorm_fwd;
	o->qknorm_bwd = cu_qknorm_bwd;
	o->matmul_fwd = cu_matmul_fwd;
	o->matmul_bwd = cu_matmul_bwd;
	o->rope_fwd = cu_rope_fwd;
	o->rope_bwd = cu_rope_bwd;
	o->attn_fwd = cu_attn_fwd;
	o->attn_bwd = cu_attn_bwd;
	o->swiglu_fwd = cu_swiglu_fwd;
	o->swiglu_bwd = cu_swiglu_bwd;
	o->gelu_fwd = cu_gelu_fwd;
	o->gelu_bwd = cu_gelu_bwd;
	o->add = cu_add;
	o->logprob_fwd = cu_logprob_fwd;
	o->logprob_bwd = cu_logprob_bwd;
	o->pg_loss = cu_pg_loss;
	o->sumsq = cu_sumsq;
	o->adamw = cu_adamw;
	if (!env_off("RL_CUDA_ADAMW_MULTI"))
		o->adamw_multi = cu_adamw_multi;
	o->kv_write = cu_kv_write;
	o->attn_decode = cu_attn_decode;
	o->sample = cu_sample;
	if (c->gelu_fuse) {
		o->matmul_gelu_fwd = cu_matmul_gelu_fwd;
		o->matmul_dgelu_bwd = cu_matmul_dgelu_bwd;
	}
	if (!env_off("RL_CUDA_ADD_NORM"))
		o->add_norm_fwd = cu_add_norm_fwd;
	/* the norm backwards added into the residual gradient: off unless RL_CUDA_NORM_BWD_ADD=1
	 * (H100: correct, no faster beyond the run-to-run spread; docs/cuda.md) */
	if (env_pick("RL_CUDA_NORM_BWD_ADD", "0 1") == 1) {
		o->layernorm_bwd_add = cu_layernorm_bwd_add;
		o->rmsnorm_bwd_add = cu_rmsnorm_bwd_add;
	}
	if (!env_off("RL_CUDA_GEMM_ADD"))
		o->matmul_add_fwd = cu_matmul_add_fwd;
	if (c->head_ld != HL_OFF) {
		o->head_ld_align = HEAD_LD_ALIGN;
		o->matmul_fwd_ld = cu_matmul_fwd_ld;
		o->matmul_bwd_ld = cu_matmul_bwd_ld;
		o->logprob_fwd_ld = cu_logprob_fwd_ld;
		o->logprob_bwd_ld = cu_logprob_bwd_ld;
	}
	if (!c->no_fuse) {
		o->matmul_fused_fwd = cu_matmul_fused_fwd;
		o->rope_kv_write = cu_rope_kv_write;
		o->matmul_rope_kv_fwd = cu_matmul_rope_kv_fwd;
		if (c->dec_step) {
			o->decode_step_ok = cu_decode_step_ok;
			o->decode_step = cu_decode_step;
		}
	}
	o->host_alloc = cu_host_alloc;
	o->host_free = cu_host_free;
	o->upload_async = cu_upload_async;
	o->download_async = cu_download_async;
	o->decode_advance = cu_decode_advance;
	if (!env_off("RL_CUDA_GRAPH") && !c->prof) {
		o->graph_begin = cu_graph_begin;
		o->graph_end = cu_graph_end;
		o->graph_launch = cu_graph_launch;
		o->graph_ok = cu_graph_ok;
		o->graph_destroy = cu_graph_destroy;
	}
	o->close = cu_close;
	*out = o;
	return RL_OK;
out:
	cu_close(o);
	return rv;
}

#endif /* HAVE_CUDA */

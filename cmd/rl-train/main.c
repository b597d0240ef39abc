/*
 * rl-train — the learner: scored trajectories in, checkpoints and metrics out.
 * Parses options into rl_train_opts and calls lib/train/train.c.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/auth.h"
#include "base/nngx.h"
#include "base/cli.h"
#include "train/algo.h"
#include "compute/comm.h"
#include "base/core.h"
#include "train/groups.h"
#include "base/io.h"
#include "train/train.h"
#include "train/plan.h"
#include "model/lora.h"
#include "plan_print.h"
#include "eval.h"
#include "sync/wsync.h"

static const char usage_text[] =
    "usage: rl-train -m MODEL_DIR --out CKPT_DIR [--algo A] [options] [FILE|-]\n"
    "       rl-train --init CONFIG.json --tokenizer bytes|TOKENIZER.json --out DIR [--seed S]\n"
    "\n"
    "Reads scored trajectories (binary stream or JSONL) and trains the policy;\n"
    "after every step a checkpoint CKPT_DIR/step-N appears and CKPT_DIR/latest\n"
    "points at it.\n"
    "\n"
    "model and data:\n"
    "  -m, --model DIR           initial policy (Hugging Face directory)\n"
    "  -o, --out DIR             checkpoint root (step-NNNNNNNN/, latest)\n"
    "      --init CONFIG.json    write a randomly initialised model to --out and exit\n"
    "      --tokenizer T         with --init: 'bytes' or a tokenizer.json\n"
    "      --seed S              random seed (default 0)\n"
    "      --device D            cpu, cuda, cuda:N or auto (default auto: CUDA when\n"
    "                            a GPU is usable, else the cpu with one line on stderr)\n"
    "algorithm:\n"
    "      --algo A              grpo, dr-grpo, dapo, gspo, rloo, reinforce++, remax, ppo, sft, dpo, rm (default grpo)\n"
    "      --batch G             groups per step (default 8)\n"
    "      --loss-agg MODE       token-mean, seq-mean-token-sum, seq-mean-token-mean,\n"
    "                            seq-mean-token-sum-norm (default: the algorithm's)\n"
    "      --norm-len N          constant of seq-mean-token-sum-norm (default: longest response)\n"
    "      --no-std              GRPO: do not divide advantages by the group's std\n"
    "      --clip-low E          ratio clip 1-E (default 0.2)\n"
    "      --clip-high E         ratio clip 1+E (default 0.2; dapo 0.28; gspo 4e-4, and --clip-low 3e-4)\n"
    "      --dual-clip C         dual-clip constant for negative advantages, above 1 (off)\n"
    "      --tis-cap C           truncated importance sampling cap vs behaviour log-probs (off)\n"
    "      --old-from-behaviour  ratio against the records' log-probs (off-policy records)\n"
    "      --overlong-filter     DAPO's overlong filtering: responses cut at max_tokens (finish\n"
    "                            \"length\") are left out of the loss (still in their group's baseline)\n"
    "      --skip-zero-adv       no forward/backward for sequences whose advantages are all 0\n"
    "                            (default: on wherever the update stays the same; an error\n"
    "                            with ppo, a KL loss term or --ent-coef)\n"
    "      --no-skip-zero-adv    train every sequence (metrics over every token)\n"
    "      --kl k1|k2|k3         KL estimator to the reference policy (off; the options below need it)\n"
    "      --kl-coef B           KL coefficient (default 0.001 when --kl is given)\n"
    "      --kl-in-reward        KL as a token-level reward penalty instead of a loss term\n"
    "      --ref DIR             frozen reference model (else the records' ref_logprobs;\n"
    "                            dpo: else the initial policy -m)\n"
    "      --beta B              dpo: the DPO temperature beta (default 0.1)\n"
    "      --dpo-loss L          dpo: sigmoid, ipo or hinge (default sigmoid)\n"
    "      --label-smoothing E   dpo: sigmoid's label smoothing, 0 to 0.5 excluded (default 0)\n"
    "      --rpo-alpha A         dpo: add A times the NLL of the chosen completions (RPO; off)\n"
    "      --online              dpo, rm: each scored group of n >= 2 gives one pair, its highest\n"
    "                            reward chosen and its lowest rejected; equal rewards: no pair\n"
    "      --ent-coef C          entropy bonus (off)\n"
    "      --gamma G             discount for reinforce++ and ppo's GAE (default 1)\n"
    "      --lambda L            ppo: GAE lambda (default 1)\n"
    "      --vf-coef C           ppo: weight of the value loss (default 0.1)\n"
    "      --value-clip E        ppo: clip values to V_old +- E in the value loss (default 0.5; 0 off)\n"
    "      --critic-lr LR        ppo: learning rate of the value head (default: --lr)\n"
    "      --no-whiten-adv       ppo: do not whiten the GAE advantages over the step\n"
    "      --ppo-epochs E        passes over each step's data (default 1)\n"
    "      --mini-batches M      optimizer updates per pass (default 1)\n"
    "      --max-tokens-per-micro N  token budget of a micro-batch (default 8192)\n"
    "      --micro-tokens N      packed micro-batches: sequences share rows, attention kept\n"
    "                            within each, no padding; at most N tokens each (replaces\n"
    "                            --max-tokens-per-micro)\n"
    "      --recompute           keep one layer's activations, recompute the rest in backward\n"
    "optimizer:\n"
    "      --lr LR               learning rate (default 1e-6)\n"
    "      --warmup N            linear warmup steps (default 0)\n"
    "      --schedule S          constant or cosine (default constant)\n"
    "      --total-steps N       cosine length\n"
    "      --min-lr-ratio R      cosine floor as a fraction of --lr (default 0)\n"
    "      --weight-decay W      decoupled weight decay (default 0)\n"
    "      --beta1 B, --beta2 B, --adam-eps E   AdamW (0.9, 0.999, 1e-8)\n"
    "      --grad-clip N         global-norm clipping (default 1; 0 off)\n"
    "run:\n"
    "      --max-steps N         stop after N steps in total\n"
    "      --save-every N        also a full checkpoint (with optimizer) every N steps (default 0: off)\n"
    "      --save-minutes M      a full checkpoint when M minutes passed since the last (default 10;\n"
    "                            0 off); a new run's first step and the last are always full\n"
    "      --keep K              keep the newest K step directories (default 3; 0 all)\n"
    "      --ckpt-every N        with --sync: a step directory every N steps (default 1); the\n"
    "                            versions between reach --sync from memory only\n"
    "      --resume [auto]       continue from the newest full checkpoint in --out; refused when an\n"
    "                            option of the algorithm differs from OUT/run.yaml (naming each).\n"
    "                            Default (auto): resume when --out holds a full checkpoint, start\n"
    "                            fresh when it holds no step directory, else refuse\n"
    "      --fresh, --no-resume  never resume: refused when --out holds step directories\n"
    "      --allow-change        resume even so (the differences are printed as warnings)\n"
    "      --on-bad error|skip   a bad record fails the run, or drops its group with a warning\n"
    "                            (default: skip with --queue, error otherwise)\n"
    "      --metrics FILE        one JSON object per step ('-' stdout; default stderr)\n"
    "      --tfevents DIR        also write TensorBoard event files\n"
    "      --prom-file FILE      keep the last step's metrics in FILE as Prometheus text (for\n"
    "                            node_exporter's textfile collector), replaced atomically\n"
    "validation (verl's val-core metrics, on the checkpoint just written):\n"
    "      --eval-prompts FILE   held-out prompt lines (rl-rollout's format), generated greedily\n"
    "      --eval-task T         the reward task that scores them (rl-reward --task; required)\n"
    "      --eval-every N        validate every N steps (default 0: only at --max-steps)\n"
    "      --eval-max-tokens N   response tokens at most (default 256)\n"
    "      --eval-samples N      validate on the first N prompt lines (default 0: all)\n"
    "      --sync URL            also push each version to rl-sync (tcp://, ipc://) or a directory\n"
    "      --sync-transport T    auto (shared memory to a server on this host, else deltas), shm,\n"
    "                            stream or nng (deltas over the socket), file (default auto)\n"
    "      --push-parts          every rank pushes its part of each version to --sync (a server)\n"
    "      --publish-inline      write (and push) each version before the next step, not from a\n"
    "                            background thread while it computes (see rl-train(1))\n"
    "      --weights-group HOST:PORT  broadcast each version to rollout workers joined there\n"
    "      --weights-group-size N     this trainer and the N-1 workers of the group\n"
    "      --weights-group-backend B  auto, cpu, nccl or ipc (default auto: on a loopback address with\n"
    "                                 CUDA: ipc; else nccl on CUDA with NCCL; else cpu)\n"
    "      --queue URL           lease scored groups from rl-queue (acknowledged after each step)\n"
    "      --auth-key-file F   the shared key (mode 600) of the broker and rl-sync\n"
    "      --tls-cert F, --tls-key F, --tls-ca F  for tls+tcp:// --queue and --sync URLs: this\n"
    "                            client's certificate and key, the CA of the server's (PEM)\n"
    "      --tls-key-pass-file F  the password of an encrypted --tls-key (first line; mode 600)\n"
    "      --tls-crl F           refuse a server certificate this CRL (PEM) revokes\n"
    "      --idle-exit S         queue mode: stop after S seconds without records\n"
    "      --broker-timeout S    queue mode: exit 1 after S seconds without a reply from the broker,\n"
    "                            after a last full checkpoint (default 300; 0 never)\n"
    "data parallel (docs/parallel.md; every rank reads the whole input; with --queue rank 0 leases):\n"
    "      --rank R, --world N   this process's rank and the number of ranks (else RANK/WORLD_SIZE\n"
    "                            as torchrun sets them, or SLURM_PROCID/SLURM_NTASKS)\n"
    "      --rendezvous HOST:PORT  rank 0's address (else MASTER_ADDR:MASTER_PORT)\n"
    "      --comm-backend B      auto, cpu or nccl (default auto: nccl on CUDA when built with it)\n"
    "      --comm-timeout S      seconds a rank may wait for another (default 600; RL_COMM_TIMEOUT)\n"
    "      --dp-check-every N    compare a weight checksum across ranks every N steps (default 10; 0 never)\n"
    "      --dp-bucket-mb M      gradient all-reduce bucket size in MiB (default 25; also --bucket-mb)\n"
    "      --no-dp-overlap       all-reduce after the backward pass instead of during it\n"
    "      --zero 0|1|2|3        1: ZeRO-1, each rank keeps 1/N of the AdamW state; 2: ZeRO-2, and of the\n"
    "                            gradients, reduce-scattered during the backward pass; 3: ZeRO-3, and of the\n"
    "                            parameters, gathered layer by layer (2, 3: CPU) (default 0)\n"
    "      --no-prefetch         --zero 3: gather each layer when it is needed, not the next one meanwhile\n"
    "      --zero3-keep N        --zero 3: keep up to N parameters of the units last used gathered, so\n"
    "                            that the next pass (run in the other direction) starts on them (default 0)\n"
    "LoRA (docs/lora.md; --device cpu; checkpoints in PEFT's layout):\n"
    "      --lora-rank R         train rank-R adapters on the frozen policy (default 0: full fine-tuning)\n"
    "      --lora-alpha A        scaling A/R (default 16)\n"
    "      --lora-targets LIST   q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (or q,k,...),\n"
    "                            or all-linear (default)\n"
    "      --lora-dropout P      dropout on the adapters' input in training passes (default 0)\n"
    "      --merge-adapter DIR   write base + adapter DIR merged as a model directory --out (base: -m,\n"
    "                            else the adapter's base_model_name_or_path); trains nothing\n"
    "\nMemory plan (prints, trains nothing; -m MODEL_DIR or --init CONFIG names the model):\n"
    "      --plan[=json]         bytes per rank of weights, gradients, AdamW state, activations and\n"
    "                            KV cache for --world, --zero (0-3), --device, --max-tokens-per-micro,\n"
    "                            --recompute, --algo ppo's value head and --lora-rank; ZeRO 2/3 do not run yet\n"
    "                            (on CUDA); a reference model: --ref DIR, or dpo's initial policy\n"
    "      --kv-tokens N         plan a colocated generator's KV cache of N tokens\n"
    "      --gpu-mem SIZE        say whether the plan fits SIZE (e.g. 80G)\n"
    "      --config FILE         options from a YAML file (keys: long options; the command line wins)\n"
    "      --version             print the program version and exit\n"
    "  -q, --quiet, -v, --verbose\n"
    "  -h, --help\n";

enum {
	O_INIT = 256, O_TOKENIZER, O_SEED, O_DEVICE, O_ALGO, O_BATCH, O_AGG, O_NORMLEN, O_NOSTD,
	O_CLIPLO, O_CLIPHI, O_DUAL, O_TIS, O_OLDBEH, O_KL, O_KLCOEF, O_KLREW, O_REF, O_ENT, O_GAMMA,
	O_EPOCHS, O_MINI, O_MICRO, O_PACK, O_LR, O_WARMUP, O_SCHED, O_TOTAL, O_MINLR, O_WD, O_B1, O_B2, O_AEPS,
	O_CLIP, O_MAXSTEPS, O_SAVE, O_KEEP, O_RESUME, O_ONBAD, O_METRICS, O_TFEV, O_PROM, O_QUEUE, O_IDLE, O_BTIMEOUT, O_SYNC, O_PUSHPARTS, O_PUBINL,
	O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_TLS_PASS, O_TLS_CRL, O_AUTH_KEY,
	O_CKEVERY, O_RANK, O_WORLD, O_RDV, O_CBACK, O_CTIME, O_DPCHECK, O_DPBUCKET, O_DPNOOVL, O_ZERO, O_NOPREFETCH, O_Z3KEEP,
	O_PLAN, O_LORAR, O_LORAT, O_LORAA, O_LORAD, O_MERGE, O_KVTOK, O_GPUMEM, O_LAMBDA, O_VFCOEF, O_VCLIP, O_CRITLR, O_NOWHITEN, O_RECOMP,
	O_WGROUP, O_WGSIZE, O_WGBACK, O_STRANS, O_SKIPZ, O_NOSKIPZ, O_ALLOWCH, O_OVERLONG,
	O_DPOBETA, O_DPOLOSS, O_LSMOOTH, O_RPO, O_ONLINE, O_SAVEMIN, O_FRESH,
	O_EVALP, O_EVALT, O_EVALE, O_EVALM, O_EVALN
};

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' }, { "out", required_argument, 0, 'o' },
	{ "init", required_argument, 0, O_INIT }, { "tokenizer", required_argument, 0, O_TOKENIZER },
	{ "seed", required_argument, 0, O_SEED }, { "device", required_argument, 0, O_DEVICE },
	{ "algo", required_argument, 0, O_ALGO }, { "batch", required_argument, 0, O_BATCH },
	{ "loss-agg", required_argument, 0, O_AGG }, { "norm-len", required_argument, 0, O_NORMLEN },
	{ "no-std", no_argument, 0, O_NOSTD }, { "clip-low", required_argument, 0, O_CLIPLO },
	{ "clip-high", required_argument, 0, O_CLIPHI }, { "dual-clip", required_argument, 0, O_DUAL },
	{ "tis-cap", required_argument, 0, O_TIS }, { "old-from-behaviour", no_argument, 0, O_OLDBEH },
	{ "kl", required_argument, 0, O_KL }, { "kl-coef", required_argument, 0, O_KLCOEF },
	{ "kl-in-reward", no_argument, 0, O_KLREW }, { "ref", required_argument, 0, O_REF },
	{ "ent-coef", required_argument, 0, O_ENT }, { "gamma", required_argument, 0, O_GAMMA },
	{ "ppo-epochs", required_argument, 0, O_EPOCHS }, { "mini-batches", required_argument, 0, O_MINI },
	{ "max-tokens-per-micro", required_argument, 0, O_MICRO }, { "micro-tokens", required_argument, 0, O_PACK }, { "lr", required_argument, 0, O_LR },
	{ "warmup", required_argument, 0, O_WARMUP }, { "schedule", required_argument, 0, O_SCHED },
	{ "total-steps", required_argument, 0, O_TOTAL }, { "min-lr-ratio", required_argument, 0, O_MINLR },
	{ "weight-decay", required_argument, 0, O_WD }, { "beta1", required_argument, 0, O_B1 },
	{ "beta2", required_argument, 0, O_B2 }, { "adam-eps", required_argument, 0, O_AEPS },
	{ "grad-clip", required_argument, 0, O_CLIP }, { "max-steps", required_argument, 0, O_MAXSTEPS },
	{ "save-every", required_argument, 0, O_SAVE }, { "keep", required_argument, 0, O_KEEP },
	{ "resume", optional_argument, 0, O_RESUME },
	{ "save-minutes", required_argument, 0, O_SAVEMIN }, { "fresh", no_argument, 0, O_FRESH },
	{ "no-resume", no_argument, 0, O_FRESH }, { "allow-change", no_argument, 0, O_ALLOWCH }, { "on-bad", required_argument, 0, O_ONBAD },
	{ "metrics", required_argument, 0, O_METRICS }, { "tfevents", required_argument, 0, O_TFEV },
	{ "prom-file", required_argument, 0, O_PROM },
	{ "queue", required_argument, 0, O_QUEUE }, { "idle-exit", required_argument, 0, O_IDLE },
	{ "tls-cert", required_argument, 0, O_TLS_CERT }, { "tls-key", required_argument, 0, O_TLS_KEY },
	{ "tls-ca", required_argument, 0, O_TLS_CA }, { "tls-key-pass-file", required_argument, 0, O_TLS_PASS },
	{ "tls-crl", required_argument, 0, O_TLS_CRL },
	{ "auth-key-file", required_argument, 0, O_AUTH_KEY },
	{ "broker-timeout", required_argument, 0, O_BTIMEOUT },
	{ "sync", required_argument, 0, O_SYNC }, { "push-parts", no_argument, 0, O_PUSHPARTS }, { "publish-inline", no_argument, 0, O_PUBINL }, { "ckpt-every", required_argument, 0, O_CKEVERY },
	{ "sync-transport", required_argument, 0, O_STRANS },
	{ "rank", required_argument, 0, O_RANK }, { "world", required_argument, 0, O_WORLD },
	{ "rendezvous", required_argument, 0, O_RDV }, { "comm-backend", required_argument, 0, O_CBACK },
	{ "comm-timeout", required_argument, 0, O_CTIME }, { "dp-check-every", required_argument, 0, O_DPCHECK },
	{ "dp-bucket-mb", required_argument, 0, O_DPBUCKET }, { "bucket-mb", required_argument, 0, O_DPBUCKET },
	{ "no-dp-overlap", no_argument, 0, O_DPNOOVL }, { "zero", required_argument, 0, O_ZERO },
	{ "no-prefetch", no_argument, 0, O_NOPREFETCH }, { "zero3-keep", required_argument, 0, O_Z3KEEP },
	{ "plan", optional_argument, 0, O_PLAN }, { "lora-rank", required_argument, 0, O_LORAR },
	{ "lora-targets", required_argument, 0, O_LORAT }, { "kv-tokens", required_argument, 0, O_KVTOK },
	{ "lora-alpha", required_argument, 0, O_LORAA }, { "lora-dropout", required_argument, 0, O_LORAD },
	{ "merge-adapter", required_argument, 0, O_MERGE },
	{ "gpu-mem", required_argument, 0, O_GPUMEM },
	{ "lambda", required_argument, 0, O_LAMBDA }, { "vf-coef", required_argument, 0, O_VFCOEF },
	{ "value-clip", required_argument, 0, O_VCLIP }, { "critic-lr", required_argument, 0, O_CRITLR },
	{ "no-whiten-adv", no_argument, 0, O_NOWHITEN }, { "recompute", no_argument, 0, O_RECOMP },
	{ "weights-group", required_argument, 0, O_WGROUP }, { "weights-group-size", required_argument, 0, O_WGSIZE },
	{ "weights-group-backend", required_argument, 0, O_WGBACK },
	{ "overlong-filter", no_argument, 0, O_OVERLONG },
	{ "eval-prompts", required_argument, 0, O_EVALP }, { "eval-task", required_argument, 0, O_EVALT },
	{ "eval-every", required_argument, 0, O_EVALE }, { "eval-max-tokens", required_argument, 0, O_EVALM },
	{ "eval-samples", required_argument, 0, O_EVALN },
	{ "skip-zero-adv", no_argument, 0, O_SKIPZ }, { "no-skip-zero-adv", no_argument, 0, O_NOSKIPZ },
	{ "beta", required_argument, 0, O_DPOBETA }, { "dpo-loss", required_argument, 0, O_DPOLOSS },
	{ "label-smoothing", required_argument, 0, O_LSMOOTH }, { "rpo-alpha", required_argument, 0, O_RPO },
	{ "online", no_argument, 0, O_ONLINE },
	{ "quiet", no_argument, 0, 'q' }, { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 }
};

/* The KL term's and the reference's options against the algorithm: a usage
 * error's exit status, or 0. */
static int
kl_ref_usage(const rl_train_opts *o, int kl_coef_set)
{
	if (o->algo == RL_ALGO_DPO && (o->kl_type || o->kl_in_reward || kl_coef_set))
		return rl_cli_usage("%s", "--kl with --algo dpo: DPO's beta (--beta) is its KL weight; the "
		    "reference is --ref, the records' ref_logprobs or the initial policy");
	if (o->algo == RL_ALGO_RM && (o->kl_type || o->kl_in_reward || kl_coef_set || o->ref_dir))
		return rl_cli_usage("%s", "--kl and --ref with --algo rm: a reward model has no reference policy");
	/* the KL term exists only with an estimator: without one these options
	 * were ignored, and the run trained with no KL at all */
	if (!o->kl_type && o->algo != RL_ALGO_DPO && (o->kl_in_reward || kl_coef_set || o->ref_dir))
		return rl_cli_usage("%s needs --kl k1|k2|k3 (the KL estimator; verl's default is k1)",
		    o->kl_in_reward ? "--kl-in-reward" : kl_coef_set ? "--kl-coef" : "--ref");
	if (o->kl_in_reward && o->ref_dir)
		return rl_cli_usage("%s", "--ref with --kl-in-reward: the reward's KL comes from the records' "
		    "ref_logprobs (rl-rollout --score ref_logprobs), not from a model");
	return 0;
}

int
main(int argc, char **argv)
{
	rl_train_opts o;
	rl_comm_opts co;
	static char prog[64];
	const char *init = NULL, *tokenizer = NULL;
	int c, li = 0, verbosity = RL_LOG_NORMAL, clip_high_set = 0, clip_low_set = 0, kl_coef_set = 0, strans_set = 0;
	int plan = 0, zero = 0;
	const char *merge = NULL;
	const char *dpo_set = NULL;
	rl_plan_opts po = { 0 };
	double v;
	static eval_cfg ev = { .max_tokens = 256 };
	const char *eval_task = NULL;
	int eval_every = -1, rc;

	rl_log_init("rl-train", RL_LOG_NORMAL);
	if (rl_cli_wants_version(argc, argv))
		return rl_cli_print_version();
	rl_cli_init("rl-train", longopts);
	if ((c = rl_cli_config(&argc, &argv)) != 0)
		return c;
	rl_train_opts_default(&o);
	rl_comm_opts_default(&co);
	while ((c = rl_cli_getopt(argc, argv, "m:o:qvh", &li)) != -1) {
		const char *a = optarg;
#define NUM(lo, hi) do { if (rl_cli_double(c, a, lo, hi, &v)) return 2; } while (0)
#define INT(lo, hi) do { long long n_; if (rl_cli_int(c, a, lo, hi, &n_)) return 2; v = (double)n_; } while (0)
/* AdamW's betas: 1 (or a value whose float is 1) gives NaN weights */
#define BETA(dst) do { \
		NUM(0, 1); \
		if ((float)v >= 1.0f) \
			return rl_cli_usage("%s: bad value '%s' (a number from 0 to 1, 1 excluded: as a float32 " \
			    "it must stay below 1)", rl_cli_opt(c), a); \
		dst = (float)v; \
	} while (0)
		switch (c) {
		case 'm': o.model_dir = a; break;
		case 'o': o.out_dir = a; break;
		case O_INIT: init = a; break;
		case O_TOKENIZER: tokenizer = a; break;
		case O_SEED:
			if (rl_cli_u64(c, a, &o.seed))
				return 2;
			break;
		case O_DEVICE:
			if (!rl_ops_device_ok(a))
				return rl_cli_usage("--device: want cpu, cuda, cuda:N or auto, not '%s'", a);
			o.device = a;
			break;
		case O_ALGO:
			if ((o.algo = rl_algo_parse(a)) < 0)
				return rl_cli_usage("--algo: unknown algorithm '%s'", a);
			break;
		case O_BATCH: INT(1, 1e7); o.batch = (int)v; break;
		case O_AGG:
			if ((o.agg = rl_agg_parse(a)) < 0)
				return rl_cli_usage("--loss-agg: unknown loss aggregation '%s'", a);
			break;
		case O_NORMLEN: INT(1, 1e9); o.norm_len = (int)v; break;
		case O_NOSTD: o.norm_std = 0; break;
		case O_CLIPLO: NUM(0, 1); o.clip_low = (float)v; clip_low_set = 1; break;
		case O_CLIPHI: NUM(0, 100); o.clip_high = (float)v; clip_high_set = 1; break;
		case O_DUAL:
			NUM(0, 1e9);
			/* c <= 1 caps -A r at -A c <= -A for every A < 0 near r = 1:
			 * no gradient from negative advantages (verl asserts c > 1) */
			if (v != 0 && !((float)v > 1.0f))
				return rl_cli_usage("--dual-clip %s: the dual clip constant must be above 1 (0 is off)", a);
			o.dual_clip = (float)v;
			break;
		case O_TIS: NUM(0, 1e9); o.tis_cap = (float)v; break;
		case O_OLDBEH: o.old_from_behaviour = 1; break;
		case O_KL:
			if (strcmp(a, "k1") == 0) o.kl_type = 1;
			else if (strcmp(a, "k2") == 0) o.kl_type = 2;
			else if (strcmp(a, "k3") == 0 || strcmp(a, "low_var_kl") == 0) o.kl_type = 3;
			else return rl_cli_usage("--kl: unknown KL estimator '%s' (k1, k2, k3)", a);
			break;
		case O_KLCOEF: NUM(0, 1e9); o.kl_coef = (float)v; kl_coef_set = 1; break;
		case O_KLREW: o.kl_in_reward = 1; break;
		case O_REF: o.ref_dir = a; break;
		case O_DPOBETA:
			NUM(0, 1e6);
			if (!(v > 0))
				return rl_cli_usage("--beta %s: beta must be above 0", a);
			o.dpo_beta = (float)v;
			dpo_set = "--beta";
			break;
		case O_DPOLOSS:
			if ((o.dpo_loss = rl_dpo_loss_parse(a)) < 0)
				return rl_cli_usage("--dpo-loss: unknown loss '%s' (sigmoid, ipo, hinge)", a);
			dpo_set = "--dpo-loss";
			break;
		case O_LSMOOTH:
			NUM(0, 0.5);
			if (v >= 0.5)
				return rl_cli_usage("--label-smoothing %s: want 0 <= E < 0.5", a);
			o.label_smoothing = (float)v;
			dpo_set = "--label-smoothing";
			break;
		case O_RPO: NUM(0, 1e6); o.rpo_alpha = (float)v; dpo_set = "--rpo-alpha"; break;
		case O_ONLINE: o.online = 1; break;
		case O_ENT: NUM(-1e9, 1e9); o.ent_coef = (float)v; break;
		case O_GAMMA: NUM(0, 1); o.gamma = (float)v; break;
		case O_LAMBDA: NUM(0, 1); o.lambda = (float)v; break;
		case O_VFCOEF: NUM(0, 1e6); o.vf_coef = (float)v; break;
		case O_VCLIP: NUM(0, 1e9); o.value_clip = (float)v; break;
		case O_CRITLR: NUM(0, 10); o.critic_lr = (float)v; break;
		case O_NOWHITEN: o.whiten_adv = 0; break;
		case O_SKIPZ: o.skip_zero_adv = 1; break;
		case O_OVERLONG: o.overlong_filter = 1; break;
		case O_NOSKIPZ: o.skip_zero_adv = 0; break;
		case O_EPOCHS: INT(1, 1000); o.ppo_epochs = (int)v; break;
		case O_MINI: INT(1, 1e6); o.mini_batches = (int)v; break;
		case O_MICRO: INT(1, 1e9); o.max_tokens_micro = (int)v; break;
		case O_PACK: INT(1, 1e9); o.micro_tokens = (int)v; break;
		case O_RECOMP: o.recompute = 1; break;
		case O_LR: NUM(0, 10); o.lr = (float)v; break;
		case O_WARMUP: INT(0, 1e9); o.warmup = (int)v; break;
		case O_SCHED:
			if (strcmp(a, "constant") == 0) o.sched = RL_SCHED_CONSTANT;
			else if (strcmp(a, "cosine") == 0) o.sched = RL_SCHED_COSINE;
			else return rl_cli_usage("--schedule: unknown schedule '%s' (constant, cosine)", a);
			break;
		case O_TOTAL: INT(0, 1e9); o.total_steps = (int)v; break;
		case O_MINLR: NUM(0, 1); o.min_lr_ratio = (float)v; break;
		case O_WD: NUM(0, 10); o.weight_decay = (float)v; break;
		case O_B1: BETA(o.beta1); break;
		case O_B2: BETA(o.beta2); break;
		case O_AEPS: NUM(0, 1); o.adam_eps = (float)v; break;
		case O_CLIP: NUM(0, 1e9); o.grad_clip = (float)v; break;
		case O_MAXSTEPS: INT(0, 1e9); o.max_steps = (int)v; break;
		case O_SAVE: INT(0, 1e9); o.save_every = (int)v; break;
		case O_KEEP: INT(0, 1e9); o.keep = (int)v; break;
		case O_CKEVERY: INT(1, 1e9); o.ckpt_every = (int)v; break;
		case O_RESUME:
			if (!a || strcmp(a, "yes") == 0) o.resume = RL_RESUME_YES;
			else if (strcmp(a, "auto") == 0) o.resume = RL_RESUME_AUTO;
			else return rl_cli_usage("--resume: bad value '%s' (--resume or --resume=auto)", a);
			break;
		case O_FRESH: o.resume = RL_RESUME_NO; break;
		case O_SAVEMIN: NUM(0, 1e9); o.save_minutes = v; break;
		case O_ALLOWCH: o.allow_change = 1; break;
		case O_ONBAD:
			if (strcmp(a, "error") == 0) o.on_bad = RL_BAD_ERROR;
			else if (strcmp(a, "skip") == 0) o.on_bad = RL_BAD_SKIP;
			else return rl_cli_usage("--on-bad takes error or skip, not '%s'", a);
			break;
		case O_METRICS: o.metrics_path = a; break;
		case O_TFEV: o.tfevents_dir = a; break;
		case O_PROM: o.prom_path = a; break;
		case O_EVALP: ev.prompts = a; break;
		case O_EVALT: eval_task = a; break;
		case O_EVALE: INT(0, 1e9); eval_every = (int)v; break;
		case O_EVALM: INT(1, 1e7); ev.max_tokens = (int)v; break;
		case O_EVALN: INT(0, 1e9); ev.samples = (int)v; break;
		case O_QUEUE: o.queue_url = a; break;
		case O_TLS_CERT: rli_nng_tls_opt('c', a); break;
		case O_TLS_KEY: rli_nng_tls_opt('k', a); break;
		case O_TLS_CA: rli_nng_tls_opt('a', a); break;
		case O_TLS_PASS: rli_nng_tls_opt('p', a); break;
		case O_TLS_CRL: rli_nng_tls_opt('r', a); break;
		case O_AUTH_KEY: if (rli_auth_set_file(a) != 0) return 2; break;
		case O_SYNC: o.sync_url = a; break;
		case O_PUSHPARTS: o.push_parts = 1; break;
		case O_PUBINL: o.publish_inline = 1; break;
		case O_STRANS:
			if (rl_wsync_transport_parse(a, &o.sync_transport) != 0)
				return rl_cli_usage("--sync-transport: want auto, shm, stream, nng or file, not '%s'", a);
			strans_set = 1;
			break;
		case O_WGROUP: o.wgroup_addr = a; break;
		case O_WGSIZE: INT(2, 65536); o.wgroup_size = (int)v; break;
		case O_WGBACK:
			if (strcmp(a, "auto") && strcmp(a, "cpu") && strcmp(a, "nccl") && strcmp(a, "ipc"))
				return rl_cli_usage("--weights-group-backend takes auto, cpu, nccl or ipc, not '%s'", a);
			o.wgroup_backend = a;
			break;
		case O_IDLE: NUM(0, 1e9); o.idle_exit = v; break;
		case O_BTIMEOUT: NUM(0, 1e9); o.broker_timeout = v; break;
		case O_RANK: INT(0, 1e6); co.rank = (int)v; break;
		case O_WORLD:
			if (rl_cli_int32(c, a, 1, 1000000, &co.world))
				return 2;
			break;
		case O_RDV: co.master = a; break;
		case O_CBACK:
			if (strcmp(a, "auto") && strcmp(a, "cpu") && strcmp(a, "nccl"))
				return rl_cli_usage("--comm-backend takes auto, cpu or nccl, not '%s'", a);
			co.backend = a;
			break;
		case O_CTIME: NUM(0.001, 1e6); co.timeout = v; break;
		case O_DPCHECK: INT(0, 1e9); o.dp_check_every = (int)v; break;
		case O_DPBUCKET: NUM(0.001, 1e6); o.dp_bucket_mb = v; break;
		case O_DPNOOVL: o.dp_overlap = 0; break;
		case O_NOPREFETCH: o.zero3_no_prefetch = 1; break;
		case O_Z3KEEP: NUM(0, 1e15); o.zero3_keep = (size_t)v; break;
		case O_ZERO:
			if (strcmp(a, "0") && strcmp(a, "1") && strcmp(a, "2") && strcmp(a, "3"))
				return rl_cli_usage("--zero takes 0, 1, 2 or 3 (1: optimizer state sharded, 2: gradients too, "
				    "3: parameters too), not '%s'", a);
			zero = a[0] - '0';
			o.zero = zero;
			break;
		case O_PLAN:
			if (a && strcmp(a, "json") != 0)
				return rl_cli_usage("--plan: bad value '%s' (--plan or --plan=json)", a);
			plan = a ? 2 : 1;
			break;
		case O_LORAR: INT(1, 65536); po.lora_rank = o.lora_rank = (int)v; break;
		case O_LORAA: NUM(1e-6, 1e6); o.lora_alpha = (float)v; break;
		case O_LORAD:
			NUM(0, 1);
			if (v >= 1)
				return rl_cli_usage("--lora-dropout takes a probability in [0, 1), not '%s'", a);
			o.lora_dropout = (float)v;
			break;
		case O_MERGE: merge = a; break;
		case O_LORAT:
			if ((o.lora_targets = po.lora_targets = lora_targets(a)) == 0)
				return rl_cli_usage("--lora-targets: bad value '%s' (some of q,k,v,o,gate,up,down, or "
				    "q_proj,... as peft names them)", a);
			break;
		case O_KVTOK: INT(0, 1e15); po.kv_tokens = (long long)v; break;
		case O_GPUMEM: {
			uint64_t b;
			if (rl_cli_bytes(c, a, 1, 1ULL << 50, &b))
				return 2;
			po.gpu_bytes = (double)b;
			break;
		}
		case 'q': verbosity = RL_LOG_QUIET; o.quiet = 1; break;
		case 'v': verbosity++; break;
		case 'h':
			fputs(usage_text, stdout);
			return rl_io_close_stdout() ? 1 : 0;
		default:
			/* getopt_long said what was wrong */
			rl_hint("rl-train --help lists the options");
			return 2;
		}
#undef NUM
#undef INT
#undef BETA
	}
	rl_log_set_level(verbosity);
	/* before the plan too: whether there is a reference model to plan */
	if ((rc = kl_ref_usage(&o, kl_coef_set)) != 0)
		return rc;
	if (plan)
		return print_plan(&o, &po, co.world, zero, init, plan == 2);
	if (po.kv_tokens || po.gpu_bytes > 0)
		return rl_cli_usage("--kv-tokens and --gpu-mem are for --plan");
	if (merge) {
		if (!o.out_dir)
			return rl_cli_usage("--merge-adapter needs --out DIR (the merged model directory)");
		if (optind < argc)
			return rl_cli_usage("unexpected argument '%s' with --merge-adapter", argv[optind]);
		return rl_train_merge_adapter(merge, o.model_dir, o.out_dir) ? 1 : 0;
	}
	if (!o.lora_rank && (o.lora_alpha != 16.0f || o.lora_dropout != 0 || o.lora_targets != RL_LORA_ALL))
		return rl_cli_usage("--lora-alpha, --lora-dropout and --lora-targets need --lora-rank R");
	if (o.lora_rank && o.device && strncmp(o.device, "cuda", 4) == 0)
		return rl_cli_usage("--lora-rank trains on --device cpu only: the adapters' CUDA path is not written "
		    "(rl-rollout --adapter runs on CUDA)");
	if (init) {
		if (!o.out_dir)
			return rl_cli_usage("--init needs --out DIR");
		if (optind < argc)
			return rl_cli_usage("unexpected argument '%s' with --init", argv[optind]);
		int rv = rl_train_init_model(init, tokenizer ? tokenizer : "bytes", o.out_dir, o.seed);
		if (rv)
			return 1;
		return 0;
	}
	if (optind + 1 < argc)
		return rl_cli_usage("more than one input ('%s'): concatenate them", argv[optind + 1]);
	if (optind < argc)
		o.input = argv[optind];
	if (o.queue_url && optind < argc)
		return rl_cli_usage("with --queue the records come from the broker, not '%s'", argv[optind]);
	if (!o.out_dir)
		return rl_cli_usage("no output directory: --out DIR");
	if (!o.model_dir && o.resume == RL_RESUME_NO)
		return rl_cli_usage("no model: -m MODEL_DIR (or --resume)");
	if (strans_set && !o.sync_url)
		return rl_cli_usage("--sync-transport needs --sync URL");
	if (o.push_parts && (!o.sync_url || !strstr(o.sync_url, "://")))
		return rl_cli_usage("--push-parts needs --sync URL of an rl-sync server (tcp://, ipc://)");
	if (o.push_parts && o.lora_rank > 0)
		return rl_cli_usage("--push-parts with --lora-rank: an adapter version is small; push it whole");
	if (o.ckpt_every > 1 && !o.sync_url && !o.wgroup_addr)
		return rl_cli_usage("--ckpt-every needs --sync URL or --weights-group (where the versions between go)");
	if (!o.wgroup_addr != !o.wgroup_size)
		return rl_cli_usage("--weights-group and --weights-group-size go together");
	if (o.algo == RL_ALGO_DAPO && !clip_high_set)
		o.clip_high = 0.28f;
	if (o.algo == RL_ALGO_GSPO) {
		/* the GSPO paper's and verl's gspo recipe: a sequence ratio moves little */
		if (!clip_low_set)
			o.clip_low = 3e-4f;
		if (!clip_high_set)
			o.clip_high = 4e-4f;
		if (o.dual_clip > 0 || o.tis_cap > 0)
			return rl_cli_usage("%s with --algo gspo: a bound on the token ratio; gspo's ratio is the "
			    "sequence's", o.dual_clip > 0 ? "--dual-clip" : "--tis-cap");
	}
	if (dpo_set && o.algo != RL_ALGO_DPO)
		return rl_cli_usage("%s is an option of --algo dpo", dpo_set);
	if (o.online && o.algo != RL_ALGO_DPO && o.algo != RL_ALGO_RM)
		return rl_cli_usage("--online is an option of --algo dpo and rm (pairs formed from scored groups)");
	/* dpo and rm read a pair as two padded rows (step.c); packing lays rows out
	 * otherwise */
	if (o.micro_tokens > 0 && (o.algo == RL_ALGO_DPO || o.algo == RL_ALGO_RM))
		return rl_cli_usage("--micro-tokens (packed rows) is not available with --algo %s; use --max-tokens-per-micro",
		    o.algo == RL_ALGO_DPO ? "dpo" : "rm");
	if (o.algo == RL_ALGO_DPO && o.label_smoothing > 0 && o.dpo_loss != RL_DPO_SIGMOID)
		return rl_cli_usage("--label-smoothing with --dpo-loss %s: only sigmoid has it (TRL's cDPO)",
		    rl_dpo_loss_name(o.dpo_loss));
	if (o.kl_type && !kl_coef_set)
		o.kl_coef = 0.001f;
	if (o.skip_zero_adv > 0 && rl_train_skip_inexact(&o))
		return rl_cli_usage("--skip-zero-adv would change the update: %s", rl_train_skip_inexact(&o));
	/* launch configuration: the command line, else torchrun's or SLURM's variables */
	if (co.rank >= 0 && co.world < 0 && !getenv("WORLD_SIZE") && !getenv("SLURM_NTASKS"))
		return rl_cli_usage("--rank without --world (or WORLD_SIZE)");
	if (rl_comm_opts_from_env(&co) != RL_OK) {
		rl_hint("see 'data parallel' in rl-train --help");
		return 2;
	}
	if (co.world > 1) {
		snprintf(prog, sizeof prog, "rl-train: rank %d", co.rank);
		rl_log_init(prog, verbosity);
		o.comm = &co;
	}
	if (ev.prompts) {
		if ((rc = eval_setup(&ev, &o, eval_task, eval_every)) != 0)
			return rc;
	} else if (eval_task || eval_every >= 0) {
		return rl_cli_usage("%s needs --eval-prompts FILE", eval_task ? "--eval-task" : "--eval-every");
	}
	rc = rl_train_run(&o);
	if (ev.prompts)
		eval_fini(&ev);
	if (rc != RL_OK)
		return 1;
	if (rl_io_close_stdout() != 0)
		return 1;
	/* stopped by SIGINT/SIGTERM before the end of its input (checkpoint written) */
	return rl_train_stopped_by() ? 128 + rl_train_stopped_by() : 0;
}

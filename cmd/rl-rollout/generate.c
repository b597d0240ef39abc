/*
 * generate.c — `rl-rollout -m MODEL [-n G] [PROMPTS|-]` and `rl-rollout
 * --score FIELD`: the options into rl_rollout_opts, checked for what goes
 * together, then lib/rollout (rl_rollout_run); the library's error becomes
 * the exit status.  SIGINT and SIGTERM stop queue mode cleanly
 * (rl_rollout_stop); elsewhere they end the process as usual.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "base/auth.h"
#include "base/nngx.h"
#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "compute/ops.h"
#include "rollout/rollout.h"
#include "sync/wsync.h"
#include "tok/tokenizer.h"

static const char usage_text[] =
    "usage: rl-rollout -m MODEL_DIR [-n G] [options] [PROMPTS.jsonl|-]\n"
    "       rl-rollout --score FIELD -m MODEL_DIR [options] [TRAJECTORIES|-]\n"
    "       rl-rollout tokenize -m MODEL_DIR [--chat] [--decode] [FILE|-]\n"
    "       rl-rollout serve -m MODEL_DIR [--listen ADDR] [options]  (an OpenAI-compatible server)\n"
    "\n"
    "Generates G samples per prompt line and writes trajectory records (binary\n"
    "stream, or JSONL with --jsonl).  A prompt line is {\"prompt\": TEXT or\n"
    "[{\"role\": .., \"content\": ..}], ...}; every other key goes to the record's meta.\n"
    "\n"
    "  -m, --model DIR         the policy (Hugging Face directory)\n"
    "  -n, --samples G         samples per prompt (default 1)\n"
    "  -o, --output FILE       write here instead of stdout\n"
    "      --jsonl             write JSONL instead of the binary stream\n"
    "      --temperature T     sampling temperature (default 1; 0 = greedy)\n"
    "      --top-p P           nucleus sampling (default 1 = off)\n"
    "      --top-k K           top-k sampling (default 0 = off)\n"
    "      --max-tokens N      response tokens at most (default 256)\n"
    "      --stop STR          stop string (repeatable)\n"
    "      --stop-id ID        stop token id (repeatable)\n"
    "      --seed S            sampling seed (default 0): same seed, same output\n"
    "      --chat              wrap text prompts as a user message in the chat template\n"
    "      --chat-template T   chatml, plain or auto (default auto)\n"
    "      --no-thinking       enable_thinking=false for Qwen3 chat prompts whose line has\n"
    "                          no chat_template_kwargs (default: thinking on)\n"
    "      --greedy-baseline   one more greedy sample per prompt, marked meta.baseline (ReMax)\n"
    "      --slots N           sequences decoded together (default 64)\n"
    "      --kv-mem BYTES      KV cache budget, suffixes K M G (default 256M)\n"
    "      --decode-steps N    decode steps queued at once while no prompt waits (default 1)\n"
    "      --device D          cpu, cuda, cuda:N or auto (default auto: CUDA when\n"
    "                          a GPU is usable, else the cpu with one line on stderr)\n"
    "      --adapter DIR       a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors)\n"
    "                          merged into -m's weights at load\n"
    "      --weights-from DIR  load new weight versions from DIR/latest as they appear (a LoRA\n"
    "                          run's adapter checkpoints: each merged into -m's weights)\n"
    "      --max-staleness K   wait for version >= batches emitted - K (with --weights-from)\n"
    "      --max-staleness auto[:MAX]  K between 0 and MAX (default 4) from this process's\n"
    "                          idle time and the trainer's, and its drift (needs --trainer-metrics)\n"
    "      --trainer-metrics F rl-train's --metrics file, read as it grows (auto K)\n"
    "      --resume DIR        continue the run rl-train --out DIR checkpointed: start from its newest\n"
    "                          full checkpoint's weights, skip the prompts of the groups done there\n"
    "      --train-batch G     groups per trainer step, for --max-staleness (default 8)\n"
    "      --partial           new weights apply to sequences already running\n"
    "      --sync URL          new weight versions from rl-sync (tcp://, ipc://) or a directory\n"
    "      --sync-transport T  auto (shared memory with a server on this host), shm, stream, nng or file\n"
    "      --weights-timeout S give up waiting for a weights version after S seconds (default 600; 0 never)\n"
    "      --weights-group HOST:PORT  new versions broadcast by the trainer of that group\n"
    "      --weights-group-rank R     this worker's rank in it (1 .. size-1; the trainer is 0)\n"
    "      --weights-group-size N     the trainer and its N-1 workers\n"
    "      --weights-group-backend B  auto, cpu, nccl or ipc (default auto: on a loopback address with\n"
    "                                 CUDA: ipc; else nccl on CUDA with NCCL; else cpu)\n"
    "      --skip-bad          skip bad prompt lines (counted) instead of stopping\n"
    "      --score FIELD       score mode: write per-token log-probs into FIELD\n"
    "      --queue URL         lease prompts from rl-queue and put the trajectories back\n"
    "      --auth-key-file F   the shared key (mode 600) of the broker and rl-sync\n"
    "      --tls-cert F, --tls-key F, --tls-ca F  for tls+tcp:// --queue and --sync URLs: this\n"
    "                          client's certificate and key, the CA of the server's (PEM)\n"
    "      --tls-key-pass-file F  the password of an encrypted --tls-key (first line; mode 600)\n"
    "      --tls-crl F         refuse a server certificate this CRL (PEM) revokes\n"
    "      --idle-exit S       queue mode: exit after S seconds without work (default: run until signalled)\n"
    "      --broker-timeout S  queue mode: exit 1 after S seconds without a reply from the broker\n"
    "                          (default 300; 0 never)\n"
    "      --env CMD           multi-turn episodes: a pool of environment processes (sh -c CMD)\n"
    "                          speaking rl-env(5); one episode per sample\n"
    "      --env-procs N       environment processes (default: --slots)\n"
    "      --env-timeout S     an environment's answer may take S seconds (default 60; 0 no limit)\n"
    "      --env-framing F     observations as plain text or ChatML turns: auto (chatml with --chat),\n"
    "                          plain or chatml\n"
    "      --max-turns N       model turns per episode at most (default 0: no limit)\n"
    "      --max-episode-tokens N  tokens after the prompt per episode, the environment's included\n"
    "                          (default: the model's context, at most 1024); --max-tokens limits\n"
    "                          each model turn\n"
    "      --config FILE       options from a YAML file (keys: long options; the command line wins)\n"
    "      --version           print the program version and exit\n"
    "  -q, --quiet, -v, --verbose, -h, --help\n";

enum {
	O_JSONL = 256, O_TEMP, O_TOPP, O_TOPK, O_MAXTOK, O_STOP, O_STOPID, O_SEED, O_CHAT, O_TMPL,
	O_GREEDY, O_SLOTS, O_KVMEM, O_DEVICE, O_WFROM, O_STALE, O_TBATCH, O_PARTIAL, O_SKIPBAD, O_SCORE,
	O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_TLS_PASS, O_TLS_CRL, O_AUTH_KEY, O_QUEUE, O_IDLE, O_WTIMEOUT, O_SYNC, O_STRANS,
	O_DSTEPS, O_RESUME, O_NOTHINK, O_BTIMEOUT, O_ENV, O_ENVPROCS, O_ENVTIMEOUT, O_ENVFRAME, O_MAXTURNS,
	O_MAXEP, O_ADAPTER, O_TMETRICS
};

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' }, { "samples", required_argument, 0, 'n' },
	{ "output", required_argument, 0, 'o' }, { "jsonl", no_argument, 0, O_JSONL },
	{ "temperature", required_argument, 0, O_TEMP }, { "top-p", required_argument, 0, O_TOPP },
	{ "top-k", required_argument, 0, O_TOPK }, { "max-tokens", required_argument, 0, O_MAXTOK },
	{ "stop", required_argument, 0, O_STOP }, { "stop-id", required_argument, 0, O_STOPID },
	{ "seed", required_argument, 0, O_SEED }, { "chat", no_argument, 0, O_CHAT },
	{ "chat-template", required_argument, 0, O_TMPL }, { "greedy-baseline", no_argument, 0, O_GREEDY },
	{ "slots", required_argument, 0, O_SLOTS }, { "kv-mem", required_argument, 0, O_KVMEM },
	{ "decode-steps", required_argument, 0, O_DSTEPS }, { "no-thinking", no_argument, 0, O_NOTHINK },
	{ "device", required_argument, 0, O_DEVICE }, { "weights-from", required_argument, 0, O_WFROM },
	{ "adapter", required_argument, 0, O_ADAPTER },
	{ "resume", required_argument, 0, O_RESUME },
	{ "max-staleness", required_argument, 0, O_STALE }, { "train-batch", required_argument, 0, O_TBATCH },
	{ "trainer-metrics", required_argument, 0, O_TMETRICS },
	{ "partial", no_argument, 0, O_PARTIAL }, { "skip-bad", no_argument, 0, O_SKIPBAD },
	{ "score", required_argument, 0, O_SCORE }, { "queue", required_argument, 0, O_QUEUE },
	{ "tls-cert", required_argument, 0, O_TLS_CERT }, { "tls-key", required_argument, 0, O_TLS_KEY },
	{ "tls-ca", required_argument, 0, O_TLS_CA }, { "tls-key-pass-file", required_argument, 0, O_TLS_PASS },
	{ "tls-crl", required_argument, 0, O_TLS_CRL },
	{ "auth-key-file", required_argument, 0, O_AUTH_KEY },
	{ "idle-exit", required_argument, 0, O_IDLE }, { "broker-timeout", required_argument, 0, O_BTIMEOUT },
	{ "weights-timeout", required_argument, 0, O_WTIMEOUT }, { "sync", required_argument, 0, O_SYNC },
	{ "sync-transport", required_argument, 0, O_STRANS },
	RLO_WGROUP_LONGOPTS,
	{ "env", required_argument, 0, O_ENV }, { "env-procs", required_argument, 0, O_ENVPROCS },
	{ "env-timeout", required_argument, 0, O_ENVTIMEOUT }, { "env-framing", required_argument, 0, O_ENVFRAME },
	{ "max-turns", required_argument, 0, O_MAXTURNS }, { "max-episode-tokens", required_argument, 0, O_MAXEP },
	{ "quiet", no_argument, 0, 'q' }, { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 }
};

static void
on_signal(int sig)
{
	(void)sig;
	rl_rollout_stop();
}

/* What goes together among the options; 0, or the usage error's 2. */
static int
check_opts(const rl_rollout_opts *o)
{
	int rv;

	if ((rv = rl_cmd_wgroup_check(o)) != 0)
		return rv;
	if (o->auto_k && o->queue_url)
		return rl_cli_usage("--max-staleness auto is the pipe wiring's: with --queue the broker chooses K "
		    "(rl-queue serve --max-staleness auto)");
	if (o->auto_k && !o->trainer_metrics)
		return rl_cli_usage("--max-staleness auto needs --trainer-metrics FILE (rl-train's --metrics file)");
	if (o->trainer_metrics && !o->auto_k)
		return rl_cli_usage("--trainer-metrics is read for --max-staleness auto[:MAX] only");
	if (!o->env_cmd && (o->env_procs || o->max_turns || o->go.max_episode || o->env_framing))
		return rl_cli_usage("--env-procs, --env-framing, --max-turns and --max-episode-tokens need --env CMD");
	if (o->env_cmd && (o->score_field || o->greedy))
		return rl_cli_usage("--env runs episodes (records of sampled turns): not with %s",
		    o->score_field ? "--score" : "--greedy-baseline");
	if (o->sync_transport && !o->sync_url)
		return rl_cli_usage("--sync-transport needs --sync URL");
	return 0;
}

/* One option c with argument a into o; 0, 1 for --help (printed), or the
 * usage error's 2 (printed). */
static int
parse_opt(rl_rollout_opts *o, int c, const char *a, int *verbosity)
{
	double v;
	uint64_t kv;
	int rv = 0;

	switch (c) {
	case 'm': o->model_dir = a; break;
	case 'n': rv = rl_cli_int32(c, a, 1, 65536, &o->n); break;
	case 'o': o->out_path = a; break;
	case O_JSONL: o->jsonl = 1; break;
	case O_TEMP:
		if ((rv = rl_cli_double(c, a, 0, 100, &v)) != 0)
			break;
		/* below 1e-5 is greedy, as in vLLM: logits / 1e-45 overflow to inf, and
		 * every log-prob would be NaN */
		o->go.sp.temperature = v < 1e-5 ? 0.0f : (float)v;
		break;
	case O_TOPP:
		if ((rv = rl_cli_double(c, a, 0, 1, &v)) == 0)
			o->go.sp.top_p = (float)v;
		break;
	case O_TOPK: rv = rl_cli_int32(c, a, 0, 1000000000, &o->go.sp.top_k); break;
	case O_MAXTOK: rv = rl_cli_int32(c, a, 1, 10000000, &o->go.max_new); break;
	case O_STOP:
		if (o->nstop == RL_ROLLOUT_MAX_STOPS || !*a)
			return rl_cli_usage("too many or empty --stop '%s'", a);
		o->stops[o->nstop++] = a;
		break;
	case O_STOPID: {
		int id;
		if ((rv = rl_cli_int32(c, a, 0, 2000000000, &id)) != 0)
			break;
		if (o->nstop_ids == RL_ROLLOUT_MAX_STOPS)
			return rl_cli_usage("too many --stop-id ('%s')", a);
		o->stop_ids[o->nstop_ids++] = id;
		break;
	}
	case O_SEED: rv = rl_cli_u64(c, a, &o->seed); break;
	case O_CHAT: o->chat = 1; break;
	case O_NOTHINK: o->no_think = 1; break;
	case O_TMPL:
		if ((o->tmpl = rl_chat_template_parse(a)) < 0)
			return rl_cli_usage("--chat-template: unknown chat template '%s' (auto, chatml, plain)", a);
		break;
	case O_GREEDY: o->greedy = 1; break;
	case O_SLOTS: rv = rl_cli_int32(c, a, 1, 65536, &o->go.slots); break;
	case O_DSTEPS: rv = rl_cli_int32(c, a, 1, RL_GEN_MAX_STEPS, &o->go.decode_steps); break;
	case O_KVMEM:
		/* at most 1 TiB: past that, a typo */
		if ((rv = rl_cli_bytes(c, a, 0, 1ULL << 40, &kv)) == 0)
			o->go.kv_mem = (size_t)kv;
		break;
	case O_DEVICE:
		if (!rl_ops_device_ok(a))
			return rl_cli_usage("--device: want cpu, cuda, cuda:N or auto, not '%s'", a);
		o->device = a;
		break;
	case O_WFROM: o->weights_from = a; break;
	case O_ADAPTER: o->adapter_dir = a; break;
	case O_RESUME: o->resume_dir = a; break;
	case O_STALE:
		o->auto_k = 0;
		if (strncmp(a, "auto", 4) == 0 && (a[4] == 0 || a[4] == ':')) {
			o->auto_k = 1;
			o->auto_kmax = 4;
			o->max_staleness = 0;
			if (a[4] == ':' && (rv = rl_cli_int32(c, a + 5, 0, 1000000, &o->auto_kmax)) != 0)
				return rl_cli_usage("--max-staleness: bad value '%s' (K, auto or auto:MAX)", a);
			break;
		}
		rv = rl_cli_int32(c, a, 0, 1000000000, &o->max_staleness);
		break;
	case O_TMETRICS: o->trainer_metrics = a; break;
	case O_TBATCH: rv = rl_cli_int32(c, a, 1, 1000000000, &o->train_batch); break;
	case O_PARTIAL: o->partial = 1; break;
	case O_SKIPBAD: o->skip_bad = 1; break;
	case O_SCORE: o->score_field = a; break;
	case O_QUEUE: o->queue_url = a; break;
	case O_TLS_CERT: rli_nng_tls_opt('c', a); break;
	case O_TLS_KEY: rli_nng_tls_opt('k', a); break;
	case O_TLS_CA: rli_nng_tls_opt('a', a); break;
	case O_TLS_PASS: rli_nng_tls_opt('p', a); break;
	case O_TLS_CRL: rli_nng_tls_opt('r', a); break;
	case O_AUTH_KEY: rv = rli_auth_set_file(a) != 0 ? 2 : 0; break;
	case O_IDLE: rv = rl_cli_double(c, a, 0, 1e9, &o->idle_exit); break;
	case O_BTIMEOUT: rv = rl_cli_double(c, a, 0, 1e9, &o->broker_timeout); break;
	case O_WTIMEOUT: rv = rl_cli_double(c, a, 0, 1e9, &o->weights_timeout); break;
	case O_SYNC: o->sync_url = a; break;
	case RLO_WGROUP: case RLO_WGRANK: case RLO_WGSIZE: case RLO_WGBACK: rv = rl_cmd_wgroup_opt(o, c, a); break;
	case O_STRANS:
		if (rl_wsync_transport_parse(a, &o->sync_transport) != 0)
			return rl_cli_usage("--sync-transport: want auto, shm, stream, nng or file, not '%s'", a);
		break;
	case O_ENV: o->env_cmd = a; break;
	case O_ENVPROCS: rv = rl_cli_int32(c, a, 1, 4096, &o->env_procs); break;
	case O_ENVTIMEOUT: rv = rl_cli_double(c, a, 0, 1e9, &o->env_timeout); break;
	case O_MAXTURNS: rv = rl_cli_int32(c, a, 0, 1000000000, &o->max_turns); break;
	case O_MAXEP: rv = rl_cli_int32(c, a, 1, 1000000000, &o->go.max_episode); break;
	case O_ENVFRAME:
		if (strcmp(a, "auto") == 0)
			o->env_framing = RL_ENV_FRAME_AUTO;
		else if (strcmp(a, "plain") == 0)
			o->env_framing = RL_ENV_FRAME_PLAIN;
		else if (strcmp(a, "chatml") == 0)
			o->env_framing = RL_ENV_FRAME_CHATML;
		else
			return rl_cli_usage("--env-framing: want auto, plain or chatml, not '%s'", a);
		break;
	case 'q': *verbosity = RL_LOG_QUIET; o->quiet = 1; break;
	case 'v': (*verbosity)++; break;
	case 'h':
		fputs(usage_text, stdout);
		return 1;
	default:
		fprintf(stderr, "rl-rollout: hint: rl-rollout --help lists the options\n");
		return 2;
	}
	return rv;
}

int
rl_cmd_generate(int argc, char **argv)
{
	rl_rollout_opts o;
	int c, rv, verbosity = RL_LOG_NORMAL;

	rl_rollout_opts_default(&o);
	static const char *const lists[] = { "stop", "stop-id", NULL };
	rl_cli_init("rl-rollout", longopts);
	rl_cli_repeatable(lists);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	optind = 1;
	while ((c = rl_cli_getopt(argc, argv, "m:n:o:qvh", NULL)) != -1)
		if ((rv = parse_opt(&o, c, optarg, &verbosity)) != 0)
			return rv == 1 ? (rl_io_close_stdout() ? 1 : 0) : rv;
	rl_log_set_level(verbosity);
	if (!o.model_dir && !o.resume_dir)
		return rl_cli_usage("no model: -m MODEL_DIR");
	if (o.resume_dir && (o.queue_url || o.score_field))
		return rl_cli_usage("--resume continues a prompt file's run (pipe mode); with --queue the "
		    "broker's journal keeps the state, and --score has none");
	if (optind + 1 < argc)
		return rl_cli_usage("more than one input ('%s')", argv[optind + 1]);
	if (optind < argc)
		o.input = argv[optind];
	if ((rv = check_opts(&o)) != 0)
		return rv;
	if (o.out_path && rl_io_same_file(o.input, o.out_path)) {
		rl_error("-o '%s' is the input '%s': writing it would empty it before it is read", o.out_path, o.input);
		rl_hint("write to another file, then rename it");
		return 2;
	}
	if (!o.queue_url && !o.jsonl && (!o.out_path || strcmp(o.out_path, "-") == 0) && isatty(STDOUT_FILENO)) {
		rl_error("refusing to write a binary stream to a terminal");
		rl_hint("add --jsonl, -o FILE, or pipe into rl-reward / rl-queue cat");
		return 2;
	}
	if (o.queue_url && !o.score_field)
		rl_stop_signals(on_signal, 0);
	return rl_rollout_run(&o) == RL_OK ? 0 : 1;
}

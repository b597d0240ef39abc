/*
 * serve.c — `rl-rollout serve -m MODEL [--listen ADDR]`: the options into
 * rl_rollout_opts, then lib/rollout's rl_rollout_serve (the OpenAI-compatible
 * server, with --agent the agents of prompt lines).  SIGINT and SIGTERM stop it cleanly.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "compute/ops.h"
#include "rollout/rollout.h"
#include "tok/tokenizer.h"

static const char usage_text[] =
    "usage: rl-rollout serve -m MODEL_DIR [--listen ADDR] [options]\n"
    "       rl-rollout serve -m MODEL_DIR --agent CMD [-n G] [options] [PROMPTS.jsonl|-]\n"
    "       rl-rollout serve -m MODEL_DIR --agent CMD --queue URL [-n G] [options]\n"
    "       rl-rollout serve -m MODEL_DIR --queue URL [-n G] [options]\n"
    "\n"
    "Serves the model behind an OpenAI-compatible HTTP API: GET /v1/models,\n"
    "POST /v1/completions and /v1/chat/completions (streaming with \"stream\": true).\n"
    "Concurrent requests share the engine's continuous batching.\n"
    "\n"
    "  -m, --model DIR         the policy (Hugging Face directory)\n"
    "      --listen ADDR       HOST:PORT, [IPV6]:PORT or :PORT (default 127.0.0.1:8000)\n"
    "      --listen-public     allow an address beyond loopback\n"
    "      --api-key KEY       require Authorization: Bearer KEY on /v1/ routes\n"
    "      --api-key-file F    the same, the key read from file F (first line)\n"
    "      --served-model-name NAME  the model's id in the API (default: the directory's name)\n"
    "      --max-requests N    requests in flight at most; more get 429 (default 256)\n"
    "      --max-body BYTES    request bodies at most, suffixes K M G; larger get 413 (default 4M)\n"
    "  -o, --output FILE       episode records (trajectory stream) here instead of stdout\n"
    "      --jsonl             write the records as JSONL instead of the binary stream\n"
    "      --episode-timeout S an episode idle for S seconds is written without a reward\n"
    "                          (default 600; 0 never)\n"
    "      --weights-from DIR  load new weight versions from DIR/latest as they appear\n"
    "      --sync URL          new weight versions from rl-sync (tcp://, ipc://) or a directory\n"
    "      --weights-group HOST:PORT, --weights-group-rank R, --weights-group-size N,\n"
    "      --weights-group-backend B  new versions broadcast by the trainer of that group\n"
    "                          (rl-rollout(1): as in generation)\n"
    "      --partial           new weights apply to sequences already running\n"
    "      --max-staleness K   refuse new episodes (429) while the episodes started make more\n"
    "                          batches of --train-batch than weights version + K\n"
    "      --train-batch G     episodes per trainer step, for --max-staleness (default 8)\n"
    "      --body-timeout S    a request body must arrive within S seconds, else the connection\n"
    "                          is closed (default 30)\n"
    "      --http-max-conns N  connections at once; more are answered 503 and closed\n"
    "                          (default --max-requests + 64)\n"
    "      --http-timeout S    seconds a connection has to send a request head, from its start\n"
    "                          or the last response, and to take a response or a stream's\n"
    "                          next events; idle ones close then (default 10)\n"
    "      --max-tokens N      response tokens at most per request (default 256); a larger\n"
    "                          max_tokens is cut to it\n"
    "      --stop STR          a stop string for every request (repeatable)\n"
    "      --chat-template T   chatml, plain or auto (default auto: the model's template)\n"
    "      --no-thinking       enable_thinking=false for Qwen3 chats that do not say\n"
    "      --slots N           sequences decoded together (default 64)\n"
    "      --kv-mem BYTES      KV cache budget, suffixes K M G (default 256M)\n"
    "      --kv-reuse-mem BYTES  of --kv-mem, what episodes' caches may keep between calls\n"
    "                          (default half of --kv-mem; evicted when requests need it)\n"
    "      --no-kv-reuse       prefill every call of an episode whole (--kv-reuse-mem 0)\n"
    "      --device D          cpu, cuda, cuda:N or auto (default auto)\n"
    "      --agent CMD         run CMD (sh -c) for each prompt line of PROMPTS (default stdin)\n"
    "                          with OPENAI_BASE_URL, OPENAI_API_KEY, RL_EPISODE_ID and RL_PROMPT\n"
    "                          set and the line on its stdin; it posts the reward (or prints\n"
    "                          it last on stdout); the server exits when all are done\n"
    "  -n, --samples G         episodes (one group) per prompt line (default 1)\n"
    "      --agents N          agent processes at once (default 8)\n"
    "      --agent-timeout S   an agent running longer is killed, its episode failed (default\n"
    "                          300; 0 never)\n"
    "      --queue URL         lease prompt lines from rl-queue (for --agent, or for clients:\n"
    "                          POST /rl/episodes) and put each complete group back as scored\n"
    "      --idle-exit S       --agent --queue: exit after S seconds without work (default: until\n"
    "                          signalled)\n"
    "      --broker-timeout S  --queue: exit 1 after S seconds without a reply from the broker\n"
    "      --config FILE       options from a YAML file (keys: long options; the command line wins)\n"
    "  -q, --quiet, -v, --verbose, -h, --help\n";

enum {
	O_LISTEN = 256, O_PUBLIC, O_KEY, O_KEYFILE, O_NAME, O_MAXREQ, O_MAXBODY, O_MAXTOK, O_STOP, O_TMPL,
	O_NOTHINK, O_SLOTS, O_KVMEM, O_DEVICE, O_JSONL, O_EPTIMEOUT, O_WFROM, O_SYNC, O_PARTIAL, O_STALE, O_TBATCH, O_BODYTO,
	O_REUSEMEM, O_NOREUSE, O_AGENT, O_AGENTS, O_AGENTTO, O_QUEUE, O_IDLE, O_BTIMEOUT, O_HTTPCONNS, O_HTTPTO
};

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' }, { "listen", required_argument, 0, O_LISTEN },
	{ "listen-public", no_argument, 0, O_PUBLIC }, { "api-key", required_argument, 0, O_KEY },
	{ "api-key-file", required_argument, 0, O_KEYFILE }, { "served-model-name", required_argument, 0, O_NAME },
	{ "max-requests", required_argument, 0, O_MAXREQ }, { "max-body", required_argument, 0, O_MAXBODY },
	{ "max-tokens", required_argument, 0, O_MAXTOK }, { "stop", required_argument, 0, O_STOP },
	{ "chat-template", required_argument, 0, O_TMPL }, { "no-thinking", no_argument, 0, O_NOTHINK },
	{ "slots", required_argument, 0, O_SLOTS }, { "kv-mem", required_argument, 0, O_KVMEM },
	{ "device", required_argument, 0, O_DEVICE }, { "output", required_argument, 0, 'o' },
	{ "jsonl", no_argument, 0, O_JSONL }, { "episode-timeout", required_argument, 0, O_EPTIMEOUT },
	{ "weights-from", required_argument, 0, O_WFROM }, { "sync", required_argument, 0, O_SYNC },
	{ "partial", no_argument, 0, O_PARTIAL }, { "max-staleness", required_argument, 0, O_STALE },
	{ "train-batch", required_argument, 0, O_TBATCH }, { "body-timeout", required_argument, 0, O_BODYTO },
	{ "kv-reuse-mem", required_argument, 0, O_REUSEMEM }, { "no-kv-reuse", no_argument, 0, O_NOREUSE },
	{ "agent", required_argument, 0, O_AGENT }, { "agents", required_argument, 0, O_AGENTS },
	{ "agent-timeout", required_argument, 0, O_AGENTTO }, { "queue", required_argument, 0, O_QUEUE },
	{ "samples", required_argument, 0, 'n' }, { "idle-exit", required_argument, 0, O_IDLE },
	{ "broker-timeout", required_argument, 0, O_BTIMEOUT }, { "http-max-conns", required_argument, 0, O_HTTPCONNS },
	{ "http-timeout", required_argument, 0, O_HTTPTO }, RLO_WGROUP_LONGOPTS,
	{ "quiet", no_argument, 0, 'q' }, { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 }
};

static void
on_signal(int sig)
{
	(void)sig;
	rl_rollout_stop();
}

/* The key of --api-key-file: its first line (a malloc'd string kept for the run). */
static int
key_file(rl_rollout_opts *o, const char *path)
{
	char *buf = NULL;
	size_t n = 0;

	if (rl_io_read_file(path, 4096, &buf, &n) != RL_OK) {
		rl_error("--api-key-file: cannot read '%s'", path);
		return 2;
	}
	buf[strcspn(buf, "\r\n")] = 0;
	if (!*buf) {
		rl_error("--api-key-file: '%s' holds no key on its first line", path);
		free(buf);
		return 2;
	}
	o->api_key = buf;
	return 0;
}

static int
parse_opt(rl_rollout_opts *o, int c, const char *a, int *verbosity)
{
	uint64_t v;
	int rv = 0;

	switch (c) {
	case 'm': o->model_dir = a; break;
	case O_LISTEN: o->listen = a; break;
	case 'o': o->out_path = a; break;
	case O_JSONL: o->jsonl = 1; break;
	case O_WFROM: o->weights_from = a; break;
	case O_SYNC: o->sync_url = a; break;
	case RLO_WGROUP: case RLO_WGRANK: case RLO_WGSIZE: case RLO_WGBACK: rv = rl_cmd_wgroup_opt(o, c, a); break;
	case O_PARTIAL: o->partial = 1; break;
	case O_STALE: rv = rl_cli_int32(c, a, 0, 1000000000, &o->max_staleness); break;
	case O_TBATCH: rv = rl_cli_int32(c, a, 1, 1000000000, &o->train_batch); break;
	case O_BODYTO: rv = rl_cli_double(c, a, 0.01, 3600, &o->body_timeout); break;
	case O_HTTPCONNS: rv = rl_cli_int32(c, a, 1, 100000, &o->http_max_conns); break;
	case O_HTTPTO: rv = rl_cli_double(c, a, 0.05, 86400, &o->http_timeout); break;
	case O_EPTIMEOUT: rv = rl_cli_double(c, a, 0, 1e9, &o->episode_timeout); break;
	case O_PUBLIC: o->listen_public = 1; break;
	case O_AGENT:
		if (!*a)
			return rl_cli_usage("--agent: an empty command");
		o->agent_cmd = a;
		break;
	case O_AGENTS: rv = rl_cli_int32(c, a, 1, 4096, &o->agents); break;
	case O_AGENTTO: rv = rl_cli_double(c, a, 0, 1e9, &o->agent_timeout); break;
	case O_QUEUE: o->queue_url = a; break;
	case 'n': rv = rl_cli_int32(c, a, 1, 65536, &o->n); break;
	case O_IDLE: rv = rl_cli_double(c, a, 0, 1e9, &o->idle_exit); break;
	case O_BTIMEOUT: rv = rl_cli_double(c, a, 0, 1e9, &o->broker_timeout); break;
	case O_KEY:
		if (o->api_key)
			return rl_cli_usage("--api-key and --api-key-file: give the key once");
		o->api_key = a;
		break;
	case O_KEYFILE:
		if (o->api_key)
			return rl_cli_usage("--api-key and --api-key-file: give the key once");
		return key_file(o, a);
	case O_NAME:
		if (!*a || strlen(a) > 200)
			return rl_cli_usage("--served-model-name: want 1 to 200 bytes");
		o->served_name = a;
		break;
	case O_MAXREQ: rv = rl_cli_int32(c, a, 1, 1000000, &o->max_requests); break;
	case O_MAXBODY:
		if ((rv = rl_cli_bytes(c, a, 1024, 1ULL << 30, &v)) == 0)
			o->max_body = (size_t)v;
		break;
	case O_MAXTOK: rv = rl_cli_int32(c, a, 1, 10000000, &o->go.max_new); break;
	case O_STOP:
		if (o->nstop == RL_ROLLOUT_MAX_STOPS || !*a)
			return rl_cli_usage("too many or empty --stop '%s'", a);
		o->stops[o->nstop++] = a;
		break;
	case O_TMPL:
		if ((o->tmpl = rl_chat_template_parse(a)) < 0)
			return rl_cli_usage("--chat-template: unknown chat template '%s' (auto, chatml, plain)", a);
		break;
	case O_NOTHINK: o->no_think = 1; break;
	case O_SLOTS: rv = rl_cli_int32(c, a, 1, 65536, &o->go.slots); break;
	case O_KVMEM:
		if ((rv = rl_cli_bytes(c, a, 0, 1ULL << 40, &v)) == 0)
			o->go.kv_mem = (size_t)v;
		break;
	case O_REUSEMEM:
		if ((rv = rl_cli_bytes(c, a, 0, 1ULL << 40, &v)) == 0)
			o->kv_reuse_mem = (long long)v;
		break;
	case O_NOREUSE: o->kv_reuse_mem = 0; break;
	case O_DEVICE:
		if (!rl_ops_device_ok(a))
			return rl_cli_usage("--device: want cpu, cuda, cuda:N or auto, not '%s'", a);
		o->device = a;
		break;
	case 'q': *verbosity = RL_LOG_QUIET; o->quiet = 1; break;
	case 'v': (*verbosity)++; break;
	case 'h':
		fputs(usage_text, stdout);
		return 1;
	default:
		fprintf(stderr, "rl-rollout: hint: rl-rollout serve --help lists the options\n");
		return 2;
	}
	return rv;
}

int
rl_cmd_serve(int argc, char **argv)
{
	rl_rollout_opts o;
	int c, rv, verbosity = RL_LOG_NORMAL;

	rl_rollout_opts_default(&o);
	o.listen = "127.0.0.1:8000";
	static const char *const lists[] = { "stop", NULL };
	rl_cli_init("rl-rollout serve", longopts);
	rl_cli_repeatable(lists);
	if ((rv = rl_cli_config(&argc, &argv)) != 0)
		return rv;
	optind = 1;
	while ((c = rl_cli_getopt(argc, argv, "m:o:n:qvh", NULL)) != -1)
		if ((rv = parse_opt(&o, c, optarg, &verbosity)) != 0)
			return rv == 1 ? (rl_io_close_stdout() ? 1 : 0) : rv;
	rl_log_set_level(verbosity);
	if (!o.model_dir)
		return rl_cli_usage("no model: -m MODEL_DIR");
	if (optind < argc && (!o.agent_cmd || o.queue_url))
		return rl_cli_usage("unexpected argument '%s'%s", argv[optind],
		    o.agent_cmd ? " (--queue leases the prompt lines)" : " (prompt lines are for --agent CMD)");
	if (optind + 1 < argc)
		return rl_cli_usage("more than one input ('%s')", argv[optind + 1]);
	if (optind < argc)
		o.input = argv[optind];
	if (!o.agent_cmd && o.n != 1 && !o.queue_url)
		return rl_cli_usage("-n is for --agent CMD or --queue URL");
	if (!o.agent_cmd && o.idle_exit > 0)
		return rl_cli_usage("--idle-exit is for --agent CMD");
	if (o.idle_exit > 0 && !o.queue_url)
		return rl_cli_usage("--idle-exit is for --queue (with prompt lines the server exits when they are done)");
	if ((rv = rl_cmd_wgroup_check(&o)) != 0)
		return rv;
	if (!o.jsonl && (!o.out_path || strcmp(o.out_path, "-") == 0) && isatty(STDOUT_FILENO)) {
		rl_error("refusing to write episode records (a binary stream) to a terminal");
		rl_hint("add --jsonl, -o FILE, or pipe into rl-reward / rl-train");
		return 2;
	}
	rl_stop_signals(on_signal, 0);
	return rl_rollout_serve(&o) == RL_OK ? 0 : 1;
}

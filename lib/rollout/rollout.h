/*
 * rollout.h — the generation stage as a library call: prompts in,
 * trajectory records out (rl_rollout_run), and score mode, which writes each
 * response token's log-prob under the model into a field of records
 * (rl_rollout_score).  rl-rollout parses its options into rl_rollout_opts and
 * calls these; option checking (what goes together) is the command's.
 * Weight versions come from --weights-from DIR (rl-train's checkpoint root),
 * rl-sync (sync_url) or a weights group (wgo); prompts from a file or
 * rl-queue (queue_url).
 */
#ifndef RL_ROLLOUT_H
#define RL_ROLLOUT_H

#include <stdint.h>

#include "rollout/engine.h"
#include "sync/wgroup.h"

#define RL_ROLLOUT_MAX_STOPS 64

typedef struct rl_rollout_opts {
	/* where from, where to (strings borrowed for the run) */
	const char *model_dir;     /* -m: the policy; NULL: resume_dir's checkpoint */
	const char *adapter_dir;   /* --adapter: a PEFT LoRA adapter merged into -m at load (NULL: none) */
	const char *out_path;      /* -o FILE; NULL or "-": stdout */
	const char *device;        /* cpu, cuda, cuda:N, auto */
	const char *input;         /* prompt lines (records in score mode); "-": stdin */
	const char *score_field;   /* score mode: the field the log-probs go to */
	const char *queue_url;     /* lease prompts from rl-queue instead of input */
	const char *resume_dir;    /* continue the run rl-train --out DIR checkpointed (pipe mode) */
	int jsonl;                 /* JSONL instead of the binary stream */
	/* weights */
	const char *weights_from;  /* rl-train's checkpoint root, followed through DIR/latest */
	const char *sync_url;      /* rl-sync URL or directory */
	int sync_transport;        /* RL_WSYNC_T_* */
	rl_wgroup_opts wgo;        /* weights group (addr NULL: none); timeout is set from weights_timeout */
	double weights_timeout;    /* seconds to wait for a version (0: never give up) */
	int max_staleness;         /* wait for version >= batches emitted - K (-1: off) */
	int train_batch;           /* groups per trainer step, for max_staleness */
	int auto_k, auto_kmax;     /* --max-staleness auto[:MAX] (pipe wiring): max_staleness moved
	                            * between 0 and auto_kmax by queue/autok.h's rule */
	const char *trainer_metrics; /* with auto_k: rl-train's --metrics file (its steps' drift and wait) */
	int partial;               /* new weights apply to sequences already running */
	/* queue mode */
	double idle_exit;          /* exit after this many seconds without work (0: never) */
	double broker_timeout;     /* exit after this many seconds without a reply (0: never) */
	/* sampling and prompts */
	int n;                     /* samples per prompt */
	int greedy;                /* one more greedy sample per prompt (ReMax) */
	int chat;                  /* text prompts go through the chat template as a user message */
	int tmpl;                  /* RL_CHAT_* */
	int no_think;              /* enable_thinking=false where a line does not say */
	int skip_bad;              /* skip bad prompt lines (counted) instead of stopping */
	uint64_t seed;
	rl_gen_opts go;            /* the engine's; stop, stop_ids and eos are set by the run */
	const char *stops[RL_ROLLOUT_MAX_STOPS]; /* stop strings (borrowed) */
	int nstop;
	int32_t stop_ids[RL_ROLLOUT_MAX_STOPS];
	int nstop_ids;
	int quiet;
	/* multi-turn episodes with environment processes (rl-env(5)) */
	const char *env_cmd;       /* --env CMD (sh -c): NULL: single-turn */
	int env_procs;             /* processes in the pool (0: --slots) */
	double env_timeout;        /* seconds an answer may take (0: no limit) */
	int max_turns;             /* model turns per episode (0: no limit) */
	int env_framing;           /* RL_ENV_FRAME_* */
	/* serve mode: an OpenAI-compatible HTTP server (rl_rollout_serve) */
	const char *listen;        /* HOST:PORT, [V6]:PORT or :PORT (NULL: not serve mode) */
	int listen_public;         /* bind beyond loopback */
	const char *api_key;       /* require Authorization: Bearer KEY (NULL: none) */
	const char *served_name;   /* the model's id in the API (NULL: the model directory's name) */
	int max_requests;          /* requests in flight at most; more get 429 */
	size_t max_body;           /* request bodies at most (bytes); larger get 413 */
	double body_timeout;       /* seconds a request body may take to arrive (slowloris); then closed */
	int http_max_conns;        /* connections at once; more are answered 503 (0: max_requests + 64) */
	double http_timeout;       /* seconds for a request head, an idle keep-alive, a response taken */
	double episode_timeout;    /* seconds an episode may stay idle before it is written unrewarded */
	long long kv_reuse_mem;    /* bytes of --kv-mem an episode's cache may be kept in between its
	                            * calls (rl_gen_opts.keep_mem; -1: half of kv_mem, 0: none) */
	const char *agent_cmd;     /* --agent CMD (sh -c): run per prompt line, -n runs a line (NULL: none) */
	int agents;                /* agent processes at once */
	double agent_timeout;      /* seconds an agent may run (0: no limit) */
} rl_rollout_opts;

/* How observations are framed: AUTO is CHATML when prompts go through a
 * ChatML template (--chat), else PLAIN (the observation's text as it is). */
enum { RL_ENV_FRAME_AUTO = 0, RL_ENV_FRAME_PLAIN, RL_ENV_FRAME_CHATML };

/* The defaults of rl-rollout's options. */
void rl_rollout_opts_default(rl_rollout_opts *o);

/* Generates o->n samples (plus the greedy one) per prompt of o->input, or of
 * the prompts leased from o->queue_url, and writes their records; with
 * o->score_field set it is rl_rollout_score.  Returns RL_OK or the first
 * error (logged).  Closes stdout when the records went there (a failing
 * close is an error).  Not reentrant: one run per process at a time. */
int rl_rollout_run(const rl_rollout_opts *o);

/* Score mode: for each record of o->input, the log-probs of its response
 * tokens under o->model_dir into field o->score_field; the records are
 * written otherwise unchanged.  Returns RL_OK or the first error (logged). */
int rl_rollout_score(const rl_rollout_opts *o);

/* Serve mode: the model behind an OpenAI-compatible HTTP API on o->listen
 * (rl-rollout(1), `rl-rollout serve`) until rl_rollout_stop.  RL_OK, or the
 * error that stopped it (logged). */
int rl_rollout_serve(const rl_rollout_opts *o);

/* Asks a running queue-mode rl_rollout_run to stop leasing, finish what it
 * has, and return.  Async-signal-safe: a command's SIGINT/SIGTERM handler
 * calls it. */
void rl_rollout_stop(void);

#endif

/*
 * rollout_int.h — what the files of rl_rollout_run share (rollout.c,
 * weights.c, run.c, score.c, record.c, and prompt.c's rli_prompt_*): the
 * run's state and one prompt in flight.  Not installed; lib/rollout only.
 */
#ifndef RL_ROLLOUT_INT_H
#define RL_ROLLOUT_INT_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "base/gset.h"
#include "base/progress.h"
#include "compute/ops.h"
#include "model/ckpt.h"
#include "model/model.h"
#include "queue/autok.h"
#include "queue/qclient.h"
#include "queue/wstat.h"
#include "rollout/engine.h"
#include "rollout/rollout.h"
#include "stream/traj.h"
#include "sync/wgroup.h"
#include "sync/wsync.h"
#include "tok/tokenizer.h"

typedef struct gen {
	rl_rollout_opts o;     /* a copy: go, stop_ids and model_dir are completed by the run */
	rl_wsync *ws;
	rl_wgroup *wg;
	rl_wver *wbase;        /* the last version fetched: the base of the next delta */
	char sync_dir[3800];   /* where fetched versions are written to be loaded */
	rl_qclient *qc;
	rl_wstat *wst;         /* queue mode: stats reported to the broker */
	rl_progress prog;
	uint64_t q_bad, q_put;
	/* queue mode: prompts being generated, so that those the broker's early
	 * stop aborted (rl_qlease_info.aborts moved) are found and cancelled */
	struct prompt **qlive;
	size_t nqlive, capqlive;
	uint32_t q_aborts;     /* the broker's early-stop count last seen */
	uint64_t q_aborted;    /* prompts cancelled so */
	/* state */
	rl_ops *ops;
	rl_model *m;
	rl_tokenizer *tok;
	rl_engine *e;
	rl_traj_writer *w;
	FILE *out;
	int version, pending_version;
	/* the queue wiring: the version the broker leased prompts at, not yet on
	 * the weights source (a trainer publishing in the background); new
	 * sequences are held until it is loaded (0: none), since want_since */
	int want_version;
	double want_since;
	int pending_rewind;     /* pending_version is a rewound rl-sync's or --weights-from's: load it,
	                         * though not newer */
	char pending_path[4096];
	uint64_t nonce, groups, lines, bad, samples, tokens;
	double t0;
	/* where the wall time went (seconds; reported at exit with -v): decoding
	 * (engine steps less the puts made from them), new weights (poll, fetch,
	 * load), waiting for a weights version (the staleness gate, pipe mode),
	 * the broker (leases and puts), writing the output */
	double t_engine, t_weights, t_wait, t_lease, t_put, t_write;
	/* decoding time weighted by the share of the slots each step decoded
	 * (the busy time of --max-staleness auto and of the stats reports), and
	 * the last step's share */
	double t_engine_occ, step_share;
	double last_poll;      /* when rl-sync was last asked for a new version */
	double poll_backoff;   /* rl-sync did not answer: seconds until it is asked again (0: it answers) */
	int nloads;
	int warned_max_tokens; /* a line's max_tokens above --max-tokens was reported */
	/* --resume DIR: the checkpoint, the groups done there (never generated again) */
	char resume_path[4096];
	int resume_step;
	rl_gset done;
	uint64_t skipped;      /* prompts of groups done, not generated */
	/* --weights-from: step directories newer than its newest full checkpoint
	 * when this process started: a killed run's, which a resuming trainer
	 * removes and writes again under the same names; never loaded */
	rl_ckpt_leftovers left;
	int left_after;        /* that checkpoint's step (-1: none, and then no leftovers) */
	char left_warned[4096];
	int eos_more[24];      /* ids ending a sequence as EOS besides go.eos_id (rli_eos_set) */
	struct rli_env *env;   /* --env: the environment pool and its episodes (env.c) */
	/* --max-staleness auto in the pipe wiring (autok_pipe.c) */
	rl_autok ak;
	rl_autok_totals akt;
	off_t ak_off;          /* bytes of --trainer-metrics read */
	uint64_t ak_line;
	double ak_last;        /* when it was last read */
	int ak_warned;
} gen;

/* One prompt in flight: what its records need besides the tokens. */
typedef struct prompt {
	uint64_t group;
	uint64_t line;
	char *text;      /* prompt text as given to the tokenizer (rendered chat) */
	char *meta;      /* JSON of everything but "prompt" */
	int32_t *ids;
	int nids;
	int max_new;     /* the line's "max_tokens" (at most --max-tokens), 0: --max-tokens */
	int remaining;
	int gsize;       /* samples in its group */
	rl_traj_batch *out; /* queue mode: the group's records, put when complete */
	uint64_t qlease, qid; /* queue mode: the prompt record's lease and id */
} prompt;

void rli_prompt_free(prompt *p); /* accepts NULL; not p->out */

/* autok_pipe.c: --max-staleness auto in the pipe wiring */
void rli_autok_init(gen *g);
int rli_autok_poll(gen *g);   /* at most every 0.1 s; moves g->o.max_staleness */

/* weights.c: weight versions and the rewind policy */
int rli_latest_version(const char *dir, int *ver, char *path, size_t len);
int rli_load_weights(gen *g, const char *dir, int ver);
int rli_group_take(gen *g);
int rli_leftover(gen *g, const char *path);
int rli_poll_weights(gen *g, int force);
int rli_wait_version(gen *g, int need);

/* prompt.c: prompt lines and leased records into prompts */
int rli_prompt_parse_obj(gen *g, cJSON *j, const char *where, const int32_t *pre_ids, size_t npre, prompt **out);
int rli_prompt_parse_line(gen *g, const char *line, size_t len, prompt **out);
int rli_prompt_from_record(gen *g, const rl_traj *t, prompt **out);

/* record.c: one finished sample's record */
int rli_record_build(rl_traj *t, gen *g, const prompt *p, const rl_gen_sample *s);

/* run.c: the run loops */
void rli_eos_set(gen *g);
int rli_run_generate(gen *g);
int rli_run_queue(gen *g);
int rli_resume_open(gen *g);
/* run.c: a leased prompt record as its prompt line was (meta's fields and
 * "prompt"), malloc'd into *out.  0 or RL_ENOMEM. */
int rli_queue_line(const rl_traj *t, char **out);

/* run.c: the engine's done callback (ctx: the gen) */
int rli_sample_done_cb(void *ctx, const rl_gen_sample *s);

/* env.c: --env, the environment processes and their episodes (user pointers
 * of the engine's multi-turn requests) */
typedef struct rli_env rli_env;
typedef struct rli_episode rli_episode;
int rli_env_open(gen *g);
void rli_env_close(gen *g);
int rli_env_start(gen *g, prompt *p, const char *line, size_t len);  /* o.n episodes of p */
int rli_env_pending(const gen *g);
int rli_env_finish(gen *g);          /* at the end: RL_EIO when no environment ever answered */     /* episodes not in the engine yet */
int rli_env_poll(gen *g, int timeout_ms);
/* The broker aborted p: its episodes end without records (p is freed with
 * the last; a process answering one of them is killed and restarted). */
int rli_env_cancel(gen *g, prompt *p);
void rli_env_counts(const gen *g, uint64_t *cancelled, uint64_t *killed); /* episodes cancelled, processes killed */
int rli_env_turn(void *ctx, const rl_gen_sample *s);
prompt *rli_env_prompt(void *user);
int rli_env_record(rl_traj *t, gen *g, void *user, const rl_gen_sample *s);
/* The step line (with its '\n') for model turn TURN (from 0) of episode ID
 * whose text is TEXT: "action", and with CHAT the turn's Hermes <tool_call>
 * blocks as "tool_calls" (absent when it has none).  0 or RL_ENOMEM. */
int rli_env_step_msg(char **msg, const char *id, int turn, const char *text, int chat);

/* serve_tools.c (rl-rollout serve's answers and env.c's steps) */
/* Hermes <tool_call> blocks of a chat answer's TEXT into *CALLS (OpenAI's
 * tool_calls array; NULL when there are none or one is malformed, as vLLM's
 * hermes parser answers) and *CONTENT (the text before the first block, or
 * the whole text when there are no calls; NULL when that text before is empty).  RID seeds the call ids.
 * 0 or RL_ENOMEM; the caller frees both. */
int sv_tools_parse(const char *text, const char *rid, char **content, cJSON **calls);

/* run.c: rl_rollout_stop was called; the flag itself (rl_qclient_set_stop) */
int rli_stop_requested(void);
const volatile sig_atomic_t *rli_stop_flag(void);

/* serve.c: rl-rollout serve, until rl_rollout_stop */
int rli_serve_run(gen *g);

/* score.c */
int rli_run_score(gen *g);

#endif

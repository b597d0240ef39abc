/*
 * serve_int.h — what the files of `rl-rollout serve` share: serve.c (the
 * HTTP handler on base/httpd.h's server, the engine thread, server-sent events) and serve_api.c
 * (the OpenAI request fields and the JSON of answers and errors).  Not
 * installed; lib/rollout only.
 */
#ifndef RL_SERVE_INT_H
#define RL_SERVE_INT_H

#include <stdint.h>

#include <cjson/cJSON.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "base/httpd.h"
#include "base/io.h"
#include "rollout/rollout_int.h"

#define SV_MAX_STOP 4        /* OpenAI's limit on "stop" */
#define SV_MAX_N 128
#define SV_EPISODE_ID_MAX 128

typedef struct sv_episode sv_episode;
typedef struct sv_agents sv_agents;

/* One sample of a request: its tokens and the bytes they decode to. */
typedef struct sv_choice {
	int32_t *tok;
	float *logp;
	int32_t *top_id;    /* (cap, top) the top log-probs of each token (top > 0) */
	float *top_lp;
	int n, cap;
	rl_buf raw;         /* the response's bytes (special tokens left out) */
	size_t sent;        /* stream: bytes of raw already sent */
	int lp_sent;        /* stream: tokens whose log-probs were sent */
	int finish;         /* RL_FINISH_*, 0 while running */
	int started;        /* stream: the first chunk (the role) went out */
} sv_choice;

enum { SV_COMPLETIONS = 1, SV_CHAT, SV_REWARD, SV_LEASE };

/* The routes and statuses /metrics counts answers by (serve.c: route_name,
 * code_list; the last code is any other). */
enum { SV_RT_CHAT, SV_RT_COMPL, SV_RT_MODELS, SV_RT_EPISODES, SV_RT_REWARD, SV_RT_METRICS, SV_RT_HEALTH, SV_RT_OTHER,
	SV_NROUTE };
#define SV_NCODE 11

/* One HTTP request to a generation route, from its body to its answer. */
typedef struct sv_req {
	struct serve *sv;
	int kind;                  /* SV_* */
	int route;                 /* SV_RT_* */
	/* the request's fields (serve_api.c) */
	cJSON *body;               /* owned */
	int n, max_tokens, stream, logprobs, include_usage, has_seed;
	int top;                   /* top_logprobs (chat) or logprobs: N (completions), 0..20 */
	int token_ids;              /* return_tokens_as_token_ids (vLLM's) */
	const cJSON *tools;        /* chat "tools" (borrowed from body), or NULL */
	int tool_parse;            /* parse <tool_call> blocks of the answer (tools, tool_choice "auto") */
	uint64_t seed;
	rl_sample_params sp;
	const char *stop[SV_MAX_STOP]; /* borrowed from body */
	int nstop;
	int32_t *prompt;           /* made on the engine thread */
	int plen;
	char id[48];
	long created;
	/* episodes (serve_ep.c) */
	char episode[SV_EPISODE_ID_MAX + 1]; /* X-Episode-Id, or the ID of /rl/episodes/ID/reward */
	sv_episode *ep;            /* the episode of a call in the engine */
	char *ptext;               /* an episode call's prompt, rendered */
	size_t ptlen;
	double reward;
	/* HTTP (base/httpd.h) */
	uint64_t hid;              /* the request's connection */
	int waiting;               /* its answer is due (not a stream) */
	int dead;                  /* stream: its connection is gone (engine thread) */
	/* state (under serve.mu where both threads look) */
	sv_choice *ch;
	int remaining;             /* samples not finished */
	int in_engine;             /* submitted, not finished */
	int cancel;                /* the client is gone: drop it from the engine */
	int done;                  /* answered; freed by the engine thread's reaper */
	struct sv_req *next;       /* inbox or the live list */
} sv_req;

typedef struct serve {
	gen *g;
	const char *name;          /* the model's name in the API */
	char key[512];             /* --api-key (empty: none) */
	size_t max_body;
	int max_requests;
	rli_httpd *srv;            /* the listener */
	char url[300];
	nng_mtx *mu;
	nng_cv *cv;
	sv_req *inbox, *live;      /* new requests; the ones the engine thread owns */
	int nreq;                  /* requests in flight (refused with 429 past max_requests) */
	int stop;                  /* rl_rollout_stop */
	int failed;                /* the engine failed: new requests get 503 */
	uint64_t next_id;
	uint64_t n_requests, n_errors, n_cancelled; /* written by the engine thread under mu */
	int running, queued;       /* the engine's, as of the engine thread's last pass */
	uint64_t gen_tokens, steps;
	uint64_t prefilled, reused, evicted; /* the engine's prompt tokens forwarded / reused, kept caches evicted */
	int kept, kept_blk;        /* kept episode caches and their blocks */
	sv_episode *eps;           /* open episodes (engine thread) */
	int neps, neps_seen;       /* open episodes; as of the last pass, for /metrics */
	uint64_t n_ep_mismatch, n_ep_written, n_stale;
	uint64_t http[SV_NROUTE][SV_NCODE]; /* answers by route and status (under mu) */
	uint64_t prompt_tokens;    /* of the requests submitted (under mu) */
	uint64_t n_ep_idle;        /* episodes ended by --episode-timeout (under mu) */
	uint64_t kv_hits;          /* calls that took a kept KV cache over (tend) */
	uint64_t n_handed, q_put;  /* --queue: episodes handed out, records put (tend, from serve_agent.c) */
	int version;               /* the weights' version, for /metrics */
	sv_agents *ag;             /* --agent or --queue (serve_agent.c), or NULL */
} serve;

/* serve_api.c */
/* Reads r->body into r's fields.  0, or the HTTP status of the error with
 * msg/param filled in (param "" when none). */
int sv_parse(serve *s, sv_req *r, char *msg, size_t mlen, char *param, size_t plen);
/* {"error": {...}} of an OpenAI error; a malloc'd string or NULL. */
char *sv_error_json(int status, const char *msg, const char *param);
/* The whole answer of a finished request (not a stream), malloc'd. */
char *sv_answer_json(serve *s, sv_req *r);
/* The list of models (GET /v1/models) or one (GET /v1/models/NAME). */
char *sv_models_json(serve *s, int one);
/* Stream: the chunks of what choice i has ready (all when its sample is
 * finished) appended to out as `data: {...}\n\n` events. */
int sv_stream_chunks(serve *s, sv_req *r, int i, rl_buf *out);
/* Stream: the usage chunk (when asked) and `data: [DONE]`. */
int sv_stream_end(serve *s, sv_req *r, rl_buf *out);
/* Bytes of raw that may go out: not a UTF-8 sequence still open at the end,
 * nor, while running, a tail that may start a stop string. */
size_t sv_ready_len(const sv_req *r, const sv_choice *c);
/* The response text of c: raw cut at the first stop string (when it stopped
 * on one), as UTF-8 (invalid bytes become U+FFFD); malloc'd. */
char *sv_final_text(const sv_req *r, const sv_choice *c, size_t from, size_t to);
/* The end of c's text: before the first stop string when it stopped on one. */
size_t sv_text_end(const sv_req *r, const sv_choice *c);

/* serve_ep.c (engine thread) */
int sv_ep_begin(serve *s, sv_req *r, const char *text, size_t tlen, char *msg, size_t ml);
/* gs and text may be NULL when !ok */
void sv_ep_end(serve *s, sv_req *r, const rl_gen_sample *gs, const char *text, size_t tlen, int ok);
int sv_ep_reward(serve *s, const char *id, double reward, char *msg, size_t ml, int *tokens, int *turns);
int sv_ep_expire(serve *s, double timeout, int all);
int sv_ep_open(serve *s, const char *id);  /* 1 when the episode is open */
/* The engine's keep_key of an episode's calls (non-zero). */
uint64_t sv_ep_key(const char *id);
/* Ends episode id without a reward (meta.end END): 0 (also when it is not
 * open), or 1 while a call of it is in flight. */
int sv_ep_close(serve *s, const char *id, const char *end);

/* serve_agent.c (engine thread): --agent CMD, the prompt lines' agent runs;
 * --queue without --agent, the leased lines' episodes handed to clients */
int sv_agent_open(serve *s);
/* POST /rl/episodes: an episode of a leased prompt line for a client; *json
 * (malloc'd) the answer.  0, or an HTTP status with msg. */
int sv_agent_hand(serve *s, char **json, char *msg, size_t ml);
/* --queue: episodes handed out so far. */
uint64_t sv_agent_handed(const serve *s);
/* Runs started, polled and ended; new prompt lines taken.  *finished: the
 * input is done and every run ended (pipe wiring), or --idle-exit passed. */
int sv_agent_pump(serve *s, int *finished);
void sv_agent_stop(serve *s);        /* kills the live runs (their episodes are written by the server's shutdown) */
int sv_agent_close(serve *s);        /* frees; the run's result (a bad line, no run ever rewarded) */
/* An episode's record goes out: a run's into its group (-o, or rl-queue
 * with --queue), any other to -o, or to rl-queue as a group of one. */
int sv_agent_emit(serve *s, const char *id, rl_traj *t);
int sv_agent_owns(serve *s, const char *id);   /* 1: an agent run's episode */
int sv_agent_refuse(serve *s, const char *id); /* 1: an agent run's episode whose record went out */

/* 1 when the Authorization header carries the key (constant time). */
int sv_auth_ok(const serve *s, const char *authz);

#endif

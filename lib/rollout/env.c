/*
 * env.c — rl-rollout --env CMD: a pool of environment processes speaking
 * rl-env(5) (JSON lines over their stdin/stdout) and the episodes they drive,
 * one per sample.  An episode is reset on a free process, its first
 * observation opens the response; after each model turn (the engine's turn
 * callback) the turn's text goes to the process as a step, and the answer's
 * observation is tokenized on its own, framed (plain text, or a ChatML
 * user / tool turn) and fed into the sequence's KV cache (rl_engine_feed), or
 * the episode ends (done, --max-turns, --max-episode-tokens).  All I/O is
 * non-blocking and polled between engine steps, so other slots decode while
 * an episode waits on its environment.
 *
 * Isolation: a process that exits, hangs past --env-timeout, writes what is
 * not one JSON object a line, writes unasked, or floods (a line past
 * RLI_ENV_MAX_LINE) fails its episode with a reason (the record's env_error,
 * and stderr), is killed with its process group and reaped, and is started
 * again for the next episode.  When episodes keep failing with no valid answer
 * in between (twice the pool), the run stops.
 *
 * Queue mode (run.c): a leased prompt's episodes start the same way; the
 * reset's "line" is rebuilt from the record (its meta's fields and "prompt").
 * When the broker's early stop aborts the prompt, rli_env_cancel ends its
 * episodes wherever they are: queued, resetting, decoding or waiting on a
 * step; a process in the middle of a request is killed (only that stops a
 * tool call in progress) and started again for the next episode, an idle one
 * takes the next reset as after any episode rl-rollout ends.
 *
 * Chat framing: a step carries the turn's Hermes <tool_call> blocks as
 * "tool_calls" (serve_tools.c's parser), and an answer may give its turns as
 * "messages" (user and tool) instead of "observation" text.
 *
 * Leaves out: messages at reset (the prompt line holds the conversation),
 * other roles than user and tool, other tool-call formats than Hermes'.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "base/rng.h"
#include "rollout/rollout_int.h"

#define RLI_ENV_MAX_LINE ((size_t)1 << 20)
#define RLI_ENV_MAX_STOPS 16

enum { EP_QUEUED, EP_RESET, EP_RUN, EP_STEP };

struct rli_episode {
	prompt *p;
	int index;
	char id[24];          /* the record's id, in decimal: the protocol's episode id */
	char *line;           /* the prompt line (JSON object text) */
	int state, proc, slot, started;
	int32_t *turns;       /* (2 * nturn) [start, end) of each model turn in the response */
	int32_t *tver;        /* (2 * nturn) first and last weight version of each turn */
	float *trew;          /* (nturn) the environment's reward after each turn (0: none given) */
	int nturn, cap, nreward, full, last_finish, last_tok;
	char *error;          /* why the episode failed (NULL: it did not) */
	char *stop[RLI_ENV_MAX_STOPS]; /* the reset answer's stop strings */
	int nstop;
	struct rli_episode *next;   /* waiting for a process */
	struct rli_episode *anext, *aprev; /* every episode not yet freed (rli_env_cancel finds them) */
};

typedef struct eproc {
	pid_t pid;            /* 0: not running */
	int wfd, rfd;
	char *rb;             /* bytes read, not yet a whole line */
	size_t rn, rcap;
	char *wb;             /* bytes to write */
	size_t wn, woff, wcap;
	rli_episode *ep;      /* the episode it serves */
	double deadline;      /* an answer is due by then (0: none asked) */
} eproc;

struct rli_env {
	eproc *pr;
	int np;
	rli_episode *qhead, *qtail; /* episodes waiting for a process */
	int pending;          /* episodes not in the engine: queued or resetting */
	int fails;            /* episodes failed since the last valid answer */
	uint64_t answers, episodes; /* valid answers, episodes started */
	uint64_t cancelled, killed; /* episodes cancelled, processes killed for it */
	rli_episode *all;     /* every live episode (anext/aprev) */
	int32_t im_end;       /* ChatML framing: the end-of-turn token (-1: plain text) */
	struct pollfd *pfd;
	int *pidx;
	int *pwr;
};

static void
ep_free(rli_env *v, rli_episode *ep)
{
	if (!ep)
		return;
	if (ep->aprev)
		ep->aprev->anext = ep->anext;
	else if (v->all == ep)
		v->all = ep->anext;
	if (ep->anext)
		ep->anext->aprev = ep->aprev;
	free(ep->line);
	free(ep->turns);
	free(ep->tver);
	free(ep->trew);
	free(ep->error);
	for (int i = 0; i < ep->nstop; i++)
		free(ep->stop[i]);
	free(ep);
}

/* An episode that never reaches the engine (a run that stopped early): its
 * prompt goes with its last such episode. */
static void
ep_drop(rli_env *v, rli_episode *ep)
{
	if (--ep->p->remaining == 0) {
		rl_traj_batch_destroy(ep->p->out);
		rli_prompt_free(ep->p);
	}
	ep_free(v, ep);
}

prompt *
rli_env_prompt(void *user)
{
	return ((rli_episode *)user)->p;
}

/* ---- processes ------------------------------------------------------------------ */

static int
proc_start(gen *g, eproc *pr)
{
	int in[2] = { -1, -1 }, out[2] = { -1, -1 };
	pid_t pid;

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
		rl_error("--env: cannot make pipes: %s", strerror(errno));
		goto fail;
	}
	if ((pid = fork()) < 0) {
		rl_error("--env: cannot start '%s': %s", g->o.env_cmd, strerror(errno));
		goto fail;
	}
	if (pid == 0) {
		/* its own process group: a hung environment is killed with its children */
		setpgid(0, 0);
		signal(SIGPIPE, SIG_DFL);
		if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
			_exit(127);
		execl("/bin/sh", "sh", "-c", g->o.env_cmd, (char *)NULL);
		_exit(127);
	}
	setpgid(pid, pid);
	close(in[0]);
	close(out[1]);
	fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
	fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
	pr->pid = pid;
	pr->wfd = in[1];
	pr->rfd = out[0];
	pr->rn = pr->wn = pr->woff = 0;
	pr->deadline = 0;
	return RL_OK;
fail:
	for (int i = 0; i < 2; i++) {
		if (in[i] >= 0)
			close(in[i]);
		if (out[i] >= 0)
			close(out[i]);
	}
	return RL_EIO;
}

/* Kills pr's process group and reaps it; writes how it ended into why (when
 * it had already exited). */
static void
proc_stop(eproc *pr, char *why, size_t len)
{
	int st = 0;
	pid_t r;

	if (pr->pid <= 0)
		return;
	close(pr->wfd);
	close(pr->rfd);
	/* a process that closed its output is most often exiting: a moment to say how */
	for (int i = 0; i < 20 && (r = waitpid(pr->pid, &st, WNOHANG)) == 0; i++)
		usleep(5000);
	kill(-pr->pid, SIGKILL);
	if (r == 0)
		while (waitpid(pr->pid, &st, 0) < 0 && errno == EINTR)
			;
	else if (why && r == pr->pid) {
		if (WIFEXITED(st))
			snprintf(why, len, " (it exited with status %d)", WEXITSTATUS(st));
		else if (WIFSIGNALED(st))
			snprintf(why, len, " (it was killed by signal %d)", WTERMSIG(st));
	}
	pr->pid = 0;
	pr->rn = pr->wn = pr->woff = 0;
	pr->deadline = 0;
}

/* Queues msg (with its '\n') for pr and writes what the pipe takes now. */
static int
proc_send(gen *g, eproc *pr, const char *msg, size_t n)
{
	if (pr->wn + n > pr->wcap) {
		size_t nc = RL_MAX(pr->wcap * 2, pr->wn + n + 256);
		char *nb = rl_try_malloc(nc, "environment message");
		if (!nb)
			return RL_ENOMEM;
		memcpy(nb, pr->wb + pr->woff, pr->wn - pr->woff);
		free(pr->wb);
		pr->wb = nb;
		pr->wn -= pr->woff;
		pr->woff = 0;
		pr->wcap = nc;
	}
	memcpy(pr->wb + pr->wn, msg, n);
	pr->wn += n;
	pr->deadline = rl_now() + (g->o.env_timeout > 0 ? g->o.env_timeout : 1e9);
	/* written now when the pipe takes it (the usual case): the environment starts
	 * on it while the engine steps; the rest waits for poll's POLLOUT */
	ssize_t w = write(pr->wfd, pr->wb + pr->woff, pr->wn - pr->woff);
	if (w > 0 && (pr->woff += (size_t)w) == pr->wn)
		pr->woff = pr->wn = 0;
	return RL_OK;
}

/* ---- episodes ------------------------------------------------------------------- */

/* The episode's record is written (run.c's done callback, which frees it). */
static int
ep_emit_failed(gen *g, rli_episode *ep)
{
	rl_gen_sample s;

	memset(&s, 0, sizeof s);
	s.user = ep;
	s.index = ep->index;
	s.finish = RL_FINISH_ABORT;
	s.ver_first = s.ver_last = g->version;
	s.seed = 0;
	s.t_start = s.t_end = rl_wall();
	s.slot = -1;
	g->env->pending--;
	return rli_sample_done_cb(g, &s);
}

/* Fails ep with a reason; its process (if any) is stopped.  The episode's
 * record goes out now, or at its turn's end while it is being decoded. */
static int
ep_fail(gen *g, int say_exit, rli_episode *ep, const char *fmt, ...)
{
	char msg[600], how[80] = "";
	va_list ap;
	eproc *pr = ep->proc >= 0 ? &g->env->pr[ep->proc] : NULL;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (pr) {
		/* how it ended, when that is the failure (else it was stopped for it) */
		proc_stop(pr, say_exit ? how : NULL, sizeof how);
		pr->ep = NULL;
		ep->proc = -1;
	}
	if (!ep->error) {
		size_t n = strlen(msg) + strlen(how) + 1;
		if ((ep->error = rl_try_malloc(n, "episode error")))
			snprintf(ep->error, n, "%s%s", msg, how);
		rl_warn("--env: episode %s (prompt line %llu, sample %d) failed: %s%s", ep->id,
		    (unsigned long long)ep->p->line, ep->index, msg, how);
	}
	g->env->fails++;
	switch (ep->state) {
	case EP_QUEUED:
	case EP_RESET:
		return ep_emit_failed(g, ep);
	case EP_STEP:
		return rl_engine_end(g->e, ep->slot, RL_FINISH_ABORT, rli_sample_done_cb, g);
	default:
		return RL_OK; /* being decoded: ends at its turn's end (rli_env_turn) */
	}
}

int
rli_env_start(gen *g, prompt *p, const char *line, size_t len)
{
	for (int i = 0; i < g->o.n; i++) {
		rli_episode *ep = rl_try_calloc(1, sizeof *ep, "episode");
		if (!ep || !(ep->line = rl_try_malloc(len + 1, "prompt line"))) {
			free(ep);
			return RL_ENOMEM;
		}
		memcpy(ep->line, line, len);
		ep->line[len] = 0;
		ep->p = p;
		ep->index = i;
		ep->proc = ep->slot = -1;
		snprintf(ep->id, sizeof ep->id, "%llu",
		    (unsigned long long)rl_rng_mix(p->group * 0x100000001b3ULL + (uint64_t)i + 1));
		if ((ep->anext = g->env->all))
			ep->anext->aprev = ep;
		g->env->all = ep;
		if (g->env->qtail)
			g->env->qtail->next = ep;
		else
			g->env->qhead = ep;
		g->env->qtail = ep;
		g->env->pending++;
		g->env->episodes++;
	}
	return RL_OK;
}

/* The engine's done callback of a cancelled episode: its sample is thrown away. */
static int
cancelled_cb(void *ctx, const rl_gen_sample *s)
{
	gen *g = ctx;

	ep_drop(g->env, s->user);
	return RL_OK;
}

/* Ends ep without a record: out of the queue, off its process (killed when
 * it is answering a request: a reset or a step, whose tool call may run for
 * long), out of the engine. */
static int
ep_cancel(gen *g, rli_episode *ep)
{
	rli_env *v = g->env;
	eproc *pr = ep->proc >= 0 ? &v->pr[ep->proc] : NULL;
	int rv;

	v->cancelled++;
	if (pr) {
		if (pr->deadline > 0 || pr->wn > pr->woff) {
			proc_stop(pr, NULL, 0);
			v->killed++;
		}
		pr->ep = NULL;
		pr->deadline = 0;
		ep->proc = -1;
	}
	switch (ep->state) {
	case EP_QUEUED:
		for (rli_episode **pp = &v->qhead, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
			if (*pp != ep)
				continue;
			*pp = ep->next;
			if (v->qtail == ep)
				v->qtail = prev;
			break;
		}
		/* fall through */
	case EP_RESET:
		v->pending--;
		ep_drop(v, ep);
		return RL_OK;
	default:
		/* in the engine: waiting for a slot (1: nothing ran), decoding, or waiting on its step */
		if ((rv = rl_engine_cancel(g->e, ep, cancelled_cb, g)) == 1) {
			ep_drop(v, ep);
			rv = RL_OK;
		}
		return rv;
	}
}

int
rli_env_cancel(gen *g, prompt *p)
{
	rli_env *v = g->env;
	int rv = RL_OK, left = p->remaining;

	/* p is freed with its last episode: count them rather than read it after */
	for (rli_episode *ep = v->all, *nx; ep && left > 0 && rv == RL_OK; ep = nx) {
		nx = ep->anext;
		if (ep->p == p) {
			left--;
			rv = ep_cancel(g, ep);
		}
	}
	return rv;
}

void
rli_env_counts(const gen *g, uint64_t *cancelled, uint64_t *killed)
{
	*cancelled = g->env ? g->env->cancelled : 0;
	*killed = g->env ? g->env->killed : 0;
}

int
rli_env_finish(gen *g)
{
	if (!g->env || g->env->episodes == 0 || g->env->answers > 0)
		return RL_OK;
	rl_error("--env: no environment process ever answered ('%s'): all %llu episodes failed", g->o.env_cmd,
	    (unsigned long long)g->env->episodes);
	rl_hint("run the command by hand and send it a reset line (rl-env(5))");
	return RL_EIO;
}

int
rli_env_pending(const gen *g)
{
	return g->env ? g->env->pending : 0;
}

/* One turn the environment adds: a user or tool message's content. */
typedef struct obsmsg {
	const char *text;
	int tool;
} obsmsg;

/* Ids of the environment's turns m[0..n), framed: plain text as it is (one
 * turn); ChatML as Qwen's and Hermes' templates render user and tool turns
 * after the assistant's: <|im_end|> when the turn did not end with it, then
 * "\n<|im_start|>" and each turn: "user\n" TEXT, or for a run of consecutive
 * tool messages one user turn "user" + "\n<tool_response>\n" TEXT
 * "\n</tool_response>" per message; turns are joined by
 * "<|im_end|>\n<|im_start|>" and closed by "<|im_end|>\n<|im_start|>assistant\n".
 * Each turn's text between special tokens is encoded as one piece, as the
 * tokenizer splits a whole rendering at special tokens; it is encoded
 * without special tokens: an environment cannot write a turn of its own. */
static int
frame(gen *g, rl_tokens *ids, const obsmsg *m, int n, int last_tok)
{
	int rv = RL_OK;
	rl_buf body;

	if (n == 0)
		return RL_OK;
	if (g->env->im_end < 0)
		return rl_tokenizer_encode(ids, g->tok, m[0].text, strlen(m[0].text), 0);
	const char *pre = last_tok == g->env->im_end ? "\n<|im_start|>" : "<|im_end|>\n<|im_start|>";
	if ((rv = rl_tokenizer_encode(ids, g->tok, pre, strlen(pre), RL_TOK_SPECIAL)) != 0)
		return rv;
	rl_buf_init(&body);
	for (int i = 0, j; i < n; i = j) {
		rl_buf_reset(&body);
		j = i + 1;
		if (!m[i].tool) {
			rv = rl_buf_printf(&body, "user\n%s", m[i].text);
		} else {
			rv = rl_buf_append(&body, "user", 4);
			for (j = i; rv == 0 && j < n && m[j].tool; j++)
				rv = rl_buf_printf(&body, "\n<tool_response>\n%s\n</tool_response>", m[j].text);
		}
		if (rv != 0 || (rv = rl_tokenizer_encode(ids, g->tok, (const char *)body.p, body.len, 0)) != 0)
			goto out;
		const char *sep = j < n ? "<|im_end|>\n<|im_start|>" : "<|im_end|>\n<|im_start|>assistant\n";
		if ((rv = rl_tokenizer_encode(ids, g->tok, sep, strlen(sep), RL_TOK_SPECIAL)) != 0)
			goto out;
	}
out:
	rl_buf_fini(&body);
	return rv;
}

/* The reset's answer: the response opens with the observation; the episode
 * goes to the engine. */
static int
on_reset(gen *g, rli_episode *ep, const char *obs, int done)
{
	rl_tokens ids = { 0 };
	prompt *p = ep->p;
	int rv;

	if (done)
		return ep_fail(g, 0, ep, "the reset's answer has \"done\": true: an episode needs a model turn");
	if (g->env->im_end >= 0 && obs[0])
		return ep_fail(g, 0, ep, "the reset's observation must be \"\" with ChatML framing (the prompt "
		    "line holds the conversation)");
	if (!(ids.ids = rl_try_malloc(sizeof(int32_t) * (size_t)(p->nids + 1), "episode prompt")))
		return RL_ENOMEM;
	ids.cap = (size_t)p->nids + 1;
	memcpy(ids.ids, p->ids, sizeof(int32_t) * (size_t)p->nids);
	ids.n = (size_t)p->nids;
	if (obs[0] && (rv = rl_tokenizer_encode(&ids, g->tok, obs, strlen(obs), 0)) != 0)
		goto out;
	rv = rl_engine_submit_episode(g->e, ids.ids, (int)ids.n, p->nids, ep->index,
	    rl_rng_u64(g->o.seed, g->qc ? p->group : p->line), (const char *const *)ep->stop, ep->nstop, ep);
	if (rv == RL_ETOOBIG || rv == RL_EINVAL) {
		rv = ep_fail(g, 0, ep, "the prompt and first observation (%zu tokens) cannot be generated for "
		    "(see the error above)", ids.n);
		goto out;
	}
	if (rv != RL_OK)
		goto out;
	ep->state = EP_RUN;
	g->env->pending--;
out:
	rl_tokens_fini(&ids);
	return rv;
}

static int
ep_end(gen *g, rli_episode *ep, int why)
{
	eproc *pr = ep->proc >= 0 ? &g->env->pr[ep->proc] : NULL;

	if (pr) {
		pr->ep = NULL;  /* the process takes the next episode */
		pr->deadline = 0;
	}
	ep->proc = -1;
	return rl_engine_end(g->e, ep->slot, why, rli_sample_done_cb, g);
}

/* A step's answer: the turn's reward; the next observation fed, or the end. */
static int
on_step(gen *g, rli_episode *ep, const obsmsg *m, int nm, int done, int has_reward, double reward)
{
	rl_tokens ids = { 0 };
	int rv;

	ep->trew[ep->nturn - 1] = (float)reward;
	ep->nreward += has_reward;
	if (done)
		return ep_end(g, ep, ep->last_finish);
	if (ep->full || (g->o.max_turns > 0 && ep->nturn >= g->o.max_turns))
		return ep_end(g, ep, RL_FINISH_LENGTH);
	if ((rv = frame(g, &ids, m, nm, ep->last_tok)) != 0)
		goto out;
	/* an empty observation (plain text): the model's next turn follows its last at once */
	rv = rl_engine_feed(g->e, ep->slot, ids.ids, (int)ids.n);
	if (rv == RL_ETOOBIG) {
		rv = ep_end(g, ep, RL_FINISH_LENGTH);
		goto out;
	}
	if (rv == RL_OK)
		ep->state = EP_RUN;
out:
	rl_tokens_fini(&ids);
	return rv;
}

/* An answer's "messages" (chat framing): a list of {"role": "user" or
 * "tool", "content": STRING} into *m (borrowing the strings).  A reset's
 * list must be empty (the prompt line holds the conversation, and its
 * rendering already ends with the assistant's turn); a step's may be empty
 * only with "done".  On a bad list, why says what and where (else it is "",
 * and the failure is RL_ENOMEM). */
static int
read_msgs(gen *g, const rli_episode *ep, const cJSON *msgs, int done, obsmsg **m, int *nm, char *why, size_t wl)
{
	const cJSON *it;
	int k = 0;

	why[0] = 0;
	if (g->env->im_end < 0)
		snprintf(why, wl, "\"messages\" needs chat framing (--env-framing chatml, or --chat with a chat template)");
	else if (!cJSON_IsArray(msgs))
		snprintf(why, wl, "\"messages\" is not a list");
	else if (ep->state == EP_RESET && cJSON_GetArraySize(msgs) > 0)
		snprintf(why, wl, "the reset's \"messages\" must be [] (the prompt line holds the conversation)");
	else if (ep->state == EP_STEP && !done && cJSON_GetArraySize(msgs) == 0)
		snprintf(why, wl, "\"messages\" is empty and \"done\" is false: the next model turn needs a turn before it");
	if (why[0])
		return RL_EINVAL;
	if (!(*m = rl_try_calloc((size_t)cJSON_GetArraySize(msgs) + 1, sizeof **m, "messages")))
		return RL_ENOMEM;
	cJSON_ArrayForEach(it, msgs) {
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, "role");
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
		if (!cJSON_IsObject(it))
			snprintf(why, wl, "\"messages\"[%d] is not an object", k);
		else if (!r)
			snprintf(why, wl, "\"messages\"[%d]: missing field \"role\"", k);
		else if (!cJSON_IsString(r) || (strcmp(r->valuestring, "user") && strcmp(r->valuestring, "tool")))
			snprintf(why, wl, "\"messages\"[%d].role is %.40s%s%s, not \"user\" or \"tool\"", k,
			    cJSON_IsString(r) ? "\"" : "", cJSON_IsString(r) ? r->valuestring : "not a string",
			    cJSON_IsString(r) ? "\"" : "");
		else if (!c)
			snprintf(why, wl, "\"messages\"[%d]: missing field \"content\"", k);
		else if (!cJSON_IsString(c))
			snprintf(why, wl, "\"messages\"[%d].content is not a string", k);
		if (why[0]) {
			free(*m);
			*m = NULL;
			return RL_EINVAL;
		}
		(*m)[k].text = c->valuestring;
		(*m)[k].tool = r->valuestring[0] == 't';
		k++;
	}
	*nm = k;
	return RL_OK;
}

/* One line from pr: the answer to its episode's request. */
static int
on_line(gen *g, eproc *pr, char *line, size_t n)
{
	rli_episode *ep = pr->ep;
	cJSON *j = NULL;
	const cJSON *obs, *msgs, *done, *rew, *err, *role;
	obsmsg one, *m = NULL;
	int rv, nm = 0;

	if (!ep || (ep->state != EP_RESET && ep->state != EP_STEP)) {
		char how[80] = "";
		rl_warn("--env: an environment process wrote a line nobody asked for: '%.80s'; it is restarted", line);
		if (ep)
			return ep_fail(g, 0, ep, "the environment wrote a line nobody asked for: '%.80s'", line);
		proc_stop(pr, how, sizeof how);
		return RL_OK;
	}
	pr->deadline = 0;
	j = cJSON_ParseWithLength(line, n);
	if (!j || !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return ep_fail(g, 0, ep, "protocol error: the answer to %s is not a JSON object: '%.80s'",
		    ep->state == EP_RESET ? "reset" : "step", line);
	}
	if ((err = cJSON_GetObjectItemCaseSensitive(j, "error"))) {
		rv = ep_fail(g, 0, ep, "the environment answered %s with an error: %.300s",
		    ep->state == EP_RESET ? "reset" : "step", cJSON_IsString(err) ? err->valuestring : "(not a string)");
		goto out;
	}
	obs = cJSON_GetObjectItemCaseSensitive(j, "observation");
	msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
	done = cJSON_GetObjectItemCaseSensitive(j, "done");
	rew = cJSON_GetObjectItemCaseSensitive(j, "reward");
	role = cJSON_GetObjectItemCaseSensitive(j, "role");
	if ((!msgs && !cJSON_IsString(obs)) || (ep->state == EP_STEP && !cJSON_IsBool(done)) ||
	    (done && !cJSON_IsBool(done)) || (rew && !cJSON_IsNumber(rew)) || (role && !cJSON_IsString(role)) ||
	    (msgs && obs)) {
		const char *what = msgs && obs ? "both \"observation\" and \"messages\" (give one)" :
		    !obs && !msgs ? "missing field \"observation\" (or \"messages\")" : !msgs && !cJSON_IsString(obs) ?
		    "\"observation\" is not a string" : !done ? "missing field \"done\"" : !cJSON_IsBool(done) ?
		    "\"done\" is not true or false" : rew && !cJSON_IsNumber(rew) ? "\"reward\" is not a number" :
		    "\"role\" is not a string";
		rv = ep_fail(g, 0, ep, "protocol error: the answer to %s: %s: '%.80s'",
		    ep->state == EP_RESET ? "reset" : "step", what, line);
		goto out;
	}
	if (role && strcmp(role->valuestring, "user") && strcmp(role->valuestring, "tool")) {
		rv = ep_fail(g, 0, ep, "protocol error: \"role\" is \"%.40s\", not \"user\" or \"tool\"", role->valuestring);
		goto out;
	}
	if (msgs) {
		char why[160];
		if (read_msgs(g, ep, msgs, cJSON_IsTrue(done), &m, &nm, why, sizeof why) != 0) {
			rv = why[0] ? ep_fail(g, 0, ep, "protocol error: the answer to %s: %s",
			    ep->state == EP_RESET ? "reset" : "step", why) : RL_ENOMEM;
			goto out;
		}
	} else {
		one.text = obs->valuestring;
		one.tool = role && strcmp(role->valuestring, "tool") == 0;
	}
	const cJSON *stop = ep->state == EP_RESET ? cJSON_GetObjectItemCaseSensitive(j, "stop") : NULL, *it;
	if (stop) {
		/* the episode's own stop strings: an array of non-empty strings */
		int bad = !cJSON_IsArray(stop) || cJSON_GetArraySize(stop) > RLI_ENV_MAX_STOPS;
		cJSON_ArrayForEach(it, stop)
			bad |= !cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > 256;
		if (bad) {
			rv = ep_fail(g, 0, ep, "protocol error: the answer to reset: \"stop\" is not an array of at most "
			    "%d strings of 1 to 256 bytes", RLI_ENV_MAX_STOPS);
			goto out;
		}
		cJSON_ArrayForEach(it, stop)
			if (!(ep->stop[ep->nstop++] = strdup(it->valuestring))) {
				rv = RL_ENOMEM;
				goto out;
			}
	}
	g->env->fails = 0;
	g->env->answers++;
	if (ep->state == EP_RESET)
		rv = on_reset(g, ep, msgs ? "" : obs->valuestring, cJSON_IsTrue(done));
	else
		rv = on_step(g, ep, msgs ? m : &one, msgs ? nm : 1, cJSON_IsTrue(done), rew != NULL,
		    rew ? rew->valuedouble : 0.0);
out:
	free(m);
	cJSON_Delete(j);
	return rv;
}

/* Reads what pr has; whole lines are answers. */
static int
proc_read(gen *g, eproc *pr)
{
	for (;;) {
		if (pr->rcap - pr->rn < 4096) {
			size_t nc = RL_MAX(pr->rcap * 2, (size_t)8192);
			char *nb = realloc(pr->rb, nc);
			if (!nb)
				return RL_ENOMEM;
			pr->rb = nb;
			pr->rcap = nc;
		}
		ssize_t k = read(pr->rfd, pr->rb + pr->rn, pr->rcap - pr->rn - 1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return RL_OK;
		if (k <= 0) {
			rli_episode *ep = pr->ep;
			char how[80] = "";
			if (ep)
				return ep_fail(g, 1, ep, "the environment process closed its output");
			proc_stop(pr, how, sizeof how);
			return RL_OK;
		}
		pr->rn += (size_t)k;
		char *nl;
		while (pr->pid > 0 && (nl = memchr(pr->rb, '\n', pr->rn))) {
			size_t n = (size_t)(nl - pr->rb);
			int rv;
			*nl = 0;
			if (n > RLI_ENV_MAX_LINE)
				goto flood;
			rv = on_line(g, pr, pr->rb, n);
			if (pr->pid > 0) {
				memmove(pr->rb, nl + 1, pr->rn - n - 1);
				pr->rn -= n + 1;
			}
			if (rv != RL_OK)
				return rv;
		}
		if (pr->pid > 0 && pr->rn > RLI_ENV_MAX_LINE)
			goto flood;
		if (pr->pid <= 0)
			return RL_OK;
	}
flood:
	if (pr->ep)
		return ep_fail(g, 0, pr->ep, "the environment wrote a line of more than %zu bytes", RLI_ENV_MAX_LINE);
	proc_stop(pr, NULL, 0);
	return RL_OK;
}

/* Gives queued episodes a free process and sends their resets. */
static int
assign(gen *g)
{
	rli_env *v = g->env;
	int rv;

	for (int i = 0; i < v->np && v->qhead; i++) {
		eproc *pr = &v->pr[i];
		if (pr->ep)
			continue;
		if (pr->pid <= 0 && (rv = proc_start(g, pr)) != 0)
			return rv;
		rli_episode *ep = v->qhead;
		v->qhead = ep->next;
		if (!v->qhead)
			v->qtail = NULL;
		ep->next = NULL;
		ep->proc = i;
		ep->state = EP_RESET;
		pr->ep = ep;
		size_t n = strlen(ep->line) + 64;
		char *msg = rl_try_malloc(n, "reset");
		if (!msg)
			return RL_ENOMEM;
		int k = snprintf(msg, n, "{\"op\":\"reset\",\"id\":\"%s\",\"line\":%s}\n", ep->id, ep->line);
		rv = proc_send(g, pr, msg, (size_t)k);
		free(msg);
		if (rv != 0)
			return rv;
	}
	return RL_OK;
}

int
rli_env_step_msg(char **msg, const char *id, int turn, const char *text, int chat)
{
	cJSON *j = NULL, *calls = NULL;
	char *content = NULL, *s = NULL, rid[48];
	int rv = RL_ENOMEM;

	*msg = NULL;
	/* ids unique in the episode: its id and the turn */
	snprintf(rid, sizeof rid, "%s-%d", id, turn);
	if (chat && (rv = sv_tools_parse(text, rid, &content, &calls)) != 0)
		goto out;
	rv = RL_ENOMEM;
	if (!(j = cJSON_CreateObject()) || !cJSON_AddStringToObject(j, "op", "step") ||
	    !cJSON_AddStringToObject(j, "id", id) || !cJSON_AddStringToObject(j, "action", text))
		goto out;
	if (calls) {
		if (!cJSON_AddItemToObject(j, "tool_calls", calls))
			goto out;
		calls = NULL;
	}
	if (!(s = rl_json_print(j)))
		goto out;
	size_t n = strlen(s);
	if (!(*msg = rl_try_malloc(n + 2, "step")))
		goto out;
	memcpy(*msg, s, n);
	(*msg)[n] = '\n';
	(*msg)[n + 1] = 0;
	rv = RL_OK;
out:
	free(s);
	free(content);
	cJSON_Delete(calls);
	cJSON_Delete(j);
	return rv;
}

/* The engine's turn callback: the turn is kept, its text sent as a step. */
int
rli_env_turn(void *ctx, const rl_gen_sample *s)
{
	gen *g = ctx;
	rli_episode *ep = s->user;
	char *text = NULL, *msg = NULL;
	size_t tlen = 0;
	int rv;

	ep->slot = s->slot;
	if (ep->nturn == ep->cap) {
		int nc = ep->cap ? ep->cap * 2 : 8;
		int32_t *t2 = realloc(ep->turns, sizeof(int32_t) * 2 * (size_t)nc);
		if (t2)
			ep->turns = t2;
		int32_t *v2 = t2 ? realloc(ep->tver, sizeof(int32_t) * 2 * (size_t)nc) : NULL;
		if (v2)
			ep->tver = v2;
		float *r2 = v2 ? realloc(ep->trew, sizeof(float) * (size_t)nc) : NULL;
		if (!r2)
			return RL_ENOMEM;
		ep->trew = r2;
		ep->cap = nc;
	}
	ep->turns[2 * ep->nturn] = s->turn_start;
	ep->turns[2 * ep->nturn + 1] = s->n;
	ep->tver[2 * ep->nturn] = s->turn_ver_first;
	ep->tver[2 * ep->nturn + 1] = s->ver_last;
	ep->trew[ep->nturn] = 0.0f;
	ep->nturn++;
	ep->full = s->full;
	ep->last_finish = s->finish;
	ep->last_tok = s->n > 0 ? s->tok[s->n - 1] : -1;
	ep->state = EP_STEP;
	if (ep->error || ep->proc < 0)  /* failed while decoding */
		return rl_engine_end(g->e, ep->slot, RL_FINISH_ABORT, rli_sample_done_cb, g);
	if ((rv = rl_tokenizer_decode(&text, &tlen, g->tok, s->tok + s->turn_start, (size_t)(s->n - s->turn_start),
	    RL_TOK_SKIP_SPECIAL)) != 0)
		goto out;
	rl_utf8_fix(text, tlen);
	if ((rv = rli_env_step_msg(&msg, ep->id, ep->nturn - 1, text, g->env->im_end >= 0)) != 0)
		goto out;
	rv = proc_send(g, &g->env->pr[ep->proc], msg, strlen(msg));
out:
	free(msg);
	free(text);
	return rv;
}

/* Writes pending messages, reads answers, fails episodes past the timeout,
 * starts resets; waits up to timeout_ms for something to happen. */
int
rli_env_poll(gen *g, int timeout_ms)
{
	rli_env *v = g->env;
	int rv, n = 0;
	double now;

	if ((rv = assign(g)) != 0)
		return rv;
	for (int i = 0; i < v->np; i++) {
		eproc *pr = &v->pr[i];
		if (pr->pid <= 0)
			continue;
		v->pfd[n].fd = pr->rfd;
		v->pfd[n].events = POLLIN;
		v->pidx[n] = i;
		v->pwr[n] = 0;
		n++;
		if (pr->wn > pr->woff) {
			v->pfd[n].fd = pr->wfd;
			v->pfd[n].events = POLLOUT;
			v->pidx[n] = i;
			v->pwr[n] = 1;
			n++;
		}
	}
	if (n == 0)
		return RL_OK;
	if (poll(v->pfd, (nfds_t)n, timeout_ms) < 0 && errno != EINTR) {
		rl_error("--env: poll: %s", strerror(errno));
		return RL_EIO;
	}
	for (int k = 0; k < n; k++) {
		eproc *pr = &v->pr[v->pidx[k]];
		if (pr->pid <= 0 || !v->pfd[k].revents)
			continue;
		if (v->pwr[k]) {
			ssize_t w = write(pr->wfd, pr->wb + pr->woff, pr->wn - pr->woff);
			if (w > 0) {
				pr->woff += (size_t)w;
				if (pr->woff == pr->wn)
					pr->woff = pr->wn = 0;
			} else if (w < 0 && errno != EAGAIN && errno != EINTR && pr->ep) {
				if ((rv = ep_fail(g, 0, pr->ep, "cannot write to the environment: %s", strerror(errno))) != 0)
					return rv;
			}
		} else if ((rv = proc_read(g, pr)) != 0) {
			return rv;
		}
	}
	now = rl_now();
	for (int i = 0; i < v->np; i++) {
		eproc *pr = &v->pr[i];
		if (pr->pid > 0 && pr->ep && pr->deadline > 0 && now > pr->deadline &&
		    (rv = ep_fail(g, 0, pr->ep, "no answer in %g s (--env-timeout)", g->o.env_timeout)) != 0)
			return rv;
	}
	if (v->fails >= 2 * v->np) {
		rl_error("--env: %d episodes in a row failed with no valid answer from any environment process "
		    "('%s'): stopping", v->fails, g->o.env_cmd);
		rl_hint("run the command by hand and send it a reset line (rl-env(5))");
		return RL_EIO;
	}
	return RL_OK;
}

int
rli_env_open(gen *g)
{
	rli_env *v = rl_try_calloc(1, sizeof *v, "environment pool");
	int np = g->o.env_procs > 0 ? g->o.env_procs : g->o.go.slots;

	if (!v)
		return RL_ENOMEM;
	g->env = v;
	v->np = np;
	v->pr = rl_try_calloc((size_t)np, sizeof *v->pr, "environment processes");
	v->pfd = rl_try_calloc((size_t)np * 2, sizeof *v->pfd, "environment polls");
	v->pidx = rl_try_calloc((size_t)np * 2, sizeof *v->pidx, "environment polls");
	v->pwr = rl_try_calloc((size_t)np * 2, sizeof *v->pwr, "environment polls");
	if (!v->pr || !v->pfd || !v->pidx || !v->pwr)
		return RL_ENOMEM;
	/* a dead environment's pipe gives EPIPE, not a signal that ends rl-rollout */
	signal(SIGPIPE, SIG_IGN);
	v->im_end = -1;
	if (g->o.env_framing == RL_ENV_FRAME_CHATML ||
	    (g->o.env_framing == RL_ENV_FRAME_AUTO && g->o.chat && g->o.tmpl != RL_CHAT_PLAIN &&
	     rl_tokenizer_chat_template(g->tok) != RL_CHAT_PLAIN)) {
		v->im_end = rl_tokenizer_lookup(g->tok, "<|im_end|>", 10);
		if (v->im_end < 0 || rl_tokenizer_lookup(g->tok, "<|im_start|>", 12) < 0) {
			rl_error("--env-framing chatml: the tokenizer has no <|im_start|> and <|im_end|> tokens");
			return RL_EINVAL;
		}
	}
	if (!rl_engine_episode_fits(g->e, 1)) {
		rl_error("--env: the KV cache (--kv-mem) cannot hold one episode of %d tokens "
		    "(--max-episode-tokens)", g->o.go.max_episode);
		rl_hint("raise --kv-mem or lower --max-episode-tokens");
		return RL_EINVAL;
	}
	rl_engine_set_turn(g->e, rli_env_turn, g);
	return RL_OK;
}

void
rli_env_close(gen *g)
{
	rli_env *v = g->env;

	if (!v)
		return;
	for (int i = 0; v->pr && i < v->np; i++) {
		/* a run that stopped early: an episode being reset is in no engine request */
		if (v->pr[i].ep && v->pr[i].ep->state == EP_RESET)
			ep_drop(v, v->pr[i].ep);
		proc_stop(&v->pr[i], NULL, 0);
		free(v->pr[i].rb);
		free(v->pr[i].wb);
	}
	for (rli_episode *ep = v->qhead, *nx; ep; ep = nx) {
		nx = ep->next;
		ep_drop(v, ep);
	}
	free(v->pr);
	free(v->pfd);
	free(v->pidx);
	free(v->pwr);
	free(v);
	g->env = NULL;
}

/* The episode's fields of the record (rl-trajectory(5)); frees the episode. */
int
rli_env_record(rl_traj *t, gen *g, void *user, const rl_gen_sample *s)
{
	rli_episode *ep = user;
	int rv = RL_OK;
	double sum = 0;

	if (s->mask && (rv = rl_traj_set_u8s(t, RL_TAG_LOSS_MASK, s->mask, (size_t)s->n)) != 0)
		goto out;
	if ((rv = rl_traj_set_i32s(t, RL_TAG_TURNS, ep->turns, 2 * (size_t)ep->nturn)) != 0 ||
	    (rv = rl_traj_set_i32s(t, RL_TAG_TURN_VERSIONS, ep->tver, 2 * (size_t)ep->nturn)) != 0 ||
	    (rv = rl_traj_set_f32s(t, RL_TAG_TURN_REWARDS, ep->trew, (size_t)ep->nturn)) != 0)
		goto out;
	for (int i = 0; i < ep->nturn; i++)
		sum += ep->trew[i];
	if (ep->nreward && !ep->error && (rv = rl_traj_set_f32(t, RL_TAG_REWARD, (float)sum)) != 0)
		goto out;
	if (ep->error && (rv = rl_traj_set_str(t, RL_TAG_ENV_ERROR, ep->error)) != 0)
		goto out;
out:
	ep_free(g->env, ep);
	return rv;
}

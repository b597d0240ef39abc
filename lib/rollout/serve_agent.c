/*
 * serve_agent.c — `rl-rollout serve --agent CMD`: prompt lines handed to an
 * agent program that talks to this server through the OpenAI API.  Each
 * prompt line (from the input file or stdin, or leased from rl-queue with
 * --queue) becomes a group of -n runs; a run is one process (sh -c CMD, in
 * its own process group, by posix_spawn) with the server's URL, the API key, its episode id
 * and the prompt line in its environment, the line also on its stdin.  Its
 * calls carry X-Episode-Id; the episode ends when the agent posts the reward
 * (POST /rl/episodes/ID/reward) or, when it exits with status 0 without
 * having done so, with the reward on the last line of its stdout (a JSON
 * number or {"reward": R}).  --agents runs go at once.
 *
 * A run that exits non-zero, is killed, runs past --agent-timeout, or exits
 * without a reward fails: its episode is written without a reward, with
 * env_error saying why and finish "abort" (an empty response when it made no
 * call), so its group keeps its size, as a failed --env episode does.  A
 * group's records go to the output as they end; with --queue a complete
 * group is put as scored (its lease completed), an incomplete one at
 * shutdown is not put but handed back (released: the broker leases it again).
 * Episodes of other clients go to the output as without --agent (with
 * --queue, rewarded ones to the broker as below).
 *
 * --queue without --agent: the runs are handed to clients instead of
 * processes.  POST /rl/episodes takes the next run of a leased group (leasing
 * a line when none waits) and answers its episode id and prompt line; the
 * client's calls and reward make the episode as an agent's do, and the group
 * goes to the broker as above.  A run handed out whose client makes no call
 * within --episode-timeout, or whose episode idles past it, fails as an
 * agent run does.  Episodes no run owns go to rl-queue, once rewarded, as
 * groups of one.
 *
 * With --queue, the leases of the groups not yet put are renewed while their
 * runs go on (a third of the broker's lease time apart), so a slow agent or
 * client does not lose its line to another server.
 *
 * Everything here runs on the engine thread.  Leaves out: reading prompt
 * lines without blocking (a slow stdin holds the server while a line is
 * incomplete), agents on other machines (they are children of the server;
 * clients of POST /rl/episodes may be anywhere).
 */
#include "rollout/serve_int.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/json.h"

extern char **environ;

enum { RUN_WAIT, RUN_LIVE, RUN_ENDING, RUN_CLIENT };

#define RUN_OUT_MAX 8192     /* the tail of an agent's stdout kept for its reward line */
#define RUN_PROMPT_ENV_MAX 65536 /* RL_PROMPT is left out for longer lines (stdin has them) */

typedef struct sv_run {
	prompt *p;             /* its group's prompt; NULL once its record went out */
	int index;
	char id[SV_EPISODE_ID_MAX + 1];
	char *line;            /* the prompt line, with its '\n' */
	size_t len, off;       /* stdin: its length and what is written */
	pid_t pid;
	int wfd, rfd;
	char out[RUN_OUT_MAX];
	size_t on;
	double deadline;       /* --agent-timeout; a client's first call (--episode-timeout) */
	double ended;          /* a client's run: when its record went out */
	uint64_t lease, rid;   /* --queue: the lease and the prompt record of its group */
	int state;             /* RUN_* */
	int client;            /* handed to a client (POST /rl/episodes), not a process */
	int status;            /* waitpid's, once it ended */
	char *error;           /* why it failed (NULL: it did not) */
	struct sv_run *next;
} sv_run;

struct sv_agents {
	sv_run *runs;          /* runs not finished, or whose record did not go out */
	int live, waiting;
	FILE *in;
	char *buf;
	size_t cap;
	int eof, fail, stopping;
	rl_qlease lease;
	rl_traj *t;
	double last_lease, idle_since;
	double renew_s, t_renew;   /* --queue: the leases' renewal period, the last renewal */
	uint64_t groups, n_runs, n_ok, n_failed, n_renew_lost;
};

static sv_run *
run_find(serve *s, const char *id)
{
	for (sv_run *r = s->ag ? s->ag->runs : NULL; r; r = r->next)
		if (strcmp(r->id, id) == 0)
			return r;
	return NULL;
}

int
sv_agent_refuse(serve *s, const char *id)
{
	sv_run *r = run_find(s, id);
	return r && !r->p;
}

int
sv_agent_owns(serve *s, const char *id)
{
	return run_find(s, id) != NULL;
}

/* A complete group goes on: put as scored with --queue (completing its lease). */
static int
group_done(serve *s, prompt *p)
{
	gen *g = s->g;
	int rv = RL_OK;

	if (g->qc) {
		rl_qput_result res;
		if ((rv = rl_qclient_put_scored(g->qc, p->out, &res)) != 0)
			rl_error("--queue: cannot put the episodes of group %016llx: %s", (unsigned long long)p->group,
			    rl_strerror(rv));
		else
			g->q_put += res.accepted;
	}
	rl_traj_batch_destroy(p->out);
	rli_prompt_free(p);
	return rv;
}

/* A group that will not be complete (the server stops): with --queue its
 * prompt goes back to the broker now, to be leased again, not at the
 * lease's expiry. */
static void
group_drop(serve *s, sv_run *r)
{
	prompt *p = r->p;
	rl_qack_result res;

	if (s->g->qc && rl_qclient_ack_ids(s->g->qc, r->lease, RL_QACK_RELEASE, &r->rid, 1, &res) != 0)
		rl_warn("--queue: the prompt of group %016llx could not be handed back; its lease expires on the broker",
		    (unsigned long long)p->group);
	rl_traj_batch_destroy(p->out);
	rli_prompt_free(p);
}

/* A run's record: its group's fields, the line's fields in meta, the failure. */
static int
run_fields(serve *s, sv_run *r, rl_traj *t)
{
	const char *ms = NULL;
	cJSON *m = NULL, *pm = NULL, *it;
	char *js = NULL;
	int rv;

	if ((rv = rl_traj_set_u64(t, RL_TAG_GROUP, r->p->group)) || (rv = rl_traj_set_i32(t, RL_TAG_INDEX, r->index)) ||
	    (rv = rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, r->p->gsize)))
		return rv;
	if (r->error && ((rv = rl_traj_set_str(t, RL_TAG_ENV_ERROR, r->error)) ||
	    (rv = rl_traj_set_str(t, RL_TAG_FINISH, "abort"))))
		return rv;
	/* the prompt line's other fields (a verifier's answer, a task name) beside the episode's */
	if (rl_traj_get_str(t, RL_TAG_META, &ms, NULL) == RL_OK)
		m = cJSON_Parse(ms);
	if (!m && !(m = cJSON_CreateObject()))
		return RL_ENOMEM;
	if (r->p->meta && (pm = cJSON_Parse(r->p->meta)) && cJSON_IsObject(pm))
		cJSON_ArrayForEach(it, pm)
			if (it->string && !cJSON_GetObjectItemCaseSensitive(m, it->string))
				cJSON_AddItemToObject(m, it->string, cJSON_Duplicate(it, 1));
	if (!(js = rl_json_print(m)))
		rv = RL_ENOMEM;
	else
		rv = rl_traj_set_json(t, RL_TAG_META, js);
	free(js);
	cJSON_Delete(m);
	cJSON_Delete(pm);
	return rv;
}

int
sv_agent_emit(serve *s, const char *id, rl_traj *t)
{
	sv_run *r = run_find(s, id);
	prompt *p;
	float rw;
	int rv;

	if (!r || !r->p) {
		if (s->g->qc && rl_traj_get_f32(t, RL_TAG_REWARD, &rw) == RL_OK) {
			/* a client's own rewarded episode: a scored group of one for the trainers
			 * (one without a reward goes to -o: there is no score to train on) */
			rl_traj_batch *b = NULL;
			rl_qput_result res;
			if ((rv = rl_traj_batch_create(&b)) == 0 && (rv = rl_traj_batch_add(b, t)) == 0 &&
			    (rv = rl_qclient_put_scored(s->g->qc, b, &res)) == 0)
				s->g->q_put += res.accepted;
			else
				rl_error("--queue: cannot put the record of episode '%s': %s", id, rl_strerror(rv));
			rl_traj_batch_destroy(b);
			return rv;
		}
		if ((rv = rl_traj_writer_put(s->g->w, t)) == 0)
			rv = rl_traj_writer_flush(s->g->w);
		return rv;
	}
	p = r->p;
	if (s->ag->stopping && s->g->qc) {
		/* shutting down: the group is not put but handed back */
		if (--p->remaining == 0)
			group_drop(s, r);
		r->p = NULL;
		return RL_OK;
	}
	if (r->client && !r->error && rl_traj_get_f32(t, RL_TAG_REWARD, &rw) != RL_OK) {
		/* its episode idled past --episode-timeout: the client is taken for gone */
		if (!(r->error = strdup("no reward: its episode was idle past --episode-timeout")))
			return RL_ENOMEM;
		s->ag->n_failed++;
	}
	if ((rv = run_fields(s, r, t)) != 0)
		return rv;
	if (!r->error && rl_traj_get_f32(t, RL_TAG_REWARD, &rw) == RL_OK)
		s->ag->n_ok++;
	if (s->g->qc)
		rv = rl_traj_batch_add(p->out, t);
	else if ((rv = rl_traj_writer_put(s->g->w, t)) == 0)
		rv = rl_traj_writer_flush(s->g->w);
	/* written or not, the run is over for its group: it is not written twice */
	r->p = NULL;
	r->ended = rl_now();
	if (--p->remaining == 0) {
		int r2 = group_done(s, p);
		if (!rv)
			rv = r2;
	}
	return rv;
}

/* The record of a failed run that left no episode: the line's prompt, no response. */
static int
emit_empty(serve *s, sv_run *r)
{
	rl_traj *t = NULL;
	char meta[SV_EPISODE_ID_MAX + 64];
	int rv;

	if ((rv = rl_traj_create(&t)) != 0)
		return rv;
	snprintf(meta, sizeof meta, "{\"episode_id\":\"%s\",\"calls\":0,\"end\":\"agent_error\"}", r->id);
	if (!(rv = rl_traj_set_u64(t, RL_TAG_ID, rl_hash64(r->id, strlen(r->id), 0x5e7e))) &&
	    !(rv = rl_traj_set_version(t, s->g->version, s->g->version)) &&
	    !(rv = rl_traj_set_i32s(t, RL_TAG_PROMPT, r->p->ids, (size_t)r->p->nids)) &&
	    !(rv = rl_traj_set_i32s(t, RL_TAG_RESPONSE, NULL, 0)) && !(rv = rl_traj_set_f32s(t, RL_TAG_LOGPROBS, NULL, 0)) &&
	    !(rv = rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, r->p->text ? r->p->text : "")) &&
	    !(rv = rl_traj_set_str(t, RL_TAG_RESPONSE_TEXT, "")) && !(rv = rl_traj_set_json(t, RL_TAG_META, meta)))
		rv = sv_agent_emit(s, r->id, t);
	rl_traj_destroy(t);
	return rv;
}

/* ---- processes -------------------------------------------------------------------------------------- */

/* name=value, malloc'd into *slot. */
static int
env_put(char **slot, const char *name, const char *value)
{
	size_t n = strlen(name) + strlen(value) + 2;

	if (!(*slot = rl_try_malloc(n, "agent environment")))
		return RL_ENOMEM;
	snprintf(*slot, n, "%s=%s", name, value);
	return RL_OK;
}

static const char *const env_names[] = { "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "RL_EPISODE_ID",
	"RL_EPISODE_INDEX", "RL_PROMPT", NULL };

/* The agent's environment: the server's own, less the names it sets. */
static char **
env_build(serve *s, sv_run *r, size_t *ownp)
{
	size_t n = 0, k = 0;
	char url[340], idx[16], **e;
	int rv = RL_OK;

	while (environ[n])
		n++;
	if (!(e = rl_try_calloc(n + 8, sizeof *e, "agent environment")))
		return NULL;
	for (size_t i = 0; i < n; i++) {
		int skip = 0;
		for (int j = 0; env_names[j]; j++) {
			size_t l = strlen(env_names[j]);
			if (strncmp(environ[i], env_names[j], l) == 0 && environ[i][l] == '=')
				skip = 1;
		}
		if (!skip)
			e[k++] = environ[i];
	}
	size_t own = k;
	snprintf(url, sizeof url, "%s/v1", s->url);
	snprintf(idx, sizeof idx, "%d", r->index);
	/* the openai clients refuse to start without a key: vLLM's placeholder when none is needed */
	if ((rv = env_put(&e[k++], "OPENAI_BASE_URL", url)) || (rv = env_put(&e[k++], "OPENAI_API_KEY", s->key[0] ? s->key : "EMPTY")) ||
	    (rv = env_put(&e[k++], "OPENAI_MODEL", s->name)) || (rv = env_put(&e[k++], "RL_EPISODE_ID", r->id)) ||
	    (rv = env_put(&e[k++], "RL_EPISODE_INDEX", idx)))
		goto fail;
	if (r->len <= RUN_PROMPT_ENV_MAX) {
		r->line[r->len - 1] = 0;
		rv = env_put(&e[k++], "RL_PROMPT", r->line);
		r->line[r->len - 1] = '\n';
		if (rv)
			goto fail;
	}
	e[k] = NULL;
	*ownp = own; /* where the strings it owns start */
	return e;
fail:
	for (size_t i = own; i < k; i++)
		free(e[i]);
	free(e);
	return NULL;
}

static void
env_free(char **e, size_t own)
{
	for (size_t i = own; e[i]; i++)
		free(e[i]);
	free(e);
}

static int
run_start(serve *s, sv_run *r)
{
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, err = 0;
	size_t own = 0;
	char **envp;
	char *argv[] = { "sh", "-c", (char *)s->g->o.agent_cmd, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t def;
	pid_t pid;

	if (!(envp = env_build(s, r, &own)))
		return RL_ENOMEM;
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
		err = errno;
		goto fail;
	}
	/* posix_spawn (vfork-like): no copy of the server's address space per agent;
	 * its own process group, so a hung agent is killed with its children */
	posix_spawn_file_actions_init(&fa);
	posix_spawnattr_init(&at);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
	err = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	if (err)
		goto fail;
	env_free(envp, own);
	close(in[0]);
	close(out[1]);
	fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
	fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
	r->pid = pid;
	r->wfd = in[1];
	r->rfd = out[0];
	r->deadline = s->g->o.agent_timeout > 0 ? rl_now() + s->g->o.agent_timeout : 0;
	r->state = RUN_LIVE;
	s->ag->live++;
	s->ag->waiting--;
	s->ag->n_runs++;
	rl_verbose("--agent: episode %s started (pid %d)", r->id, (int)pid);
	return RL_OK;
fail:
	rl_error("--agent: cannot start '%s': %s", s->g->o.agent_cmd, strerror(err));
	for (int i = 0; i < 2; i++) {
		if (in[i] >= 0)
			close(in[i]);
		if (out[i] >= 0)
			close(out[i]);
	}
	env_free(envp, own);
	return RL_EIO;
}

/* stdin written as the pipe takes it, stdout's tail kept. */
static void
run_io(sv_run *r)
{
	char b[4096];
	ssize_t k = -1;

	if (r->wfd >= 0) {
		k = write(r->wfd, r->line + r->off, r->len - r->off);
		if (k > 0)
			r->off += (size_t)k;
		if (r->off == r->len || (k < 0 && errno != EAGAIN && errno != EINTR)) {
			close(r->wfd);
			r->wfd = -1;
		}
	}
	while (r->rfd >= 0 && (k = read(r->rfd, b, sizeof b)) != 0) {
		if (k < 0) {
			if (errno != EAGAIN && errno != EINTR) {
				close(r->rfd);
				r->rfd = -1;
			}
			break;
		}
		/* the tail is what matters: the reward is the last line */
		for (ssize_t i = 0; i < k; i++) {
			if (r->on == sizeof r->out) {
				memmove(r->out, r->out + sizeof r->out / 2, sizeof r->out / 2);
				r->on = sizeof r->out / 2;
			}
			r->out[r->on++] = b[i];
		}
	}
	if (k == 0 && r->rfd >= 0) {
		close(r->rfd);
		r->rfd = -1;
	}
}

/* The reward on the last non-empty line of stdout: 1 and *v, or 0. */
static int
stdout_reward(sv_run *r, double *v)
{
	size_t e = r->on, b;
	char line[256];
	cJSON *j, *x;
	int ok = 0;

	while (e > 0 && (r->out[e - 1] == '\n' || r->out[e - 1] == '\r' || r->out[e - 1] == ' '))
		e--;
	for (b = e; b > 0 && r->out[b - 1] != '\n'; b--)
		;
	if (e == b || e - b >= sizeof line)
		return 0;
	memcpy(line, r->out + b, e - b);
	line[e - b] = 0;
	if (!(j = cJSON_Parse(line)))
		return 0;
	x = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "reward") : j;
	if (cJSON_IsNumber(x) && x->valuedouble == x->valuedouble) {
		*v = x->valuedouble;
		ok = 1;
	}
	cJSON_Delete(j);
	return ok;
}

static int
run_fail(serve *s, sv_run *r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int
run_fail(serve *s, sv_run *r, const char *fmt, ...)
{
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!r->error && !(r->error = strdup(msg)))
		return RL_ENOMEM;
	rl_warn("%s: episode %s (prompt line %llu, run %d) failed: %s", r->client ? "--queue" : "--agent", r->id,
	    (unsigned long long)r->p->line, r->index, msg);
	s->ag->n_failed++;
	return RL_OK;
}

static void
run_kill(sv_run *r)
{
	if (r->wfd >= 0)
		close(r->wfd);
	if (r->rfd >= 0)
		close(r->rfd);
	r->wfd = r->rfd = -1;
	if (r->pid > 0) {
		kill(-r->pid, SIGKILL);
		while (waitpid(r->pid, &r->status, 0) < 0 && errno == EINTR)
			;
		r->pid = 0;
	}
}

/* A run whose process is gone: its reward from stdout, or its failure; its
 * episode ended (once no call of it is in flight).  1 when it is finished. */
static int
run_end(serve *s, sv_run *r, int *rv)
{
	char msg[400];
	double v;
	int st, tokens, turns;

	*rv = RL_OK;
	if (!r->p)
		return 1; /* its record went out (the reward was posted) */
	if (!r->error) {
		if (WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0) {
			if (stdout_reward(r, &v)) {
				st = sv_ep_reward(s, r->id, v, msg, sizeof msg, &tokens, &turns);
				if (st == 409)
					return 0;
				if (st == 0)
					return 1;
				*rv = run_fail(s, r, "its reward on stdout has no episode: %s", msg);
			} else {
				*rv = run_fail(s, r, "it exited without a reward (POST /rl/episodes/%s/reward, or "
				    "{\"reward\": R} as the last line of its stdout)", r->id);
			}
		} else if (WIFEXITED(r->status)) {
			*rv = run_fail(s, r, "it exited with status %d", WEXITSTATUS(r->status));
		} else {
			*rv = run_fail(s, r, "it was killed by signal %d", WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0);
		}
		if (*rv)
			return 1;
	}
	if (sv_ep_close(s, r->id, "agent_error") == 1)
		return 0; /* a call still in flight: its end comes first */
	if (r->p)
		*rv = emit_empty(s, r);
	return 1;
}

/* A client's run: failed when no call came within --episode-timeout of its
 * hand-out; kept 10 minutes (or --episode-timeout if longer) after its
 * record went out, so that a late call under its id is refused (409), not
 * taken for a new episode.  1: free it. */
static int
client_poll(serve *s, sv_run *r, double now, int *rv)
{
	double keep = RL_MAX(s->g->o.episode_timeout, 600);

	*rv = RL_OK;
	if (!r->p)
		return now - r->ended > keep;
	if (r->deadline > 0 && now > r->deadline && !sv_ep_open(s, r->id)) {
		*rv = run_fail(s, r, "its client made no call within --episode-timeout %g s", s->g->o.episode_timeout);
		r->state = RUN_ENDING;
	}
	return 0;
}

/* Polls the live runs: stdin and stdout, exits, timeouts. */
static int
runs_poll(serve *s)
{
	sv_agents *a = s->ag;
	double now = rl_now();
	int rv = RL_OK;

	for (sv_run **pp = &a->runs; *pp;) {
		sv_run *r = *pp;
		if (r->state == RUN_CLIENT) {
			int gone = client_poll(s, r, now, &rv);
			if (rv)
				return rv;
			if (gone) {
				*pp = r->next;
				free(r->line);
				free(r->error);
				free(r);
				continue;
			}
		}
		if (r->state == RUN_LIVE) {
			run_io(r);
			pid_t w = waitpid(r->pid, &r->status, WNOHANG);
			if (w == r->pid) {
				run_io(r);
				kill(-r->pid, SIGKILL); /* what it left running in its group */
				r->pid = 0;
				run_kill(r);
				r->state = RUN_ENDING;
				a->live--;
			} else if (r->deadline > 0 && now > r->deadline) {
				run_kill(r);
				r->state = RUN_ENDING;
				a->live--;
				if (r->p && (rv = run_fail(s, r, "it ran past --agent-timeout %g s and was killed",
				    s->g->o.agent_timeout)) != 0)
					return rv;
			}
		}
		if (r->state == RUN_ENDING) {
			int r2, fin;
			fin = run_end(s, r, &r2);
			if (r2)
				return r2;
			if (fin && r->client) {
				r->state = RUN_CLIENT;
				r->ended = now;
			} else if (fin) {
				*pp = r->next;
				free(r->line);
				free(r->error);
				free(r);
				continue;
			}
		}
		pp = &r->next;
	}
	return rv;
}

/* -n runs of a prompt, waiting for a free agent. */
static int
group_add(serve *s, prompt *p, const char *line, size_t len)
{
	sv_run **tail = &s->ag->runs;

	while (*tail)
		tail = &(*tail)->next;
	p->remaining = p->gsize = s->g->o.n;
	if (rl_traj_batch_create(&p->out) != 0)
		return RL_ENOMEM;
	for (int i = 0; i < s->g->o.n; i++) {
		sv_run *r = rl_try_calloc(1, sizeof *r, "agent run");
		if (!r || !(r->line = rl_try_malloc(len + 1, "prompt line"))) {
			free(r);
			return RL_ENOMEM;
		}
		memcpy(r->line, line, len);
		r->line[len] = '\n';
		r->len = len + 1;
		r->p = p;
		r->index = i;
		r->pid = 0;
		r->wfd = r->rfd = -1;
		r->state = RUN_WAIT;
		snprintf(r->id, sizeof r->id, "%016llx-%d", (unsigned long long)p->group, i);
		*tail = r;
		tail = &r->next;
		s->ag->waiting++;
	}
	s->ag->groups++;
	return RL_OK;
}

/* Pipe wiring: the next prompt line when the agents and the staleness gate
 * have room.  0, or the error that stops the server. */
static int
take_line(serve *s)
{
	sv_agents *a = s->ag;
	gen *g = s->g;
	ssize_t len;
	prompt *p;
	int rv;

	if (g->o.max_staleness >= 0 && (int)(a->groups / (uint64_t)g->o.train_batch) - g->o.max_staleness > g->version)
		return RL_OK; /* the trainer is behind: new lines wait for its next version */
	errno = 0;
	if ((len = getline(&a->buf, &a->cap, a->in)) < 0) {
		if (ferror(a->in)) {
			rl_error("cannot read '%s': %s", g->o.input, strerror(errno));
			a->fail = RL_EIO;
		}
		a->eof = 1;
		return RL_OK;
	}
	g->lines++;
	while (len > 0 && (a->buf[len - 1] == '\n' || a->buf[len - 1] == '\r'))
		a->buf[--len] = 0;
	if (len == 0 || strspn(a->buf, " \t") == (size_t)len)
		return RL_OK;
	if ((rv = rli_prompt_parse_line(g, a->buf, (size_t)len, &p)) != 0) {
		/* what runs finishes; the run then fails */
		a->fail = rv;
		a->eof = 1;
		return rv == RL_ENOMEM ? rv : RL_OK;
	}
	p->group = g->nonce | (a->groups & 0xffffffffULL);
	return group_add(s, p, a->buf, (size_t)len);
}

/* Queue wiring: want prompts leased as groups of runs (no wait: the engine
 * thread serves while it leases). */
static int
take_leased(serve *s, uint32_t want)
{
	sv_agents *a = s->ag;
	gen *g = s->g;
	int rv;

	a->last_lease = rl_now();
	rv = rl_qclient_lease_prompts(g->qc, want, (uint32_t)g->o.n, 0, &a->lease);
	if (rv != RL_OK && (rv != RL_ETIMEDOUT || rl_qclient_gone(g->qc)) && rv != RL_EBUSY)
		return rv;
	if (rv != RL_OK || rl_qlease_count(&a->lease) == 0)
		return RL_OK;
	{
		/* renewed at a third of what the broker gave, as rl-train renews */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double left = a->lease.deadline_ms / 1000.0 - ((double)ts.tv_sec + ts.tv_nsec / 1e9);
		if (left > 0)
			a->renew_s = RL_MAX(left / 3, 0.05);
		if (!a->t_renew)
			a->t_renew = rl_now();
	}
	if ((int)a->lease.version > g->version && (g->ws || g->o.weights_from || g->wg) && (rv = rli_poll_weights(g, 1)) != 0)
		return rv;
	for (size_t i = 0; i < rl_qlease_count(&a->lease); i++) {
		prompt *p = NULL;
		char *line = NULL;
		if ((rv = rl_traj_batch_get(a->lease.batch, i, a->t)) != 0)
			return rv;
		int prv = rli_prompt_from_record(g, a->t, &p);
		if (prv == RL_OK)
			prv = rli_queue_line(a->t, &line);
		if (prv == RL_ENOMEM) {
			rli_prompt_free(p);
			return prv;
		}
		if (prv != RL_OK) {
			/* an unusable prompt is given up (acknowledged), not retried forever */
			uint64_t id = 0;
			rl_qack_result ares;
			rl_traj_get_u64(a->t, RL_TAG_ID, &id);
			rl_qclient_ack_ids(g->qc, a->lease.id, RL_QACK_DONE, &id, 1, &ares);
			rli_prompt_free(p);
			g->q_bad++;
			continue;
		}
		rv = group_add(s, p, line, strlen(line));
		free(line);
		if (rv)
			return rv;
		/* the group's runs are the list's last */
		uint64_t rid = 0;
		rl_traj_get_u64(a->t, RL_TAG_ID, &rid);
		for (sv_run *r = a->runs; r; r = r->next)
			if (r->p == p) {
				r->lease = a->lease.id;
				r->rid = rid;
			}
	}
	return RL_OK;
}

/* --queue: the leases of the groups not yet put, renewed (once per group:
 * its runs share the prompt record).  A renewal the broker refuses (the
 * lease expired before it came) is logged: the line may be leased again
 * elsewhere, and the group put here is then a second one. */
static void
renew(serve *s)
{
	sv_agents *a = s->ag;

	if (!s->g->qc || !a->runs || a->renew_s <= 0 || rl_now() - a->t_renew < a->renew_s)
		return;
	a->t_renew = rl_now();
	for (sv_run *r = a->runs; r; r = r->next) {
		rl_qack_result res;
		int first = r->p != NULL, rv;
		for (sv_run *q = a->runs; q != r && first; q = q->next)
			if (q->p == r->p)
				first = 0;
		if (!first)
			continue;
		memset(&res, 0, sizeof res);
		rv = rl_qclient_ack_ids(s->g->qc, r->lease, RL_QACK_EXTEND, &r->rid, 1, &res);
		if (rv == RL_ENOENT || (rv == RL_OK && res.late > 0)) {
			a->n_renew_lost++;
			rl_warn("--queue: the lease of group %016llx had expired on the broker before its renewal; "
			    "its prompt line may be leased again", (unsigned long long)r->p->group);
		} else if (rv != RL_OK) {
			rl_verbose("--queue: the lease of group %016llx was not renewed: %s", (unsigned long long)r->p->group,
			    rl_strerror(rv));
		}
	}
}

int
sv_agent_hand(serve *s, char **json, char *msg, size_t ml)
{
	sv_agents *a = s->ag;
	sv_run *r = NULL;
	cJSON *o = NULL, *line;
	char grp[20];
	int rv;

	*json = NULL;
	if (!a || s->g->o.agent_cmd) {
		snprintf(msg, ml, "POST /rl/episodes hands out prompt lines leased from rl-queue: %s",
		    a ? "this server gives them to its --agent runs" : "the server was not started with --queue URL");
		return a ? 409 : 404;
	}
	for (int pass = 0; pass < 2 && !r; pass++) {
		for (sv_run *q = a->runs; q && !r; q = q->next)
			if (q->state == RUN_WAIT)
				r = q;
		if (r || pass)
			break;
		if ((rv = take_leased(s, 1)) != 0) {
			snprintf(msg, ml, "cannot lease a prompt line from rl-queue at %s: %s", s->g->o.queue_url,
			    rl_strerror(rv));
			return rv == RL_ENOMEM ? 500 : 503;
		}
	}
	if (!r) {
		snprintf(msg, ml, "no prompt line to lease: rl-queue at %s has none waiting (or its staleness gate holds "
		    "them); retry later", s->g->o.queue_url);
		return 503;
	}
	if (!(o = cJSON_CreateObject()))
		return 500;
	snprintf(grp, sizeof grp, "%016llx", (unsigned long long)r->p->group);
	r->line[r->len - 1] = 0;
	line = cJSON_Parse(r->line);
	r->line[r->len - 1] = '\n';
	cJSON_AddStringToObject(o, "episode_id", r->id);
	cJSON_AddStringToObject(o, "group", grp);
	cJSON_AddNumberToObject(o, "index", r->index);
	cJSON_AddNumberToObject(o, "group_size", r->p->gsize);
	if (line)
		cJSON_AddItemToObject(o, "prompt", line);
	if (!line || !(*json = rl_json_print(o))) {
		cJSON_Delete(o);
		return 500;
	}
	cJSON_Delete(o);
	r->state = RUN_CLIENT;
	r->client = 1;
	r->deadline = s->g->o.episode_timeout > 0 ? rl_now() + s->g->o.episode_timeout : 0;
	a->waiting--;
	a->n_runs++;
	rl_verbose("--queue: episode %s handed out", r->id);
	return 0;
}

uint64_t
sv_agent_handed(const serve *s)
{
	return s->ag && !s->g->o.agent_cmd ? s->ag->n_runs : 0;
}

int
sv_agent_open(serve *s)
{
	gen *g = s->g;
	rl_qclient_opts qo;
	int rv;

	if (!(s->ag = rl_try_calloc(1, sizeof *s->ag, "agents")))
		return RL_ENOMEM;
	rl_qlease_init(&s->ag->lease);
	s->ag->idle_since = rl_now();
	/* an agent gone before it read its line must not kill the server */
	signal(SIGPIPE, SIG_IGN);
	if (!g->o.queue_url)
		return rl_io_fopen(&s->ag->in, g->o.input, "r");
	rl_qclient_opts_stage(&qo, g->o.broker_timeout);
	if ((rv = rl_qclient_open(&g->qc, g->o.queue_url, &qo)) != 0 || (rv = rl_traj_create(&s->ag->t)) != 0)
		return rv;
	/* stopping, a broker gone is not waited for: what was leased expires there */
	rl_qclient_set_stop(g->qc, rli_stop_flag());
	return RL_OK;
}

int
sv_agent_pump(serve *s, int *finished)
{
	sv_agents *a = s->ag;
	gen *g = s->g;
	int rv;

	*finished = 0;
	if ((rv = runs_poll(s)) != 0)
		return rv;
	renew(s);
	if (!g->o.agent_cmd) {
		/* clients lease through POST /rl/episodes; a broker silent for
		 * --broker-timeout (logged by the client) ends the server, as it ends --agent's */
		return g->qc && rl_qclient_gone(g->qc) ? RL_ETIMEDOUT : RL_OK;
	}
	if (g->qc && !a->waiting && a->live < g->o.agents && rl_now() - a->last_lease >= 0.1 &&
	    (rv = take_leased(s, (uint32_t)RL_MAX((g->o.agents - a->live) / g->o.n, 1))) != 0)
		return rv;
	while (!g->qc && !a->eof && !a->waiting && a->live < g->o.agents) {
		uint64_t before = a->groups;
		if ((rv = take_line(s)) != 0)
			return rv;
		if (a->groups == before && !a->eof && g->o.max_staleness >= 0)
			break; /* held by the staleness gate */
	}
	for (sv_run *r = a->runs; r && a->live < g->o.agents; r = r->next)
		if (r->state == RUN_WAIT && (rv = run_start(s, r)) != 0)
			return rv;
	if (a->runs)
		a->idle_since = rl_now();
	if (!g->qc && a->eof && !a->runs)
		*finished = 1;
	if (g->qc && g->o.idle_exit > 0 && !a->runs && rl_now() - a->idle_since > g->o.idle_exit)
		*finished = 1;
	return RL_OK;
}

void
sv_agent_stop(serve *s)
{
	if (!s->ag)
		return;
	s->ag->stopping = 1;
	for (sv_run *r = s->ag->runs; r; r = r->next)
		if (r->state == RUN_LIVE) {
			run_kill(r);
			r->state = RUN_ENDING;
			s->ag->live--;
		}
}

int
sv_agent_close(serve *s)
{
	sv_agents *a = s->ag;
	int rv;

	if (!a)
		return RL_OK;
	rv = a->fail;
	if (a->n_runs)
		rl_info("%s: %llu runs, %llu with a reward, %llu failed", s->g->o.agent_cmd ? "--agent" : "--queue",
		    (unsigned long long)a->n_runs, (unsigned long long)a->n_ok, (unsigned long long)a->n_failed);
	if (a->n_renew_lost)
		rl_warn("--queue: %llu leases expired on the broker before their renewal", (unsigned long long)a->n_renew_lost);
	/* a broken command fails fast (not after a signal, which ends runs midway) */
	if (!rv && s->g->o.agent_cmd && a->n_runs > 0 && a->n_ok == 0 && !rli_stop_requested()) {
		rl_error("--agent: no run of '%s' ended with a reward", s->g->o.agent_cmd);
		rl_hint("run it by hand with OPENAI_BASE_URL, RL_EPISODE_ID and a prompt line on its stdin");
		rv = RL_EIO;
	}
	for (sv_run *r = a->runs, *nx; r; r = nx) {
		nx = r->next;
		run_kill(r);
		/* a group left incomplete is not put: handed back to the broker */
		if (r->p && --r->p->remaining == 0)
			group_drop(s, r);
		free(r->line);
		free(r->error);
		free(r);
	}
	if (a->in && a->in != stdin)
		fclose(a->in);
	free(a->buf);
	rl_qlease_fini(&a->lease);
	rl_traj_destroy(a->t);
	if (s->g->qc) {
		rl_qclient_close(s->g->qc);
		s->g->qc = NULL;
	}
	free(a);
	s->ag = NULL;
	return rv;
}

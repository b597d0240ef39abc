/*
 * reward_exec.c — coprocess reward workers: spawn, feed one line, read one
 * line, and kill/restart on crash, junk or timeout (see reward_exec.h).
 *
 * One poll(2) loop over every worker's two pipe ends and its pidfd; all fds
 * non-blocking and close-on-exec on our side.  The pidfd tells a worker's
 * exit even while a child it left behind holds its stdout open.  Each worker
 * is its own process group so a `sh -c` wrapper and its children die
 * together.  Between runs a small thread waits on the idle workers' pidfds
 * and reaps one that exits, so none stays a zombie while the caller waits
 * for input.  With opts.subreaper the process is a child subreaper: a
 * descendant that left its worker's group (setsid) and was orphaned becomes
 * our child; dead ones are reaped after each run and when a worker is
 * reaped, live ones are killed when the pool is destroyed.
 *
 * Leaves out: passing the caller's stdin to workers, shells, retries of a
 * failed record (it is reported, not retried); descendants of a live worker
 * that left its group are not killed before the pool is destroyed, and
 * nothing is cleaned up if the caller itself is killed with SIGKILL.
 */
#include "reward/reward_exec.h"

#include "base/core.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct worker {
	pid_t pid;          /* 0: not running */
	int pidfd;          /* readable when pid exits; -1 if the kernel has none */
	int in_fd;          /* our end of its stdin, -1 when closed */
	int out_fd;         /* our end of its stdout */
	long rec;           /* record index being scored, -1 when idle */
	double deadline;
	const char *wbuf;   /* the line being written (borrowed from the caller) */
	size_t wlen, woff;
	char *rbuf;         /* reply bytes read so far */
	size_t rlen, rcap;
} worker;

struct rl_reward_exec {
	char **argv;
	rl_reward_exec_opts o;
	worker *w;
	size_t restarts;
	int started;        /* workers ever started: the first spawn counts no restart */
	/* the reaper thread: it and the runs take mu around every waitpid */
	pthread_mutex_t mu;
	pthread_t reaper;
	int reaper_up;
	int efd;            /* eventfd: wakes the reaper to look again or stop */
	int stop;
};

static const char *const status_names[RL_EXEC_STATUS_COUNT] = {
	"ok", "timeout", "crash", "junk", "spawn", "http",
};

const char *
rl_reward_exec_status_name(int status)
{
	return status >= 0 && status < RL_EXEC_STATUS_COUNT ? status_names[status] : "unknown";
}

void
rl_reward_exec_opts_default(rl_reward_exec_opts *o)
{
	o->workers = 1;
	o->timeout_s = 30;
	o->max_reply = 1 << 20;
	o->subreaper = 1;
}

size_t
rl_reward_exec_restarts(const rl_reward_exec *x)
{
	return x->restarts;
}

/* ---- argv --------------------------------------------------------------------- */

int
rl_reward_exec_split(char ***argv, const char *cmd)
{
	size_t n = strlen(cmd), nw = 0, k = 0;
	char *buf, **v, *p;
	int in_word = 0;
	char q = 0;

	*argv = NULL;
	/* worst case: every other character a word; words fit in n+1 bytes each way */
	v = rl_try_malloc((n / 2 + 2) * sizeof(char *) + 2 * n + 2, "argv");
	if (!v)
		return RL_ENOMEM;
	buf = (char *)(v + n / 2 + 2);
	p = buf;
	for (size_t i = 0; i < n; i++) {
		char c = cmd[i];
		if (q == '\'') {
			if (c == '\'')
				q = 0;
			else
				p[k++] = c;
			continue;
		}
		if (q == '"') {
			if (c == '"') {
				q = 0;
			} else if (c == '\\' && i + 1 < n && strchr("\"\\$`", cmd[i + 1])) {
				p[k++] = cmd[++i];
			} else {
				p[k++] = c;
			}
			continue;
		}
		if (c == ' ' || c == '\t' || c == '\n') {
			if (in_word) {
				p[k++] = 0;
				v[nw++] = p;
				p += k;
				k = 0;
				in_word = 0;
			}
			continue;
		}
		in_word = 1;
		if (c == '\'' || c == '"') {
			q = c;
		} else if (c == '\\' && i + 1 < n) {
			p[k++] = cmd[++i];
		} else {
			p[k++] = c;
		}
	}
	if (q) {
		rl_error("--exec: unterminated %s quote in '%s'", q == '"' ? "double" : "single", cmd);
		free(v);
		return RL_EINVAL;
	}
	if (in_word) {
		p[k++] = 0;
		v[nw++] = p;
	}
	if (nw == 0) {
		rl_error("--exec: empty command");
		free(v);
		return RL_EINVAL;
	}
	v[nw] = NULL;
	*argv = v;
	return 0;
}

/* ---- workers ------------------------------------------------------------------ */

static void
close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

static int
pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0); /* close-on-exec by default */
#else
	(void)pid;
	return -1;
#endif
}

static int
is_worker(const rl_reward_exec *x, pid_t pid)
{
	for (int i = 0; i < x->o.workers; i++)
		if (x->w[i].pid == pid)
			return 1;
	return 0;
}

/* Our children that are not workers: descendants orphaned to us as the
 * subreaper.  Dead ones are reaped; with kill_them live ones are killed
 * (with their groups) and reaped, a few rounds, as killing one may orphan
 * its own children to us. */
static void
reap_orphans(rl_reward_exec *x, int kill_them)
{
	for (int round = 0; round < 8; round++) {
		DIR *d = opendir("/proc/self/task");
		struct dirent *e;
		int others = 0;

		if (d == NULL)
			return;
		while ((e = readdir(d)) != NULL) {
			char path[300];
			FILE *f;
			long pid;
			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof path, "/proc/self/task/%s/children", e->d_name);
			if ((f = fopen(path, "r")) == NULL)
				continue;
			while (fscanf(f, "%ld", &pid) == 1) {
				if (pid <= 0 || is_worker(x, (pid_t)pid))
					continue;
				others++;
				if (kill_them) {
					kill(-(pid_t)pid, SIGKILL);
					kill((pid_t)pid, SIGKILL);
					while (waitpid((pid_t)pid, NULL, 0) < 0 && errno == EINTR)
						;
				} else {
					waitpid((pid_t)pid, NULL, WNOHANG);
				}
			}
			fclose(f);
		}
		closedir(d);
		if (!kill_them || others == 0)
			return;
	}
}

/* Reaps the members of a killed worker's process group that were orphaned
 * to us (the subreaper); ECHILD at once when there are none. */
static void
reap_group(pid_t pgid)
{
	while (waitpid(-pgid, NULL, 0) > 0 || errno == EINTR)
		;
}

/* Kills the worker's process group and reaps it. */
static void
worker_kill(worker *w)
{
	int st = 0;

	close_fd(&w->in_fd);
	close_fd(&w->out_fd);
	close_fd(&w->pidfd);
	if (w->pid > 0) {
		kill(-w->pid, SIGKILL);
		kill(w->pid, SIGKILL);
		while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
			;
		reap_group(w->pid);
		w->pid = 0;
	}
	w->rlen = 0;
	w->rec = -1;
}

/* The worker closed its stdout: reap it (it may still be running: kill it)
 * and say how it ended. */
static void
worker_reap(worker *w, char *why, size_t cap)
{
	int st = 0;
	pid_t r;
	double until = rl_now() + 0.5;

	close_fd(&w->in_fd);
	close_fd(&w->out_fd);
	close_fd(&w->pidfd);
	/* A worker that closed stdout is usually exiting: give it a moment so the
	 * reason names its status rather than our kill. */
	while ((r = waitpid(w->pid, &st, WNOHANG)) == 0 && rl_now() < until) {
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
	if (r == 0) {
		kill(-w->pid, SIGKILL);
		kill(w->pid, SIGKILL);
		while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
			;
		snprintf(why, cap, "worker closed its output without replying");
	} else if (r > 0 && WIFEXITED(st)) {
		snprintf(why, cap, "worker exited with status %d without replying", WEXITSTATUS(st));
	} else if (r > 0 && WIFSIGNALED(st)) {
		snprintf(why, cap, "worker killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	} else {
		snprintf(why, cap, "worker ended without replying");
	}
	/* its children may linger in the group */
	kill(-w->pid, SIGKILL);
	reap_group(w->pid);
	w->pid = 0;
	w->rlen = 0;
	w->rec = -1;
}

static int
set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -1 : 0;
}

/* Starts w.  Returns 0, or an errno-style code with *why filled. */
static int
worker_spawn(rl_reward_exec *x, worker *w, char *why, size_t cap)
{
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, rv;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, pipe_set;
	pid_t pid;

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
		rv = errno;
		snprintf(why, cap, "cannot create pipes: %s", strerror(rv));
		close_fd(&in[0]);
		close_fd(&in[1]);
		return rv;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	/* the worker sees only its stdin, stdout and stderr */
	posix_spawn_file_actions_addclosefrom_np(&fa, 3);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &pipe_set);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
	rv = posix_spawnp(&pid, x->argv[0], &fa, &at, x->argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(in[0]);
	close(out[1]);
	if (rv != 0) {
		snprintf(why, cap, "cannot run '%s': %s", x->argv[0], strerror(rv));
		close(in[1]);
		close(out[0]);
		return rv;
	}
	if (set_nonblock(in[1]) < 0 || set_nonblock(out[0]) < 0) {
		rv = errno;
		snprintf(why, cap, "cannot set pipes non-blocking: %s", strerror(rv));
		close(in[1]);
		close(out[0]);
		kill(-pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return rv;
	}
	w->pid = pid;
	w->pidfd = pidfd_of(pid);
	w->in_fd = in[1];
	w->out_fd = out[0];
	w->rec = -1;
	w->rlen = 0;
	if (x->started++ >= x->o.workers)
		x->restarts++;
	return 0;
}

/* Idle workers that exited (after their last reply) are reaped, with
 * what is left of their group; the next record restarts them.  Called
 * with mu held. */
static void
reap_idle(rl_reward_exec *x, int orphans)
{
	int any = 0;

	for (int i = 0; i < x->o.workers; i++) {
		worker *w = &x->w[i];
		if (w->pid > 0 && w->rec < 0 && waitpid(w->pid, NULL, WNOHANG) == w->pid) {
			close_fd(&w->in_fd);
			close_fd(&w->out_fd);
			close_fd(&w->pidfd);
			kill(-w->pid, SIGKILL);
			reap_group(w->pid);
			w->pid = 0;
			w->rlen = 0;
			any = 1;
		}
	}
	if (x->o.subreaper && (orphans || any))
		reap_orphans(x, 0);
}

/* Between runs: waits on the idle workers' pidfds and reaps a worker that
 * exits, so it is not left a zombie while the caller waits for input. */
static void *
reaper_main(void *arg)
{
	rl_reward_exec *x = arg;
	struct pollfd *pf = calloc((size_t)x->o.workers + 1, sizeof *pf);

	if (pf == NULL)
		return NULL;
	pthread_mutex_lock(&x->mu);
	while (!x->stop) {
		int n = 0;
		uint64_t u;
		pf[n].fd = x->efd;
		pf[n++].events = POLLIN;
		for (int i = 0; i < x->o.workers; i++)
			if (x->w[i].pid > 0 && x->w[i].rec < 0 && x->w[i].pidfd >= 0) {
				pf[n].fd = x->w[i].pidfd;
				pf[n++].events = POLLIN;
			}
		pthread_mutex_unlock(&x->mu);
		if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) {
			pthread_mutex_lock(&x->mu);
			break;
		}
		if (pf[0].revents)
			(void)!read(x->efd, &u, sizeof u); /* EAGAIN: another read took it */
		pthread_mutex_lock(&x->mu);
		if (!x->stop)
			reap_idle(x, 1);
	}
	pthread_mutex_unlock(&x->mu);
	free(pf);
	return NULL;
}

static void
reaper_wake(rl_reward_exec *x)
{
	uint64_t one = 1;

	if (x->reaper_up && write(x->efd, &one, sizeof one) < 0)
		rl_debug("--exec: cannot wake the reaper: %s", strerror(errno));
}

int
rl_reward_exec_create(rl_reward_exec **out, const char *cmd, const rl_reward_exec_opts *o)
{
	rl_reward_exec *x;
	char why[256];
	int rv;

	*out = NULL;
	x = rl_try_calloc(1, sizeof *x, "exec pool");
	if (!x)
		return RL_ENOMEM;
	x->efd = -1;
	pthread_mutex_init(&x->mu, NULL);
	if (o)
		x->o = *o;
	else
		rl_reward_exec_opts_default(&x->o);
	if (x->o.workers < 1)
		x->o.workers = 1;
	if (!(x->o.timeout_s > 0))
		x->o.timeout_s = 30;
	if (x->o.max_reply < 64)
		x->o.max_reply = 64;
	if ((rv = rl_reward_exec_split(&x->argv, cmd)) != 0)
		goto fail;
	x->w = rl_try_calloc((size_t)x->o.workers, sizeof *x->w, "exec workers");
	if (!x->w) {
		rv = RL_ENOMEM;
		goto fail;
	}
	for (int i = 0; i < x->o.workers; i++) {
		x->w[i].in_fd = x->w[i].out_fd = x->w[i].pidfd = -1;
		x->w[i].rec = -1;
	}
	/* descendants that leave a worker's process group (setsid) are
	 * orphaned to us, not to init, so they can be reaped and killed */
	if (x->o.subreaper && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
		rl_debug("--exec: not a child subreaper: %s", strerror(errno));
	for (int i = 0; i < x->o.workers; i++) {
		int e = worker_spawn(x, &x->w[i], why, sizeof why);
		if (e != 0) {
			rl_error("--exec: %s", why);
			if (e == ENOENT || e == EACCES)
				rl_hint("the command is run without a shell; give a path or a program on PATH, or write sh -c '...'");
			rv = (e == ENOENT || e == EACCES) ? RL_ENOENT : RL_EIO;
			goto fail;
		}
	}
	if ((x->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
	    pthread_create(&x->reaper, NULL, reaper_main, x) != 0)
		rl_debug("--exec: no reaper thread: exited idle workers are reaped at the next run");
	else
		x->reaper_up = 1;
	*out = x;
	return 0;
fail:
	rl_reward_exec_destroy(x);
	return rv;
}

void
rl_reward_exec_destroy(rl_reward_exec *x)
{
	double until;

	if (!x)
		return;
	if (x->reaper_up) {
		pthread_mutex_lock(&x->mu);
		x->stop = 1;
		pthread_mutex_unlock(&x->mu);
		reaper_wake(x);
		pthread_join(x->reaper, NULL);
	}
	close_fd(&x->efd);
	if (x->w) {
		for (int i = 0; i < x->o.workers; i++)
			close_fd(&x->w[i].in_fd);
		until = rl_now() + 2.0;
		for (int i = 0; i < x->o.workers; i++) {
			worker *w = &x->w[i];
			if (w->pid <= 0)
				continue;
			while (waitpid(w->pid, NULL, WNOHANG) == 0 && rl_now() < until) {
				struct timespec ts = { 0, 5000000 };
				nanosleep(&ts, NULL);
			}
			/* reaped or not, make sure nothing of it is left */
			kill(-w->pid, SIGKILL);
			if (waitpid(w->pid, NULL, WNOHANG) == 0) {
				kill(w->pid, SIGKILL);
				waitpid(w->pid, NULL, 0);
			}
			reap_group(w->pid);
			w->pid = 0;
		}
		if (x->o.subreaper)
			reap_orphans(x, 1);
		for (int i = 0; i < x->o.workers; i++) {
			close_fd(&x->w[i].out_fd);
			close_fd(&x->w[i].pidfd);
			free(x->w[i].rbuf);
		}
	}
	pthread_mutex_destroy(&x->mu);
	free(x->w);
	free(x->argv);
	free(x);
}

/* ---- one run ------------------------------------------------------------------ */

static void
fail_rec(rl_reward_exec_result *r, int status, const char *why)
{
	size_t n = strlen(why);

	r->reward = NAN;
	r->status = status;
	if (n >= sizeof r->reason)
		n = sizeof r->reason - 1;
	memcpy(r->reason, why, n);
	r->reason[n] = 0;
}

/* Parses a reply line: a number, or {"reward": number}. */
static void
parse_reply(rl_reward_exec_result *r, const char *line, size_t n)
{
	cJSON *j = rl_json_parse_all(line, n); /* "1 0", "0.5abc": junk, not 1 or 0.5 */
	const cJSON *v = j;
	char shown[64];
	size_t sn = n < 40 ? n : 40;

	if (j && cJSON_IsObject(j))
		v = cJSON_GetObjectItemCaseSensitive(j, "reward");
	if (v && cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
		r->reward = v->valuedouble;
		r->status = RL_EXEC_OK;
		r->reason[0] = 0;
		cJSON_Delete(j);
		return;
	}
	/* show the start of the junk, control characters replaced */
	for (size_t i = 0; i < sn; i++)
		shown[i] = (line[i] >= 32 && line[i] < 127 && line[i] != '\'') ? line[i] : '?';
	shown[sn] = 0;
	r->reward = NAN;
	r->status = RL_EXEC_JUNK;
	snprintf(r->reason, sizeof r->reason, "reply is not a number or {\"reward\": number}: '%s%s'", shown,
		 n > sn ? "..." : "");
	cJSON_Delete(j);
}

/* write() with SIGPIPE blocked: a dead reader gives EPIPE, never a signal. */
static ssize_t
write_nosigpipe(int fd, const void *p, size_t n)
{
	sigset_t set, old;
	ssize_t w;
	int e;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, &old);
	w = write(fd, p, n);
	e = errno;
	if (w < 0 && e == EPIPE) {
		struct timespec zero = { 0, 0 };
		sigtimedwait(&set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = e;
	return w;
}

/* Hands records lines[*next..n) to idle workers, (re)starting them as needed; a worker
 * that cannot be started fails its record (counted in *done). */
static void
hand_out(rl_reward_exec *x, rl_reward_exec_result *res, const char *const *lines, const size_t *lens,
	 size_t n, size_t *next, size_t *done, double now)
{
	char why[256];

	for (int i = 0; i < x->o.workers && *next < n; i++) {
		worker *w = &x->w[i];
		if (w->rec >= 0)
			continue;
		if (w->pid > 0 && w->rlen < w->rcap) {
			/* pick up anything it wrote since its last reply */
			ssize_t k = read(w->out_fd, w->rbuf + w->rlen, w->rcap - w->rlen);
			if (k > 0)
				w->rlen += (size_t)k;
		}
		if (w->pid > 0 && w->rlen > 0) {
			/* it wrote more than one line for its last record: start
			 * afresh so replies cannot slip out of step */
			worker_kill(w);
		}
		if (w->pid <= 0 && worker_spawn(x, w, why, sizeof why) != 0) {
			fail_rec(&res[*next], RL_EXEC_SPAWN, why);
			(*next)++;
			(*done)++;
			i--; /* try this worker again for the next record */
			continue;
		}
		w->rec = (long)*next;
		w->wbuf = lines[*next];
		w->wlen = lens[*next];
		w->woff = 0;
		w->deadline = now + x->o.timeout_s;
		(*next)++;
	}
}

/* The poll set of the busy workers (stdin while their record is unwritten, stdout),
 * pf[i] belonging to worker owner[i]; *timeout_ms until the nearest deadline.
 * Returns the number of entries. */
static int
poll_set(rl_reward_exec *x, struct pollfd *pf, int *owner, double now, int *timeout_ms)
{
	int np = 0;

	*timeout_ms = -1;
	for (int i = 0; i < x->o.workers; i++) {
		worker *w = &x->w[i];
		double ms;
		if (w->rec < 0)
			continue;
		if (w->woff < w->wlen && w->in_fd >= 0) {
			pf[np].fd = w->in_fd;
			pf[np].events = POLLOUT;
			owner[np++] = i;
		}
		pf[np].fd = w->out_fd;
		pf[np].events = POLLIN;
		owner[np++] = i;
		if (w->pidfd >= 0) {
			pf[np].fd = w->pidfd;
			pf[np].events = POLLIN;
			owner[np++] = i;
		}
		ms = (w->deadline - now) * 1000.0;
		if (ms < 0)
			ms = 0;
		if (w->pidfd < 0 && ms > 50) /* no pidfd: look for its exit often */
			ms = 50;
		if (*timeout_ms < 0 || ms + 1 < *timeout_ms)
			*timeout_ms = (int)ms + 1;
	}
	return np;
}

/* Worker w's stdout is readable: reads, and settles its record (counted in *done) on a
 * reply line, the end of its output, or a reply too long or too early.  0, or RL_ENOMEM. */
static int
on_readable(rl_reward_exec *x, worker *w, rl_reward_exec_result *res, size_t *done)
{
	char why[256];

	if (w->rcap - w->rlen < 4096) {
		size_t nc = w->rcap ? w->rcap * 2 : 8192;
		char *nb = realloc(w->rbuf, nc);
		if (!nb) {
			rl_error("--exec: out of memory for a reply of %zu bytes", nc);
			return RL_ENOMEM;
		}
		w->rbuf = nb;
		w->rcap = nc;
	}
	ssize_t k = read(w->out_fd, w->rbuf + w->rlen, w->rcap - w->rlen);
	if (k < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		k = 0; /* treat a read error like the end */
	}
	long rec = w->rec;
	if (k == 0) {
		worker_reap(w, why, sizeof why);
		fail_rec(&res[rec], RL_EXEC_CRASH, why);
		(*done)++;
		return 0;
	}
	w->rlen += (size_t)k;
	char *nl = memchr(w->rbuf, '\n', w->rlen);
	if (nl && w->woff < w->wlen) {
		/* a reply before the record was written whole (it stopped
		 * reading: EPIPE, or it never reads): not a reply to it */
		snprintf(why, sizeof why, "replied after reading %zu of the record's %zu bytes",
			 w->woff, w->wlen);
		worker_kill(w);
		fail_rec(&res[rec], RL_EXEC_JUNK, why);
		(*done)++;
	} else if (nl) {
		size_t ln = (size_t)(nl - w->rbuf);
		parse_reply(&res[rec], w->rbuf, ln);
		memmove(w->rbuf, nl + 1, w->rlen - ln - 1);
		w->rlen -= ln + 1;
		w->rec = -1;
		(*done)++;
		if (res[rec].status != RL_EXEC_OK)
			worker_kill(w);
	} else if (w->rlen > x->o.max_reply) {
		snprintf(why, sizeof why, "reply longer than %zu bytes", x->o.max_reply);
		worker_kill(w);
		fail_rec(&res[rec], RL_EXEC_JUNK, why);
		(*done)++;
	}
	return 0;
}

/* Busy workers that exited: what they wrote before is read (a reply
 * settles the record as usual); with no reply the record fails as a crash
 * at once, even if a child left behind still holds the worker's stdout (no
 * end of file comes then).  0, or RL_ENOMEM. */
static int
check_exited(rl_reward_exec *x, rl_reward_exec_result *res, size_t *done)
{
	char why[256];

	for (int i = 0; i < x->o.workers; i++) {
		worker *w = &x->w[i];
		siginfo_t si;
		int rv;
		if (w->rec < 0 || w->pid <= 0)
			continue;
		memset(&si, 0, sizeof si);
		if (waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != w->pid)
			continue;
		for (;;) {
			size_t before = w->rlen;
			if ((rv = on_readable(x, w, res, done)) != 0)
				return rv;
			if (w->rec < 0 || w->pid <= 0 || w->out_fd < 0 || w->rlen == before)
				break;
		}
		if (w->rec >= 0 && w->pid > 0) {
			long rec = w->rec;
			worker_reap(w, why, sizeof why);
			fail_rec(&res[rec], RL_EXEC_CRASH, why);
			(*done)++;
		}
	}
	return 0;
}

/* Kills the workers past their deadline and fails their records (counted in *done). */
static void
check_deadlines(rl_reward_exec *x, rl_reward_exec_result *res, size_t *done)
{
	char why[256];
	double now = rl_now();

	for (int i = 0; i < x->o.workers; i++) {
		worker *w = &x->w[i];
		if (w->rec >= 0 && now >= w->deadline) {
			long rec = w->rec;
			snprintf(why, sizeof why, "no reply within %g s: worker killed", x->o.timeout_s);
			worker_kill(w);
			fail_rec(&res[rec], RL_EXEC_TIMEOUT, why);
			(*done)++;
		}
	}
}

int
rl_reward_exec_run(rl_reward_exec *x, rl_reward_exec_result *res, const char *const *lines, const size_t *lens,
		   size_t n)
{
	int nw = x->o.workers, rv = 0, locked = 0;
	struct pollfd *pf = NULL;
	int *owner = NULL;
	size_t next = 0, done = 0;

	pf = rl_try_calloc((size_t)nw * 3, sizeof *pf, "poll set");
	owner = rl_try_calloc((size_t)nw * 3, sizeof *owner, "poll set");
	if (!pf || !owner) {
		rv = RL_ENOMEM;
		goto out;
	}
	pthread_mutex_lock(&x->mu);
	locked = 1;
	while (done < n) {
		int np, timeout_ms;
		double now = rl_now();

		hand_out(x, res, lines, lens, n, &next, &done, now);
		if (done >= n)
			break;
		if ((np = poll_set(x, pf, owner, now, &timeout_ms)) == 0)
			continue;
		if (poll(pf, (nfds_t)np, timeout_ms) < 0) {
			if (errno == EINTR)
				continue;
			rl_error("--exec: poll: %s", strerror(errno));
			rv = RL_EIO;
			goto out;
		}
		for (int p = 0; p < np; p++) {
			worker *w = &x->w[owner[p]];
			if (!pf[p].revents || w->rec < 0)
				continue;
			if (pf[p].fd == w->in_fd) {
				ssize_t k = write_nosigpipe(w->in_fd, w->wbuf + w->woff, w->wlen - w->woff);
				if (k > 0) {
					w->woff += (size_t)k;
				} else if (k < 0 && errno != EAGAIN && errno != EINTR) {
					/* it stopped reading (EPIPE): its stdout tells how it ended */
					close_fd(&w->in_fd);
				}
				continue;
			}
			if (pf[p].fd == w->out_fd && (rv = on_readable(x, w, res, &done)) != 0)
				goto out;
		}
		if ((rv = check_exited(x, res, &done)) != 0)
			goto out;
		check_deadlines(x, res, &done);
		reap_idle(x, 0);
	}
out:
	if (locked) {
		reap_idle(x, 1);
		pthread_mutex_unlock(&x->mu);
		reaper_wake(x);
	}
	free(pf);
	free(owner);
	return rv;
}

/* test_reward_exec.c — coprocess workers: argv splitting without a shell,
 * replies as numbers and objects, and a worker that crashes, exits, hangs,
 * prints junk, prints nothing or prints two lines: every record gets a
 * labelled result, the pool restarts the worker and goes on, order is kept. */
#include "base/core.h"
#include "reward/reward_exec.h"
#include "t.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void
split(void)
{
	char **v;

	T_EQ_INT(rl_reward_exec_split(&v, "python3 -u 'my score.py' --x \"a \\\"b\\\"\" c\\ d"), 0);
	T_EQ_STR(v[0], "python3");
	T_EQ_STR(v[1], "-u");
	T_EQ_STR(v[2], "my score.py");
	T_EQ_STR(v[3], "--x");
	T_EQ_STR(v[4], "a \"b\"");
	T_EQ_STR(v[5], "c d");
	T_OK(v[6] == NULL);
	free(v);
	T_EQ_INT(rl_reward_exec_split(&v, "sh -c 'echo $HOME; exit 1'"), 0);
	T_EQ_STR(v[2], "echo $HOME; exit 1");
	free(v);
	T_EQ_INT(rl_reward_exec_split(&v, "''"), 0);
	T_EQ_STR(v[0], "");
	free(v);
	rl_log_set_level(RL_LOG_QUIET);
	T_EQ_INT(rl_reward_exec_split(&v, "   "), RL_EINVAL);
	T_EQ_INT(rl_reward_exec_split(&v, "a 'b"), RL_EINVAL);
	rl_log_set_level(RL_LOG_NORMAL);
}

static void
misbehaving(int workers)
{
	static const char *const in[] = {
		"{\"n\":0}\n", "{\"n\":1,\"w\":\"NUMBER\"}\n", "{\"n\":2,\"w\":\"CRASH\"}\n", "{\"n\":3}\n",
		"{\"n\":4,\"w\":\"HANG\"}\n", "{\"n\":5}\n", "{\"n\":6,\"w\":\"JUNK\"}\n", "{\"n\":7}\n",
		"{\"n\":8,\"w\":\"SILENT\"}\n", "{\"n\":9,\"w\":\"EXIT3\"}\n", "{\"n\":10,\"w\":\"TWO\"}\n",
		"{\"n\":11}\n", "{\"n\":12,\"w\":\"NUMBER\"}\n",
	};
	enum { N = RL_ARRAY_LEN(in) };
	size_t lens[N];
	rl_reward_exec_result res[N];
	rl_reward_exec_opts o;
	rl_reward_exec *x;
	double t0;

	for (int i = 0; i < N; i++)
		lens[i] = strlen(in[i]);
	rl_reward_exec_opts_default(&o);
	o.workers = workers;
	o.timeout_s = 1.5; /* room for a slow sh start on a loaded machine */
	T_EQ_INT(rl_reward_exec_create(&x, "sh tests/fixtures/reward/worker.sh", &o), 0);
	if (!x)
		return;
	t0 = rl_now();
	T_EQ_INT(rl_reward_exec_run(x, res, (const char *const *)in, lens, N), 0);
	/* two timeouts of 1.5 s; the hung worker's sleep 30 must not be waited for */
	T_OK(rl_now() - t0 < 15, "took %.1f s", rl_now() - t0);
	T_EQ_INT(res[0].status, RL_EXEC_OK);
	T_CLOSE(res[0].reward, 1, 0, 0);
	T_EQ_INT(res[1].status, RL_EXEC_OK);
	T_CLOSE(res[1].reward, 0.5, 0, 0);
	T_EQ_INT(res[2].status, RL_EXEC_CRASH);
	T_OK(strstr(res[2].reason, "signal 11") != NULL, "reason: %s", res[2].reason);
	T_OK(isnan(res[2].reward));
	T_EQ_INT(res[3].status, RL_EXEC_OK);
	T_EQ_INT(res[4].status, RL_EXEC_TIMEOUT);
	T_OK(strstr(res[4].reason, "no reply within") != NULL, "reason: %s", res[4].reason);
	T_EQ_INT(res[5].status, RL_EXEC_OK);
	T_EQ_INT(res[6].status, RL_EXEC_JUNK);
	T_OK(strstr(res[6].reason, "Traceback") != NULL, "reason: %s", res[6].reason);
	T_EQ_INT(res[7].status, RL_EXEC_OK);
	T_EQ_INT(res[8].status, RL_EXEC_TIMEOUT);
	T_EQ_INT(res[9].status, RL_EXEC_CRASH);
	T_OK(strstr(res[9].reason, "status 3") != NULL, "reason: %s", res[9].reason);
	/* two lines for one record: the first is its reply, the worker is restarted */
	T_EQ_INT(res[10].status, RL_EXEC_OK);
	T_CLOSE(res[10].reward, 0.25, 0, 0);
	T_EQ_INT(res[11].status, RL_EXEC_OK);
	T_CLOSE(res[11].reward, 1, 0, 0);
	T_EQ_INT(res[12].status, RL_EXEC_OK);
	T_CLOSE(res[12].reward, 0.5, 0, 0);
	T_OK(rl_reward_exec_restarts(x) >= (workers == 1 ? 6u : 3u), "%zu restarts", rl_reward_exec_restarts(x));
	rl_reward_exec_destroy(x);
}

static void
bad_command(void)
{
	rl_reward_exec *x = NULL;
	rl_reward_exec_opts o;

	rl_reward_exec_opts_default(&o);
	rl_log_set_level(RL_LOG_QUIET);
	T_EQ_INT(rl_reward_exec_create(&x, "/nonexistent/reward-program --x", &o), RL_ENOENT);
	T_OK(x == NULL);
	rl_log_set_level(RL_LOG_NORMAL);
}

static void
big_records(void)
{
	/* a record bigger than a pipe buffer is written in pieces */
	size_t n = 300000;
	char *big = malloc(n + 1);
	const char *lines[3];
	size_t lens[3];
	rl_reward_exec_result res[3];
	rl_reward_exec *x;
	rl_reward_exec_opts o;

	memset(big, 'a', n - 1);
	big[n - 1] = '\n';
	big[n] = 0;
	for (int i = 0; i < 3; i++) {
		lines[i] = big;
		lens[i] = n;
	}
	rl_reward_exec_opts_default(&o);
	o.workers = 2;
	T_EQ_INT(rl_reward_exec_create(&x, "sh tests/fixtures/reward/worker.sh", &o), 0);
	T_EQ_INT(rl_reward_exec_run(x, res, lines, lens, 3), 0);
	for (int i = 0; i < 3; i++)
		T_EQ_INT(res[i].status, RL_EXEC_OK);
	rl_reward_exec_destroy(x);
	free(big);
}

/* "Z" when pid is a zombie, "" when it is gone, else its state letter */
static void
proc_state(pid_t pid, char *st)
{
	char path[64], buf[512], *p;
	FILE *f;

	st[0] = 0;
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return;
	if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) != NULL && p[1] == ' ') {
		st[0] = p[2];
		st[1] = 0;
	}
	fclose(f);
}

/* the number of our children in state Z (ps, an independent look) */
static int
zombies(void)
{
	char cmd[128], line[64];
	int n = 0;
	FILE *f;

	snprintf(cmd, sizeof cmd, "ps -o stat= --ppid %d", (int)getpid());
	if ((f = popen(cmd, "r")) == NULL)
		return -1;
	while (fgets(line, sizeof line, f))
		n += line[0] == 'Z';
	pclose(f);
	return n;
}

static pid_t
read_pid(const char *path)
{
	FILE *f = fopen(path, "r");
	int pid = 0;

	if (f) {
		if (fscanf(f, "%d", &pid) != 1)
			pid = 0;
		fclose(f);
	}
	return (pid_t)pid;
}

/* a worker's exit is seen at once (not at the timeout) even while a
 * background child holds its stdout; a worker that replies and exits is
 * reaped while the caller is away; a setsid child does not outlive the pool */
static void
lifetimes(void)
{
	const char *line = "{\"n\":0}\n";
	size_t len = strlen(line);
	rl_reward_exec_result res;
	rl_reward_exec_opts o;
	rl_reward_exec *x = NULL;
	char tmp[] = "/tmp/test_reward_exec.XXXXXX", cmd[600], pf[300], st[4];
	double t0;
	pid_t bg;

	if (mkdtemp(tmp) == NULL) {
		T_OK(0, "mkdtemp");
		return;
	}
	snprintf(pf, sizeof pf, "%s/bg.pid", tmp);
	rl_reward_exec_opts_default(&o);
	o.timeout_s = 20;
	/* crash with a background child holding stdout */
	snprintf(cmd, sizeof cmd, "sh -c 'read l; sleep 60 & echo $! > %s; exit 3'", pf);
	T_EQ_INT(rl_reward_exec_create(&x, cmd, &o), 0);
	t0 = rl_now();
	T_EQ_INT(rl_reward_exec_run(x, &res, &line, &len, 1), 0);
	T_OK(rl_now() - t0 < 5, "crash seen after %.1f s (timeout 20 s)", rl_now() - t0);
	T_EQ_INT(res.status, RL_EXEC_CRASH);
	T_OK(strstr(res.reason, "status 3") != NULL, "reason: %s", res.reason);
	bg = read_pid(pf);
	T_OK(bg > 0);
	proc_state(bg, st);
	T_EQ_STR(st, ""); /* killed with the worker's group, and reaped */
	T_EQ_INT(zombies(), 0);
	rl_reward_exec_destroy(x);
	/* replies, then exits: reaped while no run is going on */
	T_EQ_INT(rl_reward_exec_create(&x, "sh -c 'read l; echo 1; exit 0'", &o), 0);
	T_EQ_INT(rl_reward_exec_run(x, &res, &line, &len, 1), 0);
	T_EQ_INT(res.status, RL_EXEC_OK);
	usleep(300000);
	T_EQ_INT(zombies(), 0);
	/* and restarted for the next record */
	T_EQ_INT(rl_reward_exec_run(x, &res, &line, &len, 1), 0);
	T_EQ_INT(res.status, RL_EXEC_OK);
	rl_reward_exec_destroy(x);
	/* a setsid child (its own session and group) dies with the pool */
	unlink(pf);
	snprintf(cmd, sizeof cmd, "sh -c 'setsid sleep 60 & echo $! > %s; while read l; do echo 1; done'", pf);
	T_EQ_INT(rl_reward_exec_create(&x, cmd, &o), 0);
	T_EQ_INT(rl_reward_exec_run(x, &res, &line, &len, 1), 0);
	T_EQ_INT(res.status, RL_EXEC_OK);
	bg = read_pid(pf);
	T_OK(bg > 0);
	proc_state(bg, st);
	T_OK(st[0] != 0 && st[0] != 'Z', "setsid child state '%s' before destroy", st);
	rl_reward_exec_destroy(x);
	proc_state(bg, st);
	T_EQ_STR(st, "");
	T_EQ_INT(zombies(), 0);
	if (bg > 0 && st[0])
		kill(bg, SIGKILL);
	unlink(pf);
	rmdir(tmp);
}

int
main(void)
{
	T_BEGIN("test_reward_exec");
	split();
	misbehaving(1);
	misbehaving(3);
	bad_command();
	big_records();
	lifetimes();
	T_END();
}

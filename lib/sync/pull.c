/*
 * pull.c — rl_wsync_pull: fetch a server's versions into a version
 * directory (wdir.h), once or following each new one, resuming after what
 * the directory holds and following the server back when it rewinds.
 *
 * Leaves out: signals (the caller sets *stop), option parsing and exit
 * codes (cmd/rl-sync).
 */
#include "sync/wsync.h"
#include "sync/wdir.h"
#include "base/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int stopped(const rl_wsync_pull_opts *c) { return c->stop != NULL && *c->stop; }

int
rl_wsync_pull(int *empty, const rl_wsync_pull_opts *c)
{
	rl_wsync_client *cl = NULL;
	rl_wver *have = NULL;
	uint64_t last = 0, lin = 0;
	int rv, keep = c->keep ? c->keep : 2, again = 0, behind = 0;
	int pause_ms = getenv("RL_SYNC_TEST_PULL_PAUSE_MS") ? atoi(getenv("RL_SYNC_TEST_PULL_PAUSE_MS")) : 0;

	*empty = 0;
	if ((rv = rl_wdir_check_target(c->out)) != 0)
		return rv;
	if ((rv = rl_wsync_client_open(&cl, c->url, &c->client)) != 0)
		goto out;
	{
		/* resume after what the output directory already holds */
		char path[4096];
		uint64_t l;
		if (rl_wdir_latest(c->out, &l, path, sizeof path) == RL_OK) {
			last = l;
			rl_wdir_lineage(path, &lin);
			if (c->follow && rl_wver_read_dir(&have, path, 0) != RL_OK)
				have = NULL;
		}
	}
	do {
		uint64_t want = c->version, latest = 0, llin = lin;
		rl_wver *v = NULL;
		rl_wsync_stats st;
		double t0 = rl_now();

		if (want == 0) {
			int wait = c->wait || c->follow;
			rv = RL_ETIMEDOUT;
			while (!stopped(c)) {
				/* RL_OK also when the server rewound (a resumed trainer):
				 * its line is another than the directory's */
				rv = rl_wsync_poll_line(cl, last, lin, wait ? 1000 : 0, &latest, &llin);
				if (rv == RL_ENET && wait) {
					rl_warn("still waiting for '%s'", c->url);
					continue;
				}
				if (rv == RL_ETIMEDOUT && wait && latest > 0 && latest < last && !behind) {
					/* said once: the wait is for a version newer than the directory's */
					rl_warn("'%s' has version %llu, older than version %llu in '%s': waiting for a "
						"version newer than %llu", c->url, (unsigned long long)latest,
						(unsigned long long)last, c->out, (unsigned long long)last);
					behind = 1;
				}
				if (rv != RL_ETIMEDOUT || !wait)
					break;
			}
			if (stopped(c)) {
				rv = RL_OK; /* SIGINT/SIGTERM: a clean stop */
				break;
			}
			if (rv == RL_ETIMEDOUT) {
				if (latest == 0) {
					rl_error("'%s' has no version yet", c->url);
					rl_hint("use --wait to wait for one");
					rv = RL_ENOENT;
					*empty = 1;
				} else if (latest < last) {
					/* not "already holds": the directory's version is another one */
					rl_error("'%s' has version %llu, older than version %llu in '%s'", c->url,
						 (unsigned long long)latest, (unsigned long long)last, c->out);
					rl_hint("a server restarted without --data-dir, or another run's?  pull into "
						"another directory");
					rv = RL_ESTALE;
				} else {
					rl_info("'%s' has version %llu, which '%s' already holds", c->url,
						(unsigned long long)latest, c->out);
					rv = RL_OK;
				}
				goto out;
			}
			if (rv != 0)
				goto out;
		}
		if (pause_ms > 0 && !again) /* test hook: a push lands between poll and fetch */
			usleep((useconds_t)pause_ms * 1000);
		rv = rl_wsync_fetch(cl, &v, want ? want : latest, have);
		if (rv == RL_ENOENT && !want && (c->follow || again < 8)) {
			/* the server moved on while we asked: take the newer one, also
			 * without --follow (up to 8 times, then the error below) */
			again = 1 + (again < 8 ? again : 7);
			continue;
		}
		if (rv == RL_ENOENT && want)
			rl_error("'%s' does not hold version %llu", c->url, (unsigned long long)want);
		else if (rv == RL_ENOENT)
			rl_error("'%s' replaced version %llu by a newer one %d times while it was fetched", c->url,
				 (unsigned long long)latest, again + 1);
		if (rv != 0)
			goto out;
		again = 0;
		rl_wsync_client_stats(cl, &st, 1);
		if (v->lineage != lin && last > 0 && !want) {
			/* the directory follows the server back: the versions above
			 * this one are dropped there too */
			if (v->version <= last)
				rl_info("'%s' went back to version %llu (a resumed trainer): rewinding '%s' from %llu", c->url,
				(unsigned long long)v->version, c->out, (unsigned long long)last);
			rv = rl_wdir_rewind_ver(c->out, v, keep, &lin);
		} else {
			rv = rl_wdir_publish_ver(c->out, v, keep);
		}
		if (rv != 0) {
			rl_wver_destroy(v);
			goto out;
		}
		if (st.shm_versions)
			rl_info("pulled version %llu: %llu bytes over shared memory in %.2f s", (unsigned long long)v->version,
				(unsigned long long)rl_wver_total(v), rl_now() - t0);
		else {
			char bulk[96] = "";
			if (st.bulk_chunks)
				snprintf(bulk, sizeof bulk, ", %llu of %llu chunks over the bulk stream",
					 (unsigned long long)st.bulk_chunks, (unsigned long long)st.chunks);
			rl_info("pulled version %llu: %llu bytes (%llu on the wire%s%s) in %.2f s",
				(unsigned long long)v->version, (unsigned long long)rl_wver_total(v),
				(unsigned long long)st.bytes_recv, bulk, st.retries ? ", with re-sent chunks" : "",
				rl_now() - t0);
		}
		last = v->version;
		lin = v->lineage;
		rl_wver_destroy(have);
		have = v;
	} while ((c->follow || again) && !stopped(c));
out:
	rl_wver_destroy(have);
	rl_wsync_client_close(cl);
	return rv;
}


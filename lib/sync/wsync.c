/*
 * wsync.c — rl_wsync, one handle over the transports a URL names: an
 * rl-sync server (client.c) or a version directory (wdir.c), and the calls
 * rl-train (publish, rewind) and rl-rollout (poll, fetch) make through it.
 *
 * Leaves out: the transports themselves; GPU transports plug in through
 * the vtable in wsync.h.
 */
#include "sync/wsync.h"
#include "sync/wdir.h"
#include "sync/wsync_int.h"
#include "base/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- transports behind one handle ------------------------------------------------------ */
struct rl_wsync {
	rl_wsync_transport t;
	void *self;
};

/* nng: an rl-sync server's client; keeps a copy of the last published
 * version as the next delta base (the caller's buffers change under it) */
typedef struct tnng {
	rl_wsync_client *c;
	rl_wver *last;
} tnng;

static int
copy_ver(rl_wver **out, const rl_wver *v)
{
	rl_wver *n;
	int rv;

	if ((rv = rl_wver_create(&n, v->version)) != 0)
		return rv;
	for (int i = 0; i < v->nblobs; i++)
		if ((rv = rl_wver_add_blob(n, v->blobs[i].name, v->blobs[i].data, v->blobs[i].size, v->blobs[i].elem, 1)) != 0) {
			rl_wver_destroy(n);
			return rv;
		}
	if ((rv = rl_wver_hash(n)) != 0) {
		rl_wver_destroy(n);
		return rv;
	}
	*out = n;
	return RL_OK;
}

/* the delta base is managed by rl_wsync_publish */
static int tnng_publish(void *self, rl_wver *v) { tnng *t = self; return rl_wsync_push(t->c, v, t->last); }
static int tnng_poll(void *self, uint64_t have, int ms, uint64_t *l) { return rl_wsync_poll(((tnng *)self)->c, have, ms, l); }
static int tnng_fetch(void *self, rl_wver **o, uint64_t ver, const rl_wver *b) { return rl_wsync_fetch(((tnng *)self)->c, o, ver, b); }
static void
tnng_close(void *self)
{
	tnng *t = self;

	if (t == NULL)
		return;
	rl_wsync_client_close(t->c);
	rl_wver_destroy(t->last);
	free(t);
}
static int tnng_rewind(void *self, rl_wver *v) { return rl_wsync_push_rewind(((tnng *)self)->c, v); }
static int
tnng_poll_line(void *self, uint64_t have, uint64_t lin, int ms, uint64_t *l, uint64_t *ll)
{
	return rl_wsync_poll_line(((tnng *)self)->c, have, lin, ms, l, ll);
}
static const rl_wsync_transport tnng_vt = { "nng", tnng_publish, tnng_poll, tnng_fetch, tnng_close, tnng_rewind,
					    tnng_poll_line };

/* file: the wdir layout */
typedef struct tfile {
	char *dir;
	int keep;
} tfile;

static int tfile_publish(void *self, rl_wver *v) { tfile *t = self; int rv = rl_wver_hash(v); return rv ? rv : rl_wdir_publish_ver(t->dir, v, t->keep); }
/* Like the server's WAIT: a version newer than the caller's `have`, however
 * often it was seen before.  A watcher kept across calls answered each new
 * version once only, so a poll that merely waited (rl-rollout's wait for a
 * version, whose answer it does not use) swallowed it and the next poll
 * never saw it. */
static int
tfile_poll(void *self, uint64_t have, int ms, uint64_t *l)
{
	tfile *t = self;
	rl_wdir_watch *w;
	char path[4096];
	int rv;

	if ((rv = rl_wdir_watch_open(&w, t->dir, have, 0)) != 0)
		return rv;
	rv = rl_wdir_watch_next(w, l, path, sizeof path, ms);
	rl_wdir_watch_close(w);
	return rv;
}
static int
tfile_fetch(void *self, rl_wver **o, uint64_t ver, const rl_wver *b)
{
	tfile *t = self;
	char path[4096];
	uint64_t l;
	int rv;

	if (ver == 0) {
		if ((rv = rl_wdir_latest(t->dir, &l, path, sizeof path)) != 0)
			return rv;
	} else if ((rv = rl_wdir_path(path, sizeof path, t->dir, ver)) != 0) {
		return rv;
	}
	return rl_wver_read_dir(o, path, 0);
}
static void
tfile_close(void *self)
{
	tfile *t = self;

	if (t == NULL)
		return;
	free(t->dir);
	free(t);
}
static int
tfile_rewind(void *self, rl_wver *v)
{
	tfile *t = self;
	uint64_t lin;
	int rv;

	if ((rv = rl_wver_hash(v)) != 0 || (rv = rl_wdir_rewind_ver(t->dir, v, t->keep, &lin)) != 0)
		return rv;
	v->lineage = lin;
	return RL_OK;
}
/* tfile_poll, and RL_OK at once when the latest directory is on another
 * line than the caller's (rl_wdir_rewind_ver made it) */
static int
tfile_poll_line(void *self, uint64_t have, uint64_t lin, int ms, uint64_t *l, uint64_t *ll)
{
	tfile *t = self;
	char path[4096];
	int rv;

	*ll = lin;
	if (rl_wdir_latest(t->dir, l, path, sizeof path) == RL_OK && rl_wdir_lineage(path, ll) == RL_OK && *ll != lin)
		return RL_OK;
	if ((rv = tfile_poll(self, have, ms, l)) == RL_OK && rl_wdir_path(path, sizeof path, t->dir, *l) == RL_OK)
		rl_wdir_lineage(path, ll);
	return rv;
}
static const rl_wsync_transport tfile_vt = { "file", tfile_publish, tfile_poll, tfile_fetch, tfile_close,
					     tfile_rewind, tfile_poll_line };

int
rl_wsync_open_transport(rl_wsync **out, const rl_wsync_transport *t, void *self)
{
	rl_wsync *s;

	if ((s = rl_try_calloc(1, sizeof *s, "sync handle")) == NULL)
		return RL_ENOMEM;
	s->t = *t;
	s->self = self;
	*out = s;
	return RL_OK;
}

int
rl_wsync_transport_parse(const char *name, int *out)
{
	static const char *const names[] = { "auto", "shm", "stream", "nng", "file" };

	for (int i = 0; i < 5; i++)
		if (strcmp(name, names[i]) == 0) {
			*out = i;
			return RL_OK;
		}
	return RL_EINVAL;
}

int
rl_wsync_open(rl_wsync **out, const char *url, int keep)
{
	return rl_wsync_open_with(out, url, keep, RL_WSYNC_T_AUTO);
}

int
rl_wsync_open_with(rl_wsync **out, const char *url, int keep, int transport)
{
	int rv;

	*out = NULL;
	if (strncmp(url, "tcp://", 6) == 0 || strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0 ||
	    strncmp(url, "tls+tcp://", 10) == 0) {
		rl_wsync_client_opts o = { .transport = transport };
		tnng *t;
		if (transport == RL_WSYNC_T_FILE) {
			rl_error("'%s': the file transport needs a directory, not a server URL", url);
			return RL_EINVAL;
		}
		if ((t = rl_try_calloc(1, sizeof *t, "sync handle")) == NULL)
			return RL_ENOMEM;
		if ((rv = rl_wsync_client_open(&t->c, url, &o)) != 0 ||
		    (rv = rl_wsync_open_transport(out, &tnng_vt, t)) != 0) {
			tnng_close(t);
			return rv;
		}
		return RL_OK;
	}
	if (strncmp(url, "nccl://", 7) == 0 || strncmp(url, "cuda-ipc://", 11) == 0) {
		rl_error("'%s': the NCCL and CUDA IPC weight transports are not in this build", url);
		rl_hint("use tcp://HOST:PORT (rl-sync serve) or a shared directory");
		return RL_ENOTSUP;
	}
	if (strstr(url, "://") != NULL && strncmp(url, "file://", 7) != 0) {
		rl_error("'%s': unknown weight transport", url);
		rl_hint("use tcp://HOST:PORT, ipc://PATH, file://DIR or a directory");
		return RL_EINVAL;
	}
	if (transport != RL_WSYNC_T_AUTO && transport != RL_WSYNC_T_FILE) {
		rl_error("'%s': a directory is read with the file transport", url);
		rl_hint("shm, stream and nng need an rl-sync server URL (tcp://, ipc://)");
		return RL_EINVAL;
	}
	{
		tfile *t = rl_try_calloc(1, sizeof *t, "sync handle");
		if (t == NULL)
			return RL_ENOMEM;
		t->dir = rl_xstrdup(strncmp(url, "file://", 7) == 0 ? url + 7 : url);
		t->keep = keep > 0 ? keep : 2;
		if ((rv = rl_wsync_open_transport(out, &tfile_vt, t)) != 0) {
			tfile_close(t);
			return rv;
		}
	}
	return RL_OK;
}

void
rl_wsync_close(rl_wsync *s)
{
	if (s == NULL)
		return;
	if (s->t.close)
		s->t.close(s->self);
	free(s);
}

const char *rl_wsync_transport_name(const rl_wsync *s) { return s->t.name; }

int
rl_wsync_publish(rl_wsync *s, rl_wver *v, int delta)
{
	int rv;

	if ((rv = s->t.publish(s->self, v)) != 0)
		return rv;
	/* nng: remember this version as the next delta base only when asked */
	if (s->t.publish == tnng_publish) {
		tnng *t = s->self;
		/* a push over shared memory sends no delta: keep no copy for one */
		if (!delta || rli_wsync_client_last_push_shm(t->c)) {
			rl_wver_destroy(t->last);
			t->last = NULL;
		} else if (t->last == NULL || t->last->version != v->version) {
			rl_wver_destroy(t->last);
			t->last = NULL;
			copy_ver(&t->last, v);
		}
	}
	return RL_OK;
}

int
rl_wsync_publish_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version, int delta)
{
	rl_wver *v;
	int rv;

	if ((rv = rl_wver_read_dir(&v, ckpt_dir, 0)) != 0)
		return rv;
	if (version != 0 && v->version != version) {
		v->version = version;
		rl_wver_hash(v);
	}
	if (v->version == 0) {
		rl_error("'%s': no version number given and none recorded in the directory", ckpt_dir);
		rl_wver_destroy(v);
		return RL_EINVAL;
	}
	rv = rl_wsync_publish(s, v, delta);
	rl_wver_destroy(v);
	return rv;
}

int rl_wsync_poll_version(rl_wsync *s, uint64_t have, int ms, uint64_t *l) { return s->t.poll(s->self, have, ms, l); }

int
rl_wsync_poll_version_line(rl_wsync *s, uint64_t have, uint64_t lineage, int ms, uint64_t *latest,
			   uint64_t *latest_lineage)
{
	*latest_lineage = lineage;
	if (s->t.poll_line == NULL) /* a transport without rewinds */
		return s->t.poll(s->self, have, ms, latest);
	return s->t.poll_line(s->self, have, lineage, ms, latest, latest_lineage);
}

int
rl_wsync_rewind(rl_wsync *s, rl_wver *v)
{
	int rv;

	if (s->t.rewind == NULL) {
		rl_error("the %s weight transport cannot rewind to version %llu", s->t.name, (unsigned long long)v->version);
		return RL_ENOTSUP;
	}
	if ((rv = s->t.rewind(s->self, v)) != 0)
		return rv;
	if (s->t.publish == tnng_publish) {
		/* the next version goes as a delta against this one, as after a publish */
		tnng *t = s->self;
		rl_wver_destroy(t->last);
		t->last = NULL;
		if (!rli_wsync_client_last_push_shm(t->c))
			copy_ver(&t->last, v);
	}
	return RL_OK;
}

int
rl_wsync_rewind_dir(rl_wsync *s, const char *ckpt_dir, uint64_t version)
{
	rl_wver *v;
	int rv;

	if ((rv = rl_wver_read_dir(&v, ckpt_dir, 0)) != 0)
		return rv;
	if (v->version != version) {
		v->version = version;
		rl_wver_hash(v);
	}
	rv = rl_wsync_rewind(s, v);
	rl_wver_destroy(v);
	return rv;
}
int rl_wsync_fetch_version(rl_wsync *s, rl_wver **o, uint64_t ver, const rl_wver *b) { return s->t.fetch(s->self, o, ver, b); }

int
rl_wsync_fetch_newest(rl_wsync *s, rl_wver **out, uint64_t version, const rl_wver *base)
{
	int rv = rl_wsync_fetch_version(s, out, version, base);
	for (int i = 0; rv == RL_ENOENT && version != 0 && i < 4; i++) {
		rl_verbose("version %llu was replaced while fetching it; fetching the latest",
		    (unsigned long long)version);
		rv = rl_wsync_fetch_version(s, out, 0, base);
	}
	if (rv == RL_ENOENT)
		rl_error("weights: version %llu is no longer held and no newer one could be fetched",
		    (unsigned long long)version);
	return rv;
}

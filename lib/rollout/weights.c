/*
 * weights.c — new weight versions for a running rl-rollout: from
 * --weights-from DIR (rl-train's checkpoint root, through DIR/latest), from
 * rl-sync (fetched into memory, deltas against the last one), or from a
 * weights group (broadcast by the trainer); loaded into the running model in
 * place.  The rewind policy: a source whose newest version goes back (a
 * resumed trainer) is followed back; step directories a killed run left
 * behind are never loaded.  When a version may be loaded (engine drained, or
 * --partial) is decided here too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "rollout/rollout_int.h"

/* The newest version in DIR: DIR/latest -> step-NNNNNNNN (rl-train's layout).
 * Returns RL_OK with *ver and path, RL_ENOENT when there is none yet. */
int
rli_latest_version(const char *dir, int *ver, char *path, size_t len)
{
	char lnk[4200], target[512];
	ssize_t n;
	int v;
	char c;

	snprintf(lnk, sizeof lnk, "%s/latest", dir);
	if ((n = readlink(lnk, target, sizeof target - 1)) < 0)
		return RL_ENOENT;
	target[n] = 0;
	const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
	if (sscanf(base, "step-%d%c", &v, &c) != 1 && sscanf(base, "v%d%c", &v, &c) != 1)
		return RL_ENOENT;
	*ver = v;
	if (target[0] == '/')
		snprintf(path, len, "%s", target);
	else
		snprintf(path, len, "%s/%s", dir, target);
	return RL_OK;
}

/* Replaces the model's weights in place with the tensors of set (the same
 * architecture: every tensor by name, with the shape the running model has);
 * where names the source in messages.  The tensors are converted straight
 * from the file's bytes (an mmap'd checkpoint or a fetched version in
 * memory): no second model is built. */
static int
load_set(gen *g, const rl_st_set *set, const char *where, int ver)
{
	rl_model *m = g->m;
	float *buf = NULL;
	size_t maxn = 0;
	int rv = RL_OK;

	for (int i = 0; i < m->tt.n; i++)
		maxn = RL_MAX(maxn, m->tt.t[i].n);
	if (!(buf = rl_try_malloc(maxn * sizeof(float), "weights")))
		return RL_ENOMEM;
	for (int i = 0; i < m->tt.n; i++) {
		const rl_tensor *t = &m->tt.t[i];
		const rl_st_tensor *st = rl_st_set_find(set, t->name, NULL);
		int64_t shp[2];
		int nd = rl_tensor_file_shape(t, shp);
		if (!st && strncmp(t->name, "transformer.", 12) == 0)
			st = rl_st_set_find(set, t->name + 12, NULL);
		if (!st) {
			rl_error("'%s': no tensor '%s': not the running model's architecture", where, t->name);
			rv = RL_ESHAPE;
			goto out;
		}
		if (st->ndim != nd || st->shape[0] != shp[0] || (nd == 2 && st->shape[1] != shp[1])) {
			rl_error("'%s': tensor '%s' has %zu elements in %d dimensions, the running model's %zu in %d",
			    where, t->name, st->nelem, st->ndim, t->n, nd);
			rv = RL_ESHAPE;
			goto out;
		}
		if ((rv = rl_st_to_f32(buf, st, 0, st->nelem)) != 0) {
			rl_error("'%s': tensor '%s' has dtype %s, not a float type", where, t->name,
			    rl_dtype_name(st->dtype));
			goto out;
		}
		if ((rv = rl_check_finite(buf, st->nelem, where, t->name)) != 0)
			goto out;
		if ((rv = rl_model_set(m, i, buf)) != 0)
			goto out;
	}
	g->version = ver;
	g->nloads++;
	rl_engine_set_version(g->e, ver);
	rl_verbose("weights version %d loaded from '%s'", ver, where);
out:
	free(buf);
	return rv;
}

/* Replaces the model's weights in place with those in dir (same shapes).  A LoRA
 * run's checkpoint (adapter_config.json, no model) is an adapter on -m: the base
 * weights are read again from -m, then the adapter folded in. */
int
rli_load_weights(gen *g, const char *dir, int ver)
{
	rl_st_set *set = NULL;
	char cfg[4200];
	int rv, adapter;

	snprintf(cfg, sizeof cfg, "%s/%s", dir, RL_LORA_CONFIG_FILE);
	adapter = access(cfg, F_OK) == 0;
	if (adapter && strcmp(g->o.model_dir, dir) == 0) {
		rl_error("'%s' is a LoRA adapter: give its base model with -m BASE", dir);
		return RL_EINVAL;
	}
	if ((rv = rl_st_set_open(&set, adapter ? g->o.model_dir : dir)) != 0)
		return rv;
	rv = load_set(g, set, adapter ? g->o.model_dir : dir, ver);
	rl_st_set_close(set);
	if (rv == 0 && adapter && (rv = rl_model_apply_adapter(g->m, dir)) == 0)
		rl_verbose("weights version %d: the adapter in '%s' on '%s'", ver, dir, g->o.model_dir);
	return rv;
}

/* The same from a version fetched from rl-sync, in memory: its
 * model.safetensors blob.  RL_ENOENT when it has none (a sharded
 * checkpoint: the caller goes through a directory). */
static int
load_weights_ver(gen *g, const rl_wver *v, const char *where)
{
	const rl_wblob *b = rl_wver_find(v, "model.safetensors");
	rl_st_file *f = NULL;
	rl_st_set set;
	int rv;

	if (!b)
		return RL_ENOENT;
	if ((rv = rl_st_open_mem(&f, where, b->data, (size_t)b->size)) != 0)
		return rv;
	set.files = &f;
	set.nfiles = 1;
	rv = load_set(g, &set, where, (int)v->version);
	rl_st_close(f);
	return rv;
}

/* The newest version the weights group has received (perhaps newer than
 * the one seen by the last poll) into the model, in place. */
int
rli_group_take(gen *g)
{
	int v, rv;

	if ((rv = rl_wgroup_take(g->wg, &v)) != 0)
		return rv;
	g->version = v;
	g->nloads++;
	rl_engine_set_version(g->e, v);
	rl_verbose("weights version %d taken from the weights group %s", v, g->o.wgo.addr);
	return RL_OK;
}

/* 1 when path (a step directory of --weights-from) is a killed run's
 * leftover, not to be loaded (said once per directory). */
int
rli_leftover(gen *g, const char *path)
{
	if (!rl_ckpt_leftovers_has(&g->left, path))
		return 0;
	if (strcmp(g->left_warned, path) != 0) {
		rl_info("not loading '%s': it was there when rl-rollout started, newer than the newest full "
		    "checkpoint (step %d), so it is a killed run's, which rl-train --resume removes", path,
		    g->left_after);
		snprintf(g->left_warned, sizeof g->left_warned, "%s", path);
	}
	return 1;
}

/* Looks for a newer version; loads it now if allowed (no sequence running,
 * or --partial), else remembers it and holds admissions until the engine
 * drains.  rl-sync is asked at most every 20 ms unless force (the caller
 * knows a newer version exists: the broker said so, or it waits for one);
 * a directory is looked at every time (one readlink). */
static int
poll_weights_(gen *g, int force)
{
	int v, rv;
	char path[4096];

	if (g->ws && (force || rl_now() - g->last_poll >= RL_MAX(0.02, g->poll_backoff))) {
		uint64_t latest = 0, lin = g->wbase ? g->wbase->lineage : 0, llin;
		rl_wver *nv = NULL;
		int prv = rl_wsync_poll_version_line(g->ws, g->version > 0 ? (uint64_t)g->version : 0, lin, 0, &latest,
		    &llin);
		/* the trainer resumed from an older checkpoint and rl-sync dropped the
		 * versions after it (a new line): the one held here is gone, take the
		 * latest whatever its number (a worker that fetched nothing yet
		 * just takes the latest, as ever) */
		int moved = prv == RL_OK && g->wbase && llin != lin;
		g->last_poll = rl_now();
		/* a server that does not answer costs each look its request timeout:
		 * asked every 20 ms, generation would crawl; back off (1 s doubling to
		 * 30 s) and go on with the weights there are */
		if (prv != RL_OK && prv != RL_ETIMEDOUT) {
			if (g->poll_backoff == 0)
				rl_warn("'%s' does not answer: generating with weights version %d, asking again "
				    "less often", g->o.sync_url, g->version);
			g->poll_backoff = g->poll_backoff > 0 ? RL_MIN(2 * g->poll_backoff, 30.0) : 1.0;
		} else if (g->poll_backoff > 0) {
			rl_info("'%s' answers again", g->o.sync_url);
			g->poll_backoff = 0;
		}
		if (prv == RL_OK && (moved || ((int)latest > g->version && (int)latest > g->pending_version))) {
			/* fetch (a delta against the last one when the server can); loaded from memory.
			 * A version replaced on the server since the poll: the newer one */
			if ((rv = rl_wsync_fetch_newest(g->ws, &nv, latest, g->wbase)) != 0)
				return rv;
			latest = nv->version;
			rl_wver_destroy(g->wbase);
			g->wbase = nv;
			g->pending_version = (int)latest;
			if (moved) { /* kept until it is loaded, also if a newer one comes meanwhile */
				g->pending_rewind = 1;
				rl_info("'%s' went back to version %d (a resumed trainer): replacing weights version %d",
				    g->o.sync_url, g->pending_version, g->version);
			}
			snprintf(g->pending_path, sizeof g->pending_path, "%s/v%llu", g->o.sync_url,
			    (unsigned long long)latest);
		}
	} else if (g->wg) {
		/* the trainer broadcasts: a version already in memory here, or none */
		if ((rv = rl_wgroup_poll(g->wg, &v)) != 0)
			return rv;
		if (v > g->version && v > g->pending_version) {
			g->pending_version = v;
			snprintf(g->pending_path, sizeof g->pending_path, "weights group %s", g->o.wgo.addr);
		}
	} else if (g->o.weights_from && rli_latest_version(g->o.weights_from, &v, path, sizeof path) == RL_OK &&
	    !rli_leftover(g, path)) {
		if (v > g->version && v > g->pending_version) {
			g->pending_version = v;
			snprintf(g->pending_path, sizeof g->pending_path, "%s", path);
		} else if (v < g->version && !(g->pending_rewind && g->pending_version == v)) {
			/* latest went back: rl-train --resume removed the steps after its
			 * checkpoint, the one loaded here among them; the new run writes
			 * those numbers again, so waiting for a higher one would keep a
			 * dropped policy for as many steps */
			rl_info("'%s' went back to version %d (a resumed trainer): replacing weights version %d",
			    g->o.weights_from, v, g->version);
			g->pending_version = v;
			g->pending_rewind = 1;
			snprintf(g->pending_path, sizeof g->pending_path, "%s", path);
		}
	}
	if (g->want_version > RL_MAX(g->version, g->pending_version) && !g->pending_rewind) {
		/* the broker's version is not on the source yet: what runs goes on,
		 * nothing new starts (at most --weights-timeout) */
		if (g->o.weights_timeout > 0 && rl_now() - g->want_since > g->o.weights_timeout) {
			rl_error("no weights version %d (the broker's) in '%s' after %.0f s (have %d)", g->want_version,
			    g->o.weights_from ? g->o.weights_from : g->o.sync_url ? g->o.sync_url : g->o.wgo.addr,
			    g->o.weights_timeout, g->version);
			rl_hint("is the trainer publishing where this worker reads (--weights-from, --sync)?");
			return RL_ETIMEDOUT;
		}
		rl_engine_hold(g->e, 1);
		return RL_OK;
	}
	if (g->pending_version > g->version || g->pending_rewind) {
		if (g->o.partial || rl_engine_active(g->e) == 0) {
			if (g->wg) {
				rv = rli_group_take(g);
			} else if (!g->ws) {
				rv = rli_load_weights(g, g->pending_path, g->pending_version);
			} else if ((rv = load_weights_ver(g, g->wbase, g->pending_path)) == RL_ENOENT) {
				/* no single model.safetensors (shards, or a LoRA run's adapter):
				 * through a directory,
				 * made only for that and removed at once */
				snprintf(path, sizeof path, "%s/v%d", g->sync_dir, g->pending_version);
				if ((rv = rl_io_mkdir_p(g->sync_dir, 0700)) == RL_OK &&
				    (rv = rl_wver_write_dir(g->wbase, path)) == RL_OK)
					rv = rli_load_weights(g, path, g->pending_version);
				rl_io_remove_tree(path);
				rmdir(g->sync_dir);
			}
			if (rv != 0)
				return rv;
			g->pending_rewind = 0;
			rl_engine_hold(g->e, 0);
		} else {
			rl_engine_hold(g->e, 1); /* drain, then swap */
		}
	}
	return RL_OK;
}

int
rli_poll_weights(gen *g, int force)
{
	double t = rl_now();
	int rv = poll_weights_(g, force);
	g->t_weights += rl_now() - t;
	return rv;
}

/* Waits (polling --weights-from or --sync) until version >= need, at most
 * --weights-timeout. */
int
rli_wait_version(gen *g, int need)
{
	int rv = RL_OK;
	double t0 = rl_now(), last = t0, w0 = g->t_weights;
	const char *src = g->o.weights_from ? g->o.weights_from : g->o.sync_url ? g->o.sync_url : g->o.wgo.addr;

	while (g->version < need) {
		if ((rv = rli_poll_weights(g, 1)) != 0)
			break;
		if (g->version >= need)
			break;
		if (g->o.weights_timeout > 0 && rl_now() - t0 > g->o.weights_timeout) {
			rl_error("no weights version %d in '%s' after %.0f s (have %d)", need, src,
			    g->o.weights_timeout, g->version);
			rl_hint("is the trainer running and publishing there, with --batch %d (this "
			    "--train-batch)?  a trainer that drops groups (dapo) may need more samples than "
			    "--max-staleness lets through", g->o.train_batch);
			rv = RL_ETIMEDOUT;
			break;
		}
		if (rl_now() - last > 10) {
			rl_verbose("waiting for weights version %d in '%s' (have %d)", need, src, g->version);
			last = rl_now();
		}
		if (g->ws) {
			/* rl-sync answers as soon as a newer version is there */
			uint64_t l;
			rl_wsync_poll_version(g->ws, (uint64_t)RL_MAX(g->version, 0), 50, &l);
		} else if (g->wg) {
			int v;
			if ((rv = rl_wgroup_wait(g->wg, 0.05, &v)) != 0)
				break;
		} else {
			usleep(2000); /* one readlink per look: cheap, and the latency is the step's */
		}
	}
	g->t_wait += rl_now() - t0 - (g->t_weights - w0);
	return rv;
}
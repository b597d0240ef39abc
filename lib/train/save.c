/*
 * save.c — the trainer's checkpoints (trainer.h): --out made ready (and
 * rewound on --resume), a step directory per step (ckpt.h) with
 * trainer_state.json in the full ones (the data position --resume reads
 * back) at a new run's first step, every --save-minutes and --save-every
 * and at the end, the newest --keep kept, each version also pushed to --sync
 * and the weights group; with ZeRO the AdamW state as one file per rank;
 * with ZeRO-3 a version only published (in parts with --push-parts, whole
 * to rl-sync, to the weights group) is built unit by unit, each rank its
 * part, rank 0 the whole version and sending each unit to the group, and a
 * directory is written unit by unit by rank
 * 0 while every rank gathers the units it names; a directory step that also
 * sends to the group or in parts does all of it in the directory's walk
 * (never the whole model gathered for a save); with LoRA the files are the
 * adapters', whole on every rank, written by rank 0 as without ZeRO.  One
 * rank on the CPU backend: a step without a full checkpoint is written (and
 * pushed) from a copy of the weights by a thread while the next step
 * computes (bg_start, rli_save_wait).
 * Leaves out: the checkpoint format itself (model/ckpt.c); background
 * publishing of GPU weights, with ZeRO, LoRA, a weights group or parts.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "model/ckpt.h"
#include "model/lora.h"
#include "train/trainer.h"

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The positions of the records read but not trained, which --resume reads
 * again: those of groups still incomplete or complete but not yet in a step,
 * those of tr->groups when they were not trained (groups_pending), and those
 * an earlier --resume has still to read.  Ascending; *pos malloc'd. */
static int
pending_records(trainer *tr, uint64_t **pos, size_t *n)
{
	uint64_t *p;
	size_t np, extra = 0;
	int rv;

	if ((rv = rl_grouper_pending(tr->gr, &p, &np)) != RL_OK)
		return rv;
	if (tr->groups_pending)
		for (int gi = 0; gi < tr->ngroups; gi++)
			extra += (size_t)tr->groups[gi].size;
	extra += tr->npend - tr->ipend;
	if (extra) {
		uint64_t *q = realloc(p, (np + extra) * sizeof *q);
		if (!q) {
			free(p);
			return RL_ENOMEM;
		}
		p = q;
		for (int gi = 0; tr->groups_pending && gi < tr->ngroups; gi++)
			for (int k = 0; k < tr->groups[gi].size; k++)
				if (tr->groups[gi].s[k].pos)
					p[np++] = tr->groups[gi].s[k].pos;
		for (size_t i = tr->ipend; i < tr->npend; i++)
			if (tr->pend[i] > tr->records)
				p[np++] = tr->pend[i];
		qsort(p, np, sizeof *p, cmp_u64);
	}
	*pos = p;
	*n = np;
	return RL_OK;
}

/* The groups of the step that --resume reads again: those the grouper holds,
 * tr->groups when not trained, and those pending at the checkpoint resumed
 * from and not read since.  JSON (ids as decimal strings) or NULL. */
static cJSON *
pending_groups_json(trainer *tr)
{
	rl_gset pg;
	cJSON *out = NULL;
	int rv;

	rl_gset_init(&pg);
	rv = rl_grouper_pending_groups(tr->gr, &pg);
	for (int gi = 0; rv == RL_OK && tr->groups_pending && gi < tr->ngroups; gi++)
		rv = rl_gset_add(&pg, tr->groups[gi].group);
	if (rv == RL_OK)
		rv = rl_gset_add_all(&pg, &tr->pend_groups);
	if (rv == RL_OK)
		out = rl_gset_to_json(&pg);
	rl_gset_fini(&pg);
	return out;
}

/* trainer_state.json: the data position (records and, for the group rule of
 * --resume in docs/train.md, groups) and what the run was. */
static int
write_state(trainer *tr, const char *dir)
{
	char path[4200], *txt = NULL;
	cJSON *j = cJSON_CreateObject(), *pj, *dj, *gj;
	uint64_t *pend;
	size_t npend;
	int rv, ok;

	if ((rv = pending_records(tr, &pend, &npend)) != RL_OK) {
		cJSON_Delete(j);
		return rv;
	}
	ok = cJSON_AddNumberToObject(j, "global_step", tr->m->version) != NULL;
	ok &= cJSON_AddNumberToObject(j, "version", tr->m->version) != NULL;
	ok &= cJSON_AddNumberToObject(j, "records_consumed", (double)RL_MAX(tr->records, tr->skip_records)) != NULL;
	ok &= (pj = cJSON_AddArrayToObject(j, "records_pending")) != NULL;
	for (size_t i = 0; ok && i < npend; i++) {
		cJSON *e = cJSON_CreateNumber((double)pend[i]);
		if (!e || !cJSON_AddItemToArray(pj, e)) {
			cJSON_Delete(e);
			ok = 0;
		}
	}
	free(pend);
	ok &= cJSON_AddNumberToObject(j, "groups_consumed", (double)tr->groups_used) != NULL;
	dj = rl_gset_to_json(&tr->done);
	gj = pending_groups_json(tr);
	if (ok && dj && cJSON_AddItemToObject(j, "groups_done", dj))
		dj = NULL;
	else
		ok = 0;
	if (ok && gj && cJSON_AddItemToObject(j, "groups_pending", gj))
		gj = NULL;
	else
		ok = 0;
	ok &= cJSON_AddStringToObject(j, "algo", rl_algo_name(tr->o->algo)) != NULL;
	ok &= cJSON_AddNumberToObject(j, "seed", (double)tr->o->seed) != NULL;
	if (ok)
		txt = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	cJSON_Delete(dj);
	cJSON_Delete(gj);
	if (!txt) {
		rl_error("out of memory writing the trainer state in '%s'", dir);
		return RL_ENOMEM;
	}
	snprintf(path, sizeof path, "%s/trainer_state.json", dir);
	rv = rl_io_write_atomic(path, txt, strlen(txt), 0644);
	free(txt);
	return rv;
}

/* Keeps the newest `keep` step directories, and always the newest full one
 * (with optimizer state) so that --resume has something to start from. */
static void
prune(trainer *tr)
{
	DIR *d;
	struct dirent *e;
	int steps[4096], n = 0, full = -1;
	char p[4096];

	if (tr->o->keep <= 0 || !(d = opendir(tr->o->out_dir)))
		return;
	while ((e = readdir(d)) != NULL && n < 4096) {
		int s = rl_ckpt_step_num(e->d_name);
		if (s < 0)
			continue;
		steps[n++] = s;
		snprintf(p, sizeof p, "%s/%s/optimizer.safetensors", tr->o->out_dir, e->d_name);
		if (access(p, R_OK) == 0 && s > full)
			full = s;
	}
	closedir(d);
	for (int i = 0; i < n; i++) {
		int newer = 0;
		for (int k = 0; k < n; k++)
			newer += steps[k] > steps[i];
		if (newer >= tr->o->keep && steps[i] != full) {
			snprintf(p, sizeof p, "%s/step-%08d", tr->o->out_dir, steps[i]);
			rl_io_remove_tree(p);
		}
	}
}

/* Weights that went NaN or infinite are never published (rollout workers and
 * `latest` would follow them): one pass over the parameters, before anything
 * of the version leaves the process. */
static int
check_finite(trainer *tr)
{
	/* LoRA: the trained tensors (the frozen base was checked at its load) */
	size_t from = tr->m->lora ? tr->m->goff : 0;
	double ss = tr->ops->sumsq(tr->ops, tr->m->params + from, tr->m->tt.total - from);
	int rv;

	if ((rv = tr->ops->status(tr->ops)) != 0)
		return rv;
	if (isfinite(ss))
		return RL_OK;
	rl_error("step %d: the weights are not finite (NaN or infinite); version %d not published",
	    tr->m->version, tr->m->version);
	rl_hint("the update diverged: lower --lr, or check --beta1, --beta2 and --adam-eps");
	return RL_EINVAL;
}

/* ZeRO-3 builds directories and versions unit by unit; with LoRA its files
 * are the adapters', whole on every rank: written as without ZeRO. */
static int
z3_units(const trainer *tr)
{
	return tr->z3p.zp && !tr->m->lora;
}

/* A step --ckpt-every writes no directory for: the version only goes out
 * (rl-sync, the weights group). */
static int
publish_only(const trainer *tr, int full)
{
	int every = tr->o->ckpt_every;

	return every > 1 && !full && tr->m->version % every != 0;
}

typedef struct unit_walk {
	trainer *tr;
	int next;               /* the next unit to gather */
	int send;               /* rank 0: each unit's range to the weights group */
	int srv;                /* the group's first failure (the walk goes on) */
	rl_ckpt_part *part;     /* a directory step's walk with --push-parts: this rank's part */
	int prv;                /* the part's first failure (the walk goes on) */
	rl_ckpt_part *whole;    /* rank 0, a version only published whole to rl-sync */
	int wrv;                /* the whole version's first failure (the walk goes on) */
} unit_walk;

/* The next unit gathered, the one before given back; on rank 0 with a
 * weights group, the unit's own range forwarded to the group while it is
 * in; with a part built as the units come (rl_ckpt_part), the part's
 * tensors of this unit encoded.  A failed send or encoding stops that, not
 * the walk. */
static int
unit_next(unit_walk *w)
{
	rl_model *m = w->tr->m;
	size_t lo, hi;
	int rv;

	if ((rv = rli_zero3_unit_only(w->tr, w->next)) != 0)
		return rv;
	if (w->send && w->srv == 0) {
		rli_zero3_unit_span(m, w->next, &lo, &hi);
		w->srv = rl_wgroup_send_range(w->tr->wg, lo, hi);
	}
	for (int i = 0; (w->part || w->whole) && i < m->tt.n; i++) {
		if (rli_zero3_unit_of(m, m->tt.t[i].off) != w->next)
			continue;
		if (w->part && w->prv == 0)
			w->prv = rl_ckpt_part_put(w->part, i);
		if (w->whole && w->wrv == 0)
			w->wrv = rl_ckpt_part_put(w->whole, i);
	}
	w->next++;
	return RL_OK;
}

/* ZeRO-3, a directory written unit by unit (tr->z3_save): rl_ckpt_save_need's
 * hook on rank 0.  The unit holding tensor i is gathered unless it is the
 * one in (the one before given back), the other ranks told which first
 * (save_follow).  In a step that also publishes (tr->z3_walk) the files'
 * first pass over the table is the walk: every unit up to tensor i's in
 * turn, none skipped, each sent and put in the parts while in; a later pass
 * (a bf16 model's master weights) gathers only. */
static int
save_need(void *ctx, int i)
{
	trainer *tr = ctx;
	unit_walk *w = tr->z3_walk;
	int u = rli_zero3_unit_of(tr->m, tr->m->tt.t[i].off), rv;

	if (u == tr->z3p.unit)
		return RL_OK;
	if (w && u >= w->next) {
		while (w->next <= u) {
			int k = w->next;
			if ((rv = rl_comm_host_broadcast(tr->comm, &k, sizeof k, 0)) != 0 || (rv = unit_next(w)) != 0)
				return rv;
		}
		return RL_OK;
	}
	if ((rv = rl_comm_host_broadcast(tr->comm, &u, sizeof u, 0)) != 0)
		return rv;
	return rli_zero3_unit_only(tr, u);
}

/* Rank 0 done with the units (written, or failed: `failed`): the other
 * ranks leave save_follow, told -1 (written) or -2.  Once per save, before
 * any other collective.  A walk (tr->z3_walk) is finished first, also
 * after a failure of the files, so every part is whole and the group gets
 * the version, as it did before the files when the model was gathered. */
static int
save_stop(trainer *tr, int failed)
{
	const int units = tr->m->cfg.n_layer + 2;
	unit_walk *w = tr->z3_walk;
	int u, rv = RL_OK, r2;

	if (!tr->z3_save)
		return RL_OK;
	tr->z3_save = 0;
	while (w && rv == 0 && w->next < units) {
		u = w->next;
		if ((rv = rl_comm_host_broadcast(tr->comm, &u, sizeof u, 0)) == 0)
			rv = unit_next(w);
	}
	if (w && w->send && w->srv == 0 && rv == 0) {
		w->srv = rl_wgroup_send_end(tr->wg);
		if (w->srv == 0)
			rl_verbose("sent version %d to the weights group unit by unit (%d ranges) with its directory",
			    tr->m->version, units);
	}
	u = failed || rv ? -2 : -1;
	r2 = rl_comm_host_broadcast(tr->comm, &u, sizeof u, 0);
	return rv ? rv : r2;
}

/* The other ranks while rank 0 writes: the units it names gathered with it,
 * in its order, until it says it is done. */
static int
save_follow(trainer *tr)
{
	int u, rv;

	tr->z3_save = 0;
	for (;;) {
		if ((rv = rl_comm_host_broadcast(tr->comm, &u, sizeof u, 0)) != 0)
			return rv;
		if (u == -1)
			return RL_OK;
		if (u < 0) {
			/* with the optimizer shards, their agreement says it */
			if (!tr->shard_pending)
				rl_error("rank 0 could not write step %d's checkpoint%s", tr->m->version,
				    tr->wpc ? "; this rank's part of the version not pushed" : "");
			return RL_EIO;
		}
		if (tr->z3_walk && u == tr->z3_walk->next)
			rv = unit_next(tr->z3_walk);
		else
			rv = rli_zero3_unit_only(tr, u);
		if (rv != 0)
			return rv;
	}
}

/* push: not when the same version is only rewritten with its optimizer
 * state. */
int
rli_save_publish(trainer *tr, int full, int push)
{
	rl_ckpt_need_fn need = tr->z3_save ? save_need : NULL;
	char dir[4096];
	int rv;

	/* unit by unit: the shards were checked by every rank (shards_finite) */
	if (!tr->z3_save && (rv = check_finite(tr)) != 0)
		return rv;
	/* the weights group: straight from the parameters, before any file
	 * (unit by unit in the files' walk: save_need, save_stop) */
	if (push && tr->wg && !tr->z3_walk && (rv = rl_wgroup_send(tr->wg, tr->m->version)) != 0)
		return rv;
	if (push && (tr->ws || tr->wg) && publish_only(tr, full)) {
		/* --ckpt-every: rl-sync or the group carries this version; no directory, no fsync */
		rl_wver *v = NULL;
		if (!tr->ws || tr->o->push_parts)
			return RL_OK;
		if ((rv = rl_wver_from_ckpt(&v, tr->m, (uint64_t)tr->m->version)) == 0)
			rv = rl_wsync_publish(tr->ws, v, 1);
		rl_wver_destroy(v);
		if (rv != 0)
			rl_error("cannot publish version %d to '%s'", tr->m->version, tr->o->sync_url);
		return rv;
	}
	if (tr->shard_pending && full) {
		/* ZeRO: the index here, every rank's shard beside it, then the
		 * state that makes the directory a full checkpoint */
		rl_ckpt_shards sh = { tr->world, tr->ckpt_id };
		rv = rl_ckpt_save_need(tr->m, tr->o->out_dir, 1, &sh, need, tr, dir, sizeof dir);
		int r2 = save_stop(tr, rv != 0);
		rv = rv ? rv : r2;
		r2 = rli_zero_save_shards(tr, rv == 0);
		if ((rv = rv ? rv : r2) != 0)
			return rv;
	} else {
		rv = rl_ckpt_save_need(tr->m, tr->o->out_dir, full, NULL, need, tr, dir, sizeof dir);
		int r2 = save_stop(tr, rv != 0);
		if ((rv = rv ? rv : r2) != 0)
			return rv;
	}
	if (full && (rv = write_state(tr, dir)) != 0)
		return rv;
	/* rl-sync: the new version goes out as a delta against the last one */
	if (push && tr->ws && !tr->o->push_parts &&
	    (rv = rl_wsync_publish_dir(tr->ws, dir, (uint64_t)tr->m->version, 1)) != 0) {
		rl_error("cannot publish version %d to '%s'", tr->m->version, tr->o->sync_url);
		return rv;
	}
	prune(tr);
	rl_verbose("published version %d in '%s'%s", tr->m->version, dir, full ? " (with optimizer)" : "");
	return RL_OK;
}

/* Makes --out ready before anything is computed (rank 0): a directory this
 * process can write in (created when missing); without --resume it must hold
 * no step directories of an earlier run (the new steps would collide with them
 * and --keep would prune the new ones as older); on --resume, step directories
 * newer than the checkpoint resumed from (resume_step; those written after it
 * without optimizer state) are removed and `latest` points back at it.  Temp
 * directories left by killed runs (.step-N.tmp.PID whose PID is gone) go. */
int
rli_save_prepare_out(const rl_train_opts *o, int resume_step)
{
	const char *root = o->out_dir;
	struct stat st;
	DIR *d;
	struct dirent *e;
	char p[4096];
	int first = -1, n = 0, rv = RL_OK;

	if (stat(root, &st) != 0) {
		if (errno != ENOENT || mkdir(root, 0755) != 0) {
			rl_error("cannot create '%s': %s", root, strerror(errno));
			return RL_EIO;
		}
	} else if (!S_ISDIR(st.st_mode)) {
		rl_error("--out '%s' is not a directory", root);
		return RL_EINVAL;
	}
	if (access(root, W_OK | X_OK) != 0) {
		rl_error("cannot write in '%s': %s", root, strerror(errno));
		return RL_EIO;
	}
	if (!(d = opendir(root))) {
		rl_error("cannot open '%s': %s", root, strerror(errno));
		return RL_EIO;
	}
	while ((e = readdir(d)) != NULL) {
		int s = rl_ckpt_step_num(e->d_name);
		long pid;
		char *dot;
		if (e->d_name[0] == '.' && (dot = strstr(e->d_name, ".tmp.")) != NULL &&
		    sscanf(dot, ".tmp.%ld", &pid) == 1 && pid > 0 &&
		    (pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))) {
			snprintf(p, sizeof p, "%s/%s", root, e->d_name);
			rl_verbose("removing '%s' (left by a run that was killed)", p);
			rl_io_remove_tree(p);
			continue;
		}
		if (s < 0)
			continue;
		if (resume_step < 0) {
			if (first < 0 || s < first)
				first = s;
			n++;
		} else if (s > resume_step) {
			snprintf(p, sizeof p, "%s/%s", root, e->d_name);
			rl_warn("removing '%s': newer than the checkpoint resumed from (step %d)", p, resume_step);
			rl_io_remove_tree(p);
		}
	}
	closedir(d);
	if (n > 0) {
		rl_error("'%s' already holds %d step directories of an earlier run (step-%08d, ...)", root, n, first);
		rl_hint("continue that run with --resume, or give a new --out");
		return RL_EEXIST;
	}
	if (resume_step >= 0) {
		char name[32], lnk[4096], ltmp[4096];
		snprintf(name, sizeof name, "step-%08d", resume_step);
		snprintf(lnk, sizeof lnk, "%s/latest", root);
		snprintf(ltmp, sizeof ltmp, "%s/.latest.tmp.%ld", root, (long)getpid());
		unlink(ltmp);
		if (symlink(name, ltmp) != 0 || rename(ltmp, lnk) != 0) {
			rl_error("cannot point '%s' at '%s': %s", lnk, name, strerror(errno));
			unlink(ltmp);
			rv = RL_EIO;
		}
	}
	return rv;
}

int
rli_save_load_state(trainer *tr, const cJSON *state, const char *dir)
{
	cJSON *pa = cJSON_GetObjectItem(state, "records_pending"), *e;
	int n = cJSON_GetArraySize(pa), rv;
	char where[4200];

	tr->skip_records = (uint64_t)cJSON_GetObjectItem(state, "records_consumed")->valuedouble;
	/* records of groups that were still pending: read again */
	if (n > 0 && !(tr->pend = rl_try_calloc((size_t)n, sizeof *tr->pend, "pending records")))
		return RL_ENOMEM;
	cJSON_ArrayForEach(e, pa)
		if (cJSON_IsNumber(e) && e->valuedouble >= 1)
			tr->pend[tr->npend++] = (uint64_t)e->valuedouble;
	qsort(tr->pend, tr->npend, sizeof *tr->pend, cmp_u64);
	if (cJSON_GetObjectItem(state, "groups_consumed"))
		tr->groups_used = (uint64_t)cJSON_GetObjectItem(state, "groups_consumed")->valuedouble;
	if (!cJSON_GetObjectItem(state, "groups_done")) {
		rl_info("resuming from '%s' at step %d (skipping %llu records already consumed)", dir,
		    tr->m->version, (unsigned long long)(tr->skip_records - tr->npend));
		return RL_OK;
	}
	/* the group rule: whatever order the records come in */
	snprintf(where, sizeof where, "'%s/trainer_state.json': groups_done", dir);
	if ((rv = rl_gset_from_json(&tr->done, cJSON_GetObjectItem(state, "groups_done"), where)) != 0 ||
	    (rv = rl_gset_add_all(&tr->skip, &tr->done)) != 0)
		return rv;
	snprintf(where, sizeof where, "'%s/trainer_state.json': groups_pending", dir);
	if (cJSON_GetObjectItem(state, "groups_pending") &&
	    (rv = rl_gset_from_json(&tr->pend_groups, cJSON_GetObjectItem(state, "groups_pending"), where)) != 0)
		return rv;
	tr->by_group = 1;
	rl_info("resuming from '%s' at step %d (skipping the records of the %llu groups done)", dir,
	    tr->m->version, (unsigned long long)rl_gset_count(&tr->done));
	return RL_OK;
}

static int group_units(trainer *tr);

int
rli_save_open(trainer *tr, const char *dir)
{
	const rl_train_opts *o = tr->o;
	int rv;

	if (tr->rank == 0 && o->sync_url && (rv = rl_wsync_open_with(&tr->ws, o->sync_url, 0, o->sync_transport)) != 0)
		return rv;
	/* versions pushed after the checkpoint resumed from are lost with the
	 * run that made them: rl-sync goes back to this one, and the workers
	 * that loaded them move to it */
	if (tr->ws && tr->resumed && (rv = rl_wsync_rewind_dir(tr->ws, dir, (uint64_t)tr->m->version)) != 0) {
		rl_error("cannot rewind '%s' to version %d, the checkpoint resumed from", o->sync_url, tr->m->version);
		return rv;
	}
	if (o->push_parts) {
		/* every rank its own connection: the parts go at once */
		rl_wsync_client_opts co = { 0 };
		co.transport = RL_WSYNC_T_STREAM;
		if ((rv = rl_wsync_client_open(&tr->wpc, o->sync_url, &co)) != 0)
			return rv;
	}
	if (tr->rank == 0 && o->wgroup_addr) {
		/* the rollout workers start from this trainer's weights (a resumed run's too) */
		rl_wgroup_opts wo = { o->wgroup_addr, 0, o->wgroup_size, o->wgroup_backend, 0 };
		if ((rv = rl_wgroup_open(&tr->wg, &wo, tr->m)) != 0)
			return rv;
	}
	/* ZeRO-3 keeps only the shards by now (dp.c gave the rest of m->params
	 * back): every rank takes part in sending them unit by unit */
	if (o->wgroup_addr && tr->z3p.zp)
		return group_units(tr);
	if (tr->wg && (rv = rl_wgroup_send(tr->wg, tr->m->version)) != 0)
		return rv;
	return RL_OK;
}

/* Whether this step's checkpoint is a full one: the first of a new run (a
 * crash from then on has something to resume), every --save-every steps,
 * when --save-minutes passed since the last, and at --max-steps.  Rank 0's
 * clock decides for all: ZeRO gathers the optimizer state from every rank,
 * and every rank must know the same steps as saved. */
static int
full_due(trainer *tr, int *full)
{
	const rl_train_opts *o = tr->o;

	*full = !tr->have_full || (o->save_every > 0 && tr->m->version % o->save_every == 0) ||
	    (o->max_steps > 0 && tr->m->version >= o->max_steps);
	if (o->save_minutes <= 0)
		return RL_OK;
	if (tr->rank == 0 && rl_now() - tr->t_full >= o->save_minutes * 60)
		*full = 1;
	return tr->world > 1 ? rl_comm_host_broadcast(tr->comm, full, sizeof *full, 0) : RL_OK;
}

/* --push-parts: this rank's part of the version (its 1/world of the
 * model's files, rl_ckpt_part_files) to rl-sync, a delta against its last
 * one; the server publishes the version when every rank's part is in.  The
 * part is the walk's (w: built as the units came) or cut from the
 * parameters (the whole model in memory). */
static int
push_part(trainer *tr, unit_walk *w)
{
	rl_ckpt_file *f = NULL;
	rl_wver *v = NULL;
	double t0 = rl_now();
	int rv, pub = 0, nf = 0;

	if (w && (rv = w->prv) == 0 && (rv = rl_ckpt_part_finish(w->part, &f, &nf)) == 0)
		rv = rl_wver_from_files(&v, (uint64_t)tr->m->version, f, nf);
	else if (!w)
		rv = rl_wver_from_ckpt_part(&v, tr->m, (uint64_t)tr->m->version, tr->rank, tr->world);
	rl_ckpt_files_free(f, nf);
	if (rv != 0 || (rv = rl_wsync_push_part(tr->wpc, v, tr->wpart, tr->rank, tr->world, &pub)) != 0) {
		rl_error("cannot push part %d of %d of version %d to '%s'", tr->rank, tr->world, tr->m->version,
		    tr->o->sync_url);
		rl_wver_destroy(v);
		return rv;
	}
	rl_verbose("pushed part %d of %d of version %d (%llu bytes%s) in %.2f s%s", tr->rank, tr->world,
	    tr->m->version, (unsigned long long)rl_wver_total(v), w ? ", built unit by unit" : "", rl_now() - t0,
	    pub ? ": published" : "");
	rl_wver_destroy(tr->wpart);
	tr->wpart = v;
	return RL_OK;
}

/* rl_ckpt_part_files_need's hook: every unit up to tensor i's gathered in
 * turn (the ones before it only so the other ranks get theirs), the last
 * stays for the copy into the part. */
static int
walk_to(void *ctx, int i)
{
	unit_walk *w = ctx;
	int u = rli_zero3_unit_of(w->tr->m, w->tr->m->tt.t[i].off), rv;

	while (w->next <= u)
		if ((rv = unit_next(w)) != 0)
			return rv;
	return RL_OK;
}

/* ZeRO-3: the version the weights group opens with, unit by unit from the
 * shards (every rank walks the units; rank 0 sends).  Not a publish: the
 * publish metrics are left alone. */
static int
group_units(trainer *tr)
{
	const int units = tr->m->cfg.n_layer + 2;
	unit_walk w = { tr, 0, tr->wg != NULL, RL_OK, NULL, RL_OK, NULL, RL_OK };
	double peak = tr->pres_peak;
	int rv = RL_OK;

	if (w.send && (w.srv = rl_wgroup_send_begin(tr->wg, tr->m->version, units)) != 0)
		w.send = 0;
	while (w.next < units && rv == 0)
		rv = unit_next(&w);
	rli_zero3_release(tr);
	tr->pres_peak = peak;
	if (w.send && w.srv == 0 && rv == 0)
		w.srv = rl_wgroup_send_end(tr->wg);
	return rv ? rv : w.srv;
}

/* Finite weights on every rank's shard, agreed by all: a version is
 * published by all of them or by none (a part left out would hold the
 * others' at the server until --part-timeout). */
static int
shards_finite(trainer *tr)
{
	/* the backend's vectorised f64 sum of squares: a serial loop here took
	 * a quarter of the time of AdamW on the shard (perf, bench/zero.sh); a
	 * failure inside it (NaN) still goes through the all-reduce, so that
	 * every rank refuses alike */
	double ss = tr->ops->sumsq(tr->ops, tr->z3p.zp, tr->zhi - tr->zlo);
	int rv;

	if ((rv = rl_comm_host_allreduce_f64(tr->comm, &ss, 1)) != 0)
		return rv;
	if (isfinite(ss))
		return RL_OK;
	if (tr->rank == 0) {
		rl_error("step %d: the weights are not finite (NaN or infinite); version %d not published",
		    tr->m->version, tr->m->version);
		rl_hint("the update diverged: lower --lr, or check --beta1, --beta2 and --adam-eps");
	}
	return RL_EINVAL;
}

/* Rank 0, a version only published whole to rl-sync: the files the walk
 * encoded (w->whole: rl_ckpt_weight_files' bytes) pushed as the gathered
 * path pushed rl_wver_from_ckpt's, a delta against the last version. */
static int
push_whole(trainer *tr, unit_walk *w, double t0)
{
	rl_ckpt_file *f = NULL;
	rl_wver *v = NULL;
	int rv, nf = 0;

	if ((rv = w->wrv) == 0 && (rv = rl_ckpt_part_finish(w->whole, &f, &nf)) == 0 &&
	    (rv = rl_wver_from_files(&v, (uint64_t)tr->m->version, f, nf)) == 0)
		rv = rl_wsync_publish(tr->ws, v, 1);
	rl_ckpt_files_free(f, nf);
	if (rv != 0)
		rl_error("cannot publish version %d to '%s'", tr->m->version, tr->o->sync_url);
	else
		rl_verbose("published version %d to '%s' (%llu bytes, built unit by unit) in %.2f s", tr->m->version,
		    tr->o->sync_url, (unsigned long long)rl_wver_total(v), rl_now() - t0);
	rl_wver_destroy(v);
	return rv;
}

/* After a whole version's walk: rank 0's outcome to the others (0; 1: the
 * version not published to rl-sync; 2: the weights group failed), so that
 * all of them stop at this step, each saying why, instead of the others
 * waiting for rank 0 in the next step's collectives.  Every rank calls it. */
static int
whole_outcome(trainer *tr, int rv, int srv)
{
	int how = rv ? 1 : srv ? 2 : 0, r2;

	if ((r2 = rl_comm_host_broadcast(tr->comm, &how, sizeof how, 0)) != 0 || tr->rank == 0 || how == 0)
		return r2;
	if (how == 1)
		rl_error("rank 0 could not publish version %d to '%s'", tr->m->version, tr->o->sync_url);
	else
		rl_error("rank 0 could not send version %d to the weights group", tr->m->version);
	return RL_EIO;
}

/* ZeRO-3, a version published only, to --push-parts, whole to rl-sync
 * (--sync without --push-parts) and/or to the weights group: built unit by
 * unit, never the whole model.  Every rank gathers every unit in table
 * order; the tensors of this rank's part are encoded while their unit is
 * in, rank 0 encodes them into the whole version and forwards the unit's
 * range to the group, and the unit is given back before the next comes.
 * The units after the part's last tensor are still gathered, also after a
 * failure here, so the collectives stay matched across ranks; with a whole
 * version rank 0 then tells the others whether it went out
 * (whole_outcome). */
static int
publish_units(trainer *tr)
{
	const int units = tr->m->cfg.n_layer + 2;
	const int whole = tr->o->sync_url && !tr->o->push_parts; /* the same on every rank */
	unit_walk w = { tr, 0, tr->wg != NULL, RL_OK, NULL, RL_OK, NULL, RL_OK };
	rl_wver *v = NULL;
	double t0 = rl_now(), peak = tr->pres_peak;
	int rv = RL_OK, r2 = RL_OK, pub = 0;

	if ((rv = shards_finite(tr)) != 0)
		return rv;
	tr->pres_peak = 0;
	if (w.send && (w.srv = rl_wgroup_send_begin(tr->wg, tr->m->version, units)) != 0)
		w.send = 0;
	/* a failure to lay it out is the push's, after the walk */
	if (whole && tr->ws)
		w.wrv = rl_ckpt_part_open(&w.whole, tr->m, 0, 0);
	if (tr->wpc)
		rv = rl_wver_from_ckpt_part_need(&v, tr->m, (uint64_t)tr->m->version, tr->rank, tr->world, walk_to, &w);
	while (w.next < units && r2 == 0)
		r2 = unit_next(&w);
	rli_zero3_release(tr);
	if (w.send && w.srv == 0 && r2 == 0)
		w.srv = rl_wgroup_send_end(tr->wg);
	tr->pub_pres_peak = RL_MAX(tr->pub_pres_peak, tr->pres_peak);
	tr->pres_peak = RL_MAX(peak, tr->pres_peak);
	if ((rv = rv ? rv : r2) == 0 && tr->ws && whole)
		rv = push_whole(tr, &w, t0);
	rl_ckpt_part_close(w.whole);
	if (whole) {
		int r3 = whole_outcome(tr, rv, w.srv);
		rv = rv ? rv : r3;
	}
	if (rv == 0 && tr->wpc)
		rv = rl_wsync_push_part(tr->wpc, v, tr->wpart, tr->rank, tr->world, &pub);
	if (rv != 0 && tr->wpc)
		rl_error("cannot push part %d of %d of version %d to '%s'", tr->rank, tr->world, tr->m->version,
		    tr->o->sync_url);
	/* the group's failure, said by wgroup.c, after the part: that one is whole */
	if ((rv = rv ? rv : w.srv) != 0) {
		rl_wver_destroy(v);
		return rv;
	}
	if (w.send)
		rl_verbose("sent version %d to the weights group unit by unit (%d ranges) in %.2f s", tr->m->version,
		    units, rl_now() - t0);
	if (tr->wpc) {
		rl_verbose("pushed part %d of %d of version %d (%llu bytes, built unit by unit) in %.2f s%s", tr->rank,
		    tr->world, tr->m->version, (unsigned long long)rl_wver_total(v), rl_now() - t0,
		    pub ? ": published" : "");
		rl_wver_destroy(tr->wpart);
		tr->wpart = v;
	}
	return RL_OK;
}

static int save_step(trainer *tr, int full);

/* ZeRO-3: a directory written unit by unit (rl-sync's whole version is
 * read from the directory), the finite check on the shards, agreed by all;
 * with a weights group or --push-parts (full >= 0: a step that publishes)
 * the directory's walk also sends each unit to the group and builds this
 * rank's part (tr->z3_walk).  Every rank calls this with the same answer
 * (options and full_due). */
static int
save_units_begin(trainer *tr, int full)
{
	const rl_train_opts *o = tr->o;
	unit_walk *w;
	int rv;

	if (!z3_units(tr))
		return RL_OK;
	if ((rv = shards_finite(tr)) != 0)
		return rv;
	rli_zero3_release(tr);
	tr->z3_save = 1;
	if (full < 0 || !(o->push_parts || o->wgroup_addr))
		return RL_OK;
	w = rl_xcalloc(1, sizeof *w);
	w->tr = tr;
	w->send = tr->wg != NULL;
	if (w->send && (w->srv = rl_wgroup_send_begin(tr->wg, tr->m->version, tr->m->cfg.n_layer + 2)) != 0)
		w->send = 0;
	/* a failure here is this rank's at the push; the walk is everyone's */
	if (tr->wpc)
		w->prv = rl_ckpt_part_open(&w->part, tr->m, tr->rank, tr->world);
	tr->z3_walk = w;
	return RL_OK;
}

/* The parameters' resident peak while the save ran (ZeRO-3) into
 * save_pres_peak; the step's own peak kept. */
static void
save_units_end(trainer *tr, double peak)
{
	if (!z3_units(tr))
		return;
	rli_dp_params_resident(tr); /* a gathered save: the whole model beside the shard */
	rli_zero3_release(tr);
	tr->z3_save = 0;
	if (tr->z3_walk) {
		/* the version went out in the same walk: its peak is the save's */
		tr->pub_pres_peak = RL_MAX(tr->pub_pres_peak, tr->pres_peak);
		rl_ckpt_part_close(tr->z3_walk->part);
		free(tr->z3_walk);
		tr->z3_walk = NULL;
	}
	tr->save_pres_peak = RL_MAX(tr->save_pres_peak, tr->pres_peak);
	tr->pres_peak = RL_MAX(peak, tr->pres_peak);
}

/* ZeRO-3: a step that writes a directory writes it unit by unit
 * (save_units_begin), sending to a weights group and building the parts in
 * the same walk; a version only published (a step --ckpt-every writes no
 * directory for: in parts, whole to rl-sync, to the weights group) is built
 * unit by unit too (publish_units). */
/* Background publishing: a step that writes no full checkpoint copies the
 * weights (rl_ckpt_snap) and a thread writes OUT/step-N, moves `latest`
 * and pushes to --sync while the next step leases and computes; the
 * trainer waits for it before the next save of any kind, and before it
 * exits.  One rank, no ZeRO, no weights group, no --push-parts, host
 * weights without LoRA (rl_ckpt_snap_ok); full checkpoints stay in place:
 * they hold the data position and the acknowledgements follow them. */
static int
bg_ok(const trainer *tr, int full)
{
	return !full && !tr->o->publish_inline && tr->world == 1 && !tr->zero && !tr->z3p.zp && !tr->wg &&
	    !tr->o->push_parts && rl_ckpt_snap_ok(tr->m);
}

/* The thread's work, on the copy (m): what rli_save_publish does for a
 * step without optimizer state. */
static int
bg_write(trainer *tr, rl_model *m)
{
	char dir[4096];
	int rv;

	if (tr->bg_only) {
		/* --ckpt-every: only rl-sync carries this version */
		rl_wver *v = NULL;
		if ((rv = rl_wver_from_ckpt(&v, m, (uint64_t)m->version)) == 0)
			rv = rl_wsync_publish(tr->ws, v, 1);
		rl_wver_destroy(v);
		if (rv != 0)
			rl_error("cannot publish version %d to '%s'", m->version, tr->o->sync_url);
		return rv;
	}
	if ((rv = rl_ckpt_save(m, tr->o->out_dir, 0, dir, sizeof dir)) != 0)
		return rv;
	if (tr->ws && (rv = rl_wsync_publish_dir(tr->ws, dir, (uint64_t)m->version, 1)) != 0) {
		rl_error("cannot publish version %d to '%s'", m->version, tr->o->sync_url);
		return rv;
	}
	prune(tr);
	rl_verbose("published version %d in '%s' (in the background)", m->version, dir);
	return RL_OK;
}

static void *
bg_main(void *arg)
{
	trainer *tr = arg;
	double t0 = rl_now();

	tr->bg_rv = bg_write(tr, rl_ckpt_snap_model(tr->snap));
	tr->bg_s = rl_now() - t0;
	return NULL;
}

int
rli_save_wait(trainer *tr)
{
	if (!tr->bg_running)
		return RL_OK;
	pthread_join(tr->bg_th, NULL);
	tr->bg_running = 0;
	if (tr->bg_rv != 0)
		rl_error("version %d was not published (written in the background): the run stops", tr->bg_version);
	return tr->bg_rv;
}

static int
bg_start(trainer *tr)
{
	int rv;

	if ((rv = check_finite(tr)) != 0 || (rv = rl_ckpt_snap_take(&tr->snap, tr->m)) != 0)
		return rv;
	tr->bg_only = publish_only(tr, 0);
	tr->bg_version = tr->m->version;
	tr->bg_rv = RL_OK;
	tr->last_full = 0;
	if (pthread_create(&tr->bg_th, NULL, bg_main, tr) != 0) {
		/* no thread to spare: written here, as with --publish-inline */
		bg_main(tr);
		return tr->bg_rv;
	}
	tr->bg_running = 1;
	return RL_OK;
}

int
rli_save_step(trainer *tr)
{
	double t_pub = rl_now(), peak = tr->pres_peak;
	int rv, full;

	/* the version before is out first: versions leave in order, and a
	 * failed one stops the run here */
	if ((rv = rli_save_wait(tr)) != 0 || (rv = full_due(tr, &full)) != 0)
		return rv;
	if (bg_ok(tr, full)) {
		rv = bg_start(tr);
		tr->t_pub = rl_now() - t_pub;
		return rv;
	}
	/* every rank takes the same path (publish_only: options and full_due);
	 * --ckpt-every > 1 comes with --sync or a weights group */
	if (z3_units(tr) && publish_only(tr, full)) {
		if ((rv = publish_units(tr)) != 0)
			return rv;
		tr->last_full = 0;
		tr->t_pub = rl_now() - t_pub;
		return RL_OK;
	}
	if (z3_units(tr))
		tr->pres_peak = 0; /* the save's own peak (save_units_end) */
	if ((rv = save_units_begin(tr, full)) == 0)
		rv = save_step(tr, full);
	save_units_end(tr, peak);
	tr->t_pub = rl_now() - t_pub;
	return rv;
}

static int
save_step(trainer *tr, int full)
{
	int rv;

	if (tr->zero && full && (rv = rli_zero_ckpt_id(tr)) != 0)
		return rv;
	tr->shard_pending = tr->zero && full;
	if (tr->rank == 0) {
		rv = rli_save_publish(tr, full, 1);
		int r2 = save_stop(tr, rv != 0); /* where it returned before the files */
		rv = rv ? rv : r2;
	} else if (tr->z3_save) {
		rv = save_follow(tr);
	}
	/* the other ranks write their shards when rank 0 has the directory
	 * (or learn that it failed) */
	if (tr->shard_pending) {
		int r2 = rli_zero_save_shards(tr, tr->rank != 0 || rv == 0);
		rv = rv ? rv : r2;
	}
	if (rv != 0 || (tr->wpc && (rv = push_part(tr, tr->z3_walk)) != 0))
		return rv;
	/* the group's failure, said by wgroup.c, after the part: that one is whole */
	if (tr->z3_walk && (rv = tr->z3_walk->srv) != 0)
		return rv;
	if (full) {
		tr->t_full = rl_now();
		tr->have_full = 1;
	}
	tr->last_full = full;
	return RL_OK;
}

int
rli_save_final(trainer *tr, int start_step)
{
	const rl_train_opts *o = tr->o;
	char dir[4096];
	int need = 0, rv;

	/* the last version is published before the run ends */
	if ((rv = rli_save_wait(tr)) != 0)
		return rv;
	if (tr->m->version > start_step && tr->rank == 0) {
		char opt[4096];
		snprintf(opt, sizeof opt, "%s/step-%08d/optimizer.safetensors", o->out_dir, tr->m->version);
		need = access(opt, R_OK) != 0;
	}
	/* ZeRO: every rank writes its shard of the optimizer state */
	if (tr->zero && ((rv = rl_comm_host_broadcast(tr->comm, &need, sizeof need, 0)) != 0 ||
	    (need && (rv = rli_zero_ckpt_id(tr)) != 0)))
		return rv;
	if (!need)
		return RL_OK;
	tr->shard_pending = tr->zero;
	/* nothing is pushed here: unit by unit whatever the options (-1) */
	if ((rv = save_units_begin(tr, -1)) != 0) {
		rli_zero3_release(tr);
		return rv;
	}
	if (tr->rank == 0) {
		snprintf(dir, sizeof dir, "%s/step-%08d", o->out_dir, tr->m->version);
		rl_io_remove_tree(dir);
		tr->groups_pending = 1;
		rv = rli_save_publish(tr, 1, 0);
		int r2 = save_stop(tr, rv != 0);
		rv = rv ? rv : r2;
	} else if (tr->z3_save) {
		rv = save_follow(tr);
	}
	if (tr->shard_pending) {
		int r2 = rli_zero_save_shards(tr, tr->rank != 0 || rv == 0);
		rv = rv ? rv : r2;
	}
	save_units_end(tr, tr->pres_peak);
	return rv;
}

int
rl_train_merge_adapter(const char *adapter_dir, const char *base_dir, const char *out_dir)
{
	rl_lora_opts lo;
	rl_ops *ops = NULL;
	rl_model *m = NULL;
	char *base = NULL;
	int rv;

	if ((rv = rl_lora_config_read(adapter_dir, &lo, &base)) != 0)
		return rv;
	if (base_dir != NULL) {
		free(base);
		base = rl_xstrdup(base_dir);
	}
	if (base == NULL) {
		rl_error("'%s/%s' names no base model: give it with -m BASE", adapter_dir, RL_LORA_CONFIG_FILE);
		return RL_EINVAL;
	}
	/* the merge is host arithmetic on f32 weights: on the CPU */
	if ((rv = rl_ops_open(&ops, "cpu")) != 0 || (rv = rl_model_open(&m, base, ops)) != 0 ||
	    (rv = rl_model_add_lora(m, &lo)) != 0 || (rv = rl_model_lora_load(m, adapter_dir)) != 0 ||
	    (rv = rl_model_lora_merge(m)) != 0 || (rv = rl_model_save(m, out_dir)) != 0)
		goto out;
	rl_info("merged '%s' (rank %d, alpha %g) into '%s': '%s'", adapter_dir, lo.r, lo.alpha, base, out_dir);
out:
	rl_model_close(m);
	rl_ops_close(ops);
	free(base);
	return rv;
}

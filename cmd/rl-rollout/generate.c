/*
 * generate.c — `rl-rollout -m MODEL [-n G] [PROMPTS|-]`: prompts in,
 * trajectory records out, through the engine (lib/rollout/engine.c); and
 * `rl-rollout --score FIELD`, which writes each response token's log-prob
 * under MODEL into FIELD.  Weight versions come from --weights-from DIR
 * (the checkpoint root rl-train writes).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmd.h"
#include "model/ckpt.h"
#include "base/core.h"
#include "base/gset.h"
#include "base/json.h"
#include "rollout/engine.h"
#include "base/io.h"
#include "model/model.h"
#include "base/progress.h"
#include "rollout/prompt.h"
#include "queue/qclient.h"
#include "model/safetensors.h"
#include "sync/wgroup.h"
#include "sync/wsync.h"
#include "base/rng.h"
#include "tok/tokenizer.h"
#include "stream/traj.h"
#include "queue/wstat.h"

static const char usage_text[] =
    "usage: rl-rollout -m MODEL_DIR [-n G] [options] [PROMPTS.jsonl|-]\n"
    "       rl-rollout --score FIELD -m MODEL_DIR [options] [TRAJECTORIES|-]\n"
    "       rl-rollout tokenize -m MODEL_DIR [--chat] [--decode] [FILE|-]\n"
    "\n"
    "Generates G samples per prompt line and writes trajectory records (binary\n"
    "stream, or JSONL with --jsonl).  A prompt line is {\"prompt\": TEXT or\n"
    "[{\"role\": .., \"content\": ..}], ...}; every other key goes to the record's meta.\n"
    "\n"
    "  -m, --model DIR         the policy (Hugging Face directory)\n"
    "  -n, --samples G         samples per prompt (default 1)\n"
    "  -o, --output FILE       write here instead of stdout\n"
    "      --jsonl             write JSONL instead of the binary stream\n"
    "      --temperature T     sampling temperature (default 1; 0 = greedy)\n"
    "      --top-p P           nucleus sampling (default 1 = off)\n"
    "      --top-k K           top-k sampling (default 0 = off)\n"
    "      --max-tokens N      response tokens at most (default 256)\n"
    "      --stop STR          stop string (repeatable)\n"
    "      --stop-id ID        stop token id (repeatable)\n"
    "      --seed S            sampling seed (default 0): same seed, same output\n"
    "      --chat              wrap text prompts as a user message in the chat template\n"
    "      --chat-template T   chatml, plain or auto (default auto)\n"
    "      --no-thinking       enable_thinking=false for Qwen3 chat prompts whose line has\n"
    "                          no chat_template_kwargs (default: thinking on)\n"
    "      --greedy-baseline   one more greedy sample per prompt, marked meta.baseline (ReMax)\n"
    "      --slots N           sequences decoded together (default 64)\n"
    "      --kv-mem BYTES      KV cache budget, suffixes K M G (default 256M)\n"
    "      --decode-steps N    decode steps queued at once while no prompt waits (default 1)\n"
    "      --device D          cpu, cuda, cuda:N or auto (default cpu)\n"
    "      --weights-from DIR  load new weight versions from DIR/latest as they appear\n"
    "      --max-staleness K   wait for version >= batches emitted - K (with --weights-from)\n"
    "      --resume DIR        continue the run rl-train --out DIR checkpointed: start from its newest\n"
    "                          full checkpoint's weights, skip the prompts of the groups done there\n"
    "      --train-batch G     groups per trainer step, for --max-staleness (default 8)\n"
    "      --partial           new weights apply to sequences already running\n"
    "      --sync URL          new weight versions from rl-sync (tcp://, ipc://) or a directory\n"
    "      --sync-transport T  auto (shared memory with a server on this host), shm, stream, nng or file\n"
    "      --weights-timeout S give up waiting for a weights version after S seconds (default 600; 0 never)\n"
    "      --weights-group HOST:PORT  new versions broadcast by the trainer of that group\n"
    "      --weights-group-rank R     this worker's rank in it (1 .. size-1; the trainer is 0)\n"
    "      --weights-group-size N     the trainer and its N-1 workers\n"
    "      --weights-group-backend B  auto, cpu, nccl or ipc (default auto: on a loopback address with\n"
    "                                 CUDA: ipc; else nccl on CUDA with NCCL; else cpu)\n"
    "      --skip-bad          skip bad prompt lines (counted) instead of stopping\n"
    "      --score FIELD       score mode: write per-token log-probs into FIELD\n"
    "      --queue URL         lease prompts from rl-queue and put the trajectories back\n"
    "      --idle-exit S       queue mode: exit after S seconds without work (default: run until signalled)\n"
    "      --broker-timeout S  queue mode: exit 1 after S seconds without a reply from the broker\n"
    "                          (default 300; 0 never)\n"
    "  -q, --quiet, -v, --verbose, -h, --help\n";

enum {
	O_JSONL = 256, O_TEMP, O_TOPP, O_TOPK, O_MAXTOK, O_STOP, O_STOPID, O_SEED, O_CHAT, O_TMPL,
	O_GREEDY, O_SLOTS, O_KVMEM, O_DEVICE, O_WFROM, O_STALE, O_TBATCH, O_PARTIAL, O_SKIPBAD, O_SCORE,
	O_QUEUE, O_IDLE, O_WTIMEOUT, O_SYNC, O_STRANS, O_WGROUP, O_WGRANK, O_WGSIZE, O_WGBACK, O_DSTEPS, O_RESUME,
	O_NOTHINK, O_BTIMEOUT
};

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' }, { "samples", required_argument, 0, 'n' },
	{ "output", required_argument, 0, 'o' }, { "jsonl", no_argument, 0, O_JSONL },
	{ "temperature", required_argument, 0, O_TEMP }, { "top-p", required_argument, 0, O_TOPP },
	{ "top-k", required_argument, 0, O_TOPK }, { "max-tokens", required_argument, 0, O_MAXTOK },
	{ "stop", required_argument, 0, O_STOP }, { "stop-id", required_argument, 0, O_STOPID },
	{ "seed", required_argument, 0, O_SEED }, { "chat", no_argument, 0, O_CHAT },
	{ "chat-template", required_argument, 0, O_TMPL }, { "greedy-baseline", no_argument, 0, O_GREEDY },
	{ "slots", required_argument, 0, O_SLOTS }, { "kv-mem", required_argument, 0, O_KVMEM },
	{ "decode-steps", required_argument, 0, O_DSTEPS }, { "no-thinking", no_argument, 0, O_NOTHINK },
	{ "device", required_argument, 0, O_DEVICE }, { "weights-from", required_argument, 0, O_WFROM },
	{ "resume", required_argument, 0, O_RESUME },
	{ "max-staleness", required_argument, 0, O_STALE }, { "train-batch", required_argument, 0, O_TBATCH },
	{ "partial", no_argument, 0, O_PARTIAL }, { "skip-bad", no_argument, 0, O_SKIPBAD },
	{ "score", required_argument, 0, O_SCORE }, { "queue", required_argument, 0, O_QUEUE },
	{ "idle-exit", required_argument, 0, O_IDLE }, { "broker-timeout", required_argument, 0, O_BTIMEOUT },
	{ "weights-timeout", required_argument, 0, O_WTIMEOUT }, { "sync", required_argument, 0, O_SYNC },
	{ "sync-transport", required_argument, 0, O_STRANS },
	{ "weights-group", required_argument, 0, O_WGROUP }, { "weights-group-rank", required_argument, 0, O_WGRANK },
	{ "weights-group-size", required_argument, 0, O_WGSIZE },
	{ "weights-group-backend", required_argument, 0, O_WGBACK },
	{ "quiet", no_argument, 0, 'q' }, { "verbose", no_argument, 0, 'v' }, { "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 }
};

typedef struct gen {
	/* options */
	const char *model_dir, *out_path, *device, *weights_from, *input, *score_field, *queue_url;
	double idle_exit, weights_timeout;
	double broker_timeout; /* --broker-timeout: seconds without a reply from the broker (0: never) */
	const char *sync_url;
	int sync_transport;    /* RL_WSYNC_T_* (--sync-transport) */
	rl_wsync *ws;
	rl_wgroup_opts wgo;    /* --weights-group */
	rl_wgroup *wg;
	rl_wver *wbase;        /* the last version fetched: the base of the next delta */
	char sync_dir[3800];   /* where fetched versions are written to be loaded */
	rl_qclient *qc;
	rl_wstat *wst;         /* queue mode: stats reported to the broker */
	rl_progress prog;
	uint64_t q_bad, q_put;
	int n, jsonl, chat, tmpl, greedy, max_staleness, train_batch, partial, skip_bad, quiet;
	int no_think;          /* --no-thinking: enable_thinking=false where a line does not say */
	uint64_t seed;
	rl_gen_opts go;
	const char *stops[64];
	int32_t stop_ids[64];
	/* state */
	rl_ops *ops;
	rl_model *m;
	rl_tokenizer *tok;
	rl_engine *e;
	rl_traj_writer *w;
	FILE *out;
	int version, pending_version;
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
	double last_poll;      /* when rl-sync was last asked for a new version */
	double poll_backoff;   /* rl-sync did not answer: seconds until it is asked again (0: it answers) */
	int nloads;
	int warned_max_tokens; /* a line's max_tokens above --max-tokens was reported */
	/* --resume DIR: the checkpoint, the groups done there (never generated again) */
	const char *resume_dir;
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
	int eos_more[24];      /* ids ending a sequence as EOS besides go.eos_id (eos_set) */
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
} prompt;

static int
usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "rl-rollout: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nrl-rollout: hint: rl-rollout --help lists the options\n");
	return 2;
}

/* "-n" or "--top-p": the option getopt_long returned as c, for messages */
static const char *
opt_name(int c, char *buf, size_t cap)
{
	for (const struct option *o = longopts; o->name; o++) {
		if (o->val == c) {
			snprintf(buf, cap, "--%s", o->name);
			return buf;
		}
	}
	snprintf(buf, cap, "-%c", c > 32 && c < 127 ? c : '?');
	return buf;
}

/* "bad value" for option c: names the option and the range */
static int
num_error(int c, const char *a, double lo, double hi)
{
	char on[64];

	fprintf(stderr, "rl-rollout: %s: bad value '%s' (want a number from %.10g to %.10g)\n", opt_name(c, on, sizeof on), a, lo, hi);
	fprintf(stderr, "rl-rollout: hint: rl-rollout --help lists the options\n");
	return 2;
}

/* A seed: every one of its 64 bits (a double keeps 53: 2^53 + 1 became 2^53). */
static int
parse_seed(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	if (*s < '0' || *s > '9' || (v = strtoull(s, &end, 10), *end) || errno == ERANGE)
		return -1;
	*out = (uint64_t)v;
	return 0;
}

static int
parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end || !(v >= lo && v <= hi))
		return -1;
	*out = v;
	return 0;
}

static int
parse_bytes(const char *s, size_t *out)
{
	char *end;
	double v = strtod(s, &end), mul = 1;
	if (end == s || !(v >= 0) || !isfinite(v))
		return -1;
	switch (*end) {
	case 0: break;
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	default: return -1;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v * mul > 1024.0 * 1024 * 1024 * 1024) /* at most 1 TiB: past that, a typo */
		return -1;
	*out = (size_t)(v * mul);
	return 0;
}


/* ---- weight versions ----------------------------------------------------------------- */

/* The newest version in DIR: DIR/latest -> step-NNNNNNNN (rl-train's layout).
 * Returns RL_OK with *ver and path, RL_ENOENT when there is none yet. */
static int
latest_version(const char *dir, int *ver, char *path, size_t len)
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

/* Replaces the model's weights in place with those in dir (same shapes). */
static int
load_weights(gen *g, const char *dir, int ver)
{
	rl_st_set *set = NULL;
	int rv;

	if ((rv = rl_st_set_open(&set, dir)) != 0)
		return rv;
	rv = load_set(g, set, dir, ver);
	rl_st_set_close(set);
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

/* Removes a directory of plain files (a fetched version once loaded). */
static void
remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[4400];

	if (!d)
		return;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* The newest version the weights group has received (perhaps newer than
 * the one seen by the last poll) into the model, in place. */
static int
group_take(gen *g)
{
	int v, rv;

	if ((rv = rl_wgroup_take(g->wg, &v)) != 0)
		return rv;
	g->version = v;
	g->nloads++;
	rl_engine_set_version(g->e, v);
	rl_verbose("weights version %d taken from the weights group %s", v, g->wgo.addr);
	return RL_OK;
}

/* 1 when path (a step directory of --weights-from) is a killed run's
 * leftover, not to be loaded (said once per directory). */
static int
leftover(gen *g, const char *path)
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
		 * asked every 20 ms, generation crawled; back off (1 s doubling to
		 * 30 s) and go on with the weights there are */
		if (prv != RL_OK && prv != RL_ETIMEDOUT) {
			if (g->poll_backoff == 0)
				rl_warn("'%s' does not answer: generating with weights version %d, asking again "
				    "less often", g->sync_url, g->version);
			g->poll_backoff = g->poll_backoff > 0 ? RL_MIN(2 * g->poll_backoff, 30.0) : 1.0;
		} else if (g->poll_backoff > 0) {
			rl_info("'%s' answers again", g->sync_url);
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
				    g->sync_url, g->pending_version, g->version);
			}
			snprintf(g->pending_path, sizeof g->pending_path, "%s/v%llu", g->sync_url,
			    (unsigned long long)latest);
		}
	} else if (g->wg) {
		/* the trainer broadcasts: a version already in memory here, or none */
		if ((rv = rl_wgroup_poll(g->wg, &v)) != 0)
			return rv;
		if (v > g->version && v > g->pending_version) {
			g->pending_version = v;
			snprintf(g->pending_path, sizeof g->pending_path, "weights group %s", g->wgo.addr);
		}
	} else if (g->weights_from && latest_version(g->weights_from, &v, path, sizeof path) == RL_OK &&
	    !leftover(g, path)) {
		if (v > g->version && v > g->pending_version) {
			g->pending_version = v;
			snprintf(g->pending_path, sizeof g->pending_path, "%s", path);
		} else if (v < g->version && !(g->pending_rewind && g->pending_version == v)) {
			/* latest went back: rl-train --resume removed the steps after its
			 * checkpoint, the one loaded here among them; the new run writes
			 * those numbers again, so waiting for a higher one would keep a
			 * dropped policy for as many steps */
			rl_info("'%s' went back to version %d (a resumed trainer): replacing weights version %d",
			    g->weights_from, v, g->version);
			g->pending_version = v;
			g->pending_rewind = 1;
			snprintf(g->pending_path, sizeof g->pending_path, "%s", path);
		}
	}
	if (g->pending_version > g->version || g->pending_rewind) {
		if (g->partial || rl_engine_active(g->e) == 0) {
			if (g->wg) {
				rv = group_take(g);
			} else if (!g->ws) {
				rv = load_weights(g, g->pending_path, g->pending_version);
			} else if ((rv = load_weights_ver(g, g->wbase, g->pending_path)) == RL_ENOENT) {
				/* no single model.safetensors (shards): through a directory,
				 * made only for that and removed at once */
				snprintf(path, sizeof path, "%s/v%d", g->sync_dir, g->pending_version);
				if ((rv = rl_io_mkdir_p(g->sync_dir, 0700)) == RL_OK &&
				    (rv = rl_wver_write_dir(g->wbase, path)) == RL_OK)
					rv = load_weights(g, path, g->pending_version);
				remove_tree(path);
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

static int
poll_weights(gen *g, int force)
{
	double t = rl_now();
	int rv = poll_weights_(g, force);
	g->t_weights += rl_now() - t;
	return rv;
}

/* ---- records -------------------------------------------------------------------------- */

static int
on_done(void *ctx, const rl_gen_sample *s)
{
	gen *g = ctx;
	prompt *p = s->user;
	rl_traj *t = NULL;
	char *text = NULL, *meta = NULL;
	size_t tlen = 0;
	int rv, gsize = p->gsize;

	if ((rv = rl_traj_create(&t)) != 0)
		return rv;
	rl_traj_set_u64(t, RL_TAG_ID, rl_rng_mix(p->group * 0x100000001b3ULL + (uint64_t)s->index + 1));
	rl_traj_set_u64(t, RL_TAG_GROUP, p->group);
	rl_traj_set_i32(t, RL_TAG_INDEX, s->index);
	rl_traj_set_i32(t, RL_TAG_GROUP_SIZE, gsize);
	rl_traj_set_version(t, s->ver_first, s->ver_last);
	rl_traj_set_i32s(t, RL_TAG_PROMPT, p->ids, (size_t)p->nids);
	rl_traj_set_i32s(t, RL_TAG_RESPONSE, s->tok, (size_t)s->n);
	rl_traj_set_f32s(t, RL_TAG_LOGPROBS, s->logp, (size_t)s->n);
	if ((rv = rl_traj_set_str(t, RL_TAG_PROMPT_TEXT, p->text)) != RL_OK) /* utf8_fix'ed when parsed */
		goto out;
	{
		/* a model's vocabulary is often larger than its tokenizer's (padding rows):
		 * such ids have no text */
		int32_t *ids = rl_xmalloc(sizeof(int32_t) * (size_t)(s->n + 1));
		int k = 0, V = rl_tokenizer_vocab_size(g->tok);
		for (int i = 0; i < s->n; i++)
			if (s->tok[i] >= 0 && s->tok[i] < V)
				ids[k++] = s->tok[i];
		rv = rl_tokenizer_decode(&text, &tlen, g->tok, ids, (size_t)k, RL_TOK_SKIP_SPECIAL);
		free(ids);
		if (rv != 0)
			goto out;
	}
	/* the record's text field holds UTF-8 without NUL: anything else is replaced
	 * (a response cut inside a character ends in a partial one) */
	rl_utf8_fix(text, tlen);
	if ((rv = rl_traj_set_strn(t, RL_TAG_RESPONSE_TEXT, text, tlen)) != RL_OK)
		goto out;
	rl_traj_set_str(t, RL_TAG_FINISH, rl_finish_name(s->finish));
	if (s->greedy) {
		cJSON *j = cJSON_Parse(p->meta);
		if (!j)
			j = cJSON_CreateObject();
		cJSON_AddBoolToObject(j, "baseline", 1);
		meta = rl_json_print(j);
		cJSON_Delete(j);
	}
	if ((rv = rl_traj_set_json(t, RL_TAG_META, meta ? meta : p->meta)) != 0)
		goto out;
	rl_traj_set_f32(t, RL_TAG_TEMPERATURE, s->greedy ? 0.0f : g->go.sp.temperature);
	rl_traj_set_f32(t, RL_TAG_TOP_P, g->go.sp.top_p);
	rl_traj_set_i32(t, RL_TAG_TOP_K, g->go.sp.top_k);
	rl_traj_set_i32(t, RL_TAG_MAX_TOKENS, p->max_new ? p->max_new : g->go.max_new);
	rl_traj_set_u64(t, RL_TAG_SEED, s->seed);
	rl_traj_set_f64(t, RL_TAG_TS_GEN_START, s->t_start);
	rl_traj_set_f64(t, RL_TAG_TS_GEN_END, s->t_end);
	if (g->qc) {
		if ((rv = rl_traj_batch_add(p->out, t)) != 0)
			goto out;
	} else if ((rv = rl_traj_writer_put(g->w, t)) != 0) {
		goto out;
	}
	g->samples++;
	g->tokens += (uint64_t)s->n;
	if (--p->remaining == 0) {
		/* a complete group goes downstream at once (pipes: the trainer waits for it) */
		if (g->qc) {
			rl_qput_result res;
			double tp = rl_now();
			/* the put completes the prompt's lease; retried while the broker is busy */
			rv = rl_qclient_put_generated(g->qc, p->out, &res);
			g->t_put += rl_now() - tp;
			if (rv == RL_OK)
				g->q_put += res.accepted;
			else
				rl_error("cannot put the samples of group %llu: %s", (unsigned long long)p->group,
				    rl_strerror(rv));
			rl_traj_batch_destroy(p->out);
		} else {
			double tw = rl_now();
			rv = rl_traj_writer_flush(g->w);
			g->t_write += rl_now() - tw;
		}
		free(p->text);
		free(p->meta);
		free(p->ids);
		free(p);
	}
out:
	free(text);
	free(meta);
	rl_traj_destroy(t);
	return rv;
}

static int
tokens_push(rl_tokens *t, int32_t id)
{
	if (t->n == t->cap) {
		size_t nc = t->cap ? 2 * t->cap : 64;
		int32_t *ni = realloc(t->ids, nc * sizeof *ni);
		if (!ni)
			return RL_ENOMEM;
		t->ids = ni;
		t->cap = nc;
	}
	t->ids[t->n++] = id;
	return RL_OK;
}

static void
eos_add(gen *g, int id)
{
	if (id < 0 || id == g->go.eos_id || g->go.neos_more == (int)RL_ARRAY_LEN(g->eos_more))
		return;
	for (int i = 0; i < g->go.neos_more; i++)
		if (g->eos_more[i] == id)
			return;
	g->eos_more[g->go.neos_more++] = id;
}

/* The ids that end a sequence as EOS, as vLLM has them: config.json's
 * eos_token_id (an id or a list) and also the tokenizer's eos_token and
 * generation_config.json's eos_token_id (vLLM adds the latter to every
 * request's stop ids).  Only config.json's were taken: Llama-3-8B-Instruct,
 * whose config.json names <|end_of_text|> while the chat turn ends with
 * <|eot_id|> (in generation_config.json), ran on past its answer to the
 * token limit.  A generation_config.json that cannot be read is said and
 * left out. */
static void
eos_set(gen *g)
{
	char path[4200];
	cJSON *j = NULL;

	g->go.eos_id = g->m->cfg.eos_id >= 0 ? g->m->cfg.eos_id : rl_tokenizer_eos_id(g->tok);
	g->go.eos_more = g->eos_more;
	g->go.neos_more = 0;
	for (int i = 0; i < g->m->cfg.n_eos_more; i++)
		eos_add(g, g->m->cfg.eos_more[i]);
	eos_add(g, rl_tokenizer_eos_id(g->tok));
	snprintf(path, sizeof path, "%s/generation_config.json", g->model_dir);
	if (access(path, F_OK) != 0)
		return;
	if (rl_json_load(&j, path, 0) != RL_OK) {
		rl_warn("'%s' cannot be read: its eos_token_id does not end sequences", path);
		return;
	}
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *it;
	if (cJSON_IsNumber(e))
		eos_add(g, e->valueint);
	else if (cJSON_IsArray(e))
		cJSON_ArrayForEach(it, e)
			if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < 2147483647.0)
				eos_add(g, it->valueint);
	cJSON_Delete(j);
}

/* Parses a prompt object ({"prompt": text or messages, other keys...}; j is
 * consumed) into tokens, text and meta.  RL_EFORMAT (logged, naming `where`,
 * e.g. "'p.jsonl': line 3") for a bad one.  ids, when not NULL, are the prompt's
 * token ids already (queue records): then "prompt" may be absent. */
static int
parse_prompt_obj(gen *g, cJSON *j, const char *where, const int32_t *pre_ids, size_t npre, prompt **out)
{
	cJSON *pr, *kw = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs");
	rl_tokens ids = { 0 };
	rl_prompt_chat ch = { 0 };
	char *text = NULL;
	size_t tlen = 0;
	int rv = RL_EFORMAT, flags = RL_TOK_GEN_PROMPT;

	*out = NULL;
	pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
	if (rl_json_dup_key(j)) {
		/* which of two "prompt" (or "answer") keys was meant is not known */
		rl_error("%s: key \"%s\" appears twice", where, rl_json_dup_key(j));
		goto out;
	}
	if (pre_ids) {
		for (size_t i = 0; i < npre; i++)
			if ((rv = tokens_push(&ids, pre_ids[i])) != 0)
				goto out;
		if (cJSON_IsString(pr))
			text = rl_xstrdup(pr->valuestring);
		else if ((rv = rl_tokenizer_decode(&text, &tlen, g->tok, pre_ids, npre, 0)) != 0)
			goto out;
	} else if (!pr) {
		rl_error("%s: no \"prompt\" key", where);
		goto out;
	} else if (cJSON_IsString(pr) && !g->chat) {
		/* the text is the model's input as it stands: a special token spelled in it
		 * ("<|im_start|>" of a chat rendered beforehand) is that token, as a Hugging
		 * Face tokenizer (so vLLM, verl), rl-rollout tokenize and rl-train take it; it
		 * was encoded as its bytes.  Chat messages are not matched (apply_chat) */
		if (kw) {
			rl_error("%s: chat_template_kwargs on a text prompt, which no chat template renders "
			    "without --chat", where);
			goto out;
		}
		text = rl_xstrdup(pr->valuestring);
		tlen = strlen(text);
		if ((rv = rl_tokenizer_encode(&ids, g->tok, text, tlen, RL_TOK_SPECIAL)) != 0)
			goto out;
	} else {
		if (!cJSON_IsString(pr) && (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) == 0)) {
			rl_error("%s: \"prompt\" must be a string or a non-empty list of messages", where);
			rv = RL_EFORMAT;
			goto out;
		}
		/* OpenAI content parts, reasoning_content, chat_template_kwargs: lib/rollout/prompt.c */
		rv = rl_prompt_chat_parse(&ch, cJSON_IsString(pr) ? NULL : pr, kw, where);
		if (rv == 0 && cJSON_IsString(pr)) {
			ch.msgs = rl_xcalloc(1, sizeof(*ch.msgs));
			ch.msgs[0] = (rl_chat_msg){ "user", pr->valuestring, NULL };
			ch.n = 1;
		}
		if (rv == 0 && (ch.thinking < 0 ? !g->no_think : ch.thinking) == 0)
			flags |= RL_TOK_NO_THINKING;
		/* --chat-template auto: the model's own template's system turn is put in
		 * when the chat has none; a template neither ChatML nor plain is
		 * refused (RL_ENOTSUP, which stops the run: no chat prompt can be
		 * used); lib/tok/tokenizer.c */
		if (rv == 0 &&
		    ((rv = rl_tokenizer_apply_chat(&ids, g->tok, ch.msgs, ch.n, g->tmpl, flags)) != 0 ||
		     (rv = rl_tokenizer_render_chat(&text, &tlen, g->tok, ch.msgs, ch.n, g->tmpl, flags)) != 0)) {
			rl_error("%s: cannot apply the chat template", where);
			if (rv == RL_EINVAL)
				rv = RL_EFORMAT; /* this line's chat (a role, its kwargs), not the run's */
		}
		if (rv)
			goto out;
	}
	if (ids.n == 0) {
		rl_error("%s: the prompt is empty", where);
		rv = RL_EFORMAT;
		goto out;
	}
	/* prompt_text is UTF-8: a line's Latin-1 byte (or a decoded id that ends
	 * inside a character) becomes '?' there; the ids are what is generated from */
	rl_utf8_fix(text, strlen(text));
	for (size_t i = 0; i < ids.n; i++) {
		if (ids.ids[i] < 0 || ids.ids[i] >= g->m->cfg.vocab_size) {
			rl_error("%s: prompt token %zu is id %d, outside the model's vocabulary [0, %d)", where, i,
			    ids.ids[i], g->m->cfg.vocab_size);
			rl_hint("a tokenizer with more ids than the model's embedding rows?");
			rv = RL_EFORMAT;
			goto out;
		}
	}
	if ((int)ids.n >= g->m->cfg.max_pos) {
		rl_error("%s: the prompt has %zu tokens, the model's context is %d", where,
		    ids.n, g->m->cfg.max_pos);
		rv = RL_ETOOBIG;
		goto out;
	}
	cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
	int max_new = 0;
	{
		cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
		if (mt && !cJSON_IsNull(mt)) {
			if (!cJSON_IsNumber(mt) || !(mt->valuedouble >= 1) || mt->valuedouble != floor(mt->valuedouble)) {
				char shown[40];
				char *s = cJSON_PrintUnformatted(mt);
				snprintf(shown, sizeof shown, "%s", s ? s : "?");
				free(s);
				rl_error("%s: \"max_tokens\" must be an integer >= 1, not %s", where, shown);
				rv = RL_EFORMAT;
				goto out;
			}
			max_new = (int)RL_MIN(mt->valuedouble, 1e7);
			/* --max-tokens is the ceiling (it sizes the engine's buffers): the records
			 * carry the limit applied, not the one asked for */
			if (max_new > g->go.max_new) {
				if (!g->warned_max_tokens)
					rl_warn("%s: \"max_tokens\" %d is more than --max-tokens %d, which applies "
					    "(said once)", where, max_new, g->go.max_new);
				g->warned_max_tokens = 1;
				max_new = g->go.max_new;
			}
		}
	}
	prompt *p = rl_xcalloc(1, sizeof *p);
	p->max_new = max_new;
	p->line = g->lines;
	p->text = text;
	text = NULL;
	p->meta = rl_json_print(j);
	p->ids = ids.ids;
	p->nids = (int)ids.n;
	ids.ids = NULL;
	*out = p;
	rv = RL_OK;
out:
	free(text);
	rl_tokens_fini(&ids);
	rl_prompt_chat_fini(&ch);
	cJSON_Delete(j);
	return rv;
}

/* One prompt line of a file. */
static int
parse_prompt(gen *g, const char *line, size_t len, prompt **out)
{
	char where[512];
	cJSON *j = rl_json_parse_all(line, len); /* one object a line: a second one is an error */
	int k;

	*out = NULL;
	snprintf(where, sizeof where, "'%s': line %llu", g->input, (unsigned long long)g->lines);
	if (memchr(line, 0, len) != NULL) {
		/* cJSON would cut a string there: the prompt or meta changed silently */
		rl_error("%s: a NUL byte at byte %zu, which JSON text cannot hold", where,
		    (size_t)((const char *)memchr(line, 0, len) - line));
		cJSON_Delete(j);
		return RL_EFORMAT;
	}
	if (!j || !cJSON_IsObject(j)) {
		rl_error("%s: not a JSON object", where);
		cJSON_Delete(j);
		return RL_EFORMAT;
	}
	if ((k = rl_json_nul_member(line, len)) >= 0) {
		/* cJSON would cut the string there: the prompt or meta changed silently */
		const cJSON *m = cJSON_GetArrayItem(j, k);
		rl_error("%s: field '%s': \\u0000 (NUL) in its name or value, which text and meta fields cannot hold",
		         where, m && m->string ? m->string : "?");
		cJSON_Delete(j);
		return RL_EFORMAT;
	}
	return parse_prompt_obj(g, j, where, NULL, 0, out);
}

/* Waits (polling --weights-from or --sync) until version >= need, at most
 * --weights-timeout. */
static int
wait_version(gen *g, int need)
{
	int rv = RL_OK;
	double t0 = rl_now(), last = t0, w0 = g->t_weights;
	const char *src = g->weights_from ? g->weights_from : g->sync_url ? g->sync_url : g->wgo.addr;

	while (g->version < need) {
		if ((rv = poll_weights(g, 1)) != 0)
			break;
		if (g->version >= need)
			break;
		if (g->weights_timeout > 0 && rl_now() - t0 > g->weights_timeout) {
			rl_error("no weights version %d in '%s' after %.0f s (have %d)", need, src,
			    g->weights_timeout, g->version);
			rl_hint("is the trainer running and publishing there, with --batch %d (this "
			    "--train-batch)?  a trainer that drops groups (dapo) may need more samples than "
			    "--max-staleness lets through", g->train_batch);
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

/* One engine step; its time, less the puts and writes of the groups it
 * completed, is decoding time. */
static int
engine_step(gen *g)
{
	double t = rl_now(), io = g->t_put + g->t_write;
	int rv = rl_engine_step(g->e, on_done, g);
	g->t_engine += rl_now() - t - (g->t_put + g->t_write - io);
	return rv;
}

static void
progress(gen *g, int end)
{
	double dt = rl_now() - g->t0;
	if (end) {
		rl_progress_done(&g->prog);
		if (!g->quiet)
			rl_info("%llu prompts, %llu samples, %llu tokens in %.1f s (%.0f tokens/s)%s",
			    (unsigned long long)g->groups, (unsigned long long)g->samples,
			    (unsigned long long)g->tokens, dt, dt > 0 ? g->tokens / dt : 0.0,
			    g->bad ? "; bad lines skipped" : "");
		if (g->bad && !g->quiet)
			rl_info("%llu bad prompt lines skipped", (unsigned long long)g->bad);
		if (g->resume_dir && !g->quiet)
			rl_info("%llu prompts not generated: their groups were done in '%s'",
			    (unsigned long long)g->skipped, g->resume_path);
		rl_verbose("time: decoding %.2f s, new weights %.2f s (%d loaded), waiting for weights %.2f s, "
		    "leases %.2f s, puts %.2f s, output %.2f s, other %.2f s", g->t_engine, g->t_weights, g->nloads,
		    g->t_wait, g->t_lease, g->t_put, g->t_write,
		    dt - g->t_engine - g->t_weights - g->t_wait - g->t_lease - g->t_put - g->t_write);
	} else {
		rl_progress_draw(&g->prog, -1, "%llu prompts, %llu samples, %.0f tokens/s",
		    (unsigned long long)g->groups, (unsigned long long)g->samples, dt > 0 ? g->tokens / dt : 0.0);
	}
}

static int
run_generate(gen *g)
{
	FILE *in = NULL;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int rv, eof = 0, fail = RL_OK, have_line = 0;
	double last_prog = 0;

	if ((rv = rl_io_fopen(&in, g->input, "r")) != 0)
		return rv;
	g->t0 = rl_now();
	rl_progress_init(&g->prog, g->quiet);
	for (;;) {
		/* keep enough requests waiting to refill every free slot */
		while (!eof && rl_engine_waiting(g->e) * RL_MAX(g->n, 1) < g->go.slots) {
			prompt *p;
			if (!have_line) {
				errno = 0;
				if ((len = getline(&line, &cap, in)) < 0) {
					if (ferror(in)) {
						rl_error("cannot read '%s': %s", g->input, strerror(errno));
						rv = RL_EIO;
						goto out;
					}
					eof = 1;
					break;
				}
				have_line = 1;
			}
			/* --resume: the group this line gets, when it is valid, was done */
			int done = g->resume_dir && rl_gset_has(&g->done, g->nonce | (g->groups & 0xffffffffULL));
			if (!done && (g->weights_from || g->ws || g->wg) && g->max_staleness >= 0) {
				/* the staleness gate: group k belongs to trainer batch k / train_batch
				 * (groups skipped by --resume count as emitted) */
				int need = (int)(g->groups / (uint64_t)g->train_batch) - g->max_staleness;
				if (g->version < need) {
					if (rl_engine_active(g->e) > 0 || rl_engine_waiting(g->e) > 0)
						break; /* generate what we have, check again next step */
					if ((rv = rl_traj_writer_flush(g->w)) != 0 || (rv = wait_version(g, need)) != 0)
						goto out;
				}
			}
			have_line = 0;
			g->lines++;
			while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
				line[--len] = 0;
			if (len == 0 || strspn(line, " \t") == (size_t)len)
				continue;
			if ((rv = parse_prompt(g, line, (size_t)len, &p)) != 0) {
				if (g->skip_bad && (rv == RL_EFORMAT || rv == RL_ETOOBIG)) {
					g->bad++;
					continue;
				}
				/* finish and write what is already running, then fail */
				if (rv == RL_EFORMAT || rv == RL_ETOOBIG)
					rl_hint("--skip-bad skips such lines; the prompts before it are still written");
				fail = rv;
				eof = 1;
				break;
			}
			p->group = g->nonce | (g->groups & 0xffffffffULL);
			if (done) {
				/* trained (or dropped) before: the counter moves on, nothing is generated */
				free(p->text);
				free(p->meta);
				free(p->ids);
				free(p);
				g->groups++;
				g->skipped++;
				continue;
			}
			p->remaining = p->gsize = g->n + (g->greedy ? 1 : 0);
			rv = rl_engine_submit(g->e, p->ids, p->nids, g->n, g->greedy, p->max_new,
			    rl_rng_u64(g->seed, p->line), p);
			if (rv != RL_OK) {
				rl_error("'%s': line %llu: cannot generate for this prompt", g->input,
				    (unsigned long long)p->line);
				free(p->text);
				free(p->meta);
				free(p->ids);
				free(p);
				if (g->skip_bad) {
					g->bad++;
					continue;
				}
				fail = rv;
				eof = 1;
				break;
			}
			g->groups++;
		}
		if ((rv = poll_weights(g, 0)) != 0)
			goto out;
		if (rl_engine_active(g->e) == 0 && rl_engine_waiting(g->e) == 0) {
			if (eof)
				break;
			continue;
		}
		if ((rv = engine_step(g)) != 0)
			goto out;
		if (rl_now() - last_prog > 0.5) {
			progress(g, 0);
			last_prog = rl_now();
		}
	}
	rv = rl_traj_writer_flush(g->w);
	if (rv == RL_OK)
		rv = fail;
out:
	progress(g, 1);
	free(line);
	if (in && in != stdin)
		fclose(in);
	return rv;
}

/* ---- score mode ------------------------------------------------------------------------ */

static int
run_score(gen *g)
{
	FILE *in = NULL;
	rl_traj_reader *rd = NULL;
	rl_traj *t;
	int rv, tag, T = g->m->cfg.max_pos;
	int32_t *tok = NULL, *tgt = NULL;
	float *lp = NULL, *vals = NULL;
	uint64_t n = 0;

	tag = rl_traj_tag_parse(g->score_field);
	if (tag < 0) {
		unsigned u;
		char c;
		if (sscanf(g->score_field, "t%u%c", &u, &c) != 1 || u == 0 || u > RL_TAG_MAX) {
			rl_error("unknown field '%s' for --score", g->score_field);
			rl_hint("use logprobs, ref_logprobs or t<tag number>");
			return RL_EINVAL;
		}
		tag = (int)u;
	}
	if (tag <= RL_TAG_CORE_MAX) {
		int scalar = 1, dt = rl_traj_tag_dtype((unsigned)tag, &scalar);
		if (dt != RL_F32 || scalar) {
			rl_error("--score %s: not a per-token f32 field; the log-probs would replace it", g->score_field);
			rl_hint("use logprobs, ref_logprobs or a user tag t<N> with N >= %d", RL_TAG_USER_MIN);
			return RL_EINVAL;
		}
	}
	if ((rv = rl_model_train_reserve(g->m, T)) != 0)
		return rv;
	tok = rl_xcalloc((size_t)T, 4);
	tgt = rl_xcalloc((size_t)T, 4);
	lp = rl_xcalloc((size_t)T, 4);
	vals = rl_xcalloc((size_t)T, 4);
	if ((rv = rl_io_fopen(&in, g->input, "rb")) != 0 ||
	    (rv = rl_traj_reader_open_file(&rd, in, g->input, NULL)) != 0)
		goto out;
	for (;;) {
		const int32_t *p, *r;
		size_t np, nr;
		float temp = 1.0f;
		if ((rv = rl_traj_reader_next(rd, &t)) != 0)
			goto out;
		if (!t)
			break;
		n++;
		if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &p, &np) != RL_OK ||
		    rl_traj_get_i32s(t, RL_TAG_RESPONSE, &r, &nr) != RL_OK || np == 0) {
			rl_error("'%s': record %llu: no prompt and response token ids to score", g->input,
			    (unsigned long long)n);
			rv = RL_EFORMAT;
			goto out;
		}
		if ((int)(np + nr) > T) {
			rl_error("'%s': record %llu: %zu tokens exceed the model's context of %d", g->input,
			    (unsigned long long)n, np + nr, T);
			rv = RL_ETOOBIG;
			goto out;
		}
		for (size_t k = 0; k < np + nr; k++) {
			int32_t id = k < np ? p[k] : r[k - np];
			if (id < 0 || id >= g->m->cfg.vocab_size) {
				rl_error("'%s': record %llu: token id %d at '%s' index %zu is outside the vocabulary "
				    "(0..%d)", g->input, (unsigned long long)n, id, k < np ? "prompt" : "response",
				    k < np ? k : k - np, g->m->cfg.vocab_size - 1);
				rv = RL_EFORMAT;
				goto out;
			}
		}
		if (rl_traj_get_f32(t, RL_TAG_TEMPERATURE, &temp) != RL_OK || !(temp > 0))
			temp = 1.0f;
		int L = (int)(np + nr) - 1;
		for (int i = 0; i < L; i++) {
			tok[i] = i < (int)np ? p[i] : r[i - np];
			int j = i - ((int)np - 1);
			tgt[i] = j >= 0 && j < (int)nr ? r[j] : -1;
		}
		if (nr > 0) {
			if ((rv = rl_model_forward(g->m, lp, NULL, tok, tgt, NULL, NULL, 1, L, temp)) != 0)
				goto out;
			for (size_t j = 0; j < nr; j++)
				vals[j] = lp[np - 1 + j];
		}
		rl_traj *c = NULL;
		if ((rv = rl_traj_dup(&c, t)) != 0)
			goto out;
		rl_traj_set_f32s(c, (unsigned)tag, vals, nr);
		rv = rl_traj_writer_put(g->w, c);
		rl_traj_destroy(c);
		if (rv)
			goto out;
	}
	rv = rl_traj_writer_flush(g->w);
	if (!g->quiet)
		rl_info("%llu records scored into '%s'", (unsigned long long)n, g->score_field);
out:
	rl_traj_reader_close(rd);
	if (in && in != stdin)
		fclose(in);
	free(tok);
	free(tgt);
	free(lp);
	free(vals);
	return rv;
}

/* ---- queue mode ------------------------------------------------------------------------ */

static volatile sig_atomic_t stop_requested;

static void
on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

/* A leased prompt record into a prompt: its token ids, or its prompt_text, or
 * meta.prompt (text or messages); the rest of meta is kept. */
static int
prompt_from_record(gen *g, const rl_traj *t, prompt **out)
{
	const char *metas, *ptext;
	const int32_t *ids = NULL;
	size_t nids = 0;
	cJSON *j = NULL;
	uint64_t id = 0, group = 0;
	char where[128];
	int rv;

	rl_traj_get_u64(t, RL_TAG_ID, &id);
	snprintf(where, sizeof where, "queue prompt %llu", (unsigned long long)id);
	if (rl_traj_get_u64(t, RL_TAG_GROUP, &group) != RL_OK)
		group = id;
	if (rl_traj_get_str(t, RL_TAG_META, &metas, NULL) == RL_OK)
		j = cJSON_Parse(metas);
	if (!j || !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		j = cJSON_CreateObject();
	}
	if (rl_traj_get_str(t, RL_TAG_PROMPT_TEXT, &ptext, NULL) == RL_OK) {
		cJSON_DeleteItemFromObjectCaseSensitive(j, "prompt");
		cJSON_AddStringToObject(j, "prompt", ptext);
	}
	if (rl_traj_get_i32s(t, RL_TAG_PROMPT, &ids, &nids) != RL_OK || nids == 0)
		ids = NULL;
	if ((rv = parse_prompt_obj(g, j, where, ids, nids, out)) != 0)
		return rv;
	(*out)->group = group;
	return RL_OK;
}

static int
run_queue(gen *g)
{
	rl_qlease lease;
	rl_qclient_opts qo;
	rl_traj *t = NULL;
	int rv = RL_OK, G = g->n + (g->greedy ? 1 : 0);
	double idle_since = rl_now(), last_prog = 0, empty_since = 0;

	rl_stop_signals(on_signal, 0);
	rl_qlease_init(&lease);
	rl_qclient_opts_stage(&qo, g->broker_timeout);
	if ((rv = rl_qclient_open(&g->qc, g->queue_url, &qo)) == 0)
		rl_qclient_set_stop(g->qc, &stop_requested);
	if (rv != 0)
		return rv;
	if ((rv = rl_traj_create(&t)) != 0)
		goto out;
	if (rl_wstat_open(&g->wst, g->queue_url, "rollout", strcmp(g->ops->name, "cpu") == 0 ? "cpu" : g->device) != 0)
		rl_warn("no stats reports to the broker");
	g->t0 = rl_now();
	rl_progress_init(&g->prog, g->quiet);
	for (;;) {
		int room = g->go.slots - rl_engine_active(g->e) - rl_engine_waiting(g->e) * G;
		uint64_t s0 = g->samples, k0 = g->tokens;
		int busy = rl_engine_active(g->e) > 0;
		/* new weights are fetched and loaded while nothing is generated: idle */
		rl_wstat_phase(g->wst, RL_WSTAT_IDLE);
		if ((rv = poll_weights(g, 0)) != 0)
			goto out;
		/* while decoding, a lease that found nothing is not retried for 10 ms
		 * (a round trip per decoding step would cost as much as the step) */
		if (!stop_requested && room >= G && (!busy || rl_now() - empty_since >= 0.01)) {
			double tl = rl_now();
			rv = rl_qclient_lease_prompts(g->qc, (uint32_t)(room / G), (uint32_t)G, busy ? 0 : 200, &lease);
			g->t_lease += rl_now() - tl;
			/* no reply for --broker-timeout: the broker is gone (logged); what
			 * is being generated is not put, its prompts' leases expire there */
			if (rv != RL_OK && (rv != RL_ETIMEDOUT || rl_qclient_gone(g->qc)) && rv != RL_EBUSY)
				goto out;
			rv = RL_OK;
			empty_since = rl_qlease_count(&lease) ? 0 : rl_now();
			/* the trainer moved on: its version is on the weights source (it
			 * publishes before it tells the broker), so new prompts start on it */
			if (rl_qlease_count(&lease) && (int)lease.version > g->version && (g->ws || g->weights_from || g->wg) &&
			    (rv = poll_weights(g, 1)) != 0)
				goto out;
			for (size_t i = 0; i < rl_qlease_count(&lease); i++) {
				prompt *p;
				rl_qack_result ares;
				if ((rv = rl_traj_batch_get(lease.batch, i, t)) != 0)
					goto out;
				int prv = prompt_from_record(g, t, &p);
				if (prv == RL_ENOTSUP) {
					rv = prv; /* no chat prompt can be used (a foreign template): not one to drop */
					goto out;
				}
				if (prv != RL_OK) {
					/* an unusable prompt is given up (acknowledged), not retried forever */
					uint64_t id = 0;
					rl_traj_get_u64(t, RL_TAG_ID, &id);
					rl_qclient_ack_ids(g->qc, lease.id, RL_QACK_DONE, &id, 1, &ares);
					g->q_bad++;
					continue;
				}
				p->remaining = p->gsize = G;
				rl_traj_batch_create(&p->out);
				if (rl_engine_submit(g->e, p->ids, p->nids, g->n, g->greedy, p->max_new,
				    rl_rng_u64(g->seed, p->group), p) != RL_OK) {
					uint64_t id = 0;
					rl_traj_get_u64(t, RL_TAG_ID, &id);
					rl_qclient_ack_ids(g->qc, lease.id, RL_QACK_DONE, &id, 1, &ares);
					rl_traj_batch_destroy(p->out);
					free(p->text);
					free(p->meta);
					free(p->ids);
					free(p);
					g->q_bad++;
					continue;
				}
				g->groups++;
			}
		}
		if (rl_engine_active(g->e) == 0 && rl_engine_waiting(g->e) == 0) {
			if (stop_requested)
				break;
			if (g->idle_exit > 0 && rl_now() - idle_since > g->idle_exit)
				break;
			continue;
		}
		idle_since = rl_now();
		rl_wstat_phase(g->wst, RL_WSTAT_BUSY);
		if ((rv = engine_step(g)) != 0)
			goto out;
		rl_wstat_add(g->wst, g->samples - s0, g->tokens - k0);
		if (rl_now() - last_prog > 0.5) {
			progress(g, 0);
			last_prog = rl_now();
		}
	}
out:
	progress(g, 1);
	if (g->q_bad)
		rl_warn("%llu leased prompts could not be used (acknowledged and dropped)",
		    (unsigned long long)g->q_bad);
	rl_traj_destroy(t);
	rl_qlease_fini(&lease);
	rl_wstat_close(g->wst);
	g->wst = NULL;
	rl_qclient_close(g->qc);
	g->qc = NULL;
	return rv;
}

/* --resume DIR: the checkpoint rl-train --resume takes, its groups done, and
 * the nonce they were generated under (kept, so that the counter gives every
 * prompt the group it had).  RL_OK, or an error (logged). */
static int
resume_open(gen *g)
{
	cJSON *state = NULL, *gd;
	char where[4200];
	uint64_t nonce = 0;
	int rv, have = 0;

	if ((rv = rl_ckpt_find_full(g->resume_dir, g->resume_path, sizeof g->resume_path, &g->resume_step, &state,
	    0)) != 0) {
		rl_hint("--resume takes rl-train's --out directory of the run to continue");
		return rv;
	}
	snprintf(where, sizeof where, "'%s/trainer_state.json': groups_done", g->resume_path);
	if (!(gd = cJSON_GetObjectItem(state, "groups_done"))) {
		rl_error("%s: missing (written by an older rl-train): the groups trained cannot be told", where);
		rl_hint("continue that run on a file of the records (rl-train --resume skips them by position)");
		rv = RL_EFORMAT;
		goto out;
	}
	if ((rv = rl_gset_from_json(&g->done, gd, where)) != 0)
		goto out;
	for (size_t i = 0; i < g->done.n; i++) {
		uint64_t lo = g->done.r[i][0] >> 32, hi = g->done.r[i][1] >> 32;
		if (!have) {
			nonce = lo;
			have = 1;
		}
		if (lo != nonce || hi != nonce) {
			rl_error("%s: groups of several rl-rollout runs (nonces 0x%08llx and 0x%08llx): which "
			    "prompts were trained cannot be told from one prompt file", where, (unsigned long long)nonce,
			    (unsigned long long)(lo != nonce ? lo : hi));
			rl_hint("rl-rollout --resume continues a run whose groups all came from one rl-rollout "
			    "(itself started with --resume after a stop); generate anew into a new --out instead");
			rv = RL_EINVAL;
			goto out;
		}
	}
	if (have)
		g->nonce = nonce << 32;
out:
	cJSON_Delete(state);
	return rv;
}

int
rl_cmd_generate(int argc, char **argv)
{
	gen g = { 0 };
	int c, nstop = 0, nstopid = 0, rv, verbosity = RL_LOG_NORMAL, stdout_closed = 0;
	double v;
	size_t kv;

	rl_gen_opts_default(&g.go);
	g.n = 1;
	g.device = "cpu";
	g.input = "-";
	g.tmpl = RL_CHAT_AUTO;
	g.max_staleness = -1;
	g.train_batch = 8;
	g.pending_version = -1;
	g.weights_timeout = 600;
	g.broker_timeout = RL_QCLIENT_BROKER_TIMEOUT_S;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:n:o:qvh", longopts, NULL)) != -1) {
		const char *a = optarg;
#define NUM(lo, hi) do { if (parse_num(a, lo, hi, &v)) return num_error(c, a, lo, hi); } while (0)
/* a count or an id: a whole number (2.5 was taken as 2) */
#define INT(lo, hi) do { if (parse_num(a, lo, hi, &v) || v != floor(v)) return num_error(c, a, lo, hi); } while (0)
		switch (c) {
		case 'm': g.model_dir = a; break;
		case 'n': INT(1, 65536); g.n = (int)v; break;
		case 'o': g.out_path = a; break;
		case O_JSONL: g.jsonl = 1; break;
		case O_TEMP:
			NUM(0, 100);
			/* below 1e-5 is greedy, as in vLLM: logits / 1e-45 overflowed to inf, and
			 * every log-prob was NaN */
			g.go.sp.temperature = v < 1e-5 ? 0.0f : (float)v;
			break;
		case O_TOPP: NUM(0, 1); g.go.sp.top_p = (float)v; break;
		case O_TOPK: INT(0, 1e9); g.go.sp.top_k = (int)v; break;
		case O_MAXTOK: INT(1, 1e7); g.go.max_new = (int)v; break;
		case O_STOP:
			if (nstop == 64 || !*a)
				return usage_error("too many or empty --stop '%s'", a);
			g.stops[nstop++] = a;
			break;
		case O_STOPID:
			INT(0, 2e9);
			if (nstopid == 64)
				return usage_error("too many --stop-id ('%s')", a);
			g.stop_ids[nstopid++] = (int32_t)v;
			break;
		case O_SEED:
			if (parse_seed(a, &g.seed))
				return usage_error("--seed: '%s' is not a whole number from 0 to 2^64-1", a);
			break;
		case O_CHAT: g.chat = 1; break;
		case O_NOTHINK: g.no_think = 1; break;
		case O_TMPL:
			if ((g.tmpl = rl_chat_template_parse(a)) < 0)
				return usage_error("--chat-template: unknown chat template '%s' (auto, chatml, plain)", a);
			break;
		case O_GREEDY: g.greedy = 1; break;
		case O_SLOTS: INT(1, 65536); g.go.slots = (int)v; break;
		case O_DSTEPS: INT(1, RL_GEN_MAX_STEPS); g.go.decode_steps = (int)v; break;
		case O_KVMEM:
			if (parse_bytes(a, &kv))
				return usage_error("--kv-mem: bad size '%s' (bytes, with K, M or G; at most 1024G)", a);
			g.go.kv_mem = kv;
			break;
		case O_DEVICE:
			if (!rl_ops_device_ok(a))
				return usage_error("--device: want cpu, cuda, cuda:N or auto, not '%s'", a);
			g.device = a;
			break;
		case O_WFROM: g.weights_from = a; break;
		case O_RESUME: g.resume_dir = a; break;
		case O_STALE: INT(0, 1e9); g.max_staleness = (int)v; break;
		case O_TBATCH: INT(1, 1e9); g.train_batch = (int)v; break;
		case O_PARTIAL: g.partial = 1; break;
		case O_SKIPBAD: g.skip_bad = 1; break;
		case O_SCORE: g.score_field = a; break;
		case O_QUEUE: g.queue_url = a; break;
		case O_IDLE: NUM(0, 1e9); g.idle_exit = v; break;
		case O_BTIMEOUT: NUM(0, 1e9); g.broker_timeout = v; break;
		case O_WTIMEOUT: NUM(0, 1e9); g.weights_timeout = v; break;
		case O_SYNC: g.sync_url = a; break;
		case O_WGROUP: g.wgo.addr = a; break;
		case O_WGRANK: INT(1, 65535); g.wgo.rank = (int)v; break;
		case O_WGSIZE: INT(2, 65536); g.wgo.world = (int)v; break;
		case O_WGBACK:
			if (strcmp(a, "auto") && strcmp(a, "cpu") && strcmp(a, "nccl") && strcmp(a, "ipc"))
				return usage_error("--weights-group-backend takes auto, cpu, nccl or ipc, not '%s'", a);
			g.wgo.backend = a;
			break;
		case O_STRANS:
			if (rl_wsync_transport_parse(a, &g.sync_transport) != 0)
				return usage_error("--sync-transport: want auto, shm, stream, nng or file, not '%s'", a);
			break;
		case 'q': verbosity = RL_LOG_QUIET; g.quiet = 1; break;
		case 'v': verbosity++; break;
		case 'h':
			fputs(usage_text, stdout);
			return rl_io_close_stdout() ? 1 : 0;
		default:
			fprintf(stderr, "rl-rollout: hint: rl-rollout --help lists the options\n");
			return 2;
		}
#undef NUM
	}
	rl_log_set_level(verbosity);
	if (!g.model_dir && !g.resume_dir)
		return usage_error("%s", "no model: -m MODEL_DIR");
	if (g.resume_dir && (g.queue_url || g.score_field))
		return usage_error("%s", "--resume continues a prompt file's run (pipe mode); with --queue the "
		    "broker's journal keeps the state, and --score has none");
	if (optind + 1 < argc)
		return usage_error("more than one input ('%s')", argv[optind + 1]);
	if (optind < argc)
		g.input = argv[optind];
	if (g.max_staleness >= 0 && !g.weights_from && !g.sync_url && !g.wgo.addr)
		return usage_error("%s", "--max-staleness needs --weights-from DIR, --sync URL or --weights-group");
	if (g.wgo.addr && (!g.wgo.rank || !g.wgo.world || g.wgo.rank >= g.wgo.world))
		return usage_error("%s", "--weights-group needs --weights-group-rank R and --weights-group-size N, "
		    "1 <= R < N");
	if (!g.wgo.addr && (g.wgo.rank || g.wgo.world || g.wgo.backend))
		return usage_error("%s", "--weights-group-rank/-size/-backend need --weights-group HOST:PORT");
	if (g.wgo.addr && (g.weights_from || g.sync_url))
		return usage_error("%s", "--weights-group is a third way to get weights: choose one of it, "
		    "--weights-from and --sync");
	if (g.sync_transport && !g.sync_url)
		return usage_error("%s", "--sync-transport needs --sync URL");
	if (g.weights_from && g.sync_url)
		return usage_error("%s", "--weights-from and --sync are two ways to get weights: choose one");
	if (g.go.slots < g.n + g.greedy)
		g.go.slots = g.n + g.greedy;
	g.go.stop = g.stops;
	g.go.nstop = nstop;
	g.go.stop_ids = g.stop_ids;
	g.go.nstop_ids = nstopid;
	g.nonce = (rl_rng_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32)) & 0xffffffff00000000ULL);
	g.left_after = -1;
	if (g.resume_dir && (rv = resume_open(&g)) != 0) {
		rl_gset_fini(&g.done);
		return 1;
	}
	if (!g.model_dir)
		g.model_dir = g.resume_path;

	if (g.out_path && rl_io_same_file(g.input, g.out_path)) {
		rl_error("-o '%s' is the input '%s': writing it would empty it before it is read", g.out_path, g.input);
		rl_hint("write to another file, then rename it");
		return 2;
	}
	if (!g.queue_url && !g.jsonl && (!g.out_path || strcmp(g.out_path, "-") == 0) && isatty(STDOUT_FILENO)) {
		rl_error("refusing to write a binary stream to a terminal");
		rl_hint("add --jsonl, -o FILE, or pipe into rl-reward / rl-queue cat");
		return 2;
	}

	rv = RL_OK;
	if ((rv = rl_ops_open(&g.ops, g.device)) != 0)
		goto out;
	if ((rv = rl_model_open(&g.m, g.model_dir, g.ops)) != 0)
		goto out;
	if ((rv = rl_tokenizer_open(&g.tok, g.model_dir)) != 0)
		goto out;
	if (g.no_think && (g.tmpl != RL_CHAT_AUTO || !rl_tokenizer_chat_thinking(g.tok))) {
		rl_error("--no-thinking: the %s chat template has no enable_thinking switch",
		    g.tmpl != RL_CHAT_AUTO ? rl_chat_template_name(g.tmpl) : "model's");
		rl_hint("the switch is Qwen3's template's (--chat-template auto on a Qwen3 model)");
		rv = RL_EINVAL;
		goto out;
	}
	/* a --stop spelled as a special token: such tokens do not show in the text, so it
	 * never matched; it ends a sequence as that token's --stop-id would (the same tokens) */
	for (int i = 0; i < nstop; i++) {
		int32_t id = rl_tokenizer_lookup(g.tok, g.stops[i], strlen(g.stops[i]));
		if (id >= 0 && id < g.m->cfg.vocab_size && rl_tokenizer_is_special(g.tok, id) && nstopid < 64) {
			g.stop_ids[nstopid++] = id;
			rl_verbose("--stop '%s' is the special token %d: it stops as --stop-id %d", g.stops[i], id, id);
		}
	}
	g.go.nstop_ids = nstopid;
	eos_set(&g);
	for (int i = 0; i < nstopid; i++)
		if (g.stop_ids[i] >= g.m->cfg.vocab_size) {
			/* it could never be drawn: the sequence would run on as if no --stop-id were given */
			rl_error("--stop-id %d is outside the model's vocabulary [0, %d)", (int)g.stop_ids[i],
			    g.m->cfg.vocab_size);
			rl_hint("rl-rollout tokenize -m MODEL shows the ids of a text");
			rv = RL_EINVAL;
			goto out;
		}
	if (g.out_path && strcmp(g.out_path, "-") != 0) {
		if (!(g.out = fopen(g.out_path, "wb"))) {
			rl_error("cannot open '%s': %s", g.out_path, strerror(errno));
			rv = RL_EIO;
			goto out;
		}
	} else {
		g.out = stdout;
		/* waiting for weights, it must stop when the stage after it has */
		if (!g.queue_url)
			rl_io_watch_stdout();
	}
	{
		rl_traj_writer_opts wo = { 0 };
		wo.format = g.jsonl ? RL_TRAJ_JSONL : RL_TRAJ_BINARY;
		if ((rv = rl_traj_writer_open_file(&g.w, g.out, g.out_path ? g.out_path : "-", &wo)) != 0)
			goto out;
	}
	if (g.score_field) {
		rv = run_score(&g);
		goto out;
	}
	if ((rv = rl_engine_create(&g.e, g.m, g.tok, &g.go)) != 0)
		goto out;
	if (g.sync_url) {
		snprintf(g.sync_dir, sizeof g.sync_dir, "%s/rl-rollout-sync.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
		    (long)getpid());
		/* sync_dir is made only when a sharded version must go through it:
		 * made here, it was left in TMPDIR by every run that failed or was
		 * killed */
		if ((rv = rl_wsync_open_with(&g.ws, g.sync_url, 0, g.sync_transport)) != 0)
			goto out;
		if ((rv = poll_weights(&g, 1)) != 0)
			goto out;
	}
	if (g.wgo.addr) {
		/* joins the trainer's group, then starts from its weights */
		int v;
		g.wgo.timeout = g.weights_timeout > 0 ? g.weights_timeout : 1e9;
		if ((rv = rl_wgroup_open(&g.wg, &g.wgo, g.m)) != 0 ||
		    (rv = rl_wgroup_wait(g.wg, g.weights_timeout > 0 ? g.weights_timeout : 1e9, &v)) != 0 ||
		    (rv = group_take(&g)) != 0)
			goto out;
	}
	if (g.resume_dir) {
		/* the checkpoint's weights and version; -m gives the architecture when it is another directory */
		if (strcmp(g.model_dir, g.resume_path) != 0) {
			if ((rv = load_weights(&g, g.resume_path, g.resume_step)) != 0)
				goto out;
		} else {
			g.version = g.resume_step;
			rl_engine_set_version(g.e, g.resume_step);
		}
		rl_info("resuming from '%s': weights version %d, nonce 0x%08llx, %llu groups done", g.resume_path,
		    g.resume_step, (unsigned long long)(g.nonce >> 32), (unsigned long long)rl_gset_count(&g.done));
	}
	if (g.weights_from) {
		int ver;
		char path[4096];
		cJSON *st = NULL;
		/* a resuming trainer removes what is newer than its checkpoint: remember
		 * those directories now, before it can have removed them */
		if (rl_ckpt_find_full(g.weights_from, path, sizeof path, &g.left_after, &st, 1) != RL_OK)
			g.left_after = -1;
		cJSON_Delete(st);
		/* without a full checkpoint no trainer can resume there (and a new run
		 * into it is refused): its steps are a live trainer's, not leftovers */
		if (g.left_after >= 0 && (rv = rl_ckpt_leftovers_scan(&g.left, g.weights_from, g.left_after)) != 0)
			goto out;
		if (latest_version(g.weights_from, &ver, path, sizeof path) == RL_OK && ver > g.version &&
		    !leftover(&g, path) && (rv = load_weights(&g, path, ver)) != 0)
			goto out;
	}
	rv = g.queue_url ? run_queue(&g) : run_generate(&g);
out:
	if (g.w) {
		int r2 = rl_traj_writer_close(g.w);
		if (!rv)
			rv = r2;
	}
	if (g.out && g.out != stdout && fclose(g.out) != 0 && !rv) {
		rl_error("cannot write '%s': %s", g.out_path, strerror(errno));
		rv = RL_EIO;
	}
	if (g.wg) {
		/* the records go downstream first (the trainer ends the group only
		 * once it has them all), then the group's end is awaited */
		int r2 = RL_OK;
		if (g.out == stdout) {
			g.out = NULL;
			r2 = rl_io_close_stdout() ? RL_EIO : RL_OK;
			stdout_closed = 1;
		}
		if (!rv)
			rv = r2;
		if (!rv)
			rl_verbose("waiting for the trainer to end the weights group");
		r2 = rl_wgroup_close(g.wg, rv == 0);
		if (!rv)
			rv = r2;
	}
	rl_engine_destroy(g.e);
	rl_gset_fini(&g.done);
	rl_ckpt_leftovers_fini(&g.left);
	rl_wver_destroy(g.wbase);
	rl_wsync_close(g.ws);
	rl_tokenizer_close(g.tok);
	rl_model_close(g.m);
	rl_ops_close(g.ops);
	if (rv)
		return 1;
	return stdout_closed ? 0 : rl_io_close_stdout() ? 1 : 0;
}

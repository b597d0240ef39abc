/*
 * wdir.h — the file transport for weights: a directory where versions appear
 * atomically, for shared filesystems and for one machine.
 *
 *   DIR/v000042/      a complete checkpoint directory (config.json,
 *                     model.safetensors, ..., rlsync.json with sizes and hashes)
 *   DIR/latest        symlink -> v000042, replaced atomically (rename)
 *   DIR/.tmp-*        versions being written (invisible to readers)
 *
 * A version directory appears by rename(2) of a finished, fsync'd temporary
 * directory, then `latest` is switched, then old versions are pruned.  A
 * reader resolves `latest` once and reads that directory; rlsync.json lets it
 * check what it read (rl_wver_read_dir).  Pruning keeps the newest K, so a
 * reader has K-1 publications' time to finish reading.
 *
 * Writers: rl-train (rl_wdir_publish), rl-sync serve --data-dir, rl-sync pull
 * --out.  Readers: rl-rollout --weights-from DIR (rl_wdir_watch_*).
 * Leaves out: locking between two writers of one DIR (one writer per DIR).
 */
#ifndef RL_WDIR_H
#define RL_WDIR_H

#include <stddef.h>
#include <stdint.h>

#include "sync/wver.h"

/* rl_wver_read_dir loads every regular, non-hidden file of a checkpoint
 * directory (not recursive; rlsync.json is the manifest, not a blob; the
 * trainer's state, optimizer*.safetensors and trainer_state.json, is not
 * weights and is skipped) as a
 * version numbered `version`.  If the directory holds rlsync.json (a version
 * directory written by rl_wver_write_dir / rl_wdir_publish), version 0 means
 * "take its number", and every blob is checked against it (RL_ECHECKSUM on a
 * mismatch, RL_ENOENT for a missing file).  Files are sorted by name. */
int rl_wver_read_dir(rl_wver **out, const char *dir, uint64_t version);
/* rl_wver_write_dir writes v as a directory `dir` (files + rlsync.json),
 * atomically: into a hidden temporary sibling, fsync'd, then renamed.
 * RL_EEXIST if dir exists. */
int rl_wver_write_dir(const rl_wver *v, const char *dir);

/* rl_wdir_publish copies the regular files of src_dir into DIR/vNNNNNN
 * (creating DIR if needed), switches latest, and prunes to `keep` versions
 * (0: no pruning).  RL_ESTALE if version is not above the current latest,
 * RL_ENOENT if src_dir is missing. */
int rl_wdir_publish(const char *dir, const char *src_dir, uint64_t version, int keep);
/* rl_wdir_publish_ver: the same from an in-memory, hashed version.  It is
 * recorded on the line of DIR's latest version (or v->lineage if higher). */
int rl_wdir_publish_ver(const char *dir, const rl_wver *v, int keep);

/* rl_wdir_rewind_ver: the same, for a trainer resumed from version
 * v->version while DIR holds newer ones (the trainer's versions after its
 * checkpoint, lost with it): those and the old v->version are dropped and v
 * becomes the latest, on a new line: *lineage (recorded in its rlsync.json)
 * is one more than the latest's, or v->lineage if that is more (a follower
 * copying a server's line).  Crash-safe: v is written under a temporary
 * name first, the dropped versions go newest first, then v is renamed in.
 * When DIR holds nothing newer it is an ordinary publish, and nothing at all
 * when DIR's latest is v (same number and hash); *lineage is then the one
 * DIR had.  Test hook RL_WDIR_TEST_REWIND_DIE=k: exit 9 after k versions
 * were dropped. */
int rl_wdir_rewind_ver(const char *dir, const rl_wver *v, int keep, uint64_t *lineage);
/* rl_wdir_lineage: the lineage recorded in the version directory vdir's
 * rlsync.json (0 when it records none, or cannot be read). */
int rl_wdir_lineage(const char *vdir, uint64_t *lineage);

/* rl_wdir_latest: the newest complete version in dir: *version and its
 * directory path in path (size pathsz): the highest vNNNNNN holding
 * rlsync.json (complete by construction, even if `latest` was not switched
 * yet).  A directory with no such versions but a `latest` link to a
 * directory whose name ends in digits — rl-train's ROOT/latest ->
 * step-00000100 — gives that directory and number, so rl-rollout
 * --weights-from can watch rl-train --out directly.  RL_ENOENT if none. */
int rl_wdir_latest(const char *dir, uint64_t *version, char *path, size_t pathsz);
/* rl_wdir_before: the newest complete vNNNNNN in dir below `below` (what a
 * restarted server with --keep-previous holds besides the latest), as
 * rl_wdir_latest gives it.  RL_ENOENT if none. */
int rl_wdir_before(const char *dir, uint64_t below, uint64_t *version, char *path, size_t pathsz);

/* rl_wdir_prune removes all but the newest `keep` (>= 1) version directories
 * (never the one `latest` names) and temporaries left by dead writers. */
int rl_wdir_prune(const char *dir, int keep);

/* rl_wdir_path: DIR/vNNNNNN into buf.  RL_ETOOBIG if it does not fit. */
int rl_wdir_path(char *buf, size_t bufsz, const char *dir, uint64_t version);

/* Watcher for readers: polls `latest` (stat, no inotify, so it works on
 * NFS).  rl_wdir_watch_next waits up to timeout_ms (-1 forever, 0 just
 * look) for a version > the last one it returned (or > have_after_open),
 * and returns its number and path.  RL_ETIMEDOUT if none came. */
typedef struct rl_wdir_watch rl_wdir_watch;
int rl_wdir_watch_open(rl_wdir_watch **out, const char *dir, uint64_t have, int interval_ms);
int rl_wdir_watch_next(rl_wdir_watch *w, uint64_t *version, char *path, size_t pathsz, int timeout_ms);
void rl_wdir_watch_close(rl_wdir_watch *w);

/* rl_wdir_check_target: dir, before anything is pulled into it, is a
 * directory this process can write in, or a name one can be created at;
 * else "cannot pull into 'dir': why" is logged and RL_EIO returned. */
int rl_wdir_check_target(const char *dir);

#endif

/*
 * ckpt.h — checkpoints: Hugging Face model directories written atomically
 * (rl_model_save in model.h is the single-directory form), training
 * checkpoints with optimizer state, and the `latest` pointer.
 *
 * Layout of a training run's output directory ROOT:
 *   ROOT/step-00000100/   config.json, model.safetensors (HF names, cfg.dtype),
 *                         tokenizer files copied from the source model,
 *                         optimizer.safetensors (AdamW m, v in f32 as
 *                         "<name>.exp_avg", "<name>.exp_avg_sq", and the f32
 *                         master weights "<name>.master" when model.safetensors
 *                         is bf16/f16; metadata "step"),
 *                         trainer_state.json {"global_step": N}
 *                         value_head.safetensors (f32) when the model has a
 *                         value head (PPO; RL_T_AUX tensors, model.h); a
 *                         reward model (cfg.seq_cls) has its head in
 *                         model.safetensors as score.weight instead
 *                         model.safetensors.index.json naming model.safetensors
 *                         for every model tensor (vLLM and SGLang would load
 *                         the other .safetensors files as weights without it)
 *   with sharded AdamW state (rl-train --zero 1 on several ranks) the
 *   moments are not in optimizer.safetensors, which then holds only the
 *   master weights (bf16/f16 models) and the index in its metadata
 *   (zero_shards, checkpoint_id, flat_numel, flat_layout); each rank writes
 *                         optimizer-RRRRR-of-WWWWW.safetensors: "exp_avg",
 *                         "exp_avg_sq" of its flat range [offset, end) of
 *                         the parameter space (metadata step, version,
 *                         checkpoint_id, world, rank, offset, end, flat_numel)
 *   ROOT/latest           symbolic link "step-00000100" to the newest complete one
 * A directory is complete once it has its name: it is written as
 * ROOT/.step-00000100.tmp.PID, fsync'd, then renamed; `latest` is replaced by
 * rename of a new link, so a crash at any point leaves the previous
 * checkpoint and a valid `latest`.
 *
 * Leaves out: retention (deleting old checkpoints), sharded model weights.
 */
#ifndef RL_CKPT_H
#define RL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model/model.h"

/* Writes ROOT/step-%08d (ROOT created if missing) with the model and, when
 * with_optimizer and m has AdamW state, the optimizer; then points ROOT/latest
 * at it.  The step number is m->version (optimizer.safetensors keeps m->step,
 * the AdamW update count, in its metadata).  path (optional, size len) receives the
 * directory written.  RL_EEXIST when that step was already saved. */
int rl_ckpt_save(rl_model *m, const char *root, int with_optimizer, char *path, size_t len);
/* A copy of the weights taken between steps and written from another thread
 * (ckpt_snap.c): rl_ckpt_snap_take copies m's weights into *s (created when
 * NULL, reused after); RL_ENOTSUP where rl_ckpt_snap_ok says no (not the CPU
 * backend, LoRA, ZeRO-3).  rl_ckpt_snap_save is rl_ckpt_save of the copy
 * without the optimizer; rl_ckpt_snap_model the copy as a model to read
 * (never to train).  The model must outlive the copy's use. */
typedef struct rl_ckpt_snap rl_ckpt_snap;
int rl_ckpt_snap_ok(const rl_model *m);
int rl_ckpt_snap_take(rl_ckpt_snap **s, rl_model *m);
int rl_ckpt_snap_save(rl_ckpt_snap *s, const char *root, char *path, size_t len);
rl_model *rl_ckpt_snap_model(rl_ckpt_snap *s);
void rl_ckpt_snap_free(rl_ckpt_snap *s);
/* Resolves ROOT/latest to the directory path (size len); RL_ENOENT when there
 * is none. */
int rl_ckpt_latest(const char *root, char *path, size_t len);
/* The step number of a directory named "step-N", or -1. */
int rl_ckpt_step_num(const char *name);
/* The newest ROOT/step-N holding a full training checkpoint:
 * optimizer.safetensors and a trainer_state.json naming "records_consumed"
 * (the state is replaced last, so a crash leaves a directory without it).
 * The one rl-train --resume continues from and rl-rollout --resume starts
 * at.  RL_OK with its path (size len), *step, and *state the parsed
 * trainer_state.json (the caller's: cJSON_Delete); RL_ENOENT when there is
 * none, logged with a hint ("cannot resume: ...") unless quiet. */
int rl_ckpt_find_full(const char *root, char *path, size_t len, int *step, cJSON **state, int quiet);

/* Step directories that a resumed rl-train removes: those of ROOT numbered
 * above the checkpoint it resumes from, written by the run that was killed.
 * The trainer writes the same names again, with the same version numbers, so
 * a reader tells them apart by identity, recorded before the trainer could
 * have removed them: the directory's device and inode, and its weights file's
 * (model.safetensors, else config.json) inode and modification time.  Not the
 * directory's ctime: removing the files in it changes that, and a directory
 * half removed would pass for a new one. */
typedef struct rl_ckpt_leftovers {
	struct rl_ckpt_dirid {
		uint64_t dev, ino, fino;
		int64_t mtime_s, mtime_ns;
		int cfg;      /* the file is config.json (the directory had no model.safetensors) */
	} *id;                /* (n) */
	size_t n;
} rl_ckpt_leftovers;
/* Records the step directories of ROOT numbered above after_step (-1: all)
 * into *l (zeroed first).  RL_OK (none, or ROOT missing: n is 0) or RL_ENOMEM. */
int rl_ckpt_leftovers_scan(rl_ckpt_leftovers *l, const char *root, int after_step);

/* The running trainer's lock on root (root/.rl-train.lock, an flock held
 * for the run's life and released by the kernel when the process dies, even
 * by kill -9).  rl_ckpt_lock_run takes it (*fd: the descriptor, to close at
 * the end): RL_EEXIST, logged, when another process holds it.  RL_OK with
 * *fd = -1 when root cannot hold the file (rl-train's checks of --out say
 * why).  rl_ckpt_run_live: 1 when a live process holds it. */
int rl_ckpt_lock_run(const char *root, int *fd);
int rl_ckpt_run_live(const char *root);
/* 1 when dir is one of them, or cannot be looked at (it is being removed);
 * 0 when it is another directory. */
int rl_ckpt_leftovers_has(const rl_ckpt_leftovers *l, const char *dir);
void rl_ckpt_leftovers_fini(rl_ckpt_leftovers *l);  /* NULL ok */

/* Loads optimizer.safetensors from DIR into m (m->m, m->v, m->step and the
 * f32 master weights when present; a model of rl_model_open_part keeps the
 * file's path for rl_model_load_range instead), after rl_model_train_reserve.
 * RL_ENOENT when DIR has none. */
int rl_ckpt_load_optimizer(rl_model *m, const char *dir);

/* rl_ckpt_weight_files: the files a weights-only ROOT/step-N directory would
 * hold, built in memory in this order: config.json, model.safetensors,
 * model.safetensors.index.json, then the tokenizer files of the source model
 * that exist; nothing is written to disk (rl-sync's rl_wver_from_ckpt makes
 * a version of them).  *out (*n entries, names static, data malloc'd) is the
 * caller's: rl_ckpt_files_free. */
typedef struct rl_ckpt_file {
	const char *name;
	uint8_t *data;
	size_t size;
} rl_ckpt_file;
int rl_ckpt_weight_files(rl_ckpt_file **out, int *n, rl_model *m);
void rl_ckpt_files_free(rl_ckpt_file *f, int n); /* NULL ok */
/* rl_ckpt_part_files: part `part` of `nparts` of those files, as a sharded
 * Hugging Face directory: model-PPPPP-of-NNNNN.safetensors (1-based) with
 * the tensors whose first byte falls in the part's 1/nparts of the model's
 * bytes (whole tensors, table order); part 0 also config.json,
 * model.safetensors.index.json (every tensor's file) and the tokenizer
 * files.  Together the parts are a directory transformers and rl_model_open
 * load.  Not with LoRA adapters. */
int rl_ckpt_part_files(rl_ckpt_file **out, int *n, rl_model *m, int part, int nparts);
/* rl_ckpt_part_files_need: the same, with need(ctx, i) called before
 * tensor i (table index) is read from the parameters, in increasing i; an
 * error from it ends the build.  For parameters that are in memory only a
 * piece at a time (rl-train --zero 3). */
typedef int (*rl_ckpt_need_fn)(void *ctx, int tensor);
int rl_ckpt_part_files_need(rl_ckpt_file **out, int *n, rl_model *m, int part, int nparts, rl_ckpt_need_fn need,
    void *ctx);
/* rl_ckpt_part: the same part built a tensor at a time, in any order, for
 * parameters in memory a piece at a time whose order someone else sets
 * (rl-train --zero 3 writing a directory while it builds its part).
 * rl_ckpt_part_open lays out the part's image (RL_ENOMEM, RL_EINVAL as
 * above); rl_ckpt_part_put encodes tensor `tensor` (table index) from the
 * parameters as they are now, nothing for a tensor of another part or one
 * put already; rl_ckpt_part_finish hands over the files as
 * rl_ckpt_part_files does (RL_EINVAL, naming it, when a tensor of the part
 * was never put; the handle then holds nothing more of use);
 * rl_ckpt_part_close frees the handle (NULL ok).  The files are byte for
 * byte rl_ckpt_part_files'.  part 0 of nparts 0: the whole weights-only
 * version instead, rl_ckpt_weight_files' files byte for byte, in its order
 * (rl-train --zero 3 publishing a whole version without the whole model in
 * memory).  Not thread-safe. */
typedef struct rl_ckpt_part rl_ckpt_part;
int rl_ckpt_part_open(rl_ckpt_part **out, rl_model *m, int part, int nparts);
int rl_ckpt_part_put(rl_ckpt_part *p, int tensor);
int rl_ckpt_part_finish(rl_ckpt_part *p, rl_ckpt_file **out, int *n);
void rl_ckpt_part_close(rl_ckpt_part *p);

/* Sharded AdamW state (ckpt_shard.c).  A save's id is in every file of
 * it, so that pieces of another run or step are refused. */
#define RL_CKPT_OPT_SHARD_FMT "optimizer-%05d-of-%05d.safetensors"
typedef struct rl_ckpt_shards {
	int world;        /* the ranks that save, one shard file each */
	uint64_t id;      /* this save's checkpoint id */
} rl_ckpt_shards;
/* rl_ckpt_save with optimizer.safetensors as the index of sh->world shard
 * files (the master weights of a bf16/f16 model in it; m->m unused), which
 * the ranks then add with rl_ckpt_write_opt_shard. */
int rl_ckpt_save_sharded(rl_model *m, const char *root, const rl_ckpt_shards *sh, char *path, size_t len);
/* rl_ckpt_save (sh NULL) or rl_ckpt_save_sharded (sh given) with need
 * (optional, as rl_ckpt_part_files_need's) called before each tensor is
 * read from the parameters: in the order the files are written
 * (model.safetensors in table order, the value head, then the master weights
 * of a sharded state's index from the first tensor again).  The same files,
 * byte for byte, for parameters that are in memory a piece at a time
 * (rl-train --zero 3); an error from need fails the save (nothing renamed
 * into place). */
int rl_ckpt_save_need(rl_model *m, const char *root, int with_optimizer, const rl_ckpt_shards *sh,
    rl_ckpt_need_fn need, void *ctx, char *path, size_t len);
/* Writes DIR/optimizer-RANK-of-WORLD.safetensors (atomically: a temp file
 * renamed) from dm, dv: backend memory of (hi - lo) f32 moments of the flat
 * elements [lo, hi). */
int rl_ckpt_write_opt_shard(rl_model *m, const char *dir, const rl_ckpt_shards *sh, int rank, size_t lo, size_t hi,
    const float *dm, const float *dv);
/* *world: the shard count of DIR's optimizer.safetensors, 0 when it holds
 * the whole state.  RL_ENOENT (logged) without the file. */
int rl_ckpt_opt_sharded(const char *dir, int *world);
/* Reads the moments of the flat elements [lo, hi) into dm, dv (backend
 * memory, hi - lo each) from DIR's shards, whatever world size wrote them;
 * every shard is checked first: present, of the same checkpoint id and step,
 * the ranges tiling [0, tt.total), the index's tensor layout equal to m's.
 * Errors name the file and what differs. */
int rl_ckpt_read_opt_range(rl_model *m, const char *dir, size_t lo, size_t hi, float *dm, float *dv);

/* lib-private: write the model (and optionally optimizer) files into an
 * existing directory tmp. */
int rli_ckpt_write_dir(rl_model *m, const char *tmp, int with_optimizer);
int rli_ckpt_fsync_path(const char *path);
char *rli_ckpt_layout_json(const rl_model *m);     /* cJSON_free */
struct rl_st_file;
char *rli_ckpt_meta(const struct rl_st_file *f, const char *key); /* __metadata__[key], malloc'd, or NULL */

#endif

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
 *                         value head (PPO; RL_T_AUX tensors, model.h)
 *                         model.safetensors.index.json naming model.safetensors
 *                         for every model tensor (vLLM and SGLang would load
 *                         the other .safetensors files as weights without it)
 *   ROOT/latest           symbolic link "step-00000100" to the newest complete one
 * A directory is complete once it has its name: it is written as
 * ROOT/.step-00000100.tmp.PID, fsync'd, then renamed; `latest` is replaced by
 * rename of a new link, so a crash at any point leaves the previous
 * checkpoint and a valid `latest`.
 *
 * Leaves out: retention (deleting old checkpoints), sharded writing.
 */
#ifndef RL_CKPT_H
#define RL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct rl_wver rl_wver;

/* Writes ROOT/step-%08d (ROOT created if missing) with the model and, when
 * with_optimizer and m has AdamW state, the optimizer; then points ROOT/latest
 * at it.  The step number is m->step.  path (optional, size len) receives the
 * directory written.  RL_EEXIST when that step was already saved. */
int rl_ckpt_save(rl_model *m, const char *root, int with_optimizer, char *path, size_t len);
/* Resolves ROOT/latest to the directory path (size len); RL_ENOENT when there
 * is none. */
int rl_ckpt_latest(const char *root, char *path, size_t len);
/* Loads optimizer.safetensors from DIR into m (m->m, m->v, m->step and the
 * f32 master weights when present), after rl_model_train_reserve.  RL_ENOENT
 * when DIR has none. */
int rl_ckpt_load_optimizer(rl_model *m, const char *dir);

/* rl_ckpt_to_wver: the files a weights-only ROOT/step-N directory would
 * hold (config.json, model.safetensors, the tokenizer files of the source
 * model), built in memory as version `version` for rl-sync, hashed; nothing
 * is written to disk.  *out is the caller's (rl_wver_destroy). */
int rl_ckpt_to_wver(rl_model *m, uint64_t version, rl_wver **out);

/* lib-private: write the model (and optionally optimizer) files into an
 * existing directory tmp. */
int rli_ckpt_write_dir(rl_model *m, const char *tmp, int with_optimizer);

#endif

/*
 * wckpt.h — a model's weights as an rl-sync version (or a part of one), built in memory from
 * the files a weights-only checkpoint directory would hold (model/ckpt.h).
 *
 * Leaves out: writing the directory (rl_ckpt_save), moving the version
 * (wsync.h).
 */
#ifndef RL_WCKPT_H
#define RL_WCKPT_H

#include <stdint.h>

#include "model/ckpt.h"
#include "model/model.h"
#include "sync/wver.h"

/* rl_wver_from_ckpt: the files a weights-only ROOT/step-N directory would
 * hold (config.json, model.safetensors, the tokenizer files of the source
 * model), built in memory as version `version` for rl-sync, hashed; nothing
 * is written to disk.  *out is the caller's (rl_wver_destroy). */
int rl_wver_from_ckpt(rl_wver **out, rl_model *m, uint64_t version);
/* rl_wver_from_ckpt_part: part `part` of `nparts` of version `version` as
 * a sharded directory's files (rl_ckpt_part_files), for
 * rl_wsync_push_part. */
int rl_wver_from_ckpt_part(rl_wver **out, rl_model *m, uint64_t version, int part, int nparts);
/* rl_wver_from_ckpt_part_need: the same with rl_ckpt_part_files_need's
 * hook (need may be NULL). */
int rl_wver_from_ckpt_part_need(rl_wver **out, rl_model *m, uint64_t version, int part, int nparts,
    rl_ckpt_need_fn need, void *ctx);
/* rl_wver_from_files: version `version` of the n files f (hashed), which
 * give it their data buffers: on return every f[i].data is NULL (taken or
 * freed, success or not); the array stays the caller's. */
int rl_wver_from_files(rl_wver **out, uint64_t version, rl_ckpt_file *f, int n);

#endif

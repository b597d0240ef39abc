/*
 * plan_print.h — rl-train --plan: the memory plan of lib/train/plan.h for the
 * options given, printed as a table or one JSON object.
 */
#ifndef RL_TRAIN_PLAN_PRINT_H
#define RL_TRAIN_PLAN_PRINT_H

#include "train/plan.h"
#include "train/train.h"

/* "q,k,v" or "q_proj,k_proj" into RL_PLAN_* bits; 0 for a bad list. */
unsigned lora_targets(const char *list);
/* Loads the config (init, else MODEL_DIR/config.json), fills the rest of po
 * from the training options and prints; returns the exit status. */
int print_plan(const rl_train_opts *o, rl_plan_opts *po, int world, int zero, const char *init, int json);

#endif

/*
 * plan_print.c — rl-train --plan (plan_print.h).  The reference model is
 * the one rl-train would open: --ref DIR (its own config.json), or with
 * --algo dpo the initial policy (opened when a record lacks ref_logprobs,
 * so planned); none for a KL term on the records' ref_logprobs.
 */
#include "plan_print.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli.h"
#include "base/core.h"
#include "base/io.h"
#include "base/json.h"
#include "model/config.h"

unsigned
lora_targets(const char *list)
{
	static const char *const names[7] = { "q", "k", "v", "o", "gate", "up", "down" };
	unsigned bits = 0;
	char buf[256], *save = NULL;

	if (strlen(list) >= sizeof buf)
		return 0;
	strcpy(buf, list);
	if (strcmp(buf, "all-linear") == 0)
		return 127;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t n = strlen(t);
		int k;
		if (n > 5 && strcmp(t + n - 5, "_proj") == 0)
			t[n - 5] = 0;
		for (k = 0; k < 7 && strcmp(t, names[k]) != 0; k++)
			;
		if (k == 7)
			return 0;
		bits |= 1u << k;
	}
	return bits;
}

static double unit = 1024.0 * 1024 * 1024;
static double gib(double b) { return b / unit; }

/* The reference's config into *rc when rl-train would open one (checked
 * against the policy's as rl-train checks it; *ref names it); with LoRA
 * and the base as the reference, *ref names it and *rc is not loaded (no
 * second model: the policy's forward with the adapters off).  0 when none,
 * 1 on an error. */
static int
plan_ref_config(const rl_train_opts *o, const rl_config *cfg, const char *path, rl_config *rc, const char **ref,
    int *loaded)
{
	char rpath[4096];

	*ref = NULL;
	*loaded = 0;
	if (rl_train_ref_is_base(o->lora_rank, o->algo == RL_ALGO_DPO, o->ref_dir, o->model_dir)) {
		*ref = "the LoRA base, adapters off";
		return 0;
	}
	*loaded = 1;
	if (o->ref_dir) {
		snprintf(rpath, sizeof rpath, "%s/config.json", o->ref_dir);
		if (rl_config_load(rc, rpath) != 0)
			return 1;
		if (rl_train_ref_check(cfg, o->model_dir ? o->model_dir : path, rc, o->ref_dir) != 0) {
			rl_config_fini(rc);
			return 1;
		}
		*ref = o->ref_dir;
	} else if (o->algo == RL_ALGO_DPO) {
		if (rl_config_load(rc, path) != 0)
			return 1;
		*ref = "the initial policy";
	} else {
		*loaded = 0;
	}
	return 0;
}

int
print_plan(const rl_train_opts *o, rl_plan_opts *po, int world, int zero, const char *init, int json)
{
	char path[4096];
	rl_config cfg, rcfg;
	const char *ref;
	rl_plan p;
	int rv, loaded;

	if (!init && !o->model_dir)
		return rl_cli_usage("--plan needs a model: -m MODEL_DIR or --init CONFIG");
	if (init)
		snprintf(path, sizeof path, "%s", init);
	else
		snprintf(path, sizeof path, "%s/config.json", o->model_dir);
	if (rl_config_load(&cfg, path) != 0)
		return 1;
	if (plan_ref_config(o, &cfg, path, &rcfg, &ref, &loaded) != 0) {
		rl_config_fini(&cfg);
		return 1;
	}
	po->world = world > 0 ? world : 1;   /* unset: one rank */
	po->zero = zero;
	po->cuda = o->device && strncmp(o->device, "cuda", 4) == 0;
	po->max_tokens = o->micro_tokens > 0 ? o->micro_tokens : o->max_tokens_micro;
	po->recompute = o->recompute;
	po->value_head = o->algo == RL_ALGO_PPO || o->algo == RL_ALGO_RM;
	po->ref = loaded ? &rcfg : NULL;
	rv = rl_train_plan(&p, &cfg, po);
	rl_config_fini(&cfg);
	if (loaded)
		rl_config_fini(&rcfg);
	if (rv != 0)
		return 1;
	if (json) {
		printf("{\"params\":%zu,\"trainable\":%zu,\"world\":%d,\"zero\":%d,\"device\":\"%s\",\"lora_rank\":%d,"
		    "\"max_tokens\":%d,\"recompute\":%s,\"value_head\":%s,\"kv_tokens\":%lld,"
		    "\"weights_bytes\":%.0f,\"grads_bytes\":%.0f,\"optim_bytes\":%.0f,\"acts_bytes\":%.0f,"
		    "\"kv_bytes\":%.0f,\"ref_weights_bytes\":%.0f,\"ref_acts_bytes\":%.0f,\"ref_bytes\":%.0f,"
		    "\"total_bytes\":%.0f,\"runs\":%s",
		    p.params, p.trainable, po->world, po->zero, po->cuda ? "cuda" : "cpu", po->lora_rank, po->max_tokens,
		    po->recompute ? "true" : "false", po->value_head ? "true" : "false", po->kv_tokens, p.weights,
		    p.grads, p.optim, p.acts, p.kv, p.ref_weights, p.ref_acts, p.ref, p.total, p.runs ? "true" : "false");
		if (po->gpu_bytes > 0)
			printf(",\"gpu_bytes\":%.0f,\"fits\":%s", po->gpu_bytes, p.fits ? "true" : "false");
		cJSON *js = ref ? cJSON_CreateString(ref) : cJSON_CreateNull();
		char *t = js ? rl_json_print(js) : NULL;
		cJSON_Delete(js);
		if (!t) {
			rl_error("--plan: out of memory");
			return 1;
		}
		printf(",\"ref\":%s}\n", t);
		free(t);
	} else {
		printf("%s: %zu parameters (%zu trained), %d rank%s, ZeRO-%d%s, %s, %d tokens a micro-batch%s\n", path,
		    p.params, p.trainable, po->world, po->world > 1 ? "s" : "", po->zero,
		    po->lora_rank ? ", LoRA" : "", po->cuda ? "cuda (bf16 compute)" : "cpu (f32)", po->max_tokens,
		    po->recompute ? ", recomputed" : "");
		const char *u = "GiB";
		if (p.total < unit) {
			unit = 1024.0 * 1024;
			u = "MiB";
		}
		printf("  weights      %10.2f %s\n  gradients    %10.2f %s\n  AdamW state  %10.2f %s\n"
		    "  activations  %10.2f %s\n", gib(p.weights), u, gib(p.grads), u, gib(p.optim), u, gib(p.acts), u);
		if (ref)
			printf("  reference    %10.2f %s (%s: weights %.2f, activations %.2f)\n", gib(p.ref), u, ref,
			    gib(p.ref_weights), gib(p.ref_acts));
		printf("  KV cache     %10.2f %s\n  total        %10.2f %s per rank", gib(p.kv), u, gib(p.total), u);
		if (po->gpu_bytes > 0)
			printf(" of %.2f %s: %s", gib(po->gpu_bytes), u, p.fits ? "fits" : "does not fit");
		printf("\n%s", p.runs ? "" : "  (planned, not trained yet: ZeRO-3, ZeRO-2 and LoRA on CUDA, LoRA with ZeRO)\n");
	}
	return rl_io_close_stdout() ? 1 : 0;
}

/*
 * config.c — config.json <-> rl_config for Llama/Qwen2/Qwen3/Mistral, Gemma 3 and GPT-2.
 * Defaults are transformers' (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig,
 * Gemma3TextConfig, GPT2Config).
 */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/safetensors.h"

typedef struct pctx {
	const cJSON *root;
	const char *what;
	int rv;
} pctx;

/* Integer key: required (missing is an error) or def when absent/null. */
static int
get_int(pctx *c, const char *key, int required, int def)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);

	if (j == NULL || cJSON_IsNull(j)) {
		if (required && c->rv == 0) {
			rl_error("%s: missing key \"%s\"", c->what, key);
			c->rv = RL_EFORMAT;
		}
		return def;
	}
	if (cJSON_IsArray(j)) /* eos_token_id may be a list: the first one */
		j = cJSON_GetArrayItem(j, 0);
	if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) ||
	    fabs(j->valuedouble) > 2147483647.0) {
		if (c->rv == 0) {
			if (cJSON_IsNumber(j) && j->valuedouble == floor(j->valuedouble))
				rl_error("%s: key \"%s\" is %.0f, out of range", c->what, key, j->valuedouble);
			else
				rl_error("%s: key \"%s\" is not an integer", c->what, key);
			c->rv = RL_EFORMAT;
		}
		return def;
	}
	return (int)j->valuedouble;
}

/* eos_token_id: an id or a list of ids (Hugging Face: any of them ends
 * generation); the first is eos_id, the others eos_more */
static void
get_eos(pctx *c, rl_config *cfg)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, "eos_token_id"), *it;
	int k = 0;

	cfg->n_eos_more = 0;
	if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) <= 1) {
		cfg->eos_id = get_int(c, "eos_token_id", 0, -1);
		return;
	}
	cJSON_ArrayForEach(it, j) {
		if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
		    it->valuedouble > 2147483647.0) {
			if (c->rv == 0) {
				rl_error("%s: key \"eos_token_id\": item %d is not a token id", c->what, k);
				c->rv = RL_EFORMAT;
			}
			return;
		}
		if (k > 7) {
			if (c->rv == 0) {
				rl_error("%s: key \"eos_token_id\": more than 8 ids", c->what);
				c->rv = RL_EFORMAT;
			}
			return;
		}
		if (k == 0)
			cfg->eos_id = (int)it->valuedouble;
		else
			cfg->eos_more[cfg->n_eos_more++] = (int)it->valuedouble;
		k++;
	}
}

static double
get_num(pctx *c, const char *key, double def)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);

	if (j == NULL || cJSON_IsNull(j))
		return def;
	if (!cJSON_IsNumber(j)) {
		if (c->rv == 0) {
			rl_error("%s: key \"%s\" is not a number", c->what, key);
			c->rv = RL_EFORMAT;
		}
		return def;
	}
	return j->valuedouble;
}

static int
get_bool(pctx *c, const char *key, int def)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);

	if (j == NULL || cJSON_IsNull(j))
		return def;
	if (!cJSON_IsBool(j)) {
		if (c->rv == 0) {
			rl_error("%s: key \"%s\" is not true or false", c->what, key);
			c->rv = RL_EFORMAT;
		}
		return def;
	}
	return cJSON_IsTrue(j);
}

static const char *
get_str(pctx *c, const char *key)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
	return cJSON_IsString(j) ? j->valuestring : NULL;
}

static int
unsupported(pctx *c, const char *what)
{
	if (c->rv == 0) {
		rl_error("%s: %s is not supported", c->what, what);
		c->rv = RL_ENOTSUP;
	}
	return c->rv;
}

/* A positive number in the rope object o (config key obj): Llama 3's scaling keys,
 * which transformers requires (a missing one is a KeyError there).  0 after an error. */
static double
rope_num(pctx *c, const cJSON *o, const char *obj, const char *key, int integer)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	if (v == NULL || cJSON_IsNull(v)) {
		if (c->rv == 0) {
			rl_error("%s: key \"%s\": rope_type 'llama3' needs \"%s\"", c->what, obj, key);
			c->rv = RL_EFORMAT;
		}
		return 0;
	}
	if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !(v->valuedouble <= FLT_MAX) ||
	    (integer && (v->valuedouble != floor(v->valuedouble) || v->valuedouble > 2147483647.0))) {
		if (c->rv == 0) {
			rl_error("%s: key \"%s\": \"%s\" must be a positive %s", c->what, obj, key,
			    integer ? "integer" : "number");
			c->rv = RL_EFORMAT;
		}
		return 0;
	}
	return v->valuedouble;
}

/* Llama 3.1 / 3.2's rescaled frequencies (rope_type "llama3"): factor,
 * low_freq_factor < high_freq_factor and original_max_position_embeddings, as
 * transformers' _compute_llama3_parameters reads them (lib/compute/ops.h rl_rope). */
static void
get_llama3(pctx *c, const cJSON *o, const char *obj, rl_config *cfg)
{
	double f = rope_num(c, o, obj, "factor", 0);
	double lo = rope_num(c, o, obj, "low_freq_factor", 0);
	double hi = rope_num(c, o, obj, "high_freq_factor", 0);
	double orig = rope_num(c, o, obj, "original_max_position_embeddings", 1);

	if (c->rv != 0)
		return;
	if (!(hi > lo)) {
		/* the smoothing divides by hi - lo */
		rl_error("%s: key \"%s\": \"high_freq_factor\" (%g) must be greater than \"low_freq_factor\" (%g)",
		    c->what, obj, hi, lo);
		c->rv = RL_EFORMAT;
		return;
	}
	cfg->rope_factor = (float)f;
	cfg->rope_low_freq = (float)lo;
	cfg->rope_high_freq = (float)hi;
	cfg->rope_orig_max_pos = (int)orig;
}

/* The RoPE base and scaling.  transformers < 5 writes "rope_theta" and "rope_scaling"
 * (null, or an object with "rope_type" / legacy "type") at the top level;
 * transformers 5 writes one "rope_parameters" object holding "rope_type",
 * "rope_theta" and the scaling keys, and no top-level rope_theta: reading
 * only the top level would rotate by the default base 10000 and compute
 * different logits without a word.  rope_type "default" (or absent) is the
 * plain rotation, "llama3" Llama 3.1's rescaled frequencies; any other (linear,
 * dynamic, yarn, longrope, ...) and a partial_rotary_factor other than 1 are
 * refused.  Sets cfg->rope_theta and the rope_* scaling fields. */
static void
get_rope(pctx *c, rl_config *cfg)
{
	static const char *const keys[2] = { "rope_scaling", "rope_parameters" };
	double theta = get_num(c, "rope_theta", 10000.0);

	for (int k = 0; k < 2 && c->rv == 0; k++) {
		const cJSON *o = cJSON_GetObjectItemCaseSensitive(c->root, keys[k]), *ty, *v;
		if (o == NULL || cJSON_IsNull(o))
			continue;
		if (!cJSON_IsObject(o)) {
			rl_error("%s: key \"%s\" is not an object", c->what, keys[k]);
			c->rv = RL_EFORMAT;
			break;
		}
		/* transformers 5 keys rope_parameters by layer type for models that
		 * rotate sliding and full attention layers differently (Gemma 3): one
		 * base would be wrong for some layers */
		cJSON_ArrayForEach(v, o)
			if (cJSON_IsObject(v) && c->rv == 0) {
				rl_error("%s: key \"%s\" holds one set per layer type ('%s'), which is not supported",
				    c->what, keys[k], v->string);
				c->rv = RL_ENOTSUP;
			}
		if (c->rv != 0)
			break;
		if ((ty = cJSON_GetObjectItemCaseSensitive(o, "rope_type")) == NULL)
			ty = cJSON_GetObjectItemCaseSensitive(o, "type");
		if (cJSON_IsString(ty) && strcmp(ty->valuestring, "llama3") == 0) {
			get_llama3(c, o, keys[k], cfg);
		} else if (ty != NULL && !cJSON_IsNull(ty) &&
		    (!cJSON_IsString(ty) || strcmp(ty->valuestring, "default") != 0)) {
			rl_error("%s: %s with rope_type '%s' is not supported", c->what, keys[k],
			    cJSON_IsString(ty) ? ty->valuestring : "?");
			rl_hint("implemented: the plain rotary embedding (rope_type \"default\") and Llama 3's "
			    "scaling (\"llama3\")");
			c->rv = RL_ENOTSUP;
			break;
		}
		v = cJSON_GetObjectItemCaseSensitive(o, "partial_rotary_factor");
		if (v != NULL && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
			unsupported(c, "partial_rotary_factor other than 1");
			break;
		}
		v = cJSON_GetObjectItemCaseSensitive(o, "rope_theta");
		if (v != NULL && !cJSON_IsNull(v)) {
			if (!cJSON_IsNumber(v)) {
				if (c->rv == 0) {
					rl_error("%s: key \"%s\": \"rope_theta\" is not a number", c->what, keys[k]);
					c->rv = RL_EFORMAT;
				}
				break;
			}
			theta = v->valuedouble;
		}
	}
	cfg->rope_theta = (float)theta;
}

/* Mistral's sliding_window W (MistralConfig's default 4096; null: none): query i attends
 * to keys j with i - W < j <= i.  Computed as such on the CPU (lib/compute/ops_cpu.h
 * rl_cpu_attn_fwd_ex); the CUDA kernels have no window, so there rl_model caps the
 * context at W, where the window does not bind yet. */
static void
get_window(pctx *c, rl_config *cfg, int def)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window");
	int w = j == NULL ? def : cJSON_IsNull(j) ? 0 : get_int(c, "sliding_window", 0, 0);

	if (c->rv != 0)
		return;
	if (w < 0 || (j != NULL && !cJSON_IsNull(j) && w == 0)) {
		rl_error("%s: key \"sliding_window\" is %d, not a positive window or null", c->what, w);
		c->rv = RL_EFORMAT;
		return;
	}
	cfg->sliding_window = w;
	cfg->max_pos_config = cfg->max_pos;
}

/* Gemma 3's layer types: "layer_types" (one "sliding_attention" or "full_attention" per
 * layer), else Gemma3TextConfig's rule from "sliding_window_pattern" P (default 6):
 * layer i is full attention when (i + 1) % P == 0. */
static void
get_layer_types(pctx *c, rl_config *cfg)
{
	const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c->root, "layer_types"), *it;
	int pat, i = 0;

	if (cfg->n_layer <= 0 || c->rv != 0)
		return;
	if (cfg->n_layer > RL_CONFIG_MAX_LOCAL) {
		rl_error("%s: %d layers; Gemma 3 models of at most %d are supported", c->what, cfg->n_layer,
		    RL_CONFIG_MAX_LOCAL);
		c->rv = RL_ENOTSUP;
		return;
	}
	if (lt != NULL && !cJSON_IsNull(lt)) {
		if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layer) {
			rl_error("%s: key \"layer_types\" is not a list of %d layer types (num_hidden_layers)",
			    c->what, cfg->n_layer);
			c->rv = RL_EFORMAT;
			return;
		}
		cJSON_ArrayForEach(it, lt) {
			if (cJSON_IsString(it) && strcmp(it->valuestring, "sliding_attention") == 0) {
				cfg->local[i] = 1;
			} else if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention") != 0) {
				rl_error("%s: key \"layer_types\": item %d is %s%s%s, not \"sliding_attention\" or "
				    "\"full_attention\"", c->what, i, cJSON_IsString(it) ? "'" : "",
				    cJSON_IsString(it) ? it->valuestring : "not a string", cJSON_IsString(it) ? "'" : "");
				c->rv = cJSON_IsString(it) ? RL_ENOTSUP : RL_EFORMAT;
				return;
			}
			i++;
		}
		return;
	}
	pat = get_int(c, "sliding_window_pattern", 0, 6);
	if (c->rv == 0 && pat <= 0) {
		rl_error("%s: key \"sliding_window_pattern\" is %d, not a positive layer count", c->what, pat);
		c->rv = RL_EFORMAT;
		return;
	}
	for (i = 0; i < cfg->n_layer && c->rv == 0; i++)
		cfg->local[i] = (i + 1) % pat != 0;
}

/* One RoPE object of Gemma 3 (rope_scaling, or a layer type's in rope_parameters), key
 * obj: rope_type (or legacy type) absent, null or "default", or, where linear is 1,
 * "linear" with a factor >= 1 (*factor; transformers' _compute_linear_scaling_rope_parameters:
 * inv_freq / factor); *theta from its rope_theta when it has one; partial_rotary_factor 1. */
static void
gemma_rope_obj(pctx *c, const cJSON *o, const char *obj, int linear, float *theta, float *factor)
{
	const cJSON *ty, *v;

	if (!cJSON_IsObject(o)) {
		rl_error("%s: key \"%s\" is not an object", c->what, obj);
		c->rv = RL_EFORMAT;
		return;
	}
	if ((ty = cJSON_GetObjectItemCaseSensitive(o, "rope_type")) == NULL)
		ty = cJSON_GetObjectItemCaseSensitive(o, "type");
	v = cJSON_GetObjectItemCaseSensitive(o, "partial_rotary_factor");
	if (v != NULL && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
		rl_error("%s: key \"%s\": partial_rotary_factor other than 1 is not supported", c->what, obj);
		c->rv = RL_ENOTSUP;
		return;
	}
	v = cJSON_GetObjectItemCaseSensitive(o, "rope_theta");
	if (v != NULL && !cJSON_IsNull(v)) {
		if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !(v->valuedouble <= FLT_MAX)) {
			rl_error("%s: key \"%s\": \"rope_theta\" is not a positive number", c->what, obj);
			c->rv = RL_EFORMAT;
			return;
		}
		*theta = (float)v->valuedouble;
	}
	if (ty == NULL || cJSON_IsNull(ty) || (cJSON_IsString(ty) && strcmp(ty->valuestring, "default") == 0))
		return;
	if (!linear || !cJSON_IsString(ty) || strcmp(ty->valuestring, "linear") != 0) {
		rl_error("%s: key \"%s\": rope_type '%s' is not supported for gemma3", c->what, obj,
		    cJSON_IsString(ty) ? ty->valuestring : "?");
		rl_hint("implemented for Gemma 3: \"default\", and \"linear\" on its full-attention layers");
		c->rv = RL_ENOTSUP;
		return;
	}
	v = cJSON_GetObjectItemCaseSensitive(o, "factor");
	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1.0) || !(v->valuedouble <= FLT_MAX)) {
		rl_error("%s: key \"%s\": \"factor\" of rope_type 'linear' must be a number >= 1", c->what, obj);
		c->rv = RL_EFORMAT;
		return;
	}
	*factor = (float)v->valuedouble;
}

/* Gemma 3's RoPE: rope_theta (default 1e6) for the full-attention layers, with
 * rope_scaling null, "default" or "linear"; rope_local_base_freq (default 1e4) and no
 * scaling for the sliding ones.  transformers 5 writes instead one "rope_parameters"
 * object per layer type ("full_attention", "sliding_attention"), each with its
 * rope_type and rope_theta: read the same way. */
static void
get_gemma_rope(pctx *c, rl_config *cfg)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
	const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c->root, "rope_parameters"), *v;
	float unused = 0;

	cfg->rope_theta = (float)get_num(c, "rope_theta", 1000000.0);
	cfg->rope_local_theta = (float)get_num(c, "rope_local_base_freq", 10000.0);
	if (rp != NULL && !cJSON_IsNull(rp) && c->rv == 0) {
		if (!cJSON_IsObject(rp)) {
			rl_error("%s: key \"rope_parameters\" is not an object", c->what);
			c->rv = RL_EFORMAT;
			return;
		}
		cJSON_ArrayForEach(v, rp) {
			if (c->rv != 0)
				return;
			if (strcmp(v->string, "full_attention") == 0) {
				gemma_rope_obj(c, v, "rope_parameters.full_attention", 1, &cfg->rope_theta,
				    &cfg->rope_linear);
			} else if (strcmp(v->string, "sliding_attention") == 0) {
				gemma_rope_obj(c, v, "rope_parameters.sliding_attention", 0, &cfg->rope_local_theta,
				    &unused);
			} else {
				rl_error("%s: key \"rope_parameters\": '%s' is not a layer type (full_attention, "
				    "sliding_attention)", c->what, v->string);
				rl_hint("Gemma 3's rope_parameters holds one object per layer type");
				c->rv = RL_ENOTSUP;
			}
		}
		return;
	}
	if (o == NULL || cJSON_IsNull(o) || c->rv != 0)
		return;
	gemma_rope_obj(c, o, "rope_scaling", 1, &unused, &cfg->rope_linear);
}

/* Gemma 3's text model (Gemma3TextConfig's defaults). */
static void
get_gemma3(pctx *c, rl_config *cfg)
{
	static const char *const caps[2] = { "attn_logit_softcapping", "final_logit_softcapping" };
	const char *s;
	double q;

	cfg->arch = RL_ARCH_LLAMA;
	cfg->gemma = 1;
	cfg->vocab_size = get_int(c, "vocab_size", 0, 262208);
	cfg->hidden_size = get_int(c, "hidden_size", 0, 2304);
	cfg->n_layer = get_int(c, "num_hidden_layers", 0, 26);
	cfg->n_head = get_int(c, "num_attention_heads", 0, 8);
	cfg->intermediate_size = get_int(c, "intermediate_size", 0, 9216);
	cfg->n_kv_head = get_int(c, "num_key_value_heads", 0, 4);
	cfg->head_dim = get_int(c, "head_dim", 0, 256);
	cfg->max_pos = get_int(c, "max_position_embeddings", 0, 131072);
	cfg->norm_eps = (float)get_num(c, "rms_norm_eps", 1e-6);
	cfg->tie_embeddings = get_bool(c, "tie_word_embeddings", 1);
	cfg->bos_id = get_int(c, "bos_token_id", 0, 2);
	if (cJSON_GetObjectItemCaseSensitive(c->root, "eos_token_id") == NULL)
		cfg->eos_id = 1;
	else
		get_eos(c, cfg);
	cfg->qk_norm = 1;
	get_window(c, cfg, 4096);
	get_layer_types(c, cfg);
	get_gemma_rope(c, cfg);
	q = get_num(c, "query_pre_attn_scalar", 256);
	if (c->rv == 0 && !(q > 0 && q <= FLT_MAX)) {
		rl_error("%s: key \"query_pre_attn_scalar\" is %g, not a positive number", c->what, q);
		c->rv = RL_EFORMAT;
	}
	cfg->attn_scale = (float)(1.0 / sqrt(q));
	if (get_bool(c, "attention_bias", 0))
		unsupported(c, "attention_bias");
	if (get_bool(c, "use_bidirectional_attention", 0))
		unsupported(c, "use_bidirectional_attention");
	s = get_str(c, "hidden_activation");
	if (s == NULL)
		s = get_str(c, "hidden_act");
	if (s != NULL && strcmp(s, "gelu_pytorch_tanh") != 0)
		unsupported(c, "hidden_activation other than gelu_pytorch_tanh");
	for (int k = 0; k < 2; k++) {
		const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, caps[k]);
		if (j != NULL && !cJSON_IsNull(j) && c->rv == 0) {
			rl_error("%s: key \"%s\" is set; tanh soft-capping (Gemma 2) is not implemented", c->what,
			    caps[k]);
			rl_hint("Gemma 3 configs have null there");
			c->rv = RL_ENOTSUP;
		}
	}
}

/* "gemma3" (Gemma3ForConditionalGeneration): its text_config, as the gemma3_text config
 * rlpipe reads and saves (vision_config and the image tokens are left out, as are the
 * vision tower's tensors when the model is loaded).  *text: the text config (borrowed
 * from root), NULL after an error. */
static const cJSON *
gemma3_text_config(pctx *c, cJSON *root)
{
	cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text_config");

	if (!cJSON_IsObject(t)) {
		rl_error("%s: model_type 'gemma3' without a \"text_config\" object", c->what);
		c->rv = RL_EFORMAT;
		return NULL;
	}
	return t;
}

void
rl_config_fini(rl_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->raw);
	cfg->raw = NULL;
}

void
rl_config_copy(rl_config *dst, const rl_config *src)
{
	*dst = *src;
	dst->raw = src->raw ? rl_xstrdup(src->raw) : NULL;
}

/* "architectures" naming a ...ForSequenceClassification: a reward model, of
 * one label.  transformers counts the labels as id2label's entries, else
 * num_labels, else 2 (PretrainedConfig's default). */
static void
get_seq_cls(pctx *c, rl_config *cfg)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->root, "architectures"), *it;
	const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c->root, "id2label");
	const char *sfx = "ForSequenceClassification", *cls = NULL;
	int n;

	if (!cJSON_IsArray(a))
		return;
	cJSON_ArrayForEach(it, a) {
		size_t l = cJSON_IsString(it) ? strlen(it->valuestring) : 0;
		if (l > strlen(sfx) && strcmp(it->valuestring + l - strlen(sfx), sfx) == 0)
			cls = it->valuestring;
	}
	if (cls == NULL)
		return;
	cfg->seq_cls = 1;
	n = cJSON_IsObject(ids) ? cJSON_GetArraySize(ids) : get_int(c, "num_labels", 0, 2);
	if (n != 1 && c->rv == 0) {
		rl_error("%s: %s with %d labels (%s); a reward model has one (num_labels 1)", c->what, cls, n,
		    cJSON_IsObject(ids) ? "id2label" : cJSON_GetObjectItemCaseSensitive(c->root, "num_labels") ?
		    "num_labels" : "no id2label or num_labels: transformers' default");
		rl_hint("rlpipe scores with reward models: a classifier of several labels is not one");
		c->rv = RL_ENOTSUP;
	}
}

int
rl_config_parse(rl_config *cfg, const char *text_in, size_t len, const char *what)
{
	pctx c = { 0 };
	cJSON *root, *text = NULL;
	const char *mt, *s;

	memset(cfg, 0, sizeof *cfg);
	root = rl_json_parse_all(text_in, len);
	c.root = root;
	c.what = what;
	if (!cJSON_IsObject(root)) {
		rl_error("%s: not a JSON object", what);
		cJSON_Delete(root);
		return RL_EFORMAT;
	}
	if ((mt = get_str(&c, "model_type")) == NULL) {
		rl_error("%s: missing key \"model_type\"", what);
		c.rv = RL_EFORMAT;
		goto out;
	}
	if (strcmp(mt, "gpt2") == 0) {
		cfg->arch = RL_ARCH_GPT2;
		cfg->vocab_size = get_int(&c, "vocab_size", 1, 0);
		cfg->hidden_size = get_int(&c, "n_embd", 1, 0);
		cfg->n_layer = get_int(&c, "n_layer", 1, 0);
		cfg->n_head = get_int(&c, "n_head", 1, 0);
		cfg->max_pos = get_int(&c, "n_positions", 1, 0);
		cfg->n_kv_head = cfg->n_head;
		cfg->head_dim = cfg->n_head > 0 ? cfg->hidden_size / cfg->n_head : 0;
		cfg->intermediate_size = get_int(&c, "n_inner", 0, 4 * cfg->hidden_size);
		cfg->norm_eps = (float)get_num(&c, "layer_norm_epsilon", 1e-5);
		cfg->qkv_bias = cfg->o_bias = 1;
		cfg->tie_embeddings = get_bool(&c, "tie_word_embeddings", 1);
		cfg->bos_id = get_int(&c, "bos_token_id", 0, -1);
		get_eos(&c, cfg);
		s = get_str(&c, "activation_function");
		if (s != NULL && strcmp(s, "gelu_new") != 0 && strcmp(s, "gelu_pytorch_tanh") != 0)
			unsupported(&c, "activation_function other than gelu_new");
		if (get_bool(&c, "scale_attn_by_inverse_layer_idx", 0) ||
		    !get_bool(&c, "scale_attn_weights", 1))
			unsupported(&c, "GPT-2 attention scaling other than 1/sqrt(head_dim)");
	} else if (strcmp(mt, "llama") == 0 || strcmp(mt, "qwen2") == 0 || strcmp(mt, "qwen3") == 0 ||
	    strcmp(mt, "mistral") == 0) {
		int qwen2 = strcmp(mt, "qwen2") == 0, qwen3 = strcmp(mt, "qwen3") == 0;
		int mistral = strcmp(mt, "mistral") == 0;
		cfg->arch = RL_ARCH_LLAMA;
		cfg->vocab_size = get_int(&c, "vocab_size", 1, 0);
		cfg->hidden_size = get_int(&c, "hidden_size", 1, 0);
		cfg->n_layer = get_int(&c, "num_hidden_layers", 1, 0);
		cfg->n_head = get_int(&c, "num_attention_heads", 1, 0);
		cfg->intermediate_size = get_int(&c, "intermediate_size", 1, 0);
		cfg->n_kv_head = get_int(&c, "num_key_value_heads", 0, cfg->n_head);
		/* Qwen3Config defaults head_dim to 128, not hidden/heads as Llama and Qwen2 do */
		cfg->head_dim = get_int(&c, "head_dim", 0,
		    qwen3 ? 128 : cfg->n_head > 0 ? cfg->hidden_size / cfg->n_head : 0);
		cfg->max_pos = get_int(&c, "max_position_embeddings", 0,
		    qwen2 || qwen3 ? 32768 : mistral ? 4096 * 32 : 2048);
		if (mistral)
			get_window(&c, cfg, 4096);
		get_rope(&c, cfg);
		cfg->norm_eps = (float)get_num(&c, "rms_norm_eps", 1e-6);
		cfg->tie_embeddings = get_bool(&c, "tie_word_embeddings", 0);
		cfg->bos_id = get_int(&c, "bos_token_id", 0, -1);
		get_eos(&c, cfg);
		if (qwen2) {
			cfg->qkv_bias = 1;
		} else if (mistral) {
			/* MistralAttention's projections have no bias; MistralConfig has no attention_bias */
			cfg->qkv_bias = cfg->o_bias = 0;
		} else {
			cfg->qkv_bias = cfg->o_bias = get_bool(&c, "attention_bias", 0);
		}
		cfg->qk_norm = qwen3;
		if (get_bool(&c, "mlp_bias", 0))
			unsupported(&c, "mlp_bias");
		s = get_str(&c, "hidden_act");
		if (s != NULL && strcmp(s, "silu") != 0)
			unsupported(&c, "hidden_act other than silu");
		if (get_bool(&c, "use_sliding_window", 0))
			unsupported(&c, "use_sliding_window");
	} else if (strcmp(mt, "gemma3_text") == 0 || strcmp(mt, "gemma3") == 0) {
		if (strcmp(mt, "gemma3") == 0) {
			if ((c.root = gemma3_text_config(&c, root)) == NULL)
				goto out;
			if ((text = cJSON_Duplicate(c.root, 1)) == NULL) {
				c.rv = RL_ENOMEM;
				goto out;
			}
		}
		mt = "gemma3_text";
		get_gemma3(&c, cfg);
		if (text != NULL && cJSON_GetObjectItemCaseSensitive(text, "eos_token_id") == NULL &&
		    cJSON_GetObjectItemCaseSensitive(root, "eos_token_id") != NULL) {
			/* Gemma 3 4B and up: the list (<eos>, <end_of_turn>) is at the top */
			c.root = root;
			get_eos(&c, cfg);
			cJSON_AddItemToObject(text, "eos_token_id",
			    cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), 1));
		}
	} else {
		rl_error("%s: model_type '%s' is not supported", what, mt);
		rl_hint("supported: llama, qwen2, qwen3, mistral, gemma3_text, gemma3 (its text model), gpt2");
		c.rv = RL_ENOTSUP;
		goto out;
	}
	cfg->pad_id = get_int(&c, "pad_token_id", 0, -1);
	cfg->init_std = (float)get_num(&c, "initializer_range", 0.02);
	get_seq_cls(&c, cfg);
	cfg->dtype = RL_F32;
	/* transformers >= 4.56 writes "dtype", older versions "torch_dtype"; a gemma3 config
	 * may have it at the top only */
	s = get_str(&c, "torch_dtype");
	if (s == NULL)
		s = get_str(&c, "dtype");
	c.root = root;
	if (s == NULL && text != NULL && (s = get_str(&c, "torch_dtype")) == NULL)
		s = get_str(&c, "dtype");
	if (s != NULL) {
		if (strcmp(s, "bfloat16") == 0) {
			cfg->dtype = RL_BF16;
		} else if (strcmp(s, "float16") == 0 || strcmp(s, "half") == 0) {
			cfg->dtype = RL_F16;
		} else if (strcmp(s, "float32") != 0 && strcmp(s, "float") != 0 && c.rv == 0) {
			/* the dtype checkpoints are saved in: an int8 model would be saved as f32 */
			rl_error("%s: torch_dtype '%s' is not one of float32, bfloat16, float16", what, s);
			c.rv = RL_EFORMAT;
		}
	}
	snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
	if (c.rv == 0)
		c.rv = rl_config_check(cfg, what);
out:
	if (c.rv == 0 && text != NULL) {
		/* what is kept (and saved) is the text model's config, as gemma3_text */
		cJSON_DeleteItemFromObjectCaseSensitive(text, "model_type");
		cJSON_AddStringToObject(text, "model_type", "gemma3_text");
		cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
		if ((cfg->raw = cJSON_Print(text)) == NULL)
			c.rv = RL_ENOMEM;
	} else if (c.rv == 0) {
		cfg->raw = rl_xmalloc(len + 1);
		memcpy(cfg->raw, text_in, len);
		cfg->raw[len] = 0;
	}
	cJSON_Delete(text);
	cJSON_Delete(root);
	return c.rv;
}

int
rl_config_load(rl_config *cfg, const char *path)
{
	char *buf = NULL, what[4200];
	size_t len = 0;
	int rv;

	memset(cfg, 0, sizeof *cfg);
	if ((rv = rli_read_file(path, &buf, &len, (size_t)16 << 20)) != 0)
		return rv;
	snprintf(what, sizeof what, "'%s'", path);
	rv = rl_config_parse(cfg, buf, len, what);
	free(buf);
	return rv;
}

int
rl_config_check(const rl_config *c, const char *what)
{
	const char *bad = NULL;

	if (c->vocab_size <= 0) bad = "vocab_size must be positive";
	else if (c->hidden_size <= 0) bad = "hidden size must be positive";
	else if (c->n_layer <= 0) bad = "number of layers must be positive";
	else if (c->n_head <= 0 || c->n_kv_head <= 0) bad = "head counts must be positive";
	else if (c->n_head % c->n_kv_head != 0) bad = "attention heads must be a multiple of key/value heads";
	else if (c->head_dim <= 0 || c->head_dim % 2 != 0) bad = "head_dim must be positive and even";
	else if (c->intermediate_size <= 0) bad = "intermediate size must be positive";
	else if (c->max_pos <= 0) bad = "max positions must be positive";
	else if (!(c->norm_eps > 0)) bad = "norm epsilon must be positive";
	else if (c->arch == RL_ARCH_LLAMA && !(c->rope_theta > 0)) bad = "rope_theta must be positive";
	else if (c->arch == RL_ARCH_LLAMA && c->rope_factor != 0 && !(c->rope_factor > 0 && c->rope_low_freq > 0 &&
	    c->rope_high_freq > c->rope_low_freq && c->rope_orig_max_pos > 0))
		bad = "llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
		    "original_max_position_embeddings > 0";
	else if (c->arch == RL_ARCH_GPT2 && c->n_head * c->head_dim != c->hidden_size)
		bad = "n_embd must be a multiple of n_head";
	else if ((size_t)c->vocab_size * c->hidden_size > ((size_t)1 << 40)) bad = "model too large";
	/* what we save must be what transformers builds from the config we write */
	else if (c->arch == RL_ARCH_GPT2 && (!c->qkv_bias || !c->o_bias || c->qk_norm || c->n_kv_head != c->n_head))
		bad = "GPT-2 has q/k/v and output biases, no q/k norm and n_head key/value heads";
	else if (c->arch == RL_ARCH_LLAMA && strcmp(c->model_type, "qwen2") == 0 && (!c->qkv_bias || c->o_bias || c->qk_norm))
		bad = "Qwen2 has q/k/v biases, no o_proj bias and no q/k norm";
	else if (c->arch == RL_ARCH_LLAMA && strcmp(c->model_type, "qwen3") == 0 && (!c->qk_norm || c->qkv_bias != c->o_bias))
		bad = "Qwen3 has q/k norm and attention_bias on q/k/v/o alike";
	else if (c->arch == RL_ARCH_LLAMA && (strcmp(c->model_type, "llama") == 0 || c->model_type[0] == 0) &&
	    (c->qk_norm || c->qkv_bias != c->o_bias))
		bad = "Llama has no q/k norm and attention_bias on q/k/v/o alike";
	else if (c->arch == RL_ARCH_LLAMA && strcmp(c->model_type, "mistral") == 0 &&
	    (c->qk_norm || c->qkv_bias || c->o_bias))
		bad = "Mistral has no q/k norm and no attention biases";
	else if (c->arch == RL_ARCH_LLAMA && strcmp(c->model_type, "gemma3_text") == 0 &&
	    (!c->gemma || !c->qk_norm || c->qkv_bias || c->o_bias))
		bad = "Gemma 3 has q/k norm and no attention biases";
	else if (c->gemma && strcmp(c->model_type, "gemma3_text") != 0)
		bad = "Gemma's layer is model_type gemma3_text's only";
	else if (c->arch == RL_ARCH_LLAMA && c->model_type[0] != 0 && strcmp(c->model_type, "llama") != 0 &&
	    strcmp(c->model_type, "qwen2") != 0 && strcmp(c->model_type, "qwen3") != 0 &&
	    strcmp(c->model_type, "mistral") != 0 && strcmp(c->model_type, "gemma3_text") != 0)
		bad = "model_type must be llama, qwen2, qwen3, mistral or gemma3_text";
	else if (c->gemma && (c->n_layer > RL_CONFIG_MAX_LOCAL || !(c->rope_local_theta > 0) ||
	    c->rope_factor != 0 || (c->rope_linear != 0 && !(c->rope_linear >= 1))))
		bad = "Gemma 3 needs at most 256 layers, rope_local_base_freq > 0 and no scaling but linear";
	else if (c->attn_scale < 0 || c->rope_linear < 0)
		bad = "attention scale and linear RoPE factor must not be negative";
	else if (c->sliding_window < 0)
		bad = "sliding_window must not be negative";
	if (bad != NULL) {
		rl_error("%s: %s", what ? what : "config", bad);
		return RL_EFORMAT;
	}
	return RL_OK;
}

static const char *
dtype_torch(int dt)
{
	return dt == RL_BF16 ? "bfloat16" : dt == RL_F16 ? "float16" : "float32";
}

/* The transformers class of the model, as "architectures" names it. */
static const char *
arch_class(const rl_config *c)
{
	if (c->seq_cls)
		return c->arch == RL_ARCH_GPT2 ? "GPT2ForSequenceClassification" :
		    strcmp(c->model_type, "qwen2") == 0 ? "Qwen2ForSequenceClassification" :
		    strcmp(c->model_type, "qwen3") == 0 ? "Qwen3ForSequenceClassification" :
		    strcmp(c->model_type, "mistral") == 0 ? "MistralForSequenceClassification" :
		    "LlamaForSequenceClassification";
	if (c->arch == RL_ARCH_GPT2)
		return "GPT2LMHeadModel";
	return strcmp(c->model_type, "qwen2") == 0 ? "Qwen2ForCausalLM" :
	    strcmp(c->model_type, "qwen3") == 0 ? "Qwen3ForCausalLM" :
	    strcmp(c->model_type, "mistral") == 0 ? "MistralForCausalLM" :
	    strcmp(c->model_type, "gemma3_text") == 0 ? "Gemma3ForCausalLM" : "LlamaForCausalLM";
}

/* A reward model's keys as transformers writes them: the class, one label
 * (id2label / label2id; num_labels is not saved, it is their size) and
 * pad_token_id, without which ...ForSequenceClassification cannot find the
 * last token of a batch of more than one row (rl_model_open_rm makes it the
 * EOS id when a causal LM has none: the convention of TRL's reward scripts). */
static void
put_seq_cls(cJSON *root, const rl_config *c)
{
	cJSON *a, *o;
	int pad = c->pad_id;

	cJSON_DeleteItemFromObjectCaseSensitive(root, "architectures");
	a = cJSON_AddArrayToObject(root, "architectures");
	cJSON_AddItemToArray(a, cJSON_CreateString(arch_class(c)));
	cJSON_DeleteItemFromObjectCaseSensitive(root, "num_labels");
	cJSON_DeleteItemFromObjectCaseSensitive(root, "id2label");
	cJSON_DeleteItemFromObjectCaseSensitive(root, "label2id");
	o = cJSON_AddObjectToObject(root, "id2label");
	cJSON_AddStringToObject(o, "0", "LABEL_0");
	o = cJSON_AddObjectToObject(root, "label2id");
	cJSON_AddNumberToObject(o, "LABEL_0", 0);
	cJSON_DeleteItemFromObjectCaseSensitive(root, "pad_token_id");
	if (pad >= 0)
		cJSON_AddNumberToObject(root, "pad_token_id", pad);
}

char *
rl_config_to_json(const rl_config *c)
{
	cJSON *root = NULL, *a;
	char *s;

	if (c->raw != NULL && (root = cJSON_Parse(c->raw)) != NULL) {
		/* a hand-written config (rl-train --init) may lack it: transformers'
		 * Auto classes go by model_type, but vLLM and SGLang pick the model
		 * class from "architectures" and refuse a config without one */
		a = cJSON_GetObjectItemCaseSensitive(root, "architectures");
		if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0) {
			cJSON_DeleteItemFromObjectCaseSensitive(root, "architectures");
			a = cJSON_AddArrayToObject(root, "architectures");
			cJSON_AddItemToArray(a, cJSON_CreateString(arch_class(c)));
		}
		if (c->seq_cls)
			put_seq_cls(root, c);
		cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
		cJSON_AddStringToObject(root, "torch_dtype", dtype_torch(c->dtype));
		if (cJSON_GetObjectItemCaseSensitive(root, "dtype") != NULL) {
			cJSON_DeleteItemFromObjectCaseSensitive(root, "dtype");
			cJSON_AddStringToObject(root, "dtype", dtype_torch(c->dtype));
		}
		s = cJSON_Print(root);
		cJSON_Delete(root);
		return s;
	}
	root = cJSON_CreateObject();
	a = cJSON_AddArrayToObject(root, "architectures");
	cJSON_AddItemToArray(a, cJSON_CreateString(arch_class(c)));
	if (c->arch == RL_ARCH_GPT2) {
		cJSON_AddStringToObject(root, "model_type", "gpt2");
		cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
		cJSON_AddNumberToObject(root, "n_embd", c->hidden_size);
		cJSON_AddNumberToObject(root, "n_layer", c->n_layer);
		cJSON_AddNumberToObject(root, "n_head", c->n_head);
		cJSON_AddNumberToObject(root, "n_positions", c->max_pos);
		cJSON_AddNumberToObject(root, "n_ctx", c->max_pos);
		cJSON_AddNumberToObject(root, "n_inner", c->intermediate_size);
		cJSON_AddNumberToObject(root, "layer_norm_epsilon", c->norm_eps);
		cJSON_AddStringToObject(root, "activation_function", "gelu_new");
	} else {
		cJSON_AddStringToObject(root, "model_type", c->model_type[0] ? c->model_type : "llama");
		cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
		cJSON_AddNumberToObject(root, "hidden_size", c->hidden_size);
		cJSON_AddNumberToObject(root, "num_hidden_layers", c->n_layer);
		cJSON_AddNumberToObject(root, "num_attention_heads", c->n_head);
		cJSON_AddNumberToObject(root, "num_key_value_heads", c->n_kv_head);
		cJSON_AddNumberToObject(root, "head_dim", c->head_dim);
		cJSON_AddNumberToObject(root, "intermediate_size", c->intermediate_size);
		cJSON_AddNumberToObject(root, "max_position_embeddings",
		    c->max_pos_config > 0 ? c->max_pos_config : c->max_pos);
		if (c->gemma) {
			cJSON *lt = cJSON_AddArrayToObject(root, "layer_types");
			for (int l = 0; l < c->n_layer; l++)
				cJSON_AddItemToArray(lt, cJSON_CreateString(c->local[l] ? "sliding_attention" :
				    "full_attention"));
			cJSON_AddNumberToObject(root, "query_pre_attn_scalar",
			    c->attn_scale > 0 ? 1.0 / ((double)c->attn_scale * c->attn_scale) : c->head_dim);
			cJSON_AddNumberToObject(root, "rope_local_base_freq", c->rope_local_theta);
			if (c->rope_linear > 0) {
				cJSON *r = cJSON_AddObjectToObject(root, "rope_scaling");
				cJSON_AddStringToObject(r, "rope_type", "linear");
				cJSON_AddNumberToObject(r, "factor", c->rope_linear);
			}
			cJSON_AddNullToObject(root, "attn_logit_softcapping");
			cJSON_AddNullToObject(root, "final_logit_softcapping");
		}
		if (strcmp(c->model_type, "mistral") == 0 || c->gemma) {
			if (c->sliding_window > 0)
				cJSON_AddNumberToObject(root, "sliding_window", c->sliding_window);
			else
				cJSON_AddNullToObject(root, "sliding_window");
		}
		cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta);
		if (c->rope_factor > 0) {
			cJSON *r = cJSON_AddObjectToObject(root, "rope_scaling");
			cJSON_AddStringToObject(r, "rope_type", "llama3");
			cJSON_AddNumberToObject(r, "factor", c->rope_factor);
			cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq);
			cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq);
			cJSON_AddNumberToObject(r, "original_max_position_embeddings", c->rope_orig_max_pos);
		}
		cJSON_AddNumberToObject(root, "rms_norm_eps", c->norm_eps);
		cJSON_AddStringToObject(root, c->gemma ? "hidden_activation" : "hidden_act",
		    c->gemma ? "gelu_pytorch_tanh" : "silu");
		if (strcmp(c->model_type, "qwen2") != 0 && strcmp(c->model_type, "mistral") != 0)
			cJSON_AddBoolToObject(root, "attention_bias", c->qkv_bias);
	}
	cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_embeddings);
	if (c->bos_id >= 0)
		cJSON_AddNumberToObject(root, "bos_token_id", c->bos_id);
	if (c->eos_id >= 0 && c->n_eos_more > 0) {
		cJSON *l = cJSON_AddArrayToObject(root, "eos_token_id");
		cJSON_AddItemToArray(l, cJSON_CreateNumber(c->eos_id));
		for (int i = 0; i < c->n_eos_more; i++)
			cJSON_AddItemToArray(l, cJSON_CreateNumber(c->eos_more[i]));
	} else if (c->eos_id >= 0) {
		cJSON_AddNumberToObject(root, "eos_token_id", c->eos_id);
	}
	if (c->seq_cls)
		put_seq_cls(root, c);
	cJSON_AddStringToObject(root, "torch_dtype", dtype_torch(c->dtype));
	s = cJSON_Print(root);
	cJSON_Delete(root);
	return s;
}

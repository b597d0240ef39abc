/*
 * fuzz_safetensors.c — libFuzzer target for the model's hostile-input
 * parsers: the safetensors reader (the input written to a file and opened,
 * every tensor view then read end to end and converted) when the first byte
 * is even, config.json parsing (and, when it parses, writing it back and
 * parsing that) when odd.  Invariant beyond "no crash": a parsed config
 * survives rl_config_to_json -> rl_config_parse unchanged.
 *
 * Build and run by hand (not part of make check):
 *   clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -Ilib \
 *     tests/fuzz/fuzz_safetensors.c lib/model/safetensors.c lib/model/config.c lib/base/core.c lib/base/json.c lib/base/io.c \
 *     -lcjson -lzstd -lm \
 *     -o build/fuzz_safetensors && build/fuzz_safetensors -max_total_time=60 -close_fd_mask=2
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "model/safetensors.h"

static char path[64];

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (path[0] == 0) {
		snprintf(path, sizeof path, "/tmp/fuzz-st.%ld", (long)getpid());
		rl_log_init("fuzz", RL_LOG_QUIET);
	}
	if (data[0] % 2 == 0) {
		FILE *fp = fopen(path, "wb");
		rl_st_file *f = NULL;
		if (fp == NULL || fwrite(data + 1, 1, size - 1, fp) != size - 1 || fclose(fp) != 0)
			abort();
		if (rl_st_open(&f, path) == 0) {
			float buf[64];
			for (int i = 0; i < f->n; i++) {
				const rl_st_tensor *t = &f->t[i];
				volatile uint8_t acc = 0;
				for (size_t j = 0; j < t->nbytes; j++)
					acc ^= ((const uint8_t *)t->data)[j];
				for (size_t j = 0; j < t->nelem && j < 64; j += 8)
					rl_st_to_f32(buf, t, j, RL_MIN((size_t)8, t->nelem - j));
				if (rl_st_find(f, t->name) != t)
					abort();
			}
		}
		rl_st_close(f);
	} else {
		rl_config c, d;
		if (rl_config_parse(&c, (const char *)data + 1, size - 1, "fuzz") == 0) {
			char *js = rl_config_to_json(&c);
			free(c.raw);
			c.raw = NULL;
			char *js2 = rl_config_to_json(&c); /* generated from the fields */
			if (rl_config_parse(&d, js2, strlen(js2), "fuzz2") != 0)
				abort();
			if (d.vocab_size != c.vocab_size || d.hidden_size != c.hidden_size ||
			    d.n_layer != c.n_layer || d.n_head != c.n_head || d.n_kv_head != c.n_kv_head ||
			    d.head_dim != c.head_dim || d.intermediate_size != c.intermediate_size ||
			    d.qkv_bias != c.qkv_bias || d.o_bias != c.o_bias || d.qk_norm != c.qk_norm ||
			    d.tie_embeddings != c.tie_embeddings || d.arch != c.arch || d.dtype != c.dtype)
				abort();
			rl_config_fini(&d);
			free(js);
			free(js2);
		}
		rl_config_fini(&c);
	}
	return 0;
}

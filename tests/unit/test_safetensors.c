/*
 * test_safetensors.c — the safetensors reader/writer, config.json parsing and
 * model loading on bad input: each failure returns the right code and its
 * message names the file and the tensor (or key); nothing crashes (run under
 * ASan/UBSan by `make check SANITIZE=...`), including on randomly corrupted
 * headers.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/model.h"
#include "base/rng.h"
#include "model/safetensors.h"
#include "t.h"

static char tmpd[] = "/tmp/rl-test-st.XXXXXX";
static char errbuf[8192];

/* Run f with stderr captured into errbuf. */
#define CAPTURE(stmt)                                                            \
	do {                                                                     \
		char cp_[600];                                                   \
		snprintf(cp_, sizeof cp_, "%s/stderr", tmpd);                    \
		fflush(stderr);                                                  \
		int save_ = dup(2), fd_ = open(cp_, O_RDWR | O_CREAT | O_TRUNC, 0644); \
		dup2(fd_, 2);                                                    \
		stmt;                                                            \
		fflush(stderr);                                                  \
		dup2(save_, 2);                                                  \
		close(save_);                                                    \
		ssize_t n_ = pread(fd_, errbuf, sizeof errbuf - 1, 0);           \
		errbuf[n_ > 0 ? n_ : 0] = 0;                                     \
		close(fd_);                                                      \
	} while (0)
#define T_ERR_HAS(s) T_OK(strstr(errbuf, (s)) != NULL, "stderr lacks \"%s\": %s", (s), errbuf)

static char *
tpath(const char *name)
{
	static char p[4][600];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof p[k], "%s/%s", tmpd, name);
	return p[k];
}

static void
write_bytes(const char *path, const void *b, size_t n)
{
	FILE *fp = fopen(path, "wb");
	if (fp == NULL || fwrite(b, 1, n, fp) != n || fclose(fp) != 0) {
		perror(path);
		exit(1);
	}
}

/* A safetensors file with header h (as given) and nd data bytes. */
static void
craft(const char *path, const char *h, size_t nd)
{
	size_t hl = strlen(h), n = 8 + hl + nd;
	unsigned char *b = calloc(1, n);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, h, hl);
	write_bytes(path, b, n);
	free(b);
}

static int
fill(void *ctx, int i, void *buf, size_t nbytes)
{
	for (size_t j = 0; j < nbytes; j++)
		((unsigned char *)buf)[j] = (unsigned char)(i * 31 + j);
	return 0;
}

static void
test_round_trip(void)
{
	rl_st_entry e[4] = {
		{ .name = "a.weight", .dtype = RL_F32, .ndim = 2, .shape = { 2, 3 } },
		{ .name = "b", .dtype = RL_BF16, .ndim = 1, .shape = { 5 } },
		{ .name = "c", .dtype = RL_I32, .ndim = 0 },
		{ .name = "h", .dtype = RL_F16, .ndim = 1, .shape = { 4 } },
	};
	const char *meta[] = { "format", "pt" };
	rl_st_file *f = NULL;
	const rl_st_tensor *t;
	float x[6];

	T_EQ_INT(rl_st_write(tpath("ok.safetensors"), e, 4, meta, 1, fill, NULL), 0);
	T_EQ_INT(rl_st_open(&f, tpath("ok.safetensors")), 0);
	if (f == NULL)
		return;
	T_EQ_INT(f->n, 4);
	t = rl_st_find(f, "h");
	T_OK(t != NULL && t->dtype == RL_F16 && rl_st_to_f32(x, t, 0, 4) == 0, "f16 tensor");
	if (t != NULL) {
		uint16_t h;
		memcpy(&h, (const char *)t->data + 6, 2);
		T_OK(x[3] == rl_f16_to_f32(h), "f16 conversion");
	}
	T_OK((t = rl_st_find(f, "a.weight")) != NULL && t->ndim == 2 && t->shape[1] == 3 && t->nbytes == 24, "check");
	T_OK((t = rl_st_find(f, "b")) != NULL && t->dtype == RL_BF16 && t->nelem == 5, "check");
	T_OK((t = rl_st_find(f, "c")) != NULL && t->ndim == 0 && t->nelem == 1 && t->nbytes == 4, "check");
	T_OK(rl_st_find(f, "d") == NULL, "check");
	t = rl_st_find(f, "b");
	T_EQ_INT(rl_st_to_f32(x, t, 0, 5), 0);
	T_EQ_INT(rl_st_to_f32(x, t, 3, 3), RL_EINVAL);
	{
		uint16_t h;
		memcpy(&h, (const char *)t->data + 2, 2);
		T_OK(x[1] == rl_bf16_to_f32(h), "check");
	}
	T_EQ_INT(rl_st_to_f32(x, rl_st_find(f, "c"), 0, 1), RL_ESHAPE);
	rl_st_close(f);
	/* header padded to 8 */
	{
		FILE *fp = fopen(tpath("ok.safetensors"), "rb");
		unsigned char b[8];
		T_OK(fp != NULL && fread(b, 1, 8, fp) == 8 && b[0] % 8 == 0, "check");
		if (fp)
			fclose(fp);
	}
	/* the same bytes from memory (rl-rollout's weights fetched from rl-sync) */
	{
		char *b = NULL;
		size_t n = 0;
		T_EQ_INT(rli_read_file(tpath("ok.safetensors"), &b, &n, 1 << 20), 0);
		if (b != NULL) {
			T_EQ_INT(rl_st_open_mem(&f, "fetched v3", b, n), 0);
			T_OK(f != NULL && f->n == 4 && (t = rl_st_find(f, "b")) != NULL && t->nelem == 5 &&
			    (const char *)t->data > b && (const char *)t->data < b + n, "tensors viewed in the buffer");
			rl_st_close(f);
			f = NULL;
			/* cut short: refused, named, and the caller's buffer is left alone */
			CAPTURE(T_EQ_INT(rl_st_open_mem(&f, "fetched v3", b, n - 1), RL_EFORMAT));
			T_ERR_HAS("'fetched v3'");
			T_OK(f == NULL, "nothing returned on error");
			CAPTURE(T_EQ_INT(rl_st_open_mem(&f, "fetched v3", b, 7), RL_EFORMAT));
			T_ERR_HAS("too short");
			free(b);
		}
	}
	e[2].name = "a.weight";
	CAPTURE(T_EQ_INT(rl_st_write(tpath("dup.safetensors"), e, 3, NULL, 0, fill, NULL), RL_EINVAL));
	T_ERR_HAS("'a.weight' written twice");
}

static void
test_bad_files(void)
{
	rl_st_file *f = NULL;
	const char *p;

	p = tpath("short.safetensors");
	write_bytes(p, "\x10\0\0", 3);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("short.safetensors': 3 bytes");

	p = tpath("hlen.safetensors");
	write_bytes(p, "\xff\xff\0\0\0\0\0\0{}", 10);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("header length 65535 does not fit");

	p = tpath("json.safetensors");
	craft(p, "{\"a\": {\"dtype\": \"F32\"", 0);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("json.safetensors': header is not a JSON object");

	/* truncated: the data of the last tensor is cut off */
	p = tpath("trunc.safetensors");
	craft(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	    "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 20);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("trunc.safetensors': tensor 'y': data_offsets [8, 24] past the end");

	/* the header lies: shape x dtype is not the range */
	p = tpath("lie.safetensors");
	craft(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("lie.safetensors': tensor 'w': shape x dtype is 12 bytes but data_offsets span 24");

	p = tpath("overlap.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
	    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("tensors 'a' and 'b' overlap");

	p = tpath("dupkey.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("tensor 'a' appears twice");

	/* a bad __metadata__ after a good tensor (a tests/fuzz/fuzz_safetensors.c case) */
	p = tpath("meta.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"__metadata__\":[0]}", 4);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("__metadata__ is not an object");
	T_OK(f == NULL, "file returned on error");

	p = tpath("dtype.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("tensor 'a': unknown dtype 'Q4'");

	p = tpath("shape.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("tensor 'a': bad shape");

	/* shape product overflowing size_t */
	p = tpath("huge.safetensors");
	craft(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4);
	CAPTURE(T_EQ_INT(rl_st_open(&f, p), RL_EFORMAT));
	T_ERR_HAS("tensor 'a': bad shape");

	CAPTURE(T_EQ_INT(rl_st_open(&f, tpath("absent.safetensors")), RL_ENOENT));
	T_ERR_HAS("cannot open");
	T_OK(f == NULL, "check");
}

/* Random corruption of a valid file: never a crash, never a view outside it. */
static void
test_corruption(void)
{
	const char *src = "tests/fixtures/qwen2/model.safetensors";
	FILE *fp = fopen(src, "rb");
	unsigned char *b, *c;
	long n;
	rl_rng r = { 99, 0 };
	int ok = 0, bad = 0;

	if (fp == NULL || fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0) {
		T_OK(0, "cannot read %s", src);
		return;
	}
	rewind(fp);
	b = malloc((size_t)n);
	c = malloc((size_t)n);
	T_OK(fread(b, 1, (size_t)n, fp) == (size_t)n, "check");
	fclose(fp);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | b[i];
	for (int it = 0; it < 300; it++) {
		rl_st_file *f = NULL;
		size_t len = (size_t)n;
		memcpy(c, b, (size_t)n);
		if (it % 3 == 0) {
			len = 1 + rl_rng_next(&r) % (size_t)n;          /* truncation */
		} else {
			for (int k = 0; k < 1 + it % 4; k++) {          /* digits and punctuation */
				size_t at = 8 + rl_rng_next(&r) % hl;
				c[at] = "0123456789,:[]{}\"-eE."[rl_rng_next(&r) % 21];
			}
		}
		write_bytes(tpath("fuzz.safetensors"), c, len);
		int rv = 0;
		CAPTURE(rv = rl_st_open(&f, tpath("fuzz.safetensors")));
		if (rv == 0) {
			ok++;
			for (int i = 0; i < f->n; i++) {
				const char *d = f->t[i].data;
				T_OK(d >= (const char *)f->map && d + f->t[i].nbytes <= (const char *)f->map + f->size, "check");
			}
		} else {
			bad++;
			T_OK(rv == RL_EFORMAT, "rv %d", rv);
			T_ERR_HAS("fuzz.safetensors");
		}
		rl_st_close(f);
	}
	T_OK(bad > 100, "only %d of 300 corruptions detected", bad);
	free(b);
	free(c);
}

/* Llama 3.1 / 3.2's RoPE scaling (rope_type "llama3"): where transformers 4 and 5 write it, what
 * is refused and why, and that saving keeps it. */
static void
test_config_llama3(void)
{
	rl_config c, d;
	char b[900], *js;
	const char *base = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
	    "\"num_attention_heads\":2,\"intermediate_size\":16";
	const char *l31 = "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
	    "\"original_max_position_embeddings\":8192";

	/* transformers 4: top-level rope_theta, rope_scaling with "rope_type" (Llama 3.1) */
	snprintf(b, sizeof b, "%s,\"rope_theta\":500000.0,\"rope_scaling\":{%s,\"rope_type\":\"llama3\"}}", base,
	    l31);
	T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'l31.json'"), 0);
	T_CLOSE(c.rope_theta, 5e5, 0, 0);
	T_CLOSE(c.rope_factor, 8, 0, 0);
	T_CLOSE(c.rope_low_freq, 1, 0, 0);
	T_CLOSE(c.rope_high_freq, 4, 0, 0);
	T_EQ_INT(c.rope_orig_max_pos, 8192);
	/* saving keeps the text, so transformers reads the same scaling back */
	js = rl_config_to_json(&c);
	T_EQ_INT(rl_config_parse(&d, js, strlen(js), "'saved.json'"), 0);
	T_OK(d.rope_theta == c.rope_theta && d.rope_factor == c.rope_factor && d.rope_low_freq == c.rope_low_freq &&
	    d.rope_high_freq == c.rope_high_freq && d.rope_orig_max_pos == c.rope_orig_max_pos, "%s", js);
	free(js);
	rl_config_fini(&d);
	/* a config built in code (no text) writes rope_scaling from the fields */
	free(c.raw);
	c.raw = NULL;
	js = rl_config_to_json(&c);
	T_OK(strstr(js, "\"rope_type\":\t\"llama3\"") != NULL, "%s", js);
	T_EQ_INT(rl_config_parse(&d, js, strlen(js), "'gen.json'"), 0);
	T_OK(d.rope_theta == c.rope_theta && d.rope_factor == c.rope_factor && d.rope_low_freq == c.rope_low_freq &&
	    d.rope_high_freq == c.rope_high_freq && d.rope_orig_max_pos == c.rope_orig_max_pos, "%s", js);
	free(js);
	rl_config_fini(&d);
	/* and rl_config_check refuses a code-built scaling that makes no sense */
	c.rope_low_freq = 4;
	CAPTURE(T_EQ_INT(rl_config_check(&c, "'code'"), RL_EFORMAT));
	T_ERR_HAS("'code': llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0");
	rl_config_fini(&c);

	/* transformers 5: one rope_parameters object with rope_theta in it (Llama 3.2); the
	 * legacy "type" key of older configs */
	snprintf(b, sizeof b, "%s,\"rope_parameters\":{%s,\"rope_theta\":500000.0,\"rope_type\":\"llama3\"}}",
	    base, l31);
	T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'v5.json'"), 0);
	T_CLOSE(c.rope_theta, 5e5, 0, 0);
	T_CLOSE(c.rope_factor, 8, 0, 0);
	T_EQ_INT(c.rope_orig_max_pos, 8192);
	rl_config_fini(&c);
	snprintf(b, sizeof b, "%s,\"rope_scaling\":{%s,\"type\":\"llama3\"}}", base, l31);
	T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'legacy.json'"), 0);
	T_CLOSE(c.rope_theta, 1e4, 0, 0);
	T_CLOSE(c.rope_high_freq, 4, 0, 0);
	rl_config_fini(&c);
	/* no scaling: the fields stay 0 */
	snprintf(b, sizeof b, "%s}", base);
	T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'plain.json'"), 0);
	T_OK(c.rope_factor == 0 && c.rope_low_freq == 0 && c.rope_high_freq == 0 && c.rope_orig_max_pos == 0,
	    "plain config has scaling %g", c.rope_factor);
	rl_config_fini(&c);

	/* bad values, each named */
	static const struct { const char *keys, *err; } bad[] = {
		{ "\"factor\":0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"factor\" must be a positive number" },
		{ "\"factor\":-8,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"factor\" must be a positive number" },
		{ "\"factor\":\"8\",\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"factor\" must be a positive number" },
		{ "\"factor\":1e39,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"factor\" must be a positive number" }, /* beyond fp32 */
		{ "\"factor\":8,\"low_freq_factor\":0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"low_freq_factor\" must be a positive number" },
		{ "\"factor\":8,\"low_freq_factor\":4.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"high_freq_factor\" (4) must be greater than \"low_freq_factor\" (4)" },
		{ "\"factor\":8,\"low_freq_factor\":4.0,\"high_freq_factor\":1.0,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": \"high_freq_factor\" (1) must be greater than \"low_freq_factor\" (4)" },
		{ "\"factor\":8,\"low_freq_factor\":1.0,\"high_freq_factor\":null,\"original_max_position_embeddings\":8192",
		  "key \"rope_scaling\": rope_type 'llama3' needs \"high_freq_factor\"" },
		{ "\"factor\":8,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":0",
		  "key \"rope_scaling\": \"original_max_position_embeddings\" must be a positive integer" },
		{ "\"factor\":8,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":81.5",
		  "key \"rope_scaling\": \"original_max_position_embeddings\" must be a positive integer" },
		{ "\"factor\":8,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0",
		  "key \"rope_scaling\": rope_type 'llama3' needs \"original_max_position_embeddings\"" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(b, sizeof b, "%s,\"rope_scaling\":{%s,\"rope_type\":\"llama3\"}}", base, bad[i].keys);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'bad.json'"), RL_EFORMAT));
		T_ERR_HAS(bad[i].err);
	}
	/* the other scalings stay refused, under either key and either name of the type */
	static const char *const other[] = { "linear", "dynamic", "yarn", "longrope" };
	for (int i = 0; i < 4; i++) {
		snprintf(b, sizeof b, "%s,\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"%s\"}}", base, other[i]);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'o.json'"), RL_ENOTSUP));
		char want[96];
		snprintf(want, sizeof want, "'o.json': rope_scaling with rope_type '%s' is not supported", other[i]);
		T_ERR_HAS(want);
		snprintf(b, sizeof b, "%s,\"rope_parameters\":{\"factor\":8.0,\"rope_theta\":1e6,\"type\":\"%s\"}}",
		    base, other[i]);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'o.json'"), RL_ENOTSUP));
		snprintf(want, sizeof want, "'o.json': rope_parameters with rope_type '%s' is not supported", other[i]);
		T_ERR_HAS(want);
	}
}

static void
test_config(void)
{
	rl_config c;
	const char *q = "{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
	    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":16,\"eos_token_id\":[5,6]}";

	T_EQ_INT(rl_config_parse(&c, q, strlen(q), "'q.json'"), 0);
	T_EQ_INT(c.head_dim, 4);
	T_EQ_INT(c.qkv_bias, 1);
	T_EQ_INT(c.o_bias, 0);
	T_EQ_INT(c.eos_id, 5);
	T_EQ_INT(c.n_eos_more, 1); /* the list's other ids end generation too */
	T_EQ_INT(c.eos_more[0], 6);
	T_EQ_INT(c.tie_embeddings, 0);
	T_CLOSE(c.rope_theta, 10000, 0, 0);
	T_EQ_INT(c.max_pos, 32768);
	T_EQ_INT(c.dtype, RL_F32);
	rl_config_fini(&c);
	{
		/* newer transformers write "dtype"; saving keeps both keys right */
		char q2[600];
		snprintf(q2, sizeof q2, "%.*s,\"dtype\":\"bfloat16\"}", (int)strlen(q) - 1, q);
		T_EQ_INT(rl_config_parse(&c, q2, strlen(q2), "'q2.json'"), 0);
		T_EQ_INT(c.dtype, RL_BF16);
		c.dtype = RL_F16;
		char *js = rl_config_to_json(&c);
		T_OK(strstr(js, "\"dtype\":\t\"float16\"") != NULL && strstr(js, "\"torch_dtype\":\t\"float16\"") != NULL,
		    "%s", js);
		/* q has no "architectures" (as an rl-train --init config): vLLM needs one */
		T_OK(strstr(js, "\"architectures\":\t[\"Qwen2ForCausalLM\"]") != NULL, "%s", js);
		free(js);
		rl_config_fini(&c);
	}

	const char *miss = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
	    "\"num_attention_heads\":2,\"intermediate_size\":16}";
	CAPTURE(T_EQ_INT(rl_config_parse(&c, miss, strlen(miss), "'m/config.json'"), RL_EFORMAT));
	T_ERR_HAS("'m/config.json': missing key \"num_hidden_layers\"");

	const char *typ = "{\"model_type\":\"llama\",\"vocab_size\":\"10\",\"hidden_size\":8,"
	    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16}";
	CAPTURE(T_EQ_INT(rl_config_parse(&c, typ, strlen(typ), "'t.json'"), RL_EFORMAT));
	T_ERR_HAS("key \"vocab_size\" is not an integer");

	/* Llama 3's scaling needs its four keys (transformers: a KeyError without one) */
	const char *rs = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
	    "\"num_attention_heads\":2,\"intermediate_size\":16,\"rope_scaling\":{\"type\":\"llama3\"}}";
	CAPTURE(T_EQ_INT(rl_config_parse(&c, rs, strlen(rs), "'r.json'"), RL_EFORMAT));
	T_ERR_HAS("'r.json': key \"rope_scaling\": rope_type 'llama3' needs \"factor\"");
	{
		/* transformers 5 keeps the base in "rope_parameters" and writes no
		 * top-level rope_theta: reading only the top level rotated by 10000 */
		char b[700];
		snprintf(b, sizeof b, "%.*s,\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"}}",
		    (int)strlen(q) - 1, q);
		T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'v5.json'"), 0);
		T_CLOSE(c.rope_theta, 1e6, 0, 0);
		rl_config_fini(&c);
		/* a Llama 3.2 config as transformers 5 writes it, without one of llama3's keys */
		snprintf(b, sizeof b, "%.*s,\"rope_parameters\":{\"factor\":32.0,\"rope_theta\":500000.0,"
		    "\"rope_type\":\"llama3\"}}", (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'l3.json'"), RL_EFORMAT));
		T_ERR_HAS("'l3.json': key \"rope_parameters\": rope_type 'llama3' needs \"low_freq_factor\"");
		snprintf(b, sizeof b, "%.*s,\"rope_parameters\":{\"rope_theta\":1e4,\"partial_rotary_factor\":0.5}}",
		    (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'p.json'"), RL_ENOTSUP));
		T_ERR_HAS("partial_rotary_factor other than 1 is not supported");
		snprintf(b, sizeof b, "%.*s,\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6},"
		    "\"sliding_attention\":{\"rope_theta\":1e4}}}", (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'n.json'"), RL_ENOTSUP));
		T_ERR_HAS("key \"rope_parameters\" holds one set per layer type ('full_attention')");
		snprintf(b, sizeof b, "%.*s,\"rope_parameters\":\"x\"}", (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'x.json'"), RL_EFORMAT));
		T_ERR_HAS("key \"rope_parameters\" is not an object");
		/* rope_type "default" is no scaling: transformers computes plain RoPE */
		snprintf(b, sizeof b, "%.*s,\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"default\"}}",
		    (int)strlen(q) - 1, q);
		T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'d.json'"), 0);
		T_CLOSE(c.rope_theta, 5e5, 0, 0);
		rl_config_fini(&c);
	}

	const char *gqa = "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
	    "\"num_attention_heads\":3,\"num_key_value_heads\":2,\"intermediate_size\":16,\"head_dim\":4}";
	CAPTURE(T_EQ_INT(rl_config_parse(&c, gqa, strlen(gqa), "'g.json'"), RL_EFORMAT));
	T_ERR_HAS("multiple of key/value heads");

	{
		char b[700];
		snprintf(b, sizeof b, "%.*s,\"torch_dtype\":\"int8\"}", (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'i8.json'"), RL_EFORMAT));
		T_ERR_HAS("torch_dtype 'int8' is not one of float32, bfloat16, float16");
		snprintf(b, sizeof b, "{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":4000000000,"
		    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16}");
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'h.json'"), RL_EFORMAT));
		T_ERR_HAS("key \"hidden_size\" is 4000000000, out of range");
		snprintf(b, sizeof b, "%.*s[5,\"x\"]}", (int)strlen(q) - 6, q); /* q ends in [5,6]} */
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'e.json'"), RL_EFORMAT));
		T_ERR_HAS("key \"eos_token_id\": item 1 is not a token id");
		snprintf(b, sizeof b, "%.*s} junk", (int)strlen(q) - 1, q);
		CAPTURE(T_EQ_INT(rl_config_parse(&c, b, strlen(b), "'j.json'"), RL_EFORMAT));
	}
	CAPTURE(T_EQ_INT(rl_config_parse(&c, "{\"model_type\":\"bert\"}", 21, "'b.json'"), RL_ENOTSUP));
	T_ERR_HAS("model_type 'bert' is not supported");
	CAPTURE(T_EQ_INT(rl_config_parse(&c, "[1]", 3, "'x.json'"), RL_EFORMAT));
	T_ERR_HAS("'x.json': not a JSON object");

	/* a Qwen3 config without head_dim: transformers' Qwen3Config says 128 */
	const char *q3 = "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
	    "\"num_attention_heads\":2,\"intermediate_size\":16}";
	T_EQ_INT(rl_config_parse(&c, q3, strlen(q3), "'q3.json'"), 0);
	T_EQ_INT(c.head_dim, 128);
	T_EQ_INT(c.qk_norm, 1);
	rl_config_fini(&c);

	const char *g2 = "{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_embd\":8,\"n_layer\":1,\"n_head\":2,"
	    "\"n_positions\":16,\"n_inner\":null}";
	T_EQ_INT(rl_config_parse(&c, g2, strlen(g2), "'g2.json'"), 0);
	T_EQ_INT(c.intermediate_size, 32);
	T_EQ_INT(c.tie_embeddings, 1);
	T_CLOSE(c.norm_eps, 1e-5, 1e-9, 0);
	rl_config_fini(&c);
}

/* rl_st_write fill: tensor i of the model, and at i == n its embedding again */
typedef struct tied_ctx { rl_model *m; int n; } tied_ctx;
static int
fill_tied(void *ctx, int i, void *buf, size_t nbytes)
{
	tied_ctx *c = ctx;
	return rl_model_get(c->m, i < c->n ? i : c->m->wte, RL_MODEL_PARAM, buf);
}

/* A copy of the qwen2 fixture with config.json edited by a sed expression. */
static const char *
model_variant(const char *name, const char *sed)
{
	static char d[600];
	char cmd[2000];
	snprintf(d, sizeof d, "%s/%s", tmpd, name);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp tests/fixtures/qwen2/model.safetensors '%s/' && "
	    "sed '%s' tests/fixtures/qwen2/config.json > '%s/config.json'", d, d, sed, d);
	if (system(cmd) != 0)
		exit(1);
	return d;
}

static void
test_model_open(rl_ops *o)
{
	rl_model *m = NULL;
	const char *d;
	char cmd[1400];

	d = model_variant("shape", "s/\"intermediate_size\": 48/\"intermediate_size\": 40/");
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_ESHAPE));
	T_ERR_HAS("shape/model.safetensors': tensor 'model.layers.0.mlp.gate_proj.weight' has shape [48, 32], "
	    "config.json implies [40, 32]");
	T_OK(m == NULL, "check");

	d = model_variant("layers", "s/\"num_hidden_layers\": 2/\"num_hidden_layers\": 3/");
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_ENOENT));
	T_ERR_HAS("no tensor 'model.layers.2.input_layernorm.weight' in model.safetensors");

	d = model_variant("nokey", "/\"hidden_size\"/d");
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_EFORMAT));
	T_ERR_HAS("nokey/config.json': missing key \"hidden_size\"");

	/* tied config over a file whose lm_head differs from the embedding */
	d = model_variant("tied", "s/\"tie_word_embeddings\": false/\"tie_word_embeddings\": true/");
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_EFORMAT));
	T_ERR_HAS("tensor 'lm_head.weight' differs from the embedding");

	/* tied config over a file that also stores the head, equal to the embedding
	 * (what some exporters write): loads */
	{
		rl_model *t = NULL;
		T_EQ_INT(rl_model_open(&t, "tests/fixtures/qwen2_tied", o), 0);
		if (t != NULL) {
			tied_ctx tc = { t, t->tt.n };
			rl_st_entry *e = calloc((size_t)t->tt.n + 1, sizeof *e);
			for (int i = 0; i <= t->tt.n; i++) {
				const rl_tensor *x = &t->tt.t[i < t->tt.n ? i : t->wte];
				e[i].name = i < t->tt.n ? x->name : "lm_head.weight";
				e[i].dtype = RL_F32;
				e[i].ndim = rl_tensor_file_shape(x, e[i].shape);
			}
			snprintf(cmd, sizeof cmd, "mkdir -p '%s/tiedsame' && cp tests/fixtures/qwen2_tied/config.json '%s/tiedsame/'",
			    tmpd, tmpd);
			T_EQ_INT(system(cmd), 0);
			T_EQ_INT(rl_st_write(tpath("tiedsame/model.safetensors"), e, t->tt.n + 1, NULL, 0, fill_tied, &tc), 0);
			rl_model_close(t);
			t = NULL;
			T_EQ_INT(rl_model_open(&t, tpath("tiedsame"), o), 0);
			rl_model_close(t);
			free(e);
		}
	}

	/* shards: an index naming a missing shard, then a valid two-way split */
	d = model_variant("shards", "s/x/x/");
	snprintf(cmd, sizeof cmd, "cd '%s' && mv model.safetensors a.safetensors && printf '%%s' "
	    "'{\"weight_map\":{\"model.norm.weight\":\"a.safetensors\",\"lm_head.weight\":\"b.safetensors\"}}' "
	    "> model.safetensors.index.json", d);
	T_EQ_INT(system(cmd), 0);
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_ENOENT));
	T_ERR_HAS("b.safetensors");
	snprintf(cmd, sizeof cmd, "cd '%s' && printf '%%s' "
	    "'{\"weight_map\":{\"model.norm.weight\":\"a.safetensors\",\"lm_head.weight\":\"a.safetensors\"}}' "
	    "> model.safetensors.index.json", d);
	T_EQ_INT(system(cmd), 0);
	T_EQ_INT(rl_model_open(&m, d, o), 0);
	rl_model_close(m);
	m = NULL;
	snprintf(cmd, sizeof cmd, "cd '%s' && printf '%%s' "
	    "'{\"weight_map\":{\"model.nope\":\"a.safetensors\"}}' > model.safetensors.index.json", d);
	T_EQ_INT(system(cmd), 0);
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_EFORMAT));
	T_ERR_HAS("tensor 'model.nope' is not in the shard the index names");

	/* model.safetensors beside an index whose shards were not fetched: transformers
	 * loads model.safetensors, so do we */
	d = model_variant("both", "s/x/x/");
	snprintf(cmd, sizeof cmd, "cd '%s' && printf '%%s' "
	    "'{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}' "
	    "> model.safetensors.index.json", d);
	T_EQ_INT(system(cmd), 0);
	T_EQ_INT(rl_model_open(&m, d, o), 0);
	rl_model_close(m);
	m = NULL;

	d = model_variant("missing", "s/x/x/");
	snprintf(cmd, sizeof cmd, "rm '%s/model.safetensors'", d);
	T_EQ_INT(system(cmd), 0);
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_ENOENT));
	T_ERR_HAS("missing/model.safetensors': No such file");
	T_OK(strstr(errbuf, "hint") == NULL, "a hint without pickle weights: %s", errbuf);
	/* only pickle weights: say so */
	snprintf(cmd, sizeof cmd, "touch '%s/pytorch_model.bin'", d);
	T_EQ_INT(system(cmd), 0);
	CAPTURE(T_EQ_INT(rl_model_open(&m, d, o), RL_ENOENT));
	T_ERR_HAS("has PyTorch pickle weights (pytorch_model.bin) only");
}

int
main(void)
{
	rl_ops *o = NULL;
	char cmd[128];

	T_BEGIN("test_safetensors");
	if (access("tests/fixtures/qwen2/config.json", R_OK) != 0)
		T_SKIP("run from the repository root (tests/fixtures missing)");
	if (mkdtemp(tmpd) == NULL)
		T_SKIP("no temporary directory");
	T_EQ_INT(rl_ops_cpu_open(&o), 0);
	test_round_trip();
	test_bad_files();
	test_corruption();
	test_config();
	test_config_llama3();
	test_model_open(o);
	rl_ops_close(o);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpd);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpd);
	T_END();
}

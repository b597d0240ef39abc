/*
 * conf.h — a run file: one flat YAML mapping of option names to values,
 * read through libyaml, each entry with the line it came from.
 *
 *   algo: grpo          # a scalar: one entry
 *   lr: 1e-6
 *   quiet: true
 *   task: [math, gsm8k] # a sequence of scalars: one entry per element
 *
 * What the keys mean is the caller's (base/cli.h maps them to long
 * options).  Left out: nested values (reported as such, with their line,
 * for the caller to refuse), more than one document (the first is read).
 */
#ifndef RL_CONF_H
#define RL_CONF_H

#include <stddef.h>

enum {
	RL_CONF_SCALAR,   /* val is the text */
	RL_CONF_NULL,     /* "key:" with nothing, "~" or "null": val is "" */
	RL_CONF_MAPPING,  /* a mapping as the value: val is "" */
	RL_CONF_NESTED,   /* a sequence or mapping inside a sequence: val is "" */
};

typedef struct rl_conf_entry {
	char *key, *val;   /* owned by the rl_conf */
	int line;          /* 1-based line of the value */
	int type;          /* RL_CONF_* */
	int in_seq;        /* 1: an element of a sequence */
} rl_conf_entry;

typedef struct rl_conf {
	rl_conf_entry *e;
	size_t n, cap;
} rl_conf;

/* Reads path ("-" is not special) into c (zeroed by the caller, or fresh from
 * rl_conf_fini).  An empty file is an empty mapping.  Errors are logged as
 * "'PATH': line L: ..." and returned: RL_ENOENT or RL_EIO (cannot read),
 * RL_EFORMAT (not YAML, not a mapping at the top, a key that is not a plain
 * scalar, a key given twice), RL_ENOMEM. */
int rl_conf_read(rl_conf *c, const char *path);
/* Frees c's entries; c is empty afterwards.  Accepts a zeroed c. */
void rl_conf_fini(rl_conf *c);

#endif

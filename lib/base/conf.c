/*
 * conf.c — run files: a flat YAML mapping read with libyaml's document
 * loader into (key, value, line) entries (see conf.h).
 * Leaves out: what a key means and whether its value is valid, which are
 * the caller's.
 */
#include "base/conf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/core.h"

void
rl_conf_fini(rl_conf *c)
{
	for (size_t i = 0; i < c->n; i++) {
		free(c->e[i].key);
		free(c->e[i].val);
	}
	free(c->e);
	memset(c, 0, sizeof *c);
}

static int
add(rl_conf *c, const char *key, const char *val, size_t vlen, int line, int type, int in_seq)
{
	rl_conf_entry *e;

	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 16;
		if ((e = realloc(c->e, cap * sizeof *e)) == NULL)
			return RL_ENOMEM;
		c->e = e;
		c->cap = cap;
	}
	e = &c->e[c->n];
	memset(e, 0, sizeof *e);
	if ((e->key = strdup(key)) == NULL || (e->val = rl_try_malloc(vlen + 1, "a run file's value")) == NULL) {
		free(e->key);
		return RL_ENOMEM;
	}
	memcpy(e->val, val, vlen);
	e->val[vlen] = 0;
	e->line = line;
	e->type = type;
	e->in_seq = in_seq;
	c->n++;
	return RL_OK;
}

/* YAML 1.2's core schema nulls, which a plain scalar alone can spell */
static int
is_null(const yaml_node_t *n)
{
	const char *v = (const char *)n->data.scalar.value;

	if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static int
add_value(rl_conf *c, const char *key, yaml_document_t *doc, yaml_node_t *v, int in_seq)
{
	int line = (int)v->start_mark.line + 1;

	switch (v->type) {
	case YAML_SCALAR_NODE:
		if (is_null(v))
			return add(c, key, "", 0, line, RL_CONF_NULL, in_seq);
		return add(c, key, (const char *)v->data.scalar.value, v->data.scalar.length, line, RL_CONF_SCALAR,
		    in_seq);
	case YAML_SEQUENCE_NODE:
		if (in_seq)
			return add(c, key, "", 0, line, RL_CONF_NESTED, 1);
		for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
			int rv = add_value(c, key, doc, yaml_document_get_node(doc, *it), 1);
			if (rv != 0)
				return rv;
		}
		return RL_OK;
	default:
		return add(c, key, "", 0, line, in_seq ? RL_CONF_NESTED : RL_CONF_MAPPING, in_seq);
	}
}

static int
load(rl_conf *c, const char *path, yaml_document_t *doc)
{
	yaml_node_t *root = yaml_document_get_root_node(doc);

	if (root == NULL)   /* an empty file */
		return RL_OK;
	if (root->type != YAML_MAPPING_NODE) {
		rl_error("'%s': line %d: want a mapping of option names to values (name: value)", path,
		    (int)root->start_mark.line + 1);
		return RL_EFORMAT;
	}
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
		yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
		const char *key;
		int line = (int)k->start_mark.line + 1, rv;

		if (k->type != YAML_SCALAR_NODE || !*(key = (const char *)k->data.scalar.value)) {
			rl_error("'%s': line %d: a key must be an option name", path, line);
			return RL_EFORMAT;
		}
		for (size_t i = 0; i < c->n; i++)
			if (strcmp(c->e[i].key, key) == 0) {
				rl_error("'%s': line %d: key '%s' given twice (first on line %d)", path, line, key,
				    c->e[i].line);
				return RL_EFORMAT;
			}
		if ((rv = add_value(c, key, doc, v, 0)) != 0)
			return rv;
	}
	return RL_OK;
}

int
rl_conf_read(rl_conf *c, const char *path)
{
	yaml_parser_t parser;
	yaml_document_t doc;
	FILE *f;
	int rv;

	if ((f = fopen(path, "rb")) == NULL) {
		rv = errno == ENOENT ? RL_ENOENT : RL_EIO;
		rl_error("cannot open '%s': %s", path, strerror(errno));
		return rv;
	}
	if (!yaml_parser_initialize(&parser)) {
		fclose(f);
		return RL_ENOMEM;
	}
	yaml_parser_set_input_file(&parser, f);
	if (!yaml_parser_load(&parser, &doc)) {
		if (parser.error == YAML_MEMORY_ERROR) {
			rv = RL_ENOMEM;
		} else if (parser.error == YAML_READER_ERROR) {
			rl_error("'%s': byte %zu: not YAML: %s", path, parser.problem_offset,
			    parser.problem ? parser.problem : "unreadable");
			rv = ferror(f) ? RL_EIO : RL_EFORMAT;
		} else {
			rl_error("'%s': line %d: not YAML: %s%s%s", path, (int)parser.problem_mark.line + 1,
			    parser.problem ? parser.problem : "syntax error", parser.context ? " " : "",
			    parser.context ? parser.context : "");
			rv = RL_EFORMAT;
		}
		yaml_parser_delete(&parser);
		fclose(f);
		return rv;
	}
	rv = load(c, path, &doc);
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	fclose(f);
	if (rv != 0)
		rl_conf_fini(c);
	return rv;
}

/*
 * wdir.c — the file transport (see wdir.h) and reading/writing one version
 * as a checkpoint directory with its rlsync.json manifest.
 *
 * Leaves out: subdirectories inside a checkpoint (HF checkpoints are flat),
 * inotify (readers poll, which also works on network filesystems).
 */
#include "sync/wdir.h"
#include "base/core.h"
#include "base/io.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int
sys_err(const char *what, const char *path)
{
	int e = errno;

	rl_error("cannot %s '%s': %s", what, path, strerror(e));
	return e == ENOENT || e == ENOTDIR ? RL_ENOENT : e == EEXIST || e == ENOTEMPTY ? RL_EEXIST
	       : e == ENOMEM ? RL_ENOMEM : RL_EIO;
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* a whole file (any size): rl_io_read_file, which logs "cannot open '...'"
 * and returns RL_ENOENT for a missing one */
static int
read_file(uint8_t **out, uint64_t *n, const char *path)
{
	char *p;
	size_t len;
	int rv = rl_io_read_file(path, 0, &p, &len);

	*out = (uint8_t *)p;
	*n = rv == RL_OK ? (uint64_t)len : 0;
	return rv;
}

static int
write_file(const char *path, const void *data, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), rv = RL_OK;
	const uint8_t *p = data;

	if (fd < 0)
		return sys_err("create", path);
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			rv = sys_err("write", path);
			goto out;
		}
		p += w;
		n -= (size_t)w;
	}
	if (fsync(fd) != 0)
		rv = sys_err("fsync", path);
out:
	if (close(fd) != 0 && rv == RL_OK)
		rv = sys_err("close", path);
	return rv;
}

static void
fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* rm -r (rl_io_remove_tree), logging what could not be removed */
static int
remove_tree(const char *path)
{
	int rv = rl_io_remove_tree(path);

	if (rv == RL_EIO)
		rl_error("cannot remove '%s': %s", path, strerror(errno));
	return rv;
}

/* rlsync.json: {"format":"rlsync","format_version":1,"version":N,"hash":"16 hex",
 *  ["chunk":N,] ["lineage":N,] "blobs":[{"name":..,"size":..,"hash":"16 hex","elem":k}]} */
static char *
manifest_json(const rl_wver *v, uint64_t lineage)
{
	cJSON *j = cJSON_CreateObject(), *arr;
	char hx[20], *txt;

	cJSON_AddStringToObject(j, "format", "rlsync");
	cJSON_AddNumberToObject(j, "format_version", 1);
	cJSON_AddNumberToObject(j, "version", (double)v->version);
	snprintf(hx, sizeof hx, "%016llx", (unsigned long long)v->hash);
	cJSON_AddStringToObject(j, "hash", hx);
	if (v->chunk)
		cJSON_AddNumberToObject(j, "chunk", v->chunk);
	if (lineage) /* absent: 0, as rl-sync before rewinds wrote it */
		cJSON_AddNumberToObject(j, "lineage", (double)lineage);
	arr = cJSON_AddArrayToObject(j, "blobs");
	for (int i = 0; i < v->nblobs; i++) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", v->blobs[i].name);
		cJSON_AddNumberToObject(o, "size", (double)v->blobs[i].size);
		snprintf(hx, sizeof hx, "%016llx", (unsigned long long)v->blobs[i].hash);
		cJSON_AddStringToObject(o, "hash", hx);
		cJSON_AddNumberToObject(o, "elem", v->blobs[i].elem);
		cJSON_AddItemToArray(arr, o);
	}
	txt = cJSON_Print(j);
	cJSON_Delete(j);
	return txt;
}

static int
parse_hex(uint64_t *out, const cJSON *s)
{
	char *end;

	if (!cJSON_IsString(s) || strlen(s->valuestring) != 16)
		return RL_EFORMAT;
	errno = 0;
	*out = strtoull(s->valuestring, &end, 16);
	return *end || errno ? RL_EFORMAT : RL_OK;
}

/* check a read directory against its manifest text */
static int
check_manifest(rl_wver *v, const char *dir, const char *txt, size_t n, uint64_t want_version)
{
	cJSON *j = rl_json_parse_all(txt, n), *arr, *it;
	uint64_t h;
	int rv = RL_EFORMAT, k = 0;
	const cJSON *fv;

	if (j == NULL || !cJSON_IsObject(j)) {
		rl_error("'%s/%s': not JSON", dir, RL_WSYNC_MANIFEST);
		goto out;
	}
	fv = cJSON_GetObjectItemCaseSensitive(j, "format_version");
	if (!cJSON_IsNumber(fv) || fv->valuedouble != 1) {
		rl_error("'%s/%s': unsupported format_version", dir, RL_WSYNC_MANIFEST);
		rl_hint("written by a newer rl-sync; upgrade rlpipe");
		rv = RL_EVERSION;
		goto out;
	}
	it = cJSON_GetObjectItemCaseSensitive(j, "version");
	arr = cJSON_GetObjectItemCaseSensitive(j, "blobs");
	if (!cJSON_IsNumber(it) || it->valuedouble < 1 || !cJSON_IsArray(arr) ||
	    parse_hex(&h, cJSON_GetObjectItemCaseSensitive(j, "hash")) != 0) {
		rl_error("'%s/%s': missing version, hash or blobs", dir, RL_WSYNC_MANIFEST);
		goto out;
	}
	if (want_version && (uint64_t)it->valuedouble != want_version) {
		rl_error("'%s': holds version %llu, not %llu", dir, (unsigned long long)it->valuedouble,
			 (unsigned long long)want_version);
		rv = RL_EINVAL;
		goto out;
	}
	v->version = (uint64_t)it->valuedouble;
	{
		const cJSON *ck = cJSON_GetObjectItemCaseSensitive(j, "chunk");
		if (cJSON_IsNumber(ck) && ck->valuedouble >= 0 && ck->valuedouble <= RL_WSYNC_CHUNK_MAX)
			v->chunk = (uint32_t)ck->valuedouble;
		ck = cJSON_GetObjectItemCaseSensitive(j, "lineage");
		if (cJSON_IsNumber(ck) && ck->valuedouble >= 0 && ck->valuedouble < 9007199254740992.0)
			v->lineage = (uint64_t)ck->valuedouble;
	}
	cJSON_ArrayForEach(it, arr) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
		const cJSON *sz = cJSON_GetObjectItemCaseSensitive(it, "size");
		const cJSON *el = cJSON_GetObjectItemCaseSensitive(it, "elem");
		const rl_wblob *b;
		uint64_t bh;
		k++;
		if (!cJSON_IsString(nm) || !cJSON_IsNumber(sz) || parse_hex(&bh, cJSON_GetObjectItemCaseSensitive(it, "hash"))) {
			rl_error("'%s/%s': bad blob entry %d", dir, RL_WSYNC_MANIFEST, k);
			goto out;
		}
		if ((b = rl_wver_find(v, nm->valuestring)) == NULL) {
			rl_error("'%s': file '%s' listed in %s is missing", dir, nm->valuestring, RL_WSYNC_MANIFEST);
			rv = RL_ENOENT;
			goto out;
		}
		if (cJSON_IsNumber(el))
			((rl_wblob *)b)->elem = el->valueint == 2 || el->valueint == 4 ? el->valueint : 1;
		if ((double)b->size != sz->valuedouble || b->hash != bh) {
			rl_error("'%s/%s': size or checksum differs from %s", dir, b->name, RL_WSYNC_MANIFEST);
			rv = RL_ECHECKSUM;
			goto out;
		}
	}
	if (k != v->nblobs) {
		rl_error("'%s': %d files, but %s lists %d", dir, v->nblobs, RL_WSYNC_MANIFEST, k);
		goto out;
	}
	rl_wver_hash(v); /* version hash with the recorded number */
	if (v->hash != h) {
		rl_error("'%s': version checksum differs from %s", dir, RL_WSYNC_MANIFEST);
		rv = RL_ECHECKSUM;
		goto out;
	}
	rv = RL_OK;
out:
	cJSON_Delete(j);
	return rv;
}

/* trainer state beside the weights in an rl-train checkpoint: not weights */
static int
is_trainer_state(const char *name)
{
	return strncmp(name, "optimizer", 9) == 0 || strcmp(name, "trainer_state.json") == 0;
}

int
rl_wver_read_dir(rl_wver **out, const char *dir, uint64_t version)
{
	DIR *d;
	struct dirent *e;
	char **names = NULL, path[4096];
	int nn = 0, cap = 0, rv = RL_OK;
	uint8_t *man = NULL;
	uint64_t mann = 0;
	rl_wver *v = NULL;

	*out = NULL;
	if ((d = opendir(dir)) == NULL) {
		rv = sys_err("open", dir);
		if (rv == RL_ENOENT)
			rl_hint("give a checkpoint directory (config.json, model.safetensors, ...)");
		return rv;
	}
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		if (e->d_name[0] == '.' || is_trainer_state(e->d_name))
			continue;
		if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
			continue;
		if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (strcmp(e->d_name, RL_WSYNC_MANIFEST) == 0) {
			if ((rv = read_file(&man, &mann, path)) != 0)
				goto out;
			continue;
		}
		if (nn == cap) {
			char **nw = realloc(names, (size_t)(cap = cap ? cap * 2 : 16) * sizeof *nw);
			if (nw == NULL) {
				rv = RL_ENOMEM;
				goto out;
			}
			names = nw;
		}
		names[nn++] = rl_xstrdup(e->d_name);
	}
	qsort(names, (size_t)nn, sizeof *names, cmp_str);
	if ((rv = rl_wver_create(&v, version)) != 0)
		goto out;
	for (int i = 0; i < nn; i++) {
		uint8_t *p;
		uint64_t n;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if ((rv = read_file(&p, &n, path)) != 0)
			goto out;
		v->borrowed = -1;
		rv = rl_wver_add_blob(v, names[i], p, n, 0, 0);
		v->borrowed = 0;
		if (rv != 0) {
			free(p);
			goto out;
		}
	}
	if ((rv = rl_wver_hash(v)) != 0)
		goto out;
	if (man && (rv = check_manifest(v, dir, (const char *)man, (size_t)mann, version)) != 0)
		goto out;
	*out = v;
	v = NULL;
out:
	closedir(d);
	for (int i = 0; i < nn; i++)
		free(names[i]);
	free(names);
	free(man);
	rl_wver_destroy(v);
	return rv;
}

static int
tmp_sibling(char *buf, size_t n, const char *target)
{
	static int counter;
	const char *slash = strrchr(target, '/');
	int k;

	if (slash)
		k = snprintf(buf, n, "%.*s/.tmp-%s-%d-%d", (int)(slash - target), target, slash + 1, (int)getpid(),
			     __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	else
		k = snprintf(buf, n, ".tmp-%s-%d-%d", target, (int)getpid(),
			     __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	return k < 0 || (size_t)k >= n ? RL_ETOOBIG : RL_OK;
}

static void
parent_of(char *buf, size_t n, const char *path)
{
	const char *slash = strrchr(path, '/');

	if (slash == NULL)
		snprintf(buf, n, ".");
	else if (slash == path)
		snprintf(buf, n, "/");
	else
		snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

static int write_dir(const rl_wver *v, const char *dir, uint64_t lineage);

int
rl_wver_write_dir(const rl_wver *v, const char *dir)
{
	return write_dir(v, dir, v->lineage);
}

/* rl_wver_write_dir with the lineage recorded in rlsync.json */
static int
write_dir(const rl_wver *v, const char *dir, uint64_t lineage)
{
	char tmp[4096], path[4200], parent[4096];
	char *txt = NULL;
	struct stat st;
	int rv;

	for (int i = 0; i < v->nblobs; i++) {
		const char *nm = v->blobs[i].name;
		if (strchr(nm, '/') || nm[0] == '.' || strcmp(nm, RL_WSYNC_MANIFEST) == 0) {
			rl_error("blob '%s' cannot be a file name in a checkpoint directory", nm);
			return RL_EINVAL;
		}
		if (v->blobs[i].pieces == NULL) {
			rl_error("version %llu is not hashed", (unsigned long long)v->version);
			return RL_EINVAL;
		}
	}
	if (stat(dir, &st) == 0) {
		rl_error("cannot create '%s': File exists", dir);
		return RL_EEXIST;
	}
	if ((rv = tmp_sibling(tmp, sizeof tmp, dir)) != 0)
		return rv;
	if (mkdir(tmp, 0755) != 0)
		return sys_err("create", tmp);
	for (int i = 0; i < v->nblobs; i++) {
		snprintf(path, sizeof path, "%s/%s", tmp, v->blobs[i].name);
		if ((rv = write_file(path, v->blobs[i].data, (size_t)v->blobs[i].size)) != 0)
			goto fail;
	}
	if ((txt = manifest_json(v, lineage)) == NULL) {
		rv = RL_ENOMEM;
		goto fail;
	}
	snprintf(path, sizeof path, "%s/%s", tmp, RL_WSYNC_MANIFEST);
	if ((rv = write_file(path, txt, strlen(txt))) != 0)
		goto fail;
	fsync_dir(tmp);
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE) != 0 &&
	    ((errno != EINVAL && errno != ENOSYS) || rename(tmp, dir) != 0)) {
		rv = sys_err("create", dir);
		goto fail;
	}
	parent_of(parent, sizeof parent, dir);
	fsync_dir(parent);
	free(txt);
	return RL_OK;
fail:
	free(txt);
	remove_tree(tmp);
	return rv;
}

/* ---- the versioned directory ------------------------------------------------------ */
int
rl_wdir_path(char *buf, size_t bufsz, const char *dir, uint64_t version)
{
	int k = snprintf(buf, bufsz, "%s/v%06llu", dir, (unsigned long long)version);

	return k < 0 || (size_t)k >= bufsz ? RL_ETOOBIG : RL_OK;
}

/* "v" + digits -> number, else 0 */
static uint64_t
vname(const char *s)
{
	uint64_t v = 0;

	if (s[0] != 'v' || s[1] == 0)
		return 0;
	for (s++; *s; s++) {
		if (*s < '0' || *s > '9' || v > UINT64_MAX / 10 - 1)
			return 0;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	return v;
}

/* complete version directories in dir, newest first */
static int
list_versions(const char *dir, uint64_t **out, int *n)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint64_t *vs = NULL;
	int nv = 0, cap = 0;
	char path[4200];
	struct stat st;

	*out = NULL;
	*n = 0;
	if (d == NULL)
		return errno == ENOENT ? RL_ENOENT : sys_err("open", dir);
	while ((e = readdir(d)) != NULL) {
		uint64_t v = vname(e->d_name);
		if (v == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s/%s", dir, e->d_name, RL_WSYNC_MANIFEST);
		if (stat(path, &st) != 0)
			continue;
		if (nv == cap) {
			uint64_t *nw = realloc(vs, (size_t)(cap = cap ? cap * 2 : 16) * sizeof *nw);
			if (nw == NULL) {
				free(vs);
				closedir(d);
				return RL_ENOMEM;
			}
			vs = nw;
		}
		vs[nv++] = v;
	}
	closedir(d);
	for (int i = 1; i < nv; i++) /* insertion sort, descending */
		for (int j = i; j > 0 && vs[j] > vs[j - 1]; j--) {
			uint64_t t = vs[j];
			vs[j] = vs[j - 1];
			vs[j - 1] = t;
		}
	*out = vs;
	*n = nv;
	return RL_OK;
}

/* a directory without rl-sync versions: follow `latest` to any directory
 * whose name ends in its number (rl-train's ROOT/latest -> step-00000100) */
static int
latest_link(const char *dir, uint64_t *version, char *path, size_t pathsz)
{
	char link[4200], tgt[256], full[4500];
	const char *base, *d;
	struct stat st;
	ssize_t k;
	uint64_t v = 0;

	snprintf(link, sizeof link, "%s/latest", dir);
	if ((k = readlink(link, tgt, sizeof tgt - 1)) <= 0)
		return RL_ENOENT;
	tgt[k] = 0;
	base = strrchr(tgt, '/') ? strrchr(tgt, '/') + 1 : tgt;
	for (d = base + strlen(base); d > base && d[-1] >= '0' && d[-1] <= '9'; d--)
		;
	if (*d == 0 || strlen(d) > 18)
		return RL_ENOENT;
	v = strtoull(d, NULL, 10);
	if (tgt[0] == '/')
		snprintf(full, sizeof full, "%s", tgt);
	else
		snprintf(full, sizeof full, "%s/%s", dir, tgt);
	if (v == 0 || stat(full, &st) != 0 || !S_ISDIR(st.st_mode))
		return RL_ENOENT;
	*version = v;
	if (path && (size_t)snprintf(path, pathsz, "%s", full) >= pathsz)
		return RL_ETOOBIG;
	return RL_OK;
}

int
rl_wdir_latest(const char *dir, uint64_t *version, char *path, size_t pathsz)
{
	uint64_t *vs;
	int n, rv;

	*version = 0;
	/* version directories appear only complete (rename), so the highest one
	 * is the newest complete version even if `latest` was not switched yet */
	if ((rv = list_versions(dir, &vs, &n)) != 0)
		return rv;
	if (n == 0) {
		free(vs);
		return latest_link(dir, version, path, pathsz);
	}
	*version = vs[0];
	free(vs);
	return path ? rl_wdir_path(path, pathsz, dir, *version) : RL_OK;
}

int
rl_wdir_before(const char *dir, uint64_t below, uint64_t *version, char *path, size_t pathsz)
{
	uint64_t *vs;
	int n, rv, i;

	*version = 0;
	if ((rv = list_versions(dir, &vs, &n)) != 0)
		return rv;
	for (i = 0; i < n && vs[i] >= below; i++)   /* newest first */
		;
	if (i < n)
		*version = vs[i];
	free(vs);
	if (*version == 0)
		return RL_ENOENT;
	return path ? rl_wdir_path(path, pathsz, dir, *version) : RL_OK;
}

static int
switch_latest(const char *dir, uint64_t version)
{
	char tmp[4200], link[4200], target[64];

	snprintf(target, sizeof target, "v%06llu", (unsigned long long)version);
	snprintf(tmp, sizeof tmp, "%s/.latest-%d", dir, (int)getpid());
	snprintf(link, sizeof link, "%s/latest", dir);
	unlink(tmp);
	if (symlink(target, tmp) != 0)
		return sys_err("create", tmp);
	if (rename(tmp, link) != 0) {
		int rv = sys_err("replace", link);
		unlink(tmp);
		return rv;
	}
	fsync_dir(dir);
	return RL_OK;
}

/* Removes the temporaries of writers that died (pid in the name): a kill
 * during a write leaves a version's worth of bytes there. */
static void
clean_temps(const char *dir)
{
	char path[4200];
	DIR *d;
	struct dirent *e;

	if ((d = opendir(dir)) == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		const char *dash = NULL;
		long pid;
		/* .tmp-NAME-PID-COUNTER (tmp_sibling), NAME perhaps a temporary
		 * itself (a rewind's staged version): the pid from the end */
		if (strncmp(e->d_name, ".tmp-", 5) != 0)
			continue;
		for (const char *p = e->d_name + strlen(e->d_name), *last = NULL; p > e->d_name + 5; p--)
			if (p[-1] == '-') {
				if (last) {
					dash = p - 1;
					break;
				}
				last = p - 1;
			}
		if (dash == NULL)
			continue;
		pid = strtol(dash + 1, NULL, 10);
		if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			remove_tree(path);
		}
	}
	closedir(d);
}

/* The version hash and lineage that vdir/rlsync.json records (0, 0 if it
 * cannot be read: a version written before lineages, or gone). */
static void
read_stamp(const char *vdir, uint64_t *hash, uint64_t *lineage)
{
	char path[4400];
	uint8_t *txt;
	uint64_t n;
	cJSON *j;
	const cJSON *l;

	*hash = *lineage = 0;
	snprintf(path, sizeof path, "%s/%s", vdir, RL_WSYNC_MANIFEST);
	if (read_file(&txt, &n, path) != RL_OK)
		return;
	if ((j = rl_json_parse_all((const char *)txt, (size_t)n)) != NULL) {
		l = cJSON_GetObjectItemCaseSensitive(j, "lineage");
		if (cJSON_IsNumber(l) && l->valuedouble >= 0 && l->valuedouble < 9007199254740992.0)
			*lineage = (uint64_t)l->valuedouble;
		if (parse_hex(hash, cJSON_GetObjectItemCaseSensitive(j, "hash")) != RL_OK)
			*hash = 0;
		cJSON_Delete(j);
	}
	free(txt);
}

int
rl_wdir_lineage(const char *vdir, uint64_t *lineage)
{
	uint64_t h;

	read_stamp(vdir, &h, lineage);
	return RL_OK;
}

int
rl_wdir_publish_ver(const char *dir, const rl_wver *v, int keep)
{
	char path[4200];
	uint64_t l, h, lin = 0;
	int rv;

	if ((rv = rl_io_mkdir_p(dir, 0755)) != 0)
		return rv;
	rv = rl_wdir_latest(dir, &l, path, sizeof path);
	if (rv != 0 && rv != RL_ENOENT)
		return rv;
	if (rv == 0 && v->version <= l) {
		rl_error("'%s': version %llu is not newer than the latest, %llu", dir, (unsigned long long)v->version,
			 (unsigned long long)l);
		return RL_ESTALE;
	}
	/* a new version continues the line of the one before it */
	if (rv == 0)
		read_stamp(path, &h, &lin);
	/* before writing, not only in the prune after it: on a disk with room
	 * for the versions kept plus one, a dead writer's temporary would make
	 * every later write fail, and the prune that removes it would never run */
	clean_temps(dir);
	if ((rv = rl_wdir_path(path, sizeof path, dir, v->version)) != 0 ||
	    (rv = write_dir(v, path, RL_MAX(lin, v->lineage))) != 0 || (rv = switch_latest(dir, v->version)) != 0)
		return rv;
	return keep > 0 ? rl_wdir_prune(dir, keep) : RL_OK;
}

int
rl_wdir_rewind_ver(const char *dir, const rl_wver *v, int keep, uint64_t *lineage)
{
	char path[4200], tmp[4300], gone[4300];
	uint64_t *vs = NULL, h = 0, lin = 0, nl;
	int n = 0, rv, die = getenv("RL_WDIR_TEST_REWIND_DIE") ? atoi(getenv("RL_WDIR_TEST_REWIND_DIE")) : 0;

	if ((rv = rl_io_mkdir_p(dir, 0755)) != 0)
		return rv;
	if ((rv = list_versions(dir, &vs, &n)) != 0)
		return rv;
	if (n > 0 && (rv = rl_wdir_path(path, sizeof path, dir, vs[0])) == RL_OK)
		read_stamp(path, &h, &lin);
	if (n == 0 || vs[0] < v->version || (vs[0] == v->version && h == v->hash)) {
		/* nothing newer to drop: an ordinary publish (or nothing at all) */
		int same = n > 0 && vs[0] == v->version;
		free(vs);
		*lineage = RL_MAX(lin, v->lineage);
		return same ? RL_OK : rl_wdir_publish_ver(dir, v, keep);
	}
	nl = RL_MAX(lin + 1, v->lineage);
	clean_temps(dir);
	/* the new version first, under a temporary name (the long part); then
	 * the versions it replaces go, newest first, each renamed to a dead
	 * writer's temporary before it is removed: a kill at any point leaves
	 * complete versions of the old line up to some number (or the new one),
	 * never a gap the old line's numbers would not have */
	if ((rv = rl_wdir_path(path, sizeof path, dir, v->version)) != 0 ||
	    (rv = tmp_sibling(tmp, sizeof tmp, path)) != 0 || (rv = write_dir(v, tmp, nl)) != 0)
		goto out;
	for (int i = 0; i < n && vs[i] >= v->version; i++) {
		char vp[4200];
		rl_wdir_path(vp, sizeof vp, dir, vs[i]);
		rl_verbose("rewinding '%s': dropping version %llu", dir, (unsigned long long)vs[i]);
		if ((rv = tmp_sibling(gone, sizeof gone, vp)) != 0)
			goto fail;
		if (rename(vp, gone) != 0) {
			rv = sys_err("remove", vp);
			goto fail;
		}
		if (die > 0 && --die == 0)
			_exit(9); /* test hook: a kill in the middle of a rewind */
		remove_tree(gone);
	}
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0 &&
	    ((errno != EINVAL && errno != ENOSYS) || rename(tmp, path) != 0)) {
		rv = sys_err("create", path);
		goto fail;
	}
	fsync_dir(dir);
	if ((rv = switch_latest(dir, v->version)) != 0)
		goto out;
	*lineage = nl;
	rv = keep > 0 ? rl_wdir_prune(dir, keep) : RL_OK;
	goto out;
fail:
	remove_tree(tmp);
out:
	free(vs);
	return rv;
}

int
rl_wdir_publish(const char *dir, const char *src_dir, uint64_t version, int keep)
{
	rl_wver *v;
	int rv;

	if (version == 0) {
		rl_error("publish: version number must be >= 1");
		return RL_EINVAL;
	}
	if ((rv = rl_wver_read_dir(&v, src_dir, 0)) != 0)
		return rv;
	if (v->nblobs == 0) {
		rl_error("'%s' has no files to publish", src_dir);
		rl_wver_destroy(v);
		return RL_ENOENT;
	}
	if (v->version != version) { /* a source with its own manifest is renumbered */
		v->version = version;
		rl_wver_hash(v);
	}
	rv = rl_wdir_publish_ver(dir, v, keep);
	rl_wver_destroy(v);
	return rv;
}

int
rl_wdir_prune(const char *dir, int keep)
{
	uint64_t *vs, cur = 0;
	int n, rv;
	char path[4200], link[4200], tgt[256], tmpn[4300];
	ssize_t k;

	if (keep < 1)
		keep = 1;
	if ((rv = list_versions(dir, &vs, &n)) != 0)
		return rv;
	snprintf(link, sizeof link, "%s/latest", dir);
	if ((k = readlink(link, tgt, sizeof tgt - 1)) > 0) {
		tgt[k] = 0;
		cur = vname(tgt);
	}
	for (int i = keep; i < n; i++) {
		if (vs[i] == cur)
			continue;
		rl_wdir_path(path, sizeof path, dir, vs[i]);
		rl_verbose("pruning '%s'", path);
		/* renamed to a temporary first: a kill in the middle of the removal
		 * then leaves a dead writer's temporary, which the next publish
		 * removes; removed in place, a directory whose manifest went first
		 * would be no version any more and never pruned (a model's worth of
		 * bytes for good) */
		const char *gone = path;
		if (tmp_sibling(tmpn, sizeof tmpn, path) == RL_OK && rename(path, tmpn) == 0)
			gone = tmpn;
		if (getenv("RL_WDIR_TEST_PRUNE_DIE")) {
			/* test hook: a kill in the middle of the removal, after its manifest */
			char m[4400];
			snprintf(m, sizeof m, "%s/%s", gone, RL_WSYNC_MANIFEST);
			unlink(m);
			_exit(9);
		}
		remove_tree(gone);
	}
	free(vs);
	clean_temps(dir);
	return RL_OK;
}

struct rl_wdir_watch {
	char *dir;
	uint64_t have;
	int interval_ms;
};

int
rl_wdir_watch_open(rl_wdir_watch **out, const char *dir, uint64_t have, int interval_ms)
{
	rl_wdir_watch *w;

	if ((w = rl_try_calloc(1, sizeof *w, "watcher")) == NULL)
		return RL_ENOMEM;
	w->dir = rl_xstrdup(dir);
	w->have = have;
	w->interval_ms = interval_ms > 0 ? interval_ms : 100;
	*out = w;
	return RL_OK;
}

int
rl_wdir_watch_next(rl_wdir_watch *w, uint64_t *version, char *path, size_t pathsz, int timeout_ms)
{
	double end = rl_now() + (timeout_ms < 0 ? 1e300 : timeout_ms / 1e3);

	for (;;) {
		uint64_t l;
		int rv = rl_wdir_latest(w->dir, &l, path, pathsz);
		struct timespec ts;
		if (rv != 0 && rv != RL_ENOENT)
			return rv;
		if (rv == 0 && l > w->have) {
			w->have = l;
			*version = l;
			return RL_OK;
		}
		if (rl_now() >= end)
			return RL_ETIMEDOUT;
		ts.tv_sec = w->interval_ms / 1000;
		ts.tv_nsec = (long)(w->interval_ms % 1000) * 1000000L;
		nanosleep(&ts, NULL);
	}
}

void
rl_wdir_watch_close(rl_wdir_watch *w)
{
	if (w == NULL)
		return;
	free(w->dir);
	free(w);
}

/* pull's output directory, before anything is fetched: a directory this
 * process can write in, or a name that one can be created at. */
int
rl_wdir_check_target(const char *dir)
{
	struct stat st;
	char *d, *parent;
	int ok;

	if (stat(dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode)) {
			rl_error("cannot pull into '%s': not a directory", dir);
			return RL_EIO;
		}
		if (access(dir, W_OK | X_OK) != 0) {
			rl_error("cannot pull into '%s': %s", dir, strerror(errno));
			return RL_EIO;
		}
		return RL_OK;
	}
	if (errno != ENOENT) {
		rl_error("cannot pull into '%s': %s", dir, strerror(errno));
		return RL_EIO;
	}
	d = rl_xstrdup(dir);
	parent = dirname(d);
	ok = access(parent, W_OK | X_OK) == 0;
	if (!ok)
		rl_error("cannot pull into '%s': cannot create it in '%s': %s", dir, parent, strerror(errno));
	free(d);
	return ok ? RL_OK : RL_EIO;
}

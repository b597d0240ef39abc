/* test_wgroup.c — the weights group's versions in element ranges
 * (rl_wgroup_send_begin / _range / _end), a root and a member as two
 * processes on 127.0.0.1 (forked before any nng use, each under an alarm):
 *  - a version sent whole, then versions in ranges: the member takes each
 *    bit for bit as the root had it when the range went (the root spoils
 *    each range right after sending it, as a ZeRO-3 trainer gives a unit
 *    back); the root refuses a range with a gap and an end before the
 *    announced count, sending nothing of them, and the group goes on;
 *  - a root that is not rl_wgroup, writing the wire by hand (its layout as
 *    docs/wgroup.md gives it): a range out of order, a range missing (the
 *    next version comes instead), a range whose bytes do not match its
 *    checksum.  Each time the member refuses the version with an error
 *    naming the range, has no version to take, and its model keeps the
 *    version taken before. */
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/core.h"
#include "base/hash.h"
#include "compute/comm.h"
#include "compute/ops.h"
#include "model/model.h"
#include "sync/wgroup.h"
#include "t.h"
#include "t_port.h"

static char addr[64];

/* the wire's header, written here from its description */
typedef struct {
	uint32_t magic, mode;
	int64_t version;
	uint64_t n, table;
	uint32_t pieces, piece;
	uint64_t lo, hi, sum;
} hdr;
#define MAGIC 0x32574c52u /* "RLW2" */
#define PIECE 0x50574c52u /* "RLWP" */

static int
tiny(rl_model **m, rl_ops **o, uint64_t seed)
{
	rl_config c = { .arch = RL_ARCH_LLAMA, .vocab_size = 50, .hidden_size = 24, .n_layer = 2,
		.n_head = 4, .n_kv_head = 2, .head_dim = 6, .intermediate_size = 40, .max_pos = 32,
		.rope_theta = 10000, .norm_eps = 1e-6f, .qkv_bias = 1, .bos_id = -1, .eos_id = 3,
		.dtype = RL_F32 };
	int rv;

	snprintf(c.model_type, sizeof c.model_type, "qwen2");
	if ((rv = rl_ops_open(o, "cpu")) != 0)
		return rv;
	return rl_model_init_random(m, &c, *o, seed);
}

/* version v's parameters: the seed-1 model's, each plus v/2 (exact in f32) */
static void
fill(float *p, const float *base, size_t n, int v)
{
	for (size_t i = 0; i < n; i++)
		p[i] = base[i] + 0.5f * (float)v;
}

/* the tensor table's hash as the header carries it: FNV-1a 64 over each
 * tensor's name, then its offset and size as two little-endian u64; the
 * total xor'd in */
static uint64_t
table_of(const rl_model *m)
{
	uint64_t h = RL_FNV1A_INIT;

	for (int i = 0; i < m->tt.n; i++) {
		uint64_t v[2] = { (uint64_t)m->tt.t[i].off, (uint64_t)m->tt.t[i].n };
		h = rl_fnv1a(h, m->tt.t[i].name, strlen(m->tt.t[i].name));
		h = rl_fnv1a(h, v, sizeof v);
	}
	return h ^ (uint64_t)m->tt.total;
}

static int
join(rl_wgroup **g, rl_model *m, int rank)
{
	rl_wgroup_opts o = { addr, rank, 2, "cpu", 30 };
	return rl_wgroup_open(g, &o, m);
}

/* ---- rl_wgroup on both sides --------------------------------------------------------- */

static int
root_api(void)
{
	rl_model *m = NULL;
	rl_ops *o = NULL;
	rl_wgroup *g = NULL;
	float *base;
	size_t n, a, b;

	alarm(60);
	if (tiny(&m, &o, 1) != 0 || join(&g, m, 0) != 0)
		return 10;
	n = m->tt.total;
	a = n / 3;
	b = 2 * n / 3;
	if (!(base = malloc(n * sizeof *base)))
		return 11;
	memcpy(base, m->params, n * sizeof *base);
	T_EQ_INT(rl_wgroup_send(g, 0), 0);
	/* version 1 in three ranges, each spoilt once it has gone */
	fill(m->params, base, n, 1);
	T_EQ_INT(rl_wgroup_send_begin(g, 1, 3), 0);
	T_EQ_INT(rl_wgroup_send_range(g, 0, a), 0);
	fill(m->params, base, a, 100);
	T_EQ_INT(rl_wgroup_send_range(g, a, b), 0);
	for (size_t i = a; i < b; i++)
		m->params[i] = NAN;
	T_EQ_INT(rl_wgroup_send_range(g, b, n), 0);
	T_EQ_INT(rl_wgroup_send_end(g), 0);
	/* version 2: a range leaving a gap is refused, nothing of it sent */
	fill(m->params, base, n, 2);
	T_EQ_INT(rl_wgroup_send_begin(g, 2, 2), 0);
	T_EQ_INT(rl_wgroup_send_range(g, 0, a), 0);
	T_EQ_INT(rl_wgroup_send_range(g, b, n), RL_EINVAL);
	T_EQ_INT(rl_wgroup_send_range(g, a, n + 1), RL_EINVAL);
	T_EQ_INT(rl_wgroup_send(g, 2), RL_EINVAL); /* not in the middle of one */
	T_EQ_INT(rl_wgroup_send_range(g, a, n), 0);
	T_EQ_INT(rl_wgroup_send_end(g), 0);
	/* version 3: an end before the announced ranges is refused */
	fill(m->params, base, n, 3);
	T_EQ_INT(rl_wgroup_send_begin(g, 3, 2), 0);
	T_EQ_INT(rl_wgroup_send_range(g, 0, b), 0);
	T_EQ_INT(rl_wgroup_send_end(g), RL_EINVAL);
	T_EQ_INT(rl_wgroup_send_range(g, b, n), 0);
	T_EQ_INT(rl_wgroup_send_end(g), 0);
	T_EQ_INT(rl_wgroup_close(g, 1), 0);
	free(base);
	rl_model_close(m);
	rl_ops_close(o);
	return t_fail ? 12 : 0;
}

/* takes versions until `last`, each checked against the seed-1 model's;
 * 0 when all were right */
static int
member_take(rl_wgroup *g, const rl_model *m, const float *base, int last)
{
	int v = -1, got = -1;
	float *want = malloc(m->tt.total * sizeof *want);

	if (!want)
		return 1;
	while (got < last) {
		if (rl_wgroup_wait(g, 30, &v) != 0 || v < 0 || rl_wgroup_take(g, &got) != 0) {
			free(want);
			return 2;
		}
		fill(want, base, m->tt.total, got);
		if (memcmp(want, m->params, m->tt.total * sizeof *want) != 0) {
			fprintf(stderr, "version %d: not the root's parameters\n", got);
			free(want);
			return 3;
		}
	}
	free(want);
	return 0;
}

static int
member(int scenario)
{
	rl_model *m = NULL, *ref = NULL;
	rl_ops *o = NULL, *o2 = NULL;
	rl_wgroup *g = NULL;
	int rv, v = 0;

	alarm(60);
	if (tiny(&m, &o, 2) != 0 || tiny(&ref, &o2, 1) != 0 || join(&g, m, 1) != 0)
		return 20;
	if (scenario == 0) {
		/* versions 0..3, all as sent */
		if ((rv = member_take(g, m, ref->params, 3)) != 0)
			return 20 + rv;
		return rl_wgroup_close(g, 1) == 0 ? 0 : 24;
	}
	/* version 1 whole, then a broken one: refused, version 1 kept */
	if ((rv = member_take(g, m, ref->params, 1)) != 0)
		return 30 + rv;
	if ((rv = rl_wgroup_wait(g, 30, &v)) != RL_EFORMAT || v != -1)
		return 35;
	if (rl_wgroup_take(g, &v) != RL_ENOENT || rl_wgroup_poll(g, &v) != RL_EFORMAT)
		return 36;
	float *want = malloc(m->tt.total * sizeof *want);
	if (!want)
		return 37;
	fill(want, ref->params, m->tt.total, 1);
	rv = memcmp(want, m->params, m->tt.total * sizeof *want) != 0;
	free(want);
	rl_wgroup_close(g, 0);
	return rv ? 38 : 0;
}

/* ---- a root writing the wire by hand --------------------------------------------------- */

static int
root_raw(int scenario)
{
	rl_model *m = NULL;
	rl_ops *o = NULL;
	rl_comm *c = NULL;
	rl_comm_opts co;
	size_t n, a;

	alarm(60);
	if (tiny(&m, &o, 1) != 0)
		return 40;
	rl_comm_opts_default(&co);
	co.rank = 0;
	co.world = 2;
	co.master = addr;
	co.backend = "cpu";
	co.timeout = 30;
	if (rl_comm_open(&c, &co, NULL) != 0)
		return 41;
	n = m->tt.total;
	a = n / 2;
	fill(m->params, m->params, n, 1);
	hdr h = { MAGIC, 0, 1, n, table_of(m), 0, 0, 0, 0, 0 };
	if (rl_comm_host_broadcast(c, &h, sizeof h, 0) != 0 || rl_comm_broadcast(c, m->params, n * sizeof(float), 0) != 0)
		return 42;
	/* version 2 in two ranges, broken as the scenario says */
	hdr v2 = { MAGIC, 0, 2, n, h.table, 2, 0, 0, 0, 0 };
	hdr p0 = { PIECE, 0, 2, n, h.table, 2, 0, 0, a, rl_hash64(m->params, a * sizeof(float), 0) };
	hdr p1 = { PIECE, 0, 2, n, h.table, 2, 1, a, n, rl_hash64(m->params + a, (n - a) * sizeof(float), 0) };
	hdr v3 = { MAGIC, 0, 3, n, h.table, 0, 0, 0, 0, 0 };
	if (rl_comm_host_broadcast(c, &v2, sizeof v2, 0) != 0)
		return 43;
	if (scenario == 1) {
		/* the second range first */
		(void)rl_comm_host_broadcast(c, &p1, sizeof p1, 0);
	} else if (scenario == 2) {
		/* the first range, then the next version: the second missing */
		if (rl_comm_host_broadcast(c, &p0, sizeof p0, 0) != 0 ||
		    rl_comm_broadcast(c, m->params, a * sizeof(float), 0) != 0)
			return 44;
		(void)rl_comm_host_broadcast(c, &v3, sizeof v3, 0);
	} else {
		/* the first range's bytes other than its checksum says */
		p0.sum ^= 1;
		if (rl_comm_host_broadcast(c, &p0, sizeof p0, 0) != 0 ||
		    rl_comm_broadcast(c, m->params, a * sizeof(float), 0) != 0)
			return 45;
	}
	/* the member leaves, refusing: this waits until it has */
	int rv = rl_comm_barrier(c);
	rl_comm_close(c);
	rl_model_close(m);
	rl_ops_close(o);
	return rv != 0 ? 0 : 46;
}

/* ---- the runs -------------------------------------------------------------------------- */

/* root and member as two processes; the member's stderr in errbuf */
static void
run(int scenario, char *errbuf, size_t cap, int *rc_root, int *rc_member)
{
	char path[] = "/tmp/test_wgroup_XXXXXX";
	int fd = mkstemp(path);
	pid_t pr, pm;
	int st;

	snprintf(addr, sizeof addr, "127.0.0.1:%d", t_free_port());
	if ((pr = fork()) == 0)
		_exit(scenario == 0 ? root_api() : root_raw(scenario));
	if ((pm = fork()) == 0) {
		dup2(fd, 2);
		_exit(member(scenario));
	}
	waitpid(pr, &st, 0);
	*rc_root = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	waitpid(pm, &st, 0);
	*rc_member = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	ssize_t k = pread(fd, errbuf, cap - 1, 0);
	errbuf[k > 0 ? k : 0] = 0;
	close(fd);
	unlink(path);
}

int
main(void)
{
	static const char *want[] = {
		NULL,
		"weights group: version 2 refused: range 2 of 2 has elements [",
		"weights group: version 2 refused: range 2 of 2 missing (the next version came instead)",
		"weights group: version 2 refused: range 1 of 2 (elements [0, ",
	};
	char err[8192];
	int rr, rm;

	T_BEGIN("test_wgroup");
	rl_log_init("test_wgroup", 1);
	for (int s = 0; s < 4; s++) {
		run(s, err, sizeof err, &rr, &rm);
		T_OK(rr == 0 && rm == 0, "scenario %d: root exit %d, member exit %d; member said: %s", s, rr, rm, err);
		if (want[s])
			T_OK(strstr(err, want[s]) != NULL, "scenario %d: member said: %s", s, err);
	}
	T_OK(strstr(err, "does not match its checksum") != NULL, "%s", err);
	T_END();
}

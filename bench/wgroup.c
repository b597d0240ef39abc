/*
 * bench/wgroup — the weights broadcast group (lib/sync/wgroup.c) on this machine:
 * a trainer process sends V versions of a randomly initialised model to W-1
 * member processes over the CPU ring (127.0.0.1), each member taking every
 * version into its model (rl_wgroup_take: copy + compute copy refresh).
 * One JSON line per (model, world):
 *   {"bench":"wgroup","model":M,"device":D,"backend":K,"world":W,"bytes":B,
 *    "versions":V,"send_s":trainer's seconds per version (median),
 *    "GBps":B/send_s,"take_s":a member's seconds to take one (median)}
 *
 * usage: wgroup [--model gpt2|qwen|small|all] [--worlds 2,3] [--versions 5]
 *               [--device cpu|cuda] [--backend cpu|nccl|ipc]
 * On one GPU: --device cuda --backend ipc (every rank on the same device;
 * NCCL needs a GPU per rank).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/config.h"
#include "base/core.h"
#include "model/model.h"
#include "compute/ops.h"
#include "sync/wgroup.h"

#include "shapes.h"

static const char *small_json =
    "{\"model_type\":\"qwen2\",\"vocab_size\":1024,\"hidden_size\":256,\"num_hidden_layers\":4,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":512,"
    "\"max_position_embeddings\":256}";

static int
free_port(void)
{
	for (int i = 0;; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0), port = 20000 + (int)((getpid() * 7919u + i * 104729u) % 30000), ok;
		a.sin_port = htons((uint16_t)port);
		ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok)
			return port;
	}
}

static int
cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* rank's part; rank 0 prints the line.  Returns 0 on success. */
static const char *device = "cpu", *backend = "cpu";

static int
run(const char *name, const char *cfgtxt, int rank, int world, const char *addr, int versions, int fd)
{
	rl_config cfg;
	rl_ops *o = NULL;
	rl_model *m = NULL;
	rl_wgroup *g = NULL;
	rl_wgroup_opts wo = { addr, rank, world, backend, 120 };
	double t[64];
	int rv, v;

	if ((rv = rl_config_parse(&cfg, cfgtxt, strlen(cfgtxt), name)) != 0 || (rv = rl_ops_open(&o, device)) != 0 ||
	    (rv = rl_model_init_random(&m, &cfg, o, 1)) != 0 || (rv = rl_wgroup_open(&g, &wo, m)) != 0)
		goto out;
	for (int k = 0; k < versions; k++) {
		double t0 = rl_now();
		if (rank == 0) {
			rv = rl_wgroup_send(g, k);
		} else {
			if ((rv = rl_wgroup_wait(g, 120, &v)) == 0) {
				t0 = rl_now();
				rv = rl_wgroup_take(g, &v);
			}
		}
		t[k] = rl_now() - t0;
		if (rv != 0)
			goto out;
	}
	qsort(t, (size_t)versions, sizeof t[0], cmpd);
	if (rank == 1 && write(fd, &t[versions / 2], sizeof t[0]) != sizeof t[0])
		rv = RL_EIO;
	if (rank == 0) {
		double take = 0;
		if (read(fd, &take, sizeof take) != sizeof take)
			take = -1;
		printf("{\"bench\":\"wgroup\",\"model\":\"%s\",\"device\":\"%s\",\"backend\":\"%s\",\"world\":%d,"
		    "\"bytes\":%zu,\"versions\":%d,\"send_s\":%.4f,\"GBps\":%.3f,\"take_s\":%.4f}\n", name, device, backend, world,
		    rl_wgroup_bytes(g), versions, t[versions / 2], rl_wgroup_bytes(g) / t[versions / 2] / 1e9, take);
		fflush(stdout);
	}
out:
	if (rl_wgroup_close(g, rv == 0) != 0 && rv == 0)
		rv = RL_EIO;
	rl_model_close(m);
	rl_ops_close(o);
	return rv;
}

int
main(int argc, char **argv)
{
	const char *model = "gpt2", *worlds = "2,3";
	int versions = 5;

	rl_log_init("wgroup", RL_LOG_NORMAL);
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--model") == 0)
			model = argv[i + 1];
		else if (strcmp(argv[i], "--worlds") == 0)
			worlds = argv[i + 1];
		else if (strcmp(argv[i], "--device") == 0)
			device = argv[i + 1];
		else if (strcmp(argv[i], "--backend") == 0)
			backend = argv[i + 1];
		else if (strcmp(argv[i], "--versions") == 0)
			versions = RL_MAX(1, RL_MIN(64, atoi(argv[i + 1])));
	}
	const char *configs[][2] = { { "gpt2", gpt2_json }, { "qwen", qwen_json }, { "small", small_json } };

	for (size_t c = 0; c < RL_ARRAY_LEN(configs); c++) {
		if (strcmp(model, "all") != 0 && strcmp(model, configs[c][0]) != 0)
			continue;
		for (const char *w = worlds; *w;) {
			int world = atoi(w), fds[2], bad = 0;
			char addr[64];
			snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
			if (world < 2 || pipe(fds) != 0)
				return 2;
			/* every rank a child: nng must not be started before a fork */
			for (int r = 0; r < world; r++)
				if (fork() == 0)
					_exit(run(configs[c][0], configs[c][1], r, world, addr, versions,
					    fds[r == 0 ? 0 : 1]) ? 1 : 0);
			for (int r = 0; r < world; r++) {
				int st;
				wait(&st);
				bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
			}
			close(fds[0]);
			close(fds[1]);
			if (bad)
				return 1;
			w = strchr(w, ',') ? strchr(w, ',') + 1 : w + strlen(w);
		}
	}
	return 0;
}

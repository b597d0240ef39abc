/*
 * wgroup_opts.c — the broadcast weights group's options (--weights-group and
 * its rank, size and backend), parsed and checked alike by generation and
 * by serve (cmd.h).
 */
#include <string.h>

#include "base/cli.h"
#include "cmd.h"

int
rl_cmd_wgroup_opt(rl_rollout_opts *o, int c, const char *a)
{
	switch (c) {
	case RLO_WGROUP: o->wgo.addr = a; return 0;
	case RLO_WGRANK: return rl_cli_int32(c, a, 1, 65535, &o->wgo.rank);
	case RLO_WGSIZE: return rl_cli_int32(c, a, 2, 65536, &o->wgo.world);
	case RLO_WGBACK:
		if (strcmp(a, "auto") && strcmp(a, "cpu") && strcmp(a, "nccl") && strcmp(a, "ipc"))
			return rl_cli_usage("--weights-group-backend takes auto, cpu, nccl or ipc, not '%s'", a);
		o->wgo.backend = a;
		return 0;
	default:
		return -1;
	}
}

int
rl_cmd_wgroup_check(const rl_rollout_opts *o)
{
	if (o->wgo.addr && (!o->wgo.rank || !o->wgo.world || o->wgo.rank >= o->wgo.world))
		return rl_cli_usage("--weights-group needs --weights-group-rank R and --weights-group-size N, "
		    "1 <= R < N");
	if (!o->wgo.addr && (o->wgo.rank || o->wgo.world || o->wgo.backend))
		return rl_cli_usage("--weights-group-rank/-size/-backend need --weights-group HOST:PORT");
	if (o->wgo.addr && (o->weights_from || o->sync_url))
		return rl_cli_usage("--weights-group is a third way to get weights: choose one of it, "
		    "--weights-from and --sync");
	if (o->weights_from && o->sync_url)
		return rl_cli_usage("--weights-from and --sync are two ways to get weights: choose one");
	if (o->max_staleness >= 0 && !o->weights_from && !o->sync_url && !o->wgo.addr)
		return rl_cli_usage("--max-staleness needs --weights-from DIR, --sync URL or --weights-group");
	return 0;
}

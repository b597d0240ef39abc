#!/bin/sh
# bench/run.sh [-r ROUNDS] [TREE...] — the CPU benchmark of each stage, short
# runs, JSON lines on stdout, each prefixed with "tree" (the checkout it ran)
# and "round":
#   stream   bench/stream 1              trajectory codec, MB/s
#   reward   bench/reward --seconds 1    verifiers and scorer, records/s
#   rollout  bench/rollout 1             engine tokens/s, 1/8/64 slots
#   train    bench/train.sh 2            rl-train tokens/s per step
#   queue    bench/queue 2               broker records/s
#   sync     bench/sync --mb 32 --reps 3 --subs 1   weight delivery seconds
# Each TREE (default: this checkout) must hold a build ($RL_BUILD, default
# build) with its benchmarks (make tests-build).  With several trees the
# stages run alternately, tree after tree, ROUNDS times (default 1), so that
# a before/after comparison sees the same load on a shared machine:
#   sh bench/run.sh -r 3 /path/to/old /path/to/new
set -eu
rounds=1
if [ "${1:-}" = -r ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || set -- "$(cd "$(dirname "$0")/.." && pwd)"
B=${RL_BUILD:-build}
for t in "$@"; do
	[ -x "$t/$B/bench/stream" ] || { echo "bench/run.sh: no benchmarks in '$t/$B/bench' (make tests-build)" >&2; exit 1; }
done
tag() { sed "s|^{|{\"tree\":\"$1\",\"round\":$2,|"; }
r=1
while [ $r -le "$rounds" ]; do
	for stage in stream reward rollout train queue sync; do
		for t in "$@"; do
			case $stage in
			stream) (cd "$t" && "$B/bench/stream" 1) ;;
			reward) (cd "$t" && "$B/bench/reward" --seconds 1) ;;
			rollout) (cd "$t" && "$B/bench/rollout" 1) ;;
			train) (cd "$t" && RL_BUILD=$B sh bench/train.sh 2) ;;
			queue) (cd "$t" && "$B/bench/queue" 2 "$B/bin/rl-queue") ;;
			sync) (cd "$t" && "$B/bench/sync" --mb 32 --reps 3 --subs 1) ;;
			esac 2>/dev/null | grep '^{' | tag "$t" $r
		done
	done
	r=$((r + 1))
done

#!/bin/sh
# pipelines/multi-gpu/train-rank.sh SCORED.jsonl RL-TRAIN-ARGS... — one
# data-parallel rl-train rank that follows a growing file of scored records
# (every rank reads all of it: docs/parallel.md).  The rank's place comes from
# the environment (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, or
# SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID with MASTER_ADDR/MASTER_PORT).
# `tail -F` feeds it through a FIFO and stops when rl-train exits (--pid), so
# the rank ends when rl-train does (give rl-train --max-steps).  Exit status:
# rl-train's.  For records from a broker, rl-train --queue with several ranks
# needs no file (run.sh); this is for a file that some other program writes.
set -eu
scored=$1
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/rl-rank.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/in"
rl-train "$@" "$dir/in" &
trainer=$!
# poll every second: works on NFS and other shared file systems too
tail -n +1 -F -s 1 --pid="$trainer" "$scored" > "$dir/in" 2>/dev/null &
feeder=$!
rc=0
wait "$trainer" || rc=$?
kill "$feeder" 2>/dev/null || true
wait "$feeder" 2>/dev/null || true
exit $rc

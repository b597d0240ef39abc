#!/bin/sh
# pipelines/slurm/local-test.sh — run grpo.sbatch on a throw-away SLURM
# cluster on this machine: munged, slurmctld and NODES slurmd (one host
# playing NODES nodes n1..nN, each with its own port), all as root, all
# configured in a temporary directory (SLURM_CONF, a munge key and socket of
# their own; nothing under /etc is read or changed).  Then a tiny model and a
# few arithmetic prompts, `sbatch --wait` with DEVICE=cpu, and checks of the
# result: the job's exit status, STEPS metric lines, the checkpoints.
#
#   sudo sh pipelines/slurm/local-test.sh              (from the rlpipe checkout, after make)
#   NODES=2 GPUS_PER_NODE=2 sh pipelines/slurm/local-test.sh
#
# Settings (environment): NODES (nodes of the cluster and of the job, 3),
# GPUS_PER_NODE (processes per node, 1), GEN_NODES (1), STEPS (3), BATCH
# (prompts per step, 4), SAMPLES (4), RESUME_TOO (1: then submit again with
# RESUME=1 and 2 more steps and check it continued from the last checkpoint),
# KILL_RANK (unset; N: kill -9 trainer rank N after the first step, check
# that the job fails and the other ranks exit by themselves, then resume),
# BAD_GEN (1: the generators fail at their start, --max-tokens 0; check that
# the job fails at once, naming the generator's log, with nothing left
# running), KEEP (1: keep the directory), RL_BUILD (build).
# Needs: root, slurm-wlm and munge (Debian: apt-get install slurm-wlm munge;
# not in the Makefile's packages: this test is manual, not part of make
# check).  Uses ports 16817-16818 and 17001.. (SLURM), 29500 and 7400.
set -eu

NODES=${NODES:-3}
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
GEN_NODES=${GEN_NODES:-1}
STEPS=${STEPS:-3}
BATCH=${BATCH:-4}
SAMPLES=${SAMPLES:-4}
RESUME_TOO=${RESUME_TOO:-1}
KILL_RANK=${KILL_RANK:-}
BAD_GEN=${BAD_GEN:-0}
MAX_TOKENS=8
[ "$BAD_GEN" = 1 ] && MAX_TOKENS=0
KEEP=${KEEP:-0}
TOP=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$TOP/${RL_BUILD:-build}/bin

say() { echo "local-test: $*" >&2; }
fail() { say "$*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "slurmd must run as root here (no cgroups, SlurmdUser=root)"
for p in munged slurmctld slurmd sbatch scontrol sinfo; do
	command -v $p >/dev/null 2>&1 || fail "$p not found; hint: apt-get install slurm-wlm munge"
done
[ -x "$BIN/rl-train" ] || fail "no $BIN/rl-train; hint: make"

D=$(mktemp -d /tmp/rl-slurm.XXXXXX)
chmod 755 "$D"
PIDS=""
# a process of this test still alive after TERM and a grace period gets KILL
stop_pids() {
	for p in "$@"; do kill "$p" 2>/dev/null || true; done
	i=0
	for p in "$@"; do
		while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
		kill -9 "$p" 2>/dev/null || true
	done
}
cleanup() {
	rc=$?
	trap - EXIT INT TERM
	# the jobs first: their slurmstepd would outlive the daemons
	if [ -n "${SLURM_CONF:-}" ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
		scancel --partition=local 2>/dev/null || true
		i=0
		while [ $i -lt 150 ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do sleep 0.2; i=$((i + 1)); done
	fi
	stop_pids $PIDS
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	# a slurmstepd left over (a job that did not end) writes to our slurmd logs
	left=""
	for p in $(pgrep -x slurmstepd || true); do
		ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$D/" && left="$left $p"
	done
	[ -z "$left" ] || { say "stopping leftover slurmstepd$left"; stop_pids $left; }
	if [ "$rc" = 0 ] && [ "$KEEP" != 1 ]; then rm -rf "$D"; else say "kept $D"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- munge: a key and a socket of our own --------------------------------------------
mkdir -m 711 "$D/munge"
dd if=/dev/urandom of="$D/munge/key" bs=128 count=1 2>/dev/null
chmod 400 "$D/munge/key"
setsid munged -F -f --key-file="$D/munge/key" --socket="$D/munge/sock" --pid-file="$D/munge/pid" \
	--log-file="$D/munge/log" --seed-file="$D/munge/seed" 2>"$D/munge/out" &
PIDS="$PIDS $!"
i=0
until [ -S "$D/munge/sock" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || fail "munged did not start: $(cat "$D/munge/out")"; sleep 0.1
done

# ---- slurm: one controller, NODES slurmd on this host -----------------------------------
host=$(hostname -s)
mkdir -p "$D/state" "$D/spool" "$D/log"
cat > "$D/slurm.conf" <<EOF
ClusterName=rltest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/sock
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
NodeName=n[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=local Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
SLURM_CONF=$D/slurm.conf
export SLURM_CONF
setsid slurmctld -D -i 2>"$D/log/slurmctld.out" &
PIDS="$PIDS $!"
n=1
while [ $n -le "$NODES" ]; do
	mkdir -p "$D/spool/n$n"
	setsid slurmd -D -N "n$n" 2>"$D/log/slurmd.n$n.out" &
	PIDS="$PIDS $!"
	n=$((n + 1))
done
i=0
until [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = "$NODES" ]; do
	i=$((i + 1))
	[ $i -lt 300 ] || { sinfo >&2 || true; tail -n 5 "$D"/log/*.log >&2; fail "the nodes did not come up"; }
	sleep 0.1
done
say "cluster up: $(sinfo -h -o '%P %D %t %N')"

# ---- a tiny model and prompts with ids -------------------------------------------------
PATH=$BIN:$PATH
export PATH
rl-train -q --init "$TOP/pipelines/demo/model-cpu.json" --tokenizer bytes --out "$D/model" --seed 1
rl-reward gen-arith --n 200 --seed 5 --split train -o "$D/p.jsonl"
awk '{ sub(/^\{/, "{\"id\":" NR ","); print }' "$D/p.jsonl" > "$D/prompts.jsonl"

# one OpenMP thread per process: the host has few cores and many processes
export OMP_NUM_THREADS=1
submit() { # STEPS RESUME
	sbatch --wait --parsable --nodes="$NODES" --chdir="$D" --output="$D/job.%j.out" \
		--export="ALL,DEVICE=cpu,MODEL=$D/model,PROMPTS=$D/prompts.jsonl,TASK=arith,GPUS_PER_NODE=$GPUS_PER_NODE,GEN_NODES=$GEN_NODES,BATCH=$BATCH,SAMPLES=$SAMPLES,STEPS=$1,MAX_TOKENS=$MAX_TOKENS,LR=1e-3,SAVE_EVERY=1,COMM_TIMEOUT=60,RUN=$D/run,RESUME=$2" \
		"$TOP/pipelines/slurm/grpo.sbatch"
}
show() { cat "$D"/job.*.out >&2; tail -n 5 "$D"/run/logs/*.log >&2 || true; }

if [ "$BAD_GEN" = 1 ]; then
	# generators that fail at their start: the job fails (it waited for ever
	# before), naming the generator's log, and nothing of it is left running
	t0=$(date +%s)
	if submit 100 0 >"$D/jobid"; then show; fail "the job succeeded although its generators failed"; fi
	t=$(( $(date +%s) - t0 ))
	grep -q "rl-rollout.0.0 exited with status 2 before training ended" "$D"/run/logs/gen.*.log ||
		{ show; fail "the generation log does not name the failed generator"; }
	grep -q "the generation step ended before training did" "$D"/job.*.out || { show; fail "no message from the job"; }
	sleep 1
	left=""
	for p in $(for n in rl-queue rl-reward rl-rollout rl-train; do pgrep -x $n; done); do
		case $(readlink "/proc/$p/cwd" 2>/dev/null) in "$D"*) left="$left $p" ;; esac
	done
	[ -z "$left" ] || { ps -o pid,args -p $left >&2; fail "processes of the job still running"; }
	say "ok: the job failed as it should ($t s after submission), nothing left running"
	exit 0
fi

if [ -n "$KILL_RANK" ]; then
	# a rank killed after the first step: the job fails, the others exit by themselves
	t0=$(date +%s)
	(
		until [ -s "$D/run/metrics.jsonl" ]; do sleep 0.2; done
		p=""
		for q in $(pgrep -f "rl-train --device cpu -m $D/model"); do
			tr '\0' '\n' < /proc/$q/environ | grep -qx "SLURM_PROCID=$KILL_RANK" && p=$q
		done
		[ -n "$p" ] || { say "no trainer rank $KILL_RANK"; exit 1; }
		say "killing trainer rank $KILL_RANK (pid $p)"
		kill -9 "$p"
	) &
	killer=$!
	if submit 100 0 >"$D/jobid"; then show; fail "the job succeeded although a rank was killed"; fi
	wait "$killer" || true
	t=$(( $(date +%s) - t0 ))
	grep -h 'lost the connection\|failed or went away\|no data from' "$D"/run/logs/train.*.log >&2 ||
		{ show; fail "no survivor reported the lost rank"; }
	pgrep -f "rl-train --device cpu -m $D/model" >/dev/null && fail "trainer ranks still running"
	say "ok: the job failed as it should ($t s after submission), the survivors exited"
	[ "$RESUME_TOO" = 1 ] || exit 0
	# the next job resumes from the newest full checkpoint (SAVE_EVERY=1: every step)
	done_steps=$(readlink "$D/run/ckpt/latest" | sed 's/^step-0*//')
	STEPS=$((done_steps + 2))
	submit "$STEPS" 1 >"$D/jobid" || { show; fail "resumed job $(cat "$D/jobid") failed"; }
	last=$(readlink "$D/run/ckpt/latest")
	[ "$last" = "$(printf 'step-%08d' "$STEPS")" ] || { show; fail "after the resume latest is $last"; }
	grep -q "resuming from '$D/run/ckpt/$(printf 'step-%08d' "$done_steps")'" "$D/run/logs/train.0.log" ||
		{ show; fail "rank 0 did not resume from step $done_steps"; }
	say "ok: resumed after the failure from step $done_steps to $last"
	exit 0
fi

submit "$STEPS" 0 >"$D/jobid" || { show; fail "job $(cat "$D/jobid") failed"; }
lines=$(wc -l < "$D/run/metrics.jsonl")
[ "$lines" = "$STEPS" ] || { show; fail "$lines metric lines, expected $STEPS"; }
[ -d "$D/run/ckpt/$(readlink "$D/run/ckpt/latest")" ] || fail "no checkpoint"
cat "$D"/job.*.out >&2
say "ok: $STEPS steps on $NODES nodes: $(readlink "$D/run/ckpt/latest")"

if [ "$RESUME_TOO" = 1 ]; then
	submit $((STEPS + 2)) 1 >"$D/jobid" || { show; fail "resumed job $(cat "$D/jobid") failed"; }
	lines=$(wc -l < "$D/run/metrics.jsonl")
	[ "$lines" = $((STEPS + 2)) ] || { show; fail "$lines metric lines after the resume, expected $((STEPS + 2))"; }
	last=$(readlink "$D/run/ckpt/latest")
	[ "$last" = "$(printf 'step-%08d' $((STEPS + 2)))" ] || fail "after the resume latest is $last"
	say "ok: resumed to $last"
fi

#!/bin/sh
# bench/auth.sh — what --auth-key-file costs against no key on loopback: the
# broker's throughput (bench/queue.c, RLQ_BENCH_AUTH) and rl-sync's push and
# pull bandwidth of a checkpoint (the CLI, stored chunks, no shared memory,
# best of 3).  JSON lines on stdout.  With TLS_DIR (ca.pem, srv.pem/key,
# cli.pem/key, as bench/tls.sh makes them) both sides of every pair run over
# tls+tcp://, where a request's MAC covers its header only.
# PARTS (default "queue sync") picks the halves to run; rl-sync's lines
# carry the server's and the clients' CPU seconds per GB moved (as
# bench/tls.sh) and the load average.
# usage: sh bench/auth.sh [SECONDS_PER_QUEUE_RUN] [CHECKPOINT_MB] [TLS_DIR] [PARTS]   (from the repository root)
set -eu
SECS=${1:-4}
MB=${2:-256}
TLS=${3:-}
PARTS=${4:-queue sync}
B=${RL_BUILD:-build}
T=$(mktemp -d /tmp/rl-auth-bench.XXXXXX)
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"' EXIT

head -c 32 /dev/urandom | base64 > "$T/key"
chmod 600 "$T/key"
case " $PARTS " in *" queue "*)
	if [ -n "$TLS" ]; then
		RLQ_BENCH_TLS=$TLS RLQ_BENCH_AUTH=$T/key "$B/bench/queue" "$SECS" "$B/bin/rl-queue"
	else
		RLQ_BENCH_AUTH=$T/key "$B/bench/queue" "$SECS" "$B/bin/rl-queue"
	fi
esac
case " $PARTS " in *" sync "*) ;; *) exit 0 ;; esac
SCHEME=tcp S="" CL=""
if [ -n "$TLS" ]; then
	SCHEME=tls+tcp
	S="--tls-cert $TLS/srv.pem --tls-key $TLS/srv.key --tls-ca $TLS/ca.pem"
	CL="--tls-cert $TLS/cli.pem --tls-key $TLS/cli.key --tls-ca $TLS/ca.pem"
fi

mkdir -p "$T/ck"
head -c $((MB * 1048576)) /dev/urandom > "$T/ck/model.safetensors"
echo '{"model_type":"gpt2"}' > "$T/ck/config.json"
port=$((30000 + $$ % 20000))
# CPU seconds: a process's from /proc, the shell's reaped children's from times
proc_cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }
kids_cpu() { times | awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } printf "%.2f", n }'; }
for mode in none key; do
	port=$((port + 1))
	U=$SCHEME://127.0.0.1:$port
	C="$CL"
	[ $mode = key ] && C="$C --auth-key-file $T/key"
	"$B/bin/rl-sync" serve -q --no-shm --listen "$U" $S $([ $mode = key ] && echo "--auth-key-file $T/key") 3>&- &
	SP=$!
	PIDS="$PIDS $SP"
	i=0
	until "$B/bin/rl-sync" status $C --timeout 300 "$U" >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -lt 100 ] || { echo "auth bench: rl-sync serve did not start" >&2; exit 1; }
		sleep 0.1
	done
	best_push=0 best_pull=0
	c0=$(proc_cpu $SP) k0=$(kids_cpu)
	for v in 1 2 3; do
		t0=$(date +%s.%N)
		"$B/bin/rl-sync" push -q $C --stored --transport stream "$U" "$T/ck" --version $v
		t1=$(date +%s.%N)
		rm -rf "$T/out"
		"$B/bin/rl-sync" pull -q $C --transport stream "$U" --out "$T/out"
		t2=$(date +%s.%N)
		cmp -s "$T/out/v$(printf %06d $v)/model.safetensors" "$T/ck/model.safetensors" || { echo "auth bench: pulled bytes differ" >&2; exit 1; }
		best_push=$(echo "$t0 $t1 $best_push" | awk '{d=$2-$1; print ($3==0||d<$3)?d:$3}')
		best_pull=$(echo "$t1 $t2 $best_pull" | awk '{d=$2-$1; print ($3==0||d<$3)?d:$3}')
	done
	cpu=$(echo "$(proc_cpu $SP) $c0 $(kids_cpu) $k0" | awk '{print $1 - $2 + $3 - $4}')
	load=$(cut -d' ' -f1 /proc/loadavg)
	echo "$mode $MB $best_push $best_pull $cpu $load" | awk '{printf "{\"bench\":\"sync-auth\",\"scheme\":\"'$SCHEME'\",\"key\":%s,\"mb\":%d,\"push_s\":%.3f,\"pull_s\":%.3f,\"push_mb_per_s\":%.0f,\"pull_mb_per_s\":%.0f,\"cpu_s_per_gb_moved\":%.2f,\"load1\":%s}\n", ($1=="key")?"true":"false", $2, $3, $4, $2/$3, $2/$4, $5 / (6 * $2 / 1024), $6}'
done

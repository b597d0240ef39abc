#!/bin/sh
# bench/tls.sh — what tls+tcp:// with client certificates costs against plain
# tcp:// on loopback: the broker's throughput (bench/queue.c, RLQ_BENCH_TLS)
# and rl-sync's push and pull bandwidth of a checkpoint (the CLI, stored
# chunks, no shared memory).  TLS runs twice, on each engine: OpenSSL (the
# default) and nng's mbedTLS (RL_TLS_ENGINE=mbedtls), each queue run with its
# own plain tcp:// run just before it.  JSON lines on stdout.
# rl-sync pulls whole chunks over the bulk stream on both (under TLS next to
# tls+tcp://).  PARTS (default "queue sync") picks the halves to run.
# usage: sh bench/tls.sh [SECONDS_PER_QUEUE_RUN] [CHECKPOINT_MB] [PARTS]   (from the repository root)
set -eu
SECS=${1:-4}
MB=${2:-256}
PARTS=${3:-queue sync}
B=${RL_BUILD:-build}
T=$(mktemp -d /tmp/rl-tls-bench.XXXXXX)
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"' EXIT

(
	cd "$T"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca
	openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=localhost
	printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > srv.ext
	openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile srv.ext
	openssl req -newkey rsa:2048 -nodes -keyout cli.key -out cli.csr -subj /CN=client
	openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem -days 2
) >/dev/null 2>&1

case " $PARTS " in *" queue "*)
	for e in openssl mbedtls; do
		RL_TLS_ENGINE=$e RLQ_BENCH_TLS=$T "$B/bench/queue" "$SECS" "$B/bin/rl-queue"
	done
esac
case " $PARTS " in *" sync "*) ;; *) exit 0 ;; esac

mkdir -p "$T/ck"
head -c $((MB * 1048576)) /dev/urandom > "$T/ck/model.safetensors"
echo '{"model_type":"gpt2"}' > "$T/ck/config.json"
port=$((30000 + $$ % 20000))
# CPU seconds: a process's from /proc, the shell's reaped children's from times
proc_cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }
kids_cpu() { times | awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } printf "%.2f", n }'; }
for mode in tcp openssl mbedtls; do
	port=$((port + 1))
	export RL_TLS_ENGINE=openssl
	if [ $mode != tcp ]; then
		RL_TLS_ENGINE=$mode
		U=tls+tcp://127.0.0.1:$port
		# nng's mbedTLS engine checks DNS names only: it dials the name
		[ $mode = mbedtls ] && U=tls+tcp://localhost:$port
		set -- --tls-cert "$T/srv.pem" --tls-key "$T/srv.key" --tls-ca "$T/ca.pem"
		C="--tls-cert $T/cli.pem --tls-key $T/cli.key --tls-ca $T/ca.pem"
	else
		U=tcp://127.0.0.1:$port
		set --
		C=""
	fi
	"$B/bin/rl-sync" serve -q --no-shm --listen "$U" "$@" 3>&- &
	SP=$!
	PIDS="$PIDS $SP"
	i=0
	until "$B/bin/rl-sync" status $C --timeout 300 "$U" >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -lt 100 ] || { echo "tls bench: rl-sync serve did not start" >&2; exit 1; }
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
		cmp -s "$T/out/v$(printf %06d $v)/model.safetensors" "$T/ck/model.safetensors" || { echo "tls bench: pulled bytes differ" >&2; exit 1; }
		best_push=$(echo "$t0 $t1 $best_push" | awk '{d=$2-$1; print ($3==0||d<$3)?d:$3}')
		best_pull=$(echo "$t1 $t2 $best_pull" | awk '{d=$2-$1; print ($3==0||d<$3)?d:$3}')
	done
	# server and clients, 3 pushes and 3 pulls (the cmp included)
	cpu=$(echo "$(proc_cpu $SP) $c0 $(kids_cpu) $k0" | awk '{print $1 - $2 + $3 - $4}')
	bulk=$("$B/bin/rl-sync" status $C --json "$U" | sed -n 's/.*"bulk_chunks_served":\([0-9]*\).*/\1/p')
	load=$(cut -d' ' -f1 /proc/loadavg)
	echo "$mode $MB $best_push $best_pull $cpu $bulk $load" | awk '{printf "{\"bench\":\"sync-tls\",\"mode\":\"%s\",\"mb\":%d,\"push_s\":%.3f,\"pull_s\":%.3f,\"push_mb_per_s\":%.0f,\"pull_mb_per_s\":%.0f,\"cpu_s_per_gb_moved\":%.2f,\"bulk_chunks_served\":%d,\"load1\":%s}\n", $1, $2, $3, $4, $2/$3, $2/$4, $5 / (6 * $2 / 1024), $6, $7}'
done

# tests/cli/serve_helper.bash — starting `rl-rollout serve` on a free loopback
# port for the serve bats files (needs port_helper.bash loaded first).

# serve_at OUT ERR ARGS...: rl-rollout serve ARGS on a free loopback port,
# its stdout to the file OUT ("-" leaves it to the test's own) and stderr to
# ERR; sets SURL (http://127.0.0.1:P) and SPID once /health answers and adds
# SPID to PIDS.  A server that exits before answering (its port taken) is
# started again on another port, five times at most; then ERR is shown and
# it fails.
serve_at() {
	local out=$1 err=$2 port
	shift 2
	for _ in $(seq 5); do
		port=$(free_port)
		if [ "$out" = - ]; then
			rl-rollout serve --listen "127.0.0.1:$port" "$@" 2> "$err" &
		else
			rl-rollout serve --listen "127.0.0.1:$port" "$@" > "$out" 2> "$err" &
		fi
		SPID=$!
		PIDS="$PIDS $SPID"
		for _ in $(seq 200); do
			kill -0 "$SPID" 2>/dev/null || break
			if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
				SURL="http://127.0.0.1:$port"
				return 0
			fi
			sleep 0.05
		done
	done
	cat "$err" >&2
	return 1
}

# tests/cli/sync_helper.bash — loaded by the rl-sync bats files: start a
# server on $URL ($T, $PIDS and $SPID as those files set them).

. "$BATS_TEST_DIRNAME/port_helper.bash"

# serve [ARGS...]: start a server on $URL in the background, wait until it
# answers; if the port is taken by someone else, move to another one (not
# with KEEP_URL=1: a restart that clients must find again)
serve() {
	for _ in 1 2 3; do
		rl-sync serve --listen "$URL" "$@" 3>&- 2>"$T/serve.err" &
		SPID=$!
		PIDS="$PIDS $SPID"
		for _ in $(seq 50); do
			if ! kill -0 "$SPID" 2>/dev/null; then break; fi
			if grep -q 'listening on' "$T/serve.err" &&
				rl-sync status "$URL" --timeout 200 >/dev/null 2>&1; then
				return 0
			fi
			sleep 0.1
		done
		kill "$SPID" 2>/dev/null || true
		if [ -z "$KEEP_URL" ]; then
			PORT=$(free_port)
			URL=tcp://127.0.0.1:$PORT
		fi
	done
	cat "$T/serve.err" >&2
	return 1
}

# tests/cli/queue_helper.bash — loaded by the rl-queue bats files: brokers on
# free loopback ports, HTTP fetches, the small record files they share.
# The files set $D (a temp dir) and $PIDS (killed by pid in their teardown).

. "$BATS_TEST_DIRNAME/model_helper.bash"
. "$BATS_TEST_DIRNAME/port_helper.bash"

# http_get HOST:PORT PATH: prints the body (fails on a non-2xx status);
# with TYPED=1 the Content-Type first, on a line of its own
http_get() {
	python3 - "http://$1$2" <<'PY'
import os, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    if os.environ.get("TYPED") == "1":
        sys.stdout.write(r.headers.get("Content-Type", "") + "\n")
    sys.stdout.write(r.read().decode("utf-8"))
PY
}

# start_http_broker PREFIX ARGS...: rl-queue serve with --http on two ports
# from free_port; waits until both the broker and the HTTP listener answer,
# then sets ${PREFIX}URL, ${PREFIX}HTTP and BROKER (its pid)
start_http_broker() {
	local p=$1 url http
	shift
	for _ in $(seq 10); do
		url="tcp://127.0.0.1:$(free_port)"
		http="127.0.0.1:$(free_port)"
		rl-queue serve --listen "$url" --http "$http" -q "$@" 3>&- &
		BROKER=$!
		PIDS="$PIDS $BROKER"
		for _ in $(seq 100); do
			kill -0 "$BROKER" 2>/dev/null || break    # a port taken: try others
			if rl-queue stat --timeout 0.2 "$url" >/dev/null 2>&1 && http_get "$http" /api/stats >/dev/null 2>&1; then
				eval "${p}URL=\$url ${p}HTTP=\$http"
				return 0
			fi
			sleep 0.05
		done
	done
	echo "broker did not start" >&2
	return 1
}

# write_records DIR: DIR/prompts.jsonl (three prompts with answers, groups of
# 2) and DIR/scored.jsonl (two complete groups of scored samples, ids 11,12 and
# 21,22, version 0)
write_records() {
	for i in 1 2 3; do
		printf '{"prompt_text":"what is %d+%d","meta":{"answer":"%d"},"group_size":2}\n' $i $i $((i + i))
	done > "$1/prompts.jsonl"
	for g in 1 2; do
		for i in 0 1; do
			printf '{"id":%d,"group":%d,"index":%d,"group_size":2,"version":[0,0],"response":[1,2,3],"reward":%d}\n' \
				$((g * 10 + i + 1)) $g $i $i
		done
	done > "$1/scored.jsonl"
}

# write_model DIR: a one-layer byte-level model in DIR/m0 and twelve
# arithmetic prompts in DIR/prompts.jsonl (for pipelines of real workers)
write_model() {
	toy_model "$1" "" 64
	for i in $(seq 1 12); do echo "{\"prompt_text\":\"$i+$i=\",\"meta\":{\"answer\":\"$((i + i))\"}}"; done > "$1/prompts.jsonl"
}

# kill_pids: the teardown of every file
kill_pids() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
}

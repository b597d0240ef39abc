# tests/cli/port_helper.bash — the loopback TCP ports of the bats files'
# daemons (brokers, rl-sync servers, rank 0's rendezvous), from one place.
#
# Why not any random port: a port in the kernel's ephemeral range (32768 and
# up by default) can be the local end of some outgoing connection (a client
# of another test, a ring listener bound to port 0) by the time a daemon
# listens on it, and the daemon then exits with "Address in use".  Below that
# range only an explicit bind takes a port, so a port no socket uses right
# before the daemon starts is, in practice, still free when it listens.  The
# helpers that start daemons (on_free_port below, start_broker and
# start_http_broker, serve in sync_helper.bash, train_world) also start a
# daemon again on another port when it exits before answering.

# free_port: prints a TCP port that no socket on this host uses now
# (listening, connected or closing: /proc/net/tcp and tcp6), drawn at random
# below the ephemeral range (ip_local_port_range), 20000 and up, and not one
# handed out before in this bats run (two daemons of a test never get the
# same one).  One awk, no Python: a few milliseconds.
free_port() {
	local lo=32768 base=20000 span used gave=" " given="" files="" f p hx i _r
	[ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r lo _r < /proc/sys/net/ipv4/ip_local_port_range
	[ "$lo" -ge 21024 ] || base=1024   # a lowered ephemeral range: the ports below it
	span=$((lo - base))
	if [ "$span" -lt 1000 ]; then
		echo "free_port: the ephemeral range starts at $lo: no room below it" >&2
		return 1
	fi
	# the local addresses of every TCP socket, "0100007F:A927 ..." (one awk
	# read: bash's read goes byte by byte, and /proc/net/tcp renders itself
	# again for each of them)
	for f in /proc/net/tcp /proc/net/tcp6; do [ -r "$f" ] && files+=" $f"; done
	used=" $([ -z "$files" ] || awk '$1 != "sl" { printf "%s ", $2 }' $files) "
	[ -n "${BATS_RUN_TMPDIR:-}" ] && given=$BATS_RUN_TMPDIR/rl-ports-given
	[ -n "$given" ] && [ -r "$given" ] && gave+="$(< "$given") " && gave=${gave//$'\n'/ }
	for ((i = 0; i < 1000; i++)); do
		p=$((base + (RANDOM * 32768 + RANDOM) % span))
		printf -v hx '%04X' "$p"
		case $used in *":$hx "*) continue ;; esac
		case $gave in *" $p "*) continue ;; esac
		[ -z "$given" ] || echo "$p" >> "$given"
		echo "$p"
		return 0
	done
	echo "free_port: no free port in $base-$((lo - 1))" >&2
	return 1
}

# on_free_port READY CMD [ARGS...]: starts CMD ARGS in the background (fd 3
# closed), every "@PORT@" in them replaced by a port from free_port, and waits
# until READY (a shell command, "@PORT@" replaced too, its output discarded)
# succeeds.  A daemon that exits first (its port taken between the check and
# its listen) is started again on another port, 5 times at most; one that
# neither answers nor exits within 10 s fails the call.  Sets DPORT (the
# port) and DPID (the daemon's pid) and adds DPID to PIDS; leaves PORT alone.
on_free_port() {
	local ready=$1 try t0
	shift
	for try in 1 2 3 4 5; do
		DPORT=$(free_port) || return 1
		"${@//@PORT@/$DPORT}" 3>&- &
		DPID=$!
		PIDS="${PIDS:-} $DPID"
		t0=$SECONDS
		while [ $((SECONDS - t0)) -le 10 ]; do
			if eval "${ready//@PORT@/$DPORT}" > /dev/null 2>&1; then
				return 0
			fi
			kill -0 "$DPID" 2>/dev/null || break
			sleep 0.05
		done
		if kill -0 "$DPID" 2>/dev/null; then
			echo "on_free_port: '$*' on port $DPORT did not answer within 10 s" >&2
			return 1
		fi
		wait "$DPID" 2>/dev/null || true
		echo "on_free_port: '$*' on port $DPORT exited; trying another port" >&2
	done
	return 1
}

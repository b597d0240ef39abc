#!/bin/sh
# tests/check.sh [--gpu] — run every C unit test binary and every Bats file,
# then print one summary line "check: N passed, N failed, N skipped".
# C tests: exit 0 pass, 77 skip, else fail.  Bats: through prove, per test case.
# --gpu: only the tests whose name contains "gpu" or "cuda"; a skip is a failure.
B=${RL_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
PATH="$root/$B/bin:$PATH"; export PATH RL_BUILD=$B
# tiny test models: idle OpenMP threads must not spin on a loaded 2-core machine
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}; export OMP_WAIT_POLICY
gpu=0; [ "${1:-}" = --gpu ] && gpu=1
pass=0; fail=0; skip=0; failed=""
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

for t in "$root/$B"/tests/test_*; do
	[ -x "$t" ] || continue
	n=${t##*/}
	case $n in *gpu*|*cuda*) is_gpu=1 ;; *) is_gpu=0 ;; esac
	[ $gpu = 1 ] && [ $is_gpu = 0 ] && continue
	# a unit test that hangs fails after RL_TEST_TIMEOUT seconds (default 600)
	# instead of holding up the whole run
	( cd "$root" && exec timeout -k 10 "${RL_TEST_TIMEOUT:-600}" "$t" ) >"$log/$n" 2>&1; rc=$?
	[ $rc = 124 ] && echo "(timed out after ${RL_TEST_TIMEOUT:-600} s)" >>"$log/$n"
	if [ $rc = 0 ]; then pass=$((pass + 1)); echo "ok     $n"
	elif [ $rc = 77 ] && [ $gpu = 0 ]; then skip=$((skip + 1)); echo "skip   $n: $(tail -n 1 "$log/$n")"
	else fail=$((fail + 1)); failed="$failed $n"; echo "FAIL   $n (exit $rc)"; sed 's/^/    /' "$log/$n" | tail -n 40
	fi
done

# man pages: mdoc lint, one result per page
if [ $gpu = 0 ] && ls "$root"/man/*.[1-9] >/dev/null 2>&1; then
	for m in "$root"/man/*.[1-9]; do
		n=man/${m##*/}
		if ! command -v mandoc >/dev/null 2>&1; then skip=$((skip + 1)); echo "skip   $n: mandoc not installed"
		elif mandoc -Tlint -W warning "$m" >"$log/lint" 2>&1; then pass=$((pass + 1)); echo "ok     $n"
		else fail=$((fail + 1)); failed="$failed $n"; echo "FAIL   $n (mandoc -Tlint)"; sed 's/^/    /' "$log/lint"
		fi
	done
fi

# a Bats file that hangs (a command without its own time limit, an nng close
# that never returns: nng #1543) fails after RL_BATS_TIMEOUT seconds (default
# 1200; the slowest file takes about 20 s) instead of holding up the run
bats="timeout -k 10 ${RL_BATS_TIMEOUT:-1200} bats --tap"
# and a test that hangs fails after BATS_TEST_TIMEOUT seconds (default 600),
# named in the log, while the rest of its file still runs.  bats' watchdog is
# a background job of the test's shell: a test waits for its own jobs by pid,
# never with a bare `wait`
export BATS_TEST_TIMEOUT=${BATS_TEST_TIMEOUT:-600}
if [ $gpu = 0 ] && ls "$root"/tests/cli/*.bats >/dev/null 2>&1; then
	( cd "$root" && prove -v --exec "$bats" tests/cli/*.bats ) >"$log/bats" 2>&1
	b_ok=$(grep -c '^ok ' "$log/bats"); b_skip=$(grep -c '^ok .* # skip' "$log/bats")
	b_fail=$(grep -c '^not ok ' "$log/bats")
	pass=$((pass + b_ok - b_skip)); skip=$((skip + b_skip)); fail=$((fail + b_fail))
	if [ "$b_fail" != 0 ] || ! grep -q '^Result: PASS' "$log/bats"; then
		[ "$b_fail" = 0 ] && fail=$((fail + 1))
		failed="$failed bats"; cat "$log/bats"
	else
		grep -E '^(ok|not ok)' "$log/bats" | sed 's/^/bats   /'
	fi
fi

# --gpu: the Bats files about the GPU too (a skip is a failure)
if [ $gpu = 1 ] && ls "$root"/tests/cli/*cuda*.bats >/dev/null 2>&1; then
	( cd "$root" && prove -v --exec "$bats" tests/cli/*cuda*.bats ) >"$log/bats" 2>&1
	b_ok=$(grep -c '^ok ' "$log/bats"); b_skip=$(grep -c '^ok .* # skip' "$log/bats")
	b_fail=$(grep -c '^not ok ' "$log/bats")
	pass=$((pass + b_ok - b_skip)); fail=$((fail + b_fail + b_skip))
	if [ "$b_fail" != 0 ] || [ "$b_skip" != 0 ] || ! grep -q '^Result: PASS' "$log/bats"; then
		failed="$failed bats-gpu"; cat "$log/bats"
	else
		grep -E '^(ok|not ok)' "$log/bats" | sed 's/^/bats   /'
	fi
fi

[ -n "$failed" ] && echo "failed:$failed"
echo "check: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]

#!/bin/sh
# bench/reward.sh — rl-reward end to end, JSON lines on stdout:
#   the built-in gsm8k verifier on a binary stream (decode + score + encode),
#   on one core (taskset -c 0 when there is taskset), and
#   --exec with a trivial reward program at -j 1 and -j 2 (build/bench/reward_echo,
#   a C program: the protocol's own cost; python3: a typical script's).
# Usage: sh bench/reward.sh [RECORDS] [EXEC_RECORDS]   (defaults 200000 and 20000)
# Needs build/bin/rl-reward, build/bench/reward and reward_echo (make tests-build).
set -eu
B=${RL_BUILD:-build}
n=${1:-200000}
ne=${2:-20000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pin=""
command -v taskset >/dev/null && pin="taskset -c 0"

"$B/bench/reward" --emit "$tmp/g.rlt" --records "$n"
"$B/bench/reward" --emit "$tmp/e.rlt" --records "$ne"

now() { date +%s.%N; }
line() { # what task jobs records t0 t1
	awk -v w="$1" -v t="$2" -v j="$3" -v n="$4" -v a="$5" -v b="$6" 'BEGIN { s = b - a;
		printf "{\"bench\":\"reward\",\"what\":\"%s\",\"task\":\"%s\",\"jobs\":%d,\"records\":%d,\"seconds\":%.3f,\"records_per_s\":%.0f}\n", w, t, j, n, s, n / s }'
}

t0=$(now)
$pin "$B/bin/rl-reward" -q --task gsm8k -o "$tmp/out.rlt" "$tmp/g.rlt"
t1=$(now)
line cli gsm8k 1 "$n" "$t0" "$t1"

t0=$(now)
$pin "$B/bin/rl-reward" -q --task gsm8k --jsonl -o "$tmp/out.jsonl" "$tmp/g.rlt"
t1=$(now)
line cli-jsonl-out gsm8k 1 "$n" "$t0" "$t1"

py_prog='import sys
for line in sys.stdin:
    print(1, flush=True)'
printf '%s\n' "$py_prog" > "$tmp/trivial.py"
for j in 1 2; do
	t0=$(now)
	"$B/bin/rl-reward" -q --exec "$B/bench/reward_echo" -j $j -o "$tmp/out.rlt" "$tmp/e.rlt"
	t1=$(now)
	line exec-c trivial $j "$ne" "$t0" "$t1"
	t0=$(now)
	"$B/bin/rl-reward" -q --exec "python3 $tmp/trivial.py" -j $j -o "$tmp/out.rlt" "$tmp/e.rlt"
	t1=$(now)
	line exec-python3 trivial $j "$ne" "$t0" "$t1"
done

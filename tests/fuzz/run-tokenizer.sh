#!/bin/sh
# tests/fuzz/run-tokenizer.sh — build the tokenizer's libFuzzer target with
# clang (fuzzer + address + undefined sanitizers) and run it for a bounded time.
# FUZZ_TIME=seconds (default 60), FUZZ_JOBS.  Crashes land in build/fuzz-tok/
# as crash-* files; exit status 1 then.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CLANG=${CLANG:-clang}
T=${FUZZ_TIME:-60}
out=build/fuzz-tok
if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "fuzz: clang not found; install it: apt-get install -y clang" >&2
	exit 1
fi
mkdir -p "$out/corpus"
flags="-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Ilib -I."
"$CLANG" $flags $(pkg-config --cflags libcjson) -o "$out/fuzz_tokenizer" \
	tests/fuzz/fuzz_tokenizer.c lib/base/core.c lib/tok/tokenizer.c lib/tok/tok_bpe.c lib/tok/tok_pretok.c lib/tok/jinja.c lib/base/io.c \
	$(pkg-config --libs libcjson) -lpcre2-8 -lutf8proc -lm -lpthread

# seeds: a tokenizer.json, and text for each mode
printf '\000%s' "$(cat <<'JSON'
{"model":{"type":"rlpipe-bytes"},"added_tokens":[{"id":256,"content":"<|eos|>","special":true}]}
JSON
)" >"$out/corpus/seed0"
# SentencePiece-style BPE with byte fallback (Gemma 3's form), a few tokens
python3 -c '
import json
v = {"<0x%02X>" % b: b for b in range(256)}
v.update({"\u2581": 256, "a": 257, "b": 258, "ab": 259, "\u2581ab": 260})
print(json.dumps({"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious"},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"},
        "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "added_tokens": [{"id": 261, "content": "<s>", "special": True}],
    "model": {"type": "BPE", "byte_fallback": True, "vocab": v,
        "merges": [["a", "b"], ["\u2581", "ab"]]}}, ensure_ascii=False), end="")' >"$out/spm.json"
printf '\000' | cat - "$out/spm.json" >"$out/corpus/seed_spm"
i=0
for text in "Hello, world! I'm here   x\n\n  y 123 <|s|> <a> caf\303\251" \
	"\345\274\272\345\214\226 e\314\201 \341\204\200\341\205\241 \377\376 \360\237\230\200 'LL" \
	"  \t\r\n\302\240\343\200\200 it's 9999 (x) --- ???"; do
	for mode in 1 2 3; do
		i=$((i + 1))
		printf "\\00$mode$text" >"$out/corpus/seed$i"
	done
done

echo "fuzz: running fuzz_tokenizer for ${T}s"
cd "$out"
./fuzz_tokenizer -max_total_time="$T" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 ${FUZZ_JOBS:+-jobs=$FUZZ_JOBS} corpus 2>fuzz.log || {
	tail -n 60 fuzz.log >&2
	echo "fuzz: FAILED (see build/fuzz-tok/fuzz.log and build/fuzz-tok/crash-*)" >&2
	exit 1
}
grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+.*DONE' fuzz.log || tail -n 3 fuzz.log
echo "fuzz: ok (no crash in ${T}s)"

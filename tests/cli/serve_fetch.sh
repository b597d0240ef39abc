#!/bin/sh
# tests/cli/serve_fetch.sh — the official `openai` npm client (pinned) that
# tests/cli/rl-rollout-serve.bats drives `rl-rollout serve` with, installed
# into a cache outside the repository:
#   ${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}-openai
# Prints that node_modules directory and exits 0 when the package is there
# (already or now); exits 1 when npm is missing or the registry cannot be
# reached (the test that needs it then skips).
PKG=openai@4.104.0
dir=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}-openai
if [ -f "$dir/node_modules/openai/package.json" ]; then
	echo "$dir/node_modules"
	exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "serve_fetch: npm not found" >&2; exit 1; }
mkdir -p "$dir" || exit 1
if ! timeout 120 npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
	--fetch-retries=1 --fetch-timeout=30000 "$PKG" >"$dir/npm.log" 2>&1; then
	echo "serve_fetch: npm install $PKG failed (offline?); see '$dir/npm.log'" >&2
	exit 1
fi
echo "$dir/node_modules"

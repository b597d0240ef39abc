#!/usr/bin/env bats
# --version on every program (rl-sync's alone, before a command, so that
# push/pull/publish --version N keep their meaning) and the bash completion.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

@test "--version: 'PROG (rlpipe) VERSION' on stdout, exit 0, the same version everywhere" {
	v=""
	for c in rl-rollout rl-reward rl-train rl-queue rl-sync "rl-queue serve" "rl-reward gen-arith" "rl-rollout tokenize"; do
		run -0 --separate-stderr $c --version
		[ -z "$stderr" ]
		[[ "$output" =~ ^(rl-[a-z]+)\ \(rlpipe\)\ ([0-9A-Za-z._-]+)$ ]] || { echo "$c: $output"; false; }
		[ "${BASH_REMATCH[1]}" = "${c%% *}" ]
		[ -z "$v" ] || [ "${BASH_REMATCH[2]}" = "$v" ]
		v=${BASH_REMATCH[2]}
	done
	# in a git tree: git describe's commit (the tree may have changed since the build)
	if git -C "$BATS_TEST_DIRNAME" rev-parse --git-dir >/dev/null 2>&1; then
		[[ "$v" =~ ^[0-9a-f]{7,}(-dirty)?$|^v?[0-9] ]]
	fi
	# rl-sync's --version N after a command is still the weight version
	run -2 --separate-stderr rl-sync pull --version
	[[ "$stderr" == *"--version"* ]]
	[[ "$output" != *"(rlpipe)"* ]]
}

# complete WORDS...: what _rlpipe offers for the last word
complete_words() {
	bash -c '
		source "$1"; shift
		COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
		_rlpipe
		printf "%s\n" "${COMPREPLY[@]}"' _ "$BATS_TEST_DIRNAME/../../completions/rlpipe.bash" "$@"
}

@test "completion: the file sources in bash and completes options, commands and values" {
	run -0 bash -c 'source "$1" && complete -p rl-train rl-queue rl-sync rl-reward rl-rollout' _ \
	    "$BATS_TEST_DIRNAME/../../completions/rlpipe.bash"
	[[ "$output" == *"_rlpipe rl-train"* ]]
	run -0 complete_words rl-train --allow-ch
	assert_output "--allow-change"
	run -0 complete_words rl-train --con
	assert_output "--config"
	run -0 complete_words rl-queue serve --max-st
	assert_output "--max-staleness"
	run -0 complete_words rl-queue se
	assert_output "serve"
	run -0 complete_words rl-sync pu
	assert_output "push
pull
publish"
	run -0 complete_words rl-train --device c
	assert_output "cpu
cuda"
	# every option of rl-train's table is offered
	n=$(complete_words rl-train -- | wc -l)
	[ "$n" -gt 60 ]
}

@test "make install puts the completion where bash-completion finds it; uninstall removes it" {
	d="$BATS_TEST_TMPDIR/inst"
	make -s -C "$BATS_TEST_DIRNAME/../.." install DESTDIR="$d" PREFIX=/usr B="${RL_BUILD:-build}" >/dev/null
	[ -f "$d/usr/share/bash-completion/completions/rlpipe" ]
	[ "$(readlink "$d/usr/share/bash-completion/completions/rl-train")" = rlpipe ]
	make -s -C "$BATS_TEST_DIRNAME/../.." uninstall DESTDIR="$d" PREFIX=/usr B="${RL_BUILD:-build}" >/dev/null
	[ ! -e "$d/usr/share/bash-completion/completions/rlpipe" ]
}

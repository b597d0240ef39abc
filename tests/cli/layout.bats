#!/usr/bin/env bats
# The shape of the source tree: lib/'s folders include only downwards
# (tests/layout/check-includes.sh, docs/architecture.md), no module circle,
# and the checker itself catches what it is meant to catch.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

TOP="$BATS_TEST_DIRNAME/../.."

@test "lib/ includes follow the floors, with no circle" {
	run sh "$TOP/tests/layout/check-includes.sh"
	assert_success
	assert_output "layout: lib/ includes follow the floors"
}

# a copy of lib/ with one bad include added each time: the checker must fail
bad_copy() {
	d=$BATS_TEST_TMPDIR/t
	mkdir -p "$d/tests/layout"
	cp -r "$TOP/lib" "$d/lib"
	cp "$TOP/tests/layout/check-includes.sh" "$d/tests/layout/"
	printf '%s\n' "$2" >> "$d/lib/$1"
}

@test "the checker refuses an include that runs back up" {
	bad_copy base/core.c '#include "train/train.h"'
	run sh "$BATS_TEST_TMPDIR/t/tests/layout/check-includes.sh"
	assert_failure
	assert_output --partial 'lib/base/core.c:'
	assert_output --partial 'runs back up'
}

@test "the checker refuses a same-floor include that is not an allowed arrow" {
	bad_copy model/config.c '#include "queue/queue.h"'
	run sh "$BATS_TEST_TMPDIR/t/tests/layout/check-includes.sh"
	assert_failure
	assert_output --partial 'same floor'
}

@test "the checker refuses a circle between modules" {
	bad_copy base/gset.h '#include "base/json.h"'
	bad_copy base/json.h '#include "base/gset.h"'
	run sh "$BATS_TEST_TMPDIR/t/tests/layout/check-includes.sh"
	assert_failure
	assert_output --partial 'circle'
}

@test "the checker refuses a file in lib/ itself and a bare include from another folder" {
	bad_copy model/config.c '#include "core.h"'
	touch "$BATS_TEST_TMPDIR/t/lib/stray.c"
	run sh "$BATS_TEST_TMPDIR/t/tests/layout/check-includes.sh"
	assert_failure
	assert_output --partial "'lib/stray.c' is not in a subsystem folder"
	assert_output --partial "'core.h' is not in lib/model"
}

# no line of the Bats files and helpers matches the extended regex $1, and
# it matches exactly one line of the sample $2 (the pattern finds what it is for)
no_line_matches() {
	cd "$BATS_TEST_DIRNAME"
	run grep -n -E "$1" ./*.bats ./*.bash
	assert_failure
	assert_output ''
	run grep -c -E "$1" <<< "$2"
	assert_output 1
}

@test "no Bats test waits with a bare wait (it would also wait for bats' BATS_TEST_TIMEOUT watchdog, which tests/check.sh sets)" {
	# a line whose command is wait with no pid, alone or after ; or &&
	no_line_matches '(^|[;&|]|then|do)[[:space:]]*wait[[:space:]]*($|;|&|\|)' $'\tsleep 1 &\n\twait\n\twait "$p"'
}

@test "every timeout of a Bats test also kills (-k): a program stuck after timeout's SIGTERM would hold the test, and bats' own per-test limit only sends SIGTERM too" {
	no_line_matches '(^|[^-A-Za-z_])timeout [0-9.]+ ' \
		$'\ttimeout 5 rl-sync pull\n\ttimeout -k 20 5 rl-sync pull\n\trl-queue stat --timeout 5 U'
}

#!/usr/bin/env bats
# What a new user reads: every option a program takes is in its man page, the
# man pages render as written, and the pipe examples of README.md, man/ and
# docs/ can run as written.  Mechanical and fast (no model is run).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

TOP="$BATS_TEST_DIRNAME/../.."

# One line per shell example, continuation lines (\ or mdoc's \e) joined.
joined_examples() {
	for f in "$TOP"/README.md "$TOP"/man/*.[1-9] "$TOP"/docs/*.md; do
		sed 's/\\e$/\\/' "$f" | awk '/\\$/ { sub(/\\$/, ""); buf = buf $0 " "; next } { print buf $0; buf = "" }'
	done
}

# value of option $2 in the words of $1, else $3
optval() { awk -v o="$2" -v d="$3" '{ for (i = 1; i < NF; i++) if ($i == o) { print $(i + 1); exit } print d }' <<<"$1"; }

@test "pipe examples: rl-rollout's --train-batch is rl-train's --batch (a smaller one stalls the pipe)" {
	n=0; bad=
	while IFS= read -r line; do
		gen=${line%%|*}
		train=rl-train${line##*rl-train}
		tb=$(optval "$gen" --train-batch 8)
		b=$(optval "$train" --batch 8)
		n=$((n + 1))
		[ "$tb" = "$b" ] || bad="$bad
--train-batch $tb, --batch $b: $line"
	done < <(joined_examples | grep -- 'rl-rollout .*--max-staleness.*|.*rl-train')
	echo "checked $n pipes$bad"
	[ "$n" -ge 4 ]
	[ -z "$bad" ]
}

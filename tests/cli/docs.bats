#!/usr/bin/env bats
# What a new user reads: every option a program takes is in its man page, the
# man pages render as written, and the pipe examples of README.md, man/ and
# docs/ can run as written.  Mechanical and fast (no model is run).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

TOP="$BATS_TEST_DIRNAME/../.."

render() { mandoc -Tascii "$1" | col -b; }

# long options of a program: its getopt_long tables and its --help text(s)
src_opts() {
	grep -oh '{ *"[a-z][a-z0-9-]*", *[a-z_]*argument' "$TOP"/cmd/"$1"/*.c | sed 's/^{ *"//; s/".*//'
}
help_opts() { "$@" --help | grep -o -- '--[a-z][a-z0-9-]*' | sed 's/^--//'; }

@test "every long option of every program is in its man page" {
	n=0; missing=
	for p in rl-rollout rl-reward rl-train rl-sync rl-queue; do
		man=$(render "$TOP/man/$p.1")
		[ "${#man}" -gt 2000 ]
		opts=$(src_opts "$p"; help_opts "$p")
		case $p in
		rl-rollout) opts="$opts $(help_opts rl-rollout tokenize) $(help_opts rl-rollout serve)" ;;
		rl-queue) for c in cat serve put get stat; do opts="$opts $(help_opts rl-queue $c)"; done ;;
		esac
		for o in $(printf '%s\n' $opts | sort -u); do
			n=$((n + 1))
			grep -q -- "--$o\\b" <<<"$man" || missing="$missing $p:--$o"
		done
	done
	echo "checked $n options; not in the man page:$missing"
	[ "$n" -ge 180 ]
	[ -z "$missing" ]
}

@test "--help of every program and subcommand: usage on stdout, exit 0; exit 1 when stdout cannot be written" {
	n=0
	for c in rl-rollout "rl-rollout tokenize" "rl-rollout serve" rl-reward "rl-reward gen-arith" rl-train rl-sync "rl-sync serve" \
	    "rl-sync push" "rl-sync pull" "rl-sync status" "rl-sync publish" rl-queue "rl-queue cat" "rl-queue serve" \
	    "rl-queue put" "rl-queue get" "rl-queue stat"; do
		run -0 --separate-stderr $c --help
		[[ "$output" == usage:* ]] || { echo "$c: $output"; false; }
		[ -z "$stderr" ]
		[ -w /dev/full ] || continue
		st=0; $c --help >/dev/full 2>/dev/null || st=$?
		[ "$st" -eq 1 ] || { echo "$c --help > /dev/full: exit $st"; false; }
		n=$((n + 1))
	done
	[ "$n" -eq 18 ] || [ ! -w /dev/full ]
}

@test "no man page renders ordinary words as flags (.Fl x the next words)" {
	bad=
	for m in "$TOP"/man/*.[1-9]; do
		out=$(render "$m")
		[ "${#out}" -gt 1000 ]
		hits=$(grep -nE -- '(^|[ (])-(the|and|to|a|an|as|or|of|with|on|is|in|for|at|one|it|when|previous|pull)\b' <<<"$out" || true)
		[ -z "$hits" ] || bad="$bad
${m##*/}: $hits"
	done
	echo "$bad"
	[ -z "$bad" ]
}

@test "every man page names its source (.Os rlpipe), not the host system" {
	for m in "$TOP"/man/*.[1-9]; do
		run -0 sed -n 3p "$m"
		assert_output '.Os rlpipe'
	done
}

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

# the first ```sh block of a Markdown file
first_sh_block() { awk '/^```sh$/ { b = 1; next } b && /^```/ { exit } b' "$1"; }

@test "the data conversions of the gsm8k and countdown READMEs run as written and give what rl-reward scores" {
	command -v jq >/dev/null || skip "jq is not installed"
	d="$BATS_TEST_TMPDIR/recipes"; mkdir -p "$d/g" "$d/c"
	printf '%s\n' '{"question":"What is 6 times 12?","answer":"6*12 = 72\n#### 72"}' > "$d/g/gsm8k-train.jsonl"
	cp "$d/g/gsm8k-train.jsonl" "$d/g/gsm8k-test.jsonl"
	first_sh_block "$TOP/pipelines/gsm8k/README.md" > "$d/g/convert.sh"
	run -0 sh -ec "cd '$d/g' && . ./convert.sh"
	[ "$(wc -l < "$d/g/data/train.jsonl")" -eq 1 ] && [ "$(wc -l < "$d/g/data/test.jsonl")" -eq 1 ]
	jq -c '{id: 1, response_text: "6*12 = 72\n#### 72", meta: {answer: .answer}}' "$d/g/data/train.jsonl" > "$d/g/r.jsonl"
	run -0 --separate-stderr rl-reward -q --task gsm8k --jsonl "$d/g/r.jsonl"
	[[ "$output" == *'"reward":1'[,}]* ]]

	for i in $(seq 1005); do printf '{"nums":[%d,2,3],"target":%d}\n' "$i" $((i + 5)); done > "$d/c/countdown.jsonl"
	first_sh_block "$TOP/pipelines/countdown/README.md" > "$d/c/convert.sh"
	run -0 sh -ec "cd '$d/c' && . ./convert.sh"
	[ "$(wc -l < "$d/c/data/train.jsonl")" -eq 5 ] && [ "$(wc -l < "$d/c/data/test.jsonl")" -eq 1000 ]
	head -n 1 "$d/c/data/train.jsonl" | jq -c '{id: 1, response_text: "<answer>1 + 2 + 3</answer>", meta: .}' > "$d/c/r.jsonl"
	run -0 --separate-stderr rl-reward -q --task countdown --jsonl "$d/c/r.jsonl"
	[[ "$output" == *'"reward":1'[,}]* ]]
}

@test "make demo asks for the packages of the build and gnuplot only, not the test suite's (chromium, torch, bats)" {
	# -n: the recipes are printed, not run (the package lists are in them); a
	# build directory of the test's own, so the real build's flags stamp stays
	b="$BATS_TEST_TMPDIR/b"
	run -0 make -n -s -C "$TOP" demo B="$b" NO_CUDA=1
	[[ "$output" == *"build-essential"* && "$output" == *"gnuplot-nox"* ]]
	[[ "$output" == *"pipelines/demo/demo.sh"* ]]
	[[ "$output" != *"chromium"* && "$output" != *"python3-torch"* && "$output" != *"bats-assert"* ]]
	run -0 make -n -s -C "$TOP" deps B="$b" NO_CUDA=1
	[[ "$output" == *"chromium"* && "$output" == *"python3-torch"* && "$output" == *"build-essential"* ]]
}

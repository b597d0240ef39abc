#!/usr/bin/env bats
# --config FILE on every program: the file's options, the command line's over
# them, and errors that name the file, line and key (docs/config.md).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup() {
	T="$BATS_TEST_TMPDIR"
}

@test "config: the file's options apply; the command line overrides them" {
	printf 'n: 3\nseed: 7\ndigits: 2\n' > "$T/gen.yaml"
	run --separate-stderr rl-reward gen-arith --config "$T/gen.yaml"
	assert_success
	[ "${#lines[@]}" -eq 3 ]
	want=$(rl-reward gen-arith -n 3 --seed 7 --digits 2)
	[ "$output" = "$want" ]
	# the command line wins, before or after --config
	run --separate-stderr rl-reward gen-arith -n 5 --config "$T/gen.yaml"
	[ "${#lines[@]}" -eq 5 ]
	run --separate-stderr rl-reward gen-arith --config="$T/gen.yaml" --n 4 --seed 8
	[ "$output" = "$(rl-reward gen-arith -n 4 --seed 8 --digits 2)" ]
	# a repeatable option takes a list; a switch true or false
	printf 'task: [gsm8k, "math:0.5"]\njsonl: true\nquiet: false\n' > "$T/r.yaml"
	run --separate-stderr rl-reward --config "$T/r.yaml" /dev/null
	assert_success
}

@test "config: an unknown key is refused naming file, line and key" {
	printf '# run\nn: 3\n\nseeed: 7\n' > "$T/bad.yaml"
	run -2 --separate-stderr rl-reward gen-arith --config "$T/bad.yaml"
	[[ "$stderr" == *"'$T/bad.yaml': line 4: unknown key 'seeed'"* ]]
	[[ "$stderr" == *"hint: the keys are the long options of 'rl-reward gen-arith --help'"* ]]
	[ -z "$output" ]
	printf 'listen: tcp://127.0.0.1:9\nlr: 1e-6\n' > "$T/q.yaml"
	run -2 --separate-stderr rl-queue serve --config "$T/q.yaml"
	[[ "$stderr" == *"'$T/q.yaml': line 2: unknown key 'lr'"* ]]
	[[ "$stderr" == *"rl-queue serve --help"* ]]
	printf 'algo: grpo\nlrr: 1e-6\n' > "$T/t.yaml"
	run -2 --separate-stderr rl-train --config "$T/t.yaml"
	[[ "$stderr" == *"line 2: unknown key 'lrr'"* ]]
}

@test "config: wrong types and bad values name file, line and key" {
	printf 'n: 3\nreverse: sometimes\n' > "$T/a.yaml"
	run -2 --separate-stderr rl-reward gen-arith --config "$T/a.yaml"
	[[ "$stderr" == *"line 2: key 'reverse': wrong type: a switch takes true or false"* ]]
	printf 'n:\n  a: 1\n' > "$T/b.yaml"
	run -2 --separate-stderr rl-reward gen-arith --config "$T/b.yaml"
	[[ "$stderr" == *"line 2: key 'n': wrong type"* ]]
	printf 'seed: [1, 2]\n' > "$T/c.yaml"
	run -2 --separate-stderr rl-reward gen-arith --config "$T/c.yaml"
	[[ "$stderr" == *"line 1: key 'seed': wrong type: a list"* ]]
	printf 'algo: grpo\n\nlr: fast\n' > "$T/d.yaml"
	run -2 --separate-stderr rl-train --config "$T/d.yaml"
	[[ "$stderr" == *"'$T/d.yaml': line 3: --lr: bad value 'fast'"* ]]
	printf 'max-staleness: 1\nmax-bytes: 12\n' > "$T/e.yaml"
	run -2 --separate-stderr rl-queue serve --config "$T/e.yaml"
	[[ "$stderr" == *"'$T/e.yaml': line 2: --max-bytes: bad value '12'"* ]]
	printf 'threads: 0\n' > "$T/f.yaml"
	run -2 --separate-stderr rl-sync --config "$T/f.yaml" status tcp://127.0.0.1:9
	[[ "$stderr" == *"'$T/f.yaml': line 1: --threads: bad value '0'"* ]]
	printf 'max-tokens: lots\n' > "$T/g.yaml"
	run -2 --separate-stderr rl-rollout --config "$T/g.yaml" -m /nonexistent
	[[ "$stderr" == *"'$T/g.yaml': line 1:"*"bad value 'lots'"* ]]
	printf 'n: 3\nseed: [1\n' > "$T/h.yaml"
	run -2 --separate-stderr rl-reward gen-arith --config "$T/h.yaml"
	[[ "$stderr" == *"'$T/h.yaml': line 3: not YAML"* ]]
	run -2 --separate-stderr rl-reward gen-arith --config "$T/missing.yaml"
	[[ "$stderr" == *"cannot open '$T/missing.yaml'"* ]]
}

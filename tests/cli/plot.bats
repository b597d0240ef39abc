#!/usr/bin/env bats
# pipelines/plot: metrics JSONL (rl-metrics(5) names) -> table -> PNG curves;
# the table holds the file's numbers; bad lines are named.

load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup() {
	bats_require_minimum_version 1.5.0
	command -v gnuplot >/dev/null || skip "gnuplot is not installed"
	D=$(mktemp -d /tmp/rl-plot-bats.XXXXXX)
	P="$BATS_TEST_DIRNAME/../../pipelines/plot"
	python3 -c '
import json, math
for s in range(1, 26):
    print(json.dumps({"step": s, "training/global_step": s,
        "critic/score/mean": 1 - math.exp(-s / 6), "actor/pg_loss": 0.2 / s,
        "actor/entropy": 2.3 - 0.04 * s, "response_length/mean": 30 + s,
        "actor/ppo_kl": None if s % 4 == 0 else 0.001 * s}))' > "$D/m.jsonl"
}

teardown() {
	rm -rf "$D"
}

png_size() { # png_size FILE: prints WIDTHxHEIGHT, fails if not a PNG
	python3 - "$1" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read(32)
assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR", "not a PNG"
print("%dx%d" % struct.unpack(">II", b[16:24]))
PY
}

@test "make turns a metrics file into a table and PNG curves" {
	cd "$D"   # -f: paths relative to where make runs
	run --separate-stderr make -s -f "$P/Makefile" METRICS=m.jsonl OUT=plots \
		KEYS="critic/score/mean actor/pg_loss actor/entropy response_length/mean actor/ppo_kl absent/key"
	assert_success
	[[ "$stderr" == *"no values of 'absent/key'; left out"* ]]
	for k in critic_score_mean actor_pg_loss actor_entropy response_length_mean actor_ppo_kl; do
		[ "$(png_size "$D/plots/$k.png")" = 640x400 ]
	done
	[ ! -e "$D/plots/absent_key.png" ]
	[ "$(png_size "$D/plots/curves.png")" = 1260x560 ]   # 5 plots: 3 x 2
	# the table is the file's numbers, null as NaN
	run python3 - "$D/m.jsonl" "$D/plots/metrics.dat" <<'PY'
import json, math, sys
src = [json.loads(l) for l in open(sys.argv[1])]
lines = open(sys.argv[2]).read().splitlines()
keys = lines[0].split()[2:]
assert keys == ["critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "actor/ppo_kl"], keys
rows = [l.split() for l in lines[1:]]
assert len(rows) == len(src) == 25
for o, r in zip(src, rows):
    assert float(r[0]) == o["step"]
    for k, c in zip(keys, r[1:]):
        if o[k] is None:
            assert c == "NaN", (k, c)
        else:
            assert float(c) == o[k], (k, c, o[k])
print("ok")
PY
	assert_output "ok"
	# a curve is drawn: a rising score and a flat line give different images
	printf '{"step":1,"critic/score/mean":0.5}\n{"step":2,"critic/score/mean":0.5}\n' > "$D/flat.jsonl"
	make -s -f "$P/Makefile" METRICS=flat.jsonl OUT=flat KEYS=critic/score/mean 2>/dev/null
	! cmp -s "$D/flat/critic_score_mean.png" "$D/plots/critic_score_mean.png" || false
}

@test "a malformed metrics line is named by file and line; nothing is left half-made" {
	printf '{"step":1,"actor/pg_loss":0.1}\n{"step":2,"actor/pg_loss": oops}\n' > "$D/bad.jsonl"
	run --separate-stderr make -s -C "$P" METRICS="$D/bad.jsonl" OUT="$D/plots"
	assert_failure
	[[ "$stderr" == *"bad.jsonl' line 2: not JSON"* ]]
	[ ! -e "$D/plots/metrics.dat" ] && [ ! -e "$D/plots/curves.png" ]
	run --separate-stderr make -s -C "$P" METRICS="$D/missing.jsonl" OUT="$D/plots"
	assert_failure
	[[ "$stderr" == *"missing.jsonl"* ]]
	printf '[1,2]\n' > "$D/arr.jsonl"
	run --separate-stderr python3 "$P/extract.py" "$D/arr.jsonl" actor/pg_loss
	assert_failure 1
	[[ "$stderr" == *"arr.jsonl' line 1: not a JSON object"* ]]
}

@test "other KEYS, or another (older) METRICS file, into the same OUT make a new table; the same ones remake nothing" {
	cd "$D"
	head -n 3 m.jsonl > old.jsonl && touch -d '1 hour ago' old.jsonl
	make -s -f "$P/Makefile" METRICS=m.jsonl OUT=plots KEYS="actor/pg_loss" 2>/dev/null
	run -0 head -n 1 plots/metrics.dat
	assert_output "# step actor/pg_loss"
	run -0 make -f "$P/Makefile" METRICS=m.jsonl OUT=plots KEYS="actor/pg_loss"
	refute_output --partial "extract.py"
	make -s -f "$P/Makefile" METRICS=m.jsonl OUT=plots KEYS="actor/entropy critic/score/mean" 2>/dev/null
	run -0 head -n 1 plots/metrics.dat
	assert_output "# step actor/entropy critic/score/mean"
	[ -e plots/actor_entropy.png ] && [ -e plots/critic_score_mean.png ]
	make -s -f "$P/Makefile" METRICS=old.jsonl OUT=plots KEYS="actor/entropy critic/score/mean" 2>/dev/null
	[ "$(wc -l < plots/metrics.dat)" -eq 4 ]   # the header and old.jsonl's 3 steps
}

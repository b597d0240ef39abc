#!/usr/bin/env bats
# rl-train: the learner's command line, checkpoints, resume, metrics and bad input.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/scored.jsonl"
}

mk() { python3 tests/fixtures/train/mkscored.py "$@"; }

@test "--help prints usage to stdout and exits 0" {
	run -0 rl-train --help
	assert_output --partial "usage: rl-train"
}

@test "an unknown option or value is a usage error (exit 2)" {
	run -2 --separate-stderr rl-train --bogus
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --algo nope
	[[ "$stderr" == *"--algo: unknown algorithm 'nope'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --loss-agg nope
	[[ "$stderr" == *"--loss-agg: "*"'nope'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --kl k9
	[[ "$stderr" == *"--kl: "*"'k9'"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --schedule nope
	[[ "$stderr" == *"--schedule: "*"'nope'"* ]]
	# a seed keeps all 64 bits (a double rounded 2^53 + 1 to 2^53)
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --seed 18446744073709551616
	[[ "$stderr" == *"--seed: bad value '18446744073709551616' (a whole number from 0 to 18446744073709551615)"* ]]
	rl-train --init "$TD/m0/config.json" --tokenizer bytes --out "$TD/seed0" --seed 9007199254740992 2>/dev/null
	rl-train --init "$TD/m0/config.json" --tokenizer bytes --out "$TD/seed1" --seed 9007199254740993 2>/dev/null
	! cmp -s "$TD/seed0/model.safetensors" "$TD/seed1/model.safetensors" || false
	# a device name that cannot be is a usage error too, found before the model loads
	for d in tpu cuda:x cuda: cuda:99999 CPU; do
		run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --device "$d" "$TD/scored.jsonl"
		[[ "$stderr" == *"--device: want cpu, cuda, cuda:N or auto, not '$d'"* ]]
	done
	[ ! -e "$TD/x" ]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --lr abc
	[[ "$stderr" == *"--lr: bad value 'abc' (a number from 0 to 10)"* ]]
	# integer options take integers
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --batch 1.5
	[[ "$stderr" == *"--batch: bad value '1.5' (a whole number from 1 to 10000000)"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --max-steps 2.5
	[[ "$stderr" == *"--max-steps"* ]]
	run -2 --separate-stderr rl-train -m "$TD/m0"
	[[ "$stderr" == *"--out"* ]]
}

@test "--init writes a loadable model directory with a bytes tokenizer" {
	[ -f "$TD/m0/config.json" ] && [ -f "$TD/m0/model.safetensors" ] && [ -f "$TD/m0/tokenizer.json" ]
	run -0 rl-rollout tokenize -m "$TD/m0" <<< "hi"
}

@test "one metrics line and one published version per step; latest points at the newest" {
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ck" --batch 2 --lr 1e-3 --metrics "$TD/m.jsonl" "$TD/scored.jsonl"
	[ "$(wc -l < "$TD/m.jsonl")" -eq 4 ]
	for k in actor/pg_loss actor/pg_clipfrac actor/ppo_kl actor/entropy actor/grad_norm actor/lr \
	    critic/score/mean response_length/mean timing_s/update_actor perf/throughput staleness/mean; do
		grep -q "\"$k\":" "$TD/m.jsonl" || { echo "missing $k"; return 1; }
	done
	[ "$(readlink "$TD/ck/latest")" = step-00000004 ]
	[ -f "$TD/ck/step-00000004/optimizer.safetensors" ]
	[[ "$stderr" == *"4 steps; 32 records"* ]]
}

@test "a metrics file that cannot be written is an error naming it" {
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/mfull" --batch 2 --max-steps 1 --metrics /dev/full "$TD/scored.jsonl"
	[[ "$stderr" == *"cannot write '/dev/full': No space left on device"* ]]
}

@test "--beta1 and --beta2 of 1 (or a value whose float32 is 1) are usage errors: AdamW would give NaN weights" {
	for b in "--beta1 1" "--beta2 1" "--beta2 0.99999999"; do
		run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/beta" $b "$TD/scored.jsonl"
		[[ "$stderr" == *"${b% *}: bad value '${b#* }'"*"1 excluded"* ]]
	done
	run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/beta" --beta1 -0.1 "$TD/scored.jsonl"
	[[ "$stderr" == *"--beta1: bad value '-0.1' (a number from 0 to 1)"* ]]
	[ ! -e "$TD/beta" ]
	run -0 rl-train -q -m "$TD/m0" --out "$TD/beta" --beta2 0.9999999 --batch 2 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
}

@test "--keep prunes old versions" {
	run -0 rl-train -q -m "$TD/m0" --out "$TD/keep" --batch 1 --keep 2 --metrics /dev/null "$TD/scored.jsonl"
	[ "$(ls "$TD/keep" | grep -c '^step-')" -eq 2 ]
}

@test "resume: 2 steps + --resume + 2 steps is bitwise identical to 4 steps" {
	rl-train -q -m "$TD/m0" --out "$TD/a" --batch 2 --lr 1e-3 --max-steps 4 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/b" --batch 2 --lr 1e-3 --max-steps 2 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q --out "$TD/b" --batch 2 --lr 1e-3 --max-steps 4 --resume --metrics /dev/null "$TD/scored.jsonl"
	cmp "$TD/a/step-00000004/model.safetensors" "$TD/b/step-00000004/model.safetensors"
	cmp "$TD/a/step-00000004/optimizer.safetensors" "$TD/b/step-00000004/optimizer.safetensors"
	# and the weights did change
	! cmp -s "$TD/m0/model.safetensors" "$TD/a/step-00000004/model.safetensors" || false
}

@test "--recompute: the same weights bit for bit, with fewer activation bytes (-v)" {
	rl-train -q -m "$TD/m0" --out "$TD/rc0" --batch 2 --lr 1e-3 --max-steps 3 --ent-coef 0.01 \
	    --metrics /dev/null "$TD/scored.jsonl"
	run -0 --separate-stderr rl-train -v -m "$TD/m0" --out "$TD/rc1" --batch 2 --lr 1e-3 --max-steps 3 \
	    --ent-coef 0.01 --recompute --metrics /dev/null "$TD/scored.jsonl"
	cmp "$TD/rc0/step-00000003/model.safetensors" "$TD/rc1/step-00000003/model.safetensors"
	! cmp -s "$TD/m0/model.safetensors" "$TD/rc1/step-00000003/model.safetensors" || false
	with=$(sed -n 's/.*activations: \([0-9.]*\) MiB.*recomputed.*/\1/p' <<< "$stderr")
	run -0 --separate-stderr rl-train -v -m "$TD/m0" --out "$TD/rc2" --batch 2 --max-steps 1 \
	    --metrics /dev/null "$TD/scored.jsonl"
	without=$(sed -n 's/.*activations: \([0-9.]*\) MiB.*/\1/p' <<< "$stderr")
	[ -n "$with" ] && [ -n "$without" ]
	awk -v a="$with" -v b="$without" 'BEGIN { exit !(a < b) }'
}

@test "--resume with no checkpoint is an error" {
	run -1 --separate-stderr rl-train --out "$TD/none" --resume "$TD/scored.jsonl"
	[[ "$stderr" == *"cannot resume"* ]]
}

@test "every algorithm trains on the same data" {
	for a in grpo dr-grpo dapo rloo reinforce++; do
		run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/alg-$a" --algo "$a" --batch 4 --lr 1e-3 --metrics - "$TD/scored.jsonl"
		[ "${#lines[@]}" -ge 1 ] || { echo "$a: no metrics"; return 1; }
	done
	mk 4 3 1 --bad baseline > "$TD/remax.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/alg-remax" --algo remax --batch 2 --metrics - "$TD/remax.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	# remax without a baseline sample is an error that says how to make one
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/alg-remax2" --algo remax --batch 2 "$TD/scored.jsonl"
	[[ "$stderr" == *"greedy-baseline"* ]]
	# ppo (its own tests: rl-train-ppo.bats)
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/alg-ppo" --algo ppo --batch 4 --lr 1e-3 --metrics - "$TD/scored.jsonl"
	[ "${#lines[@]}" -eq 2 ] && [[ "${lines[0]}" == *'"critic/vf_loss":'* ]]
}

@test "PPO epochs and mini-batches, clipping, KL and entropy terms run" {
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/ppo2" --batch 4 --ppo-epochs 2 --mini-batches 2 \
	    --lr 1e-2 --clip-low 0.1 --clip-high 0.1 --dual-clip 3 --ent-coef 0.01 --tis-cap 2 --metrics - "$TD/scored.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	# the second pass sees a changed policy: ppo_kl is no longer exactly 0
	! grep -q '"actor/ppo_kl":0,' <<< "${lines[0]}" || false
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/klref" --batch 4 --kl k3 --kl-coef 0.1 --ref "$TD/m0" --metrics - "$TD/scored.jsonl"
	[[ "${lines[0]}" == *'"actor/kl_loss":0,'* ]]  # policy == reference at step 1
	[[ "${lines[1]}" == *'"actor/kl_loss":'* ]]
}

@test "a record without reward is an error naming it; --on-bad skip drops its group" {
	mk 4 2 0 --bad noreward > "$TD/bad.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/bad1" --batch 1 "$TD/bad.jsonl"
	[[ "$stderr" == *"record 4"* && "$stderr" == *"no 'reward'"* ]]
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/bad2" --batch 1 --on-bad skip --metrics /dev/null "$TD/bad.jsonl"
	[[ "$stderr" == *"3 steps"* && "$stderr" == *"1 groups dropped (bad)"* ]]
}

@test "NaN rewards and mismatched log-prob lengths are errors" {
	mk 4 2 0 --bad nan > "$TD/nan.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/nan" --batch 1 "$TD/nan.jsonl"
	[[ "$stderr" == *"NaN"* ]]
	mk 4 2 0 --bad lplen > "$TD/lp.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/lp" --batch 1 "$TD/lp.jsonl"
	[[ "$stderr" == *"'logprobs' length differs"* ]]
}

@test "input that ends before the first step is a failure (exit 1), not a run of 0 steps" {
	# a generator that died at its start: the pipe is empty
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/e0" --batch 2 --metrics /dev/null - < /dev/null
	[[ "$stderr" == *"'-' ended before the first step: 0 records, 0 complete groups (--batch 2)"* ]]
	# fewer groups than one batch
	mk 1 4 0 > "$TD/one.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/e1" --batch 2 --metrics /dev/null "$TD/one.jsonl"
	[[ "$stderr" == *"one.jsonl' ended before the first step: 4 records, 1 complete groups (--batch 2)"* ]]
	# a --resume that finds no record past its checkpoint has nothing left to do: exit 0
	rl-train -q -m "$TD/m0" --out "$TD/e2" --batch 2 --metrics /dev/null "$TD/scored.jsonl"
	run -0 --separate-stderr rl-train --out "$TD/e2" --batch 2 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"0 steps"* ]]
}

@test "a group missing samples is reported and not trained on" {
	mk 4 2 0 --bad missing > "$TD/miss.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/miss" --batch 1 --metrics /dev/null "$TD/miss.jsonl"
	[[ "$stderr" == *"group 1 is incomplete"*"1 of 2"* ]]
	[[ "$stderr" == *"3 steps"* ]]
}

@test "malformed input is an error naming the line; a missing file is an error naming it" {
	{ head -n 3 "$TD/scored.jsonl"; echo '{"id": 9, "group": '; } > "$TD/trunc.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/trunc" --batch 1 "$TD/trunc.jsonl"
	[[ "$stderr" == *"line 4"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/nofile" "$TD/does-not-exist.jsonl"
	[[ "$stderr" == *"does-not-exist.jsonl"* ]]
	run -1 --separate-stderr rl-train -m "$TD/no-model" --out "$TD/nofile" "$TD/scored.jsonl"
	[[ "$stderr" == *"no-model"* ]]
}

@test "SFT from text-only records (tokenized with the model's tokenizer) lowers the loss" {
	mk 48 1 0 --bad text > "$TD/sft.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/sft" --algo sft --batch 4 --lr 1e-2 --metrics - "$TD/sft.jsonl"
	[ "${#lines[@]}" -eq 12 ]
	first=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[0]}")
	last=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[11]}")
	echo "sft loss $first -> $last"
	awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }'
}

@test "--tfevents writes a TensorBoard event file" {
	run -0 rl-train -q -m "$TD/m0" --out "$TD/tfe" --batch 4 --tfevents "$TD/tb" --metrics /dev/null "$TD/scored.jsonl"
	ls "$TD"/tb/events.out.tfevents.*
	grep -q "actor/pg_loss" "$TD"/tb/events.out.tfevents.*
}

@test "--device cuda without a GPU is an error with a hint; --device auto falls back to the cpu in one line" {
	if nvidia-smi -L >/dev/null 2>&1; then skip "this machine has a GPU"; fi
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/dev1" --device cuda "$TD/scored.jsonl"
	[[ "$stderr" == *"device 'cuda'"* ]]
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/dev2" --device auto --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ "$(grep -c 'using the cpu' <<< "$stderr")" -le 1 ]
}

@test "loss_mask: tokens with 0 get no loss and do not count; all ones is no mask; a bad mask is a bad record" {
	# all ones: the same weights bit for bit
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); r["loss_mask"] = [1] * len(r["response"]); print(json.dumps(r))' "$TD/scored.jsonl" > "$TD/ones.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/lm0" --batch 2 --max-steps 2 --lr 1e-3 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/lm1" --batch 2 --max-steps 2 --lr 1e-3 --metrics /dev/null "$TD/ones.jsonl"
	cmp "$TD/lm0/latest/model.safetensors" "$TD/lm1/latest/model.safetensors"
	# the last tokens masked: as if the responses ended before them (causal: they do not
	# change the earlier tokens' log-probs), within float rounding, for every aggregation
	python3 -c '
import json, sys
with open(sys.argv[2], "w") as a, open(sys.argv[3], "w") as b:
    for l in open(sys.argv[1]):
        r = json.loads(l); k = max(1, len(r["response"]) // 2)
        m = dict(r); m["loss_mask"] = [1] * k + [0] * (len(r["response"]) - k); a.write(json.dumps(m) + "\n")
        t = dict(r); t["response"] = r["response"][:k]; t["logprobs"] = r["logprobs"][:k]; b.write(json.dumps(t) + "\n")' \
	    "$TD/scored.jsonl" "$TD/masked.jsonl" "$TD/cut.jsonl"
	for agg in token-mean seq-mean-token-mean; do
		rm -rf "$TD/lm2" "$TD/lm3"
		rl-train -q -m "$TD/m0" --out "$TD/lm2" --batch 2 --max-steps 2 --lr 1e-3 --loss-agg $agg --metrics "$TD/m2.jsonl" "$TD/masked.jsonl"
		rl-train -q -m "$TD/m0" --out "$TD/lm3" --batch 2 --max-steps 2 --lr 1e-3 --loss-agg $agg --metrics "$TD/m3.jsonl" "$TD/cut.jsonl"
		python3 - "$TD/lm2/latest/model.safetensors" "$TD/lm3/latest/model.safetensors" "$TD/lm0/latest/model.safetensors" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b, c = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
d_ab = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
d_ac = max(abs(x - y) for k in a for x, y in zip(a[k], c[k]))
assert d_ab < 1e-5 and d_ac > 1e-4, (d_ab, d_ac)
PY
		# the metrics count the trained tokens only
		[ "$(python3 -c 'import json,sys; print([round(json.loads(l)["actor/entropy"], 4) for l in open(sys.argv[1])] == [round(json.loads(l)["actor/entropy"], 4) for l in open(sys.argv[2])])' "$TD/m2.jsonl" "$TD/m3.jsonl")" = True ]
	done
	# a mask of the wrong length, or with a value other than 0 and 1
	python3 -c '
import json, sys
for i, l in enumerate(open(sys.argv[1])):
    r = json.loads(l)
    if r["id"] == 3: r["loss_mask"] = [1]
    if r["id"] == 6: r["loss_mask"] = [2] * len(r["response"])
    print(json.dumps(r))' "$TD/scored.jsonl" > "$TD/badmask.jsonl"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/lm4" --batch 2 --metrics /dev/null "$TD/badmask.jsonl"
	[[ "$stderr" == *"'loss_mask' length differs from 'response' length"* ]]
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/lm5" --batch 2 --on-bad skip --metrics /dev/null "$TD/badmask.jsonl"
	[[ "$stderr" == *"2 bad records, 2 groups dropped (bad)"* ]]
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/lm6" --batch 2 --metrics /dev/null <(grep -v '"id": 3,' "$TD/badmask.jsonl")
	[[ "$stderr" == *"'loss_mask' holds a value other than 0 and 1"* ]]
}

@test "--prom-file keeps the last step's metrics as strict Prometheus text, equal to its metrics line" {
	rl-train -q -m "$TD/m0" --out "$TD/prom" --batch 4 --max-steps 2 --metrics "$TD/prom.m" \
	    --prom-file "$TD/prom.txt" "$TD/scored.jsonl"
	run -0 python3 - "$TD/prom.txt" "$TD/prom.m" "$BATS_TEST_DIRNAME" <<'PY'
import json, re, sys
sys.path.insert(0, sys.argv[3])
from promparse import parse
types, samples = parse(open(sys.argv[1]).read())
last = [json.loads(l) for l in open(sys.argv[2])][-1]
want = {"rltrain_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in last.items() if isinstance(v, (int, float))}
assert set(samples) == set(want), sorted(set(samples) ^ set(want))
for k, v in want.items():
    # the JSON line prints 15 significant digits where they read back, the file 17
    assert types[k] == "gauge" and abs(samples[k] - v) <= 1e-13 * abs(v), (k, samples[k], v)
assert samples["rltrain_step"] == 2 and "rltrain_actor_pg_loss" in samples
print("ok", len(samples))
PY
	assert_output --partial "ok "
	# a file that cannot be written stops the run, naming it
	run -1 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/prom2" --batch 4 --max-steps 1 \
	    --metrics /dev/null --prom-file "$TD/no/such/dir/p.txt" "$TD/scored.jsonl"
	[[ "$stderr" == *"$TD/no/such/dir/p.txt"* ]]
}

#!/usr/bin/env bats
# rl-train: interrupted and resumed runs, skipped steps, what --out may hold,
# and records the learner cannot train on (named, --on-bad applies).

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	python3 tests/fixtures/train/mkscored.py 8 4 0 > "$TD/scored.jsonl"
}

# edit IN OUT PYTHON: OUT is IN with each record r changed by the statement(s)
edit() {
	python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
$(sed 's/^/    /' <<< "$3")
    print(json.dumps(r))" "$1" > "$2"
}

@test "resume: a group straddling the checkpoint is read again, bitwise the uninterrupted run" {
	# group 1 is split around group 2: after 2 steps (groups 0 and 2) half of it is pending
	python3 - "$TD/scored.jsonl" "$TD/inter.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in recs: by.setdefault(r['group'], []).append(r)
order = by[0] + by[1][:2] + by[2] + by[1][2:] + [r for g in range(3, 8) for r in by[g]]
open(sys.argv[2], 'w').writelines(json.dumps(r) + '\n' for r in order)
PY
	rl-train -q -m "$TD/m0" --out "$TD/ia" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/inter.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/ib" --batch 1 --lr 1e-3 --max-steps 2 --metrics /dev/null "$TD/inter.jsonl"
	grep -q '"records_pending":\[5,6\]' "$TD/ib/latest/trainer_state.json"
	# and once more, resuming a resumed run before it has read the pending records' successors
	rl-train -q --out "$TD/ib" --batch 1 --lr 1e-3 --max-steps 3 --resume --metrics /dev/null "$TD/inter.jsonl"
	run -0 --separate-stderr rl-train --out "$TD/ib" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/inter.jsonl"
	[[ "$stderr" != *incomplete*dropped* ]]
	[[ "$stderr" == *"5 steps; "* ]]
	cmp "$TD/ia/step-00000008/model.safetensors" "$TD/ib/step-00000008/model.safetensors"
	cmp "$TD/ia/step-00000008/optimizer.safetensors" "$TD/ib/step-00000008/optimizer.safetensors"
}

@test "resume by group: the records of groups done are skipped wherever they come; pending groups are read again" {
	rl-train -q -m "$TD/m0" --out "$TD/ga" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/gb" --batch 1 --lr 1e-3 --max-steps 2 --metrics /dev/null "$TD/scored.jsonl"
	grep -q '"groups_done":\["0-1"\]' "$TD/gb/latest/trainer_state.json"
	# the same records in another order (groups 7 to 0, as a generator that started
	# again would send them): groups 0 and 1 are skipped, the other six trained once
	python3 -c "
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
recs.sort(key=lambda r: (-r['group'], r['index']))
sys.stdout.writelines(json.dumps(r) + '\n' for r in recs)" "$TD/scored.jsonl" > "$TD/rev.jsonl"
	run -0 --separate-stderr rl-train --out "$TD/gb" --batch 1 --lr 1e-3 --resume --metrics "$TD/gb.m" "$TD/rev.jsonl"
	[[ "$stderr" == *"skipping the records of the 2 groups done"* ]]
	[[ "$stderr" == *"6 steps; "* ]]
	[[ "$stderr" == *"8 records skipped: their groups were done before --resume"* ]]
	grep -q '"groups_done":\["0-7"\]' "$TD/gb/latest/trainer_state.json"
	# nothing left: every record skipped, a resume with nothing to do
	run -0 --separate-stderr rl-train --out "$TD/gb" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/rev.jsonl"
	[[ "$stderr" == *"32 records skipped"* ]]
	# a checkpoint of an older rl-train (no groups_done): the position rule, bitwise
	rl-train -q -m "$TD/m0" --out "$TD/gc" --batch 1 --lr 1e-3 --max-steps 3 --metrics /dev/null "$TD/scored.jsonl"
	python3 -c "
import json, sys
p = sys.argv[1]; j = json.load(open(p)); del j['groups_done'], j['groups_pending']
open(p, 'w').write(json.dumps(j))" "$TD/gc/step-00000003/trainer_state.json"
	run -0 --separate-stderr rl-train --out "$TD/gc" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"skipping 12 records already consumed"* ]]
	cmp "$TD/ga/step-00000008/model.safetensors" "$TD/gc/step-00000008/model.safetensors"
	# a groups_done that is not ranges of decimal ids: refused, naming the file
	cp -r "$TD/gb" "$TD/gd"
	sed -i 's/"groups_done":\["0-7"\]/"groups_done":[7]/' "$TD/gd/latest/trainer_state.json"
	run -1 --separate-stderr rl-train --out "$TD/gd" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/rev.jsonl"
	[[ "$stderr" == *"trainer_state.json': groups_done: element 0: not \"N\" or \"LO-HI\""* ]]
}

@test "a step with a non-finite gradient norm is skipped: nothing published for it, counted, training goes on" {
	# rewards of +-3e38 overflow rloo's advantages to inf: group 1's gradient is NaN
	edit "$TD/scored.jsonl" "$TD/huge.jsonl" "if r['group'] == 1: r['reward'] = 3e38 if r['index'] % 2 else -3e38"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/sk" --algo rloo --batch 1 --lr 1e-3 --keep 0 \
	    --metrics "$TD/sk.jsonl" "$TD/huge.jsonl"
	[[ "$stderr" == *"step skipped"* ]]
	[[ "$stderr" == *"1 steps skipped"* ]]
	[ "$(ls "$TD/sk" | grep -c '^step-')" -eq 7 ]
	[ "$(readlink "$TD/sk/latest")" = step-00000007 ]
	[ "$(wc -l < "$TD/sk.jsonl")" -eq 7 ]
	tail -1 "$TD/sk.jsonl" | grep -q '"train/steps_skipped":1'
	head -1 "$TD/sk.jsonl" | grep -q '"train/steps_skipped":0'
}

@test "resume after a kill between full checkpoints: newer step directories are removed, the run continues" {
	rl-train -q -m "$TD/m0" --out "$TD/ka" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/scored.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/kb" --batch 1 --lr 1e-3 --save-every 2 --max-steps 2 --metrics /dev/null "$TD/scored.jsonl"
	# what a run killed after step 3 of --save-every 2 leaves: step 3 without optimizer state,
	# latest at it, and the temp directory of a step being written
	cp -r "$TD/kb/step-00000002" "$TD/kb/step-00000003"
	rm "$TD/kb/step-00000003/optimizer.safetensors" "$TD/kb/step-00000003/trainer_state.json"
	ln -sfn step-00000003 "$TD/kb/latest"
	mkdir "$TD/kb/.step-00000004.tmp.2147483646" && touch "$TD/kb/.step-00000004.tmp.2147483646/model.safetensors"
	run -0 --separate-stderr rl-train --out "$TD/kb" --batch 1 --lr 1e-3 --save-every 2 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"removing '$TD/kb/step-00000003': newer than the checkpoint resumed from (step 2)"* ]]
	[ ! -e "$TD/kb/.step-00000004.tmp.2147483646" ]
	[ "$(readlink "$TD/kb/latest")" = step-00000008 ]
	cmp "$TD/ka/step-00000008/model.safetensors" "$TD/kb/step-00000008/model.safetensors"
}

@test "SIGTERM on file input: a full checkpoint at the step boundary, and --resume continues bitwise" {
	rl-train -q -m "$TD/m0" --out "$TD/ta" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/scored.jsonl"
	mkfifo "$TD/fifo"
	# 5 groups then a writer that stays open: the learner waits in a read after step 5
	python3 -c "
import sys, time
sys.stdout.writelines(open(sys.argv[1]).readlines()[:22]); sys.stdout.flush(); time.sleep(60)" \
	    "$TD/scored.jsonl" > "$TD/fifo" 3>&- &
	W=$!
	rl-train -m "$TD/m0" --out "$TD/tb" --batch 1 --lr 1e-3 --metrics /dev/null "$TD/fifo" 3>&- 2> "$TD/tb.err" &
	P=$!
	for i in $(seq 100); do [ -e "$TD/tb/step-00000005" ] && break; sleep 0.1; done
	[ -e "$TD/tb/step-00000005" ]
	# and until it has read records 21 and 22 and waits in a read of the FIFO
	# (under load the signal came before those reads, and nothing was pending)
	for i in $(seq 200); do
		case "$(cat /proc/$P/wchan 2>/dev/null)" in *pipe*) break ;; esac
		sleep 0.05
	done
	kill -TERM $P
	sleep 0.3
	kill $W
	# 128 + SIGTERM: the input was not trained to its end
	st=0; wait $P || st=$?
	[ "$st" -eq 143 ]
	grep -q "stopped by a signal after step 5" "$TD/tb.err"
	[ -f "$TD/tb/step-00000005/optimizer.safetensors" ]
	# the two records of group 5 read before the signal are read again
	grep -q '"records_pending":\[21,22\]' "$TD/tb/step-00000005/trainer_state.json"
	run -0 --separate-stderr rl-train --out "$TD/tb" --batch 1 --lr 1e-3 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"3 steps; "* ]]
	cmp "$TD/ta/step-00000008/model.safetensors" "$TD/tb/step-00000008/model.safetensors"
}

@test "--out holding an earlier run: resumed by default; --fresh refuses it; step directories without a full checkpoint, or a file, are refused before training" {
	rl-train -q -m "$TD/m0" --out "$TD/old" --batch 2 --max-steps 1 --metrics /dev/null "$TD/scored.jsonl"
	[ -f "$TD/old/step-00000001/optimizer.safetensors" ]
	# --fresh (--no-resume): never resumes, never trains over the run
	for f in --fresh --no-resume; do
		run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/old" --batch 2 $f --metrics "$TD/old.jsonl" "$TD/scored.jsonl"
		[[ "$stderr" == *"'$TD/old' already holds 1 step directories of an earlier run (step-00000001, ...)"* ]]
		[[ "$stderr" == *"hint: continue that run with --resume"* ]]
		[ ! -s "$TD/old.jsonl" ]
		[ "$(readlink "$TD/old/latest")" = step-00000001 ]
	done
	# the default (--resume auto): the same command line continues the run
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/old" --batch 2 --max-steps 2 --metrics "$TD/old.jsonl" "$TD/scored.jsonl"
	[[ "$stderr" == *"'$TD/old' holds a run: resuming it from step 1"* ]]
	[ "$(wc -l < "$TD/old.jsonl")" -eq 1 ]
	[ "$(jq -r .step "$TD/old.jsonl")" -eq 2 ]
	[ "$(readlink "$TD/old/latest")" = step-00000002 ]
	# and refuses a change of the algorithm's options, as --resume does
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/old" --batch 2 --lr 0.5 --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"--lr: "*"in the run"* ]]
	# steps of a run killed before its first full checkpoint: named, kept
	rm "$TD"/old/step-*/optimizer.safetensors
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/old" --batch 2 --metrics "$TD/old2.jsonl" "$TD/scored.jsonl"
	[[ "$stderr" == *"'$TD/old' holds 2 step directories (step-00000001 to step-00000002) but no full checkpoint to resume from"* ]]
	[[ "$stderr" == *"hint: a run killed before its first full checkpoint"* ]]
	[ ! -s "$TD/old2.jsonl" ]
	[ -d "$TD/old/step-00000001" ] && [ -d "$TD/old/step-00000002" ]
	# an explicit --resume still says it finds nothing
	run -1 --separate-stderr rl-train --out "$TD/old" --batch 2 --resume --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"no complete training checkpoint"* || "$stderr" == *"cannot resume"* ]]
	# absent --out: a fresh run; no -m and nothing to resume: named
	run -1 --separate-stderr rl-train --out "$TD/none" --batch 2 --metrics /dev/null "$TD/scored.jsonl"
	[[ "$stderr" == *"no model (-m MODEL_DIR) and no checkpoint to resume in --out"* ]]
	echo hi > "$TD/afile"
	run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/afile" --batch 2 --metrics "$TD/af.jsonl" "$TD/scored.jsonl"
	[[ "$stderr" == *"--out '$TD/afile' is not a directory"* ]]
	[ ! -s "$TD/af.jsonl" ]
}

@test "token ids outside the vocabulary, an empty or too long prompt, NaN log-probs and a bad temperature are bad records naming the record; --on-bad skip drops their group" {
	edit "$TD/scored.jsonl" "$TD/oov.jsonl" "if r['id'] == 6: r['response'][0] = 264"
	edit "$TD/scored.jsonl" "$TD/neg.jsonl" "if r['id'] == 6: r['prompt'][0] = -1"
	edit "$TD/scored.jsonl" "$TD/empty.jsonl" "if r['id'] == 6: r['prompt'] = []"
	edit "$TD/scored.jsonl" "$TD/long.jsonl" "if r['id'] == 6: r['prompt'] = [1] * 200"
	edit "$TD/scored.jsonl" "$TD/nanlp.jsonl" "if r['id'] == 6: r['logprobs'][0] = 'nan'"
	edit "$TD/scored.jsonl" "$TD/nanref.jsonl" "r['ref_logprobs'] = [-5.0] * len(r['response'])
if r['id'] == 6: r['ref_logprobs'][1] = 'inf'"
	edit "$TD/scored.jsonl" "$TD/temp.jsonl" "if r['id'] == 6: r['temperature'] = -1"
	for f in oov:"token id 264 at 'response' index 0 is outside the vocabulary (0..263)" \
	    neg:"token id -1 at 'prompt' index 0" empty:"empty 'prompt'" long:"200 prompt + " \
	    nanlp:"'logprobs' holds NaN" nanref:"'ref_logprobs' holds NaN" temp:"'temperature'"; do
		run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/bad-${f%%:*}" --batch 1 --metrics /dev/null "$TD/${f%%:*}.jsonl"
		[[ "$stderr" == *"${f%%:*}.jsonl': record 6 (id 6): ${f#*:}"* ]] || { echo "$f: $stderr"; return 1; }
		run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/skip-${f%%:*}" --batch 1 --on-bad skip --metrics /dev/null "$TD/${f%%:*}.jsonl"
		[[ "$stderr" == *"7 steps; 32 records, 0 duplicates dropped, 1 bad records, 1 groups dropped (bad)"* ]] || { echo "$f: $stderr"; return 1; }
	done
}

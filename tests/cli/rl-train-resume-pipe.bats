#!/usr/bin/env bats
# Resuming the pipe wiring after a stop or a crash:
#   rl-rollout --resume OUT --weights-from OUT P | rl-reward | rl-train --resume --out OUT
# rl-train skips records by group (its checkpoints list the groups done),
# rl-rollout does not generate the groups done and keeps their nonce, and
# neither loads a step directory the killed run left behind.
#
# "Every prompt trained exactly once" is read off the last checkpoint: with
# grpo nothing is dropped, so the groups trained over both runs number
# global_step x --batch; groups_done holding the N prompts' groups, one range
# of N ids under one nonce, with global_step x batch = N, leaves no room for a
# group trained twice or for one lost.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3
	for i in $(seq 64); do echo "{\"prompt\":\"x$i\"}"; done > "$TD/p.jsonl"
}

setup() {
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# slow: the prompt file, one line every 40 ms (a run to stop half way)
slow() {
	python3 -c "
import sys, time
for l in open(sys.argv[1]):
    sys.stdout.write(l); sys.stdout.flush(); time.sleep(0.04)" "$TD/p.jsonl"
}

# pipe OUT ROLLOUT_ARGS TRAIN_ARGS [INPUT]: the wiring, prompts from INPUT (default the file)
pipe() {
	rl-rollout -q -m "$TD/m0" --weights-from "$1" --max-staleness 0 --train-batch 2 -n 4 --max-tokens 2 \
	    --seed 1 --weights-timeout 60 $2 "${4:-$TD/p.jsonl}" \
	  | rl-reward -q --task 'format:^[a-z]' \
	  | rl-train -m "$TD/m0" --out "$1" --batch 2 --save-every 1 --lr 1e-2 --metrics "$1.m" $3
}

# once OUT: every one of the 64 prompts' groups trained exactly once (see the top)
once() {
	python3 - "$1/latest/trainer_state.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
d = s["groups_done"]
assert len(d) == 1, d
lo, hi = map(int, d[0].split("-"))
assert hi - lo + 1 == 64 and lo & 0xffffffff == 0, d
assert s["global_step"] * 2 == 64, s["global_step"]
PY
}

wait_step() {
	for i in $(seq 200); do [ -e "$1/step-0000000$2" ] && return 0; sleep 0.05; done
	return 1
}

@test "SIGTERM to rl-train in the pipe wiring, then --resume of both ends: every group trained once" {
	local O="$TD/t"
	slow | pipe "$O" "" "" - 2> "$O.err" 3>&- &
	PIDS="$!"
	wait_step "$O" 6
	local T
	T=$(pgrep -f "rl-train -m $TD/m0 --out $O " | head -1)
	kill -TERM "$T"
	wait "$PIDS" || true
	grep -q "stopped by a signal after step" "$O.err"
	local s0
	s0=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_step"])' "$O/latest/trainer_state.json")
	[ "$s0" -lt 32 ]
	run -0 --separate-stderr bash -c 'rl-rollout -m "$1/m0" --resume "$2" --weights-from "$2" --max-staleness 0 --train-batch 2 -n 4 \
	    --max-tokens 2 --seed 1 --weights-timeout 60 "$1/p.jsonl" | rl-reward -q --task "format:^[a-z]" \
	  | rl-train --out "$2" --resume --batch 2 --save-every 1 --lr 1e-2 --metrics "$2.m"' _ "$TD" "$O"
	[[ "$stderr" == *"rl-rollout: resuming from '$O/step-"* ]]
	[[ "$stderr" == *"prompts not generated: their groups were done in"* ]]
	# rl-rollout regenerated only groups not done: rl-train skips none
	[[ "$stderr" == *"0 records skipped: their groups were done before --resume"* ]]
	once "$O"
	# the metrics of both runs: one line a step
	[ "$(wc -l < "$O.m")" -eq 32 ]
}

@test "SIGKILL of the whole pipeline, leftover steps newer than the checkpoint: resumed, every group trained once" {
	local O="$TD/k"
	# --save-every 3: the steps between full checkpoints are what a kill leaves behind
	setsid bash -c 'python3 -c "
import sys, time
for l in open(sys.argv[1]):
    sys.stdout.write(l); sys.stdout.flush(); time.sleep(0.06)" "$1/p.jsonl" \
	  | rl-rollout -q -m "$1/m0" --weights-from "$2" --max-staleness 0 --train-batch 2 -n 4 --max-tokens 2 --seed 1 - \
	  | rl-reward -q --task "format:^[a-z]" | rl-train -q -m "$1/m0" --out "$2" --batch 2 --save-every 3 --lr 1e-2 \
	      --metrics /dev/null' _ "$TD" "$O" 3>&- &
	PIDS="$!"
	for i in $(seq 200); do [ -e "$O/step-00000007" ] && break; sleep 0.05; done
	kill -KILL -- "-$PIDS"
	wait "$PIDS" || true
	PIDS=""
	[ -e "$O/step-00000007" ]
	[ ! -e "$O/step-00000032" ]
	# step 7 (or 8: the kill comes 4 prompts, 240 ms, before step 9) has no optimizer state: the resume is from step 6; make the
	# leftover unloadable, so that loading it fails the run, and start rl-train
	# a second late, so rl-rollout sees the leftover before it is removed
	local last
	last=$(readlink "$O/latest")
	[ ! -e "$O/$last/optimizer.safetensors" ]
	for d in "$O"/step-*; do
		[ -e "$d/optimizer.safetensors" ] || echo garbage > "$d/model.safetensors"
	done
	run -0 --separate-stderr bash -c 'rl-rollout -v -m "$1/m0" --resume "$2" --weights-from "$2" --max-staleness 0 --train-batch 2 \
	    -n 4 --max-tokens 2 --seed 1 --weights-timeout 60 "$1/p.jsonl" | rl-reward -q --task "format:^[a-z]" \
	  | (sleep 1; rl-train --out "$2" --resume --batch 2 --save-every 3 --lr 1e-2 --metrics /dev/null)' _ "$TD" "$O"
	[[ "$stderr" == *"rl-rollout: not loading '$O/$last': it was there when rl-rollout started"* ]]
	[[ "$stderr" == *"removing '$O/$last': newer than the checkpoint resumed from"* ]]
	# the step of the same name the resumed trainer wrote is loaded
	[[ "$stderr" == *"weights version $((10#${last#step-})) loaded from '$O/$last'"* ]]
	once "$O"
}

@test "kill -9 of rl-train in the pipe wiring, then the same command line: resumed from the last full checkpoint, every group trained once" {
	local O="$TD/k9"
	# one command line for the start and the restart: rl-rollout --resume and
	# rl-train's default (--resume auto) start fresh on an empty --out and
	# continue it after a crash; full checkpoints by time (--save-minutes)
	cat > "$TD/k9.sh" <<EOF
python3 -c "
import sys, time
for l in open(sys.argv[1]):
    sys.stdout.write(l); sys.stdout.flush(); time.sleep(0.04)" "$TD/p.jsonl" \\
  | rl-rollout -m "$TD/m0" --resume "$O" --weights-from "$O" --max-staleness 0 --train-batch 2 -n 4 \\
      --max-tokens 2 --seed 1 --weights-timeout 60 - \\
  | rl-reward -q --task 'format:^[a-z]' \\
  | rl-train -m "$TD/m0" --out "$O" --batch 2 --save-minutes 0.004 --lr 1e-2 --metrics "$O.m"
EOF
	setsid bash "$TD/k9.sh" 2> "$O.err1" 3>&- &
	PIDS="$!"
	# a full checkpoint, and steps past it
	for i in $(seq 300); do
		ls "$O"/step-*/optimizer.safetensors >/dev/null 2>&1 && [ -e "$O/step-00000009" ] && break
		sleep 0.05
	done
	local T
	T=$(pgrep -f "rl-train -m $TD/m0 --out $O " | head -1)
	kill -KILL "$T"
	wait "$PIDS" || true
	PIDS=""
	grep -q "nothing to resume in '$O'" "$O.err1"
	local full
	full=$(ls -d "$O"/step-*/optimizer.safetensors | tail -1)
	full=${full%/optimizer.safetensors}
	full=$((10#${full##*/step-}))
	[ "$full" -ge 1 ] && [ "$full" -lt 32 ]
	run -0 --separate-stderr bash "$TD/k9.sh"
	[[ "$stderr" == *"rl-train: '$O' holds a run: resuming it from step $full"* ]]
	[[ "$stderr" == *"rl-rollout: resuming from '$O/step-"* ]]
	once "$O"
	# time-based saves happened in the restarted run too
	[ -e "$O/step-00000032/optimizer.safetensors" ]
}

@test "rl-rollout --resume: nothing to resume starts from the first prompt; step directories without a checkpoint, an older rl-train's checkpoint, groups of several nonces: an error naming it" {
	mkdir -p "$TD/empty"
	# an empty or absent DIR: the run's first start (the same command line resumes it later)
	for d in empty nothere; do
		run -0 --separate-stderr rl-rollout -m "$TD/m0" --resume "$TD/$d" --jsonl --max-tokens 1 "$TD/p.jsonl"
		[[ "$stderr" == *"nothing to resume in '$TD/$d' (no step directory): generating from the first prompt"* ]]
		[ "$(wc -l <<< "$output")" -eq 64 ]
	done
	run -1 --separate-stderr rl-rollout --resume "$TD/empty" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"no model"* ]]
	# step directories without any full checkpoint: refused
	mkdir -p "$TD/nofull/step-00000002"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --resume "$TD/nofull" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"rl-rollout: cannot resume: no complete training checkpoint in '$TD/nofull'"* ]]
	[[ "$stderr" == *"hint:"* ]]
	[ -z "$output" ]
	# a finished run's checkpoint, edited
	local O="$TD/n"
	pipe "$O" "" "-q" 2>/dev/null
	once "$O"
	local st="$O/latest/trainer_state.json"
	cp "$st" "$TD/st.json"
	python3 - "$st" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p))
lo = int(s["groups_done"][0].split("-")[0])
s["groups_done"].append(str(lo + (5 << 32)))
open(p, "w").write(json.dumps(s))
PY
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --resume "$O" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"trainer_state.json': groups_done: groups of several rl-rollout runs (nonces 0x"* ]]
	[ -z "$output" ]
	python3 - "$st" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p)); del s["groups_done"]
open(p, "w").write(json.dumps(s))
PY
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --resume "$O" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"groups_done: missing (written by an older rl-train)"* ]]
	# usage errors: with --queue or --score
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --resume "$O" --queue tcp://127.0.0.1:1 "$TD/p.jsonl"
	[[ "$stderr" == *"--resume continues a prompt file's run"* ]]
	# the finished run resumed: nothing generated, -m from the checkpoint
	cp "$TD/st.json" "$st"
	run -0 --separate-stderr rl-rollout --resume "$O" --jsonl "$TD/p.jsonl"
	[ -z "$output" ]
	[[ "$stderr" == *"64 prompts not generated"* ]]
	# an empty set of groups done (a checkpoint before any group): a new nonce, all generated
	python3 - "$st" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p)); s["groups_done"] = []
open(p, "w").write(json.dumps(s))
PY
	run -0 --separate-stderr rl-rollout --resume "$O" --jsonl --max-tokens 1 "$TD/p.jsonl"
	[ "$(wc -l <<< "$output")" -eq 64 ]
	[[ "$output" == *'"version":[32,32]'* || "$output" == *'"version": [32, 32]'* ]]
}

@test "--weights-from a run without any full checkpoint: its steps are a live trainer's, loaded at once" {
	# a running trainer with the default --save-every has only weights-only
	# steps: none of them is a leftover (no --resume can start there)
	pipe "$TD/live" "" "--max-steps 3" 2>/dev/null || true
	[ -e "$TD/live/step-00000003" ]
	rm -f "$TD"/live/step-*/optimizer.safetensors "$TD"/live/step-*/trainer_state.json
	head -1 "$TD/p.jsonl" > "$TD/one.jsonl"
	rl-rollout -q -m "$TD/m0" --weights-from "$TD/live" --jsonl -n 1 --max-tokens 2 "$TD/one.jsonl" > "$TD/one.out"
	[ "$(jq -c .version "$TD/one.out")" = "[3,3]" ]
}

@test "--weights-from: a generator that outlives its trainer follows DIR back when a resumed rl-train rewinds it" {
	pipe "$TD/rw" "" "--max-steps 2" 2>/dev/null || true
	[ -e "$TD/rw/step-00000002/trainer_state.json" ]
	# a slow prompt stream (30 s at most; ended below once seen): the generator runs on while DIR changes
	mkfifo "$TD/rw.fifo"
	python3 -c "
import sys, time
for i in range(300):
    sys.stdout.write('{\"prompt\":\"y%d\"}\n' % i); sys.stdout.flush(); time.sleep(0.1)" > "$TD/rw.fifo" &
	W=$!
	PIDS="$PIDS $W"
	rl-rollout -m "$TD/m0" --weights-from "$TD/rw" --jsonl -n 1 --max-tokens 2 --slots 1 "$TD/rw.fifo" \
	    > "$TD/rw.out" 2> "$TD/rw.err" &
	G=$!
	PIDS="$PIDS $G"
	for i in $(seq 100); do grep -q '"version":\[2,2\]' "$TD/rw.out" && break; sleep 0.1; done
	# the trainer's step 3 appears (what a run killed before its next full checkpoint leaves) ...
	cp -r "$TD/rw/step-00000002" "$TD/rw/step-00000003"
	rm "$TD/rw/step-00000003/optimizer.safetensors" "$TD/rw/step-00000003/trainer_state.json"
	ln -sfn step-00000003 "$TD/rw/latest"
	for i in $(seq 150); do grep -q '"version":\[3,3\]' "$TD/rw.out" && break; sleep 0.1; done
	grep -q '"version":\[3,3\]' "$TD/rw.out"
	# ... and a resumed rl-train removes it and points latest back at step 2
	rm -r "$TD/rw/step-00000003"
	ln -sfn step-00000002 "$TD/rw/latest"
	for i in $(seq 150); do grep -q "went back to version 2" "$TD/rw.err" && break; sleep 0.1; done
	sleep 1
	kill $W 2>/dev/null || true
	wait $G
	grep -q "went back to version 2 (a resumed trainer): replacing weights version 3" "$TD/rw.err"
	# records of version 2, 3, then 2 again
	jq -c .version "$TD/rw.out" | uniq | tr '\n' ' ' > "$TD/rw.v"
	[[ "$(cat "$TD/rw.v")" == '[2,2] [3,3] [2,2] ' ]]
}

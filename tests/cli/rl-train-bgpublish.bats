#!/usr/bin/env bats
# Background publishing (docs/train.md, "Publishing in the background"): a
# step without a full checkpoint copies its weights and a thread writes
# OUT/step-N and pushes it to --sync while the next step computes.  The
# versions must be the ones --publish-inline writes, byte for byte, in
# order; the last one is out when rl-train returns; one that cannot be
# written stops the run with exit 1 naming it.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 3 64
	for i in $(seq 40); do echo "{\"prompt\":\"$i+$i=\",\"answer\":\"$((i + i))\"}"; done > "$TD/prompts.jsonl"
	rl-rollout -q -m "$TD/m0" -n 4 --max-tokens 3 --seed 1 "$TD/prompts.jsonl" \
	  | rl-reward -q --jsonl --task 'format:^[0-9]' > "$TD/s.jsonl"
	# by group: fed a few lines at a time, each group whole (a group is
	# complete when its last sample came)
	jq -c -s 'sort_by(.group)[]' "$TD/s.jsonl" > "$TD/sorted.jsonl"
}

TR="--batch 2 --lr 1e-3 --keep 0 --no-skip-zero-adv"

setup() {
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

@test "background and --publish-inline write the same versions, in order, to OUT and to --sync" {
	run -0 --separate-stderr rl-train -v -m "$TD/m0" --out "$TD/bg" --sync "$TD/bgw" $TR --max-steps 6 \
	    --metrics "$TD/bg.jsonl" "$TD/s.jsonl"
	# versions 2..5 in the background, 1 (the first full checkpoint) and 6 (the last) in place
	order=$(grep -o "published version [0-9]* in '[^']*' ([a-z ]*)" <<< "$stderr" | awk '{ print $3 ":" $NF }' | tr -d ')' | tr '\n' ' ')
	[ "$order" = "1:optimizer 2:background 3:background 4:background 5:background 6:optimizer " ] || { echo "$stderr"; return 1; }
	run -0 rl-train -q -m "$TD/m0" --out "$TD/in" --sync "$TD/inw" $TR --max-steps 6 --publish-inline \
	    --metrics "$TD/in.jsonl" "$TD/s.jsonl"
	for i in 1 2 3 4 5 6; do
		cmp "$TD/bg/step-0000000$i/model.safetensors" "$TD/in/step-0000000$i/model.safetensors"
		cmp "$TD/bg/step-0000000$i/config.json" "$TD/in/step-0000000$i/config.json"
	done
	[ "$(readlink "$TD/bg/latest")" = step-00000006 ]
	[ "$(ls "$TD/bgw" | tr '\n' ' ')" = "$(ls "$TD/inw" | tr '\n' ' ')" ]
	for v in $(ls "$TD/bgw" | grep '^v'); do
		cmp "$TD/bgw/$v/model.safetensors" "$TD/inw/$v/model.safetensors"
	done
	# the time each step waited for publishing is in the metrics, and with it the run's clock
	[ "$(jq -s -c 'map(has("timing_s/publish") and has("timing_s/elapsed")) | all' "$TD/bg.jsonl")" = true ]
	[ "$(jq -s -c '[.[]."timing_s/elapsed"] | . == sort' "$TD/bg.jsonl")" = true ]
}

@test "the last version is on disk, with its optimizer state, when the input ends on a background step" {
	# no --max-steps: the input's end makes the last step; its version was
	# written in the background, then completed in place
	run -0 --separate-stderr rl-train -v -m "$TD/m0" --out "$TD/end" $TR --save-minutes 0 --metrics "$TD/end.jsonl" \
	    "$TD/s.jsonl"
	last=$(readlink "$TD/end/latest")
	n=$((10#${last#step-}))
	[ "$n" -gt 2 ] && [ "$(jq -s 'map(.step) | max' "$TD/end.jsonl")" = "$n" ]
	[[ "$stderr" == *"published version $n in '$TD/end/$last' (in the background)"* ]] || { echo "$stderr"; return 1; }
	[ -f "$TD/end/$last/model.safetensors" ] && [ -f "$TD/end/$last/optimizer.safetensors" ]
	jq -e .records_consumed "$TD/end/$last/trainer_state.json"
}

@test "a version that cannot be written in the background stops the run with exit 1 naming it" {
	local O="$TD/fail"
	mkfifo "$TD/fifo"
	rl-train -m "$TD/m0" --out "$O" $TR --max-steps 6 --metrics "$TD/fail.jsonl" "$TD/fifo" 2> "$TD/fail.err" &
	local pid=$!
	exec 5> "$TD/fifo"
	head -n 16 "$TD/sorted.jsonl" >&5   # two steps of 2 groups of 4
	for i in $(seq 300); do [ -d "$O/step-00000002" ] && break; sleep 0.1; done
	# a file where step 3's directory goes: its rename fails in the thread
	touch "$O/step-00000003"
	tail -n +17 "$TD/sorted.jsonl" >&5 || true   # a trainer that stopped closes the pipe
	exec 5>&-
	local rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 1 ] || { echo "status $rc"; cat "$TD/fail.err"; return 1; }
	grep -q "cannot save to '$O/step-00000003'" "$TD/fail.err"
	grep -q "version 3 was not published (written in the background): the run stops" "$TD/fail.err"
	# found at step 4's save: no step after 3 was reported
	[ "$(jq -s -c 'map(.step)' "$TD/fail.jsonl")" = "[1,2,3]" ]
	[ ! -e "$O/step-00000004" ]
}

@test "--publish-inline reports the same failure at the step itself" {
	local O="$TD/failin"
	mkfifo "$TD/fifo2"
	rl-train -m "$TD/m0" --out "$O" $TR --max-steps 6 --publish-inline --metrics "$TD/failin.jsonl" "$TD/fifo2" \
	    2> "$TD/failin.err" &
	local pid=$!
	exec 5> "$TD/fifo2"
	head -n 16 "$TD/sorted.jsonl" >&5
	for i in $(seq 300); do [ -d "$O/step-00000002" ] && break; sleep 0.1; done
	touch "$O/step-00000003"
	tail -n +17 "$TD/sorted.jsonl" >&5 || true   # a trainer that stopped closes the pipe
	exec 5>&-
	local rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 1 ] || { echo "status $rc"; cat "$TD/failin.err"; return 1; }
	grep -q "cannot save to '$O/step-00000003'" "$TD/failin.err"
	! grep -q "background" "$TD/failin.err"
	[ "$(jq -s -c 'map(.step)' "$TD/failin.jsonl")" = "[1,2]" ]
}

@test "queue wiring at K 0 with background publishing: the generator waits for each version the broker counts; nothing is stale" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' \
	    rl-queue serve -q -l tcp://127.0.0.1:@PORT@ --max-staleness 0 -b 2 -t 30
	local URL="tcp://127.0.0.1:$DPORT" O="$TD/qk0"
	head -n 24 "$TD/prompts.jsonl" | rl-queue put -q "$URL"
	mkdir -p "$O"
	rl-rollout -v -m "$TD/m0" -n 2 --max-tokens 3 --train-batch 2 --queue "$URL" --weights-from "$O" \
	    --weights-timeout 60 2> "$TD/qk0-rollout.log" &
	PIDS="$PIDS $!"
	rl-reward -q --task 'format:^[0-9]' --queue "$URL" &
	PIDS="$PIDS $!"
	run -0 --separate-stderr timeout -k 20 60 rl-train -v -m "$TD/m0" --out "$O" $TR --max-steps 8 --queue "$URL" \
	    --metrics "$TD/qk0.jsonl"
	# versions 2..7 were written in the background
	[ "$(grep -c "in the background" <<< "$stderr")" = 6 ] || { echo "$stderr"; return 1; }
	[ "$(jq -s -c 'map(.step)' "$TD/qk0.jsonl")" = "[1,2,3,4,5,6,7,8]" ]
	[ "$(jq -s -c 'map(."staleness/max") | max' "$TD/qk0.jsonl")" = 0 ]
	[ "$(jq -s -c 'map(has("timing_s/ack")) | all' "$TD/qk0.jsonl")" = true ]
	rl-queue stat --json "$URL" > "$TD/qk0.stat"
	jq -e '.total.stale_dropped == 0 and .version == 8' "$TD/qk0.stat"
	for v in 1 2 3 4 5 6 7; do grep -q "weights version $v loaded" "$TD/qk0-rollout.log"; done
}

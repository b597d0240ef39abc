#!/usr/bin/env bats
# rl-train --skip-zero-adv (docs/train.md): sequences whose advantages are
# all 0 are not run through the model, and the update stays the one of
# --no-skip-zero-adv (fp32 summation order apart):
# - the weights after 3 steps equal those of --no-skip-zero-adv for several
#   algorithms, aggregations, mini-batches, epochs, micro-batches, weight
#   decay; with 2 and 3 ranks (ZeRO-1 too), in queue mode and across --resume;
# - actor/skipped_seq_frac and actor/skipped_token_frac report the shares of
#   a hand-made batch (tests/fixtures/train/zeroadv.py);
# - a step with nothing to train still takes its AdamW step;
# - with ppo, a KL loss term or an entropy bonus it is off by default and an
#   explicit --skip-zero-adv is a usage error.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# 12 groups of 4: per step of 4 groups, 3, 3 and 2 groups with all-equal rewards
	python3 tests/fixtures/train/mkscored.py 12 4 0 | python3 tests/fixtures/train/zeroadv.py > "$TD/z.jsonl"
	# step 1 as above, step 2 with nothing to train
	python3 tests/fixtures/train/mkscored.py 8 4 3 | python3 tests/fixtures/train/zeroadv.py --all-from 4 > "$TD/flat.jsonl"
}

setup() {
	export RL_COMM_TIMEOUT=60
	PIDS=""
	PORT=$(free_port)   # rank 0's rendezvous port
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# Tolerance as in rl-train-dp.bats: fp32 sums in another order change the
# gradients by ~1e-7 relative, and AdamW turns gradients that are rounding
# noise (k_proj.bias: exactly 0 in exact arithmetic) into lr-sized steps;
# measured max |diff| 2e-7 to 2.3e-6 at lr 1e-2 over 3-6 updates.  Getting
# the normalisation wrong (token-mean over the trained tokens only) is off by
# 4.5e-3 (grpo) to 2.4e-2 (2 epochs x 2 mini-batches): measured with that bug
# put in on purpose.
close() { python3 tests/fixtures/parallel/st_close.py "$1" "$2" "${3:-2e-5}" "${4:-1e-4}"; }
# frac KEY METRICS: KEY's value on every line
frac() { sed -n "s|.*\"$1\":\([-0-9.e]*\).*|\1|p" "$2"; }

# train OUT ARGS...: 3 steps on z.jsonl, metrics in OUT.m
train() {
	local out=$1; shift
	rl-train -q -m "$TD/m0" --out "$out" --batch 4 --lr 1e-2 --metrics "$out.m" "$@" "$TD/z.jsonl"
}

@test "the weights with skipping equal those without: algorithms, aggregations, mini-batches, epochs, micro-batches" {
	local nth=0
	for cfg in "--algo grpo" "--algo grpo --ppo-epochs 2 --mini-batches 2" "--algo dr-grpo --mini-batches 3" \
	    "--algo rloo --loss-agg seq-mean-token-mean --max-tokens-per-micro 40" \
	    "--algo grpo --loss-agg seq-mean-token-sum --weight-decay 0.1" \
	    "--algo grpo --old-from-behaviour --tis-cap 2 --mini-batches 2" "--algo grpo --kl k3 --kl-in-reward" \
	    "--algo grpo --recompute --mini-batches 2 --max-tokens-per-micro 40"; do
		nth=$((nth + 1))
		train "$TD/s$nth" $cfg --skip-zero-adv
		train "$TD/n$nth" $cfg --no-skip-zero-adv
		[ "$(readlink "$TD/s$nth/latest")" = "$(readlink "$TD/n$nth/latest")" ]
		run -0 close "$TD/s$nth/latest/model.safetensors" "$TD/n$nth/latest/model.safetensors"
		run -0 close "$TD/s$nth/latest/optimizer.safetensors" "$TD/n$nth/latest/optimizer.safetensors" 1e-7 1e-2
		# pg_loss and grad_norm are unchanged; the skip really happened
		[ "$(frac actor/grad_norm "$TD/s$nth.m" | cut -c1-6)" = "$(frac actor/grad_norm "$TD/n$nth.m" | cut -c1-6)" ]
		[ "$(frac actor/skipped_seq_frac "$TD/n$nth.m" | sort -u)" = 0 ]
		[ "$(frac actor/skipped_seq_frac "$TD/s$nth.m" | head -n 1)" = 0.75 ]
	done
	# the weights did move
	! close "$TD/s1/latest/model.safetensors" "$TD/m0/model.safetensors" || false
	# the default is on: bitwise the explicit option's
	train "$TD/d1" --algo grpo
	cmp "$TD/d1/latest/model.safetensors" "$TD/s1/latest/model.safetensors"
}

@test "actor/skipped_seq_frac and actor/skipped_token_frac report the shares of a hand-made batch" {
	train "$TD/fr"
	python3 tests/fixtures/train/zeroadv.py --expect 4 < "$TD/z.jsonl" > "$TD/expect"
	[ "$(cut -d' ' -f1 "$TD/expect" | tr '\n' ' ')" = "0.750000 0.750000 0.500000 " ]
	paste -d' ' <(frac actor/skipped_seq_frac "$TD/fr.m") <(frac actor/skipped_token_frac "$TD/fr.m") > "$TD/got"
	[ "$(wc -l < "$TD/got")" -eq 3 ]
	awk 'NR == FNR { s[FNR] = $1; t[FNR] = $2; next }
	    { if ((s[FNR] - $1)^2 > 1e-12 || (t[FNR] - $2)^2 > 1e-12) { print "step " FNR ": " s[FNR] " " t[FNR] " vs " $0; exit 1 } }' \
	    "$TD/got" "$TD/expect"
	# dapo drops the groups without signal before any of this: nothing left to skip
	train "$TD/dapo" --algo dapo
	[ "$(frac actor/skipped_seq_frac "$TD/dapo.m" | sort -u)" = 0 ]
}

@test "a step with nothing to train still takes its AdamW step (weight decay and moments move the weights)" {
	for s in skip no-skip; do
		rl-train -q -m "$TD/m0" --out "$TD/flat-$s" --batch 4 --lr 1e-2 --weight-decay 0.1 --keep 0 \
		    --save-every 1 --metrics "$TD/flat-$s.m" --$s-zero-adv "$TD/flat.jsonl"
	done
	[ "$(sed -n 2p "$TD/flat-skip.m" | grep -o '"actor/skipped_seq_frac":1,"actor/skipped_token_frac":1,')" ]
	# step 2: zero gradient, no trained token (the token means are null: nothing was measured)
	sed -n 2p "$TD/flat-skip.m" | grep -q '"actor/entropy":null,"actor/grad_norm":0,'
	[ "$(readlink "$TD/flat-skip/latest")" = step-00000002 ]
	! cmp -s "$TD/flat-skip/step-00000001/model.safetensors" "$TD/flat-skip/step-00000002/model.safetensors" || false
	run -0 close "$TD/flat-skip/step-00000002/model.safetensors" "$TD/flat-no-skip/step-00000002/model.safetensors"
	run -0 close "$TD/flat-skip/step-00000002/optimizer.safetensors" "$TD/flat-no-skip/step-00000002/optimizer.safetensors" 1e-7 1e-2
}

@test "ppo, a KL loss term and an entropy bonus: off by default, an explicit --skip-zero-adv is a usage error" {
	for args in "--algo ppo" "--kl k1 --ref $TD/m0" "--ent-coef 0.01"; do
		run -2 --separate-stderr rl-train -m "$TD/m0" --out "$TD/x" --skip-zero-adv $args "$TD/z.jsonl"
		[[ "$stderr" == *"--skip-zero-adv would change the update"* ]]
		train "$TD/auto" $args --max-steps 1 --keep 0
		[ "$(frac actor/skipped_seq_frac "$TD/auto.m")" = 0 ]
		rm -rf "$TD/auto"
	done
	# the KL as a reward penalty is fine (the advantages carry it)
	run -0 train "$TD/klrew" --kl k1 --kl-in-reward --skip-zero-adv --max-steps 1
}

@test "resume: 2 steps + --resume + 1 step with skipping is bitwise 3 steps" {
	train "$TD/r3" --max-steps 3
	train "$TD/r2" --max-steps 2
	rl-train -q --out "$TD/r2" --batch 4 --lr 1e-2 --max-steps 3 --resume --metrics /dev/null "$TD/z.jsonl"
	cmp "$TD/r3/step-00000003/model.safetensors" "$TD/r2/step-00000003/model.safetensors"
	cmp "$TD/r3/step-00000003/optimizer.safetensors" "$TD/r2/step-00000003/optimizer.safetensors"
}


@test "2 ranks, and 3 ranks with --zero 1, skipping: the weights of 1 rank without" {
	args=(--batch 4 --lr 1e-2 --mini-batches 2 --dp-check-every 1)
	TRAIN_WORLD_DATA=$TD/z.jsonl  # train_world: model_helper.bash
	rl-train -q -m "$TD/m0" --out "$TD/one" --no-skip-zero-adv --metrics /dev/null "${args[@]}" "$TD/z.jsonl"
	train_world 2 "$TD/two" "${args[@]}"
	PORT=$(free_port)
	train_world 3 "$TD/three" "${args[@]}" --zero 1
	run -0 close "$TD/two/latest/model.safetensors" "$TD/one/latest/model.safetensors"
	run -0 close "$TD/three/latest/model.safetensors" "$TD/one/latest/model.safetensors"
	# ZeRO's AdamW state is saved per rank: put together (rl-train-reshard.bats)
	python3 tests/fixtures/parallel/opt_gather.py "$TD/three/latest" "$TD/three.opt"
	run -0 close "$TD/three.opt" "$TD/one/latest/optimizer.safetensors" 1e-7 1e-2
	# rank 0 reports the whole step's shares
	[ "$(frac actor/skipped_seq_frac "$TD/three.metrics.0" | tr '\n' ' ')" = "0.75 0.75 0.5 " ]
}

@test "queue mode: skipping trains the weights of the same groups from a file without" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -k 100 -l tcp://127.0.0.1:@PORT@ -t 30
	local url="tcp://127.0.0.1:$DPORT"
	rl-queue put -q -s scored "$url" "$TD/z.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/q" --batch 4 --lr 1e-2 --queue "$url" --idle-exit 1 --metrics "$TD/q.m"
	train "$TD/qn" --no-skip-zero-adv
	[ "$(frac actor/skipped_seq_frac "$TD/q.m" | tr '\n' ' ')" = "0.75 0.75 0.5 " ]
	run -0 close "$TD/q/latest/model.safetensors" "$TD/qn/latest/model.safetensors"
}

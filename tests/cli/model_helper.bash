# tests/cli/model_helper.bash — the tiny models the bats files train and
# generate with (random weights, the bytes tokenizer).

# toy_model DIR [SEED] [MAX_POS]: DIR/cfg.json, a one-layer Qwen2 of 261
# byte-level tokens (MAX_POS positions, default 32), and DIR/m0 from it
# (rl-train --init with --seed SEED when one is given)
toy_model() {
	cat > "$1/cfg.json" <<JSON
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":64,"max_position_embeddings":${3:-32},"torch_dtype":"float32"}
JSON
	rl-train -q --init "$1/cfg.json" --tokenizer bytes --out "$1/m0" ${2:+--seed "$2"}
}

# train_model DIR: DIR/cfg.json, the two-layer Qwen2 (GQA, tied embeddings)
# of the rl-train files, and DIR/m0 from it (seed 1)
train_model() {
	cat > "$1/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":264,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":64,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32"}
JSON
	rl-train -q --init "$1/cfg.json" --tokenizer bytes --out "$1/m0" --seed 1
}

# deep_model DIR: DIR/m0, a tied Qwen2 of 8 layers (hidden 64, about 2 MB)
# from seed 1, each layer small next to a rank's shard (the ZeRO-2/3 memory
# and unit-by-unit tests); its config in DIR/cfg.json
deep_model() {
	mkdir -p "$1"
	cat > "$1/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":264,"hidden_size":64,"num_hidden_layers":8,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":256,"max_position_embeddings":64,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32"}
JSON
	rl-train -q --init "$1/cfg.json" --tokenizer bytes --out "$1/m0" --seed 1
}

# train_world N OUT ARGS...: N ranks of rl-train -m $TD/m0 on $TRAIN_WORLD_DATA
# (default $TD/s.jsonl), rendezvous at 127.0.0.1:$PORT, rank r's metrics in
# OUT.metrics.r; waits for all; fails if any fails.  A rank 0 that cannot
# listen on PORT (taken between free_port and its listen: nothing has been
# trained or written yet) ends the world, which starts again on another port
# (free_port: port_helper.bash).
train_world() {
	local n=$1 out=$2; shift 2
	local pids r rc p try
	for try in 1 2 3; do
		pids=""; rc=0
		for r in $(seq 1 $((n - 1))); do
			rl-train -q -m "$TD/m0" --out "$out" --rank "$r" --world "$n" --rendezvous "127.0.0.1:$PORT" \
			    --metrics "$out.metrics.$r" "$@" "${TRAIN_WORLD_DATA:-$TD/s.jsonl}" 3>&- 2>"$out.err.$r" &
			pids="$pids $!"
		done
		PIDS="$PIDS $pids"
		rl-train -q -m "$TD/m0" --out "$out" --rank 0 --world "$n" --rendezvous "127.0.0.1:$PORT" \
		    --metrics "$out.metrics.0" "$@" "${TRAIN_WORLD_DATA:-$TD/s.jsonl}" 2>"$out.err.0" || rc=1
		if [ $rc = 1 ] && [ $try -lt 3 ] && grep -q "rank 0 cannot listen on" "$out.err.0"; then
			for p in $pids; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
			PORT=$(free_port)
			continue
		fi
		for p in $pids; do wait "$p" || rc=1; done
		[ $rc = 0 ] || { cat "$out".err.*; return 1; }
		return 0
	done
}

# verl_cases EXPECTED RECORDS FILTER: rl-train's first step on RECORDS for every
# case of EXPECTED (JSON lines: "args", then the metrics verl's definitions
# give) whose args match the grep -E pattern FILTER ('' : all), with $TD/m0
# ($TD/m0-ppo for --algo ppo: it has a value head); prints each metric that
# differs (1e-5 + 1e-4 relative) and the number of cases, which it leaves in
# VERL_CASES; returns 1 when a case failed or differed.
verl_cases() {
	local exp=$1 rec=$2 filter=$3 i=0 n=0 fail=0 args m line
	while IFS= read -r line; do
		i=$((i + 1))
		args=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["args"])' "$line")
		grep -Eq -- "$filter" <<< "$args" || continue
		n=$((n + 1))
		m="$TD/m0"
		[[ "$args" == *"--algo ppo"* ]] && m="$TD/m0-ppo"
		# shellcheck disable=SC2086
		rl-train -q -m "$m" --out "$TD/c$i.$BATS_TEST_NUMBER" --batch 4 --max-steps 1 --lr 1e-3 --grad-clip 1e9 \
		    --metrics "$TD/c$i.$BATS_TEST_NUMBER.json" $args "$rec" || { echo "case $i ($args): exit $?"; fail=1; continue; }
		python3 - "$line" "$TD/c$i.$BATS_TEST_NUMBER.json" <<'PY' || fail=1
import json, sys
want = json.loads(sys.argv[1])
got = json.loads(open(sys.argv[2]).read())
bad = 0
for k, v in want.items():
    if k == "args":
        continue
    g = got.get(k)
    if g is None or abs(g - v) > 1e-5 + 1e-4 * abs(v):
        print("%s: %s: want %.9g, got %s" % (want["args"], k, v, g))
        bad = 1
sys.exit(bad)
PY
	done < "$exp"
	echo "$n cases"
	VERL_CASES=$n
	[ "$fail" -eq 0 ]
}

# word_pairs N: N preference pairs of random words (seed 3), TRL's
# prompt/chosen/rejected text lines, on stdout
word_pairs() {
	python3 - "$1" <<'PY'
import json, random, sys
random.seed(3)
w = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
for i in range(int(sys.argv[1])):
    print(json.dumps({"prompt": " ".join(random.choice(w) for _ in range(3)) + ":",
                      "chosen": " " + " ".join(random.choice(w) for _ in range(2)),
                      "rejected": " " + " ".join(random.choice(w) for _ in range(3))}))
PY
}

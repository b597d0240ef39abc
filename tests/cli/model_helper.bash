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

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

#!/usr/bin/env bats
# Loading a model directory: config.json checked against the safetensors header
# before anything is allocated from it, non-regular files refused before they are
# opened, a hub id or an unsupported model_type / rope scaling answered clearly.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD"
	printf '%s\n' '{"prompt":"12+34="}' > "$TD/p.jsonl"
}

# copy of the toy model with config.json edited by the python expression $2 on c
edited() {
	rm -rf "$TD/$1"; cp -r "$TD/m0" "$TD/$1"
	python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))' \
	    "$TD/$1/config.json" "$2"
}

# rl-rollout on model dir $1, bounded in time and memory (4 GB of address space)
gen() { run bash -c 'ulimit -v 4000000; exec timeout -k 20 20 rl-rollout -q -m "$1" --max-tokens 2 "$2"' _ "$1" "$TD/p.jsonl"; }

@test "hidden_size far larger than the file's tensors: a shape error from the header, no allocation" {
	edited big 'c["hidden_size"]=8192'
	run /usr/bin/time -f "maxrss %M" timeout -k 20 20 rl-rollout -q -m "$TD/big" --max-tokens 2 "$TD/p.jsonl"
	[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
	# rl-rollout's own ~220 MB, not the ~1 GB of weights its config.json describes
	rss=$(sed -n 's/^maxrss //p' <<<"$output")
	[ "$rss" -lt 500000 ] || { echo "$output"; false; }
	[[ "$output" == *"model.safetensors"*"embed_tokens.weight"*"[261, 32]"*"[261, 8192]"* ]] || { echo "$output"; false; }
	[[ "$output" != *"out of memory"* ]]
}

@test "300000 layers, a vocabulary of 2^31-1, hidden_size 1e9: refused quickly, naming the file" {
	edited layers 'c["num_hidden_layers"]=300000'
	SECONDS=0
	gen "$TD/layers"
	[ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ $SECONDS -lt 5 ]
	[[ "$output" == *"num_hidden_layers"*"300000"*"model.safetensors"* ]] || { echo "$output"; false; }
	edited vocab 'c["vocab_size"]=2**31-1'
	gen "$TD/vocab"
	[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
	[[ "$output" == *"model.safetensors"*"embed_tokens.weight"* ]] || { echo "$output"; false; }
	[[ "$output" != *"out of memory"* ]]
	edited hid 'c["hidden_size"]=10**9; c["head_dim"]=16'
	gen "$TD/hid"
	[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
	[[ "$output" == *"model.safetensors"*"embed_tokens.weight"* ]] || { echo "$output"; false; }
	[[ "$output" != *"out of memory"* ]]
}

@test "a FIFO or a directory at config.json, model.safetensors or a tokenizer file is refused, not waited on" {
	for f in config.json model.safetensors; do
		rm -rf "$TD/ff"; cp -r "$TD/m0" "$TD/ff"; rm "$TD/ff/$f"; mkfifo "$TD/ff/$f"
		gen "$TD/ff"
		[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
		[[ "$output" == *"'$TD/ff/$f'"*"not a regular file"* ]] || { echo "$output"; false; }
		rm "$TD/ff/$f"; mkdir "$TD/ff/$f"
		gen "$TD/ff"
		[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
		[[ "$output" == *"'$TD/ff/$f'"*"not a regular file"* ]] || { echo "$output"; false; }
	done
	rm -rf "$TD/ff"; cp -r "$TD/m0" "$TD/ff"; rm "$TD/ff/tokenizer.json"; mkfifo "$TD/ff/tokenizer.json"
	gen "$TD/ff"
	[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
	[[ "$output" == *"'$TD/ff/tokenizer.json'"*"not a regular file"* ]] || { echo "$output"; false; }
	rm "$TD/ff/tokenizer.json"; cp "$TD/m0/tokenizer.json" "$TD/ff/"; mkfifo "$TD/ff/tokenizer_config.json"
	gen "$TD/ff"
	[ "$status" -ne 124 ] && [ "$status" -ne 0 ]
	[[ "$output" == *"'$TD/ff/tokenizer_config.json'"*"not a regular file"* ]] || { echo "$output"; false; }
	# generation_config.json is optional: a warning, and generation goes on
	rm "$TD/ff/tokenizer_config.json"; mkfifo "$TD/ff/generation_config.json"
	run timeout -k 20 20 rl-rollout -m "$TD/ff" --max-tokens 2 -o /dev/null "$TD/p.jsonl"
	[ "$status" -eq 0 ]
	[[ "$output" == *"'$TD/ff/generation_config.json' is not a regular file"* ]] || { echo "$output"; false; }
}

@test "-m ORG/NAME that does not exist: only local directories are read, and how to download" {
	cd "$TD"
	run rl-rollout -m Qwen/Qwen2.5-0.5B-Instruct p.jsonl
	[ "$status" -ne 0 ]
	[[ "$output" == *"'Qwen/Qwen2.5-0.5B-Instruct': no such directory; models are read from local directories only"* ]]
	[[ "$output" == *"huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR"* ]]
	[[ "$output" == *"hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR"* ]]
	run rl-train -m Qwen/Qwen2.5-0.5B-Instruct --algo sft --out o p.jsonl
	[ "$status" -ne 0 ]
	[[ "$output" == *"huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"* ]]
	# a missing local path is not taken for one
	run rl-rollout -m ./nothing/here p.jsonl
	[ "$status" -ne 0 ]
	[[ "$output" != *"huggingface-cli"* ]]
}

@test "an unsupported model_type or rope scaling names what is supported" {
	for mt in gemma2 qwen3_moe deepseek_v3; do
		edited mt 'c["model_type"]="'$mt'"'
		gen "$TD/mt"
		[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
		[[ "$output" == *"model_type '$mt' is not supported"* ]] || { echo "$output"; false; }
		[[ "$output" == *"supported: llama, qwen2, qwen3"*"gpt2"* ]] || { echo "$output"; false; }
	done
	for rt in yarn linear dynamic longrope; do
		edited rs 'c["rope_scaling"]={"rope_type":"'$rt'","factor":4.0,"original_max_position_embeddings":32}'
		gen "$TD/rs"
		[ "$status" -ne 0 ] && [ "$status" -ne 124 ]
		[[ "$output" == *"rope_scaling with rope_type '$rt' is not supported"* ]] || { echo "$output"; false; }
		[[ "$output" == *'"default"'*'"llama3"'* ]] || { echo "$output"; false; }
	done
}

@test "Mistral: generation and prompts past sliding_window on the CPU; config.json written back as read" {
	cat > "$TD/mcfg.json" <<'JSON'
{"model_type":"mistral","vocab_size":261,"hidden_size":32,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":64,"max_position_embeddings":64,"sliding_window":16,"torch_dtype":"float32"}
JSON
	rl-train -q --init "$TD/mcfg.json" --tokenizer bytes --out "$TD/mi"
	run jq -c '[.model_type, .max_position_embeddings, .sliding_window, .architectures[0]]' "$TD/mi/config.json"
	assert_output '["mistral",64,16,"MistralForCausalLM"]'
	printf '%s\n' '{"prompt":"12+34="}' > "$TD/short.jsonl"
	printf '%s\n' '{"prompt":"0123456789abcdefghij"}' > "$TD/long.jsonl"
	# 6 prompt tokens and up to 40 generated: past the window of 16 (this model's EOS comes
	# at 27), within the 64 positions
	run rl-rollout --device cpu -m "$TD/mi" --max-tokens 40 -o "$TD/mi.out" "$TD/short.jsonl"
	[ "$status" -eq 0 ]
	n=$(sed -n 's/.*1 samples, \([0-9]*\) tokens.*/\1/p' <<<"$output")
	[ "${n:-0}" -gt 10 ] || { echo "$output"; false; }
	run rl-rollout -q --device cpu -m "$TD/mi" --max-tokens 4 -o "$TD/mi.out" "$TD/long.jsonl"
	[ "$status" -eq 0 ]
}

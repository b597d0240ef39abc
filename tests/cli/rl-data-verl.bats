#!/usr/bin/env bats
# verl's dataset rows, shaped as verl's examples/data_preprocess/gsm8k.py
# writes them and as pandas' to_json(orient="records", lines=True) exports
# them (forward slashes and non-ASCII escaped), through rl-rollout and
# rl-reward: the chat prompt rendered, every column in meta, the ground truth
# scored.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 1 512
	python3 - "$TD/train.jsonl" <<'PY'
import json, re, sys
raw = [{"question": "Natalia sold 48 clips in April, and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24.\n48+24 = <<48+24=72>>72\n#### 72"},
       {"question": "Café: 1,200 cups a day for 2 days?", "answer": "1200*2 = 2400\n#### 2,400"}]
instruction = "Let's think step by step and output the final answer after \"####\"."
rows = []
for idx, ex in enumerate(raw):
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", ex["answer"]).group(0).split("#### ")[1].replace(",", "")
    rows.append({"data_source": "openai/gsm8k",
                 "prompt": [{"role": "user", "content": ex["question"] + " " + instruction}],
                 "ability": "math",
                 "reward_model": {"style": "rule", "ground_truth": solution},
                 "extra_info": {"split": "train", "index": idx, "answer": ex["answer"], "question": ex["question"]}})
with open(sys.argv[1], "w") as f:
    for r in rows:
        # pandas' to_json: ASCII with \u escapes, "/" written "\/"
        f.write(json.dumps(r, separators=(",", ":")).replace("/", "\\/") + "\n")
PY
}

@test "verl gsm8k rows: rl-rollout renders the chat prompt and keeps every column in meta" {
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --seed 3 --jsonl "$TD/train.jsonl"
	[ "${#lines[@]}" -eq 4 ]
	printf '%s\n' "${lines[@]}" > "$TD/gen.jsonl"
	run -0 python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
recs = [json.loads(l) for l in open(sys.argv[2])]
for i, r in enumerate(recs):
    row = rows[r["meta"]["extra_info"]["index"]]
    want = "<|im_start|>user\n" + row["prompt"][0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    assert r["prompt_text"] == want, (i, r["prompt_text"])
    m = r["meta"]
    for k in ("data_source", "ability", "reward_model", "extra_info"):
        assert m[k] == row[k], (i, k, m.get(k))
print("ok", len(recs))' "$TD/train.jsonl" "$TD/gen.jsonl"
	assert_output "ok 4"
}

@test "verl gsm8k rows: the ground truth reaches rl-reward (task by data_source)" {
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 4 --seed 3 --jsonl "$TD/train.jsonl" > "$TD/gen.jsonl"
	# the samples answered: right, wrong; right (2400, written with a comma), wrong
	python3 -c '
import json, sys
say = {(0, 0): "so #### 72", (0, 1): "so #### 71", (1, 0): "total: #### 2,400", (1, 1): "#### 24"}
for l in open(sys.argv[1]):
    r = json.loads(l)
    for k in ("response", "logprobs"):
        r.pop(k, None)
    r["response_text"] = say[(r["meta"]["extra_info"]["index"], r["index"])]
    print(json.dumps(r))' "$TD/gen.jsonl" > "$TD/answered.jsonl"
	run -0 --separate-stderr rl-reward --task auto --jsonl "$TD/answered.jsonl"
	echo "$stderr"
	[ "$(python3 -c '
import json, sys
rs = sorted((r["meta"]["extra_info"]["index"], r["index"], r["reward"]) for r in map(json.loads, sys.stdin))
print(*[x[2] for x in rs])' <<< "$output")" = "1 0 1 0" ]
}

@test "verl gsm8k rows: rl-queue put keeps the messages and every column for rl-rollout --queue" {
	url="ipc://$BATS_TEST_TMPDIR/q.sock"
	rl-queue serve --listen "$url" -q 3>&- &
	broker=$!
	for _ in $(seq 100); do
		rl-queue stat --timeout 0.2 "$url" >/dev/null 2>&1 && break
		sleep 0.05
	done
	rl-queue put -q "$url" "$TD/train.jsonl"
	run --separate-stderr rl-queue get --stage rollout -n 5 "$url"
	kill "$broker"
	[ "$status" = 0 ]
	echo "$output" > "$TD/leased.jsonl"
	run -0 python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
recs = [json.loads(l) for l in open(sys.argv[2])]
for r in recs:
    m = r["meta"]
    row = rows[m["extra_info"]["index"]]
    assert m == row, (m, row)   # the messages stay in meta.prompt
print("ok", len(recs))' "$TD/train.jsonl" "$TD/leased.jsonl"
	assert_output "ok 2"
}

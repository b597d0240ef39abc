#!/usr/bin/env bats
# DAPO's overlong handling: rl-reward's soft overlong penalty (verl's
# overlong_buffer) against the formula of verl's DAPO reward manager, computed
# here in Python; rl-train --overlong-filter leaves truncated samples out of the
# loss: its gradient is PyTorch's (verl_ref.py) with those samples' response_mask
# zero, it equals an explicit loss_mask of zeros byte for byte, and a step of
# truncated samples only leaves the weights as they were.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper

FX=tests/fixtures/train
REC=$FX/verl_masked_records.jsonl

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	train_model "$TD"
	# the second sample of each group was cut at max_tokens
	python3 - "$REC" "$TD/cut.jsonl" "$TD/cutmask.jsonl" "$TD/allcut.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as a, open(sys.argv[3], "w") as b, open(sys.argv[4], "w") as c:
    for r in recs:
        cut = r["index"] == 1
        if cut:
            r["finish"] = "length"
        a.write(json.dumps(r) + "\n")
        m = dict(r)
        if cut:
            m["loss_mask"] = [0] * len(r["response"])
        b.write(json.dumps(m) + "\n")
        r["finish"] = "length"
        c.write(json.dumps(r) + "\n")
PY
}

# records N SEED: N JSONL records for the exact task with random response
# lengths, max_tokens and rewards
records() {
	python3 - "$1" "$2" <<'PY'
import json, random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
for i in range(n):
    mt = rng.choice([16, 40, 100, 512])
    L = rng.randint(0, mt)
    ok = rng.random() < 0.5
    print(json.dumps({"id": i, "group": i // 4, "index": i % 4, "group_size": 4, "prompt": [1, 2],
                      "response": [7] * L, "response_text": "42" if ok else "41", "max_tokens": mt,
                      "finish": "length" if L == mt else "eos", "meta": {"answer": "42"}}))
PY
}

@test "rl-reward --overlong-buffer: the penalty of verl's DAPO reward manager, record by record" {
	records 400 7 > "$TD/in.jsonl"
	local args
	for args in "16 1.0 0" "8 0.5 0" "30 2.0 64" "1 1.0 0"; do
		set -- $args
		local extra=""
		[ "$3" != 0 ] && extra="--max-response-len $3"
		# shellcheck disable=SC2086
		rl-reward -q --task exact --overlong-buffer "$1" --overlong-penalty "$2" $extra --jsonl "$TD/in.jsonl" \
		    > "$TD/out.jsonl" 2> "$TD/err" || true
		python3 - "$TD/in.jsonl" "$TD/out.jsonl" "$1" "$2" "$3" <<'PY'
import json, math, sys
# verl (workers/reward_manager/dapo.py): expected_len = max_resp_len - buffer.len;
# exceed_len = valid_response_length - expected_len;
# overlong_reward = min(-exceed_len / buffer.len * penalty_factor, 0); reward = score + overlong_reward
# max_resp_len must be >= buffer.len (verl asserts it): such records fail here.
inp = [json.loads(l) for l in open(sys.argv[1])]
out = {r["id"]: r for r in map(json.loads, open(sys.argv[2]))}
buf, fac, mx = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
bad = penalised = failed = 0
for r in inp:
    o = out[r["id"]]
    max_len = mx or r["max_tokens"]
    if max_len < buf:
        failed += 1
        if not (o["reward"] is None or math.isnan(o["reward"])) or "overlong" not in o["meta"].get("reward_error", ""):
            print("record", r["id"], "should fail:", o); bad += 1
        continue
    score = 1.0 if r["response_text"] == r["meta"]["answer"] else 0.0
    exceed = len(r["response"]) - (max_len - buf)
    pen = min(-exceed / buf * fac, 0)
    penalised += pen < 0
    want = score + pen
    if abs(o["reward"] - want) > 1e-6 * max(1, abs(want)) or abs(o["meta"]["scores"]["overlong"] - pen) > 1e-12:
        print("record", r["id"], "want", want, "got", o["reward"], o["meta"]["scores"]); bad += 1
print("penalised", penalised, "failed", failed, "of", len(inp))
assert penalised >= 5, penalised
sys.exit(bad > 0)
PY
	done
}

@test "rl-reward: overlong options need --overlong-buffer, a budget at least the buffer, usable values" {
	records 4 1 > "$TD/in4.jsonl"
	run -2 --separate-stderr rl-reward --task exact --overlong-penalty 1 --jsonl "$TD/in4.jsonl"
	[[ "$stderr" == *"need --overlong-buffer"* ]]
	run -2 --separate-stderr rl-reward --task exact --overlong-buffer 64 --max-response-len 32 --jsonl "$TD/in4.jsonl"
	[[ "$stderr" == *"--max-response-len 32 is shorter than --overlong-buffer 64"* ]]
	run -2 --separate-stderr rl-reward --task exact --overlong-buffer 0 --jsonl "$TD/in4.jsonl"
	[[ "$stderr" == *"--overlong-buffer"* ]]
	run -2 --separate-stderr rl-reward --task exact --overlong-buffer 8 --overlong-penalty -1 --jsonl "$TD/in4.jsonl"
	[[ "$stderr" == *"--overlong-penalty"* ]]
	# a record without max_tokens (and no --max-response-len) fails, named, the others are scored
	python3 -c '
import json
print(json.dumps({"id": 1, "response": [5] * 10, "response_text": "42", "meta": {"answer": "42"}}))
print(json.dumps({"id": 2, "response": [5] * 10, "response_text": "42", "max_tokens": 12, "meta": {"answer": "42"}}))' > "$TD/nomax.jsonl"
	run -0 --separate-stderr rl-reward --task exact --overlong-buffer 4 --jsonl "$TD/nomax.jsonl"
	[[ "$output" == *'"reward_error":"overlong: record has no max_tokens (give --max-response-len N)"'* ]] || { echo "$output"; return 1; }
	[[ "$stderr" == *"1 without a length budget for the overlong penalty"* ]] || { echo "$stderr"; return 1; }
	# record 2: 10 tokens of 12, buffer 4: exceed 2, penalty -0.5
	echo "$output" | python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin][1]; assert abs(r["reward"]-0.5)<1e-7, r'
}

@test "rl-train --overlong-filter: the gradient is PyTorch's with the truncated samples masked out" {
	/usr/bin/python3 -c 'import torch' 2>/dev/null || skip "no PyTorch at /usr/bin/python3 (python3-torch)"
	local args
	for args in "--algo grpo --kl k3 --kl-coef 0.1" "--algo dapo"; do
		# shellcheck disable=SC2086
		rl-train -q -m "$TD/m0" --out "$TD/g" --batch 4 --max-steps 1 --lr 1 --adam-eps 1 \
		    --weight-decay 0 --grad-clip 1e9 --overlong-filter $args "$TD/cut.jsonl"
		# verl_ref.py puts a record's score on its last sampled token, so a record
		# with none would score 0; verl puts it on the response's last token
		# whatever the loss mask (its group baseline keeps the truncated
		# samples' scores, as SkyRL's overlong filtering does), so here a record
		# without a sampled token keeps its score on its last token
		run /usr/bin/python3 - "$FX" "$TD/m0" "$TD/cutmask.jsonl" "$TD/g/step-00000001" "$args" <<'PY'
import sys
sys.argv = [sys.argv[0]] + sys.argv[1:]
sys.path.insert(0, sys.argv[1])
import torch
import verl_ref
orig = verl_ref.token_rewards
def token_rewards(r, m, L, with_turns):
    if any(r.get("loss_mask", [1])):
        return orig(r, m, L, with_turns)
    tr = torch.zeros(L, dtype=verl_ref.DT)
    tr[len(r["response"]) - 1] = r["reward"]
    return tr
verl_ref.token_rewards = token_rewards
sys.exit(0 if verl_ref.grad_check(sys.argv[2], sys.argv[3], sys.argv[5], sys.argv[4]) else 1)
PY
		echo "$output" | tail -1
		[ "$status" -eq 0 ]
		rm -rf "$TD/g"
	done
}

@test "rl-train --overlong-filter equals a zero loss_mask byte for byte, changes the step, and zeroes an all-truncated step" {
	local args
	for args in "--algo grpo --kl k3 --kl-coef 0.1 --ent-coef 0.01" "--algo dapo" "--algo reinforce++"; do
		# shellcheck disable=SC2086
		rl-train -q -m "$TD/m0" --out "$TD/f" --batch 4 --max-steps 1 --metrics "$TD/f.json" --overlong-filter $args "$TD/cut.jsonl"
		# shellcheck disable=SC2086
		rl-train -q -m "$TD/m0" --out "$TD/k" --batch 4 --max-steps 1 $args "$TD/cutmask.jsonl"
		# shellcheck disable=SC2086
		rl-train -q -m "$TD/m0" --out "$TD/n" --batch 4 --max-steps 1 $args "$TD/cut.jsonl"
		cmp "$TD/f/step-00000001/model.safetensors" "$TD/k/step-00000001/model.safetensors"
		! cmp -s "$TD/f/step-00000001/model.safetensors" "$TD/n/step-00000001/model.safetensors"
		python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["response/overlong_filtered_ratio"] == 0.25, m' "$TD/f.json"
		rm -rf "$TD/f" "$TD/k" "$TD/n"
	done
	# every sample truncated: no token in the loss, a zero gradient, AdamW moves nothing (no weight decay)
	rl-train -q -m "$TD/m0" --out "$TD/a" --batch 4 --max-steps 1 --weight-decay 0 --algo grpo --overlong-filter "$TD/allcut.jsonl"
	python3 - "$TD/m0" "$TD/a/step-00000001" <<'PY'
import json, struct, sys
def tensors(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys()
d = [k for k in a if a[k] != b[k]]
assert not d, d
print(len(a), "tensors unchanged")
PY
}

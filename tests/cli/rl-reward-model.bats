#!/usr/bin/env bats
# rl-reward --model: a reward model that rl-train --algo rm saved, as
# transformers' Qwen2/LlamaForSequenceClassification lays it out
# (tests/fixtures/train/rm_score_ref.py layout), scoring records as the
# class's forward does (the same script's float64 PyTorch restatement: the
# last non-pad token, EOS padding); weighted with a rule task; --rm-norm;
# records it cannot score; models it refuses; the queue wiring.
#
# Tolerance: 1e-5 + 1e-4 |want| (rm_score_ref.py: fp32 against float64 over
# 2 layers, seen ~1e-7); a score read at the wrong position differs by ~0.1.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load port_helper
load model_helper

REF=tests/fixtures/train/rm_score_ref.py

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":264,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":64,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"eos_token_id":257,"torch_dtype":"float32"}
JSON
	jq -c '.model_type = "llama" | .tie_word_embeddings = false | del(.eos_token_id) | .pad_token_id = 258' \
	    "$TD/cfg.json" > "$TD/llama.json"
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	rl-train -q --init "$TD/llama.json" --tokenizer bytes --out "$TD/l0" --seed 2
	word_pairs 16 > "$TD/pairs.jsonl"
	rl-train -q -m "$TD/m0" --out "$TD/rm" --algo rm --batch 4 --lr 1e-2 --metrics "$TD/rm.json" "$TD/pairs.jsonl"
	rl-train -q -m "$TD/l0" --out "$TD/lrm" --algo rm --batch 8 --lr 1e-2 --metrics "$TD/lrm.json" "$TD/pairs.jsonl"
	# records: prompt + response ids; 3 and 4 end with EOS (the pad id), 5 is all
	# pads, 6 is longer than the context (64), 7 has an id outside the vocabulary
	python3 - > "$TD/recs.jsonl" <<'PY'
import json, random
random.seed(5)
for i in range(14):
    p = [random.randrange(256) for _ in range(random.randint(1, 12))]
    r = [random.randrange(256) for _ in range(random.randint(0, 30))]
    if i == 3: r += [257]
    if i == 4: r += [257, 258, 257]
    if i == 5: p, r = [257], [257] * 3
    if i == 6: r = [random.randrange(256) for _ in range(70)]
    if i == 7: r = [1, 300, 2]
    print(json.dumps({"id": i, "group": i // 2, "index": i % 2, "group_size": 2, "prompt": p, "response": r,
                      "response_text": "yes" if i % 3 else "no", "meta": {"answer": "yes"}}))
PY
}

setup() {
	PIDS=""
	if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
		skip "no PyTorch for /usr/bin/python3 (Debian python3-torch)"
	fi
}

teardown() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

@test "rm directories are transformers' ...ForSequenceClassification; their scores match PyTorch's last non-pad token" {
	"$REF" layout "$TD/rm/latest"
	"$REF" layout "$TD/lrm/latest"
	run -0 jq -r .architectures[0] "$TD/lrm/latest/config.json"
	[ "$output" = LlamaForSequenceClassification ]
	rl-reward -q --model "$TD/rm/latest" --jsonl "$TD/recs.jsonl" > "$TD/s.jsonl"
	"$REF" check "$TD/rm/latest" "$TD/recs.jsonl" "$TD/s.jsonl"
	# the binary stream, and rows of at most 64 tokens (one record per forward): the same scores
	rl-reward -q --model "$TD/lrm/latest" --jsonl "$TD/recs.jsonl" > "$TD/l.jsonl"
	"$REF" check "$TD/lrm/latest" "$TD/recs.jsonl" "$TD/l.jsonl"
	rl-reward -q --model "$TD/lrm/latest" --rm-max-tokens 64 "$TD/recs.jsonl" | rl-queue cat --jsonl > "$TD/l1.jsonl"
	"$REF" check "$TD/lrm/latest" "$TD/recs.jsonl" "$TD/l1.jsonl"
	# a random reward model from a config as the Hub has them (num_labels 1, no id2label)
	jq '.architectures = ["LlamaForSequenceClassification"] | .num_labels = 1' "$TD/llama.json" > "$TD/hub.json"
	rl-train -q --init "$TD/hub.json" --tokenizer bytes --out "$TD/hub" --seed 3
	"$REF" layout "$TD/hub"
	rl-reward -q --model "$TD/hub" --jsonl "$TD/recs.jsonl" > "$TD/h.jsonl"
	"$REF" check "$TD/hub" "$TD/recs.jsonl" "$TD/h.jsonl"
	# the failures are named
	run -0 jq -r 'select(.id == 6 or .id == 7) | .meta.reward_error' "$TD/s.jsonl"
	[ "${lines[0]}" = "model: 76 tokens, longer than the reward model's context (64)" ]
	[ "${lines[1]}" = "model: token id 300 is outside the reward model's vocabulary [0, 264)" ]
}

@test "--model with a rule task: the weighted sum; --rm-norm batch and running" {
	rl-reward -q --model "$TD/rm/latest" --jsonl "$TD/recs.jsonl" > "$TD/raw.jsonl"
	rl-reward -q --model "$TD/rm/latest" --model-weight 0.5 --task exact:2 --jsonl "$TD/recs.jsonl" > "$TD/w.jsonl"
	run -0 python3 - "$TD/raw.jsonl" "$TD/w.jsonl" <<'PY'
import json, sys
raw = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
for r in map(json.loads, open(sys.argv[2])):
    m = raw[r["id"]]["meta"]["scores"]["model"]
    if m is None:
        assert r["reward"] == "nan", r
        continue
    want = 2 * (r["response_text"] == "yes") + 0.5 * m
    assert abs(r["reward"] - want) < 1e-6 * (1 + abs(want)), (r, want)
print("ok")
PY
	# batch: standardised over the round's 12 scored records (population std)
	rl-reward -q --model "$TD/rm/latest" --rm-norm batch --jsonl "$TD/recs.jsonl" > "$TD/b.jsonl"
	run -0 python3 - "$TD/raw.jsonl" "$TD/b.jsonl" <<'PY'
import json, sys, statistics
raw = [r["meta"]["scores"]["model"] for r in map(json.loads, open(sys.argv[1]))]
got = [r["meta"]["scores"]["model"] for r in map(json.loads, open(sys.argv[2]))]
ok = [i for i, v in enumerate(raw) if v is not None]
mu, sd = statistics.fmean(raw[i] for i in ok), statistics.pstdev(raw[i] for i in ok)
for i in ok:
    assert abs(got[i] - (raw[i] - mu) / sd) < 1e-5, (i, got[i], raw[i], mu, sd)
print("ok")
PY
	# running, one record per round: each against the mean and std of the scores so far
	rl-reward -q --model "$TD/rm/latest" --rm-norm running --batch 1 --jsonl "$TD/recs.jsonl" > "$TD/r.jsonl"
	run -0 python3 - "$TD/raw.jsonl" "$TD/r.jsonl" <<'PY'
import json, sys, statistics
raw = [r["meta"]["scores"]["model"] for r in map(json.loads, open(sys.argv[1]))]
got = [r["meta"]["scores"]["model"] for r in map(json.loads, open(sys.argv[2]))]
seen = []
for v, g in zip(raw, got):
    if v is None:
        continue
    seen.append(v)
    mu, sd = statistics.fmean(seen), statistics.pstdev(seen)
    want = (v - mu) / sd if sd > 1e-8 else v - mu
    assert abs(g - want) < 1e-5, (g, want, len(seen))
print("ok")
PY
}

@test "--model refuses a causal LM, num_labels 2 and a head of another shape, naming them" {
	run -1 --separate-stderr rl-reward --model "$TD/m0" --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"m0' is a causal language model, not a reward model"* ]]
	[[ "$stderr" == *"hint: train one on preference pairs: rl-train --algo rm"* ]]
	cp -r "$TD/rm/latest/." "$TD/two"
	jq '.id2label = {"0": "bad", "1": "good"} | .label2id = {"bad": 0, "good": 1}' "$TD/rm/latest/config.json" > "$TD/two/config.json"
	run -1 --separate-stderr rl-reward --model "$TD/two" --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"config.json': Qwen2ForSequenceClassification with 2 labels (id2label); a reward model has one (num_labels 1)"* ]]
	jq 'del(.id2label, .label2id)' "$TD/rm/latest/config.json" > "$TD/two/config.json"
	run -1 --separate-stderr rl-reward --model "$TD/two" --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"with 2 labels (no id2label or num_labels: transformers' default)"* ]]
	"$REF" twohead "$TD/rm/latest" "$TD/wide"
	run -1 --separate-stderr rl-reward --model "$TD/wide" --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"tensor 'score.weight' has shape [2, 32]; a reward model's head is [1, 32]"* ]]
	# a reward model is no policy
	echo '{"prompt": "hi"}' > "$TD/p.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/rm/latest" --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"is a reward model (...ForSequenceClassification)"* ]]
	# usage
	run -2 --separate-stderr rl-reward --model "$TD/rm/latest" --rm-norm group --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"--rm-norm: bad value 'group' (none, batch or running)"* ]]
	run -2 --separate-stderr rl-reward --task exact --rm-norm batch --jsonl "$TD/recs.jsonl"
	[[ "$stderr" == *"are options of --model DIR"* ]]
}

@test "the queue wiring: rl-reward --queue URL --model scores leased records as the pipe does" {
	# the groups whose records all score (6 and 7 do not: group 3)
	jq -c 'select(.group != 3)' "$TD/recs.jsonl" > "$TD/q.jsonl"
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' \
	    rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -d "$BATS_TEST_TMPDIR/q" -t 30
	URL="tcp://127.0.0.1:$DPORT"
	rl-queue put -q --stage generated "$URL" "$TD/q.jsonl"
	run -0 --separate-stderr timeout -k 20 60 rl-reward --queue "$URL" --model "$TD/rm/latest" --idle-exit 1
	rl-queue get -q --stage train -n 12 -w 10 "$URL" > "$TD/qs.jsonl"
	[ "$(wc -l < "$TD/qs.jsonl")" -eq 12 ]
	"$REF" check "$TD/rm/latest" "$TD/q.jsonl" "$TD/qs.jsonl"
}

#!/usr/bin/env bats
# rl-rollout --env in the queue wiring: prompts leased from rl-queue run as
# episodes; their records go to the trainers (the environment scored them),
# carry the turns, and their version is the first turn's; with --partial new
# weights apply between turns (turn_versions), without it they wait.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":256,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32","eos_token_id":260}
JSON
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	export ENV="/usr/bin/python3 $BATS_TEST_DIRNAME/env_scripted.py"
	# "turns" is a field of the line: rl-queue put keeps it as meta, the environment reads it
	printf '%s\n' '{"prompt":"12+34="}' '{"prompt":"abc","turns":2}' '{"prompt":"x","turns":4}' > "$TD/p.jsonl"
}

setup() {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -t 30
	URL="tcp://127.0.0.1:$DPORT"
	QPID=$DPID
}

teardown() {
	kill "$QPID" 2>/dev/null || true
	wait "$QPID" 2>/dev/null || true
}

@test "leased prompts run as episodes: whole groups for the trainers, the line's fields reach the environment" {
	rl-queue put -q "$URL" "$TD/p.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 3 --env "$ENV" --queue "$URL" --idle-exit 1
	[[ "$stderr" == *"3 prompts, 6 samples"* ]]
	# nothing waits for rl-reward: the groups are ready for training
	rl-queue get "$URL" -s reward -n 100 --release > "$TD/gen.jsonl"
	[ ! -s "$TD/gen.jsonl" ]
	rl-queue get "$URL" -s train -n 100 --release > "$TD/g.jsonl"
	python3 - "$TD/g.jsonl" <<'PY'
import json, sys, collections
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 6, len(recs)
groups = collections.Counter(r["group"] for r in recs)
assert sorted(groups.values()) == [2, 2, 2], groups
for r in recs:
    want = {"12+34=": 3, "abc": 2, "x": 4}[r["prompt_text"]]
    nt = len(r["turns"]) // 2
    assert nt == want, (r["prompt_text"], nt)
    # the scripted environment rewards step k with k / 10
    assert abs(r["reward"] - sum(k / 10 for k in range(1, nt + 1))) < 1e-5, r["reward"]
    assert "env_error" not in r
    assert len(r["loss_mask"]) == len(r["response"]) and 0 in r["loss_mask"]
    assert r["version"][0] == r["turn_versions"][0], (r["version"], r["turn_versions"])
# the two samples of a prompt are two episodes of their own (their seeds differ)
by = collections.defaultdict(list)
for r in recs:
    by[r["group"]].append(r["response"])
assert any(a != b for a, b in by.values()), "every group's samples are identical"
PY
}

@test "the queue wiring trains: rl-rollout --env --queue, rl-train --queue" {
	rl-queue put -q "$URL" "$TD/p.jsonl"
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 3 --env "$ENV" --queue "$URL" --idle-exit 1
	run -0 --separate-stderr rl-train -q -m "$TD/m0" --out "$TD/ck" --batch 3 --queue "$URL" --idle-exit 1 \
	    --metrics "$TD/metrics.jsonl"
	[ -d "$TD/ck/step-00000001" ]
	[[ "$(head -1 "$TD/metrics.jsonl")" == *'"train/sequences":6'* ]]
	rl-queue stat "$URL" > "$TD/st"
	grep -q ' training 0 ' "$TD/st"
}

@test "a failing environment fails its episodes only; their records still complete the group" {
	printf '%s\n' '{"prompt":"a","mode":"crash"}' '{"prompt":"b"}' > "$TD/f.jsonl"
	rl-queue put -q "$URL" "$TD/f.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 3 --env "$ENV" --queue "$URL" --idle-exit 1
	[[ "$stderr" == *"2 prompts, 4 samples"* ]]
	rl-queue get "$URL" -s train -n 100 --release > "$TD/f-out.jsonl"
	[ "$(grep -c env_error "$TD/f-out.jsonl")" -eq 2 ]
	[ "$(wc -l < "$TD/f-out.jsonl")" -eq 4 ]
}

# an environment that publishes weights version 1 (W/latest -> V1) at its first
# step and answers 0.5 s later, so the generator sees the new version mid-episode
publishing_env() {
	cat > "$TD/pub_env.py" <<'PY'
import json, os, sys, time
w, v1 = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    if m["op"] == "reset":
        n = 0
        print(json.dumps({"observation": "<", "done": False}), flush=True)
        continue
    n += 1
    if n == 1:
        os.symlink(v1, w + "/latest.tmp")
        os.replace(w + "/latest.tmp", w + "/latest")
        time.sleep(0.5)
    print(json.dumps({"observation": "[%d]" % n, "reward": 0.5, "done": n >= 2}), flush=True)
PY
	mkdir -p "$TD/$1/w" "$TD/$1/v"
	cp -r "$TD/m0" "$TD/$1/v/step-00000001"
	echo "/usr/bin/python3 $TD/pub_env.py $TD/$1/w $TD/$1/v/step-00000001"
}

@test "--partial: new weights apply between turns, turn_versions say so and the record's version is the first turn's" {
	echo '{"prompt":"p"}' > "$TD/one.jsonl"
	rl-queue put -q "$URL" "$TD/one.jsonl"
	env=$(publishing_env part)
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 1 --max-tokens 3 --env "$env" --env-procs 1 \
	    --weights-from "$TD/part/w" --partial --queue "$URL" --idle-exit 1.5
	rl-queue get "$URL" -s train -n 10 --release > "$TD/part.jsonl"
	python3 - "$TD/part.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 1, r
r = r[0]
assert r["turn_versions"] == [0, 0, 1, 1], r["turn_versions"]
assert r["version"] == [0, 1], r["version"]
PY
}

@test "without --partial new weights wait for the running episode: one version throughout" {
	echo '{"prompt":"p"}' > "$TD/one.jsonl"
	rl-queue put -q "$URL" "$TD/one.jsonl"
	env=$(publishing_env whole)
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 1 --max-tokens 3 --env "$env" --env-procs 1 \
	    --weights-from "$TD/whole/w" --queue "$URL" --idle-exit 1.5
	rl-queue get "$URL" -s train -n 10 --release > "$TD/whole.jsonl"
	python3 - "$TD/whole.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 1, r
assert r[0]["turn_versions"] == [0, 0, 0, 0], r[0]["turn_versions"]
assert r[0]["version"] == [0, 0], r[0]["version"]
PY
}

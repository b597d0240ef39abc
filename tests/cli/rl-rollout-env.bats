#!/usr/bin/env bats
# rl-rollout --env: multi-turn episodes with environment processes (rl-env(5)):
# the record (loss mask, turns, rewards), train/inference consistency over
# turns, KV reuse, ChatML framing, and every failure of an environment.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	cat > "$TD/cfg.json" <<'JSON'
{"model_type":"qwen2","vocab_size":261,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,
 "num_key_value_heads":2,"intermediate_size":64,"max_position_embeddings":256,"rope_theta":10000,
 "rms_norm_eps":1e-6,"tie_word_embeddings":true,"torch_dtype":"float32","eos_token_id":260}
JSON
	rl-train -q --init "$TD/cfg.json" --tokenizer bytes --out "$TD/m0" --seed 1
	# /usr/bin/python3: Debian's (a shim in PATH may take a second to start)
	export ENV="/usr/bin/python3 $BATS_TEST_DIRNAME/env_scripted.py"
	printf '%s\n' '{"prompt":"12+34="}' '{"prompt":"abc","turns":2}' '{"prompt":"x","turns":4}' > "$TD/p.jsonl"
}

@test "the record: masked tokens are exactly the observations, turns and rewards, log-probs 0 where masked" {
	run -0 --separate-stderr rl-rollout -m "$TD/m0" -n 2 --max-tokens 4 --temperature 1 --jsonl \
	    --slots 3 --env "$ENV" "$TD/p.jsonl"
	[ "${#lines[@]}" -eq 6 ]
	printf '%s\n' "${lines[@]}" > "$TD/ep.jsonl"
	python3 - "$TD/ep.jsonl" <<'PY'
import json, sys
want_turns = {"12+34=": 3, "abc": 2, "x": 4}
for l in open(sys.argv[1]):
    r = json.loads(l)
    resp, mask, lp, turns = r["response"], r["loss_mask"], r["logprobs"], r["turns"]
    assert len(mask) == len(resp) == len(lp)
    T = want_turns[r["prompt_text"]]
    assert len(turns) == 2 * T and len(r["turn_rewards"]) == T and len(r["turn_versions"]) == 2 * T
    # the gaps between turns are the observations, byte for byte (the bytes tokenizer: id = byte)
    obs = [b"<"] + [b"[%d]" % k for k in range(1, T)]
    pos = 0
    for k in range(T):
        s, e = turns[2 * k], turns[2 * k + 1]
        assert resp[pos:s] == list(obs[k]), (k, resp[pos:s], obs[k])
        assert all(m == 0 for m in mask[pos:s]) and all(x == 0 for x in lp[pos:s])
        assert 0 < e - s <= 4 and all(m == 1 for m in mask[s:e]) and all(x < 0 for x in lp[s:e])
        pos = e
    assert pos == len(resp)
    assert [round(x, 5) for x in r["turn_rewards"]] == [round((k + 1) / 10, 5) for k in range(T)]
    assert abs(r["reward"] - sum((k + 1) / 10 for k in range(T))) < 1e-5
    assert "env_error" not in r and r["finish"] in ("eos", "length")
PY
}

@test "sampled tokens' log-probs equal one forward pass over the whole episode (--score)" {
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 5 --temperature 1 --jsonl --env "$ENV" "$TD/p.jsonl" > "$TD/e2.jsonl"
	run -0 --separate-stderr rl-rollout --score ref_logprobs -m "$TD/m0" --jsonl "$TD/e2.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
n = 0
for l in sys.stdin:
    r = json.loads(l)
    for a, b, m in zip(r["ref_logprobs"], r["logprobs"], r["loss_mask"]):
        if m:
            assert abs(a - b) < 2e-5, (a, b)
            n += 1
assert n > 40, n'
}

@test "the KV cache is kept across turns: only the prompt and first observation are prefilled" {
	run -0 --separate-stderr rl-rollout -v -m "$TD/m0" -n 2 --max-tokens 4 --jsonl --env "$ENV" "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" > "$TD/kv.jsonl"
	want=$(python3 -c '
import json, sys
p = f = 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    p += len(r["prompt"]) + r["turns"][0]
    f += r["loss_mask"].count(0) - r["turns"][0]
print(p, f)' "$TD/kv.jsonl")
	[[ "$stderr" == *"tokens: ${want% *} prefilled, "*", ${want#* } inserted by environments"* ]]
}

@test "ChatML framing: observations as user and tool turns, encoded on their own" {
	printf '%s\n' '{"prompt":"hi","first":""}' '{"prompt":"yo","first":"","mode":"tool"}' > "$TD/chat.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --chat --chat-template chatml --max-tokens 4 --jsonl \
	    --env "$ENV" "$TD/chat.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    resp, turns, tool = r["response"], r["turns"], r["prompt_text"].find("yo") >= 0
    assert turns[0] == 0 and r["prompt"][-10:] == list(b"assistant\n")
    for k in range(1, len(turns) // 2):
        s, e = turns[2 * k - 1], turns[2 * k]
        body = b"user\n<tool_response>\n[%d]\n</tool_response>" % k if tool else b"user\n[%d]" % k
        head = [10, 259] if resp[s - 1] == 260 else [260, 10, 259]
        assert resp[s:e] == head + list(body) + [260, 10, 259] + list(b"assistant\n"), resp[s:e]'
	# a first observation (the prompt line holds the conversation) fails the episode
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --chat --chat-template chatml --jsonl --env "$ENV" "$TD/p.jsonl"
	[[ "${lines[0]}" == *'"finish":"abort"'*'"env_error":"the reset'"'"'s observation must be \"\" with ChatML framing'* ]]
}

@test "--max-turns and --max-episode-tokens end episodes with finish length" {
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --max-turns 2 --jsonl --env "$ENV" "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    assert len(r["turns"]) == 4 and len(r["turn_rewards"]) == 2, r["turns"]
    assert r["finish"] == "length" or r["prompt_text"] == "abc", r["finish"]'
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --max-episode-tokens 9 --jsonl --env "$ENV" "$TD/p.jsonl"
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    assert len(r["response"]) <= 9 and r["finish"] == "length", (len(r["response"]), r["finish"])'
}

@test "a crash, a hang, garbage, a flood, unasked lines and protocol errors fail that episode only; no process is left" {
	printf '%s\n' '{"prompt":"a","mode":"crash"}' '{"prompt":"b","turns":2}' '{"prompt":"c","mode":"hang"}' \
	    '{"prompt":"d","mode":"garbage"}' '{"prompt":"e","mode":"flood"}' '{"prompt":"f","mode":"extra"}' \
	    '{"prompt":"g","mode":"error"}' '{"prompt":"h","mode":"nofield"}' '{"prompt":"i","turns":2}' > "$TD/bad.jsonl"
	rm -f "$TD/pids"
	RL_ENV_PIDS="$TD/pids" run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 3 --jsonl --slots 4 \
	    --env-procs 2 --env-timeout 2 --env "$ENV" "$TD/bad.jsonl"
	[ "${#lines[@]}" -eq 9 ]
	printf '%s\n' "${lines[@]}" | python3 -c '
import json, sys
want = {"a": "environment process closed its output (it exited with status 3)",
        "c": "no answer in 2 s (--env-timeout)", "d": "the answer to step is not a JSON object: '"'"'this is not json",
        "e": "a line of more than 1048576 bytes", "f": "a line nobody asked for",
        "g": "answered step with an error: unknown op frobnicate",
        "h": "protocol error: the answer to step: missing field \"done\""}
for l in sys.stdin:
    r = json.loads(l)
    p = r["prompt_text"]
    if p in want:
        assert r["finish"] == "abort" and want[p] in r["env_error"], (p, r.get("env_error"))
    else:
        assert "env_error" not in r and len(r["turns"]) == 4, r'
	[[ "$stderr" == *"episode "*"(prompt line 1, sample 0) failed: the environment process closed its output"* ]]
	# every process started (the failed ones were restarted) is gone: killed and reaped
	[ "$(wc -l < "$TD/pids")" -ge 6 ]
	while read -r p; do ! kill -0 "$p" 2>/dev/null; done < "$TD/pids"
}

@test "every environment failing stops the run with a clear error" {
	run -1 --separate-stderr rl-rollout -m "$TD/m0" -n 3 --max-tokens 3 --jsonl --env-procs 2 --env "exit 1" "$TD/p.jsonl"
	[[ "$stderr" == *"episodes in a row failed with no valid answer from any environment process ('exit 1'): stopping"* ]]
	# fewer episodes than it takes to stop: the run ends, and fails
	head -1 "$TD/p.jsonl" > "$TD/one.jsonl"
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --jsonl --env-procs 1 --env "/nonexistent/env" "$TD/one.jsonl"
	[[ "$stderr" == *"exited with status 127"* ]]
	[[ "$stderr" == *"no environment process ever answered"* ]]
}

@test "refused: --env with --score or --greedy-baseline; --max-turns without --env; a cache too small for an episode" {
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --env "$ENV" --score reward "$TD/p.jsonl"
	[[ "$stderr" == *"--env runs episodes"*"not with --score"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --env "$ENV" --greedy-baseline "$TD/p.jsonl"
	[[ "$stderr" == *"--greedy-baseline"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --max-turns 3 "$TD/p.jsonl"
	[[ "$stderr" == *"need --env CMD"* ]]
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --env "$ENV" --kv-mem 8K "$TD/p.jsonl"
	[[ "$stderr" == *"--env: the KV cache (--kv-mem) cannot hold one episode of 256 tokens (--max-episode-tokens)"* ]]
	run -2 --separate-stderr rl-rollout -m "$TD/m0" --env "$ENV" --env-framing xml "$TD/p.jsonl"
	[[ "$stderr" == *"--env-framing: want auto, plain or chatml, not 'xml'"* ]]
}

@test "the binary stream and rl-queue cat carry the episode fields" {
	rl-rollout -q -m "$TD/m0" --max-tokens 3 --jsonl --env "$ENV" "$TD/p.jsonl" > "$TD/j.jsonl"
	rl-rollout -q -m "$TD/m0" --max-tokens 3 -o "$TD/b.rlt" --env "$ENV" "$TD/p.jsonl"
	run -0 --separate-stderr rl-queue cat --jsonl "$TD/b.rlt"
	printf '%s\n' "${lines[@]}" > "$TD/b.jsonl"
	# the same seed: the same episodes, whichever form they were written in
	python3 - "$TD/j.jsonl" "$TD/b.jsonl" <<'PY'
import json, sys
key = lambda r: (r["prompt_text"], r["index"])  # episodes end in any order
a = sorted((json.loads(l) for l in open(sys.argv[1])), key=key)
b = sorted((json.loads(l) for l in open(sys.argv[2])), key=key)
assert len(a) == len(b) == 3
for x, y in zip(a, b):
    for k in ("response", "loss_mask", "turns", "turn_versions", "turn_rewards"):
        assert x[k] == y[k], k
    # log-probs: the same tokens, but an episode's turns may share an engine
    # step with other episodes in one run and not in the other (environments
    # answer at their own pace), and the batched CPU forward is not bitwise
    # the same across batch compositions (greedy, 5 prompts: --slots 1 against
    # 2 or 5 gave the same tokens, log-probs up to 5.5e-7 apart): within rounding
    assert len(x["logprobs"]) == len(y["logprobs"]), "logprobs"
    for p, q in zip(x["logprobs"], y["logprobs"]):
        assert abs(p - q) <= 1e-4 + 1e-4 * abs(q), ("logprobs", p, q)
PY
}

@test "pipelines/agent: the calculator environments in Python and shell run episodes" {
	python3 "$BATS_TEST_DIRNAME/../../pipelines/agent/make_prompts.py" 3 > "$TD/calc.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --chat --chat-template chatml --max-tokens 8 --max-turns 2 \
	    --jsonl --env "/usr/bin/python3 $BATS_TEST_DIRNAME/../../pipelines/agent/calc_env.py" "$TD/calc.jsonl"
	[ "${#lines[@]}" -eq 3 ]
	[[ "${lines[0]}" == *'"turn_rewards":['* ]] && [[ "${lines[0]}" != *env_error* ]]
	command -v jq >/dev/null || skip "jq is not installed"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 8 --max-turns 2 --jsonl \
	    --env "sh $BATS_TEST_DIRNAME/../../pipelines/agent/calc_env.sh" "$TD/calc.jsonl"
	[ "${#lines[@]}" -eq 3 ]
	[[ "${lines[2]}" == *'"reward":0'* ]] && [[ "${lines[2]}" != *env_error* ]]
}

@test "the pipe wiring: rl-rollout --env | rl-train trains on the episodes" {
	rl-rollout -q -m "$TD/m0" -n 2 --max-tokens 3 --env "$ENV" "$TD/p.jsonl" | \
	    rl-train -q -m "$TD/m0" --out "$TD/ck" --batch 3 --metrics "$TD/metrics.jsonl" -
	[ -d "$TD/ck/step-00000001" ]
	[[ "$(head -1 "$TD/metrics.jsonl")" == *'"train/sequences":6'* ]]
}

@test "stop strings given by the environment end that episode's turns" {
	echo '{"prompt":"q"}' > "$TD/q.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --seed 3 --max-tokens 12 --max-turns 1 --jsonl \
	    --env "$ENV" "$TD/q.jsonl"
	# a printable ASCII token of the turn, past its first: the stop string (the same seed
	# gives the same tokens up to it)
	stop=$(printf '%s\n' "${lines[0]}" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
t = r["response"][r["turns"][0]:r["turns"][1]]
c = [i for i in range(1, len(t)) if 33 <= t[i] < 127 and chr(t[i]) not in "\\\"" and t[i] not in t[:i]]
print("%d %s" % (c[0] + 1, chr(t[c[0]])) if c else "")')
	[ -n "$stop" ] || skip "no printable token in the turn of this model"
	printf '{"prompt":"q","stop":["%s"]}\n' "${stop#* }" > "$TD/qs.jsonl"
	run -0 --separate-stderr rl-rollout -m "$TD/m0" --seed 3 --max-tokens 12 --max-turns 1 --jsonl \
	    --env "$ENV" "$TD/qs.jsonl"
	printf '%s\n' "${lines[0]}" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r["turns"][1] - r["turns"][0] == int(sys.argv[1]), (r["turns"], sys.argv[1])' "${stop% *}"
	echo '{"prompt":"q","stop":"x"}' > "$TD/qb.jsonl"
	# its only episode failed: no environment ever answered validly, the run fails
	run -1 --separate-stderr rl-rollout -m "$TD/m0" --max-tokens 4 --jsonl --env "$ENV" "$TD/qb.jsonl"
	[[ "${lines[0]}" == *'"env_error":"protocol error: the answer to reset: \"stop\" is not an array'* ]]
}

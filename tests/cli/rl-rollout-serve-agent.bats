#!/usr/bin/env bats
# rl-rollout serve --agent CMD: an agent process per prompt line and episode
# (tests/cli/agent_scripted.py, which logs what it was given and acts as
# its line's "mode" says): the environment it gets, its records in groups,
# the reward posted or printed, agents that fail, hang, exit without a
# reward or call after their reward; --queue: leased lines, groups put once;
# bad options.  Everything on 127.0.0.1, on a tiny random model.

bats_require_minimum_version 1.5.0
load '/usr/lib/bats/bats-support/load'
load '/usr/lib/bats/bats-assert/load'
load model_helper
load port_helper

setup_file() {
	export TD="$BATS_FILE_TMPDIR"
	toy_model "$TD" 1 256
	export AGENT="/usr/bin/python3 $BATS_TEST_DIRNAME/agent_scripted.py"
}

setup() {
	export AGENT_LOG="$BATS_TEST_TMPDIR/log"
	mkdir -p "$AGENT_LOG"
	PIDS=""
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

@test "--agent: a run per prompt line and sample, its environment, the reward it posts; records in groups" {
	printf '%s\n' '{"prompt":"ab","reward":1,"answer":"x"}' '{"prompt":"cd","reward":2}' \
	    '{"prompt":"ef","reward":3,"mode":"twice"}' > "$TD/p.jsonl"
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --api-key sekrit \
	    --served-model-name toy --agent "$AGENT" -n 2 --agents 3 --jsonl "$TD/p.jsonl"
	[[ "$stderr" == *"6 runs, 6 with a reward, 0 failed"* ]]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out.jsonl"
	python3 - "$BATS_TEST_TMPDIR/out.jsonl" "$AGENT_LOG" "$TD/p.jsonl" <<'PY'
import collections, json, os, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lines = [l for l in open(sys.argv[3])]
assert len(recs) == 6, len(recs)
groups = collections.defaultdict(list)
for r in recs:
    groups[r["group"]].append(r)
assert sorted(len(g) for g in groups.values()) == [2, 2, 2], groups
for g in groups.values():
    assert sorted(r["index"] for r in g) == [0, 1] and all(r["group_size"] == 2 for r in g)
for r in recs:
    ep = r["meta"]["episode_id"]
    log = json.load(open(os.path.join(sys.argv[2], ep + ".json")))
    line = json.loads(log["stdin"])
    # its environment: the server's URL, the key, the model's name, the episode, the line
    assert log["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and log["OPENAI_BASE_URL"].endswith("/v1"), log
    assert log["OPENAI_API_KEY"] == "sekrit" and log["OPENAI_MODEL"] == "toy", log
    assert log["RL_EPISODE_ID"] == ep and int(log["RL_EPISODE_INDEX"]) == r["index"], log
    assert log["stdin"] in lines and log["RL_PROMPT"] + "\n" == log["stdin"], log
    # the reward it posted, the line's fields in meta
    assert abs(r["reward"] - (line["reward"] + r["index"] / 10)) < 1e-6, (r["reward"], line)
    assert log["reward_status"] == 200 and log["reward_answer"]["episode_id"] == ep, log
    if "answer" in line:
        assert r["meta"]["answer"] == "x", r["meta"]
    assert "env_error" not in r
    # the record is what the calls generated: their texts, the agent's own text masked out
    nt = len(r["turns"]) // 2
    assert nt == len(log["texts"]) == (2 if line.get("mode") == "twice" else 1), (nt, log["texts"])
    assert sum(r["loss_mask"]) == sum(e - s for s, e in zip(r["turns"][::2], r["turns"][1::2]))
    if nt == 2:
        zeros = len(r["loss_mask"]) - sum(r["loss_mask"])
        # "</t>more" written back: 8 bytes, or 4 when the first turn stopped on "</t>"
        assert zeros in (8, 4), zeros
        assert "more" in r["response_text"], r["response_text"]
print("ok")
PY
}

@test "--agent: a stop string written back continues the episode's tokens (not twice); log-probs equal the training forward" {
	printf '%s\n' '{"prompt":"hello","mode":"stopback"}' > "$TD/s.jsonl"
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" --jsonl "$TD/s.jsonl"
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/ep.jsonl"
	rl-rollout -q --score ref_logprobs -m "$TD/m0" --jsonl "$BATS_TEST_TMPDIR/ep.jsonl" > "$BATS_TEST_TMPDIR/scored.jsonl"
	python3 - "$BATS_TEST_TMPDIR/scored.jsonl" "$AGENT_LOG" <<'PY'
import glob, json, sys
r = json.loads(open(sys.argv[1]).read())
log = json.load(open(glob.glob(sys.argv[2] + "/*.json")[0]))
probe, k = log["probe"], log["k"]
assert log["a"]["choices"][0]["finish_reason"] == "stop", log["a"]
resp, turns, mask = r["response"], r["turns"], r["loss_mask"]
# turn 1: the greedy tokens up to the stop string, which was sampled; then "xy"
# (the written-back stop string is not tokenized again); then turn 2's tokens
assert turns[:2] == [0, k + 1] and resp[:k + 1] == probe[:k + 1], (turns, resp, probe, k)
assert resp[k + 1:k + 3] == [ord("x"), ord("y")] and mask[k + 1:k + 3] == [0, 0], (resp, mask)
assert turns[2:] == [k + 3, len(resp)] and resp[k + 3:] == log["ids_b"], (turns, resp, log["ids_b"])
n = 0
for lp, ref, m in zip(r["logprobs"], r["ref_logprobs"], mask):
    if m:
        assert abs(lp - ref) < 1e-4, (lp, ref)
        n += 1
assert n == sum(mask) == k + 1 + len(log["ids_b"]), n
print("ok")
PY
}

@test "--agent: a reward on stdout; agents that fail, hang, exit without a reward: records with env_error, groups whole" {
	printf '%s\n' '{"prompt":"ab","mode":"stdout"}' '{"prompt":"cd","mode":"fail"}' '{"prompt":"ef","mode":"hang"}' \
	    '{"prompt":"gh","mode":"none"}' '{"prompt":"ij","mode":"nocall"}' > "$TD/f.jsonl"
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" \
	    --agent-timeout 3 --agents 5 --jsonl "$TD/f.jsonl"
	[[ "$stderr" == *"5 runs, 1 with a reward, 4 failed"* ]]
	[[ "$stderr" == *"it exited with status 3"* ]]
	[[ "$stderr" == *"--agent-timeout 3 s"* ]]
	[[ "$stderr" == *"exited without a reward"* ]]
	printf '%s\n' "$output" > "$BATS_TEST_TMPDIR/out.jsonl"
	# the hung agent was killed with its process group
	pid=$(cat "$AGENT_LOG"/*.pid)
	! kill -0 "$pid" 2>/dev/null
	python3 - "$BATS_TEST_TMPDIR/out.jsonl" <<'PY'
import json, sys
recs = {json.loads(l)["prompt_text"][:2]: json.loads(l) for l in open(sys.argv[1]) if l.strip()}
assert sorted(recs) == ["ab", "cd", "ef", "gh", "ij"], sorted(recs)
assert recs["ab"]["reward"] == 0.25 and "env_error" not in recs["ab"]
want = {"cd": "status 3", "ef": "--agent-timeout", "gh": "without a reward", "ij": "status 5"}
for k, w in want.items():
    r = recs[k]
    assert "reward" not in r and w in r["env_error"] and r["finish"] == "abort", r
    assert r["group_size"] == 1 and r["meta"]["end"] == "agent_error", r
# the agent that never called: the line's prompt, an empty response
assert recs["ij"]["response"] == [] and recs["ij"]["meta"]["calls"] == 0, recs["ij"]
assert len(recs["cd"]["response"]) > 0 and recs["cd"]["meta"]["calls"] == 1
print("ok")
PY
}

@test "--agent: a call after the reward is refused (409); stdin; a command that never rewards, a bad line, no input, no broker: exit 1" {
	printf '%s\n' '{"prompt":"ab","mode":"after"}' > "$TD/a.jsonl"
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" --jsonl "$TD/a.jsonl"
	[ "$(jq -s length <<<"$output")" = 1 ]
	[ "$(jq .after_status "$AGENT_LOG"/*.json)" = 409 ]
	# prompt lines from stdin, as generation reads them
	run -0 --separate-stderr sh -c "rl-rollout serve -m '$TD/m0' --listen 127.0.0.1:0 --agent '$AGENT' --jsonl < '$TD/a.jsonl'"
	[ "$(jq -s length <<<"$output")" = 1 ]
	run -1 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" --jsonl "$TD/none.jsonl"
	[[ "$stderr" == *"cannot open '$TD/none.jsonl'"* ]]
	run -1 --separate-stderr timeout -k 20 30 rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" \
	    --queue tcp://127.0.0.1:1 --broker-timeout 1 --jsonl
	[[ "$stderr" == *"no reply from the broker"* ]]
	run -1 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "exit 0" --jsonl "$TD/a.jsonl"
	[[ "$stderr" == *"no run of 'exit 0' ended with a reward"* ]]
	# a bad prompt line: what runs finishes, then the run fails naming the line
	printf '%s\n' '{"prompt":"ab"}' 'not json' > "$TD/bad.jsonl"
	run -1 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" --jsonl "$TD/bad.jsonl"
	[[ "$stderr" == *"line 2"* ]]
}

@test "--agent --queue: leased prompt lines, each group put once as scored for the trainers" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -t 30
	url="tcp://127.0.0.1:$DPORT"
	printf '%s\n' '{"prompt":"ab","reward":1}' '{"prompt":"cd","reward":2}' '{"prompt":"ef","reward":3}' > "$TD/q.jsonl"
	rl-queue put -q "$url" "$TD/q.jsonl"
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" -n 2 \
	    --queue "$url" --idle-exit 1 --jsonl
	[[ "$stderr" == *"6 runs, 6 with a reward"* ]]
	[ -z "$output" ]
	# a second server finds nothing left to lease
	run -0 --separate-stderr rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" -n 2 \
	    --queue "$url" --idle-exit 1 --jsonl
	[[ "$stderr" != *"runs,"* ]]
	rl-queue get "$url" -s reward -n 100 --release > "$BATS_TEST_TMPDIR/gen.jsonl"
	[ ! -s "$BATS_TEST_TMPDIR/gen.jsonl" ]
	rl-queue get "$url" -s train -n 100 --release > "$BATS_TEST_TMPDIR/g.jsonl"
	python3 - "$BATS_TEST_TMPDIR/g.jsonl" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 6, len(recs)
assert len({r["id"] for r in recs}) == 6
groups = collections.Counter(r["group"] for r in recs)
assert sorted(groups.values()) == [2, 2, 2], groups
for r in recs:
    want = {"ab": 1, "cd": 2, "ef": 3}[r["meta"]["episode_id"] and r["prompt_text"][:2]]
    assert abs(r["reward"] - (want + r["index"] / 10)) < 1e-6, r
print("ok")
PY
}

@test "--agent --queue: a server stopped mid-group hands the group back; the next one delivers it, each group once" {
	on_free_port 'rl-queue stat --timeout 0.2 tcp://127.0.0.1:@PORT@' rl-queue serve -q -l tcp://127.0.0.1:@PORT@ -t 600
	url="tcp://127.0.0.1:$DPORT"
	printf '%s\n' '{"prompt":"ab","reward":1}' '{"prompt":"cd","reward":2,"mode":"hang"}' > "$TD/h.jsonl"
	rl-queue put -q "$url" "$TD/h.jsonl"
	rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 --agent "$AGENT" -n 2 --queue "$url" --jsonl \
	    > "$BATS_TEST_TMPDIR/s1.out" 2> "$BATS_TEST_TMPDIR/s1.err" &
	spid=$!
	PIDS="$PIDS $spid"
	# both runs of "cd" hang; "ab"'s group is put
	for _ in $(seq 300); do
		[ "$(ls "$AGENT_LOG"/*.pid 2>/dev/null | wc -l)" = 2 ] && [ "$(grep -l '"reward_status": 200' "$AGENT_LOG"/*.json 2>/dev/null | wc -l)" = 2 ] && break
		sleep 0.1
	done
	kill -TERM "$spid"
	wait "$spid" || true
	for f in "$AGENT_LOG"/*.pid; do ! kill -0 "$(cat "$f")" 2>/dev/null; done
	# "cd" is leased again at once (its lease would last 600 s), and completed this time
	AGENT_MODE=post run -0 --separate-stderr timeout -k 20 60 rl-rollout serve -m "$TD/m0" --listen 127.0.0.1:0 \
	    --agent "$AGENT" -n 2 --queue "$url" --idle-exit 1 --jsonl
	[[ "$stderr" == *"2 runs, 2 with a reward"* ]]
	rl-queue get "$url" -s train -n 100 --release > "$BATS_TEST_TMPDIR/g.jsonl"
	python3 - "$BATS_TEST_TMPDIR/g.jsonl" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 4, [(r["prompt_text"], r.get("reward")) for r in recs]
by = collections.defaultdict(list)
for r in recs:
    by[r["prompt_text"][:2]].append(r)
assert sorted(by) == ["ab", "cd"] and all(len(v) == 2 for v in by.values()), by.keys()
for k, want in (("ab", 1), ("cd", 2)):
    assert sorted(r["index"] for r in by[k]) == [0, 1]
    for r in by[k]:
        assert abs(r["reward"] - (want + r["index"] / 10)) < 1e-6 and "env_error" not in r, r
print("ok")
PY
}

@test "serve --agent: bad options are usage errors" {
	run -2 rl-rollout serve -m "$TD/m0" "$TD/p.jsonl"
	assert_output --partial "prompt lines are for --agent CMD"
	run -2 rl-rollout serve -m "$TD/m0" -n 2
	assert_output --partial "-n is for --agent CMD"
	run -2 rl-rollout serve -m "$TD/m0" --agent "$AGENT" --agents 0
	assert_output --partial "--agents"
	run -2 rl-rollout serve -m "$TD/m0" --agent "$AGENT" --idle-exit 1
	assert_output --partial "--idle-exit is for --queue"
	run -2 rl-rollout serve -m "$TD/m0" --idle-exit 1
	assert_output --partial "--idle-exit is for --agent CMD"
	run -2 rl-rollout serve -m "$TD/m0" --agent ""
	assert_output --partial "--agent: an empty command"
	run -2 rl-rollout serve -m "$TD/m0" --agent "$AGENT" --queue tcp://127.0.0.1:1 "$TD/p.jsonl"
	assert_output --partial "--queue leases the prompt lines"
}

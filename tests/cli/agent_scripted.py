#!/usr/bin/env python3
"""A scripted agent for rl-rollout-serve-agent.bats (stdlib only).

Writes what it was given (its environment and its stdin) to
$AGENT_LOG/<episode id>.json, then acts as $AGENT_MODE or the prompt line's
"mode" says:
  post     one call, then POST the reward (the line's "reward" + index / 10)
  slow     one call, sleep the line's "sleep" seconds, then POST the reward
  twice    two calls (the second continues the first, stop string written
           back), then POST the reward
  stdout   one call, then print {"reward": 0.25} as its last stdout line
  fail     one call, then exit 3
  hang     one call, write its pid to $AGENT_LOG/<id>.pid, sleep
  none     one call, exit 0 without a reward
  nocall   exit 5 before any call
  after    one call, POST the reward, call again and log that call's status
  stopback a greedy probe outside the episode picks a stop string the greedy
           answer reaches; the episode's first call stops on it, the second
           writes it back followed by "xy"; the calls' token ids are logged
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

base = os.environ["OPENAI_BASE_URL"].rstrip("/")
root = base[:-3] if base.endswith("/v1") else base
ep = os.environ["RL_EPISODE_ID"]
stdin = sys.stdin.readline()
line = json.loads(stdin)
log = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "RL_EPISODE_ID",
                                      "RL_EPISODE_INDEX", "RL_PROMPT")}
log["stdin"] = stdin
log["texts"] = []
path = os.path.join(os.environ["AGENT_LOG"], ep)


def save():
    with open(path + ".json", "w") as f:
        json.dump(log, f)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        "X-Episode-Id": ep})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def call(prompt):
    st, out = post(base + "/completions", {"model": os.environ["OPENAI_MODEL"], "prompt": prompt,
                                           "max_tokens": 4, "temperature": 1.0, "stop": ["</t>"]})
    assert st == 200, (st, out)
    log["texts"].append(out["choices"][0]["text"])
    save()
    return out["choices"][0]["text"]


mode = os.environ.get("AGENT_MODE") or line.get("mode", "post")


def ids(out):
    return [int(t.split(":")[1]) for t in out["choices"][0]["logprobs"]["tokens"]]


if mode == "stopback":
    body = {"model": os.environ["OPENAI_MODEL"], "prompt": line["prompt"], "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    req = urllib.request.Request(base + "/completions", data=json.dumps(dict(body, max_tokens=16)).encode(),
                                 headers={"Content-Type": "application/json"})
    probe = ids(json.load(urllib.request.urlopen(req, timeout=60)))
    k = next(i for i in range(1, len(probe)) if 33 <= probe[i] <= 126)
    stop = chr(probe[k])
    st, a = post(base + "/completions", dict(body, max_tokens=16, stop=[stop]))
    st2, b = post(base + "/completions", dict(body, max_tokens=3, prompt=line["prompt"] + a["choices"][0]["text"] + stop + "xy"))
    assert st == st2 == 200, (a, b)
    log.update(probe=probe, k=k, a=a, b=b, ids_b=ids(b))
    st, out = post(root + "/rl/episodes/%s/reward" % ep, {"reward": 1.0})
    log["reward_status"] = st
    save()
    sys.exit(0)
reward = float(line.get("reward", 0)) + int(os.environ["RL_EPISODE_INDEX"]) / 10
save()
if mode == "nocall":
    sys.exit(5)
text = call(line["prompt"])
if mode == "twice":
    call(line["prompt"] + text + "</t>more")
if mode == "slow":
    time.sleep(float(line.get("sleep", 3)))
if mode in ("post", "twice", "after", "slow"):
    st, out = post(root + "/rl/episodes/%s/reward" % ep, {"reward": reward})
    log["reward_status"] = st
    log["reward_answer"] = out
    save()
if mode == "after":
    st, out = post(base + "/completions", {"model": os.environ["OPENAI_MODEL"], "prompt": "again", "max_tokens": 2})
    log["after_status"] = st
    save()
elif mode == "stdout":
    print("some output")
    print(json.dumps({"reward": 0.25}))
elif mode == "fail":
    sys.exit(3)
elif mode == "hang":
    with open(path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(100)

#!/usr/bin/env python3
"""The calculator task of pipelines/agent as an OpenAI-API agent, standard
library only (urllib): run by `rl-rollout serve --agent`, one process per
episode.

From its environment: OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL,
RL_EPISODE_ID; the prompt line ({"prompt": "123+456=", "a": 123, "b": 456})
on stdin.  Each turn is a POST /v1/completions of the text so far with the
header X-Episode-Id; a turn that opens <calc>EXPR (stopped at "</calc>") gets
the result appended, "</calc>" and all, as pipelines/agent/calc_env.py
answers it; a turn with "ANSWER: N" ends the episode, reward 1 when N = a + b.
The reward is posted to /rl/episodes/ID/reward.  AGENT_TEMPERATURE (default:
the server's) and AGENT_MAX_TURNS (default 3) tune it.
"""
import json
import os
import re
import sys
import urllib.error
import urllib.request

BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")
# the reward route is the server's, beside /v1
ROOT = BASE[:-3] if BASE.endswith("/v1") else BASE
KEY = os.environ.get("OPENAI_API_KEY", "")
MODEL = os.environ.get("OPENAI_MODEL", "policy")
EPISODE = os.environ["RL_EPISODE_ID"]
CALC = re.compile(r"<calc>\s*([-+*0-9 ()]{1,64}?)\s*$")
ANSWER = re.compile(r"ANSWER:\s*(-?\d+)")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + KEY, "X-Episode-Id": EPISODE})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def evaluate(expr):
    # digits, + - * ( ) and spaces only (checked by CALC): nothing else can run
    try:
        return str(eval(expr, {"__builtins__": {}}, {}))
    except Exception:
        return "error"


def main():
    line = json.loads(sys.stdin.readline())
    want = int(line["a"]) + int(line["b"])
    text = line["prompt"]
    reward = 0.0
    body = {"model": MODEL, "max_tokens": 24, "stop": ["</calc>", "\n"]}
    if os.environ.get("AGENT_TEMPERATURE"):
        body["temperature"] = float(os.environ["AGENT_TEMPERATURE"])
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "3"))):
        try:
            out = post(BASE + "/completions", dict(body, prompt=text))
        except urllib.error.HTTPError as e:
            # the context is full (400): the episode ends here, unrewarded by the task
            sys.stderr.write("calc_agent: %s\n" % e.read().decode(errors="replace")[:300])
            break
        choice = out["choices"][0]
        turn = choice["text"]
        m = ANSWER.search(turn)
        if m:
            reward = 1.0 if int(m.group(1)) == want else 0.0
            break
        c = CALC.search(turn)
        if not c or choice["finish_reason"] != "stop":
            break
        text += turn + "</calc>" + evaluate(c.group(1))
    post(ROOT + "/rl/episodes/%s/reward" % EPISODE, {"reward": reward})


if __name__ == "__main__":
    main()

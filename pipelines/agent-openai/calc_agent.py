#!/usr/bin/env python3
"""The calculator task of pipelines/agent as an OpenAI-API agent, standard
library only (urllib): run by `rl-rollout serve --agent`, one process per
episode.

From its environment: OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL,
RL_EPISODE_ID; the prompt line ({"prompt": "123+456=", "a": 123, "b": 456})
on stdin.  Each turn is a POST /v1/completions of the text so far with the
header X-Episode-Id, and each turn is judged as pipelines/agent/calc_env.py
judges it (the turn's text with the stop string it ended on, read from the
answer's log-prob tokens): "ANSWER: N" ends the episode, reward 1 when
N = a + b; <calc>EXPR</calc> gets the value appended; anything else the
reminder.  The reward is posted to /rl/episodes/ID/reward.  AGENT_TEMPERATURE
(default: the server's), AGENT_MAX_TURNS (3) and AGENT_MAX_EPISODE_TOKENS (72:
tokens after the first prompt, calls' answers and the agent's text) tune it.
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
CALL = re.compile(r"<calc>\s*([-+*0-9 ()]{1,64}?)\s*</calc>")
ANSWER = re.compile(r"ANSWER:\s*(-?\d+)")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + KEY, "X-Episode-Id": EPISODE})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def evaluate(expr):
    # digits, + - * ( ) and spaces only (checked by CALL): nothing else can run
    try:
        return str(eval(expr, {"__builtins__": {}}, {}))
    except Exception:
        return "error"


def main():
    line = json.loads(sys.stdin.readline())
    want = int(line["a"]) + int(line["b"])
    text = line["prompt"]
    reward = 0.0
    budget = int(os.environ.get("AGENT_MAX_EPISODE_TOKENS", "72"))
    # logprobs: the answer's tokens, the stop string among them, tell which stop ended it
    body = {"model": MODEL, "stop": ["</calc>", "\n"], "logprobs": 0}
    if os.environ.get("AGENT_TEMPERATURE"):
        body["temperature"] = float(os.environ["AGENT_TEMPERATURE"])
    first = None
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "3"))):
        # the episode's tokens after the first prompt stay within the budget
        used = 0 if first is None else seen - first
        if used >= budget:
            break
        try:
            out = post(BASE + "/completions", dict(body, prompt=text, max_tokens=min(24, budget - used)))
        except urllib.error.HTTPError as e:
            # the context is full (400): the episode ends here, unrewarded by the task
            sys.stderr.write("calc_agent: %s\n" % e.read().decode(errors="replace")[:300])
            break
        choice = out["choices"][0]
        seen = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
        first = out["usage"]["prompt_tokens"] if first is None else first
        # the turn as calc_env.py sees it: the text and the stop string it ended on
        sampled = "".join(choice["logprobs"]["tokens"])
        stop = next((x for x in ("</calc>", "\n") if sampled[len(choice["text"]):].startswith(x)), "")
        turn = choice["text"] + stop
        m = ANSWER.search(turn)
        if m:
            reward = 1.0 if int(m.group(1)) == want else 0.0
            break
        c = CALL.search(turn)
        obs = evaluate(c.group(1)) if c else "Use <calc>EXPR</calc> or write ANSWER: N."
        text += turn + obs
    post(ROOT + "/rl/episodes/%s/reward" % EPISODE, {"reward": reward})


if __name__ == "__main__":
    main()

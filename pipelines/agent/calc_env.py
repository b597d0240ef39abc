#!/usr/bin/env python3
"""A calculator-tool environment for rl-rollout --env (rl-env(5)).

The prompt line carries the task: {"prompt": "...", "a": 123, "b": 456}.
Each model turn is either a tool call, <calc>EXPR</calc> with + - * and
integers, answered with the result as a tool observation, or a final answer,
"ANSWER: N", which ends the episode with reward 1 when N = a + b, else 0.
A turn with neither gets a reminder (reward 0).  Stateless per process apart
from the episodes it serves, so any number of processes can run.
"""
import json
import re
import sys

CALL = re.compile(r"<calc>\s*([-+*0-9 ()]{1,64}?)\s*</calc>")
ANSWER = re.compile(r"ANSWER:\s*(-?\d+)")
episodes = {}


def evaluate(expr):
    # digits, + - * ( ) and spaces only (checked by CALL): nothing else can run
    try:
        return str(eval(expr, {"__builtins__": {}}, {}))
    except Exception:
        return "error"


def answer(req):
    op = req.get("op")
    if op == "reset":
        line = req["line"]
        episodes[req["id"]] = int(line["a"]) + int(line["b"])
        return {"observation": "", "done": False}
    if op == "step":
        want = episodes.get(req["id"])
        if want is None:
            return {"error": "step for an episode that was never reset"}
        text = req["action"]
        m = ANSWER.search(text)
        if m:
            del episodes[req["id"]]
            return {"observation": "", "reward": 1.0 if int(m.group(1)) == want else 0.0, "done": True}
        c = CALL.search(text)
        if c:
            return {"observation": evaluate(c.group(1)), "role": "tool", "reward": 0.0, "done": False}
        return {"observation": "Use <calc>EXPR</calc> or write ANSWER: N.", "reward": 0.0, "done": False}
    return {"error": "unknown op %r" % op}


for raw in sys.stdin:
    try:
        out = answer(json.loads(raw))
    except (ValueError, KeyError, TypeError) as e:
        out = {"error": "bad request: %s" % e}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()

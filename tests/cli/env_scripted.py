#!/usr/bin/env python3
# tests/cli/env_scripted.py — a scripted environment for rl-rollout --env
# (rl-env(5)): the prompt line's "mode" says how it behaves for that episode.
#   ok (default): reset -> the line's "first" (default "<"); step k -> "[k]" (reward k / 10), done after
#                 the line's "turns" (default 3) steps
#   tool:     like ok, observations answered with "role": "tool"
#   crash:    exits at the first step;   hang: sleeps at the first step
#   garbage:  answers the first step with a line that is not JSON
#   flood:    answers the first step with a 2 MiB line
#   extra:    answers the reset with two lines
#   error:    answers the first step with {"error": "unknown op frobnicate"}
#   nofield:  answers the first step without "done"
#   msgs:     chat turns as "messages": reset -> []; step k -> the line's "msgs" with "%d" in each content
#             replaced by k (reward k / 10, done after "turns" steps)
#   raw:      answers the first step with the line's "answer", as it is
#   rawreset: answers the reset with the line's "answer", as it is
# A line's "stop" is passed on in the reset's answer; its "sleep" (seconds) is slept before each step's
# answer (a slow tool call).
# With RL_ENV_PIDS set, appends its pid to that file when it starts; with
# RL_ENV_LOG set, appends each line it reads to that file.
import json, os, sys, time

if os.environ.get("RL_ENV_PIDS"):
    with open(os.environ["RL_ENV_PIDS"], "a") as f:
        f.write("%d\n" % os.getpid())
eps = {}
ep_line = {}
def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    if os.environ.get("RL_ENV_LOG"):
        with open(os.environ["RL_ENV_LOG"], "a") as f:
            f.write(line)
    m = json.loads(line)
    if m["op"] == "reset":
        eps[m["id"]] = [m["line"].get("mode", "ok"), 0, m["line"].get("turns", 3)]
        ep_line[m["id"]] = m["line"]
        ans = {"observation": m["line"].get("first", "<"), "done": False}
        if eps[m["id"]][0] == "msgs":
            ans = {"messages": [], "done": False}
        if eps[m["id"]][0] == "rawreset":
            ans = m["line"]["answer"]
        if "stop" in m["line"]:  # the episode's own stop strings
            ans["stop"] = m["line"]["stop"]
        first = json.dumps(ans) + "\n"
        if eps[m["id"]][0] == "extra":  # both lines in one write: they arrive together
            first += json.dumps({"observation": "again", "done": False}) + "\n"
        sys.stdout.write(first)
        sys.stdout.flush()
        continue
    if m["op"] != "step":
        say({"error": "unknown op " + m["op"]})
        continue
    ep = eps[m["id"]]
    ep[1] += 1
    time.sleep(ep_line[m["id"]].get("sleep", 0))
    mode = ep[0]
    if mode == "crash":
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    if mode == "garbage":
        sys.stdout.write("this is not json\n"); sys.stdout.flush(); continue
    if mode == "flood":
        sys.stdout.write("x" * (2 << 20) + "\n"); sys.stdout.flush(); continue
    if mode == "error":
        say({"error": "unknown op frobnicate"}); continue
    if mode == "nofield":
        say({"observation": "x"}); continue
    if mode == "raw":
        say(ep_line[m["id"]]["answer"]); continue
    if mode == "msgs":
        say({"messages": [{"role": x["role"], "content": x["content"].replace("%d", str(ep[1]))}
                          for x in ep_line[m["id"]]["msgs"]], "reward": ep[1] / 10, "done": ep[1] >= ep[2]})
        continue
    out = {"observation": "[%d]" % ep[1], "reward": ep[1] / 10, "done": ep[1] >= ep[2]}
    if mode == "tool":
        out["role"] = "tool"
    say(out)

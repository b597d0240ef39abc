"""A stand-in for rl-train in the pipe wiring, for rl-rollout-autok.bats:
reads rl-rollout's JSONL records on stdin, and for every BATCH groups
"trains" (sleeps the step's time), publishes OUT/step-N (a link to the
model directory) and moves OUT/latest to it, then appends the step's line
to the metrics file as rl-train writes it: "step", "actor/ppo_kl",
"timing_s/gen" (the time it waited for the step's records, measured) and
"timing_s/step".  The step's time and ppo_kl come from a plan: lines
"FIRST_STEP TRAIN_SECONDS PPO_KL" (the last one whose FIRST_STEP <= step);
TRAIN_SECONDS "xF" is F times the step's measured wait for its records, so
that a trainer slower than the generator stays so on a machine of any speed.
Each record's group, version and the step it went into are written to
OUT/seen.jsonl for the test's checks.

usage: fake_trainer.py MODEL_DIR OUT METRICS BATCH PLAN
"""
import json
import os
import sys
import time

model, out, metrics, batch, plan_path = sys.argv[1:6]
batch = int(batch)
plan = [l.split() for l in open(plan_path) if l.strip()]
os.makedirs(out, exist_ok=True)
seen = open(os.path.join(out, "seen.jsonl"), "w")
groups = {}
step, done_groups, t_wait0 = 0, 0, time.monotonic()
for line in sys.stdin:
    r = json.loads(line)
    g = r["group"]
    groups.setdefault(g, []).append(r)
    if len(groups[g]) < r["group_size"]:
        continue
    for x in groups.pop(g):
        seen.write(json.dumps({"group": g, "version": x["version"], "step": step}) + "\n")
    seen.flush()
    done_groups += 1
    if done_groups % batch:
        continue
    waited = time.monotonic() - t_wait0
    train_s, kl = 0.0, 0.0
    for first, t, k in plan:
        if step + 1 >= int(first):
            train_s = waited * float(t[1:]) if t.startswith("x") else float(t)
            kl = float(k)
    time.sleep(train_s)
    step += 1
    name = "step-%08d" % step
    os.symlink(os.path.abspath(model), os.path.join(out, name))
    tmp = os.path.join(out, ".latest.tmp")
    os.symlink(name, tmp)
    os.replace(tmp, os.path.join(out, "latest"))
    with open(metrics, "a") as m:
        m.write(json.dumps({"step": step, "actor/ppo_kl": kl, "timing_s/gen": waited,
                            "timing_s/step": waited + train_s}) + "\n")
    t_wait0 = time.monotonic()

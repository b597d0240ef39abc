#!/usr/bin/env python3
"""The data of pipelines/agent/demo.sh and pipelines/agent-openai/demo.sh:
3-digit sums "a+b=", held-out problems disjoint from the others.

usage: make_data.py OUT_DIR SEED SFT_STEPS SFT_BATCH RL_STEPS PROMPTS TEST_N
Writes OUT_DIR/test.jsonl and OUT_DIR/prompts.jsonl (prompt lines
{"prompt": "a+b=", "a": a, "b": b}) and OUT_DIR/sft.jsonl (a warm start: half
the answers direct, "ANSWER: s\\n", half through the calculator,
"<calc>a+b</calc>s" then "ANSWER: s\\n").
"""
import json
import random
import sys

out, seed, sft_steps, sft_batch, rl_steps, prompts, test_n = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(seed)


def pair():
    return rng.randint(100, 999), rng.randint(100, 999)


test, seen = [], set()
while len(test) < test_n:
    a, b = pair()
    if (a, b) not in seen:
        seen.add((a, b))
        test.append((a, b))


def train_pair():
    while True:
        a, b = pair()
        if (a, b) not in seen:
            return a, b


def line(a, b):
    return json.dumps({"prompt": "%d+%d=" % (a, b), "a": a, "b": b})


with open(out + "/test.jsonl", "w") as f:
    for a, b in test:
        f.write(line(a, b) + "\n")
with open(out + "/prompts.jsonl", "w") as f:
    for _ in range(rl_steps * prompts):
        f.write(line(*train_pair()) + "\n")
with open(out + "/sft.jsonl", "w") as f:
    for i in range(sft_steps * sft_batch):
        a, b = train_pair()
        resp = ("<calc>%d+%d</calc>%d" % (a, b, a + b) if i % 2 else "") + "ANSWER: %d\n" % (a + b)
        f.write(json.dumps({"id": i + 1, "prompt_text": "%d+%d=" % (a, b), "response_text": resp}) + "\n")

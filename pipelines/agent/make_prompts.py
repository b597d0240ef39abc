#!/usr/bin/env python3
"""N calculator prompt lines (default 16) for calc_env.py / calc_env.sh."""
import json
import random
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
for _ in range(n):
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    print(json.dumps({"prompt": "What is %d + %d? Use <calc>X+Y</calc>, then write ANSWER: N." % (a, b),
                      "a": a, "b": b}))

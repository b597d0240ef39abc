#!/usr/bin/python3
"""bench/reward_arith_learn.py — is the `arith` task learnable as the demo needs?

Trains a ~0.8M-parameter byte-level transformer (PyTorch, CPU, one thread) on
prompts from `rl-reward gen-arith --split train` with plain next-token loss on
the answer, and every EVAL_EVERY steps measures greedy held-out accuracy on
`--split test` prompts (a disjoint set of problems) by writing the responses
as trajectory JSONL and scoring them with `rl-reward --task arith`: the same
verifier the demo's RL stage uses.  Prints JSON lines:
  {"bench":"reward_arith_learn","step":..,"seconds":..,"loss":..,"test_acc":..}
This is supervised training only: it shows how accuracy grows with training
time (so the demo can pick an SFT budget that leaves it at ~20%), not RL.

Usage: /usr/bin/python3 bench/reward_arith_learn.py [--digits 2] [--seconds 150]
       [--dim 128 --layers 4 (0.8M parameters)] [--batch 128] [--reverse]
Needs Debian's python3-torch and build/bin/rl-reward.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--digits", type=int, default=2)
ap.add_argument("--ops", default="+")
ap.add_argument("--seconds", type=float, default=150)
ap.add_argument("--eval-every", type=int, default=100)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--reverse", action="store_true")
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--bin", default=os.environ.get("RL_BUILD", "build") + "/bin/rl-reward")
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)


def gen(split, n, seed):
    cmd = [args.bin, "gen-arith", "--n", str(n), "--seed", str(seed), "--digits", str(args.digits),
           "--ops", args.ops, "--split", split] + (["--reverse"] if args.reverse else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines()]


train = gen("train", 50000, 1)
test = gen("test", 400, 2)
VOCAB = "\x000123456789+-*=\n"
stoi = {c: i for i, c in enumerate(VOCAB)}
T = max(len(p["prompt"]) + len(p["answer"]) + 1 for p in train + test)


def encode(p):
    s = p["prompt"] + p["answer"] + "\n"
    ids = [stoi[c] for c in s] + [0] * (T - len(s))
    mask = [0] * T
    for i in range(len(p["prompt"]) - 1, len(s) - 1):  # predict the answer and the newline
        mask[i] = 1
    return ids, mask


X = torch.tensor([encode(p)[0] for p in train])
M = torch.tensor([encode(p)[1] for p in train], dtype=torch.float32)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, h, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.att(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class Model(nn.Module):
    def __init__(self, d=128, h=4, L=4):
        super().__init__()
        self.tok = nn.Embedding(len(VOCAB), d)
        self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(L)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, len(VOCAB), bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = self.tok(idx) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


model = Model(d=args.dim, L=args.layers)
nparams = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)


@torch.no_grad()
def evaluate():
    model.eval()
    P = [p["prompt"] for p in test]
    L = max(len(p) for p in P)
    # left-aligned prompts of equal length per group: decode group by group
    resp = [""] * len(P)
    by_len = {}
    for i, p in enumerate(P):
        by_len.setdefault(len(p), []).append(i)
    for n, idxs in by_len.items():
        seq = torch.tensor([[stoi[c] for c in P[i]] for i in idxs])
        done = torch.zeros(len(idxs), dtype=torch.bool)
        for _ in range(T - n):
            nxt = model(seq)[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
            done |= nxt == stoi["\n"]
            if done.all():
                break
        for j, i in enumerate(idxs):
            resp[i] = "".join(VOCAB[k] for k in seq[j, n:].tolist()).split("\n")[0] + "\n"
    model.train()
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, p in enumerate(test):
            f.write(json.dumps({"id": i, "prompt_text": p["prompt"], "response_text": resp[i],
                                "meta": {"answer": p["answer"]}}) + "\n")
        name = f.name
    r = subprocess.run([args.bin, "--task", "arith", "--jsonl", name], capture_output=True, text=True, check=True)
    os.unlink(name)
    rewards = [json.loads(l)["reward"] for l in r.stdout.splitlines()]
    return sum(rewards) / len(rewards)


print(json.dumps({"bench": "reward_arith_learn", "params": nparams, "dim": args.dim, "layers": args.layers,
                  "batch": args.batch, "train_problems": len(train),
                  "test_problems": len(test), "digits": args.digits, "ops": args.ops, "reverse": args.reverse}))
t0 = time.time()
step = 0
g = torch.Generator().manual_seed(0)
while True:
    i = torch.randint(0, len(X), (args.batch,), generator=g)
    x, m = X[i], M[i]
    logits = model(x[:, :-1])
    loss = (F.cross_entropy(logits.reshape(-1, len(VOCAB)), x[:, 1:].reshape(-1), reduction="none")
            * m[:, :-1].reshape(-1)).sum() / m[:, :-1].sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % args.eval_every == 0:
        acc = evaluate()
        el = time.time() - t0
        print(json.dumps({"bench": "reward_arith_learn", "step": step, "seconds": round(el, 1),
                          "loss": round(loss.item(), 4), "test_acc": round(acc, 4)}), flush=True)
        if el > args.seconds or acc >= 0.98:
            break

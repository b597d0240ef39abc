#!/usr/bin/python3
"""model_cpu_torch.py — the PyTorch half of bench/model_cpu: the same Qwen2-style
model (RMSNorm, RoPE, GQA with q/k/v biases, SwiGLU, tied head) written as
plain torch modules the way HF's eager implementation computes it, timed on the
same shapes: training forward+backward (log-softmax over the vocabulary, gather,
entropy, as the C model computes), the AdamW step, prefill and batched decode
with a KV cache.  Run by build/bench/model_cpu; prints JSON lines.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for k, v in [("layers", 10), ("hidden", 256), ("heads", 8), ("kv-heads", 4), ("ffn", 768), ("vocab", 8192),
             ("batch", 4), ("seq", 256), ("steps", 3), ("decode-batch", 16), ("prompt", 32),
             ("decode-tokens", 32)]:
    ap.add_argument("--" + k, type=int, default=v)
a = ap.parse_args()
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", len(os.sched_getaffinity(0)))))
torch.manual_seed(0)
C, NH, NKV, HD, H, V = a.hidden, a.heads, a.kv_heads, a.hidden // a.heads, a.ffn, a.vocab


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(T):
    inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))
    ang = torch.arange(T).float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


def rot(x, cos, sin):
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.Parameter(torch.ones(C)), torch.nn.Parameter(torch.ones(C))
        self.q = torch.nn.Linear(C, NH * HD)
        self.k = torch.nn.Linear(C, NKV * HD)
        self.v = torch.nn.Linear(C, NKV * HD)
        self.o = torch.nn.Linear(NH * HD, C, bias=False)
        self.gate = torch.nn.Linear(C, H, bias=False)
        self.up = torch.nn.Linear(C, H, bias=False)
        self.down = torch.nn.Linear(H, C, bias=False)

    def forward(self, x, cos, sin, cache=None, start=0):
        Bn, Tn, _ = x.shape
        h = rms(x, self.ln1)
        q = self.q(h).view(Bn, Tn, NH, HD).transpose(1, 2)
        k = self.k(h).view(Bn, Tn, NKV, HD).transpose(1, 2)
        v = self.v(h).view(Bn, Tn, NKV, HD).transpose(1, 2)
        q, k = rot(q, cos, sin), rot(k, cos, sin)
        if cache is not None:
            cache[0][:, :, start:start + Tn] = k
            cache[1][:, :, start:start + Tn] = v
            k, v = cache[0][:, :, :start + Tn], cache[1][:, :, :start + Tn]
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(HD)
        if Tn > 1:
            S = k.shape[2]
            mask = torch.ones(Tn, S, dtype=torch.bool).triu(S - Tn + 1)
            s = s.masked_fill(mask, float("-inf"))
        att = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(Bn, Tn, NH * HD)
        x = x + self.o(att)
        h = rms(x, self.ln2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, C)
        self.layers = torch.nn.ModuleList([Layer() for _ in range(a.layers)])
        self.norm = torch.nn.Parameter(torch.ones(C))

    def forward(self, tok, caches=None, start=0):
        cos, sin = rope_tables(start + tok.shape[1])
        cos, sin = cos[start:], sin[start:]
        x = self.emb(tok)
        for i, l in enumerate(self.layers):
            x = l(x, cos, sin, caches[i] if caches else None, start)
        return rms(x, self.norm) @ self.emb.weight.T


m = Model()
nparams = sum(p.numel() for p in m.parameters())
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
tok = torch.randint(0, V, (a.batch, a.seq))
tgt = torch.randint(0, V, (a.batch, a.seq))
tfb = tst = 0.0
for s in range(a.steps + 1):
    t0 = time.perf_counter()
    logp = torch.log_softmax(m(tok).float(), -1)
    lp = logp.gather(-1, tgt[..., None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    loss = -lp.mean() - 0.01 * ent.mean()
    opt.zero_grad()
    loss.backward()
    t1 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    if s > 0:
        tfb += t1 - t0
        tst += time.perf_counter() - t1
N = a.batch * a.seq
print(json.dumps({"bench": "model_cpu", "impl": "torch-" + torch.__version__, "what": "train_fwd_bwd",
                  "params": nparams, "B": a.batch, "T": a.seq, "steps": a.steps,
                  "tokens_per_s": round(N * a.steps / tfb, 1), "adamw_ms": round(1e3 * tst / a.steps, 2)}),
      flush=True)

with torch.no_grad():
    DB, P, D = a.decode_batch, a.prompt, a.decode_tokens
    caches = [(torch.zeros(DB, NKV, P + D, HD), torch.zeros(DB, NKV, P + D, HD)) for _ in m.layers]
    prompt = torch.randint(0, V, (DB, P))
    t0 = time.perf_counter()
    m(prompt, caches, 0)
    tp = time.perf_counter() - t0
    nxt = torch.randint(0, V, (DB, 1))
    t0 = time.perf_counter()
    for s in range(D):
        m(nxt, caches, P + s)
    td = time.perf_counter() - t0
print(json.dumps({"bench": "model_cpu", "impl": "torch-" + torch.__version__, "what": "prefill", "batch": DB,
                  "prompt": P, "tokens_per_s": round(DB * P / tp, 1)}))
print(json.dumps({"bench": "model_cpu", "impl": "torch-" + torch.__version__, "what": "decode", "batch": DB,
                  "prompt": P, "steps": D, "tokens_per_s": round(DB * D / td, 1)}), flush=True)

#!/usr/bin/python3
# ops_cpu_torch.py — PyTorch CPU timings of the ops bench/ops_cpu times, same
# shapes, same JSON lines ("bench":"ops_cpu_torch").  Usage: ops_cpu_torch.py [REPEATS]
import json, sys, time
import torch
import torch.nn.functional as F

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.manual_seed(0)
torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", __import__("os").cpu_count())))

def best(fn):
    b = 1e30
    for _ in range(reps):
        t = time.perf_counter(); fn(); b = min(b, time.perf_counter() - t)
    return b

def report(op, shape, sec, flops):
    print(json.dumps({"bench": "ops_cpu_torch", "op": op, "shape": shape, "ms": round(sec * 1e3, 3),
                      "gflops": round(flops / sec / 1e9, 1), "threads": torch.get_num_threads()}), flush=True)

N = 2048
for C, OC in [(384, 1152), (384, 384), (384, 1536), (1536, 384), (384, 8192)]:
    x = torch.randn(N, C); w = torch.randn(OC, C); dy = torch.randn(N, OC)
    shape = f"N={N} C={C} OC={OC}"
    report("matmul_fwd", shape, best(lambda: x @ w.t()), 2.0 * N * C * OC)
    report("matmul_bwd", shape, best(lambda: (dy @ w, dy.t() @ x)), 4.0 * N * C * OC)

x = torch.randn(1, 384); w = torch.randn(8192, 384)
report("matmul_fwd", "N=1 C=384 OC=8192", best(lambda: x @ w.t()), 2.0 * 384 * 8192)

for T in (256, 1024):
    B, NH, HD = 8, 6, 64
    q = torch.randn(B, NH, T, HD, requires_grad=True); k = torch.randn(B, NH, T, HD, requires_grad=True)
    v = torch.randn(B, NH, T, HD, requires_grad=True)
    fl = 4.0 * B * NH * (T * (T + 1) / 2.0) * HD
    mask = torch.full((T, T), float("-inf")).triu(1)
    def sdpa(q, k, v):  # torch 1.13 has no F.scaled_dot_product_attention: the usual composition
        return torch.softmax(q @ k.transpose(-1, -2) / HD ** 0.5 + mask, -1) @ v
    shape = f"B={B} T={T} NH={NH} HD={HD}"
    with torch.no_grad():
        report("attn_fwd", shape, best(lambda: sdpa(q, k, v)), fl)
    def fb():
        o = sdpa(q, k, v)
        o.backward(torch.ones_like(o))
    t_fb = best(fb)
    with torch.no_grad():
        t_f = best(lambda: sdpa(q, k, v))
    report("attn_bwd", shape, max(t_fb - t_f, 1e-9), 2.5 * fl)

V = 8192
lg = torch.randn(N, V, requires_grad=True); tgt = torch.randint(0, V, (N,))
shape = f"N={N} V={V}"
def lpf():
    with torch.no_grad():
        ls = torch.log_softmax(lg, -1)
        lp = ls.gather(1, tgt[:, None]); ent = -(ls.exp() * ls).sum(-1)
    return lp, ent
report("logprob_fwd", shape, best(lpf), 0)
def lpfb():
    ls = torch.log_softmax(lg, -1)
    lp = ls.gather(1, tgt[:, None]).sum(); ent = -(ls.exp() * ls).sum()
    (lp + ent).backward()
t_fb = best(lpfb)
report("logprob_bwd", shape, max(t_fb - best(lpf), 1e-9), 0)

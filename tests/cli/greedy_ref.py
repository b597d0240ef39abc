#!/usr/bin/python3
"""greedy_ref.py — the PyTorch reference of rl-rollout's greedy generation for the
model-families bats tests.

  greedy_ref.py perturb DIR SEED   rewrite DIR's safetensors weights with random ones
                                   (matrices 0.2 N(0,1), norm weights about 1, Gemma's
                                   about 0), so that greedy choices are far from ties
  greedy_ref.py check DIR RECORDS  for each JSONL record of rl-rollout, continue its
                                   prompt ids with the float64 forward of
                                   tests/fixtures/make_fixtures.py (Llama/Mistral or
                                   Gemma 3): at temperature 0 greedily, and compare the
                                   response ids; at another, along the record's tokens;
                                   and the log-probs within 1e-4

The forward is the fixtures' restatement of transformers' modeling code, not rlpipe's.
Prints one line per record; exits 1 on any difference.
"""
import glob
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import make_fixtures as mf  # noqa: E402


def read_st(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        assert v["dtype"] == "F32", "F32 weights expected"
        out[k] = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=torch.float32).reshape(v["shape"])
    return out


def weights(d):
    p = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        p.update(read_st(f))
    return p, f


def config(d):
    """config.json with transformers' defaults for what the forward reads."""
    c = json.load(open(os.path.join(d, "config.json")))
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    if c["model_type"] == "gemma3_text":
        c.setdefault("rope_theta", 1000000.0)
        c.setdefault("rope_local_base_freq", 10000.0)
        c.setdefault("query_pre_attn_scalar", 256)
        c.setdefault("sliding_window", 4096)
        c.setdefault("tie_word_embeddings", True)
        if not c.get("layer_types"):
            pat = c.get("sliding_window_pattern", 6)
            c["layer_types"] = ["full_attention" if (i + 1) % pat == 0 else "sliding_attention"
                                for i in range(c["num_hidden_layers"])]
    else:
        c.setdefault("rope_theta", 10000.0)
        c.setdefault("tie_word_embeddings", False)
        if c["model_type"] == "mistral":
            c.setdefault("sliding_window", 4096)
    return c


def perturb(d, seed):
    torch.manual_seed(int(seed))
    c = config(d)
    p, f = weights(d)
    gemma = c["model_type"] == "gemma3_text"
    new = {}
    for n, t in p.items():
        if t.dim() == 1:
            new[n] = (0.0 if gemma else 1.0) + 0.1 * torch.randn(t.shape)
        else:
            new[n] = 0.2 * torch.randn(t.shape)
    mf.write_safetensors(f, new)


def check(d, records):
    c = config(d)
    p = {n: t.to(mf.DT) for n, t in weights(d)[0].items()}
    fwd = mf.gemma3_forward if c["model_type"] == "gemma3_text" else mf.llama_forward
    bad = 0
    for line in open(records):
        r = json.loads(line)
        ids = list(r["prompt"])
        want, lps, margin = [], [], float("inf")
        greedy = r["temperature"] == 0
        for i in range(len(r["response"])):
            with torch.no_grad():
                logits = fwd(c, p, torch.tensor(ids))[-1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            # greedy: torch's choice; sampled: the record's token, whose log-prob at the
            # record's temperature is compared
            t = int(torch.argmax(logits)) if greedy else r["response"][i]
            lps.append(float(torch.log_softmax(logits / (r["temperature"] or 1), -1)[t]))
            want.append(t)
            ids.append(t)
        dlp = max(abs(a - b) for a, b in zip(lps, r["logprobs"]))
        ok = want == r["response"] and dlp <= 1e-4
        bad += not ok
        print("%s: prompt %d tokens, %d generated, %s; torch %s, rl-rollout %s; log-prob max diff %.2g; "
              "smallest top-2 logit margin %.3g" % (c["model_type"], len(r["prompt"]), len(want),
                                                    ("same" if greedy else "followed") if ok else "DIFFERENT", want, r["response"], dlp, margin))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1] == "perturb":
        perturb(sys.argv[2], sys.argv[3])
    else:
        check(sys.argv[2], sys.argv[3])

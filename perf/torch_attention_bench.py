#!/usr/bin/env python3
"""torch_attention_bench.py — the attention op alone, bigbatch beside
PyTorch (perf/gpu_check.sh). For each T: the same random q, k, v and dout
(seeded, rounded to bf16) through `bigbatch bench attention` with cuDNN's
fused SDPA and with bigbatch's kernels, and through
torch.nn.functional.scaled_dot_product_attention (causal, bf16, PyTorch's
own choice of kernel). Each one's forward and backward median ms, and its
largest difference from a float64 reference: max |x - ref| / max |ref|,
for the output and for dqkv. One JSON line per (T, engine); an engine that
cannot run says why ("error").

  perf/torch_attention_bench.py --bigbatch "bin/bigbatch" --device cuda --seq-lens 7,70,1024
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--bigbatch", default="bin/bigbatch", help="the command that runs bigbatch (a prefix: env ... BIN)")
p.add_argument("--device", default="cuda", help="cuda (bigbatch on cuda:0) or cpu")
p.add_argument("--seq-lens", default="7,70,1024")
p.add_argument("--batch", type=int, default=8)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--d-model", type=int, default=768)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
a = p.parse_args()
dev = torch.device(a.device)
dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
B, H, C = a.batch, a.heads, a.d_model
hs = C // H


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def heads(x, which):  # (B,T,3C) -> (B,H,T,hs) of q, k or v
    T = x.shape[1]
    return x[:, :, which * C:(which + 1) * C].reshape(B, T, H, hs).transpose(1, 2)


def sdpa(q, k, v):  # PyTorch's fused SDPA (2.0 on); older ones (Debian's, for a try on the CPU): by hand
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / hs ** 0.5
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf")).softmax(-1) @ v


def rel(x, ref):
    return float((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def emit(row):
    print(json.dumps(row), flush=True)


for T in [int(t) for t in a.seq_lens.split(",")]:
    g = torch.Generator().manual_seed(T)
    qkv = (torch.rand(B, T, 3 * C, generator=g) * 2 - 1).to(dtype).float()
    dout = (torch.rand(B, T, C, generator=g) * 2 - 1).to(dtype).float()
    # the float64 reference: out and dqkv
    x = qkv.to(dev, torch.float64).requires_grad_(True)
    q, k, v = (heads(x, i) for i in range(3))
    s = (q @ k.transpose(-1, -2)) / hs ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    ref_out = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    ref_out.backward(dout.to(dev, torch.float64))
    ref_dqkv = x.grad.detach()
    ref_out = ref_out.detach()
    del x, q, k, v, s
    # PyTorch's SDPA on the same numbers
    xt = qkv.to(dev, dtype).requires_grad_(True)
    dt = dout.to(dev, dtype)
    fwd, bwd = [], []
    for step in range(a.steps + 2):
        xt.grad = None
        sync()
        t0 = time.perf_counter()
        o = sdpa(heads(xt, 0), heads(xt, 1), heads(xt, 2))
        o = o.transpose(1, 2).reshape(B, T, C)
        sync()
        t1 = time.perf_counter()
        o.backward(dt)
        sync()
        if step >= 2:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((time.perf_counter() - t1) * 1e3)
    emit({"T": T, "engine": "pytorch sdpa" if hasattr(F, "scaled_dot_product_attention") else "pytorch by hand", "forward_ms": statistics.median(fwd), "backward_ms": statistics.median(bwd),
          "out_rel_diff": rel(o.detach(), ref_out), "dqkv_rel_diff": rel(xt.grad, ref_dqkv)})
    del xt, o
    with tempfile.TemporaryDirectory() as tmp:
        qkv.numpy().astype("<f4").tofile(os.path.join(tmp, "qkv.f32"))
        dout.numpy().astype("<f4").tofile(os.path.join(tmp, "dout.f32"))
        for engine in ("cudnn", "kernels"):
            out_dir = os.path.join(tmp, engine)
            cmd = shlex.split(a.bigbatch) + ["bench", "attention", "--devices", "cuda:0" if dev.type == "cuda" else "cpu",
                                             "--batch", str(B), "--seq-len", str(T), "--heads", str(H), "--d-model",
                                             str(C), "--precision", a.precision, "--attention", engine, "--steps",
                                             str(a.steps), "--in", tmp, "--out", out_dir, "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                emit({"T": T, "engine": engine, "error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]})
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            out = torch.from_file(os.path.join(out_dir, "out.f32"), size=B * T * C, dtype=torch.float32)
            dq = torch.from_file(os.path.join(out_dir, "dqkv.f32"), size=B * T * 3 * C, dtype=torch.float32)
            emit({"T": T, "engine": engine, "ran": res["engine"], "forward_ms": res["forward_ms"],
                  "backward_ms": res["backward_ms"], "out_rel_diff": rel(out.to(dev).view(B, T, C), ref_out),
                  "dqkv_rel_diff": rel(dq.to(dev).view(B, T, 3 * C), ref_dqkv)})
sys.exit(0)

#!/usr/bin/env python3
"""torch_gpu_bench.py — the PyTorch peer of `bigbatch bench model --device
cuda:0` for perf/gpu_check.sh: the same GPT (tests/torch_parity.py's
reference module: nanoGPT's layout, manual causal attention, eager mode),
shape, micro-batch and step (forward, loss, backward, AdamW) on one GPU.
Precision fp32 (TF32 off, as bigbatch's fp32) or bf16 (autocast, fp32
master weights). Prints one JSON object: median step ms, tokens/s, peak
bytes (torch.cuda.max_memory_allocated)."""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_parity import GPT  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=12)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--d-model", type=int, default=768)
p.add_argument("--seq-len", type=int, default=1024)
p.add_argument("--vocab", type=int, default=50304)
p.add_argument("--micro-batch", type=int, default=8)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
a = p.parse_args()

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
dev = torch.device("cuda")
model = GPT(a.layers, a.heads, a.d_model, a.seq_len, a.vocab).to(dev)
B, T = a.micro_batch, a.seq_len
x = torch.randint(0, a.vocab, (B, T), device=dev)
y = torch.randint(0, a.vocab, (B * T,), device=dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
times = []
torch.cuda.reset_peak_memory_stats()
for step in range(a.steps + 3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y)
    loss.backward()
    opt.step()
    end.record()
    torch.cuda.synchronize()
    if step >= 3:
        times.append(start.elapsed_time(end))
ms = statistics.median(times)
params = sum(t.numel() for t in model.parameters())
print(json.dumps({"precision": a.precision, "step_ms": ms, "tokens_per_s": B * T / ms * 1e3,
                  "peak_bytes": torch.cuda.max_memory_allocated(), "params": params, "torch": torch.__version__}))

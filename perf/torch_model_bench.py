#!/usr/bin/python3
"""torch_model_bench.py gpt|mlp THREADS STEPS [fp32|bf16 [MICRO_BATCH]] — the
PyTorch peer of `bigbatch bench model`: the same models (tests/torch_parity.py's
reference modules), shapes and step (forward, loss, backward, AdamW), on the
CPU; bf16 runs the forward and the loss under torch.autocast("cpu",
dtype=torch.bfloat16), as the field trains in bf16. Prints one JSON object
with the median step time."""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_parity import GPT, MLP  # noqa: E402

kind, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bf16 = len(sys.argv) > 4 and sys.argv[4] == "bf16"
torch.set_num_threads(threads)
torch.manual_seed(0)
if kind == "gpt":
    B, T, V = int(sys.argv[5]) if len(sys.argv) > 5 else 8, 256, 256
    model = GPT(4, 4, 256, T, V)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B * T,))
    count = B * T
else:
    B = 256
    model = MLP(784, [1024, 1024], 10)
    x = torch.rand(B, 784)
    y = torch.randint(0, 10, (B,))
    count = B
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
times = []
for step in range(steps + 2):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y, reduction="sum") / count
    loss.backward()
    opt.step()
    if step >= 2:
        times.append(time.perf_counter() - t0)
median = statistics.median(times)
rate = "tokens_per_s" if kind == "gpt" else "samples_per_s"
print(json.dumps({"model": kind, "precision": "bf16" if bf16 else "fp32", "threads": threads, "step_ms": median * 1e3, rate: count / median,
                  "torch": torch.__version__, "blas": torch.__config__.show().count("BLAS")}))

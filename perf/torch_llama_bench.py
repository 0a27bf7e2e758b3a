#!/usr/bin/env python3
"""torch_llama_bench.py THREADS STEPS fp32|bf16 LAYERS HEADS KV_HEADS D FFN T V B — the
transformers peer of `bigbatch bench model --model llama`: a LlamaForCausalLM of the
same shape (untied, RoPE base 10000, RMSNorm eps 1e-6, transformers' default
attention), the same step (forward, the mean cross-entropy of B·T targets,
backward, AdamW with bigbatch's bench settings), on THREADS CPU threads; bf16
runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16).
Run with build/hf/bin/python (make hf-deps: transformers over Debian's torch).
Prints one JSON object with the median step time of STEPS after 2 warm-up steps."""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

threads, steps, precision = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
L, H, KV, D, FFN, T, V, B = (int(a) for a in sys.argv[4:12])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=FFN, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, max_position_embeddings=T, rope_theta=10000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)
model = LlamaForCausalLM(cfg)
model.train()
x = torch.randint(0, V, (B, T))
y = torch.randint(0, V, (B * T,))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
bf16 = precision == "bf16"
times = []
for step in range(steps + 2):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, V).float(), y)
    loss.backward()
    opt.step()
    if step >= 2:
        times.append(time.perf_counter() - t0)
median = statistics.median(times)
print(json.dumps({"model": "LlamaForCausalLM", "precision": precision, "threads": threads, "step_ms": median * 1e3,
                  "tokens_per_s": B * T / median, "torch": torch.__version__, "transformers": transformers.__version__,
                  "attention": getattr(cfg, "_attn_implementation", "eager")}))

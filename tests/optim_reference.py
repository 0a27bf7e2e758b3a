#!/usr/bin/python3
"""optim_reference.py DIR KIND — redo in PyTorch (float64) the optimizer
steps tests/test_optim.c took, written from the papers, and compare.

DIR holds tensors.txt (a line per tensor: offset, count, decay 0/1),
init.bin (the fp32 parameters before the first step), grads.bin (each
step's fp32 gradients, one after the other), lrs.txt (each step's rate),
hp.json (beta1, beta2, eps, weight_decay, momentum, trust_coefficient,
grad_clip) and after.bin (bigbatch's parameters after the last step).

KIND is adamw and sgd (torch.optim's own: AdamW, SGD with momentum), lamb
(You et al., arXiv 1904.00962, Algorithm 2: AdamW's bias-corrected
moments, r = m^/(sqrt(v^) + eps) + wd*w, w -= lr * ||w||/||r|| * r with the
ratio 1 where either norm is 0; decay on the decay tensors, the ratio on
every tensor) or lars (You et al., arXiv 1708.03888: on the decay tensors
d = (g + wd*w) * eta*||w||/(||g|| + wd*||w||), 1 where a norm is 0; others
d = g; buf = momentum*buf + d; w -= lr*buf). Before each step the whole
gradient is scaled to norm grad_clip where it is longer (when set; as
torch.nn.utils.clip_grad_norm_, without its 1e-6 added to the norm).

Prints the worst relative error (max |a - b| / max |b| per tensor) and
exits 1 when it exceeds 1e-6.
"""
import json
import sys

import torch

TOLERANCE = 1e-6


def main():
    d, kind = sys.argv[1], sys.argv[2]
    tensors = [tuple(int(x) for x in line.split()) for line in open(f"{d}/tensors.txt") if line.strip()]
    hp = json.load(open(f"{d}/hp.json"))
    lrs = [float(x) for x in open(f"{d}/lrs.txt").read().split()]
    n = sum(c for _, c, _ in tensors)
    fp32 = lambda path: torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32).double()
    w0, grads, after = fp32(f"{d}/init.bin"), fp32(f"{d}/grads.bin").view(len(lrs), n), fp32(f"{d}/after.bin")
    params = [torch.nn.Parameter(w0[o : o + c].clone()) for o, c, _ in tensors]
    b1, b2, eps, wd = hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    groups = [{"params": [p for p, t in zip(params, tensors) if t[2] == flag], "weight_decay": wd if flag else 0.0}
              for flag in (1, 0)]
    if kind == "adamw":
        opt = torch.optim.AdamW(groups, lr=1.0, betas=(b1, b2), eps=eps, foreach=False)
    elif kind == "sgd":
        opt = torch.optim.SGD(groups, lr=1.0, momentum=hp["momentum"], foreach=False)
    state = [{"m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in params]
    for step, lr in enumerate(lrs):
        with torch.no_grad():
            for p, (o, c, _) in zip(params, tensors):
                p.grad = grads[step, o : o + c].clone()
            norm = torch.cat([p.grad for p in params]).norm().item()
            if hp["grad_clip"] > 0 and norm > hp["grad_clip"]:
                for p in params:
                    p.grad.mul_(hp["grad_clip"] / norm)
            if kind in ("adamw", "sgd"):
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()
                continue
            t = step + 1
            for p, s, (_, _, decay) in zip(params, state, tensors):
                g, w = p.grad, p.data
                if kind == "lamb":
                    s["m"].mul_(b1).add_((1 - b1) * g)
                    s["v"].mul_(b2).add_((1 - b2) * g * g)
                    mh, vh = s["m"] / (1 - b1**t), s["v"] / (1 - b2**t)
                    r = mh / (vh.sqrt() + eps) + (wd if decay else 0.0) * w
                    wn, rn = w.norm().item(), r.norm().item()
                    trust = wn / rn if wn > 0 and rn > 0 else 1.0
                    w.sub_(lr * trust * r)
                elif kind == "lars":
                    if decay:
                        wn, gn = w.norm().item(), g.norm().item()
                        trust = hp["trust_coefficient"] * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
                        dstep = (g + wd * w) * trust
                    else:
                        dstep = g
                    s["m"].mul_(hp["momentum"]).add_(dstep)
                    w.sub_(lr * s["m"])
                else:
                    sys.exit(f"optim_reference.py: unknown optimizer {kind}")
    worst, where = 0.0, ""
    for p, (o, c, _) in zip(params, tensors):
        ours = after[o : o + c]
        err = (ours - p.data).abs().max().item() / max(p.data.abs().max().item(), 1e-30)
        if err > worst:
            worst, where = err, f"the tensor at offset {o} ({c} floats)"
    print(f"{kind}: {len(lrs)} steps, {len(tensors)} tensors, worst relative error {worst:.3g} ({where})")
    sys.exit(1 if worst > TOLERANCE else 0)


if __name__ == "__main__":
    main()

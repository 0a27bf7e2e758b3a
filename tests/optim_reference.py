#!/usr/bin/python3
"""optim_reference.py DIR KIND — redo in PyTorch (float64) the optimizer
steps tests/test_optim.c took, written from the papers, and compare.

DIR holds tensors.txt (a line per tensor: offset, count, decay 0/1,
hidden 0/1, rows, cols),
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
d = g; buf = momentum*buf + d; w -= lr*buf) or muon (Jordan et al.'s
Muon as modded-nanogpt's muon_update, with Moonlight's scale, arXiv
2502.16982: on hidden matrices buf = lerp(buf, g, 1 - momentum),
u = lerp(g, buf, momentum), five Newton-Schulz iterations of u/(||u|| +
1e-7), w = w*(1 - lr*wd) - lr*0.2*sqrt(max(rows, cols))*X; AdamW on the
rest, as torch.optim.AdamW). Before each step the whole
gradient is scaled to norm grad_clip where it is longer (when set; as
torch.nn.utils.clip_grad_norm_, without its 1e-6 added to the norm).

Prints the worst relative error (max |a - b| / max |b| per tensor) and
exits 1 when it exceeds 1e-6 — for muon, or twice what PyTorch's same
steps in float32 drift from float64 (the Newton-Schulz iteration grows
float32's rounding over its five polynomial steps: about 1e-5 over ten
steps of the test's matrices), whichever is larger.
"""
import json
import sys

import torch

TOLERANCE = 1e-6


def newton_schulz(g, steps=5):
    """modded-nanogpt's zeropower_via_newtonschulz5, in float64."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.mT if g.size(-2) > g.size(-1) else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.mT if g.size(-2) > g.size(-1) else x


def muon_step(w, g, buf, lr, momentum, wd, dtype):
    """One hidden matrix's step, computed in dtype (w and buf keep float64)."""
    rows, cols = g.shape
    w1, g1, buf1 = w.to(dtype), g.to(dtype), buf.to(dtype)
    buf1.lerp_(g1, 1 - momentum)
    x = newton_schulz(g1.lerp(buf1, momentum))
    w1.mul_(1 - lr * wd).sub_(lr * 0.2 * max(rows, cols) ** 0.5 * x.reshape(-1))
    w.copy_(w1), buf.copy_(buf1)


def steps(d, kind, shapes, hp, lrs, muon_dtype):
    """The parameters after every step, in float64 (Muon's hidden matrices in muon_dtype)."""
    tensors = [t[:3] for t in shapes]
    n = sum(c for _, c, _ in tensors)
    fp32 = lambda path: torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32).double()
    w0, grads = fp32(f"{d}/init.bin"), fp32(f"{d}/grads.bin").view(len(lrs), n)
    params = [torch.nn.Parameter(w0[o : o + c].clone()) for o, c, _ in tensors]
    b1, b2, eps, wd = hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    # torch.optim's own: all of AdamW's and SGD's tensors, Muon's not hidden
    mine = [t[3] == 0 if kind == "muon" else True for t in shapes]
    groups = [{"params": [p for p, t, m in zip(params, tensors, mine) if m and t[2] == flag],
               "weight_decay": wd if flag else 0.0} for flag in (1, 0)]
    if kind in ("adamw", "muon"):
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
            if kind in ("adamw", "sgd", "muon"):
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()
            t = step + 1
            for p, s, (_, _, decay, hidden, rows, cols) in zip(params, state, shapes):
                g, w = p.grad, p.data
                if kind == "muon" and hidden:
                    muon_step(w, g.view(rows, cols), s["m"].view(rows, cols), lr, hp["momentum"],
                              wd if decay else 0.0, muon_dtype)
                elif kind == "lamb":
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
                elif kind not in ("adamw", "sgd", "muon"):
                    sys.exit(f"optim_reference.py: unknown optimizer {kind}")
    return [p.data for p in params]


def worst_error(ours, truth, shapes):
    """max |a - b| / max |b| per tensor: the worst, and where."""
    worst, where = 0.0, ""
    for a, b, (o, c, *_) in zip(ours, truth, shapes):
        err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        if err > worst:
            worst, where = err, f"the tensor at offset {o} ({c} floats)"
    return worst, where


def main():
    d, kind = sys.argv[1], sys.argv[2]
    shapes = [tuple(int(x) for x in line.split()) for line in open(f"{d}/tensors.txt") if line.strip()]
    hp = json.load(open(f"{d}/hp.json"))
    lrs = [float(x) for x in open(f"{d}/lrs.txt").read().split()]
    after = torch.frombuffer(bytearray(open(f"{d}/after.bin", "rb").read()), dtype=torch.float32).double()
    ours = [after[o : o + c] for o, c, *_ in shapes]
    truth = steps(d, kind, shapes, hp, lrs, torch.float64)
    worst, where = worst_error(ours, truth, shapes)
    tolerance = TOLERANCE
    line = f"{kind}: {len(lrs)} steps, {len(shapes)} tensors, worst relative error {worst:.3g} ({where})"
    if kind == "muon":
        # float32's own rounding, which the iteration's five polynomial steps
        # grow: PyTorch's same steps in float32 drift this far from float64.
        drift, _ = worst_error(steps(d, kind, shapes, hp, lrs, torch.float32), truth, shapes)
        tolerance = max(TOLERANCE, 2 * drift)
        line += f"; PyTorch's Muon in float32 drifts {drift:.3g}"
    print(line)
    sys.exit(1 if worst > tolerance else 0)


if __name__ == "__main__":
    main()

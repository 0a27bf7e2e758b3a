#!/usr/bin/env python3
"""roofline_llmc.py — the roofline account of llm.c's GPT-2 training step
beside bigbatch's (`bigbatch bench model --roofline GPU`), by the same rules.

llm.c's op list, dtypes and fusions are read from its train_gpt2.cu (master
at the time of writing: gpt2_forward, gpt2_backward_and_reduce, gpt2_update,
with their defaults: cuDNN attention, recompute 1 (GELU recomputed in the
backward), gelu_fusion 0 (main() sets 0 on every GPU), fp32 master weights,
bf16 ("floatX") parameters, gradients and activations, the vocabulary
padded to Vp = 50304). Every op counts the bytes it must read and write
(each input once, each output once, read too where it accumulates with +=)
and the products their FLOPs (2 per multiply-add; causal attention as
bigbatch counts it: forward 2·B·T²·C, backward 5·B·T²·C). Time per op:
the longer of FLOPs at the products' efficiency of the peak and bytes at
the memory efficiency of the bandwidth, both taken from bigbatch's JSON
(its table of published peaks), so the two accounts differ only in their
op lists.

Usage: perf/roofline_llmc.py [--gpu h200] [--micro-batch 8] [--seq-len 1024]
       [--json]   (run from the repository root; builds nothing: needs bin/bigbatch)
"""
import argparse
import json
import subprocess
import sys
from collections import OrderedDict


def llmc_ops(B, T, C, L, NH, Vp):
    """llm.c's step as (op, stage, flops, bytes, product) tuples, one per call."""
    N = B * T
    X = 2  # bf16 (floatX)
    F = 4  # fp32
    ops = []

    def op(name, flops, nbytes, stage="micro-step"):
        ops.append((name, stage, flops, nbytes, flops > 0))

    def matmul_fwd(name, IC, OC, bias=True, n=N):
        op(name, 2.0 * n * IC * OC, n * IC * X + OC * IC * X + (OC * X if bias else 0) + n * OC * X)

    def matmul_bwd(name, IC, OC, bias=True):
        if bias:  # matmul_backward_bias_kernel9: a pass over dout, dbias += (bf16)
            op("matmul_backward_bias", 0, N * OC * X + 2 * OC * X)
        # dinp = dout · w (cuBLASLt), dweight += inpᵀ · dout (cuBLASLt, beta 1)
        op(name, 4.0 * N * IC * OC,
           2 * N * OC * X + OC * IC * X + N * IC * X + N * IC * X + 2 * OC * IC * X)

    def layernorm_fwd():
        op("layernorm_forward", 0, N * C * X + 2 * C * X + N * C * X + 2 * N * F)

    def fused_residual_fwd():
        # residual = a + b; then LayerNorm of it: reads two, writes residual and ln, mean and rstd
        op("fused_residual_forward", 0, 2 * N * C * X + 2 * C * X + 2 * N * C * X + 2 * N * F)

    def layernorm_bwd():
        # reads dout, inp, w, mean, rstd; dinp += (read and write); dw, db += (bf16, through an fp32 scratch)
        op("layernorm_backward", 0, N * C * X * 2 + C * X + 2 * N * F + 2 * N * C * X + 2 * 2 * C * X)

    # ---- forward ----
    op("encoder_forward", 0, N * 4 + N * C * X + T * C * X + N * C * X)
    layernorm_fwd()
    for _ in range(L):
        matmul_fwd("matmul_forward", C, 3 * C)
        op("attention_forward", 2.0 * B * T * T * C, N * 3 * C * X + N * C * X + B * NH * T * F)
        matmul_fwd("matmul_forward", C, C)
        fused_residual_fwd()
        matmul_fwd("matmul_forward", C, 4 * C)                      # pre-GELU out (gelu_fusion 0)
        op("gelu_forward", 0, 2 * N * 4 * C * X)
        matmul_fwd("matmul_forward", 4 * C, C)
        fused_residual_fwd()                                         # the next block's LN1 or lnf
    matmul_fwd("matmul_forward", C, Vp, bias=False)                  # logits (bf16, padded)
    # fused_classifier: logits read, dlogits written in place, losses +=, targets
    op("fused_classifier", 0, N * Vp * X * 2 + N * 4 + 2 * N * F)
    # ---- backward ----
    op("memset", 0, N * C * X)                                       # dresidual = 0
    op("matmul_backward", 4.0 * N * C * Vp,
       2 * N * Vp * X + Vp * C * X + N * C * X + N * C * X + 2 * Vp * C * X)
    layernorm_bwd()
    for _ in range(L):
        op("gelu_forward", 0, 2 * N * 4 * C * X)                     # recompute 1
        matmul_bwd("matmul_backward", 4 * C, C)
        op("gelu_backward", 0, 3 * N * 4 * C * X)                    # in place on dinp, reads pre-GELU
        matmul_bwd("matmul_backward", C, 4 * C)
        layernorm_bwd()
        matmul_bwd("matmul_backward", C, C)
        op("attention_backward", 5.0 * B * T * T * C,
           N * C * X + N * 3 * C * X + N * C * X + B * NH * T * F + N * 3 * C * X)
        matmul_bwd("matmul_backward", C, 3 * C)
        layernorm_bwd()
    # encoder_backward: dwte rows and dwpe += from dresidual
    op("encoder_backward", 0, N * C * X + N * 4 + 2 * N * C * X + 2 * T * C * X)
    # ---- the optimizer's step ----
    P = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    op("gradient_norm", 0, P * X, "optimizer")                       # global_norm_squared over bf16 grads
    # adamw: grad (bf16), m, v, master (fp32) read; m, v, master and the bf16 param written
    op("adamw", 0, P * (X + 3 * F) + P * (3 * F + X), "optimizer")
    op("memset", 0, P * X, "optimizer")                              # zero_grad
    return ops, P


def account(ops, peaks, precision, eff):
    peak = peaks["bf16_flops"] if precision == "bf16" else peaks["fp32_flops"]
    bw = peaks["memory_bytes_per_s"] * eff["memory"]
    rows = OrderedDict()
    for name, stage, flops, nbytes, product in ops:
        r = rows.setdefault((name, stage), {"name": name, "stage": stage, "calls": 0, "gflop": 0.0, "gb": 0.0,
                                             "ms": 0.0, "product": product})
        memory = nbytes / bw
        t = max(flops / (peak * eff["products"]), memory) if product else memory
        r["calls"] += 1
        r["gflop"] += flops / 1e9
        r["gb"] += nbytes / 1e9
        r["ms"] += t * 1e3
    return sorted(rows.values(), key=lambda r: (r["stage"] != "micro-step", -r["ms"]))


def totals(rows):
    t = {"product_ms": 0.0, "non_product_ms": 0.0, "non_product_gb": 0.0, "optimizer_ms": 0.0, "optimizer_gb": 0.0}
    for r in rows:
        if r["stage"] == "optimizer":
            t["optimizer_ms"] += r["ms"]
            t["optimizer_gb"] += r["gb"]
        elif r["product"]:
            t["product_ms"] += r["ms"]
        else:
            t["non_product_ms"] += r["ms"]
            t["non_product_gb"] += r["gb"]
    t["step_ms"] = t["product_ms"] + t["non_product_ms"] + t["optimizer_ms"]
    return t


def table(title, rows):
    print(title)
    print(f"  {'op':<24} {'stage':<10} {'calls':>6} {'GFLOP':>9} {'GB':>8} {'ms':>8}")
    for r in rows:
        print(f"  {r['name']:<24} {r['stage']:<10} {r['calls']:>6} {r['gflop']:>9.1f} {r['gb']:>8.3f} {r['ms']:>8.3f}"
              + ("  product" if r["product"] else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--bigbatch", default="bin/bigbatch")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    B, T, C, L, NH, V = a.micro_batch, a.seq_len, 768, 12, 12, 50257
    Vp = (V + 127) // 128 * 128
    cmd = [a.bigbatch, "bench", "model", "--roofline", a.gpu, "--layers", str(L), "--heads", str(NH), "--d-model",
           str(C), "--seq-len", str(T), "--vocab", str(V), "--micro-batch", str(B), "--precision", "bf16", "--json"]
    try:
        bb = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
        sys.exit(f"roofline_llmc.py: {' '.join(cmd)}: {getattr(e, 'stderr', '') or e}")
    ops, P = llmc_ops(B, T, C, L, NH, Vp)
    rows = account(ops, bb["gpu"], "bf16", bb["efficiency"])
    t = totals(rows)
    tokens = B * T
    attention = 6 * L * C * T * tokens
    peak = bb["gpu"]["bf16_flops"]
    llmc = dict(t, params=P, predicted_tokens_per_s=tokens / (t["step_ms"] / 1e3),
                mfu=(6 * P * tokens + attention) / (t["step_ms"] / 1e3) / peak, ops=rows)
    ratio = bb["non_product_gb"] / llmc["non_product_gb"]
    if a.json:
        print(json.dumps({"gpu": a.gpu, "micro_batch": B, "seq_len": T, "bigbatch": bb, "llmc": llmc,
                          "non_product_gb_ratio": ratio}))
        return
    print(f"GPT-2 124M, bf16, B {B}, T {T}, on {a.gpu} ({bb['gpu']['part']}): products at "
          f"{100 * bb['efficiency']['products']:.0f}% of peak, other ops at {100 * bb['efficiency']['memory']:.0f}% "
          "of bandwidth")
    table("llm.c (train_gpt2.cu: cuDNN, recompute 1, gelu_fusion 0, Vp %d):" % Vp, rows)
    for name, x in (("llm.c", llmc), ("bigbatch", bb)):
        print(f"{name:>9}: products {x['product_ms']:.2f} ms, non-product {x['non_product_ms']:.2f} ms "
              f"({x['non_product_gb']:.2f} GB), optimizer {x['optimizer_ms']:.2f} ms ({x['optimizer_gb']:.2f} GB); "
              f"{x['step_ms']:.2f} ms a step, {x['predicted_tokens_per_s']:.0f} tokens/s, MFU {100 * x['mfu']:.1f}%")
    print(f"bigbatch / llm.c: non-product traffic {ratio:.2f}x, predicted tokens/s "
          f"{bb['predicted_tokens_per_s'] / llmc['predicted_tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()

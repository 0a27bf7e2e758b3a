#!/usr/bin/python3
"""torch_train_bench.py mlp|gpt [options] — the PyTorch peer of `bigbatch train`,
run beside it by perf/train_bench.sh to compare

  mlp: final test accuracy of a 784-1024-1024-10 ReLU MLP on Fashion-MNIST
       (AdamW, constant lr, a fresh permutation each epoch, the last N mod G
       records of an epoch dropped, weight decay on weight matrices only —
       bigbatch's rules), or, with --steps, its training throughput with
       gradient accumulation (as the gpt's);
  gpt: training throughput of a small GPT (seq 256, vocab 256) with gradient
       accumulation: G/micro-batch micro-steps, each loss divided by that
       count, one optimizer step per global batch G.

Throughput runs time whole optimizer steps (after --warmup-steps untimed
ones) and clip the gradient norm to --grad-clip first, as `bigbatch train`
does by default; --optimizer sgd is SGD with --momentum.

The models are tests/torch_parity.py's reference modules (nanoGPT's names);
the GPT gets bigbatch's initialisation here (normal 0.02, c_proj weights
0.02/sqrt(2*layers), biases 0, LayerNorm weights 1). Data are the `*.bbs`
shards of DIR/train and DIR/test (or DIR/val), read through `zstd -dc`.
Prints one JSON object on stdout; progress goes to stderr.

Run with Debian's torch, and with the OpenBLAS build and passive OpenMP
waiting (otherwise torch may pick the reference BLAS and be 20-45x slower):

  export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread OMP_WAIT_POLICY=PASSIVE
  /usr/bin/python3 perf/torch_train_bench.py mlp --data data/fmnist --epochs 5 \\
      --global-batch 256 --lr 1e-3 --weight-decay 0.01 --seed 1 --threads 2
  /usr/bin/python3 perf/torch_train_bench.py gpt --data data/kjv --layers 4 --heads 4 \\
      --d-model 128 --global-batch 64 --micro-batch 8 --steps 6 --warmup-steps 2 --lr 1e-3
"""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_parity import GPT, MLP  # noqa: E402


def read_records(directory, record_bytes):
    """All records of a dataset directory's shards, in name order, as a (N, record_bytes) uint8 array."""
    files = sorted(glob.glob(os.path.join(directory, "*.bbs")))
    if not files:
        sys.exit(f"torch_train_bench: no *.bbs shards in {directory}")
    raw = b"".join(subprocess.run(["zstd", "-dc", f], capture_output=True, check=True).stdout for f in files)
    if len(raw) % record_bytes:
        sys.exit(f"torch_train_bench: {directory}: {len(raw)} bytes is not a multiple of {record_bytes}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, record_bytes)


def optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum)
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)


def timed_steps(args, model, opt, micro_batches, examples):
    """Runs --warmup-steps + --steps optimizer steps of G/B micro-steps each
    (micro_batches() yields (input, target) pairs of --micro-batch records),
    prints one JSON line with the median step's throughput."""
    G, B = args.global_batch, args.micro_batch
    if G % B:
        sys.exit("torch_train_bench: --global-batch must be a multiple of --micro-batch")
    accum = G // B
    times, losses = [], []
    for step in range(args.warmup_steps + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            x, y = next(micro_batches)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)) / accum
            loss.backward()
            total += loss.item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        elapsed = time.perf_counter() - t0
        losses.append(total)
        print(f"step {step + 1}: loss {total:.4f}, {elapsed * 1e3:.1f} ms"
              f"{' (warm-up)' if step < args.warmup_steps else ''}", file=sys.stderr)
        if step >= args.warmup_steps:
            times.append(elapsed)
    median = statistics.median(times)
    print(json.dumps({"step_ms": median * 1e3, "samples_per_s": G / median, "tokens_per_s": G * examples / median,
                      "loss_first": losses[0], "loss_last": losses[-1]}))


def fmnist(directory):
    rec = read_records(directory, 785)
    return torch.from_numpy(rec[:, 1:].astype(np.float32) / 255.0), torch.from_numpy(rec[:, 0].astype(np.int64))


def run_mlp(args):
    x_train, y_train = fmnist(os.path.join(args.data, "train"))
    if args.steps is not None:
        torch.manual_seed(args.seed)
        model = MLP(784, [1024, 1024], 10)

        def micro_batches():
            while True:
                for i in range(0, len(x_train) - args.micro_batch + 1, args.micro_batch):
                    yield x_train[i:i + args.micro_batch], y_train[i:i + args.micro_batch]
        timed_steps(args, model, optimizer(model, args), micro_batches(), 1)
        return
    x_test, y_test = fmnist(os.path.join(args.data, "test"))
    torch.manual_seed(args.seed)
    model = MLP(784, [1024, 1024], 10)  # nn.Linear's default initialisation
    opt = optimizer(model, args)
    G, N = args.global_batch, len(x_train)
    steps_per_epoch = N // G  # the last N mod G records of an epoch are dropped

    def evaluate():
        model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(x_test), 1000):
                logits = model(x_test[i:i + 1000])
                loss += F.cross_entropy(logits, y_test[i:i + 1000], reduction="sum").item()
                correct += (logits.argmax(1) == y_test[i:i + 1000]).sum().item()
        model.train()
        return correct / len(x_test), loss / len(x_test)

    train_seconds = 0.0
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        order = torch.randperm(N, generator=torch.Generator().manual_seed(args.seed + epoch))
        for s in range(steps_per_epoch):
            idx = order[s * G:(s + 1) * G]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
        train_seconds += time.perf_counter() - t0
        if args.eval_each_epoch:
            acc, loss = evaluate()
            print(f"epoch {epoch + 1}: test accuracy {acc:.4f}, test loss {loss:.4f}, "
                  f"{train_seconds:.1f} s of training so far", file=sys.stderr)
    acc, loss = evaluate()
    samples = args.epochs * steps_per_epoch * G
    print(json.dumps({"test_accuracy": acc, "test_loss": loss, "train_seconds": train_seconds,
                      "samples_per_s": samples / train_seconds, "epochs": args.epochs}))


def gpt_init(model, layers):
    for name, p in model.named_parameters():
        with torch.no_grad():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02)
            elif "ln_" in name and name.endswith(".weight"):
                p.fill_(1.0)
            else:
                p.zero_()


def run_gpt(args):
    tokens = torch.from_numpy(read_records(os.path.join(args.data, "train"), 514).view("<u2").astype(np.int64))
    T = tokens.shape[1] - 1
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.heads, args.d_model, T, 256)
    gpt_init(model, args.layers)

    def micro_batches():
        while True:
            for i in range(0, len(tokens) - args.micro_batch + 1, args.micro_batch):
                batch = tokens[i:i + args.micro_batch]
                yield batch[:, :-1], batch[:, 1:]
    timed_steps(args, model, optimizer(model, args), micro_batches(), T)


def main():
    ap = argparse.ArgumentParser(description="PyTorch peer of `bigbatch train` (see the header comment)")
    ap.add_argument("model", choices=["mlp", "gpt"])
    ap.add_argument("--data", required=True, help="dataset directory holding train/ and test/ (mlp) or train/ (gpt)")
    ap.add_argument("--global-batch", type=int, default=None, help="records per optimizer step (mlp 256, gpt 64)")
    ap.add_argument("--lr", type=float, default=1e-3, help="constant learning rate")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--momentum", type=float, default=0.9, help="sgd")
    ap.add_argument("--grad-clip", type=float, default=0.0, help="throughput runs: clip the gradient norm; 0: off")
    ap.add_argument("--weight-decay", type=float, default=None, help="on weight matrices only (mlp 0.01, gpt 0.0)")
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5, help="mlp")
    ap.add_argument("--eval-each-epoch", action="store_true", help="mlp: test accuracy per epoch on stderr")
    ap.add_argument("--layers", type=int, default=4, help="gpt")
    ap.add_argument("--heads", type=int, default=4, help="gpt")
    ap.add_argument("--d-model", type=int, default=128, help="gpt")
    ap.add_argument("--micro-batch", type=int, default=8, help="throughput: records per micro-step")
    ap.add_argument("--steps", type=int, default=None, help="throughput: timed optimizer steps (gpt: default 6; "
                    "mlp: a throughput run instead of the accuracy run)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="throughput: untimed optimizer steps first")
    args = ap.parse_args()
    gpt = args.model == "gpt"
    if args.global_batch is None:
        args.global_batch = 64 if gpt else 256
    if args.weight_decay is None:
        args.weight_decay = 0.0 if gpt else 0.01
    if gpt and args.steps is None:
        args.steps = 6
    torch.set_num_threads(args.threads)
    (run_gpt if gpt else run_mlp)(args)


if __name__ == "__main__":
    main()

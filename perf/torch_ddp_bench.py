#!/usr/bin/python3
"""torch_ddp_bench.py mlp|gpt [options] — the PyTorch DDP peer of
`mpirun -np P bigbatch train`, launched the same way by perf/mpi_bench.sh:

  mpirun -np 2 /usr/bin/python3 perf/torch_ddp_bench.py gpt --data data/kjv --global-batch 64 --micro-batch 8

Each process is one DDP rank (gloo backend, rank and world from Open MPI's
environment, rendezvous on 127.0.0.1), one thread; G / (P * B) micro-steps
per step, the gradients all-reduced on the last (no_sync before it), one
AdamW step. The models and data are perf/torch_train_bench.py's. Rank 0
prints one JSON object: the median step time and tokens/s (gpt) or
samples/s (mlp) over the timed steps."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch_train_bench import GPT, MLP, adamw, gpt_init, read_records  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description="PyTorch DDP peer of mpirun bigbatch train")
    ap.add_argument("model", choices=["mlp", "gpt"])
    ap.add_argument("--data", required=True)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--port", default="29517")
    args = ap.parse_args()
    rank, world = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    G, B = args.global_batch, args.micro_batch
    accum = G // (world * B)
    torch.manual_seed(1)
    if args.model == "gpt":
        records = read_records(os.path.join(args.data, "train"), 514).view("<u2").astype(np.int64)
        data = torch.from_numpy(records)
        model = GPT(4, 4, 128, data.shape[1] - 1, 256)
        gpt_init(model, 4)
        per_example = data.shape[1] - 1
    else:
        records = read_records(os.path.join(args.data, "train"), 785)
        data = torch.from_numpy(records.astype(np.int64))
        model = MLP(784, [1024, 1024], 10)
        per_example = 1
    ddp = DDP(model)
    opt = adamw(model, args)
    times, cursor = [], rank * B
    for step in range(args.warmup_steps + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for k in range(accum):
            if cursor + B > len(data):
                cursor = rank * B
            batch = data[cursor:cursor + B]
            cursor += world * B
            last = k == accum - 1
            ctx = ddp.no_sync() if not last else torch.enable_grad()
            with ctx:
                if args.model == "gpt":
                    logits = ddp(batch[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)) / accum
                else:
                    logits = ddp(batch[:, 1:].float() / 255.0)
                    loss = F.cross_entropy(logits, batch[:, 0]) / accum
                loss.backward()
        opt.step()
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    key = "tokens_per_s" if args.model == "gpt" else "samples_per_s"
    if rank == 0:
        print(json.dumps({"step_ms": median * 1e3, key: G * per_example / median, "torch": torch.__version__}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

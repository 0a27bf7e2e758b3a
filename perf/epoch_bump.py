#!/usr/bin/python3
"""epoch_bump.py METRICS... [--epoch-steps N] — does the loss rise at the end of
each epoch (the data order's last window)? For each metrics file of `bigbatch
train --metrics`: per epoch end (N steps an epoch; the demo's 142), the mean
loss of the epoch's last 15 steps minus the mean of the 15 before them (a
rise is positive: the loss falls otherwise), and the largest one-step rise
from step 100 on.

    bigbatch train --data build/kjv-bpe --devices cpu:2 --global-batch 32 --micro-batch 8 \
        --steps 390 --stop-after 290 --lr 4e-3 --warmup 20 --metrics run.jsonl
    perf/epoch_bump.py run.jsonl
"""
import json
import sys


def main():
    args = sys.argv[1:]
    per_epoch = 142
    if "--epoch-steps" in args:
        i = args.index("--epoch-steps")
        per_epoch = int(args[i + 1])
        del args[i : i + 2]
    for name in args:
        L = {r["step"]: r["loss"] for r in (json.loads(l) for l in open(name)) if "step" in r}
        out = []
        for end in range(per_epoch, max(L) + 1, per_epoch):
            last = [L[s] for s in range(end - 14, end + 1) if s in L]
            prev = [L[s] for s in range(end - 29, end - 14) if s in L]
            if last and prev:
                out.append(sum(last) / len(last) - sum(prev) / len(prev))
        jumps = [(L[s + 1] - L[s], s + 1) for s in range(100, max(L)) if s in L and s + 1 in L]
        rise, at = max(jumps) if jumps else (float("nan"), 0)
        bumps = ", ".join(f"{b:+.3f}" for b in out)
        print(f"{name}: epoch-end bump (the epoch's last 15 steps' mean loss - the 15 before) {bumps}; "
              f"the largest one-step rise from step 100 on {rise:+.3f} (step {at})")


if __name__ == "__main__":
    main()

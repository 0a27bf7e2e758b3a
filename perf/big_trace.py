#!/usr/bin/env python3
"""Writes a Chrome trace shaped like `bigbatch train --trace`'s, as large as
asked, for measuring `bigbatch report` on it (perf/RESULTS.md):

    perf/big_trace.py --mib 200 --out /tmp/big.json
    /usr/bin/time -v bin/bigbatch report --metrics tests/fixtures/v0.1/metrics.jsonl \\
        --trace /tmp/big.json --out /tmp/big.html
"""
import argparse
import json

p = argparse.ArgumentParser()
p.add_argument("--mib", type=float, default=200)
p.add_argument("--out", required=True)
p.add_argument("--devices", type=int, default=8)
a = p.parse_args()

target = int(a.mib * 1048576)
with open(a.out, "w") as f:
    f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
    lanes = [f"worker {d} (cuda:{d})" for d in range(a.devices)] + ["reducer"]
    first = True
    for i, name in enumerate(lanes):
        f.write(("" if first else ",\n") + json.dumps({"name": "thread_name", "ph": "M", "pid": 1, "tid": i,
                                                      "args": {"name": name}}))
        first = False
    step, t = 1, 0.0
    while f.tell() < target:
        for d in range(a.devices):
            at = t
            for k in range(4):  # micro-steps
                for phase, dur in (("load", 0.2), ("copy", 0.05), ("forward", 3.0), ("backward", 6.0)):
                    f.write(",\n" + json.dumps({"name": phase, "ph": "X", "pid": 1, "tid": d, "ts": round(at, 3),
                                                "dur": dur + 0.001 * (step % 7), "args": {"step": step, "micro_step": k}}))
                    at += dur
        for b in range(8):
            f.write(",\n" + json.dumps({"name": f"reduce bucket {b}", "ph": "X", "pid": 1, "tid": a.devices,
                                        "ts": round(t + 30 + b, 3), "dur": 0.8, "args": {"step": step, "bucket": b}}))
        t += 40
        step += 1
    f.write("\n]}\n")

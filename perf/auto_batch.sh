#!/usr/bin/env bash
# auto_batch.sh — does --global-batch auto reach a target sooner than a
# fixed batch? Fashion-MNIST (make data-fmnist), the MLP of
# large_batch_fmnist.sh on 2 CPU devices, AdamW with --lr-scale sqrt from
# 1e-3 at 256, constant rate: each fixed batch in BATCHES and
# --global-batch auto:AUTO (micro-batch AUTO_MICRO) RUNS times; per run the
# seconds of its own steps (batch / samples per second, evaluations left
# out) until the test loss reaches TARGET (interpolated between
# evaluations), the medians, and auto's ratio to the best fixed median.
#
#   perf/auto_batch.sh
#   RUNS=5 BATCHES="256 512 1024" AUTO=128..8192 perf/auto_batch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
BATCHES=${BATCHES:-256 512 1024}
AUTO=${AUTO:-128..8192}
AUTO_MICRO=${AUTO_MICRO:-64}
TARGET=${TARGET:-0.40}
OUT=${OUT:-build/auto-batch}
DATA=data/fmnist
[ -d "$DATA/train" ] || { echo "auto_batch.sh: $DATA is missing: run make data-fmnist first" >&2; exit 1; }
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
common=(--model mlp --hidden 256,256 --data "$DATA" --devices cpu:2 --optimizer adamw --lr 1e-3 --lr-scale sqrt
        --base-batch 256 --lr-schedule constant --quiet)
echo "# auto_batch: $(date -u +%FT%RZ), $(nproc) CPUs, $RUNS runs each, target test loss $TARGET"
for r in $(seq "$RUNS"); do
    for g in $BATCHES; do
        bin/bigbatch train "${common[@]}" --global-batch "$g" --micro-batch $((g / 2 < 1024 ? g / 2 : 1024)) \
            --steps $((60000 / g * 6)) --eval-every $((60000 / g / 8 > 0 ? 60000 / g / 8 : 1)) \
            --metrics "$OUT/fixed-$g-$r.jsonl"
    done
    bin/bigbatch train "${common[@]}" --global-batch "auto:$AUTO" --micro-batch "$AUTO_MICRO" --steps 1500 \
        --eval-every 25 --metrics "$OUT/auto-$r.jsonl"
done
/usr/bin/python3 - "$OUT" "$RUNS" "$TARGET" "$BATCHES" <<'EOF'
import json, statistics, sys
out, runs, target, batches = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split()
def to_target(path, g):
    """(steps, examples, seconds) to the target, interpolated; None if never."""
    rows = [r for r in (json.loads(l) for l in open(path)) if "step" in r]
    t = ex = 0.0
    prev = (0, float("inf"), 0.0, 0.0)
    for r in rows:
        b = r.get("global_batch", g)
        t += b / r["samples_per_s"]
        ex += b
        if r.get("val_loss") is None:
            continue
        if r["val_loss"] <= target:
            s0, l0, t0, e0 = prev
            f = 1.0 if l0 == float("inf") else (l0 - target) / (l0 - r["val_loss"])
            return s0 + (r["step"] - s0) * f, e0 + (ex - e0) * f, t0 + (t - t0) * f
        prev = (r["step"], r["val_loss"], t, ex)
    return None
print("\n| run | steps to target | examples to target | seconds to target (median of %d) | runs |" % runs)
print("|---|---|---|---|---|")
medians = {}
for name, g in [(f"fixed-{b}", int(b)) for b in batches] + [("auto", 0)]:
    got = [x for x in (to_target(f"{out}/{name}-{r}.jsonl", g) for r in range(1, runs + 1)) if x]
    if not got:
        print(f"| {name} | - | - | - | 0 |")
        continue
    med = [statistics.median(v) for v in zip(*got)]
    medians[name] = med[2]
    print(f"| {name} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.2f} s | {len(got)} |")
fixed = {k: v for k, v in medians.items() if k != "auto"}
if "auto" in medians and fixed:
    best = min(fixed, key=fixed.get)
    print(f"\nauto / best fixed ({best}): {medians['auto'] / fixed[best]:.2f}x the seconds")
EOF

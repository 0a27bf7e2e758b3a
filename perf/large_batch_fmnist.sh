#!/usr/bin/env bash
# large_batch_fmnist.sh — large-batch training on Fashion-MNIST (make
# data-fmnist), an MLP (--hidden 256,256) on 2 CPU devices, in two parts:
#
#   goyal   batch 8192 against SGD at 256 over EPOCHS epochs: SGD with
#           Goyal et al.'s linear rule and warm-up (arXiv 1706.02677),
#           LARS and LAMB over a small rate grid each; the test accuracy
#           and loss at the end.
#   curve   the steps and examples to a target test loss (TARGET) for
#           batches 32 ... 8192 (AdamW, --lr-scale sqrt from 1e-3 at 256),
#           and the McCandlish et al. fit (arXiv 1812.06162)
#           S = S_min (1 + B_crit/B), E = E_min (1 + B/B_crit), by least
#           squares of S on 1/B, against the online B_simple where the
#           target was reached; and --global-batch auto:32..8192 (the
#           batch follows the online noise scale, micro-batch 16): its
#           steps and seconds to the target against the fixed batches'
#           (seconds: the steps' own, evaluations left out).
#
#   perf/large_batch_fmnist.sh             # both parts
#   PARTS=curve perf/large_batch_fmnist.sh
# Prints Markdown tables; the metrics stay in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=${PARTS:-goyal curve}
EPOCHS=${EPOCHS:-20}
TARGET=${TARGET:-0.40}
CURVE_BATCHES=${CURVE_BATCHES:-32 64 128 256 512 1024 2048 4096 8192}
OUT=${OUT:-build/large-batch-fmnist}
DATA=data/fmnist
[ -d "$DATA/train" ] || { echo "large_batch_fmnist.sh: $DATA is missing: run make data-fmnist first" >&2; exit 1; }
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
records=60000

# run NAME G EPOCHS FLAGS...: one run, an evaluation about 40 times (at least every epoch)
run() {
    local name=$1 g=$2 epochs=$3
    shift 3
    local steps=$((records / g * epochs)) micro=$((g / 2 < 1024 ? g / 2 : 1024))
    local every=$((steps / 40 > 0 ? steps / 40 : 1))
    bin/bigbatch train --model mlp --hidden 256,256 --data "$DATA" --devices cpu:2 --global-batch "$g" \
        --micro-batch "$micro" --steps "$steps" --eval-every "$every" --quiet --metrics "$OUT/$name.jsonl" "$@"
}

echo "# large_batch_fmnist: $(date -u +%FT%RZ), $(nproc) CPUs, parts: $PARTS"
if [[ " $PARTS " == *" goyal "* ]]; then
    run sgd-256 256 "$EPOCHS" --optimizer sgd --lr 0.1
    warm=$((records / 8192 * EPOCHS / 10))
    run sgd-8192 8192 "$EPOCHS" --optimizer sgd --lr 0.1 --lr-scale linear --base-batch 256 --warmup "$warm"
    for lr in 1 4 16 32 64; do
        run "lars-8192-$lr" 8192 "$EPOCHS" --optimizer lars --lr "$lr" --warmup "$warm" --weight-decay 1e-4
    done
    for lr in 0.01 0.03 0.1; do
        run "lamb-8192-$lr" 8192 "$EPOCHS" --optimizer lamb --lr "$lr" --warmup "$warm" --weight-decay 1e-4
    done
fi
if [[ " $PARTS " == *" curve "* ]]; then
    for g in $CURVE_BATCHES; do
        epochs=$((g <= 128 ? 3 : g <= 512 ? 6 : g <= 2048 ? 15 : 30))
        run "curve-$g" "$g" "$epochs" --optimizer adamw --lr 1e-3 --lr-scale sqrt --base-batch 256 \
            --lr-schedule constant
    done
    bin/bigbatch train --model mlp --hidden 256,256 --data "$DATA" --devices cpu:2 --global-batch auto:32..8192 \
        --micro-batch 16 --steps 3000 --eval-every 25 --quiet --metrics "$OUT/curve-auto.jsonl" --optimizer adamw \
        --lr 1e-3 --lr-scale sqrt --base-batch 256 --lr-schedule constant
fi
/usr/bin/python3 - "$OUT" "$PARTS" "$TARGET" "$CURVE_BATCHES" <<'EOF'
import glob, json, os, sys
out, parts, target, batches = sys.argv[1], sys.argv[2].split(), float(sys.argv[3]), sys.argv[4].split()
def rows(name):
    return [r for r in (json.loads(l) for l in open(f"{out}/{name}.jsonl")) if "step" in r]
def evals(rs):
    return [(r["step"], r["val_loss"], r.get("val_accuracy")) for r in rs if r.get("val_loss") is not None]
def reached(rs):
    """Steps to the target test loss, interpolated between evaluations; None if never."""
    e = evals(rs)
    for (s0, l0, _), (s1, l1, _) in zip([(0, float("inf"), None)] + e, e):
        if l1 <= target:
            return s1 if l0 == float("inf") else s0 + (s1 - s0) * (l0 - target) / (l0 - l1), s1
    return None, None
def seconds_to(rs, g, steps):
    """The steps' own seconds (batch / samples per second) up to `steps` (fractional: interpolated)."""
    total = 0.0
    for r in rs:
        dt = r.get("global_batch", g) / r["samples_per_s"]
        if r["step"] > steps:
            return total + dt * (steps - (r["step"] - 1))
        total += dt
    return total
def examples_to(rs, g, steps):
    total = 0.0
    for r in rs:
        b = r.get("global_batch", g)
        if r["step"] > steps:
            return total + b * (steps - (r["step"] - 1))
        total += b
    return total
if "goyal" in parts:
    print("\n| run | G | steps | test accuracy | test loss | best test accuracy |")
    print("|---|---|---|---|---|---|")
    names = ["sgd-256", "sgd-8192"] + sorted(os.path.basename(p)[:-6] for p in glob.glob(f"{out}/lars-8192-*.jsonl")) \
        + sorted(os.path.basename(p)[:-6] for p in glob.glob(f"{out}/lamb-8192-*.jsonl"))
    for n in names:
        rs = rows(n)
        e = evals(rs)
        g = n.split("-")[1]
        print(f"| {n} | {g} | {rs[-1]['step']} | {100 * e[-1][2]:.2f}% | {e[-1][1]:.4f} | "
              f"{100 * max(a for _, _, a in e):.2f}% |")
if "curve" in parts:
    print(f"\ntarget test loss {target}\n")
    print("| G | steps | steps to target | examples to target | seconds to target | B_simple there |")
    print("|---|---|---|---|---|---|")
    pts = []
    for g in batches + (["auto"] if os.path.exists(f"{out}/curve-auto.jsonl") else []):
        rs = rows(f"curve-{g}")
        s, at = reached(rs)
        noise = [r["noise_scale"] for r in rs if r.get("noise_scale") is not None and r["step"] <= (at or 0)]
        bs = noise[-1] if noise else None
        gb = int(g) if g != "auto" else 0
        if s is not None and g != "auto":
            pts.append((gb, s, bs))
        label = g if g != "auto" else f"auto (ended at {rs[-1].get('global_batch')})"
        print(f"| {label} | {rs[-1]['step']} | {'-' if s is None else f'{s:.0f}'} | "
              f"{'-' if s is None else f'{examples_to(rs, gb, s):.0f}'} | "
              f"{'-' if s is None else f'{seconds_to(rs, gb, s):.1f}'} | {'-' if bs is None else f'{bs:.3g}'} |")
    if len(pts) >= 3:
        # S = S_min + E_min / B: least squares of S on x = 1/B
        xs, ys = [1 / b for b, _, _ in pts], [s for _, s, _ in pts]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        e_min = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        s_min = my - e_min * mx
        print(f"\nfit S = S_min (1 + B_crit/B): S_min {s_min:.1f} steps, E_min {e_min:.0f} examples, "
              f"B_crit = E_min/S_min = {e_min / s_min:.0f}" if s_min > 0 else
              f"\nfit: S_min {s_min:.1f} <= 0: the points do not bend (every batch below B_crit?)")
        for b, s, bs in pts:
            print(f"  G {b}: measured {s:.0f} steps, fit {s_min + e_min / b:.0f}")
        noise = [bs for _, _, bs in pts if bs is not None]
        if noise:
            print(f"online B_simple where the target was reached: {min(noise):.3g} .. {max(noise):.3g} "
                  f"(median {sorted(noise)[len(noise) // 2]:.3g})")
EOF

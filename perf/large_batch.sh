#!/usr/bin/env bash
# large_batch.sh — how the step count to a target loss falls with the
# batch, per optimizer, at an equal budget of tokens (McCandlish et al.,
# arXiv 1812.06162): the gpt on the demo's KJV BPE data (make demo builds
# build/kjv-bpe), for each optimizer in OPTIMIZERS and global batch in
# BATCHES, TOKENS tokens each (steps = TOKENS / (G x 256)), the peak rate
# LR given for BASE examples scaled to G (--lr-scale RULE), warm-up the
# first tenth of the steps, an evaluation every tenth. The target is the
# validation loss the smallest batch's first optimizer reaches at
# TARGET_AT of its run. Prints a Markdown table: per run, the final
# validation loss, the steps and tokens to the target (linearly
# interpolated between evaluations; "-" when never reached), and the
# online noise scale B_simple at the end. The metrics stay in OUT.
#
#   perf/large_batch.sh                    # the defaults below
#   BATCHES="32 128 512" OPTIMIZERS="adamw lamb" perf/large_batch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BATCHES=${BATCHES:-32 128 512}
OPTIMIZERS=${OPTIMIZERS:-adamw lamb}
TOKENS=${TOKENS:-3276800}        # 400 steps of G 32 x 256 tokens
LR=${LR:-4e-3}
BASE=${BASE:-32}
RULE=${RULE:-sqrt}
TARGET_AT=${TARGET_AT:-0.8}
MODEL=${MODEL:---layers 4 --heads 4 --d-model 128}
DEVICES=${DEVICES:-cpu:2}
OUT=${OUT:-build/large-batch}
DATA=build/kjv-bpe
[ -d "$DATA/train" ] || { echo "large_batch.sh: $DATA is missing: run make demo first" >&2; exit 1; }
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
echo "# large_batch: $(date -u +%FT%RZ), $(nproc) CPUs, $DEVICES, tokens $TOKENS, lr $LR at $BASE ($RULE)"
for opt in $OPTIMIZERS; do
    for g in $BATCHES; do
        steps=$((TOKENS / (g * 256)))
        micro=$((g / 2 < 16 ? g / 2 : 16))
        every=$((steps / 10 > 0 ? steps / 10 : 1))
        warmup=$((steps / 10))
        # shellcheck disable=SC2086
        bin/bigbatch train --data "$DATA" $MODEL --devices "$DEVICES" --global-batch "$g" --micro-batch "$micro" \
            --steps "$steps" --optimizer "$opt" --lr "$LR" --lr-scale "$RULE" --base-batch "$BASE" \
            --warmup "$warmup" --eval-every "$every" --quiet --metrics "$OUT/$opt-$g.jsonl"
    done
done
/usr/bin/python3 - "$OUT" "$TARGET_AT" "$BATCHES" "$OPTIMIZERS" <<'EOF'
import json, sys
out, at, batches, opts = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def run(opt, g):
    rows = [json.loads(l) for l in open(f"{out}/{opt}-{g}.jsonl")]
    steps = [r for r in rows if "step" in r]
    evals = [(r["step"], r["val_loss"]) for r in steps if r.get("val_loss") is not None]
    return steps, evals
first_steps, first_evals = run(opts[0], batches[0])
last = first_steps[-1]["step"]
# the target: the first run's validation loss at TARGET_AT of its steps (interpolated)
target = None
for (s0, l0), (s1, l1) in zip(first_evals, first_evals[1:]):
    if s0 <= at * last <= s1:
        target = l0 + (l1 - l0) * (at * last - s0) / (s1 - s0)
print(f"\ntarget validation loss {target:.4f} ({opts[0]}, G {batches[0]}, at {at:.0%} of its steps)\n")
print("| optimizer | G | steps | final val loss | steps to target | tokens to target | B_simple at the end |")
print("|---|---|---|---|---|---|---|")
for opt in opts:
    for g in batches:
        steps, evals = run(opt, g)
        reached = "-"
        for (s0, l0), (s1, l1) in zip([(0, float("inf"))] + evals, evals):
            if l1 <= target:
                reached = s1 if l0 == float("inf") else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
                break
        noise = [r["noise_scale"] for r in steps if r.get("noise_scale") is not None]
        tok = "-" if reached == "-" else f"{reached * int(g) * 256 / 1e6:.2f}M"
        st = "-" if reached == "-" else f"{reached:.0f}"
        bs = f"{noise[-1]:.3g}" if noise else "-"
        print(f"| {opt} | {g} | {steps[-1]['step']} | {evals[-1][1]:.4f} | {st} | {tok} | {bs} |")
EOF

#!/usr/bin/env bash
# plan_check.sh — the memory planner against real runs: for the default gpt
# on data/kjv (G 64) and the Fashion-MNIST mlp (G 256), across micro-batch
# sizes and checkpoint policies (gpt also with --precision bf16), `bigbatch
# plan --json`'s predicted peak per device beside the allocator's peak in
# `bigbatch train --metrics`, and the predicted relative step time beside
# the measured one (median of steps 2..STEPS, relative to the fastest
# measured configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-5}
make --no-print-directory all >/dev/null
[ -d data/fmnist/train ] || make --no-print-directory data-fmnist >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=/usr/bin/python3
rows=()
run() { # model-args data G micro checkpoint
    local args=$1 data=$2 g=$3 b=$4 p=$5
    bin/bigbatch train $args --data "$data" --global-batch "$g" --micro-batch "$b" --checkpoint "$p" \
        --steps "$STEPS" --quiet --metrics "$tmp/m.jsonl"
    bin/bigbatch plan $args --data "$data" --global-batch "$g" --micro-batch "$b" --checkpoint "$p" --json > "$tmp/p.json"
    rows+=("$($PY - "$tmp/m.jsonl" "$tmp/p.json" "$args" "$b" "$p" <<'PYEOF'
import json, statistics, sys
m = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r]  # the first line is the run's configuration
p = json.load(open(sys.argv[2]))[0]
ms = statistics.median(1000.0 / r["samples_per_s"] for r in m[1:])  # ms per example: comparable across G
model = ("gpt" if "gpt" in sys.argv[3] else "mlp") + (" bf16" if "bf16" in sys.argv[3] else "")
print(json.dumps({"model": model, "micro_batch": int(sys.argv[4]), "checkpoint": sys.argv[5],
                  "measured": m[0]["peak_mem_bytes"][0], "predicted": p["peak_bytes"], "ms_per_example": ms,
                  "predicted_time": p["relative_time"]}))
PYEOF
)")
}
for p in none every:2 blocks; do for b in 1 2 4 8; do run "--model gpt" data/kjv/train 64 "$b" "$p"; done; done
for p in none blocks; do for b in 1 8; do run "--model gpt --precision bf16" data/kjv/train 64 "$b" "$p"; done; done
for p in none blocks; do for b in 8 32 128; do run "--model mlp" data/fmnist/train 256 "$b" "$p"; done; done
printf '%s\n' "${rows[@]}" > "$tmp/rows.jsonl"
echo "# plan_check: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), median of steps 2..$STEPS"
echo
$PY - "$tmp/rows.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| model | micro-batch | checkpoint | predicted peak | allocator's peak | error | predicted time | measured time |")
print("|---|---|---|---|---|---|---|---|")
for model in ("gpt", "gpt bf16", "mlp"):
    rs = [r for r in rows if r["model"] == model]
    # the planner's times are relative to its own fastest candidate (largest micro-batch, no checkpointing):
    # compare both as ratios to this table's largest micro-batch without checkpointing
    ref = max((r for r in rs if r["checkpoint"] == "none"), key=lambda r: r["micro_batch"])
    for r in rs:
        err = 100 * (r["predicted"] - r["measured"]) / r["measured"]
        print("| %s | %d | %s | %.2f MiB | %.2f MiB | %+.2f%% | %.2fx | %.2fx |" % (
            model, r["micro_batch"], r["checkpoint"], r["predicted"] / 2**20, r["measured"] / 2**20, err,
            r["predicted_time"] / ref["predicted_time"], r["ms_per_example"] / ref["ms_per_example"]))
PYEOF

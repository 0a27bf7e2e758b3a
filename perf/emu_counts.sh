#!/usr/bin/env bash
# emu_counts.sh — what a training step costs the host on the CUDA backend,
# counted by the emulated GPU (tests/cuda_emu): host synchronizations (and
# of which kind), kernel launches, cuBLAS calls, and host<->device bytes,
# per micro-step and per step besides its micro-steps.
#
#   make cuda-emu && perf/emu_counts.sh            # the demo's gpt on data/kjv, one GPU
#   DEVICES=cuda:0,1 perf/emu_counts.sh           # two GPUs (the reducer's collectives)
#   MODEL="--layers 2 --d-model 64 --heads 4" MICRO=4 perf/emu_counts.sh
#
# Each figure is the difference of two runs' totals (BB_CUDA_EMU_STATS):
# 2 and 4 micro-steps a step (per micro-step, over the 2 x STEPS extra
# ones), STEPS and STEPS+1 steps (per step). Counts, not times: the same on
# every run and every machine, so one run of each is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/cuda-emu/bin/bigbatch}
DATA=${DATA:-data/kjv/train}
DEVICES=${DEVICES:-cuda:0}
MODEL=${MODEL:---layers 4 --heads 4 --d-model 128}
MICRO=${MICRO:-8}
STEPS=${STEPS:-2}
[ -x "$BIN" ] || { echo "emu_counts: $BIN not found: run make cuda-emu" >&2; exit 1; }
n=$(awk -F, '{print NF}' <<< "${DEVICES#cuda:}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME STEPS ACCUMULATION: the stats JSON of one run
run() {
    local global=$((MICRO * n * $3))
    BB_CUDA_EMU_STATS="$tmp/$1.json" "$BIN" train --data "$DATA" --devices "$DEVICES" $MODEL \
        --micro-batch "$MICRO" --global-batch "$global" --steps "$2" --quiet 2> "$tmp/$1.err" ||
        { cat "$tmp/$1.err" >&2; exit 1; }
}
run a "$STEPS" 2
run b $((STEPS + 1)) 2
run c "$STEPS" 4
python3 - "$tmp" "$STEPS" "$DEVICES" "$MODEL" "$MICRO" << 'EOF'
import json, os, sys
tmp, steps, devices, model, micro = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
a, b, c = (json.load(open(os.path.join(tmp, n + ".json"))) for n in "abc")
keys = ["host_syncs", "stream_syncs", "device_syncs", "event_syncs", "blocking_calls", "polls", "launches",
        "blas_calls", "cub_calls", "nccl_calls", "h2d_bytes", "h2d_copies", "d2h_bytes", "d2h_copies"]
micro_step = {k: (c[k] - a[k]) / (2 * steps) for k in keys}
step = {k: b[k] - a[k] - 2 * micro_step[k] for k in keys}
print("emu_counts: %s, %s, micro-batch %s (totals of the emulator's counters over every device)" % (devices, model, micro))
print("| counter | per micro-step | per step, besides its micro-steps |")
print("|---|---|---|")
for k in keys:
    print("| %s | %g | %g |" % (k, micro_step[k], step[k]))
EOF

#!/usr/bin/env bash
# loader_consumer.sh — what one loader thread can feed: `bench loader
# --gpus N --tokens-per-s R` on data/kjv/train (T 256) with micro-batches
# of 16 (4096 tokens, about GPT-2 124M's micro-batch of 4 at T 1024), for
# 1, 8 and 64 simulated GPUs at 500K tokens/s each (about one H200 on
# GPT-2 124M). Medians of RUNS runs (default 5), the GPU counts
# interleaved; each run is --seconds 1 at the asked rate, 1 s at full speed
# and 6 bisection probes of 1 s for the largest rate that waits < 1%.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5} RATE=${RATE:-500000} THREADS=${THREADS:-1}
make --no-print-directory all >/dev/null
median() { sort -g | awk '{a[NR]=$1} END {printf "%s", a[int((NR+1)/2)]}'; }
field() { grep -o "\"$1\": [0-9.e+]*" | head -1 | awk '{print $2}'; }
declare -A wait worst most full
for ((i = 0; i < RUNS; i++)); do
    for g in 1 8 64; do
        o=$(bin/bigbatch bench loader --data data/kjv/train --loader-threads "$THREADS" --micro-batch 16 --gpus "$g" \
            --tokens-per-s "$RATE" --seconds 1 --json)
        wait[$g]+="$(echo "$o" | field wait_pct) "; worst[$g]+="$(echo "$o" | field worst_wait_pct) "
        most[$g]+="$(echo "$o" | field max_rate_per_gpu) "; full[$g]+="$(echo "$o" | field full_speed_per_s) "
    done
done
echo "# loader_consumer: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc --all) CPUs, RUNS=$RUNS, $THREADS loader thread(s), $RATE tokens/s per GPU"
echo
echo "| simulated GPUs | tokens/s asked | GPUs waited | the worst GPU | largest rate per GPU with < 1% waiting | for all GPUs | loader at full speed |"
echo "|---|---|---|---|---|---|---|"
for g in 1 8 64; do
    m() { echo "$1" | tr ' ' '\n' | grep . | median; }
    mr=$(m "${most[$g]}")
    echo "| $g | $(( g * RATE )) | $(m "${wait[$g]}")% | $(m "${worst[$g]}")% | $mr | $(awk -v a="$mr" -v g="$g" 'BEGIN {printf "%.0f", a * g}') | $(m "${full[$g]}") |"
done

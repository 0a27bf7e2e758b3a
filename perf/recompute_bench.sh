#!/usr/bin/env bash
# recompute_bench.sh — what each checkpoint policy costs in step time and
# saves in activation memory on the CPU backend (`bench model`, 2 threads,
# the allocator's own count), against `--checkpoint none` measured in the
# same run: the policies interleaved, RUNS rounds (default 5), each run the
# median of STEPS steps after 2 warm-up steps; the table gives the median
# step time and its ratio to none's.
#
#   demo: the default gpt (4 layers, 4 heads, d 128, T 256), micro-batch 8
#   d384: 6 layers, 6 heads, d 384, T 256, micro-batch 4
#
# Policies: none, selective, blocks, and a mixed plan (half the blocks
# selective, half full). Goals (issue 30): selective <= 1.05x none,
# blocks <= 1.25x.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-5}
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]}'; }
declare -A shape=([demo]="--layers 4 --heads 4 --d-model 128 --micro-batch 8"
                  [d384]="--layers 6 --heads 6 --d-model 384 --micro-batch 4")
declare -A mixed=([demo]="plan:s*2,f*2" [d384]="plan:s*3,f*3")
declare -A ms act
for ((i = 0; i < RUNS; i++)); do
    for s in demo d384; do
        for p in none selective blocks "${mixed[$s]}"; do
            o=$(bin/bigbatch bench model --model gpt ${shape[$s]} --seq-len 256 --vocab 256 --threads 2 \
                --steps "$STEPS" --checkpoint "$p" --json)
            ms["$s $p"]+="$(echo "$o" | field step_ms) "
            act["$s $p"]=$(echo "$o" | field activation_bytes)
        done
    done
done
echo "# recompute_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, RUNS=$RUNS STEPS=$STEPS"
echo
echo "| model | checkpoint | step (median) | vs none | activations | vs none |"
echo "|---|---|---|---|---|---|"
for s in demo d384; do
    base=$(echo "${ms["$s none"]}" | tr ' ' '\n' | grep . | median)
    for p in none selective blocks "${mixed[$s]}"; do
        t=$(echo "${ms["$s $p"]}" | tr ' ' '\n' | grep . | median)
        awk -v s="$s" -v p="$p" -v t="$t" -v b="$base" -v a="${act["$s $p"]}" -v an="${act["$s none"]}" \
            'BEGIN {printf "| %s | %s | %.1f ms | %.3fx | %.1f MiB | %.2fx |\n", s, p, t, t / b, a / 1048576, a / an}'
    done
done

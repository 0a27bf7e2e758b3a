#!/usr/bin/env bash
# network_bench.sh — what a slow or lossy network costs a 2-host job: the
# delay-and-loss test of tests/test_hosts.c (2 network namespaces as hosts,
# 1 process on cpu:2 each, a gpt of 2 layers, d 64, 4 gradient buckets,
# 12 steps) run RUNS times (default 5); each run measures the clean link,
# 20 ms each way and 5% loss each way back to back, so the clean link is the
# peer of the same run. The table gives the medians over the runs of each
# run's median and mean step time (step 1 left out) and of the reducer's
# overlap, and the ratio to the clean link.
#
# Needs root (network namespaces) and an MPI build; as the test, it uses
# only the two namespaces' own addresses.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
make --no-print-directory all build/release/tests/test_hosts >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((i = 0; i < RUNS; i++)); do
    BIGBATCH_BIN=$PWD/bin/bigbatch build/release/tests/test_hosts --filter 'hosts/delay*' --verbose 2>&1 |
        grep 'step .* ms median' >> "$log" || { echo "network_bench: run $i failed" >&2; exit 1; }
done
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
echo "# network_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, RUNS=$RUNS"
echo
echo "| link | step (median) | step (mean) | vs clean (mean) | overlap |"
echo "|---|---|---|---|---|"
clean=""
for link in "no delay" "20 ms each way" "5% loss each way"; do
    rows=$(grep -F "), $link: " "$log")
    med=$(echo "$rows" | sed -E 's/.*: step ([0-9.]+) ms median.*/\1/' | median)
    mean=$(echo "$rows" | sed -E 's/.* ([0-9.]+) ms mean.*/\1/' | median)
    ov=$(echo "$rows" | sed -E 's/.*overlap ([0-9.]+)%.*/\1/' | median)
    [ -n "$clean" ] || clean=$mean
    echo "| $link | $med ms | $mean ms | $(awk -v a="$mean" -v b="$clean" 'BEGIN {printf "%.2f", a / b}')x | $ov% |"
done

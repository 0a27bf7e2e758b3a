#!/usr/bin/env bash
# queue_bench.sh — the lock-free SPSC ring against a mutex+condvar queue of
# the same capacity, measured in the same run by `bigbatch bench queue`
# (median of RUNS measurements of SECONDS_PER_RUN each, default 5 x 0.5 s),
# plus the CPU use of a consumer blocked on an empty ring for one second.
#
#   perf/queue_bench.sh
#   RUNS=9 perf/queue_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-0.5}
make --no-print-directory all >/dev/null
field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
out=$(bin/bigbatch bench queue --json --runs "$RUNS" --seconds "$SECONDS_PER_RUN")
spsc=$(echo "$out" | field spsc_items_per_s); single=$(echo "$out" | field spsc_single_items_per_s)
mutex=$(echo "$out" | field mutex_items_per_s); mutex_b=$(echo "$out" | field mutex_batched_items_per_s)
idle=$(echo "$out" | field idle_consumer_cpu_pct)
m() { awk -v a="$1" 'BEGIN {printf "%.1f", a / 1e6}'; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", a / b}'; }
echo "# queue_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), capacity 1024, batch 64, median of $RUNS x $SECONDS_PER_RUN s"
echo
echo "| queue | M items/s | vs mutex (single) | goal |"
echo "|---|---|---|---|"
echo "| spsc, push_n/pop_n of 64 | $(m "$spsc") | $(r "$spsc" "$mutex")x | >= 100 M/s, >= 10x |"
echo "| spsc, one item per call | $(m "$single") | $(r "$single" "$mutex")x | |"
echo "| mutex+condvar, one item per call | $(m "$mutex") | 1.0x | |"
echo "| mutex+condvar, up to 64 per lock | $(m "$mutex_b") | $(r "$mutex_b" "$mutex")x | |"
echo
echo "Blocked consumer: $idle% of a core over 1 s (goal ~0%)."

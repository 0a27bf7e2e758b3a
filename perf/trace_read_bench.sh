#!/usr/bin/env bash
# trace_read_bench.sh — `bigbatch report` on a large Chrome trace (two
# streamed passes, one event in memory at a time) beside Python's
# json.load of the same file (the whole document in memory): wall time
# (median of 5) and peak RSS of each, and bigbatch's RSS without a trace
# (the process's baseline).
#
#   perf/trace_read_bench.sh [MIB]      # default 200
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-200}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 perf/big_trace.py --mib "$MIB" --out "$dir/trace.json"
metrics=tests/fixtures/v0.1/metrics.jsonl
measure() { # name, command...: median seconds and the largest peak RSS (MiB) of 5 runs
    local name=$1; shift
    local times=() rss=0
    for _ in 1 2 3 4 5; do
        /usr/bin/time -f "%e %M" -o "$dir/t" "$@" > /dev/null 2>&1
        read -r s kb < "$dir/t"
        times+=("$s")
        [ "$kb" -gt "$rss" ] && rss=$kb
    done
    median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
    printf '%-34s %8.2f s %8.0f MiB\n' "$name" "$median" "$((rss / 1024))"
}
echo "trace: $(du -m "$dir/trace.json" | cut -f1) MB, $(grep -c '"ph": "X"' "$dir/trace.json") spans"
measure "bigbatch report (no trace)" bin/bigbatch report --metrics $metrics --out "$dir/a.html"
measure "bigbatch report --trace" bin/bigbatch report --metrics $metrics --trace "$dir/trace.json" --out "$dir/b.html"
measure "python3 json.load" python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$dir/trace.json"

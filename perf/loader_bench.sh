#!/usr/bin/env bash
# loader_bench.sh — the loader against `zstd -d` (one thread) and `cat` on the
# same shard files, in one run. Medians of RUNS runs (default 5), the runs of
# every configuration interleaved so that machine noise hits them alike.
# MB = 10^6 bytes.
#
#   perf/loader_bench.sh                 # Fashion-MNIST (built if missing) and data/kjv
#   RUNS=7 SECONDS_PER_RUN=3 perf/loader_bench.sh
#
# Warm rows: `bigbatch bench loader` for SECONDS_PER_RUN seconds (page cache
# warm, one consumer taking and releasing batches of 256) vs `zstd -q -d -c`
# of the same files, repeated so that zstd decodes >= 200 MB per run. Raw
# MB/s = record bytes delivered per second. Cold rows: one epoch after
# posix_fadvise(DONTNEED) of every shard (3 per round, so 3 x RUNS samples),
# io_uring vs pread, through the page cache and with --direct; `cat` after
# the same drop is the disk's pace.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
BIN=bin/bigbatch
make --no-print-directory all >/dev/null
if [ ! -d data/fmnist/train ]; then make --no-print-directory data-fmnist >/dev/null || true; fi

median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
drop_cache() { python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
# seconds of wall time for "$@"
wall() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo "$(( t1 - t0 ))" | awk '{print $1 / 1e9}'; }

echo "# loader_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), kernel $(uname -r), zstd $(zstd -V | grep -o 'v[0-9.]*'), median of $RUNS"
echo
echo "| data | run | records/s | raw MB/s | compressed MB/s | peer | peer MB/s | ratio | goal |"
echo "|---|---|---|---|---|---|---|---|---|"

bench() {
    local name=$1 dir=$2
    local files=("$dir"/*.bbs)
    local raw_bytes file_bytes repeat
    raw_bytes=$(zstd -q -d -c "${files[@]}" | wc -c)
    file_bytes=$(cat "${files[@]}" | wc -c)
    repeat=$(( 200000000 / raw_bytes + 1 ))
    local zfiles=() ; for ((k = 0; k < repeat; k++)); do zfiles+=("${files[@]}"); done
    declare -A raw rec comp
    local keys=(t1_uring t2_uring t1_pread t2_pread cold_uring cold_pread direct_uring direct_pread)
    local zstd_mb=() cat_mb=() cat_cold_mb=()
    for ((i = 0; i < RUNS; i++)); do
        zstd_mb+=("$(awk -v b="$raw_bytes" -v r="$repeat" -v s="$(wall zstd -q -d -c "${zfiles[@]}")" 'BEGIN {print b * r / 1e6 / s}')")
        cat_mb+=("$(awk -v b="$file_bytes" -v r="$repeat" -v s="$(wall cat "${zfiles[@]}")" 'BEGIN {print b * r / 1e6 / s}')")
        drop_cache "${files[@]}"
        cat_cold_mb+=("$(awk -v b="$file_bytes" -v s="$(wall cat "${files[@]}")" 'BEGIN {print b / 1e6 / s}')")
        for key in "${keys[@]}"; do
            local args=(--data "$dir" --json --no-scaling)
            case $key in
                t1_*) args+=(--warm --loader-threads 1 --seconds "$SECONDS_PER_RUN") ;;
                t2_*) args+=(--warm --loader-threads 2 --seconds "$SECONDS_PER_RUN") ;;
                cold_*) args+=(--cold) ;;
                direct_*) args+=(--cold --direct) ;;
            esac
            args+=(--io "${key#*_}")
            # A cold epoch of a small dataset lasts milliseconds: take 3 per round.
            local reps=1; case $key in cold_* | direct_*) reps=3 ;; esac
            for ((k = 0; k < reps; k++)); do
                local out; out=$("$BIN" bench loader "${args[@]}")
                raw[$key]+="$(echo "$out" | field raw_mb_per_s) "
                rec[$key]+="$(echo "$out" | field records_per_s) "
                comp[$key]+="$(echo "$out" | field compressed_mb_per_s) "
            done
        done
    done
    local zstd_med cat_med cat_cold_med
    zstd_med=$(printf '%s\n' "${zstd_mb[@]}" | median)
    cat_med=$(printf '%s\n' "${cat_mb[@]}" | median)
    cat_cold_med=$(printf '%s\n' "${cat_cold_mb[@]}" | median)
    declare -A R C N
    for key in "${keys[@]}"; do
        R[$key]=$(echo "${raw[$key]}" | tr ' ' '\n' | grep . | median)
        C[$key]=$(echo "${comp[$key]}" | tr ' ' '\n' | grep . | median)
        N[$key]=$(echo "${rec[$key]}" | tr ' ' '\n' | grep . | median | awk '{printf "%.0f", $1}')
    done
    row() { echo "| $name | $1 | ${N[$2]} | ${R[$2]} | ${C[$2]} | $3 | $4 | $(ratio "$5" "$4") | $6 |"; }
    row "1 thread, io_uring" t1_uring '`zstd -d` (raw)' "$zstd_med" "${R[t1_uring]}" ">= 0.85"
    row "1 thread, pread" t1_pread '`zstd -d` (raw)' "$zstd_med" "${R[t1_pread]}" ">= 0.85"
    row "2 threads, io_uring" t2_uring '1 thread, io_uring (raw)' "${R[t1_uring]}" "${R[t2_uring]}" ">= 1.6"
    row "2 threads, pread" t2_pread '1 thread, pread (raw)' "${R[t1_pread]}" "${R[t2_pread]}" ">= 1.6"
    row "2 threads, io_uring" t2_uring '`cat` warm (compressed)' "$cat_med" "${C[t2_uring]}" ""
    row "cold, io_uring" cold_uring 'cold, pread (compressed)' "${C[cold_pread]}" "${C[cold_uring]}" ">= 1.0"
    row "cold --direct, io_uring" direct_uring 'cold --direct, pread (compressed)' "${C[direct_pread]}" "${C[direct_uring]}" ">= 1.0"
    row "cold, io_uring" cold_uring '`cat` cold (compressed)' "$cat_cold_med" "${C[cold_uring]}" ""
}

if [ -d data/fmnist/train ]; then bench "Fashion-MNIST train" data/fmnist/train; else echo "| Fashion-MNIST | skipped: data/fmnist/train missing (make data-fmnist) |||||||"; fi
bench "KJV train" data/kjv/train

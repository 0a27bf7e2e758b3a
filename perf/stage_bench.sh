#!/usr/bin/env bash
# stage_bench.sh — host cost of handing a micro-batch of loader records to a
# model, before and after a change: builds perf/stage_bench.c against the
# CPU library of commit BASE (default HEAD) and of the working tree, and runs
# them alternately ROUNDS times (default 5). Each run prints the median
# microseconds per micro-batch of stage+use and of a memcpy of the same
# records (the peer, same run) and their ratio; compare the ratios.
#
#   perf/stage_bench.sh [BASE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD} rounds=${2:-5}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" > /dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/base" "$base" > /dev/null 2>&1
cflags="-std=gnu11 -O3 -march=native -D_GNU_SOURCE"
libs="$(pkg-config --libs liburing libzstd libxxhash zlib openblas) -lm -lpthread"
for tree in "$work/base" "$PWD"; do
    make -C "$tree" -j2 CUDA=0 BUILD=build/stage-bench LIB_DIR=build/stage-bench/lib build/stage-bench/lib/libbigbatch.a > /dev/null
done
# shellcheck disable=SC2086
gcc $cflags -I"$work/base/include" perf/stage_bench.c "$work/base/build/stage-bench/lib/libbigbatch.a" $libs -o "$work/before"
# shellcheck disable=SC2086
gcc $cflags -Iinclude perf/stage_bench.c build/stage-bench/lib/libbigbatch.a $libs -o "$work/after"
for r in $(seq "$rounds"); do
    echo "before ($base): $("$work/before")"
    echo "after (working tree): $("$work/after")"
done

#!/usr/bin/env bash
# pack_bench.sh — pack and reader throughput against the stock zstd CLI on the
# same bytes, in the same run. Whole processes on both sides, page cache warm,
# median of RUNS runs (default 7), MB/s of raw records (10^6 bytes).
#
#   perf/pack_bench.sh            # Fashion-MNIST (if installed) and the KJV text
#   RUNS=11 perf/pack_bench.sh
#
# Rows: "pack" is `bigbatch pack --threads 1` (read input, cut records,
# compress at level 3, XXH64, write shards) vs `zstd -3 -T1` on the raw
# records; "read" is `bigbatch inspect --verify` (pread every frame,
# decompress, XXH64) vs `zstd -d` of that zstd file (which also checks an
# XXH64 content checksum) and vs `zstd -d` of the shard itself.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
BIN=bin/bigbatch
make --no-print-directory all >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Median wall seconds of RUNS runs of "$@" (stdout discarded).
median_seconds() {
    local times=() t0 t1
    for ((i = 0; i < RUNS; i++)); do
        t0=$(date +%s%N)
        "$@" >/dev/null
        t1=$(date +%s%N)
        times+=("$(( t1 - t0 ))")
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.4f", a[int((NR+1)/2)]/1e9}'
}
mbps() { awk -v b="$1" -v s="$2" 'BEGIN {printf "%.0f", b / 1e6 / s}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

echo "# pack_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), zstd $(zstd -V | grep -o 'v[0-9.]*'), median of $RUNS"
echo
echo "| data | raw MB | step | bigbatch MB/s | peer | peer MB/s | ratio |"
echo "|---|---|---|---|---|---|---|"

# bench NAME PACK_ARGS... : packs with PACK_ARGS, then times everything.
bench() {
    local name=$1; shift
    "$BIN" pack "$@" --threads 1 --out "$tmp/$name" --force >/dev/null
    zstd -q -d -c "$tmp/$name"/shard-*.bbs > "$tmp/$name.raw"
    local raw_bytes; raw_bytes=$(stat -c %s "$tmp/$name.raw")
    zstd -q -3 -T1 -f "$tmp/$name.raw" -o "$tmp/$name.zst"
    local shard; shard=$(ls "$tmp/$name"/shard-*.bbs | head -1)
    [ "$(ls "$tmp/$name"/shard-*.bbs | wc -l)" -eq 1 ] || { echo "expected one shard" >&2; exit 1; }

    local t_pack t_zc t_read t_zd t_zds
    t_pack=$(median_seconds "$BIN" pack "$@" --threads 1 --out "$tmp/$name.out" --force)
    t_zc=$(median_seconds zstd -q -3 -T1 -f "$tmp/$name.raw" -o "$tmp/$name.peer.zst")
    t_read=$(median_seconds "$BIN" inspect "$tmp/$name" --verify)
    t_zd=$(median_seconds zstd -q -d -c "$tmp/$name.zst")
    t_zds=$(median_seconds zstd -q -d -c "$shard")
    local mb; mb=$(awk -v b="$raw_bytes" 'BEGIN {printf "%.1f", b / 1e6}')
    local p=$(mbps "$raw_bytes" "$t_pack") zc=$(mbps "$raw_bytes" "$t_zc")
    local r=$(mbps "$raw_bytes" "$t_read") zd=$(mbps "$raw_bytes" "$t_zd") zds=$(mbps "$raw_bytes" "$t_zds")
    echo "| $name | $mb | pack, 1 thread | $p | \`zstd -3 -T1\` | $zc | $(ratio "$p" "$zc") |"
    echo "| $name | $mb | read + verify | $r | \`zstd -d\` (its own .zst) | $zd | $(ratio "$r" "$zd") |"
    echo "| $name | $mb | read + verify | $r | \`zstd -d\` (the .bbs) | $zds | $(ratio "$r" "$zds") |"
}

FM=/usr/share/datasets/fashion-mnist
if [ -r "$FM/train-images-idx3-ubyte.gz" ]; then
    # Plain IDX input, so that pack does not pay for gunzip and zstd does not either.
    zcat "$FM/train-images-idx3-ubyte.gz" > "$tmp/images"
    zcat "$FM/train-labels-idx1-ubyte.gz" > "$tmp/labels"
    bench fmnist --format fmnist --images "$tmp/images" --labels "$tmp/labels"
else
    echo "| fmnist | - | skipped: dataset-fashion-mnist not installed | | | | |"
fi
# The KJV text four times over (35 MB of u16 records), so process start-up is noise.
zstd -q -d -c data/kjv/train/shard-*.bbs > /dev/null # warm the tools
bible -f gen1:1-rev22:21 > "$tmp/kjv1.txt" 2>/dev/null || { echo "bible-kjv missing" >&2; exit 1; }
cat "$tmp/kjv1.txt" "$tmp/kjv1.txt" "$tmp/kjv1.txt" "$tmp/kjv1.txt" > "$tmp/kjv.txt"
bench kjv-x4 --format text --in "$tmp/kjv.txt" --seq-len 256

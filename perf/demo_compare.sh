#!/usr/bin/env bash
# demo_compare.sh — the character-level demo (the embedded data/kjv, bytes,
# 450 steps) against `make demo`'s BPE one (a 2048-id tokenizer trained on
# the KJV text, DEMO_STEPS steps, chosen so both take the same wall time on
# 2 cores), on the same model shape and batch: wall seconds of `train` and
# the final validation loss in bits per byte (comparable across
# tokenizers). The losses are deterministic (the same to the digit on
# every run), so RUNS (default 1) repeats only the timing. WHICH=bytes|bpe
# runs one of the two.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
BIN=bin/bigbatch
STEPS=${DEMO_STEPS:-$(sed -n 's/^DEMO_STEPS ?= //p' Makefile)}
WHICH=${WHICH:-both} # or bytes, bpe
make --no-print-directory all >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -f gen1:1-rev22:21 > "$tmp/kjv.txt"
"$BIN" tokenizer train --in "$tmp/kjv.txt" --vocab 2048 --out "$tmp/bpe.json" >/dev/null 2>&1
"$BIN" pack --format text --in "$tmp/kjv.txt" --tokenizer "$tmp/bpe.json" --seq-len 256 --val-fraction 0.1 \
    --out "$tmp/kjv-bpe" >/dev/null
run() { # data steps eval_every -> "seconds loss bpb"
    local t0 t1 out
    t0=$(date +%s%N)
    out=$("$BIN" train --data "$1" --devices cpu:2 --global-batch 32 --micro-batch 8 --steps "$2" --lr 4e-3 --warmup 20 \
        --log-every 0 --eval-every "$3" 2>&1)
    t1=$(date +%s%N)
    echo "$out" | grep "val loss" | tail -1 | sed -E "s/.*val loss ([0-9.]+), ([0-9.]+) bits per byte.*/$(( (t1 - t0) / 1000000 )) \1 \2/"
}
echo "# demo_compare: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo
echo "| demo | tokens | steps | train wall s | val loss (nats/token) | val bits per byte |"
echo "|---|---|---|---|---|---|"
for ((r = 0; r < RUNS; r++)); do
    if [ "$WHICH" != bpe ]; then
        read -r ms loss bpb < <(run data/kjv 450 150)
        awk -v ms="$ms" -v l="$loss" -v b="$bpb" 'BEGIN {printf "| character-level (data/kjv) | bytes, vocab 256 | 450 | %.1f | %s | %s |\n", ms / 1000, l, b}'
    fi
    if [ "$WHICH" != bytes ]; then
        read -r ms loss bpb < <(run "$tmp/kjv-bpe" "$STEPS" 130)
        awk -v ms="$ms" -v l="$loss" -v b="$bpb" -v s="$STEPS" 'BEGIN {printf "| BPE (make demo) | BPE, vocab 2048 | %s | %.1f | %s | %s |\n", s, ms / 1000, l, b}'
    fi
done

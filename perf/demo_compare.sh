#!/usr/bin/env bash
# demo_compare.sh — the character-level demo (the embedded data/kjv, bytes,
# 450 steps) against `make demo`'s BPE one (a 2048-id tokenizer trained on
# the KJV text, DEMO_STEPS steps, chosen so both take the same wall time on
# 2 cores), and a llama of the demo's shape on the same BPE data (4 layers,
# 4 heads over 2 key/value heads, d 128, SwiGLU 512; LLAMA_STEPS steps, as
# many as the BPE gpt's wall time holds), on the same batch and learning
# rate: wall seconds of `train` and the final validation loss in bits per
# byte (comparable across tokenizers). The losses are deterministic (the
# same to the digit on every run), so RUNS (default 1) repeats only the
# timing. WHICH (default "bytes bpe llama") runs those named.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
BIN=bin/bigbatch
STEPS=${DEMO_STEPS:-$(sed -n 's/^DEMO_STEPS ?= //p' Makefile)}
LLAMA_STEPS=${LLAMA_STEPS:-280}
WHICH=${WHICH:-bytes bpe llama}
make --no-print-directory all >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -f gen1:1-rev22:21 > "$tmp/kjv.txt"
"$BIN" tokenizer train --in "$tmp/kjv.txt" --vocab 2048 --out "$tmp/bpe.json" >/dev/null 2>&1
"$BIN" pack --format text --in "$tmp/kjv.txt" --tokenizer "$tmp/bpe.json" --seq-len 256 --val-fraction 0.1 \
    --out "$tmp/kjv-bpe" >/dev/null
run() { # data steps eval_every [model flags] -> "seconds loss bpb"
    local t0 t1 out
    t0=$(date +%s%N)
    out=$("$BIN" train --data "$1" --devices cpu:2 --global-batch 32 --micro-batch 8 --steps "$2" --lr 4e-3 --warmup 20 \
        --log-every 0 --eval-every "$3" ${4:-} 2>&1)
    t1=$(date +%s%N)
    echo "$out" | grep "val loss" | tail -1 | sed -E "s/.*val loss ([0-9.]+), ([0-9.]+) bits per byte.*/$(( (t1 - t0) / 1000000 )) \1 \2/"
}
echo "# demo_compare: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo
echo "| demo | tokens | steps | train wall s | val loss (nats/token) | val bits per byte |"
echo "|---|---|---|---|---|---|"
row() { # name tokens steps ms loss bpb
    awk -v n="$1" -v t="$2" -v s="$3" -v ms="$4" -v l="$5" -v b="$6" \
        'BEGIN {printf "| %s | %s | %s | %.1f | %s | %s |\n", n, t, s, ms / 1000, l, b}'
}
for ((r = 0; r < RUNS; r++)); do
    for w in $WHICH; do
        case $w in
        bytes) read -r ms loss bpb < <(run data/kjv 450 150)
               row "character-level (data/kjv)" "bytes, vocab 256" 450 "$ms" "$loss" "$bpb" ;;
        bpe) read -r ms loss bpb < <(run "$tmp/kjv-bpe" "$STEPS" 130)
             row "BPE gpt (make demo)" "BPE, vocab 2048" "$STEPS" "$ms" "$loss" "$bpb" ;;
        llama) read -r ms loss bpb < <(run "$tmp/kjv-bpe" "$LLAMA_STEPS" $((LLAMA_STEPS / 3)) "--model llama --kv-heads 2")
               row "BPE llama" "BPE, vocab 2048" "$LLAMA_STEPS" "$ms" "$loss" "$bpb" ;;
        *) echo "WHICH: $w is not bytes, bpe or llama" >&2; exit 2 ;;
        esac
    done
done

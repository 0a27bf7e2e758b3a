#!/usr/bin/env bash
# tokenizer_bench.sh — bigbatch's byte-level BPE against Hugging Face's
# `tokenizers` (pinned in build/hf, `make hf-deps`) on the KJV text, in the
# same run, median of RUNS runs (default 5), rounds interleaved:
#   train   `bigbatch tokenizer train` vs tokenizers' BpeTrainer (GPT-2's
#           pre-tokenizer, the 256 bytes, <|endoftext|>) at VOCABS (default
#           2048 8192): seconds, and tokens per byte of the text encoded
#           with each's vocabulary
#   encode  `bigbatch tokenizer encode --stats --threads N` (the encoder
#           `pack --tokenizer` runs) vs tokenizers' encode_batch of the
#           text's lines on N threads (RAYON_NUM_THREADS), the same
#           tokenizer.json (ours at 2048): MB/s per thread
#   pack    `bigbatch pack --tokenizer --threads N`, whole (encode, records,
#           zstd, shards): MB/s of text
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
VOCABS=${VOCABS:-2048 8192}
BIN=bin/bigbatch
PY=build/hf/bin/python
make --no-print-directory all hf-deps >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -f gen1:1-rev22:21 > "$tmp/kjv.txt"
bytes=$(stat -c %s "$tmp/kjv.txt")
median() { sort -g | awk '{a[NR]=$1} END {printf "%.4f", a[int((NR+1)/2)]}'; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.4f", (b - a) / 1e9}'; }
tokens_of() { "$BIN" tokenizer encode --tokenizer "$1" --in "$tmp/kjv.txt" --stats | sed -E 's/.* bytes, ([0-9]+) tokens.*/\1/'; }

echo "# tokenizer_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo "# tokenizers $("$PY" -c 'import tokenizers; print(tokenizers.__version__)'); KJV $bytes bytes"
echo
echo "| vocab | bigbatch train s | tokenizers train s | time ratio (theirs/ours) | bigbatch tokens/byte | tokenizers tokens/byte | tokens ratio |"
echo "|---|---|---|---|---|---|---|"
for v in $VOCABS; do
    ours=() theirs=()
    for ((r = 0; r < RUNS; r++)); do
        t0=$(now); "$BIN" tokenizer train --in "$tmp/kjv.txt" --vocab "$v" --out "$tmp/ours-$v.json" >/dev/null 2>&1; t1=$(now)
        ours+=("$(secs "$t0" "$t1")")
        theirs+=("$("$PY" tests/hf_tokenizer.py train --in "$tmp/kjv.txt" --vocab "$v" --out "$tmp/hf-$v.json" | awk '{print $2}')")
    done
    a=$(printf '%s\n' "${ours[@]}" | median) b=$(printf '%s\n' "${theirs[@]}" | median)
    ta=$(tokens_of "$tmp/ours-$v.json") tb=$(tokens_of "$tmp/hf-$v.json")
    awk -v v="$v" -v a="$a" -v b="$b" -v ta="$ta" -v tb="$tb" -v n="$bytes" 'BEGIN {
        printf "| %s | %.3f | %.3f | %.2fx | %.4f | %.4f | %.4f |\n", v, a, b, b / a, ta / n, tb / n, ta / tb }'
done
echo
echo "| threads | bigbatch encode MB/s per thread | tokenizers encode_batch MB/s per thread | ratio | bigbatch pack --tokenizer MB/s |"
echo "|---|---|---|---|---|"
tok="$tmp/ours-2048.json"
[ -f "$tok" ] || "$BIN" tokenizer train --in "$tmp/kjv.txt" --vocab 2048 --out "$tok" >/dev/null 2>&1
for n in 1 2; do
    ours=() theirs=() packs=()
    for ((r = 0; r < RUNS; r++)); do
        ours+=("$("$BIN" tokenizer encode --tokenizer "$tok" --in "$tmp/kjv.txt" --threads $n --stats | sed -E 's/.*, ([0-9.]+) s, .*/\1/')")
        theirs+=("$("$PY" tests/hf_tokenizer.py bench --tokenizer "$tok" --in "$tmp/kjv.txt" --threads $n --runs 1 | awk '{print $2}')")
        t0=$(now); "$BIN" pack --format text --in "$tmp/kjv.txt" --seq-len 256 --tokenizer "$tok" --threads $n --out "$tmp/packed" --force >/dev/null; t1=$(now)
        packs+=("$(secs "$t0" "$t1")")
    done
    a=$(printf '%s\n' "${ours[@]}" | median) b=$(printf '%s\n' "${theirs[@]}" | median) p=$(printf '%s\n' "${packs[@]}" | median)
    awk -v n=$n -v a="$a" -v b="$b" -v p="$p" -v m="$bytes" 'BEGIN {
        printf "| %d | %.1f | %.1f | %.2fx | %.1f |\n", n, m / 1e6 / a / n, m / 1e6 / b / n, b / a, m / 1e6 / p }'
done

#!/usr/bin/env bash
# sample_bench.sh — `bigbatch sample` tokens/s with the key/value cache
# (one position per token) against --recompute (the whole context through
# the model for every token, as sample did before the cache), on the CPU,
# median of RUNS runs (default 5), and against transformers' generate()
# (its cache on, PyTorch on the same cores) where build/hf imports it:
#   demo   the default gpt (4 layers, d 128, T 256, vocab 256: 0.86M
#          parameters) after one step on data/kjv; 200 tokens
#   124M   a GPT2LMHeadModel of GPT-2 124M's shape (12 layers, 12 heads,
#          d 768, T 1024, vocab 50257), random weights, built offline;
#          TOKENS_124M (default 64) greedy tokens after a 4-token prompt
#          (--recompute: 4 tokens, each a forward over T 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
TOKENS_124M=${TOKENS_124M:-64}
BIN=bin/bigbatch
PY=build/hf/bin/python
make --no-print-directory all hf-deps >/dev/null
source perf/peer_env.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
rate() { BB_LOG=info "$BIN" sample "$@" 2>&1 >/dev/null | sed -nE 's/.*: ([0-9.]+) tokens\/s.*/\1/p'; }

echo "# sample_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo
echo "| model | tokens | cached tokens/s | --recompute tokens/s | speed-up | transformers generate tokens/s | bigbatch / transformers |"
echo "|---|---|---|---|---|---|---|"
"$BIN" train --data data/kjv --devices cpu:1 --global-batch 8 --micro-batch 8 --steps 1 --save "$tmp/demo" --quiet
cached=() recomputed=()
for ((r = 0; r < RUNS; r++)); do
    cached+=("$(rate --ckpt "$tmp/demo" --tokens 200 --seed $r)")
    recomputed+=("$(rate --ckpt "$tmp/demo" --tokens 200 --seed $r --recompute)")
done
a=$(printf '%s\n' "${cached[@]}" | median) b=$(printf '%s\n' "${recomputed[@]}" | median)
awk -v a="$a" -v b="$b" 'BEGIN {printf "| demo (0.86M) | 200 | %.0f | %.0f | %.1fx | - | - |\n", a, b, a / b}'
if "$PY" -c 'import transformers' 2>/dev/null; then
    "$PY" tests/hf_models.py make --out "$tmp/gpt2" --layers 12 --heads 12 --d 768 --positions 1024 --vocab 50257 2>/dev/null
    prompt="464 3290 318 257"
    cached=() recomputed=() theirs=()
    for ((r = 0; r < RUNS; r++)); do
        cached+=("$(rate --init-from "$tmp/gpt2" --prompt 'The dog is a' --ids --temperature 0 --tokens "$TOKENS_124M")")
        recomputed+=("$(rate --init-from "$tmp/gpt2" --prompt 'The dog is a' --ids --temperature 0 --tokens 4 --recompute)")
        theirs+=("$("$PY" tests/hf_models.py generate --model "$tmp/gpt2" --prompt-ids "$prompt" --tokens "$TOKENS_124M" 2>&1 >/dev/null |
                   sed -nE 's/.*: ([0-9.]+) tokens\/s.*/\1/p')")
    done
    a=$(printf '%s\n' "${cached[@]}" | median) b=$(printf '%s\n' "${recomputed[@]}" | median)
    c=$(printf '%s\n' "${theirs[@]}" | median)
    awk -v a="$a" -v b="$b" -v c="$c" -v n="$TOKENS_124M" 'BEGIN {
        printf "| GPT-2 124M shape | %d | %.1f | %.2f | %.0fx | %.1f | %.2fx |\n", n, a, b, a / b, c, a / c }'
else
    echo "| GPT-2 124M shape | - | - | - | - | - | build/hf cannot import transformers |"
fi

#!/usr/bin/env bash
# memory_bench.sh — where a real model's memory goes, measured by the
# allocator: the GPT-2 124M shape (12 layers, 12 heads, d 768, vocabulary
# 50257) on the CPU backend, `bench model` (peak device bytes and
# activation bytes of a training step, 2 threads):
#
#   T 1024 at micro-batch 1 and 4, checkpoint none and blocks;
#   T 512 vs 1024 at micro-batch 4 (an attention that keeps T² terms: ratio
#   above 2; linear: 2 or below — issue 17's goal: <= 2.1);
#   vocabulary 256 vs 50257 at T 1024, micro-batch 4 (logits of B·T·V, or
#   one chunk of the fused head: the peak may grow by the extra parameters,
#   gradients and AdamW state, 16 bytes per extra parameter, and one chunk);
#
# the largest micro-batch `plan` fits for G 64 in 16 GiB and in 80 GiB
# of one GPU (T 1024, vocabulary 50257; an llm.c-format file of random
# tokens packed with `pack --format llmc` gives the shape); and (issue 30)
# at T 1024, micro-batch 4, fp32 on the CPU: none, selective, blocks and
# the planner's choice when the activations may take 3, 2 and 1.5 GiB (a
# --device-mem whose usable 95% is the rest of the step — weights,
# gradients, AdamW state, batches: 1.86 GiB — plus that), each predicted
# peak (`plan --json`) against the allocator's in a one-step `train` run.
# Memory is deterministic: one run each. Slow: about 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { $PY -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
gib() { awk -v b="$1" 'BEGIN {printf "%.2f GiB", b / 1073741824}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
# the GPT-2 shape as data (for plan): an llm.c file of random tokens
$PY - "$tmp/gpt2.bin" <<'EOF'
import random, struct, sys
n = 1025 * 8
random.seed(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
EOF
bin/bigbatch pack --format llmc --in "$tmp/gpt2.bin" --seq-len 1024 --vocab 50257 --out "$tmp/data" >/dev/null
shape="--model gpt --layers 12 --heads 12 --d-model 768 --threads 2 --steps 1 --json"
bench() { bin/bigbatch bench model $shape "$@"; }

echo "# memory_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p')"
echo
echo "| T | vocab | micro-batch | checkpoint | peak | activations |"
echo "|---|---|---|---|---|---|"
declare -A act peak
for cfg in "1024 50257 1 none" "1024 50257 1 blocks" "1024 50257 4 none" "1024 50257 4 blocks" \
           "512 50257 4 none" "1024 256 4 none"; do
    read -r T V B P <<< "$cfg"
    o=$(bench --seq-len "$T" --vocab "$V" --micro-batch "$B" --checkpoint "$P")
    a=$(echo "$o" | field activation_bytes)
    act["$T $V $B $P"]=$a
    peak["$T $V $B $P"]=$(echo "$o" | field peak_bytes)
    echo "| $T | $V | $B | $P | $(gib "$(echo "$o" | field peak_bytes)") | $(gib "$a") |"
done
echo
printf '| activations, T 1024 / T 512 (micro-batch 4, none) | %.2fx |\n' \
    "$(awk -v a="${act["1024 50257 4 none"]}" -v b="${act["512 50257 4 none"]}" 'BEGIN {print a / b}')"
printf '| activations, vocabulary 50257 - 256 (T 1024, micro-batch 4, none) | %s |\n' \
    "$(gib $((act["1024 50257 4 none"] - act["1024 256 4 none"])))"
printf '| activations with blocks, none / blocks (micro-batch 4) | %.2fx |\n' \
    "$(awk -v a="${act["1024 50257 4 none"]}" -v b="${act["1024 50257 4 blocks"]}" 'BEGIN {print a / b}')"
printf '| activations with blocks, micro-batch 4 | %s MiB |\n' \
    "$(awk -v a="${act["1024 50257 4 blocks"]}" 'BEGIN {printf "%.1f", a / 1048576}')"
# what the vocabulary may add: 16 bytes per extra parameter (weights, gradients, AdamW's two moments) and one chunk
chunk=$(bin/bigbatch plan --data "$tmp/data" --layers 12 --heads 12 --d-model 768 --global-batch 4 --micro-batch 4 \
    --checkpoint none --json | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["loss_chunk"])')
bound=$(( (50257 - 256) * 768 * 16 + chunk * 50257 * 4 ))
printf '| peak, vocabulary 50257 - 256 (T 1024, micro-batch 4, none) | %s MiB (bound: %s MiB = 16 B x extra parameters + one chunk of %d tokens) |\n' \
    "$(mib $((peak["1024 50257 4 none"] - peak["1024 256 4 none"])))" "$(mib "$bound")" "$chunk"

# the largest micro-batch plan fits, G 64 on one GPU
echo
echo "| plan, G 64, T 1024, vocabulary 50257 | 16 GiB | 80 GiB |"
echo "|---|---|---|"
for P in none blocks auto; do
    row="| --checkpoint $P |"
    for M in 16GiB 80GiB; do
        best=$(bin/bigbatch plan --data "$tmp/data" --layers 12 --heads 12 --d-model 768 --global-batch 64 \
            --devices cuda:0 --device-mem "$M" --checkpoint "$P" --json 2>/dev/null |
            $PY -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["fits"]]; print(max((x["micro_batch"] for x in r), default=0))' || echo 0)
        row="$row micro-batch $best |"
    done
    echo "$row"
done

# checkpoint policies and the planner's choices under a cap (issue 30)
echo
echo "| T 1024, micro-batch 4, fp32 | checkpoint | activations | predicted peak | allocator's peak |"
echo "|---|---|---|---|---|"
gpt2="--data $tmp/data --layers 12 --heads 12 --d-model 768 --global-batch 4 --micro-batch 4"
rest=$(bin/bigbatch plan $gpt2 --checkpoint none --json |
    $PY -c 'import json,sys; r=json.load(sys.stdin)[0]; print(r["peak_bytes"] - r["activations_bytes"])')
for what in ${WHAT:-none selective blocks 3 2 1.5}; do
    case $what in
    none|selective|blocks)
        row=$(bin/bigbatch plan $gpt2 --checkpoint "$what" --json |
              $PY -c 'import json,sys; r=json.load(sys.stdin)[0]; print(r["checkpoint"], r["peak_bytes"], r["activations_bytes"])')
        label="--checkpoint $what" ;;
    *)  mem=$(awk -v r="$rest" -v g="$what" 'BEGIN {printf "%.0f", (r + g * 1073741824) / 0.95 + 1}')
        row=$(bin/bigbatch plan $gpt2 --device-mem "$mem" --json |
              $PY -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["chosen"]][0]; print(r["checkpoint"], r["peak_bytes"], r["activations_bytes"])')
        label="planner, activations <= $what GiB (--device-mem $(gib "$mem"))" ;;
    esac
    read -r policy predicted activations <<< "$row"
    bin/bigbatch train $gpt2 --checkpoint "$policy" --steps 1 --quiet --metrics "$tmp/m.jsonl" >/dev/null
    actual=$($PY -c 'import json,sys; print(max(json.loads(l)["peak_mem_bytes"][0] for l in open(sys.argv[1]) if "step" in json.loads(l)))' "$tmp/m.jsonl")
    echo "| $label | $policy | $(gib "$activations") | $(gib "$predicted") | $(gib "$actual")$([ "$predicted" = "$actual" ] && echo " (equal)" || echo " (DIFFERS)") |"
done

#!/usr/bin/env bash
# gpt2_bf16_bench.sh — GPT-2 124M's shape (12 layers, 12 heads, d 768, T 1024,
# V 50257) on the CPU backend with THREADS (default 2) threads: the step time
# of --precision fp32 and bf16, interleaved, median of RUNS (default 5) runs
# of STEPS (default 1) timed steps each (after bench model's 2 warm-up
# steps), at micro-batch MICRO (default 1), with their activation memory
# and the allocator's peak, and the ratios. Then, once each, the activation
# memory at micro-batch MEM_MICRO (default 4; skipped when empty).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-1}
THREADS=${THREADS:-2}
MICRO=${MICRO:-1}
MEM_MICRO=${MEM_MICRO-4}
make --no-print-directory all >/dev/null
field() { grep -o "\"$1\": [0-9.e+]*" | head -1 | awk '{print $2}'; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
gpt2=(--model gpt --layers 12 --heads 12 --d-model 768 --seq-len 1024 --vocab 50257 --threads "$THREADS")
declare -A R=()
for ((i = 0; i < RUNS; i++)); do
    for p in fp32 bf16; do
        o=$(bin/bigbatch bench model "${gpt2[@]}" --micro-batch "$MICRO" --steps "$STEPS" --precision $p --json)
        R[ms_$p]+="$(echo "$o" | field step_ms) "
        R[act_$p]=$(echo "$o" | field activation_bytes)
        R[peak_$p]=$(echo "$o" | field peak_bytes)
    done
done
m() { echo "${R[$1]}" | tr ' ' '\n' | grep . | median; }
echo "gpt2 124M, micro-batch $MICRO, $THREADS threads: step fp32 $(m ms_fp32) ms, bf16 $(m ms_bf16) ms" \
     "(bf16/fp32 time $(r "$(m ms_bf16)" "$(m ms_fp32)"))"
echo "gpt2 124M, micro-batch $MICRO: activations fp32 ${R[act_fp32]} bf16 ${R[act_bf16]} bytes" \
     "($(r "${R[act_bf16]}" "${R[act_fp32]}")x); peak fp32 ${R[peak_fp32]} bf16 ${R[peak_bf16]} bytes" \
     "($(r "${R[peak_bf16]}" "${R[peak_fp32]}")x)"
if [ -n "$MEM_MICRO" ]; then
    for p in fp32 bf16; do
        o=$(bin/bigbatch bench model "${gpt2[@]}" --micro-batch "$MEM_MICRO" --steps 1 --precision $p --json)
        R[mact_$p]=$(echo "$o" | field activation_bytes) R[mpeak_$p]=$(echo "$o" | field peak_bytes)
        R[mms_$p]=$(echo "$o" | field step_ms)
    done
    echo "gpt2 124M, micro-batch $MEM_MICRO (one run): step fp32 ${R[mms_fp32]} ms, bf16 ${R[mms_bf16]} ms;" \
         "activations fp32 ${R[mact_fp32]} bf16 ${R[mact_bf16]} bytes ($(r "${R[mact_bf16]}" "${R[mact_fp32]}")x);" \
         "peak fp32 ${R[mpeak_fp32]} bf16 ${R[mpeak_bf16]} ($(r "${R[mpeak_bf16]}" "${R[mpeak_fp32]}")x)"
fi
bin/bigbatch bench model --model gpt --micro-batch 1 --threads 1 --steps 1 --precision bf16 2>&1 | grep -o "products: .*" || true

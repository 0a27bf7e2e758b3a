#!/usr/bin/env bash
# llama_bench.sh — a llama of the demo's size (4 layers, 4 heads over 2
# key/value heads, d 128, SwiGLU 512, T 256, the demo's vocabulary of 2048,
# micro-batch 8: 2048 tokens a step) trained by `bigbatch bench model
# --model llama` against transformers' LlamaForCausalLM of the same shape
# (perf/torch_llama_bench.py: forward, loss, backward, AdamW), THREADS
# (default 2) threads on both sides, fp32 and bf16 (transformers under
# torch.autocast), in one run, interleaved, median of RUNS (default 5) runs,
# each the median of STEPS (default 5) steps after 2 warm-up steps. Prints
# the tokens/s of each and the ratios. Needs make hf-deps (build/hf).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-5}
THREADS=${THREADS:-2}
L=4 H=4 KV=2 D=128 FFN=512 T=256 V=2048 B=8
make --no-print-directory all >/dev/null
make --no-print-directory hf-deps-fetch >/dev/null
. perf/peer_env.sh
field() { grep -o "\"$1\": [0-9.e+]*" | awk '{print $2}'; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
declare -A R=()
for ((i = 0; i < RUNS; i++)); do
    for p in fp32 bf16; do
        o=$(bin/bigbatch bench model --model llama --layers $L --heads $H --kv-heads $KV --d-model $D --ffn $FFN \
            --seq-len $T --vocab $V --micro-batch $B --threads "$THREADS" --steps "$STEPS" --precision $p --json)
        R[bb_$p]+="$(echo "$o" | field tokens_per_s) "
        o=$(build/hf/bin/python perf/torch_llama_bench.py "$THREADS" "$STEPS" $p $L $H $KV $D $FFN $T $V $B)
        R[hf_$p]+="$(echo "$o" | field tokens_per_s) "
    done
done
m() { echo "${R[$1]}" | tr ' ' '\n' | grep . | median; }
echo "# llama_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $THREADS threads," \
     "median of $RUNS runs x $STEPS steps; transformers $(build/hf/bin/python -c 'import transformers; print(transformers.__version__)')," \
     "torch $(build/hf/bin/python -c 'import torch; print(torch.__version__)')"
for p in fp32 bf16; do
    echo "$p: tokens/s bigbatch $(m bb_$p), transformers $(m hf_$p)$([ $p = bf16 ] && echo ' (autocast)'):" \
         "bigbatch / transformers $(r "$(m bb_$p)" "$(m hf_$p)")x"
done

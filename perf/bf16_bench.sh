#!/usr/bin/env bash
# bf16_bench.sh — bigbatch's --precision bf16 against PyTorch under
# torch.autocast("cpu", dtype=torch.bfloat16) and against its own fp32, on
# the tiny gpt of issue 42 (4 layers, 4 heads, d 256, T 256, V 256,
# micro-batch 32: 8192 tokens a step, AdamW), THREADS (default 1 and 2)
# threads on both sides, in one run, interleaved, median of RUNS (default 5)
# runs, each the median of STEPS steps after 2 warm-up steps. Prints the
# tokens/s of each and the ratios, the activation memory of fp32 and bf16,
# and who runs bigbatch's bf16 products on this CPU; then, on one thread,
# the step's products' rate (bench model's op profile: linear_forward and
# linear_backward) as they run and with oneDNN's bf16 matmul forced
# (BB_BF16_PRODUCTS=onednn), median of RUNS, and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-5}
THREADS=${THREADS:-"1 2"}
B=32
make --no-print-directory all >/dev/null
. perf/peer_env.sh
field() { grep -o "\"$1\": [0-9.e+]*" | awk '{print $2}'; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
for th in $THREADS; do
    declare -A R=()
    for ((i = 0; i < RUNS; i++)); do
        for p in fp32 bf16; do
            o=$(bin/bigbatch bench model --model gpt --d-model 256 --micro-batch $B --threads "$th" --steps "$STEPS" \
                --precision $p --json)
            R[bb_$p]+="$(echo "$o" | field tokens_per_s) "
            R[act_$p]=$(echo "$o" | field activation_bytes)
            R[torch_$p]+="$(/usr/bin/python3 perf/torch_model_bench.py gpt "$th" "$STEPS" $p $B | field tokens_per_s) "
        done
    done
    m() { echo "${R[$1]}" | tr ' ' '\n' | grep . | median; }
    echo "threads $th: tokens/s bigbatch fp32 $(m bb_fp32), bigbatch bf16 $(m bb_bf16), torch fp32 $(m torch_fp32)," \
         "torch autocast bf16 $(m torch_bf16)"
    echo "threads $th: bigbatch bf16 / torch autocast $(r "$(m bb_bf16)" "$(m torch_bf16)"), bigbatch bf16 / own fp32" \
         "$(r "$(m bb_bf16)" "$(m bb_fp32)"), activations fp32 ${R[act_fp32]} bf16 ${R[act_bf16]} bytes" \
         "($(r "${R[act_bf16]}" "${R[act_fp32]}")x)"
    unset R
done
bin/bigbatch bench model --model gpt --d-model 256 --micro-batch 1 --threads 1 --steps 1 --precision bf16 2>&1 |
    grep -o "products: .*" || true
rate() { # the linear ops' GFLOP/s of one profiled bf16 step
    BB_PROFILE_OPS=1 BB_BF16_PRODUCTS=$1 bin/bigbatch bench model --model gpt --d-model 256 --micro-batch $B \
        --threads 1 --steps "$STEPS" --precision bf16 --json | /usr/bin/python3 -c '
import json, sys
ops = [o for o in json.load(sys.stdin)["ops"] if o["op"].startswith("linear_")]
print("%.1f" % (sum(o["gflop"] for o in ops) / sum(o["ms"] for o in ops) * 1e3))'
}
declare -A P=()
for ((i = 0; i < RUNS; i++)); do
    for e in default onednn; do P[$e]+="$(rate "$([ $e = onednn ] && echo onednn || echo "")") "; done
done
pm() { echo "${P[$1]}" | tr ' ' '\n' | grep . | median; }
echo "products (1 thread, GFLOP/s): as they run $(pm default), oneDNN's bf16 matmul $(pm onednn)" \
     "($(r "$(pm default)" "$(pm onednn)")x oneDNN's rate)"

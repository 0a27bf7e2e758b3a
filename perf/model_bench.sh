#!/usr/bin/env bash
# model_bench.sh — training-step throughput of the CPU backend against
# PyTorch on the same models, shapes and step (forward, loss, backward,
# AdamW), in one run, interleaved, median of RUNS (default 5) runs, each run
# itself the median of STEPS steps after 2 warm-up steps. 2 threads on both
# sides; PyTorch gets OpenBLAS (pthread build) and a passive OpenMP wait
# policy, as ARCHITECTURE.md's measured facts require for a fair peer.
#
#   gpt: 4 layers, 4 heads, d 256, seq 256, vocab 256, micro-batch 8 (tokens/s)
#   mlp: 784-1024-1024-10, micro-batch 256 (samples/s)
#   plus bigbatch with --checkpoint blocks (gpt) / every:1 (mlp): step time
#   and activation memory against no checkpointing; and gpt with
#   --precision bf16 (activations stored in bf16; products stay fp32 on the
#   CPU): step time and activation memory against fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-5}
make --no-print-directory all >/dev/null
. perf/peer_env.sh
field() { grep -o "\"$1\": [0-9.]*" | awk '{print $2}'; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'; }
declare -A R
add() { R[$1]+="$2 "; }
for ((i = 0; i < RUNS; i++)); do
    o=$(bin/bigbatch bench model --model gpt --d-model 256 --threads 2 --steps "$STEPS" --json)
    add gpt_none "$(echo "$o" | field step_ms)"; gpt_act_none=$(echo "$o" | field activation_bytes)
    o=$(bin/bigbatch bench model --model gpt --d-model 256 --threads 2 --steps "$STEPS" --checkpoint blocks --json)
    add gpt_blocks "$(echo "$o" | field step_ms)"; gpt_act_blocks=$(echo "$o" | field activation_bytes)
    add gpt_torch "$(/usr/bin/python3 perf/torch_model_bench.py gpt 2 "$STEPS" | field step_ms)"
    o=$(bin/bigbatch bench model --model gpt --d-model 256 --threads 2 --steps "$STEPS" --precision bf16 --json)
    add gpt_bf16 "$(echo "$o" | field step_ms)"; gpt_act_bf16=$(echo "$o" | field activation_bytes)
    o=$(bin/bigbatch bench model --model mlp --threads 2 --steps "$((STEPS * 4))" --json)
    add mlp_none "$(echo "$o" | field step_ms)"; mlp_act_none=$(echo "$o" | field activation_bytes)
    o=$(bin/bigbatch bench model --model mlp --threads 2 --steps "$((STEPS * 4))" --checkpoint every:1 --json)
    add mlp_every1 "$(echo "$o" | field step_ms)"; mlp_act_every1=$(echo "$o" | field activation_bytes)
    add mlp_torch "$(/usr/bin/python3 perf/torch_model_bench.py mlp 2 "$((STEPS * 4))" | field step_ms)"
done
m() { echo "${R[$1]}" | tr ' ' '\n' | grep . | median; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
rate() { awk -v n="$1" -v ms="$2" 'BEGIN {printf "%.0f", n / ms * 1000}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "# model_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), 2 threads, median of $RUNS runs x $STEPS+ steps"
echo
echo "| model | run | step ms | throughput | vs PyTorch | activations MiB |"
echo "|---|---|---|---|---|---|"
g=$(m gpt_none) gb=$(m gpt_blocks) g16=$(m gpt_bf16) gt=$(m gpt_torch) mn=$(m mlp_none) m1=$(m mlp_every1) mt=$(m mlp_torch)
echo "| gpt 4x256, T 256, B 8 | bigbatch | $g | $(rate 2048 "$g") tok/s | **$(r "$gt" "$g")x** | $(mib "$gpt_act_none") |"
echo "| | bigbatch --checkpoint blocks | $gb | $(rate 2048 "$gb") tok/s | $(r "$gt" "$gb")x | $(mib "$gpt_act_blocks") |"
echo "| | bigbatch --precision bf16 | $g16 | $(rate 2048 "$g16") tok/s | $(r "$gt" "$g16")x | $(mib "$gpt_act_bf16") |"
echo "| | PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') | $gt | $(rate 2048 "$gt") tok/s | 1.00x | |"
echo "| mlp 784-1024-1024-10, B 256 | bigbatch | $mn | $(rate 256 "$mn") samples/s | **$(r "$mt" "$mn")x** | $(mib "$mlp_act_none") |"
echo "| | bigbatch --checkpoint every:1 | $m1 | $(rate 256 "$m1") samples/s | $(r "$mt" "$m1")x | $(mib "$mlp_act_every1") |"
echo "| | PyTorch | $mt | $(rate 256 "$mt") samples/s | 1.00x | |"
echo
echo "Checkpointing: gpt step time x$(r "$gb" "$g") (goal <= 1.4), activations x$(r "$gpt_act_blocks" "$gpt_act_none"); mlp step time x$(r "$m1" "$mn"), activations x$(r "$mlp_act_every1" "$mlp_act_none")."
echo "bf16 activations (gpt): step time x$(r "$g16" "$g"), activations x$(r "$gpt_act_bf16" "$gpt_act_none")."

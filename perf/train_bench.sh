#!/usr/bin/env bash
# train_bench.sh — `bigbatch train` beside PyTorch, in one run:
#
#   1. Fashion-MNIST mlp 784-1024-1024-10, G 256 as 8 micro-steps x 32 on one
#      device, AdamW lr 1e-3 (constant, weight decay 0.01 on matrices, no
#      clipping), 5 epochs: test accuracy of bigbatch and of
#      perf/torch_train_bench.py (the same recipe). One run each (ACC_RUNS).
#   2. Throughput of the default gpt (4 layers, d 128, T 256) with G 64 as
#      8 x 8: median tokens/s over steps 3..STEPS of each run, median of RUNS
#      interleaved runs, against PyTorch's median step.
#   3. Overlap: the same gpt on 2 CPU devices (G 64 = 2 x 4 x 8), reducer
#      overlapping the backward vs --no-overlap: step time, overlap % and
#      data-wait %; and the Fashion-MNIST mlp on 2 devices with G 64 = 2 x 1
#      x 32, where the all-reduce is a larger part of the step.
#   4. ZeRO-1: the same gpt on cpu:2 (G 64 = 2 x 4 x 8) and cpu:4 (4 x 2 x
#      8) with --zero 1 against --zero 0: step time (goal: <= 1.05x).
#
# Both sides use 2 threads, OpenBLAS (pthread build) and passive OpenMP
# waiting, as ARCHITECTURE.md's measured facts require for a fair peer.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-8}
ACC_RUNS=${ACC_RUNS:-1}
make --no-print-directory all >/dev/null
[ -d data/fmnist/train ] || make --no-print-directory data-fmnist >/dev/null
. perf/peer_env.sh
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. perf/train_common.sh

gpt_args="--data data/kjv/train --global-batch 64 --micro-batch 8 --steps $STEPS --lr 1e-3 --quiet"
mlp_args="--model mlp --data data/fmnist/train --devices cpu:2 --global-batch 64 --micro-batch 32 --steps 40 --quiet"
declare -a bb_tok torch_tok ov_ms ov_pct ov_wait no_ms no_wait mov_ms mno_ms mov_red mov_pct z0_2 z1_2 z0_4 z1_4
step_ms() { $PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$1" samples_per_s)"; }
for ((i = 0; i < RUNS; i++)); do
    bin/bigbatch train $gpt_args --metrics "$tmp/g.jsonl"
    bb_tok+=("$(steady "$tmp/g.jsonl" tokens_per_s)")
    torch_tok+=("$($PY perf/torch_train_bench.py gpt --data data/kjv --layers 4 --heads 4 --d-model 128 \
        --global-batch 64 --micro-batch 8 --steps $((STEPS - 2)) --warmup-steps 2 --lr 1e-3 --threads 2 \
        2>/dev/null | field tokens_per_s)")
    bin/bigbatch train $gpt_args --devices cpu:2 --metrics "$tmp/o.jsonl"
    ov_ms+=("$($PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$tmp/o.jsonl" samples_per_s)")")
    ov_pct+=("$(steady "$tmp/o.jsonl" overlap_pct)"); ov_wait+=("$(steady "$tmp/o.jsonl" data_wait_pct)")
    bin/bigbatch train $gpt_args --devices cpu:2 --no-overlap --metrics "$tmp/n.jsonl"
    no_ms+=("$($PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$tmp/n.jsonl" samples_per_s)")")
    no_wait+=("$(steady "$tmp/n.jsonl" data_wait_pct)")
    bin/bigbatch train $mlp_args --metrics "$tmp/mo.jsonl"
    mov_ms+=("$($PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$tmp/mo.jsonl" samples_per_s)")")
    mov_red+=("$(steady "$tmp/mo.jsonl" reduce_ms)"); mov_pct+=("$(steady "$tmp/mo.jsonl" overlap_pct)")
    bin/bigbatch train $mlp_args --no-overlap --metrics "$tmp/mn.jsonl"
    mno_ms+=("$($PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$tmp/mn.jsonl" samples_per_s)")")
    for n in 2 4; do
        bin/bigbatch train $gpt_args --devices cpu:$n --micro-batch 8 --zero 0 --metrics "$tmp/z0.jsonl"
        bin/bigbatch train $gpt_args --devices cpu:$n --micro-batch 8 --zero 1 --metrics "$tmp/z1.jsonl"
        eval "z0_$n+=(\"\$(step_ms \"\$tmp/z0.jsonl\")\")"; eval "z1_$n+=(\"\$(step_ms \"\$tmp/z1.jsonl\")\")"
    done
done

declare -a bb_acc torch_acc
for ((i = 0; i < ACC_RUNS; i++)); do
    bin/bigbatch train --model mlp --data data/fmnist --global-batch 256 --micro-batch 32 --epochs 5 --lr 1e-3 \
        --lr-schedule constant --weight-decay 0.01 --grad-clip 0 --beta2 0.999 --seed $((i + 1)) --log-every 0 \
        --metrics "$tmp/m.jsonl" 2>/dev/null
    bb_acc+=("$(tail -1 "$tmp/m.jsonl" | field val_accuracy)")
    torch_acc+=("$($PY perf/torch_train_bench.py mlp --data data/fmnist --epochs 5 --global-batch 256 --lr 1e-3 \
        --weight-decay 0.01 --seed $((i + 1)) --threads 2 2>/dev/null | field test_accuracy)")
done

bt=$(median "${bb_tok[@]}") tt=$(median "${torch_tok[@]}")
om=$(median "${ov_ms[@]}") nm=$(median "${no_ms[@]}")
echo "# train_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), median of $RUNS runs (steps 3..$STEPS of each)"
echo
echo "| what | bigbatch | PyTorch $($PY -c 'import torch; print(torch.__version__)') | ratio |"
echo "|---|---|---|---|"
printf '| gpt 4x128 T 256, G 64 = 8 x 8, tokens/s | %.0f | %.0f | **%sx** |\n' "$bt" "$tt" "$(r2 "$bt" "$tt")"
for ((i = 0; i < ACC_RUNS; i++)); do
    printf '| Fashion-MNIST mlp, 5 epochs, test accuracy (seed %d) | %.2f%% | %.2f%% | %+.2f points |\n' $((i + 1)) \
        "$(awk -v a="${bb_acc[$i]}" 'BEGIN {print 100 * a}')" "$(awk -v a="${torch_acc[$i]}" 'BEGIN {print 100 * a}')" \
        "$(awk -v a="${bb_acc[$i]}" -v b="${torch_acc[$i]}" 'BEGIN {print 100 * (a - b)}')"
done
echo
echo "| gpt on cpu:2 (G 64 = 2 x 4 x 8) | step ms | overlap % | data-wait % |"
echo "|---|---|---|---|"
printf '| reducer overlapping the backward | %.0f | %.0f | %.2f |\n' "$om" "$(median "${ov_pct[@]}")" "$(median "${ov_wait[@]}")"
printf '| --no-overlap | %.0f | 0 | %.2f |\n' "$nm" "$(median "${no_wait[@]}")"
printf '| overlap / no-overlap step time | **%s** | | |\n' "$(r2 "$om" "$nm")"
printf '| gpt tokens/s on cpu:2 vs cpu:1 (data parallel vs 2 BLAS threads) | %.0f vs %.0f: **%sx** | | |\n' \
    "$(awk -v ms="$om" 'BEGIN {print 64 * 256 / ms * 1000}')" "$bt" "$(r2 "$(awk -v ms="$om" 'BEGIN {print 64 * 256 / ms * 1000}')" "$bt")"
mo=$(median "${mov_ms[@]}") mn=$(median "${mno_ms[@]}")
echo
echo "| mlp 784-1024-1024-10 on cpu:2 (G 64 = 2 x 1 x 32) | step ms | reduce ms | overlap % |"
echo "|---|---|---|---|"
printf '| reducer overlapping the backward | %.2f | %.2f | %.0f |\n' "$mo" "$(median "${mov_red[@]}")" "$(median "${mov_pct[@]}")"
printf '| --no-overlap | %.2f | | 0 |\n' "$mn"
printf '| overlap / no-overlap step time | **%s** | | |\n' "$(r2 "$mo" "$mn")"
echo
echo "| gpt, ZeRO-1 (G 64) | --zero 0 step ms | --zero 1 step ms | zero 1 / zero 0 |"
echo "|---|---|---|---|"
for n in 2 4; do
    eval "a=\$(median \"\${z0_$n[@]}\") b=\$(median \"\${z1_$n[@]}\")"
    printf '| cpu:%d (%d x %d x 8) | %.0f | %.0f | **%s** |\n' "$n" "$n" $((8 / n)) "$a" "$b" "$(r2 "$b" "$a")"
done
echo
echo "per-run gpt tokens/s: bigbatch ${bb_tok[*]}; PyTorch ${torch_tok[*]}"
echo "per-run cpu:2 step ms: overlap ${ov_ms[*]}; no-overlap ${no_ms[*]}"
echo "per-run mlp cpu:2 step ms: overlap ${mov_ms[*]}; no-overlap ${mno_ms[*]}"

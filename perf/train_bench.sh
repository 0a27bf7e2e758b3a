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
#   4. ZeRO-1, ZeRO-2 and ZeRO-3: the same gpt on cpu:2 (G 64 = 2 x 4 x 8)
#      and cpu:4 (4 x 2 x 8) with --zero 1, 2 and 3 against --zero 0,
#      buckets of 1 MiB (so that the windows cycle): step time (goals:
#      ZeRO-2 <= 1.05x, ZeRO-3 <= 1.25x).
#   5. CPU speed against PyTorch on the same work, every side with 2
#      threads and clipping the gradient norm to 1: a gpt of 4 layers, 4
#      heads, d 256, T 256, G 32 (8192 tokens a step; AdamW) as 8 x 4 on
#      cpu:1 and as 2 x 4 x 4 or 2 x 2 x 8 on cpu:2; the Fashion-MNIST mlp
#      with SGD (momentum 0.9), G 256 as 1 x 256 and as 8 x 32 (cpu:2:
#      2 x 1 x 128 and 2 x 4 x 32). Tokens or samples per second, and the
#      share of the machine's sgemm rate on the gpt's own shapes
#      (perf/gemm_bench.c, same run) that the gpt step reaches.
#
# SECTIONS=5 (a list, e.g. "1 5") runs only those sections; default all.
# BB=path/to/bigbatch measures another build (e.g. main before a change).
#
# Both sides use 2 threads, OpenBLAS (pthread build) and passive OpenMP
# waiting, as ARCHITECTURE.md's measured facts require for a fair peer.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-8}
ACC_RUNS=${ACC_RUNS:-1}
SECTIONS=${SECTIONS:-1 2 3 4 5}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
BB=${BB:-bin/bigbatch}
make --no-print-directory all >/dev/null
[ -d data/fmnist/train ] || make --no-print-directory data-fmnist >/dev/null
. perf/peer_env.sh
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. perf/train_common.sh

gpt_args="--data data/kjv/train --global-batch 64 --micro-batch 8 --steps $STEPS --lr 1e-3 --quiet"
mlp_args="--model mlp --data data/fmnist/train --devices cpu:2 --global-batch 64 --micro-batch 32 --steps 40 --quiet"
declare -a bb_tok torch_tok ov_ms ov_pct ov_wait no_ms no_wait mov_ms mno_ms mov_red mov_pct z0_2 z1_2 z2_2 z3_2 z0_4 z1_4 z2_4 z3_4
step_ms() { $PY -c 'print(64 / float(__import__("sys").argv[1]) * 1000)' "$(steady "$1" samples_per_s)"; }
# section 5: a case's name -> its bigbatch arguments; S: name -> its runs' throughputs
declare -A speed_args S
speed_cases=(gpt1 gpt2a gpt2b mlp256_1 mlp256_2 mlp32_1 mlp32_2)
g5="--data data/kjv/train --d-model 256 --global-batch 32 --steps $STEPS --grad-clip 1 --quiet"
m5="--model mlp --data data/fmnist/train --global-batch 256 --optimizer sgd --lr 0.01 --momentum 0.9 --grad-clip 1 --steps 30 --quiet"
speed_args=([gpt1]="$g5 --micro-batch 8" [gpt2a]="$g5 --devices cpu:2 --micro-batch 4" [gpt2b]="$g5 --devices cpu:2 --micro-batch 8"
            [mlp256_1]="$m5 --micro-batch 256" [mlp256_2]="$m5 --devices cpu:2 --micro-batch 128"
            [mlp32_1]="$m5 --micro-batch 32" [mlp32_2]="$m5 --devices cpu:2 --micro-batch 32")
peer5() { # KIND MICRO_BATCH: the PyTorch peer's throughput (tokens/s for the gpt, samples/s for the mlp)
    if [ "$1" = gpt ]; then
        $PY perf/torch_train_bench.py gpt --data data/kjv --layers 4 --heads 4 --d-model 256 --global-batch 32 \
            --micro-batch "$2" --steps $((STEPS - 2)) --warmup-steps 2 --lr 1e-3 --grad-clip 1 --threads 2 2>/dev/null |
            field tokens_per_s
    else
        $PY perf/torch_train_bench.py mlp --data data/fmnist --global-batch 256 --micro-batch "$2" --steps 20 \
            --warmup-steps 3 --optimizer sgd --lr 0.01 --momentum 0.9 --grad-clip 1 --threads 2 2>/dev/null |
            field samples_per_s
    fi
}
if on 5; then
    # shellcheck disable=SC2086
    gcc -O2 -o "$tmp/gemm_bench" perf/gemm_bench.c $(pkg-config --cflags --libs openblas)
fi
for ((i = 0; i < RUNS; i++)); do
    if on 2; then
        "$BB" train $gpt_args --metrics "$tmp/g.jsonl"
        bb_tok+=("$(steady "$tmp/g.jsonl" tokens_per_s)")
        torch_tok+=("$($PY perf/torch_train_bench.py gpt --data data/kjv --layers 4 --heads 4 --d-model 128 \
            --global-batch 64 --micro-batch 8 --steps $((STEPS - 2)) --warmup-steps 2 --lr 1e-3 --threads 2 \
            2>/dev/null | field tokens_per_s)")
    fi
    if on 3; then
        "$BB" train $gpt_args --devices cpu:2 --metrics "$tmp/o.jsonl"
        ov_ms+=("$(step_ms "$tmp/o.jsonl")")
        ov_pct+=("$(steady "$tmp/o.jsonl" overlap_pct)"); ov_wait+=("$(steady "$tmp/o.jsonl" data_wait_pct)")
        "$BB" train $gpt_args --devices cpu:2 --no-overlap --metrics "$tmp/n.jsonl"
        no_ms+=("$(step_ms "$tmp/n.jsonl")")
        no_wait+=("$(steady "$tmp/n.jsonl" data_wait_pct)")
        "$BB" train $mlp_args --metrics "$tmp/mo.jsonl"
        mov_ms+=("$(step_ms "$tmp/mo.jsonl")")
        mov_red+=("$(steady "$tmp/mo.jsonl" reduce_ms)"); mov_pct+=("$(steady "$tmp/mo.jsonl" overlap_pct)")
        "$BB" train $mlp_args --no-overlap --metrics "$tmp/mn.jsonl"
        mno_ms+=("$(step_ms "$tmp/mn.jsonl")")
    fi
    if on 4; then
        for n in 2 4; do
            for z in 0 1 2 3; do
                "$BB" train $gpt_args --devices cpu:$n --micro-batch 8 --bucket-mib 1 --zero $z --metrics "$tmp/z$z.jsonl"
                eval "z${z}_$n+=(\"\$(step_ms \"\$tmp/z$z.jsonl\")\")"
            done
        done
    fi
    if on 5; then
        # the sgemm rate of the gpt's shapes, beside the gpt runs of the same round
        S[ceiling]+="$("$tmp/gemm_bench" 2048 256 256 4 2 | tee "$tmp/gemm.json" | field ceiling_gflops) "
        for c in "${speed_cases[@]}"; do
            "$BB" train ${speed_args[$c]} --metrics "$tmp/s.jsonl"
            key=samples_per_s; [[ $c == gpt* ]] && key=tokens_per_s
            S[$c]+="$(steady "$tmp/s.jsonl" $key) "
        done
        S[peer_gpt]+="$(peer5 gpt 8) "
        S[peer_mlp256]+="$(peer5 mlp 256) "
        S[peer_mlp32]+="$(peer5 mlp 32) "
    fi
done

declare -a bb_acc torch_acc
on 1 || ACC_RUNS=0
for ((i = 0; i < ACC_RUNS; i++)); do
    "$BB" train --model mlp --data data/fmnist --global-batch 256 --micro-batch 32 --epochs 5 --lr 1e-3 \
        --lr-schedule constant --weight-decay 0.01 --grad-clip 0 --beta2 0.999 --seed $((i + 1)) --log-every 0 \
        --metrics "$tmp/m.jsonl" 2>/dev/null
    bb_acc+=("$(tail -1 "$tmp/m.jsonl" | field val_accuracy)")
    torch_acc+=("$($PY perf/torch_train_bench.py mlp --data data/fmnist --epochs 5 --global-batch 256 --lr 1e-3 \
        --weight-decay 0.01 --seed $((i + 1)) --threads 2 2>/dev/null | field test_accuracy)")
done

torch_version=$($PY -c 'import torch; print(torch.__version__)')
echo "# train_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), median of $RUNS runs (steps 3..$STEPS of each), sections $SECTIONS, $BB"
if on 1 || on 2; then
    echo
    echo "| what | bigbatch | PyTorch $torch_version | ratio |"
    echo "|---|---|---|---|"
fi
if on 2; then
    bt=$(median "${bb_tok[@]}") tt=$(median "${torch_tok[@]}")
    printf '| gpt 4x128 T 256, G 64 = 8 x 8, tokens/s | %.0f | %.0f | **%sx** |\n' "$bt" "$tt" "$(r2 "$bt" "$tt")"
fi
for ((i = 0; i < ACC_RUNS; i++)); do
    printf '| Fashion-MNIST mlp, 5 epochs, test accuracy (seed %d) | %.2f%% | %.2f%% | %+.2f points |\n' $((i + 1)) \
        "$(awk -v a="${bb_acc[$i]}" 'BEGIN {print 100 * a}')" "$(awk -v a="${torch_acc[$i]}" 'BEGIN {print 100 * a}')" \
        "$(awk -v a="${bb_acc[$i]}" -v b="${torch_acc[$i]}" 'BEGIN {print 100 * (a - b)}')"
done
if on 3; then
    om=$(median "${ov_ms[@]}") nm=$(median "${no_ms[@]}")
    echo
    echo "| gpt on cpu:2 (G 64 = 2 x 4 x 8) | step ms | overlap % | data-wait % |"
    echo "|---|---|---|---|"
    printf '| reducer overlapping the backward | %.0f | %.0f | %.2f |\n' "$om" "$(median "${ov_pct[@]}")" "$(median "${ov_wait[@]}")"
    printf '| --no-overlap | %.0f | 0 | %.2f |\n' "$nm" "$(median "${no_wait[@]}")"
    printf '| overlap / no-overlap step time | **%s** | | |\n' "$(r2 "$om" "$nm")"
    if on 2; then
        printf '| gpt tokens/s on cpu:2 vs cpu:1 (data parallel vs 2 BLAS threads) | %.0f vs %.0f: **%sx** | | |\n' \
            "$(awk -v ms="$om" 'BEGIN {print 64 * 256 / ms * 1000}')" "$bt" "$(r2 "$(awk -v ms="$om" 'BEGIN {print 64 * 256 / ms * 1000}')" "$bt")"
    fi
    mo=$(median "${mov_ms[@]}") mn=$(median "${mno_ms[@]}")
    echo
    echo "| mlp 784-1024-1024-10 on cpu:2 (G 64 = 2 x 1 x 32) | step ms | reduce ms | overlap % |"
    echo "|---|---|---|---|"
    printf '| reducer overlapping the backward | %.2f | %.2f | %.0f |\n' "$mo" "$(median "${mov_red[@]}")" "$(median "${mov_pct[@]}")"
    printf '| --no-overlap | %.2f | | 0 |\n' "$mn"
    printf '| overlap / no-overlap step time | **%s** | | |\n' "$(r2 "$mo" "$mn")"
fi
if on 4; then
    echo
    echo "| gpt, ZeRO (G 64, 1 MiB buckets) | --zero 0 step ms | --zero 1 step ms | --zero 2 step ms | --zero 3 step ms | zero 1 / zero 0 | zero 2 / zero 0 | zero 3 / zero 0 |"
    echo "|---|---|---|---|---|---|---|---|"
    for n in 2 4; do
        eval "a=\$(median \"\${z0_$n[@]}\") b=\$(median \"\${z1_$n[@]}\") c=\$(median \"\${z2_$n[@]}\") d=\$(median \"\${z3_$n[@]}\")"
        printf '| cpu:%d (%d x %d x 8) | %.0f | %.0f | %.0f | %.0f | **%s** | **%s** | **%s** |\n' "$n" "$n" $((8 / n)) \
            "$a" "$b" "$c" "$d" "$(r2 "$b" "$a")" "$(r2 "$c" "$a")" "$(r2 "$d" "$a")"
    done
fi
if on 5; then
    # the gpt step's model FLOPs per token: 6 x (12 L C^2 + C V) for the linear layers (forward and
    # backward), 6 L T C for causal attention's two products (forward and backward, recomputation not counted)
    per_token=$((6 * (12 * 4 * 256 * 256 + 256 * 256) + 6 * 4 * 256 * 256))
    m() { median ${S[$1]}; }
    # per round: the gpt's achieved rate (its best --devices, and cpu:1) over that round's sgemm rate
    fractions() {
        $PY - "$per_token" "${S[ceiling]}" "${S[gpt1]}" "${S[gpt2a]}" "${S[gpt2b]}" <<'PY'
import statistics as st, sys
f = float(sys.argv[1]); ceil, g1, g2a, g2b = ([float(x) for x in a.split()] for a in sys.argv[2:])
best = [100 * max(r) * f * 1e-9 / c for r, c in zip(zip(g1, g2a, g2b), ceil)]
one = [100 * r * f * 1e-9 / c for r, c in zip(g1, ceil)]
print(f"{st.median(best):.0f}% (rounds: {', '.join(f'{x:.0f}' for x in best)}); cpu:1 {st.median(one):.0f}%")
PY
    }
    echo
    echo "| CPU speed, 2 threads a side, clip 1 | bigbatch | PyTorch $torch_version | ratio |"
    echo "|---|---|---|---|"
    for row in "gpt1 peer_gpt gpt 4x256 T 256, G 32 = 1 x 4 x 8 (AdamW), cpu:1, tokens/s" \
               "gpt2a peer_gpt the same on cpu:2 (2 x 4 x 4)" "gpt2b peer_gpt the same on cpu:2 (2 x 2 x 8)" \
               "mlp256_1 peer_mlp256 mlp G 256 = 1 x 1 x 256 (SGD), cpu:1, samples/s" "mlp256_2 peer_mlp256 the same on cpu:2 (2 x 1 x 128)" \
               "mlp32_1 peer_mlp32 mlp G 256 = 1 x 8 x 32 (SGD), cpu:1, samples/s" "mlp32_2 peer_mlp32 the same on cpu:2 (2 x 4 x 32)"; do
        read -r c p what <<<"$row"
        printf '| %s | %.0f | %.0f | **%sx** |\n' "$what" "$(m $c)" "$(m $p)" "$(r2 "$(m $c)" "$(m $p)")"
    done
    echo
    echo "sgemm on the gpt's shapes (perf/gemm_bench.c, 2 threads), the last round: $(cat "$tmp/gemm.json")"
    echo "gpt step (model FLOPs $per_token per token) over the sgemm rate of its round, its best --devices: **$(fractions)**"
    for c in "${speed_cases[@]}" peer_gpt peer_mlp256 peer_mlp32 ceiling; do echo "per-run $c: ${S[$c]}"; done
fi
echo
on 2 && echo "per-run gpt tokens/s: bigbatch ${bb_tok[*]}; PyTorch ${torch_tok[*]}"
on 3 && echo "per-run cpu:2 step ms: overlap ${ov_ms[*]}; no-overlap ${no_ms[*]}"
on 3 && echo "per-run mlp cpu:2 step ms: overlap ${mov_ms[*]}; no-overlap ${mno_ms[*]}"
true

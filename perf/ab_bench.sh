#!/usr/bin/env bash
# ab_bench.sh — this tree's bigbatch against another build of it (the peer:
# BASE=/path/to/bin/bigbatch, e.g. main before a change), in one run,
# interleaved, median of RUNS (default 5) runs: the step time of `bench
# model` (gpt d 256 at T 256 and 1024, and the mlp 784-1024-1024-10, 2
# threads) and the steady
# throughput of `train` (the default gpt on data/kjv, G 64 = 8 x 8, on one
# CPU device and on cpu:2; the Fashion-MNIST mlp on cpu:2 when
# data/fmnist exists). Prints new/base ratios: 1.00 is unchanged, above 1
# is faster. For refactors that must not change speed.
#
#   git worktree add /tmp/base main && make -C /tmp/base all
#   BASE=/tmp/base/bin/bigbatch perf/ab_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-8}
: "${BASE:?set BASE to bin/bigbatch of the other build}"
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
NEW=bin/bigbatch
. perf/train_common.sh

declare -A R
add() { R[$1]+="$2 "; }
cases=("bench gpt d256, step ms" "bench mlp, step ms" "train gpt cpu:1, tokens/s" "train gpt cpu:2, samples/s"
       "bench gpt d256 T 1024 B 2, step ms")
[ -d data/fmnist/train ] && cases+=("train mlp cpu:2, samples/s")
for ((i = 0; i < RUNS; i++)); do
    for side in base new; do
        bin=$NEW; [ $side = base ] && bin=$BASE
        add "$side 0" "$($bin bench model --model gpt --d-model 256 --threads 2 --steps 5 --json | field step_ms)"
        add "$side 1" "$($bin bench model --model mlp --threads 2 --steps 5 --json | field step_ms)"
        add "$side 4" "$($bin bench model --model gpt --d-model 256 --seq-len 1024 --micro-batch 2 --threads 2 \
            --steps 3 --json | field step_ms)"
        $bin train --data data/kjv/train --global-batch 64 --micro-batch 8 --steps $STEPS --quiet --metrics "$tmp/a.jsonl"
        add "$side 2" "$(steady "$tmp/a.jsonl" tokens_per_s)"
        $bin train --data data/kjv/train --devices cpu:2 --global-batch 64 --micro-batch 8 --steps $STEPS --quiet \
            --metrics "$tmp/b.jsonl"
        add "$side 3" "$(steady "$tmp/b.jsonl" samples_per_s)"
        if [ -d data/fmnist/train ]; then
            $bin train --model mlp --data data/fmnist/train --devices cpu:2 --global-batch 64 --micro-batch 32 \
                --steps 40 --quiet --metrics "$tmp/c.jsonl"
            add "$side 5" "$(steady "$tmp/c.jsonl" samples_per_s)"
        fi
    done
done
echo "# ab_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), median of $RUNS interleaved runs"
echo "# base: $BASE; new: $(pwd)/$NEW"
echo
echo "| what | base | new | new/base (speed) |"
echo "|---|---|---|---|"
for k in "${!cases[@]}"; do
    b=$(median ${R["base $k"]}) n=$(median ${R["new $k"]})
    # step times: lower is faster, so the speed ratio is base/new
    if [[ ${cases[$k]} == *"step ms"* ]]; then r=$(awk -v a="$b" -v c="$n" 'BEGIN {printf "%.3f", a / c}')
    else r=$(awk -v a="$b" -v c="$n" 'BEGIN {printf "%.3f", c / a}'); fi
    printf '| %s | %.1f | %.1f | %s |\n' "${cases[$k]}" "$b" "$n" "$r"
done

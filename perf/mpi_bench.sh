#!/usr/bin/env bash
# mpi_bench.sh — `mpirun -np 2 bigbatch train` beside PyTorch DDP (gloo)
# launched the same way (perf/torch_ddp_bench.py), in one run, interleaved,
# median of RUNS (default 5) runs, each the median of steps 3.. of its run:
#
#   gpt 4x128 T 256, G 64 = 2 processes x 4 micro-steps x 8 (tokens/s), and
#   the Fashion-MNIST mlp 784-1024-1024-10, G 64 = 2 x 1 x 32 (samples/s);
#   2 processes x 1 thread on both sides;
#   and the cost of crossing processes: 2 ranks x cpu:1 against one
#   process with cpu:2 (the same devices, threads instead of processes).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-8}
make --no-print-directory all >/dev/null
[ -d data/fmnist/train ] || make --no-print-directory data-fmnist >/dev/null
bin/bigbatch version | grep -q "mpi: Open MPI" || { echo "mpi_bench: this build has no MPI (make deps; make MPI=1)"; exit 1; }
. perf/peer_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=/usr/bin/python3
MPIRUN="mpirun --oversubscribe -np 2 -x LD_LIBRARY_PATH -x OMP_WAIT_POLICY${OPENBLAS_CORETYPE:+ -x OPENBLAS_CORETYPE}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. perf/train_common.sh

gpt="--data data/kjv/train --global-batch 64 --micro-batch 8 --steps $STEPS --lr 1e-3 --quiet"
mlp="--model mlp --data data/fmnist/train --global-batch 64 --micro-batch 32 --steps 40 --quiet"
declare -a bg tg b1g bm tm b1m
for ((i = 0; i < RUNS; i++)); do
    $MPIRUN bin/bigbatch train $gpt --devices cpu:1 --metrics "$tmp/g.jsonl"
    bg+=("$(steady "$tmp/g.jsonl" tokens_per_s)")
    bin/bigbatch train $gpt --devices cpu:2 --metrics "$tmp/g1.jsonl"
    b1g+=("$(steady "$tmp/g1.jsonl" tokens_per_s)")
    tg+=("$($MPIRUN $PY perf/torch_ddp_bench.py gpt --data data/kjv --global-batch 64 --micro-batch 8 \
        --steps $((STEPS - 2)) 2>/dev/null | field tokens_per_s)")
    $MPIRUN bin/bigbatch train $mlp --devices cpu:1 --metrics "$tmp/m.jsonl"
    bm+=("$(steady "$tmp/m.jsonl" samples_per_s)")
    bin/bigbatch train $mlp --devices cpu:2 --metrics "$tmp/m1.jsonl"
    b1m+=("$(steady "$tmp/m1.jsonl" samples_per_s)")
    tm+=("$($MPIRUN $PY perf/torch_ddp_bench.py mlp --data data/fmnist --global-batch 64 --micro-batch 32 \
        --steps 38 2>/dev/null | field samples_per_s)")
done
g=$(median "${bg[@]}") t=$(median "${tg[@]}") g1=$(median "${b1g[@]}")
m=$(median "${bm[@]}") u=$(median "${tm[@]}") m1=$(median "${b1m[@]}")
echo "# mpi_bench: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(mpirun --version | head -1), median of $RUNS runs"
echo
echo "| what (2 processes x 1 device) | bigbatch | PyTorch DDP gloo | ratio |"
echo "|---|---|---|---|"
printf '| gpt 4x128 T 256, G 64 = 2 x 4 x 8, tokens/s | %.0f | %.0f | **%sx** |\n' "$g" "$t" "$(r2 "$g" "$t")"
printf '| mlp 784-1024-1024-10, G 64 = 2 x 1 x 32, samples/s | %.0f | %.0f | **%sx** |\n' "$m" "$u" "$(r2 "$m" "$u")"
echo
echo "| crossing processes: step time of 2 ranks x cpu:1 / 1 process x cpu:2 | |"
echo "|---|---|"
printf '| gpt | **%sx** |\n' "$(r2 "$g1" "$g")"
printf '| mlp | **%sx** |\n' "$(r2 "$m1" "$m")"

#!/usr/bin/env bash
# loader_peers.sh — bigbatch's loader against the loaders people use, on
# the same records: PyTorch's DataLoader over a memory-mapped .npy (the
# strong peer: uncompressed, no format to parse), WebDataset (tar shards),
# MosaicML Streaming (MDS shards, zstd) and LitData (its optimized chunks).
# Fashion-MNIST's training images (785-byte records: label, pixels) and
# data/kjv's training windows (514 bytes: 257 u16 tokens), each read one
# epoch, shuffled, in batches of 256, by every peer with 1 and 2 DataLoader
# workers and by bigbatch with 1 and 2 loader threads; warm (page cache as
# the previous round left it) and cold (every file of the reader's copy
# dropped from the page cache with posix_fadvise DONTNEED first). bigbatch's
# warm rows run `bench loader` for 1 s (many epochs), its cold rows one
# epoch. RUNS rounds (default 5), every reader interleaved in each; the
# table gives medians and records/s per worker (or thread).
#
# The peers are installed with pip into build/peers (a virtual environment
# over Debian's python3-torch 1.13, which is what this machine has; PyPI
# versions below), never by `make test`. A peer that does not import is a
# row saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
BIN=bin/bigbatch
PY=build/peers/bin/python
make --no-print-directory all >/dev/null
[ -d data/fmnist/train ] || make --no-print-directory data-fmnist >/dev/null
dpkg-query -W -f='${Status}' python3-torchvision 2>/dev/null | grep -q "ok installed" ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torchvision >/dev/null # Streaming imports it
if [ ! -x "$PY" ]; then
    /usr/bin/python3 -m venv --system-site-packages build/peers
    build/peers/bin/pip install -q webdataset==1.0.2 "transformers<5" "zstd<2,>=1.5.2.5" "xxhash<4" \
        "python-snappy<1" Brotli tqdm "catalogue<3" lightning-utilities filelock
    # their cloud clients (boto3, google-cloud-storage, azure, oci, paramiko) are not needed for local shards
    build/peers/bin/pip install -q --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76
fi
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo none; }
peers=(dataloader webdataset streaming litdata)
declare -A usable why
for p in "${peers[@]}"; do
    mod=$p; case $p in dataloader) mod=torch ;; esac
    if err=$("$PY" -c "import $mod" 2>&1); then usable[$p]=1; else why[$p]=$(echo "$err" | tail -1); fi
done

median() { sort -g | awk '{a[NR]=$1} END {printf "%.0f", a[int((NR+1)/2)]}'; }
field() { grep -o "\"$1\": [0-9.e+]*" | head -1 | awk '{print $2}'; }

echo "# loader_peers: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc --all) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo "# torch $(version torch), webdataset $(version webdataset), mosaicml-streaming $(version mosaicml-streaming), litdata $(version litdata), numpy $(version numpy)"
echo
echo "| data | cache | reader | workers | records/s | per worker | bigbatch per thread / it |"
echo "|---|---|---|---|---|---|---|"

bench() {
    local name=$1 src=$2 rs=$3 out=build/peers-data/$2
    if [ ! -f "$out/records.npy" ]; then
        mkdir -p "$out"
        cat data/"$src"/train/*.bbs | zstd -q -dc > "$out.raw"
        "$PY" perf/loader_peers.py pack --raw "$out.raw" --record-size "$rs" --out "$out" 2>/dev/null
        rm -f "$out.raw"
    fi
    declare -A got
    for ((i = 0; i < RUNS; i++)); do
        for cache in warm cold; do
            for w in 1 2; do
                local args=(--data "data/$src/train" --no-scaling --loader-threads "$w" --micro-batch 256 --json)
                if [ $cache = warm ]; then args+=(--warm --seconds 1); else args+=(--cold); fi
                got["$cache bigbatch $w"]+="$("$BIN" bench loader "${args[@]}" | field records_per_s) "
                for p in "${peers[@]}"; do
                    [ -n "${usable[$p]:-}" ] || continue
                    local flags=(read --peer "$p" --dir "$out" --record-size "$rs" --workers "$w")
                    [ $cache = warm ] || flags+=(--cold)
                    got["$cache $p $w"]+="$("$PY" perf/loader_peers.py "${flags[@]}" 2>/dev/null | field records_per_s) "
                done
            done
        done
    done
    for cache in warm cold; do
        for w in 1 2; do
            local ours per_ours
            ours=$(echo "${got["$cache bigbatch $w"]}" | tr ' ' '\n' | grep . | median)
            per_ours=$(( ours / w ))
            echo "| $name | $cache | bigbatch | $w | $ours | $per_ours | |"
            for p in "${peers[@]}"; do
                if [ -z "${usable[$p]:-}" ]; then
                    [ $w = 1 ] && echo "| $name | $cache | $p | | not measured: ${why[$p]} | | |"
                    continue
                fi
                local theirs per
                theirs=$(echo "${got["$cache $p $w"]}" | tr ' ' '\n' | grep . | median)
                per=$(( theirs / w ))
                echo "| $name | $cache | $p | $w | $theirs | $per | $(awk -v a="$per_ours" -v b="$per" 'BEGIN {printf "%.1f", a / b}')x |"
            done
        done
    done
}

bench "Fashion-MNIST train" fmnist 785
bench "KJV train (T 256)" kjv 514

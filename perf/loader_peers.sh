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
of() { echo "${got["$1"]}" | tr ' ' '\n' | grep . | median; } # the median of the caller's got[KEY]
field() { grep -o "\"$1\": [0-9.e+]*" | head -1 | awk '{print $2}'; }

echo "# loader_peers: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc --all) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), RUNS=$RUNS"
echo "# torch $(version torch), webdataset $(version webdataset), mosaicml-streaming $(version mosaicml-streaming), litdata $(version litdata), numpy $(version numpy)"
echo
echo "| data | cache | reader | workers | records/s | per worker | bigbatch per thread / it |"
echo "|---|---|---|---|---|---|---|"

prepare() { # the peers' copies of data/SRC/train (RS-byte records), made once
    local src=$1 rs=$2 out=build/peers-data/$1
    if [ ! -f "$out/records.npy" ]; then
        mkdir -p "$out"
        cat data/"$src"/train/*.bbs | zstd -q -dc > "$out.raw"
        "$PY" perf/loader_peers.py pack --raw "$out.raw" --record-size "$rs" --out "$out" 2>/dev/null
        rm -f "$out.raw"
    fi
}

bench() {
    local name=$1 src=$2 rs=$3 out=build/peers-data/$2
    prepare "$src" "$rs"
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
            ours=$(of "$cache bigbatch $w")
            per_ours=$(( ours / w ))
            echo "| $name | $cache | bigbatch | $w | $ours | $per_ours | |"
            for p in "${peers[@]}"; do
                if [ -z "${usable[$p]:-}" ]; then
                    [ $w = 1 ] && echo "| $name | $cache | $p | | not measured: ${why[$p]} | | |"
                    continue
                fi
                local theirs per
                theirs=$(of "$cache $p $w")
                per=$(( theirs / w ))
                echo "| $name | $cache | $p | $w | $theirs | $per | $(awk -v a="$per_ours" -v b="$per" 'BEGIN {printf "%.1f", a / b}')x |"
            done
        done
    done
}

# LOCAL=0: the remote rows only; REMOTE=0: the local ones only; ONLY=fmnist or kjv: that dataset only
wanted() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
if [ "${LOCAL:-1}" = 1 ]; then
    wanted fmnist && bench "Fashion-MNIST train" fmnist 785
    wanted kjv && bench "KJV train (T 256)" kjv 514
fi

# ---- remote: the same shards in object storage ------------------------------
# moto's S3 server (build/s3, as make test installs it) on loopback holds
# bigbatch's .bbs shards (with their index.json) and Streaming's MDS copy;
# bigbatch mirrors them into an empty --cache-dir and reads one epoch
# (cold: records / (mirror_s + the epoch's seconds)); Streaming streams them
# through an empty local directory (cold: every batch over the time from its
# start, downloads and start-up included). Warm: the cache already full
# (bigbatch: 1 s of epochs, the mirror checking the indexes only;
# Streaming: its local copy complete, counted from the first batch).
[ "${REMOTE:-1}" = 1 ] || exit 0
make --no-print-directory s3-deps-fetch >/dev/null
if ! build/s3/bin/python -c "import moto.server" 2>/dev/null || [ -z "${usable[streaming]:-}" ]; then
    echo; echo "remote rows not measured: moto (build/s3) or Streaming does not import"; exit 0
fi
port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p build/peers-data
build/s3/bin/python -m moto.server -H 127.0.0.1 -p "$port" > build/peers-data/moto.log 2>&1 &
moto=$!
work=$(mktemp -d)
trap 'kill $moto 2>/dev/null; rm -rf "$work"' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 S3_ENDPOINT_URL=http://127.0.0.1:$port
for ((i = 0; i < 100; i++)); do "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null && break; sleep 0.1; done
for src in fmnist:785 kjv:514; do
    prepare "${src%:*}" "${src#*:}"
    [ -f "data/${src%:*}/train/index.json" ] || "$BIN" pack --index "data/${src%:*}/train" > /dev/null
done
"$PY" - <<'PYEOF'
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
s3.create_bucket(Bucket="bench")
for src in ("fmnist", "kjv"):
    for prefix, d in (("bbs/" + src, "data/%s/train" % src), ("mds/" + src, "build/peers-data/%s/mds" % src)):
        for f in os.listdir(d):
            s3.upload_file(os.path.join(d, f), "bench", prefix + "/" + f)
PYEOF
echo
echo "| data | remote cache | reader | workers | records/s | per worker | bigbatch per thread / it (warm: against local data) |"
echo "|---|---|---|---|---|---|---|"
remote() {
    local name=$1 src=$2 rs=$3
    declare -A got
    local warm_bb=$work/warm-bb-$src warm_st=$work/warm-st-$src
    "$BIN" inspect --data-endpoint "$S3_ENDPOINT_URL" --cache-dir "$warm_bb" "s3://bench/bbs/$src" > /dev/null # fill the caches
    "$PY" perf/loader_peers.py read --peer streaming --remote "s3://bench/mds/$src" --local "$warm_st" --dir "$work" \
        --record-size "$rs" > /dev/null 2>&1
    for ((i = 0; i < RUNS; i++)); do
        for w in 1 2; do
            local cache=$work/cold-$i-$w out rate
            out=$("$BIN" bench loader --data "s3://bench/bbs/$src" --data-endpoint "$S3_ENDPOINT_URL" --cache-dir "$cache" \
                  --cold --no-scaling --loader-threads "$w" --micro-batch 256 --json)
            rate=$(echo "$out" | "$PY" -c "import json,sys; d=json.load(sys.stdin); r=d['rows'][0]; print(r['records'] / (d['remote']['mirror_s'] + r['records'] / r['records_per_s']))")
            got["cold bigbatch $w"]+="$rate "
            rm -rf "$cache"
            got["warm bigbatch $w"]+="$("$BIN" bench loader --data "s3://bench/bbs/$src" --data-endpoint "$S3_ENDPOINT_URL" \
                --cache-dir "$warm_bb" --warm --seconds 1 --no-scaling --loader-threads "$w" --micro-batch 256 --json | field records_per_s) "
            got["local bigbatch $w"]+="$("$BIN" bench loader --data "data/$src/train" --warm --seconds 1 --no-scaling \
                --loader-threads "$w" --micro-batch 256 --json | field records_per_s) "
            got["cold streaming $w"]+="$("$PY" perf/loader_peers.py read --peer streaming --remote "s3://bench/mds/$src" \
                --local "$work/cold-st-$i-$w" --dir "$work" --record-size "$rs" --workers "$w" 2>/dev/null | field records_per_s_from_start) "
            rm -rf "$work/cold-st-$i-$w"
            got["warm streaming $w"]+="$("$PY" perf/loader_peers.py read --peer streaming --remote "s3://bench/mds/$src" \
                --local "$warm_st" --dir "$work" --record-size "$rs" --workers "$w" 2>/dev/null | field records_per_s) "
        done
    done
    for cache in cold warm; do
        for w in 1 2; do
            local ours theirs
            ours=$(of "$cache bigbatch $w")
            theirs=$(of "$cache streaming $w")
            local vs_local=""
            if [ $cache = warm ]; then
                local here
                here=$(of "local bigbatch $w")
                vs_local="$(awk -v a="$ours" -v b="$here" 'BEGIN {printf "%.2f", a / b}')x local ($here)"
            fi
            echo "| $name | $cache | bigbatch | $w | $ours | $((ours / w)) | $vs_local |"
            echo "| $name | $cache | streaming | $w | $theirs | $((theirs / w)) | $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.1f", a / b}')x |"
        done
    done
}
if wanted fmnist; then remote "Fashion-MNIST train" fmnist 785; fi
if wanted kjv; then remote "KJV train (T 256)" kjv 514; fi

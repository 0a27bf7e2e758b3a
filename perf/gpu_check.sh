#!/usr/bin/env bash
# gpu_check.sh — the one call to make on a lent GPU machine (an H200): build
# for sm_90, run the CUDA tests, measure, print a short table. Meant to
# finish in under 6 minutes. Logs go to $OUT (the device tool brings them
# back), the table to stdout, last.
#
#   here:  make gpu-bundle      # fallback binaries + their libraries, built for sm_90
#   there: run(command="perf/gpu_check.sh", carry=["build/gpu"], timeout_s=420)
#
# That machine has no package registry: when it cannot build (no liburing,
# libzstd, Criterion or OpenBLAS headers), the script uses the carried
# build/gpu instead. NCCL is taken from the toolkit or from PyTorch's wheel.
#
# Measured, beside PyTorch in the same run (perf/torch_gpu_bench.py, eager):
#   GPT-2 124M shape (12 layers, 12 heads, d 768, T 1024, vocab 50304),
#   micro-batch 8, fp32 and bf16 (activations and products): tokens/s and MFU (6·params + 12·layers·T·d FLOP per token
#   against the chip's dense peak: 67 TFLOP/s fp32, 989 bf16); peak memory
#   and step time with --checkpoint blocks vs none; host-to-device GB/s from
#   pinned vs pageable memory; loader records/s into pinned slots; a short
#   `bigbatch train --devices cuda:0` run's data-wait.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
STEPS=${STEPS:-10}
PY=$(command -v python3)
say() { echo "== $*" | tee -a "$OUT/log.txt"; }

# ---- libraries -------------------------------------------------------------
nccl_dir=$($PY -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
say "GPU: $(tail -1 "$OUT/gpu.txt")"

# ---- build (or the carried bundle) -------------------------------------------
BIN=build/sm90/bin/bigbatch TEST=build/sm90/tests/test_cuda
nccl=()
[ -e /usr/local/cuda/include/nccl.h ] || [ -z "$nccl_dir" ] || nccl=(NCCL_INC="${nccl_dir%/lib}/include" NCCL_LIB="$nccl_dir")
if make -j"$(nproc)" CUDA=1 CUDA_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILD=build/sm90 \
    BIN_DIR=build/sm90/bin LIB_DIR=build/sm90/lib "${nccl[@]}" all "$TEST" > "$OUT/build.log" 2>&1; then
    say "built here for sm_90"
elif [ -x build/gpu/bin/bigbatch ]; then
    BIN=build/gpu/bin/bigbatch TEST=build/gpu/tests/test_cuda
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/build/gpu/so
    say "no build here (see build.log); using the carried build/gpu"
else
    say "FAILED: cannot build here and no build/gpu was carried"; tail -20 "$OUT/build.log"; exit 1
fi
ldd "$BIN" "$TEST" > "$OUT/ldd.txt" 2>&1
if grep -q "not found" "$OUT/ldd.txt"; then say "FAILED: missing libraries"; grep "not found" "$OUT/ldd.txt"; exit 1; fi
"$BIN" version | tee -a "$OUT/log.txt"

# ---- the CUDA tests ---------------------------------------------------------------
say "CUDA tests"
"$TEST" --verbose > "$OUT/test_cuda.txt" 2>&1
test_rc=$?
grep -E "^\[(FAIL|SKIP|----)\]|Synthesis" "$OUT/test_cuda.txt" | tail -40

# ---- measurements ----------------------------------------------------------------
field() { $PY -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1" 2>/dev/null || echo nan; }
gpt2="--model gpt --layers 12 --heads 12 --d-model 768 --seq-len 1024 --vocab 50304 --micro-batch 8"
say "bigbatch GPT-2 124M fp32 and bf16"
"$BIN" bench model $gpt2 --device cuda:0 --steps "$STEPS" --json > "$OUT/bb_none.json" 2>>"$OUT/log.txt"
"$BIN" bench model $gpt2 --device cuda:0 --steps "$STEPS" --precision bf16 --json > "$OUT/bb_bf16.json" 2>>"$OUT/log.txt"
"$BIN" bench model $gpt2 --device cuda:0 --steps "$STEPS" --checkpoint blocks --json > "$OUT/bb_blocks.json" 2>>"$OUT/log.txt"
say "PyTorch GPT-2 124M fp32 and bf16"
$PY perf/torch_gpu_bench.py --steps "$STEPS" --precision fp32 > "$OUT/torch_fp32.json" 2>>"$OUT/log.txt"
$PY perf/torch_gpu_bench.py --steps "$STEPS" --precision bf16 > "$OUT/torch_bf16.json" 2>>"$OUT/log.txt"
say "copies and loader"
"$BIN" bench copy --device cuda:0 --json > "$OUT/copy.json" 2>>"$OUT/log.txt"
"$BIN" bench loader --data data/kjv/train --pinned --seconds 3 --json > "$OUT/loader.json" 2>>"$OUT/log.txt"
say "train on kjv"
"$BIN" train --data data/kjv/train --devices cuda:0 --layers 12 --heads 12 --d-model 768 --global-batch 64 \
    --micro-batch 16 --steps 12 --metrics "$OUT/train.jsonl" --quiet >> "$OUT/log.txt" 2>&1
wait_pct=$($PY -c 'import json,sys,statistics as s; r=[json.loads(l) for l in open(sys.argv[1])][2:]; print(round(s.median(x["data_wait_pct"] for x in r), 3))' "$OUT/train.jsonl" 2>/dev/null || echo nan)

# ---- the table ---------------------------------------------------------------------
$PY - "$OUT" "$test_rc" "$wait_pct" <<'EOF'
import json, os, sys
out, test_rc, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(name):
    try:
        return json.loads(open(os.path.join(out, name)).read().strip().splitlines()[-1])
    except Exception:
        return {}
bb, bbc, bb16, tf, tb, cp, ld = (load(n) for n in ("bb_none.json", "bb_blocks.json", "bb_bf16.json", "torch_fp32.json", "torch_bf16.json", "copy.json", "loader.json"))
L, T, d = 12, 1024, 768
def mfu(row, peak):
    if "tokens_per_s" not in row or "params" not in row: return "n/a"
    return "%.1f%%" % (100 * row["tokens_per_s"] * (6 * row["params"] + 12 * L * T * d) / peak)
def f(row, key, fmt="%.0f"):
    return fmt % row[key] if key in row else "n/a"
def ratio(a, b, key):
    return "%.2fx" % (a[key] / b[key]) if key in a and key in b and b[key] else "n/a"
print()
print("| GPT-2 124M, micro-batch 8, T 1024 | tokens/s | step ms | MFU | peak GiB |")
print("|---|---|---|---|---|")
print("| bigbatch fp32 | %s | %s | %s (of 67 TFLOP/s) | %s |" % (f(bb, "tokens_per_s"), f(bb, "step_ms", "%.1f"), mfu(bb, 67e12), f({k: v / 2**30 for k, v in bb.items() if k == "peak_bytes"}, "peak_bytes", "%.2f")))
print("| bigbatch fp32 --checkpoint blocks | %s | %s | | %s |" % (f(bbc, "tokens_per_s"), f(bbc, "step_ms", "%.1f"), f({k: v / 2**30 for k, v in bbc.items() if k == "peak_bytes"}, "peak_bytes", "%.2f")))
print("| bigbatch bf16 (activations + products) | %s | %s | %s (of 989) | %s |" % (f(bb16, "tokens_per_s"), f(bb16, "step_ms", "%.1f"), mfu(bb16, 989e12), f({k: v / 2**30 for k, v in bb16.items() if k == "peak_bytes"}, "peak_bytes", "%.2f")))
print("| PyTorch %s eager fp32 | %s | %s | %s | %s |" % (tf.get("torch", "?"), f(tf, "tokens_per_s"), f(tf, "step_ms", "%.1f"), mfu(tf, 67e12), f({k: v / 2**30 for k, v in tf.items() if k == "peak_bytes"}, "peak_bytes", "%.2f")))
print("| PyTorch eager bf16 autocast | %s | %s | %s (of 989) | %s |" % (f(tb, "tokens_per_s"), f(tb, "step_ms", "%.1f"), mfu(tb, 989e12), f({k: v / 2**30 for k, v in tb.items() if k == "peak_bytes"}, "peak_bytes", "%.2f")))
print("| bigbatch / PyTorch, fp32 | %s | | | |" % ratio(bb, tf, "tokens_per_s"))
print("| bigbatch / PyTorch, bf16 | %s | | | |" % ratio(bb16, tb, "tokens_per_s"))
print("| checkpoint blocks / none: step time | %s | | | |" % ratio(bbc, bb, "step_ms"))
print()
print("| other | value |")
print("|---|---|")
log = open(os.path.join(out, "test_cuda.txt"), errors="replace").read()
skipped = log.count("[SKIP]")
print("| CUDA tests | %s%s |" % ("passed" if test_rc == 0 else "FAILED (exit %d)" % test_rc,
                                ", but %d skipped: not run on a GPU" % skipped if skipped else ""))
print("| H2D pinned / pageable GB/s | %s / %s |" % (f(cp, "pinned_gb_per_s", "%.1f"), f(cp, "pageable_gb_per_s", "%.1f")))
print("| loader records/s into pinned slots (kjv) | %s |" % f(ld, "records_per_s"))
print("| train on cuda:0, data-wait %% of step (median) | %s |" % wait)
EOF
exit $test_rc

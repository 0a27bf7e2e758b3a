#!/usr/bin/env bash
# gpu_check.sh — the one call to make on a lent GPU machine (an H200): build
# for sm_90 (or use the carried bundle), run the CUDA tests, check
# correctness at real shapes, measure beside PyTorch, print a table.
#
#   make gpu-bundle        # on a build machine: fallback binaries + their libraries, for sm_90
#   perf/gpu_check.sh      # on the GPU machine, from the checkout (with build/gpu copied beside
#                          # it when that machine cannot build); about 6 minutes
#
# One run must always bring something back. Every step runs under
# `timeout`; each table row is printed, and appended to $OUT/table.md, as
# soon as it is known, so a hang costs one row, not the run. Everything
# else goes to $OUT/log.txt (each step's output under its name),
# $OUT/test_cuda.txt, $OUT/build.log, $OUT/results.jsonl (every benchmark's
# JSON, tagged) and $OUT/gpu.txt (nvidia-smi): six files, under the device
# tool's limit of eight. Meant to finish, build included, in 6 minutes.
#
# Exit status: 0 when every step passed and the CUDA tests ran on a GPU; 1
# when a step failed or timed out, a check failed, or every CUDA test
# skipped (no GPU).
#
# What it checks (GPT-2 124M: 12 layers, 12 heads, d 768, T 1024, V 50257):
#   - the CUDA tests, op by op against the CPU, a one-rank NCCL reducer,
#     bitwise resume (Criterion --jobs 1, CUDA_LAUNCH_BLOCKING=1 so that
#     an asynchronous fault names its op);
#   - the first-step loss ≈ ln V; fp32 and --checkpoint blocks losses equal
#     to the bit; bf16 within 2e-2;
#   - tokens/s, MFU and peak memory beside PyTorch (eager, the same shape):
#     MFU = tokens/s · (6·params + 12·layers·T·d) over the dense peak
#     (67 TFLOP/s fp32, 989 bf16);
#   - a short `train` on data/kjv with --save, --val-data, --trace and
#     --precision bf16, then --resume: the resumed losses equal the
#     uninterrupted run's to the bit; data-wait % of the step;
#   - host-to-device GB/s pinned vs pageable; loader records/s into pinned slots.
#
# Variables: OUT (default /tmp/gpu_check), STEPS (timed steps, 10),
# GPU_CHECK_HANG=STEP (that step hangs instead of running: try it with
# `model`), GPU_CHECK_MAX_STEP_S (caps every step's timeout, e.g. to try
# the script on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
: > "$OUT/log.txt"
: > "$OUT/table.md"
: > "$OUT/results.jsonl"
STEPS=${STEPS:-10}
PY=$(command -v python3 || echo python3)
state=$(mktemp -d) # each step's output, and the failures (some steps run in subshells)
trap 'rm -rf "$state"' EXIT
started=$(date +%s)

say() { echo "== $*" | tee -a "$OUT/log.txt"; }
row() { echo "$*" | tee -a "$OUT/table.md"; }
elapsed() { echo $(($(date +%s) - started)); }
fail() { echo "$1" >> "$state/failed"; }

# step NAME SECONDS CMD...: runs CMD under timeout; its output goes to
# $state/NAME.out and log.txt; returns its status (124: timed out).
# GPU_CHECK_HANG=NAME makes it hang instead.
step() {
    local name=$1 limit=$2 rc
    shift 2
    if [ -n "${GPU_CHECK_MAX_STEP_S:-}" ] && [ "$limit" -gt "$GPU_CHECK_MAX_STEP_S" ]; then limit=$GPU_CHECK_MAX_STEP_S; fi
    if [ "${GPU_CHECK_HANG:-}" = "$name" ]; then
        timeout --kill-after=5 "$limit" sleep 100000 > "$state/$name.out" 2>&1
    else
        timeout --kill-after=5 "$limit" "$@" > "$state/$name.out" 2>&1
    fi
    rc=$?
    { echo "---- $name (limit ${limit}s, at $(elapsed)s, exit $rc): $*"; cat "$state/$name.out"; } >> "$OUT/log.txt"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        fail "$name timed out after ${limit}s"
    elif [ $rc -ne 0 ]; then
        fail "$name exit $rc"
    fi
    return $rc
}
verdict() { case $1 in 0) echo ok ;; 124 | 137) echo "TIMED OUT" ;; *) echo "FAILED (exit $1)" ;; esac; }
# The JSON line a step printed last; kept, tagged, in results.jsonl.
result() {
    local line
    line=$(grep -E '^\{' "$state/$1.out" 2> /dev/null | tail -1)
    [ -n "$line" ] && echo "{\"tag\": \"$1\", \"result\": $line}" >> "$OUT/results.jsonl"
    echo "$line"
}
field() { # JSON KEY FORMAT
    [ -n "$1" ] || { echo n/a; return; }
    $PY -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("n/a" if v is None else sys.argv[3] % v)' \
        "$1" "$2" "$3" 2> /dev/null || echo n/a
}

# ---- the machine, first --------------------------------------------------------
say "gpu_check at $(date -u +%FT%TZ) on $(hostname)"
if command -v nvidia-smi > /dev/null; then
    timeout 20 nvidia-smi --format=csv \
        --query-gpu=name,driver_version,compute_mode,mig.mode.current,memory.total,memory.used,clocks.sm,clocks.mem \
        > "$OUT/gpu.txt" 2>&1
    timeout 20 nvidia-smi >> "$OUT/gpu.txt" 2>&1
    row "| GPU (name, driver, compute mode, MIG, memory, used, clocks) | $(sed -n 2p "$OUT/gpu.txt") |"
else
    echo "no nvidia-smi" > "$OUT/gpu.txt"
    row "| GPU | none (no nvidia-smi) |"
fi

# ---- libraries: set for bigbatch only, never exported into python3 -------------
torch_lib() { $PY -c "import nvidia.$1, os; print(os.path.join(list(nvidia.$1.__path__)[0], 'lib'))" 2> /dev/null; }
nccl_dir=$(torch_lib nccl)
bb_ld=/usr/local/cuda/lib64
bb_nccl="" # bigbatch loads NCCL with dlopen: the toolkit's, else PyTorch's
[ -e /usr/local/cuda/lib64/libnccl.so.2 ] || { [ -n "$nccl_dir" ] && bb_nccl=$nccl_dir/libnccl.so.2; }

# ---- build here, or the carried bundle ------------------------------------------
BIN=build/sm90/bin/bigbatch TEST=build/sm90/tests/test_cuda
nccl_flags=()
[ -e /usr/local/cuda/include/nccl.h ] || [ -z "$nccl_dir" ] || nccl_flags=(NCCL_INC="${nccl_dir%/lib}/include" NCCL_LIB="$nccl_dir")
if step build 240 make -j"$(nproc)" CUDA=1 CUDA_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILD=build/sm90 \
    BIN_DIR=build/sm90/bin LIB_DIR=build/sm90/lib "${nccl_flags[@]}" all "$TEST"; then
    row "| build | here, for sm_90 ($(elapsed)s) |"
elif [ -x build/gpu/bin/bigbatch ]; then
    rm -f "$state/failed" # expected where the machine has no -dev packages
    BIN=build/gpu/bin/bigbatch TEST=build/gpu/tests/test_cuda
    bb_ld=$bb_ld:$PWD/build/gpu/so
    row "| build | none here (build.log); the carried build/gpu |"
else
    cp "$state/build.out" "$OUT/build.log"
    row "| build | FAILED: cannot build here and no build/gpu was carried |"
    exit 1
fi
cp "$state/build.out" "$OUT/build.log"
if ! LD_LIBRARY_PATH=$bb_ld ldd "$BIN" | grep -q "libcublas.*=> /"; then # cuBLAS from PyTorch's wheel
    d=$(torch_lib cublas) && [ -n "$d" ] && bb_ld=$bb_ld:$d
fi
# bigbatch's environment, as a command prefix (timeout runs commands, not shell functions)
bb=(env LD_LIBRARY_PATH="$bb_ld" BIGBATCH_BIN="$PWD/$BIN")
[ -z "$bb_nccl" ] || bb+=(BB_NCCL_LIBRARY="$bb_nccl")
missing=$("${bb[@]}" ldd "$BIN" "$TEST" 2>&1 | grep "not found" | sort -u | tr -s ' \t\n' ' ')
[ -z "$missing" ] || { row "| libraries | FAILED: missing $missing |"; exit 1; }
row "| bigbatch | $("${bb[@]}" "$BIN" version 2>&1 | head -1) |"

# ---- the CUDA tests ------------------------------------------------------------------
step tests 150 "${bb[@]}" CUDA_LAUNCH_BLOCKING=1 "$TEST" --jobs 1 --verbose
rc=$?
cp "$state/tests.out" "$OUT/test_cuda.txt"
ran=$(grep -c -E '^\[(PASS|FAIL)\]' "$OUT/test_cuda.txt")
skipped=$(grep -c '^\[SKIP\]' "$OUT/test_cuda.txt")
fails=$(grep '^\[FAIL\]' "$OUT/test_cuda.txt" | sed 's/^\[FAIL\] cuda:://; s/:.*//' | tr '\n' ' ')
row "| CUDA tests | $(verdict $rc): $ran ran, $skipped skipped${fails:+; failed: $fails} |"
if ! grep -q '^\[PASS\] cuda::linear_matches_cpu' "$OUT/test_cuda.txt"; then
    fail "no GPU test ran"
    row "| CUDA tests on a GPU | none ran (every GPU test skipped or failed) |"
fi

# ---- GPT-2 124M: a row per run as soon as it is known, then the checks -----------------
bench_row() { # NAME JSON PEAK_FLOPS
    $PY -c '
import json, sys
name, s, peak = sys.argv[1], sys.argv[2], float(sys.argv[3])
try: r = json.loads(s)
except Exception: r = {}
def f(k, fmt="%.0f", scale=1.0): return fmt % (r[k] * scale) if k in r else "n/a"
mfu = "%.1f%%" % (100 * r["tokens_per_s"] * (6 * r["params"] + 12 * 12 * 1024 * 768) / peak) if "params" in r else "n/a"
print("| %s | %s | %s | %s | %s | %s |" % (name, f("tokens_per_s"), f("step_ms", "%.1f"), mfu,
                                         f("peak_bytes", "%.2f", 2.0 ** -30), f("first_loss", "%.4f")))
' "$@" | tee -a "$OUT/table.md"
}
row ""
row "| GPT-2 124M, micro-batch 8, T 1024, V 50257 | tokens/s | step ms | MFU (of 67 fp32, 989 bf16 TFLOP/s) | peak GiB | first loss |"
row "|---|---|---|---|---|---|"
gpt2="--model gpt --layers 12 --heads 12 --d-model 768 --seq-len 1024 --vocab 50257 --micro-batch 8 --devices cuda:0"
step model 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json
fp32=$(result model)
bench_row "bigbatch fp32" "$fp32" 67e12
step model_blocks 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json --checkpoint blocks
blocks=$(result model_blocks)
bench_row "bigbatch fp32 --checkpoint blocks" "$blocks" 67e12
step model_bf16 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json --precision bf16
bf16=$(result model_bf16)
bench_row "bigbatch bf16 (activations + products)" "$bf16" 989e12
step torch 120 $PY perf/torch_gpu_bench.py --vocab 50257 --steps "$STEPS" --precision fp32
tfp32=$(result torch)
bench_row "PyTorch eager fp32" "$tfp32" 67e12
step torch_bf16 120 $PY perf/torch_gpu_bench.py --vocab 50257 --steps "$STEPS" --precision bf16
tbf16=$(result torch_bf16)
bench_row "PyTorch eager bf16 autocast" "$tbf16" 989e12

row ""
row "| check | result |"
row "|---|---|"
$PY -c '
import json, math, sys
def load(s):
    try: return json.loads(s)
    except Exception: return {}
a, h, c, tf, tb = (load(s) for s in sys.argv[1:6])
lnv = math.log(50257)
ok = "first_loss" in a and abs(a["first_loss"] - lnv) < 0.1
print("| GPT-2 first-step loss vs ln V = %.4f | %s |" % (lnv, "%.4f: ok" % a["first_loss"] if ok else "FAILED or missing"))
same = "first_loss" in a and a.get("first_loss") == c.get("first_loss") and a.get("last_loss") == c.get("last_loss")
print("| --checkpoint blocks vs none, fp32 losses | %s |" % ("equal to the bit" if same else "FAILED: they differ or are missing"))
close = "first_loss" in h and "first_loss" in a and abs(h["first_loss"] - a["first_loss"]) <= 2e-2 * a["first_loss"]
print("| bf16 vs fp32 first-step loss | %s |" % ("within 2e-2" if close else "FAILED or missing"))
def ratio(x, y, k): return "%.2fx" % (x[k] / y[k]) if k in x and k in y and y[k] else "n/a"
print("| bigbatch / PyTorch tokens/s, fp32 and bf16 | %s, %s |" % (ratio(a, tf, "tokens_per_s"), ratio(h, tb, "tokens_per_s")))
print("| checkpoint blocks / none, step time | %s |" % ratio(c, a, "step_ms"))
sys.exit(0 if ok and same and close else 1)
' "$fp32" "$bf16" "$blocks" "$tfp32" "$tbf16" | tee -a "$OUT/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "GPT-2 correctness checks"

# ---- train on kjv: save, val, trace, bf16, then resume to the bit -----------------------
tmp=$(mktemp -d)
train="--data data/kjv/train --val-data data/kjv/val --devices cuda:0 --layers 12 --heads 12 --d-model 768
       --global-batch 64 --micro-batch 16 --steps 8 --eval-every 4 --quiet"
step train_whole 90 "${bb[@]}" "$BIN" train $train --metrics "$tmp/whole.jsonl" --trace "$tmp/trace.json"
r1=$?
step train_first 90 "${bb[@]}" "$BIN" train $train --stop-after 4 --save "$tmp/ck"
r2=$?
step train_resume 90 "${bb[@]}" "$BIN" train $train --resume "$tmp/ck" --metrics "$tmp/resumed.jsonl"
r3=$?
step train_bf16 90 "${bb[@]}" "$BIN" train $train --precision bf16 --metrics "$tmp/bf16.jsonl"
r4=$?
$PY -c '
import json, os, statistics, sys
tmp, codes = sys.argv[1], [int(x) for x in sys.argv[2:6]]
def rows(name):
    try: return [r for r in map(json.loads, open(os.path.join(tmp, name))) if "step" in r]
    except Exception: return []
whole, resumed, bf16 = rows("whole.jsonl"), rows("resumed.jsonl"), rows("bf16.jsonl")
w = {r["step"]: r["loss"] for r in whole}
rs = {r["step"]: r["loss"] for r in resumed if r["step"] > 4}
same = codes[:3] == [0, 0, 0] and len(rs) == 4 and all(w.get(s) == l for s, l in rs.items())
print("| train 8 steps; --save at 4, --resume | %s |" % (
    "steps 5-8 equal to the bit (%s)" % ", ".join("%.6f" % rs[s] for s in sorted(rs)) if same
    else "FAILED (exits %s; whole %s; resumed %s)" % (codes[:3], [w.get(s) for s in sorted(rs)], [rs[s] for s in sorted(rs)])))
vals = [r["val_loss"] for r in whole if r.get("val_loss") is not None]
print("| --val-data every 4 steps | %s |" % (", ".join("%.4f" % v for v in vals) if vals else "FAILED: no val_loss"))
trace = os.path.join(tmp, "trace.json")
traced = os.path.exists(trace) and os.path.getsize(trace) > 1000
print("| --trace | %s |" % ("%.0f KiB" % (os.path.getsize(trace) / 1024) if traced else "FAILED"))
b = [r["loss"] for r in bf16]
print("| --precision bf16 train | %s |" % ("losses %.4f -> %.4f (fp32 %.4f -> %.4f)" % (b[0], b[-1], whole[0]["loss"], whole[-1]["loss"])
      if codes[3] == 0 and b and whole else "FAILED (exit %d)" % codes[3]))
waits = [r["data_wait_pct"] for r in whole[2:]]
print("| train on cuda:0, data-wait %% of step (median) | %s |" % (round(statistics.median(waits), 3) if waits else "n/a"))
sys.exit(0 if same and vals and traced and b else 1)
' "$tmp" "$r1" "$r2" "$r3" "$r4" | tee -a "$OUT/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "train checks"
# under mpirun -np 1 (a job of one process: MPI initialised, the same run)
if command -v mpirun > /dev/null; then
    step train_mpi 90 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 "${bb[@]}" "$BIN" \
        train $train --stop-after 4 --metrics "$tmp/mpi.jsonl"
    mpi_same=$($PY -c 'import json,sys; rows=lambda f: [r["loss"] for r in map(json.loads, open(f)) if "step" in r]; a=rows(sys.argv[1])[:4]; b=rows(sys.argv[2]); print("equal to the bit" if a == b and b else "FAILED")' "$tmp/whole.jsonl" "$tmp/mpi.jsonl" 2>/dev/null || echo FAILED)
    row "| mpirun -np 1 train on cuda:0, 4 steps vs the plain run | $mpi_same |"
    [ "$mpi_same" = "equal to the bit" ] || fail "mpirun -np 1"
else
    row "| mpirun -np 1 train on cuda:0 | n/a (no mpirun on this machine) |"
fi
rm -rf "$tmp"

# ---- copies and the loader ---------------------------------------------------------------
step copy 60 "${bb[@]}" "$BIN" bench copy --devices cuda:0 --json
c=$(result copy)
row "| H2D GB/s, pinned / pageable | $(field "$c" pinned_gb_per_s %.1f) / $(field "$c" pageable_gb_per_s %.1f) |"
step loader 60 "${bb[@]}" "$BIN" bench loader --data data/kjv/train --pinned --seconds 3 --json
l=$(result loader)
row "| loader records/s into pinned slots (kjv) | $(field "$l" records_per_s %.0f) |"

# ---- every failure, then the verdict ---------------------------------------------------------
problems=$(tr '\n' ';' < "$state/failed" 2> /dev/null)
row "| failures | ${problems:-none} |"
if [ -s "$state/failed" ]; then
    row "| gpu_check | FAILED after $(elapsed)s |"
    exit 1
fi
row "| gpu_check | passed in $(elapsed)s |"

#!/usr/bin/env bash
# gpu_check.sh — the one command to run on a machine with a GPU (an H200): build
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
# JSON, tagged) and $OUT/gpu.txt (nvidia-smi): six files, few enough to
# copy back by hand. Meant to finish, build included, in 6 minutes.
#
# Exit status: 0 when every step passed and the CUDA tests ran on a GPU; 1
# when a step failed or timed out, a check failed, or every CUDA test
# skipped (no GPU).
#
# What it checks (GPT-2 124M: 12 layers, 12 heads, d 768, T 1024, V 50257):
#   - the attention op alone at T 7, 70 and 1024 (B 8, 12 heads of 64, bf16):
#     cuDNN's fused SDPA, bigbatch's kernels and PyTorch's SDPA, forward and
#     backward ms and each one's largest difference from a float64 reference;
#   - the CUDA tests, op by op against the CPU, a one-rank NCCL reducer,
#     bitwise resume (Criterion --jobs 1, CUDA_LAUNCH_BLOCKING=1 so that
#     an asynchronous fault names its op);
#   - the first-step loss ≈ ln V; fp32 and --checkpoint blocks losses equal
#     to the bit; bf16 within 2e-2;
#   - tokens/s, MFU and peak memory beside PyTorch (eager, the same shape):
#     MFU = tokens/s · (6·params + 12·layers·T·d) over the dense peak
#     (67 TFLOP/s fp32, 989 bf16), and by llm.c's formula (6·params +
#     6·layers·d·T); bf16 also with --attention kernels (cuDNN's share)
#     and with BB_CUBLASLT=off (the epilogues' share: plain cuBLAS and
#     bias/GELU kernels; a bf16 run whose products are not cuBLASLt's
#     fails), fp32 also with cuBLAS's pedantic math (BB_CUBLAS_PEDANTIC=1);
#     the host's waits for the GPU a step; the peak (allocations + the
#     backend's workspace) against the planner's prediction;
#   - a per-op profile of one bf16 step (BB_PROFILE_OPS=1: CUDA events
#     around each op): calls, ms, share of the step, products' TFLOP/s;
#   - the goals: bf16 >= 470K tokens/s and >= 1.0x PyTorch eager bf16;
#     attention forward + backward <= 1.2x PyTorch's SDPA at T 1024;
#   - a short `train` on data/kjv with --save, --val-data, --trace and
#     --precision bf16, then --resume: the resumed losses equal the
#     uninterrupted run's to the bit; data-wait % of the step;
#   - `sample` of the saved 12-layer model: tokens/s with a CUDA graph a
#     token against BB_CUDA_GRAPHS=off (kernels one by one), the greedy ids
#     the same;
#   - host-to-device GB/s pinned vs pageable. (The loader's records/s into
#     pinned slots, measured here before, was cut for the attention and
#     profile rows: the loader is measured on the CPU, perf/loader_bench.sh.)
#
# Time: about 6 minutes with the build (1.5-2 of them; cuDNN's graph code is
# one 35 s file), the tests 1.5, the GPT-2 runs 1.5, the attention 0.5, the
# train runs 1.
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
bb_cudnn="" # and cuDNN: the system's, else PyTorch's
cudnn_dir=$(torch_lib cudnn)
ldconfig -p 2> /dev/null | grep -q 'libcudnn.so.9 ' || [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ] || bb_cudnn=/usr/local/cuda/lib64/libcudnn.so.9
[ -n "$bb_cudnn" ] || ldconfig -p 2> /dev/null | grep -q 'libcudnn.so.9 ' || { [ -n "$cudnn_dir" ] && bb_cudnn=$cudnn_dir/libcudnn.so.9; }

# ---- build here, or the carried bundle ------------------------------------------
BIN=build/sm90/bin/bigbatch TEST=build/sm90/tests/test_cuda
nccl_flags=()
[ -e /usr/local/cuda/include/nccl.h ] || [ -z "$nccl_dir" ] || nccl_flags=(NCCL_INC="${nccl_dir%/lib}/include" NCCL_LIB="$nccl_dir")
# Without the cuDNN frontend's headers (make deps fetches them; that machine cannot) a build here
# would have no cuDNN attention: the carried bundle, built with them, is the better binary then.
built=0
if [ ! -e build/deps/cudnn-frontend-1.32.0/include/cudnn_frontend.h ] && [ -x build/gpu/bin/bigbatch ]; then
    echo "no cuDNN frontend headers here: the carried build/gpu" > "$state/build.out"
elif step build 240 make -j"$(nproc)" CUDA=1 CUDA_GENCODE="-gencode=arch=compute_90,code=[sm_90,compute_90]" BUILD=build/sm90 \
    BIN_DIR=build/sm90/bin LIB_DIR=build/sm90/lib "${nccl_flags[@]}" all "$TEST"; then
    built=1
fi
if [ $built = 1 ]; then
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
[ -z "$bb_cudnn" ] || bb+=(BB_CUDNN_LIBRARY="$bb_cudnn")
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
L, T, d = 12, 1024, 768
mfu = lambda attn: "%.1f%%" % (100 * r["tokens_per_s"] * (6 * r["params"] + attn) / peak) if "params" in r else "n/a"
mem = "%.2f / %.2f" % ((r["peak_bytes"] + r["workspace_bytes"]) / 2 ** 30, r["planned_bytes"] / 2 ** 30) if "planned_bytes" in r else f("peak_bytes", "%.2f", 2.0 ** -30)
print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (name, f("tokens_per_s"), f("step_ms", "%.1f"), mfu(12 * L * T * d),
      mfu(6 * L * d * T), f("host_waits_per_step", "%.1f"), mem, f("first_loss", "%.4f")))
' "$@" | tee -a "$OUT/table.md"
}
row ""
row "| GPT-2 124M, micro-batch 8, T 1024, V 50257 | tokens/s | step ms | MFU (6N+12LdT; of 67 fp32, 989 bf16 TFLOP/s) | MFU, llm.c's (6N+6LdT) | host waits a step | peak GiB (bigbatch: real / planned) | first loss |"
row "|---|---|---|---|---|---|---|---|"
gpt2="--model gpt --layers 12 --heads 12 --d-model 768 --seq-len 1024 --vocab 50257 --micro-batch 8 --devices cuda:0"
step model 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json
fp32=$(result model)
bench_row "bigbatch fp32" "$fp32" 67e12
step model_pedantic 120 "${bb[@]}" BB_CUBLAS_PEDANTIC=1 "$BIN" bench model $gpt2 --steps "$STEPS" --json
pedantic=$(result model_pedantic)
bench_row "bigbatch fp32, cuBLAS pedantic math (before)" "$pedantic" 67e12
step model_blocks 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json --checkpoint blocks
blocks=$(result model_blocks)
bench_row "bigbatch fp32 --checkpoint blocks" "$blocks" 67e12
step model_bf16 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json --precision bf16
bf16=$(result model_bf16)
engine=$(field "$bf16" attention_engine %s)
bench_row "bigbatch bf16 (activations + products; attention: $engine)" "$bf16" 989e12
case $engine in # on sm_90 bf16 a run on our kernels is 30-60x slower: never a silent pass
cuDNN*) ;;
*) row "| attention engine, bf16 GPT-2 | FAILED: $engine, not cuDNN (see the build row and log.txt) |"
   fail "bf16 attention ran on $engine, not cuDNN" ;;
esac
step model_bf16_kernels 120 "${bb[@]}" "$BIN" bench model $gpt2 --steps "$STEPS" --json --precision bf16 --attention kernels
bf16k=$(result model_bf16_kernels)
bench_row "bigbatch bf16, --attention kernels" "$bf16k" 989e12
step model_bf16_plain 120 "${bb[@]}" BB_CUBLASLT=off "$BIN" bench model $gpt2 --steps "$STEPS" --json --precision bf16
bf16p=$(result model_bf16_plain)
bench_row "bigbatch bf16, BB_CUBLASLT=off (plain cuBLAS; bias, GELU, bias gradients in kernels)" "$bf16p" 989e12
products=$(field "$bf16" products %s)
case $products in # the epilogues missing on a GPU would be a silent slowdown: say so
cuBLASLt*) ;;
*) row "| products, bf16 GPT-2 | FAILED: $products, not cuBLASLt's epilogues (see log.txt) |"
   fail "bf16 products ran on $products" ;;
esac
step torch 120 $PY perf/torch_gpu_bench.py --vocab 50257 --steps "$STEPS" --precision fp32
tfp32=$(result torch)
bench_row "PyTorch eager fp32" "$tfp32" 67e12
step torch_bf16 120 $PY perf/torch_gpu_bench.py --vocab 50257 --steps "$STEPS" --precision bf16
tbf16=$(result torch_bf16)
bench_row "PyTorch eager bf16 autocast" "$tbf16" 989e12

# ---- a llama, bf16: grouped-query attention (9 heads over 3) on cuDNN's SDPA --------------
row ""
row "| SmolLM2-135M's shape (30 layers, 9 heads / 3 kv, d 576), bf16, micro-batch 8, T 2048 | tokens/s | step ms | attention |"
row "|---|---|---|---|"
llama="--model llama --preset smollm2-135m --seq-len 2048 --micro-batch 8 --devices cuda:0 --precision bf16"
step llama_bf16 120 "${bb[@]}" "$BIN" bench model $llama --steps "$STEPS" --json
lb=$(result llama_bf16)
lengine=$(field "$lb" attention_engine %s)
row "| bigbatch | $(field "$lb" tokens_per_s %.0f) | $(field "$lb" step_ms %.1f) | $lengine |"
step llama_bf16_kernels 120 "${bb[@]}" "$BIN" bench model $llama --steps "$STEPS" --json --attention kernels
lbk=$(result llama_bf16_kernels)
row "| bigbatch --attention kernels | $(field "$lbk" tokens_per_s %.0f) | $(field "$lbk" step_ms %.1f) | $(field "$lbk" attention_engine %s) |"
case $lengine in # cuDNN 9 takes K and V with fewer heads; one that does not is a warning in log.txt
cuDNN*) ;;
*) row "| attention engine, bf16 grouped-query llama | FAILED: $lengine, not cuDNN (see log.txt) |"
   fail "bf16 grouped-query attention ran on $lengine, not cuDNN" ;;
esac

# ---- one bf16 step, op by op ----------------------------------------------------------------
step profile 120 "${bb[@]}" BB_PROFILE_OPS=1 "$BIN" bench model $gpt2 --steps 5 --json --precision bf16
prof=$(result profile)
row ""
row "| op (bf16 step, BB_PROFILE_OPS=1) | calls | ms | share of the step | products' TFLOP/s (% of 989) |"
row "|---|---|---|---|---|"
$PY -c '
import json, sys
try: ops = json.loads(sys.argv[1]).get("ops", [])
except Exception: ops = []
total = sum(o["ms"] for o in ops)
for o in ops:
    tf = o["gflop"] / o["ms"] if o["ms"] > 0 and o["gflop"] > 0 else 0
    print("| %s | %.0f | %.3f | %.1f%% | %s |" % (o["op"], o["calls"], o["ms"], 100 * o["ms"] / total,
          "%.0f (%.0f%%)" % (tf, 100 * tf / 989) if tf else ""))
print("| all ops | | %.3f | 100%% | |" % total if ops else "| profile | n/a |")
' "$prof" | tee -a "$OUT/table.md"

# ---- the attention op alone, beside PyTorch's SDPA --------------------------------------------
step attention 150 $PY perf/torch_attention_bench.py --bigbatch "${bb[*]} $PWD/$BIN" --device cuda --seq-lens 7,70,1024
row ""
row "| attention, B 8, 12 heads of 64, bf16 | engine (ran) | forward ms | backward ms | out: max diff / max | dqkv: max diff / max |"
row "|---|---|---|---|---|---|"
grep -E '^\{' "$state/attention.out" | while read -r line; do
    echo "{\"tag\": \"attention\", \"result\": $line}" >> "$OUT/results.jsonl"
    $PY -c '
import json, sys
r = json.loads(sys.argv[1])
if "error" in r: print("| T %d | %s | n/a: %s | | | |" % (r["T"], r["engine"], r["error"]))
else: print("| T %d | %s%s | %.3f | %.3f | %.2e | %.2e |" % (r["T"], r["engine"], " (%s)" % r["ran"] if "ran" in r else "",
      r["forward_ms"], r["backward_ms"], r["out_rel_diff"], r["dqkv_rel_diff"]))
' "$line" | tee -a "$OUT/table.md"
done
$PY -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
bad = [r for r in rows if "out_rel_diff" in r and (r["out_rel_diff"] > 2e-2 or r["dqkv_rel_diff"] > 5e-2)]
for r in bad: print("| attention T %d, %s | FAILED: differs from the float64 reference by %.2e / %.2e |" % (r["T"], r["engine"], r["out_rel_diff"], r["dqkv_rel_diff"]))
sys.exit(1 if bad or not rows else 0)
' "$state/attention.out" | tee -a "$OUT/table.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "attention differences"

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
k, ped = load(sys.argv[6]), load(sys.argv[8])
print("| fp32 cuBLAS default / pedantic math, tokens/s | %s |" % ratio(a, ped, "tokens_per_s"))
print("| bf16 cuDNN attention / bigbatch kernels, tokens/s | %s |" % ratio(h, k, "tokens_per_s"))
print("| bf16 cuBLASLt epilogues / plain cuBLAS and kernels, tokens/s | %s |" % ratio(h, load(sys.argv[9]), "tokens_per_s"))
goal = h.get("tokens_per_s", 0) >= 470e3 and "tokens_per_s" in tb and h["tokens_per_s"] >= tb["tokens_per_s"]
print("| goal: bf16 >= 470K tokens/s and >= 1.0x PyTorch eager bf16 | %s |" % ("met" if goal else "not met (%s tokens/s, %s of PyTorch)" % (
      "%.0f" % h["tokens_per_s"] if "tokens_per_s" in h else "n/a", ratio(h, tb, "tokens_per_s"))))
try:
    att = [json.loads(l) for l in open(sys.argv[7]) if l.startswith("{")]
    t = {r["engine"]: r["forward_ms"] + r["backward_ms"] for r in att if r["T"] == 1024 and "forward_ms" in r}
    best = min(v for e, v in t.items() if e in ("cudnn", "kernels"))
    peer = [v for e, v in t.items() if e.startswith("pytorch")][0]
    print("| goal: attention forward + backward <= 1.2x PyTorch SDPA at T 1024 | %.2fx: %s |" % (best / peer, "met" if best <= 1.2 * peer else "not met"))
except Exception:
    print("| goal: attention forward + backward <= 1.2x PyTorch SDPA at T 1024 | n/a |")
sys.exit(0 if ok and same and close else 1)
' "$fp32" "$bf16" "$blocks" "$tfp32" "$tbf16" "$bf16k" "$state/attention.out" "$pedantic" "$bf16p" | tee -a "$OUT/table.md"
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
# ---- decoding the saved 12-layer model: one graph a token vs the kernels one by one ----------
sample_rate() { sed -nE 's/.*: ([0-9.]+) tokens\/s.*/\1/p' "$state/$1.out" | tail -1; }
sample="sample --ckpt $tmp/ck --tokens 200 --temperature 0 --ids --devices cuda:0"
step sample_graphs 60 "${bb[@]}" BB_LOG=info "$BIN" $sample
step sample_plain 60 "${bb[@]}" BB_LOG=info BB_CUDA_GRAPHS=off "$BIN" $sample
g=$(sample_rate sample_graphs) p=$(sample_rate sample_plain)
ids_same=$(cmp -s <(grep -E '^[0-9 ]+$' "$state/sample_graphs.out") <(grep -E '^[0-9 ]+$' "$state/sample_plain.out") && echo same || echo DIFFERENT)
row "| sample 200 tokens (12 layers, d 768), tokens/s: CUDA graphs / one by one | ${g:-n/a} / ${p:-n/a} ($(awk -v a="${g:-0}" -v b="${p:-0}" 'BEGIN {print b > 0 ? sprintf("%.2fx", a / b) : "n/a"}')); greedy ids $ids_same |"
[ "$ids_same" = same ] && [ -n "$g" ] || fail "sample with CUDA graphs"
grep -q "graphs off" "$state/sample_graphs.out" && fail "CUDA graphs turned themselves off (log.txt, sample_graphs)"
rm -rf "$tmp"

# ---- copies and the loader ---------------------------------------------------------------
step copy 60 "${bb[@]}" "$BIN" bench copy --devices cuda:0 --json
c=$(result copy)
row "| H2D GB/s, pinned / pageable | $(field "$c" pinned_gb_per_s %.1f) / $(field "$c" pageable_gb_per_s %.1f) |"

# ---- every failure, then the verdict ---------------------------------------------------------
problems=$(tr '\n' ';' < "$state/failed" 2> /dev/null)
row "| failures | ${problems:-none} |"
if [ -s "$state/failed" ]; then
    row "| gpu_check | FAILED after $(elapsed)s |"
    exit 1
fi
row "| gpu_check | passed in $(elapsed)s |"

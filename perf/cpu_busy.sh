#!/usr/bin/env bash
# cpu_busy.sh — how many of the machine's cores a command keeps busy:
# samples every CPU at 997 Hz with `perf record -a` while COMMAND runs,
# and prints, over the command's wall time (from its first sample to its
# last), the share of sampling periods in which 0, 1, 2, ... CPUs ran the
# command's threads, and the CPU time per symbol group (BLAS, the
# element-wise ops, attention, spinning, kernel) of the command.
#
#   perf/cpu_busy.sh bin/bigbatch train --steps 20 --quiet
#
# Needs perf and the right to sample every CPU (root, or
# kernel.perf_event_paranoid <= 0). Run it on a quiet machine: another
# process's samples count as idle for the command.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: perf/cpu_busy.sh COMMAND [ARGS...]" >&2; exit 1; }
command -v perf >/dev/null || { echo "cpu_busy.sh: perf is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perf record -q -a -F 997 -e cpu-clock -o "$tmp/perf.data" -- "$@" >"$tmp/out" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
perf script -i "$tmp/perf.data" -F pid,cpu,time,ip,sym 2>/dev/null >"$tmp/script" || true
/usr/bin/python3 - "$tmp/script" "$(nproc)" "$1" <<'EOF'
import collections, re, sys
path, ncpu, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
line_re = re.compile(r"^\s*(\d+)\s+\[(\d+)\]\s+([\d.]+):\s*(?:[0-9a-f]+\s+)?(\S*)")
samples = []
for line in open(path, errors="replace"):
    m = line_re.match(line)
    if m:
        samples.append((int(m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4) or None))
ours = [s for s in samples if s[0] != 0]
# The command's process (and its re-exec, same pid) owns the most samples
# besides perf itself, which records its own pid's few samples.
by_pid = collections.Counter(s[0] for s in ours)
if not by_pid:
    sys.exit("cpu_busy.sh: no samples of the command")
pid = by_pid.most_common(1)[0][0]
mine = [s for s in ours if s[0] == pid]
t0, t1 = min(s[2] for s in mine), max(s[2] for s in mine)
SPIN = "pool: waiting and spinning"
def group(sym):
    if sym is None or sym == "[unknown]":
        return "other"
    if sym.startswith("sgemm") or "openblas" in sym.lower() or sym.startswith("blas"):
        return "BLAS (sgemm)"
    if sym in ("worker_main", "bb_cpu_parallel", "run_tasks") or "sched_yield" in sym or "futex" in sym:
        return SPIN
    if sym.endswith("_range") or sym.startswith("xent") or sym.startswith("bb_cpu_"):
        return "bigbatch's other CPU ops (element-wise, row-wise, loss)"
    if "attention" in sym or sym in ("forward_task", "backward_task"):
        return "attention (non-GEMM part)"
    if sym.startswith("__") or sym.startswith("_raw") or sym.startswith("do_") or sym.startswith("exc_") or "page" in sym:
        return "kernel and libc"
    return "other"
period = 1 / 997
busy, working = collections.defaultdict(set), collections.defaultdict(set)
for _, cpu, t, sym in mine:
    busy[int((t - t0) / period)].add(cpu)
    if group(sym) != SPIN:
        working[int((t - t0) / period)].add(cpu)
bins = int((t1 - t0) / period) + 1
count = collections.Counter(len(busy.get(b, ())) for b in range(bins))
work = collections.Counter(len(working.get(b, ())) for b in range(bins))
print(f"# cpu_busy: {what}, {t1 - t0:.2f} s of wall time, {ncpu} CPUs, {len(mine)} samples of pid {pid}")
print("| CPUs running the command | share of wall time | the same, a pool thread's spin-wait counted as idle |")
print("|---|---|---|")
for k in range(ncpu + 1):
    print(f"| {k} | {100 * count.get(k, 0) / bins:.1f}% | {100 * work.get(k, 0) / bins:.1f}% |")
groups = collections.Counter(group(s[3]) for s in mine)
print()
print("| where the command's CPU time went | share |")
print("|---|---|")
for g, n in groups.most_common():
    print(f"| {g} | {100 * n / len(mine):.1f}% |")
EOF

#!/usr/bin/env bash
# planner_check.sh — the planner's pick against brute force (issue 30).
#
# A 6-layer gpt (4 heads, d 128, T 256; data/kjv) with G = 32 on cpu:1:
# every uniform policy (none, selective, blocks, every:2, every:3) at every
# micro-batch, and SAMPLE (default 24) seeded random per-block plans at
# random micro-batches, each trained for STEPS steps (default 4; the first
# is a warm-up) in RUNS rounds (default 5), interleaved; a configuration's
# time is the median over rounds of its median step (forward + backward +
# reduce + optimizer, from --metrics). Then for three caps (the caps whose
# usable 95% holds the exact peaks of none at micro-batch 4, selective at
# 2 and blocks at 1, plus 1%), the
# configurations whose exact peak (plan --json) fits the usable budget, the
# fastest of them measured, and the planner's pick (plan --calibrate first;
# its pick is measured too when it is not among them): the pick must be
# within 3% of the fastest and its run must fit --device-mem (train fails
# past it). Slow: about 12 minutes on 2 cores.
#
# Then the caps (27, 28, 29 MiB) where the planner picks a mixed per-block
# plan: that plan against the fastest uniform policy that fits, at the same
# micro-batch and any other, measured the same way (MIXED_ONLY=1 runs just
# this part, about 2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
STEPS=${STEPS:-4}
SAMPLE=${SAMPLE:-24}
make --no-print-directory all >/dev/null
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export BB_CACHE_DIR="$tmp/cache"
model="--data data/kjv/train --layers 6 --heads 4 --d-model 128 --global-batch 32"
bin/bigbatch plan $model --calibrate >/dev/null 2>&1
# the configurations: uniform policies at every micro-batch, and a seeded sample of mixed plans
configs=$($PY - "$SAMPLE" <<'EOF'
import random, sys
random.seed(30)
out = [f"{b} {p}" for b in (1, 2, 4, 8, 16, 32) for p in ("none", "selective", "blocks", "every:2", "every:3")]
seen = set()
while len(seen) < int(sys.argv[1]):
    plan = "".join(random.choice("nsf") for _ in range(6))
    if len(set(plan)) == 1:
        continue
    b = random.choice((1, 2, 4, 8))
    if (b, plan) not in seen:
        seen.add((b, plan))
        out.append(f"{b} plan:{','.join(plan)}")
print("\n".join(out))
EOF
)
peak() { # exact peak of micro-batch $1, policy $2
    bin/bigbatch plan $model --micro-batch "$1" --checkpoint "$2" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["peak_bytes"])'
}
step_ms() { # median step of one run (steps after the first)
    $PY -c 'import json,sys,statistics as s; r=[json.loads(l) for l in open(sys.argv[1])][2:]; print(s.median(x["fwd_ms"]+x["bwd_ms"]+x["reduce_ms"]+x["opt_ms"] for x in r))' "$1"
}
declare -A times peaks
run() { # micro-batch, policy [, device-mem]: one measured run
    local m="$tmp/m.jsonl"
    rm -f "$m"
    bin/bigbatch train $model --micro-batch "$1" --checkpoint "$2" --steps "$STEPS" --quiet --metrics "$m" \
        ${3:+--device-mem "$3"} >/dev/null
    times["$1 $2"]+="$(step_ms "$m") "
}
med() { echo "$1" | tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
pick_of() { # the planner's choice under cap $1: micro-batch, policy, peak
    bin/bigbatch plan $model --device-mem "$1" --json |
        $PY -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["chosen"]][0]; print(r["micro_batch"], r["checkpoint"], r["peak_bytes"])'
}
best_uniform() { # the uniform policy and micro-batch of least planned time that fits under cap $1
    bin/bigbatch plan $model --device-mem "$1" --json |
        $PY -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x["fits"] and not x["checkpoint"].startswith("plan:")]; r.sort(key=lambda x: x["relative_time"]); print(r[0]["micro_batch"], r[0]["checkpoint"], r[0]["peak_bytes"])'
}
mixed_caps() {
    echo
    echo "| cap | planner's pick (mixed) | its peak | its time | best uniform that fits | its peak | its time | uniform / pick |"
    echo "|---|---|---|---|---|---|---|---|"
    local caps="27MiB 28MiB 29MiB" c
    declare -A pk un
    for c in $caps; do pk[$c]=$(pick_of "$c"); un[$c]=$(best_uniform "$c"); done
    for ((i = 0; i < RUNS; i++)); do
        for c in $caps; do
            read -r b p _ <<< "${pk[$c]}"; run "$b" "$p" "$c"
            read -r b p _ <<< "${un[$c]}"; run "$b" "$p" "$c"
        done
    done
    for c in $caps; do
        read -r pb pp ppeak <<< "${pk[$c]}"; read -r ub up upeak <<< "${un[$c]}"
        awk -v c="$c" -v p="$pb $pp" -v pk="$ppeak" -v pt="$(med "${times["$pb $pp"]}")" -v u="$ub $up" -v uk="$upeak" \
            -v ut="$(med "${times["$ub $up"]}")" 'BEGIN {printf "| %s | %s | %.2f MiB | %.1f ms | %s | %.2f MiB | %.1f ms | %.3f |\n", c, p, pk / 1048576, pt, u, uk / 1048576, ut, ut / pt}'
    done
}
if [ -n "${MIXED_ONLY:-}" ]; then
    echo "# planner_check (mixed caps only): $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, RUNS=$RUNS STEPS=$STEPS"
    mixed_caps
    exit 0
fi
while read -r b p; do peaks["$b $p"]=$(peak "$b" "$p"); done <<< "$configs"
for ((i = 0; i < RUNS; i++)); do
    while read -r b p; do run "$b" "$p"; done <<< "$configs"
done
echo "# planner_check: $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD), $(nproc) CPUs, RUNS=$RUNS STEPS=$STEPS, $(echo "$configs" | wc -l) configurations"
echo
echo "| cap | fitting | fastest measured | its time | planner's pick | its peak | its time | pick / fastest |"
echo "|---|---|---|---|---|---|---|---|"
for ref in "4 none" "2 selective" "1 blocks"; do
    cap=$(( ${peaks[$ref]} * 101 / 95 ))
    usable=$(( cap * 95 / 100 ))
    best="" best_t=""
    fitting=0
    while read -r b p; do
        (( ${peaks["$b $p"]} <= usable )) || continue
        fitting=$((fitting + 1))
        t=$(med "${times["$b $p"]}")
        if [ -z "$best_t" ] || awk -v a="$t" -v b="$best_t" 'BEGIN {exit !(a < b)}'; then best="$b $p" best_t=$t; fi
    done <<< "$configs"
    read -r pb pp ppeak <<< "$(pick_of "$cap")"
    if [ -z "${times["$pb $pp"]:-}" ]; then for ((i = 0; i < RUNS; i++)); do run "$pb" "$pp" "$cap"; done; fi
    run "$pb" "$pp" "$cap" # the pick under --device-mem: train fails past the cap
    pt=$(med "${times["$pb $pp"]}")
    awk -v c="$cap" -v f="$fitting" -v b="$best" -v bt="$best_t" -v p="$pb $pp" -v pk="$ppeak" -v pt="$pt" \
        'BEGIN {printf "| %.2f MiB | %d | %s | %.1f ms | %s | %.2f MiB | %.1f ms | %.3f |\n", c / 1048576, f, b, bt, p, pk / 1048576, pt, pt / bt}'
done
mixed_caps

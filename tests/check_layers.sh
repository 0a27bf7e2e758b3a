#!/usr/bin/env bash
# check_layers.sh — the layering rule of ARCHITECTURE.md, checked by grep:
# a module's sources include their own headers and the public headers
# (include/bigbatch/) of the modules below them, never another module's
# private headers (src/<module>/...), and no public header includes a
# module above its own. `make check` and `make test` run it.
set -euo pipefail
cd "$(dirname "$0")/.."
# The modules, lowest first, and each public header's module.
order=(core queue data backend world model optim plan trace train report cli)
declare -A level header_module=(
    [core.h]=core [json.h]=core [queue.h]=queue [shard.h]=data [loader.h]=data [pack.h]=data [tokenizer.h]=data [remote.h]=data
    [backend.h]=backend [ops.def]=backend [world.h]=world [model.h]=model [optim.h]=optim [plan.h]=plan
    [calibrate.h]=plan [roofline.h]=plan [trace.h]=trace [train.h]=train [report.h]=report)
for i in "${!order[@]}"; do level[${order[$i]}]=$i; done
bad=0
check() { # file, its module
    local file=$1 mod=$2 inc
    while read -r inc; do
        case $inc in
        bigbatch/*)
            local m=${header_module[${inc#bigbatch/}]:-}
            if [ -z "$m" ]; then echo "$file: includes $inc, a header of no module"; bad=1
            elif [ "${level[$m]}" -gt "${level[$mod]}" ]; then
                echo "$file ($mod) includes $inc of $m, a module above it"; bad=1; fi ;;
        */*)
            local m=${inc%%/*}
            if [ "$m" != "$mod" ]; then echo "$file ($mod) includes $inc, a private header of $m"; bad=1; fi ;;
        esac
    done < <(grep -ho '^#include "[^"]*"' "$file" | sed 's/#include "//; s/"$//')
}
for mod in "${order[@]}"; do
    for f in $(find src/$mod -name '*.[ch]' -o -name '*.cu' 2>/dev/null); do check "$f" "$mod"; done
done
for f in include/bigbatch/*.h include/bigbatch/*.def; do check "$f" "${header_module[$(basename "$f")]}"; done
for f in kernels/*; do check "$f" backend; done
if [ $bad -ne 0 ]; then echo "check_layers: the layering rule is broken (ARCHITECTURE.md, Modules)"; exit 1; fi
echo "check_layers: every include goes down the module table"
